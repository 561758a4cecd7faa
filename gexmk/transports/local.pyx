"""The ``local`` transport: targets this process reaches without a network.

Four paths, each with its own table:

``self``
    an endpoint of this process: its host segment is addressed directly
    (memcpy, CPU atomics).
``nbrhd``
    a library-allocated host segment of another process of this node: its
    ``memfd`` is mapped here at publication (opened through ``/proc/<pid>/fd``
    after checking it is the published file), so puts, gets and atomics are
    memcpy and CPU atomics on the shared mapping (atomic across the node).
``pvm``
    client-allocated host memory of another process of this node (or any,
    with ``GEXMK_TRANSPORT=pvm``): ``process_vm_{read,write}v``; no atomics.

``nbrhd-landed``
    a device segment of another process of this node that cannot be
    exported (stream-ordered pool memory): its owner's lander thread copies
    requests in and out of a landing zone of shared pinned host memory
    (``local.src/landed.pxi``).

Every operation completes at issue; NB operations hand out no op.  The inline
fast path of ``gexmk.h`` serves ``self`` and ``nbrhd`` for host buffers; the
tables here serve what it declines.

Device segments (``self`` and ``nbrhd`` too) go through their memory kind's
table: copies on the endpoint's own streams (NB ones completed by events);
large copies whose host side is pageable pipelined through the endpoint's
pinned bounce buffers (``local.src/pageable.pxi``); tiny ones by the kind's
write_value or copy_small where GEXMK_CUDA_SMALL_PUT asks; atomics by the
kind's ``atomic`` slot.
"""
import os
import pickle

from gexmk.transports import fdpass

from libc.errno cimport errno, EPERM, ESRCH, EFAULT
from libc.stdint cimport uintptr_t, uint64_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy, memset
from posix.stdlib cimport posix_memalign
from posix.mman cimport mmap, munmap, PROT_READ, PROT_WRITE, MAP_SHARED, MAP_FAILED

cdef extern from "<sys/mman.h>" nogil:
    int madvise(void* addr, size_t length, int advice)
    enum: MADV_HUGEPAGE
from posix.unistd cimport close, sysconf, _SC_PAGESIZE

from cpython.pycapsule cimport PyCapsule_GetPointer
from gexmk.lib.gx cimport *
from gexmk.kinds.kind cimport gx_kind_ops, gx_mk_atomic_fn, gx_host_fn
from gexmk.lib.linux cimport iovec, process_vm_readv, process_vm_writev, sched_yield
from gexmk.memory cimport Segment

from gexmk.errors import PeerDeadError, SegmentError, UnsupportedError
from gexmk.transports import Reach

# Scores (the core takes the highest reach for each target): an endpoint of
# this process first, then a shared mapping, then process_vm.
cdef int _HIDDEN = 1 << 30        # endpoint indices from here on are the library's (sync area)
cdef int SELF_SCORE = 100
cdef int NBRHD_SCORE = 90
cdef int PVM_SCORE = 50


cdef struct lp_peer:
    char* local_base           # nbrhd: the mapping of the target's first byte; pvm: NULL


cdef extern from "copypool.h" nogil:
    ctypedef struct gx_cpool:
        int nthreads
    gx_cpool* gx_cpool_create(int nthreads)
    void gx_cpool_destroy(gx_cpool* p)
    void gx_cpool_copy(gx_cpool* p, void* dst, const void* src, size_t n)


# A memory kind as the data plane uses it: its table, context and atomics.
cdef struct lp_kind:
    const gx_kind_ops* ops     # NULL: host memory
    void* kctx
    gx_mk_atomic_fn atomic     # device atomics (NULL where the kind has none)


# Copies whose host side is pageable go through pinned bounce buffers of the
# endpoint, chunk by chunk: the CPU copy of one chunk (split over the copy
# pool's threads) overlaps the DMA of the one before.  Settings from
# gexmk.config (GEXMK_PAGEABLE_*), set when the transport opens.
cdef enum:
    LP_BOUNCE_MAX = 16         # buffers per endpoint, at most

cdef size_t _pg_chunk = 4 << 20    # bytes per bounce buffer (H100 sweep: 4 MiB x 4 buffers, 7 threads)
cdef int _pg_nbuf = 4              # bounce buffers per endpoint (0: never pipeline)
cdef size_t _pg_min = 1 << 20      # smaller copies go to the driver as they are
cdef int _pg_threads = 3           # helper threads of the copy pool
cdef gx_cpool* _pool = NULL        # made with the first bound device segment
cdef long _pg_count = 0            # copies pipelined so far (pipeline_settings(), tests)
cdef bint _small_write = False     # GEXMK_CUDA_SMALL_PUT has write_value: 4/8 B host->device
                                   # puts by the kind's write_value instead of a copy
cdef bint _small_kernel = False    # ... has kernel: <= 8 B device<->device copies by the kind's
                                   # copy_small kernel


cdef struct lp_bounce:         # an endpoint's pinned bounce buffers
    char* buf                  # nbuf * chunk bytes, pinned with ops/kctx
    size_t chunk
    int nbuf
    const gx_kind_ops* ops     # the kind that pinned them (unpinned at close)
    void* kctx
    void* ev[LP_BOUNCE_MAX]    # the event after the last DMA through each buffer, or NULL
    int busy                   # one copy at a time uses them (others take the plain path)
    void* pend                 # a stream-ordered staged transfer's last event: the buffers are
                               # the GPUs' until it completes (NULL: none pending)


cdef enum:
    LP_STREAMS = 8             # device kinds one endpoint issues asynchronous copies through


cdef struct lp_stream:         # an endpoint's own stream in one kind's context
    const gx_kind_ops* ops
    void* kctx
    void* stream
    int tag                    # 0: the endpoint's copies; 1: the host-staged path's second stream


cdef struct lp_ep:             # an endpoint's context: the kind of its bound segment, its streams
    lp_kind k
    lp_stream s[LP_STREAMS]
    int ns
    long nbi_dev               # implicit device copies issued on those streams since the last sync
    lp_bounce* bb              # pinned bounce buffers for pageable host memory (made on first use)
    char* tiny                 # one pinned page for small host->device puts (made on first use)
    const gx_kind_ops* tiny_ops    # ... pinned with this kind
    void* tiny_kctx
    int tiny_busy              # one thread at a time uses it (others copy from their own memory)
    int tiny_failed            # pinning failed once: do not try again


