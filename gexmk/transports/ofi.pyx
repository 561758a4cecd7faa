"""The ``ofi`` transport: libfabric RDM endpoints for RMA and atomics.

Laid out by concern (``ofi.src/``): ``domain`` (fabric, domain, address
vector, provider choice), ``endpoint`` (one libfabric endpoint + CQ per gexmk
endpoint, registrations; the transport's control plane), ``rma`` (puts, gets,
the remote-completion flush), ``vis`` (vector, indexed and strided transfers:
fi_writemsg/fi_readmsg with several ranges per message, one op per call;
packed requests to staged targets), ``atomic`` (fi_atomic and the CAS fallback),
``completion`` (ops, errors, waits, nbi sync), ``progress`` (CQ reading and
the background progress thread), ``signal`` (put_signal: the signal never
before the data, three ways, and the target's side of signal messages and of
signals carried as a write's remote CQ data),
``staged`` (device segments the provider cannot reach: landing zones served
by the owner's lander, path ``ofi-staged``), ``hmem`` (device segments the
provider registers with FI_HMEM: path ``ofi-hmem``, atomics still through a
landing zone).

One :class:`Domain` per process (fabric, domain and one address vector shared
by every endpoint); one :class:`Endpoint` per gexmk endpoint, owning its
libfabric endpoint, completion queue and segment registration, so two gexmk
endpoints have independent ordering and ``quiet`` (the explicit-context model).

Operations carry a heap-allocated context (``gx_op``); whoever reads its
completion from the CQ -- the initiating thread or the progress thread --
marks it done.  An op abandoned before completion (an Event collected early, a
timeout) is *orphaned* and freed by its completion, never before, so a late
completion cannot write into freed memory.

Puts ask for FI_DELIVERY_COMPLETE: their completion means the data is at the
target, which is what a blocking put and an NB put's event promise.
"""
import os
import pickle
import threading

from cpython.pycapsule cimport PyCapsule_New
from cpython.pythread cimport (PyThread_type_lock, PyThread_allocate_lock, PyThread_acquire_lock,
                               PyThread_release_lock, WAIT_LOCK)
from libc.stdint cimport uint8_t, uint32_t, uint64_t, uintptr_t, int64_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy, memset
from posix.mman cimport mmap, munmap, PROT_READ, PROT_WRITE, MAP_FAILED
from gexmk.lib.linux cimport MAP_PRIVATE, MAP_ANONYMOUS, MAP_NORESERVE
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC, nanosleep

cdef extern from "<time.h>" nogil:
    enum: CLOCK_MONOTONIC_COARSE
    enum: CLOCK_THREAD_CPUTIME_ID

cdef extern from "<sched.h>" nogil:
    int sched_yield()

cdef extern from "<poll.h>" nogil:
    struct pollfd:
        int fd
        short events
        short revents
    int poll(pollfd* fds, unsigned long nfds, int timeout)
    int ppoll(pollfd* fds, unsigned long nfds, const timespec* tmo, const void* sigmask)
    enum:
        POLLIN

cdef extern from "<sys/prctl.h>" nogil:
    int prctl(int option, unsigned long arg2, unsigned long arg3, unsigned long arg4,
              unsigned long arg5)
    enum:
        PR_SET_TIMERSLACK
        PR_GET_TIMERSLACK

from gexmk.lib.libfabric cimport *
from gexmk.lib.gx cimport *

from gexmk.errors import (OFIError, UnsupportedError, PeerDeadError, TimeoutError as GxTimeoutError,
                          ArgumentError, StateError, CommunicationError, SegmentError)
from gexmk.config import env_int, env_seconds
from gexmk.transports import Reach
from gexmk.memory cimport Segment
from gexmk.kinds.kind cimport gx_kind_ops

# rxm's bounce buffers (its inject and eager limit) are 16 KiB by default, and
# it preallocates thousands per endpoint: 349 MB resident for a 2-rank job with
# one 1 MiB segment over tcp;ofi_rxm, 120 MB at 4 KiB (issue 23).  gexmk's puts
# above the inject size go as RMA writes anyway, so it asks for 4 KiB unless
# the user set FI_OFI_RXM_BUFFER_SIZE.  Set before this process's first
# fi_getinfo, when rxm reads it; every rank of a job does the same.
#
# Likewise the receive buffers rxm posts (FI_OFI_RXM_MSG_RX_SIZE): left unset,
# rxm over tcp posts 4096 of them to tcp's shared receive context, 4096 bounce
# buffers (~18 MB at 4 KiB) per rxm endpoint, and gexmk opens three or four
# (the primordial endpoint's pair, the sync endpoint).  They take messages
# only (rxm's emulated atomics, put_signal's signal messages): RMA never lands
# in them, and a sender finding none posted waits in the socket's flow
# control.  128 (rxm's figure without a shared context): 120.8 -> 63.5 MB
# resident for a 2-rank job with one 1 MiB segment (bench/README.md, issue
# 23).  Bad values are left for config.load to report at init.
def _rxm_setting(name, default, fi_name):
    text = os.environ.get(name, "").strip() or str(default)
    if text.isdigit() and int(text) != 0:
        os.environ.setdefault(fi_name, text)


_rxm_setting("GEXMK_OFI_RXM_BUFFER", 4096, "FI_OFI_RXM_BUFFER_SIZE")
_rxm_setting("GEXMK_OFI_RXM_MSG_RX", 128, "FI_OFI_RXM_MSG_RX_SIZE")
# rxm's own receive queue (application receives: gexmk posts SIG_RX = 64 per
# endpoint) is 2048 entries by default, two 0.5 MB queues per rxm endpoint.
_rxm_setting("GEXMK_OFI_RXM_RX", 256, "FI_OFI_RXM_RX_SIZE")
# The connection cap closes a peer's connections by removing its addresses from
# the AV, which rxm does only with this set (ofi.src/conncap.pxi).  gexmk
# removes nothing otherwise.
if os.environ.get("GEXMK_OFI_MAX_PEERS", "").strip() != "0":
    os.environ.setdefault("FI_AV_REMOVE_CLEANUP", "1")


# A waiting thread sleeps in poll() on its CQs' wait fds (progress.pxi).  rxm
# adds its connections' sockets to that wait set only when their wait object
# is an fd: with FI_OFI_RXM_DEF_WAIT_OBJ (or ..._DEF_TCP_WAIT_OBJ) = pollfd,
# traffic never woke the fd and each wait slept out its nap (tcp;ofi_rxm, 2-core
# VM, bench/waiting.py: an 8 B put to a target in tm.barrier() 5.08 ms against
# 10.9 us, to an idle one 20 ms; test_ofi_signal.py test_sleeping_waiter_is_
# woken_by_network_traffic[...pollfd]).  So gexmk asks for fd, the default, and
# says so where the user had asked for something else.
def _rxm_wait_fd():
    for fi_name in ("FI_OFI_RXM_DEF_WAIT_OBJ", "FI_OFI_RXM_DEF_TCP_WAIT_OBJ"):
        text = os.environ.get(fi_name, "").strip()
        if text and text.lower() != "fd":
            import warnings
            warnings.warn(f"{fi_name}={text!r}: gexmk sleeps on its completion queues' wait fds, "
                          f"which rxm wakes only with fd wait objects; using {fi_name}=fd",
                          RuntimeWarning, stacklevel=2)
            os.environ[fi_name] = "fd"


_rxm_wait_fd()

cdef enum:
    OP_PENDING = 0
    OP_DONE = 1
    OP_ORPHAN = 2
    MAX_TOUCHED = 16        # targets of unflushed implicit puts remembered per endpoint
    MAX_EPS = 1024          # endpoints per process on the network
    ATOMICS_EVERY = 4       # split endpoints: progress passes per read of the atomics CQ
    SLEEP_EPS = 64          # the progress thread sleeps on the CQ fds of at most this many endpoints
                            # (was 8: a process of 10 endpoints over tcp then polled with naps,
                            # ~50 % of a core while idle; bench/README "Many endpoints")
    DEATH_GRACE_MS = 1000   # how long a failure waits for the death notice that explains it
    FRESH_MAX = 4           # shm: fresh initiator endpoints an endpoint opens after deaths
    CLOSE_DRAIN_S = 10      # how long closing an endpoint waits for its ops in flight (at most)
    SIG_RX = 64             # signal messages: receives posted per endpoint (signal.pxi)
    PROBE_AFTER_MS = 200    # a queue full this long: is the target endpoint still there? (_gone)
    PROBE_EVERY_MS = 200    # ... asked again at most this often per target
    LINGER_EPS = 8          # shm: closed endpoints kept served for peers (OfiEndpoint._linger)
    OPEN_FRESH_MS = 50      # shm: a target seen open is trusted this long within a barrier epoch
    PROBE_WAIT_MS = 100     # ... waiting at most this long for its answer
    PROBE_TCP = 1           # dom.probe: a TCP connection to the endpoint's name (tcp;ofi_rxm)
    PROBE_SHM = 2           # ... its region in /dev/shm (shm)


