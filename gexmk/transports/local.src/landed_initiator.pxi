# The initiator's side of nbrhd-landed (the zone's layout, the lander and the
# control plane: landed.pxi).

# ---- the initiator ------------------------------------------------------------
#
# The loops return a status (LZ_OK, the owner's LZ_E*, or LZ_EDEAD / LZ_ETIME /
# LZ_ELOCAL) and never raise, so that a driver thread runs them for
# stream-ordered transfers without the GIL; the host-thread entry points turn
# a status into an exception (LZ_ELOCAL: the kind's copy raised already).

cdef int _lz_raise(lp_land* L, gx_target* t, int st) except -1 with gil:
    from gexmk.errors import BoundsError, CommunicationError, TimeoutError as GxTimeout
    who = f"job rank {t.jobrank}"
    if st == LZ_ELOCAL:
        return -1           # the kind's exception is set
    if st == LZ_EDEAD or (st == LZ_ETIME and t.dead):
        raise PeerDeadError(f"nbrhd-landed: {who} (pid {t.pid}) died during a transfer through "
                            "its landing zone")
    if st == LZ_ETIME:
        raise GxTimeout(f"nbrhd-landed: {who}'s lander did not answer within {L.timeout:g} s")
    if st == LZ_EBOUNDS:
        raise BoundsError(f"nbrhd-landed: {who} refused a request outside its segment "
                          "(or a misaligned atomic)")
    if st == LZ_ECOPY:
        raise CommunicationError(f"nbrhd-landed: the device copy at {who} failed (its segment "
                                 "destroyed, or its device in error?)")
    if st == LZ_ECLOSED:
        raise SegmentError(f"nbrhd-landed: {who} unbound or destroyed the segment (its landing "
                           "zone is closed); it must publish a segment again")
    if st == LZ_EASYNC:
        raise CommunicationError(f"nbrhd-landed: an earlier stream-ordered transfer to {who} "
                                 "failed (status reported here, the first after it)")
    raise UnsupportedError(f"nbrhd-landed: {who} cannot run this atomic on its device segment")


cdef inline uint64_t _lz_seq(uint64_t w) noexcept nogil:
    return w & ((<uint64_t>1 << LZ_SEQ_BITS) - 1)


cdef int _lz_wait(lp_land* L, gx_target* t, int s, uint64_t want) noexcept nogil:
    """Until slot s has served sequence number want: its status."""
    cdef uint64_t* words = <uint64_t*>(L.ring + _lz_words_off(L.slots))
    cdef uint64_t w
    cdef double deadline = 0
    cdef uint32_t seq
    cdef int i
    w = gx_lz_load(&words[s])
    if _lz_seq(w) < want:
        for i in range(2000):
            gx_cpu_relax()
            w = gx_lz_load(&words[s])
            if _lz_seq(w) >= want:
                break
    while _lz_seq(w) < want:
        if t.dead:
            return LZ_EDEAD
        if gx_load_int(<int*>(<char*>L.bell + LZ_CLOSED_OFF)):
            # the lander stopped before closing: what it served is final
            w = gx_lz_load(&words[s])
            if _lz_seq(w) < want:
                return LZ_ECLOSED
            break
        if deadline == 0:
            deadline = _lz_now() + L.timeout
        elif _lz_now() > deadline:
            return LZ_ETIME
        seq = gx_wake_enter(L.answer)
        w = gx_lz_load(&words[s])
        if _lz_seq(w) < want:
            gx_wake_sleep(L.answer, seq, 2000000)
        gx_wake_leave(L.answer)
        w = gx_lz_load(&words[s])
    if L.ok[s] < want:
        L.ok[s] = want
        if (w >> LZ_SEQ_BITS) != LZ_OK and _lz_seq(w) == want:
            return <int>(w >> LZ_SEQ_BITS)
    return LZ_OK


