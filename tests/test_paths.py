"""The path every operation takes is visible, and degraded paths can be refused.

- ``tm.path_stats(rank)`` / ``client.path_stats()``: operations and bytes per
  path, separately for puts, gets and atomics, with how many the inline
  memcpy served; exact counts through the self, nbrhd, pvm and ofi (tcp)
  paths; counters survive a new choice of paths (publication) and reset.
- ``GEXMK_STAGED=refuse`` / ``gexmk.init(staged='refuse')``: a path a
  transport marks ``staged`` (host bounce buffers) is never chosen; where it
  is the only one, operations raise UnsupportedError naming it and the option.
  Tested with a wrapped local transport whose reach says staged=True (no GPU
  needed).
"""
import os
import sys
import textwrap
import types

import numpy as np
import pytest

import gexmk
from gexmk import ArgumentError, BoundsError, UnsupportedError, transports

try:
    from . import mp_util
except ImportError:
    import mp_util


def _row(ops=0, nbytes=0, inline=0):
    return {"ops": ops, "bytes": nbytes, "inline": inline}


# ---- counters in one process (the self path) ---------------------------------------

def test_self_path_counts_exact_and_reset():
    with gexmk.init() as c:
        seg = c.segment_attach(4096)
        tm = c.tm
        base = tm.addr(0)
        assert tm.path_stats(0) == {}
        tm.put(0, base, np.arange(4, dtype=np.uint64))            # 32 B, inline
        tm.put(0, base + 64, b"x" * 100)                            # 100 B, inline
        tm.put_val(0, base + 256, 7, 4)                             # 4 B
        tm.put_nbi(0, base + 512, b"y" * 16)                        # 16 B
        gexmk.nbi_wait(gexmk.EC_ALL)
        got = np.zeros(8, np.uint8)
        tm.get(got, 0, base + 64)                                   # 8 B
        assert bytes(got) == b"x" * 8
        assert tm.get_val(0, base + 256, 4) == 7                    # 4 B
        ad = tm.ad_create(gexmk.DT_I64, gexmk.OP_FADD | gexmk.OP_GET)
        for _ in range(3):
            ad.op(0, base + 1024, gexmk.OP_FADD, 1)
        assert ad.op(0, base + 1024, gexmk.OP_GET) == 3
        ad.destroy()
        with pytest.raises(BoundsError):                            # failed ops are not counted
            tm.put(0, base + 4096, b"z")
        want = {"self": {"put": _row(4, 152, 4), "get": _row(2, 12, 2), "atomic": _row(4, 32, 4)}}
        assert tm.path_stats(0) == want
        assert tm.path_stats() == {0: want}
        assert c.path_stats() == want
        # a new choice of paths (publication) keeps what was counted
        tm.publish_bound_segment([c.ep(0)])
        assert tm.path_stats(0) == want
        tm.put(0, base, b"ab")
        assert tm.path_stats(0)["self"]["put"] == _row(5, 154, 5)
        # teams over the same endpoints share the route's counters
        assert tm.dup().path_stats(0)["self"]["put"] == _row(5, 154, 5)
        tm.reset_path_stats()
        assert tm.path_stats(0) == {} and c.path_stats() == {}
        tm.get(got, 0, base)
        c.reset_path_stats()
        assert c.path_stats() == {}
        with pytest.raises(gexmk.RankError):
            tm.path_stats(1)


def test_device_buffer_refusal_is_not_counted():
    """A refused local buffer never reaches a path: nothing is counted."""
    with gexmk.init() as c:
        c.segment_attach(4096)
        with pytest.raises(TypeError):
            c.tm.put(0, c.tm.addr(0), 12)
        assert c.path_stats() == {}


# ---- counters across processes: nbrhd, pvm and ofi (tcp) ------------------------

