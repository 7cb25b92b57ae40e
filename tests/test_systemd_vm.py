"""The shipped hardened unit, deploy/systemd/rdma-exporter.service, run by a real systemd as PID 1.

One VM boot for the module (tests/vm/systemd.py on tests/vm/harness.py): the Debian kernel in qemu, rxe0
on veth0 and rxe1 on a virtio-net NIC, then the host's systemd as PID 1. The unit file is installed
unchanged in /run/systemd/system; a drop-in (drop_in) changes only where the interpreter, the code and
the config are, since this machine has no /opt/rdma-exporter install. The test unit, ordered after the
service, scrapes it, reads its state and its process's credentials, reloads it, scrapes again and saves
the journal; the tests here read what it saved. Then, in the same boot, it turns TLS on as the unit's
comments and docs/operations.md say: a second drop-in (TLS_DROP_IN) with LoadCredential= for a root-only
key and a root-only web config (the shipped web-config.yml plus a basic-auth user), daemon-reload,
restart, and an HTTPS scrape with that login, verified against the test CA. Then a third drop-in gives
it an invalid flag: the unit must fail once and stay failed (RestartPreventExitStatus=), not loop. Last,
a fourth sets WatchdogSec=3s: the process must still run 8 s later (about 10 s more).

What can only show at run time does show here: a syscall the filter denies, a path the mount sandbox
hides, READY=1 not reaching systemd (Type=notify would time out), the ethtool ioctl or the netlink socket
refused under RestrictAddressFamilies=.

Needs what tests/test_real_kernel.py needs, and systemd (252 here). Measured on a 2-CPU machine whose
nested /dev/kvm hangs its guests: 70-78 s for the module (a 15 s KVM probe, then TCG, of which
about 10 s to systemd's first unit, 10 s for Python to import the exporter, and 18-23 s for the TLS phase:
daemon-reload, the restart's second import, the first scrape); 64-69 s with RDMA_EXPORTER_VM_ACCEL=tcg.
Before the TLS phase it was 61 s and 44 s; the invalid-configuration phase adds about 20 s (98 s in all).
On an Intel VM host (TCG) the module took 177 s alone and 265 s beside the rest of the suite, which is
why the VM's scrape deadline is raised (VM_SCRAPE_TIMEOUT).

Shown failing, each on a scratch copy of the unit: SystemCallFilter=~ioctl (the listener's FIONBIO is
refused: "cannot listen ... Operation not permitted", a restart loop) and AF_UNIX left out of
RestrictAddressFamilies= (READY=1 never sent: "start operation timed out") fail the first test;
DynamicUser=no the second; AF_NETLINK left out ("device discovery: rescan (cannot open the uevent
socket ...)") or --no-collector.ethtool the third; ExecReload=/bin/true the fourth; LimitNOFILE=1024
("open-file limit 1024: keeping 384 sysfs files open instead of 16384") the fifth. The TLS tests (the last
two) fail, and only they, with the key's LoadCredential= naming a file that is not there ("Failed to set up
credentials", status=243/CREDENTIALS, a restart loop), and with no LoadCredential= and a web config naming
the 0600 source key itself ("cannot load ... tls.key: [Errno 13] Permission denied"; seen as status=2,
which is status=1 and a restart loop since EACCES became EXIT_UNAVAILABLE), and with the web config
named at its 0600 source instead of the credential ("web-config.yml: (file): cannot read: Permission
denied"): the dynamic user cannot read a root-only file. The last test fails without
RestartPreventExitStatus=2 (ActiveState "activating", NRestarts 6 after the watch). The watchdog test
fails when the server loop sends no WATCHDOG=1 (ActiveState "activating", NRestarts 1).
"""

from __future__ import annotations

import re
import sys
import sysconfig
from pathlib import Path

import bcrypt
import pytest
from vm.harness import NETDEV, VM_OUT, VmResult
from vm.systemd import NIC_NETDEV, NIC_RDMA, SYSTEMD, UNIT_DIR, boot_systemd

from rdma_exporter.config import EXIT_CONFIG
from rdma_exporter.daemon import FD_RESERVE
from rdma_exporter.parse.reader import DEFAULT_MAX_OPEN_FILES

