# ---- the table handed to the core ------------------------------------------

cdef gx_op* _new_op(ofi_ep* ep, ofi_peer* t, int mode, int cat) except NULL nogil:
    cdef gx_op* op = <gx_op*>calloc(1, sizeof(gx_op))
    if op == NULL:
        with gil:
            raise MemoryError()
    op.ep = ep
    op.t = t
    op.born_deaths = ep.fresh_deaths
    gx_add_long(&ep.live, 1)
    if t != NULL:
        gx_add_long(&t.out, 1)
    if cat == GX_CAT_RMW:
        op.amo = 1
        gx_add_long(&ep.amo_out, 1)
    if mode == GX_NBI or mode == GX_NBI_LCNOW:
        op.nbi = cat + 1
        op.epoch = ep.nbi_epoch
        gx_add_long(&ep.nbi[cat], 1)
    if t != NULL and ep.dom.probe:
        _note_target(ep, t)
    return op


cdef inline void _note_target(ofi_ep* ep, ofi_peer* t) noexcept nogil:
    """Remember t among the last 8 targets of the endpoint's ops: a stalled
    nbi_wait or drain asks whether they are still there (_gone).  Racing
    threads at worst overwrite each other's entry (every entry is some
    target's ofi_peer, kept until the domain closes)."""
    cdef int i
    for i in range(8):
        if ep.recent[i] == t:
            return
    ep.recent_i += 1
    ep.recent[ep.recent_i & 7] = t


cdef void _drop_new(gx_op* op) noexcept nogil:
    """Undo _new_op for an op the provider refused."""
    _release_mrs(op)
    gx_add_long(&op.ep.live, -1)
    if op.t != NULL:
        gx_add_long(&op.t.out, -1)
    if op.amo:
        gx_add_long(&op.ep.amo_out, -1)
    if op.nbi and op.epoch == op.ep.nbi_epoch:
        gx_add_long(&op.ep.nbi[op.nbi - 1], -1)
    free(op)


cdef inline bint _in_hmem(ofi_ep* ep, const void* p, size_t n) noexcept nogil:
    """Whether [p, p+n) lies in the endpoint's natively registered segment
    (hmem.pxi; device memory: never injected, never copied by the CPU)."""
    return ep.hmem and <uintptr_t>p >= ep.seg_lo and <uintptr_t>p + n <= ep.seg_hi


cdef int _desc(ofi_ep* ep, gx_op* op, void* p, size_t n, uint64_t access, void** desc) noexcept nogil:
    """Local descriptor for [p, p+n): the segment's when inside it (a natively
    registered device segment's too), the landing zone's when in the zone of
    such a segment (hmem.pxi), none when the provider does not need one (no
    FI_MR_LOCAL), else an on-the-fly registration."""
    cdef uintptr_t a = <uintptr_t>p
    desc[0] = NULL
    if a >= ep.seg_lo and a + n <= ep.seg_hi and ep.seg_mr != NULL:
        desc[0] = ep.seg_desc
        return 0
    if a >= ep.zone_lo and a + n <= ep.zone_hi and ep.zone_mr != NULL:
        desc[0] = ep.zone_desc
        return 0
    if not (ep.dom.mr_mode & FI_MR_LOCAL):
        return 0
    cdef fid_mr* mr
    cdef int rc = fi_mr_reg(ep.dom.domain, p, n, access, 0, 0, 0, &mr, NULL)
    if rc < 0:
        return rc          # the caller drops the op, then raises
    op.mr[op.nmr] = mr
    op.nmr += 1
    desc[0] = fi_mr_desc(mr)
    return 0


cdef inline uint64_t _raddr(ofi_peer* t, uintptr_t remote) noexcept nogil:
    return remote - t.g.remote_base + t.net_base


