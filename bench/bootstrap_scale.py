"""Job set-up as jobs grow: import+init, the bootstrap's allgather, attach+publish and
a barrier per rank, under gexmk.run and (where built) PMIx; under PMIx, the same
allgather through rank 0's rendezvous server beside PMIx_Put/Commit/Fence/Get.

    python -P bench/bootstrap_scale.py [--ranks 16,64,128] [--payload 93]

Each size runs as ``python -m gexmk.run -n N`` and, where Open MPI's mpirun and
the pmix plug-in exist, as ``mpirun --oversubscribe -n N`` (same run, one after
the other).  Ranks are oversubscribed on a small machine: each rank's O(N) work
then costs O(N²) of the machine's time, which is what the wall clock shows.
Rank 0's figures and the slowest rank's are printed, and after attach+publish
rank 0's (and the largest) VmRSS, its count of memory mappings and of open
file descriptors (what per-rank state grows with).  The payload defaults to a
publication's (93 B per rank with one host segment).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

WORKER = r'''
import time
t0 = time.perf_counter()
import json, os, sys
import numpy as np
import gexmk
c = gexmk.init()
t1 = time.perf_counter()
b = c.bootstrap
payload = b"x" * int(os.environ["GX_PAYLOAD"])
b.barrier()
t = time.perf_counter()
for _ in range(5):
    b.allgather(payload)
rdv = (time.perf_counter() - t) / 5
fence = None
if b.kind == "pmix":
    from gexmk.bootstrap import pmix_client as px
    b.barrier()
    t = time.perf_counter()
    for i in range(5):
        px.put_string(f"gx.bench{i}", payload.decode())
        px.commit()
        px.fence(120)
        got = [px.get_string(r, f"gx.bench{i}", 120) for r in range(b.size)]
    fence = (time.perf_counter() - t) / 5
    assert got == [payload.decode()] * b.size
t = time.perf_counter()
seg = c.segment_attach(1 << 20)
attach = time.perf_counter() - t
c.tm.barrier()
t = time.perf_counter()
for _ in range(20):
    c.tm.barrier()
barrier = (time.perf_counter() - t) / 20
def _rss_mb():
    with open("/proc/self/status") as f:
        return [int(l.split()[1]) / 1024 for l in f if l.startswith("VmRSS")][0]
with open("/proc/self/maps") as f:
    maps = sum(1 for _ in f)
mine = {"init": t1 - t0, "allgather": rdv, "fence": fence, "attach": attach, "barrier": barrier,
        "rss": _rss_mb(), "maps": maps, "fds": len(os.listdir("/proc/self/fd"))}
every = [json.loads(x) for x in b.allgather(json.dumps(mine).encode())]
if c.rank == 0:
    worst = {k: max((e[k] for e in every if e[k] is not None), default=None) for k in mine}
    print("RESULT " + json.dumps({"kind": b.kind, "n": b.size, "rank0": mine, "max": worst}))
c.finalize()
'''


def openmpi_mpirun():
    path = shutil.which("mpirun.openmpi") or shutil.which("mpirun")
    if path is None:
        return None
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20).stdout
    return path if ("Open MPI" in out or "OpenRTE" in out) else None


def run(cmd, env, timeout):
    t = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.monotonic() - t
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            res = json.loads(line[7:])
            res["wall"] = wall
            return res
    raise RuntimeError(f"{cmd[:4]}... failed ({proc.returncode}):\n{proc.stderr[-2000:]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", default="16,64,128")
    ap.add_argument("--payload", type=int, default=93)
    ap.add_argument("--no-mpirun", action="store_true", help="gexmk.run only")
    args = ap.parse_args()
    import tempfile
    from gexmk.bootstrap import registry
    tmp = tempfile.mkdtemp(prefix="gexmk-bootscale-")
    script = os.path.join(tmp, "worker.py")
    with open(script, "w") as f:
        f.write(WORKER)
    env = dict(os.environ, GX_PAYLOAD=str(args.payload), GEXMK_TIMEOUT="600")
    mpirun = openmpi_mpirun() if registry._available("pmix") is None and not args.no_mpirun \
        else None
    ms = lambda x: "-" if x is None else f"{x * 1e3:.1f}"  # noqa: E731
    print(f"{'launcher':<10} {'n':>4} {'wall s':>7} {'init r0 ms':>10} {'allgather r0/max ms':>20} "
          f"{'PMIx fence r0/max ms':>21} {'attach+publish r0/max ms':>25} {'barrier ms':>10} "
          f"{'RSS r0/max MB':>14} {'maps r0':>7} {'fds r0':>6}")
    try:
        for n in map(int, args.ranks.split(",")):
            # -P (both interpreters): run from the repository root, the source
            # tree would otherwise shadow the installed package
            cmds = [("gexmk.run", [sys.executable, "-P", "-m", "gexmk.run", "-n", str(n),
                                   "--timeout", "900", "--", "-P", script])]
            if mpirun:
                root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
                cmds.append(("mpirun", [mpirun, *root, "--oversubscribe", "-n", str(n),
                                        sys.executable, "-P", script]))
            for name, cmd in cmds:
                r = run(cmd, env, 1000)
                a, m = r["rank0"], r["max"]
                print(f"{name:<10} {n:>4} {r['wall']:>7.2f} {ms(a['init']):>10} "
                      f"{ms(a['allgather']) + ' / ' + ms(m['allgather']):>20} "
                      f"{ms(a['fence']) + ' / ' + ms(m['fence']):>21} "
                      f"{ms(a['attach']) + ' / ' + ms(m['attach']):>25} {ms(a['barrier']):>10} "
                      f"{a['rss']:>6.1f} / {m['rss']:<5.1f} {a['maps']:>7} {a['fds']:>6}",
                      flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
