#!/usr/bin/env bash
# Generates the packages' man pages and shell completions from the clap definitions, with the
# nvshim binary that is being packaged:
#
#   packaging/generate-assets.sh [BIN_DIR]      (default: target/release)
#
# Writes target/packaging/{man,completions}/, which [package.metadata.deb] and
# [package.metadata.generate-rpm] in Cargo.toml list as assets. Run it after
# `scripts/build-release.sh` and before `cargo deb --no-build` / `cargo generate-rpm`.
set -euo pipefail
cd "$(dirname "$0")/.."
bin_dir=${1:-target/release}
out=target/packaging
rm -rf "$out"
mkdir -p "$out/man" "$out/completions"
"$bin_dir/nvshim" generate-man "$out/man"
"$bin_dir/nvshim" completions bash > "$out/completions/nvshim.bash"
"$bin_dir/nvshim" completions zsh > "$out/completions/_nvshim"
"$bin_dir/nvshim" completions fish > "$out/completions/nvshim.fish"
ls "$out/man" "$out/completions"
