"""gexmk's main benchmark: ``python -m gexmk.bench [-n 2] [--sizes 8:4M] [--iters N]
[--no-mpi] [--no-cython] [--json out.json]``.

Run outside a job, it builds the Cython loop module (``bench/nogil_loop.pyx``)
the way an outside project would, relaunches itself as a job of ``-n`` ranks
under ``python -m gexmk.run``, then runs the mpi4py baseline
(``bench/mpi4py_rma.py`` under ``mpiexec -n 2``) and prints every figure beside
its baseline.  Run inside a job (``python -m gexmk.run -n 2 -m gexmk.bench``),
rank 0 does all of that itself.  Rank 0 times operations on team rank 1 (itself
in a job of one); the other ranks wait in a barrier.

What is measured, all in the same run:

- per size (8 B ... 4 MiB): blocking ``tm.put`` and ``tm.get`` from Python, and
  ``numpy.copyto`` between two local arrays of that size (the memcpy baseline),
  interleaved batch by batch; mpi4py ``Put``/``Get`` + ``Flush(target)`` on a
  ``Win.Allocate`` window under ``Lock_all`` (passive target);
- 8 B operations from Python: put, get, put_val, get_val, put_nbi (issue time),
  atomic FADD, beside mpi4py Put+Flush, Get+Flush, Put without flush,
  Fetch_and_op+Flush;
- the cimport API in nogil loops (``rma.put``/``put_nbi``/``get`` 8 B, and
  ``rma.put`` of the largest size beside a C ``memcpy`` loop);
- the heat-equation example (``examples/heat.py``: Jacobi sweeps, halo rows by
  puts + ``tm.barrier()``) beside the same program with mpi4py ``Win.Put`` +
  ``Win.Fence`` (``examples/heat_mpi4py.py``), per iteration, for each grid of
  ``--heat-grids`` and rank count of ``--heat-ranks`` (each result checked
  bitwise against serial numpy).

Everything it runs is installed with the package (``gexmk/_bench/``: the
mpi4py scripts, the heat example, and the nogil loop module built with the
package), so an installed gexmk runs it in full from any directory; in a
source tree without a build it falls back on ``bench/`` and ``examples/``
(and builds the loop module on the fly).

Method: each operation runs in batches of ``k`` calls timed with
``time.perf_counter_ns`` (``k`` calibrated so that a batch lasts about
``--batch-us``); the figure is the median over ``--iters`` batches of the
per-call time, with the garbage collector off.  Cases compared with each other
are interleaved batch by batch, so drift hits both alike.  Latency in µs,
bandwidth in GB/s (10^9 bytes/s).  Timings are reported, never asserted.

``GEXMK_TRANSPORT=pvm python -m gexmk.bench --no-mpi`` measures the
process_vm path (a peer's client-allocated segment) instead of mapped shared
memory; remote atomics are not offered there and are reported as such.
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from itertools import repeat
from pathlib import Path

__all__ = ["main", "measure", "aligned_bytes", "parse_sizes", "build_extension", "find_bench_file",
           "installed_extension", "load_extension", "run_heat", "BuildError"]

#: Targets of the issue that asked for this benchmark (see ``_targets``).
PUT8_MAX_US = 0.3            # 8 B blocking put from Python, median
PUT8_VS_MPI = 0.25           # ... and at most this fraction of mpi4py Put+Flush
NOGIL_PUT8_MAX_NS = 10.0     # 8 B rma.put in a nogil loop
NBI_RATE_VS_MPI = 2.5        # put_nbi issue rate from Python / mpi4py Put issue rate
NOGIL_NBI_MIN_RATE = 20e6    # rma.put_nbi per second from a nogil loop
BIG_VS_MEMCPY = 0.9          # 4 MiB put bandwidth / memcpy bandwidth
BIG_SIZE = 4 << 20
HEAT_VS_FENCE = 0.8          # heat-equation iteration / mpi4py Win.Put + Win.Fence iteration

_MPI_ENV = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK")
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
          "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}


class BuildError(RuntimeError):
    """The Cython loop module could not be built (the reason is the message)."""


# ---- sizes -----------------------------------------------------------------------------

def parse_size(text: str) -> int:
    """``"8"``, ``"4K"``, ``"4M"``, ``"1MiB"`` -> bytes (binary units)."""
    t = text.strip().upper()
    num = t.rstrip("BKMGI")
    unit = t[len(num):]
    if not num.isdigit() or unit not in _UNITS:
        raise ValueError(f"size {text!r}: expected a number of bytes with an optional K, M or G suffix")
    return int(num) * _UNITS[unit]


def parse_sizes(spec: str) -> list:
    """``"MIN:MAX[:FACTOR]"`` (powers of FACTOR, default 4, from MIN; MAX is always
    included) or a comma list ``"8,4K,4M"`` -> sorted list of byte counts."""
    if ":" in spec:
        parts = spec.split(":")
        if len(parts) not in (2, 3):
            raise ValueError(f"--sizes {spec!r}: expected MIN:MAX or MIN:MAX:FACTOR")
        lo, hi = parse_size(parts[0]), parse_size(parts[1])
        factor = int(parts[2]) if len(parts) == 3 else 4
        if lo < 1 or hi < lo or factor < 2:
            raise ValueError(f"--sizes {spec!r}: need 1 <= MIN <= MAX and FACTOR >= 2")
        out, s = [], lo
        while s < hi:
            out.append(s)
            s *= factor
        out.append(hi)
        return out
    out = sorted({parse_size(p) for p in spec.split(",") if p.strip()})
    if not out or out[0] < 1:
        raise ValueError(f"--sizes {spec!r}: sizes must be at least 1 byte")
    return out


def fmt_size(n: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


# ---- timing ----------------------------------------------------------------------------

def _time_batch(fn, post, k):
    t0 = time.perf_counter_ns()
    fn(k)
    t1 = time.perf_counter_ns()
    if post is not None:
        post()
    return t1 - t0


def measure(cases: dict, iters: int = 300, batch_ns: float = 200e3, max_seconds: float = 3.0) -> dict:
    """Time each case of ``cases`` (name -> ``fn(k)`` running k operations, or
    ``(fn, post)`` where ``post()`` runs untimed after each batch).

    Each case gets a batch size ``k`` calibrated so that one batch lasts about
    ``batch_ns``; then ``iters`` rounds time one batch of every case in turn
    (interleaved), fewer when a case would take longer than ``max_seconds``
    (at least 5 rounds).  Returns name -> dict with ``median_ns``, ``min_ns``,
    ``p90_ns`` (per operation), ``batch`` and ``rounds``.
    """
    norm = {n: (c if isinstance(c, tuple) else (c, None)) for n, c in cases.items()}
    enabled = gc.isenabled()
    gc.disable()
    try:
        ks, est = {}, {}
        for name, (fn, post) in norm.items():
            k, dt = 1, _time_batch(fn, post, 1)           # also the warm-up
            while dt < batch_ns and k < 10_000_000:
                k = min(10_000_000, max(2 * k, int(k * batch_ns / max(dt, 1) * 1.1)))
                dt = _time_batch(fn, post, k)
            ks[name], est[name] = k, dt
        total = sum(est.values())
        rounds = max(5, min(iters, int(max_seconds * 1e9 * len(norm) / max(total, 1)) or 5))
        samples = {name: [] for name in norm}
        for _ in range(rounds):
            for name, (fn, post) in norm.items():
                samples[name].append(_time_batch(fn, post, ks[name]) / ks[name])
    finally:
        if enabled:
            gc.enable()
    out = {}
    for name, xs in samples.items():
        xs.sort()
        out[name] = {"median_ns": statistics.median(xs), "min_ns": xs[0],
                     "p90_ns": xs[min(len(xs) - 1, int(0.9 * len(xs)))],
                     "batch": ks[name], "rounds": len(xs)}
    return out


def aligned_bytes(n: int, pattern: bool = False, align: int = 4096):
    """A numpy uint8 array of ``n`` bytes starting on an ``align`` boundary, every
    page touched: filled with 0, 1, ... 255, 0, ... when ``pattern``, else with 7.
    Every buffer of the benchmark (and its baselines) is page-aligned, so that no
    figure depends on where malloc happened to place it (memcpy speed does, for
    example through 4 KiB aliasing between source and destination)."""
    import numpy as np
    raw = np.empty(n + align, dtype=np.uint8)
    off = (-raw.ctypes.data) % align
    a = raw[off:off + n]
    if pattern:
        a[:] = np.arange(n, dtype=np.uint8)     # wraps at 256
    else:
        a.fill(7)
    return a


# ---- the Cython loop module ------------------------------------------------------------

def find_bench_file(name: str):
    """A file the benchmark runs: ``gexmk/_bench/<name>`` of the installed
    package, else ``bench/<name>`` or ``examples/<name>`` of a gexmk source
    tree beside the package this module was loaded from (developer build) or
    under the current directory.  None when none has it."""
    pkg = Path(os.path.realpath(__file__)).parent
    p = pkg / "_bench" / name
    if p.is_file():
        return p
    for root in (pkg.parent, Path.cwd()):
        for sub in ("bench", "examples"):
            p = root / sub / name
            if p.is_file():
                return p
    return None


def installed_extension():
    """Path of the nogil loop module built and installed with the package
    (``gexmk/_bench/nogil_loop*.so``), or None."""
    d = Path(os.path.realpath(__file__)).parent / "_bench"
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    p = d / ("nogil_loop" + suffix)
    return str(p) if p.is_file() else None


def _run_tool(cmd, what):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(f"{what} failed: {exc}") from exc
    if r.returncode != 0:
        tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-12:])
        raise BuildError(f"{what} failed (exit {r.returncode}):\n{tail}")


def build_extension(pyx=None, outdir=None) -> str:
    """Compile ``bench/nogil_loop.pyx`` (or ``pyx``) against the importable gexmk,
    as an outside project does (``from gexmk cimport rma``; the directory holding
    the gexmk package on Cython's include path; ``gexmk.get_include()`` for the
    C compiler), into ``outdir`` (default: a new temporary directory, left for
    the caller to remove).  Returns the path of the extension module; raises
    :class:`BuildError` saying why it could not be built."""
    import gexmk

    pyx = Path(pyx) if pyx is not None else find_bench_file("nogil_loop.pyx")
    if pyx is None:
        raise BuildError("bench/nogil_loop.pyx not found (run from a gexmk source checkout)")
    if importlib.util.find_spec("Cython") is None:
        raise BuildError("Cython is not installed (pip install cython)")
    cc = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    if not cc or shutil.which(cc[0]) is None:
        raise BuildError(f"no C compiler ({cc[0] if cc else 'CC'} not found)")
    pkg = Path(gexmk.__file__).parent
    includes = [str(pkg.parent)]
    # A tools/dev_build.sh tree links gexmk/*.pxd but not gexmk/lib/*.pxd, which
    # rma.pxd cimports: then fall back on the source tree its links point into.
    if not (pkg / "lib" / "gx.pxd").is_file():
        src_root = Path(os.path.realpath(pkg / "rma.pxd")).parent.parent
        if (src_root / "gexmk" / "lib" / "gx.pxd").is_file():
            includes.append(str(src_root))
    out = Path(outdir) if outdir is not None else Path(tempfile.mkdtemp(prefix="gexmk-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    c_file = out / (pyx.stem + ".c")
    so_file = out / (pyx.stem + sysconfig.get_config_var("EXT_SUFFIX"))
    _run_tool([sys.executable, "-m", "cython", "-3", *sum((["-I", i] for i in includes), []),
               "-o", str(c_file), str(pyx)], "cython")
    py_inc = {sysconfig.get_paths()["include"], sysconfig.get_paths()["platinclude"]}
    _run_tool([*cc, "-O2", "-shared", "-fPIC", *(f"-I{i}" for i in sorted(py_inc)),
               f"-I{gexmk.get_include()}", str(c_file), "-o", str(so_file)], "C compiler")
    return str(so_file)


def load_extension(path):
    """Import the extension module built by :func:`build_extension` from its path."""
    name = Path(path).name.split(".")[0]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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


# ---- report ----------------------------------------------------------------------------

def _gbps(nbytes, us):
    return nbytes / (us * 1e3) if us and us > 0 else float("nan")


def _get(d, *keys):
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def _status(*parts):
    """One target's status from its parts (True met, False missed, None not measured):
    "MISS" if any part missed, "met" if all were met, "part" if the measured ones
    were met but some were not measured, "n/a" if none was measured."""
    if any(p is False for p in parts):
        return "MISS"
    if all(p is None for p in parts):
        return "n/a"
    return "part" if any(p is None for p in parts) else "met"


def _targets(r):
    """[(status, text)] for the issue's targets (status: see ``_status``)."""
    g, mpi = r["gexmk"], r.get("mpi4py", {})
    out = []
    put8 = g["small"]["put"]["median_us"]
    mpi_pf = _get(mpi, "small", "put_flush", "median_us")
    text = f"8 B blocking put from Python: {put8:.3f} µs (target <= {PUT8_MAX_US} µs)"
    parts = [put8 <= PUT8_MAX_US]
    if mpi_pf:
        text += f"; {put8 / mpi_pf:.3f} x mpi4py Put+Flush {mpi_pf:.3f} µs (target <= {PUT8_VS_MPI})"
        parts.append(put8 <= PUT8_VS_MPI * mpi_pf)
    else:
        text += "; mpi4py baseline not run"
        parts.append(None)
    out.append((_status(*parts), text))

    ng = g.get("nogil") or {}
    if "put8" in ng:
        ns = ng["put8"]["median_us"] * 1e3
        out.append((_status(ns <= NOGIL_PUT8_MAX_NS),
                    f"8 B rma.put in a nogil loop: {ns:.2f} ns per put (target <= {NOGIL_PUT8_MAX_NS:g} ns)"))
    else:
        out.append(("n/a", "8 B rma.put in a nogil loop: not measured (" + g.get("nogil_note", "") + ")"))

    nbi = g["small"]["put_nbi"]["median_us"]
    mpi_pi = _get(mpi, "small", "put_issue", "median_us")
    if mpi_pi:
        ratio = mpi_pi / nbi
        out.append((_status(ratio >= NBI_RATE_VS_MPI),
                    f"8 B put_nbi issue rate from Python: {1 / nbi:.2f} M/s = {ratio:.2f} x mpi4py Put "
                    f"(no flush) {1 / mpi_pi:.2f} M/s (target >= {NBI_RATE_VS_MPI} x)"))
    else:
        out.append(("n/a", f"8 B put_nbi issue rate from Python: {1 / nbi:.2f} M/s; mpi4py baseline not run"))
    if "put_nbi8" in ng:
        rate = 1e6 / ng["put_nbi8"]["median_us"]
        out.append((_status(rate >= NOGIL_NBI_MIN_RATE),
                    f"8 B rma.put_nbi from a nogil loop: {rate / 1e6:.0f} M/s (target >= "
                    f"{NOGIL_NBI_MIN_RATE / 1e6:g} M/s)"))
    else:
        out.append(("n/a", "8 B rma.put_nbi from a nogil loop: not measured"))

    big = r["sizes"][-1]
    ps = g["per_size"][str(big)]
    if big == BIG_SIZE:
        bw, cbw = _gbps(big, ps["put"]["median_us"]), _gbps(big, ps["copy"]["median_us"])
        mpi_b = _get(mpi, "per_size", str(big), "put_flush", "median_us")
        text = (f"4 MiB put from Python: {bw:.2f} GB/s = {bw / cbw:.2f} x numpy.copyto {cbw:.2f} GB/s "
                f"(target >= {BIG_VS_MEMCPY})")
        parts = [bw >= BIG_VS_MEMCPY * cbw]
        if mpi_b:
            mbw = _gbps(big, mpi_b)
            text += f"; {bw / mbw:.2f} x mpi4py Put+Flush {mbw:.2f} GB/s (target: not below)"
            parts.append(bw >= mbw)
        else:
            text += "; mpi4py baseline not run"
            parts.append(None)
        out.append((_status(*parts), text))
    else:
        out.append(("n/a", "4 MiB put: not in --sizes"))
    heat = r.get("heat") or {}
    for run in heat.get("runs", []):
        gus, mus = run["gexmk"].get("per_iter_us"), run["mpi4py"].get("per_iter_us")
        what = f"heat equation {run['grid']}x{run['grid']}, {run['ranks']} ranks, per iteration"
        if gus is None:
            out.append(("MISS", f"{what}: the gexmk run failed ({run['gexmk'].get('skipped')})"))
        elif mus is None:
            out.append(("n/a", f"{what}: {gus:.1f} µs; mpi4py baseline not run"))
        else:
            out.append((_status(gus <= HEAT_VS_FENCE * mus),
                        f"{what}: {gus:.1f} µs = {gus / mus:.2f} x mpi4py Win.Fence {mus:.1f} µs "
                        f"(target <= {HEAT_VS_FENCE})"))
    return out


