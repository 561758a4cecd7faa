"""Small-message latency of gexmk from Python, with pytest-benchmark.

    python -m pytest bench/ --benchmark-only

One process (a job of one, transport ``self``): every operation targets this
process's own segment, so the figures are the cost of the call path (argument
intake, bounds check, copy), without a peer.  Each gexmk case sits beside the
baseline it is read against in the same group: ``numpy.copyto`` between two
8-byte arrays (a local copy from Python).  The cross-process comparison with
mpi4py is ``python -m gexmk.bench``.  These are benchmarks, not tests: they are
outside the suite (``testpaths = tests``) and assert only that the bytes moved.
"""
from types import SimpleNamespace

import numpy as np
import pytest

import gexmk

pytest.importorskip("pytest_benchmark")

# Fixed batches: with its automatic calibration pytest-benchmark times sub-100 ns calls
# one by one for some cases and by the hundred for others, mixing timer cost into some.
ITERATIONS, ROUNDS = 200, 300


def run(benchmark, fn, *args):
    """Time ``fn(*args)`` in rounds of ITERATIONS calls; returns its last result."""
    return benchmark.pedantic(fn, args=args, iterations=ITERATIONS, rounds=ROUNDS, warmup_rounds=3)


@pytest.fixture(scope="module")
def rig():
    client = gexmk.init()
    try:
        client.segment_attach(1 << 16)
        tm = client.tm
        yield SimpleNamespace(
            client=client, tm=tm, ad=tm.ad_create(gexmk.DT_I64, gexmk.OP_FADD),
            dest=tm.addr(0, 0), atom=tm.addr(0, 4096),
            src=np.arange(1, 9, dtype=np.uint8), dst=np.zeros(8, dtype=np.uint8))
    finally:
        client.finalize()


@pytest.mark.benchmark(group="8 B from Python")
def test_put_8B(benchmark, rig):
    run(benchmark, rig.tm.put, 0, rig.dest, rig.src)
    assert rig.tm.get_val(0, rig.dest) == int.from_bytes(rig.src.tobytes(), "little")


@pytest.mark.benchmark(group="8 B from Python")
def test_get_8B(benchmark, rig):
    rig.tm.put(0, rig.dest, rig.src)
    rig.dst[:] = 0
    run(benchmark, rig.tm.get, rig.dst, 0, rig.dest)
    assert np.array_equal(rig.dst, rig.src)


@pytest.mark.benchmark(group="8 B from Python")
def test_put_val_8B(benchmark, rig):
    run(benchmark, rig.tm.put_val, 0, rig.dest, 0x0102030405060708)
    assert rig.tm.get_val(0, rig.dest) == 0x0102030405060708


@pytest.mark.benchmark(group="8 B from Python")
def test_get_val_8B(benchmark, rig):
    rig.tm.put_val(0, rig.dest, 42)
    assert run(benchmark, rig.tm.get_val, 0, rig.dest) == 42


@pytest.mark.benchmark(group="8 B from Python")
def test_put_nbi_8B(benchmark, rig):
    """Issue time of an implicit-event put; completion (nbi_wait) after the run."""
    run(benchmark, rig.tm.put_nbi, 0, rig.dest, rig.src)
    gexmk.nbi_wait()
    assert rig.tm.get_val(0, rig.dest) == int.from_bytes(rig.src.tobytes(), "little")


@pytest.mark.benchmark(group="8 B from Python")
def test_atomic_fadd_8B(benchmark, rig):
    before = rig.ad.op(0, rig.atom, gexmk.OP_FADD, 0)
    run(benchmark, rig.ad.op, 0, rig.atom, gexmk.OP_FADD, 1)
    assert rig.ad.op(0, rig.atom, gexmk.OP_FADD, 0) > before


@pytest.mark.benchmark(group="8 B from Python")
def test_baseline_numpy_copyto_8B(benchmark, rig):
    """Baseline: a local 8-byte copy between numpy arrays from Python."""
    out = np.zeros(8, dtype=np.uint8)
    run(benchmark, np.copyto, out, rig.src)
    assert np.array_equal(out, rig.src)


# ---- the cimport API in a nogil loop, beside a C memcpy loop ---------------------------

LOOP = 100_000


def note_per_op(benchmark, key):
    """Record the median per loop iteration in ns (absent with --benchmark-disable)."""
    if getattr(benchmark, "stats", None) is not None:
        benchmark.extra_info[key] = benchmark.stats.stats.median * 1e9 / LOOP


@pytest.fixture(scope="module")
def loops(tmp_path_factory):
    from gexmk.bench import BuildError, load_extension, build_extension
    try:
        path = build_extension(outdir=tmp_path_factory.mktemp("nogil_loop"))
    except BuildError as exc:
        pytest.skip(f"nogil loop module not built: {exc}")
    return load_extension(path)


@pytest.mark.benchmark(group=f"nogil loop of {LOOP} x 8 B")
def test_nogil_put_8B_loop(benchmark, rig, loops):
    benchmark(loops.put8, rig.tm, 0, rig.dest, LOOP)
    note_per_op(benchmark, "ns_per_put")
    assert rig.tm.get_val(0, rig.dest + 8 * ((LOOP - 1) % 1024)) == LOOP - 1


@pytest.mark.benchmark(group=f"nogil loop of {LOOP} x 8 B")
def test_nogil_put_nbi_8B_loop(benchmark, rig, loops):
    benchmark(loops.put_nbi8, rig.tm, 0, rig.dest, LOOP)
    note_per_op(benchmark, "ns_per_put")


@pytest.mark.benchmark(group=f"nogil loop of {LOOP} x 8 B")
def test_baseline_nogil_memcpy_8B_loop(benchmark, loops):
    """Baseline: the same loop of plain 8-byte C memcpy."""
    src, dst = np.arange(8, dtype=np.uint8), np.zeros(8, dtype=np.uint8)
    benchmark(loops.memcpy_buffer, dst, src, LOOP)
    note_per_op(benchmark, "ns_per_copy")
    assert np.array_equal(dst, src)
