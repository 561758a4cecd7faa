"""A GPU user's paths (issue 20): any device memory of the process as the local
side of every operation, kinds inferred from the array, and the errors where
no path exists.  One process here (loopback paths); the conformance matrix
runs the same memories across processes and paths.  GPU tests skip cleanly
without a driver; the CPU tests check what a GPU-less machine says."""
import numpy as np
import pytest

import gexmk
from gexmk import errors as E

from test_cuda_segments import HAVE_GPU, PROBE, MiB, gpu, needs_gpu


class _FakeCAI:
    """A CUDA array interface over a pointer the driver does not know."""

    def __init__(self, ptr, n):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 3}


def test_device_array_the_driver_does_not_know_is_refused(client):
    """A CUDA array interface whose pointer no driver knows: a clear error, on
    a machine with or without a GPU, never a CPU copy of it."""
    seg = client.segment_attach(MiB)
    buf = np.zeros(64, np.uint8)
    fake = _FakeCAI(buf.ctypes.data, 64)
    with pytest.raises((E.ArgumentError, E.UnsupportedError)):
        client.tm.put(0, seg.address, fake)
    with pytest.raises((E.ArgumentError, E.UnsupportedError)):
        client.segment_create(buffer=fake)


@pytest.fixture
def cupy():
    if not HAVE_GPU:
        pytest.skip("no NVIDIA driver or device on this machine")
    return pytest.importorskip("cupy")


@gpu
@needs_gpu
def test_segment_create_infers_the_kind_of_a_cupy_array(client, cupy):
    arr = cupy.arange(MiB, dtype=cupy.uint8)
    seg = client.segment_create(buffer=arr)
    assert seg.kind.name == "cuda_uva" and seg.kind.device == arr.device.id
    assert seg.address == arr.data.ptr and seg.size == MiB
    again = client.segment_create(buffer=cupy.zeros(4096, cupy.uint8))
    assert again.kind is seg.kind                    # the process's kind for that GPU, reused
    # the explicit kind is checked against what the pointer says
    if PROBE.get("device_count", 0) > 1:
        other = client.mk_create(gexmk.CUDA_UVA, 1 - arr.device.id)
        with pytest.raises(E.ArgumentError, match="device"):
            client.segment_create(buffer=arr, kind=other)
    ep = client.ep_create()
    ep.bind_segment(seg)
    client.tm.publish_bound_segment([ep])
    back = np.zeros(64, np.uint8)
    client.ep(0).pair(ep.index).get(back, 0, seg.address + 100)
    assert (back == np.arange(100, 164, dtype=np.uint8)).all()


@gpu
@needs_gpu
def test_managed_memory_cannot_be_a_segment_but_can_be_a_source(client, cupy):
    seg = client.segment_attach(MiB)
    mem = cupy.cuda.malloc_managed(4096)
    arr = cupy.ndarray(4096, cupy.uint8, mem)
    arr[...] = 9
    cupy.cuda.runtime.deviceSynchronize()
    with pytest.raises(E.ArgumentError, match="managed"):
        client.segment_create(buffer=arr)
    client.tm.put(0, seg.address, arr)               # the CPU reaches managed memory
    assert (np.asarray(seg)[:4096] == 9).all()


def _host_and_device_eps(client, n=4 * MiB):
    mk = client.mk_create(gexmk.CUDA_UVA, 0)
    hseg = client.segment_attach(n)                  # EP 0: host segment
    ep1 = client.ep_create()
    dseg = client.segment_create(n, kind=mk)
    ep1.bind_segment(dseg)
    client.tm.publish_bound_segment([ep1])
    return mk, hseg, ep1, dseg


