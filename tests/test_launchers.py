"""One plain gexmk program under each launcher, started by the test (issue 23).

The same program (:data:`PROGRAM`: a ring of puts, a barrier, an allgather of
bytes through the bootstrap, no mpi4py) runs unchanged under Open MPI's
``mpirun`` (the ``pmix`` plug-in), a one-node Slurm started here with a
throw-away configuration (``srun -n 4``: the ``slurm`` plug-in; ``srun
--mpi=pmix -n 4``: ``pmix``), ``torchrun --standalone --nproc-per-node 4``
(``torchrun``), and ``python -m gexmk.run`` (``launcher``); each rank writes
``ok.<rank>`` with what it saw, and the test checks every rank's file, the
plug-in each used, and that nothing is left behind (processes, files in
/dev/shm).  Two tests cross two network namespaces (two "nodes" of two ranks
each): torchrun's two agents meeting at a c10d rendezvous, and Slurm's
environment as srun sets it for a two-node step.  Each launcher skips where it
is not installed (``./dev setup`` installs them all).
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

try:
    from . import mp_util, netns_util
except ImportError:
    import mp_util
    import netns_util

from gexmk.bootstrap import registry

PROGRAM = r'''
import json, os, sys
import numpy as np
import gexmk

with gexmk.init() as c:
    b, tm = c.bootstrap, c.tm
    seg = c.segment_attach(1 << 16)
    right = (tm.rank + 1) % tm.size
    tm.put(right, tm.addr(right, 0), np.full(8, tm.rank, np.int64))
    tm.barrier()
    got = np.asarray(seg)[:64].view(np.int64)
    assert (got == (tm.rank - 1) % tm.size).all(), got
    parts = b.allgather(f"rank {tm.rank}".encode())
    assert parts == [f"rank {r}".encode() for r in range(tm.size)], parts
    info = {"size": tm.size, "kind": b.kind, "reason": b.reason, "local": b.local_ranks,
            "nodes": b.nodes, "mpi4py": "mpi4py" in sys.modules, "pid": os.getpid(),
            "transports": [tm.transport(r) for r in range(tm.size)],
            "launcher_local": getattr(b, "launcher_local_ranks", None)}
    tm.barrier()
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), f"ok.{tm.rank}"), "w") as f:
    json.dump(info, f)
'''

# Variables of an enclosing launcher that must not leak into the jobs started here.
_LAUNCHER_VARS = ("GEXMK_BOOTSTRAP", "GEXMK_BOOTSTRAP_TOKEN", "GEXMK_BOOTSTRAP_KIND",
                  "GEXMK_RANK", "GEXMK_SIZE")
_LAUNCHER_PREFIXES = ("SLURM_", "PMIX_", "PMI_", "OMPI_", "TORCHELASTIC_")


def clean_env(extra=None):
    """The test's environment without any launcher's variables, plus ``extra``."""
    env = mp_util.child_env()
    for k in list(env):
        if k in _LAUNCHER_VARS or k.startswith(_LAUNCHER_PREFIXES) or k in (
                "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            del env[k]
    env.setdefault("GEXMK_TIMEOUT", "60")
    env.update({k: str(v) for k, v in (extra or {}).items()})
    return env


# /dev/shm names that launchers and libfabric's shm provider use; other processes of
# the machine (other test runs) may create files there meanwhile, so only these count.
_SHM_PATTERNS = ("vader_segment", "ompi", "sm_segment", "psm", "slurm", "torch", "pmix",
                 "gexmk")
_job_pids = set()


def shm_files():
    try:
        names = os.listdir("/dev/shm")
    except FileNotFoundError:
        return set()
    return {n for n in names if n.startswith(_SHM_PATTERNS)
            or n.partition(":")[0] in {str(p) for p in _job_pids}}


def check_job(tmp_path, res, n, kind, nodes=1):
    """Every rank of ``n`` finished with plug-in ``kind`` and saw a job of ``n``
    ranks on ``nodes`` node(s); returns the ranks' reports."""
    assert not res.timed_out, res.report()
    assert res.returncode == 0, res.report()
    reports = {}
    for r in range(n):
        path = tmp_path / f"ok.{r}"
        assert path.exists(), f"rank {r} did not finish\n{res.report()}"
        reports[r] = json.loads(path.read_text())
    _job_pids.update(rep["pid"] for rep in reports.values())
    for r, rep in reports.items():
        assert rep["size"] == n, (r, rep)
        assert rep["kind"] == kind, (r, rep)
        assert not rep["mpi4py"], f"rank {r} imported mpi4py"
        assert len(set(rep["nodes"])) == nodes, (r, rep)
        assert r in rep["local"] and len(rep["local"]) == n // nodes, (r, rep)
    return reports


