# ---------------------------------------------------------------------------
# Sharing with a peer process on this node: export / import_ / unmap
# ---------------------------------------------------------------------------
# The export blob (gx_export.blob), version 1, native byte order (both ends
# run on one node):
#
#   offset size  field
#        0    4  magic    b"GXCU"
#        4    1  version  1
#        5    1  type     1 = VMM chunks, one POSIX FD each in gx_export.fds
#                         2 = legacy IPC (cuIpcGetMemHandle of a cuMemAlloc base)
#        6    2  nchunks  VMM: number of chunks (== nfds); legacy: 0
#        8    4  device   the exporter's device ordinal (informative)
#       12    4  (zero)
#       16    8  size     bytes of the exported range
#       24    8  offset   first byte of the range - first byte of the mapping
#                         (VMM: of the first chunk; legacy: of the allocation)
#       32    8  gran     VMM: granularity the chunks were made with; legacy: 0
#       40    8  extent   VMM: total bytes of the chunks; legacy: allocation size
#       48       VMM: nchunks x 8-byte chunk sizes; chunk i maps at the sum of
#                the sizes before it (the chunks are contiguous in the exporter)
#                legacy: the 64-byte CUipcMemHandle
#
# At most 48 + 16 * 8 = 176 bytes <= GX_KIND_BLOB.
cdef struct CuBlobHeader:
    char magic[4]
    uint8_t version
    uint8_t type
    uint16_t nchunks
    int32_t device
    uint32_t zero
    uint64_t size
    uint64_t offset
    uint64_t gran
    uint64_t extent

cdef enum:
    CU_BLOB_VERSION = 1
    CU_BLOB_VMM = 1
    CU_BLOB_LEGACY = 2
    CU_BLOB_HEADER = 48


cdef int _close_fds(int* fds, int n) noexcept nogil:
    cdef int i
    for i in range(n):
        if fds[i] >= 0:
            close(fds[i])
            fds[i] = -1
    return 0


cdef int _cu_export(void* kctx, const gx_mem* mem, gx_export* out) except -1 nogil:
    """What a peer on this node needs to map `mem`: one POSIX FD per VMM
    chunk (the caller closes them once sent) or a legacy IPC handle, and the
    blob above.  Refused for pool memory, imports and handle-less chunks."""
    cdef CudaCtx* k = <CudaCtx*>kctx
    cdef CuMem* m = <CuMem*>mem.priv
    cdef CuBlobHeader hdr
    cdef CUipcMemHandle ipc
    cdef uint64_t csize
    cdef CUresult rc
    cdef int i, fd
    if k == NULL or k.closed:
        return _closed(k)
    if m == NULL:
        with gil:
            raise StateError("cuda_uva export: the memory was released")
    if m.type == CU_MEM_VMM_IMPORT or m.type == CU_MEM_IPC_IMPORT:
        with gil:
            raise UnsupportedError("cuda_uva export: an imported mapping is not re-exported; "
                                   "export the owner's allocation")
    if m.why != CU_WHY_NONE:
        with gil:
            raise UnsupportedError("cuda_uva export: " + {
                CU_WHY_POOL: "stream-ordered pool memory (cuMemAllocAsync / a memory pool) has "
                             "no legacy IPC handle and no VMM handle; a staged path (copies "
                             "through an exportable buffer) is needed",
                CU_WHY_HANDLE: "the VMM allocation was created without "
                               "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR",
                CU_WHY_CHUNKS: f"the range spans more than {GX_KIND_MAX_FDS} VMM chunks",
                CU_WHY_IPC: "the driver reports the allocation is not legacy-IPC capable",
                CU_WHY_DEVICE: f"device {k.ordinal} has no POSIX-FD handles",
            }.get(m.why, "not exportable"))
    memset(out, 0, sizeof(gx_export))
    memset(&hdr, 0, sizeof(hdr))
    memcpy(hdr.magic, b"GXCU", 4)
    hdr.version = CU_BLOB_VERSION
    hdr.device = k.ordinal
    hdr.size = mem.size
    hdr.offset = mem.addr - m.base
    _push(k)
    try:
        if m.type == CU_MEM_VMM or m.type == CU_MEM_VMM_CLIENT:
            hdr.type = CU_BLOB_VMM
            hdr.nchunks = <uint16_t>m.nchunks
            hdr.gran = m.gran
            for i in range(m.nchunks):
                fd = -1
                rc = cydriver.cuMemExportToShareableHandle(
                    &fd, m.chunks[i].h, cydriver.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)
                if rc != CUDA_SUCCESS:
                    _close_fds(out.fds, out.nfds)
                    out.nfds = 0
                    check("cuMemExportToShareableHandle", rc)
                out.fds[i] = fd
                out.nfds = i + 1
                csize = m.chunks[i].size
                memcpy(&out.blob[CU_BLOB_HEADER + 8 * i], &csize, 8)
                hdr.extent += csize
            out.nblob = CU_BLOB_HEADER + 8 * m.nchunks
        else:
            hdr.type = CU_BLOB_LEGACY
            hdr.extent = m.base_size
            check("cuIpcGetMemHandle", cydriver.cuIpcGetMemHandle(&ipc, <CUdeviceptr>m.base))
            memcpy(&out.blob[CU_BLOB_HEADER], &ipc, sizeof(CUipcMemHandle))
            out.nblob = CU_BLOB_HEADER + sizeof(CUipcMemHandle)
    finally:
        _pop(k)
    memcpy(out.blob, &hdr, CU_BLOB_HEADER)
    return 0


