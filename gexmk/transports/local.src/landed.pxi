# ---------------------------------------------------------------------------
# Device memory that cannot be exported, reached from the node (issue 9): the
# path "nbrhd-landed".
#
# Stream-ordered pool memory (cudaMallocAsync, CuPy's async allocator) has no
# shareable handle when it comes from a device's default pool, so a peer
# process cannot map it.  Its owner instead offers a *landing zone*: a memfd
# of host memory, pinned with the segment's kind, that every process of the
# node may map (its fd goes through the fd server after the SO_PEERCRED
# check, as device exports do).  The zone is
#
#   page 0        two gx_wake words: the owner's lander sleeps on `bell`,
#                 initiators waiting for an answer on `answer`
#   then          one ring per job rank (the initiators), laid out as the
#                 ofi transport's (ofi.src/staged.pxi): `slots` request
#                 descriptors of 16 words, done / result words, then `slots`
#                 data slots of `chunk` bytes.
#
# An initiator writes a chunk into a data slot (memcpy from host memory, or
# its own kind's copy out of its device segment), then the descriptor (its
# sequence number last, with release ordering), and rings the bell.  The
# owner's lander thread -- one per zone, so that it can sleep on the zone's
# own bell -- copies the chunk into the device segment with the segment's
# kind (or a get: out of it), runs atomics with the kind's device atomics,
# and stores the sequence number (status in the top byte) in the slot's done
# word, then wakes sleeping initiators.  As many chunks in flight as there are
# slots: the initiator fills slot i + 1 while the lander empties slot i.  A
# put is complete (landed in device memory) when it returns, in every mode.
#
# GEXMK_NBRHD_STAGE=all makes library-allocated host segments land the same
# way (memcpy and CPU atomics), so that CPU-only CI runs every step.
# ---------------------------------------------------------------------------
from libc.stdint cimport uint32_t
from cpython.exc cimport PyErr_Clear

cdef extern from *:
    """
    #include <stdint.h>
    static inline uint64_t gx_lz_load(const uint64_t *p)
    { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
    static inline void gx_lz_publish(uint64_t *p, uint64_t v)
    { __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }   /* a full barrier: gx_wake_waiters may follow */
    """
    uint64_t gx_lz_load(const uint64_t* p) nogil
    void gx_lz_publish(uint64_t* p, uint64_t v) nogil

cdef extern from "<time.h>" nogil:
    ctypedef long time_t
    cdef struct timespec:
        time_t tv_sec
        long tv_nsec
    int clock_gettime(int clk, timespec* ts)
    int nanosleep(const timespec* req, timespec* rem)
    enum: CLOCK_MONOTONIC

ctypedef int (*_lz_copy_fn)(void* kctx, void* stream, uintptr_t dst, uintptr_t src,
                            size_t n) noexcept nogil
ctypedef int (*_lz_atomic_fn)(void* kctx, void* stream, uintptr_t addr, int dt, int op,
                              gx_val a, gx_val b, void* result) noexcept nogil

cdef enum:
    LZ_MAX_SLOTS = 16
    LZ_DESC = 128              # bytes per descriptor: 16 words, word 15 repeats word 0
    LZ_HEAD = 4096             # the zone's first page: the wake words
    LZ_SEQ_BITS = 56
    LZ_PUT = 1
    LZ_GET = 2
    LZ_AMO = 3
    LZ_OK = 0
    LZ_EBOUNDS = 1
    LZ_ECOPY = 2
    LZ_EOP = 3
    LZ_EDEAD = 4               # initiator side: the owner died
    LZ_ETIME = 5               # ... did not answer within the timeout
    LZ_ELOCAL = 6              # ... the local copy (the endpoint's kind) raised
    LZ_EASYNC = 7              # ... an earlier stream-ordered transfer failed


cdef struct lz_zone:           # the owner's side of a landing zone
    char* mem                  # the memfd's mapping
    size_t bytes
    int nrings
    int slots
    size_t chunk
    size_t ring_bytes
    size_t data_off
    const gx_kind_ops* kops    # NULL: host memory (GEXMK_NBRHD_STAGE=all)
    void* kctx
    uintptr_t seg_base
    size_t seg_size
    gx_wake* seg_wake          # host segments: the segment's own wake word (its waiters)
    uint64_t* handled          # nrings * slots: the last sequence number served per slot
    int stop
    long landed


cdef struct lp_land:           # an initiator's view of a peer's landing zone
    char* ring                 # this process's ring in it (mapped here)
    gx_wake* bell
    gx_wake* answer
    int slots
    size_t chunk
    size_t data_off
    uint64_t seq
    uint64_t last[LZ_MAX_SLOTS]  # the last sequence number posted through each slot
    uint64_t ok[LZ_MAX_SLOTS]    # ... of those, the last one known served
    int lock                   # one operation at a time per target in this process
    int amo                    # the owner's kind runs atomics on the segment
    int async_err              # the first failure of a stream-ordered transfer, not yet raised
    double timeout


