//! One model of container edits, CDI's `containerEdits`, and the one function that applies
//! them to a config.json document.
//!
//! Legacy `NVIDIA_VISIBLE_DEVICES` requests are resolved against the host into this model
//! (`legacy`), CDI devices come from spec files in the same shape (`cdi`), and [`apply`] writes
//! either into the bundle. The serde shape is CDI's (docs/cdi-rules.md §2.1), so a spec's
//! `containerEdits` deserialises straight into [`ContainerEdits`].
//!
//! [`apply`] follows the CDI reference library (docs/cdi-rules.md §5.2: env, device nodes with
//! cgroup rules, net devices, mounts then a depth sort, hooks, intelRdt, additional gids) over a
//! `serde_json::Value`, so every field nvshim does not edit survives, including fields newer
//! than oci-spec knows. New entries are built through oci-spec's typed structs, but for mounts
//! (`mount_value` says why). One deliberate
//! difference: applying the same edits twice changes nothing the second time (an existing
//! device or mount with the same container path is replaced in place rather than moved to the
//! end, and identical cgroup rules and hooks are not appended again), because runtimes do call
//! `create` twice on one bundle (a retried create, a legacy hook after the shim).
//!
//! `create` applies them with [`apply_all_deferred`]: everything but the mounts, device nodes
//! and cgroup rules goes into the document, and those are written into config.json straight
//! from the edits ([`Deferred`]), in the order and form [`apply`] gives them (a test holds the
//! two to the same bytes).
//!
//! One file (1,180 lines of code, 570 of tests): one data type, [`ContainerEdits`], and the one
//! [`apply`] that writes it (built into the document, or deferred and written straight: one
//! merge, two outputs, held to the same bytes), with the helpers `apply` alone uses (path
//! cleaning, depth sort, device filling) and the legacy-hook removal and [`EditGroup`] that
//! work on the same document and the same model.

use foldhash::{HashMap, HashMapExt as _, HashSet};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::PathBuf;

use oci_spec::runtime::{HookBuilder, LinuxDeviceType};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use thiserror::Error;

use crate::bundle::{Bundle, MemberWriter};
use crate::host::Gpu;
use crate::json::Writer;

#[derive(Debug, Error)]
pub enum EditError {
    #[error("failed to stat host device {host_path:?} for {path}: {source}; the node is gone since the CDI spec was written (a reboot or driver change?): recreate it (`nvidia-smi` as root), or regenerate the spec with `nvshim cdi generate`")]
    StatDevice {
        path: String,
        host_path: String,
        source: std::io::Error,
    },
    #[error("host device {host_path:?} for {path} is not a device node; fix the CDI spec that names it, or regenerate it with `nvshim cdi generate`")]
    NotADevice { path: String, host_path: String },
    #[error("device {path} declares type {declared:?} but host {host_path:?} is type {host:?}; fix the type in the CDI spec, or regenerate it with `nvshim cdi generate`")]
    TypeMismatch {
        path: String,
        host_path: String,
        declared: String,
        host: String,
    },
    #[error("invalid device type {kind:?} for {path} (expected b, c, u or p); fix the CDI spec that declares it")]
    BadDeviceType { path: String, kind: String },
    #[error("unknown hook name {0:?}; a CDI hook's hookName must be prestart, createRuntime, createContainer, startContainer, poststart or poststop")]
    UnknownHook(String),
    #[error("config.json field {0} has an unexpected type; it must have the type the OCI runtime spec gives it (compare with `runc spec`)")]
    SpecShape(&'static str),
    #[error("cannot build {what}: {message}; this is a bug in nvshim, please report it with `nvshim explain` output")]
    Build { what: &'static str, message: String },
}

/// CDI `containerEdits`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContainerEdits {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub net_devices: Vec<NetDevice>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Hook>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intel_rdt: Option<IntelRdt>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub additional_gids: Vec<u32>,
}

/// CDI `deviceNodes` entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeviceNode {
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_mode: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
}

/// CDI `netDevices` entry (CDI 1.1.0).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetDevice {
    pub host_interface_name: String,
    pub name: String,
}

/// CDI `mounts` entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Mount {
    pub host_path: String,
    pub container_path: String,
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

impl Mount {
    /// Appends this mount to a cache file as one line (`crate::cache::line`): `tag`, the host
    /// path, the container path, the type (`crate::cache::optional_field`), then each option;
    /// `None` when a field holds a tab or newline.
    pub fn cache_line(&self, out: &mut Vec<u8>, tag: &[u8]) -> Option<()> {
        let kind = crate::cache::optional_field(self.kind.as_deref());
        let mut fields: Vec<&[u8]> = vec![
            tag,
            self.host_path.as_bytes(),
            self.container_path.as_bytes(),
            &kind,
        ];
        fields.extend(self.options.iter().map(|o| o.as_bytes()));
        crate::cache::line(out, &fields)
    }

    /// The mount [`Mount::cache_line`] wrote, from the fields after its tag.
    pub fn from_cache_fields<'a>(mut fields: impl Iterator<Item = &'a str>) -> Option<Mount> {
        Some(Mount {
            host_path: fields.next()?.to_string(),
            container_path: fields.next()?.to_string(),
            kind: crate::cache::parse_optional_field(fields.next()?)?,
            options: {
                // NVIDIA's mounts have five options; collecting grew the list twice a mount.
                let mut options = Vec::with_capacity(6);
                options.extend(fields.map(str::to_string));
                options
            },
        })
    }
}

/// CDI `hooks` entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Hook {
    pub hook_name: String,
    pub path: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<i64>,
}

/// CDI `intelRdt`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IntelRdt {
    #[serde(default, rename = "closID", skip_serializing_if = "Option::is_none")]
    pub clos_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub l3_cache_schema: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_bw_schema: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schemata: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_monitoring: Option<bool>,
}

/// The OCI hook lists a CDI `hookName` may name.
pub const HOOK_NAMES: &[&str] = &[
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
];

impl ContainerEdits {
    /// Appends `other` (CDI `Append`: lists concatenated, intelRdt replaced by the last one).
    pub fn append(&mut self, other: &ContainerEdits) {
        self.env.extend(other.env.iter().cloned());
        self.device_nodes.extend(other.device_nodes.iter().cloned());
        self.net_devices.extend(other.net_devices.iter().cloned());
        self.hooks.extend(other.hooks.iter().cloned());
        self.mounts.extend(other.mounts.iter().cloned());
        if other.intel_rdt.is_some() {
            self.intel_rdt = other.intel_rdt.clone();
        }
        self.additional_gids
            .extend(other.additional_gids.iter().copied());
    }

    pub fn is_empty(&self) -> bool {
        *self == ContainerEdits::default()
    }
}

/// Gets `obj[key]` as an object, creating it if missing.
fn object_at<'a>(
    obj: &'a mut Map<String, Value>,
    key: &str,
    name: &'static str,
) -> Result<&'a mut Map<String, Value>, EditError> {
    obj.entry(key)
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()
        .ok_or(EditError::SpecShape(name))
}

/// Gets `obj[key]` as an array, creating it if missing.
fn array_at<'a>(
    obj: &'a mut Map<String, Value>,
    key: &str,
    name: &'static str,
) -> Result<&'a mut Vec<Value>, EditError> {
    obj.entry(key)
        .or_insert_with(|| Value::Array(Vec::new()))
        .as_array_mut()
        .ok_or(EditError::SpecShape(name))
}

fn to_value<T: Serialize>(v: &T, what: &'static str) -> Result<Value, EditError> {
    serde_json::to_value(v).map_err(|e| EditError::Build {
        what,
        message: e.to_string(),
    })
}

/// Go's `filepath.Clean` on Unix (written here: the mount sort must count exactly what Go's
/// does, and it is a few lines), lexically: `//` and `.` dropped, `..` removes the part before
/// it (at the root it stays at the root; leading `..` of a relative path stay), `""` is `.`.
pub fn go_clean(path: &str) -> String {
    if is_clean(path) {
        return path.to_string();
    }
    clean_parts(path)
}

