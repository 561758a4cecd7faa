# ---- errors ------------------------------------------------------------------

cdef int _raise(const char* call, ssize_t rc) except -1 with gil:
    code = -rc if rc < 0 else rc
    raise OFIError(call.decode(), code, fi_strerror(<int>code).decode())


cdef inline int check(const char* call, ssize_t rc) except -1 nogil:
    """One check for every libfabric return code: raise only on failure."""
    if rc < 0:
        return _raise(call, rc)
    return 0


cdef int _raise_dead(ofi_peer* t, const char* what) except -1 with gil:
    raise PeerDeadError(f"{what.decode()}: job rank {t.g.jobrank} has died")


cdef inline bint _after_death(ofi_dom* dom, long born) noexcept nogil:
    """Whether an op issued on an initiator endpoint opened after ``born``
    deaths (gx_op.born_deaths) may be held up by a death since (over shm:
    see _poisoned)."""
    return dom.deaths > born and dom.shared_q


cdef inline bint _poisoned(ofi_dom* dom, long born, double* since) noexcept nogil:
    """Whether a wait that began at *since (0: now, set here) for an op issued
    on an initiator endpoint opened after ``born`` deaths (gx_op.born_deaths)
    has to give up because a peer was killed since: over shm operations
    between survivors can stall for good (fuzz seeds 104, 107, 109, 119, 139 on ofi-shm).  shm
    completes an endpoint's operations that need the target's answer
    (reads, delivery-complete writes, fetching atomics) in issue order, and a
    killed process answers nothing: one such op of this endpoint towards it
    -- in flight at its death, or queued before its death notice came --
    holds up every later one, to any peer (seen: a get queued to a process
    that had just killed itself, then a get to a live survivor on the same
    endpoint stalled; without the first get it completed).  A process killed
    while it held a lock in a survivor's region would stall it too (not
    seen).  After a death, an operation that has not completed
    DEATH_GRACE_MS after both the death and the start of its wait is taken
    as stalled by it (PeerDeadError, _raise_poisoned) rather than waited for
    until GEXMK_TIMEOUT.  An endpoint that had ops in flight at a death's
    notice issues later ones on a fresh libfabric endpoint
    (OfiEndpoint.fresh_initiator), which that death cannot hold up; a blocking
    put or get given up so is issued again there (_wait_op's ``reissue``)."""
    cdef double now, t0
    if not _after_death(dom, born):
        return False
    now = _now()
    if since[0] == 0:
        since[0] = now
        return False
    t0 = since[0] if since[0] > dom.death_at else dom.death_at
    return now - t0 > DEATH_GRACE_MS * 1e-3


cdef int _raise_poisoned(int dead, ofi_peer* t, const char* what) except -1 with gil:
    who = f"job rank {t.g.jobrank}" if t != NULL else "its target"
    dead_s = f"job rank {dead}" if dead >= 0 else "a peer"
    raise PeerDeadError(f"{what.decode()}: {who} did not complete it within "
                        f"{DEATH_GRACE_MS / 1000:g} s after {dead_s} died; over "
                        "libfabric shm an operation of this endpoint that the killed process never "
                        "answered holds up the endpoint's later ones, so it is given up")


cdef int _raise_timeout(ofi_peer* t, double secs, const char* what) except -1 with gil:
    who = f"job rank {t.g.jobrank}" if t != NULL else "the target"
    raise GxTimeoutError(f"{what.decode()}: no completion from {who} within {secs:g} s "
                         "(GEXMK_TIMEOUT); is it alive and reachable?")


cdef int _raise_closed(const char* what) except -1 with gil:
    raise StateError(f"{what.decode()}: the endpoint was closed (destroyed or finalized) before "
                     "the operation completed")


cdef int _raise_op_failed(int err, const char* what) except -1 with gil:
    raise OFIError(what.decode(), err, fi_strerror(err).decode() +
                   " (the target became unreachable or no longer has the segment registered: "
                   "destroyed without republishing?)")


cdef int _failed(int err, ofi_peer* t, const char* what) except -1 nogil:
    """An op failed with fi errno ``err``.  A connection-level failure is what
    a peer's death looks like, and the launcher's death notice may trail it:
    wait up to DEATH_GRACE for the notice and report PeerDeadError then."""
    if _death_explains(err, t):
        return _raise_dead(t, what)
    return _raise_op_failed(err, what)