cdef inline size_t _lz_words_off(int slots) noexcept nogil:
    return <size_t>slots * LZ_DESC


cdef inline size_t _lz_data_off(int slots) noexcept nogil:
    return (_lz_words_off(slots) + 2 * 8 * <size_t>slots + 4095) & ~(<size_t>4095)


cdef inline double _lz_now() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


cdef int _lz_swallow() noexcept with gil:
    PyErr_Clear()
    return 0


# ---- the lander (owner side) ------------------------------------------------------

cdef int _lz_copy(lz_zone* z, uintptr_t dst, uintptr_t src, size_t n) noexcept nogil:
    if z.kops == NULL:
        memcpy(<void*>dst, <void*>src, n)
        return LZ_OK
    if (<_lz_copy_fn>z.kops.copy)(z.kctx, NULL, dst, src, n) == -1:
        _lz_swallow()
        return LZ_ECOPY
    return LZ_OK


cdef int _lz_serve(lz_zone* z, char* ring, int s, uint64_t* desc, uint64_t* words) noexcept nogil:
    """Serve the request in slot s of one ring: its status."""
    cdef uint64_t op = desc[1], off = desc[2], n = desc[3]
    cdef uintptr_t data = <uintptr_t>(ring + z.data_off + <size_t>s * z.chunk)
    cdef gx_val a, b, res
    cdef int st
    if op == LZ_AMO:
        n = 8
    if n > z.chunk or off > z.seg_size or n > z.seg_size - off:
        return LZ_EBOUNDS
    if op == LZ_PUT:
        return _lz_copy(z, z.seg_base + off, data, n)
    if op == LZ_GET:
        return _lz_copy(z, data, z.seg_base + off, n)
    if op != LZ_AMO:
        return LZ_EOP
    a.u64 = desc[6]
    b.u64 = desc[7]
    res.u64 = 0
    if (z.seg_base + off) & (gx_dt_size(<int>desc[4]) - 1):
        return LZ_EBOUNDS
    if z.kops == NULL:
        st = LZ_OK if gx_atomic_local(<void*>(z.seg_base + off), <int>desc[4], <int>desc[5],
                                      a, b, &res) == GX_OK else LZ_EOP
        if <int>desc[5] != GX_OP_GET:
            gx_wake_waiters(z.seg_wake)     # the owner's waiters on the word
    elif z.kops.atomic == NULL:
        st = LZ_EOP
    elif (<_lz_atomic_fn>z.kops.atomic)(z.kctx, NULL, z.seg_base + off, <int>desc[4],
                                        <int>desc[5], a, b, &res) == -1:
        _lz_swallow()
        st = LZ_EOP
    else:
        st = LZ_OK
    words[z.slots + s] = res.u64            # before the done word
    return st


cdef long _lz_pass(lz_zone* z) noexcept nogil:
    """Serve every new request of the zone once: how many."""
    cdef long work = 0
    cdef int r, s
    cdef char* ring
    cdef uint64_t* desc
    cdef uint64_t* words
    cdef uint64_t q, st
    for r in range(z.nrings):
        ring = z.mem + LZ_HEAD + <size_t>r * z.ring_bytes
        words = <uint64_t*>(ring + _lz_words_off(z.slots))
        for s in range(z.slots):
            desc = <uint64_t*>(ring + <size_t>s * LZ_DESC)
            q = gx_lz_load(&desc[0])
            if q == 0 or q <= z.handled[r * z.slots + s] or gx_lz_load(&desc[15]) != q:
                continue
            st = <uint64_t>_lz_serve(z, ring, s, desc, words)
            z.handled[r * z.slots + s] = q
            gx_lz_publish(&words[s], q | (st << LZ_SEQ_BITS))
            work += 1
    if work:
        z.landed += work
        gx_wake_waiters(<gx_wake*>(z.mem + 64))
    return work


cdef void _lz_run(lz_zone* z) noexcept nogil:
    """The lander: serve the zone until stopped; poll hot for a while after a
    request (a transfer brings its chunks back to back), then sleep on the
    bell (initiators ring it after each descriptor)."""
    cdef gx_wake* bell = <gx_wake*>z.mem
    cdef double hot_until = 0
    cdef uint32_t seq
    while not gx_load_int(&z.stop):
        if _lz_pass(z):
            hot_until = _lz_now() + 0.0005
            continue
        if _lz_now() < hot_until:
            sched_yield()
            continue
        seq = gx_wake_enter(bell)
        if _lz_pass(z) == 0 and not gx_load_int(&z.stop):
            gx_wake_sleep(bell, seq, 100000000)
        gx_wake_leave(bell)


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
    return 0