cdef struct lp_op:             # an NB device copy in flight: the event recorded after it
    const gx_kind_ops* ops
    void* kctx
    void* event


cdef struct lp_dev:            # a device segment reached here: its kind and mapping
    lp_kind k
    char* local_base           # nbrhd: the import of a peer's segment; self: NULL (same addresses)


# ---- data plane ---------------------------------------------------------------

cdef inline char* _mapped(gx_xfer* x) noexcept nogil:
    """Local address of x.remote: this process's own address (self), or the
    shared mapping's (nbrhd)."""
    cdef lp_peer* p = <lp_peer*>x.peer
    if p == NULL:
        return <char*>x.remote
    return p.local_base + (x.remote - x.t.remote_base)


cdef int _mapped_put(gx_xfer* x) except -1 nogil:
    cdef lp_ep* ep = <lp_ep*>x.ep
    if x.stream != NULL:
        return _mapped_on_stream(x, True)
    if x.local_kind != GX_MK_HOST:
        # from the endpoint's device segment: the copy engine of its kind
        if not _pipelined(ep, &ep.k, <uintptr_t>_mapped(x), <uintptr_t>x.local, x.n, False):
            ep.k.ops.copy(ep.k.kctx, NULL, <uintptr_t>_mapped(x), <uintptr_t>x.local, x.n)
    else:
        memcpy(_mapped(x), x.local, x.n)
    gx_mem_fence()
    _done(x)
    return 0


cdef int _mapped_get(gx_xfer* x) except -1 nogil:
    cdef lp_ep* ep = <lp_ep*>x.ep
    if x.stream != NULL:
        return _mapped_on_stream(x, False)
    gx_mem_fence()
    if x.local_kind != GX_MK_HOST:
        if not _pipelined(ep, &ep.k, <uintptr_t>x.local, <uintptr_t>_mapped(x), x.n, True):
            ep.k.ops.copy(ep.k.kctx, NULL, <uintptr_t>x.local, <uintptr_t>_mapped(x), x.n)
    else:
        memcpy(x.local, _mapped(x), x.n)
    _done(x)
    return 0


cdef int _mapped_on_stream(gx_xfer* x, bint put) except -1 nogil:
    """A host target, stream-ordered: the copy engine of the endpoint's device
    kind enqueues it (host memory mapped here is addressable by the device)."""
    cdef lp_ep* ep = <lp_ep*>x.ep
    if ep.k.ops == NULL:
        with gil:
            raise UnsupportedError("stream-ordered RMA to a host segment needs the initiating "
                                   "endpoint to have a device segment bound (its kind's copy "
                                   "engine does the copy)")
    if put:
        ep.k.ops.copy(ep.k.kctx, x.stream, <uintptr_t>_mapped(x), <uintptr_t>x.local, x.n)
    else:
        ep.k.ops.copy(ep.k.kctx, x.stream, <uintptr_t>x.local, <uintptr_t>_mapped(x), x.n)
    return 0


# ---- device segments of this process (loopback through the copy engine) ----------

cdef inline uintptr_t _dev_addr(gx_xfer* x) noexcept nogil:
    """Where x.remote is in this process: the same address (self) or the
    import of the peer's segment (nbrhd)."""
    cdef lp_dev* d = <lp_dev*>x.peer
    if d.local_base == NULL:
        return x.remote
    return <uintptr_t>d.local_base + (x.remote - x.t.remote_base)


cdef int _dev_copy(gx_xfer* x, uintptr_t dst, uintptr_t src, bint put) except -1 nogil:
    """A copy to or from a device segment.  On the caller's stream when given;
    NB and implicit (LC_GROUP / get) ones on the endpoint's own stream for that
    kind, completed by an event (NB) or the endpoint's sync (NBI); the rest,
    and LC_NOW puts whose source must be reusable on return, synchronously.
    A large copy whose host side is pageable is pipelined through the
    endpoint's pinned bounce buffers and complete on return, whatever the mode."""
    cdef lp_dev* d = <lp_dev*>x.peer
    cdef lp_ep* ep = <lp_ep*>x.ep
    cdef void* s = NULL
    cdef void* ev = NULL
    cdef lp_op* op
    if x.stream != NULL:
        return d.k.ops.copy(d.k.kctx, x.stream, dst, src, x.n)
    if x.local_kind == GX_MK_HOST and ep != NULL and x.n >= _pg_min:
        if _pipelined(ep, &d.k, dst, src, x.n, not put):
            _done(x)
            return 0
    if (x.mode == GX_NB or x.mode == GX_NBI) and ep != NULL:
        s = _ep_stream(ep, &d.k)
    if s == NULL:
        _issue_copy(x, &d.k, NULL, dst, src, put)       # complete on return
        _done(x)
        return 0
    if x.mode == GX_NB:
        _issue_copy(x, &d.k, s, dst, src, put)
        d.k.ops.event_record(d.k.kctx, s, &ev)
        op = <lp_op*>calloc(1, sizeof(lp_op))
        if op == NULL:
            d.k.ops.event_sync(d.k.kctx, ev)          # complete it here instead
            d.k.ops.event_destroy(d.k.kctx, ev)
            _done(x)
            return 0
        op.ops = d.k.ops
        op.kctx = d.k.kctx
        op.event = ev
        x.handle[0] = op
        return 0
    gx_add_long(&ep.nbi_dev, 1)
    return _issue_copy(x, &d.k, s, dst, src, put)


cdef inline int _issue_copy(gx_xfer* x, lp_kind* k, void* s, uintptr_t dst, uintptr_t src,
                            bint put) except -1 nogil:
    """The kind's copy; where GEXMK_CUDA_SMALL_PUT says so, a put of 4 or 8
    host bytes to an aligned device address by the kind's write_value (the
    value is read here, at issue: the source is reusable at once), and a
    device<->device copy of at most 8 bytes on one GPU by the kind's copy_small kernel."""
    cdef uint64_t v = 0
    if x.n <= 8:
        if x.local_kind == GX_MK_HOST:
            if _small_write and put and (x.n == 8 or x.n == 4) and (dst & (x.n - 1)) == 0 \
                    and k.ops.write_value != NULL:
                memcpy(&v, <void*>src, x.n)
                return k.ops.write_value(k.kctx, s, dst, v, <int>x.n)
        elif _small_kernel and k.ops.copy_small != NULL and x.t.device == x.local_device:
            # one GPU only: across NVLink the copy engine is faster (H200 pair:
            # 7.8 us against 9.8 us for the kernel)
            return k.ops.copy_small(k.kctx, s, dst, src, x.n)
    if s == NULL and put and x.local_kind == GX_MK_HOST and x.n <= LP_TINY and x.ep != NULL:
        if _tiny_put(<lp_ep*>x.ep, k, dst, src, x.n):
            return 0
    return k.ops.copy(k.kctx, s, dst, src, x.n)