from conftest import BackgroundRuns, early_setup, make_ca, make_leaf, require_vm, samples, skip_or_fail

REPO = Path(__file__).resolve().parents[1]
UNIT = "rdma-exporter.service"
SHIPPED_UNIT = REPO / "deploy" / "systemd" / UNIT
PORT = 9883  # deploy/systemd/rdma-exporter.yml's listen address

# Inside the VM, before systemd starts: the interpreter's prefix, the checkout's exporter/ and the shipped
# config under /opt (a tmpfs over the host's /opt there), where ProtectHome= and PrivateTmp= do not hide
# them. The host's /root (pyenv) and /tmp (a CI clone) stay hidden from the service, as the unit wants.
OPT = "/opt/rdma-exporter"


def interpreter_in_vm() -> tuple[str, str, list[str]]:
    """(the interpreter in use as the VM's service sees it, the PYTHONPATH it needs, the bind mounts).

    The base installation is bound at OPT/python. In a venv (Debian's own Python refuses pip outside
    one), the venv's site-packages is bound too and goes on PYTHONPATH: the service runs the base
    interpreter, whose prefix is found from where it lies. Raises ValueError if the interpreter does not
    lie under its base prefix (the caller skips then).
    """
    base = Path(sys.base_prefix).resolve()
    python = f"{OPT}/python/{Path(sys.executable).resolve().relative_to(base)}"
    binds = [f"mount --bind {base} {OPT}/python"]
    path = [f"{OPT}/exporter"]
    if sys.prefix != sys.base_prefix:
        venv = Path(sys.prefix).resolve()
        site = Path(sysconfig.get_path("purelib")).resolve()
        binds.append(f"mount --bind {venv} {OPT}/venv")
        path.append(f"{OPT}/venv/{site.relative_to(venv)}")
    return python, ":".join(path), binds


def prepare_script(binds: list[str]) -> str:
    """Inside the VM, before systemd starts: the interpreter, the checkout's exporter/ and the shipped
    config under /opt (a tmpfs over the host's /opt there), where ProtectHome= and PrivateTmp= do not hide
    them. The host's /root (pyenv) and /tmp (a CI clone) stay hidden from the service, as the unit wants."""
    return "\n".join([
        "mount -t tmpfs -o mode=0755 tmpfs /opt",
        f"mkdir -p {OPT}/python {OPT}/venv {OPT}/exporter {OPT}/deploy",
        *binds,
        f"mount --bind {REPO / 'exporter'} {OPT}/exporter",
        f"mount --bind {REPO / 'deploy' / 'systemd'} {OPT}/deploy",
        f"cp {SHIPPED_UNIT} {UNIT_DIR}/{UNIT}",
        "",
    ])


# The scrape deadline in the VM. Under TCG, beside the rest of the suite, reading the rxe devices' static
# info (1,024 GID entries a port) took 10 s on an Intel host, past the shipped 8 s: the first scrapes
# after the start and after the reload then had no device series, and the journal the deadline warnings.
# What the deadline does is tested in test_daemon_faults.py; here it only has to let a slow VM finish.
VM_SCRAPE_TIMEOUT = 60
CURL_SECONDS = VM_SCRAPE_TIMEOUT + 30


def drop_in(python: str, pythonpath: str) -> str:
    args = f"--config.file={OPT}/deploy/rdma-exporter.yml --web.scrape-timeout={VM_SCRAPE_TIMEOUT}"
    return f"""\
# Only what differs on the test VM from an install as the unit's header describes.
[Service]
ExecStart=
ExecStart={python} -m rdma_exporter {args} $RDMA_EXPORTER_ARGS
ExecReload=
ExecReload={python} -m rdma_exporter --check-config {args} $RDMA_EXPORTER_ARGS
ExecReload=/bin/kill -HUP $MAINPID
Environment=PYTHONPATH={pythonpath}
# The interpreter's RUNPATH names its libpython under its real prefix, which ProtectHome= hides: without
# this the loader falls back to the distribution's libpython of the same soname, a different Python.
Environment=LD_LIBRARY_PATH={OPT}/python/lib
"""


