"""gexmk's ``ofi`` transport beside raw libfabric (``bench/ofi/ofi_bench.c``) and
mpi4py/MPICH over libfabric tcp, measured in the same run.

    python -P bench/ofi_compare.py [--provider 'tcp;ofi_rxm'] [--rounds 3] [--json out.json]

Two processes on this node; gexmk is forced onto the network path
(``GEXMK_TRANSPORT=ofi``, ``GEXMK_OFI_PROVIDER=<provider>``).  Per provider
(default ``tcp;ofi_rxm`` and ``shm``) and per target-progress mode, side by side:

================  =============================================  ==============================
what              gexmk                                          baseline
================  =============================================  ==============================
8 B put latency   ``tm.put`` from Python (remote completion);    ``fi_writemsg`` +
                  ``rma.put`` from a nogil loop (for reference)  ``FI_DELIVERY_COMPLETE``
8 B get latency   ``tm.get`` from Python; ``rma.get`` (nogil)    ``fi_read``
bandwidth         W x ``tm.put_nbi(..., lc=LC_GROUP)`` then      W x ``fi_write``, reap W
                  ``gexmk.nbi_wait()``                           completions, then an 8 B
                                                                 ``fi_read`` flush (``-f``: the
                                                                 window ends with its data at the
                                                                 target, as after ``nbi_wait``);
                                                                 for information also without
                                                                 the flush (transmit completion)
                                                                 and, ``-d``, W x DC
                                                                 ``fi_writemsg``
issue cost        W x 8 B ``rma.put_nbi`` in a nogil loop (the   W x bare 8 B ``fi_write``
                  loop timed, ``rma.nbi_wait`` untimed)          (``issue_ns``; ``-d``: DC)
put_nb            W x 8 B ``tm.put_nb`` (``lc=LC_NOW``) from     C's ``-d`` issue_ns (DC
                  Python, the calls timed, ``wait_all``          ``fi_writemsg``); C's DC
                  untimed; and the window with ``wait_all``,     write latency (the window
                  per op                                         per op below 1x: overlap)
================  =============================================  ==============================

Target progress: ``GEXMK_PROGRESS_THREAD=auto`` (a thread sleeping in
``fi_cq_sread``) beside ``ofi_bench -P wait`` (the target sleeps on the CQ's
wait fd), and ``spin`` (a busy-polling thread) beside ``ofi_bench -P poll`` (a
busy target).  On ``tcp;ofi_rxm`` also mpi4py on the PyPI MPICH wheel forced
onto its libfabric's tcp provider (``MPIR_CVAR_CH4_NETMOD=ofi``,
``FI_PROVIDER=tcp``, ``MPIR_CVAR_NOLOCAL=1``; the provider MPICH chose is read
from its ``MPIR_CVAR_DEBUG_SUMMARY`` output) running ``bench/mpi4py_rma.py``:
``Put``/``Get`` + ``Flush`` beside gexmk's blocking put/get; and, to show
which completion level that Put+Flush costs as much as, the same ``ofi_bench``
binary run on MPICH's own libfabric (the one mpi4py's libmpi maps, through
``LD_LIBRARY_PATH``) with ``-p tcp -P poll -s 8``: its transmit-complete
``fi_write``, DELIVERY_COMPLETE ``fi_writemsg`` and ``fi_read`` beside
``Put``/``Get`` + ``Flush`` (info rows, and a printed reading of them).

Method: the C baseline is built with meson into a temporary directory (never
installed), the Cython loops (``bench/ofi/nogil_ofi.pyx``) with
``gexmk.bench.build_extension``.  Every configuration is a fresh pair of
processes; runs alternate (gexmk auto, C wait, C wait -d, gexmk spin, C poll,
C poll -d[, mpi4py, C on MPICH's libfabric]), in reverse order every other
round.  Within a run, gexmk's Python figures use ``gexmk.bench.measure``
(cases interleaved; by default timed batches of ~20 µs, so that the Python
timing harness weighs about as little as ofi_bench's per-sample clock reads);
the nogil loops and the C program take one sample per
operation (latency) or per window (bandwidth, issue cost).  Reported: the
median over rounds of each run's median, and the minimum over rounds of each
run's minimum (the best round for bandwidth).  Ratios are gexmk / baseline of
the medians.  Timings are reported, never asserted; the 1-minute load average
is printed because this is meant to run on small shared machines.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent           # bench/
PROVIDERS = ("tcp;ofi_rxm", "shm")
# (label, GEXMK_PROGRESS_THREAD, ofi_bench -P)
MODES = (("sleep", "auto", "wait"), ("busy", "spin", "poll"))

LAT_MAX = 1.2        # gexmk / C, 8 B blocking put and get
BW_MIN = 0.9         # gexmk / C, windowed put bandwidth
ISSUE_MAX = 1.1      # gexmk / C, 8 B put_nbi issue cost
MPI_MAX = 1.0        # gexmk / mpi4py, 8 B Put+Flush and Get+Flush

KIB, MIB = 1 << 10, 1 << 20


def _sizes(text):
    from gexmk.bench import parse_sizes
    return parse_sizes(text)


def _fmt_size(n):
    for unit, scale in (("MiB", MIB), ("KiB", KIB)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def _load():
    try:
        return tuple(round(x, 2) for x in os.getloadavg())
    except OSError:
        return None


def _stat(xs):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    return {"median": statistics.median(xs), "min": xs[0], "max": xs[-1], "n": len(xs)}


# ---- worker: runs inside the gexmk job (python -m gexmk.run -n 2) -----------------------

def _worker(args):
    import numpy as np
    import gexmk
    from itertools import repeat
    from gexmk.bench import aligned_bytes, load_extension, measure

    ext = load_extension(args.ext) if args.ext else None
    if args.initiator_thread == "off" and os.environ.get("GEXMK_RANK") == "0":
        # experiment: only the target runs a progress thread (as in ofi_bench)
        os.environ["GEXMK_PROGRESS_THREAD"] = "0"
    bw_sizes, W = args.bw_sizes, args.window
    span = max(16 * MIB, max(bw_sizes))            # as ofi_bench: >= 16 MiB, slots wrap
    with gexmk.init() as client:
        seg = client.segment_attach(span + 64 * KIB)
        tm = client.tm
        res = None
        if tm.rank == 0:
            peer = 1
            net = client.transports.get("ofi")
            res = {"transport": tm.transport(peer), "provider": net.provider if net else None,
                   "domain": net.domain_name if net else None,
                   "inject_size": net.inject_size if net else None,
                   "manual_progress": net.manual_progress if net else None,
                   "progress_thread": os.environ.get("GEXMK_PROGRESS_THREAD", "auto")}
            if res["transport"] != "ofi":
                raise RuntimeError(f"ofi_compare: the peer is reached through "
                                   f"{res['transport']!r}, not ofi")
            base = tm.addr(peer, 0)
            local = np.asarray(seg)                  # source buffers live in our segment
            src8 = local[span:span + 8]
            src8[:] = np.arange(8, dtype=np.uint8)
            dst8 = aligned_bytes(8)
            put, get, put_nbi, nbi_wait = tm.put, tm.get, tm.put_nbi, gexmk.nbi_wait
            LC_GROUP = gexmk.LC_GROUP

            def c_put(k):
                for _ in repeat(None, k):
                    put(peer, base, src8)

            def c_get(k):
                for _ in repeat(None, k):
                    get(dst8, peer, base)

            t_sec = time.monotonic()
            res["section_s"] = {}

            def section(name):
                nonlocal t_sec
                now = time.monotonic()
                res["section_s"][name] = round(now - t_sec, 3)
                t_sec = now

            for _ in range(3):                       # warm-up: connections, caches
                c_put(50)
                c_get(50)
            bns = args.batch_us * 1e3
            def c_empty(k):                          # the timing harness alone
                for _ in repeat(None, k):
                    pass

            m = measure({"put": c_put, "get": c_get}, args.iters, bns, args.cap)
            e = measure({"empty": c_empty}, args.iters, 0, args.cap)["empty"]   # k = 1
            res["harness_ns"] = {"per_batch": e["median_ns"],
                                 "per_op_put": e["median_ns"] / m["put"]["batch"]}
            res["lat_py_us"] = {k: {"median": v["median_ns"] / 1e3, "min": v["min_ns"] / 1e3,
                                    "batch": v["batch"], "rounds": v["rounds"]}
                                for k, v in m.items()}
            section("lat_py")

            if ext is not None:
                buf = np.empty(1000, dtype=np.float64)
                samples = {"put": [], "get": []}
                for _ in range(4):                   # interleaved chunks
                    n = ext.put8_lat(tm, peer, base, buf, args.cap / 8)
                    samples["put"].extend(buf[:n] / 1e3)
                    n = ext.get8_lat(tm, peer, base, buf, args.cap / 8)
                    samples["get"].extend(buf[:n] / 1e3)
                res["lat_nogil_us"] = {k: _stat(v) for k, v in samples.items()}
                section("lat_nogil")

            # Windowed bandwidth: W puts of `size` from our segment into the peer's,
            # slot i % (span // size) on both sides (as ofi_bench), then nbi_wait.
            # One size after the other, smallest first, each warmed up just before
            # it is timed, as ofi_bench does: loopback TCP carries state from one
            # size to the next (after 4 MiB windows, 64 KiB windows run at a
            # third of the speed they get after 64 KiB windows), so interleaving
            # sizes or warming all up front would measure another thing than C.
            m = {}
            for size in bw_sizes:
                nslots = max(1, span // size)
                slots = [(base + (i % nslots) * size, local[(i % nslots) * size:][:size])
                         for i in range(W)]

                def window(k, slots=slots):
                    for _ in repeat(None, k):
                        for dest, src in slots:
                            put_nbi(peer, dest, src, LC_GROUP)
                        nbi_wait()

                window(1)
                m.update(measure({size: window}, args.iters, bns, args.cap))
            res["bw_GBps"] = {str(s): {"median": W * s / m[s]["median_ns"],
                                       "best": W * s / m[s]["min_ns"], "rounds": m[s]["rounds"]}
                              for s in bw_sizes}
            section("bw")

            if ext is not None:
                out = np.empty(2000, dtype=np.float64)
                n = ext.put_nbi8_issue(tm, peer, base, W, out, args.cap)
                st = _stat(out[:n].tolist())
                st["mean"] = float(out[:n].mean())
                res["issue_ns"] = st
                section("issue")

            # put_nb with lc=LC_NOW (the default) from Python: W calls timed, each
            # returning once its source is copied, then wait_all untimed (as the
            # issue cost above); and the whole window, wait_all included, per op
            put_nb, wait_all = tm.put_nb, gexmk.wait_all
            issue, whole = [], []
            t_end = time.monotonic() + args.cap
            while len(issue) < 2000 and (time.monotonic() < t_end or len(issue) < 10):
                t0 = time.perf_counter_ns()
                evs = [put_nb(peer, base, src8) for _ in repeat(None, W)]
                t1 = time.perf_counter_ns()
                wait_all(evs)
                t2 = time.perf_counter_ns()
                issue.append((t1 - t0) / W)
                whole.append((t2 - t0) / W / 1e3)
            res["nb_issue_ns"] = _stat(issue)
            res["nb_window_us"] = _stat(whole)
            section("put_nb")
            res["load"] = _load()
        tm.barrier()
    if res is not None:
        with open(args.worker, "w") as f:
            json.dump(res, f)
    return 0


# ---- driver ---------------------------------------------------------------------------

class Skip(Exception):
    """A configuration that could not run (the message says why)."""


def _run(cmd, env, timeout, what):
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise Skip(f"{what}: no result within {timeout:g} s") from None
    if r.returncode != 0:
        tail = " | ".join((r.stderr or r.stdout).strip().splitlines()[-3:])
        raise Skip(f"{what}: exit {r.returncode}: {tail}")
    return r


def build_c(tmp):
    """meson setup + ninja of bench/ofi into tmp; path of ofi_bench."""
    meson, ninja = shutil.which("meson"), shutil.which("ninja")
    if meson is None or ninja is None:
        raise Skip("meson and ninja are needed to build bench/ofi (pip install meson ninja)")
    bdir = os.path.join(tmp, "ofi-build")
    _run([meson, "setup", bdir, str(BENCH / "ofi")], None, 300, "meson setup bench/ofi")
    _run([ninja, "-C", bdir], None, 300, "ninja (bench/ofi)")
    return os.path.join(bdir, "ofi_bench")


def run_gexmk(args, prov, pt_mode, ext, tmp):
    out = os.path.join(tmp, "gexmk.json")
    if os.path.exists(out):
        os.unlink(out)
    env = dict(os.environ, GEXMK_TRANSPORT="ofi", GEXMK_OFI_PROVIDER=prov,
               GEXMK_PROGRESS_THREAD=pt_mode)
    cmd = [sys.executable, "-P", "-m", "gexmk.run", "-n", "2", "--timeout", str(args.timeout),
           "--", "-P", str(Path(__file__).resolve()), "--worker", out,
           "--window", str(args.window), "--bw-sizes", ",".join(map(str, args.bw_sizes)),
           "--iters", str(args.iters), "--cap", str(args.cap), "--batch-us", str(args.batch_us),
           "--initiator-thread", args.initiator_thread]
    if ext:
        cmd += ["--ext", ext]
    _run(cmd, env, args.timeout + 10, f"gexmk job ({prov}, GEXMK_PROGRESS_THREAD={pt_mode})")
    with open(out) as f:
        return json.load(f)


def run_c(args, exe, prov, c_mode, dc=False):
    """ofi_bench's JSON; with dc, bandwidth and issue writes use FI_DELIVERY_COMPLETE
    (the completion gexmk's puts ask for) and the latency part is cut short.
    Without dc, -f: bandwidth windows are also timed ending with a read-back
    flush, i.e. with the data at the target, as a window ending in nbi_wait."""
    cmd = [exe, "-p", prov, "-P", c_mode, "-s", "8", "-b", ",".join(map(str, args.bw_sizes)),
           "-w", str(args.window), "-i", "100" if dc else "1000",
           "-t", str(min(args.cap, 0.3) if dc else args.cap),
           "-W", str(args.timeout), "--json"] + (["-d"] if dc else ["-f"])
    r = _run(cmd, None, args.timeout + 10, f"ofi_bench -p '{prov}' -P {c_mode}{' -d' if dc else ''}")
    return json.loads(r.stdout)


def run_mpi(args):
    script = BENCH / "mpi4py_rma.py"
    mpiexec = shutil.which("mpiexec")
    if mpiexec is None:
        raise Skip("mpiexec is not on PATH (pip install mpi4py mpich)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GEXMK_")}
    # ch4:ofi (not ucx), its embedded libfabric on tcp, no shared-memory shortcut
    # between the two local ranks; the debug summary names the provider chosen.
    env.update(MPIR_CVAR_CH4_NETMOD="ofi", FI_PROVIDER="tcp", MPIR_CVAR_NOLOCAL="1",
               MPIR_CVAR_DEBUG_SUMMARY="1")
    cmd = [mpiexec, "-n", "2", sys.executable, "-P", str(script), "--sizes", "8",
           "--iters", str(min(args.iters, 300)), "--batch-us", str(args.batch_us)]
    r = _run(cmd, env, args.timeout + 10, "mpiexec -n 2 bench/mpi4py_rma.py")
    lines = r.stdout.strip().splitlines()
    res = json.loads(lines[-1])
    m = re.search(r"libfabric provider:\s*(\S+)", r.stdout)
    res["ofi_provider"] = m.group(1) if m else None
    res["rma_native"] = "MPIDI_OFI_ENABLE_RMA: 1" in r.stdout
    return res


# Run in a fresh interpreter: loading libmpi (and with it MPICH's libfabric) or a second
# libfabric.so.1 into this process is best avoided.  Prints {"lib", "version", "how"}.
_PROBE_LIBFABRIC = r"""
import ctypes, json, os, sys
lib, how = sys.argv[1], "--mpich-libfabric"
if not lib:
    # the libmpi that mpi4py loads (the wheel's RUNPATH is $ORIGIN:$ORIGIN/mpich) has
    # libfabric.so.1 as a NEEDED entry: it is mapped as soon as mpi4py.MPI is imported,
    # with MPI itself left uninitialised
    try:
        import mpi4py
        mpi4py.rc.initialize = False
        from mpi4py import MPI
        maps = sorted({l.split()[-1] for l in open("/proc/self/maps") if "/libfabric.so" in l})
        if maps:
            lib, how = maps[0], "mapped by mpi4py's libmpi"
    except Exception:
        pass
if not lib:
    # the PyPI mpich wheel's layout
    wheel = os.path.join(sys.prefix, "lib", "mpich", "libfabric.so.1")
    if os.path.exists(wheel):
        lib, how = wheel, "mpich wheel layout"
if not lib:
    sys.exit("not mapped by mpi4py's libmpi, and no <prefix>/lib/mpich/libfabric.so.1")
f = ctypes.CDLL(lib)
f.fi_tostr.restype = ctypes.c_char_p
f.fi_tostr.argtypes = [ctypes.c_void_p, ctypes.c_int]
dummy = ctypes.c_uint64(0)
# FI_TYPE_VERSION (18, same in 1.x and 2.x) gives the package version with its patch
# level; fi_version() only major.minor
v = f.fi_tostr(ctypes.byref(dummy), 18)
if not v:
    n = f.fi_version()
    v = f"{n >> 16}.{n & 0xffff}".encode()
print(json.dumps({"lib": os.path.realpath(lib), "version": v.decode(), "how": how}))
"""


def find_mpich_libfabric(args, exe):
    """The libfabric.so.1 that MPICH (as mpi4py loads it) runs on, its version, and the
    LD_LIBRARY_PATH under which the ofi_bench binary resolves to it; Skip if there is none."""
    if shutil.which("mpiexec") is None:
        raise Skip("mpiexec is not on PATH: no MPICH Put+Flush to set it beside")
    given = args.mpich_libfabric or ""
    if given and os.path.isdir(given):
        given = os.path.join(given, "libfabric.so.1")
    if given and not os.path.exists(given):
        raise Skip(f"--mpich-libfabric: {given} does not exist")
    r = _run([sys.executable, "-P", "-c", _PROBE_LIBFABRIC, given], None, 60,
             "locating MPICH's libfabric")
    found = json.loads(r.stdout.strip().splitlines()[-1])
    found["dir"] = os.path.dirname(found["lib"])
    env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(
        [found["dir"]] + [p for p in [os.environ.get("LD_LIBRARY_PATH")] if p]))
    # The provider plugins beside it (efa, psmx2, verbs in the wheel) are not needed for
    # tcp, which is built in; a FI_PROVIDER_PATH meant for another libfabric would only
    # make it load foreign plugins.
    env.pop("FI_PROVIDER_PATH", None)
    found["env"] = {"LD_LIBRARY_PATH": env["LD_LIBRARY_PATH"]}
    # An RPATH in the binary would win over LD_LIBRARY_PATH: check where it resolves
    # (best effort: only where ldd exists)
    ldd = shutil.which("ldd")
    try:
        r = subprocess.run([ldd, exe], env=env, capture_output=True, text=True,
                           timeout=60) if ldd else None
    except (OSError, subprocess.TimeoutExpired):
        r = None
    if r is not None:
        m = re.search(r"libfabric\.so\.1 => (\S+)", r.stdout)
        if m and os.path.realpath(m.group(1)) != found["lib"]:
            raise Skip(f"{exe} resolves libfabric.so.1 to {m.group(1)}, not to MPICH's "
                       f"{found['lib']}, despite LD_LIBRARY_PATH (an RPATH?)")
    return found, env


def run_c_mpich(args, exe, lf, env):
    """The same ofi_bench binary on MPICH's libfabric and its tcp provider (the one the
    mpi4py run is forced onto), busy target; -s 8 alone leaves no bandwidth sizes (they
    default to the -s sizes >= 64 KiB), so only the 8 B latencies and the short
    issue-cost loop run."""
    cmd = [exe, "-p", "tcp", "-P", "poll", "-s", "8", "-w", str(args.window), "-i", "1000",
           "-t", str(args.cap), "-W", str(args.timeout), "--json"]
    r = _run(cmd, env, args.timeout + 10,
             f"ofi_bench -p tcp -P poll on MPICH's libfabric {lf['version']} ({lf['dir']})")
    res = json.loads(r.stdout)
    if res.get("provider") != "tcp":
        raise Skip(f"ofi_bench on MPICH's libfabric got provider {res.get('provider')!r}, not tcp")
    return res


def _collect(args):
    tmp = tempfile.mkdtemp(prefix="gexmk-ofi-compare-")
    R = {"meta": {"load_start": _load(), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                  "ncpu": os.cpu_count(), "python": sys.version.split()[0],
                  "args": {"providers": args.provider, "rounds": args.rounds, "window": args.window,
                           "bw_sizes": args.bw_sizes, "iters": args.iters, "cap_s": args.cap,
                           "batch_us": args.batch_us}},
         "providers": {}, "notes": []}
    try:
        import gexmk
        from gexmk.bench import BuildError, build_extension
        R["meta"]["gexmk"] = gexmk.__version__
        log = lambda s: print(f"ofi_compare: {s}", file=sys.stderr, flush=True)
        if args.ofi_bench:
            exe = args.ofi_bench
        else:
            log("building bench/ofi with meson ...")
            exe = build_c(tmp)
        ext = None
        if not args.no_cython:
            log("building bench/ofi/nogil_ofi.pyx against gexmk ...")
            try:
                ext = build_extension(pyx=BENCH / "ofi" / "nogil_ofi.pyx",
                                      outdir=os.path.join(tmp, "ext"))
            except BuildError as exc:
                R["notes"].append(f"nogil loops skipped: {exc}")
        # MPICH's own libfabric, for the C baseline beside mpi4py (located once)
        mlf, mlf_env, mlf_skip = None, None, None
        if not args.no_mpi and any(p.split(";")[0] == "tcp" for p in args.provider):
            try:
                mlf, mlf_env = find_mpich_libfabric(args, exe)
                R["meta"]["mpich_libfabric"] = mlf
                log(f"MPICH's libfabric {mlf['version']}: {mlf['lib']} ({mlf['how']})")
            except Skip as exc:
                mlf_skip = str(exc)
                log(f"C on MPICH's libfabric skipped: {exc}")
        for prov in args.provider:
            P = R["providers"][prov] = {"gexmk": {m[0]: [] for m in MODES},
                                        "c": {m[0]: [] for m in MODES},
                                        "cdc": {m[0]: [] for m in MODES}, "mpi": [],
                                        "c_mpich": [], "skipped": {}}
            jobs = []
            for label, pt, cm in MODES:
                jobs.append(("gexmk", label, lambda pt=pt: run_gexmk(args, prov, pt, ext, tmp)))
                jobs.append(("c", label, lambda cm=cm: run_c(args, exe, prov, cm)))
                if not args.no_dc:
                    jobs.append(("cdc", label, lambda cm=cm: run_c(args, exe, prov, cm, dc=True)))
            if prov.split(";")[0] == "tcp" and not args.no_mpi:
                jobs.append(("mpi", None, lambda: run_mpi(args)))
                # in the MPI slot: the C baseline on the libfabric and provider MPICH uses
                if mlf:
                    jobs.append(("c_mpich", "busy", lambda: run_c_mpich(args, exe, mlf, mlf_env)))
                else:
                    P["skipped"]["c_mpich:busy"] = f"C on MPICH's libfabric: {mlf_skip}"
            for rnd in range(args.rounds):
                log(f"{prov}: round {rnd + 1}/{args.rounds} (load {_load()[0]:.2f}) ...")
                for side, label, fn in (jobs if rnd % 2 == 0 else jobs[::-1]):
                    key = f"{side}:{label}"
                    if key in P["skipped"]:
                        continue                     # failed once: do not retry every round
                    t_run = time.monotonic()
                    try:
                        res = fn()
                    except Skip as exc:
                        P["skipped"][key] = str(exc)
                        log(f"  skipped {key}: {exc}")
                        continue
                    res["round"] = rnd
                    res["run_wall_s"] = round(time.monotonic() - t_run, 2)
                    (P[side] if side in ("mpi", "c_mpich") else P[side][label]).append(res)
        R["meta"]["load_end"] = _load()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return R


# ---- summary and report ------------------------------------------------------------------

def _agg(runs, get, best="min"):
    """median over runs of get(run)['median'], and min (or max) of get(run)[best]."""
    vals = [get(r) for r in runs]
    vals = [v for v in vals if v]
    if not vals:
        return None
    meds = [v["median"] for v in vals]
    bests = [v[best] for v in vals]
    return {"median": statistics.median(meds), best: (min(bests) if best == "min" else max(bests)),
            "rounds": meds}


def _c_lat(key):
    return lambda r: r.get(key, {}).get("8")


def _c_bw(size, key="bw_GBps_rounds"):
    def get(r):
        x = r.get(key, {}).get(str(size))
        return {"median": x["median"], "best": x["max"]} if x else None
    return get


def _c_issue(r):
    if "issue_ns" not in r:
        return None
    return {"median": r["issue_ns"], "min": r["issue_ns_min"]}


def summarize(R):
    """Per provider: rows of (section, mode, what, gexmk agg, baseline agg, ratio, status)."""
    out = {}
    for prov, P in R["providers"].items():
        rows = []
        for label, _, _ in MODES:
            g, c = P["gexmk"][label], P["c"][label]
            for op, ckey in (("put", "write_dc_lat_us"), ("get", "read_lat_us")):
                ga = _agg(g, lambda r, op=op: r.get("lat_py_us", {}).get(op))
                ca = _agg(c, _c_lat(ckey))
                rows.append(_row("lat", label, f"8 B {op}: tm.{op} (Python)", ga, ca, LAT_MAX, "<="))
                na = _agg(g, lambda r, op=op: (r.get("lat_nogil_us") or {}).get(op))
                rows.append(_row("lat", label, f"8 B {op}: rma.{op} (nogil)", na, ca, None, "<="))
            for size in R["meta"]["args"]["bw_sizes"]:
                ga = _agg(g, lambda r, s=size: r.get("bw_GBps", {}).get(str(s)), best="best")
                # The target: C windows that end as nbi_wait does, with the data at
                # the target (plain fi_write + a read-back flush); plain fi_write
                # windows end at transmit completion, with data possibly still in
                # socket buffers overlapping the next window (info).
                fa = _agg(c, _c_bw(size, "bw_flush_GBps_rounds"), best="best")
                ca = _agg(c, _c_bw(size), best="best")
                if fa:
                    rows.append(_row("bw", label, _fmt_size(size), ga, fa, BW_MIN, ">="))
                    rows.append(_row("bw", label, f"{_fmt_size(size)}   vs C fi_write, transmit compl.",
                                     ga, ca, None, ">="))
                else:
                    why = next((r["bw_flush_unavailable"] for r in c
                                if r.get("bw_flush_unavailable")), None)
                    what = f"   vs C fi_write (no flush: {why})" if why else ""
                    rows.append(_row("bw", label, _fmt_size(size) + what, ga, ca, BW_MIN, ">="))
                da = _agg(P["cdc"][label], _c_bw(size), best="best")
                if da:
                    rows.append(_row("bw", label, f"{_fmt_size(size)}   vs C with DC", ga, da, None, ">="))
            ga = _agg(g, lambda r: r.get("issue_ns"))
            ca = _agg(c, _c_issue)
            rows.append(_row("issue", label, "8 B put_nbi issue", ga, ca, ISSUE_MAX, "<="))
            da = _agg(P["cdc"][label], _c_issue)
            if da:
                rows.append(_row("issue", label, "8 B put_nbi   vs C DC writemsg", ga, da, None, "<="))
            # put_nb (LC_NOW) from Python beside C's DC writemsg issue, and its
            # window per op beside C's blocking DC write (below 1: ops overlap)
            na = _agg(g, lambda r: r.get("nb_issue_ns"))
            if da:
                rows.append(_row("issue", label, "8 B put_nb (Python) vs C DC writemsg", na, da,
                                 None, "<="))
            wa = _agg(g, lambda r: r.get("nb_window_us"))
            rows.append(_row("nb", label, "8 B put_nb x W + wait_all, per op",
                             wa, _agg(c, _c_lat("write_dc_lat_us")), None, "<="))
        if P["mpi"]:
            mpi = {op: _agg(P["mpi"], lambda r, k=f"{op}_flush": {
                       "median": r["small"][k]["median_us"], "min": r["small"][k]["min_us"]})
                   for op in ("put", "get")}
            for op in ("put", "get"):
                ma = mpi[op]
                for label, _, _ in MODES:
                    ga = _agg(P["gexmk"][label], lambda r, op=op: r.get("lat_py_us", {}).get(op))
                    rows.append(_row("mpi", label, f"8 B {op}: tm.{op} vs {op.title()}+Flush", ga, ma,
                                     MPI_MAX, "<="))
                if op == "put":
                    # what a Put+Flush faster than a get round trip suggests: local completion
                    for label, _, _ in MODES:
                        ca = _agg(P["c"][label], _c_lat("write_lat_us"))
                        rows.append(_row("mpi", label, "  C fi_write, transmit compl. vs Put+Flush",
                                         ca, ma, None, "<="))
            if P.get("c_mpich"):
                # The same ofi_bench binary on MPICH's own libfabric and provider: which of
                # its completion levels MPICH's Put+Flush costs as much as.
                lf = R["meta"].get("mpich_libfabric") or {}
                group = (f"C on MPICH's libfabric {lf.get('version') or '(of the mpich wheel)'} tcp "
                         "(same ofi_bench binary, -p tcp -P poll):")
                for rid, what, ckey, op in (
                        ("write", "fi_write (transmit compl.) vs Put+Flush", "write_lat_us", "put"),
                        ("write_dc", "fi_writemsg+DELIVERY_COMPLETE vs Put+Flush", "write_dc_lat_us",
                         "put"),
                        ("read", "fi_read vs Get+Flush", "read_lat_us", "get")):
                    ca = _agg(P["c_mpich"], _c_lat(ckey))
                    row = _row("mpi", "busy", f"    {what}", ca, mpi[op], None, "<=")
                    row.update(group=group, id=f"c_mpich:{rid}")
                    rows.append(row)
        out[prov] = rows
    return out


NOISY = 3.0          # a median this many times its best: flagged as noisy


def _noisy(a, best):
    if not a or not a.get(best):
        return False
    return (a["median"] / a[best] if best == "min" else a[best] / a["median"]) > NOISY


def _row(section, mode, what, g, b, target, sense):
    ratio = g["median"] / b["median"] if g and b and b["median"] else None
    if target is None or ratio is None:
        status = "info" if target is None and ratio is not None else "n/a"
    elif sense == "<=":
        status = "met" if ratio <= target else "MISS"
    else:
        status = "met" if ratio >= target else "MISS"
    best = "best" if section == "bw" else "min"
    if ratio is not None and (_noisy(g, best) or _noisy(b, best)):
        status += " (noisy)"
    return {"section": section, "mode": mode, "what": what, "gexmk": g, "base": b, "ratio": ratio,
            "target": target, "sense": sense, "status": status}


def mpi_reading(rows):
    """What the C-on-MPICH's-libfabric rows say about MPICH's Put+Flush (None without them).
    The test is against the operations that must wait for the target (a DELIVERY_COMPLETE
    write, a read), not against the transmit-complete write: that one is bimodal on tcp
    (~0.5 or ~2.3 µs from run to run).  It must hold for the medians and for the minima
    (what each side does undisturbed), so that a disturbed run gives no reading rather
    than a wrong one.  An inference from this run's figures, worded as one."""
    f = {r["id"]: r for r in rows if r.get("id")}
    w, dc, rd = (f.get(f"c_mpich:{k}") for k in ("write", "write_dc", "read"))
    if not (w and dc and rd and w["gexmk"] and dc["gexmk"] and rd["gexmk"] and w["base"]):
        return None
    put, tw, tdc, trd = (x["median"] for x in (w["base"], w["gexmk"], dc["gexmk"], rd["gexmk"]))
    fast = [x["base"][k] < 0.75 * min(dc["gexmk"][k], rd["gexmk"][k])
            for x, k in ((w, "median"), (w, "min"))]
    get = f", MPICH's Get+Flush {rd['base']['median']:.2f}" if rd["base"] else ""
    figures = (f"measured in this run (medians): MPICH's 8 B Put+Flush {put:.2f} µs; C on the "
               f"same libfabric and provider: fi_write (transmit complete) {tw:.2f}, "
               f"FI_DELIVERY_COMPLETE write {tdc:.2f}, fi_read {trd:.2f}{get}.")
    if all(fast):
        head = (f"{figures} Put+Flush takes {put / tdc:.2f}x the DC write and "
                f"{put / trd:.2f}x the read (minima: {w['base']['min']:.2f} vs "
                f"{dc['gexmk']['min']:.2f} and {rd['gexmk']['min']:.2f}), which both wait for "
                "the target: consistent with a Flush that does not wait for a round trip, i.e. "
                "not for delivery-complete semantics.")
    elif not any(fast):
        head = (f"{figures} Put+Flush is not clearly faster than the DC write or the read: "
                "this run does not show a Flush weaker than delivery complete.")
    else:
        head = (f"{figures} Medians and minima disagree on whether Put+Flush is faster than "
                "the DC write and the read (a disturbed run): no reading.")
    return head + (" gexmk's blocking put waits for FI_DELIVERY_COMPLETE (the data visible at "
                   "the target), as the C baseline's DC write does.")


