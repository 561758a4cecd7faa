# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""nogil loops of bench/signal_pingpong.py: put_signal + wait_until ping-pong
and 8 B blocking puts through gexmk's C-level API (``from gexmk cimport rma``),
built on the fly by ``gexmk.bench.build_extension`` like an outside project.

Signal words are counters: the initiator sends ``seq + 1`` and waits for the
echo of the same value; the responder echoes every value until it sees STOP.
"""
from libc.stdint cimport uintptr_t, uint64_t

from gexmk cimport rma
from gexmk.core cimport Team

STOP = 2**63


def put8(Team tm, int rank, uintptr_t dest, Py_ssize_t n):
    """``n`` blocking 8-byte puts to (rank, dest)."""
    cdef rma.gx_team* t = rma.team_handle(tm)
    cdef uint64_t x = 0
    cdef Py_ssize_t i
    with nogil:
        for i in range(n):
            x = <uint64_t>i
            rma.put(t, rank, dest, &x, 8)


def pingpong(Team tm, int rank, uintptr_t data, uintptr_t peer_sig, uintptr_t my_sig,
             uint64_t seq, Py_ssize_t n):
    """``n`` round trips: 8 B put_signal (SIGNAL_SET seq+1, ...) to rank, then
    wait until my_sig reaches the same value.  Returns the last seq used."""
    cdef rma.gx_team* t = rma.team_handle(tm)
    cdef uint64_t x
    cdef Py_ssize_t i
    with nogil:
        for i in range(n):
            seq += 1
            x = seq
            rma.put_signal(t, rank, data, &x, 8, peer_sig, seq, rma.GX_SIGNAL_SET)
            rma.wait_until(t, my_sig, rma.GX_CMP_GE, seq)
    return seq


def echo(Team tm, int rank, uintptr_t data, uintptr_t peer_sig, uintptr_t my_sig):
    """Echo every signal value back (8 B put_signal) until one is >= STOP."""
    cdef rma.gx_team* t = rma.team_handle(tm)
    cdef uint64_t seen = 0, stop = STOP
    with nogil:
        while True:
            rma.wait_until(t, my_sig, rma.GX_CMP_GT, seen)
            rma.signal_fetch(t, my_sig, &seen)
            if seen >= stop:
                break
            rma.put_signal(t, rank, data, &seen, 8, peer_sig, seen, rma.GX_SIGNAL_SET)
    return seen



def put_signal8(Team tm, int rank, uintptr_t dest, uintptr_t sig, Py_ssize_t n):
    """``n`` 8 B put_signal (SIGNAL_SET 1) to (rank, dest), nobody waiting."""
    cdef rma.gx_team* t = rma.team_handle(tm)
    cdef uint64_t x = 1
    cdef Py_ssize_t i
    with nogil:
        for i in range(n):
            rma.put_signal(t, rank, dest, &x, 8, sig, 1, rma.GX_SIGNAL_SET)


def wait_ready(Team tm, uintptr_t my_word, Py_ssize_t n):
    """``n`` wait_until(my_word >= 1) on a word already satisfied: the entry cost."""
    cdef rma.gx_team* t = rma.team_handle(tm)
    cdef Py_ssize_t i
    with nogil:
        for i in range(n):
            rma.wait_until(t, my_word, rma.GX_CMP_GE, 1)


# ---- traced round trips (bench/signal_breakdown.py --legs) ---------------------------
#
# The data of each put_signal carries clock readings (CLOCK_MONOTONIC is one
# clock for every process of a node), so that one round trip splits into its
# legs without touching the library: [seq, t0 (initiator, before its
# put_signal), t_seen (responder, its wait returned), t_issue (responder,
# before its answer's put_signal)].  The data lands before the signal, so the
# responder reads it from its own segment once its wait returns.

from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC


cdef inline uint64_t _ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <uint64_t>ts.tv_sec * 1000000000 + <uint64_t>ts.tv_nsec


def pingpong_traced(Team tm, int rank, uintptr_t data, uintptr_t my_data, uintptr_t peer_sig,
                    uintptr_t my_sig, uint64_t seq, Py_ssize_t n, uint64_t[:, ::1] out):
    """``n`` traced round trips (32 B put_signal); row i of ``out`` gets
    [t0, t_issued, t_seen_peer, t_issue_peer, t_end] (ns): before and after
    this rank's put_signal, the responder's wait return and answer, and this
    rank's wait return.  Returns the last seq used."""
    cdef rma.gx_team* t = rma.team_handle(tm)
    cdef uint64_t x[4]
    cdef uint64_t* back = <uint64_t*>my_data
    cdef Py_ssize_t i
    with nogil:
        for i in range(n):
            seq += 1
            x[0] = seq
            x[1] = _ns()
            x[2] = x[3] = 0
            rma.put_signal(t, rank, data, x, 32, peer_sig, seq, rma.GX_SIGNAL_SET)
            out[i, 1] = _ns()
            rma.wait_until(t, my_sig, rma.GX_CMP_GE, seq)
            out[i, 4] = _ns()
            out[i, 0] = x[1]
            out[i, 2] = back[2]
            out[i, 3] = back[3]
    return seq


def echo_traced(Team tm, int rank, uintptr_t data, uintptr_t my_data, uintptr_t peer_sig,
                uintptr_t my_sig):
    """The responder of pingpong_traced: until a signal >= STOP, wait, stamp
    the data it got and send it back (32 B put_signal)."""
    cdef rma.gx_team* t = rma.team_handle(tm)
    cdef uint64_t seen = 0, stop = STOP
    cdef uint64_t x[4]
    cdef uint64_t* got = <uint64_t*>my_data
    with nogil:
        while True:
            rma.wait_until(t, my_sig, rma.GX_CMP_GT, seen)
            x[2] = _ns()
            rma.signal_fetch(t, my_sig, &seen)
            if seen >= stop:
                break
            x[0] = got[0]
            x[1] = got[1]
            x[3] = _ns()
            rma.put_signal(t, rank, data, x, 32, peer_sig, seen, rma.GX_SIGNAL_SET)
    return seen
