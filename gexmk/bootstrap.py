"""Job rendezvous and out-of-band collectives (pure Python, standard library only).

Before any endpoint can talk to another, every process of a job must learn who
the others are and swap a few bytes of set-up data (addresses, segment keys).
This module provides that *bootstrap* layer, the counterpart of GASNet-EX's
spawner (ssh/mpi/pmi) and its ``gasneti_bootstrapExchange``.

Three ways to find the job, picked by :func:`from_environment`:

``launcher``
    The process was started by ``python -m gexmk.run``; the rendezvous server
    runs inside the launcher on an abstract-namespace Unix socket (or on TCP,
    with ``--bootstrap-listen``), and each rank presents the secret the
    launcher put in its environment (GEXMK_BOOTSTRAP_TOKEN).
``mpi``
    The process runs under ``mpiexec``/``srun``; MPI rank 0 runs the
    rendezvous server in a daemon thread and sends each rank, over MPI, the
    server's address and that rank's secret.
``single``
    A lone process (size 1); exchanges between its threads stay in-process.

The server admits rank R only with rank R's secret (a random token per rank,
compared in constant time), so a process of the same user that is not the
one started as R cannot take R's place, on a Unix socket or on TCP.

Every mode speaks the same small protocol: a client sends its contribution to
a *key*; the server answers every contributor with all payloads once the last
one arrived, then forgets the key.  A process that drops its connection without
saying goodbye is reported dead to the others, whose exchanges that still need
it fail with :class:`~gexmk.errors.PeerDeadError`.

This module must stay importable without gexmk's compiled extensions: the
launcher and the tests use it before (or without) the core.
"""

from __future__ import annotations

import atexit
import collections
import hmac
import operator
import os
import secrets
import selectors
import socket
import struct
import sys
import threading
import time
import traceback
import warnings

from gexmk import config
from gexmk.errors import (
    ArgumentError,
    BootstrapError,
    PeerDeadError,
    RankError,
    StateError,
    TimeoutError,
)

__all__ = ["Bootstrap", "RendezvousServer", "from_environment", "default_timeout"]

#: Seconds a blocking bootstrap call waits when neither the call nor GEXMK_TIMEOUT says otherwise.
DEFAULT_TIMEOUT = config.DEFAULT_TIMEOUT

#: At most this many seconds are spent retrying a refused connection to the server:
#: the server is always listening before clients start, so a refusal that lasts
#: means a wrong address or a dead launcher, not a slow one.
CONNECT_TIMEOUT = 10.0

#: After a timed-out exchange, seconds to wait for the server to say which members were missing.
_STATUS_WAIT = 5.0

#: Seconds a new connection may take to present its hello before the server drops it.
#: A rank sends its hello right after connecting, so only a stranger needs longer.
HELLO_TIMEOUT = 10.0

#: Largest frame the server reads before the sender has authenticated: a hello is a
#: token, four numbers and a node name, well under this.
MAX_HELLO_BYTES = 4096

#: Largest payload one rank may contribute to an exchange (64 MiB); the server drops
#: an authenticated connection whose frame exceeds :data:`MAX_MESSAGE_BYTES`.
MAX_PAYLOAD_BYTES = 64 << 20

#: Largest frame the server reads from an authenticated rank: a payload of
#: :data:`MAX_PAYLOAD_BYTES` plus room for its key and member list.
MAX_MESSAGE_BYTES = MAX_PAYLOAD_BYTES + (1 << 20)

#: Environment variables that typical MPI launchers (Hydra/MPICH, PMIx, Open MPI) set.
MPI_ENVIRONMENT = (
    "PMI_RANK", "PMI_SIZE", "PMI_FD", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_RANK", "MPI_LOCALNRANKS", "HYDI_CONTROL_FD", "MPICH_INTERFACE_HOSTNAME",
)

# Keys with this prefix are used by the bootstrap itself (barrier); the core must not use them.
_RESERVED_PREFIX = "bootstrap:"

#: Variables whose presence keeps the crash handlers of libpsm_infinipath
#: (IPATH_NO_BACKTRACE) and of libpsm2 before 11.2 (HFI_NO_BACKTRACE) out of a process.
PSM_BACKTRACE_SWITCHES = ("IPATH_NO_BACKTRACE", "HFI_NO_BACKTRACE")


def keep_crash_signals(environ) -> None:
    """Set :data:`PSM_BACKTRACE_SWITCHES` to ``"1"`` in ``environ`` where it has none.

    Debian's libfabric links libpsm_infinipath, whose constructor (it runs when
    libfabric is loaded, whatever provider the job uses; FI_PROVIDER cannot
    prevent it) takes over SIGSEGV, SIGBUS, SIGILL, SIGABRT, SIGINT and SIGTERM:
    it prints a backtrace, writes ``<prog>.80s-<pid>,<host>.btr`` into the
    working directory and exits with 1, so a crash reads as ``exit 1``.  Call
    this on ``os.environ`` before libfabric is loaded (``import gexmk`` does), or
    on the environment of a process to start.  A value the user set is kept.
    """
    for name in PSM_BACKTRACE_SWITCHES:
        environ.setdefault(name, "1")


