"""Single-process behaviour of gexmk: a job of one (``gexmk.init()`` with
nothing set up), loopback RMA between endpoints of this process, segments,
events, teams and the errors a user can act on."""
import gc
import sys

import numpy as np
import pytest

import gexmk
from gexmk import (BoundsError, RankError, SegmentError, StateError, UnsupportedError,
                   GexmkError)

try:
    from . import mp_util
except ImportError:
    import mp_util


def pattern(n, seed=1):
    return ((np.arange(n, dtype=np.uint64) * 37 + seed) % 251).astype(np.uint8)


def memfd_mapped(token):
    """True when this process still maps the memfd named ``token``."""
    with open("/proc/self/maps") as f:
        paths = [line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6]
    return any(p.removesuffix(" (deleted)") == f"/memfd:{token}" for p in paths)


# ---- init / finalize ----------------------------------------------------------

def test_init_is_a_job_of_one():
    c = gexmk.init()
    try:
        assert (c.rank, c.size) == (0, 1)
        assert (c.tm.rank, c.tm.size) == (0, 1)
        assert c.tm.ep is c.ep(0)
        assert not c.finalized
    finally:
        c.finalize()
    assert c.finalized
    c.finalize()            # idempotent
    assert c.finalized


def test_context_manager_finalizes():
    with gexmk.init() as c:
        assert not c.finalized
    assert c.finalized


def test_context_manager_finalizes_on_error_and_reraises():
    with pytest.raises(KeyError):
        with gexmk.init() as c:
            raise KeyError("boom")
    assert c.finalized
    with gexmk.init() as c2:       # a fresh client after the error
        assert c2 is not c


def test_reinit_after_finalize():
    for _ in range(3):
        with gexmk.init() as c:
            s = c.segment_attach(64)
            c.tm.put(0, s.address, b"x")
            assert bytes(memoryview(s)[:1]) == b"x"


def test_double_init_raises_state_error(client):
    with pytest.raises(StateError, match="already initialized"):
        gexmk.init()
    # the first client is untouched
    assert not client.finalized
    client.segment_attach(64)


def test_use_after_finalize_raises_state_error():
    c = gexmk.init()
    s = c.segment_attach(4096)
    tm = c.tm
    addr = s.address
    ep0 = c.ep(0)
    pair = ep0.pair(0)
    ad = tm.ad_create(gexmk.DT_I64, gexmk.OP_FADD)
    c.finalize()
    buf = bytearray(8)
    calls = [
        lambda: tm.put(0, addr, b"12345678"),
        lambda: tm.put_nb(0, addr, b"1"),
        lambda: tm.put_nbi(0, addr, b"1"),
        lambda: tm.put_val(0, addr, 1),
        lambda: tm.get(buf, 0, addr),
        lambda: tm.get_nb(buf, 0, addr),
        lambda: tm.get_val(0, addr),
        lambda: pair.put(0, addr, b"1"),
        lambda: ad.op(0, addr, gexmk.OP_FADD, 1),
        lambda: tm.barrier(),
        lambda: tm.addr(0),
        lambda: tm.query_bound_segment_nb(0),
        lambda: tm.publish_bound_segment([]),
        lambda: tm.ad_create(gexmk.DT_I64, gexmk.OP_ADD),
        lambda: tm.split(0),
        lambda: tm.dup(),
        lambda: c.segment_create(64),
        lambda: c.segment_attach(64),
        lambda: c.ep_create(),
        lambda: c.ep(0),
        lambda: c.mk_create("host"),
        lambda: ep0.pair(0),
        lambda: s.address,
    ]
    for call in calls:
        with pytest.raises(StateError):
            call()
    assert s.destroyed
    assert buf == bytearray(8)


def test_finalize_keeps_numpy_views_readable():
    c = gexmk.init()
    s = c.segment_attach(4096)
    arr = np.asarray(s)
    c.tm.put(0, s.address + 100, b"alive")
    c.finalize()
    assert s.destroyed
    assert bytes(arr[100:105]) == b"alive"
    arr[0] = 7                       # still writable memory, not a dangling map
    assert arr[0] == 7


def test_transport_env_bad_value_is_rejected(monkeypatch):
    monkeypatch.setenv("GEXMK_TRANSPORT", "carrier-pigeon")
    with pytest.raises(ValueError, match="GEXMK_TRANSPORT"):
        gexmk.init()
    monkeypatch.delenv("GEXMK_TRANSPORT")
    with gexmk.init() as c:           # a failed init leaves nothing behind
        assert c.size == 1


def test_transport_env_ofi_opens_the_network_but_self_stays_self(monkeypatch):
    pytest.importorskip("gexmk.transports.ofi")
    monkeypatch.setenv("GEXMK_TRANSPORT", "ofi")
    with gexmk.init() as c:
        assert c.transports.get("ofi") is not None and c.transports.get("ofi").provider
        s = c.segment_attach(4096)
        assert c.tm.transport(0) == "self"
        c.tm.put(0, s.address, b"loop")
        assert bytes(memoryview(s)[:4]) == b"loop"


