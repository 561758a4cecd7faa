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

cdef int _lz_failed(gx_target* t, uint64_t status) except -1 with gil:
    from gexmk.errors import BoundsError, CommunicationError
    who = f"job rank {t.jobrank}"
    if status == LZ_EBOUNDS:
        raise BoundsError(f"nbrhd-landed: {who} refused a request outside its segment "
                          "(or a misaligned atomic)")
    if status == LZ_ECOPY:
        raise CommunicationError(f"nbrhd-landed: the device copy at {who} failed (its segment "
                                 "destroyed, or its device in error?)")
    raise UnsupportedError(f"nbrhd-landed: {who} cannot run this atomic on its device segment")


cdef int _lz_lost(gx_target* t, double timeout) except -1 with gil:
    if t.dead:
        raise PeerDeadError(f"nbrhd-landed: job rank {t.jobrank} (pid {t.pid}) died during a "
                            "transfer through its landing zone")
    from gexmk.errors import TimeoutError as GxTimeout
    raise GxTimeout(f"nbrhd-landed: job rank {t.jobrank}'s lander did not answer within "
                    f"{timeout:g} s")


cdef int _lz_wait(lp_land* L, gx_target* t, int s, uint64_t want) except -1 nogil:
    """Until slot s has served sequence number want; raise what the owner reported."""
    cdef uint64_t* words = <uint64_t*>(L.ring + _lz_words_off(L.slots))
    cdef uint64_t w
    cdef double deadline = 0
    cdef uint32_t seq
    cdef int i
    w = gx_lz_load(&words[s])
    if (w & ((<uint64_t>1 << LZ_SEQ_BITS) - 1)) < want:
        for i in range(2000):
            gx_cpu_relax()
            w = gx_lz_load(&words[s])
            if (w & ((<uint64_t>1 << LZ_SEQ_BITS) - 1)) >= want:
                break
    while (w & ((<uint64_t>1 << LZ_SEQ_BITS) - 1)) < want:
        if t.dead:
            return _lz_lost(t, L.timeout)
        if deadline == 0:
            deadline = _lz_now() + L.timeout
        elif _lz_now() > deadline:
            return _lz_lost(t, L.timeout)
        seq = gx_wake_enter(L.answer)
        w = gx_lz_load(&words[s])
        if (w & ((<uint64_t>1 << LZ_SEQ_BITS) - 1)) < want:
            gx_wake_sleep(L.answer, seq, 2000000)
        gx_wake_leave(L.answer)
        w = gx_lz_load(&words[s])
    if L.ok[s] < want:
        L.ok[s] = want
        if (w >> LZ_SEQ_BITS) != LZ_OK and (w & ((<uint64_t>1 << LZ_SEQ_BITS) - 1)) == want:
            return _lz_failed(t, w >> LZ_SEQ_BITS)
    return 0


cdef int _lz_post(lp_land* L, gx_target* t, uint64_t op, uint64_t off, uint64_t n,
                  int dt=0, int aop=0, uint64_t a=0, uint64_t b=0) except -1 nogil:
    """Claim the next slot (waiting for its last request), write the
    descriptor, ring the bell: the slot's index (its data is written before
    this call, for a put)."""
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
    return s


cdef inline int _lz_next_slot(lp_land* L, gx_target* t) except -1 nogil:
    """The slot the next request goes to, once its previous request is served."""
    cdef int s = <int>(L.seq % <uint64_t>L.slots)
    if L.last[s] > L.ok[s]:
        _lz_wait(L, t, s, L.last[s])
    return s


cdef int _lz_move(gx_xfer* x, char* dst, const char* src, size_t m) except -1 nogil:
    """Between a data slot and the local buffer: host memory by the copy
    pool's threads (one thread's memcpy, ~10 GB/s, would pace the transfer;
    the lander's DMA runs at ~50), device memory by the endpoint's kind."""
    cdef lp_ep* ep = <lp_ep*>x.ep
    if x.local_kind != GX_MK_HOST:
        ep.k.ops.copy(ep.k.kctx, NULL, <uintptr_t>dst, <uintptr_t>src, m)
    elif _pool != NULL:
        gx_cpool_copy(_pool, dst, src, m)
    else:
        memcpy(dst, src, m)
    return 0


