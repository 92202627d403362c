#!/bin/sh
# nvshim-install: entrypoint of the nvshim installer image (scripts/build-installer-image.sh),
# run on every GPU node by the DaemonSet in base/nvshim-installer.yaml.
#
#   nvshim-install [run|install|uninstall]      (default: run)
#
# install    copies nvshim, nvshim-runtime and nvshim-hook (and nvshim-nri, the NRI plugin, when
#            the image has it) to <host>$NVSHIM_INSTALL_DIR/bin,
#            writes the host's /etc/nvshim/config.toml (from the ConfigMap), runs `nvshim runtime
#            configure --runtime containerd`, creates the /dev/char links, writes the node's CDI
#            spec (`nvshim cdi refresh --force`), restarts containerd.
# uninstall  undoes all of that (the config and binaries only if this installer wrote them) and
#            restarts containerd again.
# run        install, then keep the node's CDI spec current (`nvshim cdi refresh` every
#            CDI_REFRESH_INTERVAL seconds: a few /proc reads while nothing changed; it follows
#            driver reloads and MIG reconfigurations); on SIGTERM (pod deleted, DaemonSet
#            removed) uninstall and exit.
#
# nvshim itself runs chrooted into the host's root, so every path it reads and writes (the
# containerd config, its drop-in, the runtime path it registers) is a host path. That needs
# the host's glibc to be at least the one the binaries were built against (README.md, "Install").
#
# Environment (all optional):
#   HOST_ROOT                 the host's / as mounted in this container       [/host]
#   NVSHIM_INSTALL_DIR        where the binaries go on the host               [/usr/local/nvshim]
#   NVSHIM_CONFIG_SOURCE      the config to install      [/config/config.toml, else the image's]
#   CONTAINERD_CONFIG         containerd's config on the host        [/etc/containerd/config.toml]
#   SET_AS_DEFAULT            true: also make `nvidia` containerd's default runtime      [false]
#   ENABLE_ENGINE_CDI         false: leave containerd's own CDI as it is (configure turns
#                             it on where it is off, as on containerd 1.7, for DRA claims) [true]
#   ENABLE_NRI                true: also turn containerd's NRI on where it is off (1.7), for
#                             the nvshim-nri DaemonSet (overlays/nri)                   [false]
#   REQUIRE_NRI               true (with ENABLE_NRI): containerd 2.2+ refuses every container
#                             while nvshim-nri is absent (`--nri-required`); pods annotated
#                             nvshim.io/tolerate-missing-nri: "true" still start. The
#                             install fails on an older containerd                     [false]
#   CREATE_DEV_CHAR_SYMLINKS  false: skip `nvshim system create-dev-char-symlinks`        [true]
#   RESTART_CONTAINERD        systemd (systemctl in the host's PID 1 namespaces) or none [systemd]
#   CDI_SPEC                  the node's CDI spec, kept by `nvshim cdi refresh`; none: no
#                             spec (a DRA driver or device plugin writes its own)
#                                                               [/var/run/cdi/nvidia.yaml]
#   CDI_REFRESH_INTERVAL      seconds between refreshes while running                    [30]
set -eu

host=${HOST_ROOT:-/host}
dir=${NVSHIM_INSTALL_DIR:-/usr/local/nvshim}
config_src=${NVSHIM_CONFIG_SOURCE:-/config/config.toml}
containerd_config=${CONTAINERD_CONFIG:-/etc/containerd/config.toml}
restart=${RESTART_CONTAINERD:-systemd}
cdi_spec=${CDI_SPEC:-/var/run/cdi/nvidia.yaml}
refresh_interval=${CDI_REFRESH_INTERVAL:-30}
ready=/tmp/nvshim-ready
# Marks what this installer wrote, so uninstall never removes a package's files.
marker="$host$dir/.installed-by-nvshim-install"

log() { echo "nvshim-install: $*" >&2; }

on_host() {
    chroot "$host" "$dir/bin/$@"
}

restart_containerd() {
    case "$restart" in
        systemd) nsenter --target 1 --mount --uts --ipc --net --pid -- systemctl restart containerd ;;
        none) log "not restarting containerd (RESTART_CONTAINERD=none)" ;;
        *) log "RESTART_CONTAINERD=$restart: expected systemd or none"; return 1 ;;
    esac
}

