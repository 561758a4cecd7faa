# ---- device segments of this process (loopback through the copy engine) ----------

cdef inline uintptr_t _dev_addr(gx_xfer* x) noexcept nogil:
    """Where x.remote is in this process: the same address (self) or the
    import of the peer's segment (nbrhd)."""
    cdef lp_dev* d = <lp_dev*>x.peer
    if d.local_base == NULL:
        return x.remote
    return <uintptr_t>d.local_base + (x.remote - x.t.remote_base)


cdef int _dev_copy(gx_xfer* x, uintptr_t dst, uintptr_t src, bint put) except -1 nogil:
    """A copy to or from a device segment.  On the caller's stream when given;
    NB and implicit (LC_GROUP / get) ones on the endpoint's own stream for that
    kind, completed by an event (NB) or the endpoint's sync (NBI); the rest,
    and LC_NOW puts whose source must be reusable on return, synchronously.
    A large copy whose host side is pageable is pipelined through the
    endpoint's pinned bounce buffers and complete on return, whatever the mode."""
    cdef lp_dev* d = <lp_dev*>x.peer
    cdef lp_ep* ep = <lp_ep*>x.ep
    cdef void* s = NULL
    cdef void* ev = NULL
    cdef lp_op* op
    if x.stream != NULL:
        return d.k.ops.copy(d.k.kctx, x.stream, dst, src, x.n)
    if x.local_kind == GX_MK_HOST and ep != NULL and x.n >= _pg_min:
        if _pipelined(ep, &d.k, dst, src, x.n, not put):
            _done(x)
            return 0
    if (x.mode == GX_NB or x.mode == GX_NBI) and ep != NULL:
        s = _ep_stream(ep, &d.k)
    if s == NULL:
        _issue_copy(x, &d.k, NULL, dst, src, put)       # complete on return
        _done(x)
        return 0
    if x.mode == GX_NB:
        _issue_copy(x, &d.k, s, dst, src, put)
        d.k.ops.event_record(d.k.kctx, s, &ev)
        op = <lp_op*>calloc(1, sizeof(lp_op))
        if op == NULL:
            d.k.ops.event_sync(d.k.kctx, ev)          # complete it here instead
            d.k.ops.event_destroy(d.k.kctx, ev)
            _done(x)
            return 0
        op.ops = d.k.ops
        op.kctx = d.k.kctx
        op.event = ev
        x.handle[0] = op
        return 0
    gx_add_long(&ep.nbi_dev, 1)
    return _issue_copy(x, &d.k, s, dst, src, put)


cdef inline int _issue_copy(gx_xfer* x, lp_kind* k, void* s, uintptr_t dst, uintptr_t src,
                            bint put) except -1 nogil:
    """The kind's copy; where GEXMK_CUDA_SMALL_PUT says so, a put of 4 or 8
    host bytes to an aligned device address by the kind's write_value (the
    value is read here, at issue: the source is reusable at once), and a
    device<->device copy of at most 8 bytes on one GPU by the kind's copy_small kernel."""
    cdef uint64_t v = 0
    if x.n <= 8:
        if x.local_kind == GX_MK_HOST:
            if _small_write and put and (x.n == 8 or x.n == 4) and (dst & (x.n - 1)) == 0 \
                    and k.ops.write_value != NULL:
                memcpy(&v, <void*>src, x.n)
                return k.ops.write_value(k.kctx, s, dst, v, <int>x.n)
        elif _small_kernel and k.ops.copy_small != NULL and x.t.device == x.local_device:
            # one GPU only: across NVLink the copy engine is faster (H200 pair:
            # 7.8 us against 9.8 us for the kernel)
            return k.ops.copy_small(k.kctx, s, dst, src, x.n)
    if s == NULL and put and x.local_kind == GX_MK_HOST and x.n <= LP_TINY and x.ep != NULL:
        if _tiny_put(<lp_ep*>x.ep, k, dst, src, x.n):
            return 0
    return k.ops.copy(k.kctx, s, dst, src, x.n)


