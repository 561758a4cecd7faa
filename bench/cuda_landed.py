"""Pool memory of another process on the node (issue 9): puts into and gets
out of a peer's stream-ordered pool memory (``cudaMallocAsync``, not
exportable), through its owner's landing zone and lander (path
``nbrhd-landed``), beside, in the same job, the same transfers into the
peer's exportable device segment (path ``nbrhd``: a mapped copy) and a pinned
host -> device ``cuMemcpyHtoD`` in one process; and a sweep of the landing
chunk size.

    python -P bench/cuda_landed.py [--chunks 512K,1M,2M,4M] [--slots 4] [--size 64M]
                                   [--iters 20]

Each chunk setting is one 2-rank job on GPU 0 under ``gexmk.run``; rank 0
times host -> pool put, pool -> host get, device -> pool put (from rank 0's
device segment), the same three against the exportable segment, and the
pinned copy (medians of --iters); data checked.  Without a GPU it runs the
protocol on host segments (GEXMK_NBRHD_STAGE=all) and says so.
"""
import argparse
import json
import os
import subprocess
import sys


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ofi_staged import _size, have_gpu, med   # noqa: E402 - the same helpers, one copy


def worker(size, iters):
    import numpy as np
    import gexmk
    gpu = have_gpu()
    with gexmk.init() as c:
        tm = c.tm
        me, peer = tm.rank, 1 - tm.rank
        hseg = c.segment_attach(2 * size)                     # EP 0: host
        ep1, ep2 = c.ep_create(), c.ep_create()
        pool = None
        if gpu:
            import cupy
            from cuda.bindings import driver as cu
            mk = c.mk_create(gexmk.CUDA_UVA, 0)
            with cupy.cuda.Device(0):
                s = cupy.cuda.Stream(non_blocking=True)
                pool = cupy.cuda.runtime.mallocAsync(size, s.ptr)
                s.synchronize()
            pseg = c.segment_create(buffer=(pool, size), kind=mk)   # not exportable
            dseg = c.segment_create(2 * size, kind=mk)             # exportable (VMM)
        else:
            pseg = c.segment_create(size)
            dseg = c.segment_create(2 * size)
        ep1.bind_segment(pseg)
        ep2.bind_segment(dseg)
        tm.publish_bound_segment([ep1, ep2])
        h1, h2 = c.ep(0).pair(1), c.ep(0).pair(2)
        d1, d2 = ep2.pair(1), ep2.pair(2)
        out = {"gpu": gpu, "paths": {"pool": h1.paths(peer)["rma"], "exportable": h2.paths(peer)["rma"],
                                     "device->pool": d1.paths(peer)["rma"]}}
        hmem = np.asarray(hseg)
        pat = (np.arange(size // 8 + 1, dtype=np.uint64) * 2654435761).view(np.uint8)[:size]
        hmem[:size] = pat
        if gpu:
            cu.cuCtxPushCurrent(mk.impl.context)
            cu.cuMemcpyHtoD(dseg.address, hmem.ctypes.data, size)
        else:
            np.asarray(dseg)[:size] = pat
        tm.barrier()
        if me == 0:
            src_h, dst_h = (hseg.address, size), (hseg.address + size, size)
            src_d = (dseg.address, size)
            out["pool_put_s"] = med(lambda: h1.put(peer, h1.addr(peer, 0), src_h), iters)
            out["pool_get_s"] = med(lambda: h1.get(dst_h, peer, h1.addr(peer, 0)), iters)
            out["pool_dput_s"] = med(lambda: d1.put(peer, d1.addr(peer, 0), src_d), iters)
            out["exp_put_s"] = med(lambda: h2.put(peer, h2.addr(peer, size), src_h), iters)
            out["exp_get_s"] = med(lambda: h2.get(dst_h, peer, h2.addr(peer, size)), iters)
            out["exp_dput_s"] = med(lambda: d2.put(peer, d2.addr(peer, size), src_d), iters)
            if gpu:
                out["pinned_htod_s"] = med(lambda: cu.cuMemcpyHtoD(dseg.address + size,
                                                                   hseg.address, size), iters)
        tm.barrier()
        if me == 1:          # every put above moved the same pattern
            got = np.zeros(size, np.uint8)
            if gpu:
                cu.cuMemcpyDtoH(got.ctypes.data, pool, size)
            else:
                got[:] = np.asarray(pseg)[:size]
            if not (got == pat).all():
                raise SystemExit("rank 1: the pool segment's data did not arrive intact")
        elif not (hmem[size:2 * size] == pat).all():
            raise SystemExit("rank 0: the data got back did not arrive intact")
        tm.barrier()
        out["landed"] = c.transports["local"].landed
        if gpu:
            cu.cuCtxPopCurrent()
        if me == 0:
            print("RESULT " + json.dumps(out), flush=True)
        tm.barrier()
    if pool is not None:
        with cupy.cuda.Device(0):
            cupy.cuda.runtime.freeAsync(pool, s.ptr)
            s.synchronize()
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", default="512K,1M,2M,4M")
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--size", default="64M")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    size = _size(args.size)
    if args.worker:
        return worker(size, args.iters)
    gpu = have_gpu()
    print(f"nbrhd-landed, {size >> 20} MiB, slots {args.slots}" +
          ("" if gpu else " (no GPU: host segments through zones, GEXMK_NBRHD_STAGE=all)"))
    for ch in args.chunks.split(","):
        env = dict(os.environ, GEXMK_NBRHD_STAGE_CHUNK=ch, GEXMK_NBRHD_STAGE_SLOTS=str(args.slots))
        env.pop("GEXMK_TRANSPORT", None)
        if not gpu:
            env["GEXMK_NBRHD_STAGE"] = "all"
        cmd = [sys.executable, "-P", "-m", "gexmk.run", "-n", "2", "--timeout", "240",
               os.path.abspath(__file__), "--worker", "--size", str(size), "--iters", str(args.iters)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
        res = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
        if r.returncode != 0 or not res:
            print(f"chunk {ch}: failed (exit {r.returncode}): {(r.stderr or r.stdout)[-800:]}")
            continue
        o = json.loads(res[-1][7:])
        gbs = lambda k: size / o[k] / 1e9 if k in o else float("nan")     # noqa: E731
        line = (f"chunk {ch:>5}: paths {o['paths']}  GB/s: host->pool put {gbs('pool_put_s'):.2f}, "
                f"pool->host get {gbs('pool_get_s'):.2f}, device->pool put {gbs('pool_dput_s'):.2f}; "
                f"exportable (same job): {gbs('exp_put_s'):.2f} / {gbs('exp_get_s'):.2f} / "
                f"{gbs('exp_dput_s'):.2f}")
        if "pinned_htod_s" in o:
            line += (f"; pinned cuMemcpyHtoD {gbs('pinned_htod_s'):.2f} "
                     f"(host->pool put = {o['pinned_htod_s'] / o['pool_put_s']:.2f} x)")
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
