"""The local job launcher: ``python -m gexmk.run -n N [options] (prog.py | -m module) [args...]``
(``-c command`` works too).

Starts N ranks of a Python program on this host, each a new interpreter
(``sys.executable``), and hosts the job's rendezvous server
(:class:`gexmk.bootstrap.RendezvousServer`) on an abstract-namespace Unix socket,
or on TCP with ``--bootstrap-listen``.  Each rank finds it through its
environment:

- ``GEXMK_RANK``: the rank, ``0..N-1``;
- ``GEXMK_SIZE``: N;
- ``GEXMK_BOOTSTRAP``: the server address (``@name``, an abstract socket, or
  ``host:port``);
- ``GEXMK_BOOTSTRAP_TOKEN``: this rank's secret, different for every rank: the
  server admits rank R only with R's secret and, on the Unix socket without
  ``--rank-prefix``, only from the process started as R or a descendant of it
  (the kernel says which process connects), so neither another rank nor a
  stray process can join in R's place;
- ``GEXMK_JOBID``: an identifier unique to this job;
- ``IPATH_NO_BACKTRACE=1`` and ``HFI_NO_BACKTRACE=1``, unless set already: they
  keep the crash handlers of the psm libraries that libfabric loads out of the
  ranks, so that a rank that crashes is reported killed by its signal
  (:func:`gexmk.bootstrap.keep_crash_signals`).

Options:

``-n N``/``--np N``
    Number of ranks (required).
``--timeout SECONDS``
    Kill the whole job after this long and exit with 124.
``--keep-going``
    Let the other ranks run on when one fails (they see it as a dead peer).
``--bootstrap-listen HOST``
    Serve the rendezvous on TCP ``HOST``, port chosen by the kernel, instead of
    the abstract Unix socket, which only processes of the launcher's network
    namespace can reach.  ``HOST`` is an address (or name) of this machine that
    every rank can connect to; as on the Unix socket, a rank is admitted only
    with its own secret.
``--rank-prefix 'CMD ARGS...'``
    Run each rank as ``CMD ARGS... python prog.py ...``.  The text is split
    like a shell would (:func:`shlex.split`, no expansion), then ``{rank}`` and
    ``{size}`` in each word are replaced (``{{``/``}}`` for literal braces).
    Example: ``--rank-prefix 'ip netns exec ns{rank}'`` puts rank R in network
    namespace ``nsR`` (pair it with ``--bootstrap-listen``: abstract sockets do
    not cross namespaces).  The prefix should *exec* the program, as
    ``ip netns exec``, ``env``, ``nice``, ``taskset`` and ``numactl`` do: the
    rank then keeps the process the launcher started, with its parent-death
    signal (which the kernel clears only on exec of a set-user-ID or
    file-capability program, such as ``sudo``).  A prefix that forks instead
    still runs in the rank's process group and is killed with it, but the
    program is then not the launcher's child and its exit status is whatever
    the prefix returns.

Ranks run as ``python -P ...`` (Python 3.11 and later): neither the script's
directory nor the working directory goes first on ``sys.path``, so a
``gexmk/`` folder there (a source checkout) cannot shadow the installed
package.  A program that imports modules from its own directory names it in
``PYTHONPATH``.

Supervision: SIGINT, SIGTERM and SIGHUP are forwarded to every rank (a second
one kills them outright).  When a rank exits non-zero or by a signal, the
launcher prints ``[gexmk.run] rank R exited with code C`` or ``[gexmk.run]
rank R was killed by SIGNAME (exit status 128+N)`` on stderr and, unless
``--keep-going``, stops the others with SIGTERM, then SIGKILL after
:data:`GRACE` seconds; deaths it caused itself are not printed.  Exit status:
0 when every rank succeeded, else that of the rank that failed first in time
(128+signum for a death by signal), 124 on ``--timeout``.  A rank failed when
its process exited, or earlier when the rendezvous saw its connection close
without a goodbye: a rank that fails because another died (it hears of the
death from the rendezvous) is never blamed for it.  Each rank leads its own
process group, which is killed as a whole, and the launcher waits for every
rank: nothing is left running, and the abstract socket leaves no file behind;
if the launcher itself is killed, the kernel kills the ranks (Linux
parent-death signal).  Rank 0 inherits the launcher's stdin, the other ranks
read from /dev/null; stdout and stderr are shared.  A process joins a job once: after its bootstrap is closed it cannot
connect again.

From Python: :func:`launch`.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import selectors
import shlex
import signal
import subprocess
import sys
import threading
import time

from gexmk.bootstrap import RendezvousServer, keep_crash_signals
from gexmk.errors import ArgumentError, BootstrapError

__all__ = ["launch", "main", "GRACE", "TIMEOUT_EXIT"]

#: Seconds between SIGTERM and SIGKILL when the launcher stops ranks.
GRACE = 2.0

#: Exit status when --timeout expires (as coreutils' timeout).
TIMEOUT_EXIT = 124

_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

# Every rank starts as this tiny isolated interpreter, which asks the kernel to SIGKILL
# it when the launcher dies (even by SIGKILL, when no clean-up code can run), then
# execs the real command line (a --rank-prefix first, found on PATH); the setting
# survives exec, except of a set-user-ID or file-capability program.  A pre-exec hook
# would do the same without the extra exec, but is unsafe with the server thread running.
_RANK_WRAPPER = """\
import os, sys
try:
    import ctypes
    ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL
