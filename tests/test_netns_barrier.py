"""Hierarchical barriers (issue 10): a job of 4 ranks, 2 in each of two network
namespaces joined by a veth pair (tests/netns_util.py), so two "nodes" of two
ranks each.

A team spanning nodes with several members on a node gathers each node on
shared memory at its leader, runs the dissemination among the leaders over
the network (ofi tcp;ofi_rxm here) and releases the node
(core.src/coll.pxi).  Checked here:

1. The shape: world, dup and a reversed team are hierarchical (leaders are
   the lowest team rank of each node), a split by node or across nodes is
   flat.  Many barriers, blocking and NB (test() polling and wait()), with
   random delays: every rank's puts made before a barrier are seen by every
   rank after it, on the world team, a reversed team, and a team of
   non-primordial endpoints.  Collectives on the hierarchical team still give
   numpy's answers.  The hierarchical barrier sends fewer packets over the
   veth than the flat one (GEXMK_COLL_HIER=0) in the same job.  Again with
   peers of a node over ofi as well (the arrivals' network path).
2. A rank that skips a barrier: every other rank times out, and the ranks
   that wait on it directly (its leader, or its members and the other
   leader) name it; the team's barriers then refuse to run.

Needs root and iproute2; skips without them.  Every job has a launcher
timeout, and the namespaces (and any process left in them) are removed.
"""
import pytest

try:
    from . import mp_util, netns_util
    from .test_netns import run_launcher, wait_gone, need_tcp_provider
except ImportError:
    import mp_util
    import netns_util
    from test_netns import run_launcher, wait_gone, need_tcp_provider


@pytest.fixture(autouse=True)
def nothing_left(tmp_path):
    yield
    left = wait_gone(str(tmp_path))
    assert not left, f"processes left running: {left}"


@pytest.fixture
def two_nodes():
    with netns_util.two_nodes() as nodes:
        yield nodes
        for i in (0, 1):
            assert not nodes.pids(i), f"processes left in {nodes.netns[i]}: {nodes.pids(i)}"
    assert not netns_util.namespaces_named(nodes.base), "namespaces were not deleted"


def run_four(tmp_path, nodes, source, env, timeout):
    """Run ``source`` as 4 ranks, ranks 0-1 in namespace 0 and 2-3 in namespace 1."""
    need_tcp_provider()
    script = mp_util.write_worker(tmp_path, source)
    return run_launcher(
        tmp_path, "-n", 4, "--timeout", timeout - 20, "--bootstrap-listen", nodes.addr[0],
        "--rank-prefix", nodes.rank_prefix_per_node(2), script,
        prefix=nodes.exec_prefix(0), timeout=timeout,
        env={"GEXMK_OFI_PROVIDER": "tcp;ofi_rxm", "GX_IFACES": ",".join(nodes.iface), **env})


# ---- 1. shape, ordering, NB, other teams, traffic ----------------------------------------

