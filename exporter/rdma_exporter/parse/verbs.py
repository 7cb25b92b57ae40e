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


def user_verbs_dirs(sys_root: Path, device: str) -> tuple[str, ...]:
    """Where to look for the device's `uverbsN`, in order, resolved once with its static info.

    First beside its `infiniband/` directory, under the same parent, where ib_uverbs registers it; then
    ib_uverbs' class directory, which libibverbs scans and which also holds the entries whose parent has
    no infiniband_verbs/ (siw on loopback, kernels 5.3 to 5.17, registers uverbsN straight under
    devices/virtual/net/lo). One directory where the two are the same (a fixture tree whose class/infiniband
    entries are plain directories). None at all when the device's directory resolves outside the sysfs
    root (a link into another tree).
    """
    root = os.path.realpath(sys_root)
    device_dir = os.path.realpath(sys_root / "class" / "infiniband" / device)
    parent = os.path.dirname(os.path.dirname(device_dir))
    if os.path.commonpath((root, parent)) != root:
        return ()
    beside = os.path.join(parent, "infiniband_verbs")
    class_dir = os.path.join(root, "class", "infiniband_verbs")
    return (beside,) if beside == class_dir else (beside, class_dir)


@dataclass(frozen=True, slots=True)
class VerbsListing:
    """The uverbs entries of one directory and the RDMA device each `ibdev` names. `names` is None when
    the directory does not exist; `complete` is False when an entry's `ibdev` could not be read."""

    names: dict[VerbsEntry, str] | None
    complete: bool = True


def list_user_verbs(directory: str, reader: SysfsReader, known: Mapping[VerbsEntry, str]) -> VerbsListing | None:
    """Every uverbsN of `directory` with the device it names; None when the listing failed (counted).
    Each entry's `ibdev` is read once per inode: `known` holds what earlier listings found."""
    reader.at = directory
    try:
        with os.scandir(directory) as listing:
            entries = [(e.name, e.inode()) for e in listing if _UVERBS.fullmatch(e.name)]
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return VerbsListing(None)
        reader.fail(reason_for_errno(exc.errno), directory, exc.strerror or str(exc))
        return None
    names: dict[VerbsEntry, str] = {}
    complete = True
    # Not through the device's kept files: this is read once per entry, not every scrape.
    once = SysfsReader(reader.device, reader.errors)
    for entry in entries:
        name = known.get(entry)
        if name is None:
            path = os.path.join(directory, entry[0], "ibdev")
            reader.at = path
            name = once.text(path)
            if name is None:  # unreadable (counted), or gone since the listing: this scrape cannot tell
                complete = False
                continue
            if not name:
                once.fail(REASON_MALFORMED, path, "empty: names no RDMA device")
                complete = False
                continue
        names[entry] = name
    return VerbsListing(names, complete)


@dataclass(frozen=True, slots=True)
class UserVerbs:
    """One scrape's answer for a device. `present`: whether it has a uverbsN; `module_loaded`: whether
    ib_uverbs is loaded at all (its class directory exists). Either is None when it cannot be told (a
    listing or an `ibdev` read failed). `listings`: each directory read, for the next scrape's `known`."""

    present: bool | None
    module_loaded: bool | None
    listings: dict[str, VerbsListing] = field(default_factory=dict)


def read_user_verbs(
    dirs: tuple[str, ...], device: str, reader: SysfsReader, known: Mapping[str, Mapping[VerbsEntry, str]]
) -> UserVerbs:
    """Whether `device` has a uverbsN, looked for in `dirs` (user_verbs_dirs) in order: one listing a scrape
    in the common case. The last of them is the class directory, which exists exactly while ib_uverbs is
    loaded."""
    listings: dict[str, VerbsListing] = {}
    for where in dirs:
        found = list_user_verbs(where, reader, known.get(where, {}))
        if found is None:
            return UserVerbs(None, None, listings)
        listings[where] = found
        if found.names and device in found.names.values():
            return UserVerbs(True, True, listings)
    if listings[dirs[-1]].names is None:
        return UserVerbs(False, False, listings)
    return UserVerbs(False if all(listing.complete for listing in listings.values()) else None, True, listings)
