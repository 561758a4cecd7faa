# ---- vector, indexed and strided transfers (GASNet-EX VIS, issue 22) --------
#
# The core hands the transport a chunk of fragments at a time (bounds already
# checked: every remote block inside the target's segment).  Over the network
# they go as few messages as the provider allows: fi_writemsg / fi_readmsg,
# each carrying up to the provider's iov_limit local and rma_iov_limit remote
# ranges (fragments that run on in memory on either side merge into one
# range), every message posted before anything is waited for (-FI_EAGAIN from
# a full transmit queue: progress and retry).  One op stands for the chunk:
# its messages complete into it (_vis_msg_done) and it completes when the last
# one has, so blocking, NB and its Event, and NBI (each message an implicit op
# of the endpoint, counted like any put or get) keep their meaning.
#
# Staged targets and device memory that the provider cannot reach go through
# the ofi-staged path (staged.pxi): with small blocks packed at the initiator
# into one request per landing slot and unpacked by the target's lander
# (_stg_vis); device blocks to a host target are packed into the endpoint's
# bounce slots by the kind's batched copy (_vis_pack), then
# go as host ranges (_vis_bounced).

from libc.stdlib cimport malloc

cdef enum:
    VIS_IOV_MAX = 64        # iovecs per message we build, whatever the provider allows


cdef size_t _VIS_IOV_CAP = env_int("GEXMK_OFI_VIS_IOV", 0, 0, VIS_IOV_MAX)

cdef enum:
    VIS_LAND_DEFAULT = 64 << 10     # GEXMK_OFI_VIS_LAND: fragments this small (on average) are
                                    # packed through a host target's VIS landing zone
    VIS_LAND_MSGS = 4               # ... where direct they would take more messages than this

# A host segment's VIS landing zone (packed VIS, "ofi-landed"): slots per ring
# and bytes per slot (smaller than a staged zone's: the packing, the wire and
# the unpacking overlap slot by slot).
cdef int _VIS_ZONE_SLOTS = env_int("GEXMK_OFI_VIS_SLOTS", 16, 1, STG_MAX_SLOTS)
cdef size_t _VIS_ZONE_CHUNK = env_int("GEXMK_OFI_VIS_CHUNK", 256 << 10, 16 << 10, 64 << 20)
# Private, for measurements: 0 sends each slot's descriptor after its data's
# delivery completion even where the provider orders writes.
cdef bint _VIS_EARLY = env_int("GEXMK_OFI_VIS_EARLY", 1, 0, 1) != 0


cdef void _vis_limits(ofi_dom* d, fi_info* rma) noexcept nogil:
    """The message shape of VIS transfers, from the RMA endpoints' info."""
    cdef size_t a = rma.tx_attr.iov_limit, b = rma.tx_attr.rma_iov_limit
    a = a if a > 0 else 1
    b = b if b > 0 else 1
    if d.mr_mode & FI_MR_LOCAL:
        a = 3 if a > 3 else a       # a message's own registrations: gx_op.mr[3]
    d.vis_iov = a if a < VIS_IOV_MAX else VIS_IOV_MAX
    d.vis_rma_iov = b if b < VIS_IOV_MAX else VIS_IOV_MAX
    if _VIS_IOV_CAP > 0:            # GEXMK_OFI_VIS_IOV: fewer ranges per message (measurements)
        d.vis_iov = d.vis_iov if d.vis_iov < _VIS_IOV_CAP else _VIS_IOV_CAP
        d.vis_rma_iov = d.vis_rma_iov if d.vis_rma_iov < _VIS_IOV_CAP else _VIS_IOV_CAP
    d.vis_max_msg = rma.ep_attr.max_msg_size if rma.ep_attr.max_msg_size > 0 else (1 << 30)


cdef enum:
    VIS_PACK_BLOCK = 2048       # fragments this small are packed here where the target allows
    VIS_PACK_MSG = 256 << 10    # bytes per packed message, at most


cdef void _vis_msg_done(gx_op* op, int err) noexcept nogil:
    """A message of a VIS op completed (called by whoever read its CQ entry)."""
    cdef gx_op* p = op.parent
    _release_mrs(op)
    gx_add_long(&op.ep.live, -1)
    if op.t != NULL:
        gx_add_long(&op.t.out, -1)
    if err and p.vis_err == 0:
        p.vis_err = err
    free(op.vis_buf)
    free(op)
    if gx_add_long(&p.pending, -1) == 0:
        _complete(p, p.vis_err)


cdef void _vis_drop(gx_op* op) noexcept nogil:
    """Undo a message op that was never posted."""
    if op.parent != NULL:
        gx_add_long(&op.parent.pending, -1)
        op.parent = NULL
    free(op.vis_buf)
    op.vis_buf = NULL
    _drop_new(op)


cdef void _vis_abandon(gx_op* parent) noexcept nogil:
    """Issuing stopped on an error: the messages already posted complete into
    the parent, which is orphaned (freed by the last of them) unless it is
    implicit (then counted until they have: nbi_wait waits for them)."""
    if not parent.nbi:
        _orphan(parent)             # PENDING -> ORPHAN: _complete frees it
    if gx_add_long(&parent.pending, -1) == 0:
        _complete(parent, parent.vis_err)


cdef int _vis_fail(gx_op* parent, ofi_peer* t, ssize_t rc, bint put) except -1 nogil:
    _vis_abandon(parent)
    if rc == -FI_ENOMEM:
        with gil:
            raise MemoryError("ofi VIS: no memory for a packed message")
    return _issue_failed(t, rc, "fi_writemsg (vector put)" if put else "fi_readmsg (vector get)")


cdef size_t _vis_direct(ofi_peer* t, const gx_frag* f, size_t i, size_t nf, size_t L, size_t R,
                        size_t maxmsg, iovec* iov, fi_rma_iov* riov, size_t* nl, size_t* nr,
                        size_t* nbytes) noexcept nogil:
    """From fragment i: one message of up to L local and R remote ranges
    (fragments that run on in memory merge); the index after the last taken."""
    cdef bint lmerge, rmerge
    cdef char* lp
    cdef uint64_t raddr
    nl[0] = nr[0] = nbytes[0] = 0
    while i < nf:
        if f[i].n == 0:
            i += 1
            continue
        if nbytes[0] + f[i].n > maxmsg and nbytes[0] > 0:
            break
        lp = <char*>f[i].local
        raddr = _raddr(t, f[i].remote)
        lmerge = nl[0] > 0 and <char*>iov[nl[0] - 1].iov_base + iov[nl[0] - 1].iov_len == lp
        rmerge = nr[0] > 0 and riov[nr[0] - 1].addr + riov[nr[0] - 1].len == raddr
        if (not lmerge and nl[0] == L) or (not rmerge and nr[0] == R):
            break
        if lmerge:
            iov[nl[0] - 1].iov_len += f[i].n
        else:
            iov[nl[0]].iov_base = lp
            iov[nl[0]].iov_len = f[i].n
            nl[0] += 1
        if rmerge:
            riov[nr[0] - 1].len += f[i].n
        else:
            riov[nr[0]].addr = raddr
            riov[nr[0]].len = f[i].n
            riov[nr[0]].key = t.net_key
            nr[0] += 1
        nbytes[0] += f[i].n
        i += 1
    return i


