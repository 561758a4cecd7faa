"""2-D heat equation with gexmk: Jacobi sweeps of the 5-point stencil on an
n x n grid, rows split among the ranks, halo rows exchanged by puts into the
neighbours' segments.

    python -m gexmk.run -n 4 examples/heat.py --n 256 --iters 100

The grid's edges are fixed (top 1.0, left 0.5, the others 0.0); the interior
starts at 0.  Each rank owns a band of interior rows and keeps two copies of
its band, each with one halo row above and below, in its segment (Jacobi
reads one copy and writes the other).  An iteration: sweep into the other
copy, put the band's first and last new rows into the neighbours' halo rows
of that copy, wait until the neighbours' rows have arrived, swap.

The result is compared bit for bit with the same sweeps on the whole grid in
one numpy process (``--no-check`` skips that), and rank 0 prints the time per
iteration.  ``examples/heat_mpi4py.py`` is the same program with mpi4py
``Win.Put`` + ``Win.Fence``.
"""
import argparse
import json
import sys
import time

import numpy as np

import gexmk


# ---- shared with heat_mpi4py.py ------------------------------------------------------

def band(rank, size, n):
    """Global rows [lo, hi) of the interior that ``rank`` owns."""
    inner = n - 2
    return 1 + rank * inner // size, 1 + (rank + 1) * inner // size


def initial(n):
    """The starting grid: fixed edges, interior 0."""
    u = np.zeros((n, n))
    u[0, :] = 1.0
    u[1:, 0] = 0.5
    return u


def sweep(u, out):
    """One Jacobi sweep: the interior of ``out`` from ``u`` (edges untouched)."""
    out[1:-1, 1:-1] = 0.25 * (u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:])


def serial(n, iters):
    """The whole computation in one process: the reference."""
    u = initial(n)
    v = u.copy()
    for _ in range(iters):
        sweep(u, v)
        u, v = v, u
    return u


def parse(argv=None, prog="heat.py"):
    ap = argparse.ArgumentParser(prog=prog, description="2-D heat equation, Jacobi, row halos")
    ap.add_argument("--n", type=int, default=256, help="grid points per side (default 256)")
    ap.add_argument("--iters", type=int, default=100, help="Jacobi sweeps (default 100)")
    ap.add_argument("--no-check", action="store_true", help="skip the serial numpy comparison")
    ap.add_argument("--json", metavar="PATH", help="rank 0 also writes its figures here")
    return ap.parse_args(argv)


def finish(args, rank, size, per_iter, result, what, exchange=None):
    """Rank 0: check against the serial computation, print and write the figures
    (``per_iter``, ``exchange``: seconds per iteration, all of it and the halo
    exchange's part)."""
    ok = None
    if not args.no_check:
        ok = bool(np.array_equal(result, serial(args.n, args.iters)))
    print(f"{what}: {args.n}x{args.n} grid, {args.iters} iterations, {size} ranks: "
          f"{per_iter * 1e6:.1f} µs per iteration"
          + (f" ({exchange * 1e6:.1f} in the halo exchange); " if exchange is not None else "; ")
          + ("not checked" if ok is None else ("bitwise equal to serial numpy" if ok else
                                               "DIFFERS from serial numpy")), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"n": args.n, "iters": args.iters, "ranks": size,
                       "per_iter_us": per_iter * 1e6,
                       "exchange_us": exchange * 1e6 if exchange is not None else None, "ok": ok}, f)
    return 0 if ok is not False else 1


# ---- the gexmk program ---------------------------------------------------------------

def main(argv=None):
    args = parse(argv)
    n = args.n
    with gexmk.init() as client:
        tm = client.tm
        rank, size = tm.rank, tm.size
        if n - 2 < size:
            raise SystemExit(f"heat.py: {size} ranks need a grid of at least {size + 2} rows")
        lo, hi = band(rank, size, n)
        rows = hi - lo
        stride = (n - 2 + size - 1) // size + 2        # rows per copy, the same on every rank
        row_bytes = n * 8
        seg = client.segment_attach(2 * stride * row_bytes)
        grid = seg.view(np.float64).reshape(2, stride, n)
        copies = [grid[0, :rows + 2], grid[1, :rows + 2]]   # my band + its two halo rows
        start = initial(n)[lo - 1:hi + 1]
        copies[0][:] = start
        copies[1][:] = start
        up = rank - 1 if rank > 0 else None
        down = rank + 1 if rank < size - 1 else None
        if up is not None:          # the bottom halo row of the rank above
            up_lo, up_hi = band(up, size, n)
            up_halo = up_hi - up_lo + 1

        def halo(peer, copy, row):
            """Address of halo row ``row`` of ``copy`` in ``peer``'s segment."""
            return tm.addr(peer, (copy * stride + row) * row_bytes)

        # The halo exchange is these two functions, one line of gexmk each: with
        # put_signal / wait_until, send_halo adds to a counter in the neighbour's
        # segment and wait_halos waits for its own counter to reach 2 per
        # iteration (1 on the first and last rank).
        def send_halo(peer, dest, row):
            tm.put(peer, dest, row)

        def wait_halos():
            tm.barrier()                # the neighbours' rows have arrived

        tm.barrier()
        t0 = time.perf_counter()
        cur = 0
        exch = 0.0                  # time spent in the halo exchange
        for _ in range(args.iters):
            new = 1 - cur
            sweep(copies[cur], copies[new])
            t1 = time.perf_counter()
            if up is not None:      # my first row becomes the bottom halo of the rank above
                send_halo(up, halo(up, new, up_halo), copies[new][1])
            if down is not None:    # my last row becomes the top halo of the rank below
                send_halo(down, halo(down, new, 0), copies[new][rows])
            wait_halos()
            exch += time.perf_counter() - t1
            cur = new
        per_iter = (time.perf_counter() - t0) / max(args.iters, 1)

        rc = 0
        if rank == 0:               # gather the bands with gets, then compare
            result = initial(n)
            result[lo:hi] = copies[cur][1:rows + 1]
            for r in range(1, size):
                rlo, rhi = band(r, size, n)
                tm.get(result[rlo:rhi], r, halo(r, cur, 1))
            rc = finish(args, rank, size, per_iter, result, "gexmk", exch / max(args.iters, 1))
        tm.barrier()                # nobody leaves while rank 0 reads their bands
    return rc


if __name__ == "__main__":
    sys.exit(main())
