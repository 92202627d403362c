//! Resolves an `NVIDIA_VISIBLE_DEVICES` request against the host's inventory
//! ([`Inventory`], read once by the caller) into [`ContainerEdits`]: the same model CDI specs
//! use, applied by the same [`crate::edits::apply`]. Nothing here reads a file.
//!
//! What is added follows libnvidia-container: the chosen
//! `/dev/nvidiaN` nodes plus nvidiactl, nvidia-uvm, nvidia-uvm-tools and nvidia-modeset; the
//! driver libraries and binaries of the requested capabilities (its per-capability lists,
//! `src/nvc_info.c`), mounted read-only at their host paths; and two `createContainer` hooks
//! (SONAME links, then the ld.so.cache update) with an explicit minimal environment, so no
//! hook ever inherits the container's (CVE-2025-23266).
//!
//! Beyond whole GPUs, the forms Kubernetes device plugins and DRA drivers hand down:
//! - MIG devices (`G:M`, `MIG-<uuid>`, `MIG-GPU-<uuid>/<gi>/<ci>`): the parent GPU's node plus
//!   the `/dev/nvidia-caps/nvidia-cap<N>` nodes of the GPU instance and compute instance, with
//!   `N` from the capability's own file under `<proc-root>/driver/nvidia/capabilities`
//!   ([`Inventory::mig`]); never the GPU's DRM nodes ([`device_nodes`], the rule
//!   `nvshim cdi generate` follows too). NVML is loaded only to map a MIG index or UUID to its
//!   GPU and instances, and only when the request names one: a request without MIG ids never
//!   loads it. It is a function [`resolve`] is given ([`NvmlInventory`]), not part of the
//!   inventory.
//! - `NVIDIA_MIG_CONFIG_DEVICES` / `NVIDIA_MIG_MONITOR_DEVICES`: the `config` / `monitor`
//!   capability node, for privileged containers only (libnvidia-container refuses others too).
//! - IMEX channels: `/dev/nvidia-caps-imex-channels/channel<N>`, major
//!   `nvidia-caps-imex-channels` of `/proc/devices`, minor `N`; the node must exist.
//! - MPS: the host daemon's pipe directory, when it exists, for compute containers.
//!
//! One module: each part is a step
//! of [`resolve`] (a new device class adds its step here, from its field of the inventory),
//! which builds the edits, grouped by cause, from the selected GPUs, their
//! device nodes, MIG and IMEX capability nodes, the driver files of the capabilities and the
//! hooks. The steps stay public in one place because `ops::generate` writes a CDI spec with
//! the same driver-file and hook steps (so a generated spec brings what a legacy request
//! brings) and `memory_limits` selects GPUs and MIG devices with the same rules.

use std::path::{Path, PathBuf};

use thiserror::Error;

pub mod gated;
pub mod sandbox;

use crate::config::{Config, Profile};
use crate::edits::{Cause, ContainerEdits, DeviceNode, EditGroup, Hook, Mount};
use crate::host::inventory::{dev_link_always, dev_link_of, library_dirs};
use crate::host::nvml::{self, GpuInfo, Lookup, NvmlDiscoveryError};
use crate::host::{
    normalize_bus_id, DriverLibrary, Gpu, HostDeviceNode, HostError, HostFile, Inventory,
    MigInstance, MigKey, Scope,
};
use crate::nvidia::{
    self, brings, Capabilities, DRM_BROUGHT_BY, HOOK_ENV, IPC_MOUNT_OPTIONS, MOUNT_OPTIONS,
};
use crate::request::{Request, VisibleDevices, MIG_CONFIG_DEVICES, MIG_MONITOR_DEVICES};

pub mod platform;

#[derive(Debug, Error)]
pub enum LegacyError {
    #[error(transparent)]
    Host(#[from] HostError),
    #[error("unknown GPU {id:?} in NVIDIA_VISIBLE_DEVICES; this host has {available}: name one of those by index, UUID or PCI bus id")]
    UnknownGpu { id: String, available: String },
    #[error("NVIDIA_VISIBLE_DEVICES asks for GPUs but the host has none under {dir}; check the GPUs with `nvidia-smi -L` on the host (`nvshim doctor` checks the driver), or set NVIDIA_VISIBLE_DEVICES=none for the driver without GPUs")]
    NoGpus { dir: String },
    #[error("cannot map MIG device {id:?} to its GPU through NVML: {source} (NVML is loaded only for MIG ids; name the MIG device as MIG-GPU-<gpu uuid>/<gi>/<ci>, or fix libnvidia-ml.so.1 under driver-root)")]
    Nvml {
        id: String,
        source: NvmlDiscoveryError,
    },
    #[error("unknown MIG device {id:?} in NVIDIA_VISIBLE_DEVICES; {available}")]
    UnknownMig { id: String, available: String },
    #[error("MIG device {id:?}: no minor for its capability {capability:?}: no file for it under {file}, or no row in the driver's nvidia-caps/mig-minors table (was the MIG instance destroyed, or is the nvidia-caps part of the driver not loaded?)")]
    MigCapability {
        id: String,
        capability: String,
        file: PathBuf,
    },
    #[error("{what} needs the {name:?} character device major, which {path} does not list (is the driver loaded?)")]
    NoMajor {
        what: String,
        name: &'static str,
        path: PathBuf,
    },
    #[error("the host inventory was read for the capabilities {read:?}, not {capabilities:?} (a bug in nvshim: please report it)")]
    NotRead { capabilities: String, read: String },
    #[error("IMEX channel {channel} does not exist: no device node {path} (create the channel, e.g. through a ComputeDomain, or ask for one that exists)")]
    UnknownImexChannel { channel: u32, path: PathBuf },
}

/// The variable telling CUDA clients where the MPS daemon's pipes are.
pub const MPS_PIPE_ENV: &str = "CUDA_MPS_PIPE_DIRECTORY";

/// What the resolver needs from the config besides the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The `nvshim-hook` binary written into hooks.
    pub hook_path: PathBuf,
    /// How the NVML inventory is obtained (MIG ids only).
    pub nvml: nvml::NvmlAccess,
    /// The bundle being created, absolute: the fix-ups hook finds the container from it
    /// instead of waiting for its OCI state ([`HookPlan::bundle`]).
    pub bundle: Option<PathBuf>,
    /// The sandbox profile ([`sandbox`]): no hooks, no daemon sockets.
    pub sandbox: bool,
}

impl Settings {
    pub fn new(config: &Config, tools: &crate::install::Tools) -> Settings {
        Settings {
            hook_path: tools.hook.clone(),
            nvml: tools.nvml.clone(),
            bundle: None,
            sandbox: config.profile == Profile::Sandbox,
        }
    }
}

use crate::nvidia::{MODESET_MINOR, NVIDIACTL_MINOR, UVM_TOOLS_MINOR};

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
fn node(inv: &Inventory, name: &str, major: u32, minor: u32) -> DeviceNode {
    node_as_found(inv.node(name), name, major, minor)
}

/// [`node`] with the host's node as found (`None`: not there).
fn node_as_found(found: Option<&HostDeviceNode>, name: &str, major: u32, minor: u32) -> DeviceNode {
    if let Some(n) = found {
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
        path: ["/dev/", name].concat(),
        host_path: None,
        kind: Some("c".into()),
        major: Some(major.into()),
        minor: Some(minor.into()),
        file_mode: Some(found.map_or(0o666, |n| n.file_mode)),
        permissions: Some("rwm".into()),
        uid: Some(found.map_or(0, |n| n.uid)),
        gid: Some(found.map_or(0, |n| n.gid)),
    }
}

/// A GPU's device node, `/dev/nvidia<minor>`.
fn gpu_node(inv: &Inventory, gpu: &Gpu) -> DeviceNode {
    node(
        inv,
        &["nvidia", itoa::Buffer::new().format(gpu.minor)].concat(),
        inv.majors.nvidia,
        gpu.minor,
    )
}

/// The control nodes every GPU container gets, whichever GPUs it has.
fn control_nodes(inv: &Inventory) -> Vec<DeviceNode> {
    let majors = &inv.majors;
    let mut nodes = vec![node(inv, "nvidiactl", majors.nvidia, NVIDIACTL_MINOR)];
    if let Some(uvm) = majors.nvidia_uvm {
        nodes.push(node(inv, "nvidia-uvm", uvm, 0));
        if let Some(found) = inv.node("nvidia-uvm-tools") {
            let tools = node_as_found(Some(found), "nvidia-uvm-tools", uvm, UVM_TOOLS_MINOR);
            nodes.push(tools);
        }
    }
    if let Some(found) = inv.node("nvidia-modeset") {
        let modeset = node_as_found(Some(found), "nvidia-modeset", majors.nvidia, MODESET_MINOR);
        nodes.push(modeset);
    }
    nodes
}

/// A MIG device as `NVIDIA_VISIBLE_DEVICES` names it (go-nvlib `device/identifier.go`,
/// libnvidia-container `src/cli/common.c`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MigId {
    /// `G:M`: MIG device `M` (its NVML handle index) of GPU `G` (NVML index).
    Index { gpu: u32, mig: u32 },
    /// `MIG-<uuid>`.
    Uuid(String),
    /// `MIG-GPU-<gpu uuid>/<gi>/<ci>`, the naming of drivers before R470: says everything, so
    /// needs no NVML.
    Path {
        gpu_uuid: String,
        gpu_instance: u32,
        compute_instance: u32,
    },
}

fn number(s: &str) -> Option<u32> {
    (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        .then(|| s.parse().ok())
        .flatten()
}

/// Parses a MIG id; `None` for anything else (a GPU id). A PCI bus id has a `.` and so is never
/// `G:M`.
pub fn parse_mig_id(id: &str) -> Option<MigId> {
    if let Some((g, m)) = id.split_once(':') {
        return Some(MigId::Index {
            gpu: number(g)?,
            mig: number(m)?,
        });
    }
    let rest = id.get(..4).filter(|p| p.eq_ignore_ascii_case("MIG-"))?;
    let rest = &id[rest.len()..];
    if rest
        .get(..4)
        .is_some_and(|p| p.eq_ignore_ascii_case("GPU-"))
    {
        let mut parts = rest.split('/');
        let (Some(gpu_uuid), Some(gi), Some(ci), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Some(MigId::Uuid(id.to_string()));
        };
        if let (Some(gpu_instance), Some(compute_instance)) = (number(gi), number(ci)) {
            return Some(MigId::Path {
                gpu_uuid: gpu_uuid.to_string(),
                gpu_instance,
                compute_instance,
            });
        }
    }
    Some(MigId::Uuid(id.to_string()))
}

/// A MIG device resolved to its parent GPU and instances.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigDevice {
    /// As the request named it.
    pub id: String,
    pub parent: Gpu,
    pub gpu_instance: u32,
    pub compute_instance: u32,
}

