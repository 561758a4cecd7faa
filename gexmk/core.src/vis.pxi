# ---- vector, indexed and strided transfers (GASNet-EX VIS) -------------------
#
# Every VIS call becomes one gx_vis: fragments (vector, indexed: pairs of one
# local and one remote contiguous range of equal length) or a strided shape
# (base, byte strides and counts per dimension, dimension 0 fastest, on both
# sides).  Everything is checked before a byte moves: argument shapes, equal
# totals, every remote block inside the target's bound segment (BoundsError
# naming the block).  Then one of two ways, chosen per call:
#   - the target is CPU-mapped and the local side is host memory: a memcpy
#     loop here (gx_vis_copy_*), complete on return;
#   - otherwise the route's transport, GX_VIS_CHUNK fragments at a time: its
#     put_vis/get_vis slot where it has one, else the core issues one put/get
#     per fragment.  Either way the call has one completion: blocking returns
#     complete, _nb returns one Event (over every op the chunks left pending,
#     _Multi below), _nbi counts on the endpoint like any implicit op.
# Overlapping destination blocks leave the result undefined (GASNet-EX); they
# are not looked for.

from libc.stdlib cimport malloc, realloc
from libc.string cimport memcpy
from cpython.exc cimport PyErr_NoMemory
from libc.stddef cimport ptrdiff_t
from cpython.buffer cimport PyObject_GetBuffer, PyBUF_FORMAT, PyBUF_ND, PyBUF_STRIDES, \
    PyBUF_WRITABLE, PyBUF_C_CONTIGUOUS

cdef size_t _VIS_MAX_BLOCKS = 1 << 24     # per list: 384 MiB of fragments at most


# ---- one completion over many transport ops -------------------------------------

cdef struct _Multi:
    const gx_tr_ops* ops       # the path every op belongs to
    size_t n                   # ops collected
    size_t cap
    size_t next                # ops before this one are complete (and freed by the path)
    void** op

ctypedef int (*_raw_op_fn)(void* op, gx_val* result) noexcept nogil


cdef int _multi_add(_Multi** mp, const gx_tr_ops* ops, void* op) noexcept nogil:
    """Collect a pending op; -1 (nothing set) when out of memory."""
    cdef _Multi* m = mp[0]
    cdef void** grown
    if m == NULL:
        m = <_Multi*>calloc(1, sizeof(_Multi))
        if m == NULL:
            return -1
        m.ops = ops
        mp[0] = m
    if m.n == m.cap:
        grown = <void**>realloc(m.op, (m.cap * 2 + 16) * sizeof(void*))
        if grown == NULL:
            return -1
        m.op = grown
        m.cap = m.cap * 2 + 16
    m.op[m.n] = op
    m.n += 1
    return 0


cdef void _multi_orphan(void* mv) noexcept nogil:
    cdef _Multi* m = <_Multi*>mv
    cdef size_t i
    if m == NULL:
        return
    for i in range(m.next, m.n):
        m.ops.orphan(m.op[i])
    free(m.op)
    free(m)


cdef int _multi_step(void* mv, gx_val* result, bint block) noexcept nogil:
    """Drive the ops in order: 1 complete (m freed), 0 pending, -1 failed
    (an exception set; the ops not yet complete are orphaned, m freed)."""
    cdef _Multi* m = <_Multi*>mv
    cdef int rc
    cdef _raw_op_fn fn = <_raw_op_fn>(m.ops.wait if block else m.ops.test)
    while m.next < m.n:
        rc = fn(m.op[m.next], result)     # test: 1 done, 0 pending; wait: 0 done
        if rc == 0 and not block:
            return 0
        m.next += 1                # complete or failed: the path freed it
        if rc < 0:
            _multi_orphan(m)
            return -1
    free(m.op)
    free(m)
    return 1


cdef int _multi_test(void* mv, gx_val* result) except -1 nogil:
    return _multi_step(mv, result, False)


cdef int _multi_wait(void* mv, gx_val* result) except -1 nogil:
    return _multi_step(mv, result, True)


cdef gx_tr_ops _MULTI_OPS
_MULTI_OPS.name = b"vis"
_MULTI_OPS.test = _multi_test
_MULTI_OPS.wait = _multi_wait
_MULTI_OPS.orphan = _multi_orphan


