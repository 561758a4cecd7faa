# ---------------------------------------------------------------------------
# Pageable host memory <-> device memory, pipelined through an endpoint's
# pinned bounce buffers (the CPU side split over copy-pool threads), and the
# settings of that pipeline and of tiny device copies (gexmk.config).
# ---------------------------------------------------------------------------
cdef int _pipelined(lp_ep* ep, lp_kind* k, uintptr_t dst, uintptr_t src, size_t n,
                    bint to_host) except -1 nogil:
    """Copy n bytes between device memory and host memory that is pageable
    (``to_host``: dst is the host side) through the endpoint's pinned bounce
    buffers, complete on return.  0 when it does not apply and nothing was
    done: a small copy, pinned host memory (the driver's copy runs at full
    speed there), a kind that cannot tell, no stream, or the buffers busy with
    another thread's copy."""
    cdef uintptr_t host = dst if to_host else src
    cdef lp_bounce* bb
    cdef void* s
    if n < _pg_min or _pg_nbuf <= 0 or ep == NULL or k.ops == NULL or k.ops.host_pinned == NULL:
        return 0
    if k.ops.host_pinned(k.kctx, <void*>host, n):
        return 0
    bb = ep.bb
    if bb == NULL:
        bb = _bounce_make(ep, k)
        if bb == NULL:
            return 0
    if gx_xchg_int(&bb.busy, 1) != 0:
        return 0
    try:
        _bounce_idle(bb)
        s = _ep_stream(ep, k)
        if s == NULL:
            return 0
        gx_add_long(&_pg_count, 1)
        if to_host:
            _bounce_dtoh(bb, k, s, dst, src, n)
        else:
            _bounce_htod(bb, k, s, dst, src, n)
    finally:
        gx_xchg_int(&bb.busy, 0)
    return 1


cdef lp_bounce* _bounce_make(lp_ep* ep, lp_kind* k) except? NULL nogil:
    """The endpoint's bounce buffers, pinned with k (portable: every context
    reaches them); NULL (plain copies) where memory or pinning fails."""
    cdef lp_bounce* bb
    cdef void* mem = NULL
    with gil:
        if ep.bb != NULL:
            return ep.bb
        bb = <lp_bounce*>calloc(1, sizeof(lp_bounce))
        if bb == NULL:
            return NULL
        bb.nbuf = _pg_nbuf if _pg_nbuf <= LP_BOUNCE_MAX else LP_BOUNCE_MAX
        bb.chunk = _pg_chunk
        # 2 MiB-aligned and backed by huge pages where the kernel has them: fewer
        # pages for the driver to pin and the copy engines to walk
        if posix_memalign(&mem, 2 << 20, bb.chunk * <size_t>bb.nbuf) != 0:
            free(bb)
            return NULL
        madvise(mem, bb.chunk * <size_t>bb.nbuf, MADV_HUGEPAGE)
        memset(mem, 0, bb.chunk * <size_t>bb.nbuf)      # fault the pages in as huge ones
        try:
            k.ops.host_register(k.kctx, mem, bb.chunk * <size_t>bb.nbuf, 1)
        except Exception:       # noqa: BLE001 - no pinned memory: plain (driver) copies
            free(mem)
            free(bb)
            return NULL
        bb.buf = <char*>mem
        bb.ops = k.ops
        bb.kctx = k.kctx
        gx_mem_fence()
        ep.bb = bb
    return bb


cdef int _bounce_wait(lp_bounce* bb, lp_kind* k, int b) except -1 nogil:
    """Wait for the DMA last issued through buffer b, then forget its event."""
    cdef void* ev = bb.ev[b]
    if ev == NULL:
        return 0
    bb.ev[b] = NULL
    try:
        k.ops.event_sync(k.kctx, ev)
    finally:
        k.ops.event_destroy(k.kctx, ev)
    return 0


cdef int _bounce_drain(lp_bounce* bb, lp_kind* k, int b=0) except -1 nogil:
    """Wait for every DMA through buffers b.. (also after a failure, each
    one: the buffers must not be reused while the copy engine reads them)."""
    if b >= bb.nbuf:
        return 0
    try:
        _bounce_wait(bb, k, b)
    finally:
        _bounce_drain(bb, k, b + 1)
    return 0


