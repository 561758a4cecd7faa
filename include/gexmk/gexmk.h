/* gexmk.h - the C-level data path of gexmk, for embedding.
 *
 * What lives here: the structures through which one process sees the bound
 * segments of its peers' endpoints, and the inline functions that move bytes
 * and perform atomics on segments that are mapped into this process (the
 * CPU-mapped host paths), and the tables through which the core reaches the
 * transports for everything else.  Everything here runs without the GIL and
 * without a syscall (but the futex wake of a sleeping waiter, gx_wake).  The
 * Cython layer (gexmk/rma.pxd) wraps these functions
 * and turns their return codes into exceptions; a C caller checks them itself.
 *
 * Addresses: a remote address is the address of the target segment in its
 * owner's address space (as in GASNet-EX); the functions translate it into the
 * local mapping after checking that [addr, addr + n) lies inside the segment.
 */
#ifndef GEXMK_GEXMK_H
#define GEXMK_GEXMK_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#ifdef __linux__
#include <errno.h>
#include <limits.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <linux/futex.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Return codes of the data-path functions. */
enum {
    GX_OK = 0,
    GX_NOT_MAPPED = 1,   /* the target is valid but not mapped here: take the slow path */
    GX_ERANK = -1,       /* rank outside the team */
    GX_ERANGE = -2,      /* address range outside the target's bound segment (or none published) */
    GX_EDEAD = -3,       /* the target's process died */
    GX_EOP = -4,         /* unknown atomic op or type, or op not valid for the type */
};

/* An operand or result of any data type. */
typedef union gx_val {
    int32_t i32; uint32_t u32; int64_t i64; uint64_t u64; float flt; double dbl;
} gx_val;

/* The wake word of a library-allocated host segment, in the page after its
 * data (shared by every process that maps the segment): a waiter that goes to
 * sleep (wait_until after its spin) counts itself in `waiters` and sleeps on
 * `seq` (a futex); a CPU writer of a signal or atomic on the node then bumps
 * `seq` and wakes it.  Writers read `waiters` only: no syscall unless someone
 * sleeps. */
typedef struct gx_wake {
    uint32_t seq;            /* bumped by a writer that finds waiters (the futex word) */
    uint32_t waiters;        /* threads of any process sleeping or about to sleep on seq */
} gx_wake;

/* Memory kinds (classes). */
enum { GX_MK_HOST = 0, GX_MK_CUDA_UVA = 1, GX_MK_HIP = 2, GX_MK_ZE = 3 };

/* What this process knows of one remote endpoint's bound segment: what its
 * owner published, whichever transport reaches it.  Transport-specific state
 * lives in the transports' own per-target contexts (gx_path.peer). */
typedef struct gx_target {
    uintptr_t remote_base;   /* address of the segment in its owner's address space */
    size_t size;             /* bytes; 0 while nothing is published */
    int kind;                /* GX_MK_* */
    int device;              /* device ordinal of a device segment, else -1 */
    int pid;                 /* owner's process id */
    int jobrank;             /* owner's rank in the job */
    int ep_index;            /* owner's endpoint index */
    volatile int dead;       /* set when the owner is known to have died */
    struct gx_wake *wake;    /* the segment's wake word where this process maps it (a
                              * library-allocated host segment on this node), else NULL */
} gx_target;

/* ---- the transport plug-in interface (data plane) -------------------------
 * A transport hands the core one gx_tr_ops table; every function runs without
 * the GIL and returns 0 or -1 with a Python exception set (Cython `except -1`).
 * A transport that cannot do something fills the slot with a function that
 * raises UnsupportedError naming itself and the operation. */

/* Modes of an operation. */
enum {
    GX_BLOCKING = 0,         /* complete (remotely) on return */
    GX_NB = 1,               /* *handle receives an op to test/wait, or NULL when complete */
    GX_NBI = 2,              /* implicit: counted per endpoint, completed by sync */
    GX_NBI_LCNOW = 3,        /* implicit, and the local buffer is reusable on return */
};

/* NBI categories (bits of a sync mask are 1 << GX_CAT_*). */
enum { GX_CAT_GET = 0, GX_CAT_PUT = 1, GX_CAT_RMW = 2, GX_CAT_ALL = 7 };
/* nbi_test(ep, GX_WAIT_DRIVING): a progress pass of a wait that keeps polling
 * (spinning or yielding, not sleeping): a transport may keep its progress
 * thread off meanwhile.  No category bit is set with it. */
enum { GX_WAIT_DRIVING = 1 << 8 };
/* nbi_test(ep, GX_WAIT_SLEEP | GX_WAIT_SLEEP_US(us)): a wait on words that
 * only this transport's traffic writes has nothing left to do but sleep for
 * up to `us` microseconds (bits 16-30).  A transport that can block until its
 * traffic arrives does so, progresses, and returns 2; any other returns as for
 * categories 0, and the wait sleeps on its wake word instead. */
