"""Signals and point-to-point synchronisation (NVSHMEM put_signal, signal_op,
signal_fetch, wait_until and its _all/_any/_some and test forms).

1. One process: the self path, every wait/test form and data type, values
   per word, timeouts, and bad input (address outside the caller's own
   segment, misaligned, bad cmp/dt/sig_op/rank, a destroyed segment).
2. Jobs of 2 and 4 ranks on every transport (nbrhd; pvm for library- and
   client-allocated segments; ofi with tcp;ofi_rxm and shm): a ring where each
   rank put_signals a large buffer to its right neighbour, which checks the
   buffer's first and last bytes as soon as it sees the signal (the signal is
   never visible before the data), many iterations, blocking, NB and NBI
   forms; SIGNAL_ADD from every rank into one counter; the _all/_any/_some
   and test forms across processes.
3. A peer killed while a rank waits on a word only it would set: the wait
   ends with PeerDeadError well within GEXMK_TIMEOUT (no hang).
4. Four ranks on two cores (CPU affinity) ping-pong through wait_until: it
   completes (the launcher's limit bounds it; waits yield instead of
   spinning their peers off the cores).
"""
import os
import signal
import textwrap
import time

import numpy as np
import pytest

import gexmk
from gexmk import ArgumentError, BoundsError, RankError, StateError

try:
    from . import mp_util
except ImportError:
    import mp_util

CMPS = [gexmk.CMP_EQ, gexmk.CMP_NE, gexmk.CMP_GT, gexmk.CMP_GE, gexmk.CMP_LT, gexmk.CMP_LE]
PY_CMP = {gexmk.CMP_EQ: lambda a, b: a == b, gexmk.CMP_NE: lambda a, b: a != b,
          gexmk.CMP_GT: lambda a, b: a > b, gexmk.CMP_GE: lambda a, b: a >= b,
          gexmk.CMP_LT: lambda a, b: a < b, gexmk.CMP_LE: lambda a, b: a <= b}
DTS = {gexmk.DT_I32: np.int32, gexmk.DT_U32: np.uint32, gexmk.DT_I64: np.int64,
       gexmk.DT_U64: np.uint64, gexmk.DT_FLT: np.float32, gexmk.DT_DBL: np.float64}


# ---- 1. one process ------------------------------------------------------------

def test_constants_exported():
    assert (gexmk.SIGNAL_SET, gexmk.SIGNAL_ADD) == (0, 1)
    assert sorted(CMPS) == list(range(6))
    for name in ("SIGNAL_SET", "SIGNAL_ADD", "CMP_EQ", "CMP_NE", "CMP_GT", "CMP_GE", "CMP_LT",
                 "CMP_LE"):
        assert hasattr(gexmk, name)


def test_stub_has_the_signal_api():
    import ast
    stub = os.path.join(os.path.dirname(gexmk.__file__), "__init__.pyi")
    tree = ast.parse(open(stub).read())
    lits = {n.target.id: n.annotation.slice.value for n in tree.body
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
            and n.target.id.startswith(("SIGNAL_", "CMP_"))}
    assert lits == {k: getattr(gexmk, k) for k in lits} and len(lits) == 8, lits
    team = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Team")
    methods = {f.name for f in team.body if isinstance(f, ast.FunctionDef)}
    api = {"put_signal", "put_signal_nb", "put_signal_nbi", "signal_op", "signal_fetch",
           "wait_until", "wait_until_all", "wait_until_any", "wait_until_some",
           "test", "test_all", "test_any", "test_some", "put_signal_on_stream",
           "signal_wait_until_on_stream"}
    assert api <= methods, api - methods
    for name in api:
        assert getattr(gexmk.Team, name).__doc__, name


def test_put_signal_self_set_add_and_fetch(client, seg):
    tm = client.tm
    mem = np.asarray(seg)
    sig = tm.addr(0, 0)
    data = np.arange(1000, dtype=np.uint8)
    tm.put_signal(0, tm.addr(0, 1024), data, sig, 5)
    assert (mem[1024:2024] == data).all()
    assert tm.signal_fetch(sig) == 5
    tm.put_signal(0, tm.addr(0, 1024), data[::-1].copy(), sig, 3, gexmk.SIGNAL_ADD)
    assert tm.signal_fetch(sig) == 8 and (mem[1024:2024] == data[::-1]).all()
    tm.signal_op(0, sig, 2**64 - 1)
    assert tm.signal_fetch(sig) == 2**64 - 1
    tm.signal_op(0, sig, 2, gexmk.SIGNAL_ADD)        # wraps, as a 64-bit unsigned word
    assert tm.signal_fetch(sig) == 1
    ev = tm.put_signal_nb(0, tm.addr(0, 64), b"nb", sig, 10)
    ev.wait()
    assert tm.signal_fetch(sig) == 10 and bytes(mem[64:66]) == b"nb"
    tm.put_signal_nbi(0, tm.addr(0, 64), b"nbi", sig, 1, gexmk.SIGNAL_ADD)
    gexmk.quiet()
    assert tm.signal_fetch(sig) == 11 and bytes(mem[64:67]) == b"nbi"
    # numpy integers are fine as ranks, addresses, signals and ops
    tm.put_signal(np.int64(0), np.uint64(tm.addr(0, 64)), b"x", np.uint64(sig), np.uint64(4),
                  np.int32(gexmk.SIGNAL_SET))
    assert tm.signal_fetch(sig) == 4


