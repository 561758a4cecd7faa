"""Stream-ordered signals (issue 10, NVSHMEM putmem_signal_on_stream and
signal_wait_until_on_stream): a put_signal enqueued on a CUDA stream after
the kernel that produced the data, and a stream that waits on the GPU for a
signal word before the kernel that consumes the data, with no host
synchronisation on either side.  GPU tests carry the ``gpu`` marker; the
refusals (host words, host targets, comparisons the GPU cannot evaluate) are
checked everywhere."""
import pytest

import gexmk
from gexmk import errors as E

try:
    from . import mp_util
    from .test_cuda_segments import PROBE, HAVE_GPU
except ImportError:
    import mp_util
    from test_cuda_segments import PROBE, HAVE_GPU

gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not HAVE_GPU, reason="no NVIDIA driver or device on this machine")


def test_on_stream_forms_refused_where_they_cannot_work():
    with gexmk.init() as c:
        c.segment_attach(1 << 16)
        tm = c.tm
        assert tm.put_signal_on_stream.__doc__ and tm.signal_wait_until_on_stream.__doc__
        with pytest.raises(E.UnsupportedError, match="device segment"):
            tm.signal_wait_until_on_stream(tm.addr(0, 8), gexmk.CMP_EQ, 1, 1)
        with pytest.raises(E.UnsupportedError, match="put_signal_on_stream"):
            tm.put_signal_on_stream(0, tm.addr(0, 64), b"x" * 8, tm.addr(0, 8), 1,
                                    gexmk.SIGNAL_SET, 1)
        with pytest.raises(E.ArgumentError, match="sig_op"):
            tm.put_signal_on_stream(0, tm.addr(0, 64), b"x" * 8, tm.addr(0, 8), 1, 7, 1)
        with pytest.raises(E.BoundsError):
            tm.put_signal_on_stream(0, tm.addr(0, 64), b"x" * 8, tm.addr(0, 12), 1,
                                    gexmk.SIGNAL_SET, 1)
        with pytest.raises(E.BoundsError, match="outside the bound segment"):
            tm.put_signal_on_stream(0, tm.addr(0, (1 << 16) - 4), b"x" * 8, tm.addr(0, 8), 1,
                                    gexmk.SIGNAL_SET, 1)
        with pytest.raises(E.RankError):
            tm.put_signal_on_stream(3, tm.addr(0, 64), b"x" * 8, tm.addr(0, 8), 1,
                                    gexmk.SIGNAL_SET, 1)
        with pytest.raises(TypeError, match="signal"):
            tm.put_signal_on_stream(0, tm.addr(0, 64), b"x" * 8, tm.addr(0, 8), 1.0,
                                    gexmk.SIGNAL_SET, 1)
        with pytest.raises(OverflowError, match="value"):
            tm.signal_wait_until_on_stream(tm.addr(0, 8), gexmk.CMP_EQ, -1, 1)
        with pytest.raises(TypeError, match="stream"):
            tm.signal_wait_until_on_stream(tm.addr(0, 8), gexmk.CMP_EQ, 1, "s")


WORKER = r'''
import cupy
c = gexmk.init()
tm = c.tm
me, peer = tm.rank, 1 - tm.rank
device = me if os.environ.get("GX_TEST_TWO_GPUS") else 0
mk = c.mk_create(gexmk.CUDA_UVA, device)
hseg = c.segment_attach(1 << 16)
ep1 = c.ep_create()
n = 1 << 20
dseg = c.segment_create(4 * n, kind=mk)
ep1.bind_segment(dseg)
tm.publish_bound_segment([ep1])
dev = ep1.pair(1)
assert dev.paths(peer)["rma"] == "nbrhd", dev.paths(peer)
sig = dev.addr(me, 3 * n)                      # my signal word (in my device segment)
with cupy.cuda.Device(device):
    whole = cupy.asarray(dseg)
    words = whole[3 * n:3 * n + 64].view(cupy.uint64)
    words[:] = 0
    cupy.cuda.Device(device).synchronize()
    s = cupy.cuda.Stream(non_blocking=True)
    src, inbox, copy = whole[:n], whole[n:2 * n], whole[2 * n:3 * n]
tm.barrier()
with cupy.cuda.Device(device):
    for k in range(1, 4):
        if k > 1:       # the peer has copied round k-1 out of its inbox (its ack, word 1)
            dev.signal_wait_until_on_stream(sig + 8, gexmk.CMP_GE, k - 1, s)
        with s:
            src.fill(10 * k + me)                     # the kernel that makes the data
        # the put and its signal follow that kernel on the stream; no host wait.
        # Rounds alternate SIGNAL_ADD 1 and SIGNAL_SET k: the word reads k either way
        value, op = (1, gexmk.SIGNAL_ADD) if k % 2 else (k, gexmk.SIGNAL_SET)
        dev.put_signal_on_stream(peer, dev.addr(peer, n), src, dev.addr(peer, 3 * n), value,
                                 op, s)
        # the consumer: my stream waits on the GPU for the peer's k-th signal, then a
        # kernel copies what arrived
        dev.signal_wait_until_on_stream(sig, gexmk.CMP_GE, k, s)
        with s:
            copy[:] = inbox
        s.synchronize()
        got = cupy.asnumpy(copy)
        assert (got == 10 * k + peer).all(), (k, got[:4], got[-4:])
        dev.signal_op(peer, dev.addr(peer, 3 * n + 8), k)   # ack: my copy of round k is done
    # CMP_GT maps to >= value + 1; CMP_NE has no stream form
    dev.signal_wait_until_on_stream(sig, gexmk.CMP_GT, 2, s)
    s.synchronize()
    expect_raises(E.UnsupportedError, dev.signal_wait_until_on_stream, sig, gexmk.CMP_NE, 0, s)
    assert int(words[0].get()) == 3, int(words[0].get())
tm.barrier()
c.finalize()
print("OK", me, flush=True)
'''


@gpu
@needs_gpu
@pytest.mark.timeout(120)
@pytest.mark.parametrize("gpus", [1, 2], ids=["one_gpu", "two_gpus"])
def test_put_signal_and_wait_on_streams_across_processes(tmp_path, gpus):
    pytest.importorskip("cupy")
    if gpus > PROBE.get("device_count", 0):
        pytest.skip(f"needs {gpus} GPUs")
    res = mp_util.run_job(tmp_path, WORKER, 2, launcher_timeout=90,
                          env={"GX_TEST_TWO_GPUS": "1" if gpus == 2 else None})
    assert not res.timed_out, res.report()
    res.check()
    assert res.stdout.count("OK") == 2, res.report()
