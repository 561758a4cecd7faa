# ---- tracing (private, for bench/waiting.py's hop breakdown) -------------------
#
# GEXMK_OFI_TRACE=1: the waits and the progress thread log (time, event) pairs
# into a ring read back with _trace_dump(); off, each site costs one load.
cdef double* _tr_t = NULL
cdef int* _tr_e = NULL
cdef long _tr_n = 0
cdef long _tr_cap = 0

cdef enum:
    TR_SPIN_IN = 1          # an application thread starts waiting for an op (_spin)
    TR_SPIN_OUT = 2         # ... the op completed
    TR_SLEEP = 10           # a wait sleeps in the CQ fds (_wait_sleep)
    TR_WOKE = 11            # ... traffic woke it
    TR_TIMEOUT = 12         # ... its sleep ran out
    TR_PASS = 13            # ... it read every CQ after waking
    TR_TIMEOUT_PASS = 17    # ... after its sleep ran out
    TR_HOT_IN = 14          # a poller opens a window after traffic (hot_win)
    TR_HOT_CAUGHT = 15      # ... which ends, having seen traffic
    TR_HOT_EMPTY = 16       # ... which ends, having seen none
    TR_PT_SLEEP = 20        # the progress thread sleeps in the CQ fds
    TR_PT_WOKE = 21
    TR_PT_PASS = 22
    TR_PT_BURST = 23        # ... polls a burst of passes in its window after a wake
    TR_PT_ASIDE = 24        # ... naps while an application thread drives progress
    TR_PT_HOT_IN = 25       # ... opens its window of bursts after traffic (_pt_open)
    TR_PT_HOT_CAUGHT = 26   # ... which ends, having seen traffic
    TR_PT_HOT_EMPTY = 27    # ... which ends, having seen none
    # packed VIS puts through a landing zone (vis.pxi, staged.pxi; bench/diagnostics/vis_timeline.py)
    TR_VIS_IN = 30          # a packed put starts (_stg_vis_put)
    TR_VIS_POSTED = 31      # ... posted a slot's data
    TR_VIS_SLOT_IN = 32     # ... waits for a ring slot the lander has not served yet
    TR_VIS_SLOT_OUT = 33
    TR_VIS_PK_IN = 34       # ... waits for the packer thread
    TR_VIS_PK_OUT = 35
    TR_VIS_ALL_IN = 36      # ... every slot posted: waits for the last to be served
    TR_VIS_OUT = 37
    TR_STG_POLL = 38        # a read of a ring's done words (_stg_wait_slot)
    TR_VIS_POST_IN = 39     # ... posts a slot's data (to TR_VIS_POSTED)
    TR_LAND_IN = 40         # the lander unpacks (gathers) one slot (_land_vis)
    TR_LAND_OUT = 41
    TR_LAND_NAP = 42        # the lander naps (nothing came)
    TR_PK_IN = 43           # the packer thread packs a slot
    TR_PK_OUT = 44


cdef extern from "<sched.h>" nogil:
    int sched_getcpu()


cdef inline void _tr(int ev) noexcept nogil:
    """Log ``ev`` (the CPU this thread runs on in bits 24 and up)."""
    cdef long i
    if _tr_t != NULL:
        i = gx_add_long(&_tr_n, 1) - 1
        if i < _tr_cap:
            _tr_t[i] = _now()
            _tr_e[i] = ev | (sched_getcpu() << 24)


def _trace_dump(reset=True):
    """Private: the [(seconds, event | cpu << 24)] logged since the last
    reset (GEXMK_OFI_TRACE=1); events are the TR_* values."""
    global _tr_n
    n = min(_tr_n, _tr_cap)
    out = [(_tr_t[i], _tr_e[i]) for i in range(n)]
    if reset:
        _tr_n = 0
    return out


if os.environ.get("GEXMK_OFI_TRACE", "0") not in ("", "0"):
    _tr_cap = 1 << 20
    _tr_t = <double*>calloc(_tr_cap, sizeof(double))
    _tr_e = <int*>calloc(_tr_cap, sizeof(int))