enum { GX_WAIT_SLEEP = 1 << 9 };
/* nbi_test(ep, GX_WAIT_SETTLE): a barrier has just completed here: whatever
 * the transport has taken in for this process but not yet applied (signals
 * that arrived as messages or remote CQ data, which a peer's quiet counts as
 * complete once the provider has them) is applied before it returns, by
 * whichever thread holds it; 1. */
enum { GX_WAIT_SETTLE = 1 << 10 };
#define GX_WAIT_SLEEP_US(us) ((int)(((unsigned)(us) > 0x7fffu ? 0x7fffu : (unsigned)(us)) << 16))
#define GX_WAIT_SLEEP_OF(flags) ((int)(((unsigned)(flags) >> 16) & 0x7fffu))

/* The arguments of one operation. */
typedef struct gx_xfer {
    void *ep;                /* the initiating endpoint's context in this transport */
    void *peer;              /* the transport's context for the target */
    gx_target *t;            /* the target (bounds already checked) */
    uintptr_t remote;        /* address in the target's segment */
    void *local;             /* local buffer */
    size_t n;                /* bytes */
    int mode;                /* GX_BLOCKING, GX_NB, GX_NBI, GX_NBI_LCNOW */
    int local_kind;          /* GX_MK_* of the local buffer */
    int local_device;        /* its device, or -1 */
    void *stream;            /* stream-ordered operations: the stream, else NULL */
    int dt, op;              /* atomics: GX_DT_*, GX_OP_* */
    int _pad;
    gx_val a, b;
    gx_val *result;  /* atomics: the fetched value (NULL allowed) */
    void **handle;           /* GX_NB: the pending op, or NULL when complete at issue */
    uintptr_t sig_addr;      /* put_signal: the 64-bit signal word in the target's segment
                              * (value in a.u64, GX_SIGNAL_* in op) */
    const struct gx_vis *vis; /* put_vis/get_vis: the blocks (local, remote, n and mode
                               * above are unused); else NULL */
} gx_xfer;

/* ---- vector, indexed and strided transfers (GASNet-EX VIS) ----------------
 * The core turns every VIS call into fragments: pairs of one contiguous local
 * range and one contiguous remote range of equal length, in order, bounds
 * already checked.  A transport's put_vis/get_vis slot receives them a chunk
 * at a time (at most GX_VIS_CHUNK fragments) and returns one op per chunk in
 * GX_NB mode; where the slot is NULL the core loops over put/get itself.
 * Overlapping destination ranges leave the result undefined (GASNet-EX). */
#define GX_VIS_MAXDIM 8
#define GX_VIS_CHUNK 4096
typedef struct gx_frag {
    void *local;             /* local address */
    uintptr_t remote;        /* address in the target's segment */
    size_t n;                /* bytes */
} gx_frag;

typedef struct gx_vis {
    const gx_frag *frags;    /* [nfrags] */
    size_t nfrags;
    size_t total;            /* bytes of every fragment together */
    /* A strided call's shape (ndim > 0), else ndim 0: element i = (i0, ..,
     * i_{ndim-1}) (i0 fastest) of elem bytes lies at lbase + sum(ik *
     * lstride[k]) locally and rbase + sum(ik * rstride[k]) remotely; the
     * fragments above are the same elements (a transport that copies a
     * shape at once, a device kind's 3-D copy, may use this instead). */
    int ndim;
    size_t elem;
    size_t count[GX_VIS_MAXDIM];
    ptrdiff_t lstride[GX_VIS_MAXDIM];
    ptrdiff_t rstride[GX_VIS_MAXDIM];
    char *lbase;
    uintptr_t rbase;
} gx_vis;

typedef int (*gx_tr_xfer_fn)(gx_xfer *x);
typedef int (*gx_tr_op_fn)(void *op, gx_val *result);   /* test: 1 done, 0 pending */
typedef void (*gx_tr_orphan_fn)(void *op);
typedef int (*gx_tr_sync_fn)(void *ep, int categories);          /* sync; nbi_test: 1 done, 0 pending */

typedef struct gx_tr_ops {
    const char *name;        /* the path's name, as users see it (tm.paths()) */
    gx_tr_xfer_fn put;       /* x->local -> (t, x->remote) */
    gx_tr_xfer_fn get;       /* (t, x->remote) -> x->local */
    gx_tr_xfer_fn atomic;
    gx_tr_op_fn test;        /* an NB op: 1 (and freed) when complete, 0 when pending */
    gx_tr_op_fn wait;        /* an NB op: block until complete, then free it */
    gx_tr_orphan_fn orphan;  /* an NB op nobody will wait for: free it when it completes */
    gx_tr_sync_fn sync;      /* complete the endpoint's implicit ops of these categories */
    gx_tr_sync_fn nbi_test;  /* 1 when none of these categories is outstanding; with
                              * categories 0 (or GX_WAIT_DRIVING) it only drives the
                              * endpoint's progress, for a wait */
    gx_tr_xfer_fn put_signal; /* put, then set/add the signal word: the signal is never
                               * visible at the target before the data (NVSHMEM put_signal) */
    gx_tr_xfer_fn put_vis;   /* x->vis's fragments local -> remote; NULL: the core loops put */
    gx_tr_xfer_fn get_vis;   /* x->vis's fragments remote -> local; NULL: the core loops get */
} gx_tr_ops;