@pytest.fixture(autouse=True)
def nothing_left(tmp_path):
    """Fail a test that leaves a process naming tmp_path, or a new file in /dev/shm."""
    _job_pids.clear()
    before = shm_files()
    yield
    marker = str(tmp_path)
    end = time.monotonic() + 10
    while mp_util.processes_running(marker) and time.monotonic() < end:
        time.sleep(0.1)
    left = mp_util.processes_running(marker)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    assert not left, f"processes left running: {left}"
    new = shm_files() - before
    assert not new, f"files left in /dev/shm: {sorted(new)}"


def need_plugin(name):
    why = registry._available(name)
    if why:
        pytest.skip(f"the {name} bootstrap is absent: {why}")


# -- gexmk.run (what exists today) --------------------------------------------------------

@pytest.mark.timeout(120)
def test_gexmk_run(tmp_path):
    script = mp_util.write_worker(tmp_path, PROGRAM, prelude=False)
    res = mp_util.run_command([sys.executable, "-m", "gexmk.run", "-n", "4", "--timeout", "90",
                               script], timeout=110, env=clean_env(), cwd=str(tmp_path))
    check_job(tmp_path, res, 4, "launcher")


# -- Open MPI's mpirun: PMIx, no mpi4py -----------------------------------------------------

def openmpi_mpirun():
    """Open MPI's mpirun (Debian: mpirun.openmpi), or None; an mpirun of another MPI
    (the mpich wheel's) does not count."""
    for name in ("mpirun.openmpi", "mpirun"):
        path = shutil.which(name)
        if path is None:
            continue
        try:
            out = subprocess.run([path, "--version"], capture_output=True, text=True,
                                 timeout=20, stdin=subprocess.DEVNULL).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        if "Open MPI" in out or "OpenRTE" in out:
            return path
    return None


@pytest.mark.timeout(120)
def test_openmpi_mpirun_uses_pmix(tmp_path):
    mpirun = openmpi_mpirun()
    if mpirun is None:
        pytest.skip("Open MPI's mpirun is not installed (apt install openmpi-bin)")
    need_plugin("pmix")
    script = mp_util.write_worker(tmp_path, PROGRAM, prelude=False)
    extra = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    res = mp_util.run_command([mpirun, *extra, "--oversubscribe", "-n", "4", sys.executable,
                               script], timeout=110, env=clean_env(), cwd=str(tmp_path))
    reports = check_job(tmp_path, res, 4, "pmix")
    assert "PMIX_NAMESPACE" in reports[0]["reason"], reports[0]
    # PMIx's own view of the node (PMIX_LOCAL_PEERS) is the rendezvous's
    assert all(r["launcher_local"] == r["local"] for r in reports.values()), reports


# -- torchrun --------------------------------------------------------------------------------

def torchrun_cmd():
    if registry._available("torchrun"):
        pytest.skip(registry._available("torchrun"))
    return [sys.executable, "-m", "torch.distributed.run"]


@pytest.mark.timeout(180)
def test_torchrun_standalone(tmp_path):
    cmd = torchrun_cmd()
    script = mp_util.write_worker(tmp_path, PROGRAM, prelude=False)
    res = mp_util.run_command([*cmd, "--standalone", "--nproc-per-node", "4", script],
                              timeout=170, env=clean_env({"OMP_NUM_THREADS": 1,
                                                          "TMPDIR": tmp_path}),
                              cwd=str(tmp_path))
    check_job(tmp_path, res, 4, "torchrun")


