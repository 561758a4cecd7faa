"""Where the first import of another GPU's memory goes, phase by phase (a diagnostic
for issue 20's "publish 1 GiB to the other GPU in <= 5 ms"), with the driver API alone:

    python bench/diagnostics/import_phases.py [--sizes 2M,1G,1G] [--no-grant]

A child process allocates each size on GPU 1 (VMM, POSIX-FD handles) and passes the
FD; this process, on GPU 0, imports it, reserves, maps, gives GPU 0 access and (unless
--no-grant) GPU 1 access too, as gexmk's cuda kind does, timing each step.  Sizes in
order: the first import pays whatever is paid once per process or device pair.
"""
import argparse
import os
import socket
import subprocess
import sys
import time

from cuda.bindings import driver as cu


def ok(r):
    err = r[0] if isinstance(r, tuple) else r
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"driver call failed: {err}")
    return r[1] if isinstance(r, tuple) and len(r) == 2 else r


def prop(dev):
    p = cu.CUmemAllocationProp()
    p.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    p.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    p.location.id = dev
    p.requestedHandleTypes = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    return p


def access(dev):
    d = cu.CUmemAccessDesc()
    d.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    d.location.id = dev
    d.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    return d


def parse(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return [int(float(x[:-1]) * mult[x[-1]]) if x[-1] in mult else int(x) for x in s.split(",")]


def exporter(fd, sizes, dev):
    sock = socket.socket(fileno=fd)
    ok(cu.cuInit(0))
    ctx = ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(dev))))
    ok(cu.cuCtxSetCurrent(ctx))
    gran = ok(cu.cuMemGetAllocationGranularity(
        prop(dev), cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM))
    keep = []
    for n in sizes:
        n = (n + gran - 1) // gran * gran
        h = ok(cu.cuMemCreate(n, prop(dev), 0))
        keep.append(h)
        efd = ok(cu.cuMemExportToShareableHandle(
            h, cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0))
        socket.send_fds(sock, [n.to_bytes(8, "little")], [int(efd)])
        os.close(int(efd))
    sock.recv(1)                           # the importer is done
    for h in keep:
        cu.cuMemRelease(h)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="2M,1G,1G")
    ap.add_argument("--no-grant", action="store_true")
    ap.add_argument("--child", type=int, default=-1, help=argparse.SUPPRESS)
    ap.add_argument("--dev", type=int, default=0)
    ap.add_argument("--peer", type=int, default=1)
    a = ap.parse_args()
    sizes = parse(a.sizes)
    if a.child >= 0:
        return exporter(a.child, sizes, a.peer)
    t = time.perf_counter()
    ok(cu.cuInit(0))
    dev = ok(cu.cuDeviceGet(a.dev))
    ctx = ok(cu.cuDevicePrimaryCtxRetain(dev))
    ok(cu.cuCtxSetCurrent(ctx))
    ok(cu.cuCtxSynchronize())
    print(f"init + primary context on GPU {a.dev}: {(time.perf_counter() - t) * 1e3:.2f} ms")
    mine, theirs = socket.socketpair()
    child = subprocess.Popen([sys.executable, __file__, "--child", str(theirs.fileno()),
                              "--sizes", a.sizes, "--peer", str(a.peer)], pass_fds=[theirs.fileno()])
    theirs.close()
    try:
        for _ in sizes:
            msg, fds, _f, _a = socket.recv_fds(mine, 8, 1)
            n = int.from_bytes(msg, "little")
            ph = []
            t0 = time.perf_counter()
            h = ok(cu.cuMemImportFromShareableHandle(
                fds[0], cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
            os.close(fds[0])
            ph.append(("import", time.perf_counter()))
            base = ok(cu.cuMemAddressReserve(n, 0, 0, 0))
            ph.append(("reserve", time.perf_counter()))
            ok(cu.cuMemMap(base, n, 0, h, 0))
            ph.append(("map", time.perf_counter()))
            ok(cu.cuMemSetAccess(base, n, [access(a.dev)], 1))
            ph.append((f"access GPU{a.dev}", time.perf_counter()))
            if not a.no_grant:
                ok(cu.cuMemSetAccess(base, n, [access(a.peer)], 1))
                ph.append((f"access GPU{a.peer}", time.perf_counter()))
            ok(cu.cuMemsetD8(base, 1, 64))
            ok(cu.cuCtxSynchronize())
            ph.append(("first store", time.perf_counter()))
            parts, prev = [], t0
            for name, tt in ph:
                parts.append(f"{name} {(tt - prev) * 1e3:.3f}")
                prev = tt
            print(f"{n / (1 << 20):g} MiB of GPU {a.peer}: total {(prev - t0) * 1e3:.2f} ms = "
                  + ", ".join(parts), flush=True)
    finally:
        mine.send(b"x")
        child.wait(60)


if __name__ == "__main__":
    main()
