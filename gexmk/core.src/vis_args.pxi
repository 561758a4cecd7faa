# ---- VIS from Python: one call's request, lists, strided shapes (core.src/vis.pxi
# moves them; vis_arrays.pxi takes non-contiguous arrays) ------------------------

# ---- one call's request -------------------------------------------------------------

cdef class _VisReq:
    """The blocks of one VIS call (freed with it) and the objects whose memory
    they point into (kept alive by the call's Event or endpoint)."""
    cdef gx_vis v
    cdef gx_frag* frags
    cdef uintptr_t* la              # scratch: local addresses and lengths of the list forms
    cdef size_t* ln
    cdef uintptr_t* ra              # remote addresses and lengths
    cdef size_t* rn
    cdef size_t nl, nr
    cdef int lkind, ldev            # the local side's memory: host, or the endpoint's device segment
    cdef list keep

    def __cinit__(self):
        self.keep = []
        self.lkind = GX_MK_HOST
        self.ldev = -1

    def __dealloc__(self):
        free(self.frags)
        free(self.la)
        free(self.ln)
        free(self.ra)
        free(self.rn)

    cdef int alloc(self, size_t nl, size_t nr) except -1:
        self.nl = nl
        self.nr = nr
        self.la = <uintptr_t*>malloc((nl or 1) * sizeof(uintptr_t))
        self.ln = <size_t*>malloc((nl or 1) * sizeof(size_t))
        self.ra = <uintptr_t*>malloc((nr or 1) * sizeof(uintptr_t))
        self.rn = <size_t*>malloc((nr or 1) * sizeof(size_t))
        if self.la == NULL or self.ln == NULL or self.ra == NULL or self.rn == NULL:
            raise MemoryError(f"vis: no memory for lists of {nl} and {nr} blocks")
        return 0


cdef Py_ssize_t _vis_len(object lst, str sig, str name) except -1:
    try:
        n = len(lst)
    except TypeError:
        raise TypeError(f"{_fn(sig)}: {name} must be a list (or integer array), got "
                        f"{_got(lst)}") from None
    if <size_t>n > _VIS_MAX_BLOCKS:
        raise ArgumentError(f"{_fn(sig)}: {name} has {n} blocks; at most {_VIS_MAX_BLOCKS} "
                            "per call (split the transfer)")
    return n


cdef bint _int_array(object obj, Py_buffer* view, int ndim) except -1:
    """A C-contiguous array of 8-byte integers of ``ndim`` dimensions (numpy
    uint64/int64 lists of addresses), taken without a Python loop."""
    if type(obj) is list or type(obj) is tuple or not PyObject_CheckBuffer(obj):
        return False
    try:
        PyObject_GetBuffer(obj, view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS)
    except Exception:
        return False
    fmt = (view.format or b"B").lstrip(b"@=<")
    if view.ndim != ndim or view.itemsize != 8 or fmt not in (b"Q", b"q", b"L", b"l"):
        PyBuffer_Release(view)
        return False
    return True


