"""Run a worker script as a multi-process gexmk job, from a test.

Every multi-process test writes its worker (the code each rank runs) into
``tmp_path`` and runs it with :func:`run_job`, which starts
``python -m gexmk.run -n N --timeout S worker.py`` with the test's environment
(PYTHONPATH included, so the dev build and the installed package both work),
waits at most a bounded time, and on overrun kills the launcher and every
process it started, so a hung job can never hang CI.

Workers assert and exit non-zero on failure; the launcher propagates the exit
code.  :data:`PRELUDE` is prepended to each worker: it imports gexmk and
numpy and defines ``log(...)`` (stderr, prefixed with the job rank).
"""
import os
import signal
import subprocess
import sys
import textwrap
import time

#: Prepended to every worker script.
PRELUDE = '''\
import os, sys, time, signal, faulthandler
# a hung worker shows where it hangs before the harness kills it
if float(os.environ.get("GEXMK_TEST_TRACEBACK_AFTER") or 0) > 0:
    faulthandler.dump_traceback_later(float(os.environ["GEXMK_TEST_TRACEBACK_AFTER"]), exit=False)
import numpy as np
import gexmk
from gexmk import errors as E

def log(*args):
    print(f"[rank {os.environ.get('GEXMK_RANK', os.environ.get('PMI_RANK', '?'))}]", *args,
          file=sys.stderr, flush=True)

def peer_transport():
    """What tm.transport(r) must say of a library-allocated segment of another
    process of this node, under this job's GEXMK_TRANSPORT."""
    return "pvm" if os.environ.get("GEXMK_TRANSPORT", "auto") == "pvm" else "nbrhd"

def pattern(n, *tag):
    """n bytes of data unique to the integers ``tag`` (e.g. src, dst, flavour)."""
    return np.random.default_rng([int(t) + 1 for t in tag]).integers(0, 256, n, dtype=np.uint8)

def expect_raises(exc, fn, *args, **kw):
    """Call fn and assert it raises exc; return the exception."""
    try:
        fn(*args, **kw)
    except exc as e:
        return e
    except BaseException as e:
        raise AssertionError(f"{getattr(fn, '__name__', fn)}{args} raised {type(e).__name__}: {e}, "
                             f"expected {exc.__name__}") from e
    raise AssertionError(f"{getattr(fn, '__name__', fn)}{args} did not raise {exc.__name__}")
'''


class JobResult:
    """Outcome of a job: ``returncode``, ``stdout``, ``stderr``, ``elapsed`` (s),
    ``timed_out`` (the harness had to kill it), ``script`` (path) and
    ``pid`` (the launcher's pid)."""

    def __init__(self, returncode, stdout, stderr, elapsed, timed_out, script, pid):
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        self.elapsed = elapsed
        self.timed_out = timed_out
        self.script = script
        self.pid = pid
        self.shm_files = set()      # run_command(watch_shm=...): /dev/shm files the job held

    def __repr__(self):
        return f"<JobResult rc={self.returncode} {self.elapsed:.1f}s timed_out={self.timed_out}>"

    def report(self):
        """Everything worth printing when an assertion about the job fails."""
        return (f"job {self.script} rc={self.returncode} after {self.elapsed:.1f} s"
                f"{' (killed by the test harness)' if self.timed_out else ''}\n"
                f"--- stdout ---\n{self.stdout}\n--- stderr ---\n{self.stderr}")

    def check(self, rc=0):
        """Assert the job ended with exit code ``rc`` and was not killed.
        Skips the test when the machine forbids process_vm_* between sibling
        processes (yama ptrace_scope), which the pvm transport needs."""
        assert not self.timed_out, self.report()
        if self.returncode != rc and "process_vm_* not permitted" in self.stderr:
            import pytest
            pytest.skip("process_vm_* between processes is not permitted on this machine "
                        "(ptrace_scope); the pvm transport cannot be tested")
        assert self.returncode == rc, self.report()
        return self


def write_worker(tmp_path, source, name="worker.py", prelude=True):
    """Write ``source`` (dedented, after :data:`PRELUDE`) to ``tmp_path/name``."""
    path = os.path.join(str(tmp_path), name)
    text = textwrap.dedent(source)
    with open(path, "w") as f:
        f.write((PRELUDE + "\n" if prelude else "") + text)
    return path


