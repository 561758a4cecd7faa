"""VIS (issue 22) on device segments in one process: strided shapes through the copy
engine (cuMemcpy2DAsync/3DAsync), vector and indexed lists through one batched call
(cuMemcpyBatchAsync, or a cuMemcpyAsync loop on older drivers), non-contiguous CuPy
views as the local side of put/get, each checked against numpy.  Two-process device
paths are the conformance matrix's GPU rows (VIS operations, local devseg and
devseg-strided).  Marked ``gpu``; skipped without a driver, a device and CuPy."""
import numpy as np
import pytest

import gexmk


def _usable():
    try:
        from gexmk.kinds import cuda
        p = cuda.probe()
        if not (p.get("driver_loaded") and p.get("device_count")):
            return False
        import cupy  # noqa: F401
        return True
    except Exception:          # noqa: BLE001 - no usable GPU
        return False


pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not _usable(), reason="no NVIDIA driver, GPU or CuPy here")]
MiB = 1 << 20


@pytest.fixture
def dev(client):
    """(tm, cupy, device array over the device segment bound to EP 0 and published)."""
    import cupy as cp
    mk = client.mk_create(gexmk.CUDA_UVA, device=0)
    seg = client.segment_create(4 * MiB, kind=mk)
    client.ep(0).bind_segment(seg)
    client.tm.publish_bound_segment([client.ep(0)])
    arr = cp.asarray(seg).view(cp.uint8)
    arr[:] = 0
    cp.cuda.runtime.deviceSynchronize()
    return client.tm, cp, arr, seg


@pytest.mark.parametrize("mode", ["blocking", "nb", "nbi"])
def test_strided_host_to_device_subarray(dev, mode):
    tm, cp, arr, seg = dev
    a = np.arange(6 * 7 * 8, dtype=np.float64).reshape(6, 7, 8)
    sub = a[1:5, 2:6, 3:6]
    dest = tm.addr(0, 8 * (1 * 56 + 2 * 8 + 3))
    args = (0, dest, [8, 64, 448], sub.__array_interface__["data"][0],
            list(reversed(sub.strides)), 8, list(reversed(sub.shape)))
    if mode == "blocking":
        tm.put_strided(*args)
    elif mode == "nb":
        tm.put_strided_nb(*args).wait()
    else:
        tm.put_strided_nbi(*args)
        gexmk.nbi_wait(gexmk.EC_PUT)
    got = cp.asnumpy(arr[:a.nbytes]).view(np.float64).reshape(a.shape)
    want = np.zeros_like(a)
    want[1:5, 2:6, 3:6] = sub
    np.testing.assert_array_equal(got, want)
    back = np.zeros_like(a)
    tm.get_strided(back, [8, 64, 448], 0, tm.addr(0, 0), [8, 64, 448], 8, [8, 7, 6])
    np.testing.assert_array_equal(back, want)