# ---- the data path ----------------------------------------------------------------

ctypedef int (*_raw_xfer_fn)(gx_xfer* x) noexcept nogil


cdef int _vis_issue(_raw_xfer_fn fn, gx_xfer* x, const gx_tr_ops* ops, _Multi** mp) noexcept nogil:
    """One call into the path: -1 with an exception set on failure."""
    cdef void* op = NULL
    x.handle = &op
    if fn(x) < 0:
        return -1
    if op != NULL and _multi_add(mp, ops, op) < 0:
        ops.orphan(op)
        with gil:
            PyErr_NoMemory()
        return -1
    return 0


cdef enum:
    _VIS_PACK_AVG = 2048       # fragments this small (on average) are packed where they run on
    _VIS_PACK_MAX = 4 << 20    # bytes per packed transfer, at most


cdef size_t _vis_run_end(const gx_frag* f, size_t i, size_t k) noexcept nogil:
    """End of the run of fragments from i that are contiguous at the target and
    small enough to pack (i + 1 when there is none)."""
    cdef size_t j = i + 1, nbytes = f[i].n
    while j < k and f[j].remote == f[j - 1].remote + f[j - 1].n \
            and nbytes + f[j].n <= _VIS_PACK_MAX:
        nbytes += f[j].n
        j += 1
    if j - i < 2 or nbytes > _VIS_PACK_AVG * (j - i):
        return i + 1
    return j


cdef int _vis_packed(gx_route* r, bint is_put, const gx_frag* f, size_t n,
                     _raw_xfer_fn one) noexcept nogil:
    """Host fragments contiguous at the target, through one blocking transfer of
    a buffer packed (put) or unpacked (get) here: -1 with an exception set."""
    cdef size_t i, nbytes = 0, off = 0
    cdef char* buf
    cdef gx_xfer x
    for i in range(n):
        nbytes += f[i].n
    buf = <char*>malloc(nbytes or 1)
    if buf == NULL:
        with gil:
            PyErr_NoMemory()
        return -1
    if is_put:
        for i in range(n):
            memcpy(buf + off, f[i].local, f[i].n)
            off += f[i].n
    _xfer_init(&x, &r.rma, r.t, f[0].remote, buf, nbytes, GX_BLOCKING)
    if one(&x) < 0:
        free(buf)
        return -1
    if not is_put:
        for i in range(n):
            memcpy(f[i].local, buf + off, f[i].n)
            off += f[i].n
    free(buf)
    return 0


cdef int _vis_path(const gx_team* tm, int rank, bint is_put, const gx_vis* v, int mode,
                   int lkind, int ldev, _Multi** mp, void* stream) except -1 nogil:
    """Through the route's transport, GX_VIS_CHUNK fragments at a time.  GX_NB
    ops left pending go to *mp (the caller waits or hands them to an Event);
    on an error those already issued are orphaned.  ``stream``: enqueued on
    that CUDA stream (GX_NBI, nothing packed by the CPU), else NULL."""
    cdef gx_route* r = tm.routes[rank]
    cdef _raw_xfer_fn fn = <_raw_xfer_fn>(r.rma.ops.put_vis if is_put else r.rma.ops.get_vis)
    cdef _raw_xfer_fn one = <_raw_xfer_fn>(r.rma.ops.put if is_put else r.rma.ops.get)
    cdef gx_frag* buf = NULL
    cdef const gx_frag* f
    cdef gx_vis cv
    cdef gx_xfer x
    cdef int rc = 0
    cdef size_t start = 0, k, i, j, total = gx_vis_elems(v) if v.ndim else v.nfrags
    if v.ndim:
        buf = <gx_frag*>malloc(GX_VIS_CHUNK * sizeof(gx_frag))
        if buf == NULL:
            with gil:
                PyErr_NoMemory()
            return -1
    if mode >= GX_NBI and stream == NULL:
        _mark_unsynced(tm.ep)
    while start < total and rc == 0:
        if v.ndim:
            k = gx_vis_fill(v, start, buf, GX_VIS_CHUNK)
            f = buf
        else:
            k = total - start if total - start < GX_VIS_CHUNK else GX_VIS_CHUNK
            f = v.frags + start
        if fn != NULL:
            cv = v[0]
            cv.frags = f
            cv.nfrags = k
            cv.total = 0
            for i in range(k):
                cv.total += f[i].n
            if start != 0 or k != total:
                cv.ndim = 0          # the shape only where one chunk holds all of it
            _xfer_init(&x, &r.rma, r.t, 0, NULL, cv.total, mode)
            x.vis = &cv
            x.stream = stream
            x.local_kind = lkind
            x.local_device = ldev
            rc = _vis_issue(fn, &x, r.rma.ops, mp)
        else:
            i = 0
            while i < k and rc == 0:
                j = _vis_run_end(f, i, k) if lkind == GX_MK_HOST and stream == NULL else i + 1
                if j - i > 1:
                    # small blocks contiguous at the target: packed here, one transfer
                    rc = _vis_packed(r, is_put, f + i, j - i, one)
                    i = j
                    continue
                if f[i].n:
                    _xfer_init(&x, &r.rma, r.t, f[i].remote, f[i].local, f[i].n, mode)
                    x.stream = stream
                    x.local_kind = lkind
                    x.local_device = ldev
                    rc = _vis_issue(one, &x, r.rma.ops, mp)
                i += 1
        start += k
    free(buf)
    if rc < 0:
        _multi_orphan(mp[0])
        mp[0] = NULL
    return rc


