"""The conformance matrix as data: paths x local memory x target memory x operation x size.

This module is the specification (../../README.md's path table is generated from it):
every cell either moves exact bytes (canaries around them untouched, nothing else
changed) or raises the exception named by :func:`expect`.  Nothing here runs gexmk;
``worker.py`` executes cells inside a job, ``runner.py`` runs the jobs, and
``test_matrix.py`` turns every cell into one pytest item.

A new path, memory or operation is one row in the tables below, plus, where it has
no path, one rule in :func:`expect`.
"""
from dataclasses import dataclass, field

KiB = 1 << 10

#: The chunk every chunked path is set to in these jobs (landing slots, bounce buffers),
#: so that "chunk", "chunk+1" and "3 chunks + 5" cross the chunk boundaries cheaply.
CHUNK = 64 * KiB

#: Sizes in bytes, by name (the boundaries a chunked or inline path cares about).
SIZES = {
    "0": 0, "1": 1, "7": 7, "8": 8, "4095": 4095,
    "chunk-1": CHUNK - 1, "chunk": CHUNK, "chunk+1": CHUNK + 1, "3chunks+5": 3 * CHUNK + 5,
}
#: The default (CI) run takes these; ``--full`` takes every size.
FAST_SIZES = ("0", "1", "8", "4095", "chunk+1", "3chunks+5")

#: Where data lands in a target segment: unaligned on purpose (no path may assume
#: alignment of RMA data); the signal word of put_signal sits at SIG_OFF.
DATA_OFF = 8192 + 3
SIG_OFF = 64
ATOMIC_OFF = 128
#: Target segments are REGION bytes of target area, then 2 x REGION bytes the initiator
#: uses as its local source/destination when a local buffer lives in a segment (a
#: strided local, every other byte, takes twice its size).
REGION = 256 * KiB
SEG_BYTES = 3 * REGION
assert DATA_OFF + max(SIZES.values()) + 4 * KiB <= REGION
assert REGION + 2 * max(SIZES.values()) + 2 * 64 <= SEG_BYTES      # 64: worker.GUARD


@dataclass(frozen=True)
class Path:
    """One way of reaching a target, and how a job forces it."""
    name: str                  # cell id part
    ranks: int                 # job size (initiator rank 0, target rank ranks - 1)
    env: dict                  # environment of the job
    expect: dict               # target memory class ("host", "client", "device") -> path name
    gpu: bool = False          # needs a GPU machine
    doc: str = ""
    skip_unless: str = ""      # a reason to skip the group when the path is not offered
    staged_maps: bool = False  # device segments mapped for their own GPU (no peer access)


_OFI = {"GEXMK_TRANSPORT": "ofi"}
_TCP = dict(_OFI, GEXMK_OFI_PROVIDER="tcp;ofi_rxm")
_SHM = dict(_OFI, GEXMK_OFI_PROVIDER="shm")
_STAGE = {"GEXMK_OFI_STAGE_CHUNK": str(CHUNK), "GEXMK_NBRHD_STAGE_CHUNK": str(CHUNK),
          "GEXMK_CUDA_STAGE_CHUNK": str(CHUNK), "GEXMK_PAGEABLE_CHUNK": str(CHUNK),
          "GEXMK_PAGEABLE_MIN": str(CHUNK)}

