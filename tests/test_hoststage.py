"""Host-staged device paths (issue 11): with GEXMK_CUDA_PEER_ACCESS=off (or
where the driver refuses to map another GPU's memory for this GPU) a peer's
device segment is mapped for its own GPU, and device<->device copies between
segments of different endpoints go through pinned host memory, visibly
(paths ``nbrhd-staged`` / ``self-staged``, staged: refused by
GEXMK_STAGED=refuse).  GPU tests carry the ``gpu`` marker and skip without a
driver; the option's parsing is checked everywhere."""
import numpy as np
import pytest

import gexmk
from gexmk import errors as E
from gexmk import config

try:
    from . import mp_util
    from .test_cuda_segments import PROBE, HAVE_GPU
except ImportError:
    import mp_util
    from test_cuda_segments import PROBE, HAVE_GPU

gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not HAVE_GPU, reason="no NVIDIA driver or device on this machine")
MiB = 1 << 20


def test_peer_access_option_parses():
    assert config.load({}).cuda_peer_access == "auto"
    assert config.load({"GEXMK_CUDA_PEER_ACCESS": "off"}).cuda_peer_access == "off"
    assert config.load({"GEXMK_CUDA_PEER_ACCESS": "0"}).cuda_peer_access == "off"
    assert config.load({"GEXMK_CUDA_PEER_ACCESS": "Auto"}).cuda_peer_access == "auto"
    with pytest.raises(E.ArgumentError, match="GEXMK_CUDA_PEER_ACCESS"):
        config.load({"GEXMK_CUDA_PEER_ACCESS": "sometimes"})


STAGED_WORKER = r'''
c = gexmk.init()
tm = c.tm
me, peer = tm.rank, 1 - tm.rank
device = me if os.environ.get("GX_TEST_TWO_GPUS") else 0
refuse = os.environ.get("GEXMK_STAGED") == "refuse"
n = 8 * (1 << 20) + 12345                            # not a multiple of the chunk
mk = c.mk_create(gexmk.CUDA_UVA, device)
hseg = c.segment_attach(2 * n)                       # EP 0: host, published
ep1 = c.ep_create()
dseg = c.segment_create(2 * n + 4096, kind=mk)
ep1.bind_segment(dseg)
tm.publish_bound_segment([ep1])
dev = c.ep(0).pair(1)                                # host EP -> device EPs: direct
mine = ep1.pair(1)                                   # device EP -> device EPs: staged
assert dev.paths(peer)["rma"] == "nbrhd", dev.paths(peer)
if refuse:
    assert mine.paths(peer)["rma"] == "refused:nbrhd-staged", mine.paths(peer)
    e = expect_raises(E.UnsupportedError, mine.put, peer, mine.addr(peer), (dseg.address, 64))
    assert "nbrhd-staged" in str(e), e
    tm.barrier()
    c.finalize()
    print("OK", me, flush=True)
    raise SystemExit(0)
assert mine.paths(peer) == {"rma": "nbrhd-staged", "atomic": "nbrhd-staged"}, mine.paths(peer)
expect_raises(E.UnsupportedError, mine.peer_view, peer)
src = pattern(n, me, 1)
back = np.zeros(n, np.uint8)
# 1. host -> remote GPU, NBI (direct: the segment's GPU reads host memory)
dev.put_nbi(peer, dev.addr(peer), src, lc=gexmk.LC_GROUP)
gexmk.nbi_wait()
tm.barrier()
dev.get(back, me, dev.addr(me))
assert (back == pattern(n, peer, 1)).all(), "case 1"
# 2. remote GPU -> host, NB + wait_all
back[:] = 0
gexmk.wait_all([dev.get_nb(back, peer, dev.addr(peer))])
assert (back == pattern(n, me, 1)).all(), "case 2"
tm.barrier()
# 3. GPU -> remote GPU through pinned host memory, blocking
dev.put(me, dev.addr(me, n), pattern(n, me, 3))
tm.barrier()
mine.put(peer, mine.addr(peer), (dseg.address + n, n))
tm.barrier()
dev.get(back, me, dev.addr(me))
assert (back == pattern(n, peer, 3)).all(), "case 3"
tm.barrier()
# 4. remote GPU -> local GPU through pinned host memory, blocking; NB form too
dev.put(me, dev.addr(me), np.zeros(n, np.uint8))
mine.get((dseg.address, n), peer, mine.addr(peer, n))
dev.get(back, me, dev.addr(me))
assert (back == pattern(n, peer, 3)).all(), "case 4"
dev.put(me, dev.addr(me), np.zeros(n, np.uint8))
mine.get_nb((dseg.address + 100, 5000), peer, mine.addr(peer, n + 100)).wait()
dev.get(back[:5000], me, dev.addr(me, 100))
assert (back[:5000] == pattern(n, peer, 3)[100:5100]).all(), "case 4, NB"
tm.barrier()
# atomics on the peer's device word through the staged route, both processes
ad = mine.ad_create(gexmk.DT_I64, gexmk.OP_FADD | gexmk.OP_GET | gexmk.OP_SET)
word = mine.addr(0, 2 * n + 8 - (2 * n) % 8)
if me == 0:
    ad.op(0, word, gexmk.OP_SET, 0)
tm.barrier()
for _ in range(250):
    ad.op(0, word, gexmk.OP_FADD, 1)
tm.barrier()
assert ad.op(0, word, gexmk.OP_GET) == 500, ad.op(0, word, gexmk.OP_GET)
stats = mine.path_stats(peer)
assert stats["nbrhd-staged"]["put"]["ops"] >= 1 and stats["nbrhd-staged"]["get"]["ops"] >= 2, stats
tm.barrier()
c.finalize()
print("OK", me, flush=True)
'''


