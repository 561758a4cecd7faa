"""Workloads: the heat equation beside mpi4py, the GPU Jacobi beside a single GPU."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile

from gexmk.bench.common import _MPI_ENV
from gexmk.bench.extension import find_bench_file
from gexmk.bench.rma import _python_flags


# ---- the heat equation: examples/heat.py beside heat_mpi4py.py -------------------------

_LAUNCH_ENV = ("GEXMK_RANK", "GEXMK_SIZE", "GEXMK_BOOTSTRAP", "GEXMK_BOOTSTRAP_TOKEN")


def heat_iters(args, grid):
    """Sweeps timed on a grid of ``grid`` points per side: ``--heat-iters``
    on 256 x 256 and smaller grids, scaled down by area above (at least 10)."""
    if grid <= 256:
        return args.heat_iters
    return max(10, args.heat_iters * 256 * 256 // (grid * grid))


def _run_json(cmd, env, timeout, out):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"skipped": f"did not finish in {timeout:g} s"}
    if r.returncode != 0 or not os.path.exists(out):
        tail = " | ".join((r.stderr or r.stdout).strip().splitlines()[-4:])
        return {"skipped": f"exit {r.returncode}: {tail}"}
    with open(out) as f:
        return json.load(f)


def run_heat(args) -> dict:
    """Run the heat example under ``gexmk.run`` and its mpi4py version under
    ``mpiexec`` for every (ranks, grid) of ``--heat-ranks`` x ``--heat-grids``;
    ``{"runs": [...], "heat": path, "heat_mpi4py": path}`` or ``{"skipped": why}``."""
    heat, heat_mpi = find_bench_file("heat.py"), find_bench_file("heat_mpi4py.py")
    if heat is None:
        return {"skipped": "heat.py is neither installed (gexmk/_bench) nor in a source tree"}
    flags = _python_flags()
    # a job of its own: not a rank of this one (gexmk.run's or mpiexec's)
    base_env = {k: v for k, v in os.environ.items()
                if k not in _LAUNCH_ENV and not k.startswith(("PMI_", "PMIX_", "OMPI_", "HYDRA_"))}
    mpi_env = {k: v for k, v in os.environ.items() if not k.startswith("GEXMK_")}
    mpiexec = shutil.which("mpiexec")
    mpi_why = None
    if heat_mpi is None:
        mpi_why = "heat_mpi4py.py not found"
    elif args.no_mpi:
        mpi_why = "disabled with --no-mpi"
    elif importlib.util.find_spec("mpi4py") is None:
        mpi_why = "mpi4py is not installed"
    elif mpiexec is None:
        mpi_why = "mpiexec is not on PATH"
    elif any(k in os.environ for k in _MPI_ENV):
        mpi_why = "this job runs under MPI"
    runs = []
    with tempfile.TemporaryDirectory(prefix="gexmk-heat-") as tmp:
        for nr in args.heat_ranks:
            for grid in args.heat_grids:
                iters = heat_iters(args, grid)
                common = ["--n", str(grid), "--iters", str(iters)]
                print(f"gexmk.bench: heat equation {grid}x{grid}, {nr} ranks ...", file=sys.stderr,
                      flush=True)
                out = os.path.join(tmp, f"g{nr}-{grid}.json")
                g = _run_json([sys.executable, *flags, "-m", "gexmk.run", "-n", str(nr), "--timeout",
                               str(args.timeout), "--", *flags, str(heat), *common, "--json", out],
                              base_env, args.timeout + 15, out)
                if mpi_why:
                    m = {"skipped": mpi_why}
                else:
                    out = os.path.join(tmp, f"m{nr}-{grid}.json")
                    m = _run_json([mpiexec, "-n", str(nr), sys.executable, *flags, str(heat_mpi),
                                   *common, "--json", out], mpi_env, args.timeout, out)
                runs.append({"ranks": nr, "grid": grid, "iters": iters, "gexmk": g, "mpi4py": m})
    return {"runs": runs, "heat": str(heat), "heat_mpi4py": str(heat_mpi) if heat_mpi else None}


def _gpu_count():
    """Visible CUDA devices, 0 without a driver or a CUDA kind in this build."""
    try:
        from gexmk.kinds import cuda
        return int(cuda.probe().get("device_count") or 0)
    except Exception:           # noqa: BLE001 - any failure means: no usable GPU
        return 0


def run_jacobi(args) -> dict:
    """The GPU Jacobi example (``examples/jacobi_gpu.py``) on one GPU and on
    every GPU (one rank each; with one GPU, two ranks share it), norm every
    iteration: ``{"runs": [...], "gpus": N}`` or ``{"skipped": why}``.  Its
    baseline, the ``nccl`` variant of NVIDIA's multi-gpu-programming-models,
    is built from its public source by ``bench/jacobi_gpu_baseline.py``."""
    gpus = _gpu_count()
    if gpus == 0:
        return {"skipped": "no CUDA device here"}
    if importlib.util.find_spec("cupy") is None:
        return {"skipped": "CuPy is not installed (the example's kernel is a CuPy RawKernel)"}
    path = find_bench_file("jacobi_gpu.py")
    if path is None:
        return {"skipped": "jacobi_gpu.py is neither installed (gexmk/_bench) nor in a source tree"}
    flags = _python_flags()
    env = {k: v for k, v in os.environ.items()
           if k not in _LAUNCH_ENV and not k.startswith(("PMI_", "PMIX_", "OMPI_", "HYDRA_"))}
    runs = []
    with tempfile.TemporaryDirectory(prefix="gexmk-jacobi-") as tmp:
        for ranks in (1, max(2, gpus)):
            print(f"gexmk.bench: GPU Jacobi {args.jacobi_n}x{args.jacobi_n}, {ranks} ranks on "
                  f"{min(ranks, gpus)} GPU(s) ...", file=sys.stderr, flush=True)
            out = os.path.join(tmp, f"j{ranks}.json")
            r = _run_json([sys.executable, *flags, "-m", "gexmk.run", "-n", str(ranks), "--timeout",
                           str(args.timeout), "--", *flags, str(path), "--nx", str(args.jacobi_n),
                           "--ny", str(args.jacobi_n), "--iters", str(args.jacobi_iters),
                           "--json", out], env, args.timeout + 15, out)
            runs.append({"ranks": ranks, "gpus": min(ranks, gpus), **r})
    return {"runs": runs, "gpus": gpus, "jacobi": str(path)}
