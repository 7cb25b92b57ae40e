"""Run a command in a qemu VM on the distribution's kernel, with a real soft-RoCE device (rxe0).

The VM boots the Debian kernel that scripts/install-test-deps.sh unpacks (never installed into the host)
with a small initramfs: busybox-static, the kernel modules it needs (resolved from the modules' own
`depends=` fields, since the unpacked package has no modules.dep) and an init script. The init script
mounts the host's root filesystem read-only over 9p, chroots into it with the VM's own /proc, /sys, /dev,
/tmp and /run, creates a veth pair and `rdma link add rxe0 type rxe netdev veth0`, runs the command and
powers off. A second, writable 9p share at /run/vm-out inside the VM (`$VM_OUT`) carries outputs back.

Paths under the host's /tmp that the command needs (the checkout, pytest's tmp_path) are bind-mounted
over the VM's own tmpfs at the same place, so host paths work unchanged in the VM.
"""

from __future__ import annotations

import gzip
import lzma
import os
import shlex
import shutil
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

CACHE_DIR: Final = Path(os.environ.get("RDMA_EXPORTER_VM_CACHE", Path.home() / ".cache" / "rdma-exporter-vm"))
BUSYBOX: Final = Path("/bin/busybox")
VM_OUT: Final = "/run/vm-out"  # where the writable share is mounted inside the VM

# Loaded in dependency order; what a module needs is added before it.
KERNEL_MODULES: Final = (
    "virtio_pci",  # the PCI transport of the 9p shares
    "9pnet_virtio",
    "9p",
    "veth",  # the Ethernet netdev under rxe0
    "crc32_generic",  # rxe's ICRC shash "crc32": the initramfs has no modprobe for the kernel to ask
    "rdma_rxe",  # soft RoCE
    "ib_uverbs",  # /dev/infiniband/uverbs0, for ibv_rc_pingpong
)

NETDEV: Final = "veth0"
NETDEV_PEER: Final = "veth1"
NETDEV_ADDRESS: Final = "10.55.0.1"

# Run in the chroot before the command: an Ethernet netdev with carrier and an IPv4 address (so rxe0 has
# a RoCEv2 GID for it), then the soft-RoCE device on it.
DEFAULT_SETUP: Final = f"""\
set -e
ip link set lo up
ip link add {NETDEV} type veth peer name {NETDEV_PEER}
ip addr add {NETDEV_ADDRESS}/24 dev {NETDEV}
ip link set {NETDEV_PEER} up
ip link set {NETDEV} up
rdma link add rxe0 type rxe netdev {NETDEV}
"""

KVM_TIMEOUT: Final = 90.0
TCG_TIMEOUT: Final = 600.0
# A working KVM reaches /init in about two seconds. Some nested hypervisors offer a /dev/kvm whose guests
# hang before the kernel prints anything (seen: an AMD EPYC L1 whose KVM lacks SSE3 in its CPUID); the VM is
# then booted again under TCG. RDMA_EXPORTER_VM_ACCEL=tcg or =kvm skips the probe.
KVM_BOOT_DEADLINE: Final = 15.0
INIT_BANNER: Final = "vm: init"
# Set once a KVM boot hung in this process: later VMs of the session boot under TCG at once instead of
# waiting out KVM_BOOT_DEADLINE again (15 s per VM test module on such a machine).
_kvm_hung = False
# The qemu processes running now. A session that ends early (pytest -x, Ctrl-C) stops them (stop_all)
# rather than wait for boots that conftest.early_runs started in the background and no test will read.
_running: set[subprocess.Popen[bytes]] = set()
_running_lock = threading.Lock()
_stopped = False


def stop_all() -> None:
    """Kill every qemu of this process, and refuse to start more (the session is over)."""
    global _stopped
    with _running_lock:
        _stopped = True
        for process in _running:
            process.kill()


class VmError(AssertionError):
    """The VM did not boot, did not finish, or the command failed; the message has the logs' tails."""


@dataclass(frozen=True)
class Kernel:
    vmlinuz: Path
    modules: Path  # lib/modules/<release>
    release: str


@dataclass(frozen=True)
class VmResult:
    exit_code: int
    out_dir: Path
    console_log: Path
    command_log: Path
    seconds: float
    kvm: bool


