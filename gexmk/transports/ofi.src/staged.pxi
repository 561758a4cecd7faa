# ---------------------------------------------------------------------------
# Device segments over a network that cannot reach GPU memory (issue 9): the
# host-staged path "ofi-staged".
#
# A device-bound endpoint registers, instead of its segment, a *landing zone*
# of pinned host memory: one ring per job rank (the initiators), each ring
# `slots` request descriptors, then done / status / result words, then
# `slots` data slots of `chunk` bytes; and after the rings the endpoint's own
# bounce slots for its staged sends and receives.  The process's *lander*
# thread serves the zones: a descriptor whose sequence number is new (and
# whose last word repeats it: the whole descriptor has arrived) is a request
# -- put: copy the data slot into the device segment; get: copy the segment
# into the data slot; atomic: run it with the kind's device atomics -- after
# which the lander stores the status (and result), then the sequence number in
# the slot's done word (which carries the status in its top byte: one
# aligned 8-byte word, never seen half-written).
#
# An initiator drives everything with RMA alone: a put writes a chunk into a
# data slot (delivery complete), then the descriptor; as many chunks in flight
# as there are slots, the next chunk's copy out of device memory and its
# network write overlapping the chunks before.  It completes when the done
# words (read back in one fi_read) say that every chunk landed.  A get posts
# descriptors ahead and reads each data slot once its done word says so.
# Device memory of the initiator goes through its own bounce slots; host
# memory goes straight to the network.  One staged operation at a time per
# target in a process (the ring is per initiating process).
#
# Rings per active initiator (issue 23): a ring is backed when its initiator
# asks (STG_OPEN) and given back when the initiator, with nothing of its own in
# flight to it, sends STG_RELEASE -- after GEXMK_OFI_RING_IDLE seconds unused
# (looked for by the application's waits and staged operations and by the
# lander thread), or once an operation ends while the zone flags that another
# initiator waits (STG_WANT).  The lander then unpins the ring and madvises its
# data pages away; the next operation asks again.  The lander never revokes a
# ring on its own: a chunk in flight would land in pages it dropped.  At most
# GEXMK_OFI_ZONE_RINGS rings are backed at once; a request past it is refused
# for now (STG_EFULL) and asked again until GEXMK_TIMEOUT.
#
# A ring whose initiator the bootstrap reported dead (OfiTransport.peer_died)
# is not read again from the next pass on, then taken off the backed rings --
# its place under the cap goes to the next initiator that asks -- unpinned and
# (where released rings are) madvised away whole (_land_dead).  This holds
# although bytes the dead process sent may still be applied after the notice
# (over tcp, what sat in this side's socket buffer, which rxm applies as it
# reads; over shm, commands left in the queue): every ring belongs to one job
# rank, a late byte lands only in the dead rank's own ring, and no request
# there is served again, so nothing of it reaches the segment or another
# ring.  A late write may back a page of that ring again (never more than
# the ring; not reused, it is left to the zone's end).
#
# GEXMK_OFI_STAGE=all makes host segments land the same way (the lander
# copies with memcpy and runs atomics on the CPU), so that CPU-only CI tests
# every step of the protocol.
# ---------------------------------------------------------------------------
from posix.stdlib cimport posix_memalign
from libc.stdlib cimport realloc
from cpython.pycapsule cimport PyCapsule_GetPointer

cdef extern from *:
    """
    #include <stdint.h>
    static inline uint64_t gx_stg_load(const uint64_t *p)
    { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
    static inline void gx_stg_store(uint64_t *p, uint64_t v)
    { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
    """
    uint64_t gx_stg_load(const uint64_t* p) nogil
    void gx_stg_store(uint64_t* p, uint64_t v) nogil

# The kind's functions raise (except -1); the lander, which cannot, calls them
# through these types, reads -1 as failure and clears the exception.
ctypedef int (*_raw_copy_fn)(void* kctx, void* stream, uintptr_t dst, uintptr_t src,
                             size_t n) noexcept nogil
ctypedef int (*_raw_atomic_fn)(void* kctx, void* stream, uintptr_t addr, int dt, int op,
                               gx_val a, gx_val b, void* result) noexcept nogil
ctypedef int (*_raw_register_fn)(void* kctx, void* p, size_t n, int on) noexcept nogil
ctypedef int (*_raw_copyv_fn)(void* kctx, void* stream, const uintptr_t* dst,
                              const uintptr_t* src, const size_t* n, size_t count) noexcept nogil

from cpython.exc cimport PyErr_Clear

cdef extern from "<sys/mman.h>" nogil:
    int madvise(void* addr, size_t length, int advice)
    enum: MADV_DONTNEED

# A refused first request makes the zone ask its holders to release for this
# long (STG_WANT; the waiter asks again within it); a refused VIS ring asks
# again after STG_RETRY_S (its calls go direct meanwhile); a staged operation
# refused a ring asks again after naps of STG_OPEN_NAP_MIN..MAX seconds.
cdef double STG_WANT_S = 0.05
cdef double STG_RETRY_S = 1.0
cdef long STG_OPEN_NAP_MIN = 200000
cdef long STG_OPEN_NAP_MAX = 10000000


cdef int _swallow() noexcept with gil:
    PyErr_Clear()
    return 0


cdef enum:
    STG_SEQ_BITS = 56        # a done word: the sequence number, the status above it
    STG_PUT = 1
    STG_GET = 2
    STG_AMO = 3
    STG_PUTV = 4             # VIS (vis.pxi): the data slot holds a block list, then the blocks
    STG_GETV = 5
    STG_OPEN = 6             # an initiator's first request in its ring: back it, or refuse
    STG_RELEASE = 7          # its last: nothing of it in flight, give the ring's memory back
    STG_OK = 0
    STG_EBOUNDS = 1          # status words: what went wrong at the target
    STG_ECOPY = 2
    STG_EOP = 3
    STG_ECLOSED = 4          # a retired zone (its segment unbound): see OfiEndpoint._retire_mr
    STG_EFULL = 5            # the zone backs no more rings now (GEXMK_OFI_ZONE_RINGS): this
                             # STG_OPEN is refused (its result word: the cap); ask again later
    STG_WANT = 0x80          # a flag in a done word's status byte: another initiator waits for
                             # a ring, release yours once this operation is done
    RING_NEW = 0             # ring_state: no request seen yet (nothing backed, nothing pinned)
    RING_BACKED = 1          # backed: served (memory committed as the initiator writes it)
    RING_PINNED = 2          # ... and page-locked for the kind's copies (device zones)
    RING_IDLE = 3            # released by its initiator: its data pages given back to the OS
    RING_DEAD = 4            # its initiator was reported dead: never read again (_land_dead)


# The done word of every slot of a retired zone: the largest sequence number
# (so it is "served" at once) with status STG_ECLOSED.
cdef uint64_t STG_CLOSED_DONE = (<uint64_t>STG_ECLOSED << STG_SEQ_BITS) | \
    ((<uint64_t>1 << STG_SEQ_BITS) - 1)


cdef inline size_t _stg_words_off(int slots) noexcept nogil:
    return <size_t>slots * STG_DESC


cdef inline size_t _stg_data_off(int slots) noexcept nogil:
    return (_stg_words_off(slots) + 3 * 8 * <size_t>slots + 4095) & ~(<size_t>4095)


# ---- the lander (target side) ----------------------------------------------------

cdef int _land_copy(ofi_zone* z, uintptr_t dst, uintptr_t src, size_t n) noexcept nogil:
    """dst <- src with the zone's kind (memcpy for host memory): STG_OK or STG_ECOPY."""
    if z.kops == NULL:
        memcpy(<void*>dst, <void*>src, n)
        return STG_OK
    if (<_raw_copy_fn>z.kops.copy)(z.kctx, NULL, dst, src, n) == -1:
        _swallow()
        return STG_ECOPY
    return STG_OK


cdef int _land_amo(ofi_zone* z, uintptr_t addr, int dt, int op, gx_val a, gx_val b,
                   gx_val* res) noexcept nogil:
    if z.kops == NULL:
        return STG_OK if gx_atomic_local(<void*>addr, dt, op, a, b, res) == GX_OK else STG_EOP
    if z.kops.atomic == NULL:
        return STG_EOP
    if (<_raw_atomic_fn>z.kops.atomic)(z.kctx, NULL, addr, dt, op, a, b, res) == -1:
        _swallow()
        return STG_EOP
    return STG_OK


