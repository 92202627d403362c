//! nvshim: makes NVIDIA GPUs appear in OCI containers.
//!
//! The path everything serves (docs/design.md): [`runtime`] scans runc's argv; for `create`,
//! [`bundle`] loads config.json, [`request`] reads what the container asks for, [`host`] reads
//! the GPU host, [`legacy`] (or CDI) turns the request into [`edits::ContainerEdits`],
//! [`edits::apply`] writes them into the document and [`bundle`] saves it atomically; then
//! [`runtime::exec`] hands the unchanged argv to runc.

pub mod atomic;
pub mod bundle;
pub mod cdi;
pub mod config;
pub mod create;
pub mod edits;
pub mod host;
pub mod install;
pub mod legacy;
pub mod logging;
pub mod memory_limits;
pub mod nvidia;
pub mod ops;
pub mod report;
pub mod request;
pub mod rootfs;
pub mod runtime;
