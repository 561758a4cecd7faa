# ---- objects ---------------------------------------------------------------

cdef uint64_t _WANT_MR_MODE = (FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY
                               | FI_MR_ENDPOINT | FI_MR_RAW)


# GEXMK_OFI_ZONE_RINGS and GEXMK_OFI_RING_IDLE (staged.pxi): rings a landing
# zone backs at once (1 GiB resident per zone at most with the default 4 MiB
# rings), and seconds a ring sits unused before its initiator releases it
ZONE_RINGS_DEFAULT = 256
RING_IDLE_DEFAULT = 3.0


_PREFERENCE = ["cxi", "efa", "verbs;ofi_rxm", "psm3", "opx", "tcp;ofi_rxm", "net;ofi_rxm",
               "sockets", "shm"]


cdef class Domain:
    """Process-wide libfabric state: fabric, domain and address vector.

    ``provider``: a libfabric provider name (``tcp;ofi_rxm``, ``shm``,
    ``verbs;ofi_rxm``, ``cxi``, ``efa``, ``sockets``) or None for the first
    that offers RDM + RMA (libfabric's own FI_PROVIDER applies too).
    ``interface``: a domain name (e.g. ``eth0``); loopback domains are skipped
    when ``skip_loopback`` (jobs spanning nodes)."""
    cdef ofi_dom d
    cdef readonly str provider
    cdef readonly str domain_name
    cdef readonly bint atomics
    cdef dict _addrs
    cdef dict _raw_keys
    cdef list _eps
    cdef list _lingering                  # closed endpoints still served for peers (shm)
    cdef object _thread
    cdef bint _spin
    cdef volatile int _stop_flag          # read by the progress thread without the GIL
    cdef object _lander                   # the thread serving landing zones (staged.pxi)
    cdef volatile int _lstop
    cdef bint closed
    cdef object __weakref__

    def __cinit__(self):
        memset(&self.d, 0, sizeof(self.d))
        memset(self.d.valid, -1, sizeof(self.d.valid))

    def __init__(self, provider=None, interface=None, bint skip_loopback=False, want_atomics=True,
                 config=None):
        cdef fi_info* hints = NULL
        cdef fi_info* info = NULL
        cdef fi_info* p
        cdef fi_info* chosen
        cdef fi_info* hinfo = NULL
        cdef int rc
        self._addrs = {}
        self._raw_keys = {}
        self._eps = []
        self._lingering = []
        # the settings first: a bad value raises before anything is allocated
        if config is None:
            from gexmk import config as _config
            config = _config.load()
        self.d.timeout = config.timeout
        self.d.stg_all = config.ofi_stage == "all"
        self.d.hmem_want = {"off": HMEM_OFF, "auto": HMEM_AUTO, "system": HMEM_SYSTEM,
                            "native": HMEM_NATIVE}[config.ofi_hmem]
        self.d.stg_slots = config.ofi_stage_slots
        self.d.stg_chunk = config.ofi_stage_chunk
        self.d.stg_nrings = 1
        # landing zones back a ring per initiator on its first request, at most
        # this many per zone (0: no cap); host segments' VIS zones (vis.pxi):
        # fragments up to GEXMK_OFI_VIS_LAND bytes packed through them (0: none)
        self.d.zone_rings = env_int("GEXMK_OFI_ZONE_RINGS", ZONE_RINGS_DEFAULT, 0, 1 << 20)
        # an initiator gives its ring in a peer's zone back after this long
        # unused (staged.pxi _ring_idle_check); 0: never
        self.d.ring_idle = env_seconds("GEXMK_OFI_RING_IDLE",
                                       env_seconds("GEXMK_RING_IDLE", RING_IDLE_DEFAULT))
        self.d.vis_land = env_int("GEXMK_OFI_VIS_LAND", VIS_LAND_DEFAULT, 0, 1 << 30)
        self.d.vis_zone = self.d.vis_land > 0
        split_wanted = config.ofi_split
        ordered_flush = config.ofi_ordered_flush
        ordered_signal = config.ofi_ordered_signal
        hints = fi_allocinfo()
        if hints == NULL:
            raise MemoryError()
        self.d.next_key = 1
        try:
            hints.caps = FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE
            if want_atomics:
                hints.caps |= FI_ATOMIC
            hints.mode = FI_CONTEXT | FI_CONTEXT2
            hints.ep_attr.type = FI_EP_RDM
            hints.domain_attr.mr_mode = _WANT_MR_MODE
            hints.domain_attr.threading = FI_THREAD_SAFE
            hints.addr_format = FI_FORMAT_UNSPEC
            if provider:
                hints.fabric_attr.prov_name = _strdup(provider.encode())
            # Choose among providers without asking for ordering (asking filters
            # out providers that lack it); without FI_ATOMIC if none offers it
            # (atomics then use the CAS fallback or report that they cannot).
            rc = -FI_ENODATA
            for atomics in ([True, False] if want_atomics else [False]):
                if atomics:
                    hints.caps |= FI_ATOMIC
                else:
                    hints.caps &= ~FI_ATOMIC
                with nogil:
                    rc = fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info)
                if rc != -FI_ENODATA:
                    break
            if rc == -FI_ENODATA:
                raise UnsupportedError(f"no libfabric provider offers RDM endpoints with RMA"
                                       f"{' for ' + repr(provider) if provider else ''}")
            check("fi_getinfo", rc)
            # Without a named provider (and no FI_PROVIDER), prefer the fabrics
            # gexmk is written for over libfabric's list order (which can put
            # udp;ofi_rxd first).
            chosen = NULL
            best = 1 << 30
            p = info
            while p != NULL:
                name = p.domain_attr.name.decode() if p.domain_attr.name != NULL else ""
                if (interface is not None and name != interface) or \
                        (skip_loopback and interface is None and name == "lo"):
                    p = p.next
                    continue
                prov = p.fabric_attr.prov_name.decode()
                if skip_loopback and not provider and prov == "shm":
                    p = p.next          # a job spanning nodes: shm reaches none of them
                    continue
                rank = _PREFERENCE.index(prov) if prov in _PREFERENCE else len(_PREFERENCE)
                if provider or os.environ.get("FI_PROVIDER"):
                    rank = 0           # the user chose: libfabric's order stands
                if rank < best:
                    best = rank
                    chosen = p
                p = p.next
            p = chosen
            if p == NULL:
                raise UnsupportedError(f"no libfabric domain matches interface={interface!r} "
                                       f"(provider {provider!r})")
            # The chosen provider with FI_HMEM where it offers it (hmem.pxi):
            # chosen first without, so that asking never costs a provider.
            if self.d.hmem_want != HMEM_OFF:
                hinfo = _hmem_info(hints, p)
                if hinfo != NULL:
                    p = hinfo
                    self.d.hmem = 1
            self.d.info = _with_ordering(p)
            if not _raw_ordered(self.d.info) and (self.d.info.caps & FI_ATOMIC) \
                    and not (self.d.info.domain_attr.mr_mode & FI_MR_ENDPOINT) \
                    and split_wanted:
                # Ordering lost to FI_ATOMIC (tcp;ofi_rxm: atomics are emulated by
                # messages that pass RMA): RMA on an endpoint without FI_ATOMIC
                # if that one is RAW-ordered, atomics on a second endpoint with
                # a CQ of its own (see _progress_quiet).  Measured on
                # tcp;ofi_rxm: implicit-put issue 15-25% cheaper; blocking
                # put/get and atomic latency unchanged.
                self.d.rma_info = _ordered_without_atomics(p)
                self.d.split = self.d.rma_info != NULL
        finally:
            if hinfo != NULL:
                fi_freeinfo(hinfo)
            if info != NULL:
                fi_freeinfo(info)
            if hints != NULL:
                fi_freeinfo(hints)
        self.provider = self.d.info.fabric_attr.prov_name.decode()
        if self.provider == "shm":
            self.d.shared_q = 1
            _unlink_stale_shm_regions()
        # how an operation whose queue stays full learns that its target
        # endpoint closed (rma.pxi _gone): tcp refuses a connection to its
        # name, shm's region leaves /dev/shm
        if self.provider == "shm":
            self.d.probe = PROBE_SHM
        elif self.provider.split(";")[0] in ("tcp", "net") and \
                self.d.info.addr_format in (FI_SOCKADDR, FI_SOCKADDR_IN, FI_SOCKADDR_IN6):
            self.d.probe = PROBE_TCP
        self.domain_name = self.d.info.domain_attr.name.decode()
        self.atomics = bool(self.d.info.caps & FI_ATOMIC)
        self.d.mr_mode = self.d.info.domain_attr.mr_mode
        self.d.inject_size = self.d.info.tx_attr.inject_size
        # tcp under ofi_rxm reports a failed injected RMA write without a
        # context, which rxm dereferences (rma.pxi _inject_write)
        self.d.inject_ctx = self.provider in ("tcp;ofi_rxm", "net;ofi_rxm")
        # A VIS zone reserves job size x 4 MiB of address space per host
        # segment and registers it whole: free where registration pins
        # nothing (sockets, shared memory), a disaster where it pins it all
        # (verbs and its kin): there only when GEXMK_OFI_VIS_LAND is set.
        if not os.environ.get("GEXMK_OFI_VIS_LAND", "").strip() and not any(
                p in self.provider for p in ("tcp", "net", "shm", "sockets", "udp")):
            self.d.vis_zone = 0
        # A released ring's pages go back to the OS only where registration
        # pins nothing: a NIC that pinned them would go on writing the old
        # pages while the process reads new zero ones.
        self.d.zone_madvise = any(p in self.provider for p in ("tcp", "net", "shm", "sockets",
                                                                "udp"))
        # Puts landed only over sockets (tcp, net): over shm a direct put_vector
        # of 1024 x 4 KiB took 1.3-2.0 ms, landed 3.0-5.2 ms; gets landed
        # everywhere (shm direct: 30 ms, landed: 2.3-5.0 ms; bench/README.md)
        self.d.vis_land_put = bool(os.environ.get("GEXMK_OFI_VIS_LAND", "").strip()) or any(
            p in self.provider for p in ("tcp", "net"))
        self.d.manual = self.d.info.domain_attr.data_progress == FI_PROGRESS_MANUAL
        cdef fi_info* rma = self.d.rma_info if self.d.split else self.d.info
        _vis_limits(&self.d, rma)           # vis.pxi
        self.d.ordered = _raw_ordered(rma) and ordered_flush
        self.d.max_order_raw = rma.ep_attr.max_order_raw_size
        self.d.waw = (rma.tx_attr.msg_order & (FI_ORDER_WAW | FI_ORDER_RMA_WAW)) != 0 \
            and rma.ep_attr.max_order_waw_size >= 8
        self.d.max_order_waw = rma.ep_attr.max_order_waw_size if self.d.waw else 0
        # put_signal's data and signal go back to back only where one endpoint
        # carries both and orders an RMA write before a later atomic write:
        # FI_ORDER_WAW proper (FI_ORDER_RMA_WAW + FI_ORDER_ATOMIC_WAW order each
        # class only among itself).  shm grants it; tcp;ofi_rxm with FI_ATOMIC
        # does not (and split endpoints are two connections).  FI_FENCE would
        # be the next resort, but none of tcp, rxm and shm implements it in
        # libfabric 1.17 (the flag is ignored, not refused), so elsewhere the
        # data's delivery is waited for before the signal is issued.
        self.d.sig_ordered = ordered_signal and not self.d.split \
            and (self.d.info.caps & FI_ATOMIC) != 0 \
            and (self.d.info.tx_attr.msg_order & FI_ORDER_WAW) != 0 \
            and self.d.info.ep_attr.max_order_waw_size >= 8
        self.d.sig_order_max = self.d.info.ep_attr.max_order_waw_size if self.d.sig_ordered else 0
        # Split endpoints: the signal as a message after the data on the RMA
        # endpoint, where that one orders a send after a write (and a read
        # after a send, for the flush that completes it) -- ofi.src/signal.pxi.
        # Receives are posted without descriptors: not for FI_MR_LOCAL providers.
        if ordered_signal and self.d.split and (rma.caps & FI_MSG) \
                and (rma.tx_attr.msg_order & FI_ORDER_SAW) \
                and (rma.tx_attr.msg_order & FI_ORDER_RAS) \
                and rma.ep_attr.max_order_waw_size >= 8 \
                and not (rma.domain_attr.mr_mode & FI_MR_LOCAL):
            self.d.sig_msg = 1
            self.d.sig_order_max = rma.ep_attr.max_order_waw_size
            # ... and a small signal as the data write's remote CQ data: one
            # send, not two (signal.pxi, SIG_DATA_*)
            self.d.sig_data = config.ofi_signal_data and rma.domain_attr.cq_data_size >= 8
        cdef fi_av_attr av_attr
        memset(&av_attr, 0, sizeof(av_attr))
        av_attr.type = FI_AV_TABLE
        try:
            check("fi_fabric", fi_fabric(self.d.info.fabric_attr, &self.d.fabric, NULL))
            check("fi_domain", fi_domain(self.d.fabric, self.d.info, &self.d.domain, NULL))
            check("fi_av_open", fi_av_open(self.d.domain, &av_attr, &self.d.av, NULL))
        except BaseException:
            self.close()
            raise

    @property
    def split_endpoints(self):
        """True when each endpoint is a pair: RMA without FI_ATOMIC (so that
        the provider orders reads after writes) and a second one for atomics."""
        return bool(self.d.split)

    @property
    def endpoints(self):
        """The endpoints opened in this domain (the sync endpoint's included)."""
        return tuple(self._eps)

    @property
    def fresh_initiators(self):
        """Over shm: libfabric endpoints opened after peers' deaths for
        endpoints that might hold an op towards the dead (OfiEndpoint.fresh_initiator)."""
        return self.d.n_fresh

    @property
    def manual_progress(self):
        """True when targets must poll (FI_PROGRESS_MANUAL): a progress thread does."""
        return bool(self.d.manual)

    @property
    def ordered_flush(self):
        """True when implicit puts complete remotely by a read-after-write flush
        (FI_ORDER_RAW), and up to which size; else they ask for delivery completion."""
        return bool(self.d.ordered), self.d.max_order_raw

    @property
    def ordered_writes(self):
        """True when writes from one endpoint to one target land in issue order
        (FI_ORDER_WAW, at least 8 bytes): the collectives then signal by stores."""
        return bool(self.d.waw)

    @property
    def put_signal_mode(self):
        """How put_signal orders its signal after its data over this domain
        (ofi.src/signal.pxi): ``"ordered"`` (data write and signal atomic back
        to back on one endpoint, the provider's FI_ORDER_WAW keeps them in
        order), ``"message"`` (split endpoints: the data write, then the signal
        as a message the target applies, FI_ORDER_SAW on the RMA endpoint) --
        both for data up to ``put_signal_stats()["ordered_max"]`` bytes -- or
        ``"delivery"`` (the data's delivery completion is waited for, then the
        signal issued as an atomic)."""
        if self.d.sig_ordered:
            return "ordered"
        return "message" if self.d.sig_msg else "delivery"

    def put_signal_stats(self, reset=False):
        """``{"ordered": n, "message": n, "delivery": n, "ordered_max": bytes,
        "bad_messages": n, "cq_data": n}``: put_signals of this process issued
        each way (larger data than ``ordered_max`` takes the delivery way; of
        the "message" ones, ``cq_data`` carried their signal as the data
        write's remote CQ data instead of a message of its own), and signals
        received here that named no word of the endpoint's bound segment
        (dropped); ``reset`` zeroes the counts."""
        out = {"ordered": self.d.n_sig_ordered, "message": self.d.n_sig_msg,
               "delivery": self.d.n_sig_delivery, "ordered_max": self.d.sig_order_max,
               "bad_messages": self.d.sig_bad, "cq_data": self.d.n_sig_data}
        if reset:
            self.d.n_sig_ordered = self.d.n_sig_delivery = self.d.n_sig_msg = 0
            self.d.n_sig_data = 0
            self.d.sig_bad = 0
        return out

    @property
    def hmem(self):
        """``"native"`` when the domain was opened with FI_HMEM (device segments
        are then registered with the provider where it accepts them: path
        ``ofi-hmem``, else ``ofi-staged``), ``"off"`` when GEXMK_OFI_HMEM=off,
        else ``"unoffered"``."""
        if self.d.hmem:
            return "native"
        return "off" if self.d.hmem_want == HMEM_OFF else "unoffered"

    @property
    def mr_mode(self):
        return self.d.mr_mode

    @property
    def inject_size(self):
        return self.d.inject_size

    def insert(self, bytes name):
        """(fi_addr for RMA, fi_addr for atomics) of a peer endpoint's name
        (inserted once, cached).  A split endpoint's name holds both of its
        addresses; a single endpoint gets the same fi_addr twice."""
        cdef fi_addr_t a[2]
        cdef const char* p
        cdef size_t count = 1
        cached = self._addrs.get(name)
        if cached is not None:
            return cached
        split = name.startswith(_SPLIT_TAG) or name.startswith(_SINGLE_TAG)
        if self.d.split and name.startswith(_SINGLE_TAG):
            # a split domain's single endpoint (a sync endpoint): RMA only
            raw = name[len(_SINGLE_TAG):]
            p = raw
            rc = fi_av_insert(self.d.av, p, 1, a, 0, NULL)
            if rc != 1:
                check("fi_av_insert", rc if rc < 0 else -FI_EINVAL)
            out = (a[0], a[0])
            self._addrs[name] = out
            return out
        if split != bool(self.d.split):
            raise CommunicationError(
                f"a peer's ofi endpoint is {'split' if split else 'single'}, this process's is "
                f"{'split' if self.d.split else 'single'}: the job's processes disagree on the "
                f"libfabric set-up (same libfabric, provider and GEXMK_OFI_SPLIT everywhere?)")
        raw = name[len(_SPLIT_TAG):] if split else name
        if split:
            if len(raw) == 0 or len(raw) % 2:
                raise CommunicationError(f"a split endpoint name of {len(raw)} bytes: not two "
                                         f"addresses of equal length")
            count = 2               # two names of equal length, packed as fi_av_insert takes them
        p = raw
        rc = fi_av_insert(self.d.av, p, count, a, 0, NULL)
        if rc != <int>count:
            check("fi_av_insert", rc if rc < 0 else -FI_EINVAL)
        out = (a[0], a[1] if split else a[0])
        self._addrs[name] = out
        return out

    def _reinsert(self, names):
        """Remove the addresses of the peer endpoints ``names`` from the AV
        (rxm then closes their connections, at both ends: FI_AV_REMOVE_CLEANUP)
        and insert them again: {name: (fi_addr, atomics fi_addr)} (conncap.pxi).
        Nothing may use the old addresses meanwhile (the caller gated them)."""
        cdef fi_addr_t a
        cdef int rc
        names = list(names)
        for name in names:
            if type(name) is not bytes:
                raise ArgumentError(f"_reinsert(names): expected endpoint names (bytes), got "
                                    f"{type(name).__name__}")
        gone = set()
        for name in names:
            got = self._addrs.pop(name, None)
            if got is not None:
                gone.update(got)
        for addr in gone:
            a = addr
            with nogil:
                rc = fi_av_remove(self.d.av, &a, 1, 0)
            check("fi_av_remove", rc)
        return {name: self.insert(name) for name in names}

    def map_key(self, key, uint64_t base):
        """The 64-bit key to use for a peer's registration: its key itself, or
        for FI_MR_RAW providers the local mapping of its raw key (cached)."""
        cdef uint64_t out = 0
        cdef bytes raw
        if isinstance(key, int):
            return key
        raw = key
        cached = self._raw_keys.get((raw, base))
        if cached is not None:
            return cached
        check("fi_mr_map_raw", fi_mr_map_raw(self.d.domain, base, <uint8_t*><char*>raw, len(raw),
                                             &out, 0))
        self._raw_keys[(raw, base)] = out
        return out

    def endpoint(self, bint rma_only=False):
        """A new libfabric endpoint with its own CQ, for one gexmk endpoint.
        ``rma_only``: where endpoints are split and the RMA one orders
        writes (FI_ORDER_WAW), one endpoint without atomics instead of the
        pair -- an rxm endpoint is ~10 MB resident (issue 23); its routes
        offer no atomics (OfiTransport.reach)."""
        if self.closed:
            raise StateError("the ofi domain is closed")
        if self.d.neps >= MAX_EPS:
            raise UnsupportedError(f"more than {MAX_EPS} network endpoints in one process")
        ep = OfiEndpoint._make(self, rma_only and bool(self.d.split) and bool(self.d.waw))
        self._eps.append(ep)
        self.d.eps[self.d.neps] = &(<OfiEndpoint>ep).e
        gx_mem_fence()
        gx_add_long(&self.d.neps, 1)
        return ep

    # -- progress thread --

    def start_progress(self, bint spin=False):
        """Start the background progress thread (idempotent): manual-progress
        providers need the target to poll for puts and gets to complete.  By
        default it sleeps in the CQ's wait object between events; ``spin``
        makes it poll continuously (lowest latency, one core busy)."""
        if self._thread is not None:
            return
        self._spin = spin
        # endpoints opened from now on get a CQ the thread can sleep on (those
        # opened before keep theirs and are polled with naps)
        self.d.cq_wait = not spin or SPIN_FD
        self.d.thread_on = 1
        self._thread = threading.Thread(target=self._progress_loop, name="gexmk-ofi-progress",
                                        daemon=True)
        self._thread.start()

    @property
    def progress_running(self):
        """True while the background progress thread runs."""
        return self._thread is not None

    def _progress_loop(self):
        # Runs without the GIL from start to end: it must keep serving peers
        # while application threads hold the GIL.
        with nogil:
            _progress_thread(&self.d, self._spin, &self._stop_flag)

    def stop_progress(self):
        """Stop and join the progress thread (idempotent)."""
        cdef double deadline
        if self._thread is None:
            return
        self._stop_flag = 1
        deadline = _now() + 10
        while self._thread.is_alive() and _now() < deadline:
            for e in self._eps:
                # only a CQ with a wait object can be signalled (shm's has none)
                if not (<OfiEndpoint>e).closed and (<OfiEndpoint>e).e.cq != NULL \
                        and (<OfiEndpoint>e).e.can_wait:
                    fi_cq_signal((<OfiEndpoint>e).e.cq)
                    if (<OfiEndpoint>e).e.acq != NULL:
                        fi_cq_signal((<OfiEndpoint>e).e.acq)
            self._thread.join(0.05)
        if self._thread.is_alive():
            raise StateError("the ofi progress thread did not stop; not closing its endpoints")
        self._thread = None
        self._stop_flag = 0
        self.d.thread_on = 0

    def start_lander(self):
        """Start the thread that serves this process's landing zones (idempotent)."""
        if self._lander is None:
            self._lander = threading.Thread(target=self._lander_loop, name="gexmk-ofi-lander",
                                            daemon=True)
            self._lander.start()

    def _lander_loop(self):
        with nogil:
            _lander_thread(&self.d, &self._lstop)

    @property
    def vis_paths(self):
        """How this process's VIS calls went over the network: messages sent
        direct (path ``ofi``: fi_writemsg/fi_readmsg of several ranges), slots
        packed through a host target's landing zone (``ofi-landed``), and calls
        sent direct because the target's zone had no ring left for this
        process (``refused``, GEXMK_OFI_ZONE_RINGS); and of the landed slots,
        those the process's packer thread packed while the slot before went
        out (``packed-ahead``, GEXMK_OFI_VIS_PACKER)."""
        return {"ofi": self.d.n_vis_direct, "ofi-landed": self.d.n_vis_landed,
                "refused": self.d.n_vis_refused, "packed-ahead": _pk.jobs}

    @property
    def ring_stats(self):
        """This process's rings in peers' landing zones (staged and VIS zones
        alike, issue 23): ``opened`` -- rings a zone backed for it (on first
        use, and again after a release), ``released`` -- rings it gave back
        after GEXMK_OFI_RING_IDLE seconds unused (or sooner, when the zone
        asked: another initiator was waiting), ``waited`` -- first requests a
        zone refused (GEXMK_OFI_ZONE_RINGS reached) that a staged operation
        waited out, ``held`` -- rings it holds now, ``landed`` -- releases
        still on their way when their zone's owner published the endpoint
        again without it, waited for before the publication was applied,
        ``resent`` -- releases whose write failed (a connection closed under
        the cap, its reconnection refused), written again before their answer
        was awaited."""
        return {"opened": self.d.n_ring_opens, "released": self.d.n_ring_releases,
                "waited": self.d.n_ring_waits, "held": self.d.nheld,
                "landed": self.d.n_release_landed, "resent": self.d.n_release_resent}

    @property
    def landed(self):
        """Staged requests (puts, gets, atomics of chunks) this process's lander served."""
        return self.d.landed

    def stop_lander(self):
        if self._lander is None:
            return
        self._lstop = 1
        self._lander.join(10)
        if self._lander.is_alive():
            raise StateError("the ofi lander thread did not stop; not closing its zones")
        self._lander = None
        self._lstop = 0

    def linger(self, ep):
        """Whether the closed endpoint ``ep`` is to linger (OfiEndpoint._linger):
        over shm while the domain is open, at most LINGER_EPS at a time (the
        oldest is then released: a peer's access racing with its closure may
        meet a closed endpoint again).  A lingering endpoint stays in the
        list the progress thread and waits poll."""
        if self.closed or self.provider != "shm":
            return False
        self._lingering.append(ep)
        while len(self._lingering) > LINGER_EPS:
            self._unlinger(self._lingering.pop(0))
        return True

    @property
    def lingering(self):
        """How many closed endpoints are still served for peers (shm)."""
        return len(self._lingering)

    cdef _unlinger(self, OfiEndpoint e):
        e._unregister()
        e._release()

    def close(self):
        """Close every endpoint, the AV, domain and fabric (idempotent)."""
        if self.closed:
            return
        self.stop_lander()
        self.stop_progress()
        self.closed = True      # endpoints closed from now on do not linger
        for e in self._eps:
            (<OfiEndpoint>e).close()
        for e in self._lingering:
            self._unlinger(e)
        self._lingering = []
        self._eps = []
        self.closed = True
        for k in self._raw_keys.values():
            fi_mr_unmap_key(self.d.domain, k)
        self._raw_keys = {}
        self._release()

    cdef void _release(self) noexcept:
        """Close the AV, domain and fabric and free the infos: C fields only,
        so that __dealloc__ may call it (it never raises: a handle libfabric
        refuses to close, e.g. a domain with endpoints still open, leaks)."""
        if self.d.av != NULL:
            fi_close(&self.d.av.fid)
            self.d.av = NULL
        if self.d.domain != NULL:
            fi_close(&self.d.domain.fid)
            self.d.domain = NULL
        if self.d.fabric != NULL:
            fi_close(&self.d.fabric.fid)
            self.d.fabric = NULL
        if self.d.info != NULL:
            fi_freeinfo(self.d.info)
            self.d.info = NULL
        if self.d.rma_info != NULL:
            fi_freeinfo(self.d.rma_info)
            self.d.rma_info = NULL
        self.d.split = 0
        free(self.d.held)
        self.d.held = NULL
        free(self.d.dead_ring)
        self.d.dead_ring = NULL
        self.d.conn_cap = 0
        free(self.d.procs)
        self.d.procs = NULL
        self.d.nprocs = 0
        self.d.nheld = self.d.held_cap = 0

    def __dealloc__(self):
        # STYLE rule 4: C fields only, never Python calls.  A progress thread
        # holds a reference to its Domain, so none runs here.
        self._release()

    def __repr__(self):
        return f"<gexmk.ofi Domain {self.provider} on {self.domain_name}>"


def _unlink_stale_shm_regions():
    """libfabric 1.17's shm provider names its region /dev/shm/<pid>:<n>:<m>
    and cannot unlink it when its process is SIGKILLed; a later process that
    gets the same pid then fails fi_enable with EBUSY.  Before this process
    has opened any shm endpoint, every region with its pid is such a leftover."""
    prefix = f"{os.getpid()}:"
    try:
        names = os.listdir("/dev/shm")
    except OSError:
        return
    for name in names:
        if name.startswith(prefix):
            try:
                os.unlink(os.path.join("/dev/shm", name))
            except OSError:
                pass


cdef char* _strdup(bytes s):
    # libfabric frees prov_name with fi_freeinfo: allocate with the C allocator
    cdef size_t n = len(s)
    cdef char* p = <char*>calloc(n + 1, 1)
    memcpy(p, <char*>s, n)
    return p


