//! Resolves an `NVIDIA_VISIBLE_DEVICES` request against the host into [`ContainerEdits`]: the
//! same model CDI specs use, applied by the same [`crate::edits::apply`].
//!
//! What is added follows libnvidia-container (nvidia-toolkit-behaviour.md §10): the chosen
//! `/dev/nvidiaN` nodes plus nvidiactl, nvidia-uvm, nvidia-uvm-tools and nvidia-modeset; the
//! driver libraries and binaries of the requested capabilities (its per-capability lists,
//! `src/nvc_info.c`), mounted read-only at their host paths; and two `createContainer` hooks
//! (SONAME links, then the ld.so.cache update) with an explicit minimal environment, so no
//! hook ever inherits the container's (CVE-2025-23266).

use std::path::Path;

use thiserror::Error;

use crate::edits::{ContainerEdits, DeviceNode, Hook, Mount};
use crate::host::{normalize_bus_id, DeviceMajors, Gpu, Host, HostError};
use crate::request::{Capabilities, Request, VisibleDevices};

#[derive(Debug, Error)]
pub enum LegacyError {
    #[error(transparent)]
    Host(#[from] HostError),
    #[error("unknown GPU {id:?} in NVIDIA_VISIBLE_DEVICES; this host has {available}")]
    UnknownGpu { id: String, available: String },
    #[error("NVIDIA_VISIBLE_DEVICES asks for GPUs but the host has none under {dir}")]
    NoGpus { dir: String },
}

/// Libraries per capability (libnvidia-container `src/nvc_info.c`).
pub const UTILITY_LIBS: &[&str] = &["libnvidia-ml.so", "libnvidia-cfg.so", "libnvidia-nscq.so"];
pub const COMPUTE_LIBS: &[&str] = &[
    "libcuda.so",
    "libcudadebugger.so",
    "libnvidia-opencl.so",
    "libnvidia-gpucomp.so",
    "libnvidia-ptxjitcompiler.so",
    "libnvidia-fatbinaryloader.so",
    "libnvidia-allocator.so",
    "libnvidia-compiler.so",
    "libnvidia-pkcs11.so",
    "libnvidia-pkcs11-openssl3.so",
    "libnvidia-nvvm.so",
    "libnvidia-tileiras.so",
];
pub const VIDEO_LIBS: &[&str] = &[
    "libvdpau_nvidia.so",
    "libnvidia-encode.so",
    "libnvidia-opticalflow.so",
    "libnvcuvid.so",
];
pub const GRAPHICS_LIBS: &[&str] = &[
    "libnvidia-eglcore.so",
    "libnvidia-glcore.so",
    "libnvidia-tls.so",
    "libnvidia-glsi.so",
    "libnvidia-fbc.so",
    "libnvidia-ifr.so",
    "libnvidia-rtcore.so",
    "libnvoptix.so",
    "libGLX_nvidia.so",
    "libEGL_nvidia.so",
    "libGLESv2_nvidia.so",
    "libGLESv1_CM_nvidia.so",
    "libnvidia-glvkspirv.so",
    "libnvidia-cbl.so",
];
pub const NGX_LIBS: &[&str] = &["libnvidia-ngx.so"];
pub const UTILITY_BINS: &[&str] = &[
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nv-fabricmanager",
];
pub const COMPUTE_BINS: &[&str] = &["nvidia-cuda-mps-control", "nvidia-cuda-mps-server"];

/// Mount options for driver files: read-only, no setuid or device files, private propagation
/// (NVIDIA v1.18 made every mount rprivate so nothing leaks back to the host).
pub const MOUNT_OPTIONS: &[&str] = &["ro", "nosuid", "nodev", "rbind", "rprivate"];

/// The environment every nvshim hook runs with: never the container's.
pub const HOOK_ENV: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Well-known minors (nvidia-toolkit-behaviour.md §6).
const NVIDIACTL_MINOR: u32 = 255;
const MODESET_MINOR: u32 = 254;

/// Library base names for a set of capabilities. `compat32` (32-bit libraries) is accepted but
/// adds nothing: nvshim mounts 64-bit libraries only.
pub fn libraries_for(caps: &Capabilities) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    let mut add = |list: &[&'static str]| {
        for l in list {
            if !out.contains(l) {
                out.push(l);
            }
        }
    };
    if caps.utility {
        add(UTILITY_LIBS);
    }
    if caps.compute || caps.video {
        add(COMPUTE_LIBS);
    }
    if caps.video {
        add(VIDEO_LIBS);
    }
    if caps.graphics || caps.display {
        add(GRAPHICS_LIBS);
    }
    if caps.ngx {
        add(NGX_LIBS);
    }
    out
}