# The progress thread keeps off the CQs for this long (s) after an application
# thread last drove progress itself (blocking waits, nbi_wait).
cdef double STAND_ASIDE = 0.002
# ... and for this long (s, precise clock) after a wait's polling pass (wait_until
# and its kin spinning or yielding: GX_WAIT_DRIVING); a wait that goes to sleep
# stops renewing it, and the thread is back within this much.
cdef double WAIT_ASIDE = 100e-6
# A lone progress pass (signal_fetch, a test form) is left out within this
# long (s) of the end of a wait's pass (net_nbi_test).
cdef double PASS_FRESH = 5e-6
# With no progress thread, a wait asleep on words only the network writes naps
# this long (us) between passes at first (nobody else would see its signal
# land), longer (x 1.5 a quiet pass, up to the core's nap) while nothing comes.
cdef int UNSERVED_NAP_US = 20
# A wait asleep in the CQ fds (_wait_sleep) that traffic woke polls instead of
# sleeping for up to this long (s) after the last traffic (a request/response
# stream brings more at once, and each sleep costs a wake-up: 8 B put/get to a
# target in a barrier over tcp;ofi_rxm, 25-38 us sleeping, 11 us polling,
# bench/waiting.py).  The window adapts (hot_win, progress.pxi): one that saw
# no traffic halves the next, down to none (a wake-up per op); one that did,
# doubles it.  A fixed window cost every operation the window + ~25-30 us in
# some rounds on a loaded 2-core machine: a thread woken by a socket send is put
# on the sender's CPU (the scheduler's wake-affine placement: traced with
# GEXMK_OFI_TRACE, the waiting target woke on the initiator's CPU for every op
# whenever the other CPU ran another job), so the poller held the very core
# the initiator needed for its next operation until the window ended.  Such
# windows see no traffic, and shrink away.
cdef double WAIT_HOT = 200e-6
# ... the shortest window: a shorter one would close before a ping-pong's next
# operation comes.  While the window is off, one wake in HOT_PROBE (doubling
# after each probe that sees no traffic, up to HOT_PROBE_MAX) tries a window of
# HOT_PROBE_WIN again (the load that starved the poller may have gone).
cdef double HOT_MIN = 20e-6
cdef int HOT_PROBE = 8
cdef int HOT_PROBE_MAX = 32
cdef double HOT_PROBE_WIN = 50e-6
# A polling pass that took more than twice the shortest one's CPU time + this
# (s) did work (an RMA the provider served at this target leaves no CQ entry):
# traffic.  CPU time, not wall time: a pass that was preempted (the initiator
# or another job took the core) is no sign of traffic, rather the opposite.
cdef double HOT_BUSY = 1.5e-6
# ... and while its sleeps end with nothing come, each is twice the last, up to
# this long (us): traffic wakes it through the fds, so a longer sleep only
# delays what no fd announces (a store of this process's own to the word, the
# core's deadline and health checks) and saves the wake-ups of a quiet wait.
cdef int QUIET_SLEEP_MAX_US = 5000
# The progress thread, woken by traffic, polls for this long (s) before it
# sleeps in the CQ fds again.
cdef double PT_HOT = 0.001
# The progress thread asks the scheduler for a slice this short (us; 0: the
# kernel's default, 1.4 ms here; Linux clamps it to >= 100 us), so that when
# traffic wakes it, it preempts a busy thread on its CPU at once rather than
# at the next tick (4 ms at HZ=250).  A target inside a long GIL-releasing
# numpy call on 2 cores has three busy threads (numpy, this thread, the
# initiator): with the default slice its 8 B put/get took 10 us in some runs
# and 0.7-1.4 ms (median) or 1.4-5 ms (p90) in others, one tick or two of the
# woken thread waiting for a CPU (traced: bench/waiting.py, GEXMK_OFI_TRACE).
cdef int PT_SLICE_US = 100
# After a sleep in the CQ fds, read only the CQs whose fd poll() found ready
# (_read_woken); 0: every CQ, as before.
cdef bint PT_WOKEN_ONLY = True
# The progress thread's window adapts (hot_win, as the waits'); 0: fixed (PT_HOT).
cdef bint PT_ADAPT = True
# ... a burst of its passes that took this much more CPU (s) than the shortest
# served traffic, and a window with at least one such burst in PT_BUSY_SHARE
# (and three) is extended (_pt_burst); a window of PT_HOT counts PT_HOT /
# PT_BURST_S bursts (~10 us of CPU each when idle, tcp;ofi_rxm here).
cdef double PT_BUSY = 3e-6
# ... and this share of the shortest burst more (bursts over many endpoints vary
# by more than PT_BUSY while idle)
cdef double PT_BUSY_REL = 0.25
cdef int PT_BUSY_SHARE = 4
cdef double PT_BURST_S = 10e-6
# Windows that do not adapt (each the longest, from the wake, not extended by
# traffic: what was measured before), for experiments.
cdef bint HOT_FIXED = False
# A thread waiting for its own operation (_spin) polls that operation's endpoint
# every pass and all of the process's endpoints every SPIN_ALL passes (1: every pass).
cdef int SPIN_ALL = 8
# ... and, once the op has been outstanding about SPIN_SLEEP_AFTER (counted from
# the 64th pass), waits in the CQ fds as the word waits do (_sleep_pass): sleeps
# of SPIN_SLEEP_US, longer while nothing comes (up to QUIET_SLEEP_MAX_US), the
# op's target's health and the deadline looked at after each.  An op whose
# target does not serve it (busy with the progress thread off, gone, or a long
# transfer) no longer costs a core.  2 ms:
# a 4 MiB put over tcp loopback (0.7-1.5 ms) polls to its end; at 200 us it
# slept between socket wake-ups and ran at 2.8-3.5 GB/s, 3.3-5.5 polling
# (bench/waiting.py, alternated, this 2-core VM).
cdef double SPIN_SLEEP_AFTER = 2e-3
cdef int SPIN_SLEEP_US = 1000
# Private, for experiments (bench/waiting.py):
# GEXMK_OFI_WAIT_TUNE="hot_us[,pt_hot_us[,fixed[,pt_slice_us[,pt_adapt[,woken_only[,spin_all[,spin_sleep_after_us]]]]]]]"
# (spin_sleep_after_us < 0: an op's wait never sleeps, as before).
_tune = os.environ.get("GEXMK_OFI_WAIT_TUNE", "")
if _tune:
    try:
        _tv = [float(x) for x in _tune.split(",")]
    except ValueError:
        raise ArgumentError(f"GEXMK_OFI_WAIT_TUNE={_tune!r}: expected hot_us[,pt_hot_us[,fixed[,pt_slice_us[,pt_adapt[,woken_only[,spin_all[,spin_sleep_after_us]]]]]]] "
                            "(numbers)") from None
    WAIT_HOT = _tv[0] * 1e-6
    if len(_tv) > 1:
        PT_HOT = _tv[1] * 1e-6
    if len(_tv) > 2:
        HOT_FIXED = _tv[2] != 0
    if len(_tv) > 3:
        PT_SLICE_US = <int>_tv[3]
    if len(_tv) > 4:
        PT_ADAPT = _tv[4] != 0
    if len(_tv) > 5:
        PT_WOKEN_ONLY = _tv[5] != 0
    if len(_tv) > 6:
        SPIN_ALL = <int>min(_tv[6], 1 << 20) if _tv[6] >= 1 else 1   # no float -> int overflow
    if len(_tv) > 7:
        SPIN_SLEEP_AFTER = _tv[7] * 1e-6

# Private, for experiments (bench/diagnostics/wait_floor.py): GEXMK_OFI_SPIN_FD=1
# gives a spinning progress thread's endpoints CQs with wait fds all the same,
# which separates what the wait objects cost from what sleeping costs.
cdef bint SPIN_FD = os.environ.get("GEXMK_OFI_SPIN_FD", "0") == "1"

# Leads the published name of a split endpoint (RMA name + atomics name).
_SPLIT_TAG = b"gexmk-split:"
_SINGLE_TAG = b"gexmk-rma:"     # a split domain's endpoint without atomics (the sync endpoint)


cdef enum:
    STG_MAX_SLOTS = 16      # landing slots per ring of a staged target (GEXMK_OFI_STAGE_SLOTS)
    STG_MAX_ZONES = 64      # landing zones (device-bound endpoints) per process
    STG_DESC = 128          # bytes per request descriptor: 16 words, word 15 repeats word 0
    HMEM_OFF = 0            # GEXMK_OFI_HMEM (hmem.pxi)
    HMEM_AUTO = 1
    HMEM_SYSTEM = 2
    HMEM_NATIVE = 3         # native wherever the provider accepts, even one that copies via host

# a put_signal's signal as remote CQ data (signal.pxi): kind (2 bits), the
# target's binding generation (2 bits), the word's index in the segment (24
# bits: its first 128 MiB), the value (36 bits)
cdef enum:
    SIG_DATA_SET = 1
    SIG_DATA_ADD = 2
    SIG_DATA_KIND_SHIFT = 62
    SIG_DATA_GEN_SHIFT = 60
    SIG_DATA_IDX_SHIFT = 36
cdef extern from *:
    """
    #define GX_SIG_DATA_IDX_MAX ((UINT64_C(1) << 24) - 1)
    #define GX_SIG_DATA_VAL_MAX ((UINT64_C(1) << 36) - 1)
    """
    const uint64_t SIG_DATA_IDX_MAX "GX_SIG_DATA_IDX_MAX"
    const uint64_t SIG_DATA_VAL_MAX "GX_SIG_DATA_VAL_MAX"


