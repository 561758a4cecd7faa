"""Connections over ofi are set up at publication (GEXMK_OFI_CONNECT=eager,
the default), so the first operation to a peer is not a connection set-up.

Evidence without timing or strace: on tcp;ofi_rxm each connection is a TCP
socket of the process, so the number of ESTABLISHED sockets the process owns
(/proc/self/fd against /proc/self/net/tcp*) must not change across the first
get, put and atomic to every peer after publication.  With
GEXMK_OFI_CONNECT=lazy the same count must grow (so the check can fail).  The
transport's ``connections`` record says how many (endpoint, peer) pairs were
touched.
"""
import pytest

try:
    from . import mp_util
    from .test_ofi import need, ofi_env
except ImportError:
    import mp_util
    from test_ofi import need, ofi_env

pytest.importorskip("gexmk.transports.ofi", reason="gexmk was built without the ofi transport")

PROVIDER = "tcp;ofi_rxm"

#: ESTABLISHED TCP sockets the worker process owns (prepended to workers here and
#: in test_ofi_peer_cap.py)
TCP_ESTABLISHED = r'''
def tcp_established():
    """ESTABLISHED TCP sockets owned by this process."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    n = 0
    for f in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            rows = open(f).read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            p = row.split()
            if p[3] == "01" and p[9] in inodes:
                n += 1
    return n
'''

WORKER = TCP_ESTABLISHED + r'''
EAGER = os.environ.get("GEXMK_OFI_CONNECT", "eager") == "eager"
CAP = int(os.environ.get("GEXMK_OFI_CONNECT_MAX") or 32)

with gexmk.init() as c:
    ofi = c.transports["ofi"]
    assert ofi.provider == "tcp;ofi_rxm", ofi.provider
    seg = c.segment_attach(1 << 16)
    tm = c.tm
    ad = tm.ad_create(gexmk.DT_I64, gexmk.OP_FADD)
    peers = [r for r in range(tm.size) if r != tm.rank]
    per_peer = 2 if ofi.split_endpoints else 1          # RMA endpoint (+ atomics endpoint)
    st = dict(ofi.connections)
    log(st)
    before = tcp_established()
    buf = np.zeros(8, np.uint8)
    for r in peers:                    # the first operations to every peer
        tm.get(buf, r, tm.addr(r, 0))
        tm.put(r, tm.addr(r, 8 + 8 * tm.rank), np.full(8, tm.rank, np.uint8))
        ad.op(r, tm.addr(r, 4096), gexmk.OP_FADD, 1)
    after = tcp_established()
    log("tcp sockets before", before, "after", after)
    if EAGER and CAP >= len(peers):
        assert st["mode"] == "eager" and st["failed"] == 0 and st["capped"] == 0, st
        assert st["touched"] == per_peer * len(peers), (st, per_peer)
        assert before >= per_peer * len(peers), before
        assert after == before, ("the first operations opened connections", before, after)
    elif EAGER:
        # GEXMK_OFI_CONNECT_MAX: the nearest CAP peers up front, the rest on first use
        # (the sync endpoint's routes count too: at least those of endpoint 0)
        assert st["mode"] == "eager" and st["failed"] == 0, st
        assert st["capped"] >= per_peer * (len(peers) - CAP), st
        assert st["touched"] <= 2 * per_peer * CAP, st
        # (socket counts prove nothing here: peers' own connections to this
        # process, and the barriers', come and go on their schedule)
    else:
        assert st["mode"] == "lazy" and st["touched"] == 0, st
        assert after > before, ("lazy: the first operations should have connected", before, after)
    # a second publication of the same endpoints touches nothing new
    tm.publish_bound_segment([c.ep(0)])
    assert ofi.connections["touched"] == st["touched"], ofi.connections
    tm.barrier()
    ours = seg.view(np.int64)
    assert ours[4096 // 8] == len(peers), ours[4096 // 8]
    tm.barrier()
'''


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("mode", ["eager", "lazy"])
@pytest.mark.timeout(120)
def test_first_op_is_not_a_connection_setup(tmp_path, n, mode):
    need(PROVIDER)
    env = ofi_env(PROVIDER)
    env["GEXMK_OFI_CONNECT"] = mode if mode == "lazy" else None     # eager is the default
    res = mp_util.run_job(tmp_path, WORKER, n, launcher_timeout=60, env=env)
    res.check()


@pytest.mark.timeout(120)
def test_eager_connections_are_capped(tmp_path):
    # 5 ranks, at most one peer process connected up front per endpoint: the
    # other three of every rank connect on first use, and every operation works
    need(PROVIDER)
    env = ofi_env(PROVIDER)
    env["GEXMK_OFI_CONNECT_MAX"] = "1"
    res = mp_util.run_job(tmp_path, WORKER, 5, launcher_timeout=90, env=env)
    res.check()


