"""Which bootstrap plug-in an environment selects, and what a broken launcher
environment raises (issue 23).

The choice is a table (:data:`CHOICES`): environment → plug-in, checked through
:func:`gexmk.bootstrap.explain` without starting anything.  Bad input — a rank
beyond the size, a missing variable, a PMIx server that is gone, a store or a
rank 0 that never answers — must raise :class:`~gexmk.errors.BootstrapError`
naming the variable or the service, within GEXMK_TIMEOUT, never hang nor fall
back to a job of one process.  Attempts that could block run in a child
process with a deadline.
"""
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

try:
    from . import mp_util
except ImportError:
    import mp_util

from gexmk import bootstrap as B
from gexmk.bootstrap import registry
from gexmk.errors import BootstrapError

_PREFIXES = ("SLURM_", "PMIX_", "PMI_", "OMPI_", "TORCHELASTIC_", "GEXMK_BOOTSTRAP", "HYDI_",
             "MPI_LOCALNRANKS", "MPICH_")
_TORCH = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def bare_env(monkeypatch):
    """No launcher's variable in os.environ; GEXMK_TIMEOUT 3 s."""
    for k in list(os.environ):
        if k.startswith(_PREFIXES) or k in _TORCH or k in ("GEXMK_RANK", "GEXMK_SIZE"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("GEXMK_TIMEOUT", "3")
    return monkeypatch


SLURM_STEP = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1",
              "SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1",
              "SLURM_STEP_NODELIST": "localhost"}