cdef int _remote_list(_VisReq q, object lst, Py_ssize_t n, str sig, str name,
                      Py_ssize_t fixed) except -1:
    """Remote blocks: (address, nbytes) pairs (vector; or an (n, 2) integer
    array), or addresses of ``fixed`` bytes each (indexed; or an integer array)."""
    cdef Py_buffer view
    cdef Py_ssize_t i
    cdef const int64_t* a
    if _int_array(lst, &view, 1 if fixed >= 0 else 2):
        a = <const int64_t*>view.buf
        try:
            if fixed < 0 and view.shape[1] != 2:
                raise ArgumentError(f"{_fn(sig)}: {name} as an array must have shape (n, 2) "
                                    "of (address, nbytes)")
            for i in range(n):
                if fixed >= 0:
                    q.ra[i] = <uintptr_t>a[i]
                    q.rn[i] = <size_t>fixed
                else:
                    q.ra[i] = <uintptr_t>a[2 * i]
                    q.rn[i] = <size_t>a[2 * i + 1]
                    if a[2 * i + 1] < 0:
                        raise ArgumentError(f"{_fn(sig)}: {name}[{i}] has a negative length")
        finally:
            PyBuffer_Release(&view)
        return 0
    cdef long long v, m
    for i, item in enumerate(lst):
        if i >= n:
            break
        # plain ints first, with no name built for a message (a 1024-block list of
        # ints took ~30 us here, most of it formatting names that no error used)
        if fixed >= 0:
            if type(item) is int and _exact_int_ll(item, &v) and v >= 0:
                q.ra[i] = <uintptr_t>v
            else:
                q.ra[i] = _as_addr(item, sig, f"{name}[{i}]")
            q.rn[i] = <size_t>fixed
        else:
            if _int_pair(item, &v, &m) and v >= 0:
                q.ra[i] = <uintptr_t>v
                q.rn[i] = <size_t>m
                continue
            if type(item) is not tuple or len(<tuple>item) != 2:
                raise TypeError(f"{_fn(sig)}: {name}[{i}] must be (remote address, nbytes), "
                                f"got {_got(item)}")
            q.ra[i] = _as_addr(item[0], sig, f"{name}[{i}] address")
            q.rn[i] = _as_size(item[1], sig, f"{name}[{i}] nbytes")
    return 0


cdef inline bint _int_pair(object item, long long* a, long long* n) noexcept:
    """Whether ``item`` is a tuple of two plain ints, the second >= 0 (stored)."""
    return (type(item) is tuple and len(<tuple>item) == 2
            and type((<tuple>item)[0]) is int and type((<tuple>item)[1]) is int
            and _exact_int_ll((<tuple>item)[0], a) and _exact_int_ll((<tuple>item)[1], n)
            and n[0] >= 0)


cdef int _local_list(_VisReq q, object lst, Py_ssize_t n, str sig, str name, Py_ssize_t fixed,
                     bint writable, const gx_team* tm) except -1:
    """Local blocks: buffers (PEP 3118 or device arrays in the endpoint's device
    segment), (address, nbytes) tuples, or for the indexed forms (``fixed`` >= 0)
    addresses (ints or an integer array) of ``fixed`` bytes each."""
    cdef Py_buffer view
    cdef _Local loc
    cdef Py_ssize_t i
    cdef size_t ndev = 0, naddr = 0
    cdef const int64_t* a
    cdef long long v, m
    if fixed >= 0 and _int_array(lst, &view, 1):
        a = <const int64_t*>view.buf
        for i in range(n):
            q.la[i] = <uintptr_t>a[i]
            q.ln[i] = <size_t>fixed
        PyBuffer_Release(&view)
        q.keep.append(lst)
    else:
        for i, item in enumerate(lst):
            if i >= n:
                break
            # an address: an int, or any integer (numpy integers export buffers too);
            # plain ints and (int, int) pairs first, with no name built for a message
            if fixed >= 0 and type(item) is int and _exact_int_ll(item, &v) and v >= 0:
                q.la[i] = <uintptr_t>v
                q.ln[i] = <size_t>fixed
                continue
            if fixed >= 0 and (type(item) is int or isinstance(item, numbers.Integral)):
                q.la[i] = _as_addr(item, sig, f"{name}[{i}]", ArgumentError)
                q.ln[i] = <size_t>fixed
                continue
            if fixed < 0 and _int_pair(item, &v, &m) and v > 0:
                # (address, nbytes): classified with the others below (one C loop),
                # not block by block as _take would
                q.la[i] = <uintptr_t>v
                q.ln[i] = <size_t>m
                naddr += 1
                continue
            if _take(item, &view, &loc, writable, sig, f"{name}[{i}]".encode(), tm, True) == 1:
                raise TypeError(f"{_fn(sig)}: {name}[{i}] is not contiguous; a block of a vector "
                                "or indexed transfer is one contiguous buffer (pass a "
                                "non-contiguous array to put/get, or use put_strided)")
            bounced = loc.bounce != NULL
            if loc.kind != GX_MK_HOST:
                q.lkind = loc.kind
                q.ldev = loc.device
                ndev += 1
            _drop(&view, &loc)
            if bounced:
                raise UnsupportedError(
                    f"{_fn(sig)}: {name}[{i}] is device memory of another kind than the device "
                    f"segment bound to endpoint {tm.ep.index}; VIS blocks move without host "
                    "bounces: bind a device segment of that GPU to the endpoint")
            if fixed >= 0 and loc.n != <size_t>fixed:
                raise ArgumentError(f"{_fn(sig)}: {name}[{i}] has {loc.n} bytes; every block of "
                                    f"this indexed list has {fixed}")
            q.la[i] = <uintptr_t>loc.p
            q.ln[i] = loc.n
            q.keep.append(item)
    cdef size_t nseg = 0
    for i in range(n):
        if q.la[i] == 0 and q.ln[i] != 0:
            raise ArgumentError(f"{_fn(sig)}: {name}[{i}] address is NULL")
        if gx_in_dev(tm, <void*>q.la[i], q.ln[i]):
            nseg += 1
    if nseg:
        q.lkind = tm.ep.seg_kind
        q.ldev = tm.ep.seg_device
    if ndev == 0 and nseg != <size_t>n and _device_kinds and n and (fixed >= 0 or naddr == <size_t>n):
        # addresses only (ints, or (address, nbytes) pairs) outside the segment:
        # device memory of the endpoint's kind, or host
        ndev = _vis_int_kinds(q, <size_t>n, sig, name, tm)
    if _device_kinds and naddr and naddr != <size_t>n:
        # pairs beside buffers: each pair outside the segment classified on its
        # own, as _take classifies a lone (address, nbytes)
        for i, item in enumerate(lst):
            if i >= n:
                break
            if (q.ln[i] and _int_pair(item, &v, &m) and v > 0
                    and not gx_in_dev(tm, <void*>q.la[i], q.ln[i])):
                ndev += _vis_local_kind(q, <void*>q.la[i], q.ln[i], sig, f"{name}[{i}]", tm, False)
    if (nseg + ndev) and nseg + ndev != <size_t>n:
        raise ArgumentError(f"{_fn(sig)}: {name} mixes device blocks with host blocks; one "
                            "call's local blocks are all of one memory")
    return 0


