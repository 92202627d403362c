#!/usr/bin/env bash
# nvshim's benchmarks (docs/benchmarks.md says what each figure means and what they showed).
#
# Builds the release binaries as they ship (scripts/build-release.sh: nvshim-runtime and
# nvshim-hook static-pie, nvshim dynamic: it dlopens libnvidia-ml), plus nvshim-runtime
# dynamically linked as a reference row, a simulated 8-GPU host, bundles on a tmpfs (engines keep
# bundles under /run), and the floor: a static C program that only execs /bin/true
# (scripts/bench/floor.c). Then times, side by side in one run, interleaved round by round
# in a shuffled order (nvshim-bench, tests/support/src/bin/bench.rs), medians and interquartile
# ranges:
#   1. nvshim-runtime create (low-level runtime /bin/true), legacy and CDI GPU requests and a
#      non-GPU container, against the floor and /bin/true; a legacy request in the config.json
#      Docker 28 writes (tests/fixtures/oci); the CDI request in a pod's bundle (the kubelet's
#      volumes bound in);
#   2. pass-through calls (state, delete) the same way;
#   3. create + start + delete of a busybox GPU container through nvshim-runtime over runc,
#      against runc alone on the already-edited config.json;
#   4. nvshim-hook update-ldcache on a rootfs with the driver's libraries, against /bin/true
#      (and ldconfig -r, roughly what NVIDIA's hook runs);
#   5. nvshim cdi generate (fake NVML, 8 GPUs) and nvshim cdi list;
#   7. CDI create against spec directories of 2, 50, 500 and 1,000 files (a DRA driver's one
#      spec per claim beside the node spec), with the index in cache-dir and without it;
#   8. legacy create of `all` on a MIG host (8 GPUs x 7 MIG devices: every device's caps
#      nodes, from /proc, no NVML), and of one MIG device by UUID (NVML's answer, through the
#      fake NVML, from cache-dir; and without cache-dir, the nvml-query helper every time);
#   9. the hooks of figure 3's GPU container, timed in place as runc runs them
#      (scripts/bench/hook-timer.c), in total and against /bin/true in their place;
#   6. peak memory (GNU time %M) of each;
#  10. nvshim-nri's CreateContainer answer, 50 requests at once, MIG host, 1,000 spec files:
#      p99 and the plugin's peak RSS (scripts/bench/nri.sh, which runs alone too);
# and, for figures 1, 7 and 8, the least a create costs under nvshim's rules without nvshim
# (scripts/bench/least.c: config.json replaced atomically, every spec file stat'ed, each GPU
# create's own system calls replayed) against the same floors: the part of a create's time
# that no change to nvshim's computation can save.
# It prints one table: each figure, its baseline, the difference, the ratio, the goal.
#
# Usage: sudo scripts/bench.sh [--runs N] [--quick] [--keep] [--out DIR]
#   --runs N   timed rounds (default 60; at least 30 for the published figures)
#   --quick    10 rounds, 2 memory runs: a smoke test of the script (CI can run it)
#   --keep     keep the work dir (fake host, bundles, specs) and print where it is
#   --out DIR  where the results go (default target/bench): table.md, results.json, env.txt
# Exit status: 0 when every goal holds, 3 when the table says some goal does not, 1 on error.
# Needs: root (mknod, mount, runc), gcc, GNU time (/usr/bin/time), runc, ldconfig, python3;
# musl-gcc (musl-tools) is used for a second, leaner floor when present, strace for the rows
# that replay a create's system calls.
set -euo pipefail
# shellcheck source=scripts/lib/as-root.sh
. "$(dirname "$0")/lib/as-root.sh"
cd "$(dirname "$0")/.."
repo="$PWD"

runs=60 warmup=5 mem_runs=5 keep= out="$repo/target/bench" cmdline="scripts/bench.sh $*"
while [ $# -gt 0 ]; do
    case "$1" in
        --runs) runs="$2"; shift 2 ;;
        --quick) runs=10 warmup=2 mem_runs=2; shift ;;
        --keep) keep=1; shift ;;
        --out) out="$2"; shift 2 ;;
        -h|--help) sed -n '2,45p' "$0"; exit 0 ;;
        *) echo "bench: unknown argument $1" >&2; exit 1 ;;
    esac
done
for tool in gcc runc /usr/bin/time /sbin/ldconfig python3; do
    command -v "$tool" >/dev/null || { echo "bench: $tool is required (scripts/install-deps.sh)" >&2; exit 1; }
done
mkdir -p "$out"

work="$(mktemp -d /tmp/nvshim-bench.XXXXXX)"
cleanup() {
    # Containers a failed round may have left (the full create+start+delete figures).
    for state in "$work"/run/s* "$work"/run/state*; do
        [ -d "$state" ] || continue
        for id in $(runc --root "$state" list -q 2>/dev/null); do
            runc --root "$state" delete --force "$id" >/dev/null 2>&1 || true
        done
    done
    if [ -n "$keep" ]; then
        echo "bench: work dir kept: $work (tmpfs mounts there: umount -R ${mounts[*]} when done)" >&2
    else
        for m in "${mounts[@]}"; do umount -R "$m" 2>/dev/null || true; done
        rm -rf "$work"
    fi
}
mounts=()
trap cleanup EXIT
# DIR's files moved onto a tmpfs mounted in its place (undone by cleanup).
on_tmpfs() { # DIR
    mv "$1" "$1.disk"
    mkdir "$1"
    mount -t tmpfs -o size=256m,mode=0755 tmpfs "$1"
    mounts+=("$1")
    cp -a "$1.disk/." "$1/"
    rm -rf "$1.disk"
}
bin="$work/bin"
mkdir -p "$bin"

say() { echo "== $*" >&2; }

