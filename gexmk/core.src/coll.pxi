# ---- barriers and collectives on the data path (GASNet-EX gex_Coll_*) ---------
#
# The library owns a sync area: at init every process creates a hidden
# endpoint (index _SYNC_EP, never among client.eps) with a small host
# segment, and publishes it with one bootstrap exchange.  The segment is cut
# into blocks; a team takes one block per Team object at its first
# collective (one bootstrap exchange of the blocks' addresses, collective
# like the call itself) and keeps it while it lives.  A block is
#   [0, _SYNC_BYTES)            one 64-bit arrival counter per barrier round
#   [_SYNC_BYTES, +2 * half)    scratch, two halves used alternately
# Barriers are dissemination barriers: in round k rank r adds 1 to round k's
# counter of rank (r + 2**k) % N (signal_op: a store on a mapping, a remote
# atomic over the network) and waits (wait_words) until its own round-k
# counter reaches the team's barrier sequence number.  Counters only grow,
# so barriers are matched by number: one that a member never enters times
# out naming the team, the barrier and the member it waited for; finalize's
# sync (the bootstrap's barrier) never counts.
#
# Collectives move data through the scratch halves: each rank stores its
# chunk (a 16-byte header, then the data) in its own half, the team passes
# a barrier, and readers fetch the chunks they need through the sync team's
# routes (memcpy on a mapping, a get over the network); reductions combine
# them in rank order (every rank computes the same bits; core.src/reduce.pxi,
# which also splits large allreduce chunks into reduce-scatter + allgather,
# two barriers per chunk).  Halves alternate
# per chunk, so one barrier per chunk suffices: a half is written again only
# after the next chunk's barrier, which every rank enters after reading.

cdef enum:
    _SYNC_EP = 1 << 30          # the hidden endpoint's index (never a user index)
    _SYNC_BYTES = 1024          # barrier counters of a block (up to 128 rounds)
    _HDR = 16                   # chunk header: total bytes, dtype char, op

OP_MULT = 1 << (GX_OP_COUNT + 1)   #: collectives only: product (GASNet-EX GEX_OP_MULT)

_COLL_OPS = {"sum": "add", "add": "add", "prod": "multiply", "mult": "multiply",
             "min": "minimum", "max": "maximum", "and": "bitwise_and", "band": "bitwise_and",
             "or": "bitwise_or", "bor": "bitwise_or", "xor": "bitwise_xor", "bxor": "bitwise_xor"}
_COLL_OP_FLAGS = {OP_ADD: "sum", OP_MULT: "prod", OP_MIN: "min", OP_MAX: "max", OP_AND: "and",
                  OP_OR: "or", OP_XOR: "xor"}
_OP_CODE = {"add": 1, "multiply": 2, "minimum": 3, "maximum": 4, "bitwise_and": 5,
            "bitwise_or": 6, "bitwise_xor": 7}

cdef object _np = None


cdef object _numpy():
    global _np
    if _np is None:
        import numpy
        _np = numpy
    return _np


cdef class _Sync:
    """The process's sync area: the hidden endpoint, its segment, the blocks."""
    cdef Endpoint ep
    cdef Segment seg
    cdef Py_ssize_t half            # bytes of one scratch half
    cdef Py_ssize_t block           # bytes of one block
    cdef list owners                # block -> weakref to its _Coll, or None


cdef int _sync_init(Client c) except -1:
    """init(): the hidden endpoint, its segment, published to every process."""
    cdef _Sync s = _Sync.__new__(_Sync)
    half = int(os.environ.get("GEXMK_COLL_SCRATCH", "") or 262144)
    nblocks = int(os.environ.get("GEXMK_COLL_TEAMS", "") or 32)
    if half < 64 or nblocks < 1:
        raise ArgumentError(f"GEXMK_COLL_SCRATCH={half} / GEXMK_COLL_TEAMS={nblocks}: need "
                            "at least 64 bytes and 1 team")
    s.half = (half + 63) & ~63
    s.block = _SYNC_BYTES + 2 * s.half
    s.owners = [None] * nblocks
    cdef Endpoint ep = Endpoint.__new__(Endpoint)
    ep.client = c
    ep._keep_put = []
    ep._keep_get = []
    ep.index = _SYNC_EP
    ep.c.index = _SYNC_EP
    ep.c.seg_kind = GX_MK_HOST
    ep.c.seg_device = -1
    ep.caps = EP_CAPABILITY_RMA
    ep.contexts = {}
    ep._blobs = {}
    s.ep = ep
    c._sync = s
    try:
        for tr in c._order:
            ctx = tr.open_endpoint(_SYNC_EP)
            ep.contexts[tr.name] = ctx
            ep.c.tr[ep.c.ntr].ops = <const gx_tr_ops*><uintptr_t>ctx.ops
            ep.c.tr[ep.c.ntr].ep = <void*><uintptr_t>ctx.handle
            ep.c.ntr += 1
        s.seg = c.segment_create(s.block * nblocks)
        ep.bind_segment(s.seg)
    except BaseException:
        ep._close_contexts()
        c._sync = None
        raise
    if c.size > 1:
        parts = c.bootstrap.exchange("gexmk.sync", list(range(c.size)), c.rank,
                                     pickle.dumps(c._seg_info(ep)))
        for jr, p in enumerate(parts):
            c._apply(jr, pickle.loads(p))
    return 0