cdef struct sig_rx


cdef struct hot_win:        # polling for a while after traffic (WAIT_HOT, progress.pxi)
    double until            # polling until then; 0: not polling
    double win              # the window now (s); 0: none (a sleep after each wake)
    double pass_min         # the shortest polling pass seen (s)
    int caught              # traffic came in this window
    int wakes               # wakes while there was no window (HOT_PROBE)
    int probe_every         # ... one in this many tries a window again
    int probing             # this window is such a try
    int init
    int n, nbusy            # the progress thread's bursts in this window, and those with traffic
    int left                # ... its bursts left in this window (win: its length in bursts)
    long neps               # the endpoints pass_min was measured over (more: longer passes)


cdef struct ofi_zone:       # a device-bound endpoint's landing zone (staged.pxi)
    char* mem               # nrings rings, then this endpoint's own bounce slots
    size_t bytes
    int nrings              # one ring per job rank (the initiators)
    int slots
    size_t chunk
    size_t ring_bytes
    size_t data_off         # within a ring: descriptors, then done/status/result words, then data
    char* bounce            # slots * chunk bytes: this endpoint's own staged sends and receives
    const gx_kind_ops* kops # the segment's kind (NULL: host memory, GEXMK_OFI_STAGE=all)
    void* kctx
    uintptr_t seg_base
    size_t seg_size
    uint64_t* handled       # nrings * slots: the last sequence number served per slot
    int pinned              # the bounce slots are page-locked (device zones; rings: ring_state)
    int amo                 # the kind runs atomics on the segment
    unsigned char* ring_state   # nrings: RING_* -- rings are backed (and pinned) per initiator on
                                # its first request, at most cap of them (issue 23)
    int cap                 # rings that may be backed at once (0: every job rank's)
    int active              # rings backed now
    long refused            # first requests answered STG_EFULL (cap reached; the initiator retries)
    long backs              # rings backed (a released ring backed again counts again)
    long releases           # rings released by their initiators (STG_RELEASE), memory given back
    long reclaimed          # rings of initiators reported dead, taken back by the lander
    double want_until       # a request was refused lately: done words ask holders to release
    unsigned char* open_slot    # nrings: the slot of the next request of a ring not backed
    int vis_only            # the zone of a host segment: packed VIS only (vis.pxi, "ofi-landed")
    size_t bell_off         # the doorbells, after the rings (and bounce): a byte per ring an
    size_t bell2_off        # initiator sets before its first request, a byte per 64 rings the
                            # lander reads each pass -- it never reads rings nobody rang
    size_t closed_off       # a word after the doorbells: nonzero in a retired zone (an
                            # initiator waiting for its first answer reads it)
    int closing             # being retired: the lander no longer serves it
    int* act                # the rings backed, in the order they were (z.active of them)
    long rings_read         # rings whose requests the lander read (backed ones, each pass,
                            # and rung ones once): the work of its passes
    long passes


cdef struct ofi_peer:       # what an initiator knows of one target endpoint
    gx_target* g            # the core's target: bounds, owner, death
    fi_addr_t net_addr      # fi_addr_t of the target endpoint
    fi_addr_t net_aaddr     # fi_addr_t its atomics go to (net_addr unless split)
    uint64_t net_key        # registration key of the target segment
    uint64_t net_base       # address the network uses for the segment's first byte
                            # (remote_base with FI_MR_VIRT_ADDR, else 0)
    int answers             # the owner serves network operations while it computes (auto
                            # progress or a progress thread): connections may be set up eagerly
    int no_amo              # its endpoint has no atomics (a split domain's sync endpoint)
    int sig_rx              # its endpoint takes put_signal's signal messages (signal.pxi)
    int sig_data            # ... and signals carried as a write's remote CQ data (signal.pxi)
    uint64_t sig_gen        # the target's binding generation as published (signal.pxi)
    int stg                 # a device segment reached through its landing zone (staged.pxi)
    int hmem                # a device segment the provider registered (FI_HMEM, hmem.pxi): RMA
                            # lands in it natively; its atomics go through its landing zone
    uint64_t stg_key        # registration key of its landing zone (net_key when staged)
    int stg_amo             # ... whose owner runs atomics on it
    int stg_slots
    size_t stg_chunk
    uint64_t stg_ring       # network address of this process's ring in the zone
    uint64_t stg_bell       # ... of its doorbell byte, and its group's (staged.pxi _stg_ring_bell)
    uint64_t stg_bell2
    uint64_t stg_closed     # ... of the zone's closed word, and that word as last read
    uint64_t stg_closed_rb
    uint64_t stg_seq        # the last sequence number used in the ring
    int stg_lock            # one staged operation at a time per target in this process
    uint64_t stg_last[STG_MAX_SLOTS]    # the last sequence number sent through each slot
    uint64_t stg_ok[STG_MAX_SLOTS]      # ... of those, the last one known served without error
    uint64_t stg_rb[3 * STG_MAX_SLOTS]  # done, status and result words as last read back
    uint64_t stg_dbuf[16]   # a descriptor being sent
    uint64_t stg_rel[16]    # a release (staged.pxi _stg_release), sent without waiting: its
                            # own buffer, in flight while the application sends others
    int stg_rel_out         # ... 1 until its write completes (_complete)
    int stg_rel_lost        # ... its write failed: written again before its answer is awaited
    int gone                # its endpoint was found closed since its publication (rma.pxi
                            # _gone): operations that meet a full queue fail at once
    double probe_at         # when that was last looked into (_now())
    long open_epoch         # shm: dom.settles when its endpoint was last seen open (_check_open)
    double open_at          # ... and when (_now_coarse())
    char shm_path[80]       # ... its region's path there ("": not known yet, "-": none)
    long out                # ops of this process in flight to it (as ofi_ep.live counts them)
    int local               # its process runs on this node (its pid is ours to look at)
    int stg_open            # this process's ring in t's zone: 0 not backed (never asked, or
                            # released), 1 backed, 2 refused (VIS: direct until stg_retry_at),
                            # 3 released, the release's answer not yet read (staged.pxi)
    double stg_used         # when the last operation through the ring ended (_now_coarse())
    double stg_retry_at     # a refused VIS ring asks again from then on
    int stg_held            # listed in dom.held (rings this process holds: idle release)
    int stg_wanted          # the zone asked holders to release (STG_WANT in a done word)
    ofi_ep* stg_ep          # the endpoint of the last operation through the ring (releases
                            # go through it while it is live: no new connection for them)
    int vzone               # a host segment whose zone takes packed VIS (vis.pxi, "ofi-landed")


cdef struct ofi_proc:       # a peer process, under the connection cap (conncap.pxi)
    long holds              # operations to it between the gate and their posting
    double used             # when an operation last went to it (_now_coarse())
    int state               # CS_IDLE, CS_OPEN, CS_CLOSING
    int want                # CLOSE_*: why it is closing (the manager thread's work)
    int counted             # among dom.nopen
    int hello               # it announced a connection while closing: open again after
    long gen                # closes of the pair so far (the rendezvous keys; _again)
    long req                # a close its peer asked for while one was under way: its gen + 1
    double reopened         # when the last close ended (_now(): _reconnect_refused)


