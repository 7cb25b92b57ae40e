"""FamilySet.render_text against prometheus_client's generate_latest, byte for byte.

The daemon serves render_text; the golden files and the registry users go through generate_latest.
Both must stay the same text, for every fixture tree and for any help, label value and sample value.
"""

from __future__ import annotations

import importlib.util
import math
import os
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.utils import floatToGoString

from rdma_exporter.collect import base
from rdma_exporter.collect.base import FamilySet, MetricSpec, SeriesPrefixes, _layout, format_value, label, lint_safe
from rdma_exporter.collect.infiniband import WRAPS_ON_MLX5, HwCounterSpecs
from rdma_exporter.config import Config
from rdma_exporter.daemon import build_collector
from rdma_exporter.sample_tree import HEALTHY_SPEC, SAMPLE_SPEC, build_tree, spec_for_devices

from conftest import CAPTURED_TREES, SYSFS_FIXTURES, prometheus_text

ROOT = Path(__file__).resolve().parent.parent
# The trees of test_golden.py.
GENERATED_TREES = {"sample-8hca": SAMPLE_SPEC, "healthy-8hca": HEALTHY_SPEC}


def _tree_root(name: str, tmp_path: Path) -> tuple[Path, Path | None]:
    if name in GENERATED_TREES:
        return build_tree(tmp_path / name, GENERATED_TREES[name]), tmp_path / name / "ethtool"
    return SYSFS_FIXTURES / name / "sys", None


@pytest.mark.parametrize("tree", CAPTURED_TREES + sorted(GENERATED_TREES))
def test_render_text_matches_generate_latest(tree: str, tmp_path: Path) -> None:
    root, ethtool_dir = _tree_root(tree, tmp_path)
    collector = build_collector(replace(Config(), sysfs=root, ethtool_dir=ethtool_dir))
    for _ in range(2):  # the second scrape reuses the series prefixes of the first
        families = collector.gather()
        text = families.render_text()
        assert text == prometheus_text(families)
        # The cache holds one text per distinct label set and label-name layout, shared across families.
        label_sets = {
            (_layout(spec)[1], labels) for spec, label_rows, _ in families._rows.values() for labels in label_rows
        }
        series = text.count(b"\n") - 2 * len(families)
        assert len(collector.prefixes) == len(label_sets) <= series


