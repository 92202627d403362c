//! The CDI spec model, its decoding, validation and minimum-version rule
//! (docs/cdi-rules.md §1, §2).
//!
//! `containerEdits` are [`crate::edits::ContainerEdits`]: the one edits model, so a resolved
//! device goes straight to [`crate::edits::apply`].

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::name::{self, NameError};
use super::yaml::{self, Shape, YamlError};
use crate::edits::{ContainerEdits, HOOK_NAMES};

/// Spec versions the reference knows, newest first (`specs-go/version.go`).
pub const KNOWN_VERSIONS: &[&str] = &[
    "1.1.0", "1.0.0", "0.8.0", "0.7.0", "0.6.0", "0.5.0", "0.4.0", "0.3.0", "0.2.0", "0.1.0",
];
/// The versions a spec may declare: the known ones but 0.1.0 and 0.2.0, which are below the
/// minimum any content needs. A proposed 1.2.0 is not among them until nvshim implements it.
pub const READABLE_VERSIONS: &[&str] = &[
    "1.1.0", "1.0.0", "0.8.0", "0.7.0", "0.6.0", "0.5.0", "0.4.0", "0.3.0",
];
/// The newest spec version this implementation reads and writes.
pub const CURRENT_VERSION: &str = "1.1.0";
/// The floor: no spec can declare less (`vEarliest`).
pub const EARLIEST_VERSION: &str = "0.3.0";

/// A CDI spec file's content.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Spec {
    #[serde(default)]
    pub cdi_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    #[serde(default)]
    pub devices: Vec<Device>,
    #[serde(default, skip_serializing_if = "ContainerEdits::is_empty")]
    pub container_edits: ContainerEdits,
}

/// One device of a spec.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Device {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    #[serde(default)]
    pub container_edits: ContainerEdits,
}

/// Why a file is not a spec at all.
#[derive(Debug, Error)]
pub enum ParseError {
    #[error("not UTF-8 text (nor UTF-16 with a byte-order mark); save the spec as UTF-8")]
    NotUtf8,
    #[error("invalid UTF-16 text; save the spec as UTF-8")]
    BadUtf16,
    #[error("{0}")]
    Yaml(#[from] YamlError),
    #[error("no Spec data")]
    NoData,
    #[error("{0}")]
    Decode(String),
}

/// What is wrong with one container-edits object (`ContainerEdits.Validate`).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EditsError {
    #[error("invalid container edits: invalid environment variable {0:?}")]
    Env(String),
    #[error("invalid (empty) device path")]
    EmptyDevicePath,
    #[error("device {path:?}: invalid type {kind:?}")]
    DeviceType { path: String, kind: String },
    #[error("device {path:?}: invalid permissions {permissions:?}")]
    DevicePermissions { path: String, permissions: String },
    #[error("invalid hook name {0:?}")]
    HookName(String),
    #[error("invalid hook {0:?} with empty path")]
    HookPath(String),
    #[error("invalid hook {hook:?}: invalid environment variable {var:?}")]
    HookEnv { hook: String, var: String },
    #[error("invalid mount, empty host path")]
    MountHostPath,
    #[error("invalid mount, empty container path")]
    MountContainerPath,
    #[error("invalid ClosID {0:?}")]
    ClosId(String),
    #[error("invalid linux net device, empty HostInterfaceName")]
    NetDeviceHostName,
    #[error("invalid linux net device, empty Name")]
    NetDeviceName,
    #[error("invalid linux net device, duplicate HostInterfaceName {0:?}")]
    NetDeviceDuplicateHostName(String),
    #[error("invalid linux net device, duplicate Name {0:?}")]
    NetDeviceDuplicateName(String),
}

/// What is wrong with one device.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DeviceError {
    #[error(transparent)]
    Name(NameError),
    #[error("invalid device, empty device edits")]
    EmptyEdits,
    #[error("invalid device {name:?}: {source}")]
    Edits { name: String, source: EditsError },
}

