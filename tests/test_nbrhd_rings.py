"""nbrhd-landed rings per active initiator (issue 23): released once idle,
reclaimed once their initiator is dead.

A landing zone (GEXMK_NBRHD_STAGE=all sends host segments through it here,
so that every step runs without a GPU) is a memfd with a ring per process of
the node.  An initiator whose ring sat unused for GEXMK_RING_IDLE seconds,
with every request answered, posts LZ_RELEASE; the owner's lander punches the
ring's data slots out of the memfd (fallocate PUNCH_HOLE).  A ring whose
initiator the bootstrap reports dead is never read again and punched out
whole.  Pages are checked in the memfd itself (SEEK_DATA / SEEK_HOLE: what the
file holds, whichever process touched it), never by timing.
"""
import pytest

try:
    from . import mp_util
    from .test_nbrhd_landed import landed_env
    from .test_cuda_segments import HAVE_GPU
except ImportError:
    import mp_util
    from test_nbrhd_landed import landed_env
    from test_cuda_segments import HAVE_GPU

PAGES = r'''
def allocated(fd, lo, n):
    """Bytes of [lo, lo+n) the memfd holds pages for (SEEK_DATA / SEEK_HOLE)."""
    pos, end, got = lo, lo + n, 0
    while pos < end:
        try:
            d = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError:                 # ENXIO: no data after pos
            break
        if d >= end:
            break
        h = min(os.lseek(fd, d, os.SEEK_HOLE), end)
        got += h - d
        pos = h
    return got

def ring_pages(zone, r):
    """(head bytes, data bytes) the memfd holds for ring r of a zone."""
    head, size, data = zone["extent"]
    lo = head + r * size
    return allocated(zone["fd"], lo, data), allocated(zone["fd"], lo + data, size - data)

def wait_zone(tr, pred, what, secs=20):
    t0 = time.monotonic()
    while time.monotonic() < t0 + secs:
        z = tr.zone_rings[0]
        if pred(z):
            return z, time.monotonic() - t0
        time.sleep(0.01)
    raise AssertionError(f"{what}: {tr.zone_rings[0]}")
'''

# Rank 1 puts and gets through its ring in rank 0's zone, then sits in a
# barrier while its idle thread releases the ring; rank 0 sees the release
# served and the ring's data pages gone from the memfd (its first page
# stays); then rank 1 uses the zone again, and again every byte arrives.
IDLE_WORKER = PAGES + r'''
with gexmk.init() as c:
    tm = c.tm
    seg = c.segment_attach(1 << 20)
    mem = seg.view(np.uint8)
    tr = c.transports["local"]
    N = 200000
    if tm.rank == 1:
        assert tm.paths(0)["rma"] == "nbrhd-landed", tm.paths(0)
        tm.put(0, tm.addr(0, 0), pattern(N, 1))
        back = np.zeros(N, np.uint8)
        tm.get(back, 0, tm.addr(0, 0))
        assert np.array_equal(back, pattern(N, 1)), "landed get returned other bytes"
        assert tr.ring_stats == {"held": 1, "released": 0}, tr.ring_stats
    tm.barrier()
    if tm.rank == 0:
        z = tr.zone_rings[0]
        head, data = ring_pages(z, 1)
        log("ring 1 before:", z["state"][:2], head, data, "bytes")
        assert data > 0, "the ring's data slots hold no page after a put"
        z, secs = wait_zone(tr, lambda z: z["released"] == 1, "no release came")
        head2, data2 = ring_pages(z, 1)
        log("released after", round(secs, 2), "s; ring 1:", z["state"][1], head2, data2)
        assert z["state"][1] == "idle" and z["backed"] == 0, z
        assert data2 == 0, f"{data2} bytes of the released ring's data slots still held"
        assert head2 > 0, "the ring's first page (its done words) went too"
        assert np.array_equal(mem[:N], pattern(N, 1))
    tm.barrier()
    if tm.rank == 1:
        assert tr.ring_stats == {"held": 0, "released": 1}, tr.ring_stats
        tm.put(0, tm.addr(0, 4096), pattern(N, 2))         # opens the ring again
        back = np.zeros(N, np.uint8)
        tm.get(back, 0, tm.addr(0, 4096))
        assert np.array_equal(back, pattern(N, 2)), "landed get after a release"
        assert tr.ring_stats == {"held": 1, "released": 1}, tr.ring_stats
    tm.barrier()
    if tm.rank == 0:
        assert np.array_equal(mem[4096:4096 + N], pattern(N, 2)), "put after a release lost"
        z = tr.zone_rings[0]
        assert z["state"][1] == "used" and z["released"] == 1, z
        assert ring_pages(z, 1)[1] > 0
    tm.barrier()
print("OK")
'''