def test_connect_max_setting_checked():
    from gexmk import config
    from gexmk.errors import ArgumentError
    assert config.load({}).ofi_connect_max == 32
    assert config.load({"GEXMK_OFI_CONNECT_MAX": "0"}).ofi_connect_max == 0
    with pytest.raises(ArgumentError, match="GEXMK_OFI_CONNECT_MAX='-1'"):
        config.load({"GEXMK_OFI_CONNECT_MAX": "-1"})
    assert config.load({}).ofi_rxm_msg_rx == 128
    with pytest.raises(ArgumentError, match="GEXMK_OFI_RXM_MSG_RX='lots'"):
        config.load({"GEXMK_OFI_RXM_MSG_RX": "lots"})
    with pytest.raises(ArgumentError, match="GEXMK_OFI_RXM_BUFFER='4K'"):
        config.load({"GEXMK_OFI_RXM_BUFFER": "4K"})


def test_connect_setting_checked():
    from gexmk import config
    from gexmk.errors import ArgumentError
    assert config.load({}).ofi_connect == "eager"
    assert config.load({"GEXMK_OFI_CONNECT": "Lazy"}).ofi_connect == "lazy"
    with pytest.raises(ArgumentError, match="GEXMK_OFI_CONNECT='sometimes'"):
        config.load({"GEXMK_OFI_CONNECT": "sometimes"})


FD_WORKER = r'''
# Out of file descriptors: rank 0, with connections made on first use, lowers
# its limit to what it has open plus one and puts to every peer.  A connection
# it cannot open is an OFIError naming EMFILE and what to do, never a crash or
# a hang; with the limit raised again the same puts go through, every byte
# lands, and the job ends cleanly.
import resource
with gexmk.init() as c:
    seg = c.segment_attach(1 << 16)
    tm = c.tm
    if tm.rank == 0:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 1, hard))
        failed = None
        try:
            for r in range(1, tm.size):
                try:
                    tm.put(r, tm.addr(r, 0), np.arange(8, dtype=np.uint8))
                except gexmk.errors.OFIError as e:
                    assert e.code == 24 and "ulimit -n" in str(e), e
                    failed = r
                    break
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert failed is not None, "no put ran out of file descriptors"
        log("out of descriptors at peer", failed)
        for r in range(failed, tm.size):
            tm.put(r, tm.addr(r, 0), np.arange(8, dtype=np.uint8))
    tm.barrier()
    if tm.rank:
        assert bytes(seg.view()[:8]) == bytes(range(8)), bytes(seg.view()[:8])
    tm.barrier()
'''


@pytest.mark.timeout(120)
def test_out_of_file_descriptors_is_a_clear_error(tmp_path):
    need(PROVIDER)
    env = ofi_env(PROVIDER)
    env["GEXMK_OFI_CONNECT"] = "lazy"
    res = mp_util.run_job(tmp_path, FD_WORKER, 6, launcher_timeout=90, env=env)
    res.check()


SYNC_WORKER = r'''
# issue 23: where endpoints are split (tcp;ofi_rxm) and the RMA endpoint orders
# writes, the library's sync endpoint is one rxm endpoint without atomics (its
# barriers write counters by ordered stores); user endpoints keep the pair
with gexmk.init() as c:
    ofi = c.transports["ofi"]
    seg = c.segment_attach(1 << 16)
    tm = c.tm
    eps = ofi.domain.endpoints
    single = [e for e in eps if e.rma_only]
    if ofi.split_endpoints and ofi.ordered_writes:
        assert len(single) == 1 and len(eps) == 2, (len(single), len(eps))
    else:
        assert not single, len(single)
    ad = tm.ad_create(gexmk.DT_I64, gexmk.OP_FADD)
    for r in range(tm.size):
        ad.op(r, tm.addr(r, 0), gexmk.OP_FADD, 1)
    for _ in range(20):
        tm.barrier()
    out = np.zeros(1, np.int64)
    tm.allreduce(np.array([tm.rank], np.int64), out, "sum")
    assert out[0] == tm.size * (tm.size - 1) // 2, out
    tm.barrier()
    assert seg.view(np.int64)[0] == tm.size, seg.view(np.int64)[0]
    tm.barrier()
'''


@pytest.mark.timeout(120)
def test_sync_endpoint_has_no_atomics_endpoint(tmp_path):
    need(PROVIDER)
    res = mp_util.run_job(tmp_path, SYNC_WORKER, 3, launcher_timeout=90, env=ofi_env(PROVIDER))
    res.check()
