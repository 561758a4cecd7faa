"""What one rxm connection costs a process (issue 23): rank 0 of an N-rank job
over tcp;ofi_rxm (connections left to the first operation,
GEXMK_OFI_CONNECT=lazy) puts 8 B to every peer in turn; its VmRSS and open file
descriptors before and after, per connection.  libfabric 1.17's rxm has no way
to cap or close idle connections (fi_rxm(7), ``fi_info -e``), so this is the
price of each peer a rank talks to.  A diagnostic, not a benchmark.

    python -P bench/diagnostics/ofi_conn_cost.py [--ranks 8,16,32]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

WORKER = r'''
import json, os
import gexmk
def rss():
    with open("/proc/self/status") as f:
        return [int(l.split()[1]) for l in f if l.startswith("VmRSS")][0]
def fds():
    return len(os.listdir("/proc/self/fd"))
c = gexmk.init()
seg = c.segment_attach(1 << 16)
tm = c.tm
tm.barrier()
out = {}
if c.rank == 0:
    out["before"] = (rss(), fds())
    for r in range(1, c.size):
        tm.put(r, tm.addr(r, 0), b"12345678")
    out["after"] = (rss(), fds())
    print("RESULT " + json.dumps(out), flush=True)
tm.barrier()
c.finalize()
'''


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", default="8,16,32")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gexmk-conn-") as tmp:
        script = os.path.join(tmp, "w.py")
        with open(script, "w") as f:
            f.write(WORKER)
        env = dict(os.environ, GEXMK_TRANSPORT="ofi", GEXMK_OFI_PROVIDER="tcp;ofi_rxm",
                   GEXMK_OFI_CONNECT="lazy")
        print(f"{'ranks':>5} {'RSS before KB':>14} {'after':>8} {'fds before':>10} {'after':>6} "
              f"{'KB/conn':>8} {'fds/conn':>8}")
        for n in map(int, args.ranks.split(",")):
            p = subprocess.run([sys.executable, "-m", "gexmk.run", "-n", str(n), script], env=env,
                               cwd=tmp, capture_output=True, text=True, timeout=600)
            line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
            if not line:
                raise RuntimeError(p.stderr[-3000:])
            r = json.loads(line[0][7:])
            (r0, f0), (r1, f1) = r["before"], r["after"]
            print(f"{n:>5} {r0:>14} {r1:>8} {f0:>10} {f1:>6} {(r1 - r0) / (n - 1):>8.1f} "
                  f"{(f1 - f0) / (n - 1):>8.2f}", flush=True)


if __name__ == "__main__":
    main()
