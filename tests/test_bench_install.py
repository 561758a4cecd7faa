"""``python -m gexmk.bench`` runs in full from an installed package: from a
directory outside any source tree, with ``-P``, in a reduced mode, every piece
ran (not skipped) -- the mpi4py baseline, the nogil loops, the heat example and
its mpi4py version -- and, where the package carries them (``gexmk/_bench``),
from the files installed with it.  Timings are not looked at."""
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

import gexmk

try:
    from . import mp_util
except ImportError:
    import mp_util


@pytest.mark.timeout(400)
def test_bench_runs_every_piece_from_the_install(tmp_path):
    if importlib.util.find_spec("mpi4py") is None or shutil.which("mpiexec") is None:
        pytest.skip("mpi4py or mpiexec missing: the baseline cannot run here")
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-P", "-m", "gexmk.bench", "--sizes", "8,4K", "--iters", "5",
           "--batch-us", "20", "--heat-grids", "34", "--heat-ranks", "2", "--heat-iters", "4",
           "--jacobi-n", "130", "--jacobi-iters", "20", "--timeout", "120", "--json", str(out)]
    res = mp_util.run_command(cmd, timeout=380, env=mp_util.child_env(), cwd=str(tmp_path),
                              script="python -m gexmk.bench")
    res.check()
    r = json.loads(out.read_text())
    assert "skipped" not in r["mpi4py"], r["mpi4py"]
    assert r["mpi4py"]["small"]["put_flush"]["median_us"] > 0
    g = r["gexmk"]
    assert "put8" in g["nogil"] and g["nogil"]["put8"]["median_us"] > 0, g.get("nogil_note")
    heat = r["heat"]
    assert "skipped" not in heat, heat
    jac = r["jacobi"]
    if "skipped" in jac:                # a machine without a GPU says so
        assert "CUDA" in jac["skipped"] or "CuPy" in jac["skipped"], jac
    else:
        single, multi = jac["runs"]
        assert single["ranks"] == 1 and multi["ranks"] >= 2, jac
        assert abs(single["norm"] - multi["norm"]) <= 1e-6 * single["norm"], jac
        assert "GPU Jacobi" in res.stdout
    (run,) = heat["runs"]
    assert (run["ranks"], run["grid"], run["iters"]) == (2, 34, 4)
    for who in ("gexmk", "mpi4py"):
        assert run[who].get("ok") is True, (who, run[who])
        assert run[who]["per_iter_us"] > 0
    assert "Heat equation" in res.stdout and "nogil loops through" in res.stdout
    installed = os.path.join(os.path.dirname(os.path.realpath(gexmk.__file__)), "_bench")
    if os.path.isdir(installed):        # an install (not a developer tree): its own files ran
        for path in (r["mpi4py"]["script"], g["nogil_module"], heat["heat"], heat["heat_mpi4py"]):
            assert os.path.realpath(path).startswith(installed + os.sep), (path, installed)


def test_heat_iterations_scale_with_the_grid():
    from gexmk.bench import driver, workloads
    args = driver._parser().parse_args([])
    assert (args.heat_grids, args.heat_ranks, args.heat_iters) == ([256, 4096], [2, 4], 100)
    assert workloads.heat_iters(args, 256) == 100 and workloads.heat_iters(args, 4096) == 10
    assert (args.jacobi_n, args.jacobi_iters, args.no_jacobi) == (16384, 1000, False)
    with pytest.raises(SystemExit):
        driver._parser().parse_args(["--heat-ranks", "0"])