def _report_heat(r, p):
    heat = r.get("heat") or {"skipped": "not run"}
    if "skipped" in heat:
        p(f"Heat equation: skipped - {heat['skipped']}")
        p()
        return
    p("Heat equation (examples/heat.py: Jacobi sweeps, halo rows by put + tm.barrier) beside "
      "mpi4py Win.Put + Win.Fence (examples/heat_mpi4py.py), µs per iteration (exch: of which "
      "halo exchange and synchronisation, on rank 0)")
    p(f"{'grid':>11} {'ranks':>5} {'iters':>5} {'gexmk':>10} {'exch':>9} {'mpi4py':>10} {'exch':>9} "
      f"{'gexmk/mpi':>9}  check")
    for run in heat["runs"]:
        g, m = run["gexmk"], run["mpi4py"]
        gus = g.get("per_iter_us")
        mus = m.get("per_iter_us")
        gtxt = f"{gus:10.1f}" if gus is not None else f"{'failed':>10}"
        mtxt = f"{mus:10.1f}" if mus is not None else f"{'n/a':>10}"
        gx, mx = g.get("exchange_us"), m.get("exchange_us")
        gtxt += f" {gx:9.1f}" if gx is not None else f" {'':>9}"
        mtxt += f" {mx:9.1f}" if mx is not None else f" {'':>9}"
        ratio = f"{gus / mus:9.2f}" if gus and mus else f"{'':>9}"
        checks = []
        for who, d in (("gexmk", g), ("mpi4py", m)):
            if "skipped" in d:
                checks.append(f"{who}: {d['skipped']}")
            elif d.get("ok") is False:
                checks.append(f"{who}: DIFFERS from serial")
        grid = f"{run['grid']}x{run['grid']}"
        p(f"{grid:>11} {run['ranks']:>5} {run['iters']:>5} {gtxt} {mtxt} {ratio}  "
          + ("; ".join(checks) if checks else "bitwise equal to serial numpy"))
    p()


