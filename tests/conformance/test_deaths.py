"""Deaths as a column of the specification: every operation form, towards a peer
killed earlier and towards a survivor, over every multi-process CPU path.

One job per path (``tables.PATHS``, their environments), three ranks: rank 2 (the
victim) SIGKILLs itself after set-up; rank 0 waits until it knows of the death, then
runs each row of ``ROWS`` twice -- towards the victim, where it must raise
``PeerDeadError`` within ``BOUND`` seconds (never hang, never another error, never
succeed), and towards rank 1, where it must move exact bytes.  Collective rows run on
both survivors: over the whole team (a dead member: ``PeerDeadError``) and over the
survivors' own team (completes).  Rank 1 checks what rank 0's puts, atomics and
signals left in its segment; both survivors then finalize.

This is what the fuzz (random plans with kills) cannot promise: every form is tried.
A row that hangs ends the job; each cell then reports the row that was under way.
"""
import json
import os
import signal
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import mp_util  # noqa: E402
import runner  # noqa: E402
import tables as T  # noqa: E402

#: seconds within which an operation towards a known-dead peer must raise
BOUND = 5.0
#: the multi-process paths ("self" has no victim; ofi-hmem, where the provider does
#: not offer it, would be ofi-shm again).  On GPU paths every segment is device memory.
PATHS = [p for p in T.PATHS if p.ranks > 1 and not p.skip_unless]

#: rows a path refuses towards a live peer, by design (UnsupportedError naming the
#: missing piece, as in the matrix): process_vm has no atomics
REFUSED = {"pvm": {"amo_fadd", "amo_add_nb", "amo_add_nbi", "signal_op"}}

#: (row, collective): the forms rank 0 runs towards each target (worker ROWS)
ROWS = [
    ("put", False), ("get", False), ("put_nb", False), ("get_nb", False),
    ("put_nbi", False), ("get_nbi", False), ("put_val", False), ("put_nb_val", False),
    ("put_nbi_val", False), ("get_val", False), ("put_big", False), ("get_big", False),
    ("put_lc_group", False), ("access_region", False), ("pair_put", False),
    ("amo_fadd", False), ("amo_add_nb", False), ("amo_add_nbi", False),
    ("put_signal", False), ("put_signal_nb", False), ("put_signal_nbi", False),
    ("signal_op", False),
    ("put_vector", False), ("get_vector", False), ("put_indexed", False),
    ("get_indexed", False), ("put_strided", False), ("get_strided", False),
    ("put_vector_nb", False), ("get_strided_nbi", False), ("put_column", False),
    ("barrier", True), ("barrier_nb", True), ("allreduce", True), ("bcast", True),
    ("allgather", True), ("split", True), ("dup", True), ("create", True),
    ("ad_create", True), ("publish", True),
]