cdef bint _death_explains(int err, ofi_peer* t) noexcept nogil:
    """Whether t's death explains a failure with fi errno ``err``: a
    connection-level error, and t's death noticed within DEATH_GRACE."""
    cdef timespec ts
    cdef int i
    if t != NULL and t.g != NULL and err in (FI_ECANCELED, FI_ENOTCONN, FI_ECONNRESET, FI_ESHUTDOWN,
                                             FI_ECONNREFUSED, FI_ECONNABORTED, FI_EIO,
                                             FI_EHOSTUNREACH, FI_EHOSTDOWN, FI_ENETUNREACH):
        ts.tv_sec = 0
        ts.tv_nsec = 1000000
        for i in range(DEATH_GRACE_MS):
            if t.g.dead:
                return True
            nanosleep(&ts, NULL)
    return False


cdef double _now() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


cdef inline double _now_coarse() noexcept nogil:
    """Seconds, at the kernel tick's resolution, for a few ns."""
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


cdef inline void _app_active(ofi_dom* dom) noexcept nogil:
    """An application thread is driving an endpoint (issuing or waiting): the
    progress thread keeps off for STAND_ASIDE.  The coarse clock is precise
    enough for that, and cheap enough for every issue."""
    dom.last_app = _now_coarse()


# ---- completion ------------------------------------------------------------

cdef void _release_mrs(gx_op* op) noexcept nogil:
    cdef int i
    for i in range(op.nmr):
        fi_close(&op.mr[i].fid)
    op.nmr = 0


cdef void _complete(gx_op* op, int err) noexcept nogil:
    cdef ofi_ep* ep = op.ep
    if op.rx:
        _sig_landed(op, err)        # a signal message arrived (signal.pxi)
        return
    if op.parent != NULL:
        _vis_msg_done(op, err)      # one message of a VIS op (vis.pxi)
        return
    _release_mrs(op)
    gx_add_long(&ep.live, -1)
    if op.t != NULL:
        gx_add_long(&op.t.out, -1)
        if op.rel:
            # a ring's release, which no one waits for (staged.pxi _stg_open
            # writes it again when it failed)
            if err:
                gx_xchg_int(&op.t.stg_rel_lost, 1)
            gx_xchg_int(&op.t.stg_rel_out, 0)
    if op.amo:
        gx_add_long(&ep.amo_out, -1)
    if op.nbi:
        if op.epoch == ep.nbi_epoch:       # else abandoned by nbi_wait after a death
            if err and ep.nbi_err == 0:
                ep.nbi_err_t = op.t
                ep.nbi_err = err
            gx_add_long(&ep.nbi[op.nbi - 1], -1)
        elif op.epoch + 1 == ep.lost_epoch and gx_load_long(&ep.lost) > 0:
            gx_add_long(&ep.lost, -1)      # ... abandoned as gone to a closed endpoint
        free(op)
        return
    op.err = err
    if gx_xchg_int(&op.lost, 0):
        gx_add_long(&ep.lost, -1)
    if gx_xchg_int(&op.state, OP_DONE) == OP_ORPHAN:
        free(op)


cdef int _progress_all(ofi_dom* dom) noexcept nogil:
    """Poll every live endpoint of the process once.  A thread waiting on one
    endpoint keeps serving the others (a target's manual progress), so two
    processes blocked on each other through different endpoints cannot
    deadlock.  -1 when a CQ fails."""
    cdef long i, n
    cdef int got = 0, r
    gx_add_long(&dom.readers, 1)
    gx_mem_fence()
    n = gx_load_long(&dom.neps)
    for i in range(n):
        r = _progress_quiet(dom.eps[i])
        if r < 0:
            got = -1
            break
        got += r
    gx_add_long(&dom.readers, -1)
    return got


