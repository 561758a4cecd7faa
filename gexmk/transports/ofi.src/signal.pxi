# ---- put_signal: the data, then the signal, never the other way round --------------
#
# The signal must never be visible before the data, whatever ordering the
# provider grants; concurrent signals from several ranks to one word stay
# atomic with each other and with fi_atomic; a blocking put_signal waits only
# for local completion (NVSHMEM putmem_signal).  Three ways, chosen per
# domain (Domain.put_signal_mode), the first the provider allows:
#
# - ordered: one endpoint carries RMA and atomics and orders an RMA write
#   before a later atomic write (FI_ORDER_WAW, with max_order_waw_size: shm).
#   The data write and the signal atomic go back to back.
# - message: split endpoints (tcp;ofi_rxm: rxm atomics are messages that RMA
#   may pass, and a second connection besides).  The RMA endpoint grants
#   send-after-write ordering (FI_ORDER_SAW, data ordered up to
#   max_order_waw_size): the data write, then a 32-byte message naming the
#   word, on the same endpoint.  The target's CQ hands the message to
#   _sig_landed once the data has landed; it applies the signal with a CPU
#   atomic (seq_cst, like libfabric's own software atomics, which rxm runs on
#   the same words; gexmk.h's gx_signal_local), wakes futex sleepers and
#   reposts the receive.  Remote completion (quiet) is the RMA endpoint's
#   flush: a read ordered after the message (FI_ORDER_RAS) completes once
#   the target's provider has taken it in; its CQ entry is applied by the
#   target's next progress pass (its waits and its progress thread make them).
#   A signal that fits (SIG_DATA_*: a word in the segment's first 128 MiB, a
#   value below 2**36; data of at least a byte) needs no message: it rides
#   on the data write as its remote CQ data (fi_inject_writedata), and the
#   target's CQ hands it over, without a context, once the write has landed
#   (_sig_data_landed).  One send where there were two: over tcp each costs
#   about a microsecond-scale syscall plus the receiver's softirq.  It keeps
#   the message's order (same endpoint, same stream) and its flush.
# - delivery: the put with FI_DELIVERY_COMPLETE, then the signal atomic.
#   FI_FENCE on the atomic would avoid the round trip, but tcp, rxm and shm
#   ignore the flag in libfabric 1.17, so it is not used.
#
# Every put_signal to a target goes the same way (NB ones too: their event is
# the flush's read), so that two of them from one rank to one word land in
# issue order, as they do on the other ways.  signal_op is an atomic: over
# split endpoints it is not ordered with put_signal's messages but by
# fence/quiet (NVSHMEM asks no more).


cdef int ofi_put_signal(gx_xfer* x) except -1 nogil:
    """put_signal over the network (the table's slot); see above."""
    cdef gx_val zero
    cdef ofi_peer* t = <ofi_peer*>x.peer
    cdef ofi_ep* ep = <ofi_ep*>x.ep
    cdef int mode = x.mode
    cdef int amode
    if x.stream != NULL:
        return _no_stream(x, "put_signal")
    _check_open(ep, t, "put_signal")
    if x.sig_addr & 7:
        with gil:
            from gexmk.errors import BoundsError
            raise BoundsError(f"put_signal: signal address 0x{x.sig_addr:x} is not aligned to 8 bytes")
    zero.u64 = 0
    # the signal's completion mode: blocking and LCNOW ask for local completion only
    amode = GX_NB if mode == GX_NB else GX_NBI
    if t.stg or _stg_local(ep, x):
        x.mode = GX_BLOCKING
        try:
            stg_rma(x, True)
        finally:
            x.mode = mode
    elif t.hmem:
        # a native device target (hmem.pxi): the data lands directly, its
        # signal is run by the target's lander, after the data's delivery
        gx_add_long(&ep.dom.n_sig_delivery, 1)
        net_put(x.ep, t, x.remote, x.local, x.n, GX_BLOCKING, NULL)
    elif ep.dom.sig_ordered and x.n <= ep.dom.sig_order_max:
        gx_add_long(&ep.dom.n_sig_ordered, 1)
        return _put_signal_ordered(ep, t, x, amode)
    elif ep.dom.sig_msg and t.sig_rx and x.n <= ep.dom.sig_order_max:
        gx_add_long(&ep.dom.n_sig_msg, 1)
        return _put_signal_msg(ep, t, x)
    else:
        gx_add_long(&ep.dom.n_sig_delivery, 1)
        net_put(x.ep, t, x.remote, x.local, x.n, GX_BLOCKING, NULL)
    if t.stg or t.hmem:
        stg_amo(ep, t, x.sig_addr, GX_DT_U64,
                GX_OP_SET if x.op == GX_SIGNAL_SET else GX_OP_ADD, x.a, zero, NULL)
        if x.handle != NULL:
            x.handle[0] = NULL
        return 0
    return net_atomic(x.ep, t, x.sig_addr, GX_DT_U64,
                      GX_OP_SET if x.op == GX_SIGNAL_SET else GX_OP_ADD, x.a, zero, NULL,
                      amode, x.handle)


