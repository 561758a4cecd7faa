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
from libc.stddef cimport ptrdiff_t
from libc.stdint cimport uintptr_t, uint64_t
from gexmk.lib.gx cimport (gx_vis, gx_frag, GX_VIS_MAXDIM, GX_NBI, GX_NBI_LCNOW as _LCNOW)
from gexmk.lib.gx cimport (gx_team, gx_val, gx_put, gx_get, gx_atomic,
                           gx_put_signal, gx_signal_op, gx_own_word, gx_cmp_local,
                           GX_SIGNAL_SET, GX_SIGNAL_ADD, GX_BLOCKING, GX_NBI_LCNOW,
                           GX_CMP_EQ, GX_CMP_NE, GX_CMP_GT, GX_CMP_GE, GX_CMP_LT, GX_CMP_LE,
                           GX_WAIT_ALL, GX_WAIT_ANY, GX_WAIT_SOME,
                           GX_OK, GX_CAT_ALL, GX_CAT_PUT, GX_CAT_RMW,
                           GX_DT_I32, GX_DT_U32, GX_DT_I64, GX_DT_U64, GX_DT_FLT, GX_DT_DBL,
                           GX_OP_SET, GX_OP_GET, GX_OP_SWAP, GX_OP_CAS, GX_OP_FCAS,
                           GX_OP_ADD, GX_OP_FADD, GX_OP_SUB, GX_OP_FSUB,
                           GX_OP_INC, GX_OP_FINC, GX_OP_DEC, GX_OP_FDEC,
                           GX_OP_AND, GX_OP_FAND, GX_OP_OR, GX_OP_FOR, GX_OP_XOR, GX_OP_FXOR,
                           GX_OP_MIN, GX_OP_FMIN, GX_OP_MAX, GX_OP_FMAX)
from gexmk.core cimport (Team, put_slow, get_slow, atomic_slow, rma_nbi_slow, nbi_sync,
                         put_signal_slow, signal_op_slow, wait_words, wait_until_word,
                         wait_progress, vis_c)


cdef inline gx_team* team_handle(Team tm) except NULL:
    """C view of a team for the nogil calls below.  Valid while the team and
    its client live; destroying a segment or finalizing while another thread
    is inside a nogil loop on the handle is the caller's race to avoid."""
    if tm is None:
        raise TypeError("team_handle() needs a gexmk Team, got None")
    tm.check_alive()
    return &tm.c


cdef inline int put(const gx_team* tm, int rank, uintptr_t dest, const void* src, size_t n) except -1 nogil:
    """Blocking put: n bytes from src to (rank, dest); complete on return."""
    cdef int rc = gx_put(tm, rank, dest, src, n)
    if rc == GX_OK:
        return 0
    return put_slow(tm, rank, dest, src, n, rc)


cdef inline int put_nbi(const gx_team* tm, int rank, uintptr_t dest, const void* src, size_t n) except -1 nogil:
    """Implicit-event put: src is reusable on return; complete after nbi_wait(tm).
    On mapped targets it is complete at once."""
    cdef int rc = gx_put(tm, rank, dest, src, n)
    if rc == GX_OK:
        return 0
    return rma_nbi_slow(tm, rank, True, dest, <void*>src, n, rc)


cdef inline int get_nbi(const gx_team* tm, void* dest, int rank, uintptr_t src, size_t n) except -1 nogil:
    """Implicit-event get: dest holds the data after nbi_wait(tm)."""
    cdef int rc = gx_get(tm, rank, dest, src, n)
    if rc == GX_OK:
        return 0
    return rma_nbi_slow(tm, rank, False, src, dest, n, rc)


cdef inline int nbi_wait(const gx_team* tm) except -1 nogil:
    """Complete every implicit put/get/atomic issued through tm's endpoint."""
    return nbi_sync(tm, GX_CAT_ALL)


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
    return atomic_slow(tm, rank, addr, dt, op, a, b, result, rc)


cdef inline int fence(const gx_team* tm) except -1 nogil:
    """Order tm's endpoint's earlier puts/atomics before its later ones
    (NVSHMEM fence; where a transport cannot order, it completes them)."""
    return nbi_sync(tm, (1 << GX_CAT_PUT) | (1 << GX_CAT_RMW))


