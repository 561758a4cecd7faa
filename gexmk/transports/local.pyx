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
from libc.stdlib cimport calloc, malloc, free, realloc
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
from gexmk.config import env_seconds

# GEXMK_RING_IDLE: seconds a ring of this process in a peer's landing zone
# may sit unused before it is given back (landed.pxi); ofi's
# GEXMK_OFI_RING_IDLE takes it as its default
RING_IDLE_DEFAULT = 3.0

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
    int device                 # the kind's device ordinal (-1: host memory)


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
    bint staged                # mapped for the segment's own GPU (no peer access), not ours


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
        if not _pipelined(ep, &ep.k, <uintptr_t>_mapped(x), <uintptr_t>x.local, x.n, True):
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
        if not _pipelined(ep, &ep.k, <uintptr_t>x.local, <uintptr_t>_mapped(x), x.n, False):
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


include "local.src/pageable.pxi"
include "local.src/device.pxi"

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


cdef int _pvm_device(gx_xfer* x, bint write) except -1 nogil:
    """A pvm put/get whose local side is device memory of the endpoint's kind:
    through a host buffer (process_vm_* moves host memory only)."""
    cdef lp_ep* ep = <lp_ep*>x.ep
    cdef void* dev = x.local
    cdef int kind = x.local_kind
    cdef void* tmp
    if ep == NULL or ep.k.ops == NULL:
        with gil:
            raise UnsupportedError("pvm: a device buffer needs the initiating endpoint's device "
                                   "kind to copy it through host memory")
    tmp = malloc(x.n if x.n else 1)
    if tmp == NULL:
        with gil:
            raise MemoryError(f"pvm: no host bounce buffer of {x.n} bytes for a device buffer")
    x.local_kind = GX_MK_HOST
    x.local = tmp
    try:
        if write:
            ep.k.ops.copy(ep.k.kctx, NULL, <uintptr_t>tmp, <uintptr_t>dev, x.n)
            _pvm(x, True)
        else:
            _pvm(x, False)
            ep.k.ops.copy(ep.k.kctx, NULL, <uintptr_t>dev, <uintptr_t>tmp, x.n)
    finally:
        x.local = dev              # x as it came: _pvm_vis reuses it for the next block
        x.local_kind = kind
        free(tmp)
    return 0


cdef int _pvm(gx_xfer* x, bint write) except -1 nogil:
    """Cross-process copy into/out of a peer's segment, by address."""
    cdef iovec liov, riov
    if x.stream != NULL:
        with gil:
            raise UnsupportedError("pvm: process_vm copies host memory on the calling thread; it "
                                   "cannot order on a stream")
    if x.local_kind != GX_MK_HOST:
        return _pvm_device(x, write)
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


cdef enum:
    PVM_IOV = 1024             # IOV_MAX: iovecs per side of one process_vm call


cdef int _pvm_vis(gx_xfer* x) except -1 nogil:
    """A chunk of VIS fragments: host blocks by _pvm_iov; device blocks of the
    endpoint's kind a window at a time through a host buffer (_pvm_vis_device)."""
    cdef bint write = x.op != 0
    if x.stream != NULL:
        return _pvm(x, write)          # raises, naming what pvm cannot do
    if x.local_kind != GX_MK_HOST:
        return _pvm_vis_device(x, write)
    _pvm_iov(x, x.vis.frags, x.vis.nfrags, write)
    _done(x)
    return 0


cdef int _pvm_vis_device(gx_xfer* x, bint write) except -1 nogil:
    """Device blocks: the small ones gathered into a host window by one batched
    copy of the endpoint's kind and moved as host blocks (_pvm_iov); one
    copy and one system call per block took seconds for a 1-byte-stride
    CuPy view, over GEXMK_TIMEOUT under load (the GPU matrix's devseg-strided
    cells to client memory).  Blocks of a window or more through _pvm's own
    bounce, one at a time."""
    cdef lp_ep* ep = <lp_ep*>x.ep
    cdef const gx_vis* v = x.vis
    cdef size_t i = 0, j, k, nbytes, pos
    cdef gx_frag* hf = NULL
    cdef uintptr_t* a = NULL
    cdef char* buf = NULL
    cdef gx_xfer one = x[0]
    one.vis = NULL
    one.handle = NULL
    if ep == NULL or ep.k.ops == NULL:
        with gil:
            raise UnsupportedError("pvm: a device buffer needs the initiating endpoint's device "
                                   "kind to copy it through host memory")
    buf = <char*>malloc(VIS_GATHER_WINDOW)
    hf = <gx_frag*>malloc((v.nfrags or 1) * sizeof(gx_frag))
    a = <uintptr_t*>malloc(3 * (v.nfrags or 1) * sizeof(uintptr_t))
    try:
        if buf == NULL or hf == NULL or a == NULL:
            with gil:
                raise MemoryError("pvm VIS: no memory for the gather window")
        while i < v.nfrags:
            j = _frag_window(v.frags, i, v.nfrags, VIS_GATHER_WINDOW, VIS_GATHER_WINDOW, &nbytes)
            if j == i:
                one.local = v.frags[i].local
                one.remote = v.frags[i].remote
                one.n = v.frags[i].n
                _pvm(&one, write)
                i += 1
                continue
            pos = 0
            for k in range(i, j):
                hf[k - i].local = buf + pos
                hf[k - i].remote = v.frags[k].remote
                hf[k - i].n = v.frags[k].n
                pos += v.frags[k].n
            if write:
                _frag_gather(ep, v.frags + i, j - i, buf, True, a)
            one.local_kind = GX_MK_HOST
            _pvm_iov(&one, hf, j - i, write)
            one.local_kind = x.local_kind
            if not write:
                _frag_gather(ep, v.frags + i, j - i, buf, False, a)
            i = j
    finally:
        free(buf)
        free(hf)
        free(a)
    _done(x)
    return 0


