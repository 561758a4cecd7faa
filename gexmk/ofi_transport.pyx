"""The ``ofi`` transport: libfabric RDM endpoints for RMA and atomics.

One :class:`Domain` per process (fabric, domain and one address vector shared
by every endpoint); one :class:`Endpoint` per gexmk endpoint, owning its
libfabric endpoint, completion queue and segment registration, so two gexmk
endpoints have independent ordering and ``quiet`` (the explicit-context model).

Operations carry a heap-allocated context (``gx_op``); whoever reads its
completion from the CQ -- the initiating thread or the progress thread --
marks it done.  An op abandoned before completion (an Event collected early, a
timeout) is *orphaned* and freed by its completion, never before, so a late
completion cannot write into freed memory.

Puts ask for FI_DELIVERY_COMPLETE: their completion means the data is at the
target, which is what a blocking put and an NB put's event promise.
"""
import os
import threading

from cpython.pycapsule cimport PyCapsule_New
from libc.stdint cimport uint8_t, uint32_t, uint64_t, uintptr_t, int64_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy, memset
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC, nanosleep

cdef extern from "<time.h>" nogil:
    enum: CLOCK_MONOTONIC_COARSE

cdef extern from "<sched.h>" nogil:
    int sched_yield()

cdef extern from "<poll.h>" nogil:
    struct pollfd:
        int fd
        short events
        short revents
    int poll(pollfd* fds, unsigned long nfds, int timeout)
    enum:
        POLLIN

cdef extern from "<sys/prctl.h>" nogil:
    int prctl(int option, unsigned long arg2, unsigned long arg3, unsigned long arg4,
              unsigned long arg5)
    enum:
        PR_SET_TIMERSLACK

from gexmk.lib.libfabric cimport *
from gexmk.lib.gx cimport *
from gexmk.net cimport *

from gexmk.errors import (OFIError, UnsupportedError, PeerDeadError, TimeoutError as GxTimeoutError,
                          ArgumentError, StateError, CommunicationError)

cdef enum:
    OP_PENDING = 0
    OP_DONE = 1
    OP_ORPHAN = 2
    MAX_TOUCHED = 16        # targets of unflushed implicit puts remembered per endpoint
    MAX_EPS = 1024          # endpoints per process on the network
    ATOMICS_EVERY = 4       # split endpoints: progress passes per read of the atomics CQ


# The progress thread keeps off the CQs for this long (s) after an application
# thread last drove progress itself (blocking waits, nbi_wait).
cdef double STAND_ASIDE = 0.002

# Leads the published name of a split endpoint (RMA name + atomics name).
_SPLIT_TAG = b"gexmk-split:"


cdef struct ofi_dom:
    fi_info* info
    fi_info* rma_info       # split mode: the RMA endpoints' info (no FI_ATOMIC, RAW-ordered); else NULL
    int split               # 1: each endpoint is an RMA EP + an atomics EP (gx_target.net_aaddr)
    fid_fabric* fabric
    fid_domain* domain
    fid_av* av
    uint64_t mr_mode
    size_t inject_size
    int manual              # FI_PROGRESS_MANUAL data progress: targets must poll
    uint64_t next_key       # requested keys when the provider does not choose them
    double timeout          # seconds a blocking wait may take before TimeoutError
    int cq_wait             # CQs opened from now on get a wait fd (a sleeping progress thread)
    long waiters            # threads spinning on a completion: the progress thread stands aside
    double last_app         # when an application thread last drove progress itself
    int ordered             # FI_ORDER_RAW: a read issued after writes sees them (flush by read)
    size_t max_order_raw    # ... for writes up to this size
    ofi_ep* eps[MAX_EPS]    # live endpoints: what waits and the progress thread poll
    long neps
    long readers            # threads walking eps[] without the GIL (see _unregister)
    signed char valid[3][GX_DT_COUNT][GX_OP_COUNT]   # fi_*atomicvalid cache: -1 unknown


cdef struct ofi_ep:
    ofi_dom* dom
    fid_ep* ep              # puts, gets, flushes
    fid_ep* aep             # atomics: ep itself, or in split mode a second endpoint
    fid_cq* cq
    fid_cq* acq             # split mode: aep's own CQ (NULL otherwise)
    int await_fd            # ... and its wait fd (can_wait)
    unsigned int apass      # progress passes, to poll acq on one in ATOMICS_EVERY
    long amo_out            # this endpoint's atomics not yet completed: acq polled every pass
    fid_mr* seg_mr
    void* seg_desc
    uintptr_t seg_lo
    uintptr_t seg_hi
    long nbi[3]             # outstanding implicit ops by NET_CAT_*
    int nbi_err             # first failure (fi errno) among implicit ops since the last sync
    int can_wait            # the CQ has a wait fd the progress thread can sleep on; else poll + nap
    int wait_fd
    gx_target* touched[16]  # targets of implicit puts issued without delivery completion


cdef struct gx_op:
    fi_context2 ctx         # first: the provider's per-op scratch (FI_CONTEXT2)
    ofi_ep* ep
    gx_target* t            # the target: a wait gives up when its process dies
    int state               # OP_*
    int err                 # fi errno of a failed op, else 0
    int nbi                 # NET_CAT_* + 1 for implicit ops (freed at completion), else 0
    int amo                 # an atomic: counted in ep.amo_out until it completes
    int nmr
    fid_mr* mr[3]           # on-the-fly registrations, closed at completion
    gx_val operand          # atomic operands and result live here until completion
    gx_val compare
    gx_val result


# ---- errors ------------------------------------------------------------------

cdef int _raise(const char* call, ssize_t rc) except -1 with gil:
    code = -rc if rc < 0 else rc
    raise OFIError(call.decode(), code, fi_strerror(<int>code).decode())


cdef inline int check(const char* call, ssize_t rc) except -1 nogil:
    """One check for every libfabric return code: raise only on failure."""
    if rc < 0:
        return _raise(call, rc)
    return 0


cdef int _raise_dead(gx_target* t, const char* what) except -1 with gil:
    raise PeerDeadError(f"{what.decode()}: job rank {t.jobrank} has died")


cdef int _raise_timeout(gx_target* t, double secs, const char* what) except -1 with gil:
    who = f"job rank {t.jobrank}" if t != NULL else "the target"
    raise GxTimeoutError(f"{what.decode()}: no completion from {who} within {secs:g} s "
                         "(GEXMK_TIMEOUT); is it alive and reachable?")


cdef int _raise_op_failed(int err, const char* what) except -1 with gil:
    raise OFIError(what.decode(), err, fi_strerror(err).decode() +
                   " (the target may have died or become unreachable)")


cdef double _now() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


cdef inline double _now_coarse() noexcept nogil:
    """Seconds, at the kernel tick's resolution, for a few ns."""
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


cdef inline void _app_active(ofi_dom* dom) noexcept nogil:
    """An application thread is driving an endpoint (issuing or waiting): the
    progress thread keeps off for STAND_ASIDE.  The coarse clock is precise
    enough for that, and cheap enough for every issue."""
    dom.last_app = _now_coarse()


# ---- completion ------------------------------------------------------------

cdef void _release_mrs(gx_op* op) noexcept nogil:
    cdef int i
    for i in range(op.nmr):
        fi_close(&op.mr[i].fid)
    op.nmr = 0


cdef void _complete(gx_op* op, int err) noexcept nogil:
    cdef ofi_ep* ep = op.ep
    _release_mrs(op)
    if op.amo:
        gx_add_long(&ep.amo_out, -1)
    if op.nbi:
        if err and ep.nbi_err == 0:
            ep.nbi_err = err
        gx_add_long(&ep.nbi[op.nbi - 1], -1)
        free(op)
        return
    op.err = err
    if gx_xchg_int(&op.state, OP_DONE) == OP_ORPHAN:
        free(op)


