"""Device segments over the network: the host-staged ofi path (issue 9).

A device-bound endpoint publishes a landing zone of pinned host memory
instead of its segment; the owner's lander thread copies requests in and
out (path ``ofi-staged``, refusable with GEXMK_STAGED=refuse).  On this
CPU-only machine GEXMK_OFI_STAGE=all sends host segments through the same
zones (the lander copies with memcpy and runs atomics on the CPU), so every
step of the protocol runs here: chunked puts and gets across slot reuse, NB
and NBI forms, atomics under contention (exact counts), put_signal +
wait_until, per-path counters, the refusal, a destroyed target.  The GPU
tests (marker ``gpu``) run testcudauva's four cases with device segments
over tcp between two processes on one GPU.
"""
import pytest

from gexmk import config
from gexmk import errors as E

try:
    from . import mp_util
    from .staged_worker import staged_worker
    from .test_ofi import need
    from .test_cuda_segments import HAVE_GPU
except ImportError:
    import mp_util
    from staged_worker import staged_worker
    from test_ofi import need
    from test_cuda_segments import HAVE_GPU

pytest.importorskip("gexmk.transports.ofi", reason="gexmk was built without the ofi transport")

PROVIDER = "tcp;ofi_rxm"
gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not HAVE_GPU, reason="no NVIDIA driver or device on this machine")


def staged_env(**extra):
    env = {"GEXMK_TRANSPORT": "ofi", "GEXMK_OFI_PROVIDER": PROVIDER, "GEXMK_TIMEOUT": 30,
           "GEXMK_PROGRESS_THREAD": None, "FI_PROVIDER": None, "GEXMK_OFI_STAGE": "all",
           "GEXMK_OFI_STAGE_CHUNK": "64K", "GEXMK_OFI_STAGE_SLOTS": "3", "GEXMK_STAGED": None}
    env.update(extra)
    return env


def test_stage_options_parse():
    cfg = config.load({})
    assert (cfg.ofi_stage, cfg.ofi_stage_chunk, cfg.ofi_stage_slots) == ("auto", 1 << 20, 4)
    cfg = config.load({"GEXMK_OFI_STAGE": "all", "GEXMK_OFI_STAGE_CHUNK": "256K",
                       "GEXMK_OFI_STAGE_SLOTS": "8"})
    assert (cfg.ofi_stage, cfg.ofi_stage_chunk, cfg.ofi_stage_slots) == ("all", 256 << 10, 8)
    for bad in ({"GEXMK_OFI_STAGE": "some"}, {"GEXMK_OFI_STAGE_SLOTS": "17"},
                {"GEXMK_OFI_STAGE_CHUNK": "1"}):
        with pytest.raises(E.ArgumentError, match=next(iter(bad))):
            config.load(bad)


WORKER = staged_worker("ofi-staged", "ofi", "GEXMK_OFI_STAGE_CHUNK")


def _run(tmp_path, n, **env):
    need(PROVIDER)
    r = mp_util.run_job(tmp_path, WORKER, n, launcher_timeout=150, env=staged_env(**env))
    assert r.returncode == 0, r.report()
    assert r.stdout.count("OK") == n, r.stdout
    return r


@pytest.mark.parametrize("n", [2, 4])
def test_staged_protocol_over_tcp(tmp_path, n):
    _run(tmp_path, n)


def test_staged_with_different_chunk_sizes(tmp_path):
    """Each zone's geometry is its owner's: an initiator with larger or smaller
    bounce slots than the target's landing slots cuts chunks to fit both."""
    _run(tmp_path, 2, GX_MIXED_CHUNKS="1")


def test_staged_refused(tmp_path):
    _run(tmp_path, 2, GEXMK_STAGED="refuse")


