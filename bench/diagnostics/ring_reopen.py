"""What a released ring costs its initiator's next operation (issue 23): an 8 B
staged put (GEXMK_OFI_STAGE=all, tcp;ofi_rxm, 2 ranks) issued after an idle
spell, with the ring released meanwhile (GEXMK_OFI_RING_IDLE=0.02: the put
first reads the release's answer, then asks for the ring again) against the
ring kept (GEXMK_OFI_RING_IDLE=0), the two jobs alternated.

    python -P bench/diagnostics/ring_reopen.py [--rounds 3] [--iters 100] [--transport ofi|nbrhd]

``--transport nbrhd``: the same through an nbrhd-landed zone
(GEXMK_NBRHD_STAGE=all, GEXMK_RING_IDLE=0 against 0.02).

Each put follows a 50 ms sleep (longer than the idle setting), so every put
of the released case re-opens its ring.  Rank 1 reports min / median µs.
A diagnostic, not a benchmark.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

WORKER = r'''
import json, os, time
import numpy as np
import gexmk
iters = int(os.environ["RR_ITERS"])
with gexmk.init() as c:
    tm = c.tm
    seg = c.segment_attach(1 << 20)
    src = np.zeros(8, np.uint8)
    tm.barrier()
    ts = []
    if tm.rank == 1:
        tm.put(0, tm.addr(0, 0), src)
        for i in range(iters):
            time.sleep(0.05)
            t0 = time.perf_counter()
            tm.put(0, tm.addr(0, 8), src)
            ts.append(time.perf_counter() - t0)
        st = (c.transports["ofi"].domain.ring_stats if "ofi" in c.transports
              else c.transports["local"].ring_stats)
    tm.barrier()
    if tm.rank == 1:
        ts.sort()
        print("RESULT " + json.dumps({"min": ts[0] * 1e6, "med": ts[len(ts) // 2] * 1e6,
                                      "stats": st}))
'''


def run(extra, iters, transport="ofi"):
    with tempfile.TemporaryDirectory(prefix="gexmk-ring-reopen-") as tmp:
        script = os.path.join(tmp, "w.py")
        with open(script, "w") as f:
            f.write(WORKER)
        if transport == "nbrhd":
            env = dict(os.environ, GEXMK_NBRHD_STAGE="all", RR_ITERS=str(iters))
            env.pop("GEXMK_TRANSPORT", None)
        else:
            env = dict(os.environ, GEXMK_TRANSPORT="ofi", GEXMK_OFI_PROVIDER="tcp;ofi_rxm",
                       GEXMK_OFI_STAGE="all", RR_ITERS=str(iters))
        env.update(extra)
        out = subprocess.run([sys.executable, "-m", "gexmk.run", "-n", "2", script], env=env,
                             cwd=tmp, capture_output=True, text=True, timeout=600)
        for line in out.stdout.splitlines():
            if line.startswith("RESULT "):
                return json.loads(line[7:])
        raise RuntimeError(out.stderr[-3000:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--transport", default="ofi", choices=("ofi", "nbrhd"))
    args = ap.parse_args()
    var = "GEXMK_RING_IDLE" if args.transport == "nbrhd" else "GEXMK_OFI_RING_IDLE"
    confs = [(f"kept ({var}=0)", {var: "0"}), (f"released ({var}=0.02)", {var: "0.02"})]
    for rnd in range(args.rounds):
        for name, extra in confs:
            r = run(extra, args.iters, args.transport)
            print(f"round {rnd + 1} {name:<36} 8 B put after 50 ms idle: min {r['min']:7.1f} µs, "
                  f"median {r['med']:7.1f} µs   {r['stats']}", flush=True)


if __name__ == "__main__":
    main()
