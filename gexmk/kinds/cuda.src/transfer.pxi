# ---------------------------------------------------------------------------
# Copies, host registration, classification, streams and events
# ---------------------------------------------------------------------------
cdef int _cu_copy(void* kctx, void* stream, uintptr_t dst, uintptr_t src,
                  size_t n) except -1 nogil:
    """dst <- src, n bytes, any mix of device and host memory (UVA: the
    driver tells them apart).  On `stream` (a CUstream of this kind's
    context): issued only.  stream NULL: issued on the kind's internal stream
    and complete on return."""
    cdef CudaCtx* k = <CudaCtx*>kctx
    cdef CUstream s = <CUstream>stream
    cdef CUresult rc
    if n == 0:
        return 0
    _push(k)
    if s != NULL:
        rc = cydriver.cuMemcpyAsync(<CUdeviceptr>dst, <CUdeviceptr>src, n, s)
    else:
        rc = cydriver.cuMemcpyAsync(<CUdeviceptr>dst, <CUdeviceptr>src, n, k.sync_stream)
        if rc == CUDA_SUCCESS:
            rc = cydriver.cuStreamSynchronize(k.sync_stream)
    _pop(k)
    return check("cuMemcpyAsync" if s != NULL else "cuMemcpyAsync/cuStreamSynchronize", rc)


cdef int _cu_host_register(void* kctx, void* p, size_t n, int on) except -1 nogil:
    """Pin (on=1, cuMemHostRegister PORTABLE) or unpin (on=0) host memory so
    that the kind's copies to and from it run at full speed."""
    cdef CudaCtx* k = <CudaCtx*>kctx
    cdef CUresult rc
    _push(k)
    if on:
        rc = cydriver.cuMemHostRegister(p, n, cydriver.CU_MEMHOSTREGISTER_PORTABLE)
    else:
        rc = cydriver.cuMemHostUnregister(p)
    _pop(k)
    return check("cuMemHostRegister" if on else "cuMemHostUnregister", rc)


cdef int _cu_host_pinned(void* kctx, const void* p, size_t n) except -1 nogil:
    """1 when host memory [p, p + n) is page-locked for the driver (its first
    and last byte: cuMemHostAlloc'd or cuMemHostRegister'ed), 0 when pageable
    (cuPointerGetAttributes answers NULL attributes for memory the driver
    does not know)."""
    cdef CudaCtx* k = <CudaCtx*>kctx
    cdef CUpointer_attribute attr = cydriver.CU_POINTER_ATTRIBUTE_MEMORY_TYPE
    cdef unsigned int memtype
    cdef void* data = &memtype
    cdef uintptr_t ends[2]
    cdef int i
    if k == NULL or k.closed:
        return _closed(k)
    if n == 0:
        return 1
    ends[0] = <uintptr_t>p
    ends[1] = <uintptr_t>p + n - 1
    for i in range(2):
        memtype = 0
        check("cuPointerGetAttributes",
              cydriver.cuPointerGetAttributes(1, &attr, &data, <CUdeviceptr>ends[i]))
        if memtype != cydriver.CU_MEMORYTYPE_HOST:
            return 0
    return 1


