"""The command line: set-up, the job, the baselines, the report."""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

from gexmk.bench.common import BuildError, _MPI_ENV
from gexmk.bench.timing import parse_sizes
from gexmk.bench.extension import build_extension, installed_extension
from gexmk.bench.rma import _job, _python_flags, run_mpi_baseline
from gexmk.bench.workloads import run_heat, run_jacobi
from gexmk.bench.report import _targets, report


# ---- driver ----------------------------------------------------------------------------

def _gpu_note():
    try:
        from gexmk.kinds import cuda
    except ImportError as exc:
        return f"GPU: gexmk.kinds.cuda is not importable ({exc}); host memory only"
    try:
        info = cuda.probe()
    except Exception as exc:  # a probe that fails is reported, never fatal here
        return f"GPU: probe failed ({type(exc).__name__}: {exc}); host memory only"
    if info.get("device_count"):
        names = ", ".join(d.get("name", "?") for d in info.get("devices", []))
        return (f"GPU: {info['device_count']} CUDA device(s) ({names}): device memory benchmarks "
                "are not in this build (host memory only)")
    return f"GPU: none ({info.get('reason') or 'no device'}); host memory benchmarks only"


def _meta():
    import numpy as np
    import gexmk
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"gexmk": gexmk.__version__, "python": platform.python_version(), "numpy": np.__version__,
            "cpu": cpu, "ncpu": os.cpu_count(), "platform": platform.platform(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def _loadavg():
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def _finish(args, gexmk_res, wall0, load0):
    """Baseline, report and JSON, in whichever process holds the gexmk figures."""
    if args.no_mpi:
        mpi = {"skipped": "disabled with --no-mpi"}
    elif any(k in os.environ for k in _MPI_ENV):
        mpi = {"skipped": "this job runs under MPI; run bench/mpi4py_rma.py under mpiexec separately"}
    else:
        print("gexmk.bench: running the mpi4py baseline (mpiexec -n 2) ...", file=sys.stderr, flush=True)
        mpi = run_mpi_baseline(args)
    if args.no_heat:
        heat = {"skipped": "disabled with --no-heat"}
    else:
        heat = run_heat(args)
    jacobi = {"skipped": "disabled with --no-jacobi"} if args.no_jacobi else run_jacobi(args)
    r = {"meta": _meta(), "args": {"sizes": args.sizes, "iters": args.iters, "batch_us": args.batch_us,
                                   "n": args.n},
         "sizes": args.sizes, "gexmk": gexmk_res, "mpi4py": mpi, "heat": heat, "jacobi": jacobi,
         "gpu_note": _gpu_note()}
    r["targets"] = _targets(r)
    r["meta"]["wall_s"] = round(time.monotonic() - wall0, 1)
    r["meta"]["loadavg_at_start"] = load0
    report(r)
    print(f"(wall time {r['meta']['wall_s']:.1f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**r, "targets": [{"status": st, "text": t} for st, t in r["targets"]]}, f, indent=1)
        print(f"results written to {args.json}")
    return 0


def _int_list(text):
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a comma list of positive integers")
    return out


def _parser():
    p = argparse.ArgumentParser(
        prog="python -m gexmk.bench",
        description="Latency and bandwidth of gexmk RMA between two local processes, each "
                    "figure beside its baseline (memcpy, mpi4py one-sided) from the same run.",
        epilog="Outside a job it relaunches itself under python -m gexmk.run -n N; inside one "
               "(gexmk.run or mpiexec) rank 0 measures against rank 1 and prints the tables.")
    p.add_argument("-n", "--np", dest="n", type=int, default=2,
                   help="ranks of the gexmk job when launched from outside one (default 2)")
    p.add_argument("--sizes", type=parse_sizes, default=parse_sizes("8:4M"),
                   help="MIN:MAX[:FACTOR] (powers of FACTOR, default 4, MAX included) or a comma "
                        "list, with K/M suffixes (default 8:4M)")
    p.add_argument("--iters", type=int, default=300,
                   help="timed batches per measurement; the median is reported (default 300)")
    p.add_argument("--batch-us", type=float, default=200.0,
                   help="calibrated length of one timed batch, in µs (default 200)")
    p.add_argument("--no-mpi", action="store_true", help="skip the mpi4py baseline")
    p.add_argument("--no-cython", action="store_true", help="skip building and timing the nogil loops")
    p.add_argument("--no-heat", action="store_true", help="skip the heat-equation example")
    p.add_argument("--no-jacobi", action="store_true", help="skip the GPU Jacobi example")
    p.add_argument("--jacobi-n", type=int, default=16384,
                   help="GPU Jacobi grid points per side (default 16384)")
    p.add_argument("--jacobi-iters", type=int, default=1000,
                   help="GPU Jacobi iterations, norm every iteration (default 1000)")
    p.add_argument("--heat-grids", type=_int_list, default=[256, 4096],
                   help="grid sizes (points per side) of the heat example, comma list (default 256,4096)")
    p.add_argument("--heat-ranks", type=_int_list, default=[2, 4],
                   help="rank counts of the heat example, comma list (default 2,4)")
    p.add_argument("--heat-iters", type=int, default=100,
                   help="sweeps timed on grids up to 256x256, fewer on larger ones (default 100)")
    p.add_argument("--json", metavar="PATH", help="also write every figure to PATH as JSON")
    p.add_argument("--timeout", type=float, default=150.0,
                   help="seconds each subprocess (gexmk job, mpiexec baseline) may run (default 150)")
    p.add_argument("--results-to", help=argparse.SUPPRESS)  # set by the relaunching parent
    return p


def _argv_for_ranks(args):
    a = ["--sizes", ",".join(str(s) for s in args.sizes), "--iters", str(args.iters),
         "--batch-us", str(args.batch_us), "--timeout", str(args.timeout), "-n", str(args.n)]
    if args.no_cython:
        a.append("--no-cython")
    return a


def main(argv=None) -> int:
    """Command-line entry point (see the module docstring); returns the exit status."""
    args = _parser().parse_args(argv)
    if args.n < 1 or args.iters < 1 or args.batch_us <= 0 or args.heat_iters < 1:
        print("gexmk.bench: -n, --iters, --batch-us and --heat-iters must be positive", file=sys.stderr)
        return 2
    wall0, load0 = time.monotonic(), _loadavg()
    in_job = "GEXMK_RANK" in os.environ or any(k in os.environ for k in _MPI_ENV)
    if in_job:
        res = _job(args)
        if res is None:
            return 0
        if args.results_to:
            with open(args.results_to, "w") as f:
                json.dump(res, f)
            return 0
        return _finish(args, res, wall0, load0)

    # Outside a job: build the loop module here (no rank waits on it), then relaunch.
    tmp = tempfile.mkdtemp(prefix="gexmk-bench-")
    try:
        env = dict(os.environ)
        if not args.no_cython and installed_extension():
            env["GEXMK_BENCH_EXT"] = installed_extension()
        elif not args.no_cython:
            print("gexmk.bench: building bench/nogil_loop.pyx against gexmk ...", file=sys.stderr, flush=True)
            try:
                env["GEXMK_BENCH_EXT"] = build_extension(outdir=os.path.join(tmp, "ext"))
            except BuildError as exc:
                env["GEXMK_BENCH_EXT"] = f"skip:{exc}"
                print(f"gexmk.bench: nogil loops skipped: {exc}", file=sys.stderr)
        results = os.path.join(tmp, "gexmk.json")
        flags = _python_flags()
        cmd = [sys.executable, *flags, "-m", "gexmk.run", "-n", str(args.n), "--timeout",
               str(args.timeout), "--", *flags, "-m", "gexmk.bench", *_argv_for_ranks(args),
               "--results-to", results]
        print(f"gexmk.bench: running the gexmk job ({args.n} ranks) ...", file=sys.stderr, flush=True)
        rc = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL).returncode
        if rc != 0 or not os.path.exists(results):
            print(f"gexmk.bench: the gexmk job failed (exit {rc})", file=sys.stderr)
            return rc or 1
        with open(results) as f:
            res = json.load(f)
        return _finish(args, res, wall0, load0)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

