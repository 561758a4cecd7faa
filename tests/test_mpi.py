"""gexmk under MPI: ``mpiexec -n 2 python worker.py``.

The worker either lets ``gexmk.init()`` find MPI by itself (the launcher's
environment) or hands it a communicator (``gexmk.init(comm=...)``), then runs
a put/get ring and atomics.  Skipped when mpiexec or mpi4py is missing.
"""
import importlib.util
import os
import shutil
import sys
import textwrap

import pytest

try:
    from . import mp_util
except ImportError:
    import mp_util

MPIEXEC = shutil.which("mpiexec")

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.skipif(MPIEXEC is None, reason="mpiexec is not on PATH (pip install mpich)"),
    pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None,
                       reason="mpi4py is not installed (pip install mpi4py)"),
]

RING_AND_ATOMICS = r'''
tm = c.tm
me, n = tm.rank, tm.size
assert (me, n) == (c.rank, c.size)
seg = c.segment_attach(8192)
arr = np.asarray(seg)
for r in range(n):
    assert tm.transport(r) == ("self" if r == me else peer_transport()), (r, tm.transport(r))
right, left = (me + 1) % n, (me - 1) % n
tm.put(right, tm.addr(right, 1024), pattern(2048, me, right))
tm.put_nb(right, tm.addr(right, 4096), pattern(64, me, right, 1)).wait()
tm.barrier()
assert (arr[1024:3072] == pattern(2048, left, me)).all(), "ring put did not land"
assert (arr[4096:4160] == pattern(64, left, me, 1)).all()
got = np.zeros(2048, np.uint8)
tm.get(got, right, tm.addr(right, 1024))
assert (got == pattern(2048, me, right)).all(), "ring get returned wrong data"
# atomics: everyone adds to every rank's counter, then CAS a ticket
ad = tm.ad_create(gexmk.DT_I64, gexmk.OP_FADD | gexmk.OP_CAS | gexmk.OP_GET | gexmk.OP_SET)
for r in range(n):
    for _ in range(10):
        ad.op(r, tm.addr(r, 0), gexmk.OP_FADD, me + 1)
tm.barrier()
assert int(np.frombuffer(arr[:8].tobytes(), np.int64)[0]) == 10 * sum(range(1, n + 1))
assert ad.op(left, tm.addr(left, 0), gexmk.OP_GET) == 10 * sum(range(1, n + 1))
# exactly one rank wins the CAS on rank 0's ticket
winner = ad.op(0, tm.addr(0, 8), gexmk.OP_CAS, 0, me + 1)
tm.barrier()
ticket = ad.op(0, tm.addr(0, 8), gexmk.OP_GET)
assert 1 <= ticket <= n, ticket
fad = tm.ad_create(gexmk.DT_DBL, gexmk.OP_FADD | gexmk.OP_GET)
fad.op(right, tm.addr(right, 16), gexmk.OP_FADD, 0.5 * (me + 1))
tm.barrier()
assert np.frombuffer(arr[16:24].tobytes(), np.float64)[0] == 0.5 * (left + 1)
tm.barrier()
c.finalize()
with open(f"ok.{me}", "w") as f:    # (stdout lines of ranks interleave)
    f.write(str(n))
'''


#: what MPICH (ch4 posix) names its shared-memory files in /dev/shm
MPICH_SHM = ("mpich_shm_", "mpich_vci_")


def run_mpi(tmp_path, source, n=2, env=None, timeout=60):
    """Run ``source`` as ``mpiexec -n N python worker.py``; killed whole after ``timeout`` s."""
    script = mp_util.write_worker(tmp_path, source)
    res = mp_util.run_command([MPIEXEC, "-n", str(n), sys.executable, script], timeout=timeout,
                              env=mp_util.child_env(env), cwd=str(tmp_path), script=script,
                              watch_shm=MPICH_SHM)
    if res.timed_out or res.returncode != 0:
        # MPICH leaves its shared-memory files behind when its ranks are SIGKILLed
        # or end by os._exit (a watchdog's faulthandler exit).  Only this job's: those
        # its processes mapped (a concurrent job's, made meanwhile, are not ours)
        mp_util.remove_shm(res.shm_files)
    return res


