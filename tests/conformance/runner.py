"""Runs the matrix's cells in worker jobs and keeps every cell's verdict.

One job per path (its table row says how many ranks and which environment) runs that
path's selected cells in order.  The runner watches the ranks' logs as the job goes: a
cell that has not finished after ``CELL_TIMEOUT`` seconds is a hang (the job is killed),
a job that ends while a cell is running is that cell's crash.  Either way the cell fails
with what the launcher said, and a fresh job takes up the next cell, so one crash costs
one cell, never the run.  Nothing outlives a job: it runs in its own session and is
killed whole (tests/mp_util.py).
"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import mp_util  # noqa: E402
import tables as T  # noqa: E402

def have_gpu():
    """Whether GPU jobs can run here: an NVIDIA driver with a device, and CuPy
    (the GPU jobs fill and read device memory with it)."""
    try:
        from gexmk.kinds import cuda
        p = cuda.probe()
        if not (p.get("driver_loaded") and p.get("device_count")):
            return False
        import cupy  # noqa: F401
        return True
    except Exception:           # noqa: BLE001 - any failure means: no usable GPU
        return False


CELL_TIMEOUT = float(os.environ.get("GEXMK_CONFORMANCE_CELL_TIMEOUT", "15"))
#: A path whose cells keep crashing or hanging gives up after this long: the cells not
#: run fail as such (never reported as passed), and the run stays bounded.
GROUP_BUDGET = float(os.environ.get("GEXMK_CONFORMANCE_GROUP_BUDGET", "300"))
SETUP_TIMEOUT = 120.0
#: A job's GEXMK_TIMEOUT: a barrier whose peer is gone raises before the cell times out.
JOB_GEXMK_TIMEOUT = "10"
MAX_RESTARTS = 50
#: GPUs a job's processes see (some refusals depend on it); set by test_matrix.py.
GPUS = 1


class Verdict:
    """What became of one cell: ``records`` (each rank's, by rank) or ``failure`` (the
    job crashed or hung in it), and ``path_row`` (that of the job)."""

    def __init__(self, records=None, failure=None):
        self.records = records or {}
        self.failure = failure


class GroupResult:
    def __init__(self):
        self.verdicts = {}          # cell id -> Verdict
        self.finalize = None        # None: clean; else a sentence
        self.skipped = None         # a reason when the path is not offered here
        self.log = []               # one line per job started
        self.counters = {}          # rank -> what its worker reported at the end ("K" line)


def _read_log(path):
    """(set of started idx, {idx: record}, finalized, set up) from one rank's log."""
    started, done, fin, up = set(), {}, False, False
    try:
        with open(path) as f:
            lines = f.read().split("\n")
    except FileNotFoundError:
        return started, done, fin, up
    for line in lines[:-1]:                   # the last piece may be a partial line
        if line == "F":
            fin = True
        elif line == "U":
            up = True
        elif line.startswith("S "):
            started.add(int(line[2:]))
        elif line.startswith("R "):
            i, _, rec = line[2:].partition(" ")
            done[int(i)] = json.loads(rec)
    return started, done, fin, up


def _read_counters(path):
    """The last ``K <json>`` line of one rank's log (its transport counters), or {}."""
    got = {}
    try:
        with open(path) as f:
            for line in f.read().split("\n")[:-1]:
                if line.startswith("K "):
                    got = json.loads(line[2:])
    except FileNotFoundError:
        pass
    return got


_RAISED = re.compile(r"^[\w.]*(Error|Exception)(: |$)")


def _tail(path, n=3000):
    """The end of a job's stderr, after the exceptions raised in it: a rank's
    error is otherwise pushed out by the others' stacks (faulthandler, on the
    launcher's SIGTERM) -- a CI run's crashed ofi-capped cell showed only those."""
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except FileNotFoundError:
        return ""
    tail = text[-n:]
    raised = [l for l in text.splitlines() if _RAISED.match(l) and l not in tail][:10]
    if raised:
        return "raised (earlier in stderr):\n" + "\n".join(raised) + "\n...\n" + tail
    return tail


def _shm_entries():
    try:
        return set(os.listdir("/dev/shm"))
    except FileNotFoundError:
        return set()


