#!/bin/bash
# Inside the second-kernel lane's guest (run at boot by memdiag-lane.service, see scripts/vm.sh): the
# checkout copied from the 9p share to the guest's own disk, memdiag's own set-up (scripts/setup.sh; its
# venv, BPF programs and costs on the state disk at /var/lib/memdiag), then pytest with the lane's
# arguments. Results go back to the share: rc, times, summary, pytest.log, junit.xml.
set -u
share=/mnt/memdiag
res=$share/results
up() { cut -d' ' -f1 /proc/uptime; }
secs() { awk -v a="$1" -v b="$(up)" 'BEGIN { printf "%.0f", b - a }'; }
boot=$(up)
echo "lane: booted in ${boot%.*} s (guest clock): kernel $(uname -r), $(stat -fc %T /sys/fs/cgroup) at /sys/fs/cgroup"
echo "boot ${boot%.*} s" >>"$res/times"

rm -rf /root/memdiag
cp -a "$share/src" /root/memdiag
mkdir -p /var/lib/memdiag/build
ln -sfn /var/lib/memdiag/build /root/memdiag/.build # the kit's workloads, built once per source
cd /root/memdiag || exit 1
export MEMDIAG_VENV=/var/lib/memdiag/venv PIP_NO_INDEX=1 PIP_FIND_LINKS=/mnt/wheels
# podman as the distribution runs it on cgroup v2: crun under systemd's cgroup manager (tests/containers.py)
export MEMDIAG_TEST_OCI_RUNTIME=crun MEMDIAG_TEST_CGROUP_MANAGER=systemd

t0=$(up)
echo "lane: memdiag's set-up (scripts/setup.sh)"
./scripts/setup.sh >"$res/setup.log" 2>&1
src=$?
sed 's/^/lane: setup: /' "$res/setup.log" | tail -n 20
echo "guest set-up $(secs "$t0") s" >>"$res/times"
if [ $src -ne 0 ]; then
    echo "lane: set-up failed ($src)"
    echo "set-up failed ($src)" >"$res/summary"
    echo 1 >"$res/rc"
    exit 1
fi

if [ -e "$share/prepare" ]; then # scripts/vm.sh --prepare: the set-up, and the kit's programs the lane runs
    mapfile -t kit < <(grep -ohE 'workload\("[a-z_0-9]+"' tests/vm/*.py | cut -d'"' -f2 | sort -u)
    "$MEMDIAG_VENV/bin/python" - "${kit[@]}" >>"$res/setup.log" 2>&1 <<'EOF'
import sys
sys.path.insert(0, "tests")
import kit
for name in sys.argv[1:]:
    print("lane: built", kit.build(name))
EOF
    echo "lane: prepared (memdiag's set-up done on the state disk, the kit's ${kit[*]} built; no test run)"
    echo "prepared" >"$res/summary"
    echo 0 >"$res/rc"
    sync
    exit 0
fi
mapfile -t args <"$share/args"
t0=$(up)
echo "lane: pytest ${args[*]}"
MEMDIAG_LANE_GUEST=1 MEMDIAG_NO_SKIP=1 "$MEMDIAG_VENV/bin/python" -m pytest -p no:cacheprovider -v -rA \
    --junitxml="$res/junit.xml" "${args[@]}" 2>&1 | tee "$res/pytest.log"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 5 ] && rc=1 # nothing collected is a failure
echo "tests $(secs "$t0") s" >>"$res/times"
{
    grep -E '^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) ' "$res/pytest.log"
    tail -n 1 "$res/pytest.log"
} >"$res/summary"
echo "$rc" >"$res/rc"
sync