WORKER = r'''
import json
V, S = 2, 1
ROWS = json.loads(os.environ["DEATH_ROWS"])
REFUSED = {os.environ["DEATH_PATH"]: set(json.loads(os.environ["DEATH_REFUSED"]))}
PATH = os.environ["DEATH_PATH"]
BOUND = float(os.environ["DEATH_BOUND"])
KILL_AFTER = 0.5
c = gexmk.init()
tm = c.tm
me = tm.rank
DEV = os.environ.get("DEATH_DEVICE") == "1"
if DEV:
    # GPU paths: every rank's segment (ep 0's) is device memory of its GPU
    import cupy
    cupy.cuda.Device(me % cupy.cuda.runtime.getDeviceCount()).use()
    mk = c.mk_create(gexmk.CUDA_UVA, device=me % cupy.cuda.runtime.getDeviceCount())
    seg = c.segment_create(1 << 20, kind=mk)
    c.ep(0).bind_segment(seg)
    tm.publish_bound_segment([c.ep(0)])
    dmem = cupy.asarray(seg).view(cupy.uint8)
else:
    seg = c.segment_attach(1 << 20)
    mem = np.asarray(seg).view(np.uint8)


def fill(lo, data):
    if DEV:
        dmem[lo:lo + len(data)] = cupy.asarray(data)
        cupy.cuda.runtime.deviceSynchronize()
    else:
        mem[lo:lo + len(data)] = data


def segment_bytes():
    if DEV:
        cupy.cuda.runtime.deviceSynchronize()
        return cupy.asnumpy(dmem)
    return np.array(mem)


ad = tm.ad_create(gexmk.DT_I64, gexmk.OP_FADD | gexmk.OP_ADD)
alive = tm.split(None if me == V else 0, key=me)
pair = c.ep(0).pair(0)
# row k uses bytes [SLOT * (k + 1), SLOT * (k + 2)) of the target's segment; rank 1
# fills its slots with what gets must read; word 0 is rank 0's wait word
SLOT = 8192
KEY = {name: k for k, (name, coll) in enumerate(ROWS)}
if me != 0:
    for k in range(len(ROWS)):
        fill(SLOT * (k + 1), pattern(SLOT, me, k))
pids = np.zeros(3, np.int64)
tm.allgather(np.array([os.getpid()], np.int64), pids)
tm.barrier()
if me == V:
    # stopped, rank 0 issues to it (operations under way), then kills it
    os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(60)


def src_of(name, n):
    return pattern(n, 0, KEY[name])


def off(r, name):
    return tm.addr(r, SLOT * (KEY[name] + 1))


def run(name, r):
    """Row `name` towards job rank r; returns the bytes read (gets), or None."""
    a = off(r, name)
    k = KEY[name]
    n = 64
    if name == "put":
        tm.put(r, a, src_of(name, n))
    elif name == "get":
        d = np.empty(n, np.uint8); tm.get(d, r, a); return d
    elif name == "put_nb":
        tm.put_nb(r, a, src_of(name, n)).wait()
    elif name == "get_nb":
        d = np.empty(n, np.uint8); tm.get_nb(d, r, a).wait(); return d
    elif name == "put_nbi":
        tm.put_nbi(r, a, src_of(name, n)); gexmk.nbi_wait(gexmk.EC_PUT)
    elif name == "get_nbi":
        d = np.empty(n, np.uint8); tm.get_nbi(d, r, a); gexmk.nbi_wait(gexmk.EC_GET); return d
    elif name == "put_val":
        tm.put_val(r, a, int.from_bytes(src_of(name, 8).tobytes(), "little"), 8)
    elif name == "put_nb_val":
        tm.put_nb_val(r, a, int.from_bytes(src_of(name, 8).tobytes(), "little"), 8).wait()
    elif name == "put_nbi_val":
        tm.put_nbi_val(r, a, int.from_bytes(src_of(name, 8).tobytes(), "little"), 8)
        gexmk.nbi_wait(gexmk.EC_PUT)
    elif name == "get_val":
        v = tm.get_val(r, a, 8); return np.frombuffer(int(v).to_bytes(8, "little"), np.uint8)
    elif name == "put_big":
        tm.put(r, a, src_of(name, SLOT))
    elif name == "get_big":
        d = np.empty(SLOT, np.uint8); tm.get(d, r, a); return d
    elif name == "put_lc_group":
        tm.put_nbi(r, a, src_of(name, n), lc=gexmk.LC_GROUP); gexmk.nbi_wait(gexmk.EC_ALL)
    elif name == "access_region":
        with gexmk.nbi_access_region() as ev:
            tm.put_nbi(r, a, src_of(name, n))
        ev.wait()
    elif name == "pair_put":
        pair.put(r, pair.addr(r, SLOT * (k + 1)), src_of(name, n))
    elif name == "amo_fadd":
        ad.op(r, a, gexmk.OP_FADD, 5)
    elif name == "amo_add_nb":
        ad.op_nb(r, a, gexmk.OP_ADD, 5).wait()
    elif name == "amo_add_nbi":
        ad.op_nbi(r, a, gexmk.OP_ADD, 5); gexmk.nbi_wait(gexmk.EC_RMW)
    elif name == "put_signal":
        tm.put_signal(r, a + 8, src_of(name, n), a, 7, gexmk.SIGNAL_SET)
    elif name == "put_signal_nb":
        tm.put_signal_nb(r, a + 8, src_of(name, n), a, 7, gexmk.SIGNAL_SET).wait()
    elif name == "put_signal_nbi":
        tm.put_signal_nbi(r, a + 8, src_of(name, n), a, 7, gexmk.SIGNAL_SET); tm.quiet()
    elif name == "signal_op":
        tm.signal_op(r, a, 7, gexmk.SIGNAL_ADD); tm.quiet()
    elif name in ("put_vector", "put_vector_nb"):
        s = src_of(name, 128)
        dst = [(a + 1024, 32), (a, 96)]
        if name == "put_vector":
            tm.put_vector(r, dst, [s[:50], s[50:]])
        else:
            tm.put_vector_nb(r, dst, [s[:50], s[50:]]).wait()
    elif name == "get_vector":
        d = np.empty(128, np.uint8)
        tm.get_vector([d[:40], d[40:]], r, [(a + 1024, 32), (a, 96)]); return d
    elif name == "put_indexed":
        s = src_of(name, 64)
        tm.put_indexed(r, [a + 512, a + 128, a], 16, [s[i:].ctypes.data for i in (0, 16, 32)], 16)
    elif name == "get_indexed":
        d = np.empty(48, np.uint8)
        tm.get_indexed([d[i:].ctypes.data for i in (0, 16, 32)], 16, r, [a + 512, a + 128, a], 16)
        return d
    elif name in ("put_strided", "get_strided", "get_strided_nbi"):
        # 4 rows of 24 bytes, 256 bytes apart at the target, packed here
        if name == "put_strided":
            tm.put_strided(r, a, [256], src_of(name, 96), [24], 24, [4])
        else:
            d = np.empty(96, np.uint8)
            if name == "get_strided":
                tm.get_strided(d, [24], r, a, [256], 24, [4])
            else:
                tm.get_strided_nbi(d, [24], r, a, [256], 24, [4])
                gexmk.nbi_wait(gexmk.EC_GET)
            return d
    elif name == "put_column":
        m = src_of(name, 64).reshape(8, 8)
        tm.put(r, a, m[:, 3])
    else:
        raise AssertionError(f"no row {name}")
    return None


def expected_get(name):
    """What a get row reads from rank 1 (its slot's pattern, in the row's shape)."""
    p = pattern(SLOT, S, KEY[name])
    if name in ("get", "get_nb", "get_nbi"):
        return p[:64]
    if name == "get_val":
        return p[:8]
    if name == "get_big":
        return p
    if name == "get_vector":
        return np.concatenate([p[1024:1056], p[:96]])
    if name == "get_indexed":
        return np.concatenate([p[512:528], p[128:144], p[:16]])
    return np.concatenate([p[256 * i:256 * i + 24] for i in range(4)])   # strided


def record(out, name, who, t0, outcome):
    out[f"{name}/{who}"] = {"outcome": outcome, "seconds": round(time.monotonic() - t0, 3)}
    with open(f"rows.{me}.json", "w") as f:
        json.dump(out, f)


def outcome_of(fn):
    """(outcome, fn's result): "ok", "PeerDeadError", or the other error, named."""
    try:
        return "ok", fn()
    except E.PeerDeadError:
        return "PeerDeadError", None
    except Exception as e:              # noqa: BLE001 - the cell says which
        return f"{type(e).__name__}: {e}", None


def attempt(out, name, who, fn):
    with open(f"running.{me}", "w") as f:
        f.write(f"{name}/{who}")
    t0 = time.monotonic()
    outcome, got = outcome_of(fn)
    record(out, name, who, t0, outcome)
    return got


def inflight(out):
    """Operations under way when the victim dies.  It stopped itself (it serves
    nothing over the network, its lander answers no ring request); rank 0 issues
    to it while a thread SIGKILLs it KILL_AFTER s later, so an issue may be blocked
    (a first ring request, LC_NOW's wait for the source) or its op in flight at the
    death.  Each must then end -- done before the death, or PeerDeadError at issue
    or at its wait -- within BOUND s of the kill.  One NB put is never waited for:
    finalize must not wait for it."""
    import threading
    state, deadline = "", time.monotonic() + 20
    while state != "T":
        with open(f"/proc/{int(pids[V])}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        assert time.monotonic() < deadline, f"the victim did not stop (state {state})"
        time.sleep(0.01)
    killed = []

    def killer():
        time.sleep(KILL_AFTER)
        killed.append(time.monotonic())
        os.kill(int(pids[V]), signal.SIGKILL)

    th = threading.Thread(target=killer, daemon=True)
    th.start()
    keep, evs = [], {}

    def since_kill():
        return round(max(0.0, time.monotonic() - killed[0]) if killed else 0.0, 3)

    def issue(name, fn):
        outcome, ev = outcome_of(fn)
        if outcome == "ok":
            evs[name] = ev
        else:
            out["inflight_" + name] = {"seconds": since_kill(), "outcome": outcome
                                       if outcome == "PeerDeadError" else "at issue: " + outcome}

    # those that return at once first (LC_DEFER: no wait for the source), so that
    # they are in flight at the death; a first ring request (staged paths) or
    # LC_NOW's wait (the last one) may block until it
    a = tm.addr(V, SLOT)
    d = np.empty(64, np.uint8); keep.append(d)
    issue("get_nb", lambda: tm.get_nb(d, V, a))
    dv = np.empty(96, np.uint8); keep.append(dv)
    issue("get_vector_nb", lambda: tm.get_vector_nb([dv[:50], dv[50:]], V,
                                                    [(a + 1024, 32), (a + 2048, 64)]))
    issue("amo_nb", lambda: ad.op_nb(V, a + 256, gexmk.OP_FADD, 1))
    src = pattern(64, 0, 1); keep.append(src)
    issue("put_nb", lambda: tm.put_nb(V, a + 128, src, lc=gexmk.LC_DEFER))
    big = pattern(SLOT, 0, 2); keep.append(big)
    issue("put_nb_big", lambda: tm.put_nb(V, a + SLOT, big, lc=gexmk.LC_DEFER))
    src2 = pattern(64, 0, 4); keep.append(src2)
    issue("put_nbi", lambda: tm.put_nbi(V, a + 4096, src2, lc=gexmk.LC_GROUP))
    issue("put_signal_nb", lambda: tm.put_signal_nb(V, a + 512, pattern(64, 0, 3), a + 264, 1,
                                                    gexmk.SIGNAL_SET))
    issue("abandoned", lambda: tm.put_nb(V, a + 4200, pattern(64, 0, 5)))
    keep.append(evs.pop("abandoned", None))
    th.join()
    for name, ev in evs.items():
        outcome, _ = outcome_of(lambda: gexmk.nbi_wait(gexmk.EC_ALL) if name == "put_nbi"
                                else ev.wait())
        out["inflight_" + name] = {"outcome": outcome, "seconds": since_kill()}
    with open(f"rows.{me}.json", "w") as f:
        json.dump(out, f)
    return keep


out = {}
if me == 0:
    keep = inflight(out)
    # know of the death first (what comes before its notice is the fuzz's)
    deadline = time.monotonic() + 20
    while True:
        try:
            tm.put_val(V, tm.addr(V, 0), 1)
        except E.PeerDeadError:
            break
        assert time.monotonic() < deadline, "no death notice within 20 s"
        time.sleep(0.05)
    for name, coll in ROWS:
        if coll:
            continue
        attempt(out, name, "dead", lambda: run(name, V))
        got = attempt(out, name, "live", lambda: run(name, S))
        if got is not None and name.startswith("get"):
            want = expected_get(name)
            if not np.array_equal(got, want):
                bad = int(np.flatnonzero(got != want)[0])
                record(out, name, "live", time.monotonic(), f"wrong bytes from byte {bad}")
alive.barrier()
# collective rows: both survivors, the whole team (a dead member) and their own
for name, coll in ROWS:
    if not coll:
        continue
    for who, team in (("dead", tm), ("live", alive)):
        if name == "barrier":
            attempt(out, name, who, team.barrier)
        elif name == "barrier_nb":
            attempt(out, name, who, lambda: team.barrier_nb().wait())
        elif name == "allreduce":
            def f():
                got = np.zeros(4, np.int64)
                team.allreduce(np.full(4, me + 1, np.int64), got, "sum")
                assert (got == 3).all(), got            # ranks 0 and 1 (dead: never here)
            attempt(out, name, who, f)
        elif name == "bcast":
            def f():
                b = np.full(16, me, np.uint8)
                team.bcast(b, 0)
                assert (b == 0).all(), b
            attempt(out, name, who, f)
        elif name == "allgather":
            def f():
                got = np.zeros(team.size, np.int64)
                team.allgather(np.array([me], np.int64), got)
                assert list(got) == [0, 1], got
            attempt(out, name, who, f)
        elif name in ("split", "dup", "create"):
            # the new team must work: a barrier and a put between the survivors
            def f():
                if name == "split":
                    t = team.split(0, key=-me)              # reversed order
                elif name == "dup":
                    t = team.dup()
                else:
                    t = team.create([1, 0])
                t.barrier()
                peer = 1 - t.rank
                t.put_val(peer, t.addr(peer, 8 * KEY[name]), me + 10)
                t.barrier()
                assert int(np.frombuffer(segment_bytes()[8 * KEY[name]:8 * KEY[name] + 8],
                                         np.uint64)[0]) == (1 - me) + 10
            attempt(out, name, who, f)
        elif name == "ad_create":
            def f():
                d = team.ad_create(gexmk.DT_U64, gexmk.OP_FADD)
                a = team.addr(team.rank, 8 * KEY[name])     # its own word (pvm: no atomics)
                assert d.op(team.rank, a, gexmk.OP_FADD, 1) == 0
                team.barrier()
            attempt(out, name, who, f)
        elif name == "publish":
            # a second endpoint with a segment of its own, published to the team
            def f():
                e = c.ep_create()
                s2 = c.segment_create(4096)
                e.bind_segment(s2)
                team.publish_bound_segment([e])
                bs = team.query_bound_segment_nb(1 - me).wait()
                assert bs.size >= 4096, bs
            attempt(out, name, who, f)
alive.barrier()
if me == S:
    # what rank 0's puts, atomics and signals to this rank left here
    mem = segment_bytes()

    def slot(name):
        return mem[SLOT * (KEY[name] + 1):SLOT * (KEY[name] + 2)]
    for name, coll in ROWS:
        if coll or name.startswith("get") or name in REFUSED.get(PATH, ()):
            continue
        s = slot(name)
        p = pattern(SLOT, S, KEY[name])
        src = pattern(SLOT, 0, KEY[name])
        want = p.copy()
        if name in ("put", "put_nb", "put_nbi", "pair_put", "put_lc_group", "access_region"):
            want[:64] = src[:64]
        elif name in ("put_val", "put_nb_val", "put_nbi_val"):
            want[:8] = src[:8]
        elif name == "put_big":
            want = src
        elif name.startswith("amo"):
            v = int(p[:8].view(np.int64)[0]) + 5
            want[:8] = np.array([v], np.int64).view(np.uint8)
        elif name.startswith("put_signal"):
            want[:8] = np.array([7], np.uint64).view(np.uint8)
            want[8:72] = src[:64]
        elif name == "signal_op":
            v = (int(p[:8].view(np.uint64)[0]) + 7) & (2**64 - 1)
            want[:8] = np.array([v], np.uint64).view(np.uint8)
        elif name.startswith("put_vector"):
            s128 = src[:128]
            want[1024:1056] = s128[:32]
            want[:96] = s128[32:128]
        elif name == "put_indexed":
            want[512:528] = src[:16]
            want[128:144] = src[16:32]
            want[:16] = src[32:48]
        elif name == "put_strided":
            for i in range(4):
                want[256 * i:256 * i + 24] = src[24 * i:24 * i + 24]
        elif name == "put_column":
            want[:8] = src[:64].reshape(8, 8)[:, 3]
        if not np.array_equal(s, want):
            bad = int(np.flatnonzero(s != want)[0])
            out[f"{name}/landed"] = {"outcome": f"wrong bytes at the survivor from byte {bad}",
                                     "seconds": 0}
        else:
            out[f"{name}/landed"] = {"outcome": "ok", "seconds": 0}
    with open(f"rows.{me}.json", "w") as f:
        json.dump(out, f)
c.finalize()
with open(f"finalized.{me}", "w") as f:
    f.write("ok")
'''


