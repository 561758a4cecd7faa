"""Landing-zone rings per active peer, with a cap and reuse (issue 23).

A landing zone (ofi-staged device segments; here host segments with
GEXMK_OFI_STAGE=all, and host segments' VIS zones) reserves a ring per job
rank and backs one when its initiator first asks (STG_OPEN).  An initiator
releases its ring once it sat unused for GEXMK_OFI_RING_IDLE seconds
(STG_RELEASE, sent only when every request before it was answered); the
lander then gives the ring's data pages back to the OS.  At most
GEXMK_OFI_ZONE_RINGS rings are backed at once: a staged operation past the
cap waits for a release (or times out naming the cap: test_vis_ofi.py::
test_zone_ring_cap), and the zone asks its holders to release once done.
"""
import pytest

try:
    from . import mp_util
    from .test_ofi import need, ofi_env
    from .test_cuda_segments import HAVE_GPU
except ImportError:
    import mp_util
    from test_ofi import need, ofi_env
    from test_cuda_segments import HAVE_GPU

pytest.importorskip("gexmk.transports.ofi", reason="gexmk was built without the ofi transport")

PROVIDER = "tcp;ofi_rxm"


def rings_env(**extra):
    env = ofi_env(PROVIDER)
    env.update(GEXMK_OFI_STAGE="all", GEXMK_OFI_STAGE_CHUNK="64K", GEXMK_OFI_STAGE_SLOTS="3",
               GEXMK_STAGED=None, GEXMK_OFI_ZONE_RINGS=None, GEXMK_OFI_RING_IDLE=None)
    env.update(extra)
    return env


PAGES = r'''
import struct
PAGE = os.sysconf("SC_PAGE_SIZE")

def present(lo, n):
    """How many pages of [lo, lo+n) are mapped in this process (/proc/self/pagemap)."""
    first, last = lo // PAGE, (lo + n - 1) // PAGE
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first * 8)
        raw = f.read((last - first + 1) * 8)
    return sum(1 for (e,) in struct.iter_unpack("<Q", raw) if e >> 63)
'''

# Rank 1 stages a put and a get through its ring in rank 0's zone, then sits
# in a barrier (whose waits look for idle rings) until rank 0 has seen the
# ring released and its data pages unmapped; then it uses the zone again.
IDLE_WORKER = PAGES + r'''
with gexmk.init() as c:
    tm = c.tm
    seg = c.segment_attach(1 << 20)
    mem = seg.view(np.uint8)
    ctx = c.ep(0).contexts["ofi"]
    dom = c.transports["ofi"].domain
    N = 200000
    if tm.rank == 1:
        assert tm.paths(0)["rma"] == "ofi-staged", tm.paths(0)
        tm.put(0, tm.addr(0, 0), pattern(N, 1))
        back = np.zeros(N, np.uint8)
        tm.get(back, 0, tm.addr(0, 0))
        assert np.array_equal(back, pattern(N, 1)), "staged get returned other bytes"
        assert dom.ring_stats["held"] == 1, dom.ring_stats
    tm.barrier()
    if tm.rank == 0:
        lo, size, ring = ctx.zone_extent
        r1 = lo + ring                                 # rank 1's ring
        z = ctx.zone_rings["zone"]
        assert (z["backed"], z["backs"], z["released"]) == (1, 1, 0), z
        before = present(r1 + PAGE, ring - PAGE)
        assert before > 0, "the ring's data pages were never written"
        t0 = time.monotonic()
        while ctx.zone_rings["zone"]["released"] == 0 and time.monotonic() < t0 + 20:
            ctx.progress()                             # take the release in
            time.sleep(0.01)
        z = ctx.zone_rings["zone"]
        assert (z["backed"], z["backs"], z["released"]) == (0, 1, 1), z
        after = present(r1 + PAGE, ring - PAGE)
        log("ring data pages mapped", before, "->", after, "released after",
            round(time.monotonic() - t0, 2), "s")
        assert after == 0, f"{after} of the released ring's data pages are still mapped"
        assert present(r1, PAGE) == 1, "the ring's first page (its done words) went too"
        assert np.array_equal(mem[:N], pattern(N, 1))
    tm.barrier()
    if tm.rank == 1:
        st = dom.ring_stats
        assert (st["opened"], st["released"], st["held"]) == (1, 1, 0), st
        tm.put(0, tm.addr(0, 4096), pattern(N, 2))     # asks for the ring again
        back = np.zeros(N, np.uint8)
        tm.get(back, 0, tm.addr(0, 4096))
        assert np.array_equal(back, pattern(N, 2)), "staged get after a release"
        st = dom.ring_stats
        assert (st["opened"], st["released"], st["held"]) == (2, 1, 1), st
    tm.barrier()
    if tm.rank == 0:
        assert np.array_equal(mem[4096:4096 + N], pattern(N, 2)), "put after a release lost"
        z = ctx.zone_rings["zone"]
        assert (z["backed"], z["backs"]) == (1, 2), z
    tm.barrier()
print("OK")
'''


