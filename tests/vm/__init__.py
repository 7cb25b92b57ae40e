"""Boot the Debian kernel in qemu with soft RoCE (rdma_rxe) and run a command against its real sysfs."""

from vm.harness import KERNEL_MODULES, VmError, VmResult, find_kernel, run_in_vm

__all__ = ["KERNEL_MODULES", "VmError", "VmResult", "find_kernel", "run_in_vm"]
