//! Test support for nvshim: a simulated GPU host and a small runc-style container harness.
//!
//! Shared by the end-to-end tests (`tests/e2e/runtime.rs`), `scripts/demo.sh` (through the
//! `nvshim-fake-host` binary) and the benchmarks.
//!
//! - [`FakeHost`] builds a directory that looks like a GPU host to nvshim: `/proc/devices`,
//!   `/proc/driver/nvidia/**`, real device nodes made with `mknod`, ELF stub libraries with the
//!   driver's SONAMEs, an `ld.so.cache` built by the real `ldconfig`, and `nvidia-smi`.
//! - [`Rootfs`], [`Bundle`] and [`Runtime`] make a busybox bundle and drive any runtime with runc's
//!   command line (`runc` itself, or `nvshim-runtime` in front of it), cleaning up after themselves.
//! - [`podman`] runs podman as an independent CDI consumer with its own state dirs.
//! - [`probe`] is the in-container checker: a busybox shell script printing parseable lines, and a
//!   parser plus assertions over its report (the role youki's `runtimetest` plays in contest).
//!
//! Everything here needs root (mknod, runc), as the end-to-end tests do.

pub mod arm64;
pub mod breakage;
pub mod bundle;
pub mod gated;
pub mod hook_harness;
pub mod host;
pub mod kubelet;
pub mod loader;
pub mod platforms;
pub mod podman;
pub mod probe;
pub mod rootfs;
pub mod rootless;
pub mod runner;
mod stubs;

pub use bundle::Bundle;
pub use gated::GatedDevices;
pub use host::{FakeGpu, FakeHost, FakeHostSpec, KernelModules, Layout, LIB_DIR};
pub use probe::{ProbeReport, ProbeSpec};
pub use rootfs::Rootfs;
pub use runner::{run, RunOutput, Runtime};

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// One clear line instead of an EPERM deep in a test: the simulated host (mknod, `ldconfig -r`'s
/// chroot), mount namespaces and runc all need root.
pub fn require_root() -> anyhow::Result<()> {
    anyhow::ensure!(
        nix::unistd::geteuid().is_root(),
        "this test needs root (mknod, ldconfig -r, mounts, runc): run it as root, as \
         scripts/test.sh does (it re-runs itself under sudo)"
    );
    Ok(())
}

/// `nvshim-hook`, which `cargo build --workspace` puts next to the root package's binaries
/// (`binary` is one of them, e.g. `env!("CARGO_BIN_EXE_nvshim")`). Panics, saying what to run,
/// when it is missing: `cargo test` alone builds only the tested package's binaries.
pub fn built_hook(binary: &str) -> PathBuf {
    let hook = Path::new(binary).with_file_name("nvshim-hook");
    assert!(
        hook.exists(),
        "{} is missing: run `cargo build --workspace` before `cargo test` (cargo test only \
         builds the root package's binaries)",
        hook.display()
    );
    hook
}

/// The fake NVML cdylib (tests/fake-nvml): built as a dev-dependency into `deps/`, or by
/// `cargo build --workspace` next to the binaries.
pub fn built_fake_nvml(binary: &str) -> PathBuf {
    let dir = Path::new(binary).parent().unwrap_or(Path::new("."));
    [
        dir.join("libnvshim_fake_nvml.so"),
        dir.join("deps/libnvshim_fake_nvml.so"),
    ]
    .into_iter()
    .find(|p| p.exists())
    .unwrap_or_else(|| {
        panic!("libnvshim_fake_nvml.so not found next to {binary}: run `cargo build --workspace` first")
    })
}

/// A container id unique to this process and call, safe to use concurrently across tests and
/// test processes: runc names the container's cgroup after its id when `cgroupsPath` is unset.
pub fn unique_id(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{}-{n}", std::process::id())
}
