//! nvshim-nri: nvshim's GPU requests served as an NRI plugin, for CRI engines (containerd,
//! CRI-O) running containers with their default runtime (no `nvidia` runtime class).
//!
//! [`plugin`] talks to the engine ([`mux`] is NRI's connection multiplexer), [`adjust`] turns
//! a container into nvshim's create plan and the plan into an NRI adjustment, [`stop`] kills a
//! running container's process that `--mandatory` finds unserved, and [`events`] puts
//! fail-open warnings, refusals and stops on the pod as Kubernetes events.

pub mod adjust;
pub mod events;
pub mod mux;
pub mod plugin;
pub mod proto;
pub mod specs;
pub mod stop;