PATHS = [
    Path("self", 1, dict(_STAGE), {"host": "self", "client": "self", "device": "self"},
         doc="one process: memcpy, or the copy engine where device memory is involved"),
    Path("nbrhd", 2, dict(_STAGE), {"host": "nbrhd", "client": "pvm", "device": "nbrhd"},
         doc="same node: shared-memory mappings of host segments, VMM/IPC mappings of device "
             "segments; client host memory through process_vm_*"),
    Path("pvm", 2, dict(_STAGE, GEXMK_TRANSPORT="pvm"), {"host": "pvm", "client": "pvm"},
         doc="same node, forced: process_vm_readv/writev"),
    Path("nbrhd-landed", 2, dict(_STAGE, GEXMK_NBRHD_STAGE="all"),
         {"host": "nbrhd-landed", "client": "nbrhd-landed", "device": "nbrhd-landed"},
         doc="same node through the owner's landing zone (forced for host segments)"),
    Path("nbrhd-rings", 2, dict(_STAGE, GEXMK_NBRHD_STAGE="all", GEXMK_RING_IDLE="0.001"),
         {"host": "nbrhd-landed", "client": "nbrhd-landed", "device": "nbrhd-landed"},
         doc="nbrhd-landed with rings released after 1 ms unused: many operations open "
             "their ring again after its pages were punched out (issue 23)"),
    Path("ofi-tcp", 2, dict(_STAGE, **_TCP), {"host": "ofi", "client": "ofi", "device": "ofi-staged"},
         doc="libfabric tcp;ofi_rxm"),
    Path("ofi-shm", 2, dict(_STAGE, **_SHM), {"host": "ofi", "client": "ofi", "device": "ofi-staged"},
         doc="libfabric shm"),
    Path("ofi-staged", 2, dict(_STAGE, GEXMK_OFI_STAGE="all", **_TCP),
         {"host": "ofi-staged", "client": "ofi-staged", "device": "ofi-staged"},
         doc="libfabric tcp;ofi_rxm through the owner's landing zone (forced for host segments)"),
    Path("ofi-rings", 2, dict(_STAGE, GEXMK_OFI_STAGE="all", GEXMK_OFI_ZONE_RINGS="1",
                              GEXMK_OFI_RING_IDLE="0.001", **_TCP),
         {"host": "ofi-staged", "client": "ofi-staged", "device": "ofi-staged"},
         doc="ofi-staged with one ring per landing zone, released after 1 ms unused: most "
             "operations ask for their ring again (issue 23)"),
    Path("ofi-capped", 3, dict(_STAGE, GEXMK_OFI_MAX_PEERS="1", GEXMK_OFI_CONNECT="lazy", **_TCP),
         {"host": "ofi", "client": "ofi", "device": "ofi-staged"},
         doc="libfabric tcp;ofi_rxm with connections to at most one peer process "
             "(GEXMK_OFI_MAX_PEERS=1; three ranks): each barrier closes and reopens "
             "connections between the operations (issue 23)"),
    Path("ofi-hmem", 2, dict(_STAGE, GEXMK_OFI_HMEM="system", **_SHM),
         {"host": "ofi-hmem", "client": "ofi-hmem"},
         doc="libfabric FI_HMEM registration (FI_HMEM_SYSTEM for host segments, to run the "
             "native path without a GPU)",
         skip_unless="a provider offering FI_HMEM with FI_ATOMIC (libfabric >= 1.22's shm)"),
    # GPU machines only
    Path("gpu-self", 1, dict(_STAGE), {"host": "self", "client": "self", "device": "self"},
         gpu=True, doc="one process, one GPU"),
    Path("gpu-nbrhd", 2, dict(_STAGE), {"host": "nbrhd", "client": "pvm", "device": "nbrhd",
                                        "pool": "nbrhd-landed"},
         gpu=True, doc="two processes of one node (one GPU, or one each on two)"),
    Path("gpu-host-staged", 2, dict(_STAGE, GEXMK_CUDA_PEER_ACCESS="off"),
         {"host": "nbrhd", "client": "pvm", "device": "nbrhd", ("device", "devseg"): "nbrhd-staged",
          "pool": "nbrhd-landed"},
         gpu=True, staged_maps=True, doc="no peer mapping: device segments through pinned bounce buffers"),
    Path("gpu-ofi-staged", 2, dict(_STAGE, **_TCP),
         {"host": "ofi", "client": "ofi", "device": "ofi-staged",
          ("host", "devseg"): "ofi-staged", ("client", "devseg"): "ofi-staged"},
         gpu=True, doc="device segments over tcp through the owner's landing zone"),
]
PATH = {p.name: p for p in PATHS}


@dataclass(frozen=True)
class Memory:
    """A kind of memory an operation's local side, or its target, may be."""
    name: str
    cls: str                  # "host" or "device" (where the bytes are)
    doc: str
    gpu: bool = False
    readonly: bool = False    # cannot be a get's destination
    segment: str = ""         # local memory inside the bound segment of this target memory's EP
    ep: str = ""              # outside every segment, initiated from this target memory's EP


