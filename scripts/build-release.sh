#!/usr/bin/env bash
# Builds the release binaries as they ship: everything with `cargo build --release`, then
# nvshim-hook and nvshim-runtime relinked static-pie with glibc (`-C target-feature=+crt-static`).
# - nvshim-hook runs as root on the host while a container is created. Statically linked it has
#   no dynamic loader, so no LD_PRELOAD or LD_LIBRARY_PATH can load code into it, even from a
#   CDI spec whose hook lacks an explicit `env` (CVE-2025-23266).
# - nvshim-runtime runs for every runtime call: static, a create costs about 0.35 ms less and a
#   pass-through call about 0.3 ms less than dynamic (docs/benchmarks.md). A musl build starts
#   about 0.3 ms sooner on a virtual machine but needs its own allocator to keep creates as fast
#   (musl's malloc cost a MIG `all` create 0.73 ms): neither is worth a hand-written allocator.
#   The runtime never loads libnvidia-ml itself; the rare request that needs NVML asks the
#   (dynamic) `nvshim` next to it.
# Cargo has no per-package rustflags on stable, and a global crt-static would break proc-macros
# and the fake NVML cdylib, hence `cargo rustc` for each binary.
#
#   scripts/build-release.sh [--target aarch64-unknown-linux-gnu] [CARGO FLAGS...]
#
# With --target (Grace and other arm64 nodes; the linker is in .cargo/config.toml), only what
# ships is built (the three binaries and the NRI plugin), into target/<triple>/release: the
# rest of the workspace is test tooling that runs on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
out=target/release
packages=(--workspace)
machine=x86-64
# rustc links crt-static programs static-pie for x86-64 only; for aarch64 they are static
# (not position-independent): no dynamic loader either, which is what the hook needs.
static="static-pie linked"
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    --target) triple=${args[i + 1]:-} ;;
    --target=*) triple=${args[i]#--target=} ;;
  esac
done
if [ -n "${triple:-}" ]; then
  out=target/$triple/release
  packages=(-p nvshim -p nvshim-hook -p nvshim-nri)
  case "$triple" in
    aarch64-*) machine="ARM aarch64" static="statically linked" ;;
    x86_64-*) machine=x86-64 ;;
    *) machine= ;;
  esac
fi
cargo build --release "${packages[@]}" "$@"
cargo rustc --release -p nvshim --bin nvshim-runtime "$@" -- -C target-feature=+crt-static
cargo rustc --release -p nvshim-hook --bin nvshim-hook "$@" -- -C target-feature=+crt-static
for b in nvshim-hook nvshim-runtime; do
  if ! file "$out/$b" | grep -q "$static"; then
    echo "build-release: $out/$b is not $static: $(file -b "$out/$b")" >&2
    exit 1
  fi
done
for b in nvshim nvshim-hook nvshim-runtime nvshim-nri; do
  if [ -n "$machine" ] && ! file "$out/$b" | grep -q ", $machine,"; then
    echo "build-release: $out/$b is not an $machine program: $(file -b "$out/$b")" >&2
    exit 1
  fi
done
echo "build-release: $out/{nvshim,nvshim-runtime,nvshim-hook,nvshim-nri} (runtime and hook $static with glibc)"
