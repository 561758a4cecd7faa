"""Core objects of gexmk: client, endpoints, teams, events, RMA and atomics.

The data path is the C header include/gexmk/gexmk.h: a team is an array of
pointers to *targets*, the process-wide record of what one remote endpoint has
published to this process (GASNet-EX: rights belong to the pair (local process,
remote endpoint)).  A put to a mapped target is a bounds check and a memcpy; a
target that is not mapped here takes the slow path (process_vm for
client-allocated memory of a peer on this node), and every error is reported
from the slow path, so the fast path carries no Python work at all.

Ordering and visibility (NVSHMEM's rules, seeds/001): a blocking put or get is
complete when it returns; an NB or NBI operation is complete when its event
completes or ``nbi_wait``/``quiet`` returns; ``fence`` orders every earlier put
and atomic of the calling thread before every later one to the same target;
``quiet`` completes them.  Atomics are atomic with respect to other gexmk
atomics on the same object (from any process of the node), not with respect
to plain puts or local stores to it.
"""
import atexit
import hashlib
import os
import pickle
import struct
import threading
import weakref
from collections import namedtuple

from cpython.buffer cimport PyBuffer_Release
from cpython.long cimport PyLong_AsUnsignedLongLongMask
from libc.errno cimport errno, EPERM, ESRCH, EFAULT
from libc.stdint cimport uintptr_t, int32_t, uint32_t, int64_t, uint64_t
from libc.stdlib cimport calloc, free
from posix.mman cimport mmap, munmap, PROT_READ, PROT_WRITE, MAP_SHARED, MAP_FAILED
from posix.unistd cimport close, sysconf, _SC_PAGESIZE

from gexmk.lib.gx cimport *
from gexmk.net cimport *
from cpython.pycapsule cimport PyCapsule_GetPointer
from gexmk.lib.linux cimport iovec, process_vm_readv, process_vm_writev
from gexmk.memory cimport Segment, MemoryKind, host_buffer

from gexmk.memory import HOST, mk_create as _mk_create
from gexmk.errors import (ArgumentError, BoundsError, RankError, StateError, SegmentError,
                          UnsupportedError, PeerDeadError, GexmkError)

# ---- constants (GASNet-EX names without the GEX_ prefix) --------------------

EP_CAPABILITY_RMA = 1          #: GEX_EP_CAPABILITY_RMA
EP_CAPABILITY_ALL = 1          #: everything this build offers

LC_NOW = 0                     #: lc_opt GEX_EVENT_NOW: source reusable on return
LC_DEFER = 1                   #: GEX_EVENT_DEFER: local completion via ev.leaf(EC_LC)
LC_GROUP = 2                   #: GEX_EVENT_GROUP: local completion via nbi_wait(EC_PUT, ...)

EC_GET = 1                     #: NBI event categories (GEX_EC_*)
EC_PUT = 2
EC_RMW = 4
EC_ALL = EC_GET | EC_PUT | EC_RMW
EC_LC = 8                      #: leaf: local completion of a put

DT_I32 = GX_DT_I32
DT_U32 = GX_DT_U32
DT_I64 = GX_DT_I64
DT_U64 = GX_DT_U64
DT_FLT = GX_DT_FLT
DT_DBL = GX_DT_DBL
_DT_NAMES = {DT_I32: "I32", DT_U32: "U32", DT_I64: "I64", DT_U64: "U64", DT_FLT: "FLT", DT_DBL: "DBL"}
_DT_FORMATS = {DT_I32: "i", DT_U32: "I", DT_I64: "q", DT_U64: "Q", DT_FLT: "f", DT_DBL: "d"}

# Op flags are single bits, combined with | into an atomic domain's op set.
OP_SET = 1 << GX_OP_SET
OP_GET = 1 << GX_OP_GET
OP_SWAP = 1 << GX_OP_SWAP
OP_CAS = 1 << GX_OP_CAS
OP_FCAS = 1 << GX_OP_FCAS
OP_ADD = 1 << GX_OP_ADD
OP_FADD = 1 << GX_OP_FADD
OP_SUB = 1 << GX_OP_SUB
OP_FSUB = 1 << GX_OP_FSUB
OP_INC = 1 << GX_OP_INC
OP_FINC = 1 << GX_OP_FINC
OP_DEC = 1 << GX_OP_DEC
OP_FDEC = 1 << GX_OP_FDEC
OP_AND = 1 << GX_OP_AND
OP_FAND = 1 << GX_OP_FAND
OP_OR = 1 << GX_OP_OR
OP_FOR = 1 << GX_OP_FOR
OP_XOR = 1 << GX_OP_XOR
OP_FXOR = 1 << GX_OP_FXOR
OP_MIN = 1 << GX_OP_MIN
OP_FMIN = 1 << GX_OP_FMIN
OP_MAX = 1 << GX_OP_MAX
OP_FMAX = 1 << GX_OP_FMAX
_FETCHING = (OP_GET | OP_SWAP | OP_FCAS | OP_FADD | OP_FSUB | OP_FINC | OP_FDEC | OP_FAND
             | OP_FOR | OP_FXOR | OP_FMIN | OP_FMAX)
_BITWISE = OP_AND | OP_FAND | OP_OR | OP_FOR | OP_XOR | OP_FXOR
_ALL_OPS = (1 << GX_OP_COUNT) - 1
# ops that take no operand (INC/DEC/GET) and that take two (CAS)
_NO_OPERAND = OP_GET | OP_INC | OP_FINC | OP_DEC | OP_FDEC
_TWO_OPERANDS = OP_CAS | OP_FCAS
# the same masks as C ints: tested on every atomic without touching Python objects
cdef int _C_FETCHING = _FETCHING
cdef int _C_NO_OPERAND = _NO_OPERAND
cdef int _C_TWO_OPERANDS = _TWO_OPERANDS
cdef int _C_ALL_OPS = _ALL_OPS

_TRANSPORT_NAMES = {GX_TR_NONE: "none", GX_TR_SELF: "self", GX_TR_NBRHD: "nbrhd",
                    GX_TR_PVM: "pvm", GX_TR_OFI: "ofi"}

BoundSegment = namedtuple("BoundSegment", "address size local_address kind transport")
BoundSegment.__doc__ = """What query_bound_segment_nb reports of a remote bound segment:
address and size in the owner's address space, the address where it is mapped
here (None when not mapped), its memory kind and the transport that reaches it."""

# Copies at least this long release the GIL (shorter ones cost less than a GIL round trip).
cdef size_t _NOGIL_BYTES = 64 * 1024

cdef object _client = None     # the one live Client of this process
cdef net_ops* _net = NULL      # the network transport's table, once loaded


def _set_net_ops(capsule):
    """Install a network transport's function table (gexmk.ofi_transport.ops_capsule())."""
    global _net
    _net = <net_ops*>PyCapsule_GetPointer(capsule, b"gexmk.net_ops")


# ---- events -----------------------------------------------------------------

cdef class Event:
    """Completion of a non-blocking operation (GASNet-EX ``gex_Event_t``).

    ``test()`` returns True once the operation is complete (GASNet-EX: a
    successful test consumes the event); unlike GASNet-EX, waiting on or
    testing a completed event again is allowed and returns at once.  An event
    keeps the buffers of its operation alive until it completes.  Waiting
    releases the GIL.
    """

    def __cinit__(self):
        self._dt = -1

    def __init__(self):
        raise TypeError("events come from NB operations; use gexmk.LeafEvent() for an lc slot")

    def __dealloc__(self):
        # A pending network op is handed to the transport, which frees it at
        # completion: its context must outlive this object.
        if self._op != NULL and _net != NULL:
            _net.orphan(self._op)
            self._op = NULL

    cdef int _complete(self, bint block) except -1:
        """Drive a pending network op; 1 when complete."""
        cdef gx_val res
        cdef void* op = self._op
        cdef int done
        if self._region:
            if block:
                nbi_wait(EC_ALL)
                done = 1
            else:
                done = nbi_test(EC_ALL)
            if done:
                self._done = True
            return done
        if op == NULL:
            if self._lc is not None and self._lc is not self:
                # a LeafEvent bound to another operation's event
                if not (<Event>self._lc)._done and not (<Event>self._lc)._complete(block):
                    return 0
            self._done = True
            return 1
        self._op = NULL          # the transport frees it on every outcome but "pending"
        try:
            if block:
                with nogil:
                    _net.wait(op, &res)
                done = 1
            else:
                done = _net.test(op, &res)
                if not done:
                    self._op = op
                    return 0
        except BaseException:
            self._done = True    # failed: complete, with the error raised now
            self._keep = None
            raise
        if self._dt >= 0:
            self._result = _from_val(self._dt, &res)
        self._done = True
        self._keep = None
        return 1

    def test(self):
        """True when complete (never blocks)."""
        if not self._bound:
            raise StateError("this event is not bound to an operation yet")
        if not self._done:
            self._complete(False)
        return self._done

    def wait(self):
        """Block until complete; return the operation's result (None for most)."""
        if not self._bound:
            raise StateError("this event is not bound to an operation yet "
                             "(an access region's event exists only after the region ends)")
        if not self._done:
            self._complete(True)
        self._keep = None
        return self._result

    @property
    def result(self):
        """The operation's result once complete (fetched atomic value, query answer)."""
        if not self._bound or not self.test():
            raise StateError("the event is not complete")
        return self._result

    def leaf(self, int category):
        """The leaf event of ``category`` (``EC_LC``: local completion of a put
        issued with ``lc=LC_DEFER``); GASNet-EX ``gex_Event_QueryLeaf``."""
        if category != EC_LC:
            raise ArgumentError(f"unknown leaf category {category}; only EC_LC has leaves")
        if self._lc is None:
            raise StateError("this event has no local-completion leaf (issue the put with lc=LC_DEFER)")
        return self._lc

    def __repr__(self):
        state = "unbound" if not self._bound else ("done" if self._done else "pending")
        return f"<gexmk.Event {state}>"