WORKER = r'''
import random
c = gexmk.init()
tm = c.tm
n, me = tm.size, tm.rank
assert n == 4 and c.nodes() == [0, 0, 1, 1], c.nodes()
seg = c.segment_attach(4096)
words = np.asarray(seg).view(np.int64)
near = "ofi" if os.environ.get("GEXMK_TRANSPORT") == "ofi" else "nbrhd"
assert tm.transport(me ^ 1) == near and tm.transport(me ^ 2) == "ofi", \
    (tm.transport(me ^ 1), tm.transport(me ^ 2))
rng = random.Random(1000 + me)
ITERS = int(os.environ["GX_ITERS"])


def orders(t, w, iters, tag):
    """Each iteration every member puts (tag, it) into its word of area it % 2 of
    every member, after a random delay on some iterations, then enters one
    barrier (blocking, NB polled with test(), NB waited); after it, every
    member's word must be there.  Areas alternate, so one barrier per
    iteration is enough: area it % 2 is written again only after the next
    barrier, which every member enters after reading it."""
    m = t.size
    for it in range(iters):
        if rng.random() < 0.3:
            time.sleep(rng.random() * 0.002)
        v = tag * 1_000_000 + it
        for r in range(m):
            t.put_val(r, t.addr(r, 8 * (m * (it % 2) + t.rank)), v)
        kind = it % 3
        if kind == 0:
            t.barrier()
        elif kind == 1:
            ev = t.barrier_nb()
            while not ev.test():
                pass
        else:
            t.barrier_nb().wait()
        got = list(w[m * (it % 2):m * (it % 2) + m])
        assert got == [v] * m, f"{tag} iteration {it}: saw {got}, want {v} from every member"


tm.barrier()
shape = tm._barrier_shape()
want_role = "leader" if me % 2 == 0 else "member"
assert shape["role"] == want_role and shape["node_members"] == [me & 2, (me & 2) + 1], shape
assert shape["rounds"] == (1 if me % 2 == 0 else 0), shape
orders(tm, words, ITERS, 1)

# teams: dup and a reversed team are hierarchical too; split by node (one node)
# and across nodes (one member per node) are flat
d = tm.dup()
rev = tm.create([3, 2, 1, 0])
by_node = tm.split(me // 2)
across = tm.split(me % 2)
for t in (d, rev, by_node, across):
    t.barrier()
assert d._barrier_shape() == shape, d._barrier_shape()
rs = rev._barrier_shape()
assert rs["role"] == ("leader" if rev.rank % 2 == 0 else "member"), rs
assert rs["node_members"] == [rev.rank & 2, (rev.rank & 2) + 1], rs
assert by_node._barrier_shape()["role"] == "flat" and across._barrier_shape()["role"] == "flat"
# the reversed team's ordering, its own words (after the world's two areas)
rw = np.asarray(seg)[64:].view(np.int64)
for it in range(ITERS // 4):
    if rng.random() < 0.3:
        time.sleep(rng.random() * 0.002)
    v = 2_000_000 + it
    for r in range(4):
        rev.put_val(r, rev.addr(r, 64 + 8 * (4 * (it % 2) + rev.rank)), v)
    (rev.barrier if it % 2 else (lambda: rev.barrier_nb().wait()))()
    got = list(rw[4 * (it % 2):4 * (it % 2) + 4])
    assert got == [v] * 4, f"reversed team iteration {it}: {got}"
for t in (by_node, across):
    for _ in range(20):
        t.barrier()

# a team of non-primordial endpoints (EP 1 of every process) is hierarchical too
ep1 = c.ep_create()
seg1 = c.segment_create(4096)
ep1.bind_segment(seg1)
t1 = tm.create([(j, 1) for j in range(4)])
t1.publish_bound_segment([ep1])
t1.barrier()
assert t1._barrier_shape()["role"] == want_role, t1._barrier_shape()
orders(t1, np.asarray(seg1).view(np.int64), ITERS // 4, 3)

# collectives over the hierarchical team still agree with numpy
a = np.arange(1000, dtype=np.float64) * (me + 1)
r = np.zeros_like(a)
tm.allreduce(a, r, "sum")
assert np.array_equal(r, np.arange(1000) * 10.0), r[:4]
b = np.arange(37, dtype=np.int32) + 7 * me
tm.bcast(b, 3)
assert np.array_equal(b, np.arange(37, dtype=np.int32) + 21), b[:4]
# chunked (several scratch halves) and split (reduce-scatter + allgather) over
# the network, blocking beside NB
big = np.arange(200_000, dtype=np.float64) * (me + 1)
rb = np.zeros_like(big)
(tm.allreduce if me % 2 else lambda s, r, o: tm.allreduce_nb(s, r, o).wait())(big, rb, "sum")
assert np.array_equal(rb, np.arange(200_000) * 10.0), rb[:4]
g = np.zeros(4 * 5, np.int64)
tm.allgather(np.full(5, me, np.int64), g)
assert np.array_equal(g, np.repeat(np.arange(4), 5)), g

# traffic: on the veth, the hierarchical barrier sends a third of the flat one's
# messages (2 per barrier across the pair against 6); the flat team is made with
# GEXMK_COLL_HIER=0 at its first collective
def tx_packets():
    iface = os.environ["GX_IFACES"].split(",")[me // 2]
    with open("/proc/self/net/dev") as f:      # this process's network namespace
        for line in f:
            name, _, rest = line.partition(":")
            if name.strip() == iface:
                return int(rest.split()[9])
    raise AssertionError(f"{iface} not in /proc/self/net/dev")

os.environ["GEXMK_COLL_HIER"] = "0"
flat = tm.dup()
flat.barrier()
del os.environ["GEXMK_COLL_HIER"]
assert flat._barrier_shape()["role"] == "flat", flat._barrier_shape()
sent = {}
for name, t in (("hier", tm), ("flat", flat), ("hier2", d)):
    t.barrier()
    t.barrier()
    p0 = tx_packets()
    for _ in range(300):
        t.barrier()
    sent[name] = tx_packets() - p0
    t.barrier()
if me == 0:
    log("veth tx packets over 300 barriers:", sent)
    hier = min(sent["hier"], sent["hier2"])
    assert hier <= 0.7 * sent["flat"], f"hierarchical barrier sent {sent}, not fewer than flat"
tm.barrier()
print("HBAR-OK", me, flush=True)
c.finalize()
'''