cdef int _cu_write_value(void* kctx, void* stream, uintptr_t dst, uint64_t value,
                         int nbytes) except -1 nogil:
    """Store nbytes (4 or 8) of value at aligned device dst from the stream's
    front end (cuStreamWriteValue32/64: no copy engine, no host source
    buffer); stream NULL: on the kind's internal stream, complete on return."""
    cdef CudaCtx* k = <CudaCtx*>kctx
    cdef CUstream s = <CUstream>stream
    cdef CUresult rc
    if (nbytes != 4 and nbytes != 8) or dst & <uintptr_t>(nbytes - 1):
        with gil:
            raise ArgumentError(f"write_value: nbytes must be 4 or 8 and the address aligned to "
                                f"it, got {nbytes} at 0x{dst:x}")
    if k == NULL or k.closed:
        return _closed(k)
    _push(k)
    if s == NULL:
        s = k.sync_stream
    if nbytes == 8:
        rc = cydriver.cuStreamWriteValue64(s, <CUdeviceptr>dst, value,
                                           cydriver.CU_STREAM_WRITE_VALUE_DEFAULT)
    else:
        rc = cydriver.cuStreamWriteValue32(s, <CUdeviceptr>dst, <uint32_t>value,
                                           cydriver.CU_STREAM_WRITE_VALUE_DEFAULT)
    if rc == CUDA_SUCCESS and stream == NULL:
        rc = cydriver.cuStreamSynchronize(s)
    _pop(k)
    return check("cuStreamWriteValue64" if nbytes == 8 else "cuStreamWriteValue32", rc)


cdef int _cu_classify(void* kctx, uintptr_t p, int* cls, int* device) except -1 nogil:
    """GX_MK_CUDA_UVA and the device ordinal for device (and managed) memory;
    GX_MK_HOST and -1 for host memory, pinned or not, and unknown pointers."""
    cdef CudaCtx* k = <CudaCtx*>kctx
    cdef CUpointer_attribute attrs[3]
    cdef void* data[3]
    cdef unsigned long long memtype = 0, ordinal = 0, managed = 0
    if k == NULL or k.closed:
        return _closed(k)
    attrs[0] = cydriver.CU_POINTER_ATTRIBUTE_MEMORY_TYPE; data[0] = &memtype
    attrs[1] = cydriver.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL; data[1] = &ordinal
    attrs[2] = cydriver.CU_POINTER_ATTRIBUTE_IS_MANAGED; data[2] = &managed
    check("cuPointerGetAttributes",
          cydriver.cuPointerGetAttributes(3, attrs, data, <CUdeviceptr>p))
    if memtype == cydriver.CU_MEMORYTYPE_DEVICE or managed:
        cls[0] = GX_MK_CUDA_UVA
        device[0] = <int>ordinal
    else:
        cls[0] = GX_MK_HOST
        device[0] = -1
    return 0


cdef int _cu_stream_create(void* kctx, void** stream) except -1 nogil:
    """A CU_STREAM_NON_BLOCKING stream in the kind's context, owned by the caller."""
    cdef CudaCtx* k = <CudaCtx*>kctx
    cdef CUstream s = NULL
    cdef CUresult rc
    _push(k)
    rc = cydriver.cuStreamCreate(&s, cydriver.CU_STREAM_NON_BLOCKING)
    _pop(k)
    check("cuStreamCreate", rc)
    stream[0] = <void*>s
    return 0


cdef int _cu_stream_destroy(void* kctx, void* stream) except -1 nogil:
    if stream == NULL:
        return 0
    return check("cuStreamDestroy", cydriver.cuStreamDestroy(<CUstream>stream))


cdef int _cu_event_record(void* kctx, void* stream, void** event) except -1 nogil:
    """A new event (CU_EVENT_DISABLE_TIMING) recorded on `stream` (NULL: the
    context's legacy stream); the caller destroys it with event_destroy."""
    cdef CudaCtx* k = <CudaCtx*>kctx
    cdef CUevent ev = NULL
    cdef CUresult rc
    _push(k)
    rc = cydriver.cuEventCreate(&ev, cydriver.CU_EVENT_DISABLE_TIMING)
    if rc == CUDA_SUCCESS:
        rc = cydriver.cuEventRecord(ev, <CUstream>stream)
        if rc != CUDA_SUCCESS:
            cydriver.cuEventDestroy(ev)
            _pop(k)
            return check("cuEventRecord", rc)
    _pop(k)
    check("cuEventCreate", rc)
    event[0] = <void*>ev
    return 0