/// [`go_clean`] by splitting and joining the parts.
fn clean_parts(path: &str) -> String {
    let rooted = path.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if parts.last().is_some_and(|l| *l != "..") {
                    parts.pop();
                } else if !rooted {
                    parts.push("..");
                }
            }
            p => parts.push(p),
        }
    }
    let body = parts.join("/");
    if rooted {
        let mut out = String::with_capacity(body.len() + 1);
        out.push('/');
        out.push_str(&body);
        out
    } else if body.is_empty() {
        ".".into()
    } else {
        body
    }
}

/// Whether [`go_clean`] returns `path` as it is: not empty, no empty, `.` or `..` part, no
/// trailing `/` (but `/` itself). Most destinations are, and skip the split and join; the
/// mount sort asks it of every mount.
pub fn is_clean(path: &str) -> bool {
    if path == "/" {
        return true;
    }
    let body = path.strip_prefix('/').unwrap_or(path).as_bytes();
    !body.is_empty()
        && body
            .split(|&b| b == b'/')
            .all(|part| !(part.len() <= 2 && part.iter().all(|&c| c == b'.')))
}

/// The CDI mount sort key: the number of `/` in the cleaned destination, exactly as the
/// reference counts it. So `/` and `/a` tie, a relative `a/b` ties with `/a`, and `/a/../b` is
/// one level deep.
fn depth(destination: &str) -> usize {
    // Without an empty, `.` or `..` component an absolute path is its own cleaned form: no
    // allocation for the usual destination (the cleaning was most of a CDI create's mount sort).
    let clean = destination.starts_with('/') && is_clean(destination);
    if clean {
        destination.bytes().filter(|&b| b == b'/').count()
    } else {
        go_clean(destination).matches('/').count()
    }
}

/// The environment a CDI hook runs with. A hook without `env` would get its environment from
/// the runtime, which for runc is the container's (an image's `LD_PRELOAD` would then load
/// into a root process on the host), so every hook gets at least the one nvshim gives its own
/// hooks ([`crate::nvidia::HOOK_ENV`]). An `env` the spec gives is kept as written: whoever
/// writes the spec already chooses the binary the hook runs, so its variables add no power.
pub fn hook_env(spec_env: Option<&[String]>) -> Vec<String> {
    match spec_env {
        Some(env) if !env.is_empty() => env.to_vec(),
        _ => vec![crate::nvidia::HOOK_ENV.to_string()],
    }
}

/// `linux.intelRdt` as the reference writes it: its Go fields are `omitempty`, so empty strings,
/// an empty `schemata` and a false `enableMonitoring` are left out.
fn intel_rdt_value(rdt: &IntelRdt) -> Value {
    let mut out = Map::new();
    let mut text = |key: &str, v: &Option<String>| {
        if let Some(v) = v.as_deref().filter(|v| !v.is_empty()) {
            out.insert(key.into(), Value::String(v.into()));
        }
    };
    text("closID", &rdt.clos_id);
    text("l3CacheSchema", &rdt.l3_cache_schema);
    text("memBwSchema", &rdt.mem_bw_schema);
    if let Some(s) = rdt.schemata.as_ref().filter(|s| !s.is_empty()) {
        out.insert(
            "schemata".into(),
            Value::Array(s.iter().cloned().map(Value::String).collect()),
        );
    }
    if rdt.enable_monitoring == Some(true) {
        out.insert("enableMonitoring".into(), Value::Bool(true));
    }
    Value::Object(out)
}

/// Fills type, major, minor and mode of a device node from its host node (CDI
/// `fillMissingInfo`, docs/cdi-rules.md §5.4): `lstat`, symlinks not followed.
pub fn fill_device(d: &DeviceNode) -> Result<DeviceNode, EditError> {
    let mut d = d.clone();
    let host_path = d.host_path.clone().unwrap_or_else(|| d.path.clone());
    let kind = d.kind.clone().unwrap_or_default();
    let minimal = !kind.is_empty() && (d.major.unwrap_or(0) != 0 || kind == "p");
    // A minimal node with its mode takes nothing from the host (the reference returns right
    // after filling `fileMode`), so the stat is skipped: legacy nodes are fully described, and
    // their container path is not where the host's node is when dev-root is not `/`.
    if minimal && d.file_mode.is_some() {
        return Ok(d);
    }
    let meta = match std::fs::symlink_metadata(&host_path) {
        Ok(m) => m,
        Err(_) if minimal => return Ok(d),
        Err(source) => {
            return Err(EditError::StatDevice {
                path: d.path.clone(),
                host_path,
                source,
            })
        }
    };
    let ft = meta.file_type();
    let host_kind = if ft.is_block_device() {
        "b"
    } else if ft.is_char_device() {
        "c"
    } else if ft.is_fifo() {
        "p"
    } else {
        return Err(EditError::NotADevice {
            path: d.path.clone(),
            host_path,
        });
    };
    if d.file_mode.is_none() {
        d.file_mode = Some(meta.mode() & 0o7777);
    }
    if minimal {
        return Ok(d);
    }
    if kind.is_empty() {
        d.kind = Some(host_kind.to_string());
    } else if kind != host_kind {
        return Err(EditError::TypeMismatch {
            path: d.path.clone(),
            host_path,
            declared: kind,
            host: host_kind.into(),
        });
    }
    if host_kind == "p" {
        return Ok(d);
    }
    if d.major.unwrap_or(0) == 0 {
        let rdev = meta.rdev();
        d.major = Some(nix::sys::stat::major(rdev) as i64);
        d.minor = Some(nix::sys::stat::minor(rdev) as i64);
    }
    Ok(d)
}

fn device_type(path: &str, kind: &str) -> Result<LinuxDeviceType, EditError> {
    Ok(match kind {
        "b" => LinuxDeviceType::B,
        "c" => LinuxDeviceType::C,
        "u" => LinuxDeviceType::U,
        "p" => LinuxDeviceType::P,
        _ => {
            return Err(EditError::BadDeviceType {
                path: path.into(),
                kind: kind.into(),
            })
        }
    })
}

fn build_err(what: &'static str) -> impl Fn(oci_spec::OciSpecError) -> EditError {
    move |e| EditError::Build {
        what,
        message: e.to_string(),
    }
}

/// A cgroup rule as a string that is equal for equal rules whatever their key order (what
/// `Value`'s own equality also ignores).
fn canonical(v: &Value) -> String {
    match v.as_object() {
        Some(map) => {
            // JSON, not Debug: the same key, several times cheaper to build (a MIG `all` create
            // compares some hundred rules).
            let sorted: std::collections::BTreeMap<&String, &Value> = map.iter().collect();
            serde_json::to_string(&sorted).unwrap_or_default()
        }
        None => v.to_string(),
    }
}

/// A device node as oci-spec's `LinuxDevice` serialises it (path, type, major, minor, then
/// fileMode, uid and gid when set), built directly, as [`mount_value`] is: a MIG `all` create
/// writes 124 nodes and as many cgroup rules, and the builders, `to_value` and [`canonical`]
/// took 1.1 M of its 7.2 M instructions (callgrind). A test holds both to the builders' output.
/// `kind` is checked by [`device_type`] first.
fn device_value(n: &AddedNode) -> Value {
    let d = &n.node;
    let mut out = Map::with_capacity(7);
    out.insert("path".into(), Value::String(d.path.clone()));
    out.insert("type".into(), Value::String(n.kind.clone()));
    out.insert("major".into(), Value::from(d.major.unwrap_or(0)));
    out.insert("minor".into(), Value::from(d.minor.unwrap_or(0)));
    if let Some(m) = d.file_mode {
        out.insert("fileMode".into(), Value::from(m));
    }
    if let Some(uid) = d.uid {
        out.insert("uid".into(), Value::from(uid));
    }
    if let Some(gid) = d.gid {
        out.insert("gid".into(), Value::from(gid));
    }
    Value::Object(out)
}

/// [`device_value`]'s object written directly: the same members in the same order.
fn write_node(w: &mut Writer, n: &AddedNode) {
    let d = &n.node;
    w.object(|o| {
        o.key("path").string(&d.path);
        o.key("type").string(&n.kind);
        o.key("major").value(&Value::from(d.major.unwrap_or(0)));
        o.key("minor").value(&Value::from(d.minor.unwrap_or(0)));
        if let Some(m) = d.file_mode {
            o.key("fileMode").value(&Value::from(m));
        }
        if let Some(uid) = d.uid {
            o.key("uid").value(&Value::from(uid));
        }
        if let Some(gid) = d.gid {
            o.key("gid").value(&Value::from(gid));
        }
    });
}

