"""Bootstrap plug-in ``mpi``: over an mpi4py communicator.

MPI rank 0 runs the rendezvous server in a daemon thread (an abstract Unix
socket when every rank shares its host, else TCP) and sends each rank, point
to point over MPI, the server's address and that rank's own secret.
"""

from __future__ import annotations

import socket
import sys

from gexmk.bootstrap import hosted
from gexmk.bootstrap.server import RendezvousServer
from gexmk.bootstrap.wire import MPI_ENVIRONMENT, default_timeout
from gexmk.errors import BootstrapError

NAME = "mpi"


def launched(environ) -> list:
    """The variables of an MPI launcher (Hydra, PMIx, Open MPI) found in ``environ``."""
    return [name for name in MPI_ENVIRONMENT if name in environ]


def detect(environ) -> str | None:
    """An MPI launcher's environment; :mod:`gexmk.bootstrap.registry` also asks
    whether mpi4py is importable, or already imported."""
    found = launched(environ)
    return f"an MPI launcher's environment ({', '.join(found)})" if found else None


def in_use() -> bool:
    """True when the program already imported mpi4py's MPI (so MPI is, or will be,
    initialized anyway)."""
    return "mpi4py.MPI" in sys.modules


def create(environ, comm=None):
    """Bootstrap over ``comm`` (default ``MPI.COMM_WORLD``); collective over it."""
    if comm is None:
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
    return from_comm(comm)


def from_comm(comm, force_tcp: bool = False):
    """Bootstrap over an mpi4py communicator (collective over ``comm``).

    ``force_tcp`` uses TCP even when all ranks share a host (for tests).
    """
    timeout = default_timeout()
    comm = comm.Dup()  # keep our set-up traffic out of the caller's communicator
    try:
        hosts = comm.allgather(socket.gethostname())
        tcp = force_tcp or len(set(hosts)) > 1
        server = None
        infos = None
        if comm.Get_rank() == 0:
            size = comm.Get_size()
            try:
                server = RendezvousServer(size, tcp=tcp, stop_when_finished=True, home_rank=0)
                server.start()
                # Each rank gets its own secret, point to point: no rank learns another's.
                infos = [(server.address, server.token(r), None) for r in range(size)]
            except Exception as exc:  # the others must learn about it, not hang
                if server is not None:
                    server.close()
                    server = None
                infos = [(None, None, f"{type(exc).__name__}: {exc}")] * size
        address, token, error = comm.scatter(infos, root=0)
        if error:
            raise BootstrapError(f"MPI rank 0 could not start the rendezvous server: {error}")
        rank, size = comm.Get_rank(), comm.Get_size()
    finally:
        comm.Free()
    return hosted.join(NAME, rank, size, address, token, server=server, timeout=timeout,
                       where="MPI rank 0",
                       hint="is MPI rank 0 still running? GEXMK_BOOTSTRAP may be stale")
