"""Bootstrap plug-in ``pmix``: the process was started by a PMIx server (Open
MPI's ``mpirun``, PRRTE's ``prterun``, ``srun --mpi=pmix``).

Rank, size and the node's ranks come from PMIx (PMIx_Init, PMIX_JOB_SIZE,
PMIX_LOCAL_PEERS).  Rank 0 starts the rendezvous server and publishes its
address and a random job secret with PMIx_Put + PMIx_Commit; one
PMIx_Fence with data collection later every rank reads them with PMIx_Get
(each process of the namespace can, no other).  Terminations the server
reports through PMIx events become death notices, besides those of the
rendezvous server.  The PMIx client (:mod:`gexmk.bootstrap.pmix_client`) is
built only where pmix.h is found; without it this plug-in is absent and
``python -m gexmk.info`` says so.
"""

from __future__ import annotations

import atexit
import importlib.util
import secrets
import socket

from gexmk.bootstrap import hosted
from gexmk.bootstrap.wire import default_timeout
from gexmk.errors import BootstrapError

NAME = "pmix"

_KEY = "gexmk.rendezvous"


def detect(environ) -> str | None:
    """PMIX_RANK and PMIX_NAMESPACE, set by a PMIx server for its clients."""
    if "PMIX_RANK" in environ and "PMIX_NAMESPACE" in environ:
        return (f"a PMIx server's environment (PMIX_NAMESPACE={environ['PMIX_NAMESPACE']}, "
                f"PMIX_RANK={environ['PMIX_RANK']})")
    return None


def available() -> str | None:
    """None when gexmk was built with pmix.h, else why not."""
    if importlib.util.find_spec("gexmk.bootstrap.pmix_client") is None:
        return "gexmk was built without PMIx (pmix.h was not found: apt install libpmix-dev)"
    return None


def create(environ, comm=None):
    """Join the job through PMIx (collective: one fence over the namespace)."""
    from gexmk.bootstrap import pmix_client as px
    timeout = default_timeout()
    wait = max(1, int(timeout + 0.999))
    nspace, rank = px.init()
    atexit.register(px.finalize)  # after the Bootstrap's own exit hook (registered later)
    server = None
    try:
        size = px.job_size(wait)
        hosted.check_rank(rank, size, "PMIx's rank (PMIX_RANK)", "PMIX_JOB_SIZE")
        local = px.local_peers(wait)
        if rank == 0:
            secret = secrets.token_hex(16)
            server = hosted.serve(size, host=hosted.listen_host(environ), tokens=[secret] * size)
            port = server.address.rpartition(":")[2]
            host = hosted.listen_host(environ) or socket.gethostname()
            px.put_string(_KEY, f"{host}:{port} {secret}")
        px.commit()
        px.fence(wait)
        address, secret = px.get_string(0, _KEY, wait).split()
    except BootstrapError as exc:
        if server is not None:
            server.close()
        raise BootstrapError(f"PMIx namespace {nspace!r}, rank {rank}: {exc}") from None
    except BaseException:
        if server is not None:
            server.close()
        raise
    boot = hosted.join(NAME, rank, size, address, secret, server=server, timeout=timeout,
                       hint=f"rank 0 of PMIx namespace {nspace!r} published it; is it running?")
    # The node's ranks as PMIx sees them (a host; gexmk's nodes also tell network
    # namespaces apart, so local_ranks may be a subset).
    boot.launcher_local_ranks = local
    try:
        px.on_death(lambda r: boot._on_message(["dead", int(r)]))
    except Exception:
        pass  # the rendezvous server still reports deaths
    return boot