@gpu
@needs_gpu
@pytest.mark.timeout(150)
@pytest.mark.parametrize("staged", ["allow", "refuse"])
@pytest.mark.parametrize("gpus", [1, 2], ids=["one_gpu", "two_gpus"])
def test_two_processes_host_staged(tmp_path, gpus, staged):
    """testcudauva's four cases at 8 MiB (+ an odd tail) with peer access
    forced off: device<->device between the processes through pinned host
    memory, atomics on the segment's own GPU, counters, and the refusal."""
    if gpus > PROBE.get("device_count", 0):
        pytest.skip(f"needs {gpus} GPUs")
    res = mp_util.run_job(tmp_path, STAGED_WORKER, 2, launcher_timeout=120,
                          env={"GEXMK_CUDA_PEER_ACCESS": "off", "GEXMK_STAGED": staged,
                               "GX_TEST_TWO_GPUS": "1" if gpus == 2 else None})
    assert not res.timed_out, res.report()
    res.check()
    assert res.stdout.count("OK") == 2, res.report()


@gpu
@needs_gpu
@pytest.mark.parametrize("gpus", [1, 2], ids=["one_gpu", "two_gpus"])
def test_one_process_two_device_endpoints_host_staged(monkeypatch, gpus):
    if gpus > PROBE.get("device_count", 0):
        pytest.skip(f"needs {gpus} GPUs")
    monkeypatch.setenv("GEXMK_CUDA_PEER_ACCESS", "off")
    n = 3 * MiB + 777
    with gexmk.init() as c:
        mks = [c.mk_create(gexmk.CUDA_UVA, 0), c.mk_create(gexmk.CUDA_UVA, gpus - 1)]
        host = c.segment_attach(2 * n)
        eps, segs = [], []
        for mk in mks:
            ep = c.ep_create()
            seg = c.segment_create(n, kind=mk)
            ep.bind_segment(seg)
            eps.append(ep)
            segs.append(seg)
        h0 = c.ep(0).pair(eps[0].index)                # host EP -> each device segment
        h1 = c.ep(0).pair(eps[1].index)
        a = eps[0].pair(eps[1].index)                  # device EP 1 -> device EP 2
        assert a.paths(0)["rma"] == "self-staged", a.paths(0)
        assert h1.paths(0)["rma"] == "self", h1.paths(0)
        data = np.random.default_rng(5).integers(0, 256, n, dtype=np.uint8)
        h0.put(0, segs[0].address, data)
        a.put(0, segs[1].address, (segs[0].address, n))
        back = np.zeros(n, np.uint8)
        h1.get(back, 0, segs[1].address)
        assert (back == data).all()
        h0.put(0, segs[0].address, np.zeros(n, np.uint8))
        a.get((segs[0].address + 1, n - 1), 0, segs[1].address + 1)
        h0.get(back, 0, segs[0].address)
        assert back[0] == 0 and (back[1:] == data[1:]).all()
        # VIS with host blocks on the staged path, blocking, NB and NBI: the target's
        # GPU copies them, complete at issue (fuzz seed 7502: the NB forms' wait, and
        # a blocking call's chunks, raised UnsupportedError -- no op to wait for)
        def vis(name, form, *args):
            if form == "blocking":
                getattr(a, name)(*args)
            elif form == "nb":
                getattr(a, name + "_nb")(*args).wait()
            else:
                getattr(a, name + "_nbi")(*args)
                gexmk.nbi_wait()

        k = 64
        dsts = [(segs[1].address + i * 4096 + 7, 100) for i in range(k)]
        want = np.concatenate([data[i * 100:(i + 1) * 100] for i in range(k)])
        for form in ("blocking", "nb", "nbi"):
            h1.put(0, segs[1].address, np.zeros(k * 4096, np.uint8))
            vis("put_vector", form, 0, dsts, [data[i * 100:(i + 1) * 100] for i in range(k)])
            got = np.zeros(k * 4096, np.uint8)
            h1.get(got, 0, segs[1].address)
            assert np.array_equal(np.concatenate([got[i * 4096 + 7:i * 4096 + 107]
                                                  for i in range(k)]), want), form
            outs = [np.zeros(100, np.uint8) for _ in range(k)]
            vis("get_vector", form, outs, 0, dsts)
            assert np.array_equal(np.concatenate(outs), want), form


