# ---- events -----------------------------------------------------------------

cdef class Event:
    """Completion of a non-blocking operation (GASNet-EX ``gex_Event_t``).

    ``test()`` returns True once the operation is complete (GASNet-EX: a
    successful test consumes the event); unlike GASNet-EX, waiting on or
    testing a completed event again is allowed and returns at once.  An event
    keeps the buffers of its operation alive until it completes; dropped
    before that, it leaves them to its client until the op completes.
    Waiting releases the GIL.
    """

    def __cinit__(self):
        self._dt = -1

    def __init__(self):
        raise TypeError("events come from NB operations; use gexmk.LeafEvent() for an lc slot")

    def __dealloc__(self):
        # A pending op dropped by its program: what it touches (its buffers)
        # must outlive it, not this object -- a get into an array freed with its
        # event wrote into reused memory.  It is parked with them in its client
        # until it completes (_sweep_parked); with nothing to keep, it is handed
        # to its transport, which frees it at completion.
        if self._op != NULL:
            if self._park is not None and self._keep is not None:
                self._park.append(_parked(self._ops, self._op, self._keep))
            else:
                self._ops.orphan(self._op)
            self._op = NULL

    cdef void _fail(self, object error) noexcept:
        """Complete with ``error`` (finalize): the op is orphaned to its
        transport, which frees it if it ever completes; what it touches is
        parked until the transports have closed (Client._teardown)."""
        if self._op != NULL:
            self._ops.orphan(self._op)
            self._op = NULL
            if self._park is not None and self._keep is not None:
                self._park.append(_parked(NULL, NULL, self._keep))
        self._failed = error
        self._done = True
        self._keep = None

    cdef int _complete(self, bint block) except -1:
        """Drive a pending transport op; 1 when complete."""
        cdef gx_val res
        cdef void* op = self._op
        cdef int done
        if self._failed is not None:
            raise self._failed
        if self._region:
            if block:
                _nbi_sync(EC_ALL)
                done = 1
            else:
                done = _nbi_test(EC_ALL)
            if done:
                self._done = True
            return done
        if op == NULL:
            if self._lc is not None and self._lc is not self:
                # a LeafEvent bound to another operation's event
                if not (<Event>self._lc)._done and not (<Event>self._lc)._complete(block):
                    return 0
            self._done = True
            return 1
        self._op = NULL          # the transport frees it on every outcome but "pending"
        try:
            if block:
                with nogil:
                    self._ops.wait(op, &res)
                done = 1
            else:
                done = self._ops.test(op, &res)
                if not done:
                    self._op = op
                    return 0
        except BaseException:
            self._done = True    # failed: complete, with the error raised now
            self._keep = None
            raise
        if self._dt >= 0:
            self._result = _from_val(self._dt, &res)
        self._done = True
        self._keep = None
        return 1

    def test(self):
        """True when complete (never blocks)."""
        if not self._bound:
            raise StateError("this event is not bound to an operation yet")
        if not self._done:
            self._complete(False)
        elif self._failed is not None:
            raise self._failed
        return self._done

    def wait(self):
        """Block until complete; return the operation's result (None for most)."""
        if not self._bound:
            raise StateError("this event is not bound to an operation yet "
                             "(an access region's event exists only after the region ends)")
        if not self._done:
            self._complete(True)
        elif self._failed is not None:
            raise self._failed
        self._keep = None
        return self._result

    @property
    def result(self):
        """The operation's result once complete (fetched atomic value, query answer)."""
        if not self._bound or not self.test():
            raise StateError("the event is not complete")
        return self._result

    def leaf(self, category):
        """The leaf event of ``category`` (``EC_LC``: local completion of a put
        issued with ``lc=LC_DEFER``); GASNet-EX ``gex_Event_QueryLeaf``."""
        category = _as_int(category, "leaf", "category", False)
        if category != EC_LC:
            raise ArgumentError(f"leaf: unknown leaf category {category}; only EC_LC has leaves")
        if self._lc is None:
            raise StateError("this event has no local-completion leaf (issue the put with lc=LC_DEFER)")
        return self._lc

    def __repr__(self):
        state = "unbound" if not self._bound else ("done" if self._done else "pending")
        return f"<gexmk.Event {state}>"


