"""Where the time of a put_signal + wait_until ping-pong goes (2 ranks, one node).

    python bench/diagnostics/signal_breakdown.py [--iters 200] [--batch-us 200] [--json]
                                     [--transport auto|ofi] [--provider 'tcp;ofi_rxm']
                                     [--legs-only] [--repeat N]

One 2-rank job (``python -m gexmk.run -n 2``) measures, in the same run:

- the pieces from Python, one rank alone (the peer waits in a barrier):
  ``put8`` (8 B blocking put, the issue's yardstick), ``put_signal8`` (8 B
  put_signal, nobody waiting), ``wait_ready`` (wait_until on a word already
  satisfied: the entry cost), ``test_miss`` (``tm.test`` on a word not
  satisfied: the path into the nogil wait loop and out), ``signal_fetch``;
- the same pieces from a nogil Cython loop (``bench/signal_loop.pyx``);
- the round trip three ways: Python on both sides (what signal_pingpong.py's
  ``pingpong`` is), Python initiator against a nogil echo (the Python cost
  of one side), and nogil on both sides (the floor: two cache-line transfers
  between cores plus the C calls).

- the legs of one round trip (nogil on both sides, ``pingpong_traced`` and
  ``echo_traced`` of ``bench/signal_loop.pyx``): the data of each
  put_signal carries CLOCK_MONOTONIC readings (one clock for the node), so
  that ``issue`` (the initiator's put_signal call), ``there`` (from before
  that call to the responder's wait returning: issue, wire, the responder's
  progress and its noticing), ``turn`` (the responder's wait return to its
  answer) and ``back`` (the answer's put_signal to the initiator's wait
  returning) come from the same round trips, medians over them; with the
  futex sleeps and sleeps in the transport per round trip of each side
  (``gexmk.core._wait_stats``).

With ``--transport ofi`` the raw libfabric C baseline of signal_pingpong.py
(``bench/ofi/ofi_bench.c`` over the same provider, the target polling) runs
after each job: ``write_read`` (the issue's yardstick) and ``pingpong`` (the
floor).  ``--repeat N`` runs job and baseline N times, interleaved.

``GEXMK_SIGNAL_TUNING="spin_us,yield_us"`` sets the wait policy of both ranks.
The load average is printed with the figures: on a shared 2-core VM a busy
neighbour shows up as a slow round trip.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from itertools import repeat

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))     # bench/
STOP = 2**63


def _us(m):
    return {k: {"median_us": v["median_ns"] / 1e3, "min_us": v["min_ns"] / 1e3}
            for k, v in m.items()}


def _job(args):
    import numpy as np
    import gexmk
    from gexmk.bench import measure, aligned_bytes, load_extension

    ext = load_extension(os.environ["GEXMK_SIGNAL_EXT"]) if os.environ.get("GEXMK_SIGNAL_EXT") \
        else None
    c = gexmk.init()
    t_init = time.monotonic()
    if os.environ.get("GEXMK_SIGNAL_TUNING"):
        gexmk.core._wait_tuning(*map(float, os.environ["GEXMK_SIGNAL_TUNING"].split(",")))
    tm = c.tm
    me, peer = tm.rank, 1 - tm.rank
    c.segment_attach(1 << 16)
    SIG, DATA, PUTDST, READY = 0, 64, 4096, 128
    my_sig, peer_sig = tm.addr(me, SIG), tm.addr(peer, SIG)
    my_ready = tm.addr(me, READY)
    data, putdst = tm.addr(peer, DATA), tm.addr(peer, PUTDST)
    src8 = aligned_bytes(8, True)
    x = np.zeros(1, np.uint64)
    it, bns = args.iters, args.batch_us * 1e3
    SET, GE, GT = gexmk.SIGNAL_SET, gexmk.CMP_GE, gexmk.CMP_GT
    put, put_signal, wait_until, test = tm.put, tm.put_signal, tm.wait_until, tm.test
    signal_fetch, signal_op = tm.signal_fetch, tm.signal_op
    res = {"paths": tm.paths(peer), "wait_spin_yield_us": gexmk.core._wait_tuning(),
           "loadavg": os.getloadavg()}
    tm.signal_op(me, my_ready, 1)
    seq = 0

    def py_put8(k):
        for _ in repeat(None, k):
            put(peer, putdst, src8)

    def py_put_signal8(k):
        for _ in repeat(None, k):
            put_signal(peer, putdst, src8, peer_sig + READY, 1, SET)

    def py_wait_ready(k):
        for _ in repeat(None, k):
            wait_until(my_ready, GE, 1)

    def py_test_miss(k):
        for _ in repeat(None, k):
            test(my_ready, GE, 2)

    def py_fetch(k):
        for _ in repeat(None, k):
            signal_fetch(my_ready)

    def py_pingpong(k):
        nonlocal seq
        for _ in repeat(None, k):
            seq += 1
            x[0] = seq
            put_signal(peer, data, x, peer_sig, seq, SET)
            wait_until(my_sig, GE, seq)

    def py_echo():
        seen = 0
        while True:
            wait_until(my_sig, GT, seen)
            seen = signal_fetch(my_sig)
            if seen >= STOP:
                return
            x[0] = seen
            put_signal(peer, data, x, peer_sig, seen, SET)

    def c_pingpong(k):
        nonlocal seq
        seq = ext.pingpong(tm, peer, data, peer_sig, my_sig, seq, k)

    def reset():
        nonlocal seq
        tm.barrier()
        signal_op(me, my_sig, 0)
        seq = 0
        tm.barrier()

    # 0. warm-up: over the network the first operations set up connections
    tm.barrier()
    if me == 0:
        while time.monotonic() < t_init + args.warmup:
            py_pingpong(16)
        signal_op(peer, peer_sig, STOP)
    else:
        py_echo()
    reset()
    if ext is not None and hasattr(ext, "pingpong_traced"):
        res["legs"] = _legs(tm, ext, args, me, peer, my_sig, peer_sig, data, tm.addr(me, DATA),
                            gexmk.core._wait_stats)
        reset()
    if args.legs_only:
        c.finalize()
        if me == 0:
            print(json.dumps(res), flush=True)
        return 0
    # 1. the pieces, rank 0 alone
    tm.barrier()
    if me == 0:
        cases = {"put8": py_put8, "put_signal8": py_put_signal8, "wait_ready": py_wait_ready,
                 "test_miss": py_test_miss, "signal_fetch": py_fetch}
        res["python_pieces"] = _us(measure(cases, it, bns))
        if ext is not None:
            cc = {"put8": lambda k: ext.put8(tm, peer, putdst, k),
                  "put_signal8": lambda k: ext.put_signal8(tm, peer, putdst, peer_sig + READY, k),
                  "wait_ready": lambda k: ext.wait_ready(tm, my_ready, k)}
            res["nogil_pieces"] = _us(measure(cc, it, bns))
    reset()
    # 2. the round trips
    plans = [("py_py", py_pingpong, py_echo)]
    if ext is not None:
        plans += [("py_nogil", py_pingpong, lambda: ext.echo(tm, peer, data, peer_sig, my_sig)),
                  ("nogil_nogil", c_pingpong, lambda: ext.echo(tm, peer, data, peer_sig, my_sig))]
    res["round_trip"] = {}
    for name, ping, echo in plans:
        if me == 0:
            m = measure({name: ping}, it, bns)
            res["round_trip"].update(_us(m))
            signal_op(peer, peer_sig, STOP)
        else:
            echo()
        reset()
    c.finalize()
    if me == 0:
        print(json.dumps(res), flush=True)
    return 0


def _legs(tm, ext, args, me, peer, my_sig, peer_sig, data, my_data, wait_stats):
    """The traced round trips (see the module's docstring): rank 0 times,
    rank 1 echoes; medians of each leg in µs, and futex sleeps per round trip."""
    import numpy as np
    n = args.legs
    STATS = 256         # rank 1's wait stats land here in rank 0's segment
    if me == 1:
        wait_stats(reset=True)
        ext.echo_traced(tm, peer, data, my_data, peer_sig, my_sig)
        st = wait_stats()
        tm.put(peer, tm.addr(peer, STATS), np.array([st["sleeps"], st.get("net_sleeps", 0)], np.uint64))
        tm.barrier()
        return None
    out = np.zeros((n, 5), np.uint64)
    seq = ext.pingpong_traced(tm, peer, data, my_data, peer_sig, my_sig, 0,
                              min(n, 200), out)          # warm
    wait_stats(reset=True)
    seq = ext.pingpong_traced(tm, peer, data, my_data, peer_sig, my_sig, seq, n, out)
    st = wait_stats()
    tm.signal_op(peer, peer_sig, STOP)
    tm.barrier()
    theirs = [tm.get_val(me, tm.addr(me, STATS)), tm.get_val(me, tm.addr(me, STATS + 8))]
    o = out.astype(np.int64)
    legs = {"issue": o[:, 1] - o[:, 0], "there": o[:, 2] - o[:, 0], "turn": o[:, 3] - o[:, 2],
            "back": o[:, 4] - o[:, 3], "round_trip": o[:, 4] - o[:, 0]}
    res = {k: {"median_us": float(np.median(v)) / 1e3, "p10_us": float(np.percentile(v, 10)) / 1e3,
               "p90_us": float(np.percentile(v, 90)) / 1e3} for k, v in legs.items()}
    res["n"] = n
    res["sleeps_per_rt"] = {"initiator": st["sleeps"] / n, "responder": int(theirs[0]) / n}
    res["net_sleeps_per_rt"] = {"initiator": st.get("net_sleeps", 0) / n,
                                "responder": int(theirs[1]) / n}
    return res


def run(iters=200, batch_us=200.0, timeout=300, transport="auto", provider=None,
        legs=2000, legs_only=False, warmup=1.0):
    """Build the nogil loops, run the job; returns its JSON (times in µs)."""
    env = dict(os.environ)
    env["GEXMK_TRANSPORT"] = transport
    if provider:
        env["GEXMK_OFI_PROVIDER"] = provider
    ext_dir = tempfile.TemporaryDirectory(prefix="gexmk-bench-")   # removed after the job
    try:
        from gexmk.bench import build_extension
        env["GEXMK_SIGNAL_EXT"] = build_extension(os.path.join(HERE, "signal_loop.pyx"),
                                                  outdir=ext_dir.name)
    except Exception as e:  # noqa: BLE001 - reported; the Python figures still come
        print(f"nogil loops not built: {type(e).__name__}: {e}", file=sys.stderr)
    flags = ["-P"] if getattr(sys.flags, "safe_path", False) else []
    cmd = [sys.executable, *flags, "-m", "gexmk.run", "-n", "2", "--timeout", str(timeout),
           os.path.abspath(__file__), "--job", "--iters", str(iters), "--batch-us", str(batch_us),
           "--legs", str(legs), "--warmup", str(warmup)] + (["--legs-only"] if legs_only else [])
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 30, env=env,
                           stdin=subprocess.DEVNULL)
    finally:
        ext_dir.cleanup()
    if r.returncode != 0:
        raise SystemExit(f"the job exited {r.returncode}: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def report(res, file=None):
    file = file or sys.stdout
    print(f"paths {res['paths']}  wait spin/yield us {res['wait_spin_yield_us']}  "
          f"loadavg {res['loadavg'][0]:.2f}", file=file)
    lg = res.get("legs")
    if lg:
        print("  legs (nogil, µs, median [p10-p90]): " + "  ".join(
            f"{k} {lg[k]['median_us']:.1f} [{lg[k]['p10_us']:.1f}-{lg[k]['p90_us']:.1f}]"
            for k in ("issue", "there", "turn", "back", "round_trip"))
            + f"  futex sleeps/rt {lg['sleeps_per_rt']}"
            + f"  transport sleeps/rt {lg.get('net_sleeps_per_rt')}", file=file)
    cb = res.get("c")
    if cb:
        print(f"  C: {cb}", file=file)
    for side in ("python_pieces", "nogil_pieces", "round_trip"):
        for k, v in res.get(side, {}).items():
            print(f"  {side:14s} {k:14s} median {v['median_us']:7.3f} us   min {v['min_us']:7.3f} us",
                  file=file)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--batch-us", type=float, default=200.0)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--transport", default="auto", help="GEXMK_TRANSPORT of the job")
    ap.add_argument("--provider", default=None, help="GEXMK_OFI_PROVIDER (with --transport ofi)")
    ap.add_argument("--legs", type=int, default=2000, help="traced round trips (default 2000)")
    ap.add_argument("--legs-only", action="store_true", help="only the traced round trips")
    ap.add_argument("--warmup", type=float, default=1.0, help="seconds of untimed ping-pong")
    ap.add_argument("--repeat", type=int, default=1, help="runs, each beside its C baseline")
    ap.add_argument("--job", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.job:
        return _job(args)
    for _ in range(args.repeat):
        res = run(args.iters, args.batch_us, transport=args.transport, provider=args.provider,
                  legs=args.legs, legs_only=args.legs_only, warmup=args.warmup)
        if args.transport == "ofi":
            sys.path.insert(0, HERE)
            from signal_pingpong import run_c
            res["c"] = run_c(args.provider or "tcp;ofi_rxm")
        report(res)
        if args.json:
            print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