@pytest.mark.parametrize("cmp", CMPS)
def test_test_and_wait_compare_like_python(client, seg, cmp):
    tm = client.tm
    sig = tm.addr(0, 8)
    for word in (0, 5, 9):
        tm.signal_op(0, sig, word)
        for value in (4, 5, 6):
            want = PY_CMP[cmp](word, value)
            assert tm.test(sig, cmp, value) is want, (word, cmp, value)
            if want:
                tm.wait_until(sig, cmp, value, timeout=5)   # returns at once
            else:
                with pytest.raises(gexmk.TimeoutError):
                    tm.wait_until(sig, cmp, value, timeout=0.05)


@pytest.mark.parametrize("dt", list(DTS), ids=[DTS[d].__name__ for d in DTS])
def test_wait_on_every_data_type(client, seg, dt):
    tm = client.tm
    T = DTS[dt]
    view = np.asarray(seg)[256:256 + 4 * T().itemsize].view(T)
    view[:] = [T(-2) if np.issubdtype(T, np.signedinteger) or np.issubdtype(T, np.floating)
               else T(2), T(0), T(7), T(1)]
    addrs = [tm.addr(0, 256 + i * T().itemsize) for i in range(4)]
    assert tm.test(addrs[2], gexmk.CMP_EQ, 7, dt=dt)
    assert tm.test_any(addrs, gexmk.CMP_GT, 5, dt=dt) == 2
    assert tm.test_some(addrs, gexmk.CMP_GE, 1, dt=dt) == ([2, 3] if view[0] < 0 else [0, 2, 3])
    assert tm.test_all(addrs, gexmk.CMP_LT, 8, dt=dt) is True
    assert tm.test_all(addrs, gexmk.CMP_LT, 7, dt=dt) is False
    tm.wait_until_all(addrs, gexmk.CMP_LE, 7, dt=dt, timeout=5)
    assert tm.wait_until_any(addrs, gexmk.CMP_EQ, 1, dt=dt, timeout=5) == 3
    assert tm.wait_until_some(addrs, gexmk.CMP_NE, 0, dt=dt, timeout=5) == [0, 2, 3]
    if dt in (gexmk.DT_I32, gexmk.DT_I64, gexmk.DT_FLT, gexmk.DT_DBL):
        assert tm.test(addrs[0], gexmk.CMP_LT, 0, dt=dt)      # signed comparison


def test_values_per_word(client, seg):
    tm = client.tm
    addrs = [tm.addr(0, 8 * i) for i in range(3)]
    for i, a in enumerate(addrs):
        tm.signal_op(0, a, 10 * i)
    assert tm.test_all(addrs, gexmk.CMP_EQ, [0, 10, 20])
    assert not tm.test_all(addrs, gexmk.CMP_EQ, [0, 10, 21])
    assert tm.test_some(addrs, gexmk.CMP_EQ, [1, 10, 20]) == [1, 2]
    assert tm.test_any(addrs, gexmk.CMP_EQ, [1, 11, 21]) is None
    assert tm.test_some(addrs, gexmk.CMP_EQ, [1, 11, 21]) == []
    with pytest.raises(ArgumentError, match="2 values for 3 words"):
        tm.test_all(addrs, gexmk.CMP_EQ, [1, 2])


def test_wait_for_a_word_set_by_another_thread(client, seg):
    import threading
    tm = client.tm
    addrs = [tm.addr(0, 8 * i) for i in range(4)]

    def later():
        time.sleep(0.05)
        tm.put_signal(0, tm.addr(0, 4096), b"payload", addrs[2], 1)
        time.sleep(0.05)
        for a in addrs:
            tm.signal_op(0, a, 1, gexmk.SIGNAL_ADD)

    th = threading.Thread(target=later)
    th.start()
    try:
        assert tm.wait_until_any(addrs, gexmk.CMP_EQ, 1, timeout=30) == 2
        assert bytes(np.asarray(tm.ep.segment)[4096:4103]) == b"payload"
        tm.wait_until_all(addrs, gexmk.CMP_GE, 1, timeout=30)
    finally:
        th.join()
    assert tm.test_some(addrs, gexmk.CMP_EQ, 1) == [0, 1, 3]