cdef int _progress_all(ofi_dom* dom) noexcept nogil:
    """Poll every live endpoint of the process once.  A thread waiting on one
    endpoint keeps serving the others (a target's manual progress), so two
    processes blocked on each other through different endpoints cannot
    deadlock.  -1 when a CQ fails."""
    cdef long i, n
    cdef int got = 0, r
    gx_add_long(&dom.readers, 1)
    gx_fence()
    n = gx_load_long(&dom.neps)
    for i in range(n):
        r = _progress_quiet(dom.eps[i])
        if r < 0:
            got = -1
            break
        got += r
    gx_add_long(&dom.readers, -1)
    return got


cdef int _progress(ofi_ep* ep) except -1 nogil:
    """Read completions from the endpoint's CQ (and drive manual progress)."""
    cdef int n = _progress_quiet(ep)
    if n < 0:
        return check("fi_cq_read", -FI_EIO)
    return n


cdef int _spin(gx_op* op, gx_target* t) noexcept nogil:
    """Progress until op completes: 0, or 1 when its target died, 2 on timeout,
    3 when the CQ itself fails.  While a thread spins here the progress thread
    stands aside (dom.waiters), so the two do not fight over the CQ and cores."""
    cdef ofi_dom* dom = op.ep.dom
    cdef double deadline = 0
    cdef unsigned long spins = 0
    cdef int why = 0
    gx_add_long(&dom.waiters, 1)
    _app_active(dom)
    while gx_load_int(&op.state) != OP_DONE:
        if _progress_all(dom) < 0:
            why = 3
            break
        spins += 1
        if (spins & 1023) == 0:
            if t != NULL and t.dead:
                why = 1
                break
            if deadline == 0:
                deadline = _now() + dom.timeout
            elif _now() > deadline:
                why = 2
                break
    _app_active(dom)
    gx_add_long(&dom.waiters, -1)
    return why


cdef int _wait_op(gx_op* op, gx_target* t, const char* what, gx_val* result=NULL) except -1 nogil:
    """Wait for op, copy its fetched value to *result, free it; raise if it failed."""
    cdef int err, why = _spin(op, t)
    if why:
        _orphan(op)
        if why == 1:
            return _raise_dead(t, what)
        if why == 2:
            return _raise_timeout(t, op.ep.dom.timeout, what)
        return check("fi_cq_read", -FI_EIO)
    if result != NULL:
        result[0] = op.result
    err = op.err
    free(op)
    if err:
        return _raise_op_failed(err, what)
    return 0


cdef void _orphan(gx_op* op) noexcept nogil:
    if gx_xchg_int(&op.state, OP_ORPHAN) == OP_DONE:
        free(op)


# ---- the table handed to the core ------------------------------------------

cdef gx_op* _new_op(ofi_ep* ep, gx_target* t, int mode, int cat) except NULL nogil:
    cdef gx_op* op = <gx_op*>calloc(1, sizeof(gx_op))
    if op == NULL:
        with gil:
            raise MemoryError()
    op.ep = ep
    op.t = t
    if cat == NET_CAT_RMW:
        op.amo = 1
        gx_add_long(&ep.amo_out, 1)
    if mode == NET_NBI or mode == NET_NBI_LCNOW:
        op.nbi = cat + 1
        gx_add_long(&ep.nbi[cat], 1)
    return op


cdef void _drop_new(gx_op* op) noexcept nogil:
    """Undo _new_op for an op the provider refused."""
    _release_mrs(op)
    if op.amo:
        gx_add_long(&op.ep.amo_out, -1)
    if op.nbi:
        gx_add_long(&op.ep.nbi[op.nbi - 1], -1)
    free(op)


cdef int _desc(ofi_ep* ep, gx_op* op, void* p, size_t n, uint64_t access, void** desc) noexcept nogil:
    """Local descriptor for [p, p+n): the segment's when inside it, none when the
    provider does not need one (no FI_MR_LOCAL), else an on-the-fly registration."""
    cdef uintptr_t a = <uintptr_t>p
    desc[0] = NULL
    if a >= ep.seg_lo and a + n <= ep.seg_hi and ep.seg_mr != NULL:
        desc[0] = ep.seg_desc
        return 0
    if not (ep.dom.mr_mode & FI_MR_LOCAL):
        return 0
    cdef fid_mr* mr
    cdef int rc = fi_mr_reg(ep.dom.domain, p, n, access, 0, 0, 0, &mr, NULL)
    if rc < 0:
        return rc          # the caller drops the op, then raises
    op.mr[op.nmr] = mr
    op.nmr += 1
    desc[0] = fi_mr_desc(mr)
    return 0


cdef inline uint64_t _raddr(gx_target* t, uintptr_t remote) noexcept nogil:
    return remote - t.remote_base + t.net_base


cdef int _retry(ofi_ep* ep, gx_target* t, double* deadline) noexcept nogil:
    """After -FI_EAGAIN: progress, then 0 to retry, ISSUE_DEAD when the target
    died, ISSUE_TIMEOUT when the queue stayed full past GEXMK_TIMEOUT."""
    if _progress_all(ep.dom) < 0:
        return ISSUE_DEAD
    if t != NULL and t.dead:
        return ISSUE_DEAD
    if deadline[0] == 0:
        deadline[0] = _now() + ep.dom.timeout
    elif _now() > deadline[0]:
        return ISSUE_TIMEOUT
    return 0


cdef int _issue_failed(gx_target* t, ssize_t rc, const char* call) except -1 nogil:
    if rc == ISSUE_DEAD:
        if t != NULL:
            return _raise_dead(t, call)
        return check(call, -FI_EIO)
    if rc == ISSUE_TIMEOUT:
        with gil:
            raise GxTimeoutError(f"{call.decode()}: the provider's queue stayed full for "
                                 f"GEXMK_TIMEOUT; is the target alive and progressing?")
    return check(call, rc)


cdef bint _touch(ofi_ep* ep, gx_target* t) noexcept nogil:
    """Remember t as owing a flush; False when the list is full.  Slots are
    claimed and released with atomics, so threads may race here and with a
    sync: at worst a target is flushed twice."""
    cdef int i
    for i in range(MAX_TOUCHED):
        if gx_load_ptr(<void**>&ep.touched[i]) == <void*>t:
            return True
    for i in range(MAX_TOUCHED):
        if gx_claim_ptr(<void**>&ep.touched[i], <void*>t):
            return True
    return False


cdef int _flush(ofi_ep* ep, gx_target* only) except -1 nogil:
    """Remote completion of implicit puts issued with transmit completion:
    an 8-byte read from each target they went to, ordered after them by the
    provider's read-after-write ordering, completes when they have landed.
    `only`: flush just that target now (its slot could not be kept)."""
    cdef gx_op* ops[16]
    cdef gx_target* t
    cdef int i, n = 0, err = 0
    cdef ssize_t rc
    cdef void* desc
    cdef double deadline = 0
    for i in range(MAX_TOUCHED + 1):
        if only != NULL:
            if i > 0:
                break
            t = only
        elif i == MAX_TOUCHED:
            break
        else:
            t = <gx_target*>gx_xchg_ptr(<void**>&ep.touched[i], NULL)
        if t == NULL or t.size == 0:
            continue
        ops[n] = _new_op(ep, t, NET_BLOCKING, NET_CAT_GET)
        rc = _desc(ep, ops[n], &ops[n].result, 1, FI_READ, &desc)
        while rc == 0:
            rc = fi_read(ep.ep, &ops[n].result, 1, desc, t.net_addr, t.net_base, t.net_key, ops[n])
            if rc != -FI_EAGAIN:
                break
            rc = _retry(ep, t, &deadline)
        if rc < 0:
            _drop_new(ops[n])
            err = <int>rc
            continue
        n += 1
    for i in range(n):
        _wait_op(ops[i], ops[i].t, "flush (nbi_wait/quiet)")
    if err:
        return _issue_failed(NULL, err, "fi_read (flush of implicit puts)")
    return 0


