"""Core objects of gexmk: client, endpoints, teams, events, RMA and atomics.

The data path is the C header include/gexmk/gexmk.h: a team is an array of
pointers to *targets*, the process-wide record of what one remote endpoint has
published to this process (GASNet-EX: rights belong to the pair (local process,
remote endpoint)).  A put to a mapped target is a bounds check and a memcpy; a
target that is not CPU-mapped here takes the slow path: the route chosen for
it at publication, a transport's table of nogil C functions (see
``gexmk/transports/``), and every error is reported from the slow path, so
the fast path carries no Python work at all.  The core names no transport:
they register themselves (``gexmk.transports.REGISTRY``).

Ordering and visibility (NVSHMEM's rules, seeds/001): a blocking put or get is
complete when it returns; an NB or NBI operation is complete when its event
completes or ``nbi_wait``/``quiet`` returns; ``fence`` orders every earlier put
and atomic of the calling thread before every later one to the same target;
``quiet`` completes them.  Atomics are atomic with respect to other gexmk
atomics on the same object (from any process of the node), not with respect
to plain puts or local stores to it.
"""
import atexit
import collections
import hashlib
import importlib
import numbers
import os
import pickle
import struct
import threading
import time
import types
import warnings
import weakref
from collections import namedtuple

from cpython.buffer cimport PyBuffer_Release
from cpython.bytearray cimport PyByteArray_AS_STRING
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING
from cpython.ref cimport PyObject, Py_INCREF, Py_DECREF
from cpython.long cimport PyLong_AsUnsignedLongLongMask
from libc.stdint cimport uintptr_t, int32_t, uint32_t, int64_t, uint64_t
from libc.math cimport isinf
from libc.stdlib cimport calloc, free
from libc.string cimport memset
from posix.stdlib cimport posix_memalign

from gexmk.lib.gx cimport *
from gexmk.lib.linux cimport sched_yield
from gexmk.memory cimport Segment, MemoryKind, host_buffer
from gexmk.kinds.kind cimport gx_kind_ops, GX_WAITV_GEQ, GX_WAITV_EQ
from cpython.pycapsule cimport PyCapsule_GetPointer

from gexmk.memory import (HOST, mk_create as _mk_create, describe_kind as _describe_kind,
                          device_range as _device_range, cai_sync as _cai_sync,
                          pointer_attributes as _pointer_attributes_raw, infer_kind as _infer_kind,
                          is_cuda_dlpack as _is_cuda_dlpack)
from gexmk.errors import (ArgumentError, BoundsError, RankError, StateError, SegmentError,
                          UnsupportedError, PeerDeadError, GexmkError)

# ---- constants (GASNet-EX names without the GEX_ prefix) --------------------

EP_CAPABILITY_RMA = 1          #: GEX_EP_CAPABILITY_RMA
EP_CAPABILITY_ALL = 1          #: everything this build offers

LC_NOW = 0                     #: lc_opt GEX_EVENT_NOW: source reusable on return
LC_DEFER = 1                   #: GEX_EVENT_DEFER: local completion via ev.leaf(EC_LC)
LC_GROUP = 2                   #: GEX_EVENT_GROUP: local completion via nbi_wait(EC_PUT, ...)

EC_GET = 1                     #: NBI event categories (GEX_EC_*)
EC_PUT = 2
EC_RMW = 4
EC_ALL = EC_GET | EC_PUT | EC_RMW
EC_LC = 8                      #: leaf: local completion of a put

DT_I32 = GX_DT_I32
DT_U32 = GX_DT_U32
DT_I64 = GX_DT_I64
DT_U64 = GX_DT_U64
DT_FLT = GX_DT_FLT
DT_DBL = GX_DT_DBL
_DT_NAMES = {DT_I32: "I32", DT_U32: "U32", DT_I64: "I64", DT_U64: "U64", DT_FLT: "FLT", DT_DBL: "DBL"}
_DT_FORMATS = {DT_I32: "i", DT_U32: "I", DT_I64: "q", DT_U64: "Q", DT_FLT: "f", DT_DBL: "d"}