cdef int _lz_claim(lp_land* L, gx_target* t, int* slot) noexcept nogil:
    """The slot the next request goes to, once its previous request is served."""
    cdef int s = <int>(L.seq % <uint64_t>L.slots)
    slot[0] = s
    if L.last[s] > L.ok[s]:
        return _lz_wait(L, t, s, L.last[s])
    return LZ_OK


cdef void _lz_post(lp_land* L, uint64_t op, uint64_t off, uint64_t n, int dt=0, int aop=0,
                   uint64_t a=0, uint64_t b=0) noexcept nogil:
    """The next request's descriptor into its (claimed) slot, sequence number
    last, then the bell."""
    cdef uint64_t q = L.seq + 1
    cdef int s = <int>((q - 1) % <uint64_t>L.slots)
    cdef uint64_t* d = <uint64_t*>(L.ring + <size_t>s * LZ_DESC)
    d[1] = op
    d[2] = off
    d[3] = n
    d[4] = <uint64_t>dt
    d[5] = <uint64_t>aop
    d[6] = a
    d[7] = b
    gx_lz_publish(&d[15], q)
    gx_lz_publish(&d[0], q)
    L.seq = q
    L.last[s] = q
    L.touched = 1
    gx_wake_waiters(L.bell)


cdef int _lz_move(lp_ep* dev, char* dst, const char* src, size_t m) noexcept nogil:
    """Between a data slot and the local buffer: device memory by the kind of
    the endpoint ``dev`` (NULL: host memory), host memory by the copy pool's
    threads (one thread's memcpy, ~10 GB/s, would pace the transfer; the
    lander's DMA runs at ~50)."""
    if dev != NULL:
        if (<_lz_copy_fn>dev.k.ops.copy)(dev.k.kctx, NULL, <uintptr_t>dst, <uintptr_t>src, m) == -1:
            return LZ_ELOCAL
    elif _pool != NULL:
        gx_cpool_copy(_pool, dst, src, m)
    else:
        memcpy(dst, src, m)
    return LZ_OK


cdef int _lz_put(lp_land* L, gx_target* t, uint64_t off, const char* local, size_t n,
                 lp_ep* dev) noexcept nogil:
    """local into the owner's segment at off, chunk by chunk, slots ahead:
    landed on return (status)."""
    cdef int st = _lz_send(L, t, off, local, n, dev)
    return _lz_drain(L, t) if st == LZ_OK else st


cdef int _lz_send(lp_land* L, gx_target* t, uint64_t off, const char* local, size_t n,
                  lp_ep* dev) noexcept nogil:
    """_lz_put's requests, posted, not waited for (_lz_drain): status."""
    cdef size_t pos = 0, m
    cdef int s, st
    while pos < n:
        m = n - pos if n - pos < L.chunk else L.chunk
        st = _lz_claim(L, t, &s)
        if st == LZ_OK:
            st = _lz_move(dev, L.ring + L.data_off + <size_t>s * L.chunk, local + pos, m)
        if st != LZ_OK:
            return st
        _lz_post(L, LZ_PUT, off + pos, m)
        pos += m
    return LZ_OK


cdef int _lz_drain(lp_land* L, gx_target* t) noexcept nogil:
    """Every request posted so far answered (status)."""
    cdef int s, st
    for s in range(L.slots):
        if L.last[s] > L.ok[s]:
            st = _lz_wait(L, t, s, L.last[s])
            if st != LZ_OK:
                return st
    return LZ_OK


cdef int _lz_get(lp_land* L, gx_target* t, uint64_t off, char* local, size_t n,
                 lp_ep* dev) noexcept nogil:
    """The owner's segment at off into local, slots requests ahead (status)."""
    cdef size_t C = L.chunk, k = (n + L.chunk - 1) // L.chunk, posted = 0, got = 0, m
    cdef uint64_t qs[LZ_MAX_SLOTS]
    cdef int s, st
    while got < k:
        while posted < k and posted - got < <size_t>L.slots:
            m = n - posted * C if n - posted * C < C else C
            st = _lz_claim(L, t, &s)
            if st != LZ_OK:
                return st
            _lz_post(L, LZ_GET, off + posted * C, m)
            qs[posted % L.slots] = L.seq
            posted += 1
        s = <int>((qs[got % L.slots] - 1) % <uint64_t>L.slots)
        st = _lz_wait(L, t, s, qs[got % L.slots])
        if st == LZ_OK:
            m = n - got * C if n - got * C < C else C
            st = _lz_move(dev, local + got * C, L.ring + L.data_off + <size_t>s * C, m)
        if st != LZ_OK:
            return st
        got += 1
    return LZ_OK


