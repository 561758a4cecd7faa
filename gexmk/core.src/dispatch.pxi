# ---- local buffers ----------------------------------------------------------

cdef struct _Local:
    void* p
    size_t n
    bint held           # view holds a buffer to release
    int kind            # GX_MK_* of device memory outside the endpoint's segment that the
    int device          # route's path copies itself (the endpoint's own kind); else HOST, -1
    PyObject* bounce    # owned: (host buffer, MemoryKind, device address) when p is a host
                        # bounce of device memory of another kind (_device_local)


cdef int _not_local(object obj, str sig, const char* what, bint writable) except -1:
    """TypeError for an object that is no buffer at all, most often an
    argument given in the wrong place ("get(dest, rank, src): dest must be a
    writable buffer or (address, nbytes), got int 0")."""
    if hasattr(obj, "__cuda_array_interface__") or hasattr(obj, "__dlpack_device__"):
        return 0            # host_buffer says why device arrays are refused
    raise TypeError(f"{sig}: {what.decode()} must be a {'writable ' if writable else ''}buffer "
                    f"or (address, nbytes), got {_got(obj)}")


cdef inline int _check_local(object obj, str sig, const char* what, bint writable) except -1:
    if type(obj) is tuple or PyObject_CheckBuffer(obj):
        return 0
    return _not_local(obj, sig, what, writable)


cdef int _take_tuple(tuple obj, _Local* loc, str sig, const char* what) except -1:
    """(address, nbytes) other than two plain non-negative ints: converted
    through __index__, or an error naming the element."""
    name = what.decode()
    if len(obj) != 2:
        raise TypeError(f"{sig}: {name} as a tuple must be (address, nbytes), got {obj!r}")
    cdef uintptr_t a = _as_addr(obj[0], sig, f"{name} address", ArgumentError)
    cdef size_t n = _as_size(obj[1], sig, f"{name} nbytes")
    if a == 0 and n != 0:
        raise ArgumentError(f"{_fn(sig)}: {name} address is NULL")
    loc.p = <void*>a
    loc.n = n
    loc.held = False
    return 0


cdef inline int _take(object obj, Py_buffer* view, _Local* loc, bint writable, str sig,
                      const char* what, const gx_team* tm, bint strided=False) except -1:
    """A local buffer: a PEP 3118 object, an (address, nbytes) tuple, or a
    device array (CUDA array interface) inside the device segment bound to
    ``tm``'s endpoint.  ``sig`` names the call for messages ("put(rank, dest, src)").
    With ``strided``, a non-contiguous array returns 1 (nothing taken): the
    caller moves it as a strided transfer (core.src/vis.pxi)."""
    cdef long long a, n
    loc.kind = GX_MK_HOST
    loc.device = -1
    loc.bounce = NULL
    if type(obj) is tuple:
        if len(<tuple>obj) == 2 and type((<tuple>obj)[0]) is int and type((<tuple>obj)[1]) is int:
            if _exact_int_ll((<tuple>obj)[0], &a) and _exact_int_ll((<tuple>obj)[1], &n) \
                    and a > 0 and n >= 0:
                loc.p = <void*><uintptr_t>a
                loc.n = <size_t>n
                loc.held = False
                if _device_kinds and loc.n and not gx_in_dev(tm, loc.p, loc.n):
                    _device_local(loc, sig, what, tm, writable, False)
                return 0
        _take_tuple(<tuple>obj, loc, sig, what)
        if _device_kinds and loc.n and not gx_in_dev(tm, loc.p, loc.n):
            _device_local(loc, sig, what, tm, writable, False)
        return 0
    if not PyObject_CheckBuffer(obj):
        if _is_device_array(obj):
            return _take_device(obj, loc, sig, what, tm, writable, strided)
        _not_local(obj, sig, what, writable)
    try:
        host_buffer(obj, view, writable, what)
    except (TypeError, GexmkError):
        # device arrays may have the buffer slot and refuse it (CuPy)
        if _is_device_array(obj):
            return _take_device(obj, loc, sig, what, tm, writable, strided)
        if strided and _strided_array(obj, writable):
            return 1
        raise
    loc.p = view.buf
    loc.n = <size_t>view.len
    loc.held = True
    return 0


cdef bint _is_device_array(object obj) except -1:
    """A CUDA array interface, or a DLPack array on a CUDA device (JAX, and
    every DLPack producer without the interface)."""
    return hasattr(obj, "__cuda_array_interface__") or _is_cuda_dlpack(obj)


