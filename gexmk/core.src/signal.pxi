# ---- point-to-point synchronisation: signals and wait_until (NVSHMEM) -----------
#
# A signal is a 64-bit unsigned word of a bound segment.  put_signal writes
# data, then updates the signal word at the target (SIGNAL_SET or SIGNAL_ADD);
# the signal is never visible before the data, on any path: inline (memcpy,
# then a seq_cst exchange / atomic add on the mapping), or through the route's
# transport (its put_signal slot; a route whose RMA and atomics take different
# transports composes a completed put with the atomic).
#
# wait_until and its forms wait on words of the caller's OWN bound segment
# (addresses from tm.addr(tm.rank, off)).  The waiting primitive is
# wait_words (nogil, exported in core.pxd): it polls with acquire loads,
# drives the progress of every transport of the team's endpoint (over the
# network the word is written by the network), spins briefly, then yields,
# then sleeps: on the segment's wake word (a futex in the page after a
# library-allocated host segment; CPU signal and atomic writers on the node
# wake it, gexmk.h's gx_wake), else a nap; either sleep grows from 1 us to
# 100 us, so that words written by puts or by the network are still seen (and,
# in a wait that has lasted long, to 2 % of the time waited, at most 2 ms).
# Where every other member of the team is reached through a transport (the
# words are written by the network alone), the wait sleeps in the transport
# instead, where it can (GX_WAIT_SLEEP: a network transport blocks in its
# completion queues' wait fds), woken by the traffic that carries the signal:
# nothing else would wake the futex before the nap ends, and a nap costs a
# timer wake-up (>= 50 us of slack), more than a network round trip
# (bench/signal_breakdown.py).  More ranks than cores still make progress; a
# dead team member, a closed team or GEXMK_TIMEOUT end it with an error naming
# the word and the value seen.
#
# From Python, a wait whose word is not yet satisfied first spins a little
# with the GIL held (_gil_spin passes, ~1.3 us; none on an oversubscribed node):
# a ping-pong's answer usually comes within it, and the wait then returns
# without the GIL's release and retake.

from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC, nanosleep
from libc.stdlib cimport malloc
from libc.string cimport memset
from gexmk.errors import TimeoutError as TimeoutError_

SIGNAL_SET = GX_SIGNAL_SET     #: put_signal/signal_op: store the signal value (NVSHMEM_SIGNAL_SET)
SIGNAL_ADD = GX_SIGNAL_ADD     #: ... add it (NVSHMEM_SIGNAL_ADD)
CMP_EQ = GX_CMP_EQ             #: wait_until comparisons (NVSHMEM_CMP_*): word == value
CMP_NE = GX_CMP_NE
CMP_GT = GX_CMP_GT
CMP_GE = GX_CMP_GE
CMP_LT = GX_CMP_LT
CMP_LE = GX_CMP_LE
_CMP_NAMES = {CMP_EQ: "CMP_EQ", CMP_NE: "CMP_NE", CMP_GT: "CMP_GT", CMP_GE: "CMP_GE",
              CMP_LT: "CMP_LT", CMP_LE: "CMP_LE"}
_SIG_NAMES = {SIGNAL_SET: "SIGNAL_SET", SIGNAL_ADD: "SIGNAL_ADD"}

cdef long _NAP_MIN_NS = 1000       # the first sleep
cdef long _NAP_MAX_NS = 100000     # the longest sleep between passes
cdef long _nap_min = _NAP_MIN_NS
cdef long _nap_max = _NAP_MAX_NS
# A long wait sleeps longer: its naps may grow to 1/_NAP_SHARE of the time it
# has waited so far, up to _NAP_LONG_NS.  What a longer nap can delay is only
# a word written without a wake-up (a plain put, the collectives' arrivals),
# by at most 2 % of the wait; a rank idle in a barrier for seconds then costs
# a few hundred wake-ups, not ten thousand a second (issue 21: <= 2 % of a core).
cdef long _NAP_LONG_NS = 2000000
cdef double _NAP_SHARE = 50.0
cdef long _nap_long = _NAP_LONG_NS
cdef int _GIL_SPIN = 48            # passes a Python wait spins with the GIL held (~1.3 us
                                   # here: a pause and a load are ~27 ns on this EPYC)
cdef int _gil_spin = _GIL_SPIN

# Seconds a wait gives its peers when the caller passes none (GEXMK_TIMEOUT).
cdef double _wait_timeout = 300.0
# a wait that sees a member of its team dead goes on this long before it
# raises PeerDeadError: the word may still be set by the living (wait_words_as)
cdef double _DEATH_GRACE = 1.0
# A wait spins (CPU pause, progress) for _spin_for s (none on an oversubscribed
# node), then yields the CPU on each pass until _yield_for s, then sleeps
# between passes, 1 us doubling up to 100 us.  Yields cost little when nothing
# else wants the CPU and hand it over when something does.  A sleep on the
# wake word ends as soon as a node-local writer signals (a futex wake, a few
# us); a plain nap costs a timer wake-up (timer slack: ~50 us).  Spinning
# longer than a round trip only takes the core from a peer that shares it
# (two ranks on one core: every hop would cost the whole spin), so the spin is
# short and the yields give way to sleep soon.
cdef double _SPIN_FOR = 5e-6
cdef double _spin_for = _SPIN_FOR
cdef double _spin_init = _SPIN_FOR     # what init() chose for this node
cdef int _gil_init = _GIL_SPIN
cdef double _YIELD_FOR = 50e-6
cdef double _yield_for = _YIELD_FOR