cdef size_t _vis_int_kinds(_VisReq q, size_t n, str sig, str name, const gx_team* tm) except? 0:
    """How many of the n int addresses q.la outside the endpoint's segment are
    device memory of its kind (the others host memory): one driver query per block in a C
    loop through the kind's classify (a Python-level query per block cost
    microseconds each: ~ms for a 1024-block list); where a block is memory of
    another device, or the kind cannot classify, every block goes through
    _vis_local_kind, which says what is wrong."""
    cdef const gx_kind_ops* ops = NULL
    cdef void* kctx = NULL
    cdef int cls, dev, want_cls = GX_MK_HOST, want_dev = -1
    cdef size_t i, ndev = 0, bad = n
    seg = (<Team>tm.owner).ep.segment if tm.owner != NULL else None
    if seg is not None and (<Segment>seg).kind.impl is not None:
        impl = (<Segment>seg).kind.impl
        ops = <const gx_kind_ops*>PyCapsule_GetPointer(impl.ops_capsule(), b"gexmk.kind_ops")
        kctx = <void*><uintptr_t>impl.handle
        want_cls = (<Segment>seg).kind.cls
        want_dev = (<Segment>seg).kind.device
    if ops == NULL or ops.classify == NULL:
        for i in range(n):
            if not gx_in_dev(tm, <void*>q.la[i], q.ln[i]):
                ndev += _vis_local_kind(q, <void*>q.la[i], q.ln[i], sig, f"{name}[{i}]", tm, False)
        return ndev
    with nogil:
        for i in range(n):
            if q.ln[i] == 0 or gx_in_dev(tm, <void*>q.la[i], q.ln[i]):
                continue            # in the segment: counted as such by the caller
            ops.classify(kctx, q.la[i], &cls, &dev)
            if cls == GX_MK_HOST:
                continue
            if cls != want_cls or dev != want_dev:
                bad = i
                break
            ndev += 1
    if bad < n:          # memory of another device (or managed): the careful loop says what
        ndev = 0
        for i in range(n):
            if not gx_in_dev(tm, <void*>q.la[i], q.ln[i]):
                ndev += _vis_local_kind(q, <void*>q.la[i], q.ln[i], sig, f"{name}[{i}]", tm, False)
        return ndev
    if ndev:
        q.lkind = want_cls
        q.ldev = want_dev
    return ndev


