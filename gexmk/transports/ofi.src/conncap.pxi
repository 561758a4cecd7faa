# ---- a cap on connected peers, with reuse (issue 23) ----------------------------------
#
# Connection-oriented providers under an RDM endpoint (tcp;ofi_rxm, verbs;ofi_rxm)
# open a connection per (local endpoint, peer endpoint) pair on its first
# operation and keep it for the endpoint's life: a process that talks to every
# rank of a large job holds sockets (and rxm's per-connection state) for all of
# them.  With GEXMK_OFI_MAX_PEERS a process counts the peer processes it holds
# connections with -- those it sent to, and those that announced a connection
# to it (CONN_HELLO, sent with a peer's first operation) -- and past the cap
# closes the connections of the one it used least recently.
#
# A close must lose nothing in flight either way, and neither end may connect
# again before both have let go of the old connections.  rxm closes a
# connection at both ends when an address leaves the AV (FI_AV_REMOVE_CLEANUP,
# bench/README.md "Closing a network connection"), with two traps in
# libfabric 1.17: its removal closes the connection's msg endpoint without
# looking, and one whose shutdown by the peer rxm has already read has none
# (SIGSEGV inside fi_av_remove); and while it holds an old connection from a
# process open, it refuses a new one from that process (EALREADY), failing
# the operation that asked for it.  So a close goes:
#   1. the closing end gates operations to the peer (_gate_enter: new ones
#      wait), drains its own (operations between the gate and their posting,
#      ops in flight, writes owing a flush: implicit puts, ring releases), then
#      asks the peer with a control message (CONN_REQ) on a connection that is
#      still up, and waits for a read ordered after it;
#   2. the peer gates and drains the same way;
#   3. both meet in a rendezvous of the bootstrap (a channel of its own, not a
#      network connection): nothing is in flight between them either way;
#   4. the higher job rank of the pair, always that one, removes the lower's
#      addresses from its AV (closing every connection of the pair, at both
#      ends) and inserts them again; the lower one never removes the higher's,
#      so no removal meets a connection already shut down;
#   5. both meet again; the lower rank then drives progress until rxm has
#      read its connection events three times (_conn_settle), so that it has
#      read every shutdown;
#   6. both meet a third time: ungated.
# Steps 1-6 are the work of a thread per close (OfiTransport._conn_close,
# started by the manager thread, which an eventfd wakes); the first operation
# afterwards connects again (the provider's -FI_ENOTCONN at a re-inserted
# address is retried: _again).  Control messages travel as signal messages
# (signal.pxi), so the cap is enforced where the domain takes those
# (Domain.put_signal_mode "message").

cdef enum:
    CS_IDLE = 0             # ofi_proc.state: no connection counted
    CS_OPEN = 1
    CS_CLOSING = 2          # gated: its connections are being closed
    CLOSE_EVICT = 1         # ofi_proc.want: this process closes it (the cap)
    CLOSE_ASKED = 2         # ... its peer asked (CONN_REQ)
    GATE_NAP_US = 50        # an operation waiting at a closing peer's gate naps this long


# msg[2] of a control message (never a GX_SIGNAL_*): msg[0] the sender's job
# rank, msg[1] the pair's closes so far (ofi_proc.gen)
cdef uint64_t CONN_MSG = 0x636f6e6e00000000ULL
cdef uint64_t CONN_HELLO = CONN_MSG | 1
cdef uint64_t CONN_REQ = CONN_MSG | 2


cdef extern from *:
    """
    #include <stdint.h>
    #include <unistd.h>
    static inline int gx_cas_ptr(void *volatile *p, void *expected, void *v) {
        return __atomic_compare_exchange_n(p, &expected, v, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    }
    static inline void gx_efd_kick(int fd) {
        uint64_t one = 1;
        if (fd >= 0) { ssize_t r = write(fd, &one, sizeof(one)); (void)r; }
    }
    """
    int gx_cas_ptr(void** p, void* expected, void* v) nogil
    void gx_efd_kick(int fd) nogil


cdef inline ofi_proc* _proc(ofi_dom* d, ofi_peer* t) noexcept nogil:
    """t's process under the cap, or NULL (no cap, or not a job rank)."""
    cdef int j
    if d.conn_cap <= 0 or t == NULL or t.g == NULL:
        return NULL
    j = t.g.jobrank
    if j < 0 or j >= d.nprocs:
        return NULL
    return &d.procs[j]


