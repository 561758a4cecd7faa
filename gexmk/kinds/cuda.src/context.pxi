# ---------------------------------------------------------------------------
# The kind's C context (the `kctx` every slot of gx_kind_ops receives)
# ---------------------------------------------------------------------------
cdef struct CudaCtx:
    CUdevice dev
    int ordinal
    CUcontext ctx             # primary (retained here) or the user's (borrowed)
    bint primary
    bint closed               # set by CudaKind.close(); every slot then raises StateError
    bint vmm                  # CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
    bint posix_fd             # ... HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
    bint fabric               # ... HANDLE_TYPE_FABRIC_SUPPORTED
    int fabric_state          # -1 untried, 0 cuMemCreate refused FABRIC (no IMEX), 1 works
    size_t gran               # minimum granularity, pinned device memory, POSIX-FD handle
    size_t gran_alloc         # what alloc rounds to: max over the handle types it asks for
    CUstream sync_stream      # internal non-blocking stream for the synchronous paths
    mutex* lock               # guards the lazily loaded atomics module and result word
    CUmodule atom_mod         # atomics PTX module, loaded on the first atomic
    CUfunction atom_fn[6]     # one kernel per GX_DT_*
    CUfunction copy_fn        # the small-copy kernel of the same module
    void* atom_res            # pinned host result word of synchronous atomics
    CUfunction list_fn        # the gather kernel of the same module (copy_gather)
    uint64_t* ring            # copy_gather's descriptor slots, pinned host memory filled here
    CUdeviceptr ring_dev      # ... and their device copies, which the kernel reads
    CUevent ring_ev[4]        # per slot: recorded after the launch that last read it
    int ring_next             # the slot the next launch fills
    uint64_t gather_launches  # copy_gather's kernel launches so far (CudaKind.gather_launches)


cdef inline int _closed(const CudaCtx* k) except -1 nogil:
    with gil:
        raise StateError("the CUDA kind is closed")


cdef inline int _push(CudaCtx* k) except -1 nogil:
    """Make the kind's context current on this thread, above whatever the
    caller had; _pop restores the caller's context exactly."""
    if k == NULL or k.closed:
        return _closed(k)
    return check("cuCtxPushCurrent", cydriver.cuCtxPushCurrent(k.ctx))


cdef inline void _pop(CudaCtx* k) noexcept nogil:
    cdef CUcontext c
    cydriver.cuCtxPopCurrent(&c)


cdef inline size_t _round_up(size_t n, size_t g) noexcept nogil:
    return (n + g - 1) // g * g if g else n


cdef void _device_prop(CUmemAllocationProp* prop, int ordinal, int handle_types) noexcept nogil:
    memset(prop, 0, sizeof(CUmemAllocationProp))
    prop.type = cydriver.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cydriver.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = ordinal
    prop.requestedHandleTypes = <CUmemAllocationHandleType>handle_types


cdef int _granularity(int ordinal, int handle_types, size_t* out) except -1 nogil:
    cdef CUmemAllocationProp prop
    _device_prop(&prop, ordinal, handle_types)
    return check("cuMemGetAllocationGranularity", cydriver.cuMemGetAllocationGranularity(
        out, &prop, cydriver.CU_MEM_ALLOC_GRANULARITY_MINIMUM))


cdef int _dev_attr(CUdevice dev, CUdevice_attribute attr) noexcept nogil:
    """A device attribute as a flag; 0 where the driver does not know it."""
    cdef int value = 0
    if cydriver.cuDeviceGetAttribute(&value, attr, dev) != CUDA_SUCCESS:
        return 0
    return value