TORCHRUN = {"TORCHELASTIC_RUN_ID": "r1", "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
            "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
PMIX = {"PMIX_RANK": "0", "PMIX_NAMESPACE": "ns", "OMPI_COMM_WORLD_SIZE": "2"}

# environment -> (plug-in, a word its reason must contain); "pmix" and "torchrun"
# entries hold where those plug-ins are available (see test_choice)
CHOICES = [
    ({}, "single", "no launcher"),
    ({"GEXMK_BOOTSTRAP": "@x"}, "launcher", "GEXMK_BOOTSTRAP"),
    ({"GEXMK_BOOTSTRAP": "@x", **SLURM_STEP}, "launcher", "GEXMK_BOOTSTRAP"),
    (SLURM_STEP, "slurm", "SLURM_STEP_ID"),
    # a batch script: a job id and a rank, but no step of its own
    ({"SLURM_JOB_ID": "77", "SLURM_NTASKS": "4", "SLURM_PROCID": "0"}, "single", "no launcher"),
    (PMIX, "pmix", "PMIX_NAMESPACE"),
    ({**SLURM_STEP, **PMIX}, "pmix", "PMIX_NAMESPACE"),          # srun --mpi=pmix
    (TORCHRUN, "torchrun", "TORCHELASTIC_RUN_ID"),
    ({**TORCHRUN, **SLURM_STEP}, "torchrun", "TORCHELASTIC_RUN_ID"),  # srun torchrun
    ({k: TORCHRUN[k] for k in _TORCH}, "torchrun", "MASTER_ADDR"),
    ({"RANK": "3"}, "single", "no launcher"),                     # RANK alone says nothing
    ({"GEXMK_BOOTSTRAP_KIND": "single", **SLURM_STEP}, "single", "GEXMK_BOOTSTRAP_KIND"),
    ({"GEXMK_BOOTSTRAP_KIND": "slurm"}, "slurm", "GEXMK_BOOTSTRAP_KIND"),
]


@pytest.mark.parametrize("env, name, word", CHOICES)
def test_choice(bare_env, env, name, word):
    for k, v in env.items():
        bare_env.setenv(k, v)
    if name in ("pmix", "torchrun") and registry._available(name):
        pytest.skip(registry._available(name))
    choice = B.explain()
    assert (choice["name"], word in choice["reason"]) == (name, True), choice


def test_unknown_kind_is_named(bare_env):
    bare_env.setenv("GEXMK_BOOTSTRAP_KIND", "ssh")
    assert B.explain()["name"] is None
    with pytest.raises(BootstrapError, match="GEXMK_BOOTSTRAP_KIND='ssh'"):
        B.from_environment()


def test_mpi_comm_argument_wins(bare_env):
    assert B.explain(comm=object())["name"] == "mpi"


def test_info_reports_the_choice(bare_env):
    """python -m gexmk.info says which plug-in and why, in text and JSON."""
    env = mp_util.child_env({**SLURM_STEP})
    for k in list(env):
        if k.startswith(("PMIX_", "TORCHELASTIC_")) or k in _TORCH:
            del env[k]
    env.update(SLURM_STEP)
    out = subprocess.run([sys.executable, "-m", "gexmk.info"], env=env, capture_output=True,
                         text=True, timeout=120, cwd="/").stdout
    assert "would use: slurm: srun's environment (SLURM_PROCID=1, SLURM_STEP_ID=0" in out, out
    assert "plug-ins here: launcher (yes)" in out, out


# -- bad input ---------------------------------------------------------------------------------

BAD = [
    # (environment, pattern the BootstrapError must match)
    ({**SLURM_STEP, "SLURM_PROCID": "2"}, r"SLURM_PROCID=2 is outside 0\.\.SLURM_STEP_NUM_TASKS"),
    ({**SLURM_STEP, "SLURM_PROCID": "one"}, r"SLURM_PROCID is 'one', not an integer"),
    ({**{k: v for k, v in SLURM_STEP.items() if k not in ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")}},
     r"SLURM_NTASKS is not set"),
    ({**{k: v for k, v in SLURM_STEP.items() if k != "SLURM_STEP_NODELIST"}},
     r"neither SLURM_STEP_NODELIST nor SLURM_NODELIST"),
    ({**SLURM_STEP, "SLURM_STEP_NODELIST": "n[01-"}, r"first host of the Slurm node list"),
    ({**SLURM_STEP, "SLURM_STEP_RESV_PORTS": "none"}, r"SLURM_STEP_RESV_PORTS='none'"),
    ({**SLURM_STEP, "GEXMK_SLURM_PORT": "70000"}, r"GEXMK_SLURM_PORT='70000'"),
    ({**SLURM_STEP, "SLURM_STEP_NUM_TASKS": "0", "SLURM_PROCID": "0"},
     r"SLURM_STEP_NUM_TASKS=0: a job needs at least one rank"),
    ({**SLURM_STEP, "SLURM_PROCID": "0", "SLURMD_NODENAME": "elsewhere"},
     r"Slurm placed rank 0 on elsewhere, not on the step's first node localhost"),
    ({**TORCHRUN, "RANK": "2"}, r"RANK=2 is outside 0\.\.WORLD_SIZE-1"),
    ({**TORCHRUN, "LOCAL_RANK": "2"}, r"LOCAL_RANK=2 is outside 0\.\.LOCAL_WORLD_SIZE-1"),
    ({**{k: v for k, v in TORCHRUN.items() if k != "MASTER_PORT"}},
     r"TORCHELASTIC_RUN_ID is set\), but MASTER_PORT is not set"),
    ({**TORCHRUN, "WORLD_SIZE": "two"}, r"WORLD_SIZE is 'two', not an integer"),
]


@pytest.mark.parametrize("nodelist, first", [
    ("n[07-09,12],gpu1", "n07"), ("a,b", "a"), ("node[001-004]", "node001"),
    ("rack[1-2]-n[3-4],x", "rack1-n3"), ("10.0.0.1,10.0.0.2", "10.0.0.1"), ("solo", "solo"),
])
def test_first_host_of_a_slurm_node_list(nodelist, first):
    from gexmk.bootstrap import slurm
    assert slurm.first_host(nodelist) == first


@pytest.mark.parametrize("env, pattern", BAD)
def test_bad_environment_names_the_variable(bare_env, env, pattern):
    for k, v in env.items():
        bare_env.setenv(k, v)
    t0 = time.monotonic()
    with pytest.raises(BootstrapError, match=pattern):
        B.from_environment()
    assert time.monotonic() - t0 < 2, "a check of the environment must not wait"


@pytest.mark.parametrize("size, raises", [("4", True), ("1", False)])
def test_mpi_launcher_without_mpi4py(bare_env, size, raises):
    """Hydra's environment and mpi4py blocked: a job of several raises, naming PMI_SIZE,
    rather than running as that many jobs of one; a job of one warns and runs."""
    bare_env.setenv("PMI_RANK", "0")
    bare_env.setenv("PMI_SIZE", size)
    bare_env.setitem(sys.modules, "mpi4py", None)
    assert B.explain()["name"] == "single"
    if raises:
        with pytest.raises(BootstrapError, match=r"PMI_SIZE=4: an MPI launcher .* mpi4py is not "
                                                 r"importable"):
            B.from_environment()
    else:
        with pytest.warns(RuntimeWarning, match="mpi4py is not importable"):
            boot = B.from_environment()
        assert (boot.kind, boot.size) == ("single", 1)
        boot.close()


def test_torchrun_without_torch_names_it(bare_env):
    """torch blocked: the store cannot be reached, said so; not a job of one."""
    for k, v in TORCHRUN.items():
        bare_env.setenv(k, v)
    bare_env.setitem(sys.modules, "torch", None)
    choice = B.explain()
    assert choice["name"] is None and "torch is not importable" in choice["reason"], choice
    with pytest.raises(BootstrapError, match="torch is not importable"):
        B.from_environment()


def _child(source, env, timeout):
    """Run ``source`` in a child with ``env`` (plus PYTHONPATH etc.) and a deadline;
    returns (returncode, stderr, seconds)."""
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(source)], env=env,
                          capture_output=True, text=True, timeout=timeout, cwd="/",
                          stdin=subprocess.DEVNULL)
    return proc.returncode, proc.stderr, time.monotonic() - t0


def _launcher_free_env(extra):
    env = mp_util.child_env()
    for k in list(env):
        if k.startswith(_PREFIXES) or k in _TORCH:
            del env[k]
    env.update({k: str(v) for k, v in extra.items()})
    return env


EXPECT_BOOTSTRAP_ERROR = r'''
import sys
from gexmk import bootstrap as B, errors as E
try:
    B.from_environment()
except E.BootstrapError as e:
    sys.stderr.write(f"BootstrapError: {e}\n")
    sys.exit(3)
sys.exit(0)
'''


@pytest.mark.timeout(60)
def test_slurm_rank_0_never_comes(bare_env):
    """Rank 1 of a step whose rank 0 never listens: BootstrapError after GEXMK_TIMEOUT,
    naming the node list and where the port came from."""
    with socket.socket() as s:           # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = _launcher_free_env({**SLURM_STEP, "GEXMK_SLURM_PORT": port, "GEXMK_TIMEOUT": 3})
    rc, err, took = _child(EXPECT_BOOTSTRAP_ERROR, env, 40)
    assert rc == 3, err
    assert "SLURM_STEP_NODELIST=localhost" in err and f"GEXMK_SLURM_PORT={port}" in err, err
    assert 2.5 < took < 3 + 15, took


@pytest.mark.timeout(60)
def test_slurm_port_taken_by_another_job(bare_env):
    """Rank 0 whose derived port is held by someone else: BootstrapError naming the
    port and GEXMK_SLURM_PORT."""
    with socket.socket() as s:
        s.bind(("", 0))
        s.listen(1)
        port = s.getsockname()[1]
        env = _launcher_free_env({**SLURM_STEP, "SLURM_PROCID": 0, "GEXMK_SLURM_PORT": port})
        rc, err, _ = _child(EXPECT_BOOTSTRAP_ERROR, env, 40)
    assert rc == 3, err
    assert f"port {port}" in err and "set GEXMK_SLURM_PORT to a free port" in err, err


class _Silent:
    """A TCP listener that accepts and never answers (a hung store)."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.conns = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            while True:
                self.conns.append(self.sock.accept()[0])
        except OSError:
            pass

    def close(self):
        self.sock.close()
        for c in self.conns:
            c.close()


# The interpreter's shutdown made slow (a module global whose __del__ sleeps), and the
# torch threads still alive at the error printed: a torch call abandoned in a thread
# that throws during shutdown aborts the process (CI saw rc -6, "terminate called").
EXPECT_BOOTSTRAP_ERROR_SLOW_EXIT = r'''
import sys, threading, time
from gexmk import bootstrap as B, errors as E

class SlowExit:
    def __del__(self, sleep=time.sleep):
        sleep(4.0)

slow_exit = SlowExit()
try:
    B.from_environment()
except E.BootstrapError as e:
    alive = [t.name for t in threading.enumerate() if t.name.startswith("gexmk-torch")]
    sys.stderr.write(f"BootstrapError: {e}\nstore threads alive: {alive}\n")
    sys.exit(3)
sys.exit(0)
'''


@pytest.mark.timeout(90)
@pytest.mark.parametrize("store", ["silent", "absent"])
def test_torchrun_store_never_answers(bare_env, store):
    """A worker whose store accepts and never answers, or is not there: BootstrapError
    naming MASTER_ADDR:MASTER_PORT within GEXMK_TIMEOUT (torch's own connect retries
    included), no torch call left running, and an exit with the error's own status
    even when the interpreter's shutdown is slow."""
    if registry._available("torchrun"):
        pytest.skip(registry._available("torchrun"))
    if store == "silent":
        silent = _Silent()
        port, close = silent.port, silent.close
    else:   # bound, not listening: refused, and no other process can take the port meanwhile
        held = socket.socket()
        held.bind(("127.0.0.1", 0))
        port, close = held.getsockname()[1], held.close
    try:
        env = _launcher_free_env({**TORCHRUN, "MASTER_PORT": port, "GEXMK_TIMEOUT": 4})
        rc, err, took = _child(EXPECT_BOOTSTRAP_ERROR_SLOW_EXIT, env, 80)
    finally:
        close()
    assert rc == 3, err
    assert f"MASTER_ADDR:MASTER_PORT (127.0.0.1:{port})" in err, err
    assert "store threads alive: []" in err, err
    assert took < 4 + 4 + 25, took


@pytest.mark.timeout(60)
def test_torchrun_rank_0_never_publishes(bare_env):
    """The store answers but rank 0 never writes gexmk's key: BootstrapError naming
    the store and the key, after GEXMK_TIMEOUT."""
    if registry._available("torchrun"):
        pytest.skip(registry._available("torchrun"))
    source = r'''
    import datetime, subprocess, sys, os
    from torch.distributed import TCPStore
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                     timeout=datetime.timedelta(seconds=30))
    env = dict(os.environ, MASTER_PORT=str(store.port))
    child = subprocess.run([sys.executable, "-c", sys.argv[1]], env=env, timeout=40)
    sys.exit(child.returncode)
    '''
    env = _launcher_free_env({**{k: v for k, v in TORCHRUN.items() if k != "MASTER_PORT"},
                              "GEXMK_TIMEOUT": 3})
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(source),
                           EXPECT_BOOTSTRAP_ERROR], env=env, capture_output=True, text=True,
                          timeout=50, cwd="/", stdin=subprocess.DEVNULL)
    assert proc.returncode == 3, proc.stderr
    assert "did not publish gexmk's rendezvous" in proc.stderr, proc.stderr
    assert "gexmk/r1/0/rendezvous" in proc.stderr, proc.stderr
    assert time.monotonic() - t0 < 45