cdef int net_put(void* epv, gx_target* t, uintptr_t remote, void* local, size_t n,
                 int mode, void** out) except -1 nogil:
    cdef ofi_ep* ep = <ofi_ep*>epv
    cdef gx_op* op
    cdef iovec iov
    cdef void* desc
    cdef fi_rma_iov riov
    cdef fi_msg_rma msg
    cdef uint64_t flags = FI_COMPLETION | FI_DELIVERY_COMPLETE
    cdef ssize_t rc
    cdef bint ordered = False
    cdef double deadline = 0
    _app_active(ep.dom)
    if mode == NET_NBI_LCNOW and n > ep.dom.inject_size:
        mode = NET_BLOCKING           # the source is reusable only once the put completes
    if (mode == NET_NBI or mode == NET_NBI_LCNOW) and ep.dom.ordered \
            and n <= ep.dom.max_order_raw and _touch(ep, t):
        # Transmit completion now, remote completion by the flush at sync time.
        ordered = True
        flags = 0
        if mode == NET_NBI_LCNOW:
            # inject: copied at issue, no completion entry, no op to allocate
            while True:
                rc = fi_inject_write(ep.ep, local, n, t.net_addr, _raddr(t, remote), t.net_key)
                if rc != -FI_EAGAIN:
                    break
                rc = _retry(ep, t, &deadline)
                if rc:
                    break
            if rc < 0:
                return _issue_failed(t, rc, "fi_inject_write")
            return _ensure_flush(ep, t)
        flags = FI_COMPLETION
    # decided before the op exists: once posted, its completion may be read (and
    # an implicit op freed) by the progress thread at any moment
    op = _new_op(ep, t, mode, NET_CAT_PUT)
    rc = _desc(ep, op, local, n, FI_WRITE, &desc)
    if rc < 0:
        _drop_new(op)
        return check("fi_mr_reg", rc)
    if not ordered:
        flags = FI_COMPLETION | FI_DELIVERY_COMPLETE
    if mode == NET_NBI_LCNOW:
        flags |= FI_INJECT            # buffer copied at issue: reusable on return
    iov.iov_base = local
    iov.iov_len = n
    riov.addr = _raddr(t, remote)
    riov.len = n
    riov.key = t.net_key
    memset(&msg, 0, sizeof(msg))
    msg.msg_iov = &iov
    msg.desc = &desc
    msg.iov_count = 1
    msg.addr = t.net_addr
    msg.rma_iov = &riov
    msg.rma_iov_count = 1
    msg.context = op
    while True:
        rc = fi_writemsg(ep.ep, &msg, flags)
        if rc != -FI_EAGAIN:
            break
        rc = _retry(ep, t, &deadline)
        if rc:
            break
    _posted(op, t, rc, mode, out, "fi_writemsg", "put")
    if ordered:
        _ensure_flush(ep, t)
    return 0


cdef int _posted(gx_op* op, gx_target* t, ssize_t rc, int mode, void** out,
                 const char* call, const char* what) except -1 nogil:
    """After posting op (rc from the post): drop it and raise on failure; wait
    for it when blocking; hand it out when NB (implicit ops need nothing)."""
    if rc < 0:
        _drop_new(op)
        return _issue_failed(t, rc, call)
    if mode == NET_BLOCKING:
        return _wait_op(op, t, what)
    if mode == NET_NB:
        out[0] = op
    return 0


cdef int _ensure_flush(ofi_ep* ep, gx_target* t) except -1 nogil:
    """After posting an ordered implicit put: its target must be in the list
    (a concurrent sync may have taken it out); if the list is full, flush now."""
    if not _touch(ep, t):
        return _flush(ep, t)
    return 0


cdef int net_get(void* epv, gx_target* t, uintptr_t remote, void* local, size_t n,
                 int mode, void** out) except -1 nogil:
    cdef ofi_ep* ep = <ofi_ep*>epv
    cdef gx_op* op = _new_op(ep, t, mode, NET_CAT_GET)
    cdef void* desc
    cdef ssize_t rc
    cdef double deadline = 0
    _app_active(ep.dom)
    rc = _desc(ep, op, local, n, FI_READ, &desc)
    if rc < 0:
        _drop_new(op)
        return check("fi_mr_reg", rc)
    while True:
        rc = fi_read(ep.ep, local, n, desc, t.net_addr, _raddr(t, remote), t.net_key, op)
        if rc != -FI_EAGAIN:
            break
        rc = _retry(ep, t, &deadline)
        if rc:
            break
    return _posted(op, t, rc, mode, out, "fi_read", "get")


cdef fi_datatype _fi_dt(int dt) noexcept nogil:
    if dt == GX_DT_I32:
        return FI_INT32
    if dt == GX_DT_U32:
        return FI_UINT32
    if dt == GX_DT_I64:
        return FI_INT64
    if dt == GX_DT_U64:
        return FI_UINT64
    if dt == GX_DT_FLT:
        return FI_FLOAT
    return FI_DOUBLE


# How each gexmk op maps onto libfabric: the fi_op and which call family
# (0 fi_atomic, 1 fi_fetch_atomic, 2 fi_compare_atomic).
cdef int _map_op(int code, int dt, fi_op* fop, int* family, gx_val* a, gx_val* b) noexcept nogil:
    cdef bint fetch = code in (GX_OP_GET, GX_OP_SWAP, GX_OP_FCAS, GX_OP_FADD, GX_OP_FSUB,
                               GX_OP_FINC, GX_OP_FDEC, GX_OP_FAND, GX_OP_FOR, GX_OP_FXOR,
                               GX_OP_FMIN, GX_OP_FMAX)
    family[0] = 1 if fetch else 0
    if code == GX_OP_SET or code == GX_OP_SWAP:
        fop[0] = FI_ATOMIC_WRITE
    elif code == GX_OP_GET:
        fop[0] = FI_ATOMIC_READ
    elif code == GX_OP_CAS or code == GX_OP_FCAS:
        fop[0] = FI_CSWAP
        family[0] = 2
    elif code in (GX_OP_ADD, GX_OP_FADD, GX_OP_SUB, GX_OP_FSUB, GX_OP_INC, GX_OP_FINC,
                  GX_OP_DEC, GX_OP_FDEC):
        fop[0] = FI_SUM
        # SUB, INC and DEC become a SUM of the negated operand / +-1 (wrapping for integers)
        if code == GX_OP_INC or code == GX_OP_FINC or code == GX_OP_DEC or code == GX_OP_FDEC:
            _set_one(dt, a, -1 if (code == GX_OP_DEC or code == GX_OP_FDEC) else 1)
        elif code == GX_OP_SUB or code == GX_OP_FSUB:
            _negate(dt, a)
    elif code == GX_OP_AND or code == GX_OP_FAND:
        fop[0] = FI_BAND
    elif code == GX_OP_OR or code == GX_OP_FOR:
        fop[0] = FI_BOR
    elif code == GX_OP_XOR or code == GX_OP_FXOR:
        fop[0] = FI_BXOR
    elif code == GX_OP_MIN or code == GX_OP_FMIN:
        fop[0] = FI_MIN
    elif code == GX_OP_MAX or code == GX_OP_FMAX:
        fop[0] = FI_MAX
    else:
        return -1
    return 0


cdef void _set_one(int dt, gx_val* v, int sign) noexcept nogil:
    if dt == GX_DT_I32 or dt == GX_DT_U32:
        v.u32 = <uint32_t>(<int>sign)
    elif dt == GX_DT_I64 or dt == GX_DT_U64:
        v.u64 = <uint64_t>(<int64_t>sign)
    elif dt == GX_DT_FLT:
        v.flt = sign
    else:
        v.dbl = sign


cdef void _negate(int dt, gx_val* v) noexcept nogil:
    if dt == GX_DT_I32 or dt == GX_DT_U32:
        v.u32 = 0u - v.u32
    elif dt == GX_DT_I64 or dt == GX_DT_U64:
        v.u64 = 0u - v.u64
    elif dt == GX_DT_FLT:
        v.flt = -v.flt
    else:
        v.dbl = -v.dbl