cdef int _post_data(ofi_ep* ep, fid_ep* fep, ofi_peer* t, gx_xfer* x, gx_op** out,
                    bint with_data=False, uint64_t data=0) except -1 nogil:
    """The data write of a put_signal, with no wait for the target: injected
    up to the inject size (copied at issue; *out = NULL), else a write with
    transmit completion whose op goes to *out, for the caller to wait on (the
    source is reusable once it completes) after posting the signal.  With
    with_data, the write carries ``data`` as its remote CQ data."""
    cdef gx_op* op = NULL
    cdef void* desc
    cdef iovec iov
    cdef fi_rma_iov riov
    cdef fi_msg_rma msg
    cdef ssize_t rc = 0
    cdef double deadline = 0
    out[0] = NULL
    if x.n == 0:
        return 0
    if x.n <= ep.dom.inject_size and not _in_hmem(ep, x.local, x.n):
        return _inject_write(ep, fep, t, x.local, x.n, _raddr(t, x.remote), t.net_key,
                             with_data, data, "fi_inject_write (put_signal)")
    op = _new_op(ep, t, GX_BLOCKING, GX_CAT_PUT)
    rc = _desc(ep, op, x.local, x.n, FI_WRITE, &desc)
    if rc < 0:
        _drop_new(op)
        return check("fi_mr_reg", rc)
    iov.iov_base = x.local
    iov.iov_len = x.n
    riov.addr = _raddr(t, x.remote)
    riov.len = x.n
    riov.key = t.net_key
    memset(&msg, 0, sizeof(msg))
    msg.msg_iov = &iov
    msg.desc = &desc
    msg.iov_count = 1
    msg.addr = t.net_addr
    msg.rma_iov = &riov
    msg.rma_iov_count = 1
    msg.context = op
    msg.data = data
    while True:
        rc = fi_writemsg(fep, &msg, FI_COMPLETION | (FI_REMOTE_CQ_DATA if with_data else 0))
        if not _again(rc, ep, t):
            break
        rc = _retry(ep, t, &deadline)
        if rc:
            break
    if rc < 0:
        _drop_new(op)
        return _issue_failed(t, rc, "fi_writemsg (put_signal)")
    out[0] = op
    return 0


cdef int _put_signal_ordered(ofi_ep* ep, ofi_peer* t, gx_xfer* x, int amode) except -1 nogil:
    """The data write and the signal atomic posted back to back on the one
    endpoint that carries both (not split: ep.aep is ep.ep), which orders
    them (Domain.sig_ordered)."""
    cdef gx_val zero
    cdef gx_op* op = NULL
    cdef bint ok = False
    zero.u64 = 0
    _app_active(ep.dom)
    _post_data(ep, ep.aep, t, x, &op)
    try:
        net_atomic(ep, t, x.sig_addr, GX_DT_U64,
                   GX_OP_SET if x.op == GX_SIGNAL_SET else GX_OP_ADD, x.a, zero, NULL,
                   amode, x.handle)
        ok = True
    finally:
        if op != NULL and not ok:
            _orphan(op)         # the write still owns its context until it completes
    if op != NULL:
        _wait_op(op, t, "put_signal (local completion of the data)")
    return 0


