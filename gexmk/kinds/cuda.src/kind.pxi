# ---------------------------------------------------------------------------
# The gx_kind_ops table, CudaKind and Allocation (the Python face of the slots)
# ---------------------------------------------------------------------------
cdef gx_kind_ops _OPS
_OPS.name = b"cuda_uva"
_OPS.cls = GX_MK_CUDA_UVA
_OPS.alloc = _cu_alloc
_OPS.grow = _cu_grow
_OPS.release = _cu_release
_OPS.adopt = _cu_adopt
_OPS.export = _cu_export
_OPS.import_ = _cu_import
_OPS.unmap = _cu_unmap
_OPS.copy = _cu_copy
_OPS.host_register = _cu_host_register
_OPS.classify = _cu_classify
_OPS.stream_create = _cu_stream_create
_OPS.stream_destroy = _cu_stream_destroy
_OPS.event_record = _cu_event_record
_OPS.event_query = _cu_event_query
_OPS.event_sync = _cu_event_sync
_OPS.event_destroy = _cu_event_destroy
_OPS.atomic = cuda_atomic
_OPS.host_pinned = _cu_host_pinned
_OPS.write_value = _cu_write_value
_OPS.copy_small = _cu_copy_small
_OPS.stream_wait = _cu_stream_wait
_OPS.stream_capturing = _cu_stream_capturing
_OPS.wait_value = _cu_wait_value
_OPS.launch_host = _cu_launch_host
_OPS.copy_batch = _cu_copy_batch
_OPS.copy_strided = _cu_copy_strided
_OPS.copy_gather = _cu_copy_gather

cdef object _UINTPTR_MAX = <uintptr_t>-1
cdef object _SIZE_MAX = <size_t>-1


cdef object _context_arg(object context):
    if context is None:
        return 0
    try:
        v = operator.index(context)
    except TypeError:
        # cuda.bindings' CUcontext (also what cuda.core's Context.handle is) has __int__ only
        if type(context).__name__ != "CUcontext":
            raise TypeError(f"context must be None (the device's primary context) or a "
                            f"CUcontext handle as an int, not {type(context).__name__}") from None
        v = int(context)
    if v <= 0 or v > _UINTPTR_MAX:
        raise ArgumentError(f"context must be a non-NULL CUcontext handle, got {v:#x}")
    return v


