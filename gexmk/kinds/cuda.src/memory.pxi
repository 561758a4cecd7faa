# ---------------------------------------------------------------------------
# Allocations: alloc / grow / release / adopt (gx_mem.priv is a CuMem)
# ---------------------------------------------------------------------------
cdef enum:
    CU_MEM_VMM = 1            # alloc/grow: cuMemCreate chunks mapped in our reservation
    CU_MEM_VMM_CLIENT = 2     # adopted VMM memory: retained handles (released, never unmapped)
    CU_MEM_LEGACY = 3         # adopted cuMemAlloc memory: legacy IPC of the allocation base
    CU_MEM_POOL = 4           # adopted stream-ordered pool memory (cuMemAllocAsync)
    CU_MEM_VMM_IMPORT = 5     # a peer's VMM chunks imported and mapped here
    CU_MEM_IPC_IMPORT = 6     # a peer's cuMemAlloc memory opened with cuIpcOpenMemHandle

# Why an adopted allocation cannot be exported (CuMem.why)
cdef enum:
    CU_WHY_NONE = 0
    CU_WHY_POOL = 1           # stream-ordered pool memory
    CU_WHY_HANDLE = 2         # VMM chunk created without the POSIX-FD handle type
    CU_WHY_CHUNKS = 3         # more VMM chunks than one export carries
    CU_WHY_IPC = 4            # the driver says: not legacy-IPC capable
    CU_WHY_DEVICE = 5         # the device has no POSIX-FD handles


cdef struct CuChunk:
    CUmemGenericAllocationHandle h
    size_t off                # from CuMem.base
    size_t size


cdef struct CuMem:
    int type                  # CU_MEM_*
    int why                   # CU_WHY_* (not exportable)
    int nchunks
    int handle_types          # CUmemAllocationHandleType bits of alloc's chunks
    size_t gran               # granularity the chunks were rounded to
    uintptr_t base            # VMM: first chunk's address; legacy/IPC import: allocation base
    size_t base_size          # VMM import: bytes reserved; legacy: allocation size
    CuChunk chunks[GX_KIND_MAX_FDS]


cdef inline CuMem* _new_mem(int type) except NULL nogil:
    cdef CuMem* m = <CuMem*>calloc(1, sizeof(CuMem))
    if m == NULL:
        with gil:
            raise MemoryError()
    m.type = type
    return m


cdef int _create_chunk(CudaCtx* k, size_t size, CUmemGenericAllocationHandle* h,
                       int* types) except -1 nogil:
    """cuMemCreate of pinned memory on the kind's device, exportable as a POSIX
    FD, and as a fabric handle too where the device supports it and creation
    with it succeeds (it needs an IMEX channel); else POSIX FD alone."""
    cdef CUmemAllocationProp prop
    cdef CUresult rc
    cdef int base = cydriver.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR if k.posix_fd else 0
    if k.fabric and k.fabric_state != 0:
        _device_prop(&prop, k.ordinal, base | cydriver.CU_MEM_HANDLE_TYPE_FABRIC)
        rc = cydriver.cuMemCreate(h, size, &prop, 0)
        if rc == CUDA_SUCCESS:
            k.fabric_state = 1
            types[0] = base | cydriver.CU_MEM_HANDLE_TYPE_FABRIC
            return 0
        if k.fabric_state == 1:      # worked before: this is a real failure (e.g. out of memory)
            return check("cuMemCreate", rc)
        k.fabric_state = 0           # no IMEX channel here: stop asking
    _device_prop(&prop, k.ordinal, base)
    check("cuMemCreate", cydriver.cuMemCreate(h, size, &prop, 0))
    types[0] = base
    return 0


cdef int _set_access(CudaCtx* k, uintptr_t addr, size_t size) except -1 nogil:
    """Read-write access for exactly this kind's device (no peer mappings)."""
    cdef CUmemAccessDesc desc
    memset(&desc, 0, sizeof(desc))
    desc.location.type = cydriver.CU_MEM_LOCATION_TYPE_DEVICE
    desc.location.id = k.ordinal
    desc.flags = cydriver.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    return check("cuMemSetAccess", cydriver.cuMemSetAccess(<CUdeviceptr>addr, size, &desc, 1))


