"""The local launcher, ``python -m gexmk.run`` (gexmk.run).

Rank programs here are plain Python scripts written to ``tmp_path``; every
rank's command line names ``tmp_path``, which is how the tests find processes
left behind.
"""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

try:
    from . import mp_util
except ImportError:
    import mp_util

from gexmk import run as R
from gexmk.errors import ArgumentError


@pytest.fixture(autouse=True)
def nothing_left(tmp_path):
    """Fail a test that leaves one of its processes (command line naming tmp_path) alive."""
    yield
    marker = str(tmp_path)
    end = time.monotonic() + 5
    while mp_util.processes_running(marker) and time.monotonic() < end:
        time.sleep(0.05)
    left = mp_util.processes_running(marker)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    assert not left, f"processes left running: {left}"


def script(tmp_path, source, name="prog.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return str(path)


def env(**extra):
    return mp_util.child_env({"GEXMK_BOOTSTRAP": None, **extra})


# The launcher runs in tmp_path so that the source tree (cwd) is never first on its path.

def launcher(tmp_path, *args, timeout=40):
    """Run ``python -m gexmk.run args...`` to completion; a JobResult."""
    cmd = [sys.executable, "-m", "gexmk.run", *map(str, args)]
    return mp_util.run_command(cmd, timeout=timeout, env=env(), cwd=str(tmp_path))


def start_launcher(tmp_path, *args):
    """Start ``python -m gexmk.run args...`` in its own session; a Popen."""
    cmd = [sys.executable, "-m", "gexmk.run", *map(str, args)]
    return subprocess.Popen(cmd, env=env(), cwd=str(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                            start_new_session=True)


def wait_for_files(paths, timeout=20):
    end = time.monotonic() + timeout
    while not all(os.path.exists(p) for p in paths):
        assert time.monotonic() < end, f"ranks did not start: {paths}"
        time.sleep(0.02)


# Each rank writes tmp/ready.<rank> and then sleeps; argv[1] selects extra behaviour.
SLEEPER = r'''
import os, signal, sys, time
rank = int(os.environ["GEXMK_RANK"])
tmp = os.path.dirname(os.path.abspath(__file__))
if "ignore-term" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if "ignore-int" in sys.argv:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
open(os.path.join(tmp, f"ready.{rank}"), "w").close()
time.sleep(60)
'''


@pytest.mark.timeout(60)
def test_ranks_get_environment_and_arguments(tmp_path):
    prog = script(tmp_path, r'''
    import json, os, sys
    row = {k: os.environ.get(k) for k in ("GEXMK_RANK", "GEXMK_SIZE", "GEXMK_BOOTSTRAP", "GEXMK_JOBID")}
    row.update(argv=sys.argv[1:], ppid=os.getppid())
    os.write(1, (json.dumps(row) + "\n").encode())  # one write: ranks' lines do not mix
    ''')
    result = launcher(tmp_path, "-n", 3, prog, "a b", "--flag", "-n", "5").check(0)
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert sorted(r["GEXMK_RANK"] for r in rows) == ["0", "1", "2"], result.report()
    assert {r["GEXMK_SIZE"] for r in rows} == {"3"}
    assert len({r["GEXMK_JOBID"] for r in rows}) == 1
    (address,) = {r["GEXMK_BOOTSTRAP"] for r in rows}
    assert address.startswith("@")
    assert all(r["argv"] == ["a b", "--flag", "-n", "5"] for r in rows)
    assert {r["ppid"] for r in rows} == {result.pid}      # ranks are the launcher's children
    # the abstract socket is gone with the launcher, and nothing was left on disk
    with open("/proc/net/unix") as f:
        assert "@" + address[1:] not in f.read()
    assert sorted(os.listdir(tmp_path)) == ["prog.py"]


@pytest.mark.timeout(60)
def test_module_form(tmp_path):
    (tmp_path / "gexmk_test_mod.py").write_text(
        "import os, sys\nos.write(1, f\"mod {os.environ['GEXMK_RANK']} {sys.argv[1:]}\\n\".encode())\n")
    # tmp_path is both the module's directory and, as an argument, the process marker
    result = mp_util.run_command(
        [sys.executable, "-m", "gexmk.run", "-n", "2", "-m", "gexmk_test_mod", "x", str(tmp_path)],
        timeout=40, env=env(PYTHONPATH=os.pathsep.join(
            p for p in [str(tmp_path), env().get("PYTHONPATH", "")] if p)),
        cwd=str(tmp_path)).check(0)
    lines = sorted(line for line in result.stdout.splitlines() if line.startswith("mod"))
    assert lines == [f"mod {r} ['x', '{tmp_path}']" for r in range(2)], result.report()


@pytest.mark.timeout(60)
def test_exit_code_of_failing_rank(tmp_path):
    prog = script(tmp_path, r'''
    import os, sys
    sys.exit(7 if os.environ["GEXMK_RANK"] == "1" else 0)
    ''')
    result = launcher(tmp_path, "-n", 3, prog).check(7)
    assert "[gexmk.run] rank 1 exited with code 7" in result.stderr
    assert "rank 0" not in result.stderr and "rank 2" not in result.stderr


@pytest.mark.timeout(60)
def test_signal_death_exit_code(tmp_path):
    prog = script(tmp_path, r'''
    import os, signal
    if os.environ["GEXMK_RANK"] == "0":
        os.kill(os.getpid(), signal.SIGKILL)
    ''')
    result = launcher(tmp_path, "-n", 2, prog).check(128 + signal.SIGKILL)
    assert f"rank 0 was killed by SIGKILL (exit status {128 + signal.SIGKILL})" in result.stderr


# Rank 1 is killed; rank 0 exits 3 the moment the rendezvous tells it so.  The launcher
# used to find both gone in one sweep and blame rank 0, the lower rank.
KILLED_AND_FOLLOWER = r'''
import os, signal, time
from gexmk import bootstrap as B
bs = B.from_environment()
bs.on_peer_death(lambda rank: os._exit(3))
bs.barrier()
if bs.rank == 1:
    time.sleep(0.2)
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(30)
'''


@pytest.mark.timeout(120)
@pytest.mark.parametrize("keep_going", [False, True], ids=["stop", "keep-going"])
def test_the_first_failure_in_time_is_blamed(tmp_path, keep_going):
    prog = script(tmp_path, KILLED_AND_FOLLOWER)
    for _ in range(3):
        result = launcher(tmp_path, "-n", 2, *(["--keep-going"] if keep_going else []), prog)
        result.check(128 + signal.SIGKILL)
        reports = [line for line in result.stderr.splitlines() if line.startswith("[gexmk.run]")]
        assert reports and reports[0] == (f"[gexmk.run] rank 1 was killed by SIGKILL (exit status "
                                          f"{128 + signal.SIGKILL})"), result.report()
        if keep_going:   # rank 0 failed on its own, after rank 1: reported second
            assert reports[1:] == ["[gexmk.run] rank 0 exited with code 3"], result.report()


@pytest.mark.timeout(60)
@pytest.mark.skipif(sys.version_info < (3, 11), reason="python -P needs Python 3.11")
def test_a_local_gexmk_folder_does_not_shadow_the_installed_package(tmp_path):
    # A source checkout: the script's directory and the working directory hold gexmk/.
    (tmp_path / "gexmk").mkdir()
    (tmp_path / "gexmk" / "__init__.py").write_text(
        "raise ImportError('the local gexmk/ folder shadowed the installed package')\n")
    (tmp_path / "mods").mkdir()
    prog = r'''
    import os, sys
    import gexmk.bootstrap
    here = os.path.dirname(os.path.abspath(gexmk.bootstrap.__file__))
    os.write(1, f"{os.environ['GEXMK_RANK']} {here}\n".encode())
    '''
    script(tmp_path, prog)
    script(tmp_path / "mods", prog, name="shadow_probe.py")
    pythonpath = os.pathsep.join(p for p in [str(tmp_path / "mods"), env().get("PYTHONPATH", "")]
                                 if p)
    for args in (["prog.py"], ["-m", "shadow_probe", str(tmp_path)]):
        # the launcher itself runs with -P too, as ./dev does
        cmd = [sys.executable, "-P", "-m", "gexmk.run", "-n", "2", *args]
        result = mp_util.run_command(cmd, timeout=40, env=env(PYTHONPATH=pythonpath),
                                     cwd=str(tmp_path)).check(0)
        rows = sorted(line.split(" ", 1) for line in result.stdout.splitlines())
        assert [r for r, _ in rows] == ["0", "1"], result.report()
        assert all(not here.startswith(str(tmp_path)) for _, here in rows), result.report()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stubborn", [False, True], ids=["plain", "ignores-sigterm"])
def test_failure_kills_the_other_ranks(tmp_path, stubborn):
    prog = script(tmp_path, SLEEPER.replace(
        "open(os.path.join", "if rank == 0:\n    while not all(os.path.exists(os.path.join(tmp, "
        "f'ready.{r}')) for r in (1, 2)): time.sleep(0.01)\n    sys.exit(3)\nopen(os.path.join"))
    t0 = time.monotonic()
    result = launcher(tmp_path, "-n", 3, prog, *(["ignore-term"] if stubborn else [])).check(3)
    assert time.monotonic() - t0 < R.GRACE + 8
    assert "rank 0 exited with code 3" in result.stderr
    assert "rank 1" not in result.stderr      # ranks the launcher killed are not reported
    assert mp_util.processes_running(prog) == []


@pytest.mark.timeout(60)
def test_keep_going_lets_the_others_finish(tmp_path):
    prog = script(tmp_path, r'''
    import os, sys, time
    rank = os.environ["GEXMK_RANK"]
    if rank == "1":
        sys.exit(5)
    time.sleep(1)
    open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "done." + rank), "w").close()
    ''')
    result = launcher(tmp_path, "-n", 3, "--keep-going", prog).check(5)
    assert "rank 1 exited with code 5" in result.stderr
    assert (tmp_path / "done.0").exists() and (tmp_path / "done.2").exists()


@pytest.mark.timeout(60)
def test_timeout_kills_everything_with_124(tmp_path):
    prog = script(tmp_path, SLEEPER)
    t0 = time.monotonic()
    result = launcher(tmp_path, "-n", 2, "--timeout", 1, prog, "ignore-term").check(R.TIMEOUT_EXIT)
    assert time.monotonic() - t0 < 1 + R.GRACE + 8
    assert "timeout" in result.stderr and "--timeout 1 s" in result.stderr
    assert "exited with code" not in result.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_signals_are_forwarded(tmp_path, sig):
    prog = script(tmp_path, SLEEPER)
    proc = start_launcher(tmp_path, "-n", 2, prog)
    try:
        wait_for_files([tmp_path / f"ready.{r}" for r in range(2)])
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 128 + sig, err   # the ranks died of the forwarded signal
    assert mp_util.processes_running(prog) == []


@pytest.mark.timeout(60)
def test_second_signal_kills_ranks_that_ignore_the_first(tmp_path):
    prog = script(tmp_path, SLEEPER)
    proc = start_launcher(tmp_path, "-n", 2, prog, "ignore-int")
    try:
        wait_for_files([tmp_path / f"ready.{r}" for r in range(2)])
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        assert proc.poll() is None           # the ranks ignored it; the launcher waits
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 128 + signal.SIGKILL, err
    assert "killing all ranks" in err


@pytest.mark.timeout(60)
def test_killed_launcher_takes_its_ranks_along(tmp_path):
    prog = script(tmp_path, SLEEPER)
    proc = start_launcher(tmp_path, "-n", 2, prog)
    try:
        wait_for_files([tmp_path / f"ready.{r}" for r in range(2)])
        proc.kill()                          # no clean-up code can run in the launcher
        proc.communicate(timeout=20)
    finally:
        proc.kill()
        proc.wait()
    end = time.monotonic() + 5
    while mp_util.processes_running(prog) and time.monotonic() < end:
        time.sleep(0.05)
    assert mp_util.processes_running(prog) == []


@pytest.mark.timeout(60)
def test_children_of_ranks_are_cleaned_up(tmp_path):
    prog = script(tmp_path, r'''
    import os, subprocess, sys, time
    if os.environ["GEXMK_RANK"] == "0":
        # a grandchild that would outlive its rank
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", __file__])
        time.sleep(0.3)
        sys.exit(4)
    time.sleep(60)
    ''')
    t0 = time.monotonic()
    launcher(tmp_path, "-n", 2, prog).check(4)
    assert time.monotonic() - t0 < R.GRACE + 8


@pytest.mark.timeout(60)
def test_launch_function(tmp_path):
    ok = script(tmp_path, r'''
    import os, sys
    sys.exit(int(sys.argv[1]) if os.environ["GEXMK_RANK"] == "1" else 0)
    ''')
    before = signal.getsignal(signal.SIGTERM)
    assert R.launch(2, [ok, "0"], env=env()) == 0
    assert R.launch(2, [ok, "9"], keep_going=True, env=env()) == 9
    assert signal.getsignal(signal.SIGTERM) is before   # handlers restored
    with pytest.raises(ArgumentError):
        R.launch(0, [ok])
    with pytest.raises(ArgumentError):
        R.launch(2, [])
    with pytest.raises(TypeError):
        R.launch(2, ok)
    with pytest.raises(ArgumentError):
        R.launch(2, [ok], timeout=0)


@pytest.mark.timeout(30)
def test_usage_errors(capsys):
    assert R.main([]) == 2
    assert R.main(["-n", "2"]) == 2                      # no program
    assert R.main(["-n", "0", "prog.py"]) == 2
    assert R.main(["-n", "2", "--timeout", "-1", "prog.py"]) == 2
    assert R.main(["-n", "2", "--bogus", "prog.py"]) == 2
    assert "usage:" in capsys.readouterr().err
    assert R.main(["--help"]) == 0
    assert "--keep-going" in capsys.readouterr().out


def test_argument_split():
    assert R._split(["-n", "2", "p.py", "-n", "3"]) == (["-n", "2"], ["p.py", "-n", "3"])
    assert R._split(["-n2", "--keep-going", "-m", "mod", "-x"]) == (["-n2", "--keep-going"],
                                                                    ["-m", "mod", "-x"])
    assert R._split(["--np=2", "-mmod"]) == (["--np=2"], ["-m", "mod"])
    assert R._split(["-n", "2", "--", "-weird.py"]) == (["-n", "2"], ["-weird.py"])
    assert R._split(["--timeout", "5", "-n", "1", "-c", "pass"]) == (
        ["--timeout", "5", "-n", "1"], ["-c", "pass"])


# libfabric's shm provider names its regions /dev/shm/<pid>:<n>:<m> and only the
# process that made one unlinks it: a rank that is killed leaves its regions behind
# (issue 19).  The ranks here make such regions themselves (rank 1 in a child too),
# then rank 1 is SIGKILLed and the launcher stops rank 0: nothing of theirs may be
# left, and a region of a process that is not the job's is left alone.
SHM_REGIONS = r'''
import os, signal, sys, time
d = sys.argv[1]
rank = os.environ["GEXMK_RANK"]

def region(pid, n):
    name = f"{pid}:97:{n}"
    with open(os.path.join("/dev/shm", name), "w") as f:
        f.write("x")
    with open(os.path.join(d, f"region-{name}"), "w"):
        pass

region(os.getpid(), 0)
if rank == "1":
    child = os.fork()
    if child == 0:
        region(os.getpid(), 1)
        time.sleep(60)
        os._exit(0)
    time.sleep(1.0)         # the launcher looks every 0.25 s
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(60)
'''


@pytest.mark.timeout(60)
@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")
def test_shm_regions_of_dead_ranks_are_removed(tmp_path):
    foreign = f"/dev/shm/{os.getpid()}:97:9"        # alive, not the job's
    with open(foreign, "w") as f:
        f.write("x")
    try:
        prog = script(tmp_path, SHM_REGIONS)
        result = launcher(tmp_path, "-n", 2, prog, tmp_path).check(128 + signal.SIGKILL)
        made = sorted(p.name[len("region-"):] for p in tmp_path.glob("region-*"))
        assert len(made) == 3, (made, result.report())
        left = [n for n in made if os.path.exists(os.path.join("/dev/shm", n))]
        assert not left, f"shm regions of dead ranks left behind: {left}"
        assert os.path.exists(foreign), "a region of a process outside the job was removed"
    finally:
        for p in [foreign] + [os.path.join("/dev/shm", p.name[len("region-"):])
                              for p in tmp_path.glob("region-*")]:
            try:
                os.unlink(p)
            except OSError:
                pass
