#!/usr/bin/env bash
# CI: builds the .deb and the .rpm, installs the .deb with dpkg, checks what it installed, runs
# one GPU container on a simulated GPU host with the installed binaries only, and purges the
# package again (also on failure).
#
#   packaging/package-smoke-test.sh
#
# Needs root, cargo-deb and cargo-generate-rpm (`cargo install --locked cargo-deb
# cargo-generate-rpm`), runc, busybox-static and gcc (for the simulated host).
#
# Then the arm64 packages (Grace, arm64 servers): the .deb and .rpm built from the aarch64
# release binaries, their architecture and contents checked (dpkg-deb, rpm), and each packaged
# binary run with --version under qemu (scripts/install-arm64.sh); an arm64 .deb is not
# installed on this x86-64 machine. Set NVSHIM_ARM64=0 to skip them (not under CI=true).
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
# cargo deb also links the arm64 .deb into target/debian: name the architecture.
deb=$(ls -t target/debian/nvshim_*_amd64.deb | head -n1)
rpm=$(ls -t target/generate-rpm/nvshim-*.x86_64.rpm | head -n1)
echo "package-smoke-test: built $deb and $rpm"
fail() { echo "package-smoke-test: $*" >&2; exit 1; }

if [ "${NVSHIM_ARM64:-1}" != 0 ] || [ "${CI:-}" = true ]; then
    arm64_root=$(scripts/install-arm64.sh)
    triple=aarch64-unknown-linux-gnu
    scripts/build-release.sh --target "$triple"
    # The man pages and completions from the aarch64 nvshim itself (its glibc from the arm64
    # root).
    QEMU_LD_PREFIX=$arm64_root packaging/generate-assets.sh "target/$triple/release" > /dev/null
    cargo deb -p nvshim --no-build --target "$triple"
    cargo generate-rpm --target "$triple"
    arm_deb=$(ls -t "target/$triple"/debian/nvshim_*_arm64.deb | head -n1)
    arm_rpm=$(ls -t "target/$triple"/generate-rpm/nvshim-*.aarch64.rpm | head -n1)
    [ "$(dpkg-deb -f "$arm_deb" Architecture)" = arm64 ] || fail "$arm_deb is not Architecture: arm64"
    [ "$(rpm -qp --qf '%{ARCH}' "$arm_rpm" 2> /dev/null)" = aarch64 ] || fail "$arm_rpm is not aarch64"
    arm_dir=$(mktemp -d)
    dpkg-deb -c "$arm_deb" > "$arm_dir/deb-files"
    rpm -qlp "$arm_rpm" > "$arm_dir/rpm-files" 2> /dev/null
    for b in nvshim nvshim-runtime nvshim-hook nvshim-nri; do
        grep -q " \./usr/bin/$b\$" "$arm_dir/deb-files" || fail "$arm_deb lacks /usr/bin/$b"
        grep -qx "/usr/bin/$b" "$arm_dir/rpm-files" || fail "$arm_rpm lacks /usr/bin/$b"
    done
    dpkg-deb -x "$arm_deb" "$arm_dir"
    for b in nvshim nvshim-runtime nvshim-hook nvshim-nri; do
        file -b "$arm_dir/usr/bin/$b" | grep -q 'ARM aarch64' || fail "$arm_deb: /usr/bin/$b is not aarch64"
        QEMU_LD_PREFIX=$arm64_root "$arm_dir/usr/bin/$b" --version > "$arm_dir/version" 2>&1 \
            || { cat "$arm_dir/version" >&2; fail "$arm_deb: /usr/bin/$b --version failed under qemu"; }
        echo "package-smoke-test: arm64 $b --version: $(head -n1 "$arm_dir/version")"
    done
    # The arm64 installer image: its manifest's platform, and its binaries run in its own root
    # (its busybox and the glibc copied in) under qemu. nvshim-runtime --version also asks runc,
    # which the image does not have: it ran above.
    image="$arm_dir/installer.oci.tar"
    scripts/build-installer-image.sh -a arm64 -o "$image" > /dev/null
    mkdir -p "$arm_dir/oci" "$arm_dir/image"
    tar -xf "$image" -C "$arm_dir/oci"
    manifest=$(sed -n 's/.*"digest":"sha256:\([0-9a-f]*\)".*/\1/p' "$arm_dir/oci/index.json")
    read -r config layer < <(grep -o 'sha256:[0-9a-f]*' "$arm_dir/oci/blobs/sha256/$manifest" \
        | cut -d: -f2 | paste -sd ' ')
    grep -q '"architecture":"arm64","variant":"v8","os":"linux"' "$arm_dir/oci/blobs/sha256/$config" \
        || fail "the arm64 installer image's config is not linux/arm64/v8"
    tar -xf "$arm_dir/oci/blobs/sha256/$layer" -C "$arm_dir/image"
    [ "$(chroot "$arm_dir/image" /bin/uname -m)" = aarch64 ] || fail "the arm64 installer image's busybox is not aarch64"
    for b in nvshim nvshim-hook; do
        chroot "$arm_dir/image" "/usr/bin/$b" --version > /dev/null 2>&1 \
            || fail "/usr/bin/$b --version fails in the arm64 installer image"
    done
    rm -rf "$arm_dir"
    echo "package-smoke-test: built and checked $arm_deb, $arm_rpm and the arm64 installer image"