cdef int _home_device(uintptr_t addr) noexcept nogil:
    """The device whose memory backs a VMM mapping at addr (this process's
    ordinal, as the runtime's pointer attributes report it), or -1."""
    cdef CUmemGenericAllocationHandle h
    cdef CUmemAllocationProp prop
    cdef int home = -1
    if cydriver.cuMemRetainAllocationHandle(&h, <void*>addr) != CUDA_SUCCESS:
        return -1
    if cydriver.cuMemGetAllocationPropertiesFromHandle(&prop, h) == CUDA_SUCCESS \
            and prop.location.type == cydriver.CU_MEM_LOCATION_TYPE_DEVICE:
        home = prop.location.id
    cydriver.cuMemRelease(h)
    return home


# GEXMK_CUDA_GRANT_HOME=0 leaves imported mappings with access for the importer's
# GPU only (CuPy views of another GPU's memory are then refused, not granted)
cdef bint _grant_home = os.environ.get("GEXMK_CUDA_GRANT_HOME", "1") != "0"


cdef int _grant_home_device(CudaCtx* k, uintptr_t addr, size_t size) except -1 nogil:
    """Give an imported mapping access for the GPU its memory lives on too, where
    that is another device of this process: array libraries that read pointer
    attributes (CuPy, Numba) work on that device, and a kernel's store from a
    device without access faults on a context nobody synchronises.  The mapping
    exists only where the two GPUs have peer access, so the driver grants it; if
    it does not, nothing changes (cuda_array_interface refuses such views)."""
    cdef int home
    cdef CUmemAccessDesc desc
    if not _grant_home:
        return 0
    home = _home_device(addr)
    if home < 0 or home == k.ordinal:
        return 0
    memset(&desc, 0, sizeof(desc))
    desc.location.type = cydriver.CU_MEM_LOCATION_TYPE_DEVICE
    desc.location.id = home
    desc.flags = cydriver.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    cydriver.cuMemSetAccess(<CUdeviceptr>addr, size, &desc, 1)
    return 0


cdef int _map_new_chunk(CudaCtx* k, CuMem* m, uintptr_t base, size_t off,
                        size_t size) except -1 nogil:
    """Create a chunk of `size` bytes, map it at base + off, give the device
    access, zero it, and record it in m.  On failure nothing is left mapped.
    The kind's context is current."""
    cdef CUmemGenericAllocationHandle h
    cdef int types = 0
    cdef CUresult rc
    cdef CUdeviceptr at = <CUdeviceptr>(base + off)
    cdef bint ok = False
    _create_chunk(k, size, &h, &types)
    rc = cydriver.cuMemMap(at, size, 0, h, 0)
    if rc != CUDA_SUCCESS:
        cydriver.cuMemRelease(h)
        return check("cuMemMap", rc)
    try:
        _set_access(k, base + off, size)
        # on the kind's stream, not the legacy one: later work on non-blocking
        # streams must find the zeros there
        check("cuMemsetD8Async", cydriver.cuMemsetD8Async(at, 0, size, k.sync_stream))
        check("cuStreamSynchronize", cydriver.cuStreamSynchronize(k.sync_stream))
        ok = True
    finally:
        if not ok:
            cydriver.cuMemUnmap(at, size)
            cydriver.cuMemRelease(h)
    m.chunks[m.nchunks].h = h
    m.chunks[m.nchunks].off = off
    m.chunks[m.nchunks].size = size
    m.nchunks += 1
    m.handle_types = types
    return 0


cdef int _cu_alloc(void* kctx, size_t size, size_t reserve, gx_mem* out) except -1 nogil:
    """Library allocation: `size` bytes of device memory (rounded up to the
    granularity) mapped at the start of a reservation of `reserve` bytes
    (>= size, rounded; 0: size), zero-filled.  out.size is the rounded size."""
    cdef CudaCtx* k = <CudaCtx*>kctx
    cdef CuMem* m = NULL
    cdef CUdeviceptr base = 0
    cdef size_t rsize, rres
    cdef bint ok = False
    if k == NULL or k.closed:
        return _closed(k)
    if size == 0:
        with gil:
            raise ArgumentError("cuda_uva alloc: size must be a positive number of bytes, not 0")
    if not k.vmm:
        with gil:
            raise UnsupportedError(f"cuda_uva alloc: device {k.ordinal} does not support CUDA "
                                   "virtual memory management (cuMemCreate)")
    rsize = _round_up(size, k.gran_alloc)
    rres = _round_up(reserve if reserve > size else size, k.gran_alloc)
    if rsize < size or rres < rsize:
        with gil:
            raise ArgumentError(f"cuda_uva alloc: size {size} / reserve {reserve} overflow")
    _push(k)
    try:
        m = _new_mem(CU_MEM_VMM)
        m.gran = k.gran_alloc
        check("cuMemAddressReserve",
              cydriver.cuMemAddressReserve(&base, rres, k.gran_alloc, 0, 0))
        _map_new_chunk(k, m, <uintptr_t>base, 0, rsize)
        ok = True
    finally:
        if not ok:
            if base != 0:
                cydriver.cuMemAddressFree(base, rres)
            free(m)
        _pop(k)
    m.base = <uintptr_t>base
    out.addr = <uintptr_t>base
    out.size = rsize
    out.reserved = rres
    out.device = k.ordinal
    out.flags = GX_MEM_LIBRARY | (GX_MEM_EXPORTABLE if k.posix_fd else 0)
    out.priv = m
    if not k.posix_fd:
        m.why = CU_WHY_DEVICE
    return 0


