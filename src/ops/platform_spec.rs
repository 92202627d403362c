//! `nvshim cdi generate` on a WSL2 host or a Jetson in CSV mode: the spec NVIDIA's generator
//! writes there (`pkg/nvcdi/lib-wsl.go`: one device `all` with `/dev/dxg`; `lib-csv.go`: one
//! device `0`, with the `dev` nodes of the CSV files, and `all`), with the driver's files and
//! the fix-ups hook as common edits, the same edits a legacy request gets
//! ([`crate::legacy::platform`]).

use std::path::Path;

use crate::cdi::spec::{Device, Spec};
use crate::config::Platform;
use crate::host::Host;
use crate::legacy::platform::{csv_edits, wsl_edits};
use crate::ops::generate::{GenerateError, Options};

/// The spec for `platform` (`wsl` or `csv`), and where its files came from. The CSV files are
/// the base ones only: `NVIDIA_REQUIRE_JETPACK=csv-mounts=all` is a container's choice.
pub fn generate(
    host: &Host,
    platform: Platform,
    csv_dir: &Path,
    opts: &Options,
) -> Result<(Spec, String), GenerateError> {
    let (edits, names, origin) = if platform == Platform::Wsl {
        let driver = crate::host::wsl::discover(host)?;
        let edits = wsl_edits(&driver, &opts.hook_path, None);
        (
            edits,
            vec!["all"],
            format!("WSL driver store {}", driver.store),
        )
    } else {
        let driver = crate::host::csv::discover(host, csv_dir, false)?;
        let edits = csv_edits(&driver, &opts.hook_path, None);
        let files: Vec<String> = driver
            .files
            .iter()
            .map(|f| f.display().to_string())
            .collect();
        (
            edits,
            vec!["0", "all"],
            format!("CSV files {}", files.join(", ")),
        )
    };
    let devices = names
        .into_iter()
        .map(|name| Device {
            name: name.into(),
            container_edits: edits.device.clone(),
            ..Default::default()
        })
        .collect();
    let mut spec = Spec {
        cdi_version: String::new(),
        kind: format!("{}/{}", opts.vendor, opts.class),
        annotations: Default::default(),
        devices,
        container_edits: edits.common,
    };
    spec.cdi_version = spec.minimum_version().to_string();
    spec.validate()?;
    Ok((spec, origin))
}
