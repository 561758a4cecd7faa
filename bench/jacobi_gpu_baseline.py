"""The baseline of examples/jacobi_gpu.py: the ``nccl`` variant of NVIDIA's
multi-gpu-programming-models Jacobi (public source, not in this repository),
built from a checkout given here and run with Open MPI's ``mpirun`` on the
same GPUs, in the same visit as gexmk's run.

    python bench/jacobi_gpu_baseline.py --src DIR [--np 2] [--nx 16384] [--ny 16384]
                                         [--niter 1000] [--nccheck 1] [--json out.json]

DIR is a checkout of https://github.com/NVIDIA/multi-gpu-programming-models
(its ``nccl/`` folder is enough).  The build follows its Makefile with two
changes CUDA 13 and the pip packages need: ``-std=c++17`` (CUDA 13's CCCL)
and NCCL's headers and library from the ``nvidia.nccl`` Python package
(``-l:libnccl.so.2``, rpath to it).  The program times a single-GPU run and
the N-GPU run itself and prints both (its ``-csv`` line is parsed here).
Prints one JSON object; ``{"skip": why}`` where a tool is missing.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile


def _nccl_home():
    try:
        import nvidia.nccl as nccl
    except ImportError:
        return None
    for p in getattr(nccl, "__path__", []):
        if os.path.isdir(os.path.join(p, "include")):
            return p
    return None


def build(src, work):
    """The nccl variant's binary in ``work``, or raise RuntimeError saying why."""
    cuda = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    nvcc = shutil.which("nvcc") or os.path.join(cuda, "bin", "nvcc")
    mpicxx = shutil.which("mpicxx") or shutil.which("mpic++")
    nccl = _nccl_home()
    if not os.path.exists(nvcc) or mpicxx is None or nccl is None:
        raise RuntimeError(f"needs nvcc ({nvcc}), mpicxx ({mpicxx}) and the nvidia-nccl package "
                           f"({nccl})")
    d = os.path.join(src, "nccl")
    kern = os.path.join(work, "jacobi_kernels.o")
    binary = os.path.join(work, "jacobi_nccl")
    cmds = [[nvcc, "-DHAVE_CUB", "-lineinfo", "-gencode", "arch=compute_90,code=sm_90",
             "-std=c++17", "-c", os.path.join(d, "jacobi_kernels.cu"), "-o", kern],
            [mpicxx, "-DUSE_NVTX", "-I" + os.path.join(cuda, "include"),
             "-I" + os.path.join(nccl, "include"), "-std=c++17", os.path.join(d, "jacobi.cpp"), kern,
             "-L" + os.path.join(cuda, "lib64"), "-L" + os.path.join(nccl, "lib"), "-lcudart",
             "-ldl", "-l:libnccl.so.2", "-Wl,-rpath," + os.path.join(nccl, "lib"), "-o", binary]]
    for cmd in cmds:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[:2])}... failed: {r.stderr[-2000:]}")
    return binary


def run(args):
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        return {"skip": "no mpirun"}
    with tempfile.TemporaryDirectory(prefix="mgpm-") as work:
        try:
            binary = build(args.src, work)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            return {"skip": f"build failed: {e}"}
        cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(args.np), binary,
               "-nx", str(args.nx), "-ny", str(args.ny), "-niter", str(args.niter),
               "-nccheck", str(args.nccheck), "-csv"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        if r.returncode != 0:
            return {"skip": f"run failed ({r.returncode}): {r.stderr[-2000:]}"}
        for line in r.stdout.splitlines():
            parts = [p.strip() for p in line.split(",")]
            if parts and parts[0] == "nccl" and len(parts) >= 9:
                multi, single = float(parts[7]), float(parts[8])
                return {"variant": "nccl", "nx": args.nx, "ny": args.ny, "iters": args.niter,
                        "nccheck": args.nccheck, "gpus": args.np, "seconds": multi,
                        "single_gpu_seconds": single,
                        "per_iter_us": multi / args.niter * 1e6,
                        "efficiency": single / (args.np * multi)}
        return {"skip": f"no result line (the program's own check failed?): {r.stdout[-1500:]}"}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", required=True, help="multi-gpu-programming-models checkout")
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--nx", type=int, default=16384)
    ap.add_argument("--ny", type=int, default=16384)
    ap.add_argument("--niter", type=int, default=1000)
    ap.add_argument("--nccheck", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    res = run(args)
    print(json.dumps(res), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f)
    return 0 if "skip" not in res else 1


if __name__ == "__main__":
    sys.exit(main())