cdef int _vis_mapped(const gx_route* r, const gx_vis* v, bint is_put) noexcept nogil:
    """A CPU-mapped target, host local memory: copy here."""
    if v.ndim:
        if not is_put:
            gx_mem_fence()
        gx_vis_copy_strided(v, r.local_base + (v.rbase - r.remote_base), is_put)
    else:
        if not is_put:
            gx_mem_fence()
        gx_vis_copy_frags(v.frags, v.nfrags, r.local_base, r.remote_base, is_put)
    if is_put:
        gx_mem_fence()
    return 0


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
    for i, item in enumerate(lst):
        if i >= n:
            break
        if fixed >= 0:
            q.ra[i] = _as_addr(item, sig, f"{name}[{i}]")
            q.rn[i] = <size_t>fixed
        else:
            if type(item) is not tuple or len(<tuple>item) != 2:
                raise TypeError(f"{_fn(sig)}: {name}[{i}] must be (remote address, nbytes), "
                                f"got {_got(item)}")
            q.ra[i] = _as_addr(item[0], sig, f"{name}[{i}] address")
            q.rn[i] = _as_size(item[1], sig, f"{name}[{i}] nbytes")
    return 0


cdef int _local_list(_VisReq q, object lst, Py_ssize_t n, str sig, str name, Py_ssize_t fixed,
                     bint writable, const gx_team* tm) except -1:
    """Local blocks: buffers (PEP 3118 or device arrays in the endpoint's device
    segment), (address, nbytes) tuples, or for the indexed forms (``fixed`` >= 0)
    addresses (ints or an integer array) of ``fixed`` bytes each."""
    cdef Py_buffer view
    cdef _Local loc
    cdef Py_ssize_t i
    cdef size_t ndev = 0
    cdef const int64_t* a
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
            # an address: an int, or any integer (numpy integers export buffers too)
            if fixed >= 0 and (type(item) is int or isinstance(item, numbers.Integral)):
                q.la[i] = _as_addr(item, sig, f"{name}[{i}]", ArgumentError)
                q.ln[i] = <size_t>fixed
                continue
            if _take(item, &view, &loc, writable, sig, f"{name}[{i}]".encode(), tm) == 1:
                raise TypeError(f"{_fn(sig)}: {name}[{i}] is not contiguous; a block of a vector "
                                "or indexed transfer is one contiguous buffer (pass a "
                                "non-contiguous array to put/get, or use put_strided)")
            _drop(&view, &loc)
            if fixed >= 0 and loc.n != <size_t>fixed:
                raise ArgumentError(f"{_fn(sig)}: {name}[{i}] has {loc.n} bytes; every block of "
                                    f"this indexed list has {fixed}")
            q.la[i] = <uintptr_t>loc.p
            q.ln[i] = loc.n
            q.keep.append(item)
    for i in range(n):
        if q.la[i] == 0 and q.ln[i] != 0:
            raise ArgumentError(f"{_fn(sig)}: {name}[{i}] address is NULL")
        if gx_in_dev(tm, <void*>q.la[i], q.ln[i]):
            ndev += 1
    if ndev and ndev != <size_t>n:
        raise ArgumentError(f"{_fn(sig)}: {name} mixes blocks in the endpoint's device segment "
                            "with host blocks; one call's local blocks are all of one memory")
    if ndev:
        q.lkind = tm.ep.seg_kind
        q.ldev = tm.ep.seg_device
    elif _device_kinds and fixed >= 0:
        # addresses given as ints: a device address outside the segment is refused
        for i in range(n):
            loc.p = <void*>q.la[i]
            loc.n = q.ln[i]
            _refuse_device(&loc, sig, name.encode(), tm)
    return 0


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


