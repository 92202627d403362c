//! nvshim's OCI hooks. The binary `nvshim-hook` is a thin `main` over this library.
//!
//! Every hook reads the OCI state on stdin, opens the container root once as a directory fd
//! ([`root`]) and resolves every path below it inside that root, never by string join; it reads
//! no environment variable and runs no binary from the container. `update-ldcache` writes the
//! dynamic linker's cache natively ([`ldconfig`], [`ldcache`], [`elf`]) and falls back to the
//! host's ldconfig, isolated, only on machines the native writer does not know ([`fallback`]).

pub mod cli;
pub mod create_symlinks;
pub mod elf;
pub mod fallback;
pub mod ldcache;
pub mod ldconfig;
pub mod root;
pub mod state;
pub mod update_ldcache;
