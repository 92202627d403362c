//! The operator's tool (`nvshim`): what an operator runs on a node, never on a container's
//! path. Each module may use the model and the pipeline; nothing outside `ops` uses them, so
//! `nvshim-runtime` never links them.
//!
//! - [`generate`], [`refresh`], [`freshness`]: the CDI producer (`nvshim cdi generate`,
//!   `refresh`), and whether a written spec still matches the host;
//! - [`explain`]: what `create` would do with a bundle, and why;
//! - [`doctor`]: the node checks;
//! - [`engine`]: containerd, Docker and CRI-O configuration (`nvshim runtime configure`);
//! - [`system`]: node set-up (`/dev/char` links).

pub mod doctor;
pub mod engine;
pub mod explain;
pub mod freshness;
pub mod generate;
pub mod platform_spec;
pub mod refresh;
pub mod system;