except (ImportError, OSError, AttributeError):
    pass  # not Linux: ranks just lose the rendezvous server when the launcher dies
if os.getppid() != int(sys.argv[1]):
    os._exit(1)  # the launcher died before the line above took effect
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as exc:
    print(f"[gexmk.run] rank {os.environ.get('GEXMK_RANK')}: cannot run {sys.argv[2]!r}: {exc}",
          file=sys.stderr, flush=True)
    os._exit(127)
"""
_POLL = 0.02  # seconds between checks for signals and deadlines; exits wake the launcher at once

# libfabric's shm provider (1.17) names a region /dev/shm/<pid>:<n>:<m> after the
# process that opened it, and only that process unlinks it: a rank killed (by
# itself, a peer's failure, the launcher) leaves its regions behind.
_SHM_DIR = "/dev/shm"
_SHM_REGION = re.compile(r"(\d+):\d+:\d+")
_SHM_EVERY = 0.25   # seconds between looks for regions our ranks (or their children) open


def _shm_names():
    try:
        return set(os.listdir(_SHM_DIR))
    except OSError:
        return set()


def _alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")

# Seconds within which a rank whose rendezvous connection closed without a goodbye is
# expected to be reaped, for that closing to count as the moment it failed.
_DYING = 1.0

# No script directory or working directory first on the ranks' sys.path (Python 3.11+).
_SAFE_PATH = ("-P",) if sys.version_info >= (3, 11) else ()


def _log(text):
    print(f"[gexmk.run] {text}", file=sys.stderr, flush=True)


def _exit_code(returncode: int) -> int:
    """Popen's returncode (-signum for a signal death) as a shell exit status."""
    return returncode if returncode >= 0 else 128 - returncode