cdef size_t _vis_packable(ofi_peer* t, const gx_frag* f, size_t i, size_t nf, size_t R,
                          fi_rma_iov* riov, size_t* nr, size_t* nbytes) noexcept nogil:
    """From fragment i: the small fragments one packed message can take (its
    local side one buffer, its remote side up to R ranges); the index after
    the last taken (i when fragment i is not small)."""
    cdef uint64_t raddr
    nr[0] = nbytes[0] = 0
    while i < nf:
        if f[i].n == 0:
            i += 1
            continue
        if f[i].n > VIS_PACK_BLOCK or nbytes[0] + f[i].n > VIS_PACK_MSG:
            break
        raddr = _raddr(t, f[i].remote)
        if nr[0] > 0 and riov[nr[0] - 1].addr + riov[nr[0] - 1].len == raddr:
            riov[nr[0] - 1].len += f[i].n
        elif nr[0] == R:
            break
        else:
            riov[nr[0]].addr = raddr
            riov[nr[0]].len = f[i].n
            riov[nr[0]].key = t.net_key
            nr[0] += 1
        nbytes[0] += f[i].n
        i += 1
    return i


cdef int _vis_get_packed(ofi_ep* ep, ofi_peer* t, const gx_frag* f, size_t i0, size_t i1,
                         size_t nbytes) except -1 nogil:
    """Fragments i0..i1 that run on at the target: one read of the run into a
    buffer, unpacked here (blocking, as the core's packed runs were)."""
    cdef char* buf = <char*>malloc(nbytes)
    cdef char* pos
    cdef size_t i, first = i0
    if buf == NULL:
        with gil:
            raise MemoryError("ofi VIS: no memory for a packed get")
    while f[first].n == 0:          # the run starts at its first non-empty fragment
        first += 1
    try:
        net_get(ep, t, f[first].remote, buf, nbytes, GX_BLOCKING, NULL)
        pos = buf
        for i in range(i0, i1):
            memcpy(f[i].local, pos, f[i].n)
            pos += f[i].n
    finally:
        free(buf)
    return 0


cdef int net_vis(ofi_ep* ep, ofi_peer* t, bint put, const gx_frag* f, size_t nf, int mode,
                 bint lhost, void** out) except -1 nogil:
    """Fragments f[0..nf) as fi_writemsg/fi_readmsg messages of up to
    dom.vis_iov local and dom.vis_rma_iov remote ranges each, all posted
    before any wait, completing into one op: GX_BLOCKING complete on return;
    GX_NB that op in *out; GX_NBI an implicit op of the endpoint.
    GX_NBI_LCNOW is served as blocking (the blocks are reusable only once
    the writes complete).  ``lhost``: the local blocks are host memory the
    CPU may read: small fragments that run on at the target (a numpy
    column) are packed into one message (put) or read as one run and
    unpacked (get), where that takes more fragments per message."""
    cdef ofi_dom* d = ep.dom
    cdef size_t L = d.vis_iov, R = d.vis_rma_iov, i = 0, i1, ip, j, nl, nr, npr, nbytes, pbytes
    cdef iovec iov[VIS_IOV_MAX]
    cdef void* desc[VIS_IOV_MAX]
    cdef fi_rma_iov riov[VIS_IOV_MAX]
    cdef fi_rma_iov priov[VIS_IOV_MAX]
    cdef fi_msg_rma msg
    cdef gx_op* parent
    cdef gx_op* op
    cdef int cat = GX_CAT_PUT if put else GX_CAT_GET
    cdef bint nbi, ordered = False, done
    cdef uint64_t flags
    cdef ssize_t rc
    cdef double deadline
    cdef char* pos
    if out != NULL:
        out[0] = NULL
    _app_active(d)
    if mode == GX_NBI_LCNOW:
        mode = GX_BLOCKING
    nbi = mode == GX_NBI
    if put and d.ordered and (not nbi or _touch(ep, t)):
        # Transmit completion for the writes (over tcp;ofi_rxm delivery
        # completion costs the target an acknowledgement per message: 1024 x
        # 4 KiB took 2.3 ms instead of 1.5), remote completion by a read
        # ordered after them (FI_ORDER_RAW): NBI, the flush at sync time
        # (rma.pxi); blocking and NB, one 1-byte read, the op's last message.
        ordered = True
    parent = _new_op(ep, t, GX_NBI if nbi else GX_NB, cat)
    parent.pending = 1              # the issuer's reference, dropped once all are posted
    memset(&msg, 0, sizeof(msg))
    msg.desc = desc
    msg.addr = t.net_addr
    while i < nf:
        i1 = _vis_direct(t, f, i, nf, L, R, d.vis_max_msg, iov, riov, &nl, &nr, &nbytes)
        if nl == 0:
            break                   # only empty fragments were left
        op = NULL
        if lhost and f[i].n <= VIS_PACK_BLOCK:
            ip = _vis_packable(t, f, i, nf, R if put else 1, priov, &npr, &pbytes)
            if ip > i1:
                if not put:
                    done = False
                    try:
                        _vis_get_packed(ep, t, f, i, ip, pbytes)
                        done = True
                    finally:
                        if not done:
                            _vis_abandon(parent)
                    i = ip
                    continue
                # one buffer of the small blocks, to up to R remote ranges
                op = _new_op(ep, t, GX_NB, cat)
                op.vis_buf = malloc(pbytes)
                if op.vis_buf == NULL:
                    _vis_drop(op)
                    return _vis_fail(parent, t, -FI_ENOMEM, put)
                pos = <char*>op.vis_buf
                for j in range(i, ip):
                    memcpy(pos, f[j].local, f[j].n)
                    pos += f[j].n
                iov[0].iov_base = op.vis_buf
                iov[0].iov_len = pbytes
                nl = 1
                for j in range(npr):
                    riov[j] = priov[j]
                nr = npr
                nbytes = pbytes
                i1 = ip
        if op == NULL:
            op = _new_op(ep, t, GX_NB, cat)
        op.parent = parent
        gx_add_long(&parent.pending, 1)
        for j in range(nl):
            rc = _desc(ep, op, iov[j].iov_base, iov[j].iov_len, FI_WRITE if put else FI_READ,
                       &desc[j])
            if rc < 0:
                _vis_drop(op)
                _vis_abandon(parent)
                return check("fi_mr_reg", rc)
        msg.msg_iov = iov
        msg.iov_count = nl
        msg.rma_iov = riov
        msg.rma_iov_count = nr
        msg.context = op
        flags = FI_COMPLETION
        if put and not (ordered and nbytes <= d.max_order_raw):
            flags |= FI_DELIVERY_COMPLETE
        deadline = 0
        while True:
            rc = fi_writemsg(ep.ep, &msg, flags) if put else fi_readmsg(ep.ep, &msg, flags)
            if not _again(rc, ep, t):
                break
            rc = _retry(ep, t, &deadline)
            if rc:
                break
        if rc < 0:
            _vis_drop(op)
            return _vis_fail(parent, t, rc, put)
        gx_add_long(&d.n_vis_direct, 1)
        i = i1
    if ordered and nbi:
        _ensure_flush(ep, t)
    elif ordered and parent.pending > 1:
        rc = _vis_flush_read(ep, t, parent)
        if rc < 0:
            return _vis_fail(parent, t, rc, False)
    if gx_add_long(&parent.pending, -1) == 0:
        _complete(parent, parent.vis_err)      # an implicit parent is freed here
    if nbi:
        return 0
    if mode == GX_BLOCKING:
        return _wait_op(parent, t, "put (vector)" if put else "get (vector)")
    out[0] = parent
    return 0


