"""put_signal + wait_until ping-pong, beside an 8 B blocking put and mpi4py + MPICH.

    python bench/signal_pingpong.py [--iters 300] [--batch-us 200] [--transport auto|ofi]
                                    [--provider 'tcp;ofi_rxm'] [--no-mpi] [--json]

Runs, in one invocation (the same run, same machine state):

1. a gexmk job of 2 ranks (``python -m gexmk.run -n 2 bench/signal_pingpong.py --gexmk``):
   rank 0 times, against rank 1,
   - ``put8``: an 8 B blocking ``tm.put`` (latency of one call);
   - ``pingpong``: 8 B ``put_signal`` (SIGNAL_SET) to rank 1, which waits for it
     with ``wait_until`` and answers the same way; one round trip per operation;
   - ``pingpong_nbi``: the same with ``put_signal_nbi`` (over the network the
     signal's atomic is not waited for; the put still completes first);
   - the 8 B put and the blocking ping-pong from a nogil Cython loop (``bench/signal_loop.pyx`` through
     ``from gexmk cimport rma``, built on the fly), rank 1 echoing nogil too;
2. the mpi4py + MPICH baseline (``mpiexec -n 2 ... --mpi``):
   - ``put_flush``: ``Win.Put`` 8 B + ``Win.Flush`` (passive target, Lock_all);
   - ``sendrecv_pingpong``: 8 B ``Send``/``Recv`` round trip;
   - ``put_flush_send_pingpong``: the equivalent of put_signal: ``Put`` 8 B +
     ``Flush`` + a 0-byte ``Send`` as the signal, answered the same way;
3. with ``--transport ofi``, the raw libfabric C baseline over the same
   provider (``bench/ofi/ofi_bench.c``, built with meson into a temporary
   directory, the target polling its CQ as a waiting rank does): ``write_read``
   (an 8 B ``fi_write`` + an 8 B ``fi_read`` from the same target, waited for:
   a write known to have landed, one round trip; the issue's yardstick for the
   put_signal round trip) and ``pingpong`` (an 8 B ``fi_write`` the target sees
   in its memory and answers the same way: put_signal + wait_until with the
   data as the signal), plus ``write_dc`` (what an 8 B blocking put waits for).

Same method on both sides (``gexmk.bench.measure``: calibrated batches, median
per operation).  The issue's target: the ping-pong round trip <= 2 x the 8 B
blocking put's latency (same node); the table prints both ratios, round trip and
half round trip (one-way), against the put.  To hook it into
``python -m gexmk.bench``: call :func:`run` and print :func:`report`.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from itertools import repeat

HERE = os.path.dirname(os.path.abspath(__file__))
STOP = 2**63


def _us(m):
    return {(k[:-3] + "_us" if k.endswith("_ns") else k): (v / 1e3 if k.endswith("_ns") else v)
            for k, v in m.items()}


# ---- the gexmk job ------------------------------------------------------------------

def _gexmk(args):
    import numpy as np
    import gexmk
    from gexmk.bench import measure, aligned_bytes, load_extension

    ext, ext_err = None, os.environ.get("GEXMK_SIGNAL_EXT_ERROR")
    if os.environ.get("GEXMK_SIGNAL_EXT"):
        ext = load_extension(os.environ["GEXMK_SIGNAL_EXT"])
    c = gexmk.init()
    if os.environ.get("GEXMK_SIGNAL_TUNING"):          # "spin_us,yield_us" (experiments)
        gexmk.core._wait_tuning(*map(float, os.environ["GEXMK_SIGNAL_TUNING"].split(",")))
    tm = c.tm
    me = tm.rank
    if tm.size != 2:
        raise SystemExit("signal_pingpong.py --gexmk runs on 2 ranks (python -m gexmk.run -n 2)")
    seg = c.segment_attach(1 << 16)
    peer = 1 - me
    SIG, DATA, PUTDST = 0, 64, 4096
    my_sig, peer_sig = tm.addr(me, SIG), tm.addr(peer, SIG)
    data = tm.addr(peer, DATA)
    src8 = aligned_bytes(8, True)
    x = np.zeros(1, np.uint64)
    iters, bns = args.iters, args.batch_us * 1e3
    res = {"transport": tm.transport(peer), "paths": tm.paths(peer),
           "wait_spin_yield_us": gexmk.core._wait_tuning()}
    use_ext = ext is not None

    seq = 0
    put, put_signal, wait_until = tm.put, tm.put_signal, tm.wait_until
    SET, GE, GT = gexmk.SIGNAL_SET, gexmk.CMP_GE, gexmk.CMP_GT
    putdst = tm.addr(peer, PUTDST)

    def py_put8(k):
        for _ in repeat(None, k):
            put(peer, putdst, src8)

    def py_pingpong(k):
        nonlocal seq
        for _ in repeat(None, k):
            seq += 1
            x[0] = seq
            put_signal(peer, data, x, peer_sig, seq, SET)
            wait_until(my_sig, GE, seq)

    put_signal_nbi = tm.put_signal_nbi

    def py_pingpong_nbi(k):
        nonlocal seq
        for _ in repeat(None, k):
            seq += 1
            x[0] = seq
            put_signal_nbi(peer, data, x, peer_sig, seq, SET)
            wait_until(my_sig, GE, seq)

    def py_echo():
        seen = 0
        while True:
            wait_until(my_sig, GT, seen)
            seen = tm.signal_fetch(my_sig)
            if seen >= STOP:
                return
            x[0] = seen
            put_signal(peer, data, x, peer_sig, seen, SET)

    # phase 1: Python on both sides
    tm.barrier()
    if me == 0:
        # warm-up: over the network the first few hundred ms after init are slow
        # (connection set-up, progress threads settling); untimed
        import time
        t_end = time.monotonic() + args.warmup
        while time.monotonic() < t_end:
            py_pingpong(16)
            py_put8(16)
        m = measure({"put8": py_put8, "pingpong": py_pingpong, "pingpong_nbi": py_pingpong_nbi},
                    iters, bns)
        res["python"] = {k: _us(v) for k, v in m.items()}
        tm.signal_op(peer, peer_sig, STOP)
    else:
        py_echo()
    tm.barrier()
    # phase 2: nogil loops on both sides
    tm.signal_op(me, my_sig, 0)
    tm.barrier()
    if use_ext:
        if me == 0:
            state = {"seq": 0}

            def c_put8(k):
                ext.put8(tm, peer, putdst, k)

            def c_pingpong(k):
                state["seq"] = ext.pingpong(tm, peer, data, peer_sig, my_sig, state["seq"], k)

            m = measure({"put8": c_put8, "pingpong": c_pingpong}, iters, bns)
            res["nogil"] = {k: _us(v) for k, v in m.items()}
            tm.signal_op(peer, peer_sig, STOP)
        else:
            ext.echo(tm, peer, data, peer_sig, my_sig)
    elif me == 0:
        res["nogil"] = {"skipped": ext_err or "extension not built"}
    tm.barrier()
    c.finalize()
    if me == 0:
        print(json.dumps(res), flush=True)
    return 0


# ---- the mpi4py baseline ------------------------------------------------------------

def _mpi(args):
    import numpy as np
    from mpi4py import MPI
    from gexmk.bench import measure, aligned_bytes

    comm = MPI.COMM_WORLD
    if comm.size != 2:
        raise SystemExit("signal_pingpong.py --mpi runs on 2 processes (mpiexec -n 2)")
    me, peer = comm.rank, 1 - comm.rank
    win = MPI.Win.Allocate(1 << 16, 1, comm=comm)
    win.Lock_all()
    src8 = aligned_bytes(8, True)
    rbuf = aligned_bytes(8)
    empty = np.zeros(0, np.uint8)
    iters, bns = args.iters, args.batch_us * 1e3
    put, flush, send, recv = win.Put, win.Flush, comm.Send, comm.Recv
    TAG, STOPTAG = 1, 2
    out = {}
    st = MPI.Status()

    def put_flush(k):
        for _ in repeat(None, k):
            put(src8, peer)
            flush(peer)

    def sendrecv(k):
        for _ in repeat(None, k):
            send(src8, peer, TAG)
            recv(rbuf, peer, TAG)

    def put_flush_send(k):
        for _ in repeat(None, k):
            put(src8, peer)
            flush(peer)
            send(empty, peer, TAG)
            recv(empty, peer, TAG)

    def echo(with_put):
        while True:
            recv(rbuf if not with_put else empty, peer, MPI.ANY_TAG, st)
            if st.Get_tag() == STOPTAG:
                return
            if with_put:
                put(src8, peer)
                flush(peer)
                send(empty, peer, TAG)
            else:
                send(src8, peer, TAG)

    try:
        if me == 0:
            m = measure({"put_flush": put_flush}, iters, bns)
            out.update({k: _us(v) for k, v in m.items()})
        comm.Barrier()
        for name, fn, with_put in (("sendrecv_pingpong", sendrecv, False),
                                   ("put_flush_send_pingpong", put_flush_send, True)):
            if me == 0:
                m = measure({name: fn}, iters, bns)
                out.update({k: _us(v) for k, v in m.items()})
                send(rbuf if not with_put else empty, peer, STOPTAG)
            else:
                echo(with_put)
            comm.Barrier()
    finally:
        win.Unlock_all()
        win.Free()
    if me == 0:
        out["library"] = " ".join(MPI.Get_library_version().splitlines()[0].split())
        print(json.dumps(out), flush=True)
    return 0


# ---- the driver -----------------------------------------------------------------------

def _last_json(r, what):
    if r.returncode != 0:
        tail = " | ".join((r.stderr or r.stdout).strip().splitlines()[-6:])
        return {"skipped": f"{what} exited {r.returncode}: {tail}"}
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"skipped": f"no JSON from {what}: {r.stdout[-300:]!r}"}


def run_c(provider, iters=2000, timeout=120):
    """ofi_bench (bench/ofi) over ``provider``, 8 B, the target polling:
    {"write_read": µs, "pingpong": µs, "write_dc": µs} medians, or {"skipped": why}."""
    import tempfile
    sys.path.insert(0, HERE)
    try:
        from ofi_compare import build_c, Skip
    except ImportError as e:
        return {"skipped": f"bench/ofi_compare.py is needed to build the C baseline: {e}"}
    finally:
        sys.path.remove(HERE)
    with tempfile.TemporaryDirectory(prefix="gexmk-sig-c-") as tmp:
        try:
            exe = build_c(tmp)
        except Skip as e:
            return {"skipped": str(e)}
        cmd = [exe, "-p", provider, "-P", "poll", "-s", "8", "-b", "65536", "-i", str(iters),
               "-t", "0.5", "-W", str(timeout), "--json"]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 10,
                               stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return {"skipped": f"ofi_bench did not finish in {timeout} s"}
        if r.returncode != 0:
            return {"skipped": f"ofi_bench exited {r.returncode}: {r.stderr.strip()[-300:]}"}
        js = json.loads(r.stdout)
    out = {"provider": js["provider"]}
    for key, name in (("write_read_lat_us", "write_read"), ("pingpong_lat_us", "pingpong"),
                      ("write_dc_lat_us", "write_dc")):
        if key in js:
            out[name] = js[key]["8"]["median"]
    return out


def run(iters=300, batch_us=200.0, transport="auto", provider=None, timeout=300, warmup=1.0,
        mpi=True):
    """Run every side; returns {"gexmk": ..., "mpi": ..., "c": ...} (times in µs;
    "c" only with transport "ofi")."""
    flags = ["-P"] if getattr(sys.flags, "safe_path", False) else []
    common = ["--iters", str(iters), "--batch-us", str(batch_us), "--warmup", str(warmup)]
    env = dict(os.environ)
    env["GEXMK_TRANSPORT"] = transport
    if provider:
        env["GEXMK_OFI_PROVIDER"] = provider
    out = {}
    ext_dir = tempfile.TemporaryDirectory(prefix="gexmk-bench-")   # removed after the job
    try:
        from gexmk.bench import build_extension
        env["GEXMK_SIGNAL_EXT"] = build_extension(os.path.join(HERE, "signal_loop.pyx"),
                                                  outdir=ext_dir.name)
    except Exception as e:  # noqa: BLE001 - reported; the Python figures still come
        env["GEXMK_SIGNAL_EXT_ERROR"] = f"{type(e).__name__}: {e}"
    cmd = [sys.executable, *flags, "-m", "gexmk.run", "-n", "2", "--timeout", str(timeout),
           os.path.abspath(__file__), "--gexmk", *common]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 30, env=env,
                           stdin=subprocess.DEVNULL)
        out["gexmk"] = _last_json(r, "the gexmk job")
    except subprocess.TimeoutExpired:
        out["gexmk"] = {"skipped": f"the gexmk job did not finish in {timeout} s"}
    finally:
        ext_dir.cleanup()
    mpiexec = shutil.which("mpiexec")
    if not mpi:
        out["mpi"] = {"skipped": "--no-mpi"}
    elif mpiexec is None:
        out["mpi"] = {"skipped": "mpiexec is not on PATH"}
    else:
        menv = {k: v for k, v in os.environ.items() if not k.startswith("GEXMK_")}
        cmd = [mpiexec, "-n", "2", sys.executable, *flags, os.path.abspath(__file__), "--mpi",
               *common]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=menv,
                               stdin=subprocess.DEVNULL)
            out["mpi"] = _last_json(r, "mpiexec")
        except subprocess.TimeoutExpired:
            out["mpi"] = {"skipped": f"mpiexec did not finish in {timeout} s"}
    if transport == "ofi":
        out["c"] = run_c(provider or "tcp;ofi_rxm")
    return out


def report(res, file=None):
    """Print the figures of :func:`run` as a table (median µs)."""
    file = file or sys.stdout
    g, m = res.get("gexmk", {}), res.get("mpi", {})

    def med(d, *keys):
        for k in keys:
            d = d.get(k, {}) if isinstance(d, dict) else {}
        return d.get("median_us") if isinstance(d, dict) else None

    def f(v):
        return f"{v:8.2f}" if isinstance(v, (int, float)) else "     n/a"

    print(f"put_signal ping-pong (8 B), gexmk path: {g.get('transport', '?')} {g.get('paths', '')}",
          file=file)
    if "skipped" in g:
        print(f"  gexmk: skipped: {g['skipped']}", file=file)
    for side in ("python", "nogil"):
        d = g.get(side, {})
        if "skipped" in d:
            print(f"  gexmk {side}: skipped: {d['skipped']}", file=file)
            continue
        put8, pp = med(g, side, "put8"), med(g, side, "pingpong")
        ratio = f"round trip / put = {pp / put8:5.2f}, one way / put = {pp / 2 / put8:5.2f}" \
            if put8 and pp else ""
        print(f"  gexmk {side:6s}: 8 B put {f(put8)} us   put_signal+wait_until round trip "
              f"{f(pp)} us   {ratio}", file=file)
    if "skipped" in m:
        print(f"  mpi4py: skipped: {m['skipped']}", file=file)
    else:
        print(f"  mpi4py ({m.get('library', '?')}): Put+Flush 8 B {f(med(m, 'put_flush'))} us   "
              f"Send/Recv round trip {f(med(m, 'sendrecv_pingpong'))} us   "
              f"Put+Flush+Send round trip {f(med(m, 'put_flush_send_pingpong'))} us", file=file)
        pp = med(g, "python", "pingpong")
        sr = med(m, "sendrecv_pingpong")
        if pp and sr:
            print(f"  gexmk Python round trip / MPI Send/Recv round trip = {pp / sr:.2f}", file=file)
    nbi = med(g, "python", "pingpong_nbi")
    if nbi:
        print(f"  gexmk python, put_signal_nbi (the signal completes in the background): "
              f"round trip {f(nbi)} us", file=file)
    cb = res.get("c")
    if cb is not None:
        if "skipped" in cb:
            print(f"  C (ofi_bench): skipped: {cb['skipped']}", file=file)
        else:
            print(f"  C (ofi_bench, {cb['provider']}, target polling): 8 B write+read "
                  f"{f(cb.get('write_read'))} us   write ping-pong {f(cb.get('pingpong'))} us   "
                  f"DC write {f(cb.get('write_dc'))} us", file=file)
            for side in ("python", "nogil"):
                pp = med(g, side, "pingpong")
                if pp and cb.get("write_read") and cb.get("pingpong"):
                    print(f"  gexmk {side} round trip / C write+read = {pp / cb['write_read']:.2f}"
                          f"   / C ping-pong = {pp / cb['pingpong']:.2f}", file=file)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--batch-us", type=float, default=200.0)
    ap.add_argument("--transport", default="auto", help="GEXMK_TRANSPORT of the gexmk job")
    ap.add_argument("--provider", default=None, help="GEXMK_OFI_PROVIDER (with --transport ofi)")
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--warmup", type=float, default=1.0,
                    help="seconds of untimed ping-pong and puts before measuring (default 1)")
    ap.add_argument("--json", action="store_true", help="print the raw JSON too")
    ap.add_argument("--no-mpi", action="store_true", help="skip the mpi4py + MPICH baseline")
    ap.add_argument("--gexmk", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mpi", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.gexmk:
        return _gexmk(args)
    if args.mpi:
        return _mpi(args)
    res = run(args.iters, args.batch_us, args.transport, args.provider, args.timeout,
              args.warmup, mpi=not args.no_mpi)
    report(res)
    if args.json:
        print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
