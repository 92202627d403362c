//! GPU memory limits: the `apply-cuda-memory-limits` hook nvshim-runtime adds to a GPU
//! container that asks for one.
//!
//! When a create gives the container GPUs (legacy `NVIDIA_VISIBLE_DEVICES`, or CDI devices
//! through nvshim-runtime) and the container's final `process.env` (after the edits, so a CDI
//! spec's env counts) has both `NVIDIA_GPU_MEMORY_REQUEST` and `NVIDIA_GPU_MEMORY_LIMIT`, one
//! `createRuntime` hook is added:
//! `nvshim-hook apply-cuda-memory-limits --driver-root R --gpu-id ID ... [--log-file F]`, with
//! nvshim's minimal hook environment. The hook reads the values from config.json and applies
//! them through NVML ([`nvshim_hook::apply_cuda_memory_limits`]; docs/capabilities.md, "GPU
//! memory limits"). Without both variables nothing here reads the host: the check is one scan
//! of the env. `--log-file` is nvshim's log file, so that a driver that cannot apply the limit
//! leaves its warning where an operator looks (runc drops a successful hook's stderr).
//!
//! Which ids the hook gets:
//! - Legacy: the UUIDs of the whole GPUs the request selects, from the host snapshot
//!   (`/proc/driver/nvidia/gpus/*/information`), and MIG devices named by `MIG-<uuid>` as
//!   named. MIG devices named `G:M` or `MIG-GPU-<uuid>/<gi>/<ci>` are skipped with a warning:
//!   their MIG UUID is known only to NVML, which create does not load for this.
//! - CDI: a requested device's GPU node, told by its numbers (the `nvidia` major of
//!   `/proc/devices`, minor `N` below the control nodes'), names the host GPU with minor `N`,
//!   whose UUID the snapshot knows. The numbers are the node's own, or its host node's
//!   (`hostPath`): the container path says nothing (`path: /dev/nvidia0` over the host's
//!   `nvidia1` is GPU 1; a `/dev/null` named `/dev/nvidia0` is no GPU). A device that also
//!   brings an `nvidia-caps` node is a MIG device, and one whose GPU the snapshot lacks cannot
//!   be named: both skipped with a warning. A device with no GPU node (an IMEX channel,
//!   another vendor's device) is not a GPU and is passed over.
//! - Nothing is added when config.json already has an `apply-cuda-memory-limits` hook (specs
//!   written by NVIDIA's generator carry their own), nor under the sandbox profile, which adds
//!   no hook: a warning says the limit is not applied, as when a driver cannot apply it.

use std::path::Path;

use nvshim_hook::apply_cuda_memory_limits::{LIMIT_ENV, REQUEST_ENV};
use serde_json::Value;

use crate::config::{Config, Profile};
use crate::edits::{Cause, DeviceNode, EditGroup, Hook};
use crate::host::{DeviceMajors, Gpu, Host, HostError};
use crate::legacy::{self, MigId};
use crate::nvidia::{HOOK_ENV, MODESET_MINOR};
use crate::request::{Request, Route};

/// The hook's subcommand.
pub const SUBCOMMAND: &str = "apply-cuda-memory-limits";

/// True when the spec's `process.env` sets both variables.
pub fn requested(spec: &Value) -> bool {
    let Some(env) = spec.pointer("/process/env").and_then(Value::as_array) else {
        return false;
    };
    let has = |var: &str| {
        env.iter()
            .filter_map(Value::as_str)
            .any(|e| e.split_once('=').is_some_and(|(k, _)| k == var))
    };
    has(REQUEST_ENV) && has(LIMIT_ENV)
}

/// True when the spec already runs the hook (NVIDIA's CDI specs add it themselves).
fn has_hook(spec: &Value) -> bool {
    spec.pointer("/hooks/createRuntime")
        .and_then(Value::as_array)
        .is_some_and(|hooks| {
            hooks.iter().any(|h| {
                h.get("args")
                    .and_then(Value::as_array)
                    .is_some_and(|a| a.iter().any(|x| x.as_str() == Some(SUBCOMMAND)))
            })
        })
}

/// What the hook needs of a create plan (`crate::create::Plan`'s fields of the same names).
#[derive(Debug, Clone, Copy)]
pub struct Selection<'a> {
    /// config.json after the edits.
    pub edited: &'a Value,
    pub route: &'a Route,
    pub request: &'a Request,
    /// The GPUs a legacy request resolved to.
    pub gpus: &'a [Gpu],
    /// The CDI devices injected, fully qualified.
    pub cdi_devices: &'a [String],
    /// The edits by cause (for CDI requests: by spec and device).
    pub groups: &'a [EditGroup],
}

/// The GPU ids of a legacy request, and the warnings for the MIG devices skipped.
fn legacy_ids(plan: &Selection, all: &[Gpu]) -> (Vec<String>, Vec<String>) {
    let (gpu_ids, mig_ids) = legacy::split_mig_ids(&plan.request.devices);
    let mut ids: Vec<String> = legacy::select_gpus(&gpu_ids, all)
        .unwrap_or_default()
        .into_iter()
        .map(|g| g.uuid)
        .collect();
    let mut warnings = Vec::new();
    for (id, mig) in mig_ids {
        match mig {
            MigId::Uuid(_) => ids.push(id),
            _ => warnings.push(format!(
                "{LIMIT_ENV}: MIG device {id:?} gets no GPU memory limit (its MIG UUID is known \
                 only to NVML); name it as MIG-<uuid> for one"
            )),
        }
    }
    (ids, warnings)
}

