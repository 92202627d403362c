//! `nvshim cdi generate --mode gds|mofed|gdrcopy|nvswitch`: the feature-gated modes.

use super::{add_node, found_node_edit, mount, GenerateError, Options};
use crate::cdi::spec::{Device, Spec};
use crate::edits::ContainerEdits;
use crate::host::gated::{self, Feature};
use crate::host::Host;
use crate::nvidia::MOUNT_OPTIONS;

/// A spec for one feature-gated mode, as NVIDIA's `nvidia-ctk cdi generate --mode
/// gds|mofed|gdrcopy|nvswitch` writes it (`pkg/nvcdi/gated.go`; its `lib_test.go` holds the
/// four specs): kind `<vendor>/<class>` (`nvidia.com/<mode>` by default), one device `all` with
/// the feature's nodes ([`gated::discover`], the rule legacy requests follow) and GDS's
/// files, global edits `NVIDIA_VISIBLE_DEVICES=void`. Device nodes as [`super::generate`] writes
/// them; an error when the host has none, as a spec with an empty device is invalid.
pub fn generate_gated(
    host: &Host,
    feature: Feature,
    opts: &Options,
) -> Result<Spec, GenerateError> {
    let found = gated::discover(host, &[feature]).remove(0);
    if found.nodes.is_empty() {
        return Err(GenerateError::NoGatedNodes {
            mode: feature.mode(),
            title: feature.title(),
            patterns: feature.patterns(),
            why: found.notes.join("; "),
        });
    }
    let mut all = ContainerEdits::default();
    for n in &found.nodes {
        add_node(&mut all, found_node_edit(n));
    }
    all.mounts = found
        .files
        .iter()
        .map(|f| mount(f, MOUNT_OPTIONS))
        .collect();
    let mut spec = Spec {
        cdi_version: String::new(),
        kind: format!("{}/{}", opts.vendor, opts.class),
        annotations: Default::default(),
        devices: vec![Device {
            name: "all".into(),
            container_edits: all,
            ..Default::default()
        }],
        container_edits: ContainerEdits {
            env: vec![format!("{}=void", crate::request::VISIBLE_DEVICES)],
            ..Default::default()
        },
    };
    spec.cdi_version = spec.minimum_version().to_string();
    spec.validate()?;
    Ok(spec)
}
