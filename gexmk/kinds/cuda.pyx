"""The CUDA_UVA memory kind, and CUDA driver probing, through ``cuda.bindings.cydriver``.

This is the one module of gexmk that cimports ``cydriver`` (C++); what it
hands the rest of the package crosses as ``uintptr_t``/``void*`` (STYLE 12).

* :class:`CudaKind` fills the ``gx_kind_ops`` table of ``gexmk/kinds/kind.pxd``
  (:meth:`CudaKind.ops_capsule`, with :attr:`CudaKind.handle` as ``kctx``):
  device memory allocated on the VMM API (growable in place, exportable as
  POSIX FDs), client memory adopted (VMM, ``cuMemAlloc`` or pool memory),
  exports mapped in a peer process, copies, host registration, pointer
  classification, streams and events.  :class:`Allocation` is the Python face
  of one ``gx_mem``.
* :func:`cuda_array_interface`, :func:`dlpack_capsule`, :func:`dlpack_device`
  hand device memory to array libraries (CuPy, PyTorch, ...).
* :func:`probe`, :func:`driver_version` and :class:`DeviceBuffer` report what
  the machine offers (``python -m gexmk.info``).

Nothing here links against ``libcuda``: cydriver loads the driver lazily on
the first call, and raises a Python exception from its loader where there is
no NVIDIA driver.  :func:`probe` turns that into a report and :class:`CudaKind`
into :class:`~gexmk.errors.UnsupportedError` ("CUDA kind unsupported on this
machine: ..."), so this module imports and answers on any machine.  Only
long-standing driver API is used (CUDA 12.x drivers and newer); attributes an
older driver does not know read as ``None``.

Sources, one ``.pxi`` per concern (``cuda.src/``): check (errors), probe,
context (the kind's C context), memory (alloc/grow/release/adopt), share
(export/import/unmap and the blob format), transfer (copy, register,
classify, streams, events), atomics (device atomics from embedded PTX),
kind (the table, CudaKind, Allocation), interop (CAI, DLPack).
"""
cimport cython
from libc.stddef cimport ptrdiff_t
from libc.stdint cimport uintptr_t, uint8_t, uint16_t, int32_t, uint32_t, int64_t, uint64_t
from libc.stdlib cimport calloc, free
from libc.string cimport memset, memcpy, memcmp
from posix.unistd cimport close
from cpython.pycapsule cimport PyCapsule_New, PyCapsule_IsValid, PyCapsule_GetPointer
from cpython.ref cimport PyObject, Py_INCREF, Py_XDECREF
from libcpp.mutex cimport mutex

from cuda.bindings cimport cydriver
from cuda.bindings.cydriver cimport (
    CUresult, CUdevice, CUcontext, CUdeviceptr, CUdevice_attribute, CUstream, CUevent,
    CUmodule, CUfunction, CUdevice_P2PAttribute, CUmemGenericAllocationHandle,
    CUmemAllocationProp, CUmemAccessDesc, CUmemAllocationHandleType, CUpointer_attribute,
    CUipcMemHandle, CUDA_SUCCESS, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NO_DEVICE)

from gexmk.kinds.kind cimport (
    gx_kind_ops, gx_mem, gx_export, GX_KIND_MAX_FDS, GX_KIND_BLOB, GX_MEM_LIBRARY,
    GX_MEM_CLIENT, GX_MEM_IMPORTED, GX_MEM_EXPORTABLE, GX_MEM_HOST_REGISTERED,
    GX_WAITV_GEQ, GX_WAITV_EQ, GX_WAITV_AND, GX_WAITV_NOR, gx_host_fn)
from gexmk.lib.gx cimport (
    GX_MK_HOST, GX_MK_CUDA_UVA, gx_val, gx_dt_size, gx_op_valid,
    GX_DT_I32, GX_DT_U32, GX_DT_I64, GX_DT_U64, GX_DT_FLT, GX_DT_DBL, GX_DT_COUNT,
    GX_OP_SET, GX_OP_GET, GX_OP_SWAP, GX_OP_CAS, GX_OP_FCAS, GX_OP_ADD, GX_OP_FADD, GX_OP_SUB,
    GX_OP_FSUB, GX_OP_INC, GX_OP_FINC, GX_OP_DEC, GX_OP_FDEC, GX_OP_AND, GX_OP_FAND, GX_OP_OR,
    GX_OP_FOR, GX_OP_XOR, GX_OP_FXOR, GX_OP_MIN, GX_OP_FMIN, GX_OP_MAX, GX_OP_FMAX)

import operator
import os
import weakref

from gexmk.errors import CUDAError, ArgumentError, StateError, UnsupportedError
from gexmk.config import env_int

__all__ = ["CudaKind", "Allocation", "cuda_array_interface", "dlpack_capsule", "dlpack_device",
           "probe", "DeviceBuffer", "driver_version", "atomic_ptx", "pointer_attributes",
           "dlpack_range"]


include "cuda.src/check.pxi"
include "cuda.src/probe.pxi"
include "cuda.src/context.pxi"
include "cuda.src/memory.pxi"
include "cuda.src/share.pxi"
include "cuda.src/transfer.pxi"
include "cuda.src/atomics.pxi"
include "cuda.src/vis.pxi"
include "cuda.src/kind.pxi"
include "cuda.src/interop.pxi"
