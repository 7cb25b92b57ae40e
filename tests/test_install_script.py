"""scripts/install-test-deps.sh, run against stand-in apt tools on PATH: the real ones would change the
machine. The stand-ins act as a container image with cleaned package lists does: `apt-cache depends`
exits 100 until `apt-get update` ran. The VM kernel package and Prometheus 3's packages they hand out
are real .debs built by dpkg-deb, which the script unpacks with the real dpkg-deb."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import require_binary, skip_or_fail

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "install-test-deps.sh"
KERNEL = "linux-image-6.1.0-99-amd64"

STUBS = {
    # Every Debian package the script checks for is installed already.
    "dpkg-query": 'printf "install ok installed"\n',
    "apt-cache": f"""
[ -e "$STATE/updated" ] || {{ echo "E: No packages found" >&2; exit 100; }}
echo "linux-image-amd64"
echo "  Depends: {KERNEL}"
""",
    "apt-get": f"""
echo "apt-get $*" >> "$STATE/apt-get.log"
case " $* " in
  *" update "*) touch "$STATE/updated" ;;
  *" download "*)
    case "${{@: -1}}" in
      {KERNEL}-unsigned) cp "$STATE/kernel.deb" "./{KERNEL}-unsigned.deb" ;;
      prometheus-alertmanager) cp "$STATE"/prometheus3/*.deb . ;;
      *) exit 100 ;;
    esac ;;
esac
# What a private apt was pointed at and configured with (Prometheus 3's fetch), kept for the tests.
previous=""
for option in "$@"; do
  case "$option" in Dir::Etc::SourceList=*) cp "${{option#*=}}" "$STATE/sources.list" ;; esac
  [ "$previous" != "-c" ] || cp "$option" "$STATE/apt.conf"
  previous="$option"
done
""",
    # The project's own install is not what is under test.
    "python3": 'echo "python3 $*" >> "$STATE/python3.log"\n',
}


PROMETHEUS3_PACKAGES = {
    "prometheus": ["prometheus"],
    "promtool": ["promtool"],
    "prometheus-alertmanager": ["prometheus-alertmanager", "amtool"],
}


def build_deb(tree: Path, deb: Path, name: str, version: str, files: dict[str, str]) -> None:
    """A real .deb of `files` (path -> text; executable when it starts with #!)."""
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN" / "control").write_text(
        f"Package: {name}\nVersion: {version}\nArchitecture: amd64\nMaintainer: test <t@example.org>\n"
        "Description: stand-in\n"
    )
    for path, text in files.items():
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).write_text(text)
        if text.startswith("#!"):
            (tree / path).chmod(0o755)
    subprocess.run(["dpkg-deb", "--build", str(tree), str(deb)], check=True, capture_output=True)


@pytest.fixture
def stubbed(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    require_binary("dpkg-deb")
    project = tmp_path / "project"
    (project / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPT, project / "scripts" / SCRIPT.name)
    state = tmp_path / "state"
    state.mkdir()
    build_deb(tmp_path / "kernel", state / "kernel.deb", f"{KERNEL}-unsigned", "1",
              {"boot/vmlinuz-6.1.0-99-amd64": "not a kernel\n"})  # fmt: skip
    (state / "prometheus3").mkdir()
    for name, binaries in PROMETHEUS3_PACKAGES.items():
        files = {f"usr/bin/{binary}": f"#!/bin/sh\necho {binary}\n" for binary in binaries}
        build_deb(tmp_path / name, state / "prometheus3" / f"{name}_3.5.3+ds1-6_amd64.deb", name, "3.5.3+ds1-6", files)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in STUBS.items():
        stub = bin_dir / name
        stub.write_text("#!/usr/bin/env bash\nset -eu\n" + body)
        stub.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "STATE": str(state),
        "RDMA_EXPORTER_VM_CACHE": str(tmp_path / "cache"),
        "RDMA_EXPORTER_PROMETHEUS3_DIR": str(tmp_path / "prometheus3"),
    }
    return project, env


def run(project: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    if os.geteuid() != 0:
        skip_or_fail("the script calls apt through sudo when not root; the stand-ins are not sudo's PATH")
    return subprocess.run(
        ["bash", str(project / "scripts" / SCRIPT.name)], env=env, capture_output=True, text=True, timeout=60
    )


def test_cleaned_package_lists_are_updated_then_the_kernel_is_fetched(stubbed: tuple[Path, dict[str, str]]) -> None:
    project, env = stubbed
    result = run(project, env)
    assert result.returncode == 0, result.stderr
    state = Path(env["STATE"])
    log = (state / "apt-get.log").read_text().splitlines()
    assert log[0] == "apt-get update -qq"
    assert log[1].endswith(f"download -qq -o APT::Sandbox::User=root {KERNEL}-unsigned")
    assert len(log) == 4, log  # then Prometheus 3's update and download
    cache = Path(env["RDMA_EXPORTER_VM_CACHE"])
    assert (cache / "kernel" / "boot" / "vmlinuz-6.1.0-99-amd64").read_text() == "not a kernel\n"
    pip = "python3 -m pip install --quiet --disable-pip-version-check --constraint deploy/constraints.txt -e .[test]\n"
    assert (state / "python3.log").read_text() == pip

    # A second run finds the kernel and Prometheus 3 in their caches and asks apt nothing.
    result = run(project, env)
    assert result.returncode == 0, result.stderr
    assert (state / "apt-get.log").read_text().splitlines() == log


def test_no_kernel_package_after_an_update_is_a_clear_failure(stubbed: tuple[Path, dict[str, str]]) -> None:
    project, env = stubbed
    (project.parent / "bin" / "apt-cache").write_text("#!/usr/bin/env bash\nexit 100\n")
    result = run(project, env)
    assert result.returncode == 1
    assert "apt knows no linux-image-amd64 dependency" in result.stderr
    assert not (Path(env["STATE"]) / "python3.log").exists()


def test_prometheus3_is_fetched_by_a_private_apt_and_unpacked(stubbed: tuple[Path, dict[str, str]]) -> None:
    """Debian testing's packages, through apt with its own state and sources (the machine's package lists
    and sources are not touched) and the suite's signature checked against Debian's archive keyring;
    unpacked, never installed."""
    project, env = stubbed
    result = run(project, env)
    assert result.returncode == 0, result.stderr
    state = Path(env["STATE"])
    calls = [line.split() for line in (state / "apt-get.log").read_text().splitlines()]
    private = [call for call in calls if any(arg.startswith("Dir::State=") for arg in call)]
    assert [call[-1] for call in private] == ["update", "prometheus-alertmanager"]
    assert private[1][-3:] == ["prometheus", "promtool", "prometheus-alertmanager"]
    for call in private:
        options = {arg.partition("=")[0]: arg.partition("=")[2] for arg in call if "=" in arg}
        assert options["Dir::State::status"] == "/dev/null"
        assert options["Dir::Etc::SourceParts"] == "/dev/null"
        for key in ("Dir::State", "Dir::State::Lists", "Dir::Cache", "Dir::Etc::SourceList"):
            assert not options[key].startswith(("/var/lib/apt", "/var/cache/apt", "/etc/apt")), (key, options[key])
        assert not Path(options["Dir::State"]).exists(), "the private apt directory is left behind"
    assert (state / "sources.list").read_text() == (
        "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian forky main\n"
    )
    # The machine's update hooks (PackageKit, appstream, docker-clean) are not run for the private lists.
    assert (state / "apt.conf").read_text() == (
        "#clear APT::Update::Post-Invoke;\n#clear APT::Update::Post-Invoke-Success;\n"
    )
    bin_dir = Path(env["RDMA_EXPORTER_PROMETHEUS3_DIR"]) / "usr" / "bin"
    for binary in ("prometheus", "promtool", "prometheus-alertmanager", "amtool"):
        assert subprocess.run([bin_dir / binary], capture_output=True, text=True).stdout == f"{binary}\n"


def fails_with_this_promtool(stubbed: tuple[Path, dict[str, str]], tmp_path: Path, version: str, script: str) -> str:
    """The setup run with Debian testing's promtool replaced by `version` running `script`: it must fail
    before anything lands in the cache, leave no private apt directory, and not go on to pip. Its stderr."""
    project, env = stubbed
    state = Path(env["STATE"])
    (state / "prometheus3" / "promtool_3.5.3+ds1-6_amd64.deb").unlink()
    build_deb(tmp_path / "replacement", state / "prometheus3" / f"promtool_{version}_amd64.deb", "promtool", version,
              {"usr/bin/promtool": script})  # fmt: skip
    result = run(project, env)
    assert result.returncode == 1
    assert not Path(env["RDMA_EXPORTER_PROMETHEUS3_DIR"]).exists()
    (private_dir,) = set(re.findall(r"Dir::State=(\S+)", (state / "apt-get.log").read_text()))
    assert not Path(private_dir).exists(), "a failed fetch leaves its private apt directory behind"
    assert not (state / "python3.log").exists()
    return result.stderr


def test_a_promtool_that_is_not_3_5_is_a_clear_failure(stubbed: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    """When Debian testing moves past Prometheus 3.5, the suite must be told, not run the rules' tests
    against a line nobody checked them with."""
    stderr = fails_with_this_promtool(stubbed, tmp_path, "4.0.0+ds1-1", "#!/bin/sh\n")
    assert "Debian forky's promtool is 4.0.0+ds1-1, not 3.5.x" in stderr


def test_a_prometheus3_that_cannot_run_here_fails_setup(stubbed: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    """A rebuild that needs a newer glibc than the machine's is found at setup, not as a skipped test."""
    stderr = fails_with_this_promtool(
        stubbed, tmp_path, "3.5.4+ds1-1", "#!/bin/sh\necho 'GLIBC_2.99 not found' >&2\nexit 1\n"
    )
    assert "GLIBC_2.99 not found" in stderr


def test_a_mirror_of_the_machines_own_stands_in_for_debian(stubbed: tuple[Path, dict[str, str]]) -> None:
    project, env = stubbed
    env["RDMA_EXPORTER_DEBIAN_MIRROR"] = "http://mirror.example.org/debian"
    result = run(project, env)
    assert result.returncode == 0, result.stderr
    assert (Path(env["STATE"]) / "sources.list").read_text() == (
        "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://mirror.example.org/debian forky main\n"
    )


def missing_prometheus_and_ethtool(project: Path, env: dict[str, str]) -> Path:
    """dpkg-query says two packages are missing; apt-get install records what the policy answers then."""
    bin_dir = project.parent / "bin"
    (bin_dir / "dpkg-query").write_text(
        '#!/usr/bin/env bash\ncase "$3" in prometheus|ethtool) exit 1 ;; esac\nprintf "install ok installed"\n'
    )
    (bin_dir / "apt-get").write_text(
        STUBS["apt-get"].replace(
            "case \" $* \" in",
            'case " $* " in\n  *" install "*) "$RDMA_EXPORTER_POLICY_RC_D" prometheus start && answer=0 || answer=$?\n'
            '    "$RDMA_EXPORTER_POLICY_RC_D" udev.service start && other=0 || other=$?\n'
            '    echo "policy $answer $other" >> "$STATE/install.log" ;;',
        )
    )
    (bin_dir / "apt-get").write_text("#!/usr/bin/env bash\nset -eu\n" + (bin_dir / "apt-get").read_text())
    (bin_dir / "systemctl").write_text('#!/usr/bin/env bash\necho "systemctl $*" >> "$STATE/systemctl.log"\n')
    for name in ("dpkg-query", "systemctl"):
        (bin_dir / name).chmod(0o755)
    policy = project.parent / "policy-rc.d"
    env["RDMA_EXPORTER_POLICY_RC_D"] = str(policy)
    return policy


def test_installed_services_neither_start_nor_start_at_boot(stubbed: tuple[Path, dict[str, str]]) -> None:
    # Package scripts start and enable prometheus' services; RUNLEVEL=1 did not stop that on a systemd host,
    # leaving unauthenticated listeners on every interface (deploy review).
    project, env = stubbed
    policy = missing_prometheus_and_ethtool(project, env)
    result = run(project, env)
    assert result.returncode == 0, result.stderr
    state = Path(env["STATE"])
    # While installing, the policy refused prometheus' services and let the others start; then it is gone.
    assert (state / "install.log").read_text() == "policy 101 0\n"
    assert not policy.exists()
    assert (state / "systemctl.log").read_text() == "systemctl disable --quiet prometheus.service\n"


def test_a_failed_install_still_disables_the_services_it_configured(stubbed: tuple[Path, dict[str, str]]) -> None:
    # apt-get failing after prometheus was configured (its postinst enabled it): the next run counts it
    # installed, so only this run can disable it (deploy review).
    project, env = stubbed
    policy = missing_prometheus_and_ethtool(project, env)
    apt = project.parent / "bin" / "apt-get"
    apt.write_text(apt.read_text().replace('echo "policy $answer $other" >> "$STATE/install.log" ;;',
                                           'echo "policy $answer $other" >> "$STATE/install.log"; exit 100 ;;'))
    result = run(project, env)
    assert result.returncode == 100
    state = Path(env["STATE"])
    assert (state / "install.log").read_text() == "policy 101 0\n"  # the install ran, then failed
    assert not policy.exists()
    assert (state / "systemctl.log").read_text() == "systemctl disable --quiet prometheus.service\n"


def test_a_policy_an_earlier_run_left_behind_is_replaced_and_removed(stubbed: tuple[Path, dict[str, str]]) -> None:
    project, env = stubbed
    policy = missing_prometheus_and_ethtool(project, env)
    policy.write_text("#!/bin/sh\n# rdma-exporter install-test-deps.sh: temporary\nexit 101\n")  # killed mid-install
    policy.chmod(0o755)
    result = run(project, env)
    assert result.returncode == 0, result.stderr
    assert (Path(env["STATE"]) / "install.log").read_text() == "policy 101 0\n"
    assert not policy.exists()


def test_a_machines_own_policy_is_left_as_it_is(stubbed: tuple[Path, dict[str, str]]) -> None:
    project, env = stubbed
    policy = missing_prometheus_and_ethtool(project, env)
    policy.write_text("#!/bin/sh\nexit 0\n")
    policy.chmod(0o755)
    result = run(project, env)
    assert result.returncode == 0, result.stderr
    assert (Path(env["STATE"]) / "install.log").read_text() == "policy 0 0\n"
    assert policy.read_text() == "#!/bin/sh\nexit 0\n"


def test_a_fresh_machine_installs_unattended_with_every_prometheus_service_off(
    stubbed: tuple[Path, dict[str, str]],
) -> None:
    """All three Prometheus packages missing, as on a fresh machine: apt's lists are updated first, the
    install asks no question (CI has no terminal), the temporary policy refuses each package's service
    (not only prometheus.service) and lets the others start, each is disabled at boot, and pip builds
    with the pins too."""
    project, env = stubbed
    services = ["prometheus", "prometheus-alertmanager", "prometheus-node-exporter"]
    bin_dir = project.parent / "bin"
    (bin_dir / "dpkg-query").write_text(
        '#!/usr/bin/env bash\ncase "$3" in prometheus*) exit 1 ;; esac\nprintf "install ok installed"\n'
    )
    install = (
        '  *" install "*)\n'
        '    echo "DEBIAN_FRONTEND=${DEBIAN_FRONTEND-}" >> "$STATE/install.log"\n'
        f"    for unit in {' '.join(f'{service}.service' for service in services)} udev.service; do\n"
        '      "$RDMA_EXPORTER_POLICY_RC_D" "$unit" start && answer=0 || answer=$?\n'
        '      echo "$unit $answer" >> "$STATE/install.log"\n'
        "    done ;;\n"
    )
    stubs = {
        "apt-get": STUBS["apt-get"].replace('case " $* " in\n', 'case " $* " in\n' + install, 1),
        "systemctl": 'echo "systemctl $*" >> "$STATE/systemctl.log"\n',
        "python3": STUBS["python3"] + 'echo "${PIP_CONSTRAINT-} ${PIP_BUILD_CONSTRAINT-}" >> "$STATE/pip-env.log"\n',
    }
    for name, body in stubs.items():
        (bin_dir / name).write_text("#!/usr/bin/env bash\nset -eu\n" + body)
        (bin_dir / name).chmod(0o755)
    policy = project.parent / "policy-rc.d"
    env["RDMA_EXPORTER_POLICY_RC_D"] = str(policy)
    env.pop("DEBIAN_FRONTEND", None)  # the script must set it, not inherit it (container images export it)

    result = run(project, env)
    assert result.returncode == 0, result.stderr
    state = Path(env["STATE"])
    calls = [line.split()[1:] for line in (state / "apt-get.log").read_text().splitlines()]
    assert calls[0] == ["update", "-qq"]
    assert calls[1][0] == "install" and {"-y", "--no-install-recommends"} <= set(calls[1]), calls[1]
    assert calls[1][-3:] == services
    assert (state / "install.log").read_text().splitlines() == [
        "DEBIAN_FRONTEND=noninteractive",
        *(f"{service}.service 101" for service in services),
        "udev.service 0",
    ]
    assert not policy.exists()
    assert (state / "systemctl.log").read_text().splitlines() == [
        f"systemctl disable --quiet {service}.service" for service in services
    ]
    assert (state / "pip-env.log").read_text() == "deploy/constraints.txt deploy/constraints.txt\n"
