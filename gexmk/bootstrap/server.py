"""The job's rendezvous server (:class:`RendezvousServer`): one thread serving a
listening socket, the launcher's or rank 0's."""

from __future__ import annotations

import atexit
import collections
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

from gexmk.bootstrap.protocol import _Peer, _Rendezvous
from gexmk.bootstrap.wire import (
    _LEN, HELLO_TIMEOUT, MAX_HELLO_BYTES, MAX_MESSAGE_BYTES, _decode_frame, _frame,
    _ProtocolError,
)
from gexmk.errors import ArgumentError, BootstrapError, RankError, StateError

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


def _tcp_listener(host: str, port: int = 0):
    """A listening TCP socket on ``host`` (address or name) and ``port`` (0: picked by the
    kernel)."""
    try:
        infos = socket.getaddrinfo(host, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0,
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
    raise BootstrapError(f"cannot listen on {host!r} port {port} (is it an address of this "
                         f"machine, in this network namespace, and the port free?): "
                         f"{'; '.join(errors)}")


class RendezvousServer:
    """The job's rendezvous server: a thread serving a listening socket.

    ``size`` is the number of ranks of the job.  With ``tcp=False`` (default) it
    listens on an abstract-namespace Unix socket (nothing on disk; only processes
    of the same user and network namespace may connect); with ``tcp=True`` on
    TCP, port chosen by the kernel: on all interfaces (address
    ``hostname:port``), or on ``host`` alone (an address or name of this
    machine; address ``host:port``); ``port`` fixes the port (a launcher that
    derives it from the job's identity).  :attr:`address` is the string clients
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
                 hello_timeout: float | None = None, admit=None, port: int = 0):
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
        if (host is not None or port) and not tcp:
            raise ArgumentError("host and port are only for a TCP server (tcp=True)")
        if not isinstance(port, int) or not 0 <= port <= 65535:
            raise ArgumentError(f"port must be an int in 0..65535 (0: any), got {port!r}")
        if tcp and host is not None:
            host = host.strip().strip("[]")
            self._listener = _tcp_listener(host, port)
            shown = f"[{host}]" if ":" in host else host
            self.address = f"{shown}:{self._listener.getsockname()[1]}"
        elif tcp:
            try:
                if socket.has_dualstack_ipv6():
                    self._listener = socket.create_server(("", port), family=socket.AF_INET6,
                                                          dualstack_ipv6=True, backlog=128)
                else:
                    self._listener = socket.create_server(("", port), backlog=128)
            except OSError as exc:
                raise BootstrapError(f"cannot listen on TCP port {port} of every interface: "
                                     f"{exc}") from exc
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

    def missing(self) -> list:
        """Ranks that have neither connected nor been seen to exit (a snapshot)."""
        return sorted(set(range(self.size)) - set(self._rdv.arrived))

    def abort(self, text: str) -> None:
        """Send every connected rank ``text`` as a fatal error, then :meth:`close`: the
        host (rank 0) gives up on the job, and says why instead of vanishing."""
        def run():
            for peer in list(self._rdv.peers.values()):
                self._send(peer, ("error", text))
        if self._thread is not None and not self._closed:
            self._call(run)
        self.close()

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

