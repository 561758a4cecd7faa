"""Device memory that cannot be exported, reached from the node: the path
``nbrhd-landed`` (issue 9).

Stream-ordered pool memory (``cudaMallocAsync``) has no shareable handle, so
a peer process cannot map it; its owner offers a landing zone of shared
pinned host memory that its lander thread copies in and out of.  On this
CPU-only machine GEXMK_NBRHD_STAGE=all sends library-allocated host segments
through the same zones (memcpy and CPU atomics), so every step of the
protocol runs here: chunked puts and gets across slot reuse, NB and NBI
forms, atomics under contention (exact counts), put_signal + wait_until,
per-path counters, the refusal of staged paths, a killed owner.  The GPU
tests (marker ``gpu``) run testcudauva's cases against pool memory of
another process on the same GPU.
"""
import pytest

from gexmk import config
from gexmk import errors as E

try:
    from . import mp_util
    from .staged_worker import staged_worker
    from .test_cuda_segments import HAVE_GPU
except ImportError:
    import mp_util
    from staged_worker import staged_worker
    from test_cuda_segments import HAVE_GPU

gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not HAVE_GPU, reason="no NVIDIA driver or device on this machine")


def landed_env(**extra):
    env = {"GEXMK_TRANSPORT": None, "GEXMK_TIMEOUT": 30, "GEXMK_NBRHD_STAGE": "all",
           "GEXMK_NBRHD_STAGE_CHUNK": "64K", "GEXMK_NBRHD_STAGE_SLOTS": "3", "GEXMK_STAGED": None}
    env.update(extra)
    return env


def test_landing_options_parse():
    cfg = config.load({})
    assert (cfg.nbrhd_stage, cfg.nbrhd_stage_chunk, cfg.nbrhd_stage_slots) == ("auto", 4 << 20, 4)
    cfg = config.load({"GEXMK_NBRHD_STAGE": "all", "GEXMK_NBRHD_STAGE_CHUNK": "256K",
                       "GEXMK_NBRHD_STAGE_SLOTS": "8"})
    assert (cfg.nbrhd_stage, cfg.nbrhd_stage_chunk, cfg.nbrhd_stage_slots) == ("all", 256 << 10, 8)
    for bad in ({"GEXMK_NBRHD_STAGE": "some"}, {"GEXMK_NBRHD_STAGE_SLOTS": "17"},
                {"GEXMK_NBRHD_STAGE_CHUNK": "1"}):
        with pytest.raises(E.ArgumentError, match=next(iter(bad))):
            config.load(bad)


WORKER = staged_worker("nbrhd-landed", "local", "GEXMK_NBRHD_STAGE_CHUNK")


def _run(tmp_path, n, worker=WORKER, **env):
    r = mp_util.run_job(tmp_path, worker, n, launcher_timeout=150, env=landed_env(**env))
    assert r.returncode == 0, r.report()
    assert r.stdout.count("OK") == n, r.stdout
    return r


@pytest.mark.parametrize("n", [2, 4])
def test_landed_protocol(tmp_path, n):
    _run(tmp_path, n)


def test_landed_with_different_chunk_sizes(tmp_path):
    """Each zone's geometry is its owner's: an initiator cuts chunks to the target's slots."""
    _run(tmp_path, 2, GX_MIXED_CHUNKS="1")


def test_landed_refused(tmp_path):
    _run(tmp_path, 2, GEXMK_STAGED="refuse")


def test_landed_owner_killed(tmp_path):
    """An owner that dies while an initiator waits for its lander: the
    initiator gets PeerDeadError or TimeoutError naming the path, no hang."""
    worker = r'''
import signal, time
c = gexmk.init()
tm = c.tm
me = tm.rank
seg = c.segment_attach(1 << 20)
tm.barrier()
if me == 1:
    time.sleep(0.3)
    os.kill(os.getpid(), signal.SIGKILL)      # the owner (and its lander) dies
time.sleep(1.0)
t0 = time.monotonic()
try:
    for _ in range(200):
        tm.put(1, tm.addr(1, 0), b"x" * 300000)
except (E.PeerDeadError, E.TimeoutError) as e:
    assert "nbrhd-landed" in str(e) or "job rank 1" in str(e), e
    print("OK raised", type(e).__name__, round(time.monotonic() - t0, 2), flush=True)
    os._exit(0)
raise AssertionError("puts to a dead owner's landing zone all succeeded")
'''
    r = mp_util.run_job(tmp_path, worker, 2, keep_going=True, launcher_timeout=60,
                        env=landed_env(GEXMK_TIMEOUT=5))
    assert "OK raised" in r.stdout, r.report()