DEVICE = r'''
import json, os, sys
import numpy as np
import gexmk

with gexmk.init() as c:
    b, tm = c.bootstrap, c.tm
    mk = c.mk_create(gexmk.CUDA_UVA, device=0)
    seg = c.segment_create(1 << 20, kind=mk)
    ep = c.ep_create()
    ep.bind_segment(seg)
    tm.publish_bound_segment([ep])
    dev = c.ep(0).pair(ep.index)               # host endpoint 0 -> every rank's device segment
    right, left = (tm.rank + 1) % tm.size, (tm.rank - 1) % tm.size
    dev.put(right, dev.addr(right, 4096), np.full(65536, tm.rank + 1, np.uint8))
    tm.barrier()
    got = np.zeros(65536, np.uint8)
    dev.get(got, tm.rank, dev.addr(tm.rank, 4096))
    assert (got == left + 1).all(), got[:8]
    info = {"size": tm.size, "kind": b.kind, "reason": b.reason, "local": b.local_ranks,
            "nodes": b.nodes, "mpi4py": "mpi4py" in sys.modules, "pid": os.getpid(),
            "transports": [dev.transport(r) for r in range(tm.size)], "launcher_local": None}
    tm.barrier()
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), f"ok.{tm.rank}"), "w") as f:
    json.dump(info, f)
'''


def _have_gpu():
    try:
        from gexmk.kinds import cuda
        probe = cuda.probe()
    except Exception:
        return False
    return bool(probe.get("driver_loaded") and probe.get("device_count"))


@pytest.mark.gpu
@pytest.mark.timeout(240)
def test_torchrun_device_segments(tmp_path):
    """Device segments (CUDA_UVA, one GPU shared by the ranks) under torchrun: host
    data put into the right neighbour's device segment, read back from one's own."""
    cmd = torchrun_cmd()
    if not _have_gpu():
        pytest.skip("no NVIDIA driver or device on this machine")
    script = mp_util.write_worker(tmp_path, DEVICE, prelude=False)
    res = mp_util.run_command([*cmd, "--standalone", "--nproc-per-node", "2", script],
                              timeout=220, env=clean_env({"OMP_NUM_THREADS": 1,
                                                          "TMPDIR": tmp_path}),
                              cwd=str(tmp_path))
    reports = check_job(tmp_path, res, 2, "torchrun")
    assert reports[0]["transports"][1] == "nbrhd", reports[0]


# -- Slurm: munge + slurmctld + slurmd on this machine ------------------------------------------

def _free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _stepd_pids():
    pids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if f.read().startswith(b"slurmstepd"):
                        pids.add(int(entry))
            except OSError:
                pass
    return pids


def _stop(proc, timeout=10):
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