cdef class LeafEvent(Event):
    """An explicit local-completion slot: pass it as ``lc=`` to a put and wait
    on it for the source buffer to be reusable (GASNet-EX lc_opt pointing at a
    ``gex_Event_t``)."""

    def __init__(self):
        self._bound = False


cdef Event _done_event(object result):
    cdef Event ev = Event.__new__(Event)
    ev._bound = True
    ev._done = True
    ev._result = result
    return ev


cdef class _Parked:
    """A pending op whose Event was dropped (``op``, NULL once handed to its
    transport) and what it touches (``keep``), kept alive until it completes."""
    cdef const gx_tr_ops* ops
    cdef void* op
    cdef object keep


cdef _Parked _parked(const gx_tr_ops* ops, void* op, object keep):
    cdef _Parked p = _Parked.__new__(_Parked)
    p.ops = ops
    p.op = op
    p.keep = keep
    return p


#: parked ops a new NB op looks at (the oldest first): O(1) per issue, and the
#: list cannot grow while they complete
cdef int _SWEEP_MAX = 2


cdef int _sweep_parked(Client client) except -1:
    """Let go of the oldest parked ops that completed (or failed: their
    transport freed them either way) and of what they touched; the others go
    to the back.  Run as each NB op is issued."""
    cdef _Parked p
    cdef gx_val res
    cdef int done, i
    q = client._parked
    for i in range(min(len(q), _SWEEP_MAX)):
        p = q.popleft()     # (a test may run the GC: more get parked at the back)
        if p.op == NULL:    # only buffers, kept for the transports' close (_fail)
            q.append(p)
            continue
        try:
            done = p.ops.test(p.op, &res)
        except Exception:       # noqa: BLE001 - nobody waits for it: its failure goes too
            done = 1
        if not done:
            q.append(p)
    return 0


cdef list _unpark_all(Client client):
    """Finalize: hand every parked op to its transport (freed there if it ever
    completes) and return what they touch, to be kept until the transports close."""
    cdef _Parked p
    cdef list keep = []
    while client._parked:
        p = client._parked.popleft()
        if p.op != NULL:
            p.ops.orphan(p.op)
            p.op = NULL
        keep.append(p.keep)
    return keep


cdef Event _op_event(Client client, const gx_tr_ops* ops, void* op, object keep, int dt):
    """Event over a pending transport op; ``keep`` holds what the op touches
    (its buffer, the team and through it the endpoint and target contexts)
    alive until it completes, also when the event is dropped first (parked in
    the client).  The client fails it at finalize."""
    cdef Event ev = Event.__new__(Event)
    if client._parked:
        _sweep_parked(client)
    ev._bound = True
    ev._ops = ops
    ev._op = op
    ev._keep = keep
    ev._dt = dt
    ev._park = client._parked
    client._pending.add(ev)
    return ev


# One completed event shared by every NB operation that finished at issue
# (GASNet-EX's GEX_EVENT_INVALID); its local-completion leaf is itself.
cdef Event _DONE = _done_event(None)
_DONE._lc = _DONE
EVENT_DONE = _DONE


cdef int _lc_mode(object lc, str fn) except -1:
    """Check an lc option; 1 when the source must be reusable on return (LC_NOW).
    An option, not a number: anything but the three constants (numpy
    integers included) or a LeafEvent is refused, floats and bools too."""
    if lc is None or lc is LC_NOW:
        return 1
    if isinstance(lc, LeafEvent):
        return 0
    if type(lc) is not bool and hasattr(type(lc), "__index__"):
        v = PyNumber_Index(lc)
        if v == LC_NOW:
            return 1
        if v == LC_DEFER or v == LC_GROUP:
            return 0
    raise ArgumentError(f"{fn}: lc must be LC_NOW, LC_DEFER, LC_GROUP or a gexmk.LeafEvent, "
                        f"got {_got(lc)}")


