"""VIS over libfabric in real processes (issue 22): the ofi transport's own
vector path (fi_writemsg/fi_readmsg with several ranges per message, one op
per call) over tcp;ofi_rxm and shm, and the packed path through a staged
target's landing zone (GEXMK_OFI_STAGE=all: host segments land through zones,
so the lander's unpacking runs on this CPU-only machine).

Every case is checked byte for byte against a numpy model of the target
segment (read back with one contiguous get): lists far longer than the
provider's iov limits (4 on tcp and shm), than its transmit queue
(FI_OFI_RXM_TX_SIZE / FI_TCP_TX_SIZE made small) and than the core's chunk
(GX_VIS_CHUNK, 4096 fragments); mixed small and large blocks; blocks that run
on at one end only; lists cut differently on the two sides; gets; blocking,
NB (one Event) and NBI forms; and a block outside the target's segment,
refused before a byte moves.
"""
import os

import pytest

try:
    from . import mp_util
    from .test_ofi import need, ofi_env
except ImportError:
    import mp_util
    from test_ofi import need, ofi_env

pytest.importorskip("gexmk.transports.ofi", reason="gexmk was built without the ofi transport")

WORKER = r'''
SEG = 4 << 20
c = gexmk.init()
tm = c.tm
seg = c.segment_attach(SEG)
mem = np.asarray(seg).view(np.uint8)
me, peer = tm.rank, 1 - tm.rank
want_path = os.environ["GX_WANT_PATH"]
rng = np.random.default_rng(7)
base = tm.addr(peer, 0)
model = np.zeros(SEG, np.uint8)
src = pattern(SEG, 1)

def check(what):
    back = np.zeros(SEG, np.uint8)
    tm.get(back, peer, base)
    bad = np.flatnonzero(back != model)
    assert bad.size == 0, f"{what}: {bad.size} bytes wrong at the target, first at {bad[:4]}"

def scattered(n, blk, span):
    """n blocks of blk bytes at distinct shuffled places of [0, span)."""
    return (rng.permutation(span // blk)[:n] * blk).astype(np.int64)

def put_vec(dsts, srcs, mode):
    if mode == "blocking":
        tm.put_vector(peer, dsts, srcs)
    elif mode == "nb":
        ev = tm.put_vector_nb(peer, dsts, srcs)
        assert isinstance(ev, gexmk.Event)
        ev.wait()
    else:
        tm.put_vector_nbi(peer, dsts, srcs, lc=gexmk.LC_DEFER)
        tm.quiet()

def apply(doffs, soffs, lens):
    for d, s, n in zip(doffs, soffs, lens):
        model[d:d + n] = src[s:s + n]

if me == 0:
    assert tm.transport(peer) == want_path, (tm.transport(peer), want_path)
    modes = ["blocking", "nb", "nbi"]
    # 1. many scattered 4 KiB blocks (the KV shape; far beyond the iov limits)
    for k, mode in enumerate(modes):
        d, s = scattered(700, 4096, SEG), scattered(700, 4096, SEG)
        put_vec([(base + int(x), 4096) for x in d], [(src.ctypes.data + int(x), 4096) for x in s],
                mode)
        apply(d, s, [4096] * len(d))
        check(f"700 x 4 KiB put_vector ({mode})")
    # 2. more fragments than the core's chunk (4096) and than a small tx queue:
    #    9000 blocks of 24 B, none adjacent on either side
    n = 9000
    d = (rng.permutation(SEG // 64)[:n] * 64 + 8).astype(np.int64)
    s = (rng.permutation(SEG // 64)[:n] * 64).astype(np.int64)
    for mode in modes:
        tm_args = ([(base + int(x), 24) for x in d], [(src.ctypes.data + int(x), 24) for x in s])
        put_vec(*tm_args, mode)
        apply(d, s, [24] * n)
        check(f"9000 x 24 B put_vector ({mode})")
        s = np.roll(s, 1)
    # 3. mixed small and large blocks, sizes random (1 B .. 300 KiB), no overlap
    sizes = np.concatenate([rng.integers(1, 200, 300), rng.integers(20000, 300000, 6)])
    rng.shuffle(sizes)
    doffs = np.cumsum(np.concatenate([[0], sizes[:-1] + 16]))
    assert doffs[-1] + sizes[-1] < SEG
    perm = rng.permutation(len(sizes))
    soffs = np.empty_like(doffs)
    soffs[perm] = np.cumsum(np.concatenate([[0], sizes[perm][:-1] + 8]))
    for mode in modes:
        put_vec([(base + int(o), int(z)) for o, z in zip(doffs, sizes)],
                [(src.ctypes.data + int(o), int(z)) for o, z in zip(soffs, sizes)], mode)
        apply(doffs, soffs, sizes)
        check(f"mixed sizes ({mode})")
        soffs = soffs[::-1].copy()
    # 4. contiguous at the target only, and lists cut differently on the two sides:
    #    16 local blocks of 3000 B -> 48000 B as 6 remote blocks of 8000 B, adjacent
    ls = scattered(16, 4096, SEG)
    tm.put_vector(peer, [(base + 100000 + 8000 * i, 8000) for i in range(6)],
                  [(src.ctypes.data + int(x), 3000) for x in ls])
    flat = np.concatenate([src[x:x + 3000] for x in ls])
    model[100000:148000] = flat
    check("cut differently")
    # small blocks that run on at the target (packed into one message), zero-length
    # blocks among them (first too), put then get back into scattered places
    ls = scattered(60, 64, SEG)
    srcl = [(src.ctypes.data + int(x), 0 if k % 7 == 0 else 24) for k, x in enumerate(ls)]
    nb = sum(n for _, n in srcl)
    tm.put_vector(peer, [(base + 200000, nb)], srcl)
    model[200000:200000 + nb] = np.concatenate([src[x:x + n] for (x, n) in
                                                ((a - src.ctypes.data, n) for a, n in srcl)])
    check("small blocks contiguous at the target, zero-length among them")
    out = np.zeros(SEG, np.uint8)
    gl = [(out.ctypes.data + int(x), 0 if k % 7 == 0 else 24) for k, x in enumerate(ls)]
    tm.get_vector(gl, peer, [(base + 200000, nb)])
    got = np.concatenate([out[a - out.ctypes.data:a - out.ctypes.data + n] for a, n in gl])
    assert np.array_equal(got, model[200000:200000 + nb]), "packed get with zero-length blocks"
    # 5. indexed and strided forms
    ra = (base + scattered(300, 512, SEG)).astype(np.uint64)
    la = (src.ctypes.data + scattered(300, 512, SEG)).astype(np.uint64)
    tm.put_indexed(peer, ra, 512, la, 512)
    apply(ra - np.uint64(base), la - np.uint64(src.ctypes.data), [512] * 300)
    check("put_indexed")
    col = np.arange(2048 * 64, dtype=np.float64).reshape(2048, 64)[:, 5]
    tm.put(peer, base + 3000000, col)
    model[3000000:3000000 + col.nbytes] = np.ascontiguousarray(col).view(np.uint8)
    check("strided put of a numpy column")
    # 6. gets: vector, indexed, into a column
    for mode in modes:
        d, s = scattered(800, 4096, SEG), scattered(800, 4096, SEG)
        out = np.zeros(SEG, np.uint8)
        dl = [(out.ctypes.data + int(x), 4096) for x in d]
        sl = [(base + int(x), 4096) for x in s]
        if mode == "blocking":
            tm.get_vector(dl, peer, sl)
        elif mode == "nb":
            tm.get_vector_nb(dl, peer, sl).wait()
        else:
            tm.get_vector_nbi(dl, peer, sl)
            gexmk.nbi_wait(gexmk.EC_GET)
        for x, y in zip(d, s):
            assert np.array_equal(out[x:x + 4096], model[y:y + 4096]), f"get_vector ({mode})"
    out = np.zeros(9000 * 24, np.uint8)
    s = (rng.permutation(SEG // 64)[:9000] * 64).astype(np.int64)
    tm.get_indexed(out.ctypes.data + np.arange(9000, dtype=np.uint64) * np.uint64(24), 24, peer,
                   (base + s).astype(np.uint64), 24)
    assert np.array_equal(out.reshape(9000, 24), model[s[:, None] + np.arange(24)]), "get_indexed"
    colb = np.zeros((2048, 64))
    tm.get(colb[:, 5], peer, base + 3000000)
    assert np.array_equal(colb[:, 5], col), "strided get into a numpy column"
    # 7. a block outside the target's segment: refused, naming it, before a byte moves
    d = scattered(50, 4096, SEG)
    dl = [(base + int(x), 4096) for x in d] + [(base + SEG - 100, 4096)]
    e = expect_raises(E.BoundsError, tm.put_vector, peer, dl,
                      [(src.ctypes.data, 4096 * 51)])
    assert "dsts[50]" in str(e), e
    e = expect_raises(E.BoundsError, tm.get_indexed, np.zeros(2, np.uint64) + np.uint64(src.ctypes.data),
                      8, peer, np.array([base, base - 8], np.uint64), 8)
    assert "srcs[1]" in str(e), e
    check("after the refused calls")
    vp = c.transports["ofi"].domain.vis_paths
    log("vis paths", vp)
    landed = os.environ.get("GX_WANT_LANDED")
    if landed == "1":
        assert vp["ofi-landed"] > 0 and vp["ofi"] > 0, vp      # the large blocks went direct
        assert tm.paths(peer) == {"rma": "ofi", "atomic": "ofi", "vis": "ofi-landed"}, \
            tm.paths(peer)
    elif landed == "0":
        assert vp["ofi-landed"] == 0 and vp["ofi"] > 0, vp
        assert tm.paths(peer) == {"rma": "ofi", "atomic": "ofi"}, tm.paths(peer)
    packer = os.environ.get("GEXMK_OFI_VIS_PACKER")
    if packer == "1" and landed == "1":
        assert vp["packed-ahead"] > 0, vp
    elif packer == "0":
        assert vp["packed-ahead"] == 0, vp
    log("OK")
tm.barrier()
c.finalize()
print("OK")
'''


