# ---- what ordering a provider grants (the Domain asks at open) --------------------
#
# An ordered provider lets the collectives signal a round by a store and
# put_signal send its data and signal back to back; these ask libfabric for
# the ordering classes gexmk uses, with and without FI_ATOMIC (tcp;ofi_rxm
# grants RMA write ordering only on an endpoint without atomics).

cdef fi_info* _with_ordering(fi_info* p) except NULL:
    """The chosen provider and domain again, asking for read-after-write
    ordering of data (providers report only the ordering that was asked for),
    with write-after-write ordering if that is granted too: that info when
    granted, else a copy of p."""
    cdef fi_info* hints = fi_dupinfo(p)
    cdef fi_info* got = NULL
    cdef fi_info* out
    cdef int rc
    if hints == NULL:
        raise MemoryError()
    cdef int attempt
    # first with write-after-write ordering of RMA and atomics too (put_signal
    # then needs no round trip), then without
    for attempt in range(2):
        hints.tx_attr.msg_order = FI_ORDER_RAW | FI_ORDER_RMA_RAW
        hints.ep_attr.max_order_raw_size = <size_t>-1
        if attempt == 0:
            hints.tx_attr.msg_order |= FI_ORDER_WAW
            hints.ep_attr.max_order_waw_size = <size_t>-1
        else:
            hints.ep_attr.max_order_waw_size = 0
        with nogil:
            rc = fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &got)
        if rc == 0 and got != NULL and (got.tx_attr.msg_order & (FI_ORDER_RAW | FI_ORDER_RMA_RAW)) \
                and got.ep_attr.max_order_raw_size > 0:
            break
        if got != NULL:
            fi_freeinfo(got)
            got = NULL
    fi_freeinfo(hints)
    if got != NULL:
        out = fi_dupinfo(got)
        fi_freeinfo(got)
    else:
        out = fi_dupinfo(p)
    if out == NULL:
        raise MemoryError()
    return out


cdef bint _raw_ordered(fi_info* p) noexcept nogil:
    """Does p order the data of a read after that of earlier writes?"""
    return (p.tx_attr.msg_order & (FI_ORDER_RAW | FI_ORDER_RMA_RAW)) != 0 \
        and p.ep_attr.max_order_raw_size > 0


cdef fi_info* _ordered_without_atomics(fi_info* p) except? NULL:
    """The chosen provider and domain without FI_ATOMIC, asking for
    read-after-write ordering -- first with messages ordered after writes
    too (put_signal's signal messages, signal.pxi), then without: that info
    when granted, else NULL."""
    cdef fi_info* hints = fi_dupinfo(p)
    cdef fi_info* got = NULL
    cdef fi_info* out = NULL
    cdef int rc, attempt
    if hints == NULL:
        raise MemoryError()
    hints.caps &= ~FI_ATOMIC
    hints.tx_attr.caps &= ~FI_ATOMIC
    hints.rx_attr.caps &= ~FI_ATOMIC
    hints.ep_attr.max_order_raw_size = <size_t>-1
    for attempt in range(2):
        hints.tx_attr.msg_order = FI_ORDER_RAW | FI_ORDER_RMA_RAW
        if attempt == 0:
            hints.caps |= FI_MSG
            hints.tx_attr.msg_order |= FI_ORDER_SAW | FI_ORDER_RAS
            hints.ep_attr.max_order_waw_size = <size_t>-1
        else:
            hints.caps &= ~FI_MSG
            hints.tx_attr.caps &= ~FI_MSG
            hints.rx_attr.caps &= ~FI_MSG
            hints.ep_attr.max_order_waw_size = 0
        with nogil:
            rc = fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &got)
        if rc == 0 and got != NULL and _raw_ordered(got):
            break
        if got != NULL:
            fi_freeinfo(got)
            got = NULL
    fi_freeinfo(hints)
    if got != NULL:
        out = fi_dupinfo(got)
        fi_freeinfo(got)
        if out == NULL:
            raise MemoryError()
    return out
