"""Ranks on different nodes: the launcher's TCP rendezvous and rank prefixes, and
RMA over libfabric between two network namespaces joined by a veth pair.

A network namespace is a node to gexmk (gexmk.bootstrap._node_name), so a job
with one rank in each namespace of tests/netns_util.py reaches its peer
through the ofi transport (tcp;ofi_rxm) over the veth pair, as across hosts.
The namespace tests need root and skip without it; the launcher-option tests
run anywhere.
"""
import os
import re
import signal
import subprocess
import sys
import time

import pytest

import gexmk

try:
    from . import mp_util, netns_util
except ImportError:
    import mp_util
    import netns_util

from gexmk import run as R


def launcher_cmd(*args, prefix=()):
    return [*prefix, sys.executable, "-m", "gexmk.run", *map(str, args)]


def run_launcher(tmp_path, *args, prefix=(), env=None, timeout=60):
    """Run the launcher (under ``prefix``, e.g. ``ip netns exec NS``) to completion."""
    env = mp_util.child_env({"GEXMK_BOOTSTRAP": None, "GEXMK_BOOTSTRAP_TOKEN": None,
                             **(env or {})})
    return mp_util.run_command(launcher_cmd(*args, prefix=prefix), timeout=timeout, env=env,
                               cwd=str(tmp_path))


def wait_gone(marker, timeout=5.0):
    """Wait until no process whose command line names ``marker`` is alive; kill and
    return those that are left after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while mp_util.processes_running(marker) and time.monotonic() < end:
        time.sleep(0.05)
    left = mp_util.processes_running(marker)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return left


@pytest.fixture(autouse=True)
def nothing_left(tmp_path):
    """Fail a test that leaves one of its processes (command line naming tmp_path) alive."""
    yield
    left = wait_gone(str(tmp_path))
    assert not left, f"processes left running: {left}"


# -- launcher options (no root needed) ---------------------------------------------------

@pytest.mark.timeout(60)
def test_tcp_rendezvous_and_rank_prefix(tmp_path):
    """--bootstrap-listen serves the rendezvous on TCP with a job token; --rank-prefix
    runs each rank under a command that execs it, so the rank is still the
    launcher's child (pid kept) and {rank}/{size} are substituted."""
    script = mp_util.write_worker(tmp_path, r'''
    rank = int(os.environ["GEXMK_RANK"])
    assert os.environ["GEXMK_BOOTSTRAP"].startswith("127.0.0.1:"), os.environ["GEXMK_BOOTSTRAP"]
    assert len(os.environ["GEXMK_BOOTSTRAP_TOKEN"]) >= 32
    assert os.environ["GX_PREFIXED"] == f"{rank}/3", os.environ["GX_PREFIXED"]
    launcher_pid = int(os.environ["GEXMK_JOBID"].split("-")[0])
    assert os.getppid() == launcher_pid, (os.getppid(), launcher_pid)
    with gexmk.init() as c:
        assert c.size == 3 and c.rank == rank
        assert c.bootstrap.kind == "launcher"
        c.tm.barrier()
    ''')
    run_launcher(tmp_path, "-n", 3, "--timeout", 40, "--bootstrap-listen", "127.0.0.1",
                 "--rank-prefix", "env 'GX_PREFIXED={rank}/{size}'", script).check()


@pytest.mark.timeout(60)
def test_tcp_rendezvous_wants_the_token(tmp_path):
    """A process that has the address but not the token is turned away."""
    script = mp_util.write_worker(tmp_path, r'''
    from gexmk import bootstrap
    if os.environ["GEXMK_RANK"] == "0":
        os.environ["GEXMK_BOOTSTRAP_TOKEN"] = "not-the-token"
        err = expect_raises(E.BootstrapError, bootstrap.from_environment)
        assert "token" in str(err), err
    ''')
    res = run_launcher(tmp_path, "-n", 1, "--timeout", 40, "--bootstrap-listen", "127.0.0.1",
                       script)
    res.check()


