#!/usr/bin/env bash
# Builds the nvshim installer image (packaging/kubernetes/base/nvshim-installer.yaml) from the
# release binaries, as an OCI image layout tarball: no registry, no docker, no buildah.
#
#   scripts/build-release.sh
#   scripts/build-installer-image.sh [-a amd64|arm64] [-o OUT.tar] [-b BIN_DIR] [-t NAME:TAG]
#
# Defaults: BIN_DIR target/release, OUT target/nvshim-installer-<version>.oci.tar, NAME:TAG
# nvshim-installer:<version>. `-a arm64` (Grace and other arm64 nodes) makes the image of the
# aarch64 binaries (`scripts/build-release.sh --target aarch64-unknown-linux-gnu`; BIN_DIR
# target/aarch64-unknown-linux-gnu/release, OUT target/nvshim-installer-<version>-arm64.oci.tar)
# with Debian's arm64 busybox and glibc (scripts/install-arm64.sh, which also lets this machine
# run them under qemu). Load it on a node with
#   ctr -n k8s.io images import target/nvshim-installer-<version>.oci.tar
# (or `podman load -i`, or `skopeo copy oci-archive:... docker://your.registry/...`).
#
# The image: the static busybox (Debian's busybox-static: sh, cp, chroot, nsenter, test, ...),
# nvshim, nvshim-runtime, nvshim-hook (+ the nvidia-cdi-hook link), nvshim-nri when it was built
# (overlays/nri runs it), the glibc libraries they link
# (copied from this machine, found with ldd), the packaged default config, and
# /usr/bin/nvshim-install as the entrypoint. One uncompressed layer; file times, owners and
# order are fixed, so the same inputs give the same digest.
set -euo pipefail

cd "$(dirname "$0")/.."
version=$(awk -F'"' '/^version = /{print $2; exit}' Cargo.toml)
arch=amd64
bin_dir=
name="nvshim-installer:${version}"
out=
while getopts "a:o:b:t:" opt; do
    case "$opt" in
        a) arch=$OPTARG ;;
        o) out=$OPTARG ;;
        b) bin_dir=$OPTARG ;;
        t) name=$OPTARG ;;
        *) echo "usage: $0 [-a amd64|arm64] [-o OUT.tar] [-b BIN_DIR] [-t NAME:TAG]" >&2; exit 2 ;;
    esac
done
# Where the libraries the binaries link are copied from: this machine, or the arm64 root.
lib_root=
case "$arch" in
    amd64)
        bin_dir=${bin_dir:-target/release}
        out=${out:-target/nvshim-installer-${version}.oci.tar}
        busybox=${BUSYBOX:-/bin/busybox}
        ;;
    arm64)
        bin_dir=${bin_dir:-target/aarch64-unknown-linux-gnu/release}
        out=${out:-target/nvshim-installer-${version}-arm64.oci.tar}
        lib_root=$(scripts/install-arm64.sh)
        busybox=${BUSYBOX:-$lib_root/bin/busybox}
        ;;
    *) echo "$0: -a amd64 or -a arm64, not $arch" >&2; exit 2 ;;
esac
# grep -c, not -q: it reads the whole applet list, so pipefail never sees a SIGPIPE'd writer.
if ! "$busybox" --list 2> /dev/null | grep -cx nsenter > /dev/null || ldd "$busybox" > /dev/null 2>&1; then
    echo "$busybox must be a static busybox with nsenter and chroot (Debian: busybox-static)" >&2
    exit 1
fi
binaries=(nvshim nvshim-runtime nvshim-hook)
# The NRI plugin, run from the same image by overlays/nri's DaemonSet: when it was built.
[ -x "$bin_dir/nvshim-nri" ] && binaries+=(nvshim-nri)
for b in "${binaries[@]}"; do
    [ -x "$bin_dir/$b" ] || { echo "$bin_dir/$b is missing: scripts/build-release.sh" >&2; exit 1; }
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rootfs=$work/rootfs
mkdir -p "$rootfs"/{bin,usr/bin,etc/nvshim,tmp,proc,sys,dev,run,host,config}
chmod 1777 "$rootfs/tmp"

cp "$busybox" "$rootfs/bin/busybox"
for applet in $("$busybox" --list); do
    [ "$applet" = busybox ] || ln -sf busybox "$rootfs/bin/$applet"
