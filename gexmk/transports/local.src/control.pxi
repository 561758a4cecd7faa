# ---- control plane ---------------------------------------------------------------

cdef class _EndpointContext:
    """Per endpoint: the kind of its bound segment (a device buffer of the
    endpoint goes through that kind's copy engine).  Every op completes at issue."""
    cdef lp_ep c
    cdef LocalTransport tr
    cdef readonly bint closed
    cdef object seg
    cdef object offered            # the fd server's key of the bound device segment's export
    cdef int index                 # the endpoint's index (the sync area's is hidden)
    cdef _LandingZone zone         # nbrhd-landed: the bound segment's landing zone, or None
    cdef dict _holds               # offer name -> publications of it not yet applied everywhere
    cdef set _withdraw             # offers unbound while held: withdrawn once no longer held

    @property
    def handle(self):
        return <uintptr_t>&self.c

    @property
    def ops(self):
        return <uintptr_t>&_SELF

    def bind(self, Segment seg not None):
        """A library-allocated host segment publishes its memfd (fd number and
        name) for peers of this node to map; other segments publish nothing
        (yet: device segments of peers are reached over a network transport).
        Host segments are pinned with the driver of a device kind of this
        process, so copies between them and device memory run at DMA speed."""
        _set_kind(&self.c.k, seg.kind)
        self.seg = seg
        if seg.kind.cls != GX_MK_HOST:
            self.tr._device_bound(seg)
            blob = self.tr._offer_device(self, seg)
            if blob is None and seg.allocation is not None and not seg.allocation.exportable:
                blob = self.tr._offer_zone(self, seg)
            return blob
        self.tr._host_bound(seg)
        if self.tr.stage_all and self.index < _HIDDEN:
            return self.tr._offer_zone(self, seg)
        if seg.fd >= 0:
            return pickle.dumps(("host", seg.fd, seg.token))
        return None

    def unbind(self):
        if self.offered is not None:
            if self._holds and self._holds.get(self.offered):
                # a peer may still be fetching it (see published)
                self._withdraw.add(self.offered)
            else:
                fdpass.process_server().withdraw(self.offered)
            self.offered = None
        if self.zone is not None:
            self.zone.close()
            self.zone = None
        if self.seg is not None and (<Segment>self.seg).kind.cls != GX_MK_HOST:
            self.tr._device_unbound(self.seg)
        elif self.seg is not None:
            self.tr._host_unbound(self.seg)
        self.seg = None
        self.c.k.ops = NULL

    def published(self, jobranks):
        """This endpoint's segment was just published: a peer may still be
        fetching its export (device segment, landing zone) from the fd
        server after this process returns, so an unbinding keeps the offer
        until the returned call runs (the core calls it once every member
        has applied the publication)."""
        name = self.offered
        if name is None:
            return None
        if self._holds is None:
            self._holds = {}
            self._withdraw = set()
        self._holds[name] = self._holds.get(name, 0) + 1

        def settle():
            n = self._holds.get(name, 0) - 1
            if n > 0:
                self._holds[name] = n
                return
            self._holds.pop(name, None)
            if name in self._withdraw:
                self._withdraw.discard(name)
                fdpass.process_server().withdraw(name)
        return settle

    def close(self):
        """Complete the endpoint's device copies, destroy its streams (idempotent)."""
        cdef int i
        if self.closed:
            return
        self.unbind()
        self.closed = True
        try:
            with nogil:
                _ep_streams_done(&self.c, True)
        finally:
            _bounce_free(&self.c)
            _tiny_free(&self.c)
            for i in range(self.c.ns):
                try:
                    self.c.s[i].ops.stream_destroy(self.c.s[i].kctx, self.c.s[i].stream)
                except Exception:   # noqa: BLE001 - its kind may be closed: the context took it
                    pass
            self.c.ns = 0


