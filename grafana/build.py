"""Generate the Grafana dashboards in grafana/dashboards/ from one set of conventions.

    python grafana/build.py          # rewrite the JSON files
    python grafana/build.py --check  # exit 1 if a committed file differs from what this script builds

Every dashboard gets the same template variables (datasource -> job -> cluster -> instance -> device ->
port), the same datasource reference on every panel and target, and panels built by the helpers below,
so a convention changes in one place. tests/test_dashboards.py lints the output and runs every query
against a real Prometheus that scraped the exporter.

Conventions the test relies on, written into the panel descriptions:

- "Empty while ..." marks a panel whose queries legitimately return nothing on a healthy fleet (a table
  of problems, the firing alerts). Every other query must return data on the sample tree.
- "Colours follow <Alert>." ties the panel's threshold steps to that alert: each step is the threshold
  of one of the alert's comparisons, on a query of the same series and window as that comparison, coloured
  orange for a warning and red for a critical alert. Grafana colours a value from a step on (>=), so
  an alert's "> T" is a step just above T (`above`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

Json = dict[str, Any]

HERE = Path(__file__).resolve().parent
DASHBOARDS = HERE / "dashboards"
RUNBOOKS = "https://github.com/rdma-exporter/rdma-exporter/blob/main/docs/runbooks/"
DS: Json = {"type": "prometheus", "uid": "${datasource}"}
TAGS = ["rdma-exporter", "rdma", "infiniband", "roce"]
SCHEMA_VERSION = 38  # Grafana 10.0; newer versions migrate on load

# "> 0" in an alert becomes a threshold step at this value: any visible rate or count turns the colour.
EPSILON = 1e-9


def above(threshold: float) -> float:
    """The threshold step for an alert's `> threshold`: Grafana colours values from a step on (>=), so the
    step sits just above it (a count of exactly 10 must not turn orange when the alert fires above 10)."""
    return EPSILON if threshold == 0 else float(f"{threshold * (1 + 1e-9):.12g}")


OK, WARNING, CRITICAL, NEUTRAL = "green", "orange", "red", "blue"

# Label sets of the kinds of series. Every selector carries the matchers of its level. CLUSTER and RAIL
# are the recording rules aggregated above the node (cluster:, cluster_device_port:): they have no
# instance label, so the instance selector cannot narrow them, and their panels say "whole clusters".
NODE = ("job", "cluster", "instance")
DEVICE = (*NODE, "device")
PORT = (*DEVICE, "port")
RX = 'direction="rx"'
CLUSTER = ("job", "cluster")
RAIL = (*CLUSTER, "device", "port")
ON_PORT = "on (cluster, job, instance, device, port)"
ON_DEVICE = "on (cluster, job, instance, device)"
NODE_KEY = "cluster, job, instance"  # the labels that name a node, as ON_PORT and ON_DEVICE have them

UIDS = {
    "fabric-overview": "rdma-fabric-overview",
    "node-detail": "rdma-node-detail",
    "roce-congestion": "rdma-roce-congestion",
}


# --- PromQL helpers ----------------------------------------------------------------------------------


def sel(metric: str, labels: Sequence[str] = PORT, *extra: str) -> str:
    """`metric{job=~"$job", ...}`: one regex matcher per template variable of the level, plus extras."""
    matchers = [f'{label}=~"${label}"' for label in labels] + list(extra)
    return f"{metric}{{{', '.join(matchers)}}}"


def per_cluster(record: str) -> str:
    """A `cluster:` record summed over the selected jobs: one line a cluster, as its legend names it, even
    while its nodes are split between two jobs (a move to TLS in progress)."""
    return f"sum by (cluster) ({sel(record, CLUSTER)})"


def per_rail(record: str) -> str:
    """A `cluster_device_port:` record summed over the selected jobs: one line a rail and cluster."""
    return f"sum by (cluster, device, port) ({sel(record, RAIL)})"


def rate(metric: str, labels: Sequence[str] = PORT, *extra: str) -> str:
    return f"rate({sel(metric, labels, *extra)}[$__rate_interval])"


def bytes_rate(direction: str) -> str:
    """Per-port bytes/s in `direction` ("transmit" or "receive"), as the throughput records compute it: the
    PMA data counter, else the driver's hw_counters tx_bytes/rx_bytes (EFA and bnxt_re have only those),
    else irdma's IPv4 plus IPv6 octets (ip4OutOctets + ip6OutOctets, ip4InOctets + ip6InOctets)."""
    # Every rate carries the same labels per port (rate drops the name), so `or` takes the first source a
    # port has; the IP octets are summed where a port has both families, else the one it has.
    pma, hw = rate(f"rdma_port_{direction}_data_bytes_total"), rate(f"rdma_port_hw_{direction[0]}x_bytes_total")
    way = "out" if direction == "transmit" else "in"
    ip4, ip6 = rate(f"rdma_port_hw_ip4_{way}_octets_total"), rate(f"rdma_port_hw_ip6_{way}_octets_total")
    return f"({pma} or {hw} or {ip4} + {ip6} or {ip4} or {ip6})"


def either_rate(*metrics: str) -> str:
    """The rate of the first of `metrics` a port has: one counter under each driver's name."""
    return " or ".join(rate(metric) for metric in metrics)


def increase(metric: str, window: str, labels: Sequence[str] = PORT, *extra: str) -> str:
    return f"increase({sel(metric, labels, *extra)}[{window}])"


PRIO = 'priority=~"$priority"'
PORT_WIDE = 'priority=""'  # a driver's count for the whole port, which no priority selection can split
LOSSLESS_DISCARDS = "instance_device_port:rdma_ethtool_lossless_receive_buffer_discards:increase15m"
# The port module events RdmaPortModuleFault counts as faults (module_unplug is none).
MODULE_FAULTS = "bus_stuck|bad_shorted|high_temp"
# Transceiver module sensors, as RdmaDeviceTemperatureHigh tells them from the chip's: mlx5's Module<N>, or
# MTMP sensor 64 and up where the firmware does not name them. Their ticket margin is 5 °C, not 10.
MODULE_SENSORS = "Module[0-9]+|sensor(6[4-9]|[7-9][0-9]|[1-9][0-9][0-9])"
# Share of time paused per priority and direction, and per port under link-level 802.3x pause as priority
# "global": the series the pause panels and the `global` choice of the priority variable come from.
PAUSE_DURATION = "instance_device_port:rdma_ethtool_pfc_pause_duration:ratio_rate5m"
# The ports under link-level 802.3x pause when `global` is selected (it pauses every priority at once).
GLOBAL_SELECTED = sel(PAUSE_DURATION, PORT, 'priority="global"', PRIO)


def per_priority(query: Callable[..., str], metric: str) -> str:
    """`query(metric, labels, *matchers)` (sel, rate) on the selected priorities of a per-priority series
    that has no priority "global" (ECN, marks, traffic, discards): the numeric priorities selected, and
    while `global` is selected every priority of the ports under link-level pause, so that `global` alone
    shows those ports rather than nothing."""
    return f"({query(metric, PORT, PRIO)}\n  or\n({query(metric)} and {ON_PORT} {GLOBAL_SELECTED}))"


# SR-IOV virtual functions share their PF's physical link: counts of ports and links skip them, as the
# link alerts do (the PF's series is the one to act on).
NOT_VF = f"unless {ON_DEVICE} {sel('rdma_device_sriov_virtual_function', DEVICE)} == 1"
# Ports of one link layer, for panels about InfiniBand or RoCE only. The InfiniBand panels leave out
# what is known to be RoCE rather than keep what is known to be InfiniBand, as their alerts do: a port
# whose link_layer read failed has no rdma_port_info and may be the one paging.
NOT_ETHERNET = f"unless {ON_PORT} " + sel("rdma_port_info", PORT, 'link_layer="Ethernet"')
ETHERNET = f"and {ON_PORT} " + sel("rdma_port_info", PORT, 'link_layer="Ethernet"')
# Saturated PMA counters as RdmaPortCounterSaturated counts them: port_xmit_wait only on an InfiniBand link
# under 10 Gb/s (on a faster one it fills again within seconds of a clear, in normal work).
SATURATED_COUNTERS = (
    "sum(\n  " + sel("rdma_port_pma_saturated", PORT, 'counter!="port_xmit_wait"') + "\n    or\n  ("
    + sel("rdma_port_pma_saturated", PORT, 'counter="port_xmit_wait"') + f" {NOT_ETHERNET}\n    unless {ON_PORT} "
    + sel("rdma_port_rate_bytes_per_second", PORT) + " >= 1.25e9)\n)"  # bytes/s: 10 Gb/s
)
# Ports down, and ports gone: a port whose HCA fell off the bus (RdmaPortVanished), or an expected port or
# device that never appeared, has no state left to count, and a node that lost one looked healthy.
# A missing device has no port, and one expected by PCI address no device name either: node-wide, one per
# device or address.
PORT_GONE_NAMES = ["RdmaPortDown", "RdmaPortVanished", "RdmaExpectedPortMissing"]
DEVICE_MISSING = "RdmaExpectedDeviceMissing"
PORT_DOWN_NAMES = [*PORT_GONE_NAMES, DEVICE_MISSING]
PORT_DOWN_ALERTS = (
    "group by (cluster, job, instance, device, port) ("
    + sel("ALERTS", PORT, f'alertname=~"{"|".join(PORT_GONE_NAMES)}"', 'alertstate=~"pending|firing"')
    + ")\n  or\ngroup by (cluster, job, instance, device, pci_address) ("
    + sel("ALERTS", NODE, f'alertname="{DEVICE_MISSING}"', 'alertstate=~"pending|firing"')
    + ")"
)


# The RoCE dashboard opens on every node: its per-series panels show the nodes with the highest values.
WORST_NODES = 5


def worst_nodes(expr: str, *, lowest: bool = False, rank: str | None = None) -> str:
    """Every series of `expr` from the WORST_NODES nodes whose highest series (lowest, with `lowest`) is
    highest (lowest) at each step. One node selected, or a few, shows them whole; All on a fleet of
    thousands stays a few hundred series instead of one per node, netdev, priority and direction. With
    `rank` (an alert's condition, of values 0 and up), the nodes are ranked by its series first: a node
    without any ranks by `expr` half a step behind (highest: at 0)."""
    pick, agg = ("bottomk", "min") if lowest else ("topk", "max")
    ranked = f"{agg} by ({NODE_KEY}) (\n{expr}\n)"
    if rank is not None:
        rest = f"{ranked} + 0.5" if lowest else f"{ranked} * 0"
        ranked = f"{agg} by ({NODE_KEY}) (\n{rank}\n)\n  or\n{rest}"
    return f"(\n{expr}\n)\n  and on ({NODE_KEY})\n{pick}({WORST_NODES}, {ranked})"


def firing_alerts(*extra: str, cluster_wide: bool = False) -> str:
    """Firing alerts of the rdma-exporter rules on the selected nodes. With `cluster_wide`, also those of
    the selected clusters that are about no node (RdmaHistoryRulesMissing): the instance selector, whose
    All is `.+`, would hide them."""
    matchers = ('alertname=~"Rdma.*"', 'alertstate="firing"', *extra)
    on_nodes = sel("ALERTS", NODE, *matchers)
    if not cluster_wide:
        return on_nodes
    of_clusters = sel("ALERTS", CLUSTER, 'instance=""', *matchers)
    return f"({on_nodes} or {of_clusters})"


# --- template variables ------------------------------------------------------------------------------


def datasource_variable() -> Json:
    return {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
        "includeAll": False,
        "multi": False,
        "options": [],
        "refresh": 1,
        "regex": "",
        "skipUrlSync": False,
    }


def query_variable(name: str, label: str, query: str, all_value: str | None = ".+", description: str = "",
                   *, single: bool = False) -> Json:  # fmt: skip
    """A label_values variable, multi-select with All; `single` for one value at a time (Grafana starts on
    the first one listed)."""
    variable: Json = {
        "name": name,
        "label": label,
        "description": description,
        "type": "query",
        "datasource": DS,
        "query": query,
        "definition": query,
        "current": {} if single else {"selected": True, "text": ["All"], "value": ["$__all"]},
        "hide": 0,
        "includeAll": not single,
        "multi": not single,
        "options": [],
        "refresh": 2,  # on time range change: nodes come and go
        "regex": "",
        "skipUrlSync": False,
        "sort": 1,
    }
    if all_value is not None and not single:
        variable["allValue"] = all_value
    return variable


def standard_variables(ports_filter: str = "", *, one_node: bool = False) -> list[Json]:
    """datasource, job, cluster, instance, device, port. `ports_filter` narrows the device/port lists;
    `one_node` makes the instance a single choice."""
    extra = f", {ports_filter}" if ports_filter else ""
    return [
        datasource_variable(),
        query_variable(
            "job",
            "Job",
            "label_values(rdma_exporter_build_info, job)",
            # Not the linter's ".+": `up` and `scrape_duration_seconds` exist for every job Prometheus
            # scrapes, so All must mean the jobs listed, or the instance list and the exporter panels
            # fill with node_exporter, kubelet and Prometheus's own targets.
            all_value=None,
            description="Prometheus jobs that scrape rdma-exporter.",
        ),
        query_variable(
            "cluster",
            "Cluster",
            'label_values(up{job=~"$job"}, cluster)',
            all_value=".*",
            description="Optional `cluster` target label; with All, targets without the label match too.",
        ),
        query_variable(
            "instance",
            "Instance",
            'label_values(up{job=~"$job", cluster=~"$cluster"}, instance)',
            description="Exporter targets (nodes), including those that cannot be scraped right now.",
            single=one_node,
        ),
        query_variable(
            "device",
            "Device",
            f'label_values(rdma_port_info{{job=~"$job", cluster=~"$cluster", instance=~"$instance"{extra}}}, device)',
            # RoCE: All must mean the Ethernet devices listed, not every device of the node.
            all_value=None if ports_filter else ".+",
            description="RDMA devices (HCAs); across nodes, one device name is one rail.",
        ),
        query_variable(
            "port",
            "Port",
            'label_values(rdma_port_info{job=~"$job", cluster=~"$cluster", instance=~"$instance", '
            f'device=~"$device"{extra}}}, port)',
            description="Port numbers of the selected devices.",
        ),
    ]