VIS_WORKER = r'''
import numpy as np
c = gexmk.init()
tm = c.tm
me, peer = tm.rank, 1 - tm.rank
tr = c.transports["local"]
seg = c.segment_attach(4 << 20)
mem = np.asarray(seg).view(np.uint8)
mem[:] = 0
tm.barrier()
assert tm.paths(peer)["rma"] == "nbrhd-landed", tm.paths(peer)
rng = np.random.default_rng(me)

def quiet_served(f):
    """f(), then the requests this process's lander served for the peer's f()
    (the count read before the barrier that lets the peer start)."""
    tm.barrier()
    before = tr.landed
    tm.barrier()
    f()
    tm.barrier()
    return tr.landed - before

# 1. a 1-byte-stride view of 300,000 elements, contiguous at the target: each of the
# core's VIS chunks (GX_VIS_CHUNK = 4096 fragments) gathered and landed as one request,
# 74 in all, not one per element (the lander counts a request before answering it,
# so a count read after a barrier is exact; the count must be read before the
# peer may start: read after the barrier, the peer's first requests could fall
# before it, 61 of 74 counted in CI on 2686d19)
K = 300000
CHUNKS = -(-K // 4096)
wide = np.zeros(2 * K, np.uint8)
wide[::2] = rng.integers(1, 256, K, dtype=np.uint8)
n = quiet_served(lambda: tm.put(peer, tm.addr(peer, 0), wide[::2]))
assert n == CHUNKS, (n, CHUNKS)
want_from_peer = np.random.default_rng(peer).integers(1, 256, K, dtype=np.uint8)
assert mem[:K].tobytes() == want_from_peer.tobytes(), "strided put"
back = np.zeros(2 * K, np.uint8)
n = quiet_served(lambda: tm.get(back[::2], peer, tm.addr(peer, 0)))
assert n == CHUNKS, (n, CHUNKS)
assert back[::2].tobytes() == wide[::2].tobytes() and not back[1::2].any(), "strided get"
# 2. indexed blocks scattered at the target: small ones (100 B) and ones over a
# slot (100 KiB), NB and NBI, every byte and the gaps between them checked
tm.barrier()
mem[:] = 0
tm.barrier()
base = 1 << 20
small = [(base + i * 300, 100) for i in range(2000)]
large = [(base + 700000 + i * 150000, 100000) for i in range(3)]
blocks = small[:1000] + large[:1] + small[1000:] + large[1:]
data = rng.integers(1, 256, sum(b[1] for b in blocks), dtype=np.uint8)
srcs, pos = [], 0
for off, m in blocks:
    srcs.append(data[pos:pos + m])
    pos += m
dsts = [(tm.addr(peer, off), m) for off, m in blocks]
tm.put_vector_nb(peer, dsts, srcs).wait()
tm.barrier()
pdata = np.random.default_rng(peer)
pdata.integers(1, 256, K, dtype=np.uint8)
pdata = pdata.integers(1, 256, len(data), dtype=np.uint8)
expect = np.zeros(4 << 20, np.uint8)
pos = 0
for off, m in blocks:
    expect[off:off + m] = pdata[pos:pos + m]
    pos += m
assert np.array_equal(mem, expect), "vector put: blocks or gaps"
got = np.zeros(len(data), np.uint8)
outs, pos = [], 0
for off, m in blocks:
    outs.append(got[pos:pos + m])
    pos += m
tm.get_vector_nbi(outs, peer, [(tm.addr(peer, off), m) for off, m in blocks])
gexmk.nbi_wait(gexmk.EC_GET)
assert np.array_equal(got, data), "vector get"
tm.barrier()
print("OK", me, flush=True)
c.finalize()
'''


def test_landed_vis_gathers_small_blocks(tmp_path):
    """VIS through a landing zone: a 1-byte-stride view goes as a few landed
    requests (the run contiguous at the target), not one per element; scattered
    small and slot-sized blocks, NB and NBI, every byte and gap checked."""
    _run(tmp_path, 2, VIS_WORKER)


