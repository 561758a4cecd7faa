/*
 * ofi_bench: raw libfabric RMA baseline for gexmk.
 *
 * Two processes on one host (fork before any libfabric call), FI_EP_RDM,
 * FI_RMA, FI_AV_TABLE, one FI_CQ_FORMAT_CONTEXT CQ bound FI_TRANSMIT|FI_RECV.
 * The parent is the active side (initiator), the child the passive target,
 * which keeps its CQ polled (manual progress) until told to stop.
 *
 * Measurements (active side):
 *   write_lat     fi_write of each size, waited to completion on the CQ
 *   write_dc_lat  fi_writemsg(FI_DELIVERY_COMPLETE|FI_COMPLETION), same
 *   read_lat      fi_read of each size, waited to completion
 *   bw            window of W outstanding fi_write of size S, then wait all
 *   issue         bare cost of an 8 B fi_write call (issue loop only)
 *   write_read    fi_write of each size, then an 8 B fi_read from the same target,
 *                 waited to the read's completion: a write known to have landed,
 *                 through read-after-write ordering (one round trip)
 *   pingpong      8 B ping-pong: fi_inject_write of a sequence number into the
 *                 target's word, which the target (polling its CQ) sees and writes
 *                 back the same way; one round trip per sample (what gexmk's
 *                 put_signal + wait_until ping-pong does, with the data as the signal)
 *
 * See README.md in this folder.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

/* ------------------------------------------------------------------ */
/* globals, error handling                                            */
/* ------------------------------------------------------------------ */

static const char *role = "ofi_bench";  /* "active" / "target" after fork */
static int is_active = 0;
static pid_t child_pid = -1;
static int sock_fd = -1;                /* our end of the socketpair */

static void die(void) __attribute__((noreturn));
static void die(void)
{
    if (is_active && child_pid > 0) {
        kill(child_pid, SIGTERM);
        for (int i = 0; i < 100; i++) {           /* up to ~1 s */
            if (waitpid(child_pid, NULL, WNOHANG) != 0) break;
            usleep(10000);
        }
        kill(child_pid, SIGKILL);
        waitpid(child_pid, NULL, WNOHANG);
    }
    fflush(stdout);
    _exit(1);
}

static void release_fabric(void);

static void fail(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void fail(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "[%s] error: ", role);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    release_fabric();
    die();
}

/* Every fi_* call goes through this: negative return = error, exit non-zero. */
#define FI_CHK(call)                                                            \
    do {                                                                        \
        ssize_t rc_ = (ssize_t)(call);                                          \
        if (rc_ < 0)                                                            \
            fail("%s:%d: %s -> %zd (%s)", __FILE__, __LINE__, #call, rc_,       \
                 fi_strerror((int)-rc_));                                       \
    } while (0)

static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void on_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "[ofi_bench] watchdog: run exceeded its time limit, aborting\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
    if (is_active && child_pid > 0) kill(child_pid, SIGKILL);
    _exit(3);
}

/* ------------------------------------------------------------------ */
/* options                                                            */
/* ------------------------------------------------------------------ */

#define MAX_SIZES 64

static struct {
    const char *prov;
    const char *domain;
    size_t sizes[MAX_SIZES];
    int nsizes;
    size_t bw_sizes[MAX_SIZES];
    int nbw;                 /* -1: derive from sizes (>= 64 KiB) */
    int iters;
    int window;
    int dc;                  /* FI_DELIVERY_COMPLETE for bw / issue writes */
    int flush;               /* -f: also time bandwidth windows ended by a read-back flush */
    int json;
    double cap_s;            /* max seconds per measurement */
    double op_timeout_s;     /* max seconds waiting for one completion batch */
    int watchdog_s;
    int pin;
    enum { TP_AUTO, TP_POLL, TP_BLOCK, TP_WAIT, TP_POLLFD, TP_POLLRX, TP_POLLFDT } target_progress;
    enum { Y_AUTO, Y_ON, Y_OFF } yield;
} opt = {
    .prov = "tcp;ofi_rxm",
    .nbw = -1,
    .iters = 1000,
    .window = 64,
    .cap_s = 1.0,
    .op_timeout_s = 10.0,
    .watchdog_s = 120,
    .target_progress = TP_AUTO,
    .yield = Y_AUTO,
};
static int do_yield;   /* resolved from opt.yield once fi_info is known */

