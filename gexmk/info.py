"""Preflight report: what this machine offers gexmk.

    python -m gexmk.info            # readable report
    python -m gexmk.info --json     # the same, as JSON (``report()``)

Covers the gexmk, Python and numpy versions; libfabric and its RDM providers
(RMA, atomics, memory-registration mode, progress) and whether each can
register CUDA memory; the CUDA driver and devices; and the kernel features
the intra-node transport relies on (Yama ptrace scope for
``process_vm_readv``, ``memfd_create``, ``pidfd_getfd``).

Nothing here needs a working transport: the compiled probes (``gexmk.fabric_probe``,
``gexmk.kinds.cuda``) are imported lazily and a failure to import or run one is
reported as text in its section, never raised.
"""
import argparse
import importlib
import json
import os
import platform
import sys

__all__ = ["report", "main"]


def _error(exc):
    return f"{type(exc).__name__}: {exc}"


def _gexmk_version():
    try:
        import gexmk
        version = getattr(gexmk, "__version__", None)
        if version:
            return str(version)
    except Exception:  # a half-built package must not stop the report
        pass
    try:
        from importlib import metadata
        return metadata.version("gexmk")
    except Exception as exc:
        return f"unknown ({_error(exc)})"


def _numpy():
    try:
        import numpy
        return numpy.__version__
    except Exception as exc:
        return f"not importable ({_error(exc)})"


def _cuda():
    try:
        cuda = importlib.import_module("gexmk.kinds.cuda")
    except Exception as exc:
        return {"available": False, "error": f"gexmk.kinds.cuda did not import: {_error(exc)}"}
    try:
        return cuda.probe()
    except Exception as exc:
        return {"available": False, "error": f"gexmk.kinds.cuda.probe() failed: {_error(exc)}"}


def _hmem_cuda(ofi, names, cuda_info):
    """FI_HMEM_CUDA registration per provider name: with a real device buffer
    where a CUDA device is available, else with a host page."""
    buffer = None
    if cuda_info.get("available"):
        try:
            cuda = importlib.import_module("gexmk.kinds.cuda")
            buffer = cuda.DeviceBuffer(1 << 16, device=0)
        except Exception:
            buffer = None
    try:
        out = {}
        for name in names:
            try:
                if buffer is not None:
                    out[name] = ofi.hmem_cuda_registration(
                        name, ptr=buffer.ptr, nbytes=buffer.nbytes, device=buffer.device)
                else:
                    out[name] = ofi.hmem_cuda_registration(name)
            except Exception as exc:
                out[name] = {"provider": name, "supported": False,
                             "reason": f"probe failed: {_error(exc)}"}
        return out
    finally:
        if buffer is not None:
            buffer.close()


def _libfabric(cuda_info):
    try:
        ofi = importlib.import_module("gexmk.fabric_probe")
    except Exception as exc:
        return {"error": f"gexmk.fabric_probe did not import: {_error(exc)}", "providers": [],
                "hmem_cuda": {}}
    out = {"version": None, "header_version": ofi.HEADER_VERSION, "providers": [],
           "hmem_cuda": {}}
    try:
        out["version"] = ofi.version()
        out["providers"] = ofi.providers()
    except Exception as exc:
        out["error"] = _error(exc)
        return out
    names = list(dict.fromkeys(p["provider"] for p in out["providers"]))
    out["hmem_cuda"] = _hmem_cuda(ofi, names, cuda_info)
    out["transport"] = _chosen_transport()
    return out


def _chosen_transport():
    """What the ofi transport would open here, with this environment
    (GEXMK_OFI_PROVIDER, GEXMK_OFI_IFACE, FI_PROVIDER): the same Domain the
    client opens, closed again at once."""
    try:
        transport = importlib.import_module("gexmk.transports.ofi")
    except Exception as exc:
        return {"error": f"gexmk.transports.ofi did not import: {_error(exc)}"}
    try:
        dom = transport.Domain(os.environ.get("GEXMK_OFI_PROVIDER") or None,
                               os.environ.get("GEXMK_OFI_IFACE") or None)
    except Exception as exc:
        return {"error": _error(exc)}
    try:
        return {"provider": dom.provider, "domain": dom.domain_name, "atomics": dom.atomics,
                "manual_progress": dom.manual_progress, "inject_size": dom.inject_size,
                "mr_mode": dom.mr_mode, "split_endpoints": dom.split_endpoints,
                "ordered_flush": dom.ordered_flush[0], "put_signal": dom.put_signal_mode}
    finally:
        dom.close()


