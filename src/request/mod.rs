//! What a container asks for, read from its config.json, and where each ask came from.
//!
//! Pure functions over the spec document: no host access. Semantics follow NVIDIA's toolkit
//! (docs/nvidia-behaviour.md §2) with two deliberate differences:
//! - An unset `NVIDIA_VISIBLE_DEVICES` is never a GPU request, even in an old image that sets
//!   `CUDA_VERSION` without `NVIDIA_REQUIRE_CUDA` (NVIDIA's "legacy image" rule grants *all*
//!   GPUs to such images; an image alone should not be able to claim every GPU).
//! - Repeated ids are de-duplicated (a time-sliced GPU may be listed several times by the
//!   device plugin; NVIDIA's code turns duplicates into empty slots).
//!
//! The forms NVIDIA's Kubernetes components hand down:
//! - Device plugin, `envvar` strategy: `NVIDIA_VISIBLE_DEVICES=GPU-<uuid>,...` (privilege rule
//!   below); `volume-mounts` strategy: one `/dev/null` mount per device at
//!   `/var/run/nvidia-container-devices/<id>` plus `NVIDIA_VISIBLE_DEVICES` set to that
//!   directory (read only with `accept-volume-mounts`; `create` removes the mounts it read);
//!   CDI annotations `cdi.k8s.io/nvidia-device-plugin_<id>` (read like any other).
//! - DRA driver: CDI annotations naming devices of its own transient specs. Specs NVIDIA writes
//!   set `NVIDIA_VISIBLE_DEVICES=void`, so `void` next to CDI annotations means the engine
//!   (containerd with CDI on, CRI-O, podman) has already applied them: nothing is done twice.
//! - MIG ids (`G:M`, `MIG-<uuid>`, `MIG-GPU-<uuid>/<gi>/<ci>`) in the list, resolved by
//!   `legacy`; `NVIDIA_MIG_CONFIG_DEVICES` / `NVIDIA_MIG_MONITOR_DEVICES`; `NVIDIA_IMEX_CHANNELS`
//!   or `imex/<id>` mounts.
//!
//! One module (with its tests, over 600 lines): every part reads the same env list and the same
//! spec document into the one [`Request`] that [`route`] then decides on. The
//! `NVIDIA_REQUIRE_*` grammar and its evaluation against [`HostFacts`] are in
//! [`requirements`], re-exported here.

use std::collections::{HashMap, HashSet};

use serde_json::Value;
use thiserror::Error;

use crate::cdi::annotations::{self, AnnotatedDevice, AnnotationError};
use crate::cdi::name::{self as cdi_name, QualifiedNameError};
use crate::config::{Config, Mode};
use crate::nvidia::Capabilities;

pub mod gated;
pub mod kubelet;
mod requirements;
pub use requirements::{
    compare_versions, parse_requirement, parse_version, GpuFacts, HostFacts, Op, Property,
    Requirement, RequirementError, Term,
};

pub const VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";
pub const DRIVER_CAPABILITIES: &str = "NVIDIA_DRIVER_CAPABILITIES";
pub const DISABLE_REQUIRE: &str = "NVIDIA_DISABLE_REQUIRE";
pub const MIG_CONFIG_DEVICES: &str = "NVIDIA_MIG_CONFIG_DEVICES";
pub const MIG_MONITOR_DEVICES: &str = "NVIDIA_MIG_MONITOR_DEVICES";
pub const IMEX_CHANNELS: &str = "NVIDIA_IMEX_CHANNELS";
const REQUIRE_PREFIX: &str = "NVIDIA_REQUIRE_";

/// Where NVIDIA's device plugin (`volume-mounts` strategy) mounts `/dev/null` once per device,
/// and the value it gives `NVIDIA_VISIBLE_DEVICES` alongside (k8s-device-plugin
/// `internal/plugin/server.go`, `deviceListAsVolumeMountsContainerPathRoot`).
pub const DEVICE_MOUNT_ROOT: &str = "/var/run/nvidia-container-devices";
/// The source of those mounts (`deviceListAsVolumeMountsHostPath`).
const DEVICE_MOUNT_SOURCE: &str = "/dev/null";
/// The largest IMEX channel number: channel minors are 20 bits (NVIDIA's JIT-CDI check,
/// docs/nvidia-behaviour.md §2.3).
pub const MAX_IMEX_CHANNEL: u32 = (1 << 20) - 1;
/// Most `process.env` entries read. A real container has tens; execve(2) takes at most a
/// quarter of the 8 MiB default stack for argv and env together, i.e. under 700,000 of the
/// shortest entries (`a=` and its NUL), so runc could not start a process with more anyway.
pub const MAX_ENV_ENTRIES: usize = 1_000_000;
/// Longest value of an `NVIDIA_*` variable read: a list of 10,000 MIG UUIDs is ~600 KiB.
pub const MAX_NVIDIA_VALUE_BYTES: usize = 1 << 20;
/// Most device names in one list (variable, mounts or annotations): a host has at most a few
/// hundred GPUs, MIG devices or IMEX channels to name.
pub const MAX_DEVICE_NAMES: usize = 10_000;

#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum RequestError {
    #[error("process.env entry {0:?} has no '=': every entry must be KEY=VALUE, fix the container's environment")]
    EnvWithoutEquals(String),
    #[error("unknown NVIDIA_DRIVER_CAPABILITIES value {value:?}: use a comma list of compute, compat32, graphics, utility, video, display, ngx, or all")]
    UnknownCapability { value: String },
    #[error("invalid requirement {expr:?} in {var}: {why}; write it as <property><op><version> terms, e.g. \"cuda>=12.4 brand=tesla,driver>=535\" (space = or, comma = and)")]
    BadRequirement {
        var: String,
        expr: String,
        why: String,
    },
    #[error(transparent)]
    Annotation(#[from] AnnotationError),
    #[error("annotation {key:?} asks for {device:?}, which is not a fully qualified CDI device name (vendor/class=name; set mode = \"cdi\" to prefix cdi-default-kind)")]
    UnqualifiedAnnotation { key: String, device: String },
    #[error("{VISIBLE_DEVICES} mixes CDI device names ({}) with GPU ids ({}): use one form", qualified.join(", "), unqualified.join(", "))]
    MixedDeviceNames {
        qualified: Vec<String>,
        unqualified: Vec<String>,
    },
    #[error("invalid CDI device request: {0}; a CDI device is named vendor.com/class=name (`nvshim cdi list` shows those available)")]
    BadCdiName(#[from] QualifiedNameError),
    #[error("{VISIBLE_DEVICES}={value:?} is how NVIDIA's device plugin (volume-mounts strategy) says the devices are mounts under {DEVICE_MOUNT_ROOT}, but {why}; set accept-volume-mounts = true in the nvshim config, or switch the device plugin to the envvar or CDI strategy")]
    VolumeMountSignal { value: String, why: &'static str },
    #[error("process.env has {count} entries, more than the {MAX_ENV_ENTRIES} nvshim reads; trim the container's environment")]
    TooManyEnvEntries { count: usize },
    #[error("{var} is {len} bytes long, more than the {MAX_NVIDIA_VALUE_BYTES} nvshim reads; name fewer devices")]
    ValueTooLong { var: String, len: usize },
    #[error("{from} names {count} devices, more than the {MAX_DEVICE_NAMES} nvshim accepts in one request; name fewer devices")]
    TooManyDeviceNames { from: String, count: usize },
    #[error("{from} asks for IMEX channel {id:?}, which is not a channel number (0 to {MAX_IMEX_CHANNEL}); use a comma list such as 0,3")]
    BadImexChannel { from: String, id: String },
    /// A request [`env_policy`] refused: the create fails rather than run the container
    /// without what it asked for.
    #[error("{var}={value:?} is refused: {reason}")]
    Refused {
        var: &'static str,
        value: String,
        reason: String,
    },
}

/// The GPUs requested by `NVIDIA_VISIBLE_DEVICES`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum VisibleDevices {
    /// Unset, empty or `void`: not a GPU container.
    #[default]
    NotRequested,
    /// `none`: the driver (control nodes, libraries) without any GPU node.
    NoGpus,
    All,
    /// Indices, `GPU-<uuid>`, PCI bus ids, or (for CDI) qualified names, de-duplicated in order.
    List(Vec<String>),
}

/// Parses the value of `NVIDIA_VISIBLE_DEVICES`.
pub fn parse_visible_devices(value: Option<&str>) -> VisibleDevices {
    let Some(value) = value else {
        return VisibleDevices::NotRequested;
    };
    let items: Vec<&str> = value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if items.is_empty() || items.contains(&"void") {
        return VisibleDevices::NotRequested;
    }
    // The first of `all`/`none` decides (NVIDIA: internal/config/image/devices.go).
    for item in &items {
        if item.eq_ignore_ascii_case("all") {
            return VisibleDevices::All;
        }
        if *item == "none" {
            return VisibleDevices::NoGpus;
        }
    }
    let mut seen = HashSet::with_capacity(items.len());
    VisibleDevices::List(
        items
            .into_iter()
            .filter(|i| seen.insert(*i))
            .map(String::from)
            .collect(),
    )
}

impl Capabilities {
    /// Parses `NVIDIA_DRIVER_CAPABILITIES`; unset or empty means `utility,compute`.
    pub fn parse(value: Option<&str>) -> Result<Capabilities, RequestError> {
        let value = value.map(str::trim).unwrap_or("");
        if value.is_empty() {
            return Ok(Capabilities {
                compute: true,
                utility: true,
                ..Default::default()
            });
        }
        let mut caps = Capabilities::default();
        for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match item {
                "all" => return Ok(Capabilities::ALL),
                "compute" => caps.compute = true,
                "compat32" => caps.compat32 = true,
                "graphics" => caps.graphics = true,
                "utility" => caps.utility = true,
                "video" => caps.video = true,
                "display" => caps.display = true,
                "ngx" => caps.ngx = true,
                other => {
                    return Err(RequestError::UnknownCapability {
                        value: other.to_string(),
                    })
                }
            }
        }
        Ok(caps)
    }
}

/// Where a request came from; `nvshim explain` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Env(&'static str),
    /// NVIDIA's legacy prestart hook that dockerd adds for `docker run --gpus`; the request
    /// itself is in the env dockerd sets alongside it.
    DockerGpusHook,
    Annotation(String),
    Mount(String),
}

