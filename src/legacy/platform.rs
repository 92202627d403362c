//! `NVIDIA_VISIBLE_DEVICES` requests on a WSL2 host and on a Jetson in CSV mode: the edits
//! NVIDIA's runtime makes there (its JIT CDI spec of `pkg/nvcdi/lib-wsl.go` and
//! `lib-csv.go`), from what [`crate::host::wsl`] and [`crate::host::csv`] found. The same
//! edits make the spec `nvshim cdi generate` writes for these hosts
//! ([`crate::ops::platform_spec`]): one device, `all` (WSL) or `0` and `all` (CSV), and
//! common edits with the driver's files and the fix-ups hook. `NVIDIA_DRIVER_CAPABILITIES` does
//! not narrow them: NVIDIA's CDI and CSV modes ignore it too.

use std::path::Path;

use super::{container_hooks, HookPlan, Resolved, Settings};
use crate::config::Platform;
use crate::edits::{Cause, ContainerEdits, DeviceNode, EditGroup, Mount};
use crate::host::csv::CsvDriver;
use crate::host::platform::PlatformError;
use crate::host::wsl::WslDriver;
use crate::host::{DriverLibrary, Host, HostDeviceNode, HostFile};
use crate::nvidia::MOUNT_OPTIONS;
use crate::request::{Request, VisibleDevices, VISIBLE_DEVICES};

/// A platform's edits: what the GPU device brings, and what every request brings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlatformEdits {
    pub device: ContainerEdits,
    pub common: ContainerEdits,
    /// The mount sources, none a directory but those of CSV `dir` lines.
    pub files: Vec<String>,
}

/// A device node at its host numbers; its group joins `additionalGids` when the node is not
/// world read-write (NVIDIA's `internal/edits/device.go`).
fn node(n: &HostDeviceNode, edits: &mut ContainerEdits) {
    let host = n.host_path.to_string_lossy();
    let gid = (n.gid != 0).then_some(n.gid);
    edits.device_nodes.push(DeviceNode {
        path: n.container_path.clone(),
        host_path: (host != n.container_path.as_str()).then(|| host.into_owned()),
        kind: Some("c".into()),
        major: Some(n.major.into()),
        minor: Some(n.minor.into()),
        file_mode: Some(n.file_mode),
        permissions: Some("rwm".into()),
        uid: None,
        gid,
    });
    if let Some(g) = gid.filter(|_| n.file_mode & 0o006 != 0o006) {
        if !edits.additional_gids.contains(&g) {
            edits.additional_gids.push(g);
        }
    }
}

fn mount(f: &HostFile) -> Mount {
    super::bind(&f.host_path, &f.container_path, MOUNT_OPTIONS)
}

/// The common edits: `files` mounted, and the fix-ups hook making `links` and the SONAME links
/// of `libs`, and adding the libraries' folders to the container's ld.so.cache.
fn common(
    files: &[HostFile],
    libs: &[DriverLibrary],
    links: Vec<(String, String)>,
    hook_path: &Path,
    bundle: Option<&Path>,
) -> ContainerEdits {
    let plan = HookPlan {
        libs,
        dev_links: &[],
        links,
        cuda_compat: false,
        application_profile: false,
        host_params: None,
        bundle,
    };
    ContainerEdits {
        mounts: files.iter().map(mount).collect(),
        hooks: container_hooks(&plan, "", hook_path),
        ..Default::default()
    }
}

/// WSL (`lib-wsl.go`): `/dev/dxg` for the device; `libdxcore.so` and the driver store's files,
/// `/usr/bin/nvidia-smi` linked to the store's, and the ld.so.cache for both folders.
pub fn wsl_edits(driver: &WslDriver, hook_path: &Path, bundle: Option<&Path>) -> PlatformEdits {
    let mut device = ContainerEdits::default();
    node(&driver.dxg, &mut device);
    let libs: Vec<DriverLibrary> = driver
        .files
        .iter()
        .filter(|f| {
            let name = f.container_path.rsplit('/').next().unwrap_or_default();
            name.starts_with("lib") && name.contains(".so")
        })
        .map(|f| DriverLibrary {
            soname: crate::host::platform::soname(&f.host_path).unwrap_or_else(|| {
                f.container_path
                    .rsplit('/')
                    .next()
                    .unwrap_or_default()
                    .into()
            }),
            file: f.clone(),
        })
        .collect();
    let links = driver
        .smi
        .iter()
        .map(|smi| (smi.clone(), "/usr/bin/nvidia-smi".to_string()))
        .collect();
    PlatformEdits {
        device,
        common: common(&driver.files, &libs, links, hook_path, bundle),
        files: driver
            .files
            .iter()
            .map(|f| f.host_path.to_string_lossy().into_owned())
            .collect(),
    }
}

