"""Segment publication across processes (after GASNet-EX's testsegment).

Each test runs a worker script on N ranks under ``python -m gexmk.run``; the
workers assert and the job's exit code carries the verdict.  Library-allocated
segments are reached over 'nbrhd' (shared-memory mapping) or, with
GEXMK_TRANSPORT=pvm, over 'pvm' (process_vm_*); client-allocated ones always
over 'pvm'.
"""
import pytest

try:
    from . import mp_util
except ImportError:
    import mp_util

NRANKS = pytest.mark.parametrize("n", [2, 4])
TRANSPORTS = pytest.mark.parametrize("transport", ["auto", "pvm"])


def run(tmp_path, source, n, transport="auto", **kw):
    return mp_util.run_job(tmp_path, source, n, env={"GEXMK_TRANSPORT": transport}, **kw)


@pytest.mark.timeout(90)
@NRANKS
@TRANSPORTS
def test_attach_and_ring_put_get(tmp_path, n, transport):
    src = r'''
    c = gexmk.init()
    tm = c.tm
    me, n = tm.rank, tm.size
    assert (me, n) == (c.rank, c.size) == (int(os.environ["GEXMK_RANK"]), int(os.environ["GEXMK_SIZE"]))
    seg = c.segment_attach(4096)
    arr = np.asarray(seg)
    assert arr.shape == (4096,) and seg.size == 4096
    for r in range(n):
        want = "self" if r == me else peer_transport()
        assert tm.transport(r) == want, (r, tm.transport(r), want)
    right, left = (me + 1) % n, (me - 1) % n
    tm.put(right, tm.addr(right, 100), pattern(1000, me, right))
    tm.barrier()
    assert (arr[100:1100] == pattern(1000, left, me)).all(), "ring put did not land"
    # (byte 4095 is written by the left neighbour below, maybe already)
    assert not arr[:100].any() and not arr[1100:4095].any(), "ring put wrote outside its range"
    back = np.zeros(1000, np.uint8)
    tm.get(back, right, tm.addr(right, 100))
    assert (back == pattern(1000, me, right)).all(), "get of what I put came back wrong"
    # the last byte of a peer's segment is reachable, one past it is not
    tm.put_val(right, tm.addr(right, 4095), 0xAB, 1)
    assert tm.get_val(right, tm.addr(right, 4095), 1) == 0xAB
    expect_raises(E.BoundsError, tm.put, right, tm.addr(right, 4095), b"xy")
    expect_raises(E.BoundsError, tm.get_val, right, tm.addr(right, 4096), 1)
    tm.barrier()
    assert arr[4095] == 0xAB
    c.finalize()
    '''
    run(tmp_path, src, n, transport).check()


@pytest.mark.timeout(90)
@NRANKS
def test_publish_zero_endpoints_on_some_ranks(tmp_path, n):
    src = r'''
    c = gexmk.init()
    tm = c.tm
    me, n = tm.rank, tm.size
    ep0 = c.ep(0)
    publishers = [r for r in range(n) if r % 2 == 0]
    if me in publishers:
        seg = c.segment_create(2048)
        ep0.bind_segment(seg)
        tm.publish_bound_segment([ep0])
    else:
        tm.publish_bound_segment([])            # zero endpoints: still collective
    for r in range(n):
        if r == me:
            continue
        if r in publishers:
            assert tm.transport(r) == "nbrhd", (r, tm.transport(r))
            tm.put(r, tm.addr(r, 8 * me), np.array([me + 1], np.int64))
        else:
            assert tm.transport(r) == "none", (r, tm.transport(r))
            expect_raises(E.SegmentError, tm.addr, r, 0)
            expect_raises(E.SegmentError, tm.put, r, 0x10000, b"x")
            expect_raises(E.SegmentError, tm.get_val, r, 0x10000)
            expect_raises(E.SegmentError, tm.query_bound_segment_nb, r)
    tm.barrier()
    if me in publishers:
        got = np.frombuffer(np.asarray(seg), np.int64)[:n]
        want = [0 if (r == me) else r + 1 for r in range(n)]
        assert list(got) == want, (list(got), want)
    c.finalize()
    '''
    run(tmp_path, src, n).check()


