"""The expected-topology collector: config validation, pattern expansion and the metrics it exports."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rdma_exporter.collect.base import FamilySet
from rdma_exporter.collect.expected import ExpectedPort, ExpectedSource, expand_devices
from rdma_exporter.config import COLLECTORS, Config, ConfigError, load_config_file, parse_config
from rdma_exporter.daemon import build_collector, build_registry, build_sources
from rdma_exporter.sample_tree import HEALTHY_SPEC, TreeSpec, build_tree

DGX = """
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
      - devices: [mlx5_8, mlx5_9]
        link_layer: Ethernet
        rate_gbps: 200
        width: 2
"""


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(metrics: dict, name: str, **labels: str) -> float | None:
    return metrics.get((name, tuple(sorted(labels.items()))))


def scrape(sys_root: Path, config: Config) -> dict:
    config = replace(config, sysfs=sys_root)
    return samples(generate_latest(build_registry(build_collector(config))).decode())


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tree(tmp_path_factory.mktemp("expected"), HEALTHY_SPEC)


def exposed(source: ExpectedSource, results: dict) -> set[tuple[str, tuple[str, ...], float]]:
    """What `expose` exports for one round's results: (family, label values, value) per sample."""
    out = FamilySet()
    source.expose(results, out)
    return {(m.name, tuple(s.labels.values()), s.value) for m in out for s in m.samples}


def parse(text: str) -> Config:
    return parse_config(yaml.safe_load(text), "test.yml")


def check_config(path: Path) -> subprocess.CompletedProcess[str]:
    """`rdma-exporter --check-config` on a config file, as an operator runs it."""
    return subprocess.run(
        [sys.executable, "-m", "rdma_exporter", "--config.file", str(path), "--check-config"],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_registered_as_collector() -> None:
    assert "expected" in COLLECTORS


@pytest.mark.parametrize(
    ("pattern", "names"),
    [
        ("mlx5_[0-3]", ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]),
        ("mlx5_[8-11]", ["mlx5_8", "mlx5_9", "mlx5_10", "mlx5_11"]),
        ("ib[00-02]x", ["ib00x", "ib01x", "ib02x"]),
        ("mlx5_bond_0", ["mlx5_bond_0"]),
        ("mlx5_[5-5]", ["mlx5_5"]),
        ("mlx5_[0-10]", [f"mlx5_{n}" for n in range(11)]),
        ("mlx5_[010-011]", ["mlx5_010", "mlx5_011"]),
        # Names other than the kernel's: rxe and siw devices are named by whoever adds them.
        ("rxe_eth0.100", ["rxe_eth0.100"]),
        ("siw-enp1s0", ["siw-enp1s0"]),
        ("rxe-vlan[1-2].10", ["rxe-vlan1.10", "rxe-vlan2.10"]),
        # The kernel refuses only '%' in a name given to `rdma link add`: a colon is a name character.
        ("rxe:eth0", ["rxe:eth0"]),
        # A bound without a leading zero is not padding, however many digits it has.
        ("mlx5_[98-101]", ["mlx5_98", "mlx5_99", "mlx5_100", "mlx5_101"]),
        # A range alone enumerates names as a bare "0" is one: nothing around it to refuse.
        ("[0-1]", ["0", "1"]),
    ],
)
def test_expand_devices(pattern: str, names: list[str]) -> None:
    assert expand_devices("f", "k", pattern) == names


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        ("mlx5_.*", "enumerable"),
        ("mlx5_[0-3][0-1]", "enumerable"),
        ("mlx5_[a-z]", "enumerable"),
        ("mlx5_[7-0]", "empty"),
        ("mlx5_[0-999999]", "expands to more than"),
        ("mlx 5_[0-1]", "around its range"),
        # Zero padding on one bound only: mlx5_01.. or mlx5_1..? Refused rather than guessed.
        ("mlx5_[01-100]", "zero-padded"),
        ("mlx5_[00-9]", "zero-padded"),
        # Digits of other scripts: \d and int() take them, and mlx5_[٠-٣] became mlx5_0..mlx5_3.
        ("mlx5_[\u0660-\u0663]", "enumerable"),
    ],
)
def test_expand_devices_rejects(pattern: str, reason: str) -> None:
    with pytest.raises(ConfigError) as err:
        expand_devices("f", "k", pattern)
    assert reason in err.value.reason


def test_parse_expands_and_converts_units() -> None:
    ports = parse(DGX).collector_settings["expected"]["ports"]
    assert len(ports) == 10
    first = ports[0]
    assert first == ExpectedPort(
        device="mlx5_0",
        port=1,
        link_layer="InfiniBand",
        rate_bytes_per_second=400e9 / 8,
        width=4,
        pcie_transfers_per_second=32e9,
        pcie_width=16,
        netdev_speed_bytes_per_second=None,
    )
    roce = ports[8]
    assert (roce.device, roce.port, roce.link_layer) == ("mlx5_8", 1, "Ethernet")
    # An Ethernet port's netdev is expected at the port rate unless said otherwise.
    assert roce.netdev_speed_bytes_per_second == 200e9 / 8


