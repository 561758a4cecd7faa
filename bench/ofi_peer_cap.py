"""The connection cap (GEXMK_OFI_MAX_PEERS) over ofi: what its gate costs every
operation, and what a close and the reconnection after it cost, each beside
the same job without the cap (GEXMK_OFI_MAX_PEERS=0) in the same run.

    python -P bench/ofi_peer_cap.py [-n 4] [--provider 'tcp;ofi_rxm'] [--rounds 3]

Each round runs one fresh job per setting (``python -m gexmk.run``,
GEXMK_TRANSPORT=ofi, lazy connections), alternating.  In rank 0:

- ``put8`` / ``get8``: the median of 2,000 blocking 8 B puts / gets to rank 1,
  the only peer it talks to (the cap is never reached: what the gate adds);
- ``cycle``: rank 0 puts 8 B to ranks 1 .. n-1 in turn, 30 passes; with the
  cap at 1 every put closes the last peer's connections first and opens the
  next one's (the worst case: a working set above the cap), without it each
  put goes over a connection set up in the first pass.  Median per put;
- ``closes``: how many closes rank 0 took part in during the cycle.

Reported: medians over rounds, in µs.  Timings are reported, never asserted.
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
    c.segment_attach(1 << 16)
    tm = c.tm
    ofi = c.transports["ofi"]
    tm.barrier()
    out = {}
    if tm.rank == 0:
        buf = np.zeros(8, np.uint8)
        src = np.arange(8, dtype=np.uint8)
        for what in ("put8", "get8"):
            ts = []
            for _ in range(2000):
                t0 = time.perf_counter()
                if what == "put8":
                    tm.put(1, tm.addr(1, 0), src)
                else:
                    tm.get(buf, 1, tm.addr(1, 0))
                ts.append(time.perf_counter() - t0)
            ts.sort()
            out[what] = ts[len(ts) // 2]
        before = ofi.peer_cap["closed"]
        ts = []
        for _ in range(30):
            for r in range(1, tm.size):
                t0 = time.perf_counter()
                tm.put(r, tm.addr(r, 8), src)
                ts.append(time.perf_counter() - t0)
        ts.sort()
        out["cycle"] = ts[len(ts) // 2]
        out["closes"] = ofi.peer_cap["closed"] - before
        out["errors"] = ofi.peer_cap["errors"]
        with open(os.path.join(sys.argv[1], "r0.json"), "w") as f:
            json.dump(out, f)
    tm.barrier()
'''


def run(n, provider, cap, tmp):
    env = dict(os.environ, GEXMK_TRANSPORT="ofi", GEXMK_OFI_PROVIDER=provider,
               GEXMK_OFI_MAX_PEERS=str(cap), GEXMK_OFI_CONNECT="lazy")
    script = os.path.join(tmp, "worker.py")
    with open(script, "w") as f:
        f.write(WORKER)
    for name in os.listdir(tmp):
        if name.endswith(".json"):
            os.unlink(os.path.join(tmp, name))
    subprocess.run([sys.executable, "-P", "-m", "gexmk.run", "-n", str(n), script, tmp], env=env,
                   check=True, timeout=300)
    with open(os.path.join(tmp, "r0.json")) as f:
        return json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=4)
    ap.add_argument("--provider", default="tcp;ofi_rxm")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if args.n < 3:
        ap.error("-n must be at least 3 (the cycle needs more peers than the cap)")
    settings = {"cap 1": 1, "default cap (256)": 256, "no cap (0)": 0}
    got = {k: [] for k in settings}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for label, cap in settings.items():
                got[label].append(run(args.n, args.provider, cap, tmp))
    print(f"# ofi connection cap, {args.provider}, {args.n} ranks, {args.rounds} rounds "
          f"(medians over rounds, µs)")
    print("| setting | 8 B put | 8 B get | put cycling over peers | closes in the cycle |")
    print("|---|---|---|---|---|")
    for label, rows in got.items():
        med = {k: statistics.median(r[k] for r in rows) for k in ("put8", "get8", "cycle", "closes")}
        errors = [e for r in rows for e in r["errors"]]
        print(f"| {label} | {med['put8'] * 1e6:.1f} | {med['get8'] * 1e6:.1f} | "
              f"{med['cycle'] * 1e6:.1f} | {med['closes']:.0f} |" + (f" errors: {errors}" if errors else ""))


if __name__ == "__main__":
    main()