static int parse_sizes(const char *s, size_t *out)
{
    int n = 0;
    char *dup = strdup(s), *save = NULL;
    for (char *tok = strtok_r(dup, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *end;
        unsigned long long v = strtoull(tok, &end, 0);
        if (*end == 'k' || *end == 'K') { v <<= 10; end++; }
        else if (*end == 'm' || *end == 'M') { v <<= 20; end++; }
        if (*end || v == 0 || n >= MAX_SIZES) {
            fprintf(stderr, "bad size list: %s\n", s);
            exit(2);
        }
        out[n++] = (size_t)v;
    }
    free(dup);
    return n;
}

static void usage(const char *argv0, int code)
{
    fprintf(code ? stderr : stdout,
        "usage: %s [-p provider] [-s sizes] [-b bw_sizes] [-i iters] [-w window] [-d] [-f] [--json]\n"
        "          [-D domain] [-t cap_s] [-T op_timeout_s] [-W watchdog_s] [-P auto|poll|block]\n"
        "          [-y auto|on|off] [--pin]\n"
        "  -p  provider name for fi_getinfo (default \"tcp;ofi_rxm\")\n"
        "  -s  comma list of sizes for latency (default 8,64,4096,65536,1048576,4194304; k/m suffix ok)\n"
        "  -b  comma list of sizes for windowed bandwidth (default: sizes >= 64 KiB from -s)\n"
        "  -i  iterations per latency point / batches for issue cost (default 1000)\n"
        "  -w  window of outstanding writes for bandwidth and issue cost (default 64)\n"
        "  -d  use FI_DELIVERY_COMPLETE on the bandwidth and issue-cost writes\n"
        "      (latency is always measured both without and with it)\n"
        "  -f  also time bandwidth windows that end with an 8 B read-back flush (read-after-write\n"
        "      ordering requested; dropped where not granted): the data is then at the target\n"
        "  -D  domain name hint (e.g. lo, eth0)\n"
        "  -t  time cap per measurement in seconds (default 1.0)\n"
        "  -T  timeout waiting for completions in seconds (default 10)\n"
        "  -W  whole-run watchdog in seconds (default 120)\n"
        "  -P  target progress: poll its CQ, block on the socket, wait (FI_WAIT_FD CQ +\n"
        "      fi_trywait + poll), pollfd (poll, but both sides' CQs have an FI_WAIT_FD\n"
        "      wait object, as gexmk's do: what its signalling costs), pollrx (poll, both\n"
        "      sides' transmit completions in a CQ without a wait object, receives in one\n"
        "      with an FI_WAIT_FD: what a split costs), pollfdt (poll, only the target's CQ\n"
        "      with an FI_WAIT_FD: what the initiator's own signalling costs), or auto\n"
        "      (auto = poll unless data_progress is FI_PROGRESS_AUTO; default auto)\n"
        "  -y  sched_yield() after each empty CQ poll on the active side\n"
        "      (auto = on when data_progress is FI_PROGRESS_AUTO, so that provider\n"
        "      progress threads get the CPU; default auto)\n"
        "  --pin  pin active process to CPU 0, target to CPU 1\n"
        "  --json one JSON object on stdout\n", argv0);
    exit(code);
}

static void parse_args(int argc, char **argv)
{
    static const struct option lo[] = {
        {"json", no_argument, NULL, 'J'},
        {"pin", no_argument, NULL, 'N'},
        {"help", no_argument, NULL, 'h'},
        {0, 0, 0, 0},
    };
    opt.nsizes = parse_sizes("8,64,4096,65536,1048576,4194304", opt.sizes);
    int c;
    while ((c = getopt_long(argc, argv, "p:s:b:i:w:dfD:t:T:W:P:y:h", lo, NULL)) != -1) {
        switch (c) {
        case 'p': opt.prov = optarg; break;
        case 's': opt.nsizes = parse_sizes(optarg, opt.sizes); break;
        case 'b': opt.nbw = parse_sizes(optarg, opt.bw_sizes); break;
        case 'i': opt.iters = atoi(optarg); break;
        case 'w': opt.window = atoi(optarg); break;
        case 'd': opt.dc = 1; break;
        case 'f': opt.flush = 1; break;
        case 'D': opt.domain = optarg; break;
        case 't': opt.cap_s = atof(optarg); break;
        case 'T': opt.op_timeout_s = atof(optarg); break;
        case 'W': opt.watchdog_s = atoi(optarg); break;
        case 'P':
            if (!strcmp(optarg, "auto")) opt.target_progress = TP_AUTO;
            else if (!strcmp(optarg, "poll")) opt.target_progress = TP_POLL;
            else if (!strcmp(optarg, "block")) opt.target_progress = TP_BLOCK;
            else if (!strcmp(optarg, "wait")) opt.target_progress = TP_WAIT;
            else if (!strcmp(optarg, "pollfd")) opt.target_progress = TP_POLLFD;
            else if (!strcmp(optarg, "pollrx")) opt.target_progress = TP_POLLRX;
            else if (!strcmp(optarg, "pollfdt")) opt.target_progress = TP_POLLFDT;
            else usage(argv[0], 2);
            break;
        case 'y':
            if (!strcmp(optarg, "auto")) opt.yield = Y_AUTO;
            else if (!strcmp(optarg, "on")) opt.yield = Y_ON;
            else if (!strcmp(optarg, "off")) opt.yield = Y_OFF;
            else usage(argv[0], 2);
            break;
        case 'J': opt.json = 1; break;
        case 'N': opt.pin = 1; break;
        case 'h': usage(argv[0], 0); break;
        default: usage(argv[0], 2);
        }
    }
    if (optind != argc || opt.iters < 1 || opt.window < 1 || opt.cap_s <= 0 ||
        opt.op_timeout_s <= 0)
        usage(argv[0], 2);
    if (opt.nbw < 0) {
        opt.nbw = 0;
        for (int i = 0; i < opt.nsizes; i++)
            if (opt.sizes[i] >= 65536) opt.bw_sizes[opt.nbw++] = opt.sizes[i];
    }
}

/* ------------------------------------------------------------------ */
/* socketpair out-of-band exchange                                    */
/* ------------------------------------------------------------------ */

static void oob_send(const void *buf, size_t len)
{
    const char *p = buf;
    while (len) {
        ssize_t n = send(sock_fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) fail("socketpair send: %s (peer gone?)", strerror(errno));
        p += n; len -= (size_t)n;
    }
}

static void oob_recv(void *buf, size_t len)
{
    char *p = buf;
    uint64_t t0 = now_ns();
    while (len) {
        struct pollfd pfd = { .fd = sock_fd, .events = POLLIN };
        int pr = poll(&pfd, 1, 1000);
        if (pr < 0 && errno == EINTR) continue;
        if (pr < 0) fail("poll on socketpair: %s", strerror(errno));
        if (pr == 0) {
            if (is_active && waitpid(child_pid, NULL, WNOHANG) == child_pid) {
                child_pid = -1;
                fail("target process died");
            }
            if ((double)(now_ns() - t0) * 1e-9 > 30.0)
                fail("timeout waiting for peer on socketpair");
            continue;
        }
        ssize_t n = recv(sock_fd, p, len, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n == 0) fail("peer closed the socketpair (peer died)");
        if (n < 0) fail("socketpair recv: %s", strerror(errno));
        p += n; len -= (size_t)n;
    }
}

#define NAME_MAX_LEN 256
#define RAWKEY_MAX_LEN 256

struct peer_info {
    uint64_t buf_addr;    /* virtual address of the registered buffer */
    uint64_t buf_len;
    uint64_t key;         /* fi_mr_key (when not FI_MR_RAW) */
    uint64_t raw_base;    /* fi_mr_raw_attr base address (FI_MR_RAW) */
    uint64_t raw_len;
    uint64_t name_len;
    uint8_t raw_key[RAWKEY_MAX_LEN];
    uint8_t name[NAME_MAX_LEN];
};

/* ------------------------------------------------------------------ */
/* libfabric state                                                    */
/* ------------------------------------------------------------------ */

static struct fi_info *info;
static struct fid_fabric *fabric;
static struct fid_domain *domain;
static struct fid_av *av;
static struct fid_cq *cq;
static struct fid_cq *rxcq;    /* -P pollrx only: the receive side's CQ, with a wait fd */
static int cq_wait_fd = -1;    /* target with -P wait only */
static struct fid_ep *ep;
static struct fid_mr *mr;
static void *mr_desc;          /* passed as desc when FI_MR_LOCAL, else NULL */
static uint64_t mr_mode;
static char *buf;
static size_t buf_len;
static fi_addr_t peer_addr;
static const char *flush_unavailable;   /* why -f was dropped, else NULL */

/* The ping-pong's words, in the last cache lines of each side's buffer: the
 * word the peer writes into, and the source this side writes from. */
#define PP_WORD(b) ((volatile uint64_t *)((b) + buf_len - 128))
#define PP_SRC(b) ((uint64_t *)((b) + buf_len - 192))
#define PP_WORD_OFF (buf_len - 128)
#define PP_SRC_OFF (buf_len - 192)

/* Best effort on the way out of a failure: close what is open, so that
 * providers with named resources (shm's /dev/shm/<pid>:... region) remove
 * them.  A failing close is ignored; each object is closed once. */
static void release_fabric(void)
{
    struct fid *objs[] = { ep ? &ep->fid : NULL, mr ? &mr->fid : NULL, av ? &av->fid : NULL,
                           cq ? &cq->fid : NULL, rxcq ? &rxcq->fid : NULL,
                           domain ? &domain->fid : NULL, fabric ? &fabric->fid : NULL };
    ep = NULL; mr = NULL; av = NULL; cq = NULL; rxcq = NULL; domain = NULL; fabric = NULL;
    for (size_t i = 0; i < sizeof objs / sizeof objs[0]; i++)
        if (objs[i]) (void)fi_close(objs[i]);
}
static uint64_t remote_base;   /* peer buffer address as used in RMA calls */
static uint64_t remote_key;
static int remote_key_mapped;  /* fi_mr_map_raw was used */

/* per-op contexts (FI_CONTEXT / FI_CONTEXT2 mode safe) */
static struct fi_context2 *ctxs;
static size_t nctx;

/* completion bookkeeping on the active side */
static uint64_t completions;

static void report_cq_error(void)
{
    struct fi_cq_err_entry err;
    memset(&err, 0, sizeof err);
    ssize_t r = fi_cq_readerr(cq, &err, 0);
    if (r < 0) fail("fi_cq_readerr -> %zd (%s)", r, fi_strerror((int)-r));
    char pbuf[256];
    const char *pe = fi_cq_strerror(cq, err.prov_errno, err.err_data, pbuf, sizeof pbuf);
    fail("completion error: %s (%d), provider: %s (%d)", fi_strerror(err.err), err.err,
         pe ? pe : "?", err.prov_errno);
}

/* One non-blocking CQ poll; adds reaped entries to `completions`. */
static inline ssize_t cq_poll(void)
{
    struct fi_cq_entry ent[16];
    ssize_t r = fi_cq_read(cq, ent, 16);
    if (rxcq && r == -FI_EAGAIN) {
        /* a split (-P pollrx) reads its receive CQ too, as a process with both would */
        struct fi_cq_entry rent[16];
        ssize_t q = fi_cq_read(rxcq, rent, 16);
        if (q != -FI_EAGAIN) FI_CHK(q < 0 ? q : 0);
    }
    if (r > 0) { completions += (uint64_t)r; return r; }
    if (r == -FI_EAGAIN) return 0;
    if (r == -FI_EAVAIL) report_cq_error();
    FI_CHK(r);
    return 0;
}

/* Slow-path health check, called every few thousand empty polls. */
static void check_peer(uint64_t t_start, const char *what)
{
    if ((double)(now_ns() - t_start) * 1e-9 > opt.op_timeout_s)
        fail("timeout (%.1f s) waiting for %s", opt.op_timeout_s, what);
    if (is_active) {
        int st;
        if (waitpid(child_pid, &st, WNOHANG) == child_pid) {
            child_pid = -1;
            fail("target process died while waiting for %s", what);
        }
    }
    struct pollfd pfd = { .fd = sock_fd, .events = POLLIN };
    if (poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLHUP | POLLERR)))
        fail("peer closed the socketpair while waiting for %s", what);
}

