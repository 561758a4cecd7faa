# cython: language_level=3
"""The PMIx client under the ``pmix`` bootstrap plug-in (:mod:`gexmk.bootstrap.pmix`).

A thin layer over ``pmix.h`` (declarations in ``gexmk/lib/libpmix.pxd``):
connect to the launcher's PMIx server, read job-level keys, publish and fetch
string values through PMIx_Put/PMIx_Commit/PMIx_Fence(collect data)/PMIx_Get,
and hear of process terminations through PMIx event notification.  Every
blocking call runs without the GIL; failures raise
:class:`~gexmk.errors.BootstrapError` naming the call and PMIx's status.
Built only where pmix.h was found.
"""

from libc.string cimport strcmp

from gexmk.lib.libpmix cimport *

from gexmk.errors import BootstrapError

cdef pmix_proc_t _me
cdef bint _initialized = False
cdef object _on_death = None

#: The PMIx library's version string.
VERSION = PMIx_Get_version().decode(errors="replace")


cdef int _check(const char* call, pmix_status_t rc, str what) except -1:
    if rc != PMIX_SUCCESS:
        raise BootstrapError(f"{call.decode()} failed{what}: {PMIx_Error_string(rc).decode()} "
                             f"({rc})")
    return 0


def init():
    """Connect to the PMIx server named by the environment (PMIX_SERVER_URI*,
    PMIX_NAMESPACE, PMIX_RANK); returns ``(namespace, rank)``.  Idempotent."""
    global _initialized
    cdef pmix_status_t rc
    if not _initialized:
        with nogil:
            rc = PMIx_Init(&_me, NULL, 0)
        _check(b"PMIx_Init", rc, " (is the PMIx server that started this process, named by "
                                 "PMIX_SERVER_URI*, still running?)")
        _initialized = True
    return _me.nspace.decode(), _me.rank


def finalize():
    """Disconnect from the PMIx server (once; a launcher counts a process that exits
    without it as failed)."""
    global _initialized
    if _initialized:
        _initialized = False
        with nogil:
            PMIx_Finalize(NULL, 0)


cdef pmix_value_t* _get(pmix_rank_t rank, const char* key, int timeout) except NULL:
    cdef pmix_proc_t proc = _me
    proc.rank = rank
    cdef pmix_value_t* val = NULL
    cdef pmix_info_t* info = NULL
    cdef pmix_status_t rc
    PMIX_INFO_CREATE(info, 1)
    PMIx_Info_load(&info[0], PMIX_TIMEOUT, &timeout, PMIX_INT)
    with nogil:
        rc = PMIx_Get(&proc, key, info, 1, &val)
    PMIX_INFO_FREE(info, 1)
    who = "the job" if rank == PMIX_RANK_WILDCARD else f"rank {rank}"
    _check(b"PMIx_Get", rc, f" for key {key.decode()!r} of {who}")
    if val == NULL:
        raise BootstrapError(f"PMIx_Get returned no value for key {key.decode()!r} of {who}")
    return val


def job_size(int timeout):
    """The job's size (PMIX_JOB_SIZE)."""
    cdef pmix_value_t* val = _get(PMIX_RANK_WILDCARD, PMIX_JOB_SIZE, timeout)
    try:
        if val.type != PMIX_UINT32:
            raise BootstrapError(f"PMIx's {PMIX_JOB_SIZE.decode()} has type {val.type}, not uint32")
        return val.data.uint32
    finally:
        PMIX_VALUE_RELEASE(val)


def local_peers(int timeout):
    """The job ranks on this node, from PMIx (PMIX_LOCAL_PEERS), in rank order."""
    cdef pmix_value_t* val = _get(PMIX_RANK_WILDCARD, PMIX_LOCAL_PEERS, timeout)
    try:
        if val.type != PMIX_STRING or val.data.string == NULL:
            raise BootstrapError(f"PMIx's {PMIX_LOCAL_PEERS.decode()} has type {val.type}, "
                                 f"not a string")
        text = val.data.string.decode(errors="replace")
    finally:
        PMIX_VALUE_RELEASE(val)
    try:
        return sorted(int(r) for r in text.split(",") if r.strip())
    except ValueError:
        raise BootstrapError(f"PMIx's {PMIX_LOCAL_PEERS.decode()} is {text!r}, not a list of "
                             f"ranks") from None


