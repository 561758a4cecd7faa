# ---- atomic domains ---------------------------------------------------------

cdef int _ad_agree(Team tm, object dt, object ops) except -1:
    """ad_create is collective (GASNet-EX ``gex_AD_Create``): every member
    creates the same domain at the same point; a member that asked for another
    data type or op set, or entered another collective, is named."""
    mine = ("ad_create", dt, ops)
    parts = tm._exchange(mine)
    bad = []
    for r, p in enumerate(parts):
        if p == mine:
            continue
        if isinstance(p, tuple) and len(p) == 3 and p[0] == "ad_create":
            bad.append(f"team rank {r} created ({_DT_NAMES.get(p[1], p[1])}, {_op_names(p[2])})")
        else:
            bad.append(f"team rank {r} entered another collective")
    if bad:
        raise ArgumentError(f"ad_create is collective and the members disagree: this rank (team "
                            f"rank {tm.c.rank}) created ({_DT_NAMES[dt]}, {_op_names(ops)}); "
                            + "; ".join(bad))
    return 0


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

    def __class_getitem__(cls, item):
        """``AtomicDomain[int]``, ``AtomicDomain[float]`` in annotations (the
        stubs make the domain generic in its value type)."""
        return types.GenericAlias(cls, item)

    @staticmethod
    cdef AtomicDomain _make(Team tm, object dt, object ops, object flags):
        """``dt``, ``ops``, ``flags``: exact ints (any size), checked here."""
        tm.check_alive()
        if dt not in _DT_NAMES:
            raise ArgumentError(f"ad_create: unknown atomic data type dt={dt}; use DT_I32, DT_U32, "
                                "DT_I64, DT_U64, DT_FLT or DT_DBL")
        if ops > 0 and ops & OP_MULT and not ops & ~(_ALL_OPS | OP_MULT):
            raise ArgumentError(f"ad_create: ops={ops:#x} holds OP_MULT, a collective reduction "
                                "(allreduce, reduce), "
                                "not an atomic operation; atomics take OP_SET, OP_GET, OP_SWAP, "
                                "OP_(F)CAS and the (F)ADD/SUB/INC/DEC/MIN/MAX/AND/OR/XOR family")
        if ops == 0 or ops & ~_ALL_OPS:
            raise ArgumentError(f"ad_create: ops={ops:#x} must be a non-empty or-combination of "
                                "OP_* flags")
        if dt in (DT_FLT, DT_DBL) and ops & _BITWISE:
            raise ArgumentError(f"ad_create: bitwise ops ({_op_names(ops & _BITWISE)}) are not "
                                f"defined for {_DT_NAMES[dt]}")
        if not tm._pair:
            _ad_agree(tm, dt, ops)
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

    cdef object _do(self, str sig, object rank_obj, object addr_obj, object op_obj,
                    object a, object b, int mode):
        """Run one op; the fetched value (or None), or for mode GX_NB an Event.
        ``sig`` names the call for messages."""
        cdef gx_val va, vb, res
        cdef int code, rc, dt = self.dt
        cdef void* nop = NULL
        if self.destroyed:
            raise StateError("the atomic domain has been destroyed")
        cdef int rank = _as_rank(rank_obj, sig, &self.team.c)
        cdef uintptr_t addr = _as_addr(addr_obj, sig, "addr")
        cdef int op = _as_op(op_obj, sig, self.ops)
        code = _bit_index(op)
        if addr & (gx_dt_size(dt) - 1):
            raise BoundsError(f"atomic: address 0x{addr:x} is not aligned to {gx_dt_size(dt)} bytes")
        va.u64 = 0
        vb.u64 = 0
        res.u64 = 0
        if not op & _C_NO_OPERAND:
            _to_val(dt, a, &va, sig, "operand1")
        if op & _C_TWO_OPERANDS:
            _to_val(dt, b, &vb, sig, "operand2")
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

    def op(self, rank, addr, op, operand1=None, operand2=None):
        """Blocking atomic: perform ``op`` on the object at ``addr`` of team
        rank ``rank``; return the old value for fetching ops, else None.
        CAS/FCAS: operand1 is compared, operand2 is swapped in.  Operands are
        ints (anything with ``__index__``) for the integer types and real
        numbers (int, float, numpy scalars) for DT_FLT/DT_DBL."""
        return self._do("AtomicDomain.op(rank, addr, op, operand1=None, operand2=None)",
                        rank, addr, op, operand1, operand2, GX_BLOCKING)

    def op_nb(self, rank, addr, op, operand1=None, operand2=None):
        """Non-blocking atomic (``gex_AD_OpNB``): an Event whose result is the
        fetched value (None for non-fetching ops)."""
        r = self._do("AtomicDomain.op_nb(rank, addr, op, operand1=None, operand2=None)",
                     rank, addr, op, operand1, operand2, GX_NB)
        if isinstance(r, Event):
            return r
        return _done_event(r)

    def op_nbi(self, rank, addr, op, operand1=None, operand2=None, result=None):
        """Implicit-event atomic (``gex_AD_OpNBI``); a fetching op writes the
        old value into ``result`` (a writable buffer of the domain's type size)."""
        sig = "AtomicDomain.op_nbi(rank, addr, op, operand1=None, operand2=None, result=None)"
        mv = None
        dev = None
        if self.destroyed:
            raise StateError("the atomic domain has been destroyed")
        op = _as_op(op, sig, self.ops)
        if op & _FETCHING:
            if result is None:
                raise ArgumentError("a fetching op issued NBI needs a result= buffer")
            # check the result buffer before the op runs: never lose a fetched value
            if _is_device_array(result):      # CuPy arrays have a buffer slot that refuses
                dev = _device_result(result, gx_dt_size(self.dt), sig)
            else:
                try:
                    mv = memoryview(result).cast("B")
                except (TypeError, ValueError) as e:
                    raise TypeError(f"result must be a writable contiguous buffer: {e}") from None
                if mv.readonly or mv.nbytes < gx_dt_size(self.dt):
                    raise ArgumentError(f"result must be a writable buffer of at least "
                                        f"{gx_dt_size(self.dt)} bytes")
        # fetching ops complete here (the value must land in result); others are implicit
        v = self._do(sig, rank, addr, op, operand1, operand2,
                     GX_BLOCKING if (mv is not None or dev is not None) else GX_NBI)
        if mv is not None:
            struct.pack_into(_DT_FORMATS[self.dt], mv, 0, v)
        elif dev is not None:
            word = bytearray(gx_dt_size(self.dt))
            struct.pack_into(_DT_FORMATS[self.dt], word, 0, v)
            (<MemoryKind>dev[0]).impl.copy(dev[1], <uintptr_t>PyByteArray_AS_STRING(word), len(word))