cdef int _bounce_htod(lp_bounce* bb, lp_kind* k, void* s, uintptr_t dst, uintptr_t src,
                      size_t n) except -1 nogil:
    """Pageable host src -> device dst: chunk i is copied into a free buffer
    (by the copy pool) while the DMA of chunk i - 1 runs."""
    cdef size_t off = 0, m
    cdef int b = 0
    cdef char* buf
    try:
        while off < n:
            m = n - off if n - off < bb.chunk else bb.chunk
            _bounce_wait(bb, k, b)
            buf = bb.buf + <size_t>b * bb.chunk
            gx_cpool_copy(_pool, buf, <void*>(src + off), m)
            k.ops.copy(k.kctx, s, dst + off, <uintptr_t>buf, m)
            k.ops.event_record(k.kctx, s, &bb.ev[b])
            off += m
            b = (b + 1) % bb.nbuf
    finally:
        _bounce_drain(bb, k)
    return 0


cdef int _bounce_dtoh(lp_bounce* bb, lp_kind* k, void* s, uintptr_t dst, uintptr_t src,
                      size_t n) except -1 nogil:
    """Device src -> pageable host dst: the DMAs of the next chunks run while
    the copy pool drains a finished one."""
    cdef size_t issued = 0, done = 0, m
    cdef int bi = 0, bd = 0, inflight = 0
    try:
        while done < n:
            while issued < n and inflight < bb.nbuf:
                m = n - issued if n - issued < bb.chunk else bb.chunk
                k.ops.copy(k.kctx, s, <uintptr_t>(bb.buf + <size_t>bi * bb.chunk), src + issued, m)
                k.ops.event_record(k.kctx, s, &bb.ev[bi])
                issued += m
                inflight += 1
                bi = (bi + 1) % bb.nbuf
            m = n - done if n - done < bb.chunk else bb.chunk
            _bounce_wait(bb, k, bd)
            gx_cpool_copy(_pool, <void*>(dst + done), bb.buf + <size_t>bd * bb.chunk, m)
            done += m
            inflight -= 1
            bd = (bd + 1) % bb.nbuf
    finally:
        _bounce_drain(bb, k)
    return 0


cdef int _bounce_free(lp_ep* ep) except -1:
    """Unpin and free the endpoint's bounce buffers (its streams are idle)."""
    cdef lp_bounce* bb = ep.bb
    cdef int b
    if bb == NULL:
        return 0
    ep.bb = NULL
    try:
        _bounce_idle(bb)
        for b in range(bb.nbuf):
            if bb.ev[b] != NULL:
                bb.ops.event_destroy(bb.kctx, bb.ev[b])
        bb.ops.host_register(bb.kctx, bb.buf, bb.chunk * <size_t>bb.nbuf, 0)
    except Exception:       # noqa: BLE001 - the kind may be closed: its context took them
        pass
    free(bb.buf)
    free(bb)
    return 0


cdef int _configure(object cfg) except -1:
    """The pageable-copy pipeline's and small puts' settings (gexmk.config)."""
    global _pg_chunk, _pg_nbuf, _pg_min, _pg_threads
    _pg_chunk = getattr(cfg, "pageable_chunk", _pg_chunk)
    _pg_nbuf = getattr(cfg, "pageable_buffers", _pg_nbuf)
    _pg_min = getattr(cfg, "pageable_min", _pg_min)
    _pg_threads = getattr(cfg, "pageable_threads", _pg_threads)
    _set_small_put(getattr(cfg, "cuda_small_put", "kernel"))
    _set_stage_chunk(getattr(cfg, "cuda_stage_chunk", _stage_chunk))
    return 0


def pipeline_settings():
    """The pageable-copy pipeline as configured in this process: chunk
    bytes, buffers, threshold bytes, helper threads (configured and running),
    the small-put mechanism, and how many copies were pipelined so far."""
    return {"chunk": _pg_chunk, "buffers": _pg_nbuf, "min": _pg_min, "threads": _pg_threads,
            "threads_running": _pool.nthreads if _pool != NULL else 0,
            "small_put": _small_put_name(), "pipelined": _pg_count}


def _small_put_name():
    words = [w for w, on in (("write_value", _small_write), ("kernel", _small_kernel)) if on]
    return ",".join(words) or "copy"


