"""Expected topology: what the operator says each RDMA port should look like, exported as metrics.

A port that trained at 200 Gb/s instead of 400 looks perfectly healthy on its own: the only way to
tell is to know what it should be. The YAML config declares expectations per device pattern,

    collector:
      expected:
        ports:
          - devices: "mlx5_[0-7]"
            port: 1
            link_layer: InfiniBand
            rate_gbps: 400
            width: 4
            pcie_gen: 5
            pcie_width: 16

and this source exports them next to the observed values so that alert rules compare the two with
a plain `<`. It also reports expected devices and ports that are not there at all, which is why device
patterns must enumerate concrete names (a list, or one numeric range `mlx5_[0-7]`): a regex can say
what matches but not what is missing.

An entry can name PCI functions instead (`pci_addresses: ["0000:17:00.0", ...]`). The kernel names
`mlx5_N` in probe order, so after a reboot without one HCA every HCA after it is renumbered, and
expectations by name then report the last name missing and compare the others with their neighbours'
expectations. By address, each HCA keeps its expectations under whatever name it has now, and the one
that is gone is reported by its slot. A RoCE LAG device (mlx5_bond_N, on its card's first function)
stands for the card's other function too, which has no RDMA device while the LAG is up.

Nothing is read from sysfs: presence comes from the inventory the engine already holds.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ..configerror import ConfigError
from ..parse.infiniband import MAX_PORT_NUMBER, DeviceInfo
from ..parse.netdev import card_bond_slaves, lag_by_name
from ..parse.pcie import GENERATIONS, VALID_WIDTHS
from ..parse.reader import PCI_ADDRESS, SysfsReader
from .base import DynamicMetricSpec, FamilySet, MetricSpec, ScrapeContext

NAME: Final = "expected"

LINK_LAYERS: Final = ("InfiniBand", "Ethernet")
LINK_WIDTHS: Final = (1, 2, 4, 8, 12)  # IB 1X/2X/4X/8X/12X
# What the PCIe parser accepts, so an expectation can name every link it can report (x12 and Gen7 were
# refused here while the collector reported them).
PCIE_WIDTHS: Final = tuple(sorted(VALID_WIDTHS))
# PCIe generation -> transfers per second per lane, the unit of the PCIe collector's link speed.
PCIE_GEN_TRANSFERS: Final[dict[int, float]] = {gen: gts * 1e9 for gts, gen in sorted(GENERATIONS.items())}
_PCIE_GEN_OF: Final = {transfers: gen for gen, transfers in PCIE_GEN_TRANSFERS.items()}

_ENTRY_KEYS: Final = (
    "devices",
    "pci_addresses",
    "port",
    "link_layer",
    "rate_gbps",
    "width",
    "pcie_gen",
    "pcie_width",
    "netdev_speed_gbps",
)
# One optional numeric range in brackets; everything else must be a literal device name.
# \Z, not $: $ also matches before a final newline, which a YAML block scalar leaves on a name.
# [0-9], not \d: \d takes any script's digits (mlx5_[٠-٣]), which int() then reads as ASCII ones.
_RANGE: Final = re.compile(r"^([^\[\]]*)\[([0-9]+)-([0-9]+)\]([^\[\]]*)\Z")
_LITERAL: Final = re.compile(r"^[A-Za-z0-9_.:-]+\Z")
# Gb/s; a typo far above any link, yet far below where value * 1e9 / 8 leaves a float's range.
_MAX_GBPS: Final = 1e12
_MAX_EXPANSION: Final = 4096  # a typo like mlx5_[0-99999] must not allocate a million names
# The same bound on the whole list: 250 entries of 4096 names were a million expected ports, a 333 MB
# answer built after the scrape deadline, every scrape. A node has a few hundred ports at most.
MAX_EXPECTED_PORTS: Final = 4096
_TOO_MANY_PORTS: Final = f"more than {MAX_EXPECTED_PORTS} expected ports in all; a node has a few hundred at most"
_MAX_BOUND_DIGITS: Final = 18
# `lspci` prints bus:device.function without the domain: that is domain 0000.
_LSPCI_ADDRESS: Final = re.compile(r"^[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]\Z")


@dataclass(frozen=True, slots=True)
class ExpectedPort:
    """The expectation for one concrete port. None means "not specified": nothing is exported for it.

    An expectation by PCI address has an empty `device`: its name is whatever device sits there now.
    """

    device: str
    port: int
    link_layer: str | None = None
    rate_bytes_per_second: float | None = None
    width: int | None = None
    pcie_transfers_per_second: float | None = None
    pcie_width: int | None = None
    netdev_speed_bytes_per_second: float | None = None
    pci_address: str | None = None

    @property
    def key(self) -> str:
        """What the expectation is for: a device name, or a PCI address."""
        return self.pci_address or self.device


def expand_devices(source: str, key: str, pattern: str) -> list[str]:
    """`mlx5_[0-7]` -> mlx5_0..mlx5_7; a name without brackets is itself. Anything else is an error."""
    match = _RANGE.match(pattern)
    if match is None:
        if _LITERAL.match(pattern):
            return [pattern]
        raise ConfigError(
            source,
            key,
            f"{pattern!r} is not a device name or a name with one numeric range like mlx5_[0-7]: "
            "expected devices must be enumerable so that missing ones can be reported",
        )
    prefix, low, high, suffix = match.groups()
    if not (prefix + suffix == "" or _LITERAL.match(prefix + suffix)):
        raise ConfigError(source, key, f"{pattern!r} has characters other than a device name around its range")
    if max(len(low), len(high)) > _MAX_BOUND_DIGITS:  # int() raises on over 4300 digits, a traceback
        raise ConfigError(source, key, f"a bound of the range in {pattern!r} has more than {_MAX_BOUND_DIGITS} digits")
    first, last = int(low), int(high)
    if first > last:
        raise ConfigError(source, key, f"range [{low}-{high}] in {pattern!r} is empty (start above end)")
    if last - first + 1 > _MAX_EXPANSION:
        raise ConfigError(source, key, f"range [{low}-{high}] in {pattern!r} expands to more than {_MAX_EXPANSION}")
    # mlx5_[00-15] keeps the zero padding of the bounds; mlx5_[0-15] does not pad. mlx5_[01-100] could
    # mean either (hostlist tools disagree), so it is refused rather than guessed.
    padded = low.startswith("0") and len(low) > 1
    if padded and len(low) != len(high):
        raise ConfigError(
            source, key, f"range [{low}-{high}] in {pattern!r} is zero-padded: give both bounds the same digits"
        )
    width = len(low) if padded else 0
    return [f"{prefix}{n:0{width}d}{suffix}" for n in range(first, last + 1)]


def _positive_number(source: str, key: str, value: Any) -> float:
    # YAML's .inf is a float: an infinite expectation would put every port below it. So would one whose
    # bytes per second (value * 1e9 / 8) overflow to inf, and an integer beyond a float's range is no
    # float at all (OverflowError): both are refused as not a number of Gb/s.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ConfigError(source, key, f"expected a positive number, got {value!r}")
    if value >= _MAX_GBPS:
        raise ConfigError(source, key, f"expected a number of Gb/s below {_MAX_GBPS:g}, got {value!r}")
    return float(value)


def _choice(source: str, key: str, value: Any, choices: Sequence[Any]) -> Any:
    if isinstance(value, bool) or value not in choices:
        raise ConfigError(source, key, f"expected one of {', '.join(map(str, choices))}, got {value!r}")
    return value


def _devices(source: str, key: str, value: Any) -> list[str]:
    patterns = [value] if isinstance(value, str) else value
    if not isinstance(patterns, list) or not patterns:
        raise ConfigError(source, key, f"expected a device name, a pattern like mlx5_[0-7] or a list, got {value!r}")
    names: list[str] = []
    for index, pattern in enumerate(patterns):
        where = key if isinstance(value, str) else f"{key}[{index}]"
        if not isinstance(pattern, str) or not pattern:
            raise ConfigError(source, where, f"expected a non-empty string, got {pattern!r}")
        names.extend(expand_devices(source, where, pattern))
        if len(names) > MAX_EXPECTED_PORTS:  # before the next range: one entry can list many
            raise ConfigError(source, where, _TOO_MANY_PORTS)
    return names


def _pci_addresses(source: str, key: str, value: Any) -> list[str]:
    addresses = value if isinstance(value, list) else [value]
    if not addresses:
        raise ConfigError(source, key, "expected a PCI address like 0000:17:00.0 or a list of them, got []")
    out: list[str] = []
    seen: set[str] = set()  # `in out` was quadratic: 100,000 addresses fit the YAML limit
    for index, address in enumerate(addresses):
        where = f"{key}[{index}]" if isinstance(value, list) else key
        text = address.strip().lower() if isinstance(address, str) else ""
        if _LSPCI_ADDRESS.match(text):
            text = "0000:" + text
        if not PCI_ADDRESS.match(text):  # stripped: no newline for `$` to match before
            reason = f"expected a PCI address domain:bus:device.function like 0000:17:00.0, got {address!r}"
            if isinstance(address, (int, float)):
                reason += " (quote it: YAML reads an unquoted 17:00.0 as a base-60 number)"
            raise ConfigError(source, where, reason)
        domain = text.split(":", 1)[0]
        if len(domain) > 4 and domain.startswith("0"):
            # The kernel prints the domain as %04x: wider only when it needs the digits, never zero-padded.
            reason = f"the kernel names no PCI device {text!r}: a domain wider than 4 digits has no leading zero"
            raise ConfigError(source, where, reason)
        if text in seen:
            raise ConfigError(source, where, f"{text} is listed twice")
        seen.add(text)
        out.append(text)
    return out


def _entry(source: str, key: str, value: Any) -> list[ExpectedPort]:
    if not isinstance(value, Mapping):
        raise ConfigError(source, key, f"expected a mapping with devices, port, ..., got {type(value).__name__}")
    for name in value:
        if name not in _ENTRY_KEYS:
            raise ConfigError(source, f"{key}.{name}", f"unknown key (known: {', '.join(_ENTRY_KEYS)})")
    if "devices" in value and "pci_addresses" in value:
        reason = "both devices and pci_addresses given: name the ports this expectation is for by one of them"
        raise ConfigError(source, f"{key}.devices", reason)
    if "devices" not in value and "pci_addresses" not in value:
        reason = "required: the device names or the pci_addresses this expectation is for"
        raise ConfigError(source, f"{key}.devices", reason)
    targets: list[tuple[str, str | None]]
    if "devices" in value:
        targets = [(device, None) for device in _devices(source, f"{key}.devices", value["devices"])]
    else:
        targets = [("", pci) for pci in _pci_addresses(source, f"{key}.pci_addresses", value["pci_addresses"])]
    port = value.get("port", 1)
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= MAX_PORT_NUMBER:
        raise ConfigError(source, f"{key}.port", f"expected a port number from 1 to {MAX_PORT_NUMBER}, got {port!r}")

    def opt(name: str, check: Any) -> Any:
        return None if value.get(name) is None else check(source, f"{key}.{name}", value[name])

    link_layer = opt("link_layer", lambda s, k, v: _choice(s, k, v, LINK_LAYERS))
    rate = opt("rate_gbps", _positive_number)
    width = opt("width", lambda s, k, v: _choice(s, k, v, LINK_WIDTHS))
    gen = opt("pcie_gen", lambda s, k, v: _choice(s, k, v, tuple(PCIE_GEN_TRANSFERS)))
    pcie_width = opt("pcie_width", lambda s, k, v: _choice(s, k, v, PCIE_WIDTHS))
    netdev = opt("netdev_speed_gbps", _positive_number)
    if netdev is None and link_layer == "Ethernet":
        netdev = rate  # a RoCE netdev reports the speed the port trained at
    return [
        ExpectedPort(
            device=device,
            port=port,
            link_layer=link_layer,
            rate_bytes_per_second=None if rate is None else rate * 1e9 / 8,
            width=width,
            pcie_transfers_per_second=None if gen is None else PCIE_GEN_TRANSFERS[gen],
            pcie_width=pcie_width,
            netdev_speed_bytes_per_second=None if netdev is None else netdev * 1e9 / 8,
            pci_address=pci_address,
        )
        for device, pci_address in targets
    ]


def check_ports(source: str, key: str, value: Any) -> tuple[ExpectedPort, ...]:
    """Validator of `collector.expected.ports`: a list of expectation entries, expanded per port."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ConfigError(source, key, f"expected a list of port expectations, got {type(value).__name__}")
    ports: dict[tuple[str, int], tuple[int, ExpectedPort]] = {}
    pcie: dict[tuple[str, str], tuple[int, int]] = {}  # (device, setting) -> (entry index, value)
    for index, item in enumerate(value):
        for expected in _entry(source, f"{key}[{index}]", item):
            ident = (expected.key, expected.port)
            if ident in ports:
                first = ports[ident][0]
                reason = f"{expected.key} port {expected.port} is already expected by {key}[{first}]"
                field = "pci_addresses" if expected.pci_address else "devices"
                raise ConfigError(source, f"{key}[{index}].{field}", reason)
            ports[ident] = (index, expected)
            if len(ports) > MAX_EXPECTED_PORTS:
                raise ConfigError(source, f"{key}[{index}]", _TOO_MANY_PORTS)
            # PCIe is per device: entries for two of its ports may each set its speed, its width or both
            # (expose merges them), but must not set the same one to different values.
            speed = expected.pcie_transfers_per_second
            gen = None if speed is None else _PCIE_GEN_OF[speed]
            for setting, what, wanted in (("pcie_gen", "speed", gen), ("pcie_width", "width", expected.pcie_width)):
                if wanted is None:
                    continue
                first, seen = pcie.setdefault((expected.key, setting), (index, wanted))
                if seen != wanted:
                    reason = (
                        f"PCIe link {what} for {expected.key} ({setting} {wanted}) differs from "
                        f"{key}[{first}] ({setting} {seen})"
                    )
                    raise ConfigError(source, f"{key}[{index}].{setting}", reason)
    return tuple(expected for _, expected in ports.values())