cdef ssize_t _vis_flush_read(ofi_ep* ep, ofi_peer* t, gx_op* parent) noexcept nogil:
    """The last message of a put op whose writes asked for transmit
    completion only: one byte read back from the target's segment, which the
    provider orders after them (FI_ORDER_RAW), so it completes once they
    have landed.  0, or the failed post's fi errno (negative)."""
    cdef gx_op* op = _new_op(ep, t, GX_NB, GX_CAT_GET)
    cdef void* desc
    cdef ssize_t rc = _desc(ep, op, &op.result, 1, FI_READ, &desc)
    cdef double deadline = 0
    op.parent = parent
    gx_add_long(&parent.pending, 1)
    while rc == 0:
        rc = fi_read(ep.ep, &op.result, 1, desc, t.net_addr, t.net_base, t.net_key, op)
        if not _again(rc, ep, t):
            break
        rc = _retry(ep, t, &deadline)
    if rc < 0:
        gx_add_long(&parent.pending, -1)
        op.parent = NULL
        _drop_new(op)
        return rc
    return 0


cdef bint _vis_staged_local(ofi_ep* ep, gx_xfer* x) noexcept nogil:
    """Whether local blocks of x go through host bounce memory (device memory
    the provider cannot reach: _stg_local)."""
    cdef const gx_vis* v = x.vis
    cdef gx_xfer one
    cdef size_t i
    if x.local_kind == GX_MK_HOST and (ep.zone == NULL or ep.hmem or not ep.dom.stg_all):
        return False
    one = x[0]
    for i in range(v.nfrags):
        one.local = v.frags[i].local
        one.n = v.frags[i].n
        if one.n and _stg_local(ep, &one):
            return True
    return False


cdef int ofi_put_vis(gx_xfer* x) except -1 nogil:
    cdef ofi_ep* ep = <ofi_ep*>x.ep
    cdef ofi_peer* t = <ofi_peer*>x.peer
    if x.stream != NULL:
        return _no_stream(x, "put (vector)")
    _check_open(ep, t, "put (vector)")
    if t.stg:
        return _stg_vis(x, True)             # packed through the target's lander
    if _vis_staged_local(ep, x):
        return _vis_bounced(x, True)
    if t.vzone and _vis_land_worth(ep.dom, t, x, True):
        return _vis_landed(x, True)          # packed through its VIS landing zone
    return net_vis(ep, t, True, x.vis.frags, x.vis.nfrags, x.mode,
                   x.local_kind == GX_MK_HOST, x.handle)


cdef int ofi_get_vis(gx_xfer* x) except -1 nogil:
    cdef ofi_ep* ep = <ofi_ep*>x.ep
    cdef ofi_peer* t = <ofi_peer*>x.peer
    if x.stream != NULL:
        return _no_stream(x, "get (vector)")
    _check_open(ep, t, "get (vector)")
    if t.stg:
        return _stg_vis(x, False)             # packed through the target's lander
    if _vis_staged_local(ep, x):
        return _vis_bounced(x, False)
    if t.vzone and _vis_land_worth(ep.dom, t, x, False):
        return _vis_landed(x, False)          # gathered through its VIS landing zone
    return net_vis(ep, t, False, x.vis.frags, x.vis.nfrags, x.mode,
                   x.local_kind == GX_MK_HOST, x.handle)


# ---- packed through a staged target's landing zone --------------------------------
#
# Small blocks go to a staged target (a device segment reached through its
# landing zone, staged.pxi) packed: one request per landing slot holding a
# list of (offset, length) pairs and the blocks back to back, unpacked by the
# target's lander (_land_vis) -- one network write and one descriptor per
# slot, not a whole staged transfer per block.  Gets the other way round: the
# list goes out, the lander gathers the blocks into the slot, one read brings
# them back.  Blocks larger than a quarter of a slot go as staged transfers of
# their own.

cdef inline bint _vis_small(size_t n, size_t C) noexcept nogil:
    return n > 0 and n <= C // 4


cdef size_t _vis_group(const gx_frag* f, size_t i, size_t nf, size_t C, size_t hdr,
                       size_t* k, size_t* nbytes) noexcept nogil:
    """From fragment i: the small fragments (others skipped) that fit one
    slot of C bytes with hdr bytes of list per run; the index after the last
    taken.  k: the runs among them -- small fragments that continue the
    previous one at the target share its list entry (_vis_list), so a
    strided local view to a contiguous target range is one entry per slot,
    not 16 bytes of list and a copy at the lander per byte."""
    cdef uintptr_t end = 0             # the target end of the run so far
    cdef bint run
    k[0] = 0
    nbytes[0] = 0
    while i < nf:
        if _vis_small(f[i].n, C):
            run = k[0] > 0 and <uintptr_t>f[i].remote == end
            if hdr * (k[0] + (0 if run else 1)) + nbytes[0] + f[i].n > C:
                break
            if not run:
                k[0] += 1
            nbytes[0] += f[i].n
            end = <uintptr_t>f[i].remote + f[i].n
        i += 1
    return i