def test_timeout_names_the_word_and_value(client, seg):
    tm = client.tm
    sig = tm.addr(0, 16)
    tm.signal_op(0, sig, 3)
    t = time.monotonic()
    with pytest.raises(gexmk.TimeoutError) as ei:
        tm.wait_until(sig, gexmk.CMP_GE, 4, timeout=0.2)
    assert time.monotonic() - t >= 0.2
    msg = str(ei.value)
    assert f"0x{sig:x}" in msg and "CMP_GE 4" in msg and "last value seen 3" in msg, msg
    assert isinstance(ei.value, TimeoutError)          # the builtin too
    with pytest.raises(gexmk.TimeoutError, match=f"0x{tm.addr(0, 24):x}"):
        tm.wait_until_all([sig, tm.addr(0, 24)], gexmk.CMP_EQ, [3, 1], timeout=0.1)


def test_default_timeout_is_gexmk_timeout(tmp_path):
    r = mp_util.run_job(tmp_path, r'''
    c = gexmk.init()
    seg = c.segment_attach(4096)
    t = time.monotonic()
    expect_raises(E.TimeoutError, c.tm.wait_until, c.tm.addr(0, 0), gexmk.CMP_EQ, 1)
    took = time.monotonic() - t
    assert 0.5 <= took < 20, took
    c.finalize()
    ''', 1, env={"GEXMK_TIMEOUT": "0.5"}, launcher_timeout=40)
    r.check()


def test_bad_input(client, seg):
    tm = client.tm
    sig = tm.addr(0, 0)
    end = tm.addr(0, seg.size)
    # waits and fetches take a word of the caller's own segment, aligned
    for fn in (lambda a: tm.wait_until(a, gexmk.CMP_EQ, 0, timeout=1),
               lambda a: tm.test(a, gexmk.CMP_EQ, 0), lambda a: tm.signal_fetch(a),
               lambda a: tm.wait_until_all([sig, a], gexmk.CMP_EQ, 0, timeout=1)):
        with pytest.raises(BoundsError, match="own"):
            fn(end)
        with pytest.raises(BoundsError, match="own"):
            fn(sig - 8)
        with pytest.raises(BoundsError, match="aligned"):
            fn(sig + 4)
    with pytest.raises(BoundsError, match="aligned to 4"):
        tm.test(sig + 2, gexmk.CMP_EQ, 0, dt=gexmk.DT_I32)
    assert tm.test(sig + 4, gexmk.CMP_EQ, 0, dt=gexmk.DT_I32)
    with pytest.raises(BoundsError):
        tm.wait_until(-1, gexmk.CMP_EQ, 0)
    # cmp, dt, value, timeout
    for bad in (6, -1, 1.0, "CMP_EQ", None, True):
        with pytest.raises(ArgumentError, match="cmp must be one of"):
            tm.wait_until(sig, bad, 0)
    for bad in (6, -1, 2.0, None):
        with pytest.raises(ArgumentError, match="dt must be one of"):
            tm.test(sig, gexmk.CMP_EQ, 0, dt=bad)
    with pytest.raises(OverflowError, match="value"):
        tm.test(sig, gexmk.CMP_EQ, -1)                  # DT_U64
    with pytest.raises(OverflowError, match="value"):
        tm.test(sig, gexmk.CMP_EQ, 2**32, dt=gexmk.DT_U32)
    with pytest.raises(TypeError, match="value"):
        tm.test(sig, gexmk.CMP_EQ, 1.5)
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ArgumentError, match="timeout"):
            tm.wait_until(sig, gexmk.CMP_EQ, 0, timeout=bad)
    with pytest.raises(TypeError, match="timeout"):
        tm.wait_until(sig, gexmk.CMP_EQ, 0, timeout="1")
    with pytest.raises(ArgumentError, match="empty"):
        tm.wait_until_any([], gexmk.CMP_EQ, 0)
    with pytest.raises(TypeError, match="sequence"):
        tm.wait_until_any(sig, gexmk.CMP_EQ, 0)
    # put_signal / signal_op: sig_op, rank, ranges, alignment, signal value
    for bad in (2, -1, 1.0, None, True):
        with pytest.raises(ArgumentError, match="sig_op must be SIGNAL_SET or SIGNAL_ADD"):
            tm.put_signal(0, tm.addr(0, 64), b"x", sig, 1, bad)
        with pytest.raises(ArgumentError, match="sig_op"):
            tm.signal_op(0, sig, 1, bad)
    with pytest.raises(RankError, match="rank 1 is outside the team"):
        tm.put_signal(1, sig, b"x", sig, 1)
    with pytest.raises(RankError):
        tm.signal_op(-1, sig, 1)
    with pytest.raises(BoundsError, match="outside the bound segment"):
        tm.put_signal(0, end - 2, b"xyz", sig, 1)
    with pytest.raises(BoundsError, match="signal word"):
        tm.put_signal(0, tm.addr(0, 64), b"x", end, 1)
    with pytest.raises(BoundsError, match="aligned to 8"):
        tm.put_signal(0, tm.addr(0, 64), b"x", sig + 4, 1)
    with pytest.raises(BoundsError, match="aligned to 8"):
        tm.signal_op(0, sig + 1, 1)
    with pytest.raises(OverflowError, match="signal"):
        tm.put_signal(0, tm.addr(0, 64), b"x", sig, 2**64)
    with pytest.raises(OverflowError, match="signal"):
        tm.put_signal(0, tm.addr(0, 64), b"x", sig, -1)
    with pytest.raises(TypeError):
        tm.put_signal(0, tm.addr(0, 64), 5, sig, 1)      # src is no buffer
    # nothing was written by the refused calls
    assert tm.signal_fetch(sig) == 0