cdef enum:
    LP_TINY = 256              # puts from host memory up to this size go through ep.tiny


cdef int _tiny_put(lp_ep* ep, lp_kind* k, uintptr_t dst, uintptr_t src, size_t n) except -1 nogil:
    """A small synchronous host->device put from the endpoint's pinned page:
    the copy engine reads pinned memory directly, where from pageable memory
    (a put_val's stack, a small numpy array) the driver stages it first.  0
    when the page is busy (another thread) or cannot be had."""
    if ep.tiny == NULL and (ep.tiny_failed or _tiny_make(ep, k) == 0):
        return 0
    if gx_xchg_int(&ep.tiny_busy, 1) != 0:
        return 0
    try:
        memcpy(ep.tiny, <void*>src, n)
        k.ops.copy(k.kctx, NULL, dst, <uintptr_t>ep.tiny, n)
    finally:
        gx_xchg_int(&ep.tiny_busy, 0)
    return 1


cdef int _tiny_make(lp_ep* ep, lp_kind* k) except -1 nogil:
    """Allocate and pin ep.tiny with k (portable: every context reaches it); 0 on failure."""
    cdef void* mem = NULL
    with gil:
        if ep.tiny != NULL:
            return 1
        if posix_memalign(&mem, 4096, 4096) != 0:
            ep.tiny_failed = 1
            return 0
        try:
            k.ops.host_register(k.kctx, mem, 4096, 1)
        except Exception:       # noqa: BLE001 - no pinned page: plain (driver-staged) copies
            free(mem)
            ep.tiny_failed = 1
            return 0
        ep.tiny_ops = k.ops
        ep.tiny_kctx = k.kctx
        gx_mem_fence()
        ep.tiny = <char*>mem
    return 1


cdef int _tiny_free(lp_ep* ep) except -1:
    cdef char* mem = ep.tiny
    if mem == NULL:
        return 0
    ep.tiny = NULL
    try:
        ep.tiny_ops.host_register(ep.tiny_kctx, mem, 4096, 0)
    except Exception:           # noqa: BLE001 - the kind may be closed: its context took it
        pass
    free(mem)
    return 0




cdef void* _ep_stream(lp_ep* ep, lp_kind* k, int tag=0) except? NULL nogil:
    """The endpoint's stream ``tag`` in ``k``'s context, made on first use
    (NULL when the endpoint already has LP_STREAMS of them: the caller copies
    synchronously)."""
    cdef int i
    cdef void* s = NULL
    for i in range(gx_load_int(&ep.ns)):
        if ep.s[i].kctx == k.kctx and ep.s[i].tag == tag:
            return ep.s[i].stream
    with gil:               # one thread at a time adds a stream
        for i in range(ep.ns):
            if ep.s[i].kctx == k.kctx and ep.s[i].tag == tag:
                return ep.s[i].stream
        if ep.ns == LP_STREAMS:
            return NULL
        k.ops.stream_create(k.kctx, &s)
        ep.s[ep.ns].ops = k.ops
        ep.s[ep.ns].kctx = k.kctx
        ep.s[ep.ns].tag = tag
        ep.s[ep.ns].stream = s
        gx_mem_fence()
        ep.ns += 1
    return s


cdef int _ep_streams_done(lp_ep* ep, bint block) except -1 nogil:
    """Whether every copy issued on the endpoint's streams has completed
    (block: wait for them).  An event recorded on each stream answers."""
    cdef int i, done = 1
    cdef void* ev
    for i in range(gx_load_int(&ep.ns)):
        ev = NULL
        ep.s[i].ops.event_record(ep.s[i].kctx, ep.s[i].stream, &ev)
        try:
            if block:
                ep.s[i].ops.event_sync(ep.s[i].kctx, ev)
            elif not ep.s[i].ops.event_query(ep.s[i].kctx, ev):
                done = 0
        finally:
            ep.s[i].ops.event_destroy(ep.s[i].kctx, ev)
    return done


