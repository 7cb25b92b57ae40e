"""The package as it ships: the wheel that README's first command and the Dockerfile build and install.

The rest of the suite imports the exporter from the checkout (an editable install), so a module left out
of the wheel, a console script pointing at a renamed function or code that reads a file beside the source
would pass everything there and fail on the first real install. Here the wheel is built from the
checkout, installed into a new venv, and its `rdma-exporter` runs from a directory outside the checkout.
"""

from __future__ import annotations

import base64
import fnmatch
import glob
import json
import os
import posixpath
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import bcrypt
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from test_daemon_http import RunningDaemon, get
from test_deploy import floor_of, pinned_versions, pyproject

from rdma_exporter import __version__

from conftest import promtool_check_metrics, samples, skip_or_fail

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

    env = outside_checkout()
    daemon = RunningDaemon(tmp_path, ["--sample"], command=[installed / "bin" / "rdma-exporter"], env=env, cwd=tmp_path)
    try:
        answer = get(daemon.port, timeout=30)
    finally:
        returncode = daemon.stop()
    assert answer.status == 200, answer.body[:500]
    series = samples(answer.body.decode())
    assert series[("rdma_exporter_sample_tree", ())] == 1
    assert series[("rdma_exporter_devices", ())] == 10
    assert not failed_collectors(series), failed_collectors(series)
    # Every source of the sample tree answered from the installed code: ports, netdevs, ethtool, PCIe.
    names = {name for name, _ in series}
    for family in ("rdma_port_state_id", "rdma_netdev_up", "rdma_pcie_link_width_lanes"):
        assert family in names, family
    assert any(name.startswith("rdma_ethtool_") for name in names)
    assert returncode == 0, daemon.log()


def outside_checkout() -> dict[str, str]:
    """This environment without PYTHONPATH, which could put the checkout's package before the venv's."""
    return {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}