@pytest.mark.timeout(120)
def test_idle_ring_released_and_used_again(tmp_path):
    r = mp_util.run_job(tmp_path, IDLE_WORKER, 2, launcher_timeout=100,
                        env=landed_env(GEXMK_RING_IDLE="0.3"))
    assert r.returncode == 0, r.report()
    assert r.stdout.count("OK") == 2, r.report()


# NB and NBI puts, gets and atomics, two initiators at once, with naps longer
# than GEXMK_RING_IDLE between some rounds: the ring is released and opened
# again many times under traffic.  Nothing may be lost: every byte and every
# add is checked at the end, and the releases are counted on both sides.
NB_WORKER = r'''
with gexmk.init() as c:
    tm = c.tm
    seg = c.segment_attach(4 << 20)
    mem = seg.view(np.uint8)
    tr = c.transports["local"]
    ad = tm.ad_create(gexmk.DT_I64, gexmk.OP_FADD | gexmk.OP_GET)
    R, A, B = 16, 70000, 30000
    naps = 0
    tm.barrier()
    if tm.rank > 0:
        evs = []
        base = 8192 + (tm.rank - 1) * R * (A + B)
        for k in range(R):
            off = base + k * (A + B)
            evs.append(tm.put_nb(0, tm.addr(0, off), pattern(A, tm.rank, k, 1)))
            tm.put_nbi(0, tm.addr(0, off + A), pattern(B, tm.rank, k, 2))
            old = ad.op(0, tm.addr(0, 0), gexmk.OP_FADD, tm.rank)
            assert 0 <= old < R * sum(range(1, tm.size)), old
            if k % 3 == 0:
                for e in evs:
                    e.wait()
                evs = []
                gexmk.nbi_wait(gexmk.EC_PUT)
                back = np.zeros(A, np.uint8)
                tm.get_nb(back, 0, tm.addr(0, off)).wait()
                assert np.array_equal(back, pattern(A, tm.rank, k, 1)), ("get", k)
            if k % 2 == 0:
                time.sleep(0.05)                            # idle past GEXMK_RING_IDLE
                naps += 1
        for e in evs:
            e.wait()
        gexmk.nbi_wait(gexmk.EC_PUT)
        st = tr.ring_stats
        log("ring stats", st, "naps", naps)
        assert st["released"] >= 1, st
    tm.barrier()
    if tm.rank == 0:
        for r in range(1, tm.size):
            base = 8192 + (r - 1) * R * (A + B)
            for k in range(R):
                off = base + k * (A + B)
                assert np.array_equal(mem[off:off + A], pattern(A, r, k, 1)), ("lost", r, k, 1)
                assert np.array_equal(mem[off + A:off + A + B], pattern(B, r, k, 2)), \
                    ("lost", r, k, 2)
        assert int(mem[:8].view(np.int64)[0]) == R * sum(range(1, tm.size))
        z = tr.zone_rings[0]
        log("zone", {k: v for k, v in z.items() if k != "fd"})
        assert z["released"] >= tm.size - 1, z
    tm.barrier()
    ad.destroy()
print("OK")
'''


@pytest.mark.timeout(150)
def test_nb_nbi_and_atomics_across_releases(tmp_path):
    r = mp_util.run_job(tmp_path, NB_WORKER, 3, launcher_timeout=130,
                        env=landed_env(GEXMK_RING_IDLE="0.01"))
    assert r.returncode == 0, r.report()
    assert r.stdout.count("OK") == 3, r.report()