# Op flags are single bits, combined with | into an atomic domain's op set.
OP_SET = 1 << GX_OP_SET
OP_GET = 1 << GX_OP_GET
OP_SWAP = 1 << GX_OP_SWAP
OP_CAS = 1 << GX_OP_CAS
OP_FCAS = 1 << GX_OP_FCAS
OP_ADD = 1 << GX_OP_ADD
OP_FADD = 1 << GX_OP_FADD
OP_SUB = 1 << GX_OP_SUB
OP_FSUB = 1 << GX_OP_FSUB
OP_INC = 1 << GX_OP_INC
OP_FINC = 1 << GX_OP_FINC
OP_DEC = 1 << GX_OP_DEC
OP_FDEC = 1 << GX_OP_FDEC
OP_AND = 1 << GX_OP_AND
OP_FAND = 1 << GX_OP_FAND
OP_OR = 1 << GX_OP_OR
OP_FOR = 1 << GX_OP_FOR
OP_XOR = 1 << GX_OP_XOR
OP_FXOR = 1 << GX_OP_FXOR
OP_MIN = 1 << GX_OP_MIN
OP_FMIN = 1 << GX_OP_FMIN
OP_MAX = 1 << GX_OP_MAX
OP_FMAX = 1 << GX_OP_FMAX
_OP_NAMES = {OP_SET: "OP_SET", OP_GET: "OP_GET", OP_SWAP: "OP_SWAP", OP_CAS: "OP_CAS",
             OP_FCAS: "OP_FCAS", OP_ADD: "OP_ADD", OP_FADD: "OP_FADD", OP_SUB: "OP_SUB",
             OP_FSUB: "OP_FSUB", OP_INC: "OP_INC", OP_FINC: "OP_FINC", OP_DEC: "OP_DEC",
             OP_FDEC: "OP_FDEC", OP_AND: "OP_AND", OP_FAND: "OP_FAND", OP_OR: "OP_OR",
             OP_FOR: "OP_FOR", OP_XOR: "OP_XOR", OP_FXOR: "OP_FXOR", OP_MIN: "OP_MIN",
             OP_FMIN: "OP_FMIN", OP_MAX: "OP_MAX", OP_FMAX: "OP_FMAX"}
_FETCHING = (OP_GET | OP_SWAP | OP_FCAS | OP_FADD | OP_FSUB | OP_FINC | OP_FDEC | OP_FAND
             | OP_FOR | OP_FXOR | OP_FMIN | OP_FMAX)
_BITWISE = OP_AND | OP_FAND | OP_OR | OP_FOR | OP_XOR | OP_FXOR
_ALL_OPS = (1 << GX_OP_COUNT) - 1
# ops that take no operand (INC/DEC/GET) and that take two (CAS)
_NO_OPERAND = OP_GET | OP_INC | OP_FINC | OP_DEC | OP_FDEC
_TWO_OPERANDS = OP_CAS | OP_FCAS
# the same masks as C ints: tested on every atomic without touching Python objects
cdef int _C_FETCHING = _FETCHING
cdef int _C_NO_OPERAND = _NO_OPERAND
cdef int _C_TWO_OPERANDS = _TWO_OPERANDS
cdef int _C_ALL_OPS = _ALL_OPS

BoundSegment = namedtuple("BoundSegment", "address size local_address kind transport")
BoundSegment.__doc__ = """What query_bound_segment_nb reports of a remote bound segment:
address and size in the owner's address space, the address where it is mapped
here (None when not mapped), its memory kind and the transport that reaches it."""

# Copies at least this long release the GIL (shorter ones cost less than a GIL round trip).
cdef size_t _NOGIL_BYTES = 64 * 1024
# An LC_NOW put_nb of a host source at most this long that a transport carries
# (not a CPU mapping) copies the source and returns at once, as GASNet-EX
# conduits do for GEX_EVENT_NOW; a longer one waits for the put to complete.
cdef size_t _PUT_NB_COPY = 64 * 1024

cdef object _client = None     # the one live Client of this process


include "core.src/args.pxi"
include "core.src/event.pxi"
include "core.src/dispatch.pxi"
include "core.src/client.pxi"
include "core.src/endpoint.pxi"
include "core.src/vis.pxi"
include "core.src/vis_args.pxi"
include "core.src/vis_arrays.pxi"
include "core.src/team.pxi"
include "core.src/atomic.pxi"
include "core.src/signal.pxi"
include "core.src/coll.pxi"
include "core.src/reduce.pxi"