def _traffic_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("traffic", ROOT / "bench" / "traffic.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_families_whose_samples_moved_are_written_again_and_the_rest_reused(tmp_path: Path) -> None:
    # The texts kept from one render to the next against prometheus_client's fresh text of the same
    # families, while the sample tree's counters move as on a busy node (bench --traffic).
    root = build_tree(tmp_path, SAMPLE_SPEC)
    traffic = _traffic_module().Traffic(root, tmp_path / "ethtool", {"counters", "hw_counters", "statistics"})
    collector = build_collector(replace(Config(), sysfs=root, ethtool_dir=tmp_path / "ethtool"))
    last: dict[bytes, bytes] = {}
    for _ in range(4):
        families = collector.gather()
        chunks = families.render_chunks()
        assert b"".join(chunks) == prometheus_text(families)
        by_family = {chunk.split(b" ", 3)[2]: chunk for chunk in chunks}  # "# HELP <name> ..."
        if last:
            reused = [key for key, chunk in by_family.items() if last.get(key) is chunk]
            # Most families hold what they held (states, speeds, error counters at 0); the data counters
            # do not, and their families are written again with the new values.
            assert len(by_family) / 2 < len(reused) < len(by_family)
            moved = b"rdma_port_transmit_data_bytes_total"
            assert by_family[moved] is not last[moved]
        last = by_family
        traffic.advance()


def test_a_family_set_rendered_again_after_more_rows_or_in_a_new_scrape_is_written_as_it_now_is() -> None:
    # The kept rows are copies: the FamilySet's own lists grow after its first render.
    spec = MetricSpec("x_things", "gauge", "Things.", ("device",))
    prefixes = SeriesPrefixes()
    families = FamilySet(prefixes)
    families.add(spec, ["mlx5_0"], 1)
    assert b"".join(families.render_chunks()) == prometheus_text(families)
    families.add(spec, ["mlx5_1"], 2)
    assert b"".join(families.render_chunks()) == prometheus_text(families)
    again = FamilySet(prefixes)
    again.add(spec, ["mlx5_0"], 1)
    assert b"".join(again.render_chunks()) == prometheus_text(again)


def test_a_new_help_text_under_the_same_name_and_samples_is_written_with_its_own_header() -> None:
    prefixes = SeriesPrefixes()
    for help_text in ("Things.", "Things, counted again."):
        families = FamilySet(prefixes)
        families.add(MetricSpec("x_things", "gauge", help_text, ("device",)), ["mlx5_0"], 1)
        assert families.render_chunks()[0].startswith(f"# HELP x_things {help_text}\n".encode())


def test_series_prefixes_forget_label_sets_no_longer_written() -> None:
    spec = MetricSpec("x_things", "gauge", "Things.", ("device",))
    prefixes = SeriesPrefixes()

    def render(*devices: str) -> bytes:
        families = FamilySet(prefixes)
        for device in devices:
            families.add(spec, [device], 1)
        return families.render_text()

    render("mlx5_0", "mlx5_1")
    assert len(prefixes) == 2
    for _ in range(SeriesPrefixes.PRUNE_EVERY):  # mlx5_1 removed: gone from the cache within PRUNE_EVERY
        assert render("mlx5_0") == b'# HELP x_things Things.\n# TYPE x_things gauge\nx_things{device="mlx5_0"} 1.0\n'
    assert len(prefixes) == 1


SPEC_LABELS = ("device", "port", "a_label")
texts = st.text(st.characters(codec="utf-8"), max_size=12) | st.sampled_from(["", "\\", "\n", '"', '\\n"\\\\'])
values = (
    st.floats(allow_nan=True, allow_infinity=True)
    | st.integers(min_value=-(2**70), max_value=2**70)
    # Either side of where Go switches to an exponent (six digits before the point, then seven): random
    # floats seldom land there, and an off-by-one on that switch passed (mutation review).
    | st.sampled_from([math.nan, math.inf, -math.inf, 1e21, 0.1, 2**53 + 1, 2**63 - 1, 999_999, 1_000_000, -0.0,
                       123_456.5, 999_999.5, 1_000_000.5])
)


@given(
    help_text=texts,
    kind=st.sampled_from(["counter", "gauge", "info"]),
    rows=st.lists(st.tuples(st.tuples(texts, texts, texts), values), max_size=6),
    cached=st.booleans(),
)
def test_escaping_and_values_match_prometheus_client(
    help_text: str, kind: str, rows: list[tuple[tuple[str, str, str], float]], cached: bool
) -> None:
    name = {"counter": "test_things_total", "gauge": "test_things", "info": "test_things_info"}[kind]
    spec = MetricSpec(name, kind, help_text, SPEC_LABELS)  # type: ignore[arg-type]
    unlabelled = MetricSpec("test_plain", "gauge", help_text, ())
    prefixes = SeriesPrefixes() if cached else None
    for _ in range(2):
        families = FamilySet(prefixes)
        for labels, value in rows:
            families.add(spec, labels, value)
            families.add(unlabelled, [], value)
        assert families.render_text() == prometheus_text(families)


@given(values)
@example(123_456.5)  # the boundary examples always run, not only when drawn
@example(1_000_000.5)
def test_format_value_is_float_to_go_string(value: float) -> None:
    assert format_value(value) == floatToGoString(value)


@given(st.integers(min_value=-(2**64), max_value=2**64))
@example(1_000_000)
@example(2**53)
@example(2**53 + 1)  # rounds to 2**53 as a float: written from the float, not from its own digits
def test_format_value_of_integers_is_float_to_go_string(value: int) -> None:
    # Integers from 1e6 up to 2**53 are written from their own digits, not through a float (Update 22).
    assert format_value(value) == floatToGoString(value)


def test_declaring_a_family_that_has_samples_keeps_them() -> None:
    # declare() is for a family written even with no sample; called after add() it must not empty it.
    spec = MetricSpec("x_errors_total", "counter", "Errors.", ("device",))
    families = FamilySet()
    families.add(spec, ["mlx5_0"], 3)
    families.declare(spec)
    assert b'x_errors_total{device="mlx5_0"} 3.0\n' in families.render_text()


def test_counter_and_info_naming() -> None:
    families = FamilySet()
    families.add(MetricSpec("x_errors_total", "counter", "Errors.", ("device",)), ["mlx5_0"], 3)
    families.add(MetricSpec("x_build_info", "info", "Build.", ("version",)), ["1"], 1)
    assert families.render_text() == (
        b"# HELP x_errors_total Errors.\n# TYPE x_errors_total counter\n"
        b'x_errors_total{device="mlx5_0"} 3.0\n'
        b"# HELP x_build_info Build.\n# TYPE x_build_info gauge\n"
        b'x_build_info{version="1"} 1.0\n'
    )


def test_spec_names_follow_their_kind() -> None:
    # The text format's counter naming: the exposed name of a counter ends in _total (prometheus_client's
    # writer strips and re-appends it, so a counter without it would be served under another name than
    # METRICS.md documents); info metrics end in _info, as OpenMetrics names them.
    with pytest.raises(ValueError, match="x_errors must end in _total"):
        MetricSpec("x_errors", "counter", "Errors.", ())
    with pytest.raises(ValueError, match="x_build must end in _info"):
        MetricSpec("x_build", "info", "Build.", ())
    for name in ("x_errors", "x_errors_total", "x_build_info"):  # a gauge may be named anything
        assert MetricSpec(name, "gauge", "Gauge.", ()).name == name


# Values at each edge of the integer fast paths (format_value's and render_chunks' own), written out as
# Go (and prometheus_client's floatToGoString) writes them: exponent from 1e6 up, a negative integer in
# full until Python's repr switches at 1e16, an integer past 2**53 as its nearest float, a bool as a number.
EDGE_VALUES = [
    (0, "0.0"),
    (999_999, "999999.0"),
    (1_000_000, "1e+06"),
    (123_456_789, "1.23456789e+08"),
    (5 * 10**10, "5e+10"),  # prometheus-client before 0.26 wrote 5e+010
    (12_345_678_901, "1.2345678901e+10"),
    (10**15, "1e+15"),
    (2**53 - 1, "9.007199254740991e+15"),
    (2**53, "9.007199254740992e+15"),  # the last integer format_value writes from its own digits
    (1_000_000.5, "1.0000005e+06"),
    (-1, "-1.0"),
    (-1_000_000, "-1000000.0"),
    (-999_999_999_999_999, "-999999999999999.0"),
    (-(10**16) + 1, "-1e+16"),
    (-(10**16), "-1e+16"),
    (2**53 + 1, "9.007199254740992e+15"),
    (2**63 - 1, "9.223372036854776e+18"),
    (True, "1.0"),
    (False, "0.0"),
    (0.5, "0.5"),
    (-0.0, "-0.0"),
    (1e-07, "1e-07"),
    (1e21, "1e+21"),
    (math.nan, "NaN"),
    (math.inf, "+Inf"),
    (-math.inf, "-Inf"),
]


@pytest.mark.parametrize(("value", "text"), EDGE_VALUES, ids=[repr(value) for value, _ in EDGE_VALUES])
def test_sample_values_at_the_edges(value: float, text: str) -> None:
    assert format_value(value) == text
    families = FamilySet()
    families.add(MetricSpec("x_things", "gauge", "Things.", ()), [], value)
    assert families.render_text().decode().splitlines()[-1] == f"x_things {text}"


def test_label_values_escape_backslash_quote_and_newline_only() -> None:
    # The text format escapes exactly these three in a label value (and HELP escapes backslash and newline
    # only, not quotes); names that are not UTF-8 bytes come from os.listdir with surrogate escapes, and are
    # served as \xNN, as `ip link` shows them (the backslash is then escaped as any other).
    spec = MetricSpec("x_things", "gauge", 'A "quoted"\\help\nline.', ("device", "netdev"))
    families = FamilySet()
    families.add(spec, ["back\\slash", 'say "hi"'], 1)  # each alone: a mutant that misses one is seen
    families.add(spec, ["two\nlines", "enp1\udcff"], 2)
    families.add(spec, ["\ud800", "ünï"], 3)  # a lone surrogate no file name decodes to stays visible
    assert families.render_text().decode("utf-8") == (
        '# HELP x_things A "quoted"\\\\help\\nline.\n'
        "# TYPE x_things gauge\n"
        'x_things{device="back\\\\slash",netdev="say \\"hi\\""} 1.0\n'
        'x_things{device="two\\nlines",netdev="enp1\\\\xff"} 2.0\n'
        'x_things{device="\\\\ud800",netdev="ünï"} 3.0\n'
    )
    # The families as a prometheus_client Collector (RdmaCollector.collect) give the same text, where
    # such a name raised UnicodeEncodeError (fuzz review).
    assert prometheus_text(families) == families.render_text()


def test_a_help_naming_a_file_that_is_not_utf8_costs_no_scrape(tmp_path: Path) -> None:
    # A driver's hw_counters file named with bytes that are not UTF-8 comes from os.listdir with surrogate
    # escapes, and the generic help of its family names the file: served as \xNN, as such a label value
    # is (and the same through prometheus_client's writer), instead of every series of the scrape lost to
    # an encoding error.
    root = build_tree(tmp_path / "t", spec_for_devices(1))
    hw_counters = (root / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "hw_counters").resolve()
    (hw_counters / os.fsdecode(b"odd\xffname")).write_text("5\n")
    families = build_collector(replace(Config(), sysfs=root)).gather()
    text = families.render_text()
    assert text == prometheus_text(families)
    lines = text.decode("utf-8").splitlines()
    assert "# HELP rdma_port_hw_odd_name_total Driver counter hw_counters/odd\\\\xffname." in lines
    assert 'rdma_port_hw_odd_name_total{device="mlx5_0",port="1"} 5.0' in lines
    assert "rdma_exporter_devices 1.0" in lines  # the rest of the scrape


def test_an_mlx5_vport_counter_is_described_and_flagged_32_bit_as_its_plain_twin() -> None:
    # In switchdev mode mlx5 prefixes a port's Q counters with vport_: the same 32-bit counters, so the
    # HELP says that they wrap and what they count, as for the plain names.
    specs = HwCounterSpecs("rdma_port_hw_", ("device", "port"), "hw_counters")
    plain, vport = specs.get("out_of_buffer"), specs.get("vport_out_of_buffer")
    assert vport.name == "rdma_port_hw_vport_out_of_buffer_total"
    assert vport.help == plain.help.replace(WRAPS_ON_MLX5, "") + (
        " Counted for the function's eswitch vport (mlx5 in switchdev mode)." + WRAPS_ON_MLX5
    )
    assert plain.help.endswith(WRAPS_ON_MLX5)
    # A vport_ name that has no plain twin keeps the generic help, without the 32-bit note.
    assert specs.get("vport_something_new").help == "Driver counter hw_counters/vport_something_new."


def test_label_of_an_unknown_attribute_is_empty() -> None:
    assert (label(None), label(""), label(0), label(1), label("mlx5_0")) == ("", "", "0", "1", "mlx5_0")


def test_series_prefixes_follow_changed_label_values() -> None:
    # A port whose netdev was renamed keeps its device label: the cached text of its label set must not be
    # served for the new one, on a render that prunes or one that only looks texts up.
    spec = MetricSpec("x_port_info", "gauge", "Port.", ("device", "netdev", "port"))
    prefixes = SeriesPrefixes()
    for render in range(1, 2 * SeriesPrefixes.PRUNE_EVERY + 2):
        netdev = f"eth{render}"
        families = FamilySet(prefixes)
        families.add(spec, ["mlx5_0", netdev, "1"], 1)
        line = families.render_text().decode().splitlines()[-1]
        assert line == f'x_port_info{{device="mlx5_0",netdev="{netdev}",port="1"}} 1.0'


def test_series_prefixes_are_per_label_names() -> None:
    # Families with the same label values under other label names share no text.
    prefixes = SeriesPrefixes()
    device = MetricSpec("x_devices", "gauge", "Devices.", ("device",))
    netdev = MetricSpec("x_netdevs", "gauge", "Netdevs.", ("netdev",))
    for _ in range(3):
        families = FamilySet(prefixes)
        families.add(device, ["mlx5_0"], 1)
        families.add(netdev, ["mlx5_0"], 1)
        lines = families.render_text().decode().splitlines()[2::3]
        assert lines == ['x_devices{device="mlx5_0"} 1.0', 'x_netdevs{netdev="mlx5_0"} 1.0']


# lint_safe's documented rewrites (its docstring): a plural non-base unit loses its "s" ("bits" -> "bit", as
# the curated ethtool renames read), an abbreviation is spelled out, a type's name gets an "x"; a base unit,
# or a token that only starts like a prefixed unit, stays.
LINT_SAFE_CASES = [
    ("rx_bits_phy", "counter", "rx_bit_phy"),
    ("latency_milliseconds", "gauge", "latency_millisecond"),
    ("tx_kilobytes", "counter", "tx_kilobyte"),
    ("rx_kilobits", "counter", "rx_kilobit"),
    ("rx_q7_hours", "counter", "rx_q7_hour"),
    ("rx_timeout_ms", "counter", "rx_timeout_msec"),
    ("tx_s_b_kb", "counter", "tx_secs_byte_kbyte"),
    ("rx_gauge_counter", "counter", "rx_gaugex_counterx"),
    ("q_histogram_summary", "gauge", "q_histogramx_summaryx"),
    ("rx_bytes_seconds_kelvin", "gauge", "rx_bytes_seconds_kelvin"),
    ("rx_kilo_total", "counter", "rx_kilo_total"),
    ("rx_pause_m_h_d", "counter", "rx_pause_mx_hx_dx"),  # promtool's abbreviations of minutes, hours, days
    # A gauge must not end as only counters, histograms and summaries may; a counter gets _total after it.
    ("active_qp_count", "gauge", "active_qp_countx"),
    ("watermark_total", "gauge", "watermark_totalx"),
    ("rx_sum_bucket", "gauge", "rx_sum_bucketx"),
    ("rx_count", "counter", "rx_count"),
]


@pytest.mark.parametrize(("key", "kind", "safe"), LINT_SAFE_CASES, ids=[case[0] for case in LINT_SAFE_CASES])
def test_lint_safe_rewrites(key: str, kind: str, safe: str) -> None:
    assert lint_safe(key, kind) == safe


def test_unchanged_families_reuse_their_text_and_changed_ones_are_written_again() -> None:
    spec = MetricSpec("x_things", "gauge", "Things.", ("device",))
    other = MetricSpec("x_others_total", "counter", "Others.", ("device",))
    prefixes = SeriesPrefixes()

    def render(rows: dict[str, float], others: float) -> tuple[bytes, ...]:
        families = FamilySet(prefixes)
        for device, value in rows.items():
            families.add(spec, [device], value)
        families.add(other, ["mlx5_0"], others)
        return families.render_chunks()

    first = render({"mlx5_0": 1, "mlx5_1": 2}, 5)
    again = render({"mlx5_0": 1, "mlx5_1": 2}, 6)
    assert again[0] is first[0]  # unchanged: the same bytes, not written again
    assert again[1].endswith(b'x_others_total{device="mlx5_0"} 6.0\n')
    assert render({"mlx5_0": 1, "mlx5_1": 3}, 6)[0].endswith(b'x_things{device="mlx5_1"} 3.0\n')
    assert render({"mlx5_0": 1}, 6)[0].endswith(b'x_things{device="mlx5_0"} 1.0\n')  # a device gone
    assert render({"mlx5_1": 1}, 6)[0].endswith(b'x_things{device="mlx5_1"} 1.0\n')  # same values, other labels
    # Rows added after a render are not covered by the text written before them.
    families = FamilySet(prefixes)
    families.add(spec, ["mlx5_1"], 1)
    families.add(other, ["mlx5_0"], 6)
    families.render_chunks()
    families.add(spec, ["mlx5_2"], 1)
    assert families.render_chunks()[0].endswith(b'x_things{device="mlx5_1"} 1.0\nx_things{device="mlx5_2"} 1.0\n')
    # Another spec of the same name (a new help text) is written with its own header.
    renamed = MetricSpec("x_things", "gauge", "Other things.", ("device",))
    families = FamilySet(prefixes)
    families.add(renamed, ["mlx5_2"], 1)
    assert families.render_chunks()[0].startswith(b"# HELP x_things Other things.\n")


# _printable's ASCII fast path must hand the value back unchanged. The property test
# test_escaping_and_values_match_prometheus_client cannot see a change to it: its reference,
# prometheus_text(families), goes through FamilySet.__iter__, which runs the same _printable over labels
# and help. Here the reference is prometheus_client's, built from the raw values.

ascii_texts = st.text(st.characters(min_codepoint=0, max_codepoint=127), max_size=12)


@given(help_text=ascii_texts, values=st.lists(st.tuples(ascii_texts, ascii_texts), min_size=1, max_size=4, unique=True))
def test_ascii_help_and_label_values_are_written_as_given(help_text: str, values: list[tuple[str, str]]) -> None:
    spec = MetricSpec("x_things_total", "counter", help_text, ("device", "netdev"))
    families = FamilySet()
    reference = CounterMetricFamily("x_things", help_text, labels=("device", "netdev"))
    for i, labels in enumerate(values):
        families.add(spec, labels, i)
        reference.add_metric(list(labels), i)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(type("C", (), {"collect": lambda self: [reference]})())
    assert families.render_text() == generate_latest(registry)


def test_surrounding_spaces_of_a_label_value_and_help_are_kept() -> None:
    # The same, as one readable example: a label value is whatever the kernel or the config gave.
    families = FamilySet()
    families.add(MetricSpec("x_things", "gauge", " Things. ", ("device",)), [" mlx5_0 "], 1)
    assert families.render_text() == (
        b'# HELP x_things  Things. \n# TYPE x_things gauge\nx_things{device=" mlx5_0 "} 1.0\n'
    )


# A pruning render must look the old cache up and keep what it found there. Otherwise the output stays
# right, but each label set's text is built again after every prune, which SeriesPrefixes exists to avoid,
# and the cache no longer holds one text per label set written.


def test_a_label_sets_text_is_built_once_across_pruning_renders(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[tuple[str, ...]] = []
    label_text = base._label_text

    def counting(order: tuple[tuple[int, str], ...], labels: tuple[str, ...]) -> str:
        built.append(labels)
        return label_text(order, labels)

    monkeypatch.setattr(base, "_label_text", counting)
    spec = MetricSpec("x_things_total", "counter", "Things.", ("device", "port"))
    prefixes = SeriesPrefixes()
    for render in range(2 * SeriesPrefixes.PRUNE_EVERY + 2):
        families = FamilySet(prefixes)
        for device in ("mlx5_0", "mlx5_1"):
            families.add(spec, [device, "1"], render)  # values move: the family is written again each time
        text = families.render_text().decode()
        assert f'x_things_total{{device="mlx5_1",port="1"}} {render}.0' in text
        assert len(prefixes) == 2, render
    assert sorted(built) == [("mlx5_0", "1"), ("mlx5_1", "1")]