@pytest.mark.timeout(90)
@NRANKS
def test_publish_before_bind_is_harmless(tmp_path, n):
    src = r'''
    c = gexmk.init()
    tm = c.tm
    me, n = tm.rank, tm.size
    ep0 = c.ep(0)
    tm.publish_bound_segment([ep0])            # nothing bound yet: publishes "no segment"
    peers = [r for r in range(n) if r != me]
    for r in peers:
        assert tm.transport(r) == "none", (r, tm.transport(r))
        expect_raises(E.SegmentError, tm.addr, r, 0)
        expect_raises(E.SegmentError, tm.put_val, r, 0x10000, 1)
    seg = c.segment_create(1024)
    ep0.bind_segment(seg)
    tm.publish_bound_segment([ep0])
    for r in peers:
        assert tm.transport(r) == "nbrhd"
        tm.put_val(r, tm.addr(r, 8 * me), 1000 + me)
    tm.barrier()
    got = np.frombuffer(np.asarray(seg), np.int64)[:n]
    assert list(got) == [0 if r == me else 1000 + r for r in range(n)], list(got)
    c.finalize()
    '''
    run(tmp_path, src, n).check()


@pytest.mark.timeout(90)
@NRANKS
@TRANSPORTS
def test_repeated_publication_keeps_access_and_data(tmp_path, n, transport):
    src = r'''
    c = gexmk.init()
    tm = c.tm
    me, n = tm.rank, tm.size
    seg = c.segment_attach(4096)
    arr = np.asarray(seg)
    right, left = (me + 1) % n, (me - 1) % n
    for round in range(4):
        tm.put(right, tm.addr(right, 512 * round), pattern(512, me, round))
        tm.publish_bound_segment([c.ep(0)])    # again: same segment, same EP
        assert tm.transport(right) == ("self" if right == me else peer_transport())
        q = tm.query_bound_segment_nb(right).wait()
        assert q.size == 4096
    tm.barrier()
    for round in range(4):
        assert (arr[512 * round:512 * (round + 1)] == pattern(512, left, round)).all(), round
    assert not arr[2048:].any()
    # publishing over a dup'ed team works too and is independent
    tm2 = tm.dup()
    tm2.publish_bound_segment([c.ep(0)])
    buf = np.zeros(2048, np.uint8)
    tm2.get(buf, right, tm2.addr(right, 0))
    assert (buf == np.concatenate([pattern(512, me, r) for r in range(4)])).all()
    c.finalize()
    '''
    run(tmp_path, src, n, transport).check()


@pytest.mark.timeout(90)
@NRANKS
@TRANSPORTS
def test_unbind_and_republish_makes_peers_fail(tmp_path, n, transport):
    src = r'''
    c = gexmk.init()
    tm = c.tm
    me, n = tm.rank, tm.size
    seg = c.segment_attach(4096)
    old0 = tm.addr(0, 0)
    for r in range(n):
        tm.put_val(r, tm.addr(r, 8 * me), 7)
    tm.barrier()
    if me == 0:
        c.ep(0).unbind_segment()
        assert c.ep(0).segment is None
        tm.publish_bound_segment([c.ep(0)])
    else:
        tm.publish_bound_segment([])
    # rank 0's EP 0 has no segment now, for everybody, itself included
    assert tm.transport(0) == "none", tm.transport(0)
    e = expect_raises(E.SegmentError, tm.put_val, 0, old0, 1)
    assert "segment" in str(e), str(e)
    expect_raises(E.SegmentError, tm.get, bytearray(8), 0, old0)
    expect_raises(E.SegmentError, tm.addr, 0, 0)
    expect_raises(E.SegmentError, tm.query_bound_segment_nb, 0)
    # the other ranks are untouched
    for r in range(1, n):
        assert tm.get_val(r, tm.addr(r, 8 * me)) == 7
    tm.barrier()
    if me == 0:
        # the unbound segment still belongs to rank 0 and keeps its data
        assert list(np.frombuffer(np.asarray(seg), np.int64)[:n]) == [7] * n
    c.finalize()
    '''
    run(tmp_path, src, n, transport).check()