cdef int _cu_grow(void* kctx, gx_mem* mem, size_t new_size) except -1 nogil:
    """Map one more chunk after the mapped part of a library allocation so
    that it holds new_size bytes (rounded up); the address does not move."""
    cdef CudaCtx* k = <CudaCtx*>kctx
    cdef CuMem* m = <CuMem*>mem.priv
    cdef size_t rsize
    if k == NULL or k.closed:
        return _closed(k)
    if m == NULL or m.type != CU_MEM_VMM:
        with gil:
            raise UnsupportedError("cuda_uva grow: only library allocations (alloc) grow; "
                                   "adopted, imported or released memory cannot")
    rsize = _round_up(new_size, m.gran)
    if rsize <= mem.size:
        return 0
    if rsize > mem.reserved or rsize < new_size:
        with gil:
            raise ArgumentError(f"cuda_uva grow: {new_size} bytes do not fit the {mem.reserved} "
                                f"bytes reserved at {mem.addr:#x}")
    if m.nchunks >= GX_KIND_MAX_FDS:
        with gil:
            raise ArgumentError(f"cuda_uva grow: the allocation at {mem.addr:#x} already has "
                                f"{m.nchunks} chunks, the most one export carries; "
                                "reserve more and grow in bigger steps")
    _push(k)
    try:
        _map_new_chunk(k, m, mem.addr, mem.size, rsize - mem.size)
    finally:
        _pop(k)
    mem.size = rsize
    return 0


# ---- waiting, bounded, for the context's queued work before memory is unmapped ----------
#
# cuMemUnmap does not wait for copies or kernels still queued against the range: a
# segment destroyed behind its own get_nb was unmapped under the copy, which faulted
# and lost the context (fuzz seed 3409).  cuMemFree waits (cuCtxSynchronize); so does
# a release here, but not for ever: a stream blocked in wait_until_on_stream for a
# signal that never comes (its writer died) would hold cuCtxSynchronize, and with it
# destroy() or finalize, indefinitely.  The synchronize runs on a thread of its own;
# the release waits for it at most GEXMK_TIMEOUT, and past that leaves the memory
# mapped (leaked until the process exits, with a warning) rather than fault the
# work still queued on it.

cdef extern from "<pthread.h>" nogil:
    ctypedef unsigned long pthread_t
    int pthread_create(pthread_t* th, const void* attr, void* (*start)(void*) noexcept nogil,
                       void* arg)
    int pthread_detach(pthread_t th)

cdef extern from *:
    """
    static inline int gx_cu_refs_drop(int *p) { return __atomic_sub_fetch(p, 1, __ATOMIC_ACQ_REL); }
    static inline int gx_cu_flag(int *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
    static inline void gx_cu_flag_set(int *p) { __atomic_store_n(p, 1, __ATOMIC_RELEASE); }
    """
    int gx_cu_refs_drop(int* p) nogil
    int gx_cu_flag(int* p) nogil
    void gx_cu_flag_set(int* p) nogil

from posix.time cimport clock_gettime, nanosleep, timespec, CLOCK_MONOTONIC
from gexmk.config import timeout as _config_timeout

cdef double _release_wait = 300.0
try:
    _release_wait = _config_timeout()
except Exception:                   # noqa: BLE001 - a bad GEXMK_TIMEOUT is reported by gexmk.init
    pass


cdef struct _SyncJob:
    CUcontext ctx
    int done                        # set by the thread once cuCtxSynchronize returned
    int refs                        # the caller's and the thread's: the last one frees


