"""Golden exposition files: the whole scrape of every fixture tree, byte for byte.

Regenerate after an intended change with `UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py` and
review the diff like code.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

from rdma_exporter.sample_tree import HEALTHY_SPEC, SAMPLE_SPEC, build_tree

from conftest import CAPTURED_TREES, GOLDEN, SYSFS_FIXTURES, in_ci, promtool_check_metrics, scrape, stable

GENERATED_TREES = {"sample-8hca": SAMPLE_SPEC, "healthy-8hca": HEALTHY_SPEC}


def _tree_root(name: str, tmp_path: Path) -> tuple[Path, Path | None]:
    if name in GENERATED_TREES:
        root = build_tree(tmp_path / name, GENERATED_TREES[name])
        return root, tmp_path / name / "ethtool"
    return SYSFS_FIXTURES / name / "sys", None


@pytest.mark.parametrize("tree", CAPTURED_TREES + sorted(GENERATED_TREES))
def test_golden_exposition(tree: str, tmp_path: Path) -> None:
    root, ethtool_dir = _tree_root(tree, tmp_path)
    text = stable(scrape(root, ethtool_dir=ethtool_dir))
    golden = GOLDEN / f"{tree}.prom"
    if os.environ.get("UPDATE_GOLDEN"):
        # Compared with what it just wrote, the test cannot fail: never under CI (test review).
        assert not in_ci(), "UPDATE_GOLDEN is set under CI=1: the goldens would be rewritten, not checked"
        golden.write_text(text)
    assert golden.exists(), f"no golden file {golden}; run with UPDATE_GOLDEN=1"
    expected = golden.read_text()
    if text != expected:
        diff = list(difflib.unified_diff(expected.splitlines(), text.splitlines(), "golden", "scrape", lineterm=""))
        pytest.fail(f"{tree} differs from {golden.name}:\n" + "\n".join(diff[:40]))


@pytest.mark.parametrize("tree", CAPTURED_TREES + sorted(GENERATED_TREES))
def test_exposition_passes_promtool(tree: str, tmp_path: Path) -> None:
    root, ethtool_dir = _tree_root(tree, tmp_path)
    promtool_check_metrics(scrape(root, ethtool_dir=ethtool_dir))
