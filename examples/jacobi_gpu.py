"""2-D Jacobi on GPUs with gexmk: row bands, one rank per GPU, halo rows put by
the GPU's stream straight into the neighbours' device segments.

    python -m gexmk.run -n 2 examples/jacobi_gpu.py --nx 16384 --ny 16384 --iters 1000

The problem is the one of NVIDIA's multi-gpu-programming-models Jacobi (its
``nccl`` and ``nvshmem`` variants are this program's baselines; see
bench/README.md): an ``nx`` x ``ny`` grid of floats (its ``real``; ``--dtype
float64`` for doubles), Laplace's equation, the
left and right columns fixed to ``sin(2 pi y / (ny - 1))``, periodic in y; the
``ny - 2`` computed rows are split in bands among the ranks, each band stored
with one halo row above and below, twice (Jacobi reads one copy, writes the
other).  An iteration, all enqueued on one CUDA stream with no host
synchronisation:

1. the stencil kernel (CuPy ``RawKernel``) computes the band into the other
   copy, and, on a norm iteration, adds the squared update to a device word;
2. ``put_signal_on_stream`` sends the band's first new row into the bottom
   halo of the rank above and its last new row into the top halo of the rank
   below, each followed by a signal word set to the iteration number in the
   neighbour's segment (the data is visible before the signal);
3. ``signal_wait_until_on_stream`` makes the next kernel wait, on the GPU,
   until both neighbours' rows of this iteration have arrived.

Every ``--nccheck`` iterations the residual norm is summed over the team
(``tm.allreduce``) once the stream has reached it, which the host waits for
only after enqueuing the next iteration (the GPU never idles for the host);
``--nccheck 1`` does it every iteration, as the baseline runs measured do.  (Not captured into a CUDA
graph: the signal values grow with the iteration, and a captured
``cuStreamWaitValue64`` keeps the value it was captured with.)  With one rank
the halos go to itself (the same program, the single-GPU reference).  ``--check``
compares every band with a serial numpy run (small grids).  Rank 0 prints
the time per iteration and, with ``--json``, writes its figures.
"""
import argparse
import json
import math
import sys
import time

import numpy as np

import gexmk

KERNEL = r"""
extern "C" __global__ void jacobi(const REAL* __restrict__ a, REAL* __restrict__ a_new,
                                  double* __restrict__ l2, int iy_start, int iy_end, int nx,
                                  int calc_norm)
{
    const int iy = blockIdx.y * blockDim.y + threadIdx.y + iy_start;
    const int ix = blockIdx.x * blockDim.x + threadIdx.x + 1;
    REAL d = 0;
    if (iy < iy_end && ix < nx - 1) {
        const IDX row = (IDX)iy * nx;
        const REAL v = (REAL)0.25 * (a[row + ix + 1] + a[row + ix - 1] + a[row + nx + ix] + a[row - nx + ix]);
        a_new[row + ix] = v;
        if (calc_norm) {
            const REAL r = v - a[row + ix];
            d = r * r;
        }
    }
    if (!calc_norm)
        return;
    /* the block's sum: within warps by shuffles, across them through shared
       memory; the blocks' sums add up in double */
    __shared__ REAL part[32];
    const int t = threadIdx.y * blockDim.x + threadIdx.x;
    for (int o = 16; o > 0; o >>= 1)
        d += __shfl_down_sync(0xffffffffu, d, o);
    if ((t & 31) == 0)
        part[t >> 5] = d;
    __syncthreads();
    if (t < 32) {
        const int nw = (blockDim.x * blockDim.y + 31) >> 5;
        d = t < nw ? part[t] : (REAL)0;
        for (int o = 16; o > 0; o >>= 1)
            d += __shfl_down_sync(0xffffffffu, d, o);
        if (t == 0)
            atomicAdd(l2, (double)d);
    }
}
"""

BLOCK = (32, 32)


def band(rank, size, ny):
    """Global rows [lo, hi) of the ny - 2 computed rows (global rows 1..ny-2) that
    ``rank`` owns; the first ranks take one more where they do not divide."""
    rows = ny - 2
    base, extra = divmod(rows, size)
    lo = 1 + rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


def boundary(ny, rows):
    """The fixed left/right column value of global rows ``rows``."""
    return np.sin(2.0 * math.pi * rows / (ny - 1))


