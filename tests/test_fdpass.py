"""Passing fds between processes of one node (gexmk.transports.fdpass).

No GPU: memfds and pipes stand in for exported VMM allocations.  The peer is a
real process started with multiprocessing's spawn context (as GPU processes
are), driven over a Pipe by :class:`Child`; it reports exceptions by type name
and text.  Most tests also check that neither process is left with an fd it
did not have before.
"""
import mmap
import multiprocessing
import os
import socket
import struct
import threading
import time

import pytest

from gexmk.errors import (ArgumentError, CommunicationError, PeerDeadError, SegmentError,
                          StateError, TimeoutError)
from gexmk.transports import fdpass

pytestmark = pytest.mark.timeout(60)

CALL_TIMEOUT = 20.0


def nfds() -> int:
    """Open fds of this process (the listing's own fd counts both times)."""
    return len(os.listdir("/proc/self/fd"))


def settled_nfds(expected: int, within: float = 2.0) -> int:
    """:func:`nfds` once it equals ``expected``, or after ``within`` seconds: a server
    thread closes a connection just after the client has its answer."""
    deadline = time.monotonic() + within
    while nfds() != expected and time.monotonic() < deadline:
        time.sleep(0.01)
    return nfds()


def server_threads():
    return [t for t in threading.enumerate() if t.name.startswith("gexmk-fd-server")]


def memfd(name: str, data: bytes, size: int = 4096) -> int:
    fd = os.memfd_create(name)
    os.ftruncate(fd, size)
    os.pwrite(fd, data, 0)
    return fd


# --------------------------------------------------------------------------------------------
# The peer process.


def _fetch_rw(address, key, n, reply, offset):
    """Fetch, read ``n`` bytes at 0 of each fd, write ``reply`` at ``offset``, close."""
    fds = fdpass.fetch(address, key, 5.0)
    try:
        assert not any(os.get_inheritable(fd) for fd in fds)  # close-on-exec
        data = [os.pread(fd, n, 0) for fd in fds]
        for fd in fds:
            os.pwrite(fd, reply, offset)
        return data
    finally:
        for fd in fds:
            os.close(fd)


def _fetch_mmap(address, key, n, reply, offset):
    """Fetch one fd, map it (as a VMM import would) and read and write through the mapping."""
    (fd,) = fdpass.fetch(address, key, 5.0)
    try:
        with mmap.mmap(fd, 4096) as m:
            data = m[:n]
            m[offset:offset + len(reply)] = reply
        return data
    finally:
        os.close(fd)


def _fetch_pipe(address, key, n):
    (fd,) = fdpass.fetch(address, key, 5.0)
    try:
        return os.read(fd, n)
    finally:
        os.close(fd)


def _fetch(address, key, timeout=5.0):
    fds = fdpass.fetch(address, key, timeout)
    for fd in fds:
        os.close(fd)
    return len(fds)


def _fetch_many(address, keys, threads, rounds):
    """``threads`` threads each fetch every key ``rounds`` times and check its content."""
    errors = []

    def run():
        try:
            for _ in range(rounds):
                for key, expected in keys.items():
                    (fd,) = fdpass.fetch(address, key, 10.0)
                    try:
                        got = os.pread(fd, len(expected), 0)
                    finally:
                        os.close(fd)
                    assert got == expected, (key, got)
        except BaseException as e:  # reported to the test
            errors.append(f"{type(e).__name__}: {e}")

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if errors:
        raise AssertionError(errors[0])
    return threads * rounds * len(keys)


_child_servers = []


def _serve(data):
    """Start an fd server here and offer a memfd holding ``data`` as "seg"."""
    srv = fdpass.FdServer()
    fd = memfd("child-seg", data)
    srv.offer("seg", [fd])
    os.close(fd)
    _child_servers.append(srv)
    return srv.address


def _drop_privileges():
    os.setgroups([])
    os.setresgid(65534, 65534, 65534)
    os.setresuid(65534, 65534, 65534)
    return os.geteuid()


_OPS = {"nfds": nfds, "fetch_rw": _fetch_rw, "fetch_mmap": _fetch_mmap, "fetch_pipe": _fetch_pipe,
        "fetch": _fetch, "fetch_many": _fetch_many, "serve": _serve,
        "drop_privileges": _drop_privileges}


def _child_main(conn):
    while True:
        op, args = conn.recv()
        if op == "exit":
            for srv in _child_servers:
                srv.close()
            conn.send(("ok", None))
            return
        try:
            conn.send(("ok", _OPS[op](*args)))
        except BaseException as e:
            conn.send(("raised", type(e).__name__, str(e)))


