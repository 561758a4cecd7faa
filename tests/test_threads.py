"""Several Python threads using one client at once (single process, loopback):
results stay exact, large copies release the GIL, finalize is safe."""
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import gexmk

try:
    from . import mp_util
except ImportError:
    import mp_util

NTHREADS = 4


def run_threads(target, n=NTHREADS, timeout=60):
    """Start ``target(i, barrier)`` in n threads at once; re-raise the first error."""
    start = threading.Barrier(n)
    errors = []

    def body(i):
        try:
            target(i, start)
        except BaseException as e:      # reported in the main thread
            errors.append(e)
            start.abort()

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "a worker thread hung"
    if errors:
        raise errors[0]


def test_threads_puts_gets_atomics(client):
    region = 64 * 1024
    shared_off = NTHREADS * region
    seg = client.segment_attach(shared_off + 4096 + 64 * 1024)
    tm = client.tm
    base = seg.address
    ad = tm.ad_create(gexmk.DT_I64, gexmk.OP_FADD | gexmk.OP_INC | gexmk.OP_FCAS | gexmk.OP_GET)
    counter = base + shared_off           # shared by every thread
    cas_word = base + shared_off + 8
    ro = base + shared_off + 4096         # read by every thread at once
    ro_data = (np.arange(64 * 1024) % 253).astype(np.uint8)
    np.asarray(seg)[shared_off + 4096:] = ro_data
    rounds = 300
    fetched = [[] for _ in range(NTHREADS)]

    def work(i, start):
        own = base + i * region
        rng = np.random.default_rng(i)
        start.wait()
        for r in range(rounds):
            data = rng.integers(0, 256, 1024, dtype=np.uint8)
            off = (r * 1024) % region
            ev = tm.put_nb(0, own + off, data, lc=gexmk.LC_DEFER)
            ev.leaf(gexmk.EC_LC).wait()
            ev.wait()
            back = np.empty(1024, np.uint8)
            tm.get_nb(back, 0, own + off).wait()
            assert np.array_equal(back, data)
            # interleaved bytes of one shared line: thread i owns bytes j % 4 == i
            tm.put_val(0, base + shared_off + 64 + 4 * r + i, (r + i) & 0xFF, 1)
            fetched[i].append(ad.op_nb(0, counter, gexmk.OP_FADD, 1).wait())
            ad.op(0, counter, gexmk.OP_INC)
            while True:                   # CAS-loop increment
                cur = ad.op(0, cas_word, gexmk.OP_GET)
                if ad.op(0, cas_word, gexmk.OP_FCAS, cur, cur + 1) == cur:
                    break
            chunk = np.empty(4096, np.uint8)
            with gexmk.nbi_access_region() as rev:      # regions are per thread
                tm.get_nbi(chunk, 0, ro + (r * 4096) % (60 * 1024))
            rev.wait()
            o = (r * 4096) % (60 * 1024)
            assert np.array_equal(chunk, ro_data[o:o + 4096])

    run_threads(work)
    arr = np.asarray(seg)
    words = arr[shared_off:shared_off + 16].view(np.int64)
    assert words[0] == 2 * NTHREADS * rounds
    assert words[1] == NTHREADS * rounds
    olds = sorted(v for f in fetched for v in f)
    assert len(set(olds)) == NTHREADS * rounds        # no FADD lost or duplicated
    line = arr[shared_off + 64:shared_off + 64 + 4 * rounds + NTHREADS]
    for r in range(rounds):
        for i in range(NTHREADS):
            assert line[4 * r + i] == (r + i) & 0xFF
    assert np.array_equal(arr[shared_off + 4096:], ro_data)


def test_threads_same_region_last_writer_whole(client):
    """Concurrent puts of whole 8-byte words to the same place: the final
    word is one of the written ones, never a mix (aligned 8-byte puts)."""
    seg = client.segment_attach(4096)
    tm = client.tm

    def work(i, start):
        word = np.full(8, i + 1, np.uint8)
        start.wait()
        for _ in range(2000):
            tm.put(0, seg.address, word)

    run_threads(work)
    final = np.asarray(seg)[:8]
    assert len(set(final.tolist())) == 1 and 1 <= final[0] <= NTHREADS