def default_timeout() -> float:
    """The default timeout of blocking bootstrap calls, in seconds: env GEXMK_TIMEOUT, else 300
    (parsed by :func:`gexmk.config.timeout`, the one parser of the setting)."""
    try:
        return config.timeout()
    except ArgumentError as e:
        raise BootstrapError(str(e)) from None


def _node_name() -> str:
    """Name that is equal for two processes exactly when they share a (booted)
    host and network namespace.  Processes in different network namespaces are
    treated as different nodes: they cannot meet on an abstract socket, and this
    is how one machine stands in for several hosts in the tests."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    try:
        netns = os.readlink("/proc/self/ns/net")
    except OSError:
        netns = ""
    return f"{socket.gethostname()}/{boot}/{netns}"


# --------------------------------------------------------------------------------------------
# Wire format.  Messages are tuples of None/int/str/bytes/lists, in a tagged encoding rather
# than pickle so that a stray connection can at worst be dropped, never run code.
# A frame is a 4-byte big-endian length followed by the encoded message.

_LEN = struct.Struct("!I")
_I64 = struct.Struct("!q")
_MAX_FRAME = (1 << 32) - 1
_MAX_DEPTH = 4


class _ProtocolError(Exception):
    """A peer sent something this protocol does not allow; its connection is dropped."""


def _encode(obj, out: bytearray) -> None:
    if obj is None:
        out += b"n"
    elif isinstance(obj, int):
        out += b"i"
        out += _I64.pack(obj)
    elif isinstance(obj, str):
        data = obj.encode()
        out += b"s"
        out += _LEN.pack(len(data))
        out += data
    elif isinstance(obj, (bytes, bytearray)):
        out += b"b"
        out += _LEN.pack(len(obj))
        out += obj
    elif isinstance(obj, (list, tuple)):
        out += b"l"
        out += _LEN.pack(len(obj))
        for item in obj:
            _encode(item, out)
    else:
        raise TypeError(f"cannot encode {type(obj).__name__} in a bootstrap message")


def _frame(msg, limit: int = _MAX_FRAME) -> bytearray:
    out = bytearray(_LEN.size)
    _encode(msg, out)
    n = len(out) - _LEN.size
    if n > limit:
        raise ArgumentError(f"a bootstrap {msg[0]!r} message of {n} bytes is larger than the "
                            f"{limit} bytes the rendezvous server accepts")
    _LEN.pack_into(out, 0, n)
    return out


def _decode(buf: memoryview, pos: int = 0, depth: int = 0):
    try:
        tag = buf[pos]
        pos += 1
        if tag == 0x6E:  # n
            return None, pos
        if tag == 0x69:  # i
            return _I64.unpack_from(buf, pos)[0], pos + 8
        if tag in (0x73, 0x62):  # s, b
            (n,) = _LEN.unpack_from(buf, pos)
            pos += 4
            if pos + n > len(buf):
                raise _ProtocolError("truncated message")
            data = bytes(buf[pos:pos + n])
            return (data.decode() if tag == 0x73 else data), pos + n
        if tag == 0x6C and depth < _MAX_DEPTH:  # l
            (n,) = _LEN.unpack_from(buf, pos)
            pos += 4
            items = []
            for _ in range(n):
                item, pos = _decode(buf, pos, depth + 1)
                items.append(item)
            return items, pos
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise _ProtocolError(f"malformed message: {exc}") from None
    raise _ProtocolError(f"unknown tag {tag!r} in message")


def _decode_frame(body: memoryview) -> list:
    msg, end = _decode(body)
    if end != len(body) or not isinstance(msg, list) or not msg or not isinstance(msg[0], str):
        raise _ProtocolError("a message must be a non-empty list starting with its type")
    return msg


def _parse_address(address: str):
    """``"@name"`` → (AF_UNIX, abstract name); ``"host:port"`` → (AF_INET*, (host, port))."""
    if address.startswith("@") and len(address) > 1:
        return socket.AF_UNIX, "\0" + address[1:]
    host, sep, port = address.rpartition(":")
    if sep and host and port.isdigit():
        return socket.AF_INET, (host.strip("[]"), int(port))
    raise BootstrapError(
        f"bad rendezvous address {address!r}: expected '@name' (abstract Unix socket) or 'host:port'")


# --------------------------------------------------------------------------------------------
# The rendezvous protocol state, independent of how bytes travel.  One thread drives it
# (the server loop, or the caller's lock in single mode), so it needs no locking itself.
#
# client -> server                               server -> client
#   ("hello", token, rank, size, pid, node)        ("welcome", pids, nodes)
#   ("contrib", key, members, index, payload)      ("result", key, payloads)
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
            ok = (isinstance(key, str) and isinstance(members, list) and members
                  and all(isinstance(m, int) and 0 <= m < self.size for m in members)
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
            # A key nobody contributed to yet cannot complete if a member is gone.
            for r in members:
                if r in self.gone:
                    self._fail(key, [peer], self.gone[r], r, _gone_text(r, self.gone[r], key))
                    return
            st = self.keys[key] = _KeyState(members)
        elif st.members != members:
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
            reply = ("result", key, [st.payloads[i] for i in range(len(members))])
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


# --------------------------------------------------------------------------------------------
# The socket server.

# Servers of this process that still serve other ranks after the local one left
# (MPI rank 0), with how long to wait for them at interpreter exit.
_lingering = {}


@atexit.register
def _linger_at_exit():
    # Registered at import, so it runs after every Bootstrap's own exit hook (they are
    # registered later): the local rank has left; wait for the others, then stop.
    for server, timeout in list(_lingering.items()):
        server.wait_finished(timeout)
        server.close()


class _Conn(_Peer):
    """A server-side client connection; it is also the protocol's peer."""

    __slots__ = ("sock", "pid", "inbuf", "outbuf", "want_write", "closing")

    def __init__(self, sock, pid=None):
        super().__init__()
        self.sock = sock
        self.pid = pid        # the connecting process (SO_PEERCRED), on a Unix socket
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.want_write = False
        self.closing = False  # close once outbuf is flushed