@pytest.mark.parametrize(
    ("body", "key", "reason"),
    [
        ("ports: {devices: mlx5_0}", "collector.expected.ports", "expected a list"),
        ("ports: [mlx5_0]", "collector.expected.ports[0]", "expected a mapping"),
        ("ports: [{port: 1}]", "collector.expected.ports[0].devices", "required"),
        ("ports: [{devices: mlx5_0, speed: 400}]", "collector.expected.ports[0].speed", "unknown key"),
        ("ports: [{devices: 'mlx5_*'}]", "collector.expected.ports[0].devices", "enumerable"),
        ("ports: [{devices: [mlx5_0, 'x[1-']}]", "collector.expected.ports[0].devices[1]", "enumerable"),
        ("ports: [{devices: [], rate_gbps: 1}]", "collector.expected.ports[0].devices", "expected a device"),
        ("ports: [{devices: mlx5_0, port: 0}]", "collector.expected.ports[0].port", "from 1 to 4294967294"),
        ("ports: [{devices: mlx5_0, port: true}]", "collector.expected.ports[0].port", "from 1 to 4294967294"),
        # A port number is an integer: port 1.5 would be exported, and reported missing, forever.
        ("ports: [{devices: mlx5_0, port: 1.5}]", "collector.expected.ports[0].port", "from 1 to 4294967294, got 1.5"),
        ("ports: [{devices: mlx5_0, port: '1'}]", "collector.expected.ports[0].port", "from 1 to 4294967294, got '1'"),
        ("ports: [{devices: mlx5_0, rate_gbps: -400}]", "collector.expected.ports[0].rate_gbps", "positive"),
        ("ports: [{devices: mlx5_0, rate_gbps: '400G'}]", "collector.expected.ports[0].rate_gbps", "positive"),
        ("ports: [{devices: mlx5_0, width: 3}]", "collector.expected.ports[0].width", "one of 1, 2, 4, 8, 12"),
        ("ports: [{devices: mlx5_0, link_layer: IB}]", "collector.expected.ports[0].link_layer", "InfiniBand"),
        ("ports: [{devices: mlx5_0, pcie_gen: 8}]", "collector.expected.ports[0].pcie_gen", "one of 1, 2"),
        ("ports: [{devices: mlx5_0, pcie_width: 64}]", "collector.expected.ports[0].pcie_width", "12, 16"),
        (
            "ports: [{devices: 'mlx5_[0-3]'}, {devices: mlx5_2}]",
            "collector.expected.ports[1].devices",
            "already expected by collector.expected.ports[0]",
        ),
        (
            "ports: [{devices: mlx5_0, pcie_gen: 5}, {devices: mlx5_0, port: 2, pcie_gen: 4}]",
            "collector.expected.ports[1].pcie_gen",
            "PCIe link speed for mlx5_0 (pcie_gen 4) differs from collector.expected.ports[0] (pcie_gen 5)",
        ),
        (
            "ports: [{devices: mlx5_0, pcie_width: 16}, {devices: mlx5_0, port: 2, pcie_width: 8}]",
            "collector.expected.ports[1].pcie_width",
            "PCIe link width for mlx5_0 (pcie_width 8) differs from collector.expected.ports[0] (pcie_width 16)",
        ),
        (
            # Speed and width are compared each on its own: the agreeing speed does not hide the width.
            "ports: [{devices: 'mlx5_[0-1]', pcie_gen: 5, pcie_width: 16}, "
            "{devices: mlx5_1, port: 2, pcie_gen: 5, pcie_width: 8}]",
            "collector.expected.ports[1].pcie_width",
            "PCIe link width for mlx5_1 (pcie_width 8) differs from collector.expected.ports[0] (pcie_width 16)",
        ),
        # YAML `true` equals 1 in Python: it must not pass as a 1X width, Gen1 or x1 link.
        ("ports: [{devices: mlx5_0, width: true}]", "collector.expected.ports[0].width", "one of 1, 2, 4, 8, 12"),
        ("ports: [{devices: mlx5_0, pcie_gen: true}]", "collector.expected.ports[0].pcie_gen", "one of 1, 2"),
        ("ports: [{devices: mlx5_0, pcie_width: true}]", "collector.expected.ports[0].pcie_width", "one of 1, 2, 4"),
        ("ports: [{devices: mlx5_0, rate_gbps: true}]", "collector.expected.ports[0].rate_gbps", "positive"),
        # A bound of more digits than int() converts (4300) once ended start-up with a ValueError traceback.
        (
            "ports: [{devices: 'mlx5_[0-" + "9" * 5000 + "]'}]",
            "collector.expected.ports[0].devices",
            "a bound of the range in 'mlx5_[0-999",
        ),
        # Beyond a float (an OverflowError traceback), or so large its bytes per second are +Inf.
        (
            "ports: [{devices: mlx5_0, rate_gbps: 1" + "0" * 400 + "}]",
            "collector.expected.ports[0].rate_gbps",
            "expected a number of Gb/s below 1e+12",
        ),
        (
            "ports: [{devices: mlx5_0, netdev_speed_gbps: 1.7e+308}]",
            "collector.expected.ports[0].netdev_speed_gbps",
            "expected a number of Gb/s below 1e+12",
        ),
        # The bound itself is refused (1.0e+12: YAML 1.1 reads a bare 1e12 as a string).
        (
            "ports: [{devices: mlx5_0, rate_gbps: 1.0e+12}]",
            "collector.expected.ports[0].rate_gbps",
            "expected a number of Gb/s below 1e+12",
        ),
        # Zero is not a rate: a port expected at 0 b/s never alerts as below expectation.
        ("ports: [{devices: mlx5_0, rate_gbps: 0}]", "collector.expected.ports[0].rate_gbps", "positive number, got 0"),
        (
            "ports: [{devices: mlx5_0, netdev_speed_gbps: 0}]",
            "collector.expected.ports[0].netdev_speed_gbps",
            "positive number, got 0",
        ),
        (
            "ports: [{devices: mlx5_0, port: 4294967295}]",
            "collector.expected.ports[0].port",
            "from 1 to 4294967294, got 4294967295",
        ),
        (
            "ports: [{devices: mlx5_0, link_layer: infiniband}]",
            "collector.expected.ports[0].link_layer",
            "InfiniBand, Ethernet",
        ),
        ("port: []", "collector.expected.port", "unknown key"),
        # An unquoted number in a list of names is no name: refused, not a TypeError traceback.
        ("ports: [{devices: [mlx5_0, 5]}]", "collector.expected.ports[0].devices[1]", "non-empty string, got 5"),
        ("ports: [{devices: 5}]", "collector.expected.ports[0].devices", "expected a device name"),
        ("ports: [{devices: [mlx5_0, '']}]", "collector.expected.ports[0].devices[1]", "non-empty string, got ''"),
    ],
)
def test_invalid_settings_name_file_key_and_reason(body: str, key: str, reason: str) -> None:
    document = {"collector": {"expected": yaml.safe_load(body)}}
    with pytest.raises(ConfigError) as err:
        parse_config(document, "rdma.yml")
    assert err.value.source == "rdma.yml"
    assert err.value.key == key
    assert reason in err.value.reason
    assert str(err.value).startswith(f"rdma.yml: {key}: ")


def test_check_config_cli_reports_file_and_key(tmp_path: Path) -> None:
    """`--check-config` validates the section without building the daemon (the validators register early)."""
    bad = tmp_path / "bad.yml"
    bad.write_text("collector:\n  expected:\n    ports: [{devices: 'mlx5_*'}]\n")
    run = check_config(bad)
    assert run.returncode == 2
    assert f"{bad}: collector.expected.ports[0].devices:" in run.stderr
    good = tmp_path / "good.yml"
    good.write_text(DGX)
    run = check_config(good)
    assert run.returncode == 0, run.stderr


SPLIT_PCIE = """
collector:
  expected:
    ports:
      - {devices: "mlx5_[0-7]", port: 1, pcie_gen: 5}
      - {devices: mlx5_0, port: 2, pcie_width: 16}
"""


