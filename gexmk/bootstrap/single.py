"""Bootstrap plug-in ``single``: a job of one process (no launcher, the embedded
default); exchanges between its threads stay in-process."""

from __future__ import annotations

from gexmk.bootstrap.channel import _LoopbackTransport
from gexmk.bootstrap.client import Bootstrap
from gexmk.bootstrap.wire import default_timeout

NAME = "single"


def detect(environ) -> str | None:
    """Always applies: the last resort of the registry."""
    return "no launcher's environment was found: a job of one process"


def create(environ, comm=None) -> Bootstrap:
    """A job of one process."""
    return Bootstrap(rank=0, size=1, kind=NAME, timeout=default_timeout(),
                     connect=lambda deliver, lost: _LoopbackTransport(deliver),
                     where="this process")
