#!/usr/bin/env bash
# Builds the release binaries as they ship: everything with `cargo build --release`, then
# nvshim-hook relinked static-pie. The hook runs as root on the host while a container is being
# created; statically linked there is no dynamic loader, so no LD_PRELOAD or LD_LIBRARY_PATH
# can ever load code into it, even from a CDI spec whose hook lacks an explicit `env`
# (CVE-2025-23266, field-lessons.md §3). Cargo has no per-package rustflags on stable, and a
# global crt-static would break proc-macros and the fake NVML cdylib, hence the second step.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --workspace "$@"
cargo rustc --release -p nvshim-hook --bin nvshim-hook "$@" -- -C target-feature=+crt-static
if ! file target/release/nvshim-hook | grep -q 'static-pie linked'; then
  echo "build-release: target/release/nvshim-hook is not static" >&2
  exit 1
fi
echo "build-release: target/release/{nvshim,nvshim-runtime,nvshim-hook} (hook static-pie)"