GPU_WORKER = r'''
import numpy as np
P = lambda *a: pattern(*a).tobytes()
if os.environ.get("GX_MIXED_CHUNKS"):       # ranks with different landing chunk sizes
    os.environ["GEXMK_OFI_STAGE_CHUNK"] = ("64K", "96K")[int(os.environ["GEXMK_RANK"]) % 2]
from cuda.bindings import driver as cu
c = gexmk.init()
tm = c.tm
me, peer = tm.rank, 1 - tm.rank
N = 8 << 20
mk = c.mk_create(gexmk.CUDA_UVA, 0)
hseg = c.segment_attach(2 * N)                        # EP 0: host
ep1, ep2 = c.ep_create(), c.ep_create()
d1 = c.segment_create(2 * N, kind=mk)
d2 = c.segment_create(2 * N, kind=mk)
ep1.bind_segment(d1)
ep2.bind_segment(d2)
tm.publish_bound_segment([ep1, ep2])
h1, h2 = c.ep(0).pair(1), c.ep(0).pair(2)             # host EP 0 -> peers' EP 1 / EP 2
t12 = ep1.pair(2)                                     # device EP 1 -> peers' device EP 2
assert h1.paths(peer)["rma"] == "ofi-staged", h1.paths(peer)
assert t12.paths(peer) == {"rma": "ofi-staged", "atomic": "ofi-staged"}, t12.paths(peer)

def dev_fill(seg, off, data):
    cu.cuMemcpyHtoD(seg.address + off, data, len(data))

def dev_read(seg, off, n):
    out = np.zeros(n, np.uint8)
    cu.cuMemcpyDtoH(out.ctypes.data, seg.address + off, n)
    return out.tobytes()

cu.cuCtxPushCurrent(mk.impl.context)
src = P(N, me, 7)
hmem = np.asarray(hseg)
hmem[:N] = np.frombuffer(src, np.uint8)
dev_fill(d1, 0, src)
dev_fill(d2, N, P(N, me, 8))
tm.barrier()
# 1. host -> remote GPU (NBI, DEFER)
h1.put_nbi(peer, h1.addr(peer, N), (hseg.address, N))
gexmk.nbi_wait(gexmk.EC_PUT)
tm.barrier()
assert dev_read(d1, N, N) == P(N, peer, 7), "case 1: host -> remote GPU"
# 2. remote GPU -> host (NB, wait_all)
hmem[N:] = 0
ev = h2.get_nb((hseg.address + N, N), peer, h2.addr(peer, N))
gexmk.wait_all([ev])
assert hmem[N:].tobytes() == P(N, peer, 8), "case 2: remote GPU -> host"
tm.barrier()
# 3. GPU -> remote GPU crossed between two device endpoints (blocking)
t12.put(peer, t12.addr(peer, 0), (d1.address, N))
tm.barrier()
assert dev_read(d2, 0, N) == P(N, peer, 7), "case 3: GPU -> remote GPU"
# 4. remote GPU -> local GPU (blocking)
t12.get((d1.address + N, N), peer, t12.addr(peer, N))
assert dev_read(d1, N, N) == P(N, peer, 8), "case 4: remote GPU -> local GPU"
tm.barrier()
# device atomics run by the owner, exact under contention
ad = t12.ad_create(gexmk.DT_U64, gexmk.OP_FADD | gexmk.OP_GET | gexmk.OP_SET)
if me == 0:                                           # device memory starts undefined
    ad.op(0, t12.addr(0, 2 * N - 64), gexmk.OP_SET, 0)
tm.barrier()
for _ in range(300):
    ad.op(0, t12.addr(0, 2 * N - 64), gexmk.OP_FADD, 1)
tm.barrier()
total = ad.op(0, t12.addr(0, 2 * N - 64), gexmk.OP_GET)
assert total == 600, total
tm.barrier()
st = t12.path_stats(peer)
assert "ofi-staged" in st, st
cu.cuCtxPopCurrent()
print("landed", c.transports["ofi"].landed, st, flush=True)
tm.barrier()
c.finalize()
print("OK", me, flush=True)
'''


@gpu
@needs_gpu
def test_testcudauva_cases_over_tcp_staged(tmp_path):
    """testcudauva's four cases at 8 MiB, device segments over tcp (staged),
    2 ranks on one GPU; device atomics; the path named."""
    need(PROVIDER)
    env = staged_env(GEXMK_OFI_STAGE=None, GEXMK_OFI_STAGE_CHUNK=None, GEXMK_OFI_STAGE_SLOTS=None)
    r = mp_util.run_job(tmp_path, GPU_WORKER, 2, launcher_timeout=200, env=env)
    assert r.returncode == 0, r.report()
    assert r.stdout.count("OK") == 2, r.stdout


POOL_WORKER = r'''
import numpy as np
import cupy
P = lambda *a: pattern(*a).tobytes()
c = gexmk.init()
tm = c.tm
me, peer = tm.rank, 1 - tm.rank
N = 3 * (1 << 20) + 777
mk = c.mk_create(gexmk.CUDA_UVA, 0)
hseg = c.segment_attach(1 << 20)
with cupy.cuda.Device(0):
    s = cupy.cuda.Stream(non_blocking=True)
    ptr = cupy.cuda.runtime.mallocAsync(N, s.ptr)     # stream-ordered pool memory
    s.synchronize()
ep1 = c.ep_create()
seg = c.segment_create(buffer=(ptr, N), kind=mk)
ep1.bind_segment(seg)
tm.publish_bound_segment([ep1])
h = c.ep(0).pair(1)
assert h.paths(peer)["rma"] == "ofi-staged", h.paths(peer)
h.put(peer, h.addr(peer, 0), P(N, me, 3))
tm.barrier()
got = np.zeros(N, np.uint8)
with cupy.cuda.Device(0):
    cupy.cuda.runtime.memcpy(got.ctypes.data, ptr, N, cupy.cuda.runtime.memcpyDeviceToHost)
assert got.tobytes() == P(N, peer, 3), "pool memory written by the peer"
back = np.zeros(N, np.uint8)
h.get(back, peer, h.addr(peer, 0))
assert back.tobytes() == P(N, me, 3), "read back from the peer's pool memory"
tm.barrier()
c.finalize()
with cupy.cuda.Device(0):
    cupy.cuda.runtime.freeAsync(ptr, s.ptr)
    s.synchronize()
print("OK", me, flush=True)
'''


