//! `nvshim explain`: what `nvshim-runtime create` would do to a bundle, and why, changing
//! nothing.
//!
//! Users of NVIDIA's stack reverse-engineer its log and hand-edit CDI specs to learn what was
//! done to a container: no tool of theirs says it. This runs
//! the very code `create` runs, [`create::plan_bundle`], and stops before the write and the exec;
//! nothing here decides anything `create` does not. What it adds is presentation: the request
//! and where each part came from, the mode and the reason for it, the GPUs resolved, every
//! edit grouped by the request that caused it (each group applied alone to an empty document
//! by the same [`edits::apply`], so the device nodes, cgroup rules, mounts, env entries and
//! hooks shown are the OCI entries `create` writes), the Docker `--gpus` hook removed, a
//! unified diff of config.json, and the error `create` would fail with.
//!
//! Read-only by construction: the bundle is read, never written, so it works without root on
//! any bundle the caller can read.
//!
//! One file (890 lines of code, 50 of tests): one report, [`Explanation`]; its item types, the code
//! that fills them from `create`'s plan, and the text rendering that prints each field sit
//! together, so a new field is added to all three in one place (the JSON form is serde over the
//! same types).

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{json, Map, Value};

use crate::bundle::Bundle;
use crate::cdi;
use crate::config::Config;
use crate::create::{self, Trace};
use crate::edits::{self, ContainerEdits};
use crate::edits::{Cause, EditGroup};
use crate::host::Gpu;
use crate::install;
use crate::request::{self, Request, Route, Source};
use crate::runtime::RuntimeError;

/// What to explain: a bundle directory (its `config.json`), or a config.json anywhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    Bundle(PathBuf),
    Spec(PathBuf),
}

/// Everything explained, as data (`--format json` prints it; the text form renders it).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    /// The config.json explained.
    pub config_json: PathBuf,
    /// nvshim's config file (`None`: defaults, no file).
    pub nvshim_config: Option<PathBuf>,
    /// The configured `mode`.
    pub mode: &'static str,
    /// The low-level runtime `create` would exec, when one is found.
    pub low_level_runtime: Option<PathBuf>,
    /// The `nvshim-hook` written into hooks.
    pub hook_path: PathBuf,
    /// Each request and where it came from.
    pub requests: Vec<RequestItem>,
    /// `NVIDIA_DRIVER_CAPABILITIES`, resolved (empty for a non-GPU container).
    pub capabilities: Vec<&'static str>,
    pub requirements: Vec<RequirementItem>,
    /// `NVIDIA_DISABLE_REQUIRE` is set.
    pub requirements_disabled: bool,
    /// `CAP_SYS_ADMIN` in the bounding set.
    pub privileged: bool,
    /// How the request is served: `none`, `legacy` or `cdi`, with the reason.
    pub route: Option<RouteItem>,
    /// How `nvshim-nri` would answer the same container (its NRI adjustment), where create
    /// would plan it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nri: Option<String>,
    /// GPUs resolved (legacy).
    pub gpus: Vec<GpuItem>,
    /// The edits, by cause, in the order they apply.
    pub groups: Vec<GroupItem>,
    /// Prestart hooks removed (Docker's `--gpus` hook).
    pub removed_hooks: Vec<Value>,
    pub warnings: Vec<String>,
    /// `create` would rewrite config.json.
    pub changes_bundle: bool,
    /// A unified diff of config.json (both sides pretty-printed), empty when nothing changes.
    pub diff: String,
    /// config.json as `create` would write it (`--format json` only): to diff against what
    /// another runtime writes for the same bundle. Absent when create would change nothing or
    /// fail.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// The error `create` would fail with.
    pub error: Option<String>,
}