def _run(tmp_path, provider, path, **extra):
    need(provider)
    env = ofi_env(provider)
    env["GX_WANT_PATH"] = path
    env.update(extra)
    r = mp_util.run_job(tmp_path, WORKER, 2, launcher_timeout=240, env=env)
    assert r.returncode == 0, r.report()
    assert r.stdout.count("OK") == 2, r.report()


@pytest.mark.parametrize("provider", ["tcp;ofi_rxm", "shm"])
def test_vis_over_ofi(tmp_path, provider):
    """Small blocks through the host target's VIS landing zone where they
    would take many messages (tcp: 4 remote ranges each), the rest direct."""
    _run(tmp_path, provider, "ofi", GX_WANT_LANDED="1" if provider == "tcp;ofi_rxm" else None)


@pytest.mark.parametrize("provider", ["tcp;ofi_rxm", "shm"])
def test_vis_over_ofi_direct(tmp_path, provider):
    """GEXMK_OFI_VIS_LAND=0: every message direct (fi_writemsg/fi_readmsg)."""
    _run(tmp_path, provider, "ofi", GX_WANT_LANDED="0", GEXMK_OFI_VIS_LAND="0")


@pytest.mark.parametrize("packer", ["0", "1"])
def test_vis_over_ofi_small_landing_slots(tmp_path, packer):
    """The VIS landing zone's slots small and few: each reused many times
    over in one call, descriptors right behind their data; with the packer
    thread packing the next slot while one goes out, and without."""
    _run(tmp_path, "tcp;ofi_rxm", "ofi", GX_WANT_LANDED="1", GEXMK_OFI_VIS_SLOTS="2",
         GEXMK_OFI_VIS_CHUNK="16384", GEXMK_OFI_VIS_PACKER=packer)


