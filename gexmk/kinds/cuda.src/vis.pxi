# ---------------------------------------------------------------------------
# VIS copies (issue 22): lists of copies at once, strided shapes by 2-D/3-D copies
# ---------------------------------------------------------------------------
# Addresses are unified (UVA): host and device operands alike, as _cu_copy.

cdef int _batch_state = 0        # 0 untried, 1 cuMemcpyBatchAsync works, -1 the driver lacks it


cdef enum:
    BATCH_RUN_MIN = 8               # copies of one size at one stride per side: one 2-D copy
    BATCH_RUN_PITCH = 1 << 30       # ... whose strides stay this small (2-D pitch limits)


cdef size_t _cu_run(const uintptr_t* dst, const uintptr_t* src, const size_t* n, size_t i,
                    size_t count) noexcept nogil:
    """The end of the run from copy i: copies of n[i] bytes whose addresses rise
    by one stride per side, each stride at least n[i] (a strided view's rows,
    every other byte of a 1-byte view)."""
    cdef size_t e = i + 1, ds = 0, ss = 0
    while e < count and n[e] == n[i]:
        if dst[e] <= dst[e - 1] or src[e] <= src[e - 1]:
            break
        if e == i + 1:
            ds = dst[e] - dst[e - 1]
            ss = src[e] - src[e - 1]
            if ds < n[i] or ss < n[i] or ds > BATCH_RUN_PITCH or ss > BATCH_RUN_PITCH:
                break
        elif dst[e] - dst[e - 1] != ds or src[e] - src[e - 1] != ss:
            break
        e += 1
    return e


cdef CUresult _cu_batch(CUstream s, const uintptr_t* dst, const uintptr_t* src, const size_t* n,
                        size_t count) noexcept nogil:
    """count copies enqueued on s: cuMemcpyBatchAsync (CUDA 12.8+ drivers), else
    (or where the driver refuses the batch) a loop of cuMemcpyAsync."""
    global _batch_state
    cdef CUresult rc = CUDA_SUCCESS
    cdef cydriver.CUmemcpyAttributes attr
    cdef size_t idx = 0, i
    if _batch_state >= 0 and count > 1:
        memset(&attr, 0, sizeof(attr))
        attr.srcAccessOrder = cydriver.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
        rc = cydriver.cuMemcpyBatchAsync(<CUdeviceptr*>dst, <CUdeviceptr*>src, <size_t*>n, count,
                                         &attr, &idx, 1, s)
        if rc == CUDA_SUCCESS:
            _batch_state = 1
        elif _batch_state == 0 and (rc == cydriver.CUDA_ERROR_NOT_FOUND or
                                    rc == cydriver.CUDA_ERROR_NOT_SUPPORTED):
            _batch_state = -1          # an older driver: the loop below from now on
    if rc != CUDA_SUCCESS or _batch_state < 0 or count == 1:
        # the loop: older drivers, one copy, or a batch the driver refused (an operand
        # it will not take in stream order, e.g. pageable host memory): copies are
        # idempotent, so whatever part of the batch ran is simply done again
        rc = CUDA_SUCCESS
        for i in range(count):
            if n[i]:
                rc = cydriver.cuMemcpyAsync(<CUdeviceptr>dst[i], <CUdeviceptr>src[i], n[i], s)
                if rc != CUDA_SUCCESS:
                    break
    return rc