/// The numbers of the node a device node edit gives the container, as `edits::apply` fills
/// them: its own when it has them (runc makes the node from them), else its host node's
/// (`hostPath`, or `path`). `None` for anything but a character device.
fn node_numbers(d: &DeviceNode) -> Option<(u32, u32)> {
    let d = crate::edits::fill_device(d).ok()?;
    if d.kind.as_deref() != Some("c") {
        return None;
    }
    Some((u32::try_from(d.major?).ok()?, u32::try_from(d.minor?).ok()?))
}

/// The GPU ids of a CDI request, and the warnings for the devices skipped. A device's GPU is
/// the one whose node it gives the container, by the node's numbers, whatever path the node
/// has in the container: `path: /dev/nvidia0` with the host node of minor 1 is GPU 1.
fn cdi_ids(plan: &Selection, all: &[Gpu], majors: &DeviceMajors) -> (Vec<String>, Vec<String>) {
    let mut ids = Vec::new();
    let mut warnings = Vec::new();
    // `nvidiactl` and `nvidia-modeset` share the GPUs' major.
    let gpu_minor = |(major, minor): (u32, u32)| {
        (major == majors.nvidia && minor < MODESET_MINOR).then_some(minor)
    };
    for group in plan.groups {
        let Cause::CdiDevice { name, .. } = &group.cause else {
            continue;
        };
        let numbers: Vec<(u32, u32)> = group
            .edits
            .device_nodes
            .iter()
            .filter_map(node_numbers)
            .collect();
        let minors: Vec<u32> = numbers.iter().copied().filter_map(gpu_minor).collect();
        if minors.is_empty() {
            continue;
        }
        if numbers
            .iter()
            .any(|(major, _)| Some(*major) == majors.nvidia_caps)
        {
            warnings.push(format!(
                "{LIMIT_ENV}: CDI device {name} is a MIG device, which gets no GPU memory limit \
                 from nvshim-runtime (its MIG UUID is known only to NVML)"
            ));
            continue;
        }
        for minor in minors {
            match all.iter().find(|g| g.minor == minor) {
                Some(g) if !ids.contains(&g.uuid) => ids.push(g.uuid.clone()),
                Some(_) => {}
                None => warnings.push(format!(
                    "{LIMIT_ENV}: CDI device {name} brings the GPU node {}:{minor}, which is not \
                     a GPU of this host's /proc/driver/nvidia/gpus, so it gets no GPU memory limit",
                    majors.nvidia
                )),
            }
        }
    }
    (ids, warnings)
}

/// The hook for `plan` (after its edits), if the container asks for limits on GPUs it gets,
/// and the warnings for devices that cannot be named.
pub fn hook(
    config: &Config,
    host: &Host,
    plan: &Selection,
    hook_path: &Path,
) -> Result<(Option<Hook>, Vec<String>), HostError> {
    if !requested(plan.edited) || has_hook(plan.edited) {
        return Ok((None, Vec::new()));
    }
    if config.profile == Profile::Sandbox {
        return Ok((
            None,
            vec![format!("{LIMIT_ENV} not applied: the sandbox profile adds no hook ({SUBCOMMAND}); set profile = \"standard\" in the nvshim config to apply it")],
        ));
    }
    let (ids, warnings) = match plan.route {
        Route::Legacy(_) if !plan.gpus.is_empty() => legacy_ids(plan, &host.gpus()?),
        Route::Cdi(..) if !plan.cdi_devices.is_empty() => {
            cdi_ids(plan, &host.gpus()?, &host.device_majors()?)
        }
        _ => return Ok((None, Vec::new())),
    };
    if ids.is_empty() {
        return Ok((None, warnings));
    }
    let mut args = vec![
        "nvshim-hook".to_string(),
        SUBCOMMAND.to_string(),
        "--driver-root".to_string(),
        config.driver_root.to_string_lossy().into_owned(),
    ];
    for id in ids {
        args.push("--gpu-id".into());
        args.push(id);
    }
    if let Some(log) = config
        .log_file
        .as_deref()
        .filter(|l| *l != Path::new("/dev/null"))
    {
        args.push("--log-file".into());
        args.push(log.to_string_lossy().into_owned());
    }
    Ok((
        Some(Hook {
            hook_name: "createRuntime".into(),
            path: hook_path.to_string_lossy().into_owned(),
            args,
            env: Some(vec![HOOK_ENV.to_string()]),
            timeout: None,
        }),
        warnings,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn requested_needs_both_variables() {
        let spec = |env: &[&str]| json!({"process": {"env": env}});
        assert!(!requested(&json!({})));
        assert!(!requested(&spec(&["NVIDIA_GPU_MEMORY_LIMIT=2048"])));
        assert!(!requested(&spec(&["NVIDIA_GPU_MEMORY_REQUEST=1"])));
        assert!(requested(&spec(&[
            "NVIDIA_GPU_MEMORY_REQUEST=1024",
            "PATH=/bin",
            "NVIDIA_GPU_MEMORY_LIMIT=2048"
        ])));
    }

    #[test]
    fn an_existing_hook_is_kept_alone() {
        let spec = json!({"hooks": {"createRuntime": [
            {"path": "/usr/bin/nvidia-cdi-hook", "args": ["nvidia-cdi-hook", "apply-cuda-memory-limits", "--driver-root", ""]}
        ]}});
        assert!(has_hook(&spec));
        assert!(!has_hook(&json!({"hooks": {"createContainer": []}})));
    }
}
