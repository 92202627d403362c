//! Test support for nvshim: a simulated GPU host and a small runc-style container harness.
//!
//! Shared by the end-to-end tests (`tests/e2e_runtime.rs`), `scripts/demo.sh` (through the
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

pub mod breakage;
pub mod bundle;
pub mod host;
pub mod podman;
pub mod probe;
pub mod rootfs;
pub mod runner;
mod stubs;

pub use bundle::Bundle;
pub use host::{FakeGpu, FakeHost, FakeHostSpec, LIB_DIR};
pub use probe::{ProbeReport, ProbeSpec};
pub use rootfs::Rootfs;
pub use runner::{run, RunOutput, Runtime};

use std::sync::atomic::{AtomicU32, Ordering};

/// A container id unique to this process and call, safe to use concurrently across tests and
/// test processes: runc names the container's cgroup after its id when `cgroupsPath` is unset.
pub fn unique_id(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{}-{n}", std::process::id())
}
