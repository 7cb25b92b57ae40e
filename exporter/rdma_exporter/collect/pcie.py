"""Exposition of each RDMA device's PCIe link (current vs maximum speed and width) and AER error counters.

A Gen5 x16 HCA that trained at Gen4 or x8 halves its host bandwidth while every port looks ACTIVE; only
the PCI function's link registers tell. Series carry `device` only: the link belongs to the device, and
`rdma_device_info` maps it to its PCI address. A device below its card's own PCIe switch (switch ports of
its own vendor, as a ConnectX-8 SuperNIC's built-in switch would show) reports the card's link to the slot:
its own link to that switch is on the chip. The port at the other end of that link counts the errors in what
came up the link (its receiver's); those are read once a scrape and exported under the lowest PCI address of
the devices that share the link.

SR-IOV virtual functions have no link of their own (their link registers read zero), and the parser
reads none of their PF's for them (its link values are None): the PF's link is not repeated once per VF,
and a degraded PF raises one alert, not one per VF. A VF's own AER counters, if any, are exported.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from ..parse.infiniband import DeviceInfo
from ..parse.pcie import PcieLink, read_pcie_identity, read_pcie_state
from ..parse.reader import SysfsReader
from .base import DynamicMetricSpec, FamilySet, MetricSpec, ScrapeContext

NAME: Final = "pcie"
DEVICE: Final = ("device",)
_VF_NOTE: Final = " Not exported for SR-IOV VFs, whose link is their PF's."
_CARD_NOTE: Final = (
    " Below PCIe switch ports of its own vendor (its card's switch, as a ConnectX-8 SuperNIC has), the "
    "card's link to the slot."
)

LINK_SPEED: Final = MetricSpec(
    "rdma_pcie_link_speed_transfers_per_second",
    "gauge",
    "Speed the device's PCIe link trained at, in transfers per second per lane (16e9 = Gen4, 32e9 = Gen5); "
    "absent while unknown." + _CARD_NOTE + _VF_NOTE,
    DEVICE,
)
LINK_MAX_SPEED: Final = MetricSpec(
    "rdma_pcie_link_max_speed_transfers_per_second",
    "gauge",
    "Highest PCIe link speed the device supports, in transfers per second per lane." + _VF_NOTE,
    DEVICE,
)
LINK_WIDTH: Final = MetricSpec(
    "rdma_pcie_link_width_lanes",
    "gauge",
    "Number of lanes the device's PCIe link trained with; absent while the link is down or unknown."
    + _CARD_NOTE + _VF_NOTE,
    DEVICE,
)
LINK_MAX_WIDTH: Final = MetricSpec(
    "rdma_pcie_link_max_width_lanes",
    "gauge",
    "Highest number of PCIe lanes the device supports." + _VF_NOTE,
    DEVICE,
)
PARTNER_MAX_SPEED: Final = MetricSpec(
    "rdma_pcie_link_partner_max_speed_transfers_per_second",
    "gauge",
    "Highest PCIe link speed the port at the other end of the device's link supports (the root port or "
    "switch port above it), in transfers per second per lane: the link trains at the lower of the two "
    "maxima. Absent where the device sits on a root bus." + _VF_NOTE,
    DEVICE,
)
PARTNER_MAX_WIDTH: Final = MetricSpec(
    "rdma_pcie_link_partner_max_width_lanes",
    "gauge",
    "Highest number of lanes the port at the other end of the device's link supports." + _VF_NOTE,
    DEVICE,
)
AER_ERRORS: Final = MetricSpec(
    "rdma_pcie_aer_errors_total",
    "counter",
    "PCIe errors the device's AER capability reported, by error class (correctable, nonfatal, fatal) and "
    "type as the kernel names it (RxErr, BadTLP, BadDLLP, CmpltTO, ...). Rising correctable errors often "
    "precede a link that retrains slower or narrower.",
    (*DEVICE, "error_class", "type"),
)
AER_REPORTS: Final = MetricSpec(
    "rdma_pcie_aer_reports_total",
    "counter",
    "AER error messages received for the device, by error class (the kernel's TOTAL_ERR_* line). One "
    "message can carry several error types, so this can be below the sum of rdma_pcie_aer_errors_total.",
    (*DEVICE, "error_class"),
)
PARTNER_AER_REPORTS: Final = MetricSpec(
    "rdma_pcie_link_partner_aer_reports_total",
    "counter",
    "AER error messages of the port at the other end of the device's link (the root port or switch port "
    "above it), by error class (its TOTAL_ERR_* line): errors that port saw in what came up the link, "
    "which the device's own counters do not show. Below a card's own PCIe switch that is the card's link, "
    "which its GPUs may share. Reported under one device per port: of the devices that share the link (the "
    "ports of one card) and answered the scrape, the one with the lowest PCI address; absent in a scrape "
    "whose function that read the port did not answer."
    + _VF_NOTE,
    (*DEVICE, "error_class"),
)


class PcieSource:
    """PCIe link and AER counters of every RDMA device's PCI function."""

    name = NAME
    firmware_free = True  # config space and the PCI core's AER counts: read first (Source)
    specs: tuple[MetricSpec, ...] = (
        LINK_SPEED, LINK_MAX_SPEED, LINK_WIDTH, LINK_MAX_WIDTH, PARTNER_MAX_SPEED, PARTNER_MAX_WIDTH,
        AER_ERRORS, AER_REPORTS, PARTNER_AER_REPORTS,
    )
    dynamic_specs: tuple[DynamicMetricSpec, ...] = ()

    def read(self, ctx: ScrapeContext, device: DeviceInfo, reader: SysfsReader) -> PcieLink | None:
        if device.pci_dir is None:
            return None  # software RDMA (rxe, siw) or a non-PCI device: no link to report
        # The maximum link is static and cached in the device's info; only the trained link and AER move.
        identity = device.pcie or read_pcie_identity(device.pci_dir, reader)
        if identity is None:
            return None
        # The port above a card's link is read by the first of its functions to ask in this scrape.
        port = f"pcie port {identity.partner_address}"
        return read_pcie_state(device.pci_dir, identity, reader, partner=lambda: ctx.claim_once(port, device.name))

    def expose(self, results: Mapping[str, PcieLink | None], out: FamilySet) -> None:
        # A port that several devices share (a card's functions) is reported under the lowest PCI address
        # of those that answered, whichever of them read it: the same device from scrape to scrape.
        reporter: dict[str, tuple[str, str]] = {}  # port address -> (function address, device)
        for device, link in results.items():
            if link is not None and link.partner_address:
                known = reporter.get(link.partner_address)
                if known is None or (link.address, device) < known:
                    reporter[link.partner_address] = (link.address, device)
        partner_totals = {
            link.partner_address: link.partner_aer_totals
            for link in results.values()
            if link is not None and link.partner_aer_totals is not None
        }
        for device in sorted(results):
            link = results[device]
            if link is None:
                continue
            labels = [device]
            for spec, speed in (
                (LINK_SPEED, link.current_speed_gts),
                (LINK_MAX_SPEED, link.max_speed_gts),
                (PARTNER_MAX_SPEED, link.partner_max_speed_gts),
            ):
                if speed is not None:
                    out.add(spec, labels, speed * 1e9)
            for spec, width in (
                (LINK_WIDTH, link.current_width),
                (LINK_MAX_WIDTH, link.max_width),
                (PARTNER_MAX_WIDTH, link.partner_max_width),
            ):
                if width is not None:
                    out.add(spec, labels, width)
            # The kernel calls the class a severity; that label name is left to the alerts' own routing
            # label, which a user's rule on these counters would otherwise clash with.
            for (error_class, error_type), count in link.aer.items():
                out.add(AER_ERRORS, [*labels, error_class, error_type], count)
            for error_class, total in link.aer_totals.items():
                out.add(AER_REPORTS, [*labels, error_class], total)
            if link.partner_address and reporter[link.partner_address][1] == device:
                for error_class, total in partner_totals.get(link.partner_address, {}).items():
                    out.add(PARTNER_AER_REPORTS, [*labels, error_class], total)
