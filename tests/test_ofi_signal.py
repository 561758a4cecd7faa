"""put_signal over the network (ofi): the signal never overtakes its data.

The ofi transport issues a put_signal one of three ways (``Domain.put_signal_mode``,
gexmk/transports/ofi.src/signal.pxi): ``ordered`` -- the data write and the
signal atomic back to back on one endpoint, where the provider orders an RMA
write before a later atomic (FI_ORDER_WAW: shm); ``message`` -- split endpoints
(tcp;ofi_rxm): the data write, then the signal as a message on the same
endpoint (FI_ORDER_SAW), applied by the target, or, where the signal fits,
the signal as the data write's own remote CQ data (GEXMK_OFI_SIGNAL_DATA,
on by default; ``put_signal_stats()["cq_data"]``); ``delivery`` -- the data's
delivery waited for before the signal atomic is issued (GEXMK_OFI_ORDERED_SIGNAL=0).  A blocking put_signal waits only for
local completion in every mode.

The job: every rank but 0 streams put_signals into its own slots at rank 0,
without waiting for the signals (rank 0 acks slots for reuse); payloads
alternate between large ones (written in many pieces; past the inject size,
so the write-then-wait branch) and small ones (injected), and calls between
blocking, NB and NBI.  Rank 0 checks, whenever it sees a signal
value, that every payload that value vouches for is complete:

- ``SET``: each sender sets its own word to the iteration number: iterations
  up to that number must have landed in full;
- ``ADD``: each sender adds 1 to its own word (a count of its arrivals) and,
  in every other iteration, 1 to a word shared by all senders: the shared
  count must never exceed the payloads rank 0 finds complete in memory, and
  ends at the exact total (ADDs from several ranks stay atomic).

A signal that overtook its data shows as a payload still holding an older
iteration's bytes (or torn between two) when checked.
"""
import pytest

try:
    from . import mp_util
except ImportError:
    import mp_util