cdef int _dev_put(gx_xfer* x) except -1 nogil:
    return _dev_copy(x, _dev_addr(x), <uintptr_t>x.local, True)


cdef int _dev_get(gx_xfer* x) except -1 nogil:
    return _dev_copy(x, <uintptr_t>x.local, _dev_addr(x), False)


cdef int _dev_test(void* opv, gx_val* result) except -1 nogil:
    cdef lp_op* op = <lp_op*>opv
    if not op.ops.event_query(op.kctx, op.event):
        return 0
    op.ops.event_destroy(op.kctx, op.event)
    free(op)
    return 1


cdef int _dev_wait(void* opv, gx_val* result) except -1 nogil:
    cdef lp_op* op = <lp_op*>opv
    try:
        op.ops.event_sync(op.kctx, op.event)
    finally:
        op.ops.event_destroy(op.kctx, op.event)
        free(op)
    return 0


cdef void _dev_orphan(void* opv) noexcept nogil:
    # cuEventDestroy of a pending event: its resources go when the copy completes
    cdef lp_op* op = <lp_op*>opv
    with gil:
        try:
            op.ops.event_destroy(op.kctx, op.event)
        except Exception:   # noqa: BLE001 - nothing to report to: the op was abandoned
            pass
    free(op)


cdef int _dev_atomic(gx_xfer* x) except -1 nogil:
    cdef lp_dev* d = <lp_dev*>x.peer
    if x.remote & (gx_dt_size(x.dt) - 1):
        with gil:
            from gexmk.errors import BoundsError
            raise BoundsError(f"atomic: address 0x{x.remote:x} is not aligned to {gx_dt_size(x.dt)} bytes")
    d.k.atomic(d.k.kctx, NULL, _dev_addr(x), x.dt, x.op, x.a, x.b, x.result)
    _done(x)
    return 0


cdef int _mapped_atomic(gx_xfer* x) except -1 nogil:
    cdef char* p = _mapped(x)
    if (<uintptr_t>p) & (gx_dt_size(x.dt) - 1):
        with gil:
            from gexmk.errors import BoundsError
            raise BoundsError(f"atomic: address 0x{x.remote:x} is not aligned to {gx_dt_size(x.dt)} bytes")
    if gx_atomic_local(p, x.dt, x.op, x.a, x.b, x.result) != GX_OK:
        with gil:
            from gexmk.errors import ArgumentError
            raise ArgumentError("atomic: invalid atomic operation or data type")
    if x.op != GX_OP_GET:
        gx_wake_waiters(x.t.wake)
    _done(x)
    return 0


cdef inline void _done(gx_xfer* x) noexcept nogil:
    if x.handle != NULL:
        x.handle[0] = NULL      # complete at issue: no op to wait for


# ---- VIS into and out of device segments (issue 22) ------------------------------------

cdef int _dev_vis(gx_xfer* x, bint put) except -1 nogil:
    """A chunk of VIS fragments, or a whole strided shape, to or from a device
    segment: through the segment's kind (_kind_vis)."""
    cdef lp_dev* d = <lp_dev*>x.peer
    cdef uintptr_t delta = 0
    if d.local_base != NULL:
        delta = <uintptr_t>d.local_base - x.t.remote_base     # wraps: added back below
    # the gather kernel where the kind's device reaches both sides: the local blocks
    # are its own memory and the segment is its own or mapped for it (not staged)
    return _kind_vis(x, &d.k, delta, put, not d.staged and x.local_kind != GX_MK_HOST
                     and x.local_device == d.k.device)


