# ---------------------------------------------------------------------------
# Host-staged device paths (issue 11): a device segment on another GPU that
# this process may not map for its own GPU (peer access off, or forced off by
# GEXMK_CUDA_PEER_ACCESS=off) is mapped for the segment's own GPU instead, and
# copies between it and the endpoint's device memory go through the
# endpoint's pinned bounce buffers: the segment's GPU copies one chunk while
# the endpoint's GPU copies the next, so both copy engines run at once.
# Host-memory local buffers need no staging (the segment's GPU reaches them).
# ---------------------------------------------------------------------------
cdef int _staged_unsupported(str what) except -1 with gil:
    raise UnsupportedError(f"{what} on a host-staged device path (nbrhd-staged/self-staged: "
                           f"peer access between the GPUs is off)")


cdef lp_bounce* _staged_bounce(lp_ep* ep) except NULL nogil:
    """The endpoint's bounce buffers, for this thread alone (waits while
    another thread's copy uses them, and for the GPUs' last stream-ordered
    transfer through them)."""
    cdef lp_bounce* bb = ep.bb
    cdef bint ok
    if bb == NULL:
        bb = _bounce_make(ep, &ep.k)
    if bb == NULL or bb.nbuf <= 0:
        with gil:
            raise UnsupportedError("a host-staged device copy needs pinned bounce buffers "
                                   "(GEXMK_PAGEABLE_BUFFERS is 0, or pinning failed)")
    while gx_xchg_int(&bb.busy, 1) != 0:
        sched_yield()
    ok = False
    try:
        _bounce_idle(bb)
        ok = True
    finally:
        if not ok:
            gx_xchg_int(&bb.busy, 0)
    return bb


cdef int _bounce_idle(lp_bounce* bb) except -1 nogil:
    """Wait until the GPUs are done with the buffers: the stream-ordered
    staged transfer that last used them (if any) has run."""
    cdef void* ev = bb.pend
    if ev == NULL:
        return 0
    bb.pend = NULL
    try:
        bb.ops.event_sync(bb.kctx, ev)
    finally:
        bb.ops.event_destroy(bb.kctx, ev)
    return 0


cdef int _fence(lp_kind* ka, void* sa, lp_kind* kb, void* sb) except -1 nogil:
    """Work issued on stream sb (kind kb) from now on waits for what stream sa
    (kind ka, maybe another GPU) has been given so far: on the GPUs."""
    cdef void* ev = NULL
    ka.ops.event_record(ka.kctx, sa, &ev)
    try:
        kb.ops.stream_wait(kb.kctx, sb, ev)
    finally:
        ka.ops.event_destroy(ka.kctx, ev)     # destroyed once the wait has used it
    return 0


cdef void* _staged_stream_ready(gx_xfer* x, lp_ep* ep, lp_dev* d) except NULL nogil:
    """What a stream-ordered host-staged transfer needs (kinds that order
    streams on each other, no capture): the endpoint's stream in the
    segment's context it runs the segment's copies on."""
    cdef lp_kind* lk = &ep.k
    cdef lp_kind* rk = &d.k
    cdef void* rs
    if lk.ops == NULL or lk.ops.stream_wait == NULL or rk.ops.stream_wait == NULL:
        _staged_unsupported("a stream-ordered put or get (the kind cannot order "
                            "streams on each other)")
    if lk.ops.stream_capturing != NULL and lk.ops.stream_capturing(lk.kctx, x.stream):
        _staged_unsupported("a put or get captured into a CUDA graph (its bounce "
                            "buffers would be shared with every replay)")
    rs = _ep_stream(ep, rk, 2)
    if rs == NULL:
        _staged_unsupported("a stream-ordered copy with no stream left on the endpoint")
    return rs


cdef int _staged_stream(gx_xfer* x, lp_ep* ep, lp_dev* d, uintptr_t remote, bint put) except -1 nogil:
    """A put or get on the user's stream x.stream (in the endpoint's context)
    over a host-staged path, ordered on the GPUs with no host wait: host
    memory is copied by the segment's GPU between two fences with the user's
    stream; device memory through the bounce slots (_staged_stream_frags)."""
    cdef void* rs = _staged_stream_ready(x, ep, d)
    cdef gx_frag one
    if x.local_kind == GX_MK_HOST:
        # the segment's GPU reaches host memory itself
        _fence(&ep.k, x.stream, &d.k, rs)
        d.k.ops.copy(d.k.kctx, rs, remote if put else <uintptr_t>x.local,
                     <uintptr_t>x.local if put else remote, x.n)
        _fence(&d.k, rs, &ep.k, x.stream)
        return 0
    one.local = x.local
    one.remote = remote
    one.n = x.n
    return _staged_stream_frags(ep, d, x.stream, rs, &one, 1, 0, put)


