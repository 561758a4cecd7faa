# ---------------------------------------------------------------------------
# Device atomics and copy kernels from embedded PTX
# ---------------------------------------------------------------------------
# Hand-written PTX (ISA 6.0, sm_70 and newer; the driver JIT-compiles it for
# the device on cuModuleLoadData, once per kind).  One kernel per gexmk data
# type, gx_atomic_<dt>(addr, prim, a, b, result): one atom.global op on addr,
# system scope, acq_rel, the old value stored at `result` unless it is 0.
# The host maps the GX_OP_* onto eight primitives (SUB/INC/DEC become ADD of
# -a / 1 / -1, GET an OR of 0, SET an EXCH whose result nobody reads), as
# gexmk.h's host atomics do, so both give the same results bit for bit:
# integer arithmetic wraps; float CAS compares representations; float MIN/MAX
# are a CAS loop computing (a < old ? a : old) / (a > old ? a : old).
_PTX_HEAD = """.version 6.0
.target sm_70
.address_size 64
"""
_PTX_KERNEL = """
.visible .entry gx_atomic_{name}(.param .u64 p_addr, .param .u32 p_prim, .param .u64 p_a,
                                .param .u64 p_b, .param .u64 p_res)
{{
    .reg .pred %p<3>;
    .reg .b32 %prim;
    .reg .b64 %addr, %res, %a64, %b64;
    .reg .b{w} %a, %b, %old, %cur, %new;
    ld.param.u64 %addr, [p_addr];
    cvta.to.global.u64 %addr, %addr;
    ld.param.u32 %prim, [p_prim];
    ld.param.u64 %a64, [p_a];
    ld.param.u64 %b64, [p_b];
    {narrow}
    setp.eq.u32 %p1, %prim, 0;
    @%p1 bra L_EXCH;
    setp.eq.u32 %p1, %prim, 1;
    @%p1 bra L_CAS;
    setp.eq.u32 %p1, %prim, 2;
    @%p1 bra L_ADD;
    setp.eq.u32 %p1, %prim, 3;
    @%p1 bra L_AND;
    setp.eq.u32 %p1, %prim, 4;
    @%p1 bra L_OR;
    setp.eq.u32 %p1, %prim, 5;
    @%p1 bra L_XOR;
    setp.eq.u32 %p1, %prim, 6;
    @%p1 bra L_MIN;
    setp.eq.u32 %p1, %prim, 7;
    @%p1 bra L_MAX;
    bra.uni L_END;
L_EXCH:
    atom.acq_rel.sys.global.exch.b{w} %old, [%addr], %a;
    bra.uni L_STORE;
L_CAS:
    atom.acq_rel.sys.global.cas.b{w} %old, [%addr], %a, %b;
    bra.uni L_STORE;
L_ADD:
    atom.acq_rel.sys.global.add.{add} %old, [%addr], %a;
    bra.uni L_STORE;
L_AND:
    atom.acq_rel.sys.global.and.b{w} %old, [%addr], %a;
    bra.uni L_STORE;
L_OR:
    atom.acq_rel.sys.global.or.b{w} %old, [%addr], %a;
    bra.uni L_STORE;
L_XOR:
    atom.acq_rel.sys.global.xor.b{w} %old, [%addr], %a;
    bra.uni L_STORE;
{minmax}
L_STORE:
    ld.param.u64 %res, [p_res];
    setp.eq.u64 %p1, %res, 0;
    @%p1 bra L_END;
    st.b{w} [%res], %old;
L_END:
    ret;
}}
"""
_PTX_MINMAX_INT = """L_MIN:
    atom.acq_rel.sys.global.min.{t} %old, [%addr], %a;
    bra.uni L_STORE;
L_MAX:
    atom.acq_rel.sys.global.max.{t} %old, [%addr], %a;
    bra.uni L_STORE;"""
