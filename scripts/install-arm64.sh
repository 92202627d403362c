#!/usr/bin/env bash
# Prepares this x86-64 machine to run nvshim's aarch64 binaries (tests/e2e/aarch64.rs,
# packaging/package-smoke-test.sh, scripts/build-installer-image.sh -a arm64):
#
#   scripts/install-arm64.sh            prints the arm64 root's directory on stdout
#
# - binfmt_misc: mounted if it is not, and qemu-user-static's aarch64 handler registered from
#   Debian's own /usr/lib/binfmt.d/qemu-aarch64.conf if it is not. Its F (fix-binary) flag has
#   the kernel open the emulator once, at registration, so runc's hooks and a container's
#   processes (other mount namespaces, no emulator in their root) run aarch64 binaries too.
# - An arm64 root of Debian 12's packages (busybox-static, libc6, libc-bin, libgcc-s1) under
#   $NVSHIM_ARM64_DIR/root (default /var/cache/nvshim-arm64): a container image (busybox sh,
#   glibc's ldconfig), the glibc that the dynamic `nvshim` links (QEMU_LD_PREFIX), and the
#   ldconfig that builds a simulated Grace host's ld.so.cache. Fetched as
#   scripts/install-engines.sh fetches packages: its own sources list and apt state, unpacked
#   with `dpkg-deb -x`, never installed; Debian 12's apt configuration stays as it is. Re-running
#   does nothing once the root is there.
set -euo pipefail

base=${NVSHIM_ARM64_DIR:-/var/cache/nvshim-arm64}
if [ "$(id -u)" != 0 ]; then
    echo "install-arm64: needs root (binfmt_misc, apt, and the cache in $base)" >&2
    exit 1
fi

binfmt=/proc/sys/fs/binfmt_misc
if [ ! -e "$binfmt/register" ]; then
    mount -t binfmt_misc binfmt_misc "$binfmt"
fi
if [ ! -e "$binfmt/qemu-aarch64" ]; then
    conf=/usr/lib/binfmt.d/qemu-aarch64.conf
    [ -f "$conf" ] || { echo "install-arm64: no $conf (Debian's qemu-user-static)" >&2; exit 1; }
    grep -q ':[A-Z]*F[A-Z]*$' "$conf" || { echo "install-arm64: $conf lacks the F flag" >&2; exit 1; }
    cat "$conf" > "$binfmt/register"
    echo "install-arm64: registered $(sed -n 's/^interpreter //p' "$binfmt/qemu-aarch64") for aarch64" >&2
fi
grep -q '^flags: .*F' "$binfmt/qemu-aarch64" \
    || { echo "install-arm64: the aarch64 handler lacks the F flag: $(cat "$binfmt/qemu-aarch64")" >&2; exit 1; }

root=$base/root
if [ ! -x "$root/bin/busybox" ] || [ ! -x "$root/sbin/ldconfig" ] \
    || [ ! -e "$root/lib/aarch64-linux-gnu/libgcc_s.so.1" ]; then
    echo "install-arm64: fetching Debian 12's arm64 busybox and glibc into $root" >&2
    rm -rf "$base"
    mkdir -p "$base/etc" "$base/lists/partial" "$base/debs" "$root"
    echo "deb [arch=arm64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main" \
        > "$base/etc/sources.list"
    apt_opts=(
        -o "Dir::Etc::SourceList=$base/etc/sources.list"
        -o "Dir::Etc::SourceParts=/dev/null"
        -o "Dir::State::Lists=$base/lists"
        -o "Dir::State::Status=/dev/null"
        -o "APT::Architecture=arm64"
        -o "APT::Architectures=arm64"
        -o "APT::Sandbox::User=root"
    )
    apt-get -qq "${apt_opts[@]}" update
    (cd "$base/debs" && apt-get -qq "${apt_opts[@]}" download busybox-static libc6 libc-bin libgcc-s1)
    for deb in "$base"/debs/*.deb; do
        dpkg-deb -x "$deb" "$root"
    done
    # Debian 12's libc6 ships /lib/ld-linux-aarch64.so.1 through the merged-/usr links the
    # base-files package makes: make them here.
    for d in bin sbin lib; do
        if [ -d "$root/$d" ] && [ ! -L "$root/$d" ]; then
            mkdir -p "$root/usr/$d"
            cp -a "$root/$d/." "$root/usr/$d/"
            rm -rf "${root:?}/$d"
        fi
        ln -sfn "usr/$d" "$root/$d"
    done
    mkdir -p "$root/etc"
    : > "$root/etc/ld.so.conf"
    "$root/bin/busybox" --version > /dev/null 2>&1 || "$root/bin/busybox" 2>&1 | sed -n '1s/^/install-arm64: /p' >&2
fi
echo "$root"
