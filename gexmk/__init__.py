"""gexmk: GPU-aware one-sided communication (RMA) for Python, after the
GASNet-EX Memory Kinds model.

    import gexmk
    with gexmk.init() as client:            # a job of one, or under gexmk.run / mpiexec
        seg = client.segment_attach(1 << 20) # bound to EP 0 and published
        tm = client.tm
        peer = (tm.rank + 1) % tm.size
        tm.put(peer, tm.addr(peer, 0), b"hello")
        tm.barrier()

See README.md for the GASNet-EX → gexmk table, and the docstrings of
:class:`Client`, :class:`Team`, :class:`Endpoint`, :class:`Segment`,
:class:`Event` and :class:`AtomicDomain`.
"""
import os as _os

# Before any extension loads libfabric, and with it libpsm_infinipath's crash handlers.
from gexmk.bootstrap import keep_crash_signals as _keep_crash_signals
_keep_crash_signals(_os.environ)

from gexmk.errors import *  # noqa: F401,F403 - the exception tree is public API
from gexmk.errors import __all__ as _errors_all
from gexmk.memory import HOST, MKClass, MemoryKind, Segment, DeviceView, mk_create
from gexmk.core import (
    init, Client, Endpoint, Team, Event, LeafEvent, AtomicDomain, BoundSegment, EVENT_DONE,
    wait_all, wait_some, test_all, test_some, nbi_wait, nbi_test, nbi_access_region, fence, quiet,
    EP_CAPABILITY_RMA, EP_CAPABILITY_ALL, LC_NOW, LC_DEFER, LC_GROUP,
    EC_GET, EC_PUT, EC_RMW, EC_ALL, EC_LC,
    DT_I32, DT_U32, DT_I64, DT_U64, DT_FLT, DT_DBL,
    OP_SET, OP_GET, OP_SWAP, OP_CAS, OP_FCAS, OP_ADD, OP_FADD, OP_SUB, OP_FSUB, OP_INC, OP_FINC,
    OP_DEC, OP_FDEC, OP_AND, OP_FAND, OP_OR, OP_FOR, OP_XOR, OP_FXOR, OP_MIN, OP_FMIN, OP_MAX,
    OP_FMAX, OP_MULT,
    SIGNAL_SET, SIGNAL_ADD, CMP_EQ, CMP_NE, CMP_GT, CMP_GE, CMP_LT, CMP_LE,
)

#: Memory kind classes (GASNet-EX GEX_MK_CLASS_*), for client.mk_create(cls, device).
CUDA_UVA = MKClass.CUDA_UVA
HIP = MKClass.HIP
ZE = MKClass.ZE

__version__ = "0.1.0"


def get_include():
    """Directory holding gexmk's C headers (``gexmk/gexmk.h``), for
    ``include_directories`` of an extension that cimports gexmk.  The ``.pxd``
    files are found on the Python path (the installed package)."""
    return _os.path.join(_os.path.dirname(__file__), "include")


__all__ = [
    "init", "Client", "Endpoint", "Team", "Event", "LeafEvent", "AtomicDomain", "BoundSegment",
    "Segment", "MemoryKind", "MKClass", "DeviceView", "HOST", "CUDA_UVA", "HIP", "ZE", "mk_create", "EVENT_DONE",
    "wait_all", "wait_some", "test_all", "test_some", "nbi_wait", "nbi_test", "nbi_access_region",
    "fence", "quiet", "get_include",
] + list(_errors_all)