/// What NVML reports about MIG devices, for error messages.
fn describe_migs(inventory: &[GpuInfo]) -> String {
    let list: Vec<String> = inventory
        .iter()
        .flat_map(|g| {
            g.migs
                .iter()
                .map(move |m| format!("{}:{} ({})", g.index, m.index, m.uuid))
        })
        .collect();
    if list.is_empty() {
        "NVML reports no MIG devices (is MIG enabled and are GPU instances created?)".into()
    } else {
        format!("NVML reports MIG devices {}", list.join(", "))
    }
}

/// Splits a request into its GPU ids and its MIG ids.
pub fn split_mig_ids(devices: &VisibleDevices) -> (VisibleDevices, Vec<(String, MigId)>) {
    match devices {
        VisibleDevices::List(ids) => {
            let mut gpus = Vec::new();
            let mut migs = Vec::new();
            for id in ids {
                match parse_mig_id(id) {
                    Some(m) => migs.push((id.clone(), m)),
                    None => gpus.push(id.clone()),
                }
            }
            (VisibleDevices::List(gpus), migs)
        }
        other => (other.clone(), Vec::new()),
    }
}

/// NVML's GPUs with their MIG devices: what [`select_migs`] maps `G:M` and `MIG-<uuid>` with,
/// told which look-ups it is for (what a cached answer must still hold for).
pub type NvmlInventory<'a> =
    dyn FnMut(&[Lookup<'_>]) -> Result<Vec<GpuInfo>, NvmlDiscoveryError> + 'a;

/// Resolves MIG ids to parent GPUs (from `gpus`, the /proc list) and instance ids. Calls
/// `nvml` at most once, and only when an id needs it (`G:M`, `MIG-<uuid>`).
pub fn select_migs(
    ids: &[(String, MigId)],
    gpus: &[Gpu],
    nvml: &mut NvmlInventory<'_>,
) -> Result<Vec<MigDevice>, LegacyError> {
    let lookups: Vec<Lookup<'_>> = ids
        .iter()
        .filter_map(|(id, mig)| match mig {
            MigId::Index { gpu, .. } => Some(Lookup::MigIndex { gpu: *gpu }),
            MigId::Uuid(_) => Some(Lookup::MigUuid(id)),
            MigId::Path { .. } => None,
        })
        .collect();
    let mut inventory: Option<Vec<GpuInfo>> = None;
    let mut out: Vec<MigDevice> = Vec::new();
    for (id, mig) in ids {
        let (parent_minor, gpu_instance, compute_instance) = match mig {
            MigId::Path {
                gpu_uuid,
                gpu_instance,
                compute_instance,
            } => {
                let parent = gpus
                    .iter()
                    .find(|g| g.uuid.eq_ignore_ascii_case(gpu_uuid))
                    .ok_or_else(|| LegacyError::UnknownMig {
                        id: id.clone(),
                        available: format!("its GPU is not one of this host's {}", describe(gpus)),
                    })?;
                (parent.minor, *gpu_instance, *compute_instance)
            }
            MigId::Index { .. } | MigId::Uuid(_) => {
                if inventory.is_none() {
                    inventory = Some(nvml(&lookups).map_err(|source| LegacyError::Nvml {
                        id: id.clone(),
                        source,
                    })?);
                }
                let inv = inventory.as_deref().unwrap_or_default();
                let unknown = || LegacyError::UnknownMig {
                    id: id.clone(),
                    available: describe_migs(inv),
                };
                let (gpu, m) = match mig {
                    MigId::Index { gpu, mig } => {
                        let g = inv.iter().find(|g| g.index == *gpu).ok_or_else(unknown)?;
                        let m = g
                            .migs
                            .iter()
                            .find(|m| m.index == *mig)
                            .ok_or_else(unknown)?;
                        (g, m)
                    }
                    _ => inv
                        .iter()
                        .find_map(|g| {
                            g.migs
                                .iter()
                                .find(|m| m.uuid.eq_ignore_ascii_case(id))
                                .map(|m| (g, m))
                        })
                        .ok_or_else(unknown)?,
                };
                (gpu.minor, m.gpu_instance, m.compute_instance)
            }
        };
        let parent = gpus
            .iter()
            .find(|g| g.minor == parent_minor)
            .ok_or_else(|| LegacyError::UnknownMig {
                id: id.clone(),
                available: format!(
                    "its GPU /dev/nvidia{parent_minor} is not one of this host's {}",
                    describe(gpus)
                ),
            })?;
        if !out.iter().any(|d| {
            d.parent.minor == parent.minor
                && (d.gpu_instance, d.compute_instance) == (gpu_instance, compute_instance)
        }) {
            out.push(MigDevice {
                id: id.clone(),
                parent: parent.clone(),
                gpu_instance,
                compute_instance,
            });
        }
    }
    Ok(out)
}

/// `all` means every GPU and every MIG device, as NVIDIA's `all` does (nvcdi: non-MIG GPUs plus
/// all MIG devices): a MIG-enabled GPU's node alone gives no access to its instances. The MIG
/// devices come from the driver's `/proc` ([`Inventory::mig`]), not NVML: `all` on a MIG
/// host costs a directory walk, not the NVML helper.
fn all_migs(inv: &Inventory, gpus: &[Gpu]) -> Vec<MigDevice> {
    inv.mig
        .iter()
        .map(|m| (m.gpu_minor, m.gpu_instance, m.compute_instance))
        .filter_map(|(minor, gi, ci)| {
            let parent = gpus.iter().find(|p| p.minor == minor)?;
            Some(MigDevice {
                id: [
                    "MIG-",
                    &parent.uuid,
                    "/",
                    itoa::Buffer::new().format(gi),
                    "/",
                    itoa::Buffer::new().format(ci),
                ]
                .concat(),
                parent: parent.clone(),
                gpu_instance: gi,
                compute_instance: ci,
            })
        })
        .collect()
}

/// The `mig-minors` names of a MIG device's two capabilities (GPU instance, compute instance).
pub fn mig_capabilities(mig: &MigDevice) -> [String; 2] {
    instance_capabilities(mig.parent.minor, mig.gpu_instance, mig.compute_instance)
}

/// The `mig-minors` names of the capabilities of GPU instance `gi` and its compute instance
/// `ci` on the GPU with minor `gpu`.
fn instance_capabilities(gpu: u32, gi: u32, ci: u32) -> [String; 2] {
    MigInstance {
        gpu_minor: gpu,
        gpu_instance: gi,
        compute_instance: ci,
        minors: [None; 2],
    }
    .capabilities()
}

/// One device a container is given, as legacy requests and `nvshim cdi generate` both count
/// them: a whole GPU, or one MIG device of a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuDevice<'a> {
    /// A whole GPU: its minor and PCI bus id.
    Gpu { minor: u32, bus_id: &'a str },
    /// A MIG device: its parent GPU's minor, its GPU instance and compute instance.
    Mig {
        parent_minor: u32,
        gpu_instance: u32,
        compute_instance: u32,
    },
}

/// The nodes one device brings, besides the control nodes every GPU container gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceNodes {
    /// `nvidia<minor>`: the GPU's, or a MIG device's parent's.
    pub gpu: String,
    /// A MIG device's GPU-instance and compute-instance capabilities, as `mig-minors` names
    /// them (their nodes are `nvidia-caps/nvidia-cap<minor>`).
    pub mig_capabilities: Vec<String>,
    /// With graphics, a whole GPU's DRM card and render nodes.
    pub drm: Vec<HostDeviceNode>,
}

/// Which nodes `device` brings: the one rule for legacy requests ([`resolve`]) and the specs
/// `nvshim cdi generate` writes, so the two cannot disagree. A MIG device gets its parent's
/// node and its two capability nodes, never the parent's DRM nodes: those open the whole GPU,
/// whatever slice of it the container holds (libnvidia-container gives a MIG device none).
pub fn device_nodes(inv: &Inventory, device: GpuDevice<'_>, graphics: bool) -> DeviceNodes {
    match device {
        GpuDevice::Gpu { minor, bus_id } => DeviceNodes {
            gpu: ["nvidia", itoa::Buffer::new().format(minor)].concat(),
            mig_capabilities: Vec::new(),
            drm: if graphics {
                inv.drm_nodes(bus_id).to_vec()
            } else {
                Vec::new()
            },
        },
        GpuDevice::Mig {
            parent_minor,
            gpu_instance,
            compute_instance,
        } => DeviceNodes {
            gpu: ["nvidia", itoa::Buffer::new().format(parent_minor)].concat(),
            mig_capabilities: instance_capabilities(parent_minor, gpu_instance, compute_instance)
                .into(),
            drm: Vec::new(),
        },
    }
}

/// A DRM node (or a feature-gated one, [`gated`]) as NVIDIA ≥ 1.19 writes it, with the node's
/// group to add to the container's groups when the node is not world read-write (render and
/// video groups).
fn drm_node(n: &HostDeviceNode) -> (DeviceNode, Option<u32>) {
    let gid = (n.gid != 0 && n.file_mode & 0o006 != 0o006).then_some(n.gid);
    (
        DeviceNode {
            path: n.container_path.clone(),
            host_path: None,
            kind: Some("c".into()),
            major: Some(n.major.into()),
            minor: Some(n.minor.into()),
            file_mode: Some(n.file_mode),
            permissions: Some("rwm".into()),
            uid: Some(n.uid),
            gid: Some(n.gid),
        },
        gid,
    )
}

/// The `/dev/nvidia-caps/nvidia-cap<N>` node of a capability with its minor ([`Inventory::mig`];
/// `None`: no file or table row for it, an error naming the capability, `cap`).
fn cap_node(
    inv: &Inventory,
    caps_major: u32,
    minor: Option<u32>,
    id: &str,
    cap: impl FnOnce() -> String,
) -> Result<DeviceNode, LegacyError> {
    let minor = minor.ok_or_else(|| LegacyError::MigCapability {
        id: id.to_string(),
        capability: cap(),
        file: inv.roots.proc_root.join("driver/nvidia/capabilities"),
    })?;
    Ok(node(
        inv,
        &["nvidia-caps/nvidia-cap", itoa::Buffer::new().format(minor)].concat(),
        caps_major,
        minor,
    ))
}

fn split(path: &str) -> (&str, &str) {
    path.rsplit_once('/').unwrap_or(("", path))
}

/// `create-symlinks` links (`target::link`) for the mounted libraries: SONAME links
/// (`libcuda.so.1 -> libcuda.so.580.65.06`, which ldconfig would make), the `<name>.so`
/// development links the host has, `libcuda.so` (applications dlopen it) and
/// `libnvidia-opticalflow.so` always, and `libGLX_indirect.so.0` (NVIDIA's `pkg/nvcdi`,
/// `internal/discover/symlinks.go`).
/// The `--link` arguments for `libs`: SONAME links, development links (those the host has,
/// `dev_links`), GLX's indirect link.
fn library_links(
    libs: &[DriverLibrary],
    driver_version: &str,
    dev_links: &[String],
) -> Vec<String> {
    let mut links: Vec<(String, String)> = Vec::new();
    let mut add = |target: String, link: String| {
        if !links.iter().any(|(_, l)| *l == link) {
            links.push((target, link));
        }
    };
    let suffix = format!(".so.{driver_version}");
    for l in libs {
        let (dir, file) = split(&l.file.container_path);
        if l.soname != file {
            add(file.to_string(), format!("{dir}/{}", l.soname));
        }
        // A library not named by the driver version has no development link to look for.
        let Some((stem, dev_link)) = dev_link_of(l, &suffix) else {
            continue;
        };
        if dev_link_always(l, stem) || dev_links.contains(&dev_link) {
            add(l.soname.clone(), dev_link);
        }
        if stem == "libGLX_nvidia" {
            add(file.to_string(), format!("{dir}/libGLX_indirect.so.0"));
        }
    }
    links
        .into_iter()
        .map(|(t, l)| format!("{t}::{l}"))
        .collect()
}

/// A legacy request resolved: the GPUs it selected and its edits grouped by cause, in the
/// order they are applied (`create` applies them as one list, [`crate::edits::apply_all`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resolved {
    /// The selected GPUs, then the parents of selected MIG devices.
    pub gpus: Vec<Gpu>,
    /// One group per GPU (its node, and the capability nodes of its selected MIG devices), then
    /// one [`Cause::Driver`] group with what any selection brings.
    pub groups: Vec<EditGroup>,
    /// The host paths of the mounts in `groups` known not to be directories: the driver's
    /// files and sockets, each found as one (or kept while its directory is unchanged, so still
    /// one). `create`'s mount check need not `stat` them again.
    pub not_dirs: Vec<String>,
}