def test_pcie_speed_and_width_from_separate_entries_merge(tree: Path, tmp_path: Path) -> None:
    """Entries for two ports of one device may each give part of its PCIe expectation: one the
    generation, the other the width. They do not conflict, and the device expects both."""
    path = tmp_path / "split.yml"
    path.write_text(SPLIT_PCIE)
    run = check_config(path)
    assert run.returncode == 0, run.stderr
    metrics = scrape(tree, load_config_file(path))
    assert value(metrics, "rdma_expected_pcie_link_speed_transfers_per_second", device="mlx5_0") == 32e9
    assert value(metrics, "rdma_expected_pcie_link_width_lanes", device="mlx5_0") == 16
    # Only mlx5_0 has a width from the second entry.
    assert value(metrics, "rdma_expected_pcie_link_speed_transfers_per_second", device="mlx5_1") == 32e9
    assert value(metrics, "rdma_expected_pcie_link_width_lanes", device="mlx5_1") is None


def test_no_expectations_no_source_no_series(tree: Path) -> None:
    # Other collectors (netdev, ethtool, pcie...) come and go; what matters is that no expected source is built.
    assert "expected" not in [s.name for s in build_sources(Config())]
    metrics = scrape(tree, Config())
    assert not [name for name, _ in metrics if name.startswith("rdma_expected_")]
    assert value(metrics, "rdma_exporter_scrape_collector_success", collector="expected") is None


def test_exports_expectations_next_to_observations(tree: Path, tmp_path: Path) -> None:
    path = tmp_path / "rdma.yml"
    path.write_text(DGX)
    config = load_config_file(path)
    metrics = scrape(tree, config)
    for n in range(8):
        labels = {"device": f"mlx5_{n}", "port": "1"}
        assert value(metrics, "rdma_expected_port_info", **labels, link_layer="InfiniBand") == 1
        # Same unit as the observation, so that a rule compares them with a plain `<`.
        observed = value(metrics, "rdma_port_rate_bytes_per_second", **labels)
        assert value(metrics, "rdma_expected_port_rate_bytes_per_second", **labels) == observed == 5e10
        assert value(metrics, "rdma_expected_port_link_width_lanes", **labels) == 4
        assert value(metrics, "rdma_expected_port_present", **labels) == 1
        assert value(metrics, "rdma_expected_device_present", device=f"mlx5_{n}") == 1
        assert value(metrics, "rdma_expected_pcie_link_speed_transfers_per_second", device=f"mlx5_{n}") == 32e9
        assert value(metrics, "rdma_expected_pcie_link_width_lanes", device=f"mlx5_{n}") == 16
        assert value(metrics, "rdma_expected_netdev_speed_bytes_per_second", **labels) is None
    roce = {"device": "mlx5_8", "port": "1"}
    assert value(metrics, "rdma_expected_port_info", **roce, link_layer="Ethernet") == 1
    assert value(metrics, "rdma_expected_port_rate_bytes_per_second", **roce) == 2.5e10
    assert value(metrics, "rdma_port_rate_bytes_per_second", **roce) == 2.5e10
    assert value(metrics, "rdma_expected_netdev_speed_bytes_per_second", **roce) == 2.5e10
    assert value(metrics, "rdma_expected_pcie_link_speed_transfers_per_second", device="mlx5_8") is None
    assert value(metrics, "rdma_exporter_scrape_collector_success", collector="expected") == 1


def test_reports_missing_devices_and_ports(tree: Path) -> None:
    config = parse(
        """
collector:
  expected:
    ports:
      - {devices: "mlx5_[0-1]", port: 1}
      - {devices: mlx5_0, port: 2}
      - {devices: "mlx5_[10-11]", rate_gbps: 400}
"""
    )
    metrics = scrape(tree, config)
    assert value(metrics, "rdma_expected_device_present", device="mlx5_0") == 1
    assert value(metrics, "rdma_expected_port_present", device="mlx5_0", port="1") == 1
    assert value(metrics, "rdma_expected_port_present", device="mlx5_0", port="2") == 0
    assert value(metrics, "rdma_expected_port_info", device="mlx5_0", port="2", link_layer="") == 1
    for name in ("mlx5_10", "mlx5_11"):
        assert value(metrics, "rdma_expected_device_present", device=name) == 0
        assert value(metrics, "rdma_expected_port_present", device=name, port="1") == 0
        # Expectations are exported for missing devices too: dashboards show what should be there.
        assert value(metrics, "rdma_expected_port_rate_bytes_per_second", device=name, port="1") == 5e10


def test_excluded_device_is_present_with_its_ports_unknown(tree: Path, tmp_path: Path) -> None:
    """Excluding a misbehaving device (what the ScrapeSlow runbook advises) must not page it as missing:
    it is listed, only not read, so it is present, its ports unreported, and it is named as excluded.
    An excluded device that really disappears is missing all the same."""
    config = parse("collector: {expected: {ports: [{devices: 'mlx5_[0-1]'}]}}")
    config = replace(config, device_exclude=re.compile("mlx5_1"))
    tree = Path(shutil.copytree(tree, tmp_path / "tree", symlinks=True))
    metrics = scrape(tree, config)
    assert value(metrics, "rdma_expected_device_present", device="mlx5_0") == 1
    assert value(metrics, "rdma_expected_port_present", device="mlx5_0", port="1") == 1
    assert value(metrics, "rdma_expected_device_present", device="mlx5_1") == 1
    assert value(metrics, "rdma_expected_port_present", device="mlx5_1", port="1") is None
    assert value(metrics, "rdma_exporter_device_excluded", device="mlx5_1") == 1
    assert value(metrics, "rdma_exporter_device_excluded", device="mlx5_0") is None
    assert value(metrics, "rdma_exporter_devices_excluded") == 1
    assert value(metrics, "rdma_exporter_scrape_collector_success", collector="expected") == 1

    (tree / "class" / "infiniband" / "mlx5_1").unlink()
    metrics = scrape(tree, config)
    assert value(metrics, "rdma_expected_device_present", device="mlx5_1") == 0
    assert value(metrics, "rdma_expected_port_present", device="mlx5_1", port="1") == 0
    assert value(metrics, "rdma_exporter_device_excluded", device="mlx5_1") is None
    assert value(metrics, "rdma_exporter_devices_excluded") == 0


def test_collector_can_be_disabled(tree: Path) -> None:
    expectations = "collector: {expected: {ports: [{devices: mlx5_0}]}}"
    assert "expected" in [s.name for s in build_sources(parse(expectations))]
    config = parse("collectors: {expected: false}\n" + expectations)
    assert "expected" not in [s.name for s in build_sources(config)]