/// Why a spec is invalid (`Spec.validate`), in the reference's evaluation order.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SpecError {
    #[error("invalid version {declared:?}: nvshim reads CDI spec versions {}; declare one of them (`nvshim cdi validate` names the oldest the content needs)", READABLE_VERSIONS.join(", "))]
    InvalidVersion { declared: String },
    #[error("the spec version must be at least v{required}")]
    VersionTooLow { required: &'static str },
    #[error(transparent)]
    Kind(NameError),
    #[error(transparent)]
    Edits(EditsError),
    #[error("failed add device {name:?}: {source}")]
    Device { name: String, source: DeviceError },
    #[error("invalid spec, multiple device {0:?}")]
    DuplicateDevice(String),
    #[error("invalid spec, no devices")]
    NoDevices,
}

/// Why a spec file was not loaded.
#[derive(Debug, Error)]
pub enum LoadError {
    #[error("cannot read: {0}")]
    Read(std::io::Error),
    #[error("not a regular file ({0}); CDI spec directories hold spec files only: remove it")]
    NotRegular(&'static str),
    #[error("{0} bytes, more than the {MAX_SPEC_BYTES}-byte limit for one CDI spec; split the spec or remove what it does not need")]
    TooLarge(u64),
    #[error("failed to parse CDI Spec: {0}")]
    Parse(#[from] ParseError),
    #[error("invalid CDI Spec: {0}")]
    Invalid(#[from] SpecError),
}

/// A spec file that failed to load, with its path.
#[derive(Debug, Error)]
#[error("{}: {source}", path.display())]
pub struct SpecFileError {
    pub path: PathBuf,
    /// Boxed: the nested validation errors are large, and this travels in `Result`s.
    pub source: Box<LoadError>,
}

const STRINGS: Shape = Shape::List(&Shape::Str);
const DEVICE_NODE: Shape = Shape::Object(&[
    ("path", Shape::Str),
    ("hostPath", Shape::Str),
    ("type", Shape::Str),
    ("major", Shape::Int),
    ("minor", Shape::Int),
    ("fileMode", Shape::U32),
    ("permissions", Shape::Str),
    ("uid", Shape::U32),
    ("gid", Shape::U32),
]);
const MOUNT: Shape = Shape::Object(&[
    ("hostPath", Shape::Str),
    ("containerPath", Shape::Str),
    ("options", STRINGS),
    ("type", Shape::Str),
]);
const HOOK: Shape = Shape::Object(&[
    ("hookName", Shape::Str),
    ("path", Shape::Str),
    ("args", STRINGS),
    ("env", STRINGS),
    ("timeout", Shape::Int),
]);
const INTEL_RDT: Shape = Shape::Object(&[
    ("closID", Shape::Str),
    ("l3CacheSchema", Shape::Str),
    ("memBwSchema", Shape::Str),
    ("schemata", STRINGS),
    ("enableMonitoring", Shape::Bool),
]);
const NET_DEVICE: Shape = Shape::Object(&[("hostInterfaceName", Shape::Str), ("name", Shape::Str)]);
const EDITS: Shape = Shape::Object(&[
    ("env", STRINGS),
    ("deviceNodes", Shape::List(&DEVICE_NODE)),
    ("netDevices", Shape::List(&NET_DEVICE)),
    ("hooks", Shape::List(&HOOK)),
    ("mounts", Shape::List(&MOUNT)),
    ("intelRdt", INTEL_RDT),
    ("additionalGids", Shape::List(&Shape::U32)),
]);
const DEVICE: Shape = Shape::Object(&[
    ("name", Shape::Str),
    ("annotations", Shape::StrMap),
    ("containerEdits", EDITS),
]);
/// The JSON shape of a spec, for [`yaml::to_json`].
pub const SPEC_SHAPE: Shape = Shape::Object(&[
    ("cdiVersion", Shape::Str),
    ("kind", Shape::Str),
    ("annotations", Shape::StrMap),
    ("devices", Shape::List(&DEVICE)),
    ("containerEdits", EDITS),
]);

/// The largest spec file read. `nvshim cdi generate` writes about 2 KB per GPU (14 KB for
/// eight); 8 MiB is hundreds of times the largest real spec, and bounds what one `create`
/// reads and parses.
pub const MAX_SPEC_BYTES: u64 = 8 << 20;

/// The text of a spec file. The reference's YAML reader takes UTF-8, or UTF-16 when a
/// byte-order mark says which, and drops the mark; yaml-rust2 takes a `&str` and would make a
/// UTF-8 mark part of the first key, so the mark is handled here. No encoding crate: std's
/// `char::decode_utf16` is all UTF-16 needs.
pub fn decode_text(bytes: &[u8]) -> Result<std::borrow::Cow<'_, str>, ParseError> {
    let utf16 = |rest: &[u8], be: bool| {
        if rest.len() % 2 != 0 {
            return Err(ParseError::BadUtf16);
        }
        let units = rest.chunks_exact(2).map(|c| {
            let pair = [c[0], c[1]];
            if be {
                u16::from_be_bytes(pair)
            } else {
                u16::from_le_bytes(pair)
            }
        });
        char::decode_utf16(units)
            .collect::<Result<String, _>>()
            .map(std::borrow::Cow::Owned)
            .map_err(|_| ParseError::BadUtf16)
    };
    match bytes {
        [0xEF, 0xBB, 0xBF, rest @ ..] => std::str::from_utf8(rest)
            .map(std::borrow::Cow::Borrowed)
            .map_err(|_| ParseError::NotUtf8),
        [0xFF, 0xFE, rest @ ..] => utf16(rest, false),
        [0xFE, 0xFF, rest @ ..] => utf16(rest, true),
        _ => std::str::from_utf8(bytes)
            .map(std::borrow::Cow::Borrowed)
            .map_err(|_| ParseError::NotUtf8),
    }
}

/// Decodes spec text (YAML or JSON: one parser for both, as the reference).
pub fn parse(bytes: &[u8]) -> Result<Spec, ParseError> {
    let text = decode_text(bytes)?;
    let node = yaml::parse(&text)?.ok_or(ParseError::NoData)?;
    let value = yaml::to_json(&node, &SPEC_SHAPE, "")?;
    if value.is_null() {
        return Err(ParseError::NoData);
    }
    serde_json::from_value(value).map_err(|e| ParseError::Decode(e.to_string()))
}

/// Reads, decodes and validates one spec file.
pub fn read_file(path: &Path) -> Result<Spec, SpecFileError> {
    read_file_with_meta(path).map(|(spec, _)| spec)
}

/// [`read_file`], with the `fstat` of the file it read (what [`super::index`] keys it by).
pub fn read_file_with_meta(path: &Path) -> Result<(Spec, std::fs::Metadata), SpecFileError> {
    let wrap = |source| SpecFileError {
        path: path.to_path_buf(),
        source: Box::new(source),
    };
    let (bytes, meta) = read_bytes_with_meta(path).map_err(wrap)?;
    let spec = parse(&bytes).map_err(|e| wrap(e.into()))?;
    spec.validate().map_err(|e| wrap(e.into()))?;
    Ok((spec, meta))
}

/// Reads a spec file without trusting what the directory holds ([`crate::hostfile`]: a FIFO
/// would otherwise block every `create` until something writes to it; symlinks followed, as
/// the reference reads them), at most [`MAX_SPEC_BYTES`].
pub fn read_bytes(path: &Path) -> Result<Vec<u8>, LoadError> {
    read_bytes_with_meta(path).map(|(bytes, _)| bytes)
}

fn read_bytes_with_meta(path: &Path) -> Result<(Vec<u8>, std::fs::Metadata), LoadError> {
    use crate::hostfile::Refused;
    crate::hostfile::read_with_meta(path, MAX_SPEC_BYTES).map_err(
        |e| match crate::hostfile::refused(&e) {
            Some(Refused::NotRegular(what)) => LoadError::NotRegular(what),
            Some(Refused::TooLarge { size, .. }) => LoadError::TooLarge(*size),
            None => LoadError::Read(e),
        },
    )
}

fn version_rank(v: &str) -> Option<usize> {
    KNOWN_VERSIONS.iter().position(|k| *k == v)
}

fn env_ok(v: &str) -> bool {
    // `strings.IndexByte(v, '=') <= 0` is invalid: `FOO=` is fine, `=x` and `FOO` are not.
    v.find('=').is_some_and(|i| i > 0)
}

/// `ContainerEdits.Validate` (docs/cdi-rules.md §2.3 step 4).
pub fn validate_edits(e: &ContainerEdits) -> Result<(), EditsError> {
    if let Some(v) = e.env.iter().find(|v| !env_ok(v)) {
        return Err(EditsError::Env(v.clone()));
    }
    for d in &e.device_nodes {
        if d.path.is_empty() {
            return Err(EditsError::EmptyDevicePath);
        }
        let kind = d.kind.as_deref().unwrap_or("");
        if !matches!(kind, "" | "b" | "c" | "u" | "p") {
            return Err(EditsError::DeviceType {
                path: d.path.clone(),
                kind: kind.into(),
            });
        }
        // `none` (HEAD, 90e09e4) asks for an empty cgroup access string.
        let perms = d.permissions.as_deref().unwrap_or("");
        if perms != "none" && !perms.chars().all(|c| matches!(c, 'r' | 'w' | 'm')) {
            return Err(EditsError::DevicePermissions {
                path: d.path.clone(),
                permissions: perms.into(),
            });
        }
    }
    for h in &e.hooks {
        if !HOOK_NAMES.contains(&h.hook_name.as_str()) {
            return Err(EditsError::HookName(h.hook_name.clone()));
        }
        if h.path.is_empty() {
            return Err(EditsError::HookPath(h.hook_name.clone()));
        }
        if let Some(v) = h.env.iter().flatten().find(|v| !env_ok(v)) {
            return Err(EditsError::HookEnv {
                hook: h.hook_name.clone(),
                var: v.clone(),
            });
        }
    }
    for m in &e.mounts {
        if m.host_path.is_empty() {
            return Err(EditsError::MountHostPath);
        }
        if m.container_path.is_empty() {
            return Err(EditsError::MountContainerPath);
        }
    }
    if let Some(clos) = e.intel_rdt.as_ref().and_then(|r| r.clos_id.as_deref()) {
        // "" and "/" (the root CLOS) are valid; otherwise a resctrl directory name.
        let bad = !matches!(clos, "" | "/")
            && (clos.len() >= 4096
                || clos == "."
                || clos == ".."
                || clos.contains('/')
                || clos.contains('\n'));
        if bad {
            return Err(EditsError::ClosId(clos.into()));
        }
    }
    // Sets: a spec may list many entries, and each check must stay linear.
    let mut hosts: HashSet<&str> = HashSet::new();
    let mut names: HashSet<&str> = HashSet::new();
    for n in &e.net_devices {
        if n.host_interface_name.is_empty() {
            return Err(EditsError::NetDeviceHostName);
        }
        if n.name.is_empty() {
            return Err(EditsError::NetDeviceName);
        }
        if !hosts.insert(&n.host_interface_name) {
            return Err(EditsError::NetDeviceDuplicateHostName(
                n.host_interface_name.clone(),
            ));
        }
        if !names.insert(&n.name) {
            return Err(EditsError::NetDeviceDuplicateName(n.name.clone()));
        }
    }
    Ok(())
}

impl Spec {
    /// Vendor and class of `kind` (both empty when it is not `vendor/class`).
    pub fn vendor_class(&self) -> (&str, &str) {
        name::parse_qualifier(&self.kind)
    }

    fn all_edits(&self) -> impl Iterator<Item = &ContainerEdits> {
        std::iter::once(&self.container_edits)
            .chain(self.devices.iter().map(|d| &d.container_edits))
    }

    /// The oldest spec version that can express this content (`MinimumRequiredVersion`,
    /// docs/cdi-rules.md §1.2): the newest version whose feature test holds, else 0.3.0.
    pub fn minimum_version(&self) -> &'static str {
        let any = |f: &dyn Fn(&ContainerEdits) -> bool| self.all_edits().any(f);
        if any(&|e| {
            !e.net_devices.is_empty()
                || e.intel_rdt
                    .as_ref()
                    .is_some_and(|r| r.schemata.is_some() || r.enable_monitoring == Some(true))
        }) {
            return "1.1.0";
        }
        if any(&|e| e.intel_rdt.is_some() || !e.additional_gids.is_empty()) {
            return "0.7.0";
        }
        let (_, class) = self.vendor_class();
        if !self.annotations.is_empty()
            || self.devices.iter().any(|d| !d.annotations.is_empty())
            || class.contains('.')
        {
            return "0.6.0";
        }
        if self
            .devices
            .iter()
            .any(|d| d.name.as_bytes().first().is_some_and(u8::is_ascii_digit))
            || any(&|e| {
                e.device_nodes
                    .iter()
                    .any(|d| d.host_path.as_deref().is_some_and(|h| !h.is_empty()))
            })
        {
            return "0.5.0";
        }
        if any(&|e| {
            e.mounts
                .iter()
                .any(|m| m.kind.as_deref().is_some_and(|t| !t.is_empty()))
        }) {
            return "0.4.0";
        }
        EARLIEST_VERSION
    }

    /// `ValidateVersion`: a known version (one leading `v` allowed) that is not older than the
    /// content needs.
    pub fn validate_version(&self) -> Result<(), SpecError> {
        let declared = self
            .cdi_version
            .strip_prefix('v')
            .unwrap_or(&self.cdi_version);
        let declared_rank = version_rank(declared).ok_or_else(|| SpecError::InvalidVersion {
            declared: self.cdi_version.clone(),
        })?;
        let required = self.minimum_version();
        // Ranks count from the newest: a larger rank is an older version.
        if version_rank(required).is_some_and(|r| r < declared_rank) {
            return Err(SpecError::VersionTooLow { required });
        }
        Ok(())
    }

    /// Hooks that give no `env`, each as `where: hookName path`. runc runs such a hook with
    /// the container's environment (an image's `LD_PRELOAD` included) under consumers that
    /// copy the spec as written; nvshim gives them its hook env ([`crate::edits::hook_env`]),
    /// and `nvshim cdi validate` warns so the spec can be fixed for every consumer.
    pub fn hooks_without_env(&self) -> Vec<String> {
        let global = std::iter::once(("containerEdits".to_string(), &self.container_edits));
        let devices = self
            .devices
            .iter()
            .map(|d| (format!("device {:?}", d.name), &d.container_edits));
        let mut out = Vec::new();
        for (place, edits) in global.chain(devices) {
            for h in &edits.hooks {
                if h.env.as_ref().is_none_or(Vec::is_empty) {
                    out.push(format!("{place}: {} hook {}", h.hook_name, h.path));
                }
            }
        }
        out
    }

    /// `Spec.validate` (docs/cdi-rules.md §2.3), first error wins.
    pub fn validate(&self) -> Result<(), SpecError> {
        self.validate_version()?;
        let (vendor, class) = self.vendor_class();
        name::validate_vendor_name(vendor).map_err(SpecError::Kind)?;
        name::validate_class_name(class).map_err(SpecError::Kind)?;
        // Spec and device annotations: the reference's check is a no-op when loading
        // (docs/cdi-rules.md §2.5), so none here either.
        validate_edits(&self.container_edits).map_err(SpecError::Edits)?;
        let mut seen: HashSet<&str> = HashSet::with_capacity(self.devices.len());
        for d in &self.devices {
            let fail = |source| SpecError::Device {
                name: d.name.clone(),
                source,
            };
            name::validate_device_name(&d.name).map_err(|e| fail(DeviceError::Name(e)))?;
            if d.container_edits.is_empty() {
                return Err(fail(DeviceError::EmptyEdits));
            }
            validate_edits(&d.container_edits).map_err(|source| {
                fail(DeviceError::Edits {
                    name: d.name.clone(),
                    source,
                })
            })?;
            if !seen.insert(&d.name) {
                return Err(SpecError::DuplicateDevice(d.name.clone()));
            }
        }
        if self.devices.is_empty() {
            return Err(SpecError::NoDevices);
        }
        Ok(())
    }

    /// The device named `name` (unqualified).
    pub fn device(&self, name: &str) -> Option<&Device> {
        self.devices.iter().find(|d| d.name == name)
    }

    /// Serialises as JSON (compact, as the reference writes JSON specs) or YAML.
    pub fn to_text(&self, format: Format) -> String {
        // A spec of strings, integers and maps always serialises.
        let value = serde_json::to_value(self).unwrap_or_default();
        match format {
            Format::Json => {
                let mut s = value.to_string();
                s.push('\n');
                s
            }
            Format::Yaml => yaml::emit(&value),
        }
    }
}

/// Output format of a spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    Yaml,
}

impl Format {
    /// From a file name: `.json` is JSON, anything else YAML (the reference's default).
    pub fn for_path(path: &Path) -> Format {
        match path.extension().and_then(|e| e.to_str()) {
            Some("json") => Format::Json,
            _ => Format::Yaml,
        }
    }
}