COUNT_WORKER = r'''
want_path = sys.argv[1]
atomics = sys.argv[2] == "1"
with gexmk.init() as c:
    tm = c.tm
    seg = c.segment_attach(1 << 16)
    me, peer = tm.rank, (tm.rank + 1) % tm.size
    assert tm.paths(peer)["rma"] == want_path, tm.paths(peer)
    tm.barrier()
    dst = tm.addr(peer) + 4096 * me
    tm.put(peer, dst, np.arange(4, dtype=np.uint64))             # 32 B
    tm.put(peer, dst + 64, pattern(1000, me))                    # 1000 B
    tm.put_val(peer, dst + 2048, 5, 8)                           # 8 B
    tm.put_nbi(peer, dst + 3072, b"q" * 24)                      # 24 B
    gexmk.nbi_wait(gexmk.EC_ALL)
    tm.put_nb(peer, dst + 3200, b"r" * 40).wait()                # 40 B
    got = np.zeros(16, np.uint8)
    tm.get(got, peer, dst + 64)                                  # 16 B
    assert (got == pattern(1000, me)[:16]).all()
    tm.get_nb(got, peer, dst + 64).wait()                        # 16 B
    tm.get_nbi(got, peer, dst + 64)                              # 16 B
    gexmk.nbi_wait(gexmk.EC_ALL)
    n_amo = 0
    if atomics:
        ad = tm.ad_create(gexmk.DT_U64, gexmk.OP_FADD | gexmk.OP_ADD)
        for _ in range(5):
            ad.op(peer, dst + 2048, gexmk.OP_ADD, 1)
        assert ad.op(peer, dst + 2048, gexmk.OP_FADD, 0) == 10
        ad.destroy()
        n_amo = 6
    expect_raises(E.BoundsError, tm.put, peer, tm.addr(peer) + (1 << 16), b"z")
    inline = want_path == "nbrhd"      # a CPU mapping: the inline memcpy serves every op
    st = tm.path_stats(peer)
    want = {want_path: {
        "put": {"ops": 5, "bytes": 32 + 1000 + 8 + 24 + 40, "inline": 5 if inline else 0},
        "get": {"ops": 3, "bytes": 48, "inline": 3 if inline else 0},
        "atomic": {"ops": n_amo, "bytes": 8 * n_amo, "inline": n_amo if inline else 0}}}
    assert st == want, (st, want)
    assert tm.path_stats(me) == {}, tm.path_stats(me)
    allst = tm.path_stats()
    assert allst[peer] == st and allst[me] == {}, allst
    assert c.path_stats() == st, c.path_stats()
    tm.barrier()
    # publication again: the route is chosen anew, the counts stay
    tm.publish_bound_segment([c.ep(0)])
    assert tm.path_stats(peer) == st, (tm.path_stats(peer), st)
    tm.reset_path_stats()
    assert tm.path_stats(peer) == {}
    tm.barrier()
    log("ok", st)
'''


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport,path,atomics", [("auto", "nbrhd", True), ("pvm", "pvm", False)])
def test_counts_across_processes(tmp_path, transport, path, atomics):
    env = {"GEXMK_TRANSPORT": transport, "GEXMK_TIMEOUT": 30}
    mp_util.run_job(tmp_path, COUNT_WORKER, 2, env=env, args=(path, "1" if atomics else "0"),
                    launcher_timeout=60).check()


@pytest.mark.timeout(120)
def test_counts_over_ofi_tcp(tmp_path):
    ofi = pytest.importorskip("gexmk.fabric_probe", reason="gexmk was built without libfabric")
    try:
        found = ofi.providers("tcp;ofi_rxm")
    except Exception as e:      # noqa: BLE001 - probing failed: not usable here
        pytest.skip(f"libfabric tcp;ofi_rxm: probing failed ({e})")
    if not found:
        pytest.skip("libfabric offers no tcp;ofi_rxm here")
    env = {"GEXMK_TRANSPORT": "ofi", "GEXMK_OFI_PROVIDER": "tcp;ofi_rxm", "GEXMK_TIMEOUT": 30,
           "GEXMK_PROGRESS_THREAD": None, "FI_PROVIDER": None}
    mp_util.run_job(tmp_path, COUNT_WORKER, 2, env=env, args=("ofi", "1"),
                    launcher_timeout=90).check()


# ---- refusing staged paths ------------------------------------------------------------

class _StagedLocal:
    """The local transport, except that its reach says staged=True (as a
    host-staged device path would), under its own name or another."""

    def __init__(self, inner, name=None, bonus=0):
        self._inner = inner
        self.name = name or inner.name
        self._bonus = bonus

    def __getattr__(self, attr):
        return getattr(self._inner, attr)

    def reach(self, epctx, peer, ctx):
        r = self._inner.reach(epctx, peer, ctx)
        if r is None:
            return None
        return r._replace(name=f"{r.name}-staged" if self._bonus else r.name,
                          rma=r.rma + self._bonus, amo=r.amo + self._bonus, staged=True)


def _registry_with(monkeypatch, replace_local=False, extra=False):
    """REGISTRY with the local transport wrapped (every local path staged) or
    with a second, staged, higher-scoring copy of it beside the real one."""
    from gexmk.transports import local
    mod = types.ModuleType("gexmk_test_staged")
    mod.open = lambda job: _StagedLocal(local.open(job))
    extra_mod = types.ModuleType("gexmk_test_staged_extra")
    extra_mod.open = lambda job: _StagedLocal(local.open(job), name="fakestaged", bonus=50)
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.setitem(sys.modules, extra_mod.__name__, extra_mod)
    reg = []
    for name, module, needed in transports.REGISTRY:
        if name == "local" and replace_local:
            module = mod.__name__
        reg.append((name, module, needed))
    if extra:
        reg.append(("fakestaged", extra_mod.__name__, lambda job: "test"))
    monkeypatch.setattr(transports, "REGISTRY", reg)