class ChildRaised(Exception):
    """The child's operation raised; ``name`` and ``text`` of its exception."""

    def __init__(self, name, text):
        super().__init__(f"{name}: {text}")
        self.name = name
        self.text = text


class Child:
    """A spawned peer process that runs one operation of :data:`_OPS` per :meth:`call`."""

    def __init__(self):
        ctx = multiprocessing.get_context("spawn")
        self.conn, theirs = ctx.Pipe()
        self.proc = ctx.Process(target=_child_main, args=(theirs,), daemon=True)
        self.proc.start()
        theirs.close()
        self.pid = self.proc.pid

    def call(self, op, *args, timeout=CALL_TIMEOUT):
        self.conn.send((op, args))
        if not self.conn.poll(timeout):
            raise AssertionError(f"the child did not finish {op} within {timeout} s")
        reply = self.conn.recv()
        if reply[0] == "ok":
            return reply[1]
        raise ChildRaised(reply[1], reply[2])

    def expect(self, exc, op, *args):
        """Run ``op`` and return the text of the exception it must raise, of type ``exc``."""
        with pytest.raises(ChildRaised) as info:
            self.call(op, *args)
        assert info.value.name == exc.__name__, info.value
        return info.value.text

    def kill(self):
        self.proc.kill()
        self.proc.join(10)

    def close(self):
        if self.proc.is_alive():
            try:
                self.call("exit", timeout=10)
            except (AssertionError, OSError, EOFError):
                pass
            self.proc.join(10)
            if self.proc.is_alive():
                self.kill()
        self.proc.close()
        self.conn.close()


@pytest.fixture
def child():
    c = Child()
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def server():
    srv = fdpass.FdServer()
    try:
        yield srv
    finally:
        srv.close()
    assert not server_threads()


# --------------------------------------------------------------------------------------------
# Tests.


def test_peer_reads_and_writes_the_memory_the_owner_offered(child):
    before = nfds()
    with fdpass.FdServer() as srv:
        a = memfd("seg-a", b"owner wrote A")
        b = memfd("seg-b", b"owner wrote B")
        srv.offer("ep0:gen1", [a, b])
        os.close(b)  # the server keeps its own dup
        child_before = child.call("nfds")
        data = child.call("fetch_rw", srv.address, "ep0:gen1", 13, b"peer wrote", 100)
        assert data == [b"owner wrote A", b"owner wrote B"]
        assert os.pread(a, 10, 100) == b"peer wrote"  # same file, not a copy
        assert child.call("nfds") == child_before
        os.close(a)
    assert settled_nfds(before) == before


def test_peer_maps_the_offered_memory(server, child):
    fd = memfd("seg", b"mapped by the owner")
    try:
        with mmap.mmap(fd, 4096) as mine:
            server.offer("ep1:gen1", [fd])
            assert child.call("fetch_mmap", server.address, "ep1:gen1", 19, b"and the peer", 256) \
                == b"mapped by the owner"
            assert mine[256:268] == b"and the peer"
    finally:
        os.close(fd)


def test_peer_reads_from_an_offered_pipe(server, child):
    r, w = os.pipe()
    try:
        server.offer("pipe", [r])
        os.close(r)
        os.write(w, b"through the pipe")
        assert child.call("fetch_pipe", server.address, "pipe", 16) == b"through the pipe"
    finally:
        os.close(w)


def test_unknown_key_is_a_segment_error(server, child):
    before = child.call("nfds")
    text = child.expect(SegmentError, "fetch", server.address, "ep9:gen9")
    assert "'ep9:gen9'" in text and "offers nothing" in text
    assert child.call("nfds") == before


def test_a_pid_not_allowed_is_refused(server, child):
    fd = memfd("seg", b"x")
    try:
        server.offer("parent-only", [fd], allowed_pids={os.getpid()})
        server.offer("child-only", [fd], allowed_pids={child.pid})
    finally:
        os.close(fd)
    before = child.call("nfds")
    text = child.expect(SegmentError, "fetch", server.address, "parent-only")
    assert f"pid {child.pid} is not allowed" in text and str(os.getpid()) in text
    assert child.call("fetch", server.address, "child-only") == 1
    assert child.call("nfds") == before
    with pytest.raises(SegmentError, match=f"pid {os.getpid()} is not allowed"):
        fdpass.fetch(server.address, "child-only", 5.0)
    (mine,) = fdpass.fetch(server.address, "parent-only", 5.0)
    os.close(mine)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the peer as another uid")