cdef void _vis_pack_host(bint gather, char* hbuf, const gx_frag* f, size_t i0, size_t i1,
                         size_t C) noexcept nogil:
    """_vis_pack for host memory: memcpy between the small blocks and hbuf."""
    cdef size_t m, pos = 0
    for m in range(i0, i1):
        if _vis_small(f[m].n, C):
            if gather:
                memcpy(hbuf + pos, f[m].local, f[m].n)
            else:
                memcpy(f[m].local, hbuf + pos, f[m].n)
            pos += f[m].n


# ---- a second thread that packs the next slot while this one sends -------------------
#
# Over tcp a packed put costs its initiator two copies of every byte on one thread:
# packing the blocks into a slot (memcpy) and the provider's send of the slot (the
# socket's copy, inline in fi_write or in progress).  A contiguous put costs one,
# so packed puts ran at about half its rate however many cores the node had
# (1024 x 4 KiB to a host segment: 0.44-0.62x a 4 MiB put on a 32-core host).
# Where the process may run on at least four CPUs (GEXMK_OFI_VIS_PACKER=auto; 1:
# always, 0: never), the packer thread packs slot k + 1 while this thread posts and
# sends slot k.  One per process, taken by one packed put at a time (another packs
# for itself); it sleeps on a lock between slots.

cdef struct _packer_t:
    PyThread_type_lock go          # released by the putter to hand over a job
    volatile int state             # 0 idle, 1 a job handed over, 2 its bytes are packed
    volatile int busy              # a packed put holds the packer
    volatile int stop
    char* dst
    const gx_frag* f
    size_t i0, i1, C
    long jobs                      # slots it packed (Domain.vis_paths["packed-ahead"])

cdef _packer_t _pk
_packer_thread_obj = None


cdef int _packer_want() except -1:
    """GEXMK_OFI_VIS_PACKER, read at import: 1 to use the packer thread."""
    want = os.environ.get("GEXMK_OFI_VIS_PACKER", "auto").strip().lower()
    if want not in ("auto", "0", "1"):
        raise ArgumentError(f"GEXMK_OFI_VIS_PACKER={want!r}: expected auto, 0 or 1")
    if want != "auto":
        return want == "1"
    try:
        ncpu = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        ncpu = os.cpu_count() or 1
    return ncpu >= 4


# 1: wanted, not started yet; 2: running; 0: not used
cdef int _PACKER_MODE = _packer_want()


cdef int _packer_start() except -1:
    global _PACKER_MODE, _packer_thread_obj
    if _PACKER_MODE != 1:
        return 0
    _PACKER_MODE = 0
    _pk.go = PyThread_allocate_lock()
    if _pk.go == NULL:
        return 0
    PyThread_acquire_lock(_pk.go, WAIT_LOCK)     # held: the packer waits on it
    _packer_thread_obj = threading.Thread(target=_packer_run, name="gexmk-ofi-packer",
                                          daemon=True)
    _packer_thread_obj.start()
    _PACKER_MODE = 2
    return 0


def _packer_run():
    with nogil:
        _packer_loop()


cdef void _packer_loop() noexcept nogil:
    while True:
        PyThread_acquire_lock(_pk.go, WAIT_LOCK)
        if _pk.stop:
            return
        _tr(TR_PK_IN)
        _vis_pack_host(True, _pk.dst, _pk.f, _pk.i0, _pk.i1, _pk.C)
        _tr(TR_PK_OUT)
        gx_xchg_int(&_pk.state, 2)


cdef bint _packer_take() noexcept nogil:
    """Whether this packed put may use the packer (held until _packer_give);
    started by the first that asks."""
    if _PACKER_MODE == 1 and gx_xchg_int(&_pk.busy, 1) == 0:
        with gil:
            try:
                _packer_start()
            except BaseException:       # no thread to be had: each put packs for itself
                pass
        gx_xchg_int(&_pk.busy, 0)
    return _PACKER_MODE == 2 and gx_xchg_int(&_pk.busy, 1) == 0


cdef void _packer_give() noexcept nogil:
    _packer_join()
    gx_xchg_int(&_pk.busy, 0)


cdef void _packer_hand(char* dst, const gx_frag* f, size_t i0, size_t i1, size_t C) noexcept nogil:
    _pk.dst = dst
    _pk.f = f
    _pk.i0 = i0
    _pk.i1 = i1
    _pk.C = C
    _pk.jobs += 1
    gx_xchg_int(&_pk.state, 1)
    PyThread_release_lock(_pk.go)


cdef void _packer_join() noexcept nogil:
    """Until the job handed over (if any) is packed: a bounded memcpy."""
    while gx_load_int(&_pk.state) == 1:
        sched_yield()
    gx_xchg_int(&_pk.state, 0)


cdef int _vis_pack(ofi_ep* ep, bint lstg, bint gather, char* hbuf, const gx_frag* f, size_t i0,
                   size_t i1, size_t C) except -1 nogil:
    """Between the local blocks f[i0..i1) that are small for C (_vis_small)
    and hbuf, back to back in order: gather (blocks -> hbuf) or scatter.
    Device blocks (lstg, the endpoint's zone has a kind): one call of the
    kind's copy_batch (which makes a strided view's rows one 2-D copy), not
    a synchronous copy per block (a strided 1-byte view of 192 KiB was
    196,613 of them); complete on return.  Host memory: memcpy."""
    cdef const gx_kind_ops* K = ep.zone.kops if lstg else NULL
    cdef uintptr_t* a = NULL
    cdef size_t m, N = i1 - i0, cnt = 0, pos = 0
    if K == NULL:
        _vis_pack_host(gather, hbuf, f, i0, i1, C)
        return 0
    a = <uintptr_t*>malloc(3 * (N + 1) * sizeof(uintptr_t))
    if a == NULL:
        with gil:
            raise MemoryError("ofi VIS: no memory for a device copy list")
    try:
        for m in range(i0, i1):
            if _vis_small(f[m].n, C):
                a[cnt] = <uintptr_t>(hbuf + pos) if gather else <uintptr_t>f[m].local
                a[N + cnt] = <uintptr_t>f[m].local if gather else <uintptr_t>(hbuf + pos)
                a[2 * N + cnt] = f[m].n
                pos += f[m].n
                cnt += 1
        if cnt and K.copy_batch != NULL:
            K.copy_batch(ep.zone.kctx, NULL, a, a + N, <size_t*>(a + 2 * N), cnt)
        else:
            for m in range(cnt):
                K.copy(ep.zone.kctx, NULL, a[m], a[N + m], a[2 * N + m])
    finally:
        free(a)
    return 0


