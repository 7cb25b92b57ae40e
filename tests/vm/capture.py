"""Capture the sysfs of a real soft-RoCE device into a fixture tree (tests/fixtures/sysfs/<name>/sys).

On the host: `PYTHONPATH=exporter python tests/vm/capture.py tests/fixtures/sysfs/debian-6.1-rxe` boots the
VM (tests/vm/harness.py), sends a little RDMA traffic over rxe0 so that its counters are not all zero, and
copies, inside the VM, /sys/class/infiniband/rxe0, /sys/class/net/veth0 and /sys/class/infiniband_verbs/uverbs0
with the directories they link to, as the existing fixture trees are laid out: class/* are the kernel's
relative symlinks into devices/.

Regular files are copied with their content as read; a file that cannot be read (write-only, or an
attribute answering EINVAL such as an unpopulated `gid_attrs/ndevs/N`) is left out and listed in
`<dest>/../UNREADABLE.txt` with its errno. Symlinks are kept as links, their targets as the kernel has them.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vm.harness import NETDEV, NETDEV_ADDRESS, run_in_vm

TRAFFIC = (
    "ibv_rc_pingpong -d rxe0 -g 1 -n 100 > $VM_OUT/server.log 2>&1 & server=$!\n"
    "sleep 1\n"
    f"ibv_rc_pingpong -d rxe0 -g 1 -n 100 {NETDEV_ADDRESS} > $VM_OUT/client.log 2>&1\n"
    "wait $server\n"
)


def copy_sysfs(sys_root: Path, dest: Path, entries: list[str]) -> list[str]:
    """Copy class entries (e.g. "class/infiniband/rxe0") and their link targets from sys_root to dest/sys."""
    unreadable: list[str] = []
    for entry in entries:
        link = sys_root / entry
        target = os.readlink(link)
        (dest / entry).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, dest / entry)
        real = Path(os.path.realpath(link))
        for root, dirs, files in os.walk(real):
            rel = Path(root).relative_to(sys_root)
            (dest / rel).mkdir(parents=True, exist_ok=True)
            for name in sorted(dirs + files):
                source = Path(root) / name
                if source.is_symlink():
                    os.symlink(os.readlink(source), dest / rel / name)
                    if name in dirs:
                        dirs.remove(name)  # os.walk does not follow it either; keep the list honest
                    continue
                if name in dirs:
                    continue
                try:
                    data = source.read_bytes()
                except OSError as error:
                    unreadable.append(f"{rel / name}: {errno.errorcode.get(error.errno or 0, error.errno)}")
                    continue
                (dest / rel / name).write_bytes(data)
    return unreadable


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", type=Path, help="fixture directory to create (its sys/ must not exist)")
    parser.add_argument("--in-vm", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.in_vm:
        # Built on the VM's tmpfs and sent as one tar: thousands of small writes over 9p are slow.
        local = Path(tempfile.mkdtemp())
        # uverbs0: ib_uverbs' character device for rxe0, through which verbs applications reach it.
        entries = ["class/infiniband/rxe0", f"class/net/{NETDEV}", "class/infiniband_verbs/uverbs0"]
        unreadable = copy_sysfs(Path("/sys"), local / "sys", entries)
        (local / "UNREADABLE.txt").write_text("".join(line + "\n" for line in sorted(unreadable)))
        with tarfile.open(Path(os.environ["VM_OUT"]) / "capture.tar", "w") as tar:
            tar.add(local, arcname=".")
        return 0
    dest = args.dest.resolve()
    if (dest / "sys").exists():
        parser.error(f"{dest / 'sys'} exists")
    with tempfile.TemporaryDirectory() as work:
        command = "date +%s.%N\n" + TRAFFIC + "date +%s.%N\n"
        command += f"{sys.executable} {Path(__file__).resolve()} --in-vm {dest}\ndate +%s.%N\n"
        result = run_in_vm(command, Path(work))
        print(f"VM ran {result.seconds:.1f} s ({'KVM' if result.kvm else 'TCG'})")
        print(result.command_log.read_text())
        print((result.out_dir / "client.log").read_text())
        dest.mkdir(parents=True, exist_ok=True)
        with tarfile.open(result.out_dir / "capture.tar") as tar:
            tar.extractall(dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