# ---- build --------------------------------------------------------------------------------
# `cargo rustc ... -- -C target-feature=+crt-static` passes the flag to the final binary's
# rustc only: static linking without `--target`, which a crt-static RUSTFLAGS would need (it
# would also apply to proc-macros, which cannot be static). The library and dependencies are
# the same build as `cargo build --release`. The binaries are copied out at once, since the
# next build of the same binary with other flags relinks it in place.
say "building release binaries (LTO; minutes on 2 cores)"
# Reference only: nvshim-runtime dynamically linked, as plain `cargo build` makes it.
cargo build --release --quiet -p nvshim --bin nvshim-runtime
cp target/release/nvshim-runtime "$bin/nvshim-runtime-dynamic"
scripts/build-release.sh --quiet
cp target/release/nvshim target/release/nvshim-runtime target/release/nvshim-hook "$bin/"
cargo build --release --quiet -p nvshim-testsupport --bins -p nvshim-fake-nvml
cp target/release/nvshim-fake-host target/release/nvshim-bench target/release/libnvshim_fake_nvml.so "$bin/"
cargo build --release --quiet -p nvshim-nri --example nri-bench
cp target/release/examples/nri-bench "$bin/"
for b in nvshim-hook nvshim-runtime; do
    file "$bin/$b" | grep -q 'static' || { echo "bench: $bin/$b is not static" >&2; exit 1; }
done

# The floor: what any shim costs at least (one more exec). Built as a static C program; with glibc (gcc -static) and, when musl-gcc is there, with musl.
gcc -O2 -static -DRUNTIME='"/bin/true"' -o "$bin/floor" scripts/bench/floor.c
if command -v musl-gcc >/dev/null; then
    musl-gcc -O2 -static -DRUNTIME='"/bin/true"' -o "$bin/floor-musl" scripts/bench/floor.c
fi
# The least a create costs under nvshim's rules without nvshim (the bundle replaced atomically,
# every spec file stat'ed): built as the floor is, so that they differ by those calls alone.
gcc -O2 -static -DRUNTIME='"/bin/true"' -o "$bin/least" scripts/bench/least.c
# Times hooks in place under runc (figure 9).
gcc -O2 -static -o "$bin/hook-timer" scripts/bench/hook-timer.c

# ---- the simulated host, configs, CDI spec ------------------------------------------------
say "fake 8-GPU host, configs, CDI spec"
host="$work/host"
# --system-libs: the hosts' ld.so.cache also holds a real node's own libraries, about as
# large as that node's (tests/fixtures/host: 520 entries) rather than the fake driver's 56
# alone, since legacy create reads the cache on every container start. The driver-only host
# gives figure 4 the driver's libraries alone, as the bind mounts bring them.
"$bin/nvshim-fake-host" "$host" --gpus 8 --system-libs >/dev/null
"$bin/nvshim-fake-host" "$work/mighost" --gpus 8 --mig 7 --system-libs >/dev/null
"$bin/nvshim-fake-host" "$work/driverhost" --gpus 1 >/dev/null
# A real host's /proc and /dev are file systems in memory (procfs, devtmpfs), its driver
# files on disk: the fake hosts' proc and dev go on a tmpfs, the rest stays on this disk. On
# this kind of machine listing a MIG instance's directory (open, getdents64 until empty,
# close) took 5.6 us in /proc, 5.8 us on tmpfs and 8.7 us on ext4, a `fstatat` of a device
# node 1.5 us in devtmpfs, 1.4 us on tmpfs and 1.7 us on ext4 (a C loop, best of 30); a
# MIG `all` create lists 66 of those directories (0.21 ms less on tmpfs, paired).
for h in "$host" "$work/mighost" "$work/driverhost"; do
    on_tmpfs "$h/proc"
    on_tmpfs "$h/dev"
done
mkdir -p "$work/cdi" "$work/run"
# Bundles on a tmpfs, as containerd, Docker and CRI-O keep them (/run/...): the file system
# under the bundle is part of what create costs, and /run is tmpfs on their hosts. The DRA
# driver's spec files go there too (figure 7): it writes them into /var/run/cdi.
mount -t tmpfs -o size=1g,mode=0755 tmpfs "$work/run"
mounts+=("$work/run")

config() { # FILE RUNTIME [SPEC-DIR CACHE-DIR EXTRA-LINE]
    cat > "$1" <<EOF
# The shipped defaults (packaging/config.toml: no log file), pointed at the fake host.
low-level-runtimes = ["$2"]
driver-root = "$host"
dev-root = "$host"
proc-root = "$host/proc"
hook-path = "$bin/nvshim-hook"
cdi-spec-dirs = ["${3:-$work/cdi}"]
cache-dir = "${4-$work/run/cache}"
${5:-}
EOF
}
config "$work/true.toml" /bin/true
# The reference build keeps its own cache-dir: the two builds never read each other's files.
config "$work/true-dynamic.toml" /bin/true "" "$work/run/cache-dynamic"
config "$work/runc.toml" runc
config "$work/mig.toml" /bin/true
sed -i "s|\"$host|\"$work/mighost|" "$work/mig.toml"
config "$work/mig-nocache.toml" /bin/true "" ""
sed -i "s|\"$host|\"$work/mighost|" "$work/mig-nocache.toml"

# Fake NVML for `cdi generate`: the cdylib in place of the host's libnvidia-ml, answering from
# a topology written from the fake host's /proc (scripts/lib/fake-nvml.sh).
# shellcheck source=scripts/lib/fake-nvml.sh
. scripts/lib/fake-nvml.sh
lib="$host/usr/lib/x86_64-linux-gnu"
cp "$bin/libnvshim_fake_nvml.so" "$(readlink -f "$lib/libnvidia-ml.so.1")"
topo="$work/topology.json"
fake_nvml_topology "$host" > "$topo"
export NVSHIM_FAKE_NVML_TOPOLOGY="$topo"
NVSHIM_CONFIG="$work/true.toml" "$bin/nvshim" cdi generate --output "$work/cdi/nvidia.yaml" 2> "$work/generate.err"
if grep -q 'NVML not used' "$work/generate.err"; then
    echo "bench: cdi generate did not use the fake NVML:" >&2; cat "$work/generate.err" >&2; exit 1
fi
# The MIG host's NVML too, for a MIG device asked for by UUID (figure 8): its own topology,
# with a MIG device per instance in its /proc.
miglib="$work/mighost/usr/lib/x86_64-linux-gnu"
cp "$bin/libnvshim_fake_nvml.so" "$(readlink -f "$miglib/libnvidia-ml.so.1")"
migtopo="$work/mig-topology.json"
fake_nvml_topology "$work/mighost" > "$migtopo"
mig_uuid=$(grep -o 'MIG-[0-9a-f-]*' "$migtopo" | sed -n 20p)

