# ---------------------------------------------------------------------------
# Device memory to array libraries: CUDA array interface v3 and DLPack
# ---------------------------------------------------------------------------
# DLPack's ABI (dlpack.h, the unversioned DLManagedTensor that the "dltensor"
# capsule carries), declared here because no package ships a .pxd for it.
cdef struct DLDevice:
    int32_t device_type         # DLDeviceType (a C enum: int-sized)
    int32_t device_id

cdef struct DLDataType:
    uint8_t code                # DLDataTypeCode
    uint8_t bits
    uint16_t lanes

cdef struct DLTensor:
    void* data                  # the first byte (byte_offset stays 0: consumers refuse others)
    DLDevice device
    int32_t ndim
    DLDataType dtype
    int64_t* shape
    int64_t* strides            # NULL: compact row-major
    uint64_t byte_offset

cdef struct DLManagedTensor:
    DLTensor dl_tensor
    void* manager_ctx
    void (*deleter)(DLManagedTensor*) noexcept nogil

cdef struct _DLHolder:          # one malloc: the tensor and its shape
    DLManagedTensor t
    int64_t shape[1]

cdef enum:
    kDLCUDA = 2
    kDLUInt = 1


cdef void _dl_deleter(DLManagedTensor* t) noexcept nogil:
    """DLPack deleter: drop the reference to the owner and free the tensor.
    Consumers may call it from any thread, with or without the GIL."""
    if t == NULL:
        return
    if t.manager_ctx != NULL:
        with gil:
            Py_XDECREF(<PyObject*>t.manager_ctx)
    free(t)


cdef void _dl_capsule_destructor(object capsule) noexcept:
    # A consumer renames the capsule "used_dltensor" and owns the tensor from
    # then on; only an unconsumed capsule still holds it.
    cdef DLManagedTensor* t
    if not PyCapsule_IsValid(capsule, b"dltensor"):
        return
    t = <DLManagedTensor*>PyCapsule_GetPointer(capsule, b"dltensor")
    if t != NULL and t.deleter != NULL:
        t.deleter(t)


def cuda_array_interface(addr, nbytes, device, readonly=False) -> dict:
    """``__cuda_array_interface__`` (v3) of ``nbytes`` bytes of device memory
    at ``addr`` on CUDA device ``device``: a 1-D uint8 array, C-contiguous,
    with no stream to wait on (the memory is ready when handed out)."""
    a = _index(addr, "addr", 0, _UINTPTR_MAX)
    n = _index(nbytes, "nbytes", 0, 2 ** 63 - 1)
    d = _index(device, "device", 0, 2 ** 31 - 1)
    _check_cai_device(a, d)
    return {"shape": (n,), "typestr": "|u1", "data": (a, bool(readonly)), "version": 3,
            "strides": None, "stream": None}


cdef int _have_driver = 0         # 0: not asked yet, 1: a driver, -1: none


cdef bint _driver_present():
    """Whether an NVIDIA driver is loaded (asked once): without one no memory
    is another GPU's, and the driver's calls raise rather than answer."""
    global _have_driver
    if _have_driver == 0:
        try:
            driver_version()
            _have_driver = 1
        except UnsupportedError:
            _have_driver = -1
    return _have_driver > 0


cdef int _check_cai_device(uintptr_t addr, int device) except -1:
    """A view of another GPU's memory mapped for ``device`` (a peer's segment on
    a node of several GPUs): consumers of this interface (CuPy, Numba) take the
    device from the pointer's attributes -- the memory's home -- and CuPy copies
    the array to the current device when that differs: a store would go into the
    copy and be lost.  Refuse unless the home device is current, and say how to
    view it instead."""
    cdef int home, cur = -1
    cdef CUdevice dev
    if not _driver_present():
        return 0
    with nogil:
        home = _home_device(addr)
        if home >= 0 and home != device and cydriver.cuCtxGetDevice(&dev) == CUDA_SUCCESS:
            cur = <int>dev
    if home < 0 or home == device or cur == home:
        return 0
    raise UnsupportedError(
        f"__cuda_array_interface__: this view maps memory of GPU {home} for GPU {device}; "
        f"CuPy and Numba read the device from the pointer (GPU {home}) and CuPy copies "
        f"the array when GPU {home} is not current (GPU {cur}), so stores would be lost. "
        f"View it with cupy.from_dlpack(view) or torch.from_dlpack(view) (on GPU {device}), "
        f"or make GPU {home} current first (with cupy.cuda.Device({home}): ...)")