/* Wait until `completions` reaches `target`. */
static inline void wait_completions(uint64_t target, const char *what)
{
    uint64_t spins = 0, t0 = 0;
    while (completions < target) {
        if (cq_poll() == 0) {
            if (do_yield) sched_yield();
            if ((++spins & 4095) == 0) {
                if (!t0) t0 = now_ns();
                check_peer(t0, what);
            }
        }
    }
}

/* Issue an RMA op, polling the CQ and retrying on -FI_EAGAIN. */
enum op_kind { OP_WRITE, OP_WRITE_DC, OP_READ };

static inline ssize_t post_op(enum op_kind k, size_t loc_off, size_t rem_off, size_t len,
                              void *ctx)
{
    switch (k) {
    case OP_WRITE:
        return fi_write(ep, buf + loc_off, len, mr_desc, peer_addr, remote_base + rem_off,
                        remote_key, ctx);
    case OP_READ:
        return fi_read(ep, buf + loc_off, len, mr_desc, peer_addr, remote_base + rem_off,
                       remote_key, ctx);
    case OP_WRITE_DC: {
        struct iovec iov = { .iov_base = buf + loc_off, .iov_len = len };
        void *desc = mr_desc;
        struct fi_rma_iov riov = { .addr = remote_base + rem_off, .len = len,
                                   .key = remote_key };
        struct fi_msg_rma msg = {
            .msg_iov = &iov, .desc = &desc, .iov_count = 1, .addr = peer_addr,
            .rma_iov = &riov, .rma_iov_count = 1, .context = ctx, .data = 0,
        };
        return fi_writemsg(ep, &msg, FI_DELIVERY_COMPLETE | FI_COMPLETION);
    }
    }
    return -FI_EINVAL;
}

static uint64_t eagain_count;

static inline void post_op_retry(enum op_kind k, size_t loc_off, size_t rem_off, size_t len,
                                 void *ctx)
{
    uint64_t spins = 0, t0 = 0;
    for (;;) {
        ssize_t r = post_op(k, loc_off, rem_off, len, ctx);
        if (r == 0) return;
        if (r != -FI_EAGAIN)
            fail("%s of %zu B -> %zd (%s)",
                 k == OP_READ ? "fi_read" : k == OP_WRITE ? "fi_write" : "fi_writemsg(DC)",
                 len, r, fi_strerror((int)-r));
        eagain_count++;
        if (cq_poll() == 0 && do_yield) sched_yield();
        if ((++spins & 4095) == 0) {
            if (!t0) t0 = now_ns();
            check_peer(t0, "EAGAIN to clear");
        }
    }
}

/* The ping-pong's write: the sequence number v into the peer's word, as an
 * injected write (no completion to reap), or a plain write waited for where
 * the provider injects nothing. */