# The TLS phase: a CA and a server certificate for TLS_NAME made on the host with openssl (make_tls) into
# the VM's $VM_OUT, the key 0600 and owned by root as an operator would keep it under /etc/rdma-exporter.
# The web config is the shipped web-config.yml (its /run/credentials/rdma-exporter.service/ paths are the
# ones systemd gives this unit's credentials) with a basic-auth user added, so, as docs/operations.md
# advises under DynamicUser=, it is root-only too and handed over as a credential like the key.
TLS_DIR = f"{VM_OUT}/tls"
TLS_NAME = "rdma-exporter.test"
CREDENTIALS = "/run/credentials/rdma-exporter.service"
BASIC_USER, BASIC_PASSWORD = "prometheus", "a-long-random-vm-test-password"
LOGIN = f"{BASIC_USER}:{BASIC_PASSWORD}"
TLS_DROP_IN = f"""\
[Service]
LoadCredential=tls.crt:{TLS_DIR}/tls.crt
LoadCredential=tls.key:{TLS_DIR}/tls.key
LoadCredential=web-config.yml:{TLS_DIR}/web-config.yml
Environment=RDMA_EXPORTER_ARGS=--web.config.file={CREDENTIALS}/web-config.yml
"""

# The invalid-configuration phase: a flag value the exporter refuses (status 2, EXIT_CONFIG), given as an
# operator would through RDMA_EXPORTER_ARGS; it sorts after tls.conf, so its setting wins.
INVALID_DROP_IN = """\
[Service]
Environment=RDMA_EXPORTER_ARGS=--devices.exclude=mlx5_[0-
"""
INVALID_WATCH_SECONDS = 12


def make_tls(directory: Path) -> None:
    """ca.crt, and tls.crt/tls.key (mode 0600) for TLS_NAME signed by it, as an operator's PKI would; and
    web-config.yml (mode 0600): the shipped one with BASIC_USER's bcrypt hash (cost 4: the VM may run
    without KVM, where cost 12 takes seconds a check)."""
    directory.mkdir(parents=True)
    make_ca("ca", directory)
    make_leaf("tls", "ca", f"DNS:{TLS_NAME}", "serverAuth", directory)
    (directory / "tls.key").chmod(0o600)
    (directory / "ca.key").unlink()
    hashed = bcrypt.hashpw(BASIC_PASSWORD.encode(), bcrypt.gensalt(4)).decode()
    shipped = (REPO / "deploy" / "systemd" / "web-config.yml").read_text()
    (directory / "web-config.yml").write_text(f"{shipped}basic_auth_users:\n  {BASIC_USER}: '{hashed}'\n")
    (directory / "web-config.yml").chmod(0o600)