cdef class LeafEvent(Event):
    """An explicit local-completion slot: pass it as ``lc=`` to a put and wait
    on it for the source buffer to be reusable (GASNet-EX lc_opt pointing at a
    ``gex_Event_t``)."""

    def __init__(self):
        self._bound = False


cdef Event _done_event(object result):
    cdef Event ev = Event.__new__(Event)
    ev._bound = True
    ev._done = True
    ev._result = result
    return ev


cdef Event _net_event(void* op, object keep, int dt):
    """Event over a pending network op; `keep` holds its buffers alive."""
    cdef Event ev = Event.__new__(Event)
    ev._bound = True
    ev._op = op
    ev._keep = keep
    ev._dt = dt
    return ev


# One completed event shared by every NB operation that finished at issue
# (GASNet-EX's GEX_EVENT_INVALID); its local-completion leaf is itself.
cdef Event _DONE = _done_event(None)
_DONE._lc = _DONE
EVENT_DONE = _DONE


cdef int _lc_mode(object lc) except -1:
    """Check an lc option; 1 when the source must be reusable on return (LC_NOW)."""
    if lc is None or lc is LC_NOW:
        return 1
    if isinstance(lc, LeafEvent):
        return 0
    if lc == LC_NOW:
        return 1
    if lc == LC_DEFER or lc == LC_GROUP:
        return 0
    raise ArgumentError(f"lc must be LC_NOW, LC_DEFER, LC_GROUP or a gexmk.LeafEvent, got {lc!r}")


cdef Event _lc_event(object lc, Event rc_event):
    """Bind an lc option to an operation whose remote completion is rc_event.
    Local completion is implied by remote completion, so the leaf is the
    remote-completion event itself (or complete at once when that is)."""
    if isinstance(lc, LeafEvent):
        if rc_event._done:
            (<Event>lc)._bound = True
            (<Event>lc)._done = True
        else:
            (<Event>lc)._bound = True
            (<Event>lc)._region = False
            (<Event>lc)._lc = rc_event
    if rc_event is not _DONE and rc_event._lc is None:
        rc_event._lc = rc_event
    return rc_event


def _events(events):
    out = []
    for e in events:
        if e is None:
            continue
        if not isinstance(e, Event):
            raise TypeError(f"expected gexmk.Event objects, got {type(e).__name__}")
        out.append(e)
    return out


def wait_all(events):
    """Wait for every event in ``events`` (None entries are ignored)."""
    for e in _events(events):
        e.wait()


def wait_some(events):
    """Wait until at least one event is complete; return the indices of the
    complete ones (GASNet-EX ``gex_Event_WaitSome``)."""
    events = list(events)
    live = _events(events)
    if not live:
        return []
    while True:
        done = [i for i, e in enumerate(events) if e is not None and (<Event>e).test()]
        if done:
            return done
        _yield_cpu()


def test_all(events):
    """True when every event is complete."""
    return all([(<Event>e).test() for e in _events(events)])


def test_some(events):
    """Indices of the complete events (possibly empty)."""
    events = list(events)
    _events(events)
    return [i for i, e in enumerate(events) if e is not None and (<Event>e).test()]


cdef void _yield_cpu() noexcept:
    with nogil:
        gx_quiet()


_tls = threading.local()


cdef int _categories(int category) except -1:
    """EC_* mask -> NET_CAT_* bit mask."""
    if category & ~(EC_ALL | EC_LC) or category == 0:
        raise ArgumentError(f"unknown event category mask {category:#x}; "
                            "use EC_GET, EC_PUT, EC_RMW, EC_LC, EC_ALL")
    cdef int m = 0
    if category & EC_GET:
        m |= 1 << NET_CAT_GET
    if category & (EC_PUT | EC_LC):
        m |= 1 << NET_CAT_PUT
    if category & EC_RMW:
        m |= 1 << NET_CAT_RMW
    return m


cdef list _net_eps(Endpoint only=None):
    """Network endpoints to synchronise: one, or every endpoint of the client."""
    if only is not None:
        return [only] if only.net is not None else []
    c = _client
    if c is None or (<Client>c).net is None:
        return []
    return [e for e in (<Client>c)._eps if e is not None and (<Endpoint>e).net is not None]


cdef int _nbi_sync(int category, Endpoint only=None) except -1:
    cdef int mask = _categories(category)
    cdef Endpoint e
    cdef void* h
    for e in _net_eps(only):
        h = e.net_handle
        with nogil:
            _net.nbi_wait(h, mask)
        # their operations are complete: the buffers may go
        if mask & (1 << NET_CAT_PUT):
            e._keep_put.clear()
        if mask & (1 << NET_CAT_GET):
            e._keep_get.clear()
    gx_quiet()
    return 0


def nbi_wait(int category=EC_ALL, int flags=0):
    """Wait for every implicit-event operation of ``category`` (GASNet-EX
    ``gex_NBI_Wait``).  Network operations are tracked per endpoint, so this
    completes those of every endpoint of the process; on mapped targets every
    operation is complete at issue."""
    _nbi_sync(category)


def nbi_test(int category=EC_ALL, int flags=0):
    """True when every implicit-event operation of ``category`` is complete."""
    cdef int mask = _categories(category)
    cdef Endpoint e
    for e in _net_eps():
        e.net.progress()
        pending = e.net.nbi_pending()
        for c in range(3):
            if mask & (1 << c) and pending[c]:
                return False
    _nbi_sync(category)         # complete locally: flush, collect errors, release buffers
    return True


class nbi_access_region:
    """NBI access region (GASNet-EX ``gex_NBI_{Begin,End}AccessRegion``):

        with gexmk.nbi_access_region() as ev:
            tm.put_nbi(...); tm.get_nbi(...)
        ev.wait()      # completes every NBI op issued inside the region

    The event is bound when the region ends; regions do not nest (per thread).
    Over the network the event completes when every implicit operation of the
    process is complete (a superset of the region's, never fewer).
    """

    def __init__(self):
        self._event = None

    def __enter__(self):
        if getattr(_tls, "region", None) is not None:
            raise StateError("an NBI access region is already open in this thread")
        ev = LeafEvent()
        _tls.region = ev
        self._event = ev
        return ev

    def __exit__(self, *exc):
        cdef Event ev = self._event
        _tls.region = None
        gx_quiet()
        ev._bound = True
        if _net_eps():
            ev._region = True
        else:
            ev._done = True
        return False


def fence():
    """Order this process's earlier puts/atomics before its later ones (NVSHMEM
    fence).  Over the network this completes them (quiet), which orders them."""
    _nbi_sync(EC_PUT | EC_RMW)


def quiet():
    """Complete this process's outstanding puts/atomics (NVSHMEM quiet)."""
    _nbi_sync(EC_PUT | EC_RMW)


# ---- local buffers ----------------------------------------------------------

cdef struct _Local:
    void* p
    size_t n
    bint held           # view holds a buffer to release