def test_transport_env_unknown_is_value_error(monkeypatch):
    monkeypatch.setenv("GEXMK_TRANSPORT", "carrier-pigeon")
    with pytest.raises(ValueError, match="GEXMK_TRANSPORT"):
        gexmk.init()


@pytest.mark.timeout(120)
def test_transport_env_ofi_in_fresh_interpreter(tmp_path):
    pytest.importorskip("gexmk.transports.ofi")
    script = ("import gexmk\n"
              "with gexmk.init() as c:\n    print('NET', c.transports['ofi'].provider)\n")
    r = mp_util.run_command([sys.executable, "-c", script], timeout=60, cwd=str(tmp_path),
                            env=mp_util.child_env({"GEXMK_TRANSPORT": "ofi"}))
    assert r.returncode == 0, r.report()
    assert "NET " in r.stdout


# ---- segments -------------------------------------------------------------------

def test_segment_create_zero_filled_and_described(client):
    s = client.segment_create(1000)
    assert s.size == len(s) == 1000
    assert s.library_allocated and s.shareable
    assert s.kind == gexmk.HOST and s.kind is gexmk.HOST
    assert isinstance(s.address, int) and s.address != 0
    assert not s.destroyed
    arr = np.asarray(s)
    assert arr.dtype == np.uint8 and arr.shape == (1000,)
    assert not arr.any()
    assert "1000 B" in repr(s)


def test_segment_numpy_view_is_zero_copy(client):
    s = client.segment_create(4096)
    client.ep(0).bind_segment(s)         # local endpoints can target it at once
    arr = np.asarray(s)
    assert arr.ctypes.data == s.address
    tm = client.tm
    tm.put(0, s.address + 10, b"abc")
    assert bytes(arr[10:13]) == b"abc"
    arr[2000:2004] = [1, 2, 3, 4]
    out = bytearray(4)
    tm.get(out, 0, s.address + 2000)
    assert out == bytearray([1, 2, 3, 4])
    # a typed view of the same bytes
    words = np.asarray(s).view(np.uint64)
    words[5] = 0x1122334455667788
    assert tm.get_val(0, s.address + 40) == 0x1122334455667788


def test_segment_memoryview(client):
    s = client.segment_create(16)
    m = memoryview(s)
    assert m.nbytes == 16 and not m.readonly and m.format == "B"
    m[0] = 9
    assert np.asarray(s)[0] == 9
    m.release()


def test_client_allocated_segment_from_numpy(client):
    a = pattern(4096)
    addr = a.ctypes.data
    s = client.segment_create(buffer=a)
    assert not s.library_allocated and not s.shareable
    assert s.address == addr and s.size == 4096
    client.ep(0).bind_segment(s)
    client.tm.put(0, addr + 1, b"\xff\xfe")
    assert a[1] == 0xFF and a[2] == 0xFE      # the user's array is the segment
    expected = a.copy()
    del a
    gc.collect()
    # the segment keeps the array alive: data still there, RMA still works
    assert np.array_equal(np.asarray(s), expected)
    out = np.zeros(4096, np.uint8)
    client.tm.get(out, 0, addr)
    assert np.array_equal(out, expected)


def test_client_allocated_segment_from_bytearray(client):
    b = bytearray(b"\0" * 64)
    s = client.segment_create(buffer=b)
    client.ep(0).bind_segment(s)
    client.tm.put(0, s.address + 3, b"hey")
    assert b[3:6] == b"hey"


def test_client_allocated_segment_release_gives_buffer_back(client):
    b = bytearray(64)
    s = client.segment_create(buffer=b)
    with pytest.raises(BufferError):
        b.extend(b"x")                      # exported: cannot be reallocated under RMA
    s.destroy()
    b.extend(b"x")                          # released on destroy
    assert len(b) == 65


def test_destroy_is_idempotent_and_unbinds(client):
    s = client.segment_attach(4096)
    addr = s.address
    ep0 = client.ep(0)
    assert ep0.segment is s
    s.destroy()
    s.destroy()
    assert s.destroyed
    assert ep0.segment is None
    with pytest.raises(StateError):
        s.address
    with pytest.raises(StateError):
        memoryview(s)
    with pytest.raises(SegmentError):
        client.tm.put(0, addr, b"x")
    with pytest.raises(StateError):
        ep0.bind_segment(s)


def test_segment_context_manager_destroys(client):
    with client.segment_create(128) as s:
        assert not s.destroyed
    assert s.destroyed


def test_destroy_unmaps_library_memory(client):
    s = client.segment_create(1 << 16)
    token = s.token
    assert memfd_mapped(token)
    s.destroy()
    assert not memfd_mapped(token)


def test_destroy_while_numpy_view_exists(client):
    s = client.segment_attach(1 << 16)
    token = s.token
    client.tm.put(0, s.address, b"still here")
    arr = np.asarray(s)
    s.destroy()
    assert s.destroyed and client.ep(0).segment is None
    assert bytes(arr[:10]) == b"still here"   # the view never dangles
    arr[:4] = 1
    assert memfd_mapped(token)
    del arr
    gc.collect()
    assert not memfd_mapped(token)             # unmapped with the last view