cdef int _cu_copy_batch(void* kctx, void* stream, const uintptr_t* dst, const uintptr_t* src,
                        const size_t* n, size_t count) except -1 nogil:
    """count copies on one stream: each run of BATCH_RUN_MIN or more copies of
    one size at one stride per side (_cu_run) as one cuMemcpy2DAsync -- the
    copy engine costs microseconds per copy whatever its size, so a 1-byte
    strided view's 4096 blocks are one copy, not 4096 -- and the others in
    one batch (_cu_batch).  stream NULL: on the kind's internal stream,
    complete on return."""
    cdef CudaCtx* k = <CudaCtx*>kctx
    cdef CUstream s = <CUstream>stream
    cdef CUresult rc = CUDA_SUCCESS
    cdef uintptr_t* rest = NULL
    cdef size_t i = 0, e, m = 0
    if k == NULL or k.closed:
        return _closed(k)
    if count == 0:
        return 0
    if s == NULL:
        s = k.sync_stream
    if count >= BATCH_RUN_MIN:
        rest = <uintptr_t*>calloc(3 * count, sizeof(uintptr_t))
        if rest == NULL:
            with gil:
                raise MemoryError("cuda copy_batch: no memory for the copy list")
    _push(k)
    try:
        if rest == NULL:
            rc = _cu_batch(s, dst, src, n, count)
        else:
            while i < count and rc == CUDA_SUCCESS:
                e = _cu_run(dst, src, n, i, count)
                if e - i >= BATCH_RUN_MIN:
                    rc = _cu_2d(s, dst[i], dst[i + 1] - dst[i], src[i], src[i + 1] - src[i],
                                n[i], e - i)
                    i = e
                    continue
                while i < e:            # too short a run: the batch takes them
                    rest[m] = dst[i]
                    rest[count + m] = src[i]
                    rest[2 * count + m] = n[i]
                    m += 1
                    i += 1
            if rc == CUDA_SUCCESS and m:
                rc = _cu_batch(s, rest, rest + count, <size_t*>(rest + 2 * count), m)
        if rc == CUDA_SUCCESS and stream == NULL:
            rc = cydriver.cuStreamSynchronize(s)
    finally:
        _pop(k)
        free(rest)
    return check("cuMemcpyAsync/cuMemcpy2DAsync/cuMemcpyBatchAsync", rc)


# copy_gather: lists of small device copies by the gather kernel (atomics.pxi's
# gx_copy_list).  The copy engine takes a few microseconds per copy whatever its size
# (1024 x 16 KiB: ~4 GB/s, batched or not); one launch reading a list moves them at
# memory or NVLink speed.  Descriptors go into one of four slots of pinned host memory,
# are copied (one DMA, on the same stream) into the slot's twin in device memory, which
# the kernel reads (thousands of blocks each reading host memory over PCIe took ~30 us);
# a slot is refilled once the launch that read it is done (its event).
cdef enum:
    GATHER_SLOTS = 4
    GATHER_ENTRIES = 2048            # descriptors a slot (48 KiB) and a launch
    GATHER_PIECE = 65536             # longer copies are cut into pieces of this size
    GATHER_BLOCKS = 1024
    GATHER_MAX_MEAN = 1 << 20        # lists of larger copies (on average) go to the copy engine

# GEXMK_CUDA_GATHER=0: lists always go to the copy engine (copy_batch);
# GEXMK_CUDA_GATHER_THREADS: threads a block (a multiple of 32, 32..1024; default 256)
cdef bint _gather_on = os.environ.get("GEXMK_CUDA_GATHER", "1") != "0"
cdef unsigned int _gather_threads = env_int("GEXMK_CUDA_GATHER_THREADS", 256, 32, 1024) // 32 * 32


cdef int _gather_ring(CudaCtx* k) except -1 nogil:
    """The descriptor slots and their events, made once; k.lock is held and the
    kind's context is current."""
    cdef void* mem = NULL
    cdef int i
    if k.ring != NULL:
        return 0
    if k.ring_dev == 0:
        check("cuMemAlloc", cydriver.cuMemAlloc(&k.ring_dev, GATHER_SLOTS * GATHER_ENTRIES * 24))
    for i in range(GATHER_SLOTS):
        if k.ring_ev[i] == NULL:
            check("cuEventCreate", cydriver.cuEventCreate(&k.ring_ev[i],
                                                          cydriver.CU_EVENT_DISABLE_TIMING))
    check("cuMemHostAlloc", cydriver.cuMemHostAlloc(&mem, GATHER_SLOTS * GATHER_ENTRIES * 24,
                                                    cydriver.CU_MEMHOSTALLOC_PORTABLE))
    k.ring = <uint64_t*>mem
    k.ring_next = 0
    return 0