cdef inline int _take(object obj, Py_buffer* view, _Local* loc, bint writable, const char* what) except -1:
    """A local buffer: a PEP 3118 object or an (address, nbytes) tuple."""
    if type(obj) is tuple:
        if len(<tuple>obj) != 2:
            raise TypeError(f"{what.decode()} as a tuple must be (address, nbytes), got {obj!r}")
        a, n = <tuple>obj
        if a < 0 or n < 0:
            raise ArgumentError(f"{what.decode()} (address, nbytes) must be non-negative, got {obj!r}")
        if a == 0 and n != 0:
            raise ArgumentError(f"{what.decode()} address is NULL")
        loc.p = <void*><uintptr_t>a
        loc.n = <size_t>n
        loc.held = False
        return 0
    host_buffer(obj, view, writable, what)
    loc.p = view.buf
    loc.n = <size_t>view.len
    loc.held = True
    return 0


cdef inline void _drop(Py_buffer* view, _Local* loc) noexcept:
    if loc.held:
        loc.held = False
        PyBuffer_Release(view)


# ---- slow path and error reports --------------------------------------------

cdef int _raise_rc(const gx_team* tm, int rank, uintptr_t addr, size_t n, int rc, str what) except -1 with gil:
    cdef Team team = <Team>tm.owner if tm.owner != NULL else None
    cdef gx_target* t
    if team is not None and team._closed:
        raise StateError(f"{what}: the team is closed (its client was finalized)")
    if rc == GX_ERANK:
        raise RankError(f"{what}: rank {rank} is outside the team (size {tm.size})")
    t = tm.targets[rank]
    if rc == GX_EDEAD:
        raise PeerDeadError(f"{what}: job rank {t.jobrank} (team rank {rank}) has died")
    if rc == GX_ERANGE:
        if t.size == 0:
            raise SegmentError(
                f"{what}: team rank {rank} (job rank {t.jobrank}, EP {t.ep_index}) has no bound "
                "segment published to this process (bind, then publish_bound_segment)")
        if what.startswith("atomic") and addr >= t.remote_base and addr - t.remote_base + n <= t.size:
            raise BoundsError(f"{what}: address 0x{addr:x} is not aligned to {n} bytes")
        raise BoundsError(
            f"{what}: [0x{addr:x}, 0x{addr:x} + {n}) is outside the bound segment of team rank "
            f"{rank} (job rank {t.jobrank}, EP {t.ep_index}): [0x{t.remote_base:x}, "
            f"0x{t.remote_base:x} + {t.size})")
    if rc == GX_EOP:
        raise ArgumentError(f"{what}: invalid atomic operation or data type")
    if rc == GX_NOT_MAPPED and t.transport == GX_TR_OFI:
        raise UnsupportedError(
            f"{what}: job rank {t.jobrank} is on another node; reaching it needs the ofi "
            "transport, which this build does not have yet")
    raise GexmkError(f"{what}: internal error (code {rc}, transport {t.transport})")


cdef int _pvm_error(gx_target* t, int err, str what) except -1 with gil:
    if err == ESRCH:
        raise PeerDeadError(f"{what}: job rank {t.jobrank} (pid {t.pid}) is gone")
    if err == EPERM:
        raise UnsupportedError(
            f"{what}: this process may not access job rank {t.jobrank}'s client-allocated "
            f"segment (process_vm_* not permitted: {os.strerror(err)}; see "
            "/proc/sys/kernel/yama/ptrace_scope); use a library-allocated segment")
    if err == EFAULT:
        raise SegmentError(f"{what}: job rank {t.jobrank}'s published segment is no longer mapped "
                           "there (destroyed without republishing?)")
    raise OSError(err, f"{what}: process_vm_* on job rank {t.jobrank}: {os.strerror(err)}")


cdef int _pvm(gx_target* t, uintptr_t remote, void* local, size_t n, bint write, str what) except -1 nogil:
    """Cross-process copy into/out of a peer's unmappable client-allocated segment."""
    cdef iovec liov, riov
    cdef ssize_t got
    while n > 0:
        liov.iov_base = local
        liov.iov_len = n
        riov.iov_base = <void*>remote
        riov.iov_len = n
        if write:
            got = process_vm_writev(t.pid, &liov, 1, &riov, 1, 0)
        else:
            got = process_vm_readv(t.pid, &liov, 1, &riov, 1, 0)
        if got <= 0:
            return _pvm_error(t, errno if got < 0 else EFAULT, what)
        n -= <size_t>got
        local = <char*>local + got
        remote += <uintptr_t>got
    return 0


cdef int put_slow(const gx_team* tm, int rank, uintptr_t dest, const void* src, size_t n, int rc) except -1 nogil:
    cdef gx_target* t
    if rc == GX_NOT_MAPPED:
        t = tm.targets[rank]
        if t.transport == GX_TR_PVM:
            _pvm(t, dest, <void*>src, n, True, "put")
            return 0
        if t.transport == GX_TR_OFI and _net != NULL and tm.net_ep != NULL:
            return _net.put(tm.net_ep, t, dest, <void*>src, n, NET_BLOCKING, NULL)
    return _raise_rc(tm, rank, dest, n, rc, "put")


cdef int rma_nbi_slow(const gx_team* tm, int rank, bint is_put, uintptr_t remote, void* local,
                      size_t n, int rc) except -1 nogil:
    """Implicit-event put/get to a target the inline path declined: over the
    network the op is counted on the team's endpoint (a put's source is
    reusable on return; a get's destination is filled by nbi_sync)."""
    cdef gx_target* t
    if rc == GX_NOT_MAPPED:
        t = tm.targets[rank]
        if t.transport == GX_TR_OFI and _net != NULL and tm.net_ep != NULL:
            if is_put:
                return _net.put(tm.net_ep, t, remote, local, n, NET_NBI_LCNOW, NULL)
            return _net.get(tm.net_ep, t, remote, local, n, NET_NBI, NULL)
    if is_put:
        return put_slow(tm, rank, remote, local, n, rc)
    return get_slow(tm, rank, local, remote, n, rc)


cdef int nbi_sync(const gx_team* tm) except -1 nogil:
    """Complete every implicit op of the team's endpoint (C-level nbi_wait)."""
    if _net != NULL and tm.net_ep != NULL:
        _net.nbi_wait(tm.net_ep, 7)
    gx_quiet()
    return 0


cdef int get_slow(const gx_team* tm, int rank, void* dest, uintptr_t src, size_t n, int rc) except -1 nogil:
    cdef gx_target* t
    if rc == GX_NOT_MAPPED:
        t = tm.targets[rank]
        if t.transport == GX_TR_PVM:
            _pvm(t, src, dest, n, False, "get")
            return 0
        if t.transport == GX_TR_OFI and _net != NULL and tm.net_ep != NULL:
            return _net.get(tm.net_ep, t, src, dest, n, NET_BLOCKING, NULL)
    return _raise_rc(tm, rank, src, n, rc, "get")


cdef int atomic_slow(const gx_team* tm, int rank, uintptr_t addr, int dt, int op,
                     gx_val a, gx_val b, gx_val* result, int rc) except -1 nogil:
    cdef gx_target* t
    if rc == GX_NOT_MAPPED:
        t = tm.targets[rank]
        if t.transport == GX_TR_OFI and _net != NULL and tm.net_ep != NULL:
            return _net.atomic(tm.net_ep, t, addr, dt, op, a, b, result, NET_BLOCKING, NULL)
    if rc == GX_NOT_MAPPED and tm.targets[rank].transport == GX_TR_PVM:
        with gil:
            raise UnsupportedError(
                "atomic: the target segment is not mapped in this process (a client-allocated "
                "segment of another process, or GEXMK_TRANSPORT=pvm), and process_vm cannot do "
                "atomics; use a library-allocated segment")
    return _raise_rc(tm, rank, addr, gx_dt_size(dt), rc, "atomic")


# ---- directory of targets ---------------------------------------------------

cdef class _Target:
    """Owner of one gx_target: what this process knows of one remote EP."""

    def __dealloc__(self):
        free(self.t)


# ---- client -----------------------------------------------------------------