def test_destroyed_segment_and_finalized_client():
    c = gexmk.init()
    try:
        seg = c.segment_attach(4096)
        tm = c.tm
        sig = tm.addr(0, 0)
        tm.signal_op(0, sig, 1)
        assert tm.test(sig, gexmk.CMP_EQ, 1)
        seg.destroy()
        with pytest.raises((gexmk.SegmentError, BoundsError)):
            tm.wait_until(sig, gexmk.CMP_EQ, 1, timeout=1)
        with pytest.raises((gexmk.SegmentError, BoundsError)):
            tm.signal_fetch(sig)
        with pytest.raises((gexmk.SegmentError, BoundsError)):
            tm.put_signal(0, sig, b"x", sig, 1)
        with pytest.raises((gexmk.SegmentError, BoundsError)):
            tm.signal_op(0, sig, 1)
    finally:
        c.finalize()
    with pytest.raises(StateError):
        tm.wait_until(sig, gexmk.CMP_EQ, 1, timeout=1)
    with pytest.raises(StateError):
        tm.put_signal(0, sig, b"x", sig, 1)


def test_unpublished_own_segment():
    c = gexmk.init()
    try:
        tm = c.tm
        with pytest.raises(gexmk.SegmentError, match="no bound segment"):
            tm.wait_until(0x1000, gexmk.CMP_EQ, 1, timeout=1)
    finally:
        c.finalize()


# ---- 2. jobs on every transport ---------------------------------------------------