cdef int _valid(ofi_ep* ep, int family, int dt, fi_op fop, int code) noexcept nogil:
    cdef signed char* slot = &ep.dom.valid[family][dt][code]
    cdef size_t count = 0
    cdef int rc
    if slot[0] < 0:
        if family == 0:
            rc = fi_atomicvalid(ep.aep, _fi_dt(dt), fop, &count)
        elif family == 1:
            rc = fi_fetch_atomicvalid(ep.aep, _fi_dt(dt), fop, &count)
        else:
            rc = fi_compare_atomicvalid(ep.aep, _fi_dt(dt), fop, &count)
        slot[0] = 1 if (rc == 0 and count >= 1) else 0
    return slot[0]


cdef enum:
    ISSUE_DEAD = -1000000     # the target died (or the CQ failed) while the queue was full
    ISSUE_TIMEOUT = -1000001  # the queue stayed full past GEXMK_TIMEOUT

cdef ssize_t _issue_atomic(ofi_ep* ep, gx_target* t, uintptr_t remote, int dt, fi_op fop, int family,
                           gx_op* op) noexcept nogil:
    """Post one atomic; returns libfabric's code (or ISSUE_DEAD), never raises."""
    cdef void* d1
    cdef void* d2
    cdef void* d3
    cdef ssize_t rc
    cdef size_t sz = gx_dt_size(dt)
    cdef double deadline = 0
    cdef fi_addr_t peer = t.net_aaddr         # its atomics endpoint (= net_addr unless split)
    d2 = d3 = NULL
    rc = _desc(ep, op, &op.operand, sz, FI_WRITE, &d1)
    if rc == 0 and family >= 1:
        rc = _desc(ep, op, &op.result, sz, FI_READ, &d3)
    if rc == 0 and family == 2:
        rc = _desc(ep, op, &op.compare, sz, FI_WRITE, &d2)
    if rc < 0:
        return rc
    while True:
        if family == 0:
            rc = fi_atomic(ep.aep, &op.operand, 1, d1, peer, _raddr(t, remote), t.net_key,
                           _fi_dt(dt), fop, op)
        elif family == 1:
            rc = fi_fetch_atomic(ep.aep, &op.operand, 1, d1, &op.result, d3, peer,
                                 _raddr(t, remote), t.net_key, _fi_dt(dt), fop, op)
        else:
            rc = fi_compare_atomic(ep.aep, &op.operand, 1, d1, &op.compare, d2, &op.result, d3,
                                   peer, _raddr(t, remote), t.net_key, _fi_dt(dt), fop, op)
        if rc != -FI_EAGAIN:
            return rc
        rc = _retry(ep, t, &deadline)
        if rc:
            return rc


cdef int _post_atomic(ofi_ep* ep, gx_target* t, uintptr_t remote, int dt, fi_op fop, int family,
                      gx_op* op) except -1 nogil:
    """Post, or drop the op and raise."""
    cdef ssize_t rc = _issue_atomic(ep, t, remote, dt, fop, family, op)
    if rc >= 0:
        return 0
    _drop_new(op)
    return _issue_failed(t, rc, "fi_atomic")


cdef int _read_cq(fid_cq* cq) noexcept nogil:
    """Complete what one CQ holds (reading it drives manual progress of the
    endpoints bound to it): how many, or -1 on a CQ failure."""
    cdef fi_cq_entry entries[16]
    cdef fi_cq_err_entry e
    cdef ssize_t n = fi_cq_read(cq, entries, 16), i
    if n > 0:
        for i in range(n):
            _complete(<gx_op*>entries[i].op_context, 0)
        return <int>n
    if n == -FI_EAVAIL:
        memset(&e, 0, sizeof(e))
        if fi_cq_readerr(cq, &e, 0) > 0 and e.op_context != NULL:
            _complete(<gx_op*>e.op_context, e.err if e.err else FI_EIO)
            return 1
        return 0
    if n == -FI_EAGAIN or n == 0:
        return 0
    return -1


cdef int _progress_quiet(ofi_ep* ep) noexcept nogil:
    """_progress for callers that cannot raise: -1 on a CQ failure.  A split
    endpoint's atomics CQ is read on every pass while this endpoint has
    atomics in flight, else on one pass in ATOMICS_EVERY: each read is a
    progress pass of its own (a poll() of its sockets), and reading it
    always would slow every put and get for the sake of incoming atomics."""
    cdef int n = _read_cq(ep.cq), m
    if ep.acq != NULL and n >= 0:
        ep.apass += 1
        if gx_load_long(&ep.amo_out) > 0 or ep.apass % ATOMICS_EVERY == 0:
            m = _read_cq(ep.acq)
            n = -1 if m < 0 else n + m
    return n


cdef int net_atomic(void* epv, gx_target* t, uintptr_t remote, int dt, int code,
                    gx_val a, gx_val b, gx_val* result, int mode, void** out) except -1 nogil:
    cdef ofi_ep* ep = <ofi_ep*>epv
    cdef fi_op fop
    cdef int family
    cdef gx_val na = a
    cdef gx_op* op
    _app_active(ep.dom)
    if _map_op(code, dt, &fop, &family, &na, &b) < 0:
        with gil:
            raise ArgumentError(f"atomic: unknown op code {code}")
    if not _valid(ep, family, dt, fop, code):
        # The provider lacks this op/type: a compare-and-swap loop is still exact.
        _cas_loop(ep, t, remote, dt, code, a, b, result)
        return 0
    op = _new_op(ep, t, mode if mode != NET_NBI_LCNOW else NET_NBI, NET_CAT_RMW)
    op.operand = na
    if family == 2:          # libfabric: compare is the expected value, buf the new one
        op.compare = a
        op.operand = b
    _post_atomic(ep, t, remote, dt, fop, family, op)
    if mode == NET_NB:
        out[0] = op
        return 0
    if mode != NET_BLOCKING:
        return 0
    return _wait_op(op, t, "atomic", result)


cdef int _cas_loop(ofi_ep* ep, gx_target* t, uintptr_t remote, int dt, int code,
                   gx_val a, gx_val b, gx_val* result) except -1 nogil:
    """Emulate an op the provider lacks: read, compute locally, compare-and-swap."""
    cdef int udt = GX_DT_U32 if gx_dt_size(dt) == 4 else GX_DT_U64
    cdef gx_val old, new, seen
    cdef gx_op* op
    if not _valid(ep, 2, udt, FI_CSWAP, GX_OP_FCAS) or not _valid(ep, 1, udt, FI_ATOMIC_READ, GX_OP_GET):
        with gil:
            raise UnsupportedError("atomic: this provider offers neither the op nor "
                                   "compare-and-swap for its size")
    op = _new_op(ep, t, NET_BLOCKING, NET_CAT_RMW)
    _post_atomic(ep, t, remote, udt, FI_ATOMIC_READ, 1, op)
    _wait_op(op, t, "atomic", &old)
    while True:
        new = old
        gx_atomic_local(&new, dt, code, a, b, NULL)    # the op applied to a private copy
        op = _new_op(ep, t, NET_BLOCKING, NET_CAT_RMW)
        op.compare = old
        op.operand = new
        _post_atomic(ep, t, remote, udt, FI_CSWAP, 2, op)
        _wait_op(op, t, "atomic", &seen)
        if (udt == GX_DT_U32 and seen.u32 == old.u32) or (udt == GX_DT_U64 and seen.u64 == old.u64):
            break
        old = seen
    if result != NULL:
        result[0] = old
    return 0


cdef int net_test(void* opv, gx_val* result) except -1 nogil:
    cdef gx_op* op = <gx_op*>opv
    if gx_load_int(&op.state) != OP_DONE:
        _progress(op.ep)
        if gx_load_int(&op.state) != OP_DONE:
            return 0
    _wait_op(op, op.t, "event", result)     # complete: frees it, raises if it failed
    return 1