cdef int _cu_copy_gather(void* kctx, void* stream, const uintptr_t* dst, const uintptr_t* src,
                         const size_t* n, size_t count) except -1 nogil:
    """copy_batch's contract, for operands that are all device memory this kind's
    device reaches (its own, or mapped for it: the caller knows).  Lists of small
    copies go to the gather kernel, one launch per 2048 pieces of at most 64 KiB;
    lists of large copies, single copies, a stream being captured into a graph (the
    slots are reused, a graph would replay stale descriptors) and GEXMK_CUDA_GATHER=0
    go to copy_batch.  stream NULL: on the kind's internal stream, complete on return."""
    cdef CudaCtx* k = <CudaCtx*>kctx
    cdef CUstream s = <CUstream>stream
    cdef size_t i = 0, off = 0, total = 0, piece, m
    cdef uint64_t* d
    cdef uint64_t dptr
    cdef uint32_t m32
    cdef void* params[2]
    cdef int slot
    if k == NULL or k.closed:
        return _closed(k)
    for i in range(count):
        total += n[i]
    if (not _gather_on or count < 2 or total == 0 or total // count > GATHER_MAX_MEAN
            or (stream != NULL and _cu_stream_capturing(kctx, stream))):
        return _cu_copy_batch(kctx, stream, dst, src, n, count)
    if s == NULL:
        s = k.sync_stream
    params[0] = &dptr
    params[1] = &m32
    i = 0
    _push(k)
    try:
        k.lock.lock()
        try:
            _atomics_load(k)
            _gather_ring(k)
            while i < count:
                slot = k.ring_next
                k.ring_next = (slot + 1) % GATHER_SLOTS
                check("cuEventSynchronize", cydriver.cuEventSynchronize(k.ring_ev[slot]))
                d = k.ring + <size_t>slot * GATHER_ENTRIES * 3
                m = 0
                while i < count and m < GATHER_ENTRIES:
                    piece = n[i] - off
                    if piece > GATHER_PIECE:
                        piece = GATHER_PIECE
                    if piece:
                        d[3 * m] = dst[i] + off
                        d[3 * m + 1] = src[i] + off
                        d[3 * m + 2] = piece
                        m += 1
                    off += piece
                    if off >= n[i]:
                        i += 1
                        off = 0
                if m == 0:
                    break
                dptr = <uint64_t>k.ring_dev + <uint64_t>slot * GATHER_ENTRIES * 24
                m32 = <uint32_t>m
                check("cuMemcpyHtoDAsync", cydriver.cuMemcpyHtoDAsync(<CUdeviceptr>dptr, d,
                                                                      m * 24, s))
                check("cuLaunchKernel", cydriver.cuLaunchKernel(
                    k.list_fn, <unsigned int>(m if m < GATHER_BLOCKS else GATHER_BLOCKS), 1, 1,
                    _gather_threads, 1, 1, 0, s, params, NULL))
                check("cuEventRecord", cydriver.cuEventRecord(k.ring_ev[slot], s))
                k.gather_launches += 1
        finally:
            k.lock.unlock()
        if stream == NULL:
            check("cuStreamSynchronize", cydriver.cuStreamSynchronize(s))
    finally:
        _pop(k)
    return 0


cdef CUresult _cu_2d(CUstream s, uintptr_t dst, size_t dpitch, uintptr_t src, size_t spitch,
                     size_t width, size_t height) noexcept nogil:
    cdef cydriver.CUDA_MEMCPY2D c
    memset(&c, 0, sizeof(c))
    c.srcMemoryType = cydriver.CU_MEMORYTYPE_UNIFIED
    c.srcDevice = <CUdeviceptr>src
    c.srcPitch = spitch
    c.dstMemoryType = cydriver.CU_MEMORYTYPE_UNIFIED
    c.dstDevice = <CUdeviceptr>dst
    c.dstPitch = dpitch
    c.WidthInBytes = width
    c.Height = height
    return cydriver.cuMemcpy2DAsync(&c, s)