@gpu
@needs_gpu
@pytest.mark.parametrize("nbytes", [8, 4096, 3 * MiB + 7])
def test_any_cupy_array_as_local_side_of_every_form(client, cupy, nbytes):
    """A CuPy array outside every segment, from the device-bound EP (its
    kind's copy engine) and from the host-bound EP (a host bounce), into host
    and device targets, blocking / NB / NBI, put and get."""
    mk, hseg, ep1, dseg = _host_and_device_eps(client)
    rng = np.random.default_rng(nbytes)
    data = rng.integers(0, 256, nbytes, dtype=np.uint8)
    from_dev_ep = {"host": ep1.pair(0), "device": ep1.pair(1)}
    from_host_ep = {"host": client.ep(0).pair(0), "device": client.ep(0).pair(1)}
    base = {"host": hseg.address, "device": dseg.address}
    reader = {"host": client.ep(0).pair(0), "device": client.ep(0).pair(1)}
    for who, teams in (("device EP", from_dev_ep), ("host EP", from_host_ep)):
        for tgt in ("host", "device"):
            tm = teams[tgt]
            for form in ("blocking", "nb", "nbi"):
                src = cupy.asarray(data)
                cupy.cuda.runtime.deviceSynchronize()
                reader[tgt].put(0, base[tgt], np.zeros(nbytes, np.uint8))
                if form == "blocking":
                    tm.put(0, base[tgt], src)
                elif form == "nb":
                    tm.put_nb(0, base[tgt], src, lc=gexmk.LC_DEFER).wait()
                else:
                    tm.put_nbi(0, base[tgt], src, lc=gexmk.LC_GROUP)
                    gexmk.nbi_wait()
                back = np.zeros(nbytes, np.uint8)
                reader[tgt].get(back, 0, base[tgt])
                assert (back == data).all(), (who, tgt, form, "put")
                dst = cupy.zeros(nbytes, cupy.uint8)
                if form == "blocking":
                    tm.get(dst, 0, base[tgt])
                elif form == "nb":
                    tm.get_nb(dst, 0, base[tgt]).wait()
                else:
                    tm.get_nbi(dst, 0, base[tgt])
                    gexmk.nbi_wait()
                assert (dst.get() == data).all(), (who, tgt, form, "get")


@gpu
@needs_gpu
def test_put_signal_and_streams_from_a_cupy_array(client, cupy):
    mk, hseg, ep1, dseg = _host_and_device_eps(client)
    tm = ep1.pair(1)
    s = cupy.cuda.Stream(non_blocking=True)
    src = cupy.zeros(4096, cupy.uint8)
    with s:
        src.fill(5)                                  # produced by a kernel on s
    tm.put_on_stream(0, dseg.address + 8192, src, s)
    tm.put_signal_on_stream(0, dseg.address + 16384, src, dseg.address, 1, gexmk.SIGNAL_SET, s)
    s.synchronize()
    back = np.zeros(4096, np.uint8)
    client.ep(0).pair(1).get(back, 0, dseg.address + 8192)
    assert (back == 5).all()
    client.ep(0).pair(1).get(back, 0, dseg.address + 16384)
    assert (back == 5).all()
    assert client.ep(0).pair(1).get_val(0, dseg.address) == 1
    tm.put_signal(0, dseg.address + 4096, src, dseg.address + 8, 3, gexmk.SIGNAL_ADD)
    tm.quiet()
    assert client.ep(0).pair(1).get_val(0, dseg.address + 8) == 3
    # a stream form from the host-bound EP cannot order through its host bounce
    with pytest.raises(E.UnsupportedError, match="bounce"):
        client.ep(0).pair(1).put_on_stream(0, dseg.address, src, s)


@gpu
@needs_gpu
def test_torch_tensor_and_raw_pointer_as_local_side(client):
    torch = pytest.importorskip("torch")
    mk, hseg, ep1, dseg = _host_and_device_eps(client)
    t = torch.arange(256, dtype=torch.uint8, device="cuda:0")
    torch.cuda.synchronize()
    ep1.pair(0).put(0, hseg.address, t)
    assert (np.asarray(hseg)[:256] == np.arange(256, dtype=np.uint8)).all()
    # (pointer, nbytes) of device memory once the process has a device kind
    client.ep(0).pair(0).put(0, hseg.address + 4096, (t.data_ptr(), 256))
    assert (np.asarray(hseg)[4096:4352] == np.arange(256, dtype=np.uint8)).all()


