"""Job rendezvous and out-of-band collectives (pure Python, standard library only).

Before any endpoint can talk to another, every process of a job must learn who
the others are and swap a few bytes of set-up data (addresses, segment keys).
This package provides that *bootstrap* layer, the counterpart of GASNet-EX's
spawners (ssh/mpi/pmi) and its ``gasneti_bootstrapExchange``, as plug-ins
behind one interface (:class:`Bootstrap`: rank, size, local ranks, exchange
and allgather of bytes, barrier, death notices), chosen from the environment by
:mod:`gexmk.bootstrap.registry`:

``launcher`` (:mod:`.launcher`)
    Started by ``python -m gexmk.run``; the rendezvous server runs inside the
    launcher on an abstract-namespace Unix socket (or on TCP, with
    ``--bootstrap-listen``), and each rank presents the secret the launcher
    put in its environment (GEXMK_BOOTSTRAP_TOKEN).
``torchrun`` (:mod:`.torchrun`)
    A torchrun worker: rank 0's server address travels through the job's
    ``torch.distributed.TCPStore``.
``pmix`` (:mod:`.pmix`)
    Started by a PMIx server (Open MPI's ``mpirun``, PRRTE, ``srun
    --mpi=pmix``): rank, size and local ranks from PMIx, rank 0's server
    address published with PMIx_Put/Commit/Fence/Get, deaths from PMIx events.
``slurm`` (:mod:`.slurm`)
    An ``srun`` task without PMIx: Slurm's environment, rank 0 serving on the
    step's first node on a port derived from the job's identity.
``mpi`` (:mod:`.mpi`)
    Under ``mpiexec`` with mpi4py (or ``gexmk.init(comm=...)``): MPI rank 0
    runs the server in a daemon thread and sends each rank, over MPI, the
    server's address and that rank's secret.
``single`` (:mod:`.single`)
    A lone process (size 1); exchanges between its threads stay in-process.

The server admits rank R only with rank R's secret (compared in constant
time).  Every mode speaks the same small protocol (:mod:`.protocol`): a client
sends its contribution to a *key*; the server answers every contributor with
all payloads once the last one arrived, then forgets the key.  A process that
drops its connection without saying goodbye is reported dead to the others,
whose exchanges that still need it fail with :class:`~gexmk.errors.PeerDeadError`.

This package must stay importable without gexmk's compiled extensions (the
PMIx plug-in's is optional): the launcher and the tests use it before (or
without) the core.
"""

from __future__ import annotations

from gexmk.bootstrap.channel import _connect_socket, _LoopbackTransport  # noqa: F401
from gexmk.bootstrap.client import Bootstrap
from gexmk.bootstrap.registry import ORDER, explain
from gexmk.bootstrap.server import RendezvousServer
from gexmk.bootstrap.wire import (  # noqa: F401
    CONNECT_TIMEOUT, DEFAULT_TIMEOUT, HELLO_TIMEOUT, MAX_HELLO_BYTES, MAX_MESSAGE_BYTES,
    MAX_PAYLOAD_BYTES, MPI_ENVIRONMENT, PSM_BACKTRACE_SWITCHES, _frame, _node_name,
    default_timeout, keep_crash_signals,
)

__all__ = ["Bootstrap", "RendezvousServer", "from_environment", "default_timeout", "explain",
           "ORDER", "keep_crash_signals"]


def from_environment(comm=None) -> Bootstrap:
    """Find this process's job and return its :class:`Bootstrap` (collective over the job).

    - ``comm`` given (an mpi4py communicator): MPI over ``comm``.
    - GEXMK_BOOTSTRAP_KIND names a plug-in: that one.
    - else the first plug-in of :data:`ORDER` whose environment is present:
      GEXMK_BOOTSTRAP (gexmk.run), torchrun's (TORCHELASTIC_RUN_ID, or
      MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE), PMIx's (PMIX_RANK and
      PMIX_NAMESPACE, where gexmk was built with pmix.h), srun's (SLURM_STEP_ID
      and SLURM_PROCID), an MPI launcher's (PMI_RANK, OMPI_COMM_WORLD_SIZE, ...)
      with mpi4py importable; a program that imported mpi4py.MPI keeps MPI.
    - else a single-process job.

    ``python -m gexmk.info`` prints the choice and why (:func:`explain`).
    Blocks until every rank has arrived, at most GEXMK_TIMEOUT seconds (default
    300); raises :class:`~gexmk.errors.BootstrapError` when the job cannot be
    set up, naming the variable or service at fault.
    """
    from gexmk.bootstrap import registry
    return registry.from_environment(comm)


def _from_mpi(comm, force_tcp: bool = False) -> Bootstrap:
    """Bootstrap over an mpi4py communicator (tests: ``force_tcp``)."""
    from gexmk.bootstrap import mpi
    return mpi.from_comm(comm, force_tcp)
