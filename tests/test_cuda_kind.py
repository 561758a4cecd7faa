"""The CUDA_UVA memory kind (gexmk.kinds.cuda): the gx_kind_ops slots through
their Python wrappers, export to a peer process, array-library interop.

Without a driver only the CPU tests run (clear errors, never a crash; the
DLPack capsule's ABI); the GPU tests carry ``@pytest.mark.gpu`` and skip
cleanly.  Peer processes are spawned (fork after CUDA initialisation leaves
the child without CUDA) and get their FDs over a socketpair (SCM_RIGHTS).
"""
import contextlib
import ctypes
import shutil
import gc
import multiprocessing
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import gexmk
from gexmk.errors import ArgumentError, CUDAError, StateError, UnsupportedError
from gexmk.kinds import cuda

CUDA = cuda.probe()
gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not CUDA["available"], reason=str(CUDA.get("reason")))
needs_no_gpu = pytest.mark.skipif(CUDA["available"], reason="a CUDA device is present")

GX_MK_HOST, GX_MK_CUDA_UVA = 0, 1
GX_MEM_LIBRARY, GX_MEM_CLIENT, GX_MEM_IMPORTED, GX_MEM_EXPORTABLE = 1, 2, 4, 8
PEER_TIMEOUT = 60  # s: a peer process that takes longer is killed and the test fails

_capi = ctypes.pythonapi
_capi.PyCapsule_GetPointer.restype = ctypes.c_void_p
_capi.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capi.PyCapsule_GetName.restype = ctypes.c_char_p
_capi.PyCapsule_GetName.argtypes = [ctypes.py_object]
_capi.PyCapsule_SetName.restype = ctypes.c_int
_capi.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    pass


_DLManagedTensor._fields_ = [
    ("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
    ("deleter", ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor)))]


# ---------------------------------------------------------------------------
# Without a GPU (and any machine): clear errors, DLPack/CAI dicts
# ---------------------------------------------------------------------------
@needs_no_gpu
def test_kind_without_a_driver_is_unsupported_not_a_crash():
    for _ in range(2):  # the loader's failure must not be sticky or fatal
        with pytest.raises(UnsupportedError, match="^CUDA kind unsupported on this machine: "):
            cuda.CudaKind(0)


@needs_no_gpu
def test_mk_create_cuda_uva_without_a_driver():
    with pytest.raises(UnsupportedError, match="CUDA kind unsupported on this machine"):
        gexmk.mk_create("cuda_uva")


def test_mk_create_device_argument():
    """Any integer (numpy's too) names a device; anything else, or a negative
    one, is refused before the driver is asked."""
    import numpy as np
    for bad in (-1, 1.0, "0", True, None):
        with pytest.raises(ArgumentError, match="device must be a non-negative int"):
            gexmk.mk_create("cuda_uva", bad)
    try:
        mk = gexmk.mk_create("cuda_uva", np.int64(0))
    except UnsupportedError:
        pass                    # no driver here: the device was accepted, the kind is not
    else:
        assert mk.device == 0 and type(mk.device) is int
        mk.close()


def test_bad_arguments_are_refused_before_the_driver_is_asked():
    with pytest.raises(TypeError, match="device must be an int"):
        cuda.CudaKind(1.0)
    with pytest.raises(ArgumentError, match="device must be in"):
        cuda.CudaKind(-1)
    with pytest.raises(TypeError, match="context must be None"):
        cuda.CudaKind(0, context="primary")
    with pytest.raises(ArgumentError, match="non-NULL"):
        cuda.CudaKind(0, context=0)


def test_cuda_array_interface_dict():
    cai = cuda.cuda_array_interface(0x7F0000001000, 4096, 0, readonly=True)
    assert cai == {"shape": (4096,), "typestr": "|u1", "data": (0x7F0000001000, True),
                   "version": 3, "strides": None, "stream": None}
    with pytest.raises(TypeError, match="nbytes"):
        cuda.cuda_array_interface(0x1000, 1.5, 0)
    assert cuda.dlpack_device(3) == (2, 3)


