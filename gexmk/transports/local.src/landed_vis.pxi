# ---- VIS through landing zones (nbrhd-landed) ----------------------------------------
#
# Without these slots the core issued one landed transfer per fragment: for a
# device buffer, a copy by the endpoint's kind and a round trip to the lander
# each.  A 1-byte-stride CuPy view of 196,613 elements into a peer's private
# host memory or pool memory took seconds, over GEXMK_TIMEOUT on a loaded
# machine (the GPU matrix's devseg-strided cells on gpu-nbrhd).  Here the
# small fragments are gathered into a host window first -- one batched copy
# by the kind (copy_batch makes a strided view's blocks one 2-D copy) or
# memcpy -- and each run of them that is contiguous at the target goes as one
# landed transfer, the runs' requests posted back to back and answered
# together.  Fragments of a slot's size or more go on their own, as before.
# On a stream the same, through the endpoint's bounce slots: a slot's worth
# gathered by one batched copy on the stream, a host function per run.

cdef enum:
    LZ_HOST_VIS = 64           # a host function's job only (never posted): _lz_vis_hostjob


cdef size_t _lz_run_end(const gx_frag* f, size_t i, size_t n, size_t* m) noexcept nogil:
    """The end of the run of fragments from i contiguous at the target; m: its bytes."""
    cdef size_t j = i + 1
    m[0] = f[i].n
    while j < n and f[j].remote == f[j - 1].remote + f[j - 1].n:
        m[0] += f[j].n
        j += 1
    return j


cdef int _lz_vis_runs(lp_land* L, gx_target* t, const gx_frag* f, size_t n, char* buf,
                      bint put) noexcept nogil:
    """The window's target side, each run of fragments contiguous there as one
    request stream: puts posted back to back, then waited for together; gets
    by _lz_get_runs.  Status."""
    cdef size_t i = 0, j, pos = 0, m
    cdef int st = LZ_OK
    if not put:
        return _lz_get_runs(L, t, f, n, buf)
    while i < n and st == LZ_OK:
        j = _lz_run_end(f, i, n, &m)
        if m:
            st = _lz_send(L, t, f[i].remote - t.remote_base, buf + pos, m, NULL)
        pos += m
        i = j
    if st == LZ_OK:
        st = _lz_drain(L, t)
    return st


cdef int _lz_get_runs(lp_land* L, gx_target* t, const gx_frag* f, size_t n,
                      char* buf) noexcept nogil:
    """The window's runs read into buf, back to back: every run cut into
    chunks, requested up to the ring's slots ahead across runs (one run at a
    time cost a round trip per scattered block), each answer copied out in
    order (status)."""
    cdef char* pdst[LZ_MAX_SLOTS]
    cdef size_t pm[LZ_MAX_SLOTS]
    cdef uint64_t qs[LZ_MAX_SLOTS]
    cdef size_t i = 0, pos = 0, runm = 0, runpos = 0, posted = 0, got = 0, m, k
    cdef uint64_t runoff = 0
    cdef int s, st
    while True:
        while posted - got < <size_t>L.slots:
            if runpos == runm:                  # the next run
                if i >= n:
                    break
                runoff = f[i].remote - t.remote_base
                i = _lz_run_end(f, i, n, &runm)
                runpos = 0
                continue
            m = runm - runpos if runm - runpos < L.chunk else L.chunk
            st = _lz_claim(L, t, &s)
            if st != LZ_OK:
                return st
            _lz_post(L, LZ_GET, runoff + runpos, m)
            k = posted % <size_t>L.slots
            qs[k] = L.seq
            pdst[k] = buf + pos
            pm[k] = m
            pos += m
            runpos += m
            posted += 1
        if got == posted:
            return LZ_OK
        k = got % <size_t>L.slots
        s = <int>((qs[k] - 1) % <uint64_t>L.slots)
        st = _lz_wait(L, t, s, qs[k])
        if st == LZ_OK:
            st = _lz_move(NULL, pdst[k], L.ring + L.data_off + <size_t>s * L.chunk, pm[k])
        if st != LZ_OK:
            return st
        got += 1