@pytest.mark.timeout(60)
def test_option_errors(tmp_path, capsys):
    prog = str(tmp_path / "never_run.py")
    assert R.main(["-n", "2", "--rank-prefix", "ip netns exec ns{node}", prog]) == 2
    assert "{rank}" in capsys.readouterr().err
    assert R.main(["-n", "2", "--rank-prefix", "", prog]) == 2
    assert R.main(["-n", "2", "--rank-prefix", "'unbalanced", prog]) == 2
    assert R.main(["-n", "2", "--bootstrap-listen", "", prog]) == 2
    assert R.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "--bootstrap-listen" in out and "--rank-prefix" in out
    # 192.0.2.0/24 is TEST-NET-1: never an address of this machine
    res = run_launcher(tmp_path, "-n", 1, "--bootstrap-listen", "192.0.2.123", prog)
    assert res.returncode == 127 and "cannot listen on '192.0.2.123'" in res.stderr, res.report()
    # a prefix command that does not exist: the rank fails like a shell's "not found"
    res = run_launcher(tmp_path, "-n", 2, "--rank-prefix", "gexmk-no-such-command-{rank}", prog)
    # the first rank to fail is reported (either: both fail at once), with its command
    assert res.returncode == 127 and re.search(r"cannot run 'gexmk-no-such-command-[01]'",
                                               res.stderr), res.report()
    assert R._split(["-n", "2", "--rank-prefix", "env X={rank}", "--bootstrap-listen", "h",
                     "p.py", "-n"]) == (["-n", "2", "--rank-prefix", "env X={rank}",
                                         "--bootstrap-listen", "h"], ["p.py", "-n"])


SLEEPER = r'''
import os, time
open(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                  "ready." + os.environ["GEXMK_RANK"]), "w").close()
time.sleep(120)
'''


def _killed_launcher_takes_ranks_along(tmp_path, launcher_prefix, rank_prefix, listen):
    prog = tmp_path / "sleeper.py"
    prog.write_text(SLEEPER)
    env = mp_util.child_env({"GEXMK_BOOTSTRAP": None, "GEXMK_BOOTSTRAP_TOKEN": None})
    proc = subprocess.Popen(launcher_cmd("-n", 2, "--bootstrap-listen", listen, "--rank-prefix",
                                         rank_prefix, prog, prefix=launcher_prefix),
                            env=env, cwd=str(tmp_path), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True, text=True)
    try:
        end = time.monotonic() + 30
        ready = [tmp_path / f"ready.{r}" for r in range(2)]
        while not all(p.exists() for p in ready):
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < end, "ranks did not start"
            time.sleep(0.02)
        ranks = [p for p in mp_util.processes_running(str(prog)) if p != proc.pid]
        assert len(ranks) == 2, ranks
        os.kill(proc.pid, signal.SIGKILL)   # no clean-up code runs in the launcher
        proc.wait()
        # the parent-death signal survived the prefix's exec: the kernel kills the ranks
        assert not wait_gone(str(prog), timeout=5), "ranks outlived their killed launcher"
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stderr.close()


@pytest.mark.timeout(60)
def test_killed_launcher_takes_prefixed_ranks_along(tmp_path):
    _killed_launcher_takes_ranks_along(tmp_path, (), "env GX_RANK={rank}", "127.0.0.1")


# -- two namespaces (root) ----------------------------------------------------------------