/// CSV (`lib-csv.go`, `tegra/csv.go`): the `dev` nodes for the device; directories, files,
/// `/etc/nv_tegra_release`, the `sym` chains and `.so` links, and the ld.so.cache.
pub fn csv_edits(driver: &CsvDriver, hook_path: &Path, bundle: Option<&Path>) -> PlatformEdits {
    let mut device = ContainerEdits::default();
    for n in &driver.devices {
        node(n, &mut device);
    }
    let libs: Vec<DriverLibrary> = driver
        .libs
        .iter()
        .map(|(f, soname)| DriverLibrary {
            file: f.clone(),
            soname: soname.clone(),
        })
        .collect();
    PlatformEdits {
        device,
        common: common(
            &driver.mounts,
            &libs,
            driver.links.clone(),
            hook_path,
            bundle,
        ),
        files: driver
            .mounts
            .iter()
            .filter(|f| !f.host_path.is_dir())
            .map(|f| f.host_path.to_string_lossy().into_owned())
            .collect(),
    }
}

/// Whether the request gets the platform's one GPU device: `all`, or (CSV) `0`; `none` gets
/// the driver's files alone. Other ids are refused, as NVIDIA's runtime refuses them.
fn wants_device(platform: Platform, devices: &VisibleDevices) -> Result<bool, PlatformError> {
    match devices {
        VisibleDevices::All => Ok(true),
        VisibleDevices::NoGpus | VisibleDevices::NotRequested => Ok(false),
        VisibleDevices::List(ids) => {
            let value = ids.join(",");
            match platform {
                Platform::Csv if ids.iter().all(|i| i == "0" || i == "all") => Ok(true),
                Platform::Csv => Err(PlatformError::CsvDeviceIds { value }),
                _ if ids.iter().all(|i| i == "all") => Ok(true),
                _ => Err(PlatformError::WslDeviceIds { value }),
            }
        }
    }
}

/// A legacy request on a WSL or CSV host. `csv_dir` is the CSV lists' directory, `all_csv`
/// whether the container set `NVIDIA_REQUIRE_JETPACK=csv-mounts=all`.
pub fn resolve(
    platform: Platform,
    request: &Request,
    host: &Host,
    settings: &Settings,
    csv_dir: &Path,
    all_csv: bool,
) -> Result<Resolved, PlatformError> {
    if !request.unbacked.is_empty() {
        return Err(PlatformError::Unbacked {
            value: request.unbacked.join(","),
            platform: platform.name(),
        });
    }
    let unsupported = [
        (!request.imex_channels.is_empty(), "NVIDIA_IMEX_CHANNELS"),
        (
            matches!(
                request.mig_config,
                VisibleDevices::All | VisibleDevices::List(_)
            ),
            "NVIDIA_MIG_CONFIG_DEVICES",
        ),
        (
            matches!(
                request.mig_monitor,
                VisibleDevices::All | VisibleDevices::List(_)
            ),
            "NVIDIA_MIG_MONITOR_DEVICES",
        ),
    ];
    if let Some((_, what)) = unsupported.into_iter().find(|(asked, _)| *asked) {
        return Err(PlatformError::Unsupported {
            what,
            platform: platform.name(),
        });
    }
    let device = wants_device(platform, &request.devices)?;
    let hook = &settings.hook_path;
    let bundle = settings.bundle.as_deref();
    let edits = if platform == Platform::Wsl {
        wsl_edits(&crate::host::wsl::discover(host)?, hook, bundle)
    } else {
        let driver = crate::host::csv::discover(host, csv_dir, all_csv)?;
        if device && driver.devices.is_empty() {
            return Err(PlatformError::NoCsvDevices {
                files: driver
                    .files
                    .iter()
                    .map(|f| f.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                dev: host.roots().dev_root.join("dev"),
            });
        }
        csv_edits(&driver, hook, bundle)
    };
    let mut all = ContainerEdits::default();
    if device {
        all.append(&edits.device);
    }
    all.append(&edits.common);
    tracing::debug!(
        platform = platform.name(),
        var = VISIBLE_DEVICES,
        device,
        "platform request"
    );
    Ok(Resolved {
        gpus: Vec::new(),
        groups: vec![EditGroup {
            cause: Cause::Driver,
            edits: all,
        }],
        not_dirs: edits.files,
    })
}