def _set_small_put(mode):
    """Bench hook: switch the small-put mechanisms of this process at run
    time (as GEXMK_CUDA_SMALL_PUT: ``"copy"``, ``"write_value"``,
    ``"kernel"`` or ``"write_value,kernel"``); returns the previous setting."""
    global _small_write, _small_kernel
    from gexmk.config import small_put_option
    words = small_put_option(mode, "small put").split(",")
    old = _small_put_name()
    _small_write = "write_value" in words
    _small_kernel = "kernel" in words
    return old


def _pool_copy(dst, src):
    """Test hook: copy the bytes of buffer ``src`` into writable buffer
    ``dst`` (same length) through the copy pool as the pipeline does (a pool
    of the configured threads is made for the call when none runs)."""
    cdef const unsigned char[::1] sv = src
    cdef unsigned char[::1] dv = dst
    cdef gx_cpool* p = _pool
    cdef bint own = p == NULL
    if dv.shape[0] != sv.shape[0]:
        raise ValueError("dst and src must have the same length")
    if dv.shape[0] == 0:
        return
    if own:
        p = gx_cpool_create(_pg_threads)
    try:
        with nogil:
            gx_cpool_copy(p, &dv[0], &sv[0], <size_t>sv.shape[0])
    finally:
        if own:
            gx_cpool_destroy(p)


# ---- a host-only stand-in kind, so that the pipeline's chunking is tested on any machine ----

cdef int _fk_copy(void* kctx, void* stream, uintptr_t dst, uintptr_t src, size_t n) except -1 nogil:
    memcpy(<void*>dst, <void*>src, n)
    (<long*>kctx)[0] += 1           # DMAs issued
    return 0


cdef int _fk_register(void* kctx, void* p, size_t n, int on) except -1 nogil:
    return 0


cdef int _fk_pinned(void* kctx, const void* p, size_t n) except -1 nogil:
    return 0


cdef int _fk_stream(void* kctx, void** stream) except -1 nogil:
    stream[0] = <void*>1
    return 0


cdef int _fk_handle(void* kctx, void* h) except -1 nogil:
    return 0


cdef int _fk_record(void* kctx, void* stream, void** event) except -1 nogil:
    event[0] = <void*>1
    return 0


cdef gx_kind_ops _FAKE_KIND
_FAKE_KIND.name = b"test-host-as-device"
_FAKE_KIND.copy = _fk_copy
_FAKE_KIND.host_register = _fk_register
_FAKE_KIND.host_pinned = _fk_pinned
_FAKE_KIND.stream_create = _fk_stream
_FAKE_KIND.stream_destroy = _fk_handle
_FAKE_KIND.event_record = _fk_record
_FAKE_KIND.event_sync = _fk_handle
_FAKE_KIND.event_destroy = _fk_handle


def _selftest_pipeline(dst, src, bint to_host, size_t chunk, int nbuf, int threads=-1):
    """Test hook: run the pipeline between two host buffers (same length)
    through a stand-in kind whose 'DMA' is a memcpy, with these bounce
    settings (threads: copy-pool helpers, -1 the configured number).
    Returns the number of chunks the stand-in copied."""
    global _pg_chunk, _pg_nbuf, _pg_min, _pool
    cdef const unsigned char[::1] sv = src
    cdef unsigned char[::1] dv = dst
    cdef lp_ep* ep
    cdef lp_kind k
    cdef long dmas = 0
    cdef int done = 0
    cdef size_t n = <size_t>sv.shape[0]
    cdef gx_cpool* pool
    cdef gx_cpool* saved_pool = _pool
    if dv.shape[0] != sv.shape[0] or n == 0:
        raise ValueError("dst and src must have the same, non-zero length")
    saved = (_pg_chunk, _pg_nbuf, _pg_min)
    ep = <lp_ep*>calloc(1, sizeof(lp_ep))
    if ep == NULL:
        raise MemoryError()
    pool = gx_cpool_create(_pg_threads if threads < 0 else threads)
    k.ops = &_FAKE_KIND
    k.kctx = &dmas
    k.atomic = NULL
    _pg_chunk, _pg_nbuf, _pg_min, _pool = chunk, nbuf, 0, pool
    try:
        with nogil:
            done = _pipelined(ep, &k, <uintptr_t>&dv[0], <uintptr_t>&sv[0], n, to_host)
    finally:
        _pg_chunk, _pg_nbuf, _pg_min = saved
        _pool = saved_pool
        _bounce_free(ep)
        free(ep)
        gx_cpool_destroy(pool)
    if not done:
        raise AssertionError("the pipeline declined the copy")
    return dmas
