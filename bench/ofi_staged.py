"""Staged device transfers over the network (issue 9): a 4 MiB put from device
memory into a peer's device segment over libfabric tcp, through the landing
zone (path ``ofi-staged``), beside a 4 MiB host -> remote host put over the
same provider in the same job; and a sweep of the landing chunk size.

    python -P bench/ofi_staged.py [--provider 'tcp;ofi_rxm'] [--chunks 256K,1M,2M,4M]
                                  [--iters 30] [--size 4M]

Each chunk setting is one 2-rank job under ``gexmk.run`` (the zone's geometry
is fixed at publication).  Rank 0 times, each the median of --iters:
host->host (plain ofi), device->remote device, host->remote device and
device->remote host (all staged), data checked once each.  Without a GPU the
device segments are replaced by host segments staged with GEXMK_OFI_STAGE=all
(the protocol's cost without the copy engine; said so in the output).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def _size(text):
    t = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    return int(t[:-1] if t[-1:] in "KMG" else t) * mult


def med(fn, iters):
    fn()
    t = []
    for _ in range(iters):
        a = time.perf_counter()
        fn()
        t.append(time.perf_counter() - a)
    return statistics.median(t)


def have_gpu():
    try:
        from cuda.bindings import driver as cu
        return cu.cuInit(0)[0] == cu.CUresult.CUDA_SUCCESS and cu.cuDeviceGetCount()[1] > 0
    except Exception:       # noqa: BLE001 - no package, no driver library, no device
        return False


def worker(size, iters):
    import numpy as np
    import gexmk
    gpu = have_gpu()
    if gpu:
        from cuda.bindings import driver as cu
    with gexmk.init() as c:
        tm = c.tm
        me, peer = tm.rank, 1 - tm.rank
        hseg = c.segment_attach(2 * size)                 # EP 0: host, plain ofi
        ep1 = c.ep_create()
        if gpu:
            mk = c.mk_create(gexmk.CUDA_UVA, 0)
            dseg = c.segment_create(2 * size, kind=mk)
        else:
            dseg = c.segment_create(2 * size)             # staged by GEXMK_OFI_STAGE=all
        ep1.bind_segment(dseg)
        tm.publish_bound_segment([ep1])
        t1 = ep1.pair(1)
        h1 = c.ep(0).pair(1)
        out = {"gpu": gpu, "paths": {"host": tm.paths(peer)["rma"], "device": t1.paths(peer)["rma"],
                                     "host->device": h1.paths(peer)["rma"]}}
        hmem = np.asarray(hseg)
        pat = (np.arange(size // 8 + 1, dtype=np.uint64) * 2654435761).view(np.uint8)[:size]
        hmem[:size] = pat
        if gpu:
            cu.cuCtxPushCurrent(mk.impl.context)
            cu.cuMemcpyHtoD(dseg.address, hmem.ctypes.data, size)
        else:
            np.asarray(dseg)[:size] = hmem[:size]
        tm.barrier()
        if me == 0:
            dst_h = tm.addr(peer, size)
            out["host_put_s"] = med(lambda: tm.put(peer, dst_h, (hseg.address, size)), iters)
            out["dev_put_s"] = med(lambda: t1.put(peer, t1.addr(peer, size), (dseg.address, size)),
                                   iters)
            out["host_to_dev_put_s"] = med(
                lambda: h1.put(peer, t1.addr(peer, 0), (hseg.address, size)), iters)
            out["dev_to_host_put_s"] = med(
                lambda: t1.put(peer, h1.addr(peer, size), (dseg.address, size)), iters)
            out["dev_get_s"] = med(lambda: t1.get((dseg.address + size, size), peer,
                                                  t1.addr(peer, 0)), iters)
        tm.barrier()

        def dev_bytes(off):
            got = np.zeros(size, np.uint8)
            if gpu:
                cu.cuMemcpyDtoH(got.ctypes.data, dseg.address + off, size)
            else:
                got[:] = np.asarray(dseg)[off:off + size]
            return got
        # every transfer above moved the same pattern: check where each landed
        if me == 1:
            ok = (dev_bytes(0) == pat).all() and (dev_bytes(size) == pat).all() \
                and (hmem[size:2 * size] == pat).all()
        else:
            ok = (dev_bytes(size) == pat).all()
        if not ok:
            raise SystemExit(f"rank {me}: the data did not arrive intact")
        tm.barrier()
        out["landed"] = c.transports["ofi"].landed
        if gpu:
            cu.cuCtxPopCurrent()
        if me == 0:
            print("RESULT " + json.dumps(out), flush=True)
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--provider", default="tcp;ofi_rxm")
    ap.add_argument("--chunks", default="256K,1M,2M,4M")
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--size", default="4M")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    size = _size(args.size)
    if args.worker:
        return worker(size, args.iters)
    rows = []
    for ch in args.chunks.split(","):
        env = dict(os.environ, GEXMK_TRANSPORT="ofi", GEXMK_OFI_PROVIDER=args.provider,
                   GEXMK_OFI_STAGE_CHUNK=ch, GEXMK_OFI_STAGE_SLOTS=str(args.slots))
        if not have_gpu():
            env["GEXMK_OFI_STAGE"] = "all"
        cmd = [sys.executable, "-P", "-m", "gexmk.run", "-n", "2", "--timeout", "240",
               os.path.abspath(__file__), "--worker", "--size", str(size), "--iters", str(args.iters)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
        res = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
        if r.returncode != 0 or not res:
            print(f"chunk {ch}: failed (exit {r.returncode}): {(r.stderr or r.stdout)[-800:]}")
            continue
        d = json.loads(res[-1][7:])
        d["chunk"] = ch
        rows.append(d)
        gbs = lambda s: size / s / 1e9          # noqa: E731
        print(f"chunk {ch:>5} x {args.slots} slots ({'GPU' if d['gpu'] else 'no GPU: host segments staged'}"
              f", paths {d['paths']}): host->host {gbs(d['host_put_s']):.2f} GB/s | "
              f"dev->remote dev {gbs(d['dev_put_s']):.2f} GB/s = "
              f"{d['host_put_s'] / d['dev_put_s']:.2f} x host put (target >= 0.8) | host->dev "
              f"{gbs(d['host_to_dev_put_s']):.2f} | dev->host {gbs(d['dev_to_host_put_s']):.2f} | "
              f"dev get {gbs(d['dev_get_s']):.2f} GB/s", flush=True)
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