@pytest.mark.parametrize("packer", ["0", "1"])
def test_vis_packer_over_tcp(tmp_path, packer):
    """Packed puts with the packer thread forced on (it packs slot k + 1 while
    slot k goes out; GEXMK_OFI_VIS_PACKER=auto turns it on from four CPUs)
    and off: every byte checked as above, the slots it packed counted."""
    _run(tmp_path, "tcp;ofi_rxm", "ofi", GX_WANT_LANDED="1", GEXMK_OFI_VIS_PACKER=packer)


CAP_WORKER = r'''
# GEXMK_OFI_ZONE_RINGS=1 and GEXMK_OFI_RING_IDLE=0 (no ring is ever released):
# rank 0's zones back one initiator's ring; rank 1 comes first and is served
# through them, rank 2 is refused: its packed VIS goes direct (host target),
# its staged transfers wait for a ring and time out naming the cap (staged
# target; rank 2's GEXMK_TIMEOUT is short, the others' not).
if os.environ.get("GEXMK_RANK") == "2":
    os.environ["GEXMK_TIMEOUT"] = "2"
c = gexmk.init()
tm = c.tm
seg = c.segment_attach(1 << 20)
staged = os.environ.get("GEXMK_OFI_STAGE") == "all"
blk, n = 1024, 200
for turn in (1, 2):
    tm.barrier()
    if tm.rank != turn:
        continue
    base = tm.addr(0, 0) + turn * n * blk
    src = (np.arange(n * blk) % 251 + turn).astype(np.uint8)
    dst = [(base + blk * int(i), blk) for i in np.random.default_rng(turn).permutation(n)]
    srcs = [(src.ctypes.data + blk * k, blk) for k in range(n)]
    if staged and turn == 2:
        t0 = time.monotonic()
        e = expect_raises(E.TimeoutError, tm.put_vector, 0, dst, srcs)
        assert "GEXMK_OFI_ZONE_RINGS" in str(e) and "backs 1 at once" in str(e), e
        e = expect_raises(E.TimeoutError, tm.put, 0, base, src[:100])
        log("refused", time.monotonic() - t0, "s:", e)
        st = c.transports["ofi"].domain.ring_stats
        assert st["waited"] > 0 and st["opened"] == 0, st
        continue
    tm.put_vector(0, dst, srcs)
    back = np.zeros(n * blk, np.uint8)
    tm.get_vector([(back.ctypes.data + blk * k, blk) for k in range(n)], 0, dst)
    assert np.array_equal(back, src), f"rank {turn}: other bytes came back"
    vp = c.transports["ofi"].domain.vis_paths
    log("vis paths", vp)
    if not staged:
        assert vp["ofi-landed" if turn == 1 else "refused"] > 0, vp
tm.barrier()
if tm.rank == 0:
    rings = c.ep(0).contexts["ofi"].zone_rings
    log("rings", rings)
    z = rings["zone" if staged else "vis"]
    assert (z["backed"], z["backs"], z["released"], z["cap"]) == (1, 1, 0, 1), rings
    assert z["refused"] >= 1, rings
tm.barrier()
c.finalize()
print("OK")
'''