def child_env(extra=None):
    """The test's environment plus ``extra`` (None values remove a variable)."""
    # PYTHONPATH travels as is: workers import the gexmk the test run was pointed at
    # (a dev build on PYTHONPATH, or the installed package).  They run in tmp_path,
    # so an uncompiled source tree in the test's cwd cannot shadow it.
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    for k, v in (extra or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = str(v)
    return env


def descendants(pid):
    """Pids of every live descendant of ``pid`` (scan of /proc; no psutil)."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # field 4 (ppid) follows the parenthesised command name, which may hold spaces
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in children.get(p, ()):
            out.append(c)
            todo.append(c)
    return out


def processes_running(marker):
    """Pids of live (non-zombie) processes whose command line contains ``marker``."""
    found = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmd and state != "Z":
            found.append(int(entry))
    return found


def _kill_all(proc):
    """Kill the launcher's process group and every descendant, by pid."""
    pids = descendants(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGKILL)     # the launcher leads its own session
    except OSError:
        pass
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass


def shm_mapped(pids, prefixes):
    """Names of the /dev/shm files whose name starts with one of ``prefixes``
    that the processes ``pids`` hold mapped or open now (unlinked ones left
    out: nothing of them is left to remove)."""
    found = set()
    for pid in pids:
        paths = []
        try:
            with open(f"/proc/{pid}/maps") as f:
                paths += [line.split(None, 5)[5].strip() for line in f
                          if "/dev/shm/" in line and len(line.split(None, 5)) == 6]
        except OSError:
            pass
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            fds = []
        for fd in fds:
            try:
                paths.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
            except OSError:
                pass
        for path in paths:
            if not path.startswith("/dev/shm/") or path.endswith(" (deleted)"):
                continue
            name = path[len("/dev/shm/"):]
            if "/" not in name and name.startswith(tuple(prefixes)):
                found.add(name)
    return found


class _ShmWatch:
    """Notes, while a job runs, which /dev/shm files (names starting with one
    of ``prefixes``) its processes map or hold open: what the job made, and
    nothing a concurrent job made.  A file that a process made and lost within
    one ``interval`` can be missed (then it is left, never another's removed)."""

    def __init__(self, root_pid, prefixes, interval=0.1):
        import threading
        self.root, self.prefixes, self.interval = root_pid, tuple(prefixes), interval
        self.seen = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def scan(self):
        self.seen |= shm_mapped(descendants(self.root) + [self.root], self.prefixes)

    def _run(self):
        while not self._stop.wait(self.interval):
            self.scan()

    def stop(self):
        self._stop.set()
        self._thread.join()


def run_command(cmd, *, timeout, env=None, cwd=None, script="", watch_shm=()):
    """Run ``cmd`` in a new session; kill it and all its descendants after
    ``timeout`` seconds.  Returns a :class:`JobResult`.  Workers (PRELUDE)
    print every thread's stack to stderr shortly before that.

    ``watch_shm``: prefixes of /dev/shm names; the result's ``shm_files`` then
    holds the names of such files the job's processes mapped or held open
    (sampled while it ran, and just before a kill): the job's own, for a
    clean-up that must not touch a concurrent job's (:func:`remove_shm`)."""
    env = dict(os.environ if env is None else env)
    env.setdefault("GEXMK_TEST_TRACEBACK_AFTER", str(max(1.0, timeout - 5)))
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, start_new_session=True, text=True)
    watch = _ShmWatch(proc.pid, watch_shm) if watch_shm else None
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        if watch:
            watch.scan()            # alive still: what they hold now
        _kill_all(proc)
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:   # a grandchild holds the pipes open
            out, err = "", "(output lost: pipes held open after kill)"
    except BaseException:                   # e.g. pytest-timeout's exception: leave nothing behind
        if watch:
            watch.scan()
        _kill_all(proc)
        proc.wait()
        if watch:
            watch.stop()
            remove_shm(watch.seen)
        raise
    finally:
        if watch:
            watch.stop()
    res = JobResult(proc.returncode, out, err, time.monotonic() - t0, timed_out, script, proc.pid)
    res.shm_files = set(watch.seen) if watch else set()
    return res


def remove_shm(names):
    """Unlink /dev/shm/<name> for each of ``names`` still there (a job's own
    files: see run_command's ``watch_shm``)."""
    for name in names:
        try:
            os.unlink(os.path.join("/dev/shm", name))
        except OSError:
            pass


def run_job(tmp_path, source, n, *, launcher_timeout=60, timeout=None, keep_going=False,
            env=None, args=(), name="worker.py", prelude=True):
    """Write ``source`` as a worker and run it on ``n`` ranks under the launcher.

    ``launcher_timeout``: passed as ``--timeout`` (the launcher's own limit);
    ``timeout``: the harness's hard limit (default launcher_timeout + 15 s);
    ``env``: extra environment variables (None removes one).
    """
    script = write_worker(tmp_path, source, name=name, prelude=prelude)
    cmd = [sys.executable, "-m", "gexmk.run", "-n", str(n), "--timeout", str(launcher_timeout)]
    if keep_going:
        cmd.append("--keep-going")
    cmd += [script, *map(str, args)]
    if timeout is None:
        timeout = launcher_timeout + 15
    return run_command(cmd, timeout=timeout, env=child_env(env), cwd=str(tmp_path), script=script)