SIZES = [8, 64, 4096, 65536 + 24, 1 << 20, 4 << 20]
WORKER = r'''
me = int(os.environ["GEXMK_RANK"])
peer = 1 - me
ifaces = os.environ["GX_IFACES"].split(",")
SIZES = [int(s) for s in os.environ["GX_SIZES"].split(",")]
SPAN = sum(SIZES) + 64 * len(SIZES)     # one area: every size, 64-byte aligned
OFFS, o = [], 0
for s in SIZES:
    OFFS.append(o)
    o += (s + 63) // 64 * 64
PUT, GET, CNT = 0, SPAN, 2 * SPAN        # areas in every rank's segment
NFADD = 200

client = gexmk.init()
tm = client.tm
nodes = client.nodes()
assert len(set(nodes)) == 2, f"both ranks on one node: {nodes}"
seg = client.segment_attach(2 * SPAN + 4096)
mem = np.asarray(seg)
assert tm.transport(peer) == "ofi", tm.transport(peer)
assert tm.transport(me) == "self", tm.transport(me)
net = client.transports.get("ofi")
assert net is not None, "no network domain opened for a peer on another node"
assert net.provider.startswith("tcp"), net.provider
# the domain libfabric picked is this namespace's veth end, not lo
assert net.domain_name == ifaces[me], (net.domain_name, ifaces)
log("provider", net.provider, "domain", net.domain_name)


def check(got, want, what):
    if not np.array_equal(got, want):
        bad = np.flatnonzero(got != want)
        raise AssertionError(f"{what}: {bad.size} of {want.size} bytes differ, first at {bad[0]}")


def round_trip(flavour, tag):
    """Every size, both directions: puts into the peer's PUT area, then gets from
    its GET area, with ``flavour`` blocking, nb (events) or nbi."""
    srcs = [pattern(s, me, tag, i) for i, s in enumerate(SIZES)]
    for i, s in enumerate(SIZES):           # what the peer will get from us
        mem[GET + OFFS[i]:GET + OFFS[i] + s] = pattern(s, me, tag + 1, i)
    tm.barrier()
    dests = [tm.addr(peer, PUT + off) for off in OFFS]
    if flavour == "blocking":
        for d, src in zip(dests, srcs):
            tm.put(peer, d, src)
    elif flavour == "nb":
        evs = [tm.put_nb(peer, d, src) for d, src in zip(dests, srcs)]
        evs[0].wait()
        gexmk.wait_all(evs)
        assert all(ev.test() for ev in evs)
    else:
        for d, src in zip(dests, srcs):
            tm.put_nbi(peer, d, src)
        gexmk.nbi_wait(gexmk.EC_PUT)
    tm.barrier()                             # both sides' puts complete
    for i, s in enumerate(SIZES):
        check(mem[PUT + OFFS[i]:PUT + OFFS[i] + s], pattern(s, peer, tag, i),
              f"{flavour} put of {s} B from rank {peer}")
    outs = [np.zeros(s, np.uint8) for s in SIZES]
    srcs = [tm.addr(peer, GET + off) for off in OFFS]
    if flavour == "blocking":
        for out, src in zip(outs, srcs):
            tm.get(out, peer, src)
    elif flavour == "nb":
        evs = [tm.get_nb(out, peer, src) for out, src in zip(outs, srcs)]
        gexmk.wait_all(evs)
    else:
        for out, src in zip(outs, srcs):
            tm.get_nbi(out, peer, src)
        gexmk.nbi_wait(gexmk.EC_GET)
    for i, (s, out) in enumerate(zip(SIZES, outs)):
        check(out, pattern(s, peer, tag + 1, i), f"{flavour} get of {s} B from rank {peer}")
    tm.barrier()                             # nobody overwrites an area still being read


round_trip("blocking", 10)
round_trip("nb", 20)
round_trip("nbi", 30)
with gexmk.nbi_access_region() as ev:        # NBI in an access region
    src = pattern(4096, me, 40)
    tm.put_nbi(peer, tm.addr(peer, PUT), src)
ev.wait()
tm.barrier()
check(mem[PUT:PUT + 4096], pattern(4096, peer, 40), "put_nbi in an access region")

# scalar puts and gets
tm.put_val(peer, tm.addr(peer, CNT + 64), 0x1122334455667788 + me)
tm.barrier()
assert tm.get_val(me, tm.addr(me, CNT + 64)) == 0x1122334455667788 + peer
assert tm.get_val(peer, tm.addr(peer, CNT + 64)) == 0x1122334455667788 + me
tm.barrier()

# atomics on rank 0's counters from both ranks
ad = tm.ad_create(gexmk.DT_I64, gexmk.OP_FADD | gexmk.OP_FCAS | gexmk.OP_GET | gexmk.OP_SET)
counter, lock, wins = (tm.addr(0, CNT + k) for k in (0, 8, 16))
if me == 0:
    for a in (counter, lock, wins):
        ad.op(0, a, gexmk.OP_SET, 0)
tm.barrier()
olds = [ad.op(0, counter, gexmk.OP_FADD, 1) for _ in range(NFADD)]
olds += [ad.op_nb(0, counter, gexmk.OP_FADD, 1).wait() for _ in range(NFADD)]
assert olds == sorted(olds) and len(set(olds)) == len(olds), "FADD results not increasing"
old = ad.op(0, lock, gexmk.OP_FCAS, 0, me + 1)   # exactly one rank swaps 0 -> its rank+1
if old == 0:
    ad.op(0, wins, gexmk.OP_FADD, 1)
else:
    assert old == 2 - me, f"FCAS saw {old}: neither 0 nor the other rank's value"
tm.barrier()
assert ad.op(0, counter, gexmk.OP_GET) == 2 * 2 * NFADD, ad.op(0, counter, gexmk.OP_GET)
assert ad.op(0, wins, gexmk.OP_GET) == 1
assert ad.op(0, lock, gexmk.OP_GET) in (1, 2)
if me == 0:
    assert int(mem[CNT:CNT + 8].view(np.int64)[0]) == 4 * NFADD   # the memory itself
tm.barrier()
ad.destroy()
client.finalize()
log("done")
'''