@pytest.mark.timeout(120)
def test_idle_ring_released_and_used_again(tmp_path):
    need(PROVIDER)
    r = mp_util.run_job(tmp_path, IDLE_WORKER, 2, launcher_timeout=100,
                        env=rings_env(GEXMK_OFI_RING_IDLE="0.3"))
    assert r.returncode == 0, r.report()
    assert r.stdout.count("OK") == 2, r.report()


# GEXMK_OFI_ZONE_RINGS=1, three initiators at once: each round every
# initiator puts a round-specific pattern into its own part of rank 0's
# segment, reads it back, fetch-adds a shared counter, and sometimes naps.
# Only one ring is backed at a time: the others wait, the holder releases
# after its operation (asked by the zone) or once idle.
CAP_WORKER = r'''
with gexmk.init() as c:
    tm = c.tm
    seg = c.segment_attach(1 << 20)
    mem = seg.view(np.uint8)
    ctx = c.ep(0).contexts["ofi"]
    dom = c.transports["ofi"].domain
    ad = tm.ad_create(gexmk.DT_I64, gexmk.OP_FADD | gexmk.OP_GET)
    N, R = 70000, 12
    rng = np.random.default_rng(tm.rank)
    tm.barrier()
    if tm.rank > 0:
        base = tm.addr(0, 8192 + tm.rank * 100000)
        for k in range(R):
            tm.put(0, base, pattern(N, tm.rank, k))
            back = np.zeros(N, np.uint8)
            tm.get(back, 0, base)
            assert np.array_equal(back, pattern(N, tm.rank, k)), ("round", k)
            ad.op(0, tm.addr(0, 0), gexmk.OP_FADD, tm.rank)
            if rng.random() < 0.3:
                time.sleep(rng.random() * 0.1)
        log("ring stats", dom.ring_stats)
    tm.barrier()
    if tm.rank == 0:
        for r in range(1, tm.size):
            off = 8192 + r * 100000
            assert np.array_equal(mem[off:off + N], pattern(N, r, R - 1)), ("lost", r)
        assert int(mem[:8].view(np.int64)[0]) == R * sum(range(1, tm.size))
        z = ctx.zone_rings["zone"]
        log("zone", z)
        assert z["cap"] == 1 and z["backed"] <= 1, z
        assert z["backs"] >= tm.size - 1, z           # every initiator had the ring in turn
        assert z["backs"] - z["released"] == z["backed"], z
    tm.barrier()
    ad.destroy()
print("OK")
'''


@pytest.mark.timeout(180)
def test_cap_of_one_ring_three_initiators(tmp_path):
    need(PROVIDER)
    r = mp_util.run_job(tmp_path, CAP_WORKER, 4, launcher_timeout=160,
                        env=rings_env(GEXMK_OFI_ZONE_RINGS="1", GEXMK_OFI_RING_IDLE="0.05"))
    assert r.returncode == 0, r.report()
    assert r.stdout.count("OK") == 4, r.report()