# ---- strided shapes -------------------------------------------------------------------

cdef void _vis_simplify(gx_vis* v) noexcept nogil:
    """The same elements in fewer dimensions: dimensions of count 1 go, the
    fastest folds into the element while it is contiguous on both sides, and
    neighbours that tile each other on both sides merge (a numpy column block
    of whole rows becomes one dimension of long elements)."""
    cdef int d, k = 0
    for d in range(v.ndim):                     # drop count-1 dimensions
        if v.count[d] != 1:
            v.count[k] = v.count[d]
            v.lstride[k] = v.lstride[d]
            v.rstride[k] = v.rstride[d]
            k += 1
    v.ndim = k
    while v.ndim and v.lstride[0] == <ptrdiff_t>v.elem and v.rstride[0] == <ptrdiff_t>v.elem:
        v.elem *= v.count[0]
        for d in range(1, v.ndim):
            v.count[d - 1] = v.count[d]
            v.lstride[d - 1] = v.lstride[d]
            v.rstride[d - 1] = v.rstride[d]
        v.ndim -= 1
    d = 0
    while d + 1 < v.ndim:
        if v.lstride[d + 1] == v.lstride[d] * <ptrdiff_t>v.count[d] and \
                v.rstride[d + 1] == v.rstride[d] * <ptrdiff_t>v.count[d]:
            v.count[d] *= v.count[d + 1]
            for k in range(d + 2, v.ndim):
                v.count[k - 1] = v.count[k]
                v.lstride[k - 1] = v.lstride[k]
                v.rstride[k - 1] = v.rstride[k]
            v.ndim -= 1
        else:
            d += 1


cdef void _vis_extent(const gx_vis* v, bint remote, ptrdiff_t* lo, ptrdiff_t* hi) noexcept nogil:
    """[lo, hi): the byte range of a strided shape, relative to its base."""
    cdef int d
    cdef ptrdiff_t s, span
    lo[0] = 0
    hi[0] = <ptrdiff_t>v.elem
    for d in range(v.ndim):
        s = v.rstride[d] if remote else v.lstride[d]
        span = s * <ptrdiff_t>(v.count[d] - 1)
        if span < 0:
            lo[0] += span
        else:
            hi[0] += span


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


cdef object _cai_strided(object obj, bint writable, str what):
    """(pointer, shape, strides, itemsize) of a device array (CUDA array interface)."""
    cai = obj.__cuda_array_interface__
    shape = tuple(int(s) for s in cai["shape"])
    itemsize = int(cai["typestr"][2:])
    strides = cai.get("strides")
    if strides is None:                       # C-contiguous
        strides = []
        st = itemsize
        for s in reversed(shape):
            strides.insert(0, st)
            st *= s
    if writable and cai["data"][1]:
        raise ArgumentError(f"{what}: the device array is read-only")
    return int(cai["data"][0]), shape, tuple(int(s) for s in strides), itemsize


cdef bint _strided_array(object obj, bint writable) except -1:
    """True for an array that is a valid, non-contiguous local side of put/get
    (a strided PEP 3118 buffer or device array): it moves as a strided transfer."""
    cdef Py_buffer view
    if hasattr(obj, "__cuda_array_interface__"):
        try:
            cai = obj.__cuda_array_interface__
            return cai.get("strides") is not None
        except Exception:
            return False
    if not PyObject_CheckBuffer(obj):
        return False
    try:
        PyObject_GetBuffer(obj, &view, PyBUF_STRIDES | (PyBUF_WRITABLE if writable else 0))
    except Exception:
        return False
    PyBuffer_Release(&view)
    return True


