"""The daemon on a real kernel's sysfs: Debian's 6.1 kernel in qemu, with a soft-RoCE device rxe0 on veth0.

One VM boot for the module (tests/vm/harness.py). Inside it, tests/vm/scenario.py starts
`python -m rdma_exporter --path.sysfs=/sys` on the VM's live /sys and scrapes it over loopback after start,
after real RDMA traffic (ibv_rc_pingpong over rxe0), after `ip link set veth0 down` and after
`rdma link delete rxe0`; the tests here read those scrapes from the VM's output share.

Needs qemu, busybox-static, ibverbs-utils/-providers and the kernel that scripts/install-test-deps.sh
unpacks. Measured on a 2-CPU machine whose nested /dev/kvm hangs its guests: 77 s (a 15 s KVM probe,
then TCG; RDMA_EXPORTER_VM_ACCEL=tcg skips the probe). Not yet measured with a working KVM.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from vm.harness import NETDEV, VmResult, run_in_vm

from conftest import BackgroundRuns, early_setup, promtool_check_metrics, require_vm, samples

REPO = Path(__file__).resolve().parents[1]
SCENARIO = REPO / "tests" / "vm" / "scenario.py"
PINGPONG_ITERS = 200
PINGPONG_SIZE = 4096
ACTIVE_MTU = 1024  # rxe0's active MTU on a 1500-byte veth (ibv_rc_pingpong's default -m)
PORT = (("device", "rxe0"), ("port", "1"))

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@early_setup
def boot(work: Path) -> VmResult:
    """The module's one boot, started as the session starts (conftest.early_runs)."""
    require_vm("ibv_rc_pingpong", "rdma")
    command = (
        f"export PYTHONPATH={REPO / 'exporter'}\n"
        f'exec {sys.executable} {SCENARIO} "$VM_OUT" {PINGPONG_ITERS} {PINGPONG_SIZE}\n'
    )
    # check=False: a scenario that stops midway still leaves the scrapes before it for the tests to read;
    # test_scenario_ran_to_the_end reports why it stopped.
    return run_in_vm(command, work, check=False)


@pytest.fixture(scope="module")
def vm(early_runs: BackgroundRuns) -> VmResult:
    result: VmResult = early_runs.result(__name__)
    print(f"VM ({'KVM' if result.kvm else 'TCG'}) ran {result.seconds:.1f} s; logs in {result.out_dir.parent}")
    return result


def test_scenario_ran_to_the_end(vm: VmResult) -> None:
    steps = vm.out_dir / "steps.log"
    assert vm.exit_code == 0, (
        f"scenario exited {vm.exit_code}\nsteps.log:\n{steps.read_text() if steps.exists() else '<none>'}\n"
        f"command.log, last lines:\n{''.join(vm.command_log.read_text().splitlines(True)[-30:])}"
    )


def scrape(vm: VmResult, step: str) -> Samples:
    path = vm.out_dir / f"scrape-{step}.prom"
    assert path.exists(), f"no scrape {step}; steps.log:\n{(vm.out_dir / 'steps.log').read_text()}"
    return samples(path.read_text())


def value(found: Samples, name: str, labels: tuple[tuple[str, str], ...] = PORT) -> float | None:
    return found.get((name, tuple(sorted(labels))))


def read_errors(found: Samples) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: v for (name, labels), v in found.items() if name == "rdma_exporter_file_read_errors_total" and v}


def test_started_daemon_exports_rxe0_port_active_roce(vm: VmResult) -> None:
    found = scrape(vm, "start")
    assert value(found, "rdma_port_info", (*PORT, ("link_layer", "Ethernet"))) == 1
    assert value(found, "rdma_port_state", (*PORT, ("state", "ACTIVE"))) == 1
    assert value(found, "rdma_port_physical_state", (*PORT, ("state", "LinkUp"))) == 1
    assert value(found, "rdma_port_netdev_info", (*PORT, ("netdev", NETDEV))) == 1
    # rxe's rate is derived from the netdev's speed: veth says 10000 Mb/s.
    assert value(found, "rdma_port_rate_bytes_per_second") == 10e9 / 8
    assert value(found, "rdma_netdev_speed_bytes_per_second", (*PORT, ("netdev", NETDEV))) == 10e9 / 8
    assert value(found, "rdma_exporter_devices", ()) == 1
    assert read_errors(found) == {}
    failed = {k: v for k, v in found.items() if k[0] == "rdma_exporter_scrape_collector_success" and v != 1}
    assert failed == {}