def test_numpy_of_a_destroyed_segment_raises(client):
    """numpy swallows a failing buffer protocol and would make a 0-d object
    array; a destroyed segment raises instead, and seg.view(dtype) is the
    typed zero-copy view (asarray with another dtype would copy)."""
    s = client.segment_create(4096)
    w = s.view(np.float64)
    assert w.shape == (512,) and w.ctypes.data == s.address
    s.destroy()
    with pytest.raises(gexmk.StateError, match="destroyed"):
        np.asarray(s)
    with pytest.raises(gexmk.StateError, match="destroyed"):
        s.view(np.uint8)


def test_segment_constructor_is_not_public():
    with pytest.raises(TypeError):
        gexmk.Segment()


@pytest.mark.parametrize("size", [0, -1, -4096])
def test_segment_size_not_positive(client, size):
    with pytest.raises(ValueError, match="positive"):
        client.segment_create(size)


@pytest.mark.parametrize("size", [1.5, "4096", True, 4096.0])
def test_segment_size_not_int(client, size):
    with pytest.raises(TypeError, match="int"):
        client.segment_create(size)


def test_segment_size_and_buffer_exclusive(client):
    with pytest.raises(ValueError, match="exactly one"):
        client.segment_create(64, buffer=bytearray(64))
    with pytest.raises(ValueError, match="exactly one"):
        client.segment_create()


def test_segment_too_large_is_memory_error(client):
    with pytest.raises(MemoryError):
        client.segment_create(1 << 62)


@pytest.mark.parametrize("make", [
    lambda: b"read only bytes",
    lambda: np.zeros(16, np.uint8)[::2],            # not contiguous
    lambda: 12345,
    lambda: "a string",
], ids=["bytes", "strided", "int", "str"])
def test_segment_buffer_rejected(client, make):
    with pytest.raises(TypeError, match="segment buffer"):
        client.segment_create(buffer=make())


def test_segment_buffer_readonly_numpy(client):
    a = np.zeros(16, np.uint8)
    a.flags.writeable = False
    with pytest.raises(TypeError, match="writable"):
        client.segment_create(buffer=a)


def test_segment_kind_argument(client):
    assert client.segment_create(64, kind=gexmk.HOST).kind == gexmk.HOST
    with pytest.raises(TypeError):
        client.segment_create(64, kind="host")


def test_query_bound_segment(client):
    s = client.segment_attach(8192)
    ev = client.tm.query_bound_segment_nb(0)
    bs = ev.wait()
    assert isinstance(bs, gexmk.BoundSegment)
    assert bs.address == s.address and bs.size == 8192
    assert bs.local_address == s.address
    assert bs.kind == gexmk.HOST
    assert bs.transport == "self"
    assert ev.result == bs


def test_query_bound_segment_without_segment(client):
    with pytest.raises(SegmentError):
        client.tm.query_bound_segment_nb(0)
    with pytest.raises(RankError):
        client.tm.query_bound_segment_nb(1)


def test_addr(client, seg):
    tm = client.tm
    assert tm.addr(0) == seg.address
    assert tm.addr(0, 100) == seg.address + 100
    assert tm.addr(0, seg.size) == seg.address + seg.size
    with pytest.raises(BoundsError):
        tm.addr(0, seg.size + 1)
    with pytest.raises(RankError):
        tm.addr(1)


def test_transport_names(client):
    tm = client.tm
    assert tm.transport(0) == "none"
    client.segment_attach(64)
    assert tm.transport(0) == "self"
    with pytest.raises(RankError):
        tm.transport(1)


# ---- memory kinds ----------------------------------------------------------------

def test_mk_create_host(client):
    assert client.mk_create("host") is gexmk.HOST
    assert client.mk_create(gexmk.MKClass.HOST) is gexmk.HOST
    assert gexmk.mk_create("HOST") is gexmk.HOST
    assert gexmk.HOST.name == "host" and gexmk.HOST.device == -1


@pytest.mark.parametrize("cls,words", [
    ("cuda_uva", "CUDA"),
    ("hip", "HIP"),
    ("ze", "Level Zero"),
    (gexmk.MKClass.HIP, "HIP"),
])
def test_mk_create_device_kinds_unsupported(client, cls, words):
    if cls == "cuda_uva" and _gpu_present():
        mk = client.mk_create(cls)              # a GPU machine serves the CUDA kind
        assert mk.name == "cuda_uva" and mk.impl is not None
        return
    with pytest.raises(UnsupportedError) as ei:
        client.mk_create(cls)
    assert words in str(ei.value)
    assert isinstance(ei.value, NotImplementedError)


def _gpu_present():
    try:
        from gexmk.kinds import cuda
        p = cuda.probe()
    except Exception:       # noqa: BLE001 - no usable CUDA here
        return False
    return bool(p.get("driver_loaded") and p.get("device_count"))