def _tcp_listener(host: str):
    """A listening TCP socket on ``host`` (address or name), port picked by the kernel."""
    try:
        infos = socket.getaddrinfo(host, 0, socket.AF_UNSPEC, socket.SOCK_STREAM, 0,
                                   socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise BootstrapError(f"cannot listen on {host!r}: not a known host name or address "
                             f"({exc})") from None
    errors = []
    for family, _, _, _, sockaddr in infos:
        try:
            return socket.create_server(sockaddr, family=family, backlog=128)
        except OSError as exc:
            errors.append(f"{sockaddr[0]}: {exc}")
    raise BootstrapError(f"cannot listen on {host!r} (is it an address of this machine, in "
                         f"this network namespace?): {'; '.join(errors)}")


class RendezvousServer:
    """The job's rendezvous server: a thread serving a listening socket.

    ``size`` is the number of ranks of the job.  With ``tcp=False`` (default) it
    listens on an abstract-namespace Unix socket (nothing on disk; only processes
    of the same user and network namespace may connect); with ``tcp=True`` on
    TCP, port chosen by the kernel: on all interfaces (address
    ``hostname:port``), or on ``host`` alone (an address or name of this
    machine; address ``host:port``).  :attr:`address` is the string clients
    pass to connect (GEXMK_BOOTSTRAP).

    Either way rank R is admitted only with rank R's secret, :meth:`token`,
    which whoever starts rank R must hand to that process alone (the launcher
    puts it in the rank's environment as GEXMK_BOOTSTRAP_TOKEN; MPI rank 0
    scatters it).  The secrets are random (128 bits each) unless ``tokens``
    gives them: a sequence of ``size`` non-empty str.  On the Unix socket,
    ``admit(rank, pid)`` (optional) is asked too, with the pid of the
    connecting process from the kernel (SO_PEERCRED); False refuses it.  It
    runs in the server thread and must be quick.

    The listening socket exists when the constructor returns, so clients may be
    started right after; :meth:`start` begins serving.  :meth:`close` stops the
    thread and closes every socket; it is idempotent.  With
    ``stop_when_finished`` the thread also ends by itself once every rank has
    connected and disconnected again.

    ``home_rank`` names the rank whose process hosts the server (MPI rank 0).
    Replies to it are held back until every other client's output has left,
    so that once it has its answer it may block in a call that keeps the GIL
    (the server thread then cannot run) without starving the others.

    Nothing a connection sends is kept before it has authenticated: its first
    frame must be a hello of at most :data:`MAX_HELLO_BYTES` bytes, and come
    within ``hello_timeout`` seconds (default :data:`HELLO_TIMEOUT`), or the
    connection is dropped.  An authenticated rank's frames are limited to
    :data:`MAX_MESSAGE_BYTES`; a rank that sends a larger one is dropped (and
    reported dead to the others).
    """

    def __init__(self, size: int, *, tcp: bool = False, tokens=None,
                 name: str | None = None, stop_when_finished: bool = False,
                 home_rank: int | None = None, host: str | None = None,
                 hello_timeout: float | None = None, admit=None):
        if not isinstance(size, int) or size < 1:
            raise ArgumentError(f"a job needs at least one rank, got size={size!r}")
        if hello_timeout is None:
            hello_timeout = HELLO_TIMEOUT
        if not hello_timeout > 0:  # also rejects NaN
            raise ArgumentError(f"hello_timeout must be a positive number of seconds, got "
                                f"{hello_timeout!r}")
        self._hello_timeout = float(hello_timeout)
        if tokens is None:
            tokens = [secrets.token_hex(16) for _ in range(size)]
        elif isinstance(tokens, str):
            raise TypeError("tokens must be a sequence of one secret per rank, not one str")
        else:
            tokens = list(tokens)
            if len(tokens) != size or not all(isinstance(t, str) and t for t in tokens):
                raise ArgumentError(f"tokens must hold one non-empty str per rank ({size}), got "
                                    f"{len(tokens)} item(s)")
        self._tokens = tokens
        if admit is not None and not callable(admit):
            raise TypeError(f"admit must be a callable(rank, pid) -> bool, got "
                            f"{type(admit).__name__}")
        self._admit_pid = admit
        self._unauthenticated = {}  # _Conn -> monotonic deadline for its hello, oldest first
        self.size = size
        self._stop_when_finished = stop_when_finished
        self._home_rank = home_rank
        self._home = None      # the home rank's connection, once it said hello
        self._backlog = set()  # other connections with output not yet sent
        if host is not None and not tcp:
            raise ArgumentError("host is only for a TCP server (tcp=True)")
        if tcp and host is not None:
            host = host.strip().strip("[]")
            self._listener = _tcp_listener(host)
            shown = f"[{host}]" if ":" in host else host
            self.address = f"{shown}:{self._listener.getsockname()[1]}"
        elif tcp:
            if socket.has_dualstack_ipv6():
                self._listener = socket.create_server(("", 0), family=socket.AF_INET6,
                                                      dualstack_ipv6=True, backlog=128)
            else:
                self._listener = socket.create_server(("", 0), backlog=128)
            #: Address clients connect to ("host:port" or "@abstract-name").
            self.address = f"{socket.gethostname()}:{self._listener.getsockname()[1]}"
        else:
            name = name or f"gexmk-{os.getpid()}-{secrets.token_hex(6)}"
            self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                self._listener.bind("\0" + name)
                self._listener.listen(128)
            except OSError as exc:
                self._listener.close()
                raise BootstrapError(f"cannot listen on abstract socket @{name}: {exc}") from exc
            self.address = "@" + name
        self._unix = not tcp
        self._listener.setblocking(False)
        self._rdv = _Rendezvous(size, self._send, tokens=self._tokens, admit=self._admit)
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._commands = collections.deque()  # callables run in the server thread
        self._to_drop = []
        self._last_msg = self._last_frame = None
        self._exits = []                       # (due time, rank, pid)
        self._lost_at = {}                     # rank -> monotonic time it vanished without bye
        self._finished = threading.Condition()
        self._stopped = False
        self._thread = None
        self._closed = False

    def __repr__(self):
        return f"<RendezvousServer {self.address} size={self.size}>"

    def token(self, rank: int) -> str:
        """The secret ``rank`` must present to join; give it to that rank's process only."""
        rank = operator.index(rank)
        if not 0 <= rank < self.size:
            raise RankError(f"rank {rank} is not a rank of this job (0..{self.size - 1})")
        return self._tokens[rank]

    def start(self) -> None:
        """Start serving in a daemon thread."""
        if self._thread is not None or self._closed:
            raise StateError("rendezvous server already started or closed")
        self._sel.register(self._listener, selectors.EVENT_READ, "listen")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._serve, name="gexmk-rendezvous", daemon=True)
        self._thread.start()

    def process_exited(self, rank: int, pid: int) -> None:
        """Tell the server that the process of ``rank`` (with ``pid``) has exited.

        Thread-safe.  Only matters for a rank that never connected: it is then
        reported dead, so the others do not wait for it until their timeout.
        Applied after a short delay so that data the process sent before it
        exited is read first.
        """
        self._call(lambda: self._exits.append((time.monotonic() + 0.5, rank, pid)))

    def lost_at(self, rank: int) -> float | None:
        """When (``time.monotonic()``) the server saw ``rank``'s connection close without a
        goodbye, or None.  Thread-safe.  Taken before the other ranks are told the rank
        is dead, so it comes before any failure that this news causes."""
        return self._lost_at.get(rank)

    @property
    def stopped(self) -> bool:
        """True once the server thread has ended (closed, or finished by itself)."""
        return self._stopped

    def wait_finished(self, timeout: float | None) -> bool:
        """Wait until every rank has connected and disconnected; True if it happened."""
        with self._finished:
            return self._finished.wait_for(lambda: self._stopped or self._rdv.finished, timeout)

    def close(self) -> None:
        """Stop serving and close all sockets.  Idempotent; safe from any thread but the server's."""
        if self._closed:
            return
        self._closed = True
        if self._thread is not None:
            self._call(None)
            self._thread.join()
        else:
            self._cleanup()

    # -- server thread --------------------------------------------------------------------

    def _call(self, fn):
        self._commands.append(fn)
        try:
            self._wake_w.send(b"x")
        except (BlockingIOError, OSError):
            pass  # the wake-up pipe is full (a wake-up is pending anyway) or closed

    def _serve(self):
        try:
            while True:
                due = [t for t, _, _ in self._exits]
                if self._unauthenticated:
                    due.append(next(iter(self._unauthenticated.values())))
                timeout = max(0.0, min(due) - time.monotonic()) if due else None
                for key, mask in self._sel.select(timeout):
                    if key.data == "listen":
                        self._accept()
                    elif key.data == "wake":
                        if not self._run_commands():
                            return
                    else:
                        conn = key.data
                        if mask & selectors.EVENT_READ:
                            self._read(conn)
                        if mask & selectors.EVENT_WRITE:
                            self._flush(conn)
                self._apply_exits()
                self._expire_hellos()
                for conn in self._to_drop:
                    self._drop(conn)
                self._to_drop.clear()
                self._last_msg = self._last_frame = None  # do not keep a result alive
                home = self._home
                if home is not None and home.outbuf and not self._backlog:
                    self._flush(home)
                    for conn in self._to_drop:
                        self._drop(conn)
                    self._to_drop.clear()
                with self._finished:
                    self._finished.notify_all()
                if self._stop_when_finished and self._rdv.finished:
                    return
        except Exception:  # a bug here must not hang the job silently
            traceback.print_exc()
        finally:
            self._cleanup()

    def _cleanup(self):
        for key in list(self._sel.get_map().values()):
            if isinstance(key.data, _Conn):
                key.data.sock.close()
        self._sel.close()
        self._listener.close()
        self._wake_r.close()
        self._wake_w.close()
        with self._finished:
            self._stopped = True
            self._finished.notify_all()
        _lingering.pop(self, None)

    def _run_commands(self) -> bool:
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass
        while self._commands:
            fn = self._commands.popleft()
            if fn is None:
                return False
            fn()
        return True

    def _apply_exits(self):
        now = time.monotonic()
        due = [e for e in self._exits if e[0] <= now]
        if due:
            self._exits = [e for e in self._exits if e[0] > now]
            for _, rank, pid in due:
                self._rdv.process_exited(rank, pid)

    def _expire_hellos(self):
        now = time.monotonic()
        for conn, deadline in list(self._unauthenticated.items()):
            if deadline > now:
                break  # deadlines are in accept order
            del self._unauthenticated[conn]
            if not conn.closing:
                print(f"[gexmk.bootstrap] dropping a connection that did not say hello within "
                      f"{self._hello_timeout:g} s", file=sys.stderr)
            self._to_drop.append(conn)

    def _accept(self):
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # e.g. EMFILE: the client sees a failed connect/hello
            pid = None
            if self._unix:
                pid = self._same_user_pid(sock)
                if pid is None:
                    sock.close()
                    continue
            sock.setblocking(False)
            conn = _Conn(sock, pid)
            self._sel.register(sock, selectors.EVENT_READ, conn)
            self._unauthenticated[conn] = time.monotonic() + self._hello_timeout

    @staticmethod
    def _same_user_pid(sock):
        """The peer's pid if it runs as our user, else None."""
        # Abstract sockets have no file permissions: check the peer's uid instead.
        try:
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        except OSError:
            return None
        pid, uid, _ = struct.unpack("3i", creds)
        return pid if uid == os.getuid() else None

    def _admit(self, rank, peer):
        # Called by the protocol for a hello with the right secret; a reason refuses it.
        if self._admit_pid is None or getattr(peer, "pid", None) is None:
            return None
        if self._admit_pid(rank, peer.pid):
            return None
        return (f"rank {rank} cannot connect from process {peer.pid}: it is not the process "
                f"started as rank {rank}, nor a descendant of it")

    def _read(self, conn):
        # Before its hello, a connection gets no more buffer than one hello frame.
        if conn.rank is not None:
            want = 1 << 16
        else:
            want = _LEN.size + MAX_HELLO_BYTES - len(conn.inbuf)
        try:
            data = conn.sock.recv(max(1, want))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._to_drop.append(conn)
            return
        if conn.closing:
            return  # answered and about to be closed: nothing more is read from it
        conn.inbuf += data
        view = memoryview(conn.inbuf)
        pos = 0
        try:
            while len(view) - pos >= _LEN.size and not conn.closing:
                (n,) = _LEN.unpack_from(view, pos)
                limit = MAX_MESSAGE_BYTES if conn.rank is not None else MAX_HELLO_BYTES
                if n > limit:
                    raise _ProtocolError(
                        f"it announced a frame of {n} bytes, more than the {limit} accepted "
                        f"{'from a rank' if conn.rank is not None else 'before its hello'}")
                if len(view) - pos - _LEN.size < n:
                    break
                msg = _decode_frame(view[pos + _LEN.size:pos + _LEN.size + n])
                pos += _LEN.size + n
                if self._rdv.handle(conn, msg):
                    conn.closing = True
                    if not conn.outbuf:
                        self._to_drop.append(conn)
                if conn.rank is not None:
                    self._unauthenticated.pop(conn, None)
        except _ProtocolError as exc:
            print(f"[gexmk.bootstrap] dropping a client (rank {conn.rank}): {exc}", file=sys.stderr)
            self._to_drop.append(conn)
        except Exception:  # a bug must cost one connection, not the whole job's server
            print(f"[gexmk.bootstrap] dropping a client (rank {conn.rank}) after an internal error:",
                  file=sys.stderr)
            traceback.print_exc()
            self._to_drop.append(conn)
        finally:
            view.release()
        del conn.inbuf[:pos]

    def _send(self, conn, msg):
        if conn.sock.fileno() < 0:
            return  # already dropped
        # A result goes to every contributor as the same object: encode it once.
        if msg is not self._last_msg:
            self._last_msg, self._last_frame = msg, _frame(msg)
        conn.outbuf += self._last_frame
        if conn.rank is not None and conn.rank == self._home_rank:
            self._home = conn  # flushed at the end of the loop iteration, see _serve
        else:
            self._flush(conn)

    def _flush(self, conn):
        home = conn is self._home
        held = home and bool(self._backlog)
        if conn.outbuf and not held:
            try:
                n = conn.sock.send(conn.outbuf)
                del conn.outbuf[:n]
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                conn.outbuf.clear()
                self._backlog.discard(conn)
                self._to_drop.append(conn)
                return
        want = bool(conn.outbuf) and not held
        if want != conn.want_write:
            conn.want_write = want
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if want else 0)
            self._sel.modify(conn.sock, events, conn)
        if not home:
            if conn.outbuf:
                self._backlog.add(conn)
            else:
                self._backlog.discard(conn)
        if not conn.outbuf and conn.closing:
            self._to_drop.append(conn)

    def _drop(self, conn):
        self._unauthenticated.pop(conn, None)
        self._backlog.discard(conn)
        if conn is self._home:
            self._home = None
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            return  # already dropped
        conn.sock.close()
        if conn.rank is not None and not conn.said_bye and self._rdv.peers.get(conn.rank) is conn:
            self._lost_at.setdefault(conn.rank, time.monotonic())
        self._rdv.disconnected(conn)