#: Local sides of an operation.
LOCAL = [
    Memory("bytes", "host", "a bytes object", readonly=True),
    Memory("bytearray", "host", "a bytearray"),
    Memory("memoryview", "host", "a writable memoryview of a bytearray"),
    Memory("numpy", "host", "a contiguous numpy array"),
    Memory("numpy-strided", "host", "a non-contiguous numpy array (every other byte)"),
    Memory("addr", "host", "an (address, nbytes) tuple of host memory outside every segment"),
    Memory("hostseg", "host", "a numpy view of the initiator's library host segment",
           segment="hostlib"),
    Memory("clientseg", "host", "a numpy view of the initiator's client-allocated host segment",
           segment="hostclient"),
    Memory("devseg", "device", "(address, nbytes) in the initiator's VMM device segment",
           gpu=True, segment="vmm"),
    Memory("devseg-strided", "device", "a non-contiguous CuPy view (every other byte) of the "
           "initiator's VMM device segment", gpu=True, segment="vmm"),
    Memory("cupy", "device", "a CuPy array outside every segment (cudaMalloc), from an EP with a "
           "host segment (a host bounce)", gpu=True),
    Memory("cupy-devep", "device", "a CuPy array outside every segment, from the EP bound to the "
           "VMM device segment of its GPU (that kind's copy engine)", gpu=True, ep="vmm"),
    Memory("numpy-devep", "host", "a contiguous numpy array, from the EP bound to the VMM device "
           "segment (host memory on a device-bound endpoint's paths: fuzz seed 7502)",
           gpu=True, ep="vmm"),
    Memory("pool", "device", "stream-ordered pool memory (cuMemAllocAsync) outside every segment",
           gpu=True),
    Memory("torch", "device", "a PyTorch tensor (expandable segments) outside every segment",
           gpu=True),
]
LOCAL_BY = {m.name: m for m in LOCAL}

#: Targets: a segment bound to an endpoint of its own, published to the job.
TARGET = [
    Memory("hostlib", "host", "a library-allocated host segment (segment_create(size))"),
    Memory("hostclient", "client", "a client-allocated host segment (segment_create(buffer=numpy))"),
    Memory("vmm", "device", "a library-allocated device segment (VMM)", gpu=True),
    Memory("cudamalloc", "device", "a client device segment over cuMemAlloc memory", gpu=True),
    Memory("pool", "device", "a client device segment over cuMemAllocAsync pool memory", gpu=True),
]
TARGET_BY = {m.name: m for m in TARGET}
#: Endpoint index of each target memory's segment, the same in every process.
TARGET_EP = {m.name: i for i, m in enumerate(TARGET)}


@dataclass(frozen=True)
class Op:
    """An operation and how its completion is obtained before the target looks."""
    name: str
    kind: str                 # "put" (data to target), "get" (data from target), "atomic", "signal"
    doc: str
    sizes: tuple = tuple(SIZES)   # size names it takes
    locals: tuple = ()        # local memories it takes (default: all)
    gpu: bool = False         # GPU paths only
    vis: bool = False         # a VIS operation (vector, indexed, strided: issue 22)