/// An allowing cgroup rule for a `b` or `c` node as oci-spec's `LinuxDeviceCgroup` serialises
/// it (`access` left out when empty: `omitempty` in the reference, what `permissions: none`
/// gives).
fn rule_value(r: &Rule) -> Value {
    let mut out = Map::with_capacity(5);
    out.insert("allow".into(), Value::Bool(true));
    out.insert("type".into(), Value::String(r.kind.clone()));
    out.insert("major".into(), Value::from(r.major));
    out.insert("minor".into(), Value::from(r.minor));
    if !r.access.is_empty() {
        out.insert("access".into(), Value::String(r.access.clone()));
    }
    Value::Object(out)
}

/// [`rule_value`]'s object written directly: the same members in the same order.
fn write_rule(w: &mut Writer, r: &Rule) {
    w.object(|o| {
        o.key("allow").value(&Value::Bool(true));
        o.key("type").string(&r.kind);
        o.key("major").value(&Value::from(r.major));
        o.key("minor").value(&Value::from(r.minor));
        if !r.access.is_empty() {
            o.key("access").string(&r.access);
        }
    });
}

/// A rule's [`canonical`] key, written without building and sorting a map.
fn rule_key(kind: &str, major: i64, minor: i64, access: &str) -> String {
    // Pushed piece by piece: `format!` and `to_string` made this a sixth of `apply_all` on a
    // MIG `all` create's 125 rules (callgrind).
    let mut key = String::with_capacity(64);
    key.push('{');
    if !access.is_empty() {
        key.push_str("\"access\":");
        push_json_str(&mut key, access);
        key.push(',');
    }
    key.push_str("\"allow\":true,\"major\":");
    key.push_str(itoa::Buffer::new().format(major));
    key.push_str(",\"minor\":");
    key.push_str(itoa::Buffer::new().format(minor));
    key.push_str(",\"type\":");
    push_json_str(&mut key, kind);
    key.push('}');
    key
}

/// `s` as a JSON string, as serde_json writes it.
fn push_json_str(out: &mut String, s: &str) {
    if s.bytes()
        .all(|b| b >= 0x20 && b != b'"' && b != b'\\' && b < 0x7f)
    {
        out.push('"');
        out.push_str(s);
        out.push('"');
    } else {
        out.push_str(&Value::String(s.to_string()).to_string());
    }
}

/// Each key's first position in a list (`None` keys are left out), for constant-time lookups.
/// `v`'s member `name`, found by walking its members: a mount or a device node has a handful,
/// and `Value::get` hashes the name with SipHash first (serde_json's map is an `IndexMap` with
/// std's hasher); walking cost a CDI create's 72 mounts a third of the look-ups' instructions.
fn member<'a>(v: &'a Value, name: &str) -> Option<&'a Value> {
    v.as_object()?
        .iter()
        .find_map(|(k, v)| (k == name).then_some(v))
}

fn first_index(keys: impl Iterator<Item = Option<String>>) -> HashMap<String, usize> {
    let mut index = HashMap::new();
    for (i, key) in keys.enumerate() {
        if let Some(key) = key {
            index.entry(key).or_insert(i);
        }
    }
    index
}

/// A mount as oci-spec's `Mount` serialises it (destination, type, source, options; its
/// builder checks only id mappings, which nvshim never sets), built directly: a CDI spec brings
/// 60 and more mounts, and the builder and `to_value` were a tenth of such a create
/// (callgrind, docs/benchmarks.md). A test holds it to the builder's output.
fn mount_value(m: &Mount) -> Value {
    let mut out = Map::with_capacity(4);
    out.insert(
        "destination".into(),
        Value::String(m.container_path.clone()),
    );
    if let Some(t) = &m.kind {
        out.insert("type".into(), Value::String(t.clone()));
    }
    out.insert("source".into(), Value::String(m.host_path.clone()));
    if !m.options.is_empty() {
        let options = m.options.iter().cloned().map(Value::String).collect();
        out.insert("options".into(), Value::Array(options));
    }
    Value::Object(out)
}

/// Applies `edits` to the config.json document. Validation of the edits (CDI rules) happens
/// before; host device nodes are stat'ed here. Nothing is written to disk.
pub fn apply(spec: &mut Value, edits: &ContainerEdits) -> Result<(), EditError> {
    apply_all(spec, &[edits])
}

/// Applies `parts` as [`apply`] would apply their concatenation ([`ContainerEdits::append`]),
/// without building it: a plan keeps its edits grouped by cause, and a copy of a MIG host's
/// 120 device nodes and the driver's mounts cost a tenth of the create.
pub fn apply_all(spec: &mut Value, parts: &[&ContainerEdits]) -> Result<(), EditError> {
    apply_all_deferred(spec, parts)?.materialize(spec, parts)
}

/// [`apply_all`], but for the mounts, device nodes and cgroup rules the edits add: the
/// document's `mounts`, `linux.devices` and `linux.resources.devices` stay as they were (made
/// where missing), and what they become is returned ([`Deferred`]).
pub fn apply_all_deferred(
    spec: &mut Value,
    parts: &[&ContainerEdits],
) -> Result<Deferred, EditError> {
    if parts.iter().all(|e| e.is_empty()) {
        return Ok(Deferred::default());
    }
    // Resolve everything that can fail on the host first, so a failure leaves `spec` unchanged.
    let devices: Vec<DeviceNode> = parts
        .iter()
        .flat_map(|e| &e.device_nodes)
        .map(fill_device)
        .collect::<Result<_, _>>()?;
    for h in parts.iter().flat_map(|e| &e.hooks) {
        if !HOOK_NAMES.contains(&h.hook_name.as_str()) {
            return Err(EditError::UnknownHook(h.hook_name.clone()));
        }
    }
    let root = spec.as_object_mut().ok_or(EditError::SpecShape("(root)"))?;
    let process_user = |root: &Map<String, Value>, key: &str| {
        root.get("process")
            .and_then(|p| p.get("user"))
            .and_then(|u| u.get(key))
            .and_then(Value::as_u64)
            .filter(|v| *v > 0)
            .map(|v| v as u32)
    };
    let (user_uid, user_gid) = (process_user(root, "uid"), process_user(root, "gid"));

    // env: replace by key in place, else append (CDI HEAD semantics, docs/cdi-rules.md §5.3).
    if parts.iter().any(|e| !e.env.is_empty()) {
        let process = object_at(root, "process", "process")?;
        let env = array_at(process, "env", "process.env")?;
        // The key is what precedes '=', or the whole entry when it has none, on both sides:
        // keyed any other way, an entry without '=' is appended again on every apply
        // (fuzz/corpus/bundle_edits/seed-regression-env-without-equals).
        let env_key = |e: &str| e.split_once('=').map_or(e, |(k, _)| k).to_string();
        // Key → index of its first entry: each lookup constant, so large edits stay linear.
        let mut index = first_index(env.iter().map(|v| v.as_str().map(env_key)));
        for entry in parts.iter().flat_map(|e| &e.env) {
            let value = Value::String(entry.clone());
            match index.get(&env_key(entry)) {
                Some(&i) => env[i] = value,
                None => {
                    index.insert(env_key(entry), env.len());
                    env.push(value);
                }
            }
        }
    }

    // Device nodes and their cgroup rules.
    let devices = if devices.is_empty() {
        None
    } else {
        let mut nodes = Vec::with_capacity(devices.len());
        let mut rules = Vec::new();
        for mut d in devices {
            let kind = d.kind.clone().unwrap_or_default();
            let typ = device_type(&d.path, &kind)?;
            if matches!(typ, LinuxDeviceType::B | LinuxDeviceType::C) {
                let access = match d.permissions.as_deref() {
                    None | Some("") => "rwm",
                    Some("none") => "",
                    Some(p) => p,
                };
                rules.push(Rule {
                    kind: kind.clone(),
                    major: d.major.unwrap_or(0),
                    minor: d.minor.unwrap_or(0),
                    access: access.to_string(),
                });
            }
            d.uid = d.uid.or(user_uid);
            d.gid = d.gid.or(user_gid);
            nodes.push(AddedNode { node: d, kind });
        }
        let linux = object_at(root, "linux", "linux")?;
        let own = array_at(linux, "devices", "linux.devices")?;
        let order = merge(
            own,
            "path",
            nodes.iter().map(|n| n.node.path.as_str()).enumerate(),
        );
        let rules = if rules.is_empty() {
            rules
        } else {
            let resources = object_at(linux, "resources", "linux.resources")?;
            let list = array_at(resources, "devices", "linux.resources.devices")?;
            let mut seen: HashSet<String> = list.iter().map(canonical).collect();
            rules.retain(|r| seen.insert(r.key()));
            rules
        };
        Some(DeferredDevices {
            order,
            nodes,
            rules,
        })
    };

    // Net devices: a map keyed by host interface name, last wins.
    if parts.iter().any(|e| !e.net_devices.is_empty()) {
        let linux = object_at(root, "linux", "linux")?;
        let net = object_at(linux, "netDevices", "linux.netDevices")?;
        for n in parts.iter().flat_map(|e| &e.net_devices) {
            let mut entry = Map::new();
            entry.insert("name".into(), Value::String(n.name.clone()));
            net.insert(n.host_interface_name.clone(), Value::Object(entry));
        }
    }

    // Mounts: the first with the same destination removed, each appended; then a stable sort
    // by depth.
    let mounts = if parts.iter().any(|e| !e.mounts.is_empty()) {
        let own = array_at(root, "mounts", "mounts")?;
        Some(DeferredMounts::merge(own, parts))
    } else {
        None
    };

    // Hooks: appended to the named list unless an identical one is there.
    if parts.iter().any(|e| !e.hooks.is_empty()) {
        let hooks = object_at(root, "hooks", "hooks")?;
        for h in parts.iter().flat_map(|e| &e.hooks) {
            let mut b = HookBuilder::default().path(&h.path);
            if !h.args.is_empty() {
                b = b.args(h.args.clone());
            }
            b = b.env(hook_env(h.env.as_deref()));
            if let Some(t) = h.timeout {
                b = b.timeout(t);
            }
            let hook = to_value(&b.build().map_err(build_err("hook"))?, "hook")?;
            let list = array_at(hooks, &h.hook_name, "hooks")?;
            if !list.contains(&hook) {
                list.push(hook);
            }
        }
    }

    // The last part's wins, as in `append`.
    if let Some(rdt) = parts.iter().rev().find_map(|e| e.intel_rdt.as_ref()) {
        let linux = object_at(root, "linux", "linux")?;
        linux.insert("intelRdt".into(), intel_rdt_value(rdt));
    }

    // Additional gids: 0 and duplicates skipped.
    if parts.iter().any(|e| !e.additional_gids.is_empty()) {
        let process = object_at(root, "process", "process")?;
        let user = object_at(process, "user", "process.user")?;
        let gids = array_at(user, "additionalGids", "process.user.additionalGids")?;
        for g in parts.iter().flat_map(|e| &e.additional_gids) {
            let v = Value::from(*g);
            if *g != 0 && !gids.contains(&v) {
                gids.push(v);
            }
        }
    }
    Ok(Deferred { mounts, devices })
}

