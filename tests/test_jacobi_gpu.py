"""The GPU Jacobi example (examples/jacobi_gpu.py; installed as
gexmk/_bench/jacobi_gpu.py): 1 and 2 ranks on a small grid under
``python -m gexmk.run``, each band equal to a serial numpy run and the residual
norm the same (the example checks and says so).  On a machine with two GPUs
the ranks take one each; with one, both share it.  The serial reference's
sensitivity is checked without a GPU."""
import json
import os
import sys

import numpy as np
import pytest

try:
    from . import mp_util
except ImportError:
    import mp_util

from gexmk import bench
from test_cuda_segments import HAVE_GPU


def _jacobi():
    path = bench.find_bench_file("jacobi_gpu.py")
    if path is None:
        pytest.skip("examples/jacobi_gpu.py is neither installed nor in a source tree here")
    return str(path)


def _module():
    sys.path.insert(0, os.path.dirname(_jacobi()))
    try:
        import jacobi_gpu
    finally:
        sys.path.pop(0)
    return jacobi_gpu


def test_bands_cover_the_rows_once():
    j = _module()
    for ny in (5, 34, 257):
        for size in (1, 2, 3, 7):
            if ny - 2 < size:
                continue
            rows = []
            for r in range(size):
                lo, hi = j.band(r, size, ny)
                assert hi > lo
                rows.extend(range(lo, hi))
            assert rows == list(range(1, ny - 1)), (ny, size)


def test_serial_reference_is_periodic_and_converges():
    j = _module()
    a, n1 = j.serial(32, 34, 20)
    _, n2 = j.serial(32, 34, 40)
    assert 0 < n2 < n1                                 # Jacobi converges
    assert (a[0] == a[-2]).all() and (a[-1] == a[1]).all()   # periodic halos
    b = j.initial_band(32, 34, 1, 33)
    assert (a[1:-1, 0] == b[1:-1, 0]).all() and (a[1:-1, -1] == b[1:-1, -1]).all()  # fixed columns


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_GPU, reason="no NVIDIA driver or device on this machine")
@pytest.mark.parametrize("ranks, dtype, flags", [(1, "float32", []), (2, "float32", []),
                                                 (2, "float64", ["--no-overlap"]),
                                                 (3, "float32", [])])
@pytest.mark.timeout(180)
def test_jacobi_gpu_matches_serial(tmp_path, ranks, dtype, flags):
    pytest.importorskip("cupy")
    out = tmp_path / "jacobi.json"
    cmd = [sys.executable, "-P", "-m", "gexmk.run", "-n", str(ranks), "--timeout", "150", _jacobi(),
           "--nx", "96", "--ny", "130", "--iters", "40", "--warmup", "3", "--check", "--dtype", dtype,
           "--json", str(out), *flags]
    res = mp_util.run_command(cmd, timeout=170, env=mp_util.child_env({"GEXMK_TIMEOUT": 60}),
                              cwd=str(tmp_path), script="jacobi_gpu.py")
    res.check()
    r = json.loads(out.read_text())
    assert r["ok"] is True and r["ranks"] == ranks and r["iters"] == 40, r
    assert "equal to serial numpy" in res.stdout
    ref = _module().serial(96, 130, 43, np.dtype(dtype))[1]
    # the blocks sum in float32 for float32 grids (as the baseline), then in float64
    assert abs(r["norm"] - ref) <= (1e-7 if dtype == "float32" else 1e-12) * ref, (r["norm"], ref)