cdef int _settle(ofi_dom* dom) noexcept nogil:
    """After a barrier (GX_WAIT_SETTLE): every endpoint that takes signals
    (messages, or remote CQ data) has its CQ read until empty, waiting for a
    thread that holds it (rx_lock) to finish applying what it read.  A peer's
    quiet before the barrier counted its put_signal complete once this
    provider had the message (its flush read is served after it), but the
    signal is written only when a pass here reads the entry: without this a
    barrier's arrivals (other words, on the sync endpoint) could be seen
    first, and the word read before the signal landed (a conformance cell
    under load: put_signal's word still 0 after the barrier).  -1 when a CQ
    fails."""
    cdef long i, n
    cdef int k, r = 0
    cdef ofi_ep* ep
    gx_add_long(&dom.readers, 1)
    gx_mem_fence()
    n = gx_load_long(&dom.neps)
    for i in range(n):
        ep = dom.eps[i]
        if ep.rx == NULL and not dom.sig_data:
            continue
        while gx_xchg_int(&ep.rx_lock, 1) != 0:
            sched_yield()
        for k in range(64):                 # until empty (bounded: new traffic is not ours)
            r = _read_data_cq(ep) if dom.sig_data else _read_cq(ep.cq)
            if r == 0 and _gate_wait_open():
                continue                    # the CQ gate was closed: not read, not empty
            if r <= 0:
                break
        gx_xchg_int(&ep.rx_lock, 0)
        if r < 0:
            break
    gx_add_long(&dom.readers, -1)
    return -1 if r < 0 else 0


cdef int _progress(ofi_ep* ep) except -1 nogil:
    """Read completions from the endpoint's CQ (and drive manual progress)."""
    cdef int n = _progress_quiet(ep)
    if n < 0:
        return check("fi_cq_read", -FI_EIO)
    return n


cdef struct _waiting:
    double t0                   # when the wait's 64th pass ran (0: not yet)
    unsigned long passes
    bint asleep                 # sleeping in the CQ fds (_sleep_pass), dom.waiters given up


cdef int _wait_pass(_waiting* w, ofi_ep* ep, int all_every) noexcept nogil:
    """One pass of a thread that waits for ep's operations (_spin, net_nbi_wait)
    and holds dom.waiters: a poll of ep, and of every endpoint of the process
    every all_every passes.  Once the wait has lasted SPIN_SLEEP_AFTER where ep
    has wait fds, a sleep in them instead (_sleep_pass, as the word waits do:
    woken at once by traffic, polling while traffic flows), with dom.waiters
    given up: _sleep_pass takes it while it sleeps on every endpoint's CQs;
    where it sleeps on ep's alone, the progress thread serves the rest.
    -1 when a CQ fails; 1 when the caller's checks (the target's health, the
    deadline) are due: every 1024th polling pass, every sleeping one; else 0."""
    cdef ofi_dom* dom = ep.dom
    cdef int r
    if w.asleep:
        r = _sleep_pass(ep, SPIN_SLEEP_US)
        if r == 1:
            w.asleep = False        # no wait fd after all: poll on
            gx_add_long(&dom.waiters, 1)
    else:
        # (each pass over an rxm endpoint is a poll of its sockets: an 8 B round
        # trip paid for those of every endpoint, hence all_every)
        r = _progress_all(dom) if all_every <= 1 or w.passes % all_every == 0 \
            else _progress_quiet(ep)
    if r < 0:
        return -1
    w.passes += 1
    if (w.passes & 63) == 0 and not w.asleep and ep.can_wait and SPIN_SLEEP_AFTER >= 0:
        if w.t0 == 0:
            w.t0 = _now()
        elif _now() - w.t0 > SPIN_SLEEP_AFTER:
            w.asleep = True
            gx_add_long(&dom.waiters, -1)
    return 1 if w.asleep or (w.passes & 1023) == 0 else 0


cdef inline void _wait_end(_waiting* w, ofi_dom* dom) noexcept nogil:
    """The wait's dom.waiters back, unless it gave it up asleep."""
    if not w.asleep:
        gx_add_long(&dom.waiters, -1)


cdef int _spin(gx_op* op, ofi_peer* t) noexcept nogil:
    """Progress until op completes: 0, or 1 when its target died, 2 on timeout,
    3 when the CQ itself fails, 4 when its endpoint was closed under it, 5
    when a death over shm stalled it (_poisoned), 6 when the target endpoint
    closed since its publication (shm: the op sits in a queue nobody reads
    any more; rma.pxi _gone).
    While a thread spins here the progress thread stands aside
    (dom.waiters), so the two do not fight over the CQ and cores.

    An op still outstanding after SPIN_SLEEP_AFTER (its target does not
    serve it yet, a long transfer) is waited for in the CQ fds where the
    endpoint has them (_wait_pass); else the passes poll on (no wait fd:
    nothing would wake a sleeper)."""
    cdef ofi_dom* dom = op.ep.dom
    cdef double deadline = 0, since = 0
    cdef int why = 0, r
    cdef _waiting w
    memset(&w, 0, sizeof(w))
    gx_add_long(&dom.waiters, 1)
    _app_active(dom)
    _tr(TR_SPIN_IN)
    while gx_load_int(&op.state) != OP_DONE:
        if gx_load_int(&op.ep.closed):
            # closed: nothing reads its CQ any more (OfiEndpoint.close drained
            # what completed; what did not, it left to the provider)
            if gx_load_int(&op.state) != OP_DONE:
                why = 4
            break
        # (a waiter still serves its peers: every endpoint each SPIN_ALL passes)
        r = _wait_pass(&w, op.ep, SPIN_ALL)
        if r < 0:
            why = 3
            break
        if r:
            if t != NULL and t.g.dead:
                why = 1
                break
            if _poisoned(dom, op.born_deaths, &since):
                why = 5
                break
            if deadline == 0:
                deadline = _now() + dom.timeout
            elif _now() > deadline:
                why = 2
                break
            elif _gone(dom, t, deadline - dom.timeout):
                why = 6
                break
    _tr(TR_SPIN_OUT)
    _app_active(dom)
    _wait_end(&w, dom)
    return why


