"""Where an 8 B synchronous device operation's time goes, layer by layer, in one
process (a diagnostic beside bench/cuda_nbrhd.py):

    python -P bench/diagnostics/cuda_overhead.py [--iters 2000]

Each line is the median of --iters calls, all in this process on device 0:
  driver      cuda.bindings cuMemcpyHtoDAsync from pinned memory + cuStreamSynchronize
  kind        the CUDA kind's own copy (its Python method: push, copy, sync, pop)
  put_val     tm.put_val into this process's device segment (the 'self' path)
and the same three again after gexmk.init (its threads running), so that what
the library adds over the driver, and what its threads cost, can be told apart.
Timings are reported, never asserted.
"""
import argparse
import statistics
import sys
import time


def med(fn, iters):
    for _ in range(20):
        fn()
    t = []
    for _ in range(iters):
        a = time.perf_counter()
        fn()
        t.append(time.perf_counter() - a)
    return statistics.median(t) * 1e6


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=2000)
    args = ap.parse_args(argv)
    from cuda.bindings import driver as cu
    import numpy as np
    import gexmk
    from gexmk.kinds import cuda as gcuda

    def ok(r):
        if int(r[0]) != 0:
            raise RuntimeError(str(r[0]))
        return r[1] if len(r) > 1 else None
    ok(cu.cuInit(0))
    dev = ok(cu.cuDeviceGet(0))
    ctx = ok(cu.cuDevicePrimaryCtxRetain(dev))
    ok(cu.cuCtxPushCurrent(ctx))
    s = ok(cu.cuStreamCreate(1))
    pinned = ok(cu.cuMemHostAlloc(8, 0))
    dptr = ok(cu.cuMemAlloc(1 << 20))
    host = np.zeros(8, np.uint8)

    def drv():
        cu.cuMemcpyHtoDAsync(dptr, pinned, 8, s)
        cu.cuStreamSynchronize(s)

    def drv_pageable():
        cu.cuMemcpyHtoDAsync(dptr, host.ctypes.data, 8, s)
        cu.cuStreamSynchronize(s)
    rows = [("driver, pinned (before init)", med(drv, args.iters)),
            ("driver, pageable (before init)", med(drv_pageable, args.iters))]
    with gexmk.init() as c:
        mk = c.mk_create(gexmk.CUDA_UVA, 0)
        kind = mk.impl
        ep1 = c.ep_create()
        dseg = c.segment_create(1 << 20, kind=mk)
        ep1.bind_segment(dseg)
        c.tm.publish_bound_segment([ep1])
        dev_tm = c.ep(0).pair(1)
        a = dev_tm.addr(0, 64)
        rows.append(("driver, pinned (after init)", med(drv, args.iters)))
        rows.append(("kind.copy from pinned", med(lambda: kind.copy(dseg.address + 64, int(pinned), 8),
                                                  args.iters)))
        rows.append(("kind.copy from pageable", med(lambda: kind.copy(dseg.address + 64, host.ctypes.data,
                                                                      8), args.iters)))
        rows.append(("put_val into own device segment", med(lambda: dev_tm.put_val(0, a, 7),
                                                            args.iters)))
        rows.append(("put of 8 host bytes (ndarray)", med(lambda: dev_tm.put(0, a, host), args.iters)))
        import threading
        rows.append((f"(threads alive: {', '.join(t.name for t in threading.enumerate())})", 0.0))
    for name, us in rows:
        print(f"{name:45s} {us:7.2f} us" if us else name, flush=True)
    ok(cu.cuMemFree(dptr))
    ok(cu.cuMemFreeHost(pinned))
    return 0


if __name__ == "__main__":
    sys.exit(main())
