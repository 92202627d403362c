//! `nvshim cdi generate`: a CDI spec for this host's GPUs.
//!
//! Devices: one per full GPU under each naming strategy (index `0`, UUID `GPU-…`,
//! type-index `gpu0`), one per MIG device (`0:1`, `MIG-…`, `mig0:1`) where NVML reports MIG,
//! and `all`. As in NVIDIA's generator, a MIG-enabled GPU is served through its MIG devices
//! only; a full GPU also carries its DRM card and render nodes (with their groups in
//! `additionalGids`, as NVIDIA writes them) and a hook for their `by-path` links, a MIG device
//! none ([`legacy::device_nodes`] decides for legacy requests too). Global edits:
//! `NVIDIA_VISIBLE_DEVICES=void` (so a second pass sees no request), the control nodes that
//! exist, every 64-bit file the driver gives a container with every capability
//! (`crate::nvidia`'s tables, as `legacy` finds them: one table for both), read-only and
//! private, the IPC sockets, and NVIDIA's `createContainer` hooks in NVIDIA's order with an
//! explicit environment. Device nodes carry what a `stat` of the host node says (major, minor,
//! mode, a non-root group), without `type`, so a consumer re-stats the node at create time and
//! a node that has vanished fails loudly. `cdiVersion` is the lowest the content needs: 0.7.0
//! with DRM groups, 0.5.0 without (`--no-additional-gids`, for podman 4 and containerd 1.7,
//! whose CDI readers stop below 0.7.0).
//!
//! Discovery is NVML when the driver root's `libnvidia-ml.so.1` loads and answers; otherwise
//! `/proc/driver/nvidia` (no MIG), with the reason reported.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use thiserror::Error;

use crate::cdi::spec::{self, Device, Spec, SpecError};
use crate::edits::{ContainerEdits, DeviceNode, Mount};
use crate::host::nvml::{self, GpuInfo, MigInfo};
use crate::host::{Host, HostDeviceNode, HostError, HostFile, Inventory};
use crate::legacy;
use crate::nvidia::Capabilities;
use crate::nvidia::IPC_MOUNT_OPTIONS;

mod gated;
pub use gated::generate_gated;

/// Control nodes, in NVIDIA's order (`pkg/nvcdi/common-nvml.go`); only those present are added.
const CONTROL_NODES: &[&str] = &[
    "nvidia-modeset",
    "nvidia-uvm-tools",
    "nvidia-uvm",
    "nvidiactl",
];

#[derive(Debug, Error)]
pub enum GenerateError {
    #[error("{context}: {source}")]
    Host {
        context: &'static str,
        source: HostError,
    },
    #[error(transparent)]
    Driver(#[from] legacy::LegacyError),
    #[error(transparent)]
    Platform(#[from] crate::host::platform::PlatformError),
    #[error("no GPUs found ({from})")]
    NoGpus { from: String },
    #[error("MIG device {device} of GPU {gpu}: no {capability:?} line in {file}")]
    MigCapability {
        gpu: u32,
        device: u32,
        capability: String,
        file: PathBuf,
    },
    #[error("the generated spec is invalid (a bug in nvshim): {0}")]
    Invalid(#[from] SpecError),
    #[error("unknown device name strategy {0:?} (index, uuid, type-index)")]
    Strategy(String),
    #[error("no IMEX channels: no channel<N> device nodes in {} (channels appear when the IMEX daemon or a ComputeDomain creates them)", dir.display())]
    NoImexChannels { dir: PathBuf },
    #[error("no {patterns} device node for --mode {mode} ({why}); load the {title} kernel module (its nodes appear when it loads), or check dev-root in the nvshim config")]
    NoGatedNodes {
        mode: &'static str,
        title: &'static str,
        patterns: String,
        why: String,
    },
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// How devices are named (`--device-name-strategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameStrategy {
    /// `0`, MIG `0:1`.
    Index,
    /// `GPU-<uuid>`, MIG `MIG-<uuid>`.
    Uuid,
    /// `gpu0`, MIG `mig0:1`.
    TypeIndex,
}

impl FromStr for NameStrategy {
    type Err = GenerateError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "index" => Ok(NameStrategy::Index),
            "uuid" => Ok(NameStrategy::Uuid),
            "type-index" => Ok(NameStrategy::TypeIndex),
            other => Err(GenerateError::Strategy(other.into())),
        }
    }
}

/// What to generate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    pub vendor: String,
    pub class: String,
    /// Each device appears once per strategy (NVIDIA's default: index and UUID).
    pub strategies: Vec<NameStrategy>,
    /// Add the `all` device.
    pub all_device: bool,
    /// The `nvshim-hook` binary written into the hooks.
    pub hook_path: PathBuf,
    /// Add the groups of DRM nodes that are not world read-write to `additionalGids`, as
    /// NVIDIA's generator does: the spec then needs CDI 0.7.0, which the CDI readers of
    /// containerd 1.7 and podman 4 do not take (`--no-additional-gids` leaves them out).
    pub additional_gids: bool,
    /// The sandbox profile (`--profile sandbox`, [`legacy::sandbox`]): no hooks, no daemon
    /// sockets, the libraries also at their SONAMEs where the image's loader looks.
    pub sandbox: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            vendor: "nvidia.com".into(),
            class: "gpu".into(),
            strategies: vec![NameStrategy::Index, NameStrategy::Uuid],
            all_device: true,
            hook_path: PathBuf::from("/usr/bin/nvshim-hook"),
            additional_gids: true,
            sandbox: false,
        }
    }
}