@pytest.mark.timeout(90)
@NRANKS
@TRANSPORTS
def test_rebind_new_segment_and_republish(tmp_path, n, transport):
    src = r'''
    c = gexmk.init()
    tm = c.tm
    me, n = tm.rank, tm.size
    seg_a = c.segment_attach(4096)
    a_addr = tm.addr(0, 0)
    if me != 0:
        tm.put(0, tm.addr(0, 256 * me), pattern(256, me, 0xA))
    tm.barrier()
    if me == 0:
        ep0 = c.ep(0)
        ep0.unbind_segment()
        seg_b = c.segment_create(8192)
        ep0.bind_segment(seg_b)
        tm.publish_bound_segment([ep0])
        assert tm.addr(0, 0) == seg_b.address
    else:
        tm.publish_bound_segment([])
    q = tm.query_bound_segment_nb(0).wait()
    assert q.size == 8192, q
    assert q.address != a_addr and tm.addr(0, 0) == q.address
    if me != 0:
        assert tm.transport(0) == peer_transport()
        # the old segment's addresses no longer name rank 0's bound segment
        expect_raises(E.BoundsError, tm.put, 0, a_addr + 256 * me, b"stale")
        tm.put(0, tm.addr(0, 8192 - 256 * me), pattern(256, me, 0xB))
    tm.barrier()
    if me == 0:
        a = np.asarray(seg_a)
        b = np.asarray(seg_b)
        for r in range(1, n):
            assert (a[256 * r:256 * (r + 1)] == pattern(256, r, 0xA)).all(), f"old data of {r} touched"
            assert (b[8192 - 256 * r:8192 - 256 * (r - 1)] == pattern(256, r, 0xB)).all(), r
        assert not a[:256].any() and not a[256 * n:].any(), "old segment written after unbind"
        assert not b[:8192 - 256 * (n - 1)].any()
    c.finalize()
    '''
    run(tmp_path, src, n, transport).check()


@pytest.mark.timeout(90)
@NRANKS
@TRANSPORTS
def test_query_bound_segment_matches_owner(tmp_path, n, transport):
    src = r'''
    import json
    c = gexmk.init()
    tm = c.tm
    me, n = tm.rank, tm.size
    size = 4096 * (me + 1) + 24 * me          # a different, odd size on every rank
    seg = c.segment_attach(size)
    with open(f"seg.{me}.json", "w") as f:     # out-of-band truth: the owner's view
        json.dump({"address": seg.address, "size": seg.size}, f)
    tm.barrier()
    for r in range(n):
        with open(f"seg.{r}.json") as f:
            truth = json.load(f)
        ev = tm.query_bound_segment_nb(r)
        q = ev.wait()
        assert isinstance(q, gexmk.BoundSegment)
        assert (q.address, q.size) == (truth["address"], truth["size"]), (r, q, truth)
        assert q.kind == gexmk.HOST, q.kind
        assert tm.addr(r, 0) == q.address and tm.addr(r, q.size) == q.address + q.size
        if r == me:
            assert q.transport == "self" and q.local_address == seg.address, q
        elif peer_transport() == "nbrhd":
            assert q.transport == "nbrhd" and q.local_address is not None, q
        else:
            assert q.transport == "pvm" and q.local_address is None, q
        # the whole reported range is accessible, nothing past it
        tm.put_val(r, q.address + q.size - 8, 0x55AA + me)
        expect_raises(E.BoundsError, tm.put_val, r, q.address + q.size - 4, 1)
    expect_raises(E.RankError, tm.query_bound_segment_nb, n)
    expect_raises(E.RankError, tm.query_bound_segment_nb, -1)
    c.finalize()
    '''
    run(tmp_path, src, n, transport).check()


