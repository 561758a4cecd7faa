# ---------------------------------------------------------------------------
# nbrhd-landed rings per active initiator (issue 23), as ofi's (ofi.src/staged.pxi): the
# memfd is sized for every ring but only written pages are backed, and the
# lander pins a ring (device zones) at its first request.  An initiator whose
# ring sat unused for GEXMK_RING_IDLE seconds, with every request it posted
# answered, unpins its side and posts LZ_RELEASE as its last request; the
# lander unpins its side and punches the ring's data slots out of the memfd
# (fallocate PUNCH_HOLE: madvise DONTNEED on a shared mapping frees no shmem
# page).  The lander is the one that punches: only it knows the ring is pinned
# on its side (a pinned page punched out would leave its DMA on a page the
# mapping no longer shows), and the release's order in the ring says that no
# request of the initiator's is pending.  The next operation reads the
# release's answer first, then pins and writes as a first use does.
#
# A ring whose initiator the bootstrap reported dead is reclaimed by the lander
# (LocalTransport.peer_died -> _LandingZone.reclaim): it stops reading the ring
# *first*, then unpins and punches all of it.  Nothing of the dead process can
# reach the segment after that, whenever its last stores or its GPU's copies
# land: a request left in the ring is never served, and a late byte can only
# re-back a page of that ring (a process killed outright has no thread left
# by the time its bootstrap connection closes; a pinned page its driver still
# held is dropped from the memfd and freed when the driver lets go).
# ---------------------------------------------------------------------------

# ---- the lander (owner side) ------------------------------------------------------

cdef void _lz_back(lz_zone* z, int r, char* ring) noexcept nogil:
    """Ring r's first request (or its first since its release): pin it for
    the kind's copies (device zones; pages are backed as they are written)."""
    z.ring_state[r] = LR_USED
    if z.kops != NULL and z.kops.host_register != NULL:
        if (<_lz_register_fn>z.kops.host_register)(z.kctx, ring, z.ring_bytes, 1) == -1:
            _lz_swallow()       # served unpinned: the kind's copies go at pageable speed
        else:
            z.ring_state[r] = LR_PINNED


cdef void _lz_unpin(lz_zone* z, int r, char* ring) noexcept nogil:
    if z.ring_state[r] == LR_PINNED and (<_lz_register_fn>z.kops.host_register)(
            z.kctx, ring, z.ring_bytes, 0) == -1:
        _lz_swallow()


cdef void _lz_punch(lz_zone* z, size_t off, size_t n) noexcept nogil:
    """Give [off, off + n) of the memfd back to the OS; it reads as zeros after."""
    fallocate(z.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, <long>off, <long>n)


cdef void _lz_release(lz_zone* z, int r, char* ring) noexcept nogil:
    """Ring r's initiator released it (its last request: every one before it
    answered, nothing after it posted before this answer): unpin the ring and
    punch its data slots out; its first page (descriptors, done words: the
    release's answer goes there, and every pass reads it) stays."""
    _lz_unpin(z, r, ring)
    _lz_punch(z, <size_t>(ring - z.mem) + z.data_off, z.ring_bytes - z.data_off)
    z.ring_state[r] = LR_IDLE
    z.releases += 1


cdef void _lz_reclaim_rings(lz_zone* z) noexcept nogil:
    """The rings whose initiators were reported dead: never read again (the
    state says so before a page goes), unpinned, punched out whole."""
    cdef int r
    cdef char* ring
    gx_xchg_int(&z.nreclaim, 0)
    for r in range(z.nrings):
        if gx_xchg_int(&z.reclaim[r], 0) == 0 or z.ring_state[r] == LR_DEAD:
            continue
        ring = z.mem + LZ_HEAD + <size_t>r * z.ring_bytes
        _lz_unpin(z, r, ring)
        z.ring_state[r] = LR_DEAD
        _lz_punch(z, <size_t>(ring - z.mem), z.ring_bytes)
        z.reclaimed += 1


# ---- the initiator -----------------------------------------------------------------

cdef inline size_t _lz_pin_bytes(lp_land* L) noexcept nogil:
    return L.data_off + <size_t>L.slots * L.chunk


cdef void _lz_pin_here(lp_land* L) noexcept nogil:
    """Pin the ring with this process's device kind (pin_with), where it asked."""
    if L.pops == NULL or L.pinned or L.ring == NULL:
        return
    if (<_lz_register_fn>L.pops.host_register)(L.pkctx, L.ring, _lz_pin_bytes(L), 1) == -1:
        _lz_swallow()       # pinning is an optimisation: the copies work unpinned
    else:
        L.pinned = 1