# --------------------------------------------------------------------------------------------
# Client side.


class _Slot:
    """Waiting state of one key in this process (shared by its threads in that exchange)."""

    __slots__ = ("indices", "result", "error", "status")

    def __init__(self):
        self.indices = set()  # indices this process is waiting on
        self.result = None    # list[bytes] once complete
        self.error = None     # (kind, rank, text) on failure
        self.status = {}      # index -> missing indices, answer to a withdraw


class _SocketTransport:
    """Client connection to a :class:`RendezvousServer`, with one reader thread."""

    def __init__(self, sock, deliver, lost, description):
        self._sock = sock
        self._deliver = deliver
        self._lost = lost
        self._send_lock = threading.Lock()
        self._closing = False
        self.description = description
        self._reader = threading.Thread(target=self._read_loop, name="gexmk-bootstrap-reader",
                                        daemon=True)
        self._reader.start()

    def send(self, msg):
        frame = _frame(msg, MAX_MESSAGE_BYTES)  # the server would drop us for a larger one
        with self._send_lock:
            self._sock.sendall(frame)

    def close(self, goodbye: bool):
        self._closing = True
        if goodbye:
            try:
                self.send(("bye",))
                self._sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            # The server closes after the bye; let the reader see that EOF so that no
            # unread data makes close() reset the connection before the bye arrives.
            if threading.current_thread() is not self._reader:
                self._reader.join(timeout=2.0)
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        if threading.current_thread() is not self._reader:
            self._reader.join(timeout=2.0)
        self._sock.close()

    def _read_exact(self, n):
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = self._sock.recv_into(view[got:])
            if k == 0:
                raise EOFError
            got += k
        return buf

    def _read_loop(self):
        reason = "the rendezvous server closed the connection"
        try:
            while True:
                (n,) = _LEN.unpack(self._read_exact(_LEN.size))
                body = self._read_exact(n)
                self._deliver(_decode_frame(memoryview(body)))
        except EOFError:
            pass
        except (OSError, _ProtocolError) as exc:
            reason = f"connection to the rendezvous server failed: {exc}"
        if not self._closing:
            self._lost(reason)