@pytest.mark.timeout(90)
@NRANKS
@TRANSPORTS
def test_client_allocated_segment_over_pvm(tmp_path, n, transport):
    src = r'''
    c = gexmk.init()
    tm = c.tm
    me, n = tm.rank, tm.size
    mem = np.zeros(8192, np.uint8)             # client memory: a numpy array
    seg = c.segment_create(buffer=mem)
    assert seg.address == mem.ctypes.data and seg.size == mem.nbytes
    ep0 = c.ep(0)
    ep0.bind_segment(seg)
    tm.publish_bound_segment([ep0])
    right, left = (me + 1) % n, (me - 1) % n
    for r in range(n):
        q = tm.query_bound_segment_nb(r).wait()
        if r == me:
            assert q.transport == "self"
        else:
            # not mappable by peers, whatever GEXMK_TRANSPORT says
            assert tm.transport(r) == "pvm" and q.transport == "pvm" and q.local_address is None, q
    # put: data lands in the owner's numpy array
    tm.put(right, tm.addr(right, 1000), pattern(3000, me, right))
    tm.put_nbi(right, tm.addr(right, 5000), pattern(100, me, right, 1))
    gexmk.nbi_wait(gexmk.EC_PUT)
    tm.barrier()
    assert (mem[1000:4000] == pattern(3000, left, me)).all(), "pvm put did not reach the array"
    assert (mem[5000:5100] == pattern(100, left, me, 1)).all()
    assert not mem[:1000].any() and not mem[4000:5000].any() and not mem[5100:].any()
    # get: owner writes locally, peer reads it over pvm
    mem[6000:7000] = pattern(1000, me, 0x6E7)
    tm.barrier()
    got = np.zeros(1000, np.uint8)
    tm.get(got, right, tm.addr(right, 6000))
    assert (got == pattern(1000, right, 0x6E7)).all(), "pvm get returned wrong data"
    assert tm.get_val(right, tm.addr(right, 6000), 2) == int.from_bytes(
        pattern(1000, right, 0x6E7)[:2].tobytes(), sys.byteorder)
    expect_raises(E.BoundsError, tm.get, got, right, tm.addr(right, 7500))
    # remote atomics on client memory of another process are not possible
    ad = tm.ad_create(gexmk.DT_I64, gexmk.OP_FADD | gexmk.OP_SET)
    e = expect_raises(E.UnsupportedError, ad.op, right, tm.addr(right, 0), gexmk.OP_FADD, 1)
    assert "atomic" in str(e), str(e)
    if n > 1:
        expect_raises(E.UnsupportedError, ad.op_nb, right, tm.addr(right, 8), gexmk.OP_SET, 5)
    # ...but on this process's own client segment they are loopback and work
    assert ad.op(me, tm.addr(me, 16), gexmk.OP_FADD, 5) == 0
    assert int(np.frombuffer(mem[16:24].tobytes(), np.int64)[0]) == 5
    tm.barrier()
    c.finalize()
    '''
    run(tmp_path, src, n, transport).check()


