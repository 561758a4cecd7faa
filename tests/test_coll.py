"""Barriers and collectives on the data path (core.src/coll.pxi).

1. One process: every collective is a copy (or identity) and bad input
   raises (TM-pair, root out of range, size/dtype mismatch, bitwise op on a
   float dtype, unknown op).
2. Jobs of 2 and 4 ranks on the default transports (nbrhd on one node) and
   2 ranks over ofi (tcp;ofi_rxm): a barrier really orders (a rank that
   sleeps before entering puts a value first; nobody leaves before it is
   there), barrier_nb, split/dup/create team barriers independent of the
   world's, every collective and op on several dtypes checked against numpy
   (sizes larger than the scratch, so chunked), NB forms (several
   outstanding), and members passing mismatched buffers.
3. A rank that enters a barrier its peers never enter (they went on to
   finalize) gets gexmk.TimeoutError naming the team and the barrier, with
   timeout= and with GEXMK_TIMEOUT.
"""
import numpy as np
import pytest

import gexmk
from gexmk import ArgumentError, RankError, StateError

try:
    from . import mp_util
except ImportError:
    import mp_util


# ---- 1. one process --------------------------------------------------------------

def test_single_process_collectives():
    with gexmk.init() as c:
        tm = c.tm
        tm.barrier()
        tm.barrier_nb().wait()
        a = np.arange(10, dtype=np.float64)
        r = np.zeros_like(a)
        tm.allreduce(a, r, "sum")
        assert (r == a).all()
        tm.allreduce(a, r, gexmk.OP_MULT)
        assert (r == a).all()
        g = np.zeros(10)
        tm.gather(a, g, 0)
        assert (g == a).all()
        b = a.copy()
        tm.bcast(b, 0)
        assert (b == a).all()
        ev = tm.allgather_nb(a, g)
        ev.wait()
        assert (g == a).all()
        with pytest.raises(StateError, match="TM-pair"):
            c.ep(0).pair(0).barrier()
        with pytest.raises(RankError, match="root 1"):
            tm.bcast(b, 1)
        with pytest.raises(ArgumentError, match="recv"):
            tm.allreduce(a, np.zeros(9), "sum")
        with pytest.raises(ArgumentError, match="recv"):
            tm.allreduce(a, np.zeros(10, np.float32), "sum")
        with pytest.raises(TypeError, match="bitwise"):
            tm.allreduce(a, r, "xor")
        with pytest.raises(ArgumentError, match="op must be"):
            tm.allreduce(a, r, "median")
        with pytest.raises(TypeError, match="writable numpy array"):
            tm.allreduce(a, [0.0] * 10, "sum")
        with pytest.raises(TypeError, match="dtype"):
            tm.bcast(np.array(["x"]), 0)
        i = np.arange(4, dtype=np.int64)
        tm.allreduce(i, i, "xor")           # in place
        assert (i == np.arange(4)).all()


# ---- 2. jobs ------------------------------------------------------------------------