class _LoopbackTransport:
    """Single-process job: the protocol runs in-process under a lock, no sockets."""

    description = "in-process"

    def __init__(self, deliver):
        self._lock = threading.Lock()
        self._peer = _Peer()
        self._rdv = _Rendezvous(1, lambda peer, msg: deliver(list(msg)))

    def send(self, msg):
        with self._lock:
            self._rdv.handle(self._peer, list(msg))

    def close(self, goodbye):
        pass


class Bootstrap:
    """This process's handle on the job: who is in it, and collectives to set it up.

    Create it with :func:`from_environment`.  Attributes (read-only):

    - ``rank``: job rank of this process, ``0 <= rank < size``.
    - ``size``: number of processes in the job.
    - ``pids``: list of the process id of every job rank.
    - ``nodes``: list of the node index of every job rank; equal indices mean the
      same host (hostname and boot id); numbered ``0..nnodes-1`` by first appearance.
    - ``kind``: ``"single"``, ``"launcher"`` or ``"mpi"``.
    - ``timeout``: default timeout of blocking calls, in seconds (GEXMK_TIMEOUT).

    The bootstrap owns one connection to the rendezvous server and one daemon
    reader thread; :meth:`close` (also a context manager exit) releases them and
    tells the server this rank leaves cleanly.  At interpreter exit an open
    bootstrap is closed the same way, unless the interpreter dies of an uncaught
    exception: that, like a signal or ``os._exit``, is reported to the others as
    the death of this rank.  Not fork-safe: a forked child must not use its
    parent's bootstrap.
    """

    def __init__(self, *, rank, size, kind, timeout, connect, token=None):
        # Internal: use from_environment().  ``connect(deliver, lost)`` returns a transport;
        # ``token`` is this rank's secret, which the server expects in the hello.
        self.rank = rank
        self.size = size
        self.kind = kind
        self.timeout = timeout
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
        self._server = None        # the server this process hosts (MPI rank 0), if any
        self._transport = connect(self._on_message, self._on_lost)
        try:
            try:
                self._transport.send(("hello", token, rank, size, os.getpid(), _node_name()))
            except OSError as exc:
                raise BootstrapError(f"lost the rendezvous server at "
                                     f"{self._transport.description} during set-up: {exc}") from exc
            with self._cond:
                if not self._cond.wait_for(
                        lambda: self.pids is not None or self._fatal or self._lost, timeout):
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
                self._transport.send(("contrib", key, members, index, payload))
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
            _lingering[self._server] = self.timeout
        # MPI rank 0's server keeps serving the others after this; see _from_mpi.

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
        # Without the server nothing can be exchanged; in MPI mode it lived in rank 0.
        err.rank = 0 if self.kind == "mpi" and self.rank != 0 else None
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
                        slot.result = msg[2]
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
            where = "the gexmk.run launcher" if self.kind == "launcher" else "MPI rank 0"
            self._lost = f"{reason} ({where} hosts it; it has probably died)"
            self._cond.notify_all()
            # In MPI mode the server lives in rank 0: losing it means rank 0 is gone.
            lost_rank = self.kind == "mpi" and self.rank != 0 and 0 not in self._dead
            if lost_rank:
                self._dead.append(0)
            callbacks = list(self._callbacks)
        if lost_rank and callbacks:
            self._notify([0], callbacks)

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


