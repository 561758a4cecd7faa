# ---- eager connection set-up ---------------------------------------------------
#
# Connection-oriented providers under an RDM endpoint (tcp;ofi_rxm, verbs;ofi_rxm)
# open a connection on the first operation between two endpoints: tens of ms
# on tcp, enough to upset a work queue's load balance.  After a publication
# every process touches each new (local endpoint, peer endpoint) pair once --
# a 1-byte fi_read on the RMA endpoint and, where atomics have their own
# endpoint (split mode), an atomic read there -- all posted at once, then
# waited for with a bound, so the first application operation finds the
# connections up.  GEXMK_OFI_CONNECT=lazy leaves them to the first operation.

cdef enum:
    CONNECT_SECONDS = 10    # the most a publication waits for its connections

# Sink of the touches' reads: static, so a touch abandoned at the time bound
# can still complete into it later (nothing is freed under it).
cdef char _CONNECT_SINK[64]


cdef int _connect_wait(gx_op** ops, long n, double secs) noexcept nogil:
    """Progress until every op of ``ops`` completed or ``secs`` passed; the
    number still pending (the caller orphans them).  Over shm a touch of a
    survivor issued before a death's notice can sit behind an op to the dead
    for good (_poisoned): not waited for past DEATH_GRACE_MS either (fuzz seed
    139: a TM-pair's first operation waited the whole 10 s)."""
    cdef ofi_dom* dom
    cdef double deadline = _now() + secs, since = 0
    cdef long i, pending = n
    cdef unsigned long spins = 0
    if n == 0:
        return 0
    dom = ops[0].ep.dom
    gx_add_long(&dom.waiters, 1)
    while True:
        _app_active(dom)
        if _progress_all(dom) < 0:
            break
        pending = 0
        for i in range(n):
            # a peer that died meanwhile will never answer, nor will an endpoint
            # closed since its publication (rma.pxi _gone): not waited for
            if ops[i] != NULL and gx_load_int(&ops[i].state) != OP_DONE and not ops[i].t.g.dead \
                    and not ops[i].t.gone and not _poisoned(dom, ops[i].born_deaths, &since):
                pending += 1
        if pending == 0:
            break
        spins += 1
        if (spins & 255) == 0:
            if _now() > deadline:
                break
            for i in range(n):
                if ops[i] != NULL and gx_load_int(&ops[i].state) != OP_DONE:
                    _gone(dom, ops[i].t, deadline - secs)
    _app_active(dom)
    gx_add_long(&dom.waiters, -1)
    return pending


cdef object _connect_pairs(Domain dom, list pairs, double secs):
    """Touch each (ofi_ep*, ofi_peer*, which) of ``pairs`` (which: 0 RMA
    endpoint, 1 atomics endpoint); returns (connected, [failure texts])."""
    cdef long n = len(pairs), i, k = 0
    cdef gx_op** ops = <gx_op**>calloc(n if n else 1, sizeof(gx_op*))
    cdef ofi_ep* e
    cdef ofi_peer* t
    cdef void* out
    cdef ofi_proc* held = NULL
    cdef gx_val zero
    cdef uintptr_t remote
    cdef int w
    if ops == NULL:
        raise MemoryError()
    memset(&zero, 0, sizeof(zero))
    failures = []
    connected = 0
    try:
        for i in range(n):
            ep_h, peer_h, which = pairs[i]
            e = <ofi_ep*><uintptr_t>ep_h
            t = <ofi_peer*><uintptr_t>peer_h
            remote = t.g.remote_base
            out = NULL
            w = which
            try:
                # without the GIL: a touch that meets a full queue retries until the
                # peer is known dead, and that notice comes on a thread of its own
                with nogil:
                    _check_open(e, t, "connection set-up")     # see there: not into a closed one
                    held = NULL
                    _gate_enter(e, t, &held, "connection set-up")  # the cap (conncap.pxi)
                    try:
                        if w == 0:
                            net_get(e, t, remote, _CONNECT_SINK, 1, GX_NB, &out)
                        else:
                            net_atomic(e, t, remote, GX_DT_U32, GX_OP_GET, zero, zero, NULL,
                                       GX_NB, &out)
                    finally:
                        _gate_exit(held)
            except Exception as exc:
                failures.append(f"job rank {t.g.jobrank} endpoint {t.g.ep_index}: {exc}")
                continue
            if out == NULL:
                connected += 1      # completed at issue
            else:
                ops[k] = <gx_op*>out
                k += 1
        with nogil:
            _connect_wait(ops, k, secs)
        for i in range(k):
            t = ops[i].t
            if gx_load_int(&ops[i].state) != OP_DONE:
                failures.append(f"job rank {t.g.jobrank} endpoint {t.g.ep_index}: "
                                + ("it died" if t.g.dead else
                                   "closed since its publication" if t.gone else
                                   "held up behind an operation to a process that died"
                                   if _after_death(ops[i].ep.dom, ops[i].born_deaths) else
                                   f"no answer in {secs:g} s"))
                _orphan(ops[i])
            elif ops[i].err:
                failures.append(f"job rank {t.g.jobrank} endpoint {t.g.ep_index}: "
                                f"{fi_strerror(ops[i].err).decode(errors='replace')}")
                free(ops[i])
            else:
                connected += 1
                free(ops[i])
    finally:
        free(ops)
    return connected, failures