# Floating-point min/max: a compare-and-swap loop on the representation,
# new = (a < old ? a : old) / (a > old ? a : old), as gexmk.h does on the host.
_PTX_MINMAX_FP = """L_MIN:
    ld.relaxed.sys.global.b{w} %cur, [%addr];
L_MIN_LOOP:
    setp.lt.{t} %p2, %a, %cur;
    selp.b{w} %new, %a, %cur, %p2;
    atom.acq_rel.sys.global.cas.b{w} %old, [%addr], %cur, %new;
    setp.ne.b{w} %p2, %old, %cur;
    mov.b{w} %cur, %old;
    @%p2 bra L_MIN_LOOP;
    bra.uni L_STORE;
L_MAX:
    ld.relaxed.sys.global.b{w} %cur, [%addr];
L_MAX_LOOP:
    setp.gt.{t} %p2, %a, %cur;
    selp.b{w} %new, %a, %cur, %p2;
    atom.acq_rel.sys.global.cas.b{w} %old, [%addr], %cur, %new;
    setp.ne.b{w} %p2, %old, %cur;
    mov.b{w} %cur, %old;
    @%p2 bra L_MAX_LOOP;
    bra.uni L_STORE;"""


# Small device-to-device copies (<= 64 B): one thread, byte by byte.  With a
# stream synchronisation after it, a kernel launch can cost less than a
# copy-engine copy of a few bytes (bench/cuda/driver_baseline.c measures both).
_PTX_COPY = """
.visible .entry gx_copy_small(.param .u64 p_dst, .param .u64 p_src, .param .u32 p_n)
{
    .reg .pred %p;
    .reg .b16 %c;
    .reg .b32 %n, %i;
    .reg .b64 %d, %s, %o, %da, %sa;
    ld.param.u64 %d, [p_dst];
    ld.param.u64 %s, [p_src];
    ld.param.u32 %n, [p_n];
    cvta.to.global.u64 %d, %d;
    cvta.to.global.u64 %s, %s;
    mov.u32 %i, 0;
L_COPY_NEXT:
    setp.ge.u32 %p, %i, %n;
    @%p bra L_COPY_END;
    cvt.u64.u32 %o, %i;
    add.u64 %sa, %s, %o;
    add.u64 %da, %d, %o;
    ld.global.u8 %c, [%sa];
    st.global.u8 [%da], %c;
    add.u32 %i, %i, 1;
    bra.uni L_COPY_NEXT;
L_COPY_END:
    ret;
}
"""