cdef extern from *:
    """
    #include <errno.h>
    #include <fcntl.h>
    #include <netinet/in.h>
    #include <stdio.h>
    #include <poll.h>
    #include <string.h>
    #include <sys/socket.h>
    #include <sys/stat.h>
    #include <unistd.h>
    /* 1 when a TCP connection to the socket address `addr` (len bytes, as
       tcp;ofi_rxm names its endpoints) is refused: nothing listens there.
       0 when it is accepted, does not answer within `ms`, or `addr` is not
       an IPv4/IPv6 socket address. */
    static int gx_tcp_refused(const void *addr, size_t len, int ms) {
        struct sockaddr_storage ss;
        socklen_t slen, el;
        struct pollfd p;
        int fd, rc, err = 0, refused = 0;
        if (len < sizeof(sa_family_t) || len > sizeof(ss)) return 0;
        memset(&ss, 0, sizeof(ss));
        memcpy(&ss, addr, len);
        if (ss.ss_family == AF_INET) slen = sizeof(struct sockaddr_in);
        else if (ss.ss_family == AF_INET6) slen = sizeof(struct sockaddr_in6);
        else return 0;
        if (len < slen) return 0;
        fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) return 0;
        rc = connect(fd, (struct sockaddr *)&ss, slen);
        if (rc < 0 && errno == ECONNREFUSED) {
            refused = 1;
        } else if (rc < 0 && errno == EINPROGRESS) {
            p.fd = fd;
            p.events = POLLOUT;
            p.revents = 0;
            el = sizeof(err);
            if (poll(&p, 1, ms) == 1 &&
                    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) == 0 && err == ECONNREFUSED)
                refused = 1;
        }
        close(fd);
        return refused;
    }
    /* 1 when the shm provider's region named `name` (len bytes, as shm names
       its endpoints: "<pid>:<n>:<m>", maybe after "fi_shm://" or "fi_ns://")
       is gone from /dev/shm: its endpoint closed.  0 when it is there or the
       name is not of that form. */
    static int gx_shm_path(const char *name, size_t len, char *path, size_t size) {
        size_t n = strnlen(name, len);
        const char *sep = memchr(name, '/', n);
        if (n >= 9 && memcmp(name, "fi_shm://", 9) == 0) { name += 9; n -= 9; }
        else if (n >= 8 && memcmp(name, "fi_ns://", 8) == 0) { name += 8; n -= 8; }
        else if (sep != NULL) return 0;
        if (n == 0 || n + 10 > size || memchr(name, '/', n) != NULL) return 0;
        memcpy(path, "/dev/shm/", 9);
        memcpy(path + 9, name, n);
        path[9 + n] = 0;
        return 1;
    }
    /* 1 when the file at `path` does not exist. */
    static int gx_path_gone(const char *path) {
        struct stat st;
        return stat(path, &st) != 0 && errno == ENOENT;
    }
    /* 1 when process `pid` of this node exists and is not a zombie (a killed
       process stays one until its parent reaps it), from /proc/<pid>/stat. */
    static int gx_proc_alive(int pid) {
        char path[64], buf[512];
        const char *p;
        ssize_t n;
        int fd;
        if (pid <= 0) return 0;
        snprintf(path, sizeof(path), "/proc/%d/stat", pid);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) return 0;
        n = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        if (n <= 0) return 0;
        buf[n] = 0;
        p = strrchr(buf, ')');
        if (p == NULL || p[1] != ' ') return 0;
        return p[2] != 'Z' && p[2] != 'X' && p[2] != 'x';
    }
    """
    int gx_tcp_refused(const void* addr, size_t len, int ms) nogil
    int gx_proc_alive(int pid) nogil
    int gx_shm_path(const char* name, size_t len, char* path, size_t size) nogil
    int gx_path_gone(const char* path) nogil


