"""The report: every figure beside its baseline and the issues' targets."""
from __future__ import annotations

import sys

from gexmk.bench.common import BIG_SIZE, BIG_VS_MEMCPY, HEAT_VS_FENCE, NBI_RATE_VS_MPI, NOGIL_NBI_MIN_RATE, NOGIL_PUT8_MAX_NS, PUT8_MAX_US, PUT8_VS_MPI
from gexmk.bench.timing import fmt_size


# ---- report ----------------------------------------------------------------------------

def _gbps(nbytes, us):
    return nbytes / (us * 1e3) if us and us > 0 else float("nan")


def _get(d, *keys):
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def _status(*parts):
    """One target's status from its parts (True met, False missed, None not measured):
    "MISS" if any part missed, "met" if all were met, "part" if the measured ones
    were met but some were not measured, "n/a" if none was measured."""
    if any(p is False for p in parts):
        return "MISS"
    if all(p is None for p in parts):
        return "n/a"
    return "part" if any(p is None for p in parts) else "met"


def _targets(r):
    """[(status, text)] for the issue's targets (status: see ``_status``)."""
    g, mpi = r["gexmk"], r.get("mpi4py", {})
    out = []
    put8 = g["small"]["put"]["median_us"]
    mpi_pf = _get(mpi, "small", "put_flush", "median_us")
    text = f"8 B blocking put from Python: {put8:.3f} µs (target <= {PUT8_MAX_US} µs)"
    parts = [put8 <= PUT8_MAX_US]
    if mpi_pf:
        text += f"; {put8 / mpi_pf:.3f} x mpi4py Put+Flush {mpi_pf:.3f} µs (target <= {PUT8_VS_MPI})"
        parts.append(put8 <= PUT8_VS_MPI * mpi_pf)
    else:
        text += "; mpi4py baseline not run"
        parts.append(None)
    out.append((_status(*parts), text))

    ng = g.get("nogil") or {}
    if "put8" in ng:
        ns = ng["put8"]["median_us"] * 1e3
        out.append((_status(ns <= NOGIL_PUT8_MAX_NS),
                    f"8 B rma.put in a nogil loop: {ns:.2f} ns per put (target <= {NOGIL_PUT8_MAX_NS:g} ns)"))
    else:
        out.append(("n/a", "8 B rma.put in a nogil loop: not measured (" + g.get("nogil_note", "") + ")"))

    nbi = g["small"]["put_nbi"]["median_us"]
    mpi_pi = _get(mpi, "small", "put_issue", "median_us")
    if mpi_pi:
        ratio = mpi_pi / nbi
        out.append((_status(ratio >= NBI_RATE_VS_MPI),
                    f"8 B put_nbi issue rate from Python: {1 / nbi:.2f} M/s = {ratio:.2f} x mpi4py Put "
                    f"(no flush) {1 / mpi_pi:.2f} M/s (target >= {NBI_RATE_VS_MPI} x)"))
    else:
        out.append(("n/a", f"8 B put_nbi issue rate from Python: {1 / nbi:.2f} M/s; mpi4py baseline not run"))
    if "put_nbi8" in ng:
        rate = 1e6 / ng["put_nbi8"]["median_us"]
        out.append((_status(rate >= NOGIL_NBI_MIN_RATE),
                    f"8 B rma.put_nbi from a nogil loop: {rate / 1e6:.0f} M/s (target >= "
                    f"{NOGIL_NBI_MIN_RATE / 1e6:g} M/s)"))
    else:
        out.append(("n/a", "8 B rma.put_nbi from a nogil loop: not measured"))

    big = r["sizes"][-1]
    ps = g["per_size"][str(big)]
    if big == BIG_SIZE:
        bw, cbw = _gbps(big, ps["put"]["median_us"]), _gbps(big, ps["copy"]["median_us"])
        mpi_b = _get(mpi, "per_size", str(big), "put_flush", "median_us")
        text = (f"4 MiB put from Python: {bw:.2f} GB/s = {bw / cbw:.2f} x numpy.copyto {cbw:.2f} GB/s "
                f"(target >= {BIG_VS_MEMCPY})")
        parts = [bw >= BIG_VS_MEMCPY * cbw]
        if mpi_b:
            mbw = _gbps(big, mpi_b)
            text += f"; {bw / mbw:.2f} x mpi4py Put+Flush {mbw:.2f} GB/s (target: not below)"
            parts.append(bw >= mbw)
        else:
            text += "; mpi4py baseline not run"
            parts.append(None)
        out.append((_status(*parts), text))
    else:
        out.append(("n/a", "4 MiB put: not in --sizes"))
    heat = r.get("heat") or {}
    for run in heat.get("runs", []):
        gus, mus = run["gexmk"].get("per_iter_us"), run["mpi4py"].get("per_iter_us")
        what = f"heat equation {run['grid']}x{run['grid']}, {run['ranks']} ranks, per iteration"
        if gus is None:
            out.append(("MISS", f"{what}: the gexmk run failed ({run['gexmk'].get('skipped')})"))
        elif mus is None:
            out.append(("n/a", f"{what}: {gus:.1f} µs; mpi4py baseline not run"))
        else:
            out.append((_status(gus <= HEAT_VS_FENCE * mus),
                        f"{what}: {gus:.1f} µs = {gus / mus:.2f} x mpi4py Win.Fence {mus:.1f} µs "
                        f"(target <= {HEAT_VS_FENCE})"))
    return out


