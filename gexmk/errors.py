"""The gexmk exception tree.

Every error gexmk raises on purpose derives from :class:`GexmkError`, so one
``except gexmk.GexmkError`` catches them all.  Bad arguments additionally derive
from the matching builtin (``ValueError``/``TypeError``) so generic code that
catches those keeps working.
"""


class GexmkError(Exception):
    """Root of every exception gexmk raises on purpose."""


class UnsupportedError(GexmkError, NotImplementedError):
    """The request is valid, but this build or this machine cannot serve it
    (a memory kind without its runtime, a provider without an op)."""


class ArgumentError(GexmkError, ValueError):
    """An argument has the right type but a value gexmk cannot accept."""


class BoundsError(ArgumentError):
    """An address range lies (partly) outside the segment it must lie in."""


class RankError(ArgumentError):
    """A rank is outside the team."""


class StateError(GexmkError, RuntimeError):
    """The object is in the wrong state for the call: destroyed, finalized,
    unbound, unpublished, or an event waited on before it exists."""


class SegmentError(StateError):
    """A segment is missing, unbound or unpublished where one is required."""


class CommunicationError(GexmkError, RuntimeError):
    """A peer could not be reached."""


class PeerDeadError(CommunicationError):
    """A peer process died (or disconnected) while this one still needed it."""


class TimeoutError(CommunicationError, TimeoutError):  # noqa: A001 - deliberate shadow
    """A peer did not answer within the configured timeout (GEXMK_TIMEOUT)."""


class BootstrapError(CommunicationError):
    """The job could not be set up: launcher, MPI or rendezvous failure."""


class OFIError(CommunicationError):
    """A libfabric call failed; the message carries ``fi_strerror`` text."""

    def __init__(self, call, code, text):
        super().__init__(f"{call} failed: {text} (-{code})")
        self.call = call
        self.code = code


class CUDAError(GexmkError, RuntimeError):
    """A CUDA driver call failed."""


__all__ = [name for name in dir() if name.endswith("Error")]