done
for b in "${binaries[@]}"; do
    install -m 0755 "$bin_dir/$b" "$rootfs/usr/bin/$b"
done
ln -sf nvshim-hook "$rootfs/usr/bin/nvidia-cdi-hook"
install -m 0755 packaging/kubernetes/nvshim-install.sh "$rootfs/usr/bin/nvshim-install"
install -m 0644 packaging/config.toml "$rootfs/etc/nvshim/config.toml"
printf 'root:x:0:0:root:/root:/bin/sh\n' > "$rootfs/etc/passwd"
printf 'root:x:0:\n' > "$rootfs/etc/group"

# The shared libraries the binaries need, at the paths the dynamic linker looks for them: as
# ldd lists them, or for arm64 as the arm64 root's dynamic linker lists them under qemu (its
# paths are the image's; the static runtime and hook need none).
list_libraries() {  # $1: a binary
    if [ "$arch" = amd64 ]; then
        ldd "$1"
    elif file -b "$1" | grep -q 'dynamically linked'; then
        QEMU_LD_PREFIX=$lib_root "$lib_root/lib/ld-linux-aarch64.so.1" --list "$1"
    fi
}
for lib in $(for b in "${binaries[@]}"; do list_libraries "$bin_dir/$b"; done |
    awk '$1 ~ /^\// { print $1; next } $2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u); do
    mkdir -p "$rootfs$(dirname "$lib")"
    cp -L "$lib_root$lib" "$rootfs$lib"
done

# The layer: reproducible tar (sorted, fixed times and owners).
layer=$work/layer.tar
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=posix \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    -C "$rootfs" -cf "$layer" .

oci=$work/oci
mkdir -p "$oci/blobs/sha256"
# add_blob FILE: stores FILE under its digest; prints "sha256:<hex> <size>".
add_blob() {
    local hex size
    hex=$(sha256sum "$1" | cut -d' ' -f1)
    size=$(stat -c %s "$1")
    cp "$1" "$oci/blobs/sha256/$hex"
    echo "sha256:$hex $size"
}
read -r layer_digest layer_size < <(add_blob "$layer")

variant=
[ "$arch" != arm64 ] || variant='"variant":"v8",'
printf '%s' "{\"architecture\":\"$arch\",$variant\"os\":\"linux\",\
\"config\":{\"Env\":[\"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\"],\
\"Entrypoint\":[\"/usr/bin/nvshim-install\"],\"Cmd\":[\"run\"],\
\"Labels\":{\"org.opencontainers.image.title\":\"nvshim-installer\",\"org.opencontainers.image.version\":\"$version\"}},\
\"rootfs\":{\"type\":\"layers\",\"diff_ids\":[\"$layer_digest\"]},\"history\":[{\"created_by\":\"scripts/build-installer-image.sh\"}]}" \
    > "$work/config.json"
read -r config_digest config_size < <(add_blob "$work/config.json")

printf '%s' "{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\
\"config\":{\"mediaType\":\"application/vnd.oci.image.config.v1+json\",\"digest\":\"$config_digest\",\"size\":$config_size},\
\"layers\":[{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar\",\"digest\":\"$layer_digest\",\"size\":$layer_size}]}" \
    > "$work/manifest.json"
read -r manifest_digest manifest_size < <(add_blob "$work/manifest.json")

# A name without a registry is Docker Hub's library/ to the kubelet (`image: nvshim-installer:X`
# means docker.io/library/nvshim-installer:X): name the image that way for containerd.
full=$name
first=${name%%/*}
if [ "$first" = "$name" ]; then
    full="docker.io/library/$name"
else
    case "$first" in
        *.* | *:* | localhost) ;;
        *) full="docker.io/$name" ;;
    esac
fi
printf '%s' "{\"schemaVersion\":2,\"manifests\":[{\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\
\"digest\":\"$manifest_digest\",\"size\":$manifest_size,\
\"annotations\":{\"io.containerd.image.name\":\"$full\",\"org.opencontainers.image.ref.name\":\"$full\"}}]}" \
    > "$oci/index.json"
printf '{"imageLayoutVersion":"1.0.0"}' > "$oci/oci-layout"

mkdir -p "$(dirname "$out")"
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$oci" -cf "$out" oci-layout index.json blobs
echo "$out: $full (manifest $manifest_digest)"
