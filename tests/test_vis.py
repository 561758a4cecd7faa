"""Vector, indexed and strided puts and gets (GASNet-EX VIS, issue 22) in a job of
one: results against numpy, the numpy form of put/get (non-contiguous arrays move
strided), one completion per call, and every bad input refused before a byte moves.
Every path's bytes and canaries are checked by the conformance matrix
(tests/conformance, operations put_vector ... get_strided_nbi); device forms are in
test_vis_gpu.py."""
import numpy as np
import pytest

import gexmk
from gexmk import ArgumentError, BoundsError, RankError

SEG = 1 << 16


@pytest.fixture
def env(client, seg):
    mem = np.asarray(seg).view(np.uint8)
    mem[:] = 0
    return client.tm, mem


# ---- numpy arrays of any layout as the local side of put/get ---------------------

_A = (24, 16), np.float64
_C = (4, 5, 6), np.int32
#: Non-contiguous (and edge-case) views: (owner shape, dtype, the view of an owner).
VIEWS = {
    "column": (*_A, lambda a: a[:, 3]),
    "every-other-row": (*_A, lambda a: a[::2]),
    "block": (*_A, lambda a: a[3:9, 2:7]),
    "reversed": (*_A, lambda a: a[::-1, ::-1]),
    "transposed": (*_A, lambda a: a.T),
    "3d-face-x": (*_C, lambda c: c[:, :, 0]),
    "3d-face-y": (*_C, lambda c: c[:, 0, :]),
    "3d-subarray": (*_C, lambda c: c[1:3, 1:4, 2:5]),
    "fortran-block": (*_A, lambda a: np.asfortranarray(a)[:5, :7]),
    "bytes-step3": ((200,), np.uint8, lambda b: b[::3]),
    "empty": (*_A, lambda a: a[:0, 3]),
    "one-element": (*_A, lambda a: a[4:5, 3]),
}
MODES = ["blocking", "nb", "nbi"]


def _view(name, fill=None):
    shape, dt, fn = VIEWS[name]
    owner = np.arange(int(np.prod(shape)), dtype=dt).reshape(shape) if fill is None \
        else np.full(shape, fill, dt)
    return owner, fn(owner)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(VIEWS) + ["broadcast-zero-stride"])
def test_put_of_a_noncontiguous_array_lands_in_c_order(env, name, mode):
    tm, mem = env
    if name == "broadcast-zero-stride":
        arr = np.broadcast_to(np.arange(7.0), (5, 7))
    else:
        arr = _view(name)[1]
    dest = tm.addr(0, 100)
    if mode == "blocking":
        tm.put(0, dest, arr)
    elif mode == "nb":
        tm.put_nb(0, dest, arr).wait()
    else:
        tm.put_nbi(0, dest, arr)
        gexmk.nbi_wait(gexmk.EC_PUT)
    # a Fortran-contiguous array is one contiguous buffer: its bytes go in memory order
    # (as mpi4py sends it); every non-contiguous one in C order (numpy's tobytes())
    order = "F" if arr.flags.f_contiguous and not arr.flags.c_contiguous else "C"
    got = mem[100:100 + arr.nbytes].view(arr.dtype).reshape(arr.shape, order=order)
    np.testing.assert_array_equal(got, arr)
    assert not mem[:100].any() and not mem[100 + arr.nbytes:].any()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(VIEWS))
def test_get_into_a_noncontiguous_array_fills_only_its_elements(env, name, mode):
    tm, mem = env
    fill = 255 if np.dtype(VIEWS[name][1]) == np.uint8 else -1
    owner, arr = _view(name, fill=fill)
    order = "F" if arr.flags.f_contiguous and not arr.flags.c_contiguous else "C"
    src = (np.arange(arr.size) + 7).astype(arr.dtype).reshape(arr.shape, order=order)
    mem[200:200 + src.nbytes] = np.frombuffer(src.tobytes(order=order), np.uint8)
    if mode == "blocking":
        tm.get(arr, 0, tm.addr(0, 200))
    elif mode == "nb":
        tm.get_nb(arr, 0, tm.addr(0, 200)).wait()
    else:
        tm.get_nbi(arr, 0, tm.addr(0, 200))
        gexmk.nbi_wait(gexmk.EC_GET)
    np.testing.assert_array_equal(arr, src)
    inside = np.zeros(owner.shape, bool)
    VIEWS[name][2](inside)[...] = True          # the same view of a mask
    assert (owner[~inside] == fill).all(), "a get wrote outside the view"