def _describe_exit(returncode: int) -> str:
    """How a rank ended, from Popen's returncode, for the launcher's report."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"was killed by {name} (exit status {_exit_code(returncode)})"


def _descends_from(pid: int, ancestor: int) -> bool:
    """True when process ``pid`` is ``ancestor`` or a descendant of it (Linux /proc)."""
    for _ in range(64):  # bounded: a chain this long is not a rank's
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            return False
        # field 4 (ppid) follows the parenthesised command name, which may hold spaces
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return False


class _ExitWaiter:
    """Sleeps until a rank exits or a timeout passes: one pidfd per rank (Linux 5.3+),
    so that the launcher notes each exit when it happens; without pidfds it just sleeps."""

    def __init__(self):
        self._sel = selectors.DefaultSelector()
        self._fds = {}  # rank -> pidfd

    def add(self, rank, pid):
        try:
            fd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            return  # the timeout of wait() paces the checks instead
        self._fds[rank] = fd
        self._sel.register(fd, selectors.EVENT_READ)

    def forget(self, rank):
        fd = self._fds.pop(rank, None)
        if fd is not None:
            self._sel.unregister(fd)
            os.close(fd)

    def wait(self, timeout):
        if self._fds:
            self._sel.select(timeout)
        else:
            time.sleep(timeout)

    def close(self):
        for rank in list(self._fds):
            self.forget(rank)
        self._sel.close()


def _signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to process group ``pgid``; False if the group is gone."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:  # a member changed its credentials: not ours to kill
        return False


class _Job:
    """One run of the launcher: the ranks, the server and the supervision state."""

    def __init__(self, n, argv, timeout, keep_going, env, listen=None, prefixes=None):
        self.n = n
        self.argv = argv
        self.timeout = timeout
        self.keep_going = keep_going
        self.env = env
        self.listen = listen          # TCP host for the rendezvous server, or None (Unix)
        self.prefixes = prefixes      # rank -> list of words before the interpreter, or None
        self.jobid = f"{os.getpid()}-{secrets.token_hex(4)}"
        self.procs = {}          # rank -> Popen, every rank started
        self.spawn_lock = threading.Lock()  # held from a rank's fork until procs has it
        self.running = {}        # rank -> Popen, not reaped yet
        self.signals = []        # signals received, to forward (filled by the handler)
        self.forwarded = 0       # how many signals were forwarded
        self.quiet_since = None  # monotonic time from which deaths are our doing (not reported)
        self.kill_at = None      # monotonic time to escalate SIGTERM to SIGKILL
        self.first_failure = None  # (monotonic time, exit status) of the earliest failure
        self.failed = []         # (time, rank, returncode) found but not yet reported
        self.waiter = _ExitWaiter()
        self.shm_before = set()  # /dev/shm names that were there before the ranks
        self.shm_pids = set()    # pids of our processes seen owning shm regions
        self.shm_next = 0.0      # monotonic time of the next look

    def run(self) -> int:
        if self.listen is None:
            # Without a prefix, a rank is the process we started (it execs in place): the
            # kernel's word on who connects backs its secret, which a process of the same
            # user could read in /proc/PID/environ.  A prefix may fork or hand the rank to
            # another supervisor, so there the secret alone decides.
            admit = self._is_rank_process if self.prefixes is None else None
            server = RendezvousServer(self.n, name=f"gexmk-{self.jobid}", admit=admit)
        else:
            server = RendezvousServer(self.n, tcp=True, host=self.listen)
        server.start()
        saved = self._install_handlers()
        try:
            self._spawn(server)
            return self._supervise(server)
        finally:
            self._cleanup()
            self._restore_handlers(saved)
            server.close()

    # -- signals --------------------------------------------------------------------------

    def _on_signal(self, signum, frame):
        # Only record: forwarding happens in the supervision loop, outside the handler.
        self.signals.append(signum)

    def _install_handlers(self):
        if threading.current_thread() is not threading.main_thread():
            return {}  # signal handlers can only be set from the main thread
        return {sig: signal.signal(sig, self._on_signal) for sig in _FORWARDED}

    @staticmethod
    def _restore_handlers(saved):
        for sig, handler in saved.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)

    def _forward_signals(self):
        while self.signals:
            sig = self.signals.pop(0)
            self._go_quiet()
            self.forwarded += 1
            if self.forwarded == 1:
                self._signal_running(sig)
            else:
                _log(f"received {signal.Signals(sig).name} again; killing all ranks")
                self._signal_running(signal.SIGKILL)

    # -- ranks ----------------------------------------------------------------------------

    def _spawn(self, server):
        base = dict(os.environ if self.env is None else self.env)
        base.update(GEXMK_SIZE=str(self.n), GEXMK_BOOTSTRAP=server.address, GEXMK_JOBID=self.jobid)
        keep_crash_signals(base)  # a rank may load libfabric before (or without) gexmk
        self.shm_before = _shm_names()
        wrapper = [sys.executable, "-I", "-S", "-c", _RANK_WRAPPER, str(os.getpid())]
        for rank in range(self.n):
            prefix = self.prefixes[rank] if self.prefixes is not None else []
            cmd = [*wrapper, *prefix, sys.executable, *_SAFE_PATH, *self.argv]
            # The secret binds the rank to this process (and what it execs): it travels
            # in this environment only, which other users cannot read.
            env = dict(base, GEXMK_RANK=str(rank), GEXMK_BOOTSTRAP_TOKEN=server.token(rank))
            try:
                # A new session makes each rank lead a process group that can be killed
                # whole (its own children included), and keeps terminal signals from
                # reaching it twice (directly, then forwarded).
                with self.spawn_lock:
                    proc = subprocess.Popen(cmd, env=env,
                                            stdin=None if rank == 0 else subprocess.DEVNULL,
                                            start_new_session=True)
                    self.procs[rank] = self.running[rank] = proc
            except OSError as exc:
                raise BootstrapError(f"cannot start rank {rank} ({sys.executable}): {exc}") from exc
            self.waiter.add(rank, proc.pid)

    def _is_rank_process(self, rank, pid):
        # Server thread.  A rank can connect only once its Popen has forked; the lock
        # makes us wait until that Popen's result is recorded.
        with self.spawn_lock:
            proc = self.procs.get(rank)
        return proc is not None and _descends_from(pid, proc.pid)

    def _signal_running(self, sig):
        for proc in self.running.values():
            _signal_group(proc.pid, sig)

    def _go_quiet(self):
        if self.quiet_since is None:
            self.quiet_since = time.monotonic()

    def _terminate(self):
        """Stop every running rank: SIGTERM now, SIGKILL after GRACE seconds."""
        self._go_quiet()
        if self.kill_at is None:
            self._signal_running(signal.SIGTERM)
            self.kill_at = time.monotonic() + GRACE

    def _supervise(self, server) -> int:
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        timed_out = False
        while self.running:
            self._forward_signals()
            seen = time.monotonic()  # every exit found below happened before this
            for rank, proc in list(self.running.items()):
                returncode = proc.poll()
                if returncode is None:
                    continue
                del self.running[rank]
                self.waiter.forget(rank)
                server.process_exited(rank, proc.pid)
                if returncode != 0:
                    self.failed.append((self._failure_time(server, rank, seen), rank, returncode))
            for when, rank, returncode in self._settled_failures(server):
                if self.quiet_since is None or when < self.quiet_since:
                    _log(f"rank {rank} {_describe_exit(returncode)}")
                if self.first_failure is None or when < self.first_failure[0]:
                    self.first_failure = (when, _exit_code(returncode))
                if not self.keep_going and self.running:
                    self._terminate()
            now = time.monotonic()
            if deadline is not None and now >= deadline and self.running and not timed_out:
                timed_out = True
                _log(f"timeout: the job ran longer than --timeout {self.timeout:g} s; "
                     f"killing all {len(self.running)} running rank(s)")
                self._terminate()
            if self.kill_at is not None and now >= self.kill_at:
                self._signal_running(signal.SIGKILL)
                self.kill_at = float("inf")  # once
            if now >= self.shm_next:
                self.shm_next = now + _SHM_EVERY
                self._track_shm()
            if self.running:
                self.waiter.wait(_POLL)
        if timed_out:
            return TIMEOUT_EXIT
        return 0 if self.first_failure is None else self.first_failure[1]

    def _failure_time(self, server, rank, seen):
        """When a rank found exited at ``seen`` failed: when the rendezvous saw its
        connection close without a goodbye, if it died right after; else ``seen``.
        That comes before any failure of a rank that heard of this death."""
        lost = server.lost_at(rank)
        return lost if lost is not None and seen - lost < _DYING else seen

    def _settled_failures(self, server):
        """Pop the failures found so far that no rank still being reaped preceded, oldest
        first.  A rank whose connection closed without a goodbye in the last _DYING
        seconds failed then, and its process may not have been reaped yet."""
        now = time.monotonic()
        dying = [t for r in self.running
                 if (t := server.lost_at(r)) is not None and now - t < _DYING]
        first_dying = min(dying, default=float("inf"))
        self.failed.sort()
        settled = [f for f in self.failed if f[0] < first_dying]
        del self.failed[:len(settled)]
        return settled

    def _track_shm(self):
        """Note the pids of our processes (the ranks and what they started: their
        process groups) that own libfabric shm regions, while they live."""
        groups = {p.pid for p in self.procs.values()}
        for name in _shm_names() - self.shm_before:
            m = _SHM_REGION.fullmatch(name)
            if m is None or int(m.group(1)) in self.shm_pids:
                continue
            pid = int(m.group(1))
            try:
                if pid in groups or os.getpgid(pid) in groups:
                    self.shm_pids.add(pid)
            except OSError:
                pass        # gone already: a pid we never saw alive is not known ours

    def _remove_dead_regions(self):
        """Unlink the shm regions of our processes that are gone (a rank that
        finalized unlinked its own; a killed one could not)."""
        pids = self.shm_pids | {p.pid for p in self.procs.values()}
        for name in _shm_names():
            m = _SHM_REGION.fullmatch(name)
            if m is None or int(m.group(1)) not in pids or _alive(int(m.group(1))):
                continue
            try:
                os.unlink(os.path.join(_SHM_DIR, name))
            except OSError:
                pass

    def _cleanup(self):
        """Leave nothing behind: reap every rank, then empty their process groups."""
        for proc in self.running.values():  # only on an error path of the launcher itself
            _signal_group(proc.pid, signal.SIGKILL)
        for proc in self.running.values():
            proc.wait()
        self.running.clear()
        self.waiter.close()
        # Children a rank started stay in its group after it exited.  A group id
        # cannot be reused while the group has members, so this reaches only ours.
        groups = [p.pid for p in self.procs.values() if _signal_group(p.pid, 0)]
        if groups:
            for g in groups:
                _signal_group(g, signal.SIGTERM)
            end = time.monotonic() + GRACE
            while groups and time.monotonic() < end:
                time.sleep(_POLL)
                groups = [g for g in groups if _signal_group(g, 0)]
            for g in groups:
                _signal_group(g, signal.SIGKILL)
            end = time.monotonic() + GRACE
            while any(_signal_group(p.pid, 0) for p in self.procs.values()) and \
                    time.monotonic() < end:
                time.sleep(_POLL)
        self._remove_dead_regions()


def _rank_prefixes(template, n):
    """Every rank's prefix words from ``template`` (a str to shlex-split, or a
    sequence of str), with ``{rank}`` and ``{size}`` replaced; raises ArgumentError."""
    if isinstance(template, str):
        try:
            words = shlex.split(template)
        except ValueError as exc:
            raise ArgumentError(f"rank prefix {template!r} cannot be split into words: {exc}") from None
    else:
        words = list(template)
        if not all(isinstance(w, str) for w in words):
            raise TypeError("a rank prefix must be a str or a sequence of str")
    if not words:
        raise ArgumentError("the rank prefix is empty: give a command, e.g. 'ip netns exec ns{rank}'")
    prefixes = []
    for rank in range(n):
        try:
            prefixes.append([w.format(rank=rank, size=n) for w in words])
        except (KeyError, IndexError, ValueError, AttributeError) as exc:
            raise ArgumentError(f"rank prefix {template!r}: only {{rank}} and {{size}} may be "
                                f"replaced ({{{{ and }}}} for literal braces); {type(exc).__name__}: "
                                f"{exc}") from None
    return prefixes


def launch(n: int, argv, timeout: float | None = None, keep_going: bool = False,
           env=None, *, bootstrap_listen: str | None = None, rank_prefix=None) -> int:
    """Run a job of ``n`` ranks and return the launcher's exit status.

    ``argv`` is every rank's command line after the interpreter, e.g.
    ``["prog.py", "arg"]`` or ``["-m", "module", "arg"]``; it runs under
    ``sys.executable``.  ``timeout`` (seconds, or None) kills the job and
    returns 124 when it expires; ``keep_going`` lets the other ranks run on
    when one fails.  ``env`` (a mapping, default ``os.environ``) is the ranks'
    environment, to which the GEXMK_* variables are added.

    ``bootstrap_listen`` (a host name or address of this machine, or None)
    serves the rendezvous on TCP there instead of an abstract Unix socket, for
    ranks in other network namespaces.  ``rank_prefix`` (a str, split as by a
    shell, or a sequence of str; ``{rank}`` and ``{size}`` are replaced in
    each word) goes before every rank's interpreter, e.g.
    ``"ip netns exec ns{rank}"``; see the module docstring for what the prefix
    must do to stay supervised.

    Returns 0 when every rank exited 0, else the status of the rank that failed
    first in time (128+signum for a signal; see the module docstring).  Blocks
    until every rank has exited.  Signal forwarding (SIGINT/SIGTERM/SIGHUP) is
    installed only when called from the main thread, and the previous handlers
    are restored.  Raises
    :class:`~gexmk.errors.BootstrapError` if a rank cannot be started (the
    ones already started are killed).
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ArgumentError(f"n must be a positive number of ranks, got {n!r}")
    if isinstance(argv, str):
        raise TypeError("argv must be a list of arguments, not one string")
    argv = list(argv)
    if not argv or not all(isinstance(a, str) for a in argv):
        raise ArgumentError("argv must be a non-empty list of str: a script and its arguments, "
                            "or '-m', a module and its arguments")
    if timeout is not None and not timeout > 0:
        raise ArgumentError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
    if bootstrap_listen is not None and (not isinstance(bootstrap_listen, str)
                                         or not bootstrap_listen.strip()):
        raise ArgumentError(f"bootstrap_listen must be a host name or address, got "
                            f"{bootstrap_listen!r}")
    prefixes = None if rank_prefix is None else _rank_prefixes(rank_prefix, n)
    return _Job(n, argv, timeout, keep_going, env, listen=bootstrap_listen,
                prefixes=prefixes).run()


