"""How parse.reader classifies failed reads of real files: each errno the kernel answers ends in one
reason of rdma_exporter_file_read_errors_total, and a failed or short read leaves no fd behind."""

from __future__ import annotations

import errno
import os
import types
from pathlib import Path

import pytest

from rdma_exporter.parse import reader as reader_module
from rdma_exporter.parse.reader import FileBudget, OpenFiles, ReadErrors, SysfsReader


def failing_os(path_suffix: str, code: int) -> types.SimpleNamespace:
    """The reader's `os` module, except that reads of files ending in `path_suffix` fail with `code`."""

    def read(fd: int, size: int) -> bytes:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(path_suffix):
            raise OSError(code, os.strerror(code))
        return os.read(fd, size)

    fake = types.SimpleNamespace(**{name: getattr(os, name) for name in dir(os) if not name.startswith("__")})
    fake.read = read
    return fake


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        # A device unbound between open and read: its kernfs nodes answer ENODEV, a gone index ENXIO.
        (errno.ENXIO, "missing"),
        (errno.ENODEV, "missing"),
        (errno.ENOENT, "missing"),
        # An attribute whose show() the driver does not implement.
        (errno.ENOSYS, "unsupported"),
        (errno.EOPNOTSUPP, "unsupported"),
        (errno.EPERM, "permission"),
        (errno.EACCES, "permission"),
        # Firmware and kernel-side failures, including EINVAL where it is not declared "no value".
        (errno.EIO, "io"),
        (errno.EINVAL, "io"),
        (errno.EBUSY, "io"),
        (errno.ETIMEDOUT, "io"),
    ],
)
def test_each_errno_is_counted_under_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, reason: str
) -> None:
    (tmp_path / "rate").write_text("100 Gb/sec (4X EDR)\n")
    monkeypatch.setattr(reader_module, "os", failing_os("/rate", code))
    errors = ReadErrors()
    assert SysfsReader("mlx5_0", errors).text(tmp_path / "rate") is None
    assert errors.counts == {("mlx5_0", reason): 1}
    assert str(tmp_path / "rate") in errors.last[("mlx5_0", reason)]


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_failed_and_one_off_reads_leave_no_fd_open(tmp_path: Path) -> None:
    # A counter file replaced by a directory opens fine and fails on read (EISDIR): that fd, and every fd
    # of a read that is not kept (static reads, reads over the budget), must be closed again, or each
    # scrape leaks until the process hits its fd limit.
    (tmp_path / "good").write_text("1\n")
    (tmp_path / "dir").mkdir()
    before = open_fds()
    for files in (None, OpenFiles(FileBudget(0)), OpenFiles(FileBudget(8))):
        for _ in range(20):
            errors = ReadErrors()
            reader = SysfsReader("mlx5_0", errors, files)
            assert reader.uint(str(tmp_path / "dir")) is None
            assert errors.counts == {("mlx5_0", "io"): 1}
            assert reader.uint(str(tmp_path / "good")) == 1
        kept = len(files) if files is not None else 0
        assert open_fds() == before + kept
        if files is not None:
            files.close()
    assert open_fds() == before
