"""Bootstrap plug-in ``launcher``: the process was started by ``python -m
gexmk.run``, whose rendezvous server runs in the launcher (an abstract Unix
socket, or TCP with ``--bootstrap-listen``); each rank presents the secret the
launcher put in its environment (GEXMK_BOOTSTRAP_TOKEN)."""

from __future__ import annotations

from gexmk.bootstrap.channel import _connect_socket
from gexmk.bootstrap.client import Bootstrap
from gexmk.bootstrap.wire import default_timeout
from gexmk.errors import BootstrapError

NAME = "launcher"


def detect(environ) -> str | None:
    """GEXMK_BOOTSTRAP (the server's address) is set by gexmk.run."""
    address = environ.get("GEXMK_BOOTSTRAP")
    return f"GEXMK_BOOTSTRAP={address} (set by python -m gexmk.run)" if address else None


def _env_int(environ, name):
    text = environ.get(name)
    try:
        return int(text)
    except (TypeError, ValueError):
        raise BootstrapError(f"GEXMK_BOOTSTRAP is set but {name} is {text!r}, not an integer; "
                             f"start the job with python -m gexmk.run") from None


def create(environ, comm=None) -> Bootstrap:
    """Join the gexmk.run launcher's job named by GEXMK_BOOTSTRAP, GEXMK_RANK,
    GEXMK_SIZE and GEXMK_BOOTSTRAP_TOKEN."""
    address = environ.get("GEXMK_BOOTSTRAP")
    rank, size = _env_int(environ, "GEXMK_RANK"), _env_int(environ, "GEXMK_SIZE")
    if not 0 <= rank < size:
        raise BootstrapError(f"GEXMK_RANK={rank} is outside 0..GEXMK_SIZE-1 ({size - 1})")
    timeout = default_timeout()
    # The launcher gave this rank, and no other, its secret.
    token = environ.get("GEXMK_BOOTSTRAP_TOKEN")
    if not token:
        raise BootstrapError("GEXMK_BOOTSTRAP is set but GEXMK_BOOTSTRAP_TOKEN is not: the "
                             "rendezvous admits a rank only with the secret gexmk.run gave it; "
                             "start the job with python -m gexmk.run")
    return Bootstrap(rank=rank, size=size, kind=NAME, timeout=timeout,
                     connect=_connect_socket(address, timeout), token=token)
