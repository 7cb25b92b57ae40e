"""The sample tree generator: kernel formats, symlink layout, faults, determinism, size and CLI."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import pytest

from rdma_exporter.sample_tree import (
    HEALTHY_SPEC,
    SAMPLE_SPEC,
    TreeSpec,
    build_tree,
    main,
    spec_for_devices,
)

# The real H100 capture (see fixtures/SOURCES.md), to check the file sets against.
LEPTON = Path(__file__).parent / "fixtures/sysfs/leptonai-gpud-h100/sys/class/infiniband/mlx5_0/ports/1"


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("sample")
    build_tree(dest, SAMPLE_SPEC)
    return dest


@pytest.fixture(scope="module")
def with_vfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("vfs")
    build_tree(dest, TreeSpec(ib_hcas=2, roce_hcas=0, vfs_per_pf=3, degraded_pcie=(), down_ports=("mlx5_1",)))
    return dest


def read(path: Path) -> str:
    text = path.read_text()
    assert text.endswith("\n"), f"{path} does not end with a newline"
    return text[:-1]


def ib_devices(dest: Path) -> list[Path]:
    return sorted((dest / "sys/class/infiniband").iterdir(), key=lambda p: int(p.name.split("_")[1]))


def ethtool_stats(path: Path) -> dict[str, int]:
    """An `ethtool -S` capture, checked line by line against the format ethtool prints."""
    text = path.read_text()
    assert text.endswith("\n")
    first, *lines = text.splitlines()
    assert first == "NIC statistics:"
    stats: dict[str, int] = {}
    for line in lines:
        m = re.fullmatch(r" {5}([a-z0-9_]+): (\d+)", line)
        assert m, line
        assert m.group(1) not in stats
        stats[m.group(1)] = int(m.group(2))
    return stats


def snapshot(root: Path) -> dict[str, tuple[str, str]]:
    """Every entry under root: link target, file contents or a directory marker, keyed by relative path."""
    out: dict[str, tuple[str, str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                out[rel] = ("dir", "")
            else:
                out[rel] = ("file", p.read_text())
    return out


def test_sample_device_and_netdev_names(sample: Path) -> None:
    assert [p.name for p in ib_devices(sample)] == [f"mlx5_{i}" for i in range(10)]
    netdevs = sorted(p.name for p in (sample / "sys/class/net").iterdir())
    ib_names = ["ibp24s0", "ibp64s0", "ibp79s0", "ibp94s0", "ibp154s0", "ibp170s0", "ibp192s0", "ibp206s0"]
    assert netdevs == sorted([*ib_names, "enp220s0f0np0", "enp220s0f1np1", "lo"])
    assert sorted(p.name for p in (sample / "ethtool").iterdir()) == ["enp220s0f0np0", "enp220s0f1np1"]


def test_class_infiniband_links_resolve_under_devices(sample: Path) -> None:
    sys_root = (sample / "sys").resolve()
    for dev in ib_devices(sample):
        assert dev.is_symlink()
        target = os.readlink(dev)
        assert not os.path.isabs(target) and target.startswith("../../devices/")
        resolved = dev.resolve(strict=True)
        assert resolved.is_dir() and resolved.is_relative_to(sys_root / "devices")
        assert resolved.parent.name == "infiniband"
        # The device link points back at the PCI function that holds the infiniband/ directory.
        assert os.readlink(dev / "device") == f"../../../{resolved.parent.parent.name}"
        pci = (dev / "device").resolve(strict=True)
        assert pci == resolved.parent.parent
        assert read(pci / "vendor") == "0x15b3"
        assert (pci / "driver").resolve(strict=True) == sys_root / "bus/pci/drivers/mlx5_core"
        # lspci and udev find the function through the bus, and the driver lists what it bound.
        for bus_dir in ("bus/pci/devices", "bus/pci/drivers/mlx5_core"):
            assert (sys_root / bus_dir / pci.name).resolve(strict=True) == pci


def test_mlx5_0_sits_where_the_kernel_puts_it(sample: Path) -> None:
    link = sample / "sys/class/infiniband/mlx5_0"
    assert os.readlink(link) == "../../devices/pci0000:00/0000:00:01.0/0000:18:00.0/infiniband/mlx5_0"
    assert (
        os.readlink(sample / "sys/class/net/ibp24s0")
        == "../../devices/pci0000:00/0000:00:01.0/0000:18:00.0/net/ibp24s0"
    )


def test_every_link_stays_inside_the_tree(sample: Path, with_vfs: Path) -> None:
    for dest in (sample, with_vfs):
        root = dest.resolve()
        for dirpath, dirnames, filenames in os.walk(dest):
            for name in dirnames + filenames:
                p = Path(dirpath, name)
                if p.is_symlink():
                    assert not os.path.isabs(os.readlink(p))
                    assert p.resolve(strict=True).is_relative_to(root), p


def test_port_attributes_use_kernel_formats(sample: Path) -> None:
    for dev in ib_devices(sample):
        port = dev / "ports/1"
        eth = read(port / "link_layer") == "Ethernet"
        assert read(port / "state") == "4: ACTIVE"
        assert read(port / "phys_state") == "5: LinkUp"
        assert read(port / "rate") == ("200 Gb/sec (2X NDR)" if eth else "400 Gb/sec (4X NDR)")
        assert re.fullmatch(r"0x[0-9a-f]+", read(port / "lid"))
        assert re.fullmatch(r"0x[0-9a-f]{8}", read(port / "cap_mask"))
        assert read(dev / "node_type") == "1: CA"
        assert re.fullmatch(r"([0-9a-f]{4}:){3}[0-9a-f]{4}", read(dev / "node_guid"))
        assert read(dev / "hca_type") == ("MT41692" if eth else "MT4129")
        gid0 = read(port / "gids/0")
        assert re.fullmatch(r"([0-9a-f]{4}:){7}[0-9a-f]{4}", gid0) and gid0.startswith("fe80:0000:0000:0000:")
        assert len(list((port / "gids").iterdir())) == 16
        if not eth:
            assert gid0.endswith(read(dev / "node_guid"))  # single-port HCA: port GUID == node GUID
        assert read(port / "gid_attrs/types/0") == "IB/RoCE v1"
        assert read(port / "pkeys/0") == "0xffff"
        assert len(list((port / "pkeys").iterdir())) == (1 if eth else 16)  # mlx5 RoCE: one P_Key


def test_counter_files_match_the_real_capture(sample: Path) -> None:
    ib_port = sample / "sys/class/infiniband/mlx5_0/ports/1"
    roce_port = sample / "sys/class/infiniband/mlx5_8/ports/1"
    captured = {p.name for p in (LEPTON / "counters").iterdir()}
    captured_hw = {p.name for p in (LEPTON / "hw_counters").iterdir()}
    assert {p.name for p in (ib_port / "counters").iterdir()} == captured
    assert {p.name for p in (ib_port / "hw_counters").iterdir()} == captured_hw
    congestion = {"np_cnp_sent", "np_ecn_marked_roce_packets", "rp_cnp_handled", "rp_cnp_ignored"}
    assert {p.name for p in (roce_port / "hw_counters").iterdir()} == captured_hw | congestion


def test_healthy_counters_have_realistic_magnitudes(sample: Path) -> None:
    for dev in ib_devices(sample):
        counters = {p.name: int(read(p)) for p in (dev / "ports/1/counters").iterdir()}
        assert 1e13 < counters["port_xmit_data"] < 1e15
        assert counters["unicast_rcv_packets"] + counters["multicast_rcv_packets"] == counters["port_rcv_packets"]
        for name in ("symbol_error", "link_downed", "port_rcv_errors", "link_error_recovery", "port_xmit_discards"):
            assert counters[name] == 0, (dev.name, name)
    roce_hw = sample / "sys/class/infiniband/mlx5_8/ports/1/hw_counters"
    assert int(read(roce_hw / "np_cnp_sent")) > 0 and int(read(roce_hw / "rp_cnp_handled")) > 0
    assert int(read(roce_hw / "np_ecn_marked_roce_packets")) >= int(read(roce_hw / "np_cnp_sent"))


def test_gid_ndevs_name_existing_netdevs(sample: Path) -> None:
    net = sample / "sys/class/net"
    seen = set()
    for dev in ib_devices(sample):
        port = dev / "ports/1"
        for ndev in (port / "gid_attrs/ndevs").iterdir():
            name = read(ndev)
            assert (net / name).is_dir()
            seen.add(name)
            # The netdev of a GID entry lives on the same PCI function as the RDMA device.
            assert (net / name / "device").resolve() == (dev / "device").resolve()
        # Unpopulated (all-zero) entries have no gid_attrs files: the kernel answers EINVAL for them.
        for gid in (port / "gids").iterdir():
            if set(read(gid)) <= {"0", ":"}:
                assert not (port / "gid_attrs/types" / gid.name).exists()
                assert not (port / "gid_attrs/ndevs" / gid.name).exists()
    assert seen == {"enp220s0f0np0", "enp220s0f1np1"}
    roce = sample / "sys/class/infiniband/mlx5_8/ports/1/gid_attrs/types"
    assert [read(roce / str(i)) for i in range(4)] == ["IB/RoCE v1", "RoCE v2", "IB/RoCE v1", "RoCE v2"]


def test_netdevs_resolve_to_their_pci_function(sample: Path) -> None:
    for link in (sample / "sys/class/net").iterdir():
        target = link.resolve(strict=True)
        if link.name == "lo":
            assert read(target / "type") == "772"
            continue
        assert (link / "device").resolve(strict=True) == target.parent.parent
        stats = {p.name for p in (link / "statistics").iterdir()}
        assert len(stats) == 24 and {"rx_bytes", "tx_window_errors", "rx_nohandler"} <= stats
        eth = link.name.startswith("en")
        assert read(link / "type") == ("1" if eth else "32")
        assert read(link / "speed") == ("200000" if eth else "400000")
        assert read(link / "operstate") == "up" and read(link / "carrier") == "1"
        changes = int(read(link / "carrier_changes"))
        assert changes == int(read(link / "carrier_up_count")) + int(read(link / "carrier_down_count"))
        assert (link / "ifalias").read_text() == ""


def test_roce_netdevs_have_ecn_on_priority_3_only(sample: Path) -> None:
    for name in ("enp220s0f0np0", "enp220s0f1np1"):
        ecn = sample / "sys/class/net" / name / "ecn"
        for point in ("roce_np", "roce_rp"):
            enabled = [int(read(ecn / point / "enable" / str(p))) for p in range(8)]
            assert enabled == [0, 0, 0, 1, 0, 0, 0, 0]
        assert read(ecn / "roce_np/cnp_dscp") == "48"


def test_degraded_pcie_device(sample: Path) -> None:
    def pci(name: str) -> Path:
        return sample / "sys/class/infiniband" / name / "device"

    assert read(pci("mlx5_5") / "current_link_speed") == "16.0 GT/s PCIe"
    assert read(pci("mlx5_5") / "max_link_speed") == "32.0 GT/s PCIe"
    assert read(pci("mlx5_5") / "current_link_width") == read(pci("mlx5_5") / "max_link_width") == "16"
    lines = read(pci("mlx5_5") / "aer_dev_correctable").splitlines()
    assert lines[0].startswith("RxErr ") and lines[-1].startswith("TOTAL_ERR_COR ")
    counts = {k: int(v) for k, v in (line.split(" ") for line in lines)}
    assert counts["TOTAL_ERR_COR"] == sum(v for k, v in counts.items() if k != "TOTAL_ERR_COR") > 0
    for dev in ib_devices(sample):
        if dev.name != "mlx5_5":
            assert read(pci(dev.name) / "current_link_speed") == read(pci(dev.name) / "max_link_speed")
            assert read(pci(dev.name) / "aer_dev_correctable").endswith("TOTAL_ERR_COR 0")
        assert read(pci(dev.name) / "aer_dev_fatal").splitlines()[-1] == "TOTAL_ERR_FATAL 0"


def test_gen4_slot_trains_gen4_under_a_gen4_port(tmp_path: Path) -> None:
    sys_root = build_tree(tmp_path, TreeSpec(ib_hcas=2, roce_hcas=0, degraded_pcie=(), gen4_slots=("mlx5_1",)))
    for name, speed in (("mlx5_0", "32.0 GT/s PCIe"), ("mlx5_1", "16.0 GT/s PCIe")):
        device = (sys_root / "class/infiniband" / name / "device").resolve()
        assert read(device / "current_link_speed") == read(device.parent / "current_link_speed") == speed
        assert read(device.parent / "max_link_speed") == speed
        assert read(device / "max_link_speed") == "32.0 GT/s PCIe"
    with pytest.raises(ValueError, match="mlx5_7"):
        build_tree(tmp_path / "x", TreeSpec(ib_hcas=2, roce_hcas=0, degraded_pcie=(), gen4_slots=("mlx5_7",)))
    # The BlueField's two functions (mlx5_8, mlx5_9) share one link: naming one alone would give the
    # other a speed above its port's maximum.
    with pytest.raises(ValueError, match="share one PCIe link"):
        build_tree(tmp_path / "y", TreeSpec(degraded_pcie=(), gen4_slots=("mlx5_9",)))
    build_tree(tmp_path / "z", TreeSpec(degraded_pcie=(), gen4_slots=("mlx5_8", "mlx5_9")))


def test_ethtool_files_parse(sample: Path) -> None:
    for path in (sample / "ethtool").iterdir():
        stats = ethtool_stats(path)
        for name in (
            "rx_bytes", "tx_bytes", "rx_out_of_buffer", "rx_discards_phy", "tx_discards_phy", "rx_symbol_err_phy",
            "rx_pcs_symbol_err_phy", "rx_corrected_bits_phy", "rx_crc_errors_phy", "rx_bits_phy", "rx_bytes_phy",
            "link_down_events_phy", "tx_pause_storm_warning_events", "tx_pause_storm_error_events",
            "rx_pause_ctrl_phy", "tx_pause_ctrl_phy", "rx_pci_signal_integrity", "tx_pci_signal_integrity",
            "outbound_pci_stalled_rd", "outbound_pci_stalled_wr_events", "rx_err_lane_3_phy", "ch0_events",
            "rx0_packets",
        ):  # fmt: skip
            assert name in stats, name
        for p in range(8):
            for kind in ("bytes", "packets", "discards", "buf_discard", "cong_discard", "marked"):
                assert f"rx_prio{p}_{kind}" in stats
        # PFC on priority 3 only, so mlx5 lists pause counters for priority 3 and no other.
        assert stats["rx_prio3_pause"] > 0 and stats["rx_prio3_pause_duration"] > 0 and stats["tx_prio3_pause"] > 0
        assert not any(k.endswith("_pause") and k != "rx_prio3_pause" and k != "tx_prio3_pause" for k in stats)
        assert stats["rx_discards_phy"] == stats["rx_out_of_buffer"] == stats["link_down_events_phy"] == 0
        assert stats["rx_prio3_bytes"] > 1e14
        assert stats["rx0_packets"] + stats["rx1_packets"] == stats["rx_packets"]
        assert stats["rx_err_lane_0_phy"] + stats["rx_err_lane_1_phy"] == stats["rx_corrected_bits_phy"]
        netdev = sample / "sys/class/net" / path.name
        assert read(netdev / "statistics/rx_packets") == str(stats["rx_packets"])


def test_vfs_and_down_port(with_vfs: Path) -> None:
    names = [p.name for p in ib_devices(with_vfs)]
    assert names == [f"mlx5_{i}" for i in range(8)]  # 2 PFs, then 3 VFs of each
    pf = (with_vfs / "sys/class/infiniband/mlx5_0/device").resolve()
    assert read(pf / "sriov_numvfs") == "3"
    for n in range(3):
        vf = (pf / f"virtfn{n}").resolve(strict=True)
        assert (vf / "physfn").resolve(strict=True) == pf
        assert read(vf / "device") == "0x101e" and read(vf / "vendor") == "0x15b3"
        assert read(vf / "current_link_speed") == "Unknown"  # a VF has no link of its own
        assert read(vf / "current_link_width") == read(vf / "max_link_width") == "0"
        assert not (vf / "aer_dev_correctable").exists()
        assert (vf / "infiniband" / f"mlx5_{2 + n}").is_dir()
        assert (vf / "net" / f"ibp24s0v{n}").is_dir()
    assert not (pf / "physfn").exists()
    # The down PF and, through it, its VFs.
    for name in ("mlx5_1", "mlx5_5", "mlx5_6", "mlx5_7"):
        port = with_vfs / "sys/class/infiniband" / name / "ports/1"
        assert read(port / "state") == "1: DOWN"
        assert read(port / "phys_state") == "3: Disabled"
        assert read(port / "rate") == "40 Gb/sec (4X QDR)"
    assert int(read(with_vfs / "sys/class/infiniband/mlx5_1/ports/1/counters/link_downed")) > 0
    assert read(with_vfs / "sys/class/net/ibp64s0/operstate") == "down"
    assert read(with_vfs / "sys/class/net/ibp64s0/carrier") == "0"
    assert read(with_vfs / "sys/class/infiniband/mlx5_2/ports/1/state") == "4: ACTIVE"


def test_fault_changes_nothing_else(tmp_path: Path) -> None:
    build_tree(tmp_path / "a", SAMPLE_SPEC)
    build_tree(tmp_path / "b", HEALTHY_SPEC)
    a, b = snapshot(tmp_path / "a"), snapshot(tmp_path / "b")
    differing = {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)}
    port = "sys/devices/pci0000:a7/0000:a7:01.0/"  # the root port above mlx5_5: its end of the same link
    pci = port + "0000:aa:00.0/"  # mlx5_5, ibp170s0
    # Both ends of the marginal link saw errors: the port counts its own and the messages it received.
    port_aer = {port + "aer_dev_correctable", port + "aer_rootport_total_err_cor"}
    link = {pci + "current_link_speed", pci + "aer_dev_correctable", port + "current_link_speed"}
    assert differing == link | port_aer


def test_build_is_deterministic(tmp_path: Path) -> None:
    spec = TreeSpec(vfs_per_pf=2, down_ports=("mlx5_3", "mlx5_9"))
    build_tree(tmp_path / "one", spec)
    build_tree(tmp_path / "two", spec)
    assert snapshot(tmp_path / "one") == snapshot(tmp_path / "two")
    build_tree(tmp_path / "three", TreeSpec(vfs_per_pf=2, down_ports=("mlx5_3", "mlx5_9"), seed=2))
    assert snapshot(tmp_path / "one") != snapshot(tmp_path / "three")


def test_refuses_existing_tree_and_unknown_names(tmp_path: Path) -> None:
    build_tree(tmp_path, HEALTHY_SPEC)
    with pytest.raises(FileExistsError):
        build_tree(tmp_path, HEALTHY_SPEC)
    with pytest.raises(ValueError, match="mlx5_42"):
        build_tree(tmp_path / "x", TreeSpec(down_ports=("mlx5_42",)))


@pytest.mark.parametrize(
    ("n", "ib", "roce", "vfs"), [(1, 1, 0, 0), (8, 8, 0, 0), (10, 8, 2, 0), (32, 8, 0, 3), (128, 8, 0, 15)]
)
def test_spec_for_devices(n: int, ib: int, roce: int, vfs: int) -> None:
    spec = spec_for_devices(n)
    assert (spec.ib_hcas, spec.roce_hcas, spec.vfs_per_pf) == (ib, roce, vfs)
    assert spec.ib_hcas + spec.roce_hcas + spec.ib_hcas * spec.vfs_per_pf == n


def test_128_device_tree_is_complete(tmp_path: Path) -> None:
    # Build speed is the benchmark's business (bench/), not a timed unit test's.
    sys_root = build_tree(tmp_path, spec_for_devices(128))
    devices = list((sys_root / "class/infiniband").iterdir())
    assert len(devices) == 128 and all(d.resolve(strict=True).is_dir() for d in devices)
    assert len(list((sys_root / "class/net").iterdir())) == 129  # one netdev each, plus lo
    guids = {read(d / "node_guid") for d in devices}
    lids = {read(d / "ports/1/lid") for d in devices}
    assert len(guids) == len(lids) == 128


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "s"), "--devices", "8", "--healthy"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "s" / "sys")
    dev5 = tmp_path / "s/sys/class/infiniband/mlx5_5/device"
    assert read(dev5 / "current_link_speed") == "32.0 GT/s PCIe"
    assert len(list((tmp_path / "s/sys/class/infiniband").iterdir())) == 8
    assert not (tmp_path / "s/ethtool").exists()
    assert main([str(tmp_path / "d")]) == 0
    assert read(tmp_path / "d/sys/class/infiniband/mlx5_5/device/current_link_speed") == "16.0 GT/s PCIe"
    assert main([str(tmp_path / "d")]) == 1  # refuses to overwrite
    assert "already exists" in capsys.readouterr().err


def _eui64_gid(mac: str) -> str:
    """Link-local GID of a MAC as RFC 4291 derives it: flip the U/L bit, insert ff:fe."""
    b = [int(x, 16) for x in mac.split(":")]
    iid = [b[0] ^ 0x02, *b[1:3], 0xFF, 0xFE, *b[3:]]
    return "fe80:0000:0000:0000:" + ":".join(f"{iid[i]:02x}{iid[i + 1]:02x}" for i in range(0, 8, 2))


def test_roce_gid0_is_the_modified_eui64_of_the_netdev_mac(sample: Path) -> None:
    # Real mlx5 ports (gpud ibstat fixtures): MAC 94:6d:ae:.. gives port GUID 966d:aeff:fe..
    for name, netdev in (("mlx5_8", "enp220s0f0np0"), ("mlx5_9", "enp220s0f1np1")):
        mac = read(sample / "sys/class/net" / netdev / "address")
        assert read(sample / "sys/class/infiniband" / name / "ports/1/gids/0") == _eui64_gid(mac)


def test_ifindexes_are_unique(sample: Path) -> None:
    # lo is 1; a netdev sharing an ifindex with another would break every join on it.
    ifindexes = [read(p / "ifindex") for p in (sample / "sys/class/net").iterdir()]
    assert len(ifindexes) == len(set(ifindexes)) and "1" in ifindexes


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        (TreeSpec(ib_hcas=0, roce_hcas=0, degraded_pcie=()), "at least one InfiniBand or RoCE HCA"),
        (TreeSpec(ib_hcas=-1, roce_hcas=2, degraded_pcie=()), "at least one InfiniBand or RoCE HCA"),
        (TreeSpec(ib_hcas=1, roce_hcas=0, vfs_per_pf=255, degraded_pcie=()), "vfs_per_pf must be within 0..254"),
        (TreeSpec(ib_hcas=1, roce_hcas=0, vfs_per_pf=1, degraded_pcie=("mlx5_1",)), "mlx5_1 is a VF"),
        (TreeSpec(ib_hcas=1, roce_hcas=0, degraded_pcie=("mlx5_42",)), "degraded_pcie names 'mlx5_42'"),
        (TreeSpec(ib_hcas=1, roce_hcas=0, vfs_per_pf=1, degraded_pcie=(), gen4_slots=("mlx5_1",)), "not a PF"),
    ],
)
def test_refuses_a_fault_it_cannot_build(spec: TreeSpec, reason: str, tmp_path: Path) -> None:
    # A fault option must produce the fault it names or fail: a VF has no PCIe link to degrade.
    with pytest.raises(ValueError, match=reason):
        build_tree(tmp_path, spec)
    assert not (tmp_path / "sys").exists()


def test_down_port_looks_like_a_real_down_port(with_vfs: Path) -> None:
    # As ibstat shows a down mlx5 port (gpud some_down fixture): Base lid 0, SM lid 0; its QPs were
    # flushed when the link went away.
    port = with_vfs / "sys/class/infiniband/mlx5_1/ports/1"
    assert read(port / "lid") == read(port / "sm_lid") == "0x0"
    for name in ("local_ack_timeout_err", "req_cqe_flush_error", "resp_cqe_flush_error"):
        assert int(read(port / "hw_counters" / name)) > 0, name
    up = with_vfs / "sys/class/infiniband/mlx5_0/ports/1"
    assert read(up / "lid") != "0x0" and read(up / "sm_lid") != "0x0"
    assert read(up / "hw_counters/req_cqe_flush_error") == "0"
    # Its IPoIB netdev: the driver turned carrier off once more than on, and reports the 4X QDR rate.
    ipoib = with_vfs / "sys/class/net/ibp64s0"
    assert int(read(ipoib / "carrier_down_count")) == int(read(ipoib / "carrier_up_count")) + 1
    assert read(ipoib / "speed") == "40000"


@pytest.mark.parametrize("n", [5, 6, 15])
def test_benchmark_tree_has_the_devices_it_claims(n: int, tmp_path: Path) -> None:
    # 15 = 8 IB PFs + 7 RoCE functions: the fourth BlueField wraps into PCI domain 0001.
    sys_root = build_tree(tmp_path, spec_for_devices(n))
    devices = sorted((sys_root / "class/infiniband").iterdir())
    assert len(devices) == n
    functions = {(d / "device").resolve(strict=True) for d in devices}
    assert len(functions) == n
    speeds = {d.name: read(d / "device/current_link_speed") for d in devices}
    # "mlx5_5 has the degraded PCIe link whenever it is a PF" (spec_for_devices).
    assert [name for name, s in speeds.items() if s != "32.0 GT/s PCIe"] == (["mlx5_5"] if n > 5 else [])


def test_ib_pfs_beyond_one_domain_get_their_own_pci_addresses(tmp_path: Path) -> None:
    sys_root = build_tree(tmp_path, TreeSpec(ib_hcas=9, roce_hcas=0, degraded_pcie=()))
    assert os.readlink(sys_root / "class/net/ibP1p24s0") == (
        "../../devices/pci0001:00/0001:00:01.0/0001:18:00.0/net/ibP1p24s0"
    )
    assert (sys_root / "class/infiniband/mlx5_8/device").resolve().name == "0001:18:00.0"


def test_sriov_numvfs_never_exceeds_totalvfs(tmp_path: Path) -> None:
    sys_root = build_tree(tmp_path, TreeSpec(ib_hcas=1, roce_hcas=0, vfs_per_pf=20, degraded_pcie=()))
    pf = sys_root / "class/infiniband/mlx5_0/device"
    assert int(read(pf / "sriov_numvfs")) == 20 <= int(read(pf / "sriov_totalvfs"))
    assert len(list((sys_root / "class/infiniband").iterdir())) == 21


def test_roce_faults_show_on_the_netdev_and_in_ethtool(tmp_path: Path) -> None:
    # mlx5_9 is down and both BlueField functions (one link) are degraded; mlx5_8's link is up.
    build_tree(tmp_path, TreeSpec(degraded_pcie=("mlx5_8", "mlx5_9"), down_ports=("mlx5_9",)))
    net = tmp_path / "sys/class/net"
    assert (read(net / "enp220s0f1np1/speed"), read(net / "enp220s0f1np1/duplex")) == ("-1", "unknown")
    assert (read(net / "enp220s0f0np0/speed"), read(net / "enp220s0f0np0/duplex")) == ("200000", "full")
    down, up = (ethtool_stats(tmp_path / "ethtool" / n) for n in ("enp220s0f1np1", "enp220s0f0np0"))
    for name in ("link_down_events_phy", "rx_symbol_err_phy", "rx_pcs_symbol_err_phy", "rx_crc_errors_phy"):
        assert down[name] > 0 and up[name] == 0, name
    for stats in (down, up):  # the slow PCIe link under both functions
        assert stats["rx_pci_signal_integrity"] > 0 and stats["outbound_pci_stalled_rd_events"] > 0
        assert stats["rx_out_of_buffer"] > 0 and stats["rx_discards_phy"] == stats["rx_prio3_discards"] > 0
    for name, stats in (("enp220s0f1np1", down), ("enp220s0f0np0", up)):  # mlx5e reports drops as missed
        assert read(net / name / "statistics/rx_missed_errors") == str(stats["rx_discards_phy"])


def test_cli_reports_an_impossible_device_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "s"), "--devices", "0"]) == 1
    assert capsys.readouterr().err == "sample_tree: a tree needs at least one RDMA device\n"
    assert not (tmp_path / "s").exists()


def test_refuses_an_existing_ethtool_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Stale `ethtool -S` captures from another spec would be served next to the fresh sysfs tree.
    (tmp_path / "ethtool").mkdir()
    assert main([str(tmp_path)]) == 1
    assert capsys.readouterr().err == f"sample_tree: {tmp_path / 'ethtool'} already exists\n"
    assert not (tmp_path / "sys").exists()


def test_cli_seed_changes_identities_and_counters(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # --seed must reach every device: the CLI's tree is the library's tree for that seed, and another
    # seed gives the same device other GUIDs and counters.
    assert main([str(tmp_path / "cli"), "--devices", "1", "--seed", "2"]) == 0
    build_tree(tmp_path / "two", dataclasses.replace(spec_for_devices(1), seed=2))
    build_tree(tmp_path / "one", spec_for_devices(1))
    assert snapshot(tmp_path / "cli") == snapshot(tmp_path / "two")
    for rel in ("node_guid", "ports/1/counters/port_xmit_data", "ports/1/sm_lid"):
        one, two = (read(tmp_path / t / "sys/class/infiniband/mlx5_0" / rel) for t in ("one", "two"))
        assert one != two, rel


def test_vfs_sit_on_their_pfs_numa_node(tmp_path: Path) -> None:
    # mlx5_4 is in the first slot of socket 1: its VF must report node 1 too, or NUMA-pinned jobs
    # using the VF would be placed on the wrong socket.
    sys_root = build_tree(tmp_path, TreeSpec(ib_hcas=5, roce_hcas=0, vfs_per_pf=1, degraded_pcie=()))
    numa = {
        d.name: (read(d / "device/numa_node"), read(d / "device/physfn/numa_node"))
        for d in (sys_root / "class/infiniband").iterdir()
        if (d / "device/physfn").exists()
    }
    assert len(numa) == 5 and all(vf == pf for vf, pf in numa.values())
    assert numa["mlx5_9"] == ("1", "1")  # the VF of mlx5_4


def test_bluefields_beyond_three_cards_wrap_into_domain_0001(tmp_path: Path) -> None:
    # 15 = 8 IB + 7 RoCE functions; cards 0-2 fill domain 0000, the fourth wraps into 0001.
    sys_root = build_tree(tmp_path, spec_for_devices(15))
    addrs = [(sys_root / f"class/infiniband/mlx5_{i}/device").resolve().name for i in range(8, 15)]
    assert addrs == ["0000:dc:00.0", "0000:dc:00.1", "0000:ea:00.0", "0000:ea:00.1",
                     "0000:f4:00.0", "0000:f4:00.1", "0001:dc:00.0"]
    assert (sys_root / "class/net/enP1p220s0f0np0").is_dir()


def test_vf_addresses_follow_sriov_offset_and_stride(with_vfs: Path) -> None:
    # lspci/udev compute VF n at PF devfn + offset + n * stride on the PF's bus.
    pf = (with_vfs / "sys/class/infiniband/mlx5_0/device").resolve()
    off, stride = int(read(pf / "sriov_offset")), int(read(pf / "sriov_stride"))
    dom, bus, _ = pf.name.split(":")
    for n in range(int(read(pf / "sriov_numvfs"))):
        devfn = off + n * stride  # the PF is 00.0
        assert (pf / f"virtfn{n}").resolve().name == f"{dom}:{bus}:{devfn >> 3:02x}.{devfn & 7}"


def test_vf_rdma_device_identifies_as_a_vf(with_vfs: Path) -> None:
    # A VF is an MT4126 with admin-assigned b8ce:f604 GUIDs, not a copy of its CX-7 PF.
    vf, pf = (with_vfs / "sys/class/infiniband" / n for n in ("mlx5_2", "mlx5_0"))
    assert read(vf / "hca_type") == "MT4126" and read(pf / "hca_type") == "MT4129"
    assert read(vf / "node_guid").startswith("b8ce:f604:")
    assert read(pf / "node_guid").startswith("b8ce:f603:")


def test_vfs_carry_a_slice_of_their_pfs_traffic(with_vfs: Path) -> None:
    # The benchmark's 32/128-device trees are mostly VFs; a VF must not look like a whole NDR port.
    def xmit(i: int) -> int:
        return int(read(with_vfs / f"sys/class/infiniband/mlx5_{i}/ports/1/counters/port_xmit_data"))

    assert max(xmit(i) for i in range(2, 8)) < min(xmit(0), xmit(1))


def test_down_port_carries_every_link_loss_counter(with_vfs: Path) -> None:
    # A lost link leaves symbol/receive errors and failed + flushed QPs, not just link_downed.
    port = with_vfs / "sys/class/infiniband/mlx5_1/ports/1"
    for name in ("link_downed", "symbol_error", "port_rcv_errors", "local_link_integrity_errors",
                 "port_xmit_discards"):
        assert int(read(port / "counters" / name)) > 0, name
    for name in ("local_ack_timeout_err", "req_cqe_error", "req_cqe_flush_error", "resp_cqe_flush_error"):
        assert int(read(port / "hw_counters" / name)) > 0, name


def test_roce_faults_reach_every_counter_they_name(tmp_path: Path) -> None:
    # The degraded link stalls writes as well as reads; CRC errors are netdev rx_errors too.
    build_tree(tmp_path, TreeSpec(degraded_pcie=("mlx5_8", "mlx5_9"), down_ports=("mlx5_9",)))
    down = ethtool_stats(tmp_path / "ethtool/enp220s0f1np1")
    for name in ("tx_pci_signal_integrity", "outbound_pci_stalled_wr_events"):
        assert down[name] > 0, name
    stats = tmp_path / "sys/class/net/enp220s0f1np1/statistics"
    assert read(stats / "rx_errors") == read(stats / "rx_crc_errors") == str(down["rx_crc_errors_phy"])
    assert down["rx_crc_errors_phy"] > 0
