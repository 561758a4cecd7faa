"""libfabric probing: which providers give RDM endpoints with RMA (and atomics),
and whether a provider can register CUDA device memory (``FI_HMEM_CUDA``).

``python -m gexmk.info`` reports from here; the ofi transport reuses the
:c:func:`check` helper and the hints it describes (``ACCEPTED_MODE``,
``ACCEPTED_MR_MODE``).  Every libfabric object opened here is closed again on
every path, and every ``fi_*`` call runs without the GIL.
"""
from libc.stdint cimport uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport free
from libc.string cimport strdup, memset
from posix.stdlib cimport posix_memalign
from posix.uio cimport iovec

from gexmk.lib.libfabric cimport *

import warnings

from gexmk.errors import ArgumentError, OFIError

__all__ = ["providers", "hmem_cuda_registration", "version", "strerror",
           "HEADER_VERSION", "ACCEPTED_MODE", "ACCEPTED_MR_MODE"]

#: libfabric version of the headers this module was compiled against.
HEADER_VERSION = f"{FI_MAJOR_VERSION}.{FI_MINOR_VERSION}.{FI_REVISION_VERSION}"

#: fi_info.mode bits the gexmk transport honours: it keeps an fi_context2 in
#: every operation record, so providers that ask for either are usable.
ACCEPTED_MODE = FI_CONTEXT | FI_CONTEXT2

#: mr_mode bits the gexmk transport honours: it registers local buffers,
#: exchanges provider keys (raw ones too) and base addresses, binds MRs to
#: endpoints where asked, and registers device memory.
ACCEPTED_MR_MODE = (FI_MR_LOCAL | FI_MR_RAW | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED |
                    FI_MR_PROV_KEY | FI_MR_ENDPOINT | FI_MR_HMEM)

cdef enum:
    # Size (and alignment) of the host page used to probe FI_HMEM_CUDA
    # when the caller has no device pointer.
    _PROBE_BYTES = 4096


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------
def strerror(int code) -> str:
    """Text of libfabric error *code* (``fi_strerror``); the sign is ignored."""
    return fi_strerror(-code if code < 0 else code).decode("utf-8", "replace")


cdef int _raise_ofi(const char* call, ssize_t rc) except -1 with gil:
    code = <int>(-rc)
    raise OFIError(call.decode(), code, strerror(code))


cdef inline int check(const char* call, ssize_t rc) except -1 nogil:
    """Return 0 when *rc* (a libfabric return value) is not negative; else
    raise :class:`gexmk.errors.OFIError` naming *call*, with ``fi_strerror``
    text.  Runs without the GIL and takes it only to raise."""
    if rc >= 0:
        return 0
    return _raise_ofi(call, rc)


cdef int _close(fid* f, str what) except -1:
    """Close one libfabric object, warning (never raising over an earlier
    error) if the provider refuses: cleanup must run to the end."""
    cdef int rc
    if f == NULL:
        return 0
    with nogil:
        rc = fi_close(f)
    if rc < 0:
        warnings.warn(f"fi_close({what}) failed: {strerror(rc)} (-{-rc})",
                      RuntimeWarning, stacklevel=2)
    return 0


# ---------------------------------------------------------------------------
# Flag and enum names
# ---------------------------------------------------------------------------
# Aliases (FI_TRANSMIT, FI_ATOMICS, FI_EVENT) are left out so that each bit
# has one name.  Bits a newer provider sets that are not listed show as hex.
_CAPS = (
    (FI_MSG, "FI_MSG"), (FI_RMA, "FI_RMA"), (FI_TAGGED, "FI_TAGGED"),
    (FI_ATOMIC, "FI_ATOMIC"), (FI_MULTICAST, "FI_MULTICAST"),
    (FI_COLLECTIVE, "FI_COLLECTIVE"), (FI_READ, "FI_READ"), (FI_WRITE, "FI_WRITE"),
    (FI_RECV, "FI_RECV"), (FI_SEND, "FI_SEND"), (FI_REMOTE_READ, "FI_REMOTE_READ"),
    (FI_REMOTE_WRITE, "FI_REMOTE_WRITE"), (FI_MULTI_RECV, "FI_MULTI_RECV"),
    (FI_REMOTE_CQ_DATA, "FI_REMOTE_CQ_DATA"), (FI_TRIGGER, "FI_TRIGGER"),
    (FI_FENCE, "FI_FENCE"), (FI_PEER_TRANSFER, "FI_PEER_TRANSFER"),
    (FI_AV_USER_ID, "FI_AV_USER_ID"), (FI_PEER, "FI_PEER"),
    (FI_XPU_TRIGGER, "FI_XPU_TRIGGER"), (FI_HMEM, "FI_HMEM"),
    (FI_VARIABLE_MSG, "FI_VARIABLE_MSG"), (FI_RMA_PMEM, "FI_RMA_PMEM"),
    (FI_SOURCE_ERR, "FI_SOURCE_ERR"), (FI_LOCAL_COMM, "FI_LOCAL_COMM"),
    (FI_REMOTE_COMM, "FI_REMOTE_COMM"), (FI_SHARED_AV, "FI_SHARED_AV"),
    (FI_RMA_EVENT, "FI_RMA_EVENT"), (FI_SOURCE, "FI_SOURCE"),
    (FI_NAMED_RX_CTX, "FI_NAMED_RX_CTX"), (FI_DIRECTED_RECV, "FI_DIRECTED_RECV"),
)