# --- panels ------------------------------------------------------------------------------------------


def target(expr: str, legend: str = "__auto", ref: str = "A", instant: bool = False, table: bool = False) -> Json:
    # One node name (gpu001) often stands in several clusters: a line that names its node names its cluster,
    # last, since targets without the label leave it blank.
    if "{{instance}}" in legend and "{{cluster}}" not in legend:
        legend += " {{cluster}}"
    return {
        "datasource": DS,
        "refId": ref,
        "expr": expr,
        "legendFormat": legend,
        "range": not instant,
        "instant": instant,
        "format": "table" if table else "time_series",
        "editorMode": "code",
    }


def targets(*pairs: tuple[str, str], instant: bool = False, table: bool = False) -> list[Json]:
    """(expr, legend) pairs -> targets with refIds A, B, C..."""
    return [
        target(expr, legend, chr(ord("A") + i), instant=instant, table=table) for i, (expr, legend) in enumerate(pairs)
    ]


def thresholds(*steps: tuple[float, str], base: str = OK) -> Json:
    return {
        "mode": "absolute",
        "steps": [{"color": base, "value": None}, *({"color": c, "value": v} for v, c in steps)],
    }


def runbook_links(alerts: Iterable[str]) -> list[Json]:
    return [{"title": f"Runbook: {a}", "url": f"{RUNBOOKS}{a}.md", "targetBlank": True} for a in alerts]


def node_link(field: str, target: str = "node-detail") -> Json:
    """Data link from a series or row to the `target` dashboard of its instance, in its cluster, keeping the
    data source and job chosen here (the dashboard would otherwise open on its own saved ones). The cluster
    is the clicked one's, not the selection's: node names repeat across clusters, and with All the page
    summed or overlaid every node of the name (review). Empty for a target without one, which `=~""` matches."""
    cluster = field.replace(".instance", ".cluster")
    return {
        "title": f"{TITLES[target]} for ${{{field}}}",
        "url": f"/d/{UIDS[target]}/{UIDS[target]}?${{datasource:queryparam}}&${{job:queryparam}}"
        f"&var-cluster=${{{cluster}}}&var-instance=${{{field}}}&${{__url_time_range}}",
    }


def panel(
    kind: str,
    title: str,
    description: str,
    unit: str,
    tgts: list[Json],
    *,
    steps: Json | None = None,
    alerts: Sequence[str] = (),
    color: Json | None = None,
    custom: Json | None = None,
    options: Json | None = None,
    overrides: list[Json] | None = None,
    mappings: list[Json] | None = None,
    links: list[Json] | None = None,
    transformations: list[Json] | None = None,
    decimals: int | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
) -> Json:
    defaults: Json = {"unit": unit, "thresholds": steps or thresholds(base=NEUTRAL)}
    defaults["color"] = color or {"mode": "thresholds" if kind in ("stat", "bargauge", "table") else "palette-classic"}
    if custom is not None:
        defaults["custom"] = custom
    if mappings:
        defaults["mappings"] = mappings
    if links:
        defaults["links"] = links
    if decimals is not None:
        defaults["decimals"] = decimals
    if minimum is not None:
        defaults["min"] = minimum
    if maximum is not None:
        defaults["max"] = maximum
    result: Json = {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": tgts,
        "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
        "options": options or {},
    }
    if alerts:
        result["links"] = runbook_links(alerts)
    if transformations:
        result["transformations"] = transformations
    return result


def stat(title: str, description: str, unit: str, tgts: list[Json], **kw: Any) -> Json:
    options = {
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "colorMode": "background" if kw.get("steps") else "value",
        "graphMode": "none",
        "justifyMode": "auto",
        "orientation": "auto",
        "textMode": kw.pop("text_mode", "auto"),
    }
    return panel("stat", title, description, unit, tgts, options=options, **kw)


def timeseries(
    title: str, description: str, unit: str, tgts: list[Json], *, log: bool = False, bars: bool = False, **kw: Any
) -> Json:
    custom = {
        "drawStyle": "bars" if bars else "line",
        "lineWidth": 1,
        "fillOpacity": 60 if bars else 10,
        "gradientMode": "none",
        "showPoints": "never",
        "spanNulls": False,
        "axisSoftMin": 0,
        "stacking": {"mode": "none", "group": "A"},
        "scaleDistribution": {"type": "log", "log": 10} if log else {"type": "linear"},
        "thresholdsStyle": {"mode": "dashed" if kw.get("steps") else "off"},
    }
    options = {
        "legend": {"showLegend": True, "displayMode": "table", "placement": "bottom", "calcs": ["max", "lastNotNull"]},
        "tooltip": {"mode": "multi", "sort": "desc"},
    }
    return panel("timeseries", title, description, unit, tgts, custom=custom, options=options, **kw)


def state_timeline(title: str, description: str, tgts: list[Json], mappings: list[Json], **kw: Any) -> Json:
    options = {
        "showValue": "auto",
        "mergeValues": True,
        "alignValue": "left",
        "rowHeight": 0.9,
        "legend": {"showLegend": True, "displayMode": "list", "placement": "bottom"},
        "tooltip": {"mode": "single", "sort": "none"},
    }
    custom = {"fillOpacity": 80, "lineWidth": 0}
    return panel(
        "state-timeline", title, description, "none", tgts, mappings=mappings, custom=custom, options=options,
        color={"mode": "thresholds"}, **kw,
    )  # fmt: skip


def bargauge(title: str, description: str, unit: str, tgts: list[Json], **kw: Any) -> Json:
    options = {
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "displayMode": "gradient",
        "orientation": "horizontal",
        "showUnfilled": True,
        "valueMode": "color",
        "namePlacement": "auto",
        "minVizHeight": 10,
        "minVizWidth": 0,
        "sizing": "auto",
    }
    return panel("bargauge", title, description, unit, tgts, options=options, **kw)


def top_ports(title: str, description: str, unit: str, expr: str, legend: str,
              more: Sequence[tuple[str, str]] = (), target: str = "node-detail", **kw: Any) -> Json:  # fmt: skip
    """A fleet "top 10" bar gauge of one per-port expression (and of each of `more`, as (expr, legend)), each
    bar linking to its node on the `target` dashboard."""
    pairs = [(f"topk(10, {e})", name) for e, name in [(expr, legend), *more]]
    return bargauge(title, description, unit, targets(*pairs, instant=True),
                    links=[node_link("__field.labels.instance", target)], **kw)  # fmt: skip


def temperature_margin(sensors: str) -> str:
    """Temperature minus the critical temperature the hardware reports, of the `sensors` matched."""
    return (f"{sel('rdma_device_temperature_celsius', DEVICE, sensors)} - on (cluster, job, instance, device, "
            f"sensor) {sel('rdma_device_temperature_critical_celsius', DEVICE, sensors)}")


def table(title: str, description: str, unit: str, tgts: list[Json], *, hide: Sequence[str] = (), **kw: Any) -> Json:
    hidden = {name: True for name in ("Time", "__name__", "job", *hide)}
    transformations = kw.pop("transformations", None) or []
    if len(tgts) > 1:
        transformations.insert(0, {"id": "merge", "options": {}})
    transformations.append(
        {"id": "organize", "options": {"excludeByName": hidden, "renameByName": kw.pop("rename", {})}}
    )
    options = {"showHeader": True, "cellHeight": "sm", "footer": {"show": False, "reducer": ["sum"], "fields": ""}}
    custom = {"align": "auto", "cellOptions": {"type": "auto"}, "inspect": False, "filterable": True}
    return panel("table", title, description, unit, tgts, custom=custom, options=options,
                 transformations=transformations, **kw)  # fmt: skip


def unit_override(field: str, unit: str, **extra: Any) -> Json:
    properties = [{"id": "unit", "value": unit}]
    properties += [{"id": key, "value": value} for key, value in extra.items()]
    return {"matcher": {"id": "byName", "options": field}, "properties": properties}


def query_thresholds(ref: str, steps: Json, *, dashed: bool = False) -> Json:
    """Thresholds of one query (by refId) where a panel's queries follow different levels; `dashed` draws
    them on a time series whose other queries have none."""
    properties = [{"id": "thresholds", "value": steps}]
    if dashed:
        properties.append({"id": "custom.thresholdsStyle", "value": {"mode": "dashed"}})
    return {"matcher": {"id": "byFrameRefID", "options": ref}, "properties": properties}


def named_thresholds(field: str, steps: Json) -> Json:
    """Thresholds of one series (by its legend) or table column, where a panel's others follow other levels."""
    return {"matcher": {"id": "byName", "options": field}, "properties": [{"id": "thresholds", "value": steps}]}


def colour_cells(field: str) -> Json:
    return {
        "matcher": {"id": "byName", "options": field},
        "properties": [{"id": "custom.cellOptions", "value": {"type": "color-background"}}],
    }


# A table column that only some of its merged queries fill: Grafana colours an empty cell with the
# thresholds' base colour, so each row of another query had a red (or orange) blank (diff review).
BLANK_UNCOLOURED = {"type": "special", "options": {"match": "null+nan", "result": {"color": "transparent"}}}


def blank_cells_uncoloured(field: str) -> Json:
    return {"matcher": {"id": "byName", "options": field},
            "properties": [{"id": "mappings", "value": [BLANK_UNCOLOURED]}]}  # fmt: skip


def value_mappings(values: dict[int, tuple[str, str]]) -> list[Json]:
    return [
        {
            "type": "value",
            "options": {str(v): {"text": text, "color": colour, "index": i} for i, (v, (text, colour)) in
                        enumerate(values.items())},
        }
    ]  # fmt: skip


def row(title: str) -> Json:
    return {"type": "row", "title": title, "collapsed": False, "panels": []}


PORT_STATES = {1: ("DOWN", CRITICAL), 2: ("INIT", WARNING), 3: ("ARMED", WARNING), 4: ("ACTIVE", OK),
               5: ("ACTIVE_DEFER", OK)}  # fmt: skip
PHYSICAL_STATES = {1: ("Sleep", CRITICAL), 2: ("Polling", CRITICAL), 3: ("Disabled", CRITICAL),
                   4: ("PortConfigurationTraining", WARNING), 5: ("LinkUp", OK), 6: ("LinkErrorRecovery", WARNING),
                   7: ("Phy Test", WARNING)}  # fmt: skip
# RdmaPortBitErrorRateHigh's two levels read two windows: the critical one the 5-minute rate (above the
# 1e-12 link objective), the warning one the hourly rate (above 1e-14, about one error per 5 minutes at
# 400 Gb/s: too few for a 5-minute rate to stay on one side of it). Panels show both, query A the 5-minute
# rate coloured red, query B the hourly one coloured orange.
BER_5M = "instance_device_port:rdma_port_bit_error_rate:ratio_rate5m"
BER_1H = "instance_device_port:rdma_port_bit_error_rate:ratio_rate1h"
# A link bad enough to page saturates its 16-bit symbol_error counter within minutes, and its 5-minute rate
# is 0 from then on: the critical alert keeps paging from this record (the highest rate before the counter
# stopped, for as long as it stays saturated), and so do the panels of the 5-minute rate.
BER_SATURATED = "instance_device_port:rdma_port_bit_error_rate:saturated_max_ratio_rate5m"


def ber_5m(labels: Sequence[str] = PORT) -> str:
    """The 5-minute bit-error rate as the critical RdmaPortBitErrorRateHigh reads it: a port's saturated
    record where it has one (same labels as its rate), else its rate."""
    return f"({sel(BER_SATURATED, labels)} or {sel(BER_5M, labels)})"


# A RoCE LAG's slaves share the bond's device and port, and each has its own bit-error rate (its cable):
# a legend without the netdev gave both one name. InfiniBand ports have none, and show a blank.
BER_NETDEV = " {{netdev}}"
BER_STEPS = thresholds((above(1e-12), CRITICAL))
BER_OVERRIDES = [query_thresholds("B", thresholds((above(1e-14), WARNING)))]
BER_TEXT = (
    "Colours follow RdmaPortBitErrorRateHigh, whose two levels read two windows: the 5-minute rate turns red "
    "above the 1e-12 link objective (critical), the 1-hour rate orange above 1e-14 (warning; a handful of "
    "errors an hour is too few for a 5-minute rate to judge). A port whose 16-bit symbol_error counter "
    "saturated keeps, over 5 minutes, the highest rate before it stopped, as the alert keeps paging."
)

# --- layout ------------------------------------------------------------------------------------------


def layout(items: Sequence[tuple[Json, int, int]]) -> list[Json]:
    """Place (panel, width, height) left to right on a 24-column grid; rows span the width. Ids from 1."""
    placed: list[Json] = []
    x = y = line_height = 0
    for number, (item, width, height) in enumerate(items, start=1):
        if item["type"] == "row":
            width, height = 24, 1
        if x + width > 24 or item["type"] == "row":
            x, y, line_height = 0, y + line_height, 0
        item = {"id": number, "gridPos": {"h": height, "w": width, "x": x, "y": y}, **item}
        placed.append(item)
        x += width
        line_height = max(line_height, height)
        if item["type"] == "row":
            x, y, line_height = 0, y + height, 0
    return placed


