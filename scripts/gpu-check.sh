#!/usr/bin/env bash
# Real-GPU check: on a host with an NVIDIA driver loaded (driver root $DRIVER_ROOT, default /), run containers
# through nvshim-runtime over runc that list their GPUs with the mounted nvidia-smi and make a
# CUDA call through the mounted libcuda. Needs root, the built binaries (target/release or
# $NVSHIM_BIN), a runc binary ($RUNC, else on PATH) and nothing else: the rootfs is made here
# from the host's own glibc.
#
#   sudo scripts/gpu-check.sh            # NVIDIA_VISIBLE_DEVICES=all
#   sudo GPUS=0 scripts/gpu-check.sh     # one GPU
#   sudo DRIVER_ROOT=/run/nvidia/driver scripts/gpu-check.sh   # a driver container's root
set -euo pipefail
# shellcheck source=scripts/lib/as-root.sh
. "$(dirname "$0")/lib/as-root.sh"
cd "$(dirname "$0")/.."
BIN=${NVSHIM_BIN:-$PWD/target/release}
RUNC=${RUNC:-$(command -v runc || true)}
GPUS=${GPUS:-all}
DRIVER_ROOT=${DRIVER_ROOT:-/}
step() { printf '\n== %s\n' "$*"; }

[ -x "$RUNC" ] || { echo "gpu-check: no runc (set RUNC=/path/to/runc)" >&2; exit 1; }
for b in nvshim-runtime nvshim-hook nvshim; do
  [ -x "$BIN/$b" ] || { echo "gpu-check: $BIN/$b missing (scripts/build-release.sh)" >&2; exit 1; }
done
[ -r /proc/driver/nvidia/version ] || { echo "gpu-check: no NVIDIA driver loaded" >&2; exit 1; }

work=$(mktemp -d /tmp/nvshim-gpu-check.XXXXXX)
state=$work/runc-state
cleanup() {
  for id in $("$RUNC" --root "$state" list -q 2>/dev/null); do "$RUNC" --root "$state" delete -f "$id" >/dev/null 2>&1 || true; done
  rm -rf "$work"
}
trap cleanup EXIT

step "host"
head -1 /proc/driver/nvidia/version
ls /proc/driver/nvidia/gpus/
"$RUNC" --version | head -1

step "rootfs (host glibc only; the driver comes from nvshim)"
rootfs=$work/bundle/rootfs
mkdir -p "$rootfs"/{bin,etc,proc,sys,dev,tmp,usr/bin}
probe=$work/cuda-probe
if [ -n "${CUDA_PROBE:-}" ]; then cp "$CUDA_PROBE" "$probe"
elif command -v cc >/dev/null; then cc -O2 -o "$probe" scripts/cuda-probe.c -ldl
else echo "gpu-check: no C compiler; set CUDA_PROBE to a prebuilt scripts/cuda-probe.c" >&2; exit 1
fi
cp "$probe" "$rootfs/bin/cuda-probe"
smi=$(command -v nvidia-smi || echo /usr/bin/nvidia-smi)
# Copy the C library closure of the programs, but none of the NVIDIA libraries: those must
# come from nvshim's mounts.
for f in "$probe" "$smi"; do
  ldd "$f" | awk '{for(i=1;i<=NF;i++) if ($i ~ /^\//) print $i}'
done | sort -u | grep -v -E 'libnvidia|libcuda' | while read -r lib; do
  mkdir -p "$rootfs$(dirname "$lib")"; cp -L "$lib" "$rootfs$lib"
  real=$(readlink -f "$lib"); mkdir -p "$rootfs$(dirname "$real")"; cp -L "$lib" "$rootfs$real" 2>/dev/null || true
done
echo "$(find "$rootfs" -type f | wc -l) files"

cat >"$work/config.toml" <<TOML
low-level-runtimes = ["$RUNC"]
driver-root = "$DRIVER_ROOT"
dev-root = "/"
proc-root = "/proc"
hook-path = "$BIN/nvshim-hook"
log-file = "$work/nvshim.log"
log-level = "debug"
cdi-spec-dirs = ["$work/cdi"]
TOML
export NVSHIM_CONFIG=$work/config.toml

