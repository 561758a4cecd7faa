"""This process's side of the job (:class:`Bootstrap`): the job-wide handle that
every bootstrap plug-in returns, over its connection to the rendezvous server
(:mod:`gexmk.bootstrap.channel`)."""

from __future__ import annotations

import atexit
import operator
import os
import sys
import threading
import traceback

from gexmk.bootstrap import server as _server_mod
from gexmk.bootstrap.wire import (
    _RESERVED_PREFIX, _STATUS_WAIT, MAX_PAYLOAD_BYTES, _node_name,
)
from gexmk.errors import (
    ArgumentError, BootstrapError, PeerDeadError, RankError, StateError, TimeoutError,
)


def _wire_members(members):
    """``members`` as sent: n when they are job ranks 0..n-1 in order (the
    server then reads, checks and compares them in O(1)), else the list."""
    n = len(members)
    if members[0] == 0 and members[-1] == n - 1 and members == list(range(n)):
        return n
    return members


class _Slot:
    """Waiting state of one key in this process (shared by its threads in that exchange)."""

    __slots__ = ("indices", "result", "error", "status")

    def __init__(self):
        self.indices = set()  # indices this process is waiting on
        self.result = None    # list[bytes] once complete
        self.error = None     # (kind, rank, text) on failure
        self.status = {}      # index -> missing indices, answer to a withdraw


