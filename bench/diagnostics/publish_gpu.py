"""Where the publication of a large device segment to a peer on another GPU goes
(a diagnostic for issue 20's "1 GiB in <= 5 ms"):

    python -m gexmk.run -n 2 bench/diagnostics/publish_gpu.py [--gib 1] [--precreate]

Rank r on GPU r.  Rank 0 prints: the kind creation on its GPU, (--precreate) a
kind on the other GPU made before publication (its context's creation), and the
publication of a ``--gib`` GiB device segment of each rank, three times
(republication of the same segments: the imports already made are kept or redone).
Run it with GEXMK_CUDA_GRANT_HOME=0 to leave out the second cuMemSetAccess.
"""
import argparse
import time

import gexmk


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--precreate", action="store_true")
    ap.add_argument("--c", action="store_true", help="then the C program's import of 1 GiB")
    ap.add_argument("--profile", action="store_true",
                    help="rank 0 prints where its first publication's time goes (cProfile)")
    args = ap.parse_args()
    with gexmk.init() as c:
        tm = c.tm
        t = time.perf_counter()
        mk = c.mk_create(gexmk.CUDA_UVA, tm.rank)
        t_kind = time.perf_counter() - t
        t_other = None
        if args.precreate:
            t = time.perf_counter()
            c.mk_create(gexmk.CUDA_UVA, 1 - tm.rank)
            t_other = time.perf_counter() - t
        figures = []
        for _ in range(3):
            ep = c.ep_create()
            seg = c.segment_create(int(args.gib * (1 << 30)), kind=mk)
            ep.bind_segment(seg)
            tm.barrier()
            prof = None
            if args.profile and tm.rank == 0 and not figures:
                import cProfile
                prof = cProfile.Profile()
                prof.enable()
            t = time.perf_counter()
            tm.publish_bound_segment([ep])
            figures.append(time.perf_counter() - t)
            if prof is not None:
                prof.disable()
                import pstats
                pstats.Stats(prof).sort_stats("tottime").print_stats(14)
            tm.barrier()
        if tm.rank == 0:
            print(f"kind on GPU 0: {t_kind * 1e3:.2f} ms"
                  + (f"; kind on GPU 1 made first: {t_other * 1e3:.2f} ms" if t_other else "")
                  + "; publication of a " + f"{args.gib:g} GiB device segment each: "
                  + ", ".join(f"{f * 1e3:.2f} ms" for f in figures), flush=True)
        rank = tm.rank
    if rank == 0 and args.c:
        import os
        import sys
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
        import cuda_baseline
        r = cuda_baseline.run_c(200, device=0, owner_device=1)
        print("C, three fresh 1 GiB allocations of GPU 1 imported on GPU 0, [import, reserve + "
              "map, set access] ms:", r.get("import_1GiB_ms", r.get("skip")), flush=True)


if __name__ == "__main__":
    main()