cdef int _vis_local_kind(_VisReq q, void* p, size_t n, str sig, str name, const gx_team* tm,
                         bint known) except -1:
    """Classify local VIS memory outside the endpoint's device segment: 0 host;
    1 device memory of the endpoint's own kind (the route's path copies it, as
    for put/get); device memory of another kind raises (put/get move it
    through a host bounce per call; VIS does not bounce its blocks)."""
    if n == 0 or _client is None or not (_device_kinds or known):
        return 0
    mk = (<Client>_client)._kind_of_pointer(<uintptr_t>p, known)
    if mk is None:
        return 0
    seg = (<Team>tm.owner).ep.segment if tm.owner != NULL else None
    if seg is not None and (<Segment>seg).kind is mk:
        q.lkind = (<MemoryKind>mk).cls
        q.ldev = (<MemoryKind>mk).device
        return 1
    raise UnsupportedError(
        f"{_fn(sig)}: {name} is device memory of {mk!r}, not of the kind of the device segment "
        f"bound to endpoint {tm.ep.index}; VIS blocks move without host bounces: bind a device "
        "segment of that GPU to the endpoint (or use put/get, which bounce)")


cdef int _check_blocks(_VisReq q, const gx_team* tm, int rank, str sig, str name) except -1:
    """Every remote block inside the target's bound segment, before a byte moves."""
    cdef size_t i
    cdef char* p
    cdef gx_route* r
    cdef int rc
    if <unsigned>rank >= <unsigned>tm.size:
        _raise_rc(tm, rank, 0, 0, GX_ERANK, _fn(sig))
    for i in range(q.nr):
        rc = gx_locate(tm, rank, q.ra[i], q.rn[i], &p, &r)
        if rc != GX_OK and rc != GX_NOT_MAPPED:
            _raise_rc(tm, rank, q.ra[i], q.rn[i], rc, f"{_fn(sig)}: {name}[{i}]")
    return 0


cdef int _merge(_VisReq q, bint is_put, str sig) except -1:
    """Pair the local and the remote blocks into fragments (they may be cut
    differently: GASNet-EX's vector rule is equal totals only)."""
    cdef size_t i = 0, j = 0, k = 0, oi = 0, oj = 0, m, tl = 0, tr = 0
    for i in range(q.nl):
        tl += q.ln[i]
    for j in range(q.nr):
        tr += q.rn[j]
    if tl != tr:
        lname, rname = ("srcs", "dsts") if is_put else ("dsts", "srcs")
        raise ArgumentError(f"{_fn(sig)}: the local blocks ({lname}) hold {tl} bytes and the "
                            f"remote blocks ({rname}) {tr}; the totals must be equal")
    q.frags = <gx_frag*>malloc((q.nl + q.nr + 1) * sizeof(gx_frag))
    if q.frags == NULL:
        raise MemoryError(f"{_fn(sig)}: no memory for {q.nl + q.nr} fragments")
    i = j = 0
    while i < q.nl and j < q.nr:
        if q.ln[i] == oi:
            i += 1
            oi = 0
            continue
        if q.rn[j] == oj:
            j += 1
            oj = 0
            continue
        m = q.ln[i] - oi if q.ln[i] - oi < q.rn[j] - oj else q.rn[j] - oj
        q.frags[k].local = <void*>(q.la[i] + oi)
        q.frags[k].remote = q.ra[j] + oj
        q.frags[k].n = m
        k += 1
        oi += m
        oj += m
    q.v.frags = q.frags
    q.v.nfrags = k
    q.v.total = tl
    q.v.ndim = 0
    return 0


