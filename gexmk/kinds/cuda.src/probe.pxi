# ---------------------------------------------------------------------------
# Probe
# ---------------------------------------------------------------------------
def driver_version() -> int:
    """The CUDA version the installed driver supports, as ``1000*major +
    10*minor`` (``cuDriverGetVersion``).  Raises
    :class:`gexmk.errors.UnsupportedError` where there is no NVIDIA driver."""
    cdef int v = 0
    try:
        with nogil:
            check("cuDriverGetVersion", cydriver.cuDriverGetVersion(&v))
    except CUDAError:
        raise
    except Exception as e:
        raise UnsupportedError(f"CUDA kind unsupported on this machine: "
                               f"{type(e).__name__}: {e}") from e
    return v


cdef object _attr(CUdevice dev, CUdevice_attribute attr):
    """One device attribute; None where the driver does not know it."""
    cdef int value = 0
    cdef CUresult rc
    with nogil:
        rc = cydriver.cuDeviceGetAttribute(&value, attr, dev)
    if rc == CUDA_ERROR_INVALID_VALUE:
        return None
    check("cuDeviceGetAttribute", rc)
    return value


cdef object _flag(CUdevice dev, CUdevice_attribute attr):
    value = _attr(dev, attr)
    return None if value is None else bool(value)


cdef object _p2p(CUdevice a, CUdevice b, CUdevice_P2PAttribute attr):
    cdef int value = 0
    cdef CUresult rc
    with nogil:
        rc = cydriver.cuDeviceGetP2PAttribute(&value, attr, a, b)
    if rc == CUDA_ERROR_INVALID_VALUE:
        return None
    check("cuDeviceGetP2PAttribute", rc)
    return bool(value)