# Set once this process has a device memory kind: from then on a local
# (address, nbytes) outside the endpoint's device segment is classified, so
# that a device pointer never reaches a CPU memcpy.
cdef bint _device_kinds = False


cdef int _take_device(object obj, _Local* loc, str sig, const char* what,
                      const gx_team* tm, bint writable, bint strided=False) except -1:
    try:
        p, n = _device_range(obj, f"{_fn(sig)}: {what.decode()}")
    except ArgumentError:
        if strided and _strided_array(obj, False):
            return 1            # not C-contiguous: a strided transfer
        raise
    loc.p = <void*><uintptr_t>p
    loc.n = <size_t>n
    loc.held = False
    if loc.n and not gx_in_dev(tm, loc.p, loc.n):
        _device_local(loc, sig, what, tm, writable, True)
    return 0


cdef int _device_local(_Local* loc, str sig, const char* what, const gx_team* tm,
                       bint writable, bint known) except -1:
    """A local buffer outside the device segment of the team's endpoint, which
    may be device memory of any kind of this process (a CuPy array, a torch
    tensor, a cudaMalloc pointer).  Memory of the endpoint's own kind (its
    device and context) goes to the route's path as device memory, which then
    copies it with that kind's copy engine as it does the segment's; device
    memory of another kind (another GPU, or an endpoint with no device
    segment) moves through a host bounce buffer here, copied in (put) at
    issue or out (get) by _finish_local.  ``known``: the object said it is
    device memory (CUDA array interface)."""
    if _client is None:
        if known:
            raise StateError(f"{_fn(sig)}: the client is finalized")
        return 0
    mk = (<Client>_client)._kind_of_pointer(<uintptr_t>loc.p, known)
    if mk is None:
        return 0                     # host memory after all
    seg = None
    if tm.owner != NULL:
        seg = (<Team>tm.owner).ep.segment
    if seg is not None and (<Segment>seg).kind is mk:
        loc.kind = (<MemoryKind>mk).cls
        loc.device = (<MemoryKind>mk).device
        return 0
    if loc.n > _BOUNCE_MAX:
        raise UnsupportedError(
            f"{_fn(sig)}: {what.decode()} is {loc.n} bytes of device memory of {mk!r}, not the "
            f"kind of the device segment bound to endpoint {tm.ep.index}: it would move through "
            f"a host bounce buffer, which takes at most {_BOUNCE_MAX} bytes per call; bind a "
            "device segment of that GPU to the endpoint, or split the transfer")
    cdef bytearray b = bytearray(loc.n)
    cdef uintptr_t host = <uintptr_t>PyByteArray_AS_STRING(b)
    cdef uintptr_t dev = <uintptr_t>loc.p
    if not writable:
        (<MemoryKind>mk).impl.copy(host, dev, loc.n)
    keep = (b, mk, dev)
    Py_INCREF(keep)
    loc.bounce = <PyObject*>keep
    loc.p = <void*>host
    return 0


# A device buffer of another kind than the endpoint's segment moves through a
# host bounce buffer of its size (pageable: the driver stages it): a fallback,
# bounded so that a mistaken 40 GiB tensor is an error, not an OOM.
cdef size_t _BOUNCE_MAX = 1 << 30


cdef int _finish_local(_Local* loc) except -1:
    """After a get into a bounced device buffer completed: copy the host bounce
    out to the device memory."""
    if loc.bounce != NULL:
        b, mk, dev = <object>loc.bounce
        (<MemoryKind>mk).impl.copy(dev, <uintptr_t>loc.p, loc.n)
    return 0


cdef inline object _keep_local(_Local* loc, object buf):
    """What an operation in flight must keep alive: the bounce, or buf.  A
    host Segment given as the buffer itself is kept as a buffer view of it:
    a destroy meanwhile then leaves its memory mapped until the op completed
    (Segment.destroy frees once no view is left; a get into a segment
    destroyed under it wrote into unmapped memory)."""
    if type(buf) is Segment and (<Segment>buf).allocation is None:
        buf = memoryview(buf)
    return buf if loc.bounce == NULL else (<object>loc.bounce, buf)


cdef inline void _drop(Py_buffer* view, _Local* loc) noexcept:
    if loc.held:
        loc.held = False
        PyBuffer_Release(view)
    if loc.bounce != NULL:
        Py_DECREF(<object>loc.bounce)
        loc.bounce = NULL


# ---- error reports ------------------------------------------------------------

