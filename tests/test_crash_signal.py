"""A crashing gexmk process dies of its signal, and the launcher says so.

Debian's libfabric links libpsm_infinipath, whose constructor, run when
libfabric is loaded, replaces the handlers of SIGSEGV and other signals with
one that writes a ``*.btr`` file into the working directory and exits with 1.
``import gexmk`` and ``gexmk.run`` set its switch (IPATH_NO_BACKTRACE, and
HFI_NO_BACKTRACE for older libpsm2) unless the user did.  Where libfabric
lacks the psm libraries these tests still hold: they check behaviour, not the
switches.
"""
import ctypes.util
import os
import signal
import sys
import time

import pytest

try:
    from . import mp_util
except ImportError:
    import mp_util

from gexmk import run as R
from gexmk.bootstrap import PSM_BACKTRACE_SWITCHES

# The test process imported gexmk, so its own environment has the switches: take them out
# of the children's, or nothing would be tested.
NO_SWITCHES = {"GEXMK_BOOTSTRAP": None, **{name: None for name in PSM_BACKTRACE_SWITCHES}}

SEGV_AFTER_OFI = r'''
import os, signal, sys
import gexmk, gexmk.fabric_probe
assert gexmk.fabric_probe.providers(), "libfabric reported no provider"   # loads every provider
os.write(1, ("switches " + " ".join(os.environ.get(n, "-") for n in sys.argv[2:]) + "\n").encode())
os.kill(os.getpid(), signal.SIGSEGV)
'''


@pytest.fixture(autouse=True)
def nothing_left(tmp_path):
    """Fail a test that leaves one of its processes (command line naming tmp_path) alive."""
    yield
    end = time.monotonic() + 5
    while mp_util.processes_running(str(tmp_path)) and time.monotonic() < end:
        time.sleep(0.05)
    left = mp_util.processes_running(str(tmp_path))
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    assert not left, f"processes left running: {left}"


def no_backtrace_files(where):
    found = sorted(p.name for p in where.glob("*.btr"))
    assert not found, f"a crash handler wrote {found} into {where}"


@pytest.mark.timeout(60)
def test_launcher_reports_a_segfaulting_rank_by_its_signal(tmp_path):
    prog = tmp_path / "segv.py"
    prog.write_text(SEGV_AFTER_OFI)
    result = mp_util.run_command(
        [sys.executable, "-P", "-m", "gexmk.run", "-n", "1", "--timeout", "40", str(prog),
         str(tmp_path), *PSM_BACKTRACE_SWITCHES],
        timeout=55, env=mp_util.child_env(NO_SWITCHES), cwd=str(tmp_path))
    result.check(128 + signal.SIGSEGV)
    assert f"rank 0 was killed by SIGSEGV (exit status {128 + signal.SIGSEGV})" in result.stderr, \
        result.report()
    assert "switches 1 1" in result.stdout, result.report()   # the launcher set both
    no_backtrace_files(tmp_path)


@pytest.mark.timeout(60)
def test_import_gexmk_keeps_the_crash_signal_without_the_launcher(tmp_path):
    prog = tmp_path / "segv.py"
    prog.write_text(SEGV_AFTER_OFI)
    result = mp_util.run_command([sys.executable, "-P", str(prog), str(tmp_path),
                                  *PSM_BACKTRACE_SWITCHES],
                                 timeout=40, env=mp_util.child_env(NO_SWITCHES), cwd=str(tmp_path))
    assert result.returncode == -signal.SIGSEGV, result.report()
    assert "switches 1 1" in result.stdout, result.report()
    no_backtrace_files(tmp_path)
    # a value the user chose is kept
    result = mp_util.run_command([sys.executable, "-P", str(prog), str(tmp_path),
                                  *PSM_BACKTRACE_SWITCHES], timeout=40,
                                 env=mp_util.child_env({**NO_SWITCHES, "IPATH_NO_BACKTRACE": "yes"}),
                                 cwd=str(tmp_path))
    assert result.returncode == -signal.SIGSEGV, result.report()
    assert "switches yes 1" in result.stdout, result.report()
    no_backtrace_files(tmp_path)


@pytest.mark.timeout(60)
def test_rank_that_loads_libfabric_without_gexmk_dies_of_its_signal(tmp_path, capfd):
    # The launcher's rank environment alone must do it: this rank never imports gexmk.
    libfabric = ctypes.util.find_library("fabric")
    if libfabric is None:
        pytest.skip("libfabric is not installed")
    prog = tmp_path / "segv_raw.py"
    prog.write_text("import ctypes, os, signal, sys\n"
                    "ctypes.CDLL(sys.argv[1])\n"
                    "os.kill(os.getpid(), signal.SIGSEGV)\n")
    old = os.getcwd()
    os.chdir(tmp_path)                      # the ranks' working directory
    try:
        code = R.launch(1, [str(prog), libfabric, str(tmp_path)], timeout=40,
                        env=mp_util.child_env(NO_SWITCHES))
    finally:
        os.chdir(old)
    err = capfd.readouterr().err
    assert code == 128 + signal.SIGSEGV, err
    assert "rank 0 was killed by SIGSEGV" in err, err
    no_backtrace_files(tmp_path)
