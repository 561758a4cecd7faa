"""A stateful fuzz of gexmk across processes (issue 19: "the sequences nobody wrote down").

A seed names a *plan*: a random sequence of items issued by 2-4 ranks of one job,
segment and endpoint life cycles (create, bind, unbind, publish, destroy, team
creation), RMA (blocking / NB / NBI puts and gets, value forms, access regions,
every local-completion mode), atomics of every data type and op, put_signal /
signal_op with the target waiting on the word, completions (nbi_wait per category,
quiet, fence, events, wait_all / wait_some / test loops), checked barriers, the
SIGKILL of a peer at a random step, and finalize.  Every rank builds the same plan
from the seed and runs the same *model* over it (nothing in the model depends on
what happened at run time), so each knows, for every item of its own, what must
happen:

* an operation completes with exact data, or raises the ``GexmkError`` the model
  names (out of segment -> ``BoundsError``, nothing published -> ``SegmentError``,
  a destroyed endpoint or a finalized client -> ``StateError``, an atomic through
  process_vm -> ``UnsupportedError``); where the outcome legitimately depends on
  timing (a peer's segment unbound or destroyed since it was published, a peer
  being killed) it may also raise the error the model allows (any ``GexmkError``
  for a stale target, ``PeerDeadError`` for a dying one), never anything else;
* rank ``w`` writes only to slice ``w`` of any segment (concurrent writers never
  race), so at every checked barrier each rank compares every byte of its own
  segments the model knows with what is there, and the guard bytes around client
  segments and around every local get buffer; a failed operation the model says
  fails before moving a byte leaves the local buffer untouched; a put's source is
  scribbled over as soon as it is reusable (LC_NOW, or its completion), so a put
  that still read it later is caught;
* after a peer is SIGKILLed (the victim kills itself at a seed-chosen item after a
  barrier), the survivors' operations to it complete or raise ``PeerDeadError``,
  their collectives over the primordial team raise ``PeerDeadError``, they go on
  over a team of the survivors made beforehand (``tm.split``), and their
  ``finalize`` returns;
* no process ends by a signal (only the victim, by its own SIGKILL), nothing hangs
  (each rank has a watchdog; the job a hard limit).

Dead peers, decided: an operation to the victim issued after the barrier that
precedes its death may complete (its mapping, or its data, may still be there) or
raise ``PeerDeadError``; what it read is not checked and what it wrote is unknown.
``BoundsError`` stays allowed for out-of-segment ranges (the range is checked
first).  What the victim wrote after that barrier is unknown to the survivors.

Commands (from the repository root, against the installed gexmk)::

    python tests/conformance/fuzz.py --seed 7 --transport ofi-tcp        # one job
    python tests/conformance/fuzz.py --show 7 --ranks 3                  # the plan, readable
    python tests/conformance/fuzz.py --seed 7 --transport nbrhd --minimise   # smallest failing plan
    python tests/conformance/fuzz.py --soak 600 --transport all          # random seeds for 10 min

``--transport``: nbrhd (default), pvm, nbrhd-staged (``GEXMK_NBRHD_STAGE=all``),
nbrhd-rings (nbrhd-staged, rings released after 2 ms unused),
ofi-tcp, ofi-shm, ofi-tcp-staged and ofi-shm-staged (``GEXMK_OFI_STAGE=all``),
ofi-tcp-rings (staged, two rings per landing zone released after 2 ms unused),
ofi-tcp-capped (``GEXMK_OFI_MAX_PEERS=1``: connections closed and set up again as ranks
change peers), ofi-tcp-capped-rings (the same over ofi-tcp-rings), or ``all``; on a GPU machine gpu-nbrhd, gpu-host-staged, gpu-nbrhd-staged, gpu-ofi-tcp,
gpu-ofi-tcp-staged, gpu-ofi-tcp-rings, gpu-ofi-tcp-capped and gpu-ofi-tcp-capped-rings (the same with device segments and device-memory
buffers: ``GPU_OF``).  ``--ranks`` 2-4 (default: chosen by the seed).  ``--soak`` prints
every failing seed with the command that replays it (``--out DIR`` keeps each
failing job's report); keep those in ``test_fuzz.py``'s ``REGRESSIONS``.
``--keep 0-40,52`` runs part of a plan (what ``--minimise`` finds), ``--trace``
has every rank log its items.  Over ofi, plans avoid peers' segments unbound
or destroyed since publication (``STALE_UNSAFE``; ``--stale`` keeps them) and
what trips known bugs (``KNOWN_BUGS``; ``--known-bugs`` keeps it).  Debugging:
``FUZZ_GDB=1`` runs the ranks under gdb (a crash prints its C stack),
``FUZZ_GDB_HANG=1`` has a hung rank print its C stacks.  Over ofi a hung rank also
prints ``FUZZ-RINGS`` (its landing rings and zones, ``OfiTransport._rings_debug``) and
asks the job's other ranks for theirs (SIGUSR1).  ``FUZZ_SLOW=S`` reports an item
(or ``gexmk.init()``) still running after S seconds the same way, once, and lets it
go on -- a stall that ends shows too; ``FUZZ_SLOW_DIR`` keeps those reports in files
(a soak drops the output of jobs that pass).  ``FUZZ_DROPS=1`` (soaks) precedes each
get the model expects to succeed with a get_nb whose event and array are dropped.

Each job runs in a temporary folder; what libfabric's shm provider leaves in
/dev/shm for a rank that did not finalize (the victim; a rank that failed) is
removed after the job.
"""
import argparse
import os
import random
import re
import signal
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

# ---- transports ----------------------------------------------------------------------------

_STAGE_SMALL = {"GEXMK_OFI_STAGE_CHUNK": "4096", "GEXMK_OFI_STAGE_SLOTS": "2"}
#: name -> environment of the job (GEXMK_TIMEOUT etc. are added by job_env)
TRANSPORTS = {
    "nbrhd": {},
    "pvm": {"GEXMK_TRANSPORT": "pvm"},
    "nbrhd-staged": {"GEXMK_NBRHD_STAGE": "all", "GEXMK_NBRHD_STAGE_CHUNK": "4096",
                     "GEXMK_NBRHD_STAGE_SLOTS": "2"},
    # issue 23: nbrhd-staged with rings released after 2 ms unused (their data
    # slots punched out of the zone's memfd, opened again by the next operation)
    "nbrhd-rings": {"GEXMK_NBRHD_STAGE": "all", "GEXMK_NBRHD_STAGE_CHUNK": "4096",
                    "GEXMK_NBRHD_STAGE_SLOTS": "2", "GEXMK_RING_IDLE": "0.002"},
    "ofi-tcp": {"GEXMK_TRANSPORT": "ofi", "GEXMK_OFI_PROVIDER": "tcp;ofi_rxm"},
    "ofi-shm": {"GEXMK_TRANSPORT": "ofi", "GEXMK_OFI_PROVIDER": "shm"},
    "ofi-tcp-staged": {"GEXMK_TRANSPORT": "ofi", "GEXMK_OFI_PROVIDER": "tcp;ofi_rxm",
                       "GEXMK_OFI_STAGE": "all", **_STAGE_SMALL},
    "ofi-shm-staged": {"GEXMK_TRANSPORT": "ofi", "GEXMK_OFI_PROVIDER": "shm",
                       "GEXMK_OFI_STAGE": "all", **_STAGE_SMALL},
    # issue 23: two rings per landing zone (a third initiator waits for one),
    # each released after 2 ms unused
    "ofi-tcp-rings": {"GEXMK_TRANSPORT": "ofi", "GEXMK_OFI_PROVIDER": "tcp;ofi_rxm",
                      "GEXMK_OFI_STAGE": "all", "GEXMK_OFI_ZONE_RINGS": "2",
                      "GEXMK_OFI_RING_IDLE": "0.002", **_STAGE_SMALL},
    # issue 23: connections with at most one peer process at a time (GEXMK_OFI_MAX_PEERS):
    # every operation to another peer closes the last one's first, both ends agreeing
    "ofi-tcp-capped": {"GEXMK_TRANSPORT": "ofi", "GEXMK_OFI_PROVIDER": "tcp;ofi_rxm",
                       "GEXMK_OFI_MAX_PEERS": "1", "GEXMK_OFI_CONNECT": "lazy"},
    # ... and landing rings on top (staged, two per zone, released after 2 ms unused)
    "ofi-tcp-capped-rings": {"GEXMK_TRANSPORT": "ofi", "GEXMK_OFI_PROVIDER": "tcp;ofi_rxm",
                             "GEXMK_OFI_MAX_PEERS": "1", "GEXMK_OFI_CONNECT": "lazy",
                             "GEXMK_OFI_STAGE": "all", "GEXMK_OFI_ZONE_RINGS": "2",
                             "GEXMK_OFI_RING_IDLE": "0.002", **_STAGE_SMALL},
}

#: GPU variants, for the GPU machine (FUZZ_GPU=1 in the job): every library segment a
#: plan creates (segment_create) is CUDA device memory, on GPU ``rank % 2`` where there
#: are two; attached segments and client segments stay host memory, so plans mix the
#: two kinds; puts' sources and gets' destinations may be device memory too (``cuda``:
#: torch CUDA tensors).  The model is the CPU transport's (what the kinds change must
#: not show).  Never part of ``--transport all``.
GPU_OF = {"gpu-nbrhd": "nbrhd", "gpu-ofi-tcp": "ofi-tcp", "gpu-ofi-tcp-staged": "ofi-tcp-staged",
          # device segments of the node reached through pinned host memory (no peer
          # access: the owner's GPU copies), host segments through landing zones, and
          # staged rings released after 2 ms unused
          "gpu-host-staged": "nbrhd", "gpu-nbrhd-staged": "nbrhd-staged",
          "gpu-ofi-tcp-rings": "ofi-tcp-rings", "gpu-ofi-tcp-capped": "ofi-tcp-capped",
          # device segments' rings released and written again under the connection cap
          "gpu-ofi-tcp-capped-rings": "ofi-tcp-capped-rings"}
GPU_EXTRA = {"gpu-host-staged": {"GEXMK_CUDA_PEER_ACCESS": "off"}}
for _g, _b in GPU_OF.items():
    TRANSPORTS[_g] = dict(TRANSPORTS[_b], FUZZ_GPU="1", **GPU_EXTRA.get(_g, {}))


def base_transport(transport):
    """The CPU transport whose model a (GPU) transport's plans follow."""
    return GPU_OF.get(transport, transport)


#: GEXMK_TIMEOUT of the jobs: collectives waiting for a dead peer give up by then
JOB_TIMEOUT = 15


def job_env(transport):
    env = dict(TRANSPORTS[transport])
    env.setdefault("GEXMK_TIMEOUT", str(JOB_TIMEOUT))
    return env


# ---- the plan -------------------------------------------------------------------------------

COLLECTIVES = {"ad_tm", "split_alive", "attach", "publish", "create_team", "check",
               "kill_prep", "finalize"}

DTS = {"I32": (0, 4, "<i"), "U32": (1, 4, "<I"), "I64": (2, 8, "<q"), "U64": (3, 8, "<Q"),
       "FLT": (4, 4, "<f"), "DBL": (5, 8, "<d")}
AOPS = ["SET", "GET", "SWAP", "CAS", "FCAS", "ADD", "FADD", "SUB", "FSUB", "INC", "FINC",
        "DEC", "FDEC", "AND", "FAND", "OR", "FOR", "XOR", "FXOR", "MIN", "FMIN", "MAX", "FMAX"]
FETCHING = {"GET", "SWAP", "FCAS", "FADD", "FSUB", "FINC", "FDEC", "FAND", "FOR", "FXOR",
            "FMIN", "FMAX"}
NO_OPERAND = {"GET", "INC", "FINC", "DEC", "FDEC"}
TWO_OPERANDS = {"CAS", "FCAS"}
BITWISE = {"AND", "FAND", "OR", "FOR", "XOR", "FXOR"}

PUTS = ["put", "put_nb", "put_nbi", "put_val", "put_nb_val", "put_nbi_val"]
GETS = ["get", "get_nb", "get_nbi", "get_val"]
AMOS = ["amo", "amo_nb", "amo_nbi"]
SIGS = ["put_signal", "put_signal_nb", "put_signal_nbi", "signal_op"]
LCS = ["default", "NOW", "DEFER", "GROUP", "leaf"]
SRCS = ["bytes", "bytearray", "memoryview", "numpy", "numpy-u32", "tuple"]
#: the VIS calls a put or get may become (Gen.vis_form): op -> the method's suffix
VIS_OF = {"put": "", "put_nb": "_nb", "put_nbi": "_nbi", "get": "", "get_nb": "_nb",
          "get_nbi": "_nbi"}


class It:
    """One item of a plan: ``kind``, the rank that issues it (None: every rank,
    a collective; for a ``sigpair``, the writer) and its arguments ``a``."""
    __slots__ = ("kind", "r", "a", "idx")

    def __init__(self, kind, r=None, **a):
        self.kind, self.r, self.a = kind, r, a
        self.idx = None         # its index in the whole plan (kept by --keep)

    def ranks(self, n):
        if self.kind in COLLECTIVES:
            return range(n)
        if self.kind == "sigpair":
            return sorted({self.r, self.a["t"]})
        return (self.r,)

    def text(self):
        who = "all" if self.r is None else f"r{self.r}"
        args = " ".join(f"{k}={_short(v)}" for k, v in self.a.items())
        return f"{who:>3} {self.kind} {args}"


def _short(v):
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{_short(x)}" for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "(" + ",".join(_short(x) for x in v) + ")"
    return str(v)


def _vis_unpermute(buf, n, blk, perm):
    """A copy of a VIS get's local buffer (guards around n bytes) with its
    blocks back in the remote order: local block i came from remote perm[i]."""
    out = (buf.cpu().numpy() if not isinstance(buf, np.ndarray) else buf).copy()
    body = out[GUARD:GUARD + n].reshape(-1, blk).copy() if n else out[GUARD:GUARD]
    if n:
        out[GUARD:GUARD + n].reshape(-1, blk)[perm] = body
    return out


def _torch():
    """torch, for device memory on the local side and for reading device segments
    back (GPU transports only)."""
    import torch
    return torch


def pattern(n, *tag):
    """n bytes unique to the integers ``tag`` (every rank computes the same)."""
    if n == 0:
        return np.zeros(0, np.uint8)
    return np.random.default_rng([int(t) & 0xFFFFFFFF for t in tag] + [0x5EED]).integers(
        0, 256, n, dtype=np.uint8)