/// Everything a container asked for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Request {
    pub devices: VisibleDevices,
    pub sources: Vec<Source>,
    pub capabilities: Capabilities,
    pub requirements: Vec<Requirement>,
    /// `NVIDIA_DISABLE_REQUIRE` is true.
    pub disable_require: bool,
    pub privileged: bool,
    /// An unprivileged container's `NVIDIA_VISIBLE_DEVICES=all` (or `none`) was ignored by
    /// [`env_policy`]: a CUDA image's own default, not an allocation.
    pub ignored_unprivileged_env: bool,
    /// Env requests [`env_policy`] refused ([`RequestError::Refused`]); `create` fails on the
    /// first, after `nvshim explain` has seen them all.
    pub refused: Vec<RequestError>,
    /// What the kubelet put beside the request (`accept-envvar-unprivileged =
    /// "allocation-backed"`).
    pub allocation: Allocation,
    /// `NVIDIA_VISIBLE_DEVICES` ids the allocation's names do not back: allowed only when the
    /// host resolves each to a GPU whose node is in [`Allocation::nodes`] (`create` checks).
    pub unbacked: Vec<String>,
    /// Devices named in `cdi-annotation-prefixes` annotations, in key order, de-duplicated
    /// (not read in `legacy` mode, where NVIDIA ignores them too).
    pub annotation_devices: Vec<AnnotatedDevice>,
    /// `NVIDIA_VISIBLE_DEVICES=void` next to CDI annotations: the engine has applied the CDI
    /// devices itself (the specs NVIDIA's tools write all set `void`), so nothing is done.
    pub cdi_already_applied: bool,
    /// `NVIDIA_VISIBLE_DEVICES=void` without CDI annotations: what the specs NVIDIA's tools
    /// write set when the engine applies their devices from the CRI's CDI field (DRA claims
    /// since Kubernetes 1.31, the device plugin's `cdi-cri` strategy), which never reaches
    /// nvshim.
    pub void_without_annotations: bool,
    /// Destinations of the device plugin's `/dev/null` mounts read as requests (with
    /// `accept-volume-mounts`); `create` removes them from the spec.
    pub device_mounts: Vec<String>,
    /// IMEX channels (`NVIDIA_IMEX_CHANNELS`, or `imex/<id>` mounts, which win), in order,
    /// de-duplicated. Served on the legacy route only.
    pub imex_channels: Vec<u32>,
    /// `NVIDIA_MIG_CONFIG_DEVICES`: the MIG config capability (privileged containers only).
    pub mig_config: VisibleDevices,
    /// `NVIDIA_MIG_MONITOR_DEVICES`: the MIG monitor capability (privileged containers only).
    pub mig_monitor: VisibleDevices,
    /// `NVIDIA_GDS`, `NVIDIA_MOFED`, `NVIDIA_GDRCOPY`, `NVIDIA_NVSWITCH` set to `enabled`
    /// beside a device request ([`gated`]). Served on the legacy route only.
    pub features: Vec<crate::host::gated::Feature>,
}

impl Request {
    pub fn wants_gpus(&self) -> bool {
        self.devices != VisibleDevices::NotRequested
    }

    /// Whether the kubelet's device checkpoint could settle what the spec alone did not back
    /// (`accept-envvar-unprivileged = "allocation-backed"`): an ignored or refused
    /// `NVIDIA_VISIBLE_DEVICES`, unbacked ids, or a refused feature variable.
    pub fn wants_checkpoint(&self) -> bool {
        self.ignored_unprivileged_env
            || !self.unbacked.is_empty()
            || self.refused.iter().any(|e| {
                matches!(e, RequestError::Refused { var, .. } if *var == VISIBLE_DEVICES || gated::is_variable(var))
            })
    }
}

/// The process environment as (key, value) pairs, later entries overriding earlier ones.
pub fn env_map(spec: &Value) -> Result<Vec<(&str, &str)>, RequestError> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    let Some(env) = spec.pointer("/process/env").and_then(Value::as_array) else {
        return Ok(out);
    };
    if env.len() > MAX_ENV_ENTRIES {
        return Err(RequestError::TooManyEnvEntries { count: env.len() });
    }
    // Key -> slot in `out`: linear in the number of entries (a scan per entry was quadratic).
    let mut index: HashMap<&str, usize> = HashMap::with_capacity(env.len());
    for entry in env.iter().filter_map(Value::as_str) {
        let (k, v) = entry
            .split_once('=')
            .ok_or_else(|| RequestError::EnvWithoutEquals(entry.chars().take(200).collect()))?;
        if k.starts_with("NVIDIA_") && v.len() > MAX_NVIDIA_VALUE_BYTES {
            return Err(RequestError::ValueTooLong {
                var: k.to_string(),
                len: v.len(),
            });
        }
        match index.get(k) {
            Some(&i) => out[i].1 = v,
            None => {
                index.insert(k, out.len());
                out.push((k, v));
            }
        }
    }
    Ok(out)
}

fn lookup<'a>(env: &[(&'a str, &'a str)], key: &str) -> Option<&'a str> {
    env.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
}

/// `CAP_SYS_ADMIN` in the bounding set, as NVIDIA decides "privileged"
/// (internal/config/image/privileged.go).
pub fn is_privileged(spec: &Value) -> bool {
    spec.pointer("/process/capabilities/bounding")
        .and_then(Value::as_array)
        .is_some_and(|caps| caps.iter().any(|c| c.as_str() == Some("CAP_SYS_ADMIN")))
}

fn parse_bool(v: &str) -> bool {
    // Go's strconv.ParseBool true values.
    matches!(v, "1" | "t" | "T" | "TRUE" | "true" | "True")
}

/// Lexically cleans an absolute path as Go's `filepath.Clean` does for the mount paths NVIDIA
/// compares (`..` cannot climb above `/`).
fn clean_path(p: &str) -> String {
    crate::edits::go_clean(&format!("/{p}"))
}

/// What the device plugin's `/dev/null` mounts ask for.
#[derive(Debug, Default)]
struct MountRequests {
    /// GPU ids and qualified CDI names, in mount order, de-duplicated.
    devices: Vec<String>,
    imex: Vec<String>,
    /// Every destination read (to remove from the spec).
    destinations: Vec<String>,
}

/// Reads `/var/run/nvidia-container-devices/<id>` mounts whose source is `/dev/null`
/// (NVIDIA `internal/config/image/cuda_image.go` `DevicesFromMounts`): `<id>` is a GPU id,
/// `cdi/<vendor>/<class>/<name>` or `cdi/<vendor>/<class>=<name>` a CDI device, `imex/<n>` an
/// IMEX channel. Unlike NVIDIA's prefix test, the root must be followed by `/`.
fn mount_requests(spec: &Value) -> MountRequests {
    let mut out = MountRequests::default();
    let Some(mounts) = spec.get("mounts").and_then(Value::as_array) else {
        return out;
    };
    let prefix = format!("{DEVICE_MOUNT_ROOT}/");
    let mut seen_destinations: HashSet<&str> = HashSet::new();
    let mut seen_items: HashSet<(bool, String)> = HashSet::new();
    for m in mounts {
        let (Some(source), Some(destination)) = (
            m.get("source").and_then(Value::as_str),
            m.get("destination").and_then(Value::as_str),
        ) else {
            continue;
        };
        if clean_path(source) != DEVICE_MOUNT_SOURCE {
            continue;
        }
        let cleaned = clean_path(destination);
        let Some(id) = cleaned.strip_prefix(&prefix) else {
            continue;
        };
        if seen_destinations.insert(destination) {
            out.destinations.push(destination.to_string());
        }
        let is_imex = id.starts_with("imex/");
        let (list, item) = if let Some(channel) = id.strip_prefix("imex/") {
            (&mut out.imex, channel.to_string())
        } else if let Some(cdi) = id.strip_prefix("cdi/") {
            // `nvidia.com/gpu/0` → `nvidia.com/gpu=0`; `nvidia.com/gpu=0` stays.
            let name = match cdi.split_once('=') {
                Some(_) => cdi.to_string(),
                None => match cdi.rsplit_once('/') {
                    Some((kind, name)) => format!("{kind}={name}"),
                    None => cdi.to_string(),
                },
            };
            (&mut out.devices, name)
        } else {
            (&mut out.devices, id.to_string())
        };
        if seen_items.insert((is_imex, item.clone())) {
            list.push(item);
        }
    }
    out
}

/// Parses IMEX channel ids: numbers up to [`MAX_IMEX_CHANNEL`]; `all`, `none` and `void` ask
/// for none. NVIDIA ignores `all` too: an IMEX channel is an isolation boundary between
/// ComputeDomains, so "every channel" is never granted by a variable (and toolkit 1.17.0,
/// which failed on it instead, broke images that set it; docs/field-notes.md §2.7).
fn parse_imex_channels(from: &str, items: &[&str]) -> Result<Vec<u32>, RequestError> {
    if items.len() > MAX_DEVICE_NAMES {
        return Err(RequestError::TooManyDeviceNames {
            from: from.to_string(),
            count: items.len(),
        });
    }
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    for item in items.iter().map(|i| i.trim()).filter(|i| !i.is_empty()) {
        if ["all", "none", "void"]
            .iter()
            .any(|w| item.eq_ignore_ascii_case(w))
        {
            if item.eq_ignore_ascii_case("all") {
                tracing::warn!("{from}: IMEX channel value \"all\" is ignored; name the channels");
            }
            continue;
        }
        let id = item
            .parse::<u32>()
            .ok()
            .filter(|n| *n <= MAX_IMEX_CHANNEL && item.bytes().all(|b| b.is_ascii_digit()))
            .ok_or_else(|| RequestError::BadImexChannel {
                from: from.to_string(),
                id: item.to_string(),
            })?;
        if seen.insert(id) {
            out.push(id);
        }
    }
    Ok(out)
}

/// True when a `NVIDIA_VISIBLE_DEVICES` value lists `void`.
fn lists_void(value: Option<&str>) -> bool {
    value.is_some_and(|v| v.split(',').any(|i| i.trim() == "void"))
}

/// What the kubelet put into config.json beside an env request, read only for
/// `accept-envvar-unprivileged = "allocation-backed"`: none of it can come from the image
/// (a pod could forge the mounts only with a `hostPath` volume of `/dev/null`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Allocation {
    /// Device names of the device plugin's `/dev/null` mounts and of CDI annotations, each the
    /// part after `=` of a CDI name (`nvidia.com/gpu=GPU-x` → `GPU-x`).
    pub names: Vec<String>,
    /// `(major, minor)` of the `/dev/nvidia<N>` nodes in `linux.devices`: the engine adds them
    /// for the device plugin's `DeviceSpec`s (`PASS_DEVICE_SPECS=true`) and for CDI devices
    /// it applied itself (CRI CDI).
    pub nodes: Vec<(u32, u32)>,
    /// The environment the device plugin's allocate response gave the container, from the
    /// kubelet's checkpoint ([`kubelet`]): backs the feature variables (`NVIDIA_GDS=enabled`
    /// and the like).
    pub envs: Vec<(String, String)>,
}

impl Allocation {
    fn read(spec: &Value, config: &Config) -> Allocation {
        let mut names: Vec<String> = mount_requests(spec).devices;
        if let Ok(annotated) =
            annotations::parse(spec.get("annotations"), &config.cdi_annotation_prefixes)
        {
            names.extend(annotated.into_iter().map(|a| a.device));
        }
        for n in &mut names {
            *n = device_part(n).to_string();
        }
        let nodes = spec
            .pointer("/linux/devices")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|d| d.get("type").and_then(Value::as_str) == Some("c"))
            .filter(|d| {
                d.get("path")
                    .and_then(Value::as_str)
                    .and_then(|p| p.strip_prefix("/dev/nvidia"))
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            })
            .filter_map(|d| {
                let num = |k: &str| d.get(k)?.as_u64().and_then(|v| u32::try_from(v).ok());
                Some((num("major")?, num("minor")?))
            })
            .collect();
        Allocation {
            names,
            nodes,
            envs: Vec::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty() && self.nodes.is_empty()
    }

    /// Whether the allocation's names include `id` (compared without a CDI kind, UUIDs in any
    /// case).
    pub fn names_id(&self, id: &str) -> bool {
        let id = device_part(id);
        self.names.iter().any(|n| n.eq_ignore_ascii_case(id))
    }