cdef bint _gone(ofi_dom* dom, ofi_peer* t, double since) noexcept nogil:
    """Whether the target endpoint of t is closed, for an operation whose
    queue has been full since ``since``.  tcp;ofi_rxm retries a connection to
    an endpoint that closed after its publication (ep.destroy(), or its
    process finalized) for ever, answering -FI_EAGAIN (fuzz seeds 528,
    384362), and shm finds the closed endpoint's queue full for ever (seed
    608): after PROBE_AFTER_MS of that, and at most every PROBE_EVERY_MS per
    target, ask whether anything still listens at its name (a refused TCP
    connection) or its shared-memory region still exists.  An answer of
    "closed" is kept (t.gone) until the next publication of the endpoint."""
    cdef double now
    cdef int closed = 0
    if t == NULL or dom.probe == 0:
        return False
    if t.gone:
        return True
    now = _now()
    if now - since < PROBE_AFTER_MS * 1e-3 or now - t.probe_at < PROBE_EVERY_MS * 1e-3:
        return False
    t.probe_at = now
    closed = _closed_now(dom, t)
    if closed:
        t.gone = 1
    return closed != 0


cdef int _check_open(ofi_ep* ep, ofi_peer* t, const char* what) except -1 nogil:
    """Over shm, before an operation goes to t: is its endpoint still open?
    shm completes an endpoint's operations that need the target's answer
    (reads, delivery-complete writes, fetching atomics) in the order they
    were issued, and a closed endpoint never answers: one such operation
    towards an endpoint destroyed since its publication (or whose process
    finalized) held up every later one of the same local endpoint, to any
    peer, until GEXMK_TIMEOUT -- a TM-pair's connection touch to a live
    peer got no answer in 10 s, then its get hung (fuzz seed 619; _gone
    only catches the stale op itself, after it was queued).  So the
    region of the target endpoint is looked for in /dev/shm (a stat of its
    path, kept per publication) at the first operation to it after each barrier
    (dom.settles) and OPEN_FRESH_MS after the last look; an endpoint found
    closed raises at once (CommunicationError naming it, or PeerDeadError)
    and nothing is queued.  An access racing with the closure, with no
    barrier between, can still meet it.  The library's synchronisation
    endpoints (index 2**30 and up) close only at finalize: not looked at."""
    cdef double now
    cdef bint closed
    if ep.dom.probe != PROBE_SHM or t == NULL or t.g.ep_index >= (1 << 30):
        return 0
    if t.gone:
        return _raise_gone(t, what)
    now = _now_coarse()
    if t.open_epoch == ep.dom.settles and now - t.open_at < OPEN_FRESH_MS * 1e-3:
        return 0
    closed = _closed_now(ep.dom, t)
    if closed:
        t.gone = 1
        return _raise_gone(t, what)
    t.open_epoch = ep.dom.settles
    t.open_at = now
    return 0


cdef void _shm_path(ofi_dom* dom, ofi_peer* t) noexcept nogil:
    """t.shm_path: its region's path in /dev/shm, found once per publication
    (a look then costs one stat); "-" when its name gives none."""
    cdef char name[256]
    cdef size_t n = sizeof(name)
    memset(name, 0, sizeof(name))
    if fi_av_lookup(dom.av, t.net_addr, name, &n) != 0 or n > sizeof(name) or \
            not gx_shm_path(name, n, t.shm_path, sizeof(t.shm_path)):
        t.shm_path[0] = ord('-')
        t.shm_path[1] = 0


cdef bint _closed_now(ofi_dom* dom, ofi_peer* t) noexcept nogil:
    """Whether t's endpoint is closed, asked now (see _gone): over shm one
    stat of its region's path (_shm_path, found once per publication), over
    tcp a connection attempt to its name."""
    cdef char name[256]
    cdef size_t n = sizeof(name)
    if dom.probe == PROBE_SHM:
        if t.shm_path[0] == 0:
            _shm_path(dom, t)
        return t.shm_path[0] == ord('/') and gx_path_gone(t.shm_path) != 0
    if dom.probe != PROBE_TCP:
        return False
    memset(name, 0, sizeof(name))
    if fi_av_lookup(dom.av, t.net_addr, name, &n) != 0 or n > sizeof(name):
        return False
    return gx_tcp_refused(name, n, PROBE_WAIT_MS) != 0


cdef int _raise_gone_now(ofi_peer* t, const char* what) except -1 with gil:
    raise CommunicationError(
        f"{what.decode()}: endpoint {t.g.ep_index} of job rank {t.g.jobrank} was closed "
        f"(destroyed, or its process finalized) after it was published; nothing there "
        f"takes operations any more")