cdef void _vis_list(ofi_peer* t, const gx_frag* f, size_t i0, size_t i1, size_t C, char* b) noexcept nogil:
    """The (offset, length) list of the small fragments f[i0..i1), one entry
    per run (as _vis_group counts them)."""
    cdef uint64_t* lst = <uint64_t*>b
    cdef size_t i, k = 0
    cdef uintptr_t end = 0
    for i in range(i0, i1):
        if _vis_small(f[i].n, C):
            if k > 0 and <uintptr_t>f[i].remote == end:
                lst[2 * k - 1] += f[i].n
            else:
                lst[2 * k] = f[i].remote - t.g.remote_base
                lst[2 * k + 1] = f[i].n
                k += 1
            end = <uintptr_t>f[i].remote + f[i].n


cdef int _stg_vis_put(ofi_ep* ep, ofi_peer* t, const gx_frag* f, size_t nf, bint lstg,
                      char* buf, size_t C, int W) except -1 nogil:
    """The small fragments packed, W slots in flight (buf: W x C bytes of
    host memory); complete (landed) on return.  Caller holds t.stg_lock."""
    cdef int S = t.stg_slots, s, h = 0, cnt = 0, j
    cdef size_t i = 0, i1, k, nbytes
    cdef uint64_t q
    cdef gx_op* ops[STG_MAX_SLOTS]
    cdef gx_op* op
    cdef uint64_t pseq[STG_MAX_SLOTS]
    cdef uint64_t pk[STG_MAX_SLOTS]
    cdef uint64_t plen[STG_MAX_SLOTS]
    cdef char* b
    cdef bint early
    cdef bint packer = False        # the packer is ours for this call
    cdef size_t pre_i = <size_t>-1, nk, nnb, ni1   # the group it packs
    for j in range(STG_MAX_SLOTS):
        ops[j] = NULL
    if not lstg and W > 1:
        packer = _packer_take()
    _tr(TR_VIS_IN)
    try:
        while True:
            # the oldest chunks whose data has landed: their descriptors, in
            # order (pseq 0: sent with the data already)
            while cnt > 0:
                j = h % W
                if i < nf and cnt < W and gx_load_int(&ops[j].state) != OP_DONE:
                    _progress(ep)
                    if gx_load_int(&ops[j].state) != OP_DONE:
                        break
                op = ops[j]
                ops[j] = NULL
                _wait_op(op, t, "staged put (vector data)")
                if pseq[j]:
                    _stg_send_desc(ep, t, <int>((pseq[j] - 1) % S), pseq[j], STG_PUTV, pk[j],
                                   plen[j])
                h += 1
                cnt -= 1
            if i < nf and cnt < W:
                i1 = _vis_group(f, i, nf, C, 16, &k, &nbytes)
                if k == 0:
                    i = i1
                    continue
                q = t.stg_seq + 1
                s = <int>((q - 1) % S)
                if t.stg_last[s] > t.stg_ok[s]:
                    _stg_wait_slot(ep, t, s, t.stg_last[s])
                j = (h + cnt) % W
                b = buf + <size_t>j * C
                if packer and pre_i == i:
                    # the packer packed this group into this buffer (list and data)
                    if gx_load_int(&_pk.state) == 1:
                        _tr(TR_VIS_PK_IN)
                        while gx_load_int(&_pk.state) == 1:
                            _progress(ep)    # sends of the slots posted before go on
                        _tr(TR_VIS_PK_OUT)
                    gx_xchg_int(&_pk.state, 0)
                    pre_i = <size_t>-1
                else:
                    _vis_list(t, f, i, i1, C, b)
                    _vis_pack(ep, lstg, True, b + 16 * k, f, i, i1, C)
                if packer and i1 < nf and cnt + 1 < W:
                    # the next group into the next buffer (free: fewer than W
                    # slots in flight once this one is posted), packed there
                    # while this slot goes out
                    ni1 = _vis_group(f, i1, nf, C, 16, &nk, &nnb)
                    if nk:
                        _vis_list(t, f, i1, ni1, C, buf + <size_t>((h + cnt + 1) % W) * C)
                        _packer_hand(buf + <size_t>((h + cnt + 1) % W) * C + 16 * nk, f, i1,
                                     ni1, C)
                        pre_i = i1
                t.stg_seq = q
                t.stg_last[s] = q
                pseq[j] = q
                pk[j] = k
                plen[j] = nbytes
                # Where the provider lands one endpoint's writes in issue
                # order (FI_ORDER_WAW, up to max_order_waw bytes), the
                # descriptor goes right behind its data, which asks for
                # transmit completion only (the slot's buffer free again):
                # no round trip per slot between packing and unpacking.
                early = _VIS_EARLY and ep.dom.waw and 16 * k + nbytes <= ep.dom.max_order_waw
                _tr(TR_VIS_POST_IN)
                _stg_post(ep, t, True, t.stg_ring + _stg_data_off(S) + <uint64_t>s * t.stg_chunk,
                          b, 16 * k + nbytes, &ops[j], not early)
                if early:
                    _stg_send_desc(ep, t, s, q, STG_PUTV, k, nbytes)
                    pseq[j] = 0
                _tr(TR_VIS_POSTED)
                cnt += 1
                i = i1
            elif cnt == 0:
                break
        _tr(TR_VIS_ALL_IN)
        _stg_wait_all(ep, t)
        _tr(TR_VIS_OUT)
    finally:
        if packer:
            _packer_give()       # its job done first: the buffer goes back after this
        for j in range(STG_MAX_SLOTS):
            if ops[j] != NULL:
                _orphan(ops[j])
    return 0