def test_source_is_pure() -> None:
    """`expose` needs only the results dict: a device absent from it is missing."""
    source = ExpectedSource([ExpectedPort("mlx5_0", 1, pcie_width=16), ExpectedPort("mlx5_0", 2)])
    got = exposed(source, {"mlx5_0": (None, frozenset({1}), frozenset())})
    assert ("rdma_expected_port_present", ("mlx5_0", "1"), 1) in got
    assert ("rdma_expected_port_present", ("mlx5_0", "2"), 0) in got
    assert ("rdma_expected_pcie_link_width_lanes", ("mlx5_0",), 16) in got
    assert ("rdma_expected_device_present", ("mlx5_0",), 1) in got


def test_source_merges_pcie_speed_and_width_of_a_device() -> None:
    """Each field comes from the first port of the device that sets it, whichever port that is."""
    source = ExpectedSource(
        [
            ExpectedPort("mlx5_0", 1),
            ExpectedPort("mlx5_0", 2, pcie_transfers_per_second=32e9),
            ExpectedPort("mlx5_0", 3, pcie_width=16),
        ]
    )
    got = exposed(source, {"mlx5_0": (None, frozenset({1, 2, 3}), frozenset())})
    assert ("rdma_expected_pcie_link_speed_transfers_per_second", ("mlx5_0",), 32e9) in got
    assert ("rdma_expected_pcie_link_width_lanes", ("mlx5_0",), 16) in got


def test_listed_device_with_unknown_ports_is_present() -> None:
    """None: the device is listed but its static info is not known yet; its ports are left out, not 0."""
    source = ExpectedSource([ExpectedPort("mlx5_0", 1), ExpectedPort("mlx5_1", 1)])
    got = exposed(source, {"mlx5_0": None})
    assert ("rdma_expected_device_present", ("mlx5_0",), 1) in got
    assert not [row for row in got if row[0] == "rdma_expected_port_present" and row[1][0] == "mlx5_0"]
    assert ("rdma_expected_device_present", ("mlx5_1",), 0) in got
    assert ("rdma_expected_port_present", ("mlx5_1", "1"), 0) in got


# --- bounds, units and edge values of the settings ----------------------------------------------------


@pytest.mark.parametrize(
    ("gen", "transfers", "lanes"), [(1, 2.5e9, 1), (2, 5e9, 2), (3, 8e9, 4), (4, 16e9, 8), (5, 32e9, 16), (6, 64e9, 32)]
)
def test_every_pcie_generation_and_width_is_exported_as_configured(gen: int, transfers: float, lanes: int) -> None:
    # Compared with the PCIe collector's observed speed and width, so every generation and width must
    # come out exact, not only Gen5 x16.
    config = parse(f"collector: {{expected: {{ports: [{{devices: mlx5_0, pcie_gen: {gen}, pcie_width: {lanes}}}]}}}}")
    source = ExpectedSource.from_settings(config.collector_settings["expected"])
    got = exposed(source, {"mlx5_0": ("0000:18:00.0", frozenset({1}), frozenset())})
    assert ("rdma_expected_pcie_link_speed_transfers_per_second", ("mlx5_0",), transfers) in got
    assert ("rdma_expected_pcie_link_width_lanes", ("mlx5_0",), lanes) in got


def test_explicit_netdev_speed_beats_the_port_rate_on_ethernet() -> None:
    # A RoCE LAG port: the port trains at 400 but each bond slave's netdev reports 200.
    ports = parse(
        "collector: {expected: {ports: [{devices: mlx5_bond_0, link_layer: Ethernet, "
        "rate_gbps: 400, netdev_speed_gbps: 200}]}}"
    ).collector_settings["expected"]["ports"]
    assert ports[0].rate_bytes_per_second == 400e9 / 8
    assert ports[0].netdev_speed_bytes_per_second == 200e9 / 8


@pytest.mark.parametrize("layer", ["", "link_layer: InfiniBand, "])
def test_no_netdev_expectation_unless_the_port_is_ethernet(layer: str) -> None:
    # An unspecified link layer may be InfiniBand, whose IPoIB netdev speed is not the port rate.
    text = f"collector: {{expected: {{ports: [{{devices: mlx5_0, {layer}rate_gbps: 400}}]}}}}"
    port = parse(text).collector_settings["expected"]["ports"][0]
    assert port.rate_bytes_per_second == 400e9 / 8
    assert port.netdev_speed_bytes_per_second is None


def test_expansion_limit_is_inclusive() -> None:
    # Exactly the limit is accepted (a big fleet list); one past it is refused.
    assert len(expand_devices("f", "k", "d[1-4096]")) == 4096
    with pytest.raises(ConfigError, match="more than 4096"):
        expand_devices("f", "k", "d[0-4096]")


def test_the_whole_list_has_the_same_limit_as_one_range() -> None:
    """Each range stops at 4096 names, and so does the list: 250 entries of 4096 names were a million
    expected ports, whose 333 MB answer every scrape built after its deadline (fault review). Exactly the
    limit is accepted; the entry that goes past it is named."""
    at_limit = ", ".join(f"{{devices: 'd[1-1024]', port: {port}}}" for port in (1, 2, 3, 4))
    config = parse(f"collector: {{expected: {{ports: [{at_limit}]}}}}")
    assert len(config.collector_settings["expected"]["ports"]) == 4096
    past = at_limit + ", {devices: mlx5_0}"
    with pytest.raises(ConfigError, match=r"ports\[4\]: more than 4096 expected ports in all"):
        parse(f"collector: {{expected: {{ports: [{past}]}}}}")
    # One entry listing many ranges stops at the range that crosses the limit, before expanding the rest.
    ranges = ", ".join(f"'d{n}_[0-4095]'" for n in range(250))
    with pytest.raises(ConfigError, match=r"ports\[0\]\.devices\[1\]: more than 4096 expected ports in all"):
        parse(f"collector: {{expected: {{ports: [{{devices: [{ranges}]}}]}}}}")
    # The name one past the limit is the one named, in an entry that reached exactly the limit.
    one_entry = parse("collector: {expected: {ports: [{devices: ['d[1-4096]']}]}}")
    assert len(one_entry.collector_settings["expected"]["ports"]) == 4096
    with pytest.raises(ConfigError, match=r"ports\[0\]\.devices\[1\]: more than 4096 expected ports in all"):
        parse("collector: {expected: {ports: [{devices: ['d[1-4096]', mlx5_0]}]}}")


def test_every_pcie_link_the_collector_reports_can_be_expected() -> None:
    # Gen7 and x12 were refused here while the PCIe parser reported them (code review).
    port = parse("collector: {expected: {ports: [{devices: mlx5_0, pcie_gen: 7, pcie_width: 12}]}}")
    got = port.collector_settings["expected"]["ports"][0]
    assert (got.pcie_transfers_per_second, got.pcie_width) == (128e9, 12)