def _tensor(capsule):
    ptr = _capi.PyCapsule_GetPointer(capsule, b"dltensor")
    return ctypes.cast(ptr, ctypes.POINTER(_DLManagedTensor))


def test_dlpack_capsule_layout_and_owner_reference():
    owner = bytearray(1)
    base = sys.getrefcount(owner)
    cap = cuda.dlpack_capsule(0x7F0000001234, 1000, 1, owner)
    assert _capi.PyCapsule_GetName(cap) == b"dltensor"
    assert sys.getrefcount(owner) == base + 1
    t = _tensor(cap).contents.dl_tensor
    assert (t.device.device_type, t.device.device_id) == (2, 1)        # kDLCUDA, device 1
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (1, 8, 1)    # uint8
    assert t.ndim == 1 and t.shape[0] == 1000 and not t.strides
    assert t.data == 0x7F0000001234 and t.byte_offset == 0      # consumers refuse a byte_offset
    del t, cap                     # never consumed: the capsule's destructor frees it
    gc.collect()
    assert sys.getrefcount(owner) == base


def test_dlpack_consumed_capsule_is_freed_by_the_consumer_only():
    owner = bytearray(1)
    base = sys.getrefcount(owner)
    cap = cuda.dlpack_capsule(0x7F0000002000, 16, 0, owner)
    mt = _tensor(cap)
    assert _capi.PyCapsule_SetName(cap, b"used_dltensor") == 0   # what a consumer does
    del cap
    gc.collect()
    assert sys.getrefcount(owner) == base + 1   # the consumer now owns the tensor
    mt.contents.deleter(mt)                     # ... and releases it
    assert sys.getrefcount(owner) == base


# ---------------------------------------------------------------------------
# GPU: helpers
# ---------------------------------------------------------------------------
def _drv():
    from cuda.bindings import driver
    return driver


def _ok(ret):
    """cuda.bindings' Python API returns (err, *values): check err, give the values."""
    err, *vals = ret if isinstance(ret, tuple) else (ret,)
    assert int(err) == 0, f"CUDA error {err}"
    return vals[0] if len(vals) == 1 else (vals or None)


def _current():
    return int(_ok(_drv().cuCtxGetCurrent()))


@contextlib.contextmanager
def _pushed(kind):
    """The kind's context current for the test's own driver calls (cuMemAlloc
    and friends need one), the caller's back afterwards."""
    drv = _drv()
    _ok(drv.cuCtxPushCurrent(drv.CUcontext(kind.context)))
    try:
        yield
    finally:
        _ok(drv.cuCtxPopCurrent())


