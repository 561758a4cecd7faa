"""Teams across processes: split, dup, create, rank translation, barriers on
subteams, TM-pairs refusing collectives, and RMA over a split team."""
import pytest

try:
    from . import mp_util
except ImportError:
    import mp_util

NRANKS = pytest.mark.parametrize("n", [2, 4])


@pytest.mark.timeout(90)
@NRANKS
def test_split_by_parity_with_reversed_key(tmp_path, n):
    src = r'''
    c = gexmk.init()
    tm = c.tm
    me, n = tm.rank, tm.size
    sub = tm.split(me % 2, key=-me)
    members = sorted((j for j in range(n) if j % 2 == me % 2), reverse=True)  # key=-rank
    assert sub.size == len(members), (sub.size, members)
    assert sub.rank == members.index(me), (sub.rank, members)
    for i, j in enumerate(members):
        assert sub.translate_rank_to_jobrank(i) == j
        assert sub.translate_jobrank_to_rank(j) == i
        assert sub.ep_location(i) == (j, 0)
    for j in range(n):
        if j % 2 != me % 2:
            assert sub.translate_jobrank_to_rank(j) is None, j
        # the primordial team is the identity
        assert tm.translate_jobrank_to_rank(j) == j and tm.translate_rank_to_jobrank(j) == j
    expect_raises(E.RankError, sub.translate_rank_to_jobrank, sub.size)
    expect_raises(E.RankError, sub.translate_rank_to_jobrank, -1)
    expect_raises(E.RankError, sub.translate_jobrank_to_rank, n)
    expect_raises(E.RankError, sub.translate_jobrank_to_rank, -1)
    sub.barrier()
    # a rank that passes color=None joins no team; the others still get theirs
    last = tm.split(None if me == n - 1 else 0, key=me)
    if me == n - 1:
        assert last is None
    else:
        assert last.size == n - 1 and last.rank == me
        last.barrier()
    # splitting a split team
    subsub = sub.split(0, key=sub.rank)
    assert subsub.size == sub.size and subsub.rank == sub.rank
    assert subsub.translate_rank_to_jobrank(subsub.rank) == me
    subsub.barrier()
    tm.barrier()
    c.finalize()
    '''
    mp_util.run_job(tmp_path, src, n).check()


@pytest.mark.timeout(90)
@NRANKS
def test_barriers_on_subteams_are_independent(tmp_path, n):
    src = r'''
    c = gexmk.init()
    tm = c.tm
    me, n = tm.rank, tm.size
    sub = tm.split(me % 2, key=me)
    # the two parity teams run different numbers of barriers: each counts its own
    for _ in range(5 if me % 2 == 0 else 2):
        sub.barrier()
    tm.barrier()
    # a subset team made by create: its barriers involve its members only
    sset = tm.create([n - 1, 0] if me in (0, n - 1) else None)
    if me in (0, n - 1):
        assert sset.size == 2 and sset.rank == (0 if me == n - 1 else 1)
        for _ in range(3):
            sset.barrier()
    else:
        assert sset is None
    tm.barrier()
    c.finalize()
    '''
    mp_util.run_job(tmp_path, src, n).check()


@pytest.mark.timeout(90)
@NRANKS
def test_dup_has_independent_barriers(tmp_path, n):
    src = r'''
    import threading
    c = gexmk.init()
    tm = c.tm
    me, n = tm.rank, tm.size
    seg = c.segment_attach(64)
    flag = np.frombuffer(np.asarray(seg), np.int64)
    d1, d2 = tm.dup(), tm.dup()
    for d in (d1, d2):
        assert (d.rank, d.size) == (tm.rank, tm.size)
        assert [d.ep_location(r) for r in range(n)] == [tm.ep_location(r) for r in range(n)]
        assert d.id != tm.id
    assert d1.id != d2.id
    # Rank 0 waits in d1's barrier (in a thread) while the others wait in tm's.
    # If the two teams shared barriers, the others would be released by rank 0's
    # d1 barrier before rank 0 raised their flag and entered tm's barrier.
    if me == 0:
        t = threading.Thread(target=d1.barrier)
        t.start()
        time.sleep(0.5)
        for r in range(1, n):
            tm.put_val(r, tm.addr(r, 0), 1)
        tm.barrier()
        t.join(30)
        assert not t.is_alive(), "d1.barrier never completed"
    else:
        tm.barrier()
        assert flag[0] == 1, "tm.barrier returned before rank 0 entered it"
        d1.barrier()
    # different numbers of barriers on the two dups, overlapped through threads
    errs = []
    def many(team, k):
        try:
            for _ in range(k):
                team.barrier()
        except BaseException as e:
            errs.append(e)
    ts = [threading.Thread(target=many, args=(d1, 4)), threading.Thread(target=many, args=(d2, 7))]
    if me % 2:
        ts.reverse()
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert not errs, errs
    assert not any(t.is_alive() for t in ts)
    tm.barrier()
    c.finalize()
    '''
    mp_util.run_job(tmp_path, src, n).check()