cdef Endpoint _sync_ep(Client c):
    """The hidden endpoint (routes from it are chosen like any endpoint's)."""
    return (<_Sync>c._sync).ep if c._sync is not None else None


cdef void _sync_close(Client c) noexcept:
    if c._sync is not None:
        try:
            (<_Sync>c._sync).ep._close_contexts()
        except Exception:      # noqa: BLE001 - teardown goes on
            pass


cdef class _Coll:
    """One Team object's collective state: its block, the sync team over
    the members' hidden endpoints, the barrier and chunk sequence numbers."""
    cdef Team sync
    cdef gx_team* st
    cdef uintptr_t* base            # block address of every team rank
    cdef int* partner               # round k: the rank this one signals
    cdef int rounds
    cdef uint64_t store_rounds      # bit k: round k's partner takes stores, not atomics
    cdef int me, n
    cdef uint64_t seq               # barriers entered
    cdef uint64_t phase             # scratch chunks used (the half is phase % 2)
    cdef Py_ssize_t half
    cdef str tid
    cdef bytes sig
    cdef const char* csig          # sig, for nogil waits
    cdef object pending             # an NB collective not yet complete, or None
    cdef str broken                 # why the team's collectives can no longer be matched
    cdef object broken_type         # PeerDeadError after a member died, else StateError
    cdef object __weakref__

    def __dealloc__(self):
        free(self.base)
        free(self.partner)


cdef _Coll _coll(Team tm, str sig):
    """The team's collective state, made at its first collective."""
    tm.check_alive()
    if tm._pair:
        raise StateError(f"{sig}: collectives are not defined on a TM-pair")
    cdef _Coll co = tm._coll
    if co is not None:
        if co.broken is not None:
            raise (co.broken_type or StateError)(f"{sig}: {co.broken}")
        if co.pending is not None:
            ev = co.pending
            co.pending = None
            ev.wait()           # collectives of a team complete in order
        return co
    cdef Client c = tm.client
    cdef _Sync s = c._sync
    if s is None:
        raise StateError(f"{sig}: the client has no sync area")
    blk = -1
    for i, w in enumerate(s.owners):
        if w is None or w() is None:
            blk = i
            break
    if blk < 0:
        raise UnsupportedError(f"{sig}: more than {len(s.owners)} live teams of this process use "
                               "collectives (GEXMK_COLL_TEAMS raises the limit)")
    cdef uintptr_t mine = <uintptr_t>s.seg.addr + blk * s.block
    memset(<void*>mine, 0, _SYNC_BYTES)       # nobody signals it before the exchange below
    try:
        addrs = tm._exchange(mine)
    except TimeoutError_ as e:
        raise TimeoutError_(f"{sig} on team {tm.id}: the team's first collective (barrier #1) "
                            f"was not entered by every member: {e}") from None
    co = _Coll.__new__(_Coll)
    n = len(tm._members)
    co.n = n
    co.me = tm.c.rank
    co.half = s.half
    co.tid = tm.id
    co.sig = f"barrier of team {tm.id}".encode()
    co.csig = co.sig
    co.base = <uintptr_t*>calloc(n, sizeof(uintptr_t))
    co.partner = <int*>calloc(64, sizeof(int))
    if co.base == NULL or co.partner == NULL:
        raise MemoryError()
    for i in range(n):
        co.base[i] = addrs[i]
    k = 0
    while (1 << k) < n:
        co.partner[k] = (co.me + (1 << k)) % n
        k += 1
    co.rounds = k
    co.sync = Team._make(c, s.ep, [(jr, _SYNC_EP) for jr, _ in tm._members], tm.c.rank,
                         tm.id + "/sync", False)
    co.st = &co.sync.c
    # Where the path's small implicit puts land in issue order (Reach.ordered: an
    # ordered network), a round's arrival is the barrier's sequence number as one
    # 8-byte implicit store: a round-k counter has a single writer, its stores
    # arrive in issue order, and a store costs a network less than an atomic
    # (2-rank barrier over tcp: 20 us by atomics, 9 by stores)
    for k in range(co.rounds):
        keep = (<_Route>co.sync._route_objs[co.partner[k]]).keep
        if keep is not None and keep[0] is not None and getattr(keep[0][0], "ordered", False):
            co.store_rounds |= (<uint64_t>1) << k
    s.owners[blk] = weakref.ref(co)
    tm._coll = co
    return co