@pytest.mark.parametrize("how", ["env", "init"])
def test_refused_staged_only_path_raises(monkeypatch, how):
    _registry_with(monkeypatch, replace_local=True)
    if how == "env":
        monkeypatch.setenv("GEXMK_STAGED", "refuse")
        c = gexmk.init()
    else:
        monkeypatch.delenv("GEXMK_STAGED", raising=False)
        c = gexmk.init(staged="refuse")
    with c:
        assert c.config.staged == "refuse"
        c.segment_attach(4096)
        tm = c.tm
        assert tm.paths(0) == {"rma": "refused:self", "atomic": "refused:self"}
        for call in (lambda: tm.put(0, tm.addr(0), b"abc"),
                     lambda: tm.get(bytearray(3), 0, tm.addr(0)),
                     lambda: tm.put_nbi(0, tm.addr(0), b"abc"),
                     lambda: tm.ad_create(gexmk.DT_I64, gexmk.OP_ADD).op(0, tm.addr(0),
                                                                          gexmk.OP_ADD, 1)):
            with pytest.raises(UnsupportedError) as ei:
                call()
            msg = str(ei.value)
            assert "'self'" in msg and "staged" in msg and "GEXMK_STAGED" in msg, msg
        assert c.path_stats() == {}


def test_staged_path_allowed_by_default(monkeypatch):
    monkeypatch.delenv("GEXMK_STAGED", raising=False)
    _registry_with(monkeypatch, replace_local=True)
    with gexmk.init() as c:
        assert c.config.staged == "allow"
        c.segment_attach(4096)
        tm = c.tm
        assert tm.paths(0) == {"rma": "self", "atomic": "self"}
        tm.put(0, tm.addr(0), b"abc")
        assert tm.get_val(0, tm.addr(0), 3) == int.from_bytes(b"abc", "little")


@pytest.mark.parametrize("staged,want", [("allow", "self-staged"), ("refuse", "self")])
def test_refuse_takes_the_direct_path_when_there_is_one(monkeypatch, staged, want):
    """A staged path scoring higher than a direct one: allowed, it is taken
    (and counted under its name); refused, the direct one is."""
    monkeypatch.delenv("GEXMK_STAGED", raising=False)
    _registry_with(monkeypatch, extra=True)
    with gexmk.init(staged=staged) as c:
        c.segment_attach(4096)
        tm = c.tm
        assert tm.paths(0) == {"rma": want, "atomic": want}
        tm.put(0, tm.addr(0), b"abcd")
        assert bytes(c.ep(0).segment.view(np.uint8)[:4]) == b"abcd"
        assert list(tm.path_stats(0)) == [want]
        assert tm.path_stats(0)[want]["put"]["ops"] == 1


def test_staged_option_values(monkeypatch):
    from gexmk import config
    assert config.load({}).staged == "allow"
    assert config.load({"GEXMK_STAGED": "Refuse "}).staged == "refuse"
    assert config.load({"GEXMK_STAGED": "0"}).staged == "refuse"
    with pytest.raises(ArgumentError, match="GEXMK_STAGED='sometimes'"):
        config.load({"GEXMK_STAGED": "sometimes"})
    with pytest.raises(ArgumentError, match="init\\(staged=\\)"):
        gexmk.init(staged="never")
    with pytest.raises(ArgumentError, match="init\\(staged=\\)"):
        gexmk.init(staged=3)
    with gexmk.init(staged=False) as c:
        assert c.config.staged == "refuse"


# ---- GPU: device segments are counted too (through the kind's copy engine, never inline) ----

def _have_gpu():
    try:
        from gexmk.kinds import cuda
        p = cuda.probe()
        return bool(p.get("driver_loaded") and p.get("device_count"))
    except Exception:           # noqa: BLE001 - any failure means: no usable GPU
        return False


@pytest.mark.gpu
@pytest.mark.skipif(not _have_gpu(), reason="no NVIDIA driver or device on this machine")
def test_device_routes_are_counted():
    with gexmk.init() as c:
        mk = c.mk_create(gexmk.CUDA_UVA, 0)
        c.segment_attach(4096)
        ep1, ep2 = c.ep_create(), c.ep_create()
        d1 = c.segment_create(1 << 20, kind=mk)
        d2 = c.segment_create(1 << 20, kind=mk)
        ep1.bind_segment(d1)
        ep2.bind_segment(d2)
        h = c.ep(0).pair(1)                     # host EP -> d1
        dd = ep2.pair(1)                        # d2 -> d1
        h.put(0, d1.address, np.arange(16, dtype=np.uint8))           # 16 B
        h.put_val(0, d1.address + 64, 3)                               # 8 B
        dd.put(0, d1.address + 128, (d2.address, 100))                 # 100 B
        dd.put_nb(0, d1.address + 256, (d2.address, 4)).wait()         # 4 B
        out = np.zeros(16, np.uint8)
        h.get(out, 0, d1.address)                                      # 16 B
        assert (out == np.arange(16)).all()
        ad = h.ad_create(gexmk.DT_U64, gexmk.OP_FADD)
        ad.op(0, d1.address + 512, gexmk.OP_FADD, 2)                   # 8 B
        ad.destroy()
        assert h.path_stats(0) == {"self": {"put": _row(2, 24), "get": _row(1, 16),
                                            "atomic": _row(1, 8)}}
        assert dd.path_stats(0) == {"self": {"put": _row(2, 104), "get": _row(),
                                             "atomic": _row()}}
        total = c.path_stats()["self"]
        assert total["put"] == _row(4, 128) and total["get"] == _row(1, 16)