    /// How the allocation reads in an error.
    pub fn describe(&self) -> String {
        if self.is_empty() {
            return "none: no device-plugin mount, CDI annotation or GPU device node beside it"
                .into();
        }
        let mut parts: Vec<String> = self.names.clone();
        parts.extend(
            self.nodes
                .iter()
                .map(|(ma, mi)| format!("device node {ma}:{mi}")),
        );
        parts.join(", ")
    }
}

/// The device part of a CDI name (`vendor/class=name` → `name`); a plain id as it is.
fn device_part(id: &str) -> &str {
    match id.split_once('=') {
        Some((kind, name)) if kind.contains('/') => name,
        _ => id,
    }
}

/// The fixes [`env_policy`] names for a refused `NVIDIA_VISIBLE_DEVICES` (README, "Kubernetes
/// device-plugin strategies").
const ENV_FIX: &str = "if NVIDIA's device plugin allocated the GPUs, set accept-envvar-unprivileged = \"allocation-backed\" (its envvar strategy is then backed by the kubelet's device checkpoint on containerd nodes, or by PASS_DEVICE_SPECS=true), or use its volume-mounts (with accept-volume-mounts = true), cdi-annotations or cdi-cri strategy; if not, unset the variable in the pod; on a node where every pod may pick its GPUs set accept-envvar-unprivileged = true; or run the container privileged";

/// What an environment variable asks for that crosses an isolation boundary.
#[derive(Debug, Clone, Copy)]
pub enum EnvAsk<'a> {
    /// `NVIDIA_VISIBLE_DEVICES`.
    Gpus(&'a VisibleDevices),
    /// `NVIDIA_IMEX_CHANNELS` (numbers already parsed; `all` asks for none).
    ImexChannels(&'a [u32]),
    /// `NVIDIA_MIG_CONFIG_DEVICES` or `NVIDIA_MIG_MONITOR_DEVICES`.
    MigCapability(&'static str, &'a VisibleDevices),
    /// A CDI device named in `NVIDIA_VISIBLE_DEVICES` (a DRA claim, an IMEX channel, ...).
    CdiName(&'a str),
    /// A feature-gated variable set to `enabled` ([`gated`]).
    Feature(crate::host::gated::Feature),
}

/// Who is asking: [`env_policy`]'s other input.
#[derive(Debug, Clone, Copy)]
pub struct Asker<'a> {
    /// `CAP_SYS_ADMIN` in the bounding set.
    pub privileged: bool,
    /// dockerd's `--gpus` hook, trusted by `accept-docker-gpus-hook`.
    pub docker_gpus: bool,
    pub allocation: &'a Allocation,
}

/// [`env_policy`]'s answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Honour,
    /// Honoured if the host resolves these ids to GPUs whose nodes the allocation has.
    HonourIfNodes(Vec<String>),
    /// Not a request (a CUDA image's `NVIDIA_VISIBLE_DEVICES=all`); warned.
    Ignore,
    /// The create fails with this reason.
    Refuse(String),
}

/// The one decision for every environment variable that reaches an isolation boundary:
/// GPUs, IMEX channels, MIG management capabilities and CDI device kinds.
/// - CDI kinds: only `cdi-env-kinds` (default `cdi-default-kind`), privileged or not.
/// - MIG config/monitor: privileged containers only (libnvidia-container refuses others).
/// - IMEX channels: an isolation boundary between ComputeDomains, given by the orchestrator
///   (CDI `nvidia.com/imex-channel` devices, the device plugin's `imex/<n>` mounts): from the
///   environment only for privileged containers, or where `cdi-env-kinds` lists
///   `nvidia.com/imex-channel`.
/// - GPUs: privileged containers, `docker run --gpus` (with `accept-docker-gpus-hook`) and
///   `accept-envvar-unprivileged = true` are honoured. Otherwise `all`/`none` are ignored
///   when nothing was allocated (every CUDA image sets `all`; no device-plugin strategy sends
///   it) and refused beside an allocation; a list is refused with `false`, and with
///   `"allocation-backed"` honoured when the allocation names every id (else when its device
///   nodes hold the GPUs the ids resolve to, checked by `create`).
/// - Feature-gated devices (`NVIDIA_GDS=enabled` & co., every node of their kind): as GPUs
///   for privileged containers, the docker hook and `true`; refused with `false`, and with
///   `"allocation-backed"` unless the device plugin's allocate response (the kubelet's
///   checkpoint) set the same variable to `enabled`.
pub fn env_policy(ask: EnvAsk<'_>, who: &Asker<'_>, config: &Config) -> Verdict {
    use crate::config::UnprivilegedEnv;
    match ask {
        EnvAsk::CdiName(name) => {
            let kind = name.split_once('=').map_or(name, |(k, _)| k);
            let allowed = config.env_cdi_kinds();
            if allowed.contains(&kind) {
                Verdict::Honour
            } else {
                Verdict::Refuse(format!("the environment may not name CDI devices of kind {kind:?} (allowed: {}); devices of other kinds (DRA claims, IMEX channels, network devices) come from the orchestrator's annotations or the engine's CDI, or add the kind to cdi-env-kinds in the nvshim config", allowed.join(", ")))
            }
        }
        EnvAsk::MigCapability(_, value) if !who.privileged && wants_some(value) => Verdict::Refuse(
            "the MIG management capabilities are for privileged containers (CAP_SYS_ADMIN) only; run the container privileged, or unset the variable".into(),
        ),
        EnvAsk::MigCapability(..) => Verdict::Honour,
        EnvAsk::ImexChannels(channels) => {
            if channels.is_empty()
                || who.privileged
                || config.env_cdi_kinds().contains(&IMEX_CDI_KIND)
            {
                Verdict::Honour
            } else {
                Verdict::Refuse(format!("IMEX channels are isolation boundaries between ComputeDomains, which an unprivileged container gets from the orchestrator only (CDI devices {IMEX_CDI_KIND}=<N> in annotations, e.g. from NVIDIA's ComputeDomain DRA driver); run the container privileged, or add \"{IMEX_CDI_KIND}\" to cdi-env-kinds to let the environment name channels"))
            }
        }
        EnvAsk::Gpus(devices) => {
            let policy = config.accept_envvar_unprivileged;
            if !wants_some(devices) && *devices != VisibleDevices::NoGpus
                || who.privileged
                || policy == UnprivilegedEnv::Accept
                || (who.docker_gpus && config.accept_docker_gpus_hook)
            {
                return Verdict::Honour;
            }
            let setting = format!("accept-envvar-unprivileged = {}", policy.name());
            let ids = match devices {
                VisibleDevices::List(ids) => ids,
                VisibleDevices::NoGpus => return Verdict::Ignore,
                _ if who.allocation.is_empty() => return Verdict::Ignore,
                _ => return Verdict::Refuse(format!("the container is unprivileged and {setting}: it asks for more than its allocation, which holds {}; unset the variable in the pod", who.allocation.describe())),
            };
            if policy == UnprivilegedEnv::Refuse {
                return Verdict::Refuse(format!("the container is unprivileged (no CAP_SYS_ADMIN) and {setting}, so it would run without the GPUs it asks for; {ENV_FIX}"));
            }
            let unbacked: Vec<String> = ids
                .iter()
                .filter(|i| !who.allocation.names_id(i))
                .cloned()
                .collect();
            if unbacked.is_empty() {
                Verdict::Honour
            } else if who.allocation.nodes.is_empty() {
                Verdict::Refuse(format!("the container is unprivileged and {setting}, and its allocation ({}) does not name {}; {ENV_FIX}", who.allocation.describe(), unbacked.join(", ")))
            } else {
                Verdict::HonourIfNodes(unbacked)
            }
        }
        EnvAsk::Feature(feature) => {
            let policy = config.accept_envvar_unprivileged;
            let var = feature.variable();
            let backed = || {
                policy == UnprivilegedEnv::AllocationBacked
                    && who
                        .allocation
                        .envs
                        .iter()
                        .any(|(k, v)| k == var && v == gated::ENABLED)
            };
            if who.privileged
                || policy == UnprivilegedEnv::Accept
                || (who.docker_gpus && config.accept_docker_gpus_hook)
                || backed()
            {
                return Verdict::Honour;
            }
            let setting = format!("accept-envvar-unprivileged = {}", policy.name());
            let why = if policy == UnprivilegedEnv::AllocationBacked {
                "the device plugin's allocation for it (the kubelet's device checkpoint) does not set it"
            } else {
                "the environment does not choose devices"
            };
            Verdict::Refuse(format!("the container is unprivileged and {setting}, and {why}: {var}=enabled gives every {} node of the host; {}", feature.title(), gated::fix(feature)))
        }
    }
}

/// The CDI kind of IMEX channels (NVIDIA's and `nvshim cdi generate --mode imex`'s specs).
pub const IMEX_CDI_KIND: &str = "nvidia.com/imex-channel";

fn wants_some(v: &VisibleDevices) -> bool {
    matches!(v, VisibleDevices::All | VisibleDevices::List(_))
}

/// Reads the request from a spec.
///
/// Precedence (NVIDIA `internal/config/image/cuda_image.go` `VisibleDevices`): device-plugin
/// mounts (with `accept-volume-mounts`), then `NVIDIA_VISIBLE_DEVICES`; annotations are read
/// beside them and win in [`route`]. Mounts and annotations come from the kubelet, not from
/// the image, so no privilege rule applies to them; what the environment asks for goes
/// through [`env_policy`] when it is the request (not when mounts or annotations win).
pub fn from_spec(spec: &Value, config: &Config) -> Result<Request, RequestError> {
    from_spec_allocated(spec, config, Allocation::default())
}

