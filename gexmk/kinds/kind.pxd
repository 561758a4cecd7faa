# The memory-kind plug-in interface (DESIGN.md layer 2/3): what a memory kind
# hands the core and the transports.  Declarations only.
#
# A kind is an extension module that fills one `gx_kind_ops` table (every slot:
# a kind that cannot do something raises UnsupportedError naming itself and
# the operation, as libfabric's fi_no_* stubs do) and hands it out as a
# PyCapsule named b"gexmk.kind_ops", beside a per-kind context pointer
# (`kctx`: e.g. the CUDA device and context the kind was created for).
# Every function runs without the GIL and raises (except -1) on failure.
# Addresses cross this interface as uintptr_t / void*: no foreign library's
# type appears here.
from libc.stddef cimport ptrdiff_t
from libc.stdint cimport uintptr_t, uint64_t
from gexmk.lib.gx cimport gx_val

cdef enum:
    GX_KIND_MAX_FDS = 16          # file descriptors one export may carry
    GX_KIND_BLOB = 256            # bytes of opaque export data

# gx_mem.flags
cdef enum:
    GX_MEM_LIBRARY = 1            # allocated by the kind (alloc), released by release
    GX_MEM_CLIENT = 2             # adopted client memory: release forgets, never frees
    GX_MEM_IMPORTED = 4           # a peer's allocation mapped here (import_), undone by unmap
    GX_MEM_EXPORTABLE = 8         # export works (VMM with a shareable handle, legacy IPC, memfd)
    GX_MEM_HOST_REGISTERED = 16   # host memory pinned with the kind's driver

cdef struct gx_mem:               # one allocation, adopted range or import
    uintptr_t addr                # first byte (a device address for device kinds)
    size_t size                   # usable bytes
    size_t reserved               # address space reserved from addr (>= size: grow stays in place)
    int device                    # device ordinal; -1 for host memory
    int flags                     # GX_MEM_*
    void* priv                    # the kind's own state; freed by release / unmap

cdef struct gx_export:            # what a peer on this node needs to import an allocation
    int nfds
    int fds[GX_KIND_MAX_FDS]      # to pass with SCM_RIGHTS; the caller closes them once sent
    size_t nblob
    unsigned char blob[GX_KIND_BLOB]

ctypedef int (*gx_mk_alloc_fn)(void* kctx, size_t size, size_t reserve, gx_mem* out) except -1 nogil
ctypedef int (*gx_mk_grow_fn)(void* kctx, gx_mem* m, size_t new_size) except -1 nogil
ctypedef int (*gx_mk_release_fn)(void* kctx, gx_mem* m) except -1 nogil
ctypedef int (*gx_mk_adopt_fn)(void* kctx, uintptr_t addr, size_t size, gx_mem* out) except -1 nogil
ctypedef int (*gx_mk_export_fn)(void* kctx, const gx_mem* m, gx_export* out) except -1 nogil
ctypedef int (*gx_mk_import_fn)(void* kctx, gx_export* e, size_t size, gx_mem* out) except -1 nogil
ctypedef int (*gx_mk_unmap_fn)(void* kctx, gx_mem* m) except -1 nogil
ctypedef int (*gx_mk_copy_fn)(void* kctx, void* stream, uintptr_t dst, uintptr_t src, size_t n) except -1 nogil
ctypedef int (*gx_mk_register_fn)(void* kctx, void* p, size_t n, int on) except -1 nogil
ctypedef int (*gx_mk_classify_fn)(void* kctx, uintptr_t p, int* cls, int* device) except -1 nogil
ctypedef int (*gx_mk_stream_fn)(void* kctx, void** stream) except -1 nogil
ctypedef int (*gx_mk_handle_fn)(void* kctx, void* h) except -1 nogil
ctypedef int (*gx_mk_record_fn)(void* kctx, void* stream, void** event) except -1 nogil
ctypedef int (*gx_mk_query_fn)(void* kctx, void* event) except -1 nogil
ctypedef int (*gx_mk_atomic_fn)(void* kctx, void* stream, uintptr_t addr, int dt, int op,
                                gx_val a, gx_val b, void* result) except -1 nogil
ctypedef int (*gx_mk_wait_fn)(void* kctx, void* stream, void* event) except -1 nogil
ctypedef int (*gx_mk_pinned_fn)(void* kctx, const void* p, size_t n) except -1 nogil
ctypedef int (*gx_mk_write_fn)(void* kctx, void* stream, uintptr_t dst, uint64_t value,
                               int nbytes) except -1 nogil
ctypedef int (*gx_mk_waitv_fn)(void* kctx, void* stream, uintptr_t addr, uint64_t value,
                               int cmp) except -1 nogil