cdef int _signal_init(Client c) except -1:
    """init(): the client's GEXMK_TIMEOUT becomes the waits' default; a node
    with more ranks than this process may run on (its CPU affinity) makes
    waits yield at once instead of spinning first (Open MPI's
    yield-when-idle rule): a spinning rank there holds the core its peer needs."""
    global _wait_timeout, _spin_for, _gil_spin, _spin_init, _gil_init
    _wait_timeout = c.config.timeout
    local = sum(1 for n in c._nodes if n == c._nodes[c.rank])
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    _spin_for = _spin_init = 0.0 if local > cpus else _SPIN_FOR
    _gil_spin = _gil_init = 0 if local > cpus else _GIL_SPIN
    return 0


def _timeout_now():
    """GEXMK_TIMEOUT of this process (the waits' bound), for code above here."""
    return _wait_timeout


def _wait_tuning(spin_us=None, yield_us=None, nap_us=None, gil_spin=None, defaults=False):
    """Private: set how long this process's waits spin and yield (µs) before
    sleeping, the first and longest sleep (µs, a pair; a third value: the longest
    sleep of a long wait, default that of the pair) and the passes a
    Python wait spins with the GIL held; ``defaults`` restores all four
    first.  Returns (spin_us, yield_us) in force.  For benchmarks and tests
    (a long first sleep makes a lost wake-up show as a stall)."""
    global _spin_for, _yield_for, _nap_min, _nap_max, _gil_spin, _nap_long
    if defaults:
        _spin_for, _yield_for, _gil_spin = _spin_init, _YIELD_FOR, _gil_init
        _nap_min, _nap_max, _nap_long = _NAP_MIN_NS, _NAP_MAX_NS, _NAP_LONG_NS
    if spin_us is not None:
        _spin_for = float(spin_us) * 1e-6
    if yield_us is not None:
        _yield_for = float(yield_us) * 1e-6
    if nap_us is not None:
        _nap_min = max(1000, int(float(nap_us[0]) * 1e3))
        _nap_max = max(_nap_min, int(float(nap_us[1]) * 1e3))
        _nap_long = max(_nap_max, int(float(nap_us[2]) * 1e3)) if len(nap_us) > 2 else _nap_max
    if gil_spin is not None:
        _gil_spin = max(0, int(gil_spin))
    return (_spin_for * 1e6, _yield_for * 1e6)


# Sleeps on wake words, and how they ended; sleeps in transports (private,
# for tests and benchmarks).
cdef unsigned long _n_sleeps = 0, _n_woken = 0, _n_net_sleeps = 0


def _wait_stats(reset=False):
    """Private: {"sleeps": futex sleeps, "woken": those a writer's wake (or
    a change before sleeping) ended, "net_sleeps": passes that slept in a
    transport (GX_WAIT_SLEEP)}; ``reset`` zeroes them."""
    global _n_sleeps, _n_woken, _n_net_sleeps
    out = {"sleeps": _n_sleeps, "woken": _n_woken, "net_sleeps": _n_net_sleeps}
    if reset:
        _n_sleeps = _n_woken = _n_net_sleeps = 0
    return out


cdef inline double _mono() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


cdef inline void _nap_ns(long ns) noexcept nogil:
    cdef timespec ts
    ts.tv_sec = ns // 1000000000
    ts.tv_nsec = ns % 1000000000
    nanosleep(&ts, NULL)


cdef inline long _nap_next(long nap, double waited) noexcept nogil:
    """The nap after ``nap`` in a wait that has lasted ``waited`` s: doubling up
    to _nap_max, or to 1/_NAP_SHARE of the time waited (at most _nap_long)."""
    cdef long cap = _nap_max
    if _nap_long > cap and waited * (1e9 / _NAP_SHARE) > cap:
        cap = <long>(waited * (1e9 / _NAP_SHARE))
        if cap > _nap_long:
            cap = _nap_long
    return nap * 2 if nap < cap // 2 else cap


cdef str _val_text(int dt, gx_val v):
    return repr(_from_val(dt, &v))


cdef int _word_error(const gx_team* tm, uintptr_t addr, int dt, int rc, str sig) except -1 with gil:
    """Why (addr, dt) is not a word this team's endpoint may wait on."""
    cdef Team team = <Team>tm.owner if tm.owner != NULL else None
    cdef size_t n = gx_dt_size(dt)
    cdef gx_target* t
    if team is not None and team._closed is not None:
        raise StateError(f"{_fn(sig)}: {team._closed}")
    if rc == GX_ERANK or tm.size == 0:
        raise StateError(f"{_fn(sig)}: the team is closed")
    t = tm.routes[tm.rank].t
    if t.size == 0:
        raise SegmentError(f"{_fn(sig)}: this rank's endpoint {tm.ep.index} has no bound "
                           "segment (bind one, and publish it for peers to signal)")
    if rc == GX_NOT_MAPPED:
        raise UnsupportedError(f"{_fn(sig)}: this rank's bound segment is device memory; waiting "
                               "on a device word from the host is not implemented (wait on a "
                               "host segment's word, or order the wait on a CUDA stream: "
                               "tm.signal_wait_until_on_stream)")
    if t.remote_base <= addr and addr - t.remote_base + n <= t.size:
        raise BoundsError(f"{_fn(sig)}: address 0x{addr:x} is not aligned to {n} bytes "
                          f"({_DT_NAMES[dt]})")
    raise BoundsError(f"{_fn(sig)}: [0x{addr:x}, 0x{addr:x} + {n}) is not inside this rank's own "
                      f"bound segment [0x{t.remote_base:x}, 0x{t.remote_base:x} + {t.size}): "
                      f"wait and test forms take a word of the caller's segment, "
                      f"tm.addr(tm.rank, offset)")


