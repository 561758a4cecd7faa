"""Memory layer: memory kinds, segments and buffer intake.

A segment is a contiguous range of memory that remote endpoints may read and
write once it is bound to an endpoint and published.  Library-allocated host
segments live in an anonymous shared-memory file (``memfd``) so that every
process of the node can map them at publication; nothing is ever created in a
file system, so nothing is left behind when a process is killed.
"""
import enum
import sys
import os
import itertools

from cpython.buffer cimport (PyObject_GetBuffer, PyObject_CheckBuffer, PyBuffer_Release, PyBUF_SIMPLE,
                             PyBUF_WRITABLE, PyBUF_ANY_CONTIGUOUS, PyBUF_FORMAT,
                             PyBUF_ND, PyBUF_STRIDES)
from libc.string cimport memset
from libc.stdint cimport uintptr_t
from posix.mman cimport mmap, munmap, PROT_READ, PROT_WRITE, MAP_SHARED, MAP_FAILED
from posix.unistd cimport close, ftruncate, sysconf, _SC_PAGESIZE
from libc.errno cimport errno
from gexmk.lib.linux cimport (memfd_create, MFD_CLOEXEC, MAP_FIXED, MAP_PRIVATE, MAP_ANONYMOUS,
                              MAP_NORESERVE, PROT_NONE)
from gexmk.lib.gx cimport GX_MK_HOST, GX_MK_CUDA_UVA, GX_MK_HIP, GX_MK_ZE

from gexmk.errors import ArgumentError, StateError, UnsupportedError


class MKClass(enum.IntEnum):
    """Memory kind classes (GASNet-EX ``GEX_MK_CLASS_*``)."""
    HOST = GX_MK_HOST
    CUDA_UVA = GX_MK_CUDA_UVA
    HIP = GX_MK_HIP
    ZE = GX_MK_ZE


cdef class MemoryKind:
    """A kind of memory (GASNet-EX ``gex_MK_t``): a class plus a device.

    ``gexmk.HOST`` is the host kind (``GEX_MK_HOST``); others come from
    ``client.mk_create``.
    """

    def __init__(self):
        raise TypeError("memory kinds come from gexmk.HOST or client.mk_create()")

    @property
    def name(self):
        """``'host'``, ``'cuda_uva'``, ``'hip'`` or ``'ze'``."""
        return MKClass(self.cls).name.lower()

    def __repr__(self):
        if self.cls == GX_MK_HOST:
            return "gexmk.HOST"
        return f"MemoryKind({self.name}, device={self.device})"

    def close(self):
        """Release what the kind holds (its context, streams); idempotent.
        Segments of the kind must be destroyed first."""
        if self.impl is not None:
            self.impl.close()

    def view(self, uintptr_t addr, size_t nbytes, owner):
        """A zero-copy array over ``nbytes`` of this kind's memory at ``addr``
        (CUDA array interface and DLPack), keeping ``owner`` alive."""
        if self.cls != GX_MK_CUDA_UVA:
            raise UnsupportedError(f"{self.name} memory has no device array view in this build")
        return DeviceView(addr, nbytes, self.device, owner)


class DeviceView:
    """A 1-D uint8 device array over memory gexmk maps (a peer's segment):
    ``__cuda_array_interface__`` (v3) and ``__dlpack__``; holds ``owner``."""

    def __init__(self, addr, nbytes, device, owner):
        self.address = addr
        self.nbytes = nbytes
        self.device = device
        self._owner = owner

    @property
    def __cuda_array_interface__(self):
        from gexmk.kinds import cuda
        return cuda.cuda_array_interface(self.address, self.nbytes, self.device)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        from gexmk.kinds import cuda
        if copy:
            raise BufferError("a peer view is zero-copy (copy=True refused)")
        return cuda.dlpack_capsule(self.address, self.nbytes, self.device, self)

    def __dlpack_device__(self):
        from gexmk.kinds import cuda
        return cuda.dlpack_device(self.device)

    def __repr__(self):
        return f"<gexmk.DeviceView {self.nbytes} B at 0x{self.address:x} on device {self.device}>"

    def __eq__(self, other):
        return (isinstance(other, MemoryKind) and (<MemoryKind>other).cls == self.cls
                and (<MemoryKind>other).device == self.device)

    def __hash__(self):
        return hash((self.cls, self.device))