cdef int _wait_op(gx_op* op, ofi_peer* t, const char* what, gx_val* result=NULL,
                  bint reissue=False, bint dead_ok=False) except -1 nogil:
    """Wait for op, copy its fetched value to *result, free it; raise if it failed.
    ``reissue`` (a blocking put or get, whose buffers the call still holds):
    where the op is held up by a death (_poisoned) on an initiator endpoint
    that has moved to a fresh one since the op was issued, and its target
    lives, the op is orphaned and 1 returned: the caller issues it again.
    Over shm an op issued between a death and its notice sits behind one to
    the dead in the old endpoint's queue (fuzz seed 119: a blocking put to a
    survivor given up 1 s after the death).  Writing the same bytes again, or
    reading again, is safe while the call has not returned: no access that
    the program orders after this op can have run yet.  ``dead_ok``: the
    target's death (noticed, or a connection-level failure its notice then
    explains) ends the wait without an error (rma.pxi _flush)."""
    cdef int err, why = _spin(op, t)
    cdef ofi_ep* ep = op.ep
    if why == 5 and reissue and t != NULL and not t.g.dead \
            and gx_load_long(&ep.fresh_deaths) > op.born_deaths:
        _orphan(op)
        return 1
    if why == 6:
        # orphaned towards a closed endpoint: a drain does not wait for it
        # (exactly one of this and _complete takes it out of ep.lost again)
        gx_add_long(&ep.lost, 1)
        _given_up(t)                # what it has in flight is given up (_recent_gone)
        gx_xchg_int(&op.lost, 1)
        if gx_xchg_int(&op.state, OP_ORPHAN) == OP_DONE:
            if gx_xchg_int(&op.lost, 0):
                gx_add_long(&ep.lost, -1)
            free(op)
    elif why:
        _orphan(op)
    if why:
        if why == 1:
            return 0 if dead_ok else _raise_dead(t, what)
        if why == 2:
            return _raise_timeout(t, ep.dom.timeout, what)     # (op may be freed by now)
        if why == 4:
            return _raise_closed(what)
        if why == 5:
            return _raise_poisoned(ep.dom.last_dead, t, what)
        if why == 6:
            return _raise_gone(t, what)
        return check("fi_cq_read", -FI_EIO)
    if result != NULL:
        result[0] = op.result
    err = op.err
    free(op)
    if err and reissue and _reconnect_refused(ep.dom, t, err):
        return 1                    # never reached the target: issued again
    if err:
        if dead_ok and _death_explains(err, t):
            return 0
        return _failed(err, t, what)
    return 0


cdef void _orphan(gx_op* op) noexcept nogil:
    if gx_xchg_int(&op.state, OP_ORPHAN) == OP_DONE:
        free(op)



cdef int net_test(void* opv, gx_val* result) except -1 nogil:
    cdef gx_op* op = <gx_op*>opv
    if gx_load_int(&op.state) != OP_DONE:
        if gx_load_int(&op.ep.closed):
            _wait_op(op, op.t, "event")     # done meanwhile, or a StateError
            return 1
        _progress(op.ep)
        if gx_load_int(&op.state) != OP_DONE:
            return 0
    _wait_op(op, op.t, "event", result)     # complete: frees it, raises if it failed
    return 1


cdef int net_wait(void* opv, gx_val* result) except -1 nogil:
    cdef gx_op* op = <gx_op*>opv
    return _wait_op(op, op.t, "event wait", result)