/// Resolves a legacy request against the host's inventory, reading nothing: `nvml` gives
/// the NVML inventory, called only for MIG ids that need it. The steps: select GPUs and MIG
/// devices, their nodes (one group per GPU), then what any selection brings (control nodes,
/// MIG config/monitor, IMEX channels, driver files, MPS, hooks).
pub fn resolve(
    request: &Request,
    inv: &Inventory,
    settings: &Settings,
    nvml: &mut NvmlInventory<'_>,
) -> Result<Resolved, LegacyError> {
    let Selected { gpus, migs, whole } = select(request, inv, nvml)?;
    let graphics = brings(&request.capabilities, DRM_BROUGHT_BY);
    let mut drm_links = Vec::new();
    let mut groups: Vec<EditGroup> = Vec::with_capacity(gpus.len() + 1);
    for g in &gpus {
        let mut edits = ContainerEdits {
            device_nodes: vec![gpu_node(inv, g)],
            ..Default::default()
        };
        // A GPU selected whole: its DRM nodes with graphics; the parent of MIG devices only:
        // none ([`device_nodes`]).
        if whole.contains(&g.minor) {
            let device = GpuDevice::Gpu {
                minor: g.minor,
                bus_id: &g.bus_id,
            };
            let drm = device_nodes(inv, device, graphics).drm;
            for (node, gid) in drm.iter().map(drm_node) {
                edits.device_nodes.push(node);
                if let Some(g) = gid.filter(|g| !edits.additional_gids.contains(g)) {
                    edits.additional_gids.push(g);
                }
            }
            drm_links.extend(inv.drm_by_path_links(&drm));
        }
        groups.push(EditGroup {
            cause: Cause::Gpu(g.clone()),
            edits,
        });
    }
    let mut edits = ContainerEdits {
        device_nodes: control_nodes(inv),
        ..Default::default()
    };
    mig_nodes(request, inv, &migs, &mut groups, &mut edits)?;
    imex_nodes(request, inv, &mut edits)?;

    let mut files = driver_files(inv, &request.capabilities)?;
    files.links.extend(drm_links);
    let not_dirs = files.mounts.iter().map(|m| m.host_path.clone()).collect();
    edits.mounts.extend(files.mounts);

    // MPS: a host daemon's clients find it through its pipe directory, at the same path
    // (libnvidia-container mounts `/tmp/nvidia-mps` for compute containers the same way).
    if let Some(mps) = inv
        .mps_pipe_directory
        .as_deref()
        .filter(|_| request.capabilities.compute)
    {
        let dir = mps.to_string_lossy().into_owned();
        edits.mounts.push(bind(mps, &dir, IPC_MOUNT_OPTIONS));
        edits.env.push(format!("{MPS_PIPE_ENV}={dir}"));
    }

    let plan = HookPlan {
        libs: &files.libs,
        dev_links: &files.dev_links,
        links: files.links,
        cuda_compat: request.capabilities.compute,
        application_profile: graphics,
        host_params: Some(inv.roots.proc_root.join("driver/nvidia/params")),
        bundle: settings.bundle.as_deref(),
    };
    edits.hooks.extend(container_hooks(
        &plan,
        &inv.driver_version,
        &settings.hook_path,
    ));
    if settings.sandbox {
        sandbox::confine(&mut edits, &files.libs);
    }
    groups.push(EditGroup {
        cause: Cause::Driver,
        edits,
    });
    Ok(Resolved {
        gpus,
        groups,
        not_dirs,
    })
}

/// What [`resolve`] needs read of the host for `request`: the driver files of its
/// capabilities, and the MIG and IMEX parts only when it can use them.
pub fn scope(request: &Request) -> Scope {
    let named = |v: &VisibleDevices| matches!(v, VisibleDevices::All | VisibleDevices::List(_));
    let mig_ids = match &request.devices {
        VisibleDevices::All => true,
        VisibleDevices::List(ids) => ids.iter().any(|id| parse_mig_id(id).is_some()),
        _ => false,
    };
    Scope {
        capabilities: request.capabilities,
        mig: mig_ids || named(&request.mig_config) || named(&request.mig_monitor),
        imex: !request.imex_channels.is_empty(),
    }
}

/// The MIG devices a request's list names, as (GPU minor, GPU instance, compute instance),
/// mapped through `nvml` when an id needs it (the same answer [`resolve`] then maps them
/// with, so `nvml` should keep it).
pub fn named_mig_devices(
    request: &Request,
    gpus: &[Gpu],
    nvml: &mut NvmlInventory<'_>,
) -> Result<Vec<MigKey>, LegacyError> {
    let (_, mig_ids) = split_mig_ids(&request.devices);
    let migs = select_migs(&mig_ids, gpus, nvml)?;
    Ok(migs
        .iter()
        .map(|m| (m.parent.minor, m.gpu_instance, m.compute_instance))
        .collect())
}

/// What a request selects.
struct Selected {
    /// The GPUs it names, then the parents of its MIG devices.
    gpus: Vec<Gpu>,
    migs: Vec<MigDevice>,
    /// The minors of the GPUs it gets whole: those it names, or under `all` those without MIG
    /// devices (a MIG-enabled GPU is served through its MIG devices, as in the `all` device of
    /// `nvshim cdi generate`).
    whole: Vec<u32>,
}

/// The GPUs and MIG devices a request selects.
fn select(
    request: &Request,
    inv: &Inventory,
    nvml: &mut NvmlInventory<'_>,
) -> Result<Selected, LegacyError> {
    let all_gpus = &inv.gpus;
    if matches!(
        request.devices,
        VisibleDevices::All | VisibleDevices::List(_)
    ) && all_gpus.is_empty()
    {
        return Err(LegacyError::NoGpus {
            dir: inv
                .roots
                .proc_root
                .join("driver/nvidia/gpus")
                .display()
                .to_string(),
        });
    }
    let (gpu_ids, mig_ids) = split_mig_ids(&request.devices);
    let mut gpus = select_gpus(&gpu_ids, all_gpus)?;
    let mut migs = select_migs(&mig_ids, all_gpus, nvml)?;
    let mut whole: Vec<u32> = gpus.iter().map(|g| g.minor).collect();
    if request.devices == VisibleDevices::All {
        migs.extend(all_migs(inv, all_gpus));
        whole.retain(|minor| !migs.iter().any(|m| m.parent.minor == *minor));
    }
    for m in &migs {
        if !gpus.iter().any(|g| g.minor == m.parent.minor) {
            gpus.push(m.parent.clone());
        }
    }
    Ok(Selected { gpus, migs, whole })
}

fn devices_path(inv: &Inventory) -> PathBuf {
    inv.roots.proc_root.join("devices")
}

/// MIG: each device's two capability nodes, in its GPU's group; `config` and `monitor` (which
/// `request::env_policy` gives privileged containers only), in the driver's.
fn mig_nodes(
    request: &Request,
    inv: &Inventory,
    migs: &[MigDevice],
    groups: &mut [EditGroup],
    edits: &mut ContainerEdits,
) -> Result<(), LegacyError> {
    let wants_mig_caps = [&request.mig_config, &request.mig_monitor]
        .iter()
        .any(|v| matches!(v, VisibleDevices::All | VisibleDevices::List(_)));
    if migs.is_empty() && !wants_mig_caps {
        return Ok(());
    }
    let caps_major = inv.majors.nvidia_caps.ok_or_else(|| LegacyError::NoMajor {
        what: "MIG".into(),
        name: "nvidia-caps",
        path: devices_path(inv),
    })?;
    for m in migs {
        let group = groups
            .iter_mut()
            .find(|g| matches!(&g.cause, Cause::Gpu(p) if p.minor == m.parent.minor))
            .expect("every MIG device's parent is selected");
        // Its two capabilities, as [`device_nodes`] names them: the minors the driver gave them.
        let found = inv.mig_instance(m.parent.minor, m.gpu_instance, m.compute_instance);
        for k in 0..2 {
            let minor = found.and_then(|f| f.minors[k]);
            let cap = || mig_capabilities(m)[k].clone();
            group
                .edits
                .device_nodes
                .push(cap_node(inv, caps_major, minor, &m.id, cap)?);
        }
    }
    for (var, value, capability, minor) in [
        (
            MIG_CONFIG_DEVICES,
            &request.mig_config,
            "config",
            inv.mig_config_minor,
        ),
        (
            MIG_MONITOR_DEVICES,
            &request.mig_monitor,
            "monitor",
            inv.mig_monitor_minor,
        ),
    ] {
        if !matches!(value, VisibleDevices::All | VisibleDevices::List(_)) {
            continue;
        }
        // The capability is global; listed GPUs only have to exist (libnvidia-container
        // accepts `all` or a device list for `--mig-config` / `--mig-monitor`).
        select_gpus(value, &inv.gpus)?;
        let n = cap_node(inv, caps_major, minor, var, || capability.to_string())?;
        if !edits.device_nodes.iter().any(|d| d.path == n.path) {
            edits.device_nodes.push(n);
        }
    }
    Ok(())
}