cdef int _lz_amo(lp_land* L, gx_target* t, uint64_t off, int dt, int op, gx_val a, gx_val b,
                 gx_val* result) noexcept nogil:
    cdef uint64_t* words = <uint64_t*>(L.ring + _lz_words_off(L.slots))
    cdef int s, st
    st = _lz_claim(L, t, &s)
    if st != LZ_OK:
        return st
    _lz_post(L, LZ_AMO, off, 8, dt, op, a.u64, b.u64)
    st = _lz_wait(L, t, s, L.seq)
    if st == LZ_OK and result != NULL:      # stored before the done word
        result[0].u64 = gx_lz_load(&words[L.slots + s])
    return st


cdef inline void _lz_lock(lp_land* L) noexcept nogil:
    while gx_xchg_int(&L.lock, 1) != 0:
        sched_yield()


cdef int _lz_enter(lp_land* L, gx_target* t) except -1 nogil:
    """Take the target's lock; raise what an earlier stream-ordered transfer reported."""
    cdef int st
    _lz_lock(L)
    st = gx_xchg_int(&L.async_err, 0)
    if st != LZ_OK:
        gx_xchg_int(&L.lock, 0)
        return _lz_raise(L, t, LZ_EASYNC)
    st = _lz_reopen(L, t)
    if st != LZ_OK:
        gx_xchg_int(&L.lock, 0)
        return _lz_raise(L, t, st)
    return 0


cdef int _lz_leave(lp_land* L, gx_target* t, int st) except -1 nogil:
    L.used = _lz_now()
    gx_xchg_int(&L.lock, 0)
    if st != LZ_OK:
        return _lz_raise(L, t, st)
    return 0


cdef lp_ep* _lz_local(gx_xfer* x) except? NULL nogil:
    """The endpoint whose kind copies x's local buffer (NULL: host memory)."""
    if x.local_kind == GX_MK_HOST:
        return NULL
    if x.ep == NULL or (<lp_ep*>x.ep).k.ops == NULL:
        with gil:
            raise UnsupportedError("nbrhd-landed: a device buffer must lie in the initiating "
                                   "endpoint's bound device segment")
    return <lp_ep*>x.ep


cdef int _landed_put(gx_xfer* x) except -1 nogil:
    cdef lp_land* L = <lp_land*>x.peer
    cdef lp_ep* dev
    if x.stream != NULL:
        return _landed_on_stream(x, True)
    dev = _lz_local(x)
    _lz_enter(L, x.t)
    _lz_leave(L, x.t, _lz_put(L, x.t, x.remote - x.t.remote_base, <char*>x.local, x.n, dev))
    _done(x)
    return 0


cdef int _landed_get(gx_xfer* x) except -1 nogil:
    cdef lp_land* L = <lp_land*>x.peer
    cdef lp_ep* dev
    if x.stream != NULL:
        return _landed_on_stream(x, False)
    dev = _lz_local(x)
    _lz_enter(L, x.t)
    _lz_leave(L, x.t, _lz_get(L, x.t, x.remote - x.t.remote_base, <char*>x.local, x.n, dev))
    _done(x)
    return 0


cdef int _landed_amo(lp_land* L, gx_target* t, uintptr_t remote, int dt, int op, gx_val a,
                     gx_val b, gx_val* result) except -1 nogil:
    if not L.amo:
        with gil:
            raise UnsupportedError(f"nbrhd-landed: job rank {t.jobrank}'s device segment has no "
                                   "device atomics (its memory kind has none)")
    _lz_enter(L, t)
    return _lz_leave(L, t, _lz_amo(L, t, remote - t.remote_base, dt, op, a, b, result))