cdef int _stg_vis_get(ofi_ep* ep, ofi_peer* t, const gx_frag* f, size_t nf, bint lstg,
                      char* buf, size_t C, int W) except -1 nogil:
    """The small fragments gathered by the target's lander, W requests ahead
    (buf: W x C bytes of host memory: the lists, then the data read back);
    complete on return.  Caller holds t.stg_lock.  Where the provider orders
    writes (FI_ORDER_WAW), each list goes with transmit completion and its
    descriptor right behind it; the reads of served slots are posted as soon
    as they are known served, several in flight, each unpacked as it
    completes."""
    cdef int S = t.stg_slots, s, j, m
    cdef size_t i = 0, k, nbytes
    cdef size_t posted = 0, got = 0, rposted = 0
    cdef uint64_t q
    cdef uint64_t qs[STG_MAX_SLOTS]
    cdef size_t g0[STG_MAX_SLOTS]
    cdef size_t g1[STG_MAX_SLOTS]
    cdef size_t gk[STG_MAX_SLOTS]
    cdef size_t gn[STG_MAX_SLOTS]
    cdef gx_op* lops[STG_MAX_SLOTS]
    cdef gx_op* rops[STG_MAX_SLOTS]
    cdef gx_op* op
    cdef uint64_t slot
    cdef char* b
    cdef bint early
    for m in range(STG_MAX_SLOTS):
        lops[m] = rops[m] = NULL
    try:
        while True:
            while i < nf and posted - got < <size_t>W:
                g1[posted % W] = _vis_group(f, i, nf, C, 16, &k, &nbytes)
                if k == 0:
                    i = g1[posted % W]
                    continue
                j = <int>(posted % W)
                g0[j] = i
                gk[j] = k
                gn[j] = nbytes
                q = t.stg_seq + 1
                s = <int>((q - 1) % S)
                if t.stg_last[s] > t.stg_ok[s]:
                    _stg_wait_slot(ep, t, s, t.stg_last[s])
                b = buf + <size_t>j * C
                _vis_list(t, f, i, g1[j], C, b)
                slot = t.stg_ring + _stg_data_off(S) + <uint64_t>s * t.stg_chunk
                early = _VIS_EARLY and ep.dom.waw and 16 * k <= ep.dom.max_order_waw
                # the list, before its request
                _stg_post(ep, t, True, slot, b, 16 * k, &lops[j] if early else NULL, not early)
                t.stg_seq = q
                t.stg_last[s] = q
                qs[j] = q
                _stg_send_desc(ep, t, s, q, STG_GETV, k, nbytes)
                posted += 1
                i = g1[j]
            if got == posted:
                break
            # reads: the oldest request's once served, and any later ones
            # already seen served
            while rposted < posted:
                m = <int>(rposted % W)
                q = qs[m]
                s = <int>((q - 1) % S)
                if rposted > got and _stg_seq(t.stg_rb[s]) < q:
                    break
                _stg_wait_slot(ep, t, s, q)
                if lops[m] != NULL:     # its list's buffer takes the data
                    op = lops[m]
                    lops[m] = NULL
                    _wait_op(op, t, "staged get (vector list)")
                slot = t.stg_ring + _stg_data_off(S) + <uint64_t>s * t.stg_chunk
                _stg_post(ep, t, False, slot + 16 * gk[m], buf + <size_t>m * C, gn[m], &rops[m])
                rposted += 1
            j = <int>(got % W)
            op = rops[j]
            rops[j] = NULL
            _wait_op(op, t, "staged get (vector data)")
            _vis_pack(ep, lstg, False, buf + <size_t>j * C, f, g0[j], g1[j], C)
            got += 1
    finally:
        for m in range(STG_MAX_SLOTS):
            if lops[m] != NULL:
                _orphan(lops[m])
            if rops[m] != NULL:
                _orphan(rops[m])
    return 0


# One packing buffer kept for the process's staged VIS calls (a fresh 4 MiB
# malloc per call cost its page faults every time); a call that finds it in
# use or too small mallocs its own.
cdef char* _pack_keep = NULL
cdef size_t _pack_keep_n = 0
cdef int _pack_lock = 0


cdef char* _pack_take(size_t n, bint* kept) noexcept nogil:
    global _pack_keep, _pack_keep_n
    kept[0] = False
    if gx_xchg_int(&_pack_lock, 1) == 0:
        if _pack_keep_n < n:
            free(_pack_keep)
            _pack_keep = <char*>malloc(n)
            _pack_keep_n = n if _pack_keep != NULL else 0
        if _pack_keep != NULL:
            kept[0] = True
            return _pack_keep
        gx_xchg_int(&_pack_lock, 0)
    return <char*>malloc(n)


cdef void _pack_give(char* buf, bint kept) noexcept nogil:
    if kept:
        gx_xchg_int(&_pack_lock, 0)
    else:
        free(buf)


cdef int _stg_vis(gx_xfer* x, bint put) except -1 nogil:
    """A chunk of fragments to or from a staged target: small ones packed
    (_stg_vis_put/_get), the rest one staged transfer each; complete on
    return whatever the mode.  Device blocks are packed in the endpoint's
    bounce slots (page-locked: the kind's batched copies run at DMA speed)."""
    cdef ofi_ep* ep = <ofi_ep*>x.ep
    cdef ofi_peer* t = <ofi_peer*>x.peer
    cdef const gx_vis* v = x.vis
    cdef bint lstg = _vis_staged_local(ep, x)
    cdef size_t C = t.stg_chunk, i
    cdef int W = t.stg_slots
    cdef char* buf = NULL
    cdef bint kept = False
    cdef uint64_t off
    if lstg and ep.zone == NULL:
        with gil:
            raise StateError("ofi-staged: the endpoint's device segment is no longer bound")
    if lstg:
        C = C if C < ep.zone.chunk else ep.zone.chunk
        W = W if W < ep.zone.slots else ep.zone.slots
    else:
        buf = _pack_take(<size_t>W * C, &kept)
        if buf == NULL:
            with gil:
                raise MemoryError(f"ofi-staged VIS: no memory for {W} x {C} bytes of packing "
                                  "buffers")
    _app_active(ep.dom)
    _ring_idle_check(ep)
    if lstg:
        _spin_lock(&ep.bb_lock)
        buf = ep.zone.bounce
    _spin_lock(&t.stg_lock)
    try:
        if not _stg_open(ep, t):
            _stg_refused(t)
        if put:
            _stg_vis_put(ep, t, v.frags, v.nfrags, lstg, buf, C, W)
        else:
            _stg_vis_get(ep, t, v.frags, v.nfrags, lstg, buf, C, W)
        for i in range(v.nfrags):
            if v.frags[i].n and not _vis_small(v.frags[i].n, C):
                off = v.frags[i].remote - t.g.remote_base
                if put:
                    _stg_put_zone(ep, t, off, <char*>v.frags[i].local, v.frags[i].n, lstg)
                else:
                    _stg_get_zone(ep, t, off, <char*>v.frags[i].local, v.frags[i].n, lstg)
        _stg_done(ep, t)
    finally:
        gx_xchg_int(&t.stg_lock, 0)
        if lstg:
            gx_xchg_int(&ep.bb_lock, 0)
        else:
            _pack_give(buf, kept)
    if x.handle != NULL:
        x.handle[0] = NULL
    return 0


