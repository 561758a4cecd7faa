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


class LibraryError(GexmkError):
    """A call into a foreign library failed.  One shape for every library:
    ``call`` (the function), ``code`` (its error code), ``text`` (the
    library's own description), ``name`` (the code's symbolic name, or None);
    it pickles with them (errors cross process boundaries in tests and pools)."""

    library = "a library"

    def __init__(self, call, code, text, name=None):
        self.call = call
        self.code = code
        self.text = text
        self.name = name
        super().__init__(self._message())

    def _message(self):
        label = f"{self.name}: " if self.name else ""
        return f"{self.call} failed: {label}{self.text} ({self.code})"

    def __reduce__(self):
        return (type(self), (self.call, self.code, self.text, self.name))


class OFIError(LibraryError, CommunicationError):
    """A libfabric call failed; ``code`` is the positive errno, ``text`` its
    ``fi_strerror`` text."""

    library = "libfabric"

    def _message(self):
        hint = ""
        if self.code == 24:     # EMFILE: out of file descriptors
            hint = ("; each peer process reached over a socket provider costs a file "
                    "descriptor per libfabric endpoint (two per gexmk endpoint where they "
                    "are split): raise the limit (ulimit -n) -- the operation may be retried "
                    "once it is raised")
        return f"{self.call} failed: {self.text} (-{self.code}){hint}"


class CUDAError(LibraryError, RuntimeError):
    """A CUDA driver call failed; ``code`` is the CUresult, ``name`` its
    ``cuGetErrorName``, ``text`` its ``cuGetErrorString``."""

    library = "CUDA driver"


__all__ = [name for name in dir() if name.endswith("Error")]