_MODE = (
    (FI_CONTEXT, "FI_CONTEXT"), (FI_MSG_PREFIX, "FI_MSG_PREFIX"),
    (FI_ASYNC_IOV, "FI_ASYNC_IOV"), (FI_RX_CQ_DATA, "FI_RX_CQ_DATA"),
    (FI_LOCAL_MR, "FI_LOCAL_MR"), (FI_NOTIFY_FLAGS_ONLY, "FI_NOTIFY_FLAGS_ONLY"),
    (FI_RESTRICTED_COMP, "FI_RESTRICTED_COMP"), (FI_CONTEXT2, "FI_CONTEXT2"),
    (FI_BUFFERED_RECV, "FI_BUFFERED_RECV"),
)

_OP_FLAGS = (
    (FI_MULTI_RECV, "FI_MULTI_RECV"), (FI_REMOTE_CQ_DATA, "FI_REMOTE_CQ_DATA"),
    (FI_MORE, "FI_MORE"), (FI_PEEK, "FI_PEEK"), (FI_TRIGGER, "FI_TRIGGER"),
    (FI_FENCE, "FI_FENCE"), (FI_PRIORITY, "FI_PRIORITY"),
    (FI_COMPLETION, "FI_COMPLETION"), (FI_INJECT, "FI_INJECT"),
    (FI_INJECT_COMPLETE, "FI_INJECT_COMPLETE"),
    (FI_TRANSMIT_COMPLETE, "FI_TRANSMIT_COMPLETE"),
    (FI_DELIVERY_COMPLETE, "FI_DELIVERY_COMPLETE"), (FI_AFFINITY, "FI_AFFINITY"),
    (FI_COMMIT_COMPLETE, "FI_COMMIT_COMPLETE"), (FI_MATCH_COMPLETE, "FI_MATCH_COMPLETE"),
)

_ORDER = (
    (FI_ORDER_RAR, "FI_ORDER_RAR"), (FI_ORDER_RAW, "FI_ORDER_RAW"),
    (FI_ORDER_RAS, "FI_ORDER_RAS"), (FI_ORDER_WAR, "FI_ORDER_WAR"),
    (FI_ORDER_WAW, "FI_ORDER_WAW"), (FI_ORDER_WAS, "FI_ORDER_WAS"),
    (FI_ORDER_SAR, "FI_ORDER_SAR"), (FI_ORDER_SAW, "FI_ORDER_SAW"),
    (FI_ORDER_SAS, "FI_ORDER_SAS"), (FI_ORDER_DATA, "FI_ORDER_DATA"),
    (FI_ORDER_RMA_RAR, "FI_ORDER_RMA_RAR"), (FI_ORDER_RMA_RAW, "FI_ORDER_RMA_RAW"),
    (FI_ORDER_RMA_WAR, "FI_ORDER_RMA_WAR"), (FI_ORDER_RMA_WAW, "FI_ORDER_RMA_WAW"),
    (FI_ORDER_ATOMIC_RAR, "FI_ORDER_ATOMIC_RAR"),
    (FI_ORDER_ATOMIC_RAW, "FI_ORDER_ATOMIC_RAW"),
    (FI_ORDER_ATOMIC_WAR, "FI_ORDER_ATOMIC_WAR"),
    (FI_ORDER_ATOMIC_WAW, "FI_ORDER_ATOMIC_WAW"),
)

