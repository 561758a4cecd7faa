"""Set-up for the pytest-benchmark runs in bench/ (``python -m pytest bench/ --benchmark-only``).

They run against a *built* gexmk: the installed package, or a developer build put
first with ``PYTHONPATH=<dir>`` (tools/dev_build.sh).  ``python -m pytest`` from the
repository root puts the root first on sys.path, where the source package (no
compiled modules) would shadow the built one: drop the root then.
"""
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if not any(f.startswith("core.") and f.endswith((".so", ".pyd"))
           for f in os.listdir(os.path.join(_ROOT, "gexmk"))):
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _ROOT]
