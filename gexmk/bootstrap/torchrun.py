"""Bootstrap plug-in ``torchrun``: a worker of ``torchrun`` (torch elastic), or of
any launcher that sets torch.distributed's environment.

Rank and size come from RANK and WORLD_SIZE (LOCAL_RANK and LOCAL_WORLD_SIZE
are checked against them); the job's own key-value store at
MASTER_ADDR:MASTER_PORT (``torch.distributed.TCPStore``: torchrun's agent
hosts it, TORCHELASTIC_USE_AGENT_STORE=True; otherwise rank 0 does) carries
rank 0's rendezvous address and a random job secret, under a prefix naming the
run (TORCHELASTIC_RUN_ID) and its restart (TORCHELASTIC_RESTART_COUNT), so a
restarted job never reads its predecessor's.  Rank 0's server listens on every
interface (GEXMK_BOOTSTRAP_LISTEN narrows it) and is published at its address
on the route to MASTER_ADDR.

The store's wire protocol is torch's own and changes between versions, so it
is spoken only through torch: without torch importable this plug-in raises
:class:`~gexmk.errors.BootstrapError` rather than guess.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import socket
import threading
import time

from gexmk.bootstrap import hosted
from gexmk.bootstrap.wire import default_timeout
from gexmk.errors import BootstrapError

NAME = "torchrun"

_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
_WHY = "this process runs under torchrun (TORCHELASTIC_RUN_ID is set)"


def detect(environ) -> str | None:
    """TORCHELASTIC_RUN_ID (set by torchrun for its workers), or all of MASTER_ADDR,
    MASTER_PORT, RANK and WORLD_SIZE."""
    if "TORCHELASTIC_RUN_ID" in environ:
        return (f"torchrun's environment (TORCHELASTIC_RUN_ID={environ['TORCHELASTIC_RUN_ID']}, "
                f"RANK={environ.get('RANK')}, WORLD_SIZE={environ.get('WORLD_SIZE')})")
    if all(name in environ for name in _VARS):
        return ("torch.distributed's environment (" +
                ", ".join(f"{n}={environ[n]}" for n in _VARS) + ")")
    return None


def available() -> str | None:
    """None when torch is installed (found, not imported: that is slow), else why not."""
    try:
        found = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # torch blocked (sys.modules["torch"] = None)
        found = False
    if not found:
        return ("torch is not importable; the store at MASTER_ADDR:MASTER_PORT speaks "
                "torch's own protocol, spoken here only through torch.distributed.TCPStore")
    return None


def _wait_listening(addr, port, timeout, where):
    """Return once something accepts at ``addr:port``, else BootstrapError after
    ``timeout`` seconds.

    torch's TCPStore keeps retrying a refused connect past its own timeout, and a
    thread left inside it throws later, perhaps while the interpreter is shutting
    down, which aborts the process (``terminate called``).  So torch is called only
    once a listener is there; the probe's connection is closed at once.
    """
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            socket.create_connection((addr, port), timeout=max(min(left, 1.0), 0.05)).close()
            return
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise BootstrapError(f"cannot reach the job's store at {where} within "
                                     f"{timeout:g} s (GEXMK_TIMEOUT): nothing accepted a "
                                     f"connection ({type(exc).__name__}: {exc})") from None
            time.sleep(min(0.1, max(deadline - time.monotonic(), 0)))


def _peer_sockets(port):
    """{fd: inode} of this process's TCP sockets whose peer port is ``port``."""
    found = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            s = socket.socket(fileno=os.dup(int(name)))
        except OSError:
            continue
        try:
            if s.type == socket.SOCK_STREAM and s.family in (socket.AF_INET, socket.AF_INET6) \
                    and s.getpeername()[1] == port:
                found[int(name)] = os.fstat(int(name)).st_ino
        except OSError:
            pass
        finally:
            s.close()
    return found


def _new_sockets(port, before):
    """_peer_sockets(port) opened since the snapshot ``before`` (an fd whose
    inode changed was closed and reused meanwhile)."""
    return {fd: ino for fd, ino in _peer_sockets(port).items() if before.get(fd) != ino}