/// One request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestItem {
    /// `env`, `annotation`, `mount` or `dockerGpusHook`.
    pub source: &'static str,
    /// The variable, annotation key, mount destination or hook path.
    pub key: String,
    /// What it asks for.
    pub value: String,
    /// False when nvshim ignores it (and `note` says why).
    pub honoured: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequirementItem {
    pub var: String,
    pub expr: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteItem {
    /// `none`, `legacy` or `cdi`.
    pub mode: &'static str,
    pub reason: String,
    /// The fully qualified CDI devices asked for (`cdi`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cdi_devices: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuItem {
    pub index: usize,
    pub uuid: String,
    pub minor: u32,
    pub bus_id: String,
    pub model: String,
}

impl From<&Gpu> for GpuItem {
    fn from(g: &Gpu) -> Self {
        GpuItem {
            index: g.index,
            uuid: g.uuid.clone(),
            minor: g.minor,
            bus_id: g.bus_id.clone(),
            model: g.model.clone(),
        }
    }
}

/// What caused a group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum CauseItem {
    #[serde(rename_all = "camelCase")]
    Gpu {
        gpu: GpuItem,
    },
    Driver,
    #[serde(rename_all = "camelCase")]
    CdiSpec {
        spec: PathBuf,
        kind: String,
    },
    #[serde(rename_all = "camelCase")]
    CdiDevice {
        device: String,
        spec: PathBuf,
    },
    GpuMemoryLimits,
    /// `NVIDIA_GDS=enabled` and the like: the variable and NVIDIA's mode name.
    #[serde(rename_all = "camelCase")]
    Feature {
        variable: &'static str,
        mode: &'static str,
    },
}

/// An env entry added, and the entry it replaces.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvChange {
    pub entry: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replaces: Option<String>,
}

/// A hook and the OCI stage it runs at.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HookItem {
    pub stage: String,
    /// The OCI hook entry (`path`, `args`, `env`, `timeout`).
    pub hook: Value,
}

/// One cause's edits as the OCI entries `create` writes for them.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupItem {
    pub cause: CauseItem,
    /// `linux.devices` entries.
    pub device_nodes: Vec<Value>,
    /// `linux.resources.devices` entries.
    pub cgroup_rules: Vec<Value>,
    /// `mounts` entries.
    pub mounts: Vec<Value>,
    pub env: Vec<EnvChange>,
    pub hooks: Vec<HookItem>,
    /// `process.user.additionalGids` added.
    pub additional_gids: Vec<u32>,
    /// `linux.netDevices` entries.
    #[serde(skip_serializing_if = "Map::is_empty")]
    pub net_devices: Map<String, Value>,
    /// `linux.intelRdt`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub intel_rdt: Option<Value>,
}

