"""Shared fixtures for the gexmk tests.

Tests run against a *built* gexmk: the installed package, or a developer build
put first with ``PYTHONPATH=<dir> python -m pytest`` (tools/dev_build.sh).
Multi-process tests run their workers through tests/mp_util.py.
"""
import os
import sys

# `python -m pytest` from the repository root puts the root first on sys.path,
# where the source package (no compiled modules) would shadow the built one.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if not any(f.startswith("core.") and f.endswith((".so", ".pyd"))
           for f in os.listdir(os.path.join(_ROOT, "gexmk"))):
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _ROOT]

import pytest  # noqa: E402

import gexmk  # noqa: E402


@pytest.fixture
def client():
    """A job of one process; finalized after the test (finalize is idempotent)."""
    c = gexmk.init()
    try:
        yield c
    finally:
        c.finalize()


@pytest.fixture
def seg(client):
    """A 64 KiB library-allocated segment bound to EP 0 and published on client.tm."""
    return client.segment_attach(1 << 16)


def pytest_addoption(parser):
    parser.addoption("--full", action="store_true", default=False,
                     help="conformance matrix: every size (default: a fast subset)")