@gpu
@needs_gpu
def test_pool_memory_reached_over_ofi_staged(tmp_path):
    """Stream-ordered pool memory (cudaMallocAsync) cannot be exported to a
    peer; over ofi its owner's lander copies in and out of it."""
    pytest.importorskip("cupy")
    need(PROVIDER)
    env = staged_env(GEXMK_OFI_STAGE=None, GEXMK_OFI_STAGE_CHUNK=None, GEXMK_OFI_STAGE_SLOTS=None)
    r = mp_util.run_job(tmp_path, POOL_WORKER, 2, launcher_timeout=120, env=env)
    assert r.returncode == 0, r.report()
    assert r.stdout.count("OK") == 2, r.stdout


ZONE_WORKER = r'''
# issue 23: a landing zone costs memory per initiator that used it, not per
# job rank: every rank stages puts and gets to its right neighbour only, and
# its own zone holds resident pages of (at most) one ring and the bounce area
def resident(lo, size):
    """Bytes of [lo, lo + size) resident, from /proc/self/smaps."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                a, b = (int(x, 16) for x in head.split("-"))
                inside = a < lo + size and b > lo
            elif inside and head == "Rss:":
                total += int(line.split()[1]) * 1024
    return total

with gexmk.init() as c:
    tm = c.tm
    seg = c.segment_attach(1 << 20)
    right, left = (tm.rank + 1) % tm.size, (tm.rank - 1) % tm.size
    assert tm.paths(right)["rma"] == "ofi-staged", tm.paths(right)
    src = np.arange(200000, dtype=np.uint8) + tm.rank
    tm.put(right, tm.addr(right, 0), src)           # several chunks through one ring
    back = np.zeros_like(src)
    tm.barrier()
    tm.get(back, right, tm.addr(right, 0))
    assert np.array_equal(back, src), "staged get returned other bytes"
    tm.barrier()
    mine = seg.view(np.uint8)[:src.size]
    assert np.array_equal(mine, np.arange(200000, dtype=np.uint8) + left), "lost put"
    lo, size, ring = c.ep(0).contexts["ofi"].zone_extent
    rings = tm.size                                  # one per job rank
    bounce = size - rings * ring
    rss = resident(lo, size)
    log("zone", size, "ring", ring, "resident", rss)
    assert rss <= ring + bounce + 8192, (rss, ring, bounce, size)
    tm.barrier()
'''


@pytest.mark.timeout(180)
def test_zone_is_resident_per_active_initiator(tmp_path):
    need(PROVIDER)
    r = mp_util.run_job(tmp_path, ZONE_WORKER, 6, launcher_timeout=150, env=staged_env())
    r.check()


# issue 23: the lander's pass reads the rings backed so far and those whose
# initiator rang their doorbell, never every job rank's ring: the first page of
# a ring nobody used is never touched (not even mapped as the zero page, which
# /proc/self/pagemap reports present once read).  Each rank stages to its right
# neighbour only, so rank r's zone serves one ring (its left neighbour's).
LANDER_WORKER = r'''
import struct

def present(addr):
    """Whether the page at addr is mapped (read or written) in this process."""
    page = os.sysconf("SC_PAGE_SIZE")
    with open("/proc/self/pagemap", "rb") as f:
        f.seek((addr // page) * 8)
        return bool(struct.unpack("<Q", f.read(8))[0] >> 63)

with gexmk.init() as c:
    tm = c.tm
    seg = c.segment_attach(1 << 20)
    right, left = (tm.rank + 1) % tm.size, (tm.rank - 1) % tm.size
    assert tm.paths(right)["rma"] == "ofi-staged", tm.paths(right)
    src = np.arange(100000, dtype=np.uint8) + tm.rank
    tm.put(right, tm.addr(right, 0), src)
    tm.barrier()
    time.sleep(0.3)                                  # the lander keeps passing meanwhile
    tm.barrier()
    assert np.array_equal(seg.view(np.uint8)[:src.size], np.arange(100000, dtype=np.uint8) + left)
    ctx = c.ep(0).contexts["ofi"]
    lo, size, ring = ctx.zone_extent
    assert ctx.zone_rings["zone"]["backed"] == 1, ctx.zone_rings
    assert present(lo + left * ring), "the used ring was never read"
    untouched = [r for r in range(tm.size) if r != left and not present(lo + r * ring)]
    assert untouched == [r for r in range(tm.size) if r != left], \
        f"rank {tm.rank}: the lander read rings nobody used: only {untouched} untouched"
    passes, read = ctx.lander_work["zone"]
    log("lander passes", passes, "rings read", read, "rings backed", ctx.zone_rings["zone"])
    assert passes > 0 and read <= passes + 64, (passes, read)
    tm.barrier()
'''