cdef int _lz_vis_launch_runs(lp_ep* ep, void* stream, lp_land* L, gx_target* t,
                             const gx_frag* f, size_t n, char* slot, bint put) except -1 nogil:
    """_lz_vis_runs on a stream: a host function per run contiguous at the target."""
    cdef size_t i = 0, j, pos = 0, m
    while i < n:
        j = _lz_run_end(f, i, n, &m)
        if m:
            _lz_launch(ep, stream, L, t, LZ_PUT if put else LZ_GET, f[i].remote - t.remote_base,
                       slot + pos, m)
        pos += m
        i = j
    return 0


cdef int _lz_vis_hostjob(lp_land* L, gx_target* t, char* block, size_t n, int put) noexcept nogil:
    """A host function's window of host blocks (the caller holds L's lock):
    block holds the n fragments, then room for their bytes back to back;
    gathered and landed (put), or read and scattered (get), here in stream
    order.  Frees block.  Status."""
    cdef gx_frag* f = <gx_frag*>block
    cdef char* buf = block + n * sizeof(gx_frag)
    cdef size_t i, pos = 0
    cdef int st
    if put:
        for i in range(n):
            memcpy(buf + pos, f[i].local, f[i].n)
            pos += f[i].n
    st = _lz_vis_runs(L, t, f, n, buf, put)
    if not put and st == LZ_OK:
        for i in range(n):
            memcpy(f[i].local, buf + pos, f[i].n)
            pos += f[i].n
    free(block)
    return st


cdef int _lz_vis_host_stream(gx_xfer* x, bint put) except -1 nogil:
    """Host blocks on a stream: a window of small ones per host function, which
    gathers (or scatters) them itself when the stream reaches it -- packing
    them now would read them before the stream's earlier work wrote them (one
    host function per block took seconds for a strided view); a block of a
    window or more as its own stream-ordered transfer."""
    cdef lp_ep* ep = <lp_ep*>x.ep
    cdef lp_land* L = <lp_land*>x.peer
    cdef const gx_vis* v = x.vis
    cdef const gx_frag* f = v.frags
    cdef gx_xfer one = x[0]
    cdef size_t i = 0, j, nbytes
    cdef char* block
    cdef bint launched
    one.vis = NULL
    one.handle = NULL
    while i < v.nfrags:
        j = _frag_window(f, i, v.nfrags, VIS_GATHER_WINDOW, VIS_GATHER_WINDOW, &nbytes)
        if j == i:
            one.remote = f[i].remote
            one.local = f[i].local
            one.n = f[i].n
            _landed_on_stream(&one, put)
            i += 1
            continue
        block = <char*>malloc((j - i) * sizeof(gx_frag) + (nbytes or 1))
        if block == NULL:
            with gil:
                raise MemoryError("nbrhd-landed VIS: no memory for a host function's window")
        memcpy(block, f + i, (j - i) * sizeof(gx_frag))
        launched = False
        try:
            _lz_launch(ep, x.stream, L, x.t, LZ_HOST_VIS, 0, block, j - i, put)
            launched = True
        finally:
            if not launched:
                free(block)         # the host function frees it once it has run
        i = j
    return 0


