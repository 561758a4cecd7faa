"""Job rendezvous and bootstrap collectives (gexmk.bootstrap).

Single mode runs in this process; launcher mode runs worker scripts under
``python -m gexmk.run``; MPI mode under the ``mpiexec`` of the mpich wheel.
Workers import only ``gexmk.bootstrap``, assert, print ``ok <rank>`` and exit
0; the job's exit code and output carry the verdict.
"""
import os
import shutil
import socket
import struct
import sys
import textwrap
import threading
import time

import pytest

try:
    from . import mp_util
except ImportError:
    import mp_util

from gexmk import bootstrap as B
from gexmk.errors import (ArgumentError, BootstrapError, GexmkError, RankError,
                          StateError, TimeoutError)

# Prepended to every worker: only the bootstrap, so these tests do not depend on the core.
HEADER = r'''
import os, signal, sys, threading, time
from gexmk import bootstrap as B
from gexmk import errors as E

def say(text):
    os.write(1, (text + "\n").encode())  # one write: lines of concurrent ranks do not mix

def expect(exc, fn, *args, **kw):
    try:
        fn(*args, **kw)
    except exc as e:
        return e
    raise AssertionError(f"{fn.__name__}{args} did not raise {exc.__name__}")
'''


def job(tmp_path, body, n, **kw):
    """Run ``body`` (after HEADER) on ``n`` ranks under the launcher; returns a JobResult."""
    source = HEADER + "\n" + textwrap.dedent(body)
    kw.setdefault("launcher_timeout", 40)
    kw["env"] = {"GEXMK_BOOTSTRAP": None, **kw.get("env", {})}
    return mp_util.run_job(tmp_path, source, n, prelude=False, **kw)


def oks(result, ranks):
    """Assert every rank in ``ranks`` printed its ``ok`` line."""
    lines = set(result.stdout.split("\n"))
    for r in ranks:
        assert f"ok {r}" in lines, result.report()


@pytest.fixture(autouse=True)
def nothing_left(tmp_path):
    """Fail a test that leaves one of its processes (command line naming tmp_path) alive."""
    yield
    marker = str(tmp_path)
    end = time.monotonic() + 5
    while mp_util.processes_running(marker) and time.monotonic() < end:
        time.sleep(0.05)
    left = mp_util.processes_running(marker)
    for pid in left:
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    assert not left, f"processes left running: {left}"


@pytest.fixture
def single(monkeypatch):
    """A single-process bootstrap, whatever launched pytest; closed after the test."""
    for name in ("GEXMK_BOOTSTRAP", "GEXMK_TIMEOUT", *B.MPI_ENVIRONMENT):
        monkeypatch.delenv(name, raising=False)
    bs = B.from_environment()
    yield bs
    bs.close()


# -- single process -------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_single_identity_and_exchange(single):
    assert single.kind == "single"
    assert (single.rank, single.size) == (0, 1)
    assert single.pids == [os.getpid()] and single.nodes == [0]
    assert single.exchange("k1", [0], 0, b"abc") == [b"abc"]
    assert single.exchange("k2", [0], 0, bytearray(b"xy")) == [b"xy"]  # any bytes-like
    single.barrier()
    single.barrier()