def _remove_dead_regions(before):
    """libfabric's shm provider names its regions "<pid>:..." and cannot unlink those
    of a rank killed mid-cell: remove the ones this job made whose process is gone."""
    for name in _shm_entries() - before:
        pid = name.split(":", 1)[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            try:
                os.unlink(os.path.join("/dev/shm", name))
            except OSError:
                pass


def run_group(path, cells, workdir=None):
    """Run ``cells`` (all of path ``path``) and return a :class:`GroupResult`."""
    res = GroupResult()
    own = workdir is None
    workdir = workdir or tempfile.mkdtemp(prefix=f"gexmk-conf-{path.name}-")
    plan_file = os.path.join(workdir, "plan.json")
    with open(plan_file, "w") as f:
        json.dump({"path": path.name, "cells": [c.to_json() for c in cells]}, f)
    try:
        _run(path, cells, workdir, plan_file, res)
    finally:
        if own:
            import shutil
            shutil.rmtree(workdir, ignore_errors=True)
    return res


def _run(path, cells, workdir, plan_file, res):
    env = mp_util.child_env(dict(path.env, GEXMK_TIMEOUT=JOB_GEXMK_TIMEOUT,
                                 GEXMK_TEST_TRACEBACK_AFTER=None))
    start, attempt = 0, 0
    began = time.monotonic()
    while start < len(cells):
        if attempt > MAX_RESTARTS or time.monotonic() - began > GROUP_BUDGET:
            why = (f"NOT RUN: path {path.name} gave up after {attempt} jobs and "
                   f"{time.monotonic() - began:.0f} s (earlier cells crashed or hung)")
            for c in cells[start:]:
                res.verdicts[c.id] = Verdict(failure=why)
            return
        outdir = os.path.join(workdir, f"job{attempt}")
        os.mkdir(outdir)
        attempt += 1
        shm_before = _shm_entries()
        cmd = [sys.executable, "-m", "gexmk.run", "-n", str(path.ranks),
               os.path.join(HERE, "worker.py"), plan_file, outdir, str(start)]
        with open(os.path.join(outdir, "stdout"), "w") as out, \
                open(os.path.join(outdir, "stderr"), "w") as err:
            proc = subprocess.Popen(cmd, env=env, cwd=outdir, stdout=out, stderr=err,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        res.log.append(f"job {attempt} from cell {start}: pid {proc.pid}")
        seen_at = {}                 # idx -> monotonic time first seen started
        t0 = time.monotonic()
        hung = None
        try:
            while proc.poll() is None:
                time.sleep(0.2)
                logs = [_read_log(os.path.join(outdir, f"rank{r}.log")) for r in range(path.ranks)]
                now = time.monotonic()
                if not all(l[3] for l in logs):
                    if now - t0 > SETUP_TIMEOUT:
                        hung = -1
                        break
                    continue
                running = [i for l in logs for i in l[0] if not all(i in m[1] for m in logs)]
                for i in running:
                    seen_at.setdefault(i, now)
                late = [i for i in running if now - seen_at[i] > CELL_TIMEOUT]
                if late:
                    hung = min(late)
                    break
        finally:
            if proc.poll() is None:
                mp_util._kill_all(proc)
                proc.wait()
            _remove_dead_regions(shm_before)
        logs = [_read_log(os.path.join(outdir, f"rank{r}.log")) for r in range(path.ranks)]
        for r in range(path.ranks):
            res.counters[r] = _read_counters(os.path.join(outdir, f"rank{r}.log"))
        stderr = _tail(os.path.join(outdir, "stderr"))
        for i in range(start, len(cells)):
            if all(i in l[1] for l in logs):
                res.verdicts[cells[i].id] = Verdict({r: l[1][i] for r, l in enumerate(logs)})
        if hung == -1 or not all(l[3] for l in logs):
            why = ("set-up did not finish" if hung == -1 else f"set-up failed (exit {proc.returncode})")
            if "not offered" in stderr and path.skip_unless:
                res.skipped = stderr.strip().splitlines()[-1]
                return
            for c in cells[start:]:
                res.verdicts[c.id] = Verdict(failure=f"{why}:\n{stderr}")
            return
        started = set().union(*(l[0] for l in logs))
        unfinished = sorted(i for i in started if not all(i in l[1] for l in logs))
        if hung is not None:
            res.verdicts[cells[hung].id] = Verdict(
                failure=f"HANG: not finished after {CELL_TIMEOUT:.0f} s (job killed)\n{stderr}")
            start = hung + 1
            continue
        rc = proc.returncode
        if unfinished:
            i = unfinished[0]
            how = (f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit status {rc}")
            res.verdicts[cells[i].id] = Verdict(failure=f"CRASH: the job ended in this cell "
                                                        f"({how}):\n{stderr}")
            start = i + 1
            continue
        done = max((i for l in logs for i in l[1]), default=start - 1)
        if done + 1 < len(cells):          # ended between cells: blame the next one
            res.verdicts[cells[done + 1].id] = Verdict(
                failure=f"CRASH: the job ended before this cell (exit {rc}):\n{stderr}")
            start = done + 2
            continue
        if rc != 0 or not all(l[2] for l in logs):
            res.finalize = f"finalize or exit failed (exit status {rc}):\n{stderr}"
        start = len(cells)


def report(cell, problem):
    """Append the cell's verdict to $GEXMK_CONFORMANCE_REPORT (one line each), so a run
    cut short (a device machine's time limit) still says what every judged cell did."""
    dest = os.environ.get("GEXMK_CONFORMANCE_REPORT")
    if dest:
        with open(dest, "a") as f:
            p = problem or ""
            if len(p) > 2400:        # a crash's message ends with the stderr that says why
                p = p[:400] + " [...] " + p[-2000:]
            f.write(f"{cell.id}\t{'ok' if problem is None else 'FAIL'}\t{p!r}\n")


def _judge_one(rec, refusal, who):
    if refusal is None:
        if rec.get("outcome") != "ok":
            return f"{who}raised {rec['exc'][0]}: {rec['msg']}\n{rec.get('tb', '')}"
        return f"{who}{rec['local']}" if rec.get("local") else None
    if rec.get("outcome") == "ok":
        return f"{who}succeeded, but the table says {refusal.exc} ({refusal.why})"
    if refusal.exc not in rec["exc"] or refusal.match.lower() not in rec["msg"].lower():
        return f"{who}raised {rec['exc'][0]}: {rec['msg']}; the table says {refusal.exc} ({refusal.why})"
    return None


def judge(cell, verdict, path):
    """None if the cell conforms, else a sentence saying how it does not."""
    if verdict is None:
        return "no verdict (the runner gave up on its job)"
    if verdict.failure:
        return verdict.failure
    recs = verdict.records
    init, tgt = recs[0], recs[path.ranks - 1]
    refusal = T.expect(cell, gpus=GPUS)
    if cell.op.startswith("coll_"):
        return "; ".join(filter(None, (_judge_one(r, refusal, f"rank {k}: ")
                                       for k, r in sorted(recs.items())))) or None
    out = init.get("outcome")
    if out == "skip":
        return None
    problems = []
    if refusal is None:
        if out != "ok":
            problems.append(f"raised {init['exc'][0]}: {init['msg']}\n{init.get('tb', '')}")
        want_path = T.expected_path(path, T.TARGET_BY[cell.target], cell.local)
        if init.get("path") != want_path:
            problems.append(f"took path {init.get('path')!r}, the table says {want_path!r}")
        if init.get("local"):
            problems.append(f"local buffer: {init['local']}")
        if tgt.get("region"):
            problems.append(f"target segment: {tgt['region']}")
        if tgt.get("at_signal"):
            problems.append(f"data when the signal was seen: {tgt['at_signal']}")
    else:
        if out == "ok":
            problems.append(f"succeeded, but the table says it refuses with {refusal.exc} "
                            f"({refusal.why})")
        elif refusal.exc not in init["exc"]:
            problems.append(f"raised {init['exc'][0]}: {init['msg']}; the table says "
                            f"{refusal.exc} ({refusal.why})")
        elif refusal.match.lower() not in init["msg"].lower():
            problems.append(f"{refusal.exc} does not name {refusal.match!r}: {init['msg']}")
        if tgt.get("unchanged"):
            problems.append(f"refused, yet the target segment changed: {tgt['unchanged']}")
    return "; ".join(problems) or None