def test_never_released_with_idle_zero(tmp_path):
    """GEXMK_RING_IDLE=0: the ring stays as before (no idle thread, no release)."""
    worker = PAGES + r'''
with gexmk.init() as c:
    tm = c.tm
    seg = c.segment_attach(1 << 20)
    tr = c.transports["local"]
    if tm.rank == 1:
        tm.put(0, tm.addr(0, 0), pattern(100000, 3))
    tm.barrier()
    time.sleep(0.5)
    tm.barrier()
    if tm.rank == 0:
        z = tr.zone_rings[0]
        assert z["released"] == 0 and z["state"][1] == "used", z
        assert ring_pages(z, 1)[1] > 0
    else:
        assert tr.ring_stats == {"held": 1, "released": 0}, tr.ring_stats
    tm.barrier()
print("OK")
'''
    r = mp_util.run_job(tmp_path, worker, 2, launcher_timeout=60,
                        env=landed_env(GEXMK_RING_IDLE="0"))
    assert r.returncode == 0, r.report()
    assert r.stdout.count("OK") == 2, r.report()


def test_ring_idle_setting_is_checked(tmp_path):
    """A bad GEXMK_RING_IDLE is an ArgumentError naming it, at init."""
    worker = r'''
try:
    gexmk.init()
except E.ArgumentError as e:
    assert "GEXMK_RING_IDLE" in str(e), e
    print("OK")
'''
    for bad in ("-1", "soon"):
        r = mp_util.run_job(tmp_path, worker, 2, launcher_timeout=60,
                            env=landed_env(GEXMK_RING_IDLE=bad))
        assert r.stdout.count("OK") == 2, r.report()


# Rank 1 puts through its ring in rank 0's zone (never idle long enough to
# release it), then is SIGKILLed.  Rank 0's lander reclaims the ring once the
# bootstrap reports the death: never read again, all its pages punched out.
# Rank 2 goes on putting, getting and adding through its own ring.
DEAD_WORKER = PAGES + r'''
c = gexmk.init()
tm = c.tm
seg = c.segment_attach(2 << 20)
mem = seg.view(np.uint8)
tr = c.transports["local"]
ad = tm.ad_create(gexmk.DT_I64, gexmk.OP_FADD | gexmk.OP_GET)
N = 150000
tm.barrier()
if tm.rank == 1:
    tm.put(0, tm.addr(0, 4096), pattern(N, 1))
    ad.op(0, tm.addr(0, 0), gexmk.OP_FADD, 1)
tm.barrier()
if tm.rank == 0:
    z = tr.zone_rings[0]
    assert z["state"][1] == "used" and ring_pages(z, 1)[1] > 0, z
tm.barrier()
if tm.rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)
if tm.rank == 0:
    z, secs = wait_zone(tr, lambda z: z["reclaimed"] == 1, "the dead ring was not reclaimed")
    head, data = ring_pages(z, 1)
    log("reclaimed after", round(secs, 2), "s; ring 1:", z["state"][1], head, data)
    assert z["state"][1] == "dead" and (head, data) == (0, 0), (z, head, data)
    assert np.array_equal(mem[4096:4096 + N], pattern(N, 1)), "the dead's put before it died"
    t0 = time.monotonic()
    while time.monotonic() < t0 + 20 and int(mem[:8].view(np.int64)[0]) < 1 + 10 * 2:
        time.sleep(0.01)
    assert int(mem[:8].view(np.int64)[0]) == 1 + 10 * 2, mem[:8].view(np.int64)
    for k in range(10):
        off = 300000 + k * N
        assert np.array_equal(mem[off:off + N], pattern(N, 2, k)), ("lost", k)
    z = tr.zone_rings[0]
    assert z["state"][2] == "used" and z["reclaimed"] == 1, z
    print("OK owner", flush=True)
elif tm.rank == 2:
    for k in range(10):
        off = 300000 + k * N
        tm.put(0, tm.addr(0, off), pattern(N, 2, k))
        back = np.zeros(N, np.uint8)
        tm.get(back, 0, tm.addr(0, off))
        assert np.array_equal(back, pattern(N, 2, k)), ("get", k)
        ad.op(0, tm.addr(0, 0), gexmk.OP_FADD, 2)
        time.sleep(0.05)
    print("OK survivor", flush=True)
time.sleep(1)
os._exit(0)
'''


@pytest.mark.timeout(120)
def test_dead_initiators_ring_reclaimed(tmp_path):
    r = mp_util.run_job(tmp_path, DEAD_WORKER, 3, keep_going=True, launcher_timeout=90,
                        env=landed_env(GEXMK_RING_IDLE="0"))
    assert "OK owner" in r.stdout and "OK survivor" in r.stdout, r.report()