WORKER = r'''
import functools
c = gexmk.init()
tm = c.tm
n, me = tm.size, tm.rank
seg = c.segment_attach(4096)
words = np.asarray(seg).view(np.int64)
want_path = os.environ.get("COLL_PATH") or peer_transport()
assert tm.transport((me + 1) % n) == want_path, tm.transport((me + 1) % n)

# a barrier orders: the last rank sleeps, puts a value everywhere, then enters
for it in range(3):
    if me == n - 1:
        time.sleep(0.2)
        for r in range(n):
            tm.put_val(r, tm.addr(r, 8 * it), 100 + it)
    if it == 1:
        tm.barrier_nb().wait()
    else:
        tm.barrier()
    assert words[it] == 100 + it, (it, words[:4])

# barrier_nb is one barrier: test() drives it, wait() finishes it
ev = tm.barrier_nb()
while not ev.test():
    time.sleep(0.001)
ev.wait()

# team barriers are independent of the world's and of each other
sub = tm.split(me % 2)
d = tm.dup()
rev = tm.create(list(reversed(range(n))))
for _ in range(3 if me % 2 == 0 else 1):
    sub.barrier()
d.barrier()
rev.barrier_nb().wait()
tm.barrier()
d.barrier()
assert sub.size == (n + 1 - me % 2) // 2

# collectives against numpy, in rank order
def data(r, dt, m):
    x = (np.arange(m) * (r + 1) + r) % 5 + 1
    return x.astype(dt)

SIZES = [1, 37, int(os.environ["COLL_BIG"])]
DTYPES = [np.float64, np.int32, np.uint8, np.complex128, np.bool_]
OPS = ["sum", gexmk.OP_MULT, "min", gexmk.OP_MAX, "and", gexmk.OP_OR, "xor"]
UF = {"sum": np.add, gexmk.OP_MULT: np.multiply, "min": np.minimum, gexmk.OP_MAX: np.maximum,
      "and": np.bitwise_and, gexmk.OP_OR: np.bitwise_or, "xor": np.bitwise_xor}
checked = 0
for dt in DTYPES:
    for m in SIZES:
        mine = data(me, dt, m)
        alls = [data(r, dt, m) for r in range(n)]
        for root in range(n):
            b = mine.copy()
            tm.bcast(b, root)
            assert (b == alls[root]).all(), (dt, m, root)
        for op in OPS:
            if op in ("and", gexmk.OP_OR, "xor") and np.dtype(dt).kind not in "biu":
                expect_raises(TypeError, tm.allreduce, mine, np.empty_like(mine), op)
                continue
            if op in ("min", gexmk.OP_MAX) and np.dtype(dt).kind == "c":
                continue
            want = alls[0].copy()
            for x in alls[1:]:
                UF[op](want, x, out=want)
            out = np.zeros_like(mine)
            tm.allreduce(mine, out, op)
            assert (out == want).all(), (dt, m, op)
            root = (m + checked) % n
            out = np.zeros_like(mine)
            tm.reduce(mine, out if me == root else None, op, root)
            if me == root:
                assert (out == want).all(), (dt, m, op, root)
            checked += 1
        g = np.zeros(n * m, dt)
        tm.allgather(mine, g)
        assert (g == np.concatenate(alls)).all(), (dt, m)
        root = m % n
        g = np.zeros(n * m, dt)
        tm.gather(mine, g if me == root else None, root)
        if me == root:
            assert (g == np.concatenate(alls)).all(), (dt, m)

# 2-D arrays and in place
x = np.full((3, 4), me + 1, np.int64)
tm.allreduce(x, x, "sum")
assert (x == n * (n + 1) // 2).all()

# NB forms, several outstanding: each completes in order
m = SIZES[-1]
mine = data(me, np.float64, m)
alls = [data(r, np.float64, m) for r in range(n)]
b = mine.copy()
s = np.zeros(m)
g = np.zeros(n * m)
e1 = tm.bcast_nb(b, 0)
e2 = tm.allreduce_nb(mine, s, "sum")
e3 = tm.allgather_nb(mine, g)
e4 = sub.barrier_nb()
e5 = tm.reduce_nb(mine, s.copy() if me == 0 else None, "max", 0)
e6 = tm.gather_nb(mine, g.copy() if me == n - 1 else None, n - 1)
gexmk.wait_all([e6, e5, e4, e3, e2, e1])
assert (b == alls[0]).all() and (s == sum(alls)).all() and (g == np.concatenate(alls)).all()

# collectives on split teams
v = np.array([me], np.int64)
o = np.zeros(1, np.int64)
sub.allreduce(v, o, "sum")
assert o[0] == sum(r for r in range(n) if r % 2 == me % 2), o

# mismatched buffers across members: every member that reads says so
k = 5 + (me == n - 1)
e = expect_raises(E.ArgumentError, tm.allgather, np.zeros(k), np.zeros(n * k))
assert "matching" in str(e), e
e = expect_raises(E.ArgumentError, tm.allreduce, np.zeros(4, np.int32 if me else np.float32),
                  np.zeros(4, np.int32 if me else np.float32), "sum")
tm.barrier()
print("COLL-OK", checked, flush=True)
c.finalize()
'''

NRANKS = pytest.mark.parametrize("n", [2, 4])


@pytest.mark.timeout(120)
@NRANKS
def test_collectives_nbrhd(tmp_path, n):
    r = mp_util.run_job(tmp_path, WORKER, n, env={"GEXMK_COLL_SCRATCH": 4096, "COLL_BIG": 1500,
                                                  "GEXMK_TIMEOUT": 60}, launcher_timeout=100)
    r.check()
    assert r.stdout.count("COLL-OK") == n, r.report()