# Spec directories as a busy DRA node has them: the node spec and one claim spec per prepared
# claim (k8s-dra-driver-gpu's transient specs; tests/fixtures/cdi/producers). A create asks for
# one base device and the last claim's device. Each count has its own config and index dir.
claim_uid() { printf '%08x-0000-4000-8000-%012x' "$1" "$1"; }
for n in 2 50 500 1000; do
    d="$work/run/cdi-$n"
    mkdir -p "$d"
    cp "$work/cdi/nvidia.yaml" "$d/nvidia.yaml"
    for i in $(seq 1 $((n - 1))); do
        uid=$(claim_uid "$i")
        printf 'cdiVersion: 0.5.0\nkind: k8s.gpu.nvidia.com/claim\ndevices:\n- name: %s-gpu-0\n  containerEdits:\n    env:\n    - NVIDIA_VISIBLE_DEVICES=void\n    - CLAIM=%s\n' \
            "$uid" "$uid" > "$d/k8s.gpu.nvidia.com-claim_$uid.yaml"
    done
    for index in "$work/run/cache-$n" ""; do
        config "$work/cdi-$n${index:+-indexed}.toml" /bin/true "$d" "$index" \
            'cdi-env-kinds = ["nvidia.com/gpu", "k8s.gpu.nvidia.com/claim"]'
    done
done

# ---- bundles --------------------------------------------------------------------------------
say "bundles"
bundle() { # NAME VISIBLE-DEVICES-or-empty CMD...
    local name="$1" visible="$2"; shift 2
    local env=()
    [ -z "$visible" ] || env=(--env "NVIDIA_VISIBLE_DEVICES=$visible")
    "$bin/nvshim-fake-host" --bundle "$work/run/$name" "${env[@]}" -- "$@" >/dev/null
    cp "$work/run/$name/config.json" "$work/run/$name.orig.json"
}
bundle legacy "0,3" /bin/true
bundle migall all /bin/true
bundle miguuid "$mig_uuid" /bin/true
bundle cdi "nvidia.com/gpu=0,nvidia.com/gpu=3" /bin/true
bundle plain "" /bin/true
bundle full "0,3" true
for n in 2 50 500 1000; do
    bundle "cdi$n" "nvidia.com/gpu=0,k8s.gpu.nvidia.com/claim=$(claim_uid $((n - 1)))-gpu-0" /bin/true
done
# Docker 28.5.2's own config.json for a GPU request (tests/fixtures/oci: compact, 9.7 KB, its
# seccomp profile included; NVIDIA_VISIBLE_DEVICES=0,3, compute and utility), in a bundle with
# the legacy bundle's rootfs. Its binds of the container's hostname, hosts and resolv.conf
# point into the data root it was captured with: moved under the work dir and made, as dockerd
# makes them before it runs runc (a missing source counts as a directory for the mount check,
# which then resolves every destination: 40 lookups a real Docker create does not make).
mkdir -p "$work/run/docker"
cp -a "$work/run/legacy/rootfs" "$work/run/docker/rootfs"
python3 - "$repo/tests/fixtures/oci/docker-28.5.2-config.json" "$work/run/docker.orig.json" "$work/docker-data" <<'DOCKER'
import json, os, sys
spec = json.load(open(sys.argv[1]))
spec["root"]["path"] = "rootfs"
captured = "/tmp/dcap/data/"
for m in spec["mounts"]:
    if m.get("source", "").startswith(captured):
        m["source"] = os.path.join(sys.argv[3], m["source"][len(captured):])
        os.makedirs(os.path.dirname(m["source"]), exist_ok=True)
        open(m["source"], "w").write("127.0.0.1 localhost\n")
assert any(m.get("source", "").startswith(sys.argv[3]) for m in spec["mounts"]), "no Docker file binds"
open(sys.argv[2], "w").write(json.dumps(spec, separators=(",", ":")))
DOCKER
cp "$work/run/docker.orig.json" "$work/run/docker/config.json"
# The CDI bundle as a Kubernetes pod's container has it: the kubelet's volumes bound in, as
# containerd's CRI plugin writes them (type bind; rbind, rprivate, ro or rw): the
# service-account token directory, /etc/hosts and /dev/termination-log.
mkdir -p "$work/pod-volumes/serviceaccount"
echo "127.0.0.1 localhost" > "$work/pod-volumes/etc-hosts"
: > "$work/pod-volumes/termination-log"
cp -a "$work/run/cdi" "$work/run/pod"
# Its image shaped as a real one, since a pod's create resolves every added destination in the
# image (the busybox rootfs of the other bundles has no /usr at all): the tree of a Debian 12
# base image, the packages of priority "required" and what they depend on (what debootstrap's
# minbase variant and so the debian:bookworm image install), from this machine's own package
# lists: merged /usr, directories and links as they are, files empty. Without dpkg, the
# busybox rootfs stays.
python3 - "$work/run/pod/rootfs" "$work/base-libs.txt" <<'IMAGE' || echo "bench: no Debian package lists: the pod's image is the busybox rootfs" >&2
import os, re, shutil, subprocess, sys
root, liblist = sys.argv[1:]
installed, todo = {}, []
for l in subprocess.check_output(["dpkg-query", "-W", "-f=${Package}\t${Priority}\t${Pre-Depends}, ${Depends}\n"], text=True).splitlines():
    name, prio, deps = l.split("\t")
    # Each dependency: its first alternative this machine has.
    alts = [[re.sub(r"[ (:].*", "", a.strip()) for a in d.split("|")] for d in deps.split(",") if d.strip()]
    installed[name] = alts
    if prio == "required":
        todo.append(name)
pkgs = set()
while todo:
    p = todo.pop()
    if p in pkgs or p not in installed:
        continue
    pkgs.add(p)
    for alts in installed[p]:
        todo.extend([a for a in alts if a in installed][:1])
paths = subprocess.check_output(["dpkg", "-L"] + sorted(pkgs), text=True).splitlines()
# The base's shared libraries, for the images of figures 4 and 9 (image_libs, below).
with open(liblist, "w") as f:
    for p in sorted(set(paths)):
        if re.match(r"/(usr/)?lib/x86_64-linux-gnu/[^/]*\.so", p) and (os.path.islink(p) or os.path.isfile(p)):
            f.write(p + "\n")