cdef int _landed_atomic(gx_xfer* x) except -1 nogil:
    _landed_amo(<lp_land*>x.peer, x.t, x.remote, x.dt, x.op, x.a, x.b, x.result)
    _done(x)
    return 0


cdef int _landed_put_signal(gx_xfer* x) except -1 nogil:
    """The data (landed when the put returns), then the signal as an atomic
    run by the same lander: never visible before the data.  On a stream: the
    put's host functions, then one that has the lander run the signal."""
    cdef gx_val zero
    cdef int mode = x.mode
    cdef void** handle = x.handle
    if x.sig_addr & 7:
        return _sig_misaligned(x)
    if x.stream != NULL:
        # the data's host functions, then one that has the lander run the signal
        _landed_on_stream(x, True)
        _lz_launch(<lp_ep*>x.ep, x.stream, <lp_land*>x.peer, x.t, LZ_AMO,
                   x.sig_addr - x.t.remote_base, NULL, x.a.u64,
                   GX_OP_SET if x.op == GX_SIGNAL_SET else GX_OP_ADD)
        return 0
    zero.u64 = 0
    x.mode = GX_BLOCKING
    x.handle = NULL
    try:
        _landed_put(x)
    finally:
        x.mode = mode
        x.handle = handle
    _landed_amo(<lp_land*>x.peer, x.t, x.sig_addr, GX_DT_U64,
                GX_OP_SET if x.op == GX_SIGNAL_SET else GX_OP_ADD, x.a, zero, NULL)
    _done(x)
    return 0


# ---- stream order: the transfer as host functions on the caller's stream ---------
#
# put_on_stream / get_on_stream to pool memory of a peer: the host drives this
# path, so the transfer runs as host functions (cuLaunchHostFunc) in the
# caller's stream, after the kernels before it and before the work after it,
# with no host synchronisation.  Host memory goes to the lander directly;
# device memory through the endpoint's pinned bounce buffers, each piece
# copied on the stream into a buffer, then put by a host function (a get:
# the reverse), so a buffer is reused only after the stream has emptied it.
# A failure is kept (L.async_err) and raised by the next operation to the
# target.  Not inside a graph capture (the pieces' arguments and the bounce
# buffers are the transfer's, not every replay's).

cdef struct lz_job:            # one host function's piece of a stream-ordered transfer
    lp_land* L
    gx_target* t
    int op                     # LZ_PUT, LZ_GET, or LZ_AMO (a signal: n is its value, aop its op),
                               # or LZ_HOST_VIS (buf: _lz_vis_hostjob's block, n fragments, aop put)
    uint64_t off
    char* buf                  # host memory
    size_t n
    int aop


cdef void _lz_hostfn(void* arg) noexcept nogil:
    cdef lz_job* j = <lz_job*>arg
    cdef int st
    cdef gx_val a, zero
    _lz_lock(j.L)
    st = _lz_reopen(j.L, j.t, False)
    if st != LZ_OK:
        if j.op == LZ_HOST_VIS:
            free(j.buf)             # _lz_vis_hostjob's block, which it would have freed
    elif j.op == LZ_PUT:
        st = _lz_put(j.L, j.t, j.off, j.buf, j.n, NULL)
    elif j.op == LZ_GET:
        st = _lz_get(j.L, j.t, j.off, j.buf, j.n, NULL)
    elif j.op == LZ_HOST_VIS:
        st = _lz_vis_hostjob(j.L, j.t, j.buf, j.n, j.aop)
    else:
        a.u64 = j.n
        zero.u64 = 0
        st = _lz_amo(j.L, j.t, j.off, GX_DT_U64, j.aop, a, zero, NULL)
    j.L.used = _lz_now()
    gx_xchg_int(&j.L.lock, 0)
    if st != LZ_OK:
        gx_xchg_int(&j.L.async_err, st)
    free(j)


