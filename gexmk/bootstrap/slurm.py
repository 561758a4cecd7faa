"""Bootstrap plug-in ``slurm``: a task of ``srun`` without PMIx, from Slurm's
environment alone.

Rank, size and node come from SLURM_PROCID, SLURM_STEP_NUM_TASKS (else
SLURM_NTASKS) and SLURM_STEP_NODELIST (else SLURM_NODELIST).  Rank 0 —
Slurm places task 0 on the step's first node — serves the rendezvous on a TCP
port every task derives alone: the first of SLURM_STEP_RESV_PORTS where Slurm
reserved ports for the step (``MpiParams=ports=...``), else GEXMK_SLURM_PORT,
else one in 20000..32767 hashed from SLURM_JOB_ID and SLURM_STEP_ID.  The
others connect to the first node's name on that port, retrying while rank 0
starts, up to GEXMK_TIMEOUT.

Slurm hands its tasks no secret, so the secret the server asks for is derived
from the job's identity (job, step, user): it keeps out another job's tasks
whose derived port collides with ours (they are refused, naming the rank,
instead of joining the wrong job), not a hostile process of the same cluster.
Where that matters, launch with ``srun --mpi=pmix`` (the ``pmix`` plug-in).
"""

from __future__ import annotations

import hashlib
import os
import re

from gexmk.bootstrap import hosted
from gexmk.bootstrap.wire import default_timeout
from gexmk.errors import BootstrapError

NAME = "slurm"

_WHY = "this process runs under srun (SLURM_STEP_ID is set)"


def detect(environ) -> str | None:
    """A task of an ``srun`` step: SLURM_STEP_ID (or SLURM_STEPID) and SLURM_PROCID.
    A batch script has neither a step id of its own nor a rank, so it stays a job
    of one process."""
    step = environ.get("SLURM_STEP_ID", environ.get("SLURM_STEPID"))
    if step is None or "SLURM_PROCID" not in environ:
        return None
    return (f"srun's environment (SLURM_PROCID={environ['SLURM_PROCID']}, "
            f"SLURM_STEP_ID={step}, job {environ.get('SLURM_JOB_ID', '?')})")


def first_host(nodelist: str) -> str:
    """The first host of a Slurm host list (``"n[07-09,12],gpu1"`` → ``"n07"``)."""
    item = nodelist.strip()
    depth = 0
    for i, ch in enumerate(item):  # the first top-level comma ends the first item
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            item = item[:i]
            break
    host = re.sub(r"\[([^\]]*)\]", lambda m: re.split("[,-]", m.group(1))[0], item)
    if not host or "[" in host or "]" in host:
        raise BootstrapError(f"cannot read the first host of the Slurm node list {nodelist!r}")
    return host


def port(environ) -> tuple:
    """(port, where it came from) of the step's rendezvous."""
    resv = environ.get("SLURM_STEP_RESV_PORTS", "").strip()
    if resv:
        m = re.match(r"(\d+)", resv)
        if m and 0 < int(m.group(1)) < 65536:
            return int(m.group(1)), f"SLURM_STEP_RESV_PORTS={resv}"
        raise BootstrapError(f"SLURM_STEP_RESV_PORTS={resv!r} does not start with a port number")
    text = environ.get("GEXMK_SLURM_PORT", "").strip()
    if text:
        if not text.isdigit() or not 0 < int(text) < 65536:
            raise BootstrapError(f"GEXMK_SLURM_PORT={text!r} is not a port number (1..65535)")
        return int(text), f"GEXMK_SLURM_PORT={text}"
    job, step = _ident(environ)
    h = int.from_bytes(hashlib.sha256(f"gexmk:{job}.{step}".encode()).digest()[:4], "big")
    return 20000 + h % 12768, f"hashed from SLURM_JOB_ID={job} and SLURM_STEP_ID={step}"


def _ident(environ):
    job = environ.get("SLURM_JOB_ID", environ.get("SLURM_JOBID"))
    step = environ.get("SLURM_STEP_ID", environ.get("SLURM_STEPID"))
    if not job:
        raise BootstrapError(f"{_WHY}, but SLURM_JOB_ID is not set")
    return job, step


def create(environ, comm=None):
    """Join the step's job: rank 0 serves on the first node, the others connect."""
    rank = hosted.env_int(environ, "SLURM_PROCID", _WHY)
    size_var = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in environ else "SLURM_NTASKS"
    size = hosted.env_int(environ, size_var, _WHY)
    hosted.check_rank(rank, size, "SLURM_PROCID", size_var)
    list_var = "SLURM_STEP_NODELIST" if "SLURM_STEP_NODELIST" in environ else "SLURM_NODELIST"
    nodelist = environ.get(list_var)
    if not nodelist:
        raise BootstrapError(f"{_WHY}, but neither SLURM_STEP_NODELIST nor SLURM_NODELIST is set")
    host = first_host(nodelist)
    job, step = _ident(environ)
    number, origin = port(environ)
    secret = hashlib.sha256(f"gexmk-slurm:{job}.{step}:{os.getuid()}".encode()).hexdigest()
    timeout = default_timeout()
    server = None
    if rank == 0:
        # Block and cyclic distributions put task 0 on the step's first node, where the
        # others look for it; an arbitrary one may not, and the others would wait.
        here = environ.get("SLURMD_NODENAME")
        if here and here != host:
            raise BootstrapError(f"Slurm placed rank 0 on {here}, not on the step's first node "
                                 f"{host} ({list_var}={nodelist}), where the other tasks look "
                                 f"for its rendezvous; use a block or cyclic distribution, or "
                                 f"srun --mpi=pmix")
        try:
            server = hosted.serve(size, host=hosted.listen_host(environ), port=number,
                                  tokens=[secret] * size)
        except BootstrapError as exc:
            raise BootstrapError(f"Slurm rank 0 cannot serve the rendezvous on port {number} "
                                 f"({origin}): {exc}; set GEXMK_SLURM_PORT to a free port") from None
    shown = f"[{host}]" if ":" in host else host
    return hosted.join(NAME, rank, size, f"{shown}:{number}", secret, server=server,
                       patience=timeout, timeout=timeout,
                       hint=f"rank 0 serves it on the step's first node ({list_var}={nodelist}), "
                            f"port {origin}; is rank 0 running there?")
