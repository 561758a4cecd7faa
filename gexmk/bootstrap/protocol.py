"""The rendezvous protocol's state, independent of how bytes travel.

One thread drives it (the server loop, or the caller's lock in a job of one
process), so it needs no locking itself.
"""

from __future__ import annotations

import collections
import hmac

from gexmk.bootstrap.wire import _ProtocolError, _node_name

# Messages:
#
# client -> server                               server -> client
#   ("hello", token, rank, size, pid, node)        ("welcome", pids, nodes)
#   ("contrib", key, members, index, payload)      ("result", key, payloads)
#     (members: a list of job ranks, or n for   ("result", key, [payload], n): n alike
#      ranks 0..n-1)
#   ("withdraw", key, index)                       ("fail", key, kind, rank, text)
#   ("bye",)                                       ("status", key, index, missing_indices)
#                                                  ("dead", rank)
#                                                  ("error", text)   fatal, connection closes


class _Peer:
    """What the protocol knows about one client connection."""

    __slots__ = ("rank", "said_bye", "__weakref__")

    def __init__(self):
        self.rank = None
        self.said_bye = False


class _KeyState:
    __slots__ = ("members", "payloads", "peers", "withdrawn")

    def __init__(self, members):
        self.members = members
        self.payloads = {}    # index -> payload
        self.peers = {}       # index -> _Peer that contributed it
        self.withdrawn = set()  # indices that contributed, then timed out: not "missing"

    def contributors(self):
        return list(dict.fromkeys(self.peers.values()))  # unique, in order