/// What [`apply_all_deferred`] leaves out of the document: the mounts, device nodes and cgroup
/// rules the edits add, kept as the edits' own, in their final places. `create` writes them
/// straight into config.json ([`Deferred::render`]); [`Deferred::materialize`] builds them
/// into the document (what [`apply_all`] gives). Built first, each mount was a map of four
/// members and its options a list of strings, a dozen allocations, and each device node and
/// rule a map of five to seven: a CDI create on NVIDIA's 8-GPU spec adds 65 mounts and a MIG
/// `all` create 124 nodes with as many rules (docs/benchmarks.md has what writing them
/// directly saved).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Deferred {
    mounts: Option<DeferredMounts>,
    devices: Option<DeferredDevices>,
}

impl Deferred {
    /// Builds what was deferred into `spec`, as [`apply_all`] leaves it. `spec` and `parts`
    /// are the ones [`apply_all_deferred`] had.
    pub fn materialize(
        &self,
        spec: &mut Value,
        parts: &[&ContainerEdits],
    ) -> Result<(), EditError> {
        if let Some(mounts) = &self.mounts {
            mounts.materialize(spec, parts)?;
        }
        if let Some(devices) = &self.devices {
            devices.materialize(spec)?;
        }
        Ok(())
    }

    /// `spec` as [`crate::bundle::Bundle::render_spec`] writes it with what was deferred
    /// built in, byte for byte, without building it.
    pub fn render(&self, bundle: &Bundle, spec: &Value, parts: &[&ContainerEdits]) -> Vec<u8> {
        let mut members: Vec<MemberWriter<'_>> = Vec::new();
        let (mounts, nodes, rules);
        if let Some(m) = &self.mounts {
            mounts = move |w: &mut Writer, own: &Value| m.write(w, own, parts);
            members.push((&["mounts"], &mounts));
        }
        if let Some(d) = &self.devices {
            nodes = move |w: &mut Writer, own: &Value| d.write_nodes(w, own);
            members.push((&["linux", "devices"], &nodes));
            if !d.rules.is_empty() {
                rules = move |w: &mut Writer, own: &Value| d.write_rules(w, own);
                members.push((&["linux", "resources", "devices"], &rules));
            }
        }
        bundle.render_spec_with(spec, &members)
    }

    /// [`Bundle::write_changed`] of what [`Deferred::render`] writes.
    pub fn save_changed(
        &self,
        bundle: &Bundle,
        spec: &Value,
        parts: &[&ContainerEdits],
    ) -> Result<bool, crate::bundle::BundleError> {
        bundle.write_changed(&self.render(bundle, spec, parts))
    }

    /// The bind mounts ([`binds`]) of the document's final `mounts`.
    pub fn binds<'a>(
        &'a self,
        spec: &'a Value,
        parts: &[&'a ContainerEdits],
    ) -> Vec<(&'a str, &'a str)> {
        match &self.mounts {
            Some(mounts) => mounts.binds(spec, parts),
            None => binds(spec),
        }
    }
}

/// A device node an edit adds: filled from the host, its uid and gid defaulted to the
/// process's, and its type.
#[derive(Debug, Clone, PartialEq, Eq)]
struct AddedNode {
    node: DeviceNode,
    kind: String,
}

/// An allowing cgroup rule an edit adds.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    kind: String,
    major: i64,
    minor: i64,
    access: String,
}

impl Rule {
    /// [`rule_value`]'s key: its [`canonical`] form.
    fn key(&self) -> String {
        rule_key(&self.kind, self.major, self.minor, &self.access)
    }
}

/// Where an entry of a deferred list of the edited document comes from: the document's own
/// list as loaded (its index), or an edit (`A` says where among the added).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum At<A> {
    Own(usize),
    Added(A),
}

/// The CDI reference's merge of entries into a list: each replaces the first entry with its
/// key (the own entries' member `name`, or an entry added before it), else is appended.
fn merge<'a, A>(
    own: &'a [Value],
    name: &str,
    added: impl Iterator<Item = (A, &'a str)>,
) -> Vec<At<A>> {
    let mut order: Vec<At<A>> = (0..own.len()).map(At::Own).collect();
    let mut index: HashMap<&str, usize> = HashMap::with_capacity(own.len());
    for (i, v) in own.iter().enumerate() {
        if let Some(key) = member(v, name).and_then(Value::as_str) {
            index.entry(key).or_insert(i);
        }
    }
    for (a, key) in added {
        match index.get(key) {
            Some(&at) => order[at] = At::Added(a),
            None => {
                index.insert(key, order.len());
                order.push(At::Added(a));
            }
        }
    }
    order
}