cdef int _vis_shape(gx_vis* v, object count, object dstrides, object sstrides, object elemsz,
                    bint is_put, str sig) except -1:
    """GASNet-EX's strided metadata from Python: counts per dimension (dimension
    0 fastest), byte strides per dimension on each side, the element size.
    Counts, strides and the element size are positive."""
    cdef Py_ssize_t nd, d
    v.elem = _as_size(elemsz, sig, "elemsz")
    if v.elem == 0:
        raise ArgumentError(f"{_fn(sig)}: elemsz must be at least 1 byte")
    try:
        count = list(count)
        dstrides = list(dstrides)
        sstrides = list(sstrides)
    except TypeError:
        raise TypeError(f"{_fn(sig)}: count and the strides must be sequences of ints") from None
    nd = len(count)
    if nd > GX_VIS_MAXDIM:
        raise ArgumentError(f"{_fn(sig)}: {nd} dimensions; at most {GX_VIS_MAXDIM}")
    if len(dstrides) != nd or len(sstrides) != nd:
        raise ArgumentError(f"{_fn(sig)}: count has {nd} dimensions, dest_strides "
                            f"{len(dstrides)} and src_strides {len(sstrides)}; they must agree")
    v.ndim = <int>nd
    for d in range(nd):
        v.count[d] = _as_size(count[d], sig, f"count[{d}]")
        if v.count[d] == 0:
            raise ArgumentError(f"{_fn(sig)}: count[{d}] is 0; counts are at least 1")
        ds = _as_int(dstrides[d], sig, f"dest_strides[{d}]", False)
        ss = _as_int(sstrides[d], sig, f"src_strides[{d}]", False)
        for nm, s in ((f"dest_strides[{d}]", ds), (f"src_strides[{d}]", ss)):
            if s <= 0 or s > PY_SSIZE_T_MAX:
                raise ArgumentError(f"{_fn(sig)}: {nm} is {s}; strides are positive byte "
                                    "counts (a non-contiguous numpy array goes to put/get)")
        v.rstride[d] = <ptrdiff_t>(ds if is_put else ss)
        v.lstride[d] = <ptrdiff_t>(ss if is_put else ds)
    return 0


cdef int _check_strided(gx_vis* v, const gx_team* tm, int rank, str sig, str name) except -1:
    """The remote extent of a strided shape inside the target's segment;
    BoundsError naming the first element outside otherwise."""
    cdef ptrdiff_t lo, hi
    cdef char* p
    cdef gx_route* r
    cdef int rc, d
    if <unsigned>rank >= <unsigned>tm.size:
        return _raise_rc(tm, rank, 0, 0, GX_ERANK, _fn(sig))
    _vis_extent(v, True, &lo, &hi)
    rc = gx_locate(tm, rank, v.rbase + <uintptr_t>lo, <size_t>(hi - lo), &p, &r)
    if rc == GX_OK or rc == GX_NOT_MAPPED:
        return 0
    if rc == GX_ERANGE and r.t.size != 0:
        # name an element outside: the first, else the last
        rc = gx_locate(tm, rank, v.rbase, v.elem, &p, &r)
        if rc == GX_OK or rc == GX_NOT_MAPPED:
            idx = tuple(int(v.count[d]) - 1 for d in range(v.ndim))
            last = v.rbase + <uintptr_t>(hi - <ptrdiff_t>v.elem)
            return _raise_rc(tm, rank, last, v.elem, GX_ERANGE,
                             f"{_fn(sig)}: {name} element {idx}")
        return _raise_rc(tm, rank, v.rbase, v.elem, GX_ERANGE,
                         f"{_fn(sig)}: {name} element {(0,) * v.ndim}")
    return _raise_rc(tm, rank, v.rbase + <uintptr_t>lo, <size_t>(hi - lo), rc, _fn(sig))


cdef object _vis_run(Team tm, _VisReq q, int rank, bint is_put, int mode):
    """Move a checked request: complete on return (GX_BLOCKING), an Event or
    None when complete at issue (GX_NB), counted on the endpoint (GX_NBI*)."""
    cdef _Multi* m = NULL
    if q.v.total == 0:
        return None
    tm.client._inflight += 1
    try:
        with nogil:
            _vis_go(&tm.c, rank, is_put, &q.v, mode, q.lkind, q.ldev, &m)
    finally:
        tm.client._inflight -= 1
    if m != NULL:
        return _op_event(tm.client, &_MULTI_OPS, m, (q, tm), -1)
    if mode == GX_NBI:              # held until the endpoint's next sync of its category
        (tm.ep._keep_put if is_put else tm.ep._keep_get).append(q)
    return None