class _Rendezvous:
    """Collective bookkeeping of one job.  ``send(peer, msg)`` delivers a reply."""

    # Failed keys are remembered (bounded) so that late participants fail too instead of
    # waiting for their timeout.
    _FAILED_MEMORY = 4096

    def __init__(self, size: int, send, tokens=None, node_name=None, admit=None):
        self.size = size
        self.send = send
        self.tokens = tokens              # rank -> its secret; None: no check (in-process)
        self.admit = admit                # admit(rank, peer) -> None, or why it is refused
        self.node_name = node_name or _node_name()
        self.peers = {}                   # rank -> live _Peer (said hello, still connected)
        self.arrived = set()              # ranks that said hello or exited before it
        self.pids = [0] * size
        self.node_names = [""] * size
        self.welcome = None               # ("welcome", pids, nodes) once everybody arrived
        self.gone = {}                    # rank -> "dead" | "left"
        self.keys = {}                    # key -> _KeyState
        self.failed = collections.OrderedDict()  # key -> ("fail", ...) message

    @property
    def finished(self) -> bool:
        """Every rank arrived and no connection is left: the server has nothing more to do."""
        return len(self.arrived) == self.size and not self.peers

    def handle(self, peer: _Peer, msg: list) -> bool:
        """Process one message; returns True when the connection must be closed."""
        tag = msg[0]
        if peer.rank is None:
            if tag != "hello":
                raise _ProtocolError(f"{tag!r} before hello")
            return self._hello(peer, msg)
        if tag == "contrib":
            self._contribute(peer, msg)
        elif tag == "withdraw":
            self._withdraw(peer, msg)
        elif tag == "bye":
            peer.said_bye = True
            self._gone(peer.rank, "left")
            return True
        else:
            raise _ProtocolError(f"unknown message type {tag!r}")
        return False

    def disconnected(self, peer: _Peer) -> None:
        """The connection of ``peer`` closed (after a bye, or not: then it died)."""
        if peer.rank is None or self.peers.get(peer.rank) is not peer:
            return
        if not peer.said_bye:
            self._gone(peer.rank, "dead")
        del self.peers[peer.rank]

    def process_exited(self, rank: int, pid: int) -> None:
        """The launcher saw ``rank`` exit; matters only if it never said hello."""
        if rank in self.arrived or not 0 <= rank < self.size:
            return
        self.arrived.add(rank)
        self.pids[rank] = pid
        self.node_names[rank] = self.node_name
        self._gone(rank, "dead")
        self._maybe_welcome()

    # -- internals ------------------------------------------------------------------------

    def _reject(self, peer, text) -> bool:
        self.send(peer, ("error", text))
        return True

    def _hello(self, peer, msg) -> bool:
        try:
            _, token, rank, size, pid, node = msg
        except ValueError:
            raise _ProtocolError("malformed hello") from None
        if not (isinstance(rank, int) and isinstance(pid, int) and isinstance(node, str)):
            raise _ProtocolError("malformed hello")
        if not 0 <= rank < self.size:
            return self._reject(peer, f"rank {rank} outside 0..{self.size - 1}")
        if self.tokens is not None and not _same_secret(token, self.tokens[rank]):
            return self._reject(peer, f"wrong token for rank {rank}: GEXMK_BOOTSTRAP_TOKEN "
                                      f"must be the secret that gexmk.run (or MPI rank 0) gave "
                                      f"the process of that rank")
        why = self.admit(rank, peer) if self.admit is not None else None
        if why:
            return self._reject(peer, why)
        if size != self.size:
            return self._reject(peer, f"client says the job has {size} ranks, the server {self.size}")
        if rank in self.arrived:
            why = {"left": "it already left the job (closed its bootstrap); a process joins a job "
                           "once", "dead": "its process was reported dead"}.get(
                self.gone.get(rank), "another process is connected as that rank")
            return self._reject(peer, f"rank {rank} cannot connect: {why}")
        peer.rank = rank
        self.peers[rank] = peer
        self.arrived.add(rank)
        self.pids[rank] = pid
        self.node_names[rank] = node
        for r, how in self.gone.items():
            if how == "dead":
                self.send(peer, ("dead", r))
        self._maybe_welcome()
        return False

    def _maybe_welcome(self):
        if self.welcome is not None or len(self.arrived) < self.size:
            return
        index = {}
        nodes = [index.setdefault(name, len(index)) for name in self.node_names]
        self.welcome = ("welcome", list(self.pids), nodes)
        for peer in list(self.peers.values()):
            self.send(peer, self.welcome)

    def _fail(self, key, peers, kind, rank, text, remember=False):
        msg = ("fail", key, kind, rank, text)
        if remember:
            self.failed[key] = msg
            while len(self.failed) > self._FAILED_MEMORY:
                self.failed.popitem(last=False)
        for p in dict.fromkeys(peers):
            self.send(p, msg)

    def _contribute(self, peer, msg):
        try:
            _, key, members, index, payload = msg
            if isinstance(members, int) and not isinstance(members, bool) \
                    and 0 < members <= self.size:
                # job ranks 0..n-1 (every rank of a whole-job exchange) sent as n:
                # O(1) to read, check and compare, where a list is O(N) per
                # contribution and O(N^2) per exchange at this server (issue 23)
                members = range(members)
            ok = (isinstance(key, str) and isinstance(members, (list, range)) and members
                  and (isinstance(members, range)
                       or all(isinstance(m, int) and 0 <= m < self.size for m in members))
                  and isinstance(index, int) and 0 <= index < len(members)
                  and members[index] == peer.rank and isinstance(payload, bytes))
        except ValueError:
            ok = False
        if not ok:
            raise _ProtocolError("malformed contribution")
        if key in self.failed:
            self.send(peer, self.failed[key])
            return
        st = self.keys.get(key)
        if st is None:
            # A key nobody contributed to yet cannot complete if a member is gone.  A dead
            # member is named before one that left: the others that left may have done
            # so because of that death.
            gone = sorted((self.gone[r] != "dead", r) for r in set(members) if r in self.gone)
            if gone:
                r = gone[0][1]
                self._fail(key, [peer], self.gone[r], r, _gone_text(r, self.gone[r], key))
                return
            st = self.keys[key] = _KeyState(members)
        elif st.members != members and list(st.members) != list(members):
            del self.keys[key]
            self._fail(key, st.contributors() + [peer], "mismatch", -1,
                       f"exchange {key!r}: participants passed different member lists "
                       f"({st.members} and {members})", remember=True)
            return
        if index in st.payloads:
            del self.keys[key]
            self._fail(key, st.contributors() + [peer], "mismatch", -1,
                       f"exchange {key!r}: index {index} contributed twice", remember=True)
            return
        st.payloads[index] = payload
        st.peers[index] = peer
        st.withdrawn.discard(index)
        if len(st.payloads) == len(members):
            del self.keys[key]
            parts = [st.payloads[i] for i in range(len(members))]
            first = parts[0]
            if len(parts) > 1 and all(p == first for p in parts):
                # a barrier (every payload alike): one copy, not one per member,
                # so each rank receives O(1) bytes, not O(N) (issue 23)
                reply = ("result", key, [first], len(parts))
            else:
                reply = ("result", key, parts)
            for p in st.contributors():
                self.send(p, reply)

    def _withdraw(self, peer, msg):
        try:
            _, key, index = msg
        except ValueError:
            key = None
        if not (isinstance(key, str) and isinstance(index, int)):
            raise _ProtocolError("malformed withdraw")
        st = self.keys.get(key)
        missing = []
        if st is not None and st.peers.get(index) is peer:
            missing = [i for i in range(len(st.members))
                       if i not in st.payloads and i not in st.withdrawn]
            del st.payloads[index], st.peers[index]
            st.withdrawn.add(index)
            if not st.payloads:
                del self.keys[key]
        # If the key already completed or failed, that reply went out before this one.
        self.send(peer, ("status", key, index, missing))

    def _gone(self, rank, how):
        self.gone[rank] = how
        # The notice goes first, so that a client sees the rank dead when its exchange fails.
        if how == "dead":
            for r, p in list(self.peers.items()):
                if r != rank:
                    self.send(p, ("dead", rank))
        for key, st in list(self.keys.items()):
            if any(m == rank and i not in st.payloads for i, m in enumerate(st.members)):
                del self.keys[key]
                self._fail(key, st.contributors(), how, rank, _gone_text(rank, how, key))


def _same_secret(given, expected: str) -> bool:
    # Constant time, so that the answer's timing says nothing about how much was right.
    return isinstance(given, str) and hmac.compare_digest(given.encode(), expected.encode())


def _gone_text(rank, how, key):
    if how == "dead":
        return f"rank {rank} died before contributing to exchange {key!r}"
    return f"rank {rank} left the job (closed its bootstrap) before contributing to exchange {key!r}"

