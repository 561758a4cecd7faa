# The nogil C-level RMA API for other Cython projects:
#
#     from gexmk cimport rma
#     cdef rma.gx_team* t = rma.team_handle(tm)      # with the GIL, once
#     with nogil:
#         for i in range(n):
#             rma.put(t, peer, dest + 8 * i, &x, 8)
#
# The handle stays valid until the team's client is finalized.  Every call
# returns 0 or raises (except -1): bad rank, out-of-segment address, dead peer.
from libc.stdint cimport uintptr_t
from gexmk.lib.gx cimport (gx_team, gx_val, gx_put, gx_get, gx_atomic, gx_fence, gx_quiet,
                           GX_OK)
from gexmk.core cimport Team, put_slow, get_slow, atomic_slow


cdef inline gx_team* team_handle(Team tm) except NULL:
    """C view of a team for the nogil calls below."""
    tm.check_alive()
    return &tm.c


cdef inline int put(const gx_team* tm, int rank, uintptr_t dest, const void* src, size_t n) except -1 nogil:
    """Blocking put: n bytes from src to (rank, dest); complete on return."""
    cdef int rc = gx_put(tm, rank, dest, src, n)
    if rc == GX_OK:
        return 0
    return put_slow(tm, rank, dest, src, n, rc)


cdef inline int put_nbi(const gx_team* tm, int rank, uintptr_t dest, const void* src, size_t n) except -1 nogil:
    """Implicit-event put: on mapped targets it completes at once; quiet() completes it."""
    cdef int rc = gx_put(tm, rank, dest, src, n)
    if rc == GX_OK:
        return 0
    return put_slow(tm, rank, dest, src, n, rc)


cdef inline int get(const gx_team* tm, void* dest, int rank, uintptr_t src, size_t n) except -1 nogil:
    """Blocking get: n bytes from (rank, src) into dest."""
    cdef int rc = gx_get(tm, rank, dest, src, n)
    if rc == GX_OK:
        return 0
    return get_slow(tm, rank, dest, src, n, rc)


cdef inline int atomic(const gx_team* tm, int rank, uintptr_t addr, int dt, int op,
                       gx_val a, gx_val b, gx_val* result) except -1 nogil:
    """Remote atomic (GX_DT_*, GX_OP_*); the old value goes to *result for fetching ops."""
    cdef int rc = gx_atomic(tm, rank, addr, dt, op, a, b, result)
    if rc == GX_OK:
        return 0
    return atomic_slow(tm, rank, addr, dt, op, rc)


cdef inline void fence() noexcept nogil:
    gx_fence()


cdef inline void quiet() noexcept nogil:
    gx_quiet()
