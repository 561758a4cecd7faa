"""Device segments of the CUDA_UVA kind through the whole stack: kinds from
the client, library- and client-allocated device segments, endpoints bound to
them, the loopback paths between host and device memory in one process
(GASNet-EX testcudauva's four cases), device atomics, growth, CAI/DLPack
export.  GPU tests carry the ``gpu`` marker and skip cleanly without a
driver; the CPU tests check the errors a GPU-less machine gives."""
import threading

import numpy as np
import pytest

import gexmk
from gexmk import errors as E


def _cuda_probe():
    try:
        from gexmk.kinds import cuda
    except ImportError:
        return {}
    try:
        return cuda.probe()
    except Exception:           # noqa: BLE001 - any failure means: no usable GPU
        return {}


PROBE = _cuda_probe()
HAVE_GPU = bool(PROBE.get("driver_loaded") and PROBE.get("device_count"))
gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not HAVE_GPU, reason="no NVIDIA driver or device on this machine")
MiB = 1 << 20


# ---- CPU: what a machine without a GPU says ---------------------------------------

@pytest.mark.skipif(HAVE_GPU, reason="checks the no-GPU errors")
def test_mk_create_without_gpu_is_a_clear_error(client):
    with pytest.raises(E.UnsupportedError, match="(?i)cuda"):
        client.mk_create(gexmk.CUDA_UVA, 0)
    with pytest.raises(E.UnsupportedError, match="HIP"):
        client.mk_create(gexmk.HIP, 0)


def test_remote_kind_descriptions_cannot_allocate(client):
    from gexmk import memory
    desc = memory.describe_kind(int(gexmk.CUDA_UVA), 0)
    with pytest.raises(E.UnsupportedError, match="client.mk_create"):
        client.segment_create(4096, kind=desc)
    with pytest.raises(E.ArgumentError, match="reserve"):
        client.segment_create(4096, reserve=8192)


def test_host_segment_has_no_device_exports(client):
    seg = client.segment_create(4096)
    assert not hasattr(seg, "__cuda_array_interface__")
    with pytest.raises(AttributeError):
        seg.__dlpack__()


# ---- GPU ------------------------------------------------------------------------------

@gpu
@needs_gpu
def test_bad_device_ordinal(client):
    with pytest.raises(E.ArgumentError, match="device"):
        client.mk_create(gexmk.CUDA_UVA, PROBE["device_count"] + 3)


def _setup(client, n=8 * MiB, devices=(0, 0)):
    mk = client.mk_create(gexmk.CUDA_UVA, devices[0])
    mk2 = mk if devices[1] == devices[0] else client.mk_create(gexmk.CUDA_UVA, devices[1])
    hseg = client.segment_attach(2 * n)               # EP 0: host
    ep1, ep2 = client.ep_create(), client.ep_create()
    d1 = client.segment_create(n, kind=mk)
    d2 = client.segment_create(n, kind=mk2)
    ep1.bind_segment(d1)
    ep2.bind_segment(d2)
    return mk, hseg, ep1, ep2, d1, d2


@gpu
@needs_gpu
@pytest.mark.parametrize("devices", [(0, 0), (0, 1)], ids=["one_gpu", "two_gpus"])
def test_testcudauva_four_cases_loopback(client, devices):
    """GASNet-EX testcudauva at 8 MiB in one process with two device
    endpoints, on one GPU or on two (loopback across devices)."""
    if max(devices) >= PROBE.get("device_count", 0):
        pytest.skip("needs two GPUs")
    n = 8 * MiB
    mk, hseg, ep1, ep2, d1, d2 = _setup(client, n, devices)
    to_d1 = client.ep(0).pair(1)                      # host EP -> EP 1's device segment
    assert to_d1.paths(0) == {"rma": "self", "atomic": "self"}
    src = np.random.default_rng(1).integers(0, 256, n, dtype=np.uint8)
    # 1. host -> GPU, NBI with LC_DEFER-like grouping
    to_d1.put_nbi(0, d1.address, src, lc=gexmk.LC_GROUP)
    gexmk.nbi_wait()
    back = np.zeros(n, np.uint8)
    # 2. GPU -> host, NB + wait_all
    gexmk.wait_all([to_d1.get_nb(back, 0, d1.address)])
    assert (back == src).all()
    # 3. GPU -> GPU between two device endpoints, blocking (local buffer in EP 2's segment)
    from_d2 = ep2.pair(1)
    from_d2.put(0, d1.address + 0, (d2.address, 0))   # zero bytes: fine
    to_d2 = client.ep(0).pair(2)
    to_d2.put(0, d2.address, src[::-1].copy())
    from_d2.put(0, d1.address, (d2.address, n))
    back[:] = 0
    to_d1.get(back, 0, d1.address)
    assert (back == src[::-1]).all()
    # 4. remote GPU -> local GPU, blocking get into EP 2's segment
    to_d1.put(0, d1.address, src)
    from_d2.get((d2.address, n), 0, d1.address)
    back[:] = 0
    to_d2.get(back, 0, d2.address)
    assert (back == src).all()
    # bounds are the device segment's
    with pytest.raises(E.BoundsError):
        to_d1.put(0, d1.address + n - 4, np.zeros(8, np.uint8))