# Each rank put_signals to its right neighbour and waits for its left one.
# Data: BIG bytes whose first and last 8 bytes carry the iteration; the
# receiver checks them right after the signal shows the iteration, then acks
# (a put_signal back, so that pvm, which has no atomics, takes the same path).
RING = r'''
import itertools
c = gexmk.init()
tm = c.tm
me, n = tm.rank, tm.size
right, left = (me + 1) % n, (me - 1) % n
BIG = int(os.environ.get("SIG_BIG", 1 << 18))
ITERS = int(os.environ.get("SIG_ITERS", 200))
ADD = os.environ.get("SIG_ADD", "1") == "1"
SEG = 2 * BIG + 4096
if os.environ.get("SIG_CLIENT_SEG") == "1":
    mem = np.zeros(SEG, np.uint8)
    seg = c.segment_create(buffer=mem)
    c.ep(0).bind_segment(seg)
    tm.publish_bound_segment([c.ep(0)])
else:
    seg = c.segment_attach(SEG)
mine = np.asarray(seg)
SIG, ACK, CNT = 0, 8, 16            # words: data signal (from left), ack (from right), counter
W0 = 64                             # 8-word block for the _all/_any/_some forms
DATA = 4096
log("paths", {r: tm.paths(r) for r in range(n)})
if os.environ.get("SIG_EXPECT"):
    for r in range(n):
        if r != me:
            assert tm.transport(r) == os.environ["SIG_EXPECT"], tm.paths(r)
tm.barrier()

src = np.zeros(BIG, np.uint8)
body = src[8:-8]
modes = itertools.cycle(["blocking", "nb", "nbi"])
t0 = time.monotonic()
for i in range(1, ITERS + 1):
    # the right neighbour has checked iteration i-1: we may overwrite its buffer
    tm.wait_until(tm.addr(me, ACK), gexmk.CMP_GE, i - 1)
    src[:8] = np.frombuffer(np.uint64(i).tobytes(), np.uint8)
    src[-8:] = src[:8]
    body[:] = (me + i) & 0xFF
    mode = next(modes)
    args = (right, tm.addr(right, DATA), src, tm.addr(right, SIG), i)
    if mode == "blocking":
        tm.put_signal(*args)
    elif mode == "nb":
        tm.put_signal_nb(*args).wait()
    else:
        tm.put_signal_nbi(*args)
    # the left neighbour's data, as soon as its signal says iteration i
    tm.wait_until(tm.addr(me, SIG), gexmk.CMP_GE, i)
    got = mine[DATA:DATA + BIG]
    first = int(got[:8].view(np.uint64)[0])
    last = int(got[-8:].view(np.uint64)[0])
    assert first == i and last == i, f"iteration {i}: signal seen, data says {first}/{last}"
    if i % 16 == 0 or i == ITERS:
        assert (got[8:-8] == ((left + i) & 0xFF)).all(), f"iteration {i}: body"
    tm.put_signal(left, tm.addr(left, DATA + BIG), np.zeros(8, np.uint8), tm.addr(left, ACK), i)
    if mode == "nbi":
        gexmk.quiet()
tm.wait_until(tm.addr(me, ACK), gexmk.CMP_GE, ITERS)
log(f"ring: {ITERS} iterations of {BIG} B in {time.monotonic() - t0:.2f} s")
tm.barrier()

# SIGNAL_ADD: every other rank adds 1 to rank 0's counter, K times, each with a slot of data
K = 20
if ADD:
    if me != 0:
        for k in range(K):
            tm.put_signal(0, tm.addr(0, DATA + 8 * me), np.uint64(1000 * me + k).tobytes(),
                          tm.addr(0, CNT), 1, gexmk.SIGNAL_ADD)
            tm.signal_op(0, tm.addr(0, CNT), 1, gexmk.SIGNAL_ADD)
    else:
        tm.wait_until(tm.addr(0, CNT), gexmk.CMP_EQ, 2 * K * (n - 1))
        assert tm.signal_fetch(tm.addr(0, CNT)) == 2 * K * (n - 1)
        for r in range(1, n):
            assert int(mine[DATA + 8 * r:DATA + 8 * r + 8].view(np.uint64)[0]) == 1000 * r + K - 1
elif me != 0 and tm.transport(0) == "pvm":
    expect_raises(E.UnsupportedError, tm.put_signal, 0, tm.addr(0, DATA), b"x", tm.addr(0, CNT), 1,
                  gexmk.SIGNAL_ADD)
tm.barrier()

# _all / _any / _some across processes: rank 0 waits on one word per other rank
words = [tm.addr(0, W0 + 8 * (r - 1)) for r in range(1, n)]
if me != 0:
    tm.put_signal(0, tm.addr(0, DATA + 64 * me), b"phase-a", tm.addr(0, W0 + 8 * (me - 1)), 1)
else:
    tm.wait_until_all(words, gexmk.CMP_EQ, 1)
    assert tm.test_all(words, gexmk.CMP_EQ, 1)
    assert tm.test_some(words, gexmk.CMP_EQ, 2) == []
    assert tm.test_any(words, gexmk.CMP_EQ, 2) is None
tm.barrier()
if me == n - 1:
    tm.put_signal(0, tm.addr(0, DATA), b"phase-b", tm.addr(0, W0 + 8 * (me - 1)), 2)
elif me == 0:
    assert tm.wait_until_any(words, gexmk.CMP_EQ, 2) == n - 2
    assert tm.wait_until_some(words, gexmk.CMP_EQ, 2) == [n - 2]
    assert bytes(mine[DATA:DATA + 7]) == b"phase-b"
    assert tm.test_some(words, gexmk.CMP_GE, [1] * (n - 1)) == list(range(n - 1))
tm.barrier()
print(f"SIGNAL-OK {me}", flush=True)
c.finalize()
'''

NRANKS = pytest.mark.parametrize("n", [2, 4])


def _ring(tmp_path, n, env, launcher_timeout=120):
    r = mp_util.run_job(tmp_path, RING, n, env=env, launcher_timeout=launcher_timeout)
    r.check()
    for rank in range(n):
        assert f"SIGNAL-OK {rank}" in r.stdout, r.report()
    return r


@pytest.mark.timeout(150)
@NRANKS
def test_ring_nbrhd(tmp_path, n):
    _ring(tmp_path, n, {"GEXMK_TRANSPORT": "auto", "SIG_EXPECT": "nbrhd", "GEXMK_TIMEOUT": 60})