cdef int _lz_reopen(lp_land* L, gx_target* t, bint pin=True) noexcept nogil:
    """Before an operation (lock held): where the ring was released, its
    answer first -- the lander has punched the data slots by then, so nothing
    written from here on lands in a page it drops -- then pin it again
    (not with pin False: a stream's host function may make no CUDA call;
    its copies are host memcpys, and the next operation from a host thread
    pins)."""
    cdef int st
    if L.rel:
        st = _lz_wait(L, t, <int>((L.seq - 1) % <uint64_t>L.slots), L.seq)
        if st != LZ_OK:
            return st
        L.rel = 0
    if pin:
        _lz_pin_here(L)
    return LZ_OK


cdef int _lz_idle_release(lp_land* L, double now, double idle) noexcept nogil:
    """Release the ring if unused for idle seconds with every request answered
    (nothing of ours in flight: the lander may drop its pages): unpin our
    side, post LZ_RELEASE (never waited for: the next operation reads its
    answer, _lz_reopen).  A ring in use by another thread is left for the
    next look.  1 when released."""
    cdef int s
    if L.rel or not L.touched or now - L.used < idle or L.ring == NULL:
        return 0
    if gx_xchg_int(&L.lock, 1) != 0:
        return 0
    if L.rel or not L.touched or now - L.used < idle \
            or gx_load_int(<int*>(<char*>L.bell + LZ_CLOSED_OFF)):
        gx_xchg_int(&L.lock, 0)
        return 0
    for s in range(L.slots):
        if L.last[s] > L.ok[s]:
            gx_xchg_int(&L.lock, 0)
            return 0
    if L.pinned:
        if (<_lz_register_fn>L.pops.host_register)(L.pkctx, L.ring, _lz_pin_bytes(L), 0) == -1:
            _lz_swallow()
        L.pinned = 0
    _lz_post(L, LZ_RELEASE, 0, 0)
    L.rel = 1
    L.touched = 0
    L.releases += 1
    gx_xchg_int(&L.lock, 0)
    return 1


# The rings this process uses in peers' zones, looked at by the idle thread
# (LocalTransport starts it with the first zone it maps, GEXMK_RING_IDLE > 0).
cdef lp_land** _lz_held = NULL
cdef int _lz_nheld = 0
cdef int _lz_held_cap = 0
cdef int _lz_held_lock = 0


cdef int _lz_hold(lp_land* L) except -1:
    global _lz_held, _lz_nheld, _lz_held_cap
    cdef lp_land** grown
    while gx_xchg_int(&_lz_held_lock, 1) != 0:
        sched_yield()
    try:
        if _lz_nheld == _lz_held_cap:
            grown = <lp_land**>realloc(_lz_held, <size_t>(_lz_held_cap * 2 + 16) * sizeof(lp_land*))
            if grown == NULL:
                raise MemoryError()
            _lz_held = grown
            _lz_held_cap = _lz_held_cap * 2 + 16
        _lz_held[_lz_nheld] = L
        _lz_nheld += 1
    finally:
        gx_xchg_int(&_lz_held_lock, 0)
    return 0


cdef void _lz_unhold(lp_land* L) noexcept nogil:
    """Off the list; the idle thread, which looks under the same lock, no
    longer touches L once this returns."""
    global _lz_nheld
    cdef int i
    while gx_xchg_int(&_lz_held_lock, 1) != 0:
        sched_yield()
    for i in range(_lz_nheld):
        if _lz_held[i] == L:
            _lz_held[i] = _lz_held[_lz_nheld - 1]
            _lz_nheld -= 1
            break
    gx_xchg_int(&_lz_held_lock, 0)


cdef void _lz_idle_run(int* stop, double idle) noexcept nogil:
    """The idle thread: every quarter of GEXMK_RING_IDLE (1 ms .. 250 ms),
    release the held rings unused that long."""
    cdef timespec ts
    cdef double nap = idle / 4
    cdef double now
    cdef int i
    if nap < 0.001:
        nap = 0.001
    if nap > 0.25:
        nap = 0.25
    ts.tv_sec = <time_t>nap
    ts.tv_nsec = <long>((nap - ts.tv_sec) * 1e9)
    while not gx_load_int(stop):
        nanosleep(&ts, NULL)
        now = _lz_now()
        while gx_xchg_int(&_lz_held_lock, 1) != 0:
            sched_yield()
        for i in range(_lz_nheld):
            _lz_idle_release(_lz_held[i], now, idle)
        gx_xchg_int(&_lz_held_lock, 0)