/// The CDI reference's merge of mounts into a list: each added entry removes the first entry
/// with its key (an own entry's member `name`, or an entry added before it) and is appended.
fn remove_and_append<'a, A>(
    own: &'a [Value],
    name: &str,
    added: impl Iterator<Item = (A, &'a str)>,
) -> Vec<At<A>> {
    let mut order: Vec<Option<At<A>>> = (0..own.len()).map(|i| Some(At::Own(i))).collect();
    let mut keys: Vec<Option<&str>> = own
        .iter()
        .map(|v| member(v, name).and_then(Value::as_str))
        .collect();
    // The first live entry of each key.
    let mut first: HashMap<&str, usize> = HashMap::with_capacity(own.len());
    for (i, key) in keys.iter().enumerate() {
        if let Some(key) = key {
            first.entry(key).or_insert(i);
        }
    }
    for (a, key) in added {
        let end = order.len();
        order.push(Some(At::Added(a)));
        keys.push(Some(key));
        let next = match first.get(key) {
            Some(&at) => {
                order[at] = None;
                // Rare (a destination given twice): the next live entry of the key, else the
                // one just appended.
                (at + 1..=end)
                    .find(|&j| order[j].is_some() && keys[j] == Some(key))
                    .unwrap_or(end)
            }
            None => end,
        };
        first.insert(key, next);
    }
    order.into_iter().flatten().collect()
}

/// The list `own` rebuilt in `order`, an added entry built by `added`.
fn rebuild<A: Copy>(own: &mut Vec<Value>, order: &[At<A>], added: impl Fn(A) -> Value) {
    let mut taken: Vec<Option<Value>> = std::mem::take(own).into_iter().map(Some).collect();
    *own = order
        .iter()
        .map(|at| match *at {
            At::Own(i) => taken[i].take().unwrap_or_default(),
            At::Added(a) => added(a),
        })
        .collect();
}

/// The list `own` (the document's as loaded) in `order` written, byte for byte what writing
/// the [`rebuild`] list writes when `write_added` writes what `added` builds.
fn write_list<A: Copy>(
    w: &mut Writer,
    own: &Value,
    order: &[At<A>],
    write_added: impl Fn(&mut Writer, A),
) {
    let own = own.as_array().map_or(&[][..], Vec::as_slice);
    w.array(|items| {
        for at in order {
            match *at {
                At::Own(i) => items.item().value(&own[i]),
                At::Added(a) => write_added(items.item(), a),
            }
        }
    });
}

/// A device node's place: its index among the added.
type NodeAt = At<usize>;

/// `linux.devices` after the edits (a node replaces the first with its path, else is
/// appended), and the rules appended to `linux.resources.devices` (those not there already).
#[derive(Debug, Clone, PartialEq, Eq)]
struct DeferredDevices {
    order: Vec<NodeAt>,
    nodes: Vec<AddedNode>,
    rules: Vec<Rule>,
}

impl DeferredDevices {
    fn materialize(&self, spec: &mut Value) -> Result<(), EditError> {
        let root = spec.as_object_mut().ok_or(EditError::SpecShape("(root)"))?;
        let linux = object_at(root, "linux", "linux")?;
        let own = array_at(linux, "devices", "linux.devices")?;
        rebuild(own, &self.order, |k| device_value(&self.nodes[k]));
        if !self.rules.is_empty() {
            let resources = object_at(linux, "resources", "linux.resources")?;
            let list = array_at(resources, "devices", "linux.resources.devices")?;
            list.extend(self.rules.iter().map(rule_value));
        }
        Ok(())
    }

    /// `linux.devices` (`own`, the document's as loaded) as [`DeferredDevices::materialize`]
    /// leaves it, written.
    fn write_nodes(&self, w: &mut Writer, own: &Value) {
        write_list(w, own, &self.order, |w, k| write_node(w, &self.nodes[k]));
    }

    /// `linux.resources.devices` (`own`) with the rules appended, written.
    fn write_rules(&self, w: &mut Writer, own: &Value) {
        let own = own.as_array().map_or(&[][..], Vec::as_slice);
        w.array(|items| {
            for v in own {
                items.item().value(v);
            }
            for r in &self.rules {
                write_rule(items.item(), r);
            }
        });
    }
}

/// A mount's place: its part's index in the parts applied, and its index there.
type MountAt = At<(usize, usize)>;

/// The document's `mounts` after the edits, in their final order, the added ones as the
/// positions of the edits' own ([`Deferred`]).
#[derive(Debug, Clone, PartialEq, Eq)]
struct DeferredMounts {
    order: Vec<MountAt>,
}

impl DeferredMounts {
    /// The CDI reference's merge (docs/cdi-rules.md §5.5): an added
    /// mount removes the first mount with its destination and is appended; then a stable sort
    /// by the destination's depth (each computed once, a cleaned path per mount, not once per
    /// comparison). Removing rather than replacing in place matters where the depth ties: the
    /// added mount goes after the mounts of its depth, as in the reference.
    fn merge(own: &[Value], parts: &[&ContainerEdits]) -> DeferredMounts {
        let added = parts.iter().enumerate().flat_map(|(p, part)| {
            (part.mounts.iter().enumerate()).map(move |(i, m)| ((p, i), m.container_path.as_str()))
        });
        let mut order = remove_and_append(own, "destination", added);
        let destination = |at: &MountAt| match *at {
            At::Own(i) => member(&own[i], "destination")
                .and_then(Value::as_str)
                .unwrap_or(""),
            At::Added((p, i)) => &parts[p].mounts[i].container_path,
        };
        order.sort_by_cached_key(|at| depth(destination(at)));
        DeferredMounts { order }
    }

    /// Builds the mounts into `spec`, as [`apply_all`] leaves them. `spec` and `parts` are the
    /// ones [`apply_all_deferred`] had.
    pub fn materialize(
        &self,
        spec: &mut Value,
        parts: &[&ContainerEdits],
    ) -> Result<(), EditError> {
        let root = spec.as_object_mut().ok_or(EditError::SpecShape("(root)"))?;
        let own = array_at(root, "mounts", "mounts")?;
        rebuild(own, &self.order, |(p, i)| mount_value(&parts[p].mounts[i]));
        Ok(())
    }

    /// Writes the mounts as the `mounts` member of `spec` (`own`, the document's as loaded),
    /// byte for byte what writing the materialized list writes.
    fn write(&self, w: &mut Writer, own: &Value, parts: &[&ContainerEdits]) {
        write_list(w, own, &self.order, |w, (p, i)| {
            write_mount(w, &parts[p].mounts[i])
        });
    }

    /// The bind mounts ([`binds`]) of the document's final `mounts`.
    fn binds<'a>(
        &'a self,
        spec: &'a Value,
        parts: &[&'a ContainerEdits],
    ) -> Vec<(&'a str, &'a str)> {
        let own = spec
            .get("mounts")
            .and_then(Value::as_array)
            .map_or(&[][..], Vec::as_slice);
        self.order
            .iter()
            .filter_map(|at| match *at {
                At::Own(i) => bind_of(&own[i]),
                At::Added((p, i)) => {
                    let m = &parts[p].mounts[i];
                    let bind = m.kind.as_deref() == Some("bind")
                        || m.options.iter().any(|o| o == "bind" || o == "rbind");
                    bind.then_some((m.container_path.as_str(), m.host_path.as_str()))
                }
            })
            .collect()
    }
}

