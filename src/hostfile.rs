//! How nvshim reads a file outside a container (non-blocking, regular files only,
//! size-capped): [`nvshim_hook::hostfile`], in the library the hook links too, re-exported.

pub use nvshim_hook::hostfile::*;
