"""Arguments from Python: integers through ``__index__`` with a range check
that names the parameter (STYLE rule 13), real numbers for float atomics,
value puts that never drop bytes, and messages that say which argument was
wrong and what was expected.

Most checks run in one process (a job of one); one worker repeats the RMA and
atomic checks against a peer over every transport (nbrhd, pvm, ofi), since
the conversions must not depend on the path an operation takes.
"""
import ast
import os
import re
import subprocess
import sys
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest

import gexmk
from gexmk import ArgumentError, BoundsError, RankError, SegmentError

try:
    from . import mp_util
except ImportError:
    import mp_util

NOT_INTS = [0.7, 1.0, Decimal(0), np.float64(0.0), "0", None]
NOT_INT_IDS = ["float", "integral_float", "Decimal", "np.float64", "str", "None"]


@pytest.fixture
def seg(client):
    s = client.segment_attach(1 << 16)
    yield s


@pytest.fixture
def b(client, seg):
    """The segment's remote address."""
    return client.tm.addr(0)


@pytest.fixture
def ad(client, seg):
    return client.tm.ad_create(gexmk.DT_I64, gexmk.OP_FADD | gexmk.OP_GET | gexmk.OP_CAS)


def untouched(seg):
    return not np.asarray(seg).any()


def rma_calls(tm, b):
    """Every RMA call, as (name, call(rank, addr, nbytes)) with the integer
    arguments in their place."""
    buf = bytearray(8)
    return {
        "put": lambda r, a, n=8: tm.put(r, a, b"12345678"),
        "put_nb": lambda r, a, n=8: tm.put_nb(r, a, b"12345678"),
        "put_nbi": lambda r, a, n=8: tm.put_nbi(r, a, b"12345678"),
        "put_val": lambda r, a, n=8: tm.put_val(r, a, 1, n),
        "put_nb_val": lambda r, a, n=8: tm.put_nb_val(r, a, 1, n),
        "put_nbi_val": lambda r, a, n=8: tm.put_nbi_val(r, a, 1, n),
        "get": lambda r, a, n=8: tm.get(buf, r, a),
        "get_nb": lambda r, a, n=8: tm.get_nb(buf, r, a),
        "get_nbi": lambda r, a, n=8: tm.get_nbi(buf, r, a),
        "get_val": lambda r, a, n=8: tm.get_val(r, a, n),
    }


RMA = ["put", "put_nb", "put_nbi", "put_val", "put_nb_val", "put_nbi_val",
       "get", "get_nb", "get_nbi", "get_val"]
ADDR_PARAM = {name: ("src" if name.startswith("get") else "dest") for name in RMA}


# ---- 1. out-of-range integers name the parameter and the range -------------------

@pytest.mark.parametrize("name", RMA)
@pytest.mark.parametrize("rank", [2**31, -2**31 - 1, 2**64, 2**100])
def test_rank_outside_c_int(client, seg, b, name, rank):
    with pytest.raises(RankError, match=rf"^{name}: rank {rank} is outside the team \(size 1\)"):
        rma_calls(client.tm, b)[name](rank, b)
    assert untouched(seg)


@pytest.mark.parametrize("name", RMA)
@pytest.mark.parametrize("addr", [-8, -1, 2**64, 2**64 + 8, -2**70])
def test_address_outside_address_space(client, seg, b, name, addr):
    param = ADDR_PARAM[name]
    with pytest.raises(BoundsError, match=rf"^{name}: {param} must be an address in 0\.\.0x"):
        rma_calls(client.tm, b)[name](0, addr)
    assert untouched(seg)


@pytest.mark.parametrize("name", ["put_val", "put_nb_val", "put_nbi_val", "get_val"])
@pytest.mark.parametrize("nbytes", [-1, 0, 9, 2**64, -2**64])
def test_value_nbytes_range(client, seg, b, name, nbytes):
    with pytest.raises(ArgumentError, match=rf"^{name}: nbytes must be in 1\.\.8 \(got {nbytes}\)"):
        rma_calls(client.tm, b)[name](0, b, nbytes)
    assert untouched(seg)


def test_addr_offset_and_rank_range(client, seg):
    tm = client.tm
    for off in (-1, -2**70, seg.size + 1, 2**64):
        with pytest.raises(BoundsError, match=rf"^addr: offset {off} is outside team rank 0's segment"):
            tm.addr(0, off)
    with pytest.raises(RankError, match=r"^addr: rank 2147483648 is outside the team"):
        tm.addr(2**31)
    with pytest.raises(RankError, match=r"^addr: rank -1 is outside the team"):
        tm.addr(-1)


@pytest.mark.parametrize("how", ["ep_location", "translate_rank_to_jobrank", "transport",
                                 "paths", "query_bound_segment_nb"])
@pytest.mark.parametrize("rank", [1, -1, 2**31, 2**80])
def test_team_rank_queries(client, seg, how, rank):
    with pytest.raises(RankError, match=rf"^{how}: rank {rank} is outside the team \(size 1\)"):
        getattr(client.tm, how)(rank)