/// [`from_spec`] with what the host records as allocated to this container (the kubelet's
/// device-manager checkpoint, read by `create`): its names and envs are added to the
/// [`Allocation`] read from the spec.
pub fn from_spec_allocated(
    spec: &Value,
    config: &Config,
    allocated: Allocation,
) -> Result<Request, RequestError> {
    let env = env_map(spec)?;
    let privileged = is_privileged(spec);
    let mut sources = Vec::new();
    let mut ignored_unprivileged_env = false;
    let mut refused: Vec<RequestError> = Vec::new();
    let docker_gpus = crate::edits::has_legacy_hook(spec);
    if docker_gpus {
        sources.push(Source::DockerGpusHook);
    }
    let allocation = if privileged
        || config.accept_envvar_unprivileged != crate::config::UnprivilegedEnv::AllocationBacked
    {
        Allocation::default()
    } else {
        let mut a = Allocation::read(spec, config);
        a.names.extend(allocated.names);
        a.envs = allocated.envs;
        a
    };
    let who = Asker {
        privileged,
        docker_gpus,
        allocation: &allocation,
    };
    let mounts = if config.accept_volume_mounts {
        mount_requests(spec)
    } else {
        MountRequests::default()
    };
    for d in &mounts.destinations {
        sources.push(Source::Mount(d.clone()));
    }
    let annotation_devices = read_annotations(spec, config, &mut sources)?;
    let visible = lookup(&env, VISIBLE_DEVICES);
    let mut devices;
    let mut unbacked = Vec::new();
    if !mounts.devices.is_empty() {
        devices = parse_visible_devices(Some(&mounts.devices.join(",")));
    } else {
        devices = parse_visible_devices(visible);
        if let VisibleDevices::List(ids) = &devices {
            if ids
                .iter()
                .any(|i| clean_path(i).starts_with(DEVICE_MOUNT_ROOT))
            {
                return Err(RequestError::VolumeMountSignal {
                    value: visible.unwrap_or_default().to_string(),
                    why: if config.accept_volume_mounts {
                        "the container has no such mounts"
                    } else {
                        "accept-volume-mounts is false"
                    },
                });
            }
        }
        // Annotations win over the variable (in every mode but legacy, which does not read
        // them): then it is no request to judge.
        if devices != VisibleDevices::NotRequested && annotation_devices.is_empty() {
            match env_policy(EnvAsk::Gpus(&devices), &who, config) {
                Verdict::Honour => sources.push(Source::Env(VISIBLE_DEVICES)),
                Verdict::HonourIfNodes(ids) => {
                    sources.push(Source::Env(VISIBLE_DEVICES));
                    unbacked = ids;
                }
                Verdict::Ignore => {
                    devices = VisibleDevices::NotRequested;
                    ignored_unprivileged_env = true;
                }
                Verdict::Refuse(reason) => {
                    refused.push(RequestError::Refused {
                        var: VISIBLE_DEVICES,
                        value: visible.unwrap_or_default().to_string(),
                        reason,
                    });
                    devices = VisibleDevices::NotRequested;
                }
            }
        }
    }
    let cdi_already_applied = !annotation_devices.is_empty() && lists_void(visible);
    let void_without_annotations = annotation_devices.is_empty() && lists_void(visible);
    let wants = devices != VisibleDevices::NotRequested;
    // Capabilities, requirements, IMEX and MIG capabilities only matter for GPU containers; an
    // unknown value in a non-GPU container must not fail it.
    let capabilities = if wants {
        Capabilities::parse(lookup(&env, DRIVER_CAPABILITIES))?
    } else {
        Capabilities::default()
    };
    let mut requirements = Vec::new();
    let mut imex_channels = Vec::new();
    let (mut mig_config, mut mig_monitor) = Default::default();
    let mut features = Vec::new();
    for feature in gated::parse(&env).into_iter().filter(|_| wants) {
        match env_policy(EnvAsk::Feature(feature), &who, config) {
            // Beside annotations (the CDI route) the variable is not served at all.
            Verdict::Refuse(_) if !annotation_devices.is_empty() => {}
            Verdict::Refuse(reason) => refused.push(RequestError::Refused {
                var: feature.variable(),
                value: gated::ENABLED.to_string(),
                reason,
            }),
            _ => features.push(feature),
        }
    }
    if wants {
        for (k, v) in &env {
            if k.starts_with(REQUIRE_PREFIX) && !k.starts_with("NVIDIA_REQUIRE_JETPACK") {
                requirements.push(parse_requirement(k, v)?);
            }
        }
        if !mounts.imex.is_empty() {
            let items: Vec<&str> = mounts.imex.iter().map(String::as_str).collect();
            imex_channels =
                parse_imex_channels(&format!("mount {DEVICE_MOUNT_ROOT}/imex"), &items)?;
        } else if let Some(v) = lookup(&env, IMEX_CHANNELS) {
            let items: Vec<&str> = v.split(',').collect();
            let channels = parse_imex_channels(IMEX_CHANNELS, &items)?;
            match env_policy(EnvAsk::ImexChannels(&channels), &who, config) {
                // Beside annotations (the CDI route) the variable is not served at all.
                Verdict::Refuse(_) if !annotation_devices.is_empty() => {}
                Verdict::Refuse(reason) => refused.push(RequestError::Refused {
                    var: IMEX_CHANNELS,
                    value: v.to_string(),
                    reason,
                }),
                _ if channels.is_empty() => {}
                _ => {
                    sources.push(Source::Env(IMEX_CHANNELS));
                    imex_channels = channels;
                }
            }
        }
        // NVIDIA reads these two in its legacy mode only; `legacy` serves them.
        mig_config = parse_visible_devices(lookup(&env, MIG_CONFIG_DEVICES));
        mig_monitor = parse_visible_devices(lookup(&env, MIG_MONITOR_DEVICES));
        for (var, value) in [
            (MIG_CONFIG_DEVICES, &mut mig_config),
            (MIG_MONITOR_DEVICES, &mut mig_monitor),
        ] {
            if let Verdict::Refuse(reason) =
                env_policy(EnvAsk::MigCapability(var, value), &who, config)
            {
                refused.push(RequestError::Refused {
                    var,
                    value: lookup(&env, var).unwrap_or_default().to_string(),
                    reason,
                });
                *value = VisibleDevices::NotRequested;
            }
            if wants_some(value) {
                sources.push(Source::Env(var));
            }
        }
    }
    Ok(Request {
        devices,
        sources,
        capabilities,
        requirements,
        disable_require: lookup(&env, DISABLE_REQUIRE).is_some_and(parse_bool),
        privileged,
        ignored_unprivileged_env,
        refused,
        allocation,
        unbacked,
        annotation_devices,
        cdi_already_applied,
        void_without_annotations,
        device_mounts: mounts.destinations,
        imex_channels,
        mig_config,
        mig_monitor,
        features,
    })
}

/// The CDI devices named in `cdi-annotation-prefixes` annotations, in key order,
/// de-duplicated (none in `legacy` mode, where NVIDIA ignores them too); their keys go into
/// `sources`. Annotations come from the orchestrator (a device plugin or DRA driver), not
/// from the image, so no privilege rule applies (docs/nvidia-behaviour.md §2.1).
fn read_annotations(
    spec: &Value,
    config: &Config,
    sources: &mut Vec<Source>,
) -> Result<Vec<AnnotatedDevice>, RequestError> {
    let mut annotation_devices: Vec<AnnotatedDevice> = Vec::new();
    if config.mode == Mode::Legacy {
        return Ok(annotation_devices);
    }
    if let Some(map) = spec.get("annotations").and_then(Value::as_object) {
        for (key, value) in map {
            let len = value.as_str().map_or(0, str::len);
            let ours = config
                .cdi_annotation_prefixes
                .iter()
                .any(|p| !p.is_empty() && key.starts_with(p.as_str()));
            if ours && len > MAX_NVIDIA_VALUE_BYTES {
                return Err(RequestError::ValueTooLong {
                    var: format!("annotation {key}"),
                    len,
                });
            }
        }
    }
    let parsed = annotations::parse(spec.get("annotations"), &config.cdi_annotation_prefixes)?;
    if parsed.len() > MAX_DEVICE_NAMES {
        return Err(RequestError::TooManyDeviceNames {
            from: "the CDI annotations".into(),
            count: parsed.len(),
        });
    }
    // Hash sets keep both dedupes linear.
    let mut seen_keys: HashSet<String> = HashSet::new();
    let mut seen_devices: HashSet<String> = HashSet::new();
    for a in parsed {
        if seen_keys.insert(a.key.clone()) {
            sources.push(Source::Annotation(a.key.clone()));
        }
        if seen_devices.insert(a.device.clone()) {
            annotation_devices.push(a);
        }
    }
    Ok(annotation_devices)
}

/// Removes the device plugin's `/dev/null` mounts that [`from_spec`] read as requests (their
/// destinations are in `destinations`): they carry no data, only the request.
pub fn remove_device_mounts(spec: &mut Value, destinations: &[String]) {
    if destinations.is_empty() {
        return;
    }
    if let Some(mounts) = spec.get_mut("mounts").and_then(Value::as_array_mut) {
        mounts.retain(|m| {
            let source = m.get("source").and_then(Value::as_str).map(clean_path);
            let destination = m.get("destination").and_then(Value::as_str);
            !(source.as_deref() == Some(DEVICE_MOUNT_SOURCE)
                && destination.is_some_and(|d| destinations.iter().any(|x| x == d)))
        });
    }
}

/// How a request is served, with the reason [`route`] chose it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Not a GPU container.
    Nothing(Reason),
    /// Resolved against the host (`legacy::resolve`).
    Legacy(Reason),
    /// These fully qualified CDI devices, from the spec directories.
    Cdi(Vec<String>, Reason),
}

impl Route {
    pub fn reason(&self) -> &Reason {
        match self {
            Route::Nothing(r) | Route::Legacy(r) | Route::Cdi(_, r) => r,
        }
    }
}

/// Why [`route`] chose a route: decided there, once, and printed as it is by `nvshim explain`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// `NVIDIA_VISIBLE_DEVICES` unset, empty or void, and no CDI device annotated.
    NotRequested,
    /// An unprivileged container's `NVIDIA_VISIBLE_DEVICES`, ignored.
    UnprivilegedEnvIgnored,
    /// `void` next to CDI annotations: the engine applied them.
    EngineApplied,
    /// `void` alone: the engine applied CDI devices from the CRI's CDI field, if any.
    EngineCdi,
    /// `mode = legacy`.
    ModeLegacy,
    /// `mode = auto`, `NVIDIA_VISIBLE_DEVICES=all`.
    AllGpus,
    /// `mode = auto`, `NVIDIA_VISIBLE_DEVICES=none`.
    DriverOnly,
    /// `mode = auto`, GPU ids.
    GpuIds,
    /// CDI devices named in annotations (with the config's prefixes and mode).
    Annotations { prefixes: String, mode: Mode },
    /// `mode = cdi`: ids without a kind get the default kind.
    ModeCdi { default_kind: String },
    /// `mode = auto`, every id a qualified CDI name.
    QualifiedNames,
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reason::NotRequested => f.write_str("not a GPU container: NVIDIA_VISIBLE_DEVICES is unset, empty or void and no CDI device is annotated; config.json is left byte-identical"),
            Reason::UnprivilegedEnvIgnored => f.write_str("not a GPU container: its NVIDIA_VISIBLE_DEVICES is ignored (unprivileged)"),
            Reason::EngineApplied => f.write_str("nothing to do: the engine has already applied the annotated CDI devices (NVIDIA_VISIBLE_DEVICES=void)"),
            Reason::EngineCdi => f.write_str("nothing to do: NVIDIA_VISIBLE_DEVICES=void, which CDI specs set, without a CDI annotation: the engine applied CDI devices itself from the CRI's CDI field (how DRA claims reach a container since Kubernetes 1.31, and the device plugin's cdi-cri strategy; containerd's or CRI-O's CDI must be on, `nvshim doctor` checks), and nvshim never sees those names; config.json is left byte-identical"),
            Reason::ModeLegacy => f.write_str("mode = legacy: NVIDIA_VISIBLE_DEVICES is resolved against the host"),
            Reason::AllGpus => f.write_str("NVIDIA_VISIBLE_DEVICES=all: every GPU of the host, resolved against /proc"),
            Reason::DriverOnly => f.write_str("NVIDIA_VISIBLE_DEVICES=none: the driver (control nodes, libraries) without GPUs"),
            Reason::GpuIds => f.write_str("NVIDIA_VISIBLE_DEVICES names GPUs by index, UUID or PCI bus id (mode = auto), resolved against /proc"),
            Reason::Annotations { prefixes, mode } => write!(f, "CDI devices named in annotations ({prefixes}), which take precedence over NVIDIA_VISIBLE_DEVICES (mode = {})", mode.name()),
            Reason::ModeCdi { default_kind } => write!(f, "mode = cdi: NVIDIA_VISIBLE_DEVICES entries without a kind get cdi-default-kind {default_kind}"),
            Reason::QualifiedNames => f.write_str("every NVIDIA_VISIBLE_DEVICES entry is a fully qualified CDI device name (mode = auto)"),
        }
    }
}

