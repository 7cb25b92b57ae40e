"""Parse a PCI function's PCIe link (speed, width, and the link partner's maxima) and AER error counters.

Pure functions over a PCI function directory (`/sys/bus/pci/devices/<address>`, or an RDMA device's
`device` link) returning typed dataclasses; no Prometheus imports. A NIC that trained below its
maximum speed or width (a bad slot, riser or bifurcation setting) silently caps RDMA bandwidth, and
AER counters show the link errors that precede it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Final

from .reader import PCI_ADDRESS, REASON_MALFORMED, SysfsReader, exists, is_dir, link_name, parse_uint

# Transfer rate per lane -> PCIe generation.
GENERATIONS: Final[dict[float, int]] = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6, 128.0: 7}
# Widths the spec defines (x1..x32). The kernel prints the 6-bit width field of LNKSTA (current) or
# LNKCAP (max) as read: 0 for a link that is down, 63 when a dead or surprise-removed device answers the
# config read with all ones. Newer kernels print max_link_width via pcie_get_width_cap(), which gives
# PCIE_LNK_WIDTH_UNKNOWN (255) when LNKCAP reads 0. All three mean "unknown", not a malformed file.
VALID_WIDTHS: Final = frozenset({1, 2, 4, 8, 12, 16, 32})
_ALL_ONES_WIDTH: Final = 63
_UNKNOWN_WIDTHS: Final = frozenset({0, _ALL_ONES_WIDTH, 255})

AER_FILES: Final = {
    "correctable": "aer_dev_correctable",
    "nonfatal": "aer_dev_nonfatal",
    "fatal": "aer_dev_fatal",
}
LINK_FILES: Final = ("current_link_speed", "max_link_speed", "current_link_width", "max_link_width")

# New kernels print "32.0 GT/s PCIe", older ones "8 GT/s"; both "Unknown" and "Unknown speed" exist.
_SPEED: Final = re.compile(r"^\s*([0-9]{1,4}(?:\.[0-9]{1,3})?)\s*GT/s(?:\s+PCIe)?\s*$")
_NO_SPEED: Final = re.compile(r"^\s*(?:Unknown(?:\s+speed)?|.*\bMHz\b.*)\s*$", re.IGNORECASE)
# AER stat names are C identifiers; a set bit without a name prints as e.g. "dev_cor_errs_bit[14]".
# The kernel's AER names are short ("CorrIntErr", "TLPBlockedErr") and a severity has at most 32 of
# them: longer names, or more of them, are not a file the kernel wrote, and each would be a label value.
_AER_NAME: Final = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,31}(?:\[[0-9]{1,2}\])?$")
MAX_AER_TYPES: Final = 64
_AER_TOTAL_PREFIX: Final = "TOTAL_ERR_"
_BRIDGE_CLASS: Final = "0x0604"  # PCI-to-PCI bridge: a root port or a switch port


@dataclass(frozen=True, slots=True)
class AerFile:
    """One aer_dev_* file: per-type counts, the TOTAL_ERR_* line, and the lines that did not parse."""

    counts: dict[str, int] = field(default_factory=dict)
    total: int | None = None
    malformed: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PcieLink:
    """The PCIe link and AER counters of one PCI function. Values a file could not give are None.

    A VF has no link of its own (its link registers read as zero), and its PF's link is the PF's to
    report: for a VF `via_physfn` is True, `link_address` is the PF's address and no link value is
    read. A function below its card's own PCIe switch has the card's link to the slot: `link_address`
    is the switch's upstream port. AER counters are always the function's own.
    """

    address: str
    link_address: str
    via_physfn: bool
    current_speed_gts: float | None
    max_speed_gts: float | None
    current_width: int | None
    max_width: int | None
    aer: dict[tuple[str, str], int]  # (severity correctable|nonfatal|fatal, error type) -> count
    aer_totals: dict[str, int]  # severity -> the file's TOTAL_ERR_* value
    # The port at the other end of the link (a root port or a switch's downstream port): the link
    # trains at the lower of the two ends' maxima, so a Gen5 HCA in a Gen4 slot is not degraded.
    partner_max_speed_gts: float | None = None
    partner_max_width: int | None = None
    # The TOTAL_ERR_* lines of that port's own aer_dev_* files: errors it saw in what came up the link
    # (the device's own files count only what it received). None where not read for this device: the
    # port has no AER files, or another function of the card read them in this scrape.
    partner_address: str = ""
    partner_aer_totals: dict[str, int] | None = None


def parse_link_speed(text: str) -> float | None:
    """`32.0 GT/s PCIe`, `16.0 GT/s`, `8 GT/s`, `2.5 GT/s` -> GT/s per lane; None for Unknown or garbage."""
    match = _SPEED.match(text)
    if match is None:
        return None
    speed = float(match.group(1))
    return speed if speed > 0 else None


@lru_cache(maxsize=512)
def parse_aer(text: str) -> AerFile:
    """Parse an aer_dev_* file: `Name value` lines; `TOTAL_ERR_*` is kept apart from the per-type ones.

    Lines that are not `identifier u64` are returned in `malformed`; a repeated name keeps its first value.
    The counts almost never move, so parses are cached by text; the result must not be modified.
    """
    counts: dict[str, int] = {}
    total: int | None = None
    malformed: list[str] = []
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        value = parse_uint(parts[1]) if len(parts) == 2 and _AER_NAME.match(parts[0]) else None
        if value is None:
            malformed.append(line)
            continue
        name = parts[0]
        if name.startswith(_AER_TOTAL_PREFIX):
            if total is None:
                total = value
        elif name in counts or len(counts) < MAX_AER_TYPES:
            counts.setdefault(name, value)
        else:
            malformed.append(line)
    return AerFile(counts, total, tuple(malformed))


def _speed(path: str | Path, reader: SysfsReader) -> float | None:
    text = reader.text(path, optional=True)
    if text is None:
        return None
    speed = parse_link_speed(text)
    if speed is None and not _NO_SPEED.match(text):
        reader.fail(REASON_MALFORMED, path, f"not a link speed: {text[:40]!r}")
    return speed


def _width(path: str | Path, reader: SysfsReader) -> int | None:
    return _known_width(reader.uint(path, optional=True), path, reader)


def _known_width(width: int | None, path: str | Path, reader: SysfsReader) -> int | None:
    if width is None or width in _UNKNOWN_WIDTHS:
        return None
    if width not in VALID_WIDTHS:
        reader.fail(REASON_MALFORMED, path, f"not a PCIe link width: {width}")
        return None
    return width


@dataclass(frozen=True, slots=True)
class PcieIdentity:
    """The static half of a PCI function's link: where it is read from and what it can do at best.

    A function's maximum speed and width are capabilities of the device and slot; only the trained
    (current) values move, on retraining.
    """

    address: str
    link_dir: Path  # the function itself, for a VF its PF (`physfn`), or its card's switch upstream port
    link_address: str
    via_physfn: bool
    max_speed_gts: float | None
    max_width: int | None
    aer_files: tuple[tuple[str, str], ...] = ()  # (severity, file) of the AER files the function has
    partner_max_speed_gts: float | None = None  # the link partner's maximum, see PcieLink
    partner_max_width: int | None = None
    # The link partner's PCI address and (severity, path) of its AER files; empty where the port has
    # none (or there is no port: a root bus). The functions of one card share the port, so a scrape reads
    # it for one of them only (read_pcie_state's `partner`).
    partner_address: str = ""
    partner_aer_files: tuple[tuple[str, str], ...] = ()
    # The capability read all ones (a width of 63): the device was in reset or gone at that moment, so
    # the maximum is not known yet rather than unknown for good (a VF's reserved registers read 0).
    all_ones: bool = False


def _card_uplink(function_dir: Path, reader: SysfsReader) -> Path | None:
    """The upstream port of a PCIe switch on the function's own card, or None if it has none.

    A ConnectX-8 SuperNIC (or a BlueField that shows its switch to the host) puts its NIC functions
    below a switch of its own, with the GPUs beside them: the function's link to that switch is on the
    chip, and the card's link to the slot is its upstream port's. PCI bridges of the function's own
    vendor directly above it are that switch; the topmost one is its upstream port. A root port (a
    bridge whose parent is the host bridge, which has no vendor file) is never the card's, though it may
    have the NIC's vendor: an Intel NIC under an Intel root port, or the exporter on a BlueField's Arm.
    """
    vendor = reader.text(function_dir / "vendor", optional=True)
    if vendor is None:
        return None
    uplink = None
    bridge = Path(os.path.realpath(function_dir)).parent
    current = reader.text(bridge / "vendor", optional=True)
    while current == vendor:
        above = reader.text(bridge.parent / "vendor", optional=True)
        if above is None:
            break  # a root port
        if not (reader.text(bridge / "class", optional=True) or "").startswith(_BRIDGE_CLASS):
            return None  # not a switch port: a layout this does not know, so the function's own link
        uplink = bridge
        bridge, current = bridge.parent, above
    return uplink


def read_pcie_identity(pci_dir: Path, reader: SysfsReader) -> PcieIdentity | None:
    """Static link attributes of the PCI function at `pci_dir`; None if it is gone or is not PCIe at all."""
    if not is_dir(pci_dir, reader):
        return None
    address = os.path.basename(os.path.realpath(pci_dir))
    physfn = pci_dir / "physfn"
    via_physfn = os.path.islink(physfn)
    link_dir = physfn if via_physfn else pci_dir
    link_address = (link_name(physfn, PCI_ADDRESS) if via_physfn else None) or address
    # Each looked up once: a failed lookup is counted, and twice would count it twice.
    aer_files = tuple((sev, file) for sev, file in AER_FILES.items() if exists(pci_dir / file, reader))
    if via_physfn:
        # A VF (SR-IOV is PCIe only) has only its own AER counters to give: its link is its PF's, which
        # the PF reports. Nothing of the link is read for a VF, so that a bad PF file is neither read
        # nor counted once per VF.
        return PcieIdentity(address, link_dir, link_address, via_physfn, None, None, aer_files)
    uplink = _card_uplink(link_dir, reader)
    if uplink is not None:
        link_dir, link_address = uplink, uplink.name
    if not aer_files and not any(exists(link_dir / name, reader) for name in LINK_FILES):
        return None  # conventional PCI or a virtual device: the kernel shows these files for PCIe only
    max_width_path = link_dir / "max_link_width"
    max_width = reader.uint(max_width_path, optional=True)
    # The parent directory of a PCIe function is the port its link goes to, unless the function sits
    # on a root bus (a root-complex integrated endpoint, or a VM's flat bus): then there is no file.
    partner = Path(os.path.realpath(link_dir)).parent
    partner_aer = tuple(
        (sev, os.fspath(partner / file)) for sev, file in AER_FILES.items() if exists(partner / file, reader)
    )
    all_ones = max_width == _ALL_ONES_WIDTH
    max_speed = _speed(link_dir / "max_link_speed", reader)
    return PcieIdentity(
        address=address,
        link_dir=link_dir,
        link_address=link_address,
        via_physfn=via_physfn,
        # Read from the same dead capability as the width: pcie_get_speed_cap() takes the highest speed
        # its kernel knows from a LNKCAP2 of all ones (64.0 GT/s PCIe on 6.x), not the card's (review).
        max_speed_gts=None if all_ones else max_speed,
        max_width=_known_width(max_width, max_width_path, reader),
        aer_files=aer_files,
        all_ones=all_ones,
        partner_max_speed_gts=_speed(partner / "max_link_speed", reader),
        partner_max_width=_width(partner / "max_link_width", reader),
        partner_address=partner.name if partner_aer else "",
        partner_aer_files=partner_aer,
    )


def _read_aer(path: str, reader: SysfsReader) -> AerFile | None:
    """One aer_dev_* file, its bad lines counted; None if it could not be read."""
    text = reader.text(path, optional=True)
    if text is None:
        return None
    parsed = parse_aer(text)
    for line in parsed.malformed:
        reader.fail(REASON_MALFORMED, path, f"not 'Name count': {line[:40]!r}")
    if parsed.total is None and not parsed.malformed:  # the kernel always ends with its TOTAL_ERR_ line
        reader.fail(REASON_MALFORMED, path, f"no TOTAL_ERR_ line: {text[:40]!r}")
    return parsed


def read_pcie_state(
    pci_dir: Path, identity: PcieIdentity, reader: SysfsReader, *, partner: Callable[[], bool] | None = None
) -> PcieLink | None:
    """Trained link and AER counters of a PCI function whose identity is known; None if it is gone.

    The link partner's AER counts are read if the port has AER files and `partner` (asked only then, and
    only once the function is known to be there) says so: it answers yes for one of the functions that
    share the port in a scrape. Without it they are always read.
    """
    function_dir = os.fspath(pci_dir)
    if not os.path.isdir(function_dir):
        return None
    aer: dict[tuple[str, str], int] = {}
    totals: dict[str, int] = {}
    for severity, file in identity.aer_files:
        parsed = _read_aer(f"{function_dir}/{file}", reader)
        if parsed is None:
            continue
        for name, value in parsed.counts.items():
            aer[(severity, name)] = value
        if parsed.total is not None:
            totals[severity] = parsed.total
    partner_totals: dict[str, int] | None = None
    if identity.partner_aer_files and (partner is None or partner()):
        partner_totals = {}
        for severity, path in identity.partner_aer_files:
            parsed = _read_aer(path, reader)
            if parsed is not None and parsed.total is not None:
                partner_totals[severity] = parsed.total
    link_dir = os.fspath(identity.link_dir)
    own_link = not identity.via_physfn  # a VF's is its PF's, not read again (read_pcie_identity)
    return PcieLink(
        address=identity.address,
        link_address=identity.link_address,
        via_physfn=identity.via_physfn,
        current_speed_gts=_speed(f"{link_dir}/current_link_speed", reader) if own_link else None,
        max_speed_gts=identity.max_speed_gts,
        current_width=_width(f"{link_dir}/current_link_width", reader) if own_link else None,
        max_width=identity.max_width,
        aer=aer,
        aer_totals=totals,
        partner_max_speed_gts=identity.partner_max_speed_gts,
        partner_max_width=identity.partner_max_width,
        partner_address=identity.partner_address,
        partner_aer_totals=partner_totals,
    )


def read_pcie_link(pci_dir: Path, reader: SysfsReader) -> PcieLink | None:
    """Link and AER state of the PCI function at `pci_dir`; None if it is gone or is not PCIe at all."""
    identity = read_pcie_identity(pci_dir, reader)
    return read_pcie_state(pci_dir, identity, reader) if identity is not None else None