# NB and NBI puts (and VIS, atomics) issued back to back, with naps longer
# than GEXMK_OFI_RING_IDLE between some of them: the next operation's idle
# look releases the ring right before it asks for it again.  Nothing may be
# lost: every byte and every add is checked at the end.
NB_WORKER = r'''
with gexmk.init() as c:
    tm = c.tm
    seg = c.segment_attach(4 << 20)
    mem = seg.view(np.uint8)
    dom = c.transports["ofi"].domain
    ad = tm.ad_create(gexmk.DT_I64, gexmk.OP_FADD | gexmk.OP_GET)
    rng = np.random.default_rng(7)
    naps, R, BLK = 0, 24, 1024
    expect = np.zeros(4 << 20, np.uint8)       # what rank 1 writes into rank 0's segment
    for k in range(R):
        off = 8192 + k * 150000
        expect[off:off + 90000] = pattern(90000, k, 1)
        expect[off + 90000:off + 140000] = pattern(50000, k, 2)
        v = pattern(8 * BLK, k, 3)
        for i in range(8):
            expect[off + 140000 + BLK * i:off + 140000 + BLK * i + BLK // 2] = \
                v[BLK * i:BLK * i + BLK // 2]
    tm.barrier()
    if tm.rank == 1:
        evs = []
        for k in range(R):
            off = 8192 + k * 150000
            a, b = pattern(90000, k, 1), pattern(50000, k, 2)
            evs.append(tm.put_nb(0, tm.addr(0, off), a))
            tm.put_nbi(0, tm.addr(0, off + 90000), b)
            # a scattered put_vector of small blocks (packed through the ring)
            v = pattern(8 * BLK, k, 3)
            dst = [(tm.addr(0, off + 140000 + BLK * i), BLK // 2) for i in range(8)]
            srcs = [(v.ctypes.data + BLK * i, BLK // 2) for i in range(8)]
            tm.put_vector(0, dst, srcs)
            ad.op(0, tm.addr(0, 0), gexmk.OP_FADD, 1)
            if k % 3 == 0:
                for e in evs:
                    e.wait()
                evs = []
            if k % 2 == 0:
                time.sleep(0.05)       # idle past GEXMK_OFI_RING_IDLE
                naps += 1
        for e in evs:
            e.wait()
        gexmk.nbi_wait(gexmk.EC_PUT)
        st = dom.ring_stats
        log("ring stats", st, "naps", naps)
        assert st["released"] >= naps and st["opened"] == st["released"] + st["held"], st
    tm.barrier()
    if tm.rank == 0:
        end = 8192 + R * 150000
        bad = np.flatnonzero(mem[8192:end] != expect[8192:end])
        assert bad.size == 0, f"{bad.size} bytes lost or wrong, first at {8192 + bad[0]}"
        assert int(mem[:8].view(np.int64)[0]) == R
        z = c.ep(0).contexts["ofi"].zone_rings["zone"]
        log("zone", z)
        assert z["released"] >= R // 2 and z["backs"] == z["released"] + z["backed"], z
    tm.barrier()
    ad.destroy()
print("OK")
'''


@pytest.mark.timeout(150)
def test_nb_puts_right_before_an_idle_release(tmp_path):
    need(PROVIDER)
    r = mp_util.run_job(tmp_path, NB_WORKER, 2, launcher_timeout=130,
                        env=rings_env(GEXMK_OFI_RING_IDLE="0.01"))
    assert r.returncode == 0, r.report()
    assert r.stdout.count("OK") == 2, r.report()


# A host segment's VIS zone (no staging): packed VIS through the ring, an idle
# release, packed VIS again -- the same bytes land.
VIS_WORKER = PAGES + r'''
with gexmk.init() as c:
    tm = c.tm
    seg = c.segment_attach(1 << 20)
    mem = seg.view(np.uint8)
    ctx = c.ep(0).contexts["ofi"]
    dom = c.transports["ofi"].domain
    blk, n = 512, 400
    for turn in (1, 2):
        if tm.rank == 1:
            src = pattern(n * blk, turn)
            dst = [(tm.addr(0, blk * int(i)), blk) for i in np.random.default_rng(turn).permutation(n)]
            tm.put_vector(0, dst, [(src.ctypes.data + blk * k, blk) for k in range(n)])
            back = np.zeros(n * blk, np.uint8)
            tm.get_vector([(back.ctypes.data + blk * k, blk) for k in range(n)], 0, dst)
            assert np.array_equal(back, src), ("turn", turn)
            assert dom.vis_paths["ofi-landed"] > 0, dom.vis_paths
        tm.barrier()
        if tm.rank == 0 and turn == 1:
            t0 = time.monotonic()
            while ctx.zone_rings["vis"]["released"] == 0 and time.monotonic() < t0 + 20:
                ctx.progress()
                time.sleep(0.01)
            z = ctx.zone_rings["vis"]
            assert (z["backed"], z["backs"], z["released"]) == (0, 1, 1), z
        tm.barrier()
    if tm.rank == 0:
        z = ctx.zone_rings["vis"]
        assert (z["backs"], z["released"]) == (2, 1), z
    tm.barrier()
print("OK")
'''