# Each dashboard's name: its title is "RDMA / " and this, the other dashboards' links to it this.
TITLES = {"fabric-overview": "Fabric overview", "node-detail": "Node detail", "roce-congestion": "RoCE congestion"}


def firing_by_severity(*, cluster_wide: bool = False) -> Json:
    """A stat's targets and colours for the firing alerts counted by severity: red for pages, orange for
    tickets, so that a page never looks like a ticket."""
    def count(severity: str) -> tuple[str, str]:
        matcher = f'severity="{severity}"'
        return f"count({firing_alerts(matcher, cluster_wide=cluster_wide)}) or vector(0)", severity

    return {
        "tgts": targets(count("critical"), count("warning")),
        "steps": thresholds((1, CRITICAL)),
        "overrides": [named_thresholds("warning", thresholds((1, WARNING)))],
    }


# What a menu link to each dashboard keeps beyond data source, job, cluster and time range, and how its
# tooltip says so.
MENU_SELECTION: dict[str, tuple[tuple[str, ...], str]] = {
    "fabric-overview": (("instance", "device", "port"), ", nodes, devices and ports"),
    "node-detail": ((), ", on its first node"),
    "roce-congestion": (("instance",), ", nodes"),
}


def menu_links(key: str) -> list[Json]:
    """Links to the other RDMA dashboards that keep the data source, job, cluster, time range and, where the
    target can take it, the node, device and port selection. Node detail shows one node: handed a fleet view's All
    (`$__all`), its single-value instance variable selects no node, so it opens on its own first node
    of the job and cluster instead; a table's instance link opens the node clicked. RoCE congestion lists
    RoCE ports only: a device picked elsewhere (an InfiniBand HCA, Node detail's first) would empty it, so
    it keeps the nodes and lists their RoCE devices afresh."""
    links = []
    for target, title in TITLES.items():
        if target == key:
            continue
        kept, tooltip = MENU_SELECTION[target]
        params = [f"${{{name}:queryparam}}" for name in ("datasource", "job", "cluster", *kept)]
        links.append({
            "title": title,
            "type": "link",
            "url": f"/d/{UIDS[target]}/{UIDS[target]}?{'&'.join(params)}",
            "keepTime": True,
            "includeVars": False,
            "asDropdown": False,
            "icon": "dashboard",
            "tags": [],
            "targetBlank": False,
            "tooltip": f"The same job, cluster and time range{tooltip}",
        })  # fmt: skip
    return links


def dashboard(key: str, description: str, variables: list[Json], items: Sequence[tuple[Json, int, int]],
              refresh: str = "1m", time_from: str = "now-6h") -> Json:  # fmt: skip
    return {
        "uid": UIDS[key],
        "title": f"RDMA / {TITLES[key]}",
        "description": description,
        "tags": TAGS,
        "editable": False,
        "graphTooltip": 1,
        "timezone": "browser",
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "refresh": refresh,
        "time": {"from": time_from, "to": "now"},
        "timepicker": {},
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "weekStart": "",
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "links": menu_links(key),
        "templating": {"list": variables},
        "panels": layout(items),
    }


# --- fabric overview ---------------------------------------------------------------------------------


# Ports and PCIe links below their expectation: the record the bandwidth alerts read. PCIe series have
# no port label, so the port selector cannot apply.
# Rate and width shortfalls of SR-IOV VFs are left out, as RdmaPortRateBelowExpected leaves them (a VF
# reports its PF's link).
BELOW_EXPECTED = "instance_device:rdma_link_below_expected:ratio"
# The best rate each port trained at while ACTIVE in the last day: RdmaPortRateBelowRecentMax's reference.
DAY_BEST_RATE = "instance_device_port:rdma_port_rate_bytes_per_second:active_max1d"


def when_active(expr: str, labels: Sequence[str] = PORT) -> str:
    """`expr` for ACTIVE ports only: a port that is not reports its driver's preset rate and width."""
    return f"{expr} and {ON_PORT} {sel('rdma_port_state_id', labels)} >= 4"


# A port's rate as the rules take it: on Ethernet its slowest netdev's speed, since mlx5 can leave a preset
# 40 Gb/s in the rate file of a port at 800GbE (the record's comment); the day's best rate is of this too.
PORT_RATE = "instance_device_port:rdma_port_rate_bytes_per_second:netdev_speed"


def trained_rate(labels: Sequence[str] = PORT) -> str:
    """The rate a port trained at: ACTIVE ports only."""
    return when_active(f"{sel(PORT_RATE, labels)} > 0", labels)


def links_affected(shortfalls: str) -> str:
    """One series a link of `shortfalls`: a port (or a PCIe link, which has no port) short in rate and in
    width is one link, not two."""
    return f"group by (cluster, job, instance, device, port) ({shortfalls})"


def links_below(*extra: str) -> str:
    """The record's shortfalls, those of ports' rate and width without SR-IOV VFs, and those of ports and
    netdevs not on a node short of a device expected by name, as their alerts leave them out: a missing HCA
    renumbers the names after it, so each port is compared with its neighbour's expectation (review)."""
    others = sel(BELOW_EXPECTED, DEVICE, 'problem!~"rate|width|netdev_speed"', *extra)
    ports = sel(BELOW_EXPECTED, DEVICE, 'problem=~"rate|width"', *extra)
    speeds = sel(BELOW_EXPECTED, DEVICE, 'problem="netdev_speed"', *extra)
    shifted = f"unless on ({NODE_KEY}) {sel('rdma_expected_device_present', NODE)} == 0"
    return f"{others} or ({ports} {NOT_VF} or {speeds}) {shifted}"


# Ports below the best rate they trained at while ACTIVE in the last day, where no rate is expected:
# RdmaPortRateBelowRecentMax's condition, the only one that sees a 400G port at 200G without an expected
# topology. As a shortfall of the record's shape (problem "rate", reference "day_max", the share reached).
BELOW_DAY_BEST = (
    'label_replace(label_replace(\n'
    f'  ({trained_rate(DEVICE)})\n'
    f'    / {ON_PORT} group_left ()\n  {sel(DAY_BEST_RATE, DEVICE)} < 1\n'
    f'    unless {ON_PORT} {sel("rdma_expected_port_rate_bytes_per_second", DEVICE)}\n'
    '  , "problem", "rate", "", ""), "reference", "day_max", "", "")\n'
    f'{NOT_VF}'
)
# Ports below the median rate of the ports of their HCA model and port number on the node, where no rate is
# expected: RdmaPortRateBelowPeers' condition, which needs no history (a port slow since before the exporter
# ran), as a shortfall of the record's shape (problem "rate", reference "peers", the share reached).
# RoCE LAG ports with a bond slave without carrier, by mode: RdmaPortRateBelowPeers leaves the aggregating ones out.
BOND_SLAVE_WITHOUT_CARRIER = "instance_device_port:rdma_netdev_bond_slave_without_carrier:present"
NOT_ACTIVE_BACKUP = 'mode!="active-backup"'
BELOW_PEERS = (
    'label_replace(label_replace(\n'
    '  max without (board_id, pci_function, link_layer) (\n'
    f'    {sel("instance_device_port:rdma_port_rate_bytes_per_second:active_board", DEVICE)}\n'
    '      / on (cluster, job, instance, board_id, pci_function, link_layer, port) group_left ()\n'
    f'    {sel("instance_board_port:rdma_port_rate_bytes_per_second:active_median", NODE)} < 1\n'
    '  )\n'
    f'    unless {ON_PORT} {sel("rdma_expected_port_rate_bytes_per_second", DEVICE)}\n'
    f'    unless {ON_PORT} {sel(BOND_SLAVE_WITHOUT_CARRIER, DEVICE, NOT_ACTIVE_BACKUP)}\n'
    '  , "problem", "rate", "", ""), "reference", "peers", "", "")'
)
# The two rate alerts that need no expected topology: below the port's day and below its peers.
BELOW_BEST_ALERTS = ["RdmaPortRateBelowRecentMax", "RdmaPortRateBelowPeers"]
# PCIe links below the most they can do, without an expectation: the warning RdmaPcieLinkDegraded.
LINK_MAX, NOT_LINK_MAX = 'reference="link_max"', 'reference!="link_max"'
LINK_ALERTS = ["RdmaPortRateBelowExpected", "RdmaPcieLinkBelowExpected", "RdmaPcieLinkDegraded",
               "RdmaNetdevSpeedBelowExpected", *BELOW_BEST_ALERTS]  # fmt: skip

# Ports of nodes whose exporter is down: no alert above counts them (RdmaPortVanished and RdmaPortDown wait
# for the target), so without this a dead node's ports left every count and "Ports down" stayed green. The
# ports its history saw ACTIVE in the last day, as RdmaPortDown's "was up" reads it, not its VFs.
UNREACHABLE_PORTS = (
    "count(\n  group by (cluster, job, instance, device, port) (\n"
    f"    max_over_time({sel('instance_device_port:rdma_port_state_id:max10m_max1d')}[10m]) >= 4\n  )\n"
    f"    and on ({NODE_KEY}) {sel('up', NODE)} == 0\n"
    f"    unless {ON_DEVICE} "
    f"max_over_time({sel('instance_device:rdma_device_sriov_virtual_function:max10m_max1d', DEVICE)}[10m]) == 1\n"
    ") or vector(0)"
)
UNREACHABLE_TEXT = (
    " Unreachable: ports that were ACTIVE in the last day on nodes whose exporter is down now (RdmaExporterDown, "
    "a warning): their state is unknown, and no other count here holds them."
)
UNREACHABLE_OVERRIDE = named_thresholds("unreachable", thresholds((1, WARNING)))