ORDER = r'''
if os.environ.get("SIG_RANK0_OFF") == "1" and os.environ.get("GEXMK_RANK") == "0":
    os.environ["GEXMK_OFI_ORDERED_SIGNAL"] = "0"    # rank 0 alone takes no signal messages
c = gexmk.init()
tm = c.tm
me, n = tm.rank, tm.size
OP = os.environ["SIG_OP"]                       # "SET" or "ADD"
WANT_MODE = os.environ["SIG_WANT_MODE"]         # the senders' Domain.put_signal_mode
USED = os.environ.get("SIG_USED", WANT_MODE)    # ... and the way their put_signals go
K = int(os.environ.get("SIG_ITERS", 120))       # put_signals per sender
S = 4                                           # payload slots per sender at rank 0
BIG = int(os.environ.get("SIG_BIG", 1 << 18))   # large payload, bytes (multiple of 8)
SMALL = 48                                      # small payload: injected on both providers
SIGW, CNT, ACK = 0, 8 * 64, 8 * 65              # words: per-sender signals, shared count, ack
DATA = 4096
REGION = S * BIG                                # one sender's slots
seg = c.segment_attach(DATA + (n - 1) * REGION)
mine = np.asarray(seg)
ofi = c.transports.get("ofi")
assert tm.transport(0 if me else 1) == "ofi", tm.paths(0 if me else 1)
assert me == 0 and USED != WANT_MODE or ofi.put_signal_mode == WANT_MODE, \
    (ofi.provider, ofi.put_signal_mode)
ofi.put_signal_stats(reset=True)
tm.barrier()

def size_of(j):
    return SMALL if j % 3 == 0 else BIG

def slot(s, j):
    """Offset at rank 0 of sender s's slot for iteration j."""
    return DATA + (s - 1) * REGION + (j % S) * BIG

if me != 0:
    src = np.empty(BIG // 8, np.uint64)
    sig_op = gexmk.SIGNAL_SET if OP == "SET" else gexmk.SIGNAL_ADD
    modes = ["blocking", "nbi", "blocking", "nb"]
    ev = []
    for j in range(1, K + 1):
        # rank 0 has checked iteration j - S: its slot may be overwritten
        tm.wait_until(tm.addr(me, ACK), gexmk.CMP_GE, max(0, j - S))
        nb = size_of(j) // 8
        src[:nb] = j
        shared = OP == "ADD" and j % 2 == 0
        word = tm.addr(0, CNT) if shared else tm.addr(0, SIGW + 8 * me)
        value = j if OP == "SET" else 1
        args = (0, tm.addr(0, slot(me, j)), src[:nb], word, value, sig_op)
        mode = modes[j % len(modes)]
        if mode == "blocking":
            tm.put_signal(*args)
        elif mode == "nbi":
            tm.put_signal_nbi(*args)
        else:
            ev.append(tm.put_signal_nb(*args))
        src[:nb] = 0                # the source is reusable on return, whatever the mode
    gexmk.quiet()
    for e in ev:
        e.wait()
    st = ofi.put_signal_stats()
    assert st[USED] == K, st
    assert sum(st[k] for k in ("ordered", "message", "delivery")) == K, st
    # every signal here fits in remote CQ data: all of them ride on their write, or none
    assert st["cq_data"] == (K if os.environ.get("SIG_DATA") == "1" else 0), st
    if USED != "delivery":
        assert st["ordered_max"] >= BIG, st
    log("sent", K, st)
else:
    senders = list(range(1, n))
    checked = {s: 0 for s in senders}          # iterations known complete, per sender

    def complete(s, j):
        got = mine[slot(s, j):slot(s, j) + size_of(j)].view(np.uint64)
        return bool((got == j).all())

    def landed(s):
        """Iterations of sender s complete in memory, in order, from checked[s] on."""
        j = checked[s]
        while j < K and complete(s, j + 1):
            j += 1
        return j

    words = [tm.addr(0, SIGW + 8 * s) for s in senders]
    checks = 0
    t_end = time.monotonic() + 120
    while True:
        assert time.monotonic() < t_end, f"no progress: checked {checked}"
        if OP == "SET":
            want = [checked[s] + 1 if checked[s] < K else 0 for s in senders]
            if not any(want):
                break
            # a word satisfied by 0 (finished senders) would always win: ask the others only
            live = [i for i, w in enumerate(want) if w]
            tm.wait_until_any([words[i] for i in live], gexmk.CMP_GE, [want[i] for i in live])
            for s in senders:
                v = tm.signal_fetch(tm.addr(0, SIGW + 8 * s))
                for j in range(checked[s] + 1, v + 1):
                    assert complete(s, j), (
                        f"sender {s}: signal says {v}, payload of iteration {j} incomplete: "
                        f"{np.unique(mine[slot(s, j):slot(s, j) + size_of(j)].view(np.uint64))[:6]}")
                    checks += 1
                checked[s] = max(checked[s], v)
        else:
            # own word: a count of s's put_signals that chose it (odd j); the shared word counts the rest
            total = tm.signal_fetch(tm.addr(0, CNT))
            counts = {s: tm.signal_fetch(tm.addr(0, SIGW + 8 * s)) for s in senders}
            have = {s: landed(s) for s in senders}
            for s in senders:
                odd = (have[s] + 1) // 2        # odd iterations among 1..have[s]
                assert counts[s] <= odd, (f"sender {s}: {counts[s]} own ADDs seen, only {odd} "
                                          f"of their payloads complete ({have[s]} in all)")
                checked[s] = have[s]
            even = sum(h // 2 for h in have.values())
            assert total <= even, f"shared count {total} > {even} complete even payloads {have}"
            checks += 1
            if all(h == K for h in have.values()) and total == (K // 2) * len(senders) and \
                    all(counts[s] == (K + 1) // 2 for s in senders):
                break
            # (acks first: a sender may be waiting for one)
            for s in senders:
                tm.signal_op(s, tm.addr(s, ACK), checked[s], gexmk.SIGNAL_SET)
            tm.wait_until_any([tm.addr(0, CNT)] + words, gexmk.CMP_GT,
                              [total] + [counts[s] for s in senders], timeout=60)
            continue
        for s in senders:
            tm.signal_op(s, tm.addr(s, ACK), checked[s], gexmk.SIGNAL_SET)
    assert all(checked[s] == K for s in senders), checked
    if OP == "ADD":
        assert tm.signal_fetch(tm.addr(0, CNT)) == (K // 2) * len(senders)
    log("checked", checks, "times")
gexmk.quiet()
tm.barrier()
print(f"ORDER-OK {me}", flush=True)
c.finalize()
'''


