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
    from .test_ofi import need
    from .test_cuda_segments import HAVE_GPU
except ImportError:
    import mp_util
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


WORKER = r'''
import numpy as np
P = lambda *a: pattern(*a).tobytes()
if os.environ.get("GX_MIXED_CHUNKS"):       # ranks with different landing chunk sizes
    os.environ["GEXMK_OFI_STAGE_CHUNK"] = ("64K", "96K")[int(os.environ["GEXMK_RANK"]) % 2]
c = gexmk.init()
tm = c.tm
me, n = tm.rank, tm.size
right, left = (me + 1) % n, (me - 1) % n
S = 4 << 20
seg = c.segment_attach(S)
mem = np.asarray(seg)
ofi = c.transports["ofi"]
refuse = os.environ.get("GEXMK_STAGED") == "refuse"
if refuse:
    assert tm.paths(right)["rma"] == "refused:ofi-staged", tm.paths(right)
    e = expect_raises(E.UnsupportedError, tm.put, right, tm.addr(right, 0), b"x")
    assert "ofi-staged" in str(e), e
    tm.barrier()
    c.finalize()
    print("OK", me, flush=True)
    raise SystemExit(0)
assert tm.paths(right) == {"rma": "ofi-staged", "atomic": "ofi-staged"}, tm.paths(right)
# sizes across the 64 KiB chunks and 3 slots: one byte, part of a chunk, whole
# chunks, slot reuse, an odd tail
sizes = [1, 8, 4095, 65536, 3 * 65536 + 17, (1 << 20) + 12345]
offs = []
o = 0
for sz in sizes:
    offs.append(o)
    o += (sz + 4096) & ~4095
mem[:] = 0
mem[2 << 20:] = np.frombuffer(P(S - (2 << 20), me, 99), np.uint8)   # what peers get
tm.barrier()
for sz, off in zip(sizes, offs):
    tm.put(right, tm.addr(right, off), P(sz, me, sz))
tm.barrier()
for sz, off in zip(sizes, offs):
    assert bytes(mem[off:off + sz]) == P(sz, left, sz), (sz, off)
tm.barrier()                      # before the left neighbour's next puts overlap these
want = P(S - (2 << 20), right, 99)
for sz, off in zip(sizes, offs):
    got = np.zeros(sz, np.uint8)
    tm.get(got, right, tm.addr(right, (2 << 20) + off))
    assert bytes(got) == want[off:off + sz], ("get", sz, off)
# NB and NBI forms (complete at issue on this path; their events and syncs still work)
ev = tm.put_nb(right, tm.addr(right, 1 << 20), P(200000, me, 1))
ev.wait()
tm.put_nbi(right, tm.addr(right, 1600000), P(70000, me, 2))
gexmk.nbi_wait(gexmk.EC_PUT)
got = np.zeros(100000, np.uint8)
tm.get_nb(got, right, tm.addr(right, (2 << 20) + 5)).wait()
assert bytes(got) == want[5:100005]
tm.barrier()
assert bytes(mem[1 << 20:(1 << 20) + 200000]) == P(200000, left, 1)
assert bytes(mem[1600000:1670000]) == P(70000, left, 2)
# local buffers inside my own segment go through the endpoint's bounce slots
tm.barrier()
tm.put(right, tm.addr(right, 1700000), (seg.address + (2 << 20), 300000))
tm.barrier()
assert bytes(mem[1700000:2000000]) == P(S - (2 << 20), left, 99)[:300000], "put from the segment"
tm.barrier()
tm.get((seg.address + 1700000, 250000), right, tm.addr(right, (2 << 20) + 1000))
assert bytes(mem[1700000:1950000]) == want[1000:251000], "get into the segment"
# atomics run by the owner's lander: exact under contention from every rank
ad = tm.ad_create(gexmk.DT_I64, gexmk.OP_FADD | gexmk.OP_GET | gexmk.OP_FCAS)
tm.barrier()
for _ in range(200):
    ad.op(0, tm.addr(0, 8), gexmk.OP_FADD, me + 1)
tm.barrier()
total = ad.op(0, tm.addr(0, 8), gexmk.OP_GET)
assert total == 200 * n * (n + 1) // 2, total
tm.barrier()
if me == 0:
    assert ad.op(right, tm.addr(right, 16), gexmk.OP_FCAS, 0, 42) == 0
    assert ad.op(right, tm.addr(right, 16), gexmk.OP_FCAS, 0, 43) == 42
ad.destroy()
# put_signal: the data lands before the signal, through the same ring
sig = tm.addr(me, 64)
for k in range(1, 4):
    tm.put_signal(right, tm.addr(right, 4096 * 8), P(150000, me, k), tm.addr(right, 64), k)
    tm.wait_until(sig, gexmk.CMP_EQ, k, timeout=20)
    assert bytes(mem[4096 * 8:4096 * 8 + 150000]) == P(150000, left, k), k
    tm.barrier()                  # before the left neighbour's next round overwrites it
# out of the segment: refused before anything is sent
expect_raises(E.BoundsError, tm.put, right, tm.addr(right, S - 4), b"12345678")
st = tm.path_stats(right)
assert set(st) == {"ofi-staged"}, st
assert st["ofi-staged"]["put"]["ops"] >= len(sizes) + 2 and st["ofi-staged"]["get"]["ops"] >= len(sizes) + 1, st
assert ofi.landed > 0
tm.barrier()
c.finalize()
print("OK", me, ofi.landed, flush=True)
'''


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