cdef int _raise_rc(const gx_team* tm, int rank, uintptr_t addr, size_t n, int rc, str what) except -1 with gil:
    cdef Team team = <Team>tm.owner if tm.owner != NULL else None
    cdef gx_target* t
    if team is not None and team._closed is not None:
        raise StateError(f"{what}: {team._closed}")
    if rc == GX_ERANK:
        raise RankError(f"{what}: rank {rank} is outside the team (size {tm.size})")
    t = tm.routes[rank].t
    if rc == GX_EDEAD:
        raise PeerDeadError(f"{what}: job rank {t.jobrank} (team rank {rank}) has died")
    if rc == GX_ERANGE:
        if t.size == 0:
            raise SegmentError(
                f"{what}: team rank {rank} (job rank {t.jobrank}, EP {t.ep_index}) has no bound "
                "segment published to this process (bind, then publish_bound_segment)")
        if what.startswith("atomic") and addr >= t.remote_base and addr - t.remote_base + n <= t.size:
            raise BoundsError(f"{what}: address 0x{addr:x} is not aligned to {n} bytes")
        raise BoundsError(
            f"{what}: [0x{addr:x}, 0x{addr:x} + {n}) is outside the bound segment of team rank "
            f"{rank} (job rank {t.jobrank}, EP {t.ep_index}): [0x{t.remote_base:x}, "
            f"0x{t.remote_base:x} + {t.size})")
    if rc == GX_EOP:
        raise ArgumentError(f"{what}: invalid atomic operation or data type")
    raise GexmkError(f"{what}: internal error (code {rc})")


# ---- the slow path: one indirect call through the route ----------------------

cdef inline int _xfer_init(gx_xfer* x, const gx_path* p, gx_target* t, uintptr_t remote,
                           void* local, size_t n, int mode) noexcept nogil:
    x.ep = p.ep
    x.peer = p.peer
    x.t = t
    x.remote = remote
    x.local = local
    x.n = n
    x.mode = mode
    x.local_kind = GX_MK_HOST
    x.local_device = -1
    x.stream = NULL
    x.result = NULL
    x.handle = NULL
    x.vis = NULL
    return 0


cdef int _any_unsynced = 0     # some user endpoint's unsynced is set


cdef inline void _mark_unsynced(gx_ep* e) noexcept nogil:
    """Note that an operation on ``e`` may not be complete at the target yet
    (implicit, or a put_signal's signal): the next collective completes it.
    The collectives' own endpoint is left out: their protocol completes them."""
    global _any_unsynced
    if e.index != _SYNC_EP:
        e.unsynced = 1
        _any_unsynced = 1


cdef int _rma(const gx_team* tm, int rank, bint is_put, uintptr_t remote, void* local, size_t n,
              int mode, void** handle, void* stream) except -1 nogil:
    """Run a put/get through the route's RMA path.  The caller has checked the
    rank and bounds (gx_locate gave GX_OK or GX_NOT_MAPPED)."""
    return _rma_k(tm, rank, is_put, remote, local, n, mode, handle, stream, GX_MK_HOST, -1)


cdef int _rma_k(const gx_team* tm, int rank, bint is_put, uintptr_t remote, void* local, size_t n,
                int mode, void** handle, void* stream, int lkind, int ldev) except -1 nogil:
    """_rma with the local buffer's kind: ``lkind``/``ldev`` name device
    memory of the endpoint's kind outside its segment (_device_local);
    GX_MK_HOST: host memory, or the segment's kind where it lies inside it."""
    cdef gx_route* r = tm.routes[rank]
    cdef gx_xfer x
    _xfer_init(&x, &r.rma, r.t, remote, local, n, mode)
    x.handle = handle
    x.stream = stream
    if mode >= GX_NBI and stream == NULL:
        _mark_unsynced(tm.ep)
    if lkind != GX_MK_HOST:
        x.local_kind = lkind
        x.local_device = ldev
    elif gx_in_dev(tm, local, n):
        x.local_kind = tm.ep.seg_kind
        x.local_device = tm.ep.seg_device
    if is_put:
        r.rma.ops.put(&x)
        gx_count_add(&r.via[GX_CNT_PUT], n)
    else:
        r.rma.ops.get(&x)
        gx_count_add(&r.via[GX_CNT_GET], n)
    return 0


cdef int put_slow(const gx_team* tm, int rank, uintptr_t dest, const void* src, size_t n, int rc) except -1 nogil:
    if rc != GX_NOT_MAPPED:
        return _raise_rc(tm, rank, dest, n, rc, "put")
    return _rma(tm, rank, True, dest, <void*>src, n, GX_BLOCKING, NULL, NULL)