cdef MemoryKind _make_kind(int cls, int device):
    cdef MemoryKind mk = MemoryKind.__new__(MemoryKind)
    mk.cls = cls
    mk.device = device
    return mk


HOST = _make_kind(GX_MK_HOST, -1)


def describe_kind(int cls, int device):
    """The kind a peer published (class and device), as a description: no
    driver of this machine is asked (a GPU-less initiator targets device
    segments too)."""
    if cls == GX_MK_HOST:
        return HOST
    try:
        MKClass(cls)
    except ValueError:
        raise ArgumentError(f"unknown memory kind class {cls}") from None
    return _make_kind(cls, device)


def mk_create(cls, device=0, context=None):
    """Create a memory kind of class ``cls`` (an :class:`MKClass` or its name)
    on ``device``.  ``HOST`` returns :data:`HOST`.  ``CUDA_UVA``: the
    device's primary context, or ``context`` (a CUcontext as an int, or a
    cuda.bindings CUcontext) which must belong to that device.  A class this
    build or machine cannot serve raises :class:`~gexmk.errors.UnsupportedError`
    naming why (``python -m gexmk.info`` says more)."""
    if isinstance(cls, str):
        try:
            cls = MKClass[cls.upper()]
        except KeyError:
            raise ArgumentError(f"unknown memory kind class {cls!r}; "
                                f"expected one of {[c.name.lower() for c in MKClass]}") from None
    try:
        cls = MKClass(cls)
    except ValueError:
        raise ArgumentError(f"unknown memory kind class {cls!r}") from None
    if cls == MKClass.HOST:
        return HOST
    if isinstance(device, bool) or not hasattr(type(device), "__index__"):
        raise ArgumentError(f"device must be a non-negative int, got {device!r}")
    device = device.__index__()         # numpy integers too, as everywhere else
    if device < 0:
        raise ArgumentError(f"device must be a non-negative int, got {device!r}")
    if cls == MKClass.CUDA_UVA:
        try:
            from gexmk.kinds import cuda
        except ImportError as e:
            raise UnsupportedError(f"CUDA memory kind unsupported on this build: {e}") from None
        mk = _make_kind(GX_MK_CUDA_UVA, device)
        mk.impl = cuda.CudaKind(device, context)      # raises what the machine lacks
        return mk
    runtime = {MKClass.HIP: "HIP (libamdhip64)", MKClass.ZE: "Level Zero (libze_loader)"}[cls]
    raise UnsupportedError(f"{cls.name} memory kind unsupported on this build: "
                           f"gexmk was built without {runtime} support")


def pointer_attributes(uintptr_t p):
    """What the device memory kinds of this build say of the memory at ``p``
    (``gexmk.kinds.cuda.pointer_attributes``), or None where no kind module
    or driver is there to ask."""
    try:
        from gexmk.kinds import cuda
    except ImportError:
        return None
    try:
        return cuda.pointer_attributes(p)
    except UnsupportedError:
        return None


def is_cuda_dlpack(object obj):
    """True for a DLPack array on a CUDA device (kDLCUDA, kDLCUDAManaged)."""
    return (hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__")
            and obj.__dlpack_device__()[0] in (2, 13))


def infer_kind(client, object obj):
    """The memory kind of a device array or pointer ``obj`` (CUDA array
    interface, or (pointer, nbytes)) for ``segment_create(buffer=obj)`` with
    no ``kind=``: None for a PEP 3118 host buffer."""
    if not (hasattr(obj, "__cuda_array_interface__") or type(obj) is tuple):
        if PyObject_CheckBuffer(obj) or not is_cuda_dlpack(obj):
            return None
    ptr, nbytes = device_range(obj, "segment buffer")
    mk = client._kind_of_pointer(ptr, type(obj) is not tuple, True)
    if mk is None and type(obj) is not tuple:
        info = pointer_attributes(ptr)
        what = info["memory"] if info else "not device memory"
        raise ArgumentError(f"segment buffer: the array's memory at 0x{ptr:x} is {what}, which "
                            "a device segment cannot adopt (managed memory is not taken: "
                            "allocate device memory)")
    return mk