def test_mk_create_unknown_class(client):
    with pytest.raises(ValueError, match="unknown memory kind"):
        client.mk_create("tpu")
    with pytest.raises(ValueError):
        client.mk_create(99)


def test_memory_kind_not_constructible():
    with pytest.raises(TypeError):
        gexmk.MemoryKind()


# ---- endpoints ------------------------------------------------------------------

def test_endpoint_lifecycle(client):
    ep = client.ep_create()
    assert ep.index == 1 and client.ep(1) is ep
    s = client.segment_create(64)
    ep.bind_segment(s)
    assert ep.segment is s
    with pytest.raises(StateError, match="already"):
        ep.bind_segment(client.segment_create(64))
    with pytest.raises(StateError, match="already bound"):
        client.ep(0).bind_segment(s)
    ep.unbind_segment()
    ep.unbind_segment()                 # no-op
    assert ep.segment is None
    ep.destroy()
    ep.destroy()                        # idempotent
    with pytest.raises(ValueError):
        client.ep(1)
    with pytest.raises(StateError):
        ep.bind_segment(s)
    with pytest.raises(StateError):
        ep.pair(0)
    assert client.ep_create().index == 2      # indices are not reused
    assert [e.index for e in client.eps] == [0, 2]


def test_bind_segment_type_checked(client):
    with pytest.raises(TypeError):
        client.ep(0).bind_segment(None)
    with pytest.raises(TypeError):
        client.ep(0).bind_segment(bytearray(8))


def test_ep_create_bad_caps(client):
    with pytest.raises(ValueError):
        client.ep_create(0)
    with pytest.raises(ValueError):
        client.ep_create(1 << 10)


def test_many_endpoints_each_with_own_segment(client):
    n = 66
    eps = [client.ep(0)] + [client.ep_create() for _ in range(n - 1)]
    segs = [client.segment_create(256) for _ in range(n)]
    for e, s in zip(eps, segs):
        e.bind_segment(s)
    client.tm.publish_bound_segment(eps)
    # every EP reached by a TM-pair from EP 0 ...
    for i, s in enumerate(segs):
        p = eps[0].pair(i)
        p.put(0, s.address, i.to_bytes(4, "little"))
    # ... and by a team over all of them
    team = client.tm.create([(0, i) for i in range(n)])
    assert team.size == n and team.rank == 0
    for i, s in enumerate(segs):
        team.put(i, s.address + 8, (1000 + i).to_bytes(4, "little"))
        assert team.translate_rank_to_jobrank(i) == 0
        assert team.ep_location(i) == (0, i)
    for i, s in enumerate(segs):
        a = np.asarray(s)
        assert int.from_bytes(bytes(a[:4]), "little") == i
        assert int.from_bytes(bytes(a[8:12]), "little") == 1000 + i
        assert not a[12:].any()
    # an address of one EP's segment is out of bounds on another EP
    with pytest.raises(BoundsError):
        team.put(1, segs[2].address, b"x")


# ---- loopback between two endpoints ----------------------------------------------

@pytest.fixture
def two_eps(client):
    s0 = client.segment_attach(4096)
    ep1 = client.ep_create()
    s1 = client.segment_create(4096)
    ep1.bind_segment(s1)
    return client.ep(0), ep1, s0, s1


def test_loopback_via_pair(client, two_eps):
    ep0, ep1, s0, s1 = two_eps
    p01 = ep0.pair(1)
    assert p01.size == client.size and p01.rank == client.rank
    p01.put(0, s1.address + 5, b"to ep1")
    assert bytes(np.asarray(s1)[5:11]) == b"to ep1"
    assert not np.asarray(s0).any()
    out = bytearray(6)
    ep1.pair(1).get(out, 0, s1.address + 5)
    assert out == b"to ep1"
    ep1.pair(0).put(0, s0.address, b"back")
    assert bytes(np.asarray(s0)[:4]) == b"back"
    with pytest.raises(BoundsError):       # EP 1's pair cannot reach EP 0's segment
        p01.put(0, s0.address + 4096 * 64, b"x")
    with pytest.raises(StateError, match="TM-pair"):
        p01.barrier()
    with pytest.raises(StateError, match="TM-pair"):
        p01.split(0)
    ad = p01.ad_create(gexmk.DT_I64, gexmk.OP_ADD)      # no collective on a pair
    ad.op(0, s1.address + 64, gexmk.OP_ADD, 5)
    assert np.asarray(s1)[64:72].view(np.int64)[0] == 5


def test_pair_to_missing_endpoint_is_segment_error(client, two_eps):
    ep0 = two_eps[0]
    with pytest.raises(SegmentError):
        ep0.pair(7).put(0, two_eps[2].address, b"x")
    with pytest.raises(ValueError):
        ep0.pair(-1)