cdef inline bint _again(ssize_t rc, ofi_ep* ep, ofi_peer* t) noexcept nogil:
    """A post to retry after progress (_retry): the queue was full, or the
    peer's connection was closed under the cap and its address inserted
    again, where the provider answers -FI_ENOTCONN until it connects anew
    (rxm 1.17: at once, then the retry after progress goes through)."""
    cdef ofi_proc* pr
    if rc == -FI_EAGAIN:
        return True
    if rc != -FI_ENOTCONN:
        return False
    pr = _proc(ep.dom, t)
    return pr != NULL and pr.gen > 0


cdef int _gate_enter(ofi_ep* ep, ofi_peer* t, ofi_proc** held, const char* what) except -1 nogil:
    """Before an operation goes to t's process: hold its connections open
    (ofi_proc.holds) until the operation is posted (_gate_exit, which the
    caller runs whatever happens).  A process not counted yet is admitted
    (_admit) and told (_hello); at one being closed the operation waits,
    driving progress, until both ends have let go, at most GEXMK_TIMEOUT."""
    cdef ofi_dom* d = ep.dom
    cdef ofi_proc* pr = _proc(d, t)
    cdef double deadline = 0
    cdef bint tell = False
    cdef int st
    held[0] = NULL
    if pr == NULL:
        return 0
    while True:
        gx_add_long(&pr.holds, 1)
        gx_mem_fence()
        st = gx_load_int(&pr.state)
        if st == CS_OPEN:
            pr.used = _now_coarse()
            held[0] = pr
            if tell:
                _hello(ep, t, pr)
            return 0
        gx_add_long(&pr.holds, -1)
        if st == CS_IDLE:
            tell = _admit(d, pr, t.g.jobrank) or tell
            continue
        if t.g.dead:
            return _raise_dead(t, what)
        if deadline == 0:
            deadline = _now() + d.timeout
        elif _now() > deadline:
            return _gate_timeout(t, what)
        _app_active(d)
        _progress_all(d)
        _gate_nap()


cdef void _gate_nap() noexcept with gil:
    """A nap at a closing peer's gate, without the GIL even where the caller
    holds it (the collectives call operations so): the close is run by a
    Python thread of this process (OfiTransport._conn_run)."""
    cdef timespec ts
    ts.tv_sec = 0
    ts.tv_nsec = GATE_NAP_US * 1000
    with nogil:
        nanosleep(&ts, NULL)


cdef inline void _gate_exit(ofi_proc* held) noexcept nogil:
    if held != NULL:
        gx_add_long(&held.holds, -1)


cdef ofi_proc* _gate_try(ofi_dom* d, ofi_peer* t, bint* ok) noexcept nogil:
    """_gate_enter for the library's own background writes (a ring's
    release): never waits; *ok False while t's process is being closed (the
    caller tries again later)."""
    cdef ofi_proc* pr = _proc(d, t)
    cdef int st
    ok[0] = True
    if pr == NULL:
        return NULL
    gx_add_long(&pr.holds, 1)
    gx_mem_fence()
    st = gx_load_int(&pr.state)
    if st == CS_IDLE:
        _admit(d, pr, t.g.jobrank)
        st = gx_load_int(&pr.state)
    if st != CS_OPEN:
        gx_add_long(&pr.holds, -1)
        ok[0] = False
        return NULL
    pr.used = _now_coarse()
    return pr


cdef int _gate_timeout(ofi_peer* t, const char* what) except -1 with gil:
    raise GxTimeoutError(
        f"{what.decode()}: the connections to job rank {t.g.jobrank} were being closed "
        f"(GEXMK_OFI_MAX_PEERS) and the close did not finish within GEXMK_TIMEOUT; is that "
        f"process alive and calling into gexmk or running its progress thread?")