/// Where the GPU list came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// NVML, from this library.
    Nvml(PathBuf),
    /// `/proc/driver/nvidia` (no MIG), because NVML could not be used.
    Proc { reason: String },
}

/// The GPUs and driver version a spec is generated for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discovery {
    pub driver_version: String,
    pub gpus: Vec<GpuInfo>,
    pub source: Source,
}

/// NVML when it loads and answers, else `/proc`.
pub fn discover(host: &Host) -> Result<Discovery, GenerateError> {
    discover_with_progress(host, &mut |_| {})
}

/// [`discover`], telling `progress` what it is doing (`nvshim cdi generate` shows it on a
/// terminal).
pub fn discover_with_progress(
    host: &Host,
    progress: &mut dyn FnMut(&str),
) -> Result<Discovery, GenerateError> {
    let nvml = nvml::library_path(host).and_then(|lib| nvml::discover_with_progress(lib, progress));
    let reason = match nvml {
        Ok(n) => {
            return Ok(Discovery {
                driver_version: n.driver_version,
                gpus: n.gpus,
                source: Source::Nvml(n.lib),
            })
        }
        Err(e) => e.to_string(),
    };
    let host_err = |context| move |source| GenerateError::Host { context, source };
    let driver_version = host
        .driver_version()
        .map_err(host_err("reading the driver version"))?;
    let gpus = host
        .gpus()
        .map_err(host_err("listing GPUs"))?
        .into_iter()
        .map(|g| GpuInfo {
            index: g.index as u32,
            minor: g.minor,
            uuid: g.uuid,
            name: g.model,
            bus_id: g.bus_id,
            mig_enabled: false,
            migs: Vec::new(),
            arch: None,
            brand: None,
            persistence_mode: None,
        })
        .collect();
    Ok(Discovery {
        driver_version,
        gpus,
        source: Source::Proc { reason },
    })
}

/// A device node edit from the host node `<dev-root>/dev/<name>`: numbers, mode and a non-root
/// group from `lstat`; path (and host path) only when it cannot be stat'ed. Also returns the
/// group to add to the container's groups when the node is not usable by "other".
fn node_edit(inv: &Inventory, name: &str) -> (DeviceNode, Option<u32>) {
    match inv.node(name) {
        Some(n) => found_node_edit(n),
        None => {
            let container_path = format!("/dev/{name}");
            let default_host = inv.roots.dev_root.join("dev").join(name);
            let host_path = default_host.to_string_lossy().into_owned();
            (
                DeviceNode {
                    host_path: (host_path != container_path).then_some(host_path),
                    path: container_path,
                    ..Default::default()
                },
                None,
            )
        }
    }
}

/// The device node edit of a node found on the host: numbers, mode and a non-root group; the
/// host path only when it differs from the container path. Also returns the group to add to
/// the container's groups when the node is not usable by "other".
fn found_node_edit(n: &HostDeviceNode) -> (DeviceNode, Option<u32>) {
    let host_path = n.host_path.to_string_lossy().into_owned();
    // NVIDIA ≥ 1.19: the gid when non-zero, and additionalGids when the node is not world
    // read-write (`internal/edits/device.go`).
    let gid = (n.gid != 0).then_some(n.gid);
    let extra = gid.filter(|_| n.file_mode & 0o006 != 0o006);
    (
        DeviceNode {
            host_path: (host_path != n.container_path).then_some(host_path),
            path: n.container_path.clone(),
            kind: None,
            major: Some(n.major.into()),
            minor: Some(n.minor.into()),
            file_mode: Some(n.file_mode),
            permissions: Some("rwm".into()),
            uid: None,
            gid,
        },
        extra,
    )
}