cdef void* _sync_main(void* arg) noexcept nogil:
    cdef _SyncJob* j = <_SyncJob*>arg
    cdef CUcontext c
    if cydriver.cuCtxPushCurrent(j.ctx) == CUDA_SUCCESS:
        cydriver.cuCtxSynchronize()     # a context already in error answers at once
        cydriver.cuCtxPopCurrent(&c)
    gx_cu_flag_set(&j.done)
    if gx_cu_refs_drop(&j.refs) == 0:
        free(j)
    return NULL


cdef inline double _mono_s() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


cdef bint _ctx_idle_within(CUcontext ctx, double secs) noexcept nogil:
    """True once every stream of ctx has run what was queued on it; False
    when work is still queued after secs."""
    cdef _SyncJob* j = <_SyncJob*>calloc(1, sizeof(_SyncJob))
    cdef pthread_t th
    cdef timespec nap
    cdef long ns = 20000
    cdef double t0
    cdef bint done
    if j == NULL:
        cydriver.cuCtxSynchronize()     # no memory for the job: as cuMemFree would
        return True
    j.ctx = ctx
    j.refs = 2
    if pthread_create(&th, NULL, _sync_main, j) != 0:
        free(j)
        cydriver.cuCtxSynchronize()     # no thread: as cuMemFree would
        return True
    pthread_detach(th)
    t0 = _mono_s()
    while not gx_cu_flag(&j.done) and _mono_s() - t0 < secs:
        nap.tv_sec = 0
        nap.tv_nsec = ns
        nanosleep(&nap, NULL)
        if ns < 1000000:
            ns *= 2
    done = gx_cu_flag(&j.done) != 0
    if gx_cu_refs_drop(&j.refs) == 0:
        free(j)
    return done


cdef CUresult _free_mem(CudaCtx* k, gx_mem* mem, const char** call,
                        bint* leaked) noexcept nogil:
    """Give back whatever mem holds, by its type (see _cu_release/_cu_unmap);
    every step is tried and the first failure returned (its call in *call).
    mem is zeroed and its priv freed whatever happens: a failed destructor
    leaks rather than leaving a dangling handle behind.  *leaked: set when
    work was still queued after GEXMK_TIMEOUT and the memory left mapped."""
    cdef CuMem* m = <CuMem*>mem.priv
    cdef CUresult rc, first = CUDA_SUCCESS
    cdef CUcontext c
    cdef bint pushed
    cdef int i
    if m == NULL:
        return CUDA_SUCCESS
    pushed = cydriver.cuCtxPushCurrent(k.ctx) == CUDA_SUCCESS
    if pushed and m.type in (CU_MEM_VMM, CU_MEM_VMM_IMPORT, CU_MEM_IPC_IMPORT) \
            and not _ctx_idle_within(k.ctx, _release_wait):
        # work still queued after GEXMK_TIMEOUT: left mapped (see above)
        leaked[0] = True
        cydriver.cuCtxPopCurrent(&c)
        free(m)
        memset(mem, 0, sizeof(gx_mem))
        mem.device = -1
        return CUDA_SUCCESS
    if m.type == CU_MEM_IPC_IMPORT:
        rc = cydriver.cuIpcCloseMemHandle(<CUdeviceptr>m.base)
        if rc != CUDA_SUCCESS:
            first, call[0] = rc, "cuIpcCloseMemHandle"
    for i in range(m.nchunks):
        if m.type == CU_MEM_VMM or m.type == CU_MEM_VMM_IMPORT:
            rc = cydriver.cuMemUnmap(<CUdeviceptr>(m.base + m.chunks[i].off), m.chunks[i].size)
            if rc != CUDA_SUCCESS and first == CUDA_SUCCESS:
                first, call[0] = rc, "cuMemUnmap"
        rc = cydriver.cuMemRelease(m.chunks[i].h)
        if rc != CUDA_SUCCESS and first == CUDA_SUCCESS:
            first, call[0] = rc, "cuMemRelease"
    if m.type == CU_MEM_VMM or m.type == CU_MEM_VMM_IMPORT:
        rc = cydriver.cuMemAddressFree(<CUdeviceptr>m.base,
                                       mem.reserved if m.type == CU_MEM_VMM else m.base_size)
        if rc != CUDA_SUCCESS and first == CUDA_SUCCESS:
            first, call[0] = rc, "cuMemAddressFree"
    if pushed:
        cydriver.cuCtxPopCurrent(&c)
    free(m)
    memset(mem, 0, sizeof(gx_mem))
    mem.device = -1
    return first