# Built beside the busybox rootfs and swapped in whole at the end.
final, root = root, root + ".debian"
os.makedirs(root + "/usr")
for top in ("bin", "lib", "lib64", "sbin"):
    os.makedirs(f"{root}/usr/{top}", exist_ok=True)
    os.symlink(f"usr/{top}", f"{root}/{top}")
for p in sorted(set(paths)):
    if not p.startswith("/") or p == "/":
        continue
    dst = root + p
    if os.path.islink(p):
        if not os.path.lexists(dst):
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            os.symlink(os.readlink(p), dst)
    elif os.path.isdir(p):
        os.makedirs(dst, exist_ok=True)
    elif os.path.exists(p) and not os.path.lexists(dst):
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        open(dst, "w").close()
for d in ("proc", "sys", "dev", "tmp", "run", "etc", "root"):
    os.makedirs(f"{root}/{d}", exist_ok=True)
assert os.path.isdir(root + "/usr/lib/x86_64-linux-gnu"), "no /usr/lib/x86_64-linux-gnu"
shutil.rmtree(final)
os.rename(root, final)
IMAGE
python3 - "$work/run/cdi.orig.json" "$work/run/pod.orig.json" "$work/pod-volumes" <<'POD'
import json, sys
spec = json.load(open(sys.argv[1]))
v = sys.argv[3]
for dest, src, mode in [
    ("/var/run/secrets/kubernetes.io/serviceaccount", v + "/serviceaccount", "ro"),
    ("/etc/hosts", v + "/etc-hosts", "rw"),
    ("/dev/termination-log", v + "/termination-log", "rw"),
]:
    spec["mounts"].append({"destination": dest, "type": "bind", "source": src,
                           "options": ["rbind", "rprivate", mode]})
json.dump(spec, open(sys.argv[2], "w"), indent=4)
POD
cp "$work/run/pod.orig.json" "$work/run/pod/config.json"
# The same GPU bundle on disk (podman keeps bundles under /var/lib/containers).
mkdir -p "$work/disk"
cp -a "$work/run/legacy" "$work/disk/legacy"
cp "$work/run/legacy.orig.json" "$work/disk/legacy.orig.json"
# runc alone gets the config.json nvshim writes: edit a copy once through the shim.
cp -a "$work/run/full" "$work/run/full-edited"
NVSHIM_CONFIG="$work/true.toml" "$bin/nvshim-runtime" create --bundle "$work/run/full-edited" x
grep -q '/dev/nvidia' "$work/run/full-edited/config.json" || { echo "bench: the shim did not edit the bundle" >&2; exit 1; }
# A second copy for a control: runc alone against runc alone shows this figure's noise.
cp -a "$work/run/full-edited" "$work/run/full-edited2"
# Its hook names the bundle nvshim-runtime edited (`fixups --bundle`): this copy's own.
sed -i "s|\"$work/run/full-edited\"|\"$work/run/full-edited2\"|" "$work/run/full-edited2/config.json"
# The images the hooks work on (figures 4 and 9) hold what a debian:bookworm image, and most
# CUDA images built on one, hold in /usr/lib/x86_64-linux-gnu: the base's own shared libraries,
# files and links as this machine has them (real ELF files: update-ldcache reads each library
# of a folder it indexes), libc's ld.so.conf files and the ld.so.cache ldconfig wrote for them.
# Without the package lists (no dpkg), the busybox rootfs and, for figure 4, a dozen stubs.
image_libs() { # ROOTFS: returns 1 when there is no list
    [ -s "$work/base-libs.txt" ] || return 1
    local lib="$1/usr/lib/x86_64-linux-gnu" p
    mkdir -p "$lib" "$1/etc/ld.so.conf.d"
    while read -r p; do
        [ -e "$lib/${p##*/}" ] || [ -L "$lib/${p##*/}" ] || cp -a "$p" "$lib/"
    done < "$work/base-libs.txt"
    cp /etc/ld.so.conf "$1/etc/"
    for c in libc.conf x86_64-linux-gnu.conf; do
        [ ! -f "/etc/ld.so.conf.d/$c" ] || cp "/etc/ld.so.conf.d/$c" "$1/etc/ld.so.conf.d/"
    done
    /sbin/ldconfig -r "$1"
}
# Figure 9: the same container's hooks, timed in place. runc runs each hook through
# scripts/bench/hook-timer.c, which times it (`hooks`), or times /bin/true in its place
# (`hooks-true`); every run
# starts from the image's pristine rootfs, a container's first start.
cp -a "$work/run/full-edited/rootfs" "$work/run/rootfs-pristine"
image_libs "$work/run/rootfs-pristine" || echo "bench: no Debian package lists: figure 9's image is the busybox rootfs" >&2
for b in hooks hooks-true; do
    cp -a "$work/run/full-edited" "$work/run/$b"
    python3 - "$work/run/$b/config.json" "$bin/hook-timer" "$work/run/$b.times" "$b" "$bin" <<'TIMED'
import json, os, sys
path, timer, log, kind, bin_dir = sys.argv[1:]
spec = json.load(open(path))
hooks = [h for stage in spec.get("hooks", {}).values() for h in stage]
assert hooks, "the edited bundle has no hooks"
for h in hooks:
    run = [h["path"]] + (h.get("args") or [h["path"]])
    # nvshim-runtime names the bundle it edited (`fixups --bundle`): this copy's own.
    if "--bundle" in run:
        run[run.index("--bundle") + 1] = os.path.dirname(path)
    if kind == "hooks-true":
        run = ["/bin/true", "true"]
    h["path"], h["args"] = timer, [timer, log] + run
json.dump(spec, open(path, "w"), indent=1)
TIMED
done
for n in 2 50 500 1000; do
    for c in "$work/cdi-$n-indexed.toml" "$work/cdi-$n.toml"; do
        NVSHIM_CONFIG="$c" "$bin/nvshim-runtime" create --bundle "$work/run/cdi$n" x
        grep -q 'CLAIM=' "$work/run/cdi$n/config.json" || { echo "bench: cdi$n was not edited ($c)" >&2; exit 1; }
        cp "$work/run/cdi$n.orig.json" "$work/run/cdi$n/config.json"
    done