/// Explains what `create` would do to `input`. Never fails: a failure of `create` is part of
/// the explanation. `low_level_runtime` is the result of the same lookup `nvshim-runtime` does
/// before it touches the bundle (its failure is the error `create` would report first).
pub fn explain(
    config: &Config,
    nvshim_config: Option<&Path>,
    input: &Input,
    hook_path: &Path,
    low_level_runtime: Result<PathBuf, RuntimeError>,
) -> Explanation {
    let loaded = match input {
        Input::Bundle(dir) => Bundle::load(dir),
        Input::Spec(file) => Bundle::load_file(file),
    };
    let config_json = match (&loaded, input) {
        (Ok(b), _) => b.config_path().to_path_buf(),
        (Err(_), Input::Bundle(dir)) => dir.join("config.json"),
        (Err(_), Input::Spec(file)) => file.clone(),
    };
    let (runtime, runtime_error) = match low_level_runtime {
        Ok(p) => (Some(p), None),
        Err(e) => (None, Some(e.to_string())),
    };
    let mut out = Explanation {
        config_json,
        nvshim_config: nvshim_config.map(Path::to_path_buf),
        mode: config.mode.name(),
        low_level_runtime: runtime,
        hook_path: hook_path.to_path_buf(),
        requests: Vec::new(),
        capabilities: Vec::new(),
        requirements: Vec::new(),
        requirements_disabled: false,
        privileged: false,
        route: None,
        nri: None,
        gpus: Vec::new(),
        groups: Vec::new(),
        removed_hooks: Vec::new(),
        warnings: Vec::new(),
        changes_bundle: false,
        diff: String::new(),
        result: None,
        error: None,
    };
    let bundle = match loaded {
        Ok(b) => b,
        Err(e) => {
            // nvshim-runtime looks for runc first, so its absence is what create reports.
            out.error = Some(runtime_error.unwrap_or_else(|| e.to_string()));
            return out;
        }
    };
    let original = bundle.spec.clone();
    let mut trace = Trace::default();
    let tools = install::Tools {
        hook: hook_path.to_path_buf(),
        nvml: crate::host::nvml::NvmlAccess::InProcess,
        cdi: None,
    };
    let result = create::plan_bundle(config, bundle, &tools, &mut trace);
    if let Some(request) = &trace.request {
        describe_request(&mut out, config, &original, request);
        out.requirements_disabled |= config.disable_require;
        if let Some(route) = &trace.route {
            out.route = Some(describe_route(route));
        }
        // Served on the legacy route only (a warning says so on the CDI route).
        for f in &request.features {
            out.requests.push(RequestItem {
                source: "env",
                key: f.variable().into(),
                value: crate::request::gated::ENABLED.into(),
                honoured: matches!(trace.route, Some(Route::Legacy(_))),
                note: None,
            });
        }
    }
    out.removed_hooks = trace.removed_hooks.clone();
    out.warnings = trace.warnings.clone();
    match result {
        Ok(plan) => {
            out.nri = Some(crate::nri_answer::describe(
                &plan.route,
                plan.touched,
                crate::userns::has_user_namespace(&original),
            ));
            out.gpus = plan.gpus.iter().map(GpuItem::from).collect();
            let base = skeleton(&original);
            let groups = &plan.groups;
            out.groups = groups
                .iter()
                .map(|g| describe_group(g, &base, &original))
                .collect();
            // A CDI spec generated for another driver: `create` does not look (it reads the
            // spec files and nothing else of the host), but explain can afford the look.
            if matches!(plan.route, Route::Cdi(..)) {
                let running = install::host_from(config).driver_version().ok();
                for g in groups {
                    for s in cdi::registry::stale_library_mounts(&g.edits, running.as_deref()) {
                        let s = format!("stale CDI spec: {s}");
                        if !out.warnings.contains(&s) {
                            out.warnings.push(s);
                        }
                    }
                }
            }
            match plan.document() {
                Ok(edited) => {
                    out.changes_bundle = edited != original;
                    if out.changes_bundle {
                        out.diff = diff(&out.config_json, &original, &edited);
                        out.result = Some(edited);
                    }
                    out.error = runtime_error;
                }
                // Not reached: planning applied the same mounts to the same document.
                Err(e) => out.error = Some(runtime_error.unwrap_or_else(|| e.to_string())),
            }
        }
        Err(e) => {
            out.gpus = trace.gpus.iter().map(GpuItem::from).collect();
            out.error = Some(runtime_error.unwrap_or_else(|| e.to_string()));
        }
    }
    out
}

fn env_value(spec: &Value, key: &str) -> Option<String> {
    request::env_map(spec)
        .ok()?
        .into_iter()
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v.to_string())
}

