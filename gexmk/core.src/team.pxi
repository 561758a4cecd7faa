# ---- teams and RMA ----------------------------------------------------------

cdef void _set_dev_range(gx_team* c, Segment s) noexcept:
    """The team's view of its endpoint's bound segment when it is device
    memory: a local buffer there never reaches a CPU memcpy."""
    if s is not None and s.kind.cls != GX_MK_HOST:
        c.dev_lo = <uintptr_t>s.addr
        c.dev_hi = <uintptr_t>s.addr + s.size
    else:
        c.dev_lo = c.dev_hi = 0


cdef class Team:
    """A team (GASNet-EX ``gex_TM_t``): an ordered set of endpoints, seen from
    one local member endpoint.  RMA calls name the target by team rank and
    a remote address inside the target's bound segment (an address in the
    target process, as GASNet-EX; ``addr(rank, offset)`` builds one)."""

    def __init__(self):
        raise TypeError("teams come from client.tm, ep.pair(), tm.split(), tm.create() or tm.dup()")

    def __dealloc__(self):
        free(self.c.routes)

    @staticmethod
    cdef Team _make(Client client, Endpoint ep, list members, int rank, str tid, bint pair):
        cdef Team tm = Team.__new__(Team)
        tm.client = client
        tm.ep = ep
        tm._members = members
        tm.id = tid
        tm._pair = pair
        tm.c.rank = rank
        tm.c.owner = <void*>tm
        tm.c.ep = &ep.c
        _set_dev_range(&tm.c, ep.segment)
        tm._set_routes()
        client._teams.add(tm)
        client._connect(tm._route_objs)     # new routes to published targets: connect now
        return tm

    cdef int _set_routes(self) except -1:
        cdef int n = len(self._members)
        cdef gx_route** arr = <gx_route**>calloc(n if n else 1, sizeof(gx_route*))
        cdef _Route rt
        if arr == NULL:
            raise MemoryError()
        self._route_objs = []
        for i, (jr, epi) in enumerate(self._members):
            rt = self.client.route(self.ep, jr, epi)
            self._route_objs.append(rt)
            arr[i] = rt.r
        self.c.routes = arr
        self.c.size = n
        return 0

    cdef void _close(self, str why) noexcept:
        self._closed = f"the team is closed ({why})"
        self.c.size = 0     # every rank now fails the fast path's check

    cdef int check_alive(self) except -1:
        if self._closed is not None:
            raise StateError(self._closed)
        return 0

    @property
    def rank(self):
        """This member's rank in the team (GASNet-EX ``gex_TM_QueryRank``)."""
        return self.c.rank

    @property
    def size(self):
        """Number of members (GASNet-EX ``gex_TM_QuerySize``)."""
        return len(self._members)

    def __repr__(self):
        return f"<gexmk.Team {self.id} rank {self.c.rank} of {len(self._members)}>"

    # -- rank translation --

    def ep_location(self, rank):
        """(job rank, endpoint index) of team rank ``rank``."""
        return self._members[self._check_rank(rank, "ep_location")]

    def translate_rank_to_jobrank(self, rank):
        """Job rank of team rank ``rank`` (GASNet-EX ``gex_TM_TranslateRankToJobrank``)."""
        return self._members[self._check_rank(rank, "translate_rank_to_jobrank")][0]

    def translate_jobrank_to_rank(self, jobrank):
        """Team rank of job rank ``jobrank`` or None when it is not a member
        (GASNet-EX ``gex_TM_TranslateJobrankToRank``; first match for a
        process holding several members)."""
        jobrank = _as_int(jobrank, "translate_jobrank_to_rank", "jobrank")
        if jobrank < 0 or jobrank >= self.client.size:
            raise RankError(f"translate_jobrank_to_rank: job rank {jobrank} is outside the job "
                            f"(size {self.client.size})")
        for i, (jr, _) in enumerate(self._members):
            if jr == jobrank:
                return i
        return None

    cdef int _check_rank(self, object rank, str sig) except -1:
        """``rank`` (any integer object) as a rank of this live team, or
        RankError naming the call."""
        cdef int r = _as_rank(rank, sig, &self.c)
        self.check_alive()
        if r < 0 or r >= len(self._members):
            raise RankError(f"{_fn(sig)}: rank {r} is outside the team (size {len(self._members)})")
        return r

    def transport(self, rank):
        """Name of the path that reaches team rank ``rank`` for RMA (e.g.
        the transports' path names), or 'none' (nothing published yet)."""
        return (<_Route>self._route_objs[self._check_rank(rank, "transport")]).rma_name

    def paths(self, rank):
        """``{'rma': name, 'atomic': name}``: the paths chosen for team rank
        ``rank``, separately for RMA and atomics; and ``'vis': name`` where
        the RMA path moves vector, indexed and strided transfers of small
        blocks another way (a network transport that packs them through the
        target's landing zone names that path here)."""
        cdef _Route rt = self._route_objs[self._check_rank(rank, "paths")]
        out = {"rma": rt.rma_name, "atomic": rt.amo_name}
        best = rt.keep[0] if rt.keep is not None else None
        vis = getattr(best[0], "vis", None) if best is not None else None
        if vis and vis != rt.rma_name:
            out["vis"] = vis
        return out

    def path_stats(self, rank=None):
        """Operations and bytes per path to team rank ``rank``: ``{path:
        {"put"|"get"|"atomic": {"ops": n, "bytes": b, "inline": k}}}`` (``inline``:
        how many the inline memcpy of a CPU mapping served); with ``rank=None``,
        ``{team rank: that}`` for every member.  The counters belong to the
        route (this team's endpoint, the member's endpoint), so teams over the
        same endpoints (``dup``, ``split``) share them; ``reset_path_stats``
        zeroes them.  A path that served nothing is absent."""
        cdef _Route rt
        self.check_alive()
        if rank is not None:
            rt = self._route_objs[self._check_rank(rank, "path_stats(rank=None)")]
            rt.fold()
            return _stats_add({}, rt.stats)
        out = {}
        for i, rt in enumerate(self._route_objs):
            rt.fold()
            out[i] = _stats_add({}, rt.stats)
        return out

    def reset_path_stats(self):
        """Zero the :meth:`path_stats` counters of this team's routes."""
        cdef _Route rt
        self.check_alive()
        for rt in self._route_objs:
            rt.reset()

    def peer_view(self, rank):
        """A zero-copy device array (CUDA array interface v3, DLPack; 1-D
        uint8) over team rank ``rank``'s device segment as mapped in this
        process (NVSHMEM ``nvshmem_ptr``): kernels of this process (CuPy,
        Numba, Triton, PyTorch) load and store through it directly.  Valid
        until that rank publishes again or this client is finalized.  Raises
        UnsupportedError where no such mapping exists (host segments, other
        nodes, peers reached by copies only)."""
        cdef int r = self._check_rank(rank, "peer_view")
        cdef _Route rt = self._route_objs[r]
        cdef gx_target* t = rt.target.t
        if t.size == 0:
            _raise_rc(&self.c, r, 0, 0, GX_ERANGE, "peer_view")
        if rt.view is None or t.kind == GX_MK_HOST:
            raise UnsupportedError(f"peer_view: team rank {r}'s segment is not device memory "
                                   f"mapped in this process (path {rt.rma_name})")
        addr, device = rt.view            # the device the mapping was given access for
        return _describe_kind(t.kind, device).view(addr, t.size, self)

    def addr(self, rank, offset=0):
        """Remote address of byte ``offset`` (0 up to the segment's size) of
        team rank ``rank``'s bound segment."""
        cdef int r = self._check_rank(rank, "addr(rank, offset=0)")
        offset = _as_int(offset, "addr(rank, offset=0)", "offset", False)
        cdef gx_target* t = self.c.routes[r].t
        if t.size == 0:
            _raise_rc(&self.c, r, 0, 0, GX_ERANGE, "addr")
        if offset < 0 or offset > t.size:
            raise BoundsError(f"addr: offset {offset} is outside team rank {r}'s segment "
                              f"(0..{t.size} bytes)")
        return t.remote_base + offset

    # -- collectives --

    cdef list _exchange(self, object payload):
        self.check_alive()
        if self._pair:
            raise StateError("collectives are not defined on a TM-pair")
        key = f"{self.id}#{self._seq}"
        self._seq += 1
        parts = self.client.bootstrap.exchange(key, [m[0] for m in self._members], self.c.rank,
                                               pickle.dumps(payload))
        self._settled(0)
        return [pickle.loads(p) for p in parts]

    def barrier(self, timeout=None):
        """Block until every member has entered (GASNet-EX ``gex_Coll_BarrierNB``
        + wait).  On the data path (shared memory on a node, remote atomics
        or ordered writes across nodes; a team spanning nodes gathers each
        node at a leader, and only the leaders cross the network; see
        core.src/coll.pxi).  Barriers are matched by number:
        one that a member never enters raises gexmk.TimeoutError after
        ``timeout`` s (default GEXMK_TIMEOUT) naming the team, the barrier and
        the member waited for; a dead member raises PeerDeadError."""
        _tm_barrier(self, timeout, False)

    def barrier_nb(self):
        """Enter a barrier and return an Event that completes when every member
        has entered (GASNet-EX ``gex_Coll_BarrierNB``).  The team's next
        collective completes it first."""
        return _tm_barrier(self, None, True)

    def _barrier_shape(self):
        """How this member takes part in the team's barriers (for tests and
        benchmarks; None before the team's first collective): a dict with
        ``role`` ("flat": one dissemination over the team; "leader" or
        "member": the hierarchical form of a team spanning nodes),
        ``node_members`` (team ranks of this member's node, its leader first;
        [] when flat) and ``rounds`` (dissemination rounds this member runs)."""
        return _tm_barrier_shape(self)

    def bcast(self, buf, root):
        """Broadcast numpy array ``buf`` of team rank ``root`` into ``buf`` of
        every member (GASNet-EX ``gex_Coll_BroadcastNB`` + wait; mpi4py ``Bcast``).
        Every member passes an array of the same size and dtype."""
        _tm_bcast(self, buf, root, False)

    def bcast_nb(self, buf, root):
        """Non-blocking :meth:`bcast`: an Event that keeps ``buf`` alive until
        complete (do not touch ``buf`` before)."""
        return _tm_bcast(self, buf, root, True)

    def allreduce(self, send, recv, op):
        """Combine every member's ``send`` element-wise with ``op`` into
        ``recv`` of every member (mpi4py ``Allreduce``).  ``op``: OP_ADD,
        OP_MULT, OP_MIN, OP_MAX, OP_AND, OP_OR, OP_XOR or 'sum', 'prod',
        'min', 'max', 'and', 'or', 'xor' (bitwise ones on integer/bool dtypes
        only).  ``recv``: a writable C-contiguous numpy array of send's size
        and dtype (it may be ``send``).  Results are combined in rank order,
        identical on every member."""
        _tm_reduce(self, send, recv, op, None, False)

    def allreduce_nb(self, send, recv, op):
        """Non-blocking :meth:`allreduce`: an Event keeping the buffers alive."""
        return _tm_reduce(self, send, recv, op, None, True)

    def reduce(self, send, recv, op, root):
        """Like :meth:`allreduce`, the result only in ``recv`` of team rank
        ``root`` (GASNet-EX ``gex_Coll_ReduceToOneNB``); other members may pass
        ``recv=None``."""
        _tm_reduce(self, send, recv, op, root, False)

    def reduce_nb(self, send, recv, op, root):
        """Non-blocking :meth:`reduce`: an Event keeping the buffers alive."""
        return _tm_reduce(self, send, recv, op, root, True)

    def allgather(self, send, recv):
        """Concatenate every member's ``send`` in rank order into ``recv`` of
        every member (size: team size x send's size, same dtype; mpi4py ``Allgather``)."""
        _tm_gather(self, send, recv, None, False)

    def allgather_nb(self, send, recv):
        """Non-blocking :meth:`allgather`: an Event keeping the buffers alive."""
        return _tm_gather(self, send, recv, None, True)

    def gather(self, send, recv, root):
        """Like :meth:`allgather`, into ``recv`` of team rank ``root`` only
        (others may pass ``recv=None``)."""
        _tm_gather(self, send, recv, root, False)

    def gather_nb(self, send, recv, root):
        """Non-blocking :meth:`gather`: an Event keeping the buffers alive."""
        return _tm_gather(self, send, recv, root, True)

    def publish_bound_segment(self, eps=()):
        """Publish the bound segments of ``eps`` (local endpoints; zero is
        allowed) to every member's process (GASNet-EX
        ``gex_EP_PublishBoundSegment``).  Collective over the team; may be
        repeated; an endpoint with nothing bound publishes "no segment".
        One allgather: a member returns while others may still apply what it
        published, so what it handed out (memory, exports, retired
        network keys) outlives an unbind or destroy until the team's next
        collective, its next publication or finalize.  This process's
        implicit puts and atomics complete first, as before a barrier."""
        self.check_alive()
        eps = list(eps)
        for e in eps:
            if not isinstance(e, Endpoint):
                raise TypeError(f"eps must be gexmk.Endpoint objects, got {type(e).__name__}")
            if (<Endpoint>e).client is not self.client:
                raise ArgumentError("an endpoint of another client cannot be published here")
            (<Endpoint>e).check_alive()
        mine = [self.client._seg_info(e) for e in eps]
        # As before a barrier: this process's implicit puts and atomics
        # complete first, so none issued under an earlier publication's key
        # is still in flight once every member has entered a later collective
        # (what lets _settled release retired keys then).
        err = _quiet_unsynced()
        # One collective: the allgather of what is published.  What owners
        # must keep until every member has applied it (a host segment's
        # file, exported handles, retired keys) is held until the
        # team's next collective completes here -- every member entered that
        # one after leaving this publication -- or the next publication on
        # the team (its allgather is that collective), or finalize.
        parts = self._exchange(mine)
        applied = []
        for i, infos in enumerate(parts):
            jr = self._members[i][0]
            for info in infos:
                try:
                    applied.append(self.client._apply(jr, info))
                except GexmkError as e:       # keep the collective going; report after
                    err = err or e
        # Every member is here: transports set up connections to what was
        # published now rather than on its first operation.
        self.client._connect([rt for tg in applied if tg is not None for rt in (<_Target>tg).routes])
        # Every member now holds what was published (it may still be applying
        # it): transports note who holds which key, and hand back what to
        # release once every member is known to have applied it.
        members = [m[0] for m in self._members]
        settle = []
        segs = []
        for e in eps:
            for ctx in ((<Endpoint>e).contexts or {}).values():
                published = getattr(ctx, "published", None)
                if published is not None:
                    done = published(members)
                    if done is not None:
                        settle.append(done)
            if (<Endpoint>e).segment is not None:
                segs.append((<Endpoint>e).segment)
        self._hold(settle, segs)
        if err is not None:
            raise err

    cdef int _hold(self, list settle, list segs) except -1:
        """Keep what this publication handed out until every member is known
        to have applied it: ``settle`` (the transports' release calls) run,
        and ``segs`` may be released on destroy, at the team's next
        collective to complete here (see _settled).

        A team dropped (garbage-collected) before such a collective keeps
        its holds until finalize (memory, files, retired keys; never a wrong
        access).  Settling them at another team's collective, or at a later
        publication, is not safe: only this team's collectives are matched in
        one order by every member, so only one of them, entered here after
        the publication, is entered by each member after its own publish
        call -- and so after it applied what was published.  A member may
        enter another team's barrier before its publish call (an NB barrier,
        waited for after it), and may run another team's allgather or
        publication from a second thread while its publish call still
        applies (collectives of different teams from different threads are
        allowed): that collective can complete here while the member is
        still mapping the segment, and a release then takes the file or key
        from under it.  Releasing them safely needs each member to say that
        it applied the publication (an acknowledgement after its apply),
        which the one-allgather publication does not send."""
        if not settle and not segs:
            return 0
        me = self.client.rank
        if all(m[0] == me for m in self._members):
            self.client._settle(settle, [])     # no other process to wait for
            return 0
        if self._unsettled is None:
            self._unsettled = []
        # barriers entered so far: one entered before this publication (an
        # NB barrier still pending) says nothing about it
        self._unsettled.append((_coll_entered(self._coll), settle, segs))
        self.client._hold_segments(segs)
        return 0

    cdef int _settled(self, uint64_t barrier) except -1:
        """A collective of this team completed here: every member entered it,
        so every publication it made before has been applied everywhere
        (``barrier``: the completed barrier's number; 0: an allgather, entered
        after every publication of this process)."""
        if not self._unsettled:
            return 0
        due = [u for u in self._unsettled if barrier == 0 or u[0] < barrier]
        if not due:
            return 0
        self._unsettled = [u for u in self._unsettled if not (barrier == 0 or u[0] < barrier)]
        for _, settle, segs in due:
            self.client._settle(settle, segs)
        return 0

    def query_bound_segment_nb(self, rank):
        """Event whose result is the :class:`BoundSegment` of team rank
        ``rank`` (GASNet-EX ``gex_EP_QueryBoundSegmentNB``).  Raises
        SegmentError when that endpoint has published nothing to this process."""
        rank = self._check_rank(rank, "query_bound_segment_nb")
        cdef gx_route* r = self.c.routes[rank]
        cdef gx_target* t = r.t
        if t.size == 0:
            _raise_rc(&self.c, rank, 0, 0, GX_ERANGE, "query_bound_segment_nb")
        local = <uintptr_t>r.local_base if r.local_base != NULL else None
        # describes the remote kind: no driver of this machine is asked
        kind = _describe_kind(t.kind, t.device)
        return _done_event(BoundSegment(t.remote_base, t.size, local, kind,
                                        (<_Route>self._route_objs[rank]).rma_name))

    def split(self, color, key=0):
        """Split into teams of equal ``color`` ordered by (key, rank)
        (GASNet-EX ``gex_TM_Split``).  Collective; ``color=None`` (or
        negative) joins no team and returns None."""
        if color is not None:
            try:
                color = _as_int(color, "split", "color")
            except TypeError:
                raise TypeError(f"split: color must be an int or None (got {_got(color)})") from None
        key = _as_int(key, "split", "key")
        seq = self._seq
        parts = self._exchange((color, key, self.ep.index))
        if color is None or color < 0:
            return None
        chosen = sorted((k, r) for r, (c, k, _) in enumerate(parts) if c == color)
        members = [(self._members[r][0], parts[r][2]) for _, r in chosen]
        rank = [r for _, r in chosen].index(self.c.rank)
        return Team._make(self.client, self.ep, members, rank, f"{self.id}.s{seq}.{color}", False)

    def for_ep(self, Endpoint ep not None):
        """This team seen from another local member endpoint ``ep`` (teams made
        by ``create`` may hold several endpoints of one process).  Take it
        right after creating the team: collectives need one call per member,
        each through its own Team object, in the same order."""
        self.check_alive()
        me = (self.client.rank, ep.index)
        if ep.client is not self.client or me not in self._members:
            raise ArgumentError(f"endpoint {ep.index} of this process is not a member of this team")
        cdef Team tm = Team._make(self.client, ep, self._members, self._members.index(me),
                                  self.id, self._pair)
        tm._seq = self._seq
        return tm

    def create_for(self, Endpoint ep not None):
        """A team of one endpoint per member of this team: this process's
        ``ep``, and on every other member the endpoint it passes, in this team's
        rank order (so ``create_for(ep).rank == self.rank``).  Collective over
        this team; every member passes one local endpoint, whatever its index.
        The way to address a second segment (GASNet-EX ``gex_TM_Create`` with
        endpoint locations)::

            ep = client.ep_create()
            seg2 = client.segment_attach(size, ep=ep)   # bind to ep, publish
            tm2 = client.tm.create_for(ep)              # puts into peers' seg2

        The new team is seen from ``ep``: its puts and gets start there, and
        ``tm2.addr(r, off)`` addresses team rank r's segment bound to its
        endpoint (published before or after this call)."""
        self.check_alive()
        ep.check_alive()
        if ep.client is not self.client:
            raise ArgumentError("create_for: ep is an endpoint of another client")
        seq = self._seq
        parts = self._exchange(("create_for", ep.index))
        members = []
        for r, p in enumerate(parts):
            if not (type(p) is tuple and len(p) == 2 and p[0] == "create_for"):
                raise ArgumentError(f"create_for is collective: team rank {r} entered another "
                                    f"collective")
            members.append((self._members[r][0], p[1]))
        if len(set(members)) != len(members):
            raise ArgumentError("create_for: two members of this team passed the same endpoint "
                                "(one process in the team twice: use create())")
        return Team._make(self.client, ep, members, self.c.rank, f"{self.id}.f{seq}", False)

    def dup(self):
        """A new team with the same members (missing from GASNet-EX).  Collective."""
        seq = self._seq
        self._exchange(None)
        return Team._make(self.client, self.ep, list(self._members), self.c.rank,
                          f"{self.id}.d{seq}", False)

    def create(self, members):
        """Create a team from ``members`` (GASNet-EX ``gex_TM_Create``):
        collective over this team; every caller passes the member list of the
        team it joins (ranks of this team, or (job rank, EP index) pairs, in new
        rank order), or None/[] to join none.  Members of one new team must pass
        equal lists.  Returns the new team seen from this process's endpoint in
        it (this team's endpoint when listed, else another local endpoint
        listed), or None."""
        norm = None
        if members:
            norm = []
            for m in members:
                if type(m) is tuple and len(<tuple>m) == 2:
                    jr = _as_int(m[0], "create", "a member's job rank")
                    if not 0 <= jr < self.client.size:
                        raise RankError(f"create: job rank {jr} is outside the job "
                                        f"(size {self.client.size})")
                    norm.append((jr, _as_index(m[1], "create", "a member's endpoint index",
                                               0, INT_MAX)))
                elif type(m) is not tuple and hasattr(type(m), "__index__"):
                    norm.append(tuple(self._members[self._check_rank(m, "create")]))
                else:
                    raise TypeError(f"create: members must be team ranks or (jobrank, ep_index) "
                                    f"pairs, got {_got(m)}")
            if len(set(norm)) != len(norm):
                raise ArgumentError("members lists an endpoint twice")
        seq = self._seq
        parts = self._exchange(norm)
        if not norm:
            return None
        me = self.client.rank
        local = [i for i, (jr, epi) in enumerate(norm) if jr == me]
        if not local:
            return None
        for i, p in enumerate(parts):
            if p and tuple(self._members[i]) in norm and p != norm:
                raise ArgumentError(f"rank {i} passed a different member list for the same team: "
                                    f"{p} vs {norm}")
        # A process of this team with an endpoint in the new team joins it, so
        # one of its members must have passed this very list (else the lists
        # name different endpoints, e.g. indices that differ between processes).
        passed = {self._members[i][0] for i, p in enumerate(parts) if p == norm}
        for i, p in enumerate(parts):
            jr = self._members[i][0]
            if jr not in passed and any(j == jr for j, _ in norm):
                raise ArgumentError(f"rank {i} passed a different member list for the same team: "
                                    f"{p} vs {norm} (do endpoint indices differ between "
                                    f"processes? tm.create_for(ep) takes each process's own "
                                    f"endpoint)")
        mine = [i for i in local if norm[i][1] == self.ep.index]
        rank = mine[0] if mine else local[0]
        ep = self.client.ep(norm[rank][1])
        digest = hashlib.sha1(repr(norm).encode()).hexdigest()[:12]
        return Team._make(self.client, ep, norm, rank, f"{self.id}.c{seq}.{digest}", False)

    # -- RMA: puts --

    cdef int _put(self, int rank, uintptr_t dest, const void* p, size_t n) except -1:
        cdef int rc
        if n < _NOGIL_BYTES:
            rc = gx_put(&self.c, rank, dest, p, n)
            if rc == GX_OK:
                return 0
            if rc != GX_NOT_MAPPED:
                return put_slow(&self.c, rank, dest, p, n, rc)     # reports the error
        else:
            rc = GX_OK
        # Large copies and every operation through a transport run without the
        # GIL: other threads (the bootstrap's death notices among them) go on.
        self.client._inflight += 1
        try:
            with nogil:
                if rc == GX_OK:
                    rc = gx_put(&self.c, rank, dest, p, n)
                if rc != GX_OK:
                    put_slow(&self.c, rank, dest, p, n, rc)
        finally:
            self.client._inflight -= 1
        return 0

    cdef int _get(self, void* p, int rank, uintptr_t src, size_t n) except -1:
        cdef int rc
        if n < _NOGIL_BYTES:
            rc = gx_get(&self.c, rank, p, src, n)
            if rc == GX_OK:
                return 0
            if rc != GX_NOT_MAPPED:
                return get_slow(&self.c, rank, p, src, n, rc)     # reports the error
        else:
            rc = GX_OK
        self.client._inflight += 1
        try:
            with nogil:
                if rc == GX_OK:
                    rc = gx_get(&self.c, rank, p, src, n)
                if rc != GX_OK:
                    get_slow(&self.c, rank, p, src, n, rc)
        finally:
            self.client._inflight -= 1
        return 0

    def put(self, rank, dest, src):
        """Blocking put (GASNet-EX ``gex_RMA_PutBlocking``): copy ``src`` (a
        PEP 3118 object or (address, nbytes)) to address ``dest`` of team rank
        ``rank``; complete (visible at the target) on return."""
        cdef Py_buffer view
        cdef _Local loc
        cdef int r
        cdef uintptr_t d
        if type(rank) is not int or type(dest) is not int:
            # a call with swapped arguments names the first misplaced one
            _as_rank(rank, "put(rank, dest, src)", &self.c)
            _as_addr(dest, "put(rank, dest, src)", "dest")
        # the buffer before the integers: measured ~5 ns faster with numpy sources
        if _take(src, &view, &loc, False, "put(rank, dest, src)", b"src", &self.c, True):
            _array_xfer(self, True, GX_BLOCKING, _as_rank(rank, "put(rank, dest, src)", &self.c),
                        _as_addr(dest, "put(rank, dest, src)", "dest"), src, None,
                        "put(rank, dest, src)")
            return
        try:
            r = _as_rank(rank, "put(rank, dest, src)", &self.c)
            d = _as_addr(dest, "put(rank, dest, src)", "dest")
            if loc.kind == GX_MK_HOST:
                self._put(r, d, loc.p, loc.n)
            else:
                _xfer_dev(self, True, r, d, &loc)
        finally:
            _drop(&view, &loc)


    cdef object _issue(self, bint is_put, int mode, int rank, uintptr_t addr, object buf,
                       bint copy=False):
        """Start a put or get of ``buf`` that need not complete on return.
        Returns a pending Event (a transport op in GX_NB mode) or None when the
        operation is already complete (CPU-mapped targets complete at issue).
        Implicit ops keep their buffer alive in the endpoint until nbi_wait.
        ``copy`` (an LC_NOW put_nb): a host source of at most _PUT_NB_COPY
        bytes that a transport carries is copied first and the op issued from
        the copy, which its event keeps: the source is reusable on return and
        the event's local completion (``leaf(EC_LC)``) is complete."""
        cdef Py_buffer view
        cdef _Local loc
        cdef int rc
        cdef void* op = NULL
        cdef gx_route* r
        cdef char* p
        cdef void* local
        cdef bytes tmp
        if _take(buf, &view, &loc, not is_put, _issue_sig(is_put, mode),
                 b"src" if is_put else b"dest", &self.c, True):
            # non-contiguous: strided; lc is applied by the caller, as here
            return _vis_run(self, _array_req(self, rank, addr, buf, is_put, _issue_sig(is_put, mode)),
                            rank, is_put, mode)
        try:
            if loc.bounce != NULL and not is_put:
                # a get into device memory of another kind: through the host
                # bounce, complete on return (then copied out to the device)
                self._get(loc.p, rank, addr, loc.n)
                _finish_local(&loc)
                return None
            rc = gx_locate(&self.c, rank, addr, loc.n, &p, &r)
            if rc == GX_OK and (loc.kind != GX_MK_HOST or gx_in_dev(&self.c, loc.p, loc.n)):
                rc = GX_NOT_MAPPED
            if rc == GX_NOT_MAPPED:
                local = loc.p
                tmp = None
                if copy and mode == GX_NB and loc.kind == GX_MK_HOST and \
                        loc.n <= _PUT_NB_COPY and not gx_in_dev(&self.c, loc.p, loc.n):
                    tmp = PyBytes_FromStringAndSize(<char*>loc.p, <Py_ssize_t>loc.n)
                    local = PyBytes_AS_STRING(tmp)
                with nogil:
                    _rma_k(&self.c, rank, is_put, addr, local, loc.n, mode, &op, NULL,
                           loc.kind, loc.device)
                if op != NULL:
                    if tmp is None:
                        return _op_event(self.client, r.rma.ops, op,
                                         (_keep_local(&loc, buf), self), -1)
                    ev = _op_event(self.client, r.rma.ops, op, (tmp, self), -1)
                    (<Event>ev)._lc = _DONE      # the source was copied: reusable now
                    return ev
                if mode == GX_NBI:       # held until the endpoint's next sync of its category
                    (self.ep._keep_put if is_put else self.ep._keep_get).append(_keep_local(&loc, buf))
                return None
            if is_put:
                self._put(rank, addr, loc.p, loc.n)
            else:
                self._get(loc.p, rank, addr, loc.n)
            return None
        finally:
            _drop(&view, &loc)

    def put_nb(self, rank, dest, src, lc=LC_NOW):
        """Non-blocking put (``gex_RMA_PutNB``): returns an Event for remote
        completion.  ``lc``: LC_NOW (source reusable on return), LC_DEFER
        (``ev.leaf(EC_LC)``), LC_GROUP (``nbi_wait(EC_PUT)``) or a LeafEvent.
        Over the network, local completion is reported with remote completion;
        so with LC_NOW a host source of at most 64 KiB is copied and the call
        returns at once (a larger one, or a device source, waits there for the
        put to complete)."""
        cdef int r = _as_rank(rank, "put_nb(rank, dest, src, lc=LC_NOW)", &self.c)
        cdef uintptr_t d = _as_addr(dest, "put_nb(rank, dest, src, lc=LC_NOW)", "dest")
        cdef int now = _lc_mode(lc, "put_nb")
        ev = self._issue(True, GX_NB, r, d, src, now)
        if ev is None:
            return _lc_event(lc, _DONE)
        if now and (<Event>ev)._lc is not _DONE:
            (<Event>ev).wait()       # the source must be reusable on return (not copied)
            return _lc_event(lc, _DONE)
        return _lc_event(lc, <Event>ev)

    def put_nbi(self, rank, dest, src, lc=LC_NOW):
        """Implicit-event put (``gex_RMA_PutNBI``): completed by ``nbi_wait``,
        ``quiet`` or the enclosing access region's event.  With LC_NOW (or a
        LeafEvent) the source is reusable on return; with LC_GROUP/LC_DEFER
        it is held until ``nbi_wait``."""
        cdef int r = _as_rank(rank, "put_nbi(rank, dest, src, lc=LC_NOW)", &self.c)
        cdef uintptr_t d = _as_addr(dest, "put_nbi(rank, dest, src, lc=LC_NOW)", "dest")
        cdef int now = _lc_mode(lc, "put_nbi")
        self._issue(True, GX_NBI_LCNOW if (now or isinstance(lc, LeafEvent)) else GX_NBI,
                    r, d, src)
        if isinstance(lc, LeafEvent):
            _lc_event(lc, _DONE)

    def put_val(self, rank, dest, value, nbytes=8):
        """Blocking put of the integer ``value`` as ``nbytes`` (1..8) bytes in
        native byte order (``gex_RMA_PutBlockingVal``).  ``value`` must fit:
        0 up to 2**(8*nbytes) - 1, or a negative value down to
        -2**(8*nbytes - 1), written in two's complement; else OverflowError."""
        _put_val(self, "put_val(rank, dest, value, nbytes=8)", rank, dest, value, nbytes)

    def put_nb_val(self, rank, dest, value, nbytes=8):
        """Non-blocking value put (``gex_RMA_PutNBVal``); returns an Event.
        ``value`` and ``nbytes`` as for :meth:`put_val`."""
        _put_val(self, "put_nb_val(rank, dest, value, nbytes=8)", rank, dest, value, nbytes)
        return _DONE

    def put_nbi_val(self, rank, dest, value, nbytes=8):
        """Implicit-event value put (``gex_RMA_PutNBIVal``).  ``value`` and
        ``nbytes`` as for :meth:`put_val`."""
        _put_val(self, "put_nbi_val(rank, dest, value, nbytes=8)", rank, dest, value, nbytes)

    # -- RMA: gets --

    def get(self, dest, rank, src):
        """Blocking get (``gex_RMA_GetBlocking``): fill ``dest`` (a writable
        PEP 3118 object or (address, nbytes)) from address ``src`` of team rank
        ``rank``."""
        cdef Py_buffer view
        cdef _Local loc
        cdef int r
        cdef uintptr_t s
        # dest first: in a call with swapped arguments it is the one to name
        if _take(dest, &view, &loc, True, "get(dest, rank, src)", b"dest", &self.c, True):
            _array_xfer(self, False, GX_BLOCKING, _as_rank(rank, "get(dest, rank, src)", &self.c),
                        _as_addr(src, "get(dest, rank, src)", "src"), dest, None,
                        "get(dest, rank, src)")
            return
        try:
            r = _as_rank(rank, "get(dest, rank, src)", &self.c)
            s = _as_addr(src, "get(dest, rank, src)", "src")
            if loc.kind == GX_MK_HOST:
                self._get(loc.p, r, s, loc.n)
                _finish_local(&loc)
            else:
                _xfer_dev(self, False, r, s, &loc)
        finally:
            _drop(&view, &loc)

    def get_nb(self, dest, rank, src):
        """Non-blocking get (``gex_RMA_GetNB``); returns an Event.  ``dest`` is
        held (and must not be read) until the event completes."""
        _check_local(dest, "get_nb(dest, rank, src)", b"dest", True)
        cdef int r = _as_rank(rank, "get_nb(dest, rank, src)", &self.c)
        cdef uintptr_t s = _as_addr(src, "get_nb(dest, rank, src)", "src")
        ev = self._issue(False, GX_NB, r, s, dest)
        return _DONE if ev is None else ev

    def get_nbi(self, dest, rank, src):
        """Implicit-event get (``gex_RMA_GetNBI``): ``dest`` is filled by the
        next ``nbi_wait(EC_GET)`` (or the access region's event)."""
        _check_local(dest, "get_nbi(dest, rank, src)", b"dest", True)
        cdef int r = _as_rank(rank, "get_nbi(dest, rank, src)", &self.c)
        cdef uintptr_t s = _as_addr(src, "get_nbi(dest, rank, src)", "src")
        self._issue(False, GX_NBI, r, s, dest)

    def get_val(self, rank, src, nbytes=8):
        """Blocking get of ``nbytes`` (1..8) returned as an unsigned int
        (``gex_RMA_GetBlockingVal``)."""
        cdef int r = _as_rank(rank, "get_val(rank, src, nbytes=8)", &self.c)
        cdef uintptr_t s = _as_addr(src, "get_val(rank, src, nbytes=8)", "src")
        cdef size_t n = <size_t>_as_index(nbytes, "get_val(rank, src, nbytes=8)", "nbytes", 1, 8,
                                          False)
        cdef uint64_t v = 0
        self._get(&v, r, s, n)
        return v

    # -- VIS: vector, indexed and strided puts and gets (core.src/vis.pxi) --
    #
    # GASNet-EX gex_VIS_{Vector,Indexed,Strided}{Put,Get}{Blocking,NB,NBI}.
    # Every block of the target's side is checked against its bound segment
    # before a byte moves (BoundsError naming the block); one completion per
    # call.  Overlapping destination blocks leave the result undefined.

    def put_vector(self, rank, dsts, srcs):
        """Blocking vector put (``gex_VIS_VectorPutBlocking``): the bytes of
        the local blocks ``srcs`` (buffers, or (address, nbytes) tuples), in
        order, to the remote blocks ``dsts`` ((address, nbytes) pairs in team
        rank ``rank``'s segment, or an (n, 2) int64/uint64 array).  The two
        lists may cut the bytes differently; their totals must be equal."""
        _vector(self, True, GX_BLOCKING, rank, dsts, srcs, None,
                "put_vector(rank, dsts, srcs)")

    def put_vector_nb(self, rank, dsts, srcs, lc=LC_NOW):
        """Non-blocking :meth:`put_vector`: one Event for the whole call
        (``lc`` as for :meth:`put_nb`)."""
        return _vector(self, True, GX_NB, rank, dsts, srcs, lc,
                       "put_vector_nb(rank, dsts, srcs, lc=LC_NOW)")

    def put_vector_nbi(self, rank, dsts, srcs, lc=LC_NOW):
        """Implicit-event :meth:`put_vector` (completed by ``nbi_wait``/``quiet``)."""
        _vector(self, True, GX_NBI, rank, dsts, srcs, lc,
                "put_vector_nbi(rank, dsts, srcs, lc=LC_NOW)")

    def get_vector(self, dsts, rank, srcs):
        """Blocking vector get (``gex_VIS_VectorGetBlocking``): the remote
        blocks ``srcs`` ((address, nbytes) pairs of team rank ``rank``), in
        order, into the local blocks ``dsts`` (writable buffers or (address,
        nbytes)); equal totals."""
        _vector(self, False, GX_BLOCKING, rank, dsts, srcs, None,
                "get_vector(dsts, rank, srcs)")

    def get_vector_nb(self, dsts, rank, srcs):
        """Non-blocking :meth:`get_vector`: one Event; ``dsts`` are held until it completes."""
        return _vector(self, False, GX_NB, rank, dsts, srcs, None, "get_vector_nb(dsts, rank, srcs)")

    def get_vector_nbi(self, dsts, rank, srcs):
        """Implicit-event :meth:`get_vector` (filled by ``nbi_wait(EC_GET)``)."""
        _vector(self, False, GX_NBI, rank, dsts, srcs, None, "get_vector_nbi(dsts, rank, srcs)")

    def put_indexed(self, rank, dsts, dstlen, srcs, srclen):
        """Blocking indexed put (``gex_VIS_IndexedPutBlocking``): blocks of
        ``srclen`` bytes at the local addresses ``srcs`` (ints, an int64/uint64
        array, or buffers of srclen bytes each) to blocks of ``dstlen`` bytes
        at the remote addresses ``dsts`` (team rank ``rank``'s segment; ints or
        an integer array).  len(dsts) * dstlen == len(srcs) * srclen."""
        _indexed(self, True, GX_BLOCKING, rank, dsts, dstlen, srcs, srclen, None,
                 "put_indexed(rank, dsts, dstlen, srcs, srclen)")

    def put_indexed_nb(self, rank, dsts, dstlen, srcs, srclen, lc=LC_NOW):
        """Non-blocking :meth:`put_indexed`: one Event (``lc`` as for :meth:`put_nb`)."""
        return _indexed(self, True, GX_NB, rank, dsts, dstlen, srcs, srclen, lc,
                        "put_indexed_nb(rank, dsts, dstlen, srcs, srclen, lc=LC_NOW)")

    def put_indexed_nbi(self, rank, dsts, dstlen, srcs, srclen, lc=LC_NOW):
        """Implicit-event :meth:`put_indexed`."""
        _indexed(self, True, GX_NBI, rank, dsts, dstlen, srcs, srclen, lc,
                 "put_indexed_nbi(rank, dsts, dstlen, srcs, srclen, lc=LC_NOW)")

    def get_indexed(self, dsts, dstlen, rank, srcs, srclen):
        """Blocking indexed get (``gex_VIS_IndexedGetBlocking``): blocks of
        ``srclen`` bytes at remote addresses ``srcs`` into blocks of ``dstlen``
        bytes at local addresses ``dsts`` (forms as for :meth:`put_indexed`)."""
        _indexed(self, False, GX_BLOCKING, rank, dsts, dstlen, srcs, srclen, None,
                 "get_indexed(dsts, dstlen, rank, srcs, srclen)")

    def get_indexed_nb(self, dsts, dstlen, rank, srcs, srclen):
        """Non-blocking :meth:`get_indexed`: one Event."""
        return _indexed(self, False, GX_NB, rank, dsts, dstlen, srcs, srclen, None,
                        "get_indexed_nb(dsts, dstlen, rank, srcs, srclen)")

    def get_indexed_nbi(self, dsts, dstlen, rank, srcs, srclen):
        """Implicit-event :meth:`get_indexed`."""
        _indexed(self, False, GX_NBI, rank, dsts, dstlen, srcs, srclen, None,
                 "get_indexed_nbi(dsts, dstlen, rank, srcs, srclen)")

    def put_strided(self, rank, dest, dest_strides, src, src_strides, elemsz, count):
        """Blocking strided put (``gex_VIS_StridedPutBlocking``): elements of
        ``elemsz`` bytes, ``count[k]`` of them along dimension k (dimension 0
        varies fastest; up to 8 dimensions), the one at index (i0, i1, ..)
        read from ``src + sum(ik * src_strides[k])`` and written to
        ``dest + sum(ik * dest_strides[k])`` of team rank ``rank``.  Strides
        are positive byte counts; counts at least 1.  ``src``: a local
        address, or a buffer the shape lies inside (from its first byte).
        A non-contiguous numpy/CuPy/torch array can go to :meth:`put` as it is."""
        _strided(self, True, GX_BLOCKING, rank, dest, dest_strides, src, src_strides, elemsz,
                 count, None, "put_strided(rank, dest, dest_strides, src, src_strides, elemsz, count)")

    def put_strided_nb(self, rank, dest, dest_strides, src, src_strides, elemsz, count,
                       lc=LC_NOW):
        """Non-blocking :meth:`put_strided`: one Event."""
        return _strided(self, True, GX_NB, rank, dest, dest_strides, src, src_strides, elemsz,
                        count, lc, "put_strided_nb(rank, dest, dest_strides, src, src_strides, "
                        "elemsz, count, lc=LC_NOW)")

    def put_strided_nbi(self, rank, dest, dest_strides, src, src_strides, elemsz, count,
                        lc=LC_NOW):
        """Implicit-event :meth:`put_strided`."""
        _strided(self, True, GX_NBI, rank, dest, dest_strides, src, src_strides, elemsz,
                 count, lc, "put_strided_nbi(rank, dest, dest_strides, src, src_strides, "
                 "elemsz, count, lc=LC_NOW)")

    def get_strided(self, dest, dest_strides, rank, src, src_strides, elemsz, count):
        """Blocking strided get (``gex_VIS_StridedGetBlocking``): the elements
        of the shape at ``src`` of team rank ``rank`` into the local shape at
        ``dest`` (an address or a writable buffer); as :meth:`put_strided`."""
        _strided(self, False, GX_BLOCKING, rank, dest, dest_strides, src, src_strides, elemsz,
                 count, None, "get_strided(dest, dest_strides, rank, src, src_strides, elemsz, count)")

    def get_strided_nb(self, dest, dest_strides, rank, src, src_strides, elemsz, count):
        """Non-blocking :meth:`get_strided`: one Event."""
        return _strided(self, False, GX_NB, rank, dest, dest_strides, src, src_strides, elemsz,
                        count, None, "get_strided_nb(dest, dest_strides, rank, src, src_strides, "
                        "elemsz, count)")

    def get_strided_nbi(self, dest, dest_strides, rank, src, src_strides, elemsz, count):
        """Implicit-event :meth:`get_strided`."""
        _strided(self, False, GX_NBI, rank, dest, dest_strides, src, src_strides, elemsz,
                 count, None, "get_strided_nbi(dest, dest_strides, rank, src, src_strides, "
                 "elemsz, count)")

    def put_vector_on_stream(self, rank, dsts, srcs, stream):
        """:meth:`put_vector` enqueued on a CUDA ``stream`` (as :meth:`put_on_stream`:
        no host synchronisation; buffers valid until the stream has run it)."""
        _vector(self, True, GX_NBI, rank, dsts, srcs, None,
                "put_vector_on_stream(rank, dsts, srcs, stream)", stream)

    def get_vector_on_stream(self, dsts, rank, srcs, stream):
        """:meth:`get_vector` enqueued on a CUDA ``stream``."""
        _vector(self, False, GX_NBI, rank, dsts, srcs, None,
                "get_vector_on_stream(dsts, rank, srcs, stream)", stream)

    def put_indexed_on_stream(self, rank, dsts, dstlen, srcs, srclen, stream):
        """:meth:`put_indexed` enqueued on a CUDA ``stream`` (the KV-cache shape
        from a kernel's output without a host wait)."""
        _indexed(self, True, GX_NBI, rank, dsts, dstlen, srcs, srclen, None,
                 "put_indexed_on_stream(rank, dsts, dstlen, srcs, srclen, stream)", stream)

    def get_indexed_on_stream(self, dsts, dstlen, rank, srcs, srclen, stream):
        """:meth:`get_indexed` enqueued on a CUDA ``stream``."""
        _indexed(self, False, GX_NBI, rank, dsts, dstlen, srcs, srclen, None,
                 "get_indexed_on_stream(dsts, dstlen, rank, srcs, srclen, stream)", stream)

    def put_strided_on_stream(self, rank, dest, dest_strides, src, src_strides, elemsz, count,
                              stream):
        """:meth:`put_strided` enqueued on a CUDA ``stream``."""
        _strided(self, True, GX_NBI, rank, dest, dest_strides, src, src_strides, elemsz, count,
                 None, "put_strided_on_stream(rank, dest, dest_strides, src, src_strides, "
                 "elemsz, count, stream)", stream)

    def get_strided_on_stream(self, dest, dest_strides, rank, src, src_strides, elemsz, count,
                              stream):
        """:meth:`get_strided` enqueued on a CUDA ``stream``."""
        _strided(self, False, GX_NBI, rank, dest, dest_strides, src, src_strides, elemsz, count,
                 None, "get_strided_on_stream(dest, dest_strides, rank, src, src_strides, "
                 "elemsz, count, stream)", stream)

    # -- stream-ordered RMA (NVSHMEM *_on_stream) --

    def put_on_stream(self, rank, dest, src, stream):
        """Enqueue a put on a CUDA ``stream`` (NVSHMEM ``putmem_on_stream``):
        it runs when the stream reaches it, after the kernels enqueued before
        it that produced the data, with no host synchronisation, and may be
        captured into a CUDA graph.  ``src`` must stay valid until the stream
        has run it (a device array or (address, nbytes) inside the device
        segment bound to this team's endpoint, or host memory).  ``stream``:
        an int handle, a ``__cuda_stream__`` object, a CuPy or PyTorch stream
        of the endpoint's device.  Paths that cannot order on a stream (see
        ``paths``) raise UnsupportedError naming themselves."""
        return self._on_stream(True, rank, dest, src, stream, "put_on_stream(rank, dest, src, stream)")

    def get_on_stream(self, dest, rank, src, stream):
        """Enqueue a get on a CUDA ``stream`` (NVSHMEM ``getmem_on_stream``):
        ``dest`` holds the data once the stream has run it."""
        return self._on_stream(False, rank, src, dest, stream, "get_on_stream(dest, rank, src, stream)")

    def _on_stream(self, bint is_put, rank, addr, buf, stream, str sig):
        cdef Py_buffer view
        cdef _Local loc
        cdef int r = _as_rank(rank, sig, &self.c)
        cdef uintptr_t a = _as_addr(addr, sig, "dest" if is_put else "src")
        cdef void* s = <void*>_stream_handle(stream)
        if _take(buf, &view, &loc, not is_put, sig, b"src" if is_put else b"dest", &self.c, True):
            # non-contiguous: a strided transfer on the stream (core.src/vis.pxi)
            _array_xfer(self, is_put, GX_NBI, r, a, buf, None, sig, stream)
            return
        try:
            if loc.bounce != NULL:
                raise UnsupportedError(
                    f"{_fn(sig)}: {'src' if is_put else 'dest'} is device memory of another kind "
                    "than the device segment bound to this team's endpoint (another GPU, or no "
                    "device segment): a stream-ordered copy cannot go through the host bounce "
                    "buffer such memory takes; use a buffer on the endpoint's GPU")
            with nogil:
                _rma_on_stream(&self.c, r, is_put, a, loc.p, loc.n, s, loc.kind, loc.device)
        finally:
            _drop(&view, &loc)

    # -- ordering --

    def fence(self):
        """Order earlier puts/atomics of this team's endpoint before later ones
        (NVSHMEM fence; over the network it completes them)."""
        self.check_alive()
        _nbi_sync(EC_PUT | EC_RMW, self.ep)

    def quiet(self):
        """Complete every outstanding put/atomic of this team's endpoint
        (NVSHMEM quiet on this endpoint's context)."""
        self.check_alive()
        _nbi_sync(EC_PUT | EC_RMW, self.ep)

    # -- atomics --

    def ad_create(self, dt, ops, flags=0):
        """Create an :class:`AtomicDomain` over this team for data type ``dt``
        and the op set ``ops`` (OP_* flags or-ed).  Collective over the team
        (GASNet-EX ``gex_AD_Create``): every member calls it with the same
        ``dt`` and ``ops``, or each raises ArgumentError naming the members that
        differ.  On a TM-pair (no collectives) it is local.  ``flags``
        (GASNet-EX's hints) are accepted and ignored."""
        sig = "ad_create(dt, ops, flags=0)"
        return AtomicDomain._make(self, _as_int(dt, sig, "dt", False), _as_int(ops, sig, "ops", False),
                                  _as_int(flags, sig, "flags", False))

    # -- signals and point-to-point synchronisation (NVSHMEM; core.src/signal.pxi) --

    def put_signal(self, rank, dest, src, sig_addr, signal, sig_op=GX_SIGNAL_SET):
        """Put ``src`` to ``dest`` of team rank ``rank``, then update the 64-bit
        signal word at ``sig_addr`` (same target) with ``signal``: SIGNAL_SET
        stores it, SIGNAL_ADD adds it (NVSHMEM ``putmem_signal``).  A rank
        that sees the new signal value (``wait_until``, ``signal_fetch``) sees
        the data, on every path.  Blocking as NVSHMEM's ``putmem_signal`` is:
        ``src`` is reusable on return (local completion); on CPU-mapped paths
        the signal is visible by then, over the network it may still be on its
        way (``gexmk.quiet()`` completes it)."""
        _signal_issue(self, "put_signal(rank, dest, src, sig_addr, signal, sig_op=SIGNAL_SET)",
                      rank, dest, src, sig_addr, signal, sig_op, GX_BLOCKING)

    def put_signal_nb(self, rank, dest, src, sig_addr, signal, sig_op=GX_SIGNAL_SET):
        """Non-blocking put_signal: an Event for its completion (the signal at
        the target).  ``src`` is reusable on return."""
        ev = _signal_issue(self, "put_signal_nb(rank, dest, src, sig_addr, signal, "
                           "sig_op=SIGNAL_SET)", rank, dest, src, sig_addr, signal, sig_op, GX_NB)
        return _DONE if ev is None else ev

    def put_signal_nbi(self, rank, dest, src, sig_addr, signal, sig_op=GX_SIGNAL_SET):
        """Implicit-event put_signal (NVSHMEM ``putmem_signal_nbi``): completed
        by ``quiet``/``nbi_wait``; ``src`` is reusable on return."""
        _signal_issue(self, "put_signal_nbi(rank, dest, src, sig_addr, signal, sig_op=SIGNAL_SET)",
                      rank, dest, src, sig_addr, signal, sig_op, GX_NBI_LCNOW)

    def put_signal_on_stream(self, rank, dest, src, sig_addr, signal, sig_op, stream):
        """put_signal enqueued on a CUDA ``stream`` (NVSHMEM
        ``putmem_signal_on_stream``): when the stream reaches it, the data is
        put, then the signal word updated (SIGNAL_SET / SIGNAL_ADD), with no
        host synchronisation; a GPU waiting on the word
        (:meth:`signal_wait_until_on_stream`) sees the data.  Device segment
        targets reached by one path that copies on the stream (the same node);
        elsewhere UnsupportedError naming the path.  ``src`` as for :meth:`put_on_stream`."""
        _signal_on_stream(self, rank, dest, src, sig_addr, signal, sig_op, stream)

    def signal_wait_until_on_stream(self, sig_addr, cmp, value, stream):
        """Work enqueued on ``stream`` after this waits, on the GPU, until the
        64-bit signal word at ``sig_addr`` (in the device segment bound to this
        team's endpoint) satisfies ``cmp`` (CMP_EQ, CMP_GE or CMP_GT) against
        ``value`` (NVSHMEM ``signal_wait_until_on_stream``,
        ``cuStreamWaitValue64``).  The host does not wait.  The memory kind's
        own kernels are loaded before the wait is posted.  Loading a module
        waits for the context's streams (measured: in CUDA's lazy and eager
        loading modes alike), so a program's kernel first used (loaded) while
        the stream waits hangs the loading thread until the wait ends: run
        such kernels once before posting the wait."""
        _wait_on_stream(self, sig_addr, cmp, value, stream)

    def signal_op(self, rank, sig_addr, value, sig_op=GX_SIGNAL_SET):
        """Set (SIGNAL_SET) or add to (SIGNAL_ADD) the 64-bit signal word at
        ``sig_addr`` of team rank ``rank`` (NVSHMEM ``signal_op``); blocking."""
        _signal_op(self, rank, sig_addr, value, sig_op)

    def signal_fetch(self, sig_addr):
        """The 64-bit signal word at ``sig_addr`` of this rank's OWN bound
        segment (``tm.addr(tm.rank, off)``), read atomically (NVSHMEM
        ``signal_fetch``)."""
        return _signal_fetch(self, sig_addr)

    def wait_until(self, addr, cmp, value, dt=DT_U64, timeout=None):
        """Block until the word at ``addr`` of this rank's OWN bound segment
        compares ``cmp`` (CMP_EQ, CMP_NE, CMP_GT, CMP_GE, CMP_LT, CMP_LE) to
        ``value``: ``word cmp value`` (NVSHMEM ``wait_until``).  ``dt``: the
        word's type (DT_*, default DT_U64, naturally aligned).  Spins briefly,
        then yields and sleeps (woken at once by node-local signal and atomic
        writers), driving the transports' progress; raises
        gexmk.TimeoutError after ``timeout`` s (default GEXMK_TIMEOUT) and
        PeerDeadError when a team member dies meanwhile."""
        _wait(self, "wait_until(addr, cmp, value, dt=DT_U64, timeout=None)", addr, cmp, value, dt,
              timeout, GX_WAIT_ANY, True, True)

    def wait_until_all(self, addrs, cmp, value, dt=DT_U64, timeout=None):
        """Block until every word of ``addrs`` (own segment) has compared
        ``cmp`` to ``value`` (one value, or one per word)."""
        _wait(self, "wait_until_all(addrs, cmp, value, dt=DT_U64, timeout=None)", addrs, cmp,
              value, dt, timeout, GX_WAIT_ALL, True, False)

    def wait_until_any(self, addrs, cmp, value, dt=DT_U64, timeout=None):
        """Block until some word of ``addrs`` satisfies the comparison; return
        its index."""
        return _wait(self, "wait_until_any(addrs, cmp, value, dt=DT_U64, timeout=None)", addrs,
                     cmp, value, dt, timeout, GX_WAIT_ANY, True, False)

    def wait_until_some(self, addrs, cmp, value, dt=DT_U64, timeout=None):
        """Block until at least one word of ``addrs`` satisfies the
        comparison; return the indices of all that do (ascending)."""
        return _wait(self, "wait_until_some(addrs, cmp, value, dt=DT_U64, timeout=None)", addrs,
                     cmp, value, dt, timeout, GX_WAIT_SOME, True, False)

    def test(self, addr, cmp, value, dt=DT_U64):
        """True when the word at ``addr`` (own segment) compares ``cmp`` to
        ``value`` now (NVSHMEM ``test``; drives progress once, never blocks)."""
        return _wait(self, "test(addr, cmp, value, dt=DT_U64)", addr, cmp, value, dt, None,
                     GX_WAIT_ANY, False, True) is not None

    def test_all(self, addrs, cmp, value, dt=DT_U64):
        """True when every word of ``addrs`` satisfies the comparison now."""
        return _wait(self, "test_all(addrs, cmp, value, dt=DT_U64)", addrs, cmp, value, dt, None,
                     GX_WAIT_ALL, False, False)

    def test_any(self, addrs, cmp, value, dt=DT_U64):
        """Index of a word of ``addrs`` that satisfies the comparison now, or None."""
        return _wait(self, "test_any(addrs, cmp, value, dt=DT_U64)", addrs, cmp, value, dt, None,
                     GX_WAIT_ANY, False, False)

    def test_some(self, addrs, cmp, value, dt=DT_U64):
        """Indices of the words of ``addrs`` that satisfy the comparison now
        (possibly empty)."""
        return _wait(self, "test_some(addrs, cmp, value, dt=DT_U64)", addrs, cmp, value, dt, None,
                     GX_WAIT_SOME, False, False)