cdef int _cu_import(void* kctx, gx_export* e, size_t size, gx_mem* out) except -1 nogil:
    """Map a peer's export here, accessible to this kind's device only.
    Consumes e's FDs: each is closed once imported, all of them on failure
    (set to -1).  `size`: bytes of the range to map (0: all it exports).
    out.addr is the local address of the exported range's first byte."""
    cdef CudaCtx* k = <CudaCtx*>kctx
    cdef CuBlobHeader hdr
    cdef CuMem* m = NULL
    cdef CUipcMemHandle ipc
    cdef CUdeviceptr base = 0
    cdef uint64_t csize
    cdef size_t total = 0, rres = 0, g
    cdef int i, n, mapped = 0
    cdef bint ok = False
    if k == NULL or k.closed:
        _close_fds(e.fds, e.nfds)
        return _closed(k)
    memset(&hdr, 0, sizeof(hdr))
    if e.nblob >= CU_BLOB_HEADER:
        memcpy(&hdr, e.blob, CU_BLOB_HEADER)
    n = hdr.nchunks
    if (e.nblob < CU_BLOB_HEADER or memcmp(hdr.magic, b"GXCU", 4) != 0
            or hdr.version != CU_BLOB_VERSION
            or (hdr.type == CU_BLOB_VMM and (n < 1 or n > GX_KIND_MAX_FDS or e.nfds != n
                                            or e.nblob < <size_t>(CU_BLOB_HEADER + 8 * n)))
            or (hdr.type == CU_BLOB_LEGACY and (e.nfds != 0 or e.nblob < CU_BLOB_HEADER + 64))
            or (hdr.type != CU_BLOB_VMM and hdr.type != CU_BLOB_LEGACY)
            or hdr.offset + hdr.size > hdr.extent):
        _close_fds(e.fds, e.nfds)
        with gil:
            raise ArgumentError("cuda_uva import: not a CUDA kind export (version 1) or its FDs "
                                "do not match it")
    if hdr.type == CU_BLOB_VMM and not k.vmm:
        _close_fds(e.fds, e.nfds)
        with gil:
            raise UnsupportedError(f"cuda_uva import: device {k.ordinal} does not support CUDA "
                                   "virtual memory management, needed to map VMM exports")
    if size == 0:
        size = hdr.size
    if size > hdr.size:
        _close_fds(e.fds, e.nfds)
        with gil:
            raise ArgumentError(f"cuda_uva import: {size} bytes asked, the export holds "
                                f"{hdr.size}")
    _push(k)
    try:
        if hdr.type == CU_BLOB_VMM:
            m = _new_mem(CU_MEM_VMM_IMPORT)
            try:
                for i in range(n):
                    memcpy(&csize, &e.blob[CU_BLOB_HEADER + 8 * i], 8)
                    check("cuMemImportFromShareableHandle", cydriver.cuMemImportFromShareableHandle(
                        &m.chunks[i].h, <void*><uintptr_t>e.fds[i],
                        cydriver.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
                    close(e.fds[i])
                    e.fds[i] = -1
                    m.chunks[i].off = total
                    m.chunks[i].size = csize
                    m.nchunks = i + 1
                    total += csize
                g = hdr.gran if hdr.gran > k.gran else k.gran
                rres = _round_up(total, g)
                check("cuMemAddressReserve", cydriver.cuMemAddressReserve(&base, rres, g, 0, 0))
                m.base = <uintptr_t>base
                m.base_size = rres
                for i in range(n):
                    check("cuMemMap", cydriver.cuMemMap(base + m.chunks[i].off, m.chunks[i].size,
                                                        0, m.chunks[i].h, 0))
                    mapped = i + 1
                _set_access(k, <uintptr_t>base, total)
                _grant_home_device(k, <uintptr_t>base, total)
                ok = True
            finally:
                if not ok:
                    _close_fds(e.fds, e.nfds)
                    for i in range(mapped):
                        cydriver.cuMemUnmap(base + m.chunks[i].off, m.chunks[i].size)
                    if base != 0:
                        cydriver.cuMemAddressFree(base, rres)
                    _drop_handles(m)
                    free(m)
            out.reserved = rres - hdr.offset
        else:
            memcpy(&ipc, &e.blob[CU_BLOB_HEADER], sizeof(CUipcMemHandle))
            check("cuIpcOpenMemHandle", cydriver.cuIpcOpenMemHandle(
                &base, ipc, cydriver.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS))
            m = _new_mem(CU_MEM_IPC_IMPORT)
            m.base = <uintptr_t>base
            m.base_size = hdr.extent
            out.reserved = size
    finally:
        _pop(k)
    out.addr = m.base + hdr.offset
    out.size = size
    out.device = k.ordinal
    out.flags = GX_MEM_IMPORTED
    out.priv = m
    return 0


cdef int _cu_unmap(void* kctx, gx_mem* mem) except -1 nogil:
    """Undo import_: unmap and release the imported chunks and free the
    reservation, or close the legacy IPC mapping.  Every step is tried; the
    first failure is raised.  Idempotent on an unmapped gx_mem."""
    cdef CudaCtx* k = <CudaCtx*>kctx
    cdef CuMem* m = <CuMem*>mem.priv
    if m == NULL:
        return 0
    if m.type != CU_MEM_VMM_IMPORT and m.type != CU_MEM_IPC_IMPORT:
        with gil:
            raise ArgumentError("cuda_uva unmap: undoes import_ only; release() frees "
                                "allocations and adopted memory")
    if k == NULL or k.closed:
        return _closed(k)
    return _give_back(k, mem)