def test_column_put_uses_the_mapping_once(env):
    tm, mem = env
    a = np.arange(4096 * 8, dtype=np.float64).reshape(4096, 8)
    tm.reset_path_stats()
    tm.put(0, tm.addr(0, 0), a[:, 5])
    st = tm.path_stats(0)["self"]["put"]
    assert (st["ops"], st["bytes"], st["inline"]) == (1, 4096 * 8, 1)
    np.testing.assert_array_equal(mem[:4096 * 8].view(np.float64), a[:, 5])


# ---- the three shapes against numpy ------------------------------------------------

def test_put_vector_lists_cut_differently(env):
    tm, mem = env
    data = np.arange(1, 61, dtype=np.uint8)
    srcs = [data[:10], data[10:11], (data.ctypes.data + 11, 49)]
    dsts = [(tm.addr(0, 1000), 25), (tm.addr(0, 500), 5), (tm.addr(0, 3000), 30)]
    tm.put_vector(0, dsts, srcs)
    assert list(mem[1000:1025]) == list(data[:25])
    assert list(mem[500:505]) == list(data[25:30])
    assert list(mem[3000:3030]) == list(data[30:])


def test_get_vector_into_buffers_and_tuples(env):
    tm, mem = env
    mem[:256] = np.arange(256, dtype=np.uint8)
    a, b = bytearray(6), np.zeros(10, np.uint8)
    tm.get_vector([a, (b.ctypes.data, 10)], 0, [(tm.addr(0, 50), 8), (tm.addr(0, 100), 8)])
    assert list(a) == [50, 51, 52, 53, 54, 55]
    assert list(b) == [56, 57, 100, 101, 102, 103, 104, 105, 106, 107]


@pytest.mark.parametrize("addrs", ["list", "uint64", "int64"])
def test_indexed_kv_blocks_scattered_both_sides(env, addrs):
    tm, mem = env
    rng = np.random.default_rng(5)
    blk, nblk = 64, 32
    src = rng.integers(0, 256, blk * nblk, dtype=np.uint8)
    sidx, didx = rng.permutation(nblk), rng.permutation(nblk)
    ls = [src.ctypes.data + blk * int(i) for i in sidx]
    rs = [tm.addr(0, 4096 + blk * int(i)) for i in didx]
    if addrs != "list":
        ls, rs = np.array(ls, addrs), np.array(rs, addrs)
    tm.put_indexed(0, rs, blk, ls, blk)
    for k in range(nblk):
        d, s = 4096 + blk * didx[k], blk * sidx[k]
        assert bytes(mem[d:d + blk]) == bytes(src[s:s + blk])
    back = np.zeros_like(src)
    lb = [back.ctypes.data + blk * int(i) for i in sidx]
    tm.get_indexed_nb(lb, blk, 0, rs, blk).wait()
    np.testing.assert_array_equal(back, src)


def test_indexed_block_sizes_may_differ(env):
    tm, mem = env
    src = np.arange(32, dtype=np.uint8)
    tm.put_indexed(0, [tm.addr(0, 0), tm.addr(0, 100), tm.addr(0, 200), tm.addr(0, 300)], 8,
                   [src.ctypes.data + 16, src.ctypes.data], 16)
    assert list(mem[0:8]) == list(range(16, 24)) and list(mem[100:108]) == list(range(24, 32))
    assert list(mem[200:208]) == list(range(0, 8)) and list(mem[300:308]) == list(range(8, 16))


@pytest.mark.parametrize("mode", MODES)
def test_strided_3d_subarray_matches_numpy(env, mode):
    tm, mem = env
    a = np.arange(6 * 7 * 8, dtype=np.float64).reshape(6, 7, 8)
    sub = a[1:5, 2:6, 3:6]                             # 4 x 4 x 3 elements
    # remote: the same subarray of a 6x7x8 array of doubles at offset 0
    rs = [8, 8 * 8, 8 * 8 * 7]
    ls = [s for s in reversed(sub.strides)]
    count = list(reversed(sub.shape))
    dest = tm.addr(0, 8 * (1 * 56 + 2 * 8 + 3))
    if mode == "blocking":
        tm.put_strided(0, dest, rs, sub.__array_interface__["data"][0], ls, 8, count)
    elif mode == "nb":
        tm.put_strided_nb(0, dest, rs, sub.__array_interface__["data"][0], ls, 8, count).wait()
    else:
        tm.put_strided_nbi(0, dest, rs, sub.__array_interface__["data"][0], ls, 8, count)
        gexmk.nbi_wait(gexmk.EC_PUT)
    got = mem[:a.nbytes].view(np.float64).reshape(a.shape)
    want = np.zeros_like(a)
    want[1:5, 2:6, 3:6] = sub
    np.testing.assert_array_equal(got, want)
    out = np.zeros_like(a)
    tm.get_strided(out, [8, 64, 448], 0, tm.addr(0, 0), [8, 64, 448], 8, [8, 7, 6])
    np.testing.assert_array_equal(out, want)