def _need_ofi(provider):
    ofi = pytest.importorskip("gexmk.fabric_probe", reason="gexmk was built without libfabric")
    pytest.importorskip("gexmk.transports.ofi", reason="no ofi transport in this build")
    try:
        found = ofi.providers(provider)
    except Exception as e:      # noqa: BLE001 - any probing failure means "not usable here"
        pytest.skip(f"libfabric provider {provider!r}: probing failed: {e}")
    if not found:
        pytest.skip(f"libfabric provider {provider!r} is not available here")


def _run_ok(tmp_path, src, n, env, tag, launcher_timeout):
    """Run the job on n ranks; every rank must have printed "<tag>-OK <rank>"."""
    r = mp_util.run_job(tmp_path, src, n, env=env, launcher_timeout=launcher_timeout)
    r.check()
    for rank in range(n):
        assert f"{tag}-OK {rank}" in r.stdout, r.report()


# (provider, GEXMK_OFI_ORDERED_SIGNAL, the mode the domain must report,
#  GEXMK_OFI_SIGNAL_DATA: whether signals ride on their writes as remote CQ data)
CASES = [("tcp;ofi_rxm", "1", "message", "1"), ("tcp;ofi_rxm", "1", "message", "0"),
         ("tcp;ofi_rxm", "0", "delivery", "1"), ("shm", "1", "ordered", "1"),
         ("shm", "0", "delivery", "1")]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("op", ["SET", "ADD"])
@pytest.mark.parametrize("provider,ordered,mode,data", CASES,
                         ids=["tcp_cq_data", "tcp_message", "tcp_delivery", "shm_ordered",
                              "shm_delivery"])
def test_signal_never_overtakes_data(tmp_path, provider, ordered, mode, data, op, n):
    _need_ofi(provider)
    env = {"GEXMK_TRANSPORT": "ofi", "GEXMK_OFI_PROVIDER": provider, "FI_PROVIDER": None,
           "GEXMK_OFI_ORDERED_SIGNAL": ordered, "SIG_OP": op, "SIG_WANT_MODE": mode,
           "GEXMK_OFI_SIGNAL_DATA": data, "SIG_DATA": "1" if mode == "message" and data == "1" else "0",
           "SIG_ITERS": 90 if n == 4 else 120, "GEXMK_TIMEOUT": 90}
    _run_ok(tmp_path, ORDER, n, env, "ORDER", 220)


@pytest.mark.timeout(120)
def test_no_signal_messages_to_a_peer_that_takes_none(tmp_path):
    """A rank whose endpoint posts no receives for signal messages (here
    GEXMK_OFI_ORDERED_SIGNAL=0 on rank 0 alone) says so at publication; its
    peers then wait for the data's delivery instead of sending messages that
    nobody would apply."""
    _need_ofi("tcp;ofi_rxm")
    env = {"GEXMK_TRANSPORT": "ofi", "GEXMK_OFI_PROVIDER": "tcp;ofi_rxm", "FI_PROVIDER": None,
           "SIG_RANK0_OFF": "1", "SIG_OP": "SET", "SIG_WANT_MODE": "message", "SIG_USED": "delivery",
           "SIG_ITERS": 40, "GEXMK_TIMEOUT": 60}
    _run_ok(tmp_path, ORDER, 2, env, "ORDER", 100)


