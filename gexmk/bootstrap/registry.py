"""Bootstrap plug-ins and the choice among them, from the environment, as
transports are chosen (GEXMK_TRANSPORT).

Each plug-in is a module of this package with ``NAME``, ``detect(environ)``
(a sentence saying why the environment names it, or None), ``create(environ,
comm=None)`` (the job's :class:`~gexmk.bootstrap.client.Bootstrap`; collective)
and optionally ``available()`` (None, or why it cannot run here).  The first
plug-in of :data:`ORDER` whose ``detect`` answers is used; GEXMK_BOOTSTRAP_KIND
names one instead.  :func:`explain` gives the choice and every reason, for
``python -m gexmk.info``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import warnings

from gexmk.errors import BootstrapError

#: Plug-ins in the order their environments are tried.  torchrun's workers inherit
#: an srun task's (or a PMIx client's) variables, so torchrun's come first; a
#: program that already imported mpi4py's MPI keeps MPI (see :func:`explain`).
ORDER = ("launcher", "torchrun", "pmix", "slurm", "mpi", "single")


def plugin(name: str):
    """The module of plug-in ``name``."""
    if name not in ORDER:
        raise BootstrapError(f"unknown bootstrap {name!r}: one of {', '.join(ORDER)}")
    return importlib.import_module(f"gexmk.bootstrap.{name}")


def _available(name: str) -> str | None:
    mod = plugin(name)
    check = getattr(mod, "available", None)
    return check() if check is not None else None


def _mpi4py_missing() -> str | None:
    try:
        found = importlib.util.find_spec("mpi4py") is not None
    except (ImportError, ValueError):  # blocked (sys.modules["mpi4py"] = None)
        found = False
    return None if found else "mpi4py is not importable"


#: Variables in which MPI launchers give the job's size.
_MPI_SIZES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")


def explain(environ=None, comm=None) -> dict:
    """Which plug-in a process with ``environ`` (default ``os.environ``) would use, and
    why: ``{"name", "reason", "considered": [(name, verdict), ...]}``; ``name`` is
    None where the environment is inconsistent or its plug-in cannot run here
    (``reason`` says how; ``blocked``: that plug-in).  Imports
    nothing heavy and starts nothing."""
    environ = os.environ if environ is None else environ
    seen = []
    if comm is not None:
        return {"name": "mpi", "reason": "an mpi4py communicator was passed to gexmk.init(comm=)",
                "considered": seen}
    forced = environ.get("GEXMK_BOOTSTRAP_KIND", "").strip()
    if forced:
        if forced not in ORDER:
            return {"name": None, "reason": f"GEXMK_BOOTSTRAP_KIND={forced!r} is not one of "
                                            f"{', '.join(ORDER)}", "considered": seen}
        why = _available(forced) if forced != "mpi" else _mpi4py_missing()
        if why:
            return {"name": None, "reason": f"GEXMK_BOOTSTRAP_KIND={forced}, but {why}",
                    "considered": seen, "blocked": forced}
        return {"name": forced, "reason": f"GEXMK_BOOTSTRAP_KIND={forced}", "considered": seen}
    from gexmk.bootstrap import mpi
    for name in ORDER:
        mod = plugin(name)
        why = mod.detect(environ)
        if why is None:
            seen.append((name, "its environment is absent"))
            continue
        if name == "launcher":
            return {"name": name, "reason": why, "considered": seen}
        if mpi.in_use() and mpi.detect(environ) and name != "mpi":
            seen.append((name, f"{why}, but the program imported mpi4py.MPI: MPI's own "
                               f"launcher protocol is used"))
            continue
        missing = _mpi4py_missing() if name == "mpi" else _available(name)
        if missing is None:
            return {"name": name, "reason": why, "considered": seen}
        if name in ("torchrun",):  # nothing else can stand in for its store
            return {"name": None, "reason": f"{why}, but {missing}", "considered": seen,
                    "blocked": name}
        seen.append((name, f"{why}, but {missing}"))
    raise AssertionError("the single plug-in always applies")  # pragma: no cover


def from_environment(comm=None):
    """Find this process's job and return its Bootstrap (collective over the job);
    see :func:`gexmk.bootstrap.from_environment`."""
    if comm is not None:
        boot = plugin("mpi").from_comm(comm)
        boot.reason = explain(comm=comm)["reason"]
        return boot
    choice = explain(os.environ)
    name = choice["name"]
    if name is None:
        if choice.get("blocked") and choice["blocked"] != "mpi":
            # The plug-in checks its variables first, then raises for what is missing,
            # so an inconsistent environment is named either way.
            plugin(choice["blocked"]).create(os.environ)
        raise BootstrapError(f"cannot set up the job: {choice['reason']}")
    if name == "single":
        # An MPI launcher's environment without mpi4py (nor PMIx): a job of one process
        # where the launcher says so or says nothing, loudly; an error where it says the
        # job has several, which would otherwise run as that many jobs of one.
        mpi_note = dict(choice["considered"]).get("mpi")
        if mpi_note and "but" in mpi_note:
            for var in _MPI_SIZES:
                text = os.environ.get(var, "").strip()
                if text.isdigit() and int(text) > 1:
                    raise BootstrapError(
                        f"{var}={text}: an MPI launcher started this process as one of a job of "
                        f"{text}, but no bootstrap can join it ({mpi_note}; "
                        + "; ".join(f"{n}: {v}" for n, v in choice["considered"]
                                    if v != "its environment is absent" and n != "mpi")
                        + "); install mpi4py, or build gexmk with pmix.h (libpmix-dev)")
            warnings.warn(f"an MPI launcher environment was found but mpi4py is not importable; "
                          f"this process runs as a single-process gexmk job ({mpi_note})",
                          RuntimeWarning, stacklevel=3)
    boot = plugin(name).create(os.environ)
    boot.reason = choice["reason"]
    return boot