def _report_heat(r, p):
    heat = r.get("heat") or {"skipped": "not run"}
    if "skipped" in heat:
        p(f"Heat equation: skipped - {heat['skipped']}")
        p()
        return
    p("Heat equation (examples/heat.py: Jacobi sweeps, halo rows by put + tm.barrier) beside "
      "mpi4py Win.Put + Win.Fence (examples/heat_mpi4py.py), µs per iteration (exch: of which "
      "halo exchange and synchronisation, on rank 0)")
    p(f"{'grid':>11} {'ranks':>5} {'iters':>5} {'gexmk':>10} {'exch':>9} {'mpi4py':>10} {'exch':>9} "
      f"{'gexmk/mpi':>9}  check")
    for run in heat["runs"]:
        g, m = run["gexmk"], run["mpi4py"]
        gus = g.get("per_iter_us")
        mus = m.get("per_iter_us")
        gtxt = f"{gus:10.1f}" if gus is not None else f"{'failed':>10}"
        mtxt = f"{mus:10.1f}" if mus is not None else f"{'n/a':>10}"
        gx, mx = g.get("exchange_us"), m.get("exchange_us")
        gtxt += f" {gx:9.1f}" if gx is not None else f" {'':>9}"
        mtxt += f" {mx:9.1f}" if mx is not None else f" {'':>9}"
        ratio = f"{gus / mus:9.2f}" if gus and mus else f"{'':>9}"
        checks = []
        for who, d in (("gexmk", g), ("mpi4py", m)):
            if "skipped" in d:
                checks.append(f"{who}: {d['skipped']}")
            elif d.get("ok") is False:
                checks.append(f"{who}: DIFFERS from serial")
        grid = f"{run['grid']}x{run['grid']}"
        p(f"{grid:>11} {run['ranks']:>5} {run['iters']:>5} {gtxt} {mtxt} {ratio}  "
          + ("; ".join(checks) if checks else "bitwise equal to serial numpy"))
    p()