# ---- polling for a while after traffic ---------------------------------------------
#
# A wait that sleeps in the CQ fds (_wait_sleep) pays a wake-up per operation
# (a blocked poll() woken by the send: ~10 us more per 8 B op than a target
# that polls, raw libfabric over tcp;ofi_rxm).  Woken by traffic, it polls
# instead for a window (hot_win) that each further sign of traffic extends.
# (The progress thread keeps its fixed window with yields: _progress_thread.)  The window
# adapts: one that saw traffic doubles the next (up to the caller's longest),
# one that saw none halves it, down to none.  What that guards against: on a
# small node the initiator may share the poller's core (a third busy thread,
# another job), and then a window only delays the initiator's next step by its
# whole length; its windows see nothing, so they shrink away, and the poller
# sleeps after each wake (HOT_PROBE tries again now and then).

cdef inline void _hot_open(hot_win* h, double now, double longest) noexcept nogil:
    """Traffic woke a sleeper at ``now``: poll for the window from then."""
    if longest <= 0:
        return
    if HOT_FIXED:
        h.until = now + longest
        _tr(TR_HOT_IN)
        return
    if not h.init:
        h.init = 1
        h.win = longest
        h.probe_every = HOT_PROBE
    if h.win <= 0:
        h.wakes += 1
        if h.wakes < h.probe_every:
            return
        h.wakes = 0
        h.win = HOT_PROBE_WIN if HOT_PROBE_WIN < longest else longest
        h.probing = 1
    h.until = now + h.win
    _tr(TR_HOT_IN)
    h.caught = 0
    h.n = 0
    h.nbusy = 0


cdef inline bint _hot(hot_win* h, double now, double longest) noexcept nogil:
    """Whether to poll (rather than sleep) at ``now``; once a window has
    ended, the next one's length (traffic in it or not)."""
    if h.until == 0:
        return False
    if now < h.until:
        return True
    if HOT_FIXED:
        h.until = 0
        return False
    _tr(TR_HOT_CAUGHT if h.caught else TR_HOT_EMPTY)
    if h.caught:
        h.win = h.win * 2 if h.win * 2 < longest else longest
        h.probe_every = HOT_PROBE
    elif h.probing:
        h.win = 0
        if h.probe_every < HOT_PROBE_MAX:
            h.probe_every *= 2
    else:
        h.win = h.win / 2 if h.win / 2 >= HOT_MIN else 0
    h.probing = 0
    h.until = 0
    return False


cdef inline double _cpu_now() noexcept nogil:
    """This thread's CPU time (s)."""
    cdef timespec ts
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


cdef inline void _hot_min(hot_win* h, double dt, long neps) noexcept nogil:
    """Keep the shortest pass (or burst) over the current endpoints: one
    measured while the process had fewer (a pass reads each endpoint's CQs)
    would make every later pass look busy, and a window open for ever (the
    initiator's progress thread polled through its 0.3 s sleep, traced)."""
    if h.neps != neps:
        h.neps = neps
        h.pass_min = 0
    if h.pass_min == 0 or dt < h.pass_min:
        h.pass_min = dt


cdef inline void _hot_pass(hot_win* h, double c0, double c1, double t1, int got,
                           long neps, double factor=2) noexcept nogil:
    """A polling pass that ended at t1 took the CPU time c1 - c0 and read
    ``got`` CQ entries: traffic (entries, or a pass that worked much longer
    than an idle one, ``factor`` x the shortest + HOT_BUSY: an RMA the
    provider served at this target leaves no entry) keeps the window open."""
    cdef double dt = c1 - c0
    _hot_min(h, dt, neps)
    if (got > 0 or dt > factor * h.pass_min + HOT_BUSY) and not HOT_FIXED:
        h.caught = 1
        h.until = t1 + h.win


# The progress thread's window counts bursts of passes (PT_BURST passes and
# a yield), not wall time: a thread that other jobs keep off the CPU does not
# use its window up meanwhile (a wall-clock window then ended before the next
# op came, and each op paid a wake-up: 8 B put/get to an idle target 24-120
# us at load 10, 13.5 us with main's fixed window), while one that polls on
# the initiator's CPU and sees nothing uses it up quickly (~10 us a burst).