cdef inline int quiet(const gx_team* tm) except -1 nogil:
    """Complete every outstanding put/atomic of tm's endpoint (NVSHMEM quiet),
    the same as Team.quiet()."""
    return nbi_sync(tm, (1 << GX_CAT_PUT) | (1 << GX_CAT_RMW))


# ---- signals and waiting (NVSHMEM put_signal / wait_until) ----

cdef inline int put_signal(const gx_team* tm, int rank, uintptr_t dest, const void* src, size_t n,
                           uintptr_t sig_addr, uint64_t signal, int sig_op) except -1 nogil:
    """Put of n bytes, then the 64-bit signal word at (rank, sig_addr) set
    (GX_SIGNAL_SET) or added to (GX_SIGNAL_ADD); the signal is never visible
    before the data.  Blocking until src is reusable (NVSHMEM putmem_signal);
    over the network the signal may still be on its way (quiet completes it)."""
    cdef int rc = gx_put_signal(tm, rank, dest, src, n, sig_addr, signal, sig_op)
    if rc == GX_OK:
        return 0
    return put_signal_slow(tm, rank, dest, src, n, sig_addr, signal, sig_op, GX_BLOCKING,
                           NULL, NULL, rc)


cdef inline int put_signal_nbi(const gx_team* tm, int rank, uintptr_t dest, const void* src,
                               size_t n, uintptr_t sig_addr, uint64_t signal,
                               int sig_op) except -1 nogil:
    """Implicit-event put_signal: src reusable on return; complete after quiet(tm)."""
    cdef int rc = gx_put_signal(tm, rank, dest, src, n, sig_addr, signal, sig_op)
    if rc == GX_OK:
        return 0
    return put_signal_slow(tm, rank, dest, src, n, sig_addr, signal, sig_op, GX_NBI_LCNOW,
                           NULL, NULL, rc)


cdef inline int signal_op(const gx_team* tm, int rank, uintptr_t sig_addr, uint64_t value,
                          int sig_op) except -1 nogil:
    """Set or add to the 64-bit signal word at (rank, sig_addr); blocking."""
    cdef int rc = gx_signal_op(tm, rank, sig_addr, value, sig_op)
    if rc == GX_OK:
        return 0
    return signal_op_slow(tm, rank, sig_addr, value, sig_op, rc)


cdef inline int wait_until(const gx_team* tm, uintptr_t addr, int cmp, uint64_t value,
                           double timeout=0.0) except -1 nogil:
    """Block until the 64-bit word at addr of tm's endpoint's OWN segment
    compares cmp (GX_CMP_*) to value.  timeout (s) <= 0: GEXMK_TIMEOUT; it, a
    dead team member or a closed team raise.  Other types and several words:
    gexmk.core's wait_words."""
    cdef gx_val v
    cdef void* p
    v.u64 = value
    if gx_own_word(tm, addr, GX_DT_U64, &p) == GX_OK and gx_cmp_local(p, GX_DT_U64, cmp, v, NULL):
        return 0
    return wait_until_word(tm, addr, GX_DT_U64, cmp, v, timeout)


cdef inline int signal_fetch(const gx_team* tm, uintptr_t addr, uint64_t* out) except -1 nogil:
    """*out = the 64-bit signal word at addr of tm's endpoint's OWN segment
    (an acquire load, after one pass of progress)."""
    cdef gx_val v
    cdef void* p
    cdef Py_ssize_t idx
    wait_progress(tm)
    if gx_own_word(tm, addr, GX_DT_U64, &p) != GX_OK:
        v.u64 = 0         # wait_words names what is wrong with the word
        wait_words(tm, &addr, 1, GX_DT_U64, GX_CMP_EQ, &v, False, GX_WAIT_ANY, False, 0.0,
                   NULL, &idx, b"signal_fetch")
        return -1
    gx_cmp_local(p, GX_DT_U64, GX_CMP_EQ, v, &v)
    out[0] = v.u64
    return 0


# ---- VIS: strided and fragment lists (GASNet-EX gex_VIS_*) ----

