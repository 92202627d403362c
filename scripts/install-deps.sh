#!/usr/bin/env bash
# Installs, from Debian's packages, what nvshim's demo and tests run: the low-level runtimes,
# busybox for container root filesystems, gcc for the simulated driver's ELF stub libraries,
# the engines the end-to-end tests start, protoc (the CRI client in the engine tests), g++
# (libFuzzer, for scripts/fuzz.sh), GNU time and musl-tools (scripts/bench.sh: peak memory,
# the musl floor; the e2e sandbox tests' musl image), uidmap (newuidmap/newgidmap for the
# rootless podman test), and for the aarch64 builds and tests (Grace): the cross linker and C
# library, qemu-user-static (scripts/install-arm64.sh registers it with binfmt_misc), rpm (the
# arm64 .rpm's architecture in packaging/package-smoke-test.sh) and Rust's aarch64 standard
# library.
# Only what is missing is installed.
set -euo pipefail
if command -v rustup > /dev/null && ! rustup target list --installed | grep -qx aarch64-unknown-linux-gnu; then
  rustup target add aarch64-unknown-linux-gnu
fi
need=(runc crun busybox-static gcc g++ podman containerd docker.io hyperfine protobuf-compiler time musl-tools file uidmap
  gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static rpm)
missing=()
for p in "${need[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "install-deps: missing packages: ${missing[*]} (run as root to install them)" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
