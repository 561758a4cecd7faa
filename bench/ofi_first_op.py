"""First operation to a peer over ofi, with connections set up at publication
(GEXMK_OFI_CONNECT=eager, the default) beside the lazy set-up (the baseline:
the connection opens on the first operation), in the same run.

    python -P bench/ofi_first_op.py [-n 2] [--provider 'tcp;ofi_rxm'] [--rounds 5]

Each round runs a fresh job per mode (``python -m gexmk.run``,
GEXMK_TRANSPORT=ofi).  In every rank, after ``segment_attach`` (publication)
and a barrier: the time of the first blocking 8 B get to each peer, of the
first atomic FADD to each peer, the same again after a 50 ms pause (a first
operation's cost without any connection set-up: the target's progress thread
wakes up), then the median of 200 further gets (the steady state), and how
long publication took.  Reported: medians over ranks,
peers and rounds, in µs (publication in ms).  Timings are reported, never
asserted.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

WORKER = r'''
import json, os, sys, time
import numpy as np
import gexmk
with gexmk.init() as c:
    t0 = time.perf_counter()
    c.segment_attach(1 << 16)
    pub = time.perf_counter() - t0
    tm = c.tm
    ad = tm.ad_create(gexmk.DT_I64, gexmk.OP_FADD)
    tm.barrier()
    buf = np.zeros(8, np.uint8)
    first_get, first_amo, steady = [], [], []
    for k in range(1, tm.size):
        r = (tm.rank + k) % tm.size          # every rank starts on a different peer
        t0 = time.perf_counter(); tm.get(buf, r, tm.addr(r, 0)); first_get.append(time.perf_counter() - t0)
        t0 = time.perf_counter(); ad.op(r, tm.addr(r, 64), gexmk.OP_FADD, 1); first_amo.append(time.perf_counter() - t0)
    tm.barrier()
    # the same operations again after an idle pause: what a first operation
    # costs without any connection set-up (the target's progress wakes up)
    idle_get, idle_amo = [], []
    time.sleep(0.05)
    for k in range(1, tm.size):
        r = (tm.rank + k) % tm.size
        t0 = time.perf_counter(); tm.get(buf, r, tm.addr(r, 0)); idle_get.append(time.perf_counter() - t0)
        t0 = time.perf_counter(); ad.op(r, tm.addr(r, 64), gexmk.OP_FADD, 1); idle_amo.append(time.perf_counter() - t0)
    tm.barrier()
    r = (tm.rank + 1) % tm.size
    for _ in range(200):
        t0 = time.perf_counter(); tm.get(buf, r, tm.addr(r, 0)); steady.append(time.perf_counter() - t0)
    steady.sort()
    out = {"pub": pub, "first_get": first_get, "first_amo": first_amo, "idle_get": idle_get, "idle_amo": idle_amo,
           "steady_get": steady[len(steady) // 2], "conn": dict(c.transports["ofi"].connections)}
    with open(os.path.join(sys.argv[1], f"r{tm.rank}.json"), "w") as f:
        json.dump(out, f)
    tm.barrier()
'''


def run(mode, n, provider, timeout):
    with tempfile.TemporaryDirectory(prefix="gexmk-firstop-") as tmp:
        script = os.path.join(tmp, "worker.py")
        with open(script, "w") as f:
            f.write(WORKER)
        env = dict(os.environ, GEXMK_TRANSPORT="ofi", GEXMK_OFI_PROVIDER=provider,
                   GEXMK_OFI_CONNECT=mode)
        r = subprocess.run([sys.executable, "-P", "-m", "gexmk.run", "-n", str(n), "--timeout",
                            str(timeout), script, tmp], env=env, capture_output=True, text=True,
                           timeout=timeout + 15)
        if r.returncode != 0:
            raise RuntimeError(f"{mode} job failed (exit {r.returncode}): {r.stderr[-600:]}")
        return [json.load(open(os.path.join(tmp, f"r{i}.json"))) for i in range(n)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=2)
    ap.add_argument("--provider", default="tcp;ofi_rxm")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--timeout", type=int, default=60)
    args = ap.parse_args(argv)
    agg = {m: {"pub": [], "first_get": [], "first_amo": [], "idle_get": [], "idle_amo": [],
               "steady_get": []} for m in ("lazy", "eager")}
    for _ in range(args.rounds):
        for mode in ("lazy", "eager"):          # interleaved: drift hits both alike
            for rk in run(mode, args.n, args.provider, args.timeout):
                a = agg[mode]
                a["pub"].append(rk["pub"] * 1e3)
                a["first_get"] += [x * 1e6 for x in rk["first_get"]]
                a["first_amo"] += [x * 1e6 for x in rk["first_amo"]]
                a["idle_get"] += [x * 1e6 for x in rk["idle_get"]]
                a["idle_amo"] += [x * 1e6 for x in rk["idle_amo"]]
                a["steady_get"].append(rk["steady_get"] * 1e6)
    print(f"ofi first operation to a peer, {args.provider}, {args.n} ranks, {args.rounds} rounds "
          "(medians; max in brackets)")
    print(f"{'GEXMK_OFI_CONNECT':<18} {'publish ms':>14} {'1st get µs':>20} {'1st FADD µs':>20} "
          f"{'get after idle':>20} {'FADD after idle':>20} {'steady get µs':>14}")
    for mode, a in agg.items():
        def f(xs, w, p=1):
            return f"{statistics.median(xs):.{p}f} [{max(xs):.{p}f}]".rjust(w)
        print(f"{mode:<18} {f(a['pub'], 14)} {f(a['first_get'], 20)} {f(a['first_amo'], 20)} "
              f"{f(a['idle_get'], 20)} {f(a['idle_amo'], 20)} {f(a['steady_get'], 14)}")
    print("(after idle: the same operations again after a 50 ms pause, connections up: the cost "
          "of a first operation without connection set-up)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
