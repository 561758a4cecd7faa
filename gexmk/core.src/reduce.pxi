# ---- reduce, allreduce, bcast, gather, allgather: one engine, blocking and NB ------
#
# Per chunk (at most one scratch half of data) every member stores the chunk's
# header and data in its own half and the team passes a barrier; then either
#   whole: every reader (all members, or the root) combines every member's
#          chunk in rank order; or
#   split: (allreduce of chunks of at least _SPLIT_BYTES) member r combines
#          slice r of every member's chunk in rank order into its recv and
#          stores the result back over slice r of its own half (only r reads
#          that slice); a second barrier; every member copies the other slices
#          from their owners' halves: reduce-scatter + allgather, so each
#          element is combined once, by one member, and every member ends with
#          the same bits.
# The choice depends only on the chunk's size and the team's size, which the
# header makes every member agree on, so members with different routes (mapped
# peers on the node, network peers) still run the same barriers.  A peer's half
# is read in place where it is mapped here and fetched into a private buffer
# otherwise.  C loops combine the fixed-width integer and float types; other
# dtypes (bool, complex, float16, byte-swapped) go through the numpy ufunc.
# Across nodes the barriers between steps are hierarchical (coll.pxi: only
# node leaders on the network), the data movement is not: every reader still
# fetches every member's chunk, so a team with K members per node moves K
# times the bytes a node-level combine at the leaders followed by a leaders'
# allreduce and a node broadcast would (not done: the chunk protocol would
# need a second scratch level).
# A broadcast is the same loop: the root stores each chunk, the others copy
# it after the barrier; a gather: every member stores, the readers copy every
# member's chunk into its place.  The blocking call runs without Python objects per chunk: the payload's
# addresses come from the buffer protocol, the loops run without the GIL.

from cpython.buffer cimport PyObject_GetBuffer, PyBUF_C_CONTIGUOUS, PyBUF_FORMAT, PyBUF_WRITABLE
from cpython.memoryview cimport PyMemoryView_FromMemory
from cpython.buffer cimport PyBUF_READ, PyBUF_WRITE
from libc.stdint cimport int8_t, uint8_t, int16_t, uint16_t
from libc.string cimport memcpy, memcmp

cdef enum:
    _SPLIT_BYTES = 16384        # allreduce chunks at least this long: reduce-scatter + allgather
    _SMALL_COPY = 16384         # steps over fewer bytes keep the GIL (cheaper than a round trip)

ctypedef fused _num:
    int8_t
    uint8_t
    int16_t
    uint16_t
    int32_t
    uint32_t
    int64_t
    uint64_t
    float
    double


cdef void _comb(_num* out, const _num* a, const _num* b, Py_ssize_t n, int op) noexcept nogil:
    """out[i] = a[i] op b[i] (out may be a), with numpy's results: integers
    wrap, min/max return a NaN operand (the first) as np.minimum does."""
    cdef Py_ssize_t i
    cdef _num x, y
    if op == 1:
        if _num is float or _num is double:
            for i in range(n):
                out[i] = a[i] + b[i]
        else:
            for i in range(n):
                out[i] = <_num>(<uint64_t>a[i] + <uint64_t>b[i])
    elif op == 2:
        if _num is float or _num is double:
            for i in range(n):
                out[i] = a[i] * b[i]
        else:
            for i in range(n):
                out[i] = <_num>(<uint64_t>a[i] * <uint64_t>b[i])
    elif op == 3:
        for i in range(n):
            x = a[i]
            y = b[i]
            out[i] = x if (x <= y or x != x) else y
    elif op == 4:
        for i in range(n):
            x = a[i]
            y = b[i]
            out[i] = x if (x >= y or x != x) else y
    else:
        if _num is float or _num is double:
            pass                # bitwise ops on floats are refused at intake
        else:
            if op == 5:
                for i in range(n):
                    out[i] = a[i] & b[i]
            elif op == 6:
                for i in range(n):
                    out[i] = a[i] | b[i]
            elif op == 7:
                for i in range(n):
                    out[i] = a[i] ^ b[i]