cdef bint _admit(ofi_dom* d, ofi_proc* pr, int j) noexcept nogil:
    """Count process j as connected; past the cap, mark the least recently
    used connected process for closing and wake the manager.  True when j
    was admitted here (it was not counted and is not being closed)."""
    cdef int v = -1
    _spin_lock(&d.conn_lock)
    if pr.state != CS_IDLE:
        gx_xchg_int(&d.conn_lock, 0)
        return False
    pr.used = _now_coarse()
    if not pr.counted:
        pr.counted = 1
        d.nopen += 1
    d.n_admits += 1
    gx_xchg_int(&pr.state, CS_OPEN)
    if d.nopen - _nclosing(d) > d.conn_cap:
        v = _victim(d, j)
        if v >= 0:
            d.procs[v].want = CLOSE_EVICT
            d.n_evicts += 1
            gx_xchg_int(&d.procs[v].state, CS_CLOSING)
    gx_xchg_int(&d.conn_lock, 0)
    if v >= 0:
        gx_mem_fence()
        gx_efd_kick(d.conn_efd)
    return True


cdef int _nclosing(ofi_dom* d) noexcept nogil:
    """Counted processes being closed (conn_lock held)."""
    cdef int j, n = 0
    for j in range(d.nprocs):
        if d.procs[j].counted and d.procs[j].state == CS_CLOSING:
            n += 1
    return n


cdef int _victim(ofi_dom* d, int spare) noexcept nogil:
    """The connected process used least recently (not ``spare``), one with
    no operation at its gate first; -1 when there is none (conn_lock held)."""
    cdef int j, best = -1
    cdef bint best_idle = False, idle
    for j in range(d.nprocs):
        if j == spare or not d.procs[j].counted or d.procs[j].state != CS_OPEN:
            continue
        idle = gx_load_long(&d.procs[j].holds) == 0
        if best < 0 or (idle and not best_idle) or \
                (idle == best_idle and d.procs[j].used < d.procs[best].used):
            best = j
            best_idle = idle
    return best


cdef gx_op* _conn_post(ofi_ep* ep, ofi_peer* t, uint64_t kind, bint wait) except? NULL nogil:
    """Send a control message (kind, this job rank, the pair's gen) to t's
    endpoint: 24 bytes from the op's own operand, compare and result words,
    a send with a completion (never an inject: tcp reports a failed inject
    without a context), counted in t.out until then.  Returns the op (the
    caller waits for it or orphans it); NULL when the queue stayed full
    (wait False: a few tries) or nothing was sent."""
    cdef ofi_proc* pr = _proc(ep.dom, t)
    cdef gx_op* op = _new_op(ep, t, GX_NB, GX_CAT_PUT)
    cdef void* desc
    cdef ssize_t rc
    cdef double deadline = 0
    cdef int tries = 0
    op.operand.u64 = <uint64_t>ep.dom.stg_rank
    op.compare.u64 = <uint64_t>(pr.gen if pr != NULL else 0)
    op.result.u64 = kind
    rc = _desc(ep, op, &op.operand, 3 * sizeof(gx_val), FI_SEND, &desc)
    while rc == 0:
        rc = fi_send(ep.ep, &op.operand, 3 * sizeof(gx_val), desc, t.net_addr, op)
        if not _again(rc, ep, t):
            break
        tries += 1
        if not wait:
            if tries >= 16 or _progress_all(ep.dom) < 0:
                break
            continue
        rc = _retry(ep, t, &deadline)
        if rc:
            break
    if rc < 0 or rc == -FI_EAGAIN:
        _drop_new(op)
        if wait:
            _issue_failed(t, rc, "fi_send (connection control message)")
        return NULL
    return op


cdef void _hello(ofi_ep* ep, ofi_peer* t, ofi_proc* pr) noexcept nogil:
    """Tell t's process it is connected with us (it counts us under its own
    cap), on the connection the operation is about to use.  Advisory: a
    full queue after a few tries, or a peer that takes no signal messages,
    leaves it untold."""
    cdef gx_op* op
    if not t.sig_rx:
        return
    op = _conn_post(ep, t, CONN_HELLO, False)
    if op != NULL:
        _orphan(op)


