# ---------------------------------------------------------------------------
# Device segments the provider registers itself (issue 9): the native path
# "ofi-hmem".
#
# Where the provider offers FI_HMEM, the Domain opens with it (and with
# FI_MR_HMEM, which makes local device buffers name their registration), and
# a device segment bound to an endpoint is registered with fi_mr_regattr,
# iface = FI_HMEM_CUDA and the segment's device: peers' puts and gets then
# land in device memory with no copy by the owner, and local buffers inside
# the segment go to the network with its descriptor.  Whether the provider
# can is learnt from that registration, not from the caps bit (Debian's
# libfabric 1.17 lists FI_HMEM on shm yet has no CUDA support): a refused
# registration leaves the segment on the staged path (staged.pxi), so the
# path query says "ofi-staged" and nothing fails.
#
# A natively registered device segment still gets a landing zone, registered
# apart (ofi_ep.zone_mr): atomics on it are run by its owner's lander with the
# kind's device atomics, as on the staged path (issue 9: "across nodes
# executed by the target"; shm's and rxm's own atomics are CPU loops at the
# target, and whether a NIC's reach device memory is a per-provider question
# left for later), and its bounce slots carry local device buffers outside
# the segment.  Peers
# learn both registrations; put_signal to such a target is the data written
# natively (delivery complete), then the signal through the zone.
#
# Providers whose FI_HMEM copies device memory through host buffers of their
# own (shm's SAR protocol, tcp's sockets) are slower natively than the staged
# path's pipelined pinned bounces (shm, 8 MiB device puts on an H200: 1.37-1.60
# GB/s native against 3.85-4.35 staged, issue 21): under GEXMK_OFI_HMEM=auto
# their device segments stay staged, and the endpoint's hmem_note says why;
# GEXMK_OFI_HMEM=native registers them all the same.
#
# GEXMK_OFI_HMEM=system (tests only) sends host segments through the same
# steps with iface = FI_HMEM_SYSTEM, so that a CPU-only machine exercises the
# hints, the registration, the publication and the path name over shm.
# ---------------------------------------------------------------------------
from libc.string cimport strcmp


cdef fi_info* _hmem_info(fi_info* hints, fi_info* p) except? NULL:
    """The provider and domain chosen (p) asked for again with the Domain's
    own hints plus FI_HMEM (and FI_MR_HMEM, which providers that tell device
    buffers apart by their descriptors require): that info when offered with
    p's atomics, else NULL (the domain opens as before, and every device
    segment is staged).  The hints, not p itself: p carries every capability
    the provider has without FI_HMEM (shm: FI_RMA_EVENT...), which its FI_HMEM
    entry may lack.  Debian's 1.17 shm, for one, offers FI_HMEM only without
    FI_ATOMIC: not taken (atomics on host segments would be lost)."""
    cdef fi_info* h = fi_dupinfo(hints)
    cdef fi_info* got = NULL
    cdef fi_info* q
    cdef fi_info* out = NULL
    cdef int rc, attempt
    if h == NULL:
        raise MemoryError()
    try:
        free(h.fabric_attr.prov_name)
        h.fabric_attr.prov_name = _strdup(p.fabric_attr.prov_name)
        if p.domain_attr.name != NULL:
            free(h.domain_attr.name)
            h.domain_attr.name = _strdup(p.domain_attr.name)
        h.caps = (p.caps & FI_ATOMIC) | (hints.caps & ~(<uint64_t>FI_ATOMIC)) | FI_HMEM
        for attempt in range(2):
            h.domain_attr.mr_mode = hints.domain_attr.mr_mode | (FI_MR_HMEM if attempt == 0 else 0)
            with nogil:
                rc = fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, h, &got)
            q = got if rc == 0 else NULL
            while q != NULL:
                if (q.caps & FI_HMEM) and (q.caps & h.caps) == h.caps \
                        and strcmp(q.fabric_attr.prov_name, p.fabric_attr.prov_name) == 0 \
                        and (p.domain_attr.name == NULL or (q.domain_attr.name != NULL and
                             strcmp(q.domain_attr.name, p.domain_attr.name) == 0)):
                    out = fi_dupinfo(q)
                    if out == NULL:
                        raise MemoryError()
                    return out
                q = q.next
            if got != NULL:
                fi_freeinfo(got)
                got = NULL
    finally:
        if got != NULL:
            fi_freeinfo(got)
        fi_freeinfo(h)
    return NULL


# core providers (the last of a "tcp;ofi_rxm" stack) that copy device memory through host memory
_HMEM_VIA_HOST = ("shm", "tcp", "udp", "sockets", "net")