def failed_collectors(series: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> dict[object, float]:
    return {key: value for key, value in series.items()
            if key[0] == "rdma_exporter_scrape_collector_success" and value != 1}  # fmt: skip


def declared_floors() -> tuple[str, dict[str, str]]:
    """pyproject's `requires-python` floor and each runtime dependency's: the oldest versions the package
    says it runs on, and so the ones a node that already has older packages may end up running."""
    project = pyproject()["project"]
    python = re.fullmatch(r">=(\d+\.\d+)", project["requires-python"])
    assert python, f"pyproject.toml: requires-python {project['requires-python']!r} is not >=X.Y"
    requirements = [Requirement(text) for text in project["dependencies"]]
    return python.group(1), {requirement.name: floor_of(requirement) for requirement in requirements}


def find_python(version: str) -> Path | None:
    """An interpreter of `version` (e.g. "3.10"): pyenv's, else one on PATH; a pyenv shim on PATH for a
    version not selected fails when run, so each candidate is asked its version."""
    candidates = sorted((Path.home() / ".pyenv" / "versions").glob(f"{version}.*/bin/python{version}"), reverse=True)
    on_path = shutil.which(f"python{version}")
    for candidate in [*candidates, *([Path(on_path)] if on_path else [])]:
        asked = subprocess.run(
            [candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True, text=True, timeout=60,
        )
        if asked.returncode == 0 and asked.stdout.strip() == version:
            return candidate
    return None


def fabric_series(exposition: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """What the exporter says of the fabric: every series but its own and the process's, which differ by
    interpreter and run."""
    return {key: value for key, value in samples(exposition).items()
            if key[0].startswith("rdma_") and not key[0].startswith("rdma_exporter_")}


LOGIN = ("prometheus", "floors-test-password")


def write_config(workdir: Path) -> Path:
    """A config file (PyYAML parses it) naming a web config with a basic-auth user (bcrypt checks the
    login), as a deployment would have them."""
    hashed = bcrypt.hashpw(LOGIN[1].encode(), bcrypt.gensalt(4)).decode()
    (workdir / "web-config.yml").write_text(f"basic_auth_users:\n  {LOGIN[0]}: '{hashed}'\n")
    config = workdir / "rdma-exporter.yml"
    config.write_text("web:\n  config_file: web-config.yml\nlog:\n  level: info\n")
    return config


def serve_sample(command: Path, workdir: Path) -> str:
    env = outside_checkout()
    config = write_config(workdir)
    daemon = RunningDaemon(workdir, ["--sample", "--config.file", str(config)], command=[command], env=env, cwd=workdir)
    login = "Basic " + base64.b64encode(":".join(LOGIN).encode()).decode()
    try:
        refused = get(daemon.port, timeout=30)
        answer = get(daemon.port, headers={"Authorization": login}, timeout=30)
    finally:
        returncode = daemon.stop()
    assert refused.status == 401 and answer.status == 200 and returncode == 0, daemon.log()
    return answer.body.decode()


def uevents_monitored(command: Path, workdir: Path) -> str:
    """The daemon's device-discovery line on the host's own /sys, where it starts pyudev's monitor."""
    env = outside_checkout()
    daemon = RunningDaemon(workdir, ["--path.sysfs", "/sys"], command=[command], env=env, cwd=workdir)
    try:
        deadline = time.monotonic() + 30
        while "device discovery:" not in daemon.log() and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        daemon.stop()
    return next((line for line in daemon.log().splitlines() if "device discovery:" in line), daemon.log())


def release(version: str) -> tuple[int, ...]:
    """"4" and "4.0.0" alike: a floor of bcrypt>=4 installs as 4.0.0."""
    numbers = tuple(int(part) for part in version.split("."))
    return numbers + (0,) * (3 - len(numbers))


NEWER_PYTHONS = ("3.14", "3.13", "3.12")


@pytest.mark.parametrize("which", ["oldest", "newest"])
def test_the_oldest_and_newest_supported_pythons_serve_what_this_one_does(
    which: str, installed: Path, tmp_path: Path
) -> None:
    # README says "Python 3.10 or later" and pyproject gives each dependency a floor; neither is what the
    # rest of the suite runs. Ubuntu 22.04 nodes run 3.10, Debian 13 runs 3.13, and a venv made with
    # --system-site-packages on an older distribution keeps its older prometheus-client or PyYAML. So
    # the wheel goes into a venv of the oldest Python with every dependency at its floor, and of the
    # newest Python found with the newest dependencies (from the package index), and each must serve the
    # sample tree exactly as this interpreter's install does, with a config file (PyYAML) and a basic-auth
    # login (bcrypt), and start the uevent monitor (pyudev) on this host's /sys.
    python_floor, floors = declared_floors()
    if which == "oldest":
        version, requirements = python_floor, [f"{name}=={floor}" for name, floor in floors.items()]
        interpreter = find_python(version)
    else:
        version, interpreter = next(
            ((found, path) for found in NEWER_PYTHONS if (path := find_python(found))), ("", None)
        )
        requirements = list(floors)
    if interpreter is None:
        skip_or_fail(f"no Python {version or ' or '.join(NEWER_PYTHONS)} (pyenv's or on PATH; the machine's image "
                     "has pyenv's 3.10 to 3.13)")
    if version == f"{sys.version_info.major}.{sys.version_info.minor}":
        pytest.skip(f"Python {version} is the one running the suite: its install is tested already")
    (wheel,) = installed.parent.glob("rdma_exporter-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([interpreter, "-m", "venv", str(venv)], check=True, timeout=120)
    index = subprocess.run([venv / "bin" / "python", "-m", "pip", "index", "versions", "bcrypt"],
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    if index.returncode != 0:
        skip_or_fail(f"the package index is not reachable: {index.stderr.strip()[-300:]}")
    install = subprocess.run(
        [venv / "bin" / "python", "-m", "pip", "install", "--no-cache-dir", str(wheel), *requirements],
        capture_output=True, text=True, timeout=600,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    if which == "oldest":
        got = subprocess.run(
            [venv / "bin" / "python", "-c",
             "import importlib.metadata as m, sys; print(' '.join(m.version(n) for n in sys.argv[1:]))", *floors],
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout.split()
        assert [release(v) for v in got] == [release(v) for v in floors.values()], (got, floors)

    theirs = serve_sample(venv / "bin" / "rdma-exporter", tmp_path)
    ours = serve_sample(installed / "bin" / "rdma-exporter", tmp_path)
    # pyudev's monitor: only a real sysfs starts it, so this host's, with no RDMA devices. Where this
    # interpreter's install cannot start it either (no uevent socket), there is nothing to compare.
    ours_discovery = uevents_monitored(installed / "bin" / "rdma-exporter", tmp_path)
    if "device discovery: udev" not in ours_discovery:
        skip_or_fail(f"no udev monitor here, for this interpreter's install either: {ours_discovery}")
    discovery = uevents_monitored(venv / "bin" / "rdma-exporter", tmp_path)
    assert "device discovery: udev" in discovery, discovery
    promtool_check_metrics(theirs)
    theirs_series, ours_series = fabric_series(theirs), fabric_series(ours)
    assert len(ours_series) > 1000  # the sample tree's fabric, not an empty answer twice
    assert theirs_series == ours_series, sorted(set(theirs_series.items()) ^ set(ours_series.items()))[:20]
    assert not failed_collectors(samples(theirs)), failed_collectors(samples(theirs))


def dockerignored(root: Path) -> Callable[[str, list[str]], set[str]]:
    """A copytree `ignore` that leaves out what .dockerignore keeps out of the build context, by Docker's
    rules for the patterns this project uses: a bare pattern is anchored at the context's root and matched
    a path component at a time (`*` stops at `/`); `**/` in front matches at any depth. Any other form
    is refused, so that the emulation cannot silently keep a file Docker would leave out."""
    lines = [line.strip() for line in (root / ".dockerignore").read_text().splitlines()]
    # As Docker reads them: cleaned, and relative to the context's root whether or not they begin with /.
    patterns = [posixpath.normpath(line).lstrip("/") for line in lines if line and not line.startswith("#")]
    for pattern in patterns:
        body = pattern.removeprefix("**/")
        assert not pattern.startswith("!") and "**" not in body, f".dockerignore: no emulation for {pattern!r}"

    def ignored(directory: str, names: list[str]) -> set[str]:
        parts = Path(directory).relative_to(root).parts
        out = set()
        for name in names:
            path = (*parts, name)
            for pattern in patterns:
                if pattern.startswith("**/"):
                    hit = fnmatch.fnmatchcase(name, pattern[3:])
                else:
                    wanted = pattern.split("/")
                    hit = len(wanted) == len(path) and all(map(fnmatch.fnmatchcase, path, wanted))
                if hit:
                    out.add(name)
        return out

    return ignored


NETWORK_TROUBLE = ("NewConnectionError", "Max retries exceeded", "Temporary failure in name resolution",
                   "ReadTimeoutError", "Network is unreachable")  # fmt: skip


def pip_step(pip: list[str], argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
    """One pip command that asks the package index: a network failure is a skip (a failure under CI)."""
    done = subprocess.run([*pip, *argv], capture_output=True, text=True, timeout=600, cwd=cwd, env=env)
    if done.returncode != 0 and any(trouble in done.stdout + done.stderr for trouble in NETWORK_TROUBLE):
        skip_or_fail(f"the package index stopped answering: {done.stderr.strip()[-300:]}")
    assert done.returncode == 0, f"pip {' '.join(argv)}\n{done.stdout}{done.stderr}"


def wheel_generator(wheels: Path) -> str:
    """The WHEEL file of the one exporter wheel in `wheels`: its Generator line names the setuptools that
    built it."""
    (wheel,) = wheels.glob("rdma_exporter-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [name for name in archive.namelist() if name.endswith(".dist-info/WHEEL")]
        return archive.read(name).decode()


def test_the_dockerfile_pip_steps_install_the_pinned_versions(installed: Path, tmp_path: Path) -> None:
    # No Docker daemon here, so the Dockerfile's two pip steps run as written (with their environment
    # assignments), in a venv of this Python, with the build context (the checkout less .dockerignore,
    # symlinks kept as COPY keeps them) for /src and a directory for /wheels. What is checked: the pinned
    # set resolves from the index and installs without it, the image gets exactly deploy/constraints.txt's
    # versions and nothing else, the exporter's wheel is built by the pinned setuptools, and that install
    # serves what the wheel does.
    dockerfile = re.sub(r"\\\n\s*", "", (ROOT / "Dockerfile").read_text())  # continuation lines joined
    steps = re.findall(r"(?m)^RUN ((?:[A-Z_]+=\S+ )*pip .*)$", dockerfile)
    assert [re.sub(r"^(?:[A-Z_]+=\S+ )*pip ", "", step).split()[0] for step in steps] == ["wheel", "install"], steps
    context, wheels = tmp_path / "src", tmp_path / "wheels"
    shutil.copytree(ROOT, context, symlinks=True, ignore=dockerignored(ROOT))
    assert (context / "deploy" / "constraints.txt").is_file() and not (context / ".git").exists()
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    index = subprocess.run([*pip, "index", "versions", "--retries", "1", "--timeout", "15", "bcrypt"],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    if index.returncode != 0:
        skip_or_fail(f"the package index is not reachable: {index.stderr.strip()[-300:]}")
    for step in steps:
        command = step.split(" && ")[0].replace("/src", str(context)).replace("/wheels", str(wheels))
        words = command.split()
        env = dict(outside_checkout())
        while "=" in words[0]:
            key, value = words.pop(0).split("=", 1)
            env[key] = value
        argv = [expanded for word in words[1:] for expanded in sorted(glob.glob(word)) or [word]]
        if argv[0] == "wheel":
            wheel_argv, wheel_env = argv, env
        pip_step(pip, argv, tmp_path, env)

    pins = pinned_versions()
    assert f"Generator: setuptools ({pins['setuptools']})" in wheel_generator(wheels)
    # The pin reaches pip's isolated build environment (--constraint does not): built again with
    # setuptools held to pyproject's floor release, the wheel says so, whatever the newest release is.
    (backend,) = [Requirement(text) for text in pyproject()["build-system"]["requires"]]
    assert backend.name == "setuptools", backend
    floor = floor_of(backend)
    constraints = context / "deploy" / "constraints.txt"
    major = int(floor.split(".")[0])
    constraints.write_text(re.sub(r"(?m)^setuptools==\S+", f"setuptools>={floor},<{major + 1}",
                                  constraints.read_text()))  # fmt: skip
    # With this Python's own pip (which reads PIP_CONSTRAINT there) and with a pip of 25.3 or later (which
    # reads only PIP_BUILD_CONSTRAINT there), as the image's pip may be after a base-image update.
    for upgrade in ([], ["pip==26.3"]):
        if upgrade:
            pip_step(pip, ["install", "--quiet", *upgrade], tmp_path)
        for built in wheels.glob("rdma_exporter-*.whl"):
            built.unlink()
        pip_step(pip, [*wheel_argv, "--no-deps"], tmp_path, wheel_env)
        assert f"Generator: setuptools ({major}." in wheel_generator(wheels), upgrade
    listed = subprocess.run([*pip, "list", "--format", "json"], capture_output=True, text=True, timeout=60, check=True)
    got = {canonicalize_name(item["name"]): item["version"] for item in json.loads(listed.stdout)}
    _, floors = declared_floors()
    expected = {canonicalize_name(name): pins[canonicalize_name(name)] for name in floors}
    expected["rdma-exporter"] = __version__
    bundled = {name for name in ("pip", "setuptools", "wheel") if name not in expected}  # ensurepip's own
    assert {name: version for name, version in got.items() if name not in bundled} == expected

    theirs = serve_sample(venv / "bin" / "rdma-exporter", tmp_path)
    ours = serve_sample(installed / "bin" / "rdma-exporter", tmp_path)
    assert len(fabric_series(ours)) > 1000 and fabric_series(theirs) == fabric_series(ours)
    assert not failed_collectors(samples(theirs)), failed_collectors(samples(theirs))