cdef int _conn_send_req(ofi_ep* ep, ofi_peer* t) except -1 nogil:
    """Ask t's process to close the pair's connections (step 1 above), and
    make sure it has the request before this process goes on: a read
    ordered after the message (FI_ORDER_RAS, as put_signal's flush), so
    that no close at either end can cut it off in flight."""
    cdef gx_op* op = _conn_post(ep, t, CONN_REQ, True)
    cdef gx_op* rd
    cdef void* desc
    cdef ssize_t rc
    cdef double deadline = 0
    try:
        rd = _new_op(ep, t, GX_BLOCKING, GX_CAT_GET)
        rc = _desc(ep, rd, &rd.result, 1, FI_READ, &desc)
        while rc == 0:
            rc = fi_read(ep.ep, &rd.result, 1, desc, t.net_addr, t.net_base, t.net_key, rd)
            if not _again(rc, ep, t):
                break
            rc = _retry(ep, t, &deadline)
            if rc:
                break
        if rc < 0:
            _drop_new(rd)
            return _issue_failed(t, rc, "fi_read (after a connection close request)")
        _wait_op(rd, t, "connection close request")
    finally:
        if op != NULL:
            _wait_op(op, t, "connection close request")
    return 0


cdef void _conn_msg(ofi_dom* d, uint64_t kind, uint64_t src, uint64_t gen) noexcept nogil:
    """A control message arrived (from the CQ, by whichever thread read it)."""
    cdef ofi_proc* pr
    cdef bint kick = False
    if d.conn_cap <= 0 or src >= <uint64_t>d.nprocs:
        gx_add_long(&d.sig_bad, 1)
        return
    pr = &d.procs[src]
    gx_add_long(&d.n_conn_msgs, 1)
    if kind == CONN_HELLO:
        if gx_load_int(&pr.state) == CS_CLOSING:
            pr.hello = 1        # counted again once the close is done
        else:
            _admit(d, pr, <int>src)
        return
    if kind != CONN_REQ:
        gx_add_long(&d.sig_bad, 1)
        return
    _spin_lock(&d.conn_lock)
    if <long>gen < pr.gen:
        pass                    # for a close done since (it reached us late): nothing to do
    elif pr.state != CS_CLOSING:
        pr.gen = <long>gen      # the asker's count (equal, unless a close failed halfway)
        pr.want = CLOSE_ASKED
        d.n_asked += 1
        gx_xchg_int(&pr.state, CS_CLOSING)
        kick = True
    elif <long>gen > pr.gen and <long>gen + 1 > pr.req:
        # asked for the next close while this one is under way: answered
        # after it (_conn_finish).  One for this close (both ends asked at
        # once) needs nothing more.
        pr.req = <long>gen + 1
    gx_xchg_int(&d.conn_lock, 0)
    if kick:
        gx_mem_fence()
        gx_efd_kick(d.conn_efd)


cdef long _conn_unflushed(ofi_dom* d, int j) noexcept nogil:
    """Post a flush read for every target of process j that some endpoint's
    touched list holds (implicit puts sent with transmit completion only):
    their ops then count in ofi_peer.out until the puts have landed.  How
    many could not be posted (a full queue: left in the list, tried again)."""
    cdef long i, n, left = 0
    cdef int k
    cdef ofi_ep* ep
    cdef ofi_peer* t
    gx_add_long(&d.readers, 1)
    gx_mem_fence()
    n = gx_load_long(&d.neps)
    for i in range(n):
        ep = d.eps[i]
        for k in range(MAX_TOUCHED):
            t = <ofi_peer*>gx_load_ptr(<void**>&ep.touched[k])
            if t == NULL or t.g.jobrank != j or t.g.size == 0:
                continue
            if not gx_cas_ptr(<void**>&ep.touched[k], <void*>t, NULL):
                continue
            if _read_behind(ep, t) and not t.g.dead:
                gx_claim_ptr(<void**>&ep.touched[k], <void*>t)
                left += 1
    gx_add_long(&d.readers, -1)
    return left


cdef void _conn_nap() noexcept nogil:
    cdef timespec ts
    ts.tv_sec = 0
    ts.tv_nsec = 100000
    nanosleep(&ts, NULL)


