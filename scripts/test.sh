#!/usr/bin/env bash
# Runs every nvshim test: unit tests, and end-to-end tests that start real containers with
# runc (and the engines the tests name) on a simulated GPU host. Needs root (mknod, runc).
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