def test_loopback_via_created_team(client, two_eps):
    ep0, ep1, s0, s1 = two_eps
    t = client.tm.create([(0, 0), (0, 1)])
    assert t.size == 2 and t.rank == 0 and t.ep is ep0
    t.put(1, s1.address, b"one")
    t.put(0, s0.address, b"zero")
    assert bytes(np.asarray(s1)[:3]) == b"one"
    assert bytes(np.asarray(s0)[:4]) == b"zero"
    out = bytearray(3)
    t.get(out, 1, s1.address)
    assert out == b"one"
    assert t.translate_rank_to_jobrank(1) == 0
    assert t.translate_jobrank_to_rank(0) == 0
    assert t.transport(1) == "self"


def test_collective_on_team_of_two_local_eps_does_not_hang(monkeypatch):
    """A team holding two endpoints of this process: its collectives need
    both members, and create() hands out only one of them, so a barrier
    must fail (here: within GEXMK_TIMEOUT), never block forever."""
    monkeypatch.setenv("GEXMK_TIMEOUT", "2")
    with gexmk.init() as c:
        c.ep_create()
        t = c.tm.create([(0, 0), (0, 1)])
        with pytest.raises(GexmkError):
            t.barrier()


def test_created_team_rank_order_and_local_ep(client, two_eps):
    ep0, ep1, s0, s1 = two_eps
    t = client.tm.create([(0, 1), (0, 0)])
    assert t.rank == 1 and t.ep is ep0            # this team's EP is listed: it is ours
    t.put(0, s1.address, b"r0")
    assert bytes(np.asarray(s1)[:2]) == b"r0"
    only1 = client.tm.create([(0, 1)])
    assert only1.size == 1 and only1.rank == 0 and only1.ep is ep1
    assert client.tm.create([]) is None
    assert client.tm.create(None) is None


def test_create_bad_members(client, two_eps):
    tm = client.tm
    with pytest.raises(ValueError, match="twice"):
        tm.create([(0, 0), (0, 0)])
    with pytest.raises(RankError):
        tm.create([(5, 0)])
    with pytest.raises(RankError):
        tm.create([3])
    with pytest.raises(TypeError):
        tm.create(["x"])


def test_split_and_dup_on_one_process(client, seg):
    tm = client.tm
    s = tm.split(5, 0)
    assert (s.size, s.rank) == (1, 0)
    s.put(0, seg.address, b"split")
    assert tm.split(None) is None
    assert tm.split(-1) is None
    with pytest.raises(TypeError):
        tm.split("red")
    d = tm.dup()
    assert (d.size, d.rank) == (1, 0) and d.id != tm.id
    d.put(0, seg.address + 5, b"dup")
    assert bytes(np.asarray(seg)[:8]) == b"splitdup"
    d.barrier()
    s.barrier()


def test_rank_translation(client):
    tm = client.tm
    assert tm.translate_rank_to_jobrank(0) == 0
    assert tm.translate_jobrank_to_rank(0) == 0
    assert tm.ep_location(0) == (0, 0)
    with pytest.raises(RankError):
        tm.translate_rank_to_jobrank(1)
    with pytest.raises(RankError):
        tm.translate_rank_to_jobrank(-1)
    with pytest.raises(RankError):
        tm.translate_jobrank_to_rank(1)
    ep1 = client.ep_create()
    t = client.tm.create([(0, 1)])
    assert t.ep is ep1 and t.translate_jobrank_to_rank(0) == 0
    assert ep1.pair(3).translate_rank_to_jobrank(0) == 0


# ---- puts and gets: every flavour -----------------------------------------------

SRC_KINDS = {
    "bytes": lambda a: a.tobytes(),
    "bytearray": lambda a: bytearray(a.tobytes()),
    "numpy": lambda a: a,
    "memoryview": lambda a: memoryview(a.tobytes()),
    "numpy2d": lambda a: a.reshape(4, -1),
    "numpy_u32": lambda a: a.view(np.uint32),
}


@pytest.mark.parametrize("kind", SRC_KINDS)
def test_put_blocking_sources(client, seg, kind):
    data = pattern(256, 3)
    client.tm.put(0, seg.address + 8, SRC_KINDS[kind](data))
    arr = np.asarray(seg)
    assert np.array_equal(arr[8:264], data)
    assert not arr[:8].any() and not arr[264:].any()


def test_put_address_tuple_source(client, seg):
    data = pattern(100, 4)
    client.tm.put(0, seg.address, (data.ctypes.data, 100))
    assert np.array_equal(np.asarray(seg)[:100], data)
    client.tm.put(0, seg.address, (0, 0))      # empty is fine


def test_put_rejects_bad_sources(client, seg):
    tm = client.tm
    with pytest.raises(TypeError):
        tm.put(0, seg.address, "text")
    with pytest.raises(TypeError):
        tm.put(0, seg.address, (1, 2, 3))
    with pytest.raises(ValueError):
        tm.put(0, seg.address, (-5, 4))
    with pytest.raises(ValueError, match="NULL"):
        tm.put(0, seg.address, (0, 4))
    assert not np.asarray(seg).any()
    # a non-contiguous array is no bad source: it moves strided (issue 22, test_vis.py)
    tm.put(0, seg.address, np.arange(1.0, 9.0)[::2])
    assert np.asarray(seg)[:32].view(np.float64).tolist() == [1.0, 3.0, 5.0, 7.0]