pub fn binaries_for(caps: &Capabilities) -> Vec<&'static str> {
    let mut out = Vec::new();
    if caps.utility {
        out.extend_from_slice(UTILITY_BINS);
    }
    if caps.compute {
        out.extend_from_slice(COMPUTE_BINS);
    }
    out
}

fn describe(gpus: &[Gpu]) -> String {
    if gpus.is_empty() {
        return "no GPUs".into();
    }
    let list: Vec<String> = gpus
        .iter()
        .map(|g| format!("{} ({}, {})", g.index, g.uuid, g.bus_id))
        .collect();
    format!("GPUs {}", list.join(", "))
}

/// Picks the GPUs a request names. Ids: index in PCI bus order, `GPU-<uuid>` (case
/// insensitive), or a PCI bus id (domain optional).
pub fn select_gpus(devices: &VisibleDevices, gpus: &[Gpu]) -> Result<Vec<Gpu>, LegacyError> {
    let ids = match devices {
        VisibleDevices::NotRequested | VisibleDevices::NoGpus => return Ok(Vec::new()),
        VisibleDevices::All => return Ok(gpus.to_vec()),
        VisibleDevices::List(ids) => ids,
    };
    let mut out: Vec<Gpu> = Vec::new();
    for id in ids {
        let found = if id.bytes().all(|b| b.is_ascii_digit()) {
            id.parse::<usize>().ok().and_then(|i| gpus.get(i))
        } else if id.len() > 4 && id[..4].eq_ignore_ascii_case("GPU-") {
            gpus.iter().find(|g| g.uuid.eq_ignore_ascii_case(id))
        } else {
            normalize_bus_id(id).and_then(|b| gpus.iter().find(|g| g.bus_id == b))
        };
        let gpu = found.ok_or_else(|| LegacyError::UnknownGpu {
            id: id.clone(),
            available: describe(gpus),
        })?;
        if !out.iter().any(|g| g.minor == gpu.minor) {
            out.push(gpu.clone());
        }
    }
    Ok(out)
}

/// A device node with the major and minor the driver registered, and mode and owner from the
/// host node when it exists (runc creates the node in the container from these numbers).
fn node(host: &Host, name: &str, major: u32, minor: u32) -> DeviceNode {
    let found = host.device_node(name);
    if let Some(n) = &found {
        if (n.major, n.minor) != (major, minor) {
            tracing::warn!(
                path = %n.host_path.display(),
                host = %format!("{}:{}", n.major, n.minor),
                driver = %format!("{major}:{minor}"),
                "host device node numbers differ from /proc/devices; using the driver's"
            );
        }
    }
    DeviceNode {
        path: format!("/dev/{name}"),
        host_path: None,
        kind: Some("c".into()),
        major: Some(major.into()),
        minor: Some(minor.into()),
        file_mode: Some(found.as_ref().map_or(0o666, |n| n.file_mode)),
        permissions: Some("rwm".into()),
        uid: Some(found.as_ref().map_or(0, |n| n.uid)),
        gid: Some(found.as_ref().map_or(0, |n| n.gid)),
    }
}

/// Device nodes for the chosen GPUs plus the control nodes.
pub fn device_nodes(host: &Host, majors: &DeviceMajors, gpus: &[Gpu]) -> Vec<DeviceNode> {
    let mut nodes: Vec<DeviceNode> = gpus
        .iter()
        .map(|g| node(host, &format!("nvidia{}", g.minor), majors.nvidia, g.minor))
        .collect();
    nodes.push(node(host, "nvidiactl", majors.nvidia, NVIDIACTL_MINOR));
    if let Some(uvm) = majors.nvidia_uvm {
        nodes.push(node(host, "nvidia-uvm", uvm, 0));
        if host.device_node("nvidia-uvm-tools").is_some() {
            nodes.push(node(host, "nvidia-uvm-tools", uvm, 1));
        }
    }
    if host.device_node("nvidia-modeset").is_some() {
        nodes.push(node(host, "nvidia-modeset", majors.nvidia, MODESET_MINOR));
    }
    nodes
}