cdef enum:
    LP_TINY = 256              # puts from host memory up to this size go through ep.tiny


cdef int _tiny_put(lp_ep* ep, lp_kind* k, uintptr_t dst, uintptr_t src, size_t n) except -1 nogil:
    """A small synchronous host->device put from the endpoint's pinned page:
    the copy engine reads pinned memory directly, where from pageable memory
    (a put_val's stack, a small numpy array) the driver stages it first.  0
    when the page is busy (another thread) or cannot be had."""
    if ep.tiny == NULL and (ep.tiny_failed or _tiny_make(ep, k) == 0):
        return 0
    if gx_xchg_int(&ep.tiny_busy, 1) != 0:
        return 0
    try:
        memcpy(ep.tiny, <void*>src, n)
        k.ops.copy(k.kctx, NULL, dst, <uintptr_t>ep.tiny, n)
    finally:
        gx_xchg_int(&ep.tiny_busy, 0)
    return 1


cdef int _tiny_make(lp_ep* ep, lp_kind* k) except -1 nogil:
    """Allocate and pin ep.tiny with k (portable: every context reaches it); 0 on failure."""
    cdef void* mem = NULL
    with gil:
        if ep.tiny != NULL:
            return 1
        if posix_memalign(&mem, 4096, 4096) != 0:
            ep.tiny_failed = 1
            return 0
        try:
            k.ops.host_register(k.kctx, mem, 4096, 1)
        except Exception:       # noqa: BLE001 - no pinned page: plain (driver-staged) copies
            free(mem)
            ep.tiny_failed = 1
            return 0
        ep.tiny_ops = k.ops
        ep.tiny_kctx = k.kctx
        gx_mem_fence()
        ep.tiny = <char*>mem
    return 1


cdef int _tiny_free(lp_ep* ep) except -1:
    cdef char* mem = ep.tiny
    if mem == NULL:
        return 0
    ep.tiny = NULL
    try:
        ep.tiny_ops.host_register(ep.tiny_kctx, mem, 4096, 0)
    except Exception:           # noqa: BLE001 - the kind may be closed: its context took it
        pass
    free(mem)
    return 0


include "local.src/pageable.pxi"


cdef void* _ep_stream(lp_ep* ep, lp_kind* k, int tag=0) except? NULL nogil:
    """The endpoint's stream ``tag`` in ``k``'s context, made on first use
    (NULL when the endpoint already has LP_STREAMS of them: the caller copies
    synchronously)."""
    cdef int i
    cdef void* s = NULL
    for i in range(gx_load_int(&ep.ns)):
        if ep.s[i].kctx == k.kctx and ep.s[i].tag == tag:
            return ep.s[i].stream
    with gil:               # one thread at a time adds a stream
        for i in range(ep.ns):
            if ep.s[i].kctx == k.kctx and ep.s[i].tag == tag:
                return ep.s[i].stream
        if ep.ns == LP_STREAMS:
            return NULL
        k.ops.stream_create(k.kctx, &s)
        ep.s[ep.ns].ops = k.ops
        ep.s[ep.ns].kctx = k.kctx
        ep.s[ep.ns].tag = tag
        ep.s[ep.ns].stream = s
        gx_mem_fence()
        ep.ns += 1
    return s


cdef int _ep_streams_done(lp_ep* ep, bint block) except -1 nogil:
    """Whether every copy issued on the endpoint's streams has completed
    (block: wait for them).  An event recorded on each stream answers."""
    cdef int i, done = 1
    cdef void* ev
    for i in range(gx_load_int(&ep.ns)):
        ev = NULL
        ep.s[i].ops.event_record(ep.s[i].kctx, ep.s[i].stream, &ev)
        try:
            if block:
                ep.s[i].ops.event_sync(ep.s[i].kctx, ev)
            elif not ep.s[i].ops.event_query(ep.s[i].kctx, ev):
                done = 0
        finally:
            ep.s[i].ops.event_destroy(ep.s[i].kctx, ev)
    return done


cdef int _dev_put(gx_xfer* x) except -1 nogil:
    return _dev_copy(x, _dev_addr(x), <uintptr_t>x.local, True)


cdef int _dev_get(gx_xfer* x) except -1 nogil:
    return _dev_copy(x, <uintptr_t>x.local, _dev_addr(x), False)


cdef int _dev_test(void* opv, gx_val* result) except -1 nogil:
    cdef lp_op* op = <lp_op*>opv
    if not op.ops.event_query(op.kctx, op.event):
        return 0
    op.ops.event_destroy(op.kctx, op.event)
    free(op)
    return 1


cdef int _dev_wait(void* opv, gx_val* result) except -1 nogil:
    cdef lp_op* op = <lp_op*>opv
    try:
        op.ops.event_sync(op.kctx, op.event)
    finally:
        op.ops.event_destroy(op.kctx, op.event)
        free(op)
    return 0


cdef void _dev_orphan(void* opv) noexcept nogil:
    # cuEventDestroy of a pending event: its resources go when the copy completes
    cdef lp_op* op = <lp_op*>opv
    with gil:
        try:
            op.ops.event_destroy(op.kctx, op.event)
        except Exception:   # noqa: BLE001 - nothing to report to: the op was abandoned
            pass
    free(op)


cdef int _dev_atomic(gx_xfer* x) except -1 nogil:
    cdef lp_dev* d = <lp_dev*>x.peer
    if x.remote & (gx_dt_size(x.dt) - 1):
        with gil:
            from gexmk.errors import BoundsError
            raise BoundsError(f"atomic: address 0x{x.remote:x} is not aligned to {gx_dt_size(x.dt)} bytes")
    d.k.atomic(d.k.kctx, NULL, _dev_addr(x), x.dt, x.op, x.a, x.b, x.result)
    _done(x)
    return 0