def report(r, file=None):
    """Print the results dict ``r`` (see ``main``) as tables with baselines."""
    out = file or sys.stdout

    def p(line=""):
        print(line, file=out)

    g, mpi = r["gexmk"], r.get("mpi4py", {})
    have_mpi = "skipped" not in mpi
    m = r["meta"]
    procs = f"{g['nprocs']} process" + ("es" if g["nprocs"] != 1 else "")
    p(f"gexmk {m['gexmk']} bench: {procs} on one node, rank 0 -> rank {g['peer']} "
      f"(transport {g['transport']}); {m['cpu']}, {m['ncpu']} CPUs; "
      f"Python {m['python']}, numpy {m['numpy']}")
    p(f"medians over up to {r['args']['iters']} timed batches of ~{r['args']['batch_us']:g} µs "
      "(perf_counter_ns per batch, reported per operation)")
    load = m.get("loadavg_at_start")
    if load is not None and load > 0.5:
        p(f"warning: the machine was busy when the benchmark started (1-min load average "
          f"{load:.2f} on {m['ncpu']} CPUs): expect noisy figures, rerun on an idle machine")
    if have_mpi:
        p(f"baseline: mpi4py {mpi['mpi4py']} on {mpi['library']} - Win.Allocate, Lock_all, "
          "Put/Get + Flush(target), 2 processes")
    else:
        p(f"baseline: mpi4py skipped - {mpi['skipped']}")
    p()

    # Latency table.
    p("Blocking put/get from Python, median latency (µs)"
      + ("; mpi4py: Put/Get + Flush(target)" if have_mpi else ""))
    hdr = f"{'size':>8} {'put':>9} {'get':>9}"
    if have_mpi:
        hdr += f" | {'mpi Put':>9} {'mpi Get':>9} {'put x':>7} {'get x':>7}"
    p(hdr)
    for n in r["sizes"]:
        ps = g["per_size"][str(n)]
        line = f"{fmt_size(n):>8} {ps['put']['median_us']:9.3f} {ps['get']['median_us']:9.3f}"
        if have_mpi:
            mp = mpi["per_size"][str(n)]
            mput, mget = mp["put_flush"]["median_us"], mp["get_flush"]["median_us"]
            line += (f" | {mput:9.3f} {mget:9.3f} {mput / ps['put']['median_us']:6.2f}x"
                     f" {mget / ps['get']['median_us']:6.2f}x")
        p(line)
    if have_mpi:
        p("(put x / get x: how many times faster gexmk is than mpi4py)")
    p()

    # Bandwidth table.
    p("Bandwidth (GB/s = 1e9 B/s) beside memcpy (numpy.copyto between two local arrays of the size)")
    hdr = f"{'size':>8} {'put':>8} {'get':>8} {'memcpy':>8} {'put/memcpy':>10}"
    if have_mpi:
        hdr += f" | {'mpi Put':>8} {'put/mpi':>8}"
    p(hdr)
    for n in r["sizes"]:
        ps = g["per_size"][str(n)]
        bw, gbw = _gbps(n, ps["put"]["median_us"]), _gbps(n, ps["get"]["median_us"])
        cbw = _gbps(n, ps["copy"]["median_us"])
        line = f"{fmt_size(n):>8} {bw:8.3f} {gbw:8.3f} {cbw:8.3f} {bw / cbw:10.2f}"
        if have_mpi:
            mbw = _gbps(n, mpi["per_size"][str(n)]["put_flush"]["median_us"])
            line += f" | {mbw:8.3f} {bw / mbw:7.2f}x"
        p(line)
    p()

    # 8 B operations.
    p("8 B operations from Python (µs per call, median)")
    rows = [("put (blocking)", "put", "Put+Flush", "put_flush"),
            ("get (blocking)", "get", "Get+Flush", "get_flush"),
            ("put_val", "put_val", "Put+Flush", "put_flush"),
            ("get_val", "get_val", "Get+Flush", "get_flush"),
            ("put_nbi (issue)", "put_nbi", "Put, no flush", "put_issue"),
            ("atomic FADD (I64)", "atomic_fadd", "Fetch_and_op+Flush", "fetch_and_op_flush"),
            ("numpy.copyto 8 B", "numpy_copyto", None, None)]
    p(f"{'operation':<20} {'gexmk':>8} {'rate M/s':>9}"
      + (f" | {'mpi4py':<19} {'µs':>8} {'x':>7}" if have_mpi else ""))
    for label, key, mlabel, mkey in rows:
        if key not in g["small"]:
            p(f"{label:<20} {'n/a':>8}   ({g.get('atomic_note', 'not measured')})")
            continue
        us = g["small"][key]["median_us"]
        line = f"{label:<20} {us:8.3f} {1 / us:9.2f}"
        if have_mpi and mkey:
            mus = mpi["small"][mkey]["median_us"]
            line += f" | {mlabel:<19} {mus:8.3f} {mus / us:6.2f}x"
        elif have_mpi:
            line += " | (numpy's own per-call cost dominates at 8 B)"
        p(line)
    p()

    # nogil loops.
    ng = g.get("nogil") or {}
    if "put8" in ng:
        big = ng["big_size"]
        how = ("built with the package" if "_bench" in str(g.get("nogil_module") or "")
               else "built on the fly")
        p(f"Cython nogil loops through `from gexmk cimport rma` ({how})")
        p(f"{'operation':<26} {'ns/op':>9} {'rate':>14}")
        for label, key in (("rma.put 8 B", "put8"), ("rma.put_nbi 8 B (+quiet)", "put_nbi8"),
                           ("rma.get 8 B", "get8")):
            ns = ng[key]["median_us"] * 1e3
            p(f"{label:<26} {ns:9.2f} {1e3 / ns:10.1f} M/s")
        pb, mb = ng["put_big"]["median_us"], ng["memcpy_big"]["median_us"]
        p(f"{'rma.put ' + fmt_size(big):<26} {pb * 1e3:9.0f} {_gbps(big, pb):10.2f} GB/s")
        p(f"{'C memcpy ' + fmt_size(big) + ' (baseline)':<26} {mb * 1e3:9.0f} {_gbps(big, mb):10.2f} GB/s"
          f"   put/memcpy {mb / pb:.2f}")
    else:
        p(f"Cython nogil loops: skipped - {g.get('nogil_note', 'not built')}")
    p()
    _report_heat(r, p)
    p(r["gpu_note"])
    p()
    p("Targets")
    for status, text in r["targets"]:
        p(f"  [{status:<4}] {text}")


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
    r = {"meta": _meta(), "args": {"sizes": args.sizes, "iters": args.iters, "batch_us": args.batch_us,
                                   "n": args.n},
         "sizes": args.sizes, "gexmk": gexmk_res, "mpi4py": mpi, "heat": heat, "gpu_note": _gpu_note()}
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


if __name__ == "__main__":
    sys.exit(main())