cdef int _lz_launch(lp_ep* ep, void* stream, lp_land* L, gx_target* t, int op, uint64_t off,
                    char* buf, size_t n, int aop=0) except -1 nogil:
    cdef lz_job* j = <lz_job*>calloc(1, sizeof(lz_job))
    if j == NULL:
        with gil:
            raise MemoryError()
    j.L = L
    j.t = t
    j.op = op
    j.aop = aop
    j.off = off
    j.buf = buf
    j.n = n
    cdef bint ok = False
    try:
        ep.k.ops.launch_host(ep.k.kctx, stream, <gx_host_fn>_lz_hostfn, j)
        ok = True
    finally:
        if not ok:
            free(j)         # never launched
    return 0


cdef int _lz_stream_ready(lp_ep* ep, lp_land* L, gx_xfer* x) except -1 nogil:
    """What a stream-ordered transfer to a landing zone needs: host functions
    on the stream, no capture; and an earlier one's failure raised."""
    if ep == NULL or ep.k.ops == NULL or ep.k.ops.launch_host == NULL:
        with gil:
            raise UnsupportedError("nbrhd-landed: a stream-ordered put or get needs the initiating "
                                   "endpoint's device kind to run host functions on the stream")
    if ep.k.ops.stream_capturing != NULL and ep.k.ops.stream_capturing(ep.k.kctx, x.stream):
        with gil:
            raise UnsupportedError("nbrhd-landed: a put or get to a peer's pool memory cannot be "
                                   "captured into a CUDA graph (its host functions' arguments and "
                                   "bounce buffers belong to one transfer)")
    if gx_load_int(&L.async_err) != LZ_OK:
        _lz_enter(L, x.t)           # raises it
        gx_xchg_int(&L.lock, 0)
    return 0


cdef int _lz_stream_dev(lp_ep* ep, lp_bounce* bb, int* b, void* stream, lp_land* L,
                        gx_target* t, bint put, uint64_t off, char* local,
                        size_t n) except -1 nogil:
    """n bytes of device memory at local, a bounce slot at a time (slot *b on,
    the caller holds bb): the kind's copy and a host function per slot, on
    the stream."""
    cdef size_t pos = 0, m, piece = bb.chunk
    cdef char* slot
    while pos < n:
        m = n - pos if n - pos < piece else piece
        slot = bb.buf + <size_t>(b[0] % bb.nbuf) * piece
        if put:
            ep.k.ops.copy(ep.k.kctx, stream, <uintptr_t>slot, <uintptr_t>local + pos, m)
            _lz_launch(ep, stream, L, t, LZ_PUT, off + pos, slot, m)
        else:
            _lz_launch(ep, stream, L, t, LZ_GET, off + pos, slot, m)
            ep.k.ops.copy(ep.k.kctx, stream, <uintptr_t>local + pos, <uintptr_t>slot, m)
        pos += m
        b[0] += 1
    return 0


cdef int _landed_on_stream(gx_xfer* x, bint put) except -1 nogil:
    cdef lp_ep* ep = <lp_ep*>x.ep
    cdef lp_land* L = <lp_land*>x.peer
    cdef uint64_t off = x.remote - x.t.remote_base
    cdef lp_bounce* bb
    cdef int b = 0
    _lz_stream_ready(ep, L, x)
    if x.n == 0:
        return 0
    if x.local_kind == GX_MK_HOST:
        return _lz_launch(ep, x.stream, L, x.t, LZ_PUT if put else LZ_GET, off, <char*>x.local, x.n)
    bb = _staged_bounce(ep)
    try:
        _bounce_drain_all(bb, &ep.k)        # earlier synchronous users of the buffers
        _lz_stream_dev(ep, bb, &b, x.stream, L, x.t, put, off, <char*>x.local, x.n)
        ep.k.ops.event_record(ep.k.kctx, x.stream, &bb.pend)   # the buffers are the stream's until then
    finally:
        gx_xchg_int(&bb.busy, 0)
    return 0