_VAL_SIZES = ("1", "7", "8")
#: VIS operations: local blocks in a numpy array (blocks as numpy slices), outside every
#: segment by address, in the client segment, in the device segment (GPU paths).
_VIS_LOCALS = ("numpy", "addr", "clientseg", "devseg", "numpy-devep")
_INDEXED_SIZES = ("0", "8", "4095", "chunk")      # sizes with a divisor to cut equal blocks by
_STRIDED_SIZES = ("8", "4095", "chunk")           # counts are at least 1: no empty shape
_POLL = dict(sizes=("8", "3chunks+5"), locals=("numpy",))   # polled completion: few cells
_DROPPED = dict(sizes=("8", "3chunks+5"), locals=("numpy", "cupy", "cupy-devep"))
RMA_OPS = [
    Op("put", "put", "blocking put"),
    Op("put_nb_now", "put", "put_nb(lc=LC_NOW); a host source changed on return; event waited"),
    Op("put_nb_defer", "put", "put_nb(lc=LC_DEFER), event waited"),
    Op("put_nb_group", "put", "put_nb(lc=LC_GROUP), event waited, then nbi_wait(EC_LC)"),
    Op("put_nb_leaf", "put", "put_nb(lc=LeafEvent()), leaf and event waited"),
    Op("put_nbi", "put", "put_nbi, then nbi_wait(EC_PUT)"),
    Op("put_nbi_region", "put", "put_nbi(lc=LC_DEFER) inside an access region, its event waited"),
    Op("put_nbi_barrier", "put", "put_nbi, then only tm.barrier() (a barrier completes the "
                                 "caller's earlier operations, as OpenSHMEM's barrier_all)"),
    Op("get", "get", "blocking get"),
    Op("get_nb", "get", "get_nb, event waited"),
    Op("get_nbi", "get", "get_nbi, then nbi_wait(EC_GET)"),
    Op("put_val", "put", "put_val of an nbytes integer", sizes=_VAL_SIZES, locals=("value",)),
    Op("put_nb_val", "put", "put_nb_val, event waited", sizes=_VAL_SIZES, locals=("value",)),
    Op("get_val", "get", "get_val of an nbytes integer", sizes=_VAL_SIZES, locals=("value",)),
    Op("put_signal", "signal", "put_signal(SIGNAL_SET), then quiet()"),
    Op("put_signal_add", "signal", "put_signal(SIGNAL_ADD), then quiet()"),
    Op("put_signal_nb", "signal", "put_signal_nb, event waited"),
    Op("put_signal_nbi", "signal", "put_signal_nbi, then quiet()"),
    Op("put_signal_wait", "signal", "put_signal; the target waits with wait_until on the signal, "
                                    "not on a barrier"),
    Op("put_signal_barrier", "signal", "put_signal, then only tm.barrier()"),
    # VIS (GASNet-EX gex_VIS_*): the n bytes reach [DATA_OFF, DATA_OFF + n) as scattered,
    # permuted blocks; worker.py's vis_* builds them (local and remote lists cut differently)
    Op("put_vector", "put", "put_vector: blocks of 1..97 bytes in a shuffled order, the local "
       "list cut differently from the remote one", locals=_VIS_LOCALS, vis=True),
    Op("put_vector_nb", "put", "put_vector_nb, event waited", locals=_VIS_LOCALS, vis=True),
    Op("get_vector", "get", "get_vector (as put_vector)", locals=_VIS_LOCALS, vis=True),
    Op("get_vector_nbi", "get", "get_vector_nbi, then nbi_wait(EC_GET)", locals=_VIS_LOCALS,
       vis=True),
    Op("put_indexed", "put", "put_indexed: equal blocks in a shuffled order",
       sizes=_INDEXED_SIZES, locals=_VIS_LOCALS, vis=True),
    Op("put_indexed_nbi", "put", "put_indexed_nbi, then nbi_wait(EC_PUT)",
       sizes=_INDEXED_SIZES, locals=_VIS_LOCALS, vis=True),
    Op("get_indexed_nb", "get", "get_indexed_nb, event waited", sizes=_INDEXED_SIZES,
       locals=_VIS_LOCALS, vis=True),
    Op("put_strided", "put", "put_strided: 3-D, dimensions in a transposed order on both sides",
       sizes=_STRIDED_SIZES, locals=_VIS_LOCALS, vis=True),
    Op("put_strided_nb", "put", "put_strided_nb, event waited", sizes=_STRIDED_SIZES,
       locals=_VIS_LOCALS, vis=True),
    Op("get_strided", "get", "get_strided (as put_strided)", sizes=_STRIDED_SIZES,
       locals=_VIS_LOCALS, vis=True),
    Op("get_strided_nbi", "get", "get_strided_nbi, then nbi_wait(EC_GET)", sizes=_STRIDED_SIZES,
       locals=_VIS_LOCALS, vis=True),
    # Completion observed only by polling (never nbi_wait, quiet or an event's wait):
    # over tcp a loop of tests spun for ever (fuzz seed 118).  After it the initiator
    # reads the bytes back with a get: a completed put is at the target.
    Op("put_nbi_poll", "put", "put_nbi, then gexmk.nbi_test(EC_PUT) polled until true; the "
       "bytes read back", **_POLL),
    Op("put_nbi_region_test", "put", "put_nbi(lc=LC_DEFER) inside an access region, then the "
       "region event's test() polled", **_POLL),
    Op("put_nbi_region_wait_some", "put", "put_nbi inside an access region, then "
       "wait_some([ev], timeout=5)", **_POLL),
    Op("put_nbi_val_poll", "put", "put_nbi_val, then nbi_test(EC_PUT) polled",
       sizes=_VAL_SIZES, locals=("value",)),
    Op("put_nbi_val_region_wait_some", "put", "put_nbi_val inside an access region, then "
       "wait_some([ev], timeout=5)", sizes=("8",), locals=("value",)),
    Op("put_signal_region_wait_some", "signal", "a blocking put_signal inside an access region "
       "(fuzz seed 118), then wait_some([ev], timeout=5)", **_POLL),
    Op("put_signal_nbi_poll", "signal", "put_signal_nbi, then nbi_test() polled", **_POLL),
    # An event dropped before its op completed: what the op touches must stay alive
    # until it does (a get into a freed array corrupted the heap over tcp).
    Op("put_nb_dropped", "put", "put_nb(lc=LC_DEFER) of a temporary array (host, or CuPy's "
       "for the cupy locals), the event and the array dropped at once; the bytes read back "
       "until they land", **_DROPPED),
    Op("get_nb_dropped", "get", "get_nb into a temporary array (as put_nb_dropped), the event "
       "and the array dropped at once, 32 times (memory allocated next must stay untouched); "
       "then a get_nb waited", **_DROPPED),
    Op("get_nb_seg_destroyed", "get", "get_nb into a new library host segment (the Segment "
       "object as destination), the segment destroyed, then the event waited (memory allocated "
       "meanwhile must stay untouched); then a get_nb waited", **_POLL),
    Op("get_nb_devseg_destroyed", "get", "get_nb_seg_destroyed with a new library device "
       "segment (VMM) of the job's GPU as destination", sizes=("8", "3chunks+5"),
       locals=("numpy",), gpu=True),
    Op("put_on_stream", "put", "put_on_stream on a CuPy stream, then the stream synchronised",
       gpu=True),
    Op("get_on_stream", "get", "get_on_stream on a CuPy stream, then the stream synchronised",
       gpu=True),
    Op("put_signal_on_stream", "signal", "put_signal_on_stream, then the stream synchronised",
       gpu=True),
    Op("peer_view_store", "put", "a CuPy kernel stores through cupy.asarray(tm.peer_view(peer)), "
       "then the current device is synchronised (as a CuPy user would)", locals=("kernel",),
       gpu=True),
    Op("peer_view_dlpack", "put", "a CuPy kernel stores through cupy.from_dlpack(tm.peer_view(peer)), "
       "then the current device is synchronised", locals=("kernel",), gpu=True),
]
RMA_OP = {o.name: o for o in RMA_OPS}

