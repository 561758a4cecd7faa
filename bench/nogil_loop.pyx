# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Cython-level benchmark loops: gexmk's nogil RMA API against a plain memcpy.

Built on the fly by ``python -m gexmk.bench`` (see ``gexmk.bench.build_extension``)
the way an outside project builds against gexmk: ``from gexmk cimport rma``,
``include_dirs=[gexmk.get_include()]`` and the directory holding the gexmk
package on Cython's include path.

Every loop runs ``n`` operations without the GIL and returns nothing; the caller
times each call with ``time.perf_counter_ns`` and divides by ``n``.  A compiler
barrier in every iteration keeps the C compiler from merging or dropping the
repeated copies, in the gexmk loops and in the memcpy baseline alike.
"""
from libc.stdint cimport uintptr_t, uint64_t
from libc.string cimport memcpy

from gexmk cimport rma
from gexmk.core cimport Team

cdef extern from *:
    """
    static inline void gexmk_bench_clobber(void) { __asm__ __volatile__("" ::: "memory"); }
    """
    void clobber "gexmk_bench_clobber"() noexcept nogil


cdef inline size_t _mask(size_t slots) except? 0:
    if slots == 0 or (slots & (slots - 1)) != 0:
        raise ValueError(f"slots must be a power of two, got {slots}")
    return slots - 1


def put8(Team tm, int rank, uintptr_t dest, Py_ssize_t n, size_t slots=1024):
    """``n`` blocking 8-byte ``rma.put`` to ``dest + 8 * (i % slots)`` of team rank ``rank``."""
    cdef rma.gx_team* t = rma.team_handle(tm)
    cdef size_t mask = _mask(slots)
    cdef uint64_t x = 0
    cdef Py_ssize_t i
    with nogil:
        for i in range(n):
            x = <uint64_t>i
            rma.put(t, rank, dest + 8 * (<size_t>i & mask), &x, 8)
            clobber()


def put_nbi8(Team tm, int rank, uintptr_t dest, Py_ssize_t n, size_t slots=1024):
    """``n`` implicit-event 8-byte ``rma.put_nbi``, then ``rma.quiet()`` (inside the timed call)."""
    cdef rma.gx_team* t = rma.team_handle(tm)
    cdef size_t mask = _mask(slots)
    cdef uint64_t x = 0
    cdef Py_ssize_t i
    with nogil:
        for i in range(n):
            x = <uint64_t>i
            rma.put_nbi(t, rank, dest + 8 * (<size_t>i & mask), &x, 8)
            clobber()
        rma.quiet(t)


def get8(Team tm, int rank, uintptr_t src, Py_ssize_t n, size_t slots=1024):
    """``n`` blocking 8-byte ``rma.get`` from ``src + 8 * (i % slots)`` of team rank ``rank``."""
    cdef rma.gx_team* t = rma.team_handle(tm)
    cdef size_t mask = _mask(slots)
    cdef uint64_t x = 0, acc = 0
    cdef Py_ssize_t i
    with nogil:
        for i in range(n):
            rma.get(t, &x, rank, src + 8 * (<size_t>i & mask), 8)
            acc += x
            clobber()
    return acc


def put_buffer(Team tm, int rank, uintptr_t dest, const unsigned char[::1] src, Py_ssize_t n):
    """``n`` blocking ``rma.put`` of the whole of ``src`` to ``dest`` of team rank ``rank``."""
    cdef rma.gx_team* t = rma.team_handle(tm)
    cdef const unsigned char* p = &src[0]
    cdef size_t nbytes = <size_t>src.shape[0]
    cdef Py_ssize_t i
    with nogil:
        for i in range(n):
            rma.put(t, rank, dest, p, nbytes)
            clobber()


def memcpy_buffer(unsigned char[::1] dst, const unsigned char[::1] src, Py_ssize_t n):
    """Baseline: ``n`` plain C ``memcpy`` of ``src`` into ``dst`` (same length)."""
    if dst.shape[0] != src.shape[0]:
        raise ValueError(f"dst has {dst.shape[0]} bytes, src {src.shape[0]}: they must match")
    cdef unsigned char* d = &dst[0]
    cdef const unsigned char* s = &src[0]
    cdef size_t nbytes = <size_t>src.shape[0]
    cdef Py_ssize_t i
    with nogil:
        for i in range(n):
            memcpy(d, s, nbytes)
            clobber()
