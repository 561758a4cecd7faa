"""Where the host's time goes while one process issues device VIS lists (issue 22's
KV-cache shape: 1024 x 16 B put_indexed_on_stream on a device segment, self path):

    python -P bench/diagnostics/issue_profile.py [--seconds 3] [--blk 16] [--n 1024]

A child process issues the list in a loop (one stream synchronise every 64 calls)
and prints its calls per second; this process samples it with ``perf`` where that
is installed (``perf record -g``, then the report by symbol), else with ``gdb``
(stack samples, counted by the innermost frame of ours and by the first library
frame), else says that neither is there.  Also prints the issue time per call for
list lengths 1..n, so that what is per block and what is per call can be told apart.
"""
import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

CHILD = r'''
import sys, time, statistics
import numpy as np
import cupy as cp
import gexmk
MiB, KiB = 1 << 20, 1 << 10
seconds, blk, n = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
with gexmk.init() as c:
    tm = c.tm
    mk = c.mk_create(gexmk.CUDA_UVA, device=0)
    seg = c.segment_create(64 * MiB, kind=mk)
    c.ep(0).bind_segment(seg)
    tm.publish_bound_segment([c.ep(0)])
    rng = np.random.default_rng(3)
    src = seg.address + 32 * MiB
    la = (rng.permutation(2 * n)[:n] * 16 * KiB + src).astype(np.uint64)
    ra = (rng.permutation(2 * n)[:n] * 16 * KiB + tm.addr(0, 0)).astype(np.uint64)
    s = cp.cuda.Stream(non_blocking=True)
    for k in sorted({1, 2, 16, 128, 512, n}):
        t = []
        for it in range(300):
            a = time.perf_counter_ns()
            tm.put_indexed_on_stream(0, ra[:k], blk, la[:k], blk, s)
            t.append(time.perf_counter_ns() - a)
            if it % 64 == 63:
                s.synchronize()
        s.synchronize()
        print(f"issue {k:5d} blocks: {statistics.median(t) / 1e3:7.1f} us", flush=True)
    # intake alone: the same list with its last remote block outside the segment is
    # refused (BoundsError) after every block was read, paired and checked
    bad = ra.copy()
    bad[-1] = tm.addr(0, 0) + 64 * MiB
    for k in sorted({2, 128, n}):
        t = []
        bk = bad[:k].copy()
        bk[-1] = bad[-1]
        for it in range(300):
            a = time.perf_counter_ns()
            try:
                tm.put_indexed_on_stream(0, bk, blk, la[:k], blk, s)
            except gexmk.BoundsError:
                pass
            t.append(time.perf_counter_ns() - a)
        print(f"intake {k:5d} blocks (refused): {statistics.median(t) / 1e3:7.1f} us", flush=True)
    print("READY", flush=True)
    t0 = time.perf_counter()
    calls = 0
    while time.perf_counter() - t0 < seconds:
        for _ in range(64):
            tm.put_indexed_on_stream(0, ra, blk, la, blk, s)
        s.synchronize()
        calls += 64
    print(f"loop: {calls / (time.perf_counter() - t0):.0f} calls/s "
          f"({(time.perf_counter() - t0) / calls * 1e6:.1f} us a call)", flush=True)
'''


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--blk", type=int, default=16)
    ap.add_argument("--n", type=int, default=1024)
    a = ap.parse_args()
    p = subprocess.Popen([sys.executable, "-P", "-c", CHILD, str(a.seconds), str(a.blk), str(a.n)],
                         stdout=subprocess.PIPE, text=True)
    for line in p.stdout:
        print(line, end="")
        if line.startswith("READY"):
            break
    time.sleep(0.3)
    perf, gdb = shutil.which("perf"), shutil.which("gdb")
    if perf:
        with tempfile.TemporaryDirectory() as d:
            data = os.path.join(d, "perf.data")
            subprocess.run([perf, "record", "-F", "2999", "-g", "-p", str(p.pid), "-o", data,
                            "--", "sleep", str(max(1.0, a.seconds - 1.5))],
                           capture_output=True, timeout=60)
            rep = subprocess.run([perf, "report", "-i", data, "--stdio", "--no-children",
                                  "--sort", "dso,sym", "--percent-limit", "0.7", "-g", "none"],
                                 capture_output=True, text=True, timeout=120)
            print("perf report (self time by symbol):")
            print("\n".join(l for l in rep.stdout.splitlines() if l.strip() and not l.startswith("#"))[:6000])
    elif gdb:
        inner, lib = collections.Counter(), collections.Counter()
        nsamp = 0
        t_end = time.time() + max(1.0, a.seconds - 1.5)
        while time.time() < t_end and nsamp < 40:
            out = subprocess.run([gdb, "-p", str(p.pid), "-batch", "-ex", "thread 1", "-ex", "bt 40"],
                                 capture_output=True, text=True, timeout=30).stdout
            frames = re.findall(r"^#\d+\s+(?:0x[0-9a-f]+ in )?(\S+) .*?(?: from (\S+))?$", out, re.M)
            if not frames:
                continue
            nsamp += 1
            ours = [f for f, _ in frames if "gexmk" in f or f.startswith("__pyx") or f.startswith("_")]
            inner[next((f for f, _ in frames if "pyx" in f or "gx_" in f), "?")] += 1
            lib[frames[0][1].rsplit("/", 1)[-1] if frames[0][1] else frames[0][0]] += 1
        print(f"gdb: {nsamp} samples of thread 1")
        print("  innermost gexmk frame:", inner.most_common(15))
        print("  innermost frame's library/function:", lib.most_common(10))
    else:
        print("neither perf nor gdb here: no samples")
    print(p.stdout.read(), end="")
    p.wait(timeout=60)


if __name__ == "__main__":
    main()