def _report_jacobi(r, p):
    jac = r.get("jacobi") or {"skipped": "not run"}
    if "skipped" in jac:
        p(f"GPU Jacobi: skipped - {jac['skipped']}")
        p()
        return
    p("GPU Jacobi (examples/jacobi_gpu.py: halos by put_signal_on_stream into the neighbours' "
      "device segments, norm by team allreduce every iteration); baseline: the nccl variant of "
      "NVIDIA's multi-gpu-programming-models, bench/jacobi_gpu_baseline.py")
    single = single_norm = None
    for run in jac["runs"]:
        if "skipped" in run:
            p(f"  {run['ranks']} ranks: failed - {run['skipped']}")
            continue
        us, norm = run["per_iter_us"], run["norm"]
        if run["ranks"] == 1:
            single, single_norm = us, norm
        eff = (f", parallel efficiency {single / (run['gpus'] * us) * 100:.1f} %"
               if single and run["gpus"] > 1 else "")
        same = ""
        if single_norm is not None and run["ranks"] > 1:
            same = ("; the single-GPU run's residual" if abs(norm - single_norm) <= 1e-6 * abs(single_norm)
                    else f"; DIFFERS from the single-GPU run's residual {single_norm:.6e}")
        p(f"  {run['nx']}x{run['ny']} {run.get('dtype', '')}, {run['ranks']} ranks on {run['gpus']} "
          f"GPU(s): {us:.1f} µs per iteration{eff}; residual {norm:.6e}{same}")
    p()