cdef tuple _device_result(object result, size_t size, str sig):
    """(kind, address) of a device array given as an atomic's result buffer
    (a CuPy array, a torch tensor): the fetched value is copied there."""
    p, n = _device_range(result, f"{_fn(sig)}: result")
    if n < size:
        raise ArgumentError(f"result must be a writable buffer of at least {size} bytes")
    mk = (<Client>_client)._kind_of_pointer(p, True) if _client is not None else None
    if mk is None:
        raise ArgumentError(f"{_fn(sig)}: result was given as device memory but is host memory; "
                            "pass it as a host buffer")
    return (mk, p)


cdef int _bit_index(int op) noexcept:
    cdef int i = 0
    while not (op & 1):
        op >>= 1
        i += 1
    return i


cdef str _op_names(long long mask):
    """'OP_FADD | OP_GET' for a mask of OP_* flags."""
    return " | ".join([n for f, n in _OP_NAMES.items() if mask & f]) or "no ops"


cdef inline int _as_op(object x, str sig, int allowed) except -1:
    """One OP_* flag that is in the domain's op set ``allowed``."""
    cdef long long v
    if type(x) is int and _exact_int_ll(x, &v) and 0 < v and not v & (v - 1) and v & allowed:
        return <int>v
    return _op_slow(x, sig, allowed)


