"""The PCIe collector's exposition on small sample trees whose PCI function files are then edited.

The sample tree's links are x16 at both ends and mostly untouched, so a current value exported under the
maximum's name (or the device's maximum under the partner's) would look the same there. These trees give
every value its own number, and cover a link that is down and an AER file that ends early.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from rdma_exporter.sample_tree import TreeSpec, build_tree

from conftest import samples, scrape

Sample = dict[tuple[str, tuple[tuple[str, str], ...]], float]
DEVICE = (("device", "mlx5_0"),)


def one_hca(tmp_path: Path) -> tuple[Path, Path]:
    """A one-HCA sample tree: its sysfs root and mlx5_0's PCI function directory (the port is its parent)."""
    sys_root = build_tree(tmp_path / "t", TreeSpec(ib_hcas=1, roce_hcas=0, degraded_pcie=(), down_ports=()))
    return sys_root, (sys_root / "class/infiniband/mlx5_0/device").resolve()


def one_card(tmp_path: Path) -> tuple[Path, Path]:
    """A tree of one BlueField-3 (mlx5_0 and mlx5_1, two functions on one link): its sysfs root and the
    PCIe port above that link."""
    sys_root = build_tree(tmp_path / "t", TreeSpec(ib_hcas=0, roce_hcas=2, degraded_pcie=(), down_ports=()))
    return sys_root, (sys_root / "class/infiniband/mlx5_0/device").resolve().parent


def pcie(metrics: Sample) -> dict[str, float]:
    """mlx5_0's link series, by metric name."""
    return {name: v for (name, labels), v in metrics.items() if name.startswith("rdma_pcie_link") and labels == DEVICE}


def test_every_link_value_is_exported_under_its_own_name(tmp_path: Path) -> None:
    # A Gen5 x16 HCA in a Gen4 x8 slot that trained at Gen3 x4: six different numbers.
    sys_root, fn = one_hca(tmp_path)
    (fn / "current_link_speed").write_text("8.0 GT/s PCIe\n")
    (fn / "current_link_width").write_text("4\n")
    (fn.parent / "max_link_speed").write_text("16.0 GT/s PCIe\n")
    (fn.parent / "max_link_width").write_text("8\n")
    assert pcie(samples(scrape(sys_root))) == {
        "rdma_pcie_link_speed_transfers_per_second": 8e9,
        "rdma_pcie_link_max_speed_transfers_per_second": 32e9,
        "rdma_pcie_link_partner_max_speed_transfers_per_second": 16e9,
        "rdma_pcie_link_width_lanes": 4,
        "rdma_pcie_link_max_width_lanes": 16,
        "rdma_pcie_link_partner_max_width_lanes": 8,
    }


def test_below_its_cards_own_switch_a_device_reports_the_cards_link_to_the_slot(tmp_path: Path) -> None:
    # Two RoCE functions below their card's own PCIe switch (as a ConnectX-8 SuperNIC shows the host),
    # in a Gen4 x16 slot that trained x8: the functions' on-chip links read Gen5 x16 and hide that.
    spec = TreeSpec(ib_hcas=1, roce_hcas=2, degraded_pcie=(), down_ports=(), gen4_slots=("mlx5_1", "mlx5_2"),
                    card_switch=True)  # fmt: skip
    sys_root = build_tree(tmp_path / "t", spec)
    fn = (sys_root / "class/infiniband/mlx5_1/device").resolve()
    downstream, upstream = fn.parent, fn.parent.parent
    assert [p.name for p in (fn, downstream, upstream)] == ["0000:dc:00.0", "0000:db:00.0", "0000:da:00.0"]
    assert (fn / "current_link_speed").read_text() == "32.0 GT/s PCIe\n"  # the on-chip link
    (upstream / "current_link_width").write_text("8\n")
    values = samples(scrape(sys_root))
    for device in ("mlx5_1", "mlx5_2"):
        labels = (("device", device),)
        link = {name: v for (name, key), v in values.items() if name.startswith("rdma_pcie_link") and key == labels}
        assert link == {
            "rdma_pcie_link_speed_transfers_per_second": 16e9,
            "rdma_pcie_link_max_speed_transfers_per_second": 32e9,
            "rdma_pcie_link_partner_max_speed_transfers_per_second": 16e9,  # the Gen4 root port
            "rdma_pcie_link_width_lanes": 8,
            "rdma_pcie_link_max_width_lanes": 16,
            "rdma_pcie_link_partner_max_width_lanes": 16,
        }
    # An HCA straight below its root port still reports its own link.
    assert values[("rdma_pcie_link_speed_transfers_per_second", DEVICE)] == 32e9
    # The slot's root port is the card's partner, reported under its first NIC function only.
    assert {device for device, _ in partner_reports(values)} == {"mlx5_0", "mlx5_1"}
    assert not [key for key in values if key[0] == "rdma_exporter_file_read_errors_total"]


