"""Where an 8 B device -> peer device put's time goes across processes (a
diagnostic for issue 20's "<= 1.1 x C copy + sync"):

    python -m gexmk.run -n 2 bench/diagnostics/put8_layers.py [--gpu-per-rank] [--iters 2000]

Rank 0 times, interleaved, each the median of --iters calls:
  team.put      mine.put(1, dst, (address, 8)): the whole library path
  kind.copy     the CUDA kind's own copy (push, cuMemcpyAsync, sync, pop) from Python
and prints them with the C program's figures for the same mapping layout.
"""
import argparse
import os
import statistics
import sys
import time

import gexmk


def med(fn, iters):
    for _ in range(50):
        fn()
    t = []
    for _ in range(iters):
        a = time.perf_counter_ns()
        fn()
        t.append(time.perf_counter_ns() - a)
    return statistics.median(t) / 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--gpu-per-rank", action="store_true")
    args = ap.parse_args()
    with gexmk.init() as c:
        tm = c.tm
        mk = c.mk_create(gexmk.CUDA_UVA, tm.rank if args.gpu_per_rank else 0)
        ep = c.ep_create()
        seg = c.segment_create(1 << 21, kind=mk)
        ep.bind_segment(seg)
        tm.publish_bound_segment([ep])
        mine = ep.pair(1)
        if tm.rank == 0:
            dst = mine.addr(1)
            view = mine.peer_view(1).address
            src = (seg.address, 8)
            rows = {}
            for _ in range(3):
                for name, fn in (("team.put", lambda: mine.put(1, dst, src)),
                                 ("kind.copy", lambda: mk.impl.copy(view, seg.address, 8)),
                                 ("team.put again", lambda: mine.put(1, dst, src))):
                    rows.setdefault(name, []).append(med(fn, args.iters))
            for name, v in rows.items():
                print(f"{name:16s} {min(v):7.2f} us (rounds: {', '.join(f'{x:.2f}' for x in v)})",
                      flush=True)
        tm.barrier()
        rank = tm.rank
    if rank == 0:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
        import cuda_baseline
        r = cuda_baseline.run_c(2000, device=0, owner_device=1 if args.gpu_per_rank else 0)
        if "skip" in r:
            print("C:", r["skip"])
        else:
            print(f"C copy+sync {r['dtod8_us']:.2f} us, cuMemcpyAsync+sync {r['dtod8_generic_us']:.2f}"
                  f", with push/pop {r['dtod8_generic_pushpop_us']:.2f}, bare sync {r['sync_us']:.2f}, "
                  f"issue {r['dtod8_issue_us']:.2f} us")


if __name__ == "__main__":
    main()