cdef int _mapped_atomic(gx_xfer* x) except -1 nogil:
    cdef char* p = _mapped(x)
    if (<uintptr_t>p) & (gx_dt_size(x.dt) - 1):
        with gil:
            from gexmk.errors import BoundsError
            raise BoundsError(f"atomic: address 0x{x.remote:x} is not aligned to {gx_dt_size(x.dt)} bytes")
    if gx_atomic_local(p, x.dt, x.op, x.a, x.b, x.result) != GX_OK:
        with gil:
            from gexmk.errors import ArgumentError
            raise ArgumentError("atomic: invalid atomic operation or data type")
    if x.op != GX_OP_GET:
        gx_wake_waiters(x.t.wake)
    _done(x)
    return 0


cdef inline void _done(gx_xfer* x) noexcept nogil:
    if x.handle != NULL:
        x.handle[0] = NULL      # complete at issue: no op to wait for


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


cdef int _pvm(gx_xfer* x, bint write) except -1 nogil:
    """Cross-process copy into/out of a peer's segment, by address."""
    cdef iovec liov, riov
    if x.stream != NULL or x.local_kind != GX_MK_HOST:
        with gil:
            raise UnsupportedError("pvm: process_vm copies host memory on the calling thread; it "
                                   "cannot read device buffers or order on a stream")
    cdef ssize_t got
    cdef size_t n = x.n
    cdef char* local = <char*>x.local
    cdef uintptr_t remote = x.remote
    while n > 0:
        liov.iov_base = local
        liov.iov_len = n
        riov.iov_base = <void*>remote
        riov.iov_len = n
        if write:
            got = process_vm_writev(x.t.pid, &liov, 1, &riov, 1, 0)
        else:
            got = process_vm_readv(x.t.pid, &liov, 1, &riov, 1, 0)
        if got <= 0:
            if write:
                return _pvm_error(x.t, errno if got < 0 else EFAULT, "put")
            return _pvm_error(x.t, errno if got < 0 else EFAULT, "get")
        n -= <size_t>got
        local += got
        remote += <uintptr_t>got
    _done(x)
    return 0


cdef int _pvm_put(gx_xfer* x) except -1 nogil:
    return _pvm(x, True)


cdef int _pvm_get(gx_xfer* x) except -1 nogil:
    return _pvm(x, False)


cdef int _pvm_atomic(gx_xfer* x) except -1 nogil:
    with gil:
        raise UnsupportedError(
            "atomic: the target segment is not mapped in this process (a client-allocated "
            "segment of another process, or GEXMK_TRANSPORT=pvm), and process_vm cannot do "
            "atomics; use a library-allocated segment")


# ---- put_signal: the data, complete, then the signal word ------------------------

cdef int _sig_misaligned(gx_xfer* x) except -1 with gil:
    from gexmk.errors import BoundsError
    raise BoundsError(f"put_signal: signal address 0x{x.sig_addr:x} is not aligned to 8 bytes")


cdef int _mapped_put_signal(gx_xfer* x) except -1 nogil:
    """The data by memcpy (or the endpoint's copy engine from its device
    segment, synchronously), then the signal by a CPU atomic on the mapping:
    release ordering puts it after the data for any reader that acquires it;
    then the target's sleeping waiters are woken (gx_wake)."""
    cdef lp_peer* p = <lp_peer*>x.peer
    cdef char* s
    cdef int mode = x.mode
    cdef void** handle = x.handle
    if x.sig_addr & 7:
        return _sig_misaligned(x)
    x.mode = GX_BLOCKING
    x.handle = NULL
    _mapped_put(x)
    x.mode = mode
    x.handle = handle
    s = <char*>x.sig_addr if p == NULL else p.local_base + (x.sig_addr - x.t.remote_base)
    gx_signal_local(s, x.a.u64, x.op)
    gx_wake_waiters(x.t.wake)
    _done(x)
    return 0


cdef int _dev_put_signal(gx_xfer* x) except -1 nogil:
    """A device segment target: the copy synchronously (complete on return),
    then the signal through the kind's device atomic, so that the signal is
    written after the copy has completed."""
    cdef lp_dev* d = <lp_dev*>x.peer
    cdef gx_val old
    cdef gx_val zero
    cdef int mode = x.mode
    cdef void** handle = x.handle
    cdef uintptr_t remote = x.remote
    if d.k.atomic == NULL:
        with gil:
            raise UnsupportedError("put_signal: the device segment's memory kind has no atomics "
                                   "here, so the signal word cannot be updated after the data")
    if x.sig_addr & 7:
        return _sig_misaligned(x)
    zero.u64 = 0
    if x.stream != NULL:
        # stream order: the copy, then the kind's atomic kernel on the same stream
        # (a kernel starts after the copy before it has completed; its system-scope
        # store follows the data for any observer)
        d.k.ops.copy(d.k.kctx, x.stream, _dev_addr(x), <uintptr_t>x.local, x.n)
        x.remote = x.sig_addr
        try:
            d.k.atomic(d.k.kctx, x.stream, _dev_addr(x), GX_DT_U64,
                       GX_OP_SET if x.op == GX_SIGNAL_SET else GX_OP_ADD, x.a, zero, NULL)
        finally:
            x.remote = remote
        _done(x)
        return 0
    x.mode = GX_BLOCKING
    x.handle = NULL
    _dev_copy(x, _dev_addr(x), <uintptr_t>x.local, True)
    x.mode = mode
    x.handle = handle
    x.remote = x.sig_addr
    try:
        d.k.atomic(d.k.kctx, NULL, _dev_addr(x), GX_DT_U64,
                   GX_OP_SET if x.op == GX_SIGNAL_SET else GX_OP_ADD, x.a, zero, &old)
    finally:
        x.remote = remote
    _done(x)
    return 0