def init(comm=None):
    """Join the job and return its :class:`Client` (GASNet-EX ``gex_Client_Init``).

    Collective over every process of the job.  With nothing set up this is a
    job of one process; under ``python -m gexmk.run`` or ``mpiexec`` (mpi4py)
    it joins the others; ``comm`` takes an mpi4py communicator instead.
    Environment: GEXMK_TIMEOUT (seconds a collective waits for a peer),
    GEXMK_TRANSPORT (``auto``; ``pvm`` forces the process_vm path between
    processes of a node; ``ofi`` is not in this build).
    """
    global _client
    if _client is not None and not (<Client>_client).finalized:
        raise StateError("gexmk is already initialized in this process; finalize() the client first")
    force = os.environ.get("GEXMK_TRANSPORT", "auto").strip().lower() or "auto"
    if force not in ("auto", "self", "nbrhd", "pvm", "ofi"):
        raise ArgumentError(f"GEXMK_TRANSPORT={force!r}: expected auto, nbrhd, pvm or ofi")
    from gexmk import bootstrap
    boot = bootstrap.from_environment(comm)
    cdef Client c = Client.__new__(Client)
    try:
        c._setup(boot, force)
    except BaseException:
        boot.close()
        raise
    _client = c
    return c


def _open_network(bint multi_node):
    """The ofi transport's Domain, its table installed and, for providers
    with manual progress, its progress thread started (GEXMK_PROGRESS_THREAD:
    auto, 1, 0, or spin for a thread that polls without sleeping).  Provider and interface: GEXMK_OFI_PROVIDER (else
    libfabric's FI_PROVIDER / first match) and GEXMK_OFI_IFACE."""
    try:
        from gexmk import ofi_transport
    except ImportError as e:
        raise UnsupportedError(f"the ofi transport is needed (peers on other nodes or "
                               f"GEXMK_TRANSPORT=ofi) but not built: {e}") from None
    mode = os.environ.get("GEXMK_PROGRESS_THREAD", "auto").strip().lower()
    if mode not in ("auto", "1", "0", "on", "off", "yes", "no", "spin"):
        raise ArgumentError(f"GEXMK_PROGRESS_THREAD={mode!r}: expected auto, 1, 0 or spin")
    dom = ofi_transport.Domain(os.environ.get("GEXMK_OFI_PROVIDER") or None,
                               os.environ.get("GEXMK_OFI_IFACE") or None,
                               skip_loopback=multi_node)
    _set_net_ops(ofi_transport.ops_capsule())
    if mode in ("1", "on", "yes", "spin") or (mode == "auto" and dom.manual_progress):
        dom.start_progress(spin=(mode == "spin"))
    return dom


def _atexit():
    if _client is not None:
        (<Client>_client)._teardown()


atexit.register(_atexit)


cdef class Client:
    """A gexmk client (GASNet-EX ``gex_Client_t``): this process's membership
    of the job, its endpoints (the primordial one has index 0), its segments
    and the primordial team ``tm``.  Use as a context manager or call
    :meth:`finalize`."""

    def __init__(self):
        raise TypeError("use gexmk.init()")

    def _setup(self, boot, str force):
        self.bootstrap = boot
        self.rank = boot.rank
        self.size = boot.size
        # node index of every job rank, numbered by first appearance
        names = {}
        self._nodes = [names.setdefault(n, len(names)) for n in boot.nodes]
        self._pids = list(boot.pids)
        self._force = force
        self._eps = []
        self._dir = {}
        self._maps = {}
        self._segments = weakref.WeakSet()
        self._teams = weakref.WeakSet()
        self._retired = []
        self.net = None
        if force == "ofi" or len(set(self._nodes)) > 1:
            self.net = _open_network(multi_node=len(set(self._nodes)) > 1)
        ep0 = self.ep_create()
        self.tm = Team._make(self, ep0, [(j, 0) for j in range(self.size)], self.rank, "tm0", False)
        me = weakref.ref(self)

        def died(jobrank):
            c = me()
            if c is not None:
                (<Client>c)._peer_died(jobrank)
        boot.on_peer_death(died)

    cdef int check_alive(self) except -1:
        if self.finalized:
            raise StateError("the gexmk client has been finalized")
        return 0

    cdef _Target target(self, int jobrank, int ep_index):
        key = (jobrank, ep_index)
        cdef _Target tg = self._dir.get(key)
        if tg is None:
            tg = _Target.__new__(_Target)
            tg.t = <gx_target*>calloc(1, sizeof(gx_target))
            if tg.t == NULL:
                raise MemoryError()
            tg.t.jobrank = jobrank
            tg.t.ep_index = ep_index
            tg.t.pid = self._pids[jobrank]
            tg.t.transport = GX_TR_NONE
            self._dir[key] = tg
        return tg

    def _peer_died(self, int jobrank):
        cdef _Target tg
        for (jr, _), tg in list(self._dir.items()):
            if jr == jobrank:
                tg.t.dead = 1

    @property
    def finalized(self):
        """True once finalize() has run."""
        return self.finalized

    @property
    def eps(self):
        """The live endpoints of this process, by index."""
        return [e for e in self._eps if e is not None]

    def ep(self, int index):
        """The endpoint with this index (GASNet-EX ``gex_TM_QueryEP`` / index lookup)."""
        self.check_alive()
        if index < 0 or index >= len(self._eps) or self._eps[index] is None:
            raise ArgumentError(f"no live endpoint with index {index} in this process")
        return self._eps[index]

    def nodes(self):
        """Node index of every job rank (equal index: same host)."""
        return list(self._nodes)

    # -- memory kinds and segments --

    def mk_create(self, cls, device=0):
        """A memory kind (GASNet-EX ``gex_MK_Create``); see :func:`gexmk.memory.mk_create`."""
        self.check_alive()
        return _mk_create(cls, device)

    def segment_create(self, size=None, *, buffer=None, kind=None):
        """Create a segment (GASNet-EX ``gex_Segment_Create``), not yet bound.

        ``segment_create(size)``: library-allocated, zero-filled, in shared
        memory that peers of this node map at publication.
        ``segment_create(buffer=obj)``: client-allocated from any writable,
        contiguous PEP 3118 object, which the segment keeps alive; peers on
        this node reach it with process_vm_{read,write}v.
        """
        self.check_alive()
        if kind is not None and kind != HOST:
            if isinstance(kind, MemoryKind):
                raise UnsupportedError(f"segments of kind {kind!r} are not in this build (host memory only)")
            raise TypeError(f"kind must be a gexmk.MemoryKind, got {type(kind).__name__}")
        if (size is None) == (buffer is None):
            raise ArgumentError("give exactly one of size (library-allocated) or buffer= (client-allocated)")
        if buffer is not None:
            seg = Segment._client_buffer(self, buffer)
        else:
            if not isinstance(size, int) or isinstance(size, bool):
                raise TypeError(f"size must be an int, got {type(size).__name__}")
            if size <= 0:
                raise ArgumentError(f"segment size must be positive, got {size}")
            seg = Segment._library(self, size)
        self._segments.add(seg)
        return seg

    def segment_attach(self, size):
        """Create a library-allocated segment, bind it to the primordial EP and
        publish it over the primordial team (GASNet-EX ``gex_Segment_Attach``).
        Collective over the job."""
        seg = self.segment_create(size)
        ep0 = self.ep(0)
        if ep0.segment is not None:
            ep0.unbind_segment()
        ep0.bind_segment(seg)
        self.tm.publish_bound_segment([ep0])
        return seg

    def _segment_destroyed(self, Segment seg):
        """Unbind a segment being destroyed.  True when the client keeps its
        memory until finalize: client memory that peers reach by address
        (process_vm) must not be handed back while a peer that has not seen
        a new publication may still write to it."""
        bound = False
        for e in self._eps:
            if e is not None and (<Endpoint>e).segment is seg:
                (<Endpoint>e).unbind_segment()
                bound = True
        self._drain()     # a GIL-free copy may still be writing into it
        if bound and not seg.library_allocated and self.size > 1 and not self.finalized:
            self._retired.append(seg)
            return True
        return False

    def _drain(self):
        """Wait until no GIL-free copy started through the Python API is running."""
        while self._inflight > 0:
            threading.Event().wait(0.0005)

    # -- endpoints --

    def ep_create(self, int caps=EP_CAPABILITY_RMA):
        """Create an endpoint (GASNet-EX ``gex_EP_Create``) with its own index
        and completion state.  Not collective."""
        self.check_alive()
        if caps & ~EP_CAPABILITY_ALL or caps == 0:
            raise ArgumentError(f"unsupported endpoint capabilities {caps:#x}: this build offers "
                                "EP_CAPABILITY_RMA")
        cdef Endpoint ep = Endpoint.__new__(Endpoint)
        ep.client = self
        ep._keep_put = []
        ep._keep_get = []
        ep.index = len(self._eps)
        ep.caps = caps
        if self.net is not None:
            ep.net = self.net.endpoint()
            ep.net_handle = <void*><uintptr_t>ep.net.handle
        self._eps.append(ep)
        return ep

    # -- teardown --

    def finalize(self):
        """Leave the job: a barrier over the primordial team (skipped when a peer
        has died), then release every segment, mapping and endpoint.  Idempotent."""
        if self.finalized:
            return
        try:
            self.tm.barrier()
        except PeerDeadError:
            pass
        finally:
            self._teardown()

    def _teardown(self):
        global _client
        if self.finalized:
            return
        self.finalized = True
        for t in list(self._teams):
            (<Team>t)._close()
        self._drain()
        for m in self._maps.values():
            munmap(<void*><uintptr_t>m[0], <size_t>m[1])
        self._maps.clear()
        self._dir.clear()
        for s in list(self._segments):
            s.destroy()
        for s in self._retired:
            if (<Segment>s).exports == 0:
                (<Segment>s)._free()
        self._retired = []
        for e in self._eps:
            if e is not None:
                (<Endpoint>e).destroyed = True
        if self.net is not None:
            self.net.close()
        self.bootstrap.close()
        if _client is self:
            _client = None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if exc_type is None:
            self.finalize()
        else:
            self._teardown()    # no collective while unwinding an error
        return False

    def __repr__(self):
        state = "finalized" if self.finalized else f"rank {self.rank} of {self.size}"
        return f"<gexmk.Client {state}>"

    # -- publication (used by Team) --

    def _seg_info(self, Endpoint ep):
        cdef Segment s = ep.segment
        name = ep.net.name if ep.net is not None else b""
        if s is None:
            return (ep.index, 0, 0, GX_MK_HOST, -1, "", name, 0, 0)
        key, base = ep._net_reg if ep._net_reg is not None else (0, 0)
        return (ep.index, <uintptr_t>s.addr, s.size, s.kind.cls, s.fd, s.token, name, key, base)

    def _apply(self, int jobrank, tuple info):
        """Record what (jobrank, EP) published: map it here when possible."""
        ep_index, base, size, kind, fd, token, net_name, net_key, net_base = info
        cdef _Target tg = self.target(jobrank, ep_index)
        cdef gx_target* t = tg.t
        if jobrank == self.rank:
            return      # local EPs are known from bind_segment
        if size == 0:
            self._unmap(tg)
            t.size = 0
            t.remote_base = 0
            t.transport = GX_TR_NONE
            return
        t.kind = kind
        if (self._nodes[jobrank] != self._nodes[self.rank] or self._force == "ofi"
                or (fd < 0 and self.net is not None)):
            # other node, forced, or client memory this node cannot map: the network
            self._unmap(tg)
            t.transport = GX_TR_OFI
            if self.net is not None and net_name:
                t.net_addr, t.net_aaddr = self.net.insert(net_name)
                t.net_key = self.net.map_key(net_key, net_base)   # raw keys are mapped here
                t.net_base = net_base
        elif fd >= 0 and self._force != "pvm" and self._try_map(tg, (jobrank, token), fd, size):
            t.transport = GX_TR_NBRHD
        else:
            self._unmap(tg)
            t.transport = GX_TR_PVM
        t.remote_base = base
        t.size = size

    def _try_map(self, _Target tg, key, int fd, size_t size):
        """Map the peer's segment here; False when this process may not (it
        is then reached through process_vm, which reports its own error)."""
        if tg.map_key == key:
            return True
        self._unmap(tg)
        try:
            self._map(tg, key, fd, size)
        except OSError:
            return False
        return True

    def _map(self, _Target tg, key, int fd, size_t size):
        m = self._maps.get(key)
        if m is None:
            addr, maplen = _map_peer_fd(tg.t.pid, fd, key[1], size)
            m = self._maps[key] = [addr, maplen, 0]
        m[2] += 1
        tg.map_key = key
        tg.t.local_base = <char*><uintptr_t>m[0]

    def _unmap(self, _Target tg):
        tg.t.local_base = NULL
        key, tg.map_key = tg.map_key, None
        if key is None:
            return
        m = self._maps[key]
        m[2] -= 1
        if m[2] == 0:
            del self._maps[key]
            munmap(<void*><uintptr_t>m[0], <size_t>m[1])


