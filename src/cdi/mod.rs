//! CDI (Container Device Interface) 1.1.0: consumer and producer.
//!
//! - Consumer ([`Registry`]): `nvshim-runtime create` resolves fully qualified device names
//!   (from `cdi.k8s.io/*` annotations or `NVIDIA_VISIBLE_DEVICES`, see
//!   [`crate::request::route`]) against the spec directories, into the one
//!   [`crate::edits::ContainerEdits`] model that [`crate::edits::apply`] writes; legacy requests
//!   go through the same applier. Versions 0.3.0–1.1.0 with the minimum-version rule
//!   ([`spec`]), the library's name grammar ([`name`]), spec-dir priorities and conflicts
//!   ([`registry`]), and YAML 1.1 decoding as Go's `sigs.k8s.io/yaml` does it ([`yaml`]), all as
//!   docs/cdi-rules.md describes and `conformance.rs` tests.
//! - Producer ([`generate`]): `nvshim cdi generate`, GPUs from NVML ([`nvml`]) or `/proc`;
//!   [`refresh`] keeps the node's spec current, regenerating only what [`freshness`] finds stale.
//!
//! # Why not the `container-device-interface` crate
//!
//! The CNCF crate (v1.1.1) was evaluated and is not used:
//! - Its injection edits an `oci_spec::runtime::Spec`, which drops config.json fields oci-spec
//!   does not know (measured: a `linux.futureField` does not survive it; it does survive
//!   [`crate::edits::apply`], which edits the JSON document). That alone rules it out for the
//!   shim's write path.
//! - Its model types have `pub(crate)` fields and its errors are `anyhow`, so it cannot build
//!   the edits legacy requests need or report errors by file and device.
//! - It decodes with serde_yaml (deprecated; YAML 1.2, so `fileMode: 0666` is 666, not Go's
//!   438, and an unquoted `name: 0` fails), validates every spec against a JSON schema, checks
//!   `enableMonitoring` by presence rather than value, and `get_errors` returns nothing.
//! - Cost, measured on this repository's 2-core CI machine (release, LTO) with the spec
//!   `nvshim cdi generate` writes for an 8-GPU fake host (14 KB, 17 devices), 300 rounds:
//!   load + validate the spec dir: crate 2.07 ms, nvshim 0.34 ms; load + resolve + inject one
//!   device into a `runc spec` config.json: crate 2.34 ms, nvshim 0.45 ms. A minimal consumer
//!   binary (load, resolve, inject): crate 9.2 MB (jsonschema, reqwest, regex, clap,
//!   serde_yaml), nvshim 0.78 MB; its whole run (hyperfine, 200 runs): 7.1 ms vs 1.6 ms.
//!
//! So this module is nvshim's own: about 2,500 lines without tests, YAML reader included, on
//! the one edits model. The baseline is CDI 1.1.0 plus fixes from the reference's main branch
//! (README.md, "CDI", lists them): env entries replace an existing key in place, one-letter
//! vendor names, `permissions: none`. Deliberate differences from the reference, each also
//! noted where it lives: a hook without `env` gets nvshim's hook env rather than the
//! container's (`edits.rs`), applying the same edits twice changes nothing (`edits.rs`), an
//! unreadable spec directory does not stop the scan (`registry.rs`), spec files are read
//! non-blocking, regular only and size-capped, with a bound on alias expansion (`spec.rs`,
//! `yaml.rs`), annotation keys are read in sorted order (the reference iterates a Go map), and
//! YAML timestamps stay strings.

pub mod annotations;
pub mod index;
pub mod name;
pub mod registry;
pub mod spec;
mod spec_cache;
pub mod yaml;

pub use name::{is_qualified, looks_qualified, parse_qualified_name, QualifiedName};
pub use registry::{Registry, ResolveError, ScanError};
pub use spec::{Format, Spec};

#[cfg(test)]
mod conformance;
