"""Remote atomics: every data type x every operation against a Python
reference, argument checking, and exact counts under contention between
processes (``python -m gexmk.run``)."""
import itertools
import textwrap

import numpy as np
import pytest

import gexmk
from gexmk import BoundsError, RankError, StateError

try:
    from . import mp_util
except ImportError:
    import mp_util

DTS = {gexmk.DT_I32: np.int32, gexmk.DT_U32: np.uint32, gexmk.DT_I64: np.int64,
       gexmk.DT_U64: np.uint64, gexmk.DT_FLT: np.float32, gexmk.DT_DBL: np.float64}
DT_IDS = {gexmk.DT_I32: "I32", gexmk.DT_U32: "U32", gexmk.DT_I64: "I64",
          gexmk.DT_U64: "U64", gexmk.DT_FLT: "FLT", gexmk.DT_DBL: "DBL"}
FLOATS = (gexmk.DT_FLT, gexmk.DT_DBL)

OPS = {name: getattr(gexmk, "OP_" + name) for name in
       ["SET", "GET", "SWAP", "CAS", "FCAS", "ADD", "FADD", "SUB", "FSUB", "INC", "FINC",
        "DEC", "FDEC", "AND", "FAND", "OR", "FOR", "XOR", "FXOR", "MIN", "FMIN", "MAX", "FMAX"]}
BITWISE = {"AND", "FAND", "OR", "FOR", "XOR", "FXOR"}
FETCHING = {"GET", "SWAP", "FCAS", "FADD", "FSUB", "FINC", "FDEC", "FAND", "FOR", "FXOR",
            "FMIN", "FMAX"}
NO_OPERAND = {"GET", "INC", "FINC", "DEC", "FDEC"}
TWO_OPERANDS = {"CAS", "FCAS"}


def int_range(dt):
    info = np.iinfo(DTS[dt])
    return int(info.min), int(info.max)


def wrap(dt, x):
    lo, hi = int_range(dt)
    m = hi - lo + 1
    return (x - lo) % m + lo


def reference(dt, name, old, a, b):
    """(new value, fetched value or None) of op ``name`` on ``old``, as the C
    semantics define it: integers wrap, floats round to the type."""
    base = name[1:] if name.startswith("F") and name[1:] in OPS else name
    if dt in FLOATS:
        T = DTS[dt]
        o, x = T(old), T(a) if a is not None else None
        with np.errstate(over="ignore"):
            new = {
                "SET": lambda: x, "GET": lambda: o, "SWAP": lambda: x,
                "CAS": lambda: T(b) if o.tobytes() == x.tobytes() else o,
                "ADD": lambda: T(o + x), "SUB": lambda: T(o - x),
                "INC": lambda: T(o + T(1)), "DEC": lambda: T(o - T(1)),
                "MIN": lambda: x if x < o else o, "MAX": lambda: x if x > o else o,
            }[base]()
        return float(new), (float(o) if name in FETCHING else None)
    new = {
        "SET": lambda: a, "GET": lambda: old, "SWAP": lambda: a,
        "CAS": lambda: b if old == a else old,
        "ADD": lambda: old + a, "SUB": lambda: old - a,
        "INC": lambda: old + 1, "DEC": lambda: old - 1,
        "AND": lambda: old & a, "OR": lambda: old | a, "XOR": lambda: old ^ a,
        "MIN": lambda: min(old, a), "MAX": lambda: max(old, a),
    }[base]()
    return wrap(dt, new), (old if name in FETCHING else None)