POOL_WORKER = r'''
import numpy as np, time
import cupy
from cuda.bindings import driver as cu
P = lambda *a: pattern(*a).tobytes()
c = gexmk.init()
tm = c.tm
me, peer = tm.rank, 1 - tm.rank
N = 8 << 20
mk = c.mk_create(gexmk.CUDA_UVA, 0)
hseg = c.segment_attach(2 * N)                        # EP 0: host
with cupy.cuda.Device(0):
    s = cupy.cuda.Stream(non_blocking=True)
    pool = cupy.cuda.runtime.mallocAsync(2 * N, s.ptr)  # stream-ordered pool memory
    s.synchronize()
ep1, ep2 = c.ep_create(), c.ep_create()
pseg = c.segment_create(buffer=(pool, 2 * N), kind=mk)  # EP 1: pool memory (not exportable)
dseg = c.segment_create(2 * N, kind=mk)                 # EP 2: a library device segment
assert not pseg.allocation.exportable
ep1.bind_segment(pseg)
ep2.bind_segment(dseg)
tm.publish_bound_segment([ep1, ep2])
h1 = c.ep(0).pair(1)                                  # host EP 0 -> peers' pool EP 1
t21 = ep2.pair(1)                                     # device EP 2 -> peers' pool EP 1
assert h1.paths(peer) == {"rma": "nbrhd-landed", "atomic": "nbrhd-landed"}, h1.paths(peer)
assert t21.paths(peer)["rma"] == "nbrhd-landed", t21.paths(peer)

def dev_fill(addr, data):
    cu.cuMemcpyHtoD(addr, data, len(data))

def dev_read(addr, n):
    out = np.zeros(n, np.uint8)
    cu.cuMemcpyDtoH(out.ctypes.data, addr, n)
    return out.tobytes()

cu.cuCtxPushCurrent(mk.impl.context)
hmem = np.asarray(hseg)
hmem[:N] = np.frombuffer(P(N, me, 7), np.uint8)
dev_fill(pool + N, P(N, me, 8))
dev_fill(dseg.address, P(N, me, 9))
tm.barrier()
# 1. host -> remote pool GPU (NBI)
h1.put_nbi(peer, h1.addr(peer, 0), (hseg.address, N))
gexmk.nbi_wait(gexmk.EC_PUT)
tm.barrier()
assert dev_read(pool, N) == P(N, peer, 7), "case 1: host -> remote pool GPU"
# 2. remote pool GPU -> host (NB, wait_all)
hmem[N:] = 0
ev = h1.get_nb((hseg.address + N, N), peer, h1.addr(peer, N))
gexmk.wait_all([ev])
assert hmem[N:].tobytes() == P(N, peer, 8), "case 2: remote pool GPU -> host"
tm.barrier()
# 3. GPU -> remote pool GPU (blocking), from a device endpoint
t21.put(peer, t21.addr(peer, 0), (dseg.address, N))
tm.barrier()
assert dev_read(pool, N) == P(N, peer, 9), "case 3: GPU -> remote pool GPU"
# 4. remote pool GPU -> local GPU (blocking)
t21.get((dseg.address + N, N), peer, t21.addr(peer, N))
assert dev_read(dseg.address + N, N) == P(N, peer, 8), "case 4: remote pool GPU -> local GPU"
tm.barrier()
# 5. a 1-byte-stride CuPy view of the device segment -> remote pool and back: its
# blocks gathered by one batched copy, landed as a few runs (one landed transfer
# per block took seconds), every byte checked, and the interleaved bytes untouched
K = 196613
dv = cupy.asarray(dseg)
dv[:2 * K] = 0
dv[:2 * K:2] = cupy.asarray(np.frombuffer(P(K, me, 10), np.uint8))
cupy.cuda.runtime.deviceSynchronize()
tm.barrier()
served = c.transports["local"].landed
t21.put(peer, t21.addr(peer, 0), dv[:2 * K:2])
tm.barrier()
assert dev_read(pool, K) == P(K, peer, 10), "case 5: strided CuPy view -> remote pool"
assert c.transports["local"].landed - served < 64, c.transports["local"].landed - served
dv[:2 * K] = 0
cupy.cuda.runtime.deviceSynchronize()
t21.get(dv[:2 * K:2], peer, t21.addr(peer, 0))
got = cupy.asnumpy(dv[:2 * K])
assert got[::2].tobytes() == P(K, me, 10) and not got[1::2].any(), "case 5: remote pool -> view"
tm.barrier()
# ... and a numpy view of the same shape on a stream: each window gathered (scattered)
# by a host function when the stream reaches it, not a host function per byte
s5 = cupy.cuda.Stream(non_blocking=True)
hv = np.zeros(2 * K, np.uint8)
hv[::2] = np.frombuffer(P(K, me, 11), np.uint8)
t21.put_on_stream(peer, t21.addr(peer, 0), hv[::2], s5)
s5.synchronize()
tm.barrier()
assert dev_read(pool, K) == P(K, peer, 11), "case 5: numpy view on a stream -> remote pool"
hb = np.zeros(2 * K, np.uint8)
t21.get_on_stream(hb[::2], peer, t21.addr(peer, 0), s5)
s5.synchronize()
assert hb[::2].tobytes() == P(K, me, 11) and not hb[1::2].any(), "case 5: remote pool -> numpy view"
tm.barrier()
# device atomics run by the owner's lander, exact under contention
ad = h1.ad_create(gexmk.DT_U64, gexmk.OP_FADD | gexmk.OP_GET | gexmk.OP_SET)
if me == 0:
    ad.op(0, h1.addr(0, 2 * N - 64), gexmk.OP_SET, 0)
tm.barrier()
for _ in range(300):
    ad.op(0, h1.addr(0, 2 * N - 64), gexmk.OP_FADD, 1)
tm.barrier()
total = ad.op(0, h1.addr(0, 2 * N - 64), gexmk.OP_GET)
assert total == 600, total
tm.barrier()
# put_signal: the data, then the signal (the owner reads both from its device)
if me == 0:
    h1.put_signal(1, h1.addr(1, 4096), P(100000, 0, 5), h1.addr(1, 2 * N - 128), 7)
tm.barrier()
if me == 1:
    assert int(np.frombuffer(dev_read(pool + 2 * N - 128, 8), np.uint64)[0]) == 7
    assert dev_read(pool + 4096, 100000) == P(100000, 0, 5)
tm.barrier()
# stream order: a put after the kernel that produced its data, and a get whose
# result a kernel after it reads, both on a non-blocking stream, no host sync;
# a capture is refused (the host functions belong to one transfer)
s2 = cupy.cuda.Stream(non_blocking=True)
src = cupy.asarray(dseg)[:5 << 20]                    # inside EP 2's device segment
with s2:
    src.fill(40 + me)                                 # the kernel that produces the data
t21.put_on_stream(peer, t21.addr(peer, 64), src, s2)
with s2:
    src.fill(0)                                       # after the put has read it
s2.synchronize()
tm.barrier()
got = np.frombuffer(dev_read(pool + 64, 5 << 20), np.uint8)
assert (got == 40 + peer).all(), "put_on_stream into remote pool memory"
tm.barrier()
dst = cupy.asarray(dseg)[N:N + (5 << 20)]
t21.get_on_stream(dst, peer, t21.addr(peer, 64), s2)
with s2:
    total = int(dst.sum(dtype=cupy.uint64))           # the kernel after it sees the data
assert total == (40 + me) * (5 << 20), total
hostbuf = np.zeros(3 << 20, np.uint8)
t21.get_on_stream(hostbuf, peer, t21.addr(peer, 64), s2)   # host memory: straight to the lander
s2.synchronize()
assert (hostbuf == 40 + me).all(), "get_on_stream into host memory"
# put_signal_on_stream: the data's host functions, then the lander's signal
tm.barrier()
with s2:
    src.fill(60 + me)
t21.put_signal_on_stream(peer, t21.addr(peer, 1 << 20), src[:4096], t21.addr(peer, 2 * N - 192),
                         11, gexmk.SIGNAL_SET, s2)
s2.synchronize()
tm.barrier()
assert int(np.frombuffer(dev_read(pool + 2 * N - 192, 8), np.uint64)[0]) == 11
assert dev_read(pool + (1 << 20), 4096) == bytes([60 + peer]) * 4096, "put_signal_on_stream data"
s2.begin_capture()
try:
    t21.put_on_stream(peer, t21.addr(peer, 0), src, s2)
    raise AssertionError("a captured put to pool memory was accepted")
except E.UnsupportedError as e:
    assert "captured" in str(e), e
finally:
    s2.end_capture()
tm.barrier()
# figures: 8 MiB host -> remote pool put and remote pool -> host get, against a
# pinned host -> device copy of the same size in this process
if me == 0:
    def best(f, k=5):
        ts = []
        for _ in range(k):
            t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
        return min(ts)
    tput = best(lambda: h1.put(1, h1.addr(1, 0), (hseg.address, N)))
    tget = best(lambda: h1.get((hseg.address + N, N), 1, h1.addr(1, 0)))
    tcpy = best(lambda: cu.cuMemcpyHtoD(dseg.address, hseg.address, N))
    print(f"FIGURES 8MiB nbrhd-landed put {N / tput / 1e9:.2f} GB/s get {N / tget / 1e9:.2f} GB/s "
          f"pinned HtoD copy {N / tcpy / 1e9:.2f} GB/s", flush=True)
st = h1.path_stats(peer)
assert "nbrhd-landed" in st, st
tm.barrier()
cu.cuCtxPopCurrent()
print("landed", c.transports["local"].landed, flush=True)
c.finalize()
with cupy.cuda.Device(0):
    cupy.cuda.runtime.freeAsync(pool, s.ptr)
    s.synchronize()
print("OK", me, flush=True)
'''