cdef int _mapped_vis(gx_xfer* x, bint put) except -1 nogil:
    """VIS to a CPU-mapped host segment that the core's memcpy loop cannot serve:
    local blocks in the endpoint's device segment, or a stream.  Through the
    endpoint's device kind (_kind_vis)."""
    cdef lp_peer* p = <lp_peer*>x.peer
    cdef lp_ep* ep = <lp_ep*>x.ep
    cdef uintptr_t delta = 0
    cdef char* mapped = <char*>x.t.remote_base if p == NULL else p.local_base
    if x.stream == NULL and x.local_kind == GX_MK_HOST:
        # host blocks (the core copies these itself; kept whole here all the same)
        gx_mem_fence()
        if x.vis.ndim:
            gx_vis_copy_strided(x.vis, mapped + (x.vis.rbase - x.t.remote_base), put)
        else:
            gx_vis_copy_frags(x.vis.frags, x.vis.nfrags, mapped, x.t.remote_base, put)
        gx_mem_fence()
        _done(x)
        return 0
    if x.mode == GX_NB:
        x.mode = GX_BLOCKING      # these tables hand out no ops: complete at issue
    if ep == NULL or ep.k.ops == NULL:
        with gil:
            raise UnsupportedError("stream-ordered RMA to a host segment needs the initiating "
                                   "endpoint to have a device segment bound (its kind's copy "
                                   "engine does the copy)")
    if p != NULL:
        delta = <uintptr_t>p.local_base - x.t.remote_base
    return _kind_vis(x, &ep.k, delta, put, False)


cdef int _mapped_put_vis(gx_xfer* x) except -1 nogil:
    return _mapped_vis(x, True)


cdef int _mapped_get_vis(gx_xfer* x) except -1 nogil:
    return _mapped_vis(x, False)


cdef int _kind_list(lp_kind* k, void* s, uintptr_t* a, size_t N, size_t cnt) except -1 nogil:
    """cnt copies of the list a (destinations, then sources, then sizes, N
    apart) by kind k on stream s: its copy_batch, else (or for one) a copy each.
    Stream NULL: complete on return."""
    cdef size_t i
    if cnt == 0:
        return 0
    if cnt == 1:
        return k.ops.copy(k.kctx, s, a[0], a[N], a[2 * N])
    if k.ops.copy_batch != NULL:
        return k.ops.copy_batch(k.kctx, s, a, a + N, <size_t*>(a + 2 * N), cnt)
    for i in range(cnt):
        k.ops.copy(k.kctx, s, a[i], a[N + i], a[2 * N + i])
    return 0


cdef enum:
    VIS_GATHER_WINDOW = 4 << 20      # bytes of small fragments gathered into host memory at a time


cdef size_t _frag_window(const gx_frag* f, size_t i, size_t nf, size_t big, size_t cap,
                           size_t* nbytes) noexcept nogil:
    """The end of the window of small fragments from i (sizes under big, at
    most cap bytes in all; empty ones ride along): what the VIS paths that
    move host memory only (pvm, landing zones) gather at a time."""
    cdef size_t j = i
    nbytes[0] = 0
    while j < nf and f[j].n < big and nbytes[0] + f[j].n <= cap:
        nbytes[0] += f[j].n
        j += 1
    return j


cdef int _frag_gather(lp_ep* dev, const gx_frag* f, size_t n, char* buf, bint put,
                        uintptr_t* a, void* stream=NULL) except -1 nogil:
    """A window's local blocks into buf, back to back (put), or buf out to
    them (get): one batched copy by dev's kind (device blocks; a holds 3n
    words; on the stream, else complete on return), else memcpy."""
    cdef size_t i, k = 0, pos = 0
    for i in range(n):
        if f[i].n == 0:
            continue
        if dev == NULL:
            if put:
                memcpy(buf + pos, f[i].local, f[i].n)
            else:
                memcpy(f[i].local, buf + pos, f[i].n)
        else:
            a[k] = <uintptr_t>(buf + pos) if put else <uintptr_t>f[i].local
            a[n + k] = <uintptr_t>f[i].local if put else <uintptr_t>(buf + pos)
            a[2 * n + k] = f[i].n
            k += 1
        pos += f[i].n
    if dev != NULL:
        _kind_list(&dev.k, stream, a, n, k)
    return 0