def test_another_uid_is_refused(server, child):
    fd = memfd("seg", b"x")
    server.offer("any-pid", [fd])  # allowed_pids=None still means: this uid only
    os.close(fd)
    assert child.call("drop_privileges") == 65534
    text = child.expect(SegmentError, "fetch", server.address, "any-pid")
    assert "uid 65534" in text and f"uid {os.geteuid()} only" in text


def test_withdrawn_key_is_a_segment_error(server, child):
    fd = memfd("seg", b"before withdraw")
    server.offer("ep0:gen2", [fd])
    os.close(fd)
    assert child.call("fetch", server.address, "ep0:gen2") == 1
    (kept,) = fdpass.fetch(server.address, "ep0:gen2", 5.0)
    assert server.withdraw("ep0:gen2") is True
    assert server.withdraw("ep0:gen2") is False
    text = child.expect(SegmentError, "fetch", server.address, "ep0:gen2")
    assert "withdrawn" in text
    assert os.pread(kept, 15, 0) == b"before withdraw"  # fetched fds outlive the offer
    os.close(kept)
    fd = memfd("seg", b"offered again")
    server.offer("ep0:gen2", [fd])  # a withdrawn key may be offered anew
    os.close(fd)
    assert child.call("fetch_rw", server.address, "ep0:gen2", 13, b"", 0) == [b"offered again"]


def test_closed_server_is_peer_dead(child):
    srv = fdpass.FdServer()
    fd = memfd("seg", b"x")
    srv.offer("k", [fd])
    os.close(fd)
    srv.close()
    text = child.expect(PeerDeadError, "fetch", srv.address, "k")
    assert srv.address in text


def test_dead_owner_is_peer_dead(child):
    before = nfds()
    address = child.call("serve", b"child memory")
    (fd,) = fdpass.fetch(address, "seg", 5.0)
    assert os.pread(fd, 12, 0) == b"child memory"
    child.kill()
    assert os.pread(fd, 12, 0) == b"child memory"  # the memory outlives its owner
    os.close(fd)
    with pytest.raises(PeerDeadError, match=address):
        fdpass.fetch(address, "seg", 5.0)
    assert settled_nfds(before) == before


def test_a_silent_client_does_not_block_others(child):
    with fdpass.FdServer(request_timeout=2.0) as srv:
        fd = memfd("seg", b"served")
        srv.offer("k", [fd])
        os.close(fd)
        target = "\0" + srv.address[1:]
        with socket.socket(socket.AF_UNIX) as silent, socket.socket(socket.AF_UNIX) as slow:
            silent.connect(target)
            slow.connect(target)
            slow.sendall(b"GXF")  # part of a header, then nothing
            started = time.monotonic()
            assert child.call("fetch", srv.address, "k", 1.5) == 1
            assert time.monotonic() - started < 1.5
            silent.settimeout(5.0)
            assert silent.recv(1) == b""  # dropped after request_timeout, without a reply
            assert 1.5 < time.monotonic() - started < 4.0
            slow.settimeout(5.0)
            assert slow.recv(1) == b""


def test_a_full_server_serves_the_backlog_when_a_slot_frees(child):
    with fdpass.FdServer(request_timeout=1.0, max_connections=1) as srv:
        fd = memfd("seg", b"served")
        srv.offer("k", [fd])
        os.close(fd)
        with socket.socket(socket.AF_UNIX) as silent:
            silent.connect("\0" + srv.address[1:])  # takes the only slot
            started = time.monotonic()
            assert child.call("fetch", srv.address, "k", 8.0) == 1  # waited in the backlog
            assert 0.5 < time.monotonic() - started < 5.0


def test_the_server_thread_sleeps_while_waiting():
    with fdpass.FdServer(request_timeout=30.0) as srv, socket.socket(socket.AF_UNIX) as silent:
        silent.connect("\0" + srv.address[1:])  # a deadline pending, nothing to read
        cpu = time.process_time()
        time.sleep(1.0)
        assert time.process_time() - cpu < 0.2


def _raw_request(address, header):
    """Send ``header`` (and nothing else); return the socket, still open."""
    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(5.0)
    sock.connect("\0" + address[1:])
    sock.sendall(header)
    return sock