/// IMEX channels: the node must exist (NVIDIA's JIT-CDI checks the same path).
fn imex_nodes(
    request: &Request,
    inv: &Inventory,
    edits: &mut ContainerEdits,
) -> Result<(), LegacyError> {
    if request.imex_channels.is_empty() {
        return Ok(());
    }
    let major = inv
        .majors
        .nvidia_caps_imex_channels
        .ok_or_else(|| LegacyError::NoMajor {
            what: format!("IMEX channels {:?}", request.imex_channels),
            name: "nvidia-caps-imex-channels",
            path: devices_path(inv),
        })?;
    for &channel in &request.imex_channels {
        let name = format!("nvidia-caps-imex-channels/channel{channel}");
        if inv.node(&name).is_none() {
            return Err(LegacyError::UnknownImexChannel {
                channel,
                path: inv.roots.dev_root.join("dev").join(&name),
            });
        }
        edits.device_nodes.push(node(inv, &name, major, channel));
    }
    Ok(())
}

fn bind(host_path: &Path, container_path: &str, options: &[&str]) -> Mount {
    Mount {
        host_path: host_path.to_string_lossy().into_owned(),
        container_path: container_path.to_string(),
        kind: Some("bind".into()),
        options: options.iter().map(|s| s.to_string()).collect(),
    }
}

/// What the driver gives a container for its capabilities ([`crate::nvidia`]'s tables).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct DriverFiles {
    /// Libraries (64-bit, and 32-bit with `compat32`), executables, data files, X.Org modules,
    /// firmware and the daemons' sockets.
    pub mounts: Vec<Mount>,
    /// The mounted libraries, for the hooks.
    pub libs: Vec<DriverLibrary>,
    /// The development links (`<stem>.so`, symlinks) the host has beside `libs`: their
    /// container paths, for the hooks ([`HookPlan::dev_links`]).
    pub dev_links: Vec<String>,
    /// Links the `create-symlinks` hook makes besides the libraries' own: (target, link).
    pub links: Vec<(String, String)>,
}

/// The library rule a found library is one of: the one whose `<stem>.so.` starts its SONAME.
fn rule_of(l: &DriverLibrary) -> Option<&'static nvidia::Library> {
    nvidia::LIBRARIES.iter().find(|r| {
        l.soname
            .strip_prefix(r.stem)
            .is_some_and(|rest| rest.starts_with(".so."))
    })
}

/// The driver's files `caps` brings, out of those the inventory holds (a device's DRM nodes
/// are [`device_nodes`]'). `caps` must be within what the inventory was read for.
pub fn driver_files(inv: &Inventory, caps: &Capabilities) -> Result<DriverFiles, LegacyError> {
    if !inv.scope.covers(caps) {
        return Err(LegacyError::NotRead {
            capabilities: caps.names().join(","),
            read: inv.scope.capabilities.names().join(","),
        });
    }
    let set = &inv.files;
    let driver_version = &inv.driver_version;
    // Read for exactly these capabilities (a create's inventory): all of it, as read.
    let exact = *caps == inv.scope.capabilities;
    let brought = |l: &&DriverLibrary, bits32: bool| {
        exact
            || rule_of(l).is_some_and(|r| {
                brings(caps, r.brought_by) && (!bits32 || (caps.compat32 && r.has_32bit))
            })
    };
    let libs64: Vec<DriverLibrary> = set
        .libs64
        .iter()
        .filter(|l| brought(l, false))
        .cloned()
        .collect();
    // The 64-bit libraries' directories: where GBM's backend link goes.
    let n64 = libs64.len();
    let mut out = DriverFiles {
        libs: libs64,
        ..Default::default()
    };
    out.libs
        .extend(set.libs32.iter().filter(|l| brought(l, true)).cloned());
    if exact {
        out.dev_links.clone_from(&set.dev_links);
    } else {
        let suffix = format!(".so.{driver_version}");
        for l in &out.libs {
            if let Some((stem, dev_link)) = dev_link_of(l, &suffix) {
                if !dev_link_always(l, stem) && set.dev_links.contains(&dev_link) {
                    out.dev_links.push(dev_link);
                }
            }
        }
    }
    let mut files: Vec<HostFile> = out.libs.iter().map(|l| l.file.clone()).collect();
    let executables = nvidia::executables_for(caps);
    files.extend(
        set.binaries
            .iter()
            .filter(|f| {
                let name = f.container_path.rsplit('/').next().unwrap_or_default();
                exact || executables.contains(&name)
            })
            .cloned(),
    );
    files.extend(
        set.data_files
            .iter()
            .filter(|(i, _)| brings(caps, nvidia::DATA_FILES[*i].brought_by))
            .map(|(_, f)| f.clone()),
    );
    if brings(caps, nvidia::XORG_BROUGHT_BY) {
        for m in &set.xorg_modules {
            // X.Org loads `libglxserver_nvidia.so`; the driver installs that link beside it.
            if let Some(dir) = m
                .container_path
                .strip_suffix(&format!("/libglxserver_nvidia.so.{driver_version}"))
            {
                out.links.push((
                    format!("libglxserver_nvidia.so.{driver_version}"),
                    format!("{dir}/libglxserver_nvidia.so"),
                ));
            }
        }
        files.extend(set.xorg_modules.iter().cloned());
    }
    if brings(caps, DRM_BROUGHT_BY) {
        // GBM finds the driver's backend as `gbm/nvidia-drm_gbm.so`, a link to the allocator.
        for dir in &library_dirs(&out.libs[..n64]) {
            if out.libs.iter().any(|l| {
                l.soname == "libnvidia-allocator.so.1"
                    && split(&l.file.container_path).0 == dir.as_str()
            }) {
                out.links.push((
                    "../libnvidia-allocator.so.1".into(),
                    format!("{dir}/gbm/nvidia-drm_gbm.so"),
                ));
            }
        }
    }
    if brings(caps, nvidia::FIRMWARE_BROUGHT_BY) {
        files.extend(set.firmware.iter().cloned());
    }
    for f in &files {
        out.mounts
            .push(bind(&f.host_path, &f.container_path, MOUNT_OPTIONS));
    }
    // The daemons' sockets.
    if brings(caps, nvidia::SOCKETS_BROUGHT_BY) {
        for f in set
            .ipc
            .iter()
            .filter(|f| f.container_path.ends_with("/socket"))
        {
            out.mounts
                .push(bind(&f.host_path, &f.container_path, IPC_MOUNT_OPTIONS));
        }
    }
    Ok(out)
}

/// What the hooks of a GPU container do.
#[derive(Debug, Clone)]
pub struct HookPlan<'a> {
    /// The mounted libraries: their SONAME and development links, and their folders for the
    /// ld.so.cache.
    pub libs: &'a [DriverLibrary],
    /// The development links of `libs` the host has ([`DriverFiles::dev_links`]).
    pub dev_links: &'a [String],
    /// Further links: (target, link).
    pub links: Vec<(String, String)>,
    /// `enable-cuda-compat`: the image's CUDA forward-compatibility libraries, when newer than
    /// the host driver.
    pub cuda_compat: bool,
    /// `update-application-profile`: EGL and Vulkan see only the container's GPUs.
    pub application_profile: bool,
    /// `disable-device-node-modification`, reading the host's params file here.
    pub host_params: Option<PathBuf>,
    /// The container's bundle, when known (a create, not a CDI spec for the node): passed as
    /// `--bundle`, so the hook does not wait for the OCI state runc writes late (the hook
    /// crate's `cli::Fixups::bundle` says how late).
    pub bundle: Option<&'a Path>,
}

/// The container fix-ups NVIDIA runs as separate hooks (`create-symlinks`, `enable-cuda-compat`,
/// `update-ldcache`, `disable-device-node-modification`, `update-application-profile`), as one
/// `createContainer` hook, `nvshim-hook fixups`, which does them in that order in one process:
/// one exec and one open of the container's root instead of five (each exec of a hook costs
/// about a millisecond under runc). It runs `hook_path` with an explicit minimal environment,
/// never the container's (CVE-2025-23266). Legacy requests and `nvshim cdi generate` both use
/// it; nothing when there is nothing to do.
pub fn container_hooks(plan: &HookPlan<'_>, driver_version: &str, hook_path: &Path) -> Vec<Hook> {
    let mut args = vec!["nvshim-hook".to_string(), "fixups".to_string()];
    let mut links = library_links(plan.libs, driver_version, plan.dev_links);
    for (target, link) in &plan.links {
        let l = format!("{target}::{link}");
        if !links.contains(&l) {
            links.push(l);
        }
    }
    for l in links {
        args.push("--link".into());
        args.push(l);
    }
    if plan.cuda_compat && !plan.libs.is_empty() {
        args.push("--host-driver-version".into());
        args.push(driver_version.into());
    }
    let mut folders: Vec<&str> = Vec::new();
    for l in plan.libs {
        let (dir, _) = split(&l.file.container_path);
        let dir = if dir.is_empty() { "/" } else { dir };
        if !folders.contains(&dir) {
            folders.push(dir);
        }
    }
    for f in folders {
        args.push("--folder".into());
        args.push(f.into());
    }
    if let Some(params) = &plan.host_params {
        args.push("--disable-device-node-modification".into());
        // The hook reads /proc/driver/nvidia/params unless told otherwise (a proc-root other
        // than the host's /proc).
        if params != Path::new("/proc/driver/nvidia/params") {
            args.push(format!("--host-params={}", params.display()));
        }
    }
    if plan.application_profile {
        args.push("--update-application-profile".into());
    }
    if args.len() == 2 {
        return Vec::new();
    }
    let mut hook = Hook {
        hook_name: "createContainer".into(),
        path: hook_path.to_string_lossy().into_owned(),
        args,
        env: Some(vec![HOOK_ENV.to_string()]),
        timeout: None,
    };
    if let Some(bundle) = plan.bundle {
        name_bundle(&mut hook, hook_path, bundle);
    }
    vec![hook]
}