@pytest.mark.timeout(120)
def test_vis_zone_ring_released_and_used_again(tmp_path):
    need(PROVIDER)
    env = ofi_env(PROVIDER)
    env.update(GEXMK_OFI_RING_IDLE="0.2", GEXMK_OFI_ZONE_RINGS=None)
    r = mp_util.run_job(tmp_path, VIS_WORKER, 2, launcher_timeout=100, env=env)
    assert r.returncode == 0, r.report()
    assert r.stdout.count("OK") == 2, r.report()


def test_ring_settings_are_checked(tmp_path):
    """A bad GEXMK_OFI_RING_IDLE is an ArgumentError naming it, at init."""
    need(PROVIDER)
    worker = r'''
try:
    gexmk.init()
except E.ArgumentError as e:
    assert "GEXMK_OFI_RING_IDLE" in str(e), e
    print("OK")
'''
    for bad in ("-1", "soon", "nan"):
        r = mp_util.run_job(tmp_path, worker, 2, launcher_timeout=60,
                            env=rings_env(GEXMK_OFI_RING_IDLE=bad))
        assert r.stdout.count("OK") == 2, r.report()


# A holder that never calls into gexmk while another initiator waits (it
# computes, or sits in a bootstrap collective): its lander thread releases
# the idle ring.  Rank 1 takes the only ring (GEXMK_OFI_ZONE_RINGS=1), then
# waits outside gexmk for a file that rank 2 writes once its own get through
# rank 0's zone has completed -- which it can only after rank 1 released.
AWAY_WORKER = r'''
flag = os.path.join(os.environ["RINGS_TMP"], "rank2-done")
with gexmk.init() as c:
    tm = c.tm
    seg = c.segment_attach(1 << 20)
    dom = c.transports["ofi"].domain
    tm.barrier()
    if tm.rank == 1:
        back = np.zeros(5000, np.uint8)
        tm.get(back, 0, tm.addr(0, 0))
        assert dom.ring_stats["held"] == 1, dom.ring_stats
        t0 = time.monotonic()
        while not os.path.exists(flag) and time.monotonic() < t0 + 60:
            time.sleep(0.01)                       # never in gexmk meanwhile
        assert os.path.exists(flag), "rank 2 never got a ring"
        st = dom.ring_stats
        assert (st["released"], st["held"]) == (1, 0), st
    elif tm.rank == 2:
        time.sleep(0.2)
        back = np.zeros(5000, np.uint8)
        tm.get(back, 0, tm.addr(0, 0))             # waits for rank 1's release
        log("ring stats", dom.ring_stats)
        open(flag, "w").close()
    tm.barrier()
print("OK")
'''


@pytest.mark.timeout(150)
def test_holder_outside_gexmk_releases_in_the_background(tmp_path):
    need(PROVIDER)
    r = mp_util.run_job(tmp_path, AWAY_WORKER, 3, launcher_timeout=130,
                        env=rings_env(GEXMK_OFI_ZONE_RINGS="1", GEXMK_OFI_RING_IDLE="0.05",
                                      RINGS_TMP=str(tmp_path)))
    assert r.returncode == 0, r.report()
    assert r.stdout.count("OK") == 3, r.report()