cdef int _raise_gone(ofi_peer* t, const char* what) except -1 nogil:
    """Raise for an op towards t, whose endpoint was found closed (_gone):
    PeerDeadError if the death notice of its process comes within
    DEATH_GRACE_MS (a killed process's endpoint refuses connections too, and
    its notice arrives on a thread of its own: waited for without the GIL),
    else CommunicationError naming the closed endpoint.  A process of this
    node that still runs only destroyed its endpoint: no wait."""
    cdef int i
    cdef timespec ts
    ts.tv_sec = 0
    ts.tv_nsec = 1000000
    if t.gone == 2 or (t.local and gx_proc_alive(t.g.pid)):
        return _raise_gone_now(t, what)
    for i in range(DEATH_GRACE_MS):
        if t.g.dead:
            return _raise_dead(t, what)
        nanosleep(&ts, NULL)
    t.gone = 2                  # no notice came: it left; the next op need not wait
    return _raise_gone_now(t, what)


cdef int _retry(ofi_ep* ep, ofi_peer* t, double* deadline) noexcept nogil:
    """After -FI_EAGAIN: progress, then 0 to retry, ISSUE_DEAD when the target
    died, ISSUE_GONE when its endpoint closed since its publication (_gone),
    ISSUE_TIMEOUT when the queue stayed full past GEXMK_TIMEOUT."""
    cdef double since
    if _progress_all(ep.dom) < 0:
        return ISSUE_DEAD
    if t != NULL and t.g.dead:
        return ISSUE_DEAD
    if t != NULL and t.gone:
        return ISSUE_GONE
    if deadline[0] == 0:
        deadline[0] = _now() + ep.dom.timeout
    elif _now() > deadline[0]:
        return ISSUE_TIMEOUT
    elif _gone(ep.dom, t, deadline[0] - ep.dom.timeout):
        return ISSUE_GONE
    since = deadline[0] - ep.dom.timeout        # when the retries began
    if _poisoned(ep.dom, ep.fresh_deaths, &since):
        return ISSUE_POISONED
    return 0


cdef int _issue_failed(ofi_peer* t, ssize_t rc, const char* call) except -1 nogil:
    if rc == ISSUE_DEAD:
        if t != NULL:
            return _raise_dead(t, call)
        return check(call, -FI_EIO)
    if rc == ISSUE_POISONED:
        return _raise_poisoned(-1, t, call)
    if rc == ISSUE_GONE:
        return _raise_gone(t, call)
    if rc == ISSUE_TIMEOUT:
        with gil:
            raise GxTimeoutError(f"{call.decode()}: the provider's queue stayed full for "
                                 f"GEXMK_TIMEOUT; is the target alive and progressing?")
    return check(call, rc)


cdef bint _touch(ofi_ep* ep, ofi_peer* t, bint put=True) noexcept nogil:
    """Remember t as owing a flush; False when the list is full.  Slots are
    claimed and released with atomics, so threads may race here and with a
    sync: at worst a target is flushed twice.  ``put``: for an implicit put
    (False: a put_signal's signal message), marked in touched_put.  A race
    with a sync may leave a mark on a slot it no longer holds (its next
    target's death is then reported by a put sync), or let a sync take a
    put's target unmarked (its death then left to quiet); every target is
    flushed all the same."""
    cdef int i
    for i in range(MAX_TOUCHED):
        if gx_load_ptr(<void**>&ep.touched[i]) == <void*>t:
            if put and not gx_load_int(&ep.touched_put[i]):
                gx_xchg_int(&ep.touched_put[i], 1)      # (a locked write only when unmarked)
            return True
    for i in range(MAX_TOUCHED):
        if gx_claim_ptr(<void**>&ep.touched[i], <void*>t):
            if put:
                gx_xchg_int(&ep.touched_put[i], 1)
            return True
    return False