def test_other_ranges(client, seg):
    tm = client.tm
    with pytest.raises(RankError, match=r"^translate_jobrank_to_rank: job rank "
                                        r"1237940039285380274899124224 is outside the job \(size 1\)"):
        tm.translate_jobrank_to_rank(2**90)
    with pytest.raises(ArgumentError,
                       match=r"^pair: remote_index must be in 0\.\.2147483647 \(got -1\)"):
        client.ep(0).pair(-1)
    with pytest.raises(ArgumentError, match=r"^pair: remote_index must be in 0\.\.2147483647"):
        client.ep(0).pair(2**31)
    with pytest.raises(ArgumentError,
                       match=r"^ep: no live endpoint with index 1267650600228229401496703205376"):
        client.ep(2**100)
    with pytest.raises(ArgumentError, match=r"^ep_create: caps="):
        client.ep_create(2**70)
    with pytest.raises(ArgumentError,
                       match=r"^segment_create: size 1180591620717411303424 is more than .* \(at most"):
        client.segment_create(2**70)
    with pytest.raises(ArgumentError, match=r"^create: a member's endpoint index must be in 0\.\."):
        tm.create([(0, 2**40)])
    with pytest.raises(RankError, match=r"^create: job rank 4294967296 is outside the job"):
        tm.create([(2**32, 0)])
    with pytest.raises(ArgumentError, match=r"^nbi_wait: category must be in 1\.\.15"):
        gexmk.nbi_wait(2**70)
    with pytest.raises(ArgumentError, match=r"^nbi_test: flags must be 0"):
        gexmk.nbi_test(gexmk.EC_ALL, 2**70)
    ev = tm.put_nb(0, tm.addr(0), b"x", lc=gexmk.LC_DEFER)
    with pytest.raises(ArgumentError, match=r"^leaf: unknown leaf category 1180591620717411303424"):
        ev.leaf(2**70)


@pytest.mark.parametrize("op", [2**40, 2**31, -2**63, 2**64, 0, 3])
def test_atomic_op_range(client, seg, b, ad, op):
    with pytest.raises(ArgumentError, match=r"^AtomicDomain\.op: op must be one OP_\* flag"):
        ad.op(0, b, op, 1)
    with pytest.raises(ArgumentError, match=r"^AtomicDomain\.op_nb: op must be one OP_\* flag"):
        ad.op_nb(0, b, op, 1)
    with pytest.raises(ArgumentError, match=r"^AtomicDomain\.op_nbi: op must be one OP_\* flag"):
        ad.op_nbi(0, b, op, 1)
    assert untouched(seg)


def test_atomic_rank_and_addr_range(client, seg, b, ad):
    with pytest.raises(RankError, match=r"^AtomicDomain\.op: rank 1099511627776 is outside the team"):
        ad.op(2**40, b, gexmk.OP_FADD, 1)
    with pytest.raises(BoundsError, match=r"^AtomicDomain\.op: addr must be an address in 0\.\."):
        ad.op(0, -8, gexmk.OP_FADD, 1)
    with pytest.raises(BoundsError, match=r"^AtomicDomain\.op_nbi: addr must be an address"):
        ad.op_nbi(0, 2**64, gexmk.OP_FADD, 1, result=bytearray(8))
    assert untouched(seg)


def test_ad_create_ranges(client, seg):
    tm = client.tm
    with pytest.raises(ArgumentError, match=r"^ad_create: unknown atomic data type dt=4294967296"):
        tm.ad_create(2**32, gexmk.OP_ADD)
    with pytest.raises(ArgumentError, match=r"^ad_create: ops="):
        tm.ad_create(gexmk.DT_I64, 2**40)
    with pytest.raises(ArgumentError, match=r"^ad_create: ops="):
        tm.ad_create(gexmk.DT_I64, -1)


@pytest.mark.parametrize("name", ["put", "get"])
def test_address_tuple_ranges(client, seg, b, name):
    tm = client.tm
    param = "src" if name == "put" else "dest"
    call = (lambda t: tm.put(0, b, t)) if name == "put" else (lambda t: tm.get(t, 0, b))
    with pytest.raises(ArgumentError, match=rf"^{name}: {param} address must be an address in 0\.\."):
        call((-5, 4))
    with pytest.raises(ArgumentError, match=rf"^{name}: {param} address must be an address"):
        call((2**64, 1))
    with pytest.raises(ArgumentError, match=rf"^{name}: {param} nbytes must be a byte count in 0\.\."):
        call((np.zeros(1).ctypes.data, -1))
    with pytest.raises(ArgumentError, match=rf"^{name}: {param} nbytes must be a byte count"):
        call((np.zeros(1).ctypes.data, 2**64))
    assert untouched(seg)


# ---- 2. non-integers are refused, never truncated; numpy integers are welcome -----

