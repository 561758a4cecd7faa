"""mpi4py baseline of gexmk's main benchmark: MPI one-sided, passive target.

    mpiexec -n 2 python bench/mpi4py_rma.py [--sizes 8:4M] [--iters 300] [--batch-us 200]

A window from ``MPI.Win.Allocate`` on every rank, opened once with ``Lock_all``
(passive target epoch); rank 0 times, against rank 1:

- per size: ``Put`` + ``Flush(1)`` and ``Get`` + ``Flush(1)`` (the blocking put and
  get of MPI one-sided), whose median gives latency and put bandwidth;
- 8 B: ``Put`` without flush (issue time per call; one ``Flush`` after each batch,
  untimed), and ``Fetch_and_op(SUM)`` + ``Flush`` on an int64.

Rank 1 waits in ``Barrier`` (MPICH polls there, so any target-side progress an
implementation needs is made).  Same method as gexmk's side (``gexmk.bench.measure``:
calibrated batches timed with ``perf_counter_ns``, interleaved, median per
operation); page-aligned numpy arrays as buffers on both sides.  Rank 0 prints one JSON
object on stdout, times in µs.
"""
import argparse
import json
import sys
from itertools import repeat

import numpy as np
from mpi4py import MPI

from gexmk.bench import aligned_bytes, measure, parse_sizes


def _us(m):
    return {(k[:-3] + "_us" if k.endswith("_ns") else k): (v / 1e3 if k.endswith("_ns") else v)
            for k, v in m.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description="mpi4py one-sided baseline (run under mpiexec -n 2)")
    ap.add_argument("--sizes", type=parse_sizes, default=parse_sizes("8:4M"))
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--batch-us", type=float, default=200.0)
    args = ap.parse_args(argv)

    comm = MPI.COMM_WORLD
    if comm.size < 2:
        print("mpi4py_rma.py needs 2 processes: mpiexec -n 2 python bench/mpi4py_rma.py",
              file=sys.stderr)
        return 2
    win = MPI.Win.Allocate(max(args.sizes) + 4096, 1, comm=comm)
    win.Lock_all()
    out = None
    try:
        if comm.rank == 0:
            out = _rank0(win, args)
        comm.Barrier()
    finally:
        win.Unlock_all()
        win.Free()
    if out is not None:
        out["library"] = " ".join(MPI.Get_library_version().splitlines()[0].split())
        out["mpi4py"] = __import__("mpi4py").__version__
        print(json.dumps(out), flush=True)
    return 0


def _rank0(win, args):
    T = 1                                  # target rank
    bns = args.batch_us * 1e3
    put, get, flush = win.Put, win.Get, win.Flush
    src8, dst8 = aligned_bytes(8, True), aligned_bytes(8)
    one = np.ones(1, dtype=np.int64)
    old = np.zeros(1, dtype=np.int64)
    fop, SUM = win.Fetch_and_op, MPI.SUM
    adisp = max(args.sizes)                # the int64 for atomics lies past the data

    def put_flush(k):
        for _ in repeat(None, k):
            put(src8, T)
            flush(T)

    def get_flush(k):
        for _ in repeat(None, k):
            get(dst8, T)
            flush(T)

    def put_issue(k):
        for _ in repeat(None, k):
            put(src8, T)

    def fetch_and_op_flush(k):
        for _ in repeat(None, k):
            fop(one, old, T, adisp, SUM)
            flush(T)

    small = measure({"put_flush": put_flush, "get_flush": get_flush,
                     "put_issue": (put_issue, lambda: flush(T)),
                     "fetch_and_op_flush": fetch_and_op_flush}, args.iters, bns)
    res = {"small": {k: _us(v) for k, v in small.items()}, "per_size": {}}
    for n in args.sizes:
        src, dst = aligned_bytes(n, True), aligned_bytes(n)

        def s_put(k, src=src):
            for _ in repeat(None, k):
                put(src, T)
                flush(T)

        def s_get(k, dst=dst):
            for _ in repeat(None, k):
                get(dst, T)
                flush(T)

        m = measure({"put_flush": s_put, "get_flush": s_get}, args.iters, bns)
        res["per_size"][str(n)] = {k: _us(v) for k, v in m.items()}
    return res


if __name__ == "__main__":
    sys.exit(main())