# A ring in a zone its owner unbound since: the publication that says so
# (nothing bound) ends the ring here, and no release follows.  The owner frees
# the retired zone's key at the collective after that publication, and over
# tcp;ofi_rxm a write with a key the target no longer knows takes the pair's
# connection down: rank 1's idle release, sent by its lander thread after that
# barrier, made its next put -- to rank 0's new segment -- fail with ENOTCONN
# (fuzz seed 815274).
#
# "released": the same, with the release sent before the republication: the
# ring's state says "released, its answer not read" when rank 1 applies
# "nothing bound", and the release may still be on its way (seed 815274 again,
# in the CI run of 2177e8f: the lander's release, posted just before the apply,
# reached rank 0 after it freed the key).  The apply waits until it has landed
# -- a read of its done word, ordered after it, under the retired key the owner
# keeps until then -- and counts it in ring_stats["landed"].
UNBOUND_WORKER = r'''
RELEASED = sys.argv[1] == "released"
with gexmk.init() as c:
    tm = c.tm
    ep0 = c.ep(0)
    ctx = ep0.contexts["ofi"]
    dom = c.transports["ofi"].domain
    ep0.bind_segment(c.segment_create(1 << 16))
    tm.publish_bound_segment([ep0])
    if tm.rank == 1:
        tm.put(0, tm.addr(0, 0), pattern(1000, 1))     # takes a ring in rank 0's zone
        assert dom.ring_stats["held"] == 1, dom.ring_stats
        t0 = time.monotonic()
        while RELEASED and dom.ring_stats["released"] == 0 and time.monotonic() < t0 + 20:
            time.sleep(0.01)
        assert dom.ring_stats["released"] == RELEASED, dom.ring_stats
    tm.barrier()
    if tm.rank == 0:
        ep0.unbind_segment()
        assert ctx.retired == 1, ctx.retired
    tm.publish_bound_segment([ep0])                    # rank 0's: nothing bound
    if tm.rank == 1:
        assert dom.ring_stats["landed"] == RELEASED, dom.ring_stats
    tm.barrier()                                       # applied everywhere: the key is freed
    if tm.rank == 0:
        assert ctx.retired == 0, ctx.retired
    elif not RELEASED:
        # past GEXMK_OFI_RING_IDLE, outside gexmk: the lander's turn (a release
        # sent, the put follows at once: before rank 1 saw the connection go)
        t0 = time.monotonic()
        while dom.ring_stats["released"] == 0 and time.monotonic() < t0 + 1.5:
            time.sleep(0.001)
    tm.barrier()
    if tm.rank == 0:
        seg = c.segment_create(1 << 16)
        ep0.bind_segment(seg)
    tm.publish_bound_segment([ep0])
    if tm.rank == 1:
        tm.put(0, tm.addr(0, 64), pattern(1000, 2))
        back = np.zeros(1000, np.uint8)
        tm.get(back, 0, tm.addr(0, 64))
        assert np.array_equal(back, pattern(1000, 2)), "staged get after the republication"
        st = dom.ring_stats
        assert (st["opened"], st["released"], st["landed"]) == (2, RELEASED, RELEASED), st
    tm.barrier()
    if tm.rank == 0:
        assert np.array_equal(seg.view(np.uint8)[64:1064], pattern(1000, 2)), "put lost"
    tm.barrier()
print("OK")
'''


@pytest.mark.timeout(120)
@pytest.mark.parametrize("when,idle", [("unbound", "0.5"), ("released", "0.2")])
def test_ring_in_an_unbound_zone_is_never_released(tmp_path, when, idle):
    need(PROVIDER)
    r = mp_util.run_job(tmp_path, UNBOUND_WORKER, 2, launcher_timeout=100, args=[when],
                        env=rings_env(GEXMK_OFI_RING_IDLE=idle))
    assert r.returncode == 0, r.report()
    assert r.stdout.count("OK") == 2, r.report()


