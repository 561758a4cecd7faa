"""gexmk loopback between host and device memory in one process, beside the
raw CUDA driver API (cuda.bindings.driver) in the same run.

    python -P bench/cuda_loopback.py [--iters N] [--json out.json]

Cases (median of --iters timed calls each, interleaved gexmk / baseline):
- 64 MiB put host segment -> device segment (the host segment is pinned by
  gexmk at bind) vs cuMemcpyHtoD from cuMemHostAlloc'd memory; and the get back
  (DtoH);
- 64 MiB put from a pageable numpy array -> device segment vs cuMemcpyHtoD
  from the same array, interleaved and blocked (each side's calls back to
  back, as bench/cuda_pageable.py times them);
- 8 B put_val into a device segment vs an 8 B cuMemcpyHtoD from pinned memory
  (+ synchronisation: cuMemcpyHtoD is synchronous);
- 8 B device -> device put between two device endpoints vs cuMemcpyDtoD
  + cuCtxSynchronize;
- 8 B put_val with the small-put mechanism switched to cuStreamWriteValue64,
  and the 8 B device -> device put by a one-thread kernel
  (GEXMK_CUDA_SMALL_PUT=write_value,kernel) vs the same baselines;
then the pageable and pinned figures beside the C driver-API program's
(bench/cuda/driver_baseline.c, built and run here; skipped with a message
where it cannot be built), and the pipeline's settings and path counters.
Timings are reported, never asserted.
"""
import argparse
import json
import statistics
import sys
import time

import numpy as np


def _check(res):
    err = res[0] if isinstance(res, tuple) else res
    if int(err) != 0:
        raise RuntimeError(f"CUDA driver call failed: {err}")
    return res[1] if isinstance(res, tuple) and len(res) > 1 else None


def timed(fn, iters):
    out = []
    for _ in range(iters):
        t = time.perf_counter_ns()
        fn()
        out.append(time.perf_counter_ns() - t)
    return statistics.median(out) * 1e-9