class Slurm:
    """A one-node Slurm cluster of this machine: ``env`` runs srun against it."""

    def __init__(self, root):
        self.root = root
        self.env = None
        self.procs = []

    def logs(self):
        out = []
        for name in ("munged.log", "slurmctld.log", "slurmd.log"):
            p = self.root / name
            if p.exists():
                out.append(f"--- {name}\n" + "\n".join(p.read_text().splitlines()[-15:]))
        return "\n".join(out)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """munged, slurmctld and slurmd with a throw-away configuration (their own ports,
    state, spool and munge key under a temporary directory), stopped at the end of
    the module with every step daemon they left."""
    for tool in ("munged", "slurmctld", "slurmd", "srun", "sinfo"):
        if shutil.which(tool) is None:
            pytest.skip(f"Slurm is not installed ({tool} not found; apt install slurm-wlm munge)")
    if os.geteuid() != 0:
        pytest.skip("slurmd must run as root to start tasks")
    root = tmp_path_factory.mktemp("slurm")
    cluster = Slurm(root)
    (root / "state").mkdir()
    (root / "spool").mkdir()
    key = root / "munge.key"
    key.write_bytes(os.urandom(128))
    key.chmod(0o600)
    ctld_port, d_port = _free_ports(2)
    host = socket.gethostname()
    conf = root / "slurm.conf"
    conf.write_text("\n".join([
        "ClusterName=gexmktest", f"SlurmctldHost={host}", f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={d_port}", "AuthType=auth/munge", f"AuthInfo=socket={root}/munge.sock",
        "CredType=cred/munge", "SlurmUser=root", "SlurmdUser=root",
        f"StateSaveLocation={root}/state", f"SlurmdSpoolDir={root}/spool",
        f"SlurmctldPidFile={root}/slurmctld.pid", f"SlurmdPidFile={root}/slurmd.pid",
        f"SlurmctldLogFile={root}/slurmctld.log", f"SlurmdLogFile={root}/slurmd.log",
        # no cgroups in a container: process groups track tasks, nothing binds them
        "ProctrackType=proctrack/pgid", "TaskPlugin=task/none", "SchedulerType=sched/builtin",
        "SelectType=select/linear", "MpiDefault=none", "ReturnToService=2",
        "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
        # 8 CPUs declared on a smaller machine: tasks are oversubscribed, as with mpirun
        "SlurmdParameters=config_overrides",
        f"NodeName={host} CPUs=8 State=UNKNOWN",
        f"PartitionName=gxt Nodes={host} Default=YES MaxTime=INFINITE State=UP",
    ]) + "\n")
    env = clean_env({"SLURM_CONF": conf})
    stepds = _stepd_pids()
    try:
        for cmd in (["munged", "-F", "-f", f"--key-file={key}", f"--socket={root}/munge.sock",
                     f"--pid-file={root}/munged.pid", f"--log-file={root}/munged.log",
                     f"--seed-file={root}/munged.seed"],
                    ["slurmctld", "-D", "-f", str(conf)], ["slurmd", "-D", "-f", str(conf)]):
            cluster.procs.append(subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL,
                                                  stdout=subprocess.DEVNULL,
                                                  stderr=subprocess.DEVNULL,
                                                  start_new_session=True))
            time.sleep(0.3)
        end = time.monotonic() + 60
        state = ""
        while time.monotonic() < end:
            dead = [p.args[0] for p in cluster.procs if p.poll() is not None]
            if dead:
                pytest.fail(f"{dead} exited while Slurm started\n{cluster.logs()}")
            try:
                state = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True,
                                       text=True, timeout=10).stdout.strip()
            except subprocess.TimeoutExpired:
                state = "(sinfo timed out)"
            if state == "idle":
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"the Slurm node is not idle after 60 s (sinfo: {state!r})\n"
                        f"{cluster.logs()}")
        cluster.env = env
        yield cluster
    finally:
        subprocess.run(["scancel", "--full", "--partition=gxt"], env=env, capture_output=True,
                       timeout=20, stdin=subprocess.DEVNULL)
        for proc in reversed(cluster.procs):
            _stop(proc)
        for pid in _stepd_pids() - stepds:  # step daemons of this cluster's jobs
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mpi, kind", [("none", "slurm"), ("pmix", "pmix")])
def test_srun(tmp_path, slurm, mpi, kind):
    """srun -n 4 on the one-node cluster: Slurm's environment (the slurm plug-in), or
    with --mpi=pmix Slurm's PMIx server (the pmix plug-in)."""
    if kind == "pmix":
        need_plugin("pmix")
    script = mp_util.write_worker(tmp_path, PROGRAM, prelude=False)
    res = mp_util.run_command(["srun", f"--mpi={mpi}", "-n", "4", "--time=2",
                               sys.executable, script], timeout=100, env=slurm.env,
                              cwd=str(tmp_path))
    if res.returncode != 0:
        print(slurm.logs())
    reports = check_job(tmp_path, res, 4, kind)
    assert ("SLURM_STEP_ID" if kind == "slurm" else "PMIX_NAMESPACE") in reports[0]["reason"]