@pytest.mark.timeout(90)
@NRANKS
def test_create_with_member_lists(tmp_path, n):
    src = r'''
    c = gexmk.init()
    tm = c.tm
    me, n = tm.rank, tm.size
    seg0 = c.segment_attach(1024)
    # 1. a subset team from team ranks, in a chosen order; non-members pass None
    members = [n - 1, 0]
    sub = tm.create(members if me in members else None)
    if me in members:
        assert sub is not None and sub.size == 2 and sub.rank == members.index(me)
        for i, j in enumerate(members):
            assert sub.translate_rank_to_jobrank(i) == j and sub.translate_jobrank_to_rank(j) == i
        for j in range(1, n - 1):
            assert sub.translate_jobrank_to_rank(j) is None
        sub.barrier()
        other = 1 - sub.rank
        sub.put_val(other, sub.addr(other, 8), 4242 + me)
        sub.barrier()
        assert int(np.frombuffer(np.asarray(seg0), np.int64)[1]) == 4242 + members[other]
    else:
        assert sub is None, sub
    # 2. non-members passing the full list (not naming themselves) also get None
    sub2 = tm.create([0])
    if me == 0:
        assert sub2.size == 1 and sub2.rank == 0
        sub2.barrier()
    else:
        assert sub2 is None
    # 3. members given as (job rank, EP index): a team of every process's EP 1
    ep1 = c.ep_create()
    seg1 = c.segment_create(256)
    ep1.bind_segment(seg1)
    t1 = tm.create([(j, 1) for j in reversed(range(n))])
    assert t1.size == n and t1.rank == n - 1 - me
    assert t1.ep is ep1 and t1.ep_location(t1.rank) == (me, 1)
    t1.publish_bound_segment([ep1])
    right = (t1.rank + 1) % n
    t1.put_val(right, t1.addr(right, 0), 100 + me)
    t1.barrier()
    left_job = t1.translate_rank_to_jobrank((t1.rank - 1) % n)
    assert int(np.frombuffer(np.asarray(seg1), np.int64)[0]) == 100 + left_job
    # EP 0's segment was not touched by traffic over t1
    assert int(np.frombuffer(np.asarray(seg0), np.int64)[0]) == 0
    # 4. bad member lists are refused before any communication
    expect_raises(E.RankError, tm.create, [n])
    expect_raises(E.RankError, tm.create, [(n, 0)])
    expect_raises(ValueError, tm.create, [0, 0])
    expect_raises(TypeError, tm.create, ["zero"])
    tm.barrier()
    c.finalize()
    '''
    mp_util.run_job(tmp_path, src, n).check()


@pytest.mark.timeout(60)
def test_collectives_on_tm_pair_raise_state_error(tmp_path):
    src = r'''
    c = gexmk.init()
    tm = c.tm
    me, n = tm.rank, tm.size
    c.segment_attach(128)
    p = c.ep(0).pair(0)
    for name, call in [("barrier", lambda: p.barrier()),
                       ("publish_bound_segment", lambda: p.publish_bound_segment([c.ep(0)])),
                       ("publish nothing", lambda: p.publish_bound_segment([])),
                       ("split", lambda: p.split(0, 0)),
                       ("dup", lambda: p.dup()),
                       ("create", lambda: p.create([0]))]:
        e = expect_raises(E.StateError, call)
        assert "pair" in str(e), (name, str(e))
    # RMA on the pair still works after the refusals
    other = (me + 1) % n
    p.put_val(other, p.addr(other, 8 * me), 77)
    tm.barrier()
    assert p.get_val(me, p.addr(me, 8 * ((me - 1) % n))) == 77
    c.finalize()
    '''
    mp_util.run_job(tmp_path, src, 2).check()


@pytest.mark.timeout(90)
@NRANKS
@pytest.mark.parametrize("transport", ["auto", "pvm"])
def test_rma_ring_over_split_team(tmp_path, n, transport):
    src = r'''
    c = gexmk.init()
    tm = c.tm
    me, n = tm.rank, tm.size
    seg = c.segment_attach(4096)
    arr = np.asarray(seg)
    sub = tm.split(me % 2, key=-me)
    k, m = sub.rank, sub.size
    right, left = (k + 1) % m, (k - 1) % m
    jr_right, jr_left = sub.translate_rank_to_jobrank(right), sub.translate_rank_to_jobrank(left)
    # sub ranks address the same published segments as the job ranks they stand for
    assert sub.addr(right, 0) == tm.addr(jr_right, 0)
    assert sub.transport(right) == ("self" if jr_right == me else peer_transport())
    sub.put(right, sub.addr(right, 1024), pattern(512, me, jr_right))
    ev = sub.put_nb(right, sub.addr(right, 2048), pattern(64, me, jr_right, 1))
    ev.wait()
    sub.barrier()
    assert (arr[1024:1536] == pattern(512, jr_left, me)).all()
    assert (arr[2048:2112] == pattern(64, jr_left, me, 1)).all()
    got = np.zeros(512, np.uint8)
    sub.get(got, left, sub.addr(left, 1024))
    want_src = sub.translate_rank_to_jobrank((left - 1) % m)
    assert (got == pattern(512, want_src, jr_left)).all()
    # the other parity's processes are not members: out of range in sub
    expect_raises(E.RankError, sub.put_val, m, tm.addr(me, 0), 1)
    # atomics over the split team: everyone increments sub rank 0's counter
    # (under GEXMK_TRANSPORT=pvm nothing is mapped and remote atomics are refused)
    ad = sub.ad_create(gexmk.DT_I64, gexmk.OP_FADD | gexmk.OP_GET)
    if peer_transport() == "nbrhd" or k == 0:
        ad.op(0, sub.addr(0, 8), gexmk.OP_FADD, me + 1)
    else:
        expect_raises(E.UnsupportedError, ad.op, 0, sub.addr(0, 8), gexmk.OP_FADD, me + 1)
    sub.barrier()
    if peer_transport() == "nbrhd":
        total = sum(j + 1 for j in range(n) if j % 2 == me % 2)
    else:
        total = sub.translate_rank_to_jobrank(0) + 1
    if peer_transport() == "nbrhd" or k == 0:
        assert ad.op(0, sub.addr(0, 8), gexmk.OP_GET) == total
    sub.barrier()
    tm.barrier()
    c.finalize()
    '''
    mp_util.run_job(tmp_path, src, n, env={"GEXMK_TRANSPORT": transport}).check()
