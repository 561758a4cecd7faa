/* The driver's cost of what copy_gather issues per call, from C (issue 22's host
 * time per device VIS list), beside a contiguous copy:
 *     nvcc -O2 -o /tmp/launch_cost bench/diagnostics/launch_cost.c -L$CUDA_HOME/lib64/stubs -lcuda && /tmp/launch_cost
 * Medians of 2000 calls, one stream synchronise every 64 (issue time only), for:
 *   fill 1024 descriptors into pinned memory; cuMemcpyHtoDAsync of 24 KiB from it;
 *   cuLaunchKernel of a 1024-block kernel with two parameters; the three together;
 *   cuMemcpyDtoDAsync of 16 MiB (one contiguous put); cuEventRecord;
 *   cuCtxPushCurrent + cuCtxPopCurrent. */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char* s_; \
    cuGetErrorString(r_, &s_); fprintf(stderr, "%s: %s\n", #x, s_); exit(1); } } while (0)

static const char* PTX =
    ".version 6.0\n.target sm_70\n.address_size 64\n"
    ".visible .entry k(.param .u64 p, .param .u32 n)\n{\n ret;\n}\n";

static double now_ns(void) {
    struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec;
}
static int cmp(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b; return (x > y) - (x < y);
}
#define N 2000
static double t[N];
static double med(void) { qsort(t, N, sizeof(double), cmp); return t[N / 2] / 1e3; }

int main(void) {
    CUdevice dev; CUcontext ctx, c2; CUmodule mod; CUfunction fn; CUstream s; CUevent ev;
    CUdeviceptr d_desc, d_a, d_b; uint64_t* h;
    uint64_t dptr; uint32_t cnt = 1024; void* params[2] = {&dptr, &cnt};
    CK(cuInit(0)); CK(cuDeviceGet(&dev, 0)); CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CK(cuModuleLoadData(&mod, PTX)); CK(cuModuleGetFunction(&fn, mod, "k"));
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
    CK(cuMemAlloc(&d_desc, 4 * 2048 * 24)); CK(cuMemAlloc(&d_a, 64 << 20)); CK(cuMemAlloc(&d_b, 64 << 20));
    CK(cuMemHostAlloc((void**)&h, 4 * 2048 * 24, CU_MEMHOSTALLOC_PORTABLE));
    dptr = d_desc;
    const char* names[] = {"fill 1024 descriptors", "cuMemcpyHtoDAsync 24 KiB",
                           "cuLaunchKernel 1024 blocks", "fill + HtoD + launch + record",
                           "cuMemcpyDtoDAsync 16 MiB", "cuEventRecord", "push + pop"};
    for (int c = 0; c < 7; c++) {
        for (int rep = 0; rep < 2; rep++) {
            for (int i = 0; i < N; i++) {
                double a = now_ns();
                switch (c) {
                case 0: for (int j = 0; j < 1024; j++) { h[3*j] = d_a + j * 16384; h[3*j+1] = d_b + j * 16384; h[3*j+2] = 16; } break;
                case 1: CK(cuMemcpyHtoDAsync(d_desc, h, 1024 * 24, s)); break;
                case 2: CK(cuLaunchKernel(fn, 1024, 1, 1, 256, 1, 1, 0, s, params, NULL)); break;
                case 3: for (int j = 0; j < 1024; j++) { h[3*j] = d_a + j * 16384; h[3*j+1] = d_b + j * 16384; h[3*j+2] = 16; }
                        CK(cuMemcpyHtoDAsync(d_desc, h, 1024 * 24, s));
                        CK(cuLaunchKernel(fn, 1024, 1, 1, 256, 1, 1, 0, s, params, NULL));
                        CK(cuEventRecord(ev, s)); break;
                case 4: CK(cuMemcpyDtoDAsync(d_b, d_a, 16 << 20, s)); break;
                case 5: CK(cuEventRecord(ev, s)); break;
                case 6: CK(cuCtxPushCurrent(ctx)); CK(cuCtxPopCurrent(&c2)); break;
                }
                t[i] = now_ns() - a;
                if (i % 64 == 63) CK(cuStreamSynchronize(s));
            }
            CK(cuStreamSynchronize(s));
        }
        printf("  %-32s %7.2f us\n", names[c], med());
    }
    return 0;
}