COMMAND = f"""\
set -u
out=$VM_OUT
unit=rdma-exporter
readlink /proc/1/exe > $out/pid1-exe.txt
systemctl show -p Virtualization --value >> $out/pid1-exe.txt
systemctl is-system-running > $out/system-running.txt 2>&1
cmp {SHIPPED_UNIT} {UNIT_DIR}/{UNIT} > $out/unit-cmp.txt 2>&1; echo "cmp exit $?" >> $out/unit-cmp.txt
systemctl cat $unit > $out/unit-cat.txt 2>&1
properties=ActiveState,SubState,MainPID,NRestarts,StatusText,Result,ExecMainStatus,WatchdogUSec,WatchdogTimestampMonotonic,ExecMainStartTimestampMonotonic
show() {{ systemctl show $unit -p $properties > $out/show-$1.txt; }}
scrape() {{ curl -sf --max-time {CURL_SECONDS} -o $out/scrape-$1.prom http://127.0.0.1:{PORT}/metrics; }}
show start
for i in 1 2 3 4 5; do scrape start && break; sleep 1; done
pid=$(systemctl show -p MainPID --value $unit)
cat /proc/$pid/status > $out/proc-status.txt 2>&1
cat /proc/$pid/limits > $out/proc-limits.txt 2>&1
grep '^btime ' /proc/stat > $out/btime.txt 2>&1
systemctl reload $unit; echo $? > $out/reload-exit.txt
for i in $(seq 50); do journalctl -u $unit --no-pager | grep -q 'reloaded ' && break; sleep 0.2; done
show reload
scrape reload
# A change --check-config refuses (a flag in the unit's arguments, which the next restart would refuse)
# fails `systemctl reload`; the process is not signalled and serves on.
printf '[Service]\nEnvironment=RDMA_EXPORTER_ARGS=--devices.exclude=mlx5_[0-\n' > {UNIT_DIR}/{UNIT}.d/bad-reload.conf
systemctl daemon-reload
systemctl reload $unit > $out/bad-reload.txt 2>&1; echo "exit $?" >> $out/bad-reload.txt
show bad-reload
rm {UNIT_DIR}/{UNIT}.d/bad-reload.conf
systemctl daemon-reload
journalctl --sync
journalctl -u $unit -o short-monotonic --no-pager > $out/journal.txt 2>&1
journalctl -b -o short-monotonic --no-pager > $out/journal-boot.txt 2>&1
systemctl status $unit --no-pager > $out/status.txt 2>&1
systemctl list-units --failed --no-pager > $out/failed.txt 2>&1
# TLS as the unit's comments and docs/operations.md tell operators to set it up: the root-only key handed
# over with LoadCredential=, the shipped web-config.yml naming the credentials; a restart copies them.
cursor=$(journalctl -u $unit -n 1 --show-cursor -q -o cat | sed -n 's/^-- cursor: //p')
mkdir -p {UNIT_DIR}/{UNIT}.d
cat > {UNIT_DIR}/{UNIT}.d/tls.conf <<'EOF'
{TLS_DROP_IN}EOF
systemctl daemon-reload
systemctl restart $unit; echo $? > $out/restart-exit.txt
show tls
ls -ln /run/credentials/rdma-exporter.service/ > $out/credentials.txt 2>&1
https() {{ curl -sS --max-time {CURL_SECONDS} --resolve {TLS_NAME}:{PORT}:127.0.0.1 "$@" \\
  https://{TLS_NAME}:{PORT}/metrics; }}
for i in 1 2 3 4 5; do
  https --cacert {TLS_DIR}/ca.crt -f -u {LOGIN} -o $out/scrape-tls.prom > $out/https.txt 2>&1; rc=$?
  [ $rc = 0 ] && break; sleep 1
done
echo "exit $rc" >> $out/https.txt
https --cacert {TLS_DIR}/ca.crt -o /dev/null -w 'http_code %{{http_code}}\n' > $out/https-no-login.txt 2>&1
echo "exit $?" >> $out/https-no-login.txt
https -o /dev/null > $out/https-unverified.txt 2>&1; echo "exit $?" >> $out/https-unverified.txt
curl -sS --max-time {CURL_SECONDS} -o /dev/null -w 'http_code %{{http_code}}\n' http://127.0.0.1:{PORT}/metrics \
  > $out/plain-after-tls.txt 2>&1; echo "exit $?" >> $out/plain-after-tls.txt
stat -c '%a %u' {TLS_DIR}/tls.key > $out/key-mode.txt
stat -c '%a %u' {TLS_DIR}/web-config.yml > $out/web-config-mode.txt
journalctl --sync
journalctl -u $unit --after-cursor="$cursor" -o short-monotonic --no-pager > $out/journal-tls.txt 2>&1
systemctl status $unit --no-pager > $out/status-tls.txt 2>&1 || :  # 3 when not running: not the exit
# An invalid configuration: the unit must fail once and stay failed, not restart every RestartSec=.
cursor=$(journalctl -u $unit -n 1 --show-cursor -q -o cat | sed -n 's/^-- cursor: //p')
cat > {UNIT_DIR}/{UNIT}.d/zz-invalid.conf <<'EOF'
{INVALID_DROP_IN}EOF
systemctl daemon-reload
systemctl restart $unit; echo $? > $out/invalid-restart-exit.txt
for i in $(seq 100); do [ "$(systemctl show -p ActiveState --value $unit)" = failed ] && break; sleep 0.2; done
sleep {INVALID_WATCH_SECONDS}  # two RestartSec= and more: a restart, if one were scheduled, has begun
show invalid
journalctl --sync
journalctl -u $unit --after-cursor="$cursor" -o short-monotonic --no-pager > $out/journal-invalid.txt 2>&1
# The watchdog, with a short WatchdogSec= so the test need not wait a minute: systemd kills a process that
# does not notify within it (SIGABRT, then a restart); the server loop notifies at half of it.
rm {UNIT_DIR}/{UNIT}.d/zz-invalid.conf
printf '[Service]\nWatchdogSec=3s\n' > {UNIT_DIR}/{UNIT}.d/zz-watchdog.conf
systemctl daemon-reload
systemctl reset-failed $unit
systemctl restart $unit
sleep 8
show watchdog
"""

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@early_setup
def boot(work: Path) -> VmResult:
    """The module's one boot, started as the session starts (conftest.early_runs)."""
    require_vm("rdma", "curl", "openssl", files=(SYSTEMD,))
    try:
        python, pythonpath, binds = interpreter_in_vm()
    except ValueError as exc:
        skip_or_fail(f"cannot place this interpreter in the VM: {exc}")
    make_tls(work / "out" / "tls")  # the VM's $VM_OUT/tls
    return boot_systemd(
        COMMAND,
        work,
        units={f"{UNIT}.d/test.conf": drop_in(python, pythonpath)},
        prepare=prepare_script(binds),
        keep=(Path(sys.base_prefix).resolve(),),
        after=(UNIT,),
    )