def test_vector_nb_is_one_event(env):
    tm, _ = env
    data = np.ones(64, np.uint8)
    ev = tm.put_vector_nb(0, [(tm.addr(0, 8 * i), 8) for i in range(8)],
                          [data[8 * i:8 * i + 8] for i in range(8)])
    assert isinstance(ev, gexmk.Event) and ev.test()
    assert tm.get_vector_nb([np.zeros(8, np.uint8)], 0, [(tm.addr(0, 0), 8)]).test()


def test_empty_lists_are_a_no_op(env):
    tm, mem = env
    tm.put_vector(0, [], [])
    tm.put_indexed(0, [], 8, [], 8)
    assert tm.get_vector_nb([], 0, []).test()
    assert not mem.any()


# ---- bad input: refused before a byte moves (STYLE 14: one table) --------------------

def _big():
    return np.zeros(1 << 20, np.uint8)


BAD = [
    # (id, call(tm, src) -> None, exception, words the message must hold)
    ("vector-unequal-totals", lambda tm, s: tm.put_vector(0, [(tm.addr(0, 0), 10)], [s[:11]]),
     ArgumentError, ["totals", "11", "10"]),
    ("vector-block-outside", lambda tm, s: tm.put_vector(
        0, [(tm.addr(0, 0), 8), (tm.addr(0, SEG - 4), 8)], [s[:16]]),
     BoundsError, ["dsts[1]", "outside"]),
    ("vector-get-block-outside", lambda tm, s: tm.get_vector(
        [s[:8]], 0, [(tm.addr(0, SEG), 8)]), BoundsError, ["srcs[0]"]),
    ("vector-remote-not-a-pair", lambda tm, s: tm.put_vector(0, [tm.addr(0, 0)], [s[:8]]),
     TypeError, ["dsts[0]", "(remote address, nbytes)"]),
    ("vector-remote-negative-length", lambda tm, s: tm.put_vector(
        0, [(tm.addr(0, 0), -8)], [s[:8]]), ArgumentError, ["dsts[0] nbytes"]),
    # (address, nbytes) pairs, on the intake's fast path for plain ints and off it
    ("vector-local-pair-null", lambda tm, s: tm.put_vector(
        0, [(tm.addr(0, 0), 8), (tm.addr(0, 8), 8)], [(s.ctypes.data, 8), (0, 8)]),
     ArgumentError, ["srcs[1]", "NULL"]),
    ("vector-local-pair-negative-length", lambda tm, s: tm.put_vector(
        0, [(tm.addr(0, 0), 8)], [(s.ctypes.data, -8)]), ArgumentError, ["srcs[0]", "nbytes"]),
    ("vector-local-pair-float", lambda tm, s: tm.put_vector(
        0, [(tm.addr(0, 0), 8)], [(s.ctypes.data, 8.0)]), TypeError, ["srcs[0]", "nbytes"]),
    ("vector-local-pair-negative-address", lambda tm, s: tm.put_vector(
        0, [(tm.addr(0, 0), 8)], [(-s.ctypes.data, 8)]), ArgumentError, ["srcs[0]", "address"]),
    ("vector-remote-negative-address", lambda tm, s: tm.put_vector(
        0, [(tm.addr(0, 0), 8), (-8, 8)], [s[:16]]), BoundsError, ["dsts[1]"]),
    ("vector-remote-2**64-address", lambda tm, s: tm.put_vector(
        0, [(2 ** 64, 8)], [s[:8]]), BoundsError, ["dsts[0]"]),
    ("indexed-remote-negative-int", lambda tm, s: tm.put_indexed(
        0, [tm.addr(0, 0), -1], 8, [s.ctypes.data] * 2, 8), BoundsError, ["dsts[1]"]),
    ("vector-local-not-a-buffer", lambda tm, s: tm.put_vector(
        0, [(tm.addr(0, 0), 8)], [3.5]), TypeError, ["srcs[0]"]),
    ("vector-local-noncontiguous", lambda tm, s: tm.put_vector(
        0, [(tm.addr(0, 0), 8)], [s[:16:2]]), TypeError, ["srcs[0]", "not contiguous"]),
    ("vector-get-into-bytes", lambda tm, s: tm.get_vector(
        [b"12345678"], 0, [(tm.addr(0, 0), 8)]), TypeError, ["writable"]),
    ("vector-lists-not-lists", lambda tm, s: tm.put_vector(0, 5, [s]), TypeError, ["dsts"]),
    ("vector-bad-rank", lambda tm, s: tm.put_vector(3, [(8, 8)], [s[:8]]), RankError, ["rank 3"]),
    ("indexed-zero-blocksize", lambda tm, s: tm.put_indexed(0, [tm.addr(0, 0)], 0, [1], 0),
     ArgumentError, ["dstlen", "positive"]),
    ("indexed-negative-blocksize", lambda tm, s: tm.put_indexed(
        0, [tm.addr(0, 0)], -8, [s.ctypes.data], 8), ArgumentError, ["dstlen"]),
    ("indexed-unequal-totals", lambda tm, s: tm.put_indexed(
        0, [tm.addr(0, 0)] * 3, 8, [s.ctypes.data] * 2, 8), ArgumentError, ["totals", "24", "16"]),
    ("indexed-block-outside", lambda tm, s: tm.put_indexed(
        0, [tm.addr(0, 0), tm.addr(0, 64), tm.addr(0, SEG - 8), tm.addr(0, SEG - 7)], 8,
        [s.ctypes.data] * 4, 8), BoundsError, ["dsts[3]"]),
    ("indexed-address-below-segment", lambda tm, s: tm.get_indexed(
        [s.ctypes.data], 8, 0, [tm.addr(0, 0) - 8], 8), BoundsError, ["srcs[0]"]),
    # uint64 arrays on both sides (the one-pass intake): what it cannot vouch for
    # goes to the block-by-block checks, which name the block
    ("indexed-arrays-block-outside", lambda tm, s: tm.put_indexed(
        0, np.array([tm.addr(0, 0), tm.addr(0, 64), tm.addr(0, SEG - 7)], np.uint64), 8,
        np.array([s.ctypes.data] * 3, np.uint64), 8), BoundsError, ["dsts[2]"]),
    ("indexed-arrays-below-segment", lambda tm, s: tm.get_indexed(
        np.array([s.ctypes.data] * 2, np.uint64), 8, 0,
        np.array([tm.addr(0, 8), tm.addr(0, 0) - 8], np.uint64), 8), BoundsError, ["srcs[1]"]),
    ("indexed-arrays-null-local", lambda tm, s: tm.put_indexed(
        0, np.array([tm.addr(0, 0), tm.addr(0, 8)], np.uint64), 8,
        np.array([s.ctypes.data, 0], np.uint64), 8), ArgumentError, ["srcs[1]", "NULL"]),
    ("indexed-arrays-2**64-1", lambda tm, s: tm.put_indexed(
        0, np.array([2 ** 64 - 1], np.uint64), 8, np.array([s.ctypes.data], np.uint64), 8),
     BoundsError, ["dsts[0]"]),
    ("indexed-arrays-bad-rank", lambda tm, s: tm.put_indexed(
        0 + 7, np.array([tm.addr(0, 0)], np.uint64), 8, np.array([s.ctypes.data], np.uint64), 8),
     RankError, ["rank 7"]),
    ("indexed-arrays-unequal-lengths", lambda tm, s: tm.put_indexed(
        0, np.array([tm.addr(0, 0)] * 2, np.uint64), 8, np.array([s.ctypes.data] * 3, np.uint64), 8),
     ArgumentError, ["totals"]),
    ("indexed-null-local", lambda tm, s: tm.put_indexed(0, [tm.addr(0, 0)], 8, [0], 8),
     ArgumentError, ["srcs[0]", "NULL"]),
    ("indexed-buffer-of-wrong-size", lambda tm, s: tm.put_indexed(
        0, [tm.addr(0, 0)], 8, [s[:7]], 8), ArgumentError, ["srcs[0]", "7 bytes"]),
    ("indexed-float-address", lambda tm, s: tm.put_indexed(0, [1.5], 8, [s.ctypes.data], 8),
     TypeError, ["dsts[0]"]),
    ("indexed-array-wrong-dtype", lambda tm, s: tm.put_indexed(
        0, np.array([tm.addr(0, 0)], np.float64), 8, [s.ctypes.data], 8), TypeError, ["dsts[0]"]),
    ("strided-zero-count", lambda tm, s: tm.put_strided(0, tm.addr(0, 0), [8], s, [8], 8, [0]),
     ArgumentError, ["count[0]", "at least 1"]),
    ("strided-zero-stride", lambda tm, s: tm.put_strided(0, tm.addr(0, 0), [0], s, [8], 8, [4]),
     ArgumentError, ["dest_strides[0]", "positive"]),
    ("strided-negative-stride", lambda tm, s: tm.put_strided(
        0, tm.addr(0, 64), [8], s, [-8], 8, [4]), ArgumentError, ["src_strides[0]"]),
    ("strided-zero-elemsz", lambda tm, s: tm.put_strided(0, tm.addr(0, 0), [8], s, [8], 0, [4]),
     ArgumentError, ["elemsz"]),
    ("strided-dims-disagree", lambda tm, s: tm.put_strided(
        0, tm.addr(0, 0), [8, 64], s, [8], 8, [4, 4]), ArgumentError, ["dimensions"]),
    ("strided-too-many-dims", lambda tm, s: tm.put_strided(
        0, tm.addr(0, 0), [8] * 9, s, [8] * 9, 1, [1] * 9), ArgumentError, ["at most 8"]),
    ("strided-last-element-outside", lambda tm, s: tm.put_strided(
        0, tm.addr(0, 0), [8, SEG // 4], s, [8, 32], 8, [4, 5]), BoundsError, ["element (3, 4)"]),
    ("strided-first-element-outside", lambda tm, s: tm.get_strided(
        s, [8], 0, tm.addr(0, SEG), [8], 8, [2]), BoundsError, ["element (0,)"]),
    ("strided-beyond-local-buffer", lambda tm, s: tm.put_strided(
        0, tm.addr(0, 0), [8], s[:16], [8], 8, [4]), ArgumentError, ["src", "16 bytes"]),
    ("put-array-outside", lambda tm, s: tm.put(0, tm.addr(0, SEG - 8), s[:32:2]),
     BoundsError, ["outside"]),
    ("get-array-readonly", lambda tm, s: tm.get(np.broadcast_to(s[:4], (3, 4)), 0, tm.addr(0, 0)),
     TypeError, ["writable"]),
]


@pytest.mark.parametrize("call,exc,words", [pytest.param(c, e, w, id=i) for i, c, e, w in BAD])
def test_bad_input_is_refused_before_a_byte_moves(env, call, exc, words):
    tm, mem = env
    src = np.full(4096, 0xAB, np.uint8)
    with pytest.raises(exc) as ei:
        call(tm, src)
    for w in words:
        assert w in str(ei.value), f"{w!r} not in {ei.value}"
    assert not mem.any(), "bytes moved before the refusal"


def test_lists_longer_than_the_limit_are_refused(env):
    tm, _ = env

    class Huge(list):
        def __len__(self):
            return 1 << 40
    with pytest.raises(ArgumentError, match="at most"):
        tm.put_vector(0, Huge(), [])


def test_stream_forms_refuse_a_bad_stream_and_need_a_device_kind(env):
    """Without a GPU: the _on_stream forms check their stream argument, and a host
    target on a stream needs a device segment bound to the initiating endpoint
    (the copy engine orders it), as the contiguous put_on_stream does."""
    tm, mem = env
    col = np.arange(64.0).reshape(8, 8)[:, 2]
    with pytest.raises(TypeError, match="stream"):
        tm.put_strided_on_stream(0, tm.addr(0, 0), [8], col, [64], 8, [8], "s")
    with pytest.raises(gexmk.ArgumentError, match="default stream"):
        tm.put_vector_on_stream(0, [(tm.addr(0, 0), 8)], [col[:1].copy()], 0)
    for call in (lambda: tm.put_on_stream(0, tm.addr(0, 0), col, 12345),
                 lambda: tm.put_indexed_on_stream(0, [tm.addr(0, 0)], 8, [col.ctypes.data], 8,
                                                  12345),
                 lambda: tm.get_strided_on_stream(np.zeros(8), [8], 0, tm.addr(0, 0), [8], 8, [8],
                                                  12345)):
        with pytest.raises(gexmk.UnsupportedError, match="device segment"):
            call()
    assert not mem.any()
