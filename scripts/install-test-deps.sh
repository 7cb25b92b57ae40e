#!/usr/bin/env bash
# Installs everything the test suite uses on a fresh Debian machine: the real Prometheus tools the
# tests run against (promtool, prometheus, alertmanager, amtool, node_exporter, and Prometheus 3 with its
# Alertmanager unpacked into a cache), the network and tracing tools (ethtool, iproute2, strace, openssl,
# curl, systemd-analyze), qemu and a Debian kernel for the tests that boot a VM with soft RoCE (tests/vm/),
# and the Python package with its test extras. Safe to run again: apt and pip skip what is already there,
# and the kernel and Prometheus 3 are fetched only when absent.
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
    qemu-system-x86            # boots the Debian kernel for tests/test_real_kernel.py (KVM when /dev/kvm allows)
    busybox-static             # the VM's initramfs: a static shell, insmod, mount, chroot, poweroff
    rdma-core                  # the rdma_rxe udev/modprobe setup and rdma-core's libibverbs for the VM
    ibverbs-utils              # ibv_rc_pingpong, the real RDMA traffic the VM test sends over rxe0
    ibverbs-providers          # librxe, the userspace provider of the soft-RoCE device
)

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

missing=()
for package in "${DEBIAN_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
# The distribution's prometheus, alertmanager and node_exporter services must not start, now or at boot:
# they would listen on every interface without authentication, and the tests start their own on free
# loopback ports. Package scripts start a service through deb-systemd-invoke, which asks policy-rc.d
# (RUNLEVEL is not consulted on a systemd host), and enable it whatever the policy says.
SERVICES=(prometheus prometheus-alertmanager prometheus-node-exporter)
POLICY_RC_D="${RDMA_EXPORTER_POLICY_RC_D:-/usr/sbin/policy-rc.d}"  # tests point it elsewhere
disable_new_services() {
    command -v systemctl >/dev/null || return 0
    for service in "${SERVICES[@]}"; do
        if [[ " ${missing[*]} " == *" $service "* ]]; then
            as_root systemctl disable --quiet "$service.service" 2>/dev/null || true
        fi
    done
}
if [ "${#missing[@]}" -gt 0 ]; then
    echo "installing Debian packages: ${missing[*]}"
    as_root apt-get update -qq
    # Also when the install fails part way: a package already configured was enabled, and the next run
    # counts it installed and would never disable it.
    trap 'disable_new_services' EXIT
    own_policy=""
    marker="# rdma-exporter install-test-deps.sh: temporary"
    # A machine's own policy (container images ship one) stays as it is; one this script left behind when
    # it was killed is its own.
    if [ ! -e "$POLICY_RC_D" ] || grep -qF "$marker" "$POLICY_RC_D"; then
        own_policy=1
        trap 'as_root rm -f "$POLICY_RC_D"; disable_new_services' EXIT
        # Only the three services are refused (policy-rc.d gets the service's name first): udev and the
        # rest start as their packages intend.
        printf '#!/bin/sh\n%s\ncase "$1" in prometheus*) exit 101 ;; esac\nexit 0\n' "$marker" |
            as_root tee "$POLICY_RC_D" >/dev/null
        as_root chmod 0755 "$POLICY_RC_D"
    fi
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
    if [ -n "$own_policy" ]; then
        as_root rm -f "$POLICY_RC_D"
    fi
    trap - EXIT
    disable_new_services
fi