cdef int _lz_check_local(gx_xfer* x) except -1 nogil:
    if x.stream != NULL:
        with gil:
            raise UnsupportedError(
                "nbrhd-landed: a peer's pool memory (not exportable) is reached through its "
                "owner's lander thread, which the host drives: no stream-ordered RMA on this path")
    if x.local_kind != GX_MK_HOST and (x.ep == NULL or (<lp_ep*>x.ep).k.ops == NULL):
        with gil:
            raise UnsupportedError("nbrhd-landed: a device buffer must lie in the initiating "
                                   "endpoint's bound device segment")
    return 0


cdef int _landed_put(gx_xfer* x) except -1 nogil:
    cdef lp_land* L = <lp_land*>x.peer
    cdef gx_target* t = x.t
    cdef size_t pos = 0, m
    cdef uint64_t off = x.remote - t.remote_base
    cdef int s
    _lz_check_local(x)
    while gx_xchg_int(&L.lock, 1) != 0:
        sched_yield()
    try:
        while pos < x.n:
            m = x.n - pos if x.n - pos < L.chunk else L.chunk
            s = _lz_next_slot(L, t)
            _lz_move(x, L.ring + L.data_off + <size_t>s * L.chunk, <char*>x.local + pos, m)
            _lz_post(L, t, LZ_PUT, off + pos, m)
            pos += m
        for s in range(L.slots):
            if L.last[s] > L.ok[s]:
                _lz_wait(L, t, s, L.last[s])
    finally:
        gx_xchg_int(&L.lock, 0)
    _done(x)
    return 0


cdef int _landed_get(gx_xfer* x) except -1 nogil:
    cdef lp_land* L = <lp_land*>x.peer
    cdef gx_target* t = x.t
    cdef size_t C = L.chunk, k = (x.n + L.chunk - 1) // L.chunk, posted = 0, got = 0, m
    cdef uint64_t off = x.remote - t.remote_base
    cdef uint64_t qs[LZ_MAX_SLOTS]
    cdef int s
    _lz_check_local(x)
    while gx_xchg_int(&L.lock, 1) != 0:
        sched_yield()
    try:
        while got < k:
            while posted < k and posted - got < <size_t>L.slots:
                m = x.n - posted * C if x.n - posted * C < C else C
                _lz_next_slot(L, t)
                _lz_post(L, t, LZ_GET, off + posted * C, m)
                qs[posted % L.slots] = L.seq
                posted += 1
            s = <int>((qs[got % L.slots] - 1) % <uint64_t>L.slots)
            _lz_wait(L, t, s, qs[got % L.slots])
            m = x.n - got * C if x.n - got * C < C else C
            _lz_move(x, <char*>x.local + got * C, L.ring + L.data_off + <size_t>s * C, m)
            got += 1
    finally:
        gx_xchg_int(&L.lock, 0)
    _done(x)
    return 0


cdef int _landed_amo(lp_land* L, gx_target* t, uintptr_t remote, int dt, int op, gx_val a,
                     gx_val b, gx_val* result) except -1 nogil:
    cdef uint64_t* words = <uint64_t*>(L.ring + _lz_words_off(L.slots))
    cdef int s
    if not L.amo:
        with gil:
            raise UnsupportedError(f"nbrhd-landed: job rank {t.jobrank}'s device segment has no "
                                   "device atomics (its memory kind has none)")
    while gx_xchg_int(&L.lock, 1) != 0:
        sched_yield()
    try:
        _lz_next_slot(L, t)
        s = _lz_post(L, t, LZ_AMO, remote - t.remote_base, 8, dt, op, a.u64, b.u64)
        _lz_wait(L, t, s, L.seq)
        if result != NULL:          # stored before the done word
            result[0].u64 = gx_lz_load(&words[L.slots + s])
    finally:
        gx_xchg_int(&L.lock, 0)
    return 0


cdef int _landed_atomic(gx_xfer* x) except -1 nogil:
    _landed_amo(<lp_land*>x.peer, x.t, x.remote, x.dt, x.op, x.a, x.b, x.result)
    _done(x)
    return 0


cdef int _landed_put_signal(gx_xfer* x) except -1 nogil:
    """The data (landed when the put returns), then the signal as an atomic
    run by the same lander: never visible before the data."""
    cdef gx_val zero
    cdef int mode = x.mode
    cdef void** handle = x.handle
    if x.sig_addr & 7:
        return _sig_misaligned(x)
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