def _raw_reply(sock):
    data = b""
    while True:
        try:
            chunk = sock.recv(4096)
        except ConnectionResetError:  # the server closed with our surplus bytes unread
            break
        if not chunk:
            break
        data += chunk
    status, count, length = struct.unpack_from("!BHH", data)
    return status, count, data[5:5 + length].decode()


def test_a_huge_length_prefix_is_dropped_unread():
    with fdpass.FdServer(request_timeout=30.0) as srv:
        fd = memfd("seg", b"x")
        srv.offer("k", [fd])
        os.close(fd)
        started = time.monotonic()
        with _raw_request(srv.address, struct.pack("!4sBI", b"GXFD", 1, 0xFFFFFFFF)) as sock:
            status, count, text = _raw_reply(sock)  # EOF follows the reply at once
            assert time.monotonic() - started < 5.0  # not after request_timeout
            assert (status, count) == (fdpass.BAD_REQUEST, 0)
            assert "4294967295 bytes" in text and f"1 to {fdpass.MAX_KEY_BYTES}" in text
            with pytest.raises((BrokenPipeError, ConnectionResetError)):
                for _ in range(64):  # the server reads none of it
                    sock.sendall(bytes(1 << 16))
        with _raw_request(srv.address, b"GET / HTTP/1.0\r\n\r\n") as sock:
            assert _raw_reply(sock)[0] == fdpass.BAD_REQUEST
        with _raw_request(srv.address, struct.pack("!4sBI", b"GXFD", 9, 1) + b"k") as sock:
            status, _, text = _raw_reply(sock)
            assert status == fdpass.BAD_REQUEST and "version 9" in text
        fds = fdpass.fetch(srv.address, "k", 5.0)  # still serving
        assert len(fds) == 1
        os.close(fds[0])


def test_no_answer_is_a_timeout():
    name = f"gexmk-fd-test-{os.getpid()}-mute"
    with socket.socket(socket.AF_UNIX) as mute:  # listens, never accepts
        mute.bind("\0" + name)
        mute.listen(4)
        before = nfds()
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="within 0.5 s") as info:
            fdpass.fetch("@" + name, "k", 0.5)
        assert 0.4 < time.monotonic() - started < 3.0
        assert isinstance(info.value, socket.timeout)  # also the builtin TimeoutError
        assert settled_nfds(before) == before


def _fake_server(name, reply, fds):
    """Serve one connection: read its request, answer ``reply`` with ``fds`` attached."""
    listener = socket.socket(socket.AF_UNIX)
    listener.bind("\0" + name)
    listener.listen(1)
    listener.settimeout(10.0)

    def run():
        with listener:
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(5.0)
                conn.recv(4096)
                socket.send_fds(conn, [reply], fds)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.mark.parametrize("status, count, text", [(fdpass.OK, 3, b""),          # fds missing
                                                 (fdpass.NO_KEY, 0, b"no")])  # fds with a refusal
def test_a_malformed_reply_leaks_no_fd(status, count, text):
    fd = memfd("seg", b"x")
    before = nfds()
    name = f"gexmk-fd-test-{os.getpid()}-liar"
    thread = _fake_server(name, struct.pack("!BHH", status, count, len(text)) + text, [fd])
    try:
        with pytest.raises(CommunicationError) as info:
            fdpass.fetch("@" + name, "k", 5.0)
        assert not isinstance(info.value, (SegmentError, PeerDeadError))
    finally:
        thread.join(10)
    assert settled_nfds(before) == before
    os.close(fd)


def test_concurrent_fetches_offers_and_withdrawals(server, child):
    keys = {}
    for i in range(6):
        fd = memfd(f"seg{i}", f"content of key {i}".encode())
        keys[f"ep0:seg{i}"] = f"content of key {i}".encode()
        server.offer(f"ep0:seg{i}", [fd])
        os.close(fd)
    stop = threading.Event()
    churned = []

    def churn():  # offers and withdraws another key from several threads meanwhile
        fd = memfd("churn", b"c")
        try:
            while not stop.is_set():
                key = f"churn:{threading.get_ident()}"
                server.offer(key, [fd])
                assert server.withdraw(key)
                churned.append(1)
        finally:
            os.close(fd)

    before = nfds()
    churners = [threading.Thread(target=churn) for _ in range(2)]
    for t in churners:
        t.start()
    try:
        child_before = child.call("nfds")
        assert child.call("fetch_many", server.address, keys, 8, 10) == 8 * 10 * 6
        assert child.call("nfds") == child_before
        local = fdpass.fetch(server.address, "ep0:seg3", 5.0)
        assert os.pread(local[0], 16, 0) == b"content of key 3"
        os.close(local[0])
    finally:
        stop.set()
        for t in churners:
            t.join(10)
    assert churned
    assert settled_nfds(before) == before