# The VM tests boot the distribution's own kernel, which has rdma_rxe, 9p and virtio as modules. It is
# unpacked into a cache and never installed into the host (that would run initramfs and bootloader hooks).
# The version is the one linux-image-amd64 depends on at the time of the first run.
VM_CACHE="${RDMA_EXPORTER_VM_CACHE:-$HOME/.cache/rdma-exporter-vm}"
current_kernel_package() {
    # apt-cache exits 100 when the package lists were cleaned (as container images do): under pipefail
    # that would end the script, but it only means "not known yet", which an update answers.
    { apt-cache depends linux-image-amd64 2>/dev/null || true; } |
        awk '$1 == "Depends:" && $2 ~ /^linux-image-/ {print $2; exit}'
}
if ! compgen -G "$VM_CACHE/kernel/boot/vmlinuz-*" >/dev/null; then
    kernel_package="$(current_kernel_package)"
    if [ -z "$kernel_package" ]; then
        as_root apt-get update -qq
        kernel_package="$(current_kernel_package)"
    fi
    if [ -z "$kernel_package" ]; then
        echo "install-test-deps: apt knows no linux-image-amd64 dependency; cannot fetch the VM kernel" >&2
        exit 1
    fi
    echo "fetching $kernel_package-unsigned into $VM_CACHE"
    download="$(mktemp -d)"
    trap 'rm -rf "$download"' EXIT  # a failed download leaves nothing in /tmp
    # -unsigned: the same kernel without the Secure Boot signature, which a VM booted by -kernel needs not.
    (cd "$download" && apt-get download -qq -o APT::Sandbox::User=root "$kernel_package-unsigned")
    # One command a line: under set -e a failing command before && does not stop the script.
    rm -rf "$VM_CACHE/kernel.new"
    mkdir -p "$VM_CACHE/kernel.new"
    dpkg-deb -x "$download"/*.deb "$VM_CACHE/kernel.new"
    rm -rf "$download" "$VM_CACHE/kernel"
    trap - EXIT
    mv "$VM_CACHE/kernel.new" "$VM_CACHE/kernel"
fi

# The alert pack is also tested with Prometheus 3.5, the LTS line, and the Alertmanager beside it, as
# Debian testing ships them: most clusters now run 3.x, whose left-open range selectors change what a
# window holds. Unpacked into a cache and never installed: the packages share names and paths with
# Debian 12's 2.42 above. apt fetches them with a private state directory and sources list, so the
# machine's own package lists are untouched (its proxy settings still apply, its update hooks do not),
# and checks the suite's signature against Debian's archive keyring. A mirror of the machine's own can
# stand in for deb.debian.org.
PROMETHEUS3_DIR="${RDMA_EXPORTER_PROMETHEUS3_DIR:-$HOME/.cache/rdma-exporter-prometheus3}"
PROMETHEUS3_MIRROR="${RDMA_EXPORTER_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PROMETHEUS3_SUITE=forky
PROMETHEUS3_LINE=3.5  # the unit tests' expectations are checked against this line
PROMETHEUS3_PACKAGES=(prometheus promtool prometheus-alertmanager)
if [ ! -x "$PROMETHEUS3_DIR/usr/bin/promtool" ] || [ ! -x "$PROMETHEUS3_DIR/usr/bin/prometheus" ] ||
    [ ! -x "$PROMETHEUS3_DIR/usr/bin/prometheus-alertmanager" ]; then
    echo "fetching ${PROMETHEUS3_PACKAGES[*]} from Debian $PROMETHEUS3_SUITE into $PROMETHEUS3_DIR"
    apt_dir="$(mktemp -d)"
    trap 'rm -rf "$apt_dir"' EXIT
    mkdir -p "$apt_dir/lists/partial" "$apt_dir/archives/partial" "$apt_dir/debs"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $PROMETHEUS3_MIRROR $PROMETHEUS3_SUITE main" \
        >"$apt_dir/sources.list"
    printf '#clear APT::Update::Post-Invoke;\n#clear APT::Update::Post-Invoke-Success;\n' >"$apt_dir/apt.conf"
    private_apt=(
        -c "$apt_dir/apt.conf"
        -o Dir::State="$apt_dir" -o Dir::State::Lists="$apt_dir/lists" -o Dir::State::status=/dev/null
        -o Dir::Cache="$apt_dir" -o Dir::Cache::Archives="$apt_dir/archives"
        -o Dir::Etc::SourceList="$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
        -o APT::Sandbox::User=root
    )
    apt-get -qq "${private_apt[@]}" update
    (cd "$apt_dir/debs" && apt-get -qq "${private_apt[@]}" download "${PROMETHEUS3_PACKAGES[@]}")
    version="$(dpkg-deb -f "$apt_dir"/debs/promtool_*.deb Version)"
    if [[ "$version" != "$PROMETHEUS3_LINE".* ]]; then
        echo "install-test-deps: Debian $PROMETHEUS3_SUITE's promtool is $version, not $PROMETHEUS3_LINE.x:" \
            "run the rules' unit tests with it and update PROMETHEUS3_LINE" >&2
        exit 1
    fi
    rm -rf "$PROMETHEUS3_DIR.new"
    mkdir -p "$PROMETHEUS3_DIR.new"
    for deb in "$apt_dir"/debs/*.deb; do dpkg-deb -x "$deb" "$PROMETHEUS3_DIR.new"; done
    # Runs on this machine (the binaries need a recent enough glibc), or the setup fails here.
    "$PROMETHEUS3_DIR.new/usr/bin/promtool" --version >/dev/null
    rm -rf "$PROMETHEUS3_DIR"
    mv "$PROMETHEUS3_DIR.new" "$PROMETHEUS3_DIR"
    rm -rf "$apt_dir"
    trap - EXIT
fi

# At the versions the image ships (deploy/constraints.txt), so that the suite tests what is deployed; the
# environment variables pin the editable build's setuptools too, as in the Dockerfile.
# Relative to the checkout (the script's working directory, and pip's build subprocesses'): pip splits
# these variables at spaces, which a checkout's absolute path may hold.
PIP_CONSTRAINT=deploy/constraints.txt PIP_BUILD_CONSTRAINT=deploy/constraints.txt \
    python3 -m pip install --quiet --disable-pip-version-check --constraint deploy/constraints.txt -e ".[test]"
