#!/usr/bin/env bash
# Builds the release binaries as they ship: everything with `cargo build --release`, then
# nvshim-hook and nvshim-runtime built static-pie for musl.
# - nvshim-hook runs as root on the host while a container is created. Statically linked it has
#   no dynamic loader, so no LD_PRELOAD or LD_LIBRARY_PATH can load code into it, even from a
#   CDI spec whose hook lacks an explicit `env` (CVE-2025-23266). Built for musl with the
#   runtime's allocator and memcpy it ran a GPU container's hooks 0.26 ms faster than linked
#   static with glibc (hooks/src/arena.rs); where the musl target is missing it is linked
#   static with glibc, as the runtime is.
# - nvshim-runtime runs for every runtime call: static, a create costs about 0.35 ms less and a
#   pass-through call about 0.3 ms less than dynamic (docs/benchmarks.md). Against musl,
#   glibc's static start-up alone costs about 0.3 ms more on a virtual machine (its CPU
#   feature probe runs dozens of CPUID instructions, each trapped by the hypervisor; the two
#   floors of figure 1), so the runtime is built for x86_64-unknown-linux-musl, with its own
#   allocator and memcpy (hooks/src/arena.rs, hooks/src/memcpy.rs), the code a call runs placed first
#   (scripts/link-hot-first.sh). Where that target cannot be installed
#   (`rustup target add`), the runtime is linked static with glibc instead, and this script
#   says so. The runtime never loads libnvidia-ml itself; the rare request that needs NVML
#   asks the (dynamic) `nvshim` next to it.
# Cargo has no per-package rustflags on stable, and a global crt-static would break proc-macros
# and the fake NVML cdylib, hence `cargo rustc` for each binary of the glibc static build.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --workspace "$@"
musl=x86_64-unknown-linux-musl
if [ "$(uname -m)" = x86_64 ] && command -v rustup >/dev/null \
    && { rustup target list --installed | grep -qx "$musl" || rustup target add "$musl"; }; then
  # Linked with the functions a call runs placed first (scripts/link-hot-first.sh says why).
  CARGO_TARGET_X86_64_UNKNOWN_LINUX_MUSL_LINKER="$PWD/scripts/link-hot-first.sh" \
    cargo build --release --target "$musl" -p nvshim --bin nvshim-runtime "$@"
  cargo build --release --target "$musl" -p nvshim-hook --bin nvshim-hook "$@"
  for b in nvshim-runtime nvshim-hook; do
    cp "target/$musl/release/$b" "target/release/$b.new"
    mv "target/release/$b.new" "target/release/$b"
  done
  libc_used=musl
else
  echo "build-release: the $musl target is not available: nvshim-runtime and nvshim-hook linked static with glibc (about 0.3 ms slower per call on a virtual machine)" >&2
  cargo rustc --release -p nvshim --bin nvshim-runtime "$@" -- -C target-feature=+crt-static
  cargo rustc --release -p nvshim-hook --bin nvshim-hook "$@" -- -C target-feature=+crt-static
  libc_used=glibc
fi
for b in nvshim-hook nvshim-runtime; do
  if ! file "target/release/$b" | grep -q 'static-pie linked'; then
    echo "build-release: target/release/$b is not static-pie" >&2
    exit 1
  fi
done
echo "build-release: target/release/{nvshim,nvshim-runtime,nvshim-hook} (runtime and hook static-pie with $libc_used)"
