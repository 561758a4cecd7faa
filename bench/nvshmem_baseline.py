"""nvshmem4py baseline of issue 11: host-initiated puts between two PEs, one per GPU.

    mpiexec -n 2 python bench/nvshmem_baseline.py [--iters 200] [--big-iters 20]

PE r runs on device r (mod the device count), initialised by nvshmem4py's MPI
bootstrap.  PE 0 times, each the median:
  put8_us        an 8 B ``nvshmem.core.put`` (symmetric buffer -> PE 1) + stream sync
  put8_quiet_us  the same with ``quiet(stream)`` before the sync
  put64m_GBps    a 64 MiB put + stream sync
PE 1 then checks that the last 64 MiB put landed (a byte pattern).  Rank 0
prints one JSON object on stdout; exit status 0 on success.  Needs nvshmem4py,
cuda.core, cuda.bindings and mpi4py; the GPU machine's image has all but
nvshmem4py, which travels in .device/ (``../shared/device/prepare
nvshmem4py-cu13``).  NVLink multicast stays off (NVSHMEM_DISABLE_NVLS=1, set by
.device/setup.sh and here).
"""
import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")


def _ok(res):
    err = res[0]
    if int(err) != 0:
        raise RuntimeError(f"driver call failed: {err}")
    return res[1] if len(res) == 2 else res[1:]


def med(fn, iters, warm=3):
    for _ in range(warm):
        fn()
    t = []
    for _ in range(iters):
        a = time.perf_counter()
        fn()
        t.append(time.perf_counter() - a)
    return statistics.median(t)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--big-iters", type=int, default=20)
    args = ap.parse_args(argv)
    from mpi4py import MPI
    from cuda.core import Device, system
    from cuda.bindings import driver as cu
    import nvshmem.core as nvshmem
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    if comm.Get_size() != 2:
        raise SystemExit("nvshmem_baseline: run with exactly 2 ranks")
    ndev = system.get_num_devices() if hasattr(system, "get_num_devices") else system.num_devices
    dev = Device(rank % ndev)
    dev.set_current()
    stream = dev.create_stream()
    nvshmem.init(device=dev, mpi_comm=comm, initializer_method="mpi")
    n = 64 << 20
    big_src = nvshmem.buffer(n)
    big_dst = nvshmem.buffer(n)
    small_src = nvshmem.buffer(8)
    small_dst = nvshmem.buffer(8)
    _ok(cu.cuMemsetD8(int(big_src.handle), 0x5A if rank == 0 else 1, n))
    _ok(cu.cuMemsetD8(int(big_dst.handle), 0, n))
    _ok(cu.cuCtxSynchronize())
    comm.Barrier()
    out = {"device": rank % ndev, "peer_device": (1 - rank) % ndev}
    if rank == 0:
        def put8():
            nvshmem.put(small_dst, small_src, 1, stream=stream)
            stream.sync()

        def put8q():
            nvshmem.put(small_dst, small_src, 1, stream=stream)
            nvshmem.quiet(stream=stream)
            stream.sync()

        def put64m():
            nvshmem.put(big_dst, big_src, 1, stream=stream)
            stream.sync()
        out["put8_us"] = med(put8, args.iters) * 1e6
        out["put8_quiet_us"] = med(put8q, args.iters) * 1e6
        out["put64m_GBps"] = n / med(put64m, args.big_iters, warm=2) / 1e9
        nvshmem.quiet(stream=stream)
        stream.sync()
    comm.Barrier()
    ok = 1
    if rank == 1:
        import numpy as np
        host = np.empty(4096, np.uint8)
        for off in (0, n - 4096):
            _ok(cu.cuMemcpyDtoH(host.ctypes.data, int(big_dst.handle) + off, 4096))
            ok &= int((host == 0x5A).all())
    ok = comm.allreduce(ok, op=MPI.MIN)
    for b in (big_src, big_dst, small_src, small_dst):
        nvshmem.free(b)
    nvshmem.finalize()
    if rank == 0:
        out["data_checked"] = bool(ok)
        print(json.dumps(out), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