/// Names `bundle` in `hook` when it is nvshim's own fix-ups hook (`hook_path ... fixups`)
/// without a bundle: the hook then finds the container from it instead of waiting for the OCI
/// state ([`HookPlan::bundle`]). For the hooks [`container_hooks`] writes, and those of a CDI
/// spec nvshim generated when nvshim-runtime applies it.
pub fn name_bundle(hook: &mut Hook, hook_path: &Path, bundle: &Path) {
    let given = |hook: &Hook, flag: &str| {
        hook.args
            .iter()
            .any(|a| a == flag || a.strip_prefix(flag).is_some_and(|v| v.starts_with('=')))
    };
    let ours = Path::new(&hook.path) == hook_path
        && hook.args.get(1).map(String::as_str) == Some("fixups");
    if !ours || given(hook, "--bundle") {
        return;
    }
    hook.args.push("--bundle".into());
    hook.args.push(bundle.to_string_lossy().into_owned());
}

/// Whether `spec` already runs nvshim's fix-ups hook (`hook_path ... fixups`) without a
/// bundle: what nvshim-nri puts into a container it adjusted (an NRI plugin never sees the
/// bundle). nvshim-runtime on such a container (a node running both the plugin and the
/// `nvidia` runtime class) then leaves its own hook unnamed too: the same hook, which
/// `edits::apply` does not add a second time.
pub fn unnamed_fixups_in(spec: &serde_json::Value, hook_path: &Path) -> bool {
    let hooks = spec
        .pointer("/hooks/createContainer")
        .and_then(serde_json::Value::as_array);
    hooks.into_iter().flatten().any(|h| {
        let args: Vec<&str> = (h.get("args").and_then(serde_json::Value::as_array))
            .into_iter()
            .flatten()
            .filter_map(serde_json::Value::as_str)
            .collect();
        h.get("path").and_then(serde_json::Value::as_str) == hook_path.to_str()
            && args.get(1) == Some(&"fixups")
            && !args.contains(&"--bundle")
    })
}