def initial_band(nx, ny, lo, hi, dtype=np.float32):
    """Rows lo-1 .. hi (the band and its two halo rows) of the starting grid:
    zeros, the left and right columns fixed."""
    g = np.zeros((hi - lo + 2, nx), dtype)
    b = boundary(ny, np.arange(lo - 1, hi + 1))
    g[:, 0] = b
    g[:, -1] = b
    return g


def serial(nx, ny, iters, dtype=np.float32):
    """The reference: the same iterations on the whole grid in numpy (periodic in
    y over the computed rows 1..ny-2).  Returns the grid and the last norm."""
    a = initial_band(nx, ny, 1, ny - 1, dtype)
    a_new = a.copy()
    norm = 0.0
    for _ in range(iters):
        a[0] = a[-2]                  # periodic: halos from the other end
        a[-1] = a[1]
        a_new[1:-1, 1:-1] = 0.25 * (a[1:-1, 2:] + a[1:-1, :-2] + a[2:, 1:-1] + a[:-2, 1:-1])
        diff = a_new[1:-1, 1:-1].astype(np.float64) - a[1:-1, 1:-1]
        norm = math.sqrt(float((diff * diff).sum()))
        a, a_new = a_new, a
    a[0] = a[-2]
    a[-1] = a[1]
    return a, norm


def parse(argv=None):
    ap = argparse.ArgumentParser(prog="jacobi_gpu.py", description=__doc__.splitlines()[0])
    ap.add_argument("--nx", type=int, default=16384, help="grid columns (default 16384)")
    ap.add_argument("--ny", type=int, default=16384, help="grid rows (default 16384)")
    ap.add_argument("--iters", type=int, default=1000, help="timed iterations (default 1000)")
    ap.add_argument("--warmup", type=int, default=10, help="untimed iterations first (default 10)")
    ap.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                    help="grid values (default float32, the baseline's `real`; the norm is "
                         "summed in float64 either way)")
    ap.add_argument("--nccheck", type=int, default=1,
                    help="residual norm every this many iterations (default 1)")
    ap.add_argument("--no-overlap", action="store_true",
                    help="compute the whole band, then exchange (no second stream)")
    ap.add_argument("--check", action="store_true",
                    help="compare every band with a serial numpy run (small grids)")
    ap.add_argument("--gpus", type=int, default=0,
                    help="GPUs to spread the ranks over (default: all visible)")
    ap.add_argument("--json", metavar="PATH", help="rank 0 writes its figures here")
    return ap.parse_args(argv)


