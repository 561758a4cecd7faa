# ---- targets and routes ------------------------------------------------------

cdef class _Target:
    """Owner of one gx_target: what this process knows of one remote EP, and
    the per-target contexts of the transports that can reach it."""

    def __dealloc__(self):
        free(self.t)


cdef class _Route:
    """Owner of one gx_route: how one local endpoint reaches one target."""

    def __dealloc__(self):
        free(self.r)

    cdef int fold(self) except -1:
        """Move the route's live counters into ``stats`` under the names of
        the paths that served them (before the paths change, or to read them)."""
        cdef gx_route* r = self.r
        cdef int k
        if r == NULL:
            return 0
        if self.stats is None:
            self.stats = {}
        for k in range(GX_CNT_KINDS):
            name = self.amo_name if k == GX_CNT_AMO else self.rma_name
            if r.via[k].ops == 0 and r.mapped[k].ops == 0:
                continue
            row = self.stats.get(name)
            if row is None:
                row = self.stats[name] = [0] * (3 * GX_CNT_KINDS)
            row[3 * k] += r.via[k].ops + r.mapped[k].ops
            row[3 * k + 1] += r.via[k].bytes + r.mapped[k].bytes
            row[3 * k + 2] += r.mapped[k].ops
            r.via[k].ops = r.via[k].bytes = r.mapped[k].ops = r.mapped[k].bytes = 0
        return 0

    cdef int reset(self) except -1:
        cdef int k
        for k in range(GX_CNT_KINDS):
            self.r.via[k].ops = self.r.via[k].bytes = 0
            self.r.mapped[k].ops = self.r.mapped[k].bytes = 0
        self.stats = {}
        return 0


_STAT_OPS = ("put", "get", "atomic")


cdef dict _stats_add(dict into, dict rows):
    """Add a route's folded counters to ``{path: {op: {ops, bytes, inline}}}``."""
    cdef int k
    for name, row in rows.items():
        entry = into.get(name)
        if entry is None:
            entry = into[name] = {op: {"ops": 0, "bytes": 0, "inline": 0} for op in _STAT_OPS}
        for k in range(GX_CNT_KINDS):
            c = entry[_STAT_OPS[k]]
            c["ops"] += row[3 * k]
            c["bytes"] += row[3 * k + 1]
            c["inline"] += row[3 * k + 2]
    return into


cdef void _route_none(gx_route* r) noexcept:
    r.local_base = NULL
    r.rma.ops = &_NO_PATH
    r.rma.ep = NULL
    r.rma.peer = NULL
    r.amo = r.rma


# ---- client -----------------------------------------------------------------

def init(comm=None, *, staged=None):
    """Join the job and return its :class:`Client` (GASNet-EX ``gex_Client_Init``).

    Collective over every process of the job.  With nothing set up this is a
    job of one process; under ``python -m gexmk.run`` or ``mpiexec`` (mpi4py)
    it joins the others; ``comm`` takes an mpi4py communicator instead.
    Settings come from the environment (``gexmk.config``: GEXMK_TIMEOUT,
    GEXMK_TRANSPORT, ...), read and checked once, here.  ``staged``:
    ``'allow'`` or ``'refuse'`` degraded paths that copy device memory through
    host bounce buffers (default: GEXMK_STAGED, else allow); refused, an
    operation whose only path is staged raises UnsupportedError naming it.
    """
    global _client
    if _client is not None and not (<Client>_client).finalized:
        raise StateError("gexmk is already initialized in this process; finalize() the client first")
    from gexmk import bootstrap, config
    import dataclasses
    cfg = config.load()
    if staged is not None:
        cfg = dataclasses.replace(cfg, staged=config.staged_option(staged, "init(staged=)"))
    boot = bootstrap.from_environment(comm)
    cdef Client c = Client.__new__(Client)
    try:
        c._setup(boot, cfg)
    except BaseException:
        c._close_transports()
        boot.close()
        raise
    _client = c
    _signal_init(c)
    return c