cdef inline int _arrive(_Coll co, int k, uint64_t seq) except -1 nogil:
    """Round k of barrier ``seq``: one arrival at the partner's round-k counter."""
    cdef int p = co.partner[k]
    cdef uintptr_t a = co.base[p] + 8 * k
    cdef int rc = gx_signal_op(co.st, p, a, 1, GX_SIGNAL_ADD)
    if rc != GX_OK:
        with gil:
            _arrive_slow(co, k, p, a, seq, rc)
    return 0


cdef int _arrive_slow(_Coll co, int k, int p, uintptr_t a, uint64_t seq, int rc) except -1:
    """The inline path declined: the route's atomics (implicit-event); where
    the route has none (a transport without remote atomics) or an ordered
    network (store_rounds), the barrier's sequence number as one 8-byte
    implicit store (a round-k counter has a single writer, whose stores land
    in issue order)."""
    cdef uint64_t v = seq
    cdef gx_val one, zero
    one.u64 = 1
    zero.u64 = 0
    if not (co.store_rounds >> k) & 1:
        try:
            # an implicit-event atomic: the arrival needs no answer (over the network
            # a blocking one cost a round trip per round); the partner's counter
            # reaching the sequence number is the only completion anyone waits for
            with nogil:
                _amo(co.st, p, a, GX_DT_U64, GX_OP_ADD, one, zero, NULL, GX_NBI, NULL, rc)
            return 0
        except UnsupportedError:
            co.store_rounds |= (<uint64_t>1) << k
    with nogil:
        _rma(co.st, p, True, a, &v, 8, GX_NBI_LCNOW, NULL, NULL)
    return 0


cdef inline int _arrived(_Coll co, int k, uint64_t seq, bint block, double timeout) except -1 nogil:
    """1 when round k's counter has reached ``seq`` (waits when ``block``)."""
    cdef uintptr_t a = co.base[co.me] + 8 * k
    cdef gx_val want
    cdef Py_ssize_t idx
    want.u64 = seq
    return <int>wait_words(co.st, &a, 1, GX_DT_U64, GX_CMP_GE, &want, False, GX_WAIT_ANY, block,
                           timeout, NULL, &idx, co.csig)


cdef int _barrier_failed(_Coll co, uint64_t seq, int k, object e) except -1:
    src = (<object>co.me - (1 << k)) % co.n       # Python's modulo: never negative
    co.broken_type = PeerDeadError if isinstance(e, PeerDeadError) else StateError
    co.broken = (f"barrier #{seq} of team {co.tid} failed (team rank {co.me} of {co.n}, "
                 f"waiting for team rank {src} in round {k}); the team's barriers and "
                 "collectives can no longer be matched")
    raise type(e)(f"{co.broken}: {e}") from None


cdef int _barrier(_Coll co, double timeout) except -1:
    """A blocking barrier over the team."""
    co.seq += 1
    cdef uint64_t seq = co.seq
    cdef int k = 0
    try:
        with nogil:
            while k < co.rounds:
                _arrive(co, k, seq)
                _arrived(co, k, seq, True, timeout)
                k += 1
    except (TimeoutError_, PeerDeadError, StateError) as e:
        _barrier_failed(co, seq, k, e)
    return 0


cdef class _CollEvent(Event):
    """An NB barrier or collective: progressed by test() and wait().  A
    collective runs as a generator that yields where it needs a barrier."""
    cdef _Coll co
    cdef uint64_t seq               # the barrier in progress, 0 when none
    cdef int k                      # its round to wait for
    cdef object gen

    cdef int _start_barrier(self) except -1:
        self.co.seq += 1
        self.seq = self.co.seq
        self.k = 0
        if self.co.rounds > 0:
            _arrive(self.co, 0, self.seq)
        return 0

    cdef int _step_barrier(self, bint block) except -1:
        """1 once the barrier in progress has completed."""
        cdef _Coll co = self.co
        try:
            while self.k < co.rounds:
                if block:
                    with nogil:
                        _arrived(co, self.k, self.seq, True, 0)
                elif not _arrived(co, self.k, self.seq, False, 0):
                    return 0
                self.k += 1
                if self.k < co.rounds:
                    _arrive(co, self.k, self.seq)
        except (TimeoutError_, PeerDeadError, StateError) as e:
            _barrier_failed(co, self.seq, self.k, e)
        self.seq = 0
        return 1

    cdef int _complete(self, bint block) except -1:
        if self._failed is not None:
            raise self._failed
        try:
            while True:
                if self.seq != 0 and not self._step_barrier(block):
                    return 0
                if self.gen is None:
                    break
                try:
                    next(self.gen)
                except StopIteration:
                    self.gen = None
                    break
                self._start_barrier()
        except BaseException:
            self._done = True
            self._keep = None
            self.gen = None
            if self.co.pending is self:
                self.co.pending = None
            raise
        self._done = True
        self._keep = None
        if self.co.pending is self:
            self.co.pending = None
        return 1