# GPU machines: a device segment's zone (the path ofi-staged takes by default):
# the released ring is unpinned and its pages given back, the next put pins it
# again and lands in device memory.
GPU_WORKER = PAGES + r"""
from cuda.bindings import driver as cu
with gexmk.init() as c:
    tm = c.tm
    mk = c.mk_create(gexmk.CUDA_UVA, 0)
    ep1 = c.ep_create()
    d = c.segment_create(4 << 20, kind=mk)
    ep1.bind_segment(d)
    tm.publish_bound_segment([ep1])
    c.segment_attach(1 << 20)
    h = c.ep(0).pair(1)
    ctx = ep1.contexts["ofi"]
    cu.cuCtxPushCurrent(mk.impl.context)
    N = 3 << 20
    assert h.paths(1 - tm.rank)["rma"] == "ofi-staged", h.paths(1 - tm.rank)

    def dev_read(n):
        out = np.zeros(n, np.uint8)
        cu.cuMemcpyDtoH(out.ctypes.data, d.address, n)
        return out

    for turn in (1, 2):
        if tm.rank == 1:
            h.put(0, h.addr(0, 0), pattern(N, turn))
        tm.barrier()
        if tm.rank == 0:
            assert np.array_equal(dev_read(N), pattern(N, turn)), ("turn", turn)
            lo, size, ring = ctx.zone_extent
            if turn == 1:
                t0 = time.monotonic()
                while ctx.zone_rings["zone"]["released"] == 0 and time.monotonic() < t0 + 20:
                    ctx.progress()
                    time.sleep(0.01)
                z = ctx.zone_rings["zone"]
                assert (z["backed"], z["backs"], z["released"]) == (0, 1, 1), z
                assert present(lo + ring + PAGE, ring - PAGE) == 0, "released ring still mapped"
            else:
                z = ctx.zone_rings["zone"]
                assert (z["backed"], z["backs"], z["released"]) == (1, 2, 1), z
        tm.barrier()
print("OK")
"""


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_GPU, reason="no NVIDIA driver or device on this machine")
def test_device_zone_ring_released_and_pinned_again(tmp_path):
    need(PROVIDER)
    env = ofi_env(PROVIDER)
    env.update(GEXMK_OFI_RING_IDLE="0.3", GEXMK_OFI_STAGE=None, GEXMK_OFI_ZONE_RINGS=None)
    r = mp_util.run_job(tmp_path, GPU_WORKER, 2, launcher_timeout=120, env=env)
    assert r.returncode == 0, r.report()
    assert r.stdout.count("OK") == 2, r.report()


# GEXMK_OFI_ZONE_RINGS=1 and a holder that dies with the ring (it never
# releases: GEXMK_OFI_RING_IDLE=0).  Rank 2's staged get waits for a ring;
# once the bootstrap reports rank 1 dead, rank 0's lander stops reading its
# ring and gives its place under the cap to rank 2 (without it rank 2 times
# out naming the cap).  Every byte of rank 2's puts and gets is checked.
DEAD_WORKER = PAGES + r'''
flag = os.path.join(os.environ["RINGS_TMP"], "rank2-done")
c = gexmk.init()
tm = c.tm
seg = c.segment_attach(1 << 20)
mem = seg.view(np.uint8)
tm.barrier()
N = 100000
if tm.rank == 1:
    tm.put(0, tm.addr(0, 0), pattern(N, 1))          # takes the only ring, keeps it
    assert c.transports["ofi"].domain.ring_stats["held"] == 1
tm.barrier()
if tm.rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)
elif tm.rank == 2:
    time.sleep(0.2)
    for k in range(5):
        tm.put(0, tm.addr(0, 200000 + k * N), pattern(N, 2, k))   # waits for the ring
        back = np.zeros(N, np.uint8)
        tm.get(back, 0, tm.addr(0, 200000 + k * N))
        assert np.array_equal(back, pattern(N, 2, k)), ("get", k)
    log("ring stats", c.transports["ofi"].domain.ring_stats)
    open(flag, "w").close()
    print("OK survivor", flush=True)
else:
    ctx = c.ep(0).contexts["ofi"]
    t0 = time.monotonic()
    while not os.path.exists(flag) and time.monotonic() < t0 + 60:
        time.sleep(0.01)
    z = ctx.zone_rings["zone"]
    log("zone", z)
    assert os.path.exists(flag), ("rank 2 never got the ring", z)
    assert (z["reclaimed"], z["backed"], z["cap"]) == (1, 1, 1), z
    lo, size, ring = ctx.zone_extent
    assert present(lo + ring, ring) == 0, "the dead rank's ring is still mapped"
    assert present(lo + 2 * ring, ring) > 0, "rank 2's ring holds no page"
    assert np.array_equal(mem[:N], pattern(N, 1)), "the dead's put before it died"
    for k in range(5):
        off = 200000 + k * N
        assert np.array_equal(mem[off:off + N], pattern(N, 2, k)), ("lost", k)
    print("OK owner", flush=True)
time.sleep(0.5)
os._exit(0)
'''


@pytest.mark.timeout(150)
def test_dead_holders_ring_goes_to_the_next_initiator(tmp_path):
    need(PROVIDER)
    r = mp_util.run_job(tmp_path, DEAD_WORKER, 3, keep_going=True, launcher_timeout=120,
                        env=rings_env(GEXMK_OFI_ZONE_RINGS="1", GEXMK_OFI_RING_IDLE="0",
                                      GEXMK_TIMEOUT="30", RINGS_TMP=str(tmp_path)))
    assert "OK owner" in r.stdout and "OK survivor" in r.stdout, r.report()