def _parser():
    parser = argparse.ArgumentParser(
        prog="python -m gexmk.run",
        usage="%(prog)s -n N [--timeout SECONDS] [--keep-going] [--bootstrap-listen HOST] "
              "[--rank-prefix 'CMD ...{rank}...'] (prog.py | -m module | -c cmd) [args...]",
        description="Run N ranks of a gexmk program on this host.",
        epilog="Everything from the program (or -m) on is passed to every rank unchanged.")
    parser.add_argument("-n", "--np", dest="n", type=int, required=True, metavar="N",
                        help="number of ranks")
    parser.add_argument("--timeout", type=float, metavar="SECONDS",
                        help="kill the job after SECONDS and exit with 124")
    parser.add_argument("--keep-going", action="store_true",
                        help="when a rank fails, let the others run on (they see a dead peer)")
    parser.add_argument("--bootstrap-listen", metavar="HOST",
                        help="serve the rendezvous on TCP HOST (port picked by the kernel; "
                             "each rank presents its own random secret) instead of an abstract "
                             "Unix socket, which ranks in other network namespaces cannot reach")
    parser.add_argument("--rank-prefix", metavar="'CMD ...'",
                        help="command words put before each rank's interpreter, split like a "
                             "shell does; {rank} and {size} are replaced ({{ }} for braces). "
                             "E.g. 'ip netns exec ns{rank}'. The prefix should exec the "
                             "program (ip netns exec, env, nice, taskset, numactl do): it then "
                             "keeps the rank's pid, process group and parent-death signal, so "
                             "the launcher's kill and clean-up still reach it; a prefix that "
                             "forks is killed with the rank's process group, but its exit "
                             "status stands for the rank's")
    return parser