def test_port_4294967294_and_width_1_are_accepted() -> None:
    # The bounds of the valid ranges, so that an off-by-one refusing them fails. Ports above 255 exist:
    # an mlx5 switchdev representor device has one per vport (kernel 5.13 made port numbers u32).
    port = parse("collector: {expected: {ports: [{devices: mlx5_0, port: 4294967294, width: 1, pcie_gen: 1}]}}")
    got = port.collector_settings["expected"]["ports"][0]
    assert (got.port, got.width, got.pcie_transfers_per_second) == (4294967294, 1, 2.5e9)
    assert parse("collector: {expected: {ports: [{devices: mlx5_0, port: 256}]}}")
    just_below = parse("collector: {expected: {ports: [{devices: mlx5_0, rate_gbps: 999999999999.9}]}}")
    assert just_below.collector_settings["expected"]["ports"][0].rate_bytes_per_second == 999999999999.9e9 / 8


def test_empty_ports_list_expects_nothing() -> None:
    # `ports:` left empty in a template is no expectation at all, not an error, and builds no source.
    for body in ("ports:", "ports: []", ""):
        config = parse(f"collector:\n  expected:\n    {body}\n" if body else "collector:\n  expected:\n")
        assert not config.collector_settings.get("expected", {}).get("ports")
        assert "expected" not in [s.name for s in build_sources(config)]


@pytest.mark.parametrize("pattern", ["mlx5_0\n", "mlx5_[0-1]\n"])
def test_device_name_with_a_trailing_newline_is_refused(pattern: str) -> None:
    # A YAML block scalar (`devices: |`) ends in a newline; `$` in the name checks matches before it, so
    # the name "mlx5_0\n" was accepted, is never listed, and pages as a missing device forever.
    with pytest.raises(ConfigError):
        expand_devices("f", "k", pattern)


@pytest.mark.parametrize("key", ["rate_gbps", "netdev_speed_gbps"])
def test_infinite_speed_is_refused(key: str) -> None:
    # `.inf` is a YAML float > 0: an expected rate of +Inf makes every `observed < expected` rule fire.
    with pytest.raises(ConfigError) as err:
        parse(f"collector: {{expected: {{ports: [{{devices: mlx5_0, link_layer: Ethernet, {key}: .inf}}]}}}}")
    assert err.value.key == f"collector.expected.ports[0].{key}"


# --- expectations by PCI address -----------------------------------------------------------------------

# The sample tree's eight InfiniBand HCAs, mlx5_0..mlx5_7 in slot order.
IB_SLOTS = [
    "0000:18:00.0",
    "0000:40:00.0",
    "0000:4f:00.0",
    "0000:5e:00.0",
    "0000:9a:00.0",
    "0000:aa:00.0",
    "0000:c0:00.0",
    "0000:ce:00.0",
]
BY_ADDRESS = f"""
collector:
  expected:
    ports:
      - pci_addresses: [{", ".join(f'"{slot}"' for slot in IB_SLOTS)}]
        link_layer: InfiniBand
        rate_gbps: 400
        pcie_width: 16
"""


def renumber_without(tree: Path, tmp_path: Path, gone: int) -> Path:
    """The tree after a reboot without HCA mlx5_<gone>: the kernel names the ones after it one lower."""
    tree = Path(shutil.copytree(tree, tmp_path / "renumbered", symlinks=True))
    ib = tree / "class" / "infiniband"
    (ib / f"mlx5_{gone}").unlink()
    for n in range(gone + 1, 8):
        (ib / f"mlx5_{n}").rename(ib / f"mlx5_{n - 1}")
    return tree


def test_expectations_by_pci_address_follow_the_hca_under_its_current_name(tree: Path, tmp_path: Path) -> None:
    config = parse(BY_ADDRESS)
    metrics = scrape(tree, config)
    for n, address in enumerate(IB_SLOTS):
        assert value(metrics, "rdma_expected_pci_device_present", pci_address=address) == 1
        assert value(metrics, "rdma_expected_port_rate_bytes_per_second", device=f"mlx5_{n}", port="1") == 5e10
        assert value(metrics, "rdma_expected_port_present", device=f"mlx5_{n}", port="1") == 1
        assert value(metrics, "rdma_expected_device_present", device=f"mlx5_{n}") == 1
        assert value(metrics, "rdma_expected_pcie_link_width_lanes", device=f"mlx5_{n}") == 16

    # mlx5_3's HCA is gone: its slot is reported, and mlx5_4's HCA, now named mlx5_3, keeps its
    # expectations. By name, mlx5_7 would be reported missing instead.
    metrics = scrape(renumber_without(tree, tmp_path, 3), config)
    assert value(metrics, "rdma_expected_pci_device_present", pci_address=IB_SLOTS[3]) == 0
    for address in IB_SLOTS[:3] + IB_SLOTS[4:]:
        assert value(metrics, "rdma_expected_pci_device_present", pci_address=address) == 1
    for n in range(7):
        assert value(metrics, "rdma_expected_device_present", device=f"mlx5_{n}") == 1
        assert value(metrics, "rdma_expected_port_present", device=f"mlx5_{n}", port="1") == 1
    assert value(metrics, "rdma_expected_device_present", device="mlx5_7") is None
    assert value(metrics, "rdma_expected_port_rate_bytes_per_second", device="mlx5_7", port="1") is None
    by_name = scrape(renumber_without(tree, tmp_path / "by-name", 3), parse(DGX))
    assert value(by_name, "rdma_expected_device_present", device="mlx5_7") == 0


def test_excluding_a_device_keeps_expectations_by_address_judged(tree: Path, tmp_path: Path) -> None:
    """Excluding a misbehaving HCA (the ScrapeSlow runbook's advice) must not blind the missing-HCA check:
    the excluded device's address comes from its class link, so the other HCAs' addresses are still
    judged, and a really missing HCA is still reported. Its own address counts as present, its ports
    as unknown."""
    config = replace(parse(BY_ADDRESS), device_exclude=re.compile("mlx5_1"))
    metrics = scrape(tree, config)
    for address in IB_SLOTS:
        assert value(metrics, "rdma_expected_pci_device_present", pci_address=address) == 1
    assert value(metrics, "rdma_expected_device_present", device="mlx5_1") == 1
    assert value(metrics, "rdma_expected_port_present", device="mlx5_1", port="1") is None
    assert value(metrics, "rdma_expected_port_present", device="mlx5_0", port="1") == 1

    metrics = scrape(renumber_without(tree, tmp_path, 3), config)
    assert value(metrics, "rdma_expected_pci_device_present", pci_address=IB_SLOTS[3]) == 0
    # mlx5_1 is still the excluded name; it is the HCA in the second slot.
    assert value(metrics, "rdma_expected_pci_device_present", pci_address=IB_SLOTS[1]) == 1
    assert value(metrics, "rdma_exporter_device_excluded", device="mlx5_1") == 1


