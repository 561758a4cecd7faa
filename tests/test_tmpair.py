"""TM-pairs between many endpoints of many processes (after GASNet-EX's testtmpair).

Every process creates 4 endpoints, binds a segment of its own to each and
publishes all of them over the primordial team.  Then, for every (local EP,
remote rank, remote EP), it reaches the remote EP through
``ep.pair(remote_index)`` with every put flavour, each with its own data, and
reads them back with every get flavour; finally each process checks that its
own segments hold exactly what every peer wrote, byte for byte.
"""
import pytest

try:
    from . import mp_util
except ImportError:
    import mp_util


WORKER = r'''
NEP = 4           # endpoints per process
BLK = 64          # bytes per (writer rank, writer EP, flavour) block
c = gexmk.init()
tm = c.tm
me, n = tm.rank, tm.size

PUTS = ["blocking", "nb", "nbi", "nbi_region", "val8", "nb_val4", "nbi_val2",
        "nb_defer", "nb_leaf", "nbi_group", "nb_wait_all"]
GETS = ["blocking", "nb", "nbi", "nbi_region", "val"]
NF = len(PUTS)
SEGSIZE = n * NEP * NF * BLK

def offset(src_rank, src_ep, flavour):
    return ((src_rank * NEP + src_ep) * NF + flavour) * BLK

def block(src_rank, src_ep, dst_rank, dst_ep, flavour):
    """What (src_rank, src_ep) leaves in dst's block for this flavour (BLK bytes)."""
    data = pattern(BLK, src_rank, src_ep, dst_rank, dst_ep, flavour)
    name = PUTS[flavour]
    if name.startswith("val") or "_val" in name:
        k = int(name[-1])
        out = np.zeros(BLK, np.uint8)
        out[:k] = data[:k]
        return out
    return data

def value(arr8):
    return int.from_bytes(arr8[:8].tobytes(), sys.byteorder)

eps = [c.ep(0)] + [c.ep_create() for _ in range(NEP - 1)]
segs = []
for e in eps:
    s = c.segment_create(SEGSIZE)
    e.bind_segment(s)
    segs.append(s)
tm.publish_bound_segment(eps)

pending = []
for l, lep in enumerate(eps):
    for e in range(NEP):
        pr = lep.pair(e)
        assert pr.size == n and pr.rank == me, (pr.size, pr.rank)
        for r in range(n):
            assert pr.ep_location(r) == (r, e)
            assert pr.translate_rank_to_jobrank(r) == r
            want = "self" if r == me else peer_transport()
            assert pr.transport(r) == want, (l, e, r, pr.transport(r), want)
            q = pr.query_bound_segment_nb(r).wait()
            assert q.size == SEGSIZE
            for f, name in enumerate(PUTS):
                dest = pr.addr(r, offset(me, l, f))
                data = block(me, l, r, e, f)
                if name == "blocking":
                    pr.put(r, dest, data)
                elif name == "nb":
                    ev = pr.put_nb(r, dest, data)
                    assert ev.wait() is None
                    assert ev.test()
                elif name == "nbi":
                    pr.put_nbi(r, dest, data)
                    gexmk.nbi_wait(gexmk.EC_PUT)
                    assert gexmk.nbi_test(gexmk.EC_PUT)
                elif name == "nbi_region":
                    with gexmk.nbi_access_region() as rev:
                        pr.put_nbi(r, dest, data[:BLK // 2])
                        pr.put_nbi(r, dest + BLK // 2, data[BLK // 2:])
                    rev.wait()
                    assert rev.test()
                elif name == "val8":
                    pr.put_val(r, dest, value(data), 8)
                elif name == "nb_val4":
                    pr.put_nb_val(r, dest, value(data), 4).wait()
                elif name == "nbi_val2":
                    pr.put_nbi_val(r, dest, value(data), 2)
                    gexmk.nbi_wait(gexmk.EC_PUT)
                elif name == "nb_defer":
                    src = data.copy()
                    ev = pr.put_nb(r, dest, src, lc=gexmk.LC_DEFER)
                    ev.leaf(gexmk.EC_LC).wait()
                    src[:] = 0           # locally complete: the source may be reused
                    ev.wait()
                elif name == "nb_leaf":
                    src = bytearray(data.tobytes())
                    lc = gexmk.LeafEvent()
                    ev = pr.put_nb(r, dest, src, lc=lc)
                    lc.wait()
                    src[:] = bytes(BLK)
                    ev.wait()
                elif name == "nbi_group":
                    src = data.copy()
                    pr.put_nbi(r, dest, src, lc=gexmk.LC_GROUP)
                    gexmk.nbi_wait(gexmk.EC_PUT | gexmk.EC_LC)
                    src[:] = 0
                elif name == "nb_wait_all":
                    # the source is a (address, nbytes) tuple of memory kept alive here
                    keep = data.copy()
                    pending.append((keep, pr.put_nb(r, dest, (keep.ctypes.data, BLK))))
                else:
                    raise AssertionError(name)
gexmk.wait_all([ev for _, ev in pending])
assert gexmk.test_all([ev for _, ev in pending])
gexmk.quiet()
tm.barrier()

# read back what I wrote, with every get flavour in turn
g = 0
for l, lep in enumerate(eps):
    for e in range(NEP):
        pr = lep.pair(e)
        for r in range(n):
            for f in range(NF):
                src = pr.addr(r, offset(me, l, f))
                want = block(me, l, r, e, f)
                how = GETS[g % len(GETS)]
                g += 1
                got = np.full(BLK, 0xEE, np.uint8)
                if how == "blocking":
                    pr.get(got, r, src)
                elif how == "nb":
                    pr.get_nb(got, r, src).wait()
                elif how == "nbi":
                    pr.get_nbi(got, r, src)
                    gexmk.nbi_wait(gexmk.EC_GET)
                elif how == "nbi_region":
                    with gexmk.nbi_access_region() as rev:
                        pr.get_nbi(got[:8], r, src)
                        pr.get_nbi((got.ctypes.data + 8, BLK - 8), r, src + 8)
                    rev.wait()
                elif how == "val":
                    for k in range(0, BLK, 8):
                        got[k:k + 8] = np.frombuffer(
                            pr.get_val(r, src + k, 8).to_bytes(8, sys.byteorder), np.uint8)
                assert (got == want).all(), (f"get {how} of ({me},{l})->({r},{e}) {PUTS[f]}: "
                                             f"{got.tobytes().hex()} != {want.tobytes().hex()}")
tm.barrier()

# each process checks its own segments: exactly what every peer wrote, nothing else
for e, s in enumerate(segs):
    image = np.zeros(SEGSIZE, np.uint8)
    for w in range(n):
        for l in range(NEP):
            for f in range(NF):
                o = offset(w, l, f)
                image[o:o + BLK] = block(w, l, me, e, f)
    have = np.asarray(s)
    bad = np.flatnonzero(have != image)
    if bad.size:
        o = int(bad[0]) // BLK * BLK
        w, rest = divmod(o // BLK, NEP * NF)
        l, f = divmod(rest, NF)
        raise AssertionError(f"segment of EP {e}: {bad.size} wrong bytes; first in the block of "
                             f"writer rank {w} EP {l} flavour {PUTS[f]}")
tm.barrier()
c.finalize()
'''


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("transport", ["auto", "pvm"])
def test_tmpair_all_flavours(tmp_path, n, transport):
    mp_util.run_job(tmp_path, WORKER, n, env={"GEXMK_TRANSPORT": transport},
                    launcher_timeout=90).check()