@pytest.mark.parametrize("bad", NOT_INTS, ids=NOT_INT_IDS)
@pytest.mark.parametrize("name", RMA)
def test_rank_not_int(client, seg, b, name, bad):
    with pytest.raises(TypeError, match=rf"^{name}: rank must be an int \(got "):
        rma_calls(client.tm, b)[name](bad, b)
    assert untouched(seg)


@pytest.mark.parametrize("bad", ["half", "float", "Decimal", "np.float64", "bool"])
@pytest.mark.parametrize("name", RMA)
def test_address_not_int(client, seg, b, name, bad):
    value = {"half": b + 0.5, "float": float(b), "Decimal": Decimal(b),
             "np.float64": np.float64(b), "bool": True}[bad]
    param = ADDR_PARAM[name]
    with pytest.raises(TypeError, match=rf"^{name}: {param} must be an int"):
        rma_calls(client.tm, b)[name](0, value)
    assert untouched(seg)


def test_float_rank_message(client, seg, b):
    with pytest.raises(TypeError) as e:
        client.tm.put(0.7, b, b"x")
    assert str(e.value) == "put: rank must be an int (got float 0.7)"
    assert untouched(seg)


@pytest.mark.parametrize("name", ["put_val", "get_val"])
@pytest.mark.parametrize("bad", [2.5, 8.0, Decimal(8), np.float32(4), True])
def test_nbytes_not_int(client, seg, b, name, bad):
    with pytest.raises(TypeError, match=rf"^{name}: nbytes must be an int"):
        rma_calls(client.tm, b)[name](0, b, bad)
    assert untouched(seg)


def test_value_not_int(client, seg, b):
    for bad in (1.5, 2.0, "1", Decimal(1), np.float64(1), None):
        with pytest.raises(TypeError, match=r"^put_val: value must be an int"):
            client.tm.put_val(0, b, bad)
    assert untouched(seg)


@pytest.mark.parametrize("name", ["put", "get"])
def test_address_tuple_not_int(client, seg, b, name):
    tm = client.tm
    x = np.zeros(8, np.uint8)
    param = "src" if name == "put" else "dest"
    call = (lambda t: tm.put(0, b, t)) if name == "put" else (lambda t: tm.get(t, 0, b))
    with pytest.raises(TypeError, match=rf"^{name}: {param} address must be an int \(got float"):
        call((float(x.ctypes.data), 8))
    with pytest.raises(TypeError, match=rf"^{name}: {param} nbytes must be an int \(got float 8\.0\)"):
        call((x.ctypes.data, 8.0))
    with pytest.raises(TypeError, match=rf"^{name}: {param} address must be an int"):
        call((Decimal(x.ctypes.data), 8))
    assert untouched(seg)


def test_atomic_not_ints(client, seg, b, ad):
    tm = client.tm
    with pytest.raises(TypeError, match=r"^ad_create: dt must be an int \(got float 1\.5\)"):
        tm.ad_create(1.5, gexmk.OP_FADD)
    with pytest.raises(TypeError, match=r"^ad_create: dt must be an int, not a bool"):
        tm.ad_create(True, gexmk.OP_FADD)
    with pytest.raises(TypeError, match=r"^ad_create: ops must be an int"):
        tm.ad_create(gexmk.DT_I64, float(gexmk.OP_FADD))
    with pytest.raises(TypeError, match=r"^ad_create: flags must be an int"):
        tm.ad_create(gexmk.DT_I64, gexmk.OP_FADD, 0.0)
    with pytest.raises(TypeError, match=r"^AtomicDomain\.op: op must be an int \(got float 64\.0\)"):
        ad.op(0, b, float(gexmk.OP_FADD), 1)
    with pytest.raises(TypeError, match=r"^AtomicDomain\.op: op must be an int, not a bool"):
        ad.op(0, b, True, 1)
    with pytest.raises(TypeError, match=r"^AtomicDomain\.op_nbi: op must be an int"):
        ad.op_nbi(0, b, Decimal(gexmk.OP_FADD), 1, result=bytearray(8))
    with pytest.raises(TypeError, match=r"^AtomicDomain\.op: rank must be an int"):
        ad.op(0.0, b, gexmk.OP_FADD, 1)
    with pytest.raises(TypeError, match=r"^AtomicDomain\.op_nb: addr must be an int"):
        ad.op_nb(0, float(b), gexmk.OP_FADD, 1)
    for bad in (1.5, 1.0, "1", Decimal(1), np.float64(1)):
        with pytest.raises(TypeError, match=r"^AtomicDomain\.op: operand1 must be an int for I64"):
            ad.op(0, b, gexmk.OP_FADD, bad)
        with pytest.raises(TypeError, match=r"^AtomicDomain\.op: operand2 must be an int for I64"):
            ad.op(0, b, gexmk.OP_CAS, 0, bad)
    assert untouched(seg)


