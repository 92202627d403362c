#!/usr/bin/env bash
# Figure 10 of scripts/bench.sh, runnable alone: nvshim-nri's CreateContainer answer with 50
# requests at once (nri/examples/nri-bench.rs drives the plugin's handler, as its ttRPC server
# does per request) on a simulated 8-GPU host with 7 MIG devices per GPU and a CDI spec
# directory of 1,000 files (the node spec from `nvshim cdi generate` and 999 DRA claim specs,
# as figure 7 writes them). Half the requests name a MIG device by UUID, half a GPU and a claim
# device in a cdi.k8s.io annotation (a MIG device of the node spec and a claim device). Prints the harness's JSON line: p50/p99/max in ms, peak RSS.
#
# Usage: scripts/bench/nri.sh BIN_DIR WORK_DIR [ROUNDS]
#   BIN_DIR: nvshim, nvshim-hook, nvshim-fake-host, libnvshim_fake_nvml.so and nri-bench
#   (release builds: `cargo build --release --workspace --bins --examples`).
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=$1 work=$2 rounds=${3:-20}
mkdir -p "$work"
# shellcheck source=scripts/lib/fake-nvml.sh
. scripts/lib/fake-nvml.sh
host="$work/nri-host"
rm -rf "$host" "$work/nri-cdi" "$work/nri-cache"
"$bin/nvshim-fake-host" "$host" --gpus 8 --mig 7 --system-libs > /dev/null
cp "$bin/libnvshim_fake_nvml.so" "$(readlink -f "$host/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1")"
topo="$work/nri-topology.json"
fake_nvml_topology "$host" > "$topo"
export NVSHIM_FAKE_NVML_TOPOLOGY="$topo"
specs="$work/nri-cdi"
mkdir -p "$specs"
config="$work/nri.toml"
cat > "$config" <<CONF
# The shipped defaults, pointed at the fake host (as scripts/bench.sh's configs).
driver-root = "$host"
dev-root = "$host"
proc-root = "$host/proc"
hook-path = "$bin/nvshim-hook"
cdi-spec-dirs = ["$specs"]
cache-dir = "$work/nri-cache"
CONF
NVSHIM_CONFIG="$config" "$bin/nvshim" cdi generate --output "$specs/nvidia.yaml" 2> /dev/null
claim_uid() { printf '%08x-0000-4000-8000-%012x' "$1" "$1"; }
claims=
for i in $(seq 1 999); do
    uid=$(claim_uid "$i")
    printf 'cdiVersion: 0.5.0\nkind: k8s.gpu.nvidia.com/claim\ndevices:\n- name: %s-gpu-0\n  containerEdits:\n    env:\n    - NVIDIA_VISIBLE_DEVICES=void\n    - CLAIM=%s\n' \
        "$uid" "$uid" > "$specs/k8s.gpu.nvidia.com-claim_$uid.yaml"
    # Every 20th claim is asked for: the requests spread over the directory.
    [ $((i % 20)) -eq 0 ] && claims="$claims${claims:+,}k8s.gpu.nvidia.com/claim=$uid-gpu-0"
done
migs=$(grep -o 'MIG-[0-9a-f-]*' "$topo" | sort -u | paste -sd, -)
# Spec files written in the last 2 s are read again on every request until they age (the
# index's racy-file rule, src/cdi/index.rs), as in figure 7.
sleep 2
"$bin/nri-bench" --config "$config" --mig-uuids "$migs" --claims "$claims" \
    --concurrency 50 --rounds "$rounds"