# mr_mode: bits 0 and 1 are the legacy FI_MR_BASIC / FI_MR_SCALABLE values.
_MR_MODE = (
    (FI_MR_BASIC, "FI_MR_BASIC"), (FI_MR_SCALABLE, "FI_MR_SCALABLE"),
    (FI_MR_LOCAL, "FI_MR_LOCAL"), (FI_MR_RAW, "FI_MR_RAW"),
    (FI_MR_VIRT_ADDR, "FI_MR_VIRT_ADDR"), (FI_MR_ALLOCATED, "FI_MR_ALLOCATED"),
    (FI_MR_PROV_KEY, "FI_MR_PROV_KEY"), (FI_MR_MMU_NOTIFY, "FI_MR_MMU_NOTIFY"),
    (FI_MR_RMA_EVENT, "FI_MR_RMA_EVENT"), (FI_MR_ENDPOINT, "FI_MR_ENDPOINT"),
    (FI_MR_HMEM, "FI_MR_HMEM"), (FI_MR_COLLECTIVE, "FI_MR_COLLECTIVE"),
)

_PROGRESS = {FI_PROGRESS_UNSPEC: "FI_PROGRESS_UNSPEC", FI_PROGRESS_AUTO: "FI_PROGRESS_AUTO",
             FI_PROGRESS_MANUAL: "FI_PROGRESS_MANUAL"}

_THREADING = {FI_THREAD_UNSPEC: "FI_THREAD_UNSPEC", FI_THREAD_SAFE: "FI_THREAD_SAFE",
              FI_THREAD_FID: "FI_THREAD_FID", FI_THREAD_DOMAIN: "FI_THREAD_DOMAIN",
              FI_THREAD_COMPLETION: "FI_THREAD_COMPLETION",
              FI_THREAD_ENDPOINT: "FI_THREAD_ENDPOINT"}

_AV_TYPE = {FI_AV_UNSPEC: "FI_AV_UNSPEC", FI_AV_MAP: "FI_AV_MAP", FI_AV_TABLE: "FI_AV_TABLE"}

_ADDR_FORMAT = {
    FI_FORMAT_UNSPEC: "FI_FORMAT_UNSPEC", FI_SOCKADDR: "FI_SOCKADDR",
    FI_SOCKADDR_IN: "FI_SOCKADDR_IN", FI_SOCKADDR_IN6: "FI_SOCKADDR_IN6",
    FI_SOCKADDR_IB: "FI_SOCKADDR_IB", FI_ADDR_PSMX: "FI_ADDR_PSMX",
    FI_ADDR_GNI: "FI_ADDR_GNI", FI_ADDR_BGQ: "FI_ADDR_BGQ", FI_ADDR_MLX: "FI_ADDR_MLX",
    FI_ADDR_STR: "FI_ADDR_STR", FI_ADDR_PSMX2: "FI_ADDR_PSMX2",
    FI_ADDR_IB_UD: "FI_ADDR_IB_UD", FI_ADDR_EFA: "FI_ADDR_EFA",
    FI_ADDR_PSMX3: "FI_ADDR_PSMX3", FI_ADDR_OPX: "FI_ADDR_OPX", FI_ADDR_CXI: "FI_ADDR_CXI",
}


def _flag_names(uint64_t value, table):
    names = []
    for bit, name in table:
        if value & bit:
            names.append(name)
            value &= ~<uint64_t>bit
    if value:
        names.append(hex(value))
    return names


cdef str _str(const char* s):
    return None if s == NULL else s.decode("utf-8", "replace")


# ---------------------------------------------------------------------------
# fi_getinfo
# ---------------------------------------------------------------------------
cdef uint32_t _api_version(api_version) except 0:
    if api_version is None:
        return FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION)
    try:
        major, minor = api_version
    except (TypeError, ValueError):
        raise TypeError(f"api_version must be a (major, minor) tuple such as (1, 17), "
                        f"not {api_version!r}") from None
    if not (0 <= major < 1 << 16 and 0 <= minor < 1 << 16) or (major, minor) == (0, 0):
        raise ArgumentError(f"api_version {api_version!r} is out of range: "
                            f"major and minor are 16-bit, not both zero")
    return FI_VERSION(major, minor)