fn add_node(edits: &mut ContainerEdits, (node, gid): (DeviceNode, Option<u32>)) {
    if !edits.device_nodes.iter().any(|d| d.path == node.path) {
        edits.device_nodes.push(node);
    }
    if let Some(g) = gid {
        if !edits.additional_gids.contains(&g) {
            edits.additional_gids.push(g);
        }
    }
}

fn mount(f: &HostFile, options: &[&str]) -> Mount {
    Mount {
        host_path: f.host_path.to_string_lossy().into_owned(),
        container_path: f.container_path.clone(),
        // No `type`, as NVIDIA writes them: `rbind` in the options makes it a bind mount, and
        // a type would raise the spec to 0.4.0 for nothing.
        kind: None,
        options: options.iter().map(|s| s.to_string()).collect(),
    }
}

/// The edits every device shares: the control nodes, and everything the driver gives a
/// container with every capability but `compat32` (NVIDIA's generator mounts no 32-bit
/// libraries), with NVIDIA's hooks.
fn global_edits(
    inv: &Inventory,
    hook_path: &Path,
    sandbox: bool,
) -> Result<ContainerEdits, GenerateError> {
    let driver_version = &inv.driver_version;
    let mut edits = ContainerEdits {
        env: vec![format!("{}=void", crate::request::VISIBLE_DEVICES)],
        ..Default::default()
    };
    for name in CONTROL_NODES {
        if inv.node(name).is_some() {
            add_node(&mut edits, node_edit(inv, name));
        }
    }
    let caps = Capabilities {
        compat32: false,
        ..Capabilities::ALL
    };
    // The one table legacy requests take their files from too (`crate::nvidia`).
    let files = legacy::driver_files(inv, &caps)?;
    // As `driver_files` orders them; one mount per path.
    for m in files.mounts {
        if !edits
            .mounts
            .iter()
            .any(|e| e.container_path == m.container_path)
        {
            edits.mounts.push(Mount { kind: None, ..m });
        }
    }
    for f in inv
        .files
        .ipc
        .iter()
        .filter(|f| !f.container_path.ends_with("/socket"))
    {
        edits.mounts.push(mount(f, IPC_MOUNT_OPTIONS));
    }
    let plan = legacy::HookPlan {
        libs: &files.libs,
        dev_links: &files.dev_links,
        links: files.links,
        cuda_compat: true,
        application_profile: true,
        host_params: Some(inv.roots.proc_root.join("driver/nvidia/params")),
        // A spec serves every container: its hooks read the OCI state.
        bundle: None,
    };
    edits
        .hooks
        .extend(legacy::container_hooks(&plan, driver_version, hook_path));
    if sandbox {
        legacy::sandbox::confine(&mut edits, &files.libs);
    }
    Ok(edits)
}

/// A device's nodes ([`legacy::device_nodes`], the rule legacy requests follow too): its GPU
/// node, a MIG device's capability nodes (minors from `mig-minors`), a whole GPU's DRM card
/// and render nodes with their groups in `additionalGids` (as NVIDIA's generator writes them,
/// unless `opts.additional_gids` is off) and the hook that makes their `by-path` links.
fn device_edits(
    inv: &Inventory,
    device: legacy::GpuDevice<'_>,
    minors: &[(String, u32)],
    opts: &Options,
    edits: &mut ContainerEdits,
) -> Result<(), String> {
    let nodes = legacy::device_nodes(inv, device, true);
    add_node(edits, node_edit(inv, &nodes.gpu));
    for cap in &nodes.mig_capabilities {
        let minor = cap_minor(minors, cap).ok_or_else(|| cap.clone())?;
        add_node(
            edits,
            node_edit(inv, &format!("nvidia-caps/nvidia-cap{minor}")),
        );
    }
    for n in &nodes.drm {
        let name = n.container_path.trim_start_matches("/dev/");
        let (node, gid) = node_edit(inv, name);
        add_node(edits, (node, gid.filter(|_| opts.additional_gids)));
    }
    let plan = legacy::HookPlan {
        libs: &[],
        dev_links: &[],
        links: inv.drm_by_path_links(&nodes.drm),
        cuda_compat: false,
        application_profile: false,
        host_params: None,
        bundle: None,
    };
    if !opts.sandbox {
        edits
            .hooks
            .extend(legacy::container_hooks(&plan, "", &opts.hook_path));
    }
    Ok(())
}

