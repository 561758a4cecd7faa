# ---- VIS: non-contiguous arrays (numpy, PEP 3118, CUDA array interface) as the
# local side of put/get and of the strided forms ----------------------------------

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
    _cai_sync(cai, int(cai["data"][0]), obj)
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
        q.lkind = tm.c.ep.seg_kind
        q.ldev = tm.c.ep.seg_device
    elif total:
        _vis_local_kind(q, v.lbase + lo, <size_t>(hi - lo), sig, "src" if is_put else "dest",
                        &tm.c, _is_device_array(obj))
    q.keep.append(obj)
    if total == 0:
        _check_blocks(q, &tm.c, rank, sig, "dest" if is_put else "src")
        return q
    _check_strided(v, &tm.c, rank, sig, "dest" if is_put else "src")
    return q


cdef object _array_xfer(Team tm, bint is_put, int mode, int rank, uintptr_t addr, object obj,
                        object lc, str sig, object stream=None):
    """put/get (their _nb/_nbi/_on_stream forms) whose local array is not contiguous."""
    q = _array_req(tm, rank, addr, obj, is_put, sig)
    return _vis_complete(tm, q, rank, is_put, mode, lc, _fn(sig), stream)