# A minimal OCI config (what `runc spec` writes, with terminal off and the host's glibc rootfs).
write_config() { # args: env-json annotations-json argv-json
  cat >"$work/bundle/config.json" <<JSON
{"ociVersion":"1.0.2","process":{"terminal":false,"user":{"uid":0,"gid":0},"args":$3,
 "env":["PATH=/usr/bin:/bin",$1],"cwd":"/",
 "capabilities":{"bounding":["CAP_KILL","CAP_NET_BIND_SERVICE","CAP_AUDIT_WRITE"],"effective":["CAP_KILL"],"permitted":["CAP_KILL"]},
 "rlimits":[{"type":"RLIMIT_NOFILE","hard":1024,"soft":1024}],"noNewPrivileges":true},
 "root":{"path":"rootfs","readonly":false},"hostname":"gpu-check","annotations":$2,
 "mounts":[{"destination":"/proc","type":"proc","source":"proc"},
  {"destination":"/dev","type":"tmpfs","source":"tmpfs","options":["nosuid","strictatime","mode=755","size=65536k"]},
  {"destination":"/sys","type":"sysfs","source":"sysfs","options":["nosuid","noexec","nodev","ro"]}],
 "linux":{"resources":{"devices":[{"allow":false,"access":"rwm"}]},
  "namespaces":[{"type":"pid"},{"type":"ipc"},{"type":"uts"},{"type":"mount"}],
  "maskedPaths":["/proc/kcore"],"readonlyPaths":["/proc/sys"]}}
JSON
}

failed=()
run() { # name: every step runs; the failures are listed at the end
  if ! "$BIN/nvshim-runtime" --root "$state" run --bundle "$work/bundle" "gpu-check-$1-$$"; then
    echo "gpu-check: step $1 FAILED"
    failed+=("$1")
  fi
}

step "nvshim doctor"
rc=0; "$BIN/nvshim" doctor || rc=$?
[ "$rc" -le 1 ] || failed+=(doctor) # 1: warnings only

step "nvidia-smi -L in a container (NVIDIA_VISIBLE_DEVICES=$GPUS)"
write_config "\"NVIDIA_VISIBLE_DEVICES=$GPUS\",\"NVIDIA_DRIVER_CAPABILITIES=compute,utility\"" '{}' '["/usr/bin/nvidia-smi","-L"]'
run smi

step "CUDA call in a container (cuInit + cuDeviceGetCount through the mounted libcuda)"
write_config "\"NVIDIA_VISIBLE_DEVICES=$GPUS\",\"NVIDIA_DRIVER_CAPABILITIES=compute,utility\"" '{}' '["/bin/cuda-probe"]'
run cuda

step "GPU memory limit asked for (NVIDIA_GPU_MEMORY_REQUEST/LIMIT): applied where the driver's NVML offers it (R615+), else one warning and the container still starts"
write_config "\"NVIDIA_VISIBLE_DEVICES=$GPUS\",\"NVIDIA_DRIVER_CAPABILITIES=compute,utility\",\"NVIDIA_GPU_MEMORY_REQUEST=1024\",\"NVIDIA_GPU_MEMORY_LIMIT=2048\"" '{}' '["/bin/cuda-probe"]'
run memory-limit
grep -i 'memory limit' "$work/nvshim.log" | tail -n 2 || echo "(nothing about the memory limit in nvshim's log)"

step "CDI: nvshim cdi generate on the real driver, then a container asking nvidia.com/gpu=$GPUS"
if "$BIN/nvshim" cdi --help >/dev/null 2>&1; then
  mkdir -p "$work/cdi"
  "$BIN/nvshim" cdi generate --output "$work/cdi/nvidia.yaml" || failed+=(cdi-generate)
  "$BIN/nvshim" cdi list || failed+=(cdi-list)
  write_config '"NVIDIA_DRIVER_CAPABILITIES=compute,utility"' "{\"cdi.k8s.io/gpu-check\":\"nvidia.com/gpu=$GPUS\"}" '["/usr/bin/nvidia-smi","-L"]'
  run cdi-smi
  write_config '"NVIDIA_DRIVER_CAPABILITIES=compute,utility"' "{\"cdi.k8s.io/gpu-check\":\"nvidia.com/gpu=$GPUS\"}" '["/bin/cuda-probe"]'
  run cdi-cuda
else
  echo "(this build has no 'nvshim cdi')"
fi

if [ ${#failed[@]} -gt 0 ]; then
  step "FAILED: ${failed[*]}; nvshim's log:"
  tail -n 40 "$work/nvshim.log" 2>/dev/null || true
  exit 1
fi
step "ok"