cdef int net_wait(void* opv, gx_val* result) except -1 nogil:
    cdef gx_op* op = <gx_op*>opv
    return _wait_op(op, op.t, "event wait", result)


cdef void net_orphan(void* opv) noexcept nogil:
    _orphan(<gx_op*>opv)


cdef int net_nbi_wait(void* epv, int categories) except -1 nogil:
    cdef ofi_ep* ep = <ofi_ep*>epv
    cdef double deadline = 0
    cdef unsigned long spins = 0
    cdef int err, c
    cdef int why = 0
    gx_add_long(&ep.dom.waiters, 1)
    _app_active(ep.dom)
    for c in range(3):
        if not (categories & (1 << c)):
            continue
        while gx_load_long(&ep.nbi[c]) > 0 and why == 0:
            if _progress_all(ep.dom) < 0:
                why = 3
            spins += 1
            if (spins & 1023) == 0:
                if deadline == 0:
                    deadline = _now() + ep.dom.timeout
                elif _now() > deadline:
                    why = 2
    _app_active(ep.dom)
    gx_add_long(&ep.dom.waiters, -1)
    if why == 2:
        return _raise_timeout(NULL, ep.dom.timeout, "nbi_wait")
    if why == 3:
        return check("fi_cq_read", -FI_EIO)
    if categories & (1 << NET_CAT_PUT):
        _flush(ep, NULL)
    err = ep.nbi_err
    if err:
        ep.nbi_err = 0
        return _raise_op_failed(err, "nbi_wait (an implicit-event operation failed)")
    return 0


cdef net_ops _OPS
_OPS.put = net_put
_OPS.get = net_get
_OPS.atomic = net_atomic
_OPS.test = net_test
_OPS.wait = net_wait
_OPS.orphan = net_orphan
_OPS.nbi_wait = net_nbi_wait


def ops_capsule():
    """The transport's function table, for gexmk.core."""
    return PyCapsule_New(&_OPS, b"gexmk.net_ops", NULL)


# ---- objects ---------------------------------------------------------------

cdef uint64_t _WANT_MR_MODE = (FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY
                               | FI_MR_ENDPOINT | FI_MR_RAW)


def _env_timeout():
    try:
        return float(os.environ.get("GEXMK_TIMEOUT", "300"))
    except ValueError:
        raise ArgumentError(f"GEXMK_TIMEOUT must be a number of seconds, got "
                            f"{os.environ['GEXMK_TIMEOUT']!r}") from None


_PREFERENCE = ["cxi", "efa", "verbs;ofi_rxm", "psm3", "opx", "tcp;ofi_rxm", "net;ofi_rxm",
               "sockets", "shm"]