done
NVSHIM_CONFIG="$work/mig.toml" "$bin/nvshim-runtime" create --bundle "$work/run/migall" x
grep -c 'nvidia-caps/nvidia-cap' "$work/run/migall/config.json" > /dev/null || { echo "bench: migall got no MIG caps nodes" >&2; exit 1; }
cp "$work/run/migall.orig.json" "$work/run/migall/config.json"
for c in mig mig-nocache; do
    NVSHIM_CONFIG="$work/$c.toml" NVSHIM_FAKE_NVML_TOPOLOGY="$migtopo" "$bin/nvshim-runtime" create --bundle "$work/run/miguuid" x
    [ "$(grep -o 'nvidia-caps/nvidia-cap[0-9]*' "$work/run/miguuid/config.json" | sort -u | wc -l)" = 2 ] || { echo "bench: miguuid did not get its MIG device's two caps nodes ($c)" >&2; exit 1; }
    cp "$work/run/miguuid.orig.json" "$work/run/miguuid/config.json"
done
for b in legacy cdi docker pod; do
    NVSHIM_CONFIG="$work/true.toml" "$bin/nvshim-runtime" create --bundle "$work/run/$b" x
    cmp -s "$work/run/$b/config.json" "$work/run/$b.orig.json" && { echo "bench: $b was not edited" >&2; exit 1; }
    cp "$work/run/$b.orig.json" "$work/run/$b/config.json"
done
NVSHIM_CONFIG="$work/runc.toml" "$bin/nvshim-runtime" --root "$work/run/state-check" run --bundle "$work/run/full" check >/dev/null
cp "$work/run/full.orig.json" "$work/run/full/config.json"

# update-ldcache: an image rootfs with its own libraries and ld.so.cache, then the driver's
# libraries (and SONAME links) where the bind mounts put them, as on a container's first start.
rootfs="$work/run/hook/rootfs"
mkdir -p "$rootfs/usr/lib/x86_64-linux-gnu" "$rootfs/etc"
cp -a "$work/run/plain/rootfs/." "$rootfs/"
if ! image_libs "$rootfs"; then
    echo 'int nvshim_stub(void) { return 0; }' > "$work/stub.c"
    for so in libc.so.6 libm.so.6 libz.so.1 libstdc++.so.6 libgcc_s.so.1 libssl.so.3 libcrypto.so.3 \
              libffi.so.8 libexpat.so.1 libbz2.so.1.0 liblzma.so.5 libzstd.so.1; do
        gcc -shared -fPIC -Wl,-soname,"$so" -o "$rootfs/usr/lib/x86_64-linux-gnu/$so.0.0" "$work/stub.c"
        ln -s "$so.0.0" "$rootfs/usr/lib/x86_64-linux-gnu/$so"
    done
    /sbin/ldconfig -r "$rootfs"
fi
cp "$rootfs/etc/ld.so.cache" "$work/run/hook/image-ld.so.cache"
# The driver's files bind-mounted from the fake host (its disk, another file system than the
# bundles' tmpfs, as a host's is beside an image's), its links made as create-symlinks makes
# them.
for f in "$work/driverhost/usr/lib/x86_64-linux-gnu/"*; do
    at="$rootfs/usr/lib/x86_64-linux-gnu/${f##*/}"
    if [ -L "$f" ] || [ -d "$f" ]; then
        cp -a "$f" "$at"
    elif [ -f "$f" ]; then
        : > "$at"
        mount --bind "$f" "$at"
    fi
done
# Its config.json names those files as the bind mounts that put them there.
python3 - "$work/driverhost/usr/lib/x86_64-linux-gnu" "$work/run/hook/config.json" <<'MOUNTS'
import json, os, sys
lib, out = sys.argv[1:]
mounts = [{"destination": "/usr/lib/x86_64-linux-gnu/" + n, "type": "bind", "source": os.path.join(lib, n),
           "options": ["ro", "nosuid", "nodev", "rbind", "rprivate"]}
          for n in sorted(os.listdir(lib)) if os.path.isfile(os.path.join(lib, n)) and not os.path.islink(os.path.join(lib, n))]
json.dump({"ociVersion": "1.0.2", "root": {"path": "rootfs"}, "process": {"args": ["sh"], "cwd": "/"},
           "mounts": mounts}, open(out, "w"))
MOUNTS
printf '{"ociVersion":"1.0.2","id":"bench","status":"creating","pid":1,"bundle":"%s","annotations":{}}' \
    "$work/run/hook" > "$work/run/hook/state.json"
cp -a "$rootfs" "$work/run/hook/rootfs-ldconfig"
# The image indexes the driver's libraries after the hook has run once.
"$bin/nvshim-hook" update-ldcache --folder /usr/lib/x86_64-linux-gnu < "$work/run/hook/state.json"
# grep -c, not -q: it reads all of ldconfig's output, so pipefail never sees a SIGPIPE'd writer.
/sbin/ldconfig -r "$rootfs" -p | grep -c 'libcuda.so.1 ' > /dev/null || { echo "bench: the hook did not index libcuda" >&2; exit 1; }

# ---- the spec for the harness -----------------------------------------------------------------
say "timing: $runs rounds (+$warmup warm-up), interleaved and shuffled; memory: $mem_runs runs each"
R="$work/run"
st="$R/state"
spec="$work/spec.json"
musl_cmd= musl_row=
if [ -x "$bin/floor-musl" ]; then
    musl_cmd=$(printf ',{"name":"floor-musl","steps":[["%s","--root","%s","create","--bundle","%s/legacy","c1"]],"prepare":[["cp","%s/legacy.orig.json","%s/legacy/config.json"]]}' "$bin/floor-musl" "$st" "$R" "$R" "$R")
    musl_row=',{"figure":"the floor, musl static build (reference)","cmd":"floor-musl","baseline":"true"},{"figure":"1. create, legacy, against the musl floor","cmd":"create-legacy","baseline":"floor-musl"},{"figure":"1. create, CDI, against the musl floor","cmd":"create-cdi","baseline":"floor-musl"}'
