/* driver_baseline.c - the C (CUDA driver API) baselines of issue 9, for the
 * GPU benches (bench/cuda_baseline.py builds it at bench time with
 * `gcc -O2 -I<cuda.h dir> driver_baseline.c -lcuda`).
 *
 *     driver_baseline [iters] [device] [owner_device]
 *
 * Two processes, as gexmk's same-node path: the owner allocates a VMM
 * segment (cuMemCreate, POSIX-FD handle) on owner_device (default: device)
 * and sends the FD over a Unix socket (SCM_RIGHTS); the importer, on device,
 * imports and maps it (cuMemImportFromShareableHandle, cuMemMap,
 * cuMemSetAccess on its own device only: with two GPUs the copies below run
 * over NVLink from the importer's GPU, as gexmk's do) and times, each the median of
 * `iters` (the 64 MiB copies: of iters / 20, at least 5):
 *   import_1GiB_ms    3 fresh 1 GiB allocations of the owner imported one after the
 *                     other: [import, reserve + map, set access] in ms, each
 *   dtod8_us          8 B cuMemcpyDtoDAsync (local VMM -> imported) + cuStreamSynchronize
 *   dtod8_generic_us  the same by cuMemcpyAsync (UVA: the driver tells the kinds apart)
 *   dtod8_generic_pushpop_us  ... between cuCtxPushCurrent and cuCtxPopCurrent (as gexmk's kind)
 *   htod8_pinned_us   8 B cuMemcpyHtoDAsync from cuMemHostAlloc'd memory + sync
 *   htod8_pinned_generic_us   the same by cuMemcpyAsync (UVA)
 *   htod8_registered_us, htod8_registered_generic_us   from a cuMemHostRegister'ed page
 *   wv64_us, wv32_us  cuStreamWriteValue64 / 32 into the mapping + sync
 *   kernel8_us        a one-thread kernel copying 8 B local -> imported + sync
 *   sync_us           a bare cuStreamSynchronize of an idle stream
 *   dtod64m_imported_GBps  64 MiB cuMemcpyDtoDAsync into the imported mapping + sync
 *   dtod64m_imported_pipe_GBps  PIPE (20) such copies back to back, one synchronise
 *   htod64m_pinned_imported_pipe_GBps  the same from cuMemHostAlloc'd memory
 *   dtod64m_local_GBps     the same between two allocations of this process
 *   htod64m_pageable_GBps  64 MiB cuMemcpyHtoD from malloc'd (touched) memory
 *   htod64m_pinned_GBps    the same from cuMemHostAlloc'd memory
 *   dtoh64m_pageable_GBps, dtoh64m_pinned_GBps   and back
 * and prints one JSON object on stdout.  Exit status 0 on success; a failed
 * driver call prints its name and code on stderr and exits 2.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CK(call) do { CUresult rc_ = (call); if (rc_ != CUDA_SUCCESS) { \
    const char *s_ = NULL; cuGetErrorName(rc_, &s_); \
    fprintf(stderr, "driver_baseline: %s failed: %s (%d)\n", #call, s_ ? s_ : "?", (int)rc_); \
    exit(2); } } while (0)

#define SEG (64u << 20)
#define PIPE 20                 /* copies per pipelined stream */
#define BIG ((size_t)1 << 30)   /* the large allocations whose import is timed */
#define BIGN 3

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, n, sizeof *v, cmp);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* A one-thread kernel: *(u64*)dst = *(u64*)src. */
static const char COPY8_PTX[] =
    ".version 7.0\n.target sm_70\n.address_size 64\n"
    ".visible .entry copy8(.param .u64 dst, .param .u64 src)\n{\n"
    "  .reg .b64 %r<4>;\n"
    "  ld.param.u64 %r0, [dst];\n  ld.param.u64 %r1, [src];\n"
    "  cvta.to.global.u64 %r0, %r0;\n  cvta.to.global.u64 %r1, %r1;\n"
    "  ld.global.u64 %r2, [%r1];\n  st.global.u64 [%r0], %r2;\n  ret;\n}\n";

static int send_fd(int sock, int fd)
{
    char byte = 'F';
    struct iovec iov = { &byte, 1 };
    char ctl[CMSG_SPACE(sizeof(int))];
    struct msghdr msg = {0};
    msg.msg_iov = &iov; msg.msg_iovlen = 1;
    msg.msg_control = ctl; msg.msg_controllen = sizeof ctl;
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET; c->cmsg_type = SCM_RIGHTS; c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof(int));
    return sendmsg(sock, &msg, 0) == 1 ? 0 : -1;
}

