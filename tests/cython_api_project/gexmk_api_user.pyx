# cython: language_level=3
"""An outside Cython project using gexmk's nogil C-level RMA API, as a user's
extension would: it knows gexmk only through the installed .pxd files and
gexmk.get_include().  Built and run by tests/test_cython_api.py."""
from libc.stddef cimport ptrdiff_t
from libc.stdint cimport int64_t, uint64_t, uintptr_t

from gexmk cimport rma
from gexmk.core cimport Team
from gexmk.lib.gx cimport GX_DT_I64, GX_OP_FADD


def put_many_then_get(Team tm, int rank, uintptr_t dest, int n, int64_t first):
    """n 8-byte puts of first, first+1, ... to dest, dest+8, ... in a nogil
    loop, then one get of the n words; returns the bytes read back."""
    cdef rma.gx_team* t = rma.team_handle(tm)
    cdef int64_t x
    cdef int i
    out = bytearray(8 * n)
    cdef unsigned char[::1] buf = out
    with nogil:
        for i in range(n):
            x = first + i
            rma.put(t, rank, dest + 8 * i, &x, 8)
        rma.quiet(t)
        rma.get(t, &buf[0], rank, dest, 8 * n)
    return bytes(out)


def fetch_add(Team tm, int rank, uintptr_t addr, int64_t value, int times=1):
    """``times`` nogil FADDs of value on the I64 at addr; returns the last old value."""
    cdef rma.gx_team* t = rma.team_handle(tm)
    cdef rma.gx_val a, b, old
    cdef int i
    a.i64 = value
    b.i64 = 0
    old.i64 = -1
    with nogil:
        for i in range(times):
            rma.atomic(t, rank, addr, GX_DT_I64, GX_OP_FADD, a, b, &old)
    return old.i64


def put_word(Team tm, int rank, uintptr_t dest, int64_t value):
    """One nogil 8-byte put: the error path (bad address, bad rank) raises."""
    cdef rma.gx_team* t = rma.team_handle(tm)
    with nogil:
        rma.put(t, rank, dest, &value, 8)


def get_word(Team tm, int rank, uintptr_t src):
    cdef rma.gx_team* t = rma.team_handle(tm)
    cdef int64_t v = 0
    with nogil:
        rma.get(t, &v, rank, src, 8)
    return v


def put_signal_then_wait(Team tm, int rank, uintptr_t dest, int64_t value, uintptr_t sig_addr,
                         uint64_t signal, int add, uintptr_t my_sig, uint64_t wait_for,
                         double timeout):
    """nogil: rma.put_signal of one word (SIGNAL_ADD when add), then
    rma.wait_until(my_sig >= wait_for) and rma.signal_fetch of it."""
    cdef rma.gx_team* t = rma.team_handle(tm)
    cdef uint64_t seen = 0
    with nogil:
        rma.put_signal(t, rank, dest, &value, 8, sig_addr, signal,
                       rma.GX_SIGNAL_ADD if add else rma.GX_SIGNAL_SET)
        rma.wait_until(t, my_sig, rma.GX_CMP_GE, wait_for, timeout)
        rma.signal_fetch(t, my_sig, &seen)
    return seen


def signal_op(Team tm, int rank, uintptr_t sig_addr, uint64_t value, int add):
    cdef rma.gx_team* t = rma.team_handle(tm)
    with nogil:
        rma.signal_op(t, rank, sig_addr, value, rma.GX_SIGNAL_ADD if add else rma.GX_SIGNAL_SET)


def strided_column(Team tm, int rank, uintptr_t dest, double[:, ::1] a, int col, bint nbi=False):
    """nogil: rma.put_strided (or _nbi + nbi_wait) of column ``col`` of ``a`` to a
    contiguous run at dest, then rma.get_strided of it back into the next column;
    then the same two rows again through rma.put_frags / rma.get_frags."""
    cdef rma.gx_team* t = rma.team_handle(tm)
    cdef ptrdiff_t ls[1]
    cdef ptrdiff_t rs[1]
    cdef size_t cnt[1]
    cdef rma.gx_frag f[2]
    ls[0] = a.shape[1] * 8
    rs[0] = 8
    cnt[0] = a.shape[0]
    with nogil:
        if nbi:
            rma.put_strided_nbi(t, rank, dest, &rs[0], &a[0, col], &ls[0], 8, &cnt[0], 1)
            rma.nbi_wait(t)
        else:
            rma.put_strided(t, rank, dest, &rs[0], &a[0, col], &ls[0], 8, &cnt[0], 1)
        rma.get_strided(t, &a[0, col + 1], &ls[0], rank, dest, &rs[0], 8, &cnt[0], 1)
        f[0].local = &a[0, 0]
        f[0].remote = dest + 8 * a.shape[0]
        f[0].n = 16
        f[1].local = &a[1, 0]
        f[1].remote = dest + 8 * a.shape[0] + 16
        f[1].n = 16
        rma.put_frags(t, rank, &f[0], 2)
        f[0].local = &a[2, 0]
        f[1].local = &a[3, 0]
        rma.get_frags(t, rank, &f[0], 2)