cdef class CudaKind:
    """The CUDA_UVA memory kind on one device and one context: the
    ``gx_kind_ops`` table of ``gexmk/kinds/kind.pxd`` plus its context.

    ``CudaKind(device=0, context=None)``: ``context=None`` retains the
    device's primary context (released by :meth:`close`); an int is a
    ``CUcontext`` handle owned by the caller (cuda.core, CuPy, ...), which
    must belong to ``device`` and stay alive until :meth:`close`.  No call
    changes the calling thread's current context: the kind pushes its own
    around each driver call and pops it again.

    Raises :class:`~gexmk.errors.UnsupportedError` without a driver, a
    device, or unified addressing; :class:`~gexmk.errors.ArgumentError` for
    a device ordinal that does not exist or a context of another device.
    ``close()`` releases the kind's allocations first and is idempotent; use
    as a context manager.
    """
    cdef CudaCtx* _k
    cdef object _children          # weak set of live Allocations (closed first)
    cdef object __weakref__

    def __cinit__(self, device=0, context=None):
        # allocated first: no CudaKind ever has a NULL _k
        self._k = <CudaCtx*>calloc(1, sizeof(CudaCtx))
        if self._k == NULL:
            raise MemoryError()
        self._k.closed = True
        self._children = weakref.WeakSet()
        ordinal = _index(device, "device", 0, 2 ** 31 - 1)
        ctx = _context_arg(context)
        _kctx_open(self._k, ordinal, ctx)

    def __dealloc__(self):
        if self._k != NULL:
            _kctx_close(self._k)
            free(self._k)
            self._k = NULL

    cdef CudaCtx* _open(self) except NULL:
        if self._k == NULL or self._k.closed:
            raise StateError("the CUDA kind is closed")
        return self._k

    # -- attributes ---------------------------------------------------------
    @property
    def device(self) -> int:
        """CUDA device ordinal."""
        return self._k.ordinal

    @property
    def context(self) -> int:
        """The ``CUcontext`` the kind works in, as an int (0 once closed)."""
        return <uintptr_t>self._k.ctx

    @property
    def primary(self) -> bool:
        """True when the kind retained the device's primary context."""
        return bool(self._k.primary)

    @property
    def vmm(self) -> bool:
        """The device supports CUDA virtual memory management (needed by :meth:`alloc`)."""
        return bool(self._k.vmm)

    @property
    def posix_fd(self) -> bool:
        """VMM allocations can be exported as POSIX file descriptors."""
        return bool(self._k.posix_fd)

    @property
    def fabric(self) -> bool:
        """The device supports fabric handles (they also need an IMEX channel:
        :meth:`alloc` asks for them and falls back to POSIX FDs alone)."""
        return bool(self._k.fabric)

    @property
    def granularity(self) -> int:
        """Minimum granularity (bytes) of a pinned device allocation with a
        POSIX-FD handle (``cuMemGetAllocationGranularity``); 0 without VMM."""
        return self._k.gran

    @property
    def handle(self) -> int:
        """Address of the kind's C context (the ``kctx`` the table's
        functions take); valid while this object lives."""
        return <uintptr_t>self._k

    @property
    def closed(self) -> bool:
        return self._k == NULL or bool(self._k.closed)

    @property
    def gather_launches(self) -> int:
        """Launches of the gather kernel so far: lists of small device copies (VIS
        vectors and indexed lists between device memory this kind's device reaches)
        go to it instead of the copy engine, unless ``GEXMK_CUDA_GATHER=0``."""
        return 0 if self._k == NULL else self._k.gather_launches

    def ops_capsule(self):
        """A PyCapsule named ``b"gexmk.kind_ops"`` around the module's static
        ``gx_kind_ops`` table; pass :attr:`handle` as each function's kctx."""
        return PyCapsule_New(<void*>&_OPS, b"gexmk.kind_ops", NULL)

    # -- slots, from Python -------------------------------------------------
    def alloc(self, size, reserve=0):
        """Library allocation: ``size`` bytes of zeroed device memory (rounded
        up to the granularity) at the start of ``reserve`` bytes of address
        space (>= size; :meth:`Allocation.grow` maps more there in place)."""
        cdef CudaCtx* k = self._open()
        cdef size_t n = _index(size, "size", 1, _SIZE_MAX)
        cdef size_t r = _index(reserve, "reserve", 0, _SIZE_MAX)
        cdef Allocation a = Allocation._new(self)
        with nogil:
            _cu_alloc(k, n, r, &a.mem)
        self._children.add(a)
        return a

    def adopt(self, ptr, nbytes):
        """Client device memory ``[ptr, ptr + nbytes)`` of this kind's device
        and context; it stays the client's (:meth:`Allocation.release`
        forgets it).  Managed memory and host pointers are refused."""
        cdef CudaCtx* k = self._open()
        cdef uintptr_t p = _index(ptr, "ptr", 0, _UINTPTR_MAX)
        cdef size_t n = _index(nbytes, "nbytes", 1, _SIZE_MAX)
        cdef Allocation a = Allocation._new(self)
        with nogil:
            _cu_adopt(k, p, n, &a.mem)
        self._children.add(a)
        return a

    def import_(self, fds, bytes blob, size=0):
        """Map a peer's :meth:`Allocation.export` (``fds``, ``blob``) here,
        accessible to this kind's device only.  Takes ownership of ``fds``:
        each is closed, whether the import succeeds or not.  ``size``: bytes
        to map (0: the whole exported range).  Undo with ``unmap()``."""
        cdef CudaCtx* k
        cdef gx_export e
        cdef size_t n
        cdef Allocation a
        fds = list(fds)
        memset(&e, 0, sizeof(e))
        try:
            k = self._open()
            n = _index(size, "size", 0, _SIZE_MAX)
            if len(fds) > GX_KIND_MAX_FDS or len(blob) > GX_KIND_BLOB:
                raise ArgumentError(f"import_: at most {GX_KIND_MAX_FDS} fds and "
                                    f"{GX_KIND_BLOB} blob bytes, got {len(fds)} and {len(blob)}")
            for i, fd in enumerate(fds):
                e.fds[i] = _index(fd, "fds[i]", 0, 2 ** 31 - 1)
        except BaseException:
            for fd in fds:
                try:
                    os.close(fd)
                except Exception:
                    pass
            raise
        e.nfds = len(fds)
        e.nblob = len(blob)
        memcpy(e.blob, <const char*>blob, len(blob))
        a = Allocation._new(self)
        with nogil:
            _cu_import(k, &e, n, &a.mem)
        self._children.add(a)
        return a

    def copy(self, dst, src, nbytes, stream=0):
        """``dst <- src``, ``nbytes`` bytes; addresses of device or host memory
        (ints).  ``stream`` 0: complete on return; else a CUstream (int) of
        this kind's context, on which the copy is only issued."""
        cdef CudaCtx* k = self._open()
        cdef uintptr_t d = _index(dst, "dst", 0, _UINTPTR_MAX)
        cdef uintptr_t s = _index(src, "src", 0, _UINTPTR_MAX)
        cdef size_t n = _index(nbytes, "nbytes", 0, _SIZE_MAX)
        cdef uintptr_t st = _index(stream, "stream", 0, _UINTPTR_MAX)
        with nogil:
            _cu_copy(k, <void*>st, d, s, n)

    def host_register(self, ptr, nbytes):
        """Pin host memory ``[ptr, ptr + nbytes)`` (cuMemHostRegister, PORTABLE)."""
        cdef CudaCtx* k = self._open()
        cdef uintptr_t p = _index(ptr, "ptr", 1, _UINTPTR_MAX)
        cdef size_t n = _index(nbytes, "nbytes", 1, _SIZE_MAX)
        with nogil:
            _cu_host_register(k, <void*>p, n, 1)

    def host_unregister(self, ptr):
        """Unpin host memory pinned by :meth:`host_register` at ``ptr``."""
        cdef CudaCtx* k = self._open()
        cdef uintptr_t p = _index(ptr, "ptr", 1, _UINTPTR_MAX)
        with nogil:
            _cu_host_register(k, <void*>p, 0, 0)

    def classify(self, ptr) -> tuple:
        """``(cls, device)``: ``(GX_MK_CUDA_UVA = 1, ordinal)`` for device or
        managed memory, ``(GX_MK_HOST = 0, -1)`` for host and unknown pointers."""
        cdef CudaCtx* k = self._open()
        cdef uintptr_t p = _index(ptr, "ptr", 0, _UINTPTR_MAX)
        cdef int cls = 0, dev = -1
        with nogil:
            _cu_classify(k, p, &cls, &dev)
        return cls, dev

    def stream_create(self) -> int:
        """A new non-blocking stream (CUstream as an int), owned by the caller."""
        cdef CudaCtx* k = self._open()
        cdef void* s = NULL
        with nogil:
            _cu_stream_create(k, &s)
        return <uintptr_t>s

    def stream_destroy(self, stream):
        cdef CudaCtx* k = self._open()
        cdef uintptr_t s = _index(stream, "stream", 0, _UINTPTR_MAX)
        with nogil:
            _cu_stream_destroy(k, <void*>s)

    def stream_synchronize(self, stream):
        """Wait for the work issued on ``stream`` (0: the kind's internal stream)."""
        cdef CudaCtx* k = self._open()
        cdef uintptr_t s = _index(stream, "stream", 0, _UINTPTR_MAX)
        with nogil:
            check("cuStreamSynchronize", cydriver.cuStreamSynchronize(
                <CUstream>s if s else k.sync_stream))

    def event_record(self, stream=0) -> int:
        """A new event recorded on ``stream`` (CUevent as an int); destroy it
        with :meth:`event_destroy`."""
        cdef CudaCtx* k = self._open()
        cdef uintptr_t s = _index(stream, "stream", 0, _UINTPTR_MAX)
        cdef void* ev = NULL
        with nogil:
            _cu_event_record(k, <void*>s, &ev)
        return <uintptr_t>ev

    def event_query(self, event) -> bool:
        """True once the work before ``event`` has completed."""
        cdef CudaCtx* k = self._open()
        cdef uintptr_t ev = _index(event, "event", 1, _UINTPTR_MAX)
        cdef int done
        with nogil:
            done = _cu_event_query(k, <void*>ev)
        return bool(done)

    def event_sync(self, event):
        cdef CudaCtx* k = self._open()
        cdef uintptr_t ev = _index(event, "event", 1, _UINTPTR_MAX)
        with nogil:
            _cu_event_sync(k, <void*>ev)

    def event_destroy(self, event):
        cdef CudaCtx* k = self._open()
        cdef uintptr_t ev = _index(event, "event", 0, _UINTPTR_MAX)
        with nogil:
            _cu_event_destroy(k, <void*>ev)

    def atomic(self, addr, dt, op, a=0, b=0, stream=0, result=0):
        """Device atomic (``cuda_atomic``): ``op`` of type ``dt`` on the
        aligned object at device address ``addr``; ``a``/``b`` the operands
        (CAS: compare/swap).  ``dt``: a ``GX_DT_*`` int or ``"i32"``,
        ``"u32"``, ``"i64"``, ``"u64"``, ``"flt"``, ``"dbl"``; ``op``: a
        ``GX_OP_*`` int or its lower-case name (``"fadd"``, ``"cas"``, ...).
        ``stream`` 0: complete on return, giving the old value for fetching
        ops (None otherwise).  Else only issued on ``stream``; the old value
        lands at device-accessible ``result`` (0: nowhere); returns None."""
        cdef CudaCtx* k = self._open()
        cdef uintptr_t p = _index(addr, "addr", 1, _UINTPTR_MAX)
        cdef uintptr_t st = _index(stream, "stream", 0, _UINTPTR_MAX)
        cdef uintptr_t res = _index(result, "result", 0, _UINTPTR_MAX)
        cdef int t = _named(dt, "dt", _DT_NAMES, GX_DT_COUNT - 1)
        cdef int o = _named(op, "op", _OP_NAMES, GX_OP_FMAX)
        cdef gx_val va = _operand(t, a, "a"), vb = _operand(t, b, "b"), old
        old.u64 = 0
        with nogil:
            cuda_atomic(k, <void*>st, p, t, o, va, vb, <void*>res if st else <void*>&old)
        if st or o not in _FETCHING:
            return None
        return _value(t, old)

    def host_pinned(self, addr, nbytes):
        """True when host memory [addr, addr + nbytes) is page-locked for the
        driver (cuMemHostAlloc'd or registered), False when pageable."""
        cdef CudaCtx* k = self._open()
        cdef uintptr_t p = _index(addr, "addr", 1, _UINTPTR_MAX)
        cdef size_t n = _index(nbytes, "nbytes", 1, _SIZE_MAX)
        cdef int r
        with nogil:
            r = _cu_host_pinned(k, <void*>p, n)
        return bool(r)

    def copy_small(self, dst, src, nbytes, stream=0):
        """Copy ``nbytes`` (at most 64) between device addresses with a
        one-thread kernel instead of the copy engine; ``stream`` 0: complete
        on return."""
        cdef CudaCtx* k = self._open()
        cdef uintptr_t d = _index(dst, "dst", 1, _UINTPTR_MAX)
        cdef uintptr_t sr = _index(src, "src", 1, _UINTPTR_MAX)
        cdef uintptr_t st = _index(stream, "stream", 0, _UINTPTR_MAX)
        cdef size_t n = _index(nbytes, "nbytes", 0, 64)
        with nogil:
            _cu_copy_small(k, <void*>st, d, sr, n)

    def write_value(self, addr, value, nbytes=8, stream=0):
        """Store ``nbytes`` (4 or 8) of ``value`` at aligned device address
        ``addr`` with ``cuStreamWriteValue32/64`` (no copy); ``stream`` 0:
        complete on return."""
        cdef CudaCtx* k = self._open()
        cdef uintptr_t p = _index(addr, "addr", 1, _UINTPTR_MAX)
        cdef uintptr_t st = _index(stream, "stream", 0, _UINTPTR_MAX)
        cdef int nb = _index(nbytes, "nbytes", 4, 8)
        cdef uint64_t v = _index(value, "value", 0, 2 ** 64 - 1)
        with nogil:
            _cu_write_value(k, <void*>st, p, v, nb)

    # -- lifetime -----------------------------------------------------------
    def close(self):
        """Release the kind's live allocations and imports, its stream and
        atomics module, and the primary context it retained.  Idempotent."""
        if self._k == NULL or self._k.closed:
            return
        first = None
        for a in list(self._children):
            try:
                (<Allocation>a).release()
            except Exception as e:
                first = first or e
        self._children.clear()
        _kctx_close(self._k)
        if first is not None:
            raise first

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = "closed" if self.closed else (
            f"context={self.context:#x}{' (primary)' if self._k.primary else ''}")
        return f"<gexmk.kinds.cuda.CudaKind device={self._k.ordinal} {state}>"


