# Declarations only: the PMIx client API (PMIx 4, <pmix.h>; Debian libpmix-dev).
#
# What the pmix bootstrap needs: init/finalize, job-level keys (size, local
# peers), publication (Put/Commit/Fence/Get) and event notification for
# process termination.  String keys (PMIX_JOB_SIZE, ...) are macros for string
# literals and are declared as `const char*`; macros that take arguments
# (PMIX_INFO_CREATE, ...) as functions.  pmix_value_t's union is declared with
# only the members read here.

from libc.stdint cimport uint8_t, uint16_t, uint32_t


cdef extern from "pmix.h" nogil:

    enum:
        PMIX_MAX_NSLEN
        PMIX_MAX_KEYLEN
        PMIX_VERSION_MAJOR
        PMIX_VERSION_MINOR

    ctypedef int pmix_status_t
    ctypedef uint32_t pmix_rank_t
    ctypedef uint16_t pmix_data_type_t
    ctypedef uint8_t pmix_scope_t
    ctypedef uint32_t pmix_info_directives_t

    # status and event codes
    enum:
        PMIX_SUCCESS
        PMIX_ERR_TIMEOUT
        PMIX_ERR_UNREACH
        PMIX_ERR_NOT_FOUND
        PMIX_ERR_LOST_CONNECTION
        PMIX_ERR_PROC_TERM_WO_SYNC
        PMIX_EVENT_PROC_TERMINATED
        PMIX_PROC_TERMINATED
        PMIX_EVENT_ACTION_COMPLETE

    # data types and scopes
    enum:
        PMIX_BOOL
        PMIX_STRING
        PMIX_INT
        PMIX_UINT32
        PMIX_PROC
        PMIX_PROC_RANK
        PMIX_GLOBAL

    const pmix_rank_t PMIX_RANK_WILDCARD

    # keys (string literals)
    const char* PMIX_JOB_SIZE
    const char* PMIX_LOCAL_PEERS
    const char* PMIX_COLLECT_DATA
    const char* PMIX_TIMEOUT
    const char* PMIX_EVENT_AFFECTED_PROC
    const char* PMIX_HOSTNAME

    ctypedef struct pmix_proc_t:
        char nspace[256]            # pmix_nspace_t: PMIX_MAX_NSLEN + 1
        pmix_rank_t rank

    cdef union pmix_value_data "pmix_value_data_unnamed":
        char* string
        uint32_t uint32
        pmix_rank_t rank
        pmix_proc_t* proc

    ctypedef struct pmix_value_t:
        pmix_data_type_t type
        pmix_value_data data

    ctypedef struct pmix_info_t:
        char key[512]               # pmix_key_t: PMIX_MAX_KEYLEN + 1
        pmix_info_directives_t flags
        pmix_value_t value

    ctypedef void (*pmix_op_cbfunc_t)(pmix_status_t status, void* cbdata)
    ctypedef void (*pmix_event_notification_cbfunc_fn_t)(
        pmix_status_t status, pmix_info_t* results, size_t nresults,
        pmix_op_cbfunc_t cbfunc, void* thiscbdata, void* notification_cbdata)
    ctypedef void (*pmix_notification_fn_t)(
        size_t evhdlr_registration_id, pmix_status_t status, const pmix_proc_t* source,
        pmix_info_t info[], size_t ninfo, pmix_info_t* results, size_t nresults,
        pmix_event_notification_cbfunc_fn_t cbfunc, void* cbdata)
    ctypedef void (*pmix_hdlr_reg_cbfunc_t)(pmix_status_t status, size_t refid, void* cbdata)

    pmix_status_t PMIx_Init(pmix_proc_t* proc, pmix_info_t info[], size_t ninfo)
    pmix_status_t PMIx_Finalize(const pmix_info_t info[], size_t ninfo)
    int PMIx_Initialized()
    const char* PMIx_Error_string(pmix_status_t status)
    const char* PMIx_Get_version()

    pmix_status_t PMIx_Put(pmix_scope_t scope, const char key[], pmix_value_t* val)
    pmix_status_t PMIx_Commit()
    pmix_status_t PMIx_Fence(const pmix_proc_t procs[], size_t nprocs,
                             const pmix_info_t info[], size_t ninfo)
    pmix_status_t PMIx_Get(const pmix_proc_t* proc, const char key[],
                           const pmix_info_t info[], size_t ninfo, pmix_value_t** val)

    pmix_status_t PMIx_Register_event_handler(
        pmix_status_t codes[], size_t ncodes, pmix_info_t info[], size_t ninfo,
        pmix_notification_fn_t evhdlr, pmix_hdlr_reg_cbfunc_t cbfunc, void* cbdata)

    pmix_status_t PMIx_Value_load(pmix_value_t* val, const void* data, pmix_data_type_t type)
    void PMIx_Value_destruct(pmix_value_t* val)
    pmix_status_t PMIx_Info_load(pmix_info_t* info, const char* key, const void* data,
                                 pmix_data_type_t type)

    # macros
    void PMIX_VALUE_RELEASE(pmix_value_t* m)
    void PMIX_INFO_CREATE(pmix_info_t* m, size_t n)
    void PMIX_INFO_FREE(pmix_info_t* m, size_t n)
