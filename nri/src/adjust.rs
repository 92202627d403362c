//! From an NRI container to nvshim's create plan and back to an NRI adjustment.
//!
//! The container is shown to the planner as the config.json it will become (env, mounts,
//! annotations, device nodes, device cgroup rules, privilege), so a request is judged exactly
//! as `nvshim-runtime` judges a bundle ([`nvshim::create::plan_bundle`]): same parsing, same
//! privilege policy, same resolvers. The adjustment is what the plan changed in that document.

use std::path::Path;

use nvshim::bundle::Bundle;
use nvshim::config::Config;
use nvshim::create::{self, CreateError, Plan, Trace};
use nvshim::install::Tools;
use nvshim::request::Route;
use serde_json::{json, Map, Value};
use thiserror::Error;

use crate::proto::nri;

pub use nvshim::nri_answer::Engine;

/// The plugin's settings (command line).
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// No OCI hooks in adjustments (NRI validators can reject hook injection).
    pub no_hooks: bool,
    /// Answer CDI requests with raw edits even where the engine injects CDI devices.
    pub no_native_cdi: bool,
    /// The runtime handlers whose pods `nvshim-runtime` serves (the `nvidia` runtime class):
    /// their config.json, which NRI does not show, has the GPUs.
    pub runtime_handlers: Vec<String>,
}

pub use nvshim::nri_answer::How;

/// The answer to one `CreateContainer`.
#[derive(Debug, Clone)]
pub struct Answer {
    pub adjust: nri::ContainerAdjustment,
    pub how: How,
    /// The device nodes the container must have when it is created (checked at
    /// `PostCreateContainer`).
    pub expected_devices: Vec<String>,
    /// GPUs or CDI devices served, for the log.
    pub served: Vec<String>,
    pub warnings: Vec<String>,
    /// `--no-hooks`: what the dropped hooks would have done that no mount does instead.
    pub dropped: Vec<String>,
}

/// CRI's privileged containers are the ones allowed every device (containerd and CRI-O add
/// the rule `allow, rwm` with no type or numbers for them only): NRI shows the container's
/// device cgroup rules but not its capabilities, so this rule is the container's
/// `CAP_SYS_ADMIN` for the request policy. A container without the rule is judged
/// unprivileged, the stricter reading.
pub fn is_privileged(container: &nri::Container) -> bool {
    container
        .linux
        .as_ref()
        .and_then(|l| l.resources.as_ref())
        .is_some_and(|r| {
            r.devices.iter().any(|d| {
                d.allow
                    && (d.type_.is_empty() || d.type_ == "a")
                    && d.major.is_none()
                    && d.minor.is_none()
                    && d.access.contains('r')
                    && d.access.contains('w')
                    && d.access.contains('m')
            })
        })
}

/// The container as the config.json nvshim-runtime would see (the fields a request reads or
/// an edit touches).
pub fn oci_view(container: &nri::Container) -> Value {
    let mounts: Vec<Value> = container
        .mounts
        .iter()
        .map(|m| {
            json!({"destination": m.destination, "type": m.type_, "source": m.source, "options": m.options})
        })
        .collect();
    let linux = container.linux.as_ref();
    let devices: Vec<Value> = linux
        .map(|l| l.devices.iter().map(device_json).collect())
        .unwrap_or_default();
    let rules: Vec<Value> = linux
        .and_then(|l| l.resources.as_ref())
        .map(|r| r.devices.iter().map(rule_json).collect())
        .unwrap_or_default();
    let annotations: Map<String, Value> = container
        .annotations
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    let mut process = json!({"env": container.env});
    if is_privileged(container) {
        process["capabilities"] = json!({"bounding": ["CAP_SYS_ADMIN"]});
    }
    let mut hooks = Map::new();
    if let Some(h) = container.hooks.as_ref() {
        for (name, list) in hook_lists(h) {
            if !list.is_empty() {
                hooks.insert(name.into(), list.iter().map(hook_json).collect());
            }
        }
    }
    // The namespaces tell a user-namespaced pod (`hostUsers: false`), whose device nodes the
    // plan makes bind mounts (src/userns.rs).
    let namespaces: Vec<Value> = linux
        .map(|l| {
            l.namespaces
                .iter()
                .map(|n| match n.path.as_str() {
                    "" => json!({"type": n.type_}),
                    path => json!({"type": n.type_, "path": path}),
                })
                .collect()
        })
        .unwrap_or_default();
    json!({
        "ociVersion": "1.0.2",
        "process": process,
        "mounts": mounts,
        "annotations": annotations,
        "hooks": hooks,
        "linux": {"namespaces": namespaces, "devices": devices, "resources": {"devices": rules}},
    })
}

