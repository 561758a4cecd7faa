"""Every ``GEXMK_*`` setting, parsed and validated in one place.

``load()`` reads the environment once per call (``gexmk.init`` calls it once)
and returns a frozen :class:`Config`; a bad value raises
:class:`~gexmk.errors.ArgumentError` naming the variable, the value and what
is allowed, before anything is allocated.  The launcher's own variables
(``GEXMK_RANK``, ``GEXMK_SIZE``, ``GEXMK_BOOTSTRAP``, ``GEXMK_BOOTSTRAP_TOKEN``)
belong to :mod:`gexmk.bootstrap`, which reads them itself.

Pure Python, standard library only: the launcher and the bootstrap import it
before (or without) the compiled core.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

from gexmk.errors import ArgumentError

__all__ = ["Config", "load", "timeout", "DEFAULT_TIMEOUT"]

#: Seconds a collective or a blocking wait gives a peer when GEXMK_TIMEOUT is not set.
DEFAULT_TIMEOUT = 300.0

#: GEXMK_OFI_RXM_MSG_RX's default (see Config.ofi_rxm_msg_rx)
RXM_MSG_RX_DEFAULT = 128

_TRANSPORTS = ("auto", "self", "nbrhd", "pvm", "ofi")
_PROGRESS = {"auto": "auto", "1": "on", "on": "on", "yes": "on", "0": "off", "off": "off",
             "no": "off", "spin": "spin"}
_BOOL = {"1": True, "on": True, "yes": True, "0": False, "off": False, "no": False}


def _text(env, name):
    return env.get(name, "").strip()


def _number(env, name):
    """(text, value) of a number setting: value nan where the text is not one."""
    text = _text(env, name)
    try:
        return text, float(text) if text else math.nan
    except ValueError:
        return text, math.nan


def timeout(env=None) -> float:
    """GEXMK_TIMEOUT in seconds (a positive, finite number; default 300)."""
    text, value = _number(os.environ if env is None else env, "GEXMK_TIMEOUT")
    if not text:
        return DEFAULT_TIMEOUT
    if not (value > 0 and math.isfinite(value)):
        raise ArgumentError(f"GEXMK_TIMEOUT={text!r}: expected a positive number of seconds")
    return value


def _choice(env, name, table, default):
    text = _text(env, name).lower()
    if not text:
        return default
    if text not in table:
        raise ArgumentError(f"{name}={text!r}: expected one of {', '.join(sorted(set(table)))}")
    return table[text]


@dataclass(frozen=True)
class Config:
    """The validated settings of one ``gexmk.init``."""

    #: GEXMK_TRANSPORT: ``auto``, or the path every cross-process target must take
    #: where it can (``pvm``: process_vm between processes of a node; ``ofi``: the
    #: network for every cross-process target; ``nbrhd``/``self``: the defaults).
    transport: str = "auto"
    #: GEXMK_TIMEOUT: seconds a collective or blocking wait gives a peer.
    timeout: float = DEFAULT_TIMEOUT
    #: GEXMK_PROGRESS_THREAD: ``auto``, ``on``, ``off`` or ``spin``.
    progress_thread: str = "auto"
    #: GEXMK_OFI_PROVIDER / GEXMK_OFI_IFACE: libfabric provider and domain (None: choose).
    ofi_provider: str | None = None
    ofi_iface: str | None = None
    #: GEXMK_OFI_SPLIT: RMA and atomics on separate libfabric endpoints where that keeps ordering.
    ofi_split: bool = True
    #: GEXMK_OFI_ORDERED_FLUSH: implicit puts complete by a read-after-write flush where ordered.
    ofi_ordered_flush: bool = True
    #: GEXMK_OFI_ORDERED_SIGNAL: put_signal issues its data and its signal back to back
    #: where the provider orders RMA writes before atomics (FI_ORDER_WAW); 0: the data's
    #: delivery is waited for first (what providers without that ordering always get).
    ofi_ordered_signal: bool = True
    #: GEXMK_OFI_SIGNAL_DATA: where put_signal sends its signal as a message
    #: (split endpoints, tcp;ofi_rxm), a small signal rides on the data write
    #: itself as remote CQ data (one send instead of two); 0: always the message.
    ofi_signal_data: bool = True
    #: GEXMK_OFI_CONNECT: ``eager`` sets up network connections to peers at
    #: publication (the first operation costs what the rest do); ``lazy`` leaves
    #: each to the first operation between two endpoints.
    ofi_connect: str = "eager"
    #: GEXMK_OFI_CONNECT_MAX: the most peer processes an endpoint connects to
    #: eagerly (those nearest in job rank, both ways, first); the rest connect
    #: on first use, so a large job never opens a connection per job rank up
    #: front.  0: none (as ``lazy``).
    ofi_connect_max: int = 32
    #: GEXMK_OFI_MAX_PEERS: the most peer processes this process holds network
    #: connections with (connection-oriented providers: tcp;ofi_rxm, verbs;ofi_rxm).
    #: Beyond it the least recently used peer's connections are closed, both
    #: ends agreeing through the bootstrap, and set up again on its next use
    #: (ofi.src/conncap.pxi).  0: no cap.
    ofi_max_peers: int = 256
    #: GEXMK_OFI_STAGE: ``auto`` (default): device segments are reached over the
    #: network through a landing zone of pinned host memory that the owner's
    #: lander thread copies in and out of (path ``ofi-staged``); ``all``: host
    #: segments too (to test that path without a GPU).
    ofi_stage: str = "auto"
    #: GEXMK_OFI_HMEM: ``auto`` (default): the domain asks for FI_HMEM where the
    #: provider offers it, and a device segment the provider registers
    #: (fi_mr_regattr, FI_HMEM_CUDA) is reached natively (path ``ofi-hmem``),
    #: others through their landing zone (``ofi-staged``) -- except over
    #: providers that copy device memory through host memory themselves (shm,
    #: tcp, udp, sockets), where the staged path is faster; ``native``: register
    #: natively wherever the provider accepts it (measurements); ``off``: never
    #: asked, always staged; ``system`` (tests only): host segments are
    #: registered the same way with FI_HMEM_SYSTEM, so that a CPU-only machine
    #: runs that path.
    ofi_hmem: str = "auto"
    #: GEXMK_OFI_STAGE_CHUNK / _SLOTS: bytes per landing slot and slots per
    #: initiator in each zone (the zone holds job size x slots x chunk bytes);
    #: bench/ofi_staged.py sweeps them.
    ofi_stage_chunk: int = 1 << 20
    ofi_stage_slots: int = 4
    #: GEXMK_OFI_RXM_BUFFER: bytes of each ofi_rxm bounce buffer (given to
    #: libfabric as FI_OFI_RXM_BUFFER_SIZE unless that is set; 0: rxm's own).
    ofi_rxm_buffer: int = 4096
    #: GEXMK_OFI_RXM_MSG_RX: receive buffers rxm posts per endpoint (its
    #: FI_OFI_RXM_MSG_RX_SIZE unless that is set; 0: rxm's own, 4096 with
    #: tcp's shared receive context, ~14 MB resident per rxm endpoint).
    ofi_rxm_msg_rx: int = 128
    #: GEXMK_OFI_RXM_RX: rxm's receive queue per endpoint (FI_OFI_RXM_RX_SIZE
    #: unless set; 0: rxm's 2048): gexmk posts 64 receives (put_signal's
    #: signal messages), two 0.5 MB queues at 2048.
    ofi_rxm_rx: int = 256
    #: GEXMK_NBRHD_STAGE: ``auto`` (default): a device segment that cannot be
    #: exported (stream-ordered pool memory) is reached by peers of its node
    #: through a landing zone of shared pinned host memory that the owner's
    #: lander thread copies in and out of (path ``nbrhd-landed``); ``all``: host
    #: segments too (to test that path without a GPU).
    nbrhd_stage: str = "auto"
    #: GEXMK_NBRHD_STAGE_CHUNK / _SLOTS: bytes per landing slot and slots per
    #: initiator of an ``nbrhd-landed`` zone (job size x slots x chunk bytes).
    nbrhd_stage_chunk: int = 4 << 20
    nbrhd_stage_slots: int = 4
    #: GEXMK_STAGED: ``allow`` (default) or ``refuse`` degraded paths that copy
    #: device memory through host bounce buffers; refused, a route whose only
    #: path is staged raises UnsupportedError naming it (``gexmk.init(staged=)``
    #: overrides the variable).
    staged: str = "allow"
    #: GEXMK_PAGEABLE_CHUNK / _BUFFERS / _MIN / _THREADS: copies of at least _MIN bytes
    #: between device memory and pageable host memory go through _BUFFERS pinned
    #: bounce buffers of _CHUNK bytes per endpoint (0 buffers: never), the CPU
    #: side split over _THREADS helper threads (0: the calling thread alone).
    #: Sizes take a K, M or G suffix.  (bench/cuda_pageable.py sweeps them.)
    pageable_chunk: int = 4 << 20
    pageable_buffers: int = 4
    pageable_min: int = 1 << 20
    pageable_threads: int = 3         # load(): PAGEABLE_THREADS_DEFAULT
    #: GEXMK_CUDA_SMALL_PUT: how tiny device copies are done: ``kernel`` (default,
    #: the fastest on an H100), ``copy`` (the copy engine only), or any of ``write_value`` (a put of 4 or 8 host bytes by
    #: cuStreamWriteValue32/64) and ``kernel`` (a device<->device copy of at most
    #: 8 bytes by a one-thread kernel), comma-separated; bench/cuda_nbrhd.py and
    #: bench/cuda_loopback.py measure each beside the others.
    cuda_small_put: str = "kernel"
    #: GEXMK_CUDA_PEER_ACCESS: ``auto`` (default: a peer's device segment is mapped
    #: for this process's own GPU when the driver allows, else host-staged) or
    #: ``off``: never map another GPU's memory for this GPU; device<->device copies
    #: between segments of different endpoints go through pinned host memory
    #: (paths ``nbrhd-staged`` / ``self-staged``; on one GPU too, to test them).
    cuda_peer_access: str = "auto"
    #: GEXMK_CUDA_STAGE_CHUNK: bytes per chunk of a host-staged device copy (default
    #: 4M, from a 1/2/4/8M sweep on two H200s; at most 16 slots of the pageable
    #: bounce buffers' total).
    cuda_stage_chunk: int = 4 << 20


#: Copy-pool helpers by default: 7 where the cores allow (H100 host, 16 cores,
#: bench/cuda_pageable.py 2026-11-26: 4 MiB x 4 buffers x 7 threads 39 GB/s put,
#: 4.6 x cuMemcpyHtoD from the same array; 3 threads 28 GB/s, and 17 at 8 MiB),
#: fewer on small machines (one core is the caller's).
PAGEABLE_THREADS_DEFAULT = max(1, min(7, (os.cpu_count() or 2) - 1))


def load(env=None) -> Config:
    """Parse and check every ``GEXMK_*`` setting of ``env`` (default ``os.environ``)."""
    env = os.environ if env is None else env
    transport = _text(env, "GEXMK_TRANSPORT").lower() or "auto"
    if transport not in _TRANSPORTS:
        raise ArgumentError(f"GEXMK_TRANSPORT={transport!r}: expected one of {', '.join(_TRANSPORTS)}")
    split = _text(env, "GEXMK_OFI_SPLIT")
    if split not in ("", "0", "1"):
        raise ArgumentError(f"GEXMK_OFI_SPLIT={split!r}: expected 0 or 1")
    return Config(
        transport=transport,
        timeout=timeout(env),
        progress_thread=_choice(env, "GEXMK_PROGRESS_THREAD", _PROGRESS, "auto"),
        ofi_provider=_text(env, "GEXMK_OFI_PROVIDER") or None,
        ofi_iface=_text(env, "GEXMK_OFI_IFACE") or None,
        ofi_split=split != "0",
        ofi_ordered_flush=_choice(env, "GEXMK_OFI_ORDERED_FLUSH", _BOOL, True),
        ofi_ordered_signal=_choice(env, "GEXMK_OFI_ORDERED_SIGNAL", _BOOL, True),
        ofi_signal_data=_choice(env, "GEXMK_OFI_SIGNAL_DATA", _BOOL, True),
        ofi_connect=_choice(env, "GEXMK_OFI_CONNECT", {"eager": "eager", "lazy": "lazy"}, "eager"),
        ofi_connect_max=_bytes(env, "GEXMK_OFI_CONNECT_MAX", 32, 0, 1 << 20, suffix=False),
        ofi_max_peers=_bytes(env, "GEXMK_OFI_MAX_PEERS", 256, 0, 1 << 24, suffix=False),
        ofi_stage=_choice(env, "GEXMK_OFI_STAGE", {"auto": "auto", "all": "all"}, "auto"),
        ofi_hmem=_choice(env, "GEXMK_OFI_HMEM", {"auto": "auto", "off": "off", "system": "system",
                                                 "native": "native"}, "auto"),
        ofi_stage_chunk=_bytes(env, "GEXMK_OFI_STAGE_CHUNK", 1 << 20, 4096, 1 << 30),
        ofi_stage_slots=_bytes(env, "GEXMK_OFI_STAGE_SLOTS", 4, 1, 16, suffix=False),
        ofi_rxm_buffer=_bytes(env, "GEXMK_OFI_RXM_BUFFER", 4096, 0, 1 << 24, suffix=False),
        ofi_rxm_msg_rx=_bytes(env, "GEXMK_OFI_RXM_MSG_RX", RXM_MSG_RX_DEFAULT, 0, 1 << 16,
                              suffix=False),
        ofi_rxm_rx=_bytes(env, "GEXMK_OFI_RXM_RX", 256, 0, 1 << 16, suffix=False),
        nbrhd_stage=_choice(env, "GEXMK_NBRHD_STAGE", {"auto": "auto", "all": "all"}, "auto"),
        nbrhd_stage_chunk=_bytes(env, "GEXMK_NBRHD_STAGE_CHUNK", 4 << 20, 4096, 1 << 30),
        nbrhd_stage_slots=_bytes(env, "GEXMK_NBRHD_STAGE_SLOTS", 4, 1, 16, suffix=False),
        staged=staged_option(_text(env, "GEXMK_STAGED"), "GEXMK_STAGED"),
        pageable_chunk=_bytes(env, "GEXMK_PAGEABLE_CHUNK", 4 << 20, 4096, 1 << 30),
        pageable_buffers=_bytes(env, "GEXMK_PAGEABLE_BUFFERS", 4, 0, 16, suffix=False),
        pageable_min=_bytes(env, "GEXMK_PAGEABLE_MIN", 1 << 20, 0, 1 << 62),
        pageable_threads=_bytes(env, "GEXMK_PAGEABLE_THREADS", PAGEABLE_THREADS_DEFAULT, 0, 64,
                                suffix=False),
        cuda_small_put=small_put_option(_text(env, "GEXMK_CUDA_SMALL_PUT") or "kernel",
                                        "GEXMK_CUDA_SMALL_PUT"),
        cuda_peer_access=_choice(env, "GEXMK_CUDA_PEER_ACCESS",
                                 {"auto": "auto", "off": "off", "0": "off", "1": "auto"}, "auto"),
        cuda_stage_chunk=_bytes(env, "GEXMK_CUDA_STAGE_CHUNK", 4 << 20, 4096, 1 << 30),
    )


_SMALL = ("write_value", "kernel")


def small_put_option(text, name="small put") -> str:
    """``copy``, or a comma-separated subset of write_value and kernel, in a
    fixed order (``write_value,kernel``); empty text means ``copy``."""
    words = {w.strip().lower() for w in text.split(",") if w.strip()}
    if not words or words == {"copy"}:
        return "copy"
    if not words <= set(_SMALL):
        raise ArgumentError(f"{name}={text!r}: expected copy, or write_value and/or kernel "
                            "(comma-separated)")
    return ",".join(w for w in _SMALL if w in words)


_SUFFIX = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def env_int(name, default, lo, hi):
    """An integer setting of the process environment in [lo, hi] (modules that
    read theirs once, at import); a bad value raises ArgumentError naming it."""
    return _bytes(os.environ, name, default, lo, hi, suffix=False)


def env_seconds(name, default):
    """A duration setting of the process environment in seconds (0 or more,
    finite; 0 usually means never); a bad value raises ArgumentError naming it."""
    text, value = _number(os.environ, name)
    if not text:
        return default
    if not (0 <= value < 1e9):
        raise ArgumentError(f"{name}={text!r}: expected a number of seconds, 0 or more "
                            "(0: never)")
    return value


def _bytes(env, name, default, lo, hi, suffix=True):
    """An integer setting in [lo, hi] (with suffix: K, M or G multiply)."""
    text = _text(env, name).lower()
    if not text:
        return default
    mult = 1
    if suffix and text[-1:] in _SUFFIX:
        mult, text = _SUFFIX[text[-1]], text[:-1].strip()
    try:
        value = int(text) * mult
    except ValueError:
        value = None
    if value is None or not lo <= value <= hi:
        unit = " (K, M or G suffix allowed)" if suffix else ""
        raise ArgumentError(f"{name}={_text(env, name)!r}: expected an integer from {lo} to {hi}{unit}")
    return value


_STAGED = {"allow": "allow", "refuse": "refuse", "1": "allow", "0": "refuse", "yes": "allow",
           "no": "refuse", "on": "allow", "off": "refuse"}


def staged_option(value, name="staged") -> str:
    """``allow`` or ``refuse`` from GEXMK_STAGED's text or ``init(staged=)``
    (also a bool: True allows); empty text means ``allow``."""
    if isinstance(value, bool):
        return "allow" if value else "refuse"
    if not isinstance(value, str):
        raise ArgumentError(f"{name}: expected 'allow' or 'refuse', got {type(value).__name__}")
    text = value.strip().lower()
    if not text:
        return "allow"
    if text not in _STAGED:
        raise ArgumentError(f"{name}={value!r}: expected allow or refuse (staged paths copy device memory "
                            "through host bounce buffers)")
    return _STAGED[text]
