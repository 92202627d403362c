//! Checks of the repository itself, one test binary, no root and no daemon needed: the
//! library's layers ([`layers`]), that everything a comment cites is in the repository
//! ([`citations`]), and the Kubernetes manifests and packaged configs ([`k8s_manifests`]).
//! `cargo test --test checks` runs them; `cargo test --test checks layers::` one of them.

mod citations;
mod k8s_manifests;
mod layers;
