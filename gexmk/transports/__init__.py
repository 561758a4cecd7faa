"""Transport plug-ins: how one process reaches the bound segments of others.

The core (``gexmk.core``) names no transport.  It loads the ones that
:data:`REGISTRY` lists and that the job needs, and talks to each through two
faces:

**Data plane** — a ``gx_tr_ops`` table of nogil C functions
(``include/gexmk/gexmk.h``: put, get, atomic, test, wait, orphan, sync,
nbi_test; arguments in one ``gx_xfer``).  Every slot is filled: what a
transport cannot do raises ``UnsupportedError`` naming itself and the
operation.  A transport may hand out several tables (one per *path*, e.g.
``local`` has ``self``, ``nbrhd`` and ``pvm``); the core stores the chosen
table and contexts in each route, and the hot path reads one pointer.

**Control plane** — a Python object returned by the module's ``open(job)``:

``name``
    the transport's name (the key of its blobs in publications).
``open_endpoint(index) -> context``
    per local endpoint: ``context.handle`` (int, the C context passed as
    ``gx_xfer.ep``), ``context.ops`` (int, address of a ``gx_tr_ops`` whose
    ``sync``/``nbi_test`` serve this endpoint), ``context.bind(segment) ->
    bytes | None`` (what peers need, published under the transport's name),
    ``context.unbind()``, ``context.close()`` (idempotent).
``apply(peer, blob) -> context | None``
    a peer published (or withdrew, ``peer.size == 0``) a segment: make or
    update the per-target context (``context.handle`` is passed as
    ``gx_xfer.peer``), None when this transport cannot reach it.
``reach(endpoint_context, peer, context) -> Reach | None``
    how well this transport serves (local endpoint, target): scores for RMA
    and atomics (0: not at all; the core takes the highest, separately for
    each), the ``gx_tr_ops`` table to use, and ``local_base``: the CPU
    address of the target's first byte where a plain memcpy is right (host
    memory mapped here), else 0.
``peer_died(jobrank)``, ``close()``.
``peer_dying(jobrank)`` (optional)
    a peer died, before the core marks its targets dead (so before any wait
    on it raises and the application turns to the survivors): what must
    change before then (ofi over shm: endpoints that may hold an op towards
    it issue through fresh ones).  ``peer_died`` follows.
``connect(pairs)`` (optional)
    after a publication, while every member is still in it: set up now what
    the first operation to the targets just published would otherwise set up
    (connections); ``pairs`` lists (endpoint context, target handle, rma) for
    each route this transport serves (``rma`` False: the atomics path).
    Bounded in time; failures are warnings, never errors.
``quiesce()`` (optional)
    at finalize, before the job's last barrier: complete what this process
    still has in flight (operations whose events finalize fails included),
    bounded in time, so that no peer closes its endpoints under a transfer.

A newcomer adding a transport writes one module with ``open(job)`` and adds
one line to :data:`REGISTRY` (and one ``extension_module`` to
``gexmk/transports/meson.build``).
"""
from __future__ import annotations

from collections import namedtuple

__all__ = ["REGISTRY", "Job", "Peer", "Reach"]

#: What a transport learns of the job when it is opened; ``exchange``: the
#: bootstrap's keyed all-gather among some job ranks (``Bootstrap.exchange``,
#: thread-safe, blocking without the GIL), a channel beside the network's, or
#: None.
Job = namedtuple("Job", "rank size nodes pids config exchange", defaults=(None,))
Job.multi_node = property(lambda self: len(set(self.nodes)) > 1)

#: A target as the core describes it to transports: owner (job rank, endpoint
#: index, pid, node index), where it stands relative to this process, what was
#: published (address in the owner, size, memory kind class and device), and
#: ``target``: the address of the core's ``gx_target`` (alive as long as the
#: client; transports read its ``dead`` flag and bounds from C).
Peer = namedtuple("Peer", "jobrank ep_index pid node same_process same_node base size kind device "
                          "target")

#: A transport's answer to ``reach``: path name, scores, table, peer handle, CPU base,
#: ``view``: (address, device) of a device mapping of the target in this process
#: that kernels on that device may load from and store to (NVSHMEM's nvshmem_ptr), or None,
#: ``staged``: True when the path is a degraded one that copies through host bounce
#: buffers (device memory the path cannot reach directly); a user may refuse those;
#: ``ordered``: True when small implicit puts from one endpoint to the target land
#: in issue order (the collectives then signal a round by a store, not an atomic);
#: and ``wake``: with ``local_base``, the CPU address of the target's ``gx_wake``
#: word (gexmk.h: CPU signal and atomic writers wake sleeping waiters), else 0;
#: ``vis``: the name of the path small-block VIS takes where it is not the RMA
#: path's (``Team.paths`` shows it), else None.
Reach = namedtuple("Reach", "name rma amo ops peer local_base view staged ordered wake vis",
                   defaults=(None, False, False, 0, None))


def _always(job):
    return "always"


def _ofi_needed(job):
    if job.config.transport == "ofi":
        return "GEXMK_TRANSPORT=ofi"
    if job.multi_node:
        return "peers on other nodes"
    return None


#: (name, module, needed(job) -> reason or None), in order of registration.
REGISTRY = [
    ("local", "gexmk.transports.local", _always),
    ("ofi", "gexmk.transports.ofi", _ofi_needed),
]