@pytest.mark.timeout(180)
def test_lander_reads_only_rings_in_use(tmp_path):
    need(PROVIDER)
    # lazy connections: the eager set-up's 1-byte reads land at the zone's first byte (ring 0);
    # no idle release: on a loaded machine the put's ring could sit idle past the default
    # 3 s before the checks, be released and its pages given back (backed 0, not present)
    r = mp_util.run_job(tmp_path, LANDER_WORKER, 6, launcher_timeout=150,
                        env=staged_env(GEXMK_OFI_CONNECT="lazy", GEXMK_OFI_RING_IDLE="0"))
    r.check()


# issue 23: a retired zone (its segment unbound, its key kept for peers that
# hold it) marks "closed" only the rings in use -- a page each, not one per job
# rank -- and a word every initiator waiting for its first answer reads: a
# peer that never used its ring learns of the unbinding from its first request
# (SegmentError, again on the next), as one that used it does.
RETIRED_WORKER = r'''
with gexmk.init() as c:
    tm = c.tm
    seg = c.segment_attach(1 << 20)
    old = tm.addr(0, 0)
    if tm.rank == 2:
        tm.put(0, old, np.arange(1000, dtype=np.uint8))     # rank 2's ring is in use
    tm.barrier()
    if tm.rank == 0:
        c.ep(0).unbind_segment()
        assert c.ep(0).contexts["ofi"].retired >= 1
    tm.barrier()
    if tm.rank in (1, 2):
        assert tm.paths(0)["rma"] == "ofi-staged", tm.paths(0)
        for _ in range(2):
            e = expect_raises(E.SegmentError, tm.put, 0, old + 64, np.ones(100, np.uint8))
            assert "unbound or destroyed" in str(e), e
    tm.barrier()
    if tm.rank == 0:
        assert not seg.view(np.uint8)[1000:].any(), "a stale put reached the unbound segment"
    tm.barrier()
'''


@pytest.mark.timeout(180)
def test_retired_zone_closes_unused_rings_too(tmp_path):
    need(PROVIDER)
    r = mp_util.run_job(tmp_path, RETIRED_WORKER, 3, launcher_timeout=150, env=staged_env())
    r.check()


RUNS_WORKER = r'''
with gexmk.init() as c:
    tm = c.tm
    seg = c.segment_attach(1 << 20)
    peer = 1 - tm.rank
    assert tm.paths(peer)["rma"] == "ofi-staged", tm.paths(peer)
    K = 200000
    wide = np.zeros(2 * K, np.uint8)
    wide[::2] = np.arange(K, dtype=np.uint8) * 7 + tm.rank
    view = wide[::2]                              # K one-byte blocks, contiguous at the target
    d = c.transports["ofi"].domain
    tm.barrier()
    before = d.landed
    tm.barrier()
    if tm.rank == 0:
        tm.put(peer, tm.addr(peer, 0), view)
    tm.barrier()
    put_served = d.landed - before
    if tm.rank == 1:
        assert np.array_equal(seg.view(np.uint8)[:K], np.arange(K, dtype=np.uint8) * 7), "put"
        seg.view(np.uint8)[:K] = np.arange(K, dtype=np.uint8) * 3
    tm.barrier()
    before = d.landed
    tm.barrier()
    if tm.rank == 0:
        wide[:] = 0
        tm.get(view, peer, tm.addr(peer, 0))
        assert np.array_equal(view, np.arange(K, dtype=np.uint8) * 3), "get"
        assert not wide[1::2].any(), "the get wrote between the view's bytes"
    tm.barrier()
    get_served = d.landed - before
    if tm.rank == 1:
        # the core hands the transport 4,096 blocks a call (GX_VIS_CHUNK): one
        # request each once their list entries merge into one run; with a 16-byte
        # entry per byte a call's 4,096 x 17 bytes overflow a 64 KiB slot, two each
        calls = -(-K // 4096)
        log("requests served: put", put_served, "get", get_served, "calls", calls)
        assert 0 < put_served <= calls + 3 and 0 < get_served <= calls + 3, \
            (put_served, get_served, calls)
    tm.barrier()
'''


@pytest.mark.timeout(120)
def test_packed_blocks_contiguous_at_the_target_share_a_list_entry(tmp_path):
    need(PROVIDER)
    r = mp_util.run_job(tmp_path, RUNS_WORKER, 2, launcher_timeout=100, env=staged_env())
    r.check()
