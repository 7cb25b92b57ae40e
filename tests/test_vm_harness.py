"""The VM harness's module handling, on the real Debian kernel the install script unpacks: the same load
order and the same ELF images come out of xz-compressed modules (Debian trixie's layout) as out of plain
ones (bookworm's), and the initramfs carries them decompressed, since busybox insmod reads plain .ko."""

from __future__ import annotations

import gzip
import lzma
import shutil
from pathlib import Path

import pytest
from vm.harness import BUSYBOX, KERNEL_MODULES, Kernel, build_initramfs, find_kernel, module_bytes, module_load_order

from conftest import skip_or_fail


@pytest.fixture(scope="module")
def kernel() -> Kernel:
    found = find_kernel()
    if found is None:
        skip_or_fail("no Debian kernel unpacked for the VM (scripts/install-test-deps.sh)")
    assert found is not None
    return found


def compressed_copy(kernel: Kernel, modules: list[Path], dest: Path) -> Path:
    """A lib/modules/<release> with only `modules`, each as .ko.xz, and the kernel's modules.builtin."""
    root = dest / kernel.release
    for module in modules:
        target = root / module.relative_to(kernel.modules).with_name(module.name + ".xz")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(lzma.compress(module.read_bytes(), preset=0))
    shutil.copy(kernel.modules / "modules.builtin", root / "modules.builtin")
    return root


def test_xz_modules_resolve_to_the_same_order_and_images(kernel: Kernel, tmp_path: Path) -> None:
    plain = module_load_order(kernel.modules, KERNEL_MODULES)
    assert plain[-1].name in {"ib_uverbs.ko", "rdma_rxe.ko"}  # the wanted ones come after what they need
    xz_root = compressed_copy(kernel, plain, tmp_path)
    packed = module_load_order(xz_root, KERNEL_MODULES)
    assert [p.name for p in packed] == [p.name + ".xz" for p in plain]
    for a, b in zip(plain, packed, strict=True):
        assert module_bytes(b) == a.read_bytes()


def test_initramfs_carries_decompressed_modules(kernel: Kernel, tmp_path: Path) -> None:
    if not BUSYBOX.is_file():
        skip_or_fail("busybox-static is not installed (scripts/install-test-deps.sh)")
    plain = module_load_order(kernel.modules, KERNEL_MODULES)
    xz_kernel = Kernel(kernel.vmlinuz, compressed_copy(kernel, plain, tmp_path), kernel.release)
    archive = gzip.decompress(build_initramfs(xz_kernel, tmp_path / "initramfs.gz").read_bytes())
    for module in plain:
        # newc stores names then data 4-byte aligned: the name and the whole ELF image are both in there.
        assert f"modules/{module.name}\0".encode() in archive
        assert module.read_bytes() in archive
    assert b".ko.xz" not in archive


def test_scenario_reads_rxe0_gid_counts_from_an_exposition() -> None:
    from vm.scenario import exported_gid_types

    text = "\n".join(
        [
            "# TYPE rdma_port_gids gauge",
            'rdma_port_gids{device="rxe0",port="1",gid_type="IB/RoCE v1"} 2.0',
            'rdma_port_gids{device="rxe0",port="1",gid_type="RoCE v2"} 3.0',
            'rdma_port_gids{device="rxe1",port="1",gid_type="RoCE v2"} 9.0',
            'rdma_port_gids_other{device="rxe0",port="1",gid_type="RoCE v2"} 7.0',
        ]
    )
    assert exported_gid_types(text) == {"IB/RoCE v1": 2, "RoCE v2": 3}
    assert exported_gid_types("") == {}


# early_runs_done: the patches below are process-wide, and a VM module's boot may still be running.
@pytest.mark.usefixtures("early_runs_done")
def test_a_hung_kvm_boot_sends_the_sessions_later_vms_straight_to_tcg(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On a machine whose nested KVM hangs its guests, each VM used to wait out the KVM probe first.
    from vm import harness

    boots: list[bool] = []

    def boot(qemu: str, kernel: Kernel, initrd: Path, out: Path, console: Path, *, kvm: bool, **_: object) -> bytes:
        boots.append(kvm)
        console.write_text("" if kvm else harness.INIT_BANNER)  # KVM never reaches /init; TCG runs the command
        if not kvm:
            (out / "exit-code").write_text("0")
        return b""

    monkeypatch.setattr(harness, "_kvm_hung", False)
    monkeypatch.setattr(harness, "find_kernel", lambda: Kernel(tmp_path / "vmlinuz", tmp_path, "6.1.0"))
    monkeypatch.setattr(harness, "build_initramfs", lambda *args, **kwargs: tmp_path / "initrd.gz")
    monkeypatch.setattr(harness, "kvm_usable", lambda: True)
    monkeypatch.setattr(harness, "_boot", boot)
    monkeypatch.setattr(harness.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.delenv("RDMA_EXPORTER_VM_ACCEL", raising=False)
    for run in ("first", "second"):
        assert harness.run_in_vm("true", tmp_path / run).exit_code == 0
    assert boots == [True, False, False]  # the probe once, then TCG only
    monkeypatch.setenv("RDMA_EXPORTER_VM_ACCEL", "kvm")  # asked for by name: still tried
    harness.run_in_vm("true", tmp_path / "third")
    assert boots[3] is True