def test_a_root_port_of_the_nics_own_vendor_is_not_taken_for_its_cards_switch(tmp_path: Path) -> None:
    # An Intel NIC (irdma) below an Intel root port, trained Gen4 in a Gen5 slot: its own link, and the
    # root port as its partner (review: the port was read as the card's uplink, and the link paged as
    # degraded against the port's Gen5).
    sys_root, fn = one_hca(tmp_path)
    (fn / "vendor").write_text("0x8086\n")
    assert (fn.parent / "vendor").read_text() == "0x8086\n"
    for name in ("current_link_speed", "max_link_speed"):
        (fn / name).write_text("16.0 GT/s PCIe\n")
    assert pcie(samples(scrape(sys_root))) == {
        "rdma_pcie_link_speed_transfers_per_second": 16e9,
        "rdma_pcie_link_max_speed_transfers_per_second": 16e9,
        "rdma_pcie_link_partner_max_speed_transfers_per_second": 32e9,
        "rdma_pcie_link_width_lanes": 16,
        "rdma_pcie_link_max_width_lanes": 16,
        "rdma_pcie_link_partner_max_width_lanes": 16,
    }


def test_link_files_that_appear_after_the_static_read_are_read_in_the_next_scrape(tmp_path: Path) -> None:
    # A function whose link and AER files were not there when the device's static info was read (cached
    # then until a uevent or the resync): each scrape looks for them again (mutation review: without that,
    # the device had no link series for up to 15 minutes in udev mode).
    from dataclasses import replace

    from rdma_exporter.config import Config
    from rdma_exporter.daemon import build_collector
    from rdma_exporter.parse.pcie import AER_FILES, LINK_FILES

    sys_root, fn = one_hca(tmp_path)
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    names = [name for name in (*LINK_FILES, *AER_FILES.values()) if (fn / name).exists()]
    for name in names:
        (fn / name).rename(hidden / name)
    collector = build_collector(replace(Config(), sysfs=sys_root))
    assert pcie(samples(collector.gather().render_text().decode())) == {}
    for name in names:
        (hidden / name).rename(fn / name)
    assert pcie(samples(collector.gather().render_text().decode()))["rdma_pcie_link_width_lanes"] == 16


def test_a_link_that_is_down_has_no_current_series(tmp_path: Path) -> None:
    # LNKSTA of a link in training or down: the kernel prints "Unknown" and a width of 0. The maxima are
    # still known; the trained values are absent, not 0 (which would read as a link that lost every lane).
    sys_root, fn = one_hca(tmp_path)
    (fn / "current_link_speed").write_text("Unknown\n")
    (fn / "current_link_width").write_text("0\n")
    metrics = samples(scrape(sys_root))
    assert pcie(metrics) == {
        "rdma_pcie_link_max_speed_transfers_per_second": 32e9,
        "rdma_pcie_link_partner_max_speed_transfers_per_second": 32e9,
        "rdma_pcie_link_max_width_lanes": 16,
        "rdma_pcie_link_partner_max_width_lanes": 16,
    }
    failed = [k for k, v in metrics.items() if k[0] == "rdma_exporter_file_read_errors_total" and v]
    assert not failed