@gpu
@needs_gpu
def test_cupy_array_on_another_gpu(client, cupy):
    if PROBE.get("device_count", 0) < 2:
        pytest.skip("needs two GPUs")
    mk, hseg, ep1, dseg = _host_and_device_eps(client)
    with cupy.cuda.Device(1):
        src = cupy.full(MiB, 3, cupy.uint8)
        cupy.cuda.runtime.deviceSynchronize()
    ep1.pair(1).put(0, dseg.address, src)            # GPU 1 array, EP of GPU 0: bounced
    back = np.zeros(MiB, np.uint8)
    client.ep(0).pair(1).get(back, 0, dseg.address)
    assert (back == 3).all()
    with cupy.cuda.Device(1):
        dst = cupy.zeros(MiB, cupy.uint8)
    ep1.pair(1).get(dst, 0, dseg.address)
    assert int(dst.sum()) == 3 * MiB


class _DLPackOnly:
    """A device array seen only through DLPack (as JAX arrays are)."""

    def __init__(self, arr):
        self._arr = arr

    def __dlpack__(self, stream=None):
        return self._arr.__dlpack__()

    def __dlpack_device__(self):
        return self._arr.__dlpack_device__()


@gpu
@needs_gpu
def test_dlpack_only_arrays_as_local_side_and_segment(client, cupy):
    mk, hseg, ep1, dseg = _host_and_device_eps(client)
    src = cupy.arange(4096, dtype=cupy.uint8)
    cupy.cuda.runtime.deviceSynchronize()
    ep1.pair(0).put(0, hseg.address, _DLPackOnly(src))
    assert (np.asarray(hseg)[:4096] == np.arange(4096, dtype=np.uint8)).all()
    seg = client.segment_create(buffer=_DLPackOnly(cupy.zeros(1 << 21, cupy.uint8)))
    assert seg.kind is mk and seg.size == 1 << 21
    with pytest.raises(E.ArgumentError, match="contiguous"):
        ep1.pair(0).put(0, hseg.address, _DLPackOnly(cupy.zeros((64, 64), cupy.uint8)[:, ::2]))


@gpu
@needs_gpu
def test_atomic_result_into_a_cupy_array(client, cupy):
    mk, hseg, ep1, dseg = _host_and_device_eps(client)
    for tm, addr in ((ep1.pair(0), hseg.address), (ep1.pair(1), dseg.address)):
        ad = tm.ad_create(gexmk.DT_U64, gexmk.OP_FADD | gexmk.OP_SET)
        ad.op(0, addr, gexmk.OP_SET, 40)
        res = cupy.zeros(1, cupy.uint64)
        ad.op_nbi(0, addr, gexmk.OP_FADD, 2, result=res)
        assert int(res[0]) == 40
        assert ad.op(0, addr, gexmk.OP_FADD, 0) == 42
        with pytest.raises(E.ArgumentError, match="at least 8 bytes"):
            ad.op_nbi(0, addr, gexmk.OP_FADD, 1, result=cupy.zeros(4, cupy.uint8))


@gpu
@needs_gpu
def test_cupy_arrays_still_being_written_are_waited_for(client, cupy):
    # The CUDA array interface (v3) names the stream its producer left work
    # on; gexmk copies on streams of its own, so it must wait for that stream
    # before it reads or writes the array.  Slow kernels first hold CuPy's
    # stream; the arrays are filled behind them.
    mk, hseg, ep1, dseg = _host_and_device_eps(client)
    big = cupy.ones(64 * MiB, cupy.float32)
    tm = ep1.pair(0)
    for _ in range(3):
        for _ in range(40):
            big *= 1.0001                    # ~ms of work queued on CuPy's stream
        src = cupy.full(4096, 7, cupy.uint8)   # written behind it
        tm.put(0, hseg.address, src)
        assert (np.asarray(hseg)[:4096] == 7).all(), "the put read the array before it was filled"
        np.asarray(hseg)[:4096] = 0
        ad = tm.ad_create(gexmk.DT_U64, gexmk.OP_FADD | gexmk.OP_SET)
        ad.op(0, hseg.address + 8192, gexmk.OP_SET, 40)
        for _ in range(40):
            big *= 1.0001
        res = cupy.zeros(1, cupy.uint64)       # zeroed behind the slow kernels
        ad.op_nbi(0, hseg.address + 8192, gexmk.OP_FADD, 2, result=res)
        assert int(res[0]) == 40, "the fetched value was overwritten by the array's own zeroing"