EXAMPLES = Path(__file__).resolve().parent.parent / "deploy" / "examples"


def commented_config(example: str) -> str:
    """The example's other form: the commented config block that starts at `# collector:`."""
    lines = example.splitlines()
    block = []
    for line in lines[lines.index("# collector:") :]:
        if not line.startswith("# ") or not line[2:].strip():
            break
        block.append(line[2:])
    return "\n".join(block)


def test_the_examples_topology_by_address_is_the_one_by_name(tree: Path) -> None:
    """The commented by-address form in deploy/examples is the same topology as the file's own by-name
    form on the tree it describes: every slot is found and every expectation is exported as by name."""
    example = (EXAMPLES / "expected-sample-node.yml").read_text()
    by_address = scrape(tree, parse(commented_config(example)))
    by_name = scrape(tree, parse(example))
    expected = {key: v for key, v in by_name.items() if key[0].startswith("rdma_expected_")}
    assert len(expected) > 50
    slots = {key: v for key, v in by_address.items() if key[0] == "rdma_expected_pci_device_present"}
    assert len(slots) == 10 and set(slots.values()) == {1}
    assert {key: v for key, v in by_address.items() if key[0].startswith("rdma_expected_") and key not in slots} == (
        expected
    )


def test_the_dgx_h100_example_declares_the_compute_rails_of_its_table_in_both_forms() -> None:
    """deploy/examples/expected-dgx-h100.yml: its table of the DGX H100's compute ports (the user guide's
    default names and netdevs), its addresses and its commented by-name form name the same eight HCAs.
    Each netdev name ibp<bus>s0 carries its HCA's PCI bus in decimal (an operator review found the file
    had been the sample tree's layout, which pages on a real DGX H100)."""
    example = (EXAMPLES / "expected-dgx-h100.yml").read_text()
    rows = [line[1:].split() for line in example.splitlines() if re.match(r"#\s+[0-9] port [12] ", line)]
    table = {row[6]: (row[5], row[4]) for row in rows}  # address -> (device, netdev)
    assert len(table) == 8 and {port: len([r for r in rows if r[0] == port]) for port in "1234"} == dict.fromkeys(
        "1234", 2
    )
    for address, (_, netdev) in table.items():
        assert netdev == f"ibp{int(address.split(':')[1], 16)}s0", (address, netdev)
    by_address = parse(example).collector_settings["expected"]["ports"]
    by_name = parse(commented_config(example)).collector_settings["expected"]["ports"]
    assert sorted(port.pci_address for port in by_address) == sorted(table)
    assert sorted(port.device for port in by_name) == sorted(device for device, _ in table.values())
    # Apart from how they name the HCAs, the two forms expect the same of each port.
    unnamed = {replace(port, device="", pci_address=None) for port in by_name}
    assert {replace(port, device="", pci_address=None) for port in by_address} == unnamed and len(unnamed) == 1


def test_pci_addresses_are_normalised_and_checked() -> None:
    config = parse("collector: {expected: {ports: [{pci_addresses: ['18:00.0', '0000:4F:00.0', '10000:01:00.1']}]}}")
    ports = config.collector_settings["expected"]["ports"]
    assert [p.pci_address for p in ports] == ["0000:18:00.0", "0000:4f:00.0", "10000:01:00.1"]
    assert {p.device for p in ports} == {""}


@pytest.mark.parametrize(
    ("body", "key", "reason"),
    [
        ("ports: [{port: 1}]", "collector.expected.ports[0].devices", "required: the device names or the pci_add"),
        (
            "ports: [{devices: mlx5_0, pci_addresses: '0000:18:00.0'}]",
            "collector.expected.ports[0].devices",
            "both devices and pci_addresses given",
        ),
        ("ports: [{pci_addresses: []}]", "collector.expected.ports[0].pci_addresses", "a PCI address"),
        ("ports: [{pci_addresses: mlx5_0}]", "collector.expected.ports[0].pci_addresses", "got 'mlx5_0'"),
        ("ports: [{pci_addresses: ['0000:18:00.8']}]", "collector.expected.ports[0].pci_addresses[0]", "like 0000"),
        ("ports: [{pci_addresses: [18]}]", "collector.expected.ports[0].pci_addresses[0]", "got 18"),
        (
            "ports: [{pci_addresses: ['00000:18:00.0']}]",
            "collector.expected.ports[0].pci_addresses[0]",
            "has no leading zero",
        ),
        # YAML 1.1 reads unquoted colon-separated digits as a base-60 number: 18:00.0 is 1080.0.
        ("ports: [{pci_addresses: [18:00.0]}]", "collector.expected.ports[0].pci_addresses[0]", "got 1080.0 (quote it"),
        ("ports: [{pci_addresses: 0000:18:00.0}]", "collector.expected.ports[0].pci_addresses", "(quote it"),
        # Without its function, 18:00 is a base-60 int, not a float: the hint is for it too.
        ("ports: [{pci_addresses: [18:00]}]", "collector.expected.ports[0].pci_addresses[0]", "got 1080 (quote it"),
        (
            "ports: [{pci_addresses: ['18:00.0', '0000:18:00.0']}]",
            "collector.expected.ports[0].pci_addresses[1]",
            "0000:18:00.0 is listed twice",
        ),
        (
            "ports: [{pci_addresses: '0000:18:00.0'}, {pci_addresses: '18:00.0', rate_gbps: 200}]",
            "collector.expected.ports[1].pci_addresses",
            "0000:18:00.0 port 1 is already expected by collector.expected.ports[0]",
        ),
        (
            "ports: [{pci_addresses: '18:00.0', pcie_gen: 5}, {pci_addresses: '18:00.0', port: 2, pcie_gen: 4}]",
            "collector.expected.ports[1].pcie_gen",
            "PCIe link speed for 0000:18:00.0",
        ),
    ],
)
def test_invalid_pci_expectations_name_the_key(body: str, key: str, reason: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"collector": {"expected": yaml.safe_load(body)}}, "rdma.yml")
    assert (err.value.key, reason in err.value.reason) == (key, True), err.value.reason


