"""Rank 0 hosts the rendezvous server: the common half of every plug-in whose
launcher tells each process its rank and size (MPI, PMIx, Slurm, torchrun).

The launcher's own channel (an MPI scatter, a PMIx fence, a torch store, or an
address both sides derive from the job's identity) carries rank 0's server
address and the secret it admits; everything after that — the welcome with
every rank's pid and node, keyed exchanges, barriers, death notices — runs over
the server as under ``python -m gexmk.run``.
"""

from __future__ import annotations

import socket

from gexmk.bootstrap.channel import _connect_socket
from gexmk.bootstrap.client import Bootstrap
from gexmk.bootstrap.server import RendezvousServer
from gexmk.bootstrap.wire import default_timeout
from gexmk.errors import BootstrapError


def env_int(environ, name: str, why: str) -> int:
    """``int(environ[name])``, or :class:`BootstrapError` naming the variable; ``why``
    says who should have set it."""
    text = environ.get(name)
    if text is None:
        raise BootstrapError(f"{why}, but {name} is not set")
    try:
        return int(text)
    except ValueError:
        raise BootstrapError(f"{why}, but {name} is {text!r}, not an integer") from None


def check_rank(rank: int, size: int, rank_var: str, size_var: str) -> None:
    """A launcher's rank and size must be a rank of a job of at least one process."""
    if size < 1:
        raise BootstrapError(f"{size_var}={size}: a job needs at least one rank")
    if not 0 <= rank < size:
        raise BootstrapError(f"{rank_var}={rank} is outside 0..{size_var}-1 ({size - 1})")


def listen_host(environ) -> str | None:
    """GEXMK_BOOTSTRAP_LISTEN: the address rank 0's server listens on (default: every
    interface), as ``gexmk.run --bootstrap-listen`` for the launcher's."""
    host = environ.get("GEXMK_BOOTSTRAP_LISTEN", "").strip()
    return host or None


def route_address(peer_host: str) -> str:
    """This machine's address on the route to ``peer_host`` (no packet is sent): the
    address others that reach ``peer_host`` can reach us at, without trusting that
    our host name resolves for them."""
    try:
        infos = socket.getaddrinfo(peer_host, 9, socket.AF_UNSPEC, socket.SOCK_DGRAM)
    except socket.gaierror as exc:
        raise BootstrapError(f"cannot resolve {peer_host!r}: {exc}") from None
    for family, _, _, _, sockaddr in infos:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            try:
                s.connect(sockaddr)
            except OSError:
                continue
            addr = s.getsockname()[0]
            return f"[{addr}]" if family == socket.AF_INET6 else addr
    return socket.gethostname()


def serve(size: int, *, host=None, port: int = 0, tokens=None) -> RendezvousServer:
    """Rank 0: start the job's server on TCP (every interface unless ``host``)."""
    server = RendezvousServer(size, tcp=True, host=host, port=port, tokens=tokens,
                              stop_when_finished=True, home_rank=0)
    server.start()
    return server


def join(kind: str, rank: int, size: int, address: str, token: str, *, server=None,
         patience=None, hint=None, timeout=None, where=None) -> Bootstrap:
    """Connect to rank 0's server at ``address`` and return the job's :class:`Bootstrap`.

    ``server``: the one this process hosts (rank 0), closed if joining fails and
    otherwise kept serving the others until they leave.  ``patience``: seconds a
    refused connection is retried (the address may be known before rank 0 listens).
    """
    timeout = default_timeout() if timeout is None else timeout
    try:
        return _attach(Bootstrap(
            rank=rank, size=size, kind=kind, timeout=timeout,
            connect=_connect_socket(address, timeout, patience,
                                    hint or f"is rank 0 of this {kind} job still running?"),
            token=token, server_rank=0, where=where or f"rank 0 ({kind} job)"), server)
    except BootstrapError as exc:
        if server is None:
            raise
        # Rank 0 gives up: the ranks already connected learn why (and who never came)
        # rather than reading the server's disappearance as rank 0's death.
        missing = server.missing()
        text = f"rank 0 gave up on the job: {exc}"
        if missing:
            text += f"; ranks that never reached the rendezvous: {_ranks(missing)}"
        server.abort(text)
        raise BootstrapError(text) from None
    except BaseException:
        if server is not None:
            server.close()
        raise


def _ranks(ranks, most=16):
    shown = ", ".join(map(str, ranks[:most]))
    return shown + (f" and {len(ranks) - most} more" if len(ranks) > most else "")


def _attach(bootstrap, server):
    bootstrap._server = server
    return bootstrap
