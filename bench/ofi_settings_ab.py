"""What a sizing setting costs in speed: two configurations of gexmk's ``ofi``
transport side by side in the same run, each a fresh 2-rank job, alternated.

    python -P bench/ofi_settings_ab.py --a "K=V,K=V" --b "K=V,..." [--rounds 3]

Per job, rank 0 times on rank 1 (``gexmk.bench.measure``, interleaved
batches): blocking 8 B ``tm.put`` and ``tm.get`` (µs), an 8 B ``atomic`` fetch-add
(µs), 4 MiB bandwidth as 8 x ``put_nbi(lc=LC_GROUP)`` + ``nbi_wait`` (GB/s),
rank 0's VmRSS after those, then the mean of 300 ``tm.barrier()`` (both ranks).
A configuration may set ``PYTHONPATH`` to run another build of gexmk (e.g.
``main`` installed with ``pip install --target``) against this one.  Rounds alternate A, B, B, A, ...  Reported: the
minimum and range over rounds of each run's median (bandwidth: maximum and
range).  Both configurations run over ``tcp;ofi_rxm`` unless they set
``GEXMK_OFI_PROVIDER``.  Timings are reported, never asserted; the load
average is printed beside them.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

WORKER = r'''
import json
import numpy as np
import gexmk
from gexmk.bench.timing import measure
c = gexmk.init()
seg = c.segment_attach(8 << 20)
tm = c.tm
out = {}
ad = tm.ad_create(gexmk.DT_U64, gexmk.OP_FADD)   # collective
if c.rank == 0:
    base = tm.query_bound_segment_nb(1).wait().address
    small = np.ones(8, np.uint8)
    big = np.ones(4 << 20, np.uint8)
    def put8(k):
        for _ in range(k):
            tm.put(1, base, small)
    def get8(k):
        for _ in range(k):
            tm.get(small, 1, base)
    def bw(k):
        for _ in range(k):
            for _ in range(8):
                tm.put_nbi(1, base, big, lc=gexmk.LC_GROUP)
            gexmk.nbi_wait()
    def fadd(k):
        for _ in range(k):
            ad.op(1, base + (4 << 20), gexmk.OP_FADD, 1)
    cases = {"put8": put8, "get8": get8, "fadd8": fadd}
    r = measure(cases, iters=200, batch_ns=200e3, max_seconds=2.0)
    out = {k: v["median_ns"] / 1e3 for k, v in r.items()}
    r = measure({"bw": bw}, iters=20, batch_ns=50e6, max_seconds=3.0)
    out["bw_GBps"] = 8 * (4 << 20) / r["bw"]["median_ns"]
    with open("/proc/self/status") as f:
        out["rss_MB"] = [int(l.split()[1]) / 1024 for l in f if l.startswith("VmRSS")][0]
tm.barrier()
def barriers(k):
    for _ in range(k):
        tm.barrier()
tm.barrier()
t = __import__("time").perf_counter()
barriers(300)
out["barrier_us"] = (__import__("time").perf_counter() - t) / 300 * 1e6
if c.rank == 0:
    print("RESULT " + json.dumps(out))
c.finalize()
'''


def run(script, extra, tmp):
    env = dict(os.environ, GEXMK_TRANSPORT="ofi", GEXMK_OFI_PROVIDER="tcp;ofi_rxm")
    env.update(extra)
    env = {k: v for k, v in env.items() if v != ""}
    out = subprocess.run([sys.executable, "-m", "gexmk.run", "-n", "2", script], env=env, cwd=tmp,
                         capture_output=True, text=True, timeout=300)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(out.stderr[-3000:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--a", default="", help="configuration A: K=V,K=V (default: as it stands)")
    ap.add_argument("--b", required=True, help="configuration B")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    confs = {"A": dict(kv.split("=", 1) for kv in args.a.split(",") if kv),
             "B": dict(kv.split("=", 1) for kv in args.b.split(",") if kv)}
    res = {"A": [], "B": []}
    with tempfile.TemporaryDirectory(prefix="gexmk-ab-") as tmp:
        script = os.path.join(tmp, "w.py")
        with open(script, "w") as f:
            f.write(WORKER)
        for i in range(args.rounds):
            for name in ("AB" if i % 2 == 0 else "BA"):
                res[name].append(run(script, confs[name], tmp))
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}; "
          f"A = {args.a or '(as it stands)'}; B = {args.b}")
    keys = [k for k in res["A"][0] if k in res["B"][0]]
    print(f"{'':<10} {'A min [range]':>24} {'B min [range]':>24}")
    for k in keys:
        cells = []
        for name in "AB":
            v = [r[k] for r in res[name]]
            best = max(v) if k == "bw_GBps" else min(v)
            cells.append(f"{best:.2f} [{min(v):.2f}-{max(v):.2f}]")
        unit = {"bw_GBps": "GB/s", "rss_MB": "MB", "barrier_us": ""}.get(k, "us")
        print(f"{k + ' ' + unit:<10} {cells[0]:>24} {cells[1]:>24}")


if __name__ == "__main__":
    main()