def test_an_address_no_known_device_holds_is_not_missing_while_a_device_is_unknown() -> None:
    """A listed device whose static info is not known yet may be the one at the address."""
    source = ExpectedSource([ExpectedPort("", 1, pci_address="0000:18:00.0")])

    def present(results: dict) -> set[tuple[tuple[str, ...], float]]:
        family = "rdma_expected_pci_device_present"
        return {(labels, v) for name, labels, v in exposed(source, results) if name == family}

    assert present({"mlx5_0": ("0000:40:00.0", frozenset({1}), frozenset())}) == {(("0000:18:00.0",), 0)}
    assert present({"mlx5_0": ("0000:40:00.0", frozenset({1}), frozenset()), "mlx5_1": None}) == set()
    at_18 = ("0000:18:00.0", frozenset({1}), frozenset())
    assert present({"mlx5_0": at_18, "mlx5_1": None}) == {(("0000:18:00.0",), 1)}


def test_an_address_two_devices_share_goes_to_a_read_device_then_the_first_by_name() -> None:
    """A multi-plane HCA's SMI sub device has its parent's PCI function. The expectation by address went to
    whichever device was listed last; now to a device that is read (an excluded one's ports are not), and
    of those to the first by name, whatever order the devices come in."""
    source = ExpectedSource([ExpectedPort("", 1, rate_bytes_per_second=5e10, pci_address="0000:18:00.0")])

    def expected_rates(results: dict) -> set[tuple[tuple[str, ...], float]]:
        family = "rdma_expected_port_rate_bytes_per_second"
        return {(labels, v) for name, labels, v in exposed(source, results) if name == family}

    on_parent = {(("mlx5_0", "1"), 5e10)}
    read = ("0000:18:00.0", frozenset({1}), frozenset())
    planes = ("0000:18:00.0", frozenset({1, 2}), frozenset())
    assert expected_rates({"mlx5_0": read, "smi0": planes}) == on_parent
    assert expected_rates({"smi0": planes, "mlx5_0": read}) == on_parent
    # Excluded (devices.exclude), the sub device gives way whatever its name.
    assert expected_rates({"a_smi": source.read_excluded("0000:18:00.0"), "mlx5_0": read}) == on_parent
    assert expected_rates({"mlx5_0": read, "a_smi": source.read_excluded("0000:18:00.0")}) == on_parent


def test_a_function_two_lag_devices_stand_for_goes_to_the_first_by_name() -> None:
    """A function with no RDMA device of its own that two devices stand for (each lists it as folded in):
    the expectation goes to the first by name, whatever order the devices are listed in."""
    source = ExpectedSource([ExpectedPort("", 1, rate_bytes_per_second=2.5e10, pci_address="0000:3b:00.2")])
    results = {
        "rocep59s0f1": ("0000:3b:00.1", frozenset({1}), frozenset({"0000:3b:00.2"})),
        "rocep59s0f0": ("0000:3b:00.0", frozenset({1}), frozenset({"0000:3b:00.2"})),
    }
    family = "rdma_expected_port_rate_bytes_per_second"
    rates = {(labels, v) for name, labels, v in exposed(source, results) if name == family}
    assert rates == {(("rocep59s0f0", "1"), 2.5e10)}


def test_a_function_with_its_own_rdma_device_is_not_taken_by_a_renamed_lag_device() -> None:
    """rdma-core renames mlx5_bond_0 to rocep59s0f0, which cannot be told from a plain device by name, so
    its bond slave's function 0000:3b:00.1 counts as its own. When that function still has its own RDMA
    device, the expectation by that address is that device's, not the bond's."""
    source = ExpectedSource([ExpectedPort("", 1, rate_bytes_per_second=2.5e10, pci_address="0000:3b:00.1")])
    results = {
        "rocep59s0f0": ("0000:3b:00.0", frozenset({1}), frozenset({"0000:3b:00.1"})),
        "rocep59s0f1": ("0000:3b:00.1", frozenset({1}), frozenset()),
    }
    family = "rdma_expected_port_rate_bytes_per_second"
    rates = {(labels, v) for name, labels, v in exposed(source, results) if name == family}
    assert rates == {(("rocep59s0f1", "1"), 2.5e10)}
    # Without a device of its own, the function is the LAG device's.
    del results["rocep59s0f1"]
    rates = {(labels, v) for name, labels, v in exposed(source, results) if name == family}
    assert rates == {(("rocep59s0f0", "1"), 2.5e10)}


def test_a_port_expected_by_name_and_by_address_is_exported_once() -> None:
    source = ExpectedSource(
        [
            ExpectedPort("mlx5_0", 1, rate_bytes_per_second=5e10),
            ExpectedPort("", 1, rate_bytes_per_second=2.5e10, pci_address="0000:18:00.0"),
        ]
    )
    out = FamilySet()
    source.expose({"mlx5_0": ("0000:18:00.0", frozenset({1}), frozenset())}, out)
    family = "rdma_expected_port_rate_bytes_per_second"
    rates = [(s.labels, s.value) for m in out for s in m.samples if m.name == family]
    assert rates == [({"device": "mlx5_0", "port": "1"}, 5e10)]


# --- YAML merge keys, empty settings and name-or-address overlaps -------------------------------------

ANCHORED = """
collector:
  expected:
    ports:
      - &ib {devices: "mlx5_[0-7]", link_layer: InfiniBand, rate_gbps: 400, width: 4}
      - <<: *ib
        devices: [mlx5_8, mlx5_9]
        link_layer: Ethernet
        rate_gbps: 200
"""


def test_entries_may_share_settings_through_a_yaml_merge_key(tree: Path, tmp_path: Path) -> None:
    """`<<: *ib` then `devices:` is YAML's way to reuse an entry with changes: the keys given next to the
    merge override the merged ones. The duplicate-key check counted the merged `devices` as a second one
    and refused the file."""
    path = tmp_path / "anchored.yml"
    path.write_text(ANCHORED)
    run = check_config(path)
    assert run.returncode == 0, run.stderr
    metrics = scrape(tree, load_config_file(path))
    assert value(metrics, "rdma_expected_port_info", device="mlx5_0", port="1", link_layer="InfiniBand") == 1
    assert value(metrics, "rdma_expected_port_info", device="mlx5_9", port="1", link_layer="Ethernet") == 1
    assert value(metrics, "rdma_expected_port_rate_bytes_per_second", device="mlx5_9", port="1") == 2.5e10
    assert value(metrics, "rdma_expected_port_link_width_lanes", device="mlx5_9", port="1") == 4  # merged
    # A key the entry itself gives twice is still refused, merge or not.
    path.write_text(ANCHORED + "        rate_gbps: 100\n")
    run = check_config(path)
    assert run.returncode == 2
    assert f"{path}: line 10, column 9: invalid YAML: duplicate key 'rate_gbps'" in run.stderr