@pytest.mark.timeout(90)
@NRANKS
@TRANSPORTS
def test_four_endpoints_with_different_sizes(tmp_path, n, transport):
    src = r'''
    c = gexmk.init()
    tm = c.tm
    me, n = tm.rank, tm.size
    NEP = 4
    def size_of(rank, ep):
        return 1024 * (ep + 1) + 64 * rank + 8
    eps = [c.ep(0)] + [c.ep_create() for _ in range(NEP - 1)]
    assert [e.index for e in eps] == list(range(NEP))
    segs = []
    for i, e in enumerate(eps):
        s = c.segment_create(size_of(me, i))
        e.bind_segment(s)
        segs.append(s)
    tm.publish_bound_segment(eps)
    ep0 = c.ep(0)
    for i in range(NEP):
        p = ep0.pair(i)
        for r in range(n):
            q = p.query_bound_segment_nb(r).wait()
            assert q.size == size_of(r, i), (r, i, q)
            assert p.transport(r) == ("self" if r == me else peer_transport()), (r, i, p.transport(r))
            end = q.address + q.size
            # write a tag at the very end of every (rank, EP) segment
            p.put(r, end - 8, np.array([1000 * me + 10 * i + r], np.int64))
            expect_raises(E.BoundsError, p.put, r, end - 7, np.zeros(1, np.int64))
    tm.barrier()
    # per-writer regions: writer w puts its tag at offset 8*w of every (rank, EP) segment
    for i in range(NEP):
        p = ep0.pair(i)
        for r in range(n):
            p.put_val(r, p.addr(r, 8 * me), 1000 * me + 10 * i + r)
    tm.barrier()
    for i, s in enumerate(segs):
        got = np.frombuffer(np.asarray(s), np.int64)
        assert list(got[:n]) == [1000 * w + 10 * i + me for w in range(n)], (i, list(got[:n]))
        assert int(got[-1]) in [1000 * w + 10 * i + me for w in range(n)]
    c.finalize()
    '''
    run(tmp_path, src, n, transport).check()


@pytest.mark.timeout(60)
@TRANSPORTS
def test_access_to_destroyed_segment_before_republication(tmp_path, transport):
    """The owner destroys its published segment and does not republish yet.
    A peer's stale access must not crash anybody: over 'nbrhd' it lands in the
    peer's own mapping (documented); over 'pvm' the owner's memory is gone and
    the peer gets a gexmk error (not a bare OSError)."""
    src = r'''
    c = gexmk.init()
    tm = c.tm
    me, n = tm.rank, tm.size
    seg = c.segment_attach(1 << 16)
    tm.barrier()
    if me == 1:
        seg.destroy()
        assert c.ep(0).segment is None
    tm.barrier()
    if me == 0:
        addr = tm.addr(1, 0)                   # still the published (stale) range
        if peer_transport() == "nbrhd":
            tm.put(1, addr, b"x" * 64)
            assert tm.get_val(1, addr, 1) == ord("x")
        else:
            try:
                tm.put(1, addr, b"x" * 64)
            except gexmk.GexmkError as e:
                log(f"stale put: {type(e).__name__}: {e}")
            except OSError as e:
                raise AssertionError(f"stale put over pvm raised a bare {type(e).__name__}, "
                                     f"not a gexmk error: {e}")
            else:
                raise AssertionError("stale put over pvm into unmapped memory succeeded")
    tm.barrier()
    if me == 1:
        seg2 = c.segment_create(4096)
        c.ep(0).bind_segment(seg2)
        tm.publish_bound_segment([c.ep(0)])
    else:
        tm.publish_bound_segment([])
    if me == 0:
        tm.put_val(1, tm.addr(1, 0), 99)
    tm.barrier()
    if me == 1:
        assert int(np.frombuffer(np.asarray(seg2), np.int64)[0]) == 99
    c.finalize()
    '''
    run(tmp_path, src, 2, transport).check()


@pytest.mark.timeout(60)
def test_atomics_refused_under_forced_pvm_say_why(tmp_path):
    """GEXMK_TRANSPORT=pvm leaves peers' library-allocated segments unmapped, so
    remote atomics are refused; the error must name the possible cause (the
    forced transport), not only blame a client-allocated segment."""
    src = r'''
    c = gexmk.init()
    tm = c.tm
    me, n = tm.rank, tm.size
    seg = c.segment_attach(4096)
    assert seg.shareable                        # library-allocated
    ad = tm.ad_create(gexmk.DT_I64, gexmk.OP_FADD)
    peer = 1 - me
    e = expect_raises(E.UnsupportedError, ad.op, peer, tm.addr(peer, 0), gexmk.OP_FADD, 1)
    log(f"atomic refused: {e}")
    assert ad.op(me, tm.addr(me, 0), gexmk.OP_FADD, 1) == 0     # loopback still works
    assert "GEXMK_TRANSPORT" in str(e), f"message does not name the cause: {e}"
    c.finalize()
    '''
    run(tmp_path, src, 2, "pvm").check()