cdef struct ofi_dom:
    fi_info* info
    fi_info* rma_info       # split mode: the RMA endpoints' info (no FI_ATOMIC, RAW-ordered); else NULL
    int split               # 1: each endpoint is an RMA EP + an atomics EP (ofi_peer.net_aaddr)
    fid_fabric* fabric
    fid_domain* domain
    fid_av* av
    uint64_t mr_mode
    size_t inject_size
    size_t vis_iov          # local iovecs per fi_writemsg/fi_readmsg of a VIS call (vis.pxi)
    size_t vis_rma_iov      # ... and remote ones (the provider's iov_limit, rma_iov_limit)
    size_t vis_max_msg      # ... and bytes per message (max_msg_size)
    int inject_ctx          # injected writes carry an op as their context (rma.pxi _inject_write)
    int manual              # FI_PROGRESS_MANUAL data progress: targets must poll
    int thread_on           # the background progress thread runs (start_progress)
    uint64_t next_key       # requested keys when the provider does not choose them
    double timeout          # seconds a blocking wait may take before TimeoutError
    int cq_wait             # CQs opened from now on get a wait fd (a sleeping progress thread)
    long waiters            # threads spinning on a completion: the progress thread stands aside
    double last_app         # when an application thread last drove progress itself
    double driven_until     # a wait polls this domain's CQs itself until then (WAIT_ASIDE)
    double wait_pass_end    # when a wait's pass last finished reading its CQs (PASS_FRESH)
    hot_win wait_hot        # a sleeping wait that traffic woke polls for a while (WAIT_HOT)
    int wait_quiet_us       # ... its next sleep's length while nothing comes (QUIET_SLEEP_MAX_US)
    int ordered             # FI_ORDER_RAW: a read issued after writes sees them (flush by read)
    size_t max_order_raw    # ... for writes up to this size
    int waw                 # FI_ORDER_WAW: writes from one endpoint to a target land in issue order
    size_t max_order_waw    # ... for writes up to this size
    int sig_ordered         # put_signal: data and signal atomic back to back on one endpoint
                            # (FI_ORDER_WAW there: RMA and atomic writes in issue order)
    size_t sig_order_max    # ... for data up to this size (max_order_waw_size)
    long n_sig_ordered      # put_signals issued back to back
    long n_sig_delivery     # put_signals whose data's delivery was waited for first
    int sig_msg             # put_signal: data write, then the signal as a message on the RMA
                            # endpoint (split: FI_ORDER_SAW there), applied by the target (signal.pxi)
    long n_sig_msg          # put_signals issued that way
    int sig_data            # ... the signal carried by the data write itself as remote CQ data,
                            # where it fits (signal.pxi); the endpoints' CQs then FI_CQ_FORMAT_DATA
                            # (set at init, never changed: every CQ of the domain has one format)
    long n_sig_data         # put_signals issued that way (counted in n_sig_msg too)
    long sig_bad            # signal messages received that named no word of this process
    ofi_ep* eps[MAX_EPS]    # live endpoints: what waits and the progress thread poll
    long neps
    long readers            # threads walking eps[] without the GIL (see _unregister)
    long quiesce            # endpoints being unregistered: the progress thread stays out of eps[]
    int stg_all             # GEXMK_OFI_STAGE=all: host segments land through zones too (tests)
    int hmem_want           # GEXMK_OFI_HMEM: HMEM_OFF, HMEM_AUTO, HMEM_SYSTEM, HMEM_NATIVE (hmem.pxi)
    int hmem                # the domain was opened with FI_HMEM (and FI_MR_HMEM where offered)
    int stg_slots           # GEXMK_OFI_STAGE_SLOTS
    size_t stg_chunk        # GEXMK_OFI_STAGE_CHUNK
    int stg_nrings          # the job's size: one ring per initiator
    int zone_rings          # GEXMK_OFI_ZONE_RINGS: rings a zone backs at most (0: no cap)
    double ring_idle        # GEXMK_OFI_RING_IDLE: an initiator releases a ring idle this long (0: never)
    int zone_madvise        # released rings' pages go back to the OS (registration pins nothing)
    ofi_peer** held         # rings this process holds in peers' zones (staged.pxi idle release)
    int nheld
    int held_cap
    int held_lock
    double idle_next        # the next look for idle rings (_now_coarse())
    long n_ring_opens       # rings this process had backed in peers' zones (first use or again)
    long n_ring_releases    # ... and released
    long n_release_landed   # ... releases in flight when their zone was republished, waited for
    long n_release_resent   # ... releases whose write failed, written again
    long n_ring_waits       # first requests refused that a staged operation waited out (cap)
    int vis_zone            # host segments get a VIS landing zone (GEXMK_OFI_VIS_LAND > 0)
    size_t vis_land         # ... fragments up to this size are packed through it
    int vis_land_put        # ... puts too (else gets only)
    long n_vis_direct       # VIS messages sent direct (fi_writemsg/fi_readmsg)
    long n_vis_landed       # VIS slots packed through a host target's zone
    long n_vis_refused      # VIS calls sent direct because the target's zone was full
    int stg_rank            # this process's ring in peers' zones
    ofi_zone* zones[STG_MAX_ZONES]      # served by the lander thread
    int nzones
    int zlock
    int backed              # rings backed in staged zones (the lander naps 20 us while any is)
    int backed_vis          # ... in host segments' VIS zones
    int nvis_zones          # zones[] that are host segments' VIS zones
    long landed             # staged requests served here
    signed char valid[3][GX_DT_COUNT][GX_OP_COUNT]   # fi_*atomicvalid cache: -1 unknown
    long deaths             # peers of the job known dead (the core's notices)
    long n_fresh            # shm: fresh initiator endpoints opened after deaths (fresh_initiator)
    int last_dead           # the job rank of the last one
    unsigned char* dead_ring    # stg_nrings: 1 once the job rank was reported dead (its rings
                                # in this process's zones are not read again), 2 once reclaimed
    long dead_pend          # notices the lander has not looked at yet (staged.pxi _land_dead)
    double death_at         # ... and when its notice came (_now())
    int shared_q            # the provider's queues are shared memory a killed process may
                            # leave locked (shm): see _poisoned
    int probe               # how to tell a target endpoint closed while its queue stays full
                            # (PROBE_TCP, PROBE_SHM; 0: no way): rma.pxi _gone
    long settles            # barriers settled so far (GX_WAIT_SETTLE): over shm a target is
                            # looked at again after each before an op goes to it (_check_open)
    int conn_cap            # GEXMK_OFI_MAX_PEERS where enforced (conncap.pxi), else 0
    ofi_proc* procs         # conn_cap: one per job rank
    int nprocs
    int nopen               # peer processes counted as connected
    int conn_lock
    int conn_efd            # the manager thread's eventfd: written when a close is wanted
    long flushing           # threads between taking a target from a touched list and posting
                            # its flush read (_flush): a close waits for none
    long n_admits           # peers admitted (connected, or announced by them)
    long n_evicts           # closes this process asked for (the cap)
    long n_asked            # closes peers asked for
    long n_closed           # closes completed (both ends)
    long n_conn_msgs        # control messages received
    long n_reissued         # blocking operations issued again after a refused reconnection


cdef struct ofi_ep:
    ofi_dom* dom
    fid_ep* ep              # puts, gets, flushes (over shm, after a death: a fresh one, below)
    fid_ep* aep             # atomics: ep itself, or in split mode a second endpoint
    fid_ep* ep0             # the endpoint as opened: its name is published, signal receives
                            # are posted on it, peers' operations land through it
    fid_ep* fresh[FRESH_MAX]    # shm: initiator endpoints opened after deaths (_fresh_initiator),
    int nfresh              # the last of them ep (and aep) now; closed with ep0
    long fresh_deaths       # dom.deaths when the initiator now in use was opened: ops issued
                            # on it are not held up by an earlier death (_poisoned)
    fid_cq* cq
    fid_cq* acq             # split mode: aep's own CQ (NULL otherwise)
    int await_fd            # ... and its wait fd (can_wait)
    unsigned int apass      # progress passes, to poll acq on one in ATOMICS_EVERY
    unsigned int wpass      # a wait's passes, to progress the other endpoints on one in 4
    long amo_out            # this endpoint's atomics not yet completed: acq polled every pass
    fid_mr* seg_mr
    void* seg_desc
    unsigned int bind_gen   # binds so far: a signal carries the one its initiator was published
    uintptr_t seg_lo
    uintptr_t seg_hi
    long nbi[3]             # outstanding implicit ops by GX_CAT_*
    long nbi_epoch          # implicit ops of an older epoch were abandoned (peer death)
    int nbi_err             # first failure (fi errno) among implicit ops since the last sync
    ofi_peer* nbi_err_t     # ... and its target (a dead one makes it a PeerDeadError)
    int can_wait            # the CQ has a wait fd the progress thread can sleep on; else poll + nap
    int wait_fd
    ofi_peer* touched[16]  # targets of implicit puts issued without delivery completion
    int touched_put[16]     # ... 1: an implicit put touched it, not only put_signals' signal
                            # messages (which quiet completes, not nbi_wait(EC_PUT): _flush)
    ofi_zone* zone          # a device segment bound (staged.pxi): peers land here; NULL otherwise
    int hmem                # the bound segment is registered natively (seg_mr, FI_HMEM): the zone
                            # serves atomics and bounces other device buffers (hmem.pxi)
    fid_mr* zone_mr         # ... and then the zone's own registration
    void* zone_desc
    uintptr_t zone_lo
    uintptr_t zone_hi
    uintptr_t dev_lo        # ... its address range: local buffers there go through zone.bounce
    ofi_zone* vzone         # a bound host segment's VIS landing zone (vis.pxi), or NULL
    fid_mr* vzone_mr        # ... and its registration
    uintptr_t dev_hi
    int bb_lock             # one staged transfer at a time uses zone.bounce
    sig_rx* rx              # signal messages: SIG_RX receives posted on ep (signal.pxi); NULL if none
    int rx_lock             # ... one thread at a time reads cq then, so they apply in arrival order
    int nap_us              # a sleeping wait's next nap with no progress thread (_wait_sleep)
    gx_wake* wake           # the bound segment's wake word (futex sleepers), or NULL
    long live               # ops posted and not yet completed, orphans included (close drains them)
    long stuck              # live ops a drain gave up on as gone to dead peers (_drain)
    long lost               # live ops orphaned because their target endpoint closed (rma.pxi
                            # _gone): over shm they never complete, and a drain does not wait
    long lost_epoch         # ... 1 + the last nbi epoch abandoned for that (its ops count there)
    ofi_peer* recent[8]     # the last 8 targets of its ops: a stalled nbi_wait or drain asks
    unsigned int recent_i   # whether one closed (rma.pxi _note_target, _gone)
    int closed              # OfiEndpoint.close drained it: nobody reads its CQ, waits on its ops
                            # give up (StateError)