cdef CUresult _cu_3d(CUstream s, uintptr_t dst, size_t dpitch, size_t dheight, uintptr_t src,
                     size_t spitch, size_t sheight, size_t width, size_t height,
                     size_t depth) noexcept nogil:
    cdef cydriver.CUDA_MEMCPY3D c
    memset(&c, 0, sizeof(c))
    c.srcMemoryType = cydriver.CU_MEMORYTYPE_UNIFIED
    c.srcDevice = <CUdeviceptr>src
    c.srcPitch = spitch
    c.srcHeight = sheight
    c.dstMemoryType = cydriver.CU_MEMORYTYPE_UNIFIED
    c.dstDevice = <CUdeviceptr>dst
    c.dstPitch = dpitch
    c.dstHeight = dheight
    c.WidthInBytes = width
    c.Height = height
    c.Depth = depth
    return cydriver.cuMemcpy3DAsync(&c, s)


cdef int _cu_copy_strided(void* kctx, void* stream, uintptr_t dst, const ptrdiff_t* dstrides,
                          uintptr_t src, const ptrdiff_t* sstrides, size_t elem,
                          const size_t* count, int ndim) except -1 nogil:
    """A strided shape: elements of elem contiguous bytes, count[k] along
    dimension k (0 fastest) at positive byte strides.  Dimensions 0 and 1 go
    as one cuMemcpy3DAsync where each side's stride 1 is a whole number of its
    stride 0 (a pitched volume), else dimension 0 as one cuMemcpy2DAsync per
    row of dimension 1; the outer dimensions loop.  One stream; stream NULL:
    complete on return."""
    cdef CudaCtx* k = <CudaCtx*>kctx
    cdef CUstream s = <CUstream>stream
    cdef CUresult rc = CUDA_SUCCESS
    cdef size_t idx[8]
    cdef size_t c1, j, outer = 1
    cdef ptrdiff_t doff = 0, soff = 0
    cdef bint vol
    cdef int d
    if k == NULL or k.closed:
        return _closed(k)
    if ndim < 1 or ndim > 8 or elem == 0:
        with gil:
            raise ArgumentError(f"copy_strided: 1..8 dimensions and a positive element size, "
                                f"got {ndim} and {elem}")
    for d in range(ndim):
        if dstrides[d] <= 0 or sstrides[d] <= 0 or (d == 0 and (<size_t>dstrides[0] < elem or
                                                                <size_t>sstrides[0] < elem)):
            with gil:
                raise ArgumentError("copy_strided: strides must be positive, and those of "
                                    "dimension 0 at least the element size")
        idx[d] = 0
        if d >= 2:
            outer *= count[d]
    if s == NULL:
        s = k.sync_stream
    c1 = count[1] if ndim > 1 else 1
    vol = ndim > 1 and dstrides[1] % dstrides[0] == 0 and sstrides[1] % sstrides[0] == 0
    _push(k)
    for j in range(outer):
        if vol:
            rc = _cu_3d(s, dst + <uintptr_t>doff, <size_t>dstrides[0],
                        <size_t>(dstrides[1] // dstrides[0]), src + <uintptr_t>soff,
                        <size_t>sstrides[0], <size_t>(sstrides[1] // sstrides[0]), elem,
                        count[0], c1)
        else:
            for d in range(<int>c1):
                rc = _cu_2d(s, dst + <uintptr_t>(doff + d * (dstrides[1] if ndim > 1 else 0)),
                            <size_t>dstrides[0],
                            src + <uintptr_t>(soff + d * (sstrides[1] if ndim > 1 else 0)),
                            <size_t>sstrides[0], elem, count[0])
                if rc != CUDA_SUCCESS:
                    break
        if rc != CUDA_SUCCESS:
            break
        for d in range(2, ndim):              # odometer over the outer dimensions
            doff += dstrides[d]
            soff += sstrides[d]
            idx[d] += 1
            if idx[d] < count[d]:
                break
            doff -= <ptrdiff_t>count[d] * dstrides[d]
            soff -= <ptrdiff_t>count[d] * sstrides[d]
            idx[d] = 0
    if rc == CUDA_SUCCESS and stream == NULL:
        rc = cydriver.cuStreamSynchronize(s)
    _pop(k)
    return check("cuMemcpy3DAsync" if vol else "cuMemcpy2DAsync", rc)
