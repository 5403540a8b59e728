#!/usr/bin/env bash
# The second-kernel lane (issue 22): Debian 12's stock kernel with systemd and cgroup v2 only, booted
# under qemu (software emulation), running memdiag's own set-up and the guest tests (tests/vm) inside.
#
#   scripts/vm.sh                 # the lane's tests (tests/vm)
#   scripts/vm.sh -k oom -x       # extra arguments go to pytest in the guest
#   scripts/vm.sh tests/unit      # a path under tests/ replaces tests/vm
#   scripts/vm.sh --prepare       # everything the tests need, cold parts included, and no test
#
# Run as root. Installs what it needs on the host (qemu-system-x86, qemu-utils, debootstrap, e2fsprogs).
# Cached under /var/lib/memdiag/vm (MEMDIAG_VM_CACHE): the root image (debootstrap, keyed by the package
# list and this script's root recipe: a change rebuilds it), the guest kernel and initrd, a wheelhouse of
# memdiag's Python dependencies (keyed by pyproject.toml; the guest has no network), and a state disk
# mounted at the guest's /var/lib/memdiag (its venv, the BPF programs compiled for its kernel, costs.json).
# Everything else it makes (the qemu process, the copy of the checkout, the run's overlay image) is
# removed on exit, also on failure or Ctrl-C. Exit status: pytest's in the guest; 1 when the lane ran
# and gave no result, 77 when qemu cannot run here at all, each with one line saying why.
# --prepare does the cold parts alone (host tools, wheelhouse, root, and a boot that runs memdiag's
# set-up in the guest onto the state disk: bcc compiling every program for the guest's kernel) and
# exits 0 once the guest's set-up passed: scripts/test.sh runs it beside the main suite, so the lane
# after it starts cached.
#
# Environment: MEMDIAG_VM_FETCH_ONLY=1 fetches what the root and the guest's pip need and stops; MEMDIAG_VM_MEM (MiB, default 3072), MEMDIAG_VM_CPUS (default 2), MEMDIAG_VM_TIMEOUT (s, default
# 3600), MEMDIAG_VM_KEEP=1 keeps the run's folder (console log, results) for a look.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
cache="${MEMDIAG_VM_CACHE:-/var/lib/memdiag/vm}"
mem="${MEMDIAG_VM_MEM:-3072}"
cpus="${MEMDIAG_VM_CPUS:-2}"
limit="${MEMDIAG_VM_TIMEOUT:-3600}"
suite=bookworm
mirror=http://deb.debian.org/debian
say() { echo "vm: $*"; }
fail() { echo "vm: $*" >&2; exit 1; }
# qemu cannot run at all: one line and exit 77, which scripts/test.sh reads as the lane's skip
cannot_run() { echo "vm: qemu cannot run here: $*; the second-kernel lane did not run" >&2; exit 77; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.0f", b - a }'; }
times=()
phase() { times+=("$1 $2 s"); say "$1: $2 s"; }

[ "$(id -u)" -eq 0 ] || fail "must run as root (debootstrap, qemu's images, the guest's root)"
prepare=0
if [ "${1:-}" = --prepare ]; then
    prepare=1
    shift
    [ $# -eq 0 ] || fail "--prepare takes no other argument"
fi

# --- host tools --------------------------------------------------------------------------------
t0=$(now)
need=()
for pkg in qemu-system-x86 qemu-utils debootstrap e2fsprogs; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
    say "installing ${need[*]}"
    apt-get update -qq >/dev/null || true
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null ||
        cannot_run "could not install ${need[*]}"
fi
# Can qemu start a machine at all (software emulation; KVM guests hang at the firmware here)?
if ! echo quit | qemu-system-x86_64 -machine none -accel tcg -display none -monitor stdio -serial none \
    -nodefaults -S >/dev/null 2>&1; then
    cannot_run "qemu-system-x86_64 -accel tcg fails to start"
fi
phase "host tools" "$(since "$t0")"

mkdir -p "$cache"
exec 9>"$cache/lock"
flock -n 9 || { say "another lane holds $cache/lock; waiting"; flock 9; }

# --- the run's folder, removed on exit --------------------------------------------------------
run=$(mktemp -d /var/tmp/memdiag-vm.XXXXXX)
qemu_pid=""
tail_pid=""
cleanup() {
    local rc=$?
    [ -n "$tail_pid" ] && kill "$tail_pid" 2>/dev/null
    # the timeout wrapping qemu, then qemu itself by the pid it wrote
    [ -n "$qemu_pid" ] && kill "$qemu_pid" 2>/dev/null
    if [ -s "$run/qemu.pid" ] && kill -0 "$(cat "$run/qemu.pid")" 2>/dev/null; then
        kill "$(cat "$run/qemu.pid")" 2>/dev/null
        sleep 2
        kill -9 "$(cat "$run/qemu.pid")" 2>/dev/null || true
    fi
    # a root build interrupted half-way leaves its chroot's mounts: never remove through them
    for m in $(awk -v r="$run" 'index($2, r) == 1 { print $2 }' /proc/mounts | sort -r); do umount -l "$m" || true; done
    if [ "${MEMDIAG_VM_KEEP:-0}" = 1 ]; then
        say "kept $run"
    else
        rm -rf --one-file-system "$run"
    fi
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- the wheelhouse (cached): memdiag's Python dependencies for the guest's pip ------------------
t0=$(now)
wkey=$(sha256sum "$here/pyproject.toml" | cut -c1-12)
wheels="$cache/wheels-$wkey"
if [ ! -d "$wheels" ]; then
    say "fetching memdiag's Python dependencies for the guest (once per pyproject.toml)"
    /usr/bin/python3 -m venv "$run/pip"
    mapfile -t reqs < <(/usr/bin/python3 - "$here/pyproject.toml" <<'EOF'
import sys, tomllib
p = tomllib.load(open(sys.argv[1], "rb"))
for r in p["build-system"]["requires"] + p["project"]["dependencies"] + p["project"]["optional-dependencies"]["test"]:
    print(r)
EOF
)
    if ! "$run/pip/bin/pip" wheel -q --disable-pip-version-check --wheel-dir "$run/wheels" "${reqs[@]}" >"$run/pip.log" 2>&1; then
        tail -n 20 "$run/pip.log" >&2
        fail "could not fetch the Python dependencies for the guest (log above)"
    fi
    mv "$run/wheels" "$wheels"
    rm -rf "$run/pip"
fi
phase "wheelhouse" "$(since "$t0")"

# --- the root image (cached) -------------------------------------------------------------------
# What the guest needs: systemd as init (cgroup v2 only, podman's systemd cgroup manager over dbus),
# the stock kernel with its own headers (bcc compiles against them: no fallback), the distro's bcc,
# what scripts/setup.sh installs, podman with crun, stress-ng for pressure. debootstrap resolves no
# virtual package: podman's containers-common depends on container-network-stack, which
# containernetworking-plugins provides (without it dpkg left podman unconfigured and the build failed).
packages=(systemd systemd-sysv udev dbus kmod procps util-linux iproute2 e2fsprogs initramfs-tools
    linux-image-amd64 linux-headers-amd64 bpfcc-tools python3-bpfcc python3-venv python3-pip-whl
    gcc g++ libc6-dev libc6-dbg make libjemalloc2 podman crun conmon catatonit containernetworking-plugins stress-ng strace
    ca-certificates)
recipe=3 # bump when the way the root is made changes (the unit, sysctls, masked services)
key=$(printf '%s\n' "$suite" "$mirror" "$recipe" "${packages[@]}" | sha256sum | cut -c1-12)
root_img="$cache/root-$key.img"
inc=$(IFS=,; echo "${packages[*]}")
# the packages first (network, little CPU; cached apart, so a failed install does not fetch again)
debs="$cache/debs-$key.tgz"
if [ ! -e "$root_img" ] && [ ! -e "$debs" ]; then
    t0=$(now)
    say "fetching the guest's packages (Debian $suite, ${#packages[@]} named)"
    if ! debootstrap --variant=minbase --include="$inc" --make-tarball="$run/debs.tgz" "$suite" "$run/fetch" \
        "$mirror" >"$run/fetch.log" 2>&1; then
        tail -n 20 "$run/fetch.log" >&2
        fail "debootstrap could not fetch the guest's packages (log above)"
    fi
    mv "$run/debs.tgz" "$debs"
    rm -rf --one-file-system "$run/fetch"
    phase "root packages fetched" "$(since "$t0")"
fi
if [ "${MEMDIAG_VM_FETCH_ONLY:-0}" = 1 ]; then
    say "fetched; MEMDIAG_VM_FETCH_ONLY=1 stops here"
    exit 0
fi
if [ ! -e "$root_img" ]; then
    t0=$(now)
    say "building the guest's root (Debian $suite, ${#packages[@]} packages; a few minutes, once)"
    root="$run/root"
    mkdir -p "$root"
    if ! debootstrap --variant=minbase --include="$inc" --unpack-tarball="$debs" "$suite" "$root" "$mirror" \
        >"$run/debootstrap.log" 2>&1; then
        tail -n 20 "$run/debootstrap.log" >&2
        fail "debootstrap failed (log above)"
    fi
    echo memdiag-vm >"$root/etc/hostname"
    echo "/dev/vda / ext4 rw,noatime 0 1" >"$root/etc/fstab"
    # kprobes under tcg are reliable unoptimized only (an oops seen with optimized ones)
    echo "debug.kprobes-optimization = 0" >"$root/etc/sysctl.d/90-memdiag-lane.conf"
    cat >"$root/usr/local/sbin/memdiag-lane" <<'EOF'
#!/bin/bash
# Boot-time entry of the second-kernel lane: the checkout comes in on a 9p share, results go back there.
modprobe -a 9pnet_virtio 9p
mkdir -p /mnt/memdiag /mnt/wheels /var/lib/memdiag
if mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 memdiag /mnt/memdiag; then
    mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,ro wheels /mnt/wheels
    mount /dev/vdb /var/lib/memdiag
    bash /mnt/memdiag/src/scripts/vm-guest.sh
    echo "lane: guest script exited $?"
else
    echo "lane: the 9p share did not mount"
fi
sync
systemctl --no-block poweroff
EOF
    chmod 755 "$root/usr/local/sbin/memdiag-lane"
    cat >"$root/etc/systemd/system/memdiag-lane.service" <<'EOF'
[Unit]
Description=memdiag second-kernel lane
After=local-fs.target systemd-sysctl.service dbus.service
Wants=dbus.service

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/memdiag-lane
StandardOutput=journal+console
StandardError=journal+console
TimeoutStartSec=infinity

[Install]
WantedBy=multi-user.target
EOF
    ln -sf /etc/systemd/system/memdiag-lane.service "$root/etc/systemd/system/multi-user.target.wants/memdiag-lane.service"
    # nothing else runs beside the tests (timers, a login on the console)
    for unit in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer man-db.timer \
        dpkg-db-backup.timer systemd-timesyncd.service getty@tty1.service serial-getty@ttyS0.service \
        podman-auto-update.timer podman-restart.service; do
        ln -sf /dev/null "$root/etc/systemd/system/$unit"
    done
    kver=$(ls "$root/lib/modules" | sort -V | tail -n 1)
    [ -e "$root/boot/vmlinuz-$kver" ] || fail "no kernel in the debootstrapped root"
    # build is an absolute link (/usr/src/linux-headers-...): it resolves inside the root, not on the host
    build=$(readlink "$root/lib/modules/$kver/build" || true)
    case "$build" in /*) build="$root$build" ;; ?*) build="$root/lib/modules/$kver/$build" ;; esac
    [ -n "$build" ] && [ -e "$build/include" ] || fail "no headers for $kver in the root"
    cp "$root/boot/vmlinuz-$kver" "$run/vmlinuz"
    cp "$root/boot/initrd.img-$kver" "$run/initrd"
    rm -rf "$root/var/cache/apt/archives/"*.deb
    mke2fs -q -t ext4 -L memdiag-root -d "$root" "$run/root.img" 8G || fail "mke2fs of the root image failed"
    mv "$run/vmlinuz" "$cache/vmlinuz-$key"
    mv "$run/initrd" "$cache/initrd-$key"
    echo "$kver" >"$cache/kernel-$key"
    mv "$run/root.img" "$root_img"
    rm -rf --one-file-system "$root"
    rm -f "$debs"
    phase "root build (cold)" "$(since "$t0")"
else
    phase "root build (cached)" 0
fi
kver=$(cat "$cache/kernel-$key")
state_img="$cache/state-$key.img"
[ -e "$state_img" ] || mke2fs -q -t ext4 -L memdiag-state "$state_img" 8G

# --- this run: the checkout, an overlay of the root ---------------------------------------------
t0=$(now)
share="$run/share"
mkdir -p "$share/src" "$share/results"
# the working tree as it is (tracked and untracked files, not what .gitignore leaves out)
(cd "$here" && git ls-files -z -co --exclude-standard | tar --null --ignore-failed-read -T - -cf - 2>/dev/null) |
    tar -x -C "$share/src"
# pytest's arguments, one a line: tests/vm unless a path under tests/ is given
has_path=0
for a in "$@"; do case "$a" in tests/* | tests) has_path=1 ;; esac; done
{
    [ $has_path -eq 1 ] || echo tests/vm
    for a in "$@"; do echo "$a"; done
} >"$share/args"
[ $prepare -eq 0 ] || : >"$share/prepare" # the guest stops after its set-up (scripts/vm-guest.sh)
qemu-img create -q -f qcow2 -b "$root_img" -F raw "$run/root.qcow2"
phase "run's images" "$(since "$t0")"

# --- boot and run ---------------------------------------------------------------------------------
t0=$(now)
say "booting Debian's kernel $kver (cgroup v2, tcg, ${cpus} vCPU, ${mem} MiB); the guest's lines follow"
: >"$run/console.log"
# thread=single: multi-threaded tcg oopsed the guest kernel; one host core at most
timeout -k 10 "$limit" qemu-system-x86_64 -accel tcg,thread=single,tb-size=512 -cpu max \
    -machine q35 -smp "$cpus" -m "$mem" -nodefaults -no-reboot -display none -monitor none -nic none \
    -pidfile "$run/qemu.pid" \
    -serial "file:$run/console.log" \
    -kernel "$cache/vmlinuz-$key" -initrd "$cache/initrd-$key" \
    -append "root=/dev/vda rw console=ttyS0 systemd.unified_cgroup_hierarchy=1 mitigations=off panic=-1 quiet loglevel=4 systemd.show_status=0" \
    -drive "file=$run/root.qcow2,if=virtio,format=qcow2,cache=unsafe" \
    -drive "file=$state_img,if=virtio,format=raw" \
    -virtfs "local,path=$share,mount_tag=memdiag,security_model=none,id=memdiag" \
    -virtfs "local,path=$wheels,mount_tag=wheels,security_model=none,readonly=on,id=wheels" &
qemu_pid=$!
# the guest's lines come through systemd's journal to the console: "[  55.7] memdiag-lane[277]: lane: ..."
tail -n +1 -F --pid="$qemu_pid" "$run/console.log" 2>/dev/null | grep --line-buffered -E '(^|\]: )(lane|setup|vm-guest)|(^|\]: )=+ .* =+$|(PASSED|FAILED|ERROR)( |$)|Kernel panic|BUG:|Oops' &
tail_pid=$!
set +e
wait "$qemu_pid"
qrc=$?
set -e
qemu_pid=""
sleep 1
kill "$tail_pid" 2>/dev/null || true
tail_pid=""
phase "guest (boot to poweroff)" "$(since "$t0")"

res="$share/results"
if [ $qrc -eq 124 ] || [ $qrc -eq 137 ]; then
    echo "vm: the guest did not finish within ${limit} s (MEMDIAG_VM_TIMEOUT); console's last lines:" >&2
    tail -n 30 "$run/console.log" >&2
    exit 1
fi
if [ ! -e "$res/rc" ]; then
    echo "vm: the guest gave no result (qemu exited $qrc); console's last lines:" >&2
    tail -n 40 "$run/console.log" >&2
    exit 1
fi
[ -e "$res/times" ] && while read -r line; do times+=("$line"); done <"$res/times"
echo "vm: times: $(IFS=';'; echo "${times[*]}")"
if [ $prepare -eq 1 ]; then
    rc=$(cat "$res/rc")
    [ "$rc" = 0 ] && say "prepared: root, wheelhouse and the guest's set-up cached in $cache (no test ran)"
    [ "$rc" = 0 ] || sed 's/^/vm: guest: /' "$res/summary" >&2
    exit "$rc"
fi
[ -e "$res/summary" ] && sed 's/^/vm: guest pytest: /' "$res/summary"
rc=$(cat "$res/rc")
# a failure's own lines (the assertion and its message), else the run's folder and its log are gone
if [ "$rc" != 0 ] && [ -e "$res/pytest.log" ]; then
    sed -n '/^=\+ FAILURES =\+$/,/^=\+ short test summary/p' "$res/pytest.log" | grep -v '^=\+ short test summary' |
        tail -n 200 | sed 's/^/vm: guest: /'
fi
if [ "${MEMDIAG_VM_KEEP:-0}" = 1 ]; then cp "$run/console.log" "$res/"; fi
exit "$rc"