static void pp_write(uint64_t v)
{
    uint64_t spins = 0, t0 = 0;
    *PP_SRC(buf) = v;
    if (info->tx_attr->inject_size < 8) {
        post_op_retry(OP_WRITE, PP_SRC_OFF, PP_WORD_OFF, 8, &ctxs[0]);
        wait_completions(completions + 1, "ping-pong write");
        return;
    }
    for (;;) {
        ssize_t r = fi_inject_write(ep, PP_SRC(buf), 8, peer_addr, remote_base + PP_WORD_OFF,
                                    remote_key);
        if (r == 0) return;
        if (r != -FI_EAGAIN) fail("fi_inject_write (ping-pong) -> %zd (%s)", r,
                                  fi_strerror((int)-r));
        eagain_count++;
        if (cq_poll() == 0 && do_yield) sched_yield();
        if ((++spins & 4095) == 0) {
            if (!t0) t0 = now_ns();
            check_peer(t0, "EAGAIN to clear (ping-pong)");
        }
    }
}

/* Does the target drive progress itself (so that it can answer a ping-pong)? */
static int target_polls(void)
{
    return opt.target_progress == TP_POLL || opt.target_progress == TP_WAIT ||
           opt.target_progress == TP_POLLFD || opt.target_progress == TP_POLLRX ||
           opt.target_progress == TP_POLLFDT ||
           (opt.target_progress == TP_AUTO &&
            info->domain_attr->data_progress != FI_PROGRESS_AUTO);
}

/* ------------------------------------------------------------------ */
/* setup                                                              */
/* ------------------------------------------------------------------ */

static const char *progress_str(enum fi_progress p)
{
    switch (p) {
    case FI_PROGRESS_AUTO: return "auto";
    case FI_PROGRESS_MANUAL: return "manual";
    default: return "unspec";
    }
}

static void mr_mode_str(uint64_t m, char *out, size_t n)
{
    static const struct { uint64_t bit; const char *name; } bits[] = {
        {FI_MR_LOCAL, "LOCAL"}, {FI_MR_RAW, "RAW"}, {FI_MR_VIRT_ADDR, "VIRT_ADDR"},
        {FI_MR_ALLOCATED, "ALLOCATED"}, {FI_MR_PROV_KEY, "PROV_KEY"},
        {FI_MR_MMU_NOTIFY, "MMU_NOTIFY"}, {FI_MR_RMA_EVENT, "RMA_EVENT"},
        {FI_MR_ENDPOINT, "ENDPOINT"}, {FI_MR_HMEM, "HMEM"},
    };
    out[0] = 0;
    for (size_t i = 0; i < sizeof bits / sizeof bits[0]; i++)
        if (m & bits[i].bit) {
            if (out[0]) strncat(out, "|", n - strlen(out) - 1);
            strncat(out, bits[i].name, n - strlen(out) - 1);
        }
    if (!out[0]) snprintf(out, n, "none");
}

static size_t max_size(void)
{
    size_t m = 8;
    for (int i = 0; i < opt.nsizes; i++) if (opt.sizes[i] > m) m = opt.sizes[i];
    for (int i = 0; i < opt.nbw; i++) if (opt.bw_sizes[i] > m) m = opt.bw_sizes[i];
    return m;
}

static void setup_fabric(void)
{
    struct fi_info *hints = fi_allocinfo();
    if (!hints) fail("fi_allocinfo failed");
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
    hints->mode = FI_CONTEXT | FI_CONTEXT2;   /* we pass a fi_context2 per op */
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED |
                                  FI_MR_PROV_KEY | FI_MR_ENDPOINT | FI_MR_RAW;
    hints->domain_attr->threading = FI_THREAD_DOMAIN;
    hints->addr_format = FI_FORMAT_UNSPEC;
    hints->fabric_attr->prov_name = strdup(opt.prov);
    if (opt.domain) hints->domain_attr->name = strdup(opt.domain);

    if (opt.flush) {
        /* the flush read lands after the window's writes only with read-after-write
         * ordering of data: ask for it, and go without -f where it is not granted */
        hints->tx_attr->msg_order = FI_ORDER_RAW | FI_ORDER_RMA_RAW;
        hints->ep_attr->max_order_raw_size = (size_t)-1;
        int rc = fi_getinfo(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), NULL, NULL, 0, hints,
                            &info);
        if (rc == 0 && (!(info->tx_attr->msg_order & (FI_ORDER_RAW | FI_ORDER_RMA_RAW)) ||
                        info->ep_attr->max_order_raw_size < max_size())) {
            fi_freeinfo(info);
            info = NULL;
            rc = -FI_ENODATA;
        }
        if (rc) {
            if (rc != -FI_ENODATA) FI_CHK(rc);
            flush_unavailable = "the provider grants no read-after-write ordering of data";
            opt.flush = 0;
            hints->tx_attr->msg_order = 0;
            hints->ep_attr->max_order_raw_size = 0;
        }
    }
    if (!info)
        FI_CHK(fi_getinfo(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), NULL, NULL, 0, hints,
                          &info));
    fi_freeinfo(hints);
    if (!info) fail("fi_getinfo returned no provider for \"%s\"", opt.prov);
    mr_mode = info->domain_attr->mr_mode;
    do_yield = opt.yield == Y_ON ||
               (opt.yield == Y_AUTO && info->domain_attr->data_progress == FI_PROGRESS_AUTO);

    FI_CHK(fi_fabric(info->fabric_attr, &fabric, NULL));
    FI_CHK(fi_domain(fabric, info, &domain, NULL));

    struct fi_cq_attr cq_attr = {
        .size = 0, .format = FI_CQ_FORMAT_CONTEXT, .wait_obj = FI_WAIT_NONE,
    };
    if ((!is_active && (opt.target_progress == TP_WAIT || opt.target_progress == TP_POLLFDT)) ||
        opt.target_progress == TP_POLLFD) {
        cq_attr.wait_obj = FI_WAIT_FD;
        cq_attr.wait_cond = FI_CQ_COND_NONE;
    }
    FI_CHK(fi_cq_open(domain, &cq_attr, &cq, NULL));
    if (cq_attr.wait_obj == FI_WAIT_FD)
        FI_CHK(fi_control(&cq->fid, FI_GETWAIT, &cq_wait_fd));
    if (opt.target_progress == TP_POLLRX) {
        struct fi_cq_attr rx_attr = cq_attr;
        rx_attr.wait_obj = FI_WAIT_FD;
        rx_attr.wait_cond = FI_CQ_COND_NONE;
        FI_CHK(fi_cq_open(domain, &rx_attr, &rxcq, NULL));
    }

    struct fi_av_attr av_attr = { .type = FI_AV_TABLE, .count = 2 };
    FI_CHK(fi_av_open(domain, &av_attr, &av, NULL));

    FI_CHK(fi_endpoint(domain, info, &ep, NULL));
    FI_CHK(fi_ep_bind(ep, &av->fid, 0));
    if (rxcq) {
        FI_CHK(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT));
        FI_CHK(fi_ep_bind(ep, &rxcq->fid, FI_RECV));
    } else {
        FI_CHK(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV));
    }
    FI_CHK(fi_enable(ep));

    /* Buffer: at least 16 MiB so the bandwidth window spreads over several slots. */
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    buf_len = max_size();
    if (buf_len < (16u << 20)) buf_len = 16u << 20;
    buf_len = (buf_len + pg - 1) / pg * pg;
    if (posix_memalign((void **)&buf, pg, buf_len)) fail("posix_memalign(%zu) failed", buf_len);
    memset(buf, is_active ? 0xA5 : 0x5A, buf_len);
    *PP_WORD(buf) = 0;

    uint64_t access = FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
    uint64_t req_key = is_active ? 0xC0DE0 : 0xC0DE1;
    FI_CHK(fi_mr_reg(domain, buf, buf_len, access, 0, req_key, 0, &mr, NULL));
    if (mr_mode & FI_MR_ENDPOINT) {
        FI_CHK(fi_mr_bind(mr, &ep->fid, 0));
        FI_CHK(fi_mr_enable(mr));
    }
    mr_desc = (mr_mode & FI_MR_LOCAL) ? fi_mr_desc(mr) : NULL;

    nctx = (size_t)opt.window + 16;
    ctxs = calloc(nctx, sizeof *ctxs);
    if (!ctxs) fail("calloc failed");
}