fi
bundle_cmd() { # NAME BINARY BUNDLE-DIR ENV ("NAME":"VALUE",...) [MORE-KEYS: ,"KEY":VALUE]
    printf '{"name":"%s"%s,"steps":[["%s","--root","%s","create","--bundle","%s","c1"]],"prepare":[["cp","%s.orig.json","%s/config.json"]],"env":{%s}}' \
        "$1" "${5:-}" "$2" "$st" "$3" "$3" "$3" "$4"
}
create_cmd() { # NAME BINARY BUNDLE-DIR CONFIG [MORE-ENV: ,"NAME":"VALUE"]
    bundle_cmd "$1" "$2" "$3" "\"NVSHIM_CONFIG\":\"$4\"${5:-}"
}
least_cmd() { # NAME BUNDLE-DIR ENV ("NAME":"VALUE",...): scripts/bench/least.c in a create's place
    bundle_cmd "$1" "$bin/least" "$2" "$3" ',"no_mem":true'
}
# nvshim-runtime's system calls for each GPU create of figures 1 and 8, replayed by least.c
# without its computation (traced below, once the caches are filled): with strace only.
replays="legacy:$R/legacy:$work/true.toml cdi:$R/cdi:$work/true.toml cdi-pod:$R/pod:$work/true.toml"
replays="$replays docker:$R/docker:$work/true.toml mig-all:$R/migall:$work/mig.toml mig-uuid:$R/miguuid:$work/mig.toml"
replay_cmds= replay_rows=
if command -v strace >/dev/null; then
    for r in $replays; do
        IFS=: read -r name bundle _ <<< "$r"
        replay_cmds="$replay_cmds,$(least_cmd "replay-$name" "$bundle" "\"LEAST_REPLAY\":\"$work/$name.replay\"")"
        replay_rows="$replay_rows"',{"figure":"1. the system calls of create-'"$name"', replayed without nvshim (strace of one create, scripts/bench/replay.py; least.c), against the floor","cmd":"replay-'"$name"'","baseline":"floor"},{"figure":"1. create-'"$name"' against its system calls replayed: nvshim'"'"'s computation and larger binary","cmd":"create-'"$name"'","baseline":"replay-'"$name"'"}'
    done