def _map_peer_fd(int pid, int fd, str token, size_t size):
    """Map a peer's memfd: open it through /proc/<pid>/fd (a read-level
    ptrace check), else pidfd_getfd; check it is the file the peer published."""
    path = f"/proc/{pid}/fd/{fd}"
    try:
        link = os.readlink(path)
    except OSError as e:
        if not os.path.exists(f"/proc/{pid}"):
            raise PeerDeadError(f"job peer pid {pid} is gone: {e}") from None
        raise       # not permitted: the caller falls back to process_vm
    if token not in link:
        raise SegmentError(f"peer pid {pid}'s fd {fd} is {link!r}, not the published segment {token!r} "
                           "(destroyed during publication?)")
    cdef int nfd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    cdef size_t page = <size_t>sysconf(_SC_PAGESIZE)
    cdef size_t maplen = ((size + page - 1) // page) * page
    cdef void* p
    try:
        if os.fstat(nfd).st_size < <Py_ssize_t>size:
            raise SegmentError(f"peer pid {pid}'s segment {token!r} is smaller than published")
        p = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_SHARED, nfd, 0)
        if p == MAP_FAILED:
            raise OSError(errno, f"mapping peer segment {token!r}: {os.strerror(errno)}")
    finally:
        close(nfd)
    return <uintptr_t>p, maplen


# ---- endpoints --------------------------------------------------------------

cdef class Endpoint:
    """An endpoint (GASNet-EX ``gex_EP_t``): the unit that binds a segment and
    initiates communication.  Index 0 is the primordial endpoint."""

    def __init__(self):
        raise TypeError("use client.ep_create()")

    cdef int check_alive(self) except -1:
        if self.destroyed:
            raise StateError(f"endpoint {self.index} has been destroyed")
        self.client.check_alive()
        return 0

    def bind_segment(self, Segment seg not None):
        """Bind ``seg`` to this endpoint (GASNet-EX ``gex_EP_BindSegment``).
        Peers can target it once it is published (``publish_bound_segment``);
        other endpoints of this process can target it at once."""
        self.check_alive()
        seg.check_alive()
        if seg.client is not self.client:
            raise ArgumentError("the segment belongs to another client")
        if self.segment is not None:
            raise StateError(f"endpoint {self.index} already has a bound segment; unbind it first")
        for e in self.client._eps:
            if e is not None and (<Endpoint>e).segment is seg:
                raise StateError(f"the segment is already bound to endpoint {(<Endpoint>e).index}")
        if self.net is not None:
            self._net_reg = self.net.bind(<uintptr_t>seg.addr, seg.size)
        self.segment = seg
        cdef gx_target* t = self.client.target(self.client.rank, self.index).t
        t.kind = seg.kind.cls
        t.remote_base = <uintptr_t>seg.addr
        t.local_base = seg.addr
        t.size = seg.size
        t.transport = GX_TR_SELF

    def unbind_segment(self):
        """Unbind the bound segment (no-op when none).  Peers learn of it at
        the next publication; until then their accesses land in memory that
        stays valid: a library-allocated segment stays mapped in the peers
        that mapped it, client memory is retained until finalize when its
        segment is destroyed, and network registrations are closed (peers'
        accesses fail)."""
        if self.segment is None:
            return
        self.segment = None
        if self.net is not None:
            self._net_reg = None
            if not self.net.closed:
                self.net.unbind()
        cdef gx_target* t = self.client.target(self.client.rank, self.index).t
        t.size = 0
        t.local_base = NULL
        t.transport = GX_TR_NONE

    def destroy(self):
        """Destroy the endpoint (idempotent); its index is not reused."""
        if self.destroyed:
            return
        self.unbind_segment()
        self.destroyed = True
        if self.net is not None:
            self.net.close()
            self.net_handle = NULL
        if not self.client.finalized:
            self.client._eps[self.index] = None

    @property
    def destroyed(self):
        """True once destroy() has run."""
        return self.destroyed

    def pair(self, int remote_index):
        """A TM-pair (GASNet-EX ``gex_TM_Pair``): a team-like handle whose
        rank argument is a job rank and whose target is that process's
        endpoint ``remote_index``.  No collectives on it."""
        self.check_alive()
        if remote_index < 0:
            raise ArgumentError(f"remote endpoint index must be >= 0, got {remote_index}")
        c = self.client
        return Team._make(c, self, [(j, remote_index) for j in range(c.size)], c.rank,
                          f"pair{self.index}:{remote_index}", True)

    def __repr__(self):
        return f"<gexmk.Endpoint {self.index}{' destroyed' if self.destroyed else ''}>"


