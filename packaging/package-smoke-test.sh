#!/usr/bin/env bash
# CI: builds the .deb and the .rpm, installs the .deb with dpkg, checks what it installed, runs
# one GPU container on a simulated GPU host with the installed binaries only, and purges the
# package again (also on failure).
#
#   packaging/package-smoke-test.sh
#
# Needs root, cargo-deb and cargo-generate-rpm (`cargo install --locked cargo-deb
# cargo-generate-rpm`), runc, busybox-static and gcc (for the simulated host).
set -euo pipefail
cd "$(dirname "$0")/.."

if dpkg-query -W -f='${Status}' nvshim 2> /dev/null | grep -q "install ok installed"; then
    echo "package-smoke-test: nvshim is already installed here; not touching it" >&2
    exit 1
fi

scripts/build-release.sh
packaging/generate-assets.sh target/release
cargo deb -p nvshim --no-build
cargo generate-rpm
deb=$(ls -t target/debian/nvshim_*.deb | head -n1)
rpm=$(ls -t target/generate-rpm/nvshim-*.rpm | head -n1)
echo "package-smoke-test: built $deb and $rpm"

work=$(mktemp -d)
cleanup() {
    runc --root "$work/state" delete -f nvshim-smoke > /dev/null 2>&1 || true
    dpkg --purge nvshim > /dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

dpkg -i "$deb"
fail() { echo "package-smoke-test: $*" >&2; exit 1; }
for b in nvshim nvshim-runtime nvshim-hook; do
    [ -x "/usr/bin/$b" ] || fail "/usr/bin/$b not installed"
done
for link in nvidia-cdi-hook nvidia-container-runtime-hook; do
    [ "$(readlink /usr/bin/$link)" = nvshim-hook ] || fail "/usr/bin/$link is not a link to nvshim-hook"
done
dpkg-query -W -f='${Conffiles}\n' nvshim | grep -q '/etc/nvshim/config.toml' \
    || fail "/etc/nvshim/config.toml is not a conffile"
for f in /usr/share/man/man1/nvshim.1.gz /usr/share/man/man1/nvshim-runtime-configure.1.gz \
    /usr/share/man/man8/nvshim-runtime.8.gz /usr/share/bash-completion/completions/nvshim \
    /usr/share/zsh/vendor-completions/_nvshim /usr/share/fish/vendor_completions.d/nvshim.fish \
    /usr/lib/udev/rules.d/71-nvshim-dev-char.rules; do
    [ -e "$f" ] || fail "$f not installed"
done
nvshim --version
nvshim config > /dev/null

# One container through the installed nvshim-runtime (which finds the installed nvshim-hook
# beside itself) on a two-GPU simulated host: NVIDIA_VISIBLE_DEVICES=0 is the GPU at the lowest
# bus id, /dev/nvidia1 on this host (tests/support: minors in reverse bus order).
target/release/nvshim-fake-host "$work/host" --gpus 2 --config "$work/config.toml" > /dev/null
target/release/nvshim-fake-host --bundle "$work/bundle" --env NVIDIA_VISIBLE_DEVICES=0 -- \
    sh -c 'ls /dev | grep "^nvidia[0-9]"; nvidia-smi -L' > /dev/null
NVSHIM_CONFIG="$work/config.toml" /usr/bin/nvshim-runtime --root "$work/state" \
    run --bundle "$work/bundle" nvshim-smoke > "$work/out" 2>&1 < /dev/null \
    || { cat "$work/out" "$work/nvshim.log" >&2; fail "the container failed"; }
cat "$work/out"
[ "$(grep '^nvidia[0-9]' "$work/out")" = nvidia1 ] || fail "expected exactly /dev/nvidia1 in the container"
grep -q '^GPU 0: ' "$work/out" || fail "nvidia-smi -L listed no GPU"
echo "package-smoke-test: ok"