cdef void _conn_finish(ofi_dom* d, int j, bint removed, bint dead) noexcept nogil:
    """After a close of the pair with job rank j (the manager thread):
    uncounted and ungated when it went through (or j died), counted and open
    again when it did not (the cap's next admission picks a victim anew).  A
    peer that announced itself meanwhile is counted again; a close it asked
    for meanwhile starts now."""
    cdef ofi_proc* pr = &d.procs[j]
    cdef bint kick = False
    _spin_lock(&d.conn_lock)
    pr.want = 0
    if removed:
        pr.gen += 1
        pr.reopened = _now()
        gx_add_long(&d.n_closed, 1)
    if removed or dead:
        if pr.counted:
            pr.counted = 0
            d.nopen -= 1
        if pr.hello and not dead:
            pr.hello = 0
            pr.counted = 1
            d.nopen += 1
            gx_xchg_int(&pr.state, CS_OPEN)
        else:
            gx_xchg_int(&pr.state, CS_IDLE)
    else:
        if not pr.counted:
            pr.counted = 1
            d.nopen += 1
        gx_xchg_int(&pr.state, CS_OPEN)
    pr.hello = 0
    if pr.req > pr.gen and not dead:
        # a request for a close after this one: this process answers it now
        pr.req = 0
        pr.want = CLOSE_ASKED
        gx_xchg_int(&pr.state, CS_CLOSING)
        kick = True
    pr.req = 0
    gx_xchg_int(&d.conn_lock, 0)
    if kick:
        gx_mem_fence()
        gx_efd_kick(d.conn_efd)



cdef long _conn_release_flush(ofi_dom* d, ofi_peer* t) noexcept nogil:
    """A ring release of ours to t's zone (t.stg_open 3: sent, its answer not
    read, no one waiting for it): a read from the endpoint it went through,
    ordered after it, so that it has landed before a close.  1 when it could
    not be posted (tried again)."""
    cdef ofi_ep* ep = t.stg_ep
    cdef long left
    if not _release_unanswered(t):
        return 0
    gx_add_long(&d.readers, 1)
    gx_mem_fence()
    if not _ep_live(d, ep):
        gx_add_long(&d.readers, -1)
        return 0
    left = _read_behind(ep, t)
    gx_add_long(&d.readers, -1)
    return left


cdef inline bint _release_unanswered(ofi_peer* t) noexcept nogil:
    """A ring release of ours to t's zone was sent and its answer not read
    (t.stg_open 3), through an endpoint known (t.stg_ep), to a live target
    still published: one that a read ordered after it can make land."""
    return t.stg_open == 3 and t.stg_ep != NULL and t.g != NULL and not t.g.dead and not t.gone


cdef long _read_behind(ofi_ep* ep, ofi_peer* t) noexcept nogil:
    """Post a 1-byte read from ep to t, ordered after what ep wrote or sent
    to it (FI_ORDER_RAW, RAS), its op orphaned and counted in t.out until
    answered: what a close's drain waits for.  1 when the queue stayed full
    (the caller tries again), else 0."""
    cdef gx_op* op = _read_one(ep, t, t.net_base, t.net_key)
    if op == NULL:
        return 1
    _orphan(op)
    return 0


cdef gx_op* _read_one(ofi_ep* ep, ofi_peer* t, uint64_t addr, uint64_t key) noexcept nogil:
    """Post a 1-byte read from ep of t's address addr under key (into the
    op's result word); the op, or NULL when the queue stayed full."""
    cdef gx_op* op = _new_op(ep, t, GX_NB, GX_CAT_GET)
    cdef void* desc
    cdef ssize_t rc = _desc(ep, op, &op.result, 1, FI_READ, &desc)
    cdef int tries
    for tries in range(64):
        if rc < 0:
            break
        rc = fi_read(ep.ep, &op.result, 1, desc, t.net_addr, addr, key, op)
        if rc != -FI_EAGAIN:
            break
        _progress_quiet(ep)
    if rc < 0:
        _drop_new(op)
        return NULL
    return op


cdef bint _reconnect_refused(ofi_dom* d, ofi_peer* t, int err) noexcept nogil:
    """Whether a blocking put or get that failed with ``err`` (its buffers
    still held by the call: _wait_op's reissue) met a connection to t's
    process refused while that process's provider still held the one a
    close under the cap shut (rxm: EALREADY, reported as -FI_ENOTCONN) --
    the operation never reached it, and is issued again, after a nap with
    progress, within GEXMK_TIMEOUT of the close."""
    cdef ofi_proc* pr = _proc(d, t)
    if pr == NULL or pr.gen == 0 or t.g.dead or err != FI_ENOTCONN:
        return False
    if _now() > pr.reopened + d.timeout:
        return False
    gx_add_long(&d.n_reissued, 1)
    _progress_all(d)
    _conn_nap()
    return True
