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
#                 initiators waiting for an answer on `answer`; then the
#                 `closed` word, 1 once the owner unbound the segment and its
#                 lander stopped (peers' stale requests then fail, not wait)
#   then          one ring per process of the node (the initiators, by node-local
#                 index: LocalTransport.node_index), laid out as the
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
#
# Rings per active initiator (issue 23): released once idle, reclaimed once
# their initiator is dead -- landed_rings.pxi.
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

cdef extern from "<fcntl.h>" nogil:
    int fallocate(int fd, int mode, long offset, long length)
    enum: FALLOC_FL_KEEP_SIZE
    enum: FALLOC_FL_PUNCH_HOLE

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
ctypedef int (*_lz_register_fn)(void* kctx, void* p, size_t n, int on) noexcept nogil

cdef enum:
    LZ_MAX_SLOTS = 16
    LZ_DESC = 128              # bytes per descriptor: 16 words, word 15 repeats word 0
    LZ_HEAD = 4096             # the zone's first page: the wake words
    LZ_SEQ_BITS = 56
    LZ_PUT = 1
    LZ_GET = 2
    LZ_AMO = 3
    LZ_RELEASE = 4             # the initiator's last request: nothing of it pending, its ring's
                               # pages go back to the OS (an idle ring)
    LZ_OK = 0
    LZ_EBOUNDS = 1
    LZ_ECOPY = 2
    LZ_EOP = 3
    LZ_EDEAD = 4               # initiator side: the owner died
    LZ_ETIME = 5               # ... did not answer within the timeout
    LZ_ELOCAL = 6              # ... the local copy (the endpoint's kind) raised
    LZ_EASYNC = 7              # ... an earlier stream-ordered transfer failed
    LZ_ECLOSED = 8             # ... the owner closed the zone (unbound its segment) first
    LZ_CLOSED_OFF = 128        # the zone's first page: set to 1 once its lander has stopped
    LR_NEW = 0                 # ring_state: no request served yet (nothing pinned)
    LR_USED = 1                # served, unpinned (host zones, or the pin failed)
    LR_PINNED = 2              # served, page-locked with the segment's kind
    LR_IDLE = 3                # released by its initiator: its data slots punched out
    LR_DEAD = 4                # its initiator died: never read again, all of it punched out


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
    int fd                     # the memfd (the lander punches released rings out of it)
    unsigned char* ring_state  # nrings: LR_*
    int* reclaim               # nrings: 1 once the ring's initiator was reported dead
    int nreclaim               # set with it: the lander looks at reclaim[] next pass
    long releases              # rings released by their initiators (LZ_RELEASE)
    long reclaimed             # rings of dead initiators reclaimed


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
    double used                # when an operation through the ring last ended (_lz_now)
    int touched                # requests posted since the ring was (re)opened
    int rel                    # LZ_RELEASE posted, its answer not read yet (_lz_reopen)
    long releases              # times this process released the ring
    const gx_kind_ops* pops    # the kind that pins the ring here (pin_with), or NULL
    void* pkctx
    int pinned                 # the ring is page-locked here now


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
        n = gx_dt_size(<int>desc[4])     # a 4-byte word may end the segment
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
    if gx_load_int(&z.nreclaim):
        _lz_reclaim_rings(z)
    for r in range(z.nrings):
        if z.ring_state[r] == LR_DEAD:
            continue
        ring = z.mem + LZ_HEAD + <size_t>r * z.ring_bytes
        words = <uint64_t*>(ring + _lz_words_off(z.slots))
        for s in range(z.slots):
            desc = <uint64_t*>(ring + <size_t>s * LZ_DESC)
            q = gx_lz_load(&desc[0])
            if q == 0 or q <= z.handled[r * z.slots + s] or gx_lz_load(&desc[15]) != q:
                continue
            if desc[1] == LZ_RELEASE:
                _lz_release(z, r, ring)
                st = LZ_OK
            else:
                if z.ring_state[r] != LR_USED and z.ring_state[r] != LR_PINNED:
                    _lz_back(z, r, ring)
                st = <uint64_t>_lz_serve(z, ring, s, desc, words)
            z.handled[r * z.slots + s] = q
            # counted before the answer is published: whoever saw the answer
            # (and synchronised with this process after) sees the count
            z.landed += 1
            gx_lz_publish(&words[s], q | (st << LZ_SEQ_BITS))
            work += 1
    if work:
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


# ---- control plane ------------------------------------------------------------

