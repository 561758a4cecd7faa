"""Sizes and the batch timing every figure of ``python -m gexmk.bench`` uses."""
from __future__ import annotations

import gc
import statistics
import time

from gexmk.bench.common import _UNITS


# ---- sizes -----------------------------------------------------------------------------

def parse_size(text: str) -> int:
    """``"8"``, ``"4K"``, ``"4M"``, ``"1MiB"`` -> bytes (binary units)."""
    t = text.strip().upper()
    num = t.rstrip("BKMGI")
    unit = t[len(num):]
    if not num.isdigit() or unit not in _UNITS:
        raise ValueError(f"size {text!r}: expected a number of bytes with an optional K, M or G suffix")
    return int(num) * _UNITS[unit]


def parse_sizes(spec: str) -> list:
    """``"MIN:MAX[:FACTOR]"`` (powers of FACTOR, default 4, from MIN; MAX is always
    included) or a comma list ``"8,4K,4M"`` -> sorted list of byte counts."""
    if ":" in spec:
        parts = spec.split(":")
        if len(parts) not in (2, 3):
            raise ValueError(f"--sizes {spec!r}: expected MIN:MAX or MIN:MAX:FACTOR")
        lo, hi = parse_size(parts[0]), parse_size(parts[1])
        factor = int(parts[2]) if len(parts) == 3 else 4
        if lo < 1 or hi < lo or factor < 2:
            raise ValueError(f"--sizes {spec!r}: need 1 <= MIN <= MAX and FACTOR >= 2")
        out, s = [], lo
        while s < hi:
            out.append(s)
            s *= factor
        out.append(hi)
        return out
    out = sorted({parse_size(p) for p in spec.split(",") if p.strip()})
    if not out or out[0] < 1:
        raise ValueError(f"--sizes {spec!r}: sizes must be at least 1 byte")
    return out


def fmt_size(n: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


# ---- timing ----------------------------------------------------------------------------

def _time_batch(fn, post, k):
    t0 = time.perf_counter_ns()
    fn(k)
    t1 = time.perf_counter_ns()
    if post is not None:
        post()
    return t1 - t0


def measure(cases: dict, iters: int = 300, batch_ns: float = 200e3, max_seconds: float = 3.0) -> dict:
    """Time each case of ``cases`` (name -> ``fn(k)`` running k operations, or
    ``(fn, post)`` where ``post()`` runs untimed after each batch).

    Each case gets a batch size ``k`` calibrated so that one batch lasts about
    ``batch_ns``; then ``iters`` rounds time one batch of every case in turn
    (interleaved), fewer when a case would take longer than ``max_seconds``
    (at least 5 rounds).  Returns name -> dict with ``median_ns``, ``min_ns``,
    ``p90_ns`` (per operation), ``batch`` and ``rounds``.
    """
    norm = {n: (c if isinstance(c, tuple) else (c, None)) for n, c in cases.items()}
    enabled = gc.isenabled()
    gc.disable()
    try:
        ks, est = {}, {}
        for name, (fn, post) in norm.items():
            k, dt = 1, _time_batch(fn, post, 1)           # also the warm-up
            while dt < batch_ns and k < 10_000_000:
                k = min(10_000_000, max(2 * k, int(k * batch_ns / max(dt, 1) * 1.1)))
                dt = _time_batch(fn, post, k)
            ks[name], est[name] = k, dt
        total = sum(est.values())
        rounds = max(5, min(iters, int(max_seconds * 1e9 * len(norm) / max(total, 1)) or 5))
        samples = {name: [] for name in norm}
        for _ in range(rounds):
            for name, (fn, post) in norm.items():
                samples[name].append(_time_batch(fn, post, ks[name]) / ks[name])
    finally:
        if enabled:
            gc.enable()
    out = {}
    for name, xs in samples.items():
        xs.sort()
        out[name] = {"median_ns": statistics.median(xs), "min_ns": xs[0],
                     "p90_ns": xs[min(len(xs) - 1, int(0.9 * len(xs)))],
                     "batch": ks[name], "rounds": len(xs)}
    return out


def aligned_bytes(n: int, pattern: bool = False, align: int = 4096):
    """A numpy uint8 array of ``n`` bytes starting on an ``align`` boundary, every
    page touched: filled with 0, 1, ... 255, 0, ... when ``pattern``, else with 7.
    Every buffer of the benchmark (and its baselines) is page-aligned, so that no
    figure depends on where malloc happened to place it (memcpy speed does, for
    example through 4 KiB aliasing between source and destination)."""
    import numpy as np
    raw = np.empty(n + align, dtype=np.uint8)
    off = (-raw.ctypes.data) % align
    a = raw[off:off + n]
    if pattern:
        a[:] = np.arange(n, dtype=np.uint8)     # wraps at 256
    else:
        a.fill(7)
    return a