cdef int _land_one(ofi_zone* z, char* ring, int s, uint64_t* desc, uint64_t* words) noexcept nogil:
    """Serve the request in slot s of one ring; its status."""
    cdef uint64_t op = desc[1], off = desc[2], n = desc[3]
    cdef uintptr_t data = <uintptr_t>(ring + z.data_off + <size_t>s * z.chunk)
    cdef gx_val a, b, res
    cdef int st
    if op == STG_PUTV or op == STG_GETV:
        _tr(TR_LAND_IN)
        st = _land_vis(z, <char*>data, off, n, op == STG_PUTV)
        _tr(TR_LAND_OUT)
        return st
    if op == STG_AMO:
        n = gx_dt_size(<int>desc[4])     # a 4-byte word may end the segment
    if n > z.chunk or off > z.seg_size or n > z.seg_size - off:
        return STG_EBOUNDS
    if op == STG_PUT:
        return _land_copy(z, z.seg_base + off, data, n)
    if op == STG_GET:
        return _land_copy(z, data, z.seg_base + off, n)
    if op == STG_AMO:
        a.u64 = desc[6]
        b.u64 = desc[7]
        res.u64 = 0
        st = _land_amo(z, z.seg_base + off, <int>desc[4], <int>desc[5], a, b, &res)
        gx_stg_store(&words[z.slots + s], res.u64)
        return st
    return STG_EOP


cdef int _land_vis(ofi_zone* z, char* data, uint64_t k, uint64_t nbytes, bint put) noexcept nogil:
    """A packed VIS request (vis.pxi): the data slot holds k (offset, length)
    pairs, then (put) the k blocks back to back, unpacked here into the
    segment, or (get) room for them, gathered here from it.  Every block is
    checked before a byte moves (STG_EBOUNDS)."""
    cdef const uint64_t* lst = <const uint64_t*>data
    cdef uint64_t i, off, n, sum = 0
    cdef char* pos = data + 16 * k
    cdef int st
    if k == 0 or k > z.chunk // 16 or nbytes > z.chunk - 16 * k:
        return STG_EBOUNDS
    for i in range(k):
        off = lst[2 * i]
        n = lst[2 * i + 1]
        if off > z.seg_size or n > z.seg_size - off or n > nbytes - sum:
            return STG_EBOUNDS
        sum += n
    if sum != nbytes:
        return STG_EBOUNDS
    if z.kops != NULL and z.kops.copy_batch != NULL and k > 1:
        return _land_vis_batch(z, lst, pos, k, put)
    for i in range(k):
        off = lst[2 * i]
        n = lst[2 * i + 1]
        if put:
            st = _land_copy(z, z.seg_base + off, <uintptr_t>pos, n)
        else:
            st = _land_copy(z, <uintptr_t>pos, z.seg_base + off, n)
        if st != STG_OK:
            return st
        pos += n
    return STG_OK


cdef int _land_vis_batch(ofi_zone* z, const uint64_t* lst, char* pos, uint64_t k,
                         bint put) noexcept nogil:
    """_land_vis's copies into or out of a device segment: one call of the
    kind's copy_batch for the slot's k blocks, not a synchronous copy each
    (a slot of scattered small blocks was k round trips to the GPU)."""
    cdef uintptr_t* a = <uintptr_t*>malloc(3 * k * sizeof(uintptr_t))
    cdef uint64_t i
    cdef int rc
    if a == NULL:
        return STG_ECOPY
    for i in range(k):
        if put:
            a[i] = z.seg_base + lst[2 * i]
            a[k + i] = <uintptr_t>pos
        else:
            a[i] = <uintptr_t>pos
            a[k + i] = z.seg_base + lst[2 * i]
        a[2 * k + i] = lst[2 * i + 1]
        pos += lst[2 * i + 1]
    rc = (<_raw_copyv_fn>z.kops.copy_batch)(z.kctx, NULL, a, a + k, <size_t*>(a + 2 * k), k)
    free(a)
    if rc == -1:
        _swallow()
        return STG_ECOPY
    return STG_OK


cdef inline bint _ring_backed(int rs) noexcept nogil:
    return rs == RING_BACKED or rs == RING_PINNED


cdef long _land_ring(ofi_dom* d, ofi_zone* z, int r) noexcept nogil:
    """Serve ring r's new requests: how many.  A ring not backed (nobody
    used it yet, or its initiator released it) has one slot read: the one
    its next request goes to (z.open_slot), the initiator's STG_OPEN."""
    cdef char* ring = z.mem + <size_t>r * z.ring_bytes
    cdef uint64_t* words = <uint64_t*>(ring + _stg_words_off(z.slots))
    cdef uint64_t* desc
    cdef uint64_t q, st, flag = 0
    cdef int s, i
    cdef int rs = z.ring_state[r]
    cdef bint backed = _ring_backed(rs), released = False
    cdef long work = 0
    if rs == RING_DEAD or (d.dead_ring != NULL and d.dead_ring[r]):
        return 0            # its initiator died: nothing in it is served (_land_dead)
    z.rings_read += 1
    if backed and z.want_until != 0:
        # an initiator was refused lately: holders release once done
        if _now() < z.want_until:
            flag = STG_WANT
        else:
            z.want_until = 0
    for i in range(z.slots if backed else 1):
        s = i if backed else z.open_slot[r]
        desc = <uint64_t*>(ring + <size_t>s * STG_DESC)
        q = gx_stg_load(&desc[0])
        if q == 0 or q <= z.handled[r * z.slots + s] or gx_stg_load(&desc[15]) != q:
            continue
        if not backed and desc[1] != STG_RELEASE:
            rs = _land_accept(d, z, r, ring)
            backed = _ring_backed(rs)
        if not backed:
            # refused (or a release of a ring not backed: nothing to do)
            st = STG_EFULL if desc[1] != STG_RELEASE else STG_OK
            gx_stg_store(&words[z.slots + s], <uint64_t>z.cap)
            z.open_slot[r] = <unsigned char>(q % <uint64_t>z.slots)
        elif desc[1] == STG_OPEN:
            st = STG_OK
        elif desc[1] == STG_RELEASE:
            # the initiator's last request: every one before it answered, and
            # nothing after it written until this answer is read
            _land_release(d, z, r, ring)
            z.open_slot[r] = <unsigned char>(q % <uint64_t>z.slots)
            st = STG_OK
            released = True
        else:
            st = <uint64_t>_land_one(z, ring, s, desc, words)
        z.handled[r * z.slots + s] = q
        if st == STG_OK and not released:
            st |= flag
        gx_stg_store(&words[s], q | (st << STG_SEQ_BITS))   # after the result
        work += 1
        if released:
            break
    return work


cdef void _land_release(ofi_dom* d, ofi_zone* z, int r, char* ring) noexcept nogil:
    """Ring r's initiator released it: unpin it, give its data slots' pages
    back to the OS (the address space stays reserved, the descriptors and
    done words -- its first page -- stay: the release's own answer goes
    there), and take it off the backed list."""
    cdef int k
    if z.ring_state[r] == RING_PINNED and (<_raw_register_fn>z.kops.host_register)(
            z.kctx, ring, z.ring_bytes, 0) == -1:
        _swallow()
    if d.zone_madvise:
        madvise(ring + z.data_off, z.ring_bytes - z.data_off, MADV_DONTNEED)
    z.ring_state[r] = RING_IDLE
    for k in range(z.active):
        if z.act[k] == r:
            z.act[k] = z.act[z.active - 1]
            z.active -= 1
            if z.vis_only:
                d.backed_vis -= 1
            else:
                d.backed -= 1
            break
    z.releases += 1


cdef void _land_dead(ofi_dom* d, ofi_zone* z, int r) noexcept nogil:
    """Ring r's initiator was reported dead (caller holds d.zlock): no longer
    read (_land_ring looks at d.dead_ring first), off the backed rings --
    under the cap, the next initiator that asks gets its place -- unpinned,
    and where released rings' pages go back, all of its pages given back."""
    cdef int k
    if z.ring_state[r] == RING_DEAD:
        return
    if _ring_backed(z.ring_state[r]):
        if z.ring_state[r] == RING_PINNED and (<_raw_register_fn>z.kops.host_register)(
                z.kctx, z.mem + <size_t>r * z.ring_bytes, z.ring_bytes, 0) == -1:
            _swallow()
        for k in range(z.active):
            if z.act[k] == r:
                z.act[k] = z.act[z.active - 1]
                z.active -= 1
                if z.vis_only:
                    d.backed_vis -= 1
                else:
                    d.backed -= 1
                break
        z.reclaimed += 1
    if d.zone_madvise and z.ring_state[r] != RING_NEW:
        madvise(z.mem + <size_t>r * z.ring_bytes, z.ring_bytes, MADV_DONTNEED)
    z.ring_state[r] = RING_DEAD


