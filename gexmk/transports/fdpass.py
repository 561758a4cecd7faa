"""Hand file descriptors to other processes of the node (pure Python, standard library only).

A device segment on the ``nbrhd`` path is a CUDA VMM allocation exported as POSIX
file descriptors; a peer on the same node maps it after importing those fds.  An
fd cannot be published like bytes, so the owner runs an :class:`FdServer` on an
abstract-namespace Unix socket and a peer asks it with :func:`fetch`; the fds
travel as SCM_RIGHTS after the server checked who asks (SO_PEERCRED).
``pidfd_getfd`` would need no server, but unprivileged containers refuse it.

Owner (one server per process, :func:`process_server`)::

    srv = fdpass.process_server()
    srv.offer("ep3:gen7", [fd], allowed_pids={peer_pid})  # keeps its own dup()s
    publish(srv.address)                                  # "@gexmk-fd-<pid>-<hex>"
    ...
    srv.withdraw("ep3:gen7")

Peer::

    fds = fdpass.fetch(address, "ep3:gen7", timeout=10.0)  # the caller closes them

Wire protocol, one request per connection, integers big-endian::

    client -> server  magic b"GXFD" | version u8 = 1 | key length u32 | key (UTF-8)
    server -> client  status u8 | fd count u16 | text length u16 | text (UTF-8)

The reply leaves in one ``sendmsg``; with status :data:`OK` the fds ride on it as
one SCM_RIGHTS message and the text is empty, with any other status there are no
fds and the text says why.  The server then closes the connection.  It reads the
key only if the announced length is 1..:data:`MAX_KEY_BYTES`, and drops a
connection that has not sent its whole request within ``request_timeout``.

Who may fetch: a process running as the server's (effective) uid, and, when the
offer names ``allowed_pids``, one of those pids, as the kernel reports them at
connect time.  Abstract sockets have no file permissions, so this check is the
only gate; a pid of another pid namespace reads as 0 and is never in
``allowed_pids``.

Must stay importable without gexmk's compiled extensions, like gexmk.bootstrap.
"""

from __future__ import annotations

import atexit
import math
import operator
import os
import secrets
import selectors
import socket
import struct
import threading
import time
import traceback
import warnings

from gexmk.errors import (
    ArgumentError,
    CommunicationError,
    PeerDeadError,
    SegmentError,
    StateError,
    TimeoutError,
)

__all__ = ["FdServer", "fetch", "process_server", "MAX_KEY_BYTES", "MAX_FDS", "REQUEST_TIMEOUT"]

#: Longest key, in UTF-8 bytes; the server reads no more than this from a client.
MAX_KEY_BYTES = 256

#: Most fds one key may carry: Linux's SCM_MAX_FD, the limit of one SCM_RIGHTS message.
MAX_FDS = 253

#: Seconds a connection may take to send its whole request before the server drops it.
REQUEST_TIMEOUT = 5.0

#: Connections the server holds at once; beyond that new ones wait in the listen
#: backlog until a slot frees (at most ``request_timeout`` later).
MAX_CONNECTIONS = 64

#: Reply statuses.
OK, NO_KEY, REFUSED, BAD_REQUEST = 0, 1, 2, 3

_MAGIC = b"GXFD"
_VERSION = 1
_REQUEST = struct.Struct("!4sBI")
_REPLY = struct.Struct("!BHH")
_PEERCRED = struct.Struct("3i")
_FD = struct.Struct("i")
_MAX_TEXT = 1024        # bytes of error text a reply may carry
_MAX_NAME = 107         # sun_path holds 108 bytes, the first one NUL for an abstract name
_JOIN_TIMEOUT = 5.0     # the server thread never blocks outside select(); this is a safety net


# --------------------------------------------------------------------------------------------
# Argument checks, shared by both ends.


def _key_bytes(key) -> bytes:
    if not isinstance(key, str):
        raise TypeError(f"key must be a str, got {type(key).__name__}")
    try:
        data = key.encode("utf-8")
    except UnicodeEncodeError:
        raise ArgumentError(f"key {key!r} is not valid Unicode (lone surrogate)") from None
    if not 1 <= len(data) <= MAX_KEY_BYTES:
        raise ArgumentError(f"key must be 1 to {MAX_KEY_BYTES} bytes of UTF-8, got {len(data)}")
    return data


def _int(value, what: str) -> int:
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an int, got {type(value).__name__}") from None


