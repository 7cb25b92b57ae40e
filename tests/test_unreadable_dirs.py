"""Directories the exporter may not enter (an LSM profile, a container mount): each costs what is behind
it, counted as a permission error, never the device or its other series (fuzz review: pathlib's is_dir()
raised EACCES, and one netdev directory cost the whole device; a class entry that could not be stat'ed
dropped the device without a word).

Root ignores file modes, so the scrape runs in a child without capabilities (setpriv) when the suite runs
as root."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from rdma_exporter.sample_tree import build_tree, spec_for_devices

from conftest import require_binary

SCRAPE = """
import json, sys
from pathlib import Path
from prometheus_client.parser import text_string_to_metric_families
from rdma_exporter.config import Config
from rdma_exporter.daemon import build_collector
import re
exclude = re.compile(sys.argv[2]) if len(sys.argv) > 2 else None
text = build_collector(Config(sysfs=Path(sys.argv[1]), device_exclude=exclude)).gather().render_text().decode()
print(json.dumps([[s.name, s.labels, s.value] for f in text_string_to_metric_families(text) for s in f.samples]))
"""


def scrape_unprivileged(sys_root: Path, *exclude: str) -> list[tuple[str, dict[str, str], float]]:
    prefix = []
    if os.geteuid() == 0:
        prefix = [require_binary("setpriv"), "--bounding-set=-all", "--inh-caps=-all"]
    done = subprocess.run(
        [*prefix, sys.executable, "-c", SCRAPE, str(sys_root), *exclude], capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, done.stderr
    return [(name, labels, value) for name, labels, value in json.loads(done.stdout)]


def of(found: list[tuple[str, dict[str, str], float]], device: str, prefix: str = "rdma_port_") -> list[str]:
    return sorted({name for name, labels, _ in found if labels.get("device") == device and name.startswith(prefix)})


def permission_errors(found: list[tuple[str, dict[str, str], float]], device: str) -> dict[str, float]:
    return {
        labels["collector"]: value
        for name, labels, value in found
        if name == "rdma_exporter_file_read_errors_total" and labels["device"] == device
        and labels["reason"] == "permission"
    }


def test_an_unreadable_netdev_directory_costs_the_netdev_series_only(tmp_path: Path) -> None:
    root = build_tree(tmp_path / "t", spec_for_devices(2))
    baseline = scrape_unprivileged(root)
    net = (root / "class" / "infiniband" / "mlx5_1" / "device" / "net").resolve()
    assert of(baseline, "mlx5_1", "rdma_netdev_")  # the tree has netdevs to lose
    net.chmod(0o644)  # listed, but nothing under it can be looked up
    try:
        found = scrape_unprivileged(root)
    finally:
        net.chmod(0o755)
    assert of(found, "mlx5_1") == of(baseline, "mlx5_1")  # every port series of the device stays
    assert of(found, "mlx5_0", "rdma_") == of(baseline, "mlx5_0", "rdma_")
    assert not of(found, "mlx5_1", "rdma_netdev_")
    assert permission_errors(found, "mlx5_1").get("inventory", 0) >= 1


def test_a_device_whose_class_entry_cannot_be_looked_up_is_counted_not_dropped_in_silence(tmp_path: Path) -> None:
    root = build_tree(tmp_path / "t", spec_for_devices(2))
    parent = (root / "class" / "infiniband" / "mlx5_1").resolve().parent
    parent.chmod(0o644)
    try:
        found = scrape_unprivileged(root)
    finally:
        parent.chmod(0o755)
    assert of(found, "mlx5_0")  # the other device is served
    assert permission_errors(found, "mlx5_1") == {"inventory": 1}
    # A device the filters exclude is none of the exporter's business, readable or not (final review).
    parent.chmod(0o644)
    try:
        found = scrape_unprivileged(root, "mlx5_1")
    finally:
        parent.chmod(0o755)
    assert of(found, "mlx5_0") and permission_errors(found, "mlx5_1") == {}