@pytest.mark.timeout(240)
@pytest.mark.parametrize("near", ["nbrhd", "ofi"])
def test_hierarchical_barrier_two_nodes(tmp_path, two_nodes, near):
    """``near="ofi"``: peers on the same node over ofi too (GEXMK_TRANSPORT=ofi),
    so gather and release go through the network path's stores."""
    env = {"GEXMK_TIMEOUT": 60, "GX_ITERS": 400 if near == "nbrhd" else 120}
    if near == "ofi":
        env["GEXMK_TRANSPORT"] = "ofi"
    res = run_four(tmp_path, two_nodes, WORKER, env, timeout=220)
    res.check()
    assert res.stdout.count("HBAR-OK") == 4, res.report()


# ---- 2. a rank that skips a barrier ----------------------------------------------------

SKIP = r'''
c = gexmk.init()
tm = c.tm
me = tm.rank
skip = int(os.environ["GX_SKIP"])
for _ in range(3):
    tm.barrier()
tm.barrier_nb().wait()
if me == skip:
    time.sleep(4.0)      # the others' waits expire first; then finalize's own sync
else:
    e = expect_raises(E.TimeoutError, tm.barrier, timeout=2)
    sys.stdout.write(f"ERR {me}: {e}\n")     # one write: lines of ranks never interleave
    sys.stdout.flush()
    assert "barrier #5 of team tm0" in str(e), e
    e2 = expect_raises(E.StateError, tm.barrier_nb)
    assert "can no longer be matched" in str(e2), e2
c.finalize()
'''


@pytest.mark.timeout(120)
@pytest.mark.parametrize("skip", [3, 2], ids=["member-skips", "leader-skips"])
def test_skipped_barrier_names_the_rank(tmp_path, two_nodes, skip):
    res = run_four(tmp_path, two_nodes, SKIP, {"GEXMK_TIMEOUT": 30, "GX_SKIP": skip},
                   timeout=100)
    res.check()
    errs = {}
    for line in res.stdout.splitlines():
        if line.startswith("ERR "):
            r, _, msg = line[4:].partition(": ")
            errs[int(r)] = msg
    assert sorted(errs) == sorted({0, 1, 2, 3} - {skip}), res.report()
    leader = skip & 2
    other_leader = 2 - leader
    if skip != leader:
        # a member skipped: its leader waited for it at the gather
        assert f"waiting for team rank {skip} of this node to arrive" in errs[leader], errs
        # the other node's member names its own leader, which waited across nodes
        assert "its node's leader" in errs[other_leader + 1], errs
    else:
        # a leader skipped: its member and the other leader waited for it
        assert f"waiting for team rank {skip}, its node's leader" in errs[skip + 1], errs
        assert f"(team rank {skip}, the leader, of this node never entered it)" in errs[skip + 1], \
            errs
        assert f"waiting for team rank {skip}, the leader of another node" in errs[other_leader], \
            errs
        # the other node's member: every member of its node arrived
        assert "every member of this node arrived" in errs[other_leader + 1], errs


# ---- 3. landing zones serve the processes of their node ------------------------------

LANDED = r'''
# issue 23: an nbrhd-landed zone has one ring per process of its node, by
# node-local index: ranks 2 and 3 (node 1) use rings 0 and 1 of each other's
# 2-ring zones, never ring 2 or 3 of a job-sized zone
c = gexmk.init()
tm = c.tm
me = tm.rank
mate = me ^ 1
seg = c.segment_attach(1 << 20)
assert tm.paths(mate)["rma"] == "nbrhd-landed", tm.paths(mate)
src = (np.arange(300000) * 7 + me).astype(np.uint8)
tm.put(mate, tm.addr(mate, 4096), src)
tm.barrier()
got = np.zeros_like(src)
tm.get(got, mate, tm.addr(mate, 4096))
assert np.array_equal(got, src), "landed get (of what this rank put there)"
assert np.array_equal(seg.view(np.uint8)[4096:4096 + src.size],
                      (np.arange(300000) * 7 + mate).astype(np.uint8)), "landed put"
tm.barrier()
print("LANDED-OK", me, flush=True)
c.finalize()
'''


@pytest.mark.timeout(150)
def test_landing_zone_rings_by_node_index(tmp_path, two_nodes):
    env = {"GEXMK_TIMEOUT": 60, "GEXMK_NBRHD_STAGE": "all", "GEXMK_NBRHD_STAGE_CHUNK": "64K"}
    res = run_four(tmp_path, two_nodes, LANDED, env, timeout=130)
    res.check()
    assert res.stdout.count("LANDED-OK") == 4, res.report()
