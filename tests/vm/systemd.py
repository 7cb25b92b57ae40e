"""The VM of harness.py with systemd as PID 1: units of the caller's in /run/systemd/system, a test unit.

After the harness's setup (rxe0 on veth0) and the caller's `prepare` shell (run in the same chroot, so its
mounts stay), /init hands over to the host's systemd with `switch_root`, booting TARGET. TARGET wants
TEST_UNIT, a oneshot that runs the command (as the harness would, its output in $VM_OUT/command.log and
its exit status in $VM_OUT/exit-code) and then has systemd power the VM off (SuccessAction=). Units the
caller does not want are masked in /run/systemd/system, which wins over /lib/systemd/system.

The VM also gets a virtio-net NIC (NIC_NETDEV, soft-RoCE device NIC_RDMA on it): a netdev with a
`device` link, which veth0 lacks, for what only reads hardware-backed netdevs (the ethtool collector).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Final

from .harness import DEFAULT_SETUP, VM_OUT, VmResult, run_in_vm

SYSTEMD: Final = "/lib/systemd/systemd"
UNIT_DIR: Final = "/run/systemd/system"
TARGET: Final = "vm-test.target"
TEST_UNIT: Final = "vm-test.service"

NIC_NETDEV: Final = "eth0"
NIC_ADDRESS: Final = "10.56.0.1"
NIC_RDMA: Final = "rxe1"
# A virtio-net NIC on a hub with nothing else on it: carrier up, no traffic, no host networking. No option
# ROM: iPXE's would only slow the firmware down.
NIC_QEMU_ARGS: Final = ("-netdev", "hubport,id=nic0,hubid=0", "-device", "virtio-net-pci,netdev=nic0,romfile=")
NIC_MODULES: Final = ("virtio_net",)
NIC_SETUP: Final = f"""\
ip addr add {NIC_ADDRESS}/24 dev {NIC_NETDEV}
ip link set {NIC_NETDEV} up
rdma link add {NIC_RDMA} type rxe netdev {NIC_NETDEV}
"""

# Boot-time units of a full system that this VM (read-only root, no disks, no consoles) has no use for;
# masking them keeps the TCG boot short and the journal free of their failures on the read-only root.
MASKED: Final = (
    "systemd-firstboot.service",
    "systemd-machine-id-commit.service",
    "systemd-random-seed.service",
    "systemd-journal-flush.service",
    "systemd-update-utmp.service",
    "systemd-sysusers.service",
    "systemd-tmpfiles-setup.service",
    "systemd-tmpfiles-setup-dev.service",
    "systemd-remount-fs.service",
    "systemd-binfmt.service",
    "systemd-modules-load.service",
    "systemd-sysctl.service",
    "systemd-pstore.service",
    "systemd-timesyncd.service",
    "systemd-repart.service",
    "systemd-pcrphase.service",
    "systemd-pcrphase-sysinit.service",
    "systemd-ask-password-console.path",
    "kmod-static-nodes.service",
    "proc-sys-fs-binfmt_misc.automount",
    "sys-fs-fuse-connections.mount",
    "sys-kernel-config.mount",
    "sys-kernel-debug.mount",
    "sys-kernel-tracing.mount",
    "dev-hugepages.mount",
    "cryptsetup.target",
    "integritysetup.target",
    "veritysetup.target",
    "dbus.socket",
    "timers.target",  # the host's apt, man-db and fstrim timers
    "systemd-initctl.socket",
    "systemd-journald-audit.socket",
)

JOB_TIMEOUT: Final = 400
# qemu's own limit, under KVM and TCG alike: longer than the watchdog, which is longer than a unit's 90 s
# start timeout. A READY=1 that never comes then fails the service first, and the test unit (which only
# wants it) still runs and saves the journal that says why.
VM_TIMEOUT: Final = JOB_TIMEOUT + 60.0

TARGET_UNIT: Final = f"""\
[Unit]
Description=VM test boot
# basic.target as multi-user.target has it, so that units with default dependencies start after it.
Wants=basic.target {TEST_UNIT}
# A boot that never gets to the end of the test unit powers off rather than waiting for qemu's timeout.
JobTimeoutSec={JOB_TIMEOUT}
JobTimeoutAction=poweroff-force
"""

TEST_UNIT_TEXT: Final = f"""\
[Unit]
Description=VM test command
SuccessAction=poweroff-force
FailureAction=poweroff-force

[Service]
Type=oneshot
Environment=VM_OUT={VM_OUT} PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp
Environment=PYTHONDONTWRITEBYTECODE=1 SYSTEMD_PAGER= SYSTEMD_COLORS=0 COLUMNS=200
ExecStart=/bin/sh {VM_OUT}/run-command.sh
TimeoutStartSec=300
"""

RUN_COMMAND: Final = f"""\
/bin/sh {VM_OUT}/command.sh > {VM_OUT}/command.log 2>&1
echo $? > {VM_OUT}/exit-code.new
sync
mv {VM_OUT}/exit-code.new {VM_OUT}/exit-code
"""


def boot_systemd(
    command: str,
    work_dir: Path,
    *,
    units: Mapping[str, str],
    prepare: str = "",
    after: Sequence[str] = (),
    keep: Iterable[Path] = (),
    masked: Sequence[str] = MASKED,
    timeout: float | None = None,
) -> VmResult:
    """Boot the VM into systemd and run `command` in TEST_UNIT, ordered after (and wanting) `after`.

    `units`: paths relative to /run/systemd/system (drop-ins too) and their text. `prepare`: shell run as
    root in the chroot before systemd starts, e.g. to bind-mount what a unit needs or install unit files
    from the checkout. Returns like harness.run_in_vm(check=False); command.log and exit-code are the
    command's, the rest of the boot is in console.log.
    """
    out = work_dir / "out"
    units_dir = out / "units"
    units_dir.mkdir(parents=True, exist_ok=True)
    ordering = "".join(f"Wants={unit}\nAfter={unit}\n" for unit in after)
    all_units = {
        TARGET: TARGET_UNIT,
        TEST_UNIT: TEST_UNIT_TEXT.replace("[Service]", ordering + "\n[Service]", 1),
        **units,
    }
    for name, text in all_units.items():
        (units_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (units_dir / name).write_text(text)
    (out / "run-command.sh").write_text(RUN_COMMAND)
    setup = "\n".join(
        [
            DEFAULT_SETUP + NIC_SETUP,
            f"mkdir -p {UNIT_DIR}",
            f"cp -R {VM_OUT}/units/. {UNIT_DIR}/",
            *(f"ln -sf /dev/null {UNIT_DIR}/{unit}" for unit in masked),
            prepare,
        ]
    )
    return run_in_vm(
        command,
        work_dir,
        setup=setup,
        keep=keep,
        timeout=timeout or VM_TIMEOUT,
        check=False,
        extra_modules=NIC_MODULES,
        qemu_args=NIC_QEMU_ARGS,
        # container= (empty): systemd as PID 1 takes it as "no container", where it would otherwise see the
        # host root's /.dockerenv (when the host is a container) and behave as in Docker.
        handover=("/usr/bin/env", "container=", SYSTEMD, f"--unit={TARGET}", "--show-status=0"),
    )