# Lists of copies (copy_gather, issue 22's KV-cache shape): one descriptor of three
# 64-bit words (dst, src, bytes) per copy, in device memory.  Block b takes
# descriptors b, b + gridDim, ...: three of its threads read one into shared
# memory, then all of them copy it, 16
# bytes a load (four loads in flight per thread) where dst, src and the length are
# all 16-byte aligned, else byte by byte.
_PTX_LIST = """
.visible .entry gx_copy_list(.param .u64 p_desc, .param .u32 p_count)
{
    .shared .align 16 .b64 s_desc[3];
    .reg .pred %p<4>;
    .reg .b16 %c;
    .reg .b32 %i, %cnt, %nct, %tx, %nt;
    .reg .b32 %a<4>, %b<4>, %e<4>, %f<4>;
    .reg .b64 %desc, %de, %d, %s, %n, %o, %st, %st2, %st3, %st4, %x, %y, %z;
    ld.param.u64 %desc, [p_desc];
    ld.param.u32 %cnt, [p_count];
    cvta.to.global.u64 %desc, %desc;
    mov.u32 %i, %ctaid.x;
    mov.u32 %nct, %nctaid.x;
    mov.u32 %tx, %tid.x;
    mov.u32 %nt, %ntid.x;
    setp.lt.u32 %p3, %tx, 3;
L_LIST_NEXT:
    setp.ge.u32 %p0, %i, %cnt;
    @%p0 bra L_LIST_END;
    @!%p3 bra L_LIST_READ;
    mul.wide.u32 %de, %i, 24;
    add.u64 %de, %desc, %de;
    mul.wide.u32 %x, %tx, 8;
    add.u64 %de, %de, %x;
    ld.global.u64 %y, [%de];
    mov.u64 %z, s_desc;
    add.u64 %z, %z, %x;
    st.shared.u64 [%z], %y;
L_LIST_READ:
    bar.sync 0;
    ld.shared.u64 %d, [s_desc];
    ld.shared.u64 %s, [s_desc+8];
    ld.shared.u64 %n, [s_desc+16];
    cvta.to.global.u64 %d, %d;
    cvta.to.global.u64 %s, %s;
    or.b64 %x, %d, %s;
    or.b64 %x, %x, %n;
    and.b64 %x, %x, 15;
    setp.ne.u64 %p1, %x, 0;
    cvt.u64.u32 %o, %tx;
    @%p1 bra L_LIST_BYTES;
    shl.b64 %o, %o, 4;
    mul.wide.u32 %st, %nt, 16;
    add.u64 %st2, %st, %st;
    add.u64 %st3, %st2, %st;
    add.u64 %st4, %st2, %st2;
L_LIST_V4:
    add.u64 %x, %o, %st3;
    setp.ge.u64 %p2, %x, %n;
    @%p2 bra L_LIST_V1;
    add.u64 %x, %s, %o;
    ld.global.v4.u32 {%a0, %a1, %a2, %a3}, [%x];
    add.u64 %y, %x, %st;
    ld.global.v4.u32 {%b0, %b1, %b2, %b3}, [%y];
    add.u64 %y, %x, %st2;
    ld.global.v4.u32 {%e0, %e1, %e2, %e3}, [%y];
    add.u64 %y, %x, %st3;
    ld.global.v4.u32 {%f0, %f1, %f2, %f3}, [%y];
    add.u64 %z, %d, %o;
    st.global.v4.u32 [%z], {%a0, %a1, %a2, %a3};
    add.u64 %y, %z, %st;
    st.global.v4.u32 [%y], {%b0, %b1, %b2, %b3};
    add.u64 %y, %z, %st2;
    st.global.v4.u32 [%y], {%e0, %e1, %e2, %e3};
    add.u64 %y, %z, %st3;
    st.global.v4.u32 [%y], {%f0, %f1, %f2, %f3};
    add.u64 %o, %o, %st4;
    bra.uni L_LIST_V4;
L_LIST_V1:
    setp.ge.u64 %p2, %o, %n;
    @%p2 bra L_LIST_STEP;
    add.u64 %x, %s, %o;
    ld.global.v4.u32 {%a0, %a1, %a2, %a3}, [%x];
    add.u64 %z, %d, %o;
    st.global.v4.u32 [%z], {%a0, %a1, %a2, %a3};
    add.u64 %o, %o, %st;
    bra.uni L_LIST_V1;
L_LIST_BYTES:
    cvt.u64.u32 %st, %nt;
L_LIST_B1:
    setp.ge.u64 %p2, %o, %n;
    @%p2 bra L_LIST_STEP;
    add.u64 %x, %s, %o;
    ld.global.u8 %c, [%x];
    add.u64 %z, %d, %o;
    st.global.u8 [%z], %c;
    add.u64 %o, %o, %st;
    bra.uni L_LIST_B1;
L_LIST_STEP:
    bar.sync 0;
    add.u32 %i, %i, %nct;
    bra.uni L_LIST_NEXT;
L_LIST_END:
    ret;
}
"""


cdef str _ptx_source():
    out = [_PTX_HEAD, _PTX_COPY, _PTX_LIST]
    for name, w, add, mm, fp in (("i32", 32, "u32", "s32", False), ("u32", 32, "u32", "u32", False),
                                  ("i64", 64, "u64", "s64", False), ("u64", 64, "u64", "u64", False),
                                  ("flt", 32, "f32", "f32", True), ("dbl", 64, "f64", "f64", True)):
        narrow = ("cvt.u32.u64 %a, %a64;\n    cvt.u32.u64 %b, %b64;" if w == 32
                  else "mov.b64 %a, %a64;\n    mov.b64 %b, %b64;")
        minmax = (_PTX_MINMAX_FP if fp else _PTX_MINMAX_INT).format(w=w, t=mm)
        out.append(_PTX_KERNEL.format(name=name, w=w, add=add, narrow=narrow, minmax=minmax))
    return "".join(out)


