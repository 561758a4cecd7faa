"""3-D halo exchange with gexmk: Jacobi sweeps of the 7-point stencil on a periodic
n x n x n grid, split into blocks over the ranks, the six faces of every block put
into the neighbours' halos as strided transfers (GASNet-EX VIS, issue 22).

    python -m gexmk.run -n 2 examples/halo3d.py --n 48 --iters 20

Each rank owns an (n/px) x (n/py) x (n/pz) block (px * py * pz = ranks, as cubic as
the rank count allows) and keeps two copies of it, each with a halo layer on every
side, in its segment; every rank's layout is the same, so a face's strides are the
same at both ends.  An iteration: sweep into the other copy; put that copy's six
boundary faces into the neighbours' halo faces with ``put_strided_nbi`` (a face
normal to x is a plane of (ny x nz) elements whose rows are contiguous; one normal
to z is a plane of single elements, every stride non-unit: all six are strided
on both sides); ``nbi_wait``, then a barrier.  With fewer ranks than a dimension's
neighbours (2 ranks: y and z) a rank is its own neighbour: the same puts go to its
own segment.

The result is compared bit for bit with the same sweeps on the whole grid in one
numpy process (``--no-check`` skips that), and rank 0 prints the time per
iteration.  ``examples/halo3d_mpi4py.py`` is the same program with mpi4py
``Win.Put`` of subarray datatypes + ``Win.Fence``.
"""
import argparse
import json
import sys
import time

import numpy as np

import gexmk

# ---- shared with halo3d_mpi4py.py ----------------------------------------------------


def dims(size):
    """(px, py, pz): a factorisation of ``size``, as cubic as it gets, px largest."""
    best = (size, 1, 1)
    for a in range(1, size + 1):
        for b in range(1, size // a + 1):
            if size % (a * b) == 0:
                c = size // (a * b)
                d = tuple(sorted((a, b, c), reverse=True))
                if max(d) - min(d) < max(best) - min(best):
                    best = d
    return best


def coords(rank, p):
    px, py, pz = p
    return rank // (py * pz), (rank // pz) % py, rank % pz


def rank_of(c, p):
    px, py, pz = p
    return (c[0] % px) * py * pz + (c[1] % py) * pz + (c[2] % pz)


def initial(n):
    """The starting grid: a smooth bump plus a ramp, so every face differs."""
    x = np.arange(n)
    g = np.sin(x[:, None, None] * 0.3) + np.cos(x[None, :, None] * 0.2) + 0.01 * x[None, None, :]
    return np.ascontiguousarray(g, dtype=np.float64)


def sweep(u, out):
    """One Jacobi sweep of the 7-point stencil: ``out``'s interior from ``u`` (with
    halos); the six terms in a fixed order so that the result is bitwise the serial one."""
    c = (slice(1, -1),) * 3
    out[c] = (u[:-2, 1:-1, 1:-1] + u[2:, 1:-1, 1:-1] + u[1:-1, :-2, 1:-1] + u[1:-1, 2:, 1:-1]
              + u[1:-1, 1:-1, :-2] + u[1:-1, 1:-1, 2:]) / 6.0


def serial(n, iters):
    """The whole periodic computation in one process: the reference."""
    u = np.zeros((n + 2,) * 3)
    v = u.copy()
    u[1:-1, 1:-1, 1:-1] = initial(n)
    for _ in range(iters):
        for ax in range(3):                       # periodic halos
            lo = [slice(None)] * 3
            hi = [slice(None)] * 3
            lo[ax], hi[ax] = 0, n
            u[tuple(lo)] = u[tuple(hi)]
            lo[ax], hi[ax] = n + 1, 1
            u[tuple(lo)] = u[tuple(hi)]
        sweep(u, v)
        u, v = v, u
    return u[1:-1, 1:-1, 1:-1].copy()


def faces(local):
    """The six (send face, neighbour's halo face) index pairs of a block with halos
    and the direction (axis, +-1) to the neighbour that receives it."""
    out = []
    for ax in range(3):
        for d, src, dst in ((-1, 1, local[ax] + 1), (+1, local[ax], 0)):
            s = [slice(1, -1)] * 3
            h = [slice(1, -1)] * 3
            s[ax], h[ax] = src, dst
            out.append((ax, d, tuple(s), tuple(h)))
    return out


def parse(argv=None, prog="halo3d.py"):
    ap = argparse.ArgumentParser(prog=prog, description="3-D halo exchange, Jacobi, six faces")
    ap.add_argument("--n", type=int, default=48, help="grid points per side (default 48)")
    ap.add_argument("--iters", type=int, default=20, help="Jacobi sweeps (default 20)")
    ap.add_argument("--no-check", action="store_true", help="skip the serial numpy comparison")
    ap.add_argument("--json", metavar="PATH", help="rank 0 also writes its figures here")
    return ap.parse_args(argv)


def finish(args, size, per_iter, exchange, result, what):
    ok = None if args.no_check else bool(np.array_equal(result, serial(args.n, args.iters)))
    print(f"{what}: {args.n}^3 grid, {args.iters} iterations, {size} ranks: "
          f"{per_iter * 1e6:.1f} µs per iteration ({exchange * 1e6:.1f} in the halo exchange); "
          + ("not checked" if ok is None else ("bitwise equal to serial numpy" if ok else
                                               "DIFFERS from serial numpy")), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"n": args.n, "iters": args.iters, "ranks": size, "ok": ok,
                       "per_iter_us": per_iter * 1e6, "exchange_us": exchange * 1e6}, f)
    return 0 if ok is not False else 1


