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

# The e2e tests run the built binaries of every workspace member (nvshim-runtime,
# nvshim-hook, nvshim, the fake host builder), so build them all first.
cargo build --workspace --all-targets
cargo test --workspace -- "$@"

# The engine end-to-end tests again, against the engines of newer Debian releases (Debian 13's
# and sid's containerd, dockerd, runc and crun; scripts/install-engines.sh). Set
# NVSHIM_ENGINE_SUITES="" to skip them, or to a list of suites.
suites=${NVSHIM_ENGINE_SUITES-trixie sid}
if [ -n "$suites" ]; then
  # shellcheck disable=SC2086
  scripts/install-engines.sh $suites
  for suite in $suites; do
    echo "test: tests/e2e_engines.rs with Debian $suite's engines" >&2
    PATH="${NVSHIM_ENGINES_DIR:-/var/cache/nvshim-engines}/$suite/bin:$PATH" \
      cargo test --test e2e_engines -- "$@"
  done
fi