@pytest.mark.timeout(150)
@NRANKS
def test_ring_pvm_library_segment(tmp_path, n):
    _ring(tmp_path, n, {"GEXMK_TRANSPORT": "pvm", "SIG_EXPECT": "pvm", "SIG_ADD": "0",
                        "SIG_ITERS": 100, "GEXMK_TIMEOUT": 60})


@pytest.mark.timeout(150)
@NRANKS
def test_ring_pvm_client_segment(tmp_path, n):
    _ring(tmp_path, n, {"SIG_CLIENT_SEG": "1", "SIG_EXPECT": "pvm", "SIG_ADD": "0",
                        "SIG_ITERS": 100, "GEXMK_TIMEOUT": 60})


def _need_ofi(provider):
    ofi = pytest.importorskip("gexmk.fabric_probe", reason="gexmk was built without libfabric")
    pytest.importorskip("gexmk.transports.ofi", reason="no ofi transport in this build")
    try:
        found = ofi.providers(provider)
    except Exception as e:      # noqa: BLE001 - any probing failure means "not usable here"
        pytest.skip(f"libfabric provider {provider!r}: probing failed: {e}")
    if not found:
        pytest.skip(f"libfabric provider {provider!r} is not available here")


OFI = pytest.mark.parametrize("provider", ["tcp;ofi_rxm", "shm"], ids=["tcp_rxm", "shm"])


@pytest.mark.timeout(200)
@NRANKS
@OFI
def test_ring_ofi(tmp_path, n, provider):
    _need_ofi(provider)
    _ring(tmp_path, n, {"GEXMK_TRANSPORT": "ofi", "GEXMK_OFI_PROVIDER": provider,
                        "FI_PROVIDER": None, "SIG_EXPECT": "ofi", "SIG_ITERS": 60,
                        "SIG_BIG": 1 << 16, "GEXMK_TIMEOUT": 60}, launcher_timeout=170)


@pytest.mark.timeout(200)
@OFI
def test_ring_ofi_one_endpoint_for_rma_and_atomics(tmp_path, provider):
    """GEXMK_OFI_SPLIT=0: RMA and atomics share one libfabric endpoint."""
    _need_ofi(provider)
    _ring(tmp_path, 2, {"GEXMK_TRANSPORT": "ofi", "GEXMK_OFI_PROVIDER": provider,
                        "GEXMK_OFI_SPLIT": "0", "FI_PROVIDER": None, "SIG_EXPECT": "ofi",
                        "SIG_ITERS": 60, "SIG_BIG": 1 << 16, "GEXMK_TIMEOUT": 60},
          launcher_timeout=170)


# ---- 3. a peer dies while we wait ------------------------------------------------

DEATH = r'''
c = gexmk.init()
tm = c.tm
seg = c.segment_attach(4096)
tm.barrier()
if tm.rank == 1:
    tm.signal_op(0, tm.addr(0, 8), 1)          # the route is in use
    time.sleep(0.3)
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)
if tm.rank == 0:
    tm.wait_until(tm.addr(0, 8), gexmk.CMP_EQ, 1)
    t = time.monotonic()
    e = expect_raises(E.PeerDeadError, tm.wait_until, tm.addr(0, 0), gexmk.CMP_EQ, 1)
    took = time.monotonic() - t
    log(f"wait_until raised after {took:.2f} s: {e}")
    assert "team rank 1" in str(e) and f"0x{tm.addr(0, 0):x}" in str(e), e
    assert took < 30, took
    e = expect_raises(E.PeerDeadError, tm.wait_until_all, [tm.addr(0, 0), tm.addr(0, 8)],
                      gexmk.CMP_EQ, 5)
    print("DEATH-OK", flush=True)
c.finalize()
'''


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["auto", "ofi"])
def test_peer_killed_while_waiting(tmp_path, transport):
    env = {"GEXMK_TRANSPORT": transport, "GEXMK_TIMEOUT": 60}
    if transport == "ofi":
        _need_ofi("tcp;ofi_rxm")
        env.update({"GEXMK_OFI_PROVIDER": "tcp;ofi_rxm", "FI_PROVIDER": None})
    r = mp_util.run_job(tmp_path, DEATH, 2, env=env, keep_going=True, launcher_timeout=90)
    assert not r.timed_out, r.report()
    assert "DEATH-OK" in r.stdout, r.report()
    assert r.returncode == 128 + signal.SIGKILL, r.report()


# ---- 4. more ranks than cores ------------------------------------------------------

