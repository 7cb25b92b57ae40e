"""Parse `/sys/class/infiniband_verbs`: whether an RDMA device has its user-verbs character device.

The ib_uverbs module gives every RDMA device that supports user contexts a `uverbsN` device (the
/dev/infiniband/uverbsN that libibverbs opens), registered under the RDMA device's own parent: the PCI
function's `infiniband_verbs/` for a card, `devices/virtual/infiniband_verbs/` for soft RoCE and iWARP.
Its `ibdev` file names the RDMA device. Without it the kernel side and the links are all well, yet no
verbs application (NCCL, MPI, UCX) can open the device: NCCL falls back to TCP sockets.

Pure functions over a sysfs root; no Prometheus imports.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from .reader import REASON_MALFORMED, SysfsReader, reason_for_errno

_UVERBS: Final = re.compile(r"uverbs[0-9]+")

# A listed uverbs entry: (name, inode). A driver reload re-creates it under a new inode (kernfs numbers
# re-created nodes anew), possibly under the same name for another device.
VerbsEntry = tuple[str, int]


def user_verbs_dir(sys_root: Path, device: str) -> str | None:
    """Where ib_uverbs puts the device's `uverbsN`: beside its `infiniband/` directory, under the same parent.

    On a fixture tree whose class/infiniband entries are plain directories that is class/infiniband_verbs.
    None when the device's directory resolves outside the sysfs root (a link into another tree).
    """
    root = os.path.realpath(sys_root)
    device_dir = os.path.realpath(sys_root / "class" / "infiniband" / device)
    parent = os.path.dirname(os.path.dirname(device_dir))
    if os.path.commonpath((root, parent)) != root:
        return None
    return os.path.join(parent, "infiniband_verbs")


@dataclass(frozen=True, slots=True)
class UserVerbs:
    """One scrape's answer for a device: `present` is None when it cannot be known (a listing or an `ibdev`
    read failed). `names` is the `ibdev` of every entry listed, kept so the next read need not open them."""

    present: bool | None
    names: dict[VerbsEntry, str] = field(default_factory=dict)


def read_user_verbs(
    verbs_dir: str, device: str, reader: SysfsReader, known: Mapping[VerbsEntry, str]
) -> UserVerbs:
    """Whether `device` has a `uverbsN` in `verbs_dir`. Each entry's `ibdev` is read once per inode:
    `known` holds what earlier reads found, so a steady scrape only lists the directory."""
    reader.at = verbs_dir
    try:
        with os.scandir(verbs_dir) as listing:
            entries = [(e.name, e.inode()) for e in listing if _UVERBS.fullmatch(e.name)]
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return UserVerbs(False)  # no ib_uverbs, or none of its devices under this parent
        reader.fail(reason_for_errno(exc.errno), verbs_dir, exc.strerror or str(exc))
        return UserVerbs(None)
    names: dict[VerbsEntry, str] = {}
    unknown = False
    # Not through the device's kept files: this is read once per entry, not every scrape.
    once = SysfsReader(reader.device, reader.errors)
    for entry in entries:
        name = known.get(entry)
        if name is None:
            path = os.path.join(verbs_dir, entry[0], "ibdev")
            reader.at = path
            name = once.text(path)
            if name is None:  # unreadable (counted), or gone since the listing: this scrape cannot tell
                unknown = True
                continue
            if not name:
                once.fail(REASON_MALFORMED, path, "empty: names no RDMA device")
                unknown = True
                continue
        names[entry] = name
        if name == device:
            return UserVerbs(True, names)
    return UserVerbs(None if unknown else False, names)
