"""VIS through an nbrhd-landed zone (host segments forced through it with
GEXMK_NBRHD_STAGE=all): a vector put and get of N scattered blocks and a
1-byte-stride numpy view, medians of --iters, for comparing builds (run it
under each, alternating).  ``python -P bench/diagnostics/landed_vis.py``
(starts its own 2-rank job)."""
import os
import subprocess
import sys
import time

WORKER = r'''
import time, numpy as np, gexmk
c = gexmk.init()
tm = c.tm
seg = c.segment_attach(8 << 20)
tm.barrier()
if tm.rank == 0:
    iters = int(__import__("os").environ["LV_ITERS"])
    def med(f):
        ts = []
        for _ in range(iters):
            t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
        return sorted(ts)[len(ts) // 2] * 1e3
    for nblk, blk in ((2000, 100), (200, 4096)):
        src = np.ones(nblk * blk, np.uint8)
        srcs = [src[i * blk:(i + 1) * blk] for i in range(nblk)]
        dsts = [(tm.addr(1, i * 2 * blk), blk) for i in range(nblk)]
        put = med(lambda: tm.put_vector(1, dsts, srcs))
        get = med(lambda: tm.get_vector(srcs, 1, dsts))
        print(f"vector {nblk} x {blk} B scattered: put {put:.2f} ms  get {get:.2f} ms", flush=True)
    wide = np.ones(2 * 300000, np.uint8)
    put = med(lambda: tm.put(1, tm.addr(1, 0), wide[::2]))
    get = med(lambda: tm.get(wide[::2], 1, tm.addr(1, 0)))
    print(f"strided view 300000 x 1 B: put {put:.2f} ms  get {get:.2f} ms", flush=True)
tm.barrier()
c.finalize()
'''


def main():
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=9)
    a = ap.parse_args()
    import tempfile
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(WORKER)
    env = dict(os.environ, GEXMK_NBRHD_STAGE="all", LV_ITERS=str(a.iters))
    env.pop("GEXMK_TRANSPORT", None)
    try:
        r = subprocess.run([sys.executable, "-m", "gexmk.run", "-n", "2", f.name], env=env,
                           timeout=300, capture_output=True, text=True)
        sys.stdout.write(r.stdout)
        if r.returncode:
            sys.stderr.write(r.stderr)
            sys.exit(r.returncode)
    finally:
        os.unlink(f.name)


if __name__ == "__main__":
    main()
