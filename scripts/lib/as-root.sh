# Sourced by the scripts that need root (device nodes, mounts, runc). Run as root, it does
# nothing; run by a sudo user, it re-runs the calling script under sudo, keeping the variables
# cargo and rustup need (a per-user Rust install lives under $HOME); with no sudo it says so.
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    exec sudo --preserve-env=PATH,HOME,CARGO_HOME,RUSTUP_HOME,CARGO_TARGET_DIR,RUSTFLAGS \
      "$0" "$@"
  fi
  echo "$(basename "$0"): needs root (device nodes, mounts, runc); run it as root" >&2
  exit 1
fi