class _Jobs:
    def __init__(self, tmp_factory):
        self.tmp_factory = tmp_factory
        self.done = {}
        self.gpu = runner.have_gpu()

    def job(self, path):
        if path.gpu and not self.gpu:
            pytest.skip("GPU path: no NVIDIA driver, GPU or CuPy on this machine")
        if path.name not in self.done:
            tmp = self.tmp_factory.mktemp(f"deaths-{path.name}")
            env = dict(path.env, GEXMK_TIMEOUT="20", DEATH_ROWS=json.dumps(ROWS),
                       DEATH_BOUND=str(BOUND), DEATH_PATH=path.name,
                       DEATH_DEVICE="1" if path.gpu else "0",
                       DEATH_REFUSED=json.dumps(sorted(REFUSED.get(path.name, ()))))
            res = mp_util.run_job(tmp, WORKER, 3, keep_going=True, launcher_timeout=150,
                                  env=env)
            rows = {}
            for r in (0, 1):
                f = tmp / f"rows.{r}.json"
                rows[r] = json.loads(f.read_text()) if f.exists() else {}
            running = {r: (tmp / f"running.{r}").read_text() if (tmp / f"running.{r}").exists()
                       else None for r in (0, 1)}
            finalized = [r for r in (0, 1) if (tmp / f"finalized.{r}").exists()]
            self.done[path.name] = (res, rows, running, finalized)
        return self.done[path.name]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    return _Jobs(tmp_path_factory)