def test_large_put_releases_the_gil(client):
    """While one thread copies 8 MiB with a blocking put, another thread runs
    Python code: the copy does not hold the GIL."""
    n = 8 << 20
    seg = client.segment_attach(n)
    src = np.full(n, 0x5A, np.uint8)
    tm = client.tm
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1.0)        # no forced GIL hand-over inside the window
    overlapped = 0
    try:
        for _ in range(20):
            stamps = {}
            go = threading.Event()

            def copier():
                go.set()
                stamps["t0"] = time.perf_counter()
                for _ in range(4):
                    tm.put(0, seg.address, src)
                stamps["t1"] = time.perf_counter()

            def other():
                go.wait()
                stamps["tb"] = time.perf_counter()

            tb = threading.Thread(target=other)
            ta = threading.Thread(target=copier)
            tb.start()
            ta.start()
            ta.join(30)
            tb.join(30)
            if stamps["t0"] < stamps["tb"] < stamps["t1"]:
                overlapped += 1
                if overlapped >= 2:
                    break
    finally:
        sys.setswitchinterval(old_interval)
    assert overlapped >= 2, "no Python thread ran during a large blocking put"
    assert (np.asarray(seg) == 0x5A).all()


def test_large_put_in_thread_with_concurrent_small_ops(client):
    n = 8 << 20
    seg = client.segment_attach(n + 4096)
    tm = client.tm
    big = (np.arange(n) % 241).astype(np.uint8)
    ad = tm.ad_create(gexmk.DT_U64, gexmk.OP_INC)
    done = threading.Event()
    counts = []

    def copier():
        for _ in range(5):
            tm.put(0, seg.address + 4096, big)
        done.set()

    def small():
        k = 0
        while not done.is_set() or k < 100:
            ad.op(0, seg.address, gexmk.OP_INC)
            k += 1
        counts.append(k)

    t1 = threading.Thread(target=copier)
    t2 = threading.Thread(target=small)
    t1.start()
    t2.start()
    t1.join(60)
    t2.join(60)
    assert not t1.is_alive() and not t2.is_alive()
    assert np.asarray(seg)[:8].view(np.uint64)[0] == counts[0]
    assert np.array_equal(np.asarray(seg)[4096:], big)


def test_finalize_after_threads_join():
    c = gexmk.init()
    seg = c.segment_attach(1 << 20)
    tm = c.tm

    def work(i, start):
        start.wait()
        for r in range(200):
            tm.put(0, seg.address + i * 4096 + (r % 64) * 8, np.int64(r).tobytes())

    try:
        run_threads(work)
        assert not c.finalized
        words = np.asarray(seg).view(np.int64)
        for i in range(NTHREADS):
            assert words[i * 512 + 199 % 64] == 199   # last write of that slot
    finally:
        c.finalize()
    assert c.finalized
    with pytest.raises(gexmk.StateError):
        tm.put(0, seg.address, b"x")
    with gexmk.init() as c2:          # the process can start over
        assert c2.size == 1


def test_finalize_while_another_thread_copies():
    """finalize() from the main thread while a worker issues large puts: the
    worker's next call raises StateError; nothing crashes."""
    c = gexmk.init()
    n = 4 << 20
    seg = c.segment_attach(n)
    tm = c.tm
    src = np.ones(n, np.uint8)
    started = threading.Event()
    outcome = []

    def worker():
        try:
            while True:
                tm.put(0, seg.address, src)
                started.set()
        except gexmk.StateError as e:
            outcome.append(e)
        except BaseException as e:     # anything else is a failure
            outcome.append(e)
            started.set()

    t = threading.Thread(target=worker, daemon=True)
    t.start()
    assert started.wait(30)
    c.finalize()
    t.join(30)
    assert not t.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], gexmk.StateError), outcome


DESTROY_RACE = textwrap.dedent("""
    import threading, time
    import numpy as np
    import gexmk

    n = 8 << 20
    src = np.ones(n, np.uint8)
    errors = []
    with gexmk.init() as c:
        for trial in range(20):
            seg = c.segment_create(n)
            c.ep(0).bind_segment(seg)
            addr = seg.address
            started = threading.Event()

            def worker():
                try:
                    while True:
                        c.tm.put(0, addr, src)
                        started.set()
                except gexmk.SegmentError as e:
                    errors.append(e)
                    started.set()

            t = threading.Thread(target=worker)
            t.start()
            started.wait()
            time.sleep(0.0005 * (trial % 5))
            seg.destroy()
            t.join()
    assert len(errors) == 20, errors
    print("SURVIVED")
""")


@pytest.mark.timeout(120)
def test_destroy_segment_while_another_thread_copies(tmp_path):
    """Destroying a segment while another thread's GIL-free put writes into it
    must end that thread's puts with SegmentError, never unmap memory under a
    copy in flight.  Runs in a child so that a crash fails this test only."""
    script = tmp_path / "destroy_race.py"
    script.write_text(DESTROY_RACE)
    r = mp_util.run_command([sys.executable, str(script)], timeout=110, cwd=str(tmp_path),
                            env=mp_util.child_env(), script=str(script))
    assert r.returncode == 0, r.report()
    assert "SURVIVED" in r.stdout