def test_other_calls_not_ints(client, seg):
    tm = client.tm
    for call, match in [
        (lambda: tm.addr(0, 1.5), r"^addr: offset must be an int"),
        (lambda: tm.addr(0.0), r"^addr: rank must be an int"),
        (lambda: tm.ep_location(0.0), r"^ep_location: rank must be an int"),
        (lambda: tm.transport(np.float64(0)), r"^transport: rank must be an int"),
        (lambda: tm.query_bound_segment_nb("0"), r"^query_bound_segment_nb: rank must be an int"),
        (lambda: tm.translate_jobrank_to_rank(0.0),
         r"^translate_jobrank_to_rank: jobrank must be an int"),
        (lambda: tm.split(0, 1.5), r"^split: key must be an int"),
        (lambda: tm.split(1.5), r"^split: color must be an int or None"),
        (lambda: tm.create([(0.0, 0)]), r"^create: a member's job rank must be an int"),
        (lambda: tm.create([(0, 0.0)]), r"^create: a member's endpoint index must be an int"),
        (lambda: tm.create([0.0]), r"^create: members must be team ranks"),
        (lambda: client.ep(0.0), r"^ep: index must be an int"),
        (lambda: client.ep(0).pair(1.0), r"^pair: remote_index must be an int"),
        (lambda: client.ep_create(1.0), r"^ep_create: caps must be an int"),
        (lambda: client.segment_attach(4096.0), r"^segment_attach: size must be an int"),
        (lambda: client.segment_create(Decimal(4096)), r"^segment_create: size must be an int"),
        (lambda: gexmk.nbi_wait(2.0), r"^nbi_wait: category must be an int"),
        (lambda: gexmk.nbi_test(gexmk.EC_ALL, 0.0), r"^nbi_test: flags must be an int"),
    ]:
        with pytest.raises(TypeError, match=match):
            call()
    ev = tm.put_nb(0, tm.addr(0), b"x", lc=gexmk.LC_DEFER)
    with pytest.raises(TypeError, match=r"^leaf: category must be an int"):
        ev.leaf(float(gexmk.EC_LC))
    # an lc option is one of three constants, not a number: 0.0 is not LC_NOW
    with pytest.raises(ArgumentError, match=r"^put_nb: lc must be LC_NOW"):
        tm.put_nb(0, tm.addr(0), b"x", lc=0.0)
    with pytest.raises(ArgumentError, match=r"^put_nbi: lc must be LC_NOW"):
        tm.put_nbi(0, tm.addr(0), b"x", lc=True)


def test_numpy_integers_accepted(client, b, seg):
    tm = client.tm
    arr = np.asarray(seg)
    tm.put(np.int64(0), np.uint64(b), b"\x01")
    tm.put_nb(np.int32(0), np.int64(b + 1), b"\x02").wait()
    tm.put_nbi(np.uint8(0), np.uint64(b + 2), b"\x03")
    gexmk.nbi_wait(np.int64(gexmk.EC_PUT), np.int8(0))
    tm.put_val(np.int16(0), np.int64(b + 3), np.int64(4), np.int64(1))
    assert bytes(arr[:4]) == b"\x01\x02\x03\x04"
    x = np.arange(8, dtype=np.uint8)
    tm.put(0, b + 8, (np.uint64(x.ctypes.data), np.int64(8)))
    assert bytes(arr[8:16]) == bytes(range(8))
    out = bytearray(4)
    tm.get(out, np.int64(0), np.uint64(b))
    assert out == b"\x01\x02\x03\x04"
    got = tm.get_val(np.int64(0), np.int64(b), np.int64(2))
    assert got == int.from_bytes(b"\x01\x02", sys.byteorder)
    assert tm.addr(np.int64(0), np.int64(16)) == b + 16
    assert tm.ep_location(np.int64(0)) == (0, 0)
    assert tm.translate_jobrank_to_rank(np.int64(0)) == 0
    ad = tm.ad_create(np.int64(gexmk.DT_I64), np.int64(gexmk.OP_FADD | gexmk.OP_GET))
    assert ad.op(np.int64(0), np.uint64(b + 32), np.int64(gexmk.OP_FADD), np.int64(5)) == 0
    assert ad.op(0, b + 32, gexmk.OP_FADD, np.uint8(2)) == 5
    assert ad.op(0, b + 32, gexmk.OP_GET) == 7
    u = tm.ad_create(gexmk.DT_U64, gexmk.OP_SET | gexmk.OP_GET)
    u.op(0, b + 40, gexmk.OP_SET, np.uint64(2**64 - 1))
    assert u.op(0, b + 40, gexmk.OP_GET) == 2**64 - 1
    assert client.ep(np.int64(0)) is tm.ep
    assert client.ep(0).pair(np.int64(0)).size == 1
    client.ep(0).unbind_segment()                # a second attach needs endpoint 0 free
    s = client.segment_attach(np.int64(4096))
    assert s.size == 4096
    assert client.segment_create(np.uint32(64)).size == 64
    assert client.ep_create(np.int64(gexmk.EP_CAPABILITY_RMA)).index >= 1


def test_bool_as_rank_is_accepted(client, seg, b):
    # bool is an int for __index__; a rank of False is rank 0, like a list index
    client.tm.put(False, b, b"\x09")
    assert client.tm.get_val(False, b, 1) == 9


