//! What running nvshim's aarch64 binaries on this x86-64 machine takes (`scripts/install-arm64.sh`
//! prepares it): qemu-user-static's aarch64 handler registered with binfmt_misc (flag F, so
//! runc's hooks and container processes run aarch64 code too), and an arm64 root of Debian 12's
//! packages (busybox, glibc, its `ldconfig`) for container images and a Grace host's
//! `ld.so.cache`.

use std::fs;
use std::path::PathBuf;

/// Debian's cross compiler (`gcc-aarch64-linux-gnu`), for a Grace host's stub libraries.
pub const CC: &str = "aarch64-linux-gnu-gcc";
/// The aarch64 release binaries (`scripts/build-release.sh --target aarch64-unknown-linux-gnu`),
/// relative to the workspace root.
pub const BIN_DIR: &str = "target/aarch64-unknown-linux-gnu/release";
const DEFAULT_ROOT: &str = "/var/cache/nvshim-arm64/root";
const HANDLER: &str = "/proc/sys/fs/binfmt_misc/qemu-aarch64";

/// The arm64 root (`$NVSHIM_ARM64_ROOT`, default `/var/cache/nvshim-arm64/root`), or why this
/// machine cannot run aarch64 programs.
pub fn root() -> Result<PathBuf, String> {
    let handler = fs::read_to_string(HANDLER).map_err(|e| {
        format!("no aarch64 binfmt_misc handler ({HANDLER}: {e}): run scripts/install-arm64.sh")
    })?;
    let flags = handler.lines().find_map(|l| l.strip_prefix("flags: "));
    if !handler.starts_with("enabled") || !flags.is_some_and(|f| f.contains('F')) {
        return Err(format!(
            "the aarch64 binfmt_misc handler is disabled or lacks flag F: {handler}"
        ));
    }
    let root =
        std::env::var_os("NVSHIM_ARM64_ROOT").map_or_else(|| DEFAULT_ROOT.into(), PathBuf::from);
    for p in ["bin/busybox", "sbin/ldconfig"] {
        if !root.join(p).is_file() {
            return Err(format!(
                "no {}: run scripts/install-arm64.sh",
                root.join(p).display()
            ));
        }
    }
    Ok(root)
}

/// [`root`], or `None` after one line saying why the test is skipped; under `CI=true` a panic,
/// since CI must run the aarch64 tests.
pub fn root_or_skip(test: &str) -> Option<PathBuf> {
    match root() {
        Ok(root) => Some(root),
        Err(why) if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("{test}: cannot run aarch64 binaries here: {why}")
        }
        Err(why) => {
            eprintln!("{test}: skipped, cannot run aarch64 binaries here: {why}");
            None
        }
    }
}
