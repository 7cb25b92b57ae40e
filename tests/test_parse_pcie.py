"""PCIe link and AER parsing on small trees in the real sysfs layout."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdma_exporter.parse.pcie import (
    GENERATIONS,
    MAX_AER_TYPES,
    AerFile,
    parse_aer,
    parse_link_speed,
    read_pcie_identity,
    read_pcie_link,
    read_pcie_state,
)
from rdma_exporter.parse.reader import REASON_MALFORMED, SysfsReader

from conftest import record_reads

PF = "0000:3b:00.0"
VF = "0000:3b:00.2"

# The kernel's aer_dev_* layout ("%s %llu" per line, then TOTAL_ERR_*), with a few errors counted.
AER_CORRECTABLE = """RxErr 0
BadTLP 3
BadDLLP 1
Rollover 0
Timeout 2
NonFatalErr 0
CorrIntErr 0
HeaderOF 0
dev_cor_errs_bit[14] 4
TOTAL_ERR_COR 10
"""
AER_NONFATAL = """Undefined 0
DLP 0
SDES 0
TLP 0
FCP 0
CmpltTO 1
CmpltAbrt 0
UnxCmplt 0
RxOF 0
MalfTLP 0
ECRC 0
UnsupReq 0
ACSViol 0
UncorrIntErr 0
BlockedTLP 0
AtomicOpBlocked 0
TLPBlockedErr 0
PoisonTLPBlocked 0
TOTAL_ERR_NONFATAL 1
"""
AER_FATAL = AER_NONFATAL.replace("CmpltTO 1", "CmpltTO 0").replace("TOTAL_ERR_NONFATAL 1", "TOTAL_ERR_FATAL 0")


def function(root: Path, address: str, files: dict[str, str]) -> Path:
    path = root / "devices" / "pci0000:3a" / address
    path.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (path / name).write_text(content)
    return path


@pytest.mark.parametrize(
    ("text", "gts", "gen"),
    [
        ("32.0 GT/s PCIe", 32.0, 5),
        ("16.0 GT/s PCIe\n", 16.0, 4),
        ("64.0 GT/s PCIe", 64.0, 6),
        ("128.0 GT/s PCIe", 128.0, 7),  # PCIe 7.0, as pci_speed_string() names it
        ("16.0 GT/s", 16.0, 4),
        ("8 GT/s", 8.0, 3),
        ("8.0 GT/s PCIe", 8.0, 3),
        ("5 GT/s", 5.0, 2),
        ("5.0 GT/s PCIe", 5.0, 2),
        ("2.5 GT/s", 2.5, 1),
        ("2.5 GT/s PCIe", 2.5, 1),
        ("Unknown", None, None),
        ("Unknown speed", None, None),
        ("33 MHz PCI", None, None),
        ("", None, None),
        ("fast", None, None),
        ("0 GT/s", None, None),
        ("-8 GT/s", None, None),
        ("16.0 GT/s PCIe x16", None, None),  # more than a speed: not one the kernel printed
    ],
)
def test_parse_link_speed(text: str, gts: float | None, gen: int | None) -> None:
    assert parse_link_speed(text) == gts
    assert (None if gts is None else GENERATIONS.get(gts)) == gen


def test_parse_aer_real_layout() -> None:
    parsed = parse_aer(AER_CORRECTABLE)
    assert parsed.total == 10
    assert parsed.malformed == ()
    assert parsed.counts["BadTLP"] == 3 and parsed.counts["Timeout"] == 2
    assert parsed.counts["dev_cor_errs_bit[14]"] == 4  # a set bit the kernel has no name for
    assert "TOTAL_ERR_COR" not in parsed.counts
    assert len(parsed.counts) == 9
    assert list(parsed.counts)[:2] == ["RxErr", "BadTLP"]


def test_parse_aer_garbage() -> None:
    parsed = parse_aer(
        "BadTLP 1\nBadTLP 5\nno-value\nBad TLP 2\nRxErr -1\nRxErr x\n\nTimeout 99999999999999999999999\n"
    )
    assert parsed.counts == {"BadTLP": 1}
    assert parsed.total is None
    assert parsed.malformed == ("no-value", "Bad TLP 2", "RxErr -1", "RxErr x", "Timeout 99999999999999999999999")
    # More digits than int() converts (4300): malformed like any other, not a ValueError for the device.
    huge = "Timeout " + "9" * 5000
    assert parse_aer(f"BadTLP 1\n{huge}\n") == AerFile({"BadTLP": 1}, None, (huge,))


def test_pf_link_degraded_with_aer(tmp_path: Path) -> None:
    pf = function(
        tmp_path,
        PF,
        {
            "current_link_speed": "16.0 GT/s PCIe\n",
            "max_link_speed": "32.0 GT/s PCIe\n",
            "current_link_width": "8\n",
            "max_link_width": "16\n",
            "aer_dev_correctable": AER_CORRECTABLE,
            "aer_dev_nonfatal": AER_NONFATAL,
            "aer_dev_fatal": AER_FATAL,
        },
    )
    reader = SysfsReader("mlx5_0")
    got = read_pcie_link(pf, reader)
    assert got is not None
    assert reader.errors.total() == 0
    assert (got.address, got.link_address, got.via_physfn) == (PF, PF, False)
    assert (got.current_speed_gts, got.max_speed_gts) == (16.0, 32.0)
    assert (got.current_width, got.max_width) == (8, 16)
    assert got.aer[("correctable", "BadTLP")] == 3
    assert got.aer[("nonfatal", "CmpltTO")] == 1
    assert got.aer[("fatal", "CmpltTO")] == 0
    assert got.aer_totals == {"correctable": 10, "nonfatal": 1, "fatal": 0}
    assert not any(name.startswith("TOTAL_") for _, name in got.aer)
    assert len(got.aer) == 9 + 18 + 18


def test_a_vf_names_its_pfs_link_and_reads_nothing_of_it(tmp_path: Path) -> None:
    # The PF's link is the PF's to report (collect.pcie exports it once): a VF reads none of it, so a bad PF
    # file is not read and counted again for each VF.
    function(
        tmp_path,
        PF,
        {
            "current_link_speed": "32.0 GT/s PCIe\n",
            "max_link_speed": "32.0 GT/s PCIe\n",
            "current_link_width": "16\n",
            "max_link_width": "16\n",
        },
    )
    # A VF's own link registers are reserved: the kernel shows Unknown / 0 for them.
    vf = function(
        tmp_path,
        VF,
        {
            "current_link_speed": "Unknown\n",
            "max_link_speed": "Unknown\n",
            "current_link_width": "0\n",
            "max_link_width": "0\n",
            "aer_dev_correctable": "RxErr 2\nTOTAL_ERR_COR 2\n",
        },
    )
    os.symlink(f"../{PF}", vf / "physfn")
    # Reached the way collectors do: through an RDMA device's `device` link.
    os.symlink(vf, tmp_path / "device")
    reader = SysfsReader("mlx5_5")
    got = read_pcie_link(tmp_path / "device", reader)
    assert got is not None
    assert reader.errors.total() == 0
    assert (got.address, got.link_address, got.via_physfn) == (VF, PF, True)
    assert (got.current_speed_gts, got.current_width, got.max_speed_gts, got.max_width) == (None, None, None, None)
    assert (got.partner_max_speed_gts, got.partner_max_width) == (None, None)
    assert got.aer == {("correctable", "RxErr"): 2}  # the VF's own counters, not the PF's
    assert got.aer_totals == {"correctable": 2}


@pytest.mark.parametrize(
    "link",
    [
        # A link that is down: the kernel prints "Unknown speed" and a width of 0; 255 is the width
        # pcie_get_width_cap() gives when LNKCAP reads 0.
        {"current_link_speed": "Unknown speed\n", "max_link_speed": "8 GT/s\n", "current_link_width": "0\n",
         "max_link_width": "255\n"},
        # A dead or surprise-removed device answers config reads with all ones: current_link_width prints
        # the 6-bit Negotiated Link Width field of LNKSTA (mask 0x03f0), which decodes to 63, and older
        # kernels print max_link_width from LNKCAP the same way.
        {"current_link_speed": "Unknown\n", "max_link_speed": "Unknown\n", "current_link_width": "63\n",
         "max_link_width": "63\n"},
    ],
    ids=["down", "all-ones"],
)  # fmt: skip
def test_unknown_link_is_a_state_not_a_failed_read(tmp_path: Path, link: dict[str, str]) -> None:
    reader = SysfsReader("mlx5_0")
    got = read_pcie_link(function(tmp_path, PF, link), reader)
    assert got is not None
    assert (got.current_width, got.max_width, got.current_speed_gts) == (None, None, None)
    assert got.max_speed_gts == (8.0 if link["max_link_speed"] == "8 GT/s\n" else None)
    assert (got.aer, got.aer_totals) == ({}, {})
    assert reader.errors.total() == 0


@pytest.mark.parametrize(("max_width", "all_ones"), [("63\n", True), ("0\n", False), ("255\n", False), ("16\n", False)])
def test_identity_says_when_the_capability_read_all_ones(tmp_path: Path, max_width: str, all_ones: bool) -> None:
    # 63 is a device in reset or gone, worth reading again; 0 (a VF's reserved registers) and 255 are not.
    # Its maximum speed came from the same dead read (LNKCAP2 all ones: the highest speed the kernel
    # knows, 64.0 GT/s on 6.x), so it is unknown too, not a Gen6 card.
    pf = function(tmp_path, PF, {"max_link_speed": "64.0 GT/s PCIe\n", "max_link_width": max_width})
    identity = read_pcie_identity(pf, SysfsReader("mlx5_0"))
    assert identity is not None
    assert identity.all_ones is all_ones
    assert identity.max_speed_gts == (None if all_ones else 64.0)


def test_garbage_link_files_are_malformed(tmp_path: Path) -> None:
    bad = function(
        tmp_path,
        "0000:3b:00.1",
        {
            "current_link_speed": "very fast\n",
            "max_link_speed": "",
            "current_link_width": "3\n",
            "max_link_width": "x16\n",
            "aer_dev_fatal": "Undefined 0\nthis is not aer\nTOTAL_ERR_FATAL 0\n",
        },
    )
    reader = SysfsReader("mlx5_1")
    got = read_pcie_link(bad, reader)
    assert got is not None
    assert None is got.current_speed_gts is got.max_speed_gts is got.current_width is got.max_width
    assert got.aer == {("fatal", "Undefined"): 0}
    assert reader.errors.counts == {("mlx5_1", REASON_MALFORMED): 5}


def test_not_pcie_or_gone(tmp_path: Path) -> None:
    reader = SysfsReader("rxe0")
    assert read_pcie_link(tmp_path / "nope", reader) is None
    conventional = function(tmp_path, "0000:00:01.0", {"vendor": "0x8086\n"})
    assert read_pcie_link(conventional, reader) is None
    assert reader.errors.total() == 0


def test_only_some_files_present(tmp_path: Path) -> None:
    # Old kernels (< 4.17) have link files but no AER statistics.
    pf = function(tmp_path, PF, {"current_link_speed": "8.0 GT/s PCIe\n", "current_link_width": "4\n"})
    reader = SysfsReader("mlx5_0")
    got = read_pcie_link(pf, reader)
    assert got is not None
    assert (got.current_speed_gts, got.current_width, got.max_speed_gts, got.max_width) == (8.0, 4, None, None)
    assert reader.errors.total() == 0


# Random text almost never parses, so the properties below would only ever see None: these are shaped
# like the kernel's files, with what a broken driver could put in their numbers and names.
link_speed_like = st.builds(
    "{}{}{}{}GT/s{}{}".format,
    st.sampled_from(["", " ", "\t"]),
    st.sampled_from(["", "", "-", "+"]),
    st.from_regex(r"[0-9]{0,6}(\.[0-9]{0,4})?", fullmatch=True),
    st.sampled_from([" ", "", "  "]),
    st.sampled_from(["", " PCIe", "PCIe", " PCIe x"]),
    st.sampled_from(["", "\n", " \n"]),
)
aer_name_like = st.one_of(
    st.sampled_from(["RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout", "TLP", "TOTAL_ERR_COR", "TOTAL_ERR_FATAL"]),
    st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,34}(\[[0-9]{1,3}\])?", fullmatch=True),
    st.text(min_size=1, max_size=10),
)
aer_value_like = st.one_of(st.integers(-3, 2**64 + 3).map(str), st.text(max_size=6))
aer_text_like = st.lists(
    st.one_of(st.builds("{} {}".format, aer_name_like, aer_value_like), st.text(max_size=12)), max_size=70
).map("\n".join)


@given(st.one_of(st.text(max_size=40), link_speed_like))
def test_parse_link_speed_never_raises(text: str) -> None:
    gts = parse_link_speed(text)
    assert gts is None or 0 < gts < 10_000


@given(st.integers(0, 9999), st.from_regex(r"(\.[0-9]{1,3})?", fullmatch=True), st.sampled_from(["", " PCIe"]))
def test_parse_link_speed_reads_every_well_formed_speed(whole: int, fraction: str, suffix: str) -> None:
    speed = float(f"{whole}{fraction}")
    assert parse_link_speed(f"{whole}{fraction} GT/s{suffix}\n") == (speed if speed > 0 else None)


@given(st.one_of(st.text(max_size=600), aer_text_like))
def test_parse_aer_never_raises(text: str) -> None:
    parsed = parse_aer(text)
    for name, value in parsed.counts.items():
        assert name.isascii() and name.isprintable() and " " not in name and not name.startswith("TOTAL_ERR_")
        assert 0 <= value < 2**64
    assert parsed.total is None or 0 <= parsed.total < 2**64
    assert len(parsed.counts) + len(parsed.malformed) <= len(text.splitlines())


@given(
    st.lists(
        st.tuples(
            st.one_of(
                st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,31}(\[[0-9]{1,2}\])?", fullmatch=True),
                st.sampled_from(["TOTAL_ERR_COR", "TOTAL_ERR_FATAL", "RxErr"]),  # totals and repeats in the body
            ),
            st.integers(0, 2**64 - 1),
        ),
        max_size=MAX_AER_TYPES,  # at most that many names, all kept
    ),
    st.integers(0, 2**64 - 1),
)
def test_parse_aer_round_trips_kernel_format(lines: list[tuple[str, int]], total: int) -> None:
    text = "".join(f"{name} {value}\n" for name, value in lines) + f"TOTAL_ERR_NONFATAL {total}\n"
    parsed = parse_aer(text)
    expected: dict[str, int] = {}
    totals = []
    for name, value in lines:  # a repeated name keeps its first value, as does the total
        if name.startswith("TOTAL_ERR_"):
            totals.append(value)
        else:
            expected.setdefault(name, value)
    assert (parsed.counts, parsed.total, parsed.malformed) == (expected, [*totals, total][0], ())


def test_the_port_above_gives_the_link_partners_maxima(tmp_path: Path) -> None:
    """A Gen5 HCA in a Gen4 slot trains at Gen4: that is the best its link can do, not a degraded link (the
    alert rules cap the device's maximum by its partner's). The port above it (its directory's parent)
    says so; a device on a root bus has no such port."""
    link = {
        "current_link_speed": "16.0 GT/s PCIe\n",
        "max_link_speed": "32.0 GT/s PCIe\n",
        "current_link_width": "16\n",
        "max_link_width": "16\n",
    }
    port = function(tmp_path, "0000:3a:01.0", {"max_link_speed": "16.0 GT/s PCIe\n", "max_link_width": "16\n"})
    in_gen4_slot = port / PF
    in_gen4_slot.mkdir()
    for name, text in link.items():
        (in_gen4_slot / name).write_text(text)
    reader = SysfsReader("mlx5_0")
    got = read_pcie_link(in_gen4_slot, reader)
    assert got is not None and reader.errors.total() == 0
    assert (got.partner_max_speed_gts, got.partner_max_width) == (16.0, 16)
    # The same device and link right on the root bus: no partner known, judged by its own maximum.
    on_root_bus = function(tmp_path, "0000:3a:02.0", link)
    got = read_pcie_link(on_root_bus, reader)
    assert got is not None and reader.errors.total() == 0
    assert (got.partner_max_speed_gts, got.partner_max_width) == (None, None)


def test_parse_aer_bounds_and_repeated_total() -> None:
    # Counters are u64 ("%llu"): 2**64 - 1 is a count, 2**64 cannot be one. A repeated TOTAL_ERR_* line
    # keeps its first value, as a repeated error type does.
    parsed = parse_aer(f"RxErr {2**64 - 1}\nBadTLP {2**64}\nTOTAL_ERR_COR 3\nTOTAL_ERR_COR 9\n")
    assert parsed.counts == {"RxErr": 2**64 - 1}
    assert parsed.malformed == (f"BadTLP {2**64}",)
    assert parsed.total == 3


def pf_link(
    current_speed: str, current_width: str, max_speed: str = "32.0 GT/s PCIe\n", max_width: str = "16\n"
) -> dict[str, str]:
    return {
        "current_link_speed": current_speed,
        "max_link_speed": max_speed,
        "current_link_width": current_width,
        "max_link_width": max_width,
    }


def x16_pf_at_x8_behind_a_port(tmp_path: Path, port_max_width: str) -> Path:
    """An x16 Gen5 PF trained x8, under a Gen5 root port whose max_link_width file reads `port_max_width`."""
    port = function(tmp_path, "0000:3a:01.0", {"max_link_speed": "32.0 GT/s PCIe\n", "max_link_width": port_max_width})
    pf = port / PF
    pf.mkdir()
    for name, text in pf_link("32.0 GT/s PCIe\n", "8\n").items():
        (pf / name).write_text(text)
    return pf


def test_the_link_partner_caps_the_width_too(tmp_path: Path) -> None:
    """An x16 HCA in a slot wired x8 (its root port's maximum is x8) trains x8 at best: not degraded, as the
    alert rules judge it from the partner's maximum width."""
    in_x8_slot = x16_pf_at_x8_behind_a_port(tmp_path, "8\n")
    reader = SysfsReader("mlx5_0")
    got = read_pcie_link(in_x8_slot, reader)
    assert got is not None and reader.errors.total() == 0
    assert (got.partner_max_speed_gts, got.partner_max_width, got.max_width, got.current_width) == (32.0, 8, 16, 8)


@pytest.mark.parametrize(("partner_width", "errors"), [("255\n", 0), ("63\n", 0), ("0\n", 0), ("3\n", 1)])
def test_a_partner_width_that_is_no_width_is_unknown(tmp_path: Path, partner_width: str, errors: int) -> None:
    """The port above answers for its width as the device does: 0, 63 and 255 are unknown, and a width the
    spec does not define is a malformed file; neither is exported as that many lanes."""
    pf = x16_pf_at_x8_behind_a_port(tmp_path, partner_width)
    reader = SysfsReader("mlx5_0")
    got = read_pcie_link(pf, reader)
    assert got is not None
    assert (got.partner_max_speed_gts, got.partner_max_width) == (32.0, None)
    assert reader.errors.total() == errors


def test_function_with_aer_files_only_is_read(tmp_path: Path) -> None:
    # A function whose link files are not shown still has AER statistics worth exporting.
    only_aer = function(tmp_path, PF, {"aer_dev_correctable": "RxErr 5\nTOTAL_ERR_COR 5\n"})
    reader = SysfsReader("mlx5_0")
    got = read_pcie_link(only_aer, reader)
    assert got is not None and reader.errors.total() == 0
    assert None is got.current_speed_gts is got.max_speed_gts is got.current_width is got.max_width
    assert (got.aer, got.aer_totals) == ({("correctable", "RxErr"): 5}, {"correctable": 5})


def test_a_bus_speed_in_mhz_is_no_link_speed_but_no_error(tmp_path: Path) -> None:
    # pci_speed_string() also names conventional PCI / PCI-X bus speeds ("33 MHz PCI", "133 MHz PCI-X"):
    # not a PCIe rate, and not garbage either.
    pf = function(tmp_path, PF, pf_link("33 MHz PCI\n", "16\n", "133 MHz PCI-X\n"))
    reader = SysfsReader("mlx5_0")
    got = read_pcie_link(pf, reader)
    assert got is not None
    assert (got.current_speed_gts, got.max_speed_gts) == (None, None)
    assert reader.errors.total() == 0


def test_function_removed_after_its_identity_was_read_is_gone(tmp_path: Path) -> None:
    # Hot removal between the cached static read and a scrape: no link at all (no series), not a link
    # whose every value is unknown, and no failed reads for the files that went with it.
    pf = function(tmp_path, PF, {**pf_link("32.0 GT/s PCIe\n", "16\n"), "aer_dev_correctable": AER_CORRECTABLE})
    reader = SysfsReader("mlx5_0")
    identity = read_pcie_identity(pf, reader)
    assert identity is not None and identity.max_speed_gts == 32.0
    shutil.rmtree(pf)
    assert read_pcie_state(pf, identity, reader) is None
    assert reader.errors.total() == 0


@pytest.mark.parametrize("width", [1, 2, 4, 8, 12, 16, 32])
def test_every_width_the_spec_defines_is_a_width(tmp_path: Path, width: int) -> None:
    # LNKCAP/LNKSTA encode x1, x2, x4, x8, x12, x16 and x32: an x1 management function or an x32 slot
    # is as real a link as an x16 one.
    pf = function(tmp_path, PF, pf_link("8.0 GT/s PCIe\n", f"{width}\n", "8.0 GT/s PCIe\n", f"{width}\n"))
    reader = SysfsReader("mlx5_0")
    got = read_pcie_link(pf, reader)
    assert got is not None and reader.errors.total() == 0
    assert (got.current_width, got.max_width) == (width, width)


@pytest.mark.parametrize("width", ["3\n", "5\n", "24\n", "64\n"])
def test_a_width_the_spec_does_not_define_is_malformed(tmp_path: Path, width: str) -> None:
    pf = function(tmp_path, PF, pf_link("8.0 GT/s PCIe\n", width))
    reader = SysfsReader("mlx5_0")
    got = read_pcie_link(pf, reader)
    assert got is not None and (got.current_width, got.max_width) == (None, 16)
    assert reader.errors.counts == {("mlx5_0", REASON_MALFORMED): 1}


def test_a_width_of_a_link_retraining_or_an_unread_maximum_is_unknown(tmp_path: Path) -> None:
    # Both speeds known, the trained width not (the link is retraining: LNKSTA's width reads 0).
    pf = function(tmp_path, PF, pf_link("16.0 GT/s PCIe\n", "0\n"))
    got = read_pcie_link(pf, SysfsReader("mlx5_0"))
    assert got is not None and (got.current_speed_gts, got.current_width) == (16.0, None)
    # The same for the device's maximum width (LNKCAP read 0: pcie_get_width_cap() gives 255).
    (pf / "current_link_width").write_text("16\n")
    (pf / "max_link_width").write_text("255\n")
    got = read_pcie_link(pf, SysfsReader("mlx5_0"))
    assert got is not None and (got.current_width, got.max_width) == (16, None)


def test_aer_lines_that_are_not_name_and_count_are_malformed() -> None:
    # "%s %llu": one C identifier, one ASCII decimal. Anything else is a line the kernel did not print,
    # and must neither become an error type (a `type` label) nor break the scrape.
    # The kernel numbers a set bit it has no name for below 32: a 3-digit index is no bit of a 32-bit register.
    lines = ["RxErr 1 2", "Rx-Err 2", "1394 0", "_ 3", "RxErr \u00b2", "RxErr \u0663", "BadTLP[3]x 1",
             "dev_cor_errs_bit[100] 1"]
    parsed = parse_aer("\n".join(["Timeout 4", *lines, "TOTAL_ERR_COR 4"]) + "\n")
    assert parsed.counts == {"Timeout": 4}
    assert parsed.total == 4
    assert parsed.malformed == tuple(lines)


def test_a_non_ascii_digit_in_an_aer_file_is_counted_not_raised(tmp_path: Path) -> None:
    # "²" is a digit to str.isdigit() but not to int(): the file is malformed, the rest is still read.
    pf = function(tmp_path, PF, {"aer_dev_correctable": "RxErr \u00b2\nBadTLP 3\nTOTAL_ERR_COR 3\n"})
    reader = SysfsReader("mlx5_0")
    got = read_pcie_link(pf, reader)
    assert got is not None
    assert (got.aer, got.aer_totals) == ({("correctable", "BadTLP"): 3}, {"correctable": 3})
    assert reader.errors.counts == {("mlx5_0", REASON_MALFORMED): 1}


def test_aer_file_gone_after_its_identity_was_read(tmp_path: Path) -> None:
    # The identity (which AER files exist) is cached; a file that is gone at scrape time (the function
    # is being removed) leaves the other severities read, and is no failed read.
    files = {"aer_dev_correctable": AER_CORRECTABLE, "aer_dev_nonfatal": AER_NONFATAL, "aer_dev_fatal": AER_FATAL}
    pf = function(tmp_path, PF, {**pf_link("32.0 GT/s PCIe\n", "16\n"), **files})
    reader = SysfsReader("mlx5_0")
    identity = read_pcie_identity(pf, reader)
    assert identity is not None
    (pf / "aer_dev_correctable").unlink()
    got = read_pcie_state(pf, identity, reader)
    assert got is not None and reader.errors.total() == 0
    assert got.aer_totals == {"nonfatal": 1, "fatal": 0}
    assert got.aer[("nonfatal", "CmpltTO")] == 1 and ("correctable", "BadTLP") not in got.aer


def test_the_partner_is_found_through_the_rdma_device_link(tmp_path: Path) -> None:
    # Collectors reach the function through /sys/class/infiniband/<dev>/device, a symlink: the port above
    # is the parent of where it points, not of the link. A VF names its PF's link and reads nothing of it.
    port = function(tmp_path, "0000:3a:01.0", {"max_link_speed": "16.0 GT/s PCIe\n", "max_link_width": "8\n"})
    pf, vf = port / PF, port / VF
    pf.mkdir()
    vf.mkdir()
    for name, text in pf_link("16.0 GT/s PCIe\n", "8\n").items():
        (pf / name).write_text(text)
    for name, text in pf_link("Unknown\n", "0\n", "Unknown\n", "0\n").items():
        (vf / name).write_text(text)
    os.symlink(f"../{PF}", vf / "physfn")
    for rdma, target in (("mlx5_0", pf), ("mlx5_1", vf)):
        (tmp_path / rdma).mkdir()
        os.symlink(os.path.relpath(target, tmp_path / rdma), tmp_path / rdma / "device")
        reader = SysfsReader(rdma)
        got = read_pcie_link(tmp_path / rdma / "device", reader)
        assert got is not None and reader.errors.total() == 0
        partner = (16.0, 8) if rdma == "mlx5_0" else (None, None)
        assert (got.link_address, got.partner_max_speed_gts, got.partner_max_width) == (PF, *partner), rdma


def test_a_function_without_aer_files_is_not_probed_for_them_each_scrape(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Kernels before 4.17, and VFs without AER, have no aer_dev_* files: the static read says so once, and
    # a scrape does not try (and fail) to open three files per function that are not there.
    pf = function(tmp_path, PF, pf_link("32.0 GT/s PCIe\n", "16\n"))
    reader = SysfsReader("mlx5_0")
    identity = read_pcie_identity(pf, reader)
    assert identity is not None
    opened = record_reads(monkeypatch)
    got = read_pcie_state(pf, identity, reader)
    assert got is not None and reader.errors.total() == 0
    assert sorted(os.path.basename(p) for p in opened) == ["current_link_speed", "current_link_width"]