cdef struct gx_op:
    fi_context2 ctx         # first: the provider's per-op scratch (FI_CONTEXT2)
    ofi_ep* ep
    int rx                  # a posted receive of signal messages (sig_rx), not an op
    ofi_peer* t             # the target: a wait gives up when its process dies
    int state               # OP_*
    int err                 # fi errno of a failed op, else 0
    int nbi                 # GX_CAT_* + 1 for implicit ops (freed at completion), else 0
    long epoch              # ... issued in this nbi epoch of the endpoint
    int amo                 # an atomic: counted in ep.amo_out until it completes
    int lost                # orphaned because its target endpoint closed: counted in ep.lost
    int rel                 # a ring's release (staged.pxi): its end is noted in its ofi_peer
    long born_deaths        # ep.fresh_deaths at issue (_poisoned)
    int nmr
    fid_mr* mr[3]           # on-the-fly registrations, closed at completion
    gx_val operand          # atomic operands and result live here until completion
    gx_val compare
    gx_val result
    gx_op* parent           # a message of a VIS op (vis.pxi): completes into it, not the CQ's reader
    long pending            # a VIS op: its messages not yet complete, + 1 while being issued
    int vis_err             # ... the first failure among them (fi errno)
    void* vis_buf           # a VIS message's packed blocks (vis.pxi), freed at its completion




cdef struct sig_rx:         # a receive of signal messages (signal.pxi)
    gx_op op                # first: the context the CQ hands back (op.rx = 1)
    uint64_t msg[4]         # network address of the word, value, GX_SIGNAL_*, 0


include "ofi.src/completion.pxi"
include "ofi.src/progress.pxi"
include "ofi.src/rma.pxi"
include "ofi.src/vis.pxi"
include "ofi.src/atomic.pxi"
include "ofi.src/staged.pxi"
include "ofi.src/hmem.pxi"
include "ofi.src/signal.pxi"
include "ofi.src/domain.pxi"
include "ofi.src/ordering.pxi"
include "ofi.src/endpoint.pxi"
include "ofi.src/connect.pxi"
include "ofi.src/conncap.pxi"


# ---- the table handed to the core ------------------------------------------------

cdef int ofi_put(gx_xfer* x) except -1 nogil:
    if x.stream != NULL:
        return _no_stream(x, "put")
    _check_open(<ofi_ep*>x.ep, <ofi_peer*>x.peer, "put")
    if (<ofi_peer*>x.peer).stg or _stg_local(<ofi_ep*>x.ep, x):
        return stg_rma(x, True)
    return net_put(x.ep, <ofi_peer*>x.peer, x.remote, x.local, x.n, x.mode, x.handle)


cdef int ofi_get(gx_xfer* x) except -1 nogil:
    if x.stream != NULL:
        return _no_stream(x, "get")
    _check_open(<ofi_ep*>x.ep, <ofi_peer*>x.peer, "get")
    if (<ofi_peer*>x.peer).stg or _stg_local(<ofi_ep*>x.ep, x):
        return stg_rma(x, False)
    return net_get(x.ep, <ofi_peer*>x.peer, x.remote, x.local, x.n, x.mode, x.handle)


cdef int _no_stream(gx_xfer* x, const char* what) except -1 with gil:
    raise UnsupportedError(f"ofi {what.decode()}: stream-ordered operations are not in the ofi "
                           "transport (the staged network path copies on the host's schedule)")


cdef int ofi_atomic(gx_xfer* x) except -1 nogil:
    cdef ofi_peer* t = <ofi_peer*>x.peer
    _check_open(<ofi_ep*>x.ep, t, "atomic")
    if t.stg or t.hmem:         # device memory: run by the owner's lander (staged.pxi, hmem.pxi)
        stg_amo(<ofi_ep*>x.ep, t, x.remote, x.dt, x.op, x.a, x.b, x.result)
        if x.handle != NULL:
            x.handle[0] = NULL
        return 0
    return net_atomic(x.ep, <ofi_peer*>x.peer, x.remote, x.dt, x.op, x.a, x.b, x.result,
                      x.mode, x.handle)


# Under the connection cap (conncap.pxi) every operation holds its target's
# process open from the gate until it is posted.
ctypedef int (*_xfer_fn)(gx_xfer* x) except -1 nogil


cdef inline int _gated(_xfer_fn f, gx_xfer* x, const char* what) except -1 nogil:
    cdef ofi_proc* held = NULL
    if (<ofi_ep*>x.ep).dom.conn_cap > 0 and x.stream == NULL:
        _gate_enter(<ofi_ep*>x.ep, <ofi_peer*>x.peer, &held, what)
    try:
        return f(x)
    finally:
        _gate_exit(held)


cdef int gated_put(gx_xfer* x) except -1 nogil:
    return _gated(ofi_put, x, "put")


cdef int gated_get(gx_xfer* x) except -1 nogil:
    return _gated(ofi_get, x, "get")


cdef int gated_atomic(gx_xfer* x) except -1 nogil:
    return _gated(ofi_atomic, x, "atomic")


cdef int gated_put_signal(gx_xfer* x) except -1 nogil:
    return _gated(ofi_put_signal, x, "put_signal")


cdef int gated_put_vis(gx_xfer* x) except -1 nogil:
    return _gated(ofi_put_vis, x, "put (vector)")


cdef int gated_get_vis(gx_xfer* x) except -1 nogil:
    return _gated(ofi_get_vis, x, "get (vector)")


cdef gx_tr_ops _OPS
_OPS.name = b"ofi"
_OPS.put = gated_put
_OPS.get = gated_get
_OPS.atomic = gated_atomic
_OPS.test = net_test
_OPS.wait = net_wait
_OPS.orphan = net_orphan
_OPS.sync = net_nbi_wait
_OPS.nbi_test = net_nbi_test
_OPS.put_signal = gated_put_signal
_OPS.put_vis = gated_put_vis          # vis.pxi: iovec messages, one op per chunk
_OPS.get_vis = gated_get_vis
if os.environ.get("GEXMK_OFI_VIS") == "loop":
    # the core's loop of single puts and gets instead (bench/vis.py's baseline)
    _OPS.put_vis = NULL
    _OPS.get_vis = NULL


# Scores against the local transport's (gexmk/transports/local.pyx): the only
# way to another node; on this node after a shared mapping, before process_vm;
# first for every cross-process target with GEXMK_TRANSPORT=ofi.
cdef int OTHER_NODE_SCORE = 80
cdef int SAME_NODE_SCORE = 60
cdef int FORCED_SCORE = 95


def _ring_distance(int r, int me, int size):
    """How far job rank r is from me around the ring of the job, either way."""
    cdef int d = (r - me) % size if size else 0
    return min(d, size - d)


cdef class OfiPeer:
    """The per-target context: fi_addr(s), key and base of one peer segment.
    Updated in place at each publication and kept until the domain closes:
    ops in flight and the flush list point at it."""
    cdef ofi_peer c
    cdef object name        # its endpoint's name as published (a close inserts it again)

    @property
    def handle(self):
        return <uintptr_t>&self.c


_apply_delay = 0.0


def _set_apply_delay(double seconds):
    """Private, for tests: apply each peer's publication this much later,
    as a preempted process would (its peers go on meanwhile)."""
    global _apply_delay
    _apply_delay = seconds


cdef bint _peers_out(list peers):
    """Whether an op of this process is in flight to any of ``peers``."""
    cdef OfiPeer p
    for p in peers:
        if gx_load_long(&p.c.out):
            return True
    return False


cdef long _peers_out_n(list peers):
    cdef OfiPeer p
    cdef long n = 0
    for p in peers:
        n += gx_load_long(&p.c.out)
    return n


cdef bint _peers_dead(list peers):
    cdef OfiPeer p
    for p in peers:
        if p.c.g != NULL and p.c.g.dead:
            return True
    return False