cdef inline int _strided(const gx_team* tm, int rank, bint is_put, uintptr_t remote,
                         const ptrdiff_t* rstrides, void* local, const ptrdiff_t* lstrides,
                         size_t elemsz, const size_t* count, int stridelevels,
                         int mode) except -1 nogil:
    cdef gx_vis v
    cdef int d
    v.ndim = stridelevels if 0 < stridelevels <= GX_VIS_MAXDIM else GX_VIS_MAXDIM + 1
    v.elem = elemsz
    v.rbase = remote
    v.lbase = <char*>local
    v.frags = NULL
    v.nfrags = 0
    for d in range(stridelevels if stridelevels <= GX_VIS_MAXDIM else 0):
        v.count[d] = count[d]
        v.rstride[d] = rstrides[d]
        v.lstride[d] = lstrides[d]
    if stridelevels == 0:           # one element
        v.ndim = 1
        v.count[0] = 1
        v.rstride[0] = v.lstride[0] = <ptrdiff_t>elemsz
    return vis_c(tm, rank, is_put, &v, mode)


cdef inline int put_strided(const gx_team* tm, int rank, uintptr_t dest, const ptrdiff_t* dststrides,
                            const void* src, const ptrdiff_t* srcstrides, size_t elemsz,
                            const size_t* count, int stridelevels) except -1 nogil:
    """Blocking strided put (gex_VIS_StridedPutBlocking): count[k] elements of
    elemsz bytes along dimension k (0 fastest), at byte strides srcstrides[k]
    locally and dststrides[k] at (rank, dest); strides and counts positive."""
    return _strided(tm, rank, True, dest, dststrides, <void*>src, srcstrides, elemsz, count,
                    stridelevels, 0)


cdef inline int put_strided_nbi(const gx_team* tm, int rank, uintptr_t dest,
                                const ptrdiff_t* dststrides, const void* src,
                                const ptrdiff_t* srcstrides, size_t elemsz, const size_t* count,
                                int stridelevels) except -1 nogil:
    """Implicit-event put_strided: src reusable on return; complete after nbi_wait(tm)."""
    return _strided(tm, rank, True, dest, dststrides, <void*>src, srcstrides, elemsz, count,
                    stridelevels, _LCNOW)


cdef inline int get_strided(const gx_team* tm, void* dest, const ptrdiff_t* dststrides, int rank,
                            uintptr_t src, const ptrdiff_t* srcstrides, size_t elemsz,
                            const size_t* count, int stridelevels) except -1 nogil:
    """Blocking strided get (gex_VIS_StridedGetBlocking)."""
    return _strided(tm, rank, False, src, srcstrides, dest, dststrides, elemsz, count,
                    stridelevels, 0)


cdef inline int get_strided_nbi(const gx_team* tm, void* dest, const ptrdiff_t* dststrides,
                                int rank, uintptr_t src, const ptrdiff_t* srcstrides,
                                size_t elemsz, const size_t* count,
                                int stridelevels) except -1 nogil:
    """Implicit-event get_strided: dest filled after nbi_wait(tm)."""
    return _strided(tm, rank, False, src, srcstrides, dest, dststrides, elemsz, count,
                    stridelevels, GX_NBI)


cdef inline int put_frags(const gx_team* tm, int rank, const gx_frag* frags, size_t n,
                          bint nbi=False) except -1 nogil:
    """Vector/indexed put of n fragments (local, remote, nbytes) to rank
    (gex_VIS_VectorPut with both lists cut alike): blocking, or with nbi the
    implicit-event form (sources reusable on return).  Every remote block is
    checked before a byte moves."""
    cdef gx_vis v
    v.ndim = 0
    v.frags = frags
    v.nfrags = n
    return vis_c(tm, rank, True, &v, _LCNOW if nbi else 0)


cdef inline int get_frags(const gx_team* tm, int rank, const gx_frag* frags, size_t n,
                          bint nbi=False) except -1 nogil:
    """Vector/indexed get of n fragments from rank into their local addresses."""
    cdef gx_vis v
    v.ndim = 0
    v.frags = frags
    v.nfrags = n
    return vis_c(tm, rank, False, &v, GX_NBI if nbi else 0)