/// Why a request that asks for nothing does.
fn nothing(request: &Request) -> Route {
    Route::Nothing(if request.ignored_unprivileged_env {
        Reason::UnprivilegedEnvIgnored
    } else if request.cdi_already_applied {
        Reason::EngineApplied
    } else if request.void_without_annotations {
        Reason::EngineCdi
    } else {
        Reason::NotRequested
    })
}

/// Decides between legacy and CDI by `mode` (docs/nvidia-behaviour.md §1.3; NVIDIA's
/// `internal/info/auto.go`):
/// - `legacy`: annotations are not read; `NVIDIA_VISIBLE_DEVICES` is resolved on the host.
/// - `cdi`: annotations if any, else `NVIDIA_VISIBLE_DEVICES`; names without a kind get
///   `cdi-default-kind` (`0` → `nvidia.com/gpu=0`, `all` → `nvidia.com/gpu=all`).
/// - `auto`: annotations if any (each must be fully qualified); else CDI when every id in
///   `NVIDIA_VISIBLE_DEVICES` is a qualified name, legacy when none is, an error when mixed.
///
/// Annotations take precedence over the environment, as in NVIDIA's `VisibleDevices`. A name
/// shaped `vendor/class=name` that breaks the name grammar is an error, not a legacy id.
///
/// Annotations next to `NVIDIA_VISIBLE_DEVICES=void` are nothing to do: every spec NVIDIA's
/// tools write (the DRA driver's, `nvidia-ctk cdi generate`'s, nvshim's) sets `void`, so the
/// engine has already applied the devices (containerd with CDI on, CRI-O, podman) and a second
/// pass would at best repeat it (the DRA driver sets `void` for exactly this reason:
/// k8s-dra-driver-gpu `cmd/gpu-kubelet-plugin/cdi.go`).
pub fn route(request: &Request, config: &Config) -> Result<Route, RequestError> {
    // `void` next to annotations no longer ends the request here: whether the engine applied
    // the devices is decided from config.json's content when they are resolved (create.rs).
    let qualify = |id: &str| {
        if cdi_name::looks_qualified(id) {
            id.to_string()
        } else {
            format!("{}={id}", config.cdi_default_kind)
        }
    };
    let annotations = || Reason::Annotations {
        prefixes: config.cdi_annotation_prefixes.join(", "),
        mode: config.mode,
    };
    let (names, reason): (Vec<String>, Reason) = match config.mode {
        Mode::Legacy => {
            return Ok(if request.wants_gpus() {
                Route::Legacy(Reason::ModeLegacy)
            } else {
                nothing(request)
            })
        }
        Mode::Cdi if !request.annotation_devices.is_empty() => (
            request
                .annotation_devices
                .iter()
                .map(|d| qualify(&d.device))
                .collect(),
            annotations(),
        ),
        Mode::Cdi => (
            match &request.devices {
                VisibleDevices::NotRequested => return Ok(nothing(request)),
                VisibleDevices::NoGpus => vec![qualify("none")],
                VisibleDevices::All => vec![qualify("all")],
                VisibleDevices::List(ids) => ids.iter().map(|d| qualify(d)).collect(),
            },
            Reason::ModeCdi {
                default_kind: config.cdi_default_kind.clone(),
            },
        ),
        Mode::Auto if !request.annotation_devices.is_empty() => {
            if let Some(d) = request
                .annotation_devices
                .iter()
                .find(|d| !cdi_name::looks_qualified(&d.device))
            {
                return Err(RequestError::UnqualifiedAnnotation {
                    key: d.key.clone(),
                    device: d.device.clone(),
                });
            }
            (
                request
                    .annotation_devices
                    .iter()
                    .map(|d| d.device.clone())
                    .collect(),
                annotations(),
            )
        }
        Mode::Auto => match &request.devices {
            VisibleDevices::NotRequested => return Ok(nothing(request)),
            VisibleDevices::NoGpus => return Ok(Route::Legacy(Reason::DriverOnly)),
            VisibleDevices::All => return Ok(Route::Legacy(Reason::AllGpus)),
            VisibleDevices::List(ids) => {
                let (qualified, unqualified): (Vec<String>, Vec<String>) = ids
                    .iter()
                    .cloned()
                    .partition(|d| cdi_name::looks_qualified(d));
                if qualified.is_empty() {
                    return Ok(Route::Legacy(Reason::GpuIds));
                }
                if !unqualified.is_empty() {
                    return Err(RequestError::MixedDeviceNames {
                        qualified,
                        unqualified,
                    });
                }
                (qualified, Reason::QualifiedNames)
            }
        },
    };
    if names.len() > MAX_DEVICE_NAMES {
        return Err(RequestError::TooManyDeviceNames {
            from: "the request".into(),
            count: names.len(),
        });
    }
    // Names from the image's environment are limited to the operator's kinds: an image must not
    // reach another pod's DRA claim, an IMEX channel or a network device by naming it.
    let from_env = request.annotation_devices.is_empty()
        && request.sources.contains(&Source::Env(VISIBLE_DEVICES));
    let who = Asker {
        privileged: request.privileged,
        docker_gpus: false,
        allocation: &request.allocation,
    };
    let mut out: Vec<String> = Vec::new();
    let mut seen: HashSet<String> = HashSet::new();
    for n in names {
        cdi_name::parse_qualified_name(&n)?;
        if from_env {
            if let Verdict::Refuse(reason) = env_policy(EnvAsk::CdiName(&n), &who, config) {
                return Err(RequestError::Refused {
                    var: VISIBLE_DEVICES,
                    value: n,
                    reason,
                });
            }
        }
        if seen.insert(n.clone()) {
            out.push(n);
        }
    }
    if !request.imex_channels.is_empty() {
        // CDI requests name IMEX channels as CDI devices (the ComputeDomain driver's specs, or
        // `nvshim cdi generate --mode imex`); the variable is a legacy-route request.
        tracing::warn!(
            "{IMEX_CHANNELS} / imex mounts are not served for CDI requests; ask for the CDI devices nvidia.com/imex-channel=<N> instead"
        );
    }
    Ok(Route::Cdi(out, reason))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::UnprivilegedEnv;
    use serde_json::json;

    #[test]
    fn visible_devices_values() {
        use VisibleDevices::*;
        let cases: &[(Option<&str>, VisibleDevices)] = &[
            (None, NotRequested),
            (Some(""), NotRequested),
            (Some(" , "), NotRequested),
            (Some("void"), NotRequested),
            (Some("0,void"), NotRequested),
            (Some("all"), All),
            (Some("ALL"), All),
            (Some("none"), NoGpus),
            (Some("0,all"), All),
            (Some("none,all"), NoGpus),
            (Some("1"), List(vec!["1".into()])),
            (
                Some(" 1 , GPU-abc ,1"),
                List(vec!["1".into(), "GPU-abc".into()]),
            ),
        ];
        for (input, want) in cases {
            assert_eq!(&parse_visible_devices(*input), want, "{input:?}");
        }
    }

    #[test]
    fn capabilities() {
        let d = Capabilities::parse(None).unwrap();
        assert!(d.compute && d.utility && !d.graphics);
        assert_eq!(Capabilities::parse(Some("all")).unwrap(), Capabilities::ALL);
        let u = Capabilities::parse(Some("utility")).unwrap();
        assert!(u.utility && !u.compute);
        assert_eq!(
            Capabilities::parse(Some("compute,bogus")),
            Err(RequestError::UnknownCapability {
                value: "bogus".into()
            })
        );
    }

    #[test]
    fn requirements_grammar() {
        let r = parse_requirement(
            "NVIDIA_REQUIRE_CUDA",
            "cuda>=12.4 brand=tesla,driver>=535 brand=tesla,driver>=470,driver<471",
        )
        .unwrap();
        assert_eq!(r.any_of.len(), 3);
        assert_eq!(r.any_of[0][0].property, Property::Cuda);
        assert_eq!(r.any_of[0][0].op, Op::Ge);
        assert_eq!(r.any_of[2].len(), 3);
        // Unknown properties are skipped.
        let r = parse_requirement("NVIDIA_REQUIRE_X", "foo>=1").unwrap();
        assert!(r.any_of.is_empty());
        assert!(parse_requirement("NVIDIA_REQUIRE_X", "cuda~12").is_err());
        assert!(parse_requirement("NVIDIA_REQUIRE_X", "cuda>=abc").is_err());
    }

    #[test]
    fn versions() {
        use std::cmp::Ordering::*;
        let v = |s| parse_version(s).unwrap();
        assert_eq!(compare_versions(&v("12.4"), &v("12.4.0")), Equal);
        assert_eq!(compare_versions(&v("580.65.06"), &v("580.9")), Greater);
        assert!(Op::Ge.holds(compare_versions(&v("13.0"), &v("12.4"))));
    }

    #[test]
    fn from_spec_privilege_rule() {
        let spec = json!({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=1"], "capabilities": {"bounding": ["CAP_CHOWN"]}}});
        let mut cfg = Config::default();
        assert!(from_spec(&spec, &cfg).unwrap().wants_gpus());
        cfg.accept_envvar_unprivileged = UnprivilegedEnv::Refuse;
        // A GPU list is refused, not dropped: the create fails naming the setting and the fix.
        let r = from_spec(&spec, &cfg).unwrap();
        assert!(!r.wants_gpus() && !r.ignored_unprivileged_env);
        let err = r.refused[0].to_string();
        assert!(
            err.contains("NVIDIA_VISIBLE_DEVICES=\"1\" is refused")
                && err.contains("accept-envvar-unprivileged = false")
                && err.contains("volume-mounts"),
            "{err}"
        );
        let spec = json!({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=1"], "capabilities": {"bounding": ["CAP_SYS_ADMIN"]}}});
        assert!(from_spec(&spec, &cfg).unwrap().wants_gpus());
        // `all` and `none` (a CUDA image's own defaults) are ignored, never refused.
        for value in ["all", "none"] {
            let spec = json!({"process": {"env": [format!("NVIDIA_VISIBLE_DEVICES={value}")]}});
            for policy in [UnprivilegedEnv::Refuse, UnprivilegedEnv::AllocationBacked] {
                cfg.accept_envvar_unprivileged = policy;
                let r = from_spec(&spec, &cfg).unwrap();
                assert!(
                    !r.wants_gpus() && r.ignored_unprivileged_env && r.refused.is_empty(),
                    "{value} {policy:?}"
                );
            }
        }
    }

    /// `env_policy` over every ask, privileged and not, under each setting: the one table of
    /// what the environment may reach.
    #[test]
    fn env_policy_table() {
        use UnprivilegedEnv::*;
        let list = VisibleDevices::List(vec!["GPU-a".into()]);
        let all = VisibleDevices::All;
        let backed = Allocation {
            names: vec!["GPU-a".into()],
            ..Allocation::default()
        };
        let none = Allocation::default();
        let envs = |k: &str, v: &str| Allocation {
            envs: vec![(k.into(), v.into())],
            ..backed.clone()
        };
        // The device plugin with --gds-enabled; with another feature's flag; a wrong value.
        let (gds, mofed, gds_true) = (
            envs("NVIDIA_GDS", "enabled"),
            envs("NVIDIA_MOFED", "enabled"),
            envs("NVIDIA_GDS", "true"),
        );
        use crate::host::gated::Feature::{Gds, Nvswitch};
        // (ask, privileged, policy, allocation, verdict: H honour, I ignore, R refuse)
        let cases: Vec<(EnvAsk<'_>, bool, UnprivilegedEnv, &Allocation, char)> = vec![
            (EnvAsk::Gpus(&list), false, Accept, &none, 'H'),
            (EnvAsk::Gpus(&list), false, Refuse, &none, 'R'),
            (EnvAsk::Gpus(&list), false, AllocationBacked, &none, 'R'),
            (EnvAsk::Gpus(&list), false, AllocationBacked, &backed, 'H'),
            (EnvAsk::Gpus(&list), true, Refuse, &none, 'H'),
            (EnvAsk::Gpus(&all), false, Refuse, &none, 'I'),
            (EnvAsk::Gpus(&all), false, AllocationBacked, &none, 'I'),
            (EnvAsk::Gpus(&all), false, AllocationBacked, &backed, 'R'),
            (EnvAsk::Gpus(&all), true, AllocationBacked, &backed, 'H'),
            (EnvAsk::Feature(Gds), false, Accept, &none, 'H'),
            (EnvAsk::Feature(Gds), false, Refuse, &none, 'R'),
            (EnvAsk::Feature(Gds), false, Refuse, &gds, 'R'),
            (EnvAsk::Feature(Gds), true, Refuse, &none, 'H'),
            (EnvAsk::Feature(Gds), false, AllocationBacked, &backed, 'R'),
            (EnvAsk::Feature(Gds), false, AllocationBacked, &gds, 'H'),
            (EnvAsk::Feature(Gds), false, AllocationBacked, &mofed, 'R'),
            (
                EnvAsk::Feature(Gds),
                false,
                AllocationBacked,
                &gds_true,
                'R',
            ),
            (EnvAsk::Feature(Gds), true, AllocationBacked, &none, 'H'),
            (
                EnvAsk::Feature(Nvswitch),
                false,
                AllocationBacked,
                &gds,
                'R',
            ),
            (EnvAsk::ImexChannels(&[7]), false, Accept, &backed, 'R'),
            (EnvAsk::ImexChannels(&[7]), true, Refuse, &none, 'H'),
            (EnvAsk::ImexChannels(&[]), false, Accept, &none, 'H'),
            (
                EnvAsk::MigCapability(MIG_CONFIG_DEVICES, &all),
                false,
                Accept,
                &none,
                'R',
            ),
            (
                EnvAsk::MigCapability(MIG_MONITOR_DEVICES, &list),
                false,
                Accept,
                &none,
                'R',
            ),
            (
                EnvAsk::MigCapability(MIG_MONITOR_DEVICES, &all),
                true,
                Refuse,
                &none,
                'H',
            ),
            (
                EnvAsk::CdiName("nvidia.com/gpu=0"),
                false,
                Accept,
                &none,
                'H',
            ),
            (
                EnvAsk::CdiName("k8s.gpu.nvidia.com/claim=c"),
                true,
                Accept,
                &none,
                'R',
            ),
            (
                EnvAsk::CdiName("nvidia.com/imex-channel=1"),
                true,
                Accept,
                &none,
                'R',
            ),
        ];
        for (ask, privileged, policy, allocation, want) in cases {
            let config = Config {
                accept_envvar_unprivileged: policy,
                ..Config::default()
            };
            let who = Asker {
                privileged,
                docker_gpus: false,
                allocation,
            };
            let got = match env_policy(ask, &who, &config) {
                Verdict::Honour | Verdict::HonourIfNodes(_) => 'H',
                Verdict::Ignore => 'I',
                Verdict::Refuse(_) => 'R',
            };
            assert_eq!(got, want, "{ask:?} privileged={privileged} {policy:?}");
        }
    }

    /// A refused feature variable fails the create (naming the setting and the device
    /// plugin's flag), is not served, and asks for the checkpoint; beside CDI annotations it
    /// is neither served nor refused; the docker hook (trusted) is served.
    #[test]
    fn feature_variables_follow_the_env_policy() {
        use crate::host::gated::Feature;
        let env = json!([
            "NVIDIA_VISIBLE_DEVICES=0",
            "NVIDIA_MOFED=enabled",
            "NVIDIA_GDS=true"
        ]);
        let spec = json!({"process": {"env": env}});
        let mut cfg = Config::default();
        assert_eq!(from_spec(&spec, &cfg).unwrap().features, [Feature::Mofed]);
        // The GPU from the device plugin's volume-mounts marker, which no policy judges.
        let marked = json!({"process": {"env": env}, "mounts": [{"destination":
            format!("{DEVICE_MOUNT_ROOT}/0"), "type": "bind", "source": "/dev/null"}]});
        cfg.accept_volume_mounts = true;
        for policy in [UnprivilegedEnv::Refuse, UnprivilegedEnv::AllocationBacked] {
            cfg.accept_envvar_unprivileged = policy;
            let r = from_spec(&marked, &cfg).unwrap();
            assert!(r.wants_gpus() && r.features.is_empty(), "{policy:?}");
            assert!(r.wants_checkpoint());
            let err = r.refused[0].to_string();
            assert!(
                err.contains("NVIDIA_MOFED=\"enabled\" is refused")
                    && err.contains(&format!("accept-envvar-unprivileged = {}", policy.name()))
                    && err.contains("--mofed-enabled"),
                "{err}"
            );
        }
        // The allocation's envs back it.
        let backed = Allocation {
            names: vec!["0".into()],
            envs: vec![("NVIDIA_MOFED".into(), "enabled".into())],
            ..Allocation::default()
        };
        let r = from_spec_allocated(&spec, &cfg, backed).unwrap();
        assert!(
            r.refused.is_empty() && r.features == [Feature::Mofed],
            "{r:?}"
        );
        // Beside CDI annotations (the CDI route, which does not serve the variable).
        let annotated = json!({"process": {"env": env},
            "annotations": {"cdi.k8s.io/x": "nvidia.com/gpu=0"}});
        let r = from_spec(&annotated, &cfg).unwrap();
        assert!(r.refused.is_empty() && r.features.is_empty(), "{r:?}");
        // dockerd's --gpus hook, trusted by accept-docker-gpus-hook.
        let docker = json!({"process": {"env": env},
            "hooks": {"prestart": [{"path": "/usr/bin/nvidia-container-runtime-hook", "args": ["nvidia-container-runtime-hook", "prestart"]}]}});
        cfg.accept_docker_gpus_hook = true;
        let r = from_spec(&docker, &cfg).unwrap();
        assert!(r.sources.contains(&Source::DockerGpusHook));
        assert_eq!(r.features, [Feature::Mofed]);
    }

    /// `accept-envvar-unprivileged = "allocation-backed"`: the variable is honoured when what
    /// the kubelet put beside it names the same GPUs, for each device-plugin strategy.
    #[test]
    fn allocation_backed_env() {
        let cfg = Config {
            accept_envvar_unprivileged: UnprivilegedEnv::AllocationBacked,
            ..Config::default()
        };
        let with = |env: &str, extra: Value| {
            let mut spec = json!({"process": {"env": [format!("NVIDIA_VISIBLE_DEVICES={env}")], "capabilities": {"bounding": []}}, "mounts": []});
            for (k, v) in extra.as_object().unwrap() {
                spec[k] = v.clone();
            }
            from_spec(&spec, &cfg).unwrap()
        };
        let refused = |r: &Request| r.refused.first().map(ToString::to_string);
        // envvar strategy at its defaults: nothing beside the variable.
        let r = with("GPU-aaaa", json!({}));
        let err = refused(&r).unwrap();
        assert!(
            err.contains("allocation-backed") && err.contains("device checkpoint"),
            "{err}"
        );
        // volume-mounts strategy markers (read as evidence even with accept-volume-mounts off).
        let marker = json!({"mounts": [dev_null("/var/run/nvidia-container-devices/GPU-aaaa")]});
        let r = with("GPU-AAAA", marker.clone());
        assert!(r.refused.is_empty() && r.unbacked.is_empty() && r.wants_gpus());
        // A pod that widens its allocation: another GPU, or all.
        let err = refused(&with("GPU-aaaa,GPU-bbbb", marker.clone())).unwrap();
        assert!(err.contains("does not name GPU-bbbb"), "{err}");
        let err = refused(&with("all", marker)).unwrap();
        assert!(
            err.contains("more than its allocation, which holds GPU-aaaa;"),
            "{err}"
        );
        // CDI annotations back the same names (read in legacy mode too, where they are not
        // the request).
        let legacy = Config {
            mode: Mode::Legacy,
            ..cfg.clone()
        };
        let spec = json!({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=0"]}, "annotations": {"cdi.k8s.io/nvidia-device-plugin_x": "nvidia.com/gpu=0"}});
        let r = from_spec(&spec, &legacy).unwrap();
        assert!(r.refused.is_empty() && r.wants_gpus(), "{:?}", r.refused);
        // Device nodes the engine added (PASS_DEVICE_SPECS, CRI CDI): the host decides.
        let nodes = json!({"linux": {"devices": [
            {"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1},
            {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255},
            {"path": "/dev/nvidia-uvm", "type": "c", "major": 510, "minor": 0},
        ]}});
        let r = with("GPU-aaaa", nodes);
        assert!(r.refused.is_empty());
        assert_eq!(r.unbacked, vec!["GPU-aaaa".to_string()]);
        assert_eq!(r.allocation.nodes, vec![(195, 1)]);
        // Privileged containers need no backing; accept-envvar-unprivileged = true neither.
        let spec = json!({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"], "capabilities": {"bounding": ["CAP_SYS_ADMIN"]}}});
        assert!(from_spec(&spec, &cfg).unwrap().wants_gpus());
        let spec = json!({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=3"]}});
        assert!(from_spec(&spec, &Config::default()).unwrap().wants_gpus());
    }

    #[test]
    fn env_last_wins_and_needs_equals() {
        let spec = json!({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_VISIBLE_DEVICES=void"]}});
        assert!(!from_spec(&spec, &Config::default()).unwrap().wants_gpus());
        let spec = json!({"process": {"env": ["BROKEN"]}});
        assert_eq!(
            from_spec(&spec, &Config::default()),
            Err(RequestError::EnvWithoutEquals("BROKEN".into()))
        );
    }

    #[test]
    fn requirement_checks() {
        let facts = HostFacts {
            driver_version: "580.65.06".into(),
            cuda_version: Some("13.0".into()),
            gpus: vec![GpuFacts::default()],
        };
        let ok = |e: &str| {
            parse_requirement("NVIDIA_REQUIRE_CUDA", e)
                .unwrap()
                .check(&facts)
        };
        assert!(ok("cuda>=12.4").is_ok());
        assert!(ok("cuda>=13.1").is_err());
        assert!(ok("cuda>=13.1 driver>=580").is_ok());
        assert!(ok("cuda>=12.0,driver<500").is_err());
        let err = ok("cuda>=99.0").unwrap_err().to_string();
        assert!(
            err.contains("cuda>=99.0") && err.contains("580.65.06"),
            "{err}"
        );
        assert!(matches!(
            ok("arch>=8.0"),
            Err(RequirementError::Unknown { .. })
        ));
        assert!(ok("foo>=1").is_ok());
    }

    #[test]
    fn non_gpu_container_ignores_bad_capabilities() {
        let spec = json!({"process": {"env": ["NVIDIA_DRIVER_CAPABILITIES=bogus"]}});
        assert!(!from_spec(&spec, &Config::default()).unwrap().wants_gpus());
    }

    fn route_of(spec: Value, mode: Mode) -> Result<Route, RequestError> {
        let cfg = Config {
            mode,
            ..Config::default()
        };
        route(&from_spec(&spec, &cfg)?, &cfg)
    }

    fn cdi(names: &[&str], reason: Reason) -> Result<Route, RequestError> {
        Ok(Route::Cdi(
            names.iter().map(|s| s.to_string()).collect(),
            reason,
        ))
    }

    fn annotations(mode: Mode) -> Reason {
        Reason::Annotations {
            prefixes: Config::default().cdi_annotation_prefixes.join(", "),
            mode,
        }
    }

    #[test]
    fn route_auto() {
        let env = |v: &str| json!({"process": {"env": [format!("NVIDIA_VISIBLE_DEVICES={v}")]}});
        assert_eq!(
            route_of(json!({}), Mode::Auto),
            Ok(Route::Nothing(Reason::NotRequested))
        );
        assert_eq!(
            route_of(env("0,1"), Mode::Auto),
            Ok(Route::Legacy(Reason::GpuIds))
        );
        assert_eq!(
            route_of(env("all"), Mode::Auto),
            Ok(Route::Legacy(Reason::AllGpus))
        );
        assert_eq!(
            route_of(env("none"), Mode::Auto),
            Ok(Route::Legacy(Reason::DriverOnly))
        );
        assert_eq!(
            route_of(
                env("nvidia.com/gpu=0,nvidia.com/gpu=1,nvidia.com/gpu=0"),
                Mode::Auto
            ),
            cdi(
                &["nvidia.com/gpu=0", "nvidia.com/gpu=1"],
                Reason::QualifiedNames
            )
        );
        let err = route_of(env("nvidia.com/gpu=0,1"), Mode::Auto).unwrap_err();
        assert!(
            err.to_string()
                .contains("mixes CDI device names (nvidia.com/gpu=0) with GPU ids (1)"),
            "{err}"
        );
        assert!(matches!(
            route_of(env("nvidia.com/gpu=-bad"), Mode::Auto),
            Err(RequestError::BadCdiName(_))
        ));
        // Annotations win over the environment, and need no privilege.
        let spec = json!({
            "process": {"env": ["NVIDIA_VISIBLE_DEVICES=0"], "capabilities": {"bounding": []}},
            "annotations": {"cdi.k8s.io/b": "nvidia.com/gpu=1", "cdi.k8s.io/a": "nvidia.com/gpu=0,nvidia.com/gpu=1", "other": "x"}
        });
        assert_eq!(
            route_of(spec.clone(), Mode::Auto),
            cdi(
                &["nvidia.com/gpu=0", "nvidia.com/gpu=1"],
                annotations(Mode::Auto)
            )
        );
        let r = from_spec(&spec, &Config::default()).unwrap();
        assert!(r
            .sources
            .contains(&Source::Annotation("cdi.k8s.io/a".into())));
        let spec = json!({"annotations": {"cdi.k8s.io/x": "0"}});
        let err = route_of(spec, Mode::Auto).unwrap_err().to_string();
        assert!(
            err.contains("\"cdi.k8s.io/x\"") && err.contains("\"0\""),
            "{err}"
        );
        assert!(matches!(
            route_of(
                json!({"annotations": {"cdi.k8s.io/x": "a/b=c,"}}),
                Mode::Auto
            ),
            Err(RequestError::Annotation(_))
        ));
    }

    #[test]
    fn route_cdi_and_legacy_modes() {
        let env = |v: &str| json!({"process": {"env": [format!("NVIDIA_VISIBLE_DEVICES={v}")]}});
        assert_eq!(
            route_of(env("0,nvidia.com/gpu=1,GPU-abc"), Mode::Cdi),
            cdi(
                &[
                    "nvidia.com/gpu=0",
                    "nvidia.com/gpu=1",
                    "nvidia.com/gpu=GPU-abc"
                ],
                Reason::ModeCdi {
                    default_kind: "nvidia.com/gpu".into()
                }
            )
        );
        assert_eq!(
            route_of(env("all"), Mode::Cdi),
            cdi(
                &["nvidia.com/gpu=all"],
                Reason::ModeCdi {
                    default_kind: "nvidia.com/gpu".into()
                }
            )
        );
        assert_eq!(
            route_of(env("void"), Mode::Cdi),
            Ok(Route::Nothing(Reason::EngineCdi))
        );
        assert_eq!(
            route_of(json!({"annotations": {"cdi.k8s.io/x": "0"}}), Mode::Cdi),
            cdi(&["nvidia.com/gpu=0"], annotations(Mode::Cdi))
        );
        // Legacy mode does not read annotations at all.
        assert_eq!(
            route_of(
                json!({"annotations": {"cdi.k8s.io/x": "nvidia.com/gpu=0"}}),
                Mode::Legacy
            ),
            Ok(Route::Nothing(Reason::NotRequested))
        );
        assert_eq!(
            route_of(env("nvidia.com/gpu=0"), Mode::Legacy),
            Ok(Route::Legacy(Reason::ModeLegacy))
        );
    }

    fn with_mounts(mounts: Value, env: &[&str]) -> Value {
        json!({"process": {"env": env, "capabilities": {"bounding": []}}, "mounts": mounts})
    }

    fn dev_null(dest: &str) -> Value {
        json!({"destination": dest, "type": "bind", "source": "/dev/null", "options": ["rbind", "rprivate", "rw"]})
    }

    #[test]
    fn device_plugin_volume_mounts() {
        let spec = with_mounts(
            json!([
                {"destination": "/proc", "type": "proc", "source": "proc"},
                dev_null("/var/run/nvidia-container-devices/GPU-aaaa"),
                dev_null("/var/run/nvidia-container-devices/GPU-aaaa"),
                dev_null("/var/run//nvidia-container-devices/GPU-bbbb/"),
                dev_null("/var/run/nvidia-container-devices/imex/3"),
                dev_null("/var/run/nvidia-container-devicesX/GPU-cccc"),
                {"destination": "/var/run/nvidia-container-devices/GPU-dddd", "source": "/tmp/x"},
            ]),
            &[
                "NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices",
                "NVIDIA_IMEX_CHANNELS=5",
            ],
        );
        // Off by default: the mounts are not requests, and the env value that points at them is
        // an error that says what to change.
        let err = from_spec(&spec, &Config::default()).unwrap_err();
        assert!(
            matches!(err, RequestError::VolumeMountSignal { .. })
                && err.to_string().contains("accept-volume-mounts = true"),
            "{err}"
        );
        let cfg = Config {
            accept_volume_mounts: true,
            accept_envvar_unprivileged: UnprivilegedEnv::Refuse,
            ..Config::default()
        };
        let r = from_spec(&spec, &cfg).unwrap();
        assert_eq!(
            r.devices,
            VisibleDevices::List(vec!["GPU-aaaa".into(), "GPU-bbbb".into()])
        );
        // Mounts need no privilege, and their IMEX channels win over the env's.
        assert_eq!(r.imex_channels, vec![3]);
        assert_eq!(r.device_mounts.len(), 3);
        assert!(r.sources.contains(&Source::Mount(
            "/var/run/nvidia-container-devices/GPU-aaaa".into()
        )));
        assert!(!r.sources.contains(&Source::Env(VISIBLE_DEVICES)));
        assert_eq!(route(&r, &cfg), Ok(Route::Legacy(Reason::GpuIds)));

        let mut edited = spec.clone();
        remove_device_mounts(&mut edited, &r.device_mounts);
        let left: Vec<&str> = edited["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["destination"].as_str().unwrap())
            .collect();
        assert_eq!(
            left,
            [
                "/proc",
                "/var/run/nvidia-container-devicesX/GPU-cccc",
                "/var/run/nvidia-container-devices/GPU-dddd"
            ]
        );

        // Accepted, but no mounts: the env signal has nothing to point at.
        let spec = with_mounts(
            json!([]),
            &["NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices"],
        );
        let cfg = Config {
            accept_volume_mounts: true,
            ..Config::default()
        };
        let err = from_spec(&spec, &cfg).unwrap_err().to_string();
        assert!(err.contains("no such mounts"), "{err}");
    }

    #[test]
    fn volume_mount_cdi_names() {
        let spec = with_mounts(
            json!([
                dev_null("/var/run/nvidia-container-devices/cdi/nvidia.com/gpu/0"),
                dev_null("/var/run/nvidia-container-devices/cdi/nvidia.com/gpu=GPU-aaaa"),
            ]),
            &[],
        );
        let cfg = Config {
            accept_volume_mounts: true,
            ..Config::default()
        };
        assert_eq!(
            route(&from_spec(&spec, &cfg).unwrap(), &cfg),
            cdi(
                &["nvidia.com/gpu=0", "nvidia.com/gpu=GPU-aaaa"],
                Reason::QualifiedNames
            )
        );
    }

    #[test]
    fn void_next_to_annotations_means_already_applied() {
        // The DRA driver's devices, already applied by the engine (its spec set `void`).
        let spec = json!({
            "process": {"env": ["NVIDIA_VISIBLE_DEVICES=void"]},
            "annotations": {"cdi.k8s.io/gpu.nvidia.com_claim": "k8s.gpu.nvidia.com/device=gpu-0"}
        });
        let r = from_spec(&spec, &Config::default()).unwrap();
        assert!(r.cdi_already_applied);
        assert_eq!(
            route(&r, &Config::default()),
            cdi(
                &["k8s.gpu.nvidia.com/device=gpu-0"],
                annotations(Mode::Auto)
            )
        );
        // Without `void`, the annotations are served.
        let spec = json!({
            "process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]},
            "annotations": {"cdi.k8s.io/gpu.nvidia.com_claim": "k8s.gpu.nvidia.com/device=gpu-0"}
        });
        assert_eq!(
            route_of(spec, Mode::Auto),
            cdi(
                &["k8s.gpu.nvidia.com/device=gpu-0"],
                annotations(Mode::Auto)
            )
        );
    }

    #[test]
    fn time_sliced_uuids_are_deduplicated() {
        let spec = json!({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=GPU-aaaa,GPU-aaaa,GPU-bbbb,GPU-aaaa"]}});
        let r = from_spec(&spec, &Config::default()).unwrap();
        assert_eq!(
            r.devices,
            VisibleDevices::List(vec!["GPU-aaaa".into(), "GPU-bbbb".into()])
        );
    }

    /// IMEX channels by variable go through `env_policy`: privileged containers, or the
    /// operator's `cdi-env-kinds`; every `accept-envvar-unprivileged` value refuses others.
    #[test]
    fn imex_channels_from_env() {
        let env = |v: &str, privileged: bool| {
            let caps: Vec<&str> = if privileged {
                vec!["CAP_SYS_ADMIN"]
            } else {
                vec![]
            };
            json!({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=0", format!("NVIDIA_IMEX_CHANNELS={v}")], "capabilities": {"bounding": caps}}})
        };
        let cfg = Config::default();
        assert_eq!(
            from_spec(&env("0,3, 3", true), &cfg).unwrap().imex_channels,
            vec![0, 3]
        );
        for policy in [
            UnprivilegedEnv::Accept,
            UnprivilegedEnv::Refuse,
            UnprivilegedEnv::AllocationBacked,
        ] {
            let cfg = Config {
                accept_envvar_unprivileged: policy,
                ..Config::default()
            };
            for value in ["7", "0,3", "all,2"] {
                let r = from_spec(&env(value, false), &cfg).unwrap();
                assert!(r.imex_channels.is_empty(), "{policy:?} {value}");
                // Where NVIDIA_VISIBLE_DEVICES=0 itself is refused, that is the error.
                let err = r.refused.last().unwrap().to_string();
                if policy == UnprivilegedEnv::Accept {
                    assert!(
                        err.contains(IMEX_CHANNELS) && err.contains("cdi-env-kinds"),
                        "{err}"
                    );
                }
            }
        }
        // The operator's opt-in: the same kind the variable could name as a CDI device.
        let opt_in = Config {
            cdi_env_kinds: Some(vec!["nvidia.com/gpu".into(), IMEX_CDI_KIND.into()]),
            ..Config::default()
        };
        let r = from_spec(&env("7", false), &opt_in).unwrap();
        assert!(r.refused.is_empty() && r.imex_channels == vec![7]);
        // `all` is never granted by a variable, and is not an error either.
        let r = from_spec(&env("all", false), &cfg).unwrap();
        assert!(r.imex_channels.is_empty() && r.refused.is_empty());
        let err = from_spec(&env("0,x", true), &cfg).unwrap_err().to_string();
        assert!(
            err.contains("\"x\"") && err.contains(IMEX_CHANNELS),
            "{err}"
        );
        assert!(from_spec(&env("1048576", true), &cfg).is_err());
        // The device plugin's imex mounts need no privilege and win over the variable.
        let spec = json!({"process": {"env": ["NVIDIA_IMEX_CHANNELS=7"]}, "mounts": [
            dev_null("/var/run/nvidia-container-devices/GPU-aaaa"),
            dev_null("/var/run/nvidia-container-devices/imex/2"),
        ]});
        let mounts = Config {
            accept_volume_mounts: true,
            ..Config::default()
        };
        let r = from_spec(&spec, &mounts).unwrap();
        assert!(r.refused.is_empty() && r.imex_channels == vec![2]);
        // Not a GPU container: a bad value does not fail it, and asks for nothing.
        for v in ["x", "7"] {
            let spec = json!({"process": {"env": [format!("NVIDIA_IMEX_CHANNELS={v}")]}});
            let r = from_spec(&spec, &cfg).unwrap();
            assert!(r.imex_channels.is_empty() && r.refused.is_empty());
        }
    }

    #[test]
    fn mig_capability_variables() {
        let spec = json!({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=0:1", "NVIDIA_MIG_CONFIG_DEVICES=all", "NVIDIA_MIG_MONITOR_DEVICES=none"], "capabilities": {"bounding": ["CAP_SYS_ADMIN"]}}});
        // Unprivileged: refused under every accept-envvar-unprivileged value, each variable.
        for (var, value) in [(MIG_CONFIG_DEVICES, "all"), (MIG_MONITOR_DEVICES, "0")] {
            for policy in [UnprivilegedEnv::Accept, UnprivilegedEnv::Refuse] {
                let unprivileged = json!({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=0", format!("{var}={value}")]}});
                let cfg = Config {
                    accept_envvar_unprivileged: policy,
                    ..Config::default()
                };
                let r = from_spec(&unprivileged, &cfg).unwrap();
                let err = r.refused.last().unwrap().to_string();
                if policy == UnprivilegedEnv::Accept {
                    assert!(err.contains(var) && err.contains("privileged"), "{err}");
                }
                assert!(!r.sources.contains(&Source::Env(var)));
            }
        }
        let r = from_spec(&spec, &Config::default()).unwrap();
        assert_eq!(r.mig_config, VisibleDevices::All);
        assert_eq!(r.mig_monitor, VisibleDevices::NoGpus);
        assert!(r.sources.contains(&Source::Env(MIG_CONFIG_DEVICES)));
        assert!(!r.sources.contains(&Source::Env(MIG_MONITOR_DEVICES)));
        // MIG ids are GPU ids to the router.
        assert_eq!(
            route(&r, &Config::default()),
            Ok(Route::Legacy(Reason::GpuIds))
        );
    }

    /// Item 3: names from the environment are limited to the allowed kinds, in every mode and
    /// spelling; annotations still reach any kind.
    #[test]
    fn env_cdi_names_limited_to_allowed_kinds() {
        let env = |v: &str| json!({"process": {"env": [format!("NVIDIA_VISIBLE_DEVICES={v}")]}});
        let env_reason = |mode| match mode {
            Mode::Cdi => Reason::ModeCdi {
                default_kind: "nvidia.com/gpu".into(),
            },
            _ => Reason::QualifiedNames,
        };
        for mode in [Mode::Auto, Mode::Cdi] {
            for name in [
                "nvidia.com/imex-channel=0",
                "k8s.gpu.nvidia.com/claim=abc-123",
                "nvidia.com/gpu=0,k8s.gpu.nvidia.com/claim=x",
                "example.com/net=eth1",
                "nvidia.com/mig=0:1",
            ] {
                let err = route_of(env(name), mode).unwrap_err().to_string();
                assert!(
                    err.contains("cdi-env-kinds") && err.contains("allowed: nvidia.com/gpu"),
                    "{mode:?} {name}: {err}"
                );
            }
            assert_eq!(
                route_of(env("nvidia.com/gpu=0,nvidia.com/gpu=all"), mode),
                cdi(
                    &["nvidia.com/gpu=0", "nvidia.com/gpu=all"],
                    env_reason(mode)
                )
            );
            // The same kinds through annotations are the orchestrator's choice.
            let a = json!({"annotations": {"cdi.k8s.io/x": "nvidia.com/imex-channel=0,k8s.gpu.nvidia.com/claim=c"}});
            assert_eq!(
                route_of(a, mode),
                cdi(
                    &["nvidia.com/imex-channel=0", "k8s.gpu.nvidia.com/claim=c"],
                    annotations(mode)
                )
            );
        }
        let cfg = Config {
            cdi_env_kinds: Some(vec!["nvidia.com/gpu".into(), "nvidia.com/mig".into()]),
            ..Config::default()
        };
        let spec = env("nvidia.com/mig=0:1");
        assert_eq!(
            route(&from_spec(&spec, &cfg).unwrap(), &cfg),
            cdi(&["nvidia.com/mig=0:1"], Reason::QualifiedNames)
        );
    }

    /// Item 4: a hook named like NVIDIA's does not lift the privilege rule unless the operator
    /// set accept-docker-gpus-hook.
    #[test]
    fn legacy_hook_name_does_not_lift_privilege_rule() {
        let with_hook = |path: &str, args: Value| {
            json!({
                "process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]},
                "hooks": {"prestart": [{"path": path, "args": args}]},
            })
        };
        let strict = Config {
            accept_envvar_unprivileged: UnprivilegedEnv::Refuse,
            ..Config::default()
        };
        for spec in [
            with_hook(
                "/usr/bin/nvidia-container-runtime-hook",
                json!(["nvidia-container-runtime-hook", "prestart"]),
            ),
            with_hook(
                "/usr/local/bin/nvidia-container-runtime-hook",
                json!(["x", "prestart"]),
            ),
            with_hook(
                "/usr/bin/nvidia-container-toolkit",
                json!(["nvidia-container-toolkit", "prestart"]),
            ),
        ] {
            let r = from_spec(&spec, &strict).unwrap();
            assert!(!r.wants_gpus(), "{spec}");
            let trusting = Config {
                accept_docker_gpus_hook: true,
                ..strict.clone()
            };
            let r = from_spec(&spec, &trusting).unwrap();
            if r.sources.contains(&Source::DockerGpusHook) {
                assert!(r.wants_gpus(), "{spec}");
            }
        }
    }

    /// Item 6: dedupes are linear and sizes are bounded.
    #[test]
    fn large_requests_are_linear_and_bounded() {
        let n = 150_000;
        let mut env: Vec<String> = (0..n).map(|i| format!("K{i}=v")).collect();
        env.push("NVIDIA_VISIBLE_DEVICES=all".into());
        let spec = json!({"process": {"env": env}});
        let t = std::time::Instant::now();
        assert_eq!(env_map(&spec).unwrap().len(), n + 1);
        assert!(t.elapsed().as_secs_f64() < 2.0, "{:?}", t.elapsed());
        // Duplicated keys: last wins, still linear.
        let dup: Vec<String> = (0..n).map(|i| format!("K{}={i}", i % 1000)).collect();
        let spec = json!({"process": {"env": dup}});
        let t = std::time::Instant::now();
        let m = env_map(&spec).unwrap();
        assert_eq!(m.len(), 1000);
        assert_eq!(lookup(&m, "K0"), Some(&*format!("{}", n - 1000)));
        assert!(t.elapsed().as_secs_f64() < 2.0, "{:?}", t.elapsed());

        let names: Vec<String> = (0..200_000)
            .map(|i| format!("nvidia.com/gpu={i}"))
            .collect();
        let spec = json!({"annotations": {"cdi.k8s.io/x": names.join(",")}});
        let t = std::time::Instant::now();
        let err = route_of(spec, Mode::Auto).unwrap_err().to_string();
        assert!(err.contains("annotation cdi.k8s.io/x is"), "{err}");
        // Under the size bound, the name count bounds it.
        let names: Vec<String> = (0..50_000).map(|i| format!("x.io/g={i}")).collect();
        let spec = json!({"annotations": {"cdi.k8s.io/x": names.join(",")}});
        let err = route_of(spec, Mode::Auto).unwrap_err().to_string();
        assert!(
            err.contains("50000 devices") && err.contains("10000"),
            "{err}"
        );
        assert!(t.elapsed().as_secs_f64() < 2.0, "{:?}", t.elapsed());

        let long = format!("NVIDIA_VISIBLE_DEVICES={}", "0,".repeat(600_000));
        let err = route_of(json!({"process": {"env": [long]}}), Mode::Auto)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("NVIDIA_VISIBLE_DEVICES is 1200000 bytes"),
            "{err}"
        );
        let err = route_of(
            json!({"annotations": {"cdi.k8s.io/x": "a".repeat(2 << 20)}}),
            Mode::Auto,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("annotation cdi.k8s.io/x is"), "{err}");
        // Many distinct ids below the value limit: bounded by the name count.
        let ids: Vec<String> = (0..20_000).map(|i| format!("GPU-{i}")).collect();
        let spec =
            json!({"process": {"env": [format!("NVIDIA_VISIBLE_DEVICES={}", ids.join(","))]}});
        let t = std::time::Instant::now();
        let r = from_spec(&spec, &Config::default()).unwrap();
        assert!(t.elapsed().as_secs_f64() < 2.0);
        let _ = r;
    }
}