@pytest.mark.parametrize("staged", [False, True], ids=["host", "staged"])
def test_zone_ring_cap(tmp_path, staged):
    """issue 23: a zone backs rings for at most GEXMK_OFI_ZONE_RINGS
    initiators at once; with no ring ever released (GEXMK_OFI_RING_IDLE=0)
    the next is refused: direct VIS to a host segment, a staged transfer
    waits GEXMK_TIMEOUT and raises TimeoutError naming the cap -- never a
    hang."""
    need("tcp;ofi_rxm")
    env = ofi_env("tcp;ofi_rxm")
    env.update(GEXMK_OFI_ZONE_RINGS="1", GEXMK_OFI_RING_IDLE="0", GEXMK_TIMEOUT="30")
    if staged:
        env.update(GEXMK_OFI_STAGE="all", GEXMK_OFI_STAGE_CHUNK="64K", GEXMK_OFI_STAGE_SLOTS="3")
    r = mp_util.run_job(tmp_path, CAP_WORKER, 3, launcher_timeout=150, env=env)
    assert r.returncode == 0, r.report()
    assert r.stdout.count("OK") == 3, r.report()


def test_vis_over_tcp_with_a_small_transmit_queue(tmp_path):
    """Lists longer than the provider's transmit queue: -FI_EAGAIN mid-list,
    progress, retry (every message still posted before the op is waited for)."""
    _run(tmp_path, "tcp;ofi_rxm", "ofi", FI_OFI_RXM_TX_SIZE="16", FI_TCP_TX_SIZE="16",
         FI_OFI_RXM_MSG_TX_SIZE="16")