cdef void net_orphan(void* opv) noexcept nogil:
    _orphan(<gx_op*>opv)


cdef int net_nbi_wait(void* epv, int categories) except -1 nogil:
    cdef ofi_ep* ep = <ofi_ep*>epv
    cdef double deadline = 0, stalled = 0
    cdef long last = -1, now_out
    cdef int err, c, i, r
    cdef int why = 0
    cdef ofi_peer* gone = NULL
    cdef _waiting w
    if ep.ep == NULL:
        with gil:
            raise StateError("nbi_wait: the endpoint's network context is closed")
    _ring_idle_check(ep)
    memset(&w, 0, sizeof(w))
    gx_add_long(&ep.dom.waiters, 1)
    _app_active(ep.dom)
    for c in range(3):
        if not (categories & (1 << c)):
            continue
        while gx_load_long(&ep.nbi[c]) > 0 and why == 0:
            # every endpoint on every pass; asleep in the CQ fds once the wait
            # has lasted SPIN_SLEEP_AFTER (a get_nbi to a stopped target: 68 %
            # of a core before)
            r = _wait_pass(&w, ep, 1)
            if r < 0:
                why = 3
            elif r:
                if deadline == 0:
                    deadline = _now() + ep.dom.timeout
                elif _now() > deadline:
                    why = 2
                # A peer died and nothing completes: the ops still out went to it.
                now_out = ep.nbi[0] + ep.nbi[1] + ep.nbi[2]
                if now_out != last:
                    last = now_out
                    stalled = _now()
                elif ep.dom.deaths > 0 and _now() - stalled > DEATH_GRACE_MS * 1e-3:
                    why = 1
                else:
                    # nothing completes: did a target of these ops close its endpoint?
                    gone = _recent_gone(ep, stalled, now_out)
                    if gone != NULL:
                        why = 6
    _app_active(ep.dom)
    _wait_end(&w, ep.dom)
    if why == 1:
        _abandon_nbi(ep)
        with gil:
            raise PeerDeadError(f"nbi_wait: implicit operations were still outstanding after job "
                                f"rank {ep.dom.last_dead} died; they are abandoned")
    if why == 6:
        # what is still out (those to the closed endpoint among it) is given up
        ep.lost_epoch = ep.nbi_epoch + 1
        _given_up(gone)
        gx_add_long(&ep.lost, ep.nbi[0] + ep.nbi[1] + ep.nbi[2])
        _abandon_nbi(ep)
        return _raise_gone(gone, "nbi_wait (implicit operations abandoned)")
    if why == 2:
        return _raise_timeout(NULL, ep.dom.timeout, "nbi_wait")
    if why == 3:
        return check("fi_cq_read", -FI_EIO)
    if categories & (1 << GX_CAT_PUT):
        _flush(ep, NULL, categories)
    err = ep.nbi_err
    if err:
        ep.nbi_err = 0
        # a failure that a peer's death explains is reported as that death
        return _failed(err, ep.nbi_err_t, "nbi_wait (an implicit-event operation failed)")
    return 0


cdef inline void _given_up(ofi_peer* t) noexcept nogil:
    """The ops in flight to t (its endpoint closed) are given up: they no
    longer count as its ops in flight (_recent_gone)."""
    gx_add_long(&t.out, -gx_load_long(&t.out))


cdef ofi_peer* _recent_gone(ofi_ep* ep, double since, long need) noexcept nogil:
    """For a wait of the endpoint that has seen nothing complete since
    ``since`` with ``need`` ops still out: one of its recent targets whose
    endpoint closed (rma.pxi _gone), provided the ops in flight to such
    targets can account for all ``need`` and no recent target that is still
    there has any in flight (a slow live target must not be blamed on a
    closed one: fuzz seed 5068, where a connection touch orphaned towards
    the closed endpoint (connect.pxi) counted in its t.out as much as the
    wait's own ops, while an atomic to a live target starved of CPU was what
    the wait waited for); NULL otherwise."""
    cdef int i, j
    cdef ofi_peer* t
    cdef ofi_peer* found = NULL
    cdef long n, out = 0
    cdef bint live_busy = False
    if not ep.dom.probe or need <= 0:
        return NULL
    for i in range(8):
        t = ep.recent[i]
        if t == NULL:
            continue
        for j in range(i):
            if ep.recent[j] == t:
                t = NULL            # counted already
                break
        if t == NULL:
            continue
        n = gx_load_long(&t.out)
        if n <= 0:
            continue
        if _gone(ep.dom, t, since):
            out += n
            found = t
        else:
            live_busy = True
    return found if out >= need and not live_busy else NULL