cdef int _kctx_open(CudaCtx* k, int ordinal, uintptr_t user_ctx) except -1:
    """Fill k for device `ordinal` and context `user_ctx` (0: the primary
    context).  On failure everything acquired is given back (k stays closed)."""
    cdef int count = 0
    cdef CUdevice other
    cdef CUcontext c
    cdef CUresult rc
    cdef size_t g = 0
    cdef int handle
    k.closed = True
    _init()
    with nogil:
        check("cuDeviceGetCount", cydriver.cuDeviceGetCount(&count))
    if ordinal >= count:
        raise ArgumentError(f"CUDA device {ordinal} does not exist: this machine has {count} "
                            f"device(s)" + (f", ordinals 0..{count - 1}" if count else ""))
    with nogil:
        check("cuDeviceGet", cydriver.cuDeviceGet(&k.dev, ordinal))
    k.ordinal = ordinal
    if not _dev_attr(k.dev, cydriver.CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING):
        raise UnsupportedError(f"CUDA kind unsupported on this machine: device {ordinal} has no "
                               "unified addressing (CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING)")
    k.vmm = _dev_attr(k.dev, cydriver.CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) != 0
    k.posix_fd = _dev_attr(
        k.dev, cydriver.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED) != 0
    k.fabric = _dev_attr(k.dev, cydriver.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED) != 0
    k.fabric_state = -1 if k.fabric else 0
    if user_ctx == 0:
        with nogil:
            check("cuDevicePrimaryCtxRetain", cydriver.cuDevicePrimaryCtxRetain(&k.ctx, k.dev))
        k.primary = True
    else:
        k.ctx = <CUcontext>user_ctx
        k.primary = False
    try:
        with nogil:
            check("cuCtxPushCurrent", cydriver.cuCtxPushCurrent(k.ctx))
            rc = cydriver.cuCtxGetDevice(&other)
            if rc == CUDA_SUCCESS:
                rc = cydriver.cuStreamCreate(&k.sync_stream, cydriver.CU_STREAM_NON_BLOCKING)
            cydriver.cuCtxPopCurrent(&c)
            check("cuCtxGetDevice/cuStreamCreate", rc)
        if not k.primary and other != k.dev:
            raise ArgumentError(f"context {user_ctx:#x} belongs to another CUDA device than "
                                f"device {ordinal}")
        if k.vmm:
            handle = <int>cydriver.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR if k.posix_fd else 0
            with nogil:
                _granularity(ordinal, handle, &k.gran)
            k.gran_alloc = k.gran
            if k.fabric:
                handle |= cydriver.CU_MEM_HANDLE_TYPE_FABRIC
                with nogil:
                    if _granularity(ordinal, handle, &g) == 0 and g > k.gran_alloc:
                        k.gran_alloc = g
        k.lock = new mutex()
    except BaseException:
        _kctx_close(k)
        raise
    k.closed = False
    return 0


cdef void _kctx_close(CudaCtx* k) noexcept nogil:
    """Give back what _kctx_open and the atomics acquired.  Errors are ignored
    (a context torn down at exit took its objects with it); idempotent."""
    cdef CUcontext c
    cdef bint pushed = False
    cdef int i
    k.closed = True
    if k.ctx != NULL:
        pushed = cydriver.cuCtxPushCurrent(k.ctx) == CUDA_SUCCESS
    if k.atom_res != NULL:
        cydriver.cuMemFreeHost(k.atom_res)
        k.atom_res = NULL
    for i in range(4):
        if k.ring_ev[i] != NULL:
            cydriver.cuEventDestroy(k.ring_ev[i])
            k.ring_ev[i] = NULL
    if k.ring != NULL:
        cydriver.cuMemFreeHost(k.ring)
        k.ring = NULL
    if k.ring_dev != 0:
        cydriver.cuMemFree(k.ring_dev)
        k.ring_dev = 0
    if k.atom_mod != NULL:
        cydriver.cuModuleUnload(k.atom_mod)
        k.atom_mod = NULL
    if k.sync_stream != NULL:
        cydriver.cuStreamDestroy(k.sync_stream)
        k.sync_stream = NULL
    if pushed:
        cydriver.cuCtxPopCurrent(&c)
    if k.primary:
        cydriver.cuDevicePrimaryCtxRelease(k.dev)
        k.primary = False
    k.ctx = NULL
    if k.lock != NULL:
        del k.lock
        k.lock = NULL
