#!/usr/bin/env bash
# Installs everything the test suite uses on a fresh Debian machine: the real Prometheus tools the
# tests run against (promtool, prometheus, alertmanager, amtool, node_exporter), the network and
# tracing tools (ethtool, iproute2, strace, openssl, curl, systemd-analyze), and the Python package with
# its test extras. Safe to run again: apt and pip skip what is already there.
set -euo pipefail

cd "$(dirname "$0")/.."

DEBIAN_PACKAGES=(
    prometheus                 # prometheus, promtool
    prometheus-alertmanager    # alertmanager, amtool
    prometheus-node-exporter   # the baseline we compare with and benchmark against
    ethtool                    # `ethtool -S`, compared with our ioctl reader
    iproute2                   # `ip netns`, veth pairs for the ioctl and udev tests
    strace                     # files opened per scrape, in the benchmark
    openssl                    # certificates for the TLS tests
    systemd                    # systemd-analyze verify / security for the unit
    udev                       # a udev daemon for the hotplug test where the host allows one
    curl                       # a second TLS client for the HTTPS tests
)

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

missing=()
for package in "${DEBIAN_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "installing Debian packages: ${missing[*]}"
    as_root apt-get update -qq
    # Package scripts must not start the distribution's own prometheus/alertmanager/node_exporter
    # services: the tests start their own on free loopback ports.
    as_root env DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
fi

python3 -m pip install --quiet --disable-pip-version-check -e ".[test]"
