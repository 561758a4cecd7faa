"""Resident memory of a landing zone's target with many initiators that each
used the zone once (issue 23): rings released after GEXMK_OFI_RING_IDLE /
GEXMK_RING_IDLE (the default) against never released (the setting 0, what
every build before did), alternated in one run.

    python -P bench/diagnostics/zone_rss.py [--ranks 8,16] [--rounds 2] [--transport ofi|nbrhd]

Every rank but 0 puts 4 MiB (ofi's default ring: 4 slots of 1 MiB) into
rank 0's host segment through its landing zone, once: ``ofi``
(GEXMK_OFI_STAGE=all, tcp;ofi_rxm; the zone's mapped pages from
/proc/self/pagemap) or ``nbrhd`` (nbrhd-landed, GEXMK_NBRHD_STAGE=all with
4 slots of 1 MiB; the zone is a memfd shared by the node, its size is what
the memfd holds: st_blocks).  Then the job sits in barriers for the idle
time plus 1.5 s (the initiators release their rings).  Rank 0 reports its
VmRSS and the zone's memory right after the puts and after the idle spell.
A diagnostic, not a benchmark.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

WORKER = r'''
import json, os, time
import numpy as np
import gexmk

def vmrss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024

def resident(lo, size):
    """MB of [lo, lo+size) mapped (/proc/self/pagemap: exact to the page, where
    smaps would count a whole VMA the zone shares with a neighbour)."""
    import struct
    page = os.sysconf("SC_PAGE_SIZE")
    n, first = 0, lo // page
    with open("/proc/self/pagemap", "rb") as f:
        for start in range(first, (lo + size + page - 1) // page, 1 << 16):
            f.seek(start * 8)
            raw = f.read(8 * min(1 << 16, (lo + size + page - 1) // page - start))
            n += sum(1 for (e,) in struct.iter_unpack("<Q", raw) if e >> 63)
    return n * page / 2**20

NBRHD = os.environ.get("GX_ZONE_TRANSPORT") == "nbrhd"
idle = float(os.environ.get("GEXMK_RING_IDLE" if NBRHD else "GEXMK_OFI_RING_IDLE") or 3.0)
with gexmk.init() as c:
    tm = c.tm
    seg = c.segment_attach(4 << 20)
    if NBRHD:
        tr = c.transports["local"]
        zone_mb = lambda: os.fstat(tr.zone_rings[0]["fd"]).st_blocks * 512 / 2**20
        counters = lambda: {k: v for k, v in tr.zone_rings[0].items()
                            if k in ("backed", "released")}
    else:
        ctx = c.ep(0).contexts["ofi"]
        zone_mb = lambda: resident(*ctx.zone_extent[:2])
        counters = lambda: ctx.zone_rings["zone"]
    r0 = (vmrss(), zone_mb()) if tm.rank == 0 else None
    tm.barrier()                                       # nobody puts before rank 0 measured
    if tm.rank > 0:
        tm.put(0, tm.addr(0, 0), np.full(4 << 20, tm.rank, np.uint8))
    tm.barrier()
    r1 = (vmrss(), zone_mb()) if tm.rank == 0 else None
    for _ in range(int((idle + 1.5) / 0.05)):         # the same count on every rank
        tm.barrier()
        time.sleep(0.05)
    tm.barrier()
    if tm.rank == 0:
        r2 = (vmrss(), zone_mb())
        print("RESULT " + json.dumps({"before": r0, "used": r1, "idle": r2,
                                      "rings": counters(),
                                      "path": tm.paths(1)["rma"]}))
'''


def run(n, extra, transport="ofi"):
    with tempfile.TemporaryDirectory(prefix="gexmk-zone-rss-") as tmp:
        script = os.path.join(tmp, "w.py")
        with open(script, "w") as f:
            f.write(WORKER)
        if transport == "nbrhd":
            env = dict(os.environ, GEXMK_NBRHD_STAGE="all", GEXMK_NBRHD_STAGE_CHUNK="1M",
                       GEXMK_NBRHD_STAGE_SLOTS="4", GX_ZONE_TRANSPORT="nbrhd")
            env.pop("GEXMK_TRANSPORT", None)
        else:
            env = dict(os.environ, GEXMK_TRANSPORT="ofi", GEXMK_OFI_PROVIDER="tcp;ofi_rxm",
                       GEXMK_OFI_STAGE="all")
        env.update(extra)
        env = {k: v for k, v in env.items() if v != ""}
        out = subprocess.run([sys.executable, "-m", "gexmk.run", "-n", str(n), script], env=env,
                             cwd=tmp, capture_output=True, text=True, timeout=600)
        for line in out.stdout.splitlines():
            if line.startswith("RESULT "):
                return json.loads(line[7:])
        raise RuntimeError(out.stderr[-3000:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", default="8,16")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--transport", default="ofi", choices=("ofi", "nbrhd"))
    args = ap.parse_args()
    var = "GEXMK_RING_IDLE" if args.transport == "nbrhd" else "GEXMK_OFI_RING_IDLE"
    confs = [(f"never released ({var}=0)", {var: "0"}),
             (f"released (default {var})", {var: ""})]
    print("| ranks | rings | round | zone MB: before / used / after idle "
          "| rank 0 VmRSS MB: before / used / after idle | zone counters |")
    print("|---|---|---|---|---|---|")
    for n in (int(x) for x in args.ranks.split(",")):
        for rnd in range(args.rounds):
            for name, extra in confs:
                r = run(n, extra, args.transport)
                z = r["rings"]
                print(f"| {n} | {name} | {rnd + 1} | {r['before'][1]:.1f} / {r['used'][1]:.1f} / "
                      f"{r['idle'][1]:.1f} | {r['before'][0]:.1f} / {r['used'][0]:.1f} / "
                      f"{r['idle'][0]:.1f} | "
                      + ", ".join(f"{k} {z[k]}" for k in ("backs", "backed", "released")
                                  if k in z) + " |",
                      flush=True)


if __name__ == "__main__":
    main()