cdef dict _device(int ordinal):
    cdef CUdevice dev
    cdef char name[256]
    cdef char bus_id[32]
    cdef size_t total = 0
    with nogil:
        check("cuDeviceGet", cydriver.cuDeviceGet(&dev, ordinal))
        check("cuDeviceGetName", cydriver.cuDeviceGetName(name, sizeof(name), dev))
        check("cuDeviceTotalMem", cydriver.cuDeviceTotalMem(&total, dev))
        check("cuDeviceGetPCIBusId", cydriver.cuDeviceGetPCIBusId(bus_id, sizeof(bus_id), dev))
    major = _attr(dev, cydriver.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
    minor = _attr(dev, cydriver.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
    return {
        "ordinal": ordinal,
        "name": name.decode("utf-8", "replace"),
        "pci_bus_id": bus_id.decode(),
        "compute_capability": f"{major}.{minor}",
        "total_memory": total,
        "multiprocessors": _attr(dev, cydriver.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
        "integrated": _flag(dev, cydriver.CU_DEVICE_ATTRIBUTE_INTEGRATED),
        "unified_addressing": _flag(dev, cydriver.CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING),
        # device segments are built on the VMM API (cuMemCreate/cuMemMap)
        "vmm": _flag(dev, cydriver.CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED),
        # intra-node cross-mapping exports VMM allocations as POSIX fds ...
        "posix_fd_handle": _flag(dev, cydriver.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED),
        # ... or as fabric handles, which also need an IMEX channel at run time
        "fabric_handle": _flag(dev, cydriver.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED),
        "gpudirect_rdma": _flag(dev, cydriver.CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED),
        "gpudirect_rdma_with_vmm": _flag(dev, cydriver.CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED),
        "dma_buf": _flag(dev, cydriver.CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED),
        "multicast": _flag(dev, cydriver.CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED),
        "bar1_total": None,
    }


def _bar1_totals(devices):
    """BAR1 aperture per device from NVML, best effort: fills ``bar1_total``
    (bytes) where cuda.bindings has NVML bindings and the library loads."""
    try:
        from cuda.bindings import nvml
        nvml.init_v2()
    except Exception:
        return
    try:
        for d in devices:
            try:
                handle = nvml.device_get_handle_by_pci_bus_id_v2(d["pci_bus_id"])
                d["bar1_total"] = int(nvml.device_get_bar1_memory_info(handle).bar1_total)
            except Exception:
                pass
    finally:
        try:
            nvml.shutdown()
        except Exception:
            pass


def probe() -> dict:
    """What this machine offers the CUDA memory kind.

    Returns a dict: ``driver_loaded`` (the NVIDIA driver library could be
    loaded), ``available`` (initialised with at least one device),
    ``reason`` (why not, else None), ``driver_version`` (``"major.minor"``
    the driver supports), ``device_count``, ``devices`` (per device: name,
    PCI bus id, compute capability, ``total_memory`` and ``bar1_total`` in
    bytes, and booleans for unified addressing, VMM, POSIX-fd and fabric
    handles, GPUDirect RDMA (plain and with VMM allocations), DMA-BUF and
    multicast -- None where the driver does not know the attribute), and the
    ``peer_access`` and ``peer_atomics`` matrices (``[i][j]``: device *i*
    can access / perform native atomics on device *j*'s memory).

    Never raises for a missing driver or device: those are reported.
    """
    cdef int version = 0
    cdef int count = 0
    cdef int can = 0
    cdef CUdevice a, b
    out = {"driver_loaded": False, "available": False, "reason": None,
           "driver_version": None, "device_count": 0, "devices": [],
           "peer_access": [], "peer_atomics": []}
    try:
        with nogil:
            check("cuDriverGetVersion", cydriver.cuDriverGetVersion(&version))
    except CUDAError as e:
        out["reason"] = f"CUDA kind unsupported on this machine: {e}"
        return out
    except Exception as e:
        # cydriver's lazy loader: no libcuda, i.e. no NVIDIA driver.
        out["reason"] = f"CUDA kind unsupported on this machine: {type(e).__name__}: {e}"
        return out
    out["driver_loaded"] = True
    out["driver_version"] = f"{version // 1000}.{(version % 1000) // 10}"
    try:
        with nogil:
            check("cuInit", cydriver.cuInit(0))
            check("cuDeviceGetCount", cydriver.cuDeviceGetCount(&count))
    except CUDAError as e:
        what = "no CUDA device" if e.code == CUDA_ERROR_NO_DEVICE else str(e)
        out["reason"] = f"CUDA kind unsupported on this machine: {what}"
        return out
    out["device_count"] = count
    if count == 0:
        out["reason"] = "CUDA kind unsupported on this machine: no CUDA device"
        return out
    out["devices"] = [_device(i) for i in range(count)]
    _bar1_totals(out["devices"])
    access, atomics = [], []
    for i in range(count):
        row_access, row_atomics = [], []
        for j in range(count):
            if i == j:
                row_access.append(True)
                row_atomics.append(True)
                continue
            with nogil:
                check("cuDeviceGet", cydriver.cuDeviceGet(&a, i))
                check("cuDeviceGet", cydriver.cuDeviceGet(&b, j))
                check("cuDeviceCanAccessPeer", cydriver.cuDeviceCanAccessPeer(&can, a, b))
            row_access.append(bool(can))
            row_atomics.append(_p2p(a, b, cydriver.CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED))
        access.append(row_access)
        atomics.append(row_atomics)
    out["peer_access"] = access
    out["peer_atomics"] = atomics
    out["available"] = True
    return out


# ---------------------------------------------------------------------------
# A device buffer for probes
# ---------------------------------------------------------------------------
cdef class DeviceBuffer:
    """*nbytes* of device memory on CUDA device *device*, from ``cuMemAlloc``
    in the device's primary context -- for probes such as
    :func:`gexmk.fabric_probe.hmem_cuda_registration`, not a segment.

    The primary context is retained for the buffer's lifetime and made
    current on the creating thread.  ``ptr`` is the device address (int).
    ``close()`` frees both and is idempotent; use as a context manager.
    Raises :class:`gexmk.errors.UnsupportedError` without a driver,
    :class:`gexmk.errors.CUDAError` when the driver refuses.
    """
    cdef CUdevice _dev
    cdef CUcontext _ctx
    cdef CUdeviceptr _ptr
    cdef size_t _nbytes
    cdef int _ordinal
    cdef bint _retained

    def __cinit__(self, size_t nbytes=1 << 16, int device=0):
        self._retained = False
        self._ptr = 0
        if nbytes == 0:
            raise ArgumentError("nbytes must be a positive number of bytes, not 0")
        self._nbytes = nbytes
        self._ordinal = device
        _init()
        with nogil:
            check("cuDeviceGet", cydriver.cuDeviceGet(&self._dev, device))
            check("cuDevicePrimaryCtxRetain", cydriver.cuDevicePrimaryCtxRetain(&self._ctx, self._dev))
        self._retained = True
        try:
            with nogil:
                check("cuCtxSetCurrent", cydriver.cuCtxSetCurrent(self._ctx))
                check("cuMemAlloc", cydriver.cuMemAlloc(&self._ptr, nbytes))
        except BaseException:
            self._release()        # a failed constructor leaves nothing behind
            raise

    cdef void _release(self) noexcept nogil:
        # Errors are ignored: this runs from close() and __dealloc__, and a
        # context that is already gone has freed the memory with it.
        if self._ptr != 0:
            cydriver.cuMemFree(self._ptr)
            self._ptr = 0
        if self._retained:
            cydriver.cuDevicePrimaryCtxRelease(self._dev)
            self._retained = False

    @property
    def ptr(self) -> int:
        """Device address of the buffer (0 once closed)."""
        return <uintptr_t>self._ptr

    @property
    def nbytes(self) -> int:
        """Size of the buffer in bytes."""
        return self._nbytes

    @property
    def device(self) -> int:
        """CUDA device ordinal the buffer lives on."""
        return self._ordinal

    def close(self):
        """Free the memory and release the primary context (idempotent)."""
        with nogil:
            self._release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __dealloc__(self):
        self._release()