@pytest.fixture(scope="module")
def vm(early_runs: BackgroundRuns) -> VmResult:
    result: VmResult = early_runs.result(__name__)
    print(f"VM ({'KVM' if result.kvm else 'TCG'}) ran {result.seconds:.1f} s; logs in {result.out_dir.parent}")
    return result


def read(vm: VmResult, name: str) -> str:
    path = vm.out_dir / name
    assert path.exists(), f"the test unit saved no {name}; command.log:\n{read_log(vm)}"
    return path.read_text(errors="replace")


def read_log(vm: VmResult) -> str:
    return vm.command_log.read_text(errors="replace") if vm.command_log.exists() else "<no command.log>"


def journal(vm: VmResult) -> str:
    return read(vm, "journal.txt")


def show(vm: VmResult, step: str) -> dict[str, str]:
    return dict(line.partition("=")[::2] for line in read(vm, f"show-{step}.txt").splitlines())


def scrape(vm: VmResult, step: str) -> Samples:
    path = vm.out_dir / f"scrape-{step}.prom"
    assert path.exists(), f"no scrape after {step}\nstatus:\n{read(vm, 'status.txt')}\njournal:\n{journal(vm)}"
    return samples(path.read_text())


def test_service_is_active_under_systemd_as_pid_1(vm: VmResult) -> None:
    assert vm.exit_code == 0, f"the test command exited {vm.exit_code}:\n{read_log(vm)}"
    pid1_exe, virtualization = read(vm, "pid1-exe.txt").split()
    assert Path(pid1_exe).name == "systemd"
    assert virtualization in {"qemu", "kvm"}  # PID 1's own view: a VM, not a container
    # After basic.target, and the boot transaction still running (it waits for the test unit).
    assert read(vm, "system-running.txt").strip() == "starting", read(vm, "failed.txt")
    assert "cmp exit 0" in read(vm, "unit-cmp.txt"), "the unit installed is not the shipped one"
    state = show(vm, "start")
    # Type=notify: "active" only once the exporter's READY=1 reached systemd (NotifyAccess=main).
    assert (state["ActiveState"], state["SubState"]) == ("active", "running"), (state, journal(vm))
    assert state["NRestarts"] == "0", journal(vm)
    assert int(state["MainPID"]) > 1
    assert state["WatchdogUSec"] == "1min", state