cdef bytes _PTX = _ptx_source().encode() + b"\0"
cdef const char* _PTX_IMAGE = _PTX
cdef const char* _ATOMIC_KERNELS[6]
_ATOMIC_KERNELS[:] = [b"gx_atomic_i32", b"gx_atomic_u32", b"gx_atomic_i64", b"gx_atomic_u64",
                      b"gx_atomic_flt", b"gx_atomic_dbl"]

cdef enum:                      # the kernels' primitives
    PRIM_EXCH = 0
    PRIM_CAS = 1
    PRIM_ADD = 2
    PRIM_AND = 3
    PRIM_OR = 4
    PRIM_XOR = 5
    PRIM_MIN = 6
    PRIM_MAX = 7


def atomic_ptx() -> str:
    """The PTX source of the device atomics (for inspection and tests)."""
    return _PTX[:len(_PTX) - 1].decode()


cdef int _atomics_load(CudaCtx* k) except -1 nogil:
    """Load the atomics module and the synchronous result word once; the
    kind's context is current and k.lock is held."""
    cdef CUmodule mod = NULL
    cdef int i
    cdef CUresult rc
    if k.atom_mod != NULL:
        return 0
    if k.atom_res == NULL:
        check("cuMemHostAlloc", cydriver.cuMemHostAlloc(&k.atom_res, 64,
                                                        cydriver.CU_MEMHOSTALLOC_PORTABLE))
    check("cuModuleLoadData", cydriver.cuModuleLoadData(&mod, _PTX_IMAGE))
    for i in range(GX_DT_COUNT):
        rc = cydriver.cuModuleGetFunction(&k.atom_fn[i], mod, _ATOMIC_KERNELS[i])
        if rc != CUDA_SUCCESS:
            cydriver.cuModuleUnload(mod)
            return check("cuModuleGetFunction", rc)
    rc = cydriver.cuModuleGetFunction(&k.copy_fn, mod, b"gx_copy_small")
    if rc == CUDA_SUCCESS:
        rc = cydriver.cuModuleGetFunction(&k.list_fn, mod, b"gx_copy_list")
    if rc != CUDA_SUCCESS:
        cydriver.cuModuleUnload(mod)
        return check("cuModuleGetFunction", rc)
    k.atom_mod = mod
    return 0


cdef int _cu_copy_small(void* kctx, void* stream, uintptr_t dst, uintptr_t src,
                        size_t n) except -1 nogil:
    """dst <- src, n <= 64 bytes, both device memory this kind's device
    reaches (its own, or mapped for it), by a one-thread kernel instead of the
    copy engine.  stream NULL: on the kind's internal stream, complete on return."""
    cdef CudaCtx* k = <CudaCtx*>kctx
    cdef CUstream s = <CUstream>stream
    cdef uint32_t nb = <uint32_t>n
    cdef void* params[3]
    if k == NULL or k.closed:
        return _closed(k)
    if n > 64:
        with gil:
            raise ArgumentError(f"copy_small: at most 64 bytes, got {n}")
    if n == 0:
        return 0
    params[0] = &dst
    params[1] = &src
    params[2] = &nb
    _push(k)
    try:
        k.lock.lock()
        try:
            _atomics_load(k)
        finally:
            k.lock.unlock()
        check("cuLaunchKernel", cydriver.cuLaunchKernel(
            k.copy_fn, 1, 1, 1, 1, 1, 1, 0, k.sync_stream if s == NULL else s, params, NULL))
        if s == NULL:
            check("cuStreamSynchronize", cydriver.cuStreamSynchronize(k.sync_stream))
    finally:
        _pop(k)
    return 0


cdef inline uint64_t _bits(int dt, gx_val v) noexcept nogil:
    """The operand's representation, zero-extended to 64 bits."""
    if gx_dt_size(dt) == 4:
        return v.u32
    return v.u64


cdef inline uint64_t _neg(int dt, uint64_t x) noexcept nogil:
    """-x in the type's representation (floats: flip the sign bit)."""
    if dt == GX_DT_FLT:
        return x ^ 0x80000000ULL
    if dt == GX_DT_DBL:
        return x ^ 0x8000000000000000ULL
    return (0 - x) & (0xFFFFFFFFULL if gx_dt_size(dt) == 4 else 0xFFFFFFFFFFFFFFFFULL)


