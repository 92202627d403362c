//! nvshim-nri: nvshim's GPU requests served as an NRI plugin, for CRI engines (containerd,
//! CRI-O) running containers with their default runtime (no `nvidia` runtime class).
//!
//! [`plugin`] talks to the engine ([`mux`] is NRI's connection multiplexer), [`adjust`] turns
//! a container into nvshim's create plan and the plan into an NRI adjustment, [`stop`] kills a
//! running container's process that `--mandatory` finds unserved.

pub mod adjust;
pub mod mux;
pub mod plugin;
pub mod proto;
pub mod specs;
pub mod stop;
