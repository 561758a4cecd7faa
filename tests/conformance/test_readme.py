"""README.md's path table is the one the conformance tables generate."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import readme_table  # noqa: E402


def test_readme_path_table_is_generated_from_the_matrix():
    block, _ = readme_table.current()
    assert block is not None, f"README.md lacks the markers {readme_table.BEGIN!r} ... {readme_table.END!r}"
    assert block == readme_table.render(), (
        "README.md's path table differs from tests/conformance/tables.py: run "
        "`python tests/conformance/readme_table.py --write`")