cdef long _drain(ofi_ep* ep, double secs) noexcept nogil:
    """Progress the endpoint's domain until none of the endpoint's ops is in
    flight (orphans included) or ``secs`` pass; how many are left.  Closing
    a libfabric endpoint under an op in flight is not safe: tcp;ofi_rxm
    (1.17) reports a read whose answer is half received twice, the second
    time without a context, and rxm dereferences it (SIGSEGV).  Once a peer
    has died and nothing completed for DEATH_GRACE_MS, what is left went to
    the dead (an rxm atomic waits for an answer that never comes): it gives
    up on those (ep.stuck), and a later drain does not wait for them again."""
    cdef double now = _now()
    cdef double deadline = now + secs, moved = now
    cdef long n, last = gx_load_long(&ep.live)
    cdef int i
    cdef timespec ts
    ts.tv_sec = 0
    ts.tv_nsec = 20000
    while True:
        n = gx_load_long(&ep.live)
        if n <= 0 or (ep.dom.deaths > 0 and n <= ep.stuck) or n <= ep.lost:
            break
        now = _now()
        if n != last:
            last = n
            moved = now
        elif ep.dom.deaths > 0 and now - moved > DEATH_GRACE_MS * 1e-3:
            ep.stuck = n
            break
        elif ep.dom.probe == PROBE_SHM and _recent_gone(ep, moved, n - ep.lost) != NULL:
            # nothing completes and a target closed its endpoint: what is left
            # went there, into a queue nobody reads any more (over tcp the
            # broken connection fails such ops: nothing to guess there)
            ep.lost = n
            for i in range(8):
                if ep.recent[i] != NULL and ep.recent[i].gone:
                    _given_up(ep.recent[i])
            break
        if now > deadline or _progress_all(ep.dom) < 0:
            break
        nanosleep(&ts, NULL)
    # ops orphaned towards closed endpoints are not waited for: over shm they
    # sit in a queue nobody reads, over tcp their connection failed them
    n = gx_load_long(&ep.live) - gx_load_long(&ep.lost)
    return n if n > 0 else 0


cdef void _abandon_nbi(ofi_ep* ep) noexcept nogil:
    """Forget the endpoint's outstanding implicit ops (their peer died): their
    completions, if any ever comes, no longer count (a new epoch)."""
    cdef int i
    gx_add_long(&ep.nbi_epoch, 1)
    for i in range(3):
        ep.nbi[i] = 0
    for i in range(MAX_TOUCHED):
        gx_xchg_ptr(<void**>&ep.touched[i], NULL)
        gx_xchg_int(&ep.touched_put[i], 0)
    ep.nbi_err = 0


