"""Where a packed VIS put's time goes over tcp;ofi_rxm (a diagnostic for issue
22's ">= 0.8x one contiguous 4 MiB put"):

    python -P bench/diagnostics/vis_timeline.py [--rounds 20] [--json out.json]

Runs two processes with ``GEXMK_TRANSPORT=ofi GEXMK_OFI_TRACE=1``: rank 0 puts
1024 x 4 KiB (``put_indexed``, shuffled both sides, through the target's VIS
landing zone) and one contiguous 4 MiB put, interleaved; rank 1 waits in a
barrier.  Both dump their trace rings (progress.pxi's TR_* events, one
CLOCK_MONOTONIC shared by the two processes), and this prints, per phase, the
median over the VIS calls: when the initiator posted its first and last slot,
how long it waited for the packer thread and for ring slots, its wait for the
last slot, and on the target when the lander began and ended unpacking and how
busy it was in between.  Extra environment (``GEXMK_OFI_VIS_PACKER=1`` ...)
passes through.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

KIB, MIB = 1 << 10, 1 << 20
EV = dict(VIS_IN=30, POSTED=31, SLOT_IN=32, SLOT_OUT=33, PK_IN=34, PK_OUT=35, ALL_IN=36,
          VIS_OUT=37, POLL=38, POST_IN=39, LAND_IN=40, LAND_OUT=41, LAND_NAP=42, PKT_IN=43,
          PKT_OUT=44)


def worker(rounds, out):
    import gexmk
    from gexmk.transports import ofi
    c = gexmk.init()
    tm = c.tm
    c.segment_attach(8 * MIB)
    calls = []
    if tm.rank == 0:
        rng = np.random.default_rng(2)
        n, blk = 1024, 4 * KIB
        src = rng.integers(0, 256, n * blk, dtype=np.uint8)
        lperm, rperm = rng.permutation(n), rng.permutation(n)
        base = tm.addr(1, 0)
        la = np.array([src.ctypes.data + blk * int(i) for i in lperm], np.uint64)
        ra = np.array([base + blk * int(i) for i in rperm], np.uint64)
        for _ in range(3):                      # warm-up: rings backed, connections made
            tm.put_indexed(1, ra, blk, la, blk)
            tm.put(1, base, src)
        ofi._trace_dump()
        for _ in range(rounds):
            t0 = time.monotonic()
            tm.put_indexed(1, ra, blk, la, blk)
            t1 = time.monotonic()
            tm.put(1, base, src)
            t2 = time.monotonic()
            calls.append((t0, t1, t2))
    else:
        ofi._trace_dump()
    tm.barrier()
    tr = ofi._trace_dump()
    vp = dict(c.transports["ofi"].domain.vis_paths) if "ofi" in c.transports else {}
    with open(f"{out}.{tm.rank}", "w") as f:
        json.dump({"calls": calls, "trace": tr, "vis_paths": vp}, f)
    c.finalize()


def _events(tr, lo, hi):
    return [(t, e & 0xFFFFFF, e >> 24) for t, e in tr if lo <= t <= hi]


def analyse(r0, r1):
    rows = []
    for t0, t1, t2 in r0["calls"]:
        a = _events(r0["trace"], t0, t1)
        b = _events(r1["trace"], t0, t1)
        ts = lambda evs, k: [t for t, e, _ in evs if e == EV[k]]
        vin, vout = ts(a, "VIS_IN"), ts(a, "VIS_OUT")
        if not vin or not vout:
            continue
        s = vin[0]
        posted = ts(a, "POSTED")

        def spans(evs, i, o):
            tot, start = 0.0, None
            for t, e, _ in evs:
                if e == EV[i]:
                    start = t
                elif e == EV[o] and start is not None:
                    tot += t - start
                    start = None
            return tot
        land_in, land_out = ts(b, "LAND_IN"), ts(b, "LAND_OUT")
        row = {
            "call": (t1 - t0) * 1e6,
            "contig": (t2 - t1) * 1e6,
            "py_in": (s - t0) * 1e6,
            "first_post": (ts(a, "POST_IN")[0] - s) * 1e6 if ts(a, "POST_IN") else None,
            "last_posted": (posted[-1] - s) * 1e6 if posted else None,
            "slots": len(posted),
            "posting": spans(a, "POST_IN", "POSTED") * 1e6,
            "pk_wait": spans(a, "PK_IN", "PK_OUT") * 1e6,
            "slot_wait": spans(a, "SLOT_IN", "SLOT_OUT") * 1e6,
            "polls": len(ts(a, "POLL")),
            "all_wait": (vout[-1] - ts(a, "ALL_IN")[-1]) * 1e6 if ts(a, "ALL_IN") else None,
            "py_out": (t1 - vout[-1]) * 1e6,
            "packer_busy": spans(a, "PKT_IN", "PKT_OUT") * 1e6,
            "land_first": (land_in[0] - s) * 1e6 if land_in else None,
            "land_last": (land_out[-1] - s) * 1e6 if land_out else None,
            "land_busy": spans(b, "LAND_IN", "LAND_OUT") * 1e6,
            "land_slots": len(land_in),
            "land_naps": len(ts(b, "LAND_NAP")),
        }
        row["events"] = [(round((t - s) * 1e6, 1), n, cpu, side) for side, evs in ((0, a), (1, b))
                         for t, e, cpu in evs for n in [k for k, v in EV.items() if v == e]]
        row["events"].sort()
        rows.append(row)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--json")
    ap.add_argument("--role")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    if args.role == "worker":
        worker(args.rounds, args.out)
        return
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "trace")
        env = dict(os.environ, GEXMK_TRANSPORT="ofi", GEXMK_OFI_TRACE="1")
        env.setdefault("GEXMK_OFI_PROVIDER", "tcp;ofi_rxm")
        subprocess.run([sys.executable, "-P", "-m", "gexmk.run", "-n", "2", os.path.abspath(__file__),
                        "--role", "worker", "--rounds", str(args.rounds), "--out", out],
                       env=env, check=True, timeout=300)
        with open(out + ".0") as f0, open(out + ".1") as f1:
            r0, r1 = json.load(f0), json.load(f1)
    rows = analyse(r0, r1)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "vis_paths": r0["vis_paths"]}, f)
    print(f"{len(rows)} calls, 1024 x 4 KiB put_indexed; vis_paths {r0['vis_paths']}; "
          f"load {os.getloadavg()[0]:.2f}")
    print("median (min, max) over the calls, us from the call's start in the transport:")
    for k in rows[0] if rows else []:
        if k == "events":
            continue
        v = [r[k] for r in rows if r[k] is not None]
        if v:
            print(f"  {k:12s} {statistics.median(v):9.1f}  ({min(v):.1f} .. {max(v):.1f})")
    if rows:
        mid = sorted(rows, key=lambda r: r["call"])[len(rows) // 2]
        print(f"the median call ({mid['call']:.1f} us), its events (us, event, cpu, rank; "
              "POLL and LAND_NAP runs folded):")
        line, last = [], None
        for t, n, cpu, side in mid["events"]:
            if n in ("POLL", "LAND_NAP") and last == (n, side):
                continue
            last = (n, side)
            line.append(f"{t:.0f}:{n}@{cpu}/r{side}")
        for i in range(0, len(line), 8):
            print("   " + "  ".join(line[i:i + 8]))


if __name__ == "__main__":
    main()
