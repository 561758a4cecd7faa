cdef class OfiEndpoint:
    """One libfabric endpoint + CQ (+ the registration of a bound segment):
    the ofi context of one gexmk endpoint."""
    cdef ofi_ep e
    cdef readonly Domain domain
    cdef readonly bytes name
    cdef readonly bint closed
    cdef bint plain             # never staged (the library's synchronisation endpoint)
    cdef readonly object hmem_note  # why the bound segment is not registered natively (None: it
                                    # is, or was never tried: a host segment)
    cdef set _published_to          # job ranks given the current registration's key
    cdef list _retired              # [mr, dummy, bytes, job ranks still holding its key]
    cdef int _pubs_open             # publications of it some member may still be applying
    cdef object _unlink_due         # lingering: its region's name, unlinked once they settle

    @staticmethod
    cdef OfiEndpoint _make(Domain dom, bint single=False):
        """``single``: one libfabric endpoint even in a split domain -- the
        RMA one, without atomics (the library's sync endpoint, whose
        collectives write their counters by ordered stores: Domain.endpoint)."""
        cdef OfiEndpoint ep = OfiEndpoint.__new__(OfiEndpoint)
        cdef bint split = dom.d.split and not single
        cdef fi_cq_attr cq_attr
        cdef char buf[256]
        cdef size_t blen = sizeof(buf)
        memset(&ep.e, 0, sizeof(ep.e))
        ep.domain = dom
        ep._published_to = set()
        ep._retired = []
        ep.e.dom = &dom.d
        memset(&cq_attr, 0, sizeof(cq_attr))
        # signals riding on writes as remote CQ data need the data format (signal.pxi)
        cq_attr.format = FI_CQ_FORMAT_DATA if dom.d.sig_data else FI_CQ_FORMAT_CONTEXT
        cq_attr.wait_obj = FI_WAIT_FD         # the progress thread sleeps on its fd
        cq_attr.size = 0
        cdef fi_wait_obj wobj = FI_WAIT_NONE
        cdef char abuf[256]
        cdef size_t alen = sizeof(abuf)
        try:
            if split:
                check("fi_endpoint", fi_endpoint(dom.d.domain, dom.d.rma_info, &ep.e.ep, NULL))
                check("fi_endpoint (atomics)", fi_endpoint(dom.d.domain, dom.d.info, &ep.e.aep, NULL))
            elif dom.d.split:
                check("fi_endpoint", fi_endpoint(dom.d.domain, dom.d.rma_info, &ep.e.ep, NULL))
            else:
                check("fi_endpoint", fi_endpoint(dom.d.domain, dom.d.info, &ep.e.ep, NULL))
            ep.e.ep0 = ep.e.ep      # (what _release closes, should the rest fail)
            # A wait fd only for a progress thread that sleeps on it.  It is not
            # free: the provider signals it on every completion (two syscalls
            # per op on tcp;ofi_rxm, ~1.5 us of an 8 B put's 6-7 us), and rxm
            # then hands its internal connections a wait object too.  Spinning
            # or absent progress threads get a plain polled CQ.
            if dom.d.cq_wait and \
                    fi_cq_open(dom.d.domain, &cq_attr, &ep.e.cq, NULL) == 0 and \
                    fi_control(&ep.e.cq.fid, FI_GETWAIT, &ep.e.wait_fd) == 0:
                wobj = FI_WAIT_FD
            else:
                if ep.e.cq != NULL:
                    fi_close(&ep.e.cq.fid)
                    ep.e.cq = NULL
                # no wait fd wanted, or none to be had (shm): a polled CQ.
                # (FI_WAIT_UNSPEC would give shm a "yield" wait that spins a
                # core inside fi_cq_sread.)
                cq_attr.wait_obj = FI_WAIT_NONE
                check("fi_cq_open", fi_cq_open(dom.d.domain, &cq_attr, &ep.e.cq, NULL))
            # Sleep in fi_cq_sread only on a real wait object (fd, mutex/cond);
            # a "yield" wait (shm) spins a core, so that CQ is polled with naps.
            ep.e.can_wait = wobj == FI_WAIT_FD or wobj == FI_WAIT_MUTEX_COND \
                or wobj == FI_WAIT_POLLFD
            check("fi_ep_bind(cq)", fi_ep_bind(ep.e.ep, &ep.e.cq.fid, FI_TRANSMIT | FI_RECV))
            check("fi_ep_bind(av)", fi_ep_bind(ep.e.ep, &dom.d.av.fid, 0))
            check("fi_enable", fi_enable(ep.e.ep))
            check("fi_getname", fi_getname(&ep.e.ep.fid, buf, &blen))
            if dom.d.sig_msg:
                _sig_rx_open(&ep.e)         # put_signal's signal messages (signal.pxi)
            if split:
                # its own CQ, of the same kind (see _progress_quiet)
                cq_attr.wait_obj = FI_WAIT_FD if ep.e.can_wait else FI_WAIT_NONE
                cq_attr.format = FI_CQ_FORMAT_CONTEXT
                check("fi_cq_open (atomics)", fi_cq_open(dom.d.domain, &cq_attr, &ep.e.acq, NULL))
                if ep.e.can_wait:
                    check("fi_control(FI_GETWAIT)", fi_control(&ep.e.acq.fid, FI_GETWAIT,
                                                                &ep.e.await_fd))
                check("fi_ep_bind(cq)", fi_ep_bind(ep.e.aep, &ep.e.acq.fid, FI_TRANSMIT | FI_RECV))
                check("fi_ep_bind(av)", fi_ep_bind(ep.e.aep, &dom.d.av.fid, 0))
                check("fi_enable", fi_enable(ep.e.aep))
                check("fi_getname", fi_getname(&ep.e.aep.fid, abuf, &alen))
            else:
                ep.e.aep = ep.e.ep
        except BaseException:
            ep.close()
            raise
        if split:
            if alen != blen:
                ep.close()
                raise CommunicationError(f"fi_getname: the RMA and atomics endpoints have names of "
                               f"different lengths ({blen}, {alen})")
            ep.name = _SPLIT_TAG + buf[:blen] + abuf[:alen]
        elif dom.d.split:
            ep.name = _SINGLE_TAG + buf[:blen]      # no atomics endpoint to reach
        else:
            ep.name = buf[:blen]
        return ep

    @property
    def handle(self):
        """Address of the C state, for the core's team structures."""
        return <uintptr_t>&self.e

    @property
    def ops(self):
        """Address of the transport's gx_tr_ops (the core's sync of this endpoint)."""
        return <uintptr_t>&_OPS

    def bind(self, Segment seg not None):
        """Register a bound host segment; the bytes peers need to reach it:
        this endpoint's name, the registration key and the base address.  A
        device segment the provider registers (FI_HMEM, hmem.pxi) is reached
        natively, with a landing zone beside it for its atomics; one it does
        not (and, with GEXMK_OFI_STAGE=all, a host one) gets a landing zone
        of pinned host memory instead, registered and served by the lander
        thread (staged.pxi); the zone's geometry travels along."""
        cdef ofi_zone* z
        self.unbind()
        self.e.bind_gen += 1
        # whether this process answers peers' operations while it computes: a
        # peer sets up its connection to us at publication only then (connect.pxi)
        answers = not self.domain.d.manual or self.domain.progress_running
        # bit 1: this endpoint takes put_signal's signal messages, bit 2: and
        # signals as remote CQ data (signal.pxi)
        answers = int(bool(answers)) | (2 if self.e.rx != NULL else 0) \
            | (4 if self.e.rx != NULL and self.e.dom.sig_data else 0) \
            | ((self.e.bind_gen & 0xff) << 8)
        host = seg.kind.cls == GX_MK_HOST
        self.hmem_note = None
        if not self.plain and (not host or self.e.dom.hmem_want == HMEM_SYSTEM):
            got = _hmem_register(self, seg)
            if type(got) is tuple:
                key, base = got
                try:
                    _hmem_zone(self, seg)
                except BaseException:
                    self._close_mr()
                    raise
                self.e.hmem = 1
                self.domain.start_lander()
                # the fifth field: no staged geometry (RMA lands natively)
                return pickle.dumps((self.name, key, base, answers, None, _hmem_zone_blob(self)))
            self.hmem_note = got        # why not: the path query says ofi-staged
        if host and (self.plain or not self.e.dom.stg_all):
            key, base = self.register(<uintptr_t>seg.addr, seg.size)
            # signal messages applied here wake the segment's futex sleepers
            self.e.wake = <gx_wake*><uintptr_t>seg._wake_address
            vis = None if self.plain else _vis_zone_open(self, seg)    # vis.pxi
            if vis is None:
                return pickle.dumps((self.name, key, base, answers))
            # the seventh field: the VIS landing zone ("ofi-landed")
            return pickle.dumps((self.name, key, base, answers, None, None, vis))
        _zone_open(&self.e, seg, self.e.dom.stg_nrings)
        z = self.e.zone
        try:
            key, base = self.register(<uintptr_t>z.mem, z.bytes)
            _zone_serve(&self.e)
        except BaseException:
            with nogil:
                _zone_close(&self.e)
            raise
        self.domain.start_lander()
        return pickle.dumps((self.name, key, base, answers,
                             (z.slots, z.chunk, z.ring_bytes, bool(z.amo), z.bell_off,
                              z.bell2_off, z.closed_off)))

    @property
    def staged_local(self):
        """True when this endpoint's bound segment is reached through a landing zone."""
        return self.e.zone != NULL and not self.e.hmem

    @property
    def rma_only(self):
        """True for a split domain's single endpoint without atomics (the
        library's sync endpoint where the network orders writes)."""
        return bool(self.domain.d.split) and self.e.ep != NULL and self.e.aep == self.e.ep

    @property
    def zone_extent(self):
        """``(address, bytes, ring_bytes)`` of this endpoint's landing zone
        (its rings, one per job rank, then the bounce area), or None: for
        tests and diagnostics of what the zone holds resident."""
        if self.e.zone == NULL:
            return None
        return (<uintptr_t>self.e.zone.mem, self.e.zone.bytes, self.e.zone.ring_bytes)

    @property
    def zone_rings(self):
        """``{"zone": {...}, "vis": {...}}`` for this endpoint's landing zone
        and its host segment's VIS zone (None where there is none), each
        ``backed`` (rings backed now), ``backs`` (rings backed so far, each on
        its initiator's first request or its first after a release),
        ``released`` (rings their initiators gave back, GEXMK_OFI_RING_IDLE:
        their pages returned to the OS), ``refused`` (first requests turned
        away while ``cap`` rings were backed; the initiator asks again) and
        ``cap`` (GEXMK_OFI_ZONE_RINGS; 0: none)."""
        return {"zone": _zone_counts(self.e.zone), "vis": _zone_counts(self.e.vzone)}

    @property
    def lander_work(self):
        """``{"zone": (passes, rings read), "vis": (...)}`` for this endpoint's
        landing zone and its host segment's VIS zone (None where there is
        none): the lander's passes over the zone so far and the rings it read
        in them (each backed ring every pass, a rung one once) -- what a pass
        costs, for tests and diagnostics."""
        cdef ofi_zone* z = self.e.zone
        cdef ofi_zone* v = self.e.vzone
        return {"zone": (z.passes, z.rings_read) if z != NULL else None,
                "vis": (v.passes, v.rings_read) if v != NULL else None}

    @property
    def hmem(self):
        """True when the bound segment is registered natively (FI_HMEM): peers'
        puts and gets land in it directly (path ``ofi-hmem``)."""
        return bool(self.e.hmem)

    def register(self, uintptr_t addr, size_t size):
        """Register [addr, addr+size) for remote access; returns (key, base):
        what peers need to address it (base is addr with FI_MR_VIRT_ADDR, else 0)."""
        cdef fid_mr* mr = NULL
        cdef uint64_t key = 0
        cdef uint64_t access = FI_REMOTE_READ | FI_REMOTE_WRITE | FI_READ | FI_WRITE
        if self.e.dom.info.caps & FI_ATOMIC:
            access |= FI_REMOTE_READ | FI_REMOTE_WRITE
        self._close_mr()
        if not (self.e.dom.mr_mode & FI_MR_PROV_KEY):
            key = self.e.dom.next_key
            self.e.dom.next_key += 1
        with nogil:
            check("fi_mr_reg", fi_mr_reg(self.e.dom.domain, <void*>addr, size, access, 0, key, 0,
                                         &mr, NULL))
        try:
            if self.e.dom.mr_mode & FI_MR_ENDPOINT:
                check("fi_mr_bind", fi_mr_bind(mr, &self.e.ep.fid, 0))
                check("fi_mr_enable", fi_mr_enable(mr))
        except BaseException:
            fi_close(&mr.fid)
            raise
        self.e.seg_mr = mr
        self.e.seg_desc = fi_mr_desc(mr)
        self.e.seg_lo = addr
        self.e.seg_hi = addr + size
        base = addr if (self.e.dom.mr_mode & FI_MR_VIRT_ADDR) else 0
        if self.e.dom.mr_mode & FI_MR_RAW:
            return self._raw_key(mr, base), base
        return fi_mr_key(mr), base

    cdef bytes _raw_key(self, fid_mr* mr, uint64_t base):
        """FI_MR_RAW: the key is an opaque byte string peers map with fi_mr_map_raw."""
        cdef uint8_t buf[256]
        cdef size_t size = sizeof(buf)
        cdef uint64_t b = base
        check("fi_mr_raw_attr", fi_mr_raw_attr(mr, &b, buf, &size, 0))
        return bytes(buf[:size])

    def unbind(self):
        self.e.wake = NULL
        self._retire_mr()
        with nogil:
            _hmem_zone_close(&self.e)       # the zone of either path

    def _retire_mr(self):
        """Unregister the bound segment (or zone), but keep its key valid for
        peers that were given it and have not heard of the unbinding yet (they
        learn at the endpoint's next publication to them).  Over tcp;ofi_rxm an
        access with a key the target does not know is a protocol error that
        takes the pair's whole connection down (its other operations in flight
        fail, rxm may then crash reading its CQ: issue 19, fuzz seeds 7 and 10).
        With offset addressing (no FI_MR_VIRT_ADDR) and keys of our choosing,
        the key is registered again over a private anonymous mapping of the
        same size, untouched (no memory) unless a stale access comes: a stale
        put lands there, a stale get reads zeros -- never the owner's memory --
        and a landing zone's done words say "closed", so a stale staged
        operation raises SegmentError at its initiator.  Released once every
        peer that held the key has applied a later publication of this
        endpoint (published(): the team's next collective), or at close."""
        cdef ofi_zone* z = self.e.zone
        cdef ofi_zone* vz = self.e.vzone
        cdef fid_mr* vmr = self.e.vzone_mr
        held = self._published_to
        self._published_to = set()
        if vz != NULL:
            # a host segment's VIS zone (vis.pxi): retired like the segment,
            # its done words saying "closed" to a stale packed VIS
            self.e.vzone = NULL
            self.e.vzone_mr = NULL
            self._retire(vmr, vz.bytes, vz, held, False)
            with nogil:
                _zone_unserve(self.e.dom, vz)
        if self.e.seg_mr != NULL and not (z != NULL and z.mem != NULL
                                          and <uintptr_t>z.mem == self.e.seg_lo):
            z = NULL
        self._retire(self.e.seg_mr, self.e.seg_hi - self.e.seg_lo, z, held, True)

    cdef _retire(self, fid_mr* mr, size_t size, ofi_zone* z, set held, bint seg):
        """_retire_mr for one registration (seg: the bound segment's, else
        one closed here); z: the zone it covers, or NULL."""
        cdef fid_mr* nmr = NULL
        cdef uint64_t key
        cdef void* dummy
        cdef uint64_t access = FI_REMOTE_READ | FI_REMOTE_WRITE | FI_READ | FI_WRITE
        cdef int rc, r, s
        cdef uint64_t* done
        if mr == NULL or not held or size == 0 or \
                self.e.dom.mr_mode & (FI_MR_VIRT_ADDR | FI_MR_PROV_KEY | FI_MR_RAW | FI_MR_ENDPOINT):
            if seg:
                self._close_mr()
            elif mr != NULL:
                fi_close(&mr.fid)
            return
        key = fi_mr_key(mr)
        dummy = mmap(NULL, size, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
        if dummy == MAP_FAILED:
            if seg:
                self._close_mr()
            else:
                fi_close(&mr.fid)
            return
        if z != NULL:
            # The lander stops serving the zone first, so no ring is backed
            # after the scan below.  Only rings in use get "closed" done words
            # (a page each): an initiator whose ring was never answered reads
            # the closed word instead (_stg_wait_slot), so a retired zone costs
            # a page per initiator that used it, not per job rank.
            while gx_xchg_int(&self.e.dom.zlock, 1) != 0:
                sched_yield()
            z.closing = 1
            gx_xchg_int(&self.e.dom.zlock, 0)
            for r in range(z.nrings):
                if z.ring_state[r] == RING_NEW:
                    continue
                done = <uint64_t*>(<char*>dummy + <size_t>r * z.ring_bytes + _stg_words_off(z.slots))
                for s in range(z.slots):
                    done[s] = STG_CLOSED_DONE
            (<uint64_t*>(<char*>dummy + z.closed_off))[0] = 1
        # Close, then register the key again at once, with the CQ gate
        # closed (progress.pxi): a stale access that arrives between the two
        # waits in its queue, served once the dummy holds the key (served in
        # the gap, it found no key, and shm dropped it unanswered: fuzz seed
        # 9122).
        with nogil:
            _gate_close()
            if seg:
                _close_seg_mr(&self.e)
            else:
                fi_close(&mr.fid)
            _gate_gap_hold()
            rc = fi_mr_reg(self.e.dom.domain, dummy, size, access, 0, key, 0, &nmr, NULL)
            _gate_open()
        if rc != 0:
            munmap(dummy, size)
            return
        self._retired.append([<uintptr_t>nmr, <uintptr_t>dummy, size, set(held)])

    def published(self, jobranks):
        """This endpoint was just published to the processes of ``jobranks``:
        they hold the current key now (an unbinding from here on retires it
        for them).  Returns the call that drops them from the registrations
        retired before this publication; the core makes it once every member
        has applied it (the team's next collective), when none of them uses
        a retired key any more."""
        ranks = set(jobranks)
        if self.e.seg_mr != NULL or self.e.vzone_mr != NULL:
            self._published_to |= ranks
        # Until then a member may still be inserting this endpoint's name (over
        # shm: opening its region): a closure meanwhile keeps the region (_linger)
        self._pubs_open += 1
        before = list(self._retired)

        def settle():
            self._pubs_open -= 1
            if self._pubs_open == 0 and self._unlink_due is not None:
                self._unlink_region()
            if not before:
                return
            keep = []
            for rt in self._retired:
                if any(rt is b for b in before):
                    rt[3] -= ranks
                if rt[3]:
                    keep.append(rt)
                else:
                    self._free_retired(rt)
            self._retired = keep
        return settle

    def _free_retired(self, rt):
        fi_close(&(<fid_mr*><uintptr_t>rt[0]).fid)
        munmap(<void*><uintptr_t>rt[1], <size_t>rt[2])

    @property
    def retired(self):
        """How many registrations of unbound segments are kept for peers that
        have not heard of the unbinding (see _retire_mr)."""
        return len(self._retired)

    def _close_mr(self):
        _close_seg_mr(&self.e)

    cdef void _unregister(self) noexcept:
        """Take this endpoint out of the domain's list, then wait until no
        thread still walks the list (so none can poll its CQ once closed).
        The progress thread holds the list for as long as it sleeps in its
        CQs' fds and lets go of it only between two sleeps: d.quiesce keeps
        it out meanwhile, or this wait could miss every gap."""
        cdef ofi_dom* d = self.e.dom
        cdef long i, n = d.neps
        cdef timespec ts
        gx_add_long(&d.quiesce, 1)
        for i in range(n):
            if d.eps[i] == &self.e:
                d.eps[i] = d.eps[n - 1]
                gx_mem_fence()
                gx_add_long(&d.neps, -1)
                break
        gx_mem_fence()
        with nogil:
            while gx_load_long(&d.readers) > 0:
                if self.e.can_wait and self.e.cq != NULL:
                    fi_cq_signal(self.e.cq)      # cut a progress thread's sleep short
                    if self.e.acq != NULL:
                        fi_cq_signal(self.e.acq)
                ts.tv_sec = 0
                ts.tv_nsec = 50000
                nanosleep(&ts, NULL)
        gx_add_long(&d.quiesce, -1)

    @property
    def can_wait(self):
        """True when the progress thread may sleep in this CQ's wait object."""
        return bool(self.e.can_wait)

    def progress(self):
        """Poll the CQ once (completions, manual progress); returns how many completed."""
        if self.closed:
            return 0
        return _progress(&self.e)

    def nbi_pending(self):
        """Implicit ops not known to be complete, by category: (get, put, rmw).
        Puts count those in flight plus one per target still owing a flush."""
        cdef int i, owed = 0
        for i in range(MAX_TOUCHED):
            if self.e.touched[i] != NULL:
                owed += 1
        return (self.e.nbi[0], self.e.nbi[1] + owed, self.e.nbi[2])

    def close(self):
        """Close (idempotent).  Every op in flight on the endpoint (orphans of
        collected events, ops of failed events included) is completed first,
        for at most CLOSE_DRAIN_S (and GEXMK_TIMEOUT) seconds (those that
        went to a peer that died are not waited for, see _drain); should
        others not complete, the libfabric endpoint and its CQs are left open
        (leaked, with a warning) rather than closed under them.  Waits on
        ops that did not complete raise StateError.

        Over shm the libfabric endpoint lingers (see _linger) until the
        domain closes: closed for this process, still served for peers."""
        if self.closed:
            return
        self.closed = True
        cdef long left = 0
        cdef double secs = min(<double>CLOSE_DRAIN_S, self.e.dom.timeout)
        if self.e.cq != NULL:
            with nogil:
                left = _drain(&self.e, secs)
        gx_xchg_int(&self.e.closed, 1)
        if not left and self.domain.linger(self):
            self.unbind()
            self._linger()
            return
        self._unregister()
        self.unbind()
        if left and not self.e.dom.deaths:
            import warnings
            warnings.warn(f"ofi: an endpoint was closed with {left} operation(s) still in flight "
                          f"after {secs:g} s; its libfabric endpoint is left open (leaked)",
                          RuntimeWarning, stacklevel=2)
            return
        self._release()

    cdef int fresh_initiator(self, int jobrank, long deaths, bint again) except -1:
        """Over shm, at job rank ``jobrank``'s death (``deaths`` counted with
        it): issue from now on through a new libfabric endpoint when this one
        may hold an op towards the dead process (in flight now, or among its
        last targets; ``again``: among the targets since the last call).  shm
        completes an endpoint's answered ops (reads, delivery-complete writes,
        fetching atomics) in issue order, and the dead process answers
        nothing: every later op of the endpoint, to any peer, would wait
        behind that one (fuzz seeds 104-139 on ofi-shm: survivors' ops to
        each other stalled for good).  The new endpoint shares the CQ and the
        AV; it is never published -- targets answer it by the name its first
        operation carries -- so ep0 stays the endpoint peers reach and
        signal receives stay posted there.  Ops already issued on the old one
        are not moved: one held up is given up DEATH_GRACE_MS after the death
        (_poisoned), and a blocking put or get so given up is issued again on
        the new one (_wait_op's ``reissue``).  At most FRESH_MAX per endpoint;
        1 when one opened.
        (cdef: only the transport's death notices call it.)"""
        cdef ofi_ep* e = &self.e
        cdef ofi_dom* d = e.dom
        cdef fid_ep* fresh = NULL
        cdef bint held = e.live > 0 and not again
        cdef int i
        if self.closed or e.ep == NULL or e.cq == NULL or not d.shared_q or \
                e.aep != e.ep or e.nfresh >= FRESH_MAX or (d.mr_mode & FI_MR_ENDPOINT):
            return 0
        for i in range(8):
            if e.recent[i] != NULL and e.recent[i].g != NULL and e.recent[i].g.jobrank == jobrank:
                held = True
                e.recent[i] = NULL      # ``again`` looks for ops to it issued from now on
        if not held:
            return 0
        cdef int rc
        cdef const char* call = "fi_endpoint"
        # Reading the CQ progresses every endpoint bound to it, and shm
        # progresses one bound but not yet enabled by dereferencing the region
        # fi_enable creates (seen: SIGSEGV in the progress thread): no thread
        # reads a CQ from the bind to the enable (the CQ gate, progress.pxi).
        with nogil:
            rc = fi_endpoint(d.domain, d.rma_info if d.split else d.info, &fresh, NULL)
            if rc == 0:
                call = "fi_ep_bind(av)"
                rc = fi_ep_bind(fresh, &d.av.fid, 0)
            if rc == 0:
                _gate_close()
                call = "fi_ep_bind(cq)"
                rc = fi_ep_bind(fresh, &e.cq.fid, FI_TRANSMIT | FI_RECV)
                if rc == 0:
                    call = "fi_enable"
                    rc = fi_enable(fresh)
                _gate_open()
        if rc != 0:
            if fresh != NULL:
                fi_close(&fresh.fid)
            import warnings
            warnings.warn(f"ofi: no fresh endpoint after job rank {jobrank}'s death "
                          f"({call.decode()}: {fi_strerror(-rc).decode()}); operations held up "
                          f"behind one towards it are given up", RuntimeWarning, stacklevel=2)
            return 0
        e.fresh[e.nfresh] = fresh
        e.nfresh += 1
        d.n_fresh += 1
        gx_mem_fence()
        e.fresh_deaths = deaths
        e.aep = fresh
        e.ep = fresh
        return 1

    def _linger(self):
        """Over shm: the endpoint is closed for this process (nothing is
        issued on it, waits on it raise StateError), but its libfabric
        endpoint stays open and progressed, its registrations retired over
        dummies (_retire_mr), until the domain closes (Domain.linger keeps
        at most LINGER_EPS).  shm completes a peer endpoint's operations
        that need an answer in the order they were issued, and an endpoint
        that closed answers nothing: a peer's stale operation that raced
        with this closure (no barrier between, so the peer's look before
        issuing, rma.pxi _check_open, found it open) would otherwise hold up
        every later operation of that peer endpoint, to anyone, until
        GEXMK_TIMEOUT (fuzz seed 619: a put_nbi_val to an endpoint destroyed
        meanwhile, then a put to a live peer hung).  Its region leaves
        /dev/shm, so that peers see it closed (_check_open, _gone) and none
        connects to it anew; those already connected keep their mapping of
        it, and what they still send is served.  It leaves once every member
        applied this endpoint's publications (published()): a member still
        applying one inserts the name, and libfabric 1.17's shm, finding no
        region behind a name, leaves its peer slot free while the name's
        address still maps to it -- the next name inserted takes the slot, and
        operations to this endpoint went to that one, another rank's, whose
        key for its segment was the same (fuzz seed 20231: stale writes
        landed in a third rank's segment)."""
        name = self.name.split(b"\0", 1)[0].decode(errors="replace")
        for prefix in ("fi_shm://", "fi_ns://"):
            if name.startswith(prefix):
                name = name[len(prefix):]
        if name and "/" not in name:
            self._unlink_due = name
            if self._pubs_open == 0:
                self._unlink_region()

    def _unlink_region(self):
        name, self._unlink_due = self._unlink_due, None
        try:
            os.unlink("/dev/shm/" + name)
        except OSError:
            pass

    def _release(self):
        """Close the libfabric endpoint(s), CQs and retired registrations
        (after close(): unregistered from the domain and unbound)."""
        cdef int i
        if self.e.aep != NULL and self.e.aep != self.e.ep:
            fi_close(&self.e.aep.fid)
        self.e.aep = NULL
        if self.e.acq != NULL:
            fi_close(&self.e.acq.fid)
            self.e.acq = NULL
        for i in range(self.e.nfresh):
            fi_close(&self.e.fresh[i].fid)
            self.e.fresh[i] = NULL
        self.e.nfresh = 0
        self.e.ep = NULL
        if self.e.ep0 != NULL:
            fi_close(&self.e.ep0.fid)
            self.e.ep0 = NULL
        if self.e.cq != NULL:
            fi_close(&self.e.cq.fid)
            self.e.cq = NULL
        _sig_rx_free(&self.e)
        for rt in self._retired:
            self._free_retired(rt)
        self._retired = []


cdef void _close_seg_mr(ofi_ep* e) noexcept nogil:
    """Unregister e's bound segment (or zone)."""
    if e.seg_mr != NULL:
        fi_close(&e.seg_mr.fid)
        e.seg_mr = NULL
        e.seg_desc = NULL
        e.seg_lo = e.seg_hi = 0