_PTRACE_MEANING = {
    0: "classic: a process may read another of the same user (process_vm_readv works "
       "between local ranks)",
    1: "restricted: only an ancestor, or a process named with PR_SET_PTRACER, may read "
       "another (process_vm_readv between sibling ranks needs PR_SET_PTRACER)",
    2: "admin-only: process_vm_readv between ranks needs CAP_SYS_PTRACE",
    3: "no attach: process_vm_readv between ranks is impossible; shared-memory segments "
       "still work",
}


def _ptrace_scope():
    path = "/proc/sys/kernel/yama/ptrace_scope"
    try:
        with open(path) as f:
            value = int(f.read().strip())
    except FileNotFoundError:
        return {"value": None, "meaning": "Yama absent: same-user processes may read "
                                          "each other (process_vm_readv works)"}
    except Exception as exc:
        return {"value": None, "meaning": f"unreadable: {_error(exc)}"}
    return {"value": value, "meaning": _PTRACE_MEANING.get(value, "unknown value")}


def _memfd():
    if not hasattr(os, "memfd_create"):
        return {"supported": False, "reason": "os.memfd_create missing from this Python"}
    try:
        fd = os.memfd_create("gexmk-preflight", os.MFD_CLOEXEC)
    except OSError as exc:
        return {"supported": False, "reason": _error(exc)}
    os.close(fd)
    return {"supported": True, "reason": None}


def _pidfd_getfd():
    """Whether pidfd_getfd(2) (Linux 5.6) works, tried on this process."""
    if not hasattr(os, "pidfd_open"):
        return {"supported": False, "reason": "os.pidfd_open missing from this Python"}
    import ctypes
    import errno
    SYS_pidfd_getfd = 438  # same number on every architecture (added in 5.6)
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        pidfd = os.pidfd_open(os.getpid())
    except OSError as exc:
        return {"supported": False, "reason": f"pidfd_open: {_error(exc)}"}
    try:
        r, w = os.pipe()
        try:
            fd = libc.syscall(SYS_pidfd_getfd, pidfd, r, 0)
            if fd < 0:
                err = ctypes.get_errno()
                return {"supported": False,
                        "reason": f"pidfd_getfd: {errno.errorcode.get(err, err)}: "
                                  f"{os.strerror(err)}"}
            os.close(fd)
            return {"supported": True, "reason": None}
        finally:
            os.close(r)
            os.close(w)
    finally:
        os.close(pidfd)


def _bootstrap():
    """Which bootstrap plug-in this process would use and why, and which plug-ins
    this installation offers (the PMIx client is absent where pmix.h was not found)."""
    try:
        from gexmk.bootstrap import registry
        out = registry.explain()
        out["considered"] = [list(c) for c in out["considered"]]
        plugins = {}
        for name in registry.ORDER:
            why = registry._available(name) if name != "mpi" else registry._mpi4py_missing()
            plugins[name] = {"available": why is None, "reason": why or ""}
        if plugins["pmix"]["available"]:
            try:
                plugins["pmix"]["reason"] = importlib.import_module(
                    "gexmk.bootstrap.pmix_client").VERSION
            except Exception as exc:
                plugins["pmix"] = {"available": False, "reason": f"did not import: {_error(exc)}"}
        out["plugins"] = plugins
        return out
    except Exception as exc:
        return {"name": None, "reason": f"the bootstrap registry failed: {_error(exc)}",
                "considered": [], "plugins": {}}


def _cpus():
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = None
    return {"count": os.cpu_count(), "usable": usable}


