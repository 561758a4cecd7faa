"""The Cython loop module (``bench/nogil_loop.pyx``), built as an outside project would."""
from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from gexmk.bench.common import BuildError


# ---- the Cython loop module ------------------------------------------------------------

def find_bench_file(name: str):
    """A file the benchmark runs: ``gexmk/_bench/<name>`` of the installed
    package, else ``bench/<name>`` or ``examples/<name>`` of a gexmk source
    tree beside the package this module was loaded from (developer build) or
    under the current directory.  None when none has it."""
    pkg = Path(os.path.realpath(__file__)).parent.parent     # gexmk/
    p = pkg / "_bench" / name
    if p.is_file():
        return p
    for root in (pkg.parent, Path.cwd()):
        for sub in ("bench", "examples"):
            p = root / sub / name
            if p.is_file():
                return p
    return None


def installed_extension():
    """Path of the nogil loop module built and installed with the package
    (``gexmk/_bench/nogil_loop*.so``), or None."""
    d = Path(os.path.realpath(__file__)).parent.parent / "_bench"
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    p = d / ("nogil_loop" + suffix)
    return str(p) if p.is_file() else None


def _run_tool(cmd, what):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(f"{what} failed: {exc}") from exc
    if r.returncode != 0:
        tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-12:])
        raise BuildError(f"{what} failed (exit {r.returncode}):\n{tail}")


def build_extension(pyx=None, outdir=None) -> str:
    """Compile ``bench/nogil_loop.pyx`` (or ``pyx``) against the importable gexmk,
    as an outside project does (``from gexmk cimport rma``; the directory holding
    the gexmk package on Cython's include path; ``gexmk.get_include()`` for the
    C compiler), into ``outdir`` (default: a new temporary directory, left for
    the caller to remove).  Returns the path of the extension module; raises
    :class:`BuildError` saying why it could not be built."""
    import gexmk

    pyx = Path(pyx) if pyx is not None else find_bench_file("nogil_loop.pyx")
    if pyx is None:
        raise BuildError("bench/nogil_loop.pyx not found (run from a gexmk source checkout)")
    if importlib.util.find_spec("Cython") is None:
        raise BuildError("Cython is not installed (pip install cython)")
    cc = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    if not cc or shutil.which(cc[0]) is None:
        raise BuildError(f"no C compiler ({cc[0] if cc else 'CC'} not found)")
    pkg = Path(gexmk.__file__).parent
    includes = [str(pkg.parent)]
    # A tools/dev_build.sh tree links gexmk/*.pxd but not gexmk/lib/*.pxd, which
    # rma.pxd cimports: then fall back on the source tree its links point into.
    if not (pkg / "lib" / "gx.pxd").is_file():
        src_root = Path(os.path.realpath(pkg / "rma.pxd")).parent.parent
        if (src_root / "gexmk" / "lib" / "gx.pxd").is_file():
            includes.append(str(src_root))
    out = Path(outdir) if outdir is not None else Path(tempfile.mkdtemp(prefix="gexmk-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    c_file = out / (pyx.stem + ".c")
    so_file = out / (pyx.stem + sysconfig.get_config_var("EXT_SUFFIX"))
    _run_tool([sys.executable, "-m", "cython", "-3", *sum((["-I", i] for i in includes), []),
               "-o", str(c_file), str(pyx)], "cython")
    py_inc = {sysconfig.get_paths()["include"], sysconfig.get_paths()["platinclude"]}
    _run_tool([*cc, "-O2", "-shared", "-fPIC", *(f"-I{i}" for i in sorted(py_inc)),
               f"-I{gexmk.get_include()}", str(c_file), "-o", str(so_file)], "C compiler")
    return str(so_file)


def load_extension(path):
    """Import the extension module built by :func:`build_extension` from its path."""
    name = Path(path).name.split(".")[0]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