def test_the_watchdog_hears_from_the_exporter(vm: VmResult) -> None:
    # 8 s into a 3 s WatchdogSec=: the same process still runs, and its last WATCHDOG=1 came well after the
    # first interval (without them systemd killed it at 3 s and restarted it).
    state = show(vm, "watchdog")
    assert (state["ActiveState"], state["WatchdogUSec"], state["NRestarts"]) == ("active", "3s", "0"), state
    since_start = int(state["WatchdogTimestampMonotonic"]) - int(state["ExecMainStartTimestampMonotonic"])
    assert since_start > 3_000_000, (state, journal(vm))


def status_field(vm: VmResult, name: str) -> list[str]:
    for line in read(vm, "proc-status.txt").splitlines():
        key, _, value = line.partition(":")
        if key == name:
            return value.split()
    raise AssertionError(f"no {name} in /proc/<MainPID>/status:\n{read(vm, 'proc-status.txt')}")


def test_exporter_runs_as_a_dynamic_user_without_capabilities(vm: VmResult) -> None:
    assert status_field(vm, "Name")[0].startswith("python"), "MainPID is not the exporter's interpreter"
    uids, gids = status_field(vm, "Uid"), status_field(vm, "Gid")
    # DynamicUser= allocates from 61184-65519; real, effective, saved and filesystem ids all that user.
    assert len(set(uids)) == 1 and 61184 <= int(uids[0]) <= 65519, uids
    assert len(set(gids)) == 1 and 61184 <= int(gids[0]) <= 65519, gids
    for capabilities in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(status_field(vm, capabilities)[0], 16) == 0, capabilities
    assert status_field(vm, "NoNewPrivs") == ["1"]
    assert status_field(vm, "Seccomp") == ["2"]  # the SystemCallFilter= is in force


def value(found: Samples, name: str, **labels: str) -> float | None:
    return found.get((name, tuple(sorted(labels.items()))))


def failures(found: Samples) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    failed = {k: v for k, v in found.items() if k[0] == "rdma_exporter_scrape_collector_success" and v != 1}
    errors = {k: v for k, v in found.items() if k[0] == "rdma_exporter_file_read_errors_total" and v}
    return failed | errors


def test_scrape_has_rdma_netdev_and_ethtool_series(vm: VmResult) -> None:
    found = scrape(vm, "start")
    # The interpreter in use, not the distribution's libpython of the same soname (see drop_in).
    build = [dict(k[1]) for k in found if k[0] == "rdma_exporter_build_info"]
    assert [b.get("python_version") for b in build] == [sys.version.split()[0]], build
    collectors = {dict(k[1])["collector"] for k in found if k[0] == "rdma_exporter_scrape_collector_success"}
    assert {"infiniband", "netdev", "ethtool"} <= collectors, collectors
    assert failures(found) == {}
    for device, netdev in (("rxe0", NETDEV), (NIC_RDMA, NIC_NETDEV)):
        port = {"device": device, "port": "1"}
        assert value(found, "rdma_port_state", **port, state="ACTIVE") == 1, device
        assert value(found, "rdma_port_netdev_info", **port, netdev=netdev) == 1, device
        assert value(found, "rdma_netdev_up", **port, netdev=netdev) == 1, device
    # The SIOCETHTOOL ioctl (an AF_INET socket) answered for the NIC: veth0 has no `device` link, so the
    # ethtool collector reads only hardware-backed netdevs and skips it.
    # rdma_ethtool_curated_stats is exported for each netdev whose statistics were read, even when (as for
    # virtio-net) none has a curated name; a refused ioctl would count a read error instead.
    nic = {"device": NIC_RDMA, "port": "1", "netdev": NIC_NETDEV}
    assert value(found, "rdma_ethtool_curated_stats", **nic) is not None, sorted(k for k in found if "ethtool" in k[0])
    ethtool = {k for k in found if k[0].startswith("rdma_ethtool_")}
    assert not any(dict(k[1]).get("netdev") == NETDEV for k in ethtool), sorted(ethtool)
    # The node's boot time, which the unit's ProcSubset=pid keeps out of the exporter's /proc/stat: the
    # VM's own (read here by the test command, outside the sandbox).
    btime = int(read(vm, "btime.txt").split()[1])
    served = value(found, "rdma_exporter_node_boot_time_seconds")
    assert served is not None and abs(served - btime) <= 1, (served, btime)
    # The uevent socket (AF_NETLINK) opened: the exporter follows udevd's events instead of rescanning.
    assert re.search(r"device discovery: udev \(", journal(vm)), journal(vm)


