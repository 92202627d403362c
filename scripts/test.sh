#!/usr/bin/env bash
# Runs every nvshim test: unit tests, and end-to-end tests that start real containers with
# runc (and the engines the tests name) on a simulated GPU host, then the engine tests again
# with Debian 13's and sid's engines. Needs root (mknod, runc) and Debian's package registry.
# The same command runs in CI (.ci/run) and on a developer's machine.
set -euo pipefail
# shellcheck source=scripts/lib/as-root.sh
. "$(dirname "$0")/lib/as-root.sh"
cd "$(dirname "$0")/.."


scripts/install-deps.sh

# The engines of newer Debian releases (Debian 13's and sid's containerd, dockerd, runc and crun,
# and Debian 13's podman 5; scripts/install-engines.sh). Set NVSHIM_ENGINE_SUITES="" to skip
# them, or to a list of suites.
suites=${NVSHIM_ENGINE_SUITES-trixie sid}
engines=${NVSHIM_ENGINES_DIR:-/var/cache/nvshim-engines}
if [ -n "$suites" ]; then
  # shellcheck disable=SC2086
  scripts/install-engines.sh $suites
fi
# The CDI tests compare nvshim with podman 5 for the spec versions Debian 12's podman 4.3
# cannot read.
if [ -z "${NVSHIM_PODMAN:-}" ] && [ -x "$engines/trixie/bin/podman" ]; then
  export NVSHIM_PODMAN=$engines/trixie/bin/podman
fi
# tests/checks renders packaging/kubernetes with sid's kubectl (kustomize); under CI=true it
# fails without one.
if [ -z "${NVSHIM_KUBECTL:-}" ] && [ -x "$engines/sid/bin/kubectl" ]; then
  export NVSHIM_KUBECTL=$engines/sid/bin/kubectl
fi

# aarch64 (Grace): the aarch64 release binaries, run under qemu by tests/e2e/aarch64.rs, and the
# arm64 root those tests and hooks/tests' aarch64 ldconfig comparison use
# (scripts/install-arm64.sh: qemu's binfmt_misc handler, Debian's arm64 busybox and glibc).
# Without binfmt_misc (a container that may not mount it) they skip, saying why; under CI=true
# this fails instead.
if arm64_root=$(scripts/install-arm64.sh); then
  export NVSHIM_ARM64_ROOT=$arm64_root
  scripts/build-release.sh --target aarch64-unknown-linux-gnu
elif [ "${CI:-}" = true ]; then
  echo "test: the aarch64 tests cannot run here (scripts/install-arm64.sh failed)" >&2
  exit 1
else
  echo "test: skipping the aarch64 tests: scripts/install-arm64.sh failed (qemu/binfmt_misc)" >&2
fi

# The e2e tests run the built binaries of every workspace member (nvshim-runtime,
# nvshim-hook, nvshim, the fake host builder), so build them all first.
cargo build --workspace --all-targets
cargo test --workspace -- "$@"

# The engine end-to-end tests again, with each newer release's engines first on PATH.
for suite in $suites; do
  echo "test: tests/e2e/engines.rs with Debian $suite's engines" >&2
  PATH="$engines/$suite/bin:$PATH" cargo test --test e2e -- engines:: "$@"
done