cdef inline void _pt_open(hot_win* h) noexcept nogil:
    """Traffic woke the progress thread: poll for the window's bursts."""
    if not h.init:
        h.init = 1
        h.win = PT_HOT / PT_BURST_S
        h.probe_every = HOT_PROBE
    if h.win < 1:
        h.wakes += 1
        if h.wakes < h.probe_every:
            return
        h.wakes = 0
        h.win = HOT_PROBE_WIN / PT_BURST_S
        h.probing = 1
    h.left = <int>h.win
    h.caught = 0
    h.n = 0
    h.nbusy = 0
    _tr(TR_PT_HOT_IN)


cdef inline void _pt_burst(hot_win* h, double dt, int got, long neps) noexcept nogil:
    """A burst took the CPU time dt and read ``got`` CQ entries.  One that
    worked PT_BUSY longer than the shortest served traffic (an 8 B put adds
    ~10 us to a ~10 us burst), and PT_BUSY_REL of the shortest more: a burst
    over many endpoints varies by more than PT_BUSY when idle (42 endpoints:
    263 us the shortest, 271 the median, 305 p90), and a window judged busy
    on that alone never closed (a core busy for good, traced).  The window
    starts afresh once at least three
    bursts and one in PT_BUSY_SHARE did since it last did -- not on any one
    or two: 0.5-2.5 % of idle bursts run that much longer (interrupts, a
    preempted vCPU), and a thread that starves the initiator on its CPU
    still serves one op now and then: with two in eight, such a window stayed
    open for 249 bursts (an op 7.7 ms, traced).  Traffic that runs at the
    network's speed keeps 50-85 % of the bursts busy.
    Once the window's bursts are used up, the next window's length: twice
    (traffic in it) or half (none, down to none) or, after a probe, none."""
    _hot_min(h, dt, neps)
    h.n += 1
    if got > 0 or dt > h.pass_min * (1 + PT_BUSY_REL) + PT_BUSY:
        h.nbusy += 1
    if h.nbusy >= 3 and h.nbusy * PT_BUSY_SHARE >= h.n:
        h.caught = 1
        h.left = <int>h.win
        h.n = 0
        h.nbusy = 0
        return
    h.left -= 1
    if h.left > 0:
        return
    _tr(TR_PT_HOT_CAUGHT if h.caught else TR_PT_HOT_EMPTY)
    if h.caught:
        h.win = h.win * 2 if h.win * 2 < PT_HOT / PT_BURST_S else PT_HOT / PT_BURST_S
        h.probe_every = HOT_PROBE
    elif h.probing:
        h.win = 0
        if h.probe_every < HOT_PROBE_MAX:
            h.probe_every *= 2
    else:
        h.win = h.win / 2 if h.win / 2 >= HOT_MIN / PT_BURST_S else 0
    h.probing = 0


# ---- a short scheduler slice ------------------------------------------------------

cdef extern from *:
    """
    #include <stdint.h>
    #include <unistd.h>
    #include <sys/syscall.h>
    struct gx_sched_attr {
        uint32_t size, sched_policy;
        uint64_t sched_flags;
        int32_t sched_nice;
        uint32_t sched_priority;
        uint64_t sched_runtime, sched_deadline, sched_period;
    };
    /* Ask the fair scheduler (EEVDF, Linux >= 6.12) for a slice of ns for the
       calling thread: a thread with a shorter slice than the one running
       preempts it when it wakes, rather than at the next tick.  Policy and
       nice unchanged; older kernels ignore the runtime.  0, or -errno. */
    static int gx_set_slice(uint64_t ns) {
    #if defined(SYS_sched_getattr) && defined(SYS_sched_setattr)
        struct gx_sched_attr a;
        if (syscall(SYS_sched_getattr, 0, &a, sizeof(a), 0) != 0) return -1;
        if (a.sched_policy != 0 /* SCHED_OTHER */) return -2;
        a.size = sizeof(a);
        a.sched_runtime = ns;
        return syscall(SYS_sched_setattr, 0, &a, 0) == 0 ? 0 : -3;
    #else
        return -4;
    #endif
    }
    """
    int gx_set_slice(uint64_t ns) nogil


# ---- progress ------------------------------------------------------------------