cdef Event _lc_event(object lc, Event rc_event):
    """Bind an lc option to an operation whose remote completion is rc_event.
    Local completion is implied by remote completion, so the leaf is the
    remote-completion event itself (or complete at once when that is)."""
    if isinstance(lc, LeafEvent):
        if rc_event._done:
            (<Event>lc)._bound = True
            (<Event>lc)._done = True
        else:
            (<Event>lc)._bound = True
            (<Event>lc)._region = False
            (<Event>lc)._lc = rc_event
    if rc_event is not _DONE and rc_event._lc is None:
        rc_event._lc = rc_event
    return rc_event


def _events(events):
    out = []
    for e in events:
        if e is None:
            continue
        if not isinstance(e, Event):
            raise TypeError(f"expected gexmk.Event objects, got {type(e).__name__}")
        out.append(e)
    return out


def wait_all(events):
    """Wait for every event in ``events`` (None entries are ignored)."""
    for e in _events(events):
        e.wait()


def wait_some(events, timeout=None):
    """Wait until at least one event is complete; return the indices of the
    complete ones (GASNet-EX ``gex_Event_WaitSome``).  Raises TimeoutError
    when none completes within ``timeout`` seconds (None: GEXMK_TIMEOUT)."""
    # the timeout is checked first: a bad one is refused even where nothing is waited for
    limit = _as_timeout(timeout, "wait_some(events, timeout=None)") or _timeout_now()
    events = list(events)
    live = _events(events)
    if not live:
        return []
    cdef double t0 = _mono(), now, waited
    cdef long nap = _nap_min
    cdef bint naps = _naps_safe()
    deadline = t0 + limit
    while True:
        done = [i for i, e in enumerate(events) if e is not None and (<Event>e).test()]
        if done:
            return done
        now = _mono()
        if now > deadline:
            raise TimeoutError_(f"wait_some: none of {len(live)} events completed within "
                                f"{limit:g} s (timeout=, default GEXMK_TIMEOUT)")
        waited = now - t0
        if not naps or waited < _yield_for:
            _yield_cpu()
            continue
        # Past the yields, sleep between passes as a word wait does (issue 21: a
        # waiting rank must not burn a core; _nap_next): a completion is seen at
        # most one nap late.
        with nogil:
            _nap_ns(nap)
        nap = _nap_next(nap, waited)


cdef bint _naps_safe() except -1:
    """Whether a wait may sleep between its passes over events: no transport
    of the client says its operations move only while a waiter drives them
    (its ``needs_driving``: manual progress without a progress thread).
    Where one does, the waiter's own passes are all that moves its
    transfers, and a nap would stall them (the waiter yields instead)."""
    c = _client
    if c is None:
        return False
    for tr in (<Client>c).transports.values():
        if getattr(tr, "needs_driving", False):
            return False
    return True



def test_all(events):
    """True when every event is complete."""
    return all([(<Event>e).test() for e in _events(events)])


def test_some(events):
    """Indices of the complete events (possibly empty)."""
    events = list(events)
    _events(events)
    return [i for i, e in enumerate(events) if e is not None and (<Event>e).test()]


cdef void _yield_cpu() noexcept:
    """Let other threads (and processes, on a busy node) run while polling."""
    with nogil:
        sched_yield()


_tls = threading.local()


cdef int _categories(int category) except -1:
    """EC_* mask -> mask of 1 << GX_CAT_*."""
    if category & ~(EC_ALL | EC_LC) or category == 0:
        raise ArgumentError(f"unknown event category mask {category:#x}; "
                            "use EC_GET, EC_PUT, EC_RMW, EC_LC, EC_ALL")
    cdef int m = 0
    if category & EC_GET:
        m |= 1 << GX_CAT_GET
    if category & (EC_PUT | EC_LC):
        m |= 1 << GX_CAT_PUT
    if category & EC_RMW:
        m |= 1 << GX_CAT_RMW
    return m


cdef list _sync_eps(Endpoint only=None):
    """Endpoints to synchronise: one, or every live endpoint of the client."""
    if only is not None:
        only.check_alive()
        return [only]
    c = _client
    if c is None:
        return []
    return [e for e in (<Client>c)._eps if e is not None]


