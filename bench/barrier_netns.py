"""Barrier across two network namespaces over tcp (issue 10), beside MPICH's
barrier over its tcp path in the same run:

    python -P bench/barrier_netns.py [--iters 2000]

Needs root and iproute2 (tests/netns_util.py makes two namespaces joined by a
veth pair, deleted on exit).  gexmk: ``gexmk.run -n 2`` with rank r in
namespace r (the rendezvous on namespace 0's veth address), so the peers
are on different "nodes" and reach each other over ofi tcp;ofi_rxm.  MPICH:
the mpich wheel's ``mpiexec -n 2``, each rank entering its namespace through
``ip netns exec`` (PMI travels over the inherited socket), UCX restricted to
tcp (``UCX_TLS=tcp,self``) and no shared memory (``MPIR_CVAR_NOLOCAL=1``).
Both time ``barrier()`` the same way: median of --iters after 200 warm-ups.
"""
import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

PROGRAM = r'''
import statistics, sys, time
iters = int(sys.argv[2])
if sys.argv[1] == "mpi":
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    barrier, rank = comm.Barrier, comm.Get_rank()
else:
    import gexmk
    c = gexmk.init()
    c.segment_attach(4096)          # to name the path the peers take (the barrier uses its own)
    barrier, rank = c.tm.barrier, c.tm.rank
    assert c.tm.paths(1 - rank)["rma"] == "ofi", c.tm.paths(1 - rank)
for _ in range(200):
    barrier()
t = []
for _ in range(iters):
    a = time.perf_counter()
    barrier()
    t.append(time.perf_counter() - a)
if rank == 0:
    print("RESULT", statistics.median(t) * 1e6, flush=True)
if sys.argv[1] != "mpi":
    c.finalize()
'''


def _result(r, who):
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            return float(line.split()[1])
    raise SystemExit(f"{who} failed (exit {r.returncode}): {(r.stderr or r.stdout)[-600:]}")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=2000)
    args = ap.parse_args(argv)
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    import tempfile
    import netns_util
    prog = os.path.join(tempfile.mkdtemp(prefix="gx-barrier-"), "barrier.py")
    with open(prog, "w") as f:
        f.write(PROGRAM)
    with netns_util.two_nodes() as nodes:
        env = dict(os.environ, MPIR_CVAR_NOLOCAL="1", UCX_TLS="tcp,self")
        cmd = ["mpiexec", "-n", "2", "sh", "-c",
               f"exec ip netns exec {nodes.base}n$PMI_RANK {sys.executable} {prog} mpi {args.iters}"]
        mpi = _result(subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env),
                      "MPICH")
        genv = {k: v for k, v in os.environ.items() if not k.startswith("GEXMK_")}
        genv["GEXMK_OFI_PROVIDER"] = "tcp;ofi_rxm"
        cmd = nodes.exec_prefix(0) + [sys.executable, "-P", "-m", "gexmk.run", "-n", "2",
                                      "--timeout", "150", "--bootstrap-listen", nodes.addr[0],
                                      "--rank-prefix", nodes.rank_prefix, prog, "gexmk",
                                      str(args.iters)]
        gx = _result(subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=genv),
                     "gexmk")
    print(f"barrier across two network namespaces (veth), 2 ranks: gexmk (ofi tcp;ofi_rxm) "
          f"{gx:.2f} us, MPICH (UCX tcp) {mpi:.2f} us: {gx / mpi:.2f} x (target <= 1.2)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