# --------------------------------------------------------------------------------------------
# Construction.


def _connect_socket(address: str, timeout: float):
    """Connect to ``address`` and return a ``connect(deliver, lost)`` transport factory."""
    family, target = _parse_address(address)
    deadline = time.monotonic() + min(timeout, CONNECT_TIMEOUT)
    while True:
        try:
            if family == socket.AF_UNIX:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    sock.settimeout(max(0.1, deadline - time.monotonic()))
                    sock.connect(target)
                except BaseException:
                    sock.close()
                    raise
            else:
                sock = socket.create_connection(target, timeout=max(0.1, deadline - time.monotonic()))
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            break
        except OSError as exc:
            # Refused: nobody listens (yet); anything else will not get better by retrying.
            if time.monotonic() >= deadline or not isinstance(exc, (ConnectionRefusedError,
                                                                     FileNotFoundError)):
                raise BootstrapError(
                    f"cannot reach the gexmk rendezvous server at {address!r}: {exc} (is the "
                    f"launcher or MPI rank 0 still running? GEXMK_BOOTSTRAP may be stale)") from exc
            time.sleep(0.05)
    sock.settimeout(None)
    return lambda deliver, lost: _SocketTransport(sock, deliver, lost, address)


def _single() -> Bootstrap:
    return Bootstrap(rank=0, size=1, kind="single", timeout=default_timeout(),
                     connect=lambda deliver, lost: _LoopbackTransport(deliver))


