"""gexmk's main benchmark: ``python -m gexmk.bench [-n 2] [--sizes 8:4M] [--iters N]
[--no-mpi] [--no-cython] [--json out.json]``.

Run outside a job, it builds the Cython loop module (``bench/nogil_loop.pyx``)
the way an outside project would, relaunches itself as a job of ``-n`` ranks
under ``python -m gexmk.run``, then runs the mpi4py baseline
(``bench/mpi4py_rma.py`` under ``mpiexec -n 2``) and prints every figure beside
its baseline.  Run inside a job (``python -m gexmk.run -n 2 -m gexmk.bench``),
rank 0 does all of that itself.  Rank 0 times operations on team rank 1 (itself
in a job of one); the other ranks wait in a barrier.

What is measured, all in the same run:

- per size (8 B ... 4 MiB): blocking ``tm.put`` and ``tm.get`` from Python, and
  ``numpy.copyto`` between two local arrays of that size (the memcpy baseline),
  interleaved batch by batch; mpi4py ``Put``/``Get`` + ``Flush(target)`` on a
  ``Win.Allocate`` window under ``Lock_all`` (passive target);
- 8 B operations from Python: put, get, put_val, get_val, put_nbi (issue time),
  atomic FADD, beside mpi4py Put+Flush, Get+Flush, Put without flush,
  Fetch_and_op+Flush;
- the cimport API in nogil loops (``rma.put``/``put_nbi``/``get`` 8 B, and
  ``rma.put`` of the largest size beside a C ``memcpy`` loop);
- the heat-equation example (``examples/heat.py``: Jacobi sweeps, halo rows by
  puts + ``tm.barrier()``) beside the same program with mpi4py ``Win.Put`` +
  ``Win.Fence`` (``examples/heat_mpi4py.py``), per iteration, for each grid of
  ``--heat-grids`` and rank count of ``--heat-ranks`` (each result checked
  bitwise against serial numpy).

Everything it runs is installed with the package (``gexmk/_bench/``: the
mpi4py scripts, the heat example, and the nogil loop module built with the
package), so an installed gexmk runs it in full from any directory; in a
source tree without a build it falls back on ``bench/`` and ``examples/``
(and builds the loop module on the fly).

Method: each operation runs in batches of ``k`` calls timed with
``time.perf_counter_ns`` (``k`` calibrated so that a batch lasts about
``--batch-us``); the figure is the median over ``--iters`` batches of the
per-call time, with the garbage collector off.  Cases compared with each other
are interleaved batch by batch, so drift hits both alike.  Latency in µs,
bandwidth in GB/s (10^9 bytes/s).  Timings are reported, never asserted.

``GEXMK_TRANSPORT=pvm python -m gexmk.bench --no-mpi`` measures the
process_vm path (a peer's client-allocated segment) instead of mapped shared
memory; remote atomics are not offered there and are reported as such.
"""

from gexmk.bench.driver import main
from gexmk.bench.timing import aligned_bytes, fmt_size, measure, parse_size, parse_sizes
from gexmk.bench.extension import build_extension, find_bench_file, installed_extension, load_extension
from gexmk.bench.workloads import run_heat
from gexmk.bench.common import BuildError

__all__ = ['main', 'measure', 'aligned_bytes', 'parse_sizes', 'parse_size', 'fmt_size', 'build_extension', 'find_bench_file', 'installed_extension', 'load_extension', 'run_heat', 'BuildError']