cdef int _put_signal_msg(ofi_ep* ep, ofi_peer* t, gx_xfer* x) except -1 nogil:
    """The data write, then the signal message, both on the RMA endpoint
    (Domain.sig_msg: FI_ORDER_SAW); the target remembered for the flush
    that completes the signal remotely (quiet), or for GX_NB a flush read of
    its own (FI_ORDER_RAS) handed out as the event."""
    cdef uint64_t m[4]
    cdef gx_op* op = NULL
    cdef gx_op* rd
    cdef void* desc
    cdef ssize_t rc = 0
    cdef double deadline = 0
    cdef bint ok = False
    cdef uint64_t off = x.sig_addr - t.g.remote_base
    _app_active(ep.dom)
    if t.sig_data and x.n > 0 and x.a.u64 <= SIG_DATA_VAL_MAX and (off >> 3) <= SIG_DATA_IDX_MAX:
        # the signal rides on the write (see the top of this file)
        gx_add_long(&ep.dom.n_sig_data, 1)
        _post_data(ep, ep.ep, t, x, &op, True,
                   (<uint64_t>(SIG_DATA_ADD if x.op == GX_SIGNAL_ADD else SIG_DATA_SET)
                    << SIG_DATA_KIND_SHIFT)
                   | ((t.sig_gen & 3) << SIG_DATA_GEN_SHIFT)
                   | ((off >> 3) << SIG_DATA_IDX_SHIFT) | x.a.u64)
        if op != NULL:
            _wait_op(op, t, "put_signal (local completion of the data)")
        return _sig_msg_done(ep, t, x)
    _post_data(ep, ep.ep, t, x, &op)
    m[0] = _raddr(t, x.sig_addr)
    m[1] = x.a.u64
    m[2] = <uint64_t>x.op
    m[3] = t.sig_gen        # the binding it was published for (_sig_landed)
    try:
        while True:
            rc = fi_inject(ep.ep, m, sizeof(m), t.net_addr)
            if not _again(rc, ep, t):
                break
            rc = _retry(ep, t, &deadline)
            if rc:
                break
        if rc < 0:
            _issue_failed(t, rc, "fi_inject (put_signal's signal)")
        ok = True
    finally:
        if op != NULL and not ok:
            _orphan(op)
    if op != NULL:
        _wait_op(op, t, "put_signal (local completion of the data)")
    return _sig_msg_done(ep, t, x)


cdef int _sig_msg_done(ofi_ep* ep, ofi_peer* t, gx_xfer* x) except -1 nogil:
    """After a put_signal's signal left as a message or as remote CQ data:
    what completes it remotely, the flush (quiet, nbi_wait), or for GX_NB a
    flush read of its own handed out as the event."""
    cdef gx_op* rd
    cdef void* desc
    cdef ssize_t rc = 0
    cdef double deadline = 0
    if x.mode != GX_NB:
        # quiet/nbi_wait complete it: the flush's read is ordered after the message
        # (a put_signal's: nbi_wait(EC_PUT) does not report its target's death)
        return _ensure_flush(ep, t, False)
    rd = _new_op(ep, t, GX_NB, GX_CAT_GET)
    rc = _desc(ep, rd, &rd.result, 1, FI_READ, &desc)
    if rc < 0:
        _drop_new(rd)
        return check("fi_mr_reg", rc)
    while True:
        rc = fi_read(ep.ep, &rd.result, 1, desc, t.net_addr, t.net_base, t.net_key, rd)
        if not _again(rc, ep, t):
            break
        rc = _retry(ep, t, &deadline)
        if rc:
            break
    return _posted(rd, t, rc, GX_NB, x.handle, "fi_read (put_signal_nb's completion)", "put_signal")


# ---- the target's side: receives of signal messages ------------------------------