# Fuzz seed 101345's shape, over and over (issue 23): a third initiator's first
# staged operations to a capped zone while the other ranks -- the holders, and
# the zone's owner -- sit in a bootstrap collective, where only their threads
# serve (the owner's progress and lander threads) and release (the holders'
# lander threads).  Rank 0 holds a ring of rank 3's zone (a signal_op and a
# put); rank 2 puts with a signal to rank 1 (which waits for it) and then to
# rank 3; rank 3 only ever waits in the exchange.  Each round starts a few ms
# apart on each rank, so releases (2 ms idle), refusals (cap 1) and first
# requests of rings not backed (cap 2) meet in every order.  Every operation
# must complete (a hang is a GexmkTimeoutError, GEXMK_TIMEOUT below), every
# signal and byte must land, and the zone's counts must add up.
CHURN_WORKER = r'''
import random
ROUNDS = int(os.environ["CHURN_ROUNDS"])
with gexmk.init() as c:
    tm = c.tm
    me = tm.rank
    seg = c.segment_attach(1 << 15)
    mem = seg.view(np.uint8)
    words = seg.view(np.uint64)
    dom = c.transports["ofi"].domain
    base = [tm.addr(r, 0) for r in range(4)]
    rnd = random.Random(me)
    for i in range(ROUNDS):
        time.sleep(rnd.random() * 0.004)
        src = pattern(399, me, i)
        if me == 0:
            tm.signal_op(3, base[3], 1, gexmk.SIGNAL_ADD)          # word 0 of rank 3
            tm.put_nbi(3, base[3] + 2048, src)
        elif me == 2:
            tm.put_signal_nbi(1, base[1] + 4096, src, base[1] + 8, 1, gexmk.SIGNAL_ADD)
            tm.put_signal_nbi(3, base[3] + 4096, src, base[3] + 16, 1, gexmk.SIGNAL_ADD)
        elif me == 1:
            tm.wait_until(base[1] + 8, gexmk.CMP_GE, i + 1)
            assert np.array_equal(mem[4096:4096 + 399], pattern(399, 2, i)), i
        if me != 3:
            tm.quiet()
        # the holders and rank 3 leave gexmk alone here (no release from them)
        c.bootstrap.exchange(f"churn{i}", [0, 1, 2, 3], me, b"")
        if me == 3:
            assert words[0] == i + 1 and words[2] == i + 1, (i, words[0], words[2])
            assert np.array_equal(mem[2048:2048 + 399], pattern(399, 0, i)), i
            assert np.array_equal(mem[4096:4096 + 399], pattern(399, 2, i)), i
        c.bootstrap.exchange(f"checked{i}", [0, 1, 2, 3], me, b"")
    tm.barrier()
    z = c.ep(0).contexts["ofi"].zone_rings["zone"]
    st = dom.ring_stats
    log("zone", z, "rings", st)
    assert z["backs"] == z["released"] + z["backed"] and z["backed"] <= z["cap"], z
    assert st["opened"] == st["released"] + st["held"], st
    if me == 3:
        # both initiators' rings were backed here (how often they were released
        # and backed again between rounds depends on timing: logged, not asserted)
        assert z["backs"] >= 2, z
print("OK")
'''


@pytest.mark.timeout(240)
@pytest.mark.parametrize("cap", ["1", "2"])
def test_first_requests_while_holders_sit_in_a_bootstrap_collective(tmp_path, cap):
    need(PROVIDER)
    r = mp_util.run_job(tmp_path, CHURN_WORKER, 4, launcher_timeout=200,
                        env=rings_env(GEXMK_OFI_ZONE_RINGS=cap, GEXMK_OFI_RING_IDLE="0.002",
                                      GEXMK_OFI_STAGE_CHUNK="4096", GEXMK_OFI_STAGE_SLOTS="2",
                                      GEXMK_TIMEOUT="15", CHURN_ROUNDS="150"))
    assert r.returncode == 0, r.report()
    assert r.stdout.count("OK") == 4, r.report()