/* One way to reach a target: a transport's table and its two contexts. */
typedef struct gx_path {
    const gx_tr_ops *ops;
    void *ep;
    void *peer;
} gx_path;

/* Operations and bytes that went one way (a path's counters). */
typedef struct gx_count {
    uint64_t ops;
    uint64_t bytes;
} gx_count;

/* Which counter of a route: puts, gets, atomics. */
enum { GX_CNT_PUT = 0, GX_CNT_GET = 1, GX_CNT_AMO = 2, GX_CNT_KINDS = 3 };

/* How one local endpoint reaches one target, chosen at bind/publication
 * time, separately for RMA and atomics; the hot path reads it.  The bounds
 * and the death flag are copies of the target's (set whenever the route is
 * chosen, and at a death), so the inline path touches one cache line (the
 * core allocates routes 64-byte aligned).
 *
 * Counters, so the path every operation takes is visible: `mapped` counts
 * what the inline memcpy served (the CPU mapping of the RMA path), `via`
 * what went through the path tables (puts and gets through `rma`, atomics
 * through `amo`).  The core folds them into per-path totals whenever it
 * chooses the route's paths again.  Plain (non-atomic) increments: exact
 * when one thread at a time issues on a route, approximate under concurrent
 * issue to the same route from several threads (never a data-path cost). */
typedef struct gx_route {
    uintptr_t remote_base;   /* = t->remote_base */
    size_t size;             /* = t->size */
    char *local_base;        /* a CPU mapping of the target where memcpy is right, else NULL */
    volatile int dead;       /* = t->dead */
    int _pad;
    gx_count mapped[GX_CNT_KINDS];   /* served by the inline memcpy (local_base) */
    gx_count via[GX_CNT_KINDS];      /* served by the rma (put, get) and amo (atomic) tables */
    gx_target *t;
    gx_path rma;
    gx_path amo;
} gx_route;

/* Count one operation of n bytes in c. */
static inline void gx_count_add(gx_count *c, size_t n)
{
    c->ops += 1;
    c->bytes += n;
}

/* The C state of a local endpoint: its context in every transport (for sync). */
#define GX_MAX_TRANSPORTS 8
typedef struct gx_ep {
    int index;
    volatile int destroyed;
    int seg_kind;            /* GX_MK_* of the bound segment (GX_MK_HOST when none) */
    int seg_device;          /* its device, or -1 */
    volatile int unsynced;   /* implicit ops or a put_signal went out since its last sync:
                              * a collective completes them first (core, _quiet_unsynced) */
    int ntr;
    gx_path tr[GX_MAX_TRANSPORTS];   /* .ops and .ep; .peer unused */
} gx_ep;

/* The hot-path view of a team: one route per team rank, seen from one local
 * endpoint.  Routes and targets are owned by the client and outlive the team. */
typedef struct gx_team {
    int rank;                /* this member's rank in the team */
    int size;                /* number of members (0 once the team is closed) */
    gx_route **routes;       /* [size] */
    void *owner;             /* the Python Team object (borrowed), for error reports */
    gx_ep *ep;               /* the initiating endpoint */
    uintptr_t dev_lo;        /* [dev_lo, dev_hi): the endpoint's bound segment when it is */
    uintptr_t dev_hi;        /* device memory: a local buffer there is never memcpy'd */
} gx_team;

/* 1 when [p, p + n) touches the team endpoint's device segment. */
static inline int gx_in_dev(const gx_team *tm, const void *p, size_t n)
{
    uintptr_t a = (uintptr_t)p;
    return tm->dev_hi != 0 && a < tm->dev_hi && a + n > tm->dev_lo;
}

/* Locate [addr, addr + n) of team rank `rank` in this process.
 * On GX_OK, *out is the local address; on GX_NOT_MAPPED, *rt is set and the
 * caller must take the route's transport. */
static inline int gx_locate(const gx_team *tm, int rank, uintptr_t addr, size_t n,
                            char **out, gx_route **rt)
{
    if ((unsigned)rank >= (unsigned)tm->size)
        return GX_ERANK;
    gx_route *r = tm->routes[rank];
    *rt = r;
    uintptr_t off = addr - r->remote_base;   /* wraps when addr < base: caught below */
    if (addr < r->remote_base || off > r->size || n > r->size - off)
        return GX_ERANGE;
    if (r->local_base == NULL || r->dead)
        return r->dead ? GX_EDEAD : GX_NOT_MAPPED;
    *out = r->local_base + off;
    return GX_OK;
}

/* Copy n bytes from local src to (rank, dest).  Complete on return: the
 * data is visible to the target (and to anyone it synchronises with). */