@gpu
@needs_gpu
def test_segment_destroyed_behind_its_own_nb_ops(client, cupy):
    # Fuzz seed 3409: a device segment destroyed while a get_nb from it was
    # still queued on the GPU.  Its memory was unmapped under the copy, which
    # faulted (CUDA_ERROR_LAUNCH_FAILED) and lost the context for good.  Slow
    # kernels hold CuPy's stream, which gexmk's copies wait for, so the ops
    # are surely still queued when destroy() runs; they must read the
    # segment's data, and the context must survive.
    mk, hseg, ep1, dseg = _host_and_device_eps(client)
    n = 4 * MiB
    data = np.random.default_rng(3409).integers(0, 256, n, dtype=np.uint8)
    client.ep(0).pair(1).put(0, dseg.address, data)
    big = cupy.ones(64 * MiB, cupy.float32)
    tm = ep1.pair(1)
    for _ in range(40):
        big *= 1.0001                        # ~ms of work queued on CuPy's stream
    whole = cupy.zeros(n, cupy.uint8)       # zeroed behind it: the gets wait for it
    blocks = cupy.zeros(3 * 4096, cupy.uint8)
    ev = tm.get_nb(whole, 0, dseg.address)
    ev2 = tm.get_vector_nb([blocks[:4096], blocks[4096:8192], blocks[8192:]], 0,
                           [(dseg.address + 100, 4096), (dseg.address + 9000, 4096),
                            (dseg.address + n - 4096, 4096)])
    dseg.destroy()
    ev.wait()
    ev2.wait()
    assert (whole.get() == data).all(), "the get_nb read the segment after it was unmapped"
    want = np.concatenate([data[100:4196], data[9000:13096], data[n - 4096:]])
    assert (blocks.get() == want).all(), "the vector get_nb lost its blocks"
    cupy.cuda.runtime.deviceSynchronize()   # the context is alive
    again = client.segment_create(MiB, kind=mk)
    ep1.bind_segment(again)                  # destroy() unbound the old one
    client.tm.publish_bound_segment([ep1])
    tm.put(0, again.address, cupy.full(4096, 5, cupy.uint8))
    back = np.zeros(4096, np.uint8)
    client.ep(0).pair(1).get(back, 0, again.address)
    assert (back == 5).all()


_PRELUDE = r"""
import faulthandler, sys, time, warnings
import numpy as np, cupy
import gexmk
faulthandler.dump_traceback_later(60, exit=True)   # a hang shows where, then exits
def step(what):
    print("step", what, file=sys.stderr, flush=True)
c = gexmk.init()
mk = c.mk_create(gexmk.CUDA_UVA, 0)
ep1 = c.ep_create()
words = c.segment_create(1 << 20, kind=mk)
ep1.bind_segment(words)
c.tm.publish_bound_segment([ep1])
tm = ep1.pair(ep1.index)
s = cupy.cuda.Stream(non_blocking=True)
"""

_BLOCKED_STREAM = _PRELUDE + r"""
spare = c.segment_create(1 << 20, kind=mk)
t0 = time.monotonic()
spare.destroy()                              # nothing queued: at once
idle = time.monotonic() - t0
again = c.segment_create(1 << 20, kind=mk)
view = cupy.ndarray(1 << 20, cupy.uint8, cupy.cuda.MemoryPointer(
    cupy.cuda.UnownedMemory(again.address, 1 << 20, again), 0))
view.fill(3)                                 # CuPy's fill kernel (fill(0) is a memset) is
cupy.cuda.Device().synchronize()             # loaded now: loading it behind the wait hangs
step("wait posted")
tm.signal_wait_until_on_stream(words.address, gexmk.CMP_GE, 1, s.ptr)
with s:
    view.fill(7)                             # queued behind the wait, into `again`
step("fill queued")
t0 = time.monotonic()
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    again.destroy()                          # the stream waits for a signal nobody sends
blocked = time.monotonic() - t0
step("destroyed")
tm.signal_op(0, words.address, 1)           # now it comes: the queued fill runs
step("signalled")
s.synchronize()                              # into memory left mapped: no fault
step("stream ran")
assert idle < 1.0, idle
assert 1.5 < blocked < 20, blocked
assert any("left mapped" in str(x.message) for x in w), [str(x.message) for x in w]
c.finalize()
print("OK", round(idle, 3), round(blocked, 2))
"""