@gpu
@needs_gpu
def test_device_atomics_exact_under_contention(client):
    mk, hseg, ep1, ep2, d1, d2 = _setup(client, MiB)
    to_d1 = client.ep(0).pair(1)
    ad = to_d1.ad_create(gexmk.DT_I64, gexmk.OP_FADD | gexmk.OP_GET | gexmk.OP_CAS | gexmk.OP_SET)
    a = d1.address + 64
    ad.op(0, a, gexmk.OP_SET, 0)
    per, nthreads = 200, 4

    def work():
        for _ in range(per):
            ad.op(0, a, gexmk.OP_FADD, 1)
    ts = [threading.Thread(target=work) for _ in range(nthreads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert ad.op(0, a, gexmk.OP_GET) == per * nthreads
    ad.op(0, a, gexmk.OP_CAS, per * nthreads, -5)
    assert ad.op(0, a, gexmk.OP_GET) == -5
    with pytest.raises(E.BoundsError, match="aligned"):
        ad.op(0, a + 4, gexmk.OP_FADD, 1)


@gpu
@needs_gpu
def test_device_segment_grows_in_place(client):
    mk = client.mk_create(gexmk.CUDA_UVA, 0)
    g = mk.impl.granularity
    seg = client.segment_create(g, kind=mk, reserve=4 * g)
    ep = client.ep_create()
    ep.bind_segment(seg)
    t = client.ep(0).pair(ep.index)
    addr = seg.address
    with pytest.raises(E.BoundsError):
        t.put(0, addr + 2 * g, b"tail")
    seg.grow(3 * g)
    assert seg.address == addr and seg.size == 3 * g
    t.put(0, addr + 2 * g, b"tail")
    out = bytearray(4)
    t.get(out, 0, addr + 2 * g)
    assert out == b"tail"
    with pytest.raises(E.GexmkError):
        seg.grow(8 * g)                               # past the reservation


@gpu
@needs_gpu
def test_cai_and_dlpack_are_zero_copy(client):
    cupy = pytest.importorskip("cupy")
    mk = client.mk_create(gexmk.CUDA_UVA, 0)
    seg = client.segment_create(MiB, kind=mk)
    ep = client.ep_create()
    ep.bind_segment(seg)
    t = client.ep(0).pair(ep.index)
    t.put(0, seg.address + 8, np.arange(4, dtype=np.uint8) + 1)
    view = cupy.asarray(seg)
    assert view.data.ptr == seg.address and view.size == MiB
    assert view[8:12].get().tolist() == [1, 2, 3, 4]
    view[100] = 77                                    # written on the device, read by a get
    cupy.cuda.runtime.deviceSynchronize()
    assert t.get_val(0, seg.address + 100, 1) == 77
    try:
        import torch
    except ImportError:
        return
    tt = torch.from_dlpack(seg)
    assert tt.data_ptr() == seg.address and tt.device.type == "cuda"
    with pytest.raises(BufferError):
        memoryview(seg)


@gpu
@needs_gpu
def test_client_allocated_device_segment(client):
    cupy = pytest.importorskip("cupy")
    arr = cupy.zeros(1 << 16, dtype=cupy.uint8)
    mk = client.mk_create(gexmk.CUDA_UVA, 0)
    seg = client.segment_create(buffer=arr, kind=mk)
    assert seg.address == arr.data.ptr and not seg.library_allocated
    ep = client.ep_create()
    ep.bind_segment(seg)
    client.ep(0).pair(ep.index).put(0, seg.address + 3, b"\x05\x06")
    assert arr[3:5].get().tolist() == [5, 6]
    # host memory is not device memory of this kind
    host = np.zeros(4096, np.uint8)
    with pytest.raises(E.GexmkError):
        client.segment_create(buffer=(host.ctypes.data, host.nbytes), kind=mk)


@gpu
@needs_gpu
def test_managed_memory_is_refused(client):
    cupy = pytest.importorskip("cupy")
    mk = client.mk_create(gexmk.CUDA_UVA, 0)
    mem = cupy.cuda.malloc_managed(1 << 16)           # small: the card's free memory is not at risk
    with pytest.raises(E.GexmkError, match="(?i)managed"):
        client.segment_create(buffer=(mem.ptr, 1 << 16), kind=mk)


@gpu
@needs_gpu
def test_destroyed_device_segment(client):
    mk = client.mk_create(gexmk.CUDA_UVA, 0)
    seg = client.segment_create(MiB, kind=mk)
    ep = client.ep_create()
    ep.bind_segment(seg)
    t = client.ep(0).pair(ep.index)
    a = seg.address
    seg.destroy()
    with pytest.raises(E.SegmentError):
        t.put(0, a, b"x")


# ---- two processes on one GPU: the nbrhd device path --------------------------------

try:
    from . import mp_util
except ImportError:
    import mp_util

TWO_RANK_WORKER = r'''
import threading
c = gexmk.init()
tm = c.tm
me, peer = tm.rank, 1 - tm.rank
n = 8 << 20
device = me if os.environ.get("GX_TEST_TWO_GPUS") else 0
mk = c.mk_create(gexmk.CUDA_UVA, device)
hseg = c.segment_attach(2 * n)                       # EP 0: host, published
ep1 = c.ep_create()
dseg = c.segment_create(2 * n, kind=mk)
ep1.bind_segment(dseg)
t0 = time.perf_counter()
tm.publish_bound_segment([ep1])
log(f"publication of an {n >> 20} MiB device segment: {(time.perf_counter() - t0) * 1e3:.2f} ms")
dev = c.ep(0).pair(1)                                # host EP -> each process's device EP
assert dev.paths(peer) == {"rma": "nbrhd", "atomic": "nbrhd"}, dev.paths(peer)
assert dev.paths(me) == {"rma": "self", "atomic": "self"}, dev.paths(me)
mine = ep1.pair(1)                                   # device EP -> device EPs
src = pattern(n, me, 1)
back = np.zeros(n, np.uint8)
# 1. host -> remote GPU, NBI
dev.put_nbi(peer, dev.addr(peer), src, lc=gexmk.LC_GROUP)
gexmk.nbi_wait()
tm.barrier()
dev.get(back, me, dev.addr(me))                      # the owner reads its own device memory
assert (back == pattern(n, peer, 1)).all(), "case 1"
# 2. remote GPU -> host, NB + wait_all
back[:] = 0
gexmk.wait_all([dev.get_nb(back, peer, dev.addr(peer))])
assert (back == pattern(n, me, 1)).all(), "case 2"
tm.barrier()
# 3. GPU -> remote GPU, crossed between the device endpoints, blocking: each
#    copies the upper half of its device segment into the peer's lower half
up = dseg.address + n
dev.put(me, dev.addr(me, n), pattern(n, me, 3))
tm.barrier()
mine.put(peer, mine.addr(peer), (up, n))
tm.barrier()
dev.get(back, me, dev.addr(me))
assert (back == pattern(n, peer, 3)).all(), "case 3"
tm.barrier()
# 4. remote GPU -> local GPU, blocking: the peer's upper half into my lower half
dev.put(me, dev.addr(me), np.zeros(n, np.uint8))
mine.get((dseg.address, n), peer, mine.addr(peer, n))
dev.get(back, me, dev.addr(me))
assert (back == pattern(n, peer, 3)).all(), "case 4"
tm.barrier()
# device atomics on rank 0's device word from both processes (and two threads each)
ad = dev.ad_create(gexmk.DT_I64, gexmk.OP_FADD | gexmk.OP_GET | gexmk.OP_SET)
word = dev.addr(0, 128)
if me == 0:
    ad.op(0, word, gexmk.OP_SET, 0)
tm.barrier()
def bump():
    for _ in range(300):
        ad.op(0, word, gexmk.OP_FADD, 1)
ts = [threading.Thread(target=bump) for _ in range(2)]
[t.start() for t in ts]
[t.join() for t in ts]
tm.barrier()
assert ad.op(0, word, gexmk.OP_GET) == 1200, ad.op(0, word, gexmk.OP_GET)
# a peer view written by a kernel of this process, read by the owner.  The
# mapping is accessible from this process's own GPU only: DLPack names that
# device (PyTorch launches there); CuPy picks the device from the pointer's
# attributes (the memory's physical GPU), so it serves the one-GPU case.
pv = dev.peer_view(peer)
assert pv.device == device, (pv, device)             # mapped for this process's own GPU
wrote = False
try:
    import torch
    view = torch.from_dlpack(pv)
    assert view.device.index == device, view.device
    view[4096:4100] = torch.arange(4, dtype=torch.uint8, device=view.device) + 10 * (me + 1)
    torch.cuda.synchronize(device)
    wrote = True
except ImportError:
    pass
if not wrote and not os.environ.get("GX_TEST_TWO_GPUS"):
    import cupy
    view = cupy.asarray(pv)
    view[4096:4100] = cupy.arange(4, dtype=cupy.uint8) + 10 * (me + 1)
    cupy.cuda.runtime.deviceSynchronize()
    wrote = True
tm.barrier()
if wrote:
    assert dev.get_val(me, dev.addr(me, 4096), 4) == int.from_bytes(
        bytes([10 * (peer + 1) + i for i in range(4)]), "little"), "peer view"
# bounds, and a destroyed segment republished as nothing
e = expect_raises(E.BoundsError, dev.put, peer, dev.addr(peer) + 2 * n - 2, b"1234")
tm.barrier()
dseg.destroy()
tm.publish_bound_segment([ep1])
expect_raises(E.SegmentError, dev.put, peer, 4096, b"x")
c.finalize()
print("OK", me, flush=True)
'''


@gpu
@needs_gpu
@pytest.mark.timeout(180)
@pytest.mark.parametrize("gpus", [1, 2], ids=["one_gpu", "two_gpus"])
def test_two_processes_testcudauva(tmp_path, gpus):
    """testcudauva's four cases at 8 MiB between two processes, on one GPU or
    one GPU each (device segments exported as VMM POSIX FDs, passed with
    SCM_RIGHTS, imported and mapped for the importer's own device), device
    atomics across the processes, a peer view written by a kernel, bounds and
    a withdrawn segment."""
    if gpus > PROBE.get("device_count", 0):
        pytest.skip(f"needs {gpus} GPUs")
    res = mp_util.run_job(tmp_path, TWO_RANK_WORKER, 2, launcher_timeout=120,
                          env={"GEXMK_TRANSPORT": None, "GX_TEST_TWO_GPUS": "1" if gpus == 2 else None})
    print(res.stderr)
    assert not res.timed_out, res.report()
    res.check()
    assert res.stdout.count("OK") == 2, res.report()


GPU_LESS_WORKER = r'''
if os.environ.get("GEXMK_RANK") == "1":
    os.environ["CUDA_VISIBLE_DEVICES"] = ""          # this rank sees no GPU
c = gexmk.init()
tm = c.tm
me = tm.rank
hseg = c.segment_attach(1 << 20)
ep1 = c.ep_create()
if me == 0:
    mk = c.mk_create(gexmk.CUDA_UVA, 0)
    dseg = c.segment_create(1 << 20, kind=mk)
    ep1.bind_segment(dseg)
    tm.publish_bound_segment([ep1])
else:
    expect_raises(E.UnsupportedError, c.mk_create, gexmk.CUDA_UVA, 0)
    tm.publish_bound_segment([])                     # zero device endpoints
dev = c.ep(0).pair(1)
if me == 1:
    bs = tm.query_bound_segment_nb(0)                # host EP 0 of rank 0: fine
    assert dev.paths(0)["rma"] == "none", dev.paths(0)
    e = expect_raises(E.UnsupportedError, dev.put, 0, dev.addr(0), b"x")
    assert "cuda_uva" in str(e), e
    desc = dev.query_bound_segment_nb(0).wait()
    assert desc.kind.name == "cuda_uva" and desc.kind.device == 0, desc
    tm.put(0, tm.addr(0, 8), b"host ok")             # host traffic still flows
tm.barrier()
if me == 0:
    assert bytes(np.asarray(hseg)[8:15]) == b"host ok"
c.finalize()
print("OK", me, flush=True)
'''


@gpu
@needs_gpu
@pytest.mark.timeout(120)
def test_rank_without_gpu_publishes_nothing_and_gets_clear_errors(tmp_path):
    res = mp_util.run_job(tmp_path, GPU_LESS_WORKER, 2, launcher_timeout=90)
    assert not res.timed_out, res.report()
    res.check()
    assert res.stdout.count("OK") == 2, res.report()


# ---- stream-ordered operations ------------------------------------------------------

@gpu
@needs_gpu
def test_put_on_stream_after_a_kernel_and_in_a_graph(client):
    cupy = pytest.importorskip("cupy")
    mk, hseg, ep1, ep2, d1, d2 = _setup(client, MiB)
    s = cupy.cuda.Stream(non_blocking=True)
    src = cupy.asarray(d2)[:4096]                     # a device array inside EP 2's segment
    from_d2 = ep2.pair(1)
    with s:
        src.fill(7)                                   # the kernel that produces the data
    from_d2.put_on_stream(0, d1.address, src, s)      # ordered after it, no host sync
    s.synchronize()
    back = np.zeros(4096, np.uint8)
    client.ep(0).pair(1).get(back, 0, d1.address)
    assert (back == 7).all()
    # the same captured into a CUDA graph and replayed
    s.begin_capture()
    with s:
        src += 1
    from_d2.put_on_stream(0, d1.address + 4096, src, s)
    graph = s.end_capture()
    for _ in range(3):
        graph.launch(s)
    s.synchronize()
    client.ep(0).pair(1).get(back, 0, d1.address + 4096)
    assert (back == 10).all(), back[:8]
    # to a host segment, through the endpoint's copy engine; and a get back
    from_d2.__class__                                 # (same team type)
    to_host = ep2.pair(0)
    to_host.put_on_stream(0, hseg.address + 64, src, s)
    s.synchronize()
    assert (np.asarray(hseg)[64:64 + 4096] == 10).all()
    dst = cupy.asarray(d2)[8192:8192 + 4096]
    to_host.get_on_stream(dst, 0, hseg.address + 64, s)
    s.synchronize()
    assert int(dst.sum()) == 10 * 4096
    # a device array outside the endpoint's segment, on its GPU: the same copy engine
    stray = cupy.full(16, 4, dtype=cupy.uint8)
    from_d2.put_on_stream(0, d1.address, stray, s)
    s.synchronize()
    from_d2.put(0, d1.address + 16, (stray.data.ptr, 16))
    client.ep(0).pair(1).get(back[:32], 0, d1.address)
    assert (back[:32] == 4).all()
    # refusals: stream 0, not a stream
    with pytest.raises(E.ArgumentError, match="legacy default stream"):
        from_d2.put_on_stream(0, d1.address, src, 0)
    with pytest.raises(TypeError, match="stream"):
        from_d2.put_on_stream(0, d1.address, src, "s")


CLIENT_MEM_WORKER = r'''
import cupy
c = gexmk.init()
tm = c.tm
me, peer = tm.rank, 1 - tm.rank
device = me if os.environ.get("GX_TEST_TWO_GPUS") else 0
with cupy.cuda.Device(device):
    arr = cupy.zeros(1 << 20, dtype=cupy.uint8)      # cudaMalloc: a legacy-IPC export
mk = c.mk_create(gexmk.CUDA_UVA, device)
hseg = c.segment_attach(1 << 20)
ep1 = c.ep_create()
seg = c.segment_create(buffer=arr, kind=mk)
ep1.bind_segment(seg)
tm.publish_bound_segment([ep1])
dev = c.ep(0).pair(1)
assert dev.paths(peer)["rma"] == "nbrhd", dev.paths(peer)
dev.put(peer, dev.addr(peer, 100), pattern(4096, me, 7))
tm.barrier()
with cupy.cuda.Device(device):
    got = cupy.asnumpy(arr[100:100 + 4096])
assert (got == pattern(4096, peer, 7)).all(), "client-allocated device memory of the peer"
back = np.zeros(4096, np.uint8)
dev.get(back, peer, dev.addr(peer, 100))
assert (back == pattern(4096, me, 7)).all()
c.finalize()
print("OK", me, flush=True)
'''


@gpu
@needs_gpu
@pytest.mark.timeout(120)
@pytest.mark.parametrize("gpus", [1, 2], ids=["one_gpu", "two_gpus"])
def test_client_allocated_device_memory_across_processes(tmp_path, gpus):
    """A CuPy (cudaMalloc) array bound as a segment travels as a legacy IPC
    handle; the peer puts and gets through it."""
    pytest.importorskip("cupy")
    if gpus > PROBE.get("device_count", 0):
        pytest.skip(f"needs {gpus} GPUs")
    res = mp_util.run_job(tmp_path, CLIENT_MEM_WORKER, 2, launcher_timeout=90,
                          env={"GX_TEST_TWO_GPUS": "1" if gpus == 2 else None})
    assert not res.timed_out, res.report()
    res.check()
    assert res.stdout.count("OK") == 2, res.report()


@gpu
@needs_gpu
def test_nb_and_nbi_device_copies_complete_through_events(client):
    """NB puts/gets to device segments run on the endpoint's own stream and
    complete through a CUDA event (test/wait); implicit ones through the
    endpoint's sync (nbi_test / nbi_wait / an access region)."""
    n = 64 * MiB
    mk, hseg, ep1, ep2, d1, d2 = _setup(client, n)
    to_d1 = client.ep(0).pair(1)
    src = np.random.default_rng(3).integers(0, 256, n, dtype=np.uint8)
    ev = to_d1.put_nb(0, d1.address, src, lc=gexmk.LC_DEFER)
    assert isinstance(ev.test(), bool)               # pending or done, never an error
    ev.wait()
    back = np.zeros(n, np.uint8)
    evs = [to_d1.get_nb(back[i * (n // 4):(i + 1) * (n // 4)], 0, d1.address + i * (n // 4))
           for i in range(4)]
    gexmk.wait_all(evs)
    assert (back == src).all()
    # implicit: LC_GROUP puts are asynchronous until nbi_wait
    to_d1.put_nbi(0, d1.address, src[::-1].copy(), lc=gexmk.LC_GROUP)
    while not gexmk.nbi_test():
        pass
    with gexmk.nbi_access_region() as rev:
        to_d1.get_nbi(back, 0, d1.address)
    rev.wait()
    assert (back == src[::-1]).all()
    # device -> device NB between the two device endpoints
    from_d2 = ep2.pair(1)
    client.ep(0).pair(2).put(0, d2.address, src)
    from_d2.put_nb(0, d1.address, (d2.address, n), lc=gexmk.LC_DEFER).wait()
    to_d1.get(back, 0, d1.address)
    assert (back == src).all()
    # an event left pending is failed by finalize, and dropping one is harmless
    to_d1.put_nb(0, d1.address, src, lc=gexmk.LC_DEFER)
    gexmk.nbi_wait()


def test_grow_refuses_bad_sizes_without_a_gpu(client):
    seg = client.segment_create(4096)
    with pytest.raises(TypeError, match="grow: size must be an int"):
        seg.grow(8192.0)
    with pytest.raises(TypeError, match="grow: size must be an int"):
        seg.grow("8192")
    with pytest.raises(E.UnsupportedError, match="device segments"):
        seg.grow(-1)                                  # host segments never grow
    seg.destroy()
    with pytest.raises(E.StateError):
        seg.grow(8192)


STREAM_WORKER = r'''
import cupy
c = gexmk.init()
tm = c.tm
me, peer = tm.rank, 1 - tm.rank
device = me if os.environ.get("GX_TEST_TWO_GPUS") else 0
mk = c.mk_create(gexmk.CUDA_UVA, device)
hseg = c.segment_attach(1 << 20)
ep1 = c.ep_create()
dseg = c.segment_create(4 << 20, kind=mk)
ep1.bind_segment(dseg)
tm.publish_bound_segment([ep1])
dev = ep1.pair(1)                                     # device EP -> device EPs
assert dev.paths(peer)["rma"] == "nbrhd", dev.paths(peer)
n = 1 << 20
with cupy.cuda.Device(device):
    s = cupy.cuda.Stream(non_blocking=True)
    src = cupy.asarray(dseg)[:n]                     # inside this EP's device segment
    with s:
        src.fill(me + 1)                              # the kernel that produces the data
    dev.put_on_stream(peer, dev.addr(peer, n), src, s)   # ordered after it, no host sync
    s.synchronize()
tm.barrier()
with cupy.cuda.Device(device):
    got = cupy.asnumpy(cupy.asarray(dseg)[n:2 * n])
assert (got == peer + 1).all(), ("stream put", got[:8])
tm.barrier()
# captured into a CUDA graph (kernel + put to the other process's segment), replayed
with cupy.cuda.Device(device):
    s.begin_capture()
    with s:
        src += 1
    dev.put_on_stream(peer, dev.addr(peer, 2 * n), src, s)
    graph = s.end_capture()
    for _ in range(3):
        graph.launch(s)
    s.synchronize()
tm.barrier()
with cupy.cuda.Device(device):
    got = cupy.asnumpy(cupy.asarray(dseg)[2 * n:3 * n])
assert (got == peer + 4).all(), ("graph put", got[:8])
# a get on the stream from the peer's segment into mine
with cupy.cuda.Device(device):
    dst = cupy.asarray(dseg)[3 * n:4 * n]
    dev.get_on_stream(dst, peer, dev.addr(peer, 2 * n), s)
    s.synchronize()
    assert int(dst[:16].sum()) == 16 * (me + 4)
tm.barrier()
c.finalize()
print("OK", me, flush=True)
'''


@gpu
@needs_gpu
@pytest.mark.timeout(120)
@pytest.mark.parametrize("gpus", [1, 2], ids=["one_gpu", "two_gpus"])
def test_stream_ordered_puts_across_processes_and_in_a_graph(tmp_path, gpus):
    """put_on_stream into another process's device segment (on the same GPU,
    or the other GPU over NVLink), ordered after a kernel, and the same
    captured into a CUDA graph and replayed; a get on the stream back."""
    pytest.importorskip("cupy")
    if gpus > PROBE.get("device_count", 0):
        pytest.skip(f"needs {gpus} GPUs")
    res = mp_util.run_job(tmp_path, STREAM_WORKER, 2, launcher_timeout=90,
                          env={"GX_TEST_TWO_GPUS": "1" if gpus == 2 else None})
    assert not res.timed_out, res.report()
    res.check()
    assert res.stdout.count("OK") == 2, res.report()


EXPANDABLE_WORKER = r'''
import torch
c = gexmk.init()
tm = c.tm
me, peer = tm.rank, 1 - tm.rank
mk = c.mk_create(gexmk.CUDA_UVA, 0)
hseg = c.segment_attach(1 << 20)
# expandable_segments: the caching allocator maps VMM chunks into one reserved
# range; a large tensor spans several chunks (each its own allocation handle)
x = torch.zeros(48 << 20, dtype=torch.uint8, device="cuda:0")
ep1 = c.ep_create()
seg = c.segment_create(buffer=x, kind=mk)
ep1.bind_segment(seg)
tm.publish_bound_segment([ep1])
dev = c.ep(0).pair(1)
assert dev.paths(peer)["rma"] == "nbrhd", dev.paths(peer)
n = 48 << 20
data = pattern(n, me, 11)
dev.put(peer, dev.addr(peer), data)                 # across every chunk of the peer's tensor
tm.barrier()
torch.cuda.synchronize()
assert (x.cpu().numpy() == pattern(n, peer, 11)).all(), "expandable segment written by the peer"
back = np.zeros(n, np.uint8)
dev.get(back, peer, dev.addr(peer))
assert (back == data).all()
tm.barrier()
c.finalize()
print("OK", me, flush=True)
'''


@gpu
@needs_gpu
@pytest.mark.timeout(120)
def test_pytorch_expandable_segments_bound_across_processes(tmp_path):
    """A PyTorch tensor from the expandable-segments allocator (VMM memory in
    several chunks) bound as a segment and reached by a peer process."""
    pytest.importorskip("torch")
    res = mp_util.run_job(tmp_path, EXPANDABLE_WORKER, 2, launcher_timeout=90,
                          env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    assert not res.timed_out, res.report()
    res.check()
    assert res.stdout.count("OK") == 2, res.report()