cdef int _pvm_put_signal(gx_xfer* x) except -1 nogil:
    """process_vm: the data, then (the first call has returned, so the data is
    in the target's memory) the signal word as one 8-byte process_vm write.
    SIGNAL_ADD would need a read-modify-write process_vm cannot do."""
    cdef uint64_t v = x.a.u64
    cdef void* local = x.local
    cdef size_t n = x.n
    cdef uintptr_t remote = x.remote
    if x.op != GX_SIGNAL_SET:
        with gil:
            raise UnsupportedError(
                "put_signal: SIGNAL_ADD to a segment reached by process_vm (pvm: a client-"
                "allocated segment of another process, or GEXMK_TRANSPORT=pvm) is not possible: "
                "process_vm has no atomics; use SIGNAL_SET or a library-allocated segment")
    if x.sig_addr & 7:
        return _sig_misaligned(x)
    _pvm(x, True)
    x.local = &v
    x.n = 8
    x.remote = x.sig_addr
    try:
        _pvm(x, True)
    finally:
        x.local = local
        x.n = n
        x.remote = remote
    return 0


cdef int _no_op(void* op, gx_val* result) except -1 nogil:
    with gil:
        raise UnsupportedError("local transport: its operations complete at issue; "
                               "there is no op to test or wait for")


cdef void _no_orphan(void* op) noexcept nogil:
    pass


cdef int _sync(void* epv, int categories) except -1 nogil:
    cdef lp_ep* ep = <lp_ep*>epv
    if ep != NULL and gx_load_long(&ep.nbi_dev) > 0 and categories & ((1 << GX_CAT_PUT) | (1 << GX_CAT_GET)):
        _ep_streams_done(ep, True)
        ep.nbi_dev = 0
    gx_mem_fence()
    return 0


cdef int _nbi_test(void* epv, int categories) except -1 nogil:
    cdef lp_ep* ep = <lp_ep*>epv
    if ep == NULL or gx_load_long(&ep.nbi_dev) == 0:
        return 1
    return _ep_streams_done(ep, False)


include "local.src/hoststage.pxi"
include "local.src/landed.pxi"
include "local.src/landed_initiator.pxi"

cdef gx_tr_ops _SELF, _NBRHD, _PVM, _SELF_DEV, _NBRHD_DEV, _SELF_STAGED, _NBRHD_STAGED, _NBRHD_LANDED


cdef void _fill(gx_tr_ops* t, const char* name, gx_tr_xfer_fn put, gx_tr_xfer_fn get,
                gx_tr_xfer_fn atomic, gx_tr_xfer_fn put_signal) noexcept:
    t.name = name
    t.put = put
    t.get = get
    t.atomic = atomic
    t.test = _no_op
    t.wait = _no_op
    t.orphan = _no_orphan
    t.sync = _sync
    t.nbi_test = _nbi_test
    t.put_signal = put_signal


_fill(&_SELF, b"self", _mapped_put, _mapped_get, _mapped_atomic, _mapped_put_signal)
_fill(&_NBRHD, b"nbrhd", _mapped_put, _mapped_get, _mapped_atomic, _mapped_put_signal)
_fill(&_PVM, b"pvm", _pvm_put, _pvm_get, _pvm_atomic, _pvm_put_signal)
_fill(&_SELF_DEV, b"self", _dev_put, _dev_get, _dev_atomic, _dev_put_signal)
_fill(&_NBRHD_DEV, b"nbrhd", _dev_put, _dev_get, _dev_atomic, _dev_put_signal)
_SELF_DEV.test = _NBRHD_DEV.test = _dev_test       # NB device copies: events
_SELF_DEV.wait = _NBRHD_DEV.wait = _dev_wait
_SELF_DEV.orphan = _NBRHD_DEV.orphan = _dev_orphan
_fill(&_SELF_STAGED, b"self-staged", _staged_put, _staged_get, _dev_atomic, _staged_put_signal)
_fill(&_NBRHD_STAGED, b"nbrhd-staged", _staged_put, _staged_get, _dev_atomic, _staged_put_signal)
_fill(&_NBRHD_LANDED, b"nbrhd-landed", _landed_put, _landed_get, _landed_atomic, _landed_put_signal)


cdef int _set_kind(lp_kind* k, object mk) except -1:
    """The data-plane view of a memory kind object (gexmk.MemoryKind)."""
    k.ops = NULL
    k.kctx = NULL
    k.atomic = NULL
    impl = mk.impl
    if impl is None:
        return 0
    k.ops = <const gx_kind_ops*>PyCapsule_GetPointer(impl.ops_capsule(), b"gexmk.kind_ops")
    k.kctx = <void*><uintptr_t>impl.handle
    k.atomic = k.ops.atomic         # NULL where the kind has no device atomics
    return 0


# ---- control plane ---------------------------------------------------------------

cdef class _EndpointContext:
    """Per endpoint: the kind of its bound segment (a device buffer of the
    endpoint goes through that kind's copy engine).  Every op completes at issue."""
    cdef lp_ep c
    cdef LocalTransport tr
    cdef readonly bint closed
    cdef object seg
    cdef object offered            # the fd server's key of the bound device segment's export
    cdef int index                 # the endpoint's index (the sync area's is hidden)
    cdef _LandingZone zone         # nbrhd-landed: the bound segment's landing zone, or None

    @property
    def handle(self):
        return <uintptr_t>&self.c

    @property
    def ops(self):
        return <uintptr_t>&_SELF

    def bind(self, Segment seg not None):
        """A library-allocated host segment publishes its memfd (fd number and
        name) for peers of this node to map; other segments publish nothing
        (yet: device segments of peers are reached over a network transport).
        Host segments are pinned with the driver of a device kind of this
        process, so copies between them and device memory run at DMA speed."""
        _set_kind(&self.c.k, seg.kind)
        self.seg = seg
        if seg.kind.cls != GX_MK_HOST:
            self.tr._device_bound(seg)
            blob = self.tr._offer_device(self, seg)
            if blob is None and seg.allocation is not None and not seg.allocation.exportable:
                blob = self.tr._offer_zone(self, seg)
            return blob
        self.tr._host_bound(seg)
        if self.tr.stage_all and self.index < _HIDDEN:
            return self.tr._offer_zone(self, seg)
        if seg.fd >= 0:
            return pickle.dumps(("host", seg.fd, seg.token))
        return None

    def unbind(self):
        if self.offered is not None:
            fdpass.process_server().withdraw(self.offered)
            self.offered = None
        if self.zone is not None:
            self.zone.close()
            self.zone = None
        if self.seg is not None and (<Segment>self.seg).kind.cls != GX_MK_HOST:
            self.tr._device_unbound(self.seg)
        elif self.seg is not None:
            self.tr._host_unbound(self.seg)
        self.seg = None
        self.c.k.ops = NULL

    def close(self):
        """Complete the endpoint's device copies, destroy its streams (idempotent)."""
        cdef int i
        if self.closed:
            return
        self.unbind()
        self.closed = True
        try:
            with nogil:
                _ep_streams_done(&self.c, True)
        finally:
            _bounce_free(&self.c)
            _tiny_free(&self.c)
            for i in range(self.c.ns):
                try:
                    self.c.s[i].ops.stream_destroy(self.c.s[i].kctx, self.c.s[i].stream)
                except Exception:   # noqa: BLE001 - its kind may be closed: the context took it
                    pass
            self.c.ns = 0