@pytest.mark.timeout(60)
def test_destroyed_client_segment_memory_is_not_written_by_stale_puts(tmp_path):
    """unbind_segment/destroy promise that peers' stale accesses (before the
    next publication) never land in freed memory.  For a client-allocated
    segment reached over 'pvm' the owner's buffer is released at destroy; if
    the allocator hands the same memory to unrelated data, a stale put from a
    peer must not overwrite it (it may raise, or land in memory kept alive)."""
    src = r'''
    import ctypes
    c = gexmk.init()
    tm = c.tm
    me = tm.rank
    if me == 1:
        buf = bytearray(4096)
        seg = c.segment_create(buffer=buf)
        c.ep(0).bind_segment(seg)
        tm.publish_bound_segment([c.ep(0)])
        old = seg.address
        seg.destroy()
        del seg, buf
        other = bytearray(4096)                # unrelated data, maybe at the freed address
        addr = ctypes.addressof((ctypes.c_char * 4096).from_buffer(other))
        log(f"the freed segment memory was reused: {addr == old}")
        tm.barrier()                           # the peer's stale put happens here
        tm.barrier()
        assert other[:16] == bytes(16), \
            f"a peer's stale put overwrote unrelated memory of this process: {bytes(other[:16])!r}"
    else:
        tm.publish_bound_segment([])
        tm.barrier()
        try:
            tm.put(1, tm.addr(1, 0), b"STALE-PUT-BYTES!")
        except gexmk.GexmkError as e:
            log(f"stale put refused: {type(e).__name__}: {e}")
        tm.barrier()
    c.finalize()
    '''
    run(tmp_path, src, 2).check()


# -- publication is one collective (issue 23) ---------------------------------------
#
# publish_bound_segment returns on a member as soon as the allgather of what is
# published is done; other members may still be applying it (mapping a memfd,
# fetching an fd-server offer, registering keys).  What an owner handed out must
# outlive an unbind or destroy right after it returns, until every member is
# known to have applied it: the team's next collective.  LATE makes one rank
# apply every publication a second after its allgather returned, so that the
# owner's unbind/destroy always comes first.

LATE = r'''
    def late_applier(c, late, during=None):
        """Make this rank apply publications (and leave other allgathers) 1 s
        late; ``during`` (called in a loop for that second, the first time
        only): what it does meanwhile, through the routes it has not
        changed yet."""
        if not late:
            return
        ex = c.bootstrap.exchange
        todo = [during]
        def slow(*a, **kw):
            out = ex(*a, **kw)
            end = time.monotonic() + 1.0
            fn, todo[0] = todo[0], None
            while fn is not None and time.monotonic() < end:
                fn()
            time.sleep(max(0.0, end - time.monotonic()))
            return out
        c.bootstrap.exchange = slow
'''


@pytest.mark.timeout(90)
@pytest.mark.parametrize("before", ["nothing", "barrier_nb"])
def test_destroy_right_after_publish_keeps_memfd_for_late_peer(tmp_path, before):
    """The owner destroys its segment (and makes another, whose memfd may take
    the freed descriptor's number) as soon as publish returns; a peer that
    applies the publication later still maps the published memory ('nbrhd',
    not a failed publish or a fallback to 'pvm'), and its writes land in that
    mapping.  The memfd is released at the team's next barrier -- not at one
    entered before the publication (an NB barrier still pending)."""
    src = LATE + r'''
    c = gexmk.init()
    tm = c.tm
    me = tm.rank
    late_applier(c, me == 1)
    ev = tm.barrier_nb() if os.environ["BEFORE"] == "barrier_nb" else None
    if me == 0:
        seg = c.segment_create(1 << 16)
        c.ep(0).bind_segment(seg)
        tm.publish_bound_segment([c.ep(0)])
        seg.destroy()                           # rank 1 has not applied it yet
        other = c.segment_create(1 << 16)       # may reuse the memfd's number
        if ev is not None:
            ev.wait()                           # entered before the publication: settles nothing
    else:
        tm.publish_bound_segment([])
        if ev is not None:
            ev.wait()
        assert tm.transport(0) == "nbrhd", tm.transport(0)
        tm.put(0, tm.addr(0, 64), b"late mapper")
        back = bytearray(11)
        tm.get(back, 0, tm.addr(0, 64))
        assert bytes(back) == b"late mapper", bytes(back)
    tm.barrier()
    if me == 0:
        assert not seg.shareable, "the destroyed segment's memfd outlived the next barrier"
        other.destroy()
    c.finalize()
    '''
    mp_util.run_job(tmp_path, src, 2, env={"BEFORE": before}).check()