def fabric_overview() -> Json:
    port_label = "{{instance}} {{device}}/{{port}}"
    items: list[tuple[Json, int, int]] = [
        (stat(
            "Ports ACTIVE",
            "RDMA ports in state ACTIVE (or ACTIVE_DEFER) out of all ports the exporters report, whole nodes "
            "(the device and port selectors do not apply). SR-IOV virtual functions are not counted: they share "
            "their PF's link. Unused ports that were never cabled count in the total; the down-port panel next "
            "to it only counts ports RdmaPortDown cares about.",
            "none",
            targets((f"sum({sel('instance:rdma_ports_active:count', NODE)})", "active"),
                    (f"sum({sel('instance:rdma_ports:count', NODE)})", "total")),
        ), 4, 4),
        (stat(
            "Ports down",
            "Ports for which RdmaPortDown is pending or firing (not ACTIVE or not LinkUp while they were up in "
            "the last day, are declared in the expected topology or most ports of their HCA model on the node "
            "are up), and ports that are gone: RdmaPortVanished "
            "(up in the last day, no longer reported) and RdmaExpectedPortMissing or RdmaExpectedDeviceMissing "
            "(declared, never there; a missing device counts once). Reading the alert state keeps this cheap on "
            f"thousands of nodes. Colours follow those alerts.{UNREACHABLE_TEXT}",
            "none",
            targets((f"count({PORT_DOWN_ALERTS}) or vector(0)", "down"), (UNREACHABLE_PORTS, "unreachable")),
            steps=thresholds((1, CRITICAL)),
            overrides=[UNREACHABLE_OVERRIDE],
            alerts=[*PORT_DOWN_NAMES, "RdmaExporterDown"],
        ), 3, 4),
        (stat(
            "Links below expected",
            "Links short of the expected topology, ports (rate, width, netdev speed) and PCIe links (speed, width), "
            "or, for PCIe without an expectation, short of the most the link can do: the series the bandwidth "
            "alerts read, a link short in two ways (a port at half its rate and width) counted once. Red: below "
            "the expectation (RdmaPortRateBelowExpected, RdmaPcieLinkBelowExpected, "
            "RdmaNetdevSpeedBelowExpected page); orange: PCIe below the most it can do without an expectation "
            "(reference link_max, the warning RdmaPcieLinkDegraded). Below best: ports for which "
            "RdmaPortRateBelowRecentMax (below the best rate of their last day) or RdmaPortRateBelowPeers (below "
            "the ports of the same HCA model on the node) is pending or firing, the pages that need no "
            "expected topology. Ports and netdevs of a node short of a device expected by name are left out, as "
            "their alerts leave them (the names after it shifted; RdmaExpectedDeviceMissing pages). The port "
            "selector does not apply. The table below lists them.",
            "none",
            targets((f"count({links_affected(links_below(NOT_LINK_MAX))}) or vector(0)", "expected"),
                    (f"count({links_affected(sel(BELOW_EXPECTED, DEVICE, LINK_MAX))}) or vector(0)", "link_max"),
                    ("count(group by (cluster, job, instance, device, port) ("
                     + sel("ALERTS", DEVICE, f'alertname=~"{"|".join(BELOW_BEST_ALERTS)}"',
                           'alertstate=~"pending|firing"')
                     + ")) or vector(0)", "below best")),
            steps=thresholds((1, CRITICAL)),
            overrides=[named_thresholds("link_max", thresholds((1, WARNING)))],
            alerts=LINK_ALERTS,
        ), 3, 4),
        (stat(
            "Alerts firing",
            "Alerts of the rdma-exporter rules firing now, by severity (critical pages, warning opens a ticket); "
            "those of whole clusters (no instance) whatever the node selection.",
            "none",
            **firing_by_severity(cluster_wide=True),
        ), 4, 4),
        (stat(
            "RDMA throughput",
            "Data sent and received by all selected nodes' RDMA ports (5-minute rate, from the instance: "
            "recording rules; whole nodes).",
            "bps",
            targets((f"sum({sel('instance:rdma_port_transmit_bytes:rate5m', NODE)}) * 8", "tx"),
                    (f"sum({sel('instance:rdma_port_receive_bytes:rate5m', NODE)}) * 8", "rx")),
        ), 4, 4),
        (stat(
            "Utilisation",
            "Throughput as a share of the rate the ACTIVE ports trained at, over all selected nodes (5 minutes).",
            "percentunit",
            targets(
                (f"sum({sel('instance:rdma_port_transmit_bytes:rate5m', NODE)}) / "
                 f"sum({sel('instance:rdma_port_active_rate_bytes_per_second:sum', NODE)})", "tx"),
                (f"sum({sel('instance:rdma_port_receive_bytes:rate5m', NODE)}) / "
                 f"sum({sel('instance:rdma_port_active_rate_bytes_per_second:sum', NODE)})", "rx"),
            ),
            decimals=1,
        ), 3, 4),
        (stat(
            "Worst bit-error rate",
            f"Highest uncorrected bit-error rate of any selected node's port over 5 minutes and over an hour "
            f"(whole nodes: the device and port selectors do not apply). {BER_TEXT}",
            "sci",
            targets((f"max({sel('instance:rdma_port_bit_error_rate:max_ratio_rate5m', NODE)} "
                     f"or {sel(BER_SATURATED, NODE)})", "5 min"),
                    (f"max({sel(BER_1H, NODE)})", "1 h")),
            steps=BER_STEPS,
            overrides=BER_OVERRIDES,
            alerts=["RdmaPortBitErrorRateHigh"],
        ), 3, 4),
        (bargauge(
            "Ports by state",
            "How many ports are in each logical state (DOWN, INIT, ARMED, ACTIVE) and each physical state "
            "(Polling, Disabled, LinkUp...), whole nodes (instance: recording rules; the device and port "
            "selectors do not apply). SR-IOV virtual functions are not counted: they share their PF's link, and "
            "RdmaPortDown skips them. Anything but ACTIVE and LinkUp deserves a look: a port counted here but "
            "not in Ports down is one that was not up in the last day, is not expected, and whose HCA model's "
            "ports on the node are mostly down too (an unused port).",
            "none",
            targets((f"sum by (state) ({sel('instance:rdma_port_state:count', NODE)})", "{{state}}"),
                    (f"sum by (state) ({sel('instance:rdma_port_physical_state:count', NODE)})",
                     "physical {{state}}"),
                    instant=True),
            steps=thresholds(base=NEUTRAL),
            # Each state in the colour the node page's state panels give it: DOWN and Polling red.
            overrides=[{"matcher": {"id": "byName", "options": name},
                        "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": colour}}]}
                       for name, colour in [*PORT_STATES.values(),
                                            *((f"physical {text}", c) for text, c in PHYSICAL_STATES.values())]],
            alerts=["RdmaPortDown"],
        ), 6, 9),
        (table(
            "Links below expected rate, width or PCIe",
            "Every ACTIVE port that trained below its expected rate or width, RoCE netdev below its expected "
            "speed, and PCIe link below its expected (or, without any PCIe expectation, its maximum) speed or "
            "width, from the recording rule the bandwidth alerts read: problem is what falls short, reference "
            "against what (expected, link_max, or bond_slaves: a RoCE LAG bond against its slaves together). "
            "Share is the fraction of the reference reached: 50% is a 400G port at 200G or Gen4 instead of "
            "Gen5; red, as the alerts on it page. Share of link max is that of a PCIe link below the most it "
            "can do where no PCIe link is expected; orange, as RdmaPcieLinkDegraded is a warning. "
            "Expectations come from the exporter's expected topology (collector.expected); without it "
            "PCIe links and LAG bonds are checked, and ports against the best rate they trained at in the last "
            "day (reference day_max, RdmaPortRateBelowRecentMax's condition) and the median rate of the ports of "
            "the same HCA model and port number on the node (reference peers, RdmaPortRateBelowPeers' "
            "condition). SR-IOV virtual functions' rate "
            "and width are left out, as the alerts leave them (a VF reports its PF's link), and the expected rate, "
            "width and speed of a node short of a device expected by name (RdmaExpectedDeviceMissing). The port "
            "selector does not apply. Empty while every link trained as expected.",
            "percentunit",
            [target(f"{links_below(NOT_LINK_MAX)}\n  or\n{BELOW_DAY_BEST}\n  or\n{BELOW_PEERS}", instant=True,
                    table=True),
             target(sel(BELOW_EXPECTED, DEVICE, LINK_MAX), ref="B", instant=True, table=True)],
            steps=thresholds((1, OK), base=CRITICAL),
            alerts=LINK_ALERTS,
            overrides=[colour_cells("Share"), colour_cells("Share of link max"),
                       named_thresholds("Share of link max", thresholds((1, OK), base=WARNING)),
                       *(blank_cells_uncoloured(column) for column in ("Share", "Share of link max"))],
            links=[node_link("__data.fields.instance")],
            rename={"Value #A": "Share", "Value #B": "Share of link max"},
        ), 18, 9),
        (top_ports(
            "Top ports by bit-error rate",
            f"The ten ports with the highest uncorrected bit-error rate over 5 minutes, and the ten with the "
            f"highest over an hour. {BER_TEXT}",
            "sci",
            ber_5m(),
            f"{port_label}{BER_NETDEV} 5 min",
            more=[(sel(BER_1H), f"{port_label}{BER_NETDEV} 1 h")],
            steps=BER_STEPS,
            overrides=BER_OVERRIDES,
            alerts=["RdmaPortBitErrorRateHigh"],
        ), 6, 9),
        (top_ports(
            "Top ports by receive errors",
            "The ten ports that received the most errored packets (bad CRC, malformed, overrun) in the last 15 "
            "minutes, the count the alert reads. Colours follow RdmaPortReceiveErrors (warning above 10).",
            "none",
            sel('instance_device_port:rdma_port_receive_errors:increase15m'),
            port_label,
            steps=thresholds((above(10), WARNING)),
            alerts=["RdmaPortReceiveErrors"],
        ), 6, 9),
        (top_ports(
            "Top ports by transmit discards",
            "The ten ports that discarded the most outbound packets (port down or congested) in the last 15 "
            "minutes, the count the alert reads (which leaves out a port RdmaPortDown paged for in that time). "
            "Colours follow RdmaPortTransmitDiscards (warning above 100).",
            "none",
            sel('instance_device_port:rdma_port_transmit_discards:increase15m'),
            port_label,
            steps=thresholds((above(100), WARNING)),
            alerts=["RdmaPortTransmitDiscards"],
        ), 6, 9),
        (top_ports(
            "Top ports by transport retries",
            "The ten ports whose reliable transport retransmits the most (ACK timeouts, sequence-error NAKs, "
            "RNR NAKs; 5-minute rate). Colours follow RdmaTransportRetries (warning above 1/s).",
            "cps",
            f"sum without (counter) ({sel('instance_device_port:rdma_port_transport_retries:rate5m')})",
            port_label,
            steps=thresholds((above(1), WARNING)),
            alerts=["RdmaTransportRetries"],
        ), 6, 9),
        (top_ports(
            "Top InfiniBand ports by credit wait",
            "The ten InfiniBand ports that spent the largest share of time with data to send but no flow-control "
            "credits (PortXmitWait, 5 minutes): congestion downstream. Colours follow RdmaPortTransmitWaitHigh "
            "(warning above 0.1). Ports whose 32-bit counter is stuck at the maximum are not ranked "
            "(the dashboards' blank; RdmaPortCounterSaturated tickets it on links under 10 Gb/s only).",
            "percentunit",
            f"({sel('instance_device_port:rdma_port_transmit_wait:ratio_rate5m')} {NOT_ETHERNET})",
            port_label,
            steps=thresholds((above(0.1), WARNING)),
            alerts=["RdmaPortTransmitWaitHigh"],
        ), 6, 9),
        (top_ports(
            "Top RoCE priorities by PFC pause time",
            "The ten RoCE port priorities and directions paused by PFC for the largest share of time (5 minutes). "
            "rx: the switch paused this NIC; tx: this NIC paused the switch. Colours follow RdmaRocePfcPauseHigh "
            "(warning above 0.05, critical above 0.5).",
            "percentunit",
            sel('instance_device_port:rdma_ethtool_pfc_pause_duration:ratio_rate5m'),
            "{{instance}} {{netdev}} prio {{priority}} {{direction}}",
            steps=thresholds((above(0.05), WARNING), (above(0.5), CRITICAL)),
            alerts=["RdmaRocePfcPauseHigh"],
            target="roce-congestion",
        ), 6, 9),
        (top_ports(
            "Top RoCE ports by CNPs sent",
            "The ten RoCE ports that sent the most congestion notification packets (CNPs) over 5 minutes: they "
            "receive ECN-marked traffic, so the fabric in front of them is congested.",
            "pps",
            sel('instance_device_port:rdma_port_hw_np_cnp_sent:rate5m'),
            port_label,
            target="roce-congestion",
        ), 6, 9),
        (top_ports(
            "Hottest HCA sensors",
            "The ten chip sensors (ASICs) and the ten transceiver modules closest to the critical temperature their "
            "hardware reports: each bar is the temperature minus that threshold, so 0 is at it. "
            "RdmaDeviceTemperatureHigh opens a ticket from -10 °C for a chip and -5 °C for a module, and pages "
            "at 0: orange from there, red from 0.",
            "celsius",
            temperature_margin(f'sensor!~"{MODULE_SENSORS}"'),
            "{{instance}} {{device}} {{sensor}} (to critical)",
            more=[(temperature_margin(f'sensor=~"{MODULE_SENSORS}"'),
                   "{{instance}} {{device}} {{sensor}} (to critical)")],
            steps=thresholds((-10, WARNING), (0, CRITICAL)),
            overrides=[query_thresholds("B", thresholds((-5, WARNING), (0, CRITICAL)))],
            alerts=["RdmaDeviceTemperatureHigh"],
        ), 6, 9),
        (timeseries(
            "Throughput per rail",
            "Data sent (tx) and received (rx) per rail: one device and port (HCA index) summed across the nodes "
            "of a cluster (5 minutes, cluster_device_port: recording rules; whole clusters, the instance "
            "selector does not apply). In a rail-optimised cluster the rails should carry about the same load; "
            "one rail lagging points at its switch plane.",
            "bps",
            targets((f"{per_rail('cluster_device_port:rdma_port_transmit_bytes:rate5m')} * 8",
                     "{{device}}/{{port}} tx {{cluster}}"),
                    (f"{per_rail('cluster_device_port:rdma_port_receive_bytes:rate5m')} * 8",
                     "{{device}}/{{port}} rx {{cluster}}")),
        ), 12, 8),
        (timeseries(
            "Utilisation per rail",
            "Throughput of each rail as a share of the rate its ACTIVE ports trained at (5 minutes, "
            "cluster_device_port: recording rules; whole clusters, the instance selector does not apply), one "
            "line a rail and job (the record is per job). A rail that is down everywhere has no value.",
            "percentunit",
            targets((sel("cluster_device_port:rdma_port_transmit_utilisation:ratio_rate5m", RAIL),
                     "{{device}}/{{port}} tx {{job}} {{cluster}}"),
                    (sel("cluster_device_port:rdma_port_receive_utilisation:ratio_rate5m", RAIL),
                     "{{device}}/{{port}} rx {{job}} {{cluster}}")),
            minimum=0,
        ), 12, 8),
        (timeseries(
            "Throughput per cluster",
            "Data sent (tx) and received (rx) by all RDMA ports of each cluster (5 minutes, cluster: recording "
            "rules; whole clusters, the instance, device and port selectors do not apply). One series per "
            "cluster, so it stays cheap over weeks on thousands of nodes.",
            "bps",
            targets((f"{per_cluster('cluster:rdma_port_transmit_bytes:rate5m')} * 8", "tx {{cluster}}"),
                    (f"{per_cluster('cluster:rdma_port_receive_bytes:rate5m')} * 8", "rx {{cluster}}")),
        ), 8, 8),
        (timeseries(
            "Utilisation per cluster",
            "Throughput of each cluster as a share of the rate its ACTIVE ports trained at (5 minutes, cluster: "
            "recording rules; whole clusters, the instance, device and port selectors do not apply).",
            "percentunit",
            targets((f"{per_cluster('cluster:rdma_port_transmit_bytes:rate5m')}\n  / "
                     f"({per_cluster('cluster:rdma_port_active_rate_bytes_per_second:sum')} > 0)", "tx {{cluster}}"),
                    (f"{per_cluster('cluster:rdma_port_receive_bytes:rate5m')}\n  / "
                     f"({per_cluster('cluster:rdma_port_active_rate_bytes_per_second:sum')} > 0)", "rx {{cluster}}")),
            minimum=0,
        ), 8, 8),
        (timeseries(
            "Ports ACTIVE per cluster",
            "RDMA ports in state ACTIVE (or ACTIVE_DEFER) and all ports the exporters report, per cluster "
            "(cluster: recording rules; whole clusters, the instance, device and port selectors do not apply), "
            "SR-IOV virtual functions not counted (they share their PF's link). A step down is ports lost "
            "across the fleet.",
            "none",
            targets((per_cluster("cluster:rdma_ports_active:count"), "active {{cluster}}"),
                    (per_cluster("cluster:rdma_ports:count"), "total {{cluster}}")),
            alerts=["RdmaPortDown"],
            decimals=0,
        ), 8, 8),
        (timeseries(
            "Link drops in the last hour",
            "Link-down events of all selected ports over the trailing hour (IB link_downed, RoCE carrier and "
            "PHY link-down events, the best-informed source per port; a RoCE port set down and up counts), how "
            "many ports dropped at least twice, not counting the times a RoCE port's netdevs were set down "
            "(RdmaPortLinkFlapping, critical; a third drop in about 12 hours pages as RdmaPortLinkDropsRepeated), "
            "and link error recoveries (retrains that kept the link up; "
            "RdmaPortLinkErrorRecovery above 10 an hour on one port). SR-IOV virtual functions are left out, as "
            "the alerts leave them: a VF shares its PF's link, whose drops are counted once.",
            "none",
            targets((f"sum(max without (source, netdev) "
                     f"({sel('instance_device_port:rdma_port_link_down_events:increase1h')}) {NOT_VF})",
                     "link drops"),
                    (f"sum({sel('instance_device_port:rdma_port_link_drops:1h')} >= bool 2 {NOT_VF})",
                     "ports flapping"),
                    (f"sum({sel('instance_device_port:rdma_port_link_error_recovery:increase1h')} {NOT_VF})",
                     "link error recoveries")),
            alerts=["RdmaPortLinkDowned", "RdmaPortLinkFlapping", "RdmaPortLinkDropsRepeated",
                    "RdmaPortLinkErrorRecovery"],
            decimals=0,
        ), 8, 8),
        (timeseries(
            "Most congested nodes (InfiniBand)",
            "The five nodes whose most congested port spent the largest share of time waiting for flow-control "
            "credits (5 minutes, instance: recording rule; whole nodes). Colours follow RdmaPortTransmitWaitHigh "
            "(warning above 0.1).",
            "percentunit",
            targets((f"topk(5, {sel('instance:rdma_port_transmit_wait:max_ratio_rate5m', NODE)})", "{{instance}}")),
            steps=thresholds((above(0.1), WARNING)),
            alerts=["RdmaPortTransmitWaitHigh"],
            minimum=0,
            links=[node_link("__field.labels.instance")],
        ), 8, 8),
        (timeseries(
            "Most paused nodes (RoCE PFC)",
            "The five node and direction pairs whose most paused RoCE priority was paused by PFC for the largest "
            "share of time (5 minutes, instance: recording rule; whole nodes). rx: the switch paused the node, "
            "tx: the node paused the switch. Colours follow RdmaRocePfcPauseHigh (warning above 0.05, critical "
            "above 0.5).",
            "percentunit",
            targets((f"topk(5, {sel('instance:rdma_ethtool_pfc_pause_duration:max_ratio_rate5m', NODE)})",
                     "{{instance}} {{direction}}")),
            steps=thresholds((above(0.05), WARNING), (above(0.5), CRITICAL)),
            alerts=["RdmaRocePfcPauseHigh"],
            minimum=0,
            links=[node_link("__field.labels.instance", "roce-congestion")],
        ), 8, 8),
        (table(
            "Firmware by board",
            "HCAs of each board (the PSID, one firmware image each) by the firmware they run, per cluster "
            "(cluster_board_firmware: recording rule; whole clusters, the instance selector does not apply). "
            "HCAs are PCI physical functions: SR-IOV virtual functions, SFs and SMI sub devices run their "
            "parent's firmware, and devices without a board id have no image to compare. Two versions of one "
            "board: a rollout in progress, or HCAs left behind. Within one node, RdmaDeviceFirmwareMismatch "
            "opens a ticket; the node dashboard's devices table shows each HCA's firmware.",
            "none",
            [target(f"sum by (cluster, hca_type, board_id, fw_ver) "
                    f"({sel('cluster_board_firmware:rdma_devices:count', CLUSTER)})", instant=True, table=True)],
            rename={"hca_type": "HCA type", "board_id": "board", "fw_ver": "firmware", "Value": "HCAs"},
            alerts=["RdmaDeviceFirmwareMismatch"],
            decimals=0,
        ), 24, 6),
        (table(
            "Firing RDMA alerts",
            "Alerts of the rdma-exporter rules firing now, those of whole clusters (no instance) whatever the "
            "node selection. Click an alert name for its runbook, an instance for its node dashboard. Empty while "
            "no RDMA alert fires.",
            "none",
            [target(firing_alerts(cluster_wide=True), instant=True, table=True)],
            hide=("Value", "alertstate"),
            overrides=[
                {"matcher": {"id": "byName", "options": "alertname"},
                 "properties": [{"id": "links", "value": [{"title": "Runbook for ${__data.fields.alertname}",
                                                           "url": RUNBOOKS + "${__data.fields.alertname}.md",
                                                           "targetBlank": True}]}]},
                {"matcher": {"id": "byName", "options": "instance"},
                 "properties": [{"id": "links", "value": [node_link("__data.fields.instance")]}]},
            ],
        ), 24, 9),
    ]  # fmt: skip
    return dashboard(
        "fabric-overview",
        "Fleet view of InfiniBand and RoCE fabrics: down, degraded, erroring and congested links and where they "
        "are (node, HCA, rail). Built on the rdma-exporter recording rules.",
        standard_variables(),
        items,
    )