cdef int _lz_leave(lp_land* L, gx_target* t, int st) except -1 nogil:
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
    int op                     # LZ_PUT, LZ_GET, or LZ_AMO (a signal: n is its value, aop its op)
    uint64_t off
    char* buf                  # host memory
    size_t n
    int aop


cdef void _lz_hostfn(void* arg) noexcept nogil:
    cdef lz_job* j = <lz_job*>arg
    cdef int st
    cdef gx_val a, zero
    _lz_lock(j.L)
    if j.op == LZ_PUT:
        st = _lz_put(j.L, j.t, j.off, j.buf, j.n, NULL)
    elif j.op == LZ_GET:
        st = _lz_get(j.L, j.t, j.off, j.buf, j.n, NULL)
    else:
        a.u64 = j.n
        zero.u64 = 0
        st = _lz_amo(j.L, j.t, j.off, GX_DT_U64, j.aop, a, zero, NULL)
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


cdef int _landed_on_stream(gx_xfer* x, bint put) except -1 nogil:
    cdef lp_ep* ep = <lp_ep*>x.ep
    cdef lp_land* L = <lp_land*>x.peer
    cdef uint64_t off = x.remote - x.t.remote_base
    cdef lp_bounce* bb
    cdef size_t pos = 0, m, piece
    cdef int b = 0
    cdef char* slot
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
    if x.n == 0:
        return 0
    if x.local_kind == GX_MK_HOST:
        return _lz_launch(ep, x.stream, L, x.t, LZ_PUT if put else LZ_GET, off, <char*>x.local, x.n)
    bb = _staged_bounce(ep)
    try:
        _bounce_drain_all(bb, &ep.k)        # earlier synchronous users of the buffers
        piece = bb.chunk
        while pos < x.n:
            m = x.n - pos if x.n - pos < piece else piece
            slot = bb.buf + <size_t>(b % bb.nbuf) * piece
            if put:
                ep.k.ops.copy(ep.k.kctx, x.stream, <uintptr_t>slot, <uintptr_t>x.local + pos, m)
                _lz_launch(ep, x.stream, L, x.t, LZ_PUT, off + pos, slot, m)
            else:
                _lz_launch(ep, x.stream, L, x.t, LZ_GET, off + pos, slot, m)
                ep.k.ops.copy(ep.k.kctx, x.stream, <uintptr_t>x.local + pos, <uintptr_t>slot, m)
            pos += m
            b += 1
        ep.k.ops.event_record(ep.k.kctx, x.stream, &bb.pend)   # the buffers are the stream's until then
    finally:
        gx_xchg_int(&bb.busy, 0)
    return 0


# ---- control plane ------------------------------------------------------------

cdef class _LandingZone:
    """The owner's landing zone for one bound segment, and its lander thread."""
    cdef lz_zone z
    cdef int fd
    cdef object thread
    cdef bint pinned

    def __cinit__(self):
        self.fd = -1

    def open(self, Segment seg, int nrings, int slots, size_t chunk):
        cdef void* p
        chunk = (chunk + 4095) & ~(<size_t>4095)
        self.z.nrings = nrings
        self.z.slots = slots
        self.z.chunk = chunk
        self.z.data_off = _lz_data_off(slots)
        self.z.ring_bytes = self.z.data_off + <size_t>slots * chunk
        self.z.bytes = LZ_HEAD + <size_t>nrings * self.z.ring_bytes
        self.z.seg_base = <uintptr_t>seg.addr
        self.z.seg_size = seg.size
        self.fd = os.memfd_create("gexmk-landing", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, self.z.bytes)
        p = mmap(NULL, self.z.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, self.fd, 0)
        if p == MAP_FAILED:
            raise OSError(errno, f"mapping a landing zone of {self.z.bytes} bytes")
        self.z.mem = <char*>p
        self.z.handled = <uint64_t*>calloc(<size_t>nrings * slots, sizeof(uint64_t))
        if self.z.handled == NULL:
            raise MemoryError()
        impl = seg.kind.impl
        if impl is not None:
            self.z.kops = <const gx_kind_ops*>PyCapsule_GetPointer(impl.ops_capsule(),
                                                                   b"gexmk.kind_ops")
            self.z.kctx = <void*><uintptr_t>impl.handle
            try:        # pinned: the lander's copies run at DMA speed
                self.z.kops.host_register(self.z.kctx, self.z.mem, self.z.bytes, 1)
                self.pinned = True
            except Exception:   # noqa: BLE001 - pinning is an optimisation
                pass
        else:
            self.z.seg_wake = <gx_wake*><uintptr_t>seg._wake_address
        import threading
        self.thread = threading.Thread(target=self._run, name="gexmk-nbrhd-lander", daemon=True)
        self.thread.start()

    def _run(self):
        with nogil:
            _lz_run(&self.z)

    @property
    def fd(self):
        return self.fd

    @property
    def layout(self):
        return (self.z.nrings, self.z.slots, self.z.chunk, self.z.ring_bytes, self.z.data_off,
                self.z.kops == NULL or self.z.kops.atomic != NULL)

    @property
    def landed(self):
        return self.z.landed

    def close(self):
        """Stop the lander (it finishes its pass), unpin and unmap the zone."""
        if self.thread is not None:
            gx_xchg_int(&self.z.stop, 1)            # seq_cst: the lander sees it or sleeps
            gx_wake_waiters(<gx_wake*>self.z.mem)
            self.thread.join(10)
            if self.thread.is_alive():
                raise RuntimeError("gexmk: the nbrhd lander thread did not stop")
            self.thread = None
        if self.pinned:
            try:
                self.z.kops.host_register(self.z.kctx, self.z.mem, self.z.bytes, 0)
            except Exception:   # noqa: BLE001 - the kind's context is gone with its client
                pass
            self.pinned = False
        if self.z.mem != NULL:
            munmap(self.z.mem, self.z.bytes)
            self.z.mem = NULL
        free(self.z.handled)
        self.z.handled = NULL
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __dealloc__(self):
        if self.z.mem != NULL and self.thread is None:
            munmap(self.z.mem, self.z.bytes)
        free(self.z.handled)
        if self.fd >= 0:
            close(self.fd)