# ---- teams and RMA ----------------------------------------------------------

cdef class Team:
    """A team (GASNet-EX ``gex_TM_t``): an ordered set of endpoints, seen from
    one local member endpoint.  RMA calls name the target by team rank and
    a remote address inside the target's bound segment (an address in the
    target process, as GASNet-EX; ``addr(rank, offset)`` builds one)."""

    def __init__(self):
        raise TypeError("teams come from client.tm, ep.pair(), tm.split(), tm.create() or tm.dup()")

    def __dealloc__(self):
        free(self.c.targets)

    @staticmethod
    cdef Team _make(Client client, Endpoint ep, list members, int rank, str tid, bint pair):
        cdef Team tm = Team.__new__(Team)
        tm.client = client
        tm.ep = ep
        tm._members = members
        tm.id = tid
        tm._pair = pair
        tm.c.rank = rank
        tm.c.owner = <void*>tm
        tm.c.net_ep = ep.net_handle
        tm._set_targets()
        client._teams.add(tm)
        return tm

    cdef int _set_targets(self) except -1:
        cdef int n = len(self._members)
        cdef gx_target** arr = <gx_target**>calloc(n if n else 1, sizeof(gx_target*))
        if arr == NULL:
            raise MemoryError()
        for i, (jr, epi) in enumerate(self._members):
            arr[i] = self.client.target(jr, epi).t
        self.c.targets = arr
        self.c.size = n
        return 0

    cdef void _close(self) noexcept:
        self._closed = True
        self.c.size = 0     # every rank now fails the fast path's check

    cdef int check_alive(self) except -1:
        if self._closed:
            raise StateError("the team is closed (its client was finalized)")
        return 0

    @property
    def rank(self):
        """This member's rank in the team (GASNet-EX ``gex_TM_QueryRank``)."""
        return self.c.rank

    @property
    def size(self):
        """Number of members (GASNet-EX ``gex_TM_QuerySize``)."""
        return len(self._members)

    def __repr__(self):
        return f"<gexmk.Team {self.id} rank {self.c.rank} of {len(self._members)}>"

    # -- rank translation --

    def ep_location(self, int rank):
        """(job rank, endpoint index) of team rank ``rank``."""
        self._check_rank(rank)
        return self._members[rank]

    def translate_rank_to_jobrank(self, int rank):
        """Job rank of team rank ``rank`` (GASNet-EX ``gex_TM_TranslateRankToJobrank``)."""
        self._check_rank(rank)
        return self._members[rank][0]

    def translate_jobrank_to_rank(self, int jobrank):
        """Team rank of job rank ``jobrank`` or None when it is not a member
        (GASNet-EX ``gex_TM_TranslateJobrankToRank``; first match for a
        process holding several members)."""
        if jobrank < 0 or jobrank >= self.client.size:
            raise RankError(f"job rank {jobrank} is outside the job (size {self.client.size})")
        for i, (jr, _) in enumerate(self._members):
            if jr == jobrank:
                return i
        return None

    cdef int _check_rank(self, int rank) except -1:
        self.check_alive()
        if rank < 0 or rank >= len(self._members):
            raise RankError(f"rank {rank} is outside the team (size {len(self._members)})")
        return 0

    def transport(self, int rank):
        """Name of the transport that reaches team rank ``rank``: 'self',
        'nbrhd', 'pvm', 'ofi' or 'none' (nothing published yet)."""
        self._check_rank(rank)
        return _TRANSPORT_NAMES[self.c.targets[rank].transport]

    def addr(self, int rank, size_t offset=0):
        """Remote address of byte ``offset`` of team rank ``rank``'s bound segment."""
        self._check_rank(rank)
        cdef gx_target* t = self.c.targets[rank]
        if t.size == 0:
            _raise_rc(&self.c, rank, 0, 0, GX_ERANGE, "addr")
        if offset > t.size:
            raise BoundsError(f"offset {offset} is past the end of team rank {rank}'s segment "
                              f"({t.size} bytes)")
        return t.remote_base + offset

    # -- collectives --

    cdef list _exchange(self, object payload):
        self.check_alive()
        if self._pair:
            raise StateError("collectives are not defined on a TM-pair")
        key = f"{self.id}#{self._seq}"
        self._seq += 1
        parts = self.client.bootstrap.exchange(key, [m[0] for m in self._members], self.c.rank,
                                               pickle.dumps(payload))
        return [pickle.loads(p) for p in parts]

    def barrier(self):
        """Block until every member has entered (GASNet-EX ``gex_Coll_BarrierNB`` + wait)."""
        self._exchange(None)

    def publish_bound_segment(self, eps=()):
        """Publish the bound segments of ``eps`` (local endpoints; zero is
        allowed) to every member's process (GASNet-EX
        ``gex_EP_PublishBoundSegment``).  Collective over the team; may be
        repeated; an endpoint with nothing bound publishes "no segment"."""
        self.check_alive()
        eps = list(eps)
        for e in eps:
            if not isinstance(e, Endpoint):
                raise TypeError(f"eps must be gexmk.Endpoint objects, got {type(e).__name__}")
            if (<Endpoint>e).client is not self.client:
                raise ArgumentError("an endpoint of another client cannot be published here")
            (<Endpoint>e).check_alive()
        mine = [self.client._seg_info(e) for e in eps]
        parts = self._exchange(mine)
        err = None
        for i, infos in enumerate(parts):
            jr = self._members[i][0]
            for info in infos:
                try:
                    self.client._apply(jr, info)
                except GexmkError as e:       # keep the collective going; report after
                    err = err or e
        # Owners keep their segments until every peer has mapped them.
        self._exchange(None)
        if err is not None:
            raise err

    def query_bound_segment_nb(self, int rank):
        """Event whose result is the :class:`BoundSegment` of team rank
        ``rank`` (GASNet-EX ``gex_EP_QueryBoundSegmentNB``).  Raises
        SegmentError when that endpoint has published nothing to this process."""
        self._check_rank(rank)
        cdef gx_target* t = self.c.targets[rank]
        if t.size == 0:
            _raise_rc(&self.c, rank, 0, 0, GX_ERANGE, "query_bound_segment_nb")
        local = <uintptr_t>t.local_base if t.local_base != NULL else None
        kind = HOST if t.kind == GX_MK_HOST else _mk_create(t.kind, 0)
        return _done_event(BoundSegment(t.remote_base, t.size, local, kind,
                                        _TRANSPORT_NAMES[t.transport]))

    def split(self, color, int key=0):
        """Split into teams of equal ``color`` ordered by (key, rank)
        (GASNet-EX ``gex_TM_Split``).  Collective; ``color=None`` (or
        negative) joins no team and returns None."""
        if color is not None and not isinstance(color, int):
            raise TypeError(f"color must be an int or None, got {type(color).__name__}")
        seq = self._seq
        parts = self._exchange((color, key, self.ep.index))
        if color is None or color < 0:
            return None
        chosen = sorted((k, r) for r, (c, k, _) in enumerate(parts) if c == color)
        members = [(self._members[r][0], parts[r][2]) for _, r in chosen]
        rank = [r for _, r in chosen].index(self.c.rank)
        return Team._make(self.client, self.ep, members, rank, f"{self.id}.s{seq}.{color}", False)

    def for_ep(self, Endpoint ep not None):
        """This team seen from another local member endpoint ``ep`` (teams made
        by ``create`` may hold several endpoints of one process).  Take it
        right after creating the team: collectives need one call per member,
        each through its own Team object, in the same order."""
        self.check_alive()
        me = (self.client.rank, ep.index)
        if ep.client is not self.client or me not in self._members:
            raise ArgumentError(f"endpoint {ep.index} of this process is not a member of this team")
        cdef Team tm = Team._make(self.client, ep, self._members, self._members.index(me),
                                  self.id, self._pair)
        tm._seq = self._seq
        return tm

    def dup(self):
        """A new team with the same members (missing from GASNet-EX).  Collective."""
        seq = self._seq
        self._exchange(None)
        return Team._make(self.client, self.ep, list(self._members), self.c.rank,
                          f"{self.id}.d{seq}", False)

    def create(self, members):
        """Create a team from ``members`` (GASNet-EX ``gex_TM_Create``):
        collective over this team; every caller passes the member list of the
        team it joins (ranks of this team, or (job rank, EP index) pairs, in new
        rank order), or None/[] to join none.  Members of one new team must pass
        equal lists.  Returns the new team seen from this process's endpoint in
        it (this team's endpoint when listed, else another local endpoint
        listed), or None."""
        norm = None
        if members:
            norm = []
            for m in members:
                if isinstance(m, int):
                    self._check_rank(m)
                    norm.append(tuple(self._members[m]))
                elif isinstance(m, tuple) and len(m) == 2 and all(isinstance(x, int) for x in m):
                    if not 0 <= m[0] < self.client.size:
                        raise RankError(f"job rank {m[0]} is outside the job")
                    norm.append(m)
                else:
                    raise TypeError(f"members must be team ranks or (jobrank, ep_index) pairs, got {m!r}")
            if len(set(norm)) != len(norm):
                raise ArgumentError("members lists an endpoint twice")
        seq = self._seq
        parts = self._exchange(norm)
        if not norm:
            return None
        me = self.client.rank
        local = [i for i, (jr, epi) in enumerate(norm) if jr == me]
        if not local:
            return None
        for i, p in enumerate(parts):
            if p and tuple(self._members[i]) in norm and p != norm:
                raise ArgumentError(f"rank {i} passed a different member list for the same team: "
                                    f"{p} vs {norm}")
        mine = [i for i in local if norm[i][1] == self.ep.index]
        rank = mine[0] if mine else local[0]
        ep = self.client.ep(norm[rank][1])
        digest = hashlib.sha1(repr(norm).encode()).hexdigest()[:12]
        return Team._make(self.client, ep, norm, rank, f"{self.id}.c{seq}.{digest}", False)

    # -- RMA: puts --

    cdef int _put(self, int rank, uintptr_t dest, const void* p, size_t n) except -1:
        cdef int rc
        if n < _NOGIL_BYTES:
            rc = gx_put(&self.c, rank, dest, p, n)
            if rc == GX_OK:
                return 0
            if rc != GX_NOT_MAPPED:
                return put_slow(&self.c, rank, dest, p, n, rc)     # reports the error
        else:
            rc = GX_OK
        # Large copies and every network/process_vm operation run without the
        # GIL: other threads (the bootstrap's death notices among them) go on.
        self.client._inflight += 1
        try:
            with nogil:
                if rc == GX_OK:
                    rc = gx_put(&self.c, rank, dest, p, n)
                if rc != GX_OK:
                    put_slow(&self.c, rank, dest, p, n, rc)
        finally:
            self.client._inflight -= 1
        return 0

    cdef int _get(self, void* p, int rank, uintptr_t src, size_t n) except -1:
        cdef int rc
        if n < _NOGIL_BYTES:
            rc = gx_get(&self.c, rank, p, src, n)
            if rc == GX_OK:
                return 0
            if rc != GX_NOT_MAPPED:
                return get_slow(&self.c, rank, p, src, n, rc)     # reports the error
        else:
            rc = GX_OK
        self.client._inflight += 1
        try:
            with nogil:
                if rc == GX_OK:
                    rc = gx_get(&self.c, rank, p, src, n)
                if rc != GX_OK:
                    get_slow(&self.c, rank, p, src, n, rc)
        finally:
            self.client._inflight -= 1
        return 0

    def put(self, int rank, uintptr_t dest, src):
        """Blocking put (GASNet-EX ``gex_RMA_PutBlocking``): copy ``src`` (a
        PEP 3118 object or (address, nbytes)) to address ``dest`` of team rank
        ``rank``; complete (visible at the target) on return."""
        cdef Py_buffer view
        cdef _Local loc
        _take(src, &view, &loc, False, b"src")
        try:
            self._put(rank, dest, loc.p, loc.n)
        finally:
            _drop(&view, &loc)

    cdef object _issue(self, bint is_put, int mode, int rank, uintptr_t addr, object buf):
        """Start a put or get of ``buf`` that need not complete on return.
        Returns a pending Event (network op in NET_NB mode) or None when the
        operation is already complete (mapped and process_vm targets complete
        at issue).  Implicit network ops keep their buffer alive in the client
        until nbi_wait."""
        cdef Py_buffer view
        cdef _Local loc
        cdef int rc
        cdef void* op = NULL
        cdef gx_target* t
        cdef char* p
        cdef void* h = self.c.net_ep
        _take(buf, &view, &loc, not is_put, b"src" if is_put else b"dest")
        try:
            rc = gx_locate(&self.c, rank, addr, loc.n, &p, &t)
            if rc == GX_NOT_MAPPED and t.transport == GX_TR_OFI and _net != NULL and h != NULL:
                with nogil:
                    if is_put:
                        _net.put(h, t, addr, loc.p, loc.n, mode, &op)
                    else:
                        _net.get(h, t, addr, loc.p, loc.n, mode, &op)
                if op != NULL:
                    return _net_event(op, buf, -1)
                if mode == NET_NBI:      # held until the endpoint's next sync of its category
                    (self.ep._keep_put if is_put else self.ep._keep_get).append(buf)
                return None
            if is_put:
                self._put(rank, addr, loc.p, loc.n)
            else:
                self._get(loc.p, rank, addr, loc.n)
            return None
        finally:
            _drop(&view, &loc)

    def put_nb(self, int rank, uintptr_t dest, src, lc=LC_NOW):
        """Non-blocking put (``gex_RMA_PutNB``): returns an Event for remote
        completion.  ``lc``: LC_NOW (source reusable on return), LC_DEFER
        (``ev.leaf(EC_LC)``), LC_GROUP (``nbi_wait(EC_PUT)``) or a LeafEvent.
        Over the network, local completion is reported with remote completion."""
        cdef int now = _lc_mode(lc)
        ev = self._issue(True, NET_NB, rank, dest, src)
        if ev is None:
            return _lc_event(lc, _DONE)
        if now:
            (<Event>ev).wait()       # the source must be reusable on return
            return _lc_event(lc, _DONE)
        return _lc_event(lc, <Event>ev)

    def put_nbi(self, int rank, uintptr_t dest, src, lc=LC_NOW):
        """Implicit-event put (``gex_RMA_PutNBI``): completed by ``nbi_wait``,
        ``quiet`` or the enclosing access region's event.  With LC_NOW (or a
        LeafEvent) the source is reusable on return; with LC_GROUP/LC_DEFER
        it is held until ``nbi_wait``."""
        cdef int now = _lc_mode(lc)
        self._issue(True, NET_NBI_LCNOW if (now or isinstance(lc, LeafEvent)) else NET_NBI,
                    rank, dest, src)
        if isinstance(lc, LeafEvent):
            _lc_event(lc, _DONE)

    def put_val(self, int rank, uintptr_t dest, value, size_t nbytes=8):
        """Blocking put of the low ``nbytes`` (1..8) of the integer ``value``
        (``gex_RMA_PutBlockingVal``; native byte order)."""
        cdef uint64_t v = PyLong_AsUnsignedLongLongMask(value)
        if nbytes == 0 or nbytes > 8:
            raise ArgumentError(f"nbytes must be 1..8 for a value put, got {nbytes}")
        self._put(rank, dest, &v, nbytes)

    def put_nb_val(self, int rank, uintptr_t dest, value, size_t nbytes=8):
        """Non-blocking value put (``gex_RMA_PutNBVal``); returns an Event."""
        self.put_val(rank, dest, value, nbytes)
        return _DONE

    def put_nbi_val(self, int rank, uintptr_t dest, value, size_t nbytes=8):
        """Implicit-event value put (``gex_RMA_PutNBIVal``)."""
        self.put_val(rank, dest, value, nbytes)

    # -- RMA: gets --

    def get(self, dest, int rank, uintptr_t src):
        """Blocking get (``gex_RMA_GetBlocking``): fill ``dest`` (a writable
        PEP 3118 object or (address, nbytes)) from address ``src`` of team rank
        ``rank``."""
        cdef Py_buffer view
        cdef _Local loc
        _take(dest, &view, &loc, True, b"dest")
        try:
            self._get(loc.p, rank, src, loc.n)
        finally:
            _drop(&view, &loc)

    def get_nb(self, dest, int rank, uintptr_t src):
        """Non-blocking get (``gex_RMA_GetNB``); returns an Event.  ``dest`` is
        held (and must not be read) until the event completes."""
        ev = self._issue(False, NET_NB, rank, src, dest)
        return _DONE if ev is None else ev

    def get_nbi(self, dest, int rank, uintptr_t src):
        """Implicit-event get (``gex_RMA_GetNBI``): ``dest`` is filled by the
        next ``nbi_wait(EC_GET)`` (or the access region's event)."""
        self._issue(False, NET_NBI, rank, src, dest)

    def get_val(self, int rank, uintptr_t src, size_t nbytes=8):
        """Blocking get of ``nbytes`` (1..8) returned as an unsigned int
        (``gex_RMA_GetBlockingVal``)."""
        cdef uint64_t v = 0
        if nbytes == 0 or nbytes > 8:
            raise ArgumentError(f"nbytes must be 1..8 for a value get, got {nbytes}")
        self._get(&v, rank, src, nbytes)
        return v

    # -- ordering --

    def fence(self):
        """Order earlier puts/atomics of this team's endpoint before later ones
        (NVSHMEM fence; over the network it completes them)."""
        _nbi_sync(EC_PUT | EC_RMW, self.ep)

    def quiet(self):
        """Complete every outstanding put/atomic of this team's endpoint
        (NVSHMEM quiet on this endpoint's context)."""
        _nbi_sync(EC_PUT | EC_RMW, self.ep)

    # -- atomics --

    def ad_create(self, int dt, int ops, int flags=0):
        """Create an :class:`AtomicDomain` over this team for data type ``dt``
        and the op set ``ops`` (OP_* flags or-ed).  Collective."""
        return AtomicDomain._make(self, dt, ops, flags)