fn describe_request(out: &mut Explanation, config: &Config, spec: &Value, request: &Request) {
    out.privileged = request.privileged;
    out.requirements_disabled = request.disable_require;
    out.capabilities = if request.wants_gpus() {
        request.capabilities.names()
    } else {
        Vec::new()
    };
    out.requirements = request
        .requirements
        .iter()
        .map(|r| RequirementItem {
            var: r.var.clone(),
            expr: r.expr.clone(),
        })
        .collect();
    for source in &request.sources {
        out.requests.push(match source {
            Source::Env(var) => RequestItem {
                source: "env",
                key: var.to_string(),
                value: env_value(spec, var).unwrap_or_default(),
                honoured: true,
                note: None,
            },
            Source::Annotation(key) => RequestItem {
                source: "annotation",
                key: key.clone(),
                value: spec
                    .get("annotations")
                    .and_then(|a| a.get(key))
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                honoured: !request.cdi_already_applied,
                note: request.cdi_already_applied.then(|| {
                    "already applied by the engine: NVIDIA_VISIBLE_DEVICES=void next to CDI annotations means containerd, CRI-O or podman injected these devices; nvshim changes nothing"
                        .into()
                }),
            },
            Source::Mount(destination) => RequestItem {
                source: "mount",
                key: destination.clone(),
                value: String::new(),
                honoured: true,
                note: None,
            },
            Source::DockerGpusHook => RequestItem {
                source: "dockerGpusHook",
                key: "hooks.prestart".into(),
                value: "NVIDIA's legacy hook, added by `docker run --gpus`".into(),
                honoured: true,
                note: Some(
                    "removed from config.json; the GPUs it stands for are read from NVIDIA_VISIBLE_DEVICES, which dockerd sets with it"
                        .into(),
                ),
            },
        });
    }
    if request.ignored_unprivileged_env {
        out.requests.push(RequestItem {
            source: "env",
            key: request::VISIBLE_DEVICES.into(),
            value: env_value(spec, request::VISIBLE_DEVICES).unwrap_or_default(),
            honoured: false,
            note: Some(format!(
                "ignored: the container is unprivileged (no CAP_SYS_ADMIN), accept-envvar-unprivileged = {} and nothing was allocated beside it; all and none are a CUDA image's own defaults",
                config.accept_envvar_unprivileged.name()
            )),
        });
    }
    for refused in &request.refused {
        if let request::RequestError::Refused { var, value, reason } = refused {
            out.requests.push(RequestItem {
                source: "env",
                key: var.to_string(),
                value: value.clone(),
                honoured: false,
                note: Some(format!("refused (create fails): {reason}")),
            });
        }
    }
}

/// The mode `route` chose, and why, in the terms of `request::route`'s rules.
fn describe_route(route: &Route) -> RouteItem {
    let (name, cdi_devices) = match route {
        Route::Nothing(_) => ("none", Vec::new()),
        Route::Legacy(_) => ("legacy", Vec::new()),
        Route::Cdi(names, _) => ("cdi", names.clone()),
    };
    RouteItem {
        mode: name,
        reason: route.reason().to_string(),
        cdi_devices,
    }
}

/// The part of the original document that shapes what `apply` writes (`process.user`: device
/// nodes without an owner get the container user's), and nothing else.
fn skeleton(original: &Value) -> Value {
    match original.pointer("/process/user") {
        Some(user) => json!({"process": {"user": user}}),
        None => json!({}),
    }
}