cdef int _ep_sync(gx_ep* e, int mask) except -1 nogil:
    """Complete the implicit ops of ``mask`` in every transport of one endpoint."""
    cdef int i
    for i in range(e.ntr):
        e.tr[i].ops.sync(e.tr[i].ep, mask)
    gx_mem_fence()
    return 0


cdef int _nbi_sync(int category, Endpoint only=None) except -1:
    cdef int mask = _categories(category)
    cdef Endpoint e
    for e in _sync_eps(only):
        if mask & (1 << GX_CAT_PUT):
            e.c.unsynced = 0        # synced here: a collective need not again (its error, if
                                    # any, is this call's to raise)
        with nogil:
            _ep_sync(&e.c, mask)
        # their operations are complete: the buffers may go
        if mask & (1 << GX_CAT_PUT):
            e._keep_put.clear()
        if mask & (1 << GX_CAT_GET):
            e._keep_get.clear()
    gx_mem_fence()
    return 0


def nbi_wait(category=EC_ALL, flags=0):
    """Wait for every implicit-event operation of ``category`` (GASNet-EX
    ``gex_NBI_Wait``).  Operations are tracked per endpoint and transport, so
    this completes those of every endpoint of the process; on CPU-mapped
    targets every operation is complete at issue.  ``flags`` must be 0."""
    category = _as_index(category, "nbi_wait", "category", 1, EC_ALL | EC_LC, False)
    _check_flags(flags, "nbi_wait")
    _check_initialized("nbi_wait")
    _nbi_sync(category)


def nbi_test(category=EC_ALL, flags=0):
    """True when every implicit-event operation of ``category`` is complete
    (GASNet-EX ``gex_NBI_Test``); it then also releases their buffers.
    ``flags`` must be 0."""
    category = _as_index(category, "nbi_test", "category", 1, EC_ALL | EC_LC, False)
    _check_flags(flags, "nbi_test")
    _check_initialized("nbi_test")
    return _nbi_test(category)


cdef bint _nbi_test(int category) except -1:
    cdef int mask = _categories(category)
    cdef Endpoint e
    cdef int i
    for e in _sync_eps():
        for i in range(e.c.ntr):
            if not e.c.tr[i].ops.nbi_test(e.c.tr[i].ep, mask):
                return False
    _nbi_sync(category)         # complete locally: flush, collect errors, release buffers
    return True


cdef int _check_flags(object flags, str fn) except -1:
    flags = _as_int(flags, fn, "flags", False)
    if flags != 0:
        raise ArgumentError(f"{fn}: flags must be 0 (no flags are defined), got {flags}")
    return 0


class nbi_access_region:
    """NBI access region (GASNet-EX ``gex_NBI_{Begin,End}AccessRegion``):

        with gexmk.nbi_access_region() as ev:
            tm.put_nbi(...); tm.get_nbi(...)
        ev.wait()      # completes every NBI op issued inside the region

    The event is bound when the region ends; regions do not nest (per thread).
    Over the network the event completes when every implicit operation of the
    process is complete (a superset of the region's, never fewer).
    """

    def __init__(self):
        self._event = None

    def __enter__(self):
        if getattr(_tls, "region", None) is not None:
            raise StateError("an NBI access region is already open in this thread")
        ev = LeafEvent()
        _tls.region = ev
        self._event = ev
        return ev

    def __exit__(self, *exc):
        cdef Event ev = self._event
        _tls.region = None
        gx_mem_fence()
        ev._bound = True
        ev._region = True     # completes with nbi_wait: at once where nothing is outstanding
        return False


def fence():
    """Order this process's earlier puts/atomics before its later ones (NVSHMEM
    fence).  Over the network this completes them (quiet), which orders them."""
    _check_initialized("fence")
    _nbi_sync(EC_PUT | EC_RMW)


def quiet():
    """Complete this process's outstanding puts/atomics (NVSHMEM quiet)."""
    _check_initialized("quiet")
    _nbi_sync(EC_PUT | EC_RMW)


cdef int _check_initialized(str what) except -1:
    if _client is None:
        raise StateError(f"{what}(): gexmk is not initialized in this process (call gexmk.init())")
    return 0


