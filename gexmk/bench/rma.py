"""Host and network RMA from Python and from nogil loops, beside mpi4py one-sided."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from itertools import repeat

from gexmk.bench.common import _MPI_ENV
from gexmk.bench.timing import aligned_bytes, measure
from gexmk.bench.extension import build_extension, find_bench_file, installed_extension, load_extension


# ---- the gexmk job ---------------------------------------------------------------------

def _stats_us(m):
    """measure()'s figures for one case in µs: median_us, min_us, p90_us, batch, rounds."""
    return {(k[:-3] + "_us" if k.endswith("_ns") else k): (v / 1e3 if k.endswith("_ns") else v)
            for k, v in m.items()}


def _measure_gexmk(tm, peer, seg_size, args, ext, ad):
    import numpy as np
    import gexmk

    sizes = args.sizes
    res = {"transport": tm.transport(peer), "peer": peer, "per_size": {}, "small": {}, "nogil": {}}
    put, get, copyto = tm.put, tm.get, np.copyto
    base = tm.addr(peer, 0)
    iters, bns = args.iters, args.batch_us * 1e3

    # 8 B operations from Python.
    src8, dst8, loc8 = aligned_bytes(8, True), aligned_bytes(8), aligned_bytes(8)
    put_val, get_val, put_nbi = tm.put_val, tm.get_val, tm.put_nbi
    a_addr = tm.addr(peer, seg_size - 64)
    FADD = gexmk.OP_FADD
    op = ad.op

    def c_put(k):
        for _ in repeat(None, k):
            put(peer, base, src8)

    def c_get(k):
        for _ in repeat(None, k):
            get(dst8, peer, base)

    def c_put_val(k):
        for _ in repeat(None, k):
            put_val(peer, base, 12345)

    def c_get_val(k):
        for _ in repeat(None, k):
            get_val(peer, base)

    def c_put_nbi(k):
        for _ in repeat(None, k):
            put_nbi(peer, base, src8)

    def c_fadd(k):
        for _ in repeat(None, k):
            op(peer, a_addr, FADD, 1)

    def c_copy8(k):
        for _ in repeat(None, k):
            copyto(loc8, src8)

    cases = {"put": c_put, "get": c_get, "put_val": c_put_val, "get_val": c_get_val,
             "put_nbi": (c_put_nbi, gexmk.nbi_wait), "atomic_fadd": c_fadd, "numpy_copyto": c_copy8}
    try:
        op(peer, a_addr, FADD, 0)
    except gexmk.UnsupportedError as exc:     # e.g. GEXMK_TRANSPORT=pvm: no remote atomics
        del cases["atomic_fadd"]
        res["atomic_note"] = str(exc)
    small = measure(cases, iters, bns)
    res["small"] = {k: _stats_us(v) for k, v in small.items()}

    # Per size: put, get and the memcpy baseline, interleaved.
    for n in sizes:
        src, dst, cpy = aligned_bytes(n, True), aligned_bytes(n), aligned_bytes(n)

        def s_put(k, src=src):
            for _ in repeat(None, k):
                put(peer, base, src)

        def s_get(k, dst=dst):
            for _ in repeat(None, k):
                get(dst, peer, base)

        def s_copy(k, src=src, cpy=cpy):
            for _ in repeat(None, k):
                copyto(cpy, src)

        m = measure({"put": s_put, "get": s_get, "copy": s_copy}, iters, bns)
        res["per_size"][str(n)] = {k: _stats_us(v) for k, v in m.items()}
    # The bytes arrived: a benchmark that measured no copy would be worse than none.
    check = np.empty(min(sizes[-1], 4096), dtype=np.uint8)
    tm.get(check, peer, base)
    if not np.array_equal(check, np.arange(sizes[-1], dtype=np.uint8)[:check.size]):
        raise RuntimeError("gexmk.bench: data read back from the peer differs from what was put")

    # The cimport API in nogil loops.
    if ext is not None:
        big = sizes[-1]
        bsrc, bdst = aligned_bytes(big, True), aligned_bytes(big)
        cases = {
            "put8": lambda k: ext.put8(tm, peer, base, k),
            "put_nbi8": lambda k: ext.put_nbi8(tm, peer, base, k),
            "get8": lambda k: ext.get8(tm, peer, base, k),
        }
        m = measure(cases, iters, max(bns, 1e6))
        res["nogil"] = {k: _stats_us(v) for k, v in m.items()}
        m = measure({"put_big": lambda k: ext.put_buffer(tm, peer, base, bsrc, k),
                     "memcpy_big": lambda k: ext.memcpy_buffer(bdst, bsrc, k)}, iters, bns)
        res["nogil"].update({k: _stats_us(v) for k, v in m.items()})
        res["nogil"]["big_size"] = big
    return res