# ---- device blocks to or from a host target ---------------------------------------
#
# Device memory the provider cannot reach, to a target it reaches directly
# (a host segment): the small blocks are packed into the endpoint's bounce
# slots (_vis_pack), each slot's blocks then one net_vis of host ranges
# (which merge where the target's blocks run on: a strided view's put to a
# contiguous range is one write per slot), slots overlapping as in
# _stg_host_put; larger blocks go as staged transfers of their own.

cdef size_t _vis_host_frags(const gx_frag* f, size_t i0, size_t i1, size_t C, char* buf,
                            gx_frag* hf) noexcept nogil:
    """The host ranges of a packed slot: hf[k] is f's k-th small block at
    its place in buf; how many."""
    cdef size_t m, k = 0, pos = 0
    for m in range(i0, i1):
        if _vis_small(f[m].n, C):
            hf[k].local = buf + pos
            hf[k].remote = f[m].remote
            hf[k].n = f[m].n
            pos += f[m].n
            k += 1
    return k


cdef int _vis_bounced_put(ofi_ep* ep, ofi_peer* t, const gx_frag* f, size_t nf,
                          gx_frag* hf) except -1 nogil:
    cdef ofi_zone* z = ep.zone
    cdef size_t C = z.chunk, i = 0, i1, k, nbytes
    cdef int S = z.slots, b = 0
    cdef gx_op* ops[STG_MAX_SLOTS]
    cdef gx_op* op
    cdef char* buf
    for b in range(STG_MAX_SLOTS):
        ops[b] = NULL
    b = 0
    try:
        while i < nf:
            i1 = _vis_group(f, i, nf, C, 0, &k, &nbytes)
            if k == 0:
                i = i1
                continue
            if ops[b] != NULL:
                op = ops[b]
                ops[b] = NULL
                _wait_op(op, t, "staged put (vector)")
            buf = z.bounce + <size_t>b * C
            _vis_pack(ep, True, True, buf, f, i, i1, C)
            k = _vis_host_frags(f, i, i1, C, buf, hf)
            net_vis(ep, t, True, hf, k, GX_NB, True, <void**>&ops[b])
            b = (b + 1) % S
            i = i1
        for b in range(S):
            if ops[b] != NULL:
                op = ops[b]
                ops[b] = NULL
                _wait_op(op, t, "staged put (vector)")
    finally:
        for b in range(STG_MAX_SLOTS):
            if ops[b] != NULL:
                _orphan(ops[b])
    return 0


cdef int _vis_bounced_get(ofi_ep* ep, ofi_peer* t, const gx_frag* f, size_t nf,
                          gx_frag* hf) except -1 nogil:
    cdef ofi_zone* z = ep.zone
    cdef size_t C = z.chunk, i = 0, i1, k, nbytes, posted = 0, got = 0
    cdef int S = z.slots, j
    cdef size_t g0[STG_MAX_SLOTS]
    cdef size_t g1[STG_MAX_SLOTS]
    cdef gx_op* ops[STG_MAX_SLOTS]
    cdef gx_op* op
    cdef char* buf
    for j in range(STG_MAX_SLOTS):
        ops[j] = NULL
    try:
        while True:
            while i < nf and posted - got < <size_t>S:
                i1 = _vis_group(f, i, nf, C, 0, &k, &nbytes)
                if k == 0:
                    i = i1
                    continue
                j = <int>(posted % S)
                buf = z.bounce + <size_t>j * C
                k = _vis_host_frags(f, i, i1, C, buf, hf)
                net_vis(ep, t, False, hf, k, GX_NB, True, <void**>&ops[j])
                g0[j] = i
                g1[j] = i1
                posted += 1
                i = i1
            if got == posted:
                break
            j = <int>(got % S)
            if ops[j] != NULL:
                op = ops[j]
                ops[j] = NULL
                _wait_op(op, t, "staged get (vector)")
            _vis_pack(ep, True, False, z.bounce + <size_t>j * C, f, g0[j], g1[j], C)
            got += 1
    finally:
        for j in range(STG_MAX_SLOTS):
            if ops[j] != NULL:
                _orphan(ops[j])
    return 0


cdef int _vis_bounced(gx_xfer* x, bint put) except -1 nogil:
    """Device blocks of x (_vis_staged_local) to or from a target the
    provider reaches directly; complete on return whatever the mode."""
    cdef ofi_ep* ep = <ofi_ep*>x.ep
    cdef ofi_peer* t = <ofi_peer*>x.peer
    cdef const gx_vis* v = x.vis
    cdef gx_frag* hf
    cdef size_t i, C
    if ep.zone == NULL:
        with gil:
            raise StateError("ofi-staged: the endpoint's device segment is no longer bound")
    hf = <gx_frag*>malloc((v.nfrags or 1) * sizeof(gx_frag))
    if hf == NULL:
        with gil:
            raise MemoryError("ofi VIS: no memory for a bounce list")
    C = ep.zone.chunk
    _app_active(ep.dom)
    _spin_lock(&ep.bb_lock)
    try:
        if put:
            _vis_bounced_put(ep, t, v.frags, v.nfrags, hf)
        else:
            _vis_bounced_get(ep, t, v.frags, v.nfrags, hf)
        for i in range(v.nfrags):
            if v.frags[i].n and not _vis_small(v.frags[i].n, C):
                if put:
                    _stg_host_put(ep, t, v.frags[i].remote, <char*>v.frags[i].local, v.frags[i].n)
                else:
                    _stg_host_get(ep, t, v.frags[i].remote, <char*>v.frags[i].local, v.frags[i].n)
    finally:
        gx_xchg_int(&ep.bb_lock, 0)
        free(hf)
    if x.handle != NULL:
        x.handle[0] = NULL
    return 0


