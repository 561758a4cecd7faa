# ---- barriers and collectives on the data path (GASNet-EX gex_Coll_*) ---------
#
# The library owns a sync area: at init every process creates a hidden
# endpoint (index _SYNC_EP, never among client.eps) with a small host
# segment, and publishes it with one bootstrap exchange.  The segment is cut
# into blocks; a team takes one block per Team object at its first
# collective (one bootstrap exchange of the blocks' addresses, collective
# like the call itself) and keeps it while it lives.  A block is
#   [0, _SYNC_BYTES)            64-bit barrier words: one arrival counter per
#                               dissemination round (words 0..63), the release
#                               word (_REL_W), one gather slot per member of
#                               the node (_GATHER_W + j, j >= 1)
#   [_SYNC_BYTES, +2 * half)    scratch, two halves used alternately
# Every barrier word counts barriers: it has a single writer, which adds 1
# (signal_op: a store on a mapping, a remote atomic or, over an ordered
# network, the barrier's sequence number as one store) once per barrier, so
# a waiter waits (wait_words) until the word reaches the team's barrier
# sequence number.  Counters only grow, so barriers are matched by number:
# one that a member never enters times out naming the team, the barrier and
# the member it waited for; finalize's sync (the bootstrap's barrier) never
# counts.
#
# A team on one node (or with one member per node) runs one dissemination
# barrier over all members: in round k rank r arrives at round k's counter
# of rank (r + 2**k) % N and waits for its own.  A team spanning nodes with
# several members on some node (client.nodes(): a node is a host and network
# namespace) runs it hierarchically, so no member but one per node touches
# the network: the members of a node arrive at their leader's gather slots
# (the node's lowest team rank; shared memory), the leaders run the
# dissemination among themselves (network rounds only), then each leader
# bumps its members' release words.  GEXMK_COLL_HIER=0 keeps the flat form
# (for comparisons).
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
    _SYNC_BYTES = 4096          # barrier words of a block (512)
    _ROUNDS_MAX = 64            # dissemination round counters: words 0..63
    _GATHER_W = 64              # a leader's gather slot of its node's member j >= 1: word 64 + j
    _REL_W = 64                 # a member's release word (slot 0: a leader's barrier entered)
    _LOCAL_MAX = 512 - 64       # members of one node a hierarchical barrier takes
    _ROLE_FLAT = 0              # one dissemination over the whole team
    _ROLE_LEADER = 1            # gather the node, dissemination among leaders, release
    _ROLE_MEMBER = 2            # arrive at the leader, wait for its release
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
    the members' hidden endpoints, the barrier's shape (flat, or this
    member's part of the hierarchical one) and the barrier and chunk
    sequence numbers."""
    cdef Team sync
    cdef gx_team* st
    cdef uintptr_t* base            # block address of every team rank
    cdef int* partner               # round k: the rank this one signals
    cdef int* source                # round k: the rank that signals this one
    cdef int rounds
    cdef uint64_t store_rounds      # bit k: round k's partner takes stores, not atomics
    cdef int role                   # _ROLE_FLAT / _ROLE_LEADER / _ROLE_MEMBER
    cdef int nsteps                 # a barrier's steps (arrive, then wait): see _step_arrive
    cdef int leader                 # a member: its node's leader (team rank)
    cdef int slot                   # a member: its gather slot's word at the leader
    cdef list mates                 # hierarchical: this node's members (team ranks; [0] leads)
    cdef int nlocal                 # a leader: members of its node, itself included
    cdef int* local                 # a leader: their team ranks (local[0] is itself)
    cdef uintptr_t* gather          # a leader: its gather slots' addresses (nlocal - 1)
    cdef uint64_t net_rounds        # hierarchical: bit k: round k's source is on another node
    cdef bint data                  # the barrier in progress is a collective's (see _step_done)
    cdef int me, n
    cdef uint64_t seq               # barriers entered
    cdef uint64_t phase             # scratch chunks used (the half is phase % 2)
    cdef Py_ssize_t half
    cdef str tid
    cdef bytes sig
    cdef const char* csig          # sig, for nogil waits
    cdef object pending             # an NB collective not yet complete, or None
    cdef object team                # weak reference to the Team (its publications settle here)
    cdef object sync_error          # an earlier operation's failure, raised once this one ran
    cdef str broken                 # why the team's collectives can no longer be matched
    cdef object broken_type         # PeerDeadError after a member died, else StateError
    cdef object __weakref__

    def __dealloc__(self):
        free(self.base)
        free(self.partner)
        free(self.source)
        free(self.local)
        free(self.gather)


cdef bint _ordered(_Coll co, int p):
    """Small implicit puts from the sync endpoint to team rank p land in issue
    order (Reach.ordered: an ordered network): a counter with one writer can
    take the barrier's sequence number as one 8-byte store, which costs a
    network less than an atomic (2-rank barrier over tcp: 20 us by atomics,
    9 by stores)."""
    keep = (<_Route>co.sync._route_objs[p]).keep
    return keep is not None and keep[0] is not None and bool(getattr(keep[0][0], "ordered", False))


cdef int _shape(_Coll co, list nodes) except -1:
    """The barrier's shape from the node of every team rank: flat on one
    node (or one member per node, or GEXMK_COLL_HIER=0), else this member's
    part of the hierarchical barrier.  Every member computes the same shape
    from the same job-wide node table."""
    cdef int n = co.n, k, i, j
    groups = {}
    for i in range(n):
        groups.setdefault(nodes[i], []).append(i)        # team ranks in order: [0] leads
    biggest = max(len(g) for g in groups.values()) if groups else 0
    hier = (len(groups) > 1 and 1 < biggest <= _LOCAL_MAX
            and os.environ.get("GEXMK_COLL_HIER", "1").strip() not in ("0", "no", "false", "off"))
    mine = groups[nodes[co.me]] if n else [co.me]
    if hier:
        co.mates = mine
    if hier and mine[0] != co.me:
        co.role = _ROLE_MEMBER
        co.leader = mine[0]
        j = mine.index(co.me)
        co.slot = j
        co.nsteps = 1
        return 0
    ring = sorted(g[0] for g in groups.values()) if hier else list(range(n))
    li = ring.index(co.me)
    k = 0
    while (1 << k) < len(ring):
        co.partner[k] = ring[(li + (1 << k)) % len(ring)]
        co.source[k] = ring[(li - (1 << k)) % len(ring)]
        if hier and nodes[co.source[k]] != nodes[co.me]:
            co.net_rounds |= (<uint64_t>1) << k
        if _ordered(co, co.partner[k]):
            co.store_rounds |= (<uint64_t>1) << k
        k += 1
    co.rounds = k
    if not hier:
        co.role = _ROLE_FLAT
        co.nsteps = k
        return 0
    co.role = _ROLE_LEADER
    co.nlocal = len(mine)
    co.local = <int*>calloc(co.nlocal, sizeof(int))
    co.gather = <uintptr_t*>calloc(co.nlocal, sizeof(uintptr_t))
    if co.local == NULL or co.gather == NULL:
        raise MemoryError()
    for j in range(co.nlocal):
        co.local[j] = mine[j]
        if j:
            co.gather[j - 1] = co.base[co.me] + 8 * (_GATHER_W + j)
    co.nsteps = 1 + k           # the gather, then the rounds; the release ends it
    return 0


cdef object _quiet_unsynced():
    """Complete every user endpoint's outstanding implicit puts and atomics, and
    its put_signals' signals, before a collective (OpenSHMEM/NVSHMEM barrier_all,
    MPI's fence): what a rank put before a barrier is at the target after it, on
    every path.  One load when nothing went out since the last one.  Returns the
    first failure among them (None if none): the collective still runs, so the
    team's members stay matched, and raises it after (_raise_sync_error)."""
    global _any_unsynced
    if not _any_unsynced:
        return None
    _any_unsynced = 0
    cdef Endpoint e
    err = None
    for e in _sync_eps():
        if e.c.unsynced and not e.c.destroyed:
            try:
                _nbi_sync(EC_PUT | EC_RMW, e)
            except GexmkError as x:
                if err is None:
                    err = x
    return err


cdef int _raise_sync_error(_Coll co) except -1:
    """Raise what _quiet_unsynced found before this collective, now that it ran."""
    err = co.sync_error
    if err is not None:
        co.sync_error = None
        raise err
    return 0


cdef _Coll _coll(Team tm, str sig):
    """The team's collective state, made at its first collective; the
    process's outstanding puts and atomics are completed first."""
    tm.check_alive()
    if tm._pair:
        raise StateError(f"{sig}: collectives are not defined on a TM-pair")
    err = _quiet_unsynced()
    cdef _Coll co = tm._coll
    if co is not None:
        if co.broken is not None:
            raise (co.broken_type or StateError)(f"{sig}: {co.broken}")
        if co.pending is not None:
            ev = co.pending
            co.pending = None
            ev.wait()           # collectives of a team complete in order
        co.sync_error = err
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
    co.partner = <int*>calloc(_ROUNDS_MAX, sizeof(int))
    co.source = <int*>calloc(_ROUNDS_MAX, sizeof(int))
    if co.base == NULL or co.partner == NULL or co.source == NULL:
        raise MemoryError()
    for i in range(n):
        co.base[i] = addrs[i]
    co.sync = Team._make(c, s.ep, [(jr, _SYNC_EP) for jr, _ in tm._members], tm.c.rank,
                         tm.id + "/sync", False)
    co.st = &co.sync.c
    _shape(co, [c._nodes[jr] for jr, _ in tm._members])
    s.owners[blk] = weakref.ref(co)
    tm._coll = co
    co.team = weakref.ref(tm)
    co.sync_error = err
    return co


cdef inline int _bump(_Coll co, int p, uintptr_t a, uint64_t seq, int store) except -1 nogil:
    """Barrier ``seq``'s arrival at team rank p's barrier word ``a``: one more
    on the counter, which then equals ``seq``.  ``store`` (for the slow path):
    1 where the route is known to take stores, 0 where it takes atomics, 2
    to ask the route (a node-local word: the route nearly always maps it)."""
    cdef int rc = gx_signal_op(co.st, p, a, 1, GX_SIGNAL_ADD)
    if rc == GX_OK:
        return 0
    with gil:
        rc = _bump_slow(co, p, a, seq, store, rc)
    return rc


cdef int _bump_slow(_Coll co, int p, uintptr_t a, uint64_t seq, int store, int rc) except -1:
    """1 when the arrival went as a store (the caller stores from then on),
    else 0.  The inline path declined: the route's atomics (implicit-event); where
    the route has none (a transport without remote atomics) or is an ordered
    network (``store``), the barrier's sequence number as one 8-byte implicit
    store (a barrier word has a single writer, whose stores land in issue
    order there)."""
    cdef uint64_t v = seq
    cdef gx_val one, zero
    one.u64 = 1
    zero.u64 = 0
    if rc != GX_NOT_MAPPED:
        # a dead member (or a closed team): its arrival is never sent (a
        # network write to a dead process could only fail, and some
        # libraries crash reporting that)
        return _raise_rc(co.st, p, a, 8, rc, "barrier arrival")
    if store == 2:
        store = _ordered(co, p)
    if not store:
        try:
            # an implicit-event atomic: the arrival needs no answer (over the network
            # a blocking one cost a round trip per round); the word reaching the
            # sequence number is the only completion anyone waits for
            with nogil:
                _amo(co.st, p, a, GX_DT_U64, GX_OP_ADD, one, zero, NULL, GX_NBI, NULL, rc)
            return 0
        except UnsupportedError:
            pass            # stores from now on: see the callers
    with nogil:
        _rma(co.st, p, True, a, &v, 8, GX_NBI_LCNOW, NULL, NULL)
    return 1


# A barrier is co.nsteps steps, each an arrival (_step_arrive) and then a wait
# (_step_done), then the release (_release):
#   flat:    step k = dissemination round k
#   leader:  step 0 = wait for the node's members at the gather slots (no
#            arrival); step 1 + k = round k among the leaders; the release
#            bumps every member's release word
#   member:  step 0 = arrive at the leader's gather slot, wait for release

cdef int _step_arrive(_Coll co, int step, uint64_t seq) except -1 nogil:
    cdef int k, p
    if co.role == _ROLE_MEMBER:
        _bump(co, co.leader, co.base[co.leader] + 8 * (_GATHER_W + co.slot), seq, 2)
        return 0
    k = step - 1 if co.role == _ROLE_LEADER else step
    if k < 0:
        # the leader entered: its own slot says so to a member that times out
        (<volatile uint64_t*>(co.base[co.me] + 8 * _GATHER_W))[0] = seq
        return 0
    p = co.partner[k]
    if _bump(co, p, co.base[p] + 8 * k, seq, (co.store_rounds >> k) & 1):
        co.store_rounds |= (<uint64_t>1) << k
    return 0


# How a hierarchical barrier's waits wait (a flat one waits as every wait
# does: see signal.pxi's _SPIN_FOR).  A round's word is written across the
# network, which lands it only when this process drives progress and cannot
# wake a sleeper: a leader keeps polling, yielding the CPU, for up to
# _NET_YIELD s before it sleeps (a nap costs a timer wake-up, >= 50 us of
# slack, per round).  A gather slot or release word is written by a CPU store
# on this node, which wakes a sleeper: the process's own spin and yield, then
# a futex sleep.  In a collective's barrier such a wait drives the network on
# every pass (peers may still be reading this member's scratch over the
# network, which the target's progress serves); in a plain barrier only
# between sleeps: a member has nothing to receive, its polls would take the
# CPU its leader needs on a full node, and driving now and then keeps a network
# transport's progress thread standing aside (left alone, it polls every 20 us).
cdef double _NET_YIELD = 2e-3
cdef double _net_spin = -1, _net_yield = _NET_YIELD
cdef int _local_progress = -1          # -1: the default (_local_prog); 0: never; 1: every pass; 2: between sleeps
cdef double _local_yield = -1          # -1: the process's yield time


def _coll_wait_tuning(net_spin_us=None, net_yield_us=None, local_progress=None,
                      local_yield_us=None):
    """Private, for benchmarks: how a hierarchical barrier waits.  A leader on
    a network round spins ``net_spin_us`` (-1: the process's spin time), then
    yields until ``net_yield_us``, then sleeps; gather and release waits
    drive the network per ``local_progress`` (-1: on every pass in a
    collective's barrier, between sleeps in a plain one; 0: never; 1: every
    pass; 2: between sleeps) and yield until ``local_yield_us`` (-1: the
    process's time).  Returns the four in force."""
    global _net_spin, _net_yield, _local_progress, _local_yield
    if net_spin_us is not None:
        _net_spin = float(net_spin_us) * 1e-6 if net_spin_us >= 0 else -1
    if net_yield_us is not None:
        _net_yield = float(net_yield_us) * 1e-6
    if local_progress is not None:
        _local_progress = int(local_progress)
    if local_yield_us is not None:
        _local_yield = float(local_yield_us) * 1e-6 if local_yield_us >= 0 else -1
    return (_net_spin * 1e6 if _net_spin >= 0 else -1, _net_yield * 1e6, _local_progress,
            _local_yield * 1e6 if _local_yield >= 0 else -1)


cdef inline int _local_prog(_Coll co) noexcept nogil:
    if _local_progress >= 0:
        return _local_progress
    return 1 if co.data else 2


cdef int _step_done(_Coll co, int step, uint64_t seq, bint block, double timeout) except -1 nogil:
    """1 when the step's wait is satisfied (waits when ``block``)."""
    cdef gx_val want
    cdef Py_ssize_t idx
    cdef uintptr_t a
    cdef int k
    want.u64 = seq
    if co.role == _ROLE_MEMBER:
        a = co.base[co.me] + 8 * _REL_W
        return <int>wait_words_as(co.st, &a, 1, GX_DT_U64, GX_CMP_GE, &want, False, GX_WAIT_ANY,
                                  block, timeout, NULL, &idx, co.csig, _spin_for,
                                  _local_yield if _local_yield >= 0 else _yield_for,
                                  _local_prog(co))
    k = step - 1 if co.role == _ROLE_LEADER else step
    if k >= 0:
        a = co.base[co.me] + 8 * k
        if (co.net_rounds >> k) & 1:
            return <int>wait_words_as(co.st, &a, 1, GX_DT_U64, GX_CMP_GE, &want, False,
                                      GX_WAIT_ANY, block, timeout, NULL, &idx, co.csig,
                                      _net_spin if _net_spin >= 0 else _spin_for,
                                      _net_yield, 1)
        return <int>wait_words(co.st, &a, 1, GX_DT_U64, GX_CMP_GE, &want, False, GX_WAIT_ANY,
                               block, timeout, NULL, &idx, co.csig)
    if co.nlocal < 2:
        return 1
    return <int>wait_words_as(co.st, co.gather, co.nlocal - 1, GX_DT_U64, GX_CMP_GE, &want, False,
                              GX_WAIT_ALL, block, timeout, NULL, NULL, co.csig, _spin_for,
                              _local_yield if _local_yield >= 0 else _yield_for,
                              _local_prog(co)) != 0


cdef int _release(_Coll co, uint64_t seq) except -1 nogil:
    """A leader, after the last round: its node's members may leave."""
    cdef int j
    if co.role != _ROLE_LEADER:
        return 0
    for j in range(1, co.nlocal):
        _bump(co, co.local[j], co.base[co.local[j]] + 8 * _REL_W, seq, 2)
    return 0


cdef str _missing(_Coll co, uint64_t seq):
    """Who of this node has not entered barrier ``seq``, read in place at the
    leader's block (on this node): "team rank 2, the leader," when the leader
    has not, else the members missing from its gather slots ("team rank 3"),
    "" when all are there, None where the block is not mapped here."""
    cdef char* p
    cdef gx_route* rt
    cdef int leader = co.mates[0]
    found = []
    for j in range(len(co.mates)):
        if gx_locate(co.st, leader, co.base[leader] + 8 * (_GATHER_W + j), 8, &p, &rt) != GX_OK:
            return None
        if (<volatile uint64_t*>p)[0] < seq:
            if j == 0 and co.me != leader:
                return f"team rank {leader}, the leader,"
            if j:
                found.append(str(co.mates[j]))
    return f"team rank {', '.join(found)}" if found else ""


cdef int _barrier_failed(_Coll co, uint64_t seq, int step, object e) except -1:
    cdef int k = step - 1 if co.role == _ROLE_LEADER else step
    if co.role == _ROLE_MEMBER:
        gone = _missing(co, seq)
        why = (f"waiting for team rank {co.leader}, its node's leader, to release it"
               + (f" ({gone} of this node never entered it)" if gone
                  else " (every member of this node arrived: the leader waits for other nodes)"
                  if gone is not None else ""))
    elif co.role == _ROLE_LEADER and k < 0:
        gone = _missing(co, seq)
        why = f"waiting for {gone or 'a member'} of this node to arrive"
    elif k >= co.rounds:
        why = "releasing its node's members"
    elif co.role == _ROLE_LEADER:
        why = (f"waiting for team rank {co.source[k]}, the leader of another node, in round {k} "
               "across nodes")
    else:
        why = f"waiting for team rank {co.source[k]} in round {k}"
    co.broken_type = PeerDeadError if isinstance(e, PeerDeadError) else StateError
    co.broken = (f"barrier #{seq} of team {co.tid} failed (team rank {co.me} of {co.n}, {why}); "
                 "the team's barriers and collectives can no longer be matched")
    raise type(e)(f"{co.broken}: {e}") from None


cdef uint64_t _coll_entered(object c):
    """Barriers a team's collective state ``c`` (or None) has entered."""
    return (<_Coll>c).seq if c is not None else 0


cdef int _settle(_Coll co) except -1 nogil:
    """A barrier completed: what transports took in before it is applied
    before it returns (GX_WAIT_SETTLE: a peer's put_signal that its quiet
    counted complete, still an unread message here).  Through the team's
    endpoint and the sync team's (the transports of both)."""
    cdef gx_ep* e
    cdef int i
    e = co.st.ep
    for i in range(e.ntr):
        e.tr[i].ops.nbi_test(e.tr[i].ep, GX_WAIT_SETTLE)
    return 0


cdef int _barrier(_Coll co, double timeout, bint data) except -1:
    """A blocking barrier over the team (``data``: a collective's, see _NET_YIELD)."""
    co.data = data
    co.seq += 1
    cdef uint64_t seq = co.seq
    cdef int step = 0
    try:
        with nogil:
            while step < co.nsteps:
                _step_arrive(co, step, seq)
                _step_done(co, step, seq, True, timeout)
                step += 1
            _release(co, seq)
            _settle(co)
    except (TimeoutError_, PeerDeadError, StateError) as e:
        _barrier_failed(co, seq, step, e)
    _published_settled(co, seq)
    return 0


cdef int _published_settled(_Coll co, uint64_t seq) except -1:
    """Barrier ``seq`` of the team completed: publications made before it
    entered are applied by every member (Team._settled)."""
    tm = co.team() if co.team is not None else None
    if tm is not None:
        (<Team>tm)._settled(seq)
    return 0


cdef class _CollEvent(Event):
    """An NB barrier or collective: progressed by test() and wait().  A
    collective runs as a generator that yields where it needs a barrier."""
    cdef _Coll co
    cdef uint64_t seq               # the barrier in progress, 0 when none
    cdef int step                   # its step to wait for
    cdef object gen

    cdef int _start_barrier(self) except -1:
        self.co.data = self.gen is not None
        self.co.seq += 1
        self.seq = self.co.seq
        self.step = 0
        if self.co.nsteps > 0:
            _step_arrive(self.co, 0, self.seq)
        return 0

    cdef int _step_barrier(self, bint block) except -1:
        """1 once the barrier in progress has completed."""
        cdef _Coll co = self.co
        try:
            while self.step < co.nsteps:
                if block:
                    with nogil:
                        _step_done(co, self.step, self.seq, True, 0)
                elif not _step_done(co, self.step, self.seq, False, 0):
                    return 0
                self.step += 1
                if self.step < co.nsteps:
                    _step_arrive(co, self.step, self.seq)
            _release(co, self.seq)
            with nogil:
                _settle(co)
        except (TimeoutError_, PeerDeadError, StateError) as e:
            _barrier_failed(co, self.seq, self.step, e)
        _published_settled(co, self.seq)
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
        ev = _coll_event(tm, co, None, None)
        _raise_sync_error(co)
        return ev
    _barrier(co, t, False)
    _raise_sync_error(co)
    return None


cdef object _tm_barrier_shape(Team tm):
    cdef _Coll co = tm._coll
    if co is None:
        return None
    return {"role": ("flat", "leader", "member")[co.role], "node_members": list(co.mates or []),
            "rounds": 0 if co.role == _ROLE_MEMBER else co.rounds}