cdef int _cu_release(void* kctx, gx_mem* mem) except -1 nogil:
    """Undo alloc (unmap, release every chunk, free the reservation) or adopt
    (release retained VMM handles; cuMemAlloc memory is just forgotten); an
    import is unmapped, after the context's work has ended (as cuMemFree
    waits).  Every step is tried; the first failure is raised.
    Idempotent on a released gx_mem."""
    cdef CudaCtx* k = <CudaCtx*>kctx
    if mem.priv == NULL:
        return 0
    if k == NULL or k.closed:
        return _closed(k)
    return _give_back(k, mem)


cdef int _give_back(CudaCtx* k, gx_mem* mem) except -1 nogil:
    """_free_mem, its failure raised and a mapping it had to leave warned of."""
    cdef const char* call = NULL
    cdef bint leaked = False
    cdef CUresult rc = _free_mem(k, mem, &call, &leaked)
    if leaked:
        _warn_leak()
    if rc != CUDA_SUCCESS:
        return check(call, rc)
    return 0


cdef int _warn_leak() except -1 with gil:
    import warnings
    warnings.warn(f"cuda_uva: device memory released while work was still queued in its "
                  f"context after {_release_wait:g} s (GEXMK_TIMEOUT; a stream waiting for a "
                  "signal that does not come?) was left mapped, so that the work does not "
                  "fault: it is given back when the process exits", RuntimeWarning, stacklevel=2)
    return 0


cdef int _pointer_info(uintptr_t p, unsigned long long* memtype, unsigned long long* ordinal,
                       unsigned long long* ctx, unsigned long long* managed,
                       unsigned long long* pool, unsigned long long* ipc) except -1 nogil:
    """cuPointerGetAttributes into zeroed 8-byte words (the driver writes the
    attribute's own width; unknown pointers get zeros, not an error)."""
    cdef CUpointer_attribute attrs[6]
    cdef void* data[6]
    memtype[0] = ordinal[0] = ctx[0] = managed[0] = pool[0] = ipc[0] = 0
    attrs[0] = cydriver.CU_POINTER_ATTRIBUTE_MEMORY_TYPE; data[0] = memtype
    attrs[1] = cydriver.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL; data[1] = ordinal
    attrs[2] = cydriver.CU_POINTER_ATTRIBUTE_CONTEXT; data[2] = ctx
    attrs[3] = cydriver.CU_POINTER_ATTRIBUTE_IS_MANAGED; data[3] = managed
    attrs[4] = cydriver.CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE; data[4] = pool
    attrs[5] = cydriver.CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE; data[5] = ipc
    return check("cuPointerGetAttributes",
                 cydriver.cuPointerGetAttributes(6, attrs, data, <CUdeviceptr>p))


def pointer_attributes(ptr) -> dict:
    """What the driver says of the memory at ``ptr``, with no kind needed:
    ``{"memory": "device" | "host" | "managed" | "unknown", "device": ordinal
    or -1, "context": CUcontext as int (0 when none), "pool": bool (stream-
    ordered pool memory), "legacy_ipc": bool}``.  Host pointers the driver does
    not know are ``"unknown"``.  Raises UnsupportedError without a driver."""
    cdef uintptr_t p = _index(ptr, "ptr", 0, _UINTPTR_MAX)
    cdef unsigned long long memtype = 0, ordinal = 0, ctx = 0, managed = 0, pool = 0, ipc = 0
    cdef CUresult rc
    driver_version()                 # UnsupportedError where there is no driver
    with nogil:
        rc = cydriver.cuInit(0)
        if rc == CUDA_SUCCESS:
            _pointer_info(p, &memtype, &ordinal, &ctx, &managed, &pool, &ipc)
    check("cuInit", rc)
    if managed:
        mem = "managed"
    elif memtype == cydriver.CU_MEMORYTYPE_DEVICE:
        mem = "device"
    elif memtype == cydriver.CU_MEMORYTYPE_HOST:
        mem = "host"
    else:
        mem = "unknown"
    return {"memory": mem, "device": <int>ordinal if mem in ("device", "managed") else -1,
            "context": <uintptr_t>ctx, "pool": bool(pool), "legacy_ipc": bool(ipc)}


