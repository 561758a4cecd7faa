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
    ISSUE_POISONED = -1000002 # ... stayed full after a peer's death over shm (_poisoned)
    ISSUE_TIMEOUT = -1000001  # the queue stayed full past GEXMK_TIMEOUT
    ISSUE_GONE = -1000003     # ... because the target endpoint closed since its publication

cdef ssize_t _issue_atomic(ofi_ep* ep, ofi_peer* t, uintptr_t remote, int dt, fi_op fop, int family,
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
        if not _again(rc, ep, t):
            return rc
        rc = _retry(ep, t, &deadline)
        if rc:
            return rc


cdef int _post_atomic(ofi_ep* ep, ofi_peer* t, uintptr_t remote, int dt, fi_op fop, int family,
                      gx_op* op) except -1 nogil:
    """Post, or drop the op and raise."""
    cdef ssize_t rc = _issue_atomic(ep, t, remote, dt, fop, family, op)
    if rc >= 0:
        return 0
    _drop_new(op)
    return _issue_failed(t, rc, "fi_atomic")


cdef int net_atomic(void* epv, ofi_peer* t, uintptr_t remote, int dt, int code,
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
    if family == 0 and _valid(ep, 1, dt, fop, code):
        # A non-fetching op goes as its fetching form (the value fetched is
        # dropped): its completion must mean the target applied it (a blocking
        # op returns, an event completes, quiet returns), and libfabric's
        # default completion for one that fetches nothing is transmit
        # completion -- shm gives it once the command is queued, before the
        # target applies it.  A fetching op completes with the target's
        # answer.  (FI_DELIVERY_COMPLETE would say the same, but shm 1.17
        # then frees the op's inject buffer twice and corrupts later injected
        # writes.)  rxm answers every atomic anyway: no cost there.
        family = 1
    if not _valid(ep, family, dt, fop, code):
        # The provider lacks this op/type: a compare-and-swap loop is still exact.
        _cas_loop(ep, t, remote, dt, code, a, b, result)
        return 0
    op = _new_op(ep, t, mode if mode != GX_NBI_LCNOW else GX_NBI, GX_CAT_RMW)
    op.operand = na
    if family == 2:          # libfabric: compare is the expected value, buf the new one
        op.compare = a
        op.operand = b
    _post_atomic(ep, t, remote, dt, fop, family, op)
    if mode == GX_NB:
        out[0] = op
        return 0
    if mode != GX_BLOCKING:
        return 0
    return _wait_op(op, t, "atomic", result)


cdef int _cas_loop(ofi_ep* ep, ofi_peer* t, uintptr_t remote, int dt, int code,
                   gx_val a, gx_val b, gx_val* result) except -1 nogil:
    """Emulate an op the provider lacks: read, compute locally, compare-and-swap."""
    cdef int udt = GX_DT_U32 if gx_dt_size(dt) == 4 else GX_DT_U64
    cdef gx_val old, new, seen
    cdef gx_op* op
    if not _valid(ep, 2, udt, FI_CSWAP, GX_OP_FCAS) or not _valid(ep, 1, udt, FI_ATOMIC_READ, GX_OP_GET):
        with gil:
            raise UnsupportedError("atomic: this provider offers neither the op nor "
                                   "compare-and-swap for its size")
    op = _new_op(ep, t, GX_BLOCKING, GX_CAT_RMW)
    _post_atomic(ep, t, remote, udt, FI_ATOMIC_READ, 1, op)
    _wait_op(op, t, "atomic", &old)
    while True:
        new = old
        gx_atomic_local(&new, dt, code, a, b, NULL)    # the op applied to a private copy
        op = _new_op(ep, t, GX_BLOCKING, GX_CAT_RMW)
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


