"""VIS (vector, indexed, strided; issue 22), each figure beside its baseline in the same run.

    python -P bench/vis.py [--only host,ofi,gpu] [--rounds 60] [--gpu-per-rank] [--json]

``host``: two processes of one node (the ``nbrhd`` path).  A strided put of one
numpy column, 4096 doubles at a stride of 32 KiB (``tm.put(peer, dest, a[:, 7])``
of a 4096 x 4096 float64 array), beside mpi4py + MPICH ``Win.Put`` with an
``MPI_Type_vector(4096, 1, 4096, DOUBLE)`` origin datatype + ``Flush`` (passive
target, ``Lock_all``; run under the mpich wheel's ``mpiexec``), and beside both
libraries' contiguous 32 KiB put of the same bytes.  Target: gexmk / MPI <= 1.0.

``ofi``: two processes over libfabric tcp;ofi_rxm (``GEXMK_TRANSPORT=ofi``;
``--providers tcp;ofi_rxm,shm`` for more): a vector put of 1024 blocks of 4 KiB
from shuffled places to shuffled places (``put_vector``, its NBI form + quiet,
and ``put_indexed`` with uint64 address arrays) beside one contiguous 4 MiB put,
and ``get_vector`` of the same blocks beside one contiguous 4 MiB get.  Each
job runs three times: VIS through the transport (ofi.src/vis.pxi: small blocks
packed through the target's VIS landing zone, path ``ofi-landed``), every
message direct (``GEXMK_OFI_VIS_LAND=0``: fi_writemsg/fi_readmsg, 4 ranges a
message on tcp) and, as the same-run baseline of what came before, the core's
loop of single puts and gets (``GEXMK_OFI_VIS=loop``); the first job's line
names the counts of ``Domain.vis_paths``.  Target: >= 0.8x the contiguous bandwidth.

``gpu`` (a GPU machine only): two processes on one GPU (``--gpu-per-rank``: one
each on two), device segments of 64 MiB, the KV-cache shape: 1024 blocks of 16 KiB
from random places of the own segment to random places of the peer's
(``put_indexed``, uint64 address arrays), beside one contiguous 16 MiB put and
beside ``cuda/kv_loop.c``: 1024 ``cuMemcpyAsync`` + one sync into the same mapping
(``tm.peer_view``), and its ``cuMemcpyBatchAsync`` form where the driver has it.
Targets: >= 0.9x the contiguous put, >= 0.95x the C loop.

Method: rank 0 times, the peer waits in a barrier (driving progress); every
case is timed in rounds, cases interleaved round by round, the median per call
over the rounds is reported (and the minimum); data checked once per case.
Timings never gate anything.
"""
import argparse
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
KIB, MIB = 1 << 10, 1 << 20