def test_pci_addresses_with_surrounding_white_space_are_normalised() -> None:
    # A quoted address with a stray space, or one from a block scalar (`|`, which ends in a newline), is
    # the same slot: refused, the operator would chase an address that looks right.
    text = """
collector:
  expected:
    ports:
      - pci_addresses: [' 18:00.0 ']
      - pci_addresses: |
          0000:40:00.0
"""
    ports = parse(text).collector_settings["expected"]["ports"]
    assert [p.pci_address for p in ports] == ["0000:18:00.0", "0000:40:00.0"]


def test_a_missing_address_exports_nothing_under_an_empty_device_name(tree: Path, tmp_path: Path) -> None:
    # The slot's own series says it is missing; its expectations have no name to be exported under, and
    # a `device=""` series would be a device that never exists, present 0 forever.
    metrics = scrape(renumber_without(tree, tmp_path, 3), parse(BY_ADDRESS))
    devices = {dict(labels).get("device") for name, labels in metrics if name.startswith("rdma_expected_")}
    assert devices == {f"mlx5_{n}" for n in range(7)} | {None}  # None: rdma_expected_pci_device_present


def test_pcie_expectations_by_name_and_by_address_on_one_device_first_in_the_file_wins() -> None:
    # Validation compares entries for one name or one address, not a name with an address: as for a port
    # expected both ways, the first entry in the file gives the device's PCIe expectation.
    source = ExpectedSource(
        [
            ExpectedPort("mlx5_0", 1, pcie_transfers_per_second=32e9, pcie_width=16),
            ExpectedPort("", 2, pcie_transfers_per_second=16e9, pcie_width=8, pci_address="0000:18:00.0"),
        ]
    )
    listed = {"mlx5_0": ("0000:18:00.0", frozenset({1, 2}), frozenset())}
    got = {row for row in exposed(source, listed) if "pcie" in row[0]}
    assert got == {
        ("rdma_expected_pcie_link_speed_transfers_per_second", ("mlx5_0",), 32e9),
        ("rdma_expected_pcie_link_width_lanes", ("mlx5_0",), 16),
    }


def test_a_setting_left_empty_is_not_specified() -> None:
    # As `ports:` left empty in a template: `rate_gbps:` with no value is no expectation, not an error.
    text = """
collector:
  expected:
    ports:
      - devices: mlx5_0
        link_layer:
        rate_gbps:
        width: ~
        pcie_gen:
        pcie_width:
        netdev_speed_gbps:
"""
    (port,) = parse(text).collector_settings["expected"]["ports"]
    assert port == ExpectedPort("mlx5_0", 1)


def test_different_pcie_expectations_for_different_addresses_do_not_conflict() -> None:
    # A Gen5 HCA and a Gen4 one, each by its slot: only two entries for one slot must agree.
    text = """
collector:
  expected:
    ports:
      - {pci_addresses: '18:00.0', pcie_gen: 5, pcie_width: 16}
      - {pci_addresses: '40:00.0', pcie_gen: 4, pcie_width: 8}
"""
    ports = parse(text).collector_settings["expected"]["ports"]
    assert [(p.pci_address, p.pcie_transfers_per_second, p.pcie_width) for p in ports] == [
        ("0000:18:00.0", 32e9, 16),
        ("0000:40:00.0", 16e9, 8),
    ]


# --- observed against expected, end to end ------------------------------------------------------------

LINKS = """
collector:
  expected:
    ports:
      - {devices: "mlx5_[0-7]", link_layer: InfiniBand, rate_gbps: 400, width: 4, pcie_gen: 5, pcie_width: 16}
      - {devices: "mlx5_[8-9]", link_layer: Ethernet, rate_gbps: 200, width: 2, pcie_gen: 4, pcie_width: 16}
"""


def below(metrics: dict, observed: str, expected: str) -> set[tuple[tuple[str, str], ...]]:
    """The series whose observation is below their expectation, as an `observed < expected` rule sees them."""
    wanted = {labels: v for (name, labels), v in metrics.items() if name == expected}
    got = {labels: v for (name, labels), v in metrics.items() if name == observed}
    # Every expectation has its observation to compare with: an empty answer is not an empty comparison.
    assert wanted and wanted.keys() == got.keys(), (observed, sorted(got), sorted(wanted))
    return {labels for labels, v in got.items() if v < wanted[labels]}


def test_links_trained_below_their_expectation_are_the_ones_seen_below(tmp_path: Path) -> None:
    """The BlueField-3s sit in Gen4 slots (expected Gen4), mlx5_5's link fell to Gen4 (expected Gen5) and
    mlx5_3's port is down at 4X QDR: a plain `<` finds exactly the degraded two, no healthy one."""
    spec = TreeSpec(degraded_pcie=("mlx5_5",), gen4_slots=("mlx5_8", "mlx5_9"), down_ports=("mlx5_3",))
    metrics = scrape(build_tree(tmp_path, spec), parse(LINKS))
    pcie = "rdma_pcie_link_speed_transfers_per_second", "rdma_expected_pcie_link_speed_transfers_per_second"
    assert below(metrics, *pcie) == {(("device", "mlx5_5"),)}
    assert value(metrics, pcie[1], device="mlx5_8") == value(metrics, pcie[0], device="mlx5_8") == 16e9
    width = "rdma_pcie_link_width_lanes", "rdma_expected_pcie_link_width_lanes"
    assert below(metrics, *width) == set()
    rate = "rdma_port_rate_bytes_per_second", "rdma_expected_port_rate_bytes_per_second"
    assert below(metrics, *rate) == {(("device", "mlx5_3"), ("port", "1"))}


def test_every_port_of_a_dual_port_hca_is_judged(tree: Path, tmp_path: Path) -> None:
    # A dual-port ConnectX: both ports are present, a third one the configuration expects is missing.
    tree = Path(shutil.copytree(tree, tmp_path / "dual", symlinks=True))
    ports = (tree / "class" / "infiniband" / "mlx5_0" / "ports").resolve()
    shutil.copytree(ports / "1", ports / "2", symlinks=True)
    entries = ", ".join(f"{{devices: mlx5_0, port: {port}}}" for port in (1, 2, 3))
    metrics = scrape(tree, parse(f"collector: {{expected: {{ports: [{entries}]}}}}"))
    present = {port: value(metrics, "rdma_expected_port_present", device="mlx5_0", port=port) for port in "123"}
    assert present == {"1": 1, "2": 1, "3": 0}