def report() -> dict:
    """Collect the preflight report as a JSON-serialisable dict.

    Keys: ``gexmk``, ``python``, ``platform``, ``numpy`` (version strings);
    ``libfabric`` (``version``, ``header_version``, ``providers`` as from
    :func:`gexmk.fabric_probe.providers`, ``hmem_cuda``: provider name -> result of
    :func:`gexmk.fabric_probe.hmem_cuda_registration`, and ``error`` where libfabric
    could not be probed); ``cuda`` (:func:`gexmk.kinds.cuda.probe`, or ``error``);
    ``ptrace_scope``, ``memfd``, ``pidfd_getfd`` and ``cpus``; ``bootstrap``
    (:func:`gexmk.bootstrap.explain`: ``name`` and ``reason`` of the plug-in this
    process would use, ``considered``: the ones passed over and why, and
    ``plugins``: name -> ``available``, ``reason``).  Never raises.
    """
    cuda_info = _cuda()
    return {
        "gexmk": _gexmk_version(),
        "python": f"{platform.python_version()} ({platform.python_implementation()})",
        "platform": platform.platform(),
        "numpy": _numpy(),
        "libfabric": _libfabric(cuda_info),
        "cuda": cuda_info,
        "ptrace_scope": _ptrace_scope(),
        "memfd": _memfd(),
        "pidfd_getfd": _pidfd_getfd(),
        "cpus": _cpus(),
        "bootstrap": _bootstrap(),
    }


# ---------------------------------------------------------------------------
# Text rendering
# ---------------------------------------------------------------------------
def _yes(value):
    return {True: "yes", False: "no", None: "?"}.get(value, str(value))


def _short_progress(name):
    return name.replace("FI_PROGRESS_", "").lower() if name else "?"


def _gib(nbytes):
    return "?" if nbytes is None else f"{nbytes / (1 << 30):.1f} GiB"


def _provider_rows(providers):
    """One row per provider name, merging its fabrics/domains/variants."""
    rows = {}
    for p in providers:
        r = rows.setdefault(p["provider"], {"atomic": False, "hmem_caps": False,
                                            "progress": set(), "mr_mode": [],
                                            "inject": set(), "domains": []})
        r["atomic"] |= p["atomic"]
        r["hmem_caps"] |= p["hmem_caps"]
        r["progress"].add(f"{_short_progress(p['data_progress'])}/"
                          f"{_short_progress(p['control_progress'])}")
        for m in p["mr_mode"]:
            if m not in r["mr_mode"]:
                r["mr_mode"].append(m)
        r["inject"].add(p["inject_size"])
        if p["domain"] not in r["domains"]:
            r["domains"].append(p["domain"])
    return rows