static inline int gx_put(const gx_team *tm, int rank, uintptr_t dest, const void *src, size_t n)
{
    char *p; gx_route *r;
    int rc = gx_locate(tm, rank, dest, n, &p, &r);
    if (rc != GX_OK)
        return rc;
    if (gx_in_dev(tm, src, n))
        return GX_NOT_MAPPED;
    memcpy(p, src, n);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    gx_count_add(&r->mapped[GX_CNT_PUT], n);
    return GX_OK;
}

/* Copy n bytes from (rank, src) into local dest. */
static inline int gx_get(const gx_team *tm, int rank, void *dest, uintptr_t src, size_t n)
{
    char *p; gx_route *r;
    int rc = gx_locate(tm, rank, src, n, &p, &r);
    if (rc != GX_OK)
        return rc;
    if (gx_in_dev(tm, dest, n))
        return GX_NOT_MAPPED;
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    memcpy(dest, p, n);
    gx_count_add(&r->mapped[GX_CNT_GET], n);
    return GX_OK;
}

/* A full memory fence: what fence and quiet amount to for mapped memory,
 * where every put is complete when it returns.  (The Cython API's
 * rma.fence/rma.quiet also complete the endpoint's transports' implicit ops.) */
static inline void gx_mem_fence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

/* ---- waking sleepers (gx_wake) --------------------------------------------
 *
 * A CPU store that may satisfy a wait on another process of the node (a
 * signal, an atomic) is followed by gx_wake_waiters(t->wake): one load of the
 * waiter count, and a futex wake only when someone sleeps.  Ordering: the
 * writer's store is a seq_cst read-modify-write (x86: locked, a full barrier;
 * elsewhere a fence follows), the sleeper counts itself with one and fences
 * before it looks at its word again (gx_wake_enter), so either the writer sees
 * the sleeper or the sleeper sees the store.  Plain puts do not wake (their
 * cost stays a memcpy): a sleeper on a word written by puts, or by the network,
 * sees it when its sleep times out (gexmk.core's wait_words bounds it). */

