# cython: language_level=3
"""An outside Cython project using gexmk's nogil C-level RMA API, as a user's
extension would: it knows gexmk only through the installed .pxd files and
gexmk.get_include().  Built and run by tests/test_cython_api.py."""
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