cdef class Domain:
    """Process-wide libfabric state: fabric, domain and address vector.

    ``provider``: a libfabric provider name (``tcp;ofi_rxm``, ``shm``,
    ``verbs;ofi_rxm``, ``cxi``, ``efa``, ``sockets``) or None for the first
    that offers RDM + RMA (libfabric's own FI_PROVIDER applies too).
    ``interface``: a domain name (e.g. ``eth0``); loopback domains are skipped
    when ``skip_loopback`` (jobs spanning nodes)."""
    cdef ofi_dom d
    cdef readonly str provider
    cdef readonly str domain_name
    cdef readonly bint atomics
    cdef dict _addrs
    cdef dict _raw_keys
    cdef list _eps
    cdef object _thread
    cdef bint _spin
    cdef volatile int _stop_flag          # read by the progress thread without the GIL
    cdef bint closed
    cdef object __weakref__

    def __cinit__(self):
        memset(&self.d, 0, sizeof(self.d))
        memset(self.d.valid, -1, sizeof(self.d.valid))

    def __init__(self, provider=None, interface=None, bint skip_loopback=False, want_atomics=True):
        cdef fi_info* hints = NULL
        cdef fi_info* info = NULL
        cdef fi_info* p
        cdef fi_info* chosen
        cdef int rc
        self._addrs = {}
        self._raw_keys = {}
        self._eps = []
        # the environment first: a bad value raises before anything is allocated
        self.d.timeout = _env_timeout()
        split_env = os.environ.get("GEXMK_OFI_SPLIT", "1").strip()
        if split_env not in ("0", "1", ""):
            raise ArgumentError(f"GEXMK_OFI_SPLIT={split_env!r}: expected 0 or 1")
        split_wanted = split_env != "0"
        hints = fi_allocinfo()
        if hints == NULL:
            raise MemoryError()
        self.d.next_key = 1
        try:
            hints.caps = FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE
            if want_atomics:
                hints.caps |= FI_ATOMIC
            hints.mode = FI_CONTEXT | FI_CONTEXT2
            hints.ep_attr.type = FI_EP_RDM
            hints.domain_attr.mr_mode = _WANT_MR_MODE
            hints.domain_attr.threading = FI_THREAD_SAFE
            hints.addr_format = FI_FORMAT_UNSPEC
            if provider:
                hints.fabric_attr.prov_name = _strdup(provider.encode())
            # Choose among providers without asking for ordering (asking filters
            # out providers that lack it); without FI_ATOMIC if none offers it
            # (atomics then use the CAS fallback or report that they cannot).
            rc = -FI_ENODATA
            for atomics in ([True, False] if want_atomics else [False]):
                if atomics:
                    hints.caps |= FI_ATOMIC
                else:
                    hints.caps &= ~FI_ATOMIC
                with nogil:
                    rc = fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info)
                if rc != -FI_ENODATA:
                    break
            if rc == -FI_ENODATA:
                raise UnsupportedError(f"no libfabric provider offers RDM endpoints with RMA"
                                       f"{' for ' + repr(provider) if provider else ''}")
            check("fi_getinfo", rc)
            # Without a named provider (and no FI_PROVIDER), prefer the fabrics
            # gexmk is written for over libfabric's list order (which can put
            # udp;ofi_rxd first).
            chosen = NULL
            best = 1 << 30
            p = info
            while p != NULL:
                name = p.domain_attr.name.decode() if p.domain_attr.name != NULL else ""
                if (interface is not None and name != interface) or \
                        (skip_loopback and interface is None and name == "lo"):
                    p = p.next
                    continue
                prov = p.fabric_attr.prov_name.decode()
                if skip_loopback and not provider and prov == "shm":
                    p = p.next          # a job spanning nodes: shm reaches none of them
                    continue
                rank = _PREFERENCE.index(prov) if prov in _PREFERENCE else len(_PREFERENCE)
                if provider or os.environ.get("FI_PROVIDER"):
                    rank = 0           # the user chose: libfabric's order stands
                if rank < best:
                    best = rank
                    chosen = p
                p = p.next
            p = chosen
            if p == NULL:
                raise UnsupportedError(f"no libfabric domain matches interface={interface!r} "
                                       f"(provider {provider!r})")
            self.d.info = _with_ordering(p)
            if not _raw_ordered(self.d.info) and (self.d.info.caps & FI_ATOMIC) \
                    and not (self.d.info.domain_attr.mr_mode & FI_MR_ENDPOINT) \
                    and split_wanted:
                # Ordering lost to FI_ATOMIC (tcp;ofi_rxm: atomics are emulated by
                # messages that pass RMA): RMA on an endpoint without FI_ATOMIC
                # if that one is RAW-ordered, atomics on a second endpoint with
                # a CQ of its own (see _progress_quiet).  Measured on
                # tcp;ofi_rxm: implicit-put issue 15-25% cheaper; blocking
                # put/get and atomic latency unchanged.
                self.d.rma_info = _ordered_without_atomics(p)
                self.d.split = self.d.rma_info != NULL
        finally:
            if info != NULL:
                fi_freeinfo(info)
            if hints != NULL:
                fi_freeinfo(hints)
        self.provider = self.d.info.fabric_attr.prov_name.decode()
        if self.provider == "shm":
            _unlink_stale_shm_regions()
        self.domain_name = self.d.info.domain_attr.name.decode()
        self.atomics = bool(self.d.info.caps & FI_ATOMIC)
        self.d.mr_mode = self.d.info.domain_attr.mr_mode
        self.d.inject_size = self.d.info.tx_attr.inject_size
        self.d.manual = self.d.info.domain_attr.data_progress == FI_PROGRESS_MANUAL
        cdef fi_info* rma = self.d.rma_info if self.d.split else self.d.info
        self.d.ordered = _raw_ordered(rma) and os.environ.get("GEXMK_OFI_ORDERED_FLUSH", "1") != "0"
        self.d.max_order_raw = rma.ep_attr.max_order_raw_size
        cdef fi_av_attr av_attr
        memset(&av_attr, 0, sizeof(av_attr))
        av_attr.type = FI_AV_TABLE
        try:
            check("fi_fabric", fi_fabric(self.d.info.fabric_attr, &self.d.fabric, NULL))
            check("fi_domain", fi_domain(self.d.fabric, self.d.info, &self.d.domain, NULL))
            check("fi_av_open", fi_av_open(self.d.domain, &av_attr, &self.d.av, NULL))
        except BaseException:
            self.close()
            raise

    @property
    def split_endpoints(self):
        """True when each endpoint is a pair: RMA without FI_ATOMIC (so that
        the provider orders reads after writes) and a second one for atomics."""
        return bool(self.d.split)

    @property
    def manual_progress(self):
        """True when targets must poll (FI_PROGRESS_MANUAL): a progress thread does."""
        return bool(self.d.manual)

    @property
    def ordered_flush(self):
        """True when implicit puts complete remotely by a read-after-write flush
        (FI_ORDER_RAW), and up to which size; else they ask for delivery completion."""
        return bool(self.d.ordered), self.d.max_order_raw

    @property
    def mr_mode(self):
        return self.d.mr_mode

    @property
    def inject_size(self):
        return self.d.inject_size

    def insert(self, bytes name):
        """(fi_addr for RMA, fi_addr for atomics) of a peer endpoint's name
        (inserted once, cached).  A split endpoint's name holds both of its
        addresses; a single endpoint gets the same fi_addr twice."""
        cdef fi_addr_t a[2]
        cdef const char* p
        cdef size_t count = 1
        cached = self._addrs.get(name)
        if cached is not None:
            return cached
        split = name.startswith(_SPLIT_TAG)
        if split != bool(self.d.split):
            raise CommunicationError(
                f"a peer's ofi endpoint is {'split' if split else 'single'}, this process's is "
                f"{'split' if self.d.split else 'single'}: the job's processes disagree on the "
                f"libfabric set-up (same libfabric, provider and GEXMK_OFI_SPLIT everywhere?)")
        raw = name[len(_SPLIT_TAG):] if split else name
        if split:
            if len(raw) == 0 or len(raw) % 2:
                raise CommunicationError(f"a split endpoint name of {len(raw)} bytes: not two "
                                         f"addresses of equal length")
            count = 2               # two names of equal length, packed as fi_av_insert takes them
        p = raw
        rc = fi_av_insert(self.d.av, p, count, a, 0, NULL)
        if rc != <int>count:
            check("fi_av_insert", rc if rc < 0 else -FI_EINVAL)
        out = (a[0], a[1] if split else a[0])
        self._addrs[name] = out
        return out

    def map_key(self, key, uint64_t base):
        """The 64-bit key to use for a peer's registration: its key itself, or
        for FI_MR_RAW providers the local mapping of its raw key (cached)."""
        cdef uint64_t out = 0
        cdef bytes raw
        if isinstance(key, int):
            return key
        raw = key
        cached = self._raw_keys.get((raw, base))
        if cached is not None:
            return cached
        check("fi_mr_map_raw", fi_mr_map_raw(self.d.domain, base, <uint8_t*><char*>raw, len(raw),
                                             &out, 0))
        self._raw_keys[(raw, base)] = out
        return out

    def endpoint(self):
        """A new libfabric endpoint with its own CQ, for one gexmk endpoint."""
        if self.closed:
            raise StateError("the ofi domain is closed")
        if self.d.neps >= MAX_EPS:
            raise UnsupportedError(f"more than {MAX_EPS} network endpoints in one process")
        ep = Endpoint._make(self)
        self._eps.append(ep)
        self.d.eps[self.d.neps] = &(<Endpoint>ep).e
        gx_fence()
        gx_add_long(&self.d.neps, 1)
        return ep

    # -- progress thread --

    def start_progress(self, bint spin=False):
        """Start the background progress thread (idempotent): manual-progress
        providers need the target to poll for puts and gets to complete.  By
        default it sleeps in the CQ's wait object between events; ``spin``
        makes it poll continuously (lowest latency, one core busy)."""
        if self._thread is not None:
            return
        self._spin = spin
        # endpoints opened from now on get a CQ the thread can sleep on (those
        # opened before keep theirs and are polled with naps)
        self.d.cq_wait = not spin
        self._thread = threading.Thread(target=self._progress_loop, name="gexmk-ofi-progress",
                                        daemon=True)
        self._thread.start()

    def _progress_loop(self):
        # Runs without the GIL from start to end: it must keep serving peers
        # while application threads hold the GIL.
        with nogil:
            _progress_thread(&self.d, self._spin, &self._stop_flag)

    def stop_progress(self):
        """Stop and join the progress thread (idempotent)."""
        cdef double deadline
        if self._thread is None:
            return
        self._stop_flag = 1
        deadline = _now() + 10
        while self._thread.is_alive() and _now() < deadline:
            for e in self._eps:
                # only a CQ with a wait object can be signalled (shm's has none)
                if not (<Endpoint>e).closed and (<Endpoint>e).e.cq != NULL \
                        and (<Endpoint>e).e.can_wait:
                    fi_cq_signal((<Endpoint>e).e.cq)
                    if (<Endpoint>e).e.acq != NULL:
                        fi_cq_signal((<Endpoint>e).e.acq)
            self._thread.join(0.05)
        if self._thread.is_alive():
            raise StateError("the ofi progress thread did not stop; not closing its endpoints")
        self._thread = None
        self._stop_flag = 0

    def close(self):
        """Close every endpoint, the AV, domain and fabric (idempotent)."""
        if self.closed:
            return
        self.stop_progress()
        for e in self._eps:
            (<Endpoint>e).close()
        self._eps = []
        self.closed = True
        for k in self._raw_keys.values():
            fi_mr_unmap_key(self.d.domain, k)
        self._raw_keys = {}
        if self.d.av != NULL:
            fi_close(&self.d.av.fid)
            self.d.av = NULL
        if self.d.domain != NULL:
            fi_close(&self.d.domain.fid)
            self.d.domain = NULL
        if self.d.fabric != NULL:
            fi_close(&self.d.fabric.fid)
            self.d.fabric = NULL
        if self.d.info != NULL:
            fi_freeinfo(self.d.info)
            self.d.info = NULL
        if self.d.rma_info != NULL:
            fi_freeinfo(self.d.rma_info)
            self.d.rma_info = NULL
        self.d.split = 0

    def __dealloc__(self):
        if not self.closed:
            self.close()

    def __repr__(self):
        return f"<gexmk.ofi Domain {self.provider} on {self.domain_name}>"