cdef int _mapping_range(uintptr_t p, uintptr_t* base, size_t* size) except -1 nogil:
    """The VMM mapping (one cuMemMap) that holds p: the pointer attributes
    MAPPING_BASE_ADDR/MAPPING_SIZE where the driver knows them, else
    cuMemGetAddressRange."""
    cdef CUpointer_attribute attrs[2]
    cdef void* data[2]
    cdef unsigned long long b = 0, s = 0
    cdef CUdeviceptr cb = 0
    attrs[0] = cydriver.CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR; data[0] = &b
    attrs[1] = cydriver.CU_POINTER_ATTRIBUTE_MAPPING_SIZE; data[1] = &s
    if (cydriver.cuPointerGetAttributes(2, attrs, data, <CUdeviceptr>p) == CUDA_SUCCESS
            and s != 0 and b <= p < b + s):
        base[0] = <uintptr_t>b
        size[0] = <size_t>s
        return 0
    check("cuMemGetAddressRange", cydriver.cuMemGetAddressRange(&cb, size, <CUdeviceptr>p))
    base[0] = <uintptr_t>cb
    return 0


cdef int _adopt_vmm(CudaCtx* k, CuMem* m, uintptr_t addr, size_t size,
                    CUmemGenericAllocationHandle first) except -1 nogil:
    """Walk [addr, addr + size) mapping by mapping (PyTorch's expandable
    segments span several), retaining each chunk's handle.  `first` is the
    retained handle of addr's chunk.  Chunks beyond GX_KIND_MAX_FDS are not
    kept (the range is then adopted but not exportable)."""
    cdef CUmemGenericAllocationHandle h = first
    cdef CUmemAllocationProp prop
    cdef uintptr_t p = addr, b = 0, end = addr + size
    cdef size_t s = 0
    cdef CUresult rc
    cdef bint ok
    while True:
        ok = False
        try:
            _mapping_range(p, &b, &s)
            memset(&prop, 0, sizeof(prop))
            check("cuMemGetAllocationPropertiesFromHandle",
                  cydriver.cuMemGetAllocationPropertiesFromHandle(&prop, h))
            ok = True
        finally:
            if not ok:
                cydriver.cuMemRelease(h)
        if prop.location.type != cydriver.CU_MEM_LOCATION_TYPE_DEVICE or \
                prop.location.id != k.ordinal:
            cydriver.cuMemRelease(h)
            with gil:
                raise ArgumentError(f"cuda_uva adopt: the VMM memory at {p:#x} is not on "
                                    f"device {k.ordinal}")
        if not (prop.requestedHandleTypes & cydriver.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR):
            m.why = CU_WHY_HANDLE
        if m.nchunks == 0:
            m.base = b
        if m.nchunks < GX_KIND_MAX_FDS:
            m.chunks[m.nchunks].h = h
            m.chunks[m.nchunks].off = b - m.base
            m.chunks[m.nchunks].size = s
            m.nchunks += 1
        else:
            cydriver.cuMemRelease(h)
            if m.why == CU_WHY_NONE:
                m.why = CU_WHY_CHUNKS
        p = b + s
        if p >= end:
            return 0
        rc = cydriver.cuMemRetainAllocationHandle(&h, <void*>p)
        if rc != CUDA_SUCCESS:
            with gil:
                raise ArgumentError(f"cuda_uva adopt: [{addr:#x}, {end:#x}) is not one mapped "
                                    f"range: nothing VMM-mapped at {p:#x}")