def _abstract_name(address) -> str:
    """``"@name"`` (what :attr:`FdServer.address` says) -> the socket name ``"\\0name"``."""
    if not isinstance(address, str):
        raise TypeError(f"address must be a str, got {type(address).__name__}")
    size = len(address.encode("utf-8", "replace"))
    if not address.startswith("@") or not 1 < size <= _MAX_NAME + 1:
        raise ArgumentError(f"address must be an fd server's address, '@' and a name of 1 to "
                            f"{_MAX_NAME} bytes (FdServer.address), got {address!r}")
    return "\0" + address[1:]


def _seconds(timeout) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds, got {type(timeout).__name__}")
    if not (timeout > 0 and math.isfinite(timeout)):
        raise ArgumentError(f"timeout must be a positive, finite number of seconds, got "
                            f"{timeout!r}")
    return float(timeout)


def _close_all(fds) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


# --------------------------------------------------------------------------------------------
# The server.


class _Offer:
    __slots__ = ("fds", "allowed")

    def __init__(self, fds, allowed):
        self.fds = fds            # tuple of the server's own dup()s
        self.allowed = allowed    # frozenset of pids, or None: any process of our uid


class _Conn:
    """A client connection while its request arrives."""

    __slots__ = ("sock", "deadline", "buf", "need", "key_len")

    def __init__(self, sock, deadline):
        self.sock = sock
        self.deadline = deadline
        self.buf = bytearray()
        self.need = _REQUEST.size   # bytes of the current part (header, then key)
        self.key_len = None