def _bounded(fn, timeout, port, sockets=None):
    """``fn()``, or TimeoutError after ``timeout`` seconds (and a little).

    torch's TCPStore does not bound its handshake: against a listener that accepts
    and never answers its constructor waits forever, whatever its timeout.  The call
    runs in a thread; if it has not returned in time, the store connections it
    opened (``sockets``, else those to ``port`` it opened meanwhile) are shut down,
    so torch fails now, while the interpreter is whole, rather than later in its
    shutdown (a C++ exception then aborts the process).  A thread that still does
    not return is abandoned (a daemon).
    """
    before = _peer_sockets(port) if sockets is None else None
    box = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    t = threading.Thread(target=run, name="gexmk-torch-store", daemon=True)
    t.start()
    t.join(timeout + 1.0)
    if t.is_alive():
        if sockets is None:
            sockets = _new_sockets(port, before)
        for fd, ino in sockets.items():
            try:   # the inode check: the fd number may have been reused since
                if os.fstat(fd).st_ino == ino:
                    with socket.socket(fileno=os.dup(fd)) as s:
                        s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        t.join(5.0)
        raise TimeoutError(f"no answer within {timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def create(environ, comm=None):
    """Join the job through its store: rank 0 publishes its server's address there."""
    why = _WHY if "TORCHELASTIC_RUN_ID" in environ else "torch.distributed's environment is set"
    for name in _VARS:
        if not environ.get(name):
            raise BootstrapError(f"{why}, but {name} is not set")
    rank = hosted.env_int(environ, "RANK", why)
    size = hosted.env_int(environ, "WORLD_SIZE", why)
    hosted.check_rank(rank, size, "RANK", "WORLD_SIZE")
    if "LOCAL_RANK" in environ:
        local = hosted.env_int(environ, "LOCAL_RANK", why)
        local_size = hosted.env_int(environ, "LOCAL_WORLD_SIZE", why) \
            if "LOCAL_WORLD_SIZE" in environ else size
        hosted.check_rank(local, min(local_size, size), "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    addr, port = environ["MASTER_ADDR"], hosted.env_int(environ, "MASTER_PORT", why)
    where = f"MASTER_ADDR:MASTER_PORT ({addr}:{port})"
    missing = available()
    if missing is not None:
        raise BootstrapError(f"{why}, but gexmk cannot reach the job's store at {where}: "
                             f"{missing}; install torch, or launch with python -m gexmk.run")
    import datetime
    try:
        from torch.distributed import PrefixStore, TCPStore
    except Exception as exc:  # a torch built without distributed, or a broken install
        raise BootstrapError(f"{why}, but torch.distributed.TCPStore is not importable "
                             f"({type(exc).__name__}: {exc})") from None
    timeout = default_timeout()
    agent = environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    master = rank == 0 and not agent
    try:
        if not master:
            _wait_listening(addr, port, timeout, where)
        before = _peer_sockets(port)
        store = _bounded(lambda: TCPStore(addr, port, is_master=master,
                                          timeout=datetime.timedelta(seconds=timeout),
                                          wait_for_workers=False), timeout, port)
        mine = _new_sockets(port, before)
    except BootstrapError:
        raise
    except Exception as exc:  # torch raises RuntimeError/DistNetworkError/DistStoreError
        raise BootstrapError(f"cannot reach the job's store at {where} within {timeout:g} s "
                             f"(GEXMK_TIMEOUT): {type(exc).__name__}: {exc}") from None
    prefix = (f"gexmk/{environ.get('TORCHELASTIC_RUN_ID', 'job')}/"
              f"{environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/")
    store = PrefixStore(prefix, store)
    server = None
    try:
        if rank == 0:
            secret = secrets.token_hex(16)
            server = hosted.serve(size, host=hosted.listen_host(environ),
                                  tokens=[secret] * size)
            me = hosted.listen_host(environ) or hosted.route_address(addr)
            address = f"{me}:{server.address.rpartition(':')[2]}"
            store.set("rendezvous", f"{address} {secret}")
        else:
            try:
                address, secret = _bounded(lambda: store.get("rendezvous"),
                                           timeout, port, mine).decode().split()
            except Exception as exc:
                raise BootstrapError(
                    f"rank 0 did not publish gexmk's rendezvous in the job's store at {where} "
                    f"(key {prefix}rendezvous) within {timeout:g} s (GEXMK_TIMEOUT): "
                    f"{type(exc).__name__}: {exc}") from None
    except BaseException:
        if server is not None:
            server.close()
        raise
    # The store was needed only to find rank 0 (the job's own keeps serving torch).
    return hosted.join(NAME, rank, size, address, secret, server=server, timeout=timeout,
                       hint=f"rank 0 published it in the store at {where}; is rank 0 running?")