def _env_int(name):
    text = os.environ.get(name)
    try:
        return int(text)
    except (TypeError, ValueError):
        raise BootstrapError(f"GEXMK_BOOTSTRAP is set but {name} is {text!r}, not an integer; "
                             f"start the job with python -m gexmk.run") from None


def _from_launcher(address: str) -> Bootstrap:
    rank, size = _env_int("GEXMK_RANK"), _env_int("GEXMK_SIZE")
    if not 0 <= rank < size:
        raise BootstrapError(f"GEXMK_RANK={rank} is outside 0..GEXMK_SIZE-1 ({size - 1})")
    timeout = default_timeout()
    # The launcher gave this rank, and no other, its secret.
    token = os.environ.get("GEXMK_BOOTSTRAP_TOKEN")
    if not token:
        raise BootstrapError("GEXMK_BOOTSTRAP is set but GEXMK_BOOTSTRAP_TOKEN is not: the "
                             "rendezvous admits a rank only with the secret gexmk.run gave it; "
                             "start the job with python -m gexmk.run")
    return Bootstrap(rank=rank, size=size, kind="launcher", timeout=timeout,
                     connect=_connect_socket(address, timeout), token=token)


def _from_mpi(comm, force_tcp: bool = False) -> Bootstrap:
    """Bootstrap over an mpi4py communicator (collective over ``comm``).

    ``force_tcp`` uses TCP even when all ranks share a host (for tests).
    """
    timeout = default_timeout()
    comm = comm.Dup()  # keep our set-up traffic out of the caller's communicator
    try:
        hosts = comm.allgather(socket.gethostname())
        tcp = force_tcp or len(set(hosts)) > 1
        server = None
        infos = None
        if comm.Get_rank() == 0:
            size = comm.Get_size()
            try:
                server = RendezvousServer(size, tcp=tcp, stop_when_finished=True, home_rank=0)
                server.start()
                # Each rank gets its own secret, point to point: no rank learns another's.
                infos = [(server.address, server.token(r), None) for r in range(size)]
            except Exception as exc:  # the others must learn about it, not hang
                if server is not None:
                    server.close()
                    server = None
                infos = [(None, None, f"{type(exc).__name__}: {exc}")] * size
        address, token, error = comm.scatter(infos, root=0)
        if error:
            raise BootstrapError(f"MPI rank 0 could not start the rendezvous server: {error}")
        rank, size = comm.Get_rank(), comm.Get_size()
    finally:
        comm.Free()

    try:
        bootstrap = Bootstrap(rank=rank, size=size, kind="mpi", timeout=timeout,
                              connect=_connect_socket(address, timeout), token=token)
    except BaseException:
        if server is not None:
            server.close()
        raise
    bootstrap._server = server
    return bootstrap


