# ---- atomic domains ---------------------------------------------------------

cdef class AtomicDomain:
    """An atomic domain (GASNet-EX ``gex_AD_t``) for one data type and a set
    of operations over a team.  Ops on mapped targets are CPU atomics on the
    shared mapping: atomic across every process of the node.  As in NVSHMEM,
    they are atomic only with respect to other atomics of the same domain
    type on the same object, not to plain puts or local stores."""
    cdef readonly Team team
    cdef readonly int dt
    cdef readonly int ops
    cdef bint destroyed

    def __init__(self):
        raise TypeError("use tm.ad_create(dt, ops)")

    @staticmethod
    cdef AtomicDomain _make(Team tm, int dt, int ops, int flags):
        tm.check_alive()
        if dt not in _DT_NAMES:
            raise ArgumentError(f"unknown atomic data type {dt}; use DT_I32, DT_U32, DT_I64, DT_U64, "
                                "DT_FLT or DT_DBL")
        if ops == 0 or ops & ~_ALL_OPS:
            raise ArgumentError(f"ops {ops:#x} must be a non-empty or-combination of OP_* flags")
        if dt in (DT_FLT, DT_DBL) and ops & _BITWISE:
            raise ArgumentError(f"bitwise ops are not defined for {_DT_NAMES[dt]}")
        if not tm._pair:
            tm.barrier()
        cdef AtomicDomain ad = AtomicDomain.__new__(AtomicDomain)
        ad.team = tm
        ad.dt = dt
        ad.ops = ops
        return ad

    def destroy(self):
        """Destroy the domain (idempotent; GASNet-EX ``gex_AD_Destroy``)."""
        self.destroyed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()

    cdef object _do(self, int rank, uintptr_t addr, int op, object a, object b, int mode):
        """Run one op; the fetched value (or None), or for mode NET_NB an Event."""
        cdef gx_val va, vb, res
        cdef int code, rc, dt = self.dt
        cdef void* nop = NULL
        if self.destroyed:
            raise StateError("the atomic domain has been destroyed")
        if op <= 0 or op & (op - 1) or not (op & self.ops):
            if op > 0 and not op & (op - 1) and op & _C_ALL_OPS:
                raise ArgumentError(f"op {op:#x} is not in this domain's op set {self.ops:#x}")
            raise ArgumentError(f"op must be one OP_* flag, got {op!r}")
        code = _bit_index(op)
        if addr & (gx_dt_size(dt) - 1):
            raise BoundsError(f"atomic: address 0x{addr:x} is not aligned to {gx_dt_size(dt)} bytes")
        va.u64 = 0
        vb.u64 = 0
        res.u64 = 0
        if not op & _C_NO_OPERAND:
            _to_val(dt, a, &va, "operand1")
        if op & _C_TWO_OPERANDS:
            _to_val(dt, b, &vb, "operand2")
        rc = gx_atomic(&self.team.c, rank, addr, dt, code, va, vb, &res)
        if rc == GX_NOT_MAPPED:
            with nogil:
                _amo(&self.team.c, rank, addr, dt, code, va, vb, &res, mode,
                     &nop if mode == GX_NB else NULL, rc)
            if nop != NULL:
                return _op_event(self.team.client, self.team.c.routes[rank].amo.ops, nop,
                                 self.team, dt if op & _C_FETCHING else -1)
        elif rc != GX_OK:
            atomic_slow(&self.team.c, rank, addr, dt, code, va, vb, &res, rc)
        if not op & _C_FETCHING:
            return None
        return _from_val(dt, &res)

    def op(self, int rank, uintptr_t addr, int op, operand1=None, operand2=None):
        """Blocking atomic: perform ``op`` on the object at ``addr`` of team
        rank ``rank``; return the old value for fetching ops, else None.
        CAS/FCAS: operand1 is compared, operand2 is swapped in."""
        return self._do(rank, addr, op, operand1, operand2, GX_BLOCKING)

    def op_nb(self, int rank, uintptr_t addr, int op, operand1=None, operand2=None):
        """Non-blocking atomic (``gex_AD_OpNB``): an Event whose result is the
        fetched value (None for non-fetching ops)."""
        r = self._do(rank, addr, op, operand1, operand2, GX_NB)
        if isinstance(r, Event):
            return r
        return _done_event(r)

    def op_nbi(self, int rank, uintptr_t addr, int op, operand1=None, operand2=None, result=None):
        """Implicit-event atomic (``gex_AD_OpNBI``); a fetching op writes the
        old value into ``result`` (a writable buffer of the domain's type size)."""
        mv = None
        if op & _FETCHING:
            if result is None:
                raise ArgumentError("a fetching op issued NBI needs a result= buffer")
            # check the result buffer before the op runs: never lose a fetched value
            try:
                mv = memoryview(result).cast("B")
            except (TypeError, ValueError) as e:
                raise TypeError(f"result must be a writable contiguous buffer: {e}") from None
            if mv.readonly or mv.nbytes < gx_dt_size(self.dt):
                raise ArgumentError(f"result must be a writable buffer of at least "
                                    f"{gx_dt_size(self.dt)} bytes")
        # fetching ops complete here (the value must land in result); others are implicit
        v = self._do(rank, addr, op, operand1, operand2, GX_BLOCKING if mv is not None else GX_NBI)
        if mv is not None:
            struct.pack_into(_DT_FORMATS[self.dt], mv, 0, v)


cdef int _bit_index(int op) noexcept:
    cdef int i = 0
    while not (op & 1):
        op >>= 1
        i += 1
    return i


cdef int _to_val(int dt, object x, gx_val* v, str what) except -1:
    cdef long long i
    cdef unsigned long long u
    if x is None:
        raise ArgumentError(f"{what} is required for this op")
    if dt == GX_DT_FLT:
        v.flt = <float>float(x)
        return 0
    if dt == GX_DT_DBL:
        v.dbl = float(x)
        return 0
    if not isinstance(x, int):
        raise TypeError(f"{what} must be an int for {_DT_NAMES[dt]}, got {type(x).__name__}")
    try:
        if dt == GX_DT_U64 or dt == GX_DT_U32:
            if x < 0:
                raise OverflowError
            u = x
            if dt == GX_DT_U32:
                if u > 0xFFFFFFFFu:
                    raise OverflowError
                v.u32 = <uint32_t>u
            else:
                v.u64 = u
        else:
            i = x
            if dt == GX_DT_I32:
                if i < -2147483648 or i > 2147483647:
                    raise OverflowError
                v.i32 = <int32_t>i
            else:
                v.i64 = i
    except OverflowError:
        raise OverflowError(f"{what}={x} does not fit {_DT_NAMES[dt]}") from None
    return 0


cdef object _from_val(int dt, gx_val* v):
    if dt == GX_DT_I32:
        return v.i32
    if dt == GX_DT_U32:
        return v.u32
    if dt == GX_DT_I64:
        return v.i64
    if dt == GX_DT_U64:
        return v.u64
    if dt == GX_DT_FLT:
        return v.flt
    return v.dbl