/// The bind mounts of `spec` (by their type or options), as (destination, source; empty when
/// it has none).
pub fn binds(spec: &Value) -> Vec<(&str, &str)> {
    spec.get("mounts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(bind_of)
        .collect()
}

/// A bind mount's destination and source (empty when it has none); `None` for another mount or
/// one without a destination. The mount's few members are walked once: looking each up by name
/// hashed the name with SipHash, four times a mount (a fifth of the mount check on a CDI
/// create).
fn bind_of(m: &Value) -> Option<(&str, &str)> {
    let (mut destination, mut source, mut bind) = (None, "", false);
    for (key, value) in m.as_object()? {
        match key.as_str() {
            "destination" => destination = value.as_str(),
            "source" => source = value.as_str().unwrap_or(""),
            "type" => bind |= value.as_str() == Some("bind"),
            "options" => {
                bind |= value
                    .as_array()
                    .is_some_and(|o| o.iter().any(|o| o == "bind" || o == "rbind"))
            }
            _ => {}
        }
    }
    destination.filter(|_| bind).map(|d| (d, source))
}

/// [`mount_value`]'s object written directly: the same members in the same order.
fn write_mount(w: &mut Writer, m: &Mount) {
    w.object(|o| {
        o.key("destination").string(&m.container_path);
        if let Some(t) = &m.kind {
            o.key("type").string(t);
        }
        o.key("source").string(&m.host_path);
        if !m.options.is_empty() {
            o.key("options").array(|items| {
                for option in &m.options {
                    items.item().string(option);
                }
            });
        }
    });
}

/// Basenames of NVIDIA's legacy prestart hook. dockerd adds it for `docker run --gpus`
/// (moby daemon/nvidia_linux.go: `nvidia-container-runtime-hook prestart`, found on dockerd's
/// PATH); `nvidia-container-toolkit` is its older alias.
pub const LEGACY_HOOK_NAMES: &[&str] =
    &["nvidia-container-runtime-hook", "nvidia-container-toolkit"];

fn is_legacy_hook(hook: &Value) -> bool {
    hook.get("path")
        .and_then(Value::as_str)
        .and_then(|p| p.rsplit('/').next())
        .is_some_and(|base| LEGACY_HOOK_NAMES.contains(&base))
}

/// True when the spec carries NVIDIA's legacy prestart hook (Docker's `--gpus`).
pub fn has_legacy_hook(spec: &Value) -> bool {
    spec.pointer("/hooks/prestart")
        .and_then(Value::as_array)
        .is_some_and(|hooks| hooks.iter().any(is_legacy_hook))
}

/// Removes NVIDIA's legacy prestart hook: nvshim does its work itself, and the hook would do it
/// a second time out of band (NVIDIA's runtime does the same in CDI mode: hook_remover.go).
pub fn remove_legacy_hooks(spec: &mut Value) {
    if let Some(hooks) = spec
        .pointer_mut("/hooks/prestart")
        .and_then(Value::as_array_mut)
    {
        hooks.retain(|h| !is_legacy_hook(h));
    }
}

/// What caused a group of edits: one type for the legacy resolver's, the CDI registry's and
/// the memory-limit hook's groups, which `nvshim explain` prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cause {
    /// A GPU a legacy request selected: its device node (and so its cgroup rule).
    Gpu(Gpu),
    /// What a legacy request needs whichever GPUs it selects: control nodes, the driver's
    /// libraries and binaries, the hooks.
    Driver,
    /// A CDI spec's global edits, added with the first requested device it provides.
    CdiSpec { path: PathBuf, kind: String },
    /// A requested CDI device's own edits.
    CdiDevice { name: String, path: PathBuf },
    /// `NVIDIA_GPU_MEMORY_REQUEST` and `NVIDIA_GPU_MEMORY_LIMIT`: the hook that applies them.
    GpuMemoryLimits,
    /// A feature-gated request (`NVIDIA_GDS=enabled` and the like): its nodes and files.
    Feature(crate::host::gated::Feature),
}

