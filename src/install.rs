//! Where nvshim's own binaries are, and the host the config points at: what the runtime, the
//! resolvers and the operator tool all need before they read a request. One home for "our
//! binary next to me, else `/usr/bin`", and for which binary is running ([`self_exe`]).

use std::path::{Path, PathBuf};

use crate::config::Config;
use crate::host::nvml::NvmlAccess;
use crate::host::Host;

/// The host as the config locates it, keeping what it reads of the GPUs in `cache-dir`.
pub fn host_from(config: &Config) -> Host {
    Host::new(crate::host::inventory::roots(config)).with_cache_dir(&config.cache_dir)
}

/// The host binaries `create` writes into the spec or runs.
#[derive(Debug, Clone)]
pub struct Tools {
    /// The `nvshim-hook` written into hooks.
    pub hook: PathBuf,
    /// How the NVML inventory is obtained, the rare times a request needs it.
    pub nvml: NvmlAccess,
    /// The CDI registry of `cdi-spec-dirs`, where a long-running process keeps it current
    /// (nvshim-nri); `None`: a create reads the spec directories.
    pub cdi: Option<std::sync::Arc<crate::cdi::Registry>>,
}

impl Tools {
    /// For `nvshim-runtime` (statically linked): NVML through the `nvshim` installed next to
    /// it, else `/usr/bin/nvshim`.
    pub fn for_runtime(config: &Config, self_exe: Option<&Path>) -> Tools {
        Tools {
            hook: hook_path(config, self_exe),
            nvml: NvmlAccess::Helper(sibling(self_exe, "nvshim")),
            cdi: None,
        }
    }

    /// For `nvshim` itself (`explain`): NVML in process.
    pub fn in_process(config: &Config, self_exe: Option<&Path>) -> Tools {
        Tools {
            hook: hook_path(config, self_exe),
            nvml: NvmlAccess::InProcess,
            cdi: None,
        }
    }
}

/// The running binary, as `/proc/self/exe` names it. (The kernel's `AT_EXECFN`, read with
/// `getauxval`, saved 0.03 ms a call: less than an `unsafe` block must earn.)
pub fn self_exe() -> Option<PathBuf> {
    std::env::current_exe().ok()
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