# Validators of the `collector.expected` settings in the config file (config.COLLECTOR_SETTINGS).
SETTINGS: Final = {"ports": check_ports}

PORT: Final = ("device", "port")
PORT_INFO: Final = MetricSpec(
    "rdma_expected_port_info",
    "info",
    "A port the configuration expects, with its expected link layer (empty when not specified).",
    (*PORT, "link_layer"),
)
PORT_RATE: Final = MetricSpec(
    "rdma_expected_port_rate_bytes_per_second",
    "gauge",
    "Link rate the port is expected to train at, in bytes per second (compare rdma_port_rate_bytes_per_second).",
    PORT,
)
PORT_WIDTH: Final = MetricSpec(
    "rdma_expected_port_link_width_lanes",
    "gauge",
    "Number of lanes the port is expected to train with (compare rdma_port_link_width_lanes).",
    PORT,
)
NETDEV_SPEED: Final = MetricSpec(
    "rdma_expected_netdev_speed_bytes_per_second",
    "gauge",
    "Speed the port's netdev is expected to report, in bytes per second (compare "
    "rdma_netdev_speed_bytes_per_second). Defaults to the expected rate on Ethernet ports. The speed of "
    "one link: on a RoCE LAG port, of each bond slave.",
    PORT,
)
PCIE_SPEED: Final = MetricSpec(
    "rdma_expected_pcie_link_speed_transfers_per_second",
    "gauge",
    "PCIe link speed the device is expected to train at, in transfers per second per lane.",
    ("device",),
)
PCIE_WIDTH: Final = MetricSpec(
    "rdma_expected_pcie_link_width_lanes",
    "gauge",
    "PCIe link width the device is expected to train at, in lanes.",
    ("device",),
)
DEVICE_PRESENT: Final = MetricSpec(
    "rdma_expected_device_present",
    "gauge",
    "1 if an expected RDMA device is listed under class/infiniband (an excluded device too: it is there, "
    "only not read), 0 if missing.",
    ("device",),
)
PORT_PRESENT: Final = MetricSpec(
    "rdma_expected_port_present",
    "gauge",
    "1 if an expected port exists on its device, 0 if the port or its whole device is missing; absent "
    "while the device is listed but its ports are not known (its first read is stuck, or the device "
    "filters exclude it).",
    PORT,
)
PCI_DEVICE_PRESENT: Final = MetricSpec(
    "rdma_expected_pci_device_present",
    "gauge",
    "1 if an RDMA device is listed at a PCI address the configuration expects one at, whatever its name "
    "(its expectations are then exported under that name), or a RoCE LAG device stands for that function "
    "(the second port of its card, folded into mlx5_bond_N); 0 if none is; absent while the address of a "
    "listed device is not known (its first read is stuck).",
    ("pci_address",),
)