/* After a seq_cst RMW on a word of the segment that `w` belongs to. */
static inline void gx_wake_slow(gx_wake *w)
{
    __atomic_fetch_add(&w->seq, 1, __ATOMIC_SEQ_CST);
#ifdef __linux__
    syscall(SYS_futex, &w->seq, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
#endif
}

static inline void gx_wake_waiters(gx_wake *w)
{
    if (w == NULL)
        return;
#if !defined(__x86_64__) && !defined(__i386__)
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
    if (__atomic_load_n(&w->waiters, __ATOMIC_SEQ_CST) != 0)
        gx_wake_slow(w);
}

/* A waiter about to sleep: count itself, then (after the full fence) look at
 * its words once more; the value returned is what gx_wake_sleep takes. */
static inline uint32_t gx_wake_enter(gx_wake *w)
{
    __atomic_fetch_add(&w->waiters, 1, __ATOMIC_SEQ_CST);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    return __atomic_load_n(&w->seq, __ATOMIC_SEQ_CST);
}

/* Sleep until a writer bumps seq past `seq` (at once if it already has), a
 * signal, or `ns` nanoseconds pass.  1 when the time ran out, else 0. */
static inline int gx_wake_sleep(gx_wake *w, uint32_t seq, long ns)
{
#ifdef __linux__
    struct timespec ts;
    ts.tv_sec = ns / 1000000000L;
    ts.tv_nsec = ns % 1000000000L;
    if (syscall(SYS_futex, &w->seq, FUTEX_WAIT, seq, &ts, NULL, 0) != 0)
        return errno == ETIMEDOUT;
    return 0;
#else
    (void)w; (void)seq; (void)ns;
    return 1;
#endif
}

static inline void gx_wake_leave(gx_wake *w)
{
    __atomic_fetch_sub(&w->waiters, 1, __ATOMIC_SEQ_CST);
}

/* ---- remote atomics on mapped memory ---------------------------------- */

/* Data types (GASNet-EX GEX_DT_*). */
enum { GX_DT_I32 = 0, GX_DT_U32, GX_DT_I64, GX_DT_U64, GX_DT_FLT, GX_DT_DBL, GX_DT_COUNT };

/* Operations (GASNet-EX GEX_OP_*): the F forms fetch the old value. */
enum {
    GX_OP_SET = 0, GX_OP_GET, GX_OP_SWAP, GX_OP_CAS, GX_OP_FCAS,
    GX_OP_ADD, GX_OP_FADD, GX_OP_SUB, GX_OP_FSUB,
    GX_OP_INC, GX_OP_FINC, GX_OP_DEC, GX_OP_FDEC,
    GX_OP_AND, GX_OP_FAND, GX_OP_OR, GX_OP_FOR, GX_OP_XOR, GX_OP_FXOR,
    GX_OP_MIN, GX_OP_FMIN, GX_OP_MAX, GX_OP_FMAX,
    GX_OP_COUNT
};


static inline size_t gx_dt_size(int dt)
{
    return (dt == GX_DT_I32 || dt == GX_DT_U32 || dt == GX_DT_FLT) ? 4 : 8;
}

/* 1 when `op` is defined for `dt` (bitwise ops only on integer types). */
static inline int gx_op_valid(int dt, int op)
{
    if (dt < 0 || dt >= GX_DT_COUNT || op < 0 || op >= GX_OP_COUNT)
        return 0;
    if (dt == GX_DT_FLT || dt == GX_DT_DBL)
        return !(op >= GX_OP_AND && op <= GX_OP_FXOR);
    return 1;
}

/* Compare-and-swap loop on the representation UT of a value of type T: the
 * new value is EXPR of the old one (`o`) and the operand `a`. */
#define GX_RMW(T, UT, q, EXPR, oldp)                                               \
    do {                                                                           \
        UT ov_ = __atomic_load_n((q), __ATOMIC_RELAXED), nv_;                      \
        for (;;) {                                                                 \
            T o; memcpy(&o, &ov_, sizeof o);                                       \
            T n_ = (EXPR); memcpy(&nv_, &n_, sizeof nv_);                          \
            if (__atomic_compare_exchange_n((q), &ov_, nv_, 0, __ATOMIC_SEQ_CST,   \
                                            __ATOMIC_RELAXED)) {                   \
                *(oldp) = o; break;                                                \
            }                                                                      \
        }                                                                          \
    } while (0)

/* One function per data type.  Integer arithmetic wraps (it is done in the
 * unsigned representation); ADD/SUB/INC/DEC on integers use fetch-add. */
#define GX_DEFINE_ATOMIC_INT(NAME, T, UT, FIELD)                                   \
static inline int NAME(void *p, int op, gx_val A, gx_val B, gx_val *result)        \
{                                                                                  \
    UT *q = (UT *)p, ua, ub, uo;                                                   \
    T a = A.FIELD, old;                                                            \
    memcpy(&ua, &A.FIELD, sizeof ua); memcpy(&ub, &B.FIELD, sizeof ub);            \
    switch (op) {                                                                  \
    case GX_OP_SET: __atomic_store_n(q, ua, __ATOMIC_SEQ_CST); return GX_OK;       \
    case GX_OP_GET: uo = __atomic_load_n(q, __ATOMIC_SEQ_CST); break;              \
    case GX_OP_SWAP: uo = __atomic_exchange_n(q, ua, __ATOMIC_SEQ_CST); break;     \
    case GX_OP_CAS: case GX_OP_FCAS:                                               \
        uo = ua;                                                                   \
        __atomic_compare_exchange_n(q, &uo, ub, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); \
        break;                                                                     \
    case GX_OP_ADD: case GX_OP_FADD: uo = __atomic_fetch_add(q, ua, __ATOMIC_SEQ_CST); break; \
    case GX_OP_SUB: case GX_OP_FSUB: uo = __atomic_fetch_sub(q, ua, __ATOMIC_SEQ_CST); break; \
    case GX_OP_INC: case GX_OP_FINC: uo = __atomic_fetch_add(q, (UT)1, __ATOMIC_SEQ_CST); break; \
    case GX_OP_DEC: case GX_OP_FDEC: uo = __atomic_fetch_sub(q, (UT)1, __ATOMIC_SEQ_CST); break; \
    case GX_OP_AND: case GX_OP_FAND: uo = __atomic_fetch_and(q, ua, __ATOMIC_SEQ_CST); break; \
    case GX_OP_OR:  case GX_OP_FOR:  uo = __atomic_fetch_or(q, ua, __ATOMIC_SEQ_CST); break;  \
    case GX_OP_XOR: case GX_OP_FXOR: uo = __atomic_fetch_xor(q, ua, __ATOMIC_SEQ_CST); break; \
    case GX_OP_MIN: case GX_OP_FMIN: GX_RMW(T, UT, q, (a < o ? a : o), &old); goto done;      \
    case GX_OP_MAX: case GX_OP_FMAX: GX_RMW(T, UT, q, (a > o ? a : o), &old); goto done;      \
    default: return GX_EOP;                                                        \
    }                                                                              \
    memcpy(&old, &uo, sizeof old);                                                 \
done:                                                                              \
    if (result) result->FIELD = old;                                               \
    return GX_OK;                                                                  \
}

#define GX_DEFINE_ATOMIC_FP(NAME, T, UT, FIELD)                                    \
static inline int NAME(void *p, int op, gx_val A, gx_val B, gx_val *result)        \
{                                                                                  \
    UT *q = (UT *)p, ua, ub, uo;                                                   \
    T a = A.FIELD, old;                                                            \
    memcpy(&ua, &A.FIELD, sizeof ua); memcpy(&ub, &B.FIELD, sizeof ub);            \
    switch (op) {                                                                  \
    case GX_OP_SET: __atomic_store_n(q, ua, __ATOMIC_SEQ_CST); return GX_OK;       \
    case GX_OP_GET: uo = __atomic_load_n(q, __ATOMIC_SEQ_CST); break;              \
    case GX_OP_SWAP: uo = __atomic_exchange_n(q, ua, __ATOMIC_SEQ_CST); break;     \
    case GX_OP_CAS: case GX_OP_FCAS: /* compares the representation, bit for bit */ \
        uo = ua;                                                                   \
        __atomic_compare_exchange_n(q, &uo, ub, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); \
        break;                                                                     \
    case GX_OP_ADD: case GX_OP_FADD: GX_RMW(T, UT, q, o + a, &old); goto done;     \
    case GX_OP_SUB: case GX_OP_FSUB: GX_RMW(T, UT, q, o - a, &old); goto done;     \
    case GX_OP_INC: case GX_OP_FINC: GX_RMW(T, UT, q, o + 1, &old); goto done;     \
    case GX_OP_DEC: case GX_OP_FDEC: GX_RMW(T, UT, q, o - 1, &old); goto done;     \
    case GX_OP_MIN: case GX_OP_FMIN: GX_RMW(T, UT, q, (a < o ? a : o), &old); goto done; \
    case GX_OP_MAX: case GX_OP_FMAX: GX_RMW(T, UT, q, (a > o ? a : o), &old); goto done; \
    default: return GX_EOP;   /* bitwise ops are integer-only */                   \
    }                                                                              \
    memcpy(&old, &uo, sizeof old);                                                 \
done:                                                                              \
    if (result) result->FIELD = old;                                               \
    return GX_OK;                                                                  \
}

GX_DEFINE_ATOMIC_INT(gx_atomic_i32, int32_t, uint32_t, i32)
GX_DEFINE_ATOMIC_INT(gx_atomic_u32, uint32_t, uint32_t, u32)
GX_DEFINE_ATOMIC_INT(gx_atomic_i64, int64_t, uint64_t, i64)
GX_DEFINE_ATOMIC_INT(gx_atomic_u64, uint64_t, uint64_t, u64)
GX_DEFINE_ATOMIC_FP(gx_atomic_flt, float, uint32_t, flt)
GX_DEFINE_ATOMIC_FP(gx_atomic_dbl, double, uint64_t, dbl)

/* Perform `op` of type `dt` on the naturally aligned object at local address p.
 * a and b are the operands (CAS: a = compare, b = swap); *result receives the
 * old value for fetching ops (NULL allowed).  Atomic with respect to every
 * gexmk atomic on the same memory from any process that maps it. */
static inline int gx_atomic_local(void *p, int dt, int op, gx_val a, gx_val b, gx_val *result)
{
    switch (dt) {
    case GX_DT_I32: return gx_atomic_i32(p, op, a, b, result);
    case GX_DT_U32: return gx_atomic_u32(p, op, a, b, result);
    case GX_DT_I64: return gx_atomic_i64(p, op, a, b, result);
    case GX_DT_U64: return gx_atomic_u64(p, op, a, b, result);
    case GX_DT_FLT: return gx_atomic_flt(p, op, a, b, result);
    case GX_DT_DBL: return gx_atomic_dbl(p, op, a, b, result);
    }
    return GX_EOP;
}

/* Remote atomic on (rank, addr) of a mapped target. */
static inline int gx_atomic(const gx_team *tm, int rank, uintptr_t addr, int dt, int op,
                            gx_val a, gx_val b, gx_val *result)
{
    char *p; gx_route *r;
    size_t n = gx_dt_size(dt);
    int rc = gx_locate(tm, rank, addr, n, &p, &r);
    if (rc != GX_OK)
        return rc;
    if (((uintptr_t)p & (n - 1)) != 0)
        return GX_ERANGE;
    rc = gx_atomic_local(p, dt, op, a, b, result);
    if (rc == GX_OK) {
        if (op != GX_OP_GET)
            gx_wake_waiters(r->t->wake);
        gx_count_add(&r->mapped[GX_CNT_AMO], n);
    }
    return rc;
}

/* ---- point-to-point synchronisation (NVSHMEM signals and wait_until) ----
 *
 * A signal is a 64-bit unsigned word of a bound segment.  put_signal writes
 * data and then updates the signal word at the target; whoever sees the new
 * signal value (by an acquire load, as gx_cmp_local does) sees the data.  The
 * inline form serves CPU-mapped targets: memcpy, then the signal update (a
 * seq_cst read-modify-write: release ordering and more), then a wake of the
 * target segment's sleeping waiters, if any (gx_wake).  Waiting (gexmk.core's
 * wait_words) polls the word with gx_cmp_local, then sleeps on the wake word. */

enum { GX_SIGNAL_SET = 0, GX_SIGNAL_ADD = 1 };
enum { GX_CMP_EQ = 0, GX_CMP_NE, GX_CMP_GT, GX_CMP_GE, GX_CMP_LT, GX_CMP_LE, GX_CMP_COUNT };
/* What a wait over several words waits for (gexmk.core's wait_words). */
enum { GX_WAIT_ALL = 0, GX_WAIT_ANY = 1, GX_WAIT_SOME = 2 };

/* A CPU hint inside spin loops. */
static inline void gx_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#endif
}