def test_an_aer_file_without_its_total_line_gives_no_report_count(tmp_path: Path) -> None:
    # The kernel ends every aer_dev_* file with its TOTAL_ERR_* line; a file cut short before it still
    # gives its per-type counts, but no number of reports for that severity, and is counted as malformed.
    sys_root, fn = one_hca(tmp_path)
    (fn / "aer_dev_correctable").write_text("RxErr 7\nBadTLP 2\n")
    metrics = samples(scrape(sys_root))
    errors = {dict(ls)["type"]: v for (n, ls), v in metrics.items() if n == "rdma_pcie_aer_errors_total"
              and ("error_class", "correctable") in ls}  # fmt: skip
    assert errors == {"RxErr": 7, "BadTLP": 2}
    reports = {dict(ls)["error_class"]: v for (n, ls), v in metrics.items() if n == "rdma_pcie_aer_reports_total"}
    assert reports == {"nonfatal": 0, "fatal": 0}
    failed = {dict(ls)["reason"]: v for (n, ls), v in metrics.items()
              if n == "rdma_exporter_file_read_errors_total" and ("collector", "pcie") in ls}  # fmt: skip
    assert failed == {"malformed": 1}


def test_a_vf_exports_its_own_aer_counters_but_not_its_pfs_link(tmp_path: Path) -> None:
    # A VF may implement AER (SR-IOV makes it optional): its counters are its own, so they are exported;
    # its link is the PF's, exported once under the PF.
    spec = TreeSpec(ib_hcas=1, roce_hcas=0, vfs_per_pf=1, degraded_pcie=(), down_ports=())
    sys_root = build_tree(tmp_path / "t", spec)
    vf = (sys_root / "class/infiniband/mlx5_1/device").resolve()
    assert (vf / "physfn").is_symlink()
    (vf / "aer_dev_correctable").write_text("RxErr 0\nBadTLP 0\nBadDLLP 3\nTOTAL_ERR_COR 3\n")
    metrics = samples(scrape(sys_root))
    vf_label = ("device", "mlx5_1")
    vf_series = {(n, ls): v for (n, ls), v in metrics.items() if n.startswith("rdma_pcie_") and vf_label in ls}
    assert vf_series == {
        ("rdma_pcie_aer_errors_total", (("device", "mlx5_1"), ("error_class", "correctable"), ("type", "RxErr"))): 0,
        ("rdma_pcie_aer_errors_total", (("device", "mlx5_1"), ("error_class", "correctable"), ("type", "BadTLP"))): 0,
        ("rdma_pcie_aer_errors_total", (("device", "mlx5_1"), ("error_class", "correctable"), ("type", "BadDLLP"))): 3,
        ("rdma_pcie_aer_reports_total", (("device", "mlx5_1"), ("error_class", "correctable"))): 3,
    }
    assert metrics[("rdma_pcie_link_width_lanes", DEVICE)] == 16


def test_a_bad_pf_link_file_is_counted_once_not_again_for_each_vf(tmp_path: Path) -> None:
    # Nothing of the link is read for a VF, so a malformed PF file costs the PF's value and one error
    # (review: each VF read and counted it too, 2 reads a VF a scrape on the 128-device tree's 120 VFs).
    spec = TreeSpec(ib_hcas=1, roce_hcas=0, vfs_per_pf=2, degraded_pcie=(), down_ports=())
    sys_root = build_tree(tmp_path / "t", spec)
    pf = (sys_root / "class/infiniband/mlx5_0/device").resolve()
    (pf / "current_link_speed").write_text("fast\n")
    metrics = samples(scrape(sys_root))
    errors = {dict(ls)["device"]: v for (n, ls), v in metrics.items() if n == "rdma_exporter_file_read_errors_total"}
    assert errors == {"mlx5_0": 1}
    assert ("rdma_pcie_link_speed_transfers_per_second", DEVICE) not in metrics
    assert metrics[("rdma_pcie_link_width_lanes", DEVICE)] == 16


def partner_reports(metrics: Sample) -> dict[tuple[str, str], float]:
    """{(device, error_class): value} of the link partner's AER report counts."""
    return {(dict(ls)["device"], dict(ls)["error_class"]): v for (n, ls), v in metrics.items()
            if n == "rdma_pcie_link_partner_aer_reports_total"}  # fmt: skip