def report(r, file=None):
    """Print the results dict ``r`` (see ``main``) as tables with baselines."""
    out = file or sys.stdout

    def p(line=""):
        print(line, file=out)

    g, mpi = r["gexmk"], r.get("mpi4py", {})
    have_mpi = "skipped" not in mpi
    m = r["meta"]
    procs = f"{g['nprocs']} process" + ("es" if g["nprocs"] != 1 else "")
    p(f"gexmk {m['gexmk']} bench: {procs} on one node, rank 0 -> rank {g['peer']} "
      f"(transport {g['transport']}); {m['cpu']}, {m['ncpu']} CPUs; "
      f"Python {m['python']}, numpy {m['numpy']}")
    p(f"medians over up to {r['args']['iters']} timed batches of ~{r['args']['batch_us']:g} µs "
      "(perf_counter_ns per batch, reported per operation)")
    load = m.get("loadavg_at_start")
    if load is not None and load > 0.5:
        p(f"warning: the machine was busy when the benchmark started (1-min load average "
          f"{load:.2f} on {m['ncpu']} CPUs): expect noisy figures, rerun on an idle machine")
    if have_mpi:
        p(f"baseline: mpi4py {mpi['mpi4py']} on {mpi['library']} - Win.Allocate, Lock_all, "
          "Put/Get + Flush(target), 2 processes")
    else:
        p(f"baseline: mpi4py skipped - {mpi['skipped']}")
    p()

    # Latency table.
    p("Blocking put/get from Python, median latency (µs)"
      + ("; mpi4py: Put/Get + Flush(target)" if have_mpi else ""))
    hdr = f"{'size':>8} {'put':>9} {'get':>9}"
    if have_mpi:
        hdr += f" | {'mpi Put':>9} {'mpi Get':>9} {'put x':>7} {'get x':>7}"
    p(hdr)
    for n in r["sizes"]:
        ps = g["per_size"][str(n)]
        line = f"{fmt_size(n):>8} {ps['put']['median_us']:9.3f} {ps['get']['median_us']:9.3f}"
        if have_mpi:
            mp = mpi["per_size"][str(n)]
            mput, mget = mp["put_flush"]["median_us"], mp["get_flush"]["median_us"]
            line += (f" | {mput:9.3f} {mget:9.3f} {mput / ps['put']['median_us']:6.2f}x"
                     f" {mget / ps['get']['median_us']:6.2f}x")
        p(line)
    if have_mpi:
        p("(put x / get x: how many times faster gexmk is than mpi4py)")
    p()

    # Bandwidth table.
    p("Bandwidth (GB/s = 1e9 B/s) beside memcpy (numpy.copyto between two local arrays of the size)")
    hdr = f"{'size':>8} {'put':>8} {'get':>8} {'memcpy':>8} {'put/memcpy':>10}"
    if have_mpi:
        hdr += f" | {'mpi Put':>8} {'put/mpi':>8}"
    p(hdr)
    for n in r["sizes"]:
        ps = g["per_size"][str(n)]
        bw, gbw = _gbps(n, ps["put"]["median_us"]), _gbps(n, ps["get"]["median_us"])
        cbw = _gbps(n, ps["copy"]["median_us"])
        line = f"{fmt_size(n):>8} {bw:8.3f} {gbw:8.3f} {cbw:8.3f} {bw / cbw:10.2f}"
        if have_mpi:
            mbw = _gbps(n, mpi["per_size"][str(n)]["put_flush"]["median_us"])
            line += f" | {mbw:8.3f} {bw / mbw:7.2f}x"
        p(line)
    p()

    # 8 B operations.
    p("8 B operations from Python (µs per call, median)")
    rows = [("put (blocking)", "put", "Put+Flush", "put_flush"),
            ("get (blocking)", "get", "Get+Flush", "get_flush"),
            ("put_val", "put_val", "Put+Flush", "put_flush"),
            ("get_val", "get_val", "Get+Flush", "get_flush"),
            ("put_nbi (issue)", "put_nbi", "Put, no flush", "put_issue"),
            ("atomic FADD (I64)", "atomic_fadd", "Fetch_and_op+Flush", "fetch_and_op_flush"),
            ("numpy.copyto 8 B", "numpy_copyto", None, None)]
    p(f"{'operation':<20} {'gexmk':>8} {'rate M/s':>9}"
      + (f" | {'mpi4py':<19} {'µs':>8} {'x':>7}" if have_mpi else ""))
    for label, key, mlabel, mkey in rows:
        if key not in g["small"]:
            p(f"{label:<20} {'n/a':>8}   ({g.get('atomic_note', 'not measured')})")
            continue
        us = g["small"][key]["median_us"]
        line = f"{label:<20} {us:8.3f} {1 / us:9.2f}"
        if have_mpi and mkey:
            mus = mpi["small"][mkey]["median_us"]
            line += f" | {mlabel:<19} {mus:8.3f} {mus / us:6.2f}x"
        elif have_mpi:
            line += " | (numpy's own per-call cost dominates at 8 B)"
        p(line)
    p()

    # nogil loops.
    ng = g.get("nogil") or {}
    if "put8" in ng:
        big = ng["big_size"]
        how = ("built with the package" if "_bench" in str(g.get("nogil_module") or "")
               else "built on the fly")
        p(f"Cython nogil loops through `from gexmk cimport rma` ({how})")
        p(f"{'operation':<26} {'ns/op':>9} {'rate':>14}")
        for label, key in (("rma.put 8 B", "put8"), ("rma.put_nbi 8 B (+quiet)", "put_nbi8"),
                           ("rma.get 8 B", "get8")):
            ns = ng[key]["median_us"] * 1e3
            p(f"{label:<26} {ns:9.2f} {1e3 / ns:10.1f} M/s")
        pb, mb = ng["put_big"]["median_us"], ng["memcpy_big"]["median_us"]
        p(f"{'rma.put ' + fmt_size(big):<26} {pb * 1e3:9.0f} {_gbps(big, pb):10.2f} GB/s")
        p(f"{'C memcpy ' + fmt_size(big) + ' (baseline)':<26} {mb * 1e3:9.0f} {_gbps(big, mb):10.2f} GB/s"
          f"   put/memcpy {mb / pb:.2f}")
    else:
        p(f"Cython nogil loops: skipped - {g.get('nogil_note', 'not built')}")
    p()
    _report_heat(r, p)
    _report_jacobi(r, p)
    p(r["gpu_note"])
    p()
    p("Targets")
    for status, text in r["targets"]:
        p(f"  [{status:<4}] {text}")