#define GX_CMP_(a, b, cmp)                                                  \
    ((cmp) == GX_CMP_EQ ? (a) == (b) : (cmp) == GX_CMP_NE ? (a) != (b) :    \
     (cmp) == GX_CMP_GT ? (a) > (b) : (cmp) == GX_CMP_GE ? (a) >= (b) :     \
     (cmp) == GX_CMP_LT ? (a) < (b) : (a) <= (b))

/* 1 when the naturally aligned object of type dt at p compares `cmp` to v
 * (object `cmp` v); *seen receives its value.  The load acquires: what was
 * written before the value was stored (a put_signal's data) is visible. */
static inline int gx_cmp_local(const void *p, int dt, int cmp, gx_val v, gx_val *seen)
{
    gx_val o;
    o.u64 = 0;
    if (gx_dt_size(dt) == 4)
        o.u32 = __atomic_load_n((const uint32_t *)p, __ATOMIC_ACQUIRE);
    else
        o.u64 = __atomic_load_n((const uint64_t *)p, __ATOMIC_ACQUIRE);
    if (seen)
        *seen = o;
    switch (dt) {
    case GX_DT_I32: return GX_CMP_(o.i32, v.i32, cmp);
    case GX_DT_U32: return GX_CMP_(o.u32, v.u32, cmp);
    case GX_DT_I64: return GX_CMP_(o.i64, v.i64, cmp);
    case GX_DT_U64: return GX_CMP_(o.u64, v.u64, cmp);
    case GX_DT_FLT: return GX_CMP_(o.flt, v.flt, cmp);
    case GX_DT_DBL: return GX_CMP_(o.dbl, v.dbl, cmp);
    }
    return 0;
}