static void exchange(void)
{
    struct peer_info me, peer;
    memset(&me, 0, sizeof me);
    size_t nlen = NAME_MAX_LEN;
    FI_CHK(fi_getname(&ep->fid, me.name, &nlen));
    me.name_len = nlen;
    me.buf_addr = (uint64_t)(uintptr_t)buf;
    me.buf_len = buf_len;
    if (mr_mode & FI_MR_RAW) {
        size_t klen = RAWKEY_MAX_LEN;
        uint64_t base = 0;
        FI_CHK(fi_mr_raw_attr(mr, &base, me.raw_key, &klen, 0));
        me.raw_base = base;
        me.raw_len = klen;
    } else {
        me.key = fi_mr_key(mr);
        if (me.key == FI_KEY_NOTAVAIL) fail("fi_mr_key: FI_KEY_NOTAVAIL");
    }

    oob_send(&me, sizeof me);
    oob_recv(&peer, sizeof peer);

    FI_CHK(fi_av_insert(av, peer.name, 1, &peer_addr, 0, NULL) == 1 ? 0 : -FI_EINVAL);
    remote_base = (mr_mode & FI_MR_VIRT_ADDR) ? peer.buf_addr : 0;
    if (mr_mode & FI_MR_RAW) {
        FI_CHK(fi_mr_map_raw(domain, peer.raw_base, peer.raw_key, peer.raw_len,
                             &remote_key, 0));
        remote_key_mapped = 1;
    } else {
        remote_key = peer.key;
    }
    if (peer.buf_len != buf_len) fail("peer buffer length mismatch");
}

static void teardown(void)
{
    /* each handle cleared once closed: a failure on the way makes fail() ->
       release_fabric() close only what is left (closing one twice crashed) */
    struct fid *f;
    if (remote_key_mapped) FI_CHK(fi_mr_unmap_key(domain, remote_key));
    f = &ep->fid; ep = NULL; FI_CHK(fi_close(f));
    f = &mr->fid; mr = NULL; FI_CHK(fi_close(f));
    f = &av->fid; av = NULL; FI_CHK(fi_close(f));
    f = &cq->fid; cq = NULL; FI_CHK(fi_close(f));
    if (rxcq) { f = &rxcq->fid; rxcq = NULL; FI_CHK(fi_close(f)); }
    f = &domain->fid; domain = NULL; FI_CHK(fi_close(f));
    f = &fabric->fid; fabric = NULL; FI_CHK(fi_close(f));
    fi_freeinfo(info);
    free(buf);
    free(ctxs);
}

/* ------------------------------------------------------------------ */
/* passive side                                                       */
/* ------------------------------------------------------------------ */

static void target_loop(void)
{
    int poll_cq = opt.target_progress == TP_POLL || opt.target_progress == TP_POLLFD ||
                  opt.target_progress == TP_POLLRX || opt.target_progress == TP_POLLFDT ||
                  (opt.target_progress == TP_AUTO &&
                   info->domain_attr->data_progress != FI_PROGRESS_AUTO);
    char c = 0;
    uint64_t n = 0, pp_seen = 0;
    for (;;) {
        /* the ping-pong: answer the next sequence number as soon as it lands */
        if (*PP_WORD(buf) == pp_seen + 1) {
            pp_seen++;
            pp_write(pp_seen);
        }
        if (opt.target_progress == TP_WAIT) {
            /* progress, then sleep on the CQ's wait fd and the socketpair */
            cq_poll();
            if (*PP_WORD(buf) == pp_seen + 1)
                continue;           /* it landed in that progress pass: answer first */
            struct fid *fids[1] = { &cq->fid };
            int tw = fi_trywait(fabric, fids, 1);
            if (tw == 0) {
                struct pollfd pfd[2] = { { .fd = cq_wait_fd, .events = POLLIN },
                                         { .fd = sock_fd, .events = POLLIN } };
                int pr = poll(pfd, 2, 100);
                if (pr < 0 && errno != EINTR) fail("poll: %s", strerror(errno));
            } else if (tw != -FI_EAGAIN) {
                FI_CHK(tw);
            }
            ssize_t r = recv(sock_fd, &c, 1, MSG_DONTWAIT);
            if (r == 1) break;
            if (r == 0) fail("active process closed the socketpair (died?)");
            if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                fail("socketpair recv: %s", strerror(errno));
        } else if (poll_cq) {
            cq_poll();
            if ((++n & 1023) != 0) continue;   /* socket check off the hot path */
            ssize_t r = recv(sock_fd, &c, 1, MSG_DONTWAIT);
            if (r == 1) break;
            if (r == 0) fail("active process closed the socketpair (died?)");
            if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                fail("socketpair recv: %s", strerror(errno));
        } else {
            struct pollfd pfd = { .fd = sock_fd, .events = POLLIN };
            int pr = poll(&pfd, 1, 1000);
            if (pr < 0 && errno != EINTR) fail("poll: %s", strerror(errno));
            if (pr > 0) {
                ssize_t r = recv(sock_fd, &c, 1, 0);
                if (r == 1) break;
                if (r == 0) fail("active process closed the socketpair (died?)");
            }
            if (getppid() == 1) fail("active process died");
        }
    }
    if (c != 'Q') fail("unexpected control byte 0x%02x", (unsigned char)c);
    /* Tell the active side we have left the loop, then tear down. */
    oob_send("q", 1);
}

