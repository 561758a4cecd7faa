"""Baselines for the CUDA benches (bench/cuda_nbrhd.py, bench/cuda_loopback.py),
measured in the same run as gexmk's figures:

- the C driver-API program ``bench/cuda/driver_baseline.c``, compiled here
  with gcc against ``cuda.h`` (CUDA_HOME, /usr/local/cuda, or the
  nvidia-cuda-runtime wheel) and ``-lcuda`` (the driver, or the toolkit's
  stub), run as two processes (see the program's header for its figures);
- CuPy: legacy IPC (``ipcGetMemHandle`` / ``ipcOpenMemHandle``) and an 8 B
  ``memcpyAsync`` + stream synchronize per put, between two processes;
- PyTorch: a CUDA tensor shared through ``torch.multiprocessing`` and an 8 B
  ``copy_`` + stream synchronize per put;
- nvshmem4py (two GPUs, issue 11): ``bench/nvshmem_baseline.py`` under the
  ``mpiexec`` of mpi4py's MPI, one PE per GPU.

Each returns a dict of figures, or ``{"skip": reason}`` (a package missing,
no compiler, a failure) so that a bench prints the reason and goes on.

    python -P bench/cuda_baseline.py [c|cupy|torch|nvshmem|all] [--iters N]
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def _cuda_include():
    cands = [os.path.join(os.environ[v], "include") for v in ("CUDA_HOME", "CUDA_PATH")
             if os.environ.get(v)]
    cands.append("/usr/local/cuda/include")
    try:
        import nvidia
        for root in nvidia.__path__:
            cands += [os.path.join(root, sub, "include") for sub in ("cu13", "cu12", "cuda_runtime")]
    except ImportError:
        pass
    return next((c for c in cands if os.path.exists(os.path.join(c, "cuda.h"))), None)


def build_c(outdir=None):
    """Compile driver_baseline.c; returns (path, None) or (None, why)."""
    cc = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")
    if cc is None:
        return None, "no C compiler (gcc)"
    inc = _cuda_include()
    if inc is None:
        return None, "cuda.h not found (set CUDA_HOME or install nvidia-cuda-runtime)"
    out = os.path.join(outdir or tempfile.mkdtemp(prefix="gexmk-cbase-"), "driver_baseline")
    src = os.path.join(HERE, "cuda", "driver_baseline.c")
    libdirs = [[]]
    for root in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root and os.path.isdir(os.path.join(root, "lib64", "stubs")):
            libdirs.append([f"-L{os.path.join(root, 'lib64', 'stubs')}"])
    err = ""
    for extra in libdirs:
        for lib in (["-lcuda"], ["-l:libcuda.so.1"]):
            r = subprocess.run([cc, "-O2", "-o", out, f"-I{inc}", src, *extra, *lib],
                               capture_output=True, text=True)
            if r.returncode == 0:
                return out, None
            err = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["?"]
    return None, f"gcc could not build driver_baseline.c: {err[0]}"


def run_c(iters=2000, device=0, timeout=120, owner_device=None):
    """The C baselines (a dict: see driver_baseline.c), or {"skip": why}: the
    importer on ``device``, the segment's owner on ``owner_device`` (default:
    the same device)."""
    exe, why = build_c()
    if exe is None:
        return {"skip": why}
    try:
        r = subprocess.run([exe, str(iters), str(device),
                            str(device if owner_device is None else owner_device)],
                           capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"skip": f"driver_baseline took more than {timeout} s"}
    if r.returncode != 0:
        return {"skip": f"driver_baseline failed (exit {r.returncode}): {r.stderr.strip()[-300:]}"}
    return json.loads(r.stdout.strip().splitlines()[-1])


# ---- CuPy legacy IPC and PyTorch tensor sharing (two processes each) ---------------------

def _cupy_owner(q_out, q_in):
    import cupy as cp
    buf = cp.zeros(1 << 20, cp.uint8)
    q_out.put(cp.cuda.runtime.ipcGetMemHandle(buf.data.ptr))
    q_in.get()                 # until the peer is done
    del buf


def _cupy_peer(iters):
    import multiprocessing as mp
    import statistics
    import time
    import cupy as cp
    ctx = mp.get_context("spawn")
    q_out, q_in = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_cupy_owner, args=(q_out, q_in), daemon=True)
    p.start()
    try:
        handle = q_out.get(timeout=60)
        remote = cp.cuda.runtime.ipcOpenMemHandle(handle)
        src = cp.arange(8, dtype=cp.uint8)
        stream = cp.cuda.Stream(non_blocking=True)
        kind = cp.cuda.runtime.memcpyDeviceToDevice
        ts = []
        for i in range(iters + 20):
            t = time.perf_counter_ns()
            cp.cuda.runtime.memcpyAsync(remote, src.data.ptr, 8, kind, stream.ptr)
            stream.synchronize()
            if i >= 20:
                ts.append(time.perf_counter_ns() - t)
        cp.cuda.runtime.ipcCloseMemHandle(remote)
        return {"put8_us": statistics.median(ts) * 1e-3}
    finally:
        q_in.put("done")
        p.join(30)
        if p.is_alive():
            p.kill()


def _torch_owner(q_out, q_in):
    import torch
    t = torch.zeros(1 << 17, dtype=torch.int64, device="cuda")
    q_out.put(t)               # shared through torch.multiprocessing (CUDA IPC)
    q_in.get()
    del t


def _torch_peer(iters):
    import statistics
    import time
    import torch
    import torch.multiprocessing as tmp
    ctx = tmp.get_context("spawn")
    q_out, q_in = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_torch_owner, args=(q_out, q_in), daemon=True)
    p.start()
    try:
        remote = q_out.get(timeout=60)
        src = torch.arange(1, dtype=torch.int64, device="cuda")
        stream = torch.cuda.Stream()
        dst = remote[:1]
        ts = []
        with torch.cuda.stream(stream):
            for i in range(iters + 20):
                t = time.perf_counter_ns()
                dst.copy_(src)
                stream.synchronize()
                if i >= 20:
                    ts.append(time.perf_counter_ns() - t)
        del dst, remote
        return {"put8_us": statistics.median(ts) * 1e-3}
    finally:
        q_in.put("done")
        p.join(30)
        if p.is_alive():
            p.kill()


def run_peer(which, iters=2000, timeout=180):
    """CuPy or PyTorch 8 B put + sync between two processes, in a fresh
    interpreter (its CUDA state apart from the caller's): a dict or {"skip": why}."""
    mod = {"cupy": "cupy", "torch": "torch"}[which]
    import importlib.util
    if importlib.util.find_spec(mod) is None:
        return {"skip": f"{mod} is not installed"}
    try:
        r = subprocess.run([sys.executable, "-P", os.path.abspath(__file__), which, "--iters",
                            str(iters), "--json"], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"skip": f"{which} baseline took more than {timeout} s"}
    if r.returncode != 0:
        return {"skip": f"{which} baseline failed: {(r.stderr or r.stdout).strip()[-300:]}"}
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_nvshmem(iters=200, timeout=240):
    """nvshmem4py's 8 B and 64 MiB puts between two PEs on two GPUs (a dict: see
    nvshmem_baseline.py), or {"skip": why}."""
    try:
        import nvshmem.core  # noqa: F401
        import mpi4py  # noqa: F401
    except ImportError as e:
        return {"skip": f"nvshmem4py or mpi4py missing ({e})"}
    mpiexec = shutil.which("mpiexec")
    if mpiexec is None:
        return {"skip": "no mpiexec on PATH"}
    ver = subprocess.run([mpiexec, "--version"], capture_output=True, text=True).stdout
    cmd = [mpiexec]
    if "Open MPI" in ver or "OpenRTE" in ver:
        cmd += ["--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    cmd += ["-n", "2", sys.executable, os.path.join(HERE, "nvshmem_baseline.py"),
            "--iters", str(iters)]
    env = dict(os.environ, NVSHMEM_DISABLE_NVLS="1")
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"skip": f"nvshmem_baseline took more than {timeout} s"}
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode != 0 or not lines:
        return {"skip": f"nvshmem_baseline failed (exit {r.returncode}): "
                        f"{(r.stderr or r.stdout).strip()[-400:]}"}
    return json.loads(lines[-1])


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("which", nargs="?", default="all", choices=["c", "cupy", "torch", "nvshmem", "all"])
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout (internal)")
    args = ap.parse_args(argv)
    if args.json and args.which in ("cupy", "torch"):
        sys.path.insert(0, HERE)
        fn = _cupy_peer if args.which == "cupy" else _torch_peer
        print(json.dumps(fn(args.iters)))
        return 0
    out = {}
    if args.which in ("c", "all"):
        out["c"] = run_c(args.iters)
    for w in ("cupy", "torch"):
        if args.which in (w, "all"):
            out[w] = run_peer(w, args.iters)
    if args.which == "nvshmem":
        out["nvshmem"] = run_nvshmem(min(args.iters, 500))
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