cdef int _wait_failed(const gx_team* tm, uintptr_t addr, int dt, int cmp, gx_val want,
                      gx_val seen, int why, double timeout, int dead_rank, str sig) except -1 with gil:
    what = (f"word 0x{addr:x} ({_DT_NAMES[dt]}) {_CMP_NAMES[cmp]} {_val_text(dt, want)}, "
            f"last value seen {_val_text(dt, seen)}")
    if why == 1:
        t = tm.routes[dead_rank].t
        raise PeerDeadError(f"{_fn(sig)}: team rank {dead_rank} (job rank {t.jobrank}) died while "
                            f"waiting for {what}")
    if why == 2:
        raise StateError(f"{_fn(sig)}: the team or its endpoint was closed while waiting for {what}")
    raise TimeoutError_(f"{_fn(sig)}: timed out after {timeout:g} s (GEXMK_TIMEOUT or timeout=) "
                        f"waiting for {what}")


cdef int _wait_health(const gx_team* tm) noexcept nogil:
    """-1 when the team or endpoint is closed; the team rank of a dead member,
    or -2 when all are alive."""
    cdef int i
    if tm.size == 0 or tm.ep.destroyed:
        return -1
    for i in range(tm.size):
        if tm.routes[i].dead:
            return i
    return -2


cdef int wait_progress(const gx_team* tm) except -1 nogil:
    """Drive the progress of every transport of the team's endpoint once (a
    network transport lands incoming data, signals included, only when
    progressed).  Every transport's nbi_test with no categories does just that."""
    return _wait_pass(tm, 0)


cdef int _wait_pass(const gx_team* tm, int flags) except -1 nogil:
    """wait_progress; ``flags`` GX_WAIT_DRIVING while a wait polls on (spins
    or yields): a transport may keep its progress thread off the CPU then."""
    cdef gx_ep* e = tm.ep
    cdef int i
    for i in range(e.ntr):
        e.tr[i].ops.nbi_test(e.tr[i].ep, flags)
    return 0


cdef bint _net_only(const gx_team* tm) noexcept nogil:
    """True when every other live member of the team with a published
    segment is reached through a transport, none through a CPU mapping:
    their writes to this member's words come the same way (routes are
    symmetric) and land when the transport is progressed."""
    cdef int i
    cdef gx_route* r
    cdef bint some = False
    for i in range(tm.size):
        r = tm.routes[i]
        if i == tm.rank or r.size == 0 or r.dead:
            continue
        if r.local_base != NULL:
            return False
        some = True
    return some


