#!/usr/bin/env bash
# nvshim in one minute, no GPU needed.
#
# Builds the workspace, simulates a host with two NVIDIA GPUs in a temp dir (real device nodes,
# stub driver libraries, /proc files), makes a busybox container bundle, and runs it through
# nvshim-runtime over runc with NVIDIA_VISIBLE_DEVICES=1. The container prints what it sees.
# Needs root (device nodes, runc). Cleans up after itself.
set -euo pipefail
# shellcheck source=scripts/lib/as-root.sh
. "$(dirname "$0")/lib/as-root.sh"
cd "$(dirname "$0")/.."

scripts/install-deps.sh

echo "==> building nvshim (cargo build --workspace)"
cargo build --workspace --quiet
bin=target/debug

work=$(mktemp -d /tmp/nvshim-demo.XXXXXX)
id="nvshim-demo-$$"
cleanup() {
  runc --root "$work/state" delete -f "$id" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

echo "==> simulating a GPU host in $work/host"
"$bin/nvshim-fake-host" "$work/host" --gpus 2 --config "$work/config.toml" \
  | sed -n '1,/control nodes/p' | sed 's/^/    /'
echo "    (index 1 is the GPU on the *second* PCI bus slot, which has minor 0: nvidia-smi numbers"
echo "     GPUs by bus id, and so does NVIDIA_VISIBLE_DEVICES)"

# What the container runs: plain busybox commands, printing what the container can see.
read -r -d '' probe <<'EOF' || true
section() { echo; echo "--- $* ---"; }
section "GPU device nodes: ls -l /dev/nvidia*"
ls -l /dev/nvidia*
section "device cgroup allowlist: /sys/fs/cgroup/devices/devices.list"
awk '$2 ~ /^(195|508):/ { print $0 "    <- NVIDIA"; next } { print }' /sys/fs/cgroup/devices/devices.list
section "nvidia-smi"
nvidia-smi
section "ldconfig -p | grep -E 'libcuda|libnvidia-ml'"
ldconfig -p | grep -E 'libcuda|libnvidia-ml'
section "NVIDIA mounts (destination, ro/rw) from /proc/mounts"
grep -E 'nvidia|cuda' /proc/mounts | while read -r src dst fs opts rest; do
  echo "$dst (${opts%%,*})"
done
EOF

"$bin/nvshim-fake-host" --bundle "$work/bundle" --env NVIDIA_VISIBLE_DEVICES=1 -- sh -c "$probe" >/dev/null

echo
echo "==> NVSHIM_CONFIG=$work/config.toml nvshim-runtime --root $work/state run --bundle $work/bundle $id"
echo "    (nvshim-runtime edits config.json for the GPU request, then execs runc with the same argv)"
status=0
NVSHIM_CONFIG="$work/config.toml" "$bin/nvshim-runtime" --root "$work/state" \
  run --bundle "$work/bundle" "$id" | sed 's/^/    /' || status=$?

echo
if [ "$status" -eq 0 ]; then
  echo "==> done: the container saw one GPU (index 1 = /dev/nvidia0, char 195:0) plus the control"
  echo "    nodes, its device cgroup allows only those, and the driver files are read-only binds"
  echo "    with an ld.so.cache that finds libcuda.so.1."
else
  echo "==> the container run failed (exit $status); nvshim's log:" >&2
  sed 's/^/    /' "$work/nvshim.log" >&2 || true
  exit "$status"
fi
