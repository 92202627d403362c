#!/usr/bin/env bash
# Benchmarks `nvshim-hook update-ldcache` as runc would run it on a container start.
#
# - Builds the hook as it ships (scripts/build-release.sh: static-pie, glibc).
# - Makes a Debian-like image rootfs with a few base libraries and its own ld.so.cache (made by
#   the host's ldconfig), then "injects" ~40 stub driver libraries named like a real driver's
#   (<name>.so.580.65.06, each with its real SONAME) into /usr/lib/x86_64-linux-gnu, with the
#   SONAME links the create-symlinks hook makes first.
# - Times with hyperfine, no shell (-N), 5 warm-ups, 100 runs:
#     true          /bin/true, same harness: the cost of starting any process;
#     hook-steady   the hook on an up-to-date rootfs (idempotent: the same reads, parsing,
#                   scanning and cache building, then no write because nothing changed);
#     hook-first    the hook on a container's first start: before each run --prepare mounts a
#                   fresh overlay over the image, so every run reads the image's cache, rescans
#                   the folder and writes a new cache; compared with /bin/true run after the
#                   same --prepare (the mount work it does costs the next process too);
#     ldconfig      /sbin/ldconfig -r ROOT, on a fresh overlay (first start) and on a plain copy
#                   (steady): roughly what NVIDIA's update-ldcache hook runs, without its
#                   namespace and memfd set-up.
# - Prints the medians and the hook's differences from /bin/true.
#
# The OCI state is fed on stdin with hyperfine --input where hyperfine has it (1.16+); older
# hyperfine (Debian 12 ships 1.15) cannot feed stdin, so the hook reads the same state JSON from
# --container-spec FILE (NVIDIA's flag; same parsing), and /bin/true gets the same argument.
#
# Usage: [BENCH_KEEP=1] scripts/bench-hooks.sh [OUTDIR]   (JSON exports in OUTDIR, default a temp dir)
set -euo pipefail

cd "$(dirname "$0")/.."
out="${1:-}"
work="$(mktemp -d)"
# BENCH_KEEP=1 keeps the image and bundle for a closer look.
[ -z "${BENCH_KEEP:-}" ] || echo "== work dir $work" >&2
trap '[ -n "${BENCH_KEEP:-}" ] || rm -rf "$work"' EXIT
[ -n "$out" ] || out="$work/results"
mkdir -p "$out"

for tool in hyperfine gcc python3; do
    command -v "$tool" >/dev/null || { echo "bench-hooks: $tool is required" >&2; exit 1; }
done
[ -x /sbin/ldconfig ] || { echo "bench-hooks: /sbin/ldconfig is required" >&2; exit 1; }

echo "== building the release binaries (scripts/build-release.sh)" >&2
scripts/build-release.sh --quiet
hook="$PWD/target/release/nvshim-hook"
file "$hook" | grep -q static || { echo "bench-hooks: $hook is not static" >&2; exit 1; }

ver=580.65.06
libdir=usr/lib/x86_64-linux-gnu
bundle="$work/bundle"
# The image is built in $image; the container sees it through an overlay mount at $rootfs, as
# with containerd or Docker, so the hook reads the image's files from the lower layer and its
# writes go to a fresh upper layer (without overlayfs, a plain copy is used instead).
image="$work/image"
rootfs="$bundle/rootfs"
mkdir -p "$image" "$bundle"
mkdir -p "$image/$libdir" "$image/etc/ld.so.conf.d" "$image/usr/local/lib" "$image/bin" "$image/proc" "$image/dev"
ln -s usr/lib "$image/lib"
echo 12.0 > "$image/etc/debian_version"
echo 'include /etc/ld.so.conf.d/*.conf' > "$image/etc/ld.so.conf"
printf '/usr/local/lib\n' > "$image/etc/ld.so.conf.d/libc.conf"
printf '/usr/local/lib/x86_64-linux-gnu\n/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n' \
    > "$image/etc/ld.so.conf.d/x86_64-linux-gnu.conf"

echo 'int nvshim_stub(void) { return 0; }' > "$work/stub.c"
stub() { # FILE SONAME
    gcc -shared -fPIC -Wl,-soname,"$2" -o "$1" "$work/stub.c"
}

# The image's own libraries and cache.
for so in libc.so.6 libm.so.6 libz.so.1 libstdc++.so.6 libgcc_s.so.1 libssl.so.3 libcrypto.so.3 \
          libffi.so.8 libexpat.so.1 libbz2.so.1.0 liblzma.so.5 libzstd.so.1; do
    stub "$image/$libdir/$so.0.0" "$so"
    ln -s "$so.0.0" "$image/$libdir/$so"
done
/sbin/ldconfig -r "$image"

# The driver, as bind mounts would place it, and create-symlinks' links.
drivers="libcuda:1 libcudadebugger:1 libnvidia-ml:1 libnvidia-cfg:1 libnvidia-ptxjitcompiler:1
libnvidia-nvvm:4 libnvidia-nvvm70:4 libnvidia-gpucomp:$ver libnvidia-allocator:1 libnvidia-api:1
libnvcuvid:1 libnvidia-encode:1 libnvidia-opticalflow:1 libvdpau_nvidia:1 libnvidia-eglcore:$ver
libnvidia-glcore:$ver libnvidia-tls:$ver libnvidia-glsi:$ver libnvidia-glvkspirv:$ver
libnvidia-rtcore:$ver libnvidia-fbc:1 libnvoptix:1 libGLX_nvidia:0 libEGL_nvidia:0
libGLESv2_nvidia:2 libGLESv1_CM_nvidia:1 libnvidia-ngx:1 libnvidia-pkcs11:$ver
libnvidia-pkcs11-openssl3:$ver libnvidia-egl-gbm:1 libnvidia-egl-wayland:1 libnvidia-egl-xcb:1
libnvidia-egl-xlib:1 libnvidia-vulkan-producer:$ver libnvidia-sandboxutils:1 libnvidia-present:$ver
libnvidia-wayland-client:$ver libnvidia-nscq:2 libnvidia-ifr:1 libnvidia-gtk3:$ver"
n=0
for d in $drivers; do
    name="${d%%:*}"; major="${d##*:}"
    file="$name.so.$ver"; soname="$name.so.$major"
    stub "$image/$libdir/$file" "$soname"
    [ "$soname" = "$file" ] || ln -s "$file" "$image/$libdir/$soname"
    n=$((n + 1))
