"""What the ofi lander thread costs while a few initiators use a job's zones
(issue 23): N ranks over tcp;ofi_rxm with GEXMK_OFI_STAGE=all, each staging one
put to its right neighbour (so every zone has one ring backed of N), then
sleeping ``--idle`` s: the lander passes every ~20 us meanwhile.  Prints rank 0's
process CPU time during the sleep (its lander and progress threads; the main
thread sleeps) and, where the build has it, ``lander_work`` (passes, rings read).
A diagnostic, not a benchmark: run it under two builds in turn to compare.

    python -P bench/diagnostics/lander_pass.py [--ranks 8,32,64] [--idle 2]
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
c = gexmk.init()
tm = c.tm
seg = c.segment_attach(1 << 18)
right = (tm.rank + 1) % tm.size
tm.put(right, tm.addr(right, 0), np.arange(100000, dtype=np.uint8))
tm.barrier()
t0, w0 = os.times(), time.monotonic()
time.sleep(float(os.environ["GX_IDLE"]))
t1, w1 = os.times(), time.monotonic()
cpu = (t1.user + t1.system) - (t0.user + t0.system)
work = getattr(c.ep(0).contexts["ofi"], "lander_work", None)
every = [json.loads(x) for x in c.bootstrap.allgather(json.dumps(cpu).encode())]
if c.rank == 0:
    print("RESULT " + json.dumps({"cpu": cpu, "wall": w1 - w0, "max": max(every),
                                  "work": work["zone"] if work else None}), flush=True)
tm.barrier()
c.finalize()
'''


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", default="8,32,64")
    ap.add_argument("--idle", type=float, default=2.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gexmk-lander-") as tmp:
        script = os.path.join(tmp, "w.py")
        with open(script, "w") as f:
            f.write(WORKER)
        env = dict(os.environ, GEXMK_TRANSPORT="ofi", GEXMK_OFI_PROVIDER="tcp;ofi_rxm",
                   GEXMK_OFI_STAGE="all", GX_IDLE=str(args.idle), GEXMK_TIMEOUT="300")
        for n in map(int, args.ranks.split(",")):
            p = subprocess.run([sys.executable, "-m", "gexmk.run", "-n", str(n), script], env=env,
                               cwd=tmp, capture_output=True, text=True, timeout=900)
            line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
            if not line:
                raise RuntimeError(p.stderr[-3000:])
            r = json.loads(line[0][7:])
            print(f"n={n:<4} rank 0 CPU {100 * r['cpu'] / r['wall']:5.1f} % of a core while idle "
                  f"(max rank {100 * r['max'] / r['wall']:5.1f} %); lander (passes, rings read) "
                  f"{r['work']}", flush=True)


if __name__ == "__main__":
    main()