cdef class _LandContext:
    """An initiator's mapping of a peer's landing zone (this process's ring)."""
    cdef lp_land c
    cdef char* mem
    cdef size_t bytes
    cdef object key                # (fd server address, key) it came from
    cdef object pin                # (ops capsule owner, kctx) that pinned the ring, or None
    cdef const gx_kind_ops* pops
    cdef void* pkctx

    def map(self, int fd, tuple layout, int myrank, double timeout):
        cdef int nrings = layout[0]
        cdef void* p
        cdef uint64_t* words
        cdef int s
        if not 0 <= myrank < nrings or not 1 <= layout[1] <= LZ_MAX_SLOTS:
            raise SegmentError("nbrhd-landed: the peer's landing zone does not fit this job")
        self.bytes = LZ_HEAD + <size_t>nrings * <size_t>layout[3]
        if os.fstat(fd).st_size < <Py_ssize_t>self.bytes:
            raise SegmentError("nbrhd-landed: the peer's landing zone is smaller than published")
        p = mmap(NULL, self.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
        if p == MAP_FAILED:
            raise OSError(errno, "mapping a peer's landing zone")
        self.mem = <char*>p
        self.c.bell = <gx_wake*>p
        self.c.answer = <gx_wake*>(self.mem + 64)
        self.c.slots = layout[1]
        self.c.chunk = layout[2]
        self.c.data_off = layout[4]
        self.c.amo = layout[5]
        self.c.ring = self.mem + LZ_HEAD + <size_t>myrank * <size_t>layout[3]
        self.c.timeout = timeout
        # pick up where an earlier mapping of the same ring left off
        words = <uint64_t*>(self.c.ring + _lz_words_off(self.c.slots))
        for s in range(self.c.slots):
            self.c.last[s] = self.c.ok[s] = words[s] & ((<uint64_t>1 << LZ_SEQ_BITS) - 1)
            if self.c.last[s] > self.c.seq:
                self.c.seq = self.c.last[s]

    def pin_with(self, mk):
        """Pin this process's ring with a device kind of this process, so
        that its copies between its device segment and the slots run at DMA speed."""
        if self.pin is not None or mk is None or mk.impl is None:
            return
        self.pops = <const gx_kind_ops*>PyCapsule_GetPointer(mk.impl.ops_capsule(), b"gexmk.kind_ops")
        self.pkctx = <void*><uintptr_t>mk.impl.handle
        try:
            self.pops.host_register(self.pkctx, self.c.ring,
                                    self.c.data_off + <size_t>self.c.slots * self.c.chunk, 1)
        except Exception:   # noqa: BLE001 - pinning is an optimisation
            return
        self.pin = mk

    def unmap(self):
        if self.pin is not None:
            try:
                self.pops.host_register(self.pkctx, self.c.ring,
                                        self.c.data_off + <size_t>self.c.slots * self.c.chunk, 0)
            except Exception:   # noqa: BLE001 - the kind may be closed
                pass
            self.pin = None
        if self.mem != NULL:
            munmap(self.mem, self.bytes)
            self.mem = NULL
            self.c.ring = NULL

    @property
    def handle(self):
        return <uintptr_t>&self.c
