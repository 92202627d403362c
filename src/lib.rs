//! nvshim: makes NVIDIA GPUs appear in OCI containers.
//!
//! The path everything serves (docs/design.md): [`runtime`] scans runc's argv; for `create`,
//! [`bundle`] loads config.json, [`request`] reads what the container asks for, [`host`] reads
//! the GPU host, [`legacy`] (or [`cdi`]) turns the request into [`edits::ContainerEdits`],
//! [`edits::apply`] writes them into the document and [`bundle`] saves it atomically; then
//! [`runtime::exec`] hands the unchanged argv to runc.
//!
//! The modules, in layer order: each uses only the ones above it, so no two import each other
//! and nothing but the binaries uses [`ops`] (`nvshim-runtime` never links the operator code).
//! `tests/checks/layers.rs` checks it.
//!
//! - Model and edges: [`hostfile`] (the one way a file outside a container is read:
//!   non-blocking, regular files only, size-capped), [`atomic`] (the one temp-file-and-rename
//!   write), [`config`], [`report`]
//!   (the one error printer), [`runtime`] (argv scan, exec), [`features`] (the answer to `features`), [`logging`], [`nvidia`] (the
//!   driver facts: files per capability, control nodes, mount options, hook env), [`json`]
//!   (JSON text as serde_json writes it, faster), [`bundle`] (config.json), [`host`] (the host under its roots, read into one value,
//!   [`host::Inventory`]; NVML under it), [`edits`] (container edits, their causes, and
//!   applying them).
//! - The `create` pipeline: [`cdi`] (the CDI consumer: names, annotations, specs, registry,
//!   index), [`install`] (where nvshim's binaries are, and a CDI registry a long-running
//!   process keeps), [`rootfs`], [`request`] (what the container asked for, and the route with its
//!   reason), [`legacy`] (`NVIDIA_VISIBLE_DEVICES` resolved against the inventory, into edits
//!   grouped by cause), [`memory_limits`], [`userns`] (containers with their own user
//!   namespace), [`nri_answer`] (how nvshim-nri answers a route), [`create`] (the pipeline
//!   itself).
//! - [`ops`]: the operator tool (`nvshim`): CDI generate/refresh, explain, doctor, engine
//!   configuration, node set-up.

pub mod atomic;
pub mod bundle;
pub mod cache;
pub mod cdi;
pub mod config;
pub mod create;
pub mod edits;
pub mod features;
pub mod host;
pub mod hostfile;
pub mod install;
pub mod json;
pub mod legacy;
pub mod logging;
pub mod memory_limits;
pub mod nri_answer;
pub mod nvidia;
pub mod ops;
pub mod report;
pub mod request;
pub mod rootfs;
pub mod runtime;
pub mod userns;
