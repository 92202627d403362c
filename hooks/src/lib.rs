//! nvshim's OCI hooks. The binary `nvshim-hook` is a thin `main` over this library.
//!
//! Every hook reads the OCI state on stdin, opens the container root once as a directory fd
//! ([`root`]) and resolves every path below it inside that root, never by string join; it reads
//! no environment variable and runs no binary from the container. `update-ldcache` writes the
//! dynamic linker's cache natively ([`ldconfig`], [`ldcache`], [`elf`]) and falls back to the
//! host's ldconfig, isolated, only on machines the native writer does not know ([`fallback`]).
//! NVIDIA's other hooks, under its `nvidia-cdi-hook` name: [`enable_cuda_compat`],
//! [`disable_device_node_modification`], [`update_application_profile`] and [`chmod`], and the
//! createRuntime hook [`apply_cuda_memory_limits`] (GPU memory limits through NVML).
//!
//! Also [`cache`], the identity rule of the answers nvshim keeps between processes, and
//! [`hostfile`], how a file outside a container is read: here, in the library both binaries
//! link.

pub mod apply_cuda_memory_limits;
pub mod bytes;
pub mod cache;
pub mod chmod;
pub mod cli;
pub mod create_symlinks;
pub mod disable_device_node_modification;
pub mod elf;
pub mod enable_cuda_compat;
pub mod fallback;
pub mod hostfile;
pub mod ldcache;
pub mod ldconfig;
pub mod root;
pub mod state;
pub mod update_application_profile;
pub mod update_ldcache;