@pytest.fixture
def two_nodes():
    with netns_util.two_nodes() as nodes:
        yield nodes
        # the job must have left nothing in the namespaces (two_nodes kills leftovers)
        for i in (0, 1):
            assert not nodes.pids(i), f"processes left in {nodes.netns[i]}: {nodes.pids(i)}"
    assert not netns_util.namespaces_named(nodes.base), "namespaces were not deleted"


def need_tcp_provider():
    """Skip unless the ofi transport is built and libfabric has the tcp provider."""
    try:
        from gexmk.transports import ofi as ofi_transport
    except ImportError as exc:
        pytest.skip(f"the ofi transport is not built: {exc}")
    try:
        ofi_transport.Domain("tcp;ofi_rxm").close()
    except gexmk.UnsupportedError as exc:
        pytest.skip(f"libfabric has no tcp;ofi_rxm provider here: {exc}")


@pytest.mark.timeout(120)
def test_rma_between_namespaces(tmp_path, two_nodes):
    """Rank 0 in namespace 0, rank 1 in namespace 1 (the launcher in namespace 0,
    its rendezvous on TCP there): puts, gets and atomics over tcp;ofi_rxm,
    through the veth pair."""
    need_tcp_provider()
    nodes = two_nodes
    script = mp_util.write_worker(tmp_path, WORKER)
    before = [nodes.link_stats(i) for i in (0, 1)]
    res = run_launcher(
        tmp_path, "-n", 2, "--timeout", 90, "--bootstrap-listen", nodes.addr[0],
        "--rank-prefix", nodes.rank_prefix, script,
        prefix=nodes.exec_prefix(0), timeout=110,
        env={"GEXMK_OFI_PROVIDER": "tcp;ofi_rxm", "GEXMK_TIMEOUT": 60,
             "GX_IFACES": ",".join(nodes.iface), "GX_SIZES": ",".join(map(str, SIZES))})
    res.check()
    assert res.stderr.count("done") == 2, res.report()
    after = [nodes.link_stats(i) for i in (0, 1)]
    # each side sent at least its puts and the data the other side got from it,
    # three times (blocking, nb, nbi): the traffic went over the veth pair
    payload = 3 * 2 * sum(SIZES)
    for i in (0, 1):
        sent = after[i]["tx_bytes"] - before[i]["tx_bytes"]
        assert sent >= payload, (f"{nodes.iface[i]} sent {sent} B, expected at least "
                                 f"{payload} B of RMA data\n{res.report()}")


@pytest.mark.timeout(60)
def test_killed_launcher_takes_ranks_in_namespaces_along(tmp_path, two_nodes):
    nodes = two_nodes
    _killed_launcher_takes_ranks_along(tmp_path, nodes.exec_prefix(0), nodes.rank_prefix,
                                       nodes.addr[0])
    for i in (0, 1):
        assert not nodes.pids(i)


@pytest.mark.timeout(60)
def test_launcher_timeout_stops_ranks_in_namespaces(tmp_path, two_nodes):
    nodes = two_nodes
    prog = tmp_path / "sleeper.py"
    prog.write_text(SLEEPER)
    t0 = time.monotonic()
    res = run_launcher(tmp_path, "-n", 2, "--timeout", 3, "--bootstrap-listen", nodes.addr[0],
                       "--rank-prefix", nodes.rank_prefix, prog,
                       prefix=nodes.exec_prefix(0), timeout=30)
    assert res.returncode == R.TIMEOUT_EXIT, res.report()
    assert time.monotonic() - t0 < 3 + R.GRACE + 10
    for i in (0, 1):
        assert not nodes.pids(i), f"ranks left in {nodes.netns[i]}"
