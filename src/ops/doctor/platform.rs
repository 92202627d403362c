//! Which platform the host is ([`crate::host::platform::detect`]) and, on WSL2 or a Jetson in
//! CSV mode, whether the files NVIDIA's runtime serves there are found: these hosts have no
//! `/proc/driver/nvidia`, so the driver checks of an NVIDIA-driver host do not apply.

use super::{check, Check, Status};
use crate::config::{Config, Platform};
use crate::host::Host;

/// The `platform` check, then on WSL or CSV the `platform-driver` check.
pub fn platform_checks(host: &Host, config: &Config) -> Vec<Check> {
    let (platform, why) = crate::host::platform::detect(host, config.platform);
    let mut out = vec![check(
        "platform",
        Status::Ok,
        format!("{} ({why})", platform.name()),
        None,
    )];
    let found = match platform {
        Platform::Wsl => crate::host::wsl::discover(host).map(|d| {
            let missing = if d.missing.is_empty() {
                String::new()
            } else {
                format!("; the store lacks {}", d.missing.join(", "))
            };
            (
                format!(
                    "/dev/dxg {}:{}, driver store {} ({} files){missing}",
                    d.dxg.major,
                    d.dxg.minor,
                    d.store,
                    d.files.len()
                ),
                !d.missing.is_empty(),
            )
        }),
        Platform::Csv => {
            crate::host::csv::discover(host, &config.csv_mount_spec_path, false).map(|d| {
                let files: Vec<String> = d.files.iter().map(|f| f.display().to_string()).collect();
                (
                    format!(
                        "{}: {} device nodes, {} files and directories",
                        files.join(", "),
                        d.devices.len(),
                        d.mounts.len()
                    ),
                    d.devices.is_empty(),
                )
            })
        }
        _ => return out,
    };
    out.push(match found {
        Ok((message, false)) => check("platform-driver", Status::Ok, message, None),
        Ok((message, true)) => check(
            "platform-driver",
            Status::Warning,
            message,
            Some("reinstall the NVIDIA driver (WSL: the Windows driver; Jetson: JetPack)".into()),
        ),
        Err(e) => check("platform-driver", Status::Error, e.to_string(), None),
    });
    out
}
