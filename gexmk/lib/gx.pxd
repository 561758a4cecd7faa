# Declarations only: the C data path of include/gexmk/gexmk.h.
from libc.stddef cimport ptrdiff_t
from libc.stdint cimport int32_t, uint32_t, int64_t, uint64_t, uintptr_t

cdef extern from "gexmk/gexmk.h" nogil:
    enum:
        GX_OK
        GX_NOT_MAPPED
        GX_ERANK
        GX_ERANGE
        GX_EDEAD
        GX_EOP

    enum:
        GX_MK_HOST
        GX_MK_CUDA_UVA
        GX_MK_HIP
        GX_MK_ZE

    ctypedef union gx_val:
        int32_t i32
        uint32_t u32
        int64_t i64
        uint64_t u64
        float flt
        double dbl

    ctypedef struct gx_wake:
        uint32_t seq
        uint32_t waiters

    ctypedef struct gx_target:
        uintptr_t remote_base
        size_t size
        int kind
        int device
        int pid
        int jobrank
        int ep_index
        int dead
        gx_wake* wake

    enum:
        GX_BLOCKING
        GX_NB
        GX_NBI
        GX_NBI_LCNOW

    enum:
        GX_CAT_GET
        GX_CAT_PUT
        GX_CAT_RMW
        GX_CAT_ALL
        GX_WAIT_DRIVING
        GX_WAIT_SLEEP
        GX_WAIT_SETTLE
    int GX_WAIT_SLEEP_US(long us)
    int GX_WAIT_SLEEP_OF(int flags)

    enum:
        GX_VIS_MAXDIM
        GX_VIS_CHUNK

    ctypedef struct gx_frag:
        void* local
        uintptr_t remote
        size_t n

    ctypedef struct gx_vis:
        const gx_frag* frags
        size_t nfrags
        size_t total
        int ndim
        size_t elem
        size_t count[8]
        ptrdiff_t lstride[8]
        ptrdiff_t rstride[8]
        char* lbase
        uintptr_t rbase

    ctypedef struct gx_xfer:
        void* ep
        void* peer
        gx_target* t
        uintptr_t remote
        void* local
        size_t n
        int mode
        int local_kind
        int local_device
        void* stream
        int dt
        int op
        gx_val a
        gx_val b
        gx_val* result
        void** handle
        uintptr_t sig_addr
        const gx_vis* vis

    ctypedef int (*gx_tr_xfer_fn)(gx_xfer* x) except -1 nogil
    ctypedef int (*gx_tr_op_fn)(void* op, gx_val* result) except -1 nogil
    ctypedef void (*gx_tr_orphan_fn)(void* op) noexcept nogil
    ctypedef int (*gx_tr_sync_fn)(void* ep, int categories) except -1 nogil

    ctypedef struct gx_tr_ops:
        const char* name
        gx_tr_xfer_fn put
        gx_tr_xfer_fn get
        gx_tr_xfer_fn atomic
        gx_tr_op_fn test
        gx_tr_op_fn wait
        gx_tr_orphan_fn orphan
        gx_tr_sync_fn sync
        gx_tr_sync_fn nbi_test
        gx_tr_xfer_fn put_signal
        gx_tr_xfer_fn put_vis
        gx_tr_xfer_fn get_vis

    ctypedef struct gx_path:
        const gx_tr_ops* ops
        void* ep
        void* peer

    ctypedef struct gx_count:
        uint64_t ops
        uint64_t bytes

    enum:
        GX_CNT_PUT
        GX_CNT_GET
        GX_CNT_AMO
        GX_CNT_KINDS

    ctypedef struct gx_route:
        uintptr_t remote_base
        size_t size
        char* local_base
        int dead
        gx_count mapped[3]
        gx_count via[3]
        gx_target* t
        gx_path rma
        gx_path amo

    enum:
        GX_MAX_TRANSPORTS

    ctypedef struct gx_ep:
        int index
        int destroyed
        int seg_kind
        int seg_device
        int unsynced
        int ntr
        gx_path tr[8]

    ctypedef struct gx_team:
        int rank
        int size
        gx_route** routes
        void* owner
        gx_ep* ep
        uintptr_t dev_lo
        uintptr_t dev_hi

    int gx_in_dev(const gx_team* tm, const void* p, size_t n)
    int gx_locate(const gx_team* tm, int rank, uintptr_t addr, size_t n, char** out, gx_route** rt)
    int gx_put(const gx_team* tm, int rank, uintptr_t dest, const void* src, size_t n)
    int gx_get(const gx_team* tm, int rank, void* dest, uintptr_t src, size_t n)
    void gx_mem_fence()
    void gx_count_add(gx_count* c, size_t n)

    enum:
        GX_DT_I32
        GX_DT_U32
        GX_DT_I64
        GX_DT_U64
        GX_DT_FLT
        GX_DT_DBL
        GX_DT_COUNT

    enum:
        GX_OP_SET, GX_OP_GET, GX_OP_SWAP, GX_OP_CAS, GX_OP_FCAS
        GX_OP_ADD, GX_OP_FADD, GX_OP_SUB, GX_OP_FSUB
        GX_OP_INC, GX_OP_FINC, GX_OP_DEC, GX_OP_FDEC
        GX_OP_AND, GX_OP_FAND, GX_OP_OR, GX_OP_FOR, GX_OP_XOR, GX_OP_FXOR
        GX_OP_MIN, GX_OP_FMIN, GX_OP_MAX, GX_OP_FMAX
        GX_OP_COUNT


    size_t gx_dt_size(int dt)
    int gx_op_valid(int dt, int op)
    int gx_atomic_local(void* p, int dt, int op, gx_val a, gx_val b, gx_val* result)
    int gx_atomic(const gx_team* tm, int rank, uintptr_t addr, int dt, int op,
                  gx_val a, gx_val b, gx_val* result)

    enum:
        GX_SIGNAL_SET
        GX_SIGNAL_ADD

    enum:
        GX_CMP_EQ, GX_CMP_NE, GX_CMP_GT, GX_CMP_GE, GX_CMP_LT, GX_CMP_LE
        GX_CMP_COUNT

    enum:
        GX_WAIT_ALL
        GX_WAIT_ANY
        GX_WAIT_SOME

    void gx_cpu_relax()
    int gx_cmp_local(const void* p, int dt, int cmp, gx_val v, gx_val* seen)
    int gx_own_word(const gx_team* tm, uintptr_t addr, int dt, void** out)
    void gx_signal_local(void* p, uint64_t value, int sig_op)
    void gx_wake_waiters(gx_wake* w)
    uint32_t gx_wake_enter(gx_wake* w)
    int gx_wake_sleep(gx_wake* w, uint32_t seq, long ns)
    void gx_wake_leave(gx_wake* w)
    int gx_put_signal(const gx_team* tm, int rank, uintptr_t dest, const void* src, size_t n,
                      uintptr_t sig_addr, uint64_t value, int sig_op)
    int gx_signal_op(const gx_team* tm, int rank, uintptr_t sig_addr, uint64_t value, int sig_op)

    size_t gx_vis_elems(const gx_vis* v)
    size_t gx_vis_fill(const gx_vis* v, size_t start, gx_frag* out, size_t max)
    void gx_vis_copy_strided(const gx_vis* v, char* mapped, int is_put)
    void gx_vis_copy_frags(const gx_frag* f, size_t n, char* mapped, uintptr_t base, int is_put)

    int gx_xchg_int(int* p, int v)
    int gx_load_int(const int* p)
    long gx_add_long(long* p, long v)
    long gx_load_long(const long* p)
    void* gx_load_ptr(void** p)
    void* gx_xchg_ptr(void** p, void* v)
    int gx_claim_ptr(void** p, void* v)