/// The edits for a legacy request. `hook_path` is the `nvshim-hook` binary written into hooks.
pub fn resolve(
    host: &Host,
    request: &Request,
    hook_path: &Path,
) -> Result<(Vec<Gpu>, ContainerEdits), LegacyError> {
    let majors = host.device_majors()?;
    let driver_version = host.driver_version()?;
    let all_gpus = host.gpus()?;
    if matches!(
        request.devices,
        VisibleDevices::All | VisibleDevices::List(_)
    ) && all_gpus.is_empty()
    {
        return Err(LegacyError::NoGpus {
            dir: host
                .roots()
                .proc_root
                .join("driver/nvidia/gpus")
                .display()
                .to_string(),
        });
    }
    let gpus = select_gpus(&request.devices, &all_gpus)?;
    let mut edits = ContainerEdits {
        device_nodes: device_nodes(host, &majors, &gpus),
        ..Default::default()
    };

    let cache = host.ld_cache()?;
    let libs = host.driver_libraries(
        &cache,
        &libraries_for(&request.capabilities),
        &driver_version,
    );
    let bins = host.binaries(&binaries_for(&request.capabilities));
    let mount = |host_path: &Path, container_path: &str| Mount {
        host_path: host_path.to_string_lossy().into_owned(),
        container_path: container_path.to_string(),
        kind: Some("bind".into()),
        options: MOUNT_OPTIONS.iter().map(|s| s.to_string()).collect(),
    };
    for l in &libs {
        edits
            .mounts
            .push(mount(&l.file.host_path, &l.file.container_path));
    }
    for b in &bins {
        edits.mounts.push(mount(&b.host_path, &b.container_path));
    }

    // SONAME links (`libcuda.so.1 -> libcuda.so.580.65.06`) and the development link
    // `libcuda.so -> libcuda.so.1` that applications dlopen; then the cache update.
    let mut links = Vec::new();
    let mut folders: Vec<String> = Vec::new();
    for l in &libs {
        let (dir, file) = l
            .file
            .container_path
            .rsplit_once('/')
            .unwrap_or(("", l.file.container_path.as_str()));
        if l.soname != file {
            links.push(format!("{file}::{dir}/{}", l.soname));
        }
        if l.soname == "libcuda.so.1" {
            links.push(format!("libcuda.so.1::{dir}/libcuda.so"));
        }
        let dir = if dir.is_empty() { "/" } else { dir };
        if !folders.iter().any(|f| f == dir) {
            folders.push(dir.to_string());
        }
    }
    let hook = |args: Vec<String>| Hook {
        hook_name: "createContainer".into(),
        path: hook_path.to_string_lossy().into_owned(),
        args,
        env: Some(vec![HOOK_ENV.to_string()]),
        timeout: None,
    };
    if !links.is_empty() {
        let mut args = vec!["nvshim-hook".to_string(), "create-symlinks".to_string()];
        for l in links {
            args.push("--link".into());
            args.push(l);
        }
        edits.hooks.push(hook(args));
    }
    if !folders.is_empty() {
        let mut args = vec!["nvshim-hook".to_string(), "update-ldcache".to_string()];
        for f in folders {
            args.push("--folder".into());
            args.push(f);
        }
        edits.hooks.push(hook(args));
    }
    Ok((gpus, edits))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpus() -> Vec<Gpu> {
        vec![
            Gpu {
                index: 0,
                minor: 1,
                uuid: "GPU-aaaa".into(),
                bus_id: "0000:1b:00.0".into(),
                model: "H100".into(),
            },
            Gpu {
                index: 1,
                minor: 0,
                uuid: "GPU-bbbb".into(),
                bus_id: "0000:3b:00.0".into(),
                model: "H100".into(),
            },
        ]
    }

    fn pick(ids: &[&str]) -> Result<Vec<u32>, LegacyError> {
        let d = VisibleDevices::List(ids.iter().map(|s| s.to_string()).collect());
        select_gpus(&d, &gpus()).map(|v| v.iter().map(|g| g.minor).collect())
    }

    #[test]
    fn selection_forms() {
        assert_eq!(pick(&["1"]).unwrap(), vec![0]);
        assert_eq!(pick(&["0"]).unwrap(), vec![1]);
        assert_eq!(pick(&["gpu-BBBB"]).unwrap(), vec![0]);
        assert_eq!(pick(&["0000:1b:00.0"]).unwrap(), vec![1]);
        assert_eq!(pick(&["3b:00.0"]).unwrap(), vec![0]);
        assert_eq!(pick(&["0", "GPU-aaaa"]).unwrap(), vec![1]);
    }

    #[test]
    fn unknown_gpu_lists_what_exists() {
        let err = pick(&["GPU-nope"]).unwrap_err().to_string();
        assert!(err.contains("\"GPU-nope\""), "{err}");
        assert!(err.contains("0 (GPU-aaaa, 0000:1b:00.0)"), "{err}");
        assert!(pick(&["2"]).is_err());
    }

    #[test]
    fn capability_lists() {
        let utility = libraries_for(&Capabilities::parse(Some("utility")).unwrap());
        assert!(utility.contains(&"libnvidia-ml.so"));
        assert!(!utility.contains(&"libcuda.so"));
        let video = libraries_for(&Capabilities::parse(Some("video")).unwrap());
        assert!(video.contains(&"libcuda.so") && video.contains(&"libnvcuvid.so"));
        assert!(
            binaries_for(&Capabilities::parse(Some("utility")).unwrap()).contains(&"nvidia-smi")
        );
    }
}