# ---- packed through a host target's VIS landing zone ("ofi-landed") ---------------
#
# Over a provider that takes few remote ranges per message (tcp;ofi_rxm: 4, at
# 6-8 us a message), many small blocks to a host segment go faster packed: a
# host segment bound to an endpoint gets a landing zone beside it (registered
# apart, published as the seventh field of the endpoint's blob), and a VIS
# call whose small fragments would take more than VIS_LAND_MSGS direct
# messages packs them slot by slot into its ring there (_stg_vis_put/_get:
# one write and one descriptor per slot, the descriptor right behind the data
# where the provider orders writes), unpacked by the target's lander; larger
# fragments and short lists still go direct (fi_writemsg/fi_readmsg).  The
# zone costs address space until used: a ring is backed on its initiator's
# first request (STG_OPEN), at most GEXMK_OFI_ZONE_RINGS of them at once,
# and given back once its initiator leaves it unused (GEXMK_OFI_RING_IDLE,
# staged.pxi); an initiator the zone refuses sends its VIS direct, and asks
# again a second later.  Counted in Domain.vis_paths and ring_stats.

cdef object _vis_zone_open(OfiEndpoint oe, Segment seg):
    """The VIS landing zone of a host segment bound to oe (GEXMK_OFI_VIS_LAND
    > 0): what peers need of it, (key, base, slots, chunk, ring bytes,
    doorbell offsets), or
    None (none made: switched off, or the process's zones used up)."""
    cdef ofi_ep* e = &oe.e
    cdef ofi_dom* d = e.dom
    cdef fid_mr* mr = NULL
    cdef uint64_t key = 0
    cdef ofi_zone* z
    if not d.vis_zone or seg.size == 0 or d.nzones >= STG_MAX_ZONES // 2:
        return None
    z = _zone_make(d, seg, d.stg_nrings, _VIS_ZONE_SLOTS, _VIS_ZONE_CHUNK, True)
    try:
        if not (d.mr_mode & FI_MR_PROV_KEY):
            key = d.next_key
            d.next_key += 1
        with nogil:
            check("fi_mr_reg (VIS landing zone)", fi_mr_reg(d.domain, z.mem, z.bytes,
                                                            FI_REMOTE_READ | FI_REMOTE_WRITE
                                                            | FI_READ | FI_WRITE, 0, key, 0,
                                                            &mr, NULL))
        if d.mr_mode & FI_MR_ENDPOINT:
            try:
                check("fi_mr_bind", fi_mr_bind(mr, &e.ep.fid, 0))
                check("fi_mr_enable", fi_mr_enable(mr))
            except BaseException:
                fi_close(&mr.fid)
                raise
        try:
            _zone_serve_z(d, z)
        except BaseException:
            fi_close(&mr.fid)
            raise
    except BaseException:
        _zone_free(z)
        raise
    e.vzone = z
    e.vzone_mr = mr
    oe.domain.start_lander()
    base = <uintptr_t>z.mem if (d.mr_mode & FI_MR_VIRT_ADDR) else 0
    key = oe._raw_key(mr, base) if (d.mr_mode & FI_MR_RAW) else fi_mr_key(mr)
    return (key, base, z.slots, z.chunk, z.ring_bytes, z.bell_off, z.bell2_off, z.closed_off)


cdef bint _vis_land_worth(ofi_dom* d, ofi_peer* t, gx_xfer* x, bint put) noexcept nogil:
    """Whether x's fragments go faster packed through t's VIS zone: its
    local blocks host memory, its ring not refused, a put only where the
    provider's puts gain by it (d.vis_land_put), and its small fragments
    (at most d.vis_land bytes on average) more than VIS_LAND_MSGS direct
    messages' worth of remote ranges that do not run on."""
    cdef const gx_frag* f = x.vis.frags
    cdef size_t i, k = 0, nbytes = 0, ranges = 0, C = t.stg_chunk
    cdef uint64_t end = 0
    if x.local_kind != GX_MK_HOST or (t.stg_open == 2 and _now_coarse() < t.stg_retry_at) or \
            d.vis_land == 0 or \
            (put and not d.vis_land_put):
        return False
    for i in range(x.vis.nfrags):
        if _vis_small(f[i].n, C):
            k += 1
            nbytes += f[i].n
            if f[i].remote != end:
                ranges += 1
            end = f[i].remote + f[i].n
    return ranges > VIS_LAND_MSGS * d.vis_rma_iov and nbytes <= k * d.vis_land


cdef int _vis_landed(gx_xfer* x, bint put) except -1 nogil:
    """x's small fragments packed through t's VIS landing zone, the others
    direct; complete on return whatever the mode.  A ring the zone refuses:
    all direct (as x.mode asks)."""
    cdef ofi_ep* ep = <ofi_ep*>x.ep
    cdef ofi_peer* t = <ofi_peer*>x.peer
    cdef const gx_vis* v = x.vis
    cdef size_t C = t.stg_chunk, i, k = 0
    cdef int W = t.stg_slots
    cdef char* buf
    cdef bint kept = False
    cdef int opened = 0
    cdef long seq0
    cdef gx_frag* hf
    buf = _pack_take(<size_t>W * C, &kept)
    if buf == NULL:
        with gil:
            raise MemoryError(f"ofi VIS: no memory for {W} x {C} bytes of packing buffers")
    _app_active(ep.dom)
    _ring_idle_check(ep)
    _spin_lock(&t.stg_lock)
    try:
        opened = _stg_open(ep, t, False)
        if opened:
            seq0 = <long>t.stg_seq
            if put:
                _stg_vis_put(ep, t, v.frags, v.nfrags, False, buf, C, W)
            else:
                _stg_vis_get(ep, t, v.frags, v.nfrags, False, buf, C, W)
            gx_add_long(&ep.dom.n_vis_landed, <long>t.stg_seq - seq0)
            _stg_done(ep, t)
    finally:
        gx_xchg_int(&t.stg_lock, 0)
        _pack_give(buf, kept)
    if not opened:
        gx_add_long(&ep.dom.n_vis_refused, 1)
        return net_vis(ep, t, put, v.frags, v.nfrags, x.mode, True, x.handle)
    for i in range(v.nfrags):
        if v.frags[i].n and not _vis_small(v.frags[i].n, C):
            k += 1
    if k:
        hf = <gx_frag*>malloc(k * sizeof(gx_frag))
        if hf == NULL:
            with gil:
                raise MemoryError("ofi VIS: no memory for a fragment list")
        k = 0
        for i in range(v.nfrags):
            if v.frags[i].n and not _vis_small(v.frags[i].n, C):
                hf[k] = v.frags[i]
                k += 1
        try:
            net_vis(ep, t, put, hf, k, GX_BLOCKING, True, NULL)
        finally:
            free(hf)
    if x.handle != NULL:
        x.handle[0] = NULL
    return 0