def _split(argv):
    """Split argv into the launcher's options and the ranks' command line."""
    takes_value = ("-n", "--np", "--timeout", "--bootstrap-listen", "--rank-prefix")
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return argv[:i], argv[i + 1:]
        if arg[:2] in ("-m", "-c") and not arg.startswith("--"):
            command = [arg[:2], arg[2:], *argv[i + 1:]] if len(arg) > 2 else argv[i:]
            return argv[:i], command
        if arg in takes_value:
            i += 2
        elif arg.startswith("-"):
            i += 1  # --np=4, -n4, --keep-going, -h, or an unknown option argparse reports
        else:
            return argv[:i], argv[i:]
    return argv, []


def main(argv=None) -> int:
    """Command-line entry point; returns the exit status (see the module docstring)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    own, command = _split(argv)
    parser = _parser()
    try:
        args = parser.parse_args(own)
        if not command or command in (["-m"], ["-c"]):
            parser.error("no program given: name a script (prog.py), -m module or -c command")
        if args.n < 1:
            parser.error(f"-n must be at least 1, got {args.n}")
        if args.timeout is not None and not args.timeout > 0:
            parser.error(f"--timeout must be a positive number of seconds, got {args.timeout}")
        if args.bootstrap_listen is not None and not args.bootstrap_listen.strip():
            parser.error("--bootstrap-listen needs a host name or address")
        if args.rank_prefix is not None:
            try:
                _rank_prefixes(args.rank_prefix, args.n)
            except ArgumentError as exc:
                parser.error(f"--rank-prefix: {exc}")
    except SystemExit as exc:  # argparse's way to report usage errors and --help
        return exc.code if isinstance(exc.code, int) else 2
    try:
        return launch(args.n, command, timeout=args.timeout, keep_going=args.keep_going,
                      bootstrap_listen=args.bootstrap_listen, rank_prefix=args.rank_prefix)
    except BootstrapError as exc:
        _log(f"error: {exc}")
        return 127


if __name__ == "__main__":
    sys.exit(main())