/* ------------------------------------------------------------------ */
/* active side measurements                                           */
/* ------------------------------------------------------------------ */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

struct stat3 { double median, min, max, mean; int n; int valid; };

static struct stat3 stats(double *v, int n)
{
    struct stat3 s = {0};
    if (n <= 0) return s;
    double sum = 0;
    for (int i = 0; i < n; i++) sum += v[i];
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    s.n = n;
    s.min = v[0];
    s.max = v[n - 1];
    s.median = (n & 1) ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    s.mean = sum / n;
    s.valid = 1;
    return s;
}

/* latency of one op kind at one size, in microseconds */
static struct stat3 measure_latency(enum op_kind k, size_t size, double *samples)
{
    const char *what = k == OP_READ ? "fi_read completion" : "fi_write completion";
    int warm = opt.iters / 10;
    if (warm < 10) warm = 10;
    uint64_t cap = (uint64_t)(opt.cap_s * 1e9), tstart = now_ns();
    for (int i = 0; i < warm; i++) {
        post_op_retry(k, 0, 0, size, &ctxs[0]);
        wait_completions(completions + 1, what);
        if (i >= 2 && now_ns() - tstart > cap / 4) break;
    }
    tstart = now_ns();
    int n = 0;
    for (; n < opt.iters; n++) {
        uint64_t t0 = now_ns();
        post_op_retry(k, 0, 0, size, &ctxs[0]);
        wait_completions(completions + 1, what);
        uint64_t t1 = now_ns();
        samples[n] = (double)(t1 - t0) * 1e-3;
        if (t1 - tstart > cap && n >= 9) { n++; break; }
    }
    return stats(samples, n);
}

/* fi_write of `size`, then an 8 B fi_read from the target, waited for both:
 * with read-after-write ordering the read completes once the write has landed
 * (the write's own completion is transmit completion, reaped on the way). */
static struct stat3 measure_write_read(size_t size, double *samples)
{
    int warm = opt.iters / 10;
    if (warm < 10) warm = 10;
    uint64_t cap = (uint64_t)(opt.cap_s * 1e9), tstart = now_ns();
    for (int i = -warm, n = 0;; i++) {
        uint64_t t0 = now_ns();
        post_op_retry(OP_WRITE, 0, 0, size, &ctxs[0]);
        post_op_retry(OP_READ, buf_len - 8, 0, 8, &ctxs[1]);
        wait_completions(completions + 2, "write + read completions");
        uint64_t t1 = now_ns();
        if (i < 0) {
            if (i >= -warm + 2 && t1 - tstart > cap / 4) i = -1;
            if (i == -1) tstart = now_ns();
            continue;
        }
        samples[n++] = (double)(t1 - t0) * 1e-3;
        if (n >= opt.iters || (t1 - tstart > cap && n >= 10))
            return stats(samples, n);
    }
}

/* 8 B ping-pong against the target's echo (target_loop): one round trip per sample. */
static uint64_t pp_seq;

static struct stat3 measure_pingpong(double *samples)
{
    int warm = opt.iters / 10;
    if (warm < 10) warm = 10;
    uint64_t cap = (uint64_t)(opt.cap_s * 1e9), tstart = now_ns();
    for (int i = -warm, n = 0;; i++) {
        uint64_t t0 = now_ns(), spins = 0, tw = 0;
        pp_write(++pp_seq);
        while (*PP_WORD(buf) != pp_seq) {
            if (cq_poll() == 0) {
                if (do_yield) sched_yield();
                if ((++spins & 4095) == 0) {
                    if (!tw) tw = now_ns();
                    check_peer(tw, "the ping-pong's answer");
                }
            }
        }
        uint64_t t1 = now_ns();
        if (i < 0) {
            if (i >= -warm + 2 && t1 - tstart > cap / 4) i = -1;
            if (i == -1) tstart = now_ns();
            continue;
        }
        samples[n++] = (double)(t1 - t0) * 1e-3;
        if (n >= opt.iters || (t1 - tstart > cap && n >= 10))
            return stats(samples, n);
    }
}

struct bwres { double agg, rmin, rmed, rmax; int rounds; };

/* One window: W writes of `size`, reaped; with `flush`, then an 8-byte read
 * from the target, which (read-after-write ordering) completes only once the
 * window's data is there: the window ends as gexmk's nbi_wait does, rather
 * than when the writes were handed to the provider (transmit completion; on
 * tcp the data may still sit in socket buffers, overlapping the next window). */
static uint64_t bw_window(size_t size, size_t nslots, int flush)
{
    enum op_kind k = opt.dc ? OP_WRITE_DC : OP_WRITE;
    size_t W = (size_t)opt.window;
    uint64_t base = completions;
    uint64_t t0 = now_ns();
    for (size_t i = 0; i < W; i++) {
        size_t off = (i % nslots) * size;
        post_op_retry(k, off, off, size, &ctxs[i % nctx]);
    }
    wait_completions(base + W, "bandwidth window");
    if (flush) {
        post_op_retry(OP_READ, buf_len - 8, 0, 8, &ctxs[0]);
        wait_completions(base + W + 1, "bandwidth window flush");
    }
    return now_ns() - t0;
}

static struct bwres bw_result(size_t size, double *samples, int r, uint64_t total_ns)
{
    struct bwres res;
    res.rounds = r;
    res.agg = (double)(opt.window * size) * r / (double)total_ns;
    struct stat3 s = stats(samples, r);
    res.rmin = s.min; res.rmed = s.median; res.rmax = s.max;
    return res;
}

/* Windows of `size`, plain (flush = 0) or flushed.  The two kinds are not
 * interleaved: a plain window's data still in flight at its end would be
 * paid for by the flushed window after it. */
static struct bwres measure_bw(size_t size, double *samples, int max_rounds, int flush)
{
    size_t nslots = buf_len / size;
    if (nslots < 1) nslots = 1;
    uint64_t cap = (uint64_t)(opt.cap_s * 1e9);
    uint64_t total_ns = 0;
    int r = 0;
    for (int round = -1; round < max_rounds; round++) {   /* round -1 = warm-up */
        uint64_t dt = bw_window(size, nslots, flush);
        if (round < 0) continue;
        samples[r++] = (double)(opt.window * size) / (double)dt;   /* bytes/ns = GB/s */
        total_ns += dt;
        if (total_ns > cap && r >= 3) break;
    }
    return bw_result(size, samples, r, total_ns);
}