cdef class _DeviceContext:
    """A device segment reached from this process, as a target: its kind, and
    for a peer's segment the import (mapped for this kind's device only)."""
    cdef lp_dev c
    cdef object kind
    cdef int refs
    cdef object imported           # nbrhd: the kind's Allocation of the import
    cdef object seg                # self: the bound segment
    cdef object key                # nbrhd: (fd server address, key) it came from
    cdef bint staged               # nbrhd: mapped for the segment's own GPU, not this
                                   # process's (peer access off): device<->device copies stage

    def unmap(self):
        self.c.local_base = NULL
        if self.imported is not None:
            self.imported.unmap()
            self.imported = None

    @property
    def handle(self):
        return <uintptr_t>&self.c


cdef class _PeerContext:
    """What this process holds of one peer segment: its mapping (nbrhd) or
    nothing (pvm: the owner's address and pid are in the target)."""
    cdef lp_peer c
    cdef object map_key            # (jobrank, token) of the mapping, or None

    @property
    def handle(self):
        return <uintptr_t>&self.c


cdef class LocalTransport:
    """The control plane of the local paths (one per client)."""
    cdef readonly str name
    cdef object job
    cdef str force                 # GEXMK_TRANSPORT
    cdef bint no_peer_access       # GEXMK_CUDA_PEER_ACCESS=off: device<->device between
                                   # segments of different endpoints is host-staged
    cdef dict _peers               # (jobrank, ep_index) -> _PeerContext
    cdef dict _maps                # (jobrank, token) -> [addr, maplen, refs, wake address or 0]
    cdef dict _devsegs             # address of a bound device segment of this process -> _DeviceContext
    cdef list _retired             # contexts of unbound device segments, kept until close
    cdef dict _hosts               # address of a bound host segment -> [segment, pinning _DeviceContext]
    cdef dict _kinds               # (class, device) -> a kind made here to import peers' segments
    cdef long _gen                 # numbers the device exports offered
    cdef list _zones               # every landing zone this process opened (nbrhd-landed)
    cdef readonly bint stage_all   # GEXMK_NBRHD_STAGE=all: host segments land too (tests)
    cdef int stage_slots           # GEXMK_NBRHD_STAGE_SLOTS / _CHUNK: landing zones' shape
    cdef size_t stage_chunk
    cdef readonly bint closed

    def __init__(self, job):
        self.name = "local"
        self.job = job
        self.force = job.config.transport
        self.no_peer_access = getattr(job.config, "cuda_peer_access", "auto") == "off"
        self._peers = {}
        self._maps = {}
        self._devsegs = {}
        self._retired = []
        self._hosts = {}
        self._kinds = {}
        self._gen = 0
        self._zones = []
        self.stage_all = getattr(job.config, "nbrhd_stage", "auto") == "all"
        self.stage_slots = getattr(job.config, "nbrhd_stage_slots", 4)
        self.stage_chunk = getattr(job.config, "nbrhd_stage_chunk", 4 << 20)
        _configure(job.config)

    def open_endpoint(self, int index):
        cdef _EndpointContext ctx = _EndpointContext()
        ctx.tr = self
        ctx.index = index
        return ctx

    def _device_bound(self, Segment seg):
        cdef _DeviceContext d = self._devsegs.get(seg.address)
        cdef _DeviceContext o
        _pool_start()
        if d is None:
            d = _DeviceContext()
            _set_kind(&d.c.k, seg.kind)
            d.kind = seg.kind
            d.seg = seg
            # Device segments of this process on other devices: each side's
            # copy engine must reach the other (VMM access is per device).
            for o in self._devsegs.values():
                if o.kind.device != seg.kind.device and o.seg is not None \
                        and not self.no_peer_access:
                    for a, dev in ((seg.allocation, o.kind.device), (o.seg.allocation, seg.kind.device)):
                        try:
                            a.grant(dev)
                        except Exception:   # noqa: BLE001 - not VMM: the copy reports it
                            pass
            self._devsegs[seg.address] = d
        d.refs += 1
        for entry in self._hosts.values():
            if entry[1] is None:
                self._pin(entry, d)

    def _host_bound(self, Segment seg):
        entry = self._hosts[<uintptr_t>seg.addr] = [seg, None]
        for d in self._devsegs.values():
            self._pin(entry, d)
            break

    def _pin(self, list entry, _DeviceContext d):
        cdef Segment seg = entry[0]
        try:
            d.c.k.ops.host_register(d.c.k.kctx, seg.addr, seg.size, 1)
        except Exception:       # noqa: BLE001 - pinning is an optimisation: copies work unpinned
            return
        entry[1] = d

    def _host_unbound(self, Segment seg):
        cdef _DeviceContext d
        entry = self._hosts.pop(<uintptr_t>seg.addr, None)
        if entry is not None and entry[1] is not None:
            d = entry[1]
            try:
                d.c.k.ops.host_register(d.c.k.kctx, seg.addr, seg.size, 0)
            except Exception:   # noqa: BLE001 - the kind may be closed already
                pass

    def _device_unbound(self, Segment seg):
        cdef _DeviceContext d = self._devsegs.get(<uintptr_t>seg.addr)
        if d is not None:
            d.refs -= 1
            if d.refs == 0:
                # routes may still point at it until they are chosen again: keep it
                self._retired.append(self._devsegs.pop(<uintptr_t>seg.addr))

    def apply(self, peer, blob):
        """A peer of this node published (or withdrew) a host segment: map its
        memfd (nbrhd) where allowed and possible, else reach it by address (pvm)."""
        key = (peer.jobrank, peer.ep_index)
        desc = pickle.loads(blob) if blob is not None else None
        if (desc is not None and desc[0] == "zone") or isinstance(self._peers.get(key), _LandContext):
            return self._apply_zone(key, peer, desc)
        if peer.kind != GX_MK_HOST or isinstance(self._peers.get(key), _DeviceContext):
            return self._apply_device(key, peer, desc)
        cdef _PeerContext pc = self._peers.pop(key, None)
        wanted = (peer.size != 0 and not peer.same_process and peer.same_node
                  and self.force != "ofi" and peer.kind == GX_MK_HOST)
        fd, token = desc[1:] if (wanted and desc is not None
                                 and self.force != "pvm") else (-1, None)
        map_key = (peer.jobrank, token) if token is not None else None
        if pc is not None and (not wanted or pc.map_key != map_key):
            self._unmap(pc)
            pc = None
        if not wanted:
            return None
        if pc is None:
            pc = _PeerContext()
            if map_key is not None:
                try:
                    self._map(pc, map_key, peer.pid, fd, peer.size)
                except OSError:
                    pass        # not permitted here: process_vm reports its own error
        self._peers[key] = pc
        return pc

    def _offer_device(self, _EndpointContext ctx, Segment seg):
        """Export a bound device segment for peers of this node: its file
        descriptors go to the process's fd server (SCM_RIGHTS after a peer
        credential check), its blob and the server's address are published."""
        alloc = seg.allocation
        if alloc is None or not alloc.exportable or self.job.size == 1:
            return None
        fds, kblob = alloc.export()
        self._gen += 1
        name = f"segment-{self._gen}"
        server = fdpass.process_server()
        try:
            server.offer(name, fds, allowed_pids=set(self.job.pids))
        finally:
            for fd in fds:
                os.close(fd)
        ctx.offered = name
        return pickle.dumps(("device", server.address, name, kblob))

    def _offer_zone(self, _EndpointContext ctx, Segment seg):
        """A bound segment that peers of this node cannot map (device pool
        memory; host segments with GEXMK_NBRHD_STAGE=all): open its landing
        zone and lander, offer the zone's memfd through the fd server."""
        if self.job.size == 1 or self.force in ("ofi", "pvm"):
            return None
        z = _LandingZone()
        try:
            z.open(seg, self.job.size, self.stage_slots, self.stage_chunk)
            self._gen += 1
            name = f"zone-{self._gen}"
            server = fdpass.process_server()
            server.offer(name, [z.fd], allowed_pids=set(self.job.pids))
        except BaseException:
            z.close()
            raise
        ctx.zone = z
        ctx.offered = name
        self._zones.append(z)
        return pickle.dumps(("zone", server.address, name, z.layout))

    @property
    def landed(self):
        """Requests (chunks of puts and gets, atomics) this process's landers served."""
        return sum((<_LandingZone>z).z.landed for z in self._zones)

    def _apply_zone(self, key, peer, desc):
        """A peer of this node published (or withdrew) a segment reached
        through its landing zone: map the zone (this process's ring)."""
        cdef _LandContext lc = self._peers.pop(key, None) if isinstance(
            self._peers.get(key), _LandContext) else None
        wanted = (peer.size != 0 and not peer.same_process and peer.same_node
                  and self.force not in ("ofi", "pvm") and desc is not None and desc[0] == "zone")
        if lc is not None and (not wanted or lc.key != (desc[1], desc[2])):
            lc.unmap()
            self._retired.append(lc)
            lc = None
        if not wanted:
            return None
        if lc is None:
            _pool_start()                   # its threads fill and drain the slots
            fds = fdpass.fetch(desc[1], desc[2], self.job.config.timeout)
            lc = _LandContext()
            try:
                lc.map(fds[0], tuple(desc[3]), self.job.rank, self.job.config.timeout)
            finally:
                for fd in fds:
                    os.close(fd)
            lc.key = (desc[1], desc[2])
            for d in self._devsegs.values():        # copies from this process's GPU: DMA
                lc.pin_with((<_DeviceContext>d).kind)
                break
        self._peers[key] = lc
        return lc

    def _apply_device(self, key, peer, desc):
        """A peer of this node published (or withdrew) a device segment: fetch
        its file descriptors and import it with a kind of this process for
        that device (made on first use); None where this process cannot."""
        cdef _DeviceContext d = self._peers.pop(key, None)
        wanted = (peer.size != 0 and not peer.same_process and peer.same_node
                  and self.force not in ("ofi", "pvm") and desc is not None
                  and desc[0] == "device")
        if d is not None and (not wanted or d.key != (desc[1], desc[2])):
            d.unmap()
            self._retired.append(d)
            d = None
        if not wanted:
            return None
        if d is None:
            d = self._import_device(peer, desc, self.no_peer_access)
            if d is None:
                return None
        self._peers[key] = d
        return d

    def _import_device(self, peer, desc, bint staged):
        """Import a peer's device export: mapped for this process's own GPU
        (direct copies, over NVLink between GPUs), or, ``staged`` (peer access
        off by GEXMK_CUDA_PEER_ACCESS=off, or the direct import refused), for
        the segment's own GPU, which this process then drives: copies between
        it and this process's device memory go through pinned host memory."""
        mk = self._kind_for(peer.kind, peer.device, staged)
        if mk is None:
            return None
        fds = fdpass.fetch(desc[1], desc[2], self.job.config.timeout)
        d = _DeviceContext()
        d.kind = mk
        _set_kind(&d.c.k, mk)
        try:
            d.imported = mk.impl.import_(fds, desc[3], peer.size)
        except Exception:
            if staged or mk.device == peer.device:
                raise
            return self._import_device(peer, desc, True)   # no access from this GPU: stage
        d.c.local_base = <char*><uintptr_t>d.imported.addr
        d.key = (desc[1], desc[2])
        d.staged = staged
        return d

    def _kind_for(self, int cls, int device, bint exact=False):
        """The memory kind of this process that imports a peer's segment on
        ``device``: one of this process's bound device segments (the same
        device first; else its own device, so the mapping is given access for
        the device this process computes on and copies run from it, over
        NVLink between GPUs), else one made for ``device`` (None where this
        process has no such device)."""
        cdef _DeviceContext d
        other = None
        for d in self._devsegs.values():
            if d.kind.cls == cls and d.kind.device == device:
                return d.kind
            if d.kind.cls == cls and other is None and not exact:
                other = d.kind
        if other is not None:
            return other
        mk = self._kinds.get((cls, device))
        if mk is None:
            from gexmk import memory
            try:
                mk = memory.mk_create(cls, device)
            except Exception:       # noqa: BLE001 - no such device or driver here: unreachable
                return None
            self._kinds[(cls, device)] = mk
        return mk

    def reach(self, epctx, peer, ctx):
        cdef _PeerContext pc
        cdef _DeviceContext d
        if peer.same_process:
            if peer.kind == GX_MK_HOST:
                entry = self._hosts.get(peer.base)
                return Reach("self", SELF_SCORE, SELF_SCORE, <uintptr_t>&_SELF, 0, peer.base,
                             wake=entry[0]._wake_address if entry is not None else 0)
            d = self._devsegs.get(peer.base)
            if d is None or d.c.k.ops == NULL:
                return None
            if self.no_peer_access and (<_EndpointContext>epctx).c.k.ops != NULL \
                    and (<_EndpointContext>epctx).seg is not d.seg:
                return Reach("self-staged", SELF_SCORE, SELF_SCORE if d.c.k.atomic != NULL else 0,
                             <uintptr_t>&_SELF_STAGED, d.handle, 0, None, True)
            return Reach("self", SELF_SCORE, SELF_SCORE if d.c.k.atomic != NULL else 0,
                         <uintptr_t>&_SELF_DEV, d.handle, 0, (peer.base, peer.device))
        if ctx is None:
            return None
        if isinstance(ctx, _LandContext):
            return Reach("nbrhd-landed", NBRHD_SCORE,
                         NBRHD_SCORE if (<_LandContext>ctx).c.amo else 0,
                         <uintptr_t>&_NBRHD_LANDED, ctx.handle, 0, None, True)
        if isinstance(ctx, _DeviceContext):
            d = ctx
            if d.staged and (<_EndpointContext>epctx).c.k.ops != NULL:
                return Reach("nbrhd-staged", NBRHD_SCORE,
                             NBRHD_SCORE if d.c.k.atomic != NULL else 0,
                             <uintptr_t>&_NBRHD_STAGED, d.handle, 0, None, True)
            return Reach("nbrhd", NBRHD_SCORE, NBRHD_SCORE if d.c.k.atomic != NULL else 0,
                         <uintptr_t>&_NBRHD_DEV, d.handle, 0,
                         (<uintptr_t>d.c.local_base, d.kind.device))
        pc = ctx
        if pc.c.local_base != NULL:
            m = self._maps.get(pc.map_key)
            return Reach("nbrhd", NBRHD_SCORE, NBRHD_SCORE, <uintptr_t>&_NBRHD, pc.handle,
                         <uintptr_t>pc.c.local_base, wake=m[3] if m is not None else 0)
        return Reach("pvm", PVM_SCORE, 1, <uintptr_t>&_PVM, pc.handle, 0)

    def peer_died(self, int jobrank):
        pass

    def close(self):
        """Unmap every peer segment (teardown: no route uses them any more),
        stop the copy pool."""
        global _pool
        if self.closed:
            return
        self.closed = True
        if _pool != NULL:
            with nogil:
                gx_cpool_destroy(_pool)
            _pool = NULL
        for entry in list(self._hosts.values()):
            self._host_unbound(entry[0])
        for p in list(self._peers.values()) + self._retired:
            if isinstance(p, _DeviceContext):
                (<_DeviceContext>p).unmap()
            elif isinstance(p, _LandContext):
                (<_LandContext>p).unmap()
        for mk in self._kinds.values():
            mk.close()
        self._kinds.clear()
        for m in self._maps.values():
            munmap(<void*><uintptr_t>m[0], <size_t>m[1])
        self._maps.clear()
        self._peers.clear()

    def _map(self, _PeerContext pc, key, int pid, int fd, size_t size):
        m = self._maps.get(key)
        if m is None:
            addr, maplen, wake = _map_peer_fd(pid, fd, key[1], size)
            m = self._maps[key] = [addr, maplen, 0, wake]
        m[2] += 1
        pc.map_key = key
        pc.c.local_base = <char*><uintptr_t>m[0]

    def _unmap(self, _PeerContext pc):
        pc.c.local_base = NULL
        key, pc.map_key = pc.map_key, None
        if key is None:
            return
        m = self._maps[key]
        m[2] -= 1
        if m[2] == 0:
            del self._maps[key]
            munmap(<void*><uintptr_t>m[0], <size_t>m[1])