# The CQ gate.  Reading a CQ is what serves peers' operations (manual
# progress): a peer's command is looked up in the domain's registrations
# then.  An unbinding swaps a registration for a dummy under the same key
# (endpoint.pxi _retire): close, then register again, and an access served in
# between finds no key.  shm drops such a command without an answer (libfabric
# 1.17 smr_progress_cmd_rma returns before the response), so the peer's
# operation never completes, and since shm completes an endpoint's answered
# operations in issue order, neither does anything that endpoint issues after
# it, to anyone (fuzz seed 9122: a stale staged access, a hang of the peer's
# next operations; the gap is microseconds, but a thread preempted in it on a
# loaded node widens it to milliseconds).  So the swap closes the gate and
# waits until no thread is in a CQ read; while it is closed, a CQ read reads
# nothing (returns 0: the caller polls again), and what peers sent waits in
# their queues until the dummy holds the key.
cdef long _cq_gate = 0          # swaps in progress
cdef long _cq_in = 0            # threads reading a CQ
cdef double _gate_gap = 0       # private, for tests: seconds a swap waits between close and register


cdef inline bint _cq_enter() noexcept nogil:
    """Whether this thread may read a CQ (then it calls _cq_leave)."""
    if gx_load_long(&_cq_gate):
        return False
    gx_add_long(&_cq_in, 1)
    gx_mem_fence()              # the count is seen before the gate is read (Dekker)
    if gx_load_long(&_cq_gate):
        gx_add_long(&_cq_in, -1)
        return False
    return True


cdef inline void _cq_leave() noexcept nogil:
    gx_add_long(&_cq_in, -1)


cdef void _gate_close() noexcept nogil:
    """Keep every thread out of CQ reads until _gate_open (no GIL held: a
    reader may need it to finish)."""
    cdef timespec ts
    gx_add_long(&_cq_gate, 1)
    gx_mem_fence()
    ts.tv_sec = 0
    ts.tv_nsec = 20000
    while gx_load_long(&_cq_in) > 0:
        nanosleep(&ts, NULL)


cdef void _gate_gap_hold() noexcept nogil:
    """Private, for tests: where a registration swap is between its close
    and its new registration, wait _gate_gap seconds."""
    cdef timespec ts
    if _gate_gap > 0:
        ts.tv_sec = <long>_gate_gap
        ts.tv_nsec = <long>((_gate_gap - <long>_gate_gap) * 1e9)
        nanosleep(&ts, NULL)


cdef void _gate_open() noexcept nogil:
    gx_add_long(&_cq_gate, -1)


cdef bint _gate_wait_open() noexcept nogil:
    """Whether the CQ gate was closed (then, once it is open again): for a
    reader that must tell "empty" from "not read" (completion.pxi _settle)."""
    if not gx_load_long(&_cq_gate):
        return False
    while gx_load_long(&_cq_gate):
        sched_yield()
    return True


def _set_gate_gap(double seconds):
    """Private, for tests: hold every registration swap this long between
    its close and its new registration, as a thread preempted there would
    (a test of the gate)."""
    global _gate_gap
    _gate_gap = seconds


cdef int _read_cq(fid_cq* cq) noexcept nogil:
    """Complete what one CQ holds (reading it drives manual progress of the
    endpoints bound to it): how many, or -1 on a CQ failure.  0 while the
    CQ gate is closed."""
    cdef fi_cq_entry entries[16]
    cdef ssize_t n, i
    if not _cq_enter():
        return 0
    n = fi_cq_read(cq, entries, 16)
    if n > 0:
        for i in range(n):
            _complete(<gx_op*>entries[i].op_context, 0)
        _cq_leave()
        return <int>n
    n = _cq_empty(cq, n)
    _cq_leave()
    return <int>n


cdef int _cq_empty(fid_cq* cq, ssize_t n) noexcept nogil:
    """What a fi_cq_read that returned no entry (n) means: an error entry is
    completed (1), nothing there (0), or the CQ failed (-1)."""
    cdef fi_cq_err_entry e
    if n == -FI_EAVAIL:
        memset(&e, 0, sizeof(e))
        if fi_cq_readerr(cq, &e, 0) > 0 and e.op_context != NULL:
            _complete(<gx_op*>e.op_context, e.err if e.err else FI_EIO)
            return 1
        return 0
    if n == -FI_EAGAIN or n == 0:
        return 0
    return -1