cdef void _progress_thread(ofi_dom* d, bint spin, volatile int* stop) noexcept nogil:
    cdef timespec ts
    cdef fi_cq_entry entries[16]
    cdef ssize_t got
    cdef long i, n
    cdef ofi_ep* first
    cdef fid* cqfids[2]
    cdef int nfd
    cdef pollfd pfds[2]
    cdef double hot_until = 0
    cdef double idle
    # this thread's naps are short and frequent: 1 us timer slack, not 50
    prctl(PR_SET_TIMERSLACK, 1000, 0, 0, 0)
    while not stop[0]:
        idle = _now_coarse() - d.last_app
        if gx_load_long(&d.waiters) > 0 or idle < STAND_ASIDE:
            # An application thread drives progress itself (or just did): stay
            # off its CQs and its CPU until it has left them alone for
            # STAND_ASIDE.  Nap until then, not in short steps: on 2 cores a
            # wake-up every 100 us costs a streaming sender ~3% of its bandwidth.
            idle = STAND_ASIDE - idle if idle < STAND_ASIDE else STAND_ASIDE / 4
            ts.tv_sec = 0
            ts.tv_nsec = <long>(idle * 1e9) + 50000
            nanosleep(&ts, NULL)
            if gx_load_long(&d.waiters) == 0:
                # an application that only issues (never waits) must not keep
                # this process's targets unserved: one pass per nap
                _progress_all(d)
            continue
        n = gx_load_long(&d.neps)
        if n == 0:
            ts.tv_sec = 0
            ts.tv_nsec = 1000000
            nanosleep(&ts, NULL)
            continue
        if spin or _now() < hot_until:
            # spin mode, or just woken by traffic: poll without sleeping for a
            # while (a request/response exchange will bring more at once; a
            # sleeping thread costs a wake-up per message).  Passes come in
            # bursts: a clock read and a yield per pass cost a receiving target
            # ~10% of its bandwidth; an application thread that starts to wait
            # still takes over within one pass.
            for i in range(16):
                _progress_all(d)
                if gx_load_long(&d.waiters) > 0:
                    break
            sched_yield()
            continue
        # One endpoint with a wait fd: sleep in the CQ's wait object, woken at
        # once by traffic (which it then progresses), free while idle.
        # Otherwise (several endpoints, or shm without a wait fd): poll all
        # with short naps.
        gx_add_long(&d.readers, 1)
        gx_fence()
        first = d.eps[0] if gx_load_long(&d.neps) == 1 else NULL
        if first != NULL and first.can_wait:
            # fi_trywait says whether sleeping is safe (nothing left to
            # progress); then poll() the CQ's fd, as libfabric prescribes.
            cqfids[0] = &first.cq.fid
            nfd = 1
            if first.acq != NULL:
                cqfids[1] = &first.acq.fid
                nfd = 2
            if fi_trywait(d.fabric, cqfids, nfd) == 0:
                pfds[0].fd = first.wait_fd
                pfds[1].fd = first.await_fd
                pfds[0].events = pfds[1].events = POLLIN
                pfds[0].revents = pfds[1].revents = 0
                if poll(pfds, nfd, 20) > 0:
                    hot_until = _now() + 0.001
            else:
                hot_until = _now() + 0.001     # work was pending: stay awake
            _progress_quiet(first)
            gx_add_long(&d.readers, -1)
            continue
        gx_add_long(&d.readers, -1)
        _progress_all(d)
        ts.tv_sec = 0
        ts.tv_nsec = 20000
        nanosleep(&ts, NULL)


cdef fi_info* _with_ordering(fi_info* p) except NULL:
    """The chosen provider and domain again, asking for read-after-write
    ordering of data (providers report only the ordering that was asked for):
    that info when granted, else a copy of p."""
    cdef fi_info* hints = fi_dupinfo(p)
    cdef fi_info* got = NULL
    cdef fi_info* out
    cdef int rc
    if hints == NULL:
        raise MemoryError()
    hints.tx_attr.msg_order = FI_ORDER_RAW | FI_ORDER_RMA_RAW
    hints.ep_attr.max_order_raw_size = <size_t>-1
    with nogil:
        rc = fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &got)
    fi_freeinfo(hints)
    if rc == 0 and got != NULL and (got.tx_attr.msg_order & (FI_ORDER_RAW | FI_ORDER_RMA_RAW)) \
            and got.ep_attr.max_order_raw_size > 0:
        out = fi_dupinfo(got)
    else:
        out = fi_dupinfo(p)
    if got != NULL:
        fi_freeinfo(got)
    if out == NULL:
        raise MemoryError()
    return out


cdef bint _raw_ordered(fi_info* p) noexcept nogil:
    """Does p order the data of a read after that of earlier writes?"""
    return (p.tx_attr.msg_order & (FI_ORDER_RAW | FI_ORDER_RMA_RAW)) != 0 \
        and p.ep_attr.max_order_raw_size > 0


cdef fi_info* _ordered_without_atomics(fi_info* p) except? NULL:
    """The chosen provider and domain without FI_ATOMIC, asking for
    read-after-write ordering: that info when granted, else NULL."""
    cdef fi_info* hints = fi_dupinfo(p)
    cdef fi_info* got = NULL
    cdef fi_info* out = NULL
    cdef int rc
    if hints == NULL:
        raise MemoryError()
    hints.caps &= ~FI_ATOMIC
    hints.tx_attr.caps &= ~FI_ATOMIC
    hints.rx_attr.caps &= ~FI_ATOMIC
    hints.tx_attr.msg_order = FI_ORDER_RAW | FI_ORDER_RMA_RAW
    hints.ep_attr.max_order_raw_size = <size_t>-1
    with nogil:
        rc = fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &got)
    fi_freeinfo(hints)
    if rc == 0 and got != NULL and _raw_ordered(got):
        out = fi_dupinfo(got)
        if out == NULL:
            fi_freeinfo(got)
            raise MemoryError()
    if got != NULL:
        fi_freeinfo(got)
    return out


def _unlink_stale_shm_regions():
    """libfabric 1.17's shm provider names its region /dev/shm/<pid>:<n>:<m>
    and cannot unlink it when its process is SIGKILLed; a later process that
    gets the same pid then fails fi_enable with EBUSY.  Before this process
    has opened any shm endpoint, every region with its pid is such a leftover."""
    prefix = f"{os.getpid()}:"
    try:
        names = os.listdir("/dev/shm")
    except OSError:
        return
    for name in names:
        if name.startswith(prefix):
            try:
                os.unlink(os.path.join("/dev/shm", name))
            except OSError:
                pass


cdef char* _strdup(bytes s):
    # libfabric frees prov_name with fi_freeinfo: allocate with the C allocator
    cdef size_t n = len(s)
    cdef char* p = <char*>calloc(n + 1, 1)
    memcpy(p, <char*>s, n)
    return p


