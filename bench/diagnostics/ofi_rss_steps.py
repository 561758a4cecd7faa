"""Resident memory of a gexmk process, step by step (issue 23): import, init,
segment_attach (bind + publish + connections), a put, a barrier (numpy never
imported); rank 0's and
the largest rank's VmRSS, over whatever transport the environment picks.

    python -P bench/diagnostics/ofi_rss_steps.py [-n 2] [--env K=V ...] [--env ...]

Each ``--env`` group (comma-separated K=V) is one configuration, run in turn
(default: tcp;ofi_rxm over ofi as it stands).  A diagnostic, not a benchmark.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

WORKER = r'''
import json, os
def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
steps = [("start", rss())]
import gexmk
steps.append(("import", rss()))
c = gexmk.init()
steps.append(("init", rss()))
seg = c.segment_attach(1 << 20)
steps.append(("attach+publish", rss()))
src = bytearray(8)
peer = (c.rank + 1) % c.size
c.tm.put(peer, c.tm.query_bound_segment_nb(peer).wait().address, src)
steps.append(("first put", rss()))
c.tm.barrier()
steps.append(("barrier", rss()))
path = c.tm.paths(peer)["rma"]
every = [json.loads(x) for x in c.bootstrap.allgather(json.dumps(steps).encode())]
if c.rank == 0:
    print("RESULT " + json.dumps({"steps": steps, "max": [max(e[i][1] for e in every)
                                                         for i in range(len(steps))],
                                  "path": str(path)}))
c.finalize()
'''


def run(n, extra):
    with tempfile.TemporaryDirectory(prefix="gexmk-rss-") as tmp:
        script = os.path.join(tmp, "w.py")
        with open(script, "w") as f:
            f.write(WORKER)
        env = dict(os.environ, GEXMK_TRANSPORT="ofi", GEXMK_OFI_PROVIDER="tcp;ofi_rxm")
        env.update(extra)
        env = {k: v for k, v in env.items() if v != ""}
        out = subprocess.run([sys.executable, "-m", "gexmk.run", "-n", str(n), script], env=env, cwd=tmp,
                             capture_output=True, text=True, timeout=600)
        for line in out.stdout.splitlines():
            if line.startswith("RESULT "):
                return json.loads(line[7:])
        raise RuntimeError(out.stderr[-3000:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=2)
    ap.add_argument("--env", action="append", default=[])
    args = ap.parse_args()
    confs = args.env or [""]
    for conf in confs:
        extra = dict(kv.split("=", 1) for kv in conf.split(",") if kv)
        r = run(args.n, extra)
        print(f"== n={args.n} {conf or '(defaults)'}  path {r['path']}")
        last = 0
        for (name, mb), mx in zip(r["steps"], r["max"]):
            print(f"  {name:<16} rank0 {mb:7.1f} MB ({mb - last:+6.1f})   max {mx:7.1f} MB")
            last = mb


if __name__ == "__main__":
    main()