cdef inline uint64_t _one(int dt, bint minus) noexcept nogil:
    cdef gx_val v
    v.u64 = 0
    if dt == GX_DT_FLT:
        v.flt = -1.0 if minus else 1.0
    elif dt == GX_DT_DBL:
        v.dbl = -1.0 if minus else 1.0
    else:
        return _neg(dt, 1) if minus else 1
    return _bits(dt, v)


cdef int cuda_atomic(void* kctx, void* stream, uintptr_t addr, int dt, int op,
                     gx_val a, gx_val b, void* result) except -1 nogil:
    """Device atomic `op` of type `dt` on the naturally aligned object at
    device address `addr` (this kind's device, or memory mapped for it), with
    operands a (CAS: compare) and b (CAS: swap); the old value goes to
    `result` (gx_dt_size(dt) bytes; NULL: not wanted).

    stream NULL: synchronous; `result` may be any host address.  Else the
    kernel is only issued on `stream` (of this kind's context) and `result`
    must be device-accessible (device or pinned host memory), written when
    the stream reaches the kernel.  Atomic with respect to every other
    gexmk device atomic on the same memory (system scope)."""
    cdef CudaCtx* k = <CudaCtx*>kctx
    cdef uint64_t pa = _bits(dt, a), pb = _bits(dt, b), pres
    cdef uint32_t prim
    cdef void* params[5]
    cdef CUstream s = <CUstream>stream
    cdef CUresult rc
    cdef size_t n
    cdef bint locked = False
    if k == NULL or k.closed:
        return _closed(k)
    if not gx_op_valid(dt, op):
        with gil:
            raise ArgumentError(f"cuda atomic: op {op} is not defined for data type {dt} "
                                "(bitwise ops are integer-only; see GX_DT_* and GX_OP_*)")
    n = gx_dt_size(dt)
    if addr % n != 0 or addr == 0:
        with gil:
            raise ArgumentError(f"cuda atomic: {addr:#x} is not a {n}-byte aligned address")
    if op == GX_OP_SET or op == GX_OP_SWAP:
        prim = PRIM_EXCH
    elif op == GX_OP_GET:
        prim, pa = PRIM_OR, 0
    elif op == GX_OP_CAS or op == GX_OP_FCAS:
        prim = PRIM_CAS
    elif op == GX_OP_ADD or op == GX_OP_FADD:
        prim = PRIM_ADD
    elif op == GX_OP_SUB or op == GX_OP_FSUB:
        prim, pa = PRIM_ADD, _neg(dt, pa)
    elif op == GX_OP_INC or op == GX_OP_FINC:
        prim, pa = PRIM_ADD, _one(dt, False)
    elif op == GX_OP_DEC or op == GX_OP_FDEC:
        prim, pa = PRIM_ADD, _one(dt, True)
    elif op == GX_OP_AND or op == GX_OP_FAND:
        prim = PRIM_AND
    elif op == GX_OP_OR or op == GX_OP_FOR:
        prim = PRIM_OR
    elif op == GX_OP_XOR or op == GX_OP_FXOR:
        prim = PRIM_XOR
    elif op == GX_OP_MIN or op == GX_OP_FMIN:
        prim = PRIM_MIN
    else:
        prim = PRIM_MAX
    params[0] = &addr
    params[1] = &prim
    params[2] = &pa
    params[3] = &pb
    params[4] = &pres
    _push(k)
    try:
        k.lock.lock()
        locked = True
        _atomics_load(k)
        if s != NULL:
            k.lock.unlock()          # the module stays loaded: launches need no lock
            locked = False
            _same_context(k, s)
            pres = <uint64_t><uintptr_t>result
            check("cuLaunchKernel", cydriver.cuLaunchKernel(
                k.atom_fn[dt], 1, 1, 1, 1, 1, 1, 0, s, params, NULL))
        else:
            # the shared pinned result word: one synchronous atomic at a time per kind
            pres = <uint64_t><uintptr_t>k.atom_res
            check("cuLaunchKernel", cydriver.cuLaunchKernel(
                k.atom_fn[dt], 1, 1, 1, 1, 1, 1, 0, k.sync_stream, params, NULL))
            check("cuStreamSynchronize", cydriver.cuStreamSynchronize(k.sync_stream))
            if result != NULL:
                memcpy(result, k.atom_res, n)
    finally:
        if locked:
            k.lock.unlock()
        _pop(k)
    return 0