def slice_of(size, n, w):
    """[lo, hi) of slice ``w`` of a segment of ``size`` bytes: the bytes only rank
    ``w`` writes; its first 8 bytes are w's signal word there."""
    lo = (size * w // n) & ~7
    hi = size if w == n - 1 else (size * (w + 1) // n) & ~7
    return lo, hi


# ---- the model ------------------------------------------------------------------------------

class SegM:
    """A segment as the model sees it: owner, size, client-allocated or not,
    whether it still lives, the endpoint it is bound to, and per byte the value
    expected, whether that value is known, and the item that last wrote it."""

    def __init__(self, sid, owner, size, client):
        self.sid, self.owner, self.size, self.client = sid, owner, size, client
        self.device = False     # device memory (GPU transports' library segments)
        self.live = True
        self.ep = None
        self.exp = np.zeros(size, np.uint8)
        self.known = np.ones(size, bool)
        self.last = np.full(size, -1, np.int32)
        self.ver = np.zeros(size, np.int64)        # the op that last touched each byte


class EpM:
    def __init__(self, rank, idx):
        self.rank, self.idx = rank, idx
        self.live = True
        self.seg = None
        self.gen = 0            # changes with every bind, unbind and destroy


class Expect:
    """What one rank must see for one item.  ``kind``: "ok" (no exception),
    "raises" (one of ``errs``), "maybe" (no exception, or one of ``errs``),
    "skip" (the item does not apply: left out by a minimised plan).
    ``errs``: names of gexmk.errors classes (or builtins).  ``why``: the rule."""
    __slots__ = ("kind", "errs", "why", "data", "fetch", "pend", "extra")

    def __init__(self, kind="ok", errs=(), why="", **extra):
        self.kind, self.errs, self.why = kind, tuple(errs), why
        self.data = None        # (expected bytes, mask) of a get
        self.fetch = None       # expected fetched value (atomics), or None: unchecked
        self.pend = None        # id of the pending op this item leaves, if any
        self.extra = extra

    def __repr__(self):
        e = "|".join(self.errs)
        return f"<{self.kind}{' ' + e if e else ''}{' (' + self.why + ')' if self.why else ''}>"


def ok(why=""):
    return Expect("ok", (), why)


def raises(*errs, why=""):
    return Expect("raises", errs, why)


def maybe(*errs, why=""):
    return Expect("maybe", errs, why)


class Pend:
    """An operation issued and not yet known complete."""
    __slots__ = ("pid", "rank", "ep", "cats", "event", "writes", "errs", "get", "fetch", "idx")

    def __init__(self, pid, rank, ep, cats, event, errs, idx):
        self.pid, self.rank, self.ep, self.cats, self.event = pid, rank, ep, cats, event
        self.errs = tuple(errs)     # errors its completion may raise
        self.writes = []            # (SegM, lo, hi, bytes or None for unknown)
        self.get = None             # (expected, mask) for gets
        self.fetch = None
        self.idx = idx


def _aop_apply(dt, op, old, a, b):
    """(new value, fetched value) of atomic ``op`` on ``old``; values as Python
    numbers of the data type (ints wrap; floats through numpy)."""
    code, size, fmt = DTS[dt]
    if dt in ("FLT", "DBL"):
        f = np.float32 if dt == "FLT" else np.float64
        o = f(old)
        base = op[1:] if op[0] == "F" and op not in ("FCAS",) and op[1:] in AOPS else op
        if op in ("SET",):
            new = f(a)
        elif op in ("GET",):
            new = o
        elif op == "SWAP":
            new = f(a)
        elif op in ("CAS", "FCAS"):
            new = f(b) if struct.pack(fmt, o) == struct.pack(fmt, f(a)) else o
        elif base == "ADD":
            new = f(o + f(a))
        elif base == "SUB":
            new = f(o - f(a))
        elif base == "INC":
            new = f(o + f(1))
        elif base == "DEC":
            new = f(o - f(1))
        elif base == "MIN":
            new = min(o, f(a))
        elif base == "MAX":
            new = max(o, f(a))
        else:
            raise AssertionError(op)
        return float(new), float(o)
    bits = 8 * size
    mask = (1 << bits) - 1
    signed = dt[0] == "I"

    def s(x):
        x &= mask
        return x - (1 << bits) if signed and x >> (bits - 1) else x
    o = s(old)
    base = op[1:] if op[0] == "F" and op != "FCAS" else op
    if base == "SET":
        new = a
    elif base == "GET":
        new = o
    elif base == "SWAP":
        new = a
    elif op in ("CAS", "FCAS"):
        new = b if (o & mask) == (a & mask) else o
    elif base == "ADD":
        new = o + a
    elif base == "SUB":
        new = o - a
    elif base == "INC":
        new = o + 1
    elif base == "DEC":
        new = o - 1
    elif base == "AND":
        new = o & a
    elif base == "OR":
        new = o | a
    elif base == "XOR":
        new = o ^ a
    elif base == "MIN":
        new = min(o, s(a))
    elif base == "MAX":
        new = max(o, s(a))
    else:
        raise AssertionError(op)
    return s(new), o


def _nice_float(dt, raw):
    v = struct.unpack(DTS[dt][2], raw)[0]
    return v == v and abs(v) < 2 ** 20 and v == int(v)


class Sim:
    """The model: run items in plan order and say what each rank must see.
    Deterministic: every rank computes the same from the same plan."""

    def __init__(self, n, transport, victim=None):
        self.n, self.tr = n, base_transport(transport)
        self.gpu = transport in GPU_OF       # library segments are device memory
        self.victim = victim
        self.segs = {}
        self.eps = {(r, 0): EpM(r, 0) for r in range(n)}
        self.next_ep = [1] * n
        self.views = {}         # (viewer, owner, ep) -> (sid or None, size, gen)
        self.pend = {r: [] for r in range(n)}
        self.teams = {}         # tid -> {rank: ep index}
        self.finalized = set()
        self.dying = False      # after kill_prep: the victim may be gone
        self.dead = False       # after its kill item
        self.alive_team = False
        self.region = set()     # ranks with an access region open
        self.changing = set()   # (owner, ep) whose binding changes during this epoch
        self.volatile = set()   # (owner, writer): writer writes owner's segments this epoch
        self.sig = {}           # (sid, writer) -> value last signalled (model of the word)
        self.opn = 0            # op counter (versions)
        self.idx = -1
        self.epoch_items = []
        self.unsynced_end = False

    # -- helpers --

    def seg(self, sid):
        return self.segs.get(sid)

    def ep(self, r, i):
        return self.eps.get((r, i))

    def begin_epoch(self, items, closing=None):
        """Before the local items [(index, item)] between two collectives: which
        targets change and who writes where (a peer's items of the epoch run at
        any time relative to ours)."""
        self.changing = set()
        self.volatile = set()
        self.epoch_items = items
        # After a death, finalize skips its barrier (README): a survivor may tear
        # down while another's operations of the last epoch still reach it.
        self.unsynced_end = closing == "finalize" and self.dead
        for _, it in items:
            k, r, a = it.kind, it.r, it.a
            if k in ("bind", "unbind", "ep_destroy"):
                self.changing.add((r, a["ep"]))
            elif k == "seg_destroy":
                # the endpoint it is bound to when destroyed: any it may be bound to
                for (er, ei) in list(self.eps):
                    if er == r:
                        self.changing.add((er, ei))
            elif k == "rma" and a["op"] not in GETS and a["op"] != "query":
                self.volatile.add((a["t"], r))
            elif k == "sigpair":
                self.volatile.add((a["t"], r))
        if self.dying and self.victim is not None:
            for t in range(self.n):
                self.volatile.add((t, self.victim))

    def handle_eps(self, r, h, t):
        """(local EP index, target EP index) of handle ``h`` used by rank r to
        reach rank t, or None when the handle does not exist."""
        if h[0] in ("tm", "alive"):
            return 0, 0
        if h[0] == "pair":
            return h[1], h[2]
        m = self.teams.get(h[1])
        if m is None:
            return None
        return m[r], m[t]

    def target(self, w, t, j):
        """What rank w reaches at (t, EP j): (SegM, size, clean) or an Expect
        for an error that comes before any transport."""
        if w == t:
            e = self.ep(t, j)
            if e is None or not e.live or e.seg is None:
                return raises("SegmentError", why="own endpoint has no segment bound")
            s = self.segs[e.seg]
            return s, s.size, True
        v = self.views.get((w, t, j))
        if v is None or v[0] is None:
            return raises("SegmentError", why="nothing published to this rank")
        sid, size, gen = v
        s = self.segs[sid]
        e = self.ep(t, j)
        clean = (e is not None and e.live and e.seg == sid and e.gen == gen and s.live
                 and (t, j) not in self.changing)
        return s, size, clean

    def amo_unsupported(self, w, t, s):
        if w == t:
            return False
        if self.tr == "pvm":
            return True
        return self.tr == "nbrhd" and s.client

    def read_mask(self, w, s, lo, hi):
        """Bytes of [lo, hi) of s that w can predict now: known, and not in a
        slice its writer may be changing during this epoch."""
        mask = s.known[lo:hi].copy()
        for u in range(self.n):
            if u == w or (s.owner, u) not in self.volatile:
                continue
            a, b = slice_of(s.size, self.n, u)
            a, b = max(a, lo), min(b, hi)
            if a < b:
                mask[a - lo:b - lo] = False
        return mask

    def write(self, s, lo, hi, data, pending):
        """An op writes [lo, hi) of s: data (bytes) or None (unknown)."""
        self.opn += 1
        if hi <= lo:
            return self.opn
        s.ver[lo:hi] = self.opn
        s.last[lo:hi] = self.idx
        if data is not None:
            data = np.frombuffer(bytes(data), np.uint8)
        if data is None or pending:
            s.known[lo:hi] = False
            if data is not None:
                s.exp[lo:hi] = data
        else:
            s.exp[lo:hi] = data
            s.known[lo:hi] = True
        # a pending get of this rank's over these bytes no longer knows them
        for plist in self.pend.values():
            for p in plist:
                if p.get is not None and p.get[2] is s:
                    g_lo = p.get[3]
                    a, b = max(lo, g_lo), min(hi, g_lo + len(p.get[0]))
                    if a < b:
                        p.get[1][a - g_lo:b - g_lo] = False
        return self.opn

    def finish(self, p):
        """Pending op p completed: its writes are now known (where nothing
        overlapped them since)."""
        for s, lo, hi, data, ver in p.writes:
            if data is None or hi <= lo:
                continue
            sel = s.ver[lo:hi] == ver
            s.exp[lo:hi][sel] = np.frombuffer(bytes(data), np.uint8)[sel]
            s.known[lo:hi][sel] = True

    def new_pend(self, r, ep, cats, nb, errs, region=False):
        """A pending op of rank r issued from its EP ``ep``: completed by its
        event (``nb``), or by the completions that cover ``cats``."""
        self.opn += 1
        event = ("region", self.opn) if region else ("ev", self.opn) if nb else None
        p = Pend(self.opn, r, ep, frozenset(cats), event, errs, self.idx)
        self.pend[r].append(p)
        return p

    def complete(self, r, how, ep=None, event=None):
        """Complete rank r's pending ops that ``how`` completes; the errors the
        completion may raise."""
        if how == "all":
            done = list(self.pend[r])
        elif how == "event":
            done = [p for p in self.pend[r] if p.event == event]
            if event[0] == "region":    # a region's event completes every NBI op of the process
                done += [p for p in self.pend[r] if p.event is None]
        else:
            need = {"nbi_all": {"put", "get", "rmw"}, "nbi_put": {"put"}, "nbi_get": {"get"},
                    "nbi_rmw": {"rmw"}, "quiet": {"put", "rmw"}, "fence": {"put", "rmw"},
                    "hquiet": {"put", "rmw"}, "region": {"put", "get", "rmw"}}[how]
            done = [p for p in self.pend[r] if p.event is None and p.cats <= need
                    and (how != "hquiet" or p.ep == ep)]
        errs = set()
        for p in done:
            self.pend[r].remove(p)
            self.finish(p)
            errs.update(p.errs)
        return done, tuple(sorted(errs))

    # -- items --

    def apply(self, idx, it):
        """Expectations {rank: Expect} of item ``it`` (index ``idx``)."""
        self.idx = idx
        fn = getattr(self, "i_" + it.kind)
        out = fn(it)
        return out

    def _gone(self, r):
        if r in self.finalized:
            return raises("StateError", why="after finalize")
        return None

    def i_ep_create(self, it):
        r = it.r
        if r in self.finalized:
            return {r: raises("StateError", why="after finalize")}
        i = self.next_ep[r]
        self.next_ep[r] += 1
        self.eps[(r, i)] = EpM(r, i)
        return {r: ok(f"ep {i}")}

    def i_seg_create(self, it):
        r, a = it.r, it.a
        if r in self.finalized:
            return {r: raises("StateError", why="after finalize")}
        s = SegM(a["sid"], r, a["size"], a["client"])
        s.device = self.gpu and not a["client"]
        if a["client"]:
            s.exp[:] = pattern(a["size"], 77, *a["sid"])
        self.segs[a["sid"]] = s
        return {r: ok()}

    def i_bind(self, it):
        r, a = it.r, it.a
        if r in self.finalized:
            return {r: raises("StateError", why="after finalize")}
        e, s = self.ep(r, a["ep"]), self.seg(a["sid"])
        if e is None or s is None:
            return {r: Expect("skip")}
        if not e.live or e.seg is not None or not s.live or s.ep is not None:
            return {r: raises("StateError", why="endpoint destroyed or bound, or segment destroyed or bound")}
        e.seg, s.ep = s.sid, e.idx
        e.gen += 1
        return {r: ok()}

    def _unbind(self, e):
        if e.seg is not None:
            self.segs[e.seg].ep = None
            e.seg = None
            e.gen += 1

    def i_unbind(self, it):
        r, a = it.r, it.a
        e = self.ep(r, a["ep"])
        if e is None:
            return {r: Expect("skip")}
        if r in self.finalized:
            return {r: maybe("StateError", why="after finalize")}
        self._unbind(e)
        return {r: ok()}

    def i_seg_destroy(self, it):
        r, a = it.r, it.a
        s = self.seg(a["sid"])
        if s is None:
            return {r: Expect("skip")}
        if s.ep is not None:
            self._unbind(self.ep(r, s.ep))
        s.live = False
        return {r: ok()}

    def i_ep_destroy(self, it):
        r, a = it.r, it.a
        e = self.ep(r, a["ep"])
        if e is None:
            return {r: Expect("skip")}
        if r in self.finalized:
            return {r: maybe("StateError", why="after finalize")}
        self._unbind(e)
        if e.live:
            e.live = False
            e.gen += 1
            # pending ops of the endpoint: their events fail or complete; data unknown
            for p in list(self.pend[r]):
                if p.ep == e.idx:
                    p.errs = tuple(sorted(set(p.errs) | {"StateError"}))
                    for w in p.writes:
                        w[3] = None
                    if p.get is not None:
                        p.get[1][:] = False
        return {r: ok()}

    def i_kill(self, it):
        self.dead = True
        return {it.r: ok("SIGKILL")}

    def i_region_begin(self, it):
        r = it.r
        if r in self.region:
            return {r: raises("StateError", why="a region is already open")}
        if r in self.finalized:
            return {r: ok()}
        self.region.add(r)
        return {r: ok()}

    def i_region_end(self, it):
        r = it.r
        if r not in self.region:
            return {r: Expect("skip")}
        self.region.discard(r)
        # the region's event completes every NBI op of the process
        p = self.new_pend(r, None, set(), False, (), region=True)
        e = ok()
        e.pend = p
        return {r: e}

    def i_complete(self, it):
        r, a = it.r, it.a
        how = a["how"]
        if r in self.finalized:
            return {r: raises("StateError", why="after finalize")}
        if how in ("events", "wait_all", "wait_some", "test_loop"):
            evs = [p for p in self.pend[r] if p.event is not None]
            done = []
            errs = set()
            for p in evs:
                if p not in self.pend[r]:
                    continue
                d, e = self.complete(r, "event", event=p.event)
                done += d
                errs.update(e)
            exp = ok() if not errs else maybe(*sorted(errs), why="ops to a stale or dying target")
            exp.extra["done"] = done
            return {r: exp}
        if how == "hquiet":
            h = a["h"]
            eps = self.handle_eps(r, h, r)
            if eps is None:
                return {r: Expect("skip")}
            e = self.ep(r, eps[0])
            if e is None or not e.live:
                return {r: raises("StateError", why="handle's endpoint destroyed")}
            done, errs = self.complete(r, "hquiet", ep=eps[0])
        else:
            done, errs = self.complete(r, how)
        exp = ok() if not errs else maybe(*errs, why="ops to a stale or dying target")
        exp.extra["done"] = done
        return {r: exp}

    def i_query(self, it):
        r, a = it.r, it.a
        g = self._gone(r)
        if g:
            return {r: g}
        eps = self.handle_eps(r, a["h"], a["t"])
        if eps is None:
            return {r: Expect("skip")}
        if not self.ep(r, eps[0]).live:
            return {r: raises("StateError", why="handle's endpoint destroyed")}
        tg = self.target(r, a["t"], eps[1])
        if isinstance(tg, Expect):
            return {r: tg}
        s, size, clean = tg
        exp = ok()
        exp.extra["size"] = size
        return {r: exp}

    # -- RMA --

    def i_rma(self, it):
        r, a = it.r, it.a
        t = a["t"]
        if r in self.finalized:
            return {r: raises("StateError", why="after finalize")}
        eps = self.handle_eps(r, a["h"], t)
        if eps is None:
            return {r: Expect("skip")}
        le = self.ep(r, eps[0])
        if le is None:
            return {r: Expect("skip")}
        if a["h"][0] == "alive" and not self.alive_team:
            return {r: Expect("skip")}
        if not le.live:
            # an atomic's alignment is checked before the team's state
            misaligned = a["op"] in AMOS and a["off"] % DTS[a["dt"]][1]
            return {r: raises("StateError", *(("BoundsError",) if misaligned else ()),
                              why=f"local endpoint {eps[0]} destroyed")}
        # a non-contiguous source ("noncontig") moves strided like any put (issue 22)
        exp = self._rma(r, t, eps, a, it)
        return {r: exp}

    def _rma(self, w, t, eps, a, it):
        op = a["op"]
        n = a["n"]
        dying = self.dying and t == self.victim and w != t
        if op in AMOS:
            n = DTS[a["dt"]][1]
            if a["off"] % n:
                return raises("BoundsError", why="misaligned atomic")
        tg = self.target(w, t, eps[1])
        if isinstance(tg, Expect):
            if dying:
                tg.errs = tuple(sorted(set(tg.errs) | {"PeerDeadError"}))
            return tg
        s, size, clean = tg
        off = a["off"]
        if op in SIGS:
            sig_off = a["sig_off"]
            if sig_off < 0 or sig_off + 8 > size or (op != "signal_op" and (off < 0 or off + n > size)):
                return raises("BoundsError", *(("PeerDeadError",) if dying else ()),
                              why="out of the segment")
        elif off < 0 or off + n > size:
            return raises("BoundsError", *(("PeerDeadError",) if dying else ()),
                          why="out of the segment")
        is_amo = op in AMOS or op == "signal_op" or (op in SIGS and a["sig_op"] == "ADD")
        if not clean:
            return self._stale(w, s, a, eps, why="target unbound, rebound or destroyed since publication")
        if self.unsynced_end and w != t:
            return self._stale(w, s, a, eps, why="after a death the target may finalize first")
        if is_amo and self.amo_unsupported(w, t, s):
            return raises("UnsupportedError", *(("PeerDeadError",) if dying else ()),
                          why="atomics through process_vm")
        if dying:
            return self._stale(w, s, a, eps, errs=("PeerDeadError",), why="the target is being killed")
        if op in PUTS:
            return self._put(w, s, a, eps)
        if op in GETS:
            return self._get(w, s, a, eps)
        if op in AMOS:
            return self._amo(w, s, a, eps)
        return self._sig(w, s, a, eps)

    def _stale(self, w, s, a, eps, errs=("GexmkError",), why=""):
        """An op that may complete or fail: what it writes is unknown, what it
        reads unchecked; if it leaves an event or an NBI op, completing that may
        fail the same way."""
        op = a["op"]
        exp = maybe(*errs, why=why)
        lo, hi = a["off"], a["off"] + a["n"]
        if op in AMOS:
            hi = lo + DTS[a["dt"]][1]
        if op not in GETS:
            if op in SIGS:
                self.write(s, a["sig_off"], a["sig_off"] + 8, None, False)
            if op != "signal_op":
                self.write(s, lo, hi, None, False)
        if op in ("put", "get", "get_val", "amo", "signal_op", "put_val", "put_nb_val") or \
                (op == "amo_nbi" and a["aop"] in FETCHING):
            return exp          # complete on return
        cats = {"put", "rmw"} if op.startswith("put_signal") else \
            {"put"} if op.startswith("put") else {"get"} if op.startswith("get") else {"rmw"}
        nb = op in ("put_nb", "get_nb", "amo_nb", "put_signal_nb")
        exp.pend = self.new_pend(w, eps[0], cats, nb, errs)
        return exp

    def _put(self, w, s, a, eps):
        op, off, n = a["op"], a["off"], a["n"]
        data = self.put_data(a)
        if op == "put":
            self.write(s, off, off + n, data, False)
            return ok()
        if op in ("put_val", "put_nb_val", "put_nbi_val"):
            # value puts are complete on return (the value is copied)
            if op == "put_nbi_val":
                p = self.new_pend(w, eps[0], {"put"}, None, ())
                ver = self.write(s, off, off + n, data, True)
                p.writes.append([s, off, off + n, data, ver])
                return ok()
            self.write(s, off, off + n, data, False)
            return ok()
        nb = op == "put_nb"
        p = self.new_pend(w, eps[0], {"put"}, nb, ())
        ver = self.write(s, off, off + n, data, True)
        p.writes.append([s, off, off + n, data, ver])
        exp = ok()
        exp.pend = p
        return exp

    def put_data(self, a):
        if a["op"].endswith("_val"):
            return a["v"].to_bytes(a["n"], "little")
        return pattern(a["n"], a["seed"]).tobytes()

    def _get(self, w, s, a, eps):
        op, off, n = a["op"], a["off"], a["n"]
        want = s.exp[off:off + n].copy()
        mask = self.read_mask(w, s, off, off + n)
        exp = ok()
        exp.data = (want, mask)
        if op in ("get", "get_val"):
            return exp
        nb = op == "get_nb"
        p = self.new_pend(w, eps[0], {"get"}, nb, ())
        p.get = [want, mask, s, off]
        exp.pend = p
        exp.data = None         # checked at completion
        exp.extra["get"] = p.get
        return exp

    def _amo(self, w, s, a, eps):
        op, dt, aop, off = a["op"], a["dt"], a["aop"], a["off"]
        size = DTS[dt][1]
        fmt = DTS[dt][2]
        raw = bytes(s.exp[off:off + size])
        mask = self.read_mask(w, s, off, off + size)
        known = bool(mask.all())
        if known and dt in ("FLT", "DBL") and not _nice_float(dt, raw):
            known = False
        exp = ok()
        new = None
        if known:
            old = struct.unpack(fmt, raw)[0]
            if dt[0] == "U" or dt[0] == "I":
                old = int.from_bytes(raw, "little")
            nv, fetched = _aop_apply(dt, aop, old, a.get("v1"), a.get("v2"))
            if dt in ("FLT", "DBL"):
                new = struct.pack(fmt, nv)
            else:
                new = (nv & ((1 << (8 * size)) - 1)).to_bytes(size, "little")
            if aop in FETCHING:
                exp.fetch = fetched
        fetching = aop in FETCHING
        if op == "amo" or (op == "amo_nbi" and fetching):
            self.write(s, off, off + size, new, False)
            return exp
        nb = op == "amo_nb"
        p = self.new_pend(w, eps[0], {"rmw"}, nb, ())
        ver = self.write(s, off, off + size, new, True)
        p.writes.append([s, off, off + size, new, ver])
        if nb:
            p.fetch = exp.fetch
        exp.pend = p
        return exp

    def sig_value(self, s, w, a):
        """The signal word's value after this op (SET: a, ADD: old + a)."""
        lo = a["sig_off"]
        raw = bytes(s.exp[lo:lo + 8])
        known = bool(s.known[lo:lo + 8].all())
        if a["sig_op"] == "SET":
            return a["sig"]
        if not known:
            return None
        return (int.from_bytes(raw, "little") + a["sig"]) & (2 ** 64 - 1)

    def _sig(self, w, s, a, eps):
        op = a["op"]
        lo = a["sig_off"]
        newsig = self.sig_value(s, w, a)
        sigbytes = None if newsig is None else newsig.to_bytes(8, "little")
        exp = ok()
        exp.extra["sigval"] = newsig
        if s.known[lo:lo + 8].all():
            exp.extra["sigold"] = int.from_bytes(bytes(s.exp[lo:lo + 8]), "little")
        if op == "signal_op":
            # blocking, through the atomics path: complete on return
            self.write(s, lo, lo + 8, sigbytes, False)
            return exp
        data = self.put_data(a)
        off, n = a["off"], a["n"]
        nb = op == "put_signal_nb"
        # a blocking put_signal returns once src is reusable: complete after quiet
        p = self.new_pend(w, eps[0], {"put", "rmw"}, nb, ())
        v1 = self.write(s, off, off + n, data, True)
        v2 = self.write(s, lo, lo + 8, sigbytes, True)
        p.writes.append([s, off, off + n, data, v1])
        p.writes.append([s, lo, lo + 8, sigbytes, v2])
        exp.pend = p
        exp.extra["data"] = (off, data)
        return exp

    def i_sigpair(self, it):
        """The writer signals; the target waits for the word (CMP_GE: signal
        values only grow), then checks the data, less what the writer writes
        to the target again later in the epoch."""
        w, a = it.r, it.a
        t = a["t"]
        out = {}
        wexp = self.i_rma(It("rma", w, **a))[w]
        out[w] = wexp
        if t == w:
            return out
        texp = Expect("skip", why="the writer's op is not predicted to land")
        eps = self.handle_eps(w, a["h"], t)
        if wexp.kind == "ok" and t not in self.finalized and wexp.extra.get("sigval") is not None \
                and eps is not None:
            j = eps[1]
            te = self.ep(t, j)
            if te is not None and te.live and te.seg is not None and te.seg == self._target_sid(w, t, j):
                s = self.segs[te.seg]
                use_alive = self.alive_team and j == 0 and self.victim not in (w, t)
                texp = ok("wait for the signal")
                if self.dying and not use_alive:
                    texp = maybe("PeerDeadError", why="waiting on a team with a dying member")
                if s.device:
                    # the waiter's own segment is device memory: a host wait on a
                    # device word is refused (signal.pxi _word_error); the data and
                    # the word are checked at the next checked barrier instead
                    texp = raises("UnsupportedError", why="wait_until on a device word")
                texp.extra.update(j=j, sig_off=a["sig_off"], value=wexp.extra["sigval"],
                                  alive=use_alive, sid=s.sid, cmp="EQ")
                if s.device:
                    out[t] = texp
                    return out
                # CMP_EQ; not at all where the writer signals the word again this
                # epoch (the value waited for may be gone before the wait looks)
                if any(i2 > self.idx and it2.r == w and it2.a.get("t") == t
                       and it2.a.get("sig_off") == a["sig_off"] for i2, it2 in self.epoch_items):
                    out[t] = Expect("skip", why="the word is signalled again this epoch")
                    return out
                if "data" in wexp.extra:
                    off, data = wexp.extra["data"]
                    mask = np.ones(len(data), bool)
                    for i2, it2 in self.epoch_items:
                        if i2 <= self.idx or it2.r != w or it2.kind not in ("rma", "sigpair") \
                                or it2.a["t"] != t or it2.a["op"] in GETS or it2.a["op"] == "query":
                            continue
                        b = it2.a
                        rng = [(b["off"], b["off"] + max(b["n"], DTS[b["dt"]][1] if "dt" in b else 0))]
                        if "sig_off" in b:
                            rng.append((b["sig_off"], b["sig_off"] + 8))
                        for lo, hi in rng:
                            lo, hi = max(lo, off), min(hi, off + len(data))
                            if lo < hi:
                                mask[lo - off:hi - off] = False
                    texp.data = (np.frombuffer(data, np.uint8).copy(), mask)
                    texp.extra["off"] = off
        out[t] = texp
        return out

    def _target_sid(self, w, t, j):
        v = self.views.get((w, t, j))
        return None if v is None else v[0]

    # -- collectives --

    def everyone(self):
        return [r for r in range(self.n) if not (self.dead and r == self.victim)]

    def collective_done(self):
        """Every rank completed its ops before a collective: all known."""
        out = {}
        for r in self.everyone():
            done, errs = self.complete(r, "all")
            out[r] = errs
        if self.dead and self.victim is not None:
            self.pend[self.victim] = []
        return out

    def _coll(self, fn, why=""):
        errs = self.collective_done()
        out = {}
        for r in self.everyone():
            if r in self.finalized:
                out[r] = Expect("skip")
                continue
            e = fn(r)
            e.extra["complete_errs"] = errs.get(r, ())
            out[r] = e
        return out

    def _probe(self):
        """After the death: the primordial team's collectives raise PeerDeadError."""
        return self.dead

    def i_ad_tm(self, it):
        return self._coll(lambda r: ok())

    def i_split_alive(self, it):
        self.alive_team = True
        return self._coll(lambda r: ok())

    def i_kill_prep(self, it):
        out = self._coll(lambda r: maybe("PeerDeadError", why="the barrier before the kill")
                         if r != self.victim else ok())
        self.dying = True
        # what the victim writes from here on is unknown to everyone
        for s in self.segs.values():
            lo, hi = slice_of(s.size, self.n, self.victim)
            if s.owner != self.victim:
                s.known[lo:hi] = False
        return out

    def i_check(self, it):
        def f(r):
            e = ok()
            e.extra["probe"] = self._probe()
            e.extra["segs"] = {sid: (s.exp.copy(), s.known.copy(), s.last.copy())
                               for sid, s in self.segs.items() if s.owner == r and s.live}
            return e
        return self._coll(f)

    def i_publish(self, it):
        a = it.a
        pubs = {}

        def f(r):
            eps = [i for i in a["eps"].get(r, []) if self.ep(r, i) is not None and self.ep(r, i).live]
            pubs[r] = eps
            e = ok()
            e.extra["eps"] = eps
            e.extra["probe"] = self._probe()
            return e
        out = self._coll(f)
        viewers = self.everyone()
        for r, eps in pubs.items():
            for i in eps:
                e = self.ep(r, i)
                val = (e.seg, self.segs[e.seg].size, e.gen) if e.seg is not None else (None, 0, e.gen)
                for v in viewers:
                    if v != r:
                        self.views[(v, r, i)] = val
        return out

    def i_attach(self, it):
        a = it.a
        if self.dead:
            return {r: Expect("skip") for r in range(self.n)}

        def f(r):
            i = self.next_ep[r]
            self.next_ep[r] += 1
            e = self.eps[(r, i)] = EpM(r, i)
            sid = (r, "a", self.idx)
            s = self.segs[sid] = SegM(sid, r, a["sizes"][r], False)
            e.seg, s.ep = sid, i
            e.gen += 1
            x = ok()
            x.extra.update(ep=i, sid=sid, size=a["sizes"][r])
            return x
        out = self._coll(f)
        for r in range(self.n):
            for i in (self.next_ep[r] - 1,):
                e = self.ep(r, i)
                for v in range(self.n):
                    if v != r:
                        self.views[(v, r, i)] = (e.seg, self.segs[e.seg].size, e.gen)
        return out

    def i_create_team(self, it):
        a = it.a
        ok_all = not self.dead and all(
            self.ep(r, a["eps"][r]) is not None and self.ep(r, a["eps"][r]).live
            for r in range(self.n)) and not self.finalized
        if not ok_all:
            return {r: Expect("skip") for r in range(self.n)}
        self.teams[a["tid"]] = dict(a["eps"])
        return self._coll(lambda r: ok())

    def i_finalize(self, it):
        a = it.a
        out = {}
        if a.get("leave_pending"):
            for r in self.everyone():
                e = ok()
                e.extra["pend_errs"] = ("StateError",)
                out[r] = e
            for r in self.everyone():
                self.pend[r] = []
        else:
            out = self._coll(lambda r: ok())
        for r in self.everyone():
            self.finalized.add(r)
            out[r].extra["probe"] = self._probe()
        return out


def epochs(plan):
    """The plan split at collectives: [(local items, collective item or None)]."""
    out, cur = [], []
    for i, it in enumerate(plan):
        if it.kind in COLLECTIVES:
            out.append((cur, (i, it)))
            cur = []
        else:
            cur.append((i, it))
    if cur:
        out.append((cur, None))
    return out


def simulate(plan, n, transport, victim):
    """Expectations of every item: a list of {rank: Expect}."""
    sim = Sim(n, transport, victim)
    exps = [None] * len(plan)
    for local, coll in epochs(plan):
        sim.begin_epoch(local, coll[1].kind if coll is not None else None)
        for i, it in local:
            exps[i] = sim.apply(i, it)
        if coll is not None:
            i, it = coll
            exps[i] = sim.apply(i, it)
    return exps


# ---- generation -----------------------------------------------------------------------------

class Gen:
    """Builds the plan of a seed: a random walk that the model keeps sensible
    (mostly valid targets, now and then a wrong one on purpose)."""

    def __init__(self, seed, n, transport, length, stale=False, known=False, vis=True):
        self.R = random.Random(seed * 7919 + n)
        # VIS forms of puts and gets (issue 22) draw from a stream of their own,
        # so that plans made without them (vis=False: the regression seeds
        # recorded before) are what they were
        self.V = random.Random(seed * 104729 + n) if vis else None
        self.seed, self.n, self.tr = seed, n, base_transport(transport)
        gpu = transport in GPU_OF
        self.srcs = SRCS + ["cuda"] if gpu else SRCS
        self.dsts = ["numpy", "bytearray", "tuple"] + (["cuda"] if gpu else [])
        self.length = length
        R = self.R
        self.victim = R.randrange(n) if R.random() < 0.4 else None
        self.avoid = set() if known else KNOWN_BUGS.get(self.tr, set())
        if "kill" in self.avoid:
            self.victim = None
        self.sim = Sim(n, transport, self.victim)
        self.plan = []
        self.nseg = [0] * n
        self.ntid = 0
        self.sigctr = 0
        self.killed = False
        # Where an access to a peer's closed registration disturbs other traffic
        # (ofi: see STALE_UNSAFE), plans reach only targets published as they are.
        self.avoid_stale = self.tr in STALE_UNSAFE and not stale
        self.may_change = {}
        self.made = {}          # rank -> TM-pairs (i, j) its executor has made

    def vis_form(self, a):
        """Make a put or get of [off, off + n) a VIS call over the same bytes:
        n cut to k blocks of ``blk`` bytes, moved in a permuted order (vector,
        indexed: remote block perm[i] <-> local block i) or through a strided
        shape (2-D, ``elem``-byte elements; the local side of a put has gaps
        between rows).  The bytes the target ends with are the plain put's,
        so the model is unchanged (fuzz Worker.x_vis builds the sides)."""
        V = self.V
        n = a["n"]
        blk = V.choice([b for b in (1, 2, 3, 4, 8, 16, 64, 512, 4096) if b <= n])
        a["n"] = (n // blk) * blk
        a["vis"] = V.choice(["vector", "indexed", "strided"])
        a["blk"] = blk
        a["perm"] = V.getrandbits(31)
        a["elem"] = V.choice([e for e in (1, 2, 4, 8, blk) if blk % e == 0])
        a["form"] = V.randrange(4)      # how the lists are given (tuples, ints, arrays, buffers)

    def emit(self, it):
        i = len(self.plan)
        self.plan.append(it)
        if it.kind in COLLECTIVES:
            self.sim.begin_epoch([])
        self.sim.apply(i, it)

    def live_eps(self, r):
        return sorted(i for (er, i), e in self.sim.eps.items() if er == r and e.live)

    def my_segs(self, r, live=True):
        return sorted((sid for sid, s in self.sim.segs.items()
                       if s.owner == r and (s.live or not live)), key=str)

    def seg_size(self):
        R, n = self.R, self.n
        x = R.random()
        if x < 0.5:
            return n * R.choice([16, 32, 64, 128, 256]) + R.choice([0, 0, 8, 13])
        if x < 0.85:
            return R.randrange(1024, 9000)
        if x < 0.97:
            return R.randrange(16384, 80000)
        return R.randrange(1 << 18, (1 << 20) + 4096)

    def run(self):
        R, n = self.R, self.n
        self.emit(It("ad_tm"))
        if self.victim is not None:
            self.emit(It("split_alive", victim=self.victim))
        for r in range(n):
            self.seg_create(r)
            self.emit(It("bind", r, ep=0, sid=self.my_segs(r)[-1]))
        self.emit(It("publish", eps={r: [0] for r in range(n)}))
        kill_at = R.randrange(1, self.length) if self.victim is not None else None
        for e in range(self.length):
            if e == kill_at:
                self.emit(It("kill_prep"))
                self.epoch(kill=True)
            else:
                self.epoch()
            self.collective()
        self.emit(It("check", nb=False))
        if R.random() < 0.3:
            # the last epoch may destroy endpoint 0 (its teams close: no collective
            # after; finalize then has ops in flight from the others endpoints)
            who = [r for r in self.sim.everyone() if R.random() < 0.5]
            self.may_change = {r: ({0} if r in who else set()) for r in self.sim.everyone()}
            for r in who:
                self.rma(r)
                self.ep_destroy(r, 0)
                self.rma(r)
        pending = R.random() < 0.15 and "finalize_pending" not in self.avoid
        self.emit(It("finalize", leave_pending=pending))
        for r in self.sim.everyone():
            for _ in range(R.randrange(1, 3)):
                self.after_finalize(r)
        return self.plan

    def epoch(self, kill=False):
        R = self.R
        ranks = self.sim.everyone()
        if self.avoid_stale:
            # at most one endpoint per rank changes this epoch, and peers do not reach it
            self.may_change = {r: set(R.sample(self.live_eps(r), 1)) if R.random() < 0.5 else set()
                               for r in ranks}
        todo = {r: R.randrange(2, 9) for r in ranks}
        if kill:
            todo[self.victim] = R.randrange(0, 6)
        while any(todo.values()):
            r = R.choice([r for r in ranks if todo[r]])
            if kill and r == self.victim and todo[r] == 1 and not self.killed:
                self.emit(It("kill", r))
                self.killed = True
                todo[r] = 0
                continue
            todo[r] -= 1
            self.local(r)
        if kill and not self.killed:
            self.emit(It("kill", self.victim))
            self.killed = True
        for r in self.sim.everyone():
            if r in self.sim.region:
                self.emit(It("region_end", r))

    def collective(self):
        R = self.R
        x = R.random()
        if x < 0.55:
            self.emit(It("check", nb=R.random() < 0.3))
        elif x < 0.8:
            eps = {}
            for r in self.sim.everyone():
                live = self.live_eps(r)
                eps[r] = sorted(R.sample(live, R.randrange(0, len(live) + 1)))
            self.emit(It("publish", eps=eps))
        elif x < 0.9 and not self.sim.dying and len(self.sim.teams) < 3:
            if self.avoid_stale:
                # its routes are touched at creation: endpoints every peer sees as they are
                self.may_change = {}
                good = {r: [i for i in self.live_eps(r)
                            if all(self.clean_for(v, r, i) for v in range(self.n))]
                        for r in range(self.n)}
                if not all(good.values()):
                    return self.emit(It("check", nb=False))
                choice = {r: R.choice(good[r]) for r in range(self.n)}
            else:
                choice = {r: R.choice(self.live_eps(r)) for r in range(self.n)}
            self.emit(It("create_team", tid=self.ntid, eps=choice))
            self.ntid += 1
        elif not self.sim.dying and len(self.live_eps(0)) < 6:
            self.emit(It("attach", sizes={r: self.seg_size() for r in range(self.n)}))
        else:
            self.emit(It("check", nb=False))

    def ep_destroy(self, r, i):
        if "destroy_pending" in self.avoid and self.sim.pend[r]:
            self.emit(It("complete", r, how="events"))
            self.emit(It("complete", r, how="nbi_all"))
        self.emit(It("ep_destroy", r, ep=i))

    def seg_create(self, r):
        sid = (r, self.nseg[r])
        self.nseg[r] += 1
        self.emit(It("seg_create", r, sid=sid, size=self.seg_size(), client=self.R.random() < 0.3))

    def local(self, r):
        R, sim = self.R, self.sim
        x = R.random()
        live = self.live_eps(r)
        if x < 0.5:
            return self.rma(r)
        if x < 0.6:
            return self.sigpair(r)
        if x < 0.72:
            how = R.choice(["nbi_all", "nbi_put", "nbi_get", "nbi_rmw", "quiet", "fence", "hquiet",
                            "events", "wait_all", "wait_some", "test_loop"])
            a = {"how": how}
            if how == "hquiet":
                a["h"] = self.handle(r, r)
            return self.emit(It("complete", r, **a))
        if x < 0.75:
            return self.emit(It("ep_create", r)) if len(live) < 5 else self.rma(r)
        if x < 0.79:
            return self.seg_create(r)
        # what may change this epoch (every live endpoint, but where stale accesses
        # are avoided, only the ones peers do not reach during this epoch)
        chg = [i for i in live if i in self.may_change.get(r, live)]
        if x < 0.85:
            free_eps = [i for i in chg if sim.ep(r, i).seg is None]
            free_segs = [sid for sid in self.my_segs(r) if sim.segs[sid].ep is None]
            if R.random() < 0.1 and chg and self.my_segs(r):     # a wrong bind, on purpose
                return self.emit(It("bind", r, ep=R.choice(chg), sid=R.choice(self.my_segs(r))))
            if free_eps and free_segs:
                return self.emit(It("bind", r, ep=R.choice(free_eps), sid=R.choice(free_segs)))
            return self.seg_create(r)
        if x < 0.87:
            return self.emit(It("unbind", r, ep=R.choice(chg))) if chg else self.rma(r)
        if x < 0.89:
            segs = [sid for sid in self.my_segs(r) if sim.segs[sid].ep is None or sim.segs[sid].ep in chg]
            if segs:
                return self.emit(It("seg_destroy", r, sid=R.choice(segs)))
            return self.rma(r)
        if x < 0.905:
            others = [i for i in chg if i != 0]
            if others:
                return self.ep_destroy(r, R.choice(others))
            return self.rma(r)
        if x < 0.95:
            if r in sim.region:
                return self.emit(It("region_end", r))
            self.emit(It("region_begin", r))
            for _ in range(R.randrange(0, 4)):
                self.rma(r, nbi=True)
            return
        if x < 0.97:
            t = R.randrange(self.n)
            return self.emit(It("query", r, h=self.handle(r, t), t=t))
        return self.rma(r)

    def handle(self, r, t):
        R, sim = self.R, self.sim
        x = R.random()
        live = self.live_eps(r)
        if sim.alive_team and sim.dead and r != self.victim and t != self.victim and x < 0.3:
            return ("alive",)
        if x < 0.35 and 0 in live:
            return ("tm",)
        if x < 0.55 and sim.teams:
            return ("team", R.choice(sorted(sim.teams)))
        i = R.choice(live) if live and R.random() < 0.95 else R.randrange(sim.next_ep[r])
        tj = [ei for (er, ei) in sim.eps if er == t]
        j = R.choice(tj) if R.random() < 0.95 else R.randrange(6)
        made = self.made.setdefault(r, set())
        if self.avoid_stale and (i, j) not in made and not self.all_clean(r, j):
            # making a pair touches endpoint j of every rank (eager connections):
            # one made already, or the primordial team
            old = sorted(p for p in made if sim.ep(r, p[0]) is not None and sim.ep(r, p[0]).live)
            if old:
                return ("pair",) + R.choice(old)
            return ("tm",)
        made.add((i, j))
        return ("pair", i, j)

    def clean_for(self, v, t, j):
        """Whether rank v's view of (t, EP j) is absent or what t has bound there."""
        if v == t:
            return True
        w = self.sim.views.get((v, t, j))
        if w is None or w[0] is None:
            return True
        e = self.sim.ep(t, j)
        return e is not None and e.live and e.seg == w[0] and e.gen == w[2] and self.sim.segs[w[0]].live

    def all_clean(self, r, j):
        """Whether every peer's endpoint j is, as far as r was told, still what
        it published, and does not change this epoch."""
        for t in range(self.n):
            if t == r or (self.sim.dead and t == self.victim):
                continue
            if j in self.may_change.get(t, ()):
                return False
            v = self.sim.views.get((r, t, j))
            if v is None or v[0] is None:
                continue
            e = self.sim.ep(t, j)
            if not (e is not None and e.live and e.seg == v[0] and e.gen == v[2]
                    and self.sim.segs[v[0]].live):
                return False
        return True

    def reachable(self, r, t, h):
        """Whether r may aim at t through h in this plan: always, unless stale
        accesses are avoided; then only where what r was published of t's
        endpoint is still bound and t does not change it this epoch (an
        endpoint r has no view of fails locally, which is fine)."""
        if not self.avoid_stale or r == t:
            return True
        eps = self.sim.handle_eps(r, h, t)
        if eps is None:
            return True
        j = eps[1]
        if j in self.may_change.get(t, ()):
            return False
        v = self.sim.views.get((r, t, j))
        if v is None or v[0] is None:
            return True
        e = self.sim.ep(t, j)
        return e is not None and e.live and e.seg == v[0] and e.gen == v[2] and self.sim.segs[v[0]].live

    def aim(self, r, others=False):
        """(target rank, handle) for an operation of r."""
        for _ in range(10):
            t = self.pick_target(r)
            if others and t == r and len(self.sim.everyone()) > 1:
                continue
            h = self.handle(r, t)
            if self.reachable(r, t, h):
                return t, h
        return r, self.handle(r, r)

    def pick_target(self, r):
        R, sim = self.R, self.sim
        ranks = list(range(self.n))
        if sim.dead:
            if R.random() < 0.15:
                return self.victim
            ranks = sim.everyone()
        return R.choice(ranks)

    def region_of(self, r, t, h):
        """(size, [lo, hi) of r's slice) of what r reaches through h at t, or None."""
        eps = self.sim.handle_eps(r, h, t)
        if eps is None:
            return None
        tg = self.sim.target(r, t, eps[1])
        if isinstance(tg, Expect):
            return None
        s, size, clean = tg
        return size, slice_of(size, self.n, r), s

    def size_in(self, room):
        R = self.R
        if room <= 0:
            return 0
        x = R.random()
        if x < 0.05:
            return 0
        if x < 0.3:
            return R.randrange(1, min(room, 16) + 1)
        if x < 0.8:
            return R.randrange(1, min(room, 512) + 1)
        return R.randrange(1, room + 1)

    def flush_overlap(self, r, sid, lo, hi):
        """Complete r's pending ops that write [lo, hi) of segment sid first (two
        writes in flight to the same bytes have no order)."""
        for p in self.sim.pend[r]:
            for s, a, b, _, _ in p.writes:
                if s.sid == sid and a < hi and lo < b:
                    self.emit(It("complete", r, how="nbi_all" if p.event is None else "events"))
                    return self.flush_overlap(r, sid, lo, hi)
            if p.get is not None and p.get[2].sid == sid:
                g = p.get
                if g[3] < hi and lo < g[3] + len(g[0]):
                    self.emit(It("complete", r, how="nbi_all" if p.event is None else "events"))
                    return self.flush_overlap(r, sid, lo, hi)

    def rma(self, r, nbi=False):
        R = self.R
        t, h = self.aim(r)
        if nbi:
            op = R.choice(["put_nbi", "put_nbi_val", "get_nbi", "amo_nbi", "put_signal_nbi"])
        else:
            x = R.random()
            op = R.choice(PUTS if x < 0.4 else GETS if x < 0.7 else AMOS if x < 0.9 else
                          ["put_signal", "put_signal_nb", "put_signal_nbi", "signal_op"])
        if (op.startswith("put_signal") or op == "signal_op") and "put_signal" in self.avoid:
            op = "amo"
        a = {"h": h, "t": t, "op": op}
        reg = self.region_of(r, t, h)
        size, (lo, hi), s = reg if reg else (4096, slice_of(4096, self.n, r), None)
        dlo = lo + 8
        x = R.random()
        if op in AMOS:
            dt = R.choice(list(DTS))
            k = DTS[dt][1]
            aop = R.choice([o for o in AOPS if not (dt in ("FLT", "DBL") and o in BITWISE)])
            words = [o for o in range(dlo, hi - k + 1) if o % k == 0]
            off = R.choice(words) if words else lo
            if x < 0.05:
                off = size + R.choice([0, 8, 64])        # past the end (never a peer's slice)
            elif x < 0.08:
                off += 1
            if s is not None and dt in ("FLT", "DBL") and 0 <= off and off + k <= s.size \
                    and not (s.known[off:off + k].all() and _nice_float(dt, bytes(s.exp[off:off + k]))):
                aop = "SET"
            if "put_signal" in self.avoid and t != r and aop not in FETCHING:
                # the same bug: a non-fetching atomic is not complete when it returns
                aop = {"SET": "SWAP", "CAS": "FCAS"}.get(aop, "F" + aop)
            a.update(dt=dt, aop=aop, off=off, n=0)
            if aop not in NO_OPERAND:
                a["v1"] = self.operand(dt)
            if aop in TWO_OPERANDS:
                if s is not None and R.random() < 0.5 and 0 <= off and off + k <= s.size and \
                        s.known[off:off + k].all():
                    raw = bytes(s.exp[off:off + k])      # a CAS that succeeds
                    v = struct.unpack(DTS[dt][2], raw)[0]
                    a["v1"] = v if dt in ("FLT", "DBL") or dt[0] == "I" else int(v)
                a["v2"] = self.operand(dt)
            n_eff = k
        elif op.endswith("_val"):
            nb = R.randrange(1, 9)
            off = R.randrange(dlo, max(dlo, hi - nb) + 1)
            a.update(n=nb, v=R.getrandbits(8 * nb), off=off)
            n_eff = nb
        elif op == "signal_op" or op.startswith("put_signal"):
            n = self.size_in(hi - dlo)
            off = R.randrange(dlo, max(dlo, hi - n) + 1)
            a.update(off=off, n=n, sig_off=lo, seed=self.R.getrandbits(31), src=R.choice(self.srcs),
                     **self.sig_args())
            n_eff = n
        else:
            n = self.size_in(hi - dlo)
            off = R.randrange(dlo, max(dlo, hi - n) + 1)
            if n == 0 and op.startswith("put") and "zero_put" in self.avoid and t != r:
                n = 1
            a.update(off=off, n=n, seed=R.getrandbits(31))
            if op in ("put", "put_nb", "put_nbi"):
                a["src"] = R.choice(self.srcs + ["noncontig"] if R.random() < 0.03 else self.srcs)
                if op != "put":
                    a["lc"] = R.choice(LCS)
            elif op != "get_val":
                a["dst"] = R.choice(self.dsts)
            else:
                a["n"] = R.randrange(1, 9)
            if self.V is not None and op in VIS_OF and n > 0 and self.V.random() < 0.25:
                self.vis_form(a)
            n_eff = a["n"]
        if op not in AMOS and x < 0.07:
            a["off"] = R.choice([size - max(1, n_eff // 2), size, size + 4096, -8])
            if a["off"] == -8 and op.endswith("_val"):
                a["off"] = size
            if a["off"] == size - 1 and n_eff == 1:
                # "across the end" needs two bytes: one byte at size - 1 is in the
                # segment, in the last rank's slice, where it raced that rank's own
                # writes (seed 9137, nbrhd-rings: a FOR fetched a byte of it)
                a["off"] = size
        if s is not None and 0 <= a["off"] < s.size:
            self.flush_overlap(r, s.sid, a["off"], a["off"] + n_eff)
            if "sig_off" in a:
                self.flush_overlap(r, s.sid, a["sig_off"], a["sig_off"] + 8)
        self.emit(It("rma", r, **a))

    def operand(self, dt):
        R = self.R
        if dt in ("FLT", "DBL"):
            return float(R.randrange(-1000, 1000))
        bits = 8 * DTS[dt][1]
        if R.random() < 0.5:
            v = R.randrange(0, 1000)
        else:
            v = R.getrandbits(bits)
        if dt[0] == "I" and v >> (bits - 1):
            v -= 1 << bits
        return v

    def sig_args(self):
        R = self.R
        if R.random() < 0.5:
            self.sigctr += 1
            return {"sig_op": "SET", "sig": self.sigctr << 24}
        return {"sig_op": "ADD", "sig": R.randrange(1, 1000)}

    def sigpair(self, r):
        R = self.R
        t, h = self.aim(r, others=True)
        reg = self.region_of(r, t, h)
        if reg is None:
            return self.rma(r)
        size, (lo, hi), s = reg
        if hi - lo < 16:
            return self.rma(r)
        if "put_signal" in self.avoid:
            return self.rma(r)
        op = R.choice(SIGS)
        n = 0 if op == "signal_op" else self.size_in(hi - lo - 8)
        off = R.randrange(lo + 8, hi - n + 1)
        a = dict(h=h, t=t, op=op, off=off, n=n, sig_off=lo, seed=R.getrandbits(31),
                 src=R.choice(self.srcs), **self.sig_args())
        self.flush_overlap(r, s.sid, off, off + n)
        self.flush_overlap(r, s.sid, lo, lo + 8)
        self.emit(It("sigpair", r, **a))

    def after_finalize(self, r):
        x = self.R.random()
        if x < 0.5:
            t = self.R.randrange(self.n)
            self.emit(It("rma", r, h=("tm",), t=t, op="put", off=8, n=8, seed=1, src="bytes"))
        elif x < 0.7:
            self.emit(It("complete", r, how="quiet"))
        elif x < 0.85:
            self.emit(It("ep_create", r))
        else:
            segs = self.my_segs(r, live=False)
            if segs:
                self.emit(It("seg_destroy", r, sid=segs[0]))


#: Transports where an access to a peer's stale publication disturbed more than
#: that access or stalled (those found are fixed; plans still avoid such
#: accesses unless asked).  Over shm one stale op towards a peer's destroyed
#: endpoint held up every later op of the initiator's endpoint until
#: GEXMK_TIMEOUT (seed 619): now ops look for the target's region after each
#: barrier, and a destroyed endpoint lingers, still served, until finalize.  An
#: endpoint destroyed since raises CommunicationError within about 200 ms now,
#: over tcp and shm: seeds 528, 608, 707; before, rxm retried connecting and
#: shm's op sat in a queue nobody reads until GEXMK_TIMEOUT.  A segment unbound
#: or destroyed since is served by a retired registration, over tcp and shm
#: alike: seeds 7, 10 and 314; before, tcp took the connection down and shm
#: stalled the peer's queue.  (--stale keeps such accesses; the regressions
#: that show it.)
STALE_UNSAFE = {"ofi-tcp", "ofi-shm", "ofi-tcp-staged", "ofi-shm-staged", "ofi-tcp-rings",
                "ofi-tcp-capped", "ofi-tcp-capped-rings"}


#: Known bugs: plans on these transports leave out what trips them unless asked
#: (--known-bugs; the regressions in test_fuzz.py show each).
#:   zero_put    issue 19 item 5: a zero-length put over ofi shm never completes
#:               (TimeoutError after GEXMK_TIMEOUT)
#:   put_signal  issue 19 item 6: over ofi shm, quiet() does not complete a put_signal,
#:               nor does put_signal_nb's event (seed 3: data and signal land after
#:               the next barrier), nor does a blocking signal_op return complete
#:               (seed 12: its word is seen some time after the next barrier), nor
#:               does any blocking non-fetching atomic (seed 235, FLT SET): plans
#:               use the fetching forms towards other ranks
#:   kill        found here (seeds 104, 107, 109, 119, 139 on ofi-shm): after a peer's
#:               SIGKILL, a survivor's blocking atomic or put to another survivor can
#:               stall for good: shm completes an endpoint's answered ops (reads,
#:               delivery-complete writes, fetching atomics) in issue order, and one
#:               towards the killed process (in flight at its death, or queued
#:               before its death notice came) is never answered, so it holds up
#:               every later one of that endpoint, to any peer (ofi completion.pxi
#:               _poisoned says how it was seen).  Such an op now raises
#:               PeerDeadError 1 s after the death instead of waiting GEXMK_TIMEOUT.
#:               Since 2026-11-29 an endpoint that may hold an op towards the dead
#:               issues through a fresh libfabric endpoint from the notice on
#:               (ofi OfiEndpoint.fresh_initiator; test_ofi_faults
#:               test_shm_survivors_go_on_after_a_death): seed 139 passes 5 of 5
#:               (4 of 5 before), 109 4 of 5 (2 of 5).  Seed 119 (a blocking
#:               put issued between the death and its notice, held up behind an
#:               op to the dead) passes since such blocking puts and gets are
#:               issued again through the fresh endpoint; a held connection
#:               touch is given up after 1 s (seed 139 took 13 s).  Still
#:               failing: NB, NBI, atomic and signal ops issued between the
#:               death and its notice (4 jobs in 408 of a --known-bugs soak,
#:               2026-11-29: seeds 30148, 30199, 30254, 30406; about 40 % of jobs kill)
#:   kill        (tcp) issue 19 item 3: a barrier after a peer's SIGKILL may SIGSEGV
#:               (seed 213: in the survivors' probe of the primordial team)
#:   destroy_pending  found here, the ep.destroy() form of issue 19 item 4 (an NB op
#:               orphaned when its endpoint closes): the event of an NB op whose
#:               endpoint was then destroyed waits GEXMK_TIMEOUT and raises
#:               TimeoutError (seed 303 on ofi-tcp); plans complete a rank's
#:               operations before it destroys an endpoint
#:   finalize_pending  issue 19 item 4: finalize with an ofi NB operation in flight
#:               may SIGSEGV; plans complete everything before finalize
#: (zero_put, put_signal, kill over tcp, destroy_pending and finalize_pending are
#: fixed on main by issue 19's items 3-6: plans take them again)
KNOWN_BUGS = {
    "ofi-shm": {"kill"},
    "ofi-shm-staged": {"kill"},
}


def make_plan(seed, n, transport, length=None, stale=False, known=False, vis=True):
    """(plan, victim) of a seed (``vis``: puts and gets may take VIS forms)."""
    if length is None:
        length = 4 + seed % 5
    g = Gen(seed, n, transport, length, stale, known, vis)
    plan = g.run()
    for i, it in enumerate(plan):
        it.idx = i
    return plan, g.victim


def ranks_of(seed):
    return 2 + seed % 3


# ---- execution (each rank) ------------------------------------------------------------------

#: FUZZ_DROPS=1 (soaks only: plans and regressions are unchanged without it): every get
#: the model expects to succeed is preceded by a get_nb of the same bytes whose event and
#: destination are dropped at once -- events dropped with their ops in flight, in every
#: sequence the plans make (the conformance matrix has them alone: *_dropped)
DROPS = os.environ.get("FUZZ_DROPS") == "1"

#: seconds one item may take on a rank before its watchdog calls it a hang
ITEM_LIMIT = 2 * JOB_TIMEOUT + 15
#: ... a local item (no collective, no wait for a peer's signal)
LOCAL_LIMIT = JOB_TIMEOUT - 4
GUARD = 16


class Violation(Exception):
    pass


class Worker:
    """Runs this rank's items of a plan against gexmk and checks each against
    the model's expectation; the first difference ends the process with a
    ``FUZZ-VIOLATION`` line (exit 3), a hang with ``FUZZ-HANG`` (exit 4)."""

    def __init__(self, plan, exps, me, n, trace=False):
        self.plan, self.exps, self.me, self.n = plan, exps, me, n
        self.trace = trace
        self.cur = None             # (index, item, start time) of the item running
        self.recent = []
        self.seed = None            # for the FUZZ_SLOW_DIR file names

    # -- plumbing --

    def log(self, *a):
        print(f"[fuzz r{self.me}]", *a, file=sys.stderr, flush=True)

    def fail(self, msg):
        raise Violation(msg)

    @staticmethod
    def errclass(name):
        import builtins
        import gexmk.errors as E
        return getattr(E, name, None) or getattr(builtins, name)

    def call(self, exp, what, fn, *args, **kw):
        """Run fn under expectation exp: (result, exception or None)."""
        import gexmk
        try:
            res = fn(*args, **kw)
        except Violation:
            raise
        except BaseException as e:
            allowed = tuple(self.errclass(x) for x in exp.errs)
            if exp.kind in ("raises", "maybe") and allowed and isinstance(e, allowed):
                if self.trace:
                    self.log(f"    {what} raised {type(e).__name__}: {e}")
                return None, e
            if not isinstance(e, gexmk.GexmkError) and not (
                    isinstance(e, (TypeError, ValueError)) and "TypeError" in exp.errs):
                self.fail(f"{what} raised {type(e).__name__} (not a GexmkError): {e}")
            self.fail(f"{what} raised {type(e).__name__}: {e}; the model expects "
                      f"{exp!r}")
        if exp.kind == "raises":
            self.fail(f"{what} returned; the model expects {exp!r}")
        return res, None

    def watchdog(self):
        import faulthandler
        # FUZZ_SLOW=S: an item still running after S s (below the hang limits) is
        # reported once -- its ring states here and at the other ranks, and with
        # FUZZ_GDB_HANG this process's C stacks -- and goes on: a stall that ends
        # (a wait that times out into an error the model allows) shows too.
        # FUZZ_SLOW_DIR: those reports also go to files there (a soak drops
        # the output of jobs that pass).
        slow = float(os.environ.get("FUZZ_SLOW") or 0)
        told = None
        while True:
            time.sleep(1.0)
            cur = self.cur
            if cur is None:
                continue
            i, it, t0 = cur
            if slow and told is not cur and time.monotonic() - t0 > slow:
                told = cur
                self.slow_report(it, time.monotonic() - t0)
            # a local item never waits for a collective: it must end well before
            # a peer's collective gives up on this rank (GEXMK_TIMEOUT)
            limit = ITEM_LIMIT if it.kind in COLLECTIVES else \
                JOB_TIMEOUT + 10 if it.kind == "sigpair" else LOCAL_LIMIT
            if time.monotonic() - t0 > limit:
                print(f"FUZZ-HANG rank {self.me} item #{it.idx} ({it.kind}; hang): {it.text()} "
                      f"(over {limit} s)", flush=True)
                self.dump_recent()
                faulthandler.dump_traceback(all_threads=True)
                sys.stderr.flush()
                self.rings_report("hung")
                self.ask_rings_reports()
                if os.environ.get("FUZZ_GDB_HANG"):
                    self.gdb_stacks()       # debugging a hang: the C stacks of every thread
                os._exit(4)

    def slow_report(self, it, secs):
        self.note(f"FUZZ-SLOW rank {self.me} item #{it.idx} ({it.kind}) running for {secs:.1f} s: "
                  f"{it.text()}")
        self.rings_report(f"slow item #{it.idx}")
        self.ask_rings_reports()
        if os.environ.get("FUZZ_GDB_HANG"):
            self.gdb_stacks()

    def gdb_stacks(self):
        """The C stacks of every thread of this process (FUZZ_GDB_HANG)."""
        out = subprocess.run(["gdb", "-q", "-batch", "-p", str(os.getpid()), "-ex",
                              "thread apply all bt 25"], capture_output=True, text=True,
                             timeout=60).stdout
        self.note(out)

    def note(self, text):
        """To stderr, and with FUZZ_SLOW_DIR to this rank's file there."""
        print(text, file=sys.stderr, flush=True)
        d = os.environ.get("FUZZ_SLOW_DIR")
        if d:
            os.makedirs(d, exist_ok=True)       # a missing folder killed the watchdog thread
            with open(os.path.join(d, f"slow-{self.seed}-r{self.me}.txt"),
                      "a") as f:
                f.write(text + "\n")

    def rings_report(self, why):
        """Over ofi: this process's landing rings -- its own in peers' zones
        and its zones' -- as one FUZZ-RINGS line (OfiTransport._rings_debug;
        a hang's diagnostic, read without locks)."""
        tr = getattr(getattr(self, "c", None), "transports", {}).get("ofi")
        if tr is None or not hasattr(tr, "_rings_debug"):
            return
        try:
            rep = tr._rings_debug()
        except Exception as e:      # a diagnostic: never the cause of a failure
            rep = f"unavailable: {type(e).__name__}: {e}"
        self.note(f"FUZZ-RINGS rank {self.me} ({why}): {rep}")

    def ask_rings_reports(self):
        """Ask every other rank of the job for its rings_report, and give them
        a moment to print it."""
        asked = 0
        for name in os.listdir("."):
            m = re.fullmatch(r"fuzz-pid-(\d+)", name)
            if not m or int(m.group(1)) == self.me:
                continue
            try:
                with open(name) as f:
                    os.kill(int(f.read()), signal.SIGUSR1)
                asked += 1
            except (OSError, ValueError):
                pass
        if asked:
            time.sleep(1.5)

    def dump_recent(self):
        for i, it in self.recent[-25:]:
            print(f"[fuzz r{self.me}]   #{it.idx} {it.text()}", file=sys.stderr, flush=True)

    # -- the run --

    def run(self):
        import faulthandler
        import threading
        import gexmk
        faulthandler.enable()       # a crash shows where, before the launcher reports the signal
        print(f"FUZZ-PID rank {self.me} pid {os.getpid()}", flush=True)   # for the clean-up
        self.g = gexmk
        threading.Thread(target=self.watchdog, daemon=True).start()
        t_init = time.monotonic()
        self.c = gexmk.init()
        t_init = time.monotonic() - t_init
        if float(os.environ.get("FUZZ_SLOW") or 0) and t_init > float(os.environ["FUZZ_SLOW"]):
            self.note(f"FUZZ-SLOW rank {self.me}: gexmk.init() took {t_init:.1f} s")
        # a hung rank asks the others (SIGUSR1, through these files in the job's
        # folder) for their landing rings' state: see rings_report
        signal.signal(signal.SIGUSR1, lambda *_: self.rings_report("asked by a hung rank"))
        with open(f"fuzz-pid-{self.me}", "w") as f:
            f.write(str(os.getpid()))
        self.mk = None
        if os.environ.get("FUZZ_GPU"):
            # device segments on GPU rank % 2 (two GPUs: cross-GPU mappings too)
            for dev in (self.me % 2, 0):
                try:
                    self.mk = self.c.mk_create(gexmk.CUDA_UVA, dev)
                    break
                except gexmk.ArgumentError:
                    continue
        self.world = self.c.tm
        self.alive = None
        self.eps = {0: self.c.ep(0)}
        self.segobj = {}      # sid -> (Segment, backing array or None, guard offset)
        self.teams = {}
        self.ads = {}
        self.pend = {}        # Pend -> record
        self.region = None
        self.pairs = {}
        try:
            for i, it in enumerate(self.plan):
                exp = self.exps[i].get(self.me)
                if exp is None or exp.kind == "skip":
                    continue
                self.cur = (i, it, time.monotonic())    # one store: the watchdog reads it whole
                self.recent.append((i, it))
                if self.trace:
                    self.log(f"#{it.idx} {it.text()}  {exp!r}")
                getattr(self, "x_" + it.kind)(it, exp)
                self.cur = None
        except Violation as v:
            i, it, _ = self.cur
            m = re.search(r"raised (\w+)", str(v))
            what = f"raised {m.group(1)}" if m else "returned" if " returned" in str(v) else "data"
            print(f"FUZZ-VIOLATION rank {self.me} item #{it.idx} ({it.kind}; {what}): {it.text()}: {v}",
                  flush=True)
            self.dump_recent()
            sys.stderr.flush()
            os._exit(3)
        print(f"FUZZ-OK rank {self.me}", flush=True)

    # -- handles --

    def handle(self, h):
        """(team, rank translator) of a handle spec; raises what gexmk raises."""
        if h[0] == "tm":
            return self.c.tm, int
        if h[0] == "alive":
            al = self.alive
            return al, al.translate_jobrank_to_rank
        if h[0] == "team":
            return self.teams[h[1]], int
        key = (h[1], h[2])
        tm = self.pairs.get(key)
        if tm is None or (h[1] in self.eps and self.eps[h[1]].destroyed):
            tm = self.eps[h[1]].pair(h[2])
            self.pairs[key] = tm
        return tm, int

    def get_handle(self, exp, h, make=None):
        """The handle (or what ``make`` makes of h), or None where making it
        raised what exp allows (a pair of a destroyed endpoint raises
        StateError, as its ops would)."""
        import gexmk
        try:
            return (make or self.handle)(h)
        except gexmk.GexmkError as e:
            if exp.kind in ("raises", "maybe") and isinstance(e, tuple(map(self.errclass, exp.errs))):
                return None
            self.fail(f"making the handle {h} raised {type(e).__name__}: {e}; the model expects {exp!r}")

    def ad(self, h, tm, dt):
        key = (h, dt)
        ad = self.ads.get(key)
        if ad is None:
            ad = tm.ad_create(DTS[dt][0], self.all_ops(dt))
            self.ads[key] = ad
        return ad

    def all_ops(self, dt):
        g = self.g
        m = 0
        for o in AOPS:
            if dt in ("FLT", "DBL") and o in BITWISE:
                continue
            m |= getattr(g, "OP_" + o)
        return m

    def addr(self, tm, rank, off):
        try:
            return tm.addr(rank, 0) + off
        except self.g.GexmkError:
            return 0x10000 + max(off, 0)

    # -- local items --

    def x_ep_create(self, it, exp):
        ep, e = self.call(exp, "ep_create", self.c.ep_create)
        if e is None:
            self.eps[ep.index] = ep

    def x_seg_create(self, it, exp):
        a = it.a
        if a["client"]:
            buf = np.empty(a["size"] + 2 * GUARD, np.uint8)
            buf[:] = pattern(a["size"] + 2 * GUARD, 99, *a["sid"])
            buf[GUARD:GUARD + a["size"]] = pattern(a["size"], 77, *a["sid"])
            seg, e = self.call(exp, "segment_create(buffer=)", self.c.segment_create,
                               buffer=buf[GUARD:GUARD + a["size"]])
            if e is None:
                self.segobj[a["sid"]] = (seg, buf)
        elif self.mk is not None:
            seg, e = self.call(exp, "segment_create(kind=CUDA_UVA)", self.c.segment_create,
                               a["size"], kind=self.mk)
            if e is None:
                self.segobj[a["sid"]] = (seg, None)
        else:
            seg, e = self.call(exp, "segment_create", self.c.segment_create, a["size"])
            if e is None:
                self.segobj[a["sid"]] = (seg, None)

    def x_bind(self, it, exp):
        ep = self.eps[it.a["ep"]]
        self.call(exp, "bind_segment", ep.bind_segment, self.segobj[it.a["sid"]][0])

    def x_unbind(self, it, exp):
        self.call(exp, "unbind_segment", self.eps[it.a["ep"]].unbind_segment)

    def x_seg_destroy(self, it, exp):
        self.call(exp, "segment.destroy", self.segobj[it.a["sid"]][0].destroy)

    def x_ep_destroy(self, it, exp):
        self.call(exp, "ep.destroy", self.eps[it.a["ep"]].destroy)

    def x_kill(self, it, exp):
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    def x_region_begin(self, it, exp):
        reg = self.g.nbi_access_region()
        ev, e = self.call(exp, "nbi_access_region().__enter__", reg.__enter__)
        if e is None:
            self.region = (reg, ev)

    def x_region_end(self, it, exp):
        reg, ev = self.region
        self.region = None
        reg.__exit__(None, None, None)
        self.pend[exp.pend] = {"ev": ev}

    def x_query(self, it, exp):
        a = it.a
        got = self.get_handle(exp, a["h"])
        if got is None:
            return
        tm, tr = got
        ev, e = self.call(exp, "query_bound_segment_nb", tm.query_bound_segment_nb, tr(a["t"]))
        if e is None:
            q = ev.wait()
            if q.size != exp.extra["size"]:
                self.fail(f"query_bound_segment_nb says size {q.size}, the model "
                          f"{exp.extra['size']}")

    # -- RMA --

    def source(self, a, data):
        kind = a.get("src", "numpy")
        arr = np.frombuffer(data, np.uint8).copy()
        if kind == "bytes":
            return data, None
        if kind == "bytearray":
            b = bytearray(data)
            return b, b
        if kind == "memoryview":
            b = bytearray(data)
            return memoryview(b), b
        if kind == "numpy-u32" and len(data) % 4 == 0:
            v = arr.view("<u4")
            return v, v
        if kind == "tuple":
            return (arr.ctypes.data, arr.nbytes), arr
        if kind == "cuda":
            t = _torch().from_numpy(arr).cuda()
            return t, t
        if kind == "noncontig":
            big = np.zeros(2 * len(data) + 2, np.uint8)
            big[::2][:len(data)] = arr
            # (one byte: a 1-element strided view; it was an empty one, which moved
            # nothing where the model has the byte written: seed 20208 on every transport)
            return big[::2][:len(data)], big
        return arr, arr

    @staticmethod
    def scribble(keep):
        if keep is None:
            return
        if isinstance(keep, bytearray):
            keep[:] = b"\xee" * len(keep)
        elif not isinstance(keep, np.ndarray):
            keep.fill_(0xEE)                    # a CUDA tensor (src "cuda")
        else:
            keep[...] = 0xEE if keep.dtype.itemsize == 1 else 0xEEEEEEEE

    def dest(self, a, n):
        """(object to pass, backing array, offset of the body) of a get's dest."""
        kind = a.get("dst", "numpy")
        buf = np.frombuffer(bytearray(pattern(n + 2 * GUARD, 55, n).tobytes()), np.uint8)
        if kind == "bytearray":
            ba = bytearray(pattern(n + 2 * GUARD, 55, n).tobytes())
            buf = np.frombuffer(ba, np.uint8)
            return memoryview(ba)[GUARD:GUARD + n], buf
        if kind == "tuple":
            return (buf.ctypes.data + GUARD, n), buf
        if kind == "cuda":
            t = _torch().from_numpy(buf.copy()).cuda()
            return t[GUARD:GUARD + n], t
        return buf[GUARD:GUARD + n], buf

    def check_dest(self, what, buf, n, data, moved):
        """Guards intact; the body equal to ``data`` (expected, mask) where
        known, or untouched when nothing may have moved."""
        orig = pattern(n + 2 * GUARD, 55, n)
        if not isinstance(buf, np.ndarray):
            buf = buf.cpu().numpy()             # a CUDA tensor (dst "cuda")
        if not (np.array_equal(buf[:GUARD], orig[:GUARD]) and
                np.array_equal(buf[GUARD + n:], orig[GUARD + n:])):
            self.fail(f"{what} wrote outside its local buffer (guard bytes changed)")
        body = buf[GUARD:GUARD + n]
        if not moved:
            if not np.array_equal(body, orig[GUARD:GUARD + n]):
                self.fail(f"{what} failed yet changed its local buffer")
            return
        if data is None:
            return
        want, mask = data
        bad = np.nonzero((body != want) & mask)[0]
        if len(bad):
            k = int(bad[0])
            self.fail(f"{what} read wrong data: byte {k} of {n} is {body[k]:#04x}, the model "
                      f"{want[k]:#04x} ({len(bad)} bytes differ)")

    def settle_source(self, rec, op, lc, kw, now):
        """A put's source (rec["keep"]), once the put is done with it (``now``,
        or a put_nbi whose leaf event is waited for here): scribbled over and
        let go."""
        if op == "put_nbi" and lc == "leaf":
            kw["lc"].wait()
            now = True
        if now:
            self.scribble(rec["keep"])
            rec["keep"] = None

    def x_rma(self, it, exp):
        a = it.a
        op = a["op"]
        got = self.get_handle(exp, a["h"])
        if got is None:
            return
        tm, tr = got
        rank = tr(a["t"])
        addr = self.addr(tm, rank, a["off"]) if a["off"] >= 0 else self.addr(tm, rank, 0) + a["off"]
        what = f"{op}"
        rec = {}
        g = self.g
        if "vis" in a:
            if not self.x_vis(exp, tm, rank, addr, rec):
                return
        elif op in ("put", "put_nb", "put_nbi", "put_signal", "put_signal_nb", "put_signal_nbi"):
            data = pattern(a["n"], a["seed"]).tobytes()
            src, keep = self.source(a, data)
            kw = {}
            lc = a.get("lc", "default")
            if lc == "leaf":
                kw["lc"] = g.LeafEvent()
            elif lc != "default":
                kw["lc"] = getattr(g, "LC_" + lc)
            if op.startswith("put_signal"):
                sig = self.addr(tm, rank, a["sig_off"])
                sop = getattr(g, "SIGNAL_" + a["sig_op"])
                res, e = self.call(exp, what, getattr(tm, op), rank, addr, src, sig, a["sig"], sop)
            else:
                res, e = self.call(exp, what, getattr(tm, op), rank, addr, src, **kw)
            if e is not None:
                return
            rec.update(keep=keep, src=src, ev=res if op.endswith("_nb") else None, lc=lc, kw=kw)
            self.settle_source(rec, op, lc, kw, op in ("put", "put_signal") or (
                lc in ("default", "NOW") and op not in ("put_signal_nb", "put_signal_nbi")))
        elif op in ("put_val", "put_nb_val", "put_nbi_val"):
            res, e = self.call(exp, what, getattr(tm, op), rank, addr, a["v"], a["n"])
            if e is not None:
                return
            rec["ev"] = res if op == "put_nb_val" else None
        elif op == "get_val":
            res, e = self.call(exp, what, tm.get_val, rank, addr, a["n"])
            if e is None and exp.data is not None:
                want, mask = exp.data
                gotb = np.frombuffer(res.to_bytes(a["n"], "little"), np.uint8)
                bad = np.nonzero((gotb != want) & mask)[0]
                if len(bad):
                    self.fail(f"get_val read {gotb.tobytes().hex()}, the model {want.tobytes().hex()} "
                              f"(mask {mask.astype(int).tolist()})")
            return
        elif op in ("get", "get_nb", "get_nbi"):
            n = a["n"]
            if DROPS and exp.kind == "ok" and n:
                # FUZZ_DROPS=1: the same read into a throwaway array first, its event
                # and array dropped at once (the client keeps the array until the
                # op completes; it is nobody's data: the model is unchanged)
                try:
                    tm.get_nb(np.empty(n, np.uint8), rank, addr)
                except g.GexmkError:
                    pass
            obj, buf = self.dest(a, n)
            res, e = self.call(exp, what, getattr(tm, op), obj, rank, addr)
            if e is not None:
                self.check_dest(what, buf, n, None, moved=exp.kind == "maybe")
                return
            if op == "get":
                self.check_dest(what, buf, n, exp.data, moved=True)
                return
            rec.update(buf=buf, n=n, ev=res if op == "get_nb" else None, obj=obj)
        elif op in AMOS:
            ad = self.get_handle(exp, a["h"], lambda _: self.ad(a["h"], tm, a["dt"]))
            if ad is None:
                return
            args = [rank, addr, getattr(g, "OP_" + a["aop"])]
            if "v1" in a:
                args.append(a["v1"])
            if "v2" in a:
                args.append(a["v2"])
            if op == "amo":
                res, e = self.call(exp, what, ad.op, *args)
                if e is None:
                    self.check_fetch(exp.fetch, res, a)
                return
            if op == "amo_nb":
                res, e = self.call(exp, what, ad.op_nb, *args)
                if e is None:
                    rec["ev"] = res
            else:
                result = bytearray(DTS[a["dt"]][1]) if a["aop"] in FETCHING else None
                res, e = self.call(exp, what, ad.op_nbi, *args, result=result)
                if e is None and result is not None:
                    self.check_fetch(exp.fetch, struct.unpack(DTS[a["dt"]][2], result)[0], a)
            if e is not None:
                return
        elif op == "signal_op":
            sig = self.addr(tm, rank, a["sig_off"])
            self.call(exp, what, tm.signal_op, rank, sig, a["sig"], getattr(g, "SIGNAL_" + a["sig_op"]))
            return
        if exp.pend is not None:
            rec["what"] = f"#{self.cur[1].idx} {op}"
            self.pend[exp.pend] = rec

    def x_vis(self, exp, tm, rank, addr, rec):
        """A put or get of [addr, addr + n) as the VIS call Gen.vis_form chose;
        False when it raised (checked) or completed (checked).  A put's local
        side holds the bytes so arranged that the target ends with the plain
        put's data; a get's lands permuted and is put back in order before the
        model's check (_vis_unpermute)."""
        a = self.cur[1].a
        op, n, blk, kind = a["op"], a["n"], a["blk"], a["vis"]
        k = n // blk
        perm = np.random.default_rng(a["perm"]).permutation(k)
        form = a["form"]
        put = op.startswith("put")
        name = f"{op.split('_')[0]}_{kind}{VIS_OF[op]}"
        fn = getattr(tm, name)
        kw = {}
        if put and op != "put":
            lc = a.get("lc", "default")
            if lc == "leaf":
                kw["lc"] = self.g.LeafEvent()
            elif lc != "default":
                kw["lc"] = getattr(self.g, "LC_" + lc)
        rem = [addr + int(p) * blk for p in perm]
        if put:
            data = np.frombuffer(pattern(n, a["seed"]).tobytes(), np.uint8)
            if kind == "strided":
                # rows of blk bytes, a gap of blk after each: [row i] <- data row i
                loc = np.zeros(2 * n, np.uint8)
                loc.reshape(k, 2 * blk)[:, :blk] = data.reshape(k, blk)
            else:
                loc = data.reshape(k, blk)[perm].reshape(-1).copy()
            # (VIS lists of device blocks need the endpoint's own device kind --
            # refused otherwise, which the model does not follow: host blocks here)
            keep = loc
            base = keep.data_ptr() if not isinstance(keep, np.ndarray) else keep.ctypes.data
            if kind == "vector":
                dsts = [(r, blk) for r in rem]
                srcs = ([keep] if form == 0 and isinstance(keep, np.ndarray) else
                        [(base + i * blk, blk) for i in range(k)])
                args = (rank, dsts, srcs)
            elif kind == "indexed":
                dsts = np.array(rem, np.uint64) if form & 1 else rem
                srcs = [base] if form == 3 else (np.array([base + i * blk for i in range(k)],
                                                          np.uint64) if form & 1 else
                                                 [base + i * blk for i in range(k)])
                args = (rank, dsts, blk, srcs, n if form == 3 else blk)
            else:
                e = a["elem"]
                args = (rank, addr, [e, blk], base, [e, 2 * blk], e, [blk // e, k])
            res, err = self.call(exp, name, fn, *args, **kw)
            if err is not None:
                return False
            lc = a.get("lc", "default")
            rec.update(keep=keep, ev=res if op == "put_nb" else None, lc=lc, kw=kw)
            self.settle_source(rec, op, lc, kw, op == "put" or lc in ("default", "NOW"))
            return True
        obj, buf = self.dest(dict(a, dst="numpy") if a.get("dst") == "cuda" else a, n)
        base = buf.ctypes.data + GUARD
        if kind == "vector":
            dsts = ([(base + i * blk, blk) for i in range(k)] if form != 0 else
                    [(base, n)])     # the local side uncut: its bytes in the remote order
            args = (dsts, rank, [(r, blk) for r in rem])
        elif kind == "indexed":
            srcs = np.array(rem, np.uint64) if form & 1 else rem
            dsts = [base] if form == 3 else [base + i * blk for i in range(k)]
            args = (dsts, n if form == 3 else blk, rank, srcs, blk)
        else:
            e = a["elem"]
            perm = np.arange(k)
            args = (base, [e, blk], rank, addr, [e, blk], e, [blk // e, k])
        res, err = self.call(exp, name, fn, *args)
        if err is not None:
            self.check_dest(name, buf, n, None, moved=exp.kind == "maybe")
            return False
        if op == "get":
            self.check_dest(name, _vis_unpermute(buf, n, blk, perm), n, exp.data, moved=True)
            return False
        rec.update(buf=buf, n=n, ev=res if op == "get_nb" else None, obj=obj,
                   unperm=(blk, perm))
        return True

    def check_fetch(self, want, got, a):
        if want is None:
            return
        fmt = DTS[a["dt"]][2]
        if a["dt"] in ("FLT", "DBL"):
            same = struct.pack(fmt, got) == struct.pack(fmt, want)
        else:
            same = got == want
        if not same:
            self.fail(f"atomic {a['aop']} ({a['dt']}) fetched {got!r}, the model {want!r}")

    # -- completion --

    def finish(self, p, how_exp):
        """Post-completion checks of one pending op (its event was waited, or
        an NBI completion covered it)."""
        rec = self.pend.pop(p, None)
        if rec is None:
            return
        if "buf" in rec:
            data = (p.get[0], p.get[1]) if p.get is not None else None
            buf = rec["buf"]
            if "unperm" in rec:
                buf = _vis_unpermute(buf, rec["n"], *rec["unperm"])
            self.check_dest(rec.get("what", "get"), buf, rec["n"], data, moved=True)
        self.scribble(rec.get("keep"))

    def wait_event(self, p, exp):
        rec = self.pend.get(p)
        if rec is None or rec.get("ev") is None:
            return
        ev = rec["ev"]
        errs = Expect("maybe", tuple(sorted(set(p.errs) | set(exp.errs))), exp.why) \
            if (p.errs or exp.errs) else ok()
        lc = rec.get("lc")
        if lc == "DEFER":
            leaf, e = self.call(errs, "ev.leaf(EC_LC)", ev.leaf, self.g.EC_LC)
            if e is None:
                self.call(errs, "leaf.wait", leaf.wait)
                self.scribble(rec.get("keep"))
                rec["keep"] = None
        elif lc == "leaf" and "kw" in rec:
            self.call(errs, "LeafEvent.wait", rec["kw"]["lc"].wait)
            self.scribble(rec.get("keep"))
            rec["keep"] = None
        res, e = self.call(errs, f"{rec.get('what', 'event')}: ev.wait", ev.wait)
        if e is None and p.fetch is not None:
            self.check_fetch(p.fetch, res, self.plan[p.idx].a)
        if e is None:
            self.finish(p, exp)
        else:
            self.pend.pop(p, None)

    def x_complete(self, it, exp):
        a = it.a
        how = a["how"]
        g = self.g
        done = exp.extra.get("done", [])
        if how in ("events", "wait_all", "wait_some", "test_loop"):
            evs = [p for p in done if p.event is not None]
            if how == "wait_all" and not exp.errs:
                self.call(exp, "wait_all", g.wait_all, [self.pend[p]["ev"] for p in evs
                                                        if p in self.pend and "ev" in self.pend[p]])
            elif how == "wait_some" and not exp.errs:
                left = [p for p in evs if p in self.pend and self.pend[p].get("ev") is not None]
                while left:
                    idx, e = self.call(exp, "wait_some", g.wait_some, [self.pend[p]["ev"] for p in left])
                    if not idx:
                        self.fail("wait_some returned no index")
                    left = [p for k, p in enumerate(left) if k not in idx]
            elif how == "test_loop" and not exp.errs:
                left = [p for p in evs if p in self.pend and self.pend[p].get("ev") is not None]
                while left:
                    left = [p for p in left if not self.call(exp, "ev.test", self.pend[p]["ev"].test)[0]]
                    time.sleep(0.0005)
            for p in evs:
                self.wait_event(p, exp)
            for p in done:
                if p.event is None:
                    self.finish(p, exp)
            return
        if how == "hquiet":
            got = self.get_handle(exp, a["h"])
            if got is None:
                return
            tm = got[0]
            self.nbi_retry(exp, "tm.quiet", tm.quiet)
        else:
            fn = {"nbi_all": lambda: g.nbi_wait(g.EC_ALL), "nbi_put": lambda: g.nbi_wait(g.EC_PUT),
                  "nbi_get": lambda: g.nbi_wait(g.EC_GET), "nbi_rmw": lambda: g.nbi_wait(g.EC_RMW),
                  "quiet": g.quiet, "fence": g.fence}[how]
            self.nbi_retry(exp, how, fn)
        for p in done:
            self.finish(p, exp)

    def nbi_retry(self, exp, what, fn):
        """An NBI completion: where ops to a stale or dying target may fail it,
        it is called again (at most 3 times) until it returns."""
        for k in range(3):
            res, e = self.call(exp, what, fn)
            if e is None or exp.kind == "raises":
                return
        self.fail(f"{what} kept raising ({e!r}) after 3 calls")

    def complete_all(self, exp):
        """Before a collective: complete everything this rank has outstanding."""
        errs = exp.extra.get("complete_errs", ())
        cexp = maybe(*errs, why="completing ops to a stale or dying target") if errs else ok()
        for p in list(self.pend):
            if self.pend.get(p, {}).get("ev") is not None:
                self.wait_event(p, cexp)
        self.nbi_retry(cexp, "nbi_wait(EC_ALL) before a collective",
                       lambda: self.g.nbi_wait(self.g.EC_ALL))
        for p in list(self.pend):
            self.finish(p, cexp)

    # -- signals --

    def x_sigpair(self, it, exp):
        a = it.a
        if it.r == self.me:
            return self.x_rma(It("rma", self.me, **a), exp)
        # the target: wait for the word, then look at the data
        g = self.g
        x = exp.extra
        j = x["j"]
        tm = self.alive if x["alive"] else \
            self.call(ok() if exp.kind == "raises" else exp, "pair", self.eps[j].pair, j)[0]
        if tm is None:
            return
        seg = self.segobj[x["sid"]][0]
        _, e = self.call(exp, "wait_until", tm.wait_until, seg.address + x["sig_off"],
                         getattr(g, "CMP_" + x["cmp"]),
                         x["value"], dt=g.DT_U64, timeout=2 * JOB_TIMEOUT)
        if e is not None or exp.data is None:
            return
        off = x["off"]
        want, mask = exp.data
        mem = self.seg_bytes(x["sid"])[off:off + len(want)]
        bad = np.nonzero((mem != want) & mask)[0]
        if len(bad):
            k = int(bad[0])
            self.fail(f"the signal arrived ({x['cmp']} {x['value']}) but the data did not: byte "
                      f"{off + k} is {mem[k]:#04x}, expected {want[k]:#04x} ({len(bad)} bytes "
                      f"of {len(want)} differ)")

    def seg_bytes(self, sid):
        seg, buf = self.segobj[sid]
        if buf is not None:
            return buf[GUARD:GUARD + seg.size]
        if seg.allocation is not None:        # device memory (GPU transports)
            return _torch().from_dlpack(seg).cpu().numpy().view(np.uint8).reshape(-1)
        return np.asarray(seg)

    # -- collectives --

    def team(self, exp):
        """The team collectives run on: the primordial one, or after the
        victim's death the survivors' (after checking that the primordial
        one now raises PeerDeadError)."""
        if exp.extra.get("probe") and self.alive is not None:
            if not getattr(self, "probed", False):
                self.probed = True
                self.call(raises("PeerDeadError", why="a member of the team was killed"),
                          "tm.barrier after the kill", self.c.tm.barrier)
            return self.alive
        return self.c.tm

    def x_ad_tm(self, it, exp):
        self.complete_all(exp)
        for dt in DTS:
            self.ads[(("tm",), dt)] = self.c.tm.ad_create(DTS[dt][0], self.all_ops(dt))

    def x_split_alive(self, it, exp):
        self.complete_all(exp)
        v = it.a["victim"]
        self.alive = self.c.tm.split(None if self.me == v else 0, key=self.me)
        if self.alive is not None:
            for dt in DTS:
                self.ads[(("alive",), dt)] = self.alive.ad_create(DTS[dt][0], self.all_ops(dt))

    def x_kill_prep(self, it, exp):
        self.complete_all(exp)
        self.call(exp, "tm.barrier before the kill", self.c.tm.barrier)

    def x_check(self, it, exp):
        self.complete_all(exp)
        tm = self.team(exp)
        if it.a.get("nb"):
            ev = self.call(exp, "barrier_nb", tm.barrier_nb)[0]
            self.call(exp, "barrier_nb().wait", ev.wait)
        else:
            self.call(exp, "barrier", tm.barrier)
        for sid, (want, known, last) in exp.extra["segs"].items():
            seg, buf = self.segobj[sid]
            mem = self.seg_bytes(sid)
            bad = np.nonzero((mem != want) & known)[0]
            if len(bad):
                k = int(bad[0])
                w = [u for u in range(self.n) if slice_of(len(want), self.n, u)[0] <= k
                     < slice_of(len(want), self.n, u)[1]]
                by = self.plan[last[k]].idx if last[k] >= 0 else "none"
                self.fail(f"segment {sid} ({len(want)} B) byte {k} is {mem[k]:#04x}, the model "
                          f"{want[k]:#04x} (slice of rank {w}, last written by item "
                          f"#{by}; {len(bad)} bytes differ, at {_spans(bad)}: "
                          f"{bytes(mem[bad[:32]]).hex()})")
            if buf is not None:
                orig = pattern(len(want) + 2 * GUARD, 99, *sid)
                if not (np.array_equal(buf[:GUARD], orig[:GUARD])
                        and np.array_equal(buf[GUARD + len(want):], orig[GUARD + len(want):])):
                    self.fail(f"client segment {sid}: bytes around it changed")
        self.call(exp, "barrier", tm.barrier)

    def x_publish(self, it, exp):
        self.complete_all(exp)
        tm = self.team(exp)
        eps = [self.eps[i] for i in exp.extra["eps"]]
        self.call(exp, "publish_bound_segment", tm.publish_bound_segment, eps)

    def x_attach(self, it, exp):
        self.complete_all(exp)
        ep = self.c.ep_create()
        self.eps[ep.index] = ep
        if ep.index != exp.extra["ep"]:
            self.fail(f"ep_create gave index {ep.index}, the model {exp.extra['ep']}")
        seg, e = self.call(exp, "segment_attach", self.c.segment_attach, exp.extra["size"], ep=ep)
        self.segobj[exp.extra["sid"]] = (seg, None)

    def x_create_team(self, it, exp):
        self.complete_all(exp)
        a = it.a
        ep = self.eps[a["eps"][self.me]]
        if all(v == 0 for v in a["eps"].values()):
            tm, e = self.call(exp, "tm.dup", self.c.tm.dup)
        else:
            tm, e = self.call(exp, "tm.create_for", self.c.tm.create_for, ep)
        self.teams[a["tid"]] = tm
        for dt in DTS:
            self.ads[(("team", a["tid"]), dt)] = tm.ad_create(DTS[dt][0], self.all_ops(dt))

    def x_finalize(self, it, exp):
        if not it.a.get("leave_pending"):
            self.complete_all(exp)
        else:
            self.team(exp)
        left = [(p, rec) for p, rec in self.pend.items() if rec.get("ev") is not None]
        self.call(exp, "finalize", self.c.finalize)
        # events still pending at finalize failed with StateError (or had completed)
        for p, rec in left:
            self.call(maybe("StateError", *p.errs, why="pending at finalize"),
                      "ev.wait after finalize", rec["ev"].wait)
        self.pend = {}


def worker_main(args):
    n = int(os.environ["GEXMK_SIZE"])
    me = int(os.environ["GEXMK_RANK"])
    plan, victim = make_plan(args.seed, n, args.transport, args.length, args.stale, args.known_bugs,
                             not args.no_vis)
    plan = keep_items(plan, args.keep)
    exps = simulate(plan, n, args.transport, victim)
    w = Worker(plan, exps, me, n, trace=args.trace)
    w.seed = args.seed
    w.run()
    sys.stdout.flush()
    sys.stderr.flush()


# ---- minimised plans ------------------------------------------------------------------------

#: items a minimised plan always keeps (the job's skeleton)
FIXED = {"ad_tm", "split_alive", "kill_prep", "kill", "finalize"}


def keep_items(plan, keep):
    """The plan with only the items whose indices are in ``keep`` (a string of
    ranges "0-5,9"; None keeps all) and the fixed ones."""
    if not keep:
        return plan
    want = set()
    for part in keep.split(","):
        if "-" in part:
            a, b = part.split("-")
            want.update(range(int(a), int(b) + 1))
        elif part:
            want.add(int(part))
    return [it for i, it in enumerate(plan) if i in want or it.kind in FIXED]


def _spans(idx):
    """Index ranges of a sorted index array, as text ("12-29,40"), at most 8."""
    out = ranges(int(i) for i in idx).split(",")
    return ",".join(out[:8]) + (",..." if len(out) > 8 else "")


def ranges(idx):
    idx = sorted(idx)
    out = []
    for i in idx:
        if out and out[-1][1] == i - 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return ",".join(f"{a}-{b}" if a != b else f"{a}" for a, b in out)


# ---- the driver -----------------------------------------------------------------------------

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import mp_util  # noqa: E402  (tests/mp_util.py: bounded jobs, killed with every descendant)

#: the launcher's own limit on a job (s); the harness kills it 15 s later
JOB_LIMIT = 150


class Outcome:
    """How a job ended: ``ok``, ``reason`` (the first thing wrong) and the job."""

    def __init__(self, ok, reason, res, seed, n, transport, keep):
        self.ok, self.reason, self.res = ok, reason, res
        self.seed, self.n, self.transport, self.keep = seed, n, transport, keep

    stale = known = False
    vis = True

    def replay(self):
        k = f" --keep {self.keep}" if self.keep else ""
        k += " --stale" if self.stale else ""
        k += " --known-bugs" if self.known else ""
        k += "" if self.vis else " --no-vis"
        return (f"python tests/conformance/fuzz.py --seed {self.seed} --ranks {self.n} "
                f"--transport {self.transport}{k}")

    def report(self):
        return f"{self.reason}\nreplay: {self.replay()}\n{self.res.report()}"


def run_seed(seed, transport="nbrhd", n=None, length=None, keep=None, trace=False, tmpdir=None,
             stale=False, known=False, vis=True):
    """Run one seed as a job; an :class:`Outcome`."""
    n = n or ranks_of(seed)
    plan, victim = make_plan(seed, n, transport, length, stale, known, vis)
    plan = keep_items(plan, keep)
    killed = victim is not None and any(it.kind == "kill" for it in plan)
    # --keep-going: a rank that fails must not take down one that hangs before
    # its watchdog has said where (the others then fail fast: a dead peer)
    cmd = [sys.executable, "-m", "gexmk.run", "-n", str(n), "--timeout", str(JOB_LIMIT),
           "--keep-going"]
    if os.environ.get("FUZZ_GDB"):
        # debugging a crash: each rank under gdb, which prints the C stack where it dies
        cmd += ["--rank-prefix", "gdb -q -batch -ex run -ex bt --args"]
    cmd += [os.path.abspath(__file__), "--worker", "--seed", str(seed), "--transport", transport]
    if length is not None:
        cmd += ["--length", str(length)]
    if keep:
        cmd += ["--keep", keep]
    if trace:
        cmd.append("--trace")
    if stale:
        cmd.append("--stale")
    if known:
        cmd.append("--known-bugs")
    if not vis:
        cmd.append("--no-vis")
    env = mp_util.child_env(job_env(transport))
    env["GEXMK_TEST_TRACEBACK_AFTER"] = "0"
    with tempfile.TemporaryDirectory(prefix="gexmk-fuzz-", dir=tmpdir) as cwd:
        res = mp_util.run_command(cmd, timeout=JOB_LIMIT + 15, env=env, cwd=cwd,
                                  script=f"fuzz seed {seed}")
    clean_shm(res.stdout)
    o = Outcome(*judge(res, n, victim if killed else None), res, seed, n, transport, keep)
    o.stale, o.known, o.vis = stale, known, vis
    return o


def clean_shm(out):
    """Remove what libfabric's shm provider left in /dev/shm for the job's ranks
    that did not finalize (the victim, a rank that failed): its regions are
    named "PID:N:M" and unlinked only by the process that made them."""
    for pid in re.findall(r"FUZZ-PID rank \d+ pid (\d+)", out):
        if os.path.exists(f"/proc/{pid}"):
            continue            # (never ours to touch while it runs)
        try:
            names = os.listdir("/dev/shm")
        except OSError:
            return
        for name in names:
            if re.fullmatch(rf"{pid}:\d+:\d+", name):
                try:
                    os.unlink(os.path.join("/dev/shm", name))
                except OSError:
                    pass


def judge(res, n, victim):
    """(ok, reason) of a finished job: every rank but the victim said FUZZ-OK,
    nobody but the victim ended by a signal, nothing hung."""
    out, err = res.stdout, res.stderr
    # the first cause: a death by a signal, a hang, a violation other than
    # waiting for a peer that hung or failed, any violation
    for line in err.splitlines():
        if "was killed by" in line and "[gexmk.run]" in line:
            r = int(line.split("rank ")[1].split()[0])
            if r != victim or "SIGKILL" not in line:
                return False, line.strip()
    found = [m.group(0) for m in re.finditer(r"FUZZ-(VIOLATION|HANG) .*", out)]
    found.sort(key=lambda x: (not x.startswith("FUZZ-HANG"),
                              "TimeoutError" in x or "PeerDeadError" in x))
    if found:
        return False, found[0]
    if res.timed_out or res.returncode == 124:
        return False, "the job hung (killed at its time limit)"
    for line in err.splitlines():
        if "was killed by" in line and "[gexmk.run]" in line:
            r = int(line.split("rank ")[1].split()[0])
            if r != victim or "SIGKILL" not in line:
                return False, line.strip()
    oks = {int(x) for x in re.findall(r"FUZZ-OK rank (\d+)", out)}
    want = set(range(n)) - ({victim} if victim is not None else set())
    if oks != want:
        missing = sorted(want - oks)
        tail = [x for x in err.splitlines() if "Error" in x or "exited with" in x][-3:]
        return False, f"ranks {missing} did not finish: " + " | ".join(tail)
    if "Traceback" in err:
        return False, "a traceback on stderr"
    if victim is None and res.returncode != 0:
        return False, f"the job exited with {res.returncode}"
    if victim is not None and res.returncode not in (0, 128 + signal.SIGKILL):
        return False, f"the job exited with {res.returncode}"
    return True, "ok"


def show(seed, n, transport, length, keep, stale=False, known=False, vis=True):
    plan, victim = make_plan(seed, n, transport, length, stale, known, vis)
    plan = keep_items(plan, keep)
    exps = simulate(plan, n, transport, victim)
    print(f"# seed {seed}: {n} ranks, {transport}, victim {victim}, {len(plan)} items")
    for k, it in enumerate(plan):
        e = " ".join(f"r{r}:{x!r}" for r, x in sorted(exps[k].items()))
        print(f"#{it.idx:<4} {it.text()}   -> {e}")


def signature(reason):
    """What makes two failures the same for the minimiser: a violation's or
    hang's item kind and what went wrong ("(check; data)", "(rma; raised
    OFIError)", "(rma; hang)"), or the signal a rank died by."""
    m = re.search(r"FUZZ-\w+ rank \d+ item #\d+ (\([^)]*\))", reason)
    if m:
        return m.group(1)
    m = re.search(r"killed by (\w+)", reason)
    return m.group(1) if m else reason.split(":")[0]


def minimise(seed, n, transport, length, budget, stale=False, known=False, vis=True):
    """Delta debugging over the plan's items (ddmin, coarse to fine): the
    smallest subset found that still fails the same way (same first word of
    the reason).  Returns (keep string, Outcome)."""
    first = run_seed(seed, transport, n, length, stale=stale, known=known, vis=vis)
    if first.ok:
        print("the seed passes: nothing to minimise")
        return None, first
    sig = signature(first.reason)
    plan, victim = make_plan(seed, n, transport, length, stale, known, vis)
    cur = [i for i, it in enumerate(plan) if it.kind not in FIXED]
    best = first
    t0 = time.monotonic()
    chunks = 2
    while len(cur) >= 1 and time.monotonic() - t0 < budget:
        size = max(1, len(cur) // chunks)
        reduced = False
        for k in range(0, len(cur), size):
            trial = cur[:k] + cur[k + size:]
            o = run_seed(seed, transport, n, length, keep=ranges(trial) or "-1", stale=stale, vis=vis,
                         known=known)
            print(f"  {len(trial):4d} items: {'fails' if not o.ok else 'passes'} "
                  f"{o.reason[:100] if not o.ok else ''}", flush=True)
            if not o.ok and signature(o.reason) == sig:
                cur, best, reduced = trial, o, True
                chunks = max(chunks - 1, 2)
                break
            if time.monotonic() - t0 > budget:
                break
        if not reduced:
            if size == 1:
                break
            chunks = min(len(cur), chunks * 2)
    return ranges(cur) or "-1", best


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--ranks", type=int, choices=(2, 3, 4))
    ap.add_argument("--transport", default="nbrhd", choices=sorted(TRANSPORTS) + ["all"])
    ap.add_argument("--length", type=int, help="epochs of the plan (default: from the seed)")
    ap.add_argument("--keep", help="run only these items of the plan (minimised: '3-9,14')")
    ap.add_argument("--show", type=int, metavar="SEED", help="print the plan of SEED and exit")
    ap.add_argument("--minimise", action="store_true", help="shrink the failing plan of --seed")
    ap.add_argument("--budget", type=float, default=900, metavar="SECONDS",
                    help="--minimise: stop shrinking after this long (default 900)")
    ap.add_argument("--soak", type=float, metavar="SECONDS", help="run random seeds this long")
    ap.add_argument("--start", type=int, help="first seed of --soak (default: random)")
    ap.add_argument("--out", help="--soak: write each failing job's report into this folder")
    ap.add_argument("--trace", action="store_true", help="each rank logs every item to stderr")
    ap.add_argument("--stale", action="store_true",
                    help="over ofi too, reach peers' segments unbound or destroyed since publication")
    ap.add_argument("--known-bugs", action="store_true",
                    help="do not leave out what trips the known bugs (KNOWN_BUGS)")
    ap.add_argument("--no-vis", action="store_true",
                    help="plans without VIS forms of puts and gets (as made before they were added)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker_main(args)
    trs = sorted(t for t in TRANSPORTS if t not in GPU_OF) if args.transport == "all" \
        else [args.transport]
    if args.show is not None:
        show(args.show, args.ranks or ranks_of(args.show), trs[0], args.length, args.keep, args.stale,
             args.known_bugs, not args.no_vis)
        return 0
    if args.soak:
        return soak(args, trs)
    if args.seed is None:
        ap.error("give --seed, --show, or --soak")
    bad = 0
    for tr in trs:
        if args.minimise:
            keep, o = minimise(args.seed, args.ranks or ranks_of(args.seed), tr, args.length,
                               args.budget, args.stale, args.known_bugs, not args.no_vis)
            if keep is not None:
                print(f"minimal: --keep {keep}\n{o.reason}\nreplay: {o.replay()}")
                show(args.seed, o.n, tr, args.length, keep, args.stale, args.known_bugs,
                     not args.no_vis)
            continue
        o = run_seed(args.seed, tr, args.ranks, args.length, args.keep, args.trace, stale=args.stale,
                     known=args.known_bugs, vis=not args.no_vis)
        print(f"seed {args.seed} {tr} ({o.n} ranks): {'ok' if o.ok else 'FAILED'} "
              f"in {o.res.elapsed:.1f} s")
        if not o.ok:
            bad += 1
            print(o.report())
        elif args.trace:
            print(o.res.stderr)
    return 1 if bad else 0


def soak(args, trs):
    t_end = time.monotonic() + args.soak
    seed = args.start if args.start is not None else random.randrange(1 << 20)
    runs, failures = 0, []
    while time.monotonic() < t_end:
        for tr in trs:
            o = run_seed(seed, tr, args.ranks, args.length, stale=args.stale, known=args.known_bugs,
                         vis=not args.no_vis)
            runs += 1
            status = "ok" if o.ok else "FAILED: " + o.reason[:160]
            print(f"seed {seed:7d} {tr:15s} {o.n} ranks {o.res.elapsed:5.1f} s  {status}", flush=True)
            if not o.ok:
                failures.append(o)
                if args.out:
                    os.makedirs(args.out, exist_ok=True)
                    with open(os.path.join(args.out, f"fuzz-{tr}-{seed}.txt"), "w") as f:
                        f.write(o.report())
            if time.monotonic() >= t_end:
                break
        seed += 1
    print(f"\n{runs} jobs, {len(failures)} failed")
    for o in failures:
        print(f"  {o.replay()}\n      {o.reason[:300]}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
