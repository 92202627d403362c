//! Where nvshim's own binaries are, and the host the config points at: what the runtime, the
//! resolvers and the operator tool all need before they read a request. One home for "our
//! binary next to me, else `/usr/bin`", and for which binary is running ([`self_exe`]).
//!
//! Neither needs `/proc/self` ([`self_exe`] falls back to it only where the kernel ran no
//! path): the first look into it costs a process about 0.03 ms, most of it when the process's
//! `/proc/<pid>` entries are torn down at its end (a static C program that reads
//! `/proc/self/exe` before it execs `/bin/true`, against the same without, 1,500 paired
//! rounds: +0.031 ms), and `nvshim-runtime` looked into it on every call.

use std::path::{Path, PathBuf};

use crate::config::Config;
use crate::host::nvml::NvmlAccess;
use crate::host::{Host, HostRoots};

/// The host as the config locates it, keeping what it reads of the GPUs in `cache-dir`.
pub fn host_from(config: &Config) -> Host {
    Host::new(HostRoots {
        driver_root: config.driver_root.clone(),
        dev_root: config.dev_root.clone(),
        proc_root: config.proc_root.clone(),
    })
    .with_cache_dir(&config.cache_dir)
}

/// The host binaries `create` writes into the spec or runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tools {
    /// The `nvshim-hook` written into hooks.
    pub hook: PathBuf,
    /// How the NVML inventory is obtained, the rare times a request needs it.
    pub nvml: NvmlAccess,
}

impl Tools {
    /// For `nvshim-runtime` (statically linked): NVML through the `nvshim` installed next to
    /// it, else `/usr/bin/nvshim`.
    pub fn for_runtime(config: &Config, self_exe: Option<&Path>) -> Tools {
        Tools {
            hook: hook_path(config, self_exe),
            nvml: NvmlAccess::Helper(sibling(self_exe, "nvshim")),
        }
    }

    /// For `nvshim` itself (`explain`): NVML in process.
    pub fn in_process(config: &Config, self_exe: Option<&Path>) -> Tools {
        Tools {
            hook: hook_path(config, self_exe),
            nvml: NvmlAccess::InProcess,
        }
    }
}

/// The running binary, symlinks resolved, as [`std::env::current_exe`] gives it: the path the
/// kernel ran it from (`AT_EXECFN`) with its links resolved, else `current_exe`
/// (`/proc/self/exe`) where that is not a path to a file (an `execveat` of a descriptor gives
/// `/dev/fd/<n>`).
pub fn self_exe() -> Option<PathBuf> {
    exec_path()
        .filter(|p| !p.starts_with("/dev/fd") && !p.starts_with("/proc"))
        .and_then(|p| std::fs::canonicalize(p).ok())
        .or_else(|| std::env::current_exe().ok())
}

/// `AT_EXECFN`: the path `execve` was given, as the kernel copied it for the process.
fn exec_path() -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: getauxval reads the auxiliary vector the kernel gave the process; no
    // preconditions. AT_EXECFN, when present, points at a NUL-terminated string on the initial
    // stack, which lives as long as the process.
    let at = unsafe { libc::getauxval(libc::AT_EXECFN) } as *const libc::c_char;
    if at.is_null() {
        return None;
    }
    // SAFETY: as above: a valid C string for the life of the process.
    let bytes = unsafe { std::ffi::CStr::from_ptr(at) }.to_bytes();
    (!bytes.is_empty()).then(|| PathBuf::from(std::ffi::OsStr::from_bytes(bytes)))
}

/// `name` installed next to the running binary, else in `/usr/bin`.
fn sibling(self_exe: Option<&Path>, name: &str) -> PathBuf {
    self_exe
        .and_then(Path::parent)
        .map(|d| d.join(name))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| Path::new("/usr/bin").join(name))
}

/// The `nvshim-hook` written into hooks: the configured path, else the one installed next to
/// the running binary, else `/usr/bin/nvshim-hook`.
pub fn hook_path(config: &Config, self_exe: Option<&Path>) -> PathBuf {
    match &config.hook_path {
        Some(p) => p.clone(),
        None => sibling(self_exe, "nvshim-hook"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The path found without `/proc` is the one `/proc/self/exe` names.
    #[test]
    fn self_exe_is_what_proc_names() {
        let want = std::fs::canonicalize(std::env::current_exe().unwrap()).unwrap();
        assert_eq!(self_exe(), Some(want));
    }
}