cdef int _cu_stream_wait(void* kctx, void* stream, void* event) except -1 nogil:
    """Work issued on `stream` after this waits for `event` (of any context
    or device), on the GPU: the host does not wait."""
    return check("cuStreamWaitEvent", cydriver.cuStreamWaitEvent(<CUstream>stream, <CUevent>event, 0))


cdef int _cu_wait_value(void* kctx, void* stream, uintptr_t addr, uint64_t value,
                        int cmp) except -1 nogil:
    """Work issued on `stream` after this waits, on the GPU, until the 64-bit
    word at device address addr compares (GX_WAITV_*) with value
    (cuStreamWaitValue64).  The kind's kernels are loaded first (see below)."""
    cdef CudaCtx* k = <CudaCtx*>kctx
    cdef unsigned int flags
    cdef CUresult rc
    if addr & 7:
        with gil:
            raise ArgumentError(f"wait_value: address 0x{addr:x} is not aligned to 8 bytes")
    if cmp == GX_WAITV_GEQ:
        flags = cydriver.CU_STREAM_WAIT_VALUE_GEQ
    elif cmp == GX_WAITV_EQ:
        flags = cydriver.CU_STREAM_WAIT_VALUE_EQ
    elif cmp == GX_WAITV_AND:
        flags = cydriver.CU_STREAM_WAIT_VALUE_AND
    else:
        flags = cydriver.CU_STREAM_WAIT_VALUE_NOR
    if k == NULL or k.closed:
        return _closed(k)
    _push(k)
    try:
        # Load the kind's kernels before any stream waits on a word: loading a
        # module waits for the context's streams (visit 45, lazy and eager modes:
        # bench/diagnostics/lazy_loading.py), so it would wait for this stream,
        # which waits for the signal that kernel (a signal_op or atomic of this
        # process) is to write: a deadlock.  (Loaded once; the lock only then.)
        if k.atom_mod == NULL:
            k.lock.lock()
            try:
                _atomics_load(k)
            finally:
                k.lock.unlock()
        rc = cydriver.cuStreamWaitValue64(<CUstream>stream, <CUdeviceptr>addr, value, flags)
    finally:
        _pop(k)
    return check("cuStreamWaitValue64", rc)


cdef int _cu_stream_capturing(void* kctx, void* stream) except -1 nogil:
    """1 while `stream` is being captured into a CUDA graph, else 0."""
    cdef cydriver.CUstreamCaptureStatus st = cydriver.CU_STREAM_CAPTURE_STATUS_NONE
    check("cuStreamIsCapturing", cydriver.cuStreamIsCapturing(<CUstream>stream, &st))
    return 0 if st == cydriver.CU_STREAM_CAPTURE_STATUS_NONE else 1


cdef int _cu_launch_host(void* kctx, void* stream, gx_host_fn fn, void* arg) except -1 nogil:
    """fn(arg) on a driver thread, in stream order (cuLaunchHostFunc)."""
    cdef CudaCtx* k = <CudaCtx*>kctx
    cdef CUresult rc
    _push(k)
    rc = cydriver.cuLaunchHostFunc(<CUstream>stream, <cydriver.CUhostFn>fn, arg)
    _pop(k)
    return check("cuLaunchHostFunc", rc)


cdef int _cu_event_query(void* kctx, void* event) except -1 nogil:
    """1 when the work before the event has completed, 0 while it is pending."""
    cdef CUresult rc = cydriver.cuEventQuery(<CUevent>event)
    if rc == CUDA_SUCCESS:
        return 1
    if rc == cydriver.CUDA_ERROR_NOT_READY:
        return 0
    return check("cuEventQuery", rc)


cdef int _cu_event_sync(void* kctx, void* event) except -1 nogil:
    return check("cuEventSynchronize", cydriver.cuEventSynchronize(<CUevent>event))


cdef int _cu_event_destroy(void* kctx, void* event) except -1 nogil:
    if event == NULL:
        return 0
    return check("cuEventDestroy", cydriver.cuEventDestroy(<CUevent>event))