/// Edits and their cause.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EditGroup {
    pub cause: Cause,
    pub edits: ContainerEdits,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn null_device() -> DeviceNode {
        DeviceNode {
            path: "/dev/null".into(),
            ..Default::default()
        }
    }

    #[test]
    fn device_from_host_with_cgroup_rule() {
        let mut spec =
            json!({"linux": {"resources": {"devices": [{"allow": false, "access": "rwm"}]}}});
        let edits = ContainerEdits {
            device_nodes: vec![null_device()],
            ..Default::default()
        };
        apply(&mut spec, &edits).unwrap();
        assert_eq!(
            spec["linux"]["devices"],
            json!([{"path": "/dev/null", "type": "c", "major": 1, "minor": 3, "fileMode": 0o666}])
        );
        assert_eq!(
            spec["linux"]["resources"]["devices"],
            json!([{"allow": false, "access": "rwm"}, {"allow": true, "type": "c", "major": 1, "minor": 3, "access": "rwm"}])
        );
    }

    #[test]
    fn fully_described_node_is_not_stated_on_the_host() {
        let mut spec = json!({});
        let edits = ContainerEdits {
            device_nodes: vec![DeviceNode {
                path: "/dev/nvidia7".into(),
                host_path: Some("/nonexistent/dev/nvidia7".into()),
                kind: Some("c".into()),
                major: Some(195),
                minor: Some(7),
                file_mode: Some(0o666),
                ..Default::default()
            }],
            ..Default::default()
        };
        apply(&mut spec, &edits).unwrap();
        assert_eq!(spec["linux"]["devices"][0]["minor"], 7);
    }

    #[test]
    fn applying_twice_changes_nothing() {
        let mut spec = json!({"process": {"env": ["A=1"]}, "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}]});
        let edits = ContainerEdits {
            env: vec!["B=2".into()],
            device_nodes: vec![null_device()],
            mounts: vec![Mount {
                host_path: "/usr/lib/libcuda.so.1".into(),
                container_path: "/usr/lib/libcuda.so.1".into(),
                kind: Some("bind".into()),
                options: vec!["ro".into(), "rbind".into()],
            }],
            hooks: vec![Hook {
                hook_name: "createContainer".into(),
                path: "/usr/bin/nvshim-hook".into(),
                args: vec!["nvshim-hook".into(), "update-ldcache".into()],
                env: Some(vec!["PATH=/usr/bin".into()]),
                timeout: None,
            }],
            additional_gids: vec![0, 44],
            ..Default::default()
        };
        apply(&mut spec, &edits).unwrap();
        let once = spec.clone();
        apply(&mut spec, &edits).unwrap();
        assert_eq!(spec, once);
        assert_eq!(once["process"]["user"]["additionalGids"], json!([44]));
    }

    #[test]
    fn env_entry_without_equals_is_applied_once() {
        // Regression: fuzz/corpus/bundle_edits/seed-regression-env-without-equals.
        let mut spec = json!({"process": {"env": []}});
        let edits = ContainerEdits {
            env: vec!["NVIDIA_VIS".into()],
            ..Default::default()
        };
        apply(&mut spec, &edits).unwrap();
        let once = spec.clone();
        apply(&mut spec, &edits).unwrap();
        assert_eq!(spec, once);
    }

    #[test]
    fn env_replaces_by_key() {
        let mut spec = json!({"process": {"env": ["FOO=old", "BAR=old"]}});
        let edits = ContainerEdits {
            env: vec!["FOO=new".into(), "NEW=1".into()],
            ..Default::default()
        };
        apply(&mut spec, &edits).unwrap();
        assert_eq!(
            spec["process"]["env"],
            json!(["FOO=new", "BAR=old", "NEW=1"])
        );
    }

    #[test]
    fn mounts_sorted_by_depth_stably() {
        let mut spec = json!({"mounts": [{"destination": "/dest/path/b"}, {"destination": "/a"}]});
        let edits = ContainerEdits {
            mounts: vec![Mount {
                host_path: "/h".into(),
                container_path: "/dest/edit".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        apply(&mut spec, &edits).unwrap();
        let order: Vec<&str> = spec["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["destination"].as_str().unwrap())
            .collect();
        assert_eq!(order, ["/a", "/dest/edit", "/dest/path/b"]);
    }

    /// The reference removes the mount with the added one's destination and appends the added
    /// one (docs/cdi-rules.md §5.5), so it goes after the other mounts of its depth; of two own
    /// mounts with that destination only the first goes, and a second added one removes the
    /// second.
    #[test]
    fn mount_with_an_existing_destination_is_removed_and_appended() {
        let mut spec = json!({"mounts": [
            {"destination": "/a/x", "source": "own1"},
            {"destination": "/b/y"}
        ]});
        let mount = |source: &str| Mount {
            host_path: source.into(),
            container_path: "/a/x".into(),
            ..Default::default()
        };
        let edits = ContainerEdits {
            mounts: vec![mount("h1")],
            ..Default::default()
        };
        apply(&mut spec, &edits).unwrap();
        let order = |spec: &Value| -> Vec<String> {
            spec["mounts"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| {
                    format!(
                        "{}:{}",
                        m["destination"].as_str().unwrap(),
                        m["source"].as_str().unwrap_or("")
                    )
                })
                .collect()
        };
        assert_eq!(order(&spec), ["/b/y:", "/a/x:h1"]);
        let once = spec.clone();
        apply(&mut spec, &edits).unwrap();
        assert_eq!(
            order(&spec),
            order(&once),
            "a second create changes nothing"
        );

        let mut spec = json!({"mounts": [
            {"destination": "/a/x", "source": "own1"},
            {"destination": "/a/x", "source": "own2"}
        ]});
        let edits = ContainerEdits {
            mounts: vec![mount("h1"), mount("h2")],
            ..Default::default()
        };
        apply(&mut spec, &edits).unwrap();
        assert_eq!(order(&spec), ["/a/x:h1", "/a/x:h2"]);
    }

    #[test]
    fn failure_leaves_spec_unchanged() {
        let mut spec = json!({"process": {"env": ["A=1"]}});
        let before = spec.clone();
        let edits = ContainerEdits {
            env: vec!["B=2".into()],
            device_nodes: vec![DeviceNode {
                path: "/dev/nope".into(),
                host_path: Some("/nonexistent/dev/nope".into()),
                ..Default::default()
            }],
            ..Default::default()
        };
        let err = apply(&mut spec, &edits).unwrap_err().to_string();
        assert!(err.contains("/nonexistent/dev/nope"), "{err}");
        assert_eq!(spec, before);
    }

    #[test]
    fn docker_gpus_hook_removed() {
        let mut spec = json!({"hooks": {"prestart": [
            {"path": "/usr/bin/nvidia-container-runtime-hook", "args": ["nvidia-container-runtime-hook", "prestart"]},
            {"path": "/usr/local/bin/other-hook"}
        ]}});
        assert!(has_legacy_hook(&spec));
        remove_legacy_hooks(&mut spec);
        assert!(!has_legacy_hook(&spec));
        assert_eq!(
            spec["hooks"]["prestart"],
            json!([{"path": "/usr/local/bin/other-hook"}])
        );
    }

    #[test]
    fn unknown_fields_survive() {
        let mut spec = json!({"future": {"x": 1}, "linux": {"newThing": [1], "devices": [{"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229, "vendorExt": true}]}});
        let edits = ContainerEdits {
            device_nodes: vec![null_device()],
            ..Default::default()
        };
        apply(&mut spec, &edits).unwrap();
        assert_eq!(spec["future"], json!({"x": 1}));
        assert_eq!(spec["linux"]["newThing"], json!([1]));
        assert_eq!(spec["linux"]["devices"][0]["vendorExt"], json!(true));
    }

    fn hook(env: Option<Vec<String>>) -> Hook {
        Hook {
            hook_name: "createContainer".into(),
            path: "/usr/bin/nvidia-cdi-hook".into(),
            args: vec!["nvidia-cdi-hook".into(), "update-ldcache".into()],
            env,
            timeout: None,
        }
    }

    #[test]
    fn hooks_never_inherit_the_container_env() {
        let mut spec = json!({"process": {"env": ["LD_PRELOAD=/evil.so"]}});
        let edits = ContainerEdits {
            hooks: vec![
                hook(None),
                hook(Some(vec![])),
                hook(Some(vec![
                    "PATH=/opt/bin".into(),
                    "LD_LIBRARY_PATH=/opt/lib".into(),
                ])),
            ],
            ..Default::default()
        };
        apply(&mut spec, &edits).unwrap();
        let hooks = spec["hooks"]["createContainer"].as_array().unwrap();
        // The first two are identical once given the default env: written once.
        assert_eq!(hooks.len(), 2, "{hooks:?}");
        assert_eq!(hooks[0]["env"], json!([crate::nvidia::HOOK_ENV]));
        assert_eq!(
            hooks[1]["env"],
            json!(["PATH=/opt/bin", "LD_LIBRARY_PATH=/opt/lib"])
        );
    }

    #[test]
    fn go_clean_matches_filepath_clean() {
        for (input, want) in [
            ("", "."),
            ("/", "/"),
            ("//a//b/", "/a/b"),
            ("/a/../b", "/b"),
            ("/../a", "/a"),
            ("a/b", "a/b"),
            ("../../a", "../../a"),
            ("a/../..", ".."),
            ("./", "."),
            (".", "."),
            ("..", ".."),
            ("a", "a"),
            ("/a/b", "/a/b"),
            ("/a/b/", "/a/b"),
            ("/a/.b/..c", "/a/.b/..c"),
        ] {
            assert_eq!(go_clean(input), want, "{input:?}");
            assert_eq!(clean_parts(input), want, "{input:?}");
        }
    }

    /// The shortcut for a clean path returns what splitting and joining returns, for every
    /// path of up to 7 of `/`, `.` and `a` (3,280 of them).
    #[test]
    fn a_path_taken_as_clean_is_what_cleaning_gives() {
        let mut paths = vec![String::new()];
        for _ in 0..7 {
            let longer: Vec<String> = paths
                .iter()
                .filter(|p| p.len() == paths.last().map_or(0, String::len))
                .flat_map(|p| ['/', '.', 'a'].map(|c| format!("{p}{c}")))
                .collect();
            paths.extend(longer);
        }
        assert_eq!(paths.len(), 3280);
        for p in &paths {
            assert_eq!(go_clean(p), clean_parts(p), "{p:?}");
        }
    }

    /// What [`Deferred::render`] writes straight from the edits is byte for byte the document
    /// with it built in ([`apply_all`]), pretty and compact, over what the merges meet: an own
    /// mount replaced (the first of two with its destination), added mounts replacing each
    /// other across parts, a depth sort that moves own and added, a type or options left out,
    /// strings to escape; device nodes replacing an own one and each other, with and without
    /// the process's uid and gid, rules already there or repeated, `permissions: none`; other
    /// members before and after, no `mounts` or `linux` at all, seccomp kept raw. The bind
    /// mounts the check reads are the built document's too.
    #[test]
    fn deferred_edits_write_what_applied_ones_do() {
        use crate::bundle::Bundle;
        let m = |dest: &str, src: &str, kind: Option<&str>, options: &[&str]| Mount {
            host_path: src.into(),
            container_path: dest.into(),
            kind: kind.map(str::to_string),
            options: options.iter().map(|o| o.to_string()).collect(),
        };
        // Fully described: nothing is asked of the host.
        let node =
            |path: &str, minor: i64, permissions: Option<&str>, uid: Option<u32>| DeviceNode {
                path: path.into(),
                kind: Some("c".into()),
                major: Some(195),
                minor: Some(minor),
                file_mode: Some(0o666),
                permissions: permissions.map(str::to_string),
                uid,
                ..Default::default()
            };
        let first = ContainerEdits {
            env: vec!["A=1".into()],
            device_nodes: vec![
                node("/dev/nvidia0", 0, None, None),
                node("/dev/nvidiactl", 255, Some("rw"), Some(7)),
                node("/dev/nvidia0", 0, Some("none"), None),
            ],
            mounts: vec![
                m(
                    "/usr/lib/libcuda.so.1",
                    "/host/lib/libcuda.so.1",
                    Some("bind"),
                    &["ro", "nosuid", "bind"],
                ),
                m("/etc/hosts", "/host/\"quoted\"\tname", None, &["rbind"]),
                m("/a", "/host/a", Some("tmpfs"), &[]),
                m("/deep/er/than/the/rest", "/x", None, &[]),
            ],
            ..Default::default()
        };
        let second = ContainerEdits {
            device_nodes: vec![
                node("/dev/nvidia1", 1, None, None),
                node("/dev/nvidiactl", 255, None, None),
            ],
            mounts: vec![
                m("/a", "/host/a2", None, &["bind"]),
                m("/dev/shm", "shm", Some("tmpfs"), &["nosuid"]),
            ],
            ..Default::default()
        };
        let hook_only = ContainerEdits {
            hooks: vec![hook(None)],
            ..Default::default()
        };
        let own = r#"[
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/etc/hosts", "type": "bind", "source": "/var/lib/hosts", "options": ["rbind", "ro"]},
            {"destination": "/etc/hosts", "type": "bind", "source": "/second"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "extra": {"kept": [1, 2.5]}},
            {"no": "destination"}
        ]"#;
        let devices = r#"[{"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229}, {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0, "fileMode": 438}]"#;
        let rules = r#"[{"allow": false, "access": "rwm"}, {"allow": true, "type": "c", "major": 195, "minor": 0, "access": "rwm"}]"#;
        let docs = [
            format!(
                r#"{{"ociVersion": "1.2.0", "process": {{"env": ["B=2"], "user": {{"uid": 1000, "gid": 1000}}}}, "mounts": {own}, "linux": {{"seccomp": {{"defaultAction": "SCMP_ACT_ERRNO"}}, "devices": {devices}, "resources": {{"memory": {{}}, "devices": {rules}}}, "namespaces": []}}}}"#
            ),
            format!(r#"{{"mounts": {own}, "linux": {{"resources": {{"devices": {rules}}}}}}}"#),
            format!(r#"{{"linux": {{"devices": {devices}, "seccomp": {{}}}}}}"#),
            r#"{"ociVersion": "1.2.0", "process": {"env": []}, "hooks": {}}"#.to_string(),
        ];
        let part_sets: [&[&ContainerEdits]; 4] = [
            &[&first, &second],
            &[&second, &hook_only, &first],
            &[&first],
            &[&hook_only],
        ];
        for doc in &docs {
            for pretty in [false, true] {
                let value: Value = serde_json::from_str(doc).unwrap();
                let text = if pretty {
                    serde_json::to_vec_pretty(&value).unwrap()
                } else {
                    serde_json::to_vec(&value).unwrap()
                };
                for parts in part_sets {
                    let dir = std::path::Path::new("/nonexistent");
                    let bundle = Bundle::from_bytes_lean(dir, text.clone()).unwrap();
                    let mut built = bundle.spec.clone();
                    apply_all(&mut built, parts).unwrap();
                    let mut deferred = bundle.spec.clone();
                    let left = apply_all_deferred(&mut deferred, parts).unwrap();
                    assert_eq!(
                        String::from_utf8(left.render(&bundle, &deferred, parts)).unwrap(),
                        String::from_utf8(bundle.render_spec(&built)).unwrap(),
                        "{doc} pretty={pretty}"
                    );
                    assert_eq!(left.binds(&deferred, parts), binds(&built));
                    let mut materialized = deferred.clone();
                    left.materialize(&mut materialized, parts).unwrap();
                    assert_eq!(materialized, built);
                }
            }
        }
    }

    #[test]
    fn mounts_are_written_as_oci_spec_writes_them() {
        use oci_spec::runtime::MountBuilder;
        for (kind, options) in [
            (
                Some("bind"),
                vec!["ro", "nosuid", "nodev", "rbind", "rprivate"],
            ),
            (None, vec![]),
            (Some("tmpfs"), vec![]),
            (None, vec!["rw"]),
        ] {
            let m = Mount {
                host_path: "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05".into(),
                container_path: "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05".into(),
                kind: kind.map(String::from),
                options: options.iter().map(|o| o.to_string()).collect(),
            };
            let mut b = MountBuilder::default()
                .destination(&m.container_path)
                .source(&m.host_path);
            if let Some(t) = &m.kind {
                b = b.typ(t.clone());
            }
            if !m.options.is_empty() {
                b = b.options(m.options.clone());
            }
            let reference = serde_json::to_string(&b.build().unwrap()).unwrap();
            assert_eq!(serde_json::to_string(&mount_value(&m)).unwrap(), reference);
        }
    }

    #[test]
    fn devices_and_rules_are_written_as_oci_spec_writes_them() {
        use oci_spec::runtime::{LinuxDeviceBuilder, LinuxDeviceCgroupBuilder};
        for (kind, mode, uid, gid, access) in [
            ("c", Some(0o666), None, None, "rwm"),
            ("b", None, Some(1000), Some(44), "rw"),
            ("c", Some(0o600), Some(0), None, ""),
            ("u", None, None, Some(7), "m"),
        ] {
            let d = DeviceNode {
                path: "/dev/nvidia-caps/nvidia-cap21".into(),
                kind: Some(kind.into()),
                major: Some(508),
                minor: Some(21),
                file_mode: mode,
                uid,
                gid,
                ..Default::default()
            };
            let typ = device_type(&d.path, kind).unwrap();
            let mut b = LinuxDeviceBuilder::default()
                .path(d.path.clone())
                .typ(typ)
                .major(508)
                .minor(21);
            if let Some(m) = mode {
                b = b.file_mode(m);
            }
            // The process's uid and gid fill what the node leaves unset.
            if let Some(u) = uid.or(Some(5)) {
                b = b.uid(u);
            }
            if let Some(g) = gid.or(Some(6)) {
                b = b.gid(g);
            }
            let added = AddedNode {
                node: DeviceNode {
                    uid: uid.or(Some(5)),
                    gid: gid.or(Some(6)),
                    ..d
                },
                kind: kind.into(),
            };
            assert_eq!(
                serde_json::to_string(&device_value(&added)).unwrap(),
                serde_json::to_string(&b.build().unwrap()).unwrap()
            );
            let mut rule = LinuxDeviceCgroupBuilder::default()
                .allow(true)
                .typ(typ)
                .major(508)
                .minor(21);
            if !access.is_empty() {
                rule = rule.access(access);
            }
            let mut reference = serde_json::to_value(rule.build().unwrap()).unwrap();
            reference
                .as_object_mut()
                .unwrap()
                .retain(|_, v| !v.is_null());
            let r = Rule {
                kind: kind.into(),
                major: 508,
                minor: 21,
                access: access.into(),
            };
            let (key, value) = (r.key(), rule_value(&r));
            assert_eq!(
                serde_json::to_string(&value).unwrap(),
                serde_json::to_string(&reference).unwrap()
            );
            assert_eq!(key, canonical(&value));
        }
        // Text a CDI spec may give (quotes, control and non-ASCII characters) and numbers
        // of every sign: the key is still the canonical form.
        for access in ["r\"w\\", "rw\u{1}", "rw\u{7f}", "rwé", ""] {
            for (major, minor) in [(-1, 0), (i64::MAX, i64::MIN)] {
                let r = Rule {
                    kind: "c".into(),
                    major,
                    minor,
                    access: access.into(),
                };
                assert_eq!(r.key(), canonical(&rule_value(&r)));
            }
        }
    }

    #[test]
    fn depth_is_the_slashes_of_the_cleaned_path() {
        for p in [
            "",
            "/",
            "//",
            "/a",
            "/a/",
            "/a/b",
            "//a//b/",
            "/a/../b",
            "/../a",
            "a/b",
            "../../a",
            "a/../..",
            "./",
            "/a/./b",
            "/a/.b",
            "/a/..b",
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        ] {
            assert_eq!(depth(p), go_clean(p).matches('/').count(), "{p:?}");
        }
    }

    #[test]
    fn mount_sort_counts_slashes_of_the_cleaned_path() {
        let mut spec = json!({"mounts": [
            {"destination": "/a/b"}, {"destination": "/c"}, {"destination": "rel/x"}
        ]});
        let mount = |dst: &str| Mount {
            host_path: "/h".into(),
            container_path: dst.into(),
            ..Default::default()
        };
        let edits = ContainerEdits {
            mounts: vec![mount("/"), mount("/x/../b"), mount("/d/")],
            ..Default::default()
        };
        apply(&mut spec, &edits).unwrap();
        let order: Vec<&str> = spec["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["destination"].as_str().unwrap())
            .collect();
        // `/`, `/c`, `rel/x`, `/x/../b` and `/d/` all have one `/` once cleaned: they keep
        // their order, ahead of `/a/b`.
        assert_eq!(order, ["/c", "rel/x", "/", "/x/../b", "/d/", "/a/b"]);
    }

    #[test]
    fn empty_values_left_out_as_omitempty_does() {
        let mut spec = json!({});
        let edits = ContainerEdits {
            device_nodes: vec![DeviceNode {
                permissions: Some("none".into()),
                ..null_device()
            }],
            intel_rdt: Some(IntelRdt {
                clos_id: Some(String::new()),
                l3_cache_schema: Some("L3:0=f".into()),
                mem_bw_schema: None,
                schemata: Some(vec![]),
                enable_monitoring: Some(false),
            }),
            hooks: vec![hook(Some(vec![]))],
            ..Default::default()
        };
        apply(&mut spec, &edits).unwrap();
        assert_eq!(
            spec["linux"]["intelRdt"],
            json!({"l3CacheSchema": "L3:0=f"})
        );
        assert_eq!(
            spec["linux"]["resources"]["devices"][0],
            json!({"allow": true, "type": "c", "major": 1, "minor": 3})
        );
        assert_eq!(
            spec["hooks"]["createContainer"][0]["env"],
            json!([crate::nvidia::HOOK_ENV])
        );
    }
}