def _format(rep):
    lines = [f"gexmk {rep['gexmk']} preflight report", ""]
    lines.append(f"  Python        {rep['python']}")
    lines.append(f"  platform      {rep['platform']}")
    lines.append(f"  numpy         {rep['numpy']}")
    cpus = rep["cpus"]
    lines.append(f"  CPUs          {cpus['count']} ({cpus['usable']} usable by this process)")
    ps = rep["ptrace_scope"]
    lines.append(f"  ptrace_scope  {ps['value']}: {ps['meaning']}")
    lines.append(f"  memfd_create  {_yes(rep['memfd']['supported'])}"
                 + (f" ({rep['memfd']['reason']})" if rep["memfd"]["reason"] else ""))
    pg = rep["pidfd_getfd"]
    lines.append(f"  pidfd_getfd   {_yes(pg['supported'])}"
                 + (f" ({pg['reason']})" if pg["reason"] else ""))

    lf = rep["libfabric"]
    lines.append("")
    if lf.get("version"):
        lines.append(f"libfabric {lf['version']} (built against headers "
                     f"{lf['header_version']})")
    else:
        lines.append("libfabric")
    if lf.get("error"):
        lines.append(f"  error: {lf['error']}")
    rows = _provider_rows(lf.get("providers", []))
    if rows:
        lines.append("  RDM providers with FI_RMA:")
        head = (f"    {'provider':<14} {'atomic':<7} {'progress':<14} {'inject':<8} "
                f"{'mr_mode':<34} domains")
        lines.append(head)
        for name, r in rows.items():
            inject = "/".join(str(i) for i in sorted(r["inject"]))
            mr = ",".join(m.replace("FI_MR_", "") for m in r["mr_mode"]) or "-"
            lines.append(f"    {name:<14} {_yes(r['atomic']):<7} "
                         f"{','.join(sorted(r['progress'])):<14} {inject:<8} {mr:<34} "
                         f"{', '.join(r['domains'])}")
    elif not lf.get("error"):
        lines.append("  no RDM provider offers FI_RMA")
    tr = lf.get("transport") or {}
    if tr.get("provider"):
        lines.append(f"  gexmk's ofi transport would use: {tr['provider']} on {tr['domain']} "
                     f"(atomics {_yes(tr['atomics'])}, "
                     f"{'manual' if tr['manual_progress'] else 'auto'} progress, "
                     f"inject {tr['inject_size']} B)")
        if "split_endpoints" in tr:
            lines.append("    implicit puts complete by "
                         + ("a read-after-write flush" if tr["ordered_flush"]
                            else "FI_DELIVERY_COMPLETE each")
                         + ("; atomics on a second endpoint per gexmk endpoint (RMA one "
                            "without FI_ATOMIC keeps RAW ordering)" if tr["split_endpoints"] else ""))
        if tr.get("put_signal"):
            lines.append("    put_signal: " + (
                "data and signal back to back (the provider orders an RMA write before a later "
                "atomic, FI_ORDER_WAW)" if tr["put_signal"] == "ordered" else
                "the data's delivery is waited for before the signal is issued (no RMA-then-"
                "atomic ordering on one endpoint)"))
    elif tr.get("error"):
        lines.append(f"  gexmk's ofi transport: {tr['error']}")
    if lf.get("hmem_cuda"):
        lines.append("  FI_HMEM_CUDA registration (tried, not read from caps):")
        for name, res in lf["hmem_cuda"].items():
            lines.append(f"    {name:<14} {_yes(res.get('supported')):<4} {res.get('reason', '')}")

    bs = rep["bootstrap"]
    lines.append("")
    lines.append("Bootstrap (how this process would find its job)")
    if bs["name"]:
        lines.append(f"  would use: {bs['name']}: {bs['reason']}")
    else:
        lines.append(f"  cannot start: {bs['reason']}")
    for name, why in bs["considered"]:
        if why != "its environment is absent":
            lines.append(f"  passed over: {name}: {why}")
    if bs["plugins"]:
        lines.append("  plug-ins here: " + ", ".join(
            f"{name} ({'yes' if p['available'] else 'absent'}"
            + (f": {p['reason']}" if p["reason"] else "") + ")"
            for name, p in bs["plugins"].items()))

    cu = rep["cuda"]
    lines.append("")
    lines.append("CUDA")
    if cu.get("error"):
        lines.append(f"  error: {cu['error']}")
    elif not cu.get("available"):
        if cu.get("driver_version"):
            lines.append(f"  driver supports CUDA {cu['driver_version']}")
        lines.append(f"  {cu.get('reason')}")
    else:
        lines.append(f"  driver supports CUDA {cu['driver_version']}, "
                     f"{cu['device_count']} device(s)")
        for d in cu["devices"]:
            lines.append(f"  [{d['ordinal']}] {d['name']} (sm {d['compute_capability']}, "
                         f"{_gib(d['total_memory'])}, BAR1 {_gib(d['bar1_total'])}, "
                         f"PCI {d['pci_bus_id']})")
            lines.append(f"      VMM {_yes(d['vmm'])}, POSIX-fd handles "
                         f"{_yes(d['posix_fd_handle'])}, fabric handles "
                         f"{_yes(d['fabric_handle'])}, GPUDirect RDMA "
                         f"{_yes(d['gpudirect_rdma'])} (with VMM "
                         f"{_yes(d['gpudirect_rdma_with_vmm'])}), DMA-BUF "
                         f"{_yes(d['dma_buf'])}, unified addressing "
                         f"{_yes(d['unified_addressing'])}")
        if cu["device_count"] > 1:
            lines.append("  peer access (row can access column):")
            for i, row in enumerate(cu["peer_access"]):
                lines.append(f"    [{i}] " + " ".join("Y" if x else "." for x in row))
    return "\n".join(lines)


def main(argv=None) -> int:
    """Entry point of ``python -m gexmk.info``; returns the exit status (0)."""
    parser = argparse.ArgumentParser(
        prog="python -m gexmk.info",
        description="Report what this machine supports for gexmk: libfabric providers, "
                    "FI_HMEM_CUDA registration, CUDA devices, kernel features, and which "
                    "bootstrap (launcher) this process would use and why.")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    rep = report()
    if args.json:
        print(json.dumps(rep, indent=2))
    else:
        print(_format(rep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
