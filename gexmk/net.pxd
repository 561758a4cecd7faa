# The interface between the core and a network transport (ofi): a table of C
# function pointers, callable without the GIL, that the transport module hands
# to the core when it is loaded.  The core never links against libfabric.
from libc.stdint cimport uintptr_t
from gexmk.lib.gx cimport gx_target, gx_val

cdef enum:
    NET_BLOCKING = 0      # complete (remotely) on return
    NET_NB = 1            # return an op handle in *op; complete it with test/wait
    NET_NBI = 2           # implicit: counted per endpoint, completed by nbi_wait
    NET_NBI_LCNOW = 3     # implicit, but the local buffer must be reusable on return

cdef enum:
    NET_CAT_GET = 0
    NET_CAT_PUT = 1
    NET_CAT_RMW = 2

ctypedef int (*net_rma_fn)(void* ep, gx_target* t, uintptr_t remote, void* local, size_t n,
                           int mode, void** op) except -1 nogil
ctypedef int (*net_atomic_fn)(void* ep, gx_target* t, uintptr_t remote, int dt, int code,
                              gx_val a, gx_val b, gx_val* result, int mode, void** op) except -1 nogil
# test: 1 (and the op is freed, its fetched value in *result) or 0 (pending); raises on failure
ctypedef int (*net_test_fn)(void* op, gx_val* result) except -1 nogil
# wait: block until complete (or the peer dies, or the timeout passes); frees the op
ctypedef int (*net_wait_fn)(void* op, gx_val* result) except -1 nogil
ctypedef void (*net_orphan_fn)(void* op) noexcept nogil
# nbi_wait: complete every implicit op of the categories (bit mask of 1 << NET_CAT_*)
ctypedef int (*net_sync_fn)(void* ep, int categories) except -1 nogil

ctypedef struct net_ops:
    net_rma_fn put
    net_rma_fn get
    net_atomic_fn atomic
    net_test_fn test
    net_wait_fn wait
    net_orphan_fn orphan
    net_sync_fn nbi_wait