cdef bint _wait_sleep_pass(const gx_team* tm, long nap_ns) except -1 nogil:
    """A sleeping wait's progress pass on a team whose words only transports
    write: each transport may block until its traffic comes (at most the
    nap), then progress (GX_WAIT_SLEEP).  True when one did: the wait does
    not sleep again on its wake word."""
    cdef gx_ep* e = tm.ep
    cdef int i
    cdef int flags = GX_WAIT_SLEEP | GX_WAIT_SLEEP_US(nap_ns // 1000 if nap_ns >= 1000 else 1)
    cdef bint slept = False
    for i in range(e.ntr):
        if e.tr[i].ops.nbi_test(e.tr[i].ep, flags) == 2:
            slept = True
    return slept


cdef Py_ssize_t wait_words(const gx_team* tm, const uintptr_t* addrs, Py_ssize_t n, int dt,
                           int cmp, const gx_val* vals, bint vector, int mode, bint block,
                           double timeout, const unsigned char* skip, Py_ssize_t* indices,
                           const char* sig) except -1 nogil:
    """Wait_words_as with this process's spin and yield times (the waits of the API)."""
    return wait_words_as(tm, addrs, n, dt, cmp, vals, vector, mode, block, timeout, skip, indices,
                         sig, _spin_for, _yield_for, 1)


cdef Py_ssize_t wait_words_as(const gx_team* tm, const uintptr_t* addrs, Py_ssize_t n, int dt,
                              int cmp, const gx_val* vals, bint vector, int mode, bint block,
                              double timeout, const unsigned char* skip, Py_ssize_t* indices,
                              const char* sig, double spin_for, double yield_for,
                              int progress) except -1 nogil:
    """Wait (``block``) or test once for words of the team endpoint's own
    bound segment: ``addrs[n]``, type ``dt`` (GX_DT_*), each compared
    ``cmp`` (GX_CMP_*) against ``vals[i]`` (``vector``) or ``vals[0]``.
    ``skip[i]`` nonzero (``skip`` may be NULL) leaves word i out (NVSHMEM's
    status array).  ``mode``: GX_WAIT_ALL (returns the number of words waited
    on once all satisfied; a test returns 0 unless all are), GX_WAIT_ANY (one
    satisfied index into ``indices[0]``; returns 1, or 0 for a test that
    finds none), GX_WAIT_SOME (every satisfied index into ``indices``, which
    holds n; returns how many).  Under GX_WAIT_ALL a word counts once it has
    been seen satisfied (NVSHMEM).  ``timeout`` <= 0: GEXMK_TIMEOUT.  Raises
    on a bad word, a bad cmp/dt/mode, a dead team member, a closed team or
    the timeout.  Spins (CPU pause) for ``spin_for`` s, then yields the CPU
    on each pass until ``yield_for`` s, then sleeps (see _SPIN_FOR; with
    ``progress`` 1 on a team whose other members are all reached through
    transports, in the transports where they can: _wait_sleep_pass).  Drives
    the endpoint's transports on each pass where ``progress`` is 1, only
    between sleeps where it is 2 (a word that only CPU stores on this node
    change: driving the network now and then keeps a transport's progress
    thread from polling in the waiter's stead), never where it is 0.
    Callable from any nogil code (``gexmk.rma.wait_until``)."""
    cdef unsigned char small[64]
    cdef unsigned char* done = small
    cdef void* p
    cdef gx_val seen, want, last
    cdef Py_ssize_t i, got, need = 0, pending = -1
    cdef unsigned long passes = 0
    cdef bint spinning = True, sleeping = False
    cdef bint net_sleep = False     # sleeping in the transports (_wait_sleep_pass)
    cdef int slept = 0              # the last pass slept in a transport (1), could not (-1)
    cdef double t0 = 0, deadline = 0, now, dead_at = 0
    cdef long nap = _nap_min
    cdef int rc, why = 0, h = -2
    cdef gx_wake* w = NULL          # counted in as a waiter on this wake word
    cdef uint32_t wseq = 0
    global _n_sleeps, _n_woken, _n_net_sleeps
    if cmp < 0 or cmp >= GX_CMP_COUNT or dt < 0 or dt >= GX_DT_COUNT or mode < 0 or mode > 2 \
            or n < 0:
        with gil:
            raise ArgumentError(f"{sig.decode()}: cmp={cmp}, dt={dt}, mode={mode} or n={n} is out "
                                "of range (CMP_*, DT_*, GX_WAIT_ALL/ANY/SOME, n >= 0)")
    for i in range(n):
        rc = gx_own_word(tm, addrs[i], dt, &p)
        if rc != GX_OK:
            with gil:
                _word_error(tm, addrs[i], dt, rc, sig.decode())
        if skip == NULL or not skip[i]:
            need += 1
    if need == 0:
        if mode == GX_WAIT_ALL:
            return 0
        with gil:
            raise ArgumentError(f"{sig.decode()}: every word is excluded (status), so none can "
                                "satisfy the condition")
    if timeout <= 0:
        timeout = _wait_timeout
    if n > 64:
        done = <unsigned char*>malloc(n)
        if done == NULL:
            with gil:
                raise MemoryError()
    memset(done, 0, n if n <= 64 else n)
    last.u64 = 0
    if not block and progress == 1:
        wait_progress(tm)       # a test drives progress once: over the network it lands signals
    try:
        while True:
            if sleeping and w == NULL and not net_sleep:
                # count in before looking at the words: a writer that stores
                # after this look sees us and wakes us (gx_wake_enter)
                w = tm.routes[tm.rank].t.wake
                if w != NULL:
                    wseq = gx_wake_enter(w)
            got = 0
            pending = -1
            for i in range(n):
                if (skip != NULL and skip[i]) or (mode == GX_WAIT_ALL and done[i]):
                    continue
                rc = gx_own_word(tm, addrs[i], dt, &p)   # a segment unbound meanwhile: raise
                if rc != GX_OK:
                    with gil:
                        _word_error(tm, addrs[i], dt, rc, sig.decode())
                want = vals[i if vector else 0]
                if gx_cmp_local(p, dt, cmp, want, &seen):
                    if mode == GX_WAIT_ALL:
                        done[i] = 1
                        need -= 1
                        continue
                    indices[got] = i
                    got += 1
                    if mode == GX_WAIT_ANY:
                        return 1
                elif pending < 0:
                    pending = i         # the first unsatisfied word: named if the wait fails
                    last = seen
            if mode == GX_WAIT_ALL:
                if need == 0:
                    return n
                if not block:
                    return 0
            elif got > 0 or not block:
                return got
            if net_sleep:
                # the traffic wakes it: the longest nap bounds it, for the
                # team's health, the deadline and this process's own stores
                slept = 1 if _wait_sleep_pass(tm, _nap_max) else -1
                net_sleep = slept > 0   # none could: the wake word from the next pass
            elif progress == 1 or (progress == 2 and sleeping):
                _wait_pass(tm, 0 if sleeping else GX_WAIT_DRIVING)
            passes += 1
            if spinning and (passes & 15) != 0:
                gx_cpu_relax()
                continue
            # every 16th pass while spinning, every pass after: the clock and the team
            now = _mono()
            if t0 == 0:
                t0 = now
                deadline = now + timeout
            h = _wait_health(tm)
            if h == -1:
                why = 2
                break
            if h >= 0:
                # A member died.  What is waited for may still come from the
                # living -- a barrier's partner only slower than the dead one,
                # who had done its part before it died (test_failure: the
                # barrier before the kill failed on a survivor under load) --
                # so the wait goes on for _DEATH_GRACE before it gives up.
                if dead_at == 0:
                    dead_at = now
                elif now - dead_at > _DEATH_GRACE:
                    why = 1
                    break
            if now > deadline:
                why = 3
                break
            if now - t0 < spin_for:
                gx_cpu_relax()
            elif now - t0 < yield_for:
                spinning = False
                sched_yield()
            elif not sleeping:
                spinning = False
                sleeping = True         # the next pass counts in, looks, then sleeps
                net_sleep = progress == 1 and _net_only(tm)     # ... or sleeps in the transports
            else:
                if slept != 0:
                    # the pass slept in a transport, or none could: then the
                    # next pass counts in on the wake word and sleeps there
                    if slept > 0:
                        _n_net_sleeps += 1
                    slept = 0
                elif w != NULL:
                    _n_sleeps += 1
                    if not gx_wake_sleep(w, wseq, nap):
                        _n_woken += 1
                    gx_wake_leave(w)
                    w = NULL
                else:
                    _nap_ns(nap)
                nap = _nap_next(nap, now - t0)
    finally:
        if w != NULL:
            gx_wake_leave(w)
        if done != small:
            free(done)
    if pending < 0:
        pending = 0
    want = vals[pending if vector else 0]
    with gil:
        _wait_failed(tm, addrs[pending], dt, cmp, want, last, why, timeout, h, sig.decode())
    return -1


cdef int wait_until_word(const gx_team* tm, uintptr_t addr, int dt, int cmp, gx_val value,
                         double timeout) except -1 nogil:
    """Block until the word (addr, dt) of the team endpoint's own segment
    compares ``cmp`` to ``value``: the one-word form of wait_words (the
    primitive collectives can wait with)."""
    cdef Py_ssize_t idx
    wait_words(tm, &addr, 1, dt, cmp, &value, False, GX_WAIT_ANY, True, timeout, NULL, &idx,
               b"wait_until")
    return 0


# ---- put_signal and signal_op through the route ------------------------------------

cdef int _sig_check(const gx_team* tm, int rank, uintptr_t dest, size_t n, uintptr_t sig_addr,
                    int sig_op, str what) except -1 with gil:
    """Report what the inline path refused (bad op, rank, range, alignment, death)."""
    cdef char* p
    cdef gx_route* r
    cdef int rc
    if sig_op != GX_SIGNAL_SET and sig_op != GX_SIGNAL_ADD:
        raise ArgumentError(f"{what}: sig_op must be SIGNAL_SET or SIGNAL_ADD (got {sig_op})")
    if what.startswith("put_signal"):
        rc = gx_locate(tm, rank, dest, n, &p, &r)
        if rc != GX_OK and rc != GX_NOT_MAPPED:
            return _raise_rc(tm, rank, dest, n, rc, what)
    rc = gx_locate(tm, rank, sig_addr, 8, &p, &r)
    if rc != GX_OK and rc != GX_NOT_MAPPED:
        return _raise_rc(tm, rank, sig_addr, 8, rc, what + " (signal word)")
    if sig_addr & 7:
        raise BoundsError(f"{what}: signal address 0x{sig_addr:x} is not aligned to 8 bytes")
    return 0


cdef int put_signal_slow(const gx_team* tm, int rank, uintptr_t dest, const void* src, size_t n,
                         uintptr_t sig_addr, uint64_t value, int sig_op, int mode,
                         void** handle, const gx_tr_ops** handle_ops, int rc) except -1 nogil:
    return _put_signal_k(tm, rank, dest, src, n, sig_addr, value, sig_op, mode, handle,
                         handle_ops, GX_MK_HOST, -1)


cdef int _put_signal_k(const gx_team* tm, int rank, uintptr_t dest, const void* src, size_t n,
                       uintptr_t sig_addr, uint64_t value, int sig_op, int mode,
                       void** handle, const gx_tr_ops** handle_ops, int lkind,
                       int ldev) except -1 nogil:
    """A put_signal the inline path declined (rc): errors reported, else the
    route's transport.  Where RMA and atomics take one transport, its
    put_signal slot orders them; else the put is completed (blocking) before
    the atomics path updates the signal.  GX_NB: ``*handle`` receives a
    pending op of the table ``*handle_ops`` (or NULL when complete)."""
    cdef gx_route* r
    cdef char* p
    cdef gx_xfer x
    cdef gx_val a, b
    # checked without the GIL; taken only to raise
    if (sig_op != GX_SIGNAL_SET and sig_op != GX_SIGNAL_ADD) or (sig_addr & 7) or gx_locate(tm, rank, sig_addr, 8, &p, &r) < 0 \
            or gx_locate(tm, rank, dest, n, &p, &r) < 0:
        return _sig_check(tm, rank, dest, n, sig_addr, sig_op, "put_signal")
    r = tm.routes[rank]
    if handle != NULL:
        handle[0] = NULL
    _mark_unsynced(tm.ep)   # a blocking put_signal completes locally only
    # (a table without the slot, e.g. a plug-in older than it, gets the composition)
    if r.rma.ops == r.amo.ops and r.rma.peer == r.amo.peer and r.rma.ops.put_signal != NULL:
        _xfer_init(&x, &r.rma, r.t, dest, <void*>src, n, mode)
        _local_kind(&x, tm, src, n, lkind, ldev)
        x.sig_addr = sig_addr
        x.a.u64 = value
        x.b.u64 = 0
        x.op = sig_op
        x.dt = GX_DT_U64
        x.handle = handle
        if handle_ops != NULL:
            handle_ops[0] = r.rma.ops
        r.rma.ops.put_signal(&x)
        # counted as the composition below is: a put and an 8-byte atomic on the path
        gx_count_add(&r.via[GX_CNT_PUT], n)
        gx_count_add(&r.via[GX_CNT_AMO], 8)
        return 0
    # the generic composition: data complete at the target, then the signal
    _rma_k(tm, rank, True, dest, <void*>src, n, GX_BLOCKING, NULL, NULL, lkind, ldev)
    a.u64 = value
    b.u64 = 0
    if handle_ops != NULL:
        handle_ops[0] = r.amo.ops
    return _amo(tm, rank, sig_addr, GX_DT_U64, GX_OP_SET if sig_op == GX_SIGNAL_SET else GX_OP_ADD,
                a, b, NULL, mode if mode != GX_NBI_LCNOW else GX_NBI, handle, GX_NOT_MAPPED)


cdef inline void _local_kind(gx_xfer* x, const gx_team* tm, const void* src, size_t n,
                             int lkind, int ldev) noexcept nogil:
    """x's local kind: given (device memory of the endpoint's kind outside its
    segment), or the segment's where src lies in it."""
    if lkind != GX_MK_HOST:
        x.local_kind = lkind
        x.local_device = ldev
    elif gx_in_dev(tm, src, n):
        x.local_kind = tm.ep.seg_kind
        x.local_device = tm.ep.seg_device


cdef int _put_signal_on_stream(const gx_team* tm, int rank, uintptr_t dest, const void* src,
                               size_t n, uintptr_t sig_addr, uint64_t value, int sig_op,
                               void* stream, int lkind=GX_MK_HOST, int ldev=-1) except -1 nogil:
    """put_signal enqueued on a CUDA stream (NVSHMEM putmem_signal_on_stream):
    the data, then the signal, in stream order with no host synchronisation.
    Only where one path serves both and the target is device memory that this
    process's GPU work can update (the route's put_signal slot with x.stream)."""
    cdef gx_route* r
    cdef char* p
    cdef gx_xfer x
    if (sig_op != GX_SIGNAL_SET and sig_op != GX_SIGNAL_ADD) or (sig_addr & 7) \
            or gx_locate(tm, rank, sig_addr, 8, &p, &r) < 0 or gx_locate(tm, rank, dest, n, &p, &r) < 0:
        return _sig_check(tm, rank, dest, n, sig_addr, sig_op, "put_signal_on_stream")
    r = tm.routes[rank]
    if r.t.kind == GX_MK_HOST or r.rma.ops != r.amo.ops or r.rma.peer != r.amo.peer \
            or r.rma.ops.put_signal == NULL:
        with gil:
            raise UnsupportedError(
                f"put_signal_on_stream: team rank {rank}'s path ({r.rma.ops.name.decode()}) cannot "
                "order a signal after the data on a stream (it needs a device segment reached by "
                "one path that copies on the stream)")
    _xfer_init(&x, &r.rma, r.t, dest, <void*>src, n, GX_NBI)
    _local_kind(&x, tm, src, n, lkind, ldev)
    x.stream = stream
    x.sig_addr = sig_addr
    x.a.u64 = value
    x.b.u64 = 0
    x.op = sig_op
    x.dt = GX_DT_U64
    r.rma.ops.put_signal(&x)
    gx_count_add(&r.via[GX_CNT_PUT], n)
    return 0


cdef int signal_op_slow(const gx_team* tm, int rank, uintptr_t sig_addr, uint64_t value,
                        int sig_op, int rc) except -1 nogil:
    """A signal_op the inline path declined: errors, or the route's atomics path."""
    cdef gx_val a, b
    cdef gx_route* r
    cdef char* p
    if (sig_op != GX_SIGNAL_SET and sig_op != GX_SIGNAL_ADD) or (sig_addr & 7) \
            or gx_locate(tm, rank, sig_addr, 8, &p, &r) < 0:
        return _sig_check(tm, rank, 0, 0, sig_addr, sig_op, "signal_op")
    a.u64 = value
    b.u64 = 0
    return _amo(tm, rank, sig_addr, GX_DT_U64, GX_OP_SET if sig_op == GX_SIGNAL_SET else GX_OP_ADD,
                a, b, NULL, GX_BLOCKING, NULL, GX_NOT_MAPPED)


# ---- the Python API (Team methods delegate here) ------------------------------------

cdef int _as_sig_op(object x, str sig) except -1:
    if x is SIGNAL_SET or x is SIGNAL_ADD:      # the constants themselves: no conversion
        return <int>x
    if type(x) is not bool and hasattr(type(x), "__index__"):
        v = PyNumber_Index(x)
        if v == GX_SIGNAL_SET or v == GX_SIGNAL_ADD:
            return <int>v
    raise ArgumentError(f"{_fn(sig)}: sig_op must be SIGNAL_SET or SIGNAL_ADD, got {_got(x)}")


cdef int _as_cmp(object x, str sig) except -1:
    cdef long long v0
    if type(x) is int and _exact_int_ll(x, &v0) and 0 <= v0 < GX_CMP_COUNT:
        return <int>v0
    if type(x) is not bool and hasattr(type(x), "__index__"):
        v = PyNumber_Index(x)
        if 0 <= v < GX_CMP_COUNT:
            return <int>v
    raise ArgumentError(f"{_fn(sig)}: cmp must be one of CMP_EQ, CMP_NE, CMP_GT, CMP_GE, CMP_LT, "
                        f"CMP_LE, got {_got(x)}")


cdef int _as_dt(object x, str sig) except -1:
    cdef long long v0
    if type(x) is int and _exact_int_ll(x, &v0) and 0 <= v0 < GX_DT_COUNT:
        return <int>v0
    if type(x) is not bool and hasattr(type(x), "__index__"):
        v = PyNumber_Index(x)
        if v in _DT_NAMES:
            return <int>v
    raise ArgumentError(f"{_fn(sig)}: dt must be one of DT_I32, DT_U32, DT_I64, DT_U64, DT_FLT, "
                        f"DT_DBL, got {_got(x)}")


cdef double _as_timeout(object x, str sig) except -1:
    if x is None:
        return 0.0
    if type(x) is bool or not isinstance(x, numbers.Real):
        raise TypeError(f"{_fn(sig)}: timeout must be a number of seconds or None, "
                        f"got {_got(x)}")
    t = float(x)
    if not t > 0 or t != t or isinf(t):
        raise ArgumentError(f"{_fn(sig)}: timeout must be a positive, finite number of seconds "
                            f"(or None for GEXMK_TIMEOUT), got {x!r}")
    return t


cdef object _signal_issue(Team tm, str sig, object rank, object dest, object src,
                          object sig_addr, object signal, object sig_op, int mode):
    """put_signal in every mode: None, or (GX_NB) an Event."""
    cdef Py_buffer view
    cdef _Local loc
    cdef int r = _as_rank(rank, sig, &tm.c)
    cdef uintptr_t d = _as_addr(dest, sig, "dest")
    cdef uintptr_t sa = _as_addr(sig_addr, sig, "sig_addr")
    cdef gx_val v
    cdef int so = _as_sig_op(sig_op, sig)
    cdef int rc
    cdef void* op = NULL
    cdef const gx_tr_ops* ops = NULL
    _to_val(GX_DT_U64, signal, &v, sig, "signal")
    _take(src, &view, &loc, False, sig, b"src", &tm.c)
    try:
        # device memory outside the segment never takes the inline memcpy
        rc = GX_NOT_MAPPED
        if loc.kind == GX_MK_HOST and loc.n < _NOGIL_BYTES:
            rc = gx_put_signal(&tm.c, r, d, loc.p, loc.n, sa, v.u64, so)
            if rc == GX_OK:
                return None
        tm.client._inflight += 1
        try:
            with nogil:
                if loc.kind == GX_MK_HOST and loc.n >= _NOGIL_BYTES:
                    rc = gx_put_signal(&tm.c, r, d, loc.p, loc.n, sa, v.u64, so)
                if rc != GX_OK:
                    _put_signal_k(&tm.c, r, d, loc.p, loc.n, sa, v.u64, so, mode,
                                  &op if mode == GX_NB else NULL, &ops, loc.kind, loc.device)
        finally:
            tm.client._inflight -= 1
        if op != NULL:
            return _op_event(tm.client, ops, op, (_keep_local(&loc, src), tm), -1)
        return None
    finally:
        _drop(&view, &loc)


cdef object _signal_on_stream(Team tm, object rank, object dest, object src, object sig_addr,
                              object signal, object sig_op, object stream):
    sig = "put_signal_on_stream(rank, dest, src, sig_addr, signal, sig_op, stream)"
    cdef Py_buffer view
    cdef _Local loc
    cdef int r = _as_rank(rank, sig, &tm.c)
    cdef uintptr_t d = _as_addr(dest, sig, "dest")
    cdef uintptr_t sa = _as_addr(sig_addr, sig, "sig_addr")
    cdef int so = _as_sig_op(sig_op, sig)
    cdef gx_val v
    cdef void* s = <void*>_stream_handle(stream)
    _to_val(GX_DT_U64, signal, &v, sig, "signal")
    _take(src, &view, &loc, False, sig, b"src", &tm.c)
    try:
        if loc.bounce != NULL:
            raise UnsupportedError(
                f"{_fn(sig)}: src is device memory of another kind than the device segment "
                "bound to this team's endpoint (another GPU, or no device segment): a "
                "stream-ordered copy cannot go through the host bounce buffer such memory takes")
        with nogil:
            _put_signal_on_stream(&tm.c, r, d, loc.p, loc.n, sa, v.u64, so, s, loc.kind,
                                  loc.device)
    finally:
        _drop(&view, &loc)


# cuStreamWaitValue64 compares: >= (cyclic), ==, and bit masks; gexmk's CMP_GT is
# ">= value + 1" there, CMP_NE / CMP_LT / CMP_LE have no stream form
cdef int _waitv_cmp(int cmp, uint64_t* value, str sig) except -1:
    if cmp == GX_CMP_EQ:
        return GX_WAITV_EQ
    if cmp == GX_CMP_GE:
        return GX_WAITV_GEQ
    if cmp == GX_CMP_GT:
        value[0] += 1
        return GX_WAITV_GEQ
    raise UnsupportedError(f"{_fn(sig)}: on a stream the comparison must be CMP_EQ, CMP_GE or "
                           "CMP_GT (what cuStreamWaitValue64 evaluates); wait on the host "
                           "(wait_until) for the others")


cdef object _wait_on_stream(Team tm, object sig_addr, object cmp, object value, object stream):
    sig = "signal_wait_until_on_stream(sig_addr, cmp, value, stream)"
    cdef uintptr_t sa = _as_addr(sig_addr, sig, "sig_addr")
    cdef int c = _as_cmp(cmp, sig)
    cdef gx_val v
    cdef void* s = <void*>_stream_handle(stream)
    cdef const gx_kind_ops* ops
    cdef void* kctx
    cdef int wc
    _to_val(GX_DT_U64, value, &v, sig, "value")
    seg = tm.ep.segment
    if seg is None or seg.kind.cls == GX_MK_HOST or seg.kind.impl is None:
        raise UnsupportedError(f"{_fn(sig)}: the word must be in a device segment bound to this "
                               "team's endpoint (a stream waits on device memory)")
    if sa & 7 or sa < <uintptr_t>seg.address or sa + 8 > <uintptr_t>seg.address + <size_t>seg.size:
        raise BoundsError(f"{_fn(sig)}: sig_addr 0x{sa:x} is not an aligned 8-byte word of the "
                          f"endpoint's device segment [0x{seg.address:x}, +{seg.size})")
    impl = seg.kind.impl
    ops = <const gx_kind_ops*>PyCapsule_GetPointer(impl.ops_capsule(), b"gexmk.kind_ops")
    kctx = <void*><uintptr_t>impl.handle
    if ops.wait_value == NULL:
        raise UnsupportedError(f"{_fn(sig)}: the {ops.name.decode()} kind cannot make a stream "
                               "wait on a word")
    wc = _waitv_cmp(c, &v.u64, sig)
    with nogil:
        ops.wait_value(kctx, s, sa, v.u64, wc)


cdef object _signal_op(Team tm, object rank, object sig_addr, object value, object sig_op):
    sig = "signal_op(rank, sig_addr, value, sig_op=SIGNAL_SET)"
    cdef int r = _as_rank(rank, sig, &tm.c)
    cdef uintptr_t sa = _as_addr(sig_addr, sig, "sig_addr")
    cdef int so = _as_sig_op(sig_op, sig)
    cdef gx_val v
    _to_val(GX_DT_U64, value, &v, sig, "value")
    cdef int rc = gx_signal_op(&tm.c, r, sa, v.u64, so)
    if rc == GX_OK:
        return None
    with nogil:
        signal_op_slow(&tm.c, r, sa, v.u64, so, rc)
    return None


cdef object _signal_fetch(Team tm, object sig_addr):
    sig = "signal_fetch(sig_addr)"
    cdef uintptr_t sa = _as_addr(sig_addr, sig, "sig_addr")
    cdef void* p
    cdef gx_val seen
    tm.check_alive()
    cdef int rc = gx_own_word(&tm.c, sa, GX_DT_U64, &p)
    if rc != GX_OK:
        _word_error(&tm.c, sa, GX_DT_U64, rc, sig)
    # over the network the word is written by the network: one progress pass (a
    # non-blocking poll; with the GIL held, as its release and retake would
    # double this call's cost)
    wait_progress(&tm.c)
    seen.u64 = 0
    gx_cmp_local(p, GX_DT_U64, GX_CMP_EQ, seen, &seen)
    return seen.u64


cdef dict _csigs = {}


cdef bytes _csig(str sig):
    """The C name of a wait form for wait_words' messages (made once)."""
    b = _csigs.get(sig)
    if b is None:
        b = _csigs[sig] = _fn(sig).encode()
    return b


cdef int _spin_word(const gx_team* tm, const void* p, int dt, int cmp, gx_val v) except -1 nogil:
    """Spin up to _gil_spin passes (the caller holds the GIL) for the word at
    local p to compare cmp to v: a ping-pong's answer, usually.  1 when it
    does.  Progress every 16 passes (a network writes the word only when
    progressed); the team's health and the deadline are wait_words' job next."""
    cdef int i
    for i in range(1, _gil_spin + 1):
        gx_cpu_relax()
        if gx_cmp_local(p, dt, cmp, v, NULL):
            return 1
        if (i & 15) == 0:
            _wait_pass(tm, GX_WAIT_DRIVING)
    return 0


cdef object _wait(Team tm, str sig, object addrs, object cmp, object value, object dt,
                  object timeout, int mode, bint block, bint single):
    """Every wait/test form: arguments checked here, the waiting in wait_words."""
    cdef int c = _as_cmp(cmp, sig)
    cdef int d = _as_dt(dt, sig)
    cdef double t = _as_timeout(timeout, sig)
    cdef Py_ssize_t n, i, got
    cdef bint vector = False
    cdef uintptr_t a1
    cdef bytes csig
    cdef const char* cs
    cdef void* p
    cdef gx_val v1, seen
    tm.check_alive()
    if single:
        # one word already satisfied: answered here, nothing allocated
        a1 = _as_addr(addrs, sig, "addr")
        v1.u64 = 0
        _to_val(d, value, &v1, sig, "value")
        if gx_own_word(&tm.c, a1, d, &p) == GX_OK:
            if gx_cmp_local(p, d, c, v1, &seen):
                return 0
            if block and _gil_spin > 0 and _spin_word(&tm.c, p, d, c, v1):
                return 0
        csig = _csig(sig)
        cs = csig
        with nogil:
            got = wait_words(&tm.c, &a1, 1, d, c, &v1, False, GX_WAIT_ANY, block, t, NULL, &i, cs)
        return 0 if got else None
    else:
        if isinstance(addrs, (str, bytes)) or not hasattr(addrs, "__len__"):
            raise TypeError(f"{_fn(sig)}: addrs must be a sequence of word addresses, "
                            f"got {_got(addrs)}")
        addrs = list(addrs)
    n = len(addrs)
    if n == 0:
        raise ArgumentError(f"{_fn(sig)}: addrs is empty")
    if not single and not isinstance(value, (str, bytes)) and hasattr(value, "__len__"):
        values = list(value)
        if len(values) != n:
            raise ArgumentError(f"{_fn(sig)}: {len(values)} values for {n} words; give one value "
                                "or one per word")
        vector = True
    else:
        values = [value]
    cdef uintptr_t* a = <uintptr_t*>malloc(n * sizeof(uintptr_t) + len(values) * sizeof(gx_val)
                                           + n * sizeof(Py_ssize_t))
    if a == NULL:
        raise MemoryError()
    cdef gx_val* v = <gx_val*>(a + n)
    cdef Py_ssize_t* idx = <Py_ssize_t*>(v + len(values))
    csig = _csig(sig)
    cs = csig
    try:
        for i in range(n):
            a[i] = _as_addr(addrs[i], sig, "addr" if single else f"addrs[{i}]")
        for i in range(len(values)):
            v[i].u64 = 0
            _to_val(d, values[i], &v[i], sig, "value" if not vector else f"value[{i}]")
        with nogil:
            got = wait_words(&tm.c, a, n, d, c, v, vector, mode, block, t, NULL, idx, cs)
        if mode == GX_WAIT_ALL:
            return True if not block and got == n else (None if block else False)
        if mode == GX_WAIT_ANY:
            if got:
                return idx[0]
            return None
        return [idx[i] for i in range(got)]
    finally:
        free(a)