/// Merges nvshim's fix-ups hooks (`hook_path ... fixups`, as [`container_hooks`] writes them)
/// among `groups` into one: those that only make links (a generated spec's per-device hooks
/// for the DRM `by-path` links) give their links to the first other one, so a container runs
/// one hook process however many devices of nvshim's spec it gets, as a legacy request does.
/// Hooks of another binary, subcommand, environment or timeout are left as they are.
pub fn merge_fixups(groups: &mut [EditGroup], hook_path: &Path) {
    let ours = |h: &Hook| {
        h.hook_name == "createContainer"
            && Path::new(&h.path) == hook_path
            && h.args.get(1).map(String::as_str) == Some("fixups")
    };
    let links_only = |h: &Hook| {
        let rest = &h.args[2..];
        rest.len() % 2 == 0 && rest.chunks(2).all(|pair| pair[0] == "--link")
    };
    let hooks = || {
        groups
            .iter()
            .flat_map(|g| &g.edits.hooks)
            .filter(|h| ours(h))
    };
    // The hook that keeps the others' links: the first that does more than links, else the
    // first.
    let Some(keeper) = hooks()
        .find(|h| !links_only(h))
        .or_else(|| hooks().next())
        .cloned()
    else {
        return;
    };
    let mergeable = |h: &Hook| {
        ours(h)
            && links_only(h)
            && *h != keeper
            && (&h.env, h.timeout) == (&keeper.env, keeper.timeout)
    };
    let mut links: Vec<String> = Vec::new();
    for g in groups.iter_mut() {
        g.edits.hooks.retain(|h| {
            if !mergeable(h) {
                return true;
            }
            for pair in h.args[2..].chunks(2) {
                if !links.contains(&pair[1]) {
                    links.push(pair[1].clone());
                }
            }
            false
        });
    }
    if links.is_empty() {
        return;
    }
    let Some(kept) = groups
        .iter_mut()
        .flat_map(|g| &mut g.edits.hooks)
        .find(|h| **h == keeper)
    else {
        return;
    };
    for l in links {
        if !kept.args.windows(2).any(|w| w[0] == "--link" && w[1] == l) {
            kept.args.push("--link".into());
            kept.args.push(l);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::{DeviceMajors, Host};

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
    fn mig_id_forms() {
        assert_eq!(parse_mig_id("2:1"), Some(MigId::Index { gpu: 2, mig: 1 }));
        assert_eq!(
            parse_mig_id("MIG-8e2c0d44-0000-4000-8000-000000000001"),
            Some(MigId::Uuid(
                "MIG-8e2c0d44-0000-4000-8000-000000000001".into()
            ))
        );
        assert_eq!(
            parse_mig_id("MIG-GPU-aaaa/3/0"),
            Some(MigId::Path {
                gpu_uuid: "GPU-aaaa".into(),
                gpu_instance: 3,
                compute_instance: 0
            })
        );
        for gpu_id in ["0", "GPU-aaaa", "0000:1b:00.0", "1b:00.0"] {
            assert_eq!(parse_mig_id(gpu_id), None, "{gpu_id}");
        }
        // `G:M` shaped but not numbers: not a GPU id either; unknown when looked up.
        assert_eq!(parse_mig_id("a:b"), None);
    }

    fn inventory() -> Vec<GpuInfo> {
        use crate::host::nvml::MigInfo;
        let mig = |index, gi, ci| MigInfo {
            index,
            uuid: format!("MIG-{index}{gi}{ci}"),
            gpu_instance: gi,
            compute_instance: ci,
            name: "1g.10gb".into(),
        };
        vec![
            GpuInfo {
                index: 0,
                minor: 1,
                uuid: "GPU-aaaa".into(),
                name: "H100".into(),
                bus_id: "0000:1b:00.0".into(),
                mig_enabled: true,
                migs: vec![mig(0, 1, 0), mig(1, 2, 0)],
                arch: Some("9.0".into()),
                brand: Some("tesla".into()),
                persistence_mode: Some(true),
            },
            GpuInfo {
                index: 1,
                minor: 0,
                uuid: "GPU-bbbb".into(),
                name: "H100".into(),
                bus_id: "0000:3b:00.0".into(),
                mig_enabled: false,
                migs: Vec::new(),
                arch: Some("9.0".into()),
                brand: Some("tesla".into()),
                persistence_mode: Some(true),
            },
        ]
    }

    #[test]
    fn nvml_only_for_mig_ids_that_need_it() {
        let calls = std::cell::Cell::new(0);
        let asked = std::cell::RefCell::new(Vec::new());
        let mut loader = |lookups: &[Lookup<'_>]| {
            calls.set(calls.get() + 1);
            asked.replace(lookups.iter().map(|l| format!("{l:?}")).collect());
            Ok(inventory())
        };
        // GPU ids and the explicit MIG-GPU form: no NVML.
        let d = VisibleDevices::List(vec!["0".into(), "MIG-GPU-bbbb/4/1".into()]);
        let (gpu_ids, migs) = split_mig_ids(&d);
        assert_eq!(gpu_ids, VisibleDevices::List(vec!["0".into()]));
        let got = select_migs(&migs, &gpus(), &mut loader).unwrap();
        assert_eq!(
            (
                got[0].parent.minor,
                got[0].gpu_instance,
                got[0].compute_instance
            ),
            (0, 4, 1)
        );
        let (_, none) = split_mig_ids(&VisibleDevices::All);
        assert!(select_migs(&none, &gpus(), &mut loader).unwrap().is_empty());
        assert_eq!(calls.get(), 0);

        // Index and UUID: one NVML load for both, de-duplicated by instance.
        let d = VisibleDevices::List(vec!["0:1".into(), "MIG-120".into(), "mig-010".into()]);
        let (_, migs) = split_mig_ids(&d);
        let got = select_migs(&migs, &gpus(), &mut loader).unwrap();
        let ids: Vec<(u32, u32, u32)> = got
            .iter()
            .map(|m| (m.parent.minor, m.gpu_instance, m.compute_instance))
            .collect();
        assert_eq!(ids, [(1, 2, 0), (1, 1, 0)]);
        assert_eq!(calls.get(), 1);
        // Told what it is for (a cached answer is checked for those GPUs: src/host/nvml/cache.rs).
        assert_eq!(
            *asked.borrow(),
            [
                "MigIndex { gpu: 0 }",
                "MigUuid(\"MIG-120\")",
                "MigUuid(\"mig-010\")"
            ]
        );
        assert_eq!(
            mig_capabilities(&got[0]),
            [
                "gpu1/gi2/access".to_string(),
                "gpu1/gi2/ci0/access".to_string()
            ]
        );
    }

    #[test]
    fn unknown_mig_devices_say_what_exists() {
        let mut loader = |_: &[Lookup<'_>]| Ok(inventory());
        for id in ["0:7", "1:0", "5:0", "MIG-nope"] {
            let (_, migs) = split_mig_ids(&VisibleDevices::List(vec![id.into()]));
            let err = select_migs(&migs, &gpus(), &mut loader)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(&format!("{id:?}")) && err.contains("0:1 (MIG-120)"),
                "{err}"
            );
        }
        let (_, migs) = split_mig_ids(&VisibleDevices::List(vec!["MIG-GPU-cccc/1/0".into()]));
        let err = select_migs(&migs, &gpus(), &mut loader)
            .unwrap_err()
            .to_string();
        assert!(err.contains("GPU-aaaa"), "{err}");
        let mut broken =
            |_: &[Lookup<'_>]| Err(NvmlDiscoveryError::NotInCache(PathBuf::from("/drv")));
        let (_, migs) = split_mig_ids(&VisibleDevices::List(vec!["0:0".into()]));
        let err = select_migs(&migs, &gpus(), &mut broken)
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"0:0\"") && err.contains("/drv"), "{err}");
    }

    /// A driver root with a few files of each kind, built without root (no device nodes): the
    /// 580 driver's names, in the Debian multiarch layout.
    pub(super) fn driver_root() -> (tempfile::TempDir, Host) {
        use nvshim_hook::ldcache::{serialize, CacheEntry, FLAG_ELF_LIBC6, FLAG_X8664_LIB64};
        use std::os::unix::fs::symlink;
        const V: &str = "580.95.05";
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let file = |p: &str| {
            let p = root.join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, b"stub").unwrap();
        };
        let mut entries = Vec::new();
        for (dir, flags) in [
            (
                "usr/lib/x86_64-linux-gnu",
                FLAG_ELF_LIBC6 | FLAG_X8664_LIB64,
            ),
            ("usr/lib/i386-linux-gnu", FLAG_ELF_LIBC6),
        ] {
            for (stem, soname) in [
                ("libcuda", "libcuda.so.1"),
                ("libnvidia-ml", "libnvidia-ml.so.1"),
                ("libGLX_nvidia", "libGLX_nvidia.so.0"),
                ("libnvidia-allocator", "libnvidia-allocator.so.1"),
            ] {
                file(&format!("{dir}/{stem}.so.{V}"));
                symlink(
                    format!("{stem}.so.{V}"),
                    root.join(format!("{dir}/{soname}")),
                )
                .unwrap();
                // A merged-/usr host's ldconfig names the libraries through /lib (it lists
                // /lib/x86_64-linux-gnu first): the mounts must still be the real files.
                let cached = if flags & FLAG_X8664_LIB64 != 0 {
                    format!("/{}/{soname}", dir.trim_start_matches("usr/"))
                } else {
                    format!("/{dir}/{soname}")
                };
                entries.push((flags, soname.to_string(), cached));
            }
            file(&format!("{dir}/vdpau/libvdpau_nvidia.so.{V}"));
            symlink(
                format!("libvdpau_nvidia.so.{V}"),
                root.join(format!("{dir}/vdpau/libvdpau_nvidia.so.1")),
            )
            .unwrap();
        }
        let lib = "usr/lib/x86_64-linux-gnu";
        file(&format!("{lib}/libnvidia-egl-gbm.so.1.1.3"));
        symlink(
            "libnvidia-egl-gbm.so.1.1.3",
            root.join(format!("{lib}/libnvidia-egl-gbm.so.1")),
        )
        .unwrap();
        entries.push((
            FLAG_ELF_LIBC6 | FLAG_X8664_LIB64,
            "libnvidia-egl-gbm.so.1".into(),
            format!("/{lib}/libnvidia-egl-gbm.so.1"),
        ));
        for f in [
            format!("{lib}/nvidia/xorg/nvidia_drv.so"),
            format!("{lib}/nvidia/xorg/libglxserver_nvidia.so.{V}"),
            "usr/share/glvnd/egl_vendor.d/10_nvidia.json".into(),
            "usr/share/vulkan/icd.d/nvidia_icd.json".into(),
            "etc/OpenCL/vendors/nvidia.icd".into(),
            "usr/share/X11/xorg.conf.d/10-nvidia.conf".into(),
            "usr/bin/nvidia-smi".into(),
            "usr/bin/nvidia-xconfig".into(),
            "usr/bin/nvidia-cuda-mps-control".into(),
            format!("usr/lib/firmware/nvidia/{V}/gsp_ga10x.bin"),
        ] {
            file(&f);
        }
        // Merged /usr: /lib is a link to usr/lib.
        symlink("usr/lib", root.join("lib")).unwrap();
        let cache: Vec<CacheEntry> = entries
            .into_iter()
            .map(|(flags, name, path)| CacheEntry {
                flags,
                name: name.into(),
                path: path.into(),
                os_version: 0,
                hwcap: 0,
                hwcaps: None,
                isa_level: 0,
            })
            .collect();
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::fs::write(
            root.join("etc/ld.so.cache"),
            serialize(&cache, &Default::default(), "test"),
        )
        .unwrap();
        std::fs::create_dir_all(root.join("proc")).unwrap();
        let host = Host::new(crate::host::HostRoots {
            driver_root: root.to_path_buf(),
            dev_root: root.to_path_buf(),
            proc_root: root.join("proc"),
        });
        (dir, host)
    }

    /// What each capability brings, resolved against a driver root: a table of (capabilities,
    /// container paths that must be mounted, paths that must not).
    /// The whole legacy resolver, request form by request form, without root: the host is
    /// [`driver_root`]'s files plus the proc files the kernel module writes (two GPUs whose
    /// minors run against their bus order, as on real hosts); no device node exists, so the
    /// nodes take the numbers of `/proc/devices` and the defaults.
    #[test]
    fn resolver_table_without_root() {
        let (dir, host) = driver_root();
        let proc = dir.path().join("proc");
        let write = |p: &str, text: &str| {
            let p = proc.join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        };
        write(
            "driver/nvidia/version",
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  \
             (dvs-builder@U22-I3-AF03-09-1)  Thu Sep 25 01:12:42 UTC 2025\n",
        );
        write(
            "devices",
            "Character devices:\n195 nvidia\n238 nvidia-uvm\n241 nvidia-caps\n\nBlock devices:\n",
        );
        let gpu = |bus: &str, minor: u32, uuid: &str| {
            write(
                &format!("driver/nvidia/gpus/{bus}/information"),
                &format!(
                    "Model: \t\t NVIDIA H100 80GB HBM3\nGPU UUID: \t {uuid}\n\
                     Bus Location: \t {bus}\nDevice Minor: \t {minor}\n"
                ),
            )
        };
        gpu(
            "0000:1b:00.0",
            1,
            "GPU-aaaaaaaa-0000-0000-0000-000000000001",
        );
        gpu(
            "0000:3b:00.0",
            0,
            "GPU-bbbbbbbb-0000-0000-0000-000000000000",
        );
        let v = "580.95.05";
        // The resolver's input is this value; the proc files above are what it is read from.
        let gpu_value = |index: usize, minor: u32, uuid: &str, bus: &str| Gpu {
            index,
            minor,
            uuid: uuid.into(),
            bus_id: bus.into(),
            model: "NVIDIA H100 80GB HBM3".into(),
        };
        let inv = Inventory::of(&host, Scope::ALL, Path::new("")).unwrap();
        let read = (&inv.driver_version, &inv.gpus, &inv.majors);
        let expected = (
            &v.to_string(),
            &vec![
                gpu_value(
                    0,
                    1,
                    "GPU-aaaaaaaa-0000-0000-0000-000000000001",
                    "0000:1b:00.0",
                ),
                gpu_value(
                    1,
                    0,
                    "GPU-bbbbbbbb-0000-0000-0000-000000000000",
                    "0000:3b:00.0",
                ),
            ],
            &DeviceMajors {
                nvidia: 195,
                nvidia_uvm: Some(238),
                nvidia_caps: Some(241),
                nvidia_caps_imex_channels: None,
            },
        );
        assert_eq!(read, expected);
        let lib = "/usr/lib/x86_64-linux-gnu";
        let caps = |c: &str| Capabilities::parse(Some(c)).unwrap();
        // (devices, capabilities) -> GPU minors, then paths that must and must not be there.
        type Case = (
            VisibleDevices,
            &'static str,
            Vec<u32>,
            Vec<String>,
            Vec<String>,
        );
        let cases: Vec<Case> = vec![
            (
                VisibleDevices::List(vec!["0".into()]),
                "utility",
                vec![1],
                vec![
                    "/dev/nvidia1".into(),
                    "/dev/nvidiactl".into(),
                    "/dev/nvidia-uvm".into(),
                    format!("{lib}/libnvidia-ml.so.{v}"),
                    "/usr/bin/nvidia-smi".into(),
                ],
                vec!["/dev/nvidia0".into(), format!("{lib}/libcuda.so.{v}")],
            ),
            (
                VisibleDevices::List(vec!["GPU-bbbbbbbb-0000-0000-0000-000000000000".into()]),
                "compute",
                vec![0],
                vec!["/dev/nvidia0".into(), format!("{lib}/libcuda.so.{v}")],
                vec!["/dev/nvidia1".into(), "/usr/bin/nvidia-smi".into()],
            ),
            (
                VisibleDevices::List(vec!["0000:3b:00.0".into(), "0".into()]),
                "utility,compute",
                vec![0, 1],
                vec!["/dev/nvidia0".into(), "/dev/nvidia1".into()],
                vec![],
            ),
            (
                VisibleDevices::All,
                "utility,compute",
                vec![1, 0],
                vec!["/dev/nvidia0".into(), "/dev/nvidia1".into()],
                vec![],
            ),
            (
                VisibleDevices::NoGpus,
                "utility",
                vec![],
                vec![
                    "/dev/nvidiactl".into(),
                    format!("{lib}/libnvidia-ml.so.{v}"),
                ],
                vec!["/dev/nvidia0".into(), "/dev/nvidia1".into()],
            ),
        ];
        let settings = Settings::new(
            &Config::default(),
            &crate::install::Tools {
                hook: "/usr/bin/nvshim-hook".into(),
                nvml: nvml::NvmlAccess::InProcess,
                cdi: None,
            },
        );
        for (devices, c, minors, present, absent) in cases {
            let request = Request {
                devices: devices.clone(),
                capabilities: caps(c),
                ..Default::default()
            };
            let resolved = resolve(&request, &inv, &settings, &mut |_| {
                panic!("no NVML for {devices:?}")
            })
            .unwrap_or_else(|e| panic!("{devices:?} {c}: {e}"));
            let gpus = &resolved.gpus;
            let mut edits = ContainerEdits::default();
            for g in &resolved.groups {
                edits.append(&g.edits);
            }
            // Grouped at the source: each GPU's own node, then the driver.
            let causes: Vec<Option<u32>> = resolved
                .groups
                .iter()
                .map(|g| match &g.cause {
                    Cause::Gpu(gpu) => Some(gpu.minor),
                    _ => None,
                })
                .collect();
            let mut expected: Vec<Option<u32>> = minors.iter().copied().map(Some).collect();
            expected.push(None);
            assert_eq!(causes, expected, "{devices:?} {c}");
            let got: Vec<u32> = gpus.iter().map(|g| g.minor).collect();
            assert_eq!(got, minors, "{devices:?} {c}");
            let paths: Vec<&str> = edits
                .device_nodes
                .iter()
                .map(|d| d.path.as_str())
                .chain(edits.mounts.iter().map(|m| m.container_path.as_str()))
                .collect();
            for p in &present {
                assert!(
                    paths.contains(&p.as_str()),
                    "{devices:?} {c}: {p} missing from {paths:?}"
                );
            }
            for p in &absent {
                assert!(!paths.contains(&p.as_str()), "{devices:?} {c}: {p} present");
            }
            let gpu_node = |m: u32| {
                edits
                    .device_nodes
                    .iter()
                    .find(|d| d.path == format!("/dev/nvidia{m}"))
                    .map(|d| (d.major, d.minor))
            };
            for m in &minors {
                assert_eq!(gpu_node(*m), Some((Some(195), Some(i64::from(*m)))));
            }
        }

        // A MIG device brings its parent's node and its two capability nodes, grouped under the
        // parent GPU; each capability's minor in its own file, as the kernel module writes it.
        for (cap, minor) in [("gpu0/mig/gi1/access", 12), ("gpu0/mig/gi1/ci0/access", 13)] {
            write(
                &format!("driver/nvidia/capabilities/{cap}"),
                &format!("DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n"),
            );
        }
        let request = Request {
            devices: VisibleDevices::List(vec![
                "0".into(),
                "MIG-GPU-bbbbbbbb-0000-0000-0000-000000000000/1/0".into(),
            ]),
            capabilities: caps("utility"),
            ..Default::default()
        };
        // The capability files are new: read again, as a long-running holder of the inventory
        // would when the driver's MIG devices change.
        let inv = Inventory::of(&host, Scope::ALL, Path::new("")).unwrap();
        let resolved = resolve(&request, &inv, &settings, &mut |_| {
            panic!("no NVML for a MIG-GPU-<uuid>/<gi>/<ci> id")
        })
        .unwrap();
        let groups: Vec<(Option<u32>, Vec<&str>)> = resolved
            .groups
            .iter()
            .map(|g| {
                let minor = match &g.cause {
                    Cause::Gpu(gpu) => Some(gpu.minor),
                    _ => None,
                };
                let nodes = g.edits.device_nodes.iter().map(|d| d.path.as_str());
                (minor, nodes.filter(|p| !p.contains("nvidia-uvm")).collect())
            })
            .collect();
        assert_eq!(
            groups,
            vec![
                (Some(1), vec!["/dev/nvidia1"]),
                (
                    Some(0),
                    vec![
                        "/dev/nvidia0",
                        "/dev/nvidia-caps/nvidia-cap12",
                        "/dev/nvidia-caps/nvidia-cap13"
                    ]
                ),
                (None, vec!["/dev/nvidiactl"]),
            ]
        );
    }

    /// A host as a value, no file behind it: two GPUs (minors against their bus order), the
    /// second with one MIG device, `/dev/nvidia0` group-owned, a compute library with its
    /// SONAME and development link, nvidia-smi, the persistenced socket, one IMEX channel.
    fn hand_inventory() -> Inventory {
        use crate::host::{DeviceMajors, HostRoots};
        let roots = HostRoots {
            driver_root: "/drv".into(),
            dev_root: "/devroot".into(),
            proc_root: "/procroot".into(),
        };
        let file = |path: &str| HostFile {
            host_path: format!("/drv{path}").into(),
            container_path: path.into(),
        };
        let dev = |name: &str, major: u32, minor: u32, mode: u32, gid: u32| {
            let node = HostDeviceNode {
                container_path: format!("/dev/{name}"),
                host_path: format!("/devroot/dev/{name}").into(),
                kind: 'c',
                major,
                minor,
                file_mode: mode,
                uid: 0,
                gid,
            };
            (name.to_string(), node)
        };
        let lib = "/usr/lib/x86_64-linux-gnu";
        Inventory {
            roots,
            scope: Scope {
                capabilities: Capabilities {
                    compute: true,
                    utility: true,
                    ..Default::default()
                },
                mig: true,
                imex: true,
            },
            driver_version: "580.95.05".into(),
            gpus: gpus(),
            majors: DeviceMajors {
                nvidia: 195,
                nvidia_uvm: Some(510),
                nvidia_caps: Some(511),
                nvidia_caps_imex_channels: Some(512),
            },
            nodes: [
                dev("nvidia0", 195, 0, 0o660, 44),
                dev("nvidiactl", 195, 255, 0o666, 0),
                dev("nvidia-caps/nvidia-cap21", 511, 21, 0o444, 0),
                dev("nvidia-caps/nvidia-cap22", 511, 22, 0o444, 0),
                dev("nvidia-caps-imex-channels/channel3", 512, 3, 0o666, 0),
            ]
            .into_iter()
            .collect(),
            drm: Default::default(),
            drm_by_path: Vec::new(),
            mig: vec![MigInstance {
                gpu_minor: 0,
                gpu_instance: 2,
                compute_instance: 0,
                minors: [Some(21), Some(22)],
            }],
            mig_config_minor: None,
            mig_monitor_minor: None,
            imex_channels: vec![3],
            files: crate::host::inventory::DriverFileSet {
                libs64: vec![
                    DriverLibrary {
                        file: file(&format!("{lib}/libcuda.so.580.95.05")),
                        soname: "libcuda.so.1".into(),
                    },
                    DriverLibrary {
                        file: file(&format!("{lib}/libnvidia-ml.so.580.95.05")),
                        soname: "libnvidia-ml.so.1".into(),
                    },
                ],
                dev_links: vec![format!("{lib}/libnvidia-ml.so")],
                binaries: vec![HostFile {
                    host_path: "/drv/usr/bin/nvidia-smi".into(),
                    container_path: "/usr/bin/nvidia-smi".into(),
                }],
                ipc: vec![file("/run/nvidia-persistenced/socket")],
                ..Default::default()
            },
            mps_pipe_directory: Some("/run/mps".into()),
        }
    }

    fn settings() -> Settings {
        Settings::new(
            &Config::default(),
            &crate::install::Tools {
                hook: "/usr/bin/nvshim-hook".into(),
                nvml: nvml::NvmlAccess::InProcess,
                cdi: None,
            },
        )
    }

    fn request(devices: &[&str], caps: &str) -> Request {
        Request {
            devices: VisibleDevices::List(devices.iter().map(|d| d.to_string()).collect()),
            capabilities: Capabilities::parse(Some(caps)).unwrap(),
            ..Default::default()
        }
    }

    /// The resolver from a value: every edit it makes comes from the inventory (no file exists
    /// under `/drv`, `/devroot` or `/procroot`).
    #[test]
    fn resolves_from_a_hand_built_inventory() {
        let inv = hand_inventory();
        let mut no_nvml =
            |_: &[Lookup<'_>]| -> Result<Vec<GpuInfo>, NvmlDiscoveryError> { panic!("no NVML") };
        let r = resolve(
            &request(&["1"], "compute,utility"),
            &inv,
            &settings(),
            &mut no_nvml,
        )
        .unwrap();
        assert_eq!(r.gpus.len(), 1);
        let gpu = &r.groups[0].edits.device_nodes[0];
        // The node's mode and group as found on the host, the numbers the driver's.
        assert_eq!(
            (
                gpu.path.as_str(),
                gpu.major,
                gpu.minor,
                gpu.file_mode,
                gpu.gid
            ),
            ("/dev/nvidia0", Some(195), Some(0), Some(0o660), Some(44))
        );
        let driver = &r.groups[1].edits;
        let nodes: Vec<&str> = driver
            .device_nodes
            .iter()
            .map(|d| d.path.as_str())
            .collect();
        // nvidia-uvm has a major but no node: the defaults; uvm-tools and modeset: absent.
        assert_eq!(nodes, ["/dev/nvidiactl", "/dev/nvidia-uvm"]);
        let mounts: Vec<(&str, &str)> = driver
            .mounts
            .iter()
            .map(|m| (m.host_path.as_str(), m.container_path.as_str()))
            .collect();
        let lib = "/usr/lib/x86_64-linux-gnu";
        assert_eq!(
            mounts,
            [
                (
                    "/drv/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05",
                    "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05"
                ),
                (
                    "/drv/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05",
                    "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05"
                ),
                ("/drv/usr/bin/nvidia-smi", "/usr/bin/nvidia-smi"),
                (
                    "/drv/run/nvidia-persistenced/socket",
                    "/run/nvidia-persistenced/socket"
                ),
                ("/run/mps", "/run/mps"),
            ]
        );
        assert_eq!(driver.env, ["CUDA_MPS_PIPE_DIRECTORY=/run/mps"]);
        let args = &driver.hooks[0].args;
        for link in [
            format!("libcuda.so.580.95.05::{lib}/libcuda.so.1"),
            format!("libcuda.so.1::{lib}/libcuda.so"),
            format!("libnvidia-ml.so.1::{lib}/libnvidia-ml.so"),
        ] {
            assert!(args.contains(&link), "{link} not in {args:?}");
        }
        assert!(args.contains(&"--host-params=/procroot/driver/nvidia/params".to_string()));

        // Utility only: no compute library, no MPS.
        let r = resolve(&request(&["0"], "utility"), &inv, &settings(), &mut no_nvml).unwrap();
        let driver = &r.groups[1].edits;
        assert!(!driver
            .mounts
            .iter()
            .any(|m| m.container_path.contains("libcuda") || m.container_path == "/run/mps"));

        // A MIG device by its path: its parent's node and its two capability nodes.
        let r = resolve(
            &request(&["MIG-GPU-bbbb/2/0"], "utility"),
            &inv,
            &settings(),
            &mut no_nvml,
        )
        .unwrap();
        let nodes: Vec<&str> = r.groups[0]
            .edits
            .device_nodes
            .iter()
            .map(|d| d.path.as_str())
            .collect();
        assert_eq!(
            nodes,
            [
                "/dev/nvidia0",
                "/dev/nvidia-caps/nvidia-cap21",
                "/dev/nvidia-caps/nvidia-cap22"
            ]
        );
        // One the driver does not list: no minor, refused, naming where minors come from.
        let e = resolve(
            &request(&["MIG-GPU-bbbb/3/0"], "utility"),
            &inv,
            &settings(),
            &mut no_nvml,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("/procroot/driver/nvidia/capabilities"), "{e}");

        // IMEX: the channel whose node exists, and a refusal naming the missing one.
        let mut req = request(&["0"], "utility");
        req.imex_channels = vec![3];
        let r = resolve(&req, &inv, &settings(), &mut no_nvml).unwrap();
        assert!(r.groups[1]
            .edits
            .device_nodes
            .iter()
            .any(|d| d.path == "/dev/nvidia-caps-imex-channels/channel3" && d.major == Some(512)));
        req.imex_channels = vec![4];
        let e = resolve(&req, &inv, &settings(), &mut no_nvml)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("/devroot/dev/nvidia-caps-imex-channels/channel4"),
            "{e}"
        );

        // A capability the inventory was not read for: an error, not a container without it.
        let e = resolve(
            &request(&["0"], "graphics"),
            &inv,
            &settings(),
            &mut no_nvml,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("graphics"), "{e}");
    }

    #[test]
    fn the_bundle_is_named_in_our_fixups_hook_only() {
        let hook = |path: &str, args: &[&str]| Hook {
            hook_name: "createContainer".into(),
            path: path.into(),
            args: args.iter().map(|a| a.to_string()).collect(),
            env: None,
            timeout: None,
        };
        let ours = Path::new("/usr/bin/nvshim-hook");
        let bundle = Path::new("/run/containerd/b/1");
        let mut h = hook(
            "/usr/bin/nvshim-hook",
            &["nvshim-hook", "fixups", "--folder", "/l"],
        );
        name_bundle(&mut h, ours, bundle);
        assert_eq!(h.args[4..], ["--bundle", "/run/containerd/b/1"]);
        // Once only (a retried create), and never another binary's or another subcommand.
        let named = h.clone();
        name_bundle(&mut h, ours, bundle);
        assert_eq!(h, named);
        for mut other in [
            hook(
                "/usr/bin/nvidia-cdi-hook",
                &["nvidia-cdi-hook", "update-ldcache"],
            ),
            hook("/usr/bin/nvshim-hook", &["nvshim-hook", "update-ldcache"]),
            hook("/opt/other/nvshim-hook", &["nvshim-hook", "fixups"]),
        ] {
            let before = other.clone();
            name_bundle(&mut other, ours, bundle);
            assert_eq!(other, before);
        }
    }

    /// nvshim-nri's fix-ups hook (no bundle) in the spec: nvshim-runtime then names none and
    /// adds no second one. Its own named hook (a retried create), another binary's or another
    /// subcommand's does not count.
    #[test]
    fn unnamed_fixups_hook_of_an_nri_plugin_is_found() {
        let ours = Path::new("/usr/bin/nvshim-hook");
        let spec = |args: &[&str], path: &str| serde_json::json!({"hooks": {"createContainer": [{"path": path, "args": args}]}});
        let hook = "/usr/bin/nvshim-hook";
        let fixups = ["nvshim-hook", "fixups", "--folder", "/l"];
        assert!(unnamed_fixups_in(&spec(&fixups, hook), ours));
        let named = [&fixups[..], &["--bundle", "/run/b/1"]].concat();
        assert!(!unnamed_fixups_in(&spec(&named, hook), ours));
        assert!(!unnamed_fixups_in(&spec(&fixups, "/opt/nvshim-hook"), ours));
        let other = ["nvshim-hook", "update-ldcache"];
        assert!(!unnamed_fixups_in(&spec(&other, hook), ours));
        assert!(!unnamed_fixups_in(&serde_json::json!({}), ours));
    }

    /// A generated spec's per-device link hooks join the spec's own fix-ups hook, in whichever
    /// group it is; another binary's, another subcommand's and one with another environment
    /// stay.
    #[test]
    fn link_only_fixups_hooks_merge_into_one() {
        let ours = Path::new("/usr/bin/nvshim-hook");
        let hook = |args: &[&str]| Hook {
            hook_name: "createContainer".into(),
            path: ours.to_string_lossy().into_owned(),
            args: ["nvshim-hook", "fixups"]
                .iter()
                .chain(args)
                .map(|a| a.to_string())
                .collect(),
            env: Some(vec![HOOK_ENV.to_string()]),
            timeout: None,
        };
        let group = |hooks: Vec<Hook>| EditGroup {
            cause: Cause::Driver,
            edits: ContainerEdits {
                hooks,
                ..Default::default()
            },
        };
        let card1 = ["--link", "../card1::/dev/dri/by-path/pci-a-card"];
        let card2 = ["--link", "../card2::/dev/dri/by-path/pci-b-card"];
        let global = hook(&["--link", "libcuda.so.1::/l/libcuda.so", "--folder", "/l"]);
        let mut other_env = hook(&card2);
        other_env.env = None;
        let nvidia = Hook {
            path: "/usr/bin/nvidia-cdi-hook".into(),
            ..hook(&card2)
        };
        let mut groups = vec![
            group(vec![hook(&card1)]),
            group(vec![hook(&card2), nvidia.clone()]),
            group(vec![global.clone(), hook(&card1)]),
            group(vec![other_env.clone()]),
        ];
        merge_fixups(&mut groups, ours);
        let mut want = global.clone();
        want.args
            .extend(card1.iter().chain(&card2).map(|a| a.to_string()));
        let hooks: Vec<&Hook> = groups.iter().flat_map(|g| &g.edits.hooks).collect();
        assert_eq!(hooks, [&nvidia, &want, &other_env]);
        // Link hooks alone: the first keeps them all.
        let mut groups = vec![group(vec![hook(&card1)]), group(vec![hook(&card2)])];
        merge_fixups(&mut groups, ours);
        let hooks: Vec<&Hook> = groups.iter().flat_map(|g| &g.edits.hooks).collect();
        assert_eq!(hooks, [&hook(&[card1, card2].concat())]);
    }

    /// An inventory of no GPU, built by hand around the driver files of `caps`.
    fn inventory_of_files(host: &Host, scope: Scope) -> Inventory {
        let v = "580.95.05";
        Inventory {
            roots: host.roots().clone(),
            scope,
            driver_version: v.into(),
            gpus: Vec::new(),
            majors: DeviceMajors::default(),
            nodes: Default::default(),
            drm: Default::default(),
            drm_by_path: Vec::new(),
            mig: Vec::new(),
            mig_config_minor: None,
            mig_monitor_minor: None,
            imex_channels: Vec::new(),
            files: crate::host::inventory::read_driver_files(host, &scope.capabilities, v).unwrap(),
            mps_pipe_directory: None,
        }
    }

    /// The driver files of `caps`, from an inventory read for `caps` (as `create` reads it):
    /// the same as those picked out of an inventory read for every capability (as a process
    /// holding one picks them).
    fn files_of(host: &Host, caps: Capabilities) -> DriverFiles {
        let scope = Scope {
            capabilities: caps,
            ..Scope::ALL
        };
        let read_for_caps = driver_files(&inventory_of_files(host, scope), &caps).unwrap();
        let picked = driver_files(&inventory_of_files(host, Scope::ALL), &caps).unwrap();
        assert_eq!(read_for_caps, picked, "{caps:?}");
        read_for_caps
    }

    #[test]
    fn driver_files_per_capability() {
        let (_dir, host) = driver_root();
        let lib = "/usr/lib/x86_64-linux-gnu";
        let lib32 = "/usr/lib/i386-linux-gnu";
        let v = "580.95.05";
        let fw = format!("/lib/firmware/nvidia/{v}/gsp_ga10x.bin");
        let cases: Vec<(&str, Vec<String>, Vec<String>)> = vec![
            (
                "utility",
                vec![
                    format!("{lib}/libnvidia-ml.so.{v}"),
                    "/usr/bin/nvidia-smi".into(),
                    fw.clone(),
                ],
                vec![
                    format!("{lib}/libcuda.so.{v}"),
                    format!("{lib32}/libnvidia-ml.so.{v}"),
                ],
            ),
            (
                "compute",
                vec![
                    format!("{lib}/libcuda.so.{v}"),
                    format!("{lib}/libnvidia-allocator.so.{v}"),
                    "/etc/OpenCL/vendors/nvidia.icd".into(),
                    "/usr/bin/nvidia-cuda-mps-control".into(),
                ],
                vec![
                    format!("{lib}/libGLX_nvidia.so.{v}"),
                    format!("{lib}/libnvidia-egl-gbm.so.1.1.3"),
                    format!("{lib32}/libcuda.so.{v}"),
                    "/usr/bin/nvidia-smi".into(),
                ],
            ),
            (
                "compute,compat32",
                vec![
                    format!("{lib32}/libcuda.so.{v}"),
                    format!("{lib}/libcuda.so.{v}"),
                ],
                vec![format!("{lib32}/libGLX_nvidia.so.{v}")],
            ),
            (
                "video",
                vec![
                    format!("{lib}/vdpau/libvdpau_nvidia.so.{v}"),
                    format!("{lib}/libcuda.so.{v}"),
                ],
                vec![format!("{lib32}/vdpau/libvdpau_nvidia.so.{v}")],
            ),
            (
                "graphics",
                vec![
                    format!("{lib}/libGLX_nvidia.so.{v}"),
                    format!("{lib}/libnvidia-egl-gbm.so.1.1.3"),
                    format!("{lib}/libnvidia-allocator.so.{v}"),
                    "/usr/share/glvnd/egl_vendor.d/10_nvidia.json".into(),
                    "/etc/vulkan/icd.d/nvidia_icd.json".into(),
                ],
                vec![
                    format!("{lib}/libcuda.so.{v}"),
                    format!("{lib}/nvidia/xorg/nvidia_drv.so"),
                    "/usr/bin/nvidia-xconfig".into(),
                    "/usr/share/X11/xorg.conf.d/10-nvidia.conf".into(),
                ],
            ),
            (
                "display",
                vec![
                    format!("{lib}/nvidia/xorg/nvidia_drv.so"),
                    format!("{lib}/nvidia/xorg/libglxserver_nvidia.so.{v}"),
                    "/usr/bin/nvidia-xconfig".into(),
                    "/usr/share/X11/xorg.conf.d/10-nvidia.conf".into(),
                    format!("{lib}/libGLX_nvidia.so.{v}"),
                ],
                vec![format!("{lib}/libcuda.so.{v}")],
            ),
            (
                "all",
                vec![
                    format!("{lib32}/libGLX_nvidia.so.{v}"),
                    format!("{lib32}/vdpau/libvdpau_nvidia.so.{v}"),
                    format!("{lib}/nvidia/xorg/nvidia_drv.so"),
                    fw.clone(),
                ],
                vec![],
            ),
        ];
        for (caps, want, not) in cases {
            let caps_value = Capabilities::parse(Some(caps)).unwrap();
            let files = files_of(&host, caps_value);
            let mounted: Vec<&str> = files
                .mounts
                .iter()
                .map(|m| m.container_path.as_str())
                .collect();
            for w in &want {
                assert!(
                    mounted.contains(&w.as_str()),
                    "{caps}: {w} missing from {mounted:#?}"
                );
            }
            for n in &not {
                assert!(!mounted.contains(&n.as_str()), "{caps}: {n} mounted");
            }
            for m in &files.mounts {
                assert_eq!(m.options, MOUNT_OPTIONS, "{caps}: {}", m.container_path);
                assert!(m
                    .host_path
                    .starts_with(host.roots().driver_root.to_str().unwrap()));
            }
        }
        // The links the hooks make: GBM's backend for graphics, the GLX server module for display.
        let links = |caps: &str| files_of(&host, Capabilities::parse(Some(caps)).unwrap()).links;
        let gbm = (
            "../libnvidia-allocator.so.1".to_string(),
            format!("{lib}/gbm/nvidia-drm_gbm.so"),
        );
        assert!(links("graphics").contains(&gbm));
        assert!(!links("compute").contains(&gbm));
        assert!(links("display").contains(&(
            format!("libglxserver_nvidia.so.{v}"),
            format!("{lib}/nvidia/xorg/libglxserver_nvidia.so")
        )));
        // SONAMEs: from the cache, and from the link beside a vdpau library.
        let video = files_of(&host, Capabilities::parse(Some("video")).unwrap());
        assert!(video
            .libs
            .iter()
            .any(|l| l.soname == "libvdpau_nvidia.so.1"));
    }
}