# buffer format character -> C type code of _combine (-1: the numpy ufunc)
_FMT_DT = {"b": 0, "B": 1, "h": 2, "H": 3, "i": 4, "I": 5, "l": 6, "L": 7, "q": 6, "Q": 7,
           "f": 8, "d": 9}
_DT_SIZE = (1, 1, 2, 2, 4, 4, 8, 8, 4, 8)
# op (name or flag, exactly as users spell them) -> op code of the header
_FAST_OPS = {k: _OP_CODE[v] for k, v in _COLL_OPS.items()}
_FAST_OPS.update({k: _OP_CODE[_COLL_OPS[v]] for k, v in _COLL_OP_FLAGS.items()})


cdef class _Red:
    """One reduce/allreduce in progress: its buffers (held through the buffer
    protocol until it ends), the chunk it is at, and its header."""
    cdef Py_buffer sv, rv
    cdef bint has_s, has_r
    cdef char* sp
    cdef char* rp                   # NULL on a member that does not read (reduce, not root)
    cdef char* tmp                  # fetches from unmapped peers (co.half bytes), or NULL
    cdef Py_ssize_t total, isz, step, lo, m
    cdef uint64_t ph                # the phase (half) of the chunk in progress
    cdef int dt, op, root
    cdef bint split
    cdef bint bcast                 # a broadcast: the root stores, the others copy
    cdef bint gather                # a gather: the readers copy every member's chunk
    cdef unsigned char hdr[_HDR]
    cdef object dtype               # numpy dtype (ufunc path and messages)
    cdef object ufunc               # dt < 0 only
    cdef str sig

    def __dealloc__(self):
        if self.has_s:
            PyBuffer_Release(&self.sv)
        if self.has_r:
            PyBuffer_Release(&self.rv)
        free(self.tmp)


cdef int _fmt_dt(Py_buffer* v) except -2:
    """The C type code of a buffer's items, or -1 (the numpy path)."""
    cdef const char* f = v.format
    if f == NULL:
        return 1 if v.itemsize == 1 else -1          # plain bytes: uint8
    if f[0] == b'@':
        f += 1
    if f[0] == 0 or f[1] != 0:
        return -1
    dt = _FMT_DT.get(chr(f[0]), -1)
    if dt < 0 or _DT_SIZE[dt] != v.itemsize:
        return -1
    return dt