@pytest.mark.timeout(60)
def test_pmix_server_gone(bare_env):
    """The environment of an Open MPI job whose mpirun has exited: BootstrapError
    naming PMIx_Init and the server, at once."""
    if registry._available("pmix"):
        pytest.skip(registry._available("pmix"))
    try:
        from test_launchers import openmpi_mpirun
    except ImportError:
        from .test_launchers import openmpi_mpirun
    mpirun = openmpi_mpirun()
    if mpirun is None:
        pytest.skip("Open MPI's mpirun is not installed (apt install openmpi-bin)")
    extra = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    out = subprocess.run([mpirun, *extra, "-n", "1", "env"], capture_output=True, text=True,
                         timeout=40, env=_launcher_free_env({}), stdin=subprocess.DEVNULL).stdout
    job = dict(line.split("=", 1) for line in out.splitlines()
               if line.startswith(("PMIX_", "OMPI_")) and "=" in line)
    assert "PMIX_SERVER_URI41" in job or "PMIX_SERVER_URI4" in job, out
    rc, err, took = _child(EXPECT_BOOTSTRAP_ERROR, _launcher_free_env({**job, "GEXMK_TIMEOUT": 5}),
                           40)
    assert rc == 3, err
    assert "PMIx_Init failed" in err and "PMIX_SERVER_URI" in err, err
    assert took < 5 + 10, took
