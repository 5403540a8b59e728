#!/usr/bin/env bash
# Idempotent set-up for memdiag on Debian/Ubuntu, run as root: distro bcc, kernel headers
# (or a generic fallback), tracefs, a C toolchain for the workload kit, and a venv that can
# import the distro's bcc. Prints one line per thing it had to do; quiet when all is done.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
venv="${MEMDIAG_VENV:-$here/.venv}"
release=$(uname -r)
say() { echo "setup: $*"; }

if [ "$(id -u)" -ne 0 ]; then
    echo "setup: must run as root (BPF, cgroups and apt need it)" >&2
    exit 1
fi

# --- distro packages -------------------------------------------------------------------
# PyPI's "bcc" is an unrelated project: bcc's Python bindings come from the distro.
need=()
# libc6-dbg: glibc's symbols by build-id, so frames inside malloc are named, not [unknown]
packages=(bpfcc-tools python3-bpfcc python3-venv gcc g++ libc6-dev libc6-dbg make libjemalloc2 util-linux)
# --test: what only the test suite needs (a real Alertmanager to send webhooks, a real browser,
# a real container runtime: podman with runc, since crun refuses hybrid cgroup hosts; a real
# Python daemon of the distribution, graphite-carbon, whose cache memdiag names in Python's terms;
# the Go toolchain, Node and rustc (with LLVM's linker, as Rust links by default now) that build
# and run the runtime tests' programs; a real JVM with its
# javac, jfr tool and JNI headers for the Java workloads, and a Java server of Debian's, H2)
if [ "${1:-}" = "--test" ]; then
    packages+=(prometheus-alertmanager curl chromium strace podman runc graphite-carbon golang-go nodejs lld)
    packages+=(openjdk-17-jdk-headless libh2-java)
    packages+=(stress-ng)  # a busy host, for the signal tests that must hold under load
    packages+=(libtcmalloc-minimal4 libmimalloc2.0)  # the accuracy corpus's preloaded allocators
fi
for pkg in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
# a Rust toolchain of the user's own (rustup's) serves; else Debian's
if [ "${1:-}" = "--test" ] && ! command -v rustc >/dev/null; then
    need+=(rustc)
fi
# --test: promtool checks the shipped alert rules (deploy/prometheus) against the real
# process-exporter's series; both come with servers (and node-exporter) not wanted running.
new_services=()
if [ "${1:-}" = "--test" ]; then
    if ! command -v promtool >/dev/null; then
        need+=(prometheus)
        new_services+=(prometheus)
        command -v prometheus-node-exporter >/dev/null || new_services+=(prometheus-node-exporter)
    fi
    command -v prometheus-process-exporter >/dev/null || { need+=(prometheus-process-exporter); new_services+=(prometheus-process-exporter); }
    # the distribution's servers memory no heap holds is judged on (tests/e2e/test_distro_nonheap.py):
    # the tests run throwaway instances of their own, so the packages' services are not wanted running
    command -v redis-server >/dev/null || { need+=(redis-server); new_services+=(redis-server); }
    ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { need+=(postgresql); new_services+=(postgresql); }
fi
headers_pkg="linux-headers-$release"
private_hdr="/var/lib/memdiag/kernel-headers/$release"
have_exact_headers=0
if [ -e "/lib/modules/$release/build/include" ] || [ -e "$private_hdr/include" ]; then
    have_exact_headers=1
fi
if [ ${#need[@]} -gt 0 ] || [ $have_exact_headers -eq 0 ]; then
    apt_updated=0
    apt_update() { [ $apt_updated -eq 1 ] || { apt-get update -qq >/dev/null; apt_updated=1; }; }
    if [ $have_exact_headers -eq 0 ]; then
        apt_update
        if apt-cache show "$headers_pkg" >/dev/null 2>&1; then
            need+=("$headers_pkg")
        elif ! dpkg-query -W -f='${Status}' linux-headers-amd64 2>/dev/null | grep -q "install ok installed"; then
            case "$(dpkg --print-architecture)" in
                amd64) need+=(linux-headers-amd64) ;;
                arm64) need+=(linux-headers-arm64) ;;
                *) need+=(linux-headers-generic) ;;
            esac
        fi
    fi
    if [ ${#need[@]} -gt 0 ]; then
        apt_update
        say "installing ${need[*]}"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
    fi
fi
if [ ${#new_services[@]} -gt 0 ] && [ -d /run/systemd/system ]; then
    systemctl disable --now "${new_services[@]}" >/dev/null 2>&1 || true
fi

# --- kernel headers ----------------------------------------------------------------------
# bcc compiles programs against the running kernel's headers. Where the distro has none for
# this kernel (custom builds), fall back to the distro's generic headers in a private tree
# that memdiag points bcc at with BCC_KERNEL_SOURCE; /lib/modules is left untouched.
if [ ! -e "/lib/modules/$release/build/include" ] && [ ! -e "$private_hdr/include" ]; then
    gen=$(ls -d /usr/src/linux-headers-*-amd64 /usr/src/linux-headers-*-arm64 /usr/src/linux-headers-*-generic 2>/dev/null | sort -V | tail -n 1 || true)
    if [ -z "$gen" ]; then
        echo "setup: no kernel headers found for $release and no generic headers to fall back to" >&2
        exit 1
    fi
    common=${gen%-*}-common
    mkdir -p "$private_hdr"
    # A tree of symlinks: the -common source headers, overlaid by the flavour's generated ones.
    [ -d "$common" ] && cp -as "$common/." "$private_hdr/"
    cp -as --remove-destination "$gen/." "$private_hdr/"
    say "no headers for kernel $release; using generic $(basename "$gen") in $private_hdr"
fi

# --- tracefs / debugfs -------------------------------------------------------------------
# bcc looks for tracepoints under /sys/kernel/debug/tracing.
if [ ! -e /sys/kernel/debug/tracing/events ]; then
    mountpoint -q /sys/kernel/debug || mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null || true
    if [ ! -e /sys/kernel/debug/tracing/events ]; then
        mount -t tracefs tracefs /sys/kernel/debug/tracing 2>/dev/null || true
    fi
    say "mounted debugfs/tracefs"
fi
if [ ! -e /sys/kernel/tracing/events ]; then
    mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null || true
fi

# --- virtual environment -----------------------------------------------------------------
# Debian's bcc module is installed for /usr/bin/python3 only; a venv made from that
# interpreter with --system-site-packages imports it.
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import bcc" 2>/dev/null; then
    rm -rf "$venv"
    /usr/bin/python3 -m venv --system-site-packages "$venv"
    say "created $venv"
fi
stamp="$venv/.memdiag-installed"
if [ ! -e "$stamp" ] || [ "$here/pyproject.toml" -nt "$stamp" ]; then
    log=$(mktemp)
    if ! "$venv/bin/pip" install -q --disable-pip-version-check -e "$here[test]" >"$log" 2>&1; then
        cat "$log" >&2
        rm -f "$log"
        exit 1
    fi
    rm -f "$log"
    touch "$stamp"
    say "installed memdiag into $venv"
fi

# --- man page and shell completion ------------------------------------------------------
# generated from the parser (scripts/cli_docs.py), kept in docs/: `man memdiag`, tab completion
"$here/scripts/install_cli_docs.sh"

# --- BPF programs --------------------------------------------------------------------------
# Compiled once per kernel (bcc's compiler peaks at 130-170 MiB); a diagnosis then loads cached
# bytecode. Prints one line only when something was compiled.
"$venv/bin/memdiag" prepare --quiet