/* The object (addr, dt) of the team endpoint's OWN bound segment (addr as
 * tm.addr(tm.rank, off) gives it) as a local pointer: GX_OK; GX_ERANGE when
 * outside the segment or not aligned to its size; GX_NOT_MAPPED when the
 * segment is not CPU-addressable here (device memory). */
static inline int gx_own_word(const gx_team *tm, uintptr_t addr, int dt, void **out)
{
    char *p; gx_route *r;
    size_t n = gx_dt_size(dt);
    int rc = gx_locate(tm, tm->rank, addr, n, &p, &r);
    if (rc != GX_OK)
        return rc;
    if (((uintptr_t)p & (n - 1)) != 0 || gx_in_dev(tm, p, n))
        return ((uintptr_t)p & (n - 1)) != 0 ? GX_ERANGE : GX_NOT_MAPPED;
    *out = p;
    return GX_OK;
}

/* Update a signal word at local p (GX_SIGNAL_SET / GX_SIGNAL_ADD), ordered
 * after every earlier store of this thread; a seq_cst read-modify-write either
 * way, so that gx_wake_waiters may follow it. */
static inline void gx_signal_local(void *p, uint64_t value, int sig_op)
{
    if (sig_op == GX_SIGNAL_SET)
        (void)__atomic_exchange_n((uint64_t *)p, value, __ATOMIC_SEQ_CST);
    else
        __atomic_fetch_add((uint64_t *)p, value, __ATOMIC_SEQ_CST);
}

/* put_signal to a CPU-mapped target: copy n bytes from src to (rank, dest),
 * then set or add `value` to the 64-bit word at (rank, sig_addr).  Complete on
 * return.  GX_NOT_MAPPED: take the route's transport (gexmk.core's
 * put_signal_slow). */
static inline int gx_put_signal(const gx_team *tm, int rank, uintptr_t dest, const void *src,
                                size_t n, uintptr_t sig_addr, uint64_t value, int sig_op)
{
    char *p, *s; gx_route *r;
    int rc;
    if (sig_op != GX_SIGNAL_SET && sig_op != GX_SIGNAL_ADD)
        return GX_EOP;
    rc = gx_locate(tm, rank, dest, n, &p, &r);
    if (rc != GX_OK)
        return rc;
    rc = gx_locate(tm, rank, sig_addr, 8, &s, &r);
    if (rc != GX_OK)
        return rc;
    if (((uintptr_t)s & 7) != 0)
        return GX_ERANGE;
    if (gx_in_dev(tm, src, n))
        return GX_NOT_MAPPED;
    memcpy(p, src, n);
    gx_signal_local(s, value, sig_op);
    gx_wake_waiters(r->t->wake);
    return GX_OK;
}

/* signal_op on a CPU-mapped target: set or add `value` to (rank, sig_addr). */
static inline int gx_signal_op(const gx_team *tm, int rank, uintptr_t sig_addr, uint64_t value,
                               int sig_op)
{
    char *s; gx_route *r;
    int rc;
    if (sig_op != GX_SIGNAL_SET && sig_op != GX_SIGNAL_ADD)
        return GX_EOP;
    rc = gx_locate(tm, rank, sig_addr, 8, &s, &r);
    if (rc != GX_OK)
        return rc;
    if (((uintptr_t)s & 7) != 0)
        return GX_ERANGE;
    gx_signal_local(s, value, sig_op);
    gx_wake_waiters(r->t->wake);
    return GX_OK;
}