def _timed(cases, rounds, per_round):
    """cases: name -> fn(); each round runs every case per_round[name] times, interleaved."""
    samples = {n: [] for n in cases}
    for n, fn in cases.items():            # warm-up
        for _ in range(max(1, per_round[n] // 4)):
            fn()
    for _ in range(rounds):
        for n, fn in cases.items():
            k = per_round[n]
            t = time.perf_counter_ns()
            for _ in range(k):
                fn()
            samples[n].append((time.perf_counter_ns() - t) / k)
    out = {}
    for n, s in samples.items():
        s.sort()
        out[n] = {"median_us": s[len(s) // 2] / 1e3, "min_us": s[0] / 1e3, "rounds": rounds,
                  "per_round": per_round[n]}
    return out


def _column_array():
    a = np.random.default_rng(1).random((4096, 4096))      # 128 MiB; a column strides 32 KiB
    return a, a[:, 7]


# ---- gexmk sides (run under python -m gexmk.run -n 2) ----------------------------------

def gexmk_host(rounds):
    import gexmk
    c = gexmk.init()
    tm = c.tm
    seg = c.segment_attach(1 * MIB)
    out = None
    if tm.rank == 0:
        a, col = _column_array()
        contig = np.ascontiguousarray(col)
        dest = tm.addr(1, 0)
        tm.put(1, dest, col)
        back = np.zeros(4096)
        tm.get(back, 1, dest)
        assert np.array_equal(back, col), "strided put: wrong data at the target"
        cases = {"put column (strided)": lambda: tm.put(1, dest, col),
                 "put 32 KiB contiguous": lambda: tm.put(1, dest, contig),
                 "numpy copy of the column (local)": lambda: np.copyto(back, col)}
        out = _timed(cases, rounds, {k: 50 for k in cases})
        out["path"] = tm.transport(1)
    tm.barrier()
    c.finalize()
    return out


def gexmk_ofi(rounds):
    import gexmk
    c = gexmk.init()
    tm = c.tm
    seg = c.segment_attach(8 * MIB)
    out = None
    if tm.rank == 0:
        rng = np.random.default_rng(2)
        n, blk = 1024, 4 * KIB
        src = rng.integers(0, 256, n * blk, dtype=np.uint8)
        lperm, rperm = rng.permutation(n), rng.permutation(n)
        base = tm.addr(1, 0)
        srcs = [(src.ctypes.data + blk * int(i), blk) for i in lperm]
        dsts = [(base + blk * int(i), blk) for i in rperm]
        la = np.array([src.ctypes.data + blk * int(i) for i in lperm], np.uint64)
        ra = np.array([base + blk * int(i) for i in rperm], np.uint64)
        tm.put_vector(1, dsts, srcs)
        back = np.zeros(n * blk, np.uint8)
        tm.get(back, 1, base)
        want = np.zeros_like(back)
        for li, ri in zip(lperm, rperm):
            want[ri * blk:(ri + 1) * blk] = src[li * blk:(li + 1) * blk]
        assert np.array_equal(back, want), "put_vector: wrong data at the target"
        back2 = np.zeros_like(back)
        gl = [(back2.ctypes.data + blk * int(i), blk) for i in lperm]
        tm.get_vector(gl, 1, dsts)
        assert all(np.array_equal(back2[li * blk:(li + 1) * blk], back[ri * blk:(ri + 1) * blk])
                   for li, ri in zip(lperm, rperm)), "get_vector: wrong data"

        def put_nbi():
            tm.put_vector_nbi(1, dsts, srcs, lc=gexmk.LC_DEFER)
            tm.quiet()
        cases = {"put_vector 1024 x 4 KiB": lambda: tm.put_vector(1, dsts, srcs),
                 "put_vector_nbi 1024 x 4 KiB + quiet": put_nbi,
                 "put_indexed 1024 x 4 KiB": lambda: tm.put_indexed(1, ra, blk, la, blk),
                 "get_vector 1024 x 4 KiB": lambda: tm.get_vector(gl, 1, dsts),
                 "put 4 MiB contiguous": lambda: tm.put(1, base, src),
                 "get 4 MiB contiguous": lambda: tm.get(back, 1, base)}
        out = _timed(cases, rounds, {k: 3 for k in cases})
        for k in cases:
            out[k]["GB_s"] = n * blk / (out[k]["median_us"] * 1e3)
        out["path"] = tm.transport(1)
        out["provider"] = os.environ.get("GEXMK_OFI_PROVIDER")
        out["vis"] = os.environ.get("GEXMK_OFI_VIS") or "transport"
        out["vis"] += ", landing zones" if os.environ.get("GEXMK_OFI_STAGE") == "all" else ""
        vp = getattr(c.transports["ofi"].domain, "vis_paths", None) if "ofi" in c.transports else None
        if vp is not None and os.environ.get("GEXMK_OFI_STAGE") != "all":
            out["vis"] += ", " + ", ".join(f"{k} {v}" for k, v in vp.items() if v)
    tm.barrier()
    c.finalize()
    return out


def _kv_lib():
    sys.path.insert(0, HERE)
    from cuda_baseline import _cuda_include
    cc = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")
    inc = _cuda_include()
    if cc is None or inc is None:
        return None, "no C compiler or cuda.h"
    out = os.path.join(tempfile.mkdtemp(prefix="gexmk-kv-"), "kv_loop.so")
    err = "?"
    for lib in (["-lcuda"], ["-l:libcuda.so.1"]):
        r = subprocess.run([cc, "-O2", "-shared", "-fPIC", f"-I{inc}",
                            os.path.join(HERE, "cuda", "kv_loop.c"), "-o", out, *lib],
                           capture_output=True, text=True)
        if r.returncode == 0:
            return ctypes.CDLL(out), None
        err = (r.stderr or "?").strip().splitlines()[-1]
    return None, f"kv_loop.c did not build: {err}"


def gexmk_gpu(rounds, per_rank):
    import gexmk
    c = gexmk.init()
    tm = c.tm
    from gexmk.kinds import cuda as kcuda
    ndev = kcuda.probe().get("device_count") or 1
    dev = c.rank % ndev if per_rank else 0
    mk = c.mk_create(gexmk.CUDA_UVA, device=dev)
    seg = c.segment_create(64 * MIB, kind=mk)
    c.ep(0).bind_segment(seg)
    tm.publish_bound_segment([c.ep(0)])
    out = None
    if tm.rank == 0:
        rng = np.random.default_rng(3)
        n, blk = 1024, 16 * KIB
        mine = seg.address + 32 * MIB                     # sources: the upper half of my segment
        peer = tm.addr(1, 0)
        soff = (rng.permutation(2 * n)[:n] * blk).astype(np.uint64)
        doff = (rng.permutation(2 * n)[:n] * blk).astype(np.uint64)
        la = soff + np.uint64(mine)
        ra = doff + np.uint64(peer)
        cases = {"put_indexed 1024 x 16 KiB": lambda: tm.put_indexed(1, ra, blk, la, blk),
                 "put 16 MiB contiguous": lambda: tm.put(1, peer, (mine, n * blk))}
        lib, why = _kv_lib()
        out = {}
        if lib is not None:
            view = tm.peer_view(1)
            mapped = view.address               # the peer's segment as mapped here
            lib.kv_init.argtypes = [ctypes.c_int]
            lib.kv_loop.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_void_p,
                                    ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            lib.kv_batch.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
            rc = lib.kv_init(dev)
            if rc == 0:
                dptr, sptr = doff.ctypes.data, soff.ctypes.data
                cases["C loop of cuMemcpyAsync + sync"] = \
                    lambda: lib.kv_loop(mapped, mine, dptr, sptr, blk, n)
                bd = doff + np.uint64(mapped)
                sizes = np.full(n, blk, np.uint64)
                if lib.kv_batch(bd.ctypes.data, la.ctypes.data, sizes.ctypes.data, n) == 0:
                    cases["C cuMemcpyBatchAsync + sync"] = \
                        lambda: lib.kv_batch(bd.ctypes.data, la.ctypes.data, sizes.ctypes.data, n)
            else:
                out["c_baseline"] = f"kv_init failed: CUresult {rc}"
        else:
            out["c_baseline"] = why
        # data check: the blocks at the target are the sources (CuPy, where present)
        try:
            import cupy as cp
        except ImportError:
            cp = None
        if cp is not None:
            with cp.cuda.Device(dev):
                own = cp.asarray(seg).view(cp.uint8)
                own[32 * MIB:] = cp.random.randint(0, 256, 32 * MIB, dtype=cp.uint8)
                cp.cuda.runtime.deviceSynchronize()
                tm.put_indexed(1, ra, blk, la, blk)
            # the peer's segment lives on its GPU: CuPy views it there
            with cp.cuda.Device(1 % ndev if per_rank else 0):
                there = cp.asarray(tm.peer_view(1)).view(cp.uint8)
                for i in (0, 1, n // 2, n - 1):
                    s0, d0 = int(soff[i]) + 32 * MIB, int(doff[i])
                    assert bytes(cp.asnumpy(there[d0:d0 + blk])) == \
                        bytes(cp.asnumpy(own[s0:s0 + blk])), f"put_indexed: block {i} wrong at the target"
            out["checked"] = True
        out.update(_timed(cases, rounds, {k: 20 for k in cases}))
        for k in cases:
            out[k]["GB_s"] = n * blk / (out[k]["median_us"] * 1e3)
        out["path"] = tm.transport(1)
        out["devices"] = [dev, (1 % ndev) if per_rank else 0]
    tm.barrier()
    c.finalize()
    return out


# ---- the MPI side (run under mpiexec -n 2) --------------------------------------------

def mpi_host(rounds):
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    win = MPI.Win.Allocate(1 * MIB, 1, comm=comm)
    win.Lock_all()
    out = None
    try:
        if comm.rank == 0:
            a, col = _column_array()
            flat = a.reshape(-1)[7:]                       # the column's first element onwards
            vec = MPI.DOUBLE.Create_vector(4096, 1, 4096).Commit()
            contig = np.ascontiguousarray(col)
            back = np.zeros(4096)

            def put_vec():
                win.Put([flat, 1, vec], 1, [0, 4096, MPI.DOUBLE])
                win.Flush(1)

            def put_contig():
                win.Put(contig, 1)
                win.Flush(1)
            put_vec()
            win.Get(back, 1)
            win.Flush(1)
            assert np.array_equal(back, col), "MPI vector put: wrong data"
            out = _timed({"Win.Put vector type + Flush": put_vec,
                          "Win.Put 32 KiB contiguous + Flush": put_contig}, rounds,
                         {"Win.Put vector type + Flush": 50, "Win.Put 32 KiB contiguous + Flush": 50})
            out["library"] = " ".join(MPI.Get_library_version().splitlines()[0].split())
            vec.Free()
        comm.Barrier()
    finally:
        win.Unlock_all()
        win.Free()
    return out


# ---- driver ------------------------------------------------------------------------------

def _last_json(r, what):
    for line in reversed((r.stdout or "").splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    err = (r.stderr or "").strip()
    first = err.find("Traceback")             # the first rank's error, then how the job ended
    head = err[first:first + 1500] + "\n...\n" if first >= 0 else ""
    return {"skipped": f"{what} printed no result (exit {r.returncode}): {head}{err[-400:]}"}


def _job(args, env=None, mpi=False, timeout=600):
    me = os.path.abspath(__file__)
    if mpi:
        mpiexec = shutil.which("mpiexec")
        if mpiexec is None:
            return {"skipped": "mpiexec is not on PATH"}
        cmd = [mpiexec, "-n", "2", sys.executable, "-P", me, *args]
        env = {k: v for k, v in os.environ.items() if not k.startswith("GEXMK_")}
    else:
        cmd = [sys.executable, "-P", "-m", "gexmk.run", "-n", "2", "--timeout", str(timeout), me,
               *args]
        env = dict(os.environ, **(env or {}))
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 30, env=env,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"skipped": f"did not finish in {timeout} s"}
    return _last_json(r, " ".join(cmd[:6]))


def _have_gpu():
    try:
        from gexmk.kinds import cuda
        p = cuda.probe()
        return bool(p.get("driver_loaded") and p.get("device_count"))
    except Exception:          # noqa: BLE001 - no usable GPU
        return False


def run(only, rounds, per_rank, providers=("tcp;ofi_rxm",), stage_all=False):
    res = {}
    r = ["--rounds", str(rounds)]
    if "host" in only:
        res["host"] = {"gexmk": _job(["--role", "gexmk-host", *r]),
                       "mpi": _job(["--role", "mpi-host", *r], mpi=True)}
    for prov in providers:
        if "ofi" not in only:
            break
        # the transport's VIS path and, in the same run, the core's loop of single
        # puts/gets (GEXMK_OFI_VIS=loop: what every VIS call over ofi did before)
        env = {"GEXMK_TRANSPORT": "ofi", "GEXMK_OFI_PROVIDER": prov}
        res["ofi " + prov] = _job(["--role", "gexmk-ofi", *r], env=env)
        # every message direct (fi_writemsg/fi_readmsg), no VIS landing zone
        res["ofi " + prov + " (direct, GEXMK_OFI_VIS_LAND=0)"] = _job(
            ["--role", "gexmk-ofi", *r], env=dict(env, GEXMK_OFI_VIS_LAND="0"))
        res["ofi " + prov + " (core loop)"] = _job(["--role", "gexmk-ofi", *r],
                                                    env=dict(env, GEXMK_OFI_VIS="loop"))
        if stage_all:
            # host segments through landing zones: small blocks packed, unpacked by the lander
            res["ofi " + prov + " (GEXMK_OFI_STAGE=all)"] = _job(
                ["--role", "gexmk-ofi", *r], env=dict(env, GEXMK_OFI_STAGE="all"))
    if "gpu" in only:
        res["gpu"] = _job(["--role", "gexmk-gpu", *r, *(["--gpu-per-rank"] if per_rank else [])]) \
            if _have_gpu() else {"skipped": "no NVIDIA driver or GPU on this machine"}
    return res


def report(res, file=sys.stdout):
    def line(name, v, base=None, key="median_us"):
        if v is None:
            return
        ratio = f"  {base[key] / v[key]:.2f}x of the baseline's rate ({key[:-3]})" \
            if base and key == "min_us" else (f"  {v[key] / base[key]:.2f}x" if base else "")
        gb = f"  {v['GB_s']:.2f} GB/s" if "GB_s" in v else ""
        print(f"  {name:40s} {v['median_us']:10.1f} us (min {v['min_us']:.1f}){gb}{ratio}",
              file=file)
    h = res.get("host")
    if h:
        g, m = h["gexmk"], h["mpi"]
        print(f"host, same node (gexmk path {g.get('path', '?')}; MPI: "
              f"{m.get('library', m.get('skipped', '?'))})", file=file)
        if "skipped" in g:
            print(f"  gexmk skipped: {g['skipped']}", file=file)
        else:
            mv = m.get("Win.Put vector type + Flush")
            for k in ("put column (strided)", "put 32 KiB contiguous",
                      "numpy copy of the column (local)"):
                line("gexmk " + k, g.get(k), mv if k.startswith("put column") else None)
            for k in ("Win.Put vector type + Flush", "Win.Put 32 KiB contiguous + Flush"):
                line("MPI " + k, m.get(k))
            if mv:
                print(f"  target: gexmk strided / MPI vector <= 1.0: "
                      f"{g['put column (strided)']['median_us'] / mv['median_us']:.2f}", file=file)
    for name, o in res.items():
        if not name.startswith("ofi"):
            continue
        print(f"{name} (path {o.get('path', '?')}; VIS through {o.get('vis', '?')})", file=file)
        if "skipped" in o:
            print(f"  skipped: {o['skipped']}", file=file)
        else:
            base = o["put 4 MiB contiguous"]
            gbase = o.get("get 4 MiB contiguous")
            for k in ("put_vector 1024 x 4 KiB", "put_vector_nbi 1024 x 4 KiB + quiet",
                      "put_indexed 1024 x 4 KiB", "put 4 MiB contiguous"):
                line(k, o.get(k), base, key="min_us")
            for k in ("get_vector 1024 x 4 KiB", "get 4 MiB contiguous"):
                line(k, o.get(k), gbase, key="min_us")
            print(f"  target: vector / contiguous bandwidth >= 0.8: "
                  f"{o['put_vector 1024 x 4 KiB']['GB_s'] / base['GB_s']:.2f} on medians, "
                  f"{base['min_us'] / o['put_vector 1024 x 4 KiB']['min_us']:.2f} on minima",
                  file=file)
    gp = res.get("gpu")
    if gp:
        print(f"gpu (path {gp.get('path', '?')}, devices {gp.get('devices')})", file=file)
        if "skipped" in gp:
            print(f"  skipped: {gp['skipped']}", file=file)
        else:
            for k, v in gp.items():
                if isinstance(v, dict):
                    line(k, v)
            kv = gp["put_indexed 1024 x 16 KiB"]["GB_s"]
            print(f"  target: indexed / contiguous >= 0.9: "
                  f"{kv / gp['put 16 MiB contiguous']['GB_s']:.2f}", file=file)
            if "C loop of cuMemcpyAsync + sync" in gp:
                print(f"  target: indexed / C loop >= 0.95: "
                      f"{kv / gp['C loop of cuMemcpyAsync + sync']['GB_s']:.2f}", file=file)
            if "c_baseline" in gp:
                print(f"  C baseline: {gp['c_baseline']}", file=file)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="host,ofi,gpu")
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--gpu-per-rank", action="store_true")
    ap.add_argument("--stage-all", action="store_true",
                    help="ofi: also a job with GEXMK_OFI_STAGE=all (VIS packed through landing zones)")
    ap.add_argument("--providers", default="tcp;ofi_rxm",
                    help="libfabric providers of the ofi case, comma-separated (e.g. tcp;ofi_rxm,shm)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--role", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.role:
        fn = {"gexmk-host": lambda: gexmk_host(args.rounds),
              "gexmk-ofi": lambda: gexmk_ofi(args.rounds),
              "gexmk-gpu": lambda: gexmk_gpu(args.rounds, args.gpu_per_rank),
              "mpi-host": lambda: mpi_host(args.rounds)}[args.role]
        out = fn()
        if out is not None:
            print(json.dumps(out), flush=True)
        return 0
    res = run(set(args.only.split(",")), args.rounds, args.gpu_per_rank,
              tuple(args.providers.split(",")), args.stage_all)
    if args.json:
        print(json.dumps(res, indent=1))
    else:
        report(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