_OWN_SIGNAL = _PRELUDE + r"""
out = cupy.zeros(8, cupy.uint64)
cupy.cuda.Device().synchronize()
step("wait posted")
tm.signal_wait_until_on_stream(words.address, gexmk.CMP_GE, 1, s.ptr)
tm.put_on_stream(0, words.address + 64, out, s.ptr)   # behind the wait
step("signalling")
tm.signal_op(0, words.address, 1)           # the first kernel gexmk launches here
step("signalled")
s.synchronize()
step("stream ran")
c.finalize()
print("OK")
"""


def _run_child(script, **env):
    import os
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-P", "-c", script], env=dict(os.environ, **env),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "OK" in r.stdout, (r.stdout, r.stderr[-3000:])


@gpu
@needs_gpu
def test_release_behind_a_stream_that_never_runs_is_bounded(cupy):
    # Releasing device memory waits for the context's queued work (as cuMemFree);
    # a stream blocked in signal_wait_until_on_stream for a signal that does not
    # come must not hold destroy() (or finalize) for ever: after GEXMK_TIMEOUT the
    # memory is left mapped, with a warning, and the stream runs on later.
    _run_child(_BLOCKED_STREAM, GEXMK_TIMEOUT="2")


@gpu
@needs_gpu
def test_own_signal_to_a_waiting_stream_is_not_held_by_kernel_loading(cupy):
    # A stream waits (signal_wait_until_on_stream) for a word this same process
    # then sets with signal_op, the first gexmk kernel of the process.  Loading
    # a module waits for the context's streams (lazy and eager modes alike,
    # bench/diagnostics/lazy_loading.py): the signal would wait for the stream
    # that waits for it.  The kind loads its kernels before posting a wait.
    _run_child(_OWN_SIGNAL, CUDA_MODULE_LOADING="LAZY")


@gpu
@needs_gpu
def test_torch_tensors_still_being_written_are_waited_for(client):
    # PyTorch's CUDA array interface is version 2: no stream named.  Its tensors
    # are written on torch's current stream, which gexmk's own streams are not
    # ordered after: gexmk waits for that stream.  Slow kernels hold it first, on
    # the default stream and on a stream the program chose; the tensors are
    # filled behind them.
    torch = pytest.importorskip("torch")
    mk, hseg, ep1, dseg = _host_and_device_eps(client)
    big = torch.ones(64 * MiB, dtype=torch.float32, device="cuda:0")
    tm = ep1.pair(0)
    side = torch.cuda.Stream(device="cuda:0")
    for stream in (torch.cuda.current_stream("cuda:0"), side):
        with torch.cuda.stream(stream):
            for _ in range(3):
                for _ in range(40):
                    big.mul_(1.0001)              # ~ms of work queued on the stream
                src = torch.full((4096,), 7, dtype=torch.uint8, device="cuda:0")
                tm.put(0, hseg.address, src)
                assert (np.asarray(hseg)[:4096] == 7).all(), \
                    f"the put read the tensor before it was filled (stream {stream})"
                np.asarray(hseg)[:4096] = 0
                for _ in range(40):
                    big.mul_(1.0001)
                dst = torch.zeros(4096, dtype=torch.uint8, device="cuda:0")
                np.asarray(hseg)[8192:8192 + 4096] = 9
                tm.get(dst, 0, hseg.address + 8192)
                assert int((dst == 9).sum()) == 4096, \
                    f"the tensor's own zeroing ran after the get wrote it (stream {stream})"
    torch.cuda.synchronize()