cdef int net_nbi_test(void* epv, int categories) except -1 nogil:
    """1 when no implicit op of ``categories`` is outstanding on the endpoint
    (puts: none in flight and no target owing a flush); progresses first."""
    cdef ofi_ep* ep = <ofi_ep*>epv
    cdef int c, i
    if ep.ep == NULL:
        return 1
    # waits and barriers give back rings left unused (staged.pxi; a few
    # loads unless one is due)
    _ring_idle_check(ep)
    if categories & GX_WAIT_SLEEP:
        return _wait_sleep(ep, GX_WAIT_SLEEP_OF(categories))
    if categories & GX_WAIT_SETTLE:
        gx_add_long(&ep.dom.settles, 1)     # a barrier: shm targets are looked at again
        if _settle(ep.dom) < 0:
            return check("fi_cq_read", -FI_EIO)
        return 1
    if (categories & GX_CAT_ALL) == 0:
        # A wait's progress pass (wait_until and its kin, core.src/signal.pxi).
        # What it waits for is mostly a signal: a message (signal.pxi) in this
        # endpoint's CQ, or an atomic a split endpoint's provider applies when
        # its atomics CQ is read -- so both are read on every pass (not the
        # atomics CQ on one in ATOMICS_EVERY).  While the wait polls on
        # (GX_WAIT_DRIVING) the progress thread keeps off the CPU (WAIT_ASIDE),
        # as it does for _spin: on a small node its polling would take the
        # core from the thread about to see the signal; the wait serves the
        # process's other endpoints on one pass in four meanwhile.
        #
        # A single pass (signal_fetch, a test form) within PASS_FRESH of the
        # end of a wait's pass is left out: the wait that just returned (or
        # that polls in another thread) read the CQs that recently, and the
        # pass costs a few us of syscalls (an epoll_wait per CQ on tcp): the
        # NVSHMEM idiom wait_until, then signal_fetch, paid it on every hop.
        if categories & GX_WAIT_DRIVING:
            ep.dom.driven_until = _now() + WAIT_ASIDE
            ep.wpass += 1
            ep.nap_us = 0           # a wait that falls asleep starts with short naps
            if (ep.wpass & 3) == 0 and _progress_all(ep.dom) < 0:
                return check("fi_cq_read", -FI_EIO)
        elif _now() - ep.dom.wait_pass_end < PASS_FRESH:
            return 1
        elif _unserved(ep.dom):
            # a sleeping wait's pass (or a test's) with no progress thread:
            # serve every endpoint (its own among them), as the waits that poll do above
            if _progress_all(ep.dom) < 0 or (ep.acq != NULL and _read_cq(ep.acq) < 0):
                return check("fi_cq_read", -FI_EIO)
            return 1
        if _read_ep_cq(ep) < 0 or (ep.acq != NULL and _read_cq(ep.acq) < 0):
            return check("fi_cq_read", -FI_EIO)
        if categories & GX_WAIT_DRIVING:
            ep.dom.wait_pass_end = _now()
        return 1
    _progress(ep)
    for c in range(3):
        if categories & (1 << c) and gx_load_long(&ep.nbi[c]) > 0:
            return 0
    if categories & (1 << GX_CAT_PUT):
        for i in range(MAX_TOUCHED):
            if gx_load_ptr(<void**>&ep.touched[i]) != NULL:
                # Every implicit put is handed over; what is left is their
                # remote completion, one read per target (_flush), which only
                # nbi_wait used to issue: a test loop (wait_some on an access
                # region's event, gexmk.nbi_test) then saw them outstanding
                # for ever (fuzz seed 118 over tcp).  The flush is one round
                # trip, bounded by GEXMK_TIMEOUT and death detection.
                _flush(ep, NULL, categories)
                break
    return 1


cdef inline bint _unserved(ofi_dom* d) noexcept nogil:
    """No progress thread serves this manual-progress domain's endpoints:
    a wait on one endpoint must serve the others itself, on every pass, or
    a peer blocked on an operation to another endpoint of this process (a
    put to its segment while this one waits in a barrier) waits for ever."""
    return d.manual and not d.thread_on


cdef void _short_nap(int us) noexcept nogil:
    """Sleep ``us`` microseconds with 1 us of timer slack (the default 50
    would more than triple a 20 us nap), the caller's slack restored after."""
    cdef timespec ts
    cdef int old = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0)
    prctl(PR_SET_TIMERSLACK, 1000, 0, 0, 0)
    ts.tv_sec = 0
    ts.tv_nsec = us * 1000
    nanosleep(&ts, NULL)
    if old > 0:
        prctl(PR_SET_TIMERSLACK, <unsigned long>old, 0, 0, 0)


cdef int _wait_sleep(ofi_ep* ep, int us) except -1 nogil:
    """_sleep_pass, its CQ failure raised."""
    cdef int r = _sleep_pass(ep, us)
    if r < 0:
        return check("fi_cq_read", -FI_EIO)
    return r


