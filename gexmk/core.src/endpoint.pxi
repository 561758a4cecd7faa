# ---- endpoints --------------------------------------------------------------

cdef class Endpoint:
    """An endpoint (GASNet-EX ``gex_EP_t``): the unit that binds a segment and
    initiates communication.  Index 0 is the primordial endpoint.
    ``contexts`` maps each loaded transport's name to this endpoint's context
    in it (its own queues, registrations and completion state)."""

    def __init__(self):
        raise TypeError("use client.ep_create()")

    cdef int check_alive(self) except -1:
        if self.c.destroyed:
            raise StateError(f"endpoint {self.index} has been destroyed")
        self.client.check_alive()
        return 0

    def bind_segment(self, Segment seg not None):
        """Bind ``seg`` to this endpoint (GASNet-EX ``gex_EP_BindSegment``).
        Peers can target it once it is published (``publish_bound_segment``);
        other endpoints of this process can target it at once."""
        self.check_alive()
        seg.check_alive()
        if seg.client is not self.client:
            raise ArgumentError("the segment belongs to another client")
        if self.segment is not None:
            raise StateError(f"endpoint {self.index} already has a bound segment; unbind it first")
        for e in self.client._eps:
            if e is not None and (<Endpoint>e).segment is seg:
                raise StateError(f"the segment is already bound to endpoint {(<Endpoint>e).index}")
        blobs = {}
        try:
            for name, ctx in self.contexts.items():
                blob = ctx.bind(seg)
                if blob is not None:
                    blobs[name] = blob
        except BaseException:
            for ctx in self.contexts.values():
                ctx.unbind()
            raise
        self._blobs = blobs
        self.segment = seg
        cdef _Target tg = self.client.target(self.client.rank, self.index)
        tg.t.kind = seg.kind.cls
        tg.t.device = seg.kind.device
        tg.t.remote_base = <uintptr_t>seg.addr
        tg.t.size = seg.size
        self._rebind()

    def _rebind(self):
        """After a bind or unbind: routes to and from this endpoint are chosen
        again, and its teams learn whether its segment is device memory."""
        cdef Team tm
        cdef Segment s = self.segment
        self.c.seg_kind = s.kind.cls if s is not None else GX_MK_HOST
        self.c.seg_device = s.kind.device if s is not None else -1
        self.client._reroute(self.client.target(self.client.rank, self.index))
        self.client._reroute(None, self)
        for tm in list(self.client._teams):
            if tm.ep is self:
                _set_dev_range(&tm.c, s)

    def unbind_segment(self):
        """Unbind the bound segment (no-op when none).  Peers learn of it at
        the next publication; until then their accesses land in memory that
        stays valid: a library-allocated segment stays mapped in the peers
        that mapped it, client memory is retained until finalize when its
        segment is destroyed, and network registrations are closed (peers'
        accesses fail)."""
        if self.segment is None:
            return
        self.segment = None
        self._blobs = {}
        for ctx in self.contexts.values():
            ctx.unbind()
        cdef _Target tg = self.client.target(self.client.rank, self.index)
        tg.t.size = 0
        tg.t.remote_base = 0
        if not self.client.finalized:
            self._rebind()

    def _close_contexts(self):
        """Close this endpoint's transport contexts (teardown, destroy)."""
        self.c.destroyed = 1
        self.c.ntr = 0
        for ctx in (self.contexts or {}).values():
            ctx.close()

    def destroy(self):
        """Destroy the endpoint (idempotent); its index is not reused.  Teams
        seen from it are closed: using them raises StateError."""
        cdef Team tm
        if self.c.destroyed:
            return
        self.unbind_segment()
        for tm in list(self.client._teams):
            if tm.ep is self:
                tm._close(f"its endpoint {self.index} was destroyed")
        self._close_contexts()
        if not self.client.finalized:
            self.client._eps[self.index] = None
            self.client._reroute(None, self)

    @property
    def destroyed(self):
        """True once destroy() has run."""
        return bool(self.c.destroyed)

    def pair(self, remote_index):
        """A TM-pair (GASNet-EX ``gex_TM_Pair``): a team-like handle whose
        rank argument is a job rank and whose target is that process's
        endpoint ``remote_index``.  No collectives on it."""
        remote_index = _as_index(remote_index, "pair", "remote_index", 0, INT_MAX)
        self.check_alive()
        c = self.client
        return Team._make(c, self, [(j, remote_index) for j in range(c.size)], c.rank,
                          f"pair{self.index}:{remote_index}", True)

    def __repr__(self):
        return f"<gexmk.Endpoint {self.index}{' destroyed' if self.c.destroyed else ''}>"