def test_reload_keeps_the_same_process_serving(vm: VmResult) -> None:
    before, after = show(vm, "start"), show(vm, "reload")
    assert read(vm, "reload-exit.txt").strip() == "0", journal(vm)
    assert (after["ActiveState"], after["SubState"]) == ("active", "running"), (after, journal(vm))
    assert after["MainPID"] == before["MainPID"] and after["NRestarts"] == "0"
    assert "received SIGHUP, reloading" in journal(vm)
    assert re.search(r"reloaded \S*rdma-exporter\.yml", journal(vm)), journal(vm)
    found = scrape(vm, "reload")
    assert value(found, "rdma_port_state", device="rxe0", port="1", state="ACTIVE") == 1
    assert failures(found) == {}


def test_a_reload_the_exporter_would_reject_fails_systemctl_reload(vm: VmResult) -> None:
    """ExecReload= runs --check-config first (operations review: a rejected SIGHUP reload was one log
    line, and `systemctl reload` reported success, so config management never saw it). Shown with an
    argument the check refuses: the config file here is the repository's own, bound into the VM."""
    before, after = show(vm, "start"), show(vm, "bad-reload")
    assert read(vm, "bad-reload.txt").splitlines()[-1] != "exit 0", read(vm, "bad-reload.txt")
    assert (after["ActiveState"], after["SubState"]) == ("active", "running"), (after, journal(vm))
    assert after["MainPID"] == before["MainPID"] and after["NRestarts"] == "0"


# What the exporter logs when the sandbox refuses it something (daemon.py, hotplug.py, collect/ethtool.py).
DENIED = re.compile(
    r"open-file limit|cannot (read|raise) the open-file|cannot open|cannot watch|refused|denied|EPERM|"
    r"Operation not permitted|Permission denied|seccomp|Traceback|level=(warn|error)",
    re.IGNORECASE,
)


def test_journal_has_no_sandbox_denials(vm: VmResult) -> None:
    lines = [line for line in journal(vm).splitlines() if DENIED.search(line)]
    assert lines == [], "\n".join(lines)
    # LimitNOFILE= sets the soft limit as high as the default kept-open files need, so raise_fd_limit never
    # has to call setrlimit (SystemCallFilter= denies @resources' setrlimit; glibc's prlimit64 is allowed).
    limits = read(vm, "proc-limits.txt")
    found = re.search(r"^Max open files\s+(\d+)\s+(\d+)", limits, re.MULTILINE)
    shipped = re.search(r"^LimitNOFILE=(\d+)$", SHIPPED_UNIT.read_text(), re.MULTILINE)
    assert found and shipped, limits
    assert found.groups() == (shipped[1], shipped[1]), limits
    assert int(found[1]) >= DEFAULT_MAX_OPEN_FILES + FD_RESERVE, limits


