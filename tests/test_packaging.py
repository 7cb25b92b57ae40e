"""The package as it ships: the wheel that README's first command and the Dockerfile build and install.

The rest of the suite imports the exporter from the checkout (an editable install), so a module left out
of the wheel, a console script pointing at a renamed function or code that reads a file beside the source
would pass everything there and fail on the first real install. Here the wheel is built from the
checkout, installed into a new venv, and its `rdma-exporter` runs from a directory outside the checkout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from test_daemon_http import RunningDaemon, get

from rdma_exporter import __version__

from conftest import samples

ROOT = Path(__file__).resolve().parent.parent


def build_wheel(dest: Path) -> Path:
    """The wheel `pip install .` would build, from a copy of what the build reads: building in the
    checkout would leave build/ there, whose stale copies of removed modules later builds pick up."""
    source = dest / "source"
    shutil.copytree(ROOT / "exporter", source / "exporter", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in"):
        shutil.copy2(ROOT / name, source / name)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(dest),
         str(source)],
        capture_output=True, text=True, timeout=300,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = dest.glob("rdma_exporter-*.whl")
    return wheel


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with the wheel built from the checkout; its dependencies come from this interpreter's
    site-packages (no index is asked), the exporter itself only from the wheel.

    Not `--system-site-packages`: run from a venv (as README advises on Debian 12 and Ubuntu 24.04), that
    gives the base interpreter's site-packages, without the dependencies the outer venv installed. A
    .pth file lists this interpreter's own instead; its directories come after the new venv's, and the
    .pth files in them (the checkout's editable install) are not processed, so the exporter is the wheel's.
    """
    work = tmp_path_factory.mktemp("packaging")
    wheel = build_wheel(work)
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    purelib = subprocess.run(
        [venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout.strip()
    ours = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    (Path(purelib) / "outer-site-packages.pth").write_text("".join(f"{path}\n" for path in ours))
    install = subprocess.run(
        # --force-reinstall: through the .pth, pip sees an rdma-exporter installed outside the venv (README's
        # `pip install .`) and, at the same version, would skip the wheel.
        [venv / "bin" / "python", "-m", "pip", "install", "--force-reinstall", "--no-deps", "--no-index", str(wheel)],
        capture_output=True, text=True, timeout=300,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    return venv


def test_the_wheel_carries_the_package_only(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    assert wheel.name.startswith(f"rdma_exporter-{__version__}-")
    names = zipfile.ZipFile(wheel).namelist()
    modules = {name for name in names if name.endswith(".py")}
    shipped = {
        str(path.relative_to(ROOT / "exporter")) for path in (ROOT / "exporter" / "rdma_exporter").rglob("*.py")
    }
    assert modules == shipped  # every module of the package, nothing from tests/, bench/ or scripts/
    assert not [name for name in names if name.startswith(("tests/", "bench/", "rules/", "grafana/"))]


def test_the_installed_command_serves_the_sample_tree(installed: Path, tmp_path: Path) -> None:
    # README's first command: a bare run on a machine without RDMA hardware serves the bundled sample.
    probe = subprocess.run(
        [installed / "bin" / "python", "-c", "import rdma_exporter; print(rdma_exporter.__file__)"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, check=True,
    )
    assert Path(probe.stdout.strip()).is_relative_to(installed), probe.stdout  # not the checkout's copy
    version = subprocess.run(
        [installed / "bin" / "rdma-exporter", "--version"], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert version.returncode == 0 and __version__ in version.stdout + version.stderr, version

    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    daemon = RunningDaemon(tmp_path, ["--sample"], command=[installed / "bin" / "rdma-exporter"], env=env, cwd=tmp_path)
    try:
        answer = get(daemon.port, timeout=30)
    finally:
        returncode = daemon.stop()
    assert answer.status == 200, answer.body[:500]
    series = samples(answer.body.decode())
    assert series[("rdma_exporter_sample_tree", ())] == 1
    assert series[("rdma_exporter_devices", ())] == 10
    failed = {key: value for key, value in series.items() if key[0] == "rdma_exporter_scrape_collector_success"
              and value != 1}
    assert not failed, failed
    # Every source of the sample tree answered from the installed code: ports, netdevs, ethtool, PCIe.
    names = {name for name, _ in series}
    for family in ("rdma_port_state_id", "rdma_netdev_up", "rdma_pcie_link_width_lanes"):
        assert family in names, family
    assert any(name.startswith("rdma_ethtool_") for name in names)
    assert returncode == 0, daemon.log()