class Jacobi:
    """One rank's band, its segment, stream and kernel."""

    def __init__(self, args, client, cp):
        self.args, self.cp = args, cp
        self.tm = tm = client.tm
        self.rank, self.size = tm.rank, tm.size
        ngpu = args.gpus or cp.cuda.runtime.getDeviceCount()
        self.device = self.rank % ngpu
        cp.cuda.Device(self.device).use()
        nx, ny = args.nx, args.ny
        if ny - 2 < self.size:
            raise SystemExit(f"jacobi_gpu.py: {self.size} ranks need at least {self.size + 2} rows")
        self.lo, self.hi = band(self.rank, self.size, ny)
        self.rows = self.hi - self.lo
        # the same layout on every rank: copies of the largest band, signal words first
        self.stride_rows = band(0, self.size, ny)[1] - band(0, self.size, ny)[0] + 2
        self.dtype = np.dtype(args.dtype)
        self.row_bytes = nx * self.dtype.itemsize
        self.copy_bytes = self.stride_rows * self.row_bytes
        self.data_off = 1 << 16                   # signal words in the first 64 KiB
        mk = client.mk_create(gexmk.CUDA_UVA, self.device)
        self.seg = client.segment_create(self.data_off + 2 * self.copy_bytes, kind=mk)
        self.ep = client.ep_create()
        self.ep.bind_segment(self.seg)
        tm.publish_bound_segment([self.ep])
        self.team = tm.create_for(self.ep)        # the device segments, by team rank
        seg_arr = cp.asarray(self.seg).view(self.dtype)
        off = self.data_off // self.dtype.itemsize
        n_copy = self.stride_rows * nx
        self.copies = [seg_arr[off + c * n_copy: off + (c + 1) * n_copy].reshape(self.stride_rows, nx)
                       for c in (0, 1)]
        start = initial_band(nx, ny, self.lo, self.hi, self.dtype)
        for c in self.copies:
            c[:self.rows + 2] = cp.asarray(start)
        cp.asarray(self.seg)[:self.data_off].fill(0)   # the signal words
        self.up = (self.rank - 1) % self.size     # periodic in y
        self.down = (self.rank + 1) % self.size
        up_lo, up_hi = band(self.up, self.size, ny)
        self.up_halo = up_hi - up_lo + 1          # the bottom halo row of the rank above
        # two norm slots: iteration k's norm is read by the host while k + 1 runs
        self.l2 = cp.zeros(2, cp.float64)
        self.l2_host = cp.cuda.alloc_pinned_memory(16)
        self.l2_np = np.frombuffer(self.l2_host, np.float64, 2)
        self.l2_done = [cp.cuda.Event(block=False, disable_timing=True) for _ in range(2)]
        self.stream = cp.cuda.Stream(non_blocking=True)
        # the boundary rows and the halo exchange on a stream of their own, of
        # higher priority, overlapping the interior's kernel (three rows at least)
        self.overlap = self.rows >= 3 and not args.no_overlap
        try:
            self.bstream = cp.cuda.Stream(non_blocking=True, priority=-1)
        except TypeError:           # a CuPy without stream priorities
            self.bstream = cp.cuda.Stream(non_blocking=True)
        self.ev_int = cp.cuda.Event(block=False, disable_timing=True)   # interior kernel done
        self.ev_bnd = cp.cuda.Event(block=False, disable_timing=True)   # boundary kernels done
        self.ev_int.record(self.stream)
        self.ev_bnd.record(self.bstream)
        real = "float" if self.dtype == np.float32 else "double"
        idx = "int" if self.stride_rows * nx < 2 ** 31 else "long long"
        self.kernel = cp.RawKernel(KERNEL.replace("REAL", real).replace("IDX", idx), "jacobi")
        inner = self.rows - 2 if self.overlap else self.rows
        self.grid = ((nx - 2 + BLOCK[0] - 1) // BLOCK[0], (inner + BLOCK[1] - 1) // BLOCK[1])
        self.bgrid = ((nx - 2 + 1023) // 1024, 1)
        cp.cuda.runtime.deviceSynchronize()
        tm.barrier()

    def sig(self, rank, which):
        """Address of signal word ``which`` (0: my top halo came, 1: my bottom one) in rank's segment."""
        return self.team.addr(rank, 8 * which)

    def halo(self, rank, copy, row):
        return self.team.addr(rank, self.data_off + copy * self.copy_bytes + row * self.row_bytes)

    def row(self, copy, row):
        return (self.seg.address + self.data_off + copy * self.copy_bytes + row * self.row_bytes,
                self.row_bytes)

    def enqueue(self, it, cur, norm):
        """Iteration ``it`` (1-based) from copy ``cur`` into the other; on a norm
        iteration, its norm lands in slot ``it % 2``.  With overlap: the band's
        first and last rows are computed and sent on the boundary stream while
        the interior's kernel runs on the compute stream."""
        cp, tm, s, nx = self.cp, self.team, self.stream, self.args.nx
        b = self.bstream if self.overlap else s
        new = 1 - cur
        slot = it % 2
        l2 = self.l2[slot:slot + 1]
        flag = np.int32(1 if norm else 0)
        if norm:
            l2.data.memset_async(0, 8, s)
        src, dst = self.copies[cur], self.copies[new]
        if self.overlap:
            # the rows the boundary kernels write were read by the last interior
            # kernel, and the norm word was just zeroed on s
            b.wait_event(self.ev_int_after(s))
            for row in (1, self.rows):
                self.kernel(self.bgrid, (1024, 1), (src, dst, l2, np.int32(row), np.int32(row + 1),
                                                    np.int32(nx), flag), stream=b)
            self.ev_bnd.record(b)
            self.kernel(self.grid, BLOCK, (src, dst, l2, np.int32(2), np.int32(self.rows),
                                           np.int32(nx), flag), stream=s)
            # what follows on s (the norm's copy, the next interior kernel) reads
            # the boundary rows; the halos are the next boundary kernels' (on b)
            s.wait_event(self.ev_bnd)
        else:
            self.kernel(self.grid, BLOCK, (src, dst, l2, np.int32(1), np.int32(self.rows + 1),
                                           np.int32(nx), flag), stream=s)
        # my first row -> the bottom halo of the rank above; my last -> the top halo below
        tm.put_signal_on_stream(self.up, self.halo(self.up, new, self.up_halo), self.row(new, 1),
                                self.sig(self.up, 1), it, gexmk.SIGNAL_SET, b)
        tm.put_signal_on_stream(self.down, self.halo(self.down, new, 0), self.row(new, self.rows),
                                self.sig(self.down, 0), it, gexmk.SIGNAL_SET, b)
        me = self.seg.address
        tm.signal_wait_until_on_stream(me, gexmk.CMP_GE, it, b)
        tm.signal_wait_until_on_stream(me + 8, gexmk.CMP_GE, it, b)
        if norm:
            cp.cuda.runtime.memcpyAsync(self.l2_np.ctypes.data + 8 * slot, l2.data.ptr, 8,
                                        cp.cuda.runtime.memcpyDeviceToHost, s.ptr)
            self.l2_done[slot].record(s)
        return new

    def ev_int_after(self, s):
        """An event recorded now on the compute stream (its work so far)."""
        self.ev_int.record(s)
        return self.ev_int

    def residual(self, it):
        """The team's residual norm of norm iteration ``it``, once the GPU got there."""
        slot = it % 2
        self.l2_done[slot].synchronize()
        total = np.zeros(1)
        self.tm.allreduce(self.l2_np[slot:slot + 1], total, "sum")
        return math.sqrt(float(total[0]))

    def run(self, first, count, cur):
        """Iterations first .. first+count-1; returns (copy holding the result, last
        norm).  A norm iteration's norm is summed over the team after the next
        iteration is enqueued, so that the GPU never waits for the host."""
        norm = None
        pending = None
        nccheck = self.args.nccheck
        for it in range(first, first + count):
            check = nccheck > 0 and it % nccheck == 0
            cur = self.enqueue(it, cur, check)
            if pending is not None:
                norm = self.residual(pending)
            pending = it if check else None
        if pending is not None:
            norm = self.residual(pending)
        self.stream.synchronize()
        self.bstream.synchronize()
        return cur, norm


def main(argv=None):
    args = parse(argv)
    import cupy as cp
    with gexmk.init() as client:
        j = Jacobi(args, client, cp)
        cur, _ = j.run(1, args.warmup, 0)
        j.tm.barrier()
        t0 = time.perf_counter()
        cur, norm = j.run(1 + args.warmup, args.iters, cur)
        j.tm.barrier()
        elapsed = time.perf_counter() - t0
        if norm is None:
            norm = float("nan")             # no norm iteration in the timed range
        ok = None
        if args.check:
            ref, ref_norm = serial(args.nx, args.ny, args.warmup + args.iters, j.dtype)
            mine = j.copies[cur][1:j.rows + 1].get()
            tol = 1e-5 if j.dtype == np.float32 else 1e-12
            ok_band = bool(np.allclose(mine, ref[j.lo:j.hi], rtol=tol, atol=tol * 1e-2))
            ok_norm = bool(math.isnan(norm) or abs(norm - ref_norm) <= tol * max(ref_norm, 1e-30))
            flags = np.zeros(1, np.int64)
            j.tm.allreduce(np.array([0 if (ok_band and ok_norm) else 1], np.int64), flags, "sum")
            ok = int(flags[0]) == 0
            if not ok_band or not ok_norm:
                print(f"rank {j.rank}: band {'ok' if ok_band else 'DIFFERS'}, norm {norm!r} vs "
                      f"serial {ref_norm!r}", file=sys.stderr, flush=True)
        if j.rank == 0:
            per_iter = elapsed / args.iters
            print(f"jacobi_gpu: {args.nx}x{args.ny}, {args.iters} iterations (norm every "
                  f"{args.nccheck}), {j.size} ranks on {len({r % (args.gpus or cp.cuda.runtime.getDeviceCount()) for r in range(j.size)})} GPU(s): "
                  f"{elapsed:.4f} s, {per_iter * 1e6:.1f} us per iteration, residual {norm:.6e}"
                  + ("" if ok is None else ("; equal to serial numpy" if ok else
                                             "; DIFFERS from serial numpy")), flush=True)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump({"nx": args.nx, "ny": args.ny, "iters": args.iters, "dtype": args.dtype,
                               "nccheck": args.nccheck, "ranks": j.size, "seconds": elapsed,
                               "per_iter_us": per_iter * 1e6, "norm": norm, "ok": ok}, f)
        return 0 if ok is not False else 1


if __name__ == "__main__":
    sys.exit(main())
