//! The built binaries, and nvshim-runtime and its log for a config path: what [`super::world`]
//! builds on, and what tests that make their own runtime or config call directly.

use std::fs;
use std::path::{Path, PathBuf};

use nvshim_testsupport::runner::Runtime;
use nvshim_testsupport::unique_id;

pub const NVSHIM: &str = env!("CARGO_BIN_EXE_nvshim");
pub const SHIM: &str = env!("CARGO_BIN_EXE_nvshim-runtime");

/// `nvshim-hook` next to the built binaries.
pub fn hook_path() -> PathBuf {
    nvshim_testsupport::built_hook(NVSHIM)
}

/// The fake NVML cdylib next to the built binaries.
pub fn fake_nvml() -> PathBuf {
    nvshim_testsupport::built_fake_nvml(NVSHIM)
}

/// `program` (nvshim-runtime, or a wrapper around it) with a fresh runc state directory under
/// `tmp` and `config` as its nvshim config.
pub fn shim_at(program: impl Into<PathBuf>, tmp: &Path, config: &Path) -> Runtime {
    Runtime::new(program, &tmp.join(format!("state-{}", unique_id("s"))))
        .unwrap()
        .env("NVSHIM_CONFIG", config)
}

/// nvshim's log beside `config` (`log-file` as the fake host's config names it), or a line
/// saying there is none yet.
pub fn shim_log(config: &Path) -> String {
    fs::read_to_string(config.with_file_name("nvshim.log"))
        .unwrap_or_else(|e| format!("(no nvshim.log: {e})"))
}