cdef str _issue_sig(bint is_put, int mode):
    """The call an _issue comes from, for messages."""
    if is_put:
        if mode == GX_NB:
            return "put_nb(rank, dest, src, lc=LC_NOW)"
        return "put_nbi(rank, dest, src, lc=LC_NOW)"
    return "get_nb(dest, rank, src)" if mode == GX_NB else "get_nbi(dest, rank, src)"


cdef inline uint64_t _val_bits(object value, int n, str sig) except? 0xFFFFFFFFFFFFFFFF:
    """The bits a value put of ``n`` bytes writes: ``value`` in 0..2**(8n)-1,
    or down to -2**(8n-1) in two's complement; OverflowError otherwise (the
    high bytes are never dropped silently)."""
    cdef long long s
    if type(value) is int and _exact_int_ll(value, &s) \
            and (n == 8 or (-(1LL << (8 * n - 1)) <= s < (1LL << (8 * n)))):
        return <uint64_t>s
    i = _as_int(value, sig, "value")
    bits = 8 * <object>n           # Python ints: the range of 8 bytes does not fit a C long long
    lo = -(1 << (bits - 1))
    hi = (1 << bits) - 1
    if not lo <= i <= hi:
        raise OverflowError(f"{_fn(sig)}: value {i} does not fit in nbytes={n} bytes "
                            f"(allowed {lo}..{hi}; negative values are written in two's complement)")
    return PyLong_AsUnsignedLongLongMask(i)