cdef int _sleep_pass(ofi_ep* ep, int us) noexcept nogil:
    """A wait whose words only the network writes has nothing left to do but
    sleep (GX_WAIT_SLEEP): block in the CQ wait fds until traffic comes or
    ``us`` microseconds pass, then progress, which lands the signal that
    woke it (signal.pxi).  A futex sleeper would wait out its nap (>= 50 us
    of timer slack, more than a tcp round trip): no one reads the CQs
    meanwhile, as the progress thread stands aside while this process
    issues.  fi_trywait first, as libfabric prescribes.

    Where it can, it sleeps on every endpoint's CQs (_wait_set), serves them
    all on waking, and keeps the progress thread off meanwhile (dom.waiters,
    then driven_until between two passes): two threads asleep on the same
    fds would both wake, and the one that read nothing could go back to
    sleep just before the other lands its signal, until the nap ends.  Else
    (many endpoints, or one without a wait fd) it sleeps on its own and the
    progress thread serves the rest.  2 once done; 1, after a plain pass,
    where the CQs have no wait fd (no sleeping progress thread:
    GEXMK_PROGRESS_THREAD off or spin), and the wait sleeps on its word;
    -1 when a CQ fails."""
    cdef ofi_dom* d = ep.dom
    cdef fid* fids[2 * SLEEP_EPS]
    cdef pollfd pfds[2 * SLEEP_EPS]
    cdef timespec ts
    cdef int nfd, i, rc, got = 0, woke = 0
    cdef bint hot = False
    cdef ofi_ep* e
    cdef double now, c0 = 0
    if not ep.can_wait and _unserved(d):
        # No progress thread: nothing would wake a futex sleeper when the
        # network brings its signal, and a wait's nap (up to 0.1 ms, plus 50 us
        # of timer slack) was a hop's latency -- long enough that the next
        # wait outlived its spin and napped too.  Short precise naps instead,
        # each followed by a pass over every endpoint, growing while the
        # passes find nothing (an idle wait costs ~15 % of a core at most).
        if ep.nap_us < UNSERVED_NAP_US:
            ep.nap_us = UNSERVED_NAP_US
        _short_nap(ep.nap_us if ep.nap_us < us else us)
        i = _progress_all(d)
        if i < 0 or (ep.acq != NULL and _read_cq(ep.acq) < 0):
            return -1
        if i > 0:
            ep.nap_us = UNSERVED_NAP_US
        elif ep.nap_us < us:
            ep.nap_us += ep.nap_us // 2
        d.wait_pass_end = _now()
        return 2
    if not ep.can_wait:
        if _read_ep_cq(ep) < 0 or (ep.acq != NULL and _read_cq(ep.acq) < 0):
            return -1
        return 1
    gx_add_long(&d.readers, 1)
    gx_mem_fence()
    nfd = _wait_set(d, fids, pfds)
    if nfd > 0:
        gx_add_long(&d.waiters, 1)
    else:
        nfd = -_ep_wait_fds(ep, fids, pfds, 0)      # own fds only
    now = _now()
    if nfd > 0:
        hot = _hot(&d.wait_hot, now, WAIT_HOT)
    if hot:
        c0 = _cpu_now()
        # traffic came lately: poll (below) rather than sleep (hot_win).
        # (Not sched_yield between passes: on a loaded 2-core machine each yield
        # handed the core to another job for a time slice, ~200 us per op.)
        pass
    elif fi_trywait(d.fabric, fids, nfd if nfd > 0 else -nfd) == 0:
        # a quiet wait sleeps longer each time (traffic wakes it at once)
        if d.wait_quiet_us < us:
            d.wait_quiet_us = us
        i = d.wait_quiet_us if nfd > 0 else us
        ts.tv_sec = i // 1000000
        ts.tv_nsec = (i % 1000000) * 1000
        _tr(TR_SLEEP)
        if ppoll(pfds, nfd if nfd > 0 else -nfd, &ts, NULL) > 0:
            woke = 2            # poll() says which fds
            _tr(TR_WOKE)
        elif nfd > 0:
            _tr(TR_TIMEOUT)
            d.wait_quiet_us = i * 2 if i < QUIET_SLEEP_MAX_US // 2 else QUIET_SLEEP_MAX_US
    else:
        woke = 1            # work was pending
    if woke:
        d.wait_quiet_us = us
        if nfd > 0:
            _hot_open(&d.wait_hot, _now(), WAIT_HOT)
    # every CQ slept on, atomics CQs included (what woke it may be an atomic
    # its provider applies when that CQ is read)
    rc = 0
    if nfd > 0:
        # those whose fd woke it, after a sleep (_read_woken); every one else
        got = _read_woken(d, pfds, nfd, hot or woke != 2 or not PT_WOKEN_ONLY)
        rc = -1 if got < 0 else 0
        d.driven_until = _now() + WAIT_ASIDE
        gx_add_long(&d.waiters, -1)
        if hot:
            now = _cpu_now() - c0
            _hot_pass(&d.wait_hot, c0, c0 + now, d.driven_until - WAIT_ASIDE, got,
                      gx_load_long(&d.neps))
            if _tr_t != NULL:
                _tr(<int>(1000 + now * 1e7))
        elif _tr_t != NULL:
            _tr(TR_PASS if woke else TR_TIMEOUT_PASS)
    elif _read_ep_cq(ep) < 0 or (ep.acq != NULL and _read_cq(ep.acq) < 0):
        rc = -1
    gx_add_long(&d.readers, -1)
    if rc < 0:
        return -1
    d.wait_pass_end = _now()
    return 2
