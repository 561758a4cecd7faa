"""GEXMK_OFI_MAX_PEERS: a process holds network connections with at most that
many peer processes; past it the least recently used one's are closed, both
ends agreeing through the bootstrap (ofi.src/conncap.pxi), and set up again on
the next operation.  Nothing in flight may be lost or cut off by a close:
every byte of every put, get, atomic, put_signal and NBI put between ranks
that keep evicting one another must arrive, with the cap far below the
number of peers."""
import pytest

try:
    from . import mp_util
    from .test_ofi import need, ofi_env
    from .test_ofi_connect import TCP_ESTABLISHED
except ImportError:
    import mp_util
    from test_ofi import need, ofi_env
    from test_ofi_connect import TCP_ESTABLISHED

pytest.importorskip("gexmk.transports.ofi", reason="gexmk was built without the ofi transport")

PROVIDER = "tcp;ofi_rxm"

WORKER = TCP_ESTABLISHED + r'''
CAP = int(os.environ["GEXMK_OFI_MAX_PEERS"])
ROUNDS = int(os.environ.get("CAP_ROUNDS", "4"))

with gexmk.init() as c:
    ofi = c.transports["ofi"]
    st0 = ofi.peer_cap
    if CAP:
        assert st0["cap"] == CAP and st0["note"] == "", st0
    else:
        assert st0["cap"] == 0 and "GEXMK_OFI_MAX_PEERS=0" in st0["note"], st0
    seg = c.segment_attach(1 << 16)
    tm = c.tm
    me, n = tm.rank, tm.size
    ad = tm.ad_create(gexmk.DT_I64, gexmk.OP_FADD)
    mine = seg.view(np.uint8)
    words = seg.view(np.int64)
    SLOT = 64                       # bytes per (source, round) slot
    BASE = 8192                     # slots from here; counters below
    def slot(src, rnd):
        return BASE + (src * ROUNDS + rnd) * SLOT
    for rnd in range(ROUNDS):
        order = [(me + k) % n for k in range(1, n)]
        if rnd % 2:
            order.reverse()         # the least recently used peer changes every round
        for r in order:
            data = np.full(SLOT, (me * 16 + rnd) & 0xff, np.uint8)
            data[0] = me
            data[1] = rnd
            if rnd % 3 == 0:
                tm.put(r, tm.addr(r, slot(me, rnd)), data)
            elif rnd % 3 == 1:
                tm.put_nbi(r, tm.addr(r, slot(me, rnd)), data)
            else:
                tm.put_signal(r, tm.addr(r, slot(me, rnd)), data, tm.addr(r, 8 * (100 + me)), 1,
                              gexmk.SIGNAL_ADD)
            ad.op(r, tm.addr(r, 0), gexmk.OP_FADD, 1)
            back = np.zeros(SLOT, np.uint8)
            tm.get(back, r, tm.addr(r, slot(me, rnd)))
            if rnd % 3 != 1:            # an NBI put is not ordered before the get
                assert (back == data).all(), (r, rnd, back[:8], data[:8])
        tm.quiet()
        if rnd % 2:
            tm.barrier()
    tm.barrier()
    assert words[0] == (n - 1) * ROUNDS, ("atomics lost", words[0], (n - 1) * ROUNDS)
    for src in range(n):
        if src == me:
            continue
        for rnd in range(ROUNDS):
            s = mine[slot(src, rnd):slot(src, rnd) + SLOT]
            want = np.full(SLOT, (src * 16 + rnd) & 0xff, np.uint8)
            want[0] = src
            want[1] = rnd
            assert (s == want).all(), ("lost put", src, rnd, s[:8])
        sig = words[100 + src]
        assert sig == sum(1 for rnd in range(ROUNDS) if rnd % 3 == 2), ("signals", src, sig)
    # closes still under way finish (each peer's own, then ours)
    deadline = time.monotonic() + 10
    while ofi.peer_cap["closing"] and time.monotonic() < deadline:
        time.sleep(0.01)
    tm.barrier()
    while ofi.peer_cap["closing"] and time.monotonic() < deadline:
        time.sleep(0.01)
    st = ofi.peer_cap
    est = tcp_established()
    log("peer cap", st, "tcp connections", est)
    assert not st["errors"], st
    # at most three connections per peer process (sync, RMA and atomics endpoints)
    if CAP:
        assert st["evicts"] > 0 and st["closed"] > 0, st
        assert est <= 3 * (CAP + 1), ("connections beyond the cap", est, st)
    else:
        assert est >= n - 1, ("no cap: a connection per peer expected", est)
    tm.barrier()
'''


@pytest.mark.parametrize("n,cap", [(4, 1), (6, 2), (6, 0)])
@pytest.mark.timeout(240)
def test_connections_capped_and_reused_without_loss(tmp_path, n, cap):
    need(PROVIDER)
    env = ofi_env(PROVIDER)
    env["GEXMK_OFI_MAX_PEERS"] = str(cap)
    env["GEXMK_OFI_CONNECT"] = "lazy"
    res = mp_util.run_job(tmp_path, WORKER, n, launcher_timeout=200, env=env)
    res.check()


SHM_WORKER = r'''
# shm holds no connections: the cap is not enforced there, and says why
with gexmk.init() as c:
    ofi = c.transports["ofi"]
    st = ofi.peer_cap
    assert st["cap"] == 0 and "not enforced over shm" in st["note"], st
    seg = c.segment_attach(1 << 12)
    tm = c.tm
    peer = (tm.rank + 1) % tm.size
    tm.put(peer, tm.addr(peer, 8 * tm.rank), np.full(8, tm.rank + 1, np.uint8))
    tm.barrier()
    src = (tm.rank - 1) % tm.size
    assert (seg.view()[8 * src:8 * src + 8] == src + 1).all()
    assert ofi.peer_cap["admits"] == 0, ofi.peer_cap
    tm.barrier()
'''


@pytest.mark.timeout(120)
def test_cap_not_enforced_over_shm_says_why(tmp_path):
    need("shm")
    env = ofi_env("shm")
    env["GEXMK_OFI_MAX_PEERS"] = "1"
    res = mp_util.run_job(tmp_path, SHM_WORKER, 3, launcher_timeout=90, env=env)
    res.check()


def test_max_peers_setting_checked():
    from gexmk import config
    from gexmk.errors import ArgumentError
    assert config.load({}).ofi_max_peers == 256
    assert config.load({"GEXMK_OFI_MAX_PEERS": "0"}).ofi_max_peers == 0
    assert config.load({"GEXMK_OFI_MAX_PEERS": "3"}).ofi_max_peers == 3
    with pytest.raises(ArgumentError, match="GEXMK_OFI_MAX_PEERS='-1'"):
        config.load({"GEXMK_OFI_MAX_PEERS": "-1"})
    with pytest.raises(ArgumentError, match="GEXMK_OFI_MAX_PEERS='many'"):
        config.load({"GEXMK_OFI_MAX_PEERS": "many"})