_cuda_kind = None      # gexmk.kinds.cuda, imported on the first device array with a stream


def cai_sync(dict cai, ptr, obj=None):
    """Wait for the producer's stream of a CUDA array interface before the
    array is read or written here: the copies of gexmk run on streams of their
    own, not ordered after it.  Version 3 names the stream (its "stream" key);
    PyTorch exports version 2, with no stream, and its tensors are written on
    torch's current stream of their device (the legacy default stream unless
    the program chose another), so that is the one waited for (``obj``: the
    array)."""
    global _cuda_kind
    st = cai.get("stream") if cai.get("version", 0) >= 3 else None
    if st is None and obj is not None and type(obj).__module__.startswith("torch"):
        torch = sys.modules.get("torch")
        if torch is not None and getattr(obj, "is_cuda", False):
            st = torch.cuda.current_stream(obj.device).cuda_stream or 1   # 0: the legacy one
    if st and ptr:
        if _cuda_kind is None:
            from gexmk.kinds import cuda as _cuda_kind
        _cuda_kind.sync_array_stream(ptr, st)


def device_range(object obj, str what):
    """(pointer, nbytes) of a contiguous device array: a CUDA array interface
    (v2/v3) or DLPack object, or a (pointer, nbytes) tuple."""
    if type(obj) is tuple:
        if len(obj) != 2 or not all(isinstance(v, int) for v in obj) or obj[0] <= 0 or obj[1] < 0:
            raise ArgumentError(f"{what}: a (pointer, nbytes) tuple of non-negative ints with a "
                                f"non-NULL pointer, got {obj!r}")
        return obj
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        shape = tuple(cai["shape"])
        itemsize = int(cai["typestr"][2:])
        n = itemsize
        for d in shape:
            n *= d
        strides = cai.get("strides")
        if strides is not None:
            expect = itemsize
            for d, st in zip(reversed(shape), reversed(strides)):
                if d > 1 and st != expect:
                    raise ArgumentError(f"{what}: the device array is not C-contiguous "
                                        f"(shape {shape}, strides {tuple(strides)})")
                expect *= d
        ptr = cai["data"][0]
        if cai["data"][1]:
            raise ArgumentError(f"{what}: the device array is read-only")
        cai_sync(cai, ptr, obj)
        return ptr, n
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        if not is_cuda_dlpack(obj):
            raise ArgumentError(f"{what}: a DLPack array on device {obj.__dlpack_device__()} is not "
                                "CUDA memory")
        try:
            from gexmk.kinds import cuda
        except ImportError as e:
            raise UnsupportedError(f"{what}: a DLPack CUDA array, and this build has no CUDA "
                                   f"kind: {e}") from None
        ptr, n, _, _ = cuda.dlpack_range(obj)
        return ptr, n
    raise TypeError(f"{what}: expected a device array (__cuda_array_interface__) or "
                    f"(pointer, nbytes), got {type(obj).__name__}")


cdef int host_buffer(object obj, Py_buffer* view, bint writable, const char* what) except -1:
    """Take a contiguous host buffer from ``obj`` (PEP 3118).  The caller owns
    ``view`` and must PyBuffer_Release it."""
    cdef int flags = PyBUF_ANY_CONTIGUOUS | (PyBUF_WRITABLE if writable else 0)
    try:
        PyObject_GetBuffer(obj, view, flags)
    except BufferError as e:
        if hasattr(obj, "__cuda_array_interface__") or hasattr(obj, "__dlpack_device__"):
            raise UnsupportedError(f"{what.decode()}: device arrays are not supported by this "
                                   "build (host memory only)") from None
        need = "a writable, contiguous" if writable else "a contiguous"
        raise TypeError(f"{what.decode()} must be {need} buffer (PEP 3118) or (address, nbytes); "
                        f"got {type(obj).__name__}: {e}") from None
    except (TypeError, ValueError) as e:   # numpy: ValueError for read-only / non-contiguous
        need = "a writable, contiguous" if writable else "a contiguous"
        if isinstance(e, ValueError):
            raise TypeError(f"{what.decode()} must be {need} buffer (PEP 3118) or (address, nbytes); "
                            f"got {type(obj).__name__}: {e}") from None
        raise TypeError(f"{what.decode()} must be {need} buffer (PEP 3118) or (address, nbytes); "
                        f"got {type(obj).__name__}") from None
    return 0


