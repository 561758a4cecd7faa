"""The 3-D halo exchange example (examples/halo3d.py: six strided faces per block,
put_strided_nbi; issue 22) under ``python -m gexmk.run``: its result must equal the
serial numpy computation bit for bit (the example checks and says so)."""
import json
import os
import sys

import pytest

try:
    from . import mp_util
except ImportError:
    import mp_util

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       "examples", "halo3d.py")


@pytest.mark.parametrize("n, grid, transport", [(1, 12, None), (2, 16, None), (4, 16, None),
                                                (2, 16, "ofi")])
@pytest.mark.timeout(120)
def test_halo3d_example_matches_serial(tmp_path, n, grid, transport):
    if not os.path.exists(EXAMPLE):
        pytest.skip("examples/halo3d.py is not in this tree")
    env = {"GEXMK_TRANSPORT": transport, "GEXMK_TIMEOUT": 60}
    if transport == "ofi":
        pytest.importorskip("gexmk.transports.ofi", reason="gexmk was built without ofi")
        env.update({"GEXMK_OFI_PROVIDER": "tcp;ofi_rxm", "FI_PROVIDER": None})
    out = tmp_path / "halo3d.json"
    cmd = [sys.executable, "-P", "-m", "gexmk.run", "-n", str(n), "--timeout", "90", EXAMPLE,
           "--n", str(grid), "--iters", "6", "--json", str(out)]
    res = mp_util.run_command(cmd, timeout=110, env=mp_util.child_env(env), cwd=str(tmp_path),
                              script="halo3d.py")
    res.check()
    r = json.loads(out.read_text())
    assert r["ok"] is True and r["ranks"] == n, r
    assert "bitwise equal to serial numpy" in res.stdout


def test_halo3d_check_can_fail():
    sys.path.insert(0, os.path.dirname(EXAMPLE))
    try:
        import halo3d
    finally:
        sys.path.pop(0)
    import numpy as np
    ref = halo3d.serial(8, 3)
    wrong = ref.copy()
    wrong[0, 3, 5] += 1e-12
    assert not np.array_equal(wrong, ref)
    assert halo3d.dims(4) == (2, 2, 1) and halo3d.dims(8) == (2, 2, 2)
