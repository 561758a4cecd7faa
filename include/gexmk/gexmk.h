/* gexmk.h - the C-level data path of gexmk, for embedding.
 *
 * What lives here: the structures through which one process sees the bound
 * segments of its peers' endpoints, and the inline functions that move bytes
 * and perform atomics on segments that are mapped into this process (the
 * `self` and `nbrhd` transports).  Everything here runs without the GIL and
 * without a syscall.  The Cython layer (gexmk/rma.pxd) wraps these functions
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

/* Transports, chosen per (initiating EP, target EP). */
enum {
    GX_TR_NONE = 0,      /* nothing published yet */
    GX_TR_SELF = 1,      /* same process: memcpy */
    GX_TR_NBRHD = 2,     /* same node, segment mapped from shared memory: memcpy */
    GX_TR_PVM = 3,       /* same node, client memory not mappable: process_vm_{read,write}v */
    GX_TR_OFI = 4,       /* libfabric (later) */
};

/* Memory kinds (classes). */
enum { GX_MK_HOST = 0, GX_MK_CUDA_UVA = 1, GX_MK_HIP = 2, GX_MK_ZE = 3 };

/* What this process knows of one remote endpoint's bound segment. */
typedef struct gx_target {
    char *local_base;        /* mapping of the segment in this process; NULL if not mapped */
    uintptr_t remote_base;   /* address of the segment in its owner's address space */
    size_t size;             /* bytes; 0 while nothing is published */
    int transport;           /* GX_TR_* */
    int kind;                /* GX_MK_* */
    int pid;                 /* owner's process id */
    int jobrank;             /* owner's rank in the job */
    int ep_index;            /* owner's endpoint index */
    volatile int dead;       /* set when the owner is known to have died */
    /* network transports (ofi): how the initiator names the target */
    uint64_t net_addr;       /* fi_addr_t of the target endpoint */
    uint64_t net_aaddr;      /* fi_addr_t its atomics go to (net_addr unless split) */
    uint64_t net_key;        /* registration key of the target segment */
    uint64_t net_base;       /* address the network uses for the segment's first byte
                                (remote_base with FI_MR_VIRT_ADDR, else 0) */
} gx_target;

/* The hot-path view of a team: one target pointer per team rank.  The
 * targets are owned by the process-wide directory and outlive the team. */
typedef struct gx_team {
    int rank;                /* this member's rank in the team */
    int size;                /* number of members */
    gx_target **targets;     /* [size] */
    void *owner;             /* the Python Team object (borrowed), for error reports */
    void *net_ep;            /* the local endpoint's network state (NULL without one) */
} gx_team;

/* Locate [addr, addr + n) of team rank `rank` in this process.
 * On GX_OK, *out is the local address; on GX_NOT_MAPPED, *tgt is set and the
 * caller must use the target's transport. */
static inline int gx_locate(const gx_team *tm, int rank, uintptr_t addr, size_t n,
                            char **out, gx_target **tgt)
{
    if ((unsigned)rank >= (unsigned)tm->size)
        return GX_ERANK;
    gx_target *t = tm->targets[rank];
    *tgt = t;
    uintptr_t off = addr - t->remote_base;   /* wraps when addr < base: caught below */
    if (addr < t->remote_base || off > t->size || n > t->size - off)
        return GX_ERANGE;
    if (t->local_base == NULL || t->dead)
        return t->dead ? GX_EDEAD : GX_NOT_MAPPED;
    *out = t->local_base + off;
    return GX_OK;
}

/* Copy n bytes from local src to (rank, dest).  Complete on return: the
 * data is visible to the target (and to anyone it synchronises with). */
static inline int gx_put(const gx_team *tm, int rank, uintptr_t dest, const void *src, size_t n)
{
    char *p; gx_target *t;
    int rc = gx_locate(tm, rank, dest, n, &p, &t);
    if (rc != GX_OK)
        return rc;
    memcpy(p, src, n);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    return GX_OK;
}

/* Copy n bytes from (rank, src) into local dest. */
static inline int gx_get(const gx_team *tm, int rank, void *dest, uintptr_t src, size_t n)
{
    char *p; gx_target *t;
    int rc = gx_locate(tm, rank, src, n, &p, &t);
    if (rc != GX_OK)
        return rc;
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    memcpy(dest, p, n);
    return GX_OK;
}

/* fence: orders earlier puts/atomics before later ones to the same target.
 * quiet: completes all earlier puts/atomics.  Both are a full fence for
 * mapped memory, where every put is complete when it returns. */
static inline void gx_fence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void gx_quiet(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

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

/* An operand or result of any data type. */
typedef union gx_val {
    int32_t i32; uint32_t u32; int64_t i64; uint64_t u64; float flt; double dbl;
} gx_val;

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
    char *p; gx_target *t;
    size_t n = gx_dt_size(dt);
    int rc = gx_locate(tm, rank, addr, n, &p, &t);
    if (rc != GX_OK)
        return rc;
    if (((uintptr_t)p & (n - 1)) != 0)
        return GX_ERANGE;
    return gx_atomic_local(p, dt, op, a, b, result);
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
