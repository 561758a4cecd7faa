"""gexmk's C-level API from an outside Cython project: build
tests/cython_api_project against the gexmk under test (its .pxd files and
gexmk.get_include()), import it, and drive RMA from nogil loops."""
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig

import numpy as np
import pytest

import gexmk

try:
    from . import mp_util
except ImportError:
    import mp_util

PROJECT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cython_api_project")
MODULE = "gexmk_api_user"

# building the outside project spawns cython and the C compiler
pytestmark = pytest.mark.timeout(120)


def _compiler():
    cc = sysconfig.get_config_var("CC") or os.environ.get("CC") or "cc"
    cmd = shlex.split(cc)
    if not cmd or shutil.which(cmd[0]) is None:
        return None
    return cmd


@pytest.fixture(scope="module")
def api_user(tmp_path_factory):
    """The outside project's extension module, built into a temporary folder."""
    if importlib.util.find_spec("Cython") is None:
        pytest.skip("Cython is not installed: cannot build the outside Cython project")
    cc = _compiler()
    if cc is None:
        pytest.skip(f"no C compiler found (sysconfig CC={sysconfig.get_config_var('CC')!r})")
    out = tmp_path_factory.mktemp("cython_api")
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(gexmk.__file__)))
    src = os.path.join(PROJECT, MODULE + ".pyx")
    c_file = out / (MODULE + ".c")
    r = subprocess.run([sys.executable, "-m", "cython", "-3", "-I", pkg_parent, src,
                        "-o", str(c_file)], cwd=str(out), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, f"cython failed:\n{r.stdout}\n{r.stderr}"
    ext = out / (MODULE + sysconfig.get_config_var("EXT_SUFFIX"))
    cmd = cc + ["-shared", "-fPIC", "-O1",
                "-I", sysconfig.get_paths()["include"], "-I", gexmk.get_include(),
                str(c_file), "-o", str(ext)]
    r = subprocess.run(cmd, cwd=str(out), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"compiling failed: {shlex.join(cmd)}\n{r.stdout}\n{r.stderr}"
    spec = importlib.util.spec_from_file_location(MODULE, ext)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_get_include_has_the_header():
    assert os.path.isfile(os.path.join(gexmk.get_include(), "gexmk", "gexmk.h"))


def test_nogil_puts_and_get(api_user, client):
    seg = client.segment_attach(1 << 16)
    n = 1000
    got = api_user.put_many_then_get(client.tm, 0, seg.address + 64, n, 10**12)
    want = np.arange(10**12, 10**12 + n, dtype=np.int64)
    assert np.frombuffer(got, np.int64).tolist() == want.tolist()
    arr = np.asarray(seg)
    assert np.array_equal(arr[64:64 + 8 * n].view(np.int64), want)
    assert not arr[:64].any() and not arr[64 + 8 * n:].any()


def test_nogil_atomic(api_user, client):
    seg = client.segment_attach(4096)
    addr = seg.address + 8
    assert api_user.fetch_add(client.tm, 0, addr, 5) == 0
    assert api_user.fetch_add(client.tm, 0, addr, 1, 99) == 5 + 98
    assert np.asarray(seg)[8:16].view(np.int64)[0] == 5 + 99
    # the Python atomic domain sees the same object
    ad = client.tm.ad_create(gexmk.DT_I64, gexmk.OP_GET)
    assert ad.op(0, addr, gexmk.OP_GET) == 104


def test_nogil_to_another_endpoint(api_user, client):
    client.segment_attach(64)
    ep1 = client.ep_create()
    s1 = client.segment_create(4096)
    ep1.bind_segment(s1)
    team = client.tm.create([(0, 0), (0, 1)])
    api_user.put_word(team, 1, s1.address + 16, -42)
    assert np.asarray(s1)[16:24].view(np.int64)[0] == -42
    assert api_user.get_word(ep1.pair(1), 0, s1.address + 16) == -42


def test_nogil_bad_address_raises(api_user, client):
    seg = client.segment_attach(4096)
    np.asarray(seg)[:] = 3
    for addr in (seg.address + 4093, seg.address - 8, seg.address + (1 << 40), 2**64 - 1):
        with pytest.raises(gexmk.BoundsError):
            api_user.put_word(client.tm, 0, addr, 1)
        with pytest.raises(gexmk.BoundsError):
            api_user.get_word(client.tm, 0, addr)
    with pytest.raises(gexmk.BoundsError):
        api_user.fetch_add(client.tm, 0, seg.address + 4, 1)       # misaligned
    with pytest.raises(gexmk.BoundsError):
        api_user.put_many_then_get(client.tm, 0, seg.address + 4000, 100, 0)
    assert (np.asarray(seg)[:4000] == 3).all()
    assert np.asarray(seg)[4000:].view(np.int64).tolist() == list(range(12))


def test_nogil_bad_rank_and_unbound_target(api_user, client):
    seg = client.segment_attach(4096)
    with pytest.raises(gexmk.RankError):
        api_user.put_word(client.tm, 1, seg.address, 1)
    with pytest.raises(gexmk.RankError):
        api_user.put_word(client.tm, -1, seg.address, 1)
    client.ep_create()
    with pytest.raises(gexmk.SegmentError):
        api_user.put_word(client.ep(0).pair(1), 0, seg.address, 1)
    assert not np.asarray(seg).any()


def test_team_handle_after_finalize(api_user):
    c = gexmk.init()
    seg = c.segment_attach(4096)
    tm = c.tm
    addr = seg.address
    c.finalize()
    with pytest.raises(gexmk.StateError):
        api_user.put_word(tm, 0, addr, 1)


@pytest.mark.timeout(120)
def test_team_handle_of_none_raises(api_user, tmp_path):
    """rma.team_handle(None) (a ``Team`` argument left None) must raise, not
    crash; run in a child so that a crash fails this test only."""
    script = tmp_path / "none_team.py"
    script.write_text(
        "import importlib.util, sys\n"
        "import gexmk\n"
        f"spec = importlib.util.spec_from_file_location({MODULE!r}, {api_user.__file__!r})\n"
        "mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)\n"
        "with gexmk.init() as c:\n"
        "    seg = c.segment_attach(64)\n"
        "    try:\n"
        "        mod.put_word(None, 0, seg.address, 1)\n"
        "    except (TypeError, gexmk.GexmkError) as e:\n"
        "        print('RAISED', type(e).__name__, e)\n")
    r = mp_util.run_command([sys.executable, str(script)], timeout=60, cwd=str(tmp_path),
                            env=mp_util.child_env(), script=str(script))
    assert r.returncode == 0, r.report()
    assert "RAISED" in r.stdout


def test_nogil_put_signal_wait_until_fetch(api_user, client):
    seg = client.segment_attach(4096)
    tm = client.tm
    mem = np.asarray(seg)
    sig = seg.address
    assert api_user.put_signal_then_wait(tm, 0, seg.address + 64, 77, sig, 5, 0, sig, 5, 10.0) == 5
    assert int(mem[64:72].view(np.int64)[0]) == 77
    assert api_user.put_signal_then_wait(tm, 0, seg.address + 72, 78, sig, 2, 1, sig, 7, 10.0) == 7
    api_user.signal_op(tm, 0, sig, 10, 1)
    assert tm.signal_fetch(sig) == 17
    # a word nobody sets: TimeoutError from the nogil wait, naming the word
    with pytest.raises(gexmk.TimeoutError, match=f"0x{sig:x}"):
        api_user.put_signal_then_wait(tm, 0, seg.address + 64, 1, seg.address + 8, 1, 0, sig, 100,
                                      0.05)
    # bad input raises from nogil code too
    with pytest.raises(gexmk.BoundsError, match="aligned to 8"):
        api_user.signal_op(tm, 0, sig + 4, 1, 0)
    with pytest.raises(gexmk.RankError):
        api_user.signal_op(tm, 1, sig, 1, 0)
    with pytest.raises(gexmk.BoundsError, match="own"):
        api_user.put_signal_then_wait(tm, 0, seg.address + 64, 1, sig, 1, 0, sig + 4096, 1, 1.0)


@pytest.mark.parametrize("nbi", [False, True])
def test_nogil_vis_strided_and_fragments(api_user, client, nbi):
    seg = client.segment_attach(1 << 16)
    a = np.arange(64 * 8, dtype=np.float64).reshape(64, 8)
    col = a[:, 3].copy()
    rows = a[:2, :2].copy()
    api_user.strided_column(client.tm, 0, seg.address, a, 3, nbi)
    arr = np.asarray(seg)
    assert np.array_equal(arr[:512].view(np.float64), col)
    assert np.array_equal(a[:, 4], col)                       # got back into the next column
    assert np.array_equal(a[2:4, :2], rows)                   # fragments there and back
    with pytest.raises(gexmk.BoundsError, match="strided"):      # the column does not fit
        api_user.strided_column(client.tm, 0, seg.address + (1 << 16) - 256, a, 3, nbi)
    with pytest.raises(gexmk.BoundsError, match="block 0"):       # the column fits, the rows not
        api_user.strided_column(client.tm, 0, seg.address + (1 << 16) - 512, a, 3, nbi)
