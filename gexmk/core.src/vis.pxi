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
