"""What an 8 B blocking put/get to a waiting target costs above C, part by
part (a diagnostic for issue 21's "<= 1.2x the C ping-pong"):

    python -P bench/diagnostics/wait_floor.py --ofi-bench BIN [--reps 6] [--iters 3000]

Interleaved, ``--reps`` times in a shuffled order, each pinned (initiator on
CPU 0, target on CPU 1: ``ofi_bench --pin``, ``os.sched_setaffinity`` in the
gexmk ranks) and, with ``--unpinned``, unpinned too:

  C poll      ``ofi_bench -P poll``: no CQ has a wait object, the target polls
  C pollfd    ``-P pollfd``: both sides' CQs have an FI_WAIT_FD, as gexmk's do
  C pollfdt   ``-P pollfdt``: only the target's CQ has one (an initiator
              whose own completions are not signalled)
  gx default  a 2-rank gexmk job over ofi, default settings: the target idle in
              Python (its progress thread serves) and in ``tm.barrier()``
              (bench/waiting.py's worker, its ``idle`` and ``barrier`` states)
  gx spin     the same with ``GEXMK_PROGRESS_THREAD=spin`` (no wait fds: the
              progress thread polls; a rank that waits burns a core)
  gx spin0    ``spin`` in the initiator (rank 0) only: the target's CQs have
              their wait fds, the initiator's own completions are not signalled
  gx spin1    ``spin`` in the target (rank 1) only
  gx hot      default CQs (wait fds), but every wait and the progress thread,
              once woken, poll for 1 s (``GEXMK_OFI_WAIT_TUNE=1e6,1e6,1``): the
              wait objects' cost without the cost of going to sleep

Reported: per variant the median over the reps of each run's median put
(FI_DELIVERY_COMPLETE write) and get, with the range.  gx default / C poll is
issue 21's ratio; C pollfd / C poll what the wait object costs C itself; gx
spin / C poll what gexmk costs without it.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile

GX_STATES = ("idle", "barrier")
BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))     # bench/


def _worker(out, iters, pin):
    """A rank of a gexmk job: its settings (pinned, spinning), then
    bench/waiting.py's own worker over the states of GX_STATES."""
    spin_rank = os.environ.get("WAIT_FLOOR_SPIN_RANK")
    if spin_rank and os.environ.get("GEXMK_RANK") == spin_rank:
        os.environ["GEXMK_PROGRESS_THREAD"] = "spin"
    if pin:
        os.sched_setaffinity(0, {int(pin.split(",")[int(os.environ.get("GEXMK_RANK", "0"))])})
    sys.path.insert(0, BENCH)
    import waiting
    waiting._worker(out, iters, 0.1, True, list(GX_STATES))


def _c(exe, mode, pin, iters):
    cmd = [exe, "-p", "tcp;ofi_rxm", "-P", mode, "-s", "8", "-b", "8", "-w", "16",
           "-i", str(iters), "-t", "1", "-W", "60", "--json"] + (["--pin"] if pin else [])
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    if r.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr[-300:]}")
    j = json.loads(r.stdout)
    return [j["write_dc_lat_us"]["8"]["median"], j["read_lat_us"]["8"]["median"]]


def _gx(tmp, variant, pin, iters):
    out = os.path.join(tmp, f"gx-{variant}-{int(pin)}.json")
    env = dict(os.environ, GEXMK_TRANSPORT="ofi", GEXMK_OFI_PROVIDER="tcp;ofi_rxm")
    env.pop("GEXMK_PROGRESS_THREAD", None)
    if variant == "spin":
        env["GEXMK_PROGRESS_THREAD"] = "spin"
    elif variant in ("spin0", "spin1"):
        env["WAIT_FLOOR_SPIN_RANK"] = variant[-1]
    elif variant == "spinfd":
        env.update(GEXMK_PROGRESS_THREAD="spin", GEXMK_OFI_SPIN_FD="1")
    elif variant == "hot":
        env["GEXMK_OFI_WAIT_TUNE"] = "1000000,1000000,1"
    cmd = [sys.executable, "-P", "-m", "gexmk.run", "-n", "2", "--timeout", "120", "--",
           "-P", os.path.abspath(__file__), "--worker", out, "--iters", str(iters)] + \
        (["--pin", "0,1"] if pin else [])
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=150,
                       stdin=subprocess.DEVNULL)
    if r.returncode:
        raise RuntimeError(f"gexmk job {variant}: exit {r.returncode}: {r.stderr[-500:]}")
    with open(out + ".0") as f:
        states = json.load(f)["states"]
    return {st: [states[st]["put_us"]["median"], states[st]["get_us"]["median"]] for st in GX_STATES}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ofi-bench", required=False)
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--iters", type=int, default=3000)
    ap.add_argument("--worker")
    ap.add_argument("--pin", default="")
    ap.add_argument("--unpinned", action="store_true", help="also run each variant unpinned")
    args = ap.parse_args()
    if args.worker:
        return _worker(args.worker, args.iters, args.pin)
    runs = [(kind, pin) for kind in ("C poll", "C pollfd", "C pollfdt", "gx default", "gx spin", "gx spin0",
                                "gx spin1", "gx hot", "gx spinfd")
            for pin in ((True, False) if args.unpinned else (True,))]
    got = {}
    with tempfile.TemporaryDirectory(prefix="gexmk-wait-floor-") as tmp:
        for rep in range(args.reps):
            random.shuffle(runs)
            for kind, pin in runs:
                try:
                    if kind.startswith("C "):
                        r = {"": _c(args.ofi_bench, kind[2:], pin, args.iters * 3)}
                    else:
                        r = _gx(tmp, kind[3:], pin, args.iters)
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    print(f"rep {rep} {kind} pin={pin}: {e}", file=sys.stderr)
                    continue
                for state, (pu, ge) in r.items():
                    got.setdefault((kind, state, pin), []).append((pu, ge))
            print(f"rep {rep} done (load {os.getloadavg()[0]:.2f})", file=sys.stderr, flush=True)
    base = {}
    print(f"{'variant':<24} {'pinned':<7} {'put median [range] us':<28} {'get median [range] us':<28} "
          f"{'n':>2}  put/get vs C poll")
    for key in sorted(got, key=lambda k: (not k[2], k[0], k[1])):
        kind, state, pin = key
        xs = got[key]
        pu = statistics.median(x[0] for x in xs)
        ge = statistics.median(x[1] for x in xs)
        if kind == "C poll":
            base[pin] = (pu, ge)
        b = base.get(pin)
        ratio = f"{pu / b[0]:.3f} / {ge / b[1]:.3f}" if b else ""
        name = kind + (f" ({state})" if state else "")
        print(f"{name:<24} {str(pin):<7} "
              f"{pu:6.2f} [{min(x[0] for x in xs):.2f}-{max(x[0] for x in xs):.2f}]{'':<10} "
              f"{ge:6.2f} [{min(x[1] for x in xs):.2f}-{max(x[1] for x in xs):.2f}]{'':<10} "
              f"{len(xs):>2}  {ratio}")


if __name__ == "__main__":
    sys.exit(main())