PINGPONG = r'''
os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])
c = gexmk.init()
tm = c.tm
me, n = tm.rank, tm.size
seg = c.segment_attach(4096)
peer = me ^ 1
ITERS = 3000
x = np.zeros(1, np.uint64)
tm.barrier()
t0 = time.monotonic()
for i in range(1, ITERS + 1):
    if me % 2 == 0:
        x[0] = i
        tm.put_signal(peer, tm.addr(peer, 64), x, tm.addr(peer, 0), i)
        tm.wait_until(tm.addr(me, 0), gexmk.CMP_EQ, i)
    else:
        tm.wait_until(tm.addr(me, 0), gexmk.CMP_EQ, i)
        assert int(np.asarray(seg)[64:72].view(np.uint64)[0]) == i
        tm.put_signal(peer, tm.addr(peer, 64), x, tm.addr(peer, 0), i)
took = time.monotonic() - t0
log(f"{ITERS} round trips on {len(os.sched_getaffinity(0))} cores: {took / ITERS * 1e6:.1f} us each")
tm.barrier()
print(f"PINGPONG-OK {me}", flush=True)
c.finalize()
'''


@pytest.mark.timeout(120)
def test_four_ranks_on_two_cores_pingpong(tmp_path):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs")
    r = mp_util.run_job(tmp_path, PINGPONG, 4, env={"GEXMK_TIMEOUT": 60}, launcher_timeout=90)
    r.check()
    for rank in range(4):
        assert f"PINGPONG-OK {rank}" in r.stdout, r.report()


# A token ring on two cores where every wait sleeps at once (no spin, no yield,
# no GIL spin) and each sleep lasts 100 s unless a writer wakes it: the job's
# limit (60 s) is shorter than one sleep, so a wake-up lost between a writer's
# signal and a sleeper's futex fails the job instead of passing slowly.  The
# writes that must wake: put_signal (SET), signal_op (ADD) and an atomic.
SLEEPRING = r'''
os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])
c = gexmk.init()
tm = c.tm
me, n = tm.rank, tm.size
right = (me + 1) % n
seg = c.segment_attach(4096)
mine = np.asarray(seg)
TOKEN, CNT, FLAG, DATA = 0, 8, 16, 64
ITERS = 300
x = np.zeros(1, np.uint64)
ad = tm.ad_create(gexmk.DT_U64, gexmk.OP_SET | gexmk.OP_FADD)
tm.barrier()
gexmk.core._wait_tuning(spin_us=0, yield_us=0, nap_us=(100e6, 100e6), gil_spin=0)
gexmk.core._wait_stats(reset=True)
t0 = time.monotonic()
for i in range(1, ITERS + 1):
    # the token goes round: rank 0 starts lap i, the others pass it on
    if me != 0:
        tm.wait_until(tm.addr(me, TOKEN), gexmk.CMP_GE, i)
        assert int(mine[DATA:DATA + 8].view(np.uint64)[0]) == i * 1000 + me - 1
    x[0] = i * 1000 + me
    tm.put_signal(right, tm.addr(right, DATA), x, tm.addr(right, TOKEN), i)
    if me == 0:
        tm.wait_until(tm.addr(me, TOKEN), gexmk.CMP_GE, i)
        assert int(mine[DATA:DATA + 8].view(np.uint64)[0]) == i * 1000 + n - 1
# SIGNAL_ADD from every other rank into rank 0's counter, then an atomic flag
if me != 0:
    for k in range(50):
        tm.signal_op(0, tm.addr(0, CNT), 1, gexmk.SIGNAL_ADD)
else:
    tm.wait_until(tm.addr(0, CNT), gexmk.CMP_EQ, 50 * (n - 1))
took = time.monotonic() - t0
if me == n - 1:
    time.sleep(0.5)         # rank 0 is asleep on the flag by now: only the atomic wakes it
    ad.op(0, tm.addr(0, FLAG), gexmk.OP_SET, 7)
elif me == 0:
    before = gexmk.core._wait_stats()["woken"]
    tm.wait_until(tm.addr(0, FLAG), gexmk.CMP_EQ, 7)
    assert gexmk.core._wait_stats()["woken"] > before, gexmk.core._wait_stats()
st = gexmk.core._wait_stats()
log(f"{ITERS} laps of {n} ranks on 2 cores, every wait asleep: {took / ITERS * 1e6:.1f} us "
    f"a lap; {st}")
gexmk.core._wait_tuning(defaults=True)
tm.barrier()
print(f"SLEEPRING-OK {me}", flush=True)
c.finalize()
'''


@pytest.mark.timeout(120)
@NRANKS
def test_sleeping_waiters_are_woken_by_signals_and_atomics(tmp_path, n):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs")
    r = mp_util.run_job(tmp_path, SLEEPRING, n, env={"GEXMK_TIMEOUT": 300}, launcher_timeout=60)
    assert not r.timed_out, r.report()
    r.check()
    for rank in range(n):
        assert f"SLEEPRING-OK {rank}" in r.stdout, r.report()