cdef int _kind_vis(gx_xfer* x, lp_kind* kk, uintptr_t delta, bint put,
                   bint device_both) except -1 nogil:
    """x.vis's blocks through kind kk (remote address + delta = its address
    here): the kind's copy_strided (2-D/3-D copies), copy_gather (device_both:
    every block is memory kk's device reaches) or copy_batch (one batched
    call) on one stream, then one completion as for _dev_copy: the
    caller's stream (ordered only), an event (NB), the endpoint's sync (NBI),
    else complete on return."""
    cdef lp_ep* ep = <lp_ep*>x.ep
    cdef const gx_vis* v = x.vis
    cdef void* s = x.stream
    cdef void* ev = NULL
    cdef lp_op* op
    cdef uintptr_t* a = NULL
    cdef size_t i, n = v.nfrags
    cdef int k
    cdef lp_kind* d_k = kk
    cdef bint shape = v.ndim > 0 and kk.ops.copy_strided != NULL
    for k in range(v.ndim if shape else 0):
        if v.lstride[k] <= 0 or v.rstride[k] <= 0 or (k == 0 and (<size_t>v.lstride[0] < v.elem
                                                                   or <size_t>v.rstride[0] < v.elem)):
            shape = False              # numpy's negative strides: the fragments instead
    if s == NULL and ep != NULL:
        s = _ep_stream(ep, d_k)
    if shape:
        if put:
            d_k.ops.copy_strided(d_k.kctx, s, v.rbase + delta, v.rstride, <uintptr_t>v.lbase,
                                 v.lstride, v.elem, v.count, v.ndim)
        else:
            d_k.ops.copy_strided(d_k.kctx, s, <uintptr_t>v.lbase, v.lstride, v.rbase + delta,
                                 v.rstride, v.elem, v.count, v.ndim)
    else:
        a = <uintptr_t*>malloc(3 * (n or 1) * sizeof(uintptr_t))
        if a == NULL:
            with gil:
                raise MemoryError("device VIS: no memory for the copy list")
        try:
            for i in range(n):
                if put:
                    a[i] = v.frags[i].remote + delta
                    a[n + i] = <uintptr_t>v.frags[i].local
                else:
                    a[i] = <uintptr_t>v.frags[i].local
                    a[n + i] = v.frags[i].remote + delta
                a[2 * n + i] = v.frags[i].n
            if device_both and d_k.ops.copy_gather != NULL:
                d_k.ops.copy_gather(d_k.kctx, s, a, a + n, <size_t*>(a + 2 * n), n)
            else:
                _kind_list(d_k, s, a, n, n)
        finally:
            free(a)
    if x.stream != NULL or s == NULL:      # stream-ordered, or done synchronously above
        _done(x)
        return 0
    if x.mode == GX_NBI:                   # a get's destination, or an LC_GROUP put: at sync
        gx_add_long(&ep.nbi_dev, 1)
        _done(x)
        return 0
    d_k.ops.event_record(d_k.kctx, s, &ev)
    if x.mode == GX_NB:
        op = <lp_op*>calloc(1, sizeof(lp_op))
        if op != NULL:
            op.ops = d_k.ops
            op.kctx = d_k.kctx
            op.event = ev
            x.handle[0] = op
            return 0
    try:                                   # blocking, LC_NOW: complete on return
        d_k.ops.event_sync(d_k.kctx, ev)
    finally:
        d_k.ops.event_destroy(d_k.kctx, ev)
    _done(x)
    return 0


cdef int _dev_put_vis(gx_xfer* x) except -1 nogil:
    return _dev_vis(x, True)


cdef int _dev_get_vis(gx_xfer* x) except -1 nogil:
    return _dev_vis(x, False)