cdef int _staged_stream_host(gx_xfer* x, lp_ep* ep, lp_dev* d, uintptr_t delta,
                             bint put) except -1 nogil:
    """Host blocks of a VIS chunk on the user's stream: the segment's GPU
    reaches host memory itself, so one batched copy of them all between the
    two fences with the user's stream (as _staged_stream does for one block;
    a fenced transfer per block took seconds for a strided view)."""
    cdef const gx_vis* v = x.vis
    cdef void* rs = _staged_stream_ready(x, ep, d)
    cdef size_t i, k = 0, N = v.nfrags + 1
    cdef uintptr_t* a = <uintptr_t*>malloc(3 * N * sizeof(uintptr_t))
    if a == NULL:
        with gil:
            raise MemoryError("host-staged stream copy: no memory for the copy list")
    try:
        for i in range(v.nfrags):
            if v.frags[i].n:
                a[k] = v.frags[i].remote + delta if put else <uintptr_t>v.frags[i].local
                a[N + k] = <uintptr_t>v.frags[i].local if put else v.frags[i].remote + delta
                a[2 * N + k] = v.frags[i].n
                k += 1
        _fence(&ep.k, x.stream, &d.k, rs)
        _kind_list(&d.k, rs, a, N, k)
        _fence(&d.k, rs, &ep.k, x.stream)
    finally:
        free(a)
    return 0


cdef int _staged_stream_frags(lp_ep* ep, lp_dev* d, void* us, void* rs, const gx_frag* f,
                              size_t nf, uintptr_t delta, bint put) except -1 nogil:
    """Device blocks f (remote + delta: the segment's address here) on the
    user's stream us through the bounce slots, a slot's worth at a time: the
    endpoint's GPU copies the slot's blocks in (one batched copy where a slot
    holds several: a strided view's blocks, not a transfer each) on us, the
    segment's GPU out on rs, each slot fenced both ways and reused only after
    the GPU has emptied it.  The buffers stay the GPUs' until the transfer
    has run (bb.pend: the next user waits)."""
    cdef lp_kind* lk = &ep.k
    cdef lp_kind* rk = &d.k
    cdef lp_bounce* bb
    cdef size_t chunk, nslot, pos, m, i = 0, fi = 0, fo = 0, cnt, N = nf + 1
    cdef int b
    cdef void* evfree[LP_BOUNCE_MAX]     # each slot's last use, on the stream that reuses it next
    cdef uintptr_t slot, loc, rem
    cdef uintptr_t* la = <uintptr_t*>malloc(6 * N * sizeof(uintptr_t))
    cdef uintptr_t* ra = la + 3 * N
    if la == NULL:
        with gil:
            raise MemoryError("host-staged stream copy: no memory for the copy lists")
    for b in range(LP_BOUNCE_MAX):
        evfree[b] = NULL
    bb = NULL
    try:
        bb = _staged_bounce(ep)
        chunk = bb.chunk if bb.chunk < _stage_chunk else _stage_chunk
        nslot = (bb.chunk * <size_t>bb.nbuf) // chunk
        if nslot > LP_BOUNCE_MAX:
            nslot = LP_BOUNCE_MAX
        _bounce_drain_all(bb, rk)          # earlier synchronous users of the slots
        if not put:
            _fence(lk, us, rk, rs)         # the get reads after what the stream did before
        while True:
            b = <int>(i % nslot)
            slot = <uintptr_t>(bb.buf + <size_t>b * chunk)
            cnt = pos = 0
            while fi < nf and pos < chunk:         # the slot's pieces of blocks
                if fo == f[fi].n:
                    fi += 1
                    fo = 0
                    continue
                m = f[fi].n - fo if f[fi].n - fo < chunk - pos else chunk - pos
                loc = <uintptr_t>f[fi].local + fo
                rem = f[fi].remote + delta + fo
                la[cnt] = slot + pos if put else loc
                la[N + cnt] = loc if put else slot + pos
                la[2 * N + cnt] = m
                ra[cnt] = rem if put else slot + pos
                ra[N + cnt] = slot + pos if put else rem
                ra[2 * N + cnt] = m
                cnt += 1
                pos += m
                fo += m
            if cnt == 0:
                break
            if put:
                if evfree[b] != NULL:      # the segment's GPU has copied the slot out
                    lk.ops.stream_wait(lk.kctx, us, evfree[b])
                    rk.ops.event_destroy(rk.kctx, evfree[b])
                    evfree[b] = NULL
                _kind_list(lk, us, la, N, cnt)
                _fence(lk, us, rk, rs)
                _kind_list(rk, rs, ra, N, cnt)
                rk.ops.event_record(rk.kctx, rs, &evfree[b])
            else:
                if evfree[b] != NULL:      # this GPU has copied the slot in
                    rk.ops.stream_wait(rk.kctx, rs, evfree[b])
                    lk.ops.event_destroy(lk.kctx, evfree[b])
                    evfree[b] = NULL
                _kind_list(rk, rs, ra, N, cnt)
                _fence(rk, rs, lk, us)
                _kind_list(lk, us, la, N, cnt)
                lk.ops.event_record(lk.kctx, us, &evfree[b])
            i += 1
        if put:
            _fence(rk, rs, lk, us)         # later work on the user's stream sees the data landed
        lk.ops.event_record(lk.kctx, us, &bb.pend)
    finally:
        for b in range(LP_BOUNCE_MAX):
            if evfree[b] != NULL:
                (rk if put else lk).ops.event_destroy((rk if put else lk).kctx, evfree[b])
        if bb != NULL:
            gx_xchg_int(&bb.busy, 0)
        free(la)
    return 0


