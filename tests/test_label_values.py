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
    assert port["link_layer"] == "InfiniBand"  # the garbage file counted, the label taken from its IPoIB netdev
    assert malformed(found, "mlx5_0") == 5
    # The other device, untouched, keeps its labels and has no error.
    (other,) = labels_of(found, "rdma_device_info", "mlx5_1")
    assert other["fw_ver"] and other["node_guid"].count(":") == 3 and malformed(found, "mlx5_1") == 0


def test_a_gid_type_no_kernel_prints_is_counted_not_a_label(tmp_path: Path) -> None:
    root = build_tree(tmp_path / "t", spec_for_devices(2))
    port = root / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    # A second populated entry beside the tree's one, so that the entry left after the spoiling shows.
    (port / "gids" / "1").write_text("fe80:0000:0000:0000:b8ce:f603:0022:6001\n")
    (port / "gid_attrs" / "types" / "1").write_text("IB/RoCE v1\n")
    (port / "gid_attrs" / "types" / "0").write_text("junk\nline2\n")
    found = samples(scrape(root))
    gids = {dict(labels)["gid_type"]: value for (name, labels), value in found.items()
            if name == "rdma_port_gids" and dict(labels)["device"] == "mlx5_0"}  # fmt: skip
    assert gids == {"IB/RoCE v1": 1}
    assert malformed(found, "mlx5_0") == 1


def test_a_gid_no_kernel_prints_is_counted_not_a_populated_entry(tmp_path: Path) -> None:
    # Anything not all zeros counted as a populated entry: `nan` or a byte-order mark too (fuzz review).
    root = build_tree(tmp_path / "t", spec_for_devices(2))
    port = root / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    for index, text in ((1, "nan\n"), (2, "\ufefffe80:0000:0000:0000:b8ce:f603:0022:6001\n"), (3, "fe80::1\n")):
        (port / "gids" / str(index)).write_text(text)
        (port / "gid_attrs" / "types" / str(index)).write_text("IB/RoCE v1\n")
    found = samples(scrape(root))
    gids = {dict(labels)["gid_type"]: value for (name, labels), value in found.items()
            if name == "rdma_port_gids" and dict(labels)["device"] == "mlx5_0"}  # fmt: skip
    assert sum(gids.values()) == 1  # the tree's own entry
    assert malformed(found, "mlx5_0") == 3 and malformed(found, "mlx5_1") == 0


def test_a_bond_whose_slaves_or_mode_are_garbage_keeps_its_slaves_and_names_no_mode(tmp_path: Path) -> None:
    from test_collect_roce import _bond, _function

    _function(tmp_path, "0000:3b:00.0", "ens1f0np0", "mlx5_bond_0", ["bond0", "bond0"])
    _function(tmp_path, "0000:3b:00.1", "ens1f1np1", None, [])
    _bond(tmp_path, "bond0", ["ens1f0np0", "ens1f1np1"])
    bonding = tmp_path / "devices" / "virtual" / "net" / "bond0" / "bonding"
    before = samples(scrape(tmp_path))
    slaves = labels_of(before, "rdma_netdev_bond_slave_info", "mlx5_bond_0")
    assert {s["slave"] for s in slaves} == {"ens1f0np0", "ens1f1np1"} and malformed(before, "mlx5_bond_0") == 0
    (bonding / "slaves").write_text(" ".join(f"g{i}" for i in range(100)) + " a:b\n")
    (bonding / "mode").write_text("\x1b[31mpwned 4\n")
    found = samples(scrape(tmp_path))
    after = labels_of(found, "rdma_netdev_bond_slave_info", "mlx5_bond_0")
    assert {s["slave"] for s in after} == {"ens1f0np0", "ens1f1np1"}  # the static read's slaves stay
    assert all(s["mode"] == "" for s in after)
    errors = sum(v for (name, labels), v in found.items()
                 if name == "rdma_exporter_file_read_errors_total" and ("reason", "malformed") in labels)
    assert errors == 2


