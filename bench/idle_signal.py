"""A signal to an idle process: put_signal after a pause, beside a raw TCP send.

    python -P bench/idle_signal.py [--signals 150] [--pause-ms 4] [--repeat 2]
                                   [--provider 'tcp;ofi_rxm']

A 2-rank job over ofi: rank 0 pauses (``time.sleep``), then issues one 8 B
put_signal; rank 1 waits for it in ``wait_until`` (asleep by then: in the
transport's CQ fds, GX_WAIT_SLEEP).  Reported, medians and p90 in µs:

- ``issue``: rank 0's put_signal call after the pause;
- ``latency``: from just before that call (rank 0's clock) to rank 1's wait
  returning (CLOCK_MONOTONIC is one clock for the node).

The baseline, in the same run and the same way: a Python TCP socket pair on
loopback (TCP_NODELAY), the receiver blocked in ``poll()``, the sender
pausing as rank 0 does, then ``send()`` of 8 bytes: the send call, and the
latency to the receiver's return from ``recv``.  On a VM the pause lets the
vCPUs halt, and the first system call after it pays for waking them; the
baseline shows how much of the signal's latency that is.
"""
import argparse
import json
import os
import select
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _summary(xs):
    xs = sorted(x * 1e6 for x in xs)
    return {"median": statistics.median(xs), "p90": xs[int(len(xs) * 0.9)]}


def _job(n, pause, out_dir):
    """One rank of the gexmk job: its clock readings go to out_dir/rank<r>.json."""
    import numpy as np
    import gexmk
    c = gexmk.init()
    tm = c.tm
    me, peer = tm.rank, 1 - tm.rank
    c.segment_attach(1 << 16)
    x = np.ones(1, np.uint64)
    tm.put_signal(peer, tm.addr(peer, 4096), x, tm.addr(peer, 8), 1)     # connected
    tm.barrier()
    at, issue = [], []
    for i in range(1, n + 1):
        if me == 0:
            time.sleep(pause)
            t0 = time.monotonic()
            tm.put_signal(peer, tm.addr(peer, 4096), x, tm.addr(peer, 0), i)
            issue.append(time.monotonic() - t0)
            at.append(t0)
        else:
            tm.wait_until(tm.addr(me, 0), gexmk.CMP_GE, i)
            at.append(time.monotonic())
    tm.barrier()
    with open(os.path.join(out_dir, f"rank{me}.json"), "w") as f:
        json.dump({"at": at, "issue": issue}, f)
    c.finalize()


def _gexmk(n, pause, provider, timeout):
    """Run the job; its issue and latency summaries."""
    import tempfile
    with tempfile.TemporaryDirectory(prefix="gexmk-idle-") as d:
        env = dict(os.environ, GEXMK_TRANSPORT="ofi", GEXMK_OFI_PROVIDER=provider)
        env.pop("FI_PROVIDER", None)
        cmd = [sys.executable, "-P", "-m", "gexmk.run", "-n", "2", "--timeout", str(timeout),
               os.path.abspath(__file__), "--job", "--signals", str(n), "--pause-ms",
               str(pause * 1e3), "--out", d]
        subprocess.run(cmd, env=env, check=True, timeout=timeout + 30)
        r = [json.load(open(os.path.join(d, f"rank{i}.json"))) for i in range(2)]
    return {"issue": _summary(r[0]["issue"]),
            "latency": _summary([b - a for a, b in zip(r[0]["at"], r[1]["at"])])}


def _socket_baseline(n, pause):
    """The same pattern over a loopback TCP socket pair (see the module doc)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            c = socket.create_connection(("127.0.0.1", port))
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            p = select.poll()
            p.register(c, select.POLLIN)
            seen = []
            while len(seen) < n:
                p.poll(5000)
                b = c.recv(8)
                if not b:
                    break
                seen.append(time.monotonic())
            os.write(wfd, json.dumps(seen).encode())
        finally:
            os._exit(0)
    os.close(wfd)
    s, _ = srv.accept()
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sent, issue = [], []
    for _ in range(n):
        time.sleep(pause)
        t0 = time.monotonic()
        s.send(b"12345678")
        issue.append(time.monotonic() - t0)
        sent.append(t0)
    chunks = []
    while True:
        b = os.read(rfd, 1 << 16)
        if not b:
            break
        chunks.append(b)
    os.close(rfd)
    s.close()
    srv.close()
    os.waitpid(pid, 0)
    seen = json.loads(b"".join(chunks))
    return {"issue": _summary(issue), "latency": _summary([b - a for a, b in zip(sent, seen)])}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--signals", type=int, default=150)
    ap.add_argument("--pause-ms", type=float, default=4.0)
    ap.add_argument("--repeat", type=int, default=2, help="gexmk job and baseline, interleaved")
    ap.add_argument("--provider", default="tcp;ofi_rxm")
    ap.add_argument("--timeout", type=int, default=120)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--job", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    pause = a.pause_ms / 1e3
    if a.job:
        _job(a.signals, pause, a.out)
        return 0
    runs = []
    for r in range(a.repeat):
        g = _gexmk(a.signals, pause, a.provider, a.timeout)
        b = _socket_baseline(a.signals, pause)
        runs.append({"gexmk": g, "socket": b, "loadavg": os.getloadavg()[0]})
        print(f"run {r + 1} (load {runs[-1]['loadavg']:.2f}), {a.signals} signals after "
              f"{a.pause_ms:g} ms pauses, µs median / p90:")
        for name, what in (("gexmk put_signal over " + a.provider, g),
                           ("raw TCP send, loopback  ", b)):
            print(f"  {name}: issue {what['issue']['median']:7.1f} / {what['issue']['p90']:7.1f}"
                  f"   latency {what['latency']['median']:7.1f} / {what['latency']['p90']:7.1f}")
        print(f"  gexmk / socket latency: {g['latency']['median'] / b['latency']['median']:.2f}",
              flush=True)
    if a.json:
        print(json.dumps(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
