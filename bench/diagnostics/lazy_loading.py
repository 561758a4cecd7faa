"""Does loading a kernel wait for a stream that waits on a memory word?  The driver API
alone, no gexmk: a non-blocking stream waits (cuStreamWaitValue64) for a device word
to become 1; a second thread then loads a module from PTX and gets its function, as a
library's first kernel does; the main thread waits up to --hold seconds for that to
return, then sets the word.  The word is mapped pinned host memory, set by a CPU store:
while a load waits, other driver calls of the context may wait behind it.

If the load returns only after the word is set, a process that posts such a wait
and then loads the kernel that would set the word deadlocks (why gexmk's CUDA kind
loads its kernels before posting a stream wait).  Run it under both module loading
modes: ``CUDA_MODULE_LOADING=LAZY python bench/diagnostics/lazy_loading.py`` and
``CUDA_MODULE_LOADING=EAGER ...``.  Needs a GPU and cuda-bindings."""
import argparse
import ctypes
import faulthandler
import os
import threading
import time

import numpy as np
from cuda.bindings import driver as cu

_PTX = b""".version 6.0
.target sm_70
.address_size 64
.visible .entry gx_probe_set(.param .u64 p)
{
    .reg .u64 %a;
    .reg .u32 %v;
    ld.param.u64 %a, [p];
    mov.u32 %v, 1;
    st.global.u32 [%a], %v;
    ret;
}
"""


def _ok(r):
    """A driver call's values, its error raised."""
    err, *vals = r if isinstance(r, tuple) else (r,)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"driver call failed: {err}")
    return vals[0] if len(vals) == 1 else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hold", type=float, default=5.0)
    a = ap.parse_args()
    faulthandler.dump_traceback_later(a.hold + 40, exit=True)    # a hang shows where
    _ok(cu.cuInit(0))
    dev = _ok(cu.cuDeviceGet(0))
    ctx = _ok(cu.cuDevicePrimaryCtxRetain(dev))
    _ok(cu.cuCtxSetCurrent(ctx))
    mode = _ok(cu.cuModuleGetLoadingMode())
    host = _ok(cu.cuMemHostAlloc(64, cu.CU_MEMHOSTALLOC_DEVICEMAP | cu.CU_MEMHOSTALLOC_PORTABLE))
    word = np.frombuffer((ctypes.c_char * 64).from_address(int(host)), np.uint64)
    word[:] = 0
    dptr = _ok(cu.cuMemHostGetDevicePointer(host, 0))
    waiting = _ok(cu.cuStreamCreate(int(cu.CUstream_flags.CU_STREAM_NON_BLOCKING)))
    _ok(cu.cuStreamWaitValue64(waiting, dptr, 1, int(cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ)))
    done = {}

    def load():
        _ok(cu.cuCtxSetCurrent(ctx))
        t0 = time.monotonic()
        mod = _ok(cu.cuModuleLoadData(_PTX))
        done["module"] = time.monotonic() - t0
        _ok(cu.cuModuleGetFunction(mod, b"gx_probe_set"))
        done["function"] = time.monotonic() - t0

    th = threading.Thread(target=load, daemon=True)
    t0 = time.monotonic()
    th.start()
    th.join(a.hold)
    held = th.is_alive()
    t_set = time.monotonic() - t0
    word[0] = 1
    th.join(30)
    print(f"CUDA_MODULE_LOADING={os.environ.get('CUDA_MODULE_LOADING', '(unset)')} "
          f"mode={mode.name}: load {'HELD' if held else 'returned'} while the stream waited; "
          f"module {done.get('module', float('nan')) * 1e3:.1f} ms, "
          f"function {done.get('function', float('nan')) * 1e3:.1f} ms after start; "
          f"word set at {t_set * 1e3:.0f} ms; loader {'still blocked' if th.is_alive() else 'done'}",
          flush=True)
    _ok(cu.cuStreamSynchronize(waiting))


if __name__ == "__main__":
    main()