# A wait whose words only the network writes sleeps in the transport (the
# CQs' wait fds, GX_WAIT_SLEEP), woken by the traffic that carries its signal.
# Every wait sleeps at once here and the sleep is bounded only by the longest
# nap (100 s, capped at ~33 ms in a transport): a wake-up the traffic did not
# deliver shows as >= 33 ms a lap.  Without wait fds (a spinning progress
# thread) the wait sleeps on its futex, which the progress thread's landing of
# the signal wakes.
NETSLEEP = r'''
c = gexmk.init()
tm = c.tm
me, peer = tm.rank, 1 - tm.rank
seg = c.segment_attach(4096)
mine = np.asarray(seg)
SIG, DATA = 0, 64
ITERS = 100
x = np.zeros(1, np.uint64)
tm.put_signal(peer, tm.addr(peer, DATA), x, tm.addr(peer, 8), 1)      # connect
tm.barrier()
gexmk.core._wait_tuning(spin_us=0, yield_us=0, nap_us=(100e6, 100e6), gil_spin=0)
gexmk.core._wait_stats(reset=True)
t0 = time.monotonic()
for i in range(1, ITERS + 1):
    if me == 1:
        tm.wait_until(tm.addr(me, SIG), gexmk.CMP_GE, i)
        assert int(mine[DATA:DATA + 8].view(np.uint64)[0]) == i * 10
    x[0] = i * 10 + me
    tm.put_signal(peer, tm.addr(peer, DATA), x, tm.addr(peer, SIG), i)
    if me == 0:
        tm.wait_until(tm.addr(me, SIG), gexmk.CMP_GE, i)
        assert int(mine[DATA:DATA + 8].view(np.uint64)[0]) == i * 10 + 1
took = (time.monotonic() - t0) / ITERS
st = gexmk.core._wait_stats()
gexmk.core._wait_tuning(defaults=True)
log(f"{ITERS} laps, every wait asleep: {took * 1e6:.0f} us a lap; {st}")
# Which sleep the waits took, counted over both ranks: one rank may never sleep
# at all (its blocking put_signal can still be waiting for its completion when
# the peer's answer lands, so its wait finds the signal there: seen 1 run in ~25)
both = np.zeros(4, np.uint64)
tm.allgather(np.array([st["net_sleeps"], st["sleeps"]], np.uint64), both)
if os.environ["SIG_EXPECT"] == "transport":
    assert st["sleeps"] == 0 and both[0] + both[2] > 0, (st, both)
else:
    assert st["net_sleeps"] == 0 and both[1] + both[3] > 0, (st, both)
assert took < 0.016, f"{took * 1e3:.1f} ms a lap: wake-ups were lost ({st})"
tm.barrier()
print(f"NETSLEEP-OK {me}", flush=True)
c.finalize()
'''


@pytest.mark.timeout(120)
@pytest.mark.parametrize("thread,expect,wobj", [
    ("auto", "transport", None), ("spin", "futex", None),
    # a user's FI_OFI_RXM_DEF_WAIT_OBJ=pollfd: rxm then never woke the CQs' wait fds
    # for incoming traffic, and every wait slept out its nap (gexmk now asks for fd)
    ("auto", "transport", "pollfd")], ids=["auto-transport", "spin-futex", "auto-rxm-pollfd"])
def test_sleeping_waiter_is_woken_by_network_traffic(tmp_path, thread, expect, wobj):
    _need_ofi("tcp;ofi_rxm")
    env = {"GEXMK_TRANSPORT": "ofi", "GEXMK_OFI_PROVIDER": "tcp;ofi_rxm", "FI_PROVIDER": None,
           "GEXMK_PROGRESS_THREAD": thread, "SIG_EXPECT": expect, "GEXMK_TIMEOUT": 60,
           "FI_OFI_RXM_DEF_WAIT_OBJ": wobj}
    _run_ok(tmp_path, NETSLEEP, 2, env, "NETSLEEP", 100)


# finalize after a burst of injected put_signals: rank 0 issues put_signal_nbi
# back to back (each an injected write and signal, no completion) for a second,
# then both leave.  Without finalize's quiet, rank 0 was killed by SIGSEGV in
# libfabric's fi_close (rxm, 1.17) in 4 of 4 runs: rank 1 closed its endpoint
# under rank 0's backlog.
BURST = r'''
c = gexmk.init()
tm = c.tm
me, peer = tm.rank, 1 - tm.rank
seg = c.segment_attach(1 << 16)
x = np.ones(1, np.uint64)
tm.barrier()
if me == 0:
    n, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < 1.0:
        for _ in range(100):
            tm.put_signal_nbi(peer, tm.addr(peer, 4096), x, tm.addr(peer, 128), 1)
        n += 100
    log(f"{n} put_signals")
    tm.signal_op(peer, tm.addr(peer, 0), 1)
else:
    tm.wait_until(tm.addr(me, 0), gexmk.CMP_GE, 1)
tm.barrier()
c.finalize()
print(f"BURST-OK {me}", flush=True)
'''


