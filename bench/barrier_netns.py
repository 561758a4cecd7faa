"""Barrier across two network namespaces over tcp (issue 10), beside MPICH's
barrier in the same run:

    python -P bench/barrier_netns.py [--per-node 2] [--iters 2000] [--repeat 3]

Needs root and iproute2 (tests/netns_util.py makes two namespaces joined by a
veth pair, deleted on exit); ``--per-node K`` ranks sit in each namespace
(2K ranks), so every node has K ranks and the two nodes reach each other
over the veth.  Each repetition runs, in turn:

- gexmk: ``gexmk.run -n 2K`` with ranks [iK, (i+1)K) in namespace i (the
  rendezvous on namespace 0's veth address); peers on the other node over ofi
  tcp;ofi_rxm, on the same node over shared memory.  With K > 1 twice: the
  hierarchical barrier (node gather on shared memory, one leader per node on
  the network) and the flat dissemination of before (``GEXMK_COLL_HIER=0``).
- MPICH, all tcp: the mpich wheel's ``mpiexec -n 2K``, each rank entering
  its namespace through ``ip netns exec`` (PMI travels over the inherited
  socket), UCX restricted to tcp (``UCX_TLS=tcp,self``) and no shared memory
  (``MPIR_CVAR_NOLOCAL=1``): every rank talks tcp, as issue 10 compares.
- MPICH, node-aware (K > 1): ``mpiexec -launcher fork -hosts nodea:K,nodeb:K``,
  so MPICH knows which ranks share a node and uses its own shared memory
  there and UCX tcp between the nodes, as it would on two hosts.

``--pin``: namespace i's ranks run on CPU i only (``taskset``), so each
"node" has a core of its own, as two hosts would.

Every program times ``barrier()`` the same way: median of --iters after 200
warm-ups, as rank 0 sees it.
"""
import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

PROGRAM = r'''
import statistics, sys, time
iters, per_node = int(sys.argv[2]), int(sys.argv[3])
if sys.argv[1] == "mpi":
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    barrier, rank, size = comm.Barrier, comm.Get_rank(), comm.Get_size()
else:
    import gexmk
    c = gexmk.init()
    c.segment_attach(4096)          # to name the path the peers take (the barrier uses its own)
    barrier, rank, size = c.tm.barrier, c.tm.rank, c.tm.size
    far = (rank + per_node) % size
    assert c.tm.paths(far)["rma"] == "ofi", c.tm.paths(far)
    assert len(set(c.nodes())) == 2, c.nodes()
for _ in range(200):
    barrier()
t = []
for _ in range(iters):
    a = time.perf_counter()
    barrier()
    t.append(time.perf_counter() - a)
if rank == 0:
    # (a gexmk without hierarchical barriers has no _barrier_shape: flat)
    shape = ("mpi" if sys.argv[1] == "mpi" else c.tm._barrier_shape()["role"]
             if hasattr(c.tm, "_barrier_shape") else "flat")
    print("RESULT", statistics.median(t) * 1e6, shape, flush=True)
if sys.argv[1] != "mpi":
    c.finalize()
'''


def _result(r, who):
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            return float(line.split()[1]), line.split()[2]
    raise SystemExit(f"{who} failed (exit {r.returncode}): {(r.stderr or r.stdout)[-600:]}")


def _mpich(nodes, prog, k, iters, node_aware, pin):
    env = dict(os.environ, UCX_TLS="tcp,self")
    shell = (f"exec {'taskset -c $((PMI_RANK / %d)) ' % k if pin else ''}ip netns exec "
             f"{nodes.base}n$((PMI_RANK / {k})) {sys.executable} {prog} mpi {iters} {k}")
    if node_aware:
        cmd = ["mpiexec", "-launcher", "fork", "-hosts", f"nodea:{k},nodeb:{k}", "-n", str(2 * k)]
    else:
        env["MPIR_CVAR_NOLOCAL"] = "1"
        cmd = ["mpiexec", "-n", str(2 * k)]
    r = subprocess.run(cmd + ["sh", "-c", shell], capture_output=True, text=True, timeout=240,
                       env=env)
    return _result(r, "MPICH")[0]


def _gexmk(nodes, prog, k, iters, hier, pin):
    env = {n: v for n, v in os.environ.items() if not n.startswith("GEXMK_")}
    env["GEXMK_OFI_PROVIDER"] = "tcp;ofi_rxm"
    env["GEXMK_COLL_HIER"] = "1" if hier else "0"
    prefix = nodes.rank_prefix_per_node(k)
    if pin:     # the namespace's CPU first: taskset execs the rest
        prefix = prefix.replace("exec ip netns", f"exec taskset -c $(({{rank}} / {k})) ip netns")
    cmd = nodes.exec_prefix(0) + [sys.executable, "-P", "-m", "gexmk.run", "-n", str(2 * k),
                                  "--timeout", "200", "--bootstrap-listen", nodes.addr[0],
                                  "--rank-prefix", prefix, prog, "gexmk", str(iters), str(k)]
    us, shape = _result(subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env),
                        "gexmk")
    want = ("leader" if hier and k > 1 else "flat")
    assert shape == want, f"gexmk ran a {shape} barrier, wanted {want}"
    return us


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-node", type=int, default=2, help="ranks in each namespace (default 2)")
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--pin", action="store_true",
                    help="namespace i's ranks on CPU i only (each \"node\" its own core)")
    args = ap.parse_args(argv)
    k = args.per_node
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    import tempfile
    import netns_util
    prog = os.path.join(tempfile.mkdtemp(prefix="gx-barrier-"), "barrier.py")
    with open(prog, "w") as f:
        f.write(PROGRAM)
    pin = args.pin
    runs = {"gexmk hierarchical": lambda n: _gexmk(n, prog, k, args.iters, True, pin),
            "MPICH all tcp": lambda n: _mpich(n, prog, k, args.iters, False, pin)}
    if k > 1:
        runs["gexmk flat (before)"] = lambda n: _gexmk(n, prog, k, args.iters, False, pin)
        runs["MPICH node-aware"] = lambda n: _mpich(n, prog, k, args.iters, True, pin)
    else:
        runs = {"gexmk": runs["gexmk hierarchical"], "MPICH all tcp": runs["MPICH all tcp"]}
    got = {name: [] for name in runs}
    with netns_util.two_nodes() as nodes:
        for rep in range(args.repeat):
            order = list(runs) if rep % 2 == 0 else list(reversed(runs))
            for name in order:
                got[name].append(runs[name](nodes))
            print(f"rep {rep + 1}: " + ", ".join(f"{n} {got[n][-1]:.2f} us" for n in runs),
                  flush=True)
    print(f"barrier, {2 * k} ranks, {k} in each of two network namespaces (veth)"
          f"{', namespace i on CPU i' if pin else ''}, ofi "
          f"tcp;ofi_rxm / UCX tcp; median us per barrier, range over {args.repeat} runs:")
    base = "MPICH all tcp"
    for name, v in got.items():
        ratio = [a / b for a, b in zip(v, got[base])]
        print(f"  {name:22s} {min(v):7.2f} - {max(v):7.2f} us   "
              f"{min(ratio):.2f} - {max(ratio):.2f} x MPICH all tcp (same run)", flush=True)
    if "MPICH node-aware" in got:
        v, m = got["gexmk hierarchical"], got["MPICH node-aware"]
        ratio = [a / b for a, b in zip(v, m)]
        print(f"  gexmk hierarchical / MPICH node-aware: {min(ratio):.2f} - {max(ratio):.2f} x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