def _job(args):
    """Body of every rank; rank 0 returns the results, the others None."""
    import gexmk

    ext, ext_note = None, None
    rank_env = next((os.environ[k] for k in ("GEXMK_RANK",) + _MPI_ENV if k in os.environ), "0")
    if rank_env.strip() == "0" and not args.no_cython:
        path = os.environ.get("GEXMK_BENCH_EXT")
        try:
            if path is None:            # not launched by our parent
                path = installed_extension()
            if path is None:            # ... and not installed: build here
                with tempfile.TemporaryDirectory(prefix="gexmk-bench-") as tmp:
                    ext = load_extension(build_extension(outdir=tmp))  # loaded: the file may go
            elif path.startswith("skip:"):
                ext_note = path[5:]
            else:
                ext = load_extension(path)
        except Exception as exc:        # reported, not fatal: the Python figures stand alone
            ext_note = f"{type(exc).__name__}: {exc}"
    seg_size = max(args.sizes[-1], 16 << 10) + (64 << 10)
    with gexmk.init() as client:
        client.segment_attach(seg_size)
        tm = client.tm
        ad = tm.ad_create(gexmk.DT_I64, gexmk.OP_FADD)
        peer = 1 if tm.size > 1 else 0
        res = None
        if tm.rank == 0:
            res = _measure_gexmk(tm, peer, seg_size, args, ext, ad)
            res["nprocs"] = tm.size
            if ext is None:
                res["nogil_note"] = ext_note or "disabled with --no-cython"
            else:
                res["nogil_module"] = getattr(ext, "__file__", None)
        tm.barrier()
    return res


# ---- the mpi4py baseline ---------------------------------------------------------------

def _python_flags():
    return ["-P"] if getattr(sys.flags, "safe_path", False) else []


def run_mpi_baseline(args) -> dict:
    """Run bench/mpi4py_rma.py under ``mpiexec -n 2``; its JSON, or
    ``{"skipped": reason}``."""
    script = find_bench_file("mpi4py_rma.py")
    if script is None:
        return {"skipped": "mpi4py_rma.py is neither installed (gexmk/_bench) nor in a source tree"}
    if importlib.util.find_spec("mpi4py") is None:
        return {"skipped": "mpi4py is not installed (pip install mpi4py mpich)"}
    mpiexec = shutil.which("mpiexec")
    if mpiexec is None:
        return {"skipped": "mpiexec is not on PATH"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("GEXMK_")}
    cmd = [mpiexec, "-n", "2", sys.executable, *_python_flags(), str(script),
           "--sizes", ",".join(str(s) for s in args.sizes), "--iters", str(args.iters),
           "--batch-us", str(args.batch_us)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"skipped": f"mpiexec did not finish in {args.timeout:g} s"}
    if r.returncode != 0:
        tail = " | ".join((r.stderr or r.stdout).strip().splitlines()[-5:])
        return {"skipped": f"mpiexec exited {r.returncode}: {tail}"}
    try:
        out = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"skipped": f"no JSON from the baseline: {r.stdout[-300:]!r}"}
    out["script"] = str(script)
    return out
