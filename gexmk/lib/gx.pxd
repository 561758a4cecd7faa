# Declarations only: the C data path of include/gexmk/gexmk.h.
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
        GX_TR_NONE
        GX_TR_SELF
        GX_TR_NBRHD
        GX_TR_PVM
        GX_TR_OFI

    enum:
        GX_MK_HOST
        GX_MK_CUDA_UVA
        GX_MK_HIP
        GX_MK_ZE

    ctypedef struct gx_target:
        char* local_base
        uintptr_t remote_base
        size_t size
        int transport
        int kind
        int pid
        int jobrank
        int ep_index
        int dead
        uint64_t net_addr
        uint64_t net_aaddr
        uint64_t net_key
        uint64_t net_base

    ctypedef struct gx_team:
        int rank
        int size
        gx_target** targets
        void* owner
        void* net_ep

    int gx_locate(const gx_team* tm, int rank, uintptr_t addr, size_t n, char** out, gx_target** tgt)
    int gx_put(const gx_team* tm, int rank, uintptr_t dest, const void* src, size_t n)
    int gx_get(const gx_team* tm, int rank, void* dest, uintptr_t src, size_t n)
    void gx_fence()
    void gx_quiet()

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

    ctypedef union gx_val:
        int32_t i32
        uint32_t u32
        int64_t i64
        uint64_t u64
        float flt
        double dbl

    size_t gx_dt_size(int dt)
    int gx_op_valid(int dt, int op)
    int gx_atomic_local(void* p, int dt, int op, gx_val a, gx_val b, gx_val* result)
    int gx_atomic(const gx_team* tm, int rank, uintptr_t addr, int dt, int op,
                  gx_val a, gx_val b, gx_val* result)

    int gx_xchg_int(int* p, int v)
    int gx_load_int(const int* p)
    long gx_add_long(long* p, long v)
    long gx_load_long(const long* p)
    void* gx_load_ptr(void** p)
    void* gx_xchg_ptr(void** p, void* v)
    int gx_claim_ptr(void** p, void* v)