cdef void _land_deaths(ofi_dom* d) noexcept nogil:
    """Take back the rings of the job ranks reported dead since the last look
    (caller holds d.zlock): in every zone served now."""
    cdef long n = gx_load_long(&d.dead_pend)
    cdef int r, i
    gx_add_long(&d.dead_pend, -n)
    for r in range(d.stg_nrings):
        if d.dead_ring[r] != 1:
            continue
        for i in range(d.nzones):
            if r < d.zones[i].nrings:
                _land_dead(d, d.zones[i], r)
        d.dead_ring[r] = 2


cdef long _land_pass(ofi_dom* d) noexcept nogil:
    """Serve every new request of every zone once: how many.  A pass reads
    the rings backed so far and, of the others, only those whose initiator
    rang (its doorbell byte, found through its group's): O(active
    initiators + N/64 bytes) per zone, never a load per job rank."""
    cdef long work = 0
    cdef int i, g, k, r, ngroups
    cdef ofi_zone* z
    cdef volatile unsigned char* bell
    cdef volatile unsigned char* bell2
    while gx_xchg_int(&d.zlock, 1) != 0:
        sched_yield()
    if d.dead_ring != NULL and gx_load_long(&d.dead_pend) > 0:
        _land_deaths(d)
    for i in range(d.nzones):
        z = d.zones[i]
        if z.closing:
            continue
        z.passes += 1
        bell = <volatile unsigned char*>(z.mem + z.bell_off)
        bell2 = <volatile unsigned char*>(z.mem + z.bell2_off)
        ngroups = (z.nrings + 63) // 64
        for g in range(ngroups):
            if bell2[g] == 0:
                continue
            # cleared before its rings are read: a bell rung after this is seen
            # next pass (the initiator rings both bytes until it is answered)
            bell2[g] = 0
            gx_mem_fence()
            for k in range(64):
                r = g * 64 + k
                if r >= z.nrings:
                    break
                if bell[r] == 0:
                    continue
                bell[r] = 0
                if not _ring_backed(z.ring_state[r]):
                    work += _land_ring(d, z, r)
        k = 0
        while k < z.active:
            r = z.act[k]
            work += _land_ring(d, z, r)
            if z.act[k] == r:
                k += 1      # (else r was released: the last backed ring moved to k)
    gx_xchg_int(&d.zlock, 0)
    if work:
        gx_add_long(&d.landed, work)
    return work


cdef int _land_accept(ofi_dom* d, ofi_zone* z, int r, char* ring) noexcept nogil:
    """Ring r's first request (or its first since its release): back it
    (and pin it, for the kind's copies, in a device zone) while fewer than
    z.cap rings are, else refuse it -- the ring stays as it was, its
    initiator asks again, and the holders are asked to release (STG_WANT):
    its new state."""
    cdef int rs = RING_BACKED
    if z.cap > 0 and z.active >= z.cap:
        z.refused += 1
        z.want_until = _now() + STG_WANT_S
        return z.ring_state[r]
    else:
        z.backs += 1
        z.act[z.active] = r
        z.active += 1
        if z.vis_only:
            d.backed_vis += 1
        else:
            d.backed += 1
        if z.kops != NULL and z.kops.host_register != NULL:
            if (<_raw_register_fn>z.kops.host_register)(z.kctx, ring, z.ring_bytes, 1) == -1:
                _swallow()      # served unpinned: the kind's copies go at pageable speed
            else:
                rs = RING_PINNED
    z.ring_state[r] = <unsigned char>rs
    return rs


cdef void _lander_thread(ofi_dom* d, volatile int* stop) noexcept nogil:
    """Serve the zones until stopped: poll hot for a while after a request
    (a staged transfer brings its chunks back to back), else nap."""
    cdef timespec ts
    cdef double hot_until = 0
    cdef long got, nap = 20000
    prctl(PR_SET_TIMERSLACK, 1000, 0, 0, 0)
    while not stop[0]:
        if d.nheld > 0:
            _ring_idle_check(NULL, d)      # this process's own rings in peers' zones
        got = _land_pass(d) if gx_load_int(&d.nzones) > 0 else 0
        if got:
            # staged transfers: 2 ms; where only VIS zones are backed, their
            # slots come back to back within a call: 300 us (a yielding
            # spinner keeps the core from the threads that bring the data)
            hot_until = _now() + (0.002 if gx_load_int(&d.backed) > 0 else 0.0003)
            nap = 20000
            continue
        if _now() < hot_until:
            sched_yield()
            continue
        # 20 us naps while a staged ring is backed (as before); where only
        # host segments' VIS zones are (bulk transfers: a late first slot
        # costs little), naps that double to 200 us while nothing comes; with
        # no ring backed, 2 ms (a first request waits that long, once per
        # initiator and zone)
        if gx_load_int(&d.backed) > 0:
            nap = 20000
        elif gx_load_int(&d.backed_vis) > 0:
            nap = nap * 2 if nap < 100000 else 200000
        elif gx_load_int(&d.nzones) > gx_load_int(&d.nvis_zones):
            nap = 2000000
        else:
            # only VIS zones, nobody has used them: up to 16 ms (every
            # process with a host segment has one; a first packed VIS call
            # to it waits that long, once)
            nap = nap * 2 if 2000000 <= nap < 16000000 else (2000000 if nap < 2000000 else 16000000)
        ts.tv_sec = 0
        ts.tv_nsec = nap
        _tr(TR_LAND_NAP)
        nanosleep(&ts, NULL)


cdef int _zone_open(ofi_ep* e, Segment seg, int nrings) except -1:
    """The landing zone of a device segment bound to e (not yet served)."""
    e.zone = _zone_make(e.dom, seg, nrings, 0, 0, False)
    e.dev_lo = <uintptr_t>seg.addr
    e.dev_hi = <uintptr_t>seg.addr + seg.size
    return 0