cdef int _flush(ofi_ep* ep, ofi_peer* only, int cats=GX_CAT_ALL) except -1 nogil:
    """Remote completion of implicit puts issued with transmit completion:
    an 8-byte read from each target they went to, ordered after them by the
    provider's read-after-write ordering, completes when they have landed.
    `only`: flush just that target now (its slot could not be kept).
    ``cats``: the sync's categories (1 << GX_CAT_*).  A blocking put_signal's
    signal message is flushed here too, but only a sync with the RMW category
    completes it (quiet, nbi_wait(EC_ALL): README): a sync without it
    (nbi_wait(EC_PUT)) does not report the death of a target that only
    put_signals touched (fuzz seed 180060), and leaves it listed for the
    sync that does; it flushes the live ones."""
    cdef gx_op* ops[16]
    cdef bint lenient[16]
    cdef ofi_peer* kept[16]
    cdef int nkept = 0
    cdef gx_op* op
    cdef ofi_peer* t
    cdef ofi_peer* bad = NULL
    cdef int i, n = 0, err = 0
    cdef bint put, sig_only_ok = not (cats & (1 << GX_CAT_RMW))
    cdef ssize_t rc
    cdef void* desc
    cdef double deadline = 0
    # a close under the connection cap waits while a target is out of the list
    # and its read not yet posted (conncap.pxi)
    gx_add_long(&ep.dom.flushing, 1)
    gx_mem_fence()
    for i in range(MAX_TOUCHED + 1):
        if only != NULL:
            if i > 0:
                break
            t = only
            put = True
        elif i == MAX_TOUCHED:
            break
        else:
            t = <ofi_peer*>gx_xchg_ptr(<void**>&ep.touched[i], NULL)
            put = gx_xchg_int(&ep.touched_put[i], 0) != 0
        if t == NULL or t.g.size == 0:
            continue
        lenient[n] = sig_only_ok and not put
        if lenient[n] and t.g.dead:
            # a put_signal's, to the dead: not this sync's to report; left for
            # the quiet that completes it
            kept[nkept] = t
            nkept += 1
            continue
        ops[n] = _new_op(ep, t, GX_BLOCKING, GX_CAT_GET)
        rc = _desc(ep, ops[n], &ops[n].result, 1, FI_READ, &desc)
        while rc == 0:
            rc = fi_read(ep.ep, &ops[n].result, 1, desc, t.net_addr, t.net_base, t.net_key, ops[n])
            if not _again(rc, ep, t):
                break
            rc = _retry(ep, t, &deadline)
        if rc < 0:
            _drop_new(ops[n])
            if not (lenient[n] and t.g.dead):
                err = <int>rc
                bad = t
            continue
        n += 1
    for i in range(nkept):
        _touch(ep, kept[i], False)
    gx_add_long(&ep.dom.flushing, -1)
    # every read is waited for (or, after one failed, orphaned: not leaked)
    i = 0
    try:
        while i < n:
            op = ops[i]
            i += 1
            # a put_signal's only (lenient): its target's death is not this sync's
            _wait_op(op, op.t, "flush (nbi_wait/quiet)", NULL, False, lenient[i - 1])
    finally:
        while i < n:
            _orphan(ops[i])
            i += 1
    if err:
        # a target that died while its read was posted: PeerDeadError, not EIO
        return _issue_failed(bad, err, "fi_read (flush of implicit puts)")
    return 0


cdef int net_put(void* epv, ofi_peer* t, uintptr_t remote, void* local, size_t n,
                 int mode, void** out) except -1 nogil:
    while _net_put(epv, t, remote, local, n, mode, out) == 1:
        pass                    # held up by a death on an endpoint since moved (_wait_op)
    return 0