def _cells():
    for p in PATHS:
        for name, coll in ROWS:
            whos = ["dead", "live"] + ([] if coll or name.startswith("get")
                                       or name in REFUSED.get(p.name, ()) else ["landed"])
            for who in whos:
                yield pytest.param(p, name, coll, who, id=f"{p.name}-{name}-{who}",
                                   marks=[pytest.mark.gpu] if p.gpu else [])


@pytest.mark.timeout(200)
@pytest.mark.parametrize("path, name, coll, who", list(_cells()))
def test_death_cell(jobs, path, name, coll, who):
    res, rows, running, finalized = jobs.job(path)
    ranks = (0, 1) if coll else ((1,) if who == "landed" else (0,))
    for r in ranks:
        row = rows[r].get(f"{name}/{who}")
        assert row is not None, (
            f"rank {r} has no result for {name} towards the {who} peer; it was running "
            f"{running[r]} when the job ended\n{res.report()}")
        if who == "dead":
            assert row["outcome"] == "PeerDeadError", (r, row)
            assert row["seconds"] < BOUND, (r, row)
        elif name in REFUSED.get(path.name, ()):
            assert row["outcome"].startswith("UnsupportedError: "), (r, row)
        else:
            assert row["outcome"] == "ok", (r, row)


#: operations under way when the victim dies (worker ``inflight``)
INFLIGHT = ["get_nb", "put_nb", "put_nb_big", "amo_nb", "put_signal_nb", "get_vector_nb",
            "put_nbi"]