install() {
    mkdir -p "$host$dir/bin"
    touch "$marker"
    nri=
    [ -x /usr/bin/nvshim-nri ] && nri=nvshim-nri
    for b in nvshim nvshim-runtime nvshim-hook $nri; do
        # A new file renamed into place: a binary that is running is never rewritten.
        cp "/usr/bin/$b" "$host$dir/bin/.$b.new"
        mv -f "$host$dir/bin/.$b.new" "$host$dir/bin/$b"
    done
    ln -sfn nvshim-hook "$host$dir/bin/nvidia-cdi-hook"

    src=$config_src
    [ -f "$src" ] || src=/etc/nvshim/config.toml
    mkdir -p "$host/etc/nvshim"
    if [ -f "$host/etc/nvshim/config.toml" ] && ! grep -qx config "$marker"; then
        log "keeping the host's /etc/nvshim/config.toml (not written by this installer)"
    else
        cp "$src" "$host/etc/nvshim/.config.toml.new"
        mv -f "$host/etc/nvshim/.config.toml.new" "$host/etc/nvshim/config.toml"
        grep -qx config "$marker" || echo config >> "$marker"
    fi
    # Fails on a config nvshim cannot read, before containerd is pointed at the runtime.
    on_host nvshim config > /dev/null

    set -- runtime configure --runtime containerd --config "$containerd_config" \
        --runtime-path "$dir/bin/nvshim-runtime"
    if [ "${SET_AS_DEFAULT:-false}" = true ]; then
        set -- "$@" --set-as-default
    fi
    if [ "${ENABLE_ENGINE_CDI:-true}" = false ]; then
        set -- "$@" --no-cdi
    fi
    if [ "${ENABLE_NRI:-false}" = true ]; then
        set -- "$@" --nri
        if [ "${REQUIRE_NRI:-false}" = true ]; then
            set -- "$@" --nri-required
        fi
    fi
    # Every config version containerd writes is read (1 to 4; a later one with version 3's
    # layout and a warning), so a containerd 2.3 node does not stop the installer here.
    on_host nvshim "$@"
    if [ "${CREATE_DEV_CHAR_SYMLINKS:-true}" = true ]; then
        on_host nvshim system create-dev-char-symlinks --create-all \
            || log "warning: no /dev/char links (is the NVIDIA driver loaded?)"
    fi
    # The spec names this installer's hook; --force: an upgraded nvshim may write another spec.
    refresh_cdi_spec --force
    restart_containerd
    touch "$ready"
    log "installed in $dir; containerd runtime \"nvidia\" registered"
}

# Optional: without a driver (not loaded yet) it does nothing and says so.
refresh_cdi_spec() {
    [ "$cdi_spec" = none ] && return 0
    on_host nvshim cdi refresh --output "$cdi_spec" "$@" \
        || log "warning: could not refresh $cdi_spec (see above)"
}

uninstall() {
    rm -f "$ready"
    if [ ! -f "$marker" ]; then
        log "nothing to undo: $dir was not installed by nvshim-install"
        return 0
    fi
    if ! on_host nvshim runtime unconfigure --runtime containerd --config "$containerd_config"; then
        # Removing the binaries now would leave containerd's `nvidia` runtime pointing at a
        # missing file: keep them (and the marker, so a later run can finish the job).
        log "error: could not unconfigure containerd; keeping $dir so its runtime \"nvidia\" still works"
        return 1
    fi
    restart_containerd || log "warning: could not restart containerd"
    # The node spec names $dir's hook, which goes now; nothing else in its directory is touched.
    if [ "$cdi_spec" != none ] && grep -qs "$dir/bin/nvshim-hook" "$host$cdi_spec"; then
        rm -f "$host$cdi_spec"
    fi
    if grep -qx config "$marker"; then
        rm -f "$host/etc/nvshim/config.toml"
        rmdir "$host/etc/nvshim" 2> /dev/null || true
    fi
    rm -rf "${host:?}$dir"
    log "uninstalled"
}

case "${1:-run}" in
    install) install ;;
    uninstall) uninstall ;;
    run)
        trap 'log "stopping: undoing the installation"; uninstall; exit 0' TERM INT
        install
        # `wait` returns when a trapped signal arrives; the trap then exits.
        while :; do
            sleep "$refresh_interval" &
            wait $! || true
            refresh_cdi_spec
        done
        ;;
    *) log "usage: nvshim-install [run|install|uninstall]"; exit 2 ;;
esac