# What `read` hands `expose` for a listed device: its PCI address, its port numbers (None when the
# device filters skip it: its address is known from its class link, its ports are not), and the other PCI
# functions it stands for (a RoCE LAG device's second function, which has no RDMA device of its own).
Listed = tuple[str | None, frozenset[int] | None, frozenset[str]]


def _ports_unknown(listed: Listed | None) -> bool:
    """True for a device whose ports are not read: excluded (`read_excluded`) or not known yet."""
    return listed is None or listed[1] is None


def lag_functions(device: DeviceInfo) -> frozenset[str]:
    """The other PCI functions of the card that a RoCE LAG device stands for.

    While mlx5 bonds both ports of a card into one RoCE LAG device (mlx5_bond_N, on the first function),
    the second function has no RDMA device: an expectation by address of that function is met by the
    LAG device. Those are the functions of the bond slaves of its ports, on its own card (a function's own
    RDMA device comes first: `expose`). A device with the kernel's name is a LAG device only if named as
    one: a plain mlx5_0 whose port's GIDs name a bond over both functions is no LAG, and the other
    function's missing RDMA device must stay missing. A renamed device (rdma-core's udev rule names
    mlx5_bond_0 rocep59s0f0) cannot be told apart there, so that case counts as present.
    """
    if device.pci_address is None or lag_by_name(device.name) is False:
        return frozenset()
    return frozenset(card_bond_slaves(device.pci_address, device.netdevs))