class Bootstrap:
    """This process's handle on the job: who is in it, and collectives to set it up.

    Create it with :func:`from_environment`.  Attributes (read-only):

    - ``rank``: job rank of this process, ``0 <= rank < size``.
    - ``size``: number of processes in the job.
    - ``pids``: list of the process id of every job rank.
    - ``nodes``: list of the node index of every job rank; equal indices mean the
      same host (hostname and boot id); numbered ``0..nnodes-1`` by first appearance.
    - ``local_ranks``: the job ranks on this process's node (same index in
      ``nodes``), in rank order, this one among them.
    - ``kind``: name of the plug-in that made it (``"single"``, ``"launcher"``,
      ``"mpi"``, ``"pmix"``, ``"slurm"``, ``"torchrun"``; see
      :mod:`gexmk.bootstrap.registry`), ``reason``: why it was chosen;
      ``launcher_local_ranks``: the node's ranks as the launcher reports them
      (PMIx's PMIX_LOCAL_PEERS), or None where it reports none.
    - ``timeout``: default timeout of blocking calls, in seconds (GEXMK_TIMEOUT).

    Every plug-in hands the same interface: those attributes, :meth:`exchange`
    (and its job-wide form :meth:`allgather`) of bytes, :meth:`barrier`, and
    death notices (:meth:`on_peer_death`, :meth:`dead_ranks`).  A plug-in that
    gets rank and size from a launcher runs the rendezvous server in rank 0
    and passes its address through the launcher's own channel.

    The bootstrap owns one connection to the rendezvous server and one daemon
    reader thread; :meth:`close` (also a context manager exit) releases them and
    tells the server this rank leaves cleanly.  At interpreter exit an open
    bootstrap is closed the same way, unless the interpreter dies of an uncaught
    exception: that, like a signal or ``os._exit``, is reported to the others as
    the death of this rank.  Not fork-safe: a forked child must not use its
    parent's bootstrap.
    """

    def __init__(self, *, rank, size, kind, timeout, connect, token=None, server_rank=None,
                 where="the gexmk.run launcher"):
        # Internal: use from_environment().  ``connect(deliver, lost)`` returns a transport;
        # ``token`` is this rank's secret, which the server expects in the hello;
        # ``server_rank`` the rank whose process hosts the server (None: a launcher does),
        # ``where`` says who hosts it, for messages.
        self.rank = rank
        self.size = size
        self.kind = kind
        self.reason = ""
        self.launcher_local_ranks = None
        self.timeout = timeout
        self._server_rank = server_rank
        self._where = where
        self._allgather_seq = 0
        self.pids = None
        self.nodes = None
        self._cond = threading.Condition()
        self._slots = {}
        self._dead = []            # ranks reported dead, in order
        self._callbacks = []
        self._closed = False
        self._lost = None          # text, once the server connection is gone
        self._fatal = None         # text of an "error" from the server
        self._barrier_seq = 0
        self._server = None        # the server this process hosts (rank 0), if any
        self._transport = connect(self._on_message, self._on_lost)
        try:
            try:
                self._transport.send(("hello", token, rank, size, os.getpid(), _node_name()))
            except OSError as exc:
                raise BootstrapError(f"lost the rendezvous server at "
                                     f"{self._transport.description} during set-up: {exc}") from exc
            # the other ranks wait a little longer than the host of the rendezvous, so
            # that where rank 0 gives up first, its reason (and who never came) is what
            # they report rather than a timeout of their own
            grace = 0.0 if rank == server_rank else min(2.0, 0.25 * timeout)
            with self._cond:
                if not self._cond.wait_for(
                        lambda: self.pids is not None or self._fatal or self._lost,
                        timeout + grace):
                    raise BootstrapError(
                        f"timed out after {timeout:g} s waiting for all {size} ranks to reach the "
                        f"rendezvous server at {self._transport.description} (set GEXMK_TIMEOUT "
                        f"to wait longer)")
                if self._fatal or self._lost:
                    raise BootstrapError(f"rendezvous server at {self._transport.description} "
                                         f"refused rank {rank}: {self._fatal or self._lost}")
        except BaseException:
            self._closed = True
            self._transport.close(goodbye=False)
            raise
        atexit.register(self._at_exit)

    def __repr__(self):
        state = "closed" if self._closed else "open"
        return f"<gexmk Bootstrap kind={self.kind} rank={self.rank} size={self.size} {state}>"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    def exchange(self, key: str, members, index: int, payload, timeout: float | None = None) -> list:
        """All-gather ``payload`` among ``members``; returns every payload, ordered by index.

        ``members`` lists the job ranks taking part, one entry per participant; a
        rank may appear several times when this process holds several members,
        and then calls ``exchange`` once per entry (e.g. from several threads).
        ``index`` is the caller's position in ``members`` (``members[index]``
        must be this rank).  ``key`` (str) names the collective; every
        participant passes the same key and members, and a key must not be
        reused in the job (keys starting with ``"bootstrap:"`` are reserved).
        ``payload`` is any bytes-like object (copied before the call returns) of
        at most :data:`MAX_PAYLOAD_BYTES` (64 MiB).

        Thread-safe: several threads may wait at once, on different keys or on
        different indices of one key.  Blocks, without holding the GIL, for at
        most ``timeout`` seconds (default :attr:`timeout`).

        Raises :class:`~gexmk.errors.PeerDeadError` when a member's process died
        or left before contributing (attribute ``rank``: that job rank), or when
        the rendezvous server is lost (``rank``: 0 in MPI mode, else None),
        :class:`~gexmk.errors.TimeoutError` naming the missing members (the
        caller's contribution is withdrawn, so nothing of it stays behind),
        :class:`~gexmk.errors.StateError` after :meth:`close`, ``ValueError``/
        ``TypeError`` for bad arguments (also when participants disagree on
        ``members``).
        """
        members, index, payload, timeout = self._check_args(key, members, index, payload, timeout)
        with self._cond:
            self._check_usable()
            slot = self._slots.get(key)
            if slot is None:
                slot = self._slots[key] = _Slot()
            if index in slot.indices:
                raise ArgumentError(f"exchange {key!r}: index {index} is already waiting in this "
                                    f"process")
            slot.indices.add(index)
        try:
            try:
                self._transport.send(("contrib", key, _wire_members(members), index, payload))
            except OSError as exc:
                raise self._lost_error(f"exchange {key!r}: lost the rendezvous server: {exc}") from exc
            with self._cond:
                if self._cond.wait_for(lambda: self._settled(slot), timeout):
                    return self._outcome(key, slot)
            # Timed out: withdraw our contribution and learn who was missing.
            try:
                self._transport.send(("withdraw", key, index))
            except OSError:
                pass
            with self._cond:
                self._cond.wait_for(lambda: self._settled(slot) or index in slot.status, _STATUS_WAIT)
                if self._settled(slot):  # completed (or failed) just in time
                    return self._outcome(key, slot)
                missing = slot.status.get(index)
            raise TimeoutError(self._timeout_text(key, members, timeout, missing))
        finally:
            with self._cond:
                slot.indices.discard(index)
                if not slot.indices and self._slots.get(key) is slot:
                    del self._slots[key]

    @property
    def local_ranks(self) -> list:
        """Job ranks on this process's node, in rank order (this one among them)."""
        me = self.nodes[self.rank]
        return [r for r, n in enumerate(self.nodes) if n == me]

    def allgather(self, payload, timeout: float | None = None) -> list:
        """All-gather ``payload`` (bytes-like) over every job rank; returns one
        ``bytes`` per rank, in rank order.  Collective: every rank calls it, from one
        thread at a time, the same number of times.  Raises like :meth:`exchange`."""
        with self._cond:
            self._allgather_seq += 1
            key = f"{_RESERVED_PREFIX}allgather:{self._allgather_seq}"
        return self.exchange(key, list(range(self.size)), self.rank, payload, timeout)

    def barrier(self, timeout: float | None = None) -> None:
        """Wait until every job rank has entered the barrier.

        Collective over all ranks: every rank calls it, from one thread at a
        time, the same number of times.  Raises like :meth:`exchange`.
        """
        with self._cond:
            self._barrier_seq += 1
            key = f"{_RESERVED_PREFIX}barrier:{self._barrier_seq}"
        self.exchange(key, list(range(self.size)), self.rank, b"", timeout)

    def on_peer_death(self, callback) -> None:
        """Call ``callback(rank)`` once for every job rank reported dead.

        Called from a background thread (so it may block or call back into the
        bootstrap), also for ranks that died before registration.  A rank that
        exits after :meth:`close` (or at normal interpreter exit) is not dead.
        Exceptions raised by the callback are printed and otherwise ignored.
        """
        if not callable(callback):
            raise TypeError(f"on_peer_death needs a callable, got {type(callback).__name__}")
        with self._cond:
            self._callbacks.append(callback)
            already = list(self._dead)
        if already:
            self._notify(already, [callback])

    def dead_ranks(self) -> list:
        """Job ranks reported dead so far, in the order they were reported."""
        with self._cond:
            return list(self._dead)

    def close(self) -> None:
        """Leave the job cleanly: say goodbye to the server, stop the reader thread.

        Idempotent.  Pending exchanges of other threads fail with
        :class:`~gexmk.errors.StateError`; exchanges of other ranks that still
        need this one fail with :class:`~gexmk.errors.PeerDeadError` (rank left).
        """
        self._close(goodbye=True)

    def _at_exit(self):
        # sys.last_value is set when the interpreter printed an uncaught exception: the
        # process is crashing, and the others should hear so (on_peer_death).
        crashing = getattr(sys, "last_value", None) is not None
        self._close(goodbye=not crashing)

    def _close(self, goodbye):
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        atexit.unregister(self._at_exit)
        self._transport.close(goodbye=goodbye and self._lost is None)
        if self._server is not None and not self._server.stopped:
            # MPI rank 0: the server keeps serving the others (it stops by itself when
            # they have all left); the process must not exit under them.
            _server_mod._lingering[self._server] = self.timeout

    # -- internals ------------------------------------------------------------------------

    def _check_args(self, key, members, index, payload, timeout):
        if not isinstance(key, str):
            raise TypeError(f"exchange key must be a str, got {type(key).__name__}")
        try:
            members = [operator.index(m) for m in members]
            index = operator.index(index)
        except TypeError:
            raise TypeError("members must be a sequence of job ranks and index a position "
                            "in it (ints)") from None
        if not members:
            raise ArgumentError("members must not be empty")
        for m in members:
            if not 0 <= m < self.size:
                raise RankError(f"member {m} is not a job rank (0..{self.size - 1})")
        if not 0 <= index < len(members):
            raise ArgumentError(f"index {index!r} is not a position in members (0..{len(members) - 1})")
        if members[index] != self.rank:
            raise ArgumentError(f"members[{index}] is rank {members[index]}, but this process is "
                                f"rank {self.rank}")
        try:
            payload = bytes(memoryview(payload))
        except TypeError:
            raise TypeError(f"payload must be bytes-like, got {type(payload).__name__}") from None
        if len(payload) > MAX_PAYLOAD_BYTES:
            raise ArgumentError(f"exchange {key!r}: a payload of {len(payload)} bytes is larger "
                                f"than the {MAX_PAYLOAD_BYTES} bytes (MAX_PAYLOAD_BYTES) a rank "
                                f"may contribute")
        if timeout is None:
            timeout = self.timeout
        elif not timeout >= 0:
            raise ArgumentError(f"timeout must be >= 0 seconds or None, got {timeout!r}")
        return members, index, payload, float(timeout)

    def _check_usable(self):
        if self._closed:
            raise StateError("the bootstrap is closed")
        if self._lost is not None:
            raise self._lost_error(self._lost)

    def _settled(self, slot):
        return (slot.result is not None or slot.error is not None or self._closed
                or self._lost is not None)

    def _outcome(self, key, slot):
        if slot.result is not None:
            return list(slot.result)
        if slot.error is not None:
            kind, rank, text = slot.error
            if kind == "mismatch":
                raise ArgumentError(text)
            err = PeerDeadError(text)
            err.rank = rank
            raise err
        if self._closed:
            raise StateError(f"exchange {key!r}: the bootstrap was closed while waiting")
        raise self._lost_error(f"exchange {key!r}: {self._lost}")

    def _lost_error(self, text):
        err = PeerDeadError(text)
        # Without the server nothing can be exchanged; where a rank hosted it, that rank is gone.
        err.rank = self._server_rank if self._server_rank != self.rank else None
        return err

    @staticmethod
    def _timeout_text(key, members, timeout, missing):
        text = f"exchange {key!r} timed out after {timeout:g} s"
        if missing:
            ranks = sorted({members[i] for i in missing})
            return (f"{text}: no contribution from members at index {missing} "
                    f"(job ranks {ranks}); raise GEXMK_TIMEOUT if they are just slow")
        return f"{text} (the server did not say which members were missing)"

    def _on_message(self, msg):
        # Reader thread (or the caller's thread in single mode): never runs user code.
        tag = msg[0]
        with self._cond:
            if tag == "result" or tag == "fail":
                slot = self._slots.get(msg[1])
                if slot is not None:  # else: every waiter timed out and left
                    if tag == "result":
                        # ("result", key, [p], n): every member contributed p
                        slot.result = msg[2] if len(msg) == 3 else list(msg[2]) * msg[3]
                    else:
                        slot.error = tuple(msg[2:5])
            elif tag == "status":
                slot = self._slots.get(msg[1])
                if slot is not None:
                    slot.status[msg[2]] = msg[3]
            elif tag == "welcome":
                self.pids, self.nodes = list(msg[1]), list(msg[2])
            elif tag == "dead":
                rank = msg[1]
                if rank in self._dead:
                    return
                self._dead.append(rank)
                callbacks = list(self._callbacks)
            elif tag == "error":
                self._fatal = msg[1]
            self._cond.notify_all()
        if tag == "dead" and callbacks:
            self._notify([rank], callbacks)

    def _on_lost(self, reason):
        with self._cond:
            if self._closed:
                return
            self._lost = f"{reason} ({self._where} hosts it; it has probably died)"
            self._cond.notify_all()
            # Where a rank hosts the server, losing it means that rank is gone.
            host = self._server_rank
            lost_rank = host is not None and host != self.rank and host not in self._dead
            if lost_rank:
                self._dead.append(host)
            callbacks = list(self._callbacks)
        if lost_rank and callbacks:
            self._notify([host], callbacks)

    @staticmethod
    def _notify(ranks, callbacks):
        def run():
            for rank in ranks:
                for cb in callbacks:
                    try:
                        cb(rank)
                    except Exception:
                        print(f"[gexmk.bootstrap] on_peer_death callback {cb!r} failed:",
                              file=sys.stderr)
                        traceback.print_exc()
        threading.Thread(target=run, name="gexmk-peer-death", daemon=True).start()