DEATH = r'''
import json, os, threading
import gexmk

c = gexmk.init()
b = c.bootstrap
heard = threading.Event()
b.on_peer_death(lambda r: r == 3 and heard.set())
b.barrier()
if c.rank == 3:
    os._exit(7)                      # dies without a word to anyone
assert heard.wait(30), "rank 3's death was not reported"
assert 3 in b.dead_ranks(), b.dead_ranks()
try:
    c.tm.barrier(timeout=30)
except gexmk.PeerDeadError as e:
    assert e.rank == 3, e
else:
    raise AssertionError("a barrier with a dead member did not raise PeerDeadError")
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), f"ok.{c.rank}"), "w") as f:
    json.dump({"kind": b.kind}, f)
c.finalize()                         # skips its barrier: a peer died
'''


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mpi, kind", [("none", "slurm"), ("pmix", "pmix")])
def test_srun_task_death_is_reported(tmp_path, slurm, mpi, kind):
    """A task of an srun step dies (Slurm leaves the others running): the others hear of
    it (on_peer_death, dead_ranks) and a team barrier raises PeerDeadError naming it."""
    if kind == "pmix":
        need_plugin("pmix")
    script = mp_util.write_worker(tmp_path, DEATH, prelude=False)
    res = mp_util.run_command(["srun", f"--mpi={mpi}", "-n", "4", "--time=2", "--kill-on-bad-exit=0",
                               sys.executable, script], timeout=100, env=slurm.env,
                              cwd=str(tmp_path))
    assert not res.timed_out, res.report()
    assert res.returncode != 0, res.report()           # task 3 failed, and srun says so
    for r in range(3):
        path = tmp_path / f"ok.{r}"
        assert path.exists(), f"rank {r} did not finish\n{res.report()}"
        assert json.loads(path.read_text())["kind"] == kind
    assert not (tmp_path / "ok.3").exists()


LATE = r'''
import os, sys, time
rank = int(os.environ.get("SLURM_PROCID", os.environ.get("OMPI_COMM_WORLD_RANK", "-1")))
if rank == 3:
    time.sleep(float(os.environ["GEXMK_TIMEOUT"]) + 8)   # never reaches the bootstrap in time
    sys.exit(0)
t = time.monotonic()
from gexmk import bootstrap as B, errors as E
try:
    B.from_environment()
except E.BootstrapError as e:
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), f"err.{rank}"), "w") as f:
        f.write(f"{time.monotonic() - t:.2f} {e}")
'''


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mpi, words", [("none", "ranks that never reached the rendezvous: 3"),
                                        ("pmix", "PMIx_Fence failed")])
def test_srun_rank_never_arrives(tmp_path, slurm, mpi, words):
    """Task 3 of a step never reaches the bootstrap: the others raise BootstrapError
    after GEXMK_TIMEOUT (the rendezvous's wait for every rank, or PMIx's fence)."""
    if mpi == "pmix":
        need_plugin("pmix")
    script = mp_util.write_worker(tmp_path, LATE, prelude=False)
    env = dict(slurm.env, GEXMK_TIMEOUT="5")
    res = mp_util.run_command(["srun", f"--mpi={mpi}", "-n", "4", "--time=2", sys.executable,
                               script], timeout=100, env=env, cwd=str(tmp_path))
    assert not res.timed_out, res.report()
    for r in range(3):
        path = tmp_path / f"err.{r}"
        assert path.exists(), f"rank {r} did not raise BootstrapError\n{res.report()}"
        took, text = path.read_text().split(" ", 1)
        assert 4.5 < float(took) < 5 + 10 and words in text, (r, took, text)


# -- across two network namespaces ----------------------------------------------------------

def need_tcp_provider():
    try:
        from gexmk.transports import ofi as ofi_transport
        ofi_transport.Domain("tcp;ofi_rxm").close()
    except Exception as exc:
        pytest.skip(f"no ofi transport over tcp;ofi_rxm here: {exc}")


@pytest.fixture
def two_nodes():
    with netns_util.two_nodes() as nodes:
        yield nodes


