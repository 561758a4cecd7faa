"""The heat equation of ``heat.py`` with mpi4py one-sided communication: the
baseline of gexmk's version.

    mpiexec -n 4 python examples/heat_mpi4py.py --n 256 --iters 100

The same bands, halo rows and sweeps as ``heat.py``; the two copies of each
band live in a window from ``MPI.Win.Allocate``; halo rows go to the
neighbours with ``Win.Put`` and each iteration ends with ``Win.Fence``
(active target).  Same check against serial numpy, same output.
"""
import os
import sys
import time

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # heat.py beside this file
from heat import band, finish, initial, parse, sweep            # noqa: E402


def main(argv=None):
    args = parse(argv, prog="heat_mpi4py.py")
    n = args.n
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    if n - 2 < size:
        raise SystemExit(f"heat_mpi4py.py: {size} ranks need a grid of at least {size + 2} rows")
    lo, hi = band(rank, size, n)
    rows = hi - lo
    stride = (n - 2 + size - 1) // size + 2
    win = MPI.Win.Allocate(2 * stride * n * 8, disp_unit=8, comm=comm)
    try:
        grid = np.frombuffer(win.tomemory(), dtype=np.float64).reshape(2, stride, n)
        copies = [grid[0, :rows + 2], grid[1, :rows + 2]]
        start = initial(n)[lo - 1:hi + 1]
        copies[0][:] = start
        copies[1][:] = start
        up = rank - 1 if rank > 0 else None
        down = rank + 1 if rank < size - 1 else None
        if up is not None:
            up_lo, up_hi = band(up, size, n)
            up_halo = up_hi - up_lo + 1

        def halo(copy, row):
            """Displacement (in float64s) of halo row ``row`` of ``copy``."""
            return (copy * stride + row) * n

        win.Fence()
        comm.Barrier()
        t0 = time.perf_counter()
        cur = 0
        exch = 0.0                  # time spent in the halo exchange
        for _ in range(args.iters):
            new = 1 - cur
            sweep(copies[cur], copies[new])
            t1 = time.perf_counter()
            if up is not None:
                win.Put(copies[new][1], up, target=(halo(new, up_halo), n, MPI.DOUBLE))
            if down is not None:
                win.Put(copies[new][rows], down, target=(halo(new, 0), n, MPI.DOUBLE))
            win.Fence()
            exch += time.perf_counter() - t1
            cur = new
        per_iter = (time.perf_counter() - t0) / max(args.iters, 1)

        rc = 0
        if rank == 0:
            result = initial(n)
            result[lo:hi] = copies[cur][1:rows + 1]
            for r in range(1, size):
                rlo, rhi = band(r, size, n)
                buf = np.empty((rhi - rlo, n))
                win.Lock(r, MPI.LOCK_SHARED)
                win.Get(buf, r, target=(halo(cur, 1), buf.size, MPI.DOUBLE))
                win.Unlock(r)
                result[rlo:rhi] = buf
            rc = finish(args, rank, size, per_iter, result, "mpi4py Win.Put + Win.Fence",
                        exch / max(args.iters, 1))
        comm.Barrier()
    finally:
        win.Free()
    return rc


if __name__ == "__main__":
    sys.exit(main())