STREAM_STAGED_WORKER = r'''
import cupy
c = gexmk.init()
tm = c.tm
me, peer = tm.rank, 1 - tm.rank
device = me if os.environ.get("GX_TEST_TWO_GPUS") else 0
mk = c.mk_create(gexmk.CUDA_UVA, device)
hseg = c.segment_attach(1 << 20)
ep1 = c.ep_create()
n = 9 * (1 << 20) + 4096 + 333                        # several staged chunks and an odd tail
dseg = c.segment_create(4 * n + 4096, kind=mk)
ep1.bind_segment(dseg)
tm.publish_bound_segment([ep1])
mine = ep1.pair(1)
assert mine.paths(peer)["rma"] == "nbrhd-staged", mine.paths(peer)
with cupy.cuda.Device(device):
    s = cupy.cuda.Stream(non_blocking=True)
    whole = cupy.asarray(dseg)
    src, got, back = whole[:n], whole[n:2 * n], whole[2 * n:3 * n]
    host = cupy.cuda.alloc_pinned_memory(n)
    hview = np.frombuffer(host, np.uint8, n)
    with s:
        got.fill(0)
        src.fill(me + 1)                              # the kernel that produces the data
        cupy.cuda.runtime.memsetAsync(src.data.ptr + n - 333, me + 7, 333, s.ptr)
    # device -> peer device on the stream, after the kernels, no host wait
    mine.put_on_stream(peer, mine.addr(peer, n), src, s)
    with s:
        src.fill(99)                                  # after the put: must not reach the peer
    s.synchronize()
tm.barrier()
with cupy.cuda.Device(device):
    g = cupy.asnumpy(got)
    assert (g[:n - 333] == peer + 1).all() and (g[n - 333:] == peer + 7).all(), ("stream put", g[:8])
    # a get on the stream from the peer's segment (what it received from me), into mine
    mine.get_on_stream(back, peer, mine.addr(peer, n), s)
    s.synchronize()
    b = cupy.asnumpy(back)
    assert (b[:n - 333] == me + 1).all() and (b[n - 333:] == me + 7).all(), ("stream get", b[:8])
    # host memory <-> the peer's device segment on the stream (the segment's GPU copies)
    hview[:] = 5 + me
    mine.put_on_stream(peer, mine.addr(peer, 3 * n), (host.ptr, n), s)
    s.synchronize()
tm.barrier()
with cupy.cuda.Device(device):
    assert int(cupy.asarray(dseg)[3 * n:4 * n].sum()) == n * (5 + peer)
    # a graph capture is refused, naming the path
    s.begin_capture()
    try:
        expect_raises(E.UnsupportedError, mine.put_on_stream, peer, mine.addr(peer), src, s)
    finally:
        s.end_capture()
    # a plain staged put still works after the stream-ordered ones (the buffers waited for)
    mine.put(peer, mine.addr(peer, 2 * n), (dseg.address, 4096))
tm.barrier()
c.finalize()
print("OK", me, flush=True)
'''


@gpu
@needs_gpu
@pytest.mark.timeout(150)
@pytest.mark.parametrize("gpus", [1, 2], ids=["one_gpu", "two_gpus"])
def test_stream_ordered_on_host_staged_paths(tmp_path, gpus):
    """put_on_stream / get_on_stream over nbrhd-staged: ordered after the
    kernels before them and before those after, with no host wait; host
    memory on the stream too; a graph capture refused by name."""
    pytest.importorskip("cupy")
    if gpus > PROBE.get("device_count", 0):
        pytest.skip(f"needs {gpus} GPUs")
    res = mp_util.run_job(tmp_path, STREAM_STAGED_WORKER, 2, launcher_timeout=120,
                          env={"GEXMK_CUDA_PEER_ACCESS": "off",
                               "GX_TEST_TWO_GPUS": "1" if gpus == 2 else None})
    assert not res.timed_out, res.report()
    res.check()
    assert res.stdout.count("OK") == 2, res.report()