static int recv_fd(int sock)
{
    char byte;
    struct iovec iov = { &byte, 1 };
    char ctl[CMSG_SPACE(sizeof(int))];
    struct msghdr msg = {0};
    int fd = -1;
    msg.msg_iov = &iov; msg.msg_iovlen = 1;
    msg.msg_control = ctl; msg.msg_controllen = sizeof ctl;
    if (recvmsg(sock, &msg, 0) != 1)
        return -1;
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    if (c == NULL || c->cmsg_type != SCM_RIGHTS)
        return -1;
    memcpy(&fd, CMSG_DATA(c), sizeof(int));
    return fd;
}

static CUmemAllocationProp prop_for(int device)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = device;
    p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    return p;
}

/* Reserve, map and give `device` access to `h`: the address. */
static CUdeviceptr map_handle(CUmemGenericAllocationHandle h, size_t size, int device)
{
    CUdeviceptr p;
    CUmemAccessDesc acc;
    CK(cuMemAddressReserve(&p, size, 0, 0, 0));
    CK(cuMemMap(p, size, 0, h, 0));
    memset(&acc, 0, sizeof acc);
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = device;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CK(cuMemSetAccess(p, size, &acc, 1));
    return p;
}

static size_t rounded(int device)
{
    CUmemAllocationProp p = prop_for(device);   /* SEG rounded up to device's granularity */
    size_t g;
    CK(cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    return (SEG + g - 1) / g * g;
}

static int owner(int sock, int device)
{
    CUdevice dev;
    CUcontext ctx;
    CUmemGenericAllocationHandle h;
    int fd;
    char done;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, device));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    size_t size = rounded(device);
    CUmemAllocationProp p = prop_for(device);
    CK(cuMemCreate(&h, size, &p, 0));
    CUdeviceptr base = map_handle(h, size, device);
    CK(cuMemsetD8(base, 0, size));
    CK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    if (send_fd(sock, fd) != 0) {
        perror("driver_baseline: sendmsg");
        return 2;
    }
    close(fd);
    /* BIGN fresh 1 GiB allocations, exported one after the other: the
     * importer times the import of each (first-import cost across GPUs) */
    CUmemGenericAllocationHandle bh[BIGN];
    CUdeviceptr bb[BIGN];
    for (int b = 0; b < BIGN; b++) {
        CK(cuMemCreate(&bh[b], BIG, &p, 0));
        bb[b] = map_handle(bh[b], BIG, device);
        CK(cuMemsetD8(bb[b], 0, BIG));
        CK(cuMemExportToShareableHandle(&fd, bh[b], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
        if (send_fd(sock, fd) != 0) {
            perror("driver_baseline: sendmsg");
            return 2;
        }
        close(fd);
    }
    if (read(sock, &done, 1) != 1)      /* the importer has finished */
        done = 0;
    for (int b = 0; b < BIGN; b++) {
        CK(cuMemUnmap(bb[b], BIG));
        CK(cuMemAddressFree(bb[b], BIG));
        CK(cuMemRelease(bh[b]));
    }
    CK(cuMemUnmap(base, size));
    CK(cuMemAddressFree(base, size));
    CK(cuMemRelease(h));
    CK(cuDevicePrimaryCtxRelease(dev));
    return 0;
}

static int importer(int sock, int device, int odev, int iters)
{
    CUdevice dev;
    CUcontext ctx;
    CUstream s;
    CUmemGenericAllocationHandle h, mine_h;
    CUmodule mod;
    CUfunction copy8;
    int fd = recv_fd(sock), i, big = iters / 20 < 5 ? 5 : iters / 20;
    double *t = malloc(sizeof(double) * (iters > big ? iters : big)), t0;
    if (fd < 0) {
        fprintf(stderr, "driver_baseline: no FD from the owner\n");
        return 2;
    }
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, device));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    size_t size = rounded(device), psize = rounded(odev);
    t0 = now_us();
    CK(cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd,
                                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    CUdeviceptr peer = map_handle(h, psize, device);
    double import_ms = (now_us() - t0) * 1e-3;
    close(fd);
    /* the owner's 1 GiB allocations: import, reserve + map, set access, each timed */
    double big_ms[BIGN][3];
    CUdeviceptr bigp[BIGN];
    CUmemGenericAllocationHandle bigh[BIGN];
    for (int b = 0; b < BIGN; b++) {
        int bfd = recv_fd(sock);
        CUmemAccessDesc acc;
        if (bfd < 0) {
            fprintf(stderr, "driver_baseline: no FD for 1 GiB allocation %d\n", b);
            return 2;
        }
        double a = now_us();
        CK(cuMemImportFromShareableHandle(&bigh[b], (void *)(uintptr_t)bfd,
                                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
        double m = now_us();
        CK(cuMemAddressReserve(&bigp[b], BIG, 0, 0, 0));
        CK(cuMemMap(bigp[b], BIG, 0, bigh[b], 0));
        double x = now_us();
        memset(&acc, 0, sizeof acc);
        acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        acc.location.id = device;
        acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        CK(cuMemSetAccess(bigp[b], BIG, &acc, 1));
        double e = now_us();
        big_ms[b][0] = (m - a) * 1e-3;
        big_ms[b][1] = (x - m) * 1e-3;
        big_ms[b][2] = (e - x) * 1e-3;
        close(bfd);
    }
    CUmemAllocationProp p = prop_for(device);
    CK(cuMemCreate(&mine_h, size, &p, 0));
    CUdeviceptr mine = map_handle(mine_h, size, device);
    CUdeviceptr mine2;
    CK(cuMemAlloc(&mine2, SEG));
    CK(cuMemsetD8(mine, 1, size));
    void *pinned, *pinned_big, *pageable = malloc(SEG);
    memset(pageable, 3, SEG);
    CK(cuMemHostAlloc(&pinned, 8, 0));
    CK(cuMemHostAlloc(&pinned_big, SEG, 0));
    memset(pinned_big, 4, SEG);
    CK(cuModuleLoadData(&mod, COPY8_PTX));
    CK(cuModuleGetFunction(&copy8, mod, "copy8"));

#define TIME(n, body) do { for (i = 0; i < (n) + 3; i++) { \
        double a_ = now_us(); body; if (i >= 3) t[i - 3] = now_us() - a_; } } while (0)

    printf("{\"iters\": %d, \"device\": %d, \"owner_device\": %d, \"import_map_64MiB_ms\": %.4f",
           iters, device, odev, import_ms);
    printf(", \"import_1GiB_ms\": [");
    for (int b = 0; b < BIGN; b++)
        printf("%s[%.3f, %.3f, %.3f]", b ? ", " : "", big_ms[b][0], big_ms[b][1], big_ms[b][2]);
    printf("]");
    for (int b = 0; b < BIGN; b++) {
        CK(cuMemUnmap(bigp[b], BIG));
        CK(cuMemAddressFree(bigp[b], BIG));
        CK(cuMemRelease(bigh[b]));
    }
    TIME(iters, { CK(cuMemcpyDtoDAsync(peer, mine, 8, s)); CK(cuStreamSynchronize(s)); });
    printf(", \"dtod8_us\": %.3f", median(t, iters));
    TIME(iters, { CK(cuMemcpyAsync(peer, mine, 8, s)); CK(cuStreamSynchronize(s)); });
    printf(", \"dtod8_generic_us\": %.3f", median(t, iters));
    TIME(iters, { CUcontext c_; CK(cuCtxPushCurrent(ctx)); CK(cuMemcpyAsync(peer, mine, 8, s));
                  CK(cuStreamSynchronize(s)); CK(cuCtxPopCurrent(&c_)); });
    printf(", \"dtod8_generic_pushpop_us\": %.3f", median(t, iters));
    TIME(iters, { CK(cuMemcpyHtoDAsync(peer, pinned, 8, s)); CK(cuStreamSynchronize(s)); });
    printf(", \"htod8_pinned_us\": %.3f", median(t, iters));
    TIME(iters, { CK(cuMemcpyAsync(peer, (CUdeviceptr)(uintptr_t)pinned, 8, s));
                  CK(cuStreamSynchronize(s)); });
    printf(", \"htod8_pinned_generic_us\": %.3f", median(t, iters));
    {
        void *page = NULL;
        if (posix_memalign(&page, 4096, 4096) != 0)
            exit(2);
        CK(cuMemHostRegister(page, 4096, CU_MEMHOSTREGISTER_PORTABLE));
        TIME(iters, { CK(cuMemcpyHtoDAsync(peer, page, 8, s)); CK(cuStreamSynchronize(s)); });
        printf(", \"htod8_registered_us\": %.3f", median(t, iters));
        TIME(iters, { CK(cuMemcpyAsync(peer, (CUdeviceptr)(uintptr_t)page, 8, s));
                      CK(cuStreamSynchronize(s)); });
        printf(", \"htod8_registered_generic_us\": %.3f", median(t, iters));
        CK(cuMemHostUnregister(page));
        free(page);
    }
    TIME(iters, { CK(cuStreamWriteValue64(s, peer, 7, CU_STREAM_WRITE_VALUE_DEFAULT));
                  CK(cuStreamSynchronize(s)); });
    printf(", \"wv64_us\": %.3f", median(t, iters));
    TIME(iters, { CK(cuStreamWriteValue32(s, peer, 7, CU_STREAM_WRITE_VALUE_DEFAULT));
                  CK(cuStreamSynchronize(s)); });
    printf(", \"wv32_us\": %.3f", median(t, iters));
    {
        void *args[2] = { &peer, &mine };
        TIME(iters, { CK(cuLaunchKernel(copy8, 1, 1, 1, 1, 1, 1, 0, s, args, NULL));
                      CK(cuStreamSynchronize(s)); });
        printf(", \"kernel8_us\": %.3f", median(t, iters));
    }
    TIME(iters, { CK(cuStreamSynchronize(s)); });
    printf(", \"sync_us\": %.3f", median(t, iters));
    TIME(iters, { CK(cuMemcpyDtoDAsync(peer, mine, 8, s)); });
    CK(cuStreamSynchronize(s));
    printf(", \"dtod8_issue_us\": %.3f", median(t, iters));
    TIME(big, { CK(cuMemcpyDtoDAsync(peer, mine, SEG, s)); CK(cuStreamSynchronize(s)); });
    printf(", \"dtod64m_imported_GBps\": %.2f", SEG / median(t, big) * 1e-3);
    /* streams: PIPE copies issued back to back, one synchronise (what NB/NBI
     * puts and put_on_stream must reach) */
    {
        int pipe = big < 5 ? 5 : big, k;
        TIME(pipe, { for (k = 0; k < PIPE; k++) CK(cuMemcpyDtoDAsync(peer, mine, SEG, s));
                     CK(cuStreamSynchronize(s)); });
        printf(", \"dtod64m_imported_pipe_GBps\": %.2f", (double)PIPE * SEG / median(t, pipe) * 1e-3);
        TIME(pipe, { for (k = 0; k < PIPE; k++) CK(cuMemcpyHtoDAsync(peer, pinned_big, SEG, s));
                     CK(cuStreamSynchronize(s)); });
        printf(", \"htod64m_pinned_imported_pipe_GBps\": %.2f", (double)PIPE * SEG / median(t, pipe) * 1e-3);
    }
    TIME(big, { CK(cuMemcpyDtoDAsync(mine2, mine, SEG, s)); CK(cuStreamSynchronize(s)); });
    printf(", \"dtod64m_local_GBps\": %.2f", SEG / median(t, big) * 1e-3);
    TIME(big, { CK(cuMemcpyHtoD(mine2, pageable, SEG)); });
    printf(", \"htod64m_pageable_GBps\": %.2f", SEG / median(t, big) * 1e-3);
    TIME(big, { CK(cuMemcpyHtoD(mine2, pinned_big, SEG)); });
    printf(", \"htod64m_pinned_GBps\": %.2f", SEG / median(t, big) * 1e-3);
    TIME(big, { CK(cuMemcpyDtoH(pageable, mine2, SEG)); });
    printf(", \"dtoh64m_pageable_GBps\": %.2f", SEG / median(t, big) * 1e-3);
    TIME(big, { CK(cuMemcpyDtoH(pinned_big, mine2, SEG)); });
    printf(", \"dtoh64m_pinned_GBps\": %.2f}\n", SEG / median(t, big) * 1e-3);
    fflush(stdout);

    CK(cuModuleUnload(mod));
    CK(cuMemFreeHost(pinned));
    CK(cuMemFreeHost(pinned_big));
    CK(cuMemFree(mine2));
    CK(cuMemUnmap(mine, size));
    CK(cuMemAddressFree(mine, size));
    CK(cuMemRelease(mine_h));
    CK(cuMemUnmap(peer, psize));
    CK(cuMemAddressFree(peer, psize));
    CK(cuMemRelease(h));
    CK(cuStreamDestroy(s));
    CK(cuDevicePrimaryCtxRelease(dev));
    free(pageable);
    free(t);
    if (write(sock, "D", 1) != 1)
        return 2;
    return 0;
}

int main(int argc, char **argv)
{
    int iters = argc > 1 ? atoi(argv[1]) : 2000;
    int device = argc > 2 ? atoi(argv[2]) : 0;
    int odev = argc > 3 ? atoi(argv[3]) : device;
    int sv[2], status = 0, rc;
    pid_t pid;
    if (iters < 10)
        iters = 10;
    /* fork before any CUDA call: a child of a CUDA process cannot use CUDA */
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
        perror("driver_baseline: socketpair");
        return 2;
    }
    pid = fork();
    if (pid < 0) {
        perror("driver_baseline: fork");
        return 2;
    }
    if (pid == 0) {
        close(sv[0]);
        _exit(owner(sv[1], odev));
    }
    close(sv[1]);
    rc = importer(sv[0], device, odev, iters);
    close(sv[0]);
    if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "driver_baseline: the owner process failed (status %d)\n", status);
        return 2;
    }
    return rc;
}
