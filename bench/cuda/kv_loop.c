/* kv_loop.c - the C baseline of bench/vis.py's KV-cache shape: n copies of blk
 * bytes, each one cuMemcpyAsync on one stream, then one cuStreamSynchronize
 * (kv_loop), or one cuMemcpyBatchAsync + sync where the driver has it
 * (kv_batch, CUDA 12.8+; returns CUDA_ERROR_NOT_FOUND/NOT_SUPPORTED without).
 * Loaded by ctypes into a process that already holds the device's primary
 * context (gexmk's CUDA kind): the destination is the peer segment as mapped
 * here (tm.peer_view), the sources lie in this process's own device segment.
 * Build: gcc -O2 -shared -fPIC -I<cuda include> kv_loop.c -o kv_loop.so -lcuda */
#include <cuda.h>
#include <stdint.h>
#include <stddef.h>

static CUstream stream;

int kv_init(int device)
{
    CUdevice dev;
    CUcontext ctx;
    CUresult rc = cuInit(0);
    if (rc == CUDA_SUCCESS) rc = cuDeviceGet(&dev, device);
    if (rc == CUDA_SUCCESS) rc = cuDevicePrimaryCtxRetain(&ctx, dev);
    if (rc == CUDA_SUCCESS) rc = cuCtxSetCurrent(ctx);
    if (rc == CUDA_SUCCESS && stream == NULL) rc = cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING);
    return (int)rc;
}

int kv_loop(uint64_t dst, uint64_t src, const uint64_t *doff, const uint64_t *soff, size_t blk,
            int n)
{
    CUresult rc = CUDA_SUCCESS;
    for (int i = 0; i < n && rc == CUDA_SUCCESS; i++)
        rc = cuMemcpyAsync((CUdeviceptr)(dst + doff[i]), (CUdeviceptr)(src + soff[i]), blk, stream);
    if (rc == CUDA_SUCCESS)
        rc = cuStreamSynchronize(stream);
    return (int)rc;
}

int kv_batch(const uint64_t *dsts, const uint64_t *srcs, size_t *sizes, int n)
{
#if CUDA_VERSION >= 12080
    CUmemcpyAttributes attr = {0};
    size_t idx = 0;
    CUresult rc;
    attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
#if CUDA_VERSION >= 13000
    rc = cuMemcpyBatchAsync((CUdeviceptr *)dsts, (CUdeviceptr *)srcs, sizes, (size_t)n, &attr,
                            &idx, 1, stream);
#else
    size_t fail = 0;
    rc = cuMemcpyBatchAsync((CUdeviceptr *)dsts, (CUdeviceptr *)srcs, sizes, (size_t)n, &attr,
                            &idx, 1, &fail, stream);
#endif
    if (rc == CUDA_SUCCESS)
        rc = cuStreamSynchronize(stream);
    return (int)rc;
#else
    (void)dsts; (void)srcs; (void)sizes; (void)n;
    return (int)CUDA_ERROR_NOT_SUPPORTED;
#endif
}
