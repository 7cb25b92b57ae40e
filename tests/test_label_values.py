"""Attributes exported as label values take only the forms the kernel prints: other text is a malformed
file, counted, and never a label (fuzz review: any text, pages of it or control characters, became one)."""

from __future__ import annotations

from pathlib import Path

from rdma_exporter.sample_tree import build_tree, spec_for_devices

from conftest import samples, scrape


def malformed(found: dict, device: str) -> float:  # type: ignore[type-arg]
    labels = (("collector", "inventory"), ("device", device), ("reason", "malformed"))
    key = ("rdma_exporter_file_read_errors_total", labels)
    return found.get(key, 0)


def labels_of(found: dict, name: str, device: str) -> list[dict[str, str]]:  # type: ignore[type-arg]
    return [dict(labels) for (metric, labels) in found if metric == name and dict(labels).get("device") == device]


def test_descriptive_text_no_kernel_prints_is_counted_not_exported(tmp_path: Path) -> None:
    root = build_tree(tmp_path / "t", spec_for_devices(2))
    ib = root / "class" / "infiniband"
    (ib / "mlx5_0" / "fw_ver").write_bytes(b"\x1b[2J" + b"A" * 20 + b"\n")
    (ib / "mlx5_0" / "node_desc").write_text("x" * 200 + "\n")
    (ib / "mlx5_0" / "node_guid").write_text("not a guid\n")
    (ib / "mlx5_0" / "node_type").write_text("garbage\n")
    (ib / "mlx5_0" / "ports" / "1" / "link_layer").write_text("Token Ring\n")
    found = samples(scrape(root))
    (info,) = labels_of(found, "rdma_device_info", "mlx5_0")
    assert (info["fw_ver"], info["node_desc"], info["node_guid"], info["node_type"]) == ("", "", "", "")
    (port,) = labels_of(found, "rdma_port_info", "mlx5_0")
    assert port["link_layer"] == ""
    assert malformed(found, "mlx5_0") == 5
    # The other device, untouched, keeps its labels and has no error.
    (other,) = labels_of(found, "rdma_device_info", "mlx5_1")
    assert other["fw_ver"] and other["node_guid"].count(":") == 3 and malformed(found, "mlx5_1") == 0


def test_a_gid_type_no_kernel_prints_is_counted_not_a_label(tmp_path: Path) -> None:
    root = build_tree(tmp_path / "t", spec_for_devices(2))
    types = root / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "gid_attrs" / "types"
    entries = sorted(types.iterdir())
    assert entries, "the tree has GID types to spoil"
    entries[0].write_text("junk\nline2\n")
    found = samples(scrape(root))
    gid_types = {labels["gid_type"] for labels in labels_of(found, "rdma_port_gids", "mlx5_0")}
    assert gid_types <= {"IB/RoCE v1", "RoCE v2"}
    assert malformed(found, "mlx5_0") == 1