fn array(doc: &Value, pointer: &str) -> Vec<Value> {
    doc.pointer(pointer)
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

fn describe_group(group: &EditGroup, base: &Value, original: &Value) -> GroupItem {
    let cause = match &group.cause {
        Cause::Gpu(g) => CauseItem::Gpu { gpu: g.into() },
        Cause::Driver => CauseItem::Driver,
        Cause::GpuMemoryLimits => CauseItem::GpuMemoryLimits,
        Cause::Feature(f) => CauseItem::Feature {
            variable: f.variable(),
            mode: f.mode(),
        },
        Cause::CdiSpec { path, kind } => CauseItem::CdiSpec {
            spec: path.clone(),
            kind: kind.clone(),
        },
        Cause::CdiDevice { name, path } => CauseItem::CdiDevice {
            device: name.clone(),
            spec: path.clone(),
        },
    };
    let mut doc = base.clone();
    // The whole plan applied without error, so each part of it applies too; were it not to,
    // the group shows its edits unapplied rather than nothing.
    if edits::apply(&mut doc, &group.edits).is_err() {
        return raw_group(cause, &group.edits);
    }
    let original_env = request::env_map(original).unwrap_or_default();
    let env = group
        .edits
        .env
        .iter()
        .map(|entry| {
            let key = entry.split_once('=').map_or(entry.as_str(), |(k, _)| k);
            EnvChange {
                entry: entry.clone(),
                replaces: original_env
                    .iter()
                    .find(|(k, _)| *k == key)
                    .map(|(k, v)| format!("{k}={v}"))
                    .filter(|old| old != entry),
            }
        })
        .collect();
    let mut hooks = Vec::new();
    if let Some(stages) = doc.get("hooks").and_then(Value::as_object) {
        for (stage, list) in stages {
            for h in list.as_array().into_iter().flatten() {
                hooks.push(HookItem {
                    stage: stage.clone(),
                    hook: h.clone(),
                });
            }
        }
    }
    GroupItem {
        cause,
        device_nodes: array(&doc, "/linux/devices"),
        cgroup_rules: array(&doc, "/linux/resources/devices"),
        mounts: array(&doc, "/mounts"),
        env,
        hooks,
        additional_gids: array(&doc, "/process/user/additionalGids")
            .iter()
            .filter_map(Value::as_u64)
            .filter_map(|g| u32::try_from(g).ok())
            .collect(),
        net_devices: doc
            .pointer("/linux/netDevices")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default(),
        intel_rdt: doc.pointer("/linux/intelRdt").cloned(),
    }
}

/// A group as its CDI-shaped edits, for the case the OCI rendering is unavailable.
fn raw_group(cause: CauseItem, e: &ContainerEdits) -> GroupItem {
    let values = |v: Value| v.as_array().cloned().unwrap_or_default();
    GroupItem {
        cause,
        device_nodes: values(serde_json::to_value(&e.device_nodes).unwrap_or_default()),
        cgroup_rules: Vec::new(),
        mounts: values(serde_json::to_value(&e.mounts).unwrap_or_default()),
        env: e
            .env
            .iter()
            .map(|entry| EnvChange {
                entry: entry.clone(),
                replaces: None,
            })
            .collect(),
        hooks: e
            .hooks
            .iter()
            .map(|h| HookItem {
                stage: h.hook_name.clone(),
                hook: serde_json::to_value(h).unwrap_or_default(),
            })
            .collect(),
        additional_gids: e.additional_gids.clone(),
        net_devices: Map::new(),
        intel_rdt: e
            .intel_rdt
            .as_ref()
            .and_then(|r| serde_json::to_value(r).ok()),
    }
}

/// A unified diff of the document before and after, both pretty-printed so each field is a
/// line whatever layout the file has.
fn diff(path: &Path, before: &Value, after: &Value) -> String {
    let pretty = |v: &Value| {
        let mut s = serde_json::to_string_pretty(v).unwrap_or_default();
        s.push('\n');
        s
    };
    let (a, b) = (pretty(before), pretty(after));
    let shown = path.display().to_string();
    similar::TextDiff::from_lines(&a, &b)
        .unified_diff()
        .context_radius(3)
        .header(&shown, &format!("{shown} (after create)"))
        .to_string()
}

// ---- text --------------------------------------------------------------------------------

fn s(v: &Value, key: &str) -> String {
    match v.get(key) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    }
}

fn device_line(d: &Value) -> String {
    let mut line = format!(
        "device  {}  {} {}:{}",
        s(d, "path"),
        s(d, "type"),
        s(d, "major"),
        s(d, "minor")
    );
    if let Some(m) = d.get("fileMode").and_then(Value::as_u64) {
        line.push_str(&format!("  mode {m:04o}"));
    }
    for key in ["uid", "gid"] {
        if d.get(key).is_some() {
            line.push_str(&format!("  {key} {}", s(d, key)));
        }
    }
    line
}

fn cgroup_line(r: &Value) -> String {
    let verb = if r.get("allow").and_then(Value::as_bool) == Some(true) {
        "allow"
    } else {
        "deny"
    };
    let num = |k: &str| {
        r.get(k)
            .and_then(Value::as_i64)
            .map_or("*".to_string(), |n| n.to_string())
    };
    format!(
        "cgroup  {verb} {} {}:{} {}",
        s(r, "type"),
        num("major"),
        num("minor"),
        s(r, "access")
    )
}

fn mount_line(m: &Value) -> String {
    let (dst, src) = (s(m, "destination"), s(m, "source"));
    let options: Vec<String> = m
        .get("options")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    let mut line = format!("mount   {dst}");
    if src != dst {
        line.push_str(&format!("  from {src}"));
    }
    if !options.is_empty() {
        line.push_str(&format!("  ({})", options.join(",")));
    }
    line
}