def test_tls_restart_serves_https_with_the_key_as_a_credential(vm: VmResult) -> None:
    """After the plain-HTTP checks above: the drop-in TLS_DROP_IN (LoadCredential= as the unit's comments
    say, for the key and for the web config with its bcrypt hash), a restart, and the exporter serves only
    HTTPS, with the certificate and login it got through /run/credentials, while the files they came
    from stay root-only."""
    state = show(vm, "tls")
    journal_tls = read(vm, "journal-tls.txt")
    assert read(vm, "restart-exit.txt").strip() == "0", journal_tls
    assert (state["ActiveState"], state["SubState"]) == ("active", "running"), (state, journal_tls)
    assert state["NRestarts"] == "0", journal_tls
    assert state["MainPID"] != show(vm, "start")["MainPID"], "no restart happened"
    assert re.search(r"listening on :9883 \(HTTPS, basic auth \(1 users\)\)", journal_tls), journal_tls
    # Verified against the test CA for the name in the certificate (curl fails on any mismatch, exit 60).
    assert read(vm, "https.txt").strip().endswith("exit 0"), read(vm, "https.txt") + journal_tls
    found = scrape(vm, "tls")
    assert value(found, "rdma_port_state", device="rxe0", port="1", state="ACTIVE") == 1
    assert failures(found) == {}
    # Without the CA the certificate does not verify: the server is not trusted by accident.
    assert "exit 60" in read(vm, "https-unverified.txt"), read(vm, "https-unverified.txt")
    # Plain HTTP on the same port gets no metrics now, but the reason (400), as from Go's servers.
    plain = read(vm, "plain-after-tls.txt")
    assert "http_code 400" in plain and "http_code 200" not in plain, plain
    # The source key and web config (the bcrypt hash) are still root's alone: the dynamic user read only
    # systemd's copies.
    assert read(vm, "key-mode.txt").split() == ["600", "0"]
    assert read(vm, "web-config-mode.txt").split() == ["600", "0"]
    credentials = read(vm, "credentials.txt")
    for name in ("tls.crt", "tls.key", "web-config.yml"):
        assert re.search(rf" {re.escape(name)}$", credentials, re.MULTILINE), credentials
    # The user came from that copy: without the login the answer is 401.
    assert "http_code 401" in read(vm, "https-no-login.txt"), read(vm, "https-no-login.txt")


# systemd's own complaints about the unit (a credential it could not load, a failed start) and the
# exporter's warnings and errors.
FAILED = re.compile(r"fail|status=\d|code=|Scheduled restart|warn|error", re.IGNORECASE)


# The two refusals the TLS phase asks for, each logged as a warning: a scrape without credentials
# (https-no-login.txt), and a client that does not trust the server's certificate and ends the handshake
# (https-unverified.txt).
NO_LOGIN_REFUSED = re.compile(r"level=warn .*msg=\"1 request\(s\) without credentials refused with 401 ")
CHEAP_HASH_WARNED = re.compile(r"level=warn .*msg=\".*: basic_auth_users hashes at bcrypt cost 4 are quick to crack")
UNTRUSTED_REFUSED = re.compile(
    r"level=warn .*msg=\"1 TLS handshake\(s\) failed since the last such line \(the last from \S+: "
    r"TLSV1_ALERT_UNKNOWN_CA\)\""
)


def test_journal_after_the_tls_restart_is_clean(vm: VmResult) -> None:
    journal_tls = read(vm, "journal-tls.txt")
    lines = [line for line in journal_tls.splitlines() if DENIED.search(line) or FAILED.search(line)]
    refused = [line for line in lines if NO_LOGIN_REFUSED.search(line) or UNTRUSTED_REFUSED.search(line)]
    assert len(refused) == 2 and any(UNTRUSTED_REFUSED.search(line) for line in refused), journal_tls
    # The test's own cost-4 hash (see the web config's docstring), warned of once at start.
    cheap = [line for line in lines if CHEAP_HASH_WARNED.search(line)]
    assert len(cheap) == 1, journal_tls
    assert [line for line in lines if line not in refused and line not in cheap] == [], journal_tls
    assert "Started rdma-exporter.service" in journal_tls, journal_tls


def test_an_invalid_configuration_fails_the_unit_once_without_a_restart_loop(vm: VmResult) -> None:
    """RestartPreventExitStatus= names EXIT_CONFIG: a typo in the flags leaves the unit failed, with the
    reason in the journal once, instead of a new start (and the same error) every RestartSec=."""
    state = show(vm, "invalid")
    journal_invalid = read(vm, "journal-invalid.txt")
    assert read(vm, "invalid-restart-exit.txt").strip() != "0", journal_invalid
    assert (state["ActiveState"], state["Result"]) == ("failed", "exit-code"), (state, journal_invalid)
    assert state["ExecMainStatus"] == str(EXIT_CONFIG), (state, journal_invalid)
    assert state["NRestarts"] == "0", (state, journal_invalid)
    assert "Scheduled restart" not in journal_invalid, journal_invalid
    reasons = re.findall(r"invalid configuration: .*devices\.exclude.*", journal_invalid)
    assert len(reasons) == 1, journal_invalid
