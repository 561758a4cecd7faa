# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Cython loops for ``bench/ofi_compare.py``: gexmk's nogil RMA API over the
``ofi`` transport, timed the way ``bench/ofi/ofi_bench.c`` times libfabric.

Built on the fly (``gexmk.bench.build_extension``) as an outside project
would: ``from gexmk cimport rma``.  Every function runs without the GIL and
times with ``clock_gettime(CLOCK_MONOTONIC)``, as the C baseline does, writing
one sample per element of ``out`` (nanoseconds); it returns how many samples it
took (it stops early once ``cap_s`` seconds have passed and 10 were taken).
"""
from libc.stdint cimport uintptr_t, uint64_t
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC

from gexmk cimport rma
from gexmk.core cimport Team

cdef extern from *:
    """
    static inline void gexmk_ofi_bench_clobber(void) { __asm__ __volatile__("" ::: "memory"); }
    """
    void clobber "gexmk_ofi_bench_clobber"() noexcept nogil


cdef inline uint64_t _now_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <uint64_t>ts.tv_sec * 1000000000ULL + <uint64_t>ts.tv_nsec


def put_nbi8_issue(Team tm, int rank, uintptr_t dest, Py_ssize_t window, double[::1] out,
                   double cap_s=1.0):
    """Issue cost of an 8 B ``rma.put_nbi``, as ofi_bench's ``issue_ns``: per
    batch, time only the loop of ``window`` calls, then ``rma.nbi_wait`` untimed;
    ``out[b]`` = loop time / window (ns per call).  3 untimed warm-up batches."""
    cdef rma.gx_team* t = rma.team_handle(tm)
    cdef uint64_t x = 0, t0, t1, start = 0
    cdef uint64_t cap = <uint64_t>(cap_s * 1e9)
    cdef Py_ssize_t b, i, n = 0, nb = out.shape[0]
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    with nogil:
        for b in range(-3, nb):
            if b == 0:
                start = _now_ns()
            t0 = _now_ns()
            for i in range(window):
                x = <uint64_t>i
                rma.put_nbi(t, rank, dest, &x, 8)
                clobber()
            t1 = _now_ns()
            rma.nbi_wait(t)
            if b < 0:
                continue
            out[n] = <double>(t1 - t0) / <double>window
            n += 1
            if n >= 10 and _now_ns() - start > cap:
                break
    return n


def put8_lat(Team tm, int rank, uintptr_t dest, double[::1] out, double cap_s=1.0):
    """Latency of single blocking 8 B ``rma.put`` calls (remote completion over
    ofi), one sample per call, as ofi_bench's ``write_dc_lat``."""
    cdef rma.gx_team* t = rma.team_handle(tm)
    cdef uint64_t x = 0, t0, t1, start
    cdef uint64_t cap = <uint64_t>(cap_s * 1e9)
    cdef Py_ssize_t i, n = 0, nb = out.shape[0]
    with nogil:
        for i in range(10):
            rma.put(t, rank, dest, &x, 8)
        start = _now_ns()
        for i in range(nb):
            x = <uint64_t>i
            t0 = _now_ns()
            rma.put(t, rank, dest, &x, 8)
            t1 = _now_ns()
            out[n] = <double>(t1 - t0)
            n += 1
            if n >= 10 and t1 - start > cap:
                break
    return n


def get8_lat(Team tm, int rank, uintptr_t src, double[::1] out, double cap_s=1.0):
    """Latency of single blocking 8 B ``rma.get`` calls, as ofi_bench's ``read_lat``."""
    cdef rma.gx_team* t = rma.team_handle(tm)
    cdef uint64_t x = 0, t0, t1, start
    cdef uint64_t cap = <uint64_t>(cap_s * 1e9)
    cdef Py_ssize_t i, n = 0, nb = out.shape[0]
    with nogil:
        for i in range(10):
            rma.get(t, &x, rank, src, 8)
        start = _now_ns()
        for i in range(nb):
            t0 = _now_ns()
            rma.get(t, &x, rank, src, 8)
            t1 = _now_ns()
            clobber()
            out[n] = <double>(t1 - t0)
            n += 1
            if n >= 10 and t1 - start > cap:
                break
    return n
