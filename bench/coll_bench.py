"""Team barrier and collectives, gexmk beside mpi4py + MPICH, in the same run.

    python bench/coll_bench.py [--ranks 2,4] [--rounds 30] [--json]

Cases, at each rank count, same node: ``barrier``; ``allreduce`` (sum) of 1
float64 and of 1 MiB of float64; ``bcast`` of 1 MiB (float64, root 0).  gexmk:
``tm.barrier()``, ``tm.allreduce``, ``tm.bcast`` under ``python -m gexmk.run``;
MPI: ``comm.Barrier()``, ``comm.Allreduce``, ``comm.Bcast`` with numpy buffers
under ``mpiexec`` (the mpich wheel's).  Both sides use the same timing: every
rank runs a fixed number of operations per round (collectives must agree),
rounds separated by a barrier, rank 0's time per operation; the median over
rounds is reported (and the minimum).  Rank 0 prints one JSON object.  A
noisy, shared 2-core machine makes 4-rank figures (more ranks than cores)
mostly a measure of scheduling.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

MIB = 1 << 20
# operations per round, per case (fixed: every rank must run as many)
PER_ROUND = {"barrier": 200, "allreduce_8B": 200, "allreduce_1MiB": 5, "bcast_1MiB": 5}


def _time(cases, barrier, rounds, rank):
    out = {}
    for name, fn in cases.items():
        k = PER_ROUND[name]
        for _ in range(max(1, k // 4)):       # warm-up
            fn()
        samples = []
        for _ in range(rounds):
            barrier()
            t = time.perf_counter_ns()
            for _ in range(k):
                fn()
            samples.append((time.perf_counter_ns() - t) / k)
        samples.sort()
        out[name] = {"median_us": samples[len(samples) // 2] / 1e3, "min_us": samples[0] / 1e3,
                     "per_round": k, "rounds": rounds}
    return out if rank == 0 else None


def _cases(barrier, allreduce, bcast):
    one, one_out = np.ones(1), np.zeros(1)
    big, big_out = np.ones(MIB // 8), np.zeros(MIB // 8)
    buf = np.ones(MIB // 8)
    return {"barrier": barrier,
            "allreduce_8B": lambda: allreduce(one, one_out),
            "allreduce_1MiB": lambda: allreduce(big, big_out),
            "bcast_1MiB": lambda: bcast(buf)}


def _gexmk_side(rounds):
    import gexmk
    c = gexmk.init()
    tm = c.tm
    cases = _cases(tm.barrier, lambda s, r: tm.allreduce(s, r, "sum"), lambda b: tm.bcast(b, 0))
    out = _time(cases, tm.barrier, rounds, tm.rank)
    c.finalize()
    if out is not None:
        out["ranks"] = tm.size
        print(json.dumps(out), flush=True)


def _mpi_side(rounds):
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    cases = _cases(comm.Barrier, lambda s, r: comm.Allreduce(s, r, op=MPI.SUM),
                   lambda b: comm.Bcast(b, root=0))
    out = _time(cases, comm.Barrier, rounds, comm.rank)
    if out is not None:
        out["ranks"] = comm.size
        out["library"] = " ".join(MPI.Get_library_version().splitlines()[0].split())
        print(json.dumps(out), flush=True)


def _last_json(r, what):
    if r.returncode != 0:
        tail = " | ".join((r.stderr or r.stdout).strip().splitlines()[-6:])
        return {"skipped": f"{what} exited {r.returncode}: {tail}"}
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"skipped": f"no JSON from {what}: {r.stdout[-300:]!r}"}


def run(ranks=(2, 4), rounds=30, timeout=300):
    """Both sides at each rank count: {n: {"gexmk": ..., "mpi": ...}} (µs)."""
    flags = ["-P"] if getattr(sys.flags, "safe_path", False) else []
    me = os.path.abspath(__file__)
    res = {}
    for n in ranks:
        out = {}
        cmd = [sys.executable, *flags, "-m", "gexmk.run", "-n", str(n), "--timeout", str(timeout),
               me, "--gexmk", "--rounds", str(rounds)]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 30,
                               stdin=subprocess.DEVNULL)
            out["gexmk"] = _last_json(r, "the gexmk job")
        except subprocess.TimeoutExpired:
            out["gexmk"] = {"skipped": f"the gexmk job did not finish in {timeout} s"}
        mpiexec = shutil.which("mpiexec")
        if mpiexec is None:
            out["mpi"] = {"skipped": "mpiexec is not on PATH"}
        else:
            menv = {k: v for k, v in os.environ.items() if not k.startswith("GEXMK_")}
            cmd = [mpiexec, "-n", str(n), sys.executable, *flags, me, "--mpi", "--rounds",
                   str(rounds)]
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=menv,
                                   stdin=subprocess.DEVNULL)
                out["mpi"] = _last_json(r, "mpiexec")
            except subprocess.TimeoutExpired:
                out["mpi"] = {"skipped": f"mpiexec did not finish in {timeout} s"}
        res[n] = out
    return res


def report(res, file=None):
    """Print :func:`run`'s figures as a table: medians (µs) and gexmk / MPI."""
    file = file or sys.stdout
    for n, out in res.items():
        g, m = out.get("gexmk", {}), out.get("mpi", {})
        print(f"{n} ranks, same node; MPI: {m.get('library', m.get('skipped', '?'))}", file=file)
        if "skipped" in g:
            print(f"  gexmk: skipped: {g['skipped']}", file=file)
            continue
        print(f"  {'case':16s} {'gexmk us':>10s} {'MPI us':>10s} {'gexmk/MPI':>10s}   (min: gexmk, MPI)",
              file=file)
        for case in PER_ROUND:
            gv = g.get(case, {}).get("median_us")
            mv = m.get(case, {}).get("median_us") if "skipped" not in m else None
            ratio = f"{gv / mv:10.2f}" if gv and mv else "       n/a"
            mins = (f"({g[case]['min_us']:.2f}, {m[case]['min_us']:.2f})" if mv
                    else f"({g[case]['min_us']:.2f})")
            print(f"  {case:16s} {gv:10.2f} {(mv or float('nan')):10.2f} {ratio}   {mins}",
                  file=file)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", default="2,4", help="rank counts, comma-separated")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--json", action="store_true", help="print the raw figures as JSON too")
    ap.add_argument("--gexmk", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mpi", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.gexmk:
        return _gexmk_side(args.rounds)
    if args.mpi:
        return _mpi_side(args.rounds)
    res = run(tuple(int(x) for x in args.ranks.split(",")), args.rounds)
    report(res)
    if args.json:
        print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
