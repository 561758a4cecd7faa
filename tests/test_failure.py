"""Failures in multi-process jobs: a rank killed mid-job, a rank that never
arrives (GEXMK_TIMEOUT), a rank that exits with an error, a job that hangs.

Each must end quickly with a clear error or exit code, and leave nothing
behind: no process of the job (ranks, or children they started) and no file
in /dev/shm.
"""
import os
import signal
import textwrap
import time

import pytest

try:
    from . import mp_util
except ImportError:
    import mp_util

NRANKS = pytest.mark.parametrize("n", [2, 4])

# Every rank starts a grandchild that would outlive it if nobody cleaned up;
# its command line names the test's directory, so the scan below finds it.
SPAWN_GRANDCHILD = r'''
import subprocess
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)",
                  os.path.join(os.getcwd(), "grandchild")])
'''


def shm_entries():
    try:
        return set(os.listdir("/dev/shm"))
    except FileNotFoundError:
        return set()


def assert_nothing_left(tmp_path, res, shm_before):
    """No process whose command line names tmp_path (workers, grandchildren);
    no new file in /dev/shm."""
    marker = str(tmp_path)
    # a process SIGKILLed just before the launcher exited may take a moment to go
    deadline = time.monotonic() + 3
    left = mp_util.processes_running(marker)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = mp_util.processes_running(marker)
    if left:
        # leave nothing behind even when failing; these are ours (they name tmp_path)
        for p in left:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
    assert not left, f"processes left running after the job: {left}\n{res.report()}"
    # Other processes of the machine may create short-lived files there meanwhile:
    # only files that stay count.
    # (MPICH's files are not ours: these jobs run no MPI, but MPI jobs elsewhere
    # on the machine leave theirs when killed.)
    deadline = time.monotonic() + 2
    new = {f for f in shm_entries() - shm_before if not f.startswith("mpich_shm_")}
    while new and time.monotonic() < deadline:
        time.sleep(0.1)
        new &= shm_entries()
    assert not new, f"new files in /dev/shm after the job: {sorted(new)}"


@pytest.mark.timeout(90)
@NRANKS
@pytest.mark.parametrize("transport", ["auto", "pvm"])
def test_killed_rank_is_reported_dead(tmp_path, n, transport):
    src = SPAWN_GRANDCHILD + textwrap.dedent(r'''
    c = gexmk.init()
    tm = c.tm
    me, n = tm.rank, tm.size
    VICTIM = 1
    seg = c.segment_attach(4096)
    ad = tm.ad_create(gexmk.DT_I64, gexmk.OP_FADD)
    alive = tm.split(None if me == VICTIM else 0, key=me)   # the survivors' own team
    tm.barrier()
    if me == VICTIM:
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)                     # not reached
    # the next barrier fails fast: the victim is dead
    t0 = time.monotonic()
    e = expect_raises(E.PeerDeadError, tm.barrier)
    dt = time.monotonic() - t0
    log(f"barrier raised after {dt:.2f}s: {e}")
    assert dt < 5, f"barrier took {dt:.1f}s to notice the death"
    assert isinstance(e, E.CommunicationError)
    # and keeps failing, at once
    t0 = time.monotonic()
    expect_raises(E.PeerDeadError, tm.barrier)
    assert time.monotonic() - t0 < 2
    # RMA to the dead rank fails once the bootstrap reported the death
    addr = tm.addr(VICTIM, 0)
    deadline = time.monotonic() + 5
    while True:
        try:
            tm.put_val(VICTIM, addr, 1)
        except E.PeerDeadError as err:
            log(f"put raised: {err}")
            break
        assert time.monotonic() < deadline, "puts to the dead rank still succeed after 5 s"
        time.sleep(0.05)
    expect_raises(E.PeerDeadError, tm.put, VICTIM, addr, b"x" * 100)
    expect_raises(E.PeerDeadError, tm.put_nb, VICTIM, addr, b"x" * 100)
    expect_raises(E.PeerDeadError, tm.get_val, VICTIM, addr)
    expect_raises(E.PeerDeadError, tm.get, bytearray(16), VICTIM, addr)
    # every handle on the dead process's endpoint sees it: a TM-pair too
    pr = c.ep(0).pair(0)
    expect_raises(E.PeerDeadError, pr.put_val, VICTIM, pr.addr(VICTIM, 0), 1)
    if peer_transport() == "nbrhd":
        expect_raises(E.PeerDeadError, ad.op, VICTIM, addr, gexmk.OP_FADD, 1)
    # the survivors still reach each other and themselves
    for r in range(n):
        if r != VICTIM:
            tm.put_val(r, tm.addr(r, 8 * me + 64), me + 1)
            assert tm.get_val(r, tm.addr(r, 8 * me + 64)) == me + 1
    alive.barrier()                        # survivors' collectives still work
    # ... and can finish: finalize skips its barrier when a peer died
    c.finalize()
    with open(f"survivor.{me}", "w") as f:
        f.write("ok")
    ''')
    shm = shm_entries()
    res = mp_util.run_job(tmp_path, src, n, keep_going=True, launcher_timeout=45,
                          env={"GEXMK_TRANSPORT": transport})
    res.check(rc=128 + signal.SIGKILL)
    survivors = sorted(p.name for p in tmp_path.glob("survivor.*"))
    assert survivors == [f"survivor.{r}" for r in range(n) if r != 1], res.report()
    assert res.elapsed < 30, res.report()
    assert_nothing_left(tmp_path, res, shm)