# ---- atomic domains ---------------------------------------------------------

cdef class AtomicDomain:
    """An atomic domain (GASNet-EX ``gex_AD_t``) for one data type and a set
    of operations over a team.  Ops on mapped targets are CPU atomics on the
    shared mapping: atomic across every process of the node.  As in NVSHMEM,
    they are atomic only with respect to other atomics of the same domain
    type on the same object, not to plain puts or local stores."""
    cdef readonly Team team
    cdef readonly int dt
    cdef readonly int ops
    cdef bint destroyed

    def __init__(self):
        raise TypeError("use tm.ad_create(dt, ops)")

    @staticmethod
    cdef AtomicDomain _make(Team tm, int dt, int ops, int flags):
        tm.check_alive()
        if dt not in _DT_NAMES:
            raise ArgumentError(f"unknown atomic data type {dt}; use DT_I32, DT_U32, DT_I64, DT_U64, "
                                "DT_FLT or DT_DBL")
        if ops == 0 or ops & ~_ALL_OPS:
            raise ArgumentError(f"ops {ops:#x} must be a non-empty or-combination of OP_* flags")
        if dt in (DT_FLT, DT_DBL) and ops & _BITWISE:
            raise ArgumentError(f"bitwise ops are not defined for {_DT_NAMES[dt]}")
        if not tm._pair:
            tm.barrier()
        cdef AtomicDomain ad = AtomicDomain.__new__(AtomicDomain)
        ad.team = tm
        ad.dt = dt
        ad.ops = ops
        return ad

    def destroy(self):
        """Destroy the domain (idempotent; GASNet-EX ``gex_AD_Destroy``)."""
        self.destroyed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()

    cdef object _do(self, int rank, uintptr_t addr, int op, object a, object b, int mode):
        """Run one op; the fetched value (or None), or for mode NET_NB an Event."""
        cdef gx_val va, vb, res
        cdef int code, rc, dt = self.dt
        cdef void* nop = NULL
        cdef gx_target* t
        cdef char* p
        if self.destroyed:
            raise StateError("the atomic domain has been destroyed")
        if op <= 0 or op & (op - 1) or not (op & self.ops):
            if op > 0 and not op & (op - 1) and op & _C_ALL_OPS:
                raise ArgumentError(f"op {op:#x} is not in this domain's op set {self.ops:#x}")
            raise ArgumentError(f"op must be one OP_* flag, got {op!r}")
        code = _bit_index(op)
        if addr & (gx_dt_size(dt) - 1):
            raise BoundsError(f"atomic: address 0x{addr:x} is not aligned to {gx_dt_size(dt)} bytes")
        va.u64 = 0
        vb.u64 = 0
        res.u64 = 0
        if not op & _C_NO_OPERAND:
            _to_val(dt, a, &va, "operand1")
        if op & _C_TWO_OPERANDS:
            _to_val(dt, b, &vb, "operand2")
        rc = gx_atomic(&self.team.c, rank, addr, dt, code, va, vb, &res)
        if rc == GX_NOT_MAPPED and mode != NET_BLOCKING:
            rc = gx_locate(&self.team.c, rank, addr, gx_dt_size(dt), &p, &t)
            if rc == GX_NOT_MAPPED and t.transport == GX_TR_OFI and _net != NULL \
                    and self.team.c.net_ep != NULL:
                with nogil:
                    _net.atomic(self.team.c.net_ep, t, addr, dt, code, va, vb, &res, mode, &nop)
                if nop != NULL:
                    return _net_event(nop, None, dt if op & _C_FETCHING else -1)
                return None
            rc = GX_NOT_MAPPED
        if rc == GX_NOT_MAPPED:
            with nogil:
                atomic_slow(&self.team.c, rank, addr, dt, code, va, vb, &res, rc)
        elif rc != GX_OK:
            atomic_slow(&self.team.c, rank, addr, dt, code, va, vb, &res, rc)
        if not op & _C_FETCHING:
            return None
        return _from_val(dt, &res)

    def op(self, int rank, uintptr_t addr, int op, operand1=None, operand2=None):
        """Blocking atomic: perform ``op`` on the object at ``addr`` of team
        rank ``rank``; return the old value for fetching ops, else None.
        CAS/FCAS: operand1 is compared, operand2 is swapped in."""
        return self._do(rank, addr, op, operand1, operand2, NET_BLOCKING)

    def op_nb(self, int rank, uintptr_t addr, int op, operand1=None, operand2=None):
        """Non-blocking atomic (``gex_AD_OpNB``): an Event whose result is the
        fetched value (None for non-fetching ops)."""
        r = self._do(rank, addr, op, operand1, operand2, NET_NB)
        if isinstance(r, Event):
            return r
        return _done_event(r)

    def op_nbi(self, int rank, uintptr_t addr, int op, operand1=None, operand2=None, result=None):
        """Implicit-event atomic (``gex_AD_OpNBI``); a fetching op writes the
        old value into ``result`` (a writable buffer of the domain's type size)."""
        mv = None
        if op & _FETCHING:
            if result is None:
                raise ArgumentError("a fetching op issued NBI needs a result= buffer")
            # check the result buffer before the op runs: never lose a fetched value
            try:
                mv = memoryview(result).cast("B")
            except (TypeError, ValueError) as e:
                raise TypeError(f"result must be a writable contiguous buffer: {e}") from None
            if mv.readonly or mv.nbytes < gx_dt_size(self.dt):
                raise ArgumentError(f"result must be a writable buffer of at least "
                                    f"{gx_dt_size(self.dt)} bytes")
        # fetching ops complete here (the value must land in result); others are implicit
        v = self._do(rank, addr, op, operand1, operand2, NET_BLOCKING if mv is not None else NET_NBI)
        if mv is not None:
            struct.pack_into(_DT_FORMATS[self.dt], mv, 0, v)