def find_kernel(cache: Path = CACHE_DIR) -> Kernel | None:
    """The unpacked kernel in the cache, None if scripts/install-test-deps.sh has not fetched it."""
    images = sorted((cache / "kernel" / "boot").glob("vmlinuz-*"))
    if not images:
        return None
    release = images[-1].name.removeprefix("vmlinuz-")
    modules = cache / "kernel" / "lib" / "modules" / release
    return Kernel(images[-1], modules, release) if modules.is_dir() else None


def kvm_usable() -> bool:
    try:
        fd = os.open("/dev/kvm", os.O_RDWR)
    except OSError:
        return False
    os.close(fd)
    return True


# --- kernel modules ----------------------------------------------------------------------------------


# Debian compresses modules with xz from trixie on (CONFIG_MODULE_COMPRESS_XZ); bookworm's are plain.
MODULE_SUFFIXES: Final = (".ko", ".ko.xz")


def module_name(path: Path) -> str:
    """The module a file holds, as the kernel names it: suffix off, - and _ the same."""
    name = path.name
    for suffix in MODULE_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)].replace("-", "_")
    raise ValueError(f"{path}: not a kernel module file ({' or '.join(MODULE_SUFFIXES)})")


def module_bytes(path: Path) -> bytes:
    """The ELF image of a module file, decompressed: busybox insmod takes plain .ko files only."""
    data = path.read_bytes()
    return lzma.decompress(data) if path.name.endswith(".xz") else data


def _modinfo(path: Path) -> dict[str, list[str]]:
    """The `.modinfo` section of an ELF64 little-endian module: {key: [values]}."""
    data = module_bytes(path)
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path}: not an ELF64 little-endian module")
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)

    def section(index: int) -> tuple[int, int, int]:
        base = shoff + index * shentsize
        name = struct.unpack_from("<I", data, base)[0]
        offset, size = struct.unpack_from("<QQ", data, base + 0x18)
        return name, offset, size

    _, strtab, _ = section(shstrndx)
    for index in range(shnum):
        name_offset, offset, size = section(index)
        name = data[strtab + name_offset : data.index(b"\0", strtab + name_offset)]
        if name == b".modinfo":
            info: dict[str, list[str]] = {}
            for entry in data[offset : offset + size].split(b"\0"):
                key, sep, value = entry.decode(errors="replace").partition("=")
                if sep:
                    info.setdefault(key, []).append(value)
            return info
    return {}


def module_load_order(modules_dir: Path, wanted: Iterable[str]) -> list[Path]:
    """The module files of `wanted` and everything they depend on, each after its dependencies.

    Built-in modules (modules.builtin) need no loading. Names with - and _ are the same module.
    """
    files: dict[str, Path] = {}
    for path in (modules_dir / "kernel").rglob("*.ko*"):
        if path.name.endswith(MODULE_SUFFIXES):
            files[module_name(path)] = path
    builtin = {
        module_name(Path(line))
        for line in (modules_dir / "modules.builtin").read_text().split()
        if line.endswith(MODULE_SUFFIXES)
    }
    order: list[Path] = []
    seen: set[str] = set()

    def visit(name: str, chain: tuple[str, ...]) -> None:
        name = name.replace("-", "_")
        if name in seen or name in builtin:
            return
        if name in chain:
            raise ValueError(f"module dependency cycle: {' -> '.join((*chain, name))}")
        if name not in files:
            needed_by = " -> ".join(chain) or "the VM"
            raise FileNotFoundError(f"kernel module {name} (needed by {needed_by}) not in {modules_dir}")
        for depends in _modinfo(files[name]).get("depends", []):
            for dependency in filter(None, depends.split(",")):
                visit(dependency, (*chain, name))
        seen.add(name)
        order.append(files[name])

    for name in wanted:
        visit(name, ())
    return order


# --- initramfs ---------------------------------------------------------------------------------------