def test_indexed_device_to_device_kv_blocks(dev):
    tm, cp, arr, seg = dev
    rng = np.random.default_rng(7)
    n, blk = 64, 16 * 1024
    arr[2 * MiB:] = cp.asarray(rng.integers(0, 256, 2 * MiB, dtype=np.uint8))
    soff = rng.permutation(2 * MiB // blk)[:n] * blk
    doff = rng.permutation(2 * MiB // blk)[:n] * blk
    la = (soff + seg.address + 2 * MiB).astype(np.uint64)
    ra = (doff + tm.addr(0, 0)).astype(np.uint64)
    tm.put_indexed(0, ra, blk, la, blk)
    host = cp.asnumpy(arr)
    for i in range(n):
        s0, d0 = 2 * MiB + soff[i], doff[i]
        assert bytes(host[d0:d0 + blk]) == bytes(host[s0:s0 + blk]), f"block {i}"
    ev = tm.get_indexed_nb(la, blk, 0, ra, blk)      # and back, as one event
    ev.wait()
    assert ev.test()


def test_vector_between_host_and_device(dev):
    tm, cp, arr, seg = dev
    data = np.arange(1, 61, dtype=np.uint8)
    tm.put_vector(0, [(tm.addr(0, 1000), 25), (tm.addr(0, 500), 35)], [data[:10], data[10:]])
    host = cp.asnumpy(arr)
    assert list(host[1000:1025]) == list(data[:25]) and list(host[500:535]) == list(data[25:])
    out = np.zeros(60, np.uint8)
    tm.get_vector([out], 0, [(tm.addr(0, 1000), 25), (tm.addr(0, 500), 35)])
    np.testing.assert_array_equal(out, data)


def test_noncontiguous_cupy_view_in_the_segment_moves_strided(dev):
    tm, cp, arr, seg = dev
    mat = arr[MiB:MiB + 64 * 64 * 8].view(cp.float64).reshape(64, 64)
    mat[...] = cp.arange(64 * 64, dtype=cp.float64).reshape(64, 64)
    col = mat[:, 5]                                   # stride 512 B, inside the device segment
    tm.put(0, tm.addr(0, 0), col)
    np.testing.assert_array_equal(cp.asnumpy(arr[:512]).view(np.float64), cp.asnumpy(col))
    arr[:512] = cp.asarray(np.arange(64, dtype=np.float64).view(np.uint8))
    tm.get(mat[:, 9], 0, tm.addr(0, 0))
    np.testing.assert_array_equal(cp.asnumpy(mat[:, 9]), np.arange(64, dtype=np.float64))
    assert cp.asnumpy(mat[:, 8]).tolist() == list(np.arange(8, 64 * 64, 64, dtype=np.float64))


def test_a_cupy_view_outside_the_segment_of_the_endpoints_kind_moves(dev):
    """Device memory of the endpoint's own kind outside its segment (issue 20): the
    route's copy engine takes it, strided, as it takes the segment's."""
    tm, cp, arr, seg = dev
    other = cp.arange(16 * 16, dtype=cp.float64).reshape(16, 16)
    tm.put(0, tm.addr(0, 0), other[:, 3])
    np.testing.assert_array_equal(cp.asnumpy(arr[:128]).view(np.float64),
                                  cp.asnumpy(other[:, 3]))
    tm.put_indexed(0, [tm.addr(0, 4096)], 128, [other[5].data.ptr], 128)
    np.testing.assert_array_equal(cp.asnumpy(arr[4096:4096 + 128]).view(np.float64),
                                  cp.asnumpy(other[5]))


def test_stream_forms_follow_the_stream(dev):
    """*_on_stream: enqueued behind the kernel that wrote the sources, no host wait;
    complete once the stream is synchronised."""
    tm, cp, arr, seg = dev
    s = cp.cuda.Stream(non_blocking=True)
    blk, n = 4096, 32
    soff = np.arange(n) * blk + 2 * MiB
    doff = np.arange(n)[::-1] * blk
    with s:
        arr[2 * MiB:2 * MiB + n * blk] = 7                   # a kernel on the stream
    tm.put_indexed_on_stream(0, (doff + tm.addr(0, 0)).astype(np.uint64), blk,
                             (soff + seg.address).astype(np.uint64), blk, s)
    mat = arr[MiB:MiB + 64 * 64 * 8].view(cp.float64).reshape(64, 64)
    with s:
        mat[...] = 3.0
    tm.put_on_stream(0, tm.addr(0, 3 * MiB), mat[:, 1], s)   # a column, strided on the stream
    tm.put_strided_on_stream(0, tm.addr(0, 3 * MiB + 4096), [8, 512], mat, [16, 512], 8, [4, 8], s)
    s.synchronize()
    host = cp.asnumpy(arr)
    assert (host[:n * blk] == 7).all()
    assert (host[3 * MiB:3 * MiB + 512].view(np.float64) == 3.0).all()
    assert (host[3 * MiB + 4096:3 * MiB + 4096 + 8 * 512].view(np.float64).reshape(8, 64)[:, :4]
            == 3.0).all()


@pytest.mark.parametrize("mode", ["blocking", "nb", "nbi"])
def test_device_blocks_to_a_host_segment(dev, mode):
    """Device blocks (the endpoint's device segment) into a host segment mapped
    here, one batched copy through the endpoint's kind (KV offload to host)."""
    tm, cp, arr, seg = dev
    client = tm.client
    ep2 = client.ep_create()
    host = client.segment_attach(1 * MiB, ep=ep2)
    rng = np.random.default_rng(11)
    n, blk = 16, 4096
    arr[2 * MiB:2 * MiB + n * blk] = cp.asarray(rng.integers(0, 256, n * blk, dtype=np.uint8))
    cp.cuda.runtime.deviceSynchronize()
    la = (np.arange(n) * blk + seg.address + 2 * MiB).astype(np.uint64)
    ra = (rng.permutation(n) * blk + host.address).astype(np.uint64)
    tm3 = client.ep(0).pair(ep2.index)                 # from the device-bound EP 0 to ep2
    ra3 = (ra - host.address + tm3.addr(0, 0)).astype(np.uint64)
    if mode == "blocking":
        tm3.put_indexed(0, ra3, blk, la, blk)
    elif mode == "nb":
        tm3.put_indexed_nb(0, ra3, blk, la, blk).wait()
    else:
        tm3.put_indexed_nbi(0, ra3, blk, la, blk)
        gexmk.nbi_wait(gexmk.EC_PUT)
    h = np.asarray(host).view(np.uint8)
    src = cp.asnumpy(arr[2 * MiB:2 * MiB + n * blk])
    for i in range(n):
        d0 = int(ra[i] - host.address)
        assert bytes(h[d0:d0 + blk]) == bytes(src[i * blk:(i + 1) * blk]), f"block {i}"


def _gather_count(seg):
    return seg.kind.impl.gather_launches          # the kind whose device copies to the segment


@pytest.mark.parametrize("mode", ["blocking", "nb", "nbi", "stream"])
def test_device_lists_go_to_the_gather_kernel(dev, mode):
    """Lists of small device<->device copies take one launch of the gather kernel
    (copy_gather) instead of the copy engine: blocks of every alignment (16-byte
    and byte paths), blocks over 64 KiB (cut into pieces), and more pieces than one
    launch takes (2048: four launches wrap the descriptor slots), checked byte for
    byte, both ways."""
    tm, cp, arr, seg = dev
    rng = np.random.default_rng(23)
    src = cp.asarray(rng.integers(0, 256, 3 * MiB, dtype=np.uint8))   # own kind, outside the segment
    # 7000 blocks: small aligned, odd lengths at odd offsets, and two of 200 KiB
    sizes = [16 * ((i % 5) + 1) if i % 3 else 1 + (i % 37) for i in range(6998)] + [200 << 10] * 2
    sizes = np.array(sizes, dtype=np.int64)
    pos = np.concatenate([[0], np.cumsum(sizes + 16)])[:-1] + 3   # gaps, odd starts
    assert pos[-1] + sizes[-1] < 3 * MiB
    perm = rng.permutation(len(sizes))
    dpos = np.concatenate([[0], np.cumsum((sizes + 32)[perm])])[:-1] + 1
    dst = np.empty(len(sizes), np.int64)
    dst[perm] = dpos
    assert dpos[-1] + sizes[perm][-1] < 4 * MiB
    before = _gather_count(seg)
    local = [(src.data.ptr + int(p), int(n)) for p, n in zip(pos, sizes)]
    remote = [(tm.addr(0, int(d)), int(n)) for d, n in zip(dst, sizes)]
    if mode == "blocking":
        tm.put_vector(0, remote, local)
    elif mode == "nb":
        tm.put_vector_nb(0, remote, local).wait()
    elif mode == "nbi":
        tm.put_vector_nbi(0, remote, local)
        gexmk.nbi_wait(gexmk.EC_PUT)
    else:
        s = cp.cuda.Stream(non_blocking=True)
        tm.put_vector_on_stream(0, remote, local, s)
        s.synchronize()
    assert _gather_count(seg) >= before + 4         # > 2048 pieces: several launches
    got, want = cp.asnumpy(arr), cp.asnumpy(src)
    for i in range(len(sizes)):
        d0, s0, n = int(dst[i]), int(pos[i]), int(sizes[i])
        assert bytes(got[d0:d0 + n]) == bytes(want[s0:s0 + n]), f"block {i} ({n} bytes)"
    back = cp.zeros(3 * MiB, dtype=cp.uint8)
    tm.get_vector([(back.data.ptr + int(p), int(n)) for p, n in zip(pos, sizes)], 0, remote)
    b = cp.asnumpy(back)
    for i in range(len(sizes)):
        s0, n = int(pos[i]), int(sizes[i])
        assert bytes(b[s0:s0 + n]) == bytes(want[s0:s0 + n]), f"block {i} back"


def test_host_lists_stay_on_the_copy_engine(dev):
    """A list with host blocks on one side is not the kernel's (it reaches device
    memory only): the copy engine moves it, and the kernel is not launched."""
    tm, cp, arr, seg = dev
    before = _gather_count(seg)
    data = np.arange(64 * 256, dtype=np.uint8) % 251
    tm.put_indexed(0, [tm.addr(0, 4096 * i) for i in range(64)], 256,
                   [data.ctypes.data + 256 * i for i in range(64)], 256)
    got = cp.asnumpy(arr)
    for i in range(64):
        assert bytes(got[4096 * i:4096 * i + 256]) == bytes(data[256 * i:256 * (i + 1)])
    assert _gather_count(seg) == before


def test_int_addresses_are_classified_per_block(dev):
    """Indexed lists of int addresses: device memory of the endpoint's kind outside
    its segment moves on the device path, host addresses on theirs, and a list
    that mixes the two is refused by name before a byte moves."""
    tm, cp, arr, seg = dev
    other = cp.arange(64 * 64, dtype=cp.uint8).reshape(64, 64)
    tm.put_indexed(0, [tm.addr(0, 8192 + 128 * i) for i in range(32)], 64,
                   [other[i].data.ptr for i in range(32)], 64)
    got = cp.asnumpy(arr)
    want = cp.asnumpy(other)
    for i in range(32):
        assert bytes(got[8192 + 128 * i:8192 + 128 * i + 64]) == bytes(want[i])
    host = np.full(64 * 32, 7, dtype=np.uint8)
    mixed = [other[i].data.ptr for i in range(16)] + [host.ctypes.data + 64 * i for i in range(16)]
    arr[:] = 0
    with pytest.raises(gexmk.ArgumentError, match="mixes device blocks with host blocks"):
        tm.put_indexed(0, [tm.addr(0, 128 * i) for i in range(32)], 64, mixed, 64)
    assert int(cp.count_nonzero(arr)) == 0


def test_vector_pairs_are_classified_in_bulk(dev):
    """(address, nbytes) pairs as the local side of a vector: device memory of the
    endpoint's kind outside its segment, in it, or both in one list, moves on the
    device path; host pairs on theirs; a list mixing host and device pairs is
    refused by name before a byte moves."""
    tm, cp, arr, seg = dev
    other = cp.arange(64 * 64, dtype=cp.uint8).reshape(64, 64)
    want = cp.asnumpy(other)
    # outside the segment only
    tm.put_vector(0, [(tm.addr(0, 128 * i), 64) for i in range(32)],
                  [(other[i].data.ptr, 64) for i in range(32)])
    got = cp.asnumpy(arr)
    for i in range(32):
        assert bytes(got[128 * i:128 * i + 64]) == bytes(want[i])
    # half in the segment (its last MiB), half outside: all device memory
    arr[3 * MiB:3 * MiB + 64 * 64] = other.reshape(-1)
    inseg = [(seg.address + 3 * MiB + 64 * i, 64) for i in range(16)]
    outseg = [(other[i].data.ptr, 64) for i in range(16, 32)]
    arr[:64 * 128] = 0
    tm.put_vector(0, [(tm.addr(0, 128 * i), 64) for i in range(32)], inseg + outseg)
    got = cp.asnumpy(arr)
    for i in range(32):
        assert bytes(got[128 * i:128 * i + 64]) == bytes(want[i]), f"block {i}"
    # host pairs
    host = np.arange(32 * 64, dtype=np.uint8) % 199
    tm.put_vector(0, [(tm.addr(0, 8192 + 128 * i), 64) for i in range(32)],
                  [(host.ctypes.data + 64 * i, 64) for i in range(32)])
    got = cp.asnumpy(arr)
    for i in range(32):
        assert bytes(got[8192 + 128 * i:8192 + 128 * i + 64]) == bytes(host[64 * i:64 * (i + 1)])
    # host and device pairs in one list
    arr[:] = 0
    mixed = outseg + [(host.ctypes.data + 64 * i, 64) for i in range(16)]
    with pytest.raises(gexmk.ArgumentError, match="mixes device blocks with host blocks"):
        tm.put_vector(0, [(tm.addr(0, 128 * i), 64) for i in range(32)], mixed)
    assert not cp.asnumpy(arr).any()