cdef _CollEvent _coll_event(Team tm, _Coll co, object gen, object keep):
    cdef _CollEvent ev = _CollEvent.__new__(_CollEvent)
    ev._bound = True
    ev.co = co
    ev.gen = gen
    ev._keep = keep
    tm.client._pending.add(ev)
    co.pending = ev
    if gen is None:
        ev._start_barrier()
    else:
        ev._complete(False)     # post this rank's data and arrive at once
    return ev


# ---- argument intake ------------------------------------------------------------

cdef object _as_array(object a, str sig, str name, bint writable):
    np = _numpy()
    if writable:
        if not isinstance(a, np.ndarray):
            raise TypeError(f"{sig}: {name} must be a writable numpy array (got {_got(a)})")
        if not a.flags.c_contiguous or not a.flags.writeable:
            raise ArgumentError(f"{sig}: {name} must be C-contiguous and writable")
        arr = a
    else:
        try:
            arr = np.ascontiguousarray(a)
        except Exception:
            raise TypeError(f"{sig}: {name} must be a numpy array or array-like (got {_got(a)})") from None
    if arr.dtype.kind not in "biufc":
        raise TypeError(f"{sig}: {name} has dtype {arr.dtype}; collectives take numeric or bool "
                        "numpy dtypes")
    return arr.reshape(-1)      # a view: C-contiguous


cdef object _coll_op(object op, object dtype, str sig):
    """The numpy ufunc of a reduction op (OP_* flag or name)."""
    np = _numpy()
    name = None
    if isinstance(op, str):
        name = _COLL_OPS.get(op.lower())
    elif hasattr(type(op), "__index__") and not isinstance(op, bool):
        key = _COLL_OP_FLAGS.get(int(op))
        name = _COLL_OPS[key] if key is not None else None
    if name is None:
        raise ArgumentError(f"{sig}: op must be one of OP_ADD, OP_MULT, OP_MIN, OP_MAX, OP_AND, "
                            f"OP_OR, OP_XOR or 'sum', 'prod', 'min', 'max', 'and', 'or', 'xor' "
                            f"(got {op!r})")
    if name.startswith("bitwise") and dtype.kind not in "biu":
        raise TypeError(f"{sig}: op {op!r} is bitwise: it takes integer or bool dtypes, not {dtype}")
    return getattr(np, name)


cdef int _check_root(_Coll co, object root, str sig) except -1:
    r = _as_int(root, sig, "root")
    if not 0 <= r < co.n:
        raise RankError(f"{sig}: root {r} is outside the team (size {co.n})")
    return r


cdef int _check_header(_Coll co, int p, uintptr_t at, bytes mine, str sig) except -1:
    """Rank p's chunk header must equal this rank's (sizes, dtype, op agree)."""
    cdef char theirs[_HDR]
    co.sync._get(theirs, p, at, _HDR)
    got = theirs[:_HDR]
    if got != mine:
        tn, tc, to = struct.unpack("<qcxxxxxxB", got)
        mn, mc, mo = struct.unpack("<qcxxxxxxB", mine)
        raise ArgumentError(f"{sig}: team rank {p} passed {tn} bytes of dtype {tc.decode()!r} "
                            f"(op {to}), this rank {mn} bytes of dtype {mc.decode()!r} (op {mo}): "
                            "every member must pass matching buffers")
    return 0


cdef inline uintptr_t _half_addr(_Coll co, int p, uint64_t phase) noexcept nogil:
    return co.base[p] + _SYNC_BYTES + (phase & 1) * co.half


# ---- Team methods (delegated from team.pxi) --------------------------------------

cdef object _tm_barrier(Team tm, object timeout, bint nb):
    sig = "barrier_nb()" if nb else "barrier(timeout=None)"
    cdef double t = _as_timeout(timeout, sig) if timeout is not None else 0
    cdef _Coll co = _coll(tm, sig)
    if nb:
        return _coll_event(tm, co, None, None)
    _barrier(co, t)
    return None