# ---- the death grace: a wait on a team with a dead member goes on 1 s ----------------
#
# (signal.pxi _DEATH_GRACE.)  What is waited for may still come from the living: the
# waiter gets it when it comes within the grace, PeerDeadError when it does not.  Not a
# conformance-matrix row: its jobs run cells in lockstep and restart after a rank ends.
#
# Ranks: W (0) waits, V (1) is killed while the team's wait is under way, S (2), slower,
# delivers what W waits for DELAY s after it killed V.  The barrier is the team's
# dissemination over 3 (round k: r -> r + 2**k): W needs S's round 0 and V's round 1;
# V sends that as soon as W and V entered, then waits for S -- killed there, its part
# for W done, as the victim of the failure this guards against (test_failure[pvm-4]
# before 879f71f: a survivor's barrier waiting for a slower live partner).
DEATH_GRACE_SRC = r'''
import signal as _signal
W, V, S = 0, 1, 2
c = gexmk.init()
tm = c.tm
me = tm.rank
seg = c.segment_attach(4096)
words = np.asarray(seg).view(np.uint64)
alive = tm.split(None if me == V else 0, key=me)   # the survivors' own team
pids = np.zeros(3, np.int64)
tm.allgather(np.array([os.getpid()], np.int64), pids)
tm.barrier()
outcome = "-"
if me == S:
    # W and V say they are entering; then V's arrivals are sent (microseconds) and V
    # waits for S's: kill it there
    tm.wait_until_all([tm.addr(S, 8), tm.addr(S, 16)], gexmk.CMP_EQ, 1, timeout=20)
    time.sleep(0.3)
    os.kill(int(pids[V]), _signal.SIGKILL)
    time.sleep(DELAY)
    try:
        if WAIT == "barrier":
            tm.barrier()
        else:
            tm.put_val(W, tm.addr(W, 0), 42)
        outcome = "ok"
    except E.PeerDeadError as e:
        outcome = f"PeerDeadError: {e}"
else:
    tm.put_val(S, tm.addr(S, 8 * (me + 1)), 1)         # W: word 1, V: word 2
    try:
        if WAIT == "barrier":
            tm.barrier()
            outcome = "ok"
        else:
            # V waits too (on its own word, never set): it dies in a wait
            tm.wait_until(tm.addr(me, 0), gexmk.CMP_EQ, 42)
            outcome = f"ok {int(words[0])}"
    except E.PeerDeadError as e:
        outcome = f"PeerDeadError: {e}"
    if me == V:
        time.sleep(60)                                  # killed before it gets here
log("outcome:", outcome)
with open(f"outcome.{me}", "w") as f:
    f.write(outcome)
alive.barrier()
c.finalize()
'''

#: (wait, delay of the live member's delivery after the death, W's outcome, S's outcome).
#: S's own barrier arrives at the dead V in its last round: refused once S knows of the
#: death (PeerDeadError naming the arrival), a store nobody reads before (ok) -- either
#: is right for S (``ok|PeerDeadError``); W's outcome is the point.
DEATH_GRACE_CASES = [
    pytest.param("barrier", 0.2, "ok", "ok|PeerDeadError", id="barrier-in-time"),
    pytest.param("barrier", 3.0, "PeerDeadError", "PeerDeadError", id="barrier-late"),
    pytest.param("wait_until", 0.2, "ok 42", "ok", id="wait_until-in-time"),
    pytest.param("wait_until", 3.0, "PeerDeadError", "ok", id="wait_until-late"),
]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("wait, delay, want_w, want_s", DEATH_GRACE_CASES)
@pytest.mark.parametrize("transport", ["auto", "pvm", "ofi"])
def test_death_grace(tmp_path, transport, wait, delay, want_w, want_s):
    if transport == "ofi":
        try:
            import gexmk.transports.ofi  # noqa: F401
        except ImportError:
            pytest.skip("gexmk was built without the ofi transport")
        env = {"GEXMK_TRANSPORT": "ofi", "GEXMK_OFI_PROVIDER": "tcp;ofi_rxm",
               "GEXMK_PROGRESS_THREAD": None, "FI_PROVIDER": None}
    else:
        env = {"GEXMK_TRANSPORT": transport}
    src = DEATH_GRACE_SRC.replace("WAIT", repr(wait)).replace("DELAY", repr(delay))
    shm = shm_entries()
    res = mp_util.run_job(tmp_path, src, 3, keep_going=True, launcher_timeout=60,
                          env=dict(env, GEXMK_TIMEOUT="20"))
    res.check(rc=128 + signal.SIGKILL)
    got = {r: (tmp_path / f"outcome.{r}").read_text() if (tmp_path / f"outcome.{r}").exists()
           else None for r in (0, 1, 2)}
    assert got[1] is None, f"the victim outlived its kill: {got[1]}\n{res.report()}"
    assert got[0] is not None and got[2] is not None, f"a survivor did not finish: {got}\n{res.report()}"
    for who, want, have in (("W", want_w, got[0]), ("S", want_s, got[2])):
        ok = [w for w in want.split("|") if w != "PeerDeadError"]
        dead = "PeerDeadError" in want.split("|") and have.startswith("PeerDeadError: ") \
            and "job rank 1" in have and ("died" in have or "dead" in have)
        assert have in ok or dead, \
            f"{who}: {have!r}, want {want!r} (PeerDeadError naming job rank 1's death)\n{res.report()}"
    assert_nothing_left(tmp_path, res, shm)


