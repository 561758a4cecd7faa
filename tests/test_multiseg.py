"""Several segments per process, host memory: a second segment bound to an
endpoint of its own, published with ``client.segment_attach(size, ep=ep)``
and addressed through ``client.tm.create_for(ep)`` (GASNet-EX gex_TM_Create
with endpoint locations).  At 2 and 4 ranks, on the default transports and
over ofi: puts, gets, atomics and a barrier through the new team land in the
second segment and never in the first; endpoint indices may differ between
processes.  Also: ad_create is collective and names members that disagree."""
import pytest

try:
    from . import mp_util
except ImportError:
    import mp_util

WORKER = r'''
with gexmk.init() as c:
    tm = c.tm
    me, n = tm.rank, tm.size
    seg0 = c.segment_attach(4096)
    if me % 2:                      # indices of the second endpoint differ between processes
        c.ep_create()
    ep = c.ep_create()
    seg2 = c.segment_attach(1 << 16, ep=ep)
    ofi = c.transports.get("ofi") if os.environ.get("GEXMK_TRANSPORT") == "ofi" else None
    touched = ofi.connections["touched"] if ofi is not None else 0
    tm2 = c.tm.create_for(ep)
    assert (tm2.rank, tm2.size) == (me, n), (tm2.rank, tm2.size)
    if ofi is not None:     # the new endpoint's routes were connected when the team made them
        per_peer = 2 if ofi.split_endpoints else 1
        assert ofi.connections["touched"] - touched == per_peer * (n - 1), ofi.connections
        assert ofi.connections["failed"] == 0, ofi.connections
    assert tm2.ep is ep
    assert tm2.ep_location(me) == (c.rank, ep.index)
    right, left = (me + 1) % n, (me - 1) % n
    # puts into the right neighbour's second segment, gets from it
    tm2.put(right, tm2.addr(right, 8 * me), np.full(1, 1000 + me, np.int64))
    tm2.put_val(right, tm2.addr(right, 4096 + 8 * me), 2000 + me, 8)
    ad = tm2.ad_create(gexmk.DT_I64, gexmk.OP_FADD | gexmk.OP_GET)
    old = ad.op(0, tm2.addr(0, 8192), gexmk.OP_FADD, me + 1)
    assert 0 <= old < n * (n + 1) // 2, old
    tm2.barrier()
    mine = seg2.view(np.int64)
    assert mine[left] == 1000 + left, mine[:n]
    assert mine[4096 // 8 + left] == 2000 + left, mine[512:512 + n]
    got = np.zeros(1, np.int64)
    tm2.get(got, right, tm2.addr(right, 8 * me))
    assert got[0] == 1000 + me, got
    assert ad.op(0, tm2.addr(0, 8192), gexmk.OP_GET) == n * (n + 1) // 2
    assert tm2.get_val(left, tm2.addr(left, 8 * ((left - 1) % n)), 8) == 1000 + (left - 1) % n
    # the first segment, through the primordial team, saw none of it
    assert not seg0.view(np.uint8).any()
    assert tm.addr(right, 0) != tm2.addr(right, 0)
    # mistakes name what to do
    e = expect_raises(E.StateError, c.segment_attach, 64, ep=ep)
    assert "already has a bound segment" in str(e), e
    e = expect_raises(E.StateError, c.segment_attach, 64)
    assert "ep=ep" in str(e) and "create_for" in str(e), e
    expect_raises(TypeError, c.segment_attach, 64, ep=1)
    tm2.barrier()
'''

CREATE_WORKER = r'''
with gexmk.init() as c:
    c.segment_attach(4096)
    if c.rank == 1:
        c.ep_create()               # so this process's next endpoint has another index
    ep = c.ep_create()
    c.segment_attach(4096, ep=ep)
    # the obvious spelling names each process's endpoint by *this* process's index:
    # different lists on different processes, refused on every one of them
    e = expect_raises(E.ArgumentError, c.tm.create, [(j, ep.index) for j in range(c.size)])
    assert "different member list" in str(e) and "create_for" in str(e), e
    tm2 = c.tm.create_for(ep)
    tm2.put_val(1 - tm2.rank, tm2.addr(1 - tm2.rank, 0), 7, 8)
    tm2.barrier()
    c.tm.barrier()
'''

AD_WORKER = r'''
with gexmk.init() as c:
    c.segment_attach(4096)
    tm = c.tm
    ad = tm.ad_create(gexmk.DT_I64, gexmk.OP_FADD)      # agreeing: fine
    dt = gexmk.DT_DBL if tm.rank == 1 else gexmk.DT_I64
    e = expect_raises(E.ArgumentError, tm.ad_create, dt, gexmk.OP_FADD)
    other = 1 - tm.rank
    assert str(e).startswith("ad_create is collective and the members disagree"), e
    assert f"team rank {other} created ({'DBL' if other == 1 else 'I64'}, OP_FADD)" in str(e), e
    tm.barrier()
'''


@pytest.mark.parametrize("transport", ["auto", "ofi"])
@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.timeout(120)
def test_second_segment_through_its_team(tmp_path, n, transport):
    env = {"GEXMK_TIMEOUT": 30}
    if transport == "ofi":
        pytest.importorskip("gexmk.transports.ofi", reason="gexmk was built without the ofi transport")
        env.update({"GEXMK_TRANSPORT": "ofi", "GEXMK_OFI_PROVIDER": "tcp;ofi_rxm", "FI_PROVIDER": None})
    else:
        env["GEXMK_TRANSPORT"] = None
    mp_util.run_job(tmp_path, WORKER, n, launcher_timeout=90, env=env).check()


@pytest.mark.timeout(60)
def test_ad_create_members_must_agree(tmp_path):
    mp_util.run_job(tmp_path, AD_WORKER, 2, launcher_timeout=40, env={"GEXMK_TIMEOUT": 20}).check()


@pytest.mark.timeout(60)
def test_create_refuses_lists_naming_other_endpoints(tmp_path):
    mp_util.run_job(tmp_path, CREATE_WORKER, 2, launcher_timeout=40, env={"GEXMK_TIMEOUT": 20}).check()