def pair(name, a, b, iters, nbytes=None, blocked=False):
    """Median of iters calls of a (gexmk) and of b (baseline), interleaved call
    by call, or with ``blocked`` all of a's calls, then all of b's."""
    if blocked:
        a(), b()
        ma, mb = timed(a, iters), timed(b, iters)
    else:
        ta, tb = [], []
        for _ in range(iters):                          # interleaved
            ta.append(timed(a, 1))
            tb.append(timed(b, 1))
        ma, mb = statistics.median(ta), statistics.median(tb)
    row = {"case": name, "gexmk_s": ma, "baseline_s": mb, "ratio_time": ma / mb}
    if nbytes:
        row.update(gexmk_GBps=nbytes / ma / 1e9, baseline_GBps=nbytes / mb / 1e9)
        print(f"{name:46s} gexmk {nbytes / ma / 1e9:8.2f} GB/s   baseline {nbytes / mb / 1e9:8.2f} GB/s"
              f"   speed ratio {mb / ma:5.2f}")
    else:
        print(f"{name:46s} gexmk {ma * 1e6:8.2f} us     baseline {mb * 1e6:8.2f} us"
              f"     time ratio {ma / mb:5.2f}")
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--small-iters", type=int, default=2000)
    ap.add_argument("--json")
    ap.add_argument("--no-baselines", action="store_true", help="leave out the C driver baseline")
    args = ap.parse_args(argv)
    from cuda.bindings import driver as cu
    import gexmk

    n = 64 << 20
    rows = []
    with gexmk.init() as c:
        mk = c.mk_create(gexmk.CUDA_UVA, 0)
        hseg = c.segment_attach(n)
        ep1, ep2 = c.ep_create(), c.ep_create()
        d1 = c.segment_create(n, kind=mk)
        d2 = c.segment_create(n, kind=mk)
        ep1.bind_segment(d1)
        ep2.bind_segment(d2)
        to_d1 = c.ep(0).pair(1)
        from_d2 = ep2.pair(1)
        np.asarray(hseg)[:] = 7
        # baseline resources, in the kind's (primary) context
        _check(cu.cuCtxPushCurrent(mk.impl.context))
        pinned = _check(cu.cuMemHostAlloc(n, 0))
        dbuf = _check(cu.cuMemAlloc(n))
        host_np = np.full(n, 3, np.uint8)
        small = _check(cu.cuMemHostAlloc(8, 0))
        print(f"gexmk paths: host->device {to_d1.paths(0)}, device->device {from_d2.paths(0)}")

        rows.append(pair("64 MiB put host segment -> device (HtoD)",
                         lambda: to_d1.put(0, d1.address, (hseg.address, n)),
                         lambda: _check(cu.cuMemcpyHtoD(dbuf, pinned, n)), args.iters, n))
        rows.append(pair("64 MiB get device -> host segment (DtoH)",
                         lambda: to_d1.get((hseg.address, n), 0, d1.address),
                         lambda: _check(cu.cuMemcpyDtoH(pinned, dbuf, n)), args.iters, n))
        rows.append(pair("64 MiB put pageable numpy -> device",
                         lambda: to_d1.put(0, d1.address, host_np),
                         lambda: _check(cu.cuMemcpyHtoD(dbuf, host_np.ctypes.data, n)), args.iters, n))
        # the same, each side's calls back to back: the driver's pageable copy
        # between two of the pipeline's (interleaved) leaves its helper threads
        # and bounce buffers cold; cuda_pageable.py times the pipeline this way
        rows.append(pair("64 MiB put pageable numpy -> device (blocked)",
                         lambda: to_d1.put(0, d1.address, host_np),
                         lambda: _check(cu.cuMemcpyHtoD(dbuf, host_np.ctypes.data, n)), args.iters, n,
                         blocked=True))
        rows.append(pair("64 MiB put device -> device (2 endpoints)",
                         lambda: from_d2.put(0, d1.address, (d2.address, n)),
                         lambda: (_check(cu.cuMemcpyDtoD(dbuf, d2.address, n)),
                                  _check(cu.cuCtxSynchronize())), args.iters, n))
        rows.append(pair("8 B put_val -> device segment",
                         lambda: to_d1.put_val(0, d1.address, 5),
                         lambda: _check(cu.cuMemcpyHtoD(dbuf, small, 8)), args.small_iters))
        rows.append(pair("8 B put device -> device (2 endpoints)",
                         lambda: from_d2.put(0, d1.address, (d2.address, 8)),
                         lambda: (_check(cu.cuMemcpyDtoD(dbuf, d2.address, 8)),
                                  _check(cu.cuCtxSynchronize())), args.small_iters))
        from gexmk.transports import local
        prev = local._set_small_put("write_value,kernel")
        rows.append(pair("8 B put_val (write_value) -> device segment",
                         lambda: to_d1.put_val(0, d1.address, 5),
                         lambda: _check(cu.cuMemcpyHtoD(dbuf, small, 8)), args.small_iters))
        rows.append(pair("8 B put device -> device (kernel)",
                         lambda: from_d2.put(0, d1.address, (d2.address, 8)),
                         lambda: (_check(cu.cuMemcpyDtoD(dbuf, d2.address, 8)),
                                  _check(cu.cuCtxSynchronize())), args.small_iters))
        local._set_small_put(prev)
        got = np.zeros(16, np.uint8)
        to_d1.get(got, 0, d1.address)
        print(f"pageable pipeline: {local.pipeline_settings()}")
        print(f"path counters host EP -> device segment: {to_d1.path_stats(0)}")
        _check(cu.cuMemFreeHost(pinned))
        _check(cu.cuMemFreeHost(small))
        _check(cu.cuMemFree(dbuf))
        _check(cu.cuCtxPopCurrent())
    if not args.no_baselines:
        import os
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import cuda_baseline
        cres = cuda_baseline.run_c(args.small_iters)
        rows.append({"c_baseline": cres})
        if "skip" in cres:
            print(f"C driver baseline skipped: {cres['skip']}")
        else:
            by = {r["case"]: r for r in rows if "case" in r}
            pn = by["64 MiB put host segment -> device (HtoD)"]["gexmk_GBps"]
            for how in ("", " (blocked)"):
                pg = by["64 MiB put pageable numpy -> device" + how]["gexmk_GBps"]
                print(f"64 MiB pageable numpy -> device{how}: gexmk {pg:.2f} GB/s, C cuMemcpyHtoD "
                      f"pageable {cres['htod64m_pageable_GBps']:.2f} GB/s: "
                      f"{pg / cres['htod64m_pageable_GBps']:.2f} x (target >= 3)")
            print(f"64 MiB host segment -> device: gexmk {pn:.2f} GB/s, C pinned "
                  f"{cres['htod64m_pinned_GBps']:.2f} GB/s: {pn / cres['htod64m_pinned_GBps']:.3f} x "
                  "(target >= 0.95)")
            for case, key in (("8 B put_val -> device segment", "htod8_pinned_us"),
                              ("8 B put_val (write_value) -> device segment", "htod8_pinned_us"),
                              ("8 B put device -> device (2 endpoints)", "dtod8_us"),
                              ("8 B put device -> device (kernel)", "dtod8_us")):
                g = by[case]["gexmk_s"] * 1e6
                print(f"{case}: gexmk {g:.2f} us, C {key} {cres[key]:.2f} us: {g / cres[key]:.3f} x")
            print(f"C small mechanisms: copy D->D {cres['dtod8_us']:.2f}, pinned H->D "
                  f"{cres['htod8_pinned_us']:.2f}, WriteValue64 {cres['wv64_us']:.2f}, WriteValue32 "
                  f"{cres['wv32_us']:.2f}, kernel {cres['kernel8_us']:.2f}, bare sync "
                  f"{cres['sync_us']:.2f} us (each + sync)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