def cases(dt, name):
    """(old, operand1, operand2) triples, with edge values of the type."""
    if dt in FLOATS:
        vals = [0.0, 1.5, -2.25, 1e30 if dt == gexmk.DT_FLT else 1e300, -0.0, 3.0e-5]
        pairs = list(itertools.product(vals, [2.0, -1.25, 1e-8, 3.0e-5]))
    else:
        lo, hi = int_range(dt)
        vals = sorted({0, 1, 5, hi, lo, hi - 1, lo + 1, (hi + 1) // 3})
        ops = sorted({1, 3, hi, lo, 0x5A5A5A5A % (hi + 1)} | ({-1, -7} if lo < 0 else set()))
        pairs = list(itertools.product(vals, ops))
    out = []
    for old, a in pairs:
        if name in TWO_OPERANDS:
            out.append((old, old, a))          # compare equal: succeeds
            out.append((old, a, old))          # (mostly) fails
        elif name in NO_OPERAND:
            out.append((old, None, None))
        else:
            out.append((old, a, None))
    return out


ALL = [(dt, name) for dt in DTS for name in OPS if not (dt in FLOATS and name in BITWISE)]


@pytest.fixture
def seg(client):
    return client.segment_attach(4096)


@pytest.mark.parametrize("dt,name", ALL, ids=[f"{DT_IDS[d]}-{n}" for d, n in ALL])
def test_op_against_reference(client, seg, dt, name):
    tm = client.tm
    op = OPS[name]
    ad = tm.ad_create(dt, op)
    T = DTS[dt]
    off = 64
    cell = np.asarray(seg)[off:off + T().itemsize].view(T)
    neighbours = np.asarray(seg)[:off]
    for old, a, b in cases(dt, name):
        cell[0] = T(old)
        old_seen = cell[0].item()
        want_new, want_fetch = reference(dt, name, old_seen, a, b)
        got = ad.op(0, seg.address + off, op, a, b)
        if name in FETCHING:
            assert got == want_fetch or (got != got and want_fetch != want_fetch), \
                (name, old, a, b, got, want_fetch)
            assert type(got) is (float if dt in FLOATS else int)
        else:
            assert got is None
        new = cell[0].item()
        if dt in FLOATS:
            assert np.array(new, T).tobytes() == np.array(want_new, T).tobytes(), \
                (name, old, a, b, new, want_new)
        else:
            assert new == want_new, (name, old, a, b, new, want_new)
    assert not neighbours.any()
    assert not np.asarray(seg)[off + T().itemsize:].any()


@pytest.mark.parametrize("dt", list(DTS), ids=list(DT_IDS.values()))
def test_cas_success_and_failure(client, seg, dt):
    ad = client.tm.ad_create(dt, gexmk.OP_FCAS | gexmk.OP_CAS | gexmk.OP_GET)
    addr = seg.address + 8
    cell = np.asarray(seg)[8:8 + DTS[dt]().itemsize].view(DTS[dt])
    cell[0] = 5
    assert ad.op(0, addr, gexmk.OP_FCAS, 5, 9) == 5       # success: returns old
    assert ad.op(0, addr, gexmk.OP_GET) == 9
    assert ad.op(0, addr, gexmk.OP_FCAS, 5, 11) == 9      # failure: returns current
    assert ad.op(0, addr, gexmk.OP_GET) == 9
    assert ad.op(0, addr, gexmk.OP_CAS, 9, 12) is None
    assert cell[0] == 12
    assert ad.op(0, addr, gexmk.OP_CAS, 9, 13) is None
    assert cell[0] == 12


@pytest.mark.parametrize("dt", FLOATS, ids=["FLT", "DBL"])
def test_float_cas_compares_bits(client, seg, dt):
    """The documented FP CAS compares representations: a NaN matches itself,
    -0.0 does not match 0.0."""
    ad = client.tm.ad_create(dt, gexmk.OP_FCAS)
    cell = np.asarray(seg)[:8].view(DTS[dt])
    cell[0] = np.nan
    assert np.isnan(ad.op(0, seg.address, gexmk.OP_FCAS, float("nan"), 1.0))
    assert cell[0] == 1.0
    cell[0] = -0.0
    ad.op(0, seg.address, gexmk.OP_FCAS, 0.0, 2.0)
    assert cell[0] == 0.0 and np.signbit(cell[0])


@pytest.mark.parametrize("dt", list(DTS), ids=list(DT_IDS.values()))
def test_min_max(client, seg, dt):
    ad = client.tm.ad_create(dt, gexmk.OP_FMIN | gexmk.OP_FMAX | gexmk.OP_MIN | gexmk.OP_MAX)
    lo = int_range(dt)[0] if dt not in FLOATS else -1e30
    addr = seg.address
    cell = np.asarray(seg)[:8].view(DTS[dt])
    cell[0] = 10
    assert ad.op(0, addr, gexmk.OP_FMAX, 20) == 10 and cell[0] == 20
    assert ad.op(0, addr, gexmk.OP_FMAX, 3) == 20 and cell[0] == 20
    assert ad.op(0, addr, gexmk.OP_FMIN, 7) == 20 and cell[0] == 7
    ad.op(0, addr, gexmk.OP_MIN, lo)
    assert cell[0] == DTS[dt](lo)
    ad.op(0, addr, gexmk.OP_MAX, 0)
    assert cell[0] == 0


def test_integer_wrap_around(client, seg):
    tm = client.tm
    a32 = tm.ad_create(gexmk.DT_I32, gexmk.OP_FADD | gexmk.OP_FINC | gexmk.OP_FDEC)
    u32 = tm.ad_create(gexmk.DT_U32, gexmk.OP_FINC | gexmk.OP_FDEC | gexmk.OP_FSUB)
    u64 = tm.ad_create(gexmk.DT_U64, gexmk.OP_FADD | gexmk.OP_GET)
    arr = np.asarray(seg)
    arr[:4].view(np.int32)[0] = 2**31 - 1
    assert a32.op(0, seg.address, gexmk.OP_FINC) == 2**31 - 1
    assert arr[:4].view(np.int32)[0] == -2**31
    assert a32.op(0, seg.address, gexmk.OP_FDEC) == -2**31
    assert arr[:4].view(np.int32)[0] == 2**31 - 1
    assert u32.op(0, seg.address + 8, gexmk.OP_FDEC) == 0
    assert arr[8:12].view(np.uint32)[0] == 2**32 - 1
    assert u32.op(0, seg.address + 8, gexmk.OP_FINC) == 2**32 - 1
    assert u32.op(0, seg.address + 8, gexmk.OP_FSUB, 1) == 0
    assert u32.op(0, seg.address + 8, gexmk.OP_FINC) == 2**32 - 1
    arr[16:24].view(np.uint64)[0] = 2**64 - 2
    assert u64.op(0, seg.address + 16, gexmk.OP_FADD, 5) == 2**64 - 2
    assert u64.op(0, seg.address + 16, gexmk.OP_GET) == 3


def test_float_ops(client, seg):
    ad = client.tm.ad_create(gexmk.DT_DBL, gexmk.OP_FADD | gexmk.OP_FSUB | gexmk.OP_GET)
    fl = client.tm.ad_create(gexmk.DT_FLT, gexmk.OP_FADD | gexmk.OP_GET)
    assert ad.op(0, seg.address, gexmk.OP_FADD, 0.1) == 0.0
    assert ad.op(0, seg.address, gexmk.OP_FADD, 0.2) == 0.1
    assert ad.op(0, seg.address, gexmk.OP_GET) == 0.1 + 0.2
    assert ad.op(0, seg.address, gexmk.OP_FSUB, 0.5) == 0.1 + 0.2
    # float32 arithmetic, not float64
    assert fl.op(0, seg.address + 8, gexmk.OP_FADD, 1.0) == 0.0
    fl.op(0, seg.address + 8, gexmk.OP_FADD, 1e-8)
    assert fl.op(0, seg.address + 8, gexmk.OP_GET) == 1.0
    assert fl.op(0, seg.address + 8, gexmk.OP_FADD, 0.1) == 1.0
    assert fl.op(0, seg.address + 8, gexmk.OP_GET) == float(np.float32(1.0) + np.float32(0.1))


@pytest.mark.parametrize("dt", FLOATS, ids=["FLT", "DBL"])
@pytest.mark.parametrize("name", sorted(BITWISE))
def test_bitwise_on_float_rejected_at_create(client, dt, name):
    with pytest.raises(ValueError, match="bitwise"):
        client.tm.ad_create(dt, OPS[name])
    with pytest.raises(ValueError, match="bitwise"):
        client.tm.ad_create(dt, gexmk.OP_ADD | OPS[name])


def test_ad_create_bad_arguments(client):
    with pytest.raises(ValueError, match="data type"):
        client.tm.ad_create(99, gexmk.OP_ADD)
    with pytest.raises(ValueError):
        client.tm.ad_create(gexmk.DT_I64, 0)
    with pytest.raises(ValueError):
        client.tm.ad_create(gexmk.DT_I64, 1 << 30)


def test_op_not_in_domain(client, seg):
    ad = client.tm.ad_create(gexmk.DT_I64, gexmk.OP_FADD | gexmk.OP_GET)
    with pytest.raises(ValueError, match="not in this domain"):
        ad.op(0, seg.address, gexmk.OP_SUB, 1)
    with pytest.raises(ValueError, match="one OP_"):
        ad.op(0, seg.address, gexmk.OP_FADD | gexmk.OP_GET, 1)
    with pytest.raises(ValueError):
        ad.op(0, seg.address, 0, 1)
    with pytest.raises(ValueError):
        ad.op(0, seg.address, -1, 1)
    assert ad.op(0, seg.address, gexmk.OP_GET) == 0


def test_operands_checked(client, seg):
    tm = client.tm
    ad = tm.ad_create(gexmk.DT_I64, gexmk.OP_ADD | gexmk.OP_CAS)
    with pytest.raises(ValueError, match="operand1"):
        ad.op(0, seg.address, gexmk.OP_ADD)
    with pytest.raises(ValueError, match="operand2"):
        ad.op(0, seg.address, gexmk.OP_CAS, 0)
    with pytest.raises(TypeError):
        ad.op(0, seg.address, gexmk.OP_ADD, 1.5)
    with pytest.raises(TypeError):
        ad.op(0, seg.address, gexmk.OP_ADD, "1")
    assert not np.asarray(seg)[:8].any()


@pytest.mark.parametrize("dt,bad", [
    (gexmk.DT_I32, 2**31), (gexmk.DT_I32, -2**31 - 1),
    (gexmk.DT_U32, -1), (gexmk.DT_U32, 2**32),
    (gexmk.DT_I64, 2**63), (gexmk.DT_I64, -2**63 - 1),
    (gexmk.DT_U64, -1), (gexmk.DT_U64, 2**64),
])
def test_operand_overflow(client, seg, dt, bad):
    ad = client.tm.ad_create(dt, gexmk.OP_ADD | gexmk.OP_CAS | gexmk.OP_SET)
    with pytest.raises(OverflowError):
        ad.op(0, seg.address, gexmk.OP_ADD, bad)
    with pytest.raises(OverflowError):
        ad.op(0, seg.address, gexmk.OP_SET, bad)
    with pytest.raises(OverflowError):
        ad.op(0, seg.address, gexmk.OP_CAS, 0, bad)
    assert not np.asarray(seg)[:8].any()


@pytest.mark.parametrize("dt,off", [
    (gexmk.DT_I64, 4), (gexmk.DT_U64, 1), (gexmk.DT_DBL, 4),
    (gexmk.DT_I32, 2), (gexmk.DT_U32, 1), (gexmk.DT_FLT, 3),
])
def test_misaligned_address(client, seg, dt, off):
    ad = client.tm.ad_create(dt, gexmk.OP_SET | gexmk.OP_FADD)
    with pytest.raises(BoundsError, match="aligned"):
        ad.op(0, seg.address + 64 + off, gexmk.OP_SET, 1)
    with pytest.raises(BoundsError, match="aligned"):
        ad.op(0, seg.address + 64 + off, gexmk.OP_FADD, 1)
    assert not np.asarray(seg).any()


def test_atomic_out_of_segment_and_bad_rank(client, seg):
    ad = client.tm.ad_create(gexmk.DT_I64, gexmk.OP_SET)
    end = seg.address + seg.size
    for addr in (end, end - 4, seg.address - 8, 2**64 - 8):
        with pytest.raises(BoundsError):
            ad.op(0, addr, gexmk.OP_SET, 1)
    with pytest.raises(RankError):
        ad.op(1, seg.address, gexmk.OP_SET, 1)
    ad.op(0, end - 8, gexmk.OP_SET, 1)       # the last object is fine
    assert np.asarray(seg)[-8:].view(np.int64)[0] == 1
    assert not np.asarray(seg)[:-8].any()


def test_op_nb_result(client, seg):
    ad = client.tm.ad_create(gexmk.DT_I64, gexmk.OP_FADD | gexmk.OP_ADD)
    ev = ad.op_nb(0, seg.address, gexmk.OP_FADD, 7)
    assert isinstance(ev, gexmk.Event)
    assert ev.wait() == 0
    assert ev.wait() == 0
    assert ev.result == 0 and ev.test()
    assert ad.op_nb(0, seg.address, gexmk.OP_FADD, 1).wait() == 7
    assert ad.op_nb(0, seg.address, gexmk.OP_ADD, 1).wait() is None
    gexmk.wait_all([ad.op_nb(0, seg.address, gexmk.OP_ADD, 1) for _ in range(10)])
    assert np.asarray(seg)[:8].view(np.int64)[0] == 19


@pytest.mark.parametrize("dt", list(DTS), ids=list(DT_IDS.values()))
def test_op_nbi_with_result_buffer(client, seg, dt):
    T = DTS[dt]
    ad = client.tm.ad_create(dt, gexmk.OP_FADD | gexmk.OP_ADD | gexmk.OP_SWAP)
    np.asarray(seg)[:8].view(T)[0] = 3
    res = np.zeros(1, T)
    assert ad.op_nbi(0, seg.address, gexmk.OP_FADD, 4, result=res) is None
    gexmk.nbi_wait(gexmk.EC_RMW)
    assert res[0] == 3
    ad.op_nbi(0, seg.address, gexmk.OP_SWAP, 1, result=memoryview(res))
    gexmk.nbi_wait(gexmk.EC_RMW)
    assert res[0] == 7
    ad.op_nbi(0, seg.address, gexmk.OP_ADD, 2)          # non-fetching: no buffer needed
    with gexmk.nbi_access_region() as ev:
        ad.op_nbi(0, seg.address, gexmk.OP_FADD, 1, result=res)
    ev.wait()
    assert res[0] == 3
    assert np.asarray(seg)[:8].view(T)[0] == 4


def test_op_nbi_fetching_needs_result(client, seg):
    ad = client.tm.ad_create(gexmk.DT_I64, gexmk.OP_FADD)
    with pytest.raises(ValueError, match="result"):
        ad.op_nbi(0, seg.address, gexmk.OP_FADD, 1)
    assert not np.asarray(seg)[:8].any()


@pytest.mark.parametrize("result", [np.zeros(4, np.uint8), b"\0" * 8],
                         ids=["too-small", "read-only"])
def test_op_nbi_bad_result_buffer_performs_nothing(client, seg, result):
    ad = client.tm.ad_create(gexmk.DT_I64, gexmk.OP_FADD)
    with pytest.raises((ValueError, TypeError), match="result"):
        ad.op_nbi(0, seg.address, gexmk.OP_FADD, 1, result=result)
    # a rejected call must not have performed the atomic
    assert not np.asarray(seg)[:8].any()


def test_domain_destroy(client, seg):
    with client.tm.ad_create(gexmk.DT_I64, gexmk.OP_ADD) as ad:
        ad.op(0, seg.address, gexmk.OP_ADD, 1)
    ad.destroy()
    with pytest.raises(StateError):
        ad.op(0, seg.address, gexmk.OP_ADD, 1)
    assert ad.dt == gexmk.DT_I64 and ad.ops == gexmk.OP_ADD
    with pytest.raises(TypeError):
        gexmk.AtomicDomain()


def test_atomics_visible_to_puts_and_gets(client, seg):
    tm = client.tm
    ad = tm.ad_create(gexmk.DT_U64, gexmk.OP_FADD)
    tm.put_val(0, seg.address, 40)
    assert ad.op(0, seg.address, gexmk.OP_FADD, 2) == 40
    assert tm.get_val(0, seg.address) == 42


def test_atomics_on_client_allocated_segment(client):
    words = np.zeros(8, np.int64)
    s = client.segment_create(buffer=words)
    client.ep(0).bind_segment(s)
    ad = client.tm.ad_create(gexmk.DT_I64, gexmk.OP_FADD | gexmk.OP_FCAS)
    assert ad.op(0, s.address + 16, gexmk.OP_FADD, -3) == 0
    assert ad.op(0, s.address + 16, gexmk.OP_FCAS, -3, 9) == -3
    assert words.tolist() == [0, 0, 9, 0, 0, 0, 0, 0]


# ---- contention between processes ------------------------------------------------

WORKER = textwrap.dedent("""
    import sys
    import numpy as np
    import gexmk

    N = int(sys.argv[1])
    U32_START = 2**32 - 3 * N // 2           # the counter wraps during the run
    with gexmk.init() as c:
        tm = c.tm
        seg = c.segment_attach(4096 + 8 * N * tm.size)
        ad64 = tm.ad_create(gexmk.DT_I64, gexmk.OP_FADD | gexmk.OP_INC | gexmk.OP_GET)
        ad32 = tm.ad_create(gexmk.DT_U32, gexmk.OP_FCAS | gexmk.OP_GET | gexmk.OP_SET)
        a64, a32 = tm.addr(0, 0), tm.addr(0, 8)
        if tm.rank == 0:
            ad32.op(0, a32, gexmk.OP_SET, U32_START)
        tm.barrier()
        fetched = np.empty(N, np.int64)
        nf = 0
        retries = 0
        for i in range(N):
            if i % 2:
                ad64.op(0, a64, gexmk.OP_INC)
            else:
                fetched[nf] = ad64.op(0, a64, gexmk.OP_FADD, 1)
                nf += 1
            cur = ad32.op(0, a32, gexmk.OP_GET)
            while True:
                old = ad32.op(0, a32, gexmk.OP_FCAS, cur, (cur + 1) % 2**32)
                if old == cur:
                    break
                cur = old
                retries += 1
        # every process leaves its fetched values in rank 0's segment
        tm.put(0, tm.addr(0, 4096 + 8 * N * tm.rank), fetched[:nf])
        tm.put(0, tm.addr(0, 16 + 8 * tm.rank), np.array([nf], np.int64))
        tm.barrier()
        if tm.rank == 0:
            total = ad64.op(0, a64, gexmk.OP_GET)
            u32 = ad32.op(0, a32, gexmk.OP_GET)
            arr = np.asarray(seg)
            counts = arr[16:16 + 8 * tm.size].view(np.int64)
            olds = np.concatenate([arr[4096 + 8 * N * r:].view(np.int64)[:counts[r]]
                                   for r in range(tm.size)])
            print(f"RESULT size={tm.size} i64={total} u32={u32} "
                  f"fetched={len(olds)} unique={len(np.unique(olds))} max={olds.max()} "
                  f"retries={retries}", flush=True)
""")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nprocs", [2, 4])
def test_contended_counters_are_exact(tmp_path, nprocs):
    n = 2000
    r = mp_util.run_job(tmp_path, WORKER, nprocs, launcher_timeout=90, timeout=110,
                        args=(n,), prelude=False).check()
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT")]
    assert len(lines) == 1, r.report()
    fields = dict(kv.split("=") for kv in lines[0].split()[1:])
    total = nprocs * n
    assert int(fields["size"]) == nprocs
    assert int(fields["i64"]) == total
    assert int(fields["u32"]) == (2**32 - 3 * n // 2 + total) % 2**32
    # every FADD saw a distinct old value: no update was lost or duplicated
    assert int(fields["fetched"]) == nprocs * n // 2
    assert int(fields["unique"]) == nprocs * n // 2
    assert int(fields["max"]) < total