cdef fi_info* _hints(uint64_t caps, prov_name) except NULL:
    """RDM endpoint hints for *caps*, with the modes gexmk accepts; freed by
    fi_freeinfo (which also frees the strdup'ed provider name)."""
    cdef bytes name
    cdef fi_info* hints
    if prov_name is not None:
        if not isinstance(prov_name, str):
            raise TypeError(f"prov_name must be a str such as 'tcp' or 'shm', "
                            f"not {type(prov_name).__name__}")
        name = prov_name.encode()
    with nogil:
        hints = fi_allocinfo()
    if hints == NULL:
        raise MemoryError("fi_allocinfo")
    hints.caps = caps
    hints.mode = ACCEPTED_MODE
    hints.ep_attr.type = FI_EP_RDM
    hints.domain_attr.mr_mode = ACCEPTED_MR_MODE
    if prov_name is not None:
        hints.fabric_attr.prov_name = strdup(name)
        if hints.fabric_attr.prov_name == NULL:
            with nogil:
                fi_freeinfo(hints)
            raise MemoryError("strdup")
    return hints


cdef fi_info* _getinfo(uint32_t version, fi_info* hints) except? NULL:
    """fi_getinfo; NULL when nothing matches (-FI_ENODATA), OFIError otherwise."""
    cdef fi_info* info = NULL
    cdef int rc
    with nogil:
        rc = fi_getinfo(version, NULL, NULL, 0, hints, &info)
        if rc != -FI_ENODATA:
            check("fi_getinfo", rc)
    return info


cdef dict _describe(const fi_info* p):
    cdef const fi_domain_attr* d = p.domain_attr
    cdef const fi_fabric_attr* f = p.fabric_attr
    cdef const fi_pci_attr* pci
    out = {
        "provider": _str(f.prov_name),
        "fabric": _str(f.name),
        "domain": _str(d.name),
        "prov_version": f"{FI_MAJOR(f.prov_version)}.{FI_MINOR(f.prov_version)}",
        "addr_format": _ADDR_FORMAT.get(p.addr_format, str(p.addr_format)),
        "caps": _flag_names(p.caps, _CAPS),
        "mode": _flag_names(p.mode, _MODE),
        "mr_mode": _flag_names(<unsigned int>d.mr_mode, _MR_MODE),
        "mr_key_size": d.mr_key_size,
        "mr_iov_limit": d.mr_iov_limit,
        "threading": _THREADING.get(d.threading, str(d.threading)),
        "data_progress": _PROGRESS.get(d.data_progress, str(d.data_progress)),
        "control_progress": _PROGRESS.get(d.control_progress, str(d.control_progress)),
        "av_type": _AV_TYPE.get(d.av_type, str(d.av_type)),
        "cq_data_size": d.cq_data_size,
        "max_msg_size": p.ep_attr.max_msg_size if p.ep_attr != NULL else None,
        "inject_size": p.tx_attr.inject_size if p.tx_attr != NULL else None,
        "tx_size": p.tx_attr.size if p.tx_attr != NULL else None,
        "rx_size": p.rx_attr.size if p.rx_attr != NULL else None,
        "rma_iov_limit": p.tx_attr.rma_iov_limit if p.tx_attr != NULL else None,
        "tx_op_flags": _flag_names(p.tx_attr.op_flags, _OP_FLAGS) if p.tx_attr != NULL else [],
        "msg_order": _flag_names(p.tx_attr.msg_order, _ORDER) if p.tx_attr != NULL else [],
        "nic": None,
    }
    if p.nic != NULL and p.nic.device_attr != NULL:
        nic = {"name": _str(p.nic.device_attr.name),
               "driver": _str(p.nic.device_attr.driver),
               "vendor_id": _str(p.nic.device_attr.vendor_id),
               "device_id": _str(p.nic.device_attr.device_id)}
        if p.nic.link_attr != NULL:
            nic["link_speed"] = p.nic.link_attr.speed
            nic["mtu"] = p.nic.link_attr.mtu
        if p.nic.bus_attr != NULL and p.nic.bus_attr.bus_type == FI_BUS_PCI:
            pci = &p.nic.bus_attr.attr.pci
            nic["pci"] = (f"{pci.domain_id:04x}:{pci.bus_id:02x}:"
                          f"{pci.device_id:02x}.{pci.function_id:x}")
        out["nic"] = nic
    return out