cdef int _get_send(_Red R, object send, str sig) except -1:
    """send through the buffer protocol (C-contiguous), converting array-likes."""
    s = send
    if type(s) is not _numpy().ndarray:
        s = _as_array(send, sig, "send", False)
    try:
        PyObject_GetBuffer(s, &R.sv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
    except Exception:
        s = _as_array(send, sig, "send", False)       # a contiguous copy, or the error
        PyObject_GetBuffer(s, &R.sv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
    R.has_s = True
    R.sp = <char*>R.sv.buf
    R.dt = _fmt_dt(&R.sv)
    if R.dt < 0:
        _as_array(s, sig, "send", False)              # refuses non-numeric dtypes
    return 0


cdef int _get_recv(_Red R, object recv, str sig, int members) except -1:
    """recv through the buffer protocol: writable, C-contiguous, send's dtype
    and ``members`` times its size (1: a reduction, team size: a gather)."""
    ok = type(recv) is _numpy().ndarray
    if ok:
        try:
            PyObject_GetBuffer(recv, &R.rv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE)
        except Exception:
            ok = False
    if not ok:
        r = _as_array(recv, sig, "recv", True)        # raises what is wrong, else a view
        PyObject_GetBuffer(r, &R.rv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE)
    R.has_r = True
    R.rp = <char*>R.rv.buf
    if R.rv.len != R.sv.len * members or R.rv.itemsize != R.sv.itemsize or _fmt_dt(&R.rv) != R.dt \
            or (R.dt < 0 and R.rv.format != NULL and R.sv.format != NULL
                and (<bytes>R.rv.format) != (<bytes>R.sv.format)):
        rd, sd = (<object>R.rv.obj).dtype, _red_dtype(R)
        rn = R.rv.len // R.rv.itemsize if R.rv.itemsize else 0
        sn = R.sv.len // R.sv.itemsize if R.sv.itemsize else 0
        if members != 1 and (rd != sd or rn != sn * members):
            raise ArgumentError(f"{sig}: recv ({rn} x {rd}) must hold team size ({members}) x "
                                f"send ({sn} x {sd})")
        if rd != sd or rn != sn * members:
            raise ArgumentError(f"{sig}: recv ({rn} x {rd}) must match send ({sn} x {sd})")
    return 0


cdef object _red_dtype(_Red R):
    if R.dtype is None:
        R.dtype = (<object>R.sv.obj).dtype       # an ndarray: array-likes were converted
    return R.dtype


cdef _Red _red_intake(_Coll co, object send, object recv, object op, int root, str sig):
    cdef _Red R = _Red.__new__(_Red)
    cdef int code = 0
    cdef char ch
    cdef int64_t total
    R.sig = sig
    R.root = root
    _get_send(R, send, sig)
    if root < 0 or co.me == root:
        _get_recv(R, recv, sig, 1)
    if type(op) is str or type(op) is int:
        code = _FAST_OPS.get(op, 0)
    if code == 0 or R.dt < 0 or (R.dt >= 8 and code >= 5):
        ufunc = _coll_op(op, _red_dtype(R), sig)       # raises for unknown ops, bitwise on floats
        code = _OP_CODE[ufunc.__name__]
        if R.dt < 0:
            R.ufunc = ufunc
    R.op = code
    R.isz = R.sv.itemsize if R.sv.itemsize > 0 else 1
    R.total = R.sv.len
    R.step = ((co.half - _HDR) // R.isz) * R.isz
    # the header: total bytes (little-endian int64), dtype char, six zero bytes, op
    _set_header(R, _send_char(R), code)
    return R


cdef char _send_char(_Red R) except 0:
    """send's numpy dtype char (the header's): the buffer's format where it is
    one of the C loops' characters (the same char), else the dtype's."""
    if R.dt >= 0 and R.sv.format != NULL:
        return R.sv.format[0] if R.sv.format[0] != b'@' else R.sv.format[1]
    if R.dt >= 0:
        return b'B'
    return ord(_red_dtype(R).char)


cdef _Red _ga_intake(_Coll co, object send, object recv, int root, str sig):
    cdef _Red R = _Red.__new__(_Red)
    R.sig = sig
    R.root = root
    R.gather = True
    _get_send(R, send, sig)
    if root < 0 or co.me == root:
        _get_recv(R, recv, sig, co.n)
    R.isz = 1
    R.total = R.sv.len
    R.step = co.half - _HDR
    _set_header(R, _send_char(R), 0)
    return R


cdef int _set_header(_Red R, char ch, int code) except -1:
    """The chunk header: total bytes (little-endian int64), the dtype's char,
    six zero bytes, the op code (what coll.pxi's _check_header unpacks)."""
    cdef int i
    cdef int64_t total = R.total
    for i in range(8):
        R.hdr[i] = (total >> (8 * i)) & 0xff
    R.hdr[8] = <unsigned char>ch
    memset(&R.hdr[9], 0, 6)
    R.hdr[15] = <unsigned char>code
    return 0


cdef _Red _bc_intake(_Coll co, object buf, int root, str sig):
    cdef _Red R = _Red.__new__(_Red)
    arr = _as_array(buf, sig, "buf", True)        # writable, C-contiguous, numeric
    PyObject_GetBuffer(arr, &R.rv, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE)
    R.has_r = True
    R.sig = sig
    R.root = root
    R.bcast = True
    R.rp = R.sp = <char*>R.rv.buf
    R.isz = 1
    R.total = R.rv.len
    R.step = co.half - _HDR
    _set_header(R, ord(arr.dtype.char), 0)
    return R


# ---- the steps (no Python objects unless a peer's header differs or dt < 0) --------

cdef inline void _slice(Py_ssize_t cnt, int n, int r, Py_ssize_t* a, Py_ssize_t* b) noexcept nogil:
    a[0] = cnt * r // n
    b[0] = cnt * (r + 1) // n


cdef const char* _peer(_Coll co, int q, uintptr_t at, Py_ssize_t nb, char* buf) except NULL nogil:
    """Bytes [at, at + nb) of q's sync segment: in place where mapped here,
    else fetched into buf."""
    cdef char* p
    cdef gx_route* rt
    cdef int rc = gx_locate(co.st, q, at, nb, &p, &rt)
    if rc == GX_OK:
        return p
    get_slow(co.st, q, buf, at, nb, rc)     # the transport's get, or the error
    return buf


cdef int _put_own(_Coll co, uintptr_t at, const void* src, Py_ssize_t nb) except -1 nogil:
    cdef int rc = gx_put(co.st, co.me, at, src, nb)
    if rc != GX_OK:
        put_slow(co.st, co.me, at, src, nb, rc)
    return 0


cdef int _combine(_Red R, char* out, const char* a, const char* b, Py_ssize_t nb) except -1 nogil:
    cdef Py_ssize_t k = nb // R.isz
    if R.dt == 0:
        _comb[int8_t](<int8_t*>out, <const int8_t*>a, <const int8_t*>b, k, R.op)
    elif R.dt == 1:
        _comb[uint8_t](<uint8_t*>out, <const uint8_t*>a, <const uint8_t*>b, k, R.op)
    elif R.dt == 2:
        _comb[int16_t](<int16_t*>out, <const int16_t*>a, <const int16_t*>b, k, R.op)
    elif R.dt == 3:
        _comb[uint16_t](<uint16_t*>out, <const uint16_t*>a, <const uint16_t*>b, k, R.op)
    elif R.dt == 4:
        _comb[int32_t](<int32_t*>out, <const int32_t*>a, <const int32_t*>b, k, R.op)
    elif R.dt == 5:
        _comb[uint32_t](<uint32_t*>out, <const uint32_t*>a, <const uint32_t*>b, k, R.op)
    elif R.dt == 6:
        _comb[int64_t](<int64_t*>out, <const int64_t*>a, <const int64_t*>b, k, R.op)
    elif R.dt == 7:
        _comb[uint64_t](<uint64_t*>out, <const uint64_t*>a, <const uint64_t*>b, k, R.op)
    elif R.dt == 8:
        _comb[float](<float*>out, <const float*>a, <const float*>b, k, R.op)
    elif R.dt == 9:
        _comb[double](<double*>out, <const double*>a, <const double*>b, k, R.op)
    else:
        with gil:
            _combine_np(R, out, a, b, nb)
    return 0


cdef int _combine_np(_Red R, char* out, const char* a, const char* b, Py_ssize_t nb) except -1:
    np = _numpy()
    o = np.frombuffer(PyMemoryView_FromMemory(out, nb, PyBUF_WRITE), R.dtype)
    x = np.frombuffer(PyMemoryView_FromMemory(<char*>a, nb, PyBUF_READ), R.dtype)
    y = x if a == b else np.frombuffer(PyMemoryView_FromMemory(<char*>b, nb, PyBUF_READ), R.dtype)
    R.ufunc(x, y, out=o)
    return 0


cdef int _reduce_into(_Coll co, _Red R, char* dst, Py_ssize_t off, Py_ssize_t nb) except -1 nogil:
    """dst = the members' bytes [off, off + nb) of the chunk, combined in rank order."""
    cdef const char* first = NULL
    cdef const char* src
    cdef char* p
    cdef gx_route* rt
    cdef uintptr_t at
    cdef int q
    if nb == 0:
        return 0
    for q in range(co.n):
        at = _half_addr(co, q, R.ph) + _HDR + off
        if q == 0 or gx_locate(co.st, q, at, nb, &p, &rt) == GX_OK:
            src = _peer(co, q, at, nb, dst)     # in place, or (rank 0) fetched into dst
        else:
            if R.tmp == NULL:               # only where a peer is not mapped here
                R.tmp = <char*>malloc(co.half)
                if R.tmp == NULL:
                    with gil:
                        raise MemoryError()
            src = _peer(co, q, at, nb, R.tmp)
        if q == 0:
            first = src
        elif q == 1:
            _combine(R, dst, first, src, nb)
        else:
            _combine(R, dst, dst, src, nb)
    if co.n == 1 and first != dst:
        memcpy(dst, first, nb)
    return 0


cdef int _red_post(_Coll co, _Red R) except -1 nogil:
    """Store this member's chunk (header, data) in its half."""
    cdef uintptr_t at
    R.m = R.step if R.step < R.total - R.lo else R.total - R.lo
    R.split = R.root < 0 and co.n > 1 and R.m >= _SPLIT_BYTES and R.m // R.isz >= co.n
    R.ph = co.phase
    co.phase += 1
    if R.bcast and co.me != R.root:
        return 0
    at = _half_addr(co, co.me, R.ph)
    _put_own(co, at, R.hdr, _HDR)
    if R.m:
        _put_own(co, at + _HDR, R.sp + R.lo, R.m)
    return 0


cdef int _red_mid(_Coll co, _Red R) except -1 nogil:
    """After the chunk's barrier: check the peers' headers (first chunk), then
    combine the whole chunk (whole) or this member's slice (split)."""
    cdef unsigned char theirs[_HDR]
    cdef const char* h
    cdef int q
    cdef Py_ssize_t a, b
    cdef uintptr_t at
    cdef int rc
    if R.rp == NULL:
        R.lo += R.m
        return 0
    if R.bcast:
        if co.me != R.root:
            at = _half_addr(co, R.root, R.ph)
            if R.lo == 0:
                h = _peer(co, R.root, at, _HDR, <char*>theirs)
                if memcmp(h, R.hdr, _HDR) != 0:
                    with gil:
                        _check_header(co, R.root, at, (<char*>R.hdr)[:_HDR], R.sig)
            if R.m:
                rc = gx_get(co.st, R.root, R.rp + R.lo, at + _HDR, R.m)
                if rc != GX_OK:
                    get_slow(co.st, R.root, R.rp + R.lo, at + _HDR, R.m, rc)
        R.lo += R.m
        return 0
    if R.lo == 0:
        for q in range(co.n):
            if q == co.me:
                continue
            h = _peer(co, q, _half_addr(co, q, R.ph), _HDR, <char*>theirs)
            if memcmp(h, R.hdr, _HDR) != 0:
                with gil:
                    _check_header(co, q, _half_addr(co, q, R.ph), (<char*>R.hdr)[:_HDR], R.sig)
    if R.gather:
        for q in range(co.n):
            if R.m:
                at = _half_addr(co, q, R.ph) + _HDR
                rc = gx_get(co.st, q, R.rp + q * R.total + R.lo, at, R.m)
                if rc != GX_OK:
                    get_slow(co.st, q, R.rp + q * R.total + R.lo, at, R.m, rc)
        R.lo += R.m
        return 0
    if not R.split:
        _reduce_into(co, R, R.rp + R.lo, 0, R.m)
        R.lo += R.m
        return 0
    _slice(R.m // R.isz, co.n, co.me, &a, &b)
    _reduce_into(co, R, R.rp + R.lo + a * R.isz, a * R.isz, (b - a) * R.isz)
    if b > a:
        _put_own(co, _half_addr(co, co.me, R.ph) + _HDR + a * R.isz, R.rp + R.lo + a * R.isz,
                 (b - a) * R.isz)
    return 0


cdef int _red_end(_Coll co, _Red R) except -1 nogil:
    """split, after the second barrier: the other members' reduced slices."""
    cdef int q, rc
    cdef Py_ssize_t a, b
    cdef uintptr_t at
    cdef char* dst
    for q in range(co.n):
        if q == co.me:
            continue
        _slice(R.m // R.isz, co.n, q, &a, &b)
        if b == a:
            continue
        at = _half_addr(co, q, R.ph) + _HDR + a * R.isz
        dst = R.rp + R.lo + a * R.isz
        rc = gx_get(co.st, q, dst, at, (b - a) * R.isz)
        if rc != GX_OK:
            get_slow(co.st, q, dst, at, (b - a) * R.isz, rc)
    R.lo += R.m
    return 0


cdef int _red_blocking(_Coll co, _Red R) except -1:
    """The whole reduction, a blocking barrier between steps."""
    cdef Client c = co.sync.client
    c._inflight += 1
    try:
        while True:
            if R.step < _SMALL_COPY or R.total - R.lo < _SMALL_COPY:
                _red_post(co, R)
                _barrier(co, 0, True)
                _red_mid(co, R)
            else:
                with nogil:
                    _red_post(co, R)
                _barrier(co, 0, True)
                with nogil:
                    _red_mid(co, R)
            if R.split:
                _barrier(co, 0, True)
                with nogil:
                    _red_end(co, R)
            if R.lo >= R.total:
                break
    finally:
        c._inflight -= 1
    return 0


def _gen_red(_Coll co, _Red R):
    """The same steps for an NB reduction (yield = a barrier)."""
    while True:
        _red_post(co, R)
        yield
        _red_mid(co, R)
        if R.split:
            yield
            _red_end(co, R)
        if R.lo >= R.total:
            break


cdef object _tm_bcast(Team tm, object buf, object root, bint nb):
    cdef str sig = "bcast_nb(buf, root)" if nb else "bcast(buf, root)"
    cdef _Coll co = _coll(tm, sig)
    cdef _Red R = _bc_intake(co, buf, _check_root(co, root, sig), sig)
    if nb:
        ev = _coll_event(tm, co, _gen_red(co, R), (buf, R))
        _raise_sync_error(co)
        return ev
    _red_blocking(co, R)
    _raise_sync_error(co)
    return None


_GA_SIGS = {(True, False): "allgather(send, recv)", (True, True): "allgather_nb(send, recv)",
            (False, False): "gather(send, recv, root)", (False, True): "gather_nb(send, recv, root)"}


cdef object _tm_gather(Team tm, object send, object recv, object root, bint nb):
    cdef bint allg = root is None
    cdef str sig = _GA_SIGS[allg, nb]
    cdef _Coll co = _coll(tm, sig)
    cdef int r = -1 if allg else _check_root(co, root, sig)
    cdef _Red R = _ga_intake(co, send, recv, r, sig)
    if nb:
        ev = _coll_event(tm, co, _gen_red(co, R), (send, recv, R))
        _raise_sync_error(co)
        return ev
    _red_blocking(co, R)
    _raise_sync_error(co)
    return None


_RED_SIGS = {(True, False): "allreduce(send, recv, op)", (True, True): "allreduce_nb(send, recv, op)",
             (False, False): "reduce(send, recv, op, root)",
             (False, True): "reduce_nb(send, recv, op, root)"}


cdef object _tm_reduce(Team tm, object send, object recv, object op, object root, bint nb):
    cdef bint allr = root is None
    cdef str sig = _RED_SIGS[allr, nb]
    cdef _Coll co = _coll(tm, sig)
    cdef int r = -1 if allr else _check_root(co, root, sig)
    cdef _Red R = _red_intake(co, send, recv, op, r, sig)
    if nb:
        ev = _coll_event(tm, co, _gen_red(co, R), (send, recv, R))
        _raise_sync_error(co)
        return ev
    _red_blocking(co, R)
    _raise_sync_error(co)
    return None