def _need_ofi(provider):
    ofi = pytest.importorskip("gexmk.fabric_probe", reason="gexmk was built without libfabric")
    pytest.importorskip("gexmk.transports.ofi", reason="no ofi transport in this build")
    try:
        found = ofi.providers(provider)
    except Exception as e:      # noqa: BLE001 - any probing failure means "not usable here"
        pytest.skip(f"libfabric provider {provider!r}: probing failed: {e}")
    if not found:
        pytest.skip(f"libfabric provider {provider!r} is not available here")


@pytest.mark.timeout(150)
def test_collectives_ofi(tmp_path):
    _need_ofi("tcp;ofi_rxm")
    r = mp_util.run_job(tmp_path, WORKER, 2, env={
        "GEXMK_TRANSPORT": "ofi", "GEXMK_OFI_PROVIDER": "tcp;ofi_rxm", "FI_PROVIDER": None,
        "GEXMK_COLL_SCRATCH": 4096, "COLL_BIG": 1500, "GEXMK_TIMEOUT": 60, "COLL_PATH": "ofi"},
        launcher_timeout=130)
    r.check()
    assert r.stdout.count("COLL-OK") == 2, r.report()


# allreduce of chunks of at least 16 KiB runs as reduce-scatter + allgather
# (core.src/reduce.pxi): with 64 KiB of scratch, sizes around and
# across the chunk limits, uneven slices, the C loops and the numpy ones,
# NB on some ranks beside blocking on the others, reduce beside it, and
# members passing sizes that would pick different algorithms.
SPLIT = r"""
c = gexmk.init()
tm = c.tm
n, me = tm.size, tm.rank

def data(r, dt, m):
    x = (np.arange(m) * (r + 3) + 7 * r) % 11 + 1
    return x.astype(dt)

UF = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum,
      "xor": np.bitwise_xor, "or": np.bitwise_or}
cases = [(np.float64, 2500), (np.float64, 3 * 8190 + 5), (np.float32, 4097 * 3),
         (np.int64, 8190 * 2 + n - 1), (np.int16, 8200 * 5 + 3), (np.uint8, 70001),
         (np.complex128, 1500), (np.bool_, 20000), (np.float16, 9000)]
done = 0
for dt, m in cases:
    mine = data(me, dt, m)
    alls = [data(r, dt, m) for r in range(n)]
    for op, uf in UF.items():
        if op in ("xor", "or") and np.dtype(dt).kind not in "biu":
            continue
        if op in ("min", "max") and np.dtype(dt).kind == "c":
            continue
        want = alls[0].copy()
        for x in alls[1:]:
            uf(want, x, out=want)
        out = np.zeros_like(mine)
        if (done + me) % 3 == 0:
            tm.allreduce_nb(mine, out, op).wait()
        else:
            tm.allreduce(mine, out, op)
        assert out.tobytes() == want.tobytes(), (dt, m, op, out[:5], want[:5])
        inplace = mine.copy()
        tm.allreduce(inplace, inplace, op)
        assert inplace.tobytes() == want.tobytes(), (dt, m, op, "in place")
        root = done % n
        out = np.zeros_like(mine)
        tm.reduce(mine, out if me == root else None, op, root)
        if me == root:
            assert out.tobytes() == want.tobytes(), (dt, m, op, root)
        done += 1

# numpy's results where C could differ: NaN operands of min/max (the NaN is
# returned, as np.minimum does), integer sums and products that wrap
for m in (7, 5000):
    for dt, op in ((np.float64, "min"), (np.float32, "max"), (np.float64, "sum"),
                   (np.int32, "sum"), (np.int64, "prod"), (np.uint16, "prod"), (np.int8, "sum")):
        alls = []
        for r in range(n):
            if np.dtype(dt).kind == "f":
                x = data(r, dt, m)
                x[r::n + 1] = np.nan
                x[(r + 1) % m] = -np.inf
            else:
                info = np.iinfo(dt)
                x = (np.arange(m, dtype=np.int64) * 7919 * (r + 1) % (int(info.max) - 3) + 3).astype(dt)
            alls.append(x)
        want = alls[0].copy()
        for x in alls[1:]:
            UF[op](want, x, out=want)
        out = np.zeros_like(alls[me])
        tm.allreduce(alls[me], out, op)
        assert out.tobytes() == want.tobytes(), (dt, m, op, out[:8], want[:8])

# sizes that pick different algorithms (8 KB: whole, 24 KB: split): all raise
k = 1000 if me == 0 else 3000
e = expect_raises(E.ArgumentError, tm.allreduce, np.ones(k), np.zeros(k), "sum")
assert "matching" in str(e), e
tm.barrier()
x = np.full(5000, me + 1.0)
tm.allreduce(x, x, "sum")
assert (x == n * (n + 1) / 2).all()
print("SPLIT-OK", done, flush=True)
c.finalize()
"""


