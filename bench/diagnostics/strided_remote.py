"""How long a 1-byte-stride CuPy view (every other byte of a device segment) takes to
move to and from a peer's device segment, and a contiguous transfer of as many bytes
beside it: the shape of the conformance matrix's gpu-*-devseg-strided cells across
processes.  Rank 0 moves, rank 1 waits in a barrier.  The route is what the
environment picks (GEXMK_TRANSPORT=ofi with GEXMK_OFI_STAGE_CHUNK=65536 is the
matrix's gpu-ofi-staged path); its name is printed.  Needs a GPU and CuPy:
``python -m gexmk.run -n 2 python -P bench/diagnostics/strided_remote.py [--elems 196613]``."""
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
    me = client.tm.rank
    cp.cuda.Device(0).use()
    mk = client.mk_create(gexmk.CUDA_UVA, device=0)
    seg = client.segment_create(4 * n + (1 << 20), kind=mk)
    client.ep(0).bind_segment(seg)
    client.tm.publish_bound_segment([client.ep(0)])
    tm = client.tm
    arr = cp.asarray(seg).view(cp.uint8)
    view = arr[:2 * n:2]
    cont = arr[2 * n:3 * n]
    data = np.random.default_rng(1).integers(0, 256, n, dtype=np.uint8)
    if me == 0:
        print(f"route to rank 1: {tm.paths(1)}", flush=True)
    for what in ("strided", "contiguous"):
        local = view if what == "strided" else cont
        for op in ("put", "get", "put_nb", "get_nb"):
            times = []
            for _ in range(a.iters):
                tm.barrier()
                if me == 1:
                    arr[3 * n:4 * n] = cp.asarray(data) if op.startswith("get") else 0
                    cp.cuda.runtime.deviceSynchronize()
                else:
                    local[...] = cp.asarray(data) if op.startswith("put") else 0
                    cp.cuda.runtime.deviceSynchronize()
                tm.barrier()
                if me == 0:
                    far = tm.addr(1, 3 * n)
                    t = time.perf_counter()
                    if op == "put":
                        tm.put(1, far, local)
                    elif op == "put_nb":
                        tm.put_nb(1, far, local).wait()
                    elif op == "get":
                        tm.get(local, 1, far)
                    else:
                        tm.get_nb(local, 1, far).wait()
                    times.append(time.perf_counter() - t)
                    if op.startswith("get"):
                        assert np.array_equal(cp.asnumpy(local), data), f"{what} {op}: wrong bytes"
                tm.barrier()
                if me == 1 and op.startswith("put"):
                    got = cp.asnumpy(arr[3 * n:4 * n])
                    assert np.array_equal(got, data), f"{what} {op}: wrong bytes landed"
            if me == 0:
                print(f"{what:10s} {op:7s} {n} B: median {np.median(times) * 1e3:9.2f} ms "
                      f"(min {min(times) * 1e3:.2f})", flush=True)
    client.finalize()


if __name__ == "__main__":
    main()