cdef int _vis_stream(Team tm, _VisReq q, int rank, bint is_put, object stream) except -1:
    """The *_on_stream forms: enqueued on a CUDA stream (NVSHMEM *_on_stream),
    no host synchronisation; the buffers must stay valid until the stream has
    run it.  Paths that cannot order on a stream raise UnsupportedError."""
    cdef _Multi* m = NULL
    cdef void* s = <void*>_stream_handle(stream)
    if q.v.total == 0:
        return 0
    tm.client._inflight += 1
    try:
        with nogil:
            _vis_go(&tm.c, rank, is_put, &q.v, GX_NBI, q.lkind, q.ldev, &m, s)
    finally:
        tm.client._inflight -= 1
    return 0


cdef object _vis_complete(Team tm, _VisReq q, int rank, bint is_put, int mode, object lc,
                          str fn, object stream=None):
    """The blocking / _nb / _nbi forms of one checked request (lc as for put_nb);
    with a stream, the _on_stream form."""
    cdef int now
    if stream is not None:
        return _vis_stream(tm, q, rank, is_put, stream)
    if mode == GX_BLOCKING or not is_put:
        ev = _vis_run(tm, q, rank, is_put, mode)
        if mode == GX_NB:
            return _DONE if ev is None else ev
        return None
    now = _lc_mode(lc, fn)
    if mode == GX_NB:
        ev = _vis_run(tm, q, rank, True, GX_NB)
        if ev is None:
            return _lc_event(lc, _DONE)
        if now:
            (<Event>ev).wait()       # the source must be reusable on return
            return _lc_event(lc, _DONE)
        return _lc_event(lc, <Event>ev)
    _vis_run(tm, q, rank, True, GX_NBI_LCNOW if (now or isinstance(lc, LeafEvent)) else GX_NBI)
    if isinstance(lc, LeafEvent):
        _lc_event(lc, _DONE)
    return None


cdef _VisReq _vector_req(Team tm, object rank, object dsts, object srcs, bint is_put,
                         Py_ssize_t dlen, Py_ssize_t slen, str sig, int* rk):
    """Vector (dlen = slen = -1) and indexed (block sizes dlen, slen) requests,
    checked.  dsts/srcs as the user passed them: remote and local swap for gets."""
    cdef _VisReq q = _VisReq.__new__(_VisReq)
    remote, local = (dsts, srcs) if is_put else (srcs, dsts)
    rname, lname = ("dsts", "srcs") if is_put else ("srcs", "dsts")
    rfix, lfix = (dlen, slen) if is_put else (slen, dlen)
    cdef Py_ssize_t nr = _vis_len(remote, sig, rname)
    cdef Py_ssize_t nl = _vis_len(local, sig, lname)
    cdef int r = _as_rank(rank, sig, &tm.c)
    tm.check_alive()
    q.alloc(nl, nr)
    _remote_list(q, remote, nr, sig, rname, rfix)
    _local_list(q, local, nl, sig, lname, lfix, not is_put, &tm.c)
    _merge(q, is_put, sig)
    _check_blocks(q, &tm.c, r, sig, rname)
    rk[0] = r
    return q


cdef Py_ssize_t _block_size(object n, str sig, str name) except -1:
    cdef size_t v = _as_size(n, sig, name)
    if v == 0 or v > <size_t>PY_SSIZE_T_MAX:
        raise ArgumentError(f"{_fn(sig)}: {name} must be a positive byte count (got {n})")
    return <Py_ssize_t>v


cdef object _vector(Team tm, bint is_put, int mode, object rank, object dsts, object srcs,
                    object lc, str sig, object stream=None):
    cdef int r
    q = _vector_req(tm, rank, dsts, srcs, is_put, -1, -1, sig, &r)
    return _vis_complete(tm, q, r, is_put, mode, lc, _fn(sig), stream)