done
ln -s libcuda.so.1 "$image/$libdir/libcuda.so"
echo "== $n driver libraries in /$libdir" >&2

cat > "$bundle/config.json" <<EOF
{"ociVersion":"1.0.2","root":{"path":"rootfs"},"process":{"args":["sh"],"cwd":"/"}}
EOF
state="$work/state.json"
printf '{"ociVersion":"1.0.2","id":"bench","status":"creating","pid":1,"bundle":"%s","annotations":{}}' \
    "$bundle" > "$state"

# A fresh container rootfs over the image for each first-start run (not timed): a new overlay
# mount (upper layer empty) that $rootfs, a symlink, is pointed at. Mounts are only added during
# the runs and all removed at the end: an unmount syncs the upper layer, and that I/O would land
# on the next timed run.
cat > "$work/reset.sh" <<EOF
#!/bin/sh
set -e
n=\$(( \$(cat "$work/mounts" 2>/dev/null || echo 0) + 1 ))
echo \$n > "$work/mounts"
d="$work/ovl/\$n"
mkdir -p "\$d/upper" "\$d/work" "\$d/merged"
if ! mount -t overlay overlay -o "lowerdir=$image,upperdir=\$d/upper,workdir=\$d/work" "\$d/merged" 2>/dev/null; then
    rmdir "\$d/merged" && cp -a "$image" "\$d/merged"
fi
ln -sfn "\$d/merged" "$rootfs"
EOF
chmod +x "$work/reset.sh"
cleanup() {
    for m in "$work"/ovl/*/merged; do mountpoint -q "$m" 2>/dev/null && umount "$m"; done
    [ -n "${BENCH_KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT

# grep -c, not -q: it reads the whole help text, so pipefail never sees a SIGPIPE'd writer.
if hyperfine --help | grep -c -- '--input' > /dev/null; then
    feed=(--input "$state"); spec=()
else
    feed=(); spec=(--container-spec "$state")
fi
hook_cmd="$hook update-ldcache --folder /$libdir ${spec[*]}"
true_cmd="/bin/true ${spec[*]}"

# Sanity: the hook works and is idempotent here.
"$work/reset.sh"
$hook_cmd < "$state"
$hook_cmd < "$state"
# grep -c, not -q: it reads all of ldconfig's output, so pipefail never sees a SIGPIPE'd writer.
/sbin/ldconfig -r "$rootfs" -p | grep -c "libcuda.so.1 " > /dev/null || { echo "bench-hooks: libcuda.so.1 not in the cache" >&2; exit 1; }
cp -a "$image" "$work/rootfs-ldconfig"

common=(-N --warmup 5 --runs 100 --style basic)
# Steady state: both commands as they are.
hyperfine "${common[@]}" "${feed[@]}" --export-json "$out/steady.json" \
    -n true "$true_cmd" -n hook-steady "$hook_cmd" >&2
# First start: the same --prepare before both (the copy it makes costs the next process
# something too, so /bin/true pays it as well).
hyperfine "${common[@]}" "${feed[@]}" --export-json "$out/first.json" --prepare "$work/reset.sh" \
    -n true-prepared "$true_cmd" -n hook-first "$hook_cmd" >&2
hyperfine "${common[@]}" --export-json "$out/ldconfig.json" --prepare "$work/reset.sh" \
    -n ldconfig-first "/sbin/ldconfig -r $rootfs" >&2
hyperfine "${common[@]}" --export-json "$out/ldconfig-steady.json" -n ldconfig \
    "/sbin/ldconfig -r $work/rootfs-ldconfig" >&2

python3 - "$out" <<'EOF'
import json, sys
out = sys.argv[1]
med = {}
for f in ["steady", "first", "ldconfig", "ldconfig-steady"]:
    for r in json.load(open(f"{out}/{f}.json"))["results"]:
        med[r["command"]] = r["median"] * 1e3
print(f"median /bin/true                          {med['true']:7.3f} ms")
print(f"median nvshim-hook, steady state          {med['hook-steady']:7.3f} ms   added {med['hook-steady'] - med['true']:+.3f} ms")
print(f"median /bin/true after --prepare          {med['true-prepared']:7.3f} ms")
print(f"median nvshim-hook, first start           {med['hook-first']:7.3f} ms   added {med['hook-first'] - med['true-prepared']:+.3f} ms")
print(f"median /sbin/ldconfig -r ROOT, first      {med['ldconfig-first']:7.3f} ms   added {med['ldconfig-first'] - med['true-prepared']:+.3f} ms")
print(f"median /sbin/ldconfig -r ROOT, steady     {med['ldconfig']:7.3f} ms   added {med['ldconfig'] - med['true']:+.3f} ms")
for what, added in [("steady state", med['hook-steady'] - med['true']),
                    ("first start", med['hook-first'] - med['true-prepared'])]:
    print(f"goal (under 1 ms added), {what}: {'met' if added < 1.0 else 'NOT met'} ({added:+.3f} ms)")
EOF
echo "== JSON exports in $out" >&2
