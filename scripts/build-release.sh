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
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --workspace "$@"
cargo rustc --release -p nvshim --bin nvshim-runtime "$@" -- -C target-feature=+crt-static
cargo rustc --release -p nvshim-hook --bin nvshim-hook "$@" -- -C target-feature=+crt-static
for b in nvshim-hook nvshim-runtime; do
  if ! file "target/release/$b" | grep -q 'static-pie linked'; then
    echo "build-release: target/release/$b is not static-pie" >&2
    exit 1
  fi
done
echo "build-release: target/release/{nvshim,nvshim-runtime,nvshim-hook} (runtime and hook static-pie with glibc)"