@pytest.mark.timeout(90)
@NRANKS
def test_rank_missing_from_barrier_times_out(tmp_path, n):
    src = r'''
    c = gexmk.init()
    tm = c.tm
    me, n = tm.rank, tm.size
    c.segment_attach(1024)
    LATE = n - 1
    # the others' own team, so that they can wait for each other before leaving
    # (the first to leave would otherwise turn the others' timeout into a PeerDeadError)
    others = tm.split(None if me == LATE else 0, key=me)
    if me == LATE:
        time.sleep(6)                      # never enters the barrier in time
        try:
            tm.barrier()                   # the others gave up and left by now
        except gexmk.GexmkError as e:
            log(f"late rank: {type(e).__name__}: {e}")
        sys.exit(0)
    t0 = time.monotonic()
    e = expect_raises(E.TimeoutError, tm.barrier)
    dt = time.monotonic() - t0
    log(f"barrier timed out after {dt:.2f}s: {e}")
    assert isinstance(e, TimeoutError) and isinstance(e, gexmk.GexmkError)
    assert 1.5 <= dt < 5, f"GEXMK_TIMEOUT=2 but the barrier returned after {dt:.1f}s"
    assert f"[{LATE}]" in str(e), f"the error should name the missing rank {LATE}: {e}"
    with open(f"timedout.{me}", "w") as f:
        f.write(f"{dt}")
    others.barrier()
    # no finalize (it would wait in a barrier again): the interpreter's exit tears down
    '''
    res = mp_util.run_job(tmp_path, src, n, launcher_timeout=45, env={"GEXMK_TIMEOUT": "2"})
    res.check()
    assert sorted(p.name for p in tmp_path.glob("timedout.*")) == \
        [f"timedout.{r}" for r in range(n - 1)], res.report()
    assert res.elapsed < 30, res.report()


@pytest.mark.timeout(90)
@NRANKS
def test_failing_rank_stops_the_job(tmp_path, n):
    src = SPAWN_GRANDCHILD + textwrap.dedent(r'''
    c = gexmk.init()
    tm = c.tm
    me = tm.rank
    c.segment_attach(1024)
    tm.barrier()
    if me == 1:
        log("exiting with code 3")
        sys.exit(3)
    time.sleep(60)                         # the launcher must stop us
    sys.exit(0)
    ''')
    shm = shm_entries()
    res = mp_util.run_job(tmp_path, src, n, launcher_timeout=45)
    res.check(rc=3)
    assert res.elapsed < 20, res.report()
    assert "rank 1 exited with code 3" in res.stderr, res.report()
    assert_nothing_left(tmp_path, res, shm)


@pytest.mark.timeout(60)
def test_launcher_timeout_kills_a_hung_job(tmp_path):
    src = SPAWN_GRANDCHILD + textwrap.dedent(r'''
    c = gexmk.init()
    if c.rank == 0:
        time.sleep(120)
    else:
        c.tm.barrier()                     # waits for rank 0 (GEXMK_TIMEOUT is long)
    ''')
    shm = shm_entries()
    res = mp_util.run_job(tmp_path, src, 2, launcher_timeout=3, timeout=30,
                          env={"GEXMK_TIMEOUT": "300"})
    res.check(rc=124)
    assert res.elapsed < 15, res.report()
    assert_nothing_left(tmp_path, res, shm)


@pytest.mark.timeout(60)
def test_harness_kills_everything_on_overrun(tmp_path):
    """mp_util's own guarantee: a job outliving the harness limit is killed
    whole (launcher, ranks, their children)."""
    src = SPAWN_GRANDCHILD + textwrap.dedent(r'''
    time.sleep(120)
    ''')
    res = mp_util.run_job(tmp_path, src, 2, launcher_timeout=100, timeout=4, prelude=True)
    assert res.timed_out and res.returncode != 0, res.report()
    assert res.elapsed < 20
    deadline = time.monotonic() + 5
    while mp_util.processes_running(str(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert_nothing_left(tmp_path, res, shm_entries())