ctypedef int (*gx_mk_copyv_fn)(void* kctx, void* stream, const uintptr_t* dst,
                               const uintptr_t* src, const size_t* n, size_t count) except -1 nogil
ctypedef int (*gx_mk_copys_fn)(void* kctx, void* stream, uintptr_t dst, const ptrdiff_t* dstrides,
                               uintptr_t src, const ptrdiff_t* sstrides, size_t elem,
                               const size_t* count, int ndim) except -1 nogil
ctypedef void (*gx_host_fn)(void* arg) noexcept nogil
ctypedef int (*gx_mk_hostfn_fn)(void* kctx, void* stream, gx_host_fn fn, void* arg) except -1 nogil

cdef enum:                        # gx_kind_ops.wait_value comparisons
    GX_WAITV_GEQ = 0              # (int64_t)(*addr - value) >= 0
    GX_WAITV_EQ = 1
    GX_WAITV_AND = 2              # (*addr & value) != 0
    GX_WAITV_NOR = 3              # ~(*addr | value) != 0

cdef struct gx_kind_ops:
    const char* name              # "host", "cuda_uva", ...
    int cls                       # GX_MK_* class
    gx_mk_alloc_fn alloc          # library allocation of size bytes, reserve >= size of address space
    gx_mk_grow_fn grow            # map more of the reserved range; addr does not move
    gx_mk_release_fn release      # undo alloc / adopt
    gx_mk_adopt_fn adopt          # client memory: check it is this kind's (device, context, type)
    gx_mk_export_fn export        # shareable handle(s) for a peer process on this node
    gx_mk_import_fn import_       # map a peer's export here, access for this kind's device only
    gx_mk_unmap_fn unmap          # undo import_
    gx_mk_copy_fn copy            # dst <- src, n bytes, any mix of this kind and host; stream NULL: synchronous
    gx_mk_register_fn host_register   # pin (on=1) / unpin (on=0) host memory for this kind's copies
    gx_mk_classify_fn classify    # which class/device a pointer belongs to (GX_MK_HOST when unknown)
    gx_mk_stream_fn stream_create     # a stream the caller owns (non-blocking w.r.t. the legacy stream)
    gx_mk_handle_fn stream_destroy
    gx_mk_record_fn event_record      # an event recorded on stream (completion tracking)
    gx_mk_query_fn event_query        # 1 complete, 0 pending; raises on failure
    gx_mk_handle_fn event_sync        # block until the event completes
    gx_mk_handle_fn event_destroy
    # Optional slots (NULL: the kind has none; users fall back or refuse):
    gx_mk_atomic_fn atomic        # GX_OP_* of GX_DT_* on the aligned object at device addr; stream
                                  # NULL: complete on return, old value to *result (gx_val*)
    gx_mk_pinned_fn host_pinned   # 1 when [p, p + n) is page-locked host memory the copy engine
                                  # reaches directly, 0 when pageable (copies then go through a driver bounce)
    gx_mk_write_fn write_value    # store nbytes (4 or 8) of value at aligned device dst from the
                                  # stream's front end (no copy); stream NULL: complete on return
    gx_mk_copy_fn copy_small      # dst <- src, n <= 64 bytes, both device memory, by a kernel
                                  # instead of the copy engine; stream NULL: complete on return
    gx_mk_wait_fn stream_wait     # work issued on stream after this waits for the event, which
                                  # may come from another context or device (no host wait)
    gx_mk_query_fn stream_capturing   # 1 while the stream (passed as the event argument) is
                                      # being captured into a graph, else 0
    gx_mk_waitv_fn wait_value     # work issued on stream after this waits until the aligned
                                  # 64-bit device word at addr compares (GX_WAITV_*) with value
    gx_mk_hostfn_fn launch_host   # fn(arg) on a driver thread once the stream's work before it
                                  # is done; later work waits for it (fn must not call the driver)
    gx_mk_copyv_fn copy_batch     # count copies dst[i] <- src[i], n[i] bytes, at once (VIS vector and
                                  # indexed lists); stream NULL: complete on return
    gx_mk_copyv_fn copy_gather    # as copy_batch, every operand device memory this kind's device reaches
                                  # (its own, or mapped for it): by a gather kernel where the lists are
                                  # of small copies, else as copy_batch; stream NULL: complete on return
    gx_mk_copys_fn copy_strided   # a strided shape (dimension 0 fastest, positive byte strides,
                                  # contiguous elements of elem bytes, ndim <= 8) by 2-D/3-D copies;
                                  # stream NULL: complete on return
