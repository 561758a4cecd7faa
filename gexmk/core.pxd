# Core objects: client, endpoints, teams, events.  Cython users cimport this
# (and gexmk.rma for the nogil data path).
from libc.stdint cimport uintptr_t, uint64_t
from gexmk.lib.gx cimport gx_team, gx_target, gx_route, gx_ep, gx_val, gx_tr_ops
from gexmk.memory cimport Segment

cdef class Client:
    cdef readonly int rank                 # job rank
    cdef readonly int size                 # job size
    cdef readonly object bootstrap
    cdef readonly object config            # gexmk.config.Config of this init
    cdef readonly Team tm                  # primordial team (EP 0)
    cdef readonly dict transports          # name -> the transport's control-plane object
    cdef list _order                       # the transports, in registration order
    cdef list _eps                         # index -> Endpoint (None once destroyed)
    cdef dict _dir                         # (jobrank, ep_index) -> _Target
    cdef dict _routes                      # (local ep_index, jobrank, ep_index) -> _Route
    cdef object _segments                  # WeakSet of live segments
    cdef object _teams                     # WeakSet of teams
    cdef object _pending                   # WeakSet of events over pending transport ops
    cdef object _parked                    # deque: ops whose Event was dropped before they completed,
                                           # with what they touch (event.pxi _Parked)
    cdef list _nodes
    cdef list _pids
    cdef list _retired                     # destroyed segments whose memory peers may still reach
    cdef dict _held                        # segment -> publications of it not yet applied everywhere
    cdef object _published                 # WeakSet: segments ever published to peers (their
                                           # address may be in peers' hands until finalize)
    cdef list _deferred                    # [(segment, bound)] destroyed while held: released later
    cdef list _kinds                       # memory kinds made by mk_create, closed last
    cdef bint finalized
    cdef int _inflight                     # GIL-free copies in progress
    cdef object _sync                      # the library's sync area (core.src/coll.pxi)
    cdef object __weakref__
    cdef int check_alive(self) except -1
    cdef _Target target(self, int jobrank, int ep_index)
    cdef _Route route(self, Endpoint ep, int jobrank, int ep_index)
    cdef int _choose(self, _Route rt) except -1

cdef class _Target:
    cdef gx_target* t
    cdef dict ctx                          # transport name -> its per-target context (or absent)
    cdef list routes                       # the routes of local endpoints to it

cdef class _Route:
    cdef gx_route* r
    cdef _Target target
    cdef int ep_index
    cdef str rma_name                      # the chosen paths' names, for users
    cdef str amo_name
    cdef object view                       # (address, device) of a device mapping here, or None
    cdef tuple keep                        # the chosen contexts, alive while the route uses them
    cdef dict refused                      # 'rma'/'atomic' -> name of a staged path refused
    cdef dict stats                        # path name -> [9 ints]: counters of paths chosen before
    cdef int fold(self) except -1
    cdef int reset(self) except -1

cdef class Endpoint:
    cdef gx_ep c
    cdef readonly Client client
    cdef readonly int index
    cdef readonly Segment segment
    cdef readonly int caps
    cdef readonly dict contexts            # transport name -> its endpoint context
    cdef dict _blobs                       # transport name -> bytes it publishes for the segment
    cdef list _keep_put                    # buffers of implicit puts, until synced
    cdef list _keep_get                    # destinations of implicit gets, until synced
    cdef object __weakref__
    cdef int check_alive(self) except -1