_counter = itertools.count()


cdef Segment _new_segment(object client, MemoryKind kind, bint library):
    """A segment object with nothing behind it yet (the constructors fill it)."""
    cdef Segment s = Segment.__new__(Segment)
    s.fd = -1
    s.client = client
    s.kind = kind
    s.library_allocated = library
    s.token = ""
    return s
cdef char* _FORMAT_B = b"B"


cdef class Segment:
    """A segment (GASNet-EX ``gex_Segment_t``): memory that endpoints bind and
    peers access.  Created by ``client.segment_create`` or
    ``client.segment_attach``; owned by the client until :meth:`destroy`.

    A host segment exports the buffer protocol: ``numpy.asarray(seg)`` is a
    zero-copy view of its bytes.  Destroying a segment while such views exist
    detaches it from every endpoint at once but keeps the memory mapped until
    the last view is released, so a view never dangles.
    """

    def __init__(self):
        raise TypeError("segments come from client.segment_create() or client.segment_attach()")

    def __dealloc__(self):
        self._free()

    @staticmethod
    def _library(client, size_t size):
        cdef Segment s = Segment.__new__(Segment)
        cdef size_t page = <size_t>sysconf(_SC_PAGESIZE)
        cdef void* p
        s.fd = -1
        s.client = client
        s.kind = HOST
        s.library_allocated = True
        s.token = f"gexmk.{os.getpid()}.{next(_counter)}"
        name = s.token.encode()
        s.fd = memfd_create(name, MFD_CLOEXEC)
        if s.fd < 0:
            raise OSError(errno, f"memfd_create for a {size}-byte segment failed: {os.strerror(errno)}")
        # the data rounded to pages, then one page for the wake word (gx_wake:
        # waiters on this segment's words sleep on it; peers map it too)
        s.maplen = (((size + page - 1) // page) * page if size else page) + page
        if ftruncate(s.fd, s.maplen) != 0:
            e = errno
            close(s.fd); s.fd = -1
            raise MemoryError(f"cannot size a {size}-byte shared segment: {os.strerror(e)}")
        p = mmap(NULL, s.maplen, PROT_READ | PROT_WRITE, MAP_SHARED, s.fd, 0)
        if p == MAP_FAILED:
            e = errno
            close(s.fd); s.fd = -1
            raise MemoryError(f"cannot map a {size}-byte shared segment: {os.strerror(e)}")
        s.addr = <char*>p
        s.size = size
        return s

    @staticmethod
    def _client_buffer(client, buffer):
        cdef Segment s = _new_segment(client, HOST, False)
        host_buffer(buffer, &s.held, True, b"segment buffer")
        s.has_view = True
        s.addr = <char*>s.held.buf
        s.size = <size_t>s.held.len
        return s

    @staticmethod
    def _device(client, MemoryKind kind, size_t size, size_t reserve):
        """Library-allocated device memory of ``kind`` (VMM: grows in place
        up to ``reserve`` bytes)."""
        cdef Segment s = _new_segment(client, kind, True)
        s.allocation = kind.impl.alloc(size, reserve)
        s.addr = <char*><uintptr_t>s.allocation.addr
        s.size = size
        return s

    @staticmethod
    def _device_client(client, MemoryKind kind, object obj):
        """Client-allocated device memory: a CUDA array interface or DLPack
        object, or (pointer, nbytes); its attributes are checked by the kind
        (device, context, not managed), and ``obj`` is kept alive."""
        ptr, nbytes = device_range(obj, "segment buffer")
        cdef Segment s = _new_segment(client, kind, False)
        s.allocation = kind.impl.adopt(ptr, nbytes)
        s.owner = obj
        s.addr = <char*><uintptr_t>ptr
        s.size = nbytes
        return s

    cdef int check_alive(self) except -1:
        if self.destroyed:
            raise StateError("segment has been destroyed")
        return 0

    def grow(self, size):
        """Grow a library-allocated device segment in place to ``size`` bytes
        (its address does not move; at most the range reserved at creation).
        Endpoints of this process see the new size at once, peers at the next
        publication."""
        self.check_alive()
        if isinstance(size, bool) or not hasattr(size, "__index__"):
            raise TypeError(f"grow: size must be an int, got {type(size).__name__} {size!r}")
        size = size.__index__()
        if self.allocation is None or not self.library_allocated:
            raise UnsupportedError("grow: only library-allocated device segments grow in place")
        if size < self.size:
            raise ArgumentError(f"grow: {size} bytes is smaller than the segment ({self.size})")
        self.allocation.grow(size)
        self.size = size
        regrow = getattr(self.client, "_segment_grown", None)
        if regrow is not None:
            regrow(self)

    def view(self, dtype="u1"):
        """A zero-copy numpy array over the whole host segment, of ``dtype``
        (the segment's size must be a multiple of its item size).  Raises
        StateError once the segment is destroyed."""
        self.check_alive()
        if self.allocation is not None:
            raise TypeError(f"a {self.kind.name} segment is device memory: use "
                            "cupy.asarray(seg) / torch.from_dlpack(seg)")
        import numpy
        dt = numpy.dtype(dtype)
        if self.size % dt.itemsize:
            raise ArgumentError(f"view: {self.size} bytes is not a whole number of {dt} items "
                                f"({dt.itemsize} bytes each)")
        return numpy.frombuffer(memoryview(self), dtype=dt)

    @property
    def __cuda_array_interface__(self):
        """CUDA array interface v3 of a device segment (1-D uint8, zero-copy)."""
        if self.allocation is None:
            raise AttributeError("a host segment has no __cuda_array_interface__ "
                                 "(use the buffer protocol: numpy.asarray(seg))")
        self.check_alive()
        from gexmk.kinds import cuda
        return cuda.cuda_array_interface(<uintptr_t>self.addr, self.size, self.kind.device)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        """DLPack capsule of a device segment (1-D uint8, zero-copy; keeps the
        segment alive while the consumer holds it)."""
        if self.allocation is None:
            raise AttributeError("a host segment exports the buffer protocol, not DLPack")
        self.check_alive()
        if copy:
            raise BufferError("gexmk segments export zero-copy views only (copy=True refused)")
        from gexmk.kinds import cuda
        return cuda.dlpack_capsule(<uintptr_t>self.addr, self.size, self.kind.device, self)

    def __dlpack_device__(self):
        if self.allocation is None:
            raise AttributeError("a host segment exports the buffer protocol, not DLPack")
        from gexmk.kinds import cuda
        return cuda.dlpack_device(self.kind.device)

    cdef void _free(self) noexcept:
        # Touches C fields only: safe from __dealloc__.
        cdef void* p
        if self.fd >= 0:
            p = MAP_FAILED
            if self.keep_address:
                # The memory goes, the address stays taken: a peer that still
                # aims at it by address fails (EFAULT) instead of writing into
                # whatever this process would map there next.
                p = mmap(self.addr, self.maplen, PROT_NONE,
                         MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
            if p == MAP_FAILED:
                munmap(self.addr, self.maplen)
            else:
                self.reserved = True
            close(self.fd)
            self.fd = -1
            if self.reserved:
                return
        if self.reserved:
            munmap(self.addr, self.maplen)
            self.reserved = False
        if self.has_view:
            PyBuffer_Release(&self.held)
            self.has_view = False
        self.addr = NULL

    @property
    def _wake_address(self):
        """Private: the address of this segment's wake word (``gx_wake``, in
        the page after a library-allocated host segment's data), or 0."""
        if self.fd < 0 or self.destroyed or self.maplen == 0:
            return 0
        return <uintptr_t>self.addr + self.maplen - <size_t>sysconf(_SC_PAGESIZE)

    @property
    def address(self):
        """Address of the first byte, in this process (int)."""
        self.check_alive()
        return <size_t>self.addr

    @property
    def size(self):
        """Size in bytes."""
        return self.size

    @property
    def destroyed(self):
        """True once :meth:`destroy` has run."""
        return self.destroyed

    @property
    def shareable(self):
        """True when peers on this node can map the segment (library-allocated host)."""
        return self.fd >= 0

    def destroy(self):
        """Unbind the segment from its endpoint and release it (idempotent).

        Library-allocated memory is unmapped here, unless buffer views of it
        are alive (an NB operation in flight that uses the segment as its local
        buffer holds one), in which case it is unmapped when the last one goes.
        Client-allocated memory goes back to its owner (the buffer is released)
        -- at finalize when it was bound in a job of several processes.
        Peers learn of the destruction at their next publication; until then
        no access of theirs can reach memory this process reuses: client
        memory is kept whole until finalize, and the address range of a
        library segment that is bound, or was ever published, stays reserved
        (inaccessible) until finalize, so a peer
        that reaches it by address gets SegmentError; peers that mapped it
        keep their mapping until their own finalize (their writes land in
        memory this process no longer sees), and network registrations are
        closed (their accesses fail).  Device memory is unmapped once the
        work queued in its context has run (copies or kernels still reaching
        it would fault), as ``cudaFree`` waits; work still queued after
        GEXMK_TIMEOUT (a stream waiting for a signal nobody sends) leaves the
        memory mapped until the process exits, with a RuntimeWarning.
        """
        if self.destroyed:
            return
        unbind = getattr(self.client, "_segment_destroyed", None)
        retained = unbind(self) if unbind is not None else False
        self.destroyed = True
        if self.allocation is not None and not retained:
            self.allocation.release()
            self.owner = None
        if self.exports == 0 and not retained:
            self._free()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()

    def __array__(self, dtype=None, copy=None):
        """numpy.asarray(seg) reaches this only when the buffer protocol
        failed (numpy swallows that failure and would make a 0-d object
        array): say why -- a destroyed segment, or device memory."""
        self.check_alive()
        if self.allocation is not None:
            raise TypeError(f"a {self.kind.name} segment is device memory: use "
                            "cupy.asarray(seg) / torch.from_dlpack(seg)")
        import numpy
        a = numpy.frombuffer(memoryview(self), dtype=numpy.uint8)
        if dtype is not None and numpy.dtype(dtype) != a.dtype:
            if copy is False:
                raise ValueError("numpy.asarray(seg, dtype=..., copy=False): a typed zero-copy "
                                 "view is seg.view(dtype)")
            return a.astype(dtype)
        return a

    def __getbuffer__(self, Py_buffer* buffer, int flags):
        if self.destroyed:
            raise StateError("segment has been destroyed")
        if self.allocation is not None:
            raise BufferError(f"a {self.kind.name} segment is device memory: use its "
                              "__cuda_array_interface__ or DLPack (cupy.asarray, torch.from_dlpack)")
        buffer.buf = self.addr
        buffer.obj = self
        buffer.len = self.size
        buffer.readonly = 0
        buffer.itemsize = 1
        buffer.format = _FORMAT_B if (flags & PyBUF_FORMAT) else NULL
        buffer.ndim = 1
        # shape/strides point at our own fields: valid while the export lives
        buffer.shape = <Py_ssize_t*>&self.size if (flags & PyBUF_ND) else NULL
        buffer.strides = &buffer.itemsize if (flags & PyBUF_STRIDES) == PyBUF_STRIDES else NULL
        buffer.suboffsets = NULL
        buffer.internal = NULL
        self.exports += 1

    def __releasebuffer__(self, Py_buffer* buffer):
        self.exports -= 1
        if self.destroyed and self.exports == 0:
            self._free()

    def __len__(self):
        return self.size

    def __repr__(self):
        state = "destroyed" if self.destroyed else f"at 0x{<size_t>self.addr:x}"
        how = "library" if self.library_allocated else "client"
        return f"<gexmk.Segment {self.size} B {self.kind!r} {how}-allocated {state}>"