@pytest.mark.timeout(120)
def test_finalize_after_a_burst_of_put_signals(tmp_path):
    _need_ofi("tcp;ofi_rxm")
    env = {"GEXMK_TRANSPORT": "ofi", "GEXMK_OFI_PROVIDER": "tcp;ofi_rxm", "FI_PROVIDER": None}
    _run_ok(tmp_path, BURST, 2, env, "BURST", 100)


# Signals that do not fit in remote CQ data (a value from 2**36 on, a word past
# the segment's first 512 MiB) go as messages, on the same endpoint as those
# that ride on their writes: the two kinds must still apply in issue order, and
# large values land exactly.  Each round, rank 1 issues six put_signals mixing
# the two; rank 0 waits for the round's last one (it fits) and then checks the
# state the earlier ones left.  With FIT_RANK0_NODATA rank 0's CQ takes no
# remote CQ data, which its peer learns at publication: messages only.
FIT = r'''
if os.environ.get("FIT_RANK0_NODATA") == "1" and os.environ.get("GEXMK_RANK") == "0":
    os.environ["GEXMK_OFI_SIGNAL_DATA"] = "0"
c = gexmk.init()
tm = c.tm
me = tm.rank
NEAR, ADDW, ACK, DATA = 0, 8, 16, 64
FAR = 520 << 20
BIG = 1 << 36
ROUNDS = 40
seg = c.segment_attach(FAR + 4096)
mine = np.asarray(seg)
ofi = c.transports.get("ofi")
assert ofi.put_signal_mode == "message", ofi.put_signal_mode
ofi.put_signal_stats(reset=True)
tm.barrier()
S, A = gexmk.SIGNAL_SET, gexmk.SIGNAL_ADD
if me == 1:
    x = np.zeros(1, np.uint64)
    for r in range(1, ROUNDS + 1):
        tm.wait_until(tm.addr(1, ACK), gexmk.CMP_GE, r - 1, timeout=30)
        for k, (word, value, op) in enumerate([(NEAR, BIG + r * 10 + 1, S), (FAR, r * 10 + 2, S),
                                               (ADDW, 1, A), (ADDW, BIG, A),
                                               (FAR, BIG + r * 10 + 3, S), (NEAR, r * 10 + 4, S)]):
            x[0] = r * 10 + k
            tm.put_signal(0, tm.addr(0, DATA), x, tm.addr(0, word), value, op)
    gexmk.quiet()
    st = ofi.put_signal_stats()
    fits = 0 if os.environ.get("FIT_RANK0_NODATA") == "1" else 2 * ROUNDS
    assert st["message"] == 6 * ROUNDS and st["cq_data"] == fits, st
    log("sent", st)
else:
    w = mine.view(np.uint64)
    for r in range(1, ROUNDS + 1):
        tm.wait_until(tm.addr(0, NEAR), gexmk.CMP_EQ, r * 10 + 4, timeout=30)
        got = (int(w[FAR // 8]), int(w[ADDW // 8]), int(w[DATA // 8]))
        assert got == (BIG + r * 10 + 3, r * (BIG + 1), r * 10 + 5), (r, got)
        tm.signal_op(1, tm.addr(1, ACK), r, S)
    assert ofi.put_signal_stats()["bad_messages"] == 0
gexmk.quiet()
tm.barrier()
print(f"FIT-OK {me}", flush=True)
c.finalize()
'''


@pytest.mark.timeout(120)
@pytest.mark.parametrize("rank0_nodata", ["0", "1"], ids=["cq_data", "rank0_takes_none"])
def test_signals_that_do_not_fit_in_cq_data_keep_their_order(tmp_path, rank0_nodata):
    _need_ofi("tcp;ofi_rxm")
    env = {"GEXMK_TRANSPORT": "ofi", "GEXMK_OFI_PROVIDER": "tcp;ofi_rxm", "FI_PROVIDER": None,
           "FIT_RANK0_NODATA": rank0_nodata, "GEXMK_TIMEOUT": 60}
    _run_ok(tmp_path, FIT, 2, env, "FIT", 100)