cdef int _sig_rx_open(ofi_ep* ep) except -1 nogil:
    """Post SIG_RX receives of signal messages on the RMA endpoint."""
    cdef int i
    cdef sig_rx* r
    ep.rx = <sig_rx*>calloc(SIG_RX, sizeof(sig_rx))
    if ep.rx == NULL:
        with gil:
            raise MemoryError()
    for i in range(SIG_RX):
        r = &ep.rx[i]
        r.op.ep = ep
        r.op.rx = 1
        if _sig_post(r) < 0:
            return check("fi_recv (signal messages)", -FI_EAGAIN)
    return 0


cdef int _sig_post(sig_rx* r) noexcept nogil:
    """(Re)post one receive; libfabric's code."""
    cdef ssize_t rc
    cdef int tries
    for tries in range(100000):
        rc = fi_recv(r.op.ep.ep0, r.msg, sizeof(r.msg), NULL, FI_ADDR_UNSPEC, &r.op)
        if rc != -FI_EAGAIN:
            return <int>rc
        sched_yield()
    return <int>rc


cdef void _sig_landed(gx_op* op, int err) noexcept nogil:
    """A signal message was received (from the CQ, by whichever thread read
    it): its data landed before it (FI_ORDER_SAW).  Apply it, repost."""
    cdef sig_rx* r = <sig_rx*>op
    cdef ofi_ep* ep = op.ep
    cdef uintptr_t word
    if err:
        return              # cancelled: the endpoint is closing
    if (r.msg[2] & <uint64_t>0xffffffff00000000ULL) == CONN_MSG:
        _conn_msg(ep.dom, r.msg[2], r.msg[0], r.msg[1])    # the connection cap's (conncap.pxi)
        _sig_post(r)
        return
    if (r.msg[3] & 0xff) != (ep.bind_gen & 0xff):
        # sent for a segment unbound since (a peer's stale publication): its
        # word may be another's in the segment bound now
        gx_add_long(&ep.dom.sig_bad, 1)
        _sig_post(r)
        return
    word = <uintptr_t>r.msg[0]
    if not (ep.dom.mr_mode & FI_MR_VIRT_ADDR):
        word += ep.seg_lo   # offset addressing: the network address is the offset
    _sig_apply(ep, word, r.msg[1], r.msg[2])
    _sig_post(r)


cdef void _sig_data_landed(ofi_ep* ep, uint64_t data) noexcept nogil:
    """A write carrying a signal as its remote CQ data has landed (from the
    CQ, by its one reader: _read_ep_cq): decode and apply it."""
    cdef uint64_t kind = data >> SIG_DATA_KIND_SHIFT
    cdef uint64_t op = GX_SIGNAL_SET if kind == SIG_DATA_SET else \
        (GX_SIGNAL_ADD if kind == SIG_DATA_ADD else <uint64_t>-1)      # -1: no kind, dropped
    if ((data >> SIG_DATA_GEN_SHIFT) & 3) != (ep.bind_gen & 3):
        op = <uint64_t>-1       # for a segment unbound since: dropped (see _sig_landed)
    _sig_apply(ep, ep.seg_lo + (((data >> SIG_DATA_IDX_SHIFT) & SIG_DATA_IDX_MAX) << 3),
               data & SIG_DATA_VAL_MAX, op)


cdef void _sig_apply(ofi_ep* ep, uintptr_t word, uint64_t value, uint64_t kind) noexcept nogil:
    """Apply a received signal (GX_SIGNAL_*) to the word of this endpoint's
    bound segment it names and wake sleepers; one naming anything else
    (another word, a bad kind, a device segment's endpoint) is counted in
    sig_bad and dropped."""
    if ep.seg_mr != NULL and ep.zone == NULL and word >= ep.seg_lo and word + 8 <= ep.seg_hi \
            and (word & 7) == 0 and (kind == GX_SIGNAL_SET or kind == GX_SIGNAL_ADD):
        gx_signal_local(<void*>word, value, <int>kind)
        gx_wake_waiters(ep.wake)
    else:
        gx_add_long(&ep.dom.sig_bad, 1)


cdef void _sig_rx_free(ofi_ep* ep) noexcept nogil:
    """After the endpoint and its CQ are closed (nothing refers to them)."""
    if ep.rx != NULL:
        free(ep.rx)
        ep.rx = NULL
