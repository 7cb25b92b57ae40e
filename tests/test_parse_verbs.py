"""User verbs: whether each RDMA device has its ib_uverbs character device (parse/verbs.py), and its series."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from rdma_exporter.collect.engine import RdmaCollector
from rdma_exporter.config import Config
from rdma_exporter.daemon import build_collector
from rdma_exporter.parse.reader import ReadErrors, SysfsReader
from rdma_exporter.parse.verbs import list_user_verbs, read_user_verbs, user_verbs_dirs
from rdma_exporter.sample_tree import SAMPLE_SPEC, build_tree

from conftest import SYSFS_FIXTURES, record_reads, samples, scrape, symlink

USER_VERBS = "rdma_device_user_verbs"


def exported(families_text: str) -> dict[str, float]:
    return {dict(labels)["device"]: v for (name, labels), v in samples(families_text).items() if name == USER_VERBS}


def gather(collector: RdmaCollector) -> str:
    return collector.gather().render_text().decode()


def test_soft_roce_device_finds_its_uverbs_among_the_virtual_devices() -> None:
    # The real capture: rxe0 has no parent, so ib_uverbs puts uverbs0 under devices/virtual too.
    root = SYSFS_FIXTURES / "debian-6.1-rxe" / "sys"
    dirs = user_verbs_dirs(root, "rxe0")
    where = dirs[0]
    assert where == os.path.realpath(root / "devices" / "virtual" / "infiniband_verbs")
    errors = ReadErrors()
    found = read_user_verbs(dirs, "rxe0", SysfsReader("rxe0", errors), {})
    assert (found.present, found.module_loaded) == (True, True)
    entry = ("uverbs0", os.stat(Path(where) / "uverbs0").st_ino)
    assert [listing.names for listing in found.listings.values()] == [{entry: "rxe0"}]
    assert not errors.counts


def test_card_finds_its_uverbs_under_its_pci_function(tmp_path: Path) -> None:
    root = build_tree(tmp_path / "tree", SAMPLE_SPEC)
    dirs = user_verbs_dirs(root, "mlx5_3")
    assert dirs
    assert Path(dirs[0]).parent == (root / "class" / "infiniband" / "mlx5_3" / "device").resolve()
    assert read_user_verbs(dirs, "mlx5_3", SysfsReader("mlx5_3"), {}).present is True


def test_plain_class_directories_and_a_device_ib_uverbs_did_not_take() -> None:
    root = SYSFS_FIXTURES / "built-multi-driver" / "sys"
    values = exported(scrape(root))
    assert values == {"bnxt_re0": 1, "bnxt_re1": 1, "efa_0": 1, "irdma0": 1, "quirks0": 0}


def test_no_ib_uverbs_means_zero_for_every_device(tmp_path: Path) -> None:
    root = build_tree(tmp_path / "tree", SAMPLE_SPEC)
    shutil.rmtree(root / "class" / "infiniband_verbs")
    for function in (root / "devices").rglob("infiniband_verbs"):
        shutil.rmtree(function)
    text = scrape(root)
    values = exported(text)
    assert len(values) == 10 and set(values.values()) == {0}
    # Absence is the answer, not a failed read.
    assert not [k for k, v in samples(text).items() if k[0] == "rdma_exporter_file_read_errors_total" and v]


def test_uverbs_of_another_device_is_not_this_ones(tmp_path: Path) -> None:
    where = tmp_path / "class" / "infiniband_verbs"
    (where / "uverbs0").mkdir(parents=True)
    (where / "uverbs0" / "ibdev").write_text("mlx5_1\n")
    (where / "abi_version").write_text("6\n")  # the class's own file: no device
    found = read_user_verbs((str(where),), "mlx5_0", SysfsReader("mlx5_0"), {})
    assert (found.present, found.module_loaded) == (False, True)
    assert read_user_verbs((str(where),), "mlx5_1", SysfsReader("mlx5_1"), {}).present is True


def test_a_listing_that_fails_tells_nothing_and_is_counted(tmp_path: Path) -> None:
    loop = tmp_path / "infiniband_verbs"
    loop.symlink_to(loop)  # ELOOP: neither absent nor a listing
    errors = ReadErrors()
    found = read_user_verbs((str(loop),), "mlx5_0", SysfsReader("mlx5_0", errors), {})
    assert (found.present, found.module_loaded) == (None, None)
    assert errors.total() == 1


@pytest.mark.parametrize("broken", ["unreadable", "empty"])
def test_an_entry_that_cannot_be_read_leaves_the_answer_unknown_unless_another_matches(
    tmp_path: Path, broken: str
) -> None:
    where = tmp_path / "class" / "infiniband_verbs"
    if broken == "unreadable":
        (where / "uverbs0" / "ibdev").mkdir(parents=True)  # EISDIR on read
    else:
        (where / "uverbs0").mkdir(parents=True)
        (where / "uverbs0" / "ibdev").write_text("\n")
    errors = ReadErrors()
    assert read_user_verbs((str(where),), "mlx5_0", SysfsReader("mlx5_0", errors), {}).present is None
    assert errors.total() == 1
    # It may be this device's, so no 0; but a second entry naming the device settles it.
    (where / "uverbs1").mkdir()
    (where / "uverbs1" / "ibdev").write_text("mlx5_0\n")
    assert read_user_verbs((str(where),), "mlx5_0", SysfsReader("mlx5_0", ReadErrors()), {}).present is True


def test_a_device_outside_the_sysfs_root_has_no_place_to_look(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    elsewhere = tmp_path / "elsewhere" / "pci" / "infiniband" / "mlx5_0"
    elsewhere.mkdir(parents=True)
    (root / "class" / "infiniband").mkdir(parents=True)
    (root / "class" / "infiniband" / "mlx5_0").symlink_to(elsewhere)
    assert user_verbs_dirs(root, "mlx5_0") == ()


def test_ibdev_is_read_once_per_entry_and_again_when_the_entry_is_recreated(tmp_path: Path) -> None:
    where = tmp_path / "infiniband_verbs"
    (where / "uverbs0").mkdir(parents=True)
    (where / "uverbs0" / "ibdev").write_text("mlx5_0\n")
    first = list_user_verbs(str(where), SysfsReader("mlx5_0"), {})
    assert first is not None and first.names is not None
    assert list(first.names.values()) == ["mlx5_0"]
    # Kept by inode: a changed file under the same entry is not read again...
    (where / "uverbs0" / "ibdev").write_text("mlx5_9\n")
    again = list_user_verbs(str(where), SysfsReader("mlx5_0"), first.names)
    assert again is not None and again.names == first.names
    # ...but an entry re-created (a driver reload: a new kernfs node) is, though its name is the same.
    (where / "new").mkdir()  # made while the old one exists, so that it cannot get the old inode
    (where / "new" / "ibdev").write_text("mlx5_9\n")
    shutil.rmtree(where / "uverbs0")
    (where / "new").rename(where / "uverbs0")
    recreated = list_user_verbs(str(where), SysfsReader("mlx5_0"), first.names)
    assert recreated is not None and recreated.names is not None
    assert list(recreated.names.values()) == ["mlx5_9"]


def test_uverbs_of_siw_on_loopback_are_found_in_the_class_directory(tmp_path: Path) -> None:
    # Kernels 5.3 to 5.17 gave siw on lo a class device as parent, and uverbsN went straight under
    # devices/virtual/net/lo: no infiniband_verbs/ beside siw0's directory. libibverbs finds it through the
    # class directory; so must the exporter, or it says 0 and pages.
    root = tmp_path / "sys"
    lo = root / "devices" / "virtual" / "net" / "lo"
    (lo / "infiniband" / "siw0").mkdir(parents=True)
    (lo / "uverbs0").mkdir()
    (lo / "uverbs0" / "ibdev").write_text("siw0\n")
    symlink(root, "class/infiniband/siw0", "devices/virtual/net/lo/infiniband/siw0")
    symlink(root, "class/infiniband_verbs/uverbs0", "devices/virtual/net/lo/uverbs0")
    dirs = user_verbs_dirs(root, "siw0")
    assert len(dirs) == 2 and not os.path.exists(dirs[0])
    found = read_user_verbs(dirs, "siw0", SysfsReader("siw0"), {})
    assert (found.present, found.module_loaded) == (True, True)


def test_running_collector_sees_ib_uverbs_unloaded_and_loaded_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without udev (rescan mode) the device's static info stays cached for minutes; ib_uverbs going away
    # changes no RDMA device, so the next scrape must tell from its own listing, not from that cache.
    root = build_tree(tmp_path / "tree", SAMPLE_SPEC)
    collector = build_collector(replace(Config(), sysfs=root))

    def scrape() -> tuple[dict[str, float], float | None]:
        text = gather(collector)
        return exported(text), samples(text).get(("rdma_user_verbs_loaded", ()))

    values, loaded = scrape()
    assert set(values.values()) == {1} and loaded == 1
    # ib_uverbs did not take mlx5_2 (its entry and its class link gone): 0 for it alone, still loaded.
    function = (root / "class" / "infiniband" / "mlx5_2" / "device").resolve()
    (function / "infiniband_verbs").rename(tmp_path / "uverbs2-dir")
    (root / "class" / "infiniband_verbs" / "uverbs2").rename(tmp_path / "uverbs2-link")
    values, loaded = scrape()
    assert values["mlx5_2"] == 0 and values["mlx5_1"] == 1 and loaded == 1
    # ib_uverbs unloaded: every entry and the class directory go.
    functions = [(root / "class" / "infiniband" / f"mlx5_{i}" / "device").resolve() for i in range(10) if i != 2]
    for i, other in enumerate(functions):
        (other / "infiniband_verbs").rename(tmp_path / f"dir{i}")
    (root / "class" / "infiniband_verbs").rename(tmp_path / "class-dir")
    values, loaded = scrape()
    assert set(values.values()) == {0} and len(values) == 10 and loaded == 0
    # Loaded again: each entry's ibdev is read once more (they are new to the reader), then not again.
    (tmp_path / "class-dir").rename(root / "class" / "infiniband_verbs")
    (tmp_path / "uverbs2-link").rename(root / "class" / "infiniband_verbs" / "uverbs2")
    (tmp_path / "uverbs2-dir").rename(function / "infiniband_verbs")
    for i, other in enumerate(functions):
        (tmp_path / f"dir{i}").rename(other / "infiniband_verbs")
    opened = record_reads(monkeypatch)
    values, loaded = scrape()
    assert set(values.values()) == {1} and loaded == 1
    assert len([p for p in opened if p.endswith("/ibdev")]) == 10
    opened.clear()
    scrape()
    assert [p for p in opened if p.endswith("/ibdev")] == []


def test_a_device_renamed_in_place_finds_its_uverbs_under_the_new_name(tmp_path: Path) -> None:
    # `rdma dev set mlx5_0 name ibp0`: the device's directory and class link take the new name; its uverbs
    # entry stays (same inode) and its ibdev prints the new name. Cached by entry alone, the old name never
    # matched again: 0 until a restart, and a page (review).
    root = build_tree(tmp_path / "tree", SAMPLE_SPEC)
    collector = build_collector(replace(Config(), sysfs=root))
    assert exported(gather(collector))["mlx5_0"] == 1
    link = root / "class" / "infiniband" / "mlx5_0"
    old = link.resolve()
    old.rename(old.with_name("ibp0"))
    link.unlink()
    symlink(root, "class/infiniband/ibp0", str(old.with_name("ibp0").relative_to(root)))
    for ibdev in (old.parent.parent / "infiniband_verbs").glob("*/ibdev"):
        ibdev.write_text("ibp0\n")
    values = exported(gather(collector))
    assert values["ibp0"] == 1 and "mlx5_0" not in values


def test_devices_sharing_a_directory_read_no_ibdev_in_a_steady_scrape(monkeypatch: pytest.MonkeyPatch) -> None:
    # Soft devices share devices/virtual/infiniband_verbs (here, a plain class directory): each device's
    # read keeps every entry it listed, not only up to its own (review: the cache thrashed, O(n^2) reads).
    collector = build_collector(replace(Config(), sysfs=SYSFS_FIXTURES / "built-multi-driver" / "sys"))
    gather(collector)
    opened = record_reads(monkeypatch)
    gather(collector)
    assert [p for p in opened if p.endswith("/ibdev")] == []