cdef tuple _array_layout(object obj, bint writable, str what):
    """(first element's address, shape, byte strides, itemsize) of a strided array."""
    cdef Py_buffer view
    cdef Py_ssize_t d
    if hasattr(obj, "__cuda_array_interface__") and not PyObject_CheckBuffer(obj):
        return _cai_strided(obj, writable, what)
    try:
        PyObject_GetBuffer(obj, &view, PyBUF_STRIDES | (PyBUF_WRITABLE if writable else 0))
    except Exception as e:
        if hasattr(obj, "__cuda_array_interface__"):
            return _cai_strided(obj, writable, what)
        raise TypeError(f"{what} must be a {'writable ' if writable else ''}buffer: {e}") from None
    try:
        return (<uintptr_t>view.buf, tuple(view.shape[d] for d in range(view.ndim)),
                tuple(view.strides[d] for d in range(view.ndim)), view.itemsize)
    finally:
        PyBuffer_Release(&view)


cdef uintptr_t _array_first(object obj, bint writable, str what) except? 0:
    return _array_layout(obj, writable, what)[0]


cdef tuple _array_span(object obj, bint writable, str what):
    """[lo, hi): the bytes a strided array spans, relative to its first element."""
    _, shape, strides, itemsize = _array_layout(obj, writable, what)
    lo, hi = 0, itemsize
    for n, st in zip(shape, strides):
        if n == 0:
            return 0, 0
        if st < 0:
            lo += (n - 1) * st
        else:
            hi += (n - 1) * st
    return lo, hi


cdef _VisReq _array_req(Team tm, int rank, uintptr_t addr, object obj, bint is_put, str sig):
    """The strided request of put/get with a non-contiguous local array: its
    elements, in C order, to/from [addr, addr + nbytes) of the target."""
    cdef _VisReq q = _VisReq.__new__(_VisReq)
    cdef gx_vis* v = &q.v
    cdef Py_buffer view
    cdef _Local loc
    cdef Py_ssize_t d, nd
    cdef ptrdiff_t lo, hi
    cdef size_t total
    what = f"{_fn(sig)}: {'src' if is_put else 'dest'}"
    if hasattr(obj, "__cuda_array_interface__") and not PyObject_CheckBuffer(obj):
        ptr, shape, strides, itemsize = _cai_strided(obj, not is_put, what)
    else:
        try:
            PyObject_GetBuffer(obj, &view, PyBUF_STRIDES | (0 if is_put else PyBUF_WRITABLE))
        except Exception as e:
            if hasattr(obj, "__cuda_array_interface__"):
                ptr, shape, strides, itemsize = _cai_strided(obj, not is_put, what)
            else:
                raise TypeError(f"{what} must be a {'' if is_put else 'writable '}buffer: {e}") \
                    from None
        else:
            ptr = <uintptr_t>view.buf
            shape = tuple(view.shape[d] for d in range(view.ndim))
            strides = tuple(view.strides[d] for d in range(view.ndim))
            itemsize = view.itemsize
            PyBuffer_Release(&view)
    nd = len(shape)
    total = <size_t>itemsize
    for s in shape:
        total *= <size_t>s
    v.lbase = <char*><uintptr_t>ptr
    v.rbase = addr
    v.elem = <size_t>itemsize
    v.ndim = 0
    for d in range(nd):                      # numpy's last dimension is the fastest
        if shape[nd - 1 - d] == 1:
            continue
        if v.ndim == GX_VIS_MAXDIM:
            raise UnsupportedError(f"{what}: the array has more than {GX_VIS_MAXDIM} dimensions "
                                   "that cannot be merged; reshape it or copy it first")
        v.count[v.ndim] = <size_t>shape[nd - 1 - d]
        v.lstride[v.ndim] = <ptrdiff_t>strides[nd - 1 - d]
        v.ndim += 1
    v.total = total
    # the remote side: contiguous, in C order
    hi = <ptrdiff_t>v.elem
    for d in range(v.ndim):
        v.rstride[d] = hi
        hi *= <ptrdiff_t>v.count[d]
    _vis_simplify(v)
    q.nl = q.nr = 0
    if total == 0:
        v.ndim = 0
    if v.ndim == 0 and total:                # contiguous after all (a single element)
        v.ndim = 1
        v.count[0] = 1
        v.lstride[0] = v.rstride[0] = <ptrdiff_t>v.elem
    # the local side: host memory, or the endpoint's device segment
    _vis_extent(v, False, &lo, &hi)
    if total and gx_in_dev(&tm.c, v.lbase + lo, <size_t>(hi - lo)):
        q.lkind = tm.ep.seg_kind
        q.ldev = tm.ep.seg_device
    elif total and (hasattr(obj, "__cuda_array_interface__") or _device_kinds):
        loc.p = v.lbase + lo
        loc.n = <size_t>(hi - lo)
        _refuse_device(&loc, sig, b"src" if is_put else b"dest", &tm.c,
                       hasattr(obj, "__cuda_array_interface__") and not PyObject_CheckBuffer(obj))
    q.keep.append(obj)
    if total == 0:
        _check_blocks(q, &tm.c, rank, sig, "dest" if is_put else "src")
        return q
    _check_strided(v, &tm.c, rank, sig, "dest" if is_put else "src")
    return q