def test_bool_where_clearly_wrong(client, seg, b):
    with pytest.raises(TypeError, match=r"^put: dest must be an int, not a bool"):
        client.tm.put(0, True, b"x")
    with pytest.raises(TypeError, match=r"^put_val: nbytes must be an int, not a bool"):
        client.tm.put_val(0, b, 1, True)
    with pytest.raises(TypeError, match=r"^segment_create: size must be an int, not a bool"):
        client.segment_create(True)
    assert untouched(seg)


# ---- 3. float-domain operands are real numbers -----------------------------------

@pytest.mark.parametrize("dt", [gexmk.DT_FLT, gexmk.DT_DBL], ids=["FLT", "DBL"])
def test_float_operands_must_be_real(client, seg, b, dt):
    fd = client.tm.ad_create(dt, gexmk.OP_FADD | gexmk.OP_CAS | gexmk.OP_GET | gexmk.OP_SET)
    name = "FLT" if dt == gexmk.DT_FLT else "DBL"
    for bad in ("1.5", b"1.5", bytearray(b"1"), "nan", Decimal("1.5"), np.array([1.5]), object()):
        with pytest.raises(TypeError,
                           match=rf"^AtomicDomain\.op: operand1 must be a real number .* for {name}"):
            fd.op(0, b + 8, gexmk.OP_FADD, bad)
        with pytest.raises(TypeError, match=rf"^AtomicDomain\.op_nb: operand2 must be a real number"):
            fd.op_nb(0, b + 8, gexmk.OP_CAS, 0.0, bad)
        with pytest.raises(TypeError, match=rf"^AtomicDomain\.op_nbi: operand1 must be a real number"):
            fd.op_nbi(0, b + 8, gexmk.OP_SET, bad)
    with pytest.raises(ArgumentError, match=r"^AtomicDomain\.op: operand1 is required"):
        fd.op(0, b + 8, gexmk.OP_FADD, None)
    assert untouched(seg)
    # real numbers of every kind are added
    total = 0.0
    for good in (1, 0.5, np.float32(0.25), np.float64(2.0), np.int64(3), Fraction(1, 8), True):
        fd.op(0, b + 8, gexmk.OP_FADD, good)
        total += float(good)
    assert fd.op(0, b + 8, gexmk.OP_GET) == total


def test_flt_operand_overflow(client, seg, b):
    fd = client.tm.ad_create(gexmk.DT_FLT, gexmk.OP_SET | gexmk.OP_GET)
    with pytest.raises(OverflowError, match=r"^AtomicDomain\.op: operand1=1e\+300 does not fit FLT"):
        fd.op(0, b, gexmk.OP_SET, 1e300)
    with pytest.raises(OverflowError, match=r"operand1=.* does not fit DBL"):
        client.tm.ad_create(gexmk.DT_DBL, gexmk.OP_SET).op(0, b, gexmk.OP_SET, 10**400)
    fd.op(0, b, gexmk.OP_SET, float("inf"))         # infinities are values, not overflows
    assert fd.op(0, b, gexmk.OP_GET) == float("inf")


# ---- 4. a zero-length access to an endpoint with nothing bound ---------------------

ZERO = {
    "put": lambda tm: tm.put(0, 0, b""),
    "put_nb": lambda tm: tm.put_nb(0, 0, b""),
    "put_nbi": lambda tm: tm.put_nbi(0, 0, b""),
    "put_tuple": lambda tm: tm.put(0, 0, (0, 0)),
    "get": lambda tm: tm.get(bytearray(0), 0, 0),
    "get_nb": lambda tm: tm.get_nb(bytearray(0), 0, 0),
    "get_nbi": lambda tm: tm.get_nbi(bytearray(0), 0, 0),
}


@pytest.mark.parametrize("how", sorted(ZERO))
def test_zero_length_at_zero_to_unbound_is_segment_error(client, how):
    # nothing is bound to EP 0 of this job of one, nor to EP 1, which does not exist
    for tm in (client.tm, client.ep(0).pair(1)):
        with pytest.raises(SegmentError, match="no bound segment"):
            ZERO[how](tm)
    s = client.segment_create(64)
    client.ep(0).bind_segment(s)
    client.ep(0).unbind_segment()                    # bound once, then nothing again
    with pytest.raises(SegmentError, match="no bound segment"):
        ZERO[how](client.tm)


# ---- 5. value puts never drop bytes ----------------------------------------------

@pytest.mark.parametrize("name", ["put_val", "put_nb_val", "put_nbi_val"])
@pytest.mark.parametrize("value,nbytes", [
    (2**70 + 5, 8), (2**64, 8), (-2**63 - 1, 8), (300, 1), (256, 1), (-129, 1),
    (2**16, 2), (-2**15 - 1, 2), (2**32, 4), (2**56, 7),
])
def test_put_val_overflow(client, seg, b, name, value, nbytes):
    with pytest.raises(OverflowError,
                       match=rf"^{name}: value {value} does not fit in nbytes={nbytes} bytes"):
        getattr(client.tm, name)(0, b, value, nbytes)
    assert untouched(seg)