cdef int _bit_index(int op) noexcept:
    cdef int i = 0
    while not (op & 1):
        op >>= 1
        i += 1
    return i


cdef int _to_val(int dt, object x, gx_val* v, str what) except -1:
    cdef long long i
    cdef unsigned long long u
    if x is None:
        raise ArgumentError(f"{what} is required for this op")
    if dt == GX_DT_FLT:
        v.flt = <float>float(x)
        return 0
    if dt == GX_DT_DBL:
        v.dbl = float(x)
        return 0
    if not isinstance(x, int):
        raise TypeError(f"{what} must be an int for {_DT_NAMES[dt]}, got {type(x).__name__}")
    try:
        if dt == GX_DT_U64 or dt == GX_DT_U32:
            if x < 0:
                raise OverflowError
            u = x
            if dt == GX_DT_U32:
                if u > 0xFFFFFFFFu:
                    raise OverflowError
                v.u32 = <uint32_t>u
            else:
                v.u64 = u
        else:
            i = x
            if dt == GX_DT_I32:
                if i < -2147483648 or i > 2147483647:
                    raise OverflowError
                v.i32 = <int32_t>i
            else:
                v.i64 = i
    except OverflowError:
        raise OverflowError(f"{what}={x} does not fit {_DT_NAMES[dt]}") from None
    return 0


cdef object _from_val(int dt, gx_val* v):
    if dt == GX_DT_I32:
        return v.i32
    if dt == GX_DT_U32:
        return v.u32
    if dt == GX_DT_I64:
        return v.i64
    if dt == GX_DT_U64:
        return v.u64
    if dt == GX_DT_FLT:
        return v.flt
    return v.dbl