@gpu
@needs_gpu
def test_pool_memory_reached_on_the_node(tmp_path):
    """testcudauva's four cases at 8 MiB against stream-ordered pool memory
    (cudaMallocAsync, not exportable) of another process on the same GPU:
    its owner's lander copies in and out; device atomics exact; put_signal."""
    pytest.importorskip("cupy")
    env = landed_env(GEXMK_NBRHD_STAGE=None, GEXMK_NBRHD_STAGE_CHUNK=None,
                     GEXMK_NBRHD_STAGE_SLOTS=None)
    r = mp_util.run_job(tmp_path, POOL_WORKER, 2, launcher_timeout=200, env=env)
    print(r.stdout)
    assert r.returncode == 0, r.report()
    assert r.stdout.count("OK") == 2, r.stdout


SWITCH_WORKER = r'''
import numpy as np
import cupy
P = lambda *a: pattern(*a).tobytes()
c = gexmk.init()
tm = c.tm
me, peer = tm.rank, 1 - tm.rank
N = 1 << 20
mk = c.mk_create(gexmk.CUDA_UVA, 0)
c.segment_attach(N)                                   # EP 0: host, the reader's side
ep1 = c.ep_create()
with cupy.cuda.Device(0):
    s = cupy.cuda.Stream(non_blocking=True)
    pool = cupy.cuda.runtime.mallocAsync(2 * N, s.ptr)   # a half for each pool segment
    s.synchronize()
# EP 1's segment changes sort at each publication: the peer must drop what it
# held of the old one (a mapping, an import, a zone) and reach the new one
segs = [("host", "nbrhd", lambda: c.segment_create(N)),
        ("vmm", "nbrhd", lambda: c.segment_create(N, kind=mk)),
        ("pool", "nbrhd-landed", lambda: c.segment_create(buffer=(pool, N), kind=mk)),
        ("host", "nbrhd", lambda: c.segment_create(N)),
        ("pool", "nbrhd-landed", lambda: c.segment_create(buffer=(pool + N, N), kind=mk)),
        ("vmm", "nbrhd", lambda: c.segment_create(N, kind=mk))]
h = c.ep(0).pair(1)
seg = None
for i, (what, path, make) in enumerate(segs):
    if seg is not None:
        seg.destroy()
    seg = make()
    ep1.bind_segment(seg)
    tm.publish_bound_segment([ep1])
    assert h.paths(peer)["rma"] == path, (i, what, h.paths(peer))
    data = P(64 << 10, me, i)
    h.put(peer, h.addr(peer, 4096), data)
    tm.barrier()
    back = np.zeros(64 << 10, np.uint8)
    h.get(back, peer, h.addr(peer, 4096))
    assert back.tobytes() == data, (i, what, "the bytes put to the peer's new segment")
    tm.barrier()
    ep1.unbind_segment()
c.finalize()
with cupy.cuda.Device(0):
    cupy.cuda.runtime.freeAsync(pool, s.ptr)
    s.synchronize()
print("OK", me, flush=True)
'''


@gpu
@needs_gpu
def test_peer_segment_changes_sort_between_publications(tmp_path):
    """Fuzz seed 5019 (gpu-nbrhd): an endpoint whose segment was host memory
    published a device segment; the peer's publish raised TypeError (its
    host mapping taken for a device import).  The endpoint cycles through
    host, VMM device and pool memory; every publication is reached by the
    right path and the bytes arrive."""
    pytest.importorskip("cupy")
    env = landed_env(GEXMK_NBRHD_STAGE=None, GEXMK_NBRHD_STAGE_CHUNK=None,
                     GEXMK_NBRHD_STAGE_SLOTS=None)
    r = mp_util.run_job(tmp_path, SWITCH_WORKER, 2, launcher_timeout=150, env=env)
    assert r.returncode == 0, r.report()
    assert r.stdout.count("OK") == 2, r.stdout