@pytest.mark.parametrize("value,nbytes,stored", [
    (255, 1, b"\xff"), (-128, 1, b"\x80"), (-1, 1, b"\xff"), (-1, 2, b"\xff\xff"),
    (2**64 - 1, 8, b"\xff" * 8), (-2**63, 8, (2**63).to_bytes(8, sys.byteorder)),
    (-2, 8, (2**64 - 2).to_bytes(8, sys.byteorder)),
    (0x123456, 3, (0x123456).to_bytes(3, sys.byteorder)),
])
def test_put_val_fits(client, seg, b, value, nbytes, stored):
    arr = np.asarray(seg)
    arr[:16] = 0xAA
    client.tm.put_val(0, b, value, nbytes)
    assert bytes(arr[:nbytes]) == stored
    assert arr[nbytes] == 0xAA
    assert client.tm.get_val(0, b, nbytes) == int.from_bytes(stored, sys.byteorder)


def test_put_val_docstring_says_twos_complement():
    assert "two's complement" in gexmk.Team.put_val.__doc__


# ---- 6. arguments in the wrong order ----------------------------------------------

def test_get_with_swapped_arguments(client, seg, b):
    tm = client.tm
    buf = bytearray(8)
    for name in ("get", "get_nb", "get_nbi"):
        with pytest.raises(TypeError) as e:
            getattr(tm, name)(0, tm.addr(0, 0), buf)
        assert str(e.value) == (f"{name}(dest, rank, src): dest must be a writable buffer or "
                                "(address, nbytes), got int 0")
    with pytest.raises(TypeError, match=r"^get\(dest, rank, src\): dest must be a writable buffer"):
        tm.get(b, 0, buf)
    with pytest.raises(TypeError, match=r"^get: src must be an int \(got bytearray.*; the arguments "
                                        r"are get\(dest, rank, src\)"):
        tm.get(buf, 0, buf)


def test_put_with_swapped_arguments(client, seg, b):
    tm = client.tm
    x = np.zeros(1, np.int64)
    for name in ("put", "put_nb", "put_nbi"):
        with pytest.raises(TypeError, match=rf"^{name}: dest must be an int \(got ndarray.*\); "
                                            rf"the arguments are {name}\(rank, dest, src"):
            getattr(tm, name)(0, x, b)
    with pytest.raises(TypeError,
                       match=r"^put: rank must be an int \(got ndarray.*the arguments are put"):
        tm.put(x, b, 0)
    with pytest.raises(TypeError, match=r"^put\(rank, dest, src\): src must be a buffer or "
                                        r"\(address, nbytes\), got int"):
        tm.put(0, b, 5)
    with pytest.raises(TypeError,
                       match=r"^put_nbi\(rank, dest, src, lc=LC_NOW\): src must be a buffer"):
        tm.put_nbi(0, b, 5.0)
    with pytest.raises(TypeError, match=r"^put_val: value must be an int \(got bytes"):
        tm.put_val(0, b, b"\x01")
    with pytest.raises(TypeError, match=r"^put: dest must be an int .*the arguments are put\(rank"):
        tm.put(0, (x.ctypes.data, 8), b)
    assert untouched(seg)


def test_atomic_with_swapped_arguments(client, seg, b, ad):
    with pytest.raises(ArgumentError, match=r"^AtomicDomain\.op: op must be one OP_\* flag"):
        ad.op(0, gexmk.OP_FADD, b, 1)         # addr and op swapped
    with pytest.raises(TypeError, match=r"^AtomicDomain\.op: addr must be an int .*the arguments are"):
        ad.op(0, bytearray(8), gexmk.OP_FADD, 1)
    assert untouched(seg)


# ---- 7. the domain's value type in the stubs ----------------------------------------

def _stub():
    return os.path.join(os.path.dirname(gexmk.__file__), "__init__.pyi")


def test_stub_literals_match_runtime():
    tree = ast.parse(open(_stub()).read())
    seen = 0
    for node in tree.body:
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and node.target.id.startswith(("DT_", "OP_"))):
            ann = node.annotation
            assert isinstance(ann, ast.Subscript) and ann.value.id == "Literal", node.target.id
            assert ann.slice.value == getattr(gexmk, node.target.id), node.target.id
            seen += 1
    assert seen == 6 + 24           # the 23 atomic ops and OP_MULT (collective reductions)


def test_atomic_domain_subscriptable():
    # annotations such as AtomicDomain[int] must work at run time too
    assert gexmk.AtomicDomain[int].__origin__ is gexmk.AtomicDomain