cdef int get_slow(const gx_team* tm, int rank, void* dest, uintptr_t src, size_t n, int rc) except -1 nogil:
    if rc != GX_NOT_MAPPED:
        return _raise_rc(tm, rank, src, n, rc, "get")
    return _rma(tm, rank, False, src, dest, n, GX_BLOCKING, NULL, NULL)


cdef int rma_nbi_slow(const gx_team* tm, int rank, bint is_put, uintptr_t remote, void* local,
                      size_t n, int rc) except -1 nogil:
    """Implicit-event put/get the inline path declined: counted on the team's
    endpoint in the route's transport (a put's source is reusable on return; a
    get's destination is filled by nbi_sync)."""
    if rc != GX_NOT_MAPPED:
        if is_put:
            return _raise_rc(tm, rank, remote, n, rc, "put")
        return _raise_rc(tm, rank, remote, n, rc, "get")
    return _rma(tm, rank, is_put, remote, local, n, GX_NBI_LCNOW if is_put else GX_NBI, NULL, NULL)


cdef int nbi_sync(const gx_team* tm, int categories) except -1 nogil:
    """Complete the implicit ops of ``categories`` (1 << GX_CAT_* bits) issued
    through the team's endpoint (the C-level nbi_wait, quiet and fence)."""
    if tm.size == 0 or tm.ep.destroyed:
        return _raise_rc(tm, 0, 0, 0, GX_ERANK, "nbi_wait")
    return _ep_sync(tm.ep, categories)


cdef int atomic_slow(const gx_team* tm, int rank, uintptr_t addr, int dt, int op,
                     gx_val a, gx_val b, gx_val* result, int rc) except -1 nogil:
    return _amo(tm, rank, addr, dt, op, a, b, result, GX_BLOCKING, NULL, rc)


cdef int _amo(const gx_team* tm, int rank, uintptr_t addr, int dt, int op, gx_val a, gx_val b,
              gx_val* result, int mode, void** handle, int rc) except -1 nogil:
    """An atomic the inline path declined, through the route's atomics path."""
    cdef gx_route* r
    cdef char* p
    cdef gx_xfer x
    cdef size_t n = gx_dt_size(dt)
    if rc != GX_NOT_MAPPED:
        rc = gx_locate(tm, rank, addr, n, &p, &r)
        if rc == GX_OK:
            rc = GX_NOT_MAPPED if (addr & (n - 1)) == 0 else GX_ERANGE
        if rc != GX_NOT_MAPPED:
            return _raise_rc(tm, rank, addr, n, rc, "atomic")
    r = tm.routes[rank]
    _xfer_init(&x, &r.amo, r.t, addr, NULL, n, mode)
    if mode >= GX_NBI:
        _mark_unsynced(tm.ep)
    x.dt = dt
    x.op = op
    x.a = a
    x.b = b
    x.result = result
    x.handle = handle
    r.amo.ops.atomic(&x)
    gx_count_add(&r.via[GX_CNT_AMO], n)
    return 0


# ---- the path of a route that has none: every slot raises ----------------------

cdef int _none_raise(gx_xfer* x, str what) except -1 with gil:
    cdef gx_target* t = x.t
    if t.size == 0:
        raise SegmentError(f"{what}: job rank {t.jobrank}'s EP {t.ep_index} has no bound segment "
                           "published to this process (bind, then publish_bound_segment)")
    raise UnsupportedError(
        f"{what}: no transport of this process reaches job rank {t.jobrank}'s EP {t.ep_index} "
        f"({_kind_name(t.kind)} segment) for {'atomics' if what == 'atomic' else 'RMA'}; "
        f"loaded: {', '.join(_client.transports) if _client is not None else 'none'}")


cdef int _none_put(gx_xfer* x) except -1 nogil:
    return _none_raise(x, "put")


cdef int _none_get(gx_xfer* x) except -1 nogil:
    return _none_raise(x, "get")


cdef int _none_atomic(gx_xfer* x) except -1 nogil:
    return _none_raise(x, "atomic")


cdef int _none_put_signal(gx_xfer* x) except -1 nogil:
    return _none_raise(x, "put_signal")


cdef int _none_op(void* op, gx_val* result) except -1 nogil:
    with gil:
        raise UnsupportedError("none: this path has no operations to test or wait for")


cdef void _none_orphan(void* op) noexcept nogil:
    pass


cdef int _none_sync(void* ep, int categories) except -1 nogil:
    return 0


cdef int _none_nbi_test(void* ep, int categories) except -1 nogil:
    return 1