def _mpi_launched() -> bool:
    return any(name in os.environ for name in MPI_ENVIRONMENT)


def from_environment(comm=None) -> Bootstrap:
    """Find this process's job and return its :class:`Bootstrap` (collective over the job).

    - ``comm`` given (an mpi4py communicator): MPI mode over ``comm``.
    - env GEXMK_BOOTSTRAP set (by ``python -m gexmk.run``): launcher mode, rank and
      size from GEXMK_RANK and GEXMK_SIZE.
    - env of an MPI launcher (PMI_RANK, PMIX_RANK, OMPI_COMM_WORLD_SIZE, ...) and
      mpi4py importable: MPI mode over ``MPI.COMM_WORLD``.
    - else: a single-process job.

    Blocks until every rank has arrived, at most GEXMK_TIMEOUT seconds (default
    300); raises :class:`~gexmk.errors.BootstrapError` when the job cannot be set up.
    """
    if comm is not None:
        return _from_mpi(comm)
    address = os.environ.get("GEXMK_BOOTSTRAP")
    if address:
        return _from_launcher(address)
    if _mpi_launched():
        try:
            from mpi4py import MPI
        except ImportError:
            warnings.warn("an MPI launcher environment was found but mpi4py is not importable; "
                          "this process runs as a single-process gexmk job", RuntimeWarning,
                          stacklevel=2)
        else:
            return _from_mpi(MPI.COMM_WORLD)
    return _single()