cdef void _pool_start() noexcept:
    """The copy pool, made on first need (a bound device segment's pageable
    copies, a landing zone's slots); stays NULL (plain memcpy, one thread)
    where configured off or not to be had."""
    global _pool
    if _pool == NULL and _pg_nbuf > 0 and _pg_threads > 0:
        _pool = gx_cpool_create(_pg_threads)


def open(job):
    """The local transport of a client (gexmk.transports.REGISTRY)."""
    return LocalTransport(job)


def _map_peer_fd(int pid, int fd, str token, size_t size):
    """Map a peer's memfd: open it through /proc/<pid>/fd (a read-level
    ptrace check); check it is the file the peer published.  Returns
    (address, bytes mapped, address of its wake word or 0): the page after
    the data, where the file has one."""
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
    cdef size_t maplen = ((size + page - 1) // page) * page if size else page
    cdef size_t data = maplen
    cdef void* p
    try:
        st_size = os.fstat(nfd).st_size
        if st_size < <Py_ssize_t>size:
            raise SegmentError(f"peer pid {pid}'s segment {token!r} is smaller than published")
        if st_size >= <Py_ssize_t>(maplen + page):
            maplen += page      # the wake page
        p = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_SHARED, nfd, 0)
        if p == MAP_FAILED:
            raise OSError(errno, f"mapping peer segment {token!r}: {os.strerror(errno)}")
    finally:
        close(nfd)
    return <uintptr_t>p, maplen, (<uintptr_t>p + data if maplen > data else 0)