@pytest.mark.timeout(180)
def test_stub_types_fetching_ops(tmp_path):
    pytest.importorskip("mypy")
    src = tmp_path / "use.py"
    src.write_text(
        "import gexmk\n"
        "tm = gexmk.init().tm\n"
        "ad = tm.ad_create(gexmk.DT_I64, gexmk.OP_FADD | gexmk.OP_ADD)\n"
        "i = ad.op(0, tm.addr(0), gexmk.OP_FADD, 1)\n"
        "if i >= 10:\n"
        "    pass\n"
        "reveal_type(i)\n"
        "reveal_type(ad.op(0, tm.addr(0), gexmk.OP_ADD, 1))\n"
        "fd = tm.ad_create(gexmk.DT_DBL, gexmk.OP_FADD)\n"
        "reveal_type(fd.op(0, tm.addr(0), gexmk.OP_FADD, 0.5))\n"
        "a: gexmk.AtomicDomain[int] = ad\n")
    r = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir", os.devnull,
                        str(src)], capture_output=True, text=True, timeout=170, cwd=str(tmp_path))
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    revealed = re.findall(r'Revealed type is "(?:builtins\.)?(\w+)"', out)
    assert revealed == ["int", "None", "float"], out


# ---- 8. op names, not masks -----------------------------------------------------------

def test_op_set_error_names_ops(client, seg, b):
    ad = client.tm.ad_create(gexmk.DT_I64, gexmk.OP_FADD | gexmk.OP_GET)
    with pytest.raises(ArgumentError) as e:
        ad.op(0, b, gexmk.OP_SUB, 1)
    assert str(e.value) == ("AtomicDomain.op: op OP_SUB is not in this domain's op set "
                            "(OP_GET | OP_FADD)")
    with pytest.raises(ArgumentError,
                       match=r"OP_FMAX is not in this domain's op set \(OP_GET \| OP_FADD\)"):
        ad.op_nbi(0, b, gexmk.OP_FMAX, 1, result=bytearray(8))
    with pytest.raises(ArgumentError,
                       match=r"^ad_create: bitwise ops \(OP_AND \| OP_FXOR\) are not defined for DBL"):
        client.tm.ad_create(gexmk.DT_DBL, gexmk.OP_ADD | gexmk.OP_AND | gexmk.OP_FXOR)
    assert untouched(seg)


# ---- 9. timeout=: a positive, finite number of seconds, or None ----------------------

#: (value, exception): a non-number (a bool is not a number of seconds) is a TypeError,
#: a number that is no duration (zero, negative, infinite, NaN) an ArgumentError
BAD_TIMEOUTS = [("x", TypeError), (b"1", TypeError), (True, TypeError), (False, TypeError),
                (-1, ArgumentError), (0, ArgumentError), (-0.5, ArgumentError),
                (float("inf"), ArgumentError), (float("nan"), ArgumentError)]
BAD_TIMEOUT_IDS = ["str", "bytes", "True", "False", "-1", "0", "-0.5", "inf", "nan"]

#: Every wait that takes timeout=, called so that it would return at once with a valid
#: one (the timeout is refused before anything is waited for, or looked at)
TIMEOUT_CALLS = {
    "wait_some": lambda tm, a, t: gexmk.wait_some([gexmk.EVENT_DONE], timeout=t),
    "wait_some_none": lambda tm, a, t: gexmk.wait_some([None], timeout=t),
    "wait_some_empty": lambda tm, a, t: gexmk.wait_some([], timeout=t),
    "wait_until": lambda tm, a, t: tm.wait_until(a, gexmk.CMP_EQ, 0, timeout=t),
    "wait_until_any": lambda tm, a, t: tm.wait_until_any([a], gexmk.CMP_EQ, 0, timeout=t),
    "wait_until_all": lambda tm, a, t: tm.wait_until_all([a], gexmk.CMP_EQ, 0, timeout=t),
    "wait_until_some": lambda tm, a, t: tm.wait_until_some([a], gexmk.CMP_EQ, 0, timeout=t),
    "barrier": lambda tm, a, t: tm.barrier(timeout=t),
}


@pytest.mark.parametrize("call", list(TIMEOUT_CALLS))
@pytest.mark.parametrize("bad, exc", BAD_TIMEOUTS, ids=BAD_TIMEOUT_IDS)
def test_bad_timeout_names_timeout(client, seg, b, call, bad, exc):
    with pytest.raises(exc, match="timeout must be a") as e:
        TIMEOUT_CALLS[call](client.tm, b, bad)
    assert isinstance(e.value, ArgumentError) == (exc is ArgumentError), repr(e.value)
    assert call.split("_none")[0].split("_empty")[0] in str(e.value), \
        f"the message should name the call: {e.value}"
    # a valid timeout returns at once (so the refusal above was the timeout's)
    TIMEOUT_CALLS[call](client.tm, b, 5)
    TIMEOUT_CALLS[call](client.tm, b, None)


# ---- the same checks against a peer, over every transport -----------------------------