@pytest.mark.parametrize("provider", ["tcp;ofi_rxm", "shm"])
def test_vis_packed_through_the_landing_zone(tmp_path, provider):
    """A staged target (GEXMK_OFI_STAGE=all): small blocks packed into one
    request per landing slot, unpacked by the target's lander; large ones
    staged one by one; slots reused many times over (3 slots of 64 KiB)."""
    _run(tmp_path, provider, "ofi-staged", GEXMK_OFI_STAGE="all",
         GEXMK_OFI_STAGE_CHUNK="64K", GEXMK_OFI_STAGE_SLOTS="3")


GPU_WORKER = r'''
from cuda.bindings import driver as cu
SEG = 8 << 20
c = gexmk.init()
tm = c.tm
me, peer = tm.rank, 1 - tm.rank
mk = c.mk_create(gexmk.CUDA_UVA, 0)
d = c.segment_create(SEG, kind=mk)
c.ep(0).bind_segment(d)
tm.publish_bound_segment([c.ep(0)])
assert tm.transport(peer) == "ofi-staged", tm.transport(peer)
cu.cuCtxPushCurrent(mk.impl.context)

def dev_fill(off, data):
    cu.cuMemcpyHtoD(d.address + off, data.ctypes.data, data.nbytes)

def dev_read(off, n):
    out = np.zeros(n, np.uint8)
    cu.cuMemcpyDtoH(out.ctypes.data, d.address + off, n)
    return out

rng = np.random.default_rng(5)
src = pattern(SEG // 2, me)
dev_fill(SEG // 2, src)                       # sources: the upper half of my device segment
dev_fill(0, np.zeros(SEG // 2, np.uint8))
tm.barrier()
if me == 0:
    base = tm.addr(peer, 0)
    # the KV shape: blocks of 4 KiB (packed) and 200 KiB (one staged transfer each),
    # device -> remote device, indexed and vector, then back with get_indexed
    for blk, n in ((4096, 300), (200 << 10, 6)):
        so = rng.permutation((SEG // 2) // blk)[:n] * blk
        do = rng.permutation((SEG // 2) // blk)[:n] * blk
        tm.put_indexed(peer, (base + do).astype(np.uint64), blk,
                       (d.address + SEG // 2 + so).astype(np.uint64), blk)
        back = np.zeros(n * blk, np.uint8)
        tm.get_indexed(back.ctypes.data + np.arange(n, dtype=np.uint64) * np.uint64(blk), blk, peer,
                       (base + do).astype(np.uint64), blk)
        for i in range(n):
            assert np.array_equal(back[i * blk:(i + 1) * blk], src[so[i]:so[i] + blk]), (blk, i)
        # remote device -> local device blocks
        lo = rng.permutation((SEG // 2) // blk)[:n] * blk
        tm.get_vector([(d.address + int(x), blk) for x in lo], peer,
                      [(base + int(x), blk) for x in do])
        for i in range(n):
            assert np.array_equal(dev_read(int(lo[i]), blk), src[so[i]:so[i] + blk]), ("get", blk, i)
    log("OK")
tm.barrier()
cu.cuCtxPopCurrent()
c.finalize()
print("OK")
'''


@pytest.mark.gpu
def test_vis_device_segments_over_tcp_staged(tmp_path):
    """Device segments over tcp (ofi-staged, 2 ranks on one GPU): small device
    blocks packed through the target's lander, large ones staged one by one."""
    try:
        from .test_cuda_segments import HAVE_GPU
    except ImportError:
        from test_cuda_segments import HAVE_GPU
    if not HAVE_GPU:
        pytest.skip("no NVIDIA driver or device on this machine")
    need("tcp;ofi_rxm")
    env = ofi_env("tcp;ofi_rxm")
    r = mp_util.run_job(tmp_path, GPU_WORKER, 2, launcher_timeout=200, env=env)
    assert r.returncode == 0, r.report()
    assert r.stdout.count("OK") == 2, r.report()


def test_vis_packer_setting_is_checked(tmp_path):
    """A GEXMK_OFI_VIS_PACKER that is none of auto, 0, 1 is refused by name when
    the transport is imported, not ignored."""
    import subprocess
    import sys
    env = dict(os.environ, GEXMK_OFI_VIS_PACKER="yes")
    r = subprocess.run([sys.executable, "-P", "-c", "import gexmk.transports.ofi"], env=env,
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode != 0 and "GEXMK_OFI_VIS_PACKER='yes'" in r.stderr, r.stderr