cdef int _read_ep_cq(ofi_ep* ep) noexcept nogil:
    """_read_cq of the endpoint's (RMA) CQ.  Where it carries signal messages
    (signal.pxi), one thread at a time reads it: two threads taking entries
    side by side could apply two signals to one word out of their arrival
    order (SET 120 overwritten by the SET 119 read just before it).  A thread
    that finds the CQ taken leaves it to its reader: 0."""
    cdef int n
    if ep.rx == NULL and not ep.dom.sig_data:
        return _read_cq(ep.cq)
    if gx_xchg_int(&ep.rx_lock, 1) != 0:
        return 0
    # a domain's CQs all have the data format where sig_data is set (endpoint.pxi)
    n = _read_data_cq(ep) if ep.dom.sig_data else _read_cq(ep.cq)
    gx_xchg_int(&ep.rx_lock, 0)
    return n


cdef int _read_data_cq(ofi_ep* ep) noexcept nogil:
    """_read_cq of an FI_CQ_FORMAT_DATA CQ: an entry without a context
    carrying remote CQ data is a put_signal's signal that rode on its data
    write (signal.pxi), applied here; the rest complete as usual."""
    cdef fi_cq_data_entry entries[16]
    cdef ssize_t n, i
    if not _cq_enter():
        return 0
    n = fi_cq_read(ep.cq, entries, 16)
    if n > 0:
        for i in range(n):
            if entries[i].op_context != NULL:
                _complete(<gx_op*>entries[i].op_context, 0)
            elif entries[i].flags & FI_REMOTE_CQ_DATA:
                _sig_data_landed(ep, entries[i].data)
        _cq_leave()
        return <int>n
    n = _cq_empty(ep.cq, n)
    _cq_leave()
    return <int>n


cdef int _progress_quiet(ofi_ep* ep) noexcept nogil:
    """_progress for callers that cannot raise: -1 on a CQ failure.  A split
    endpoint's atomics CQ is read on every pass while this endpoint has
    atomics in flight, else on one pass in ATOMICS_EVERY: each read is a
    progress pass of its own (a poll() of its sockets), and reading it
    always would slow every put and get for the sake of incoming atomics."""
    cdef int n = _read_ep_cq(ep), m
    if ep.acq != NULL and n >= 0:
        ep.apass += 1
        if gx_load_long(&ep.amo_out) > 0 or ep.apass % ATOMICS_EVERY == 0:
            m = _read_cq(ep.acq)
            n = -1 if m < 0 else n + m
    return n



cdef int _wait_set(ofi_dom* d, fid** cqfids, pollfd* pfds) noexcept nogil:
    """The CQs (and their fds) of every live endpoint, for the progress thread
    to sleep on: how many, or 0 when it cannot sleep (an endpoint without a
    wait fd, or more than SLEEP_EPS endpoints).  The caller counts itself
    among d.readers."""
    cdef long i, n = gx_load_long(&d.neps)
    cdef int nfd = 0
    cdef ofi_ep* ep
    if n == 0 or n > SLEEP_EPS:
        return 0
    for i in range(n):
        ep = d.eps[i]
        if not ep.can_wait:
            return 0
        nfd = _ep_wait_fds(ep, cqfids, pfds, nfd)
    return nfd


cdef int _ep_wait_fds(ofi_ep* ep, fid** cqfids, pollfd* pfds, int nfd) noexcept nogil:
    """Append the endpoint's CQs (its atomics CQ too) and their wait fds at
    index nfd, ready for fi_trywait and poll(): the new count."""
    cqfids[nfd] = &ep.cq.fid
    pfds[nfd].fd = ep.wait_fd
    pfds[nfd].events = POLLIN
    pfds[nfd].revents = 0
    nfd += 1
    if ep.acq != NULL:
        cqfids[nfd] = &ep.acq.fid
        pfds[nfd].fd = ep.await_fd
        pfds[nfd].events = POLLIN
        pfds[nfd].revents = 0
        nfd += 1
    return nfd


