"""Two network namespaces joined by a veth pair: one machine standing in for two nodes.

gexmk treats processes in different network namespaces as different nodes
(gexmk.bootstrap._node_name), so a job whose ranks sit in the namespaces of
:func:`two_nodes` reaches its peers over the ofi transport, through the veth
pair, as it would across a real network.

Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and iproute2; where either is
missing, or the container forbids ``ip netns add``, :func:`two_nodes` skips the
test with the reason.  Names come from the test process's pid (plus a counter),
so concurrent test runs do not clash, and everything is deleted on exit, also
when the test fails.
"""
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import time

import pytest

_counter = itertools.count()


def _ip(*args, check=True, timeout=20):
    """Run ``ip args...``; returns the CompletedProcess (text output)."""
    proc = subprocess.run(["ip", *args], stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed ({proc.returncode}): "
                           f"{proc.stderr.strip()}")
    return proc


class TwoNodes:
    """What :func:`two_nodes` made.  Index ``i`` (0 or 1) names one side:

    - ``netns[i]``: the namespace, ``<base>n<i>``;
    - ``iface[i]``: its end of the veth pair;
    - ``addr[i]``: that end's IPv4 address (without the /24).

    ``rank_prefix`` is a ``gexmk.run --rank-prefix`` template that puts rank
    R in ``netns[R]`` (so the namespace names end in the rank).
    """

    def __init__(self, base, netns, iface, addr):
        self.base = base
        self.netns = netns
        self.iface = iface
        self.addr = addr
        self.rank_prefix = f"ip netns exec {base}n{{rank}}"

    def rank_prefix_per_node(self, k):
        """A ``gexmk.run --rank-prefix`` template that puts ranks
        ``[i * k, (i + 1) * k)`` in ``netns[i]`` (``k`` ranks per "node"): a
        shell computes the namespace from the rank and execs ``ip netns
        exec``, so the rank keeps the launcher's pid."""
        return f"sh -c 'exec ip netns exec {self.base}n$(({{rank}} / {int(k)})) \"$@\"' sh"

    def exec_prefix(self, i):
        """The command words that run a program inside ``netns[i]``."""
        return ["ip", "netns", "exec", self.netns[i]]

    def pids(self, i):
        """Pids of the processes that live in ``netns[i]`` now."""
        out = _ip("netns", "pids", self.netns[i], check=False).stdout
        return [int(p) for p in out.split()]

    def link_stats(self, i):
        """Byte and packet counters of ``iface[i]``: dict with tx_bytes, rx_bytes,
        tx_packets, rx_packets."""
        out = _ip("-n", self.netns[i], "-j", "-s", "link", "show", "dev", self.iface[i]).stdout
        stats = json.loads(out)[0]["stats64"]
        return {"tx_bytes": stats["tx"]["bytes"], "rx_bytes": stats["rx"]["bytes"],
                "tx_packets": stats["tx"]["packets"], "rx_packets": stats["rx"]["packets"]}


def _addresses(pid, k):
    # 10.x.y.0/24 from the pid: nothing outside the namespaces ever sees these
    # addresses, so this only keeps concurrent runs' logs apart.
    n = (pid * 16 + k) % (200 * 256)
    x, y = 20 + n // 256, n % 256
    return f"10.{x}.{y}.1", f"10.{x}.{y}.2"


def _kill_leftovers(nodes, created):
    """SIGKILL processes still in our namespaces (ours: the names are unique to this
    test process); returns their pids."""
    left = []
    for i, name in enumerate(nodes.netns):
        if name not in created:
            continue
        for pid in nodes.pids(i):
            left.append(pid)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    return left


@contextlib.contextmanager
def two_nodes():
    """Create two namespaces joined by a veth pair and yield a :class:`TwoNodes`.

    Each namespace has ``lo`` and its veth end up, with ``addr[i]/24``.  On
    exit every process still inside them is killed and both are deleted
    (which deletes the veth pair).  Skips the test when this is not root, iproute2
    is missing, or namespaces or veth pairs cannot be created here.
    """
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (CAP_SYS_ADMIN, CAP_NET_ADMIN)")
    if shutil.which("ip") is None:
        pytest.skip("iproute2 (`ip`) is not installed")
    pid, k = os.getpid(), next(_counter) % 100
    base = f"gxt{pid}x{k}"
    nodes = TwoNodes(base, [f"{base}n0", f"{base}n1"], [f"gxv{pid}{k}a", f"gxv{pid}{k}b"],
                     list(_addresses(pid, k)))
    created = []
    try:
        for name in nodes.netns:
            proc = _ip("netns", "add", name, check=False)
            if proc.returncode != 0:
                pytest.skip(f"cannot create a network namespace here (`ip netns add` said: "
                            f"{proc.stderr.strip()})")
            created.append(name)
        # Both ends are born inside their namespaces: nothing ever sits in ours.
        proc = _ip("link", "add", nodes.iface[0], "netns", nodes.netns[0], "type", "veth",
                   "peer", "name", nodes.iface[1], "netns", nodes.netns[1], check=False)
        if proc.returncode != 0:
            pytest.skip(f"cannot create a veth pair here (`ip link add ... type veth` said: "
                        f"{proc.stderr.strip()})")
        for i in (0, 1):
            ns = nodes.netns[i]
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "addr", "add", f"{nodes.addr[i]}/24", "dev", nodes.iface[i])
            _ip("-n", ns, "link", "set", nodes.iface[i], "up")
        _wait_reachable(nodes)
        yield nodes
    finally:
        _kill_leftovers(nodes, created)
        for name in created:
            _ip("netns", "del", name, check=False)


def _wait_reachable(nodes, timeout=10.0):
    """Wait until both veth ends are up with their addresses usable (IPv4 has no
    duplicate address detection, but the link needs a moment to come up)."""
    end = time.monotonic() + timeout
    while True:
        states = [json.loads(_ip("-n", nodes.netns[i], "-j", "link", "show", "dev",
                                 nodes.iface[i]).stdout)[0].get("operstate") for i in (0, 1)]
        if all(s == "UP" for s in states):
            return
        if time.monotonic() > end:
            raise RuntimeError(f"veth pair {nodes.iface} did not come up: {states}")
        time.sleep(0.05)


def namespaces_named(prefix):
    """Network namespaces (by name) that start with ``prefix``."""
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(prefix)]