fn device_json(d: &nri::LinuxDevice) -> Value {
    let mut v = json!({"path": d.path, "type": d.type_, "major": d.major, "minor": d.minor});
    if let Some(m) = d.file_mode.as_ref() {
        v["fileMode"] = json!(m.value);
    }
    if let Some(u) = d.uid.as_ref() {
        v["uid"] = json!(u.value);
    }
    if let Some(g) = d.gid.as_ref() {
        v["gid"] = json!(g.value);
    }
    v
}

fn rule_json(d: &nri::LinuxDeviceCgroup) -> Value {
    let mut v = json!({"allow": d.allow, "access": d.access});
    if !d.type_.is_empty() {
        v["type"] = json!(d.type_);
    }
    if let Some(m) = d.major.as_ref() {
        v["major"] = json!(m.value);
    }
    if let Some(m) = d.minor.as_ref() {
        v["minor"] = json!(m.value);
    }
    v
}

fn rule_of(r: &Value) -> nri::LinuxDeviceCgroup {
    let int = |key| {
        int_of(r, key)
            .map(|value| nri::OptionalInt64 {
                value,
                ..Default::default()
            })
            .into()
    };
    nri::LinuxDeviceCgroup {
        allow: r.get("allow").and_then(Value::as_bool).unwrap_or(false),
        type_: str_of(r, "type").into(),
        major: int("major"),
        minor: int("minor"),
        access: str_of(r, "access").into(),
        ..Default::default()
    }
}

/// The container NRI would show for a config.json, for `nvshim-nri --explain`: env, mounts,
/// annotations, device nodes and rules, namespaces; a process with `CAP_SYS_ADMIN` gets the
/// allow-all rule by which the plugin knows a privileged container ([`is_privileged`]).
/// Hooks are left out: the engine's own (the docker `--gpus` hook) never reach a CRI engine.
pub fn container_of(doc: &Value) -> nri::Container {
    let mut rules: Vec<nri::LinuxDeviceCgroup> = list(doc, "/linux/resources/devices")
        .iter()
        .map(rule_of)
        .collect();
    let caps = strings(doc.pointer("/process/capabilities/bounding"));
    if caps.contains(&"CAP_SYS_ADMIN") {
        rules.push(rule_of(&json!({"allow": true, "access": "rwm"})));
    }
    let linux = nri::LinuxContainer {
        namespaces: list(doc, "/linux/namespaces")
            .iter()
            .map(|n| nri::LinuxNamespace {
                type_: str_of(n, "type").into(),
                path: str_of(n, "path").into(),
                ..Default::default()
            })
            .collect(),
        devices: added_devices(&json!({}), doc),
        resources: protobuf::MessageField::some(nri::LinuxResources {
            devices: rules,
            ..Default::default()
        }),
        ..Default::default()
    };
    nri::Container {
        name: "config.json".into(),
        env: strings(doc.pointer("/process/env"))
            .into_iter()
            .map(String::from)
            .collect(),
        mounts: list(doc, "/mounts").iter().map(nri_mount).collect(),
        annotations: doc
            .get("annotations")
            .and_then(Value::as_object)
            .map(|a| {
                a.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect()
            })
            .unwrap_or_default(),
        linux: protobuf::MessageField::some(linux),
        ..Default::default()
    }
}