cdef int _cu_adopt(void* kctx, uintptr_t addr, size_t size, gx_mem* out) except -1 nogil:
    """Client device memory [addr, addr + size): checked to be device memory
    of this kind's device and context (not managed, not host), and classified
    by how it was allocated: VMM (exportable when its chunks allow POSIX FDs),
    cuMemAlloc (legacy IPC), or stream-ordered pool memory (not exportable)."""
    cdef CudaCtx* k = <CudaCtx*>kctx
    cdef CuMem* m = NULL
    cdef unsigned long long memtype, ordinal, ctx, managed, pool, ipc
    cdef CUmemGenericAllocationHandle h
    cdef CUdeviceptr base = 0
    cdef size_t bsize = 0
    cdef bint ok = False
    if k == NULL or k.closed:
        return _closed(k)
    if size == 0 or addr + size < addr:
        with gil:
            raise ArgumentError(f"cuda_uva adopt: nbytes must be positive and the range must "
                                f"not wrap, got ({addr:#x}, {size})")
    _pointer_info(addr, &memtype, &ordinal, &ctx, &managed, &pool, &ipc)
    if managed:
        with gil:
            raise ArgumentError(f"cuda_uva adopt: {addr:#x} is managed (unified) memory, which "
                                "the CUDA kind does not take: allocate device memory "
                                "(cuMemAlloc, cuMemCreate, or CudaKind.alloc)")
    if memtype != cydriver.CU_MEMORYTYPE_DEVICE:
        with gil:
            what = ("pinned host memory: use the host kind" if memtype == cydriver.CU_MEMORYTYPE_HOST
                    else "not memory the CUDA driver knows (a host pointer?)")
            raise ArgumentError(f"cuda_uva adopt: {addr:#x} is {what}")
    if <int>ordinal != k.ordinal:
        with gil:
            raise ArgumentError(f"cuda_uva adopt: {addr:#x} is memory of CUDA device "
                                f"{<int>ordinal}, this kind is for device {k.ordinal}")
    if ctx != 0 and <CUcontext>ctx != k.ctx:
        with gil:
            raise ArgumentError(f"cuda_uva adopt: {addr:#x} was allocated in another CUDA "
                                f"context ({ctx:#x}) than this kind's ({<uintptr_t>k.ctx:#x})")
    _push(k)
    try:
        if cydriver.cuMemRetainAllocationHandle(&h, <void*>addr) == CUDA_SUCCESS:
            m = _new_mem(CU_MEM_VMM_CLIENT)
            try:
                _adopt_vmm(k, m, addr, size, h)
                ok = True
            finally:
                if not ok:
                    _drop_handles(m)
                    free(m)
        else:
            check("cuMemGetAddressRange", cydriver.cuMemGetAddressRange(&base, &bsize,
                                                                         <CUdeviceptr>addr))
            if addr + size > <uintptr_t>base + bsize:
                with gil:
                    raise ArgumentError(
                        f"cuda_uva adopt: [{addr:#x}, {addr + size:#x}) runs past the end of "
                        f"its allocation [{<uintptr_t>base:#x}, {<uintptr_t>base + bsize:#x})")
            m = _new_mem(CU_MEM_POOL if pool else CU_MEM_LEGACY)
            m.base = <uintptr_t>base
            m.base_size = bsize
            if pool:
                m.why = CU_WHY_POOL
            elif not ipc:
                m.why = CU_WHY_IPC
    finally:
        _pop(k)
    out.addr = addr
    out.size = size
    out.reserved = size
    out.device = k.ordinal
    out.flags = GX_MEM_CLIENT | (GX_MEM_EXPORTABLE if m.why == CU_WHY_NONE else 0)
    out.priv = m
    return 0


cdef void _drop_handles(CuMem* m) noexcept nogil:
    cdef int i
    for i in range(m.nchunks):
        cydriver.cuMemRelease(m.chunks[i].h)
    m.nchunks = 0


def sync_array_stream(ptr, stream):
    """The consumer's side of the CUDA array interface (v3): wait for the
    work its producer left on ``stream`` (1: the legacy default stream, 2:
    the per-thread one, else a CUstream) before the array at ``ptr`` is read
    or written -- a CuPy array made by ``cupy.zeros`` may still be being
    zeroed, and a copy on another stream would race it.  The stream's
    context is the one the memory belongs to (made current for the call);
    memory the driver does not know is left alone."""
    cdef uintptr_t p = _index(ptr, "ptr", 0, _UINTPTR_MAX)
    cdef uintptr_t s = _index(stream, "stream", 0, _UINTPTR_MAX)
    cdef unsigned long long memtype = 0, ordinal = 0, ctx = 0, managed = 0, pool = 0, ipc = 0
    cdef CUcontext c
    cdef CUresult rc = CUDA_SUCCESS
    cdef bint pushed = False
    if s == 0:
        return
    with nogil:
        _pointer_info(p, &memtype, &ordinal, &ctx, &managed, &pool, &ipc)
        if ctx != 0:
            pushed = cydriver.cuCtxPushCurrent(<CUcontext>ctx) == CUDA_SUCCESS
        if pushed:
            rc = cydriver.cuStreamSynchronize(<CUstream>s)
            cydriver.cuCtxPopCurrent(&c)
    check("cuStreamSynchronize (the array's producer stream)", rc)