# ---- running a checked request ------------------------------------------------------------

cdef int _vis_go(const gx_team* tm, int rank, bint is_put, const gx_vis* v, int mode,
                 int lkind, int ldev, _Multi** mp, void* stream=NULL) except -1 nogil:
    """Move checked blocks: a memcpy loop on a CPU-mapped target (complete), else
    the route's path (GX_NB ops left pending in *mp; GX_BLOCKING waits for them);
    with a ``stream``, always the route's path, enqueued on it (GX_NBI)."""
    cdef gx_route* r = tm.routes[rank]
    cdef _Multi* w
    cdef gx_val res
    cdef int cnt = GX_CNT_PUT if is_put else GX_CNT_GET
    if v.total == 0:
        return 0
    if r.local_base != NULL and not r.dead and lkind == GX_MK_HOST and stream == NULL:
        _vis_mapped(r, v, is_put)
        gx_count_add(&r.mapped[cnt], v.total)
        return 0
    _vis_path(tm, rank, is_put, v, GX_NB if mode <= GX_NB else mode, lkind, ldev, mp, stream)
    gx_count_add(&r.via[cnt], v.total)
    if mode == GX_BLOCKING and mp[0] != NULL:
        w = mp[0]
        mp[0] = NULL
        _multi_wait(w, &res)
    return 0


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


# ---- the C API (gexmk/rma.pxd): blocking and implicit forms, no GIL --------------------

cdef int _vis_c_error(const gx_team* tm, int rank, const gx_vis* v, size_t i, int rc,
                      bint is_put) except -1 with gil:
    what = "put" if is_put else "get"
    if rc == GX_ERANK:
        return _raise_rc(tm, rank, 0, 0, rc, what)
    if rc == GX_EOP:
        raise ArgumentError(f"{what} (VIS): {'no more than ' + str(GX_VIS_MAXDIM) + ' dimensions, ' if v.ndim else ''}"
                            "counts, strides and the element size must be positive")
    if rc == -100:
        raise ArgumentError(f"{what} (VIS): local blocks both in the endpoint's device segment "
                            "and in host memory; one call's local blocks are of one memory")
    if v.ndim:
        return _raise_rc(tm, rank, v.rbase, v.elem, rc, f"{what} (strided)")
    return _raise_rc(tm, rank, v.frags[i].remote, v.frags[i].n, rc, f"{what} (VIS): block {i}")