cdef inline int _put_val(Team tm, str sig, object rank, object dest, object value,
                         object nbytes) except -1:
    """put_val and its NB/NBI forms, all blocking puts of 8 bytes at most."""
    cdef int r = _as_rank(rank, sig, &tm.c)
    cdef uintptr_t d = _as_addr(dest, sig, "dest")
    cdef int n = <int>_as_index(nbytes, sig, "nbytes", 1, 8, False)
    cdef uint64_t v = _val_bits(value, n, sig)
    return tm._put(r, d, &v, n)


cdef int _xfer_dev(Team self, bint is_put, int rank, uintptr_t addr, _Local* loc) except -1:
    """A blocking put/get whose local side is device memory of the
    endpoint's kind outside its segment: never the inline memcpy, always
    the route's path (which copies with the kind's copy engine)."""
    cdef char* p
    cdef gx_route* r
    cdef int rc = gx_locate(&self.c, rank, addr, loc.n, &p, &r)
    if rc != GX_OK and rc != GX_NOT_MAPPED:
        return _raise_rc(&self.c, rank, addr, loc.n, rc, "put" if is_put else "get")
    self.client._inflight += 1
    try:
        with nogil:
            _rma_k(&self.c, rank, is_put, addr, loc.p, loc.n, GX_BLOCKING, NULL, NULL,
                   loc.kind, loc.device)
    finally:
        self.client._inflight -= 1
    return 0