cdef object _indexed(Team tm, bint is_put, int mode, object rank, object dsts, object dstlen,
                     object srcs, object srclen, object lc, str sig, object stream=None):
    cdef int r
    cdef Py_ssize_t dl = _block_size(dstlen, sig, "dstlen")
    cdef Py_ssize_t sl = _block_size(srclen, sig, "srclen")
    q = None
    if dl == sl:
        q = _indexed_arrays(tm, rank, dsts, srcs, is_put, dl, &r)
    if q is None:
        q = _vector_req(tm, rank, dsts, srcs, is_put, dl, sl, sig, &r)
    return _vis_complete(tm, q, r, is_put, mode, lc, _fn(sig), stream)


cdef object _indexed_arrays(Team tm, object rank, object dsts, object srcs, bint is_put,
                            Py_ssize_t blk, int* rk):
    """The KV-cache shape in one pass: both sides integer arrays of one length,
    blocks of one size (blk).  Each pair is a fragment as it stands; the span
    of the remote blocks is checked against the target's segment once, the
    span of the local ones against the endpoint's device segment.  None where
    a block may be out of bounds, NULL or of another memory (the general
    path then says which, block by block), or the lists are not such arrays."""
    cdef Py_buffer rv, lv
    cdef const uint64_t* ra
    cdef const uint64_t* la
    cdef size_t i, n
    cdef uint64_t rmin = <uint64_t>-1, rmax = 0, lmin = <uint64_t>-1, lmax = 0, x
    cdef char* p
    cdef gx_route* rt
    cdef int rc, r
    cdef long long rk64
    cdef bint indev
    remote, local = (dsts, srcs) if is_put else (srcs, dsts)
    if not _int_array(remote, &rv, 1):
        return None
    if not _int_array(local, &lv, 1):
        PyBuffer_Release(&rv)
        return None
    try:
        if rv.shape[0] != lv.shape[0] or rv.shape[0] == 0:
            return None
        if not (type(rank) is int and _exact_int_ll(rank, &rk64) and 0 <= rk64 < tm.c.size):
            return None
        r = <int>rk64
        tm.check_alive()
        n = <size_t>rv.shape[0]
        ra = <const uint64_t*>rv.buf
        la = <const uint64_t*>lv.buf
        for i in range(n):
            x = ra[i]
            if x < rmin:
                rmin = x
            if x > rmax:
                rmax = x
            x = la[i]
            if x < lmin:
                lmin = x
            if x > lmax:
                lmax = x
        if (rmax > <uint64_t>PY_SSIZE_T_MAX or lmax > <uint64_t>PY_SSIZE_T_MAX or lmin == 0):
            return None
        rc = gx_locate(&tm.c, r, <uintptr_t>rmin, <size_t>(rmax - rmin) + <size_t>blk, &p, &rt)
        if rc != GX_OK and rc != GX_NOT_MAPPED:
            return None
        indev = gx_in_dev(&tm.c, <void*><uintptr_t>lmin, <size_t>(lmax - lmin) + <size_t>blk)
        if not indev and _device_kinds:
            return None             # host or device memory outside the segment: classified there
        q = _VisReq.__new__(_VisReq)
        (<_VisReq>q).frags = <gx_frag*>malloc(n * sizeof(gx_frag))
        if (<_VisReq>q).frags == NULL:
            raise MemoryError(f"vis: no memory for {n} fragments")
        for i in range(n):
            (<_VisReq>q).frags[i].local = <void*><uintptr_t>la[i]
            (<_VisReq>q).frags[i].remote = <uintptr_t>ra[i]
            (<_VisReq>q).frags[i].n = <size_t>blk
        (<_VisReq>q).v.frags = (<_VisReq>q).frags
        (<_VisReq>q).v.nfrags = n
        (<_VisReq>q).v.total = n * <size_t>blk
        (<_VisReq>q).v.ndim = 0
        if indev:
            (<_VisReq>q).lkind = tm.c.ep.seg_kind
            (<_VisReq>q).ldev = tm.c.ep.seg_device
        (<_VisReq>q).keep.append(local)
        (<_VisReq>q).keep.append(remote)
        rk[0] = r
        return q
    finally:
        PyBuffer_Release(&rv)
        PyBuffer_Release(&lv)