cdef int vis_c(const gx_team* tm, int rank, bint is_put, gx_vis* v, int mode) except -1 nogil:
    """Check and move the blocks of ``v`` (fragments, or a strided shape with
    ndim > 0): GX_BLOCKING complete on return, GX_NBI / GX_NBI_LCNOW counted
    on the endpoint.  Every remote block is checked before a byte moves."""
    cdef _Multi* m = NULL
    cdef char* p
    cdef gx_route* r
    cdef size_t i, ndev = 0
    cdef ptrdiff_t lo, hi
    cdef int rc, d, lkind = GX_MK_HOST, ldev = -1
    if <unsigned>rank >= <unsigned>tm.size:
        return _vis_c_error(tm, rank, v, 0, GX_ERANK, is_put)
    if v.ndim:
        if v.ndim > GX_VIS_MAXDIM or v.elem == 0:
            return _vis_c_error(tm, rank, v, 0, GX_EOP, is_put)
        for d in range(v.ndim):
            if v.count[d] == 0 or v.lstride[d] <= 0 or v.rstride[d] <= 0:
                return _vis_c_error(tm, rank, v, 0, GX_EOP, is_put)
        v.total = gx_vis_elems(v) * v.elem
        _vis_extent(v, True, &lo, &hi)
        rc = gx_locate(tm, rank, v.rbase + <uintptr_t>lo, <size_t>(hi - lo), &p, &r)
        if rc != GX_OK and rc != GX_NOT_MAPPED:
            return _vis_c_error(tm, rank, v, 0, rc, is_put)
        _vis_extent(v, False, &lo, &hi)
        ndev = gx_in_dev(tm, v.lbase + lo, <size_t>(hi - lo))
    else:
        v.total = 0
        for i in range(v.nfrags):
            rc = gx_locate(tm, rank, v.frags[i].remote, v.frags[i].n, &p, &r)
            if rc != GX_OK and rc != GX_NOT_MAPPED:
                return _vis_c_error(tm, rank, v, i, rc, is_put)
            v.total += v.frags[i].n
            ndev += gx_in_dev(tm, v.frags[i].local, v.frags[i].n)
        if ndev and ndev != v.nfrags:
            return _vis_c_error(tm, rank, v, 0, -100, is_put)
    if ndev:
        lkind = tm.ep.seg_kind
        ldev = tm.ep.seg_device
    _vis_go(tm, rank, is_put, v, mode, lkind, ldev, &m)
    return 0


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
    q = _vector_req(tm, rank, dsts, srcs, is_put, dl, sl, sig, &r)
    return _vis_complete(tm, q, r, is_put, mode, lc, _fn(sig), stream)


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
                              and not hasattr(local, "__cuda_array_interface__")):
        v.lbase = <char*>_as_addr(local, sig, lname, ArgumentError)
        if v.lbase == NULL:
            raise ArgumentError(f"{_fn(sig)}: {lname} address is NULL")
        loc.p = v.lbase + lo
        loc.n = <size_t>(hi - lo)
        if not gx_in_dev(&tm.c, loc.p, loc.n) and _device_kinds:
            _refuse_device(&loc, sig, lname.encode(), &tm.c)
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
            _drop(&view, &loc)
            if lo < 0 or <size_t>hi > loc.n:
                raise ArgumentError(f"{_fn(sig)}: the strided {lname} spans bytes [{lo}, {hi}) "
                                    f"of a buffer of {loc.n} bytes")
        v.lbase = <char*>loc.p
        q.keep.append(local)
    if gx_in_dev(&tm.c, v.lbase + lo, <size_t>(hi - lo)):
        q.lkind = tm.ep.seg_kind
        q.ldev = tm.ep.seg_device
    elif hasattr(local, "__cuda_array_interface__") and not PyObject_CheckBuffer(local):
        loc.p = v.lbase + lo
        loc.n = <size_t>(hi - lo)
        _refuse_device(&loc, sig, lname.encode(), &tm.c, True)
    n = gx_vis_elems(v) * v.elem
    v.total = n
    _check_strided(v, &tm.c, r, sig, "dest" if is_put else "src")
    _vis_simplify(v)
    if v.ndim == 0:
        v.ndim = 1
        v.count[0] = 1
        v.lstride[0] = v.rstride[0] = <ptrdiff_t>v.elem
    return _vis_complete(tm, q, r, is_put, mode, lc, _fn(sig), stream)


cdef object _array_xfer(Team tm, bint is_put, int mode, int rank, uintptr_t addr, object obj,
                        object lc, str sig, object stream=None):
    """put/get (their _nb/_nbi/_on_stream forms) whose local array is not contiguous."""
    q = _array_req(tm, rank, addr, obj, is_put, sig)
    return _vis_complete(tm, q, rank, is_put, mode, lc, _fn(sig), stream)
