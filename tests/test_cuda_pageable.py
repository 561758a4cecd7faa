"""Copies between device segments and *pageable* host memory (a numpy array
the driver does not know) are pipelined through the endpoint's pinned bounce
buffers, the CPU side split over the copy pool's threads; small ones go to
the driver as they are.  Checked: both directions, sizes that are not
multiples of the chunk, odd sizes, below the threshold, NB/NBI modes, several
pipeline settings; data compared byte for byte.  Also ``GEXMK_CUDA_SMALL_PUT
=write_value`` (cuStreamWriteValue for 4/8 B host->device puts).

The copy pool itself (CPU only) is checked here on any machine."""
import numpy as np
import pytest

import gexmk
from gexmk import errors as E

try:
    from .test_cuda_segments import HAVE_GPU
except ImportError:
    from test_cuda_segments import HAVE_GPU

gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not HAVE_GPU, reason="no NVIDIA driver or device on this machine")
MiB = 1 << 20


# ---- CPU: the copy pool and the settings -----------------------------------------------

@pytest.mark.parametrize("threads", [0, 1, 3, 8])
@pytest.mark.parametrize("n", [0, 1, 4095, 512 * 1024 + 3, 5 * MiB + 17])
def test_copy_pool_copies_every_byte(monkeypatch, threads, n):
    from gexmk.transports import local
    monkeypatch.setenv("GEXMK_PAGEABLE_THREADS", str(threads))
    with gexmk.init():          # the transport reads its settings at init
        assert local.pipeline_settings()["threads"] == threads
        src = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
        dst = np.zeros(n + 64, np.uint8)
        local._pool_copy(dst[32:32 + n], src)
        assert (dst[32:32 + n] == src).all()
        assert not dst[:32].any() and not dst[32 + n:].any()


@pytest.mark.parametrize("to_host", [False, True], ids=["htod", "dtoh"])
@pytest.mark.parametrize("nbuf", [1, 2, 3])
@pytest.mark.parametrize("n,chunk", [(4 * 65536, 65536), (3 * 65536 + 5, 65536), (4097, 8192),
                                     (1, 4096), (2 * MiB + 77, 256 * 1024)])
