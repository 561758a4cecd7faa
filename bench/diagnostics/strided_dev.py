"""How long a 1-byte-stride CuPy view (every other byte of a device segment) takes to
move to and from a host segment, in one process: the shape of the conformance matrix's
devseg-strided cells.  Library host memory (pinned by gexmk) and client numpy memory
(pageable), blocking / NB / stream forms, median of --iters.  Needs a GPU and CuPy:
``python -P bench/diagnostics/strided_dev.py [--elems 196613] [--iters 5]``."""
import argparse
import time

import numpy as np

import gexmk


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--elems", type=int, default=196613)
    ap.add_argument("--iters", type=int, default=5)
    a = ap.parse_args()
    import cupy as cp
    n = a.elems
    client = gexmk.init()
    mk = client.mk_create(gexmk.CUDA_UVA, device=0)
    seg = client.segment_create(4 * n + (1 << 20), kind=mk)
    client.ep(0).bind_segment(seg)
    arr = cp.asarray(seg).view(cp.uint8)
    view = arr[:2 * n:2]
    keep = np.zeros(2 * n, np.uint8)
    targets = {}
    ep2 = client.ep_create()
    targets["host-lib"] = client.segment_attach(2 * n, ep=ep2)
    ep3 = client.ep_create()
    s3 = client.segment_create(buffer=keep)
    ep3.bind_segment(s3)
    targets["host-client"] = s3
    client.tm.publish_bound_segment([client.ep(0), ep2, ep3])
    stream = cp.cuda.Stream(non_blocking=True)
    data = np.random.default_rng(1).integers(0, 256, n, dtype=np.uint8)
    for name, ep in (("host-lib", ep2), ("host-client", ep3)):
        tm = client.ep(0).pair(ep.index)
        h = np.asarray(targets[name]).view(np.uint8)
        for op in ("get", "get_nb", "get_on_stream", "put", "put_nb", "put_on_stream"):
            times = []
            for _ in range(a.iters):
                arr[:2 * n] = 0
                h[:n] = data
                cp.cuda.runtime.deviceSynchronize()
                if op.startswith("put"):
                    view[...] = cp.asarray(data)
                    h[:n] = 0
                    cp.cuda.runtime.deviceSynchronize()
                t = time.perf_counter()
                if op == "get":
                    tm.get(view, 0, tm.addr(0, 0))
                elif op == "get_nb":
                    tm.get_nb(view, 0, tm.addr(0, 0)).wait()
                elif op == "get_on_stream":
                    tm.get_on_stream(view, 0, tm.addr(0, 0), stream.ptr)
                    stream.synchronize()
                elif op == "put":
                    tm.put(0, tm.addr(0, 0), view)
                elif op == "put_nb":
                    tm.put_nb(0, tm.addr(0, 0), view).wait()
                else:
                    tm.put_on_stream(0, tm.addr(0, 0), view, stream.ptr)
                    stream.synchronize()
                times.append(time.perf_counter() - t)
                got = cp.asnumpy(view) if op.startswith("get") else h[:n]
                assert np.array_equal(got, data), f"{name} {op}: wrong bytes"
            print(f"{name:12s} {op:14s} {n} x 1 B at stride 2: median {np.median(times) * 1e3:9.2f} ms "
                  f"(min {min(times) * 1e3:.2f})", flush=True)
    client.finalize()


if __name__ == "__main__":
    main()