cdef class OfiTransport:
    """The ofi transport's control plane for one client: its :class:`Domain`
    (and progress thread), endpoint contexts and per-target contexts."""
    cdef readonly str name
    cdef readonly Domain domain
    cdef object job
    cdef dict _peers                   # (jobrank, ep_index) -> OfiPeer
    cdef readonly dict connections     # eager connection set-up so far (see connect)
    cdef set _connected                # (ofi_ep*, fi_addr, which) already touched
    cdef dict _eager_peers             # ofi_ep* -> job ranks connected eagerly from it
    cdef readonly long connect_max     # GEXMK_OFI_CONNECT_MAX
    cdef dict _by_rank                 # jobrank -> [OfiPeer] (the connection cap's closes)
    cdef object _exchange              # the bootstrap's exchange (Job.exchange)
    cdef object _conn_thread           # the connection cap's manager (conncap.pxi)
    cdef object _conn_lock             # its AV work against close()
    cdef bint _conn_stop
    cdef int _conn_efd
    cdef list _conn_errors
    cdef set _conn_active              # job ranks whose close a thread runs now
    cdef readonly dict _conn_at        # job rank -> where its last close got (a hang report)
    cdef readonly str peer_cap_note    # why GEXMK_OFI_MAX_PEERS is not enforced here, or ""

    def __init__(self, job):
        cfg = job.config
        self.name = "ofi"
        self.job = job
        self._peers = {}
        self._connected = set()
        self._eager_peers = {}
        self.connect_max = cfg.ofi_connect_max
        self.connections = {"mode": cfg.ofi_connect, "touched": 0, "failed": 0, "seconds": 0.0,
                            "capped": 0, "note": ""}
        self.domain = Domain(cfg.ofi_provider, cfg.ofi_iface, skip_loopback=job.multi_node,
                             config=cfg)
        self.domain.d.stg_nrings = job.size
        self.domain.d.stg_rank = job.rank
        self.domain.d.dead_ring = <unsigned char*>calloc(<size_t>job.size, 1)
        if self.domain.d.dead_ring == NULL:
            raise MemoryError()
        if cfg.progress_thread in ("on", "spin") or (cfg.progress_thread == "auto"
                                                     and self.domain.manual_progress):
            self.domain.start_progress(spin=(cfg.progress_thread == "spin"))
        self._by_rank = {}
        self._exchange = getattr(job, "exchange", None)
        self._conn_thread = None
        self._conn_lock = threading.Lock()
        self._conn_stop = False
        self._conn_efd = -1
        self._conn_errors = []
        self._conn_active = set()
        self._conn_at = {}
        self.domain.d.conn_efd = -1
        self.peer_cap_note = self._conn_setup(cfg.ofi_max_peers)
        if self.domain.d.conn_cap > 0:
            # eager set-up never opens more than the cap would keep
            self.connect_max = min(self.connect_max, max(1, self.domain.d.conn_cap // 2))

    # ---- the connection cap (ofi.src/conncap.pxi) ----------------------------------

    cdef str _conn_setup(self, long cap):
        """Enforce GEXMK_OFI_MAX_PEERS where it can be: '' then, else why not."""
        cdef ofi_dom* d = &self.domain.d
        if cap <= 0:
            return "no cap (GEXMK_OFI_MAX_PEERS=0)"
        if self.job.size <= 1:
            return "a job of one process"
        if not d.sig_msg:
            return (f"not enforced over {self.domain.provider}: a close is agreed through control "
                    f"messages, which this domain does not take (put_signal mode "
                    f"{self.domain.put_signal_mode!r}; connectionless providers such as shm "
                    f"hold no connections to cap)")
        if self._exchange is None:
            return "not enforced: no bootstrap channel to agree closes through"
        if os.environ.get("FI_AV_REMOVE_CLEANUP", "1").strip().lower() in ("0", "no", "false", "off"):
            return "not enforced: FI_AV_REMOVE_CLEANUP is off (removing an address closes nothing)"
        d.procs = <ofi_proc*>calloc(<size_t>self.job.size, sizeof(ofi_proc))
        if d.procs == NULL:
            raise MemoryError()
        d.nprocs = self.job.size
        self._conn_efd = os.eventfd(0, os.EFD_CLOEXEC)
        d.conn_efd = self._conn_efd
        d.conn_cap = <int>min(cap, 1 << 30)
        self._conn_thread = threading.Thread(target=self._conn_manager, name="gexmk-ofi-conns",
                                             daemon=True)
        self._conn_thread.start()
        return ""

    @property
    def peer_cap(self):
        """The connection cap's state: ``cap`` (0: not enforced, ``note`` says
        why), ``open`` (peer processes counted as connected now), ``admits``,
        ``closing`` (being closed now), ``evicts`` (closes this process asked for), ``asked`` (closes peers
        asked for), ``closed`` (completed), ``messages`` (control messages
        received), ``errors`` (the last closes that failed, as text)."""
        cdef ofi_dom* d = &self.domain.d
        cdef int j, closing = 0
        for j in range(d.nprocs):
            if d.procs[j].state == CS_CLOSING:
                closing += 1
        return {"cap": d.conn_cap, "open": d.nopen, "closing": closing,
                "admits": d.n_admits, "evicts": d.n_evicts,
                "asked": d.n_asked, "closed": d.n_closed, "messages": d.n_conn_msgs, "reissued": d.n_reissued,
                "errors": list(self._conn_errors), "note": self.peer_cap_note}

    def _conn_debug(self):
        """Each counted or closing peer process: (job rank, state, want, holds,
        ops in flight, gen) -- a hang report's view (read without locks)."""
        cdef ofi_dom* d = &self.domain.d
        cdef int j
        out = []
        for j in range(d.nprocs):
            if d.procs[j].counted or d.procs[j].state != CS_IDLE or d.procs[j].want:
                out.append((j, d.procs[j].state, d.procs[j].want, d.procs[j].holds,
                            _peers_out_n(self._by_rank.get(j, [])), d.procs[j].gen))
        return out

    def _conn_manager(self):
        """The manager thread: each pair marked closing is closed by a thread
        of its own (conncap.pxi).  One at a time would deadlock: a close
        waits in a rendezvous for its peer, whose manager could be waiting
        for a third process closing with this one."""
        cdef ofi_dom* d = &self.domain.d
        cdef int k
        while True:
            try:
                os.read(self._conn_efd, 8)
            except OSError:
                return
            with self._conn_lock:
                if self._conn_stop:
                    return
                for k in range(d.nprocs):
                    if d.procs[k].want and d.procs[k].state == CS_CLOSING \
                            and k not in self._conn_active:
                        self._conn_active.add(k)
                        threading.Thread(target=self._conn_run, args=(k,), daemon=True,
                                         name=f"gexmk-ofi-close-{k}").start()

    def _conn_run(self, int j):
        try:
            self._conn_close(j)
        finally:
            with self._conn_lock:
                self._conn_active.discard(j)
                again = (not self._conn_stop and self.domain.d.procs != NULL
                         and self.domain.d.procs[j].want != 0)
            if again:
                # asked for the next close meanwhile (_conn_finish)
                os.eventfd_write(self._conn_efd, 1)

    cdef _conn_close(self, int j):
        """Close the pair (this process, job rank j): steps 1-6 of conncap.pxi.
        Whatever touches the domain runs under _conn_lock after a look at
        _conn_stop: close() takes the lock, so a close thread still waiting
        in a rendezvous when the transport closes touches nothing after."""
        cdef ofi_dom* d = &self.domain.d
        cdef OfiPeer p
        cdef bint removed = False, dead = False, asker, gone
        peers = list(self._by_rank.get(j, ()))
        me = self.job.rank
        lo, hi = min(me, j), max(me, j)
        with self._conn_lock:
            if self._conn_stop:
                return
            key = f"gexmk:ofi-close:{lo}:{hi}:{d.procs[j].gen}"
            asker = d.procs[j].want == CLOSE_EVICT
        timeout = d.timeout
        self._conn_at[j] = "drain " + key
        try:
            if not self._conn_drain(j, peers, _now() + timeout):
                dead = True
                return
            if asker:
                with self._conn_lock:
                    self._conn_live()
                    self._conn_ask(j, peers)
            self._conn_meet(j, key, lo, hi, timeout)
            if me > j:
                # the higher rank of the pair removes, always (rxm 1.17 removes
                # a connection by closing its msg endpoint without looking:
                # one the peer already shut down has none, and fi_av_remove
                # then crashes -- so never at the end that sees the shutdown)
                with self._conn_lock:
                    self._conn_live()
                    self._conn_reap()
                    names = []
                    for p in peers:
                        if p.name is None:
                            continue
                        with nogil:
                            gone = p.c.gone or _closed_now(d, &p.c)
                        if not gone:
                            names.append(p.name)
                    new = self.domain._reinsert(names)
                    for p in peers:
                        if p.name in new:
                            p.c.net_addr, p.c.net_aaddr = new[p.name]
            removed = True
            self._conn_meet(j, key + ":removed", lo, hi, timeout)
            if me < j:
                # the lower rank's provider must have read the shutdown of
                # every closed connection before either end connects again:
                # rxm refuses a new connection from a process whose old one
                # it still holds open (EALREADY), failing the operation that
                # asked for it.  rxm looks at connection events once per
                # FI_OFI_RXM_CM_PROGRESS_INTERVAL of progress passes.
                self._conn_settle()
            self._conn_meet(j, key + ":settled", lo, hi, timeout)
            self._conn_at[j] = "finished " + key
        except Exception as exc:
            dead = dead or isinstance(exc, PeerDeadError) or _peers_dead(peers)
            self._conn_errors = self._conn_errors[-7:] + [f"job rank {j}: {type(exc).__name__}: {exc}"]
        finally:
            with self._conn_lock:
                if not self._conn_stop:
                    with nogil:
                        _conn_finish(d, j, removed, dead)

    cdef _conn_live(self):
        """Under _conn_lock: raise once the transport is closing."""
        if self._conn_stop:
            raise StateError("ofi: the transport is closing")

    cdef bint _conn_drain(self, int j, list peers, double deadline) except *:
        """Steps 1-2: wait until nothing of this process is on its way to job
        rank j: no operation between the gate and its posting, none in
        flight, no write owing its flush (implicit puts, a ring's release:
        each endpoint's touched list, flushed by a read ordered after them).
        False when j died meanwhile."""
        cdef ofi_dom* d = &self.domain.d
        cdef OfiPeer p
        cdef long left
        cdef bint busy, released = False
        cdef int rounds
        while True:
            for rounds in range(2):     # quiet twice, the second look after a fence (_flush)
                with self._conn_lock:
                    self._conn_live()
                    if not released and not gx_load_long(&d.procs[j].holds):
                        # ring releases in flight (no one waits for them)
                        left = 0
                        for p in peers:
                            with nogil:
                                left += _conn_release_flush(d, &p.c)
                        released = left == 0
                    with nogil:
                        left = _conn_unflushed(d, j)
                        _progress_all(d)
                        gx_mem_fence()
                    busy = left or gx_load_long(&d.procs[j].holds) or gx_load_long(&d.flushing) \
                        or _peers_out(peers)
                if busy:
                    break
            else:
                return True
            if _peers_dead(peers):
                return False
            if _now() > deadline:
                raise GxTimeoutError(f"ofi: operations to job rank {j} did not complete within "
                                     f"GEXMK_TIMEOUT while its connections were being closed")
            with nogil:
                _conn_nap()

    cdef _conn_meet(self, int j, str key, int lo, int hi, double timeout):
        """A rendezvous of the pair (lo, hi) under key (the bootstrap's keyed
        exchange), noted in _conn_at for hang diagnostics."""
        self._conn_at[j] = key
        self._exchange(key, [lo, hi], 0 if self.job.rank == lo else 1, b"", timeout)

    cdef _conn_settle(self):
        """Progress passes until rxm's connection events have been read at
        least 3 times since the start: passes in 3 distinct intervals of
        FI_OFI_RXM_CM_PROGRESS_INTERVAL (10 ms unless set; rxm reads its
        event queue from a pass at most once per interval), and at least 8
        passes.  Bounded by the pass count, not the clock alone: a thread
        starved of CPU for the whole window made one pass in it, and the
        peer's shutdown could still be unread when the pair reconnected
        (rxm then refuses the new connection: -FI_ENOTCONN)."""
        cdef ofi_dom* d = &self.domain.d
        cdef double last
        cdef int passes = 0, reads = 0
        try:
            interval = float(os.environ.get("FI_OFI_RXM_CM_PROGRESS_INTERVAL", "10000")) * 1e-6
        except ValueError:
            interval = 0.01
        interval = max(interval, 0.001)
        last = _now()
        while passes < 8 or reads < 3:
            with self._conn_lock:
                self._conn_live()
                with nogil:
                    _progress_all(d)
            if _now() - last >= interval:
                reads += 1
                last = _now()
            with nogil:
                _conn_nap()
            passes += 1

    cdef _conn_reap(self):
        """After both ends drained (step 3): a few progress passes, so that
        the provider's own sends that answered the peer (rxm's atomic
        replies) have their completions read before the connections close."""
        cdef ofi_dom* d = &self.domain.d
        cdef int i
        for i in range(3):
            with nogil:
                _progress_all(d)
                _conn_nap()

    cdef _conn_ask(self, int j, list peers):
        """Step 1's request, from one of this process's endpoints to one of
        j's that takes signal messages (its synchronisation endpoint first:
        open until finalize, and the pair barriers already connected)."""
        cdef OfiPeer p
        cdef OfiEndpoint oe
        cdef OfiPeer best = None
        cdef OfiEndpoint via = None
        for p in peers:
            if p.c.sig_rx and p.c.g != NULL and p.c.g.size > 0 and not p.c.gone and \
                    (best is None or p.c.g.ep_index > best.c.g.ep_index):
                best = p
        if best is None:
            raise CommunicationError(f"ofi: job rank {j} has no endpoint that takes control messages")
        for e in self.domain._eps:
            oe = e
            if not oe.closed and (via is None or (oe.plain and not via.plain)):
                via = oe
        if via is None:
            raise StateError("ofi: no open endpoint to ask for a close through")
        p = best
        oe = via
        with nogil:
            _conn_send_req(&oe.e, &p.c)

    @property
    def needs_driving(self):
        """True when this transport's operations move only while a waiting
        thread drives them: a manual-progress provider with no progress
        thread (GEXMK_PROGRESS_THREAD=0).  An event wait then polls without
        napping (core wait_some)."""
        return bool(self.domain.manual_progress and not self.domain.progress_running)

    # the Domain's attributes, for users and tests (client.transports["ofi"].provider)
    def __getattr__(self, name):
        return getattr(self.domain, name)

    def open_endpoint(self, int index):
        # The library's own synchronisation endpoint (index 2**30, core.src/coll.pxi)
        # writes its barrier counters by ordered stores where the network orders
        # writes, so it needs no atomics endpoint (~10 MB less per process over
        # tcp;ofi_rxm, issue 23); GEXMK_OFI_STAGE=all never stages it.
        plain = index >= (1 << 30)
        ep = self.domain.endpoint(rma_only=plain)
        (<OfiEndpoint>ep).plain = plain
        return ep

    def apply(self, peer, blob):
        """Record a peer endpoint's name, key and base (its fi_addr inserted
        once); None when it published nothing for the network."""
        if _apply_delay > 0:
            import time
            time.sleep(_apply_delay)
        key = (peer.jobrank, peer.ep_index)
        cdef OfiPeer p = self._peers.get(key)
        cdef ofi_dom* dom = &self.domain.d
        if peer.size == 0 or peer.same_process or blob is None:
            if p is not None:
                p.c.net_key = 0
                with nogil:
                    _stg_new_ring(dom, &p.c)    # its zone went with its segment
            return None
        # a host segment: 4 fields; a staged device segment: + its zone's geometry;
        # a native one (hmem.pxi): + None, + its zone's key, base and geometry
        # ... + None, None, a host segment's VIS landing zone (vis.pxi)
        name, rkey, base, answers, *extra = pickle.loads(blob)
        geometry = extra[0] if extra else None
        native = extra[1] if len(extra) > 1 else None
        vis = extra[2] if len(extra) > 2 else None
        if p is None:
            p = OfiPeer()
            self._peers[key] = p
            self._by_rank.setdefault(peer.jobrank, []).append(p)
        p.name = name
        p.c.g = <gx_target*><uintptr_t>peer.target
        p.c.net_addr, p.c.net_aaddr = self.domain.insert(name)
        p.c.gone = 0            # published as it is now: there (rma.pxi _gone)
        p.c.local = bool(peer.same_node)
        p.c.probe_at = 0
        p.c.open_epoch = -1     # looked at again before its first op (_check_open)
        p.c.shm_path[0] = 0     # ... where its name now says
        p.c.no_amo = name.startswith(_SINGLE_TAG)       # an endpoint without atomics
        old = (p.c.stg_key, p.c.stg_ring, p.c.stg or p.c.hmem or p.c.vzone)
        p.c.net_key = self.domain.map_key(rkey, base)   # raw keys are mapped here
        p.c.net_base = base
        # bit 0: the owner answers while it computes; bit 1: its endpoint takes
        # signal messages (a peer that does not would leave them unapplied);
        # bit 2: and signals as remote CQ data (its CQ has the data format)
        p.c.answers = answers & 1
        p.c.sig_rx = (answers >> 1) & 1
        p.c.sig_data = (answers >> 2) & 1
        p.c.sig_gen = (answers >> 8) & 0xff     # bits 8-15: the binding's generation
        p.c.stg = p.c.hmem = p.c.vzone = 0
        if geometry is None and native is None and vis is None:
            return p
        if vis is not None:
            # packed VIS lands in the zone; everything else in the segment
            zkey, zbase, slots, chunk, ring_bytes, bell, bell2, closed = vis
            stg_key = self.domain.map_key(zkey, zbase)
            amo = 0
        elif native is not None:
            # RMA lands in the device segment itself; atomics through the zone
            zkey, zbase, slots, chunk, ring_bytes, amo, bell, bell2, closed = native
            stg_key = self.domain.map_key(zkey, zbase)
        else:
            # a device segment: its landing zone (staged.pxi), registered as the segment
            slots, chunk, ring_bytes, amo, bell, bell2, closed = geometry
            zbase, stg_key = base, p.c.net_key
        if not 1 <= slots <= STG_MAX_SLOTS:
            raise CommunicationError(f"ofi: job rank {peer.jobrank} published {slots} landing "
                                     f"slots (at most {STG_MAX_SLOTS} here)")
        ring = zbase + <uint64_t>self.job.rank * <uint64_t>ring_bytes
        if old != (stg_key, ring, 1):
            with nogil:
                _stg_new_ring(dom, &p.c)        # a new zone starts a new ring
        p.c.stg_key = stg_key
        p.c.stg_slots = slots
        p.c.stg_chunk = chunk
        p.c.stg_amo = amo
        p.c.stg_ring = ring
        p.c.stg_bell = zbase + <uint64_t>bell + <uint64_t>self.job.rank
        p.c.stg_bell2 = zbase + <uint64_t>bell2 + <uint64_t>(self.job.rank // 64)
        p.c.stg_closed = zbase + <uint64_t>closed
        p.c.stg_closed_rb = 0
        if vis is not None:
            p.c.vzone = 1
        elif native is not None:
            p.c.hmem = 1
        else:
            p.c.stg = 1
        if self.domain.d.ring_idle > 0:
            # the lander thread gives this process's idle rings back while it
            # computes or sits in a bootstrap collective (staged.pxi)
            self.domain.start_lander()
        return p

    def reach(self, epctx, peer, ctx):
        cdef OfiPeer p
        if ctx is None or peer.same_process or epctx.closed:
            return None
        p = ctx
        if self.job.config.transport == "ofi":
            score = FORCED_SCORE
        elif peer.same_node:
            score = SAME_NODE_SCORE
        else:
            score = OTHER_NODE_SCORE
        staged = p.c.stg or epctx.staged_local
        if (p.c.stg or p.c.hmem) and not p.c.stg_amo:
            amo = 0
        elif p.c.no_amo or (self.domain.d.split and (<OfiEndpoint>epctx).e.aep == (<OfiEndpoint>epctx).e.ep):
            amo = 0         # either end is a split domain's endpoint without atomics
        else:
            amo = score
        # ofi-hmem: device memory at one end or both, registered with the provider
        # (the target's atomics still run by its lander); ofi-staged wins over it
        name = "ofi-staged" if staged else ("ofi-hmem" if p.c.hmem or epctx.hmem else "ofi")
        # VIS of small blocks to a host segment with a VIS landing zone: packed
        # through it (vis.pxi; a call the zone refuses a ring goes direct)
        vis = "ofi-landed" if p.c.vzone and not staged else None
        return Reach(name, score, amo, <uintptr_t>&_OPS, p.handle, 0,
                     None, bool(staged), bool(self.domain.d.waw) and not staged, 0, vis)

    def connect(self, pairs):
        """Set up the connections of newly published targets now, so that the
        first operation to a peer costs what the rest do (GEXMK_OFI_CONNECT=
        eager, the default).  ``pairs``: (endpoint context, target handle,
        rma) for each route this transport serves, ``rma`` False for the
        atomics path.  Each new (libfabric endpoint, peer address) pair gets one
        small read, all posted at once and waited for at most 10 s; what did
        not answer is reported in a warning and in ``connections`` (its first
        operation then sets the connection up, as with ``lazy``).  At most
        ``GEXMK_OFI_CONNECT_MAX`` peer processes per endpoint, the nearest in
        job rank first; ``connections["capped"]`` counts the pairs left to
        their first operation for that reason."""
        cdef OfiEndpoint oe
        cdef ofi_peer* t
        st = self.connections
        if st["mode"] != "eager" or not pairs:
            return
        if self.domain.d.manual and not self.domain.progress_running:
            # a peer that finished its own touches would stop answering ours
            st["note"] = ("lazy: manual-progress provider without a progress thread "
                          "(GEXMK_PROGRESS_THREAD=0)")
            return
        seen = set()
        work = []
        skipped = 0
        # At most connect_max peer processes per endpoint are connected up
        # front, the nearest in job rank (both ways) first: a large job never
        # opens a connection per job rank at publication (issue 23); the others
        # connect on their first operation, as with GEXMK_OFI_CONNECT=lazy.
        me, size = self.job.rank, self.job.size
        order = []
        for i, pr in enumerate(pairs):
            t = <ofi_peer*><uintptr_t>pr[1]
            order.append((_ring_distance(t.g.jobrank, me, size), i))
        pairs = [pairs[i] for _, i in sorted(order)]
        for epctx, peer_h, rma in pairs:
            oe = epctx
            if oe.closed:
                continue
            t = <ofi_peer*><uintptr_t>peer_h
            if t.g.dead:
                continue            # nothing to set up with a dead peer
            if not t.answers:
                skipped += 1        # it would not answer until its own next gexmk call
                continue
            which = 0 if (rma or oe.e.aep == oe.e.ep) else 1
            if which == 1 and t.g.size < 4:
                continue
            key = (<uintptr_t>&oe.e, t.net_aaddr if which else t.net_addr, which)
            if key in seen or key in self._connected:
                continue
            peers = self._eager_peers.setdefault(<uintptr_t>&oe.e, set())
            if t.g.jobrank not in peers:
                if len(peers) >= self.connect_max:
                    st["capped"] += 1
                    continue
                peers.add(t.g.jobrank)
            seen.add(key)
            work.append((<uintptr_t>&oe.e, peer_h, which))
        if skipped:
            st["note"] = (f"{skipped} route(s) left lazy: their peer runs a manual-progress provider "
                          "without a progress thread")
        if not work:
            return
        t0 = _now()
        ok, failures = _connect_pairs(self.domain, work, min(<double>CONNECT_SECONDS, self.domain.d.timeout))
        st["touched"] += ok
        st["failed"] += len(failures)
        st["seconds"] += _now() - t0
        self._connected.update(seen)
        if failures:
            import warnings
            warnings.warn(f"ofi: {len(failures)} connection(s) could not be set up ahead of their "
                          f"first operation (after a publication or a new team; that operation "
                          f"will try again): " + "; ".join(failures[:4]),
                          RuntimeWarning, stacklevel=3)

    def quiesce(self):
        """Before finalize's last barrier: complete every operation this
        process still has in flight on every endpoint (NB ones whose events
        finalize fails, orphans of collected events), for at most
        CLOSE_DRAIN_S seconds in all, so that no peer closes its endpoint
        under a transfer of ours and ours close with nothing in flight
        (OfiEndpoint.close).  Returns how many are left."""
        cdef OfiEndpoint oe
        cdef double deadline = _now() + min(<double>CLOSE_DRAIN_S, self.domain.d.timeout)
        cdef long left = 0
        cdef double secs
        for e in list(self.domain._eps):
            oe = e
            if oe.closed or oe.e.cq == NULL:
                continue
            secs = deadline - _now()
            with nogil:
                left += _drain(&oe.e, secs if secs > 0 else 0)
        return left

    def _jobrank(self, jobrank, what):
        """``jobrank`` as a rank of this job, or ArgumentError naming it: a death
        notice for a float or a rank outside the job would count a death
        (every op's give-up after deaths, _poisoned) for nobody."""
        if type(jobrank) is not int or not 0 <= jobrank < self.job.size:
            raise ArgumentError(f"{what}(jobrank): expected a job rank, an int in "
                                f"[0, {self.job.size}), got {jobrank!r}")
        return jobrank

    def peer_dying(self, jobrank):
        """Before the core marks ``jobrank`` dead (so before any wait on it
        raises, and the application moves on to the survivors): over shm,
        endpoints that may hold an op towards it issue on fresh libfabric
        endpoints from now on (OfiEndpoint.fresh_initiator)."""
        jobrank = self._jobrank(jobrank, "peer_dying")
        self._fresh_initiators(jobrank, self.domain.d.deaths + 1, False)

    cdef _fresh_initiators(self, int jobrank, long deaths, bint again):
        if self.domain.d.shared_q:
            for oe in list(self.domain._eps):
                (<OfiEndpoint>oe).fresh_initiator(jobrank, deaths, again)

    def peer_died(self, jobrank):
        jobrank = self._jobrank(jobrank, "peer_died")
        self.domain.d.last_dead = jobrank
        self.domain.d.death_at = _now()
        gx_add_long(&self.domain.d.deaths, 1)
        # its rings in this process's landing zones: the lander stops reading
        # them at once and takes them back (staged.pxi _land_dead)
        if self.domain.d.dead_ring != NULL and 0 <= jobrank < self.domain.d.stg_nrings:
            if self.domain.d.dead_ring[jobrank] == 0:
                self.domain.d.dead_ring[jobrank] = 1
            gx_mem_fence()
            gx_add_long(&self.domain.d.dead_pend, 1)
        # an op towards it issued between peer_dying and the core's flags
        # went out on a fresh endpoint: that one is left too
        self._fresh_initiators(jobrank, self.domain.d.deaths, True)

    def _rings_debug(self):
        """A hang report's view of this process's rings (a diagnostic, read
        without locks): its rings in peers' zones (staged.pxi _peer_debug),
        its own zones (_zone_debug), and what decides whether its progress
        and lander threads serve peers now."""
        cdef OfiPeer p
        cdef ofi_dom* d = &self.domain.d
        cdef int i
        peers = {}
        for key, p in self._peers.items():
            if p.c.stg or p.c.vzone or p.c.hmem:
                peers[key] = _peer_debug(d, &p.c)
        # the zones the lander serves, read under its lock: one being
        # unbound leaves d.zones under it before it is freed (_zone_unserve)
        zones = []
        while gx_xchg_int(&d.zlock, 1) != 0:
            sched_yield()
        try:
            for i in range(d.nzones):
                zones.append(_zone_debug(d.zones[i]))
        finally:
            gx_xchg_int(&d.zlock, 0)
        now = _now()
        return {"peers": peers, "zones": zones, "waiters": d.waiters,
                "app_idle": _now_coarse() - d.last_app, "driven_in": d.driven_until - now,
                "quiesce": d.quiesce, "neps": d.neps, "readers": d.readers, "nheld": d.nheld,
                "held_lock": d.held_lock, "zlock": d.zlock, "backed": d.backed,
                "nzones": d.nzones, "landed": d.landed, "idle_in": d.idle_next - _now_coarse(),
                "cq_gate": _cq_gate, "cq_in": _cq_in,
                "progress": self.domain.progress_running,
                "lander": self.domain._lander is not None and self.domain._lander.is_alive(),
                "ring_stats": self.domain.ring_stats}

    def close(self):
        with self._conn_lock:
            self._conn_stop = True
        if self._conn_efd >= 0:
            os.eventfd_write(self._conn_efd, 1)
        if self._conn_thread is not None:
            self._conn_thread.join(timeout=2.0)
        # close threads still in a rendezvous touch nothing once they return
        # (_conn_close); the bootstrap's close ends their wait
        self.domain.d.conn_efd = -1
        if self._conn_efd >= 0 and (self._conn_thread is None or not self._conn_thread.is_alive()):
            os.close(self._conn_efd)
            self._conn_efd = -1
        self.domain.close()


def open(job):
    """The ofi transport of a client (gexmk.transports.REGISTRY)."""
    return OfiTransport(job)