cdef int _read_woken(ofi_dom* d, pollfd* pfds, int nfd, bint every) noexcept nogil:
    """After a sleep in poll() on the fds _wait_set gathered (pfds, nfd of
    them): read the CQs whose fd poll() found readable -- or every CQ
    (``every``: the sleep timed out, or it was not slept), and those of an
    endpoint registered since.  Reading a CQ is a progress pass over its
    endpoint's sockets (an epoll_wait and reads on tcp): a target woken by
    an 8 B put spent 6.8 us reading its 3-4 CQs where one had work.  A CQ
    whose fd was not ready had nothing that poll() could see; what comes to it
    meanwhile leaves its fd ready for the next poll().  Entries read, or -1 on
    a CQ failure.  The caller counts itself among d.readers."""
    cdef long i, n = gx_load_long(&d.neps)
    cdef int k = 0, got = 0, r
    cdef bint rd
    cdef ofi_ep* e
    for i in range(n):
        e = d.eps[i]
        rd = every or k >= nfd or pfds[k].revents != 0
        k += 1
        if rd:
            r = _read_ep_cq(e)
            if r < 0:
                return -1
            got += r
        if e.acq != NULL:
            rd = every or k >= nfd or pfds[k].revents != 0
            k += 1
            if rd:
                r = _read_cq(e.acq)
                if r < 0:
                    return -1
                got += r
    return got