cdef size_t _stage_chunk = 4 << 20    # bytes per staged chunk (GEXMK_CUDA_STAGE_CHUNK): the
                                      # pipeline's fill costs one chunk, each chunk a few calls


cdef int _stage_in_streams = 1       # copies in: 1 stream, or alternating over 2 (experiments)


def _set_stage_in_streams(int n):
    """1 or 2 streams for a host-staged copy's copies in (bench/cuda_hoststage.py)."""
    global _stage_in_streams
    _stage_in_streams = n


cdef int _set_stage_chunk(size_t n) except -1:
    global _stage_chunk
    _stage_chunk = n
    return 0


cdef int _staged_copy(lp_ep* ep, lp_kind* kin, lp_kind* kout, uintptr_t dst, uintptr_t src,
                      size_t n) except -1 nogil:
    """dst <- src through the bounce buffers, cut into chunks of up to
    _stage_chunk bytes: ``kin`` copies each chunk from src into a slot, ``kout``
    from the slot to dst, each on the endpoint's stream of its kind; the
    copy out waits for the copy in on the GPU (stream_wait) where the kind
    can, else here.  With GPU waits the copies in and the copies out each
    alternate between two streams, so that one stream's wait or set-up for its
    next chunk overlaps the other's copy and the copy engines never idle
    between chunks.  As many chunks in
    flight as there are slots.  Complete on return."""
    cdef lp_bounce* bb = _staged_bounce(ep)
    cdef void* sin = NULL
    cdef void* sins[2]
    cdef void* sout = NULL
    cdef void* souts[2]
    cdef void* evin[LP_BOUNCE_MAX]
    cdef size_t chunk = bb.chunk if bb.chunk < _stage_chunk else _stage_chunk
    cdef size_t nslot = (bb.chunk * <size_t>bb.nbuf) // chunk
    cdef size_t issued = 0, landed = 0, m
    cdef int b, i
    cdef bint gpu_wait = kout.ops.stream_wait != NULL
    if nslot > LP_BOUNCE_MAX:
        nslot = LP_BOUNCE_MAX
    for i in range(LP_BOUNCE_MAX):
        evin[i] = NULL
    try:
        sins[0] = _ep_stream(ep, kin)
        # one stream for the copies in: two in flight would share the copy engine and
        # delay the first chunk, which is what the copies out wait for
        sins[1] = sins[0] if _stage_in_streams < 2 else _ep_stream(ep, kin, 1)
        if sins[1] == NULL:
            sins[1] = sins[0]
        sin = sins[0]
        souts[0] = _ep_stream(ep, kout)
        souts[1] = _ep_stream(ep, kout, 1) if gpu_wait else souts[0]
        if souts[1] == NULL:
            souts[1] = souts[0]
        if sin == NULL or souts[0] == NULL:
            _staged_unsupported("a copy with no stream left on the endpoint")
        while landed < n:
            while issued < n and issued - landed < chunk * nslot:
                b = <int>((issued // chunk) % nslot)
                _bounce_wait(bb, kout, b)                     # the slot's last copy out
                m = n - issued if n - issued < chunk else chunk
                sin = sins[(issued // chunk) & 1]
                kin.ops.copy(kin.kctx, sin, <uintptr_t>(bb.buf + <size_t>b * chunk), src + issued, m)
                kin.ops.event_record(kin.kctx, sin, &evin[b])
                issued += m
                if gpu_wait:                                  # the copy out follows on the GPU
                    break
            b = <int>((landed // chunk) % nslot)
            m = n - landed if n - landed < chunk else chunk
            sout = souts[(landed // chunk) & 1]
            try:
                if gpu_wait:
                    kout.ops.stream_wait(kout.kctx, sout, evin[b])
                else:
                    kin.ops.event_sync(kin.kctx, evin[b])
            finally:
                kin.ops.event_destroy(kin.kctx, evin[b])      # pending work keeps it alive
                evin[b] = NULL
            kout.ops.copy(kout.kctx, sout, dst + landed, <uintptr_t>(bb.buf + <size_t>b * chunk), m)
            kout.ops.event_record(kout.kctx, sout, &bb.ev[b])
            landed += m
    finally:
        for i in range(LP_BOUNCE_MAX):         # after a failure: no slot reused while read
            if evin[i] != NULL:
                try:
                    kin.ops.event_sync(kin.kctx, evin[i])
                finally:
                    kin.ops.event_destroy(kin.kctx, evin[i])
        try:
            _bounce_drain_all(bb, kout)
        finally:
            gx_xchg_int(&bb.busy, 0)
    return 0


cdef int _bounce_drain_all(lp_bounce* bb, lp_kind* k, int b=0) except -1 nogil:
    """Wait for the copy out of every slot b.. (the staged path cuts the
    buffers into up to LP_BOUNCE_MAX slots, more than nbuf), each one even
    after a failure."""
    if b >= LP_BOUNCE_MAX:
        return 0
    try:
        _bounce_wait(bb, k, b)
    finally:
        _bounce_drain_all(bb, k, b + 1)
    return 0


cdef int _staged_xfer(gx_xfer* x, bint put) except -1 nogil:
    """A put to / get from a host-staged device target; complete on return
    whatever the mode (x.handle: NULL)."""
    cdef lp_dev* d = <lp_dev*>x.peer
    cdef lp_ep* ep = <lp_ep*>x.ep
    cdef uintptr_t remote = _dev_addr(x)
    cdef int mode
    if x.stream != NULL:
        if ep == NULL:
            return _staged_unsupported("a stream-ordered put or get without an endpoint context")
        _staged_stream(x, ep, d, remote, put)
        _done(x)
        return 0
    if x.local_kind == GX_MK_HOST or ep == NULL or ep.k.ops == NULL:
        # the segment's GPU reaches host memory itself (pinned, or the pageable pipeline)
        mode = x.mode
        x.mode = GX_BLOCKING
        try:
            _dev_copy(x, remote if put else <uintptr_t>x.local,
                      <uintptr_t>x.local if put else remote, put)
        finally:
            x.mode = mode
        _done(x)
        return 0
    if put:
        _staged_copy(ep, &ep.k, &d.k, remote, <uintptr_t>x.local, x.n)
    else:
        _staged_copy(ep, &d.k, &ep.k, <uintptr_t>x.local, remote, x.n)
    _done(x)
    return 0


cdef int _staged_put(gx_xfer* x) except -1 nogil:
    return _staged_xfer(x, True)


cdef int _staged_get(gx_xfer* x) except -1 nogil:
    return _staged_xfer(x, False)


cdef int _staged_vis_small(lp_ep* ep, lp_dev* d, const gx_frag* f, size_t nf, uintptr_t delta,
                           size_t* big, bint put) except -1 nogil:
    """The blocks of up to ``big`` bytes (lowered to the bounce buffers' size
    if that is less), in windows of that size: packed into them by one
    kind's batched copy, unpacked by the other's (the endpoint's kind on
    the local side, the segment's on the target's)."""
    cdef lp_bounce* bb = _staged_bounce(ep)
    cdef size_t W = bb.chunk * <size_t>bb.nbuf, i = 0, cnt, pos, N = nf + 1
    cdef uintptr_t* la = <uintptr_t*>malloc(6 * N * sizeof(uintptr_t))
    cdef uintptr_t* ra = la + 3 * N
    cdef uintptr_t slot
    if big[0] > W:
        big[0] = W
    if la == NULL:
        gx_xchg_int(&bb.busy, 0)
        with gil:
            raise MemoryError("host-staged VIS: no memory for the copy lists")
    try:
        while i < nf:
            cnt = pos = 0
            while i < nf:
                if f[i].n == 0 or f[i].n > big[0]:
                    i += 1
                    continue
                if pos + f[i].n > W:
                    break
                slot = <uintptr_t>(bb.buf + pos)
                la[cnt] = slot if put else <uintptr_t>f[i].local
                la[N + cnt] = <uintptr_t>f[i].local if put else slot
                la[2 * N + cnt] = f[i].n
                ra[cnt] = f[i].remote + delta if put else slot
                ra[N + cnt] = slot if put else f[i].remote + delta
                ra[2 * N + cnt] = f[i].n
                pos += f[i].n
                cnt += 1
                i += 1
            if put:
                _kind_list(&ep.k, NULL, la, N, cnt)
                _kind_list(&d.k, NULL, ra, N, cnt)
            else:
                _kind_list(&d.k, NULL, ra, N, cnt)
                _kind_list(&ep.k, NULL, la, N, cnt)
    finally:
        free(la)
        gx_xchg_int(&bb.busy, 0)
    return 0


cdef int _staged_vis(gx_xfer* x, bint put) except -1 nogil:
    """VIS to / from a host-staged device target.  Host blocks (or no device
    kind on the endpoint): the segment's GPU copies them itself (_dev_vis).
    The endpoint's device blocks: the small ones packed through the bounce
    buffers a window at a time (_staged_vis_small: a strided 1-byte view is
    a few 2-D copies, not a staged transfer per byte), each larger one
    staged on its own (_staged_copy).  A stream: the endpoint's device
    blocks a bounce slot's worth at a time (_staged_stream_frags), host
    blocks by one batched copy of the segment's GPU (_staged_stream_host).
    Complete on return whatever the mode (x.handle: NULL): this table's
    test and wait have no op to look at (fuzz seed 7502: an NB or chunked
    VIS call got _dev_vis's event back, and its wait raised)."""
    cdef lp_dev* d = <lp_dev*>x.peer
    cdef lp_ep* ep = <lp_ep*>x.ep
    cdef const gx_vis* v = x.vis
    cdef uintptr_t delta = 0
    cdef size_t i, big
    cdef int mode
    if x.stream == NULL and (x.local_kind == GX_MK_HOST or ep == NULL or ep.k.ops == NULL):
        mode = x.mode
        x.mode = GX_BLOCKING
        try:
            _dev_vis(x, put)
        finally:
            x.mode = mode
        _done(x)
        return 0
    if d.local_base != NULL:
        delta = <uintptr_t>d.local_base - x.t.remote_base     # wraps: added back below
    if x.stream != NULL:
        if ep == NULL:
            return _staged_unsupported("a stream-ordered put or get without an endpoint context")
        if x.local_kind == GX_MK_HOST:
            _staged_stream_host(x, ep, d, delta, put)
        else:
            _staged_stream_frags(ep, d, x.stream, _staged_stream_ready(x, ep, d), v.frags,
                                 v.nfrags, delta, put)
        _done(x)
        return 0
    big = _stage_chunk // 4
    _staged_vis_small(ep, d, v.frags, v.nfrags, delta, &big, put)
    for i in range(v.nfrags):
        if v.frags[i].n > big:
            if put:
                _staged_copy(ep, &ep.k, &d.k, v.frags[i].remote + delta,
                             <uintptr_t>v.frags[i].local, v.frags[i].n)
            else:
                _staged_copy(ep, &d.k, &ep.k, <uintptr_t>v.frags[i].local,
                             v.frags[i].remote + delta, v.frags[i].n)
    _done(x)
    return 0


cdef int _staged_put_vis(gx_xfer* x) except -1 nogil:
    return _staged_vis(x, True)


cdef int _staged_get_vis(gx_xfer* x) except -1 nogil:
    return _staged_vis(x, False)


cdef int _staged_put_signal(gx_xfer* x) except -1 nogil:
    """The data through the bounce buffers (complete on return), then the
    signal by the segment's GPU."""
    cdef lp_dev* d = <lp_dev*>x.peer
    cdef gx_val old, zero
    cdef uintptr_t remote = x.remote
    if x.stream != NULL:
        return _staged_unsupported("put_signal_on_stream (the signal would need the segment's "
                                   "GPU to follow the user's stream)")
    if d.k.atomic == NULL:
        return _staged_unsupported("put_signal (the kind has no device atomics)")
    if x.sig_addr & 7:
        return _sig_misaligned(x)
    _staged_xfer(x, True)
    x.remote = x.sig_addr
    zero.u64 = 0
    try:
        d.k.atomic(d.k.kctx, NULL, _dev_addr(x), GX_DT_U64,
                   GX_OP_SET if x.op == GX_SIGNAL_SET else GX_OP_ADD, x.a, zero, &old)
    finally:
        x.remote = remote
    return 0
