"""The heat-equation example (examples/heat.py; installed as
gexmk/_bench/heat.py) at 2 ranks on a small grid, under ``python -m gexmk.run``:
its result must equal the serial numpy computation bit for bit (the example
checks, and says so; a wrong halo changes the result)."""
import json
import os
import sys

import pytest

try:
    from . import mp_util
except ImportError:
    import mp_util

from gexmk import bench


def _heat():
    path = bench.find_bench_file("heat.py")
    if path is None:
        pytest.skip("examples/heat.py is neither installed nor in a source tree here")
    return str(path)


@pytest.mark.parametrize("n, grid, transport", [(2, 34, None), (3, 21, None), (2, 34, "ofi")])
@pytest.mark.timeout(120)
def test_heat_example_matches_serial(tmp_path, n, grid, transport):
    env = {"GEXMK_TRANSPORT": transport, "GEXMK_TIMEOUT": 60}
    if transport == "ofi":
        pytest.importorskip("gexmk.transports.ofi", reason="gexmk was built without the ofi transport")
        env.update({"GEXMK_OFI_PROVIDER": "tcp;ofi_rxm", "FI_PROVIDER": None})
    out = tmp_path / "heat.json"
    cmd = [sys.executable, "-P", "-m", "gexmk.run", "-n", str(n), "--timeout", "90", _heat(),
           "--n", str(grid), "--iters", "25", "--json", str(out)]
    res = mp_util.run_command(cmd, timeout=110, env=mp_util.child_env(env), cwd=str(tmp_path),
                              script="heat.py")
    res.check()
    r = json.loads(out.read_text())
    assert r["ok"] is True and r["ranks"] == n and r["iters"] == 25, r
    assert "bitwise equal to serial numpy" in res.stdout


def test_heat_check_can_fail():
    # the comparison the example makes is sensitive to one wrong halo value
    sys.path.insert(0, os.path.dirname(_heat()))
    try:
        import heat
    finally:
        sys.path.pop(0)
    ref = heat.serial(20, 10)
    u = heat.initial(20)
    v = u.copy()
    for i in range(10):
        heat.sweep(u, v)
        if i == 3:
            v[9, 5] += 1e-12        # a halo row arriving slightly wrong once
        u, v = v, u
    assert not (u == ref).all()
