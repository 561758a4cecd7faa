"""Device segments the libfabric provider registers itself: the native ofi
path ``ofi-hmem`` (issue 9), and its fallbacks.

Where the provider offers FI_HMEM, the domain asks for it, and a device
segment that ``fi_mr_regattr`` accepts with FI_HMEM_CUDA is reached natively
(peers' puts and gets land in device memory; atomics still run by the owner's
lander through a landing zone); a refused registration leaves the segment on
``ofi-staged``.  ``GEXMK_OFI_HMEM=off`` never asks.

CPU (this machine): ``GEXMK_OFI_HMEM=system`` registers host segments through
the same code with FI_HMEM_SYSTEM, so the hints, the registration, the
publication of both registrations, the path name and the protocol (puts,
gets, NB/NBI, local buffers inside the segment, atomics through the zone,
put_signal) run over shm; ranks on different settings (native, staged,
plain) reach each other; ``off`` and providers without FI_HMEM keep the
old paths.

GPU (marker ``gpu``): two ranks on one GPU over shm with device segments
(library-allocated VMM, and cuMemAlloc memory adopted as a segment),
testcudauva's four cases at 8 MiB with data checked, device atomics; the path
taken is printed.  It needs a libfabric built with CUDA support: Debian's
1.17 has none (every device segment is then staged, which
tests/test_ofi_staged.py covers), so the test skips, saying so, unless the
probe below registers CUDA memory.  Run it as::

    LD_LIBRARY_PATH=/path/to/lf-cuda/lib:/usr/local/cuda/lib64 \\
        python -m pytest -m gpu tests/test_ofi_hmem.py -s
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from gexmk import config
from gexmk import errors as E

try:
    from . import mp_util
    from .staged_worker import staged_worker
    from .test_ofi import need
    from .test_cuda_segments import HAVE_GPU
except ImportError:
    import mp_util
    from staged_worker import staged_worker
    from test_ofi import need
    from test_cuda_segments import HAVE_GPU

ofi = pytest.importorskip("gexmk.transports.ofi", reason="gexmk was built without the ofi transport")

SHM = "shm"
TCP = "tcp;ofi_rxm"
gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not HAVE_GPU, reason="no NVIDIA driver or device on this machine")


def hmem_env(provider=SHM, **extra):
    env = {"GEXMK_TRANSPORT": "ofi", "GEXMK_OFI_PROVIDER": provider, "GEXMK_TIMEOUT": 30,
           "GEXMK_PROGRESS_THREAD": None, "FI_PROVIDER": None, "GEXMK_OFI_HMEM": "system",
           "GEXMK_OFI_STAGE": None, "GEXMK_OFI_STAGE_CHUNK": "64K", "GEXMK_OFI_STAGE_SLOTS": "3",
           "GEXMK_STAGED": None}
    env.update(extra)
    return env


def _domain(provider, hmem):
    cfg = config.load({"GEXMK_OFI_HMEM": hmem})
    return ofi.Domain(provider, config=cfg)


def _features(d):
    return (d.provider, d.domain_name, d.atomics, d.split_endpoints, d.ordered_flush,
            d.ordered_writes, d.put_signal_mode)


@gpu
@needs_gpu
def test_auto_keeps_device_segments_staged_over_shm():
    """shm copies device memory through host memory itself (slower than the staged
    path's pinned bounces): under ``auto`` its device segments stay staged and the
    endpoint says why, whether or not this libfabric could register them."""
    need(SHM)
    probe = _cuda_hmem_probe("auto")
    print("hmem probe:", probe)
    assert probe.get("native") is False, probe
    assert "copies device memory through host memory" in (probe.get("note") or ""), probe


def test_hmem_option_parses():
    assert config.load({}).ofi_hmem == "auto"
    for v in ("auto", "off", "system", "native", "OFF"):
        assert config.load({"GEXMK_OFI_HMEM": v}).ofi_hmem == v.lower()
    with pytest.raises(E.ArgumentError, match="GEXMK_OFI_HMEM"):
        config.load({"GEXMK_OFI_HMEM": "cuda"})


@pytest.mark.parametrize("provider", [SHM, TCP])
def test_asking_for_hmem_loses_nothing(provider):
    """FI_HMEM is asked of the provider already chosen without it: the same
    provider, domain, atomics, endpoints and ordering, whatever the answer."""
    need(provider)
    off = _domain(provider, "off")
    try:
        assert off.hmem == "off"
        want = _features(off)
    finally:
        off.close()
    for mode in ("auto", "system"):
        d = _domain(provider, mode)
        try:
            assert d.hmem in ("native", "unoffered"), d.hmem
            assert _features(d) == want, (mode, d.hmem)
        finally:
            d.close()


def _shm_native():
    need(SHM)
    d = _domain(SHM, "system")
    try:
        if d.hmem != "native":
            pytest.skip(f"libfabric's shm offers no FI_HMEM with RMA and atomics here ({d.hmem}; "
                        "Debian's 1.17 offers it only without FI_ATOMIC): run with LD_LIBRARY_PATH "
                        "at a libfabric that does, e.g. 1.22")
    finally:
        d.close()


WORKER = staged_worker("ofi-hmem", "ofi", "GEXMK_OFI_STAGE_CHUNK")


@pytest.mark.parametrize("n", [2, 3])
def test_system_iface_native_path_over_shm(tmp_path, n):
    """Host segments registered by fi_mr_regattr (FI_HMEM_SYSTEM): the whole
    protocol worker of the staged tests, now on the path ``ofi-hmem`` --
    puts and gets (native), atomics exact under contention (through the
    owner's lander), put_signal, bounds, path counters."""
    _shm_native()
    r = mp_util.run_job(tmp_path, WORKER, n, launcher_timeout=150, env=hmem_env())
    assert r.returncode == 0, r.report()
    assert r.stdout.count("OK") == n, r.stdout


MIXED = r'''
import numpy as np
P = lambda *a: pattern(*a).tobytes()
me0 = int(os.environ["GEXMK_RANK"])
# each rank its own setting: "system" (native), "stage" (landing zone), "plain"
mine = os.environ["GX_SETTINGS"].split(",")[me0]
os.environ["GEXMK_OFI_HMEM"] = "system" if mine == "system" else "off"
os.environ["GEXMK_OFI_STAGE"] = "all" if mine == "stage" else "auto"
c = gexmk.init()
tm = c.tm
me, peer = tm.rank, 1 - tm.rank
S = 2 << 20
seg = c.segment_attach(S)
mem = np.asarray(seg)
theirs = os.environ["GX_SETTINGS"].split(",")[peer]
if "stage" in (mine, theirs):
    want = "ofi-staged"
elif "system" in (mine, theirs):
    want = "ofi-hmem"
else:
    want = "ofi"
assert tm.paths(peer) == {"rma": want, "atomic": want}, (mine, theirs, tm.paths(peer))
ctx = c.ep(0).contexts["ofi"]
assert ctx.hmem == (mine == "system") and ctx.staged_local == (mine == "stage"), ctx.hmem_note
mem[:] = 0
mem[S // 2:] = np.frombuffer(P(S // 2, me, 5), np.uint8)
tm.barrier()
sizes = [1, 8, 5000, 65536 + 3, 300000]
off = 0
for sz in sizes:
    tm.put(peer, tm.addr(peer, off), P(sz, me, sz))
    off += (sz + 4095) & ~4095
ev = tm.put_nb(peer, tm.addr(peer, 400000), P(70000, me, 1))
ev.wait()
tm.put_nbi(peer, tm.addr(peer, 480000), P(9000, me, 2))
tm.put_nbi(peer, tm.addr(peer, 490000), P(16, me, 3))
gexmk.nbi_wait(gexmk.EC_PUT)
# from inside my own segment (its registration's descriptor, or the bounce slots)
tm.put(peer, tm.addr(peer, 600000), (seg.address + S // 2, 100000))
tm.barrier()
off = 0
for sz in sizes:
    assert bytes(mem[off:off + sz]) == P(sz, peer, sz), (mine, sz)
    off += (sz + 4095) & ~4095
assert bytes(mem[400000:470000]) == P(70000, peer, 1)
assert bytes(mem[480000:489000]) == P(9000, peer, 2)
assert bytes(mem[490000:490016]) == P(16, peer, 3)
assert bytes(mem[600000:700000]) == P(S // 2, peer, 5)[:100000]
tm.barrier()
theirs_data = P(S // 2, peer, 5)
got = np.zeros(150000, np.uint8)
tm.get(got, peer, tm.addr(peer, S // 2 + 7))
assert got.tobytes() == theirs_data[7:150007], mine
got[:] = 0
tm.get_nb(got, peer, tm.addr(peer, S // 2 + 99)).wait()
assert got.tobytes() == theirs_data[99:150099], mine
tm.get((seg.address + 800000, 50000), peer, tm.addr(peer, S // 2 + 1))
assert bytes(mem[800000:850000]) == theirs_data[1:50001], mine
# atomics, both ranks on rank 0's word and on rank 1's
ad = tm.ad_create(gexmk.DT_U64, gexmk.OP_FADD | gexmk.OP_GET | gexmk.OP_FCAS)
tm.barrier()
for _ in range(100):
    ad.op(0, tm.addr(0, 1040000), gexmk.OP_FADD, me + 1)
    ad.op(1, tm.addr(1, 1040000), gexmk.OP_FADD, 2 * me + 1)
tm.barrier()
assert ad.op(0, tm.addr(0, 1040000), gexmk.OP_GET) == 100 * 3
assert ad.op(1, tm.addr(1, 1040000), gexmk.OP_GET) == 100 * 4
tm.barrier()
if me == 0:
    assert ad.op(peer, tm.addr(peer, 1040064), gexmk.OP_FCAS, 0, 42) == 0
    assert ad.op(peer, tm.addr(peer, 1040064), gexmk.OP_FCAS, 42, 43) == 42
ad.destroy()
# put_signal: data, then the signal, never the other way round
for k in range(1, 3):
    tm.put_signal(peer, tm.addr(peer, 900000), P(120000, me, 10 + k), tm.addr(peer, 1040128), k)
    tm.wait_until(tm.addr(me, 1040128), gexmk.CMP_EQ, k, timeout=20)
    assert bytes(mem[900000:1020000]) == P(120000, peer, 10 + k), (mine, k)
    tm.barrier()
st = tm.path_stats(peer)
assert set(st) == {want}, st
assert st[want]["put"]["ops"] >= len(sizes) + 4 and st[want]["atomic"]["ops"] >= 100, st
tm.barrier()
print("PATH", me, mine, want, flush=True)
c.finalize()
print("OK", me, flush=True)
'''


@pytest.mark.parametrize("settings", ["system,plain", "system,stage", "stage,system", "plain,plain"])
def test_mixed_settings_reach_each_other(tmp_path, settings):
    """A native target with a plain or staged initiator and the other way
    round: each pair of settings on the path it must take, data checked both
    ways, atomics exact, put_signal ordered."""
    if "system" in settings:
        _shm_native()
    else:
        need(SHM)
    env = hmem_env(GX_SETTINGS=settings, GEXMK_OFI_HMEM=None)
    r = mp_util.run_job(tmp_path, MIXED, 2, launcher_timeout=150, env=env)
    assert r.returncode == 0, r.report()
    assert r.stdout.count("OK") == 2, r.stdout


FALLBACK = r'''
import numpy as np
c = gexmk.init()
tm = c.tm
me, peer = tm.rank, 1 - tm.rank
seg = c.segment_attach(1 << 20)
tr = c.transports["ofi"]
# a provider without FI_HMEM (or GEXMK_OFI_HMEM=off): host segments as before
assert tr.domain.hmem == os.environ["GX_WANT_HMEM"], tr.domain.hmem
assert tm.paths(peer) == {"rma": "ofi", "atomic": "ofi"}, tm.paths(peer)
ctx = c.ep(0).contexts["ofi"]
assert not ctx.hmem and ctx.hmem_note == (os.environ.get("GX_WANT_NOTE") or None), ctx.hmem_note
tm.put(peer, tm.addr(peer, 100), pattern(5000, me).tobytes())
tm.barrier()
assert bytes(np.asarray(seg)[100:5100]) == pattern(5000, peer).tobytes()
ad = tm.ad_create(gexmk.DT_U64, gexmk.OP_FADD | gexmk.OP_GET)
ad.op(0, tm.addr(0, 8), gexmk.OP_FADD, 1)
tm.barrier()
assert ad.op(0, tm.addr(0, 8), gexmk.OP_GET) == 2
tm.barrier()
c.finalize()
print("OK", me, flush=True)
'''


def test_off_keeps_the_plain_path(tmp_path):
    need(SHM)
    env = hmem_env(GEXMK_OFI_HMEM="off", GX_WANT_HMEM="off")
    r = mp_util.run_job(tmp_path, FALLBACK, 2, launcher_timeout=120, env=env)
    assert r.returncode == 0, r.report()
    assert r.stdout.count("OK") == 2, r.stdout


def test_provider_without_hmem_keeps_the_plain_path(tmp_path):
    """tcp;ofi_rxm offers no FI_HMEM (Debian's 1.17, and 1.22): system mode
    falls back to the ordinary registration, visibly."""
    need(TCP)
    d = _domain(TCP, "system")
    try:
        if d.hmem == "native":
            pytest.skip("this libfabric's tcp;ofi_rxm offers FI_HMEM: nothing to fall back from")
    finally:
        d.close()
    env = hmem_env(TCP, GX_WANT_HMEM="unoffered",
                   GX_WANT_NOTE="the provider does not offer FI_HMEM (with the atomics it offers "
                                "without)")
    r = mp_util.run_job(tmp_path, FALLBACK, 2, launcher_timeout=120, env=env)
    assert r.returncode == 0, r.report()
    assert r.stdout.count("OK") == 2, r.stdout


# ---- GPU -----------------------------------------------------------------------

PROBE = r'''
import json, sys
import gexmk
from gexmk import config
from gexmk.transports import ofi
out = {}
with gexmk.init() as c:
    mk = c.mk_create(gexmk.CUDA_UVA, 0)
    seg = c.segment_create(1 << 21, kind=mk)
    d = ofi.Domain("shm", config=config.load({"GEXMK_OFI_HMEM": sys.argv[1]}))
    out["domain"] = d.hmem
    ep = d.endpoint()
    try:
        ep.bind(seg)
        out["native"] = ep.hmem
        out["note"] = ep.hmem_note
        ep.unbind()
    finally:
        d.close()
print("PROBE", json.dumps(out))
'''


def _cuda_hmem_probe(mode="native"):
    """Whether this process's libfabric registers a library-allocated (VMM)
    device segment with shm under GEXMK_OFI_HMEM=mode: {"domain", "native", "note"}."""
    env = dict(os.environ, GEXMK_TIMEOUT="30", FI_LOG_LEVEL="warn")
    p = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True,
                       timeout=120,
                       env=env, cwd="/")
    # libfabric's own word on its CUDA support (e.g. "Failed to dlopen libcuda.so":
    # it opens libcudart.so and libcuda.so, unversioned, from the loader's path)
    said = [ln.strip() for ln in p.stderr.splitlines() if "cuda" in ln.lower()][:4]
    for line in p.stdout.splitlines():
        if line.startswith("PROBE "):
            out = json.loads(line[6:])
            out["libfabric"] = said
            return out
    return {"domain": "?", "native": False, "note": f"the probe failed: {p.stderr[-800:]}"}


GPU_WORKER = r'''
import numpy as np
P = lambda *a: pattern(*a).tobytes()
from cuda.bindings import driver as cu
c = gexmk.init()
tm = c.tm
me, peer = tm.rank, 1 - tm.rank
N = 8 << 20
timings = []

def say(*a):
    """print in rank order (the ranks share stdout: lines printed at once interleave)"""
    for r in range(tm.size):
        if r == me:
            print(*a, flush=True)
        tm.barrier()

mk = c.mk_create(gexmk.CUDA_UVA, 0)
cu.cuCtxPushCurrent(mk.impl.context)
hseg = c.segment_attach(2 * N)                        # EP 0: host
ep1, ep2, ep3 = c.ep_create(), c.ep_create(), c.ep_create()
d1 = c.segment_create(2 * N, kind=mk)                 # library-allocated (VMM)
d2 = c.segment_create(2 * N, kind=mk)
err, raw = cu.cuMemAlloc(2 * N)                       # cuMemAlloc memory adopted as a segment
assert err == cu.CUresult.CUDA_SUCCESS, err
d3 = c.segment_create(buffer=(int(raw), 2 * N), kind=mk)
ep1.bind_segment(d1)
ep2.bind_segment(d2)
ep3.bind_segment(d3)
tm.publish_bound_segment([ep1, ep2, ep3])
h1, h2, h3 = c.ep(0).pair(1), c.ep(0).pair(2), c.ep(0).pair(3)
t12, t13 = ep1.pair(2), ep1.pair(3)
paths = {"host->vmm": h1.paths(peer), "vmm->vmm": t12.paths(peer), "host->cuMemAlloc": h3.paths(peer),
         "vmm->cuMemAlloc": t13.paths(peer)}
say("PATHS", me, json.dumps(paths))
notes = {f"EP{i}": {"native": c.ep(i).contexts["ofi"].hmem, "why not": c.ep(i).contexts["ofi"].hmem_note}
         for i in (1, 2, 3)}
say("REGISTRATION", me, json.dumps(notes))
for p in paths.values():
    assert p["rma"] in ("ofi-hmem", "ofi-staged"), paths

def dev_fill(seg, off, data):
    cu.cuMemcpyHtoD(seg.address + off, data, len(data))

def dev_read(seg, off, n):
    out = np.zeros(n, np.uint8)
    cu.cuMemcpyDtoH(out.ctypes.data, seg.address + off, n)
    return out.tobytes()

def cases(dst, tag, pair_h, pair_d):
    """testcudauva's four cases against the peer's segment dst (EP index of
    pair_h's and pair_d's target), local device data from d1."""
    hmem = np.asarray(hseg)
    hmem[:N] = np.frombuffer(P(N, me, tag), np.uint8)
    dev_fill(d1, 0, P(N, me, tag + 2))
    dev_fill(dst, N, P(N, me, tag + 1))
    tm.barrier()
    # 1. host -> remote GPU (NBI)
    pair_h.put_nbi(peer, pair_h.addr(peer, 0), (hseg.address, N))
    gexmk.nbi_wait(gexmk.EC_PUT)
    tm.barrier()
    assert dev_read(dst, 0, N) == P(N, peer, tag), ("case 1: host -> remote GPU", tag)
    # 2. remote GPU -> host (NB)
    hmem[N:] = 0
    ev = pair_h.get_nb((hseg.address + N, N), peer, pair_h.addr(peer, N))
    gexmk.wait_all([ev])
    assert hmem[N:].tobytes() == P(N, peer, tag + 1), ("case 2: remote GPU -> host", tag)
    tm.barrier()
    # 3. GPU -> remote GPU (blocking; timed, for the record only)
    t0 = time.perf_counter()
    pair_d.put(peer, pair_d.addr(peer, 0), (d1.address, N))
    timings.append(f"TIMING {me} {tag} {pair_d.paths(peer)['rma']} 8 MiB device put "
                   f"{time.perf_counter() - t0:.4f} s")
    tm.barrier()
    assert dev_read(dst, 0, N) == P(N, peer, tag + 2), ("case 3: GPU -> remote GPU", tag)
    # 4. remote GPU -> local GPU (blocking)
    pair_d.get((d1.address + N, N), peer, pair_d.addr(peer, N))
    assert dev_read(d1, N, N) == P(N, peer, tag + 1), ("case 4: remote GPU -> local GPU", tag)
    tm.barrier()
    # small ones too: never injected from device memory
    pair_d.put_nbi(peer, pair_d.addr(peer, 64), (d1.address + N, 8))
    gexmk.nbi_wait(gexmk.EC_PUT)
    tm.barrier()
    # (the peer's d1[N:] holds what it got from my dst in case 4)
    assert dev_read(dst, 64, 8) == P(N, me, tag + 1)[:8], ("small put from device memory", tag)

cases(d2, 7, h2, t12)
cases(d3, 17, h3, t13)
for pr in (t12, t13):                   # for the record: 8 MiB device puts, median of 5
    ts = []
    for _ in range(5):
        t0 = time.perf_counter()
        pr.put(peer, pr.addr(peer, 0), (d1.address, N))
        ts.append(time.perf_counter() - t0)
    tm.barrier()
    timings.append(f"TIMING {me} median5 {pr.paths(peer)['rma']} 8 MiB device put "
                   f"{sorted(ts)[2]:.4f} s, {N / sorted(ts)[2] / 1e9:.2f} GB/s")
say("\n".join(timings))
# device atomics on both kinds of segment, run by the owner, exact under contention
for pair in (t12, t13):
    ad = pair.ad_create(gexmk.DT_U64, gexmk.OP_FADD | gexmk.OP_GET | gexmk.OP_SET)
    if me == 0:
        ad.op(0, pair.addr(0, 2 * N - 64), gexmk.OP_SET, 0)
    tm.barrier()
    for _ in range(300):
        ad.op(0, pair.addr(0, 2 * N - 64), gexmk.OP_FADD, 1)
    tm.barrier()
    total = ad.op(0, pair.addr(0, 2 * N - 64), gexmk.OP_GET)
    assert total == 600, total
    tm.barrier()
    ad.destroy()
stats = {"vmm->vmm": t12.path_stats(peer), "vmm->cuMemAlloc": t13.path_stats(peer)}
say("STATS", me, json.dumps(stats), "landed", c.transports["ofi"].landed)
tm.barrier()
c.finalize()
cu.cuMemFree(raw)
cu.cuCtxPopCurrent()
print("OK", me, flush=True)
'''


@gpu
@needs_gpu
@pytest.mark.parametrize("mode", ["native", "off"])
def test_testcudauva_cases_over_shm_native(tmp_path, mode):
    """testcudauva's four cases at 8 MiB between device segments of two ranks
    on one GPU over shm, VMM and cuMemAlloc segments; device atomics; the path
    each took printed (``ofi-hmem`` where the registration was accepted,
    ``ofi-staged`` where it was refused, never a failure).  ``off``: the same
    job all staged (the baseline of the timings printed)."""
    need(SHM)
    probe = _cuda_hmem_probe()
    print("hmem probe:", probe)
    if mode == "native" and not probe.get("native"):
        pytest.skip("libfabric does not register CUDA memory with shm here "
                    f"(domain FI_HMEM: {probe.get('domain')}; {probe.get('note')}; libfabric said: "
                    f"{probe.get('libfabric')}); point LD_LIBRARY_PATH at a libfabric built "
                    "--with-cuda --enable-cuda-dlopen, at CUDA's lib64 (libcudart.so) and at a "
                    "directory with libcuda.so (the driver's, not CUDA's stubs)")
    env = hmem_env(GEXMK_OFI_HMEM=mode, GEXMK_OFI_STAGE_CHUNK=None, GEXMK_OFI_STAGE_SLOTS=None)
    r = mp_util.run_job(tmp_path, "import json\n" + GPU_WORKER, 2, launcher_timeout=300, env=env)
    print(r.stdout)
    assert r.returncode == 0, r.report()
    assert r.stdout.count("OK") == 2, r.stdout
    # native: the probe registered a VMM segment natively, so must the job have;
    # off: every device segment staged
    want = "ofi-hmem" if mode == "native" else "ofi-staged"
    seen = 0
    for line in r.stdout.splitlines():
        if line.startswith("PATHS "):
            paths = json.loads(line.split(" ", 2)[2])
            assert paths["vmm->vmm"] == {"rma": want, "atomic": want}, paths
            if mode == "off":
                assert all(p == {"rma": want, "atomic": want} for p in paths.values()), paths
            seen += 1
    assert seen == 2, r.stdout
