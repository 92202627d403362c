#!/usr/bin/env bash
# Fetches the container engines of newer Debian releases, from Debian's own registry, for the
# engine end-to-end tests (scripts/test.sh runs tests/e2e/engines.rs once per set):
#
#   scripts/install-engines.sh [SUITE...]        (default: trixie sid)
#
# trixie (Debian 13): containerd 1.7.24, docker.io 26.1, runc 1.1.15, crun 1.21, podman 5.4
# sid:                containerd 2.1.x, docker.io 28.5.x, runc 1.3.x, crun 1.28
#
# Each suite gets its own apt sources list and state under $NVSHIM_ENGINES_DIR/<suite>
# (default /var/cache/nvshim-engines), so Debian 12's apt configuration and package database
# stay as they are; the packages are unpacked with `dpkg-deb -x`, never installed, and
# $NVSHIM_ENGINES_DIR/<suite>/bin holds links to their binaries, to put first on PATH.
#
# dockerd, containerd, its shim and the CLIs run on Debian 12 as they are (Go, no newer glibc
# symbols). runc and crun of both suites need glibc 2.38 or later: their copies in bin/ have
# their ELF interpreter and RPATH pointed at the suite's own glibc (libc6 and the libraries
# they link, unpacked beside them, with patchelf), so the suite's runc and crun code runs with
# the suite's libraries on this kernel. Re-running does nothing for a suite already fetched.
#
# sid's kubectl (1.36, with kustomize) is fetched the same way, into sid/bin: tests/checks renders
# packaging/kubernetes with `kubectl kustomize` (scripts/test.sh sets NVSHIM_KUBECTL to it).
#
# trixie's podman 5 (with its conmon and netavark, patched the same way) is the CDI consumer the
# CDI tests compare nvshim with for spec versions Debian 12's podman 4.3 cannot read:
# <suite>/bin/podman runs it with its own containers.conf (where conmon and netavark are). It
# reads specs from /etc/cdi and /var/run/cdi only (podman 5.4 ignores cdi_spec_dirs).
set -euo pipefail

suites=("$@")
[ ${#suites[@]} -gt 0 ] || suites=(trixie sid)
base=${NVSHIM_ENGINES_DIR:-/var/cache/nvshim-engines}

if [ "$(id -u)" != 0 ]; then
    echo "install-engines: needs root (apt, and the cache in $base)" >&2
    exit 1
fi
command -v patchelf > /dev/null || {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends patchelf > /dev/null
}

for suite in "${suites[@]}"; do
    dir=$base/$suite
    if [ -x "$dir/bin/runc" ] && [ -x "$dir/bin/containerd" ] \
        && { [ "$suite" != trixie ] || [ -x "$dir/bin/podman" ]; } \
        && { [ "$suite" != sid ] || [ -x "$dir/bin/kubectl" ]; }; then
        continue
    fi
    echo "install-engines: fetching $suite's engines into $dir" >&2
    rm -rf "$dir"
    mkdir -p "$dir/etc" "$dir/lists/partial" "$dir/debs" "$dir/root" "$dir/bin" "$dir/patched"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $suite main" \
        > "$dir/etc/sources.list"
    apt_opts=(
        -o "Dir::Etc::SourceList=$dir/etc/sources.list"
        -o "Dir::Etc::SourceParts=/dev/null"
        -o "Dir::State::Lists=$dir/lists"
        -o "Dir::State::Status=/dev/null"
        -o "APT::Sandbox::User=root"
    )
    apt-get -qq "${apt_opts[@]}" update
    # The engines, and what runc and crun link (libc6 for their loader and libc).
    packages=(containerd docker.io docker-cli runc crun libc6 libseccomp2 libsystemd0 libcap2)
    case "$suite" in
        trixie)
            packages+=(libyajl2 podman conmon netavark libassuan9 libgpg-error0 libsqlite3-0
                libglib2.0-0t64 libgpgme11t64 libsubid5)
            ;;
        sid) packages+=(libblake3-0 libjson-c5 kubectl) ;;
        *) packages+=(libblake3-0 libjson-c5) ;;
    esac
    (cd "$dir/debs" && apt-get -qq "${apt_opts[@]}" download "${packages[@]}")
    for deb in "$dir"/debs/*.deb; do
        dpkg-deb -x "$deb" "$dir/root"
    done
    root=$dir/root
    for b in usr/bin/containerd usr/bin/containerd-shim-runc-v2 usr/bin/ctr usr/sbin/dockerd \
        usr/bin/docker usr/sbin/docker-proxy; do
        [ -e "$root/$b" ] || { echo "install-engines: $suite has no $b" >&2; exit 1; }
        ln -sfn "$root/$b" "$dir/bin/"
    done
    # kubectl (Go) needs only glibc 2.34, which Debian 12 has: it runs as unpacked.
    [ "$suite" != sid ] || ln -sfn "$root/usr/bin/kubectl" "$dir/bin/"
    patched=(usr/sbin/runc usr/bin/crun)
    [ "$suite" != trixie ] || patched+=(usr/bin/podman usr/bin/conmon usr/lib/podman/netavark)
    for b in "${patched[@]}"; do
        name=$(basename "$b")
        cp "$root/$b" "$dir/patched/$name"
        # --force-rpath: DT_RPATH, which (unlike RUNPATH) also serves the libraries' own
        # dependencies (libsystemd's libm).
        patchelf --set-interpreter "$root/usr/lib64/ld-linux-x86-64.so.2" --force-rpath \
            --set-rpath "$root/usr/lib/x86_64-linux-gnu" "$dir/patched/$name"
        case "$name" in
            runc | crun) ln -sfn "$dir/patched/$name" "$dir/bin/$name" ;;
        esac
    done
    if [ "$suite" = trixie ]; then
        mkdir -p "$dir/podman/helpers"
        mv "$dir/patched/netavark" "$dir/podman/helpers/"
        printf '[engine]\nconmon_path = ["%s"]\nhelper_binaries_dir = ["%s"]\n' \
            "$dir/patched/conmon" "$dir/podman/helpers" > "$dir/podman/containers.conf"
        printf '#!/bin/sh\n# %s\nexport CONTAINERS_CONF="%s" PODMAN_IGNORE_CGROUPSV1_WARNING=1\nexec "%s" "$@"\n' \
            "$suite's podman with its own conmon and netavark (scripts/install-engines.sh)" \
            "$dir/podman/containers.conf" "$dir/patched/podman" > "$dir/bin/podman"
        chmod +x "$dir/bin/podman"
        "$dir/bin/podman" --version | sed "s/^/install-engines: $suite: /" >&2
    fi
    for b in containerd dockerd runc crun; do
        "$dir/bin/$b" --version | sed -n "1s/^/install-engines: $suite: /p" >&2
    done
    if [ "$suite" = sid ]; then
        "$dir/bin/kubectl" version --client | sed -n "1s/^/install-engines: $suite: kubectl /p" >&2
    fi
done