struct issueres {
    double median, mean, min;   /* over all batches */
    double clean_median;        /* over batches that saw no -FI_EAGAIN (-1: none) */
    int batches, clean_batches;
    uint64_t eagain;
};

static struct issueres measure_issue(double *samples, int max_batches)
{
    enum op_kind k = opt.dc ? OP_WRITE_DC : OP_WRITE;
    size_t W = (size_t)opt.window;
    uint64_t cap = (uint64_t)(opt.cap_s * 1e9), tstart = 0;
    uint64_t issue_total = 0, eag0 = 0;
    int nb = 0, nclean = 0;
    double *clean = samples + max_batches;                /* second half of samples */
    for (int b = -3; b < max_batches; b++) {              /* 3 warm-up batches */
        if (b == 0) { tstart = now_ns(); eag0 = eagain_count; }
        uint64_t base = completions, eag_b = eagain_count;
        uint64_t t0 = now_ns();
        if (k == OP_WRITE) {
            for (size_t i = 0; i < W; i++) {
                ssize_t rc = fi_write(ep, buf, 8, mr_desc, peer_addr, remote_base,
                                      remote_key, &ctxs[i]);
                if (rc) {
                    if (rc != -FI_EAGAIN) FI_CHK(rc);
                    post_op_retry(OP_WRITE, 0, 0, 8, &ctxs[i]);  /* polls, counts */
                }
            }
        } else {
            for (size_t i = 0; i < W; i++) post_op_retry(k, 0, 0, 8, &ctxs[i]);
        }
        uint64_t dt = now_ns() - t0;
        wait_completions(base + W, "issue-cost batch");
        if (b < 0) continue;
        samples[nb++] = (double)dt / (double)W;
        if (eagain_count == eag_b) clean[nclean++] = (double)dt / (double)W;
        issue_total += dt;
        if (now_ns() - tstart > cap && nb >= 10) break;
    }
    struct issueres res;
    struct stat3 s = stats(samples, nb);
    res.median = s.median;
    res.min = s.min;
    res.mean = (double)issue_total / ((double)nb * (double)W);
    res.batches = nb;
    res.eagain = eagain_count - eag0;
    res.clean_batches = nclean;
    res.clean_median = nclean ? stats(clean, nclean).median : -1.0;
    return res;
}

/* Sanity check: DC write a pattern into the target, read it back. */
static void verify(void)
{
    size_t len = 64;
    size_t lo = buf_len / 2, ro = 4096;
    unsigned char *p = (unsigned char *)buf + lo;
    for (size_t i = 0; i < len; i++) p[i] = (unsigned char)(i * 7 + 1);
    post_op_retry(OP_WRITE, lo, ro, len, &ctxs[0]);
    wait_completions(completions + 1, "verify write");
    post_op_retry(OP_WRITE_DC, lo, ro, len, &ctxs[0]);  /* also orders after the write */
    wait_completions(completions + 1, "verify DC write");
    memset(p, 0, len);
    post_op_retry(OP_READ, lo, ro, len, &ctxs[0]);
    wait_completions(completions + 1, "verify read");
    for (size_t i = 0; i < len; i++)
        if (p[i] != (unsigned char)(i * 7 + 1))
            fail("verify: read-back mismatch at byte %zu (got 0x%02x)", i, p[i]);
}

struct results {
    struct stat3 wl[MAX_SIZES], wdc[MAX_SIZES], rl[MAX_SIZES], wr[MAX_SIZES];
    struct stat3 pp;
    int has_pp;
    struct bwres bw[MAX_SIZES], bwf[MAX_SIZES];
    struct issueres issue;
};

static void print_lat_json(const char *key, struct stat3 *s)
{
    printf("  \"%s\": {", key);
    for (int i = 0; i < opt.nsizes; i++)
        printf("%s\"%zu\": {\"median\": %.3f, \"min\": %.3f}", i ? ", " : "", opt.sizes[i],
               s[i].median, s[i].min);
    printf("},\n");
}