@pytest.mark.timeout(120)
@NRANKS
def test_allreduce_split_nbrhd(tmp_path, n):
    r = mp_util.run_job(tmp_path, SPLIT, n, env={"GEXMK_COLL_SCRATCH": 65536, "GEXMK_TIMEOUT": 60},
                        launcher_timeout=100)
    r.check()
    assert r.stdout.count("SPLIT-OK") == n, r.report()


@pytest.mark.timeout(150)
def test_allreduce_split_ofi(tmp_path):
    _need_ofi("tcp;ofi_rxm")
    r = mp_util.run_job(tmp_path, SPLIT, 2, env={
        "GEXMK_TRANSPORT": "ofi", "GEXMK_OFI_PROVIDER": "tcp;ofi_rxm", "FI_PROVIDER": None,
        "GEXMK_COLL_SCRATCH": 65536, "GEXMK_TIMEOUT": 60}, launcher_timeout=130)
    r.check()
    assert r.stdout.count("SPLIT-OK") == 2, r.report()


# ---- 3. unmatched barriers ---------------------------------------------------------

SKIP = r'''
c = gexmk.init()
tm = c.tm
tm.barrier()
d = tm.dup()
d.barrier()
mode = os.environ["SKIP_MODE"]
if tm.rank == 0:
    t0 = time.monotonic()
    if mode == "arg":
        e = expect_raises(E.TimeoutError, tm.barrier, timeout=0.5)
    else:
        e = expect_raises(E.TimeoutError, d.barrier)
    log(f"after {time.monotonic() - t0:.2f} s: {e}")
    name = "tm0" if mode == "arg" else d.id
    assert f"barrier #" in str(e) and f"team {name}" in str(e) and "team rank 1" in str(e), e
    # the team's barriers can no longer be matched: say so instead of passing
    bad = tm if mode == "arg" else d
    e = expect_raises(E.StateError, bad.barrier)
    assert "can no longer be matched" in str(e), e
    print("SKIP-OK", flush=True)
elif mode == "env":
    time.sleep(2.6)       # finalize's sync only after rank 0's wait has expired
c.finalize()
'''


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["arg", "env"])
def test_unmatched_barrier_times_out(tmp_path, mode):
    env = {"SKIP_MODE": mode, "GEXMK_TIMEOUT": 5 if mode == "arg" else 2}
    r = mp_util.run_job(tmp_path, SKIP, 2, env=env, launcher_timeout=40)
    r.check()
    assert "SKIP-OK" in r.stdout, r.report()


# NB collectives whose events the program drops at once: the collective still
# completes on every member (a later one matches, with the right values) and
# nothing lands in memory allocated after the drop.
DROPPED = r"""
c = gexmk.init()
tm = c.tm
n, me = tm.size, tm.rank
seg = c.segment_attach(1 << 16)
tm.barrier()
tm.allreduce_nb(np.full(1 << 14, me + 1, np.int64), np.zeros(1 << 14, np.int64), "sum")
tm.bcast_nb(np.full(1 << 16, me + 7, np.uint8), 0)
tm.barrier_nb()
junk = [np.zeros(1 << 16, np.uint8) for _ in range(6)]
import gc; gc.collect()
tm.barrier()
got = np.zeros(4, np.int64)
tm.allreduce(np.full(4, me + 1, np.int64), got, "sum")
assert (got == n * (n + 1) // 2).all(), got
b = np.full(64, me, np.uint8)
tm.bcast(b, 0)
assert (b == 0).all(), b
assert not any(j.any() for j in junk), "a dropped collective wrote into reused memory"
c.finalize()
print("DROPPED-OK")
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["nbrhd", "ofi"])
def test_dropped_nb_collective_events(tmp_path, transport):
    env = {"GEXMK_TIMEOUT": 30}
    if transport == "ofi":
        _need_ofi("tcp;ofi_rxm")
        env.update(GEXMK_TRANSPORT="ofi", GEXMK_OFI_PROVIDER="tcp;ofi_rxm", FI_PROVIDER=None)
    r = mp_util.run_job(tmp_path, DROPPED, 3, env=env, launcher_timeout=90)
    r.check()
    assert r.stdout.count("DROPPED-OK") == 3, r.report()