cdef void _progress_thread(ofi_dom* d, bint spin, volatile int* stop) noexcept nogil:
    cdef timespec ts
    cdef fi_cq_entry entries[16]
    cdef ssize_t got
    cdef long i, n
    cdef fid* cqfids[2 * SLEEP_EPS]
    cdef int nfd
    cdef pollfd pfds[2 * SLEEP_EPS]
    cdef double hot_until = 0
    cdef double idle, c0, dt
    cdef hot_win pth            # its window after traffic (PT_ADAPT)
    cdef bint trying
    cdef int rc = 0
    memset(&pth, 0, sizeof(pth))
    # this thread's naps are short and frequent: 1 us timer slack, not 50
    prctl(PR_SET_TIMERSLACK, 1000, 0, 0, 0)
    if PT_SLICE_US > 0:
        gx_set_slice(<uint64_t>PT_SLICE_US * 1000)
    while not stop[0]:
        idle = d.driven_until - _now()
        if idle > 0:
            # a wait polls the CQs itself (GX_WAIT_DRIVING): keep off until it
            # stops renewing its claim (it went to sleep, or got its word)
            ts.tv_sec = 0
            ts.tv_nsec = <long>(idle * 1e9) + 5000
            pth.left = 0        # a window does not outlive standing aside
            nanosleep(&ts, NULL)
            continue
        idle = _now_coarse() - d.last_app
        if gx_load_long(&d.waiters) > 0 or idle < STAND_ASIDE:
            # An application thread drives progress itself (or just did): stay
            # off its CQs and its CPU until it has left them alone for
            # STAND_ASIDE.  Nap until then, not in short steps: on 2 cores a
            # wake-up every 100 us costs a streaming sender ~3% of its bandwidth.
            # A wait asleep in the CQ fds (waiters, long idle) serves them
            # itself: check back every STAND_ASIDE, not four times as often
            # (each wake-up of this thread is CPU a quiet wait should not cost).
            idle = STAND_ASIDE - idle if idle < STAND_ASIDE else \
                (STAND_ASIDE if gx_load_long(&d.waiters) > 0 else STAND_ASIDE / 4)
            ts.tv_sec = 0
            ts.tv_nsec = <long>(idle * 1e9) + 50000
            _tr(TR_PT_ASIDE)
            # a window does not outlive standing aside: left open, it resumed
            # when the application left its wait, with nothing to say that
            # traffic still came (a test found the thread polling on, never
            # asleep, through a whole numpy phase)
            pth.left = 0
            nanosleep(&ts, NULL)
            if gx_load_long(&d.waiters) == 0:
                # an application that only issues (never waits) must not keep
                # this process's targets unserved: one pass per nap
                _progress_all(d)
            continue
        if gx_load_long(&d.quiesce) > 0:
            # an endpoint is leaving (_unregister waits for d.readers == 0)
            ts.tv_sec = 0
            ts.tv_nsec = 50000
            nanosleep(&ts, NULL)
            continue
        n = gx_load_long(&d.neps)
        if n == 0:
            ts.tv_sec = 0
            ts.tv_nsec = 1000000
            nanosleep(&ts, NULL)
            continue
        if not spin and PT_ADAPT and pth.left > 0:
            # woken by traffic lately: bursts of passes with a yield between,
            # in a window of bursts that adapts as the waits' does (_pt_burst):
            # bursts that worked longer than an idle one (an RMA served) extend
            # it; one that ends with none seen halves the next.  Why adapt: a
            # thread woken by a socket send runs on the sender's CPU (wake-
            # affine); where the initiator shares that CPU, as on a busy
            # 2-core node, sched_yield does not hand it over (the fair
            # scheduler's yield only moves this thread's deadline; a spinning
            # initiator is not eligible), and every op waited for the end of a
            # fixed 1 ms window (traced: 7358 bursts on the initiator's CPU in
            # one run, 8 B put/get to an idle target 42-146 us, p90 1 ms).
            c0 = _cpu_now()
            got = 0
            for i in range(16):
                nfd = _progress_all(d)
                if nfd > 0:
                    got += nfd
                if gx_load_long(&d.waiters) > 0:
                    # an application thread drives progress now: the window
                    # ends (unjudged: this burst was cut short)
                    pth.left = 0
                    break
            if pth.left > 0:
                dt = _cpu_now() - c0
                _pt_burst(&pth, dt, <int>got, n)
                if _tr_t != NULL:
                    _tr(<int>(500000 + (dt if dt < 0.3 else 0.3) * 1e7) + (4000000 if got > 0 else 0))
                sched_yield()
            continue
        if spin or _now() < hot_until:
            # spin mode, or just woken by traffic: poll without sleeping for a
            # while (a request/response exchange will bring more at once; a
            # sleeping thread costs a wake-up per message).  Passes come in
            # bursts: a clock read and a yield per pass cost a receiving target
            # ~10% of its bandwidth; an application thread that starts to wait
            # still takes over within one pass.  Not the waits' adaptive window
            # (hot_win): woken onto the initiator's CPU (wake-affine), this
            # thread's yields between bursts let the initiator go on (8 B
            # put/get to an idle target: 10.9-11.2 us so, 23 us adaptive, at
            # load < 1.2), where a wait polls without yielding (on a loaded
            # machine a yield hands the core to another job).
            _tr(TR_PT_BURST)
            for i in range(16):
                _progress_all(d)
                if gx_load_long(&d.waiters) > 0:
                    break
            sched_yield()
            continue
        # Every endpoint has a wait fd (and there are few): sleep in poll() on
        # all their CQs' fds, woken at once by traffic on any (which it then
        # progresses), free while idle.  Otherwise (many endpoints, or shm
        # without a wait fd): poll all with short naps.  A process holds two
        # endpoints as a rule (the primordial one and the hidden sync one):
        # napping in 20 us steps there cost a two-per-node barrier more than
        # the network round itself.
        gx_add_long(&d.readers, 1)
        gx_mem_fence()
        nfd = _wait_set(d, cqfids, pfds)
        if nfd > 0:
            # fi_trywait says whether sleeping is safe (nothing left to
            # progress on any of them); then poll() the fds, as libfabric
            # prescribes.
            got = -1            # every CQ, unless poll() says which
            # (a trywait may drive progress: it keeps to the CQ gate, and a
            # closed gate is work pending)
            trying = _cq_enter()
            if trying:
                rc = fi_trywait(d.fabric, cqfids, nfd)
                _cq_leave()
            if trying and rc == 0:
                _tr(TR_PT_SLEEP)
                got = poll(pfds, nfd, 20)
                if got > 0:
                    _tr(TR_PT_WOKE)
                    if PT_ADAPT:
                        _pt_open(&pth)
                    else:
                        hot_until = _now() + PT_HOT
            elif PT_ADAPT:
                _pt_open(&pth)
            else:
                hot_until = _now() + PT_HOT     # work was pending: stay awake
            if got == 0:
                # woken by nothing (its 20 ms ran out): the passes of before
                n = gx_load_long(&d.neps)
                for i in range(n):
                    _progress_quiet(d.eps[i])
            else:
                _read_woken(d, pfds, nfd, got < 0 or not PT_WOKEN_ONLY)
            _tr(TR_PT_PASS)
            gx_add_long(&d.readers, -1)
            continue
        gx_add_long(&d.readers, -1)
        _progress_all(d)
        ts.tv_sec = 0
        ts.tv_nsec = 20000
        nanosleep(&ts, NULL)