WORKER = r'''
from decimal import Decimal
c = gexmk.init()
tm = c.tm
me = tm.rank
peer = 1 - me
seg = c.segment_attach(4096)
b = tm.addr(peer)
ep1 = c.ep_create()                      # never bound: zero-length accesses to it
tm.publish_bound_segment([ep1])
assert tm.transport(peer) == os.environ["EXPECT_PATH"], tm.transport(peer)
ad = tm.ad_create(gexmk.DT_I64, gexmk.OP_FADD | gexmk.OP_GET)
dd = tm.ad_create(gexmk.DT_DBL, gexmk.OP_FADD | gexmk.OP_CAS)
buf = bytearray(8)
x = np.zeros(1, np.int64)

def raises(exc, text, fn, *args, **kw):
    e = expect_raises(exc, fn, *args, **kw)
    assert text in str(e), (type(e).__name__, str(e), text)

raises(E.RankError, "put: rank 2147483648 is outside the team (size 2)", tm.put, 2**31, b, b"x")
raises(E.RankError, "get_nb: rank 4294967298 is outside", tm.get_nb, buf, 2**32 + 2, b)
raises(E.BoundsError, "put_nbi: dest must be an address in 0..", tm.put_nbi, peer, -8, b"x")
raises(E.BoundsError, "get: src must be an address", tm.get, buf, peer, 2**64)
raises(E.ArgumentError, "put_val: nbytes must be in 1..8 (got -1)", tm.put_val, peer, b, 1, -1)
raises(TypeError, "put: rank must be an int (got float 0.7)", tm.put, 0.7, b, b"x")
raises(TypeError, "put_nb: dest must be an int (got float", tm.put_nb, peer, b + 0.5, b"x")
raises(TypeError, "get_val: nbytes must be an int (got float 2.5)", tm.get_val, peer, b, 2.5)
raises(TypeError, "put: src address must be an int", tm.put, peer, b, (float(x.ctypes.data), 8))
raises(TypeError, "put: rank must be an int (got Decimal('1'))", tm.put, Decimal(1), b, b"x")
raises(OverflowError, "put_val: value 1180591620717411303429 does not fit in nbytes=8",
       tm.put_val, peer, b, 2**70 + 5, 8)
raises(OverflowError, "put_nbi_val: value 300 does not fit in nbytes=1",
       tm.put_nbi_val, peer, b, 300, 1)
raises(TypeError, "get(dest, rank, src): dest must be a writable buffer or (address, nbytes), got int",
       tm.get, peer, b, buf)
raises(TypeError, "put: dest must be an int (got ndarray", tm.put, peer, x, b)
raises(E.ArgumentError, "AtomicDomain.op: op must be one OP_* flag", ad.op, peer, b, 2**40, 1)
raises(TypeError, "AtomicDomain.op: op must be an int (got float",
       ad.op, peer, b, float(gexmk.OP_FADD), 1)
raises(E.ArgumentError, "op OP_SUB is not in this domain's op set (OP_GET | OP_FADD)",
       ad.op, peer, b, gexmk.OP_SUB, 1)
raises(TypeError, "AtomicDomain.op: operand1 must be a real number",
       dd.op, peer, b + 8, gexmk.OP_FADD, "1.5")
raises(TypeError, "AtomicDomain.op_nb: operand2 must be a real number", dd.op_nb, peer, b + 8,
       gexmk.OP_CAS, 0.0, b"1")
p1 = c.ep(0).pair(1)
raises(E.SegmentError, "no bound segment", p1.put, peer, 0, b"")
raises(E.SegmentError, "no bound segment", p1.get, bytearray(0), peer, 0)
raises(E.SegmentError, "no bound segment", p1.put_nb, peer, 0, b"")
raises(E.SegmentError, "no bound segment", p1.get_nbi, bytearray(0), peer, 0)
# accepted: numpy integers everywhere, and the operations land
if os.environ["GEXMK_TRANSPORT"] != "pvm":     # process_vm does no atomics
    assert ad.op(np.int64(peer), np.uint64(b + 16), np.int64(gexmk.OP_FADD), np.int64(2)) == 0
else:
    tm.put_val(np.int64(peer), np.uint64(b + 16), np.uint8(2))
tm.put_val(np.int64(peer), np.uint64(b + 24), -1, np.int64(2))
gexmk.nbi_wait()
tm.barrier()
mine = np.asarray(seg)
# nothing but the two accepted operations wrote into this segment
assert not mine[:16].any() and not mine[26:].any(), mine[:32]
assert mine[16:24].view(np.int64)[0] == 2
assert bytes(mine[24:26]) == b"\xff\xff"
tm.barrier()
c.finalize()
'''


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport,path,extra", [
    ("auto", "nbrhd", {}),
    ("pvm", "pvm", {}),
    ("ofi", "ofi", {"GEXMK_OFI_PROVIDER": "tcp;ofi_rxm"}),
])
def test_checks_are_the_same_over_every_transport(tmp_path, transport, path, extra):
    env = {"GEXMK_TRANSPORT": transport, "EXPECT_PATH": path, **extra}
    mp_util.run_job(tmp_path, WORKER, 2, env=env, launcher_timeout=60).check()
