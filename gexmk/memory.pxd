# Memory layer: kinds, segments, buffer intake.
from cpython.buffer cimport Py_buffer

cdef class MemoryKind:
    cdef readonly int cls          # GX_MK_* class
    cdef readonly int device       # device ordinal (-1 for host)
    cdef readonly object impl      # the kind module's object (gexmk.kinds.cuda.CudaKind), or None

cdef class Segment:
    cdef char* addr                # first byte
    cdef size_t size               # bytes usable
    cdef size_t maplen             # bytes mapped (library-allocated: size rounded to pages, + the wake page)
    cdef int fd                    # memfd behind a library-allocated host segment, else -1
    cdef readonly str token        # the memfd's name, checked by peers before they map it
    cdef readonly MemoryKind kind
    cdef readonly bint library_allocated
    cdef readonly object client    # strong reference to the owning Client
    cdef Py_buffer held            # client-allocated: the buffer held until destroy
    cdef bint has_view
    cdef readonly object allocation   # device memory: the kind's Allocation (library or adopted)
    cdef object owner              # a client-allocated device array, kept alive
    cdef int exports               # live buffer-protocol exports (numpy views)
    cdef bint destroyed
    cdef bint keep_address         # freeing leaves the address range reserved (peers may still aim at it)
    cdef bint reserved             # addr..addr+maplen is a PROT_NONE reservation, unmapped at the end
    cdef object __weakref__
    cdef int check_alive(self) except -1
    cdef void _free(self) noexcept

cdef int host_buffer(object obj, Py_buffer* view, bint writable, const char* what) except -1