def test_the_port_above_a_link_reports_what_it_saw_of_the_device(tmp_path: Path) -> None:
    # The root port counts the errors in what the HCA sent it (a marginal riser's bad TLPs), which the
    # HCA's own counters never see: its TOTAL_ERR_* lines are the device's partner counts.
    sys_root, fn = one_hca(tmp_path)
    port = fn.parent
    (port / "aer_dev_correctable").write_text("RxErr 4\nBadTLP 2\nBadDLLP 0\nTOTAL_ERR_COR 5\n")
    (port / "aer_dev_nonfatal").write_text("MalfTLP 1\nTOTAL_ERR_NONFATAL 1\n")
    metrics = samples(scrape(sys_root))
    assert partner_reports(metrics) == {("mlx5_0", "correctable"): 5, ("mlx5_0", "nonfatal"): 1, ("mlx5_0", "fatal"): 0}
    # The device's own counts are still its own files'.
    assert metrics[("rdma_pcie_aer_reports_total", (("device", "mlx5_0"), ("error_class", "nonfatal")))] == 0
    # A port without AER (or a function on a root bus) has no partner counts, and no error either.
    for name in ("aer_dev_correctable", "aer_dev_nonfatal", "aer_dev_fatal"):
        (port / name).unlink()
    metrics = samples(scrape(sys_root))
    assert partner_reports(metrics) == {}
    assert not [k for k, v in metrics.items() if k[0] == "rdma_exporter_file_read_errors_total" and v]