cdef ofi_zone* _zone_make(ofi_dom* d, Segment seg, int nrings, int slots, size_t chunk,
                          bint vis_only) except NULL:
    """A landing zone for seg: a device segment's (staged.pxi, hmem.pxi), or
    with vis_only a host segment's, for packed VIS only (vis.pxi; no bounce
    slots); slots and chunk 0: the domain's."""
    cdef ofi_zone* z = <ofi_zone*>calloc(1, sizeof(ofi_zone))
    cdef void* mem = NULL
    cdef size_t nbounce
    if z == NULL:
        raise MemoryError()
    if nrings < 1:
        nrings = 1
    try:
        z.slots = slots or d.stg_slots
        z.chunk = chunk or d.stg_chunk
        z.nrings = nrings
        z.cap = d.zone_rings
        z.vis_only = vis_only
        z.data_off = _stg_data_off(z.slots)
        # whole pages: each ring is pinned on its own (_land_accept)
        z.ring_bytes = (z.data_off + <size_t>z.slots * z.chunk + 4095) & ~(<size_t>4095)
        nbounce = 0 if vis_only else <size_t>z.slots * z.chunk
        # doorbells after the bounce slots: a byte per ring, then a byte per
        # 64 rings (_land_pass)
        z.bell_off = <size_t>nrings * z.ring_bytes + nbounce
        z.bell2_off = z.bell_off + ((<size_t>nrings + 63) & ~(<size_t>63))
        z.closed_off = z.bell2_off + (((<size_t>nrings + 63) // 64 + 63) & ~(<size_t>63))
        z.bytes = z.closed_off + 64
        # Reserved, not allocated: an anonymous mapping reads as zeros and gets
        # a page only where something is written, so a ring costs memory once
        # its initiator first uses it (its words, the chunks it sends), never
        # per job rank up front (issue 23).  A device zone pins its bounce
        # slots here, each ring when its initiator's first request backs it
        # (_land_accept), at most z.cap of them.
        mem = mmap(NULL, z.bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
        if mem == MAP_FAILED:
            raise MemoryError(f"ofi: no memory for a landing zone of {z.bytes} bytes")
        z.mem = <char*>mem
        z.bounce = z.mem + <size_t>nrings * z.ring_bytes if nbounce else NULL
        z.handled = <uint64_t*>calloc(<size_t>nrings * z.slots, sizeof(uint64_t))
        z.ring_state = <unsigned char*>calloc(<size_t>nrings, 1)
        z.open_slot = <unsigned char*>calloc(<size_t>nrings, 1)
        z.act = <int*>calloc(<size_t>nrings, sizeof(int))
        if z.handled == NULL or z.ring_state == NULL or z.act == NULL or z.open_slot == NULL:
            raise MemoryError()
        z.seg_base = <uintptr_t>seg.addr
        z.seg_size = seg.size
        impl = seg.kind.impl
        if impl is not None and not vis_only:
            z.kops = <const gx_kind_ops*>PyCapsule_GetPointer(impl.ops_capsule(), b"gexmk.kind_ops")
            z.kctx = <void*><uintptr_t>impl.handle
            # pinned: the device copies of the bounce run at DMA speed (the
            # rings: as they are backed)
            z.kops.host_register(z.kctx, z.bounce, nbounce, 1)
            z.pinned = 1
            z.amo = z.kops.atomic != NULL
        else:
            z.amo = not vis_only
    except BaseException:
        _zone_free(z)
        raise
    return z


cdef int _zone_serve(ofi_ep* e) except -1:
    return _zone_serve_z(e.dom, e.zone)


cdef int _zone_serve_z(ofi_dom* d, ofi_zone* z) except -1:
    if d.nzones >= STG_MAX_ZONES:
        raise UnsupportedError(f"ofi: more than {STG_MAX_ZONES} device segments bound in one process")
    while gx_xchg_int(&d.zlock, 1) != 0:
        sched_yield()
    d.zones[d.nzones] = z
    gx_mem_fence()
    d.nzones += 1
    if z.vis_only:
        d.nvis_zones += 1
    gx_xchg_int(&d.zlock, 0)
    return 0


cdef void _zone_close(ofi_ep* e) noexcept nogil:
    """Stop serving e's zone (the lander finishes its pass first) and free it."""
    cdef ofi_zone* z = e.zone
    if z == NULL:
        return
    e.zone = NULL
    e.dev_lo = e.dev_hi = 0
    _zone_unserve(e.dom, z)


cdef void _zone_unserve(ofi_dom* d, ofi_zone* z) noexcept nogil:
    """Stop serving z (the lander finishes its pass first) and free it."""
    cdef int i
    while gx_xchg_int(&d.zlock, 1) != 0:
        sched_yield()
    for i in range(d.nzones):
        if d.zones[i] == z:
            d.zones[i] = d.zones[d.nzones - 1]
            d.nzones -= 1
            break
    if z.vis_only:
        d.backed_vis -= z.active
        d.nvis_zones -= 1
    else:
        d.backed -= z.active
    gx_xchg_int(&d.zlock, 0)
    _zone_free(z)


cdef object _zone_counts(ofi_zone* z):
    """OfiEndpoint.zone_rings of one zone."""
    if z == NULL:
        return None
    return {"backed": z.active, "backs": z.backs, "released": z.releases, "refused": z.refused,
            "cap": z.cap, "reclaimed": z.reclaimed}


cdef object _zone_debug(ofi_zone* z):
    """What a zone's lander knows of its rings, read racing the lander (a
    diagnostic of a stuck ring: fuzz.py prints it when a rank hangs; the
    caller keeps z from being freed meanwhile): the
    counts, the backed list, and per ring touched so far its state, the slot
    an STG_OPEN is looked for in, its doorbell, and per slot the descriptor's
    first and last words and op, the last sequence served and the done word."""
    cdef char* ring
    cdef uint64_t* desc
    cdef uint64_t* words
    cdef int r, s
    if z == NULL:
        return None
    bell = <unsigned char*>(z.mem + z.bell_off)
    bell2 = <unsigned char*>(z.mem + z.bell2_off)
    rings = {}
    for r in range(z.nrings):
        ring = z.mem + <size_t>r * z.ring_bytes
        words = <uint64_t*>(ring + _stg_words_off(z.slots))
        if z.ring_state[r] == RING_NEW and bell[r] == 0 and z.handled[r * z.slots] == 0:
            continue
        slots = []
        for s in range(z.slots):
            desc = <uint64_t*>(ring + <size_t>s * STG_DESC)
            slots.append((desc[0], desc[1], desc[15], z.handled[r * z.slots + s],
                          hex(words[s])))
        rings[r] = {"state": z.ring_state[r], "open_slot": z.open_slot[r], "bell": bell[r],
                    "slots": slots}
    return {"active": z.active, "act": [z.act[r] for r in range(z.active)], "cap": z.cap,
            "backs": z.backs, "releases": z.releases, "refused": z.refused,
            "reclaimed": z.reclaimed, "want_in": z.want_until - _now() if z.want_until else 0,
            "passes": z.passes, "closing": z.closing, "bell2": bell2[0], "rings": rings}


cdef object _peer_debug(ofi_dom* d, ofi_peer* t):
    """What an initiator knows of its ring in t's zone (fuzz.py's hang
    report; read without t.stg_lock)."""
    cdef int s
    S = t.stg_slots
    return {"stg": t.stg, "vzone": t.vzone, "hmem": t.hmem, "open": t.stg_open,
            "seq": t.stg_seq, "lock": t.stg_lock, "held": t.stg_held, "wanted": t.stg_wanted,
            "idle_for": _now_coarse() - t.stg_used if t.stg_used else None,
            "ep_live": _ep_live(d, t.stg_ep) if t.stg_ep != NULL else None,
            "last": [t.stg_last[s] for s in range(S)], "ok": [t.stg_ok[s] for s in range(S)],
            "rb": [hex(t.stg_rb[s]) for s in range(2 * S)], "out": t.out,
            "dead": t.g.dead if t.g != NULL else None,
            "gone": t.gone}


cdef void _zone_free(ofi_zone* z) noexcept nogil:
    cdef int r
    if z.pinned:
        # the kind's context may be gone with its client: nothing to undo then
        if (<_raw_register_fn>z.kops.host_register)(z.kctx, z.bounce, <size_t>z.slots * z.chunk,
                                                    0) == -1:
            _swallow()
        for r in range(z.nrings if z.ring_state != NULL else 0):
            if z.ring_state[r] == RING_PINNED and (<_raw_register_fn>z.kops.host_register)(
                    z.kctx, z.mem + <size_t>r * z.ring_bytes, z.ring_bytes, 0) == -1:
                _swallow()
    if z.mem != NULL:
        munmap(z.mem, z.bytes)
    free(z.handled)
    free(z.ring_state)
    free(z.open_slot)
    free(z.act)
    free(z)


# ---- the initiator -------------------------------------------------------------

cdef inline bint _stg_local(ofi_ep* ep, gx_xfer* x) noexcept nogil:
    """Whether x's local buffer must go through the endpoint's bounce slots
    (never where it lies in a natively registered segment: hmem.pxi)."""
    if _in_hmem(ep, x.local, x.n):
        return False
    if x.local_kind != GX_MK_HOST:
        return True
    return ep.zone != NULL and not ep.hmem and ep.dom.stg_all \
        and <uintptr_t>x.local >= ep.dev_lo and <uintptr_t>x.local + x.n <= ep.dev_hi


cdef inline void _spin_lock(int* lk) noexcept nogil:
    while gx_xchg_int(lk, 1) != 0:
        sched_yield()


cdef int _stg_copy(ofi_ep* ep, uintptr_t dst, uintptr_t src, size_t n) except -1 nogil:
    """Between the endpoint's bounce slots and its bound segment."""
    cdef ofi_zone* z = ep.zone
    if z.kops == NULL:
        memcpy(<void*>dst, <void*>src, n)
        return 0
    return z.kops.copy(z.kctx, NULL, dst, src, n)


cdef int _stg_post(ofi_ep* ep, ofi_peer* t, bint write, uint64_t naddr, void* local, size_t n,
                   gx_op** out, bint delivery=True) except -1 nogil:
    """A write (delivery complete; transmit complete only with delivery
    False) or read of n bytes between local and the network address naddr of
    t's zone: handed out in *out, or waited for when out is NULL."""
    cdef int mode = GX_NB if out != NULL else GX_BLOCKING
    cdef gx_op* op = _new_op(ep, t, mode, GX_CAT_PUT if write else GX_CAT_GET)
    cdef void* desc
    cdef iovec iov
    cdef fi_rma_iov riov
    cdef fi_msg_rma msg
    cdef ssize_t rc
    cdef double deadline = 0
    rc = _desc(ep, op, local, n, FI_WRITE if write else FI_READ, &desc)
    if rc < 0:
        _drop_new(op)
        return check("fi_mr_reg", rc)
    if write:
        iov.iov_base = local
        iov.iov_len = n
        riov.addr = naddr
        riov.len = n
        riov.key = t.stg_key
        memset(&msg, 0, sizeof(msg))
        msg.msg_iov = &iov
        msg.desc = &desc
        msg.iov_count = 1
        msg.addr = t.net_addr
        msg.rma_iov = &riov
        msg.rma_iov_count = 1
        msg.context = op
    while True:
        if write:
            rc = fi_writemsg(ep.ep, &msg, (FI_COMPLETION | FI_DELIVERY_COMPLETE) if delivery
                             else FI_COMPLETION)
        else:
            rc = fi_read(ep.ep, local, n, desc, t.net_addr, naddr, t.stg_key, op)
        if not _again(rc, ep, t):
            break
        rc = _retry(ep, t, &deadline)
        if rc:
            break
    return _posted(op, t, rc, mode, <void**>out, "fi_writemsg (staged)" if write else
                   "fi_read (staged)", "staged put" if write else "staged get")


cdef int _stg_send_desc(ofi_ep* ep, ofi_peer* t, int s, uint64_t q, uint64_t op, uint64_t off,
                        uint64_t n, int dt=0, int aop=0, uint64_t a=0, uint64_t b=0) except -1 nogil:
    """The request descriptor of sequence q into slot s of t's ring."""
    cdef uint64_t* d = t.stg_dbuf
    cdef uint64_t naddr = t.stg_ring + <uint64_t>s * STG_DESC
    memset(d, 0, STG_DESC)
    d[0] = q
    d[1] = op
    d[2] = off
    d[3] = n
    d[4] = <uint64_t>dt
    d[5] = <uint64_t>aop
    d[6] = a
    d[7] = b
    d[15] = q
    if STG_DESC > ep.dom.inject_size:
        return _stg_post(ep, t, True, naddr, d, STG_DESC, NULL)
    return _inject_write(ep, ep.ep, t, d, STG_DESC, naddr, t.stg_key, False, 0,
                         "fi_inject_write (staged request)", True)


cdef int _stg_failed(ofi_peer* t, int s, uint64_t status) except -1 with gil:
    from gexmk.errors import BoundsError
    who = f"job rank {t.g.jobrank}"
    if status == STG_EBOUNDS:
        raise BoundsError(f"ofi-staged: {who} refused a request outside its segment")
    if status == STG_ECLOSED:
        raise SegmentError(f"ofi-staged: {who} has unbound or destroyed the segment published "
                           "to this process (republish it to reach its new one)")
    if status == STG_EFULL:
        raise CommunicationError(f"ofi-staged: {who}'s landing zone backs no ring for this process "
                                 "now (its GEXMK_OFI_ZONE_RINGS)")
    if status == STG_ECOPY:
        raise CommunicationError(f"ofi-staged: the device copy at {who} failed (its segment "
                                 "destroyed, or its device in error?)")
    raise UnsupportedError(f"ofi-staged: {who} cannot run this atomic on its device segment")


cdef inline uint64_t _stg_seq(uint64_t done) noexcept nogil:
    return done & ((<uint64_t>1 << STG_SEQ_BITS) - 1)


cdef int _stg_wait_slot(ofi_ep* ep, ofi_peer* t, int s, uint64_t want,
                        bint soft=False, bint ringing=False) except -1 nogil:
    """Until slot s of t's ring has served sequence number want; raise what
    the target reported for it (soft: STG_EFULL is returned, 1, not raised;
    ringing: the ring's first request, its doorbell rung again each poll)."""
    cdef int S = t.stg_slots, polls = 0
    cdef double deadline = 0
    cdef timespec ts
    cdef uint64_t st
    cdef long nap = 5000
    cdef bint traced = _tr_t != NULL and _stg_seq(t.stg_rb[s]) < want
    if traced:
        _tr(TR_VIS_SLOT_IN)
    while _stg_seq(t.stg_rb[s]) < want:
        _tr(TR_STG_POLL)
        _stg_post(ep, t, False, t.stg_ring + _stg_words_off(S), t.stg_rb, 8 * <size_t>S, NULL)
        if _stg_seq(t.stg_rb[s]) >= want:
            break
        if t.g.dead:
            return _raise_dead(t, "staged transfer")
        if ringing and (polls & 3) == 3:
            # a retired zone answers no first request: its closed word says so
            _stg_post(ep, t, False, t.stg_closed, &t.stg_closed_rb, 8, NULL)
            if t.stg_closed_rb != 0:
                # the ring was not opened: the next operation asks again
                # (and learns the same), never writes into a ring of the
                # retired zone that no done word answers
                t.stg_seq = want - 1
                t.stg_last[s] = t.stg_ok[s]
                return _stg_failed(t, s, STG_ECLOSED)
            _stg_ring_bell(ep, t)
        polls += 1
        if polls > 4:
            if deadline == 0:
                deadline = _now() + ep.dom.timeout
            elif _now() > deadline:
                return _raise_timeout(t, ep.dom.timeout, "staged transfer (the target's lander)")
            # naps that double (5 us .. 200 us): each poll is a read the
            # target's progress must serve, CPU its lander may need
            ts.tv_sec = 0
            ts.tv_nsec = nap
            nanosleep(&ts, NULL)
            if nap < 200000:
                nap *= 2
    if traced:
        _tr(TR_VIS_SLOT_OUT)
    if t.stg_ok[s] < want:
        t.stg_ok[s] = want
        st = t.stg_rb[s] >> STG_SEQ_BITS
        if st & STG_WANT:
            t.stg_wanted = 1
            st &= ~(<uint64_t>STG_WANT)
        if soft and st == STG_EFULL and _stg_seq(t.stg_rb[s]) == want:
            return 1
        if st == STG_ECLOSED or (st != STG_OK and _stg_seq(t.stg_rb[s]) == want):
            return _stg_failed(t, s, st)
    return 0


cdef unsigned char _BELL = 1     # what a doorbell write carries (static: never freed under it)


cdef int _stg_ring_bell(ofi_ep* ep, ofi_peer* t) except -1 nogil:
    """Set this process's doorbell byte in t's zone, then its group's: the
    target's lander reads a ring only once it was rung (or is backed).
    Rung again while the first request waits (_stg_wait_slot): the lander
    clears a group's byte before reading its rings, and the two writes may
    land in either order, or before the request itself."""
    _inject_write(ep, ep.ep, t, &_BELL, 1, t.stg_bell, t.stg_key, False, 0,
                  "fi_inject_write (landing zone doorbell)", True)
    return _inject_write(ep, ep.ep, t, &_BELL, 1, t.stg_bell2, t.stg_key, False, 0,
                         "fi_inject_write (landing zone doorbell)", True)


cdef int _stg_open(ofi_ep* ep, ofi_peer* t, bint wait=True) except -1 nogil:
    """This process's ring in t's zone, backed by the target on request
    (STG_OPEN, in the slot of the ring's next sequence number: all its lander
    looks at in a ring not backed): 1.  Where the zone backs as many rings
    as its GEXMK_OFI_ZONE_RINGS allows: with wait, ask again (naps; this
    process's own idle rings released meanwhile) until one is released or
    GEXMK_TIMEOUT passes (GexmkTimeoutError naming the cap); without, 0 (VIS
    to a host segment then goes direct, and asks again after STG_RETRY_S).
    Caller holds t.stg_lock."""
    cdef int S = t.stg_slots, s
    cdef uint64_t q
    cdef double deadline = 0
    cdef long nap = STG_OPEN_NAP_MIN
    cdef timespec ts
    if t.stg_open == 1:
        return 1
    if t.stg_open == 3:
        # released: its answer first (the lander has given the ring's pages
        # back by then; nothing may land in it before)
        s = <int>((t.stg_seq - 1) % S)
        _stg_release_resend(ep, t, s)
        _stg_wait_slot(ep, t, s, t.stg_seq)
        t.stg_open = 0
    if t.stg_open == 2:
        if not wait and _now_coarse() < t.stg_retry_at:
            return 0
        t.stg_open = 0
    while True:
        q = t.stg_seq + 1
        s = <int>((q - 1) % S)
        if t.stg_last[s] > t.stg_ok[s]:
            _stg_wait_slot(ep, t, s, t.stg_last[s])
        t.stg_seq = q
        t.stg_last[s] = q
        _stg_send_desc(ep, t, s, q, STG_OPEN, 0, 0)
        _stg_ring_bell(ep, t)
        if _stg_wait_slot(ep, t, s, q, True, True) == 0:
            t.stg_open = 1
            t.stg_wanted = 0
            t.stg_used = _now_coarse()
            t.stg_ep = ep
            gx_add_long(&ep.dom.n_ring_opens, 1)
            _held_add(ep.dom, t)
            return 1
        if not wait:
            t.stg_open = 2
            t.stg_retry_at = _now_coarse() + STG_RETRY_S
            return 0
        # the cap: holders release once idle (or once done, asked by the
        # zone); this process's own idle rings go meanwhile
        gx_add_long(&ep.dom.n_ring_waits, 1)
        if deadline == 0:
            deadline = _now() + ep.dom.timeout
        elif _now() > deadline:
            _stg_post(ep, t, False, t.stg_ring + _stg_words_off(S) + 8 * <uint64_t>(S + s),
                      &t.stg_rb[S + s], 8, NULL)
            return _stg_cap_timeout(t, s, ep.dom.timeout, t.vzone)
        if t.g.dead:
            return _raise_dead(t, "staged transfer (waiting for a landing ring)")
        ep.dom.idle_next = 0
        _ring_idle_check(ep)
        _progress_all(ep.dom)
        ts.tv_sec = 0
        ts.tv_nsec = nap
        nanosleep(&ts, NULL)
        if nap < STG_OPEN_NAP_MAX:
            nap *= 2


cdef inline bint _stg_quiet(ofi_peer* t) noexcept nogil:
    """Every request sent through t's ring answered: nothing of this process
    in flight to it."""
    cdef int s
    for s in range(t.stg_slots):
        if t.stg_last[s] > t.stg_ok[s]:
            return False
    return True


cdef int _stg_release(ofi_ep* ep, ofi_peer* t) noexcept nogil:
    """Give this process's ring in t's zone back: STG_RELEASE, its last
    request.  Caller holds t.stg_lock with every request before answered
    (_stg_quiet): the ring holds nothing of ours in flight, so the lander may
    drop its pages.  Sent, never waited for -- the next operation to t reads
    the release's answer before it asks for a ring again (_stg_open) -- as
    a write from t.stg_rel whose op is orphaned at once: no nbi_wait counts
    it, and its failure (a peer that closed its endpoint meanwhile) reaches
    no one, where the next operation to t reports what is wrong.  It takes no GIL
    and raises nothing (the lander thread calls it, which must not wait for
    the GIL: an application thread may hold it while it waits for a peer
    whose lander waits for ours): a few tries while the transmit queue is
    full, else nothing changes and a later look tries again.  1 when
    released."""
    cdef int S = t.stg_slots
    cdef uint64_t q = t.stg_seq + 1
    cdef int s = <int>((q - 1) % S), tries
    cdef uint64_t* d = t.stg_rel
    cdef gx_op* op
    cdef void* desc = NULL
    cdef iovec iov
    cdef fi_rma_iov riov
    cdef fi_msg_rma msg
    cdef ssize_t rc = -FI_EAGAIN
    cdef bint ok
    cdef ofi_proc* held = _gate_try(ep.dom, t, &ok)     # conncap.pxi
    if not ok:
        return 0                # its connections are being closed: a later look
    memset(d, 0, STG_DESC)
    d[0] = q
    d[1] = STG_RELEASE
    d[15] = q
    op = _new_op(ep, t, GX_NB, GX_CAT_PUT)
    if op == NULL:
        _gate_exit(held)
        return 0
    if _desc(ep, op, d, STG_DESC, FI_WRITE, &desc) < 0:
        _drop_new(op)
        _gate_exit(held)
        return 0
    iov.iov_base = <void*>d
    iov.iov_len = STG_DESC
    riov.addr = t.stg_ring + <uint64_t>s * STG_DESC
    riov.len = STG_DESC
    riov.key = t.stg_key
    memset(&msg, 0, sizeof(msg))
    msg.msg_iov = &iov
    msg.desc = &desc
    msg.iov_count = 1
    msg.addr = t.net_addr
    msg.rma_iov = &riov
    msg.rma_iov_count = 1
    msg.context = op
    op.rel = 1
    gx_xchg_int(&t.stg_rel_lost, 0)
    gx_xchg_int(&t.stg_rel_out, 1)
    for tries in range(64):
        rc = fi_writemsg(ep.ep, &msg, FI_COMPLETION)
        if not _again(rc, ep, t):
            break
        if _progress_all(ep.dom) < 0:
            break
    if rc != 0:
        gx_xchg_int(&t.stg_rel_out, 0)
        _drop_new(op)
        _gate_exit(held)
        return 0
    _orphan(op)
    # no one waits for the release: a close under the connection cap flushes
    # it first (conncap.pxi _conn_release_flush; not the touched list, which
    # the application's nbi_wait flushes: a release to a peer that died or
    # closed its endpoint since would fail the application's sync)
    t.stg_seq = q
    t.stg_last[s] = q
    t.stg_open = 3
    t.stg_ep = ep               # where a read ordered after it must go
    t.stg_wanted = 0
    _held_drop(ep.dom, t)
    gx_add_long(&ep.dom.n_ring_releases, 1)
    _gate_exit(held)            # recorded (touched, stg_open): a close's drain sees it
    return 1


cdef int _stg_done(ofi_ep* ep, ofi_peer* t) noexcept nogil:
    """An operation through t's ring ended well (caller still holds
    t.stg_lock): when it was; released now if the zone asked."""
    t.stg_used = _now_coarse()
    t.stg_ep = ep
    if t.stg_wanted and t.stg_open == 1 and not t.g.dead and _stg_quiet(t):
        _stg_release(ep, t)
    return 0


cdef int _stg_release_resend(ofi_ep* ep, ofi_peer* t, int s) except -1 nogil:
    """Before the answer to this process's release is awaited (caller holds
    t.stg_lock): once its write has ended, write it again where it failed --
    a connection closed under the cap whose reconnection the peer's rxm
    refused (-FI_ENOTCONN) lost it, and its answer would never come
    (ofi-tcp-capped-rings soak, seed 890204: the next operation to that
    target waited for GEXMK_TIMEOUT).  The same descriptor, the same sequence
    number: a lander that did serve it serves a number once."""
    cdef double deadline = 0
    cdef bint live
    gx_add_long(&ep.dom.readers, 1)
    gx_mem_fence()
    live = t.stg_ep != NULL and _ep_live(ep.dom, t.stg_ep)
    gx_add_long(&ep.dom.readers, -1)
    if not live:
        # the endpoint it went through has closed since: its completion may
        # never be read; its answer is awaited as before
        gx_xchg_int(&t.stg_rel_out, 0)
        gx_xchg_int(&t.stg_rel_lost, 0)
        return 0
    while gx_load_int(&t.stg_rel_out):
        if t.g.dead:
            return _raise_dead(t, "staged transfer (a ring's release)")
        if deadline == 0:
            deadline = _now() + ep.dom.timeout
        elif _now() > deadline:
            return _raise_timeout(t, ep.dom.timeout, "staged transfer (a ring's release)")
        _progress_all(ep.dom)
    if gx_xchg_int(&t.stg_rel_lost, 0):
        gx_add_long(&ep.dom.n_release_resent, 1)
        _stg_post(ep, t, True, t.stg_ring + <uint64_t>s * STG_DESC, t.stg_rel, STG_DESC, NULL)
    return 0


cdef void _stg_new_ring(ofi_dom* d, ofi_peer* t) noexcept nogil:
    """t's endpoint was published again without the zone this process's ring
    was in (its segment unbound, or another bound): forget the ring, never
    to write to it again, not even its release.  The owner frees the old
    zone's key once every member has applied this publication
    (OfiEndpoint._retire_mr), and over tcp;ofi_rxm a write with a key it no
    longer knows takes the pair's connection down (fuzz seed 815274: an
    idle release sent after the apply; the next put raised ENOTCONN).
    Under t.stg_lock: the lander thread releases idle rings too.  A release
    sent before (t.stg_open 3), which no one waits for, may still be on its
    way: it lands first (_stg_release_landed), before this process counts as
    having applied the publication (fuzz seed 815274 again, 1 replay in ~30:
    the lander's release, posted just before the apply, reached the owner
    after it had freed the old key)."""
    _spin_lock(&t.stg_lock)
    _stg_release_landed(d, t)
    t.stg_seq = 0
    t.stg_open = 0
    t.stg_wanted = 0
    memset(t.stg_last, 0, sizeof(t.stg_last))
    memset(t.stg_ok, 0, sizeof(t.stg_ok))
    memset(t.stg_rb, 0, sizeof(t.stg_rb))
    gx_xchg_int(&t.stg_rel_lost, 0)
    _held_drop(d, t)
    gx_xchg_int(&t.stg_lock, 0)


cdef void _stg_release_landed(ofi_dom* d, ofi_peer* t) noexcept nogil:
    """Wait until a release of ours to t's zone (t.stg_open 3: sent, its
    answer not read) has landed, by a read of its done word from the
    endpoint it went through, ordered after it (FI_ORDER_RAW), with the zone's
    key, which the owner keeps until this process has applied its new
    publication (caller holds t.stg_lock).  Bounded like any op (death,
    GEXMK_TIMEOUT); its failure, like the release's own, is left to the next
    operation to t to report.  Only where the owner keeps retired keys (keys
    of gexmk's choosing, offset addressing: OfiEndpoint._retire); elsewhere
    it closed the registration at the unbinding, and the read would be the
    stale access itself."""
    cdef ofi_ep* ep = t.stg_ep
    cdef gx_op* op
    cdef int s
    if not _release_unanswered(t) or t.stg_slots <= 0:
        return
    if d.mr_mode & (FI_MR_VIRT_ADDR | FI_MR_PROV_KEY | FI_MR_RAW | FI_MR_ENDPOINT):
        return
    gx_add_long(&d.readers, 1)
    gx_mem_fence()
    if _ep_live(d, ep):
        s = <int>((t.stg_seq - 1) % t.stg_slots)
        op = _read_one(ep, t, t.stg_ring + _stg_words_off(t.stg_slots) + 8 * <uint64_t>s,
                       t.stg_key)
        if op != NULL:
            if _spin(op, t):
                _orphan(op)
            else:
                free(op)
            gx_add_long(&d.n_release_landed, 1)
    gx_add_long(&d.readers, -1)


cdef void _held_add(ofi_dom* d, ofi_peer* t) noexcept nogil:
    """List t's ring among those this process holds (caller holds t.stg_lock)."""
    cdef ofi_peer** grown
    cdef int n
    if t.stg_held:
        return
    _spin_lock(&d.held_lock)
    if d.nheld == d.held_cap:
        n = d.held_cap * 2 if d.held_cap else 16
        grown = <ofi_peer**>realloc(d.held, <size_t>n * sizeof(ofi_peer*))
        if grown == NULL:
            gx_xchg_int(&d.held_lock, 0)
            return                  # not listed: never released for idleness
        d.held = grown
        d.held_cap = n
    d.held[d.nheld] = t
    d.nheld += 1
    t.stg_held = 1
    gx_xchg_int(&d.held_lock, 0)


cdef void _held_drop(ofi_dom* d, ofi_peer* t) noexcept nogil:
    cdef int i
    if not t.stg_held:
        return
    _spin_lock(&d.held_lock)
    for i in range(d.nheld):
        if d.held[i] == t:
            d.held[i] = d.held[d.nheld - 1]
            d.nheld -= 1
            break
    t.stg_held = 0
    gx_xchg_int(&d.held_lock, 0)


cdef int _ring_idle_check(ofi_ep* ep, ofi_dom* bg=NULL) noexcept nogil:
    """Release this process's rings in peers' zones that sat unused for
    GEXMK_OFI_RING_IDLE seconds, each through the endpoint of its last
    operation while that is live, else through ep.  Called where the
    application enters gexmk (staged operations, waits, barriers) and by the
    process's lander thread (bg: the domain, ep NULL: no GIL taken, no
    exception, only through a live endpoint of the ring's last operation) --
    a process that sits in a bootstrap collective or computes still gives
    its rings back.  Looks at most every quarter of the setting.  A ring in
    use by another thread (its lock taken) is left for the next look.  How
    many it released."""
    cdef ofi_dom* d = bg if bg != NULL else ep.dom
    cdef ofi_peer* cand[64]
    cdef ofi_peer* t
    cdef int i, n = 0, got = 0
    cdef double now
    if d.ring_idle <= 0 or d.nheld == 0:
        return 0
    now = _now_coarse()
    if now < d.idle_next:
        return 0
    if gx_xchg_int(&d.held_lock, 1) != 0:
        return 0
    d.idle_next = now + (d.ring_idle / 4 if d.ring_idle > 0.004 else 0.001)
    for i in range(d.nheld):
        t = d.held[i]
        if t.stg_open != 1 or now - t.stg_used >= d.ring_idle:
            cand[n] = t
            n += 1
            if n == 64:
                break
    gx_xchg_int(&d.held_lock, 0)
    # the endpoints stay registered while this thread counts as a reader
    gx_add_long(&d.readers, 1)
    gx_mem_fence()
    for i in range(n):
        t = cand[i]
        if gx_xchg_int(&t.stg_lock, 1) != 0:
            continue
        if t.stg_open != 1 or t.g.dead or t.gone:
            _held_drop(d, t)        # its zone was republished, or it died or closed: not ours now
        elif now - t.stg_used >= d.ring_idle and _stg_quiet(t):
            if _ep_live(d, t.stg_ep):
                got += _stg_release(t.stg_ep, t)
            elif bg == NULL:
                got += _stg_release(ep, t)
        gx_xchg_int(&t.stg_lock, 0)
    gx_add_long(&d.readers, -1)
    return got


cdef bint _ep_live(ofi_dom* d, ofi_ep* e) noexcept nogil:
    cdef long i
    for i in range(gx_load_long(&d.neps)):
        if d.eps[i] == e:
            return not gx_load_int(&e.closed)
    return False


cdef int _stg_cap_timeout(ofi_peer* t, int s, double secs, bint vis) except -1 with gil:
    """A staged operation waited GEXMK_TIMEOUT for a ring in t's zone."""
    cap = t.stg_rb[t.stg_slots + s]     # the refusal's result word
    zone = "VIS landing zone" if vis else "landing zone"
    raise GxTimeoutError(f"ofi-staged: job rank {t.g.jobrank}'s {zone} backed no ring for this "
                         f"process within {secs:g} s (GEXMK_TIMEOUT): it backs {cap} at once "
                         "(GEXMK_OFI_ZONE_RINGS there), all held by initiators that did not "
                         "release theirs -- they do once unused for GEXMK_OFI_RING_IDLE seconds, "
                         "when they next call into gexmk, or after their next operation through "
                         "it (raise the cap there; 0: no cap)")


cdef int _stg_refused(ofi_peer* t) except -1 with gil:
    return _stg_failed(t, 0, STG_EFULL)


cdef int _stg_wait_all(ofi_ep* ep, ofi_peer* t) except -1 nogil:
    cdef int s
    for s in range(t.stg_slots):
        if t.stg_last[s] > t.stg_ok[s]:
            _stg_wait_slot(ep, t, s, t.stg_last[s])
    return 0


cdef int _stg_put_zone(ofi_ep* ep, ofi_peer* t, uint64_t off, char* local, size_t n,
                       bint lstg) except -1 nogil:
    """Chunks of local into t's zone; complete (landed in the device segment) on return."""
    cdef int S = t.stg_slots, W = S, s, h = 0, cnt = 0, i
    cdef size_t C = t.stg_chunk, pos = 0, m
    cdef uint64_t q
    cdef gx_op* ops[STG_MAX_SLOTS]
    cdef gx_op* op
    cdef uint64_t pseq[STG_MAX_SLOTS]
    cdef uint64_t poff[STG_MAX_SLOTS]
    cdef uint64_t plen[STG_MAX_SLOTS]
    cdef char* src
    if lstg:
        if ep.zone.chunk < C:
            C = ep.zone.chunk
        if ep.zone.slots < W:
            W = ep.zone.slots
    for i in range(STG_MAX_SLOTS):
        ops[i] = NULL
    try:
        while pos < n or cnt > 0:
            # the oldest chunks whose data has landed: their descriptors, in order
            while cnt > 0:
                i = h % W
                if pos < n and cnt < W and gx_load_int(&ops[i].state) != OP_DONE:
                    _progress(ep)
                    if gx_load_int(&ops[i].state) != OP_DONE:
                        break
                # _wait_op frees the op whatever happens: not ours to orphan below
                op = ops[i]
                ops[i] = NULL
                _wait_op(op, t, "staged put (data)")
                _stg_send_desc(ep, t, <int>((pseq[i] - 1) % S), pseq[i], STG_PUT, poff[i], plen[i])
                h += 1
                cnt -= 1
            if pos >= n or cnt == W:
                continue
            q = t.stg_seq + 1
            s = <int>((q - 1) % S)
            if t.stg_last[s] > t.stg_ok[s]:
                _stg_wait_slot(ep, t, s, t.stg_last[s])
            m = n - pos if n - pos < C else C
            src = local + pos
            i = (h + cnt) % W
            if lstg:
                src = ep.zone.bounce + <size_t>i * ep.zone.chunk
                _stg_copy(ep, <uintptr_t>src, <uintptr_t>(local + pos), m)
            t.stg_seq = q
            t.stg_last[s] = q
            pseq[i] = q
            poff[i] = off + pos
            plen[i] = m
            _stg_post(ep, t, True, t.stg_ring + _stg_data_off(S) + <uint64_t>s * t.stg_chunk, src, m,
                      &ops[i])
            cnt += 1
            pos += m
        _stg_wait_all(ep, t)
    finally:
        for i in range(STG_MAX_SLOTS):
            if ops[i] != NULL:
                _orphan(ops[i])
    return 0


cdef int _stg_get_zone(ofi_ep* ep, ofi_peer* t, uint64_t off, char* local, size_t n,
                       bint lstg) except -1 nogil:
    """Chunks of t's segment into local, S requests ahead; complete on return."""
    cdef int S = t.stg_slots, s
    cdef size_t C = t.stg_chunk, m, k, posted = 0, got = 0
    cdef uint64_t q
    cdef uint64_t qs[STG_MAX_SLOTS]
    cdef char* dst
    if lstg and ep.zone.chunk < C:
        C = ep.zone.chunk
    k = (n + C - 1) // C
    while got < k:
        while posted < k and posted - got < <size_t>S:
            q = t.stg_seq + 1
            s = <int>((q - 1) % S)
            if t.stg_last[s] > t.stg_ok[s]:
                _stg_wait_slot(ep, t, s, t.stg_last[s])
            m = n - posted * C if n - posted * C < C else C
            t.stg_seq = q
            t.stg_last[s] = q
            qs[posted % S] = q
            _stg_send_desc(ep, t, s, q, STG_GET, off + posted * C, m)
            posted += 1
        q = qs[got % S]
        s = <int>((q - 1) % S)
        _stg_wait_slot(ep, t, s, q)
        m = n - got * C if n - got * C < C else C
        dst = ep.zone.bounce if lstg else local + got * C
        _stg_post(ep, t, False, t.stg_ring + _stg_data_off(S) + <uint64_t>s * t.stg_chunk,
                  dst, m, NULL)
        if lstg:
            _stg_copy(ep, <uintptr_t>(local + got * C), <uintptr_t>dst, m)
        got += 1
    return 0


cdef int _stg_host_put(ofi_ep* ep, ofi_peer* t, uintptr_t remote, char* local, size_t n) except -1 nogil:
    """Device memory of this endpoint to a host segment: through the bounce
    slots, each chunk's network write overlapping the next chunk's copy."""
    cdef ofi_zone* z = ep.zone
    cdef gx_op* ops[STG_MAX_SLOTS]
    cdef gx_op* op
    cdef int b, i = 0
    cdef size_t pos = 0, m
    cdef char* buf
    for b in range(STG_MAX_SLOTS):
        ops[b] = NULL
    try:
        while pos < n:
            b = i % z.slots
            if ops[b] != NULL:
                op = ops[b]
                ops[b] = NULL
                _wait_op(op, t, "staged put")
            m = n - pos if n - pos < z.chunk else z.chunk
            buf = z.bounce + <size_t>b * z.chunk
            _stg_copy(ep, <uintptr_t>buf, <uintptr_t>(local + pos), m)
            net_put(ep, t, remote + pos, buf, m, GX_NB, <void**>&ops[b])
            pos += m
            i += 1
        for b in range(z.slots):
            if ops[b] != NULL:
                op = ops[b]
                ops[b] = NULL
                _wait_op(op, t, "staged put")
    finally:
        for b in range(STG_MAX_SLOTS):
            if ops[b] != NULL:
                _orphan(ops[b])
    return 0


cdef int _stg_host_get(ofi_ep* ep, ofi_peer* t, uintptr_t remote, char* local, size_t n) except -1 nogil:
    """A host segment into device memory of this endpoint: reads into the
    bounce slots, slots ahead, each copied in as it completes."""
    cdef ofi_zone* z = ep.zone
    cdef gx_op* ops[STG_MAX_SLOTS]
    cdef gx_op* op
    cdef size_t C = z.chunk, k = (n + z.chunk - 1) // z.chunk, posted = 0, got = 0, m
    cdef int b
    for b in range(STG_MAX_SLOTS):
        ops[b] = NULL
    try:
        while got < k:
            while posted < k and posted - got < <size_t>z.slots:
                b = <int>(posted % z.slots)
                m = n - posted * C if n - posted * C < C else C
                net_get(ep, t, remote + posted * C, z.bounce + <size_t>b * C, m, GX_NB,
                        <void**>&ops[b])
                posted += 1
            b = <int>(got % z.slots)
            op = ops[b]
            ops[b] = NULL
            _wait_op(op, t, "staged get")
            m = n - got * C if n - got * C < C else C
            _stg_copy(ep, <uintptr_t>(local + got * C), <uintptr_t>(z.bounce + <size_t>b * C), m)
            got += 1
    finally:
        for b in range(STG_MAX_SLOTS):
            if ops[b] != NULL:
                _orphan(ops[b])
    return 0


cdef int stg_rma(gx_xfer* x, bint put) except -1 nogil:
    """A put or get where the target, the local buffer or both are device
    memory: complete on return whatever the mode (x.handle: NULL)."""
    cdef ofi_ep* ep = <ofi_ep*>x.ep
    cdef ofi_peer* t = <ofi_peer*>x.peer
    cdef bint lstg = _stg_local(ep, x)
    if lstg and ep.zone == NULL:
        with gil:
            raise StateError("ofi-staged: the endpoint's device segment is no longer bound")
    if x.n == 0:
        pass
    elif t.stg:
        _app_active(ep.dom)
        _ring_idle_check(ep)
        if lstg:
            _spin_lock(&ep.bb_lock)
        _spin_lock(&t.stg_lock)
        try:
            if not _stg_open(ep, t):
                _stg_refused(t)
            if put:
                _stg_put_zone(ep, t, x.remote - t.g.remote_base, <char*>x.local, x.n, lstg)
            else:
                _stg_get_zone(ep, t, x.remote - t.g.remote_base, <char*>x.local, x.n, lstg)
            _stg_done(ep, t)
        finally:
            gx_xchg_int(&t.stg_lock, 0)
            if lstg:
                gx_xchg_int(&ep.bb_lock, 0)
    else:
        _spin_lock(&ep.bb_lock)
        try:
            if put:
                _stg_host_put(ep, t, x.remote, <char*>x.local, x.n)
            else:
                _stg_host_get(ep, t, x.remote, <char*>x.local, x.n)
        finally:
            gx_xchg_int(&ep.bb_lock, 0)
    if x.handle != NULL:
        x.handle[0] = NULL          # complete at issue: no op to wait for
    return 0


cdef int stg_amo(ofi_ep* ep, ofi_peer* t, uintptr_t remote, int dt, int op, gx_val a, gx_val b,
                 gx_val* result) except -1 nogil:
    """An atomic on a staged (or natively registered, hmem.pxi) target's
    device segment, run there by its lander; the old value to *result (may
    be NULL)."""
    cdef int s
    cdef uint64_t q
    if not t.stg_amo:
        with gil:
            raise UnsupportedError(f"ofi-staged: job rank {t.g.jobrank}'s device segment has no "
                                   "device atomics (its memory kind has none)")
    _app_active(ep.dom)
    _ring_idle_check(ep)
    _spin_lock(&t.stg_lock)
    try:
        if not _stg_open(ep, t):
            _stg_refused(t)
        q = t.stg_seq + 1
        s = <int>((q - 1) % t.stg_slots)
        if t.stg_last[s] > t.stg_ok[s]:
            _stg_wait_slot(ep, t, s, t.stg_last[s])
        t.stg_seq = q
        t.stg_last[s] = q
        _stg_send_desc(ep, t, s, q, STG_AMO, remote - t.g.remote_base, 8, dt, op, a.u64, b.u64)
        _stg_wait_slot(ep, t, s, q)
        if result != NULL:          # written before the done word: read it after that
            _stg_post(ep, t, False, t.stg_ring + _stg_words_off(t.stg_slots) + 8 * <uint64_t>(
                t.stg_slots + s), &t.stg_rb[t.stg_slots + s], 8, NULL)
            result[0].u64 = t.stg_rb[t.stg_slots + s]
        _stg_done(ep, t)
    finally:
        gx_xchg_int(&t.stg_lock, 0)
    return 0