# ---- 5. device segments (GPU machines; skipped here without a driver) ----------------

def _gpus():
    try:
        from gexmk.kinds import cuda
        p = cuda.probe()
    except Exception:           # noqa: BLE001 - any failure means: no usable GPU
        return 0
    return p.get("device_count", 0) if p.get("driver_loaded") else 0


needs_gpu = pytest.mark.skipif(_gpus() < 1, reason="no NVIDIA driver or device on this machine")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.timeout(120)
def test_put_signal_into_own_process_device_segment(client):
    """The self device path: the copy completes before the device atomic
    writes the signal; SET and ADD; NB and NBI; waiting on a device word from
    the host is refused with UnsupportedError."""
    hseg = client.segment_attach(1 << 20)
    mk = client.mk_create(gexmk.CUDA_UVA, 0)
    ep1 = client.ep_create()
    d1 = client.segment_create(1 << 20, kind=mk)
    ep1.bind_segment(d1)
    to_d1 = client.ep(0).pair(1)
    assert to_d1.paths(0)["rma"] == "self"
    sig, data = d1.address, d1.address + 4096
    src = np.zeros(256 << 10, np.uint8)
    back = np.zeros_like(src)
    for i in range(1, 21):
        src[:] = i
        if i % 3 == 0:
            to_d1.put_signal_nb(0, data, src, sig, i).wait()
        elif i % 3 == 1:
            to_d1.put_signal(0, data, src, sig, i)
        else:
            to_d1.put_signal_nbi(0, data, src, sig, i)
            gexmk.quiet()
        assert to_d1.get_val(0, sig) == i
        to_d1.get(back, 0, data)
        assert (back == i).all()
    to_d1.signal_op(0, sig, 5, gexmk.SIGNAL_ADD)
    to_d1.put_signal(0, data, src[:8], sig, 5, gexmk.SIGNAL_ADD)
    assert to_d1.get_val(0, sig) == 30
    own = ep1.pair(1)
    with pytest.raises(gexmk.UnsupportedError, match="device.*signal_wait_until_on_stream"):
        own.wait_until(sig, gexmk.CMP_EQ, 30, timeout=1)


DEVICE_RING = r'''
c = gexmk.init()
tm = c.tm
me, peer = tm.rank, 1 - tm.rank
hseg = c.segment_attach(1 << 16)                 # EP 0: host, acks
mk = c.mk_create(gexmk.CUDA_UVA, 0)
ep1 = c.ep_create()
dseg = c.segment_create(4 << 20, kind=mk)
ep1.bind_segment(dseg)
tm.publish_bound_segment([ep1])
dev = c.ep(0).pair(1)                             # host EP 0 -> EP 1 of each rank
assert dev.paths(peer)["rma"] == "nbrhd", dev.paths(peer)
ad = dev.ad_create(gexmk.DT_U64, gexmk.OP_GET)
BIG = 1 << 20
src = np.zeros(BIG, np.uint8)
back = np.zeros(BIG, np.uint8)
for i in range(1, 41):
    if me == 0:
        tm.wait_until(tm.addr(0, 0), gexmk.CMP_GE, i - 1)      # rank 1 checked i-1
        src[:] = i & 0xFF
        dev.put_signal(1, dev.addr(1, 4096), src, dev.addr(1, 0), i)
    else:
        t = time.monotonic()
        while ad.op(1, dev.addr(1, 0), gexmk.OP_GET) < i:       # the signal, by device atomic
            assert time.monotonic() - t < 30, f"signal {i} never came"
        dev.get(back, 1, dev.addr(1, 4096))
        assert (back == (i & 0xFF)).all(), f"iteration {i}: signal before data"
        tm.put_signal(0, tm.addr(0, 64), b"ack", tm.addr(0, 0), i)
tm.barrier()
print("DEVICE-OK", me, flush=True)
c.finalize()
'''


@pytest.mark.gpu
@needs_gpu
@pytest.mark.timeout(150)
def test_put_signal_into_another_process_device_segment(tmp_path):
    """The nbrhd device path across processes: 40 put_signals of 1 MiB into
    the peer's device segment; the peer reads the signal by device atomic and
    finds the data complete every time."""
    r = mp_util.run_job(tmp_path, DEVICE_RING, 2, launcher_timeout=120,
                        env={"GEXMK_TRANSPORT": None, "GEXMK_TIMEOUT": 60})
    r.check()
    assert r.stdout.count("DEVICE-OK") == 2, r.report()