def test_an_aer_file_the_kernel_did_not_write_is_counted_and_its_types_stay_bounded(tmp_path: Path) -> None:
    root = build_tree(tmp_path / "t", spec_for_devices(2))
    pci = root / "class" / "infiniband"
    (pci / "mlx5_0" / "device" / "aer_dev_correctable").write_text("")  # no TOTAL_ERR_ line
    (pci / "mlx5_1" / "device" / "aer_dev_correctable").write_text(
        "".join(f"E{n} 1\n" for n in range(100)) + "X" * 3000 + " 1\nTOTAL_ERR_COR 101\n"
    )
    found = samples(scrape(root))

    def pcie_malformed(device: str) -> float:
        labels = (("collector", "pcie"), ("device", device), ("reason", "malformed"))
        return found.get(("rdma_exporter_file_read_errors_total", labels), 0)

    assert pcie_malformed("mlx5_0") == 1
    types = [s for s in labels_of(found, "rdma_pcie_aer_errors_total", "mlx5_1") if s["error_class"] == "correctable"]
    assert len(types) == 64 and all(len(s["type"]) <= 32 for s in types)
    assert pcie_malformed("mlx5_1") == 100 - 64 + 1


def test_links_the_kernel_does_not_make_name_no_driver_and_no_physical_function(tmp_path: Path) -> None:
    root = build_tree(tmp_path / "t", spec_for_devices(16))
    ib = root / "class" / "infiniband"
    vf = next(d.name for d in sorted(ib.iterdir()) if (d / "device" / "physfn").is_symlink())
    before = samples(scrape(root))
    (pf_before,) = labels_of(before, "rdma_device_info", vf)
    (driver_before,) = labels_of(before, "rdma_device_info", "mlx5_0")
    assert pf_before["pf_pci_address"] and driver_before["driver"] == "mlx5_core"
    (ib / "mlx5_0" / "device" / "driver").unlink()
    (ib / "mlx5_0" / "device" / "driver").symlink_to("/dev/zero")
    (ib / vf / "device" / "physfn").unlink()
    (ib / vf / "device" / "physfn").symlink_to("/nonexistent/zzz")
    found = samples(scrape(root))
    (info,) = labels_of(found, "rdma_device_info", "mlx5_0")
    (pf,) = labels_of(found, "rdma_device_info", vf)
    assert (info["driver"], pf["pf_pci_address"]) == ("", "")


def test_a_node_description_is_exported_as_written(tmp_path: Path) -> None:
    # node_desc is whatever was written to it, up to 64 bytes, tabs and inner newlines included (final review:
    # refusing it counted an error every minute, and RdmaExporterReadErrors fired for good).
    root = build_tree(tmp_path / "t", spec_for_devices(2))
    (root / "class" / "infiniband" / "mlx5_0" / "node_desc").write_text("node01\tHCA-1\nrack 4\n")
    found = samples(scrape(root))
    (info,) = labels_of(found, "rdma_device_info", "mlx5_0")
    assert info["node_desc"] == "node01\tHCA-1\nrack 4" and malformed(found, "mlx5_0") == 0


def test_a_parent_link_into_nothing_is_counted(tmp_path: Path) -> None:
    # The device's PCIe, NUMA and netdev series go with it; that was silent (fuzz review).
    root = build_tree(tmp_path / "t", spec_for_devices(2))
    link = root / "class" / "infiniband" / "mlx5_1" / "device"
    link.unlink()
    link.symlink_to("../../../gone")
    found = samples(scrape(root))
    labels = (("collector", "inventory"), ("device", "mlx5_1"), ("reason", "missing"))
    assert found.get(("rdma_exporter_file_read_errors_total", labels)) == 1
    assert labels_of(found, "rdma_port_info", "mlx5_1")  # its ports are still served