cdef class Endpoint:
    """One libfabric endpoint + CQ (+ the registration of a bound segment)."""
    cdef ofi_ep e
    cdef readonly Domain domain
    cdef readonly bytes name
    cdef readonly bint closed

    @staticmethod
    cdef Endpoint _make(Domain dom):
        cdef Endpoint ep = Endpoint.__new__(Endpoint)
        cdef fi_cq_attr cq_attr
        cdef char buf[256]
        cdef size_t blen = sizeof(buf)
        memset(&ep.e, 0, sizeof(ep.e))
        ep.domain = dom
        ep.e.dom = &dom.d
        memset(&cq_attr, 0, sizeof(cq_attr))
        cq_attr.format = FI_CQ_FORMAT_CONTEXT
        cq_attr.wait_obj = FI_WAIT_FD         # the progress thread sleeps on its fd
        cq_attr.size = 0
        cdef fi_wait_obj wobj = FI_WAIT_NONE
        cdef char abuf[256]
        cdef size_t alen = sizeof(abuf)
        try:
            if dom.d.split:
                check("fi_endpoint", fi_endpoint(dom.d.domain, dom.d.rma_info, &ep.e.ep, NULL))
                check("fi_endpoint (atomics)", fi_endpoint(dom.d.domain, dom.d.info, &ep.e.aep, NULL))
            else:
                check("fi_endpoint", fi_endpoint(dom.d.domain, dom.d.info, &ep.e.ep, NULL))
            # A wait fd only for a progress thread that sleeps on it.  It is not
            # free: the provider signals it on every completion (two syscalls
            # per op on tcp;ofi_rxm, ~1.5 us of an 8 B put's 6-7 us), and rxm
            # then hands its internal connections a wait object too.  Spinning
            # or absent progress threads get a plain polled CQ.
            if dom.d.cq_wait and \
                    fi_cq_open(dom.d.domain, &cq_attr, &ep.e.cq, NULL) == 0 and \
                    fi_control(&ep.e.cq.fid, FI_GETWAIT, &ep.e.wait_fd) == 0:
                wobj = FI_WAIT_FD
            else:
                if ep.e.cq != NULL:
                    fi_close(&ep.e.cq.fid)
                    ep.e.cq = NULL
                # no wait fd wanted, or none to be had (shm): a polled CQ.
                # (FI_WAIT_UNSPEC would give shm a "yield" wait that spins a
                # core inside fi_cq_sread.)
                cq_attr.wait_obj = FI_WAIT_NONE
                check("fi_cq_open", fi_cq_open(dom.d.domain, &cq_attr, &ep.e.cq, NULL))
            # Sleep in fi_cq_sread only on a real wait object (fd, mutex/cond);
            # a "yield" wait (shm) spins a core, so that CQ is polled with naps.
            ep.e.can_wait = wobj == FI_WAIT_FD or wobj == FI_WAIT_MUTEX_COND \
                or wobj == FI_WAIT_POLLFD
            check("fi_ep_bind(cq)", fi_ep_bind(ep.e.ep, &ep.e.cq.fid, FI_TRANSMIT | FI_RECV))
            check("fi_ep_bind(av)", fi_ep_bind(ep.e.ep, &dom.d.av.fid, 0))
            check("fi_enable", fi_enable(ep.e.ep))
            check("fi_getname", fi_getname(&ep.e.ep.fid, buf, &blen))
            if dom.d.split:
                # its own CQ, of the same kind (see _progress_quiet)
                cq_attr.wait_obj = FI_WAIT_FD if ep.e.can_wait else FI_WAIT_NONE
                check("fi_cq_open (atomics)", fi_cq_open(dom.d.domain, &cq_attr, &ep.e.acq, NULL))
                if ep.e.can_wait:
                    check("fi_control(FI_GETWAIT)", fi_control(&ep.e.acq.fid, FI_GETWAIT,
                                                                &ep.e.await_fd))
                check("fi_ep_bind(cq)", fi_ep_bind(ep.e.aep, &ep.e.acq.fid, FI_TRANSMIT | FI_RECV))
                check("fi_ep_bind(av)", fi_ep_bind(ep.e.aep, &dom.d.av.fid, 0))
                check("fi_enable", fi_enable(ep.e.aep))
                check("fi_getname", fi_getname(&ep.e.aep.fid, abuf, &alen))
            else:
                ep.e.aep = ep.e.ep
        except BaseException:
            ep.close()
            raise
        if dom.d.split:
            if alen != blen:
                ep.close()
                raise CommunicationError(f"fi_getname: the RMA and atomics endpoints have names of "
                               f"different lengths ({blen}, {alen})")
            ep.name = _SPLIT_TAG + buf[:blen] + abuf[:alen]
        else:
            ep.name = buf[:blen]
        return ep

    @property
    def handle(self):
        """Address of the C state, for the core's team structures."""
        return <uintptr_t>&self.e

    def bind(self, uintptr_t addr, size_t size):
        """Register [addr, addr+size) for remote access; returns (key, base):
        what peers need to address it (base is addr with FI_MR_VIRT_ADDR, else 0)."""
        cdef fid_mr* mr = NULL
        cdef uint64_t key = 0
        cdef uint64_t access = FI_REMOTE_READ | FI_REMOTE_WRITE | FI_READ | FI_WRITE
        if self.e.dom.info.caps & FI_ATOMIC:
            access |= FI_REMOTE_READ | FI_REMOTE_WRITE
        self.unbind()
        if not (self.e.dom.mr_mode & FI_MR_PROV_KEY):
            key = self.e.dom.next_key
            self.e.dom.next_key += 1
        with nogil:
            check("fi_mr_reg", fi_mr_reg(self.e.dom.domain, <void*>addr, size, access, 0, key, 0,
                                         &mr, NULL))
        try:
            if self.e.dom.mr_mode & FI_MR_ENDPOINT:
                check("fi_mr_bind", fi_mr_bind(mr, &self.e.ep.fid, 0))
                check("fi_mr_enable", fi_mr_enable(mr))
        except BaseException:
            fi_close(&mr.fid)
            raise
        self.e.seg_mr = mr
        self.e.seg_desc = fi_mr_desc(mr)
        self.e.seg_lo = addr
        self.e.seg_hi = addr + size
        base = addr if (self.e.dom.mr_mode & FI_MR_VIRT_ADDR) else 0
        if self.e.dom.mr_mode & FI_MR_RAW:
            return self._raw_key(mr, base), base
        return fi_mr_key(mr), base

    cdef bytes _raw_key(self, fid_mr* mr, uint64_t base):
        """FI_MR_RAW: the key is an opaque byte string peers map with fi_mr_map_raw."""
        cdef uint8_t buf[256]
        cdef size_t size = sizeof(buf)
        cdef uint64_t b = base
        check("fi_mr_raw_attr", fi_mr_raw_attr(mr, &b, buf, &size, 0))
        return bytes(buf[:size])

    def unbind(self):
        if self.e.seg_mr != NULL:
            fi_close(&self.e.seg_mr.fid)
            self.e.seg_mr = NULL
            self.e.seg_desc = NULL
            self.e.seg_lo = self.e.seg_hi = 0

    cdef void _unregister(self) noexcept:
        """Take this endpoint out of the domain's list, then wait until no
        thread still walks the list (so none can poll its CQ once closed)."""
        cdef ofi_dom* d = self.e.dom
        cdef long i, n = d.neps
        cdef timespec ts
        for i in range(n):
            if d.eps[i] == &self.e:
                d.eps[i] = d.eps[n - 1]
                gx_fence()
                gx_add_long(&d.neps, -1)
                break
        gx_fence()
        with nogil:
            while gx_load_long(&d.readers) > 0:
                if self.e.can_wait and self.e.cq != NULL:
                    fi_cq_signal(self.e.cq)      # cut a progress thread's sleep short
                    if self.e.acq != NULL:
                        fi_cq_signal(self.e.acq)
                ts.tv_sec = 0
                ts.tv_nsec = 50000
                nanosleep(&ts, NULL)

    @property
    def can_wait(self):
        """True when the progress thread may sleep in this CQ's wait object."""
        return bool(self.e.can_wait)

    def progress(self):
        """Poll the CQ once (completions, manual progress); returns how many completed."""
        if self.closed:
            return 0
        return _progress(&self.e)

    def nbi_pending(self):
        """Implicit ops not known to be complete, by category: (get, put, rmw).
        Puts count those in flight plus one per target still owing a flush."""
        cdef int i, owed = 0
        for i in range(MAX_TOUCHED):
            if self.e.touched[i] != NULL:
                owed += 1
        return (self.e.nbi[0], self.e.nbi[1] + owed, self.e.nbi[2])

    def close(self):
        """Close (idempotent): waits briefly for outstanding ops first."""
        if self.closed:
            return
        self.closed = True
        cdef int spins = 0
        if self.e.cq != NULL:
            while (self.e.nbi[0] or self.e.nbi[1] or self.e.nbi[2]) and spins < 100000:
                _progress_quiet(&self.e)
                spins += 1
        self._unregister()
        self.unbind()
        if self.e.aep != NULL and self.e.aep != self.e.ep:
            fi_close(&self.e.aep.fid)
        self.e.aep = NULL
        if self.e.acq != NULL:
            fi_close(&self.e.acq.fid)
            self.e.acq = NULL
        if self.e.ep != NULL:
            fi_close(&self.e.ep.fid)
            self.e.ep = NULL
        if self.e.cq != NULL:
            fi_close(&self.e.cq.fid)
            self.e.cq = NULL