# RMA to a target that waits (issue 21): rank 0 puts and gets back distinct
# values, 8 B and 64 KiB, while rank 1 is inside tm.barrier(), then inside
# wait_until.  A waiting target polls for a while after traffic (an adaptive
# window, ofi.src/progress.pxi) and sleeps in its CQ fds otherwise; every
# hand-off between the two must lose nothing: each get returns the value just
# put, and each wait ends.  With GEXMK_OFI_TRACE the target's log must show
# polling windows opened (default) or none (GEXMK_OFI_WAIT_TUNE=0: window off).
# Then (state 3) the target computes in numpy, the GIL released, and its
# progress thread serves it: woken by the traffic, it polls in a window of
# bursts that adapts (unless pt_adapt is 0: the fixed 1 ms window of before).
HOTWIN = r'''
from gexmk.transports import ofi
c = gexmk.init()
tm = c.tm
me, peer = tm.rank, 1 - tm.rank
seg = c.segment_attach(1 << 20)
mine = np.asarray(seg)
small, back = np.zeros(1, np.uint64), np.zeros(1, np.uint64)
big, bigback = np.zeros(8192, np.uint64), np.zeros(8192, np.uint64)
tm.put(peer, tm.addr(peer, 4096), small)       # connected
tm.barrier()
ofi._trace_dump()
flag = mine.view(np.uint64)
mat = np.ones((200, 200))
for state in (1, 2, 3):
    if me == 1:
        if state == 1:
            tm.barrier()
        elif state == 2:
            tm.wait_until(tm.addr(me, 0), gexmk.CMP_GE, 2)
        else:
            while flag[0] < 3:
                np.dot(mat, mat)        # releases the GIL
    else:
        time.sleep(0.05)        # the target is asleep by now
        for i in range(300):
            small[0] = state * 100000 + i
            tm.put(1, tm.addr(1, 64), small)
            tm.get(back, 1, tm.addr(1, 64))
            assert back[0] == small[0], (state, i, back[0])
            if i % 50 == 0:
                big[:] = i + state
                tm.put(1, tm.addr(1, 65536), big)
                tm.get(bigback, 1, tm.addr(1, 65536))
                assert (bigback == big).all(), (state, i)
            if i % 100 == 99:
                time.sleep(0.01)     # a quiet spell: the target's window closes, it sleeps
        if state == 1:
            tm.barrier()
        else:
            small[0] = state
            tm.put_signal(1, tm.addr(1, 4096), small, tm.addr(1, 0), state)
            tm.quiet()
tm.barrier()
if me == 1:
    ev = [e & 0xffffff for t, e in ofi._trace_dump()]
    opened, pt_opened = ev.count(14), ev.count(25)
    log(f"windows opened {opened}, sleeps {ev.count(10)}, wakes {ev.count(11)}, "
        f"progress thread woken {ev.count(21)}, its windows {pt_opened}")
    tune = os.environ.get("GEXMK_OFI_WAIT_TUNE")
    assert (opened > 0) == (tune != "0"), opened
    assert ev.count(11) > 0         # it slept and traffic woke it
    assert ev.count(21) > 0         # the progress thread slept and traffic woke it
    pt_adapt = tune is None or len(tune.split(",")) < 5 or tune.split(",")[4] != "0"
    assert (pt_opened > 0) == pt_adapt, pt_opened
print(f"HOTWIN-OK {me}", flush=True)
c.finalize()
'''


@pytest.mark.timeout(180)
@pytest.mark.parametrize("tune", [None, "0", "200,1000,1", "200,1000,0,0,0,0"],
                         ids=["adaptive", "off", "fixed", "progress-thread-as-before"])
def test_rma_to_a_waiting_target_loses_nothing(tmp_path, tune):
    _need_ofi("tcp;ofi_rxm")
    env = {"GEXMK_TRANSPORT": "ofi", "GEXMK_OFI_PROVIDER": "tcp;ofi_rxm", "FI_PROVIDER": None,
           "GEXMK_OFI_TRACE": "1", "GEXMK_OFI_WAIT_TUNE": tune, "GEXMK_TIMEOUT": 60}
    _run_ok(tmp_path, HOTWIN, 2, env, "HOTWIN", 150)