def block(rank, size, n):
    p = dims(size)
    if any(n % q for q in p):
        raise SystemExit(f"the grid side {n} must divide by the rank grid {p}")
    local = tuple(n // q for q in p)
    c = coords(rank, p)
    return p, local, c


# ---- the gexmk program -----------------------------------------------------------------

def strided(view):
    """(byte strides, counts) of a numpy view, dimension 0 fastest (GASNet-EX order)."""
    return list(reversed(view.strides)), list(reversed(view.shape))


def main(argv=None):
    args = parse(argv)
    n = args.n
    with gexmk.init() as client:
        tm = client.tm
        rank, size = tm.rank, tm.size
        p, local, c = block(rank, size, n)
        shape = tuple(q + 2 for q in local)
        nbytes = int(np.prod(shape)) * 8
        seg = client.segment_attach(2 * nbytes)
        grid = seg.view(np.float64).reshape((2,) + shape)
        start = initial(n)[c[0] * local[0]:(c[0] + 1) * local[0],
                           c[1] * local[1]:(c[1] + 1) * local[1],
                           c[2] * local[2]:(c[2] + 1) * local[2]]
        grid[...] = 0.0
        # the exchange: face -> the neighbour in that direction, into its opposite halo
        plan = []
        for ax, d, s, h in faces(local):
            nb = list(c)
            nb[ax] += d
            peer = rank_of(nb, p)
            plan.append((peer, s, h))
        for k in (0, 1):
            grid[k][1:-1, 1:-1, 1:-1] = start

        def exchange(copy):
            g = grid[copy]
            for peer, s, h in plan:
                face = g[s]
                st, cnt = strided(face)
                dest = tm.addr(peer, g[h].__array_interface__["data"][0]
                               - grid.__array_interface__["data"][0])
                # same layout everywhere: the neighbour's halo face has the face's strides
                tm.put_strided_nbi(peer, dest, st, face, st, 8, cnt)
            gexmk.nbi_wait(gexmk.EC_PUT)
            tm.barrier()                 # every neighbour's faces have arrived

        tm.barrier()                     # every block is set up before any face arrives
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
        if rank == 0:                    # gather the blocks with strided gets
            result = np.empty((n, n, n))
            for r in range(size):
                rc_ = coords(r, p)
                sub = result[rc_[0] * local[0]:(rc_[0] + 1) * local[0],
                             rc_[1] * local[1]:(rc_[1] + 1) * local[1],
                             rc_[2] * local[2]:(rc_[2] + 1) * local[2]]
                inner = grid[cur][1:-1, 1:-1, 1:-1]
                off = inner.__array_interface__["data"][0] - grid.__array_interface__["data"][0]
                tm.get_strided(sub.__array_interface__["data"][0], strided(sub)[0], r,
                               tm.addr(r, off), strided(inner)[0], 8, strided(sub)[1])
            rc = finish(args, size, per_iter, exch / max(args.iters, 1), result,
                        "gexmk put_strided_nbi")
        tm.barrier()
    return rc


if __name__ == "__main__":
    sys.exit(main())