cdef int _pvm_iov(gx_xfer* x, const gx_frag* f, size_t nf, bint write) except -1 nogil:
    """Host fragments: up to PVM_IOV of them per process_vm call (one iovec
    each side; neighbours contiguous on both sides merged), so a thousand
    scattered blocks cost one system call, not a thousand."""
    cdef iovec liov[PVM_IOV]
    cdef iovec riov[PVM_IOV]
    cdef size_t i = 0, j, k, want
    cdef ssize_t got
    cdef gx_xfer one
    while i < nf:
        k = 0
        want = 0
        j = i
        while j < nf and k < PVM_IOV:
            if f[j].n:
                if k and <char*>liov[k - 1].iov_base + liov[k - 1].iov_len == <char*>f[j].local \
                        and <uintptr_t>riov[k - 1].iov_base + riov[k - 1].iov_len == f[j].remote:
                    liov[k - 1].iov_len += f[j].n
                    riov[k - 1].iov_len += f[j].n
                else:
                    liov[k].iov_base = f[j].local
                    liov[k].iov_len = f[j].n
                    riov[k].iov_base = <void*>f[j].remote
                    riov[k].iov_len = f[j].n
                    k += 1
                want += f[j].n
            j += 1
        if k:
            if write:
                got = process_vm_writev(x.t.pid, liov, k, riov, k, 0)
            else:
                got = process_vm_readv(x.t.pid, liov, k, riov, k, 0)
            if got < 0 or <size_t>got != want:
                # partial (or failed): redo these fragments one by one, which
                # finishes a partial transfer or reports why it cannot
                one = x[0]
                one.vis = NULL
                one.handle = NULL
                while i < j:
                    if f[i].n:
                        one.local = f[i].local
                        one.remote = f[i].remote
                        one.n = f[i].n
                        _pvm(&one, write)
                    i += 1
        i = j
    return 0


cdef int _pvm_put_vis(gx_xfer* x) except -1 nogil:
    x.op = 1
    return _pvm_vis(x)


cdef int _pvm_get_vis(gx_xfer* x) except -1 nogil:
    x.op = 0
    return _pvm_vis(x)


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
        if d.staged:
            # checked before the copy: the atomic would run on the segment's GPU, which
            # does not follow the caller's stream (and a refused op must move nothing)
            return _staged_unsupported("put_signal_on_stream (the signal would need the "
                                       "segment's GPU to follow the user's stream)")
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
    if ep == NULL or categories & GX_WAIT_SETTLE or gx_load_long(&ep.nbi_dev) == 0:
        return 1            # (settle: what lands here is applied as it lands)
    return _ep_streams_done(ep, False)


include "local.src/hoststage.pxi"
include "local.src/landed.pxi"
include "local.src/landed_initiator.pxi"
include "local.src/landed_rings.pxi"
include "local.src/landed_vis.pxi"

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
# VIS on the mappings: the core copies host blocks itself; what reaches these slots
# has device blocks or a stream (the endpoint's device kind copies)
_SELF.put_vis = _NBRHD.put_vis = _mapped_put_vis
_SELF.get_vis = _NBRHD.get_vis = _mapped_get_vis
_fill(&_PVM, b"pvm", _pvm_put, _pvm_get, _pvm_atomic, _pvm_put_signal)
_PVM.put_vis = _pvm_put_vis            # iovecs; the other tables leave VIS to the core's loop
_PVM.get_vis = _pvm_get_vis
_fill(&_SELF_DEV, b"self", _dev_put, _dev_get, _dev_atomic, _dev_put_signal)
_fill(&_NBRHD_DEV, b"nbrhd", _dev_put, _dev_get, _dev_atomic, _dev_put_signal)
_SELF_DEV.test = _NBRHD_DEV.test = _dev_test       # NB device copies: events
_SELF_DEV.wait = _NBRHD_DEV.wait = _dev_wait
_SELF_DEV.orphan = _NBRHD_DEV.orphan = _dev_orphan
_SELF_DEV.put_vis = _NBRHD_DEV.put_vis = _dev_put_vis     # 2-D/3-D and batched copies
_SELF_DEV.get_vis = _NBRHD_DEV.get_vis = _dev_get_vis
_fill(&_SELF_STAGED, b"self-staged", _staged_put, _staged_get, _dev_atomic, _staged_put_signal)
_fill(&_NBRHD_STAGED, b"nbrhd-staged", _staged_put, _staged_get, _dev_atomic, _staged_put_signal)
_SELF_STAGED.put_vis = _NBRHD_STAGED.put_vis = _staged_put_vis    # packed through the bounce buffers
_SELF_STAGED.get_vis = _NBRHD_STAGED.get_vis = _staged_get_vis
_fill(&_NBRHD_LANDED, b"nbrhd-landed", _landed_put, _landed_get, _landed_atomic, _landed_put_signal)
_NBRHD_LANDED.put_vis = _landed_put_vis            # small blocks gathered, runs landed whole
_NBRHD_LANDED.get_vis = _landed_get_vis


cdef int _set_kind(lp_kind* k, object mk) except -1:
    """The data-plane view of a memory kind object (gexmk.MemoryKind)."""
    k.ops = NULL
    k.kctx = NULL
    k.atomic = NULL
    k.device = -1
    impl = mk.impl
    if impl is None:
        return 0
    k.ops = <const gx_kind_ops*>PyCapsule_GetPointer(impl.ops_capsule(), b"gexmk.kind_ops")
    k.kctx = <void*><uintptr_t>impl.handle
    k.atomic = k.ops.atomic         # NULL where the kind has no device atomics
    k.device = mk.device
    return 0


include "local.src/control.pxi"


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