cdef class _DeviceContext:
    """A device segment reached from this process, as a target: its kind, and
    for a peer's segment the import (mapped for this kind's device only)."""
    cdef lp_dev c
    cdef object kind
    cdef int refs
    cdef object imported           # nbrhd: the kind's Allocation of the import
    cdef object seg                # self: the bound segment
    cdef object key                # nbrhd: (fd server address, key) it came from
    cdef bint staged               # nbrhd: mapped for the segment's own GPU, not this
                                   # process's (peer access off): device<->device copies stage

    def unmap(self):
        self.c.local_base = NULL
        if self.imported is not None:
            self.imported.unmap()
            self.imported = None

    @property
    def handle(self):
        return <uintptr_t>&self.c


cdef class _PeerContext:
    """What this process holds of one peer segment: its mapping (nbrhd) or
    nothing (pvm: the owner's address and pid are in the target)."""
    cdef lp_peer c
    cdef object map_key            # (jobrank, token) of the mapping, or None

    @property
    def handle(self):
        return <uintptr_t>&self.c


cdef class LocalTransport:
    """The control plane of the local paths (one per client)."""
    cdef readonly str name
    cdef object job
    cdef str force                 # GEXMK_TRANSPORT
    cdef bint no_peer_access       # GEXMK_CUDA_PEER_ACCESS=off: device<->device between
                                   # segments of different endpoints is host-staged
    cdef dict _peers               # (jobrank, ep_index) -> _PeerContext
    cdef dict _maps                # (jobrank, token) -> [addr, maplen, refs, wake address or 0]
    cdef dict _devsegs             # address of a bound device segment of this process -> _DeviceContext
    cdef list _retired             # contexts of unbound device segments, kept until close
    cdef dict _hosts               # address of a bound host segment -> [segment, pinning _DeviceContext]
    cdef dict _kinds               # (class, device) -> a kind made here to import peers' segments
    cdef long _gen                 # numbers the device exports offered
    cdef list _zones               # every landing zone this process opened (nbrhd-landed)
    cdef readonly bint stage_all   # GEXMK_NBRHD_STAGE=all: host segments land too (tests)
    cdef int stage_slots           # GEXMK_NBRHD_STAGE_SLOTS / _CHUNK: landing zones' shape
    cdef size_t stage_chunk
    cdef int node_size             # processes of this node: an nbrhd-landed zone's rings
    cdef int node_index            # this process's ring in a zone of its node
    cdef readonly double ring_idle # GEXMK_RING_IDLE: a ring in a peer's zone released once unused
    cdef int _idle_stop            # ... this long, by the idle thread (landed_initiator.pxi)
    cdef object _idle_thread
    cdef readonly bint closed

    def __init__(self, job):
        self.name = "local"
        self.job = job
        self.force = job.config.transport
        self.no_peer_access = getattr(job.config, "cuda_peer_access", "auto") == "off"
        self._peers = {}
        self._maps = {}
        self._devsegs = {}
        self._retired = []
        self._hosts = {}
        self._kinds = {}
        self._gen = 0
        self._zones = []
        self.stage_all = getattr(job.config, "nbrhd_stage", "auto") == "all"
        self.stage_slots = getattr(job.config, "nbrhd_stage_slots", 4)
        self.stage_chunk = getattr(job.config, "nbrhd_stage_chunk", 4 << 20)
        # A landing zone serves the peers of its node only: one ring per
        # process of the node, by node-local index (not per job rank: issue 23)
        mine = job.nodes[job.rank] if job.nodes else None
        self.node_size = sum(1 for nd in job.nodes if nd == mine) if job.nodes else job.size
        self.node_index = sum(1 for nd in job.nodes[:job.rank] if nd == mine) if job.nodes \
            else job.rank
        # a ring this process uses in a peer's zone goes back (its pages to
        # the OS) once unused this long; 0: never
        self.ring_idle = env_seconds("GEXMK_RING_IDLE", RING_IDLE_DEFAULT)
        _configure(job.config)

    def _node_index_of(self, int jobrank):
        """The ring of job rank jobrank in this node's zones, or -1 (another node)."""
        nodes = self.job.nodes
        if not nodes:
            return jobrank
        if nodes[jobrank] != nodes[self.job.rank]:
            return -1
        return sum(1 for nd in nodes[:jobrank] if nd == nodes[jobrank])

    def _idle_start(self):
        import threading
        if self._idle_thread is not None or self.ring_idle <= 0:
            return
        self._idle_stop = 0
        self._idle_thread = threading.Thread(target=self._idle_run, name="gexmk-nbrhd-rings",
                                             daemon=True)
        self._idle_thread.start()

    def _idle_run(self):
        cdef double idle = self.ring_idle
        with nogil:
            _lz_idle_run(&self._idle_stop, idle)

    @property
    def ring_stats(self):
        """This process's rings in peers' landing zones (nbrhd-landed):
        ``{"held": in use now, "released": releases so far}``."""
        held = released = 0
        for p in list(self._peers.values()) + self._retired:
            if isinstance(p, _LandContext):
                st = (<_LandContext>p).ring_stats
                held += st["held"]
                released += st["released"]
        return {"held": held, "released": released}

    def open_endpoint(self, int index):
        cdef _EndpointContext ctx = _EndpointContext()
        ctx.tr = self
        ctx.index = index
        return ctx

    def _device_bound(self, Segment seg):
        cdef _DeviceContext d = self._devsegs.get(seg.address)
        cdef _DeviceContext o
        _pool_start()
        if d is None:
            d = _DeviceContext()
            _set_kind(&d.c.k, seg.kind)
            d.kind = seg.kind
            d.seg = seg
            # Device segments of this process on other devices: each side's
            # copy engine must reach the other (VMM access is per device).
            for o in self._devsegs.values():
                if o.kind.device != seg.kind.device and o.seg is not None \
                        and not self.no_peer_access:
                    for a, dev in ((seg.allocation, o.kind.device), (o.seg.allocation, seg.kind.device)):
                        try:
                            a.grant(dev)
                        except Exception:   # noqa: BLE001 - not VMM: the copy reports it
                            pass
            self._devsegs[seg.address] = d
        d.refs += 1
        for entry in self._hosts.values():
            if entry[1] is None:
                self._pin(entry, d)

    def _host_bound(self, Segment seg):
        entry = self._hosts[<uintptr_t>seg.addr] = [seg, None]
        for d in self._devsegs.values():
            self._pin(entry, d)
            break

    def _pin(self, list entry, _DeviceContext d):
        cdef Segment seg = entry[0]
        try:
            d.c.k.ops.host_register(d.c.k.kctx, seg.addr, seg.size, 1)
        except Exception:       # noqa: BLE001 - pinning is an optimisation: copies work unpinned
            return
        entry[1] = d

    def _host_unbound(self, Segment seg):
        cdef _DeviceContext d
        entry = self._hosts.pop(<uintptr_t>seg.addr, None)
        if entry is not None and entry[1] is not None:
            d = entry[1]
            try:
                d.c.k.ops.host_register(d.c.k.kctx, seg.addr, seg.size, 0)
            except Exception:   # noqa: BLE001 - the kind may be closed already
                pass

    def _device_unbound(self, Segment seg):
        cdef _DeviceContext d = self._devsegs.get(<uintptr_t>seg.addr)
        if d is not None:
            d.refs -= 1
            if d.refs == 0:
                # routes may still point at it until they are chosen again: keep it
                self._retired.append(self._devsegs.pop(<uintptr_t>seg.addr))

    def apply(self, peer, blob):
        """A peer of this node published (or withdrew) a host segment: map its
        memfd (nbrhd) where allowed and possible, else reach it by address (pvm)."""
        key = (peer.jobrank, peer.ep_index)
        desc = pickle.loads(blob) if blob is not None else None
        old = self._peers.get(key)
        if desc is not None and desc[0] == "zone":
            want = _LandContext
        elif peer.kind != GX_MK_HOST:
            want = _DeviceContext
        else:
            want = _PeerContext
        if old is not None and type(old) is not want:
            # the peer's endpoint now has another sort of segment (a host one
            # after a device one, pool memory after VMM...): what this process
            # held of the old one goes first (fuzz seed 5019: a device segment
            # published where a host one had been raised TypeError)
            self._drop_peer(key)
        if want is _LandContext:
            return self._apply_zone(key, peer, desc)
        if want is _DeviceContext:
            return self._apply_device(key, peer, desc)
        cdef _PeerContext pc = self._peers.pop(key, None)
        wanted = (peer.size != 0 and not peer.same_process and peer.same_node
                  and self.force != "ofi" and peer.kind == GX_MK_HOST)
        fd, token = desc[1:] if (wanted and desc is not None
                                 and self.force != "pvm") else (-1, None)
        map_key = (peer.jobrank, token) if token is not None else None
        if pc is not None and (not wanted or pc.map_key != map_key):
            self._unmap(pc)
            pc = None
        if not wanted:
            return None
        if pc is None:
            pc = _PeerContext()
            if map_key is not None:
                try:
                    self._map(pc, map_key, peer.pid, fd, peer.size)
                except OSError:
                    pass        # not permitted here: process_vm reports its own error
        self._peers[key] = pc
        return pc

    def _offer_device(self, _EndpointContext ctx, Segment seg):
        """Export a bound device segment for peers of this node: its file
        descriptors go to the process's fd server (SCM_RIGHTS after a peer
        credential check), its blob and the server's address are published."""
        alloc = seg.allocation
        if alloc is None or not alloc.exportable or self.job.size == 1:
            return None
        fds, kblob = alloc.export()
        self._gen += 1
        name = f"segment-{self._gen}"
        server = fdpass.process_server()
        try:
            server.offer(name, fds, allowed_pids=set(self.job.pids))
        finally:
            for fd in fds:
                os.close(fd)
        ctx.offered = name
        return pickle.dumps(("device", server.address, name, kblob))

    def _offer_zone(self, _EndpointContext ctx, Segment seg):
        """A bound segment that peers of this node cannot map (device pool
        memory; host segments with GEXMK_NBRHD_STAGE=all): open its landing
        zone and lander, offer the zone's memfd through the fd server."""
        if self.job.size == 1 or self.force in ("ofi", "pvm"):
            return None
        z = _LandingZone()
        try:
            z.open(seg, self.node_size, self.stage_slots, self.stage_chunk)
            self._gen += 1
            name = f"zone-{self._gen}"
            server = fdpass.process_server()
            server.offer(name, [z.fd], allowed_pids=set(self.job.pids))
        except BaseException:
            z.close()
            raise
        ctx.zone = z
        ctx.offered = name
        self._zones.append(z)
        return pickle.dumps(("zone", server.address, name, z.layout))

    @property
    def landed(self):
        """Requests (chunks of puts and gets, atomics) this process's landers served."""
        return sum((<_LandingZone>z).z.landed for z in self._zones)

    def _apply_zone(self, key, peer, desc):
        """A peer of this node published (or withdrew) a segment reached
        through its landing zone: map the zone (this process's ring)."""
        cdef _LandContext lc = self._peers.pop(key, None) if isinstance(
            self._peers.get(key), _LandContext) else None
        wanted = (peer.size != 0 and not peer.same_process and peer.same_node
                  and self.force not in ("ofi", "pvm") and desc is not None and desc[0] == "zone")
        if lc is not None and (not wanted or lc.key != (desc[1], desc[2])):
            lc.unmap()
            self._retired.append(lc)
            lc = None
        if not wanted:
            return None
        if lc is None:
            _pool_start()                   # its threads fill and drain the slots
            fds = fdpass.fetch(desc[1], desc[2], self.job.config.timeout)
            lc = _LandContext()
            try:
                lc.map(fds[0], tuple(desc[3]), self.node_index, self.job.config.timeout)
            finally:
                for fd in fds:
                    os.close(fd)
            lc.key = (desc[1], desc[2])
            for d in self._devsegs.values():        # copies from this process's GPU: DMA
                lc.pin_with((<_DeviceContext>d).kind)
                break
            lc.hold()
            self._idle_start()
        self._peers[key] = lc
        return lc

    def _apply_device(self, key, peer, desc):
        """A peer of this node published (or withdrew) a device segment: fetch
        its file descriptors and import it with a kind of this process for
        that device (made on first use); None where this process cannot."""
        cdef _DeviceContext d = self._peers.pop(key, None)
        wanted = (peer.size != 0 and not peer.same_process and peer.same_node
                  and self.force not in ("ofi", "pvm") and desc is not None
                  and desc[0] == "device")
        if d is not None and (not wanted or d.key != (desc[1], desc[2])):
            d.unmap()
            self._retired.append(d)
            d = None
        if not wanted:
            return None
        if d is None:
            d = self._import_device(peer, desc, self.no_peer_access)
            if d is None:
                return None
        self._peers[key] = d
        return d

    def _import_device(self, peer, desc, bint staged):
        """Import a peer's device export: mapped for this process's own GPU
        (direct copies, over NVLink between GPUs), or, ``staged`` (peer access
        off by GEXMK_CUDA_PEER_ACCESS=off, or the direct import refused), for
        the segment's own GPU, which this process then drives: copies between
        it and this process's device memory go through pinned host memory."""
        mk = self._kind_for(peer.kind, peer.device, staged)
        if mk is None:
            return None
        fds = fdpass.fetch(desc[1], desc[2], self.job.config.timeout)
        d = _DeviceContext()
        d.kind = mk
        _set_kind(&d.c.k, mk)
        try:
            d.imported = mk.impl.import_(fds, desc[3], peer.size)
        except Exception:
            if staged or mk.device == peer.device:
                raise
            return self._import_device(peer, desc, True)   # no access from this GPU: stage
        d.c.local_base = <char*><uintptr_t>d.imported.addr
        d.key = (desc[1], desc[2])
        d.staged = staged
        d.c.staged = staged
        return d

    def _kind_for(self, int cls, int device, bint exact=False):
        """The memory kind of this process that imports a peer's segment on
        ``device``: one of this process's bound device segments (the same
        device first; else its own device, so the mapping is given access for
        the device this process computes on and copies run from it, over
        NVLink between GPUs), else one made for ``device`` (None where this
        process has no such device)."""
        cdef _DeviceContext d
        other = None
        for d in self._devsegs.values():
            if d.kind.cls == cls and d.kind.device == device:
                return d.kind
            if d.kind.cls == cls and other is None and not exact:
                other = d.kind
        if other is not None:
            return other
        mk = self._kinds.get((cls, device))
        if mk is None:
            from gexmk import memory
            try:
                mk = memory.mk_create(cls, device)
            except Exception:       # noqa: BLE001 - no such device or driver here: unreachable
                return None
            self._kinds[(cls, device)] = mk
        return mk

    def reach(self, epctx, peer, ctx):
        cdef _PeerContext pc
        cdef _DeviceContext d
        if peer.same_process:
            if peer.kind == GX_MK_HOST:
                entry = self._hosts.get(peer.base)
                return Reach("self", SELF_SCORE, SELF_SCORE, <uintptr_t>&_SELF, 0, peer.base,
                             wake=entry[0]._wake_address if entry is not None else 0)
            d = self._devsegs.get(peer.base)
            if d is None or d.c.k.ops == NULL:
                return None
            if self.no_peer_access and (<_EndpointContext>epctx).c.k.ops != NULL \
                    and (<_EndpointContext>epctx).seg is not d.seg:
                return Reach("self-staged", SELF_SCORE, SELF_SCORE if d.c.k.atomic != NULL else 0,
                             <uintptr_t>&_SELF_STAGED, d.handle, 0, None, True)
            return Reach("self", SELF_SCORE, SELF_SCORE if d.c.k.atomic != NULL else 0,
                         <uintptr_t>&_SELF_DEV, d.handle, 0, (peer.base, peer.device))
        if ctx is None:
            return None
        if isinstance(ctx, _LandContext):
            return Reach("nbrhd-landed", NBRHD_SCORE,
                         NBRHD_SCORE if (<_LandContext>ctx).c.amo else 0,
                         <uintptr_t>&_NBRHD_LANDED, ctx.handle, 0, None, True)
        if isinstance(ctx, _DeviceContext):
            d = ctx
            if d.staged and (<_EndpointContext>epctx).c.k.ops != NULL:
                return Reach("nbrhd-staged", NBRHD_SCORE,
                             NBRHD_SCORE if d.c.k.atomic != NULL else 0,
                             <uintptr_t>&_NBRHD_STAGED, d.handle, 0, None, True)
            # host-staged (no peer access): mapped for the segment's own GPU, which this
            # process drives with copies; no kernel of the caller's may load or store there
            return Reach("nbrhd", NBRHD_SCORE, NBRHD_SCORE if d.c.k.atomic != NULL else 0,
                         <uintptr_t>&_NBRHD_DEV, d.handle, 0,
                         None if d.staged else (<uintptr_t>d.c.local_base, d.kind.device))
        pc = ctx
        if pc.c.local_base != NULL:
            m = self._maps.get(pc.map_key)
            return Reach("nbrhd", NBRHD_SCORE, NBRHD_SCORE, <uintptr_t>&_NBRHD, pc.handle,
                         <uintptr_t>pc.c.local_base, wake=m[3] if m is not None else 0)
        return Reach("pvm", PVM_SCORE, 1, <uintptr_t>&_PVM, pc.handle, 0)

    def peer_died(self, int jobrank):
        """A process of the job died: its ring in this process's landing zones
        is reclaimed (landed.pxi: never read again, its pages punched out)."""
        r = self._node_index_of(jobrank) if 0 <= jobrank < self.job.size else -1
        if r < 0:
            return
        for z in self._zones:
            (<_LandingZone>z).reclaim(r)

    @property
    def zone_rings(self):
        """Per landing zone this process serves now: its ring states and counts
        (_LandingZone.rings), with the memfd's descriptor and ``extent``, the
        first ring's (offset, bytes, data offset): ring r starts r rings on."""
        return [dict((<_LandingZone>z).rings, fd=(<_LandingZone>z).fd,
                     extent=(<_LandingZone>z).ring_extent(0))
                for z in self._zones if (<_LandingZone>z).thread is not None]

    def close(self):
        """Unmap every peer segment (teardown: no route uses them any more),
        stop the copy pool."""
        global _pool
        if self.closed:
            return
        self.closed = True
        if self._idle_thread is not None:
            gx_xchg_int(&self._idle_stop, 1)
            self._idle_thread.join(5)
            self._idle_thread = None
        if _pool != NULL:
            with nogil:
                gx_cpool_destroy(_pool)
            _pool = NULL
        for entry in list(self._hosts.values()):
            self._host_unbound(entry[0])
        for p in list(self._peers.values()) + self._retired:
            if isinstance(p, _DeviceContext):
                (<_DeviceContext>p).unmap()
            elif isinstance(p, _LandContext):
                (<_LandContext>p).unmap()
        for mk in self._kinds.values():
            mk.close()
        self._kinds.clear()
        for m in self._maps.values():
            munmap(<void*><uintptr_t>m[0], <size_t>m[1])
        self._maps.clear()
        self._peers.clear()

    def _map(self, _PeerContext pc, key, int pid, int fd, size_t size):
        m = self._maps.get(key)
        if m is None:
            addr, maplen, wake = _map_peer_fd(pid, fd, key[1], size)
            m = self._maps[key] = [addr, maplen, 0, wake]
        m[2] += 1
        pc.map_key = key
        pc.c.local_base = <char*><uintptr_t>m[0]

    def _drop_peer(self, key):
        """Give up what this process holds of a peer segment: a host mapping
        is unmapped; a device import or a landing zone is unmapped and kept
        (retired) until finalize, as routes may still point at it until they
        are chosen again."""
        old = self._peers.pop(key, None)
        if isinstance(old, _PeerContext):
            self._unmap(old)
        elif isinstance(old, _DeviceContext):
            (<_DeviceContext>old).unmap()
            self._retired.append(old)
        elif isinstance(old, _LandContext):
            (<_LandContext>old).unmap()
            self._retired.append(old)

    def _unmap(self, _PeerContext pc):
        pc.c.local_base = NULL
        key, pc.map_key = pc.map_key, None
        if key is None:
            return
        m = self._maps[key]
        m[2] -= 1
        if m[2] == 0:
            del self._maps[key]
            munmap(<void*><uintptr_t>m[0], <size_t>m[1])