cdef object _hmem_register(OfiEndpoint oe, Segment seg):
    """Register seg with FI_HMEM for oe: (key, base) or a sentence saying why
    not (then nothing was registered)."""
    cdef ofi_ep* e = &oe.e
    cdef ofi_dom* d = e.dom
    cdef fid_mr* mr = NULL
    cdef fi_mr_attr attr
    cdef iovec iov
    cdef int rc
    cdef uint64_t key = 0
    if d.hmem_want == HMEM_OFF:
        return "GEXMK_OFI_HMEM=off"
    if d.hmem_want == HMEM_AUTO and seg.kind.cls != GX_MK_HOST and \
            oe.domain.provider.split(";")[0] in _HMEM_VIA_HOST:
        return (f"{oe.domain.provider} copies device memory through host memory itself: the "
                "staged path is faster (GEXMK_OFI_HMEM=native registers it natively all the same)")
    if not d.hmem:
        return "the provider does not offer FI_HMEM (with the atomics it offers without)"
    if seg.kind.cls == GX_MK_HOST:
        if d.hmem_want != HMEM_SYSTEM:
            return "host segment"
    elif seg.kind.cls != GX_MK_CUDA_UVA:
        return "not a CUDA segment"
    if not (d.mr_mode & FI_MR_PROV_KEY):
        key = d.next_key
        d.next_key += 1
    memset(&attr, 0, sizeof(attr))
    iov.iov_base = <void*>seg.addr
    iov.iov_len = seg.size
    attr.mr_iov = &iov
    attr.iov_count = 1
    attr.access = FI_REMOTE_READ | FI_REMOTE_WRITE | FI_READ | FI_WRITE
    attr.requested_key = key
    if seg.kind.cls == GX_MK_HOST:
        attr.iface = FI_HMEM_SYSTEM
    else:
        attr.iface = FI_HMEM_CUDA
        attr.device.cuda = seg.kind.device
    with nogil:
        rc = fi_mr_regattr(d.domain, &attr, 0, &mr)
    if rc != 0:
        return f"fi_mr_regattr refused it: {fi_strerror(-rc).decode()} ({rc})"
    if d.mr_mode & FI_MR_ENDPOINT:
        rc = fi_mr_bind(mr, &e.ep.fid, 0)
        if rc == 0:
            rc = fi_mr_enable(mr)
        if rc != 0:
            fi_close(&mr.fid)
            return f"fi_mr_bind/enable refused it: {fi_strerror(-rc).decode()} ({rc})"
    oe._close_mr()
    e.seg_mr = mr
    e.seg_desc = fi_mr_desc(mr)
    e.seg_lo = <uintptr_t>seg.addr
    e.seg_hi = <uintptr_t>seg.addr + seg.size
    base = e.seg_lo if (d.mr_mode & FI_MR_VIRT_ADDR) else 0
    if d.mr_mode & FI_MR_RAW:
        return oe._raw_key(mr, base), base
    return fi_mr_key(mr), base


cdef int _hmem_zone(OfiEndpoint oe, Segment seg) except -1:
    """The landing zone of a natively registered segment (its atomics, and
    bounce slots for local device buffers elsewhere), registered as zone_mr."""
    cdef ofi_ep* e = &oe.e
    cdef ofi_dom* d = e.dom
    cdef fid_mr* mr = NULL
    cdef uint64_t key = 0
    cdef ofi_zone* z
    _zone_open(e, seg, d.stg_nrings)
    z = e.zone
    try:
        if not (d.mr_mode & FI_MR_PROV_KEY):
            key = d.next_key
            d.next_key += 1
        with nogil:
            check("fi_mr_reg (landing zone)", fi_mr_reg(d.domain, z.mem, z.bytes,
                                                        FI_REMOTE_READ | FI_REMOTE_WRITE | FI_READ
                                                        | FI_WRITE, 0, key, 0, &mr, NULL))
        if d.mr_mode & FI_MR_ENDPOINT:
            try:
                check("fi_mr_bind", fi_mr_bind(mr, &e.ep.fid, 0))
                check("fi_mr_enable", fi_mr_enable(mr))
            except BaseException:
                fi_close(&mr.fid)
                raise
        e.zone_mr = mr
        e.zone_desc = fi_mr_desc(mr)
        e.zone_lo = <uintptr_t>z.mem
        e.zone_hi = <uintptr_t>z.mem + z.bytes
        _zone_serve(e)
    except BaseException:
        _hmem_zone_close(e)
        raise
    return 0


cdef object _hmem_zone_blob(OfiEndpoint oe):
    """What peers need of the zone: (key, base, slots, chunk, ring bytes, atomics,
    doorbell offsets)."""
    cdef ofi_ep* e = &oe.e
    cdef ofi_zone* z = e.zone
    base = e.zone_lo if (e.dom.mr_mode & FI_MR_VIRT_ADDR) else 0
    key = oe._raw_key(e.zone_mr, base) if (e.dom.mr_mode & FI_MR_RAW) else fi_mr_key(e.zone_mr)
    return (key, base, z.slots, z.chunk, z.ring_bytes, bool(z.amo), z.bell_off, z.bell2_off,
            z.closed_off)


cdef void _hmem_zone_close(ofi_ep* e) noexcept nogil:
    """Undo _hmem_zone (and forget the native registration's flag)."""
    if e.zone_mr != NULL:
        fi_close(&e.zone_mr.fid)
        e.zone_mr = NULL
        e.zone_desc = NULL
        e.zone_lo = e.zone_hi = 0
    e.hmem = 0
    _zone_close(e)