def _cell(a, best="min", fmt="{:8.2f}"):
    if not a:
        return f"{'n/a':>8} {'':>8}"
    return fmt.format(a["median"]) + " " + fmt.format(a[best])


def report(R, S, file=None):
    out = file or sys.stdout
    p = lambda s="": print(s, file=out)
    m = R["meta"]
    a = m["args"]
    p(f"gexmk {m.get('gexmk', '?')} ofi transport vs raw libfabric (bench/ofi/ofi_bench.c) and mpi4py/MPICH"
      f" - 2 processes on one node, {m['ncpu']} CPUs, Python {m['python']}")
    p(f"load average (1/5/15 min): {m['load_start']} at start, {m.get('load_end')} at end"
      + ("  <- busy machine: expect noisy figures" if m["load_start"] and
         m["load_start"][0] > 0.5 * (m["ncpu"] or 1) else ""))
    p(f"{a['rounds']} rounds, runs interleaved (gexmk sleep, C sleep, C -d sleep, gexmk busy, C busy, "
      "C -d busy[, mpi4py, C on MPICH's libfabric]; "
      f"reversed every other round); window W={a['window']}; per-measurement cap {a['cap_s']} s")
    p("figures: median over rounds of each run's median, and the min over rounds of each run's min "
      "(bandwidth: best); ratio = gexmk/baseline of the medians")
    hs = [r["harness_ns"] for prov in R["providers"].values() for runs in prov["gexmk"].values()
          for r in runs if r.get("harness_ns")]
    if hs:
        per_batch = statistics.median(h["per_batch"] for h in hs)
        per_op = statistics.median(h["per_op_put"] for h in hs)
        p(f"Python figures: median of per-op means over timed batches of ~{a.get('batch_us', 0):g} µs "
          f"(--batch-us); the timing harness alone costs {per_batch:.0f} ns per timed batch, "
          f"{per_op:.0f} ns per 8 B put here (included in the figures)")
    p(f"(noisy) = a median more than {NOISY:g}x its best on either side: bimodal or disturbed, "
      "read the min/best columns too")
    p("modes: sleep = GEXMK_PROGRESS_THREAD=auto (thread in fi_cq_sread) vs ofi_bench -P wait; "
      "busy = GEXMK_PROGRESS_THREAD=spin vs ofi_bench -P poll")
    for prov, rows in S.items():
        P = R["providers"][prov]
        p()
        info = next((r for lab in P["gexmk"] for r in P["gexmk"][lab]), None)
        cinfo = next((r for lab in P["c"] for r in P["c"][lab]), None)
        head = f"== provider {prov}"
        if info:
            head += (f": domain {info['domain']}, inject {info['inject_size']} B, "
                     f"{'manual' if info['manual_progress'] else 'auto'} data progress")
        if cinfo:
            head += f"; C baseline mr_mode {cinfo['mr_mode']}"
        p(head + " ==")
        for key, why in P["skipped"].items():
            p(f"  skipped {key}: {why}")
        wd = max([32] + [len(r["what"]) for r in rows])     # long info labels: keep columns
        p(f"{'':<{wd + 2}} {'mode':<6} {'gexmk med':>9} {'min':>8} | {'base med':>8} {'min':>8} "
          f"{'gexmk/base':>10}  target")
        last = group = None
        for r in rows:
            if r["section"] != last:
                last, group = r["section"], None
                p({"lat": "-- 8 B blocking latency, µs (base: C fi_writemsg+FI_DELIVERY_COMPLETE / fi_read)",
                   "bw": f"-- put bandwidth, GB/s, window of {a['window']} (gexmk put_nbi LC_GROUP + "
                         "nbi_wait; base: C fi_write window + 8 B read-back flush, the data at the "
                         "target as after nbi_wait; second column: best)",
                   "issue": f"-- issue cost, ns per call, loops of {a['window']} (gexmk rma.put_nbi nogil; "
                            "base: C bare fi_write issue_ns)",
                   "nb": f"-- {a['window']} x tm.put_nb (lc=LC_NOW) then wait_all, µs per op (base: C "
                         "fi_writemsg+FI_DELIVERY_COMPLETE latency; below 1x: the puts overlap)",
                   "mpi": "-- vs mpi4py (MPICH ofi/tcp) Put/Get + Flush(target), µs"}[r["section"]])
            if r.get("group") and r["group"] != group:
                group = r["group"]
                p(f"  {group}")
            best = "best" if r["section"] == "bw" else "min"
            ratio = f"{r['ratio']:9.2f}x" if r["ratio"] is not None else f"{'n/a':>10}"
            tgt = (f"{r['sense']} {r['target']:g}x {r['status']}" if r["target"] is not None
                   else r["status"])
            p(f"  {r['what']:<{wd}} {r['mode']:<6} {_cell(r['gexmk'], best)} | "
              f"{_cell(r['base'], best)} {ratio}  {tgt}")
        if P["mpi"]:
            mp = P["mpi"][0]
            p(f"  mpi4py {mp.get('mpi4py')} on {mp.get('library')}; MPICH debug summary: libfabric "
              f"provider {mp.get('ofi_provider')}, native RMA {'yes' if mp.get('rma_native') else 'no'}")
        lf = m.get("mpich_libfabric")
        if P.get("c_mpich") and lf:
            cm = P["c_mpich"][0]
            p(f"  C on MPICH's libfabric: {lf['lib']} ({lf['how']}), LD_LIBRARY_PATH={lf['dir']}; "
              f"ofi_bench got provider {cm.get('provider')}, domain {cm.get('domain')}, "
              f"{cm.get('data_progress')} data progress")
        reading = mpi_reading(rows)
        if reading:
            p(textwrap.fill("reading: " + reading, width=100, initial_indent="  ",
                            subsequent_indent="    "))
    p()
    counts = {}
    for rows in S.values():
        for r in rows:
            if r["target"] is not None:
                counts[r["status"]] = counts.get(r["status"], 0) + 1
    p("targets: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    p("(C -P wait is n/a on shm: its CQs offer no FI_WAIT_FD; gexmk's sleep mode there gets the "
      "provider's default wait object)" if "shm" in S else "")
    for n in R["notes"]:
        p(f"note: {n}")


def _parser():
    ap = argparse.ArgumentParser(
        prog="python -P bench/ofi_compare.py",
        description="gexmk's ofi transport beside raw libfabric (bench/ofi/ofi_bench.c) and "
                    "mpi4py/MPICH on libfabric tcp, 2 local processes, same run.")
    ap.add_argument("--provider", action="append",
                    help="libfabric provider (repeatable; default: 'tcp;ofi_rxm' and shm)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--window", type=int, default=16,
                    help="puts in flight for bandwidth and issue cost, both sides (default 16)")
    ap.add_argument("--bw-sizes", type=_sizes, default=None,
                    help="bandwidth sizes (default 64K,256K,1M,4M)")
    ap.add_argument("--iters", type=int, default=1000,
                    help="timed batches per gexmk.bench.measure call (default 1000)")
    ap.add_argument("--batch-us", type=float, default=20.0,
                    help="calibrated batch length for gexmk.bench.measure and the mpi4py run, "
                         "µs (default 20: a few blocking operations per timed batch, so that "
                         "the Python timing harness, ~150 ns per timed batch, weighs about as "
                         "little as ofi_bench's clock_gettime pair per sample; 0: one "
                         "operation or window per timed batch)")
    ap.add_argument("--cap", type=float, default=0.5,
                    help="seconds per measurement before it stops early (default 0.5)")
    ap.add_argument("--timeout", type=int, default=90, help="seconds per run (default 90)")
    ap.add_argument("--initiator-thread", choices=("on", "off"), default="on",
                    help="experiment: 'off' runs gexmk's progress thread on the target rank "
                         "only, as ofi_bench does (default on: both ranks, as a job gets it)")
    ap.add_argument("--no-dc", action="store_true",
                    help="skip the extra ofi_bench -d runs (bandwidth and issue cost of "
                         "FI_DELIVERY_COMPLETE writes, gexmk's completion)")
    ap.add_argument("--no-mpi", action="store_true",
                    help="skip the mpi4py baseline (and ofi_bench on MPICH's libfabric)")
    ap.add_argument("--mpich-libfabric", metavar="PATH",
                    help="MPICH's libfabric.so.1 (or its directory) for the ofi_bench run beside "
                         "mpi4py (default: the one mpi4py's libmpi maps, else "
                         "<prefix>/lib/mpich/libfabric.so.1 of the mpich wheel)")
    ap.add_argument("--no-cython", action="store_true", help="skip the nogil loops")
    ap.add_argument("--json", metavar="PATH", help="also write every figure to PATH")
    ap.add_argument("--ofi-bench", metavar="EXE",
                    help="use this ofi_bench binary instead of building bench/ofi with meson "
                         "(a machine without libfabric's pkg-config file)")
    ap.add_argument("--worker", metavar="OUT", help=argparse.SUPPRESS)
    ap.add_argument("--ext", help=argparse.SUPPRESS)
    return ap


def main(argv=None):
    args = _parser().parse_args(argv)
    if args.bw_sizes is None:
        args.bw_sizes = [64 * KIB, 256 * KIB, MIB, 4 * MIB]
    if args.worker:
        return _worker(args)
    if args.rounds < 1 or args.window < 1 or args.cap <= 0:
        print("ofi_compare: --rounds, --window and --cap must be positive", file=sys.stderr)
        return 2
    args.provider = args.provider or list(PROVIDERS)
    t0 = time.monotonic()
    try:
        R = _collect(args)
    except Skip as exc:
        print(f"ofi_compare: {exc}", file=sys.stderr)
        return 1
    R["meta"]["wall_s"] = round(time.monotonic() - t0, 1)
    S = summarize(R)
    report(R, S)
    print(f"(wall time {R['meta']['wall_s']:.1f} s)")
    if args.json:
        readings = {prov: mpi_reading(rows) for prov, rows in S.items()}
        with open(args.json, "w") as f:
            json.dump({**R, "summary": S,
                       "mpi_reading": {k: v for k, v in readings.items() if v}}, f, indent=1)
        print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