@pytest.mark.parametrize("lc", ["now", "defer", "group", "leaf", "default"])
def test_put_nb(client, seg, lc):
    data = pattern(1000, 5)
    leaf = gexmk.LeafEvent()
    opt = {"now": gexmk.LC_NOW, "defer": gexmk.LC_DEFER, "group": gexmk.LC_GROUP,
           "leaf": leaf}.get(lc)
    kw = {} if lc == "default" else {"lc": opt}
    ev = client.tm.put_nb(0, seg.address + 1, data, **kw)
    assert isinstance(ev, gexmk.Event)
    if lc == "defer":
        lev = ev.leaf(gexmk.EC_LC)
        assert isinstance(lev, gexmk.Event)
        lev.wait()
        assert lev.test()
    elif lc == "group":
        gexmk.nbi_wait(gexmk.EC_PUT)
    elif lc == "leaf":
        leaf.wait()
        assert leaf.test()
    assert ev.wait() is None
    assert ev.test()
    assert np.array_equal(np.asarray(seg)[1:1001], data)


@pytest.mark.parametrize("lc", ["now", "defer", "group", "leaf", "default"])
def test_put_nbi(client, seg, lc):
    data = pattern(1000, 6)
    leaf = gexmk.LeafEvent()
    opt = {"now": gexmk.LC_NOW, "defer": gexmk.LC_DEFER, "group": gexmk.LC_GROUP,
           "leaf": leaf}.get(lc)
    kw = {} if lc == "default" else {"lc": opt}
    assert client.tm.put_nbi(0, seg.address + 2, data, **kw) is None
    if lc == "leaf":
        leaf.wait()
    if lc == "group":
        gexmk.nbi_wait(gexmk.EC_LC)
    gexmk.nbi_wait(gexmk.EC_PUT)
    assert gexmk.nbi_test(gexmk.EC_PUT)
    assert np.array_equal(np.asarray(seg)[2:1002], data)


def test_put_bad_lc(client, seg):
    with pytest.raises(ValueError, match="lc"):
        client.tm.put_nb(0, seg.address, b"x", lc=17)
    with pytest.raises(ValueError, match="lc"):
        client.tm.put_nbi(0, seg.address, b"x", lc="later")


def test_large_put_and_get(client):
    n = 8 << 20
    s = client.segment_attach(n)
    data = pattern(n, 7)
    client.tm.put(0, s.address, data)
    assert np.array_equal(np.asarray(s), data)
    out = np.empty(n, np.uint8)
    client.tm.get(out, 0, s.address)
    assert np.array_equal(out, data)


@pytest.mark.parametrize("nbytes", [1, 2, 3, 4, 7, 8])
def test_put_val_flavours(client, seg, nbytes):
    tm = client.tm
    arr = np.asarray(seg)
    arr[:] = 0xAA
    # the low nbytes of a pattern: a value must fit nbytes (OverflowError else, test_args)
    value = 0x0102030405060708 & ((1 << 8 * nbytes) - 1)
    expect = value.to_bytes(nbytes, sys.byteorder)
    tm.put_val(0, seg.address, value, nbytes)
    tm.put_nb_val(0, seg.address + 16, value, nbytes).wait()
    tm.put_nbi_val(0, seg.address + 32, value, nbytes)
    gexmk.nbi_wait(gexmk.EC_PUT)
    for off in (0, 16, 32):
        assert bytes(arr[off:off + nbytes]) == expect
        assert arr[off + nbytes] == 0xAA           # nothing past nbytes
    assert tm.get_val(0, seg.address, nbytes) == int.from_bytes(expect, sys.byteorder)


def test_put_val_defaults_and_masking(client, seg):
    tm = client.tm
    tm.put_val(0, seg.address, 2**64 - 2)
    assert tm.get_val(0, seg.address) == 2**64 - 2
    tm.put_val(0, seg.address + 8, -1, 2)             # two's complement, low bytes
    assert bytes(np.asarray(seg)[8:11]) == b"\xff\xff\x00"
    assert tm.get_val(0, seg.address + 8, 2) == 0xFFFF
    for bad in (0, 9):
        with pytest.raises(ValueError, match="1..8"):
            tm.put_val(0, seg.address, 1, bad)
        with pytest.raises(ValueError, match="1..8"):
            tm.get_val(0, seg.address, bad)


