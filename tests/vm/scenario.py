"""Runs inside the test VM (tests/test_real_kernel.py): the daemon on the live /sys, scraped at each step.

Standard library only, so the VM's Python starts fast. Usage: `python scenario.py OUT_DIR ITERS SIZE`.
Writes to OUT_DIR: scrape-<step>.prom and kernel-<step>.json (the kernel's own rxe0 files at the same
moment) for the steps start, traffic, address, down and deleted, plus
pingpong-server.log, pingpong-client.log, daemon.log and steps.log (what was run, with times).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

LISTEN = "127.0.0.1:9315"
SCRAPE_TIMEOUT = 120  # seconds, in the emulated VM (see where the daemon starts)
PINGPONG_PORT = 18515  # ibv_rc_pingpong's default TCP port for exchanging QP numbers
NETDEV = "veth0"
ADDRESS = "10.55.0.1"


def kernel_view() -> dict[str, object]:
    """What the kernel's own files say about rxe0 port 1 and veth0 right now, for the test to compare."""
    port = Path("/sys/class/infiniband/rxe0/ports/1")
    view: dict[str, object] = {"exists": port.is_dir()}
    if not port.is_dir():
        return view
    for name in ("state", "phys_state", "rate", "link_layer"):
        view[name] = (port / name).read_text().strip()
    gid_types: dict[str, int] = {}
    for entry in (port / "gids").iterdir():
        if entry.read_text().strip().replace(":", "").strip("0"):
            gid_type = (port / "gid_attrs" / "types" / entry.name).read_text().strip()
            gid_types[gid_type] = gid_types.get(gid_type, 0) + 1
    view["gid_types"] = gid_types
    # Whether ib_uverbs gave rxe0 a character device, as libibverbs finds it.
    verbs = Path("/sys/class/infiniband_verbs")
    view["user_verbs_loaded"] = verbs.is_dir()
    view["user_verbs"] = verbs.is_dir() and any(
        (entry / "ibdev").read_text().strip() == "rxe0" for entry in verbs.glob("uverbs*")
    )
    return view


def exported_gid_types(text: str) -> dict[str, int]:
    """rxe0 port 1's rdma_port_gids by gid_type, from an exposition."""
    found: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith("rdma_port_gids{") and 'device="rxe0"' in line and 'port="1"' in line:
            gid_type = re.search(r'gid_type="([^"]*)"', line)
            if gid_type:
                found[gid_type.group(1)] = int(float(line.rsplit(" ", 1)[1]))
    return found