fi

work=$(mktemp -d)
stop_dockerd() {  # $1: its directory
    if [ -f "$1/docker.pid" ]; then
        kill "$(cat "$1/docker.pid")" 2> /dev/null || true
        for _ in $(seq 100); do
            kill -0 "$(cat "$1/docker.pid")" 2> /dev/null || break
            sleep 0.2
        done
    fi
    # Its containerd, shims and container processes name the directory; then its mounts.
    pkill -9 -f "$1/" 2> /dev/null || true
    awk -v d="$1/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r \
        | xargs -r -n1 umount -l 2> /dev/null || true
}
cleanup() {
    runc --root "$work/state" delete -f nvshim-smoke > /dev/null 2>&1 || true
    runc --root "$work/state" delete -f nvshim-smoke-limited > /dev/null 2>&1 || true
    for d in "$work"/docker-*; do
        [ -d "$d" ] && stop_dockerd "$d"
    done
    dpkg --purge nvshim > /dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

dpkg -i "$deb"
for b in nvshim nvshim-runtime nvshim-hook nvshim-nri; do
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
    /usr/lib/udev/rules.d/71-nvshim-dev-char.rules /usr/lib/udev/rules.d/71-nvshim-cdi-refresh.rules \
    /usr/lib/systemd/system/nvshim-cdi-refresh.service /usr/lib/systemd/system/nvshim-cdi-refresh.path \
    /usr/lib/systemd/system/nvshim-cdi-refresh.timer /usr/share/man/man1/nvshim-cdi-refresh.1.gz; do
    [ -e "$f" ] || fail "$f not installed"
done
# The units as systemd reads them (their commands exist, their man page is installed), and
# enabled by the postinst.
if command -v systemd-analyze > /dev/null; then
    systemd-analyze verify /usr/lib/systemd/system/nvshim-cdi-refresh.{service,path,timer} \
        || fail "systemd-analyze verify rejects the nvshim-cdi-refresh units"
fi
if command -v systemctl > /dev/null; then
    for u in nvshim-cdi-refresh.service nvshim-cdi-refresh.path nvshim-cdi-refresh.timer; do
        [ "$(systemctl is-enabled "$u" 2> /dev/null)" = enabled ] || fail "$u is not enabled"
    done
fi
[ "$(grep -c '^ACTION==' /usr/lib/udev/rules.d/71-nvshim-cdi-refresh.rules)" = 2 ] \
    || fail "71-nvshim-cdi-refresh.rules lost a rule"
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
# A GPU memory limit through the installed hook, which is static-pie: it must run the installed
# (dynamic) `nvshim` for NVML, since a static program that dlopens libnvidia-ml dies (SIGFPE on
# the lent H200, driver 580). The fake NVML (tests/fake-nvml) in place of the host's
# libnvidia-ml offers the call and records it. NVML wants the container's cgroup v2 directory:
# on a hybrid host the run gets the v2 hierarchy bound over /sys/fs/cgroup in its own mount
# namespace, as tests/e2e/memory_limits.rs does.
cargo build --release --quiet -p nvshim-fake-nvml
ml=$(readlink -f "$work/host/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1")
cp target/release/libnvshim_fake_nvml.so "$ml"
# shellcheck source=scripts/lib/fake-nvml.sh
. scripts/lib/fake-nvml.sh
fake_nvml_topology "$work/host" "\"memoryLimits\":true,\"memoryLimitLog\":\"$work/limits.jsonl\"," \
    > "$(dirname "$ml")/nvshim-fake-nvml-topology.json"
target/release/nvshim-fake-host --bundle "$work/limited" --env NVIDIA_VISIBLE_DEVICES=0 \
    --env NVIDIA_GPU_MEMORY_REQUEST=1024 --env NVIDIA_GPU_MEMORY_LIMIT=2048 -- true > /dev/null
unified=/sys/fs/cgroup
[ "$(stat -f -c %T /sys/fs/cgroup)" = cgroup2fs ] || unified=/sys/fs/cgroup/unified
[ "$(stat -f -c %T "$unified" 2> /dev/null)" = cgroup2fs ] || fail "no cgroup v2 hierarchy for the memory-limit check"
NVSHIM_CONFIG="$work/config.toml" unshare -m --propagation private sh -c \
    'mount --bind "$0" /sys/fs/cgroup && exec /usr/bin/nvshim-runtime "$@"' "$unified" \
    --root "$work/state" run --bundle "$work/limited" nvshim-smoke-limited > "$work/out" 2>&1 < /dev/null \
    || { cat "$work/out" "$work/nvshim.log" >&2; fail "the container with a GPU memory limit failed"; }
grep -q '"hardLimit":2147483648' "$work/limits.jsonl" 2> /dev/null \
    || { cat "$work/out" "$work/nvshim.log" >&2; fail "the GPU memory limit was not applied through NVML"; }
grep -q '"caller":"nvshim"' "$work/limits.jsonl" \
    || { cat "$work/limits.jsonl" >&2; fail "the static nvshim-hook called NVML itself instead of through nvshim"; }
# The node spec through the installed binary: written once, then left alone while the host
# does not change (what the 30 s timer does).
spec="$work/cdi/nvidia.yaml"
NVSHIM_CONFIG="$work/config.toml" nvshim cdi refresh --output "$spec" 2> "$work/refresh.err" \
    || { cat "$work/refresh.err" >&2; fail "nvshim cdi refresh failed"; }
grep -q "wrote $spec" "$work/refresh.err" || { cat "$work/refresh.err" >&2; fail "no spec written"; }
nvshim cdi validate "$spec" | grep -q "kind nvidia.com/gpu" || fail "the refreshed spec is not valid"
grep -q /usr/bin/nvshim-hook "$spec" || fail "the spec does not name the installed hook"
NVSHIM_CONFIG="$work/config.toml" nvshim cdi refresh --output "$spec" 2> "$work/refresh.err"
[ ! -s "$work/refresh.err" ] || { cat "$work/refresh.err" >&2; fail "a current spec was regenerated"; }
# Docker as users type it, through the installed package, with Debian 12's engines and with
# Debian 13's and sid's (scripts/install-engines.sh; NVSHIM_ENGINE_SUITES as in
# scripts/test.sh): `nvshim runtime configure --runtime docker` (nvshim-runtime becomes the
# default runtime), then plain `docker run --gpus all`, `--gpus device=1` and, on Docker 25
# and later, `--device nvidia.com/gpu=0` from the refreshed spec (Docker's own CDI).
tar --numeric-owner -C "$work/bundle/rootfs" -cf "$work/rootfs.tar" .
docker_check() {  # $1: label, $2: a directory to put first on PATH, or ""
    local label=$1 d="$work/docker-$1" path=$PATH
    [ -z "$2" ] || path="$2:$PATH"
    mkdir -p "$d"
    local version cdi=""
    version=$(PATH=$path dockerd --version | sed -n 's/^Docker version \([0-9]*\)\..*/\1/p')
    [ "$version" -ge 25 ] && cdi=", \"cdi-spec-dirs\": [\"$work/cdi\"]"
    printf '%s\n' "{\"data-root\": \"$d/data\", \"exec-root\": \"$d/x\", \"pidfile\": \"$d/docker.pid\"," \
        " \"hosts\": [\"unix://$d/docker.sock\"], \"iptables\": false, \"ip-masq\": false, \"bridge\": \"none\"$cdi}" \
        > "$d/daemon.json"
    PATH=$path nvshim runtime configure --runtime docker --config "$d/daemon.json" > /dev/null
    PATH=$path NVSHIM_CONFIG="$work/config.toml" setsid dockerd --config-file "$d/daemon.json" \
        > "$d/dockerd.log" 2>&1 < /dev/null &
    local docker=(env "PATH=$path" docker -H "unix://$d/docker.sock")
    for _ in $(seq 150); do
        "${docker[@]}" version > /dev/null 2>&1 && break
        sleep 0.2
    done
    "${docker[@]}" import "$work/rootfs.tar" nvshim.smoke/busybox:1 > /dev/null \
        || { tail -20 "$d/dockerd.log" >&2; fail "$label: dockerd did not start"; }
    run_gpus() {  # the nvidia<minor> nodes a container sees
        "${docker[@]}" run --rm --network none "$@" nvshim.smoke/busybox:1 \
            sh -c 'ls /dev | grep "^nvidia[0-9]" | tr "\n" " "' 2> "$d/run.err" \
            || { cat "$d/run.err" "$work/nvshim.log" >&2; fail "$label: docker run $* failed"; }
    }
    # Index 0 is /dev/nvidia1 and index 1 /dev/nvidia0 on this host (see above).
    [ "$(run_gpus --gpus all)" = "nvidia0 nvidia1 " ] || fail "$label: --gpus all"
    [ "$(run_gpus --gpus device=1)" = "nvidia0 " ] || fail "$label: --gpus device=1"
    if [ -n "$cdi" ]; then
        [ "$(run_gpus --device nvidia.com/gpu=0)" = "nvidia1 " ] \
            || fail "$label: --device nvidia.com/gpu=0"
    fi
    echo "package-smoke-test: $label: Docker $version: --gpus all, --gpus device=1${cdi:+, --device nvidia.com/gpu=0}: ok"
    stop_dockerd "$d"
}
docker_check debian12 ""
suites=${NVSHIM_ENGINE_SUITES-trixie sid}
if [ -n "$suites" ]; then
    # shellcheck disable=SC2086
    scripts/install-engines.sh $suites
    for suite in $suites; do
        docker_check "$suite" "${NVSHIM_ENGINES_DIR:-/var/cache/nvshim-engines}/$suite/bin"
    done
fi

# Removal disables the units; the spec of another directory is not ours to remove.
dpkg --remove nvshim > /dev/null
if command -v systemctl > /dev/null; then
    [ ! -e /etc/systemd/system/timers.target.wants/nvshim-cdi-refresh.timer ] \
        || fail "removal left nvshim-cdi-refresh.timer enabled"
fi
[ -f "$spec" ] || fail "removal deleted a spec outside /var/run/cdi"
echo "package-smoke-test: ok"