@pytest.mark.timeout(30)
def test_single_two_threads_as_two_members(single):
    results = {}

    def member(i):
        results[i] = single.exchange("pair", [0, 0], i, f"m{i}".encode(), timeout=10)

    threads = [threading.Thread(target=member, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert results == {0: [b"m0", b"m1"], 1: [b"m0", b"m1"]}
    # several keys in flight at once, from many threads
    results.clear()

    def member2(key, i):
        results[key, i] = single.exchange(key, [0, 0, 0], i, bytes([i]), timeout=10)

    threads = [threading.Thread(target=member2, args=(f"k{k}", i)) for k in range(4) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert all(v == [b"\0", b"\1", b"\2"] for v in results.values()) and len(results) == 12


@pytest.mark.timeout(30)
def test_single_timeout_names_missing_member_and_withdraws(single):
    t0 = time.monotonic()
    with pytest.raises(TimeoutError) as info:
        single.exchange("lonely", [0, 0], 0, b"x", timeout=0.3)
    assert 0.25 <= time.monotonic() - t0 < 5
    assert "index [1]" in str(info.value) and "lonely" in str(info.value)
    assert isinstance(info.value, GexmkError)
    # the timed-out contribution was withdrawn: the key can be completed afresh
    out = {}
    t = threading.Thread(target=lambda: out.setdefault(1, single.exchange("lonely", [0, 0], 1, b"b")))
    t.start()
    assert single.exchange("lonely", [0, 0], 0, b"a", timeout=10) == [b"a", b"b"]
    t.join(10)
    assert out[1] == [b"a", b"b"]


@pytest.mark.timeout(30)
def test_single_bad_arguments(single):
    with pytest.raises(ArgumentError):
        single.exchange("k", [], 0, b"")
    with pytest.raises(RankError):
        single.exchange("k", [0, 1], 0, b"")            # rank 1 is not in a job of one
    with pytest.raises(ArgumentError):
        single.exchange("k", [0], 1, b"")               # index outside members
    with pytest.raises(TypeError):
        single.exchange("k", [0], 0, "not bytes")
    with pytest.raises(TypeError):
        single.exchange(7, [0], 0, b"")
    with pytest.raises(ValueError):
        single.exchange("k", [0], 0, b"", timeout=-1)
    with pytest.raises(TypeError):
        single.on_peer_death("not callable")


@pytest.mark.timeout(30)
def test_single_close_is_idempotent_and_final(single):
    waiting = {}

    def waiter():
        try:
            single.exchange("never", [0, 0], 0, b"", timeout=20)
        except Exception as e:  # noqa: BLE001 - the test inspects it
            waiting["error"] = e

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.2)
    single.close()
    single.close()
    t.join(10)
    assert isinstance(waiting.get("error"), StateError)  # a pending exchange fails at close
    assert single.closed
    with pytest.raises(StateError):
        single.exchange("k", [0], 0, b"")
    with pytest.raises(StateError):
        single.barrier()


@pytest.mark.timeout(30)
def test_bad_environment_raises_bootstrap_error(monkeypatch):
    monkeypatch.setenv("GEXMK_TIMEOUT", "1")
    monkeypatch.setenv("GEXMK_BOOTSTRAP", "@gexmk-test-nobody-listens-here")
    monkeypatch.setenv("GEXMK_RANK", "0")
    monkeypatch.setenv("GEXMK_SIZE", "2")
    monkeypatch.delenv("GEXMK_BOOTSTRAP_TOKEN", raising=False)
    with pytest.raises(BootstrapError, match="GEXMK_BOOTSTRAP_TOKEN"):
        B.from_environment()                            # no secret: not started by gexmk.run
    monkeypatch.setenv("GEXMK_BOOTSTRAP_TOKEN", "x" * 32)
    t0 = time.monotonic()
    with pytest.raises(BootstrapError, match="gexmk-test-nobody-listens-here"):
        B.from_environment()
    assert time.monotonic() - t0 < 5
    monkeypatch.setenv("GEXMK_RANK", "two")
    with pytest.raises(BootstrapError, match="GEXMK_RANK"):
        B.from_environment()
    monkeypatch.setenv("GEXMK_BOOTSTRAP", "nonsense")
    monkeypatch.setenv("GEXMK_RANK", "0")
    with pytest.raises(BootstrapError, match="nonsense"):
        B.from_environment()
    monkeypatch.setenv("GEXMK_TIMEOUT", "soon")
    with pytest.raises(BootstrapError, match="GEXMK_TIMEOUT"):
        B.from_environment()


@pytest.mark.timeout(30)
def test_server_fails_exchange_with_mismatched_members(monkeypatch):
    # Two clients in threads of this process, on a server of this process.
    monkeypatch.delenv("GEXMK_TIMEOUT", raising=False)
    server = B.RendezvousServer(2)
    server.start()
    try:
        clients = [None, None]

        def connect(r):
            clients[r] = B.Bootstrap(rank=r, size=2, kind="launcher", timeout=10,
                                     connect=B._connect_socket(server.address, 10),
                                     token=server.token(r))

        threads = [threading.Thread(target=connect, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(15)
        errors = {}

        def call(r, members):
            try:
                clients[r].exchange("bad", members, members.index(r), b"", timeout=10)
            except Exception as e:  # noqa: BLE001
                errors[r] = e

        threads = [threading.Thread(target=call, args=(0, [0, 1])),
                   threading.Thread(target=call, args=(1, [1, 0]))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(15)
        assert all(isinstance(errors.get(r), ValueError) for r in range(2)), errors
        assert "different member lists" in str(errors[0])
        for c in clients:
            c.close()
        assert server.wait_finished(5)
    finally:
        server.close()


@pytest.mark.timeout(30)
def test_tcp_server_wants_the_rank_token():
    server = B.RendezvousServer(1, tcp=True, tokens=["secret"])
    server.start()
    try:
        assert server.token(0) == "secret"
        for guess in ("guess", None, "secret\0"):
            connect = B._connect_socket(server.address, 5)
            with pytest.raises(BootstrapError, match="wrong token for rank 0"):
                B.Bootstrap(rank=0, size=1, kind="mpi", timeout=5, connect=connect, token=guess)
        with B.Bootstrap(rank=0, size=1, kind="mpi", timeout=5,
                         connect=B._connect_socket(server.address, 5), token="secret") as bs:
            assert bs.exchange("k", [0], 0, b"tcp") == [b"tcp"]
    finally:
        server.close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("tcp", [False, True], ids=["unix", "tcp"])
def test_a_rank_cannot_join_with_another_ranks_secret(tcp):
    # A process of the same user (here: this one) knows the address and rank 0's secret;
    # it must not take rank 1's place before rank 1 arrives.
    server = B.RendezvousServer(2, tcp=tcp, host="127.0.0.1" if tcp else None)
    server.start()
    try:
        tokens = [server.token(r) for r in range(2)]
        assert len(set(tokens)) == 2 and all(len(t) >= 32 for t in tokens)
        for guess in (tokens[0], None, ""):
            with pytest.raises(BootstrapError, match="wrong token for rank 1"):
                B.Bootstrap(rank=1, size=2, kind="launcher", timeout=5,
                            connect=B._connect_socket(server.address, 5), token=guess)
        clients = {}

        def join(r):
            clients[r] = B.Bootstrap(rank=r, size=2, kind="launcher", timeout=10,
                                     connect=B._connect_socket(server.address, 10),
                                     token=tokens[r])

        threads = [threading.Thread(target=join, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(15)
        assert sorted(clients) == [0, 1]          # the real rank 1 was not shut out
        assert clients[1].dead_ranks() == [] and clients[1].pids[1] == os.getpid()
        for c in clients.values():
            c.close()
        assert server.wait_finished(5)
    finally:
        server.close()


@pytest.mark.timeout(30)
def test_unix_server_asks_admit_with_the_connecting_pid():
    asked = []
    verdict = {"ok": False}

    def admit(rank, pid):
        asked.append((rank, pid))
        return verdict["ok"]

    for tcp in (False, True):
        server = B.RendezvousServer(1, tcp=tcp, host="127.0.0.1" if tcp else None, admit=admit)
        server.start()
        try:
            connect = B._connect_socket(server.address, 5)
            if not tcp:   # the kernel's pid of the caller, which admit refuses
                with pytest.raises(BootstrapError, match=f"from process {os.getpid()}"):
                    B.Bootstrap(rank=0, size=1, kind="launcher", timeout=5, connect=connect,
                                token=server.token(0))
                assert asked == [(0, os.getpid())]
                verdict["ok"] = True
            one_rank_job_works(server, server.token(0))
        finally:
            server.close()
    assert asked == [(0, os.getpid())] * 2        # never asked on TCP: no pid to ask about
    with pytest.raises(TypeError, match="admit"):
        B.RendezvousServer(1, admit="yes")


def test_server_tokens_argument():
    with pytest.raises(ValueError, match="one non-empty str per rank"):
        B.RendezvousServer(2, tokens=["only-one"])
    with pytest.raises(ValueError, match="one non-empty str per rank"):
        B.RendezvousServer(1, tokens=[""])
    with pytest.raises(TypeError, match="not one str"):
        B.RendezvousServer(1, tokens="shared")
    server = B.RendezvousServer(1)
    try:
        with pytest.raises(RankError):
            server.token(1)
    finally:
        server.close()

def raw_connect(server):
    """A plain socket connected to ``server`` (Unix or TCP), speaking no protocol yet."""
    if server.address.startswith("@"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect("\0" + server.address[1:])
        return sock
    host, _, port = server.address.rpartition(":")
    return socket.create_connection((host.strip("[]"), int(port)), timeout=10)


def closed_by_server(sock, within):
    """True when the server closes ``sock`` within ``within`` seconds (reading what it sends)."""
    end = time.monotonic() + within
    try:
        while time.monotonic() < end:
            sock.settimeout(max(0.01, end - time.monotonic()))
            if not sock.recv(1 << 16):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        pass
    return False


def one_rank_job_works(server, token):
    """The real rank still joins ``server`` (a job of one) and exchanges."""
    with B.Bootstrap(rank=0, size=1, kind="launcher", timeout=10,
                     connect=B._connect_socket(server.address, 10), token=token) as bs:
        assert bs.exchange("still-works", [0], 0, b"ok") == [b"ok"]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("tcp", [True, False], ids=["tcp", "unix"])
def test_server_reads_no_large_frame_before_hello(tcp):
    # One stranger announcing a 4 GiB frame used to make the server buffer all it sent.
    server = B.RendezvousServer(1, tcp=tcp, host="127.0.0.1" if tcp else None,
                                tokens=["secret"])
    server.start()
    try:
        for announced in (0xFFFFFFF0, B.MAX_HELLO_BYTES + 1):
            with raw_connect(server) as raw:
                raw.sendall(struct.pack("!I", announced) + b"\0" * 4096)
                assert closed_by_server(raw, 5), f"a {announced}-byte frame before hello was read"
        one_rank_job_works(server, "secret")
    finally:
        server.close()


@pytest.mark.timeout(30)
def test_server_drops_connections_that_do_not_say_hello():
    server = B.RendezvousServer(1, tcp=True, host="127.0.0.1", tokens=["secret"], hello_timeout=0.5)
    server.start()
    try:
        with raw_connect(server) as silent, raw_connect(server) as partial:
            partial.sendall(struct.pack("!I", 100) + b"l")   # a hello that never completes
            t0 = time.monotonic()
            assert closed_by_server(silent, 5) and closed_by_server(partial, 5)
            assert time.monotonic() - t0 < 4
        # an authenticated rank may stay quiet as long as it likes
        with B.Bootstrap(rank=0, size=1, kind="launcher", timeout=10,
                         connect=B._connect_socket(server.address, 10), token="secret") as bs:
            time.sleep(1.0)
            assert bs.exchange("after-a-pause", [0], 0, b"x") == [b"x"]
    finally:
        server.close()
    with pytest.raises(ValueError, match="hello_timeout"):
        B.RendezvousServer(1, hello_timeout=0)


@pytest.mark.timeout(30)
def test_server_caps_frames_of_an_authenticated_rank():
    server = B.RendezvousServer(1, tcp=True, host="127.0.0.1", tokens=["secret"])
    server.start()
    try:
        with raw_connect(server) as raw:
            raw.sendall(B._frame(("hello", "secret", 0, 1, os.getpid(), "node")))
            raw.settimeout(5)
            welcome = raw.recv(1 << 16)
            assert b"welcome" in welcome, welcome       # authenticated
            raw.sendall(struct.pack("!I", B.MAX_MESSAGE_BYTES + 1) + b"l")
            assert closed_by_server(raw, 5), "an over-long frame of a rank was read"
    finally:
        server.close()


@pytest.mark.timeout(30)
def test_exchange_refuses_a_payload_over_the_limit(single):
    with pytest.raises(ValueError, match="MAX_PAYLOAD_BYTES"):
        single.exchange("huge", [0], 0, bytes(B.MAX_PAYLOAD_BYTES + 1))
    assert single.exchange("fine", [0], 0, b"x") == [b"x"]   # nothing was left waiting


@pytest.mark.timeout(30)
def test_server_answers_its_home_rank_last():
    # MPI rank 0 hosts the server: once rank 0 has its answer it may block holding
    # the GIL, so everybody else's answer must have left the server before rank 0's.
    server = B.RendezvousServer(2, home_rank=0)
    server.start()
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # rank 1, reading nothing yet
    try:
        raw.connect("\0" + server.address[1:])
        raw.sendall(B._frame(("hello", server.token(1), 1, 2, os.getpid(), "node")))
        home = B.Bootstrap(rank=0, size=2, kind="mpi", timeout=10,
                           connect=B._connect_socket(server.address, 10), token=server.token(0))
        big = b"x" * (8 << 20)                      # far more than a socket buffer holds
        raw.sendall(B._frame(("contrib", "k", [0, 1], 1, big)))
        done = threading.Event()
        t = threading.Thread(target=lambda: (home.exchange("k", [0, 1], 0, big), done.set()))
        t.start()
        assert not done.wait(1.0), "rank 0 was answered while rank 1's answer was stuck"
        while not done.is_set():                    # rank 1 reads: rank 0 gets its answer
            raw.settimeout(0.2)
            try:
                if not raw.recv(1 << 20):
                    break
            except socket.timeout:
                pass
        t.join(10)
        assert done.is_set()
        home.close()
    finally:
        raw.close()
        server.close()

# -- launcher mode --------------------------------------------------------------------------

COLLECTIVES = r'''
bs = B.from_environment()
me, n = bs.rank, bs.size
assert bs.kind == "launcher"
assert (me, n) == (int(os.environ["GEXMK_RANK"]), int(os.environ["GEXMK_SIZE"]))
assert len(bs.pids) == n and bs.pids[me] == os.getpid() and len(set(bs.pids)) == n
assert bs.nodes == [0] * n
everyone = list(range(n))
bs.barrier()
# allgather of rank-dependent payloads, several rounds
for i in range(20):
    got = bs.exchange(f"ag{i}", everyone, me, f"{i}:{me}".encode() * (me + 1))
    assert got == [f"{i}:{r}".encode() * (r + 1) for r in everyone], got
# a large payload crosses many socket buffers
big = bs.exchange("big", everyone, me, bytes([me]) * (1 << 20))
assert [len(p) for p in big] == [1 << 20] * n and all(p[-1] == r for r, p in enumerate(big))
# sub-teams: even ranks, and the pair {me, me^1}, members in non-rank order
evens = [r for r in reversed(everyone) if r % 2 == 0]
if me in evens:
    assert bs.exchange("evens", evens, evens.index(me), bytes([me])) == [bytes([r]) for r in evens]
pair = sorted({me, me ^ 1} & set(everyone), reverse=True)
assert bs.exchange(f"pair{min(pair)}", pair, pair.index(me), bytes([me])) == [bytes([r]) for r in pair]
# this process holds two members: one call per entry, from two threads
doubled = [r for r in everyone for _ in range(2)]
results = {}
def member(index):
    results[index] = bs.exchange("doubled", doubled, index, f"{me}.{index}".encode())
threads = [threading.Thread(target=member, args=(2 * me + k,)) for k in range(2)]
for t in threads: t.start()
for t in threads: t.join(30)
expected = [f"{r}.{i}".encode() for i, r in enumerate(doubled)]
assert results == {2 * me: expected, 2 * me + 1: expected}, results
bs.barrier()
assert bs.dead_ranks() == []
bs.close()
say(f"ok {me}")
'''


@pytest.mark.timeout(60)
@pytest.mark.parametrize("n", [2, 4])
def test_launcher_collectives(tmp_path, n):
    result = job(tmp_path, COLLECTIVES, n).check(0)
    oks(result, range(n))


DEATH = r'''
how = sys.argv[1]
bs = B.from_environment()
me, n = bs.rank, bs.size
seen = []
reported = threading.Event()
bs.on_peer_death(lambda r: (seen.append(r), reported.set()))
bs.barrier()
if me == 1:
    time.sleep(0.3)             # let the others enter the next exchange first
    if how == "exit":
        os._exit(7)
    if how == "raise":
        raise RuntimeError("rank 1 crashes")   # uncaught: reported as a death too
    os.kill(os.getpid(), signal.SIGKILL)
t0 = time.monotonic()
# pending when rank 1 dies
e = expect(E.PeerDeadError, bs.exchange, "after", list(range(n)), me, b"x")
assert e.rank == 1 and "rank 1" in str(e), e
assert time.monotonic() - t0 < 5
assert reported.wait(5) and seen == [1], seen
assert bs.dead_ranks() == [1]
# a later exchange that needs rank 1 fails at once; one without it still works
t0 = time.monotonic()
e = expect(E.PeerDeadError, bs.exchange, "later", [1, me], 1, b"x")
assert e.rank == 1 and time.monotonic() - t0 < 2
survivors = [r for r in range(n) if r != 1]
got = bs.exchange("survivors", survivors, survivors.index(me), bytes([me]))
assert got == [bytes([r]) for r in survivors], got
# a callback registered now still hears about the earlier death
late = []
bs.on_peer_death(late.append)
time.sleep(0.3)
assert late == [1], late
bs.close()
say(f"ok {me}")
'''


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how, code, report", [
    ("exit", 7, "exited with code 7"), ("kill", 128 + 9, "was killed by SIGKILL (exit status 137)"),
    ("raise", 1, "exited with code 1")])
def test_death_is_reported_to_survivors(tmp_path, how, code, report):
    result = job(tmp_path, DEATH, 3, keep_going=True, args=[how])
    result.check(code)
    oks(result, [0, 2])
    assert f"rank 1 {report}" in result.stderr


@pytest.mark.timeout(60)
def test_death_before_connecting_is_reported(tmp_path):
    # Rank 1 never reaches the rendezvous; the launcher tells the server it exited.
    body = r'''
    if os.environ["GEXMK_RANK"] == "1":
        sys.exit(5)
    bs = B.from_environment()
    t0 = time.monotonic()
    e = expect(E.PeerDeadError, bs.exchange, "x", [0, 1, 2], bs.rank, b"")
    assert e.rank == 1 and time.monotonic() - t0 < 5, e
    assert bs.dead_ranks() == [1]
    bs.exchange("y", [0, 2], bs.rank // 2, b"")
    bs.close()
    say(f"ok {bs.rank}")
    '''
    result = job(tmp_path, body, 3, keep_going=True).check(5)
    oks(result, [0, 2])


@pytest.mark.timeout(60)
def test_clean_leave_is_not_a_death(tmp_path):
    body = r'''
    bs = B.from_environment()
    me = bs.rank
    deaths = []
    bs.on_peer_death(deaths.append)
    bs.barrier()
    if me == 1:
        bs.close()              # then exits 0
        say("ok 1")
        sys.exit(0)
    e = expect(E.PeerDeadError, bs.exchange, "with1", [0, 1], 0, b"", timeout=20)
    assert e.rank == 1 and "left" in str(e), e
    time.sleep(0.5)
    assert deaths == [] and bs.dead_ranks() == [], deaths
    bs.close()
    say("ok 0")
    '''
    result = job(tmp_path, body, 2).check(0)
    oks(result, [0, 1])


@pytest.mark.timeout(60)
def test_timeout_names_missing_members(tmp_path):
    body = r'''
    bs = B.from_environment()
    me = bs.rank
    assert bs.timeout == 2.0
    if me == 2:
        time.sleep(4)           # never takes part; outlives the others' timeout
        bs.close()
        say("ok 2")
        sys.exit(0)
    t0 = time.monotonic()
    e = expect(E.TimeoutError, bs.exchange, "slow", [0, 1, 2], me, b"")
    took = time.monotonic() - t0
    assert 1.9 <= took < 4, took
    assert "job ranks [2]" in str(e) and "slow" in str(e), e
    e = expect(E.TimeoutError, bs.exchange, f"slow2.{me}", [2, me], 1, b"", timeout=0.5)
    assert "job ranks [2]" in str(e), e
    # the job is still usable after a timeout
    assert bs.exchange("fine", [0, 1], me, bytes([me])) == [b"\0", b"\1"]
    bs.close()
    say(f"ok {me}")
    '''
    result = job(tmp_path, body, 3, env={"GEXMK_TIMEOUT": "2"}).check(0)
    oks(result, range(3))


@pytest.mark.timeout(60)
def test_a_process_joins_a_launcher_job_once(tmp_path):
    body = r'''
    with B.from_environment() as bs:
        bs.barrier()
    e = expect(E.BootstrapError, B.from_environment)
    assert "already left" in str(e), e
    say(f"ok {bs.rank}")
    '''
    result = job(tmp_path, body, 2).check(0)
    oks(result, range(2))


IMPOSTOR = r'''
import os, sys
from gexmk import bootstrap as B, errors as E
# sys.argv[1] (tmp_path) only marks this process for the leftover check
if len(sys.argv) > 2:
    os.environ["GEXMK_BOOTSTRAP_TOKEN"] = sys.argv[2]
try:
    B.from_environment()
except E.BootstrapError as e:
    print(f"refused: {e}")
else:
    print("joined as rank 1")
'''


@pytest.mark.timeout(60)
def test_launcher_rank_cannot_be_taken_by_another_process(tmp_path):
    # Before rank 1 joins, a process of the same user with the job's address claims rank
    # 1 with rank 0's secret, then with rank 1's read from /proc/PID/environ: both must be
    # refused, and rank 1 join.
    (tmp_path / "impostor.py").write_text(IMPOSTOR)
    body = r'''
    import subprocess
    tmp = os.path.dirname(os.path.abspath(__file__))
    me = int(os.environ["GEXMK_RANK"])

    def impostor(*secret):
        env = dict(os.environ, GEXMK_RANK="1", GEXMK_TIMEOUT="5")
        out = subprocess.run([sys.executable, "-P", os.path.join(tmp, "impostor.py"), tmp,
                              *secret], env=env, capture_output=True, text=True, timeout=30)
        assert out.stdout.startswith("refused:"), (out.stdout, out.stderr)
        return out.stdout

    def environ_of_rank(rank):
        # the launcher's other child with GEXMK_RANK=rank, read as any process of its user can
        for pid in os.listdir("/proc"):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) != os.getppid():
                        continue
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
            except (OSError, ValueError):
                continue
            if env.get(b"GEXMK_RANK") == str(rank).encode():
                return env
        raise AssertionError(f"rank {rank}'s process not found")

    if me == 1:
        while not os.path.exists(os.path.join(tmp, "impostor.done")):
            time.sleep(0.02)
    else:
        assert "wrong token for rank 1" in impostor()                      # rank 0's secret
        stolen = environ_of_rank(1)[b"GEXMK_BOOTSTRAP_TOKEN"].decode()
        assert stolen != os.environ["GEXMK_BOOTSTRAP_TOKEN"]
        assert "not the process started as rank 1" in impostor(stolen)    # kernel says who
        open(os.path.join(tmp, "impostor.done"), "w").close()
    bs = B.from_environment()
    assert bs.pids[me] == os.getpid() and bs.dead_ranks() == []
    assert bs.exchange("both", [0, 1], me, bytes([me])) == [b"\0", b"\1"]
    bs.close()
    say(f"ok {me}")
    '''
    result = job(tmp_path, body, 2).check(0)
    oks(result, range(2))


# -- MPI mode -------------------------------------------------------------------------------

MPI_WORKER = r'''
from mpi4py import MPI
mode = sys.argv[1]
world = MPI.COMM_WORLD
if mode == "auto":
    bs = B.from_environment()
elif mode == "comm":
    bs = B.from_environment(world)
else:
    bs = B._from_mpi(world, force_tcp=True)
me, n = bs.rank, bs.size
assert bs.kind == "mpi" and (me, n) == (world.Get_rank(), world.Get_size())
assert bs.pids == world.allgather(os.getpid()) and bs.nodes == [0] * n
for i in range(5):
    assert bs.exchange(f"ag{i}", list(range(n)), me, bytes([me, i])) == [bytes([r, i]) for r in range(n)]
bs.barrier()
world.Barrier()                 # the communicator is still usable for the program
bs.close()
say(f"ok {me}")
'''


def _mpi_available():
    if shutil.which("mpiexec") is None:
        return "mpiexec is not on PATH (pip install mpich)"
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py is not installed"
    return None


@pytest.mark.mpi
@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["auto", "comm", "tcp"])
def test_mpi_mode(tmp_path, mode):
    reason = _mpi_available()
    if reason:
        pytest.skip(reason)
    script = mp_util.write_worker(tmp_path, HEADER + "\n" + MPI_WORKER, prelude=False)
    env = mp_util.child_env({"GEXMK_BOOTSTRAP": None, "GEXMK_TIMEOUT": "30"})
    result = mp_util.run_command(["mpiexec", "-n", "2", sys.executable, script, mode],
                                 timeout=50, env=env, cwd=str(tmp_path), script=script,
                                 watch_shm=("mpich_shm_", "mpich_vci_"))
    if result.timed_out or result.returncode != 0:
        mp_util.remove_shm(result.shm_files)    # what MPICH left of this job only
    result.check(0)
    oks(result, range(2))


def _rendezvous(n):
    """A rendezvous of n ranks, every one said hello; (rdv, peers, sent)."""
    from gexmk.bootstrap.protocol import _Peer, _Rendezvous
    sent = []
    rdv = _Rendezvous(n, lambda p, m: sent.append((p, m)))
    peers = [_Peer() for _ in range(n)]
    for r, p in enumerate(peers):
        rdv.handle(p, ("hello", None, r, n, 1000 + r, "node"))
    sent.clear()
    return rdv, peers, sent


def test_rendezvous_takes_whole_job_members_as_a_count():
    # issue 23: ranks 0..n-1 travel as n (O(1) for the server to read, check and
    # compare); the result is the same payload list as with the list form
    from gexmk.bootstrap.client import _wire_members
    assert _wire_members([0, 1, 2]) == 3
    assert _wire_members([0, 2]) == [0, 2] and _wire_members([1, 0]) == [1, 0]
    rdv, peers, sent = _rendezvous(3)
    for r in range(3):
        rdv.handle(peers[r], ("contrib", "k", 3, r, b"p%d" % r))
    assert [m for _, m in sent] == [("result", "k", [b"p0", b"p1", b"p2"])] * 3
    # a subset as a list next to a count of other ranks: a mismatch, as before
    sent.clear()
    rdv.handle(peers[0], ("contrib", "m", 2, 0, b""))
    rdv.handle(peers[1], ("contrib", "m", [0, 1, 2], 1, b""))
    assert {m[0] for _, m in sent} == {"fail"} and "different member lists" in sent[0][1][4]


@pytest.mark.parametrize("members", [0, 4, -1, True])
def test_rendezvous_refuses_a_bad_member_count(members):
    from gexmk.bootstrap.protocol import _ProtocolError
    rdv, peers, sent = _rendezvous(3)
    with pytest.raises(_ProtocolError, match="malformed contribution"):
        rdv.handle(peers[0], ("contrib", "k", members, 0, b""))


def test_rendezvous_sends_alike_payloads_once():
    # a barrier's result is one copy and a count ...
    rdv, peers, sent = _rendezvous(3)
    for r in range(3):
        rdv.handle(peers[r], ("contrib", "b", 3, r, b"same"))
    assert [m for _, m in sent] == [("result", "b", [b"same"], 3)] * 3


@pytest.mark.timeout(60)
def test_exchange_of_alike_and_subset_payloads_over_a_server(monkeypatch):
    # ... which the client expands: every member gets one payload per member
    monkeypatch.delenv("GEXMK_TIMEOUT", raising=False)
    n = 3
    server = B.RendezvousServer(n)
    server.start()
    try:
        clients = [None] * n

        def connect(r):
            clients[r] = B.Bootstrap(rank=r, size=n, kind="launcher", timeout=10,
                                     connect=B._connect_socket(server.address, 10),
                                     token=server.token(r))

        threads = [threading.Thread(target=connect, args=(r,)) for r in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(15)
        got = {}

        def call(r):
            got[r] = [clients[r].exchange("alike", list(range(n)), r, b"x"),
                      clients[r].exchange("mine", list(range(n)), r, b"%d" % r)]
            if r != 1:   # a subset, as a list
                sub = [0, 2]
                got[r].append(clients[r].exchange("sub", sub, sub.index(r), b"s%d" % r))
            clients[r].barrier()

        threads = [threading.Thread(target=call, args=(r,)) for r in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        for r in range(n):
            assert got[r][0] == [b"x"] * n, got[r]
            assert got[r][1] == [b"0", b"1", b"2"], got[r]
            if r != 1:
                assert got[r][2] == [b"s0", b"s2"], got[r]
        for c in clients:
            c.close()
        assert server.wait_finished(5)
    finally:
        server.close()