def test_pingpong_over_rxe0_completed(vm: VmResult) -> None:
    client = vm.out_dir / "pingpong-client.log"
    assert client.exists() and f"{PINGPONG_ITERS} iters in" in client.read_text(), (
        "ibv_rc_pingpong did not complete:\n" + (client.read_text() if client.exists() else "<no client log>")
    )


def test_rdma_traffic_shows_in_rxe_hw_counters(vm: VmResult) -> None:
    before, after = scrape(vm, "start"), scrape(vm, "traffic")
    # Client and server are both on rxe0, and each sends PINGPONG_ITERS messages of PINGPONG_SIZE bytes.
    packets = 2 * PINGPONG_ITERS * math.ceil(PINGPONG_SIZE / ACTIVE_MTU)
    for counter in ("rdma_port_hw_sent_pkts_total", "rdma_port_hw_rcvd_pkts_total"):
        start, end = value(before, counter), value(after, counter)
        assert start is not None and end is not None, f"{counter} not exported"
        assert end - start >= packets, f"{counter} rose by {end - start}, less than the {packets} packets sent"
    sends = (value(after, "rdma_port_hw_rdma_sends_total") or 0) - (value(before, "rdma_port_hw_rdma_sends_total") or 0)
    assert sends >= 2 * PINGPONG_ITERS
    assert read_errors(after) == {}


def test_port_of_a_downed_netdev_is_still_exported_as_down(vm: VmResult) -> None:
    found = scrape(vm, "down")
    assert value(found, "rdma_port_info", (*PORT, ("link_layer", "Ethernet"))) == 1
    assert value(found, "rdma_port_state", (*PORT, ("state", "DOWN"))) == 1
    assert value(found, "rdma_port_state", (*PORT, ("state", "ACTIVE"))) == 0
    assert value(found, "rdma_netdev_up", (*PORT, ("netdev", NETDEV))) == 0
    assert read_errors(found) == {}


def test_deleted_device_is_gone_and_the_scrape_still_succeeds(vm: VmResult) -> None:
    found = scrape(vm, "deleted")
    assert not [k for k in found if ("device", "rxe0") in k[1] and k[0].startswith("rdma_port")]
    assert value(found, "rdma_exporter_devices", ()) == 0
    failed = {k: v for k, v in found.items() if k[0] == "rdma_exporter_scrape_collector_success" and v != 1}
    assert failed == {}
    steps = (vm.out_dir / "steps.log").read_text()
    assert "daemon still running: True" in steps, steps


STEPS = ["start", "traffic", "address", "down", "deleted"]


@pytest.mark.parametrize("step", STEPS)
def test_exporter_agrees_with_the_kernel_files(vm: VmResult, step: str) -> None:
    """The values that live in the exporter's cached static info match what the kernel says at that moment."""
    found = scrape(vm, step)
    kernel = json.loads((vm.out_dir / f"kernel-{step}.json").read_text())
    if not kernel["exists"]:
        assert value(found, "rdma_port_info", (*PORT, ("link_layer", "Ethernet"))) is None
        return
    exported_gids = {dict(k[1])["gid_type"]: v for k, v in found.items() if k[0] == "rdma_port_gids"}
    assert exported_gids == kernel["gid_types"], f"rdma_port_gids {exported_gids}, the kernel's GID table {kernel}"
    state = kernel["state"].split(": ")[1]
    assert value(found, "rdma_port_state", (*PORT, ("state", state))) == 1, kernel
    gbps = float(kernel["rate"].split()[0])
    assert value(found, "rdma_port_rate_bytes_per_second") == gbps * 1e9 / 8, kernel
    # Loaded for ibv_rc_pingpong (tests/vm/harness.py), so this is 1 where the kernel says so.
    assert value(found, "rdma_device_user_verbs", (("device", "rxe0"),)) == kernel["user_verbs"] == 1, kernel
    assert value(found, "rdma_user_verbs_loaded", ()) == kernel["user_verbs_loaded"] == 1, kernel


@pytest.mark.parametrize("step", STEPS)
def test_live_scrape_passes_promtool(vm: VmResult, step: str) -> None:
    scrape(vm, step)  # says why it is missing
    promtool_check_metrics((vm.out_dir / f"scrape-{step}.prom").read_text())