def _start_all(cmds, env_of, tmp_path, timeout):
    """Start every command (each its own session), wait for all; the first failure,
    or the deadline, kills the rest.  Returns a JobResult-like summary."""
    procs = [subprocess.Popen(cmd, env=env_of(i), cwd=str(tmp_path), stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True) for i, cmd in enumerate(cmds)]
    end = time.monotonic() + timeout
    failed = timed_out = False
    try:
        while any(p.poll() is None for p in procs):
            if any(p.poll() not in (None, 0) for p in procs):
                failed = True
                break
            if time.monotonic() > end:
                timed_out = True
                break
            time.sleep(0.1)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        outs = [p.communicate(timeout=20)[0] for p in procs]
    rc = max((p.returncode or 0) for p in procs) if not failed else 1
    return mp_util.JobResult(rc, "\n".join(f"[{i}] {o}" for i, o in enumerate(outs)), "",
                             0.0, timed_out, "", procs[0].pid)


@pytest.mark.timeout(150)
def test_slurm_environment_across_two_namespaces(tmp_path, two_nodes):
    """Four tasks as srun starts them for a two-node step (two per node, each node a
    network namespace): rank 0 serves the rendezvous on the step's first node,
    the others find it from Slurm's variables alone, and the ring crosses the
    veth pair over ofi."""
    need_tcp_provider()
    nodes = two_nodes
    script = mp_util.write_worker(tmp_path, PROGRAM, prelude=False)
    port = _free_ports(1)[0]

    def env_of(rank):
        return clean_env({
            "SLURM_JOB_ID": os.getpid(), "SLURM_STEP_ID": 0, "SLURM_PROCID": rank,
            "SLURM_LOCALID": rank % 2, "SLURM_NODEID": rank // 2, "SLURM_STEP_NUM_TASKS": 4,
            "SLURM_NTASKS": 4, "SLURM_STEP_NODELIST": f"{nodes.addr[0]},{nodes.addr[1]}",
            "SLURM_STEP_RESV_PORTS": f"{port}-{port + 1}",
            "GEXMK_OFI_PROVIDER": "tcp;ofi_rxm", "GEXMK_TIMEOUT": 90})

    cmds = [[*nodes.exec_prefix(r // 2), sys.executable, script] for r in range(4)]
    res = _start_all(cmds, env_of, tmp_path, 130)
    reports = check_job(tmp_path, res, 4, "slurm", nodes=2)
    assert reports[0]["transports"][2].startswith("ofi"), reports[0]


@pytest.mark.timeout(240)
def test_torchrun_two_nodes_across_namespaces(tmp_path, two_nodes):
    """Two torchrun agents, one per namespace, two workers each, meeting at a c10d
    rendezvous on node 0: the job's store carries rank 0's address to node 1."""
    cmd = torchrun_cmd()
    need_tcp_provider()
    nodes = two_nodes
    script = mp_util.write_worker(tmp_path, PROGRAM, prelude=False)
    port = _free_ports(1)[0]
    cmds = [[*nodes.exec_prefix(i), *cmd, "--nnodes", "2", "--node-rank", str(i),
             "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-id", f"gx{os.getpid()}",
             "--rdzv-endpoint", f"{nodes.addr[0]}:{port}", "--local-addr", nodes.addr[i],
             # node 0 hosts the store: torch cannot tell from its host name, which
             # resolves to neither namespace's address
             "--rdzv-conf", f"is_host={'true' if i == 0 else 'false'}",
             script] for i in (0, 1)]
    # TMPDIR: torchrun's agents leave torchelastic_* folders in the temporary directory
    res = _start_all(cmds, lambda i: clean_env({"GEXMK_OFI_PROVIDER": "tcp;ofi_rxm",
                                                "OMP_NUM_THREADS": 1, "GEXMK_TIMEOUT": 120,
                                                "TMPDIR": tmp_path}),
                     tmp_path, 220)
    reports = check_job(tmp_path, res, 4, "torchrun", nodes=2)
    assert reports[0]["transports"][2].startswith("ofi"), reports[0]