class ExpectedSource:
    """Exposes the configured expectations and whether each expected device and port is present."""

    name = NAME
    # Presence comes from the inventory's listing, not from reads: a device stuck in firmware is still
    # present, even before its static info could be read.
    io_free = True
    specs: tuple[MetricSpec, ...] = (
        PORT_INFO,
        PORT_RATE,
        PORT_WIDTH,
        NETDEV_SPEED,
        PCIE_SPEED,
        PCIE_WIDTH,
        DEVICE_PRESENT,
        PORT_PRESENT,
        PCI_DEVICE_PRESENT,
    )
    dynamic_specs: tuple[DynamicMetricSpec, ...] = ()

    def __init__(self, ports: Sequence[ExpectedPort] = ()) -> None:
        self.ports = tuple(ports)

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> ExpectedSource:
        return cls(settings.get("ports", ()))

    def read(self, ctx: ScrapeContext, device: DeviceInfo, reader: SysfsReader) -> Listed:
        # The inventory already knows the address, the ports and the bond slaves: no file is opened.
        return device.pci_address, frozenset(port.number for port in device.ports), lag_functions(device)

    def read_excluded(self, pci_address: str | None) -> Listed:
        # Known to be at that address (or, for rxe and siw, at none), which is all an expectation by
        # address needs; its ports are not known.
        return pci_address, None, frozenset()

    def expose(self, results: Mapping[str, Listed | None], out: FamilySet) -> None:
        # A device is present when it is listed. None: listed, but its static info (and so its ports and
        # its address) is not known yet, e.g. its first read is stuck in firmware; its ports are then not
        # reported at all rather than reported missing, and neither is an expected address that no known
        # device holds: it may be that one's.
        # Two devices can share an address: a multi-plane HCA's SMI sub device has its parent's PCI
        # function (docs/operations.md). The expectation then goes to one that is read, not excluded,
        # and of those to the first by name: the same one every scrape, and with the sub device
        # excluded as that section advises, the parent. (Before, the last device listed took it.)
        at_address: dict[str, str] = {}
        for name, listed in sorted(results.items(), key=lambda item: (_ports_unknown(item[1]), item[0])):
            if listed is not None and listed[0]:
                at_address.setdefault(listed[0], name)
        for name, listed in sorted(results.items()):
            for address in listed[2] if listed is not None else ():
                at_address.setdefault(address, name)  # a function of its own RDMA device comes first
        identity_unknown = any(listed is None for listed in results.values())
        pci_present: dict[str, bool] = {}
        exported: set[tuple[str, int]] = set()
        pcie: dict[str, tuple[float | None, int | None]] = {}  # device -> (speed, width)
        for expected in self.ports:
            device = expected.device
            if expected.pci_address is not None:
                found = at_address.get(expected.pci_address)
                pci_present[expected.pci_address] = found is not None
                if found is None:
                    continue  # no name to report it under: the address's own series says it is missing
                device = found
            # An entry by name and one by address can meet on one port: the first one in the file wins,
            # so that no series is exported twice.
            if (device, expected.port) in exported:
                continue
            exported.add((device, expected.port))
            labels = [device, str(expected.port)]
            out.add(PORT_INFO, [*labels, expected.link_layer or ""], 1)
            if expected.rate_bytes_per_second is not None:
                out.add(PORT_RATE, labels, expected.rate_bytes_per_second)
            if expected.width is not None:
                out.add(PORT_WIDTH, labels, expected.width)
            if expected.netdev_speed_bytes_per_second is not None:
                out.add(NETDEV_SPEED, labels, expected.netdev_speed_bytes_per_second)
            listed = results.get(device, (None, frozenset(), frozenset()))
            if listed is not None and listed[1] is not None:
                out.add(PORT_PRESENT, labels, 1 if expected.port in listed[1] else 0)
            # The ports of a device may each give part of its PCIe expectation: the speed and the width each
            # come from the first port that sets it (validation made the others agree).
            speed, width = pcie.get(device, (None, None))
            pcie[device] = (
                expected.pcie_transfers_per_second if speed is None else speed,
                expected.pcie_width if width is None else width,
            )
        for name in sorted(pcie):
            speed, width = pcie[name]
            if speed is not None:
                out.add(PCIE_SPEED, [name], speed)
            if width is not None:
                out.add(PCIE_WIDTH, [name], width)
            out.add(DEVICE_PRESENT, [name], 1 if name in results else 0)
        for address in sorted(pci_present):
            if pci_present[address] or not identity_unknown:
                out.add(PCI_DEVICE_PRESENT, [address], 1 if pci_present[address] else 0)
