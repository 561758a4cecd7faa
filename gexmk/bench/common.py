"""Targets of the issues behind ``python -m gexmk.bench`` and what its modules share."""
from __future__ import annotations




#: Targets of the issue that asked for this benchmark (see ``_targets``).
PUT8_MAX_US = 0.3            # 8 B blocking put from Python, median
PUT8_VS_MPI = 0.25           # ... and at most this fraction of mpi4py Put+Flush
NOGIL_PUT8_MAX_NS = 10.0     # 8 B rma.put in a nogil loop
NBI_RATE_VS_MPI = 2.5        # put_nbi issue rate from Python / mpi4py Put issue rate
NOGIL_NBI_MIN_RATE = 20e6    # rma.put_nbi per second from a nogil loop
BIG_VS_MEMCPY = 0.9          # 4 MiB put bandwidth / memcpy bandwidth
BIG_SIZE = 4 << 20
HEAT_VS_FENCE = 0.8          # heat-equation iteration / mpi4py Win.Put + Win.Fence iteration

_MPI_ENV = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK")
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
          "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}


class BuildError(RuntimeError):
    """The Cython loop module could not be built (the reason is the message)."""
