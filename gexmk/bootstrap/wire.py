"""Shared pieces of every bootstrap: limits, settings, the node name and the
rendezvous wire format (pure Python, standard library only).

Messages are tuples of None/int/str/bytes/lists in a tagged encoding rather
than pickle, so that a stray connection can at worst be dropped, never run
code.  A frame is a 4-byte big-endian length followed by the encoded message.
"""

from __future__ import annotations

import os
import socket
import struct

from gexmk import config
from gexmk.errors import ArgumentError, BootstrapError


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

