"""gexmk between two processes on one GPU (device segments exported as VMM
POSIX FDs and imported by the peer), beside the CUDA driver API on the same
imported mapping, in the same run:

    python -m gexmk.run -n 2 bench/cuda_nbrhd.py [--iters N]

Rank 0 times; rank 1 waits.  Cases:
- 64 MiB device -> peer device put vs cuMemcpyDtoDAsync + cuStreamSynchronize
  into the same mapping (gexmk's peer_view of rank 1's segment);
- 8 B device -> peer device blocking put vs the same 8 B copy + synchronize;
- 8 B put_val into the peer's device segment vs an 8 B cuMemcpyHtoDAsync from
  pinned memory + synchronize;
- publication of a 1 GiB device segment (the collective, on both ranks).
The baselines are driver calls from Python (cuda.bindings), about 1-2 us of
call overhead per call more than C.  Timings are reported, never asserted.
"""
import argparse
import statistics
import sys
import time


def _ok(res):
    err = res[0] if isinstance(res, tuple) else res
    if int(err) != 0:
        raise RuntimeError(f"CUDA driver call failed: {err}")
    return res[1] if isinstance(res, tuple) and len(res) > 1 else None


def med(fn, iters):
    ts = []
    for _ in range(iters):
        t = time.perf_counter_ns()
        fn()
        ts.append(time.perf_counter_ns() - t)
    return statistics.median(ts) * 1e-9


def both(name, a, b, iters, nbytes=None, rounds=5):
    ta, tb = [], []
    for _ in range(rounds):                       # interleaved rounds
        ta.append(med(a, iters))
        tb.append(med(b, iters))
    ma, mb = statistics.median(ta), statistics.median(tb)
    if nbytes and nbytes > 4096:
        print(f"{name:44s} gexmk {nbytes / ma / 1e9:8.1f} GB/s  driver {nbytes / mb / 1e9:8.1f} GB/s"
              f"  ratio {mb / ma:5.2f}", flush=True)
    else:
        print(f"{name:44s} gexmk {ma * 1e6:8.2f} us    driver {mb * 1e6:8.2f} us"
              f"    ratio {ma / mb:5.2f} (time)", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=400)
    ap.add_argument("--gpu-per-rank", action="store_true",
                    help="rank r on device r (two GPUs: the NVLink path) instead of all on device 0")
    args = ap.parse_args(argv)
    from cuda.bindings import driver as cu
    import numpy as np
    import gexmk
    n = 64 << 20
    with gexmk.init() as c:
        tm = c.tm
        mk = c.mk_create(gexmk.CUDA_UVA, tm.rank if args.gpu_per_rank else 0)
        ep1 = c.ep_create()
        dseg = c.segment_create(n, kind=mk)
        ep1.bind_segment(dseg)
        tm.publish_bound_segment([ep1])
        mine = ep1.pair(1)
        hostep = c.ep(0).pair(1)
        if tm.rank == 0:
            print(f"paths to rank 1: device EP {mine.paths(1)}, host EP {hostep.paths(1)}", flush=True)
            view = mine.peer_view(1).__cuda_array_interface__["data"][0]
            _ok(cu.cuCtxPushCurrent(mk.impl.context))
            stream = _ok(cu.cuStreamCreate(1))
            pinned = _ok(cu.cuMemHostAlloc(8, 0))
            dst = mine.addr(1)

            def d2d(nb):
                _ok(cu.cuMemcpyDtoDAsync(view, dseg.address, nb, stream))
                _ok(cu.cuStreamSynchronize(stream))
            both("64 MiB device -> peer device put", lambda: mine.put(1, dst, (dseg.address, n)),
                 lambda: d2d(n), 10, n)
            both("8 B device -> peer device put", lambda: mine.put(1, dst, (dseg.address, 8)),
                 lambda: d2d(8), args.iters, 8)

            def h2d():
                _ok(cu.cuMemcpyHtoDAsync(view, pinned, 8, stream))
                _ok(cu.cuStreamSynchronize(stream))
            both("8 B put_val -> peer device segment", lambda: hostep.put_val(1, dst, 7),
                 h2d, args.iters, 8)
            _ok(cu.cuMemFreeHost(pinned))
            _ok(cu.cuStreamDestroy(stream))
            _ok(cu.cuCtxPopCurrent())
        tm.barrier()
        # publication of a 1 GiB device segment to the same-node peer
        ep2 = c.ep_create()
        big = c.segment_create(1 << 30, kind=mk)
        ep2.bind_segment(big)
        tm.barrier()
        t = time.perf_counter()
        tm.publish_bound_segment([ep2])
        took = time.perf_counter() - t
        tm.barrier()
        t = time.perf_counter()
        tm.barrier()
        bar = time.perf_counter() - t
        if tm.rank == 0:
            print(f"publication of a 1 GiB device segment: {took * 1e3:.2f} ms "
                  f"(of which a bootstrap barrier costs about {bar * 1e3:.2f} ms; the collective "
                  "has two exchanges)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