@pytest.mark.timeout(90)
def test_unbind_right_after_publish_keeps_zone_offer_for_late_peer(tmp_path):
    """A landing zone travels through the fd server: an owner that unbinds
    right after publishing keeps the offer until every peer fetched it, so a
    late peer's publish succeeds and its operations say the segment is gone
    (SegmentError) -- as for a peer that mapped the zone before the unbind."""
    src = LATE + r'''
    c = gexmk.init()
    tm = c.tm
    me = tm.rank
    late_applier(c, me == 1)
    if me == 0:
        seg = c.segment_create(1 << 16)
        c.ep(0).bind_segment(seg)
        tm.publish_bound_segment([c.ep(0)])
        c.ep(0).unbind_segment()                # rank 1 has not fetched the zone yet
    else:
        tm.publish_bound_segment([])
        assert tm.transport(0) == "nbrhd-landed", tm.transport(0)
        e = expect_raises(E.SegmentError, tm.put, 0, tm.addr(0, 0), b"x" * 8)
        assert "zone is closed" in str(e), e
    tm.barrier()
    c.finalize()
    '''
    mp_util.run_job(tmp_path, src, 2, env={"GEXMK_NBRHD_STAGE": "all"}).check()


@pytest.mark.timeout(120)
def test_retired_network_key_kept_until_every_peer_applied(tmp_path):
    """Over ofi an unbound segment's key stays registered (retired) for peers
    that were given it until they applied a later publication: a peer that
    has not applied the republication yet (the owner has returned from it)
    still puts under the old key -- those puts land in the retired
    registration, never in the unbound segment, and break nothing (an
    unknown key takes the pair's connection down over tcp;ofi_rxm).  The
    retired key is released by the team's next barrier."""
    src = LATE + r'''
    c = gexmk.init()
    tm = c.tm
    me = tm.rank
    seg = c.segment_attach(1 << 16)
    old = tm.addr(0, 0)
    tm.barrier()
    stale = [0]
    def stale_put():
        if stale[0] == 0:                       # in flight until the next barrier
            tm.put_nbi(0, old + 16, b"stale-nb")
        tm.put(0, old + 8, b"stale!!!")         # the route still holds the old key
        stale[0] += 1
    late_applier(c, me == 1, stale_put)
    ctx = c.ep(0).contexts["ofi"]
    if me == 0:
        c.ep(0).unbind_segment()
        assert ctx.retired >= 1, ctx.retired
        seg2 = c.segment_create(1 << 16)
        c.ep(0).bind_segment(seg2)
        tm.publish_bound_segment([c.ep(0)])
    else:
        tm.publish_bound_segment([])
        assert stale[0] > 0
        log(f"{stale[0]} puts under the retired key while applying late")
        tm.put(0, tm.addr(0, 8), b"fresh!!!")
    tm.barrier()
    if me == 0:
        assert ctx.retired == 0, f"the old key outlived the next barrier: {ctx.retired}"
        assert bytes(np.asarray(seg2)[8:16]) == b"fresh!!!"
        assert not np.asarray(seg)[8:24].any(), "a stale put reached the unbound segment"
    c.finalize()
    '''
    mp_util.run_job(tmp_path, src, 2, env={"GEXMK_TRANSPORT": "ofi"}).check()