cdef int _net_put(void* epv, ofi_peer* t, uintptr_t remote, void* local, size_t n,
                  int mode, void** out) except -1 nogil:
    cdef ofi_ep* ep = <ofi_ep*>epv
    cdef gx_op* op
    cdef iovec iov
    cdef void* desc
    cdef fi_rma_iov riov
    cdef fi_msg_rma msg
    cdef uint64_t flags = FI_COMPLETION | FI_DELIVERY_COMPLETE
    cdef ssize_t rc
    cdef bint ordered = False
    cdef double deadline = 0
    if n == 0:
        return _nothing_to_move(out)
    _app_active(ep.dom)
    if mode == GX_NBI_LCNOW and (n > ep.dom.inject_size or _in_hmem(ep, local, n)):
        # the source is reusable only once the put completes (device memory is
        # never injected: the provider would copy it with the CPU)
        mode = GX_BLOCKING
    if (mode == GX_NBI or mode == GX_NBI_LCNOW) and ep.dom.ordered \
            and n <= ep.dom.max_order_raw and _touch(ep, t):
        # Transmit completion now, remote completion by the flush at sync time.
        ordered = True
        flags = 0
        if mode == GX_NBI_LCNOW:
            # inject: copied at issue (no completion entry and no op to
            # allocate, where the provider allows: _inject_write)
            _inject_write(ep, ep.ep, t, local, n, _raddr(t, remote), t.net_key, False, 0,
                          "fi_inject_write")
            return _ensure_flush(ep, t)
        flags = FI_COMPLETION
    # decided before the op exists: once posted, its completion may be read (and
    # an implicit op freed) by the progress thread at any moment
    op = _new_op(ep, t, mode, GX_CAT_PUT)
    rc = _desc(ep, op, local, n, FI_WRITE, &desc)
    if rc < 0:
        _drop_new(op)
        return check("fi_mr_reg", rc)
    if not ordered:
        flags = FI_COMPLETION | FI_DELIVERY_COMPLETE
    if mode == GX_NBI_LCNOW:
        flags |= FI_INJECT            # buffer copied at issue: reusable on return
    iov.iov_base = local
    iov.iov_len = n
    riov.addr = _raddr(t, remote)
    riov.len = n
    riov.key = t.net_key
    memset(&msg, 0, sizeof(msg))
    msg.msg_iov = &iov
    msg.desc = &desc
    msg.iov_count = 1
    msg.addr = t.net_addr
    msg.rma_iov = &riov
    msg.rma_iov_count = 1
    msg.context = op
    while True:
        rc = fi_writemsg(ep.ep, &msg, flags)
        if not _again(rc, ep, t):
            break
        rc = _retry(ep, t, &deadline)
        if rc:
            break
    if _posted(op, t, rc, mode, out, "fi_writemsg", "put", mode == GX_BLOCKING) == 1:
        return 1
    if ordered:
        _ensure_flush(ep, t)
    return 0


cdef int _inject_write(ofi_ep* ep, fid_ep* fep, ofi_peer* t, const void* local, size_t n,
                       uint64_t raddr, uint64_t key, bint with_data, uint64_t data,
                       const char* what, bint internal=False) except -1 nogil:
    """An injected write (at most the inject size; the source is reusable on
    return; nothing to wait for).  Over tcp;ofi_rxm (dom.inject_ctx) it
    carries an op as its context: tcp reports the failure of an
    injected RMA write (its peer died, its endpoint closed) without a
    context, and rxm dereferences that NULL (SIGSEGV in the next CQ read,
    libfabric 1.17 and later).  With FI_COMPLETION rxm copies the data into
    a buffer of its own whose failure names our op.  The application's
    write (internal False) is an implicit op: its failure is recorded for
    nbi_wait (ep.nbi_err).  A write of the library's own (internal: a staged
    request's descriptor, a doorbell) is orphaned at once, as a ring's
    release is: the staged operation it serves reports what goes wrong by
    its own wait, and a late failure (the peer finalized meanwhile) must
    not be raised again by a later nbi_wait, finalize's included (fuzz seed
    101413)."""
    cdef gx_op* op
    cdef iovec iov
    cdef fi_rma_iov riov
    cdef fi_msg_rma msg
    cdef ssize_t rc
    cdef double deadline = 0
    if not ep.dom.inject_ctx:
        while True:
            if with_data:
                rc = fi_inject_writedata(fep, local, n, data, t.net_addr, raddr, key)
            else:
                rc = fi_inject_write(fep, local, n, t.net_addr, raddr, key)
            if not _again(rc, ep, t):
                break
            rc = _retry(ep, t, &deadline)
            if rc:
                break
        if rc < 0:
            return _issue_failed(t, rc, what)
        return 0
    op = _new_op(ep, t, GX_NB if internal else GX_NBI, GX_CAT_PUT)
    iov.iov_base = <void*>local
    iov.iov_len = n
    riov.addr = raddr
    riov.len = n
    riov.key = key
    memset(&msg, 0, sizeof(msg))
    msg.msg_iov = &iov
    msg.iov_count = 1
    msg.addr = t.net_addr
    msg.rma_iov = &riov
    msg.rma_iov_count = 1
    msg.context = op
    msg.data = data
    while True:
        rc = fi_writemsg(fep, &msg, FI_INJECT | FI_COMPLETION | (FI_REMOTE_CQ_DATA if with_data else 0))
        if not _again(rc, ep, t):
            break
        rc = _retry(ep, t, &deadline)
        if rc:
            break
    if internal:
        if rc < 0:
            _drop_new(op)
            return _issue_failed(t, rc, what)
        _orphan(op)
        return 0
    return _posted(op, t, rc, GX_NBI, NULL, what, "put")