class _Cpio:
    """A cpio archive in the kernel's "newc" format, built in memory."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.inode = 1

    def _entry(self, name: str, mode: int, data: bytes = b"", rdev: tuple[int, int] = (0, 0)) -> None:
        encoded = name.encode() + b"\0"
        fields = (self.inode, mode, 0, 0, 1, 0, len(data), 0, 0, rdev[0], rdev[1], len(encoded), 0)
        header = b"070701" + b"".join(f"{value:08x}".encode() for value in fields)
        self.inode += 1
        self.parts.append(header + encoded + b"\0" * (-(len(header) + len(encoded)) % 4))
        self.parts.append(data + b"\0" * (-len(data) % 4))

    def directory(self, name: str) -> None:
        self._entry(name, 0o040755)

    def file(self, name: str, data: bytes, mode: int = 0o644) -> None:
        self._entry(name, 0o100000 | mode, data)

    def char_device(self, name: str, major: int, minor: int) -> None:
        self._entry(name, 0o020600, rdev=(major, minor))

    def finish(self) -> bytes:
        self._entry("TRAILER!!!", 0)
        return b"".join(self.parts)


def _init_script(modules: Sequence[str], keep: Sequence[str], handover: Sequence[str] = ()) -> str:
    """/init: mounts, the chroot into the host's root, the rxe setup, the command, power off.

    With `handover` (an init's argv, e.g. systemd), the setup is followed by `switch_root` into the host's
    root and that init as PID 1, instead of the command: whatever the init starts runs the command, writes
    $VM_OUT/exit-code and powers off. Every step says what it does on the console, so a failure is
    visible in the console log.
    """
    lines = [
        "#!/bin/busybox sh",
        f"/bin/busybox echo {INIT_BANNER}",
        "/bin/busybox mkdir -p /bin /proc /sys /dev /host",
        "/bin/busybox --install -s /bin",
        "export PATH=/bin",
        "mount -t proc proc /proc",
        "mount -t sysfs sysfs /sys",
        "mount -t devtmpfs devtmpfs /dev",
        "fail() { echo \"vm: FAILED: $*\"; poweroff -f; }",
        "echo vm: loading modules",
    ]
    lines += [f"insmod /modules/{name} || fail insmod {name}" for name in modules]
    lines += [
        "echo vm: mounting the host root",
        # cache=loose: the host root is read-only here and not expected to change during the run.
        "mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=524288,cache=loose hostroot /host || fail 9p host",
    ]
    for index, path in enumerate(keep):
        lines += [f"mkdir -p /keep/{index}", f"mount --bind /host{path} /keep/{index} || fail keep {path}"]
    lines += [
        "mount -t proc proc /host/proc || fail proc",
        "mount -t sysfs sysfs /host/sys || fail sysfs",
        "mount -t devtmpfs devtmpfs /host/dev || fail dev",
        "mount -t tmpfs tmpfs /host/tmp || fail tmp",
        "mount -t tmpfs tmpfs /host/run || fail run",
        "chmod 1777 /host/tmp",
    ]
    for index, path in enumerate(keep):
        lines += [f"mkdir -p /host{path}", f"mount --move /keep/{index} /host{path} || fail move {path}"]
    lines += [
        f"mkdir -p /host{VM_OUT}",
        f"mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288 out /host{VM_OUT} || fail 9p out",
        "echo vm: setup",
        "ENV='env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp "
        f"PYTHONDONTWRITEBYTECODE=1 VM_OUT={VM_OUT}'",
        f"chroot /host $ENV /bin/sh -x {VM_OUT}/setup.sh > /host{VM_OUT}/setup.log 2>&1 || "
        f"{{ cat /host{VM_OUT}/setup.log; fail setup; }}",
    ]
    if handover:
        # busybox switch_root empties the initramfs, moves /host (with the mounts under it) to / and execs
        # the init there; should that fail, PID 1 exits and the kernel panics, which ends qemu (-no-reboot).
        argv = " ".join(map(shlex.quote, handover))
        return "\n".join([*lines, f"echo vm: switch_root to {argv}", f"exec switch_root /host {argv}"]) + "\n"
    lines += [
        "echo vm: command",
        f"chroot /host $ENV /bin/sh {VM_OUT}/command.sh > /host{VM_OUT}/command.log 2>&1",
        f"echo $? > /host{VM_OUT}/exit-code",
        "echo vm: command exited $(cat /host/run/vm-out/exit-code)",
        f"umount /host{VM_OUT}",
        "sync",
        "poweroff -f",
    ]
    return "\n".join(lines) + "\n"


def build_initramfs(
    kernel: Kernel,
    dest: Path,
    keep: Sequence[str] = (),
    *,
    extra_modules: Sequence[str] = (),
    handover: Sequence[str] = (),
) -> Path:
    """A gzipped newc initramfs with busybox, the modules of KERNEL_MODULES (and `extra_modules`) and /init."""
    if not BUSYBOX.is_file():
        raise FileNotFoundError(f"{BUSYBOX} is missing (busybox-static, scripts/install-test-deps.sh)")
    modules = module_load_order(kernel.modules, (*KERNEL_MODULES, *extra_modules))
    archive = _Cpio()
    for directory in ("bin", "dev", "proc", "sys", "host", "keep", "modules"):
        archive.directory(directory)
    archive.char_device("dev/console", 5, 1)
    archive.file("bin/busybox", BUSYBOX.read_bytes(), 0o755)
    names = [f"{module_name(module)}.ko" for module in modules]
    for name, module in zip(names, modules, strict=True):
        archive.file(f"modules/{name}", module_bytes(module))
    archive.file("init", _init_script(names, keep, handover).encode(), 0o755)
    dest.write_bytes(gzip.compress(archive.finish(), compresslevel=1))
    return dest


# --- running -----------------------------------------------------------------------------------------


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as error:
        return f"<{path}: {error.strerror}>"
    return "\n".join(text.splitlines()[-lines:])


def _keep_paths(paths: Iterable[Path]) -> list[str]:
    """Paths under /tmp (hidden by the VM's own tmpfs), outermost only, as absolute strings."""
    under_tmp = sorted({os.path.realpath(p) for p in paths if os.path.realpath(p).startswith("/tmp/")})
    kept: list[str] = []
    for path in under_tmp:
        if not any(path == k or path.startswith(k + "/") for k in kept):
            kept.append(path)
    return kept


def run_in_vm(
    command: str,
    work_dir: Path,
    *,
    setup: str = DEFAULT_SETUP,
    keep: Iterable[Path] = (),
    timeout: float | None = None,
    check: bool = True,
    extra_modules: Sequence[str] = (),
    qemu_args: Sequence[str] = (),
    handover: Sequence[str] = (),
) -> VmResult:
    """Boot the VM, run `command` (shell) in the chroot after `setup`, return when it has powered off.

    `work_dir` (on the host) receives initrd.gz, qemu-argv.txt, console.log (console-kvm.log too when a
    KVM boot hung and TCG was used) and out/ (the VM's $VM_OUT, holding
    setup.log, command.log, exit-code and whatever the command writes). `keep`: host paths under /tmp the
    command needs; the checkout and the Python in use are added. With `check`, a VM that fails to boot or
    finish, or a command that exits non-zero, raises VmError with the logs' tails.

    `extra_modules` are loaded after KERNEL_MODULES, `qemu_args` (e.g. a NIC) are added to qemu's, and
    `handover` replaces the command's run by an init as PID 1 (see _init_script): command.sh is still
    written to $VM_OUT for that init's units to run.
    """
    global _kvm_hung
    kernel = find_kernel()
    if kernel is None:
        raise FileNotFoundError(f"no kernel unpacked under {CACHE_DIR} (scripts/install-test-deps.sh)")
    qemu = shutil.which("qemu-system-x86_64")
    if qemu is None:
        raise FileNotFoundError("qemu-system-x86_64 is not installed (scripts/install-test-deps.sh)")
    work_dir.mkdir(parents=True, exist_ok=True)
    out = work_dir / "out"
    out.mkdir(exist_ok=True)
    (out / "setup.sh").write_text(setup)
    (out / "command.sh").write_text(command)
    kept = _keep_paths([*keep, Path(__file__).parents[2], Path(sys.prefix), work_dir])
    initrd = build_initramfs(kernel, work_dir / "initrd.gz", kept, extra_modules=extra_modules, handover=handover)
    console = work_dir / "console.log"
    accel = os.environ.get("RDMA_EXPORTER_VM_ACCEL", "")
    kvm = accel != "tcg" and kvm_usable() and not (_kvm_hung and accel != "kvm")
    qemu_output = b""
    started = time.monotonic()
    if kvm:
        qemu_output = _boot(qemu, kernel, initrd, out, console, kvm=True, timeout=timeout or KVM_TIMEOUT,
                            work_dir=work_dir, qemu_args=qemu_args,
                            boot_deadline=None if accel == "kvm" else KVM_BOOT_DEADLINE)
        if not (out / "exit-code").exists() and INIT_BANNER not in _read(console):
            kvm = False  # never reached /init: a broken nested KVM, boot again under TCG
            console.rename(work_dir / "console-kvm.log")
            _kvm_hung = True
    if not kvm:
        started = time.monotonic()
        qemu_output = _boot(qemu, kernel, initrd, out, console, kvm=False, timeout=timeout or TCG_TIMEOUT,
                            work_dir=work_dir, qemu_args=qemu_args, boot_deadline=None)
    seconds = time.monotonic() - started
    exit_file = out / "exit-code"
    if not exit_file.exists():
        raise VmError(_report("VM ended without finishing the command", work_dir, qemu_output))
    result = VmResult(int(exit_file.read_text()), out, console, out / "command.log", seconds, kvm)
    if check and result.exit_code != 0:
        raise VmError(_report(f"command in the VM exited {result.exit_code}", work_dir, qemu_output))
    return result


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _boot(
    qemu: str,
    kernel: Kernel,
    initrd: Path,
    out: Path,
    console: Path,
    *,
    kvm: bool,
    timeout: float,
    work_dir: Path,
    boot_deadline: float | None,
    qemu_args: Sequence[str] = (),
) -> bytes:
    """One qemu run until power-off; its stdout. Raises VmError on timeout (after killing qemu).

    With `boot_deadline`, a VM whose console has not shown INIT_BANNER by then is killed and b"" returned.
    """
    argv = [
        qemu,
        # Not -cpu host under KVM: a nested KVM may refuse its MSRs.
        *(["-enable-kvm"] if kvm else ["-accel", "tcg", "-cpu", "max"]),
        "-smp", "2",
        "-m", "1024",
        "-kernel", str(kernel.vmlinuz),
        "-initrd", str(initrd),
        "-append", "console=ttyS0 panic=-1 loglevel=4 nokaslr",
        "-nographic", "-monitor", "none", "-serial", f"file:{console}",
        "-no-reboot",
        "-nic", "none",
        "-virtfs", "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
        "-virtfs", f"local,path={out},mount_tag=out,security_model=none,multidevs=remap",
        *qemu_args,
    ]  # fmt: skip
    (work_dir / "qemu-argv.txt").write_text(" ".join(map(shlex.quote, argv)) + "\n")
    with _running_lock:
        if _stopped:
            raise VmError("the test session ended before this VM started")
        # env: the test modules boot from conftest.early_runs' thread (see BackgroundRuns).
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   env=dict(os.environ))
        _running.add(process)
    try:
        if boot_deadline is not None:
            end = time.monotonic() + boot_deadline
            while process.poll() is None and time.monotonic() < end and INIT_BANNER not in _read(console):
                time.sleep(0.2)
            if process.poll() is None and INIT_BANNER not in _read(console):
                process.kill()
                process.communicate()
                return b""
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        mode = "KVM" if kvm else "TCG"
        raise VmError(_report(f"VM ({mode}) did not power off within {timeout:.0f} s", work_dir, output)) from None
    finally:
        with _running_lock:
            _running.discard(process)
    return output


def _report(what: str, work_dir: Path, qemu_output: bytes) -> str:
    parts = [what, "qemu command: " + _read(work_dir / "qemu-argv.txt").strip()]
    if qemu_output.strip():
        parts.append("qemu said:\n" + qemu_output.decode(errors="replace")[-2000:])
    parts.append(f"console ({work_dir / 'console.log'}), last lines:\n" + _tail(work_dir / "console.log"))
    for name in ("setup.log", "command.log"):
        if (work_dir / "out" / name).exists():
            parts.append(f"{name}, last lines:\n" + _tail(work_dir / "out" / name))
    return "\n\n".join(parts)