#: Atomic domains' data types (numpy type codes) and operations with their arity.
DTS = {"I32": "i4", "U32": "u4", "I64": "i8", "U64": "u8", "FLT": "f4", "DBL": "f8"}
AMO = {  # name: (operands, fetches)
    "SET": (1, False), "GET": (0, True), "SWAP": (1, True), "CAS": (2, False), "FCAS": (2, True),
    "ADD": (1, False), "FADD": (1, True), "SUB": (1, False), "FSUB": (1, True),
    "INC": (0, False), "FINC": (0, True), "DEC": (0, False), "FDEC": (0, True),
    "MULT": (1, False), "MIN": (1, False), "FMIN": (1, True), "MAX": (1, False), "FMAX": (1, True),
    "AND": (1, False), "FAND": (1, True), "OR": (1, False), "FOR": (1, True),
    "XOR": (1, False), "FXOR": (1, True),
}
BITWISE = {"AND", "FAND", "OR", "FOR", "XOR", "FXOR"}
#: Other one-word operations, one cell per (path, target).
WORD_OPS = ["signal_op_set", "signal_op_add", "atomic_nb", "atomic_nbi",
            # an atomic NBI (FADD, result= buffer) completed only by polling: nbi_test(EC_RMW)
            # in a loop; inside an access region, its event under wait_some(timeout=5)
            "atomic_nbi_poll", "atomic_nbi_region_wait_some"]

#: A segment published, then unbound (not republished), destroyed, and a new one made
#: (bound to the same endpoint, plus anonymous memory mapped at the old address where
#: the kernel gives it): the initiator's stale put / put_signal to the old address must
#: never land in either (SegmentError where the address is reserved, else the access
#: lands in memory the owner no longer uses; fuzz seed 507).  One cell per (path, host
#: target): the owner's address reservation is the same for every local memory.
STALE_OPS = ["stale_put", "stale_put_signal"]