fn hook_json(h: &nri::Hook) -> Value {
    let mut v = json!({"path": h.path, "args": h.args, "env": h.env});
    if let Some(t) = h.timeout.as_ref() {
        v["timeout"] = json!(t.value);
    }
    v
}

/// The OCI hook lists, by their config.json names.
fn hook_lists(h: &nri::Hooks) -> [(&'static str, &Vec<nri::Hook>); 6] {
    [
        ("prestart", &h.prestart),
        ("createRuntime", &h.create_runtime),
        ("createContainer", &h.create_container),
        ("startContainer", &h.start_container),
        ("poststart", &h.poststart),
        ("poststop", &h.poststop),
    ]
}

/// A user-namespaced container whose `linux.devices` the engine filled with GPU nodes that
/// runc cannot bind-mount ([`engine_devices_in_user_namespace`]).
#[derive(Debug, Error)]
#[error("device nodes {} are in the container's linux.devices, put there by the engine (its own CDI injection of a cdi.k8s.io annotation, or the CRI devices), and in a user namespace runc bind-mounts each from the same path on the host, where it is missing or another device (the node is under dev-root {}); NRI cannot remove a device the engine added (an adjustment's removal never reaches the runtime), so the container would fail to start: ask by NVIDIA_VISIBLE_DEVICES or the device plugin's env (served in a user namespace), or run the pod with the `nvidia` runtime class (nvshim-runtime rewrites the nodes), or make the nodes at the host's /dev", .nodes.join(", "), .dev_root.display())]
pub struct EngineDevicesError {
    pub nodes: Vec<String>,
    pub dev_root: std::path::PathBuf,
}

/// In a user namespace runc bind-mounts each `linux.devices` entry from the host path equal
/// to its container path (src/userns.rs). Where that is not the node but dev-root has it,
/// nvshim-runtime rewrites the entry as a bind mount; NRI cannot (containerd 2.1.9 to 2.3.4
/// vendor NRI v0.8 to v0.12, whose `adjustDevices` applies a removal to the plugins' view
/// only), so the entries the engine added itself fail the start with runc's error. Refused
/// here with the reason instead.
pub fn engine_devices_in_user_namespace(
    config: &Config,
    container: &nri::Container,
) -> Result<(), EngineDevicesError> {
    let mut view = oci_view(container);
    if !nvshim::userns::has_user_namespace(&view) {
        return Ok(());
    }
    // The entries nvshim-runtime would move are the ones runc would miss.
    let nodes = nvshim::userns::bind_device_nodes(&mut view, &[], &config.dev_root);
    if nodes.is_empty() {
        return Ok(());
    }
    Err(EngineDevicesError {
        nodes,
        dev_root: config.dev_root.clone(),
    })
}

/// Plans the container as `nvshim-runtime` would plan its bundle and turns the plan into an
/// adjustment. An error is the refusal `nvshim-runtime` would make.
pub fn answer(
    config: &Config,
    tools: &Tools,
    engine: &Engine,
    options: &Options,
    container: &nri::Container,
) -> Result<Answer, CreateError> {
    let view = oci_view(container);
    let bytes = serde_json::to_vec(&view).expect("a JSON value serializes");
    // No bundle directory: none exists yet when NRI asks, and hooks then read the bundle from
    // the OCI state runc gives them.
    let bundle = Bundle::from_bytes_lean(Path::new(""), bytes)?;
    let mut trace = Trace::default();
    let plan = create::plan_bundle(config, bundle, tools, &mut trace)?;
    let doc = plan.document().map_err(|source| CreateError::Edit {
        path: "config.json".into(),
        source,
    })?;
    let expected_devices = added_devices(&view, &doc)
        .iter()
        .map(|d| d.path.clone())
        .collect();
    let mut adjust = diff(&view, &doc);
    keep_device_plugin_mounts(&mut adjust);
    // In a user namespace the engine's own CDI injection would give runc device nodes to
    // bind-mount from their container path, not from dev-root: the plan's mounts instead.
    let user_namespace = nvshim::userns::has_user_namespace(&view);
    let how = nvshim::nri_answer::how(
        &plan.route,
        plan.touched,
        engine,
        options.no_native_cdi,
        user_namespace,
    );
    if let (How::NativeCdi, Route::Cdi(names, _)) = (how, &plan.route) {
        native_cdi(&mut adjust, names);
    }
    if user_namespace {
        device_rules_for_binds(&mut adjust);
    }
    let dropped = if options.no_hooks {
        hook_free(&mut adjust)
    } else {
        Vec::new()
    };
    Ok(Answer {
        adjust,
        how,
        expected_devices,
        served: served(&plan),
        warnings: trace.warnings,
        dropped,
    })
}

fn served(plan: &Plan) -> Vec<String> {
    if plan.cdi_devices.is_empty() {
        plan.gpus.iter().map(|g| g.uuid.clone()).collect()
    } else {
        plan.cdi_devices.clone()
    }
}

/// In a user namespace the plan bind-mounts the device nodes (src/userns.rs), and the cgroup
/// must still allow them; containerd 2.1 applies no `resources.devices` rule of an adjustment
/// (seen: the probe's open got EPERM), only the rule of each device it adds. So each
/// bind-mounted node is also a device at its host path, which runc binds there from the same
/// host path: the rule comes with it, and `/dev/nvidiaN` is the plan's mount.
fn device_rules_for_binds(adjust: &mut nri::ContainerAdjustment) {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let mut nodes = Vec::new();
    for m in &adjust.mounts {
        let Ok(meta) = std::fs::metadata(&m.source) else {
            continue;
        };
        if !meta.file_type().is_char_device() {
            continue;
        }
        nodes.push(nri::LinuxDevice {
            path: m.source.clone(),
            type_: "c".into(),
            major: nix::sys::stat::major(meta.rdev()) as i64,
            minor: nix::sys::stat::minor(meta.rdev()) as i64,
            ..Default::default()
        });
    }
    if !nodes.is_empty() {
        adjust.linux.mut_or_insert_default().devices.extend(nodes);
    }
}

/// The device plugin's placeholder mounts (`/dev/null` under
/// [`nvshim::request::DEVICE_MOUNT_ROOT`]), which the plan removes, stay in the container:
/// they are its request, planned again at `StartContainer` and `Synchronize`. Without them
/// the request reads as volume-mounts with no mounts and is refused (seen on containerd
/// 2.1.9 and CRI-O 1.36.3: a served container warned, under `--mandatory` not started).
fn keep_device_plugin_mounts(adjust: &mut nri::ContainerAdjustment) {
    let placeholder = format!("-{}/", nvshim::request::DEVICE_MOUNT_ROOT);
    adjust
        .mounts
        .retain(|m| !m.destination.starts_with(&placeholder));
}

/// The engine injects the devices from its CDI registry: the adjustment keeps only what the
/// plan did besides them (mounts it removes).
fn native_cdi(adjust: &mut nri::ContainerAdjustment, names: &[String]) {
    let removals: Vec<nri::Mount> = adjust
        .mounts
        .drain(..)
        .filter(|m| m.destination.starts_with('-'))
        .collect();
    *adjust = nri::ContainerAdjustment {
        mounts: removals,
        cdi_devices: names
            .iter()
            .map(|n| nri::CDIDevice {
                name: n.clone(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
}

/// `--no-hooks`: the adjustment without OCI hooks. The links nvshim's fix-ups hook would make
/// to a mounted file (`libcuda.so.1 -> libcuda.so.<version>`, the SONAME links a program's
/// loader looks for) become read-only bind mounts of the same host file at the link's path,
/// so `libcuda.so.1` is there with no hook; in the multiarch library directories the loader
/// searches without an ld.so.cache entry. Returns what is lost: the other links (to
/// directories, device nodes), the ld.so.cache update and the rest of the fix-ups.
pub fn hook_free(adjust: &mut nri::ContainerAdjustment) -> Vec<String> {
    let Some(hooks) = adjust.hooks.take() else {
        return Vec::new();
    };
    let mut dropped = Vec::new();
    let mut added = Vec::new();
    for (name, list) in hook_lists(&hooks) {
        for h in list {
            let mut args = h.args.iter();
            let fixups = args.nth(1).is_some_and(|a| a == "fixups");
            if !fixups {
                dropped.push(format!("{name} hook {}", h.args.join(" ")));
                continue;
            }
            let mut args = h.args.iter().skip(2).peekable();
            while let Some(a) = args.next() {
                if a != "--link" {
                    if !a.starts_with("--") || a == "--folder" {
                        continue;
                    }
                    dropped.push(format!("fix-up {a}"));
                    continue;
                }
                let Some((target, link)) = args.next().and_then(|l| l.split_once("::")) else {
                    continue;
                };
                let dir = link.rsplit_once('/').map_or("", |(d, _)| d);
                let target_path = if target.starts_with('/') {
                    target.to_string()
                } else {
                    format!("{dir}/{target}")
                };
                let source = adjust
                    .mounts
                    .iter()
                    .find(|m| m.destination == target_path && !m.source.is_empty());
                match source {
                    Some(m) => added.push(nri::Mount {
                        destination: link.to_string(),
                        type_: "bind".into(),
                        source: m.source.clone(),
                        options: vec!["ro".into(), "nosuid".into(), "nodev".into(), "bind".into()],
                        ..Default::default()
                    }),
                    None => dropped.push(format!("link {link} -> {target}")),
                }
            }
            dropped.push("ld.so.cache update".into());
        }
    }
    for m in added {
        if !adjust.mounts.iter().any(|x| x.destination == m.destination) {
            adjust.mounts.push(m);
        }
    }
    dropped.dedup();
    dropped
}

fn strings(v: Option<&Value>) -> Vec<&str> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn list<'a>(doc: &'a Value, pointer: &str) -> &'a [Value] {
    doc.pointer(pointer)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or_default()
}

fn int_of(v: &Value, key: &str) -> Option<i64> {
    v.get(key).and_then(Value::as_i64)
}

fn added_devices(before: &Value, after: &Value) -> Vec<nri::LinuxDevice> {
    let had: Vec<&str> = list(before, "/linux/devices")
        .iter()
        .map(|d| str_of(d, "path"))
        .collect();
    list(after, "/linux/devices")
        .iter()
        .filter(|d| !had.contains(&str_of(d, "path")))
        .map(|d| nri::LinuxDevice {
            path: str_of(d, "path").into(),
            type_: str_of(d, "type").into(),
            major: int_of(d, "major").unwrap_or_default(),
            minor: int_of(d, "minor").unwrap_or_default(),
            file_mode: d
                .get("fileMode")
                .and_then(Value::as_u64)
                .map(|m| nri::OptionalFileMode {
                    value: m as u32,
                    ..Default::default()
                })
                .into(),
            uid: optional_u32(d, "uid").into(),
            gid: optional_u32(d, "gid").into(),
            ..Default::default()
        })
        .collect()
}

/// A device's `uid` or `gid` as NRI's optional value.
fn optional_u32(d: &Value, key: &str) -> Option<nri::OptionalUInt32> {
    d.get(key)
        .and_then(Value::as_u64)
        .map(|v| nri::OptionalUInt32 {
            value: v as u32,
            ..Default::default()
        })
}

/// What the plan changed in the document, as an NRI adjustment: env set or removed, mounts
/// added or removed (a `-` before the destination removes), device nodes and cgroup rules
/// An OCI mount (config.json's shape) as NRI's.
fn nri_mount(m: &Value) -> nri::Mount {
    nri::Mount {
        destination: str_of(m, "destination").into(),
        type_: str_of(m, "type").into(),
        source: str_of(m, "source").into(),
        options: strings(m.get("options"))
            .into_iter()
            .map(String::from)
            .collect(),
        ..Default::default()
    }
}

/// and hooks added.
pub fn diff(before: &Value, after: &Value) -> nri::ContainerAdjustment {
    let mut adjust = nri::ContainerAdjustment::new();
    let env_before = strings(before.pointer("/process/env"));
    let env_after = strings(after.pointer("/process/env"));
    let key = |e: &str| e.split_once('=').map_or(e, |(k, _)| k).to_string();
    for e in &env_after {
        if !env_before.contains(e) {
            let (k, v) = e.split_once('=').unwrap_or((e, ""));
            adjust.env.push(nri::KeyValue {
                key: k.into(),
                value: v.into(),
                ..Default::default()
            });
        }
    }
    for e in &env_before {
        let k = key(e);
        if !env_after.iter().any(|a| key(a) == k) {
            adjust.env.push(nri::KeyValue {
                key: format!("-{k}"),
                ..Default::default()
            });
        }
    }
    let mounts_before = list(before, "/mounts");
    let mounts_after = list(after, "/mounts");
    for m in mounts_before {
        if !mounts_after.contains(m) {
            adjust.mounts.push(nri::Mount {
                destination: format!("-{}", str_of(m, "destination")),
                ..Default::default()
            });
        }
    }
    for m in mounts_after {
        if !mounts_before.contains(m) {
            adjust.mounts.push(nri_mount(m));
        }
    }
    let devices = added_devices(before, after);
    let rules_before = list(before, "/linux/resources/devices");
    let rules: Vec<nri::LinuxDeviceCgroup> = list(after, "/linux/resources/devices")
        .iter()
        .filter(|r| !rules_before.contains(r))
        // NRI allows each added device node itself.
        .filter(|r| {
            !devices.iter().any(|d| {
                Some(d.major) == int_of(r, "major")
                    && Some(d.minor) == int_of(r, "minor")
                    && d.type_ == str_of(r, "type")
            })
        })
        .map(rule_of)
        .collect();
    if !devices.is_empty() || !rules.is_empty() {
        let mut linux = nri::LinuxContainerAdjustment::new();
        linux.devices = devices;
        if !rules.is_empty() {
            linux.resources = protobuf::MessageField::some(nri::LinuxResources {
                devices: rules,
                ..Default::default()
            });
        }
        adjust.linux = protobuf::MessageField::some(linux);
    }
    let mut hooks = nri::Hooks::new();
    let mut any_hook = false;
    for (name, slot) in [
        ("prestart", &mut hooks.prestart),
        ("createRuntime", &mut hooks.create_runtime),
        ("createContainer", &mut hooks.create_container),
        ("startContainer", &mut hooks.start_container),
        ("poststart", &mut hooks.poststart),
        ("poststop", &mut hooks.poststop),
    ] {
        let had = list(before, &format!("/hooks/{name}"));
        for h in list(after, &format!("/hooks/{name}")) {
            if had.contains(h) {
                continue;
            }
            any_hook = true;
            slot.push(nri::Hook {
                path: str_of(h, "path").into(),
                args: strings(h.get("args"))
                    .into_iter()
                    .map(String::from)
                    .collect(),
                env: strings(h.get("env"))
                    .into_iter()
                    .map(String::from)
                    .collect(),
                timeout: int_of(h, "timeout")
                    .map(|value| nri::OptionalInt {
                        value,
                        ..Default::default()
                    })
                    .into(),
                ..Default::default()
            });
        }
    }
    if any_hook {
        adjust.hooks = protobuf::MessageField::some(hooks);
    }
    adjust
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn privileged_is_the_allow_all_device_rule() {
        let mut c = nri::Container::new();
        assert!(!is_privileged(&c));
        let mut linux = nri::LinuxContainer::new();
        let mut res = nri::LinuxResources::new();
        res.devices.push(nri::LinuxDeviceCgroup {
            allow: false,
            access: "rwm".into(),
            ..Default::default()
        });
        linux.resources = Some(res.clone()).into();
        c.linux = Some(linux.clone()).into();
        assert!(
            !is_privileged(&c),
            "deny-all is every container's first rule"
        );
        res.devices.push(nri::LinuxDeviceCgroup {
            allow: true,
            access: "rwm".into(),
            ..Default::default()
        });
        linux.resources = Some(res).into();
        c.linux = Some(linux).into();
        assert!(is_privileged(&c));
    }

    /// `--explain` shows the plugin a config.json as NRI's container: the view the plugin
    /// plans from is the config.json's parts it reads back.
    #[test]
    fn container_of_config_json_gives_the_same_view() {
        let doc = json!({
            "ociVersion": "1.0.2",
            "process": {"env": ["NVIDIA_VISIBLE_DEVICES=1"], "capabilities": {"bounding": ["CAP_SYS_ADMIN"]}},
            "mounts": [{"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid"]}],
            "annotations": {"cdi.k8s.io/x": "nvidia.com/gpu=0"},
            "hooks": {},
            "linux": {
                "namespaces": [{"type": "mount"}, {"type": "user", "path": "/proc/1/ns/user"}],
                "devices": [{"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229}],
                "resources": {"devices": [{"allow": false, "access": "rwm"}]}
            }
        });
        let c = container_of(&doc);
        assert!(is_privileged(&c));
        let view = oci_view(&c);
        for pointer in [
            "/process/env",
            "/mounts",
            "/annotations",
            "/linux/namespaces",
            "/linux/devices",
        ] {
            assert_eq!(view.pointer(pointer), doc.pointer(pointer), "{pointer}");
        }
        assert!(nvshim::userns::has_user_namespace(&view));
        let unprivileged = json!({"process": {"env": []}});
        assert!(!is_privileged(&container_of(&unprivileged)));
    }

    #[test]
    fn diff_sets_and_removes() {
        let before = json!({"process": {"env": ["A=1", "B=2"]},
            "mounts": [{"destination": "/var/run/nvidia-container-devices/GPU-1", "source": "/dev/null"}],
            "linux": {"devices": [], "resources": {"devices": []}}});
        let after = json!({"process": {"env": ["A=1", "C=3"]},
            "mounts": [{"destination": "/usr/lib/libcuda.so.1", "source": "/h/libcuda.so.1", "type": "bind", "options": ["ro"]}],
            "hooks": {"createContainer": [{"path": "/usr/bin/nvshim-hook", "args": ["nvshim-hook", "x"]}]},
            "linux": {"devices": [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}],
                      "resources": {"devices": [{"allow": true, "type": "c", "major": 195, "minor": 0, "access": "rwm"},
                                                {"allow": true, "type": "c", "major": 195, "minor": 255, "access": "rw"}]}}});
        let a = diff(&before, &after);
        let env: Vec<(String, String)> = a
            .env
            .iter()
            .map(|kv| (kv.key.clone(), kv.value.clone()))
            .collect();
        assert_eq!(
            env,
            [("C".into(), "3".into()), ("-B".into(), String::new())]
        );
        let mounts: Vec<&str> = a.mounts.iter().map(|m| m.destination.as_str()).collect();
        assert_eq!(
            mounts,
            [
                "-/var/run/nvidia-container-devices/GPU-1",
                "/usr/lib/libcuda.so.1"
            ]
        );
        let linux = a.linux.as_ref().unwrap();
        assert_eq!(linux.devices.len(), 1);
        // The node's own rule is NRI's to add; the other one is ours.
        let rules = &linux.resources.as_ref().unwrap().devices;
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].minor.as_ref().unwrap().value, 255);
        assert_eq!(a.hooks.as_ref().unwrap().create_container.len(), 1);
    }

    /// A user-namespaced container holding a node runc would bind from a host path that is
    /// not the device, while dev-root has it: refused, naming the node and dev-root. The same
    /// entry without a user namespace, or with dev-root `/` (nothing nvshim could bind either),
    /// is left to the engine. `/dev/null` (1:3) stands for the GPU node, linked under dev-root.
    #[test]
    fn engine_devices_runc_would_miss_in_a_user_namespace_are_refused() {
        let dev_root = tempfile::tempdir().unwrap();
        std::fs::create_dir(dev_root.path().join("dev")).unwrap();
        std::os::unix::fs::symlink("/dev/null", dev_root.path().join("dev/nvidia0")).unwrap();
        let doc = |userns: bool| {
            let ns = if userns { "user" } else { "pid" };
            json!({
                "process": {"env": []},
                "linux": {
                    "namespaces": [{"type": ns}],
                    "devices": [{"path": "/dev/nvidia0", "type": "c", "major": 1, "minor": 3}]
                }
            })
        };
        let config = Config {
            dev_root: dev_root.path().into(),
            ..Config::default()
        };
        let err = engine_devices_in_user_namespace(&config, &container_of(&doc(true)))
            .unwrap_err()
            .to_string();
        for needle in [
            "/dev/nvidia0",
            dev_root.path().to_str().unwrap(),
            "NRI cannot remove",
        ] {
            assert!(err.contains(needle), "{needle:?} not in {err}");
        }
        assert!(engine_devices_in_user_namespace(&config, &container_of(&doc(false))).is_ok());
        let root = Config::default();
        assert!(engine_devices_in_user_namespace(&root, &container_of(&doc(true))).is_ok());
    }

    #[test]
    fn device_plugin_placeholders_stay() {
        let placeholder = "/var/run/nvidia-container-devices/GPU-1";
        let before = json!({"mounts": [
            {"destination": placeholder, "source": "/dev/null"},
            {"destination": "/etc/x", "source": "/h/x"}]});
        let after = json!({"mounts": []});
        let mut a = diff(&before, &after);
        keep_device_plugin_mounts(&mut a);
        let mounts: Vec<&str> = a.mounts.iter().map(|m| m.destination.as_str()).collect();
        assert_eq!(mounts, ["-/etc/x"]);
    }

    /// The SONAME link becomes a second bind mount of the library; a link to a directory
    /// and the ld.so.cache update are reported as not done.
    #[test]
    fn hook_free_mounts_library_links() {
        let lib = "/usr/lib/x86_64-linux-gnu";
        let mut a = nri::ContainerAdjustment::new();
        a.mounts.push(nri::Mount {
            destination: format!("{lib}/libcuda.so.580.1"),
            source: "/host/libcuda.so.580.1".into(),
            type_: "bind".into(),
            ..Default::default()
        });
        let mut hooks = nri::Hooks::new();
        hooks.create_container.push(nri::Hook {
            path: "/usr/bin/nvshim-hook".into(),
            args: [
                "nvshim-hook",
                "fixups",
                "--link",
                "libcuda.so.580.1::/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                "--link",
                "../card1::/dev/dri/by-path/pci-card",
                "--folder",
                lib,
            ]
            .map(String::from)
            .to_vec(),
            ..Default::default()
        });
        a.hooks = Some(hooks).into();
        let dropped = hook_free(&mut a);
        assert!(a.hooks.is_none());
        let m = &a.mounts[1];
        assert_eq!(m.destination, format!("{lib}/libcuda.so.1"));
        assert_eq!(m.source, "/host/libcuda.so.580.1");
        assert_eq!(
            dropped,
            [
                "link /dev/dri/by-path/pci-card -> ../card1",
                "ld.so.cache update"
            ]
        );
    }
}
