# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------
cdef int _raise_cuda(const char* call, CUresult rc) except -1 with gil:
    cdef const char* name = NULL
    cdef const char* text = NULL
    # The call that returned rc loaded the driver, so these two cannot meet
    # the loader; for a code the driver does not know they leave NULL.
    cydriver.cuGetErrorName(rc, &name)
    cydriver.cuGetErrorString(rc, &text)
    pyname = name.decode() if name != NULL else "CUDA_ERROR_UNKNOWN"
    pytext = text.decode() if text != NULL else "unrecognized error code"
    raise CUDAError(call.decode(), <int>rc, pytext, pyname)


cdef inline int check(const char* call, CUresult rc) except -1 nogil:
    """Return 0 for CUDA_SUCCESS, else raise :class:`gexmk.errors.CUDAError`
    (with ``.call``, ``.code``, ``.name`` and ``cuGetErrorString`` text).
    Runs without the GIL and takes it only to raise.  A missing driver
    surfaces earlier, as the loader's own exception from the cydriver call."""
    if rc == CUDA_SUCCESS:
        return 0
    return _raise_cuda(call, rc)


cdef int _init() except -1:
    """cuInit(0); where the driver cannot be loaded or finds no device,
    UnsupportedError instead of the loader's exception or CUDA_ERROR_NO_DEVICE."""
    try:
        with nogil:
            check("cuInit", cydriver.cuInit(0))
    except CUDAError as e:
        if e.code == CUDA_ERROR_NO_DEVICE:
            raise UnsupportedError("CUDA kind unsupported on this machine: no CUDA device "
                                   "(cuInit: CUDA_ERROR_NO_DEVICE)") from None
        raise
    except Exception as e:
        raise UnsupportedError(f"CUDA kind unsupported on this machine: "
                               f"{type(e).__name__}: {e}") from e
    return 0


cdef object _index(object value, str name, object lo, object hi):
    """An integer argument through ``__index__`` (no silent float truncation),
    range-checked; TypeError / ArgumentError name the parameter (STYLE 13)."""
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, not {type(value).__name__}") from None
    if v < lo or v > hi:
        raise ArgumentError(f"{name} must be in [{lo}, {hi}], got {v}")
    return v
