"""Where a list of device copies' time goes (a diagnostic for issue 22's KV-cache
shape: 1024 x 16 KiB put_indexed against one contiguous 16 MiB put):

    python -P bench/diagnostics/gather_layers.py [--iters 300]

One process, one device segment of 64 MiB bound to EP 0 (the self path: the
same copies nbrhd makes into a peer's mapping, without a second process).  Each
line is the median of --iters blocking calls:
  indexed 1024 x 16 KiB   the gather kernel's case (GEXMK_CUDA_GATHER=0: copy engine)
  indexed 1024 x 16 B     the same list moving almost nothing: intake, launch, sync
  put 16 MiB              one contiguous put (copy engine)
  nbi x 8 + wait          eight indexed puts back to back, one wait (per put)
Run with GEXMK_CUDA_GATHER_THREADS=128/512/1024 to compare block sizes.
"""
import argparse
import os
import statistics
import time

import numpy as np

import gexmk

MiB, KiB = 1 << 20, 1 << 10


def med(fn, iters):
    for _ in range(20):
        fn()
    t = []
    for _ in range(iters):
        a = time.perf_counter_ns()
        fn()
        t.append(time.perf_counter_ns() - a)
    return statistics.median(t) / 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=300)
    a = ap.parse_args()
    with gexmk.init() as c:
        tm = c.tm
        mk = c.mk_create(gexmk.CUDA_UVA, device=0)
        seg = c.segment_create(64 * MiB, kind=mk)
        c.ep(0).bind_segment(seg)
        tm.publish_bound_segment([c.ep(0)])
        rng = np.random.default_rng(3)
        n, blk = 1024, 16 * KiB
        src = seg.address + 32 * MiB
        la = (rng.permutation(2 * n)[:n] * blk + src).astype(np.uint64)
        ra = (rng.permutation(2 * n)[:n] * blk + tm.addr(0, 0)).astype(np.uint64)

        def nbi8():
            for _ in range(8):
                tm.put_indexed_nbi(0, ra, blk, la, blk)
            gexmk.nbi_wait(gexmk.EC_PUT)

        cases = {
            "indexed 1024 x 16 KiB": lambda: tm.put_indexed(0, ra, blk, la, blk),
            "indexed 1024 x 16 B": lambda: tm.put_indexed(0, ra, 16, la, 16),
            "put 16 MiB": lambda: tm.put(0, tm.addr(0, 0), (src, n * blk)),
            "nbi x 8 + wait (per put)": nbi8,
        }
        before = mk.impl.gather_launches
        res = {k: med(f, a.iters) for k, f in cases.items()}
        res["nbi x 8 + wait (per put)"] /= 8
        try:
            import cupy as cp
        except ImportError:
            cp = None
        if cp is not None:
            s = cp.cuda.Stream(non_blocking=True)
            for blk_, name in ((blk, "16 KiB"), (16, "16 B")):
                for _ in range(20):
                    tm.put_indexed_on_stream(0, ra, blk_, la, blk_, s)
                s.synchronize()
                t0 = time.perf_counter_ns()
                for _ in range(200):
                    tm.put_indexed_on_stream(0, ra, blk_, la, blk_, s)
                t1 = time.perf_counter_ns()
                s.synchronize()
                t2 = time.perf_counter_ns()
                res[f"on_stream x 200, {name}: issue"] = (t1 - t0) / 200e3
                res[f"on_stream x 200, {name}: all"] = (t2 - t0) / 200e3
                e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                gpu = []
                for _ in range(50):
                    e0.record(s)
                    tm.put_indexed_on_stream(0, ra, blk_, la, blk_, s)
                    e1.record(s)
                    e1.synchronize()
                    gpu.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3)
                res[f"one on_stream, {name}: GPU time"] = statistics.median(gpu)
        env = {k: v for k, v in os.environ.items() if k.startswith("GEXMK_CUDA_GATHER")}
        print(f"gather kernel launches: {mk.impl.gather_launches - before}; settings {env}")
        for k, v in res.items():
            print(f"  {k:36s} {v:8.1f} us  {n * blk / (v * 1e3):8.1f} GB/s" if "16 B" not in k
                  and "issue" not in k else f"  {k:36s} {v:8.1f} us")


if __name__ == "__main__":
    main()
