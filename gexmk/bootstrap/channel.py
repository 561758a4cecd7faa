"""This process's connection to the rendezvous server: a socket with one reader
thread, or, in a job of one process, the protocol run in-process."""

from __future__ import annotations

import socket
import threading
import time

from gexmk.bootstrap.protocol import _Peer, _Rendezvous
from gexmk.bootstrap.wire import (
    _LEN, CONNECT_TIMEOUT, MAX_MESSAGE_BYTES, _decode_frame, _frame, _parse_address,
    _ProtocolError,
)
from gexmk.errors import BootstrapError

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


def _connect_socket(address: str, timeout: float, patience: float | None = None,
                    hint: str = "is the launcher or MPI rank 0 still running? GEXMK_BOOTSTRAP "
                                "may be stale"):
    """Connect to ``address`` and return a ``connect(deliver, lost)`` transport factory.

    A refused connection is retried for ``patience`` seconds (default
    :data:`CONNECT_TIMEOUT`; at most ``timeout``): long enough where the server
    listens before any client starts, longer where the address is known before
    its rank-0 host has started (Slurm).  ``hint`` ends the error's text.
    """
    family, target = _parse_address(address)
    patience = CONNECT_TIMEOUT if patience is None else patience
    deadline = time.monotonic() + min(timeout, patience)
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
                    f"cannot reach the gexmk rendezvous server at {address!r}: {exc} "
                    f"({hint})") from exc
            time.sleep(0.05)
    sock.settimeout(None)
    return lambda deliver, lost: _SocketTransport(sock, deliver, lost, address)