fn hook_line(stage: &str, h: &Value) -> String {
    let args: Vec<&str> = h
        .get("args")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut line = format!("hook    {stage}  {}", s(h, "path"));
    // args[0] is the program's own name.
    for a in args.iter().skip(1) {
        line.push(' ');
        line.push_str(a);
    }
    if let Some(env) = h.get("env").and_then(Value::as_array) {
        let env: Vec<&str> = env.iter().filter_map(Value::as_str).collect();
        line.push_str(&format!("  (env: {})", env.join(" ")));
    }
    line
}

fn cause_title(c: &CauseItem) -> String {
    match c {
        CauseItem::Gpu { gpu } => format!(
            "GPU {} ({}, bus {}, /dev/nvidia{})",
            gpu.index, gpu.uuid, gpu.bus_id, gpu.minor
        ),
        CauseItem::Driver => {
            "driver (for any GPU request: control nodes, libraries, binaries, hooks)".into()
        }
        CauseItem::GpuMemoryLimits => {
            "GPU memory limits (NVIDIA_GPU_MEMORY_REQUEST and NVIDIA_GPU_MEMORY_LIMIT): applied through NVML at createRuntime".into()
        }
        CauseItem::CdiSpec { spec, kind } => {
            format!(
                "CDI spec {} (kind {kind}): edits shared by its devices",
                spec.display()
            )
        }
        CauseItem::CdiDevice { device, spec } => {
            format!("CDI device {device} (from {})", spec.display())
        }
        CauseItem::Feature { variable, mode } => {
            let title = crate::host::gated::Feature::from_mode(mode).map_or("", |f| f.title());
            format!("{variable}=enabled: {title}, as NVIDIA's runtime gives it (mode {mode})")
        }
    }
}