def wait_for_listener(port: int, timeout: float) -> bool:
    """Whether a TCP socket listens on `port` (IPv4 or IPv6) within `timeout` seconds, from /proc/net."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with open(table) as lines:
                for line in list(lines)[1:]:
                    fields = line.split()
                    if fields[1].endswith(f":{port:04X}") and fields[3] == "0A":  # 0A: TCP_LISTEN
                        return True
        time.sleep(0.1)
    return False


def main() -> int:
    out, iters, size = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    steps = open(out / "steps.log", "w", buffering=1)  # noqa: SIM115 - kept open for the whole run

    def log(text: str) -> None:
        steps.write(f"{time.monotonic():.2f} {text}\n")

    def scrape() -> str:
        with urllib.request.urlopen(f"http://{LISTEN}/metrics", timeout=SCRAPE_TIMEOUT + 30) as response:
            body: bytes = response.read()
            return body.decode()

    def save(step: str) -> str:
        text = scrape()
        (out / f"scrape-{step}.prom").write_text(text)
        (out / f"kernel-{step}.json").write_text(json.dumps(kernel_view(), indent=1, sort_keys=True))
        log(f"scraped {step}: {len(text)} bytes")
        return text

    def run(*argv: str) -> None:
        log("run " + " ".join(argv))
        subprocess.run(argv, check=True)

    daemon_log = open(out / "daemon.log", "w")  # noqa: SIM115
    daemon = subprocess.Popen(
        # The VM is emulated (TCG), tens of times slower than its host: on a loaded host the first read of
        # rxe0 (its GID table is 1024 entries) outlasted the default 8 s deadline, the scrape skipped it,
        # and the timeout stayed counted in every later step. The deadline is scaled with the emulation;
        # how the daemon meets a deadline is tested on the host (test_daemon_faults.py).
        [
            sys.executable,
            "-m",
            "rdma_exporter",
            f"--web.listen-address={LISTEN}",
            "--path.sysfs=/sys",
            f"--web.scrape-timeout={SCRAPE_TIMEOUT}",
        ],
        stdout=daemon_log,
        stderr=subprocess.STDOUT,
    )
    log(f"daemon pid {daemon.pid}")
    try:
        end = time.monotonic() + 120
        while True:
            try:
                scrape()
                break
            except OSError:
                if daemon.poll() is not None or time.monotonic() > end:
                    log(f"daemon not answering (exit status {daemon.poll()})")
                    return 1
                time.sleep(0.2)
        log("daemon answers")
        save("start")

        # (b) Real RDMA traffic over rxe0: server and client on this VM, over veth0's RoCEv2 GID.
        pingpong = ["ibv_rc_pingpong", "-d", "rxe0", "-g", "1", "-n", str(iters), "-s", str(size)]
        if iters > 0:
            log("run " + " ".join(pingpong))
            with open(out / "pingpong-server.log", "w") as server_log:
                server = subprocess.Popen(pingpong, stdout=server_log, stderr=subprocess.STDOUT)
                # Not a fixed sleep: on a loaded TCG VM the server took over a second to listen. Nor a
                # probe connection: the server accepts exactly one.
                listening = wait_for_listener(PINGPONG_PORT, timeout=60)
                log(f"pingpong server listening: {listening}")
                with open(out / "pingpong-client.log", "w") as client_log:
                    client = subprocess.run(
                        [*pingpong, ADDRESS], stdout=client_log, stderr=subprocess.STDOUT, timeout=120
                    )
                try:
                    server_status = server.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    server.kill()
                    server_status = server.wait()
            log(f"pingpong client {client.returncode} server {server_status}")
        save("traffic")

        # A second address on veth0 adds a RoCE v2 GID: no uevent tells the exporter.
        run("ip", "addr", "add", "10.55.1.1/24", "dev", NETDEV)
        # The kernel adds the GID from a workqueue; it takes the lowest free index (2). Reading all 1024
        # entries each time is slow under TCG.
        gid2 = Path("/sys/class/infiniband/rxe0/ports/1/gids/2")
        end = time.monotonic() + 10
        while not gid2.read_text().strip().replace(":", "").strip("0") and time.monotonic() < end:
            time.sleep(0.1)
        # The exporter's address watch runs on its own thread: scrape until its GID count agrees with the
        # kernel's (a fixed pause was either too short under TCG or wasted time).
        end = time.monotonic() + 20
        while exported_gid_types(save("address")) != kernel_view()["gid_types"] and time.monotonic() < end:
            time.sleep(0.2)

        # (c) The netdev goes down: rxe0's port follows it, and must stay exported.
        run("ip", "link", "set", NETDEV, "down")
        end = time.monotonic() + 20
        while 'rdma_port_state{device="rxe0",port="1",state="DOWN"} 1.0' not in save("down"):
            if time.monotonic() > end:
                break
            time.sleep(0.5)

        # (d) The device is deleted: it is gone from the scrape, which still succeeds. The exporter learns of
        # it from the uevent, handled on its own thread, or from the scrape whose reads find the device
        # gone (the next one lists again): a scrape sent at once can still race the event, so scrape until
        # the device count says so, as for the steps above.
        run("rdma", "link", "delete", "rxe0")
        end = time.monotonic() + 20
        while "\nrdma_exporter_devices 0.0\n" not in save("deleted") and time.monotonic() < end:
            time.sleep(0.2)
        log(f"daemon still running: {daemon.poll() is None}")
        return 0
    finally:
        daemon.terminate()
        try:
            daemon.wait(timeout=10)
        except subprocess.TimeoutExpired:
            daemon.kill()
        log(f"daemon exit status {daemon.returncode}")
        os.fsync(steps.fileno())


if __name__ == "__main__":
    sys.exit(main())