fi
cat > "$spec" <<EOF
{"runs": $runs, "warmup": $warmup, "mem_runs": $mem_runs,
 "commands": [
  {"name":"true","steps":[["/bin/true","--root","$st","create","--bundle","$R/legacy","c1"]],"prepare":[["cp","$R/legacy.orig.json","$R/legacy/config.json"]]},
  {"name":"floor","steps":[["$bin/floor","--root","$st","create","--bundle","$R/legacy","c1"]],"prepare":[["cp","$R/legacy.orig.json","$R/legacy/config.json"]]}
  $musl_cmd,
  $(create_cmd create-legacy "$bin/nvshim-runtime" "$R/legacy" "$work/true.toml"),
  $(create_cmd create-mig-all "$bin/nvshim-runtime" "$R/migall" "$work/mig.toml"),
  $(create_cmd create-mig-uuid "$bin/nvshim-runtime" "$R/miguuid" "$work/mig.toml" ",\"NVSHIM_FAKE_NVML_TOPOLOGY\":\"$migtopo\""),
  $(create_cmd create-mig-uuid-nocache "$bin/nvshim-runtime" "$R/miguuid" "$work/mig-nocache.toml" ",\"NVSHIM_FAKE_NVML_TOPOLOGY\":\"$migtopo\""),
  $(create_cmd create-docker "$bin/nvshim-runtime" "$R/docker" "$work/true.toml"),
  $(create_cmd create-cdi "$bin/nvshim-runtime" "$R/cdi" "$work/true.toml"),
  $(create_cmd create-cdi-pod "$bin/nvshim-runtime" "$R/pod" "$work/true.toml"),
  $(create_cmd create-plain "$bin/nvshim-runtime" "$R/plain" "$work/true.toml"),
  $(create_cmd create-legacy-dynamic "$bin/nvshim-runtime-dynamic" "$R/legacy" "$work/true-dynamic.toml"),
  $(create_cmd create-legacy-disk "$bin/nvshim-runtime" "$work/disk/legacy" "$work/true.toml"),
  {"name":"floor-disk","steps":[["$bin/floor","--root","$st","create","--bundle","$work/disk/legacy","c1"]],"prepare":[["cp","$work/disk/legacy.orig.json","$work/disk/legacy/config.json"]]},
  {"name":"state","steps":[["$bin/nvshim-runtime","--root","$st","state","c1"]],"env":{"NVSHIM_CONFIG":"$work/true.toml"}},
  {"name":"floor-state","steps":[["$bin/floor","--root","$st","state","c1"]]},
  {"name":"delete","steps":[["$bin/nvshim-runtime","--root","$st","delete","--force","c1"]],"env":{"NVSHIM_CONFIG":"$work/true.toml"}},
  {"name":"floor-delete","steps":[["$bin/floor","--root","$st","delete","--force","c1"]]},
  {"name":"full-shim","no_mem":true,
   "steps":[["$bin/nvshim-runtime","--root","$R/s1","create","--bundle","$R/full","f1"],["$bin/nvshim-runtime","--root","$R/s1","start","f1"],["$bin/nvshim-runtime","--root","$R/s1","delete","--force","f1"]],
   "prepare":[["cp","$R/full.orig.json","$R/full/config.json"]],"env":{"NVSHIM_CONFIG":"$work/runc.toml"}},
  {"name":"full-runc","no_mem":true,
   "steps":[["runc","--root","$R/s2","create","--bundle","$R/full-edited","f2"],["runc","--root","$R/s2","start","f2"],["runc","--root","$R/s2","delete","--force","f2"]]},
  {"name":"full-runc-control","no_mem":true,
   "steps":[["runc","--root","$R/s3","create","--bundle","$R/full-edited2","f3"],["runc","--root","$R/s3","start","f3"],["runc","--root","$R/s3","delete","--force","f3"]]},
  {"name":"hooks","no_mem":true,"measured_by":"$R/hooks.times",
   "steps":[["runc","--root","$R/s4","run","--bundle","$R/hooks","h1"]],
   "prepare":[["rm","-rf","$R/hooks/rootfs"],["cp","-a","$R/rootfs-pristine","$R/hooks/rootfs"]]},
  {"name":"hooks-true","no_mem":true,"measured_by":"$R/hooks-true.times",
   "steps":[["runc","--root","$R/s5","run","--bundle","$R/hooks-true","h2"]],
   "prepare":[["rm","-rf","$R/hooks-true/rootfs"],["cp","-a","$R/rootfs-pristine","$R/hooks-true/rootfs"]]},
  {"name":"hook","steps":[["$bin/nvshim-hook","update-ldcache","--folder","/usr/lib/x86_64-linux-gnu"]],"stdin":"$R/hook/state.json",
   "prepare":[["cp","$R/hook/image-ld.so.cache","$R/hook/rootfs/etc/ld.so.cache"]]},
  {"name":"true-stdin","steps":[["/bin/true","update-ldcache","--folder","/usr/lib/x86_64-linux-gnu"]],"stdin":"$R/hook/state.json"},
  {"name":"ldconfig","steps":[["/sbin/ldconfig","-r","$R/hook/rootfs-ldconfig"]],
   "prepare":[["cp","$R/hook/image-ld.so.cache","$R/hook/rootfs-ldconfig/etc/ld.so.cache"]]},
  {"name":"cdi-generate","steps":[["$bin/nvshim","cdi","generate","--output","$work/generated.yaml"]],"env":{"NVSHIM_CONFIG":"$work/true.toml","NVSHIM_FAKE_NVML_TOPOLOGY":"$topo"}},
  {"name":"cdi-list","steps":[["$bin/nvshim","cdi","list"]],"env":{"NVSHIM_CONFIG":"$work/true.toml"}},
  $(create_cmd create-cdi-2 "$bin/nvshim-runtime" "$R/cdi2" "$work/cdi-2-indexed.toml"),
  $(create_cmd create-cdi-50 "$bin/nvshim-runtime" "$R/cdi50" "$work/cdi-50-indexed.toml"),
  $(create_cmd create-cdi-500 "$bin/nvshim-runtime" "$R/cdi500" "$work/cdi-500-indexed.toml"),
  $(create_cmd create-cdi-1000 "$bin/nvshim-runtime" "$R/cdi1000" "$work/cdi-1000-indexed.toml"),
  $(create_cmd create-cdi-2-noindex "$bin/nvshim-runtime" "$R/cdi2" "$work/cdi-2.toml"),
  $(create_cmd create-cdi-500-noindex "$bin/nvshim-runtime" "$R/cdi500" "$work/cdi-500.toml"),
  $(least_cmd least-rewrite "$R/legacy" '"LEAST_REWRITE":"1"'),
  $(least_cmd least-rewrite-disk "$work/disk/legacy" '"LEAST_REWRITE":"1"'),
  $(least_cmd least-stat-2 "$R/cdi2" "\"LEAST_REWRITE\":\"1\",\"LEAST_STAT_DIR\":\"$R/cdi-2\""),
  $(least_cmd least-stat-500 "$R/cdi500" "\"LEAST_REWRITE\":\"1\",\"LEAST_STAT_DIR\":\"$R/cdi-500\""),
  $(least_cmd least-stat-1000 "$R/cdi1000" "\"LEAST_REWRITE\":\"1\",\"LEAST_STAT_DIR\":\"$R/cdi-1000\"")
  $replay_cmds
 ],
 "rows": [
  {"figure":"1. create, legacy request (2 of 8 GPUs)","cmd":"create-legacy","baseline":"floor","goal_ms":0.25},
  {"figure":"1. create, CDI request (2 of 8 GPUs)","cmd":"create-cdi","baseline":"floor","goal_ms":0.25},
  {"figure":"1. create, the same CDI request in a pod's bundle (the kubelet's service-account directory, /etc/hosts and termination log bound in)","cmd":"create-cdi-pod","baseline":"floor","goal_ms":0.25},
  {"figure":"1. create, no GPU request","cmd":"create-plain","baseline":"floor","goal_ms":0.25},
  {"figure":"1. create, legacy, Docker 28's own config.json (2 of 8 GPUs, compute+utility, 9.7 KB with its seccomp profile)","cmd":"create-docker","baseline":"floor","goal_ms":0.25},
  {"figure":"8. create, legacy, all on a MIG host (8 GPUs x 7 MIG devices, no NVML)","cmd":"create-mig-all","baseline":"floor","goal_ms":0.25},
  {"figure":"8. create, legacy, one MIG device by UUID (NVML's answer from cache-dir)","cmd":"create-mig-uuid","baseline":"floor","goal_ms":0.25},
  {"figure":"8. the same without cache-dir (nvml-query helper, fake NVML), against the cached","cmd":"create-mig-uuid-nocache","baseline":"create-mig-uuid"},
  {"figure":"1. create, legacy, against exec'ing /bin/true directly","cmd":"create-legacy","baseline":"true"},
  {"figure":"1. create, legacy, dynamically linked build (reference, not shipped)","cmd":"create-legacy-dynamic","baseline":"floor"},
  {"figure":"1. create, legacy, bundle on ext4 instead of tmpfs","cmd":"create-legacy-disk","baseline":"floor-disk","goal_ms":0.25},
  {"figure":"1. the least of a create with GPUs, against the floor: config.json replaced atomically (read, a temporary file, fdatasync, rename), nothing else (scripts/bench/least.c)","cmd":"least-rewrite","baseline":"floor"},
  {"figure":"1. the same least, bundle on ext4, against its floor","cmd":"least-rewrite-disk","baseline":"floor-disk"},
  ${replay_rows#,}${replay_rows:+,}
  {"figure":"the floor itself (glibc static)","cmd":"floor","baseline":"true"}
  $musl_row,
  {"figure":"2. state (pass-through)","cmd":"state","baseline":"floor-state","goal_ms":0.1},
  {"figure":"2. delete (pass-through)","cmd":"delete","baseline":"floor-delete","goal_ms":0.1},
  {"figure":"3. create+start+delete, busybox GPU container, over runc","cmd":"full-shim","baseline":"full-runc"},
  {"figure":"3. control: runc alone against runc alone (this figure's noise)","cmd":"full-runc-control","baseline":"full-runc"},
  {"figure":"4. nvshim-hook update-ldcache (first start)","cmd":"hook","baseline":"true-stdin","goal_ms":1.0},
  {"figure":"9. a GPU container's hooks in place under runc, in total (first start)","cmd":"hooks","goal_ms":2.0},
  {"figure":"9. the same, against /bin/true run in their place","cmd":"hooks","baseline":"hooks-true"},
  {"figure":"4. ldconfig -r ROOT (reference: what NVIDIA's hook runs)","cmd":"ldconfig","baseline":"true-stdin"},
  {"figure":"5. nvshim cdi generate, 8 GPUs, fake NVML","cmd":"cdi-generate","baseline":"true"},
  {"figure":"5. nvshim cdi list","cmd":"cdi-list","baseline":"true"},
  {"figure":"6. peak RSS: create, legacy","cmd":"create-legacy","metric":"rss","baseline":"true","goal_kib":3072},
  {"figure":"6. peak RSS: create, CDI","cmd":"create-cdi","metric":"rss","baseline":"true","goal_kib":3072},
  {"figure":"6. peak RSS: state","cmd":"state","metric":"rss","baseline":"true","goal_kib":3072},
  {"figure":"6. peak RSS: create, legacy, dynamically linked build (reference)","cmd":"create-legacy-dynamic","metric":"rss","baseline":"true"},
  {"figure":"6. peak RSS: the floor","cmd":"floor","metric":"rss","baseline":"true"},
  {"figure":"6. peak RSS: update-ldcache","cmd":"hook","metric":"rss","baseline":"true-stdin"},
  {"figure":"6. peak RSS: ldconfig -r","cmd":"ldconfig","metric":"rss","baseline":"true-stdin"},
  {"figure":"6. peak RSS: cdi generate","cmd":"cdi-generate","metric":"rss","baseline":"true"},
  {"figure":"6. peak RSS: cdi list","cmd":"cdi-list","metric":"rss","baseline":"true"},
  {"figure":"7. create, CDI, 2 spec files (node spec + 1 claim)","cmd":"create-cdi-2","baseline":"floor","goal_ms":0.25},
  {"figure":"7. create, CDI, 50 spec files, against 2","cmd":"create-cdi-50","baseline":"create-cdi-2","goal_ms":0.25},
  {"figure":"7. create, CDI, 500 spec files, against 2","cmd":"create-cdi-500","baseline":"create-cdi-2","goal_ms":0.25},
  {"figure":"7. create, CDI, 1,000 spec files, against 2","cmd":"create-cdi-1000","baseline":"create-cdi-2","goal_ms":0.25},
  {"figure":"7. create, CDI, 2 spec files, no index (cache-dir = \"\")","cmd":"create-cdi-2-noindex","baseline":"create-cdi-2"},
  {"figure":"7. create, CDI, 500 spec files, no index, against 2 with the index","cmd":"create-cdi-500-noindex","baseline":"create-cdi-2"},
  {"figure":"7. the least 500 spec files cost against 2: each fstatat'ed (the index's identity rule) beside the atomic replace (least.c)","cmd":"least-stat-500","baseline":"least-stat-2"},
  {"figure":"7. the least 1,000 spec files cost against 2 (least.c)","cmd":"least-stat-1000","baseline":"least-stat-2"},
  {"figure":"6. peak RSS: create, CDI, 1,000 spec files","cmd":"create-cdi-1000","metric":"rss","baseline":"true","goal_kib":3072}
 ]}
EOF
# Spec files written in the last 2 s are read again on every create until they age (the index's
# racy-file rule, src/cdi/index.rs): let them age before timing.
sleep 2
# The replays' traces: each create once to fill nvshim's caches, then once under strace.
if [ -n "$replay_cmds" ]; then
    for r in $replays; do
        IFS=: read -r name bundle config <<< "$r"
        for tracer in "" "strace -qq -o $work/$name.trace"; do
            cp "$bundle.orig.json" "$bundle/config.json"
            # shellcheck disable=SC2086 # $tracer: no command or strace and its arguments
            NVSHIM_CONFIG="$config" NVSHIM_FAKE_NVML_TOPOLOGY="$migtopo" \
                $tracer "$bin/nvshim-runtime" --root "$st" create --bundle "$bundle" c1
        done
        python3 scripts/bench/replay.py "$work/$name.trace" > "$work/$name.replay"
    done
fi
# The `create c1` calls leave no state (the runtime is /bin/true); `state`/`delete` go to
# /bin/true as well, so no container is needed for them.
{
    echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "command: $cmdline  (runs=$runs warmup=$warmup mem_runs=$mem_runs)"
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
    echo "kernel: $(uname -r)"
    echo "cpu: $(nproc) x $(sed -n 's/^model name\t: //p' /proc/cpuinfo | head -1)"
    echo "memory: $(free -h | awk '/^Mem:/ {print $2}')"
    echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "runc: $(runc --version | head -1)"
    echo "rustc: $(rustc --version)"
    echo "binaries: nvshim-runtime $(stat -c %s "$bin/nvshim-runtime") B static-pie, nvshim-hook $(stat -c %s "$bin/nvshim-hook") B static-pie, nvshim $(stat -c %s "$bin/nvshim") B dynamic, floor $(stat -c %s "$bin/floor") B"
} > "$out/env.txt"
set +e
"$bin/nvshim-bench" "$spec" --out "$out/results.json" > "$out/table.md"
rc=$?
set -e
[ $rc -le 3 ] && [ -s "$out/table.md" ] || { echo "bench: the harness failed ($rc)" >&2; exit 1; }
# Figure 10: the NRI plugin, timed inside its own process (not an exec per request).
nri=$(scripts/bench/nri.sh "$bin" "$work" "$((runs / 3 + 1))")
echo "$nri" > "$out/nri.json"
nri_p99=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["p99_ms"])' "$nri")
nri_rss=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["peak_rss_kib"])' "$nri")
nri_ok=$(python3 -c 'import sys; print("yes" if float(sys.argv[1]) <= 20 and int(sys.argv[2]) <= 20480 else "NO")' "$nri_p99" "$nri_rss")
{
    echo
    echo "| 10. nvshim-nri CreateContainer, 50 at once, MIG host, 1,000 spec files | p99 $nri_p99 ms, peak RSS $nri_rss KiB | goal p99 <= 20 ms, RSS <= 20 MiB: $nri_ok |"
} >> "$out/table.md"
[ "$nri_ok" = yes ] || [ $rc -ne 0 ] || rc=3
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/env.txt"
cat "$out/env.txt"
echo
cat "$out/table.md"
echo
echo "bench: results in $out (table.md, results.json with every sample, env.txt)" >&2
exit $rc