cdef gx_tr_ops _NO_PATH
_NO_PATH.name = b"none"
_NO_PATH.put = _none_put
_NO_PATH.get = _none_get
_NO_PATH.atomic = _none_atomic
_NO_PATH.test = _none_op
_NO_PATH.wait = _none_op
_NO_PATH.orphan = _none_orphan
_NO_PATH.sync = _none_sync
_NO_PATH.nbi_test = _none_nbi_test
_NO_PATH.put_signal = _none_put_signal


# ---- the path of a route whose only path is staged and refused -----------------

cdef int _refused_raise(gx_xfer* x, str what) except -1 with gil:
    # x.peer is the route's _Route (borrowed: the client holds it while the route lives)
    cdef gx_target* t = x.t
    cdef _Route rt = <_Route>x.peer
    name = rt.refused.get("atomic" if what == "atomic" else "rma", "?")
    raise UnsupportedError(
        f"{what}: the only path from endpoint {rt.ep_index} to job rank {t.jobrank}'s EP "
        f"{t.ep_index} ({_kind_name(t.kind)} segment) for "
        f"{'atomics' if what == 'atomic' else 'RMA'} is '{name}', a staged path through host "
        "bounce buffers, and this client refuses staged paths (GEXMK_STAGED=refuse or "
        "gexmk.init(staged='refuse')); allow them (GEXMK_STAGED=allow) to take it, or give "
        "the target a segment this process reaches directly")


cdef int _refused_put(gx_xfer* x) except -1 nogil:
    return _refused_raise(x, "put")


cdef int _refused_get(gx_xfer* x) except -1 nogil:
    return _refused_raise(x, "get")


cdef int _refused_atomic(gx_xfer* x) except -1 nogil:
    return _refused_raise(x, "atomic")


cdef int _refused_put_signal(gx_xfer* x) except -1 nogil:
    return _refused_raise(x, "put_signal")


cdef gx_tr_ops _REFUSED_PATH
_REFUSED_PATH.name = b"refused"
_REFUSED_PATH.put = _refused_put
_REFUSED_PATH.get = _refused_get
_REFUSED_PATH.atomic = _refused_atomic
_REFUSED_PATH.put_signal = _refused_put_signal
_REFUSED_PATH.test = _none_op
_REFUSED_PATH.wait = _none_op
_REFUSED_PATH.orphan = _none_orphan
_REFUSED_PATH.sync = _none_sync
_REFUSED_PATH.nbi_test = _none_nbi_test


cdef str _kind_name(int cls):
    return _describe_kind(cls, -1).name if cls != GX_MK_HOST else "host"


# ---- stream-ordered operations ----------------------------------------------------

cdef uintptr_t _stream_handle(object stream) except? 0:
    """A CUDA stream handle from an int, a ``__cuda_stream__`` object, a
    CuPy stream (``.ptr``) or a PyTorch stream (``.cuda_stream``)."""
    h = None
    if hasattr(stream, "__cuda_stream__"):
        h = stream.__cuda_stream__()[1]
    elif hasattr(stream, "cuda_stream"):
        h = stream.cuda_stream
    elif hasattr(stream, "ptr") and not isinstance(stream, int):
        h = stream.ptr
    elif isinstance(stream, int) and not isinstance(stream, bool):
        h = stream
    if h is None or not isinstance(h, int) or h < 0:
        raise TypeError(f"stream must be a CUDA stream (an int handle, a __cuda_stream__ object, "
                        f"a CuPy or PyTorch stream), got {type(stream).__name__}")
    if h == 0:
        raise ArgumentError("stream: the legacy default stream (0) is not taken; pass a stream "
                            "you created (operations on it are ordered only with that stream)")
    return <uintptr_t>h


cdef int _rma_on_stream(const gx_team* tm, int rank, bint is_put, uintptr_t remote, void* local,
                        size_t n, void* stream, int lkind=GX_MK_HOST, int ldev=-1) except -1 nogil:
    """Enqueue a put/get on ``stream``: it runs when the stream reaches it, after
    the work enqueued before (the kernels that produced the data), with no host
    synchronisation; the route's transport raises where it cannot order on a
    stream."""
    cdef gx_route* r
    cdef char* p
    cdef int rc = gx_locate(tm, rank, remote, n, &p, &r)
    if rc != GX_OK and rc != GX_NOT_MAPPED:
        if is_put:
            return _raise_rc(tm, rank, remote, n, rc, "put_on_stream")
        return _raise_rc(tm, rank, remote, n, rc, "get_on_stream")
    return _rma_k(tm, rank, is_put, remote, local, n, GX_NBI, NULL, stream, lkind, ldev)