def assert_all_ok(tmp_path, res, n, size=None):
    """Every rank got to the end (each wrote ok.<rank> holding the job size)."""
    res.check()
    oks = {p.name: p.read_text() for p in tmp_path.glob("ok.*")}
    assert oks == {f"ok.{r}": str(size or n) for r in range(n)}, res.report()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport", ["auto", "pvm"])
def test_init_detects_mpi(tmp_path, transport):
    src = textwrap.dedent(r'''
    c = gexmk.init()                            # finds mpiexec's environment by itself
    assert c.bootstrap.kind == "mpi", c.bootstrap.kind
    assert "MPI launcher" in c.bootstrap.reason, c.bootstrap.reason   # the registry's why
    from mpi4py import MPI
    assert (c.rank, c.size) == (MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size())
    if peer_transport() == "pvm":
        # no mapping under forced pvm: remote atomics are refused, plain RMA works
        tm = c.tm
        seg = c.segment_attach(4096)
        right = (tm.rank + 1) % tm.size
        tm.put(right, tm.addr(right, 64), pattern(128, tm.rank))
        tm.barrier()
        assert (np.asarray(seg)[64:192] == pattern(128, (tm.rank - 1) % tm.size)).all()
        ad = tm.ad_create(gexmk.DT_I64, gexmk.OP_FADD)
        expect_raises(E.UnsupportedError, ad.op, right, tm.addr(right, 0), gexmk.OP_FADD, 1)
        tm.barrier()
        c.finalize()
        with open(f"ok.{tm.rank}", "w") as f:
            f.write(str(tm.size))
        sys.exit(0)
    ''') + RING_AND_ATOMICS
    assert_all_ok(tmp_path, run_mpi(tmp_path, src, env={"GEXMK_TRANSPORT": transport}), 2)


@pytest.mark.timeout(90)
def test_init_with_comm_world(tmp_path):
    src = textwrap.dedent(r'''
    from mpi4py import MPI
    c = gexmk.init(comm=MPI.COMM_WORLD)
    assert "mpi4py communicator" in c.bootstrap.reason, c.bootstrap.reason
    assert (c.rank, c.size) == (MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size())
    # the caller's communicator is still usable and untouched by gexmk's traffic
    # (a buffer Allreduce releases the GIL; for the object allreduce see the test below)
    total = np.zeros(1)
    MPI.COMM_WORLD.Allreduce(np.ones(1), total, op=MPI.SUM)
    assert total[0] == c.size
    ''') + RING_AND_ATOMICS
    assert_all_ok(tmp_path, run_mpi(tmp_path, src), 2)


@pytest.mark.timeout(90)
def test_init_with_reordered_communicator(tmp_path):
    """gexmk ranks follow the communicator's ranks, not MPI_COMM_WORLD's."""
    src = textwrap.dedent(r'''
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    comm = world.Split(0, key=-world.Get_rank())
    c = gexmk.init(comm=comm)
    assert c.rank == comm.Get_rank() == world.Get_size() - 1 - world.Get_rank(), \
        (c.rank, comm.Get_rank(), world.Get_rank())
    assert c.size == comm.Get_size()
    ''') + RING_AND_ATOMICS
    assert_all_ok(tmp_path, run_mpi(tmp_path, src), 2)


@pytest.mark.timeout(90)
def test_init_with_comm_self_is_a_job_of_one(tmp_path):
    src = r'''
    from mpi4py import MPI
    c = gexmk.init(comm=MPI.COMM_SELF)
    assert (c.rank, c.size) == (0, 1), (c.rank, c.size)
    seg = c.segment_attach(64)
    c.tm.put_val(0, c.tm.addr(0, 0), 5)
    assert c.tm.transport(0) == "self" and np.frombuffer(np.asarray(seg), np.int64)[0] == 5
    c.finalize()
    with open(f"ok.{MPI.COMM_WORLD.Get_rank()}", "w") as f:
        f.write("1")
    '''
    assert_all_ok(tmp_path, run_mpi(tmp_path, src), 2, size=1)