#: Collectives x the team kinds they run on; every rank checks its result.  One cell
#: per (path, collective, team), on the first target's job (the target plays no part).
COLLECTIVES = ["barrier", "barrier_nb", "allreduce", "reduce", "bcast", "allgather", "gather"]
TEAMS = ["tm", "dup", "split", "create", "create_for", "pair"]


@dataclass(frozen=True)
class Cell:
    path: str
    op: str
    target: str
    local: str = "-"
    size: str = "-"
    extra: tuple = field(default=())

    @property
    def id(self):
        return "-".join([self.path, self.target, self.local, self.op, self.size])

    def to_json(self):
        return {"id": self.id, "path": self.path, "op": self.op, "target": self.target,
                "local": self.local, "size": self.size}


# ---- the rules: which cells refuse, with what ----------------------------------------

@dataclass(frozen=True)
class Refusal:
    exc: str                  # exception class name (a GexmkError, or TypeError for a user error)
    match: str                # a word the message must contain
    why: str


def expected_path(path, target, local):
    """The path name ``tm.paths`` must give: by (target, local memory) where the table
    distinguishes them (a device-bound initiating endpoint may take another path), else
    by target memory, else by its class.  Memory outside the segment of a device-bound
    endpoint (device or host) takes that endpoint's paths, as its segment does, and
    every local memory of one segment (devseg, devseg-strided) takes the same paths."""
    mem = LOCAL_BY.get(local)
    seg = mem and (mem.ep or mem.segment)
    if seg:
        local = next(m.name for m in LOCAL if m.segment == seg)
    for key in ((target.name, local), target.name, (target.cls, local), target.cls):
        if key in path.expect:
            return path.expect[key]
    return None


def expect(cell, gpus=1):
    """``None`` where the cell must move exact bytes, else the :class:`Refusal` it must
    raise; ``gpus``: how many GPUs the job's processes see."""
    path, op = PATH[cell.path], cell.op
    local = LOCAL_BY.get(cell.local)
    target = TARGET_BY[cell.target]
    kind = RMA_OP[op].kind if op in RMA_OP else "word"
    if local is not None and kind != "word" and op in RMA_OP:
        if local.name.endswith("-strided") and SIZES[cell.size] > 1 and kind == "signal":
            return Refusal("TypeError" if local.cls == "host" else "ArgumentError", "contiguous",
                           "put_signal takes contiguous buffers (a non-contiguous array: put, "
                           "then signal_op)")
        if local.readonly and kind == "get":
            return Refusal("TypeError", "writable", "a get needs a writable destination")
    if op.startswith("coll_"):
        if op.endswith("_pair"):
            return Refusal("StateError", "TM-pair", "collectives are not defined on a TM-pair "
                                                     "(GASNet-EX)")
        return None
    if op.endswith("_MULT"):
        return Refusal("ArgumentError", "collective",
                       "GASNet-EX has MULT atomics; gexmk keeps OP_MULT for reductions")
    rma_path = expected_path(path, target, cell.local)
    if rma_path == "pvm" and (op in ("put_signal_add", "signal_op_add", "signal_op_set")
                              or op.startswith(("amo_", "atomic_"))):
        return Refusal("UnsupportedError", "pvm", "process_vm_* has no atomics")
    if op.startswith("stale_"):
        return _expect_stale(rma_path, target)
    if path.gpu:
        return _expect_gpu(path, op, local, target, rma_path, gpus, cell.size)
    return None


def _expect_stale(route, target):
    """What a stale put to a published, unbound, destroyed segment does (STALE_OPS);
    None: it lands where the owner no longer looks (a peer's mapping of the old memory,
    client memory the owner keeps until finalize, a retired network registration)."""
    if route == "pvm" and target.name == "hostlib":
        return Refusal("SegmentError", "no longer mapped",
                       "the destroyed library segment's address range stays reserved "
                       "(inaccessible) until finalize: process_vm_writev fails there")
    if route == "nbrhd-landed":
        return Refusal("SegmentError", "landing zone is closed",
                       "the owner closed the segment's landing zone when it unbound it")
    if route == "ofi-staged":
        return Refusal("SegmentError", "unbound or destroyed",
                       "the owner's landing zone refuses a segment unbound since publication")
    return None


