"""The conformance matrix: one pytest item per (path, target, local memory, operation, size).

The tables are in ``tables.py`` (the specification), the jobs in ``runner.py`` and
``worker.py``.  Each path's cells run in one job (restarted after a cell that crashes
or hangs); an item passes when its cell moved exact bytes with every canary intact, or
raised exactly the refusal the table names, and the path the table names carried it.
``--full`` runs every size; GPU paths (marker ``gpu``) run where a driver and a GPU
are, and are skipped elsewhere.  Besides the cells, one item per path asserts that its
job's ``finalize`` returned and every rank exited 0.
"""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import runner  # noqa: E402
import tables as T  # noqa: E402


HAVE_GPU = runner.have_gpu()
if HAVE_GPU:
    from gexmk.kinds import cuda as _cuda
    runner.GPUS = int(_cuda.probe().get("device_count") or 1)


def pytest_generate_tests(metafunc):
    full = metafunc.config.getoption("--full", default=False)
    if "cell" in metafunc.fixturenames:
        params = []
        for gpu in (False, True):
            for c in T.cells(full=full, gpu=gpu):
                marks = [pytest.mark.gpu] if gpu else []
                params.append(pytest.param(c, id=c.id, marks=marks))
        metafunc.parametrize("cell", params)
    if "path" in metafunc.fixturenames:
        metafunc.parametrize("path", [pytest.param(p, id=p.name, marks=[pytest.mark.gpu] if p.gpu else [])
                                      for p in T.PATHS])


class _Results:
    """Session-wide: each path's job runs once, for the cells this session selected."""

    def __init__(self, session):
        self.selected = {}
        for item in session.items:
            cs = getattr(item, "callspec", None)
            if cs and isinstance(cs.params.get("cell"), T.Cell):
                self.selected.setdefault(cs.params["cell"].path, []).append(cs.params["cell"])
        self.groups = {}

    def group(self, path):
        if path.name not in self.groups:
            self.groups[path.name] = runner.run_group(path, self.selected.get(path.name, []))
        return self.groups[path.name]


@pytest.fixture(scope="session")
def results(request):
    return _Results(request.session)


def _skip_gpu(path):
    if path.gpu and not HAVE_GPU:
        pytest.skip("GPU path: no NVIDIA driver, GPU or CuPy on this machine")


@pytest.mark.timeout(0)
def test_cell(cell, results):
    path = T.PATH[cell.path]
    _skip_gpu(path)
    g = results.group(path)
    if g.skipped:
        pytest.skip(g.skipped)
    v = g.verdicts.get(cell.id)
    if v is not None and not v.failure and v.records.get(0, {}).get("outcome") == "skip":
        pytest.skip(v.records[0].get("msg", ""))
    problem = runner.judge(cell, v, path)
    runner.report(cell, problem)
    assert problem is None, f"{cell.id}: {problem}"


@pytest.mark.timeout(0)
def test_finalize(path, results):
    """Each path's job ended cleanly: every rank finalized and exited 0."""
    _skip_gpu(path)
    g = results.group(path)
    if g.skipped:
        pytest.skip(g.skipped)
    assert g.finalize is None, g.finalize
    if (path.env.get("GEXMK_OFI_RING_IDLE") or path.env.get("GEXMK_RING_IDLE")) \
            and results.selected.get(path.name):
        # the path exists to release rings between operations: it did
        released = sum((c.get("ring_stats") or {}).get("released", 0) for c in g.counters.values())
        assert released > 0, f"no ring released in path {path.name}: {g.counters}; jobs: {g.log}"