@pytest.mark.timeout(60)
def test_tmpair_to_unpublished_endpoint(tmp_path):
    """A pair naming an endpoint index the peer never published fails
    cleanly (SegmentError), as does one naming a destroyed local EP."""
    src = r'''
    c = gexmk.init()
    tm = c.tm
    me, n = tm.rank, tm.size
    ep1 = c.ep_create()
    ep1.bind_segment(c.segment_create(256))
    tm.publish_bound_segment([c.ep(0), ep1])     # EP 0 has nothing bound
    other = (me + 1) % n
    p1 = c.ep(0).pair(1)
    p1.put_val(other, p1.addr(other, 0), me)
    p0 = ep1.pair(0)
    assert p0.transport(other) == "none"
    expect_raises(E.SegmentError, p0.put_val, other, 0x10000, 1)
    p7 = c.ep(0).pair(7)                         # no such EP anywhere
    assert p7.transport(other) == "none"
    expect_raises(E.SegmentError, p7.get_val, other, 0x10000)
    expect_raises(E.SegmentError, p7.addr, other, 0)
    expect_raises(E.RankError, p1.put_val, n, 0x10000, 1)
    expect_raises(E.ArgumentError, c.ep(0).pair, -1)
    tm.barrier()
    assert int(np.frombuffer(np.asarray(ep1.segment), np.int64)[0]) == (me - 1) % n
    ep2 = c.ep_create()
    ep2.destroy()
    expect_raises(E.StateError, ep2.pair, 0)
    c.finalize()
    '''
    mp_util.run_job(tmp_path, src, 2).check()