@pytest.mark.timeout(200)
@pytest.mark.parametrize("path, name", [
    pytest.param(p, n, id=f"{p.name}-{n}", marks=[pytest.mark.gpu] if p.gpu else [])
    for p in PATHS for n in INFLIGHT])
def test_under_way_at_the_death(jobs, path, name):
    """Done, or PeerDeadError (at issue or at its wait), within BOUND s of the
    kill (worker ``inflight``); pvm refuses atomics at issue, before the kill."""
    res, rows, running, finalized = jobs.job(path)
    row = rows[0].get(f"inflight_{name}")
    assert row is not None, (f"rank 0 has no result for {name} under way at the death; it "
                             f"was running {running[0]} when the job ended\n{res.report()}")
    if path.name == "pvm" and name == "amo_nb":
        assert row["outcome"].startswith("at issue: UnsupportedError: "), row
        assert row["seconds"] == 0, row
        return
    assert row["outcome"] in ("ok", "PeerDeadError"), row
    assert row["seconds"] < BOUND, row


@pytest.mark.timeout(200)
@pytest.mark.parametrize("path", [pytest.param(p, id=p.name,
                                               marks=[pytest.mark.gpu] if p.gpu else [])
                                  for p in PATHS])
def test_death_job_ends(jobs, path):
    """Both survivors finalized, the job's code is the victim's SIGKILL, and
    nothing of the job is left running."""
    res, rows, running, finalized = jobs.job(path)
    assert finalized == [0, 1], res.report()
    assert not res.timed_out, res.report()
    res.check(rc=128 + signal.SIGKILL)
    assert not mp_util.processes_running(str(res.script)), res.report()