cdef int _same_context(CudaCtx* k, CUstream s) except -1 nogil:
    """A user's stream must belong to the context whose module runs the atomic:
    a stream of another GPU's context gets CUDA_ERROR_INVALID_HANDLE at launch
    (a host-staged peer segment is driven on its own GPU, not the caller's)."""
    cdef CUcontext c = NULL
    if cydriver.cuStreamGetCtx(s, &c) == CUDA_SUCCESS and c != k.ctx:
        with gil:
            raise UnsupportedError(
                f"cuda atomic on a stream: the stream belongs to another context than the one "
                f"of device {k.ordinal}, where this segment's atomics run (a segment reached "
                f"host-staged, or mapped for another GPU); use a stream of device {k.ordinal} "
                f"or a path with a mapping for the stream's GPU")
    return 0


cdef object _OP_NAMES = {
    "set": GX_OP_SET, "get": GX_OP_GET, "swap": GX_OP_SWAP, "cas": GX_OP_CAS,
    "fcas": GX_OP_FCAS, "add": GX_OP_ADD, "fadd": GX_OP_FADD, "sub": GX_OP_SUB,
    "fsub": GX_OP_FSUB, "inc": GX_OP_INC, "finc": GX_OP_FINC, "dec": GX_OP_DEC,
    "fdec": GX_OP_FDEC, "and": GX_OP_AND, "fand": GX_OP_FAND, "or": GX_OP_OR,
    "for": GX_OP_FOR, "xor": GX_OP_XOR, "fxor": GX_OP_FXOR, "min": GX_OP_MIN,
    "fmin": GX_OP_FMIN, "max": GX_OP_MAX, "fmax": GX_OP_FMAX}
cdef object _DT_NAMES = {"i32": GX_DT_I32, "u32": GX_DT_U32, "i64": GX_DT_I64,
                         "u64": GX_DT_U64, "flt": GX_DT_FLT, "dbl": GX_DT_DBL}
cdef object _FETCHING = {GX_OP_GET, GX_OP_SWAP, GX_OP_FCAS, GX_OP_FADD, GX_OP_FSUB,
                         GX_OP_FINC, GX_OP_FDEC, GX_OP_FAND, GX_OP_FOR, GX_OP_FXOR,
                         GX_OP_FMIN, GX_OP_FMAX}


cdef int _named(object v, str name, dict names, int hi) except -1:
    if isinstance(v, str):
        try:
            return names[v.lower()]
        except KeyError:
            raise ArgumentError(f"{name} {v!r} is not one of {sorted(names)}") from None
    return _index(v, name, 0, hi)


cdef gx_val _operand(int dt, object v, str name) except *:
    cdef gx_val out
    out.u64 = 0
    if dt == GX_DT_FLT:
        out.flt = float(v)
    elif dt == GX_DT_DBL:
        out.dbl = float(v)
    elif dt == GX_DT_I32:
        out.i32 = _index(v, name, -2 ** 31, 2 ** 31 - 1)
    elif dt == GX_DT_U32:
        out.u32 = _index(v, name, 0, 2 ** 32 - 1)
    elif dt == GX_DT_I64:
        out.i64 = _index(v, name, -2 ** 63, 2 ** 63 - 1)
    else:
        out.u64 = _index(v, name, 0, 2 ** 64 - 1)
    return out


cdef object _value(int dt, gx_val v):
    if dt == GX_DT_FLT:
        return v.flt
    if dt == GX_DT_DBL:
        return v.dbl
    if dt == GX_DT_I32:
        return v.i32
    if dt == GX_DT_U32:
        return v.u32
    if dt == GX_DT_I64:
        return v.i64
    return v.u64