cdef class Team:
    cdef gx_team c
    cdef readonly Client client
    cdef readonly Endpoint ep
    cdef list _members                     # [(jobrank, ep_index)] by team rank
    cdef list _route_objs                  # [_Route] by team rank: alive while the team is
    cdef readonly str id
    cdef int _seq
    cdef bint _pair                        # TM-pair: no collectives
    cdef str _closed                       # why the team is closed, or None
    cdef object _coll                      # collective state, from the first collective (coll.pxi)
    cdef list _unsettled                   # publications not yet known applied everywhere:
                                           # [(barriers entered then, release calls, segments)]
    cdef object __weakref__
    cdef int check_alive(self) except -1
    cdef int _set_routes(self) except -1
    cdef int _hold(self, list settle, list segs) except -1
    cdef int _settled(self, uint64_t barrier) except -1
    cdef void _close(self, str why) noexcept
    cdef int _check_rank(self, object rank, str sig) except -1
    cdef list _exchange(self, object payload)
    cdef int _put(self, int rank, uintptr_t dest, const void* p, size_t n) except -1
    cdef int _get(self, void* p, int rank, uintptr_t src, size_t n) except -1
    cdef object _issue(self, bint is_put, int mode, int rank, uintptr_t addr, object buf,
                       bint copy=*)
    @staticmethod
    cdef Team _make(Client client, Endpoint ep, list members, int rank, str tid, bint pair)

cdef class Event:
    cdef bint _done
    cdef bint _bound
    cdef object _result
    cdef object _keep                      # what the operation touches, alive until it completes
    cdef Event _lc
    cdef const gx_tr_ops* _ops             # the transport of a pending op
    cdef void* _op                         # pending transport op, NULL once complete
    cdef int _dt                           # atomic data type of the fetched result, or -1
    cdef bint _region                      # an access region's event: completes with nbi_wait
    cdef object _failed                    # the error a finalize left it with
    cdef object _park                      # its client's _parked: where a pending op goes,
                                           # with _keep, when this event is dropped
    cdef object __weakref__
    cdef int _complete(self, bint block) except -1
    cdef void _fail(self, object error) noexcept

# The slow half of the data path: every target the inline path declines (not
# CPU-mapped, a device buffer, a dead peer) and every error report.  Called by
# gexmk.rma when the inline path declines.
cdef int put_slow(const gx_team* tm, int rank, uintptr_t dest, const void* src, size_t n, int rc) except -1 nogil
cdef int get_slow(const gx_team* tm, int rank, void* dest, uintptr_t src, size_t n, int rc) except -1 nogil
cdef int atomic_slow(const gx_team* tm, int rank, uintptr_t addr, int dt, int op,
                     gx_val a, gx_val b, gx_val* result, int rc) except -1 nogil
cdef int rma_nbi_slow(const gx_team* tm, int rank, bint is_put, uintptr_t remote, void* local,
                      size_t n, int rc) except -1 nogil
cdef int nbi_sync(const gx_team* tm, int categories) except -1 nogil
# VIS (core.src/vis.pxi): check and move fragments or a strided shape;
# GX_BLOCKING or GX_NBI / GX_NBI_LCNOW.
from gexmk.lib.gx cimport gx_vis
cdef int vis_c(const gx_team* tm, int rank, bint is_put, gx_vis* v, int mode) except -1 nogil

# Signals and waiting (core.src/signal.pxi): put_signal/signal_op the inline
# path declined, and the waiting primitive (words of the team endpoint's own
# segment; GX_WAIT_ALL/ANY/SOME; timeout <= 0: GEXMK_TIMEOUT).
cdef int put_signal_slow(const gx_team* tm, int rank, uintptr_t dest, const void* src, size_t n,
                         uintptr_t sig_addr, uint64_t value, int sig_op, int mode,
                         void** handle, const gx_tr_ops** handle_ops, int rc) except -1 nogil
cdef int signal_op_slow(const gx_team* tm, int rank, uintptr_t sig_addr, uint64_t value,
                        int sig_op, int rc) except -1 nogil
cdef int wait_progress(const gx_team* tm) except -1 nogil
cdef Py_ssize_t wait_words(const gx_team* tm, const uintptr_t* addrs, Py_ssize_t n, int dt,
                           int cmp, const gx_val* vals, bint vector, int mode, bint block,
                           double timeout, const unsigned char* skip, Py_ssize_t* indices,
                           const char* sig) except -1 nogil
cdef int wait_until_word(const gx_team* tm, uintptr_t addr, int dt, int cmp, gx_val value,
                         double timeout) except -1 nogil