static void run_active(void)
{
    static struct results R;
    int maxn = opt.iters > 1000 ? opt.iters : 1000;
    double *samples = malloc(sizeof(double) * (size_t)(2 * maxn + 16));
    if (!samples) fail("malloc failed");
    char mrs[128];
    mr_mode_str(mr_mode, mrs, sizeof mrs);

    FILE *hum = opt.json ? stderr : stdout;
    fprintf(hum, "# provider %s  fabric %s  domain %s  mr_mode %s  progress ctrl=%s data=%s  "
                 "threading %d  tx_size %zu  inject %zu\n",
            info->fabric_attr->prov_name, info->fabric_attr->name, info->domain_attr->name,
            mrs, progress_str(info->domain_attr->control_progress),
            progress_str(info->domain_attr->data_progress), (int)info->domain_attr->threading,
            info->tx_attr->size, info->tx_attr->inject_size);
    fprintf(hum, "# iters %d  window %d  bw/issue writes %s  cap %.2f s/measurement\n",
            opt.iters, opt.window, opt.dc ? "FI_DELIVERY_COMPLETE" : "default completion",
            opt.cap_s);
    fflush(hum);

    verify();
    uint64_t t_all = now_ns();

    for (int i = 0; i < opt.nsizes; i++) {
        size_t s = opt.sizes[i];
        R.wl[i] = measure_latency(OP_WRITE, s, samples);
        if (!opt.json)
            printf("write_lat     %8zu B  median %9.3f us  min %9.3f us  (n=%d)\n", s,
                   R.wl[i].median, R.wl[i].min, R.wl[i].n);
        R.wdc[i] = measure_latency(OP_WRITE_DC, s, samples);
        if (!opt.json)
            printf("write_dc_lat  %8zu B  median %9.3f us  min %9.3f us  (n=%d)\n", s,
                   R.wdc[i].median, R.wdc[i].min, R.wdc[i].n);
        R.rl[i] = measure_latency(OP_READ, s, samples);
        if (!opt.json)
            printf("read_lat      %8zu B  median %9.3f us  min %9.3f us  (n=%d)\n", s,
                   R.rl[i].median, R.rl[i].min, R.rl[i].n);
        R.wr[i] = measure_write_read(s, samples);
        if (!opt.json)
            printf("write_read    %8zu B  median %9.3f us  min %9.3f us  (n=%d)\n", s,
                   R.wr[i].median, R.wr[i].min, R.wr[i].n);
        fflush(stdout);
    }
    R.has_pp = target_polls();
    if (R.has_pp) {
        R.pp = measure_pingpong(samples);
        if (!opt.json)
            printf("pingpong             8 B  median %9.3f us  min %9.3f us  (n=%d)\n",
                   R.pp.median, R.pp.min, R.pp.n);
    } else if (!opt.json) {
        printf("pingpong             8 B  n/a: the target does not poll its CQ (-P block)\n");
    }
    for (int i = 0; i < opt.nbw; i++) {
        R.bw[i] = measure_bw(opt.bw_sizes[i], samples, maxn, 0);
        if (opt.flush) R.bwf[i] = measure_bw(opt.bw_sizes[i], samples, maxn, 1);
        if (!opt.json)
            printf("bw            %8zu B  W=%d  %7.3f GB/s  (rounds %d: min %.3f median %.3f "
                   "max %.3f)\n",
                   opt.bw_sizes[i], opt.window, R.bw[i].agg, R.bw[i].rounds, R.bw[i].rmin,
                   R.bw[i].rmed, R.bw[i].rmax);
        if (!opt.json && opt.flush)
            printf("bw+flush      %8zu B  W=%d  %7.3f GB/s  (rounds %d: min %.3f median %.3f "
                   "max %.3f)\n",
                   opt.bw_sizes[i], opt.window, R.bwf[i].agg, R.bwf[i].rounds, R.bwf[i].rmin,
                   R.bwf[i].rmed, R.bwf[i].rmax);
        fflush(stdout);
    }
    R.issue = measure_issue(samples, opt.iters);
    if (!opt.json)
        printf("issue         %8d B  W=%d  median %7.1f ns/call  mean %7.1f  min %7.1f  "
               "(batches %d, eagain %" PRIu64 "; EAGAIN-free batches %d, median %.1f)\n",
               8, opt.window, R.issue.median, R.issue.mean, R.issue.min, R.issue.batches,
               R.issue.eagain, R.issue.clean_batches, R.issue.clean_median);
    double total_s = (double)(now_ns() - t_all) * 1e-9;
    if (!opt.json) printf("# measurements took %.2f s\n", total_s);

    if (opt.json) {
        printf("{\n  \"provider\": \"%s\",\n", info->fabric_attr->prov_name);
        printf("  \"domain\": \"%s\",\n  \"mr_mode\": \"%s\",\n  \"data_progress\": \"%s\",\n",
               info->domain_attr->name, mrs, progress_str(info->domain_attr->data_progress));
        printf("  \"iters\": %d,\n  \"window\": %d,\n  \"bw_delivery_complete\": %s,\n",
               opt.iters, opt.window, opt.dc ? "true" : "false");
        print_lat_json("write_lat_us", R.wl);
        print_lat_json("write_dc_lat_us", R.wdc);
        print_lat_json("read_lat_us", R.rl);
        print_lat_json("write_read_lat_us", R.wr);
        if (R.has_pp)
            printf("  \"pingpong_lat_us\": {\"8\": {\"median\": %.3f, \"min\": %.3f}},\n",
                   R.pp.median, R.pp.min);
        printf("  \"bw_GBps\": {");
        for (int i = 0; i < opt.nbw; i++)
            printf("%s\"%zu\": %.3f", i ? ", " : "", opt.bw_sizes[i], R.bw[i].agg);
        printf("},\n  \"bw_GBps_rounds\": {");
        for (int i = 0; i < opt.nbw; i++)
            printf("%s\"%zu\": {\"min\": %.3f, \"median\": %.3f, \"max\": %.3f, \"rounds\": %d}",
                   i ? ", " : "", opt.bw_sizes[i], R.bw[i].rmin, R.bw[i].rmed, R.bw[i].rmax,
                   R.bw[i].rounds);
        printf("},\n");
        if (opt.flush) {
            printf("  \"bw_flush_GBps_rounds\": {");
            for (int i = 0; i < opt.nbw; i++)
                printf("%s\"%zu\": {\"min\": %.3f, \"median\": %.3f, \"max\": %.3f, "
                       "\"rounds\": %d}", i ? ", " : "", opt.bw_sizes[i], R.bwf[i].rmin,
                       R.bwf[i].rmed, R.bwf[i].rmax, R.bwf[i].rounds);
            printf("},\n");
        } else if (flush_unavailable) {
            printf("  \"bw_flush_unavailable\": \"%s\",\n", flush_unavailable);
        }
        printf("  \"issue_ns\": %.2f,\n  \"issue_ns_mean\": %.2f,\n  \"issue_ns_min\": %.2f,\n"
               "  \"issue_eagain\": %" PRIu64 ",\n  \"issue_ns_clean\": %.2f,\n"
               "  \"issue_clean_batches\": %d,\n",
               R.issue.median, R.issue.mean, R.issue.min, R.issue.eagain,
               R.issue.clean_median, R.issue.clean_batches);
        printf("  \"elapsed_s\": %.3f\n}\n", total_s);
    }
    fflush(stdout);
    free(samples);
}

/* ------------------------------------------------------------------ */
/* main                                                               */
/* ------------------------------------------------------------------ */

static void pin_to(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set))
        fprintf(stderr, "[%s] warning: sched_setaffinity(%d): %s\n", role, cpu, strerror(errno));
}

int main(int argc, char **argv)
{
    parse_args(argc, argv);
    signal(SIGPIPE, SIG_IGN);

    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) {
        perror("socketpair");
        return 1;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();   /* before any libfabric call */
    if (pid < 0) {
        perror("fork");
        return 1;
    }
    if (pid == 0) {
        role = "target";
        is_active = 0;
        sock_fd = sv[1];
        close(sv[0]);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() == 1) _exit(1);
    } else {
        role = "active";
        is_active = 1;
        child_pid = pid;
        sock_fd = sv[0];
        close(sv[1]);
    }
    signal(SIGALRM, on_alarm);
    alarm((unsigned)opt.watchdog_s);
    if (opt.pin) pin_to(is_active ? 0 : 1);

    setup_fabric();
    exchange();

    if (is_active) {
        run_active();
        oob_send("Q", 1);
        char c;
        oob_recv(&c, 1);           /* target left its polling loop */
        teardown();
        int st = 0;
        uint64_t t0 = now_ns();
        for (;;) {
            pid_t w = waitpid(child_pid, &st, WNOHANG);
            if (w == child_pid) break;
            if (w < 0) { perror("waitpid"); return 1; }
            if ((double)(now_ns() - t0) * 1e-9 > 10.0) {
                fprintf(stderr, "[active] target did not exit, killing it\n");
                kill(child_pid, SIGKILL);
                waitpid(child_pid, &st, 0);
                return 1;
            }
            usleep(1000);
        }
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "[active] target exited abnormally (status 0x%x)\n", st);
            return 1;
        }
        return 0;
    } else {
        target_loop();
        teardown();
        return 0;
    }
}