def get_string(rank, key, int timeout):
    """The string ``key`` published by ``rank`` (None: of the job, PMIX_RANK_WILDCARD)."""
    cdef bytes k = key.encode()
    cdef pmix_rank_t r = PMIX_RANK_WILDCARD if rank is None else <pmix_rank_t>rank
    cdef pmix_value_t* val = _get(r, k, timeout)
    try:
        if val.type != PMIX_STRING or val.data.string == NULL:
            raise BootstrapError(f"PMIx key {key!r} has type {val.type}, not a string")
        return val.data.string.decode(errors="replace")
    finally:
        PMIX_VALUE_RELEASE(val)


def put_string(key, value):
    """Publish ``key`` = ``value`` (str) to every process of the job (PMIX_GLOBAL)."""
    cdef bytes k = key.encode(), v = value.encode()
    cdef const char* s = v
    cdef pmix_value_t val
    val.type = 0
    # A string is loaded from the char* itself (other types from a pointer to the value).
    _check(b"PMIx_Value_load", PMIx_Value_load(&val, s, PMIX_STRING), "")
    try:
        _check(b"PMIx_Put", PMIx_Put(PMIX_GLOBAL, k, &val), f" for key {key!r}")
    finally:
        PMIx_Value_destruct(&val)


def commit():
    """Make what was put visible to the PMIx server."""
    cdef pmix_status_t rc
    with nogil:
        rc = PMIx_Commit()
    _check(b"PMIx_Commit", rc, "")


def fence(int timeout):
    """Barrier over the whole job, collecting everything committed (PMIX_COLLECT_DATA),
    failing after ``timeout`` seconds (PMIX_TIMEOUT)."""
    cdef pmix_proc_t everyone = _me
    everyone.rank = PMIX_RANK_WILDCARD
    cdef pmix_info_t* info = NULL
    cdef bint yes = True
    cdef pmix_status_t rc
    PMIX_INFO_CREATE(info, 2)
    PMIx_Info_load(&info[0], PMIX_COLLECT_DATA, &yes, PMIX_BOOL)
    PMIx_Info_load(&info[1], PMIX_TIMEOUT, &timeout, PMIX_INT)
    with nogil:
        rc = PMIx_Fence(&everyone, 1, info, 2)
    PMIX_INFO_FREE(info, 2)
    _check(b"PMIx_Fence", rc, f" (namespace {_me.nspace.decode()!r}, {timeout} s)")


cdef void _event(size_t evhdlr_registration_id, pmix_status_t status,
                 const pmix_proc_t* source, pmix_info_t info[], size_t ninfo,
                 pmix_info_t* results, size_t nresults,
                 pmix_event_notification_cbfunc_fn_t cbfunc, void* cbdata) noexcept nogil:
    # PMIx's progress thread: find the affected process of our namespace, tell Python.
    cdef size_t i
    cdef long rank = -1
    cdef const pmix_proc_t* p = NULL
    for i in range(ninfo):
        if strcmp(info[i].key, PMIX_EVENT_AFFECTED_PROC) == 0 and info[i].value.type == PMIX_PROC:
            p = info[i].value.data.proc
    if p == NULL:
        p = source
    if p != NULL and strcmp(p.nspace, _me.nspace) == 0 and p.rank != PMIX_RANK_WILDCARD:
        rank = p.rank
    if rank >= 0:
        _deliver(rank)
    if cbfunc != NULL:
        cbfunc(PMIX_SUCCESS, NULL, 0, NULL, NULL, cbdata)


cdef void _deliver(long rank) noexcept nogil:
    with gil:
        try:
            if _on_death is not None:
                _on_death(rank)
        except BaseException:
            pass  # a notice is best effort; the rendezvous server reports deaths too


def on_death(callback):
    """Call ``callback(rank)`` (from PMIx's thread) when the server reports a process of
    this job terminated without PMIx_Finalize (it died).  Returns True if the server took the registration; servers
    that do not offer termination events leave death notices to the rendezvous."""
    global _on_death
    _on_death = callback
    # Only terminations without PMIx_Finalize: a rank that left cleanly is not dead.
    cdef pmix_status_t codes[1]
    codes[0] = PMIX_ERR_PROC_TERM_WO_SYNC
    cdef pmix_status_t rc
    with nogil:
        # No registration callback: the call then returns the handler's id (>= 0) or an error.
        rc = PMIx_Register_event_handler(codes, 1, NULL, 0, _event, NULL, NULL)
    return rc >= 0