cdef list _query(uint64_t caps, prov_name, uint32_t version):
    """Describe every RDM fi_info offering *caps*; [] when none does."""
    cdef fi_info* hints = _hints(caps, prov_name)
    cdef fi_info* info = NULL
    cdef fi_info* p
    try:
        info = _getinfo(version, hints)
        out = []
        p = info
        while p != NULL:
            out.append(_describe(p))
            p = p.next
        return out
    finally:
        with nogil:
            if info != NULL:
                fi_freeinfo(info)
            fi_freeinfo(hints)


def _key(entry):
    # Which endpoint variant an entry is.  caps and ordering echo the hints,
    # so they cannot tell; mr_mode and inject_size do: shm offers one
    # endpoint with FI_ATOMIC (inject 4096) and another with FI_HMEM
    # (FI_MR_HMEM, inject 0).
    return (entry["provider"], entry["fabric"], entry["domain"], entry["addr_format"],
            tuple(entry["mr_mode"]), entry["inject_size"])


def providers(prov_name=None, *, api_version=None) -> list:
    """Providers that offer reliable-datagram (``FI_EP_RDM``) endpoints with
    ``FI_RMA``, as gexmk's transport would ask for them.

    *prov_name* restricts the query to one provider (``"tcp"``, ``"shm"``,
    ``"tcp;ofi_rxm"``...); *api_version* is the ``(major, minor)`` libfabric
    API to request (default: the headers', :data:`HEADER_VERSION`).

    Returns one dict per distinct ``fi_info`` (a provider appears once per
    fabric/domain/address format), with ``provider``, ``fabric``, ``domain``,
    ``caps``, ``mode`` and ``mr_mode`` (lists of flag names),
    ``data_progress``/``control_progress``, ``threading``, ``inject_size`` and
    ``max_msg_size`` (bytes), queue sizes, and two booleans: ``atomic``
    (the same endpoint type is also offered with ``FI_ATOMIC``) and
    ``hmem_caps`` (offered with ``FI_HMEM`` -- a claim only: see
    :func:`hmem_cuda_registration`).  An unknown provider gives ``[]``; any
    other failure raises :class:`gexmk.errors.OFIError`.
    """
    cdef uint32_t version = _api_version(api_version)
    entries = _query(FI_RMA, prov_name, version)
    if not entries:
        return []
    atomic = {_key(e) for e in _query(FI_RMA | FI_ATOMIC, prov_name, version)}
    hmem = {_key(e) for e in _query(FI_RMA | FI_HMEM, prov_name, version)}
    out, seen = [], set()
    for e in entries:
        e["atomic"] = _key(e) in atomic
        e["hmem_caps"] = _key(e) in hmem
        ident = repr(sorted(e.items()))
        if ident not in seen:       # providers repeat identical entries
            seen.add(ident)
            out.append(e)
    return out


