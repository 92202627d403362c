//! nvshim's end-to-end suite: one test binary. Every test here drives the built binaries
//! (`nvshim-runtime`, `nvshim-hook`, `nvshim`, the fake host builder) through real runc, crun,
//! containerd, dockerd or podman on a simulated GPU host (`tests/support`), and checks from
//! inside the container what a user would check. It needs root (mknod, mounts, runc): without
//! it every test fails with one line saying so (`nvshim_testsupport::require_root`).
//!
//! Build everything first (`cargo build --workspace`: `cargo test` builds only the root
//! package's binaries), then run all of it or one area by its module path:
//!
//! ```text
//! cargo test --test e2e                 # everything
//! cargo test --test e2e engines::       # the engine suite (scripts/test.sh reruns it per Debian suite)
//! cargo test --test e2e cdi::producer   # one test
//! ```
//!
//! Every test builds one [`world::World`]: a temp dir with a fake GPU host, its nvshim config
//! and, if asked, CDI spec dirs, with what tests do there (nvshim-runtime, `nvshim`, bundles, the
//! probe). [`common`] holds the built binaries' paths. The areas, each a module adding as
//! functions on the world only what it alone needs:
//! - [`runtime`]: `NVIDIA_VISIBLE_DEVICES` requests through nvshim-runtime over runc;
//! - [`aarch64`]: the aarch64 binaries under qemu on a simulated GB200 (Grace) host;
//! - [`cdi`]: CDI specs, annotations and the podman comparison;
//! - [`k8s`]: the request forms of NVIDIA's device plugin and DRA driver;
//! - [`engines`]: containerd, Docker and CRI-O configuration and containers through them;
//! - [`diagnostics`]: `nvshim explain` and `nvshim doctor`;
//! - [`nvidia_hooks`]: NVIDIA's hook binaries' command lines answered by nvshim-hook;
//! - [`gated`]: `NVIDIA_GDS`, `NVIDIA_MOFED`, `NVIDIA_GDRCOPY`, `NVIDIA_NVSWITCH` and the
//!   matching `nvshim cdi generate` modes;
//! - [`platforms`]: WSL2 and a Jetson in CSV mode, hosts without NVIDIA's kernel driver;
//! - [`memory_limits`]: `NVIDIA_GPU_MEMORY_LIMIT` through the `apply-cuda-memory-limits` hook;
//! - [`error_messages`]: the wording of the errors users meet most;
//! - [`host_files`]: a FIFO, device or huge file where nvshim reads or writes a host file;
//! - [`userns`]: GPU containers with their own user namespace through runc;
//! - [`reliability`]: load and faults (it rebuilds `docs/reliability.md`).
//!
//! Tests of different areas run concurrently in this one process: every test keeps its files
//! under its own temporary directory, names what it must put in shared places (`/var/run/cdi`
//! for podman, image names) after its process id and class, and the engine tests hold one lock
//! while their daemons run.

mod aarch64;
mod cdi;
mod common;
mod diagnostics;
mod engines;
mod error_messages;
mod gated;
mod host_files;
mod k8s;
mod memory_limits;
mod nvidia_hooks;
mod platforms;
mod reliability;
mod rootless;
mod runtime;
mod sandbox;
mod userns;
mod world;