def _pattern(n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def _to_host(kind, addr, n):
    out = np.zeros(n, dtype=np.uint8)
    kind.copy(out.ctypes.data, addr, n)
    return out


def _to_device(kind, addr, data):
    data = np.ascontiguousarray(data, dtype=np.uint8)
    kind.copy(addr, data.ctypes.data, data.nbytes)


@pytest.fixture
def kind():
    with cuda.CudaKind(0) as k:
        yield k


# ---------------------------------------------------------------------------
# GPU: the kind itself
# ---------------------------------------------------------------------------
@gpu
@needs_gpu
def test_kind_attributes_and_ops_capsule(kind):
    assert kind.device == 0 and kind.primary and kind.context != 0 and kind.handle != 0
    assert isinstance(kind.vmm, bool) and isinstance(kind.fabric, bool)
    if kind.vmm:
        assert kind.granularity > 0 and kind.granularity & (kind.granularity - 1) == 0
    cap = kind.ops_capsule()
    assert _capi.PyCapsule_GetName(cap) == b"gexmk.kind_ops"
    table = _capi.PyCapsule_GetPointer(cap, b"gexmk.kind_ops")
    name = ctypes.cast(ctypes.c_void_p.from_address(table).value, ctypes.c_char_p).value
    cls = ctypes.c_int.from_address(table + ctypes.sizeof(ctypes.c_void_p)).value
    assert (name, cls) == (b"cuda_uva", GX_MK_CUDA_UVA)
    # every slot filled: 16 function pointers after name and cls
    slots = table + 2 * ctypes.sizeof(ctypes.c_void_p)
    assert all(ctypes.c_void_p.from_address(slots + 8 * i).value for i in range(16))


@gpu
@needs_gpu
def test_bad_device_ordinal_names_the_device_count():
    with pytest.raises(ArgumentError, match=rf"this machine has {CUDA['device_count']} device"):
        cuda.CudaKind(CUDA["device_count"])


@gpu
@needs_gpu
def test_close_is_idempotent_and_closes_allocations():
    k = cuda.CudaKind(0)
    a = k.alloc(1 << 20)
    k.close()
    k.close()
    assert k.closed and a.released and a.addr == 0
    with pytest.raises(StateError, match="closed"):
        k.alloc(1 << 20)


# ---------------------------------------------------------------------------
# GPU: alloc / grow / release
# ---------------------------------------------------------------------------
@gpu
@needs_gpu
def test_alloc_is_zeroed_rounded_and_released(kind):
    g = kind.granularity
    a = kind.alloc(1000)
    assert a.addr % g == 0 and a.size == g and a.reserved == g and a.device == 0
    assert a.flags & GX_MEM_LIBRARY and a.exportable == kind.posix_fd
    assert not _to_host(kind, a.addr, a.size).any()
    a.release()
    assert a.released and a.addr == 0
    a.release()   # idempotent
    with pytest.raises(ArgumentError, match="size must be in"):
        kind.alloc(0)


@gpu
@needs_gpu
def test_grow_maps_in_place_and_keeps_the_data(kind):
    g = kind.granularity
    with kind.alloc(g, reserve=4 * g) as a:
        addr = a.addr
        data = _pattern(g, 1)
        _to_device(kind, addr, data)
        a.grow(3 * g - 5)
        assert a.addr == addr and a.size == 3 * g and a.reserved == 4 * g
        back = _to_host(kind, addr, 3 * g)
        assert np.array_equal(back[:g], data) and not back[g:].any()
        a.grow(g)           # shrinking is a no-op
        assert a.size == 3 * g
        with pytest.raises(ArgumentError, match=rf"reserved|{4 * g}"):
            a.grow(4 * g + 1)
        a.grow(4 * g)
        _to_device(kind, addr + 3 * g, _pattern(g, 2))
        assert np.array_equal(_to_host(kind, addr + 3 * g, g), _pattern(g, 2))


# ---------------------------------------------------------------------------
# GPU: adopt
# ---------------------------------------------------------------------------
@gpu
@needs_gpu
def test_adopt_cumemalloc_buffer_is_legacy_exportable(kind):
    drv = _drv()
    with _pushed(kind):
        ptr = int(_ok(drv.cuMemAlloc(1 << 20)))
    try:
        a = kind.adopt(ptr + 4096, 8192)
        assert a.addr == ptr + 4096 and a.size == 8192 and a.flags & GX_MEM_CLIENT
        assert a.exportable
        fds, blob = a.export()
        assert fds == [] and blob[:4] == b"GXCU" and blob[5] == 2   # legacy IPC
        with pytest.raises(ArgumentError, match="runs past the end"):
            kind.adopt(ptr + (1 << 20) - 16, 32)
        a.release()         # forgets: the memory is still the client's
        _to_device(kind, ptr, _pattern(64, 3))
    finally:
        with _pushed(kind):
            _ok(drv.cuMemFree(ptr))


@gpu
@needs_gpu
def test_adopt_device_buffer_from_the_probe_api(kind):
    with cuda.DeviceBuffer(1 << 16) as buf:
        with kind.adopt(buf.ptr, buf.nbytes) as a:
            _to_device(kind, a.addr, _pattern(1 << 16, 4))
            assert np.array_equal(_to_host(kind, buf.ptr, 1 << 16), _pattern(1 << 16, 4))


@gpu
@needs_gpu
def test_adopt_refuses_managed_memory_and_host_pointers(kind):
    drv = _drv()
    with _pushed(kind):
        ptr = int(_ok(drv.cuMemAllocManaged(4096, drv.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL)))
    try:
        with pytest.raises(ArgumentError, match="managed"):
            kind.adopt(ptr, 4096)
    finally:
        with _pushed(kind):
            _ok(drv.cuMemFree(ptr))
    host = np.zeros(4096, dtype=np.uint8)
    with pytest.raises(ArgumentError, match="host pointer"):
        kind.adopt(host.ctypes.data, host.nbytes)
    kind.host_register(host.ctypes.data, host.nbytes)
    try:
        with pytest.raises(ArgumentError, match="pinned host memory"):
            kind.adopt(host.ctypes.data, host.nbytes)
    finally:
        kind.host_unregister(host.ctypes.data)


@gpu
@needs_gpu
def test_adopt_pool_memory_is_not_exportable(kind):
    drv = _drv()
    stream = kind.stream_create()
    try:
        with _pushed(kind):
            ptr = int(_ok(drv.cuMemAllocAsync(1 << 16, drv.CUstream(stream))))
        kind.stream_synchronize(stream)
        try:
            a = kind.adopt(ptr, 1 << 16)
            assert not a.exportable
            with pytest.raises(UnsupportedError, match="staged path"):
                a.export()
            a.release()
        finally:
            with _pushed(kind):
                _ok(drv.cuMemFreeAsync(ptr, drv.CUstream(stream)))
            kind.stream_synchronize(stream)
    finally:
        kind.stream_destroy(stream)


@gpu
@needs_gpu
def test_adopt_vmm_range_over_two_chunks_exports_and_maps(kind):
    """Like PyTorch's expandable segments: one range over several VMM chunks.
    Exported and imported again in this process, the mapping sees the data."""
    if not kind.posix_fd:
        pytest.skip("no POSIX-FD handles on this device")
    g = kind.granularity
    with kind.alloc(g, reserve=2 * g) as a:
        a.grow(2 * g)                                   # a second chunk
        data = _pattern(2 * g, 5)
        _to_device(kind, a.addr, data)
        with cuda.CudaKind(0) as other:
            c = other.adopt(a.addr + g - 100, 200)      # straddles the chunk border
            assert c.exportable and c.flags & GX_MEM_CLIENT
            fds, blob = c.export()
            assert len(fds) == 2 and blob[5] == 1        # two chunks, VMM
            m = other.import_(fds, blob)
            assert m.flags & GX_MEM_IMPORTED and m.size == 200 and m.addr != c.addr
            assert np.array_equal(_to_host(other, m.addr, 200), data[g - 100:g + 100])
            m.unmap()
            c.release()


# ---------------------------------------------------------------------------
# GPU: export -> import in another process
# ---------------------------------------------------------------------------
def _peer_import(sock, n, seed):
    """Spawned peer: receive (blob, fds), import, check the data, write its
    own pattern into the first half, answer b"ok" or the error text."""
    try:
        blob, fds, _, _ = socket.recv_fds(sock, 4096, 16)
        with cuda.CudaKind(0) as k:
            m = k.import_(fds, blob)
            assert m.size == n, (m.size, n)
            got = _to_host(k, m.addr, n)
            assert np.array_equal(got, _pattern(n, seed)), "peer read wrong bytes"
            _to_device(k, m.addr, _pattern(n // 2, seed + 1))
            m.unmap()
        sock.sendall(b"ok")
    except BaseException as e:  # reported to the test, which fails with it
        sock.sendall(f"{type(e).__name__}: {e}".encode()[:4000])
    finally:
        sock.close()


def _run_peer(fds, blob, n, seed):
    ctx = multiprocessing.get_context("spawn")
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    p = ctx.Process(target=_peer_import, args=(theirs, n, seed))
    p.start()
    theirs.close()
    try:
        socket.send_fds(mine, [blob], fds)
        for fd in fds:          # sent: ours to close
            os.close(fd)
        mine.settimeout(PEER_TIMEOUT)
        answer = mine.recv(4096)
        p.join(PEER_TIMEOUT)
    finally:
        mine.close()
        if p.is_alive():
            p.kill()
            p.join()
    assert answer == b"ok", answer.decode(errors="replace")
    assert p.exitcode == 0


@gpu
@needs_gpu
@pytest.mark.timeout(120)
def test_vmm_export_import_in_another_process(kind):
    if not kind.posix_fd:
        pytest.skip("no POSIX-FD handles on this device")
    with kind.alloc(1000) as a:
        n = a.size                       # the export is of the whole, rounded allocation
        _to_device(kind, a.addr, _pattern(n, 7))
        fds, blob = a.export()
        assert len(fds) == 1
        _run_peer(fds, blob, n, 7)
        # the peer's writes landed here
        assert np.array_equal(_to_host(kind, a.addr, n // 2), _pattern(n // 2, 8))


@gpu
@needs_gpu
@pytest.mark.timeout(120)
def test_vmm_export_of_a_whole_allocation_in_another_process(kind):
    if not kind.posix_fd:
        pytest.skip("no POSIX-FD handles on this device")
    g = kind.granularity
    with kind.alloc(g, reserve=2 * g) as a:
        a.grow(2 * g)
        n = a.size
        _to_device(kind, a.addr, _pattern(n, 11))
        fds, blob = a.export()
        assert len(fds) == 2
        _run_peer(fds, blob, n, 11)
        assert np.array_equal(_to_host(kind, a.addr, n // 2), _pattern(n // 2, 12))


@gpu
@needs_gpu
@pytest.mark.timeout(120)
def test_legacy_ipc_export_import_in_another_process(kind):
    drv = _drv()
    n = 1 << 16
    with _pushed(kind):
        ptr = int(_ok(drv.cuMemAlloc(2 * n)))
    try:
        a = kind.adopt(ptr + n, n)      # not at the allocation base: the blob's offset
        _to_device(kind, a.addr, _pattern(n, 13))
        fds, blob = a.export()
        _run_peer(fds, blob, n, 13)
        assert np.array_equal(_to_host(kind, a.addr, n // 2), _pattern(n // 2, 14))
        a.release()
    finally:
        with _pushed(kind):
            _ok(drv.cuMemFree(ptr))


@gpu
@needs_gpu
def test_import_refuses_a_foreign_blob_and_closes_the_fds(kind):
    r, w = os.pipe()
    os.close(w)
    with pytest.raises(ArgumentError, match="not a CUDA kind export"):
        kind.import_([r], b"XXXX" + bytes(60))
    with pytest.raises(OSError):
        os.fstat(r)          # consumed


# ---------------------------------------------------------------------------
# GPU: copy, register, classify, streams, events
# ---------------------------------------------------------------------------
@gpu
@needs_gpu
def test_copy_host_device_host_byte_for_byte(kind):
    n = (1 << 20) + 3
    src, back = _pattern(n, 21), np.zeros(n, dtype=np.uint8)
    with kind.alloc(n) as a, kind.alloc(n) as b:
        kind.copy(a.addr + 1, src.ctypes.data, n - 1)            # host -> device, unaligned
        kind.copy(b.addr, a.addr + 1, n - 1)                      # device -> device
        kind.copy(back.ctypes.data, b.addr, n - 1)                # device -> host
        assert np.array_equal(back[:n - 1], src[:n - 1])
        # pinned host memory, on a stream, completion by event
        kind.host_register(back.ctypes.data, n)
        try:
            back[:] = 0
            s = kind.stream_create()
            try:
                kind.copy(back.ctypes.data, b.addr, n - 1, stream=s)
                ev = kind.event_record(s)
                kind.event_sync(ev)
                assert kind.event_query(ev) is True
                kind.event_destroy(ev)
            finally:
                kind.stream_destroy(s)
            assert np.array_equal(back[:n - 1], src[:n - 1])
        finally:
            kind.host_unregister(back.ctypes.data)
    kind.copy(back.ctypes.data, src.ctypes.data, 0)   # nothing to do


@gpu
@needs_gpu
def test_classify(kind):
    host = np.zeros(64, dtype=np.uint8)
    with kind.alloc(1) as a:
        assert kind.classify(a.addr) == (GX_MK_CUDA_UVA, 0)
        assert kind.classify(a.addr + a.size - 1) == (GX_MK_CUDA_UVA, 0)
    assert kind.classify(host.ctypes.data) == (GX_MK_HOST, -1)
    assert kind.classify(0) == (GX_MK_HOST, -1)
    kind.host_register(host.ctypes.data, host.nbytes)
    try:
        assert kind.classify(host.ctypes.data) == (GX_MK_HOST, -1)
    finally:
        kind.host_unregister(host.ctypes.data)


# ---------------------------------------------------------------------------
# GPU: contexts
# ---------------------------------------------------------------------------
@gpu
@needs_gpu
def test_non_primary_context_and_the_callers_context_is_untouched():
    drv = _drv()
    outer = _current()     # earlier tests (DeviceBuffer) may have left the primary current
    dev = _ok(drv.cuDeviceGet(0))
    ctx = _ok(drv.cuCtxCreate(None, 0, dev))       # pushed: current now
    try:
        before = _current()
        assert before == int(ctx)
        with cuda.CudaKind(0, context=int(ctx)) as k:
            assert not k.primary and k.context == int(ctx)
            assert _current() == before
            g = k.granularity
            a = k.alloc(g, reserve=2 * g)
            assert _current() == before
            a.grow(2 * g)
            assert _current() == before
            data = _pattern(g, 31)
            _to_device(k, a.addr, data)
            assert _current() == before
            assert np.array_equal(_to_host(k, a.addr, g), data)
            s = k.stream_create()
            ev = k.event_record(s)
            k.event_sync(ev)
            k.event_destroy(ev)
            k.stream_destroy(s)
            assert k.classify(a.addr) == (GX_MK_CUDA_UVA, 0)
            a.release()
            assert _current() == before
        assert _current() == before
        # a kind on the primary context leaves the user's context current too
        with cuda.CudaKind(0) as k:
            with k.alloc(1) as a:
                k.copy(a.addr, a.addr, 0)
            assert _current() == before
        # and the context below (often none at all) is what stays current
        _ok(drv.cuCtxPopCurrent())
        assert _current() == outer
        with cuda.CudaKind(0, context=int(ctx)) as k:
            with k.alloc(1) as a:
                _to_device(k, a.addr, _pattern(16, 32))
        assert _current() == outer
    finally:
        _ok(drv.cuCtxDestroy(ctx))


@gpu
@needs_gpu
def test_adopt_refuses_memory_of_another_context():
    drv = _drv()
    dev = _ok(drv.cuDeviceGet(0))
    ctx = _ok(drv.cuCtxCreate(None, 0, dev))
    try:
        ptr = int(_ok(drv.cuMemAlloc(4096)))     # in ctx
        try:
            with cuda.CudaKind(0) as k:             # primary context
                with pytest.raises(ArgumentError, match="another CUDA context"):
                    k.adopt(ptr, 4096)
        finally:
            _ok(drv.cuMemFree(ptr))
    finally:
        _ok(drv.cuCtxPopCurrent())
        _ok(drv.cuCtxDestroy(ctx))


# ---------------------------------------------------------------------------
# GPU: array libraries
# ---------------------------------------------------------------------------
@gpu
@needs_gpu
def test_cuda_array_interface_into_cupy(kind):
    cp = pytest.importorskip("cupy")
    with kind.alloc(4096) as a:
        _to_device(kind, a.addr, _pattern(4096, 41))
        arr = cp.asarray(a)
        assert arr.dtype == cp.uint8 and arr.shape == (a.size,)
        assert arr.data.ptr == a.addr
        assert np.array_equal(cp.asnumpy(arr[:4096]), _pattern(4096, 41))
        arr[:16] = 7
        cp.cuda.runtime.deviceSynchronize()
        assert (_to_host(kind, a.addr, 16) == 7).all()
        del arr


@gpu
@needs_gpu
def test_dlpack_into_torch_keeps_the_allocation_alive(kind):
    torch = pytest.importorskip("torch")
    a = kind.alloc(4096)
    _to_device(kind, a.addr + 8, _pattern(100, 42))
    t = torch.from_dlpack(cuda.dlpack_capsule(a.addr + 8, 100, 0, a))
    assert t.dtype == torch.uint8 and t.device.type == "cuda" and t.shape == (100,)
    assert t.data_ptr() == a.addr + 8
    assert np.array_equal(t.cpu().numpy(), _pattern(100, 42))
    t2 = torch.from_dlpack(a)                 # __dlpack__ / __dlpack_device__
    assert t2.numel() == a.size
    del a
    gc.collect()
    assert np.array_equal(t.cpu().numpy(), _pattern(100, 42))   # still mapped
    del t, t2


@gpu
@needs_gpu
@pytest.mark.timeout(120)
def test_torch_expandable_segments_tensor_is_adopted_and_exported(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "expandable.py"
    script.write_text(textwrap.dedent("""
        import os, sys
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        import torch
        from gexmk.kinds import cuda
        torch.cuda.init()
        # big enough to span several of the allocator's VMM pages
        t = (torch.arange(48 << 20, dtype=torch.int32, device="cuda") & 255).to(torch.uint8)
        torch.cuda.synchronize()
        with cuda.CudaKind(0) as k:
            a = k.adopt(t.data_ptr(), t.numel())
            print("exportable", a.exportable)
            if a.exportable:
                fds, blob = a.export()
                m = k.import_(fds, blob)
                import numpy as np
                out = np.zeros(4096, dtype=np.uint8)
                k.copy(out.ctypes.data, m.addr + (40 << 20), 4096)
                want = (np.arange(40 << 20, (40 << 20) + 4096) % 256).astype(np.uint8)
                assert (out == want).all()
                m.unmap()
                print("chunks", len(fds))
            a.release()
        print("OK")
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=110, env=dict(os.environ))
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout + proc.stderr


# ---------------------------------------------------------------------------
# Device atomics
# ---------------------------------------------------------------------------
def test_atomic_ptx_assembles_for_volta_to_hopper(tmp_path):
    ptx = cuda.atomic_ptx()
    for dt in ("i32", "u32", "i64", "u64", "flt", "dbl"):
        assert f".visible .entry gx_atomic_{dt}(" in ptx
    ptxas = shutil.which("ptxas") or (os.path.exists("/usr/local/cuda/bin/ptxas")
                                      and "/usr/local/cuda/bin/ptxas")
    if not ptxas:
        pytest.skip("no ptxas here: the driver's JIT checks the PTX on the GPU tests")
    src = tmp_path / "atomics.ptx"
    src.write_text(ptx)
    for arch in ("sm_75", "sm_90"):   # CUDA 13's ptxas no longer targets sm_70
        proc = subprocess.run([ptxas, f"-arch={arch}", str(src), "-o", str(tmp_path / "a.cubin")],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr


@gpu
@needs_gpu
def test_device_atomics_per_type(kind):
    with kind.alloc(64) as a:
        w = a.addr
        # integers wrap, fetch ops return the old value
        assert kind.atomic(w, "i32", "set", -5) is None
        assert kind.atomic(w, "i32", "fadd", 7) == -5
        assert kind.atomic(w, "i32", "fsub", 10) == 2
        assert kind.atomic(w, "i32", "fdec") == -8
        assert kind.atomic(w, "i32", "fmin", -100) == -9
        assert kind.atomic(w, "i32", "fmax", 3) == -100
        assert kind.atomic(w, "i32", "get") == 3
        assert kind.atomic(w, "u32", "fsub", 4) == 3
        assert kind.atomic(w, "u32", "get") == 2 ** 32 - 1
        assert kind.atomic(w, "u32", "finc") == 2 ** 32 - 1
        assert kind.atomic(w, "u32", "get") == 0
        assert kind.atomic(w + 8, "u64", "swap", 0xF0F0) == 0
        assert kind.atomic(w + 8, "u64", "fand", 0xFF00) == 0xF0F0
        assert kind.atomic(w + 8, "u64", "for", 0x000F) == 0xF000
        assert kind.atomic(w + 8, "u64", "fxor", 0xFFFF) == 0xF00F
        assert kind.atomic(w + 8, "u64", "fcas", 0x0FF0, 2 ** 64 - 1) == 0x0FF0
        assert kind.atomic(w + 8, "u64", "fcas", 0, 5) == 2 ** 64 - 1      # no swap
        assert kind.atomic(w + 8, "i64", "fmin", -2 ** 63) == -1
        assert kind.atomic(w + 8, "i64", "get") == -2 ** 63
        # floating point: arithmetic, CAS on the representation, min/max by CAS loop
        assert kind.atomic(w + 16, "flt", "set", 1.5) is None
        assert kind.atomic(w + 16, "flt", "fadd", 2.25) == 1.5
        assert kind.atomic(w + 16, "flt", "fsub", 0.75) == 3.75
        assert kind.atomic(w + 16, "flt", "finc") == 3.0
        assert kind.atomic(w + 16, "flt", "fmin", -2.5) == 4.0
        assert kind.atomic(w + 16, "flt", "fmax", -7.0) == -2.5
        assert kind.atomic(w + 16, "flt", "get") == -2.5
        assert kind.atomic(w + 24, "dbl", "swap", -0.0) == 0.0
        assert str(kind.atomic(w + 24, "dbl", "get")) == "-0.0"            # bits kept
        assert kind.atomic(w + 24, "dbl", "fcas", 0.0, 1.0) == 0.0         # -0.0 != 0.0 bitwise
        assert str(kind.atomic(w + 24, "dbl", "fdec")) == "-0.0"
        assert kind.atomic(w + 24, "dbl", "fmax", 1e300) == -1.0
        assert kind.atomic(w + 24, "dbl", "get") == 1e300
        with pytest.raises(ArgumentError, match="not defined"):
            kind.atomic(w + 16, "flt", "and", 1)
        with pytest.raises(ArgumentError, match="aligned"):
            kind.atomic(w + 2, "u32", "get")
        with pytest.raises(ArgumentError, match="is not one of"):
            kind.atomic(w, "u8", "get")


@gpu
@needs_gpu
def test_device_fadd_counts_exactly_under_contention_from_two_streams(kind):
    n = 500
    streams = [kind.stream_create(), kind.stream_create()]
    host = np.zeros(2 * n, dtype=np.uint64)
    kind.host_register(host.ctypes.data, host.nbytes)
    try:
        with kind.alloc(8) as a:
            for i in range(n):
                for j, s in enumerate(streams):
                    # fetched old values land in pinned host memory, one word per call
                    kind.atomic(a.addr, "u64", "fadd", 1, stream=s,
                                result=host.ctypes.data + 8 * (2 * i + j))
            for s in streams:
                kind.stream_synchronize(s)
            assert kind.atomic(a.addr, "u64", "get") == 2 * n
            # every old value 0 .. 2n-1 was fetched exactly once
            assert sorted(host.tolist()) == list(range(2 * n))
    finally:
        kind.host_unregister(host.ctypes.data)
        for s in streams:
            kind.stream_destroy(s)
