# Core objects: client, endpoints, teams, events.  Cython users cimport this
# (and gexmk.rma for the nogil data path).
from libc.stdint cimport uintptr_t
from gexmk.lib.gx cimport gx_team, gx_target, gx_val
from gexmk.memory cimport Segment

cdef class Client:
    cdef readonly int rank                 # job rank
    cdef readonly int size                 # job size
    cdef readonly object bootstrap
    cdef readonly Team tm                  # primordial team (EP 0)
    cdef list _eps                         # index -> Endpoint (None once destroyed)
    cdef dict _dir                         # (jobrank, ep_index) -> _Target
    cdef dict _maps                        # (jobrank, token) -> [addr, maplen, refs]
    cdef object _segments                  # WeakSet of live segments
    cdef object _teams                     # WeakSet of teams
    cdef list _nodes
    cdef list _pids
    cdef str _force                        # GEXMK_TRANSPORT
    cdef readonly object net               # the ofi Domain, or None when no network transport
    cdef list _retired                     # destroyed client-allocated segments, kept until finalize
    cdef bint finalized
    cdef int _inflight                     # GIL-free copies in progress
    cdef object __weakref__
    cdef int check_alive(self) except -1
    cdef _Target target(self, int jobrank, int ep_index)

cdef class _Target:
    cdef gx_target* t
    cdef object map_key

cdef class Endpoint:
    cdef readonly Client client
    cdef readonly int index
    cdef readonly Segment segment
    cdef readonly int caps
    cdef readonly object net               # its ofi Endpoint, or None
    cdef void* net_handle
    cdef tuple _net_reg                    # (key, base) of the bound segment's registration
    cdef list _keep_put                    # buffers of implicit network puts, until synced
    cdef list _keep_get                    # destinations of implicit network gets, until synced
    cdef bint destroyed
    cdef object __weakref__
    cdef int check_alive(self) except -1

cdef class Team:
    cdef gx_team c
    cdef readonly Client client
    cdef readonly Endpoint ep
    cdef list _members                     # [(jobrank, ep_index)] by team rank
    cdef readonly str id
    cdef int _seq
    cdef bint _pair                        # TM-pair: no collectives
    cdef bint _closed
    cdef object __weakref__
    cdef int check_alive(self) except -1
    cdef int _set_targets(self) except -1
    cdef void _close(self) noexcept
    cdef int _check_rank(self, int rank) except -1
    cdef list _exchange(self, object payload)
    cdef int _put(self, int rank, uintptr_t dest, const void* p, size_t n) except -1
    cdef int _get(self, void* p, int rank, uintptr_t src, size_t n) except -1
    cdef object _issue(self, bint is_put, int mode, int rank, uintptr_t addr, object buf)
    @staticmethod
    cdef Team _make(Client client, Endpoint ep, list members, int rank, str tid, bint pair)

cdef class Event:
    cdef bint _done
    cdef bint _bound
    cdef object _result
    cdef object _keep
    cdef Event _lc
    cdef void* _op                         # pending network op, NULL once complete
    cdef int _dt                           # atomic data type of the fetched result, or -1
    cdef bint _region                      # an access region's event: completes with nbi_wait
    cdef int _complete(self, bint block) except -1

# The slow half of the data path: unmapped targets (process_vm), dead peers,
# and every error report.  Called by gexmk.rma when the inline path declines.
cdef int put_slow(const gx_team* tm, int rank, uintptr_t dest, const void* src, size_t n, int rc) except -1 nogil
cdef int get_slow(const gx_team* tm, int rank, void* dest, uintptr_t src, size_t n, int rc) except -1 nogil
cdef int atomic_slow(const gx_team* tm, int rank, uintptr_t addr, int dt, int op,
                     gx_val a, gx_val b, gx_val* result, int rc) except -1 nogil
cdef int rma_nbi_slow(const gx_team* tm, int rank, bint is_put, uintptr_t remote, void* local,
                      size_t n, int rc) except -1 nogil
cdef int nbi_sync(const gx_team* tm) except -1 nogil