/* ---- VIS helpers: fragments and strided shapes ---------------------------- */

/* Copy n bytes where n is small and known at the call: lets the compiler
 * inline the common element sizes of strided copies. */
static inline void gx_copy_elem(char *d, const char *s, size_t n)
{
    switch (n) {
    case 4: memcpy(d, s, 4); break;
    case 8: memcpy(d, s, 8); break;
    case 16: memcpy(d, s, 16); break;
    default: memcpy(d, s, n); break;
    }
}

/* Elements of a strided shape. */
static inline size_t gx_vis_elems(const gx_vis *v)
{
    size_t e = 1;
    for (int k = 0; k < v->ndim; k++)
        e *= v->count[k];
    return e;
}

/* The fragments of elements [start, start + max) of strided shape v into out;
 * returns how many (fewer at the end of the shape). */
static inline size_t gx_vis_fill(const gx_vis *v, size_t start, gx_frag *out, size_t max)
{
    size_t idx[GX_VIS_MAXDIM], rest = start, total = gx_vis_elems(v), k, i;
    ptrdiff_t lo = 0, ro = 0;
    int d;
    if (start >= total)
        return 0;
    for (d = 0; d < v->ndim; d++) {
        idx[d] = rest % v->count[d];
        rest /= v->count[d];
        lo += (ptrdiff_t)idx[d] * v->lstride[d];
        ro += (ptrdiff_t)idx[d] * v->rstride[d];
    }
    k = total - start < max ? total - start : max;
    for (i = 0; i < k; i++) {
        out[i].local = v->lbase + lo;
        out[i].remote = v->rbase + (uintptr_t)ro;
        out[i].n = v->elem;
        for (d = 0; d < v->ndim; d++) {       /* odometer, dimension 0 fastest */
            lo += v->lstride[d];
            ro += v->rstride[d];
            if (++idx[d] < v->count[d])
                break;
            lo -= (ptrdiff_t)v->count[d] * v->lstride[d];
            ro -= (ptrdiff_t)v->count[d] * v->rstride[d];
            idx[d] = 0;
        }
    }
    return k;
}

/* Copy a strided shape between local memory and a CPU mapping of the target
 * (`mapped` = the local address of the target's byte v->rbase). */
static inline void gx_vis_copy_strided(const gx_vis *v, char *mapped, int is_put)
{
    size_t idx[GX_VIS_MAXDIM] = {0}, c0 = v->count[0], e = v->elem, i;
    ptrdiff_t ls0 = v->lstride[0], rs0 = v->rstride[0];
    char *l = v->lbase, *r = mapped;
    int d;
    if (v->ndim == 0)
        return;
    for (;;) {
        char *lp = l, *rp = r;
        if (is_put)
            for (i = 0; i < c0; i++, lp += ls0, rp += rs0)
                gx_copy_elem(rp, lp, e);
        else
            for (i = 0; i < c0; i++, lp += ls0, rp += rs0)
                gx_copy_elem(lp, rp, e);
        for (d = 1; d < v->ndim; d++) {
            l += v->lstride[d];
            r += v->rstride[d];
            if (++idx[d] < v->count[d])
                break;
            l -= (ptrdiff_t)v->count[d] * v->lstride[d];
            r -= (ptrdiff_t)v->count[d] * v->rstride[d];
            idx[d] = 0;
        }
        if (d == v->ndim)
            return;
    }
}

/* Copy fragments between local memory and a CPU mapping of the target whose
 * remote byte `base` is at local address `mapped`. */
static inline void gx_vis_copy_frags(const gx_frag *f, size_t n, char *mapped, uintptr_t base,
                                     int is_put)
{
    for (size_t i = 0; i < n; i++) {
        char *p = mapped + (f[i].remote - base);
        if (is_put)
            memcpy(p, f[i].local, f[i].n);
        else
            memcpy(f[i].local, p, f[i].n);
    }
}

/* Small atomics for completion state shared with progress threads. */
static inline int gx_xchg_int(volatile int *p, int v) { return __atomic_exchange_n(p, v, __ATOMIC_ACQ_REL); }
static inline int gx_load_int(const volatile int *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline long gx_add_long(volatile long *p, long v) { return __atomic_add_fetch(p, v, __ATOMIC_ACQ_REL); }
static inline long gx_load_long(const volatile long *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline void *gx_load_ptr(void *const volatile *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline void *gx_xchg_ptr(void *volatile *p, void *v) { return __atomic_exchange_n(p, v, __ATOMIC_ACQ_REL); }
/* Store v where *p is NULL; 1 on success. */
static inline int gx_claim_ptr(void *volatile *p, void *v)
{
    void *expected = NULL;
    return __atomic_compare_exchange_n(p, &expected, v, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

#ifdef __cplusplus
}
#endif
#endif /* GEXMK_GEXMK_H */