DEST_KINDS = {
    "bytearray": lambda n: bytearray(n),
    "numpy": lambda n: np.zeros(n, np.uint8),
    "numpy_u16": lambda n: np.zeros(n // 2, np.uint16),
    "memoryview": lambda n: memoryview(bytearray(n)),
}


@pytest.mark.parametrize("kind", DEST_KINDS)
@pytest.mark.parametrize("how", ["get", "get_nb", "get_nbi"])
def test_get_flavours(client, seg, kind, how):
    data = pattern(512, 9)
    np.asarray(seg)[64:576] = data
    dest = DEST_KINDS[kind](512)
    r = getattr(client.tm, how)(dest, 0, seg.address + 64)
    if how == "get_nb":
        assert r.wait() is None
        assert r.test()
    elif how == "get_nbi":
        assert r is None
        gexmk.nbi_wait(gexmk.EC_GET)
    assert bytes(memoryview(dest).cast("B")) == data.tobytes()


def test_get_into_address_tuple(client, seg):
    np.asarray(seg)[:16] = np.arange(16)
    out = np.zeros(16, np.uint8)
    client.tm.get((out.ctypes.data, 16), 0, seg.address)
    assert np.array_equal(out, np.arange(16))


def test_get_into_readonly_rejected(client, seg):
    with pytest.raises(TypeError, match="writable"):
        client.tm.get(b"\0" * 8, 0, seg.address)
    ro = np.zeros(8, np.uint8)
    ro.flags.writeable = False
    with pytest.raises(TypeError):
        client.tm.get(ro, 0, seg.address)


# ---- events ----------------------------------------------------------------------

def test_event_wait_twice_and_test(client, seg):
    ev = client.tm.put_nb(0, seg.address, b"ab")
    assert ev.wait() is None
    assert ev.wait() is None
    assert ev.test() and ev.test()
    assert gexmk.EVENT_DONE.test()


def test_event_leaf(client, seg):
    ev = client.tm.put_nb(0, seg.address, b"ab", lc=gexmk.LC_DEFER)
    lev = ev.leaf(gexmk.EC_LC)
    lev.wait()
    with pytest.raises(ValueError, match="leaf"):
        ev.leaf(gexmk.EC_PUT)


def test_event_not_constructible():
    with pytest.raises(TypeError):
        gexmk.Event()


def test_leaf_event_unbound_is_state_error():
    lev = gexmk.LeafEvent()
    with pytest.raises(StateError):
        lev.wait()
    with pytest.raises(StateError):
        lev.test()
    with pytest.raises(StateError):
        lev.result
    with pytest.raises(StateError):
        gexmk.test_all([lev])


def test_event_lists(client, seg):
    tm = client.tm
    e1 = tm.put_nb(0, seg.address, b"1")
    e2 = tm.get_nb(bytearray(1), 0, seg.address)
    evs = [e1, None, e2]
    gexmk.wait_all(evs)
    assert gexmk.test_all(evs)
    assert gexmk.test_all([None])
    assert gexmk.test_all([])
    assert gexmk.test_some(evs) == [0, 2]
    assert gexmk.test_some([None]) == []
    assert gexmk.wait_some([None, e2]) == [1]
    gexmk.wait_all([])
    for f in (gexmk.wait_all, gexmk.wait_some, gexmk.test_all, gexmk.test_some):
        with pytest.raises(TypeError):
            f([e1, "not an event"])


# ---- NBI: access regions, nbi_wait/test -------------------------------------------

def test_access_region(client, seg):
    tm = client.tm
    out = np.zeros(4, np.uint8)
    with gexmk.nbi_access_region() as ev:
        with pytest.raises(StateError):
            ev.wait()
        with pytest.raises(StateError):
            ev.test()
        tm.put_nbi(0, seg.address, b"\x01\x02\x03\x04")
        tm.put_nbi_val(0, seg.address + 8, 0xBEEF, 2)
        tm.get_nbi(out, 0, seg.address)
    assert ev.wait() is None
    assert ev.test()
    ev.wait()
    assert list(out) == [1, 2, 3, 4]
    assert tm.get_val(0, seg.address + 8, 2) == 0xBEEF


def test_access_region_does_not_nest():
    with gexmk.nbi_access_region():
        with pytest.raises(StateError, match="already open"):
            with gexmk.nbi_access_region():
                pass
    # the outer region closed normally: a new one opens
    with gexmk.nbi_access_region() as ev:
        pass
    ev.wait()


def test_access_region_closed_by_exception():
    with pytest.raises(KeyError):
        with gexmk.nbi_access_region():
            raise KeyError
    with gexmk.nbi_access_region() as ev:
        pass
    assert ev.test()


@pytest.mark.parametrize("cat", [0, 16, 1 << 10, -1])
def test_nbi_bad_category(cat):
    with pytest.raises(ValueError, match="category"):
        gexmk.nbi_wait(cat)
    with pytest.raises(ValueError, match="category"):
        gexmk.nbi_test(cat)


def test_nbi_good_categories(client):
    for cat in (gexmk.EC_GET, gexmk.EC_PUT, gexmk.EC_RMW, gexmk.EC_ALL, gexmk.EC_LC,
                gexmk.EC_GET | gexmk.EC_PUT):
        gexmk.nbi_wait(cat)
        assert gexmk.nbi_test(cat) is True
    gexmk.nbi_wait()
    gexmk.fence()
    gexmk.quiet()
    client.tm.fence()
    client.tm.quiet()


# ---- bounds and errors ------------------------------------------------------------

@pytest.fixture
def marked(client):
    """A 4096-byte segment on EP 0 filled with a known pattern."""
    s = client.segment_attach(4096)
    np.asarray(s)[:] = pattern(4096, 11)
    return s


def assert_unchanged(s):
    assert np.array_equal(np.asarray(s), pattern(4096, 11))


@pytest.mark.parametrize("off,n", [
    (4096 - 3, 4),       # one byte over the end
    (4096, 1),           # starts at the end
    (-1, 2),             # one byte before the base
    (-4096, 4096),       # entirely before
    (8, 4096),           # longer than what is left
    (1 << 40, 8),        # far away
])
def test_put_out_of_segment(client, marked, off, n):
    with pytest.raises(BoundsError, match="outside the bound segment"):
        client.tm.put(0, marked.address + off, bytes(n))
    assert_unchanged(marked)


def test_put_at_last_bytes_is_fine(client, marked):
    client.tm.put(0, marked.address + 4092, b"\0\0\0\0")
    client.tm.put(0, marked.address + 4096, b"")
    assert bytes(np.asarray(marked)[4092:]) == b"\0\0\0\0"


def test_put_huge_length_wraps_around(client, marked):
    src = np.zeros(8, np.uint8)
    # [address + 8, address + 8 + n) wraps past 2**64 back onto the segment start
    with pytest.raises(BoundsError):
        client.tm.put(0, marked.address + 8, (src.ctypes.data, 2**64 - 8))
    with pytest.raises(BoundsError):
        client.tm.put(0, 2**64 - 1, b"ab")
    with pytest.raises(BoundsError):
        client.tm.get((src.ctypes.data, 2**64 - 8), 0, marked.address + 8)
    assert_unchanged(marked)
    assert not src.any()


def test_put_address_out_of_range_types(client, marked):
    # outside every address, hence every segment: BoundsError naming dest (test_args)
    with pytest.raises(BoundsError, match="dest"):
        client.tm.put(0, -1, b"x")
    with pytest.raises(BoundsError, match="dest"):
        client.tm.put(0, 2**64, b"x")
    assert_unchanged(marked)


@pytest.mark.parametrize("how", ["get", "get_nb", "get_nbi"])
def test_get_out_of_segment(client, marked, how):
    out = np.full(16, 7, np.uint8)
    with pytest.raises(BoundsError):
        getattr(client.tm, how)(out, 0, marked.address + 4090)
    assert (out == 7).all()


@pytest.mark.parametrize("how", ["put_nb", "put_nbi", "put_val", "put_nb_val", "put_nbi_val"])
def test_every_put_flavour_checks_bounds(client, marked, how):
    tm = client.tm
    arg = 1 if "val" in how else b"12345678"
    with pytest.raises(BoundsError):
        getattr(tm, how)(0, marked.address + 4093, arg)
    with pytest.raises(RankError):
        getattr(tm, how)(1, marked.address, arg)
    assert_unchanged(marked)


def test_get_val_bounds(client, marked):
    with pytest.raises(BoundsError):
        client.tm.get_val(0, marked.address + 4092, 8)
    assert client.tm.get_val(0, marked.address + 4092, 4) is not None


@pytest.mark.parametrize("rank", [1, -1, 1000])
def test_bad_rank(client, marked, rank):
    with pytest.raises(RankError, match="outside the team"):
        client.tm.put(rank, marked.address, b"x")
    with pytest.raises(RankError):
        client.tm.get(bytearray(1), rank, marked.address)
    assert_unchanged(marked)


def test_errors_are_in_the_tree():
    assert issubclass(BoundsError, ValueError) and issubclass(BoundsError, GexmkError)
    assert issubclass(RankError, ValueError) and issubclass(RankError, GexmkError)
    assert issubclass(SegmentError, StateError)
    assert issubclass(UnsupportedError, GexmkError)


def test_unbound_target_is_segment_error(client):
    tm = client.tm
    s = client.segment_create(64)           # created but never bound
    with pytest.raises(SegmentError, match="no bound segment"):
        tm.put(0, s.address, b"x")
    with pytest.raises(SegmentError):
        tm.get(bytearray(1), 0, s.address)
    with pytest.raises(SegmentError):
        tm.addr(0)
    client.ep(0).bind_segment(s)
    tm.put(0, s.address, b"x")
    client.ep(0).unbind_segment()
    with pytest.raises(SegmentError):
        tm.put(0, s.address, b"y")
    assert bytes(memoryview(s)[:2]) == b"x\0"


def test_publish_bound_segment_arguments(client):
    client.tm.publish_bound_segment([])
    client.tm.publish_bound_segment()
    with pytest.raises(TypeError):
        client.tm.publish_bound_segment(["ep"])
    ep1 = client.ep_create()
    ep1.destroy()
    with pytest.raises(StateError):
        client.tm.publish_bound_segment([ep1])
