"""Pageable host memory <-> device segment: gexmk's pipeline through pinned
bounce buffers, swept over its settings, beside cuMemcpyHtoD/DtoH from the
same numpy array and from pinned memory, in the same run.

    python -P bench/cuda_pageable.py [--quick] [--iters N] [--json out.json]

For every (chunk, buffers, threads) of the sweep: a 64 MiB put from a
pageable numpy array into a device segment and the get back, median of
--iters; then, with the best setting, the threshold below which the driver's
own copy wins (pipeline forced on vs off, sizes 64 KiB .. 8 MiB).  The issue's
target: pageable put >= 3 x cuMemcpyHtoD from the same array.  Prints the
GEXMK_PAGEABLE_* values to make the defaults.  Timings are reported, never
asserted.
"""
import argparse
import itertools
import json
import os
import statistics
import sys
import time

import numpy as np

MiB = 1 << 20


def _ok(res):
    err = res[0] if isinstance(res, tuple) else res
    if int(err) != 0:
        raise RuntimeError(f"CUDA driver call failed: {err}")
    return res[1] if isinstance(res, tuple) and len(res) > 1 else None


def med(fn, iters):
    fn()                                    # warm (first use pins the bounce buffers)
    ts = []
    for _ in range(iters):
        t = time.perf_counter_ns()
        fn()
        ts.append(time.perf_counter_ns() - t)
    return statistics.median(ts) * 1e-9