/// The text form: sections, then the diff.
pub fn render_text(e: &Explanation) -> String {
    let mut o = String::new();
    let mut line = |s: String| {
        o.push_str(&s);
        o.push('\n');
    };
    line(format!("config.json:       {}", e.config_json.display()));
    line(format!(
        "nvshim config:     {} (mode = {})",
        e.nvshim_config
            .as_ref()
            .map_or("defaults (no file)".to_string(), |p| p
                .display()
                .to_string()),
        e.mode
    ));
    line(format!(
        "low-level runtime: {}",
        e.low_level_runtime
            .as_ref()
            .map_or("none found".to_string(), |p| p.display().to_string())
    ));
    line(String::new());
    line("Requests".into());
    if e.requests.is_empty() {
        line("  none (no NVIDIA_VISIBLE_DEVICES, CDI annotation or Docker --gpus hook)".into());
    }
    for r in &e.requests {
        let what = match r.source {
            "env" => format!("{:<14}{}={}", "env", r.key, r.value),
            "annotation" => format!("{:<14}{}: {}", "annotation", r.key, r.value),
            "mount" => format!("{:<14}{}", "mount", r.key),
            _ => format!("{:<14}{} ({})", "docker --gpus", r.key, r.value),
        };
        match &r.note {
            Some(n) => line(format!("  {what}  [{n}]")),
            None => line(format!("  {what}")),
        }
    }
    if !e.capabilities.is_empty() {
        line(format!(
            "  {:<14}{}",
            "capabilities",
            e.capabilities.join(",")
        ));
    }
    for r in &e.requirements {
        let state = if e.requirements_disabled {
            "not checked: NVIDIA_DISABLE_REQUIRE or disable-require"
        } else {
            "checked against the host"
        };
        line(format!(
            "  {:<14}{}={:?} ({state})",
            "requirement", r.var, r.expr
        ));
    }
    line(format!(
        "  {:<14}{}",
        "privileged",
        if e.privileged {
            "yes (CAP_SYS_ADMIN)"
        } else {
            "no"
        }
    ));
    if let Some(r) = &e.route {
        line(String::new());
        line(format!("Mode: {}", r.mode));
        line(format!("  {}", r.reason));
        for d in &r.cdi_devices {
            line(format!("  device {d}"));
        }
    }
    if let Some(n) = &e.nri {
        line(format!("Under nvshim-nri: {n}"));
    }
    if !e.gpus.is_empty() {
        line(String::new());
        line("GPUs".into());
        for g in &e.gpus {
            line(format!(
                "  index {}  {}  minor {}  bus {}  {}",
                g.index, g.uuid, g.minor, g.bus_id, g.model
            ));
        }
    }
    if !e.groups.is_empty() || !e.removed_hooks.is_empty() {
        line(String::new());
        line("Edits".into());
    }
    for g in &e.groups {
        line(format!("  {}", cause_title(&g.cause)));
        for d in &g.device_nodes {
            line(format!("    {}", device_line(d)));
        }
        for r in &g.cgroup_rules {
            line(format!("    {}", cgroup_line(r)));
        }
        for m in &g.mounts {
            line(format!("    {}", mount_line(m)));
        }
        for env in &g.env {
            match &env.replaces {
                Some(old) => line(format!("    env     {}  (replaces {old})", env.entry)),
                None => line(format!("    env     {}", env.entry)),
            }
        }
        for h in &g.hooks {
            line(format!("    {}", hook_line(&h.stage, &h.hook)));
        }
        for gid in &g.additional_gids {
            line(format!("    group   {gid} (process.user.additionalGids)"));
        }
        for (host, n) in &g.net_devices {
            line(format!("    netdev  {host} as {}", s(n, "name")));
        }
        if let Some(rdt) = &g.intel_rdt {
            line(format!("    intelRdt {rdt}"));
        }
    }
    if !e.removed_hooks.is_empty() {
        line("  Docker --gpus hook (removed: nvshim has done its work before runc starts)".into());
        for h in &e.removed_hooks {
            line(format!("    removed {}", hook_line("prestart", h)));
        }
    }
    if !e.warnings.is_empty() {
        line(String::new());
        line("Warnings".into());
        for w in &e.warnings {
            line(format!("  {w}"));
        }
    }
    line(String::new());
    match &e.error {
        Some(err) => line(format!("Result: create would fail: {err}")),
        None if e.changes_bundle => {
            let count = |f: fn(&GroupItem) -> usize| e.groups.iter().map(f).sum::<usize>();
            line(format!(
                "Result: create would rewrite config.json ({} device nodes, {} mounts, {} env entries, {} hooks added{}) and exec {}",
                count(|g| g.device_nodes.len()),
                count(|g| g.mounts.len()),
                count(|g| g.env.len()),
                count(|g| g.hooks.len()),
                if e.removed_hooks.is_empty() { "" } else { ", Docker's hook removed" },
                e.low_level_runtime
                    .as_ref()
                    .map_or("the low-level runtime".to_string(), |p| p.display().to_string())
            ))
        }
        None => line(format!(
            "Result: create would leave config.json untouched and exec {}",
            e.low_level_runtime
                .as_ref()
                .map_or("the low-level runtime".to_string(), |p| p
                    .display()
                    .to_string())
        )),
    }
    if !e.diff.is_empty() {
        line(String::new());
        o.push_str(&e.diff);
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nvidia::Capabilities;

    #[test]
    fn capabilities_in_env_spelling() {
        let c = Capabilities::parse(None).unwrap();
        assert_eq!(c.names(), vec!["compute", "utility"]);
        assert_eq!(Capabilities::ALL.names().len(), 7);
    }

    #[test]
    fn non_gpu_bundle_is_explained_as_untouched() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"process": {"env": ["PATH=/bin"]}}"#,
        )
        .unwrap();
        let e = explain(
            &Config::default(),
            None,
            &Input::Bundle(dir.path().to_path_buf()),
            Path::new("/usr/bin/nvshim-hook"),
            Ok(PathBuf::from("/usr/bin/runc")),
        );
        assert_eq!(e.error, None);
        assert!(!e.changes_bundle);
        assert_eq!(e.route.as_ref().map(|r| r.mode), Some("none"));
        assert!(render_text(&e).contains("create would leave config.json untouched"));
    }

    #[test]
    fn malformed_spec_file_is_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("spec.json");
        std::fs::write(&file, b"{").unwrap();
        let e = explain(
            &Config::default(),
            None,
            &Input::Spec(file.clone()),
            Path::new("/usr/bin/nvshim-hook"),
            Ok(PathBuf::from("/usr/bin/runc")),
        );
        let err = e.error.unwrap();
        assert!(err.contains(&file.display().to_string()), "{err}");
    }
}