cdef int _op_slow(object x, str sig, int allowed) except -1:
    """_as_op for anything but a valid op given as an exact int: numpy
    integers, or the error that names what is wrong."""
    cdef long long v = -1
    if type(x) is int:
        if not _exact_int_ll(x, &v):
            v = -1
    else:
        i = _as_int(x, sig, "op", False)
        if 0 < i <= _C_ALL_OPS:
            v = i
    if 0 < v <= _C_ALL_OPS and not v & (v - 1):
        if v & allowed:
            return <int>v
        raise ArgumentError(f"{_fn(sig)}: op {_op_names(v)} is not in this domain's op set "
                            f"({_op_names(allowed)})")
    raise ArgumentError(f"{_fn(sig)}: op must be one OP_* flag, got {_got(x)}")


# each integer type's range, for messages
_DT_RANGES = {GX_DT_I32: (-2**31, 2**31 - 1), GX_DT_U32: (0, 2**32 - 1),
              GX_DT_I64: (-2**63, 2**63 - 1), GX_DT_U64: (0, 2**64 - 1)}


cdef int _to_val(int dt, object x, gx_val* v, str sig, str what) except -1:
    """An operand for a domain of type ``dt``: an int (through __index__) in
    the type's range for integer types, a real number for FLT/DBL (not str,
    bytes or None: float('1.5') would silently parse them)."""
    cdef bint fits
    cdef long long i
    cdef double d
    cdef float f
    if x is None:
        raise ArgumentError(f"{_fn(sig)}: {what} is required for this op")
    if dt == GX_DT_FLT or dt == GX_DT_DBL:
        if type(x) is float:
            d = x
        elif type(x) is int or isinstance(x, numbers.Real):
            try:
                d = float(x)
            except OverflowError:
                raise OverflowError(f"{_fn(sig)}: {what}={x} does not fit {_DT_NAMES[dt]}") from None
        else:
            raise TypeError(f"{_fn(sig)}: {what} must be a real number (int, float) for "
                            f"{_DT_NAMES[dt]} (got {_got(x)})")
        if dt == GX_DT_DBL:
            v.dbl = d
            return 0
        f = <float>d
        if isinf(f) and not isinf(d):
            raise OverflowError(f"{_fn(sig)}: {what}={x} does not fit FLT (its magnitude is "
                                "above 3.4e38)")
        v.flt = f
        return 0
    if type(x) is int:
        fits = _exact_int_ll(x, &i)
    else:
        try:
            x = _as_int(x, sig, what)
        except TypeError:
            raise TypeError(f"{_fn(sig)}: {what} must be an int for {_DT_NAMES[dt]} "
                            f"(got {_got(x)})") from None
        fits = _exact_int_ll(x, &i)
    if dt == GX_DT_I64 and fits:
        v.i64 = i
        return 0
    if dt == GX_DT_U64 and fits and i >= 0:
        v.u64 = <uint64_t>i
        return 0
    if dt == GX_DT_I32 and fits and -2147483648 <= i <= 2147483647:
        v.i32 = <int32_t>i
        return 0
    if dt == GX_DT_U32 and fits and 0 <= i <= 0xFFFFFFFF:
        v.u32 = <uint32_t>i
        return 0
    if dt == GX_DT_U64 and 0 <= x <= 0xFFFFFFFFFFFFFFFF:
        v.u64 = PyLong_AsUnsignedLongLong(x)
        return 0
    lo, hi = _DT_RANGES[dt]
    raise OverflowError(f"{_fn(sig)}: {what}={x} does not fit {_DT_NAMES[dt]} ({lo}..{hi})")


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