/// The `access` capability minor of a MIG path, from `mig-minors`.
fn cap_minor(minors: &[(String, u32)], cap: &str) -> Option<u32> {
    minors.iter().find(|(c, _)| c == cap).map(|(_, m)| *m)
}

/// One physical or MIG device before naming.
struct Unit {
    /// Per strategy.
    index_name: String,
    uuid: String,
    type_index_name: String,
    edits: ContainerEdits,
}

fn mig_unit(
    inv: &Inventory,
    minors: &[(String, u32)],
    gpu: &GpuInfo,
    mig: &MigInfo,
    opts: &Options,
) -> Result<Unit, GenerateError> {
    let mut edits = ContainerEdits::default();
    let device = legacy::GpuDevice::Mig {
        parent_minor: gpu.minor,
        gpu_instance: mig.gpu_instance,
        compute_instance: mig.compute_instance,
    };
    device_edits(inv, device, minors, opts, &mut edits).map_err(|capability| {
        GenerateError::MigCapability {
            gpu: gpu.index,
            device: mig.index,
            capability,
            file: inv.roots.proc_root.join("driver/nvidia-caps/mig-minors"),
        }
    })?;
    Ok(Unit {
        index_name: format!("{}:{}", gpu.index, mig.index),
        uuid: mig.uuid.clone(),
        type_index_name: format!("mig{}:{}", gpu.index, mig.index),
        edits,
    })
}

/// The host's whole inventory, as `generate` takes it.
pub fn read_inventory(host: &Host) -> Result<Inventory, GenerateError> {
    Inventory::of(host, crate::host::Scope::ALL, Path::new("")).map_err(|source| {
        GenerateError::Host {
            context: "reading the host's inventory",
            source,
        }
    })
}

/// Builds the spec for `discovery` on the host of `inv` (read with [`Scope::ALL`](crate::host::Scope::ALL)).
pub fn generate(
    inv: &Inventory,
    discovery: &Discovery,
    opts: &Options,
) -> Result<Spec, GenerateError> {
    generate_with_progress(inv, discovery, opts, &mut |_| {})
}

/// [`generate`], telling `progress` what it is doing.
pub fn generate_with_progress(
    inv: &Inventory,
    discovery: &Discovery,
    opts: &Options,
    progress: &mut dyn FnMut(&str),
) -> Result<Spec, GenerateError> {
    if discovery.gpus.is_empty() {
        return Err(GenerateError::NoGpus {
            from: match &discovery.source {
                Source::Nvml(lib) => format!("NVML {}", lib.display()),
                Source::Proc { reason } => format!(
                    "{}; NVML not used: {reason}",
                    inv.roots.proc_root.join("driver/nvidia/gpus").display()
                ),
            },
        });
    }
    let mut units = Vec::new();
    let needs_mig = discovery.gpus.iter().any(|g| g.mig_enabled);
    // NVML's MIG devices take their minors from the driver's whole table: a spec lists every
    // device NVML reports, whether or not its capability files are there yet.
    let with_caps;
    let mut inv = inv;
    let minors = if needs_mig {
        let host = Host::new(inv.roots.clone());
        // Every capability node, not only those of the devices the driver lists under /proc
        // (which the inventory holds): NVML's devices take their minors from the whole table.
        let mut all = inv.clone();
        all.nodes.extend(host.device_nodes_in("nvidia-caps"));
        with_caps = all;
        inv = &with_caps;
        host.mig_minors().map_err(|source| GenerateError::Host {
            context: "reading MIG capability minors",
            source,
        })?
    } else {
        Vec::new()
    };
    let total = discovery.gpus.len();
    for g in discovery.gpus.iter().filter(|g| !g.mig_enabled) {
        progress(&format!("GPU {} of {total}: device nodes", g.index + 1));
        let mut edits = ContainerEdits::default();
        let device = legacy::GpuDevice::Gpu {
            minor: g.minor,
            bus_id: &g.bus_id,
        };
        // A whole GPU has no capability to look up.
        let _ = device_edits(inv, device, &[], opts, &mut edits);
        units.push(Unit {
            index_name: g.index.to_string(),
            uuid: g.uuid.clone(),
            type_index_name: format!("gpu{}", g.index),
            edits,
        });
    }
    for g in discovery.gpus.iter().filter(|g| g.mig_enabled) {
        progress(&format!("GPU {} of {total}: MIG devices", g.index + 1));
        for m in &g.migs {
            units.push(mig_unit(inv, &minors, g, m, opts)?);
        }
    }
    let mut devices: Vec<Device> = Vec::new();
    for strategy in &opts.strategies {
        for u in &units {
            let name = match strategy {
                NameStrategy::Index => &u.index_name,
                NameStrategy::Uuid => &u.uuid,
                NameStrategy::TypeIndex => &u.type_index_name,
            };
            if !devices.iter().any(|d| d.name == *name) {
                devices.push(Device {
                    name: name.clone(),
                    container_edits: u.edits.clone(),
                    ..Default::default()
                });
            }
        }
    }
    if opts.all_device && !units.is_empty() {
        let mut all = ContainerEdits::default();
        for u in &units {
            for n in &u.edits.device_nodes {
                add_node(&mut all, (n.clone(), None));
            }
            for g in &u.edits.additional_gids {
                if !all.additional_gids.contains(g) {
                    all.additional_gids.push(*g);
                }
            }
            all.hooks.extend(u.edits.hooks.iter().cloned());
        }
        devices.push(Device {
            name: "all".into(),
            container_edits: all,
            ..Default::default()
        });
    }
    progress("driver libraries, binaries, firmware and hooks");
    let mut spec = Spec {
        cdi_version: String::new(),
        kind: format!("{}/{}", opts.vendor, opts.class),
        annotations: Default::default(),
        devices,
        container_edits: global_edits(inv, &opts.hook_path, opts.sandbox)?,
    };
    spec.cdi_version = spec.minimum_version().to_string();
    spec.validate()?;
    Ok(spec)
}