# --- node detail -------------------------------------------------------------------------------------


def node_detail() -> Json:
    dp = "{{instance}} {{device}}/{{port}}"
    link_columns = {"Value #A": "Rate", "Value #B": "Width", "Value #C": "Expected rate",
                    "Value #D": "Expected width", "Value #E": "State", "Value #F": "Best rate in a day",
                    "Value #G": "Share of best"}  # fmt: skip
    pcie_columns = {"Value #A": "Speed", "Value #B": "Width", "Value #C": "Max speed", "Value #D": "Max width",
                    "Value #E": "Port max speed", "Value #F": "Port max width",
                    "Value #G": "Expected speed", "Value #H": "Expected width"}  # fmt: skip
    gts = "suffix: GT/s"

    # By the whole node key: a node name that repeats in another cluster (a global view, cluster on All)
    # must give rows of its own, not a row that shows the healthier twin's value (dashboard review).
    def by_port(expr: str) -> str:
        return f"max by ({NODE_KEY}, device, port) ({expr})"

    def by_device(expr: str) -> str:
        return f"max by ({NODE_KEY}, device) ({expr})"

    active_rate = trained_rate()

    error_counters = [
        ("rdma_port_symbol_errors_total", "symbol errors"),
        ("rdma_port_receive_errors_total", "receive errors"),
        ("rdma_port_receive_remote_physical_errors_total", "remote physical errors"),
        ("rdma_port_transmit_discards_total", "transmit discards"),
        ("rdma_port_local_link_integrity_errors_total", "local link integrity errors"),
        ("rdma_port_excessive_buffer_overrun_errors_total", "buffer overruns"),
        # No alert reads these three: the panel is where a partition (P_Key) mismatch between tenants, or
        # the subnet manager's packets being dropped, shows up (ibqueryerrors reports them too).
        ("rdma_port_receive_constraint_errors_total", "receive constraint errors"),
        ("rdma_port_transmit_constraint_errors_total", "transmit constraint errors"),
        ("rdma_port_vl15_dropped_total", "VL15 drops"),
    ]
    # mlx5's error completions (its extended error Q counters), requester side first.
    completion_errors = [
        "req_cqe_error",
        "resp_cqe_error",
        "req_remote_access_errors",
        "resp_remote_access_errors",
        "req_remote_invalid_request",
        "resp_local_length_error",
    ]
    items: list[tuple[Json, int, int]] = [
        (stat(
            "Ports ACTIVE",
            "Selected ports in state ACTIVE (or ACTIVE_DEFER), out of all selected ports; SR-IOV virtual "
            "functions are not counted (they share their PF's link).",
            "none",
            targets((f"sum({sel('rdma_port_state_id')} >= bool 4 {NOT_VF})", "active"),
                    (f"count({sel('rdma_port_state_id')} {NOT_VF})", "total")),
        ), 4, 4),
        (stat(
            "Ports down",
            "Selected ports for which RdmaPortDown is pending or firing (down while they were up in the last day, "
            "are expected, or most ports of their HCA model on the node are up), and those gone: vanished since "
            "they were up (RdmaPortVanished) or expected and "
            f"never there (RdmaExpectedPortMissing, RdmaExpectedDeviceMissing). Colours follow those alerts."
            f"{UNREACHABLE_TEXT}",
            "none",
            targets((f"count({PORT_DOWN_ALERTS}) or vector(0)", "down"), (UNREACHABLE_PORTS, "unreachable")),
            steps=thresholds((1, CRITICAL)),
            overrides=[UNREACHABLE_OVERRIDE],
            alerts=[*PORT_DOWN_NAMES, "RdmaExporterDown"],
        ), 3, 4),
        (stat(
            "Throughput",
            "Data sent and received by the selected ports.",
            "bps",
            targets((f"sum({bytes_rate('transmit')}) * 8", "tx"),
                    (f"sum({bytes_rate('receive')}) * 8", "rx")),
        ), 5, 4),
        (stat(
            "Worst bit-error rate",
            f"Highest uncorrected bit-error rate of the selected ports over 5 minutes and over an hour. {BER_TEXT}",
            "sci",
            targets((f"max{ber_5m()}", "5 min"), (f"max({sel(BER_1H)})", "1 h")),
            steps=BER_STEPS,
            overrides=BER_OVERRIDES,
            alerts=["RdmaPortBitErrorRateHigh"],
        ), 3, 4),
        (stat(
            "Worst transport retries",
            "Retransmissions per second of the selected port that retransmits most (ACK timeouts, sequence-error "
            "NAKs, RNR NAKs; 5 minutes). Colours follow RdmaTransportRetries (warning above 1/s).",
            "cps",
            targets((f"max(sum without (counter) "
                     f"({sel('instance_device_port:rdma_port_transport_retries:rate5m')}))", "retries")),
            steps=thresholds((above(1), WARNING)),
            alerts=["RdmaTransportRetries"],
        ), 3, 4),
        (stat(
            "Saturated error counters",
            "Fixed-width PMA error counters stuck at their maximum: they no longer count, so alerts on them stay "
            "silent until reset (perfquery -R). port_xmit_wait counts on InfiniBand links under 10 Gb/s only, as the "
            "alert counts it: a RoCE port's is not read by any alert, and a faster link fills it again within "
            "seconds of a clear. Colours follow RdmaPortCounterSaturated (warning at 1).",
            "none",
            targets((SATURATED_COUNTERS, "saturated")),
            steps=thresholds((1, WARNING)),
            alerts=["RdmaPortCounterSaturated"],
        ), 3, 4),
        (stat(
            "Alerts firing",
            "rdma-exporter alerts firing now on the selected nodes, by severity (critical pages, warning opens "
            "a ticket); the table at the bottom of the fabric overview lists them with their runbooks.",
            "none",
            **firing_by_severity(),
        ), 3, 4),
        (row("Port state and link"), 24, 1),
        (state_timeline(
            "Logical port state",
            "Logical state of each port over time: DOWN (no link), INIT/ARMED (link up, waiting for the subnet "
            "manager), ACTIVE.",
            targets((sel("rdma_port_state_id"), dp)),
            value_mappings(PORT_STATES),
            alerts=["RdmaPortDown"],
        ), 12, 8),
        (state_timeline(
            "Physical port state",
            "Physical state of each port over time: LinkUp is healthy; Polling means no peer (cable, switch "
            "port), LinkErrorRecovery is a link retraining. Disabled is administrative on InfiniBand; on a RoCE "
            "port (mlx5) it is any link down, a pulled cable or a netdev set down alike (rdma_netdev_admin_up "
            "tells which: RdmaRocePortAdminDown).",
            targets((sel("rdma_port_physical_state_id"), dp)),
            value_mappings(PHYSICAL_STATES),
            alerts=["RdmaPortDown", "RdmaPortLinkErrorRecovery", "RdmaRocePortAdminDown"],
        ), 12, 8),
        (table(
            "Link rate and width",
            "Every port: its state, the rate and lane count it trained at if ACTIVE, the expected topology (empty "
            "columns when the exporter has no expectation), and the best rate it trained at while ACTIVE in the "
            "last day with the share of it the port reaches now (red below 100%: RdmaPortRateBelowRecentMax's "
            "condition, also without an expectation). A port below either slows every synchronous job on its "
            "rail. A port that is not ACTIVE has empty rate and width: what it reports then is its driver's "
            "preset (mlx5: 40 Gb/s 4X), not a link that trained low.",
            "none",
            targets((by_port(f"({active_rate}) * 8"), ""),
                    (by_port(when_active(sel("rdma_port_link_width_lanes"))), ""),
                    (by_port(f"{sel('rdma_expected_port_rate_bytes_per_second')} * 8"), ""),
                    (by_port(sel("rdma_expected_port_link_width_lanes")), ""),
                    # The state keeps a row for every port, DOWN ones too.
                    (by_port(sel("rdma_port_state_id")), ""),
                    (by_port(f"{sel(DAY_BEST_RATE)} * 8"), ""),
                    (by_port(f"({active_rate})\n  / {ON_PORT} group_left ()\n{sel(DAY_BEST_RATE)}"), ""),
                    instant=True, table=True),
            rename=link_columns,
            overrides=[unit_override("Rate", "bps"), unit_override("Expected rate", "bps"),
                       unit_override("Best rate in a day", "bps"),
                       unit_override("Share of best", "percentunit", thresholds=thresholds((1, OK), base=CRITICAL)),
                       colour_cells("Share of best"), blank_cells_uncoloured("Share of best"),
                       {"matcher": {"id": "byName", "options": "State"},
                        "properties": [{"id": "mappings", "value": [*value_mappings(PORT_STATES), BLANK_UNCOLOURED]},
                                       {"id": "custom.cellOptions", "value": {"type": "color-background"}}]}],
            alerts=["RdmaPortRateBelowExpected", "RdmaPortRateBelowRecentMax"],
        ), 12, 8),
        (table(
            "PCIe link",
            "PCIe link of each device: speed per lane and width it trained at, the device's maximum, the "
            "maximum of the port above it (root or switch port) and the expected topology. The link trains at "
            "the lower of the two maxima; below that, the host side caps the NIC under its network rate.",
            "none",
            targets((by_device(f"{sel('rdma_pcie_link_speed_transfers_per_second', DEVICE)} / 1e9"), ""),
                    (by_device(sel("rdma_pcie_link_width_lanes", DEVICE)), ""),
                    (by_device(f"{sel('rdma_pcie_link_max_speed_transfers_per_second', DEVICE)} / 1e9"), ""),
                    (by_device(sel("rdma_pcie_link_max_width_lanes", DEVICE)), ""),
                    (by_device(f"{sel('rdma_pcie_link_partner_max_speed_transfers_per_second', DEVICE)} / 1e9"), ""),
                    (by_device(sel("rdma_pcie_link_partner_max_width_lanes", DEVICE)), ""),
                    (by_device(f"{sel('rdma_expected_pcie_link_speed_transfers_per_second', DEVICE)} / 1e9"), ""),
                    (by_device(sel("rdma_expected_pcie_link_width_lanes", DEVICE)), ""),
                    instant=True, table=True),
            rename=pcie_columns,
            overrides=[unit_override("Speed", gts), unit_override("Max speed", gts),
                       unit_override("Port max speed", gts), unit_override("Expected speed", gts)],
            alerts=["RdmaPcieLinkBelowExpected", "RdmaPcieLinkDegraded"],
        ), 12, 8),
        (row("Throughput"), 24, 1),
        (timeseries(
            "Throughput per port",
            "Data sent (tx) and received (rx) per port.",
            "bps",
            targets((f"{bytes_rate('transmit')} * 8", f"{dp} tx"),
                    (f"{bytes_rate('receive')} * 8", f"{dp} rx")),
        ), 12, 8),
        (timeseries(
            "Utilisation per port",
            "Throughput as a share of the rate the port trained at, for ACTIVE ports: a port that is not ACTIVE "
            "has no value (its driver reports a preset rate, not a trained one).",
            "percentunit",
            targets((f"{bytes_rate('transmit')} / {ON_PORT} group_left () ({active_rate})", f"{dp} tx"),
                    (f"{bytes_rate('receive')} / {ON_PORT} group_left () ({active_rate})", f"{dp} rx")),
            minimum=0,
        ), 12, 8),
        (row("Errors and link events"), 24, 1),
        (timeseries(
            "Link error rates",
            "Error counters of the InfiniBand PMA per port: symbol errors (lanes), errored packets received, "
            "packets marked bad upstream, outbound discards, local link integrity and buffer overrun "
            "threshold crossings. Any steady non-zero rate is a cable, transceiver or port to look at. "
            "Constraint errors are packets dropped for a partition (P_Key) or raw-packet check in or out, "
            "which points at partition configuration, not the link; VL15 drops are subnet management "
            "packets the port had no room for.",
            "cps",
            targets(*((rate(metric), f"{dp} {name}") for metric, name in error_counters)),
            alerts=["RdmaPortReceiveErrors", "RdmaPortRemotePhysicalErrors", "RdmaPortTransmitDiscards",
                    "RdmaPortLocalLinkIntegrityErrors", "RdmaPortExcessiveBufferOverrun"],
        ), 12, 8),
        (timeseries(
            "Bit-error rate",
            f"Uncorrected bit-error rate per port over 5 minutes and over an hour: symbol errors per bit at the "
            f"trained rate (InfiniBand) or symbol errors FEC could not correct (RoCE). {BER_TEXT}",
            "sci",
            targets((ber_5m(), f"{dp}{BER_NETDEV} 5 min"), (sel(BER_1H), f"{dp}{BER_NETDEV} 1 h")),
            steps=BER_STEPS,
            overrides=BER_OVERRIDES,
            alerts=["RdmaPortBitErrorRateHigh"],
            log=True,
        ), 12, 8),
        (timeseries(
            "RoCE PHY errors",
            "Frames the RoCE ports dropped for a bad CRC or a physical coding error, and symbol errors the FEC "
            "could not correct (traffic lost), per second. InfiniBand ports count theirs in the link error rates.",
            "cps",
            targets((rate("rdma_ethtool_crc_error_packets_total"), "{{instance}} {{netdev}} CRC errors"),
                    (rate("rdma_ethtool_symbol_error_packets_total"), "{{instance}} {{netdev}} symbol errors"),
                    (rate("rdma_ethtool_pcs_symbol_errors_total"), "{{instance}} {{netdev}} uncorrected symbols")),
            alerts=["RdmaRoceCrcErrors", "RdmaPortBitErrorRateHigh"],
        ), 12, 8),
        (timeseries(
            "RoCE pre-FEC bit-error rate",
            "Bits the FEC had to correct per bit received on each RoCE port. PAM4 links live with a pre-FEC "
            "rate around 1e-8 to 1e-6; a rising trend warns of a degrading cable or transceiver before packets "
            "are lost. Per bit the PHY counted where the driver gives that count (bnxt_en; mainline mlx5 does "
            "not), else per bit at the netdev's line speed, which is what the PHY's count measures.",
            "sci",
            # Received bits only, without the direction label: the speed has none to match.
            targets((f"sum without (direction) ({rate('rdma_ethtool_corrected_bit_errors_total', PORT, RX)})\n"
                     f"  / (\n    sum without (direction) ({rate('rdma_ethtool_port_bit_count_total', PORT, RX)})\n"
                     f"      or\n    {sel('rdma_netdev_speed_bytes_per_second')} * 8\n  )",
                     "{{instance}} {{netdev}}")),
            log=True,
        ), 12, 8),
        (timeseries(
            "RoCE raw errors per lane",
            "Physical-layer errors each lane of a RoCE port received before FEC correction (rx_err_lane_N_phy). "
            "The FEC corrects them, so they cost no traffic yet; one lane far above the port's other lanes points "
            "to that lane of the cable, transceiver or connector before its errors outgrow the FEC.",
            "cps",
            targets((rate("rdma_ethtool_lane_raw_errors_total"),
                     "{{instance}} {{netdev}} {{direction}} lane {{lane}}")),
        ), 12, 8),
        (timeseries(
            "Transceiver module events",
            "Port module events the HCA firmware reported on each RoCE port in the last 15 minutes, as "
            "RdmaPortModuleFault counts them: bus_stuck (the module's management bus stuck or shorted), "
            "bad_shorted (a bad or shorted cable or module) and high_temp (the module too hot) are faults and "
            "open a ticket; unplug (a module removed, as in a reseat) is no fault. The alert leaves out the hour "
            "after a node reboot; this panel does not. Colours follow RdmaPortModuleFault (warning above 0) on the "
            "faults; unplugs have none.",
            "none",
            targets((increase("rdma_ethtool_module_events_total", "15m", PORT, f'event=~"{MODULE_FAULTS}"'),
                     "{{instance}} {{netdev}} {{event}}"),
                    (increase("rdma_ethtool_module_events_total", "15m", PORT, 'event="unplug"'),
                     "{{instance}} {{netdev}} unplug")),
            steps=thresholds((EPSILON, WARNING)),
            overrides=[query_thresholds("B", thresholds(base=NEUTRAL))],
            alerts=["RdmaPortModuleFault"],
            decimals=0,
        ), 12, 8),
        (timeseries(
            "Link events",
            "Link drops (IB link_downed; RoCE netdev carrier-down changes and PHY link-down events) and link "
            "error recoveries (successful retrains), as a rate in events per second over Grafana's rate "
            "interval, not a count per bar: one drop is a bump lasting one rate interval, whose height times "
            "the interval is 1. Carrier changes count on RoCE netdevs without PHY link-down events only, as the "
            "alerts count them (an IPoIB interface's carrier also follows `ip link set down`, and mlx5's "
            "drops at every channel reopen, `ethtool -G`/`-L` or an MTU change, with the link up). An "
            "InfiniBand port whose 8-bit link_downed stopped at 255 shows no drop here; the alerts count its "
            "returns to LinkUp. RdmaPortLinkDowned and RdmaPortLinkFlapping "
            "count drops over the trailing hour (one drop: a ticket; two or more: flapping, a page), as the fabric "
            "overview's link drops do, leaving out those of a RoCE port whose netdevs were set down; "
            "RdmaPortLinkDropsRepeated pages the third drop in about 12 hours, however far apart.",
            "cps",
            targets((rate("rdma_port_link_downed_total"), f"{dp} link downed"),
                    (rate("rdma_port_link_error_recovery_total"), f"{dp} error recovery"),
                    (f"{rate('rdma_netdev_carrier_down_changes_total')} {ETHERNET}\n  unless {ON_PORT} "
                     + sel("rdma_ethtool_link_down_events_total"),
                     "{{instance}} {{netdev}} carrier down"),
                    (rate("rdma_ethtool_link_down_events_total"), "{{instance}} {{netdev}} PHY link down")),
            alerts=["RdmaPortLinkFlapping", "RdmaPortLinkDropsRepeated", "RdmaPortLinkDowned",
                    "RdmaPortLinkErrorRecovery"],
        ), 12, 8),
        (timeseries(
            "PCIe AER errors",
            "PCIe errors each device's AER capability reported, by error class, and those the port above its "
            "link reported about what the device sent (\"port above\"; one device a card), as messages (the kernel's "
            "TOTAL_ERR_* lines, which RdmaPcieUncorrectableErrors counts; one message may carry several error "
            "types, and kernel 6.16 counts a fatal one without its type). Rising correctable "
            "errors often precede a link that retrains slower or narrower; non-fatal and fatal ones hit traffic "
            "and open a ticket (RdmaPcieUncorrectableErrors).",
            "cps",
            targets((rate("rdma_pcie_aer_reports_total", DEVICE), "{{instance}} {{device}} {{error_class}}"),
                    (rate("rdma_pcie_link_partner_aer_reports_total", DEVICE),
                     "{{instance}} {{device}} {{error_class}} (port above)")),
            alerts=["RdmaPcieUncorrectableErrors", "RdmaPcieLinkDegraded"],
        ), 12, 8),
        (timeseries(
            "Transport retries",
            "Reliable-transport retransmissions per port and cause (5 minutes), and their sum per port, which "
            "is what RdmaTransportRetries compares: two causes at 0.7/s each make a port retransmit 1.4/s. "
            "Colours follow RdmaTransportRetries (warning above 1/s), on the sum.",
            "cps",
            targets((sel("instance_device_port:rdma_port_transport_retries:rate5m"), f"{dp} {{{{counter}}}}"),
                    (f"sum without (counter) ({sel('instance_device_port:rdma_port_transport_retries:rate5m')})",
                     f"{dp} all causes")),
            overrides=[query_thresholds("B", thresholds((above(1), WARNING)), dashed=True)],
            alerts=["RdmaTransportRetries"],
        ), 8, 8),
        (timeseries(
            "Credit wait",
            "Share of time each InfiniBand port had data to send but no flow-control credits (5 minutes): "
            "congestion downstream of the port. Colours follow RdmaPortTransmitWaitHigh (warning above 0.1). "
            "A port missing here has its 32-bit counter stuck at the maximum (rdma_port_pma_saturated; "
            "RdmaPortCounterSaturated tickets it on links under 10 Gb/s only).",
            "percentunit",
            targets((f"{sel('instance_device_port:rdma_port_transmit_wait:ratio_rate5m')} {NOT_ETHERNET}", dp)),
            steps=thresholds((above(0.1), WARNING)),
            alerts=["RdmaPortTransmitWaitHigh"],
            minimum=0,
        ), 8, 8),
        (timeseries(
            "Receive queue out of buffer",
            "Packets dropped because software had not posted a receive buffer in time: on RDMA receive queues "
            "(hw_counters out_of_buffer, rx_out_of_buffer on mainline bnxt_re) and on a RoCE netdev's RX rings "
            "(ethtool rx_out_of_buffer). Colours follow RdmaPortOutOfBuffer (warning above 0), which opens a "
            "ticket on either.",
            "pps",
            targets((either_rate("rdma_port_hw_out_of_buffer_total", "rdma_port_hw_rx_out_of_buffer_total"), dp),
                    (rate("rdma_ethtool_out_of_buffer_total"), f"{dp} {{{{netdev}}}} RX rings")),
            steps=thresholds((EPSILON, WARNING)),
            alerts=["RdmaPortOutOfBuffer"],
        ), 8, 8),
        (timeseries(
            "Work completion errors",
            "Work requests that completed in error, per port (mlx5 hw_counters): req_cqe_error and "
            "resp_cqe_error count error completions on the sending (requester) and receiving (responder) side, "
            "such as a queue pair that gave up after the transport retries above. req_remote_access_errors: a "
            "peer refused this node's RDMA read, write or atomic (its memory key or range); "
            "resp_remote_access_errors: this node refused a peer's. req_remote_invalid_request: a peer "
            "answered a request as invalid, often a send longer than the receive buffer the peer had posted, "
            "which the peer counts as resp_local_length_error. A burst that lines up with a job's failure "
            "names the node and port to start from; a job tearing down its queue pairs can complete posted "
            "receives in error too. Flushed completions, which follow any queue pair error, are left out.",
            "cps",
            targets(*((rate(f"rdma_port_hw_{name}_total"), f"{dp} {name}") for name in completion_errors)),
        ), 24, 8),
        (row("Device"), 24, 1),
        (table(
            "Devices",
            "Identity of each RDMA device: HCA type, board, firmware, GUIDs, PCI address, driver, NUMA node, "
            "and whether verbs applications can open it (user verbs: its /dev/infiniband/uverbsN from "
            "ib_uverbs; without it NCCL falls back to TCP sockets). \"none\" is a fault only where "
            "RdmaDeviceUserVerbsMissing says so: a node that never loads ib_uverbs, or an SMI sub device, "
            "has none by design. Compare firmware across a fleet before blaming a cable.",
            "none",
            # Queries merged, not a join: a device without a NUMA node (-1: single-socket hosts, VMs) has no
            # rdma_device_numa_node and must still be listed.
            # `max without ()` drops __name__, which differs between them and would keep their rows apart.
            targets((f"max without () ({sel('rdma_device_info', DEVICE)})", ""),
                    (f"max without () ({sel('rdma_device_numa_node', DEVICE)})", ""),
                    (f"max without () ({sel('rdma_device_user_verbs', DEVICE)})", ""), instant=True, table=True),
            rename={"Value #B": "NUMA node", "Value #C": "User verbs"},
            hide=("cluster", "Value #A"),
            overrides=[{"matcher": {"id": "byName", "options": "User verbs"},
                        "properties": [{"id": "mappings", "value": [
                                           *value_mappings({0: ("none", WARNING), 1: ("yes", OK)}), BLANK_UNCOLOURED]},
                                       {"id": "custom.cellOptions", "value": {"type": "color-background"}}]}],
            alerts=["RdmaDeviceUserVerbsMissing", "RdmaUserVerbsNotLoaded"],
        ), 14, 7),
        (table(
            "Ports",
            "Link layer and per-lane speed generation (SDR ... XDR) of each port.",
            "none",
            # A port without a link (DOWN) has no lane speed; `or` keeps it in the table.
            [target(f"{sel('rdma_port_info')} * {ON_PORT} group_left (speed) {sel('rdma_port_lane_speed_info')} "
                    f"or {ON_PORT} {sel('rdma_port_info')}", instant=True, table=True)],
            hide=("cluster", "Value"),
        ), 5, 7),
        (table(
            "Network interfaces",
            "Network interfaces bound to each port: the RoCE netdev (for ethtool -S) or the IPoIB interface.",
            "none",
            [target(sel("rdma_port_netdev_info"), instant=True, table=True)],
            hide=("cluster", "Value"),
        ), 5, 7),
        (timeseries(
            "HCA and module temperature",
            "Temperature of each device's sensors (the ASIC; the transceiver module in the port's cage where it "
            "has a sensor) and, dashed, the critical temperature the hardware reports for each. "
            "RdmaDeviceTemperatureHigh opens a ticket within 10 °C of it (5 °C for a module) and pages at it. "
            "One hot device points "
            "at its slot's airflow, all of them at the chassis or the room. Empty for devices whose driver "
            "registers no hwmon device (mlx5 before Linux 6.6, VFs).",
            "celsius",
            targets((sel("rdma_device_temperature_celsius", DEVICE), "{{instance}} {{device}} {{sensor}}"),
                    (sel("rdma_device_temperature_critical_celsius", DEVICE),
                     "{{instance}} {{device}} {{sensor}} critical")),
            overrides=[{"matcher": {"id": "byFrameRefID", "options": "B"},
                        "properties": [{"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}}]}],
            alerts=["RdmaDeviceTemperatureHigh"],
        ), 24, 8),
        (row("Exporter"), 24, 1),
        (stat(
            "Exporter up",
            "Whether Prometheus can scrape rdma-exporter on the node. Down means every other panel is blind.",
            "none",
            targets((sel("up", NODE), "{{instance}}")),
            mappings=value_mappings({0: ("down", WARNING), 1: ("up", OK)}),
            alerts=["RdmaExporterDown"],
        ), 4, 6),
        (stat(
            "Collectors",
            "Whether every device answered each collector in the last scrape.",
            "none",
            targets((sel("rdma_exporter_scrape_collector_success", NODE), "{{instance}} {{collector}}")),
            mappings=value_mappings({0: ("failing", WARNING), 1: ("ok", OK)}),
            alerts=["RdmaExporterCollectorFailing"],
        ), 6, 6),
        (timeseries(
            "Scrape duration",
            "Time Prometheus waits for a scrape, each collector's share, and the scrape time averaged over 10 "
            "minutes as RdmaExporterScrapeSlow reads it. Colours follow RdmaExporterScrapeSlow (warning when "
            "the 10-minute average is above 6 s, 75% of the exporter's 8 s deadline).",
            "s",
            targets((sel("scrape_duration_seconds", NODE), "{{instance}} scrape"),
                    (sel("rdma_exporter_scrape_collector_duration_seconds", NODE), "{{instance}} {{collector}}"),
                    (f"avg_over_time({sel('scrape_duration_seconds', NODE)}[10m])", "{{instance}} 10-minute average")),
            overrides=[query_thresholds("C", thresholds((above(6), WARNING)), dashed=True)],
            alerts=["RdmaExporterScrapeSlow"],
        ), 6, 6),
        (timeseries(
            "File read errors",
            "sysfs files and ethtool queries the exporter could not read, by collector, device and reason; each "
            "costs one value. RdmaExporterReadErrors tickets io, permission and malformed errors that recur for "
            "30 minutes. Empty while the exporter has never failed a read (the series appear with the first "
            "error).",
            "cps",
            targets((f"sum by ({NODE_KEY}, collector, device, reason) "
                     f"({rate('rdma_exporter_file_read_errors_total', NODE)})",
                     "{{instance}} {{collector}} {{device}} {{reason}}")),
            alerts=["RdmaExporterReadErrors"],
        ), 4, 6),
        (stat(
            "Exporter version",
            "rdma-exporter version and the Python that runs it, per node.",
            "none",
            targets((sel("rdma_exporter_build_info", NODE), "{{version}} (Python {{python_version}})")),
            text_mode="name",
        ), 4, 6),
    ]  # fmt: skip
    return exact_instance(dashboard(
        "node-detail",
        "One node's RDMA fabric: port states, link rate/width and PCIe against expectations, throughput, "
        "errors, link events, transport retries, device identity and exporter health.",
        standard_variables(one_node=True),
        items,
        time_from="now-3h",
    ))


INSTANCE_REGEX = 'instance=~"$instance"'
INSTANCE_EXACT = 'instance="$instance"'


def exact_instance(node: Any) -> Any:
    """Every `instance=~"$instance"` matcher of a dashboard as `instance="$instance"`.

    Grafana regex-escapes a variable's value only where the variable is multi-select or has All. On the
    node page the instance is a single choice, so it arrives raw: an IPv6 target such as `[fd00::1]:9883`
    read as a regex is a character class, and every panel of the page came back empty. One node is one
    exact value.
    """
    if isinstance(node, dict):
        return {key: exact_instance(value) for key, value in node.items()}
    if isinstance(node, list):
        return [exact_instance(value) for value in node]
    if isinstance(node, str):
        return node.replace(INSTANCE_REGEX, INSTANCE_EXACT)
    return node


# --- RoCE congestion ---------------------------------------------------------------------------------


def roce_congestion() -> Json:
    np = "{{instance}} {{netdev}}"
    npd = "{{instance}} {{netdev}} prio {{priority}} {{direction}}"
    variables = standard_variables(ports_filter='link_layer="Ethernet"')
    # Not the pause record alone: mlx5 lists a priority's PFC counters only while PFC is enabled on it,
    # and none under link-level pause, so the priorities of such a port, or one whose PFC setting was
    # lost, would be missing. Traffic and ECN state are listed for every priority; the pause record adds
    # "global" (and PFC priorities of drivers without per-priority traffic counters).
    priority_sources = "|".join(("rdma_ethtool_priority_bytes_total", "rdma_netdev_ecn_enabled",
                                 "rdma_ethtool_pfc_pause_frames_total", PAUSE_DURATION))  # fmt: skip
    variables.append(
        query_variable(
            "priority",
            "Priority",
            f'label_values({{__name__=~"{priority_sources}", job=~"$job", cluster=~"$cluster", '
            'instance=~"$instance", device=~"$device", port=~"$port"}, priority)',
            description="Every priority that carries traffic, has ECN state or PFC counters on the selected "
            "ports, and 'global' where a port has link-level 802.3x pause enabled instead of PFC (every "
            "priority at once; mlx5's default, which protects only where the switch runs it too). The "
            "pause panels show the priorities selected, global as the port's 802.3x pause. "
            "The per-priority panels of series without a global one (ECN, marked packets, traffic, "
            "discards) show the numeric priorities selected and, while global is selected, every priority "
            "of the ports under 802.3x pause: global alone shows those ports, never nothing. All matches every "
            "priority.",
        )
    )
    # Link-level 802.3x pause frames as priority "global", as the pause-duration record has them, for the
    # priorities selected: the record's series of the port say whether "global" is one of them.
    global_pause_frames = (
        f'label_replace({rate("rdma_ethtool_global_pause_frames_total")}, "priority", "global", "", "")\n'
        f"  and on (cluster, job, instance, device, port, netdev, direction, priority)\n"
        f"{sel(PAUSE_DURATION, PORT, PRIO)}"
    )

    # PFC paused these priorities in the last day: lossless, as RdmaRoceEcnDisabled and
    # RdmaRocePfcDisabled read them (mlx5 drops a priority's PFC counters when PFC is disabled on it).
    # The day is the HCA's, joined as the rules join it: series of today's names get their HCA's key,
    # and the day is selected by node only, as it may have been recorded under other names.
    pfc_used = sel("instance_device_port:rdma_ethtool_pfc_used:present1d", NODE)

    def lossless_by_history(series: str) -> str:
        """`series` (device, port and priority labels of now) where PFC paused its HCA's port and priority
        in the last day, with an `hca` label added."""
        return (
            f"{series}\n  * on (cluster, job, instance, device) group_left (hca)\n"
            "group by (cluster, job, instance, device, hca) (topk by (cluster, job, instance, device) "
            f"(1, timestamp({sel('instance_device:rdma_device_hca:key', DEVICE)})))\n"
            f"  and on (cluster, job, instance, hca, port, priority)\n{pfc_used}"
        )

    ecn_disabled = f"({per_priority(sel, 'rdma_netdev_ecn_enabled')} == 0)"
    on_netdev = "on (cluster, job, instance, device, port, netdev)"
    RX = 'direction="rx"'  # the switch paused the port: the link runs 802.3x both ways
    on_priority = "on (cluster, job, instance, device, port, netdev, priority)"
    # RdmaRocePfcDisabled's expression as it is, with the selectors' matchers: the series after
    # `and` and `unless` are read for their presence only.
    priority_traffic = f"group without (direction) ({sel('rdma_ethtool_priority_bytes_total', PORT, PRIO)})"
    pfc_lost = (
        f"group without (hca) (\n{lossless_by_history(priority_traffic)}\n)\n"
        f"  unless {on_priority}\n"
        f"{sel('rdma_ethtool_pfc_pause_frames_total')}\n"
        f"  unless {on_netdev}\n"
        f"{sel('rdma_ethtool_global_pause_duration_seconds_total', PORT, RX)} > 0"
    )
    # == 0: a PCI function that is no SR-IOV VF (a VF's link is its PF's; soft-RoCE has no series)
    pf = sel("rdma_device_sriov_virtual_function", DEVICE)
    items: list[tuple[Json, int, int]] = [
        (stat(
            "Most-paused priority",
            "Largest share of time any selected RoCE priority and direction was paused by PFC, or a port by "
            "link-level pause (priority global), over 5 minutes. "
            "Colours follow RdmaRocePfcPauseHigh (warning above 0.05, critical above 0.5).",
            "percentunit",
            targets((f"max({sel(PAUSE_DURATION, PORT, PRIO)}) or vector(0)", "paused")),
            steps=thresholds((above(0.05), WARNING), (above(0.5), CRITICAL)),
            alerts=["RdmaRocePfcPauseHigh"],
            decimals=1,
        ), 3, 4),
        (stat(
            "Pause storms (10 min)",
            "Pause-storm warning events in the last 10 minutes (paused past the storm watermark), and the ports "
            "in an error storm as RdmaRocePauseStorm pages for them: the NIC stopped sending pause frames (the "
            "priority is no longer lossless) in the last 10 minutes, or in the last hour while its lossless "
            "priorities still drop for lack of buffer. Colours follow RdmaRocePauseStorm (warning and critical "
            "above 0).",
            "none",
            targets((f"sum({increase('rdma_ethtool_pause_storm_warning_events_total', '10m')})", "warning"),
                    (f"count(\n  {increase('rdma_ethtool_pause_storm_error_events_total', '1h')} > 0\n"
                     f"    and {on_netdev}\n  (\n"
                     f"    {increase('rdma_ethtool_pause_storm_error_events_total', '10m')} > 0\n      or\n"
                     f"    {sel(LOSSLESS_DISCARDS)} > 0\n  )\n) or vector(0)", "error")),
            steps=thresholds((EPSILON, WARNING)),
            overrides=[named_thresholds("error", thresholds((EPSILON, CRITICAL)))],
            alerts=["RdmaRocePauseStorm"],
            decimals=0,
        ), 3, 4),
        (stat(
            "CNPs ignored (5 min)",
            "Congestion notifications the selected ports received but ignored (5 minutes): their senders do not "
            "slow down when told to. Colours follow RdmaRoceCnpIgnored (warning above 0).",
            "pps",
            targets((f"sum({sel('instance_device_port:rdma_port_hw_rp_cnp_ignored:rate5m')})", "ignored")),
            steps=thresholds((EPSILON, WARNING)),
            alerts=["RdmaRoceCnpIgnored"],
        ), 3, 4),
        (stat(
            "Buffer discards (15 min)",
            "Packets the selected ports dropped for lack of receive buffer on lossless priorities in the last "
            "15 minutes (PFC priorities, every priority under link-level pause; the port-wide count where the "
            "driver has no per-priority one, whatever the priorities selected). Colours follow "
            "RdmaRoceBufferDiscards (warning above 0).",
            "none",
            targets((f"sum(\n{per_priority(sel, LOSSLESS_DISCARDS)}\n  or\n"
                     f"{sel(LOSSLESS_DISCARDS, PORT, PORT_WIDE)}\n)", "discards")),
            steps=thresholds((EPSILON, WARNING)),
            alerts=["RdmaRoceBufferDiscards"],
            decimals=0,
        ), 3, 4),
        (stat(
            "ECN disabled",
            "Selected lossless priorities (PFC paused them in the last day, as RdmaRoceEcnDisabled reads "
            "them, also if PFC was disabled on them since) and roles (np: notification point, rp: reaction "
            "point) with ECN disabled: congestion on them is left to PFC alone. The alert also waits for "
            "traffic since boot and 15 minutes.",
            "none",
            targets((f"count(\n{lossless_by_history(ecn_disabled)}\n) or vector(0)",
                     "disabled")),
            steps=thresholds((1, WARNING)),
            alerts=["RdmaRoceEcnDisabled"],
        ), 3, 4),
        (stat(
            "Priorities that lost PFC",
            "Selected priorities and netdevs that PFC paused in the last day but that have no PFC counters "
            "any more while their traffic counters are read: mlx5 drops them when PFC is disabled on a "
            "priority (QoS settings not applied again after a reboot or driver reload), and RoCE on it is "
            "lossy from then on. Not on a port under link-level 802.3x pause, which protects every "
            "priority. RdmaRocePfcDisabled's condition; the alert waits 15 minutes.",
            "none",
            targets((f"count(\n{pfc_lost}\n) or vector(0)", "lost")),
            steps=thresholds((1, WARNING)),
            alerts=["RdmaRocePfcDisabled"],
            decimals=0,
        ), 3, 4),
        (stat(
            "Unknown statistics",
            "Selected RoCE netdevs of hardware PFs whose ethtool statistics the exporter reads but whose CRC "
            "counter it does not know (a driver other than mlx5, bnxt_en, ice and i40e; mlx4_en's pause names "
            "are known, not its CRC counter): they have no CRC, PHY and, as a rule, PFC series, so this "
            "dashboard's panels and the RoCE alerts are blind there. "
            "RdmaRoceStatisticsUnknown's condition; the alert waits 30 minutes.",
            "none",
            targets((f"count(\n{sel('rdma_ethtool_curated_stats')}\n  unless {on_netdev}\n"
                     f"{sel('rdma_ethtool_crc_error_packets_total')}\n"
                     f"  and on (cluster, job, instance, device)\n{pf} == 0\n) or vector(0)", "unknown")),
            steps=thresholds((1, WARNING)),
            alerts=["RdmaRoceStatisticsUnknown"],
            decimals=0,
        ), 3, 4),
        (stat(
            "RoCE throughput",
            "Data sent and received by the selected RoCE ports.",
            "bps",
            targets((f"sum({bytes_rate('transmit')} {ETHERNET}) * 8", "tx"),
                    (f"sum({bytes_rate('receive')} {ETHERNET}) * 8", "rx")),
        ), 3, 4),
        (row("Priority flow control"), 24, 1),
        (timeseries(
            "PFC pause frames",
            "PFC pause frames per priority and direction, and link-level 802.3x pause frames as priority global "
            "(a port under global pause, every priority at once), as the time-paused record counts them. rx: the "
            "switch throttles this NIC (congestion in the fabric); tx: this NIC throttles the switch (the host "
            "cannot absorb what arrives: PCIe, memory, receive rings).",
            "pps",
            targets((rate("rdma_ethtool_pfc_pause_frames_total", PORT, PRIO), npd),
                    (global_pause_frames, npd)),
            alerts=["RdmaRocePfcPauseHigh"],
        ), 12, 8),
        (timeseries(
            "Time paused",
            "Share of time each priority and direction was paused by PFC, or the whole port by link-level "
            "802.3x pause (priority global), over 5 minutes. Colours follow RdmaRocePfcPauseHigh (warning "
            "above 0.05, critical above 0.5).",
            "percentunit",
            targets((sel(PAUSE_DURATION, PORT, PRIO), npd)),
            steps=thresholds((above(0.05), WARNING), (above(0.5), CRITICAL)),
            alerts=["RdmaRocePfcPauseHigh"],
            minimum=0,
        ), 12, 8),
        (timeseries(
            "Pause storms",
            "Pause-storm warning and error events as a rate in events per second over Grafana's rate interval, "
            "not a count per bar: one event is a bump lasting one rate interval, whose height times the interval "
            "is 1 (the stat above counts the last 10 minutes, as the alert does). An error event disables pause "
            "sending: the priority drops packets from then on. Colours follow RdmaRocePauseStorm (above 0).",
            "cps",
            targets((rate("rdma_ethtool_pause_storm_warning_events_total"), f"{np} warning"),
                    (rate("rdma_ethtool_pause_storm_error_events_total"), f"{np} error")),
            steps=thresholds((EPSILON, WARNING)),
            overrides=[query_thresholds("B", thresholds((EPSILON, CRITICAL)))],
            alerts=["RdmaRocePauseStorm"],
        ), 12, 8),
        (timeseries(
            "Traffic per priority",
            "Bits per second on each selected priority and direction of the physical port, lossy ones "
            "included: what the pauses throttle. With global selected, every priority of the ports under "
            "link-level pause.",
            "bps",
            targets((f"{per_priority(rate, 'rdma_ethtool_priority_bytes_total')} * 8", npd)),
        ), 12, 8),
        (row("ECN and congestion notification"), 24, 1),
        (timeseries(
            "ECN marks and CNPs",
            "DCQCN at work, per port: ECN-marked RoCE packets received and CNPs sent as notification point (the "
            "fabric in front of this port is congested), CNPs handled and ignored as reaction point (this port "
            "was told to slow down).",
            "pps",
            targets((either_rate("rdma_port_hw_np_ecn_marked_roce_packets_total", "rdma_port_hw_rx_ecn_mrkd_total",
                                 "rdma_port_hw_rx_ecn_marked_pkts_total"),
                     "{{instance}} {{device}}/{{port}} ECN-marked rx"),
                    (either_rate("rdma_port_hw_np_cnp_sent_total", "rdma_port_hw_cnp_sent_total",
                                 "rdma_port_hw_tx_cnp_pkts_total", "rdma_port_hw_np_cnp_pkts_total"),
                     "{{instance}} {{device}}/{{port}} CNP sent"),
                    (either_rate("rdma_port_hw_rp_cnp_handled_total", "rdma_port_hw_cnp_handled_total",
                                 "rdma_port_hw_rx_cnp_pkts_total"),
                     "{{instance}} {{device}}/{{port}} CNP handled"),
                    (either_rate("rdma_port_hw_rp_cnp_ignored_total", "rdma_port_hw_cnp_ignored_total"),
                     "{{instance}} {{device}}/{{port}} CNP ignored")),
            alerts=["RdmaRoceCnpIgnored"],
        ), 12, 8),
        (timeseries(
            "Packets marked by the NIC",
            "Packets of each selected priority the NIC itself ECN-marked because the host could not keep up "
            "(per-host congestion, rx_prio*_marked). With global selected, every priority of the ports under "
            "link-level pause.",
            "pps",
            targets((per_priority(rate, "rdma_ethtool_priority_ecn_marked_packets_total"),
                     "{{instance}} {{netdev}} prio {{priority}}")),
        ), 12, 8),
        (timeseries(
            "CNPs ignored per port",
            "Congestion notifications each port ignored (5-minute rate, the recording rule the alert reads). "
            "Colours follow RdmaRoceCnpIgnored (warning above 0).",
            "pps",
            targets((sel("instance_device_port:rdma_port_hw_rp_cnp_ignored:rate5m"),
                     "{{instance}} {{device}}/{{port}}")),
            steps=thresholds((EPSILON, WARNING)),
            alerts=["RdmaRoceCnpIgnored"],
        ), 12, 8),
        (state_timeline(
            "ECN enabled",
            "ECN per netdev, role (np: notification point, rp: reaction point) and selected priority, also one "
            "that lost its PFC counters; with global selected, every priority of the ports under link-level "
            "pause. A lossless priority carrying RoCE with ECN disabled is left to PFC alone.",
            targets((per_priority(sel, "rdma_netdev_ecn_enabled"),
                     "{{instance}} {{netdev}} {{role}} prio {{priority}}")),
            value_mappings({0: ("disabled", WARNING), 1: ("enabled", OK)}),
            alerts=["RdmaRoceEcnDisabled"],
        ), 12, 8),
        (row("Buffers"), 24, 1),
        (timeseries(
            "Receive buffer discards per priority",
            "Packets of each selected priority dropped for lack of per-host receive buffer, because of "
            "per-host congestion, or for lack of receive buffers at all, lossy priorities included (with "
            "global selected, every priority of the ports under link-level pause): on a lossless one any of "
            "these means PFC did not hold, and RdmaRoceBufferDiscards tickets it; on a lossy one they are how "
            "bursts are shed. No colours, since only the lossless priorities matter: the Buffer discards stat "
            "above counts those, as the alert does.",
            "pps",
            targets((per_priority(rate, "rdma_ethtool_priority_buffer_discards_total"),
                     "{{instance}} {{netdev}} prio {{priority}} buffer"),
                    (per_priority(rate, "rdma_ethtool_priority_congestion_discards_total"),
                     "{{instance}} {{netdev}} prio {{priority}} congestion"),
                    (per_priority(rate, "rdma_ethtool_priority_discards_total"),
                     "{{instance}} {{netdev}} prio {{priority}} no buffer")),
            alerts=["RdmaRoceBufferDiscards"],
        ), 12, 8),
        (timeseries(
            "Out of buffer",
            "Packets dropped because software had not posted receive buffers in time: on the netdev RX rings "
            "(rx_out_of_buffer) and on RDMA receive queues (hw_counters out_of_buffer, rx_out_of_buffer on "
            "mainline bnxt_re). Colours follow RdmaPortOutOfBuffer (warning above 0).",
            "pps",
            targets((rate("rdma_ethtool_out_of_buffer_total"), f"{np} RX rings"),
                    (f"({either_rate('rdma_port_hw_out_of_buffer_total', 'rdma_port_hw_rx_out_of_buffer_total')})"
                     f" {ETHERNET}", "{{instance}} {{device}}/{{port}} RDMA queues")),
            steps=thresholds((EPSILON, WARNING)),
            alerts=["RdmaPortOutOfBuffer"],
        ), 12, 8),
        (timeseries(
            "Port discards and buffer pressure",
            "Packets the physical port discarded (rx: no buffer, tx: head-of-line or link down) and how often "
            "its receive buffer passed 85% full, per second.",
            "cps",
            targets((rate("rdma_ethtool_port_discards_total"), f"{np} {{{{direction}}}} discards"),
                    (rate("rdma_ethtool_port_buffer_almost_full_events_total"), f"{np} buffer almost full")),
        ), 12, 8),
        (timeseries(
            "PCIe outbound stalls",
            "Share of time the NIC's outbound PCIe reads and writes were stalled: the share of seconds in which "
            "they waited for credits over 30% of the time (the driver's stalled-event counters, over Grafana's "
            "rate interval), and the share of the last second before each scrape they waited (a sample: at a "
            "30 s scrape it sees one second in thirty, and missed the stalls the first shows). A stalled host bus "
            "is the usual reason a NIC sends PFC pauses (tx) although the fabric is idle.",
            "percentunit",
            targets((rate("rdma_ethtool_pci_outbound_stalled_seconds_total"),
                     f"{np} {{{{operation}}}} seconds stalled"),
                    (sel("rdma_ethtool_pci_outbound_stalled_ratio"), f"{np} {{{{operation}}}} last second")),
            minimum=0,
        ), 12, 8),
    ]  # fmt: skip
    # Panels whose worst nodes are those of their alert's condition, not of everything they draw: drops on
    # lossy priorities (bursts shed, as they may be) and ECN there (mlx5 leaves it off) rank every node
    # alike and hid the one the alert was about (dashboard review).
    ranked_by = {
        "Receive buffer discards per priority": sel(LOSSLESS_DISCARDS),
        "ECN enabled": lossless_by_history(per_priority(sel, "rdma_netdev_ecn_enabled")),
    }  # fmt: skip
    for panel_json, _, _ in items:
        if panel_json["type"] in ("timeseries", "state-timeline"):
            # ECN state: the nodes with a priority disabled (0) first.
            lowest = panel_json["type"] == "state-timeline"
            rank = ranked_by.get(panel_json["title"])
            for tgt in panel_json["targets"]:
                tgt["expr"] = worst_nodes(tgt["expr"], lowest=lowest, rank=rank)
            worst = "with ECN disabled first" if lowest else "with the highest value"
            if rank is not None:
                worst += " on a lossless priority, as the alert judges them"
            panel_json["description"] += (
                f" With more than {WORST_NODES} nodes selected, the {WORST_NODES} {worst} at each moment, each "
                "with all its series: select nodes to see others."
            )
    return dashboard(
        "roce-congestion",
        "Is the RoCE fabric congested, on which port and priority: PFC pause frames and pause time, pause "
        "storms, ECN marks and CNPs, ECN state, NIC buffer discards and out-of-buffer drops.",
        variables,
        items,
    )


# --- output ------------------------------------------------------------------------------------------

BUILDERS = {"fabric-overview": fabric_overview, "node-detail": node_detail, "roce-congestion": roce_congestion}


def render(board: Json) -> str:
    return json.dumps(board, indent=2, ensure_ascii=False) + "\n"


def build_all() -> dict[str, str]:
    """{file name: JSON text} of every dashboard."""
    return {f"{key}.json": render(build()) for key, build in BUILDERS.items()}


def main(argv: Sequence[str] = ()) -> int:
    check = "--check" in argv
    stale = []
    for name, text in build_all().items():
        path = DASHBOARDS / name
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            DASHBOARDS.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print(f"out of date, run python grafana/build.py: {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