cdef inline int _nothing_to_move(void** out) noexcept nogil:
    """A zero-byte put or get (its range already checked by the core) is
    complete at issue; the provider never sees it: shm never completes a
    zero-byte write that asks for FI_DELIVERY_COMPLETE (blocking and NB puts
    hung)."""
    if out != NULL:
        out[0] = NULL
    return 0


cdef int _posted(gx_op* op, ofi_peer* t, ssize_t rc, int mode, void** out,
                 const char* call, const char* what, bint reissue=False) except -1 nogil:
    """After posting op (rc from the post): drop it and raise on failure; wait
    for it when blocking; hand it out when NB (implicit ops need nothing).
    1: a blocking op to issue again (``reissue``, _wait_op)."""
    if rc < 0:
        _drop_new(op)
        return _issue_failed(t, rc, call)
    if mode == GX_BLOCKING:
        return _wait_op(op, t, what, NULL, reissue)
    if mode == GX_NB:
        out[0] = op
    return 0


cdef int _ensure_flush(ofi_ep* ep, ofi_peer* t, bint put=True) except -1 nogil:
    """After posting an ordered implicit put (``put`` False: a put_signal's
    signal message): its target must be in the list (a concurrent sync may
    have taken it out); if the list is full, flush now."""
    if not _touch(ep, t, put):
        return _flush(ep, t)
    return 0


cdef int net_get(void* epv, ofi_peer* t, uintptr_t remote, void* local, size_t n,
                 int mode, void** out) except -1 nogil:
    while _net_get(epv, t, remote, local, n, mode, out) == 1:
        pass                    # held up by a death on an endpoint since moved (_wait_op)
    return 0


cdef int _net_get(void* epv, ofi_peer* t, uintptr_t remote, void* local, size_t n,
                  int mode, void** out) except -1 nogil:
    cdef ofi_ep* ep = <ofi_ep*>epv
    cdef gx_op* op
    cdef void* desc
    cdef ssize_t rc
    cdef double deadline = 0
    if n == 0:
        return _nothing_to_move(out)
    op = _new_op(ep, t, mode, GX_CAT_GET)
    _app_active(ep.dom)
    rc = _desc(ep, op, local, n, FI_READ, &desc)
    if rc < 0:
        _drop_new(op)
        return check("fi_mr_reg", rc)
    while True:
        rc = fi_read(ep.ep, local, n, desc, t.net_addr, _raddr(t, remote), t.net_key, op)
        if not _again(rc, ep, t):
            break
        rc = _retry(ep, t, &deadline)
        if rc:
            break
    return _posted(op, t, rc, mode, out, "fi_read", "get", mode == GX_BLOCKING)