# ---------------------------------------------------------------------------
# FI_HMEM_CUDA registration
# ---------------------------------------------------------------------------
def hmem_cuda_registration(prov_name, ptr=None, size_t nbytes=0, int device=0) -> dict:
    """Whether provider *prov_name* can register CUDA memory, found by trying.

    Capability bits are not evidence (Debian's libfabric lists ``FI_HMEM``
    for shm yet is built without CUDA), so this opens a fabric and domain for
    an RDM endpoint with ``FI_RMA | FI_HMEM`` and calls ``fi_mr_regattr`` with
    ``iface = FI_HMEM_CUDA``.  Pass a CUDA device pointer *ptr* (an int) of
    *nbytes* bytes on CUDA device ordinal *device* for a definite answer; the
    pointer stays owned by the caller and is unregistered before returning.
    Without one, a page of host memory is registered under the CUDA iface,
    which tells a libfabric without CUDA support (``-FI_ENOSYS``) apart.

    Never raises for a provider's refusal: returns a dict with ``provider``,
    ``supported`` (True, False, or None when a host-pointer probe cannot
    decide), ``reason`` (a sentence), ``tested_with`` (``"device pointer"``
    or ``"host pointer"``), ``call`` and ``code`` of the deciding call
    (``code`` is a positive libfabric error number or 0), and ``mr_mode``.
    """
    cdef fi_info* hints = NULL
    cdef fi_info* info = NULL
    cdef fid_fabric* fabric = NULL
    cdef fid_domain* domain = NULL
    cdef fid_mr* mr = NULL
    cdef void* host = NULL
    cdef iovec iov
    cdef fi_mr_attr attr
    cdef int rc = 0

    # Arguments first: nothing is allocated until they are all good.
    on_device = ptr is not None
    if on_device:
        if nbytes == 0:
            raise ArgumentError("nbytes must be the size in bytes of the device buffer at ptr, "
                                "not 0")
        iov.iov_base = <void*><uintptr_t>ptr
        iov.iov_len = nbytes
    hints = _hints(FI_RMA | FI_HMEM, prov_name)
    result = {"provider": prov_name, "supported": False, "reason": "",
              "tested_with": "device pointer" if on_device else "host pointer",
              "call": None, "code": 0, "mr_mode": []}
    try:
        try:
            info = _getinfo(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), hints)
        except OFIError as e:
            result.update(call=e.call, code=e.code,
                          reason=f"fi_getinfo(FI_RMA|FI_HMEM) failed: {strerror(e.code)}")
            return result
        if info == NULL:
            result.update(call="fi_getinfo", code=FI_ENODATA,
                          reason=f"{prov_name} offers no RDM endpoint with FI_RMA|FI_HMEM "
                                 f"({strerror(FI_ENODATA)})")
            return result
        result["provider"] = _str(info.fabric_attr.prov_name)
        result["mr_mode"] = _flag_names(<unsigned int>info.domain_attr.mr_mode, _MR_MODE)

        with nogil:
            rc = fi_fabric(info.fabric_attr, &fabric, NULL)
        if rc < 0:
            result.update(call="fi_fabric", code=-rc,
                          reason=f"fi_fabric failed: {strerror(rc)}")
            return result
        with nogil:
            rc = fi_domain(fabric, info, &domain, NULL)
        if rc < 0:
            result.update(call="fi_domain", code=-rc,
                          reason=f"fi_domain failed: {strerror(rc)}")
            return result

        if not on_device:
            if posix_memalign(&host, _PROBE_BYTES, _PROBE_BYTES) != 0:
                raise MemoryError("posix_memalign")
            memset(host, 0, _PROBE_BYTES)
            iov.iov_base = host
            iov.iov_len = _PROBE_BYTES
        memset(&attr, 0, sizeof(attr))
        attr.mr_iov = &iov
        attr.iov_count = 1
        attr.access = FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE
        attr.iface = FI_HMEM_CUDA
        attr.device.cuda = device
        with nogil:
            rc = fi_mr_regattr(domain, &attr, 0, &mr)
        result.update(call="fi_mr_regattr", code=-rc if rc < 0 else 0)

        if rc == 0:
            result["supported"] = True
            result["reason"] = ("fi_mr_regattr registered "
                                + ("the device buffer" if on_device else
                                   "a host buffer (the CUDA iface is enabled in this libfabric)")
                                + " with iface=FI_HMEM_CUDA")
        elif rc == -FI_ENOSYS or rc == -FI_EOPNOTSUPP:
            result["reason"] = (f"fi_mr_regattr with iface=FI_HMEM_CUDA failed: "
                                f"{strerror(rc)}; this libfabric has no CUDA support for "
                                f"{result['provider']} (use the staged path)")
        elif on_device:
            result["reason"] = (f"fi_mr_regattr of the device buffer with iface=FI_HMEM_CUDA "
                                f"failed: {strerror(rc)}")
        else:
            result["supported"] = None
            result["reason"] = (f"fi_mr_regattr of a host buffer with iface=FI_HMEM_CUDA "
                                f"failed ({strerror(rc)}); only a device pointer can decide")
        return result
    finally:
        _close(<fid*>mr, "mr")
        _close(<fid*>domain, "domain")
        _close(<fid*>fabric, "fabric")
        with nogil:
            if info != NULL:
                fi_freeinfo(info)
            fi_freeinfo(hints)
            free(host)


# ---------------------------------------------------------------------------
# Version
# ---------------------------------------------------------------------------
def version() -> str:
    """The ``"major.minor"`` version of the libfabric loaded at run time
    (``fi_version()``); compare :data:`HEADER_VERSION`, the build's."""
    cdef uint32_t v
    with nogil:
        v = fi_version()
    return f"{FI_MAJOR(v)}.{FI_MINOR(v)}"