# GPU machines: stream-ordered pool memory (not exportable) of rank 0, reached
# through its landing zone by rank 1 from host memory and from its own device
# segment (whose kind pins rank 1's side of the ring).  After an idle spell the
# ring is unpinned on both sides and its data slots punched out; the next put
# pins it again and lands in device memory -- the pin must follow the pages
# (a DMA to a page punched out of the memfd would be lost).
GPU_WORKER = PAGES + r'''
import cupy
from cuda.bindings import driver as cu
c = gexmk.init()
tm = c.tm
me = tm.rank
N = 3 << 20
mk = c.mk_create(gexmk.CUDA_UVA, 0)
c.segment_attach(1 << 20)                             # EP 0: host
with cupy.cuda.Device(0):
    s = cupy.cuda.Stream(non_blocking=True)
    pool = cupy.cuda.runtime.mallocAsync(2 * N, s.ptr)
    s.synchronize()
ep1, ep2 = c.ep_create(), c.ep_create()
pseg = c.segment_create(buffer=(pool, 2 * N), kind=mk)   # EP 1: pool memory (the zone)
dseg = c.segment_create(2 * N, kind=mk)                  # EP 2: a library device segment
ep1.bind_segment(pseg)
ep2.bind_segment(dseg)
tm.publish_bound_segment([ep1, ep2])
h1, t21 = c.ep(0).pair(1), ep2.pair(1)
tr = c.transports["local"]
cu.cuCtxPushCurrent(mk.impl.context)

def dev_read(addr, n):
    out = np.zeros(n, np.uint8)
    cu.cuMemcpyDtoH(out.ctypes.data, addr, n)
    return out

src = pattern(N, 1)
seed2 = pattern(N, 2)          # kept: a temporary's .ctypes.data is freed before the copy reads it
cu.cuMemcpyHtoD(dseg.address, seed2.ctypes.data, N)
tm.barrier()
for turn in (1, 2):
    if me == 1:
        assert h1.paths(0)["rma"] == "nbrhd-landed", h1.paths(0)
        if turn == 1:
            t21.put(0, t21.addr(0, N), (dseg.address, N))
        else:
            # the first operation after the release runs in a host function of
            # the stream: it reopens the ring without pinning (no CUDA call
            # there); the host put after it pins again
            s2 = cupy.cuda.Stream(non_blocking=True)
            t21.put_on_stream(0, t21.addr(0, N), cupy.asarray(dseg)[:N], s2)
            s2.synchronize()
        h1.put(0, h1.addr(0, 0), pattern(N, 1, turn))
        back = np.zeros(N, np.uint8)
        h1.get(back, 0, h1.addr(0, N))
        assert np.array_equal(back, pattern(N, 2)), ("get", turn)
        st = tr.ring_stats
        assert st["held"] == 1 and st["released"] == turn - 1, st
    tm.barrier()
    if me == 0:
        assert np.array_equal(dev_read(pool, N), pattern(N, 1, turn)), ("host put", turn)
        assert np.array_equal(dev_read(pool + N, N), pattern(N, 2)), ("device put", turn)
        z = tr.zone_rings[0]
        assert z["state"][1] == "pinned", z
        if turn == 1:
            z, secs = wait_zone(tr, lambda z: z["released"] == 1, "no release came")
            assert z["state"][1] == "idle" and ring_pages(z, 1)[1] == 0, z
            cu.cuMemsetD8(pool, 0, 2 * N)
    tm.barrier()
cu.cuCtxPopCurrent()
c.finalize()
with cupy.cuda.Device(0):
    cupy.cuda.runtime.freeAsync(pool, s.ptr)
    s.synchronize()
print("OK", me, flush=True)
'''


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_GPU, reason="no NVIDIA driver or device on this machine")
def test_pool_zone_ring_released_and_pinned_again(tmp_path):
    pytest.importorskip("cupy")
    env = landed_env(GEXMK_NBRHD_STAGE=None, GEXMK_NBRHD_STAGE_CHUNK=None,
                     GEXMK_NBRHD_STAGE_SLOTS=None, GEXMK_RING_IDLE="0.3")
    r = mp_util.run_job(tmp_path, GPU_WORKER, 2, launcher_timeout=200, env=env)
    assert r.returncode == 0, r.report()
    assert r.stdout.count("OK") == 2, r.report()