def test_a_link_shared_by_two_devices_reports_its_port_once_a_scrape(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A BlueField-3's two ports are two functions on one link: the port's counts are read and exported
    # once, under the lower PCI address, not once for each (two alerts for one error, and the counter
    # file read twice a scrape).
    from dataclasses import replace

    import rdma_exporter.parse.pcie as parse_pcie
    from rdma_exporter.config import Config
    from rdma_exporter.daemon import build_collector

    sys_root, port = one_card(tmp_path)
    first, second = ((sys_root / f"class/infiniband/{d}/device").resolve() for d in ("mlx5_0", "mlx5_1"))
    assert first.parent == second.parent == port and first.name < second.name
    (port / "aer_dev_fatal").write_text("SDES 1\nTOTAL_ERR_FATAL 1\n")
    reads: list[str] = []
    read_aer = parse_pcie._read_aer

    def counted(path: str, reader: object) -> object:
        reads.append(path)
        return read_aer(path, reader)  # type: ignore[arg-type]

    monkeypatch.setattr(parse_pcie, "_read_aer", counted)
    collector = build_collector(replace(Config(), sysfs=sys_root))
    aer_files = ("aer_dev_correctable", "aer_dev_nonfatal", "aer_dev_fatal")
    for scrapes in (1, 2):  # each scrape reads the port once: a claim lasts one scrape
        metrics = samples(collector.gather().render_text().decode())
        reporter = {("mlx5_0", "correctable"): 0, ("mlx5_0", "nonfatal"): 0, ("mlx5_0", "fatal"): 1}
        assert partner_reports(metrics) == reporter
        port_reads = sorted(path for path in reads if Path(path).parent == port)
        assert port_reads == sorted(str(port / name) for name in aer_files for _ in range(scrapes))


def test_a_shared_port_is_reported_under_the_lowest_device_exported(tmp_path: Path) -> None:
    # With the card's first function excluded by the device filter, its second still reports the port
    # (review: ownership chosen among all the card's functions, exported or not, lost the port's counts).
    import re

    sys_root, port = one_card(tmp_path)
    (port / "aer_dev_nonfatal").write_text("MalfTLP 2\nTOTAL_ERR_NONFATAL 2\n")
    expected = {"correctable": 0, "nonfatal": 2, "fatal": 0}
    for exclude, reporter in ((None, "mlx5_0"), ("mlx5_0", "mlx5_1")):
        pattern = re.compile(exclude) if exclude else None
        for _ in range(3):  # whichever job reads the port first
            found = partner_reports(samples(scrape(sys_root, device_exclude=pattern)))
            assert found == {(reporter, cls): v for cls, v in expected.items()}, exclude


def test_the_lowest_device_reports_the_port_when_its_sibling_read_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Which function reads the port is whichever asks first; the series stays under the lowest address,
    # so that it does not move between devices from scrape to scrape (review: only the order in which
    # mlx5_0 also read it was tested).
    import threading

    import rdma_exporter.collect.pcie as collect_pcie

    sys_root, port = one_card(tmp_path)
    (port / "aer_dev_nonfatal").write_text("MalfTLP 2\nTOTAL_ERR_NONFATAL 2\n")
    read = collect_pcie.PcieSource.read
    readers: list[str] = []
    second_read = threading.Event()

    def second_first(self: object, ctx: object, device: object, reader: object) -> object:
        if device.name == "mlx5_0":  # type: ignore[attr-defined]
            second_read.wait(5)  # the pool spills mlx5_1's job to another thread meanwhile
        link = read(self, ctx, device, reader)  # type: ignore[arg-type]
        if link is not None and link.partner_aer_totals is not None:
            readers.append(device.name)  # type: ignore[attr-defined]
        if device.name == "mlx5_1":  # type: ignore[attr-defined]
            second_read.set()
        return link

    monkeypatch.setattr(collect_pcie.PcieSource, "read", second_first)
    found = partner_reports(samples(scrape(sys_root)))
    assert readers == ["mlx5_1"]
    assert found == {("mlx5_0", "correctable"): 0, ("mlx5_0", "nonfatal"): 2, ("mlx5_0", "fatal"): 0}


def test_a_port_is_read_again_once_the_device_that_read_it_is_gone(tmp_path: Path) -> None:
    # A claim lasts one scrape: after a driver reload took the card's first function away, the second
    # reads and reports the port in the next scrape (a claim kept across scrapes would leave it unread).
    from dataclasses import replace

    from rdma_exporter.config import Config
    from rdma_exporter.daemon import build_collector

    sys_root, port = one_card(tmp_path)
    (port / "aer_dev_fatal").write_text("SDES 1\nTOTAL_ERR_FATAL 1\n")
    links = {name: sys_root / "class/infiniband" / name for name in ("mlx5_0", "mlx5_1")}
    targets = {name: link.readlink() for name, link in links.items()}
    collector = build_collector(replace(Config(), sysfs=sys_root))

    def reporters() -> set[str]:
        return {device for device, _ in partner_reports(samples(collector.gather().render_text().decode()))}

    links["mlx5_1"].unlink()
    assert reporters() == {"mlx5_0"}  # the only function listed claims the port
    links["mlx5_1"].symlink_to(targets["mlx5_1"])
    links["mlx5_0"].unlink()
    assert reporters() == {"mlx5_1"}


# The kernel never prints these; the debug log quotes at most 40 characters of what it found instead.
LONG_SPEED = "fast " * 10
LONG_COUNT = "BadTLP " + "9" * 40  # a count no u64 holds


@pytest.mark.parametrize(
    ("file", "text", "detail"),
    [
        ("current_link_speed", LONG_SPEED, f"not a link speed: {LONG_SPEED.strip()[:40]!r}"),
        ("current_link_width", "3\n", "not a PCIe link width: 3"),
        ("aer_dev_correctable", f"RxErr 0\n{LONG_COUNT}\nTOTAL_ERR_COR 0\n", f"not 'Name count': {LONG_COUNT[:40]!r}"),
    ],
    ids=["speed", "width", "aer"],
)
def test_a_malformed_file_is_logged_with_its_path_and_what_is_wrong(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, file: str, text: str, detail: str
) -> None:
    """At debug level, the one line an operator has to go on names the file and what it held."""
    sys_root, fn = one_hca(tmp_path)
    (fn / file).write_text(text)
    with caplog.at_level(logging.DEBUG, logger="rdma_exporter.collect.engine"):
        scrape(sys_root)
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("read error [pcie]")]
    assert logged == [f"read error [pcie] mlx5_0 malformed: {fn / file}: {detail}"]