def test_no_fd_is_left_behind_in_either_process(child):
    before = nfds()
    child_before = child.call("nfds")
    srv = fdpass.FdServer()
    fds = [memfd(f"seg{i}", b"x") for i in range(3)]
    srv.offer("all", fds)
    srv.offer("mine", fds[:1], allowed_pids={os.getpid()})
    srv.offer("gone", fds[1:])
    srv.withdraw("gone")
    for fd in fds:
        os.close(fd)
    for _ in range(5):
        assert child.call("fetch", srv.address, "all") == 3
        child.expect(SegmentError, "fetch", srv.address, "mine")
        child.expect(SegmentError, "fetch", srv.address, "gone")
        child.expect(SegmentError, "fetch", srv.address, "never")
    assert child.call("nfds") == child_before
    srv.close()
    child.expect(PeerDeadError, "fetch", srv.address, "all")
    assert child.call("nfds") == child_before
    assert settled_nfds(before) == before


def test_close_is_idempotent_and_stops_the_thread():
    before = nfds()
    srv = fdpass.FdServer()
    assert len(server_threads()) == 1
    fd = memfd("seg", b"x")
    srv.offer("k", [fd])
    os.close(fd)
    srv.close()
    srv.close()
    assert srv.closed and not server_threads()
    assert settled_nfds(before) == before  # socket, wake-up pair and the offered dup are closed
    with pytest.raises(StateError, match="closed"):
        srv.offer("k2", [0])
    assert srv.withdraw("k") is False
    with socket.socket(socket.AF_UNIX) as sock, pytest.raises(ConnectionRefusedError):
        sock.connect("\0" + srv.address[1:])
    with fdpass.FdServer() as other:
        assert other.address != srv.address
    assert other.closed and not server_threads()


def test_offer_and_fetch_check_their_arguments(server):
    before = nfds()
    with pytest.raises(ArgumentError, match=r"fds\[1\] = 1000000 is not an open"):
        server.offer("k", [0, 1_000_000])
    assert settled_nfds(before) == before  # the dup of fd 0 was closed again
    with pytest.raises(SegmentError):  # and nothing was offered
        fdpass.fetch(server.address, "k", 5.0)
    with pytest.raises(TypeError, match="key must be a str"):
        server.offer(b"k", [0])
    with pytest.raises(ArgumentError, match="1 to 256 bytes"):
        server.offer("k" * 257, [0])
    with pytest.raises(ArgumentError, match="1 to 256 bytes"):
        server.offer("", [0])
    with pytest.raises(TypeError, match=r"fds\[0\] must be an int"):
        server.offer("k", [1.5])
    with pytest.raises(TypeError, match="sequence"):
        server.offer("k", 0)
    with pytest.raises(ArgumentError, match="at most 253"):
        server.offer("k", [0] * 254)
    with pytest.raises(ArgumentError, match="pids are positive"):
        server.offer("k", [0], allowed_pids={0})
    with pytest.raises(TypeError, match="allowed_pids must be a set"):
        server.offer("k", [0], allowed_pids=os.getpid())
    server.offer("k", [0])
    with pytest.raises(StateError, match="already offered"):
        server.offer("k", [0])
    with pytest.raises(ArgumentError, match="'@'"):
        fdpass.fetch(server.address[1:], "k", 5.0)
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ArgumentError, match="positive, finite"):
            fdpass.fetch(server.address, "k", bad)
    with pytest.raises(TypeError, match="number of seconds"):
        fdpass.fetch(server.address, "k", None)
    with pytest.raises(ArgumentError):
        fdpass.FdServer(request_timeout=0)
    assert server.withdraw("k")
    assert settled_nfds(before) == before


def test_process_server_is_one_per_process(child):
    srv = fdpass.process_server()
    try:
        assert fdpass.process_server() is srv
        assert srv.address.startswith(f"@gexmk-fd-{os.getpid()}-")
        fd = memfd("seg", b"x")
        srv.offer("k", [fd], allowed_pids={child.pid})
        os.close(fd)
        assert child.call("fetch", srv.address, "k") == 1
    finally:
        srv.close()
    again = fdpass.process_server()  # started anew on demand after a close
    try:
        assert again is not srv and again.address != srv.address
    finally:
        again.close()
    assert not server_threads()
