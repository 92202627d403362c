//! The hooks crate's tests beyond its unit tests, one test binary: the hooks on image trees
//! built by hand and in real runc containers, on the harness of `tests/support`
//! (`nvshim_testsupport::hook_harness`). Those that need root fail with one line saying so.
//!
//! - [`ldconfig_compat`]: `update-ldcache` byte for byte against `ldconfig -r`;
//! - [`malicious`]: hostile images against the built binary under each of its names;
//! - [`nvidia_hooks`]: NVIDIA's other hooks through the library;
//! - [`runc`]: the hooks as runc runs them.
//!
//! `cargo test -p nvshim-hook --test hooks` runs them; `... --test hooks runc::` one area.

mod ldconfig_compat;
mod malicious;
mod nvidia_hooks;
mod runc;