cdef class _LandingZone:
    """The owner's landing zone for one bound segment, and its lander thread."""
    cdef lz_zone z
    cdef int fd
    cdef object thread

    def __cinit__(self):
        self.fd = -1
        self.z.fd = -1

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
        # sized for every ring, backed only where written (a ring once its
        # initiator uses it; its data slots punched out again on release)
        self.fd = os.memfd_create("gexmk-landing", os.MFD_CLOEXEC)
        self.z.fd = self.fd
        os.ftruncate(self.fd, self.z.bytes)
        p = mmap(NULL, self.z.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, self.fd, 0)
        if p == MAP_FAILED:
            raise OSError(errno, f"mapping a landing zone of {self.z.bytes} bytes")
        self.z.mem = <char*>p
        self.z.handled = <uint64_t*>calloc(<size_t>nrings * slots, sizeof(uint64_t))
        self.z.ring_state = <unsigned char*>calloc(<size_t>nrings, 1)
        self.z.reclaim = <int*>calloc(<size_t>nrings, sizeof(int))
        if self.z.handled == NULL or self.z.ring_state == NULL or self.z.reclaim == NULL:
            raise MemoryError()
        impl = seg.kind.impl
        if impl is not None:
            # each ring pinned by the lander at its first request (_lz_back):
            # its copies run at DMA speed
            self.z.kops = <const gx_kind_ops*>PyCapsule_GetPointer(impl.ops_capsule(),
                                                                   b"gexmk.kind_ops")
            self.z.kctx = <void*><uintptr_t>impl.handle
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

    @property
    def rings(self):
        """Ring states and counts: ``{"backed": rings in use now, "released":
        releases served, "reclaimed": rings of dead initiators reclaimed,
        "state": one of "new", "used", "pinned", "idle", "dead" per ring}``."""
        names = ("new", "used", "pinned", "idle", "dead")
        if self.z.ring_state == NULL:
            return None
        state = [names[self.z.ring_state[r]] for r in range(self.z.nrings)]
        return {"backed": sum(1 for x in state if x in ("used", "pinned")),
                "released": self.z.releases, "reclaimed": self.z.reclaimed, "state": state}

    def ring_extent(self, int r):
        """(offset, bytes, data offset) of ring r in the memfd."""
        return (LZ_HEAD + <size_t>r * self.z.ring_bytes, self.z.ring_bytes, self.z.data_off)

    def reclaim(self, int r):
        """Ring r's initiator was reported dead: have the lander reclaim it
        (its next pass; it alone reads and pins the rings)."""
        if self.thread is None or self.z.reclaim == NULL or not 0 <= r < self.z.nrings:
            return
        gx_xchg_int(&self.z.reclaim[r], 1)
        gx_xchg_int(&self.z.nreclaim, 1)
        gx_wake_waiters(<gx_wake*>self.z.mem)

    def close(self):
        """Stop the lander (it finishes its pass), unpin and unmap the zone."""
        cdef int r
        if self.thread is not None:
            gx_xchg_int(&self.z.stop, 1)            # seq_cst: the lander sees it or sleeps
            gx_wake_waiters(<gx_wake*>self.z.mem)
            self.thread.join(10)
            if self.thread.is_alive():
                raise RuntimeError("gexmk: the nbrhd lander thread did not stop")
            self.thread = None
            # nothing is served from here on: initiators still waiting (peers
            # that have not seen a new publication) give up with an error
            gx_xchg_int(<int*>(self.z.mem + LZ_CLOSED_OFF), 1)
            gx_wake_waiters(<gx_wake*>(self.z.mem + 64))
        for r in range(self.z.nrings if self.z.ring_state != NULL and self.z.mem != NULL else 0):
            if self.z.ring_state[r] == LR_PINNED:
                try:
                    self.z.kops.host_register(self.z.kctx, self.z.mem + LZ_HEAD
                                              + <size_t>r * self.z.ring_bytes, self.z.ring_bytes, 0)
                except Exception:   # noqa: BLE001 - the kind's context is gone with its client
                    pass
                self.z.ring_state[r] = LR_USED
        if self.z.mem != NULL:
            munmap(self.z.mem, self.z.bytes)
            self.z.mem = NULL
        free(self.z.handled)
        self.z.handled = NULL
        free(self.z.ring_state)
        self.z.ring_state = NULL
        free(self.z.reclaim)
        self.z.reclaim = NULL
        self.z.fd = -1
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __dealloc__(self):
        if self.z.mem != NULL and self.thread is None:
            munmap(self.z.mem, self.z.bytes)
        free(self.z.handled)
        free(self.z.ring_state)
        free(self.z.reclaim)
        if self.fd >= 0:
            close(self.fd)


cdef class _LandContext:
    """An initiator's mapping of a peer's landing zone (this process's ring)."""
    cdef lp_land c
    cdef char* mem
    cdef size_t bytes
    cdef object key                # (fd server address, key) it came from
    cdef object pin                # the kind that pins the ring here (kept alive), or None
    cdef bint held                 # listed for idle release (_lz_hold)

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
        self.c.pops = <const gx_kind_ops*>PyCapsule_GetPointer(mk.impl.ops_capsule(),
                                                               b"gexmk.kind_ops")
        self.c.pkctx = <void*><uintptr_t>mk.impl.handle
        self.pin = mk
        # pinned now where the ring is in use, else at its first use (and
        # again after each release: _lz_reopen)
        if self.c.touched:
            _lz_lock(&self.c)
            _lz_pin_here(&self.c)
            gx_xchg_int(&self.c.lock, 0)

    def hold(self):
        """List the ring for release once idle (GEXMK_RING_IDLE)."""
        if not self.held and self.mem != NULL:
            _lz_hold(&self.c)
            self.held = True

    def unmap(self):
        if self.held:
            _lz_unhold(&self.c)         # the idle thread no longer looks at it
            self.held = False
        if self.c.pinned:
            try:
                self.c.pops.host_register(self.c.pkctx, self.c.ring, _lz_pin_bytes(&self.c), 0)
            except Exception:   # noqa: BLE001 - the kind may be closed
                pass
            self.c.pinned = 0
        self.c.pops = NULL
        self.pin = None
        if self.mem != NULL:
            munmap(self.mem, self.bytes)
            self.mem = NULL
            self.c.ring = NULL

    def __dealloc__(self):
        if self.held:
            _lz_unhold(&self.c)         # never left on the idle thread's list

    @property
    def ring_stats(self):
        """This process's ring in the peer's zone: ``{"held": 1 while in use
        (touched, not released), "released": times released, "pinned": 0/1}``."""
        return {"held": int(self.c.touched != 0 and not self.c.rel),
                "released": self.c.releases, "pinned": self.c.pinned}

    @property
    def handle(self):
        return <uintptr_t>&self.c