class FdServer:
    """Offers file descriptors, by key, to processes of this node that ask with :func:`fetch`.

    Listens on an abstract-namespace Unix socket from construction on; a daemon
    thread serves it, blocked in ``select`` between events (it never spins).
    :attr:`address` is the string to publish.  Each request is served by the
    one thread without ever blocking on a client: a connection that sends less
    than a whole request within ``request_timeout`` seconds, or announces a key
    longer than :data:`MAX_KEY_BYTES`, is dropped, and the others are served
    meanwhile.  At most ``max_connections`` are held at once.

    :meth:`offer`, :meth:`withdraw` and :meth:`close` may be called from any
    thread.  The server keeps its own ``dup()`` of every offered fd until the
    key is withdrawn or the server closed; the caller's fds stay the caller's.
    Usually one per process: see :func:`process_server`.
    """

    def __init__(self, *, request_timeout: float = REQUEST_TIMEOUT,
                 max_connections: int = MAX_CONNECTIONS):
        self._request_timeout = _seconds(request_timeout)
        self._max_connections = _int(max_connections, "max_connections")
        if self._max_connections < 1:
            raise ArgumentError(f"max_connections must be at least 1, got {max_connections}")
        self._pid = os.getpid()
        self._uid = os.geteuid()
        self._lock = threading.Lock()   # guards _offers and _closed
        self._offers = {}               # key -> _Offer
        self._closed = False
        name = f"gexmk-fd-{self._pid}-{secrets.token_hex(8)}"
        made = []
        try:
            self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            made.append(self._listener)
            self._listener.bind("\0" + name)
            self._listener.listen(self._max_connections)
            self._listener.setblocking(False)
            self._wake_r, self._wake_w = socket.socketpair()
            made += [self._wake_r, self._wake_w]
            self._wake_r.setblocking(False)
            self._wake_w.setblocking(False)
            # Made here, not in the thread: every resource exists when the constructor returns.
            self._sel = selectors.DefaultSelector()
            made.append(self._sel)
            self._sel.register(self._wake_r, selectors.EVENT_READ)
            self._thread = threading.Thread(target=self._serve, daemon=True,
                                            name=f"gexmk-fd-server-{name[-16:]}")
            self._thread.start()
        except BaseException as exc:  # a failed constructor leaves nothing behind
            for s in made:
                s.close()
            if isinstance(exc, OSError):
                raise CommunicationError(f"cannot serve fds on abstract socket @{name}: "
                                         f"{exc}") from exc
            raise
        self._address = "@" + name

    @property
    def address(self) -> str:
        """The name to publish, ``"@gexmk-fd-<pid>-<hex>"`` (``@`` stands for the
        leading NUL of an abstract socket name); :func:`fetch` takes it."""
        return self._address

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    def __repr__(self):
        state = "closed" if self._closed else f"{len(self._offers)} key(s)"
        return f"<FdServer {self._address} {state}>"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def offer(self, key: str, fds, allowed_pids=None) -> None:
        """Serve ``fds`` (a sequence of at most :data:`MAX_FDS` open fds) under ``key``.

        The server dup()s them now: the caller may close its own at once.
        ``allowed_pids`` (a set of pids, or None) limits who may fetch them;
        None lets any process of this uid.  Raises ``StateError`` when ``key``
        is already offered (withdraw it first) or the server is closed, and
        ``ArgumentError`` naming the first fd that is not open; nothing is
        offered then.
        """
        _key_bytes(key)
        if isinstance(fds, (str, bytes)) or not hasattr(fds, "__len__"):
            raise TypeError(f"fds must be a sequence of file descriptors, got {type(fds).__name__}")
        numbers = [_int(fd, f"fds[{i}]") for i, fd in enumerate(fds)]
        if len(numbers) > MAX_FDS:
            raise ArgumentError(f"one key carries at most {MAX_FDS} fds (SCM_MAX_FD), got "
                                f"{len(numbers)}")
        allowed = None
        if allowed_pids is not None:
            if isinstance(allowed_pids, (str, bytes)) or not hasattr(allowed_pids, "__iter__"):
                raise TypeError(f"allowed_pids must be a set of pids or None, got "
                                f"{type(allowed_pids).__name__}")
            allowed = frozenset(_int(p, "a pid in allowed_pids") for p in allowed_pids)
            bad = [p for p in allowed if p <= 0]
            if bad:
                raise ArgumentError(f"allowed_pids holds {bad[0]}; pids are positive")
        dups = []
        try:
            for i, fd in enumerate(numbers):
                try:
                    dups.append(os.dup(fd))
                except OSError as exc:
                    raise ArgumentError(f"fds[{i}] = {fd} is not an open file descriptor of this "
                                        f"process: {exc.strerror}") from None
            with self._lock:
                if self._closed:
                    raise StateError(f"cannot offer {key!r}: the fd server {self._address} is "
                                     f"closed")
                if key in self._offers:
                    raise StateError(f"key {key!r} is already offered by {self._address}; withdraw "
                                     f"it first")
                self._offers[key] = _Offer(tuple(dups), allowed)
        except BaseException:
            _close_all(dups)
            raise

    def withdraw(self, key: str) -> bool:
        """Stop serving ``key`` and close the server's dups of its fds.

        Returns whether ``key`` was offered.  A fetch already answered keeps
        the fds it received; a later one gets ``SegmentError``.
        """
        _key_bytes(key)
        with self._lock:
            offer = self._offers.pop(key, None)
        if offer is None:
            return False
        _close_all(offer.fds)
        return True

    def close(self) -> None:
        """Stop the thread, close the socket and every offered dup.  Idempotent.

        Fetches that arrive later fail with ``PeerDeadError``.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            offers, self._offers = self._offers, {}
        # Withdrawn under the lock, which the server thread holds while it sends: no fd
        # closed below can be in flight.
        for offer in offers.values():
            _close_all(offer.fds)
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass  # the thread already ended and closed it
        if self._thread is not threading.current_thread():
            self._thread.join(_JOIN_TIMEOUT)
            if self._thread.is_alive():  # leak its sockets rather than close them under it
                warnings.warn(f"the thread of fd server {self._address} did not stop within "
                              f"{_JOIN_TIMEOUT:g} s", ResourceWarning, stacklevel=2)

    # -- server thread --------------------------------------------------------------------

    def _serve(self):
        sel = self._sel
        conns = {}              # socket -> _Conn
        listening = False
        resume_at = 0.0         # accept() failed (EMFILE...): retry no sooner than this
        try:
            while True:
                now = time.monotonic()
                want = len(conns) < self._max_connections and now >= resume_at
                if want != listening:
                    if want:
                        sel.register(self._listener, selectors.EVENT_READ)
                    else:
                        sel.unregister(self._listener)
                    listening = want
                due = [c.deadline for c in conns.values()]
                if not listening and len(conns) < self._max_connections:
                    due.append(resume_at)
                timeout = max(0.0, min(due) - now) if due else None
                for key, _ in sel.select(timeout):
                    sock = key.fileobj
                    if sock is self._wake_r:
                        return
                    if sock is self._listener:
                        if not self._accept(sel, conns):
                            resume_at = time.monotonic() + 0.1
                    else:
                        conn = conns[sock]
                        try:
                            self._read(sel, conns, conn)
                        except Exception:  # a bug: lose this connection, not the server
                            traceback.print_exc()
                            if sock in conns:
                                self._drop(sel, conns, conn)
                now = time.monotonic()
                for conn in [c for c in conns.values() if c.deadline <= now]:
                    self._drop(sel, conns, conn)  # silent or too slow
        except Exception:  # a bug here must not leave fetchers waiting for their timeout
            traceback.print_exc()
        finally:
            for sock in conns:
                sock.close()
            sel.close()
            # From now on a fetch is refused at connect: PeerDeadError at once.
            self._listener.close()
            self._wake_r.close()
            self._wake_w.close()

    def _accept(self, sel, conns) -> bool:
        """Take pending connections while there is room; False if accept() failed."""
        while len(conns) < self._max_connections:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return True
            except OSError:
                return False  # e.g. EMFILE: leave the rest in the backlog for a while
            sock.setblocking(False)
            conn = _Conn(sock, time.monotonic() + self._request_timeout)
            conns[sock] = conn
            sel.register(sock, selectors.EVENT_READ)
        return True

    def _drop(self, sel, conns, conn):
        del conns[conn.sock]
        sel.unregister(conn.sock)
        conn.sock.close()

    def _read(self, sel, conns, conn):
        try:
            data = conn.sock.recv(conn.need - len(conn.buf))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(sel, conns, conn)
            return
        conn.buf += data
        if len(conn.buf) < conn.need:
            return
        if conn.key_len is None:
            magic, version, length = _REQUEST.unpack(conn.buf)
            why = None
            if magic != _MAGIC:
                why = "not a gexmk fd request (bad magic)"
            elif version != _VERSION:
                why = f"protocol version {version}; this server speaks {_VERSION}"
            elif not 1 <= length <= MAX_KEY_BYTES:
                why = f"a key of {length} bytes; keys have 1 to {MAX_KEY_BYTES}"
            if why is None:
                conn.key_len = conn.need = length
                conn.buf = bytearray()
                return
            self._reply(conn.sock, BAD_REQUEST, why)  # and never read what follows
        else:
            self._answer(conn.sock, bytes(conn.buf))
        self._drop(sel, conns, conn)

    def _answer(self, sock, key_bytes):
        try:
            key = key_bytes.decode("utf-8")
        except UnicodeDecodeError:
            self._reply(sock, BAD_REQUEST, "the key is not UTF-8")
            return
        try:
            pid, uid, _ = _PEERCRED.unpack(
                sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
        except OSError as exc:
            self._reply(sock, REFUSED, f"cannot read the peer's credentials: {exc}")
            return
        # Same answer for a stranger whether or not the key exists.
        if uid != self._uid:
            self._reply(sock, REFUSED, f"pid {pid} runs as uid {uid}; the fd server of pid "
                                       f"{self._pid} serves uid {self._uid} only")
            return
        with self._lock:  # held while sending: withdraw()/close() cannot close these fds meanwhile
            offer = self._offers.get(key)
            if offer is None:
                self._reply(sock, NO_KEY, f"pid {self._pid} offers nothing under key {key!r} "
                                          f"(never offered, or withdrawn)")
            elif offer.allowed is not None and pid not in offer.allowed:
                shown = sorted(offer.allowed)
                listed = ", ".join(map(str, shown[:8])) + (", ..." if len(shown) > 8 else "")
                self._reply(sock, REFUSED, f"pid {pid} is not allowed to fetch key {key!r} of "
                                           f"pid {self._pid} (allowed pids: {listed or 'none'})")
            else:
                self._reply(sock, OK, "", offer.fds)

    @staticmethod
    def _reply(sock, status, text, fds=()):
        body = text.encode("utf-8")[:_MAX_TEXT]
        data = _REPLY.pack(status, len(fds), len(body)) + body
        try:
            # A fresh socket's buffer takes this small reply whole: it never blocks.
            if fds:
                socket.send_fds(sock, [data], list(fds))
            else:
                sock.send(data)
        except OSError:
            pass  # the client went away; nothing to tell it


# --------------------------------------------------------------------------------------------
# The client.


def fetch(address: str, key: str, timeout: float) -> list[int]:
    """Ask the fd server at ``address`` for the fds it offers under ``key``.

    Returns new fds (close-on-exec) in the order they were offered; the caller
    owns them and must close them.  Waits at most ``timeout`` seconds in all.
    Raises ``SegmentError`` when the server offers no such key or refuses this
    process (its text says which), ``PeerDeadError`` when nothing listens at
    ``address`` (its process exited or closed the server) or the server hung
    up, ``TimeoutError`` when no answer came in time, and
    ``CommunicationError`` for a reply this protocol does not allow.  No fd is
    left open on any failure.
    """
    target = _abstract_name(address)
    key_data = _key_bytes(key)
    timeout = _seconds(timeout)
    deadline = time.monotonic() + timeout
    request = _REQUEST.pack(_MAGIC, _VERSION, len(key_data)) + key_data
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError as exc:  # EMFILE and the like
        raise CommunicationError(f"cannot fetch {key!r}: no socket: {exc}") from exc
    with sock:
        try:
            _connect(sock, target, deadline)
            _until(sock, deadline)
            sock.sendall(request)
            return _receive(sock, address, deadline)
        except socket.timeout:  # the builtin TimeoutError, which ours derives from
            raise TimeoutError(f"the fd server at {address!r} did not answer a request for "
                               f"{key!r} within {timeout:g} s") from None
        except ConnectionRefusedError:
            raise PeerDeadError(f"nothing listens at {address!r}: the process that published it "
                                f"exited or closed its fd server") from None
        except (ConnectionResetError, BrokenPipeError):
            raise PeerDeadError(f"the fd server at {address!r} hung up before answering "
                                f"{key!r}") from None
        except OSError as exc:
            raise CommunicationError(f"cannot fetch {key!r} from the fd server at {address!r}: "
                                     f"{exc}") from exc


def _until(sock, deadline):
    left = deadline - time.monotonic()
    if left <= 0:
        raise socket.timeout("deadline passed")
    sock.settimeout(left)


def _connect(sock, target, deadline):
    while True:
        _until(sock, deadline)
        try:
            sock.connect(target)
            return
        except (BlockingIOError, InterruptedError):
            time.sleep(0.01)  # EAGAIN: the server's backlog is full; it frees within seconds


def _receive(sock, address, deadline) -> list[int]:
    fds = []
    try:
        _until(sock, deadline)
        # Not socket.recv_fds: before Python 3.13 it drops its flags argument, and the fds
        # must arrive close-on-exec (a child started meanwhile must not inherit them).
        data, ancillary, flags, _ = sock.recvmsg(_REPLY.size + _MAX_TEXT,
                                                 socket.CMSG_SPACE(MAX_FDS * _FD.size),
                                                 socket.MSG_CMSG_CLOEXEC)
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                whole = len(payload) - len(payload) % _FD.size
                fds.extend(fd for (fd,) in _FD.iter_unpack(payload[:whole]))
        buf = bytearray(data)
        if not buf:
            raise PeerDeadError(f"the fd server at {address!r} closed the connection without "
                                f"answering")
        if flags & socket.MSG_CTRUNC:
            raise CommunicationError(f"the fd server at {address!r} sent more than {MAX_FDS} fds "
                                     f"or a control message this protocol does not use")
        _read_to(sock, buf, _REPLY.size, address, deadline)
        status, count, length = _REPLY.unpack_from(buf)
        _read_to(sock, buf, _REPLY.size + length, address, deadline)
        text = buf[_REPLY.size:_REPLY.size + length].decode("utf-8", "replace")
        if status == OK:
            if count != len(fds) or length:
                raise CommunicationError(f"the fd server at {address!r} announced {count} fds "
                                         f"and sent {len(fds)}")
            received, fds = fds, []
            return received
        if fds:
            raise CommunicationError(f"the fd server at {address!r} sent fds with a refusal "
                                     f"(status {status}: {text})")
        if status in (NO_KEY, REFUSED):
            raise SegmentError(f"fd server {address}: {text}")
        if status == BAD_REQUEST:
            raise CommunicationError(f"the fd server at {address!r} rejected the request: {text}")
        raise CommunicationError(f"the fd server at {address!r} answered with unknown status "
                                 f"{status}: {text}")
    finally:
        _close_all(fds)  # empty unless the fds are not handed to the caller


def _read_to(sock, buf, size, address, deadline):
    while len(buf) < size:
        _until(sock, deadline)
        data = sock.recv(size - len(buf))
        if not data:
            raise PeerDeadError(f"the fd server at {address!r} hung up in the middle of its answer")
        buf += data


# --------------------------------------------------------------------------------------------
# One server per process.

_process_server = None
_process_lock = threading.Lock()


def process_server() -> FdServer:
    """This process's :class:`FdServer`, started on first use and closed at exit.

    Thread-safe.  A new one is started if the previous one was closed (its
    address changes) or belongs to the parent of a forked process.
    """
    global _process_server
    with _process_lock:
        srv = _process_server
        if srv is None or srv.closed or srv._pid != os.getpid():
            if srv is None:
                atexit.register(_close_process_server)
            srv = _process_server = FdServer()
        return srv


def _close_process_server():
    srv = _process_server
    if srv is not None and srv._pid == os.getpid():
        srv.close()