@cython.no_gc_clear
cdef class Allocation:
    """Device memory the kind holds: a library allocation (:meth:`CudaKind.alloc`),
    adopted client memory (:meth:`CudaKind.adopt`) or a peer's export mapped
    here (:meth:`CudaKind.import_`).  Keeps its kind alive.  ``release()``
    gives it back (unmaps an import) and is idempotent; so is ``close()``;
    use as a context manager.  The memory must be idle when released."""
    cdef gx_mem mem
    cdef CudaKind _kind
    cdef object __weakref__

    @staticmethod
    cdef Allocation _new(CudaKind kind):
        cdef Allocation a = Allocation.__new__(Allocation)
        a._kind = kind
        a.mem.device = -1
        return a

    def __dealloc__(self):
        cdef const char* call = NULL
        cdef bint leaked = False        # (no warning from a destructor)
        if self.mem.priv != NULL and self._kind is not None and self._kind._k != NULL \
                and not self._kind._k.closed:
            _free_mem(self._kind._k, &self.mem, &call, &leaked)

    @property
    def addr(self) -> int:
        """Device address of the first byte (0 once released)."""
        return self.mem.addr

    @property
    def size(self) -> int:
        """Usable bytes (an allocation's size rounded up to the granularity)."""
        return self.mem.size

    @property
    def reserved(self) -> int:
        """Bytes of address space from :attr:`addr` (``grow`` stays inside)."""
        return self.mem.reserved

    @property
    def device(self) -> int:
        return self.mem.device

    @property
    def flags(self) -> int:
        """``GX_MEM_*`` bits: LIBRARY 1, CLIENT 2, IMPORTED 4, EXPORTABLE 8."""
        return self.mem.flags

    @property
    def exportable(self) -> bool:
        return bool(self.mem.flags & GX_MEM_EXPORTABLE)

    @property
    def kind(self) -> CudaKind:
        return self._kind

    @property
    def released(self) -> bool:
        return self.mem.priv == NULL

    cdef CudaCtx* _live(self) except NULL:
        cdef CudaCtx* k = self._kind._open()
        if self.mem.priv == NULL:
            raise StateError("the allocation was released")
        return k

    def grow(self, new_size):
        """Map more memory so that ``size >= new_size``, in place (the address
        does not move); ArgumentError when it does not fit :attr:`reserved`."""
        cdef CudaCtx* k = self._live()
        cdef size_t n = _index(new_size, "new_size", 0, _SIZE_MAX)
        with nogil:
            _cu_grow(k, &self.mem, n)

    def grant(self, int device):
        """Give device ``device`` of this process read-write access to the
        allocation's mapped range too (``cuMemSetAccess``; VMM memory only):
        for copies between devices in one process, whose copy engine must
        reach both sides.  No cuCtxEnablePeerAccess."""
        cdef CudaCtx* k = self._live()
        cdef CuMem* m = <CuMem*>self.mem.priv
        cdef CUmemAccessDesc desc
        if m.type not in (CU_MEM_VMM, CU_MEM_VMM_IMPORT):
            raise UnsupportedError("grant: only VMM allocations and imports take per-device access")
        memset(&desc, 0, sizeof(desc))
        desc.location.type = cydriver.CU_MEM_LOCATION_TYPE_DEVICE
        desc.location.id = device
        desc.flags = cydriver.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        with nogil:
            _push(k)
            try:
                check("cuMemSetAccess", cydriver.cuMemSetAccess(<CUdeviceptr>self.mem.addr,
                                                                 self.mem.size, &desc, 1))
            finally:
                _pop(k)

    def export(self) -> tuple:
        """``(fds, blob)`` for :meth:`CudaKind.import_` in a peer process on
        this node: a list of POSIX file descriptors (VMM: one per chunk;
        legacy IPC: none), owned by the caller, who closes them once sent,
        and the blob (bytes, format in cuda.src/share.pxi)."""
        cdef CudaCtx* k = self._live()
        cdef gx_export e
        with nogil:
            _cu_export(k, &self.mem, &e)
        return [e.fds[i] for i in range(e.nfds)], bytes(e.blob[:e.nblob])

    def release(self):
        """Give the memory back (alloc: unmap and free; adopt: forget; import:
        unmap).  Idempotent."""
        cdef CudaCtx* k
        if self.mem.priv == NULL:
            return
        k = self._kind._open()
        try:
            with nogil:
                _cu_release(k, &self.mem)
        finally:
            self._kind._children.discard(self)

    def unmap(self):
        """Undo :meth:`CudaKind.import_` (idempotent)."""
        cdef CudaCtx* k
        if self.mem.priv == NULL:
            return
        k = self._kind._open()
        try:
            with nogil:
                _cu_unmap(k, &self.mem)
        finally:
            self._kind._children.discard(self)

    def close(self):
        self.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    @property
    def __cuda_array_interface__(self):
        """The memory as a 1-D uint8 array (CUDA array interface v3)."""
        self._live()
        return cuda_array_interface(self.mem.addr, self.mem.size, self.mem.device)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        """The memory as a 1-D uint8 DLPack tensor that keeps this allocation alive."""
        self._live()
        return dlpack_capsule(self.mem.addr, self.mem.size, self.mem.device, self)

    def __dlpack_device__(self):
        return dlpack_device(self.mem.device)

    def __repr__(self):
        what = ("library" if self.mem.flags & GX_MEM_LIBRARY else "client"
                if self.mem.flags & GX_MEM_CLIENT else "imported"
                if self.mem.flags & GX_MEM_IMPORTED else "released")
        return (f"<gexmk.kinds.cuda.Allocation {what} addr={self.mem.addr:#x} "
                f"size={self.mem.size} device={self.mem.device}>")