cdef int _lz_vis_stream(gx_xfer* x, bint put) except -1 nogil:
    """A chunk of fragments on a stream.  Device blocks: a window of small ones
    (a bounce slot's worth) gathered into a slot by one batched copy on the
    stream, each run of them contiguous at the target landed by one host
    function (one per block took seconds for a strided view); larger blocks a
    slot at a time (_lz_stream_dev).  Host blocks: _lz_vis_host_stream."""
    cdef lp_ep* ep = <lp_ep*>x.ep
    cdef lp_land* L = <lp_land*>x.peer
    cdef const gx_vis* v = x.vis
    cdef const gx_frag* f = v.frags
    cdef lp_bounce* bb
    cdef uintptr_t* a
    cdef size_t i = 0, j, nbytes
    cdef char* slot
    cdef int b = 0
    _lz_stream_ready(ep, L, x)
    if x.local_kind == GX_MK_HOST:
        return _lz_vis_host_stream(x, put)
    bb = _staged_bounce(ep)
    a = <uintptr_t*>malloc(3 * (v.nfrags or 1) * sizeof(uintptr_t))
    try:
        if a == NULL:
            with gil:
                raise MemoryError("nbrhd-landed VIS: no memory for the copy list")
        _bounce_drain_all(bb, &ep.k)        # earlier synchronous users of the buffers
        while i < v.nfrags:
            j = _frag_window(f, i, v.nfrags, bb.chunk, bb.chunk, &nbytes)
            if j == i:                       # a block of a slot or more
                if f[i].n:
                    _lz_stream_dev(ep, bb, &b, x.stream, L, x.t, put,
                                   f[i].remote - x.t.remote_base, <char*>f[i].local, f[i].n)
                i += 1
                continue
            slot = bb.buf + <size_t>(b % bb.nbuf) * bb.chunk
            if put:
                _frag_gather(ep, f + i, j - i, slot, True, a, x.stream)
            _lz_vis_launch_runs(ep, x.stream, L, x.t, f + i, j - i, slot, put)
            if not put:
                _frag_gather(ep, f + i, j - i, slot, False, a, x.stream)
            b += 1
            i = j
        ep.k.ops.event_record(ep.k.kctx, x.stream, &bb.pend)   # the buffers are the stream's until then
    finally:
        gx_xchg_int(&bb.busy, 0)
        free(a)
    return 0


cdef int _landed_vis(gx_xfer* x, bint put) except -1 nogil:
    """A chunk of VIS fragments to or from a landing zone: the small ones a
    window at a time (_frag_gather, _lz_vis_runs), the others as one
    landed transfer each.  On a stream: _lz_vis_stream.  Complete on
    return otherwise."""
    cdef lp_land* L = <lp_land*>x.peer
    cdef const gx_vis* v = x.vis
    cdef const gx_frag* f = v.frags
    cdef lp_ep* dev
    cdef size_t i = 0, j, nbytes
    cdef char* buf = NULL
    cdef uintptr_t* a = NULL
    cdef int st = LZ_OK
    if x.stream != NULL:
        _lz_vis_stream(x, put)
        _done(x)
        return 0
    dev = _lz_local(x)
    buf = <char*>malloc(VIS_GATHER_WINDOW)
    if dev != NULL:
        a = <uintptr_t*>malloc(3 * (v.nfrags or 1) * sizeof(uintptr_t))
    if buf == NULL or (dev != NULL and a == NULL):
        free(buf)
        free(a)
        with gil:
            raise MemoryError("nbrhd-landed VIS: no memory for the gather window")
    try:
        while i < v.nfrags:
            j = _frag_window(f, i, v.nfrags, L.chunk, VIS_GATHER_WINDOW, &nbytes)
            if j > i:
                if put:
                    _frag_gather(dev, f + i, j - i, buf, True, a)
                _lz_enter(L, x.t)
                _lz_leave(L, x.t, _lz_vis_runs(L, x.t, f + i, j - i, buf, put))
                if not put:
                    _frag_gather(dev, f + i, j - i, buf, False, a)
                i = j
                continue
            _lz_enter(L, x.t)       # a fragment of a slot or more: straight from its buffer
            if put:
                st = _lz_put(L, x.t, f[i].remote - x.t.remote_base, <char*>f[i].local,
                             f[i].n, dev)
            else:
                st = _lz_get(L, x.t, f[i].remote - x.t.remote_base, <char*>f[i].local,
                             f[i].n, dev)
            _lz_leave(L, x.t, st)
            i += 1
    finally:
        free(buf)
        free(a)
    _done(x)
    return 0


cdef int _landed_put_vis(gx_xfer* x) except -1 nogil:
    return _landed_vis(x, True)


cdef int _landed_get_vis(gx_xfer* x) except -1 nogil:
    return _landed_vis(x, False)