def with_settings(env, body):
    """Run body(client, tm, dseg, mk) in a fresh client with these GEXMK_PAGEABLE_* settings."""
    import gexmk
    old = {k: os.environ.get(k) for k in env}
    os.environ.update({k: str(v) for k, v in env.items()})
    try:
        with gexmk.init() as c:
            mk = c.mk_create(gexmk.CUDA_UVA, 0)
            c.segment_attach(4096)
            ep1 = c.ep_create()
            dseg = c.segment_create(64 * MiB, kind=mk)
            ep1.bind_segment(dseg)
            return body(c, c.ep(0).pair(1), dseg, mk)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=9)
    ap.add_argument("--quick", action="store_true", help="a smaller sweep (about 20 s)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    from cuda.bindings import driver as cu
    from gexmk.transports import local

    n = 64 * MiB
    host = np.random.default_rng(1).integers(0, 256, n, dtype=np.uint8)
    back = np.zeros(n, np.uint8)
    rows = []

    # baselines, in the device's primary context
    _ok(cu.cuInit(0))
    dev = _ok(cu.cuDeviceGet(0))
    ctx = _ok(cu.cuDevicePrimaryCtxRetain(dev))
    _ok(cu.cuCtxPushCurrent(ctx))
    dbuf = _ok(cu.cuMemAlloc(n))
    pinned = _ok(cu.cuMemHostAlloc(n, 0))
    base = {
        "htod_pageable": n / med(lambda: _ok(cu.cuMemcpyHtoD(dbuf, host.ctypes.data, n)), args.iters),
        "dtoh_pageable": n / med(lambda: _ok(cu.cuMemcpyDtoH(back.ctypes.data, dbuf, n)), args.iters),
        "htod_pinned": n / med(lambda: _ok(cu.cuMemcpyHtoD(dbuf, pinned, n)), args.iters),
        "dtoh_pinned": n / med(lambda: _ok(cu.cuMemcpyDtoH(pinned, dbuf, n)), args.iters),
    }
    t = time.perf_counter_ns()
    for _ in range(args.iters):
        np.copyto(back, host)
    base["memcpy_1thread"] = n * args.iters / ((time.perf_counter_ns() - t) * 1e-9)
    _ok(cu.cuMemFreeHost(pinned))
    _ok(cu.cuMemFree(dbuf))
    _ok(cu.cuCtxPopCurrent())
    print("baselines (64 MiB, GB/s): " + ", ".join(f"{k} {v / 1e9:.2f}" for k, v in base.items()),
          flush=True)

    if args.quick:
        grid = list(itertools.product([2 * MiB, 4 * MiB, 8 * MiB], [2, 4], [0, 3, 7]))
    else:
        grid = list(itertools.product([1 * MiB, 2 * MiB, 4 * MiB, 8 * MiB, 16 * MiB], [2, 3, 4, 8],
                                      [0, 2, 3, 5, 7, 11]))

    def run_case(c, tm, dseg, mk):
        before = local.pipeline_settings()["pipelined"]
        up = n / med(lambda: tm.put(0, dseg.address, host), args.iters)
        down = n / med(lambda: tm.get(back, 0, dseg.address), args.iters)
        used = local.pipeline_settings()["pipelined"] - before
        return up, down, used

    print(f"{'chunk':>8s} {'bufs':>4s} {'thr':>3s} {'put GB/s':>9s} {'x HtoD':>7s} "
          f"{'get GB/s':>9s} {'x DtoH':>7s}", flush=True)
    best = None
    for chunk, bufs, thr in grid:
        env = {"GEXMK_PAGEABLE_CHUNK": chunk, "GEXMK_PAGEABLE_BUFFERS": bufs,
               "GEXMK_PAGEABLE_THREADS": thr, "GEXMK_PAGEABLE_MIN": MiB}
        up, down, used = with_settings(env, run_case)
        row = {"chunk": chunk, "buffers": bufs, "threads": thr, "put_GBps": up / 1e9,
               "get_GBps": down / 1e9, "put_x_htod": up / base["htod_pageable"],
               "get_x_dtoh": down / base["dtoh_pageable"], "pipelined": used}
        rows.append(row)
        print(f"{chunk // MiB:6d}Mi {bufs:4d} {thr:3d} {up / 1e9:9.2f} {row['put_x_htod']:7.2f} "
              f"{down / 1e9:9.2f} {row['get_x_dtoh']:7.2f}" + ("" if used else "  (NOT pipelined!)"),
              flush=True)
        score = min(row["put_x_htod"], row["get_x_dtoh"])
        if best is None or score > best[0]:
            best = (score, row)
    b = best[1]
    print(f"best: GEXMK_PAGEABLE_CHUNK={b['chunk']} GEXMK_PAGEABLE_BUFFERS={b['buffers']} "
          f"GEXMK_PAGEABLE_THREADS={b['threads']}: put {b['put_GBps']:.2f} GB/s = "
          f"{b['put_x_htod']:.2f} x cuMemcpyHtoD from the same array (target >= 3), get "
          f"{b['get_GBps']:.2f} GB/s = {b['get_x_dtoh']:.2f} x cuMemcpyDtoH", flush=True)

    # threshold: pipeline forced on (MIN=0) vs off (BUFFERS=0), best setting otherwise
    print("threshold (put / get GB/s): size, pipelined, driver", flush=True)
    best_env = {"GEXMK_PAGEABLE_CHUNK": b["chunk"], "GEXMK_PAGEABLE_BUFFERS": b["buffers"],
                "GEXMK_PAGEABLE_THREADS": b["threads"]}
    for size in (64 << 10, 256 << 10, 512 << 10, MiB, 2 * MiB, 4 * MiB, 8 * MiB):
        def case(c, tm, dseg, mk, size=size):
            src, dst = host[:size], back[:size]
            return (size / med(lambda: tm.put(0, dseg.address, src), args.iters * 5),
                    size / med(lambda: tm.get(dst, 0, dseg.address), args.iters * 5))
        on = with_settings({**best_env, "GEXMK_PAGEABLE_MIN": 0}, case)
        off = with_settings({**best_env, "GEXMK_PAGEABLE_BUFFERS": 0}, case)
        rows.append({"threshold_size": size, "pipelined": on, "driver": off})
        print(f"{size >> 10:8d} KiB  pipelined {on[0] / 1e9:6.2f} / {on[1] / 1e9:6.2f}   "
              f"driver {off[0] / 1e9:6.2f} / {off[1] / 1e9:6.2f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"baselines": base, "rows": rows}, f, indent=1)
    _ok(cu.cuDevicePrimaryCtxRelease(dev))
    return 0


if __name__ == "__main__":
    sys.exit(main())