def test_pipeline_chunking_on_a_stand_in_kind(to_host, nbuf, n, chunk):
    """The pipeline's ring of bounce buffers, both directions, sizes that
    are and are not multiples of the chunk, 1 to 3 buffers: every byte
    arrives once, nothing outside the destination is touched, one 'DMA' per
    chunk (a stand-in kind whose DMA is a memcpy; the GPU tests run the real one)."""
    from gexmk.transports import local
    src = np.random.default_rng([n, chunk, nbuf]).integers(0, 256, n, dtype=np.uint8)
    dst = np.zeros(n + 128, np.uint8)
    dmas = local._selftest_pipeline(dst[64:64 + n], src, to_host, chunk, nbuf, threads=3)
    assert (dst[64:64 + n] == src).all()
    assert not dst[:64].any() and not dst[64 + n:].any()
    assert dmas == -(-n // chunk)


def test_pageable_settings_parse():
    from gexmk import config
    c = config.load({"GEXMK_PAGEABLE_CHUNK": "2M", "GEXMK_PAGEABLE_BUFFERS": "3",
                     "GEXMK_PAGEABLE_MIN": "512k", "GEXMK_PAGEABLE_THREADS": "0",
                     "GEXMK_CUDA_SMALL_PUT": "write_value"})
    assert (c.pageable_chunk, c.pageable_buffers, c.pageable_min, c.pageable_threads,
            c.cuda_small_put) == (2 * MiB, 3, 512 * 1024, 0, "write_value")
    assert config.load({"GEXMK_CUDA_SMALL_PUT": " Kernel, write_value"}).cuda_small_put == \
        "write_value,kernel"
    d = config.load({})
    assert (d.pageable_chunk, d.pageable_buffers, d.pageable_min, d.pageable_threads,
            d.cuda_small_put) == (4 * MiB, 4, MiB, config.PAGEABLE_THREADS_DEFAULT, "kernel")
    for name, bad in (("GEXMK_PAGEABLE_CHUNK", "12"), ("GEXMK_PAGEABLE_CHUNK", "lots"),
                      ("GEXMK_PAGEABLE_BUFFERS", "17"), ("GEXMK_PAGEABLE_BUFFERS", "2M"),
                      ("GEXMK_PAGEABLE_THREADS", "-1"), ("GEXMK_CUDA_SMALL_PUT", "dma"),
                      ("GEXMK_CUDA_SMALL_PUT", "copy,kernel")):
        with pytest.raises(E.ArgumentError, match=name):
            config.load({name: bad})


# ---- GPU --------------------------------------------------------------------------------

SETTINGS = {
    "default": {},
    "small_chunks_one_thread": {"GEXMK_PAGEABLE_CHUNK": "256K", "GEXMK_PAGEABLE_BUFFERS": "2",
                                "GEXMK_PAGEABLE_THREADS": "0", "GEXMK_PAGEABLE_MIN": "300K"},
    "many_threads": {"GEXMK_PAGEABLE_CHUNK": "1M", "GEXMK_PAGEABLE_BUFFERS": "3",
                     "GEXMK_PAGEABLE_THREADS": "7"},
}


@gpu
@needs_gpu
@pytest.mark.timeout(120)
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_pageable_both_ways_data_checked(monkeypatch, setting):
    from gexmk.transports import local
    for k, v in SETTINGS[setting].items():
        monkeypatch.setenv(k, v)
    n = 64 * MiB
    with gexmk.init() as c:
        mk = c.mk_create(gexmk.CUDA_UVA, 0)
        c.segment_attach(4096)
        ep1 = c.ep_create()
        d1 = c.segment_create(n + 2 * MiB, kind=mk)
        ep1.bind_segment(d1)
        tm = c.ep(0).pair(1)                       # host EP -> device segment
        st = local.pipeline_settings()
        before = st["pipelined"]
        rng = np.random.default_rng(7)
        big = rng.integers(0, 256, n + 2 * MiB, dtype=np.uint8)
        assert not mk.impl.host_pinned(big.ctypes.data, big.nbytes)
        sizes = [n, n + 12345, 3 * MiB + 1, st["min"] + 7, st["min"] - 1, 1000, 8, 1]
        piped = 0
        for i, m in enumerate(sizes):
            off = (i * 4099) % MiB                 # odd offsets on both sides
            src = big[off:off + m]
            tm.put(0, d1.address + off, src)       # pageable -> device
            back = np.zeros(m + 16, np.uint8)
            tm.get(back[3:3 + m], 0, d1.address + off)   # device -> pageable
            assert (back[3:3 + m] == src).all(), (setting, m)
            assert not back[:3].any() and not back[3 + m:].any()
            piped += 2 if m >= st["min"] else 0
        assert local.pipeline_settings()["pipelined"] - before == piped
        # NB and NBI modes complete (the pipelined copy is complete at issue)
        src = big[5:5 + 9 * MiB + 3]
        tm.put_nb(0, d1.address, src).wait()
        out = np.zeros(src.size, np.uint8)
        tm.get_nbi(out, 0, d1.address)
        gexmk.nbi_wait()
        assert (out == src).all()
        tm.put_nbi(0, d1.address + 1, big[:5 * MiB], lc=gexmk.LC_GROUP)
        gexmk.nbi_wait()
        out2 = np.zeros(5 * MiB, np.uint8)
        gexmk.wait_all([tm.get_nb(out2, 0, d1.address + 1)])
        assert (out2 == big[:5 * MiB]).all()
        # pinned host memory (a registered host segment) takes the plain driver copy
        hs = c.segment_create(8 * MiB)
        ep2 = c.ep_create()
        ep2.bind_segment(hs)                       # pinned at bind (a device segment exists)
        assert mk.impl.host_pinned(hs.address, hs.size)
        np.asarray(hs)[:] = big[:8 * MiB]
        before = local.pipeline_settings()["pipelined"]
        ep2.pair(1).put(0, d1.address, (hs.address, 8 * MiB))
        assert local.pipeline_settings()["pipelined"] == before
        assert (_fetch(tm, d1, 8 * MiB) == big[:8 * MiB]).all()


def _fetch(tm, d1, m):
    out = np.zeros(m, np.uint8)
    tm.get(out, 0, d1.address)
    return out


@gpu
@needs_gpu
@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["copy", "write_value", "kernel", "write_value,kernel"])
def test_small_put_mechanisms(monkeypatch, mode):
    monkeypatch.setenv("GEXMK_CUDA_SMALL_PUT", mode)
    from gexmk.transports import local
    with gexmk.init() as c:
        assert local.pipeline_settings()["small_put"] == mode
        mk = c.mk_create(gexmk.CUDA_UVA, 0)
        c.segment_attach(4096)
        ep1, ep2 = c.ep_create(), c.ep_create()
        d1 = c.segment_create(1 * MiB, kind=mk)
        d2 = c.segment_create(1 * MiB, kind=mk)
        ep1.bind_segment(d1)
        ep2.bind_segment(d2)
        tm = c.ep(0).pair(1)                           # host EP -> d1
        dd = ep2.pair(1)                               # d2 -> d1: device to device
        a = d1.address
        tm.put_val(0, a, 0x1122334455667788)           # 8 B aligned
        tm.put_val(0, a + 8, 0xAABBCCDD, 4)            # 4 B aligned
        tm.put_val(0, a + 13, 0x0102030405060708)      # 8 B unaligned: a copy either way
        tm.put(0, a + 24, np.array([7, 8, 9], np.uint8))   # 3 B
        tm.put_nb(0, a + 32, np.array([0x55AA55AA55AA55AA], np.uint64)).wait()
        tm.put_nbi(0, a + 40, np.array([0x01020304], np.uint32), lc=gexmk.LC_GROUP)
        gexmk.nbi_wait()
        assert tm.get_val(0, a) == 0x1122334455667788
        assert tm.get_val(0, a + 8, 4) == 0xAABBCCDD
        assert tm.get_val(0, a + 13) == 0x0102030405060708
        got = np.zeros(48, np.uint8)
        tm.get(got, 0, a)
        assert list(got[24:27]) == [7, 8, 9]
        assert got[32:40].view(np.uint64)[0] == 0x55AA55AA55AA55AA
        assert got[40:44].view(np.uint32)[0] == 0x01020304
        # device -> device, 1..9 bytes at odd offsets, blocking, NB and NBI, and gets back
        pat = np.random.default_rng(3).integers(1, 256, 4096, dtype=np.uint8)
        c.ep(0).pair(2).put(0, d2.address, pat)        # fill d2 from the host
        for m in range(1, 10):
            dd.put(0, a + 100 * m + m, (d2.address + m, m))
            dd.put_nb(0, a + 2000 + 16 * m + 1, (d2.address + 3, m)).wait()
            dd.put_nbi(0, a + 3000 + 16 * m, (d2.address + 5, m), lc=gexmk.LC_GROUP)
            dd.get((d2.address + 1000 + 16 * m, m), 0, a + 100 * m + m)
        gexmk.nbi_wait()
        whole = np.zeros(4096, np.uint8)
        tm.get(whole, 0, a)
        back = np.zeros(4096, np.uint8)
        c.ep(0).pair(2).get(back, 0, d2.address)
        for m in range(1, 10):
            assert (whole[100 * m + m:100 * m + 2 * m] == pat[m:2 * m]).all(), m
            assert (whole[2000 + 16 * m + 1:2000 + 16 * m + 1 + m] == pat[3:3 + m]).all(), m
            assert (whole[3000 + 16 * m:3000 + 16 * m + m] == pat[5:5 + m]).all(), m
            assert (back[1000 + 16 * m:1000 + 16 * m + m] == pat[m:2 * m]).all(), m
        # the kind's slots from Python
        mk.impl.write_value(a + 16, 0xDEADBEEF, 4)
        assert tm.get_val(0, a + 16, 4) == 0xDEADBEEF
        with pytest.raises(E.ArgumentError, match="aligned"):
            mk.impl.write_value(a + 2, 1, 8)
        for m in (0, 1, 7, 64):
            mk.impl.copy_small(a + 500, d2.address + 64, m)
            if m:
                assert (_fetch(tm, d1, 600)[500:500 + m] == pat[64:64 + m]).all(), m
        with pytest.raises(E.ArgumentError, match="nbytes"):
            mk.impl.copy_small(a, d2.address, 65)