_ON_STREAM = ("put_on_stream", "get_on_stream", "put_signal_on_stream")


def _expect_gpu(path, op, local, target, route, gpus, cell_size):
    """The refusals of the GPU paths."""
    if op.startswith("peer_view"):
        if target.cls != "device":
            return Refusal("UnsupportedError", "not device memory", "a host segment has no device view")
        if route not in ("self", "nbrhd") or path.staged_maps:
            return Refusal("UnsupportedError", "peer_view",
                           "no mapping of the peer's device memory for this process's GPU")
        if op == "peer_view_store" and route == "nbrhd" and target.name == "vmm" and gpus > 1:
            return Refusal("UnsupportedError", "from_dlpack",
                           "CuPy would copy a view of another GPU's memory (stores lost): "
                           "the interface refuses and names from_dlpack")
        return None
    dev_local = local is not None and local.cls == "device"
    # the initiating EP is device-bound
    dev_ep = local is not None and "vmm" in (local.segment, local.ep)
    if dev_local and not dev_ep and op in _ON_STREAM and SIZES[cell_size] > 0:
        return Refusal("UnsupportedError", "bounce",
                       "device memory of another kind than the EP's segment moves through a host "
                       "bounce buffer, which a stream cannot order")
    if op in _ON_STREAM:
        if route in ("pvm", "ofi", "ofi-staged"):
            return Refusal("UnsupportedError", "stream", "this path cannot order on a CUDA stream")
        if route == "nbrhd-landed" and not dev_ep:
            return Refusal("UnsupportedError", "device kind",
                           "a landing zone is driven from the stream by host functions of the "
                           "initiating endpoint's device kind")
        if op == "put_signal_on_stream":
            if target.cls != "device":
                return Refusal("UnsupportedError", "put_signal_on_stream",
                               "a signal is ordered on a stream only into device memory")
            if (route.endswith("-staged") or path.staged_maps) and route != "nbrhd-landed":
                return Refusal("UnsupportedError", "host-staged",
                               "the signal would need the segment's GPU to follow the stream")
        if target.cls != "device" and not dev_ep:
            return Refusal("UnsupportedError", "device segment",
                           "stream-ordered RMA to host memory runs on the initiating endpoint's "
                           "device kind")
    return None


def amo_cells(path, target):
    out = []
    for dt, code in DTS.items():
        for name in AMO:
            if name in BITWISE and dt in ("FLT", "DBL"):
                continue
            out.append(Cell(path, f"amo_{dt}_{name}", target))
    return out


def path_targets(path):
    """Target memories a path serves in its jobs."""
    return [t.name for t in TARGET if t.cls in path.expect and (path.gpu or not t.gpu)]


def path_locals(path):
    return [m.name for m in LOCAL if path.gpu or not m.gpu]


def cells(full=False, gpu=False):
    """Every cell of the matrix (``gpu``: the GPU paths' cells instead of the CPU ones)."""
    sizes = tuple(SIZES) if full else FAST_SIZES
    out = []
    for p in PATHS:
        if p.gpu != gpu:
            continue
        for t in path_targets(p):
            for o in RMA_OPS:
                if o.gpu and not p.gpu:
                    continue
                if o.name == "put_signal_wait" and TARGET_BY[t].cls == "device":
                    continue    # a host wait_until on a device word is not built (the GPU
                                # waits with signal_wait_until_on_stream); refused at the target
                for loc in (o.locals or path_locals(p)):
                    if loc in LOCAL_BY and LOCAL_BY[loc].gpu and not p.gpu:
                        continue
                    for s in o.sizes:
                        if s in sizes or (o.locals and not o.vis):
                            out.append(Cell(p.name, o.name, t, loc, s))
            out += amo_cells(p.name, t)
            out += [Cell(p.name, w, t) for w in WORD_OPS]
            if TARGET_BY[t].cls != "device" and p.ranks > 1:
                # (in a job of one no peer holds the address: the process's own
                # stale access may land in its own new segment, by design)
                out += [Cell(p.name, w, t) for w in STALE_OPS]
        out += [Cell(p.name, f"coll_{c}_{team}", path_targets(p)[0])
                for c in COLLECTIVES for team in TEAMS]
    return out