cdef object _strided(Team tm, bint is_put, int mode, object rank, object dest, object dstrides,
                     object src, object sstrides, object elemsz, object count, object lc,
                     str sig, object stream=None):
    """put_strided / get_strided: the remote base is an address, the local base
    an address or a buffer (then the shape must lie inside it)."""
    cdef _VisReq q = _VisReq.__new__(_VisReq)
    cdef gx_vis* v = &q.v
    cdef Py_buffer view
    cdef _Local loc
    cdef ptrdiff_t lo, hi
    cdef size_t n
    cdef int r = _as_rank(rank, sig, &tm.c)
    remote, local = (dest, src) if is_put else (src, dest)
    lname = "src" if is_put else "dest"
    v.rbase = _as_addr(remote, sig, "dest" if is_put else "src")
    _vis_shape(v, count, dstrides, sstrides, elemsz, is_put, sig)
    tm.check_alive()
    _vis_extent(v, False, &lo, &hi)
    if type(local) is int or (type(local) is not tuple and not PyObject_CheckBuffer(local)
                              and not _is_device_array(local)):
        v.lbase = <char*>_as_addr(local, sig, lname, ArgumentError)
        if v.lbase == NULL:
            raise ArgumentError(f"{_fn(sig)}: {lname} address is NULL")
        if not gx_in_dev(&tm.c, v.lbase + lo, <size_t>(hi - lo)):
            _vis_local_kind(q, v.lbase + lo, <size_t>(hi - lo), sig, lname, &tm.c, False)
    else:
        if _take(local, &view, &loc, not is_put, sig, lname.encode(), &tm.c, True) == 1:
            # a non-contiguous array: the shape starts at its first element and
            # must lie within the bytes the array spans
            alo, ahi = _array_span(local, not is_put, f"{_fn(sig)}: {lname}")
            if lo < alo or hi > ahi:
                raise ArgumentError(f"{_fn(sig)}: the strided {lname} spans bytes [{lo}, {hi}) "
                                    f"from its first element; the array spans [{alo}, {ahi})")
            loc.p = <void*><uintptr_t>_array_first(local, not is_put, f"{_fn(sig)}: {lname}")
        else:
            if loc.bounce != NULL:         # device memory of another kind: no bounces in VIS
                _drop(&view, &loc)
                raise UnsupportedError(
                    f"{_fn(sig)}: {lname} is device memory of another kind than the device "
                    f"segment bound to endpoint {tm.ep.index}; VIS moves without host bounces: "
                    "bind a device segment of that GPU to the endpoint")
            if loc.kind != GX_MK_HOST:
                q.lkind = loc.kind
                q.ldev = loc.device
            _drop(&view, &loc)
            if lo < 0 or <size_t>hi > loc.n:
                raise ArgumentError(f"{_fn(sig)}: the strided {lname} spans bytes [{lo}, {hi}) "
                                    f"of a buffer of {loc.n} bytes")
        v.lbase = <char*>loc.p
        q.keep.append(local)
    if gx_in_dev(&tm.c, v.lbase + lo, <size_t>(hi - lo)):
        q.lkind = tm.c.ep.seg_kind
        q.ldev = tm.c.ep.seg_device
    elif q.lkind == GX_MK_HOST and _is_device_array(local):
        _vis_local_kind(q, v.lbase + lo, <size_t>(hi - lo), sig, lname, &tm.c, True)
    n = gx_vis_elems(v) * v.elem
    v.total = n
    _check_strided(v, &tm.c, r, sig, "dest" if is_put else "src")
    _vis_simplify(v)
    if v.ndim == 0:
        v.ndim = 1
        v.count[0] = 1
        v.lstride[0] = v.rstride[0] = <ptrdiff_t>v.elem
    return _vis_complete(tm, q, r, is_put, mode, lc, _fn(sig), stream)