def dlpack_device(device) -> tuple:
    """``__dlpack_device__`` of memory on CUDA device ``device``: ``(kDLCUDA = 2, device)``."""
    return (kDLCUDA, _index(device, "device", 0, 2 ** 31 - 1))


def dlpack_capsule(addr, nbytes, device, owner):
    """A ``"dltensor"`` PyCapsule (DLPack) over ``nbytes`` bytes of device
    memory at ``addr`` on CUDA device ``device``: 1-D, uint8, compact.  The
    tensor holds a reference to ``owner`` (the object keeping the memory
    alive) until the consumer's deleter runs, or the unconsumed capsule dies."""
    cdef uintptr_t a = _index(addr, "addr", 0, _UINTPTR_MAX)
    cdef int64_t n = _index(nbytes, "nbytes", 0, 2 ** 63 - 1)
    cdef int dev = _index(device, "device", 0, 2 ** 31 - 1)
    cdef _DLHolder* h = <_DLHolder*>calloc(1, sizeof(_DLHolder))
    if h == NULL:
        raise MemoryError()
    h.shape[0] = n
    # The data pointer itself, byte_offset 0: PyTorch and CuPy refuse a
    # non-zero byte_offset (the spec's 256-byte alignment is advisory; both
    # hand out unaligned data pointers for views themselves).
    h.t.dl_tensor.data = <void*>a
    h.t.dl_tensor.byte_offset = 0
    h.t.dl_tensor.device.device_type = kDLCUDA
    h.t.dl_tensor.device.device_id = dev
    h.t.dl_tensor.ndim = 1
    h.t.dl_tensor.dtype.code = kDLUInt
    h.t.dl_tensor.dtype.bits = 8
    h.t.dl_tensor.dtype.lanes = 1
    h.t.dl_tensor.shape = h.shape
    h.t.dl_tensor.strides = NULL
    Py_INCREF(owner)
    h.t.manager_ctx = <void*>owner
    h.t.deleter = _dl_deleter
    try:
        return PyCapsule_New(<void*>&h.t, b"dltensor", _dl_capsule_destructor)
    except BaseException:
        _dl_deleter(&h.t)
        raise


def dlpack_range(obj) -> tuple:
    """``(pointer, nbytes, device_type, device_id)`` of a C-contiguous DLPack
    array (``obj.__dlpack__()``'s "dltensor" capsule, read and given back
    unconsumed: its deleter runs when the capsule goes).  Its memory stays
    valid while ``obj`` lives.  ArgumentError for a non-contiguous array."""
    capsule = obj.__dlpack__()
    if not PyCapsule_IsValid(capsule, b"dltensor"):
        raise ArgumentError(f"{type(obj).__name__}.__dlpack__() did not return a 'dltensor' capsule")
    cdef DLManagedTensor* m = <DLManagedTensor*>PyCapsule_GetPointer(capsule, b"dltensor")
    cdef DLTensor* t = &m.dl_tensor
    cdef int i
    cdef int64_t expect
    cdef size_t item = (<size_t>t.dtype.bits * t.dtype.lanes + 7) // 8
    cdef size_t n = item
    for i in range(t.ndim):
        n *= <size_t>t.shape[i]
    if t.strides != NULL and n:
        expect = 1
        for i in range(t.ndim - 1, -1, -1):
            if t.shape[i] > 1 and t.strides[i] != expect:
                raise ArgumentError(f"{type(obj).__name__}: the DLPack array is not C-contiguous")
            expect *= t.shape[i]
    return (<uintptr_t>t.data + t.byte_offset, n, t.device.device_type, t.device.device_id)