def _atexit():
    if _client is not None:
        (<Client>_client)._teardown()


atexit.register(_atexit)


cdef class Client:
    """A gexmk client (GASNet-EX ``gex_Client_t``): this process's membership
    of the job, its endpoints (the primordial one has index 0), its segments
    and the primordial team ``tm``.  ``transports`` maps the name of every
    transport this process loaded to its control-plane object.  Use as a
    context manager or call :meth:`finalize`."""

    def __init__(self):
        raise TypeError("use gexmk.init()")

    def _setup(self, boot, cfg):
        from gexmk import transports as registry
        self.bootstrap = boot
        self.config = cfg
        self.rank = boot.rank
        self.size = boot.size
        # node index of every job rank, numbered by first appearance
        names = {}
        self._nodes = [names.setdefault(n, len(names)) for n in boot.nodes]
        self._pids = list(boot.pids)
        self._eps = []
        self._dir = {}
        self._routes = {}
        self._segments = weakref.WeakSet()
        self._teams = weakref.WeakSet()
        self._pending = weakref.WeakSet()
        self._parked = collections.deque()
        self._retired = []
        self._held = {}
        self._published = weakref.WeakSet()
        self._deferred = []
        self._kinds = []
        self.transports = {}
        self._order = []
        job = registry.Job(self.rank, self.size, list(self._nodes), list(self._pids), cfg,
                           boot.exchange)
        for name, module, needed in registry.REGISTRY:
            why = needed(job)
            if not why:
                continue
            try:
                mod = importlib.import_module(module)
            except ImportError as e:
                raise UnsupportedError(f"the {name} transport is needed ({why}) but this build "
                                       f"does not have it: {e}") from None
            if len(self._order) == GX_MAX_TRANSPORTS:
                raise UnsupportedError(f"more than {GX_MAX_TRANSPORTS} transports in one process")
            tr = mod.open(job)
            self.transports[name] = tr
            self._order.append(tr)
        ep0 = self.ep_create()
        self.tm = Team._make(self, ep0, [(j, 0) for j in range(self.size)], self.rank, "tm0", False)
        _sync_init(self)        # barriers' and collectives' sync area (core.src/coll.pxi)
        me = weakref.ref(self)

        def died(jobrank):
            c = me()
            if c is not None:
                (<Client>c)._peer_died(jobrank)
        boot.on_peer_death(died)

    def _close_transports(self):
        for tr in reversed(self._order or []):
            tr.close()
        self._order = []

    cdef int check_alive(self) except -1:
        if self.finalized:
            raise StateError("the gexmk client has been finalized")
        return 0

    cdef _Target target(self, int jobrank, int ep_index):
        key = (jobrank, ep_index)
        cdef _Target tg = self._dir.get(key)
        if tg is None:
            tg = _Target.__new__(_Target)
            tg.t = <gx_target*>calloc(1, sizeof(gx_target))
            if tg.t == NULL:
                raise MemoryError()
            tg.t.jobrank = jobrank
            tg.t.ep_index = ep_index
            tg.t.pid = self._pids[jobrank]
            tg.t.device = -1
            tg.ctx = {}
            tg.routes = []
            self._dir[key] = tg
        return tg

    cdef _Route route(self, Endpoint ep, int jobrank, int ep_index):
        key = (ep.index, jobrank, ep_index)
        cdef _Route rt = self._routes.get(key)
        if rt is None:
            rt = _Route.__new__(_Route)
            # one cache line for the fields the inline path reads and counts
            if posix_memalign(<void**>&rt.r, 64, sizeof(gx_route)) != 0:
                rt.r = NULL
                raise MemoryError()
            memset(rt.r, 0, sizeof(gx_route))
            rt.stats = {}
            rt.refused = {}
            rt.target = self.target(jobrank, ep_index)
            rt.r.t = rt.target.t
            rt.ep_index = ep.index
            _route_none(rt.r)
            rt.rma_name = rt.amo_name = "none"
            rt.target.routes.append(rt)
            self._routes[key] = rt
            self._choose(rt)
        return rt

    def _peer(self, _Target tg):
        cdef gx_target* t = tg.t
        return _transports_mod().Peer(
            t.jobrank, t.ep_index, t.pid, self._nodes[t.jobrank], t.jobrank == self.rank,
            self._nodes[t.jobrank] == self._nodes[self.rank], t.remote_base, t.size, t.kind, t.device,
            <uintptr_t>t)

    cdef int _choose(self, _Route rt) except -1:
        """Pick the route's paths, separately for RMA and atomics: the
        transport that scores highest for each (choose once, off the hot path)."""
        cdef gx_route* r = rt.r
        cdef gx_target* t = rt.target.t
        cdef Endpoint ep = None
        r.local_base = NULL         # no memcpy through the route while it changes
        t.wake = NULL               # (set again below where the mapping has one)
        gx_mem_fence()
        rt.fold()                   # counters so far belong to the paths chosen before
        r.remote_base = t.remote_base
        r.size = t.size
        r.dead = t.dead
        if rt.ep_index < len(self._eps):
            ep = self._eps[rt.ep_index]
        elif rt.ep_index == _SYNC_EP:
            ep = _sync_ep(self)
        best_rma = best_amo = None
        refuse = self.config.staged == "refuse"
        rt.refused = {}
        if t.size != 0 and not t.dead and ep is not None and not self.finalized:
            peer = self._peer(rt.target)
            for tr in self._order:
                reach = tr.reach(ep.contexts[tr.name], peer, rt.target.ctx.get(tr.name))
                if reach is None:
                    continue
                if refuse and getattr(reach, "staged", False):
                    # a degraded path the user refused: never chosen, named in the error
                    if reach.rma > 0:
                        rt.refused.setdefault("rma", reach.name)
                    if reach.amo > 0:
                        rt.refused.setdefault("atomic", reach.name)
                    continue
                if reach.rma > 0 and (best_rma is None or reach.rma > best_rma[0].rma):
                    best_rma = (reach, ep.contexts[tr.name])
                if reach.amo > 0 and (best_amo is None or reach.amo > best_amo[0].amo):
                    best_amo = (reach, ep.contexts[tr.name])
        _set_path(&r.rma, best_rma)
        _set_path(&r.amo, best_amo)
        rt.view = best_rma[0].view if best_rma is not None else None
        rt.rma_name = best_rma[0].name if best_rma is not None else "none"
        rt.amo_name = best_amo[0].name if best_amo is not None else "none"
        if best_rma is None and "rma" in rt.refused:
            _set_refused(&r.rma, rt)
            rt.rma_name = "refused:" + rt.refused["rma"]
        if best_amo is None and "atomic" in rt.refused:
            _set_refused(&r.amo, rt)
            rt.amo_name = "refused:" + rt.refused["atomic"]
        rt.keep = (best_rma, best_amo, rt.target.ctx.copy())
        gx_mem_fence()
        # memcpy only where one CPU mapping serves both RMA and atomics
        if best_rma is not None and best_amo is not None and best_rma[0].local_base \
                and best_rma[0].ops == best_amo[0].ops:
            r.local_base = <char*><uintptr_t>best_rma[0].local_base
            # the target's wake word, where the mapping has one: CPU signal and
            # atomic writers wake its sleeping waiters (the route of any endpoint)
            if best_rma[0].wake:
                t.wake = <gx_wake*><uintptr_t>best_rma[0].wake
        return 0

    def _reroute(self, _Target tg=None, Endpoint ep=None):
        """Choose again the routes to ``tg`` or from ``ep`` (publication, bind)."""
        cdef _Route rt
        for rt in list(tg.routes if tg is not None else self._routes.values()):
            if ep is None or rt.ep_index == ep.index:
                self._choose(rt)

    def _peer_died(self, int jobrank):
        cdef _Target tg
        cdef _Route rt
        for tr in self._order:      # before any wait on it raises (optional hook)
            dying = getattr(tr, "peer_dying", None)
            if dying is not None:
                dying(jobrank)
        for (jr, _), tg in list(self._dir.items()):
            if jr == jobrank:
                tg.t.dead = 1
                for rt in tg.routes:
                    rt.r.dead = 1
        for tr in self._order:
            tr.peer_died(jobrank)

    def path_stats(self):
        """Operations and bytes per path, over every route of this process
        (every local endpoint to every target): ``{path: {"put"|"get"|"atomic":
        {"ops": n, "bytes": b, "inline": k}}}``, where ``inline`` is how many of
        the ops the inline memcpy of a CPU mapping served.  Counted since init
        or :meth:`reset_path_stats`; a path that served nothing is absent.
        Counts are exact while one thread at a time issues on a route.  The
        library's own synchronisation (barriers, collectives' flags and
        scratch, from its hidden endpoint) is not counted here."""
        cdef _Route rt
        out = {}
        for rt in self._routes.values():
            if rt.ep_index == _SYNC_EP:
                continue
            rt.fold()
            _stats_add(out, rt.stats)
        return out

    def reset_path_stats(self):
        """Zero the counters of :meth:`path_stats` (every route of this process)."""
        cdef _Route rt
        for rt in self._routes.values():
            rt.reset()

    @property
    def finalized(self):
        """True once finalize() has run."""
        return self.finalized

    @property
    def eps(self):
        """The live endpoints of this process, by index."""
        return [e for e in self._eps if e is not None]

    def ep(self, index):
        """The endpoint with this index (GASNet-EX ``gex_TM_QueryEP`` / index lookup)."""
        index = _as_int(index, "ep", "index")
        self.check_alive()
        if index < 0 or index >= len(self._eps) or self._eps[index] is None:
            raise ArgumentError(f"ep: no live endpoint with index {index} in this process")
        return self._eps[index]

    def nodes(self):
        """Node index of every job rank (equal index: same host)."""
        return list(self._nodes)

    # -- memory kinds and segments --

    def mk_create(self, cls, device=0, context=None):
        """A memory kind (GASNet-EX ``gex_MK_Create``); see
        :func:`gexmk.memory.mk_create`.  The client closes it at finalize,
        after its segments."""
        global _device_kinds
        self.check_alive()
        mk = _mk_create(cls, device, context)
        if mk is not HOST:
            self._kinds.append(mk)
            _device_kinds = True
        return mk

    def _kind_of_pointer(self, uintptr_t p, bint known=False, bint ask=False):
        """The memory kind of this process that device memory at ``p`` belongs
        to, or None for host memory (pinned, pageable or managed: the CPU
        reaches it).  A kind of the process for that device is reused; with
        none, one is created on the device's primary context (as mk_create
        would), so that a CuPy array or torch tensor needs no set-up.
        ``known``: the caller was told it is device memory; then a pointer the
        driver does not know is an error rather than host memory.  The driver
        is asked when ``known`` or ``ask``, or once the process has a device
        kind (before, a raw pointer is taken for host memory)."""
        for mk in self._kinds:
            if (<MemoryKind>mk).impl is None:
                continue
            cls, dev = (<MemoryKind>mk).impl.classify(p)
            if cls != GX_MK_HOST:
                if dev == (<MemoryKind>mk).device:
                    return mk
                break            # device memory of another GPU: its own kind
        info = _pointer_attributes_raw(p) if (known or ask or _device_kinds) else None
        if info is None or info["memory"] != "device":
            if known and (info is None or info["memory"] == "unknown"):
                raise ArgumentError(f"0x{p:x} was given as device memory (CUDA array "
                                    "interface) but the CUDA driver does not know it (freed, or "
                                    "another process's pointer?)")
            return None
        for mk in self._kinds:
            if (<MemoryKind>mk).cls == GX_MK_CUDA_UVA and (<MemoryKind>mk).device == info["device"]:
                return mk
        return self.mk_create(GX_MK_CUDA_UVA, info["device"])

    def segment_create(self, size=None, *, buffer=None, kind=None, reserve=None):
        """Create a segment (GASNet-EX ``gex_Segment_Create``), not yet bound.

        ``segment_create(size)``: library-allocated, zero-filled, in shared
        memory that peers of this node map at publication.
        ``segment_create(buffer=obj)``: client-allocated from any writable,
        contiguous PEP 3118 object, which the segment keeps alive; peers on
        this node reach it by address (the transports say how: ``tm.paths``).
        ``kind=`` a device kind (``client.mk_create(gexmk.CUDA_UVA, device)``):
        library-allocated device memory (``reserve``: bytes of address space
        kept for ``seg.grow``), or ``buffer=`` a device array of that kind
        (CUDA array interface, or (pointer, nbytes)).  Without ``kind=``, a
        device array's kind is inferred from what the driver says of its
        pointer (device ordinal, context): the process's kind for that device,
        created on first use; a given ``kind=`` is checked against it.
        """
        self.check_alive()
        if kind is not None and not isinstance(kind, MemoryKind):
            raise TypeError(f"kind must be a gexmk.MemoryKind, got {type(kind).__name__}")
        if kind is None and buffer is not None and size is None:
            kind = _infer_kind(self, buffer)
        if (size is None) == (buffer is None):
            raise ArgumentError("give exactly one of size (library-allocated) or buffer= (client-allocated)")
        if size is not None:
            size = _as_int(size, "segment_create", "size", False)
            if size <= 0:
                raise ArgumentError(f"segment_create: segment size must be positive, got {size}")
            if size > PY_SSIZE_T_MAX:
                raise ArgumentError(f"segment_create: size {size} is more than any machine can "
                                    f"map (at most {PY_SSIZE_T_MAX})")
        if reserve is not None and (kind is None or kind == HOST or buffer is not None):
            raise ArgumentError("reserve= applies to library-allocated device segments only")
        if kind is not None and kind != HOST:
            if (<MemoryKind>kind).impl is None:
                raise UnsupportedError(f"{kind!r} describes a peer's memory; create a kind of this "
                                       "process with client.mk_create()")
            if buffer is not None:
                seg = Segment._device_client(self, kind, buffer)
            else:
                r = size if reserve is None else _as_int(reserve, "segment_create", "reserve", False)
                if r < size:
                    raise ArgumentError(f"segment_create: reserve must be >= size ({size}), got {r}")
                seg = Segment._device(self, kind, size, r)
        elif buffer is not None:
            seg = Segment._client_buffer(self, buffer)
        else:
            seg = Segment._library(self, size)
        self._segments.add(seg)
        return seg

    def _segment_grown(self, Segment seg):
        """A bound segment grew: this process's targets see the new size now."""
        for e in self._eps:
            if e is not None and (<Endpoint>e).segment is seg:
                self.target(self.rank, (<Endpoint>e).index).t.size = seg.size
                (<Endpoint>e)._rebind()

    def segment_attach(self, size, *, ep=None):
        """Create a library-allocated host segment of ``size`` bytes, bind it to
        an endpoint and publish it over the primordial team (GASNet-EX
        ``gex_Segment_Attach``).  Collective over the job.  Returns the segment.

        ``ep=None`` binds the primordial endpoint 0 (which must have no segment
        yet).  For a second segment pass an endpoint of its own
        (``ep=client.ep_create()``, with no segment), then address it through
        ``client.tm.create_for(ep)``, a team of those endpoints.  Every process
        passes ``ep`` or every process passes None."""
        size = _as_int(size, "segment_attach", "size", False)
        cdef Endpoint e
        if ep is None:
            e = self.ep(0)
            if e.segment is not None:
                raise StateError("segment_attach: endpoint 0 already has a bound segment (from an "
                                 "earlier segment_attach?); for a second segment pass an endpoint "
                                 "of its own: ep = client.ep_create(); "
                                 "client.segment_attach(size, ep=ep); tm2 = client.tm.create_for(ep)")
        else:
            if not isinstance(ep, Endpoint):
                raise TypeError(f"segment_attach: ep must be a gexmk.Endpoint or None (got {_got(ep)})")
            e = ep
            if e.client is not self:
                raise ArgumentError("segment_attach: ep is an endpoint of another client")
            e.check_alive()
            if e.segment is not None:
                raise StateError(f"segment_attach: endpoint {e.index} already has a bound segment; "
                                 "create another endpoint (client.ep_create()) or unbind it first")
        seg = self.segment_create(size)
        try:
            e.bind_segment(seg)
        except BaseException:
            seg.destroy()
            raise
        self.tm.publish_bound_segment([e])
        return seg

    def _segment_destroyed(self, Segment seg):
        """Unbind a segment being destroyed.  True when the client keeps its
        memory for now: client memory that peers reach by address
        must not be handed back while a peer that has not seen
        a new publication may still write to it, and no segment is released
        while a publication of it is not yet applied by every member (a
        peer still to map it: see _hold_segments)."""
        bound = False
        for e in self._eps:
            if e is not None and (<Endpoint>e).segment is seg:
                (<Endpoint>e).unbind_segment()
                bound = True
        # Unbound before its destruction, a segment that was published is still
        # in peers' hands until their next publication of that endpoint: its
        # address must not be reused either (peers that write by address: a
        # stale put_signal landed in a segment made later at the same place,
        # fuzz seed 507).
        bound = bound or seg in self._published
        self._drain()     # a GIL-free copy may still be writing into it
        if self._held.get(seg) and not self.finalized:
            # kept as by a buffer view, so that the last real view's release
            # does not free it either
            seg.exports += 1
            self._deferred.append((seg, bound))
            return True
        return self._retire_destroyed(seg, bound)

    def _retire_destroyed(self, Segment seg, bint bound):
        """_segment_destroyed's answer once no publication holds ``seg``."""
        if bound and self.size > 1 and not self.finalized:
            # Peers learn of the destruction at the next publication; until
            # then the address must not be reused.  Client memory is kept
            # whole; library memory is released, its range kept reserved.
            self._retired.append(seg)
            if seg.library_allocated:
                seg.keep_address = True
                return False
            return True
        return False

    def _hold_segments(self, list segs):
        """Publications of ``segs`` went out that some member may not have
        applied yet: a destroy keeps their memory (and its file) until _settle."""
        for s in segs:
            self._held[s] = self._held.get(s, 0) + 1
            self._published.add(s)

    def _settle(self, list settle, list segs):
        """Every member applied a publication: run the transports' release
        calls, and release segments destroyed meanwhile that no other
        unsettled publication holds."""
        for done in settle:
            try:
                done()
            except Exception as e:          # noqa: BLE001 - a release must not break a collective
                warnings.warn(f"releasing what a publication kept failed: {e}", RuntimeWarning,
                              stacklevel=3)
        for s in segs:
            n = self._held.get(s, 0) - 1
            if n > 0:
                self._held[s] = n
                continue
            self._held.pop(s, None)
            for i, (d, bound) in enumerate(self._deferred):
                if d is s:
                    del self._deferred[i]
                    self._release_destroyed(s, bound)
                    break

    def _release_destroyed(self, Segment seg, bint bound):
        """What Segment.destroy left undone while a publication held ``seg``."""
        seg.exports -= 1
        if self._retire_destroyed(seg, bound):
            return
        if seg.allocation is not None:
            seg.allocation.release()
            seg.owner = None
        if seg.exports == 0:
            seg._free()

    def _drain(self):
        """Wait until no GIL-free copy started through the Python API is running."""
        while self._inflight > 0:
            threading.Event().wait(0.0005)

    # -- endpoints --

    def ep_create(self, caps=EP_CAPABILITY_RMA):
        """Create an endpoint (GASNet-EX ``gex_EP_Create``) with its own index
        and completion state (its own context in every transport).  Not collective."""
        caps = _as_int(caps, "ep_create", "caps", False)
        self.check_alive()
        if caps & ~EP_CAPABILITY_ALL or caps == 0:
            raise ArgumentError(f"ep_create: caps={caps:#x} is not supported: this build offers "
                                "EP_CAPABILITY_RMA")
        cdef Endpoint ep = Endpoint.__new__(Endpoint)
        ep.client = self
        ep._keep_put = []
        ep._keep_get = []
        ep.index = len(self._eps)
        ep.c.index = ep.index
        ep.c.seg_kind = GX_MK_HOST
        ep.c.seg_device = -1
        ep.caps = caps
        ep.contexts = {}
        ep._blobs = {}
        try:
            for tr in self._order:
                ctx = tr.open_endpoint(ep.index)
                ep.contexts[tr.name] = ctx
                ep.c.tr[ep.c.ntr].ops = <const gx_tr_ops*><uintptr_t>ctx.ops
                ep.c.tr[ep.c.ntr].ep = <void*><uintptr_t>ctx.handle
                ep.c.ntr += 1
        except BaseException:
            ep._close_contexts()
            raise
        self._eps.append(ep)
        return ep

    # -- teardown --

    def finalize(self):
        """Leave the job: a barrier over every process of the job (the
        bootstrap's own, so it never matches a team barrier; skipped when a
        peer has died), then release every segment, mapping and endpoint.
        Idempotent."""
        if self.finalized:
            return
        try:
            # Quiet first: puts and signals a network transport still holds
            # queued (issued with no completion to wait for) must land before
            # the peers close their endpoints: a network library crashed
            # closing its endpoint (SIGSEGV) when a peer went away under such
            # a backlog of put_signals.
            try:
                _nbi_sync(EC_PUT | EC_RMW)
            except GexmkError:
                pass            # a dead or unreachable peer: leave all the same
            # ... and every operation still in flight (NB ones too): a peer
            # that closes its endpoint under a transfer can crash a network
            # library, on either side
            for tr in self._order:
                quiesce = getattr(tr, "quiesce", None)
                if quiesce is not None:
                    try:
                        quiesce()
                    except GexmkError:
                        pass
            self.bootstrap.barrier()
        except PeerDeadError:
            pass
        finally:
            self._teardown()

    def _teardown(self):
        """Release everything, in order: pending events (failed with
        StateError at once), teams, endpoint contexts, routes and targets,
        segments, transports, the bootstrap."""
        global _client
        cdef Event ev
        cdef _Route rt
        if self.finalized:
            return
        self.finalized = True
        gone = StateError("the gexmk client was finalized before this operation completed")
        for ev in list(self._pending):
            if not ev._done:
                ev._fail(gone)
        self._pending.clear()
        # ops of dropped events go to their transports, which close below (draining
        # or abandoning them); what they touch stays alive until then
        parked = _unpark_all(self)
        for t in list(self._teams):
            (<Team>t)._close("its client was finalized")
        self._drain()
        for e in self._eps:
            if e is not None:
                (<Endpoint>e)._close_contexts()
        _sync_close(self)
        for rt in self._routes.values():
            _route_none(rt.r)
            rt.keep = None
        self._routes.clear()
        self._dir.clear()
        for s in list(self._segments):
            s.destroy()
        self._held.clear()
        for s, bound in self._deferred:
            self._release_destroyed(s, bound)
        self._deferred = []
        for s in self._retired:
            (<Segment>s).keep_address = False
            if (<Segment>s).exports == 0:
                (<Segment>s)._free()
        self._retired = []
        self._close_transports()
        del parked
        for mk in self._kinds:
            mk.close()
        self._kinds = []
        self.bootstrap.close()
        if _client is self:
            _client = None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if exc_type is None:
            self.finalize()
        else:
            self._teardown()    # no collective while unwinding an error
        return False

    def __repr__(self):
        state = "finalized" if self.finalized else f"rank {self.rank} of {self.size}"
        return f"<gexmk.Client {state}>"

    # -- publication (used by Team) --

    def _seg_info(self, Endpoint ep):
        """What publication says of ``ep``: index, segment (address, size, kind,
        device) and each transport's bytes for peers."""
        cdef Segment s = ep.segment
        if s is None:
            return (ep.index, 0, 0, GX_MK_HOST, -1, {})
        return (ep.index, <uintptr_t>s.addr, s.size, s.kind.cls, s.kind.device, dict(ep._blobs))

    def _apply(self, int jobrank, tuple info):
        """Record what (jobrank, EP) published; each transport makes its
        per-target context (mapping, address, keys), then every local
        endpoint's route to it is chosen again."""
        ep_index, base, size, kind, device, blobs = info
        cdef _Target tg = self.target(jobrank, ep_index)
        cdef gx_target* t = tg.t
        cdef _Route rt
        if jobrank == self.rank:
            return None     # local EPs are known from bind_segment
        for rt in tg.routes:
            _route_none(rt.r)       # nothing reaches the target while it changes
        gx_mem_fence()
        t.remote_base = base
        t.size = size
        t.kind = kind
        t.device = device
        peer = self._peer(tg)
        err = None
        for tr in self._order:
            try:
                ctx = tr.apply(peer, blobs.get(tr.name))
            except GexmkError as e:          # this transport cannot; another may
                ctx = None
                err = err or e
            if ctx is None:
                tg.ctx.pop(tr.name, None)
            else:
                tg.ctx[tr.name] = ctx
        reached = False
        for rt in tg.routes:
            self._choose(rt)
            reached = reached or rt.rma_name != "none"
        # (a loop, not all(genexpr): a generator's rt is untyped, and reading
        # the cdef rma_name through it raised AttributeError over err)
        if err is not None and not reached:
            raise err
        return tg

    def _connect(self, routes):
        """Let transports that can set up connections ahead of time (an
        optional ``connect(pairs)``) do so for ``routes`` (after a publication,
        or when a team makes new routes), so that the first operation on a
        route costs what the rest do.  Pairs: (endpoint context, target
        handle, rma) of each route the transport serves."""
        cdef _Route rt
        for tr in self._order:
            connect = getattr(tr, "connect", None)
            if connect is None:
                continue
            pairs = []
            for rt in routes:
                if rt.keep is None or rt.ep_index >= len(self._eps) or self._eps[rt.ep_index] is None:
                    continue
                epctx = (<Endpoint>self._eps[rt.ep_index]).contexts.get(tr.name)
                for best, rma in ((rt.keep[0], True), (rt.keep[1], False)):
                    if best is not None and best[1] is epctx:
                        pairs.append((epctx, best[0].peer, rma))
            if pairs:
                try:
                    connect(pairs)
                except Exception as e:      # never break the caller: the first op connects
                    warnings.warn(f"{tr.name}: connection set-up ahead of the first operation "
                                  f"failed ({e}); the first operation to each peer will set it up",
                                  RuntimeWarning, stacklevel=3)


cdef int _set_refused(gx_path* p, _Route rt) except -1:
    """The path of a route whose only path is staged and refused: every
    operation raises, naming the path and the option (x.peer: the route)."""
    p.ops = &_REFUSED_PATH
    p.ep = NULL
    p.peer = <void*>rt
    return 0


cdef int _set_path(gx_path* p, object best) except -1:
    if best is None:
        p.ops = &_NO_PATH
        p.ep = NULL
        p.peer = NULL
        return 0
    reach, ctx = best
    p.ops = <const gx_tr_ops*><uintptr_t>reach.ops
    p.ep = <void*><uintptr_t>ctx.handle
    p.peer = <void*><uintptr_t>reach.peer
    return 0


cdef object _transports_module = None

cdef object _transports_mod():
    global _transports_module
    if _transports_module is None:
        from gexmk import transports
        _transports_module = transports
    return _transports_module
