"""The 3-D halo exchange of ``halo3d.py`` with mpi4py one-sided communication and
subarray datatypes: the baseline of gexmk's version.

    mpiexec -n 2 python examples/halo3d_mpi4py.py --n 48 --iters 20

The same blocks, halos and sweeps as ``halo3d.py``; the two copies of each block
live in a window from ``MPI.Win.Allocate``; every face goes to its neighbour's halo
with one ``Win.Put`` whose origin and target datatypes are
``MPI.DOUBLE.Create_subarray`` (the face, the halo face), and each iteration ends
with ``Win.Fence`` (active target).  Same check against serial numpy, same output.
"""
import os
import sys
import time

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # halo3d.py beside this file
from halo3d import block, coords, faces, finish, initial, parse, rank_of, sweep  # noqa: E402


def subarray(full, idx):
    """An MPI subarray datatype for numpy index ``idx`` (slices and ints) of ``full``."""
    sizes, subs, starts = list(full), [], []
    for n, i in zip(full, idx):
        if isinstance(i, slice):
            a, b, _ = i.indices(n)
            subs.append(b - a)
            starts.append(a)
        else:
            subs.append(1)
            starts.append(i)
    return MPI.DOUBLE.Create_subarray(sizes, subs, starts).Commit()


def main(argv=None):
    args = parse(argv, prog="halo3d_mpi4py.py")
    n = args.n
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    p, local, c = block(rank, size, n)
    shape = tuple(q + 2 for q in local)
    per = int(np.prod(shape))
    win = MPI.Win.Allocate(2 * per * 8, disp_unit=8, comm=comm)
    types = []
    try:
        grid = np.frombuffer(win.tomemory(), dtype=np.float64).reshape((2,) + shape)
        grid[...] = 0.0
        start = initial(n)[c[0] * local[0]:(c[0] + 1) * local[0],
                           c[1] * local[1]:(c[1] + 1) * local[1],
                           c[2] * local[2]:(c[2] + 1) * local[2]]
        for k in (0, 1):
            grid[k][1:-1, 1:-1, 1:-1] = start
        plan = []
        for ax, d, s, h in faces(local):
            nb = list(c)
            nb[ax] += d
            st, ht = subarray(shape, s), subarray(shape, h)
            types += [st, ht]
            plan.append((rank_of(nb, p), st, ht))

        def exchange(copy):
            for peer, st, ht in plan:
                win.Put([grid[copy], 1, st], peer, target=(copy * per, 1, ht))
            win.Fence()

        win.Fence()
        exchange(0)
        t0 = time.perf_counter()
        exch = 0.0
        cur = 0
        for _ in range(args.iters):
            new = 1 - cur
            sweep(grid[cur], grid[new])
            t1 = time.perf_counter()
            exchange(new)
            exch += time.perf_counter() - t1
            cur = new
        per_iter = (time.perf_counter() - t0) / max(args.iters, 1)
        rc = 0
        inner = subarray(shape, (slice(1, -1),) * 3)
        types.append(inner)
        if rank == 0:
            result = np.empty((n, n, n))
            for r in range(size):
                rc_ = coords(r, p)
                buf = np.empty(local)
                win.Lock(r, MPI.LOCK_SHARED)
                win.Get(buf, r, target=(cur * per, 1, inner))
                win.Unlock(r)
                result[rc_[0] * local[0]:(rc_[0] + 1) * local[0],
                       rc_[1] * local[1]:(rc_[1] + 1) * local[1],
                       rc_[2] * local[2]:(rc_[2] + 1) * local[2]] = buf
            rc = finish(args, size, per_iter, exch / max(args.iters, 1), result,
                        "mpi4py Win.Put subarray + Win.Fence")
        comm.Barrier()
    finally:
        for t in types:
            t.Free()
        win.Free()
    return rc


if __name__ == "__main__":
    sys.exit(main())
