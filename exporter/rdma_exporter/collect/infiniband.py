"""Exposition of `/sys/class/infiniband`: device and port info, link state, PMA and hw counters."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Final, Literal

from ..parse.infiniband import (
    PHYS_STATES,
    PMA_COUNTERS,
    PMA_COUNTERS_EXT,
    PORT_STATES,
    SUPERSEDED_BY_EXT,
    DeviceInfo,
    DeviceSnapshot,
    PmaCounter,
    PortSnapshot,
    hw_counter_is_gauge,
    metric_fragment,
    read_device_snapshot,
)
from ..parse.reader import SysfsReader
from ..parse.verbs import VerbsEntry, read_user_verbs
from .base import DynamicMetricSpec, FamilySet, MetricSpec, ScrapeContext, ShadowedFiles, label, lint_safe

DEVICE: Final = ("device",)
PORT: Final = ("device", "port")

DEVICE_INFO: Final = MetricSpec(
    "rdma_device_info",
    "info",
    "Descriptive attributes of an RDMA device (GUIDs, firmware, board, PCI address, driver). node_type is "
    "named from the number in the node_type file as verbs names it: CA, Switch, Router, RNIC, USNIC, USNIC_UDP, "
    "UNSPECIFIED.",
    (
        "device",
        "node_type",
        "node_guid",
        "sys_image_guid",
        "fw_ver",
        "hca_type",
        "board_id",
        "hw_rev",
        "node_desc",
        "pci_address",
        "driver",
        "pf_pci_address",
    ),
)
DEVICE_NUMA: Final = MetricSpec(
    "rdma_device_numa_node", "gauge", "NUMA node of the device's PCI function.", DEVICE
)
DEVICE_VF: Final = MetricSpec(
    "rdma_device_sriov_virtual_function",
    "gauge",
    "1 if the device is an SR-IOV virtual function (its PF is pf_pci_address in rdma_device_info), else 0.",
    DEVICE,
)
DEVICE_NUMVFS: Final = MetricSpec(
    "rdma_device_sriov_vfs", "gauge", "SR-IOV virtual functions enabled on this physical function.", DEVICE
)
DEVICE_LIFESPAN: Final = MetricSpec(
    "rdma_device_hw_lifespan_seconds",
    "gauge",
    "How long the driver caches device-level hw_counters values between hardware queries.",
    DEVICE,
)
DEVICE_USER_VERBS: Final = MetricSpec(
    "rdma_device_user_verbs",
    "gauge",
    "1 if the device has its user-verbs character device (/dev/infiniband/uverbsN, from the ib_uverbs module), "
    "through which NCCL, MPI and every other verbs application opens it; 0 if it has none: ib_uverbs is not "
    "loaded, or did not take the device. Absent while that cannot be told (a failed read, counted).",
    DEVICE,
)
USER_VERBS_LOADED: Final = MetricSpec(
    "rdma_user_verbs_loaded",
    "gauge",
    "1 if the ib_uverbs module is loaded (its class directory /sys/class/infiniband_verbs exists), 0 if not. "
    "Without it no device has user verbs until something loads it: the kernel does on the first request of a "
    "verbs application (libibverbs asks for each device's uverbs over netlink), unless the module is "
    "blacklisted or missing. Absent without RDMA devices, or while no device's read could tell.",
    (),
)
PORT_INFO: Final = MetricSpec(
    "rdma_port_info",
    "info",
    "An RDMA port and its link layer: InfiniBand, Ethernet, or Unknown for any other (EFA's, usNIC's).",
    (*PORT, "link_layer"),
)
PORT_STATE_ID: Final = MetricSpec(
    "rdma_port_state_id",
    "gauge",
    "Logical port state: 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER.",
    PORT,
)
PORT_STATE: Final = MetricSpec(
    "rdma_port_state", "gauge", "1 for the logical port state the port is in, 0 for the others.", (*PORT, "state")
)
PORT_PHYS_STATE_ID: Final = MetricSpec(
    "rdma_port_physical_state_id",
    "gauge",
    "Physical port state: 1 Sleep, 2 Polling, 3 Disabled, 4 PortConfigurationTraining, 5 LinkUp, "
    "6 LinkErrorRecovery, 7 Phy Test.",
    PORT,
)
PORT_PHYS_STATE: Final = MetricSpec(
    "rdma_port_physical_state",
    "gauge",
    "1 for the physical port state the port is in, 0 for the others.",
    (*PORT, "state"),
)
PORT_RATE: Final = MetricSpec(
    "rdma_port_rate_bytes_per_second",
    "gauge",
    "Link rate the port trained at (all lanes), in bytes per second, as the kernel's rate file gives it: the "
    "signalling rate. SDR, DDR and QDR links carry 80% of it as data (8b/10b), FDR 64/66; later generations "
    "report their data rate. On Ethernet ports (RoCE, iWARP) the driver maps the netdev's speed to the nearest "
    "InfiniBand rate, which is coarse for some speeds (1 GbE can show 2.5 Gb/s) and carries no 8b/10b loss, and "
    "mlx5 before kernel 6.16 shows its preset 40 Gb/s (4X QDR) for 200 Gb/s lanes (800GbE): "
    "rdma_netdev_speed_bytes_per_second is the exact figure there. While the port is not ACTIVE this is what the "
    "driver reports then (often the last or the highest rate), no trained rate: read it with rdma_port_state_id.",
    PORT,
)
PORT_WIDTH: Final = MetricSpec(
    "rdma_port_link_width_lanes",
    "gauge",
    "Number of lanes the link trained with (the 4 of 4X). On Ethernet ports the driver derives it from the link "
    "mode (mlx5) or from the speed alone (rxe, siw).",
    PORT,
)
PORT_SPEED: Final = MetricSpec(
    "rdma_port_lane_speed_info",
    "info",
    "Per-lane signalling generation the link trained at (SDR, DDR, QDR, FDR10, FDR, EDR, HDR, NDR, XDR). On "
    "Ethernet ports it is the InfiniBand generation the driver maps the netdev's speed to.",
    (*PORT, "speed"),
)
PORT_LID: Final = MetricSpec(
    "rdma_port_lid", "gauge", "Local identifier assigned by the subnet manager (InfiniBand ports only).", PORT
)
PORT_SM_LID: Final = MetricSpec(
    "rdma_port_sm_lid", "gauge", "LID of the port's subnet manager (InfiniBand ports only).", PORT
)
PORT_NETDEV: Final = MetricSpec(
    "rdma_port_netdev_info",
    "info",
    "A network interface bound to the port (RoCE netdev, its VLANs or bond, or IPoIB interface) in the "
    "exporter's network namespace. Netdevs the GID table names from containers' namespaces are left out.",
    (*PORT, "netdev"),
)
PORT_GIDS: Final = MetricSpec(
    "rdma_port_gids",
    "gauge",
    "Populated GID table entries by GID type (IB/RoCE v1, RoCE v2).",
    (*PORT, "gid_type"),
)
PORT_SATURATED: Final = MetricSpec(
    "rdma_port_pma_saturated",
    "gauge",
    "1 if a fixed-width PMA counter is stuck at its maximum and can no longer show new events until it "
    "is reset (e.g. perfquery -R); 0 otherwise. counter is the sysfs file name. Data and packet counters "
    "get it only on a port without unicast_xmit_packets, whose PMA may lack 64-bit counters: 1 at exactly "
    "2^32 - 1. Not given for the error counters bnxt_re fills by cutting its own count to the field's "
    "width: they wrap to 0 instead.",
    (*PORT, "counter"),
)
PORT_LIFESPAN: Final = MetricSpec(
    "rdma_port_hw_lifespan_seconds",
    "gauge",
    "How long the driver caches port hw_counters values between hardware queries.",
    PORT,
)

# HELP for the PMA counters, keyed by PmaCounter.key.
_PMA_HELP: Final[dict[str, str]] = {
    "symbol_errors": "Minor link errors detected on one or more physical lanes (PMA SymbolErrorCounter).",
    "link_error_recovery": "Times the link error recovery process completed successfully.",
    "link_downed": "Times the link error recovery process failed and the link went down.",
    "receive_errors": "Received packets containing an error (bad CRC, malformed, buffer overrun...).",
    "receive_remote_physical_errors": "Received packets marked with the EBP delimiter (error upstream).",
    "receive_switch_relay_errors": "Received packets discarded because they could not be forwarded.",
    "transmit_discards": "Outbound packets discarded because the port was down or congested.",
    "transmit_constraint_errors": "Outbound packets dropped by raw-packet filtering or a failed partition (P_Key) "
    "or IP version check.",
    "receive_constraint_errors": "Received packets dropped by raw-packet filtering or a failed partition (P_Key) "
    "or IP version check.",
    "local_link_integrity_errors": "Times local physical errors exceeded the LocalPhyErrors threshold.",
    "excessive_buffer_overrun_errors": "Times consecutive receive buffer overruns exceeded the threshold.",
    "vl15_dropped": "Subnet management packets (VL15) dropped for lack of buffers.",
    "transmit_data_bytes": (
        "Data transmitted on all VLs, in bytes (the kernel counts 4-octet words, 8-byte flits on Omni-Path hfi1)."
    ),
    "receive_data_bytes": (
        "Data received on all VLs, in bytes (the kernel counts 4-octet words, 8-byte flits on Omni-Path hfi1)."
    ),
    "transmit_packets": "Packets transmitted on all VLs.",
    "receive_packets": "Packets received on all VLs.",
    "transmit_wait": "Ticks during which the port had data to send but sent none, for lack of flow-control "
    "credits or of arbitration. The tick length is the device's; the shipped rules take the tick NVIDIA "
    "documents for its Quantum switch ASICs, the time to send 8 bytes at the link rate, which no HCA "
    "documentation confirms: on an HCA port the ratio they record is an estimate.",
    "transmit_unicast_packets": "Unicast packets transmitted.",
    "receive_unicast_packets": "Unicast packets received.",
    "transmit_multicast_packets": "Multicast packets transmitted.",
    "receive_multicast_packets": "Multicast packets received.",
}


def _pma_spec(counter: PmaCounter) -> MetricSpec:
    legacy = counter.file in SUPERSEDED_BY_EXT
    source = "counters/ (where a legacy MLNX_OFED stack adds counters_ext/, its 64-bit twin)" if legacy else "counters/"
    return MetricSpec(f"rdma_port_{counter.key}_total", "counter", f"{_PMA_HELP[counter.key]} From {source}.", PORT)


_PMA_SPECS: Final[dict[str, MetricSpec]] = {c.key: _pma_spec(c) for c in PMA_COUNTERS.values()}

# mlx5's per-queue (Q counter) files: the firmware keeps them in 32 bits (mlx5_ib_query_q_counters reads
# each as a be32), so they wrap, and a busy port's rx_write_requests does within hours. Said in their HELP,
# since rate() takes a wrap for a reset; the congestion counters (np_*, rp_*) are 64-bit.
MLX5_32BIT_HW_COUNTERS: Final = frozenset({
    "rx_write_requests", "rx_read_requests", "rx_atomic_requests", "rx_dct_connect", "out_of_buffer",
    "out_of_sequence", "duplicate_request", "rnr_nak_retry_err", "packet_seq_err", "implied_nak_seq_err",
    "local_ack_timeout_err", "resp_local_length_error", "resp_cqe_error", "req_cqe_error",
    "req_remote_invalid_request", "req_remote_access_errors", "resp_remote_access_errors",
    "resp_cqe_flush_error", "req_cqe_flush_error", "req_transport_retries_exceeded", "req_rnr_retries_exceeded",
    "roce_adp_retrans", "roce_adp_retrans_to",
    "roce_slow_restart", "roce_slow_restart_cnps", "roce_slow_restart_trans",
})  # fmt: skip
WRAPS_ON_MLX5: Final = " mlx5 counts it in 32 bits: it wraps, which rate() takes for a counter reset."
# mlx5 in switchdev mode (a BlueField's Arm side, OVS offload) names a port's Q counters for its eswitch
# vport with this prefix: the same 32-bit counters, the same meaning.
MLX5_VPORT_PREFIX: Final = "vport_"

# HELP for hw_counters files whose meaning is documented by the driver vendor. Files not listed are
# exported all the same, with a generic HELP naming the file.
HW_COUNTER_HELP: Final[dict[str, str]] = {
    "duplicate_request": "Received duplicate requests (the responder saw a retransmission).",
    "implied_nak_seq_err": "Read or atomic responses implying lost packets (implied NAK sequence errors).",
    "local_ack_timeout_err": "Transport ACK timeouts on the requester side (retransmissions follow).",
    "out_of_buffer": "Packets dropped because no receive WQE was posted (receive queue empty).",
    "out_of_sequence": "Packets received out of sequence.",
    "packet_seq_err": "NAKs for packet sequence errors received.",
    "req_cqe_error": "Requester completions with error.",
    "req_cqe_flush_error": "Requester completions flushed with error.",
    "req_remote_access_errors": "Requester remote access errors (NAK received).",
    "req_remote_invalid_request": "Requester remote invalid request errors (NAK received).",
    "resp_cqe_error": "Responder completions with error.",
    "resp_cqe_flush_error": "Responder completions flushed with error.",
    "resp_local_length_error": "Responder local length errors.",
    "resp_remote_access_errors": "Responder remote access errors.",
    # One per RNR NAK received, each one a retry: running out of retries is req_rnr_retries_exceeded.
    "rnr_nak_retry_err": "RNR NAKs received by the requester (the peer had no receive buffer posted); each one is "
    "retried, the QP's RNR retry limit was not exceeded.",
    "roce_adp_retrans": "RoCE retransmissions made with an adaptively shortened timeout; rising together with "
    "local_ack_timeout_err it means packets are lost on the fabric (lossy RoCE, or PFC not protecting it).",
    "roce_adp_retrans_to": "RoCE adaptive retransmissions that themselves timed out.",
    "roce_slow_restart": "Times a QP restarted slowly (at a reduced rate) after a retransmission timeout.",
    "roce_slow_restart_cnps": "CNPs the requester generated for itself during slow restart, to lower its own rate.",
    "roce_slow_restart_trans": "Times a QP entered the slow restart state.",
    "rx_atomic_requests": "Atomic requests received.",
    "rx_dct_connect": "DCT connect requests received.",
    "rx_read_requests": "RDMA read requests received.",
    "rx_write_requests": "RDMA write requests received.",
    "rx_icrc_encapsulated": "RoCE packets with an invalid ICRC received.",
    "np_cnp_sent": "Congestion notification packets (CNPs) sent by this port as DCQCN notification point: it "
    "received ECN-marked RoCE packets and told their senders to slow down. Rate-limited per QP, so it can be "
    "below np_ecn_marked_roce_packets.",
    "np_ecn_marked_roce_packets": "RoCEv2 packets received with ECN Congestion Experienced (a switch queue on the "
    "path was filling up). Zero on a loaded fabric can mean ECN marking is off on the switches.",
    "rp_cnp_handled": "CNPs received by this port as DCQCN reaction point: a receiver saw congestion and told "
    "this port to slow down (mlx5 counts the CNPs it handled by lowering its send rate).",
    "rp_cnp_ignored": "CNPs received but ignored by this port as reaction point, because DCQCN is not enabled "
    "for their priority (ecn/roce_rp/enable/<prio>): senders do not slow down when told to. Should stay 0.",
    # Not mlx5's optional counters (cc_rx_ce_pkts, cc_rx_cnp_pkts, cc_tx_cnp_pkts): the core leaves
    # IB_STAT_FLAG_OPTIONAL counters out of sysfs; only RDMA netlink shows them, once enabled.
    "req_transport_retries_exceeded": "Requester transport retries exceeded (the QP went to error).",
    "req_rnr_retries_exceeded": "Requester RNR retries exceeded (the QP went to error).",
    # bnxt_re as in the mainline kernel (drivers/infiniband/hw/bnxt_re/hw_counters.c) until the rename
    # of August 2025 ("RDMA/bnxt_re: RoCE related hardware counters update"), which moved it, as
    # Broadcom's own driver already was, to the mlx5 names above, all but np_cnp_pkts.
    "to_retransmits": "Retransmissions after a transport ACK timeout (mlx5: local_ack_timeout_err).",
    "seq_err_naks_rcvd": "NAKs for packet sequence errors received (mlx5: packet_seq_err).",
    "rnr_naks_rcvd": "RNR NAKs received by the requester (the peer had no receive buffer posted); each one is "
    "retried (mlx5: rnr_nak_retry_err).",
    "missing_resp": "Responses the requester found missing (lost packets; mlx5: implied_nak_seq_err).",
    "max_retry_exceeded": "Requests that exhausted the QP's transport retries (the QP went to error).",
    "rx_out_of_buffer": "RoCE packets dropped because no receive WQE was posted (mlx5: out_of_buffer).",
    "tx_cnp_pkts": "CNPs sent as DCQCN notification point (mlx5: np_cnp_sent).",
    "rx_cnp_pkts": "CNPs received as DCQCN reaction point (mlx5: rp_cnp_handled).",
    "rx_ecn_marked_pkts": "RoCE packets received with ECN Congestion Experienced (mlx5: np_ecn_marked_roce_packets).",
    "np_cnp_pkts": "CNPs sent as DCQCN notification point (bnxt_re since 2025; mlx5: np_cnp_sent).",
    # Misnamed in the driver: bnxt_re fills it from its tx_bcast_pkts statistic, so it moves with ordinary
    # broadcast traffic and is not an error count.
    "recoverable_errors": "bnxt_re: despite the name, broadcast packets transmitted (the driver fills it from "
    "tx_bcast_pkts); not an error count.",
    "rx_roce_errors": "RoCE packets received with errors (bnxt_re; the 64-bit count behind the PMA's cut fields).",
    "rx_roce_discards": "RoCE packets received and discarded (bnxt_re; the 64-bit count behind the PMA's cut "
    "fields).",
}

HW_COUNTER_DYNAMIC: Final = (
    DynamicMetricSpec(
        "rdma_port_hw_<counter>_total",
        "counter",
        "Every file of the port's hw_counters/ (driver-specific: mlx5, irdma, bnxt_re, efa, hfi1...), its "
        "name converted to snake_case. Levels (bnxt_re active_*, hns_roce *_active, *watermark*, db_fifo_register) "
        "are gauges without _total.",
        PORT,
    ),
    DynamicMetricSpec(
        "rdma_device_hw_<counter>_total",
        "counter",
        "Every file of the device-level hw_counters/, as for ports; levels (hfi1 DRIVER_CtxtsOpen) are gauges "
        "without _total.",
        DEVICE,
    ),
    DynamicMetricSpec(
        "rdma_port_counters_<counter>_total",
        "counter",
        "A counters/ file unknown to the IB PMA tables (driver extension), exported generically.",
        PORT,
    ),
)


class HwCounterSpecs:
    """MetricSpecs for driver-named counters, memoised so each name is converted once per process."""

    def __init__(self, prefix: str, labels: tuple[str, ...], scope: str) -> None:
        self._prefix = prefix
        self._labels = labels
        self._scope = scope
        self._cache: dict[str, MetricSpec] = {}
        self.shadowed = ShadowedFiles(lambda file: self.get(file).name)

    def get(self, file: str) -> MetricSpec:
        spec = self._cache.get(file)
        if spec is None:
            fragment = metric_fragment(file)
            kind: Literal["counter", "gauge"] = "gauge" if hw_counter_is_gauge(file) else "counter"
            # A level (active QPs, a watermark) is not a count: its HELP must not call it a counter.
            known = file.removeprefix(MLX5_VPORT_PREFIX)
            described = HW_COUNTER_HELP.get(
                known,
                f"Driver counter {self._scope}/{file}."
                if kind == "counter"
                else f"Driver value {self._scope}/{file}, a level that rises and falls.",
            )
            if known != file and known in HW_COUNTER_HELP:
                described += " Counted for the function's eswitch vport (mlx5 in switchdev mode)."
            if known in MLX5_32BIT_HW_COUNTERS:
                described += WRAPS_ON_MLX5
            if kind == "counter":  # a driver's `tx_total` is rdma_port_hw_tx_total, not ..._total_total
                fragment = fragment.removesuffix("_total")
            name = f"{self._prefix}{lint_safe(fragment, kind)}{'_total' if kind == 'counter' else ''}"
            spec = MetricSpec(name, kind, described, self._labels)
            self._cache[file] = spec
        return spec


_PORT_HW = HwCounterSpecs("rdma_port_hw_", PORT, "hw_counters")
_DEVICE_HW = HwCounterSpecs("rdma_device_hw_", DEVICE, "hw_counters")
_PORT_GENERIC = HwCounterSpecs("rdma_port_counters_", PORT, "counters")


def _expose_hw(
    values: Mapping[str, int],
    files: tuple[str, ...],
    specs: HwCounterSpecs,
    lifespan: MetricSpec,
    labels: list[str],
    out: FamilySet,
) -> None:
    shadowed = specs.shadowed(files)
    for file, value in values.items():
        if file == "lifespan":
            # Milliseconds in sysfs; a cache period, not an event count.
            out.add(lifespan, labels, value / 1000)
        elif file not in shadowed:
            out.add(specs.get(file), labels, value)


def _expose_port(device: str, port: PortSnapshot, out: FamilySet) -> None:
    info = port.info
    labels = [device, str(info.number)]
    out.add(PORT_INFO, [*labels, label(info.link_layer)], 1)
    if port.state is not None:
        out.add(PORT_STATE_ID, labels, port.state[0])
        for number, name in PORT_STATES.items():
            if number:  # NOP (0) is never a real state
                out.add(PORT_STATE, [*labels, name], 1 if port.state[0] == number else 0)
    if port.phys_state is not None:
        out.add(PORT_PHYS_STATE_ID, labels, port.phys_state[0])
        for number, name in PHYS_STATES.items():
            if number:
                out.add(PORT_PHYS_STATE, [*labels, name], 1 if port.phys_state[0] == number else 0)
    if port.rate is not None:
        out.add(PORT_RATE, labels, port.rate.bytes_per_second)
        if port.rate.lanes is not None:
            out.add(PORT_WIDTH, labels, port.rate.lanes)
        if port.rate.speed is not None:
            out.add(PORT_SPEED, [*labels, port.rate.speed], 1)
    if port.lid is not None:
        out.add(PORT_LID, labels, port.lid)
    if port.sm_lid is not None:
        out.add(PORT_SM_LID, labels, port.sm_lid)
    for netdev in info.netdevs:
        out.add(PORT_NETDEV, [*labels, netdev], 1)
    for gid_type, count in info.gid_types:
        out.add(PORT_GIDS, [*labels, gid_type], count)

    pma_counters = info.pma_counters
    generic: dict[str, int] = {}  # files outside the PMA tables (driver extensions), rarely any
    for file, value in port.counters.items():
        counter = pma_counters.get(file)
        if counter is None:
            generic[file] = value
            continue
        out.add(_PMA_SPECS[counter.key], labels, value * counter.scale)
        if counter.wraps:
            continue  # never stuck: at its maximum the next event wraps it to 0
        if counter.width < 64:
            saturated = value >= (1 << counter.width) - 1
            out.add(PORT_SATURATED, [*labels, file], 1 if saturated else 0)
        elif counter.maybe_32bit:
            # A 64-bit counter passes this one value; a 32-bit one stays on it (the alert waits 10 minutes).
            out.add(PORT_SATURATED, [*labels, file], 1 if value == (1 << 32) - 1 else 0)
    # Legacy counters_ext/: the 64-bit value of a counter goes under its one name (the 32-bit counters/
    # twin was left out of counter_files, so it is neither read nor judged saturated).
    for file, value in port.counters_ext.items():
        ext = PMA_COUNTERS_EXT.get(file)
        if ext is None:
            generic[file] = value  # beside a counters/ file of the same name, the 64-bit one
        else:
            out.add(_PMA_SPECS[ext.key], labels, value * ext.scale)
    if generic:
        # Two names that normalise alike (`Foo Bar`, `foo_bar`) would be one series twice: the first of
        # the listing owns it, as for hw_counters/, decided from the static listing so that the series
        # does not switch files when the first one fails a read.
        listing = {f for f in info.counter_files if f not in pma_counters}
        listing.update(f for f in info.counter_ext_files if f not in PMA_COUNTERS_EXT)
        shadowed = _PORT_GENERIC.shadowed(tuple(sorted(listing)))
        for file, value in generic.items():
            if file not in shadowed:
                out.add(_PORT_GENERIC.get(file), labels, value)
    _expose_hw(port.hw_counters, info.hw_counter_files, _PORT_HW, PORT_LIFESPAN, labels, out)


def expose_device(snapshot: DeviceSnapshot, out: FamilySet) -> None:
    info = snapshot.info
    device = info.name
    out.add(
        DEVICE_INFO,
        [
            device,
            label(info.node_type),
            label(info.node_guid),
            label(info.sys_image_guid),
            label(info.fw_ver),
            label(info.hca_type),
            label(info.board_id),
            label(info.hw_rev),
            label(info.node_desc),
            label(info.pci_address),
            label(info.driver),
            label(info.pf_pci_address),
        ],
        1,
    )
    if info.numa_node is not None:
        out.add(DEVICE_NUMA, [device], info.numa_node)
    if info.pci_address is not None:
        out.add(DEVICE_VF, [device], 1 if info.is_vf else 0)
    if info.sriov_numvfs is not None:
        out.add(DEVICE_NUMVFS, [device], info.sriov_numvfs)
    if snapshot.user_verbs is not None:
        out.add(DEVICE_USER_VERBS, [device], 1 if snapshot.user_verbs else 0)
    _expose_hw(snapshot.hw_counters, info.hw_counter_files, _DEVICE_HW, DEVICE_LIFESPAN, [device], out)
    for port in snapshot.ports:
        _expose_port(device, port, out)


class InfinibandSource:
    """Devices, ports and counters of /sys/class/infiniband."""

    name = "infiniband"
    specs: tuple[MetricSpec, ...] = (
        DEVICE_INFO,
        DEVICE_NUMA,
        DEVICE_VF,
        DEVICE_NUMVFS,
        DEVICE_LIFESPAN,
        DEVICE_USER_VERBS,
        USER_VERBS_LOADED,
        PORT_INFO,
        PORT_STATE_ID,
        PORT_STATE,
        PORT_PHYS_STATE_ID,
        PORT_PHYS_STATE,
        PORT_RATE,
        PORT_WIDTH,
        PORT_SPEED,
        PORT_LID,
        PORT_SM_LID,
        PORT_NETDEV,
        PORT_GIDS,
        *_PMA_SPECS.values(),
        PORT_SATURATED,
        PORT_LIFESPAN,
    )
    dynamic_specs: tuple[DynamicMetricSpec, ...] = HW_COUNTER_DYNAMIC

    def __init__(self) -> None:
        # Per device name, the `ibdev` of each uverbs entry its last read listed, per directory
        # (read_user_verbs), so that a steady scrape only lists them. Per device, not per directory: a
        # device renamed in place (`rdma dev set ... name`) keeps its entry, whose `ibdev` the kernel prints
        # anew, and a new name must read it again. Reads run on reader threads, possibly while expose
        # prunes the names of devices gone (a read past its deadline): hence the lock.
        self._verbs_names: dict[str, dict[str, dict[VerbsEntry, str]]] = {}
        self._verbs_lock = threading.Lock()

    def read(self, ctx: ScrapeContext, device: DeviceInfo, reader: SysfsReader) -> DeviceSnapshot:
        snapshot = read_device_snapshot(ctx.sys_root, device, reader)
        if device.user_verbs_dirs:
            with self._verbs_lock:
                known = self._verbs_names.get(device.name, {})
            found = read_user_verbs(device.user_verbs_dirs, device.name, reader, known)
            if found.listings:
                with self._verbs_lock:
                    self._verbs_names[device.name] = {d: found_in.names or {} for d, found_in in found.listings.items()}
            snapshot.user_verbs = found.present
            snapshot.user_verbs_loaded = found.module_loaded
        return snapshot

    def expose(self, results: Mapping[str, DeviceSnapshot], out: FamilySet) -> None:
        with self._verbs_lock:
            if any(name not in results for name in self._verbs_names):
                self._verbs_names = {n: names for n, names in self._verbs_names.items() if n in results}
        for name in sorted(results):
            expose_device(results[name], out)
        loaded = [s.user_verbs_loaded for s in results.values() if s.user_verbs_loaded is not None]
        if loaded:
            out.add(USER_VERBS_LOADED, (), 1 if any(loaded) else 0)