#: Iterations of init / GIL-holding allreduce / finalize in the job below, and how
#: long one iteration may take before its watchdog calls it a hang (1-2 ms
#: each on an idle machine; GEXMK_TIMEOUT=5 ends any wait of gexmk's own sooner)
GIL_RACE_ITERATIONS = 3000
GIL_RACE_HANG_S = 30


@pytest.mark.timeout(330)
def test_init_then_gil_holding_mpi_call_does_not_hang(tmp_path):
    """Right after gexmk.init(), a rank may enter an MPI call that keeps the
    GIL while it blocks (mpi4py's object allreduce does: it reduces with a
    Python op).  MPI rank 0 hosts the rendezvous server in a thread of its
    own process, so init must not return on rank 0 before the server has told
    every rank the job is complete, or the others wait for their welcome
    forever.  A tiny GIL switch interval makes the race easy to hit; the loop
    runs it a few thousand times.

    A hang is told from a slow machine per iteration: each is watched (the
    watchdog prints every thread's stack and ends the rank), and the job as a
    whole gets several minutes.  It used to get 15 s per 1000 iterations,
    which a loaded 2-core machine overran without any iteration stalling
    (24 of 129 such jobs took 15-23 s under load, and none had an iteration
    over 3 s): the "deadlock" this test reported now and then was that."""
    src = f'''
    from mpi4py import MPI
    W = MPI.COMM_WORLD
    sys.setswitchinterval(1e-6)
    for i in range({GIL_RACE_ITERATIONS}):
        # re-armed each iteration: one that stalls prints every thread's stack and exits
        faulthandler.dump_traceback_later({GIL_RACE_HANG_S}, exit=True)
        c = gexmk.init(comm=W)
        assert W.allreduce(1) == c.size        # holds the GIL while it waits
        c.finalize()
    faulthandler.dump_traceback_later({GIL_RACE_HANG_S}, exit=True)   # and the exit
    with open(f"ok.{{W.Get_rank()}}", "w") as f:
        f.write(str(W.Get_size()))
    '''
    res = run_mpi(tmp_path, src, env={"GEXMK_TIMEOUT": "5", "GEXMK_TEST_TRACEBACK_AFTER": "0"},
                  timeout=300)
    assert res.returncode == 0 and not res.timed_out, \
        f"init/allreduce/finalize stalled (an iteration over {GIL_RACE_HANG_S} s prints its " \
        f"stacks)\n{res.report()}"
    assert_all_ok(tmp_path, res, 2)


@pytest.mark.timeout(90)
def test_failed_job_removes_only_its_own_mpich_shm(tmp_path):
    """A job that ends badly (os._exit after MPI_Init) leaves MPICH's
    shared-memory file in /dev/shm; run_mpi removes it, and nothing else:
    another job's file made meanwhile (here rank 0 makes one, under a name
    like MPICH's, without ever holding it open under that name) stays.  The
    clean-up used to remove every mpich_shm_* file made during the job."""
    foreign = f"mpich_shm_foreign_{os.getpid()}_{id(tmp_path):x}"
    src = f'''
    from mpi4py import MPI
    W = MPI.COMM_WORLD
    W.Barrier()
    if W.Get_rank() == 0:
        tmp = "/dev/shm/gexmk-test-{foreign}"
        os.close(os.open(tmp, os.O_CREAT | os.O_WRONLY, 0o600))
        os.rename(tmp, "/dev/shm/{foreign}")
    time.sleep(0.5)                 # the harness sees MPICH's file mapped
    W.Barrier()
    os._exit(1)                     # no MPI_Finalize: MPICH's file stays
    '''
    try:
        res = run_mpi(tmp_path, src, timeout=60)
        assert res.returncode != 0 and not res.timed_out, res.report()
        assert res.shm_files and all(f.startswith(MPICH_SHM) for f in res.shm_files), \
            f"the job's MPICH files were not seen: {res.shm_files}\n{res.report()}"
        assert foreign not in res.shm_files
        left = set(os.listdir("/dev/shm"))
        assert not res.shm_files & left, f"the job's own files were left: {res.shm_files & left}"
        assert foreign in left, "the clean-up removed a file that was not the job's"
    finally:
        try:
            os.unlink(f"/dev/shm/{foreign}")
        except OSError:
            pass