/// The class NVIDIA names IMEX channel specs with (`nvidia-ctk cdi generate --mode imex`).
pub const IMEX_CLASS: &str = "imex-channel";

/// A spec for the host's IMEX channels (NVIDIA's `nvidia-ctk cdi generate --mode imex`): kind `<vendor>/<class>` (`nvidia.com/imex-channel` by default), one device per
/// channel named by its number, and `all`; no global edits. Device nodes as [`generate`]
/// writes them (stat'ed numbers, no type).
pub fn generate_imex(inv: &Inventory, opts: &Options) -> Result<Spec, GenerateError> {
    let channels = &inv.imex_channels;
    if channels.is_empty() {
        return Err(GenerateError::NoImexChannels {
            dir: inv.roots.dev_root.join("dev/nvidia-caps-imex-channels"),
        });
    }
    let mut devices: Vec<Device> = Vec::new();
    let mut all = ContainerEdits::default();
    for c in channels {
        let mut edits = ContainerEdits::default();
        let node = node_edit(inv, &format!("nvidia-caps-imex-channels/channel{c}"));
        add_node(&mut all, node.clone());
        add_node(&mut edits, node);
        devices.push(Device {
            name: c.to_string(),
            container_edits: edits,
            ..Default::default()
        });
    }
    if opts.all_device {
        devices.push(Device {
            name: "all".into(),
            container_edits: all,
            ..Default::default()
        });
    }
    let mut spec = Spec {
        cdi_version: String::new(),
        kind: format!("{}/{}", opts.vendor, opts.class),
        annotations: Default::default(),
        devices,
        container_edits: ContainerEdits::default(),
    };
    spec.cdi_version = spec.minimum_version().to_string();
    spec.validate()?;
    Ok(spec)
}

/// Writes `text` to `path` with [`crate::atomic::write`] (its temporary name never ends in
/// `.json` or `.yaml`, so a consumer scanning the directory meanwhile skips it), data flushed,
/// mode 0644 as NVIDIA writes specs: a consumer never reads half a spec. A symlink at `path`
/// is written through, a FIFO or device there refused ([`crate::atomic::target`]).
pub fn write_atomically(path: &Path, text: &str) -> Result<(), GenerateError> {
    let err = |source| GenerateError::Write {
        path: path.to_path_buf(),
        source,
    };
    let path = &crate::atomic::target(path).map_err(err)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    let opts = crate::atomic::Options {
        mode: 0o644,
        owner: None,
        durability: crate::atomic::Durability::Data,
    };
    crate::atomic::write(path, text.as_bytes(), &opts).map_err(err)
}

/// Serialises a generated spec.
pub fn render(spec: &Spec, format: spec::Format) -> String {
    spec.to_text(format)
}
