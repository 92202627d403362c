//! What a container asks for, read from its config.json, and where each ask came from.
//!
//! Pure functions over the spec document: no host access. Semantics follow NVIDIA's toolkit
//! (nvidia-toolkit-behaviour.md §3) with two deliberate differences:
//! - An unset `NVIDIA_VISIBLE_DEVICES` is never a GPU request, even in an old image that sets
//!   `CUDA_VERSION` without `NVIDIA_REQUIRE_CUDA` (NVIDIA's "legacy image" rule grants *all*
//!   GPUs to such images; an image alone should not be able to claim every GPU).
//! - Repeated ids are de-duplicated (a time-sliced GPU may be listed several times by the
//!   device plugin; NVIDIA's code turns duplicates into empty slots).

use std::collections::BTreeSet;

use serde_json::Value;
use thiserror::Error;

use crate::cdi::annotations::{self, AnnotatedDevice, AnnotationError};
use crate::cdi::name::{self as cdi_name, QualifiedNameError};
use crate::config::{Config, Mode};

pub const VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";
pub const DRIVER_CAPABILITIES: &str = "NVIDIA_DRIVER_CAPABILITIES";
pub const DISABLE_REQUIRE: &str = "NVIDIA_DISABLE_REQUIRE";
const REQUIRE_PREFIX: &str = "NVIDIA_REQUIRE_";

#[derive(Debug, Error, PartialEq, Eq)]
pub enum RequestError {
    #[error("process.env entry {0:?} has no '=' (expected KEY=VALUE)")]
    EnvWithoutEquals(String),
    #[error("unknown NVIDIA_DRIVER_CAPABILITIES value {value:?} (known: compute, compat32, graphics, utility, video, display, ngx, all)")]
    UnknownCapability { value: String },
    #[error("invalid requirement {expr:?} in {var}: {why}")]
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
    #[error("invalid CDI device request: {0}")]
    BadCdiName(#[from] QualifiedNameError),
}

/// The GPUs requested by `NVIDIA_VISIBLE_DEVICES`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VisibleDevices {
    /// Unset, empty or `void`: not a GPU container.
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
    let mut seen = BTreeSet::new();
    VisibleDevices::List(
        items
            .into_iter()
            .filter(|i| seen.insert(*i))
            .map(String::from)
            .collect(),
    )
}

/// Driver capabilities: which libraries and binaries are mounted
/// (libnvidia-container `src/options.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capabilities {
    pub compute: bool,
    pub compat32: bool,
    pub graphics: bool,
    pub utility: bool,
    pub video: bool,
    pub display: bool,
    pub ngx: bool,
}

impl Capabilities {
    pub const ALL: Capabilities = Capabilities {
        compute: true,
        compat32: true,
        graphics: true,
        utility: true,
        video: true,
        display: true,
        ngx: true,
    };

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

/// A requirement property (`internal/requirements`, libnvidia-container `src/dsl.c`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Property {
    Cuda,
    Driver,
    Arch,
    Brand,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// One `<prop><op><value>` term.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Term {
    pub property: Property,
    pub op: Op,
    pub value: String,
}

/// One `NVIDIA_REQUIRE_*` variable: alternatives (space) of conjunctions (comma).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    pub var: String,
    pub expr: String,
    pub any_of: Vec<Vec<Term>>,
}

/// Parses one requirement expression. Unknown properties are skipped, as NVIDIA does, so
/// images that name properties nvshim does not check still start.
pub fn parse_requirement(var: &str, expr: &str) -> Result<Requirement, RequestError> {
    let bad = |why: &str| RequestError::BadRequirement {
        var: var.to_string(),
        expr: expr.to_string(),
        why: why.to_string(),
    };
    let mut any_of = Vec::new();
    for alternative in expr.split_whitespace() {
        let mut all_of = Vec::new();
        for term in alternative.split(',').filter(|t| !t.is_empty()) {
            let at = term
                .find(['=', '!', '<', '>'])
                .ok_or_else(|| bad(&format!("term {term:?} has no operator")))?;
            let (name, rest) = term.split_at(at);
            let (op, value) = [
                ("<=", Op::Le),
                (">=", Op::Ge),
                ("!=", Op::Ne),
                ("=", Op::Eq),
                ("<", Op::Lt),
                (">", Op::Gt),
            ]
            .iter()
            .find_map(|(s, op)| rest.strip_prefix(s).map(|v| (*op, v)))
            .ok_or_else(|| bad(&format!("term {term:?} has an invalid operator")))?;
            if value.is_empty() {
                return Err(bad(&format!("term {term:?} has no value")));
            }
            let property = match name.to_ascii_lowercase().as_str() {
                "cuda" => Property::Cuda,
                "driver" => Property::Driver,
                "arch" => Property::Arch,
                "brand" => Property::Brand,
                _ => continue,
            };
            if matches!(property, Property::Cuda | Property::Driver | Property::Arch)
                && parse_version(value).is_none()
            {
                return Err(bad(&format!("{value:?} is not a version")));
            }
            all_of.push(Term {
                property,
                op,
                value: value.to_string(),
            });
        }
        if !all_of.is_empty() {
            any_of.push(all_of);
        }
    }
    Ok(Requirement {
        var: var.to_string(),
        expr: expr.to_string(),
        any_of,
    })
}

/// `580.65.06` → `[580, 65, 6]`.
pub fn parse_version(v: &str) -> Option<Vec<u64>> {
    v.split('.').map(|p| p.parse::<u64>().ok()).collect()
}

/// Compares dotted versions numerically, missing components as zero.
pub fn compare_versions(a: &[u64], b: &[u64]) -> std::cmp::Ordering {
    let n = a.len().max(b.len());
    (0..n)
        .map(|i| {
            a.get(i)
                .copied()
                .unwrap_or(0)
                .cmp(&b.get(i).copied().unwrap_or(0))
        })
        .find(|o| o.is_ne())
        .unwrap_or(std::cmp::Ordering::Equal)
}

impl Op {
    pub fn holds(self, ord: std::cmp::Ordering) -> bool {
        use std::cmp::Ordering::*;
        match self {
            Op::Eq => ord == Equal,
            Op::Ne => ord != Equal,
            Op::Lt => ord == Less,
            Op::Le => ord != Greater,
            Op::Gt => ord == Greater,
            Op::Ge => ord != Less,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Op::Eq => "=",
            Op::Ne => "!=",
            Op::Lt => "<",
            Op::Le => "<=",
            Op::Gt => ">",
            Op::Ge => ">=",
        }
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub devices: VisibleDevices,
    pub sources: Vec<Source>,
    pub capabilities: Capabilities,
    pub requirements: Vec<Requirement>,
    /// `NVIDIA_DISABLE_REQUIRE` is true.
    pub disable_require: bool,
    pub privileged: bool,
    /// An env request from an unprivileged container was ignored by config.
    pub ignored_unprivileged_env: bool,
    /// Devices named in `cdi-annotation-prefixes` annotations, in key order, de-duplicated
    /// (not read in `legacy` mode, where NVIDIA ignores them too).
    pub annotation_devices: Vec<AnnotatedDevice>,
}

impl Request {
    pub fn wants_gpus(&self) -> bool {
        self.devices != VisibleDevices::NotRequested
    }
}

/// The process environment as (key, value) pairs, later entries overriding earlier ones.
pub fn env_map(spec: &Value) -> Result<Vec<(&str, &str)>, RequestError> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    let Some(env) = spec.pointer("/process/env").and_then(Value::as_array) else {
        return Ok(out);
    };
    for entry in env.iter().filter_map(Value::as_str) {
        let (k, v) = entry
            .split_once('=')
            .ok_or_else(|| RequestError::EnvWithoutEquals(entry.to_string()))?;
        match out.iter_mut().find(|(key, _)| *key == k) {
            Some(slot) => slot.1 = v,
            None => out.push((k, v)),
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

/// Reads the request from a spec.
pub fn from_spec(spec: &Value, config: &Config) -> Result<Request, RequestError> {
    let env = env_map(spec)?;
    let privileged = is_privileged(spec);
    let mut devices = parse_visible_devices(lookup(&env, VISIBLE_DEVICES));
    let mut sources = Vec::new();
    let mut ignored_unprivileged_env = false;
    let docker_gpus = crate::edits::has_legacy_hook(spec);
    if docker_gpus {
        sources.push(Source::DockerGpusHook);
    }
    if devices != VisibleDevices::NotRequested {
        // `docker run --gpus` is the operator's own request through dockerd's API, not an env
        // var an image could carry, so it is honoured for unprivileged containers too.
        if privileged || config.accept_envvar_unprivileged || docker_gpus {
            sources.push(Source::Env(VISIBLE_DEVICES));
        } else {
            devices = VisibleDevices::NotRequested;
            ignored_unprivileged_env = true;
        }
    }
    let mut annotation_devices: Vec<AnnotatedDevice> = Vec::new();
    if config.mode != Mode::Legacy {
        // Annotations come from the orchestrator (a device plugin or DRA driver), not from the
        // image, so no privilege rule applies (nvidia-toolkit-behaviour.md §3.1).
        for a in annotations::parse(spec.get("annotations"), &config.cdi_annotation_prefixes)? {
            let source = Source::Annotation(a.key.clone());
            if !sources.contains(&source) {
                sources.push(source);
            }
            if !annotation_devices.iter().any(|d| d.device == a.device) {
                annotation_devices.push(a);
            }
        }
    }
    let wants = devices != VisibleDevices::NotRequested;
    // Capabilities and requirements only matter for GPU containers; an unknown capability in a
    // non-GPU container must not fail it.
    let capabilities = if wants {
        Capabilities::parse(lookup(&env, DRIVER_CAPABILITIES))?
    } else {
        Capabilities::default()
    };
    let mut requirements = Vec::new();
    if wants {
        for (k, v) in &env {
            if k.starts_with(REQUIRE_PREFIX) && !k.starts_with("NVIDIA_REQUIRE_JETPACK") {
                requirements.push(parse_requirement(k, v)?);
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
        annotation_devices,
    })
}

/// How a request is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Not a GPU container.
    Nothing,
    /// Resolved against the host (`legacy::resolve`).
    Legacy,
    /// These fully qualified CDI devices, from the spec directories.
    Cdi(Vec<String>),
}

/// Decides between legacy and CDI by `mode` (the CDI issue; NVIDIA's `internal/info/auto.go`):
/// - `legacy`: annotations are not read; `NVIDIA_VISIBLE_DEVICES` is resolved on the host.
/// - `cdi`: annotations if any, else `NVIDIA_VISIBLE_DEVICES`; names without a kind get
///   `cdi-default-kind` (`0` → `nvidia.com/gpu=0`, `all` → `nvidia.com/gpu=all`).
/// - `auto`: annotations if any (each must be fully qualified); else CDI when every id in
///   `NVIDIA_VISIBLE_DEVICES` is a qualified name, legacy when none is, an error when mixed.
///
/// Annotations take precedence over the environment, as in NVIDIA's `VisibleDevices`. A name
/// shaped `vendor/class=name` that breaks the name grammar is an error, not a legacy id.
pub fn route(request: &Request, config: &Config) -> Result<Route, RequestError> {
    let qualify = |id: &str| {
        if cdi_name::looks_qualified(id) {
            id.to_string()
        } else {
            format!("{}={id}", config.cdi_default_kind)
        }
    };
    let names: Vec<String> = match config.mode {
        Mode::Legacy => {
            return Ok(if request.wants_gpus() {
                Route::Legacy
            } else {
                Route::Nothing
            })
        }
        Mode::Cdi if !request.annotation_devices.is_empty() => request
            .annotation_devices
            .iter()
            .map(|d| qualify(&d.device))
            .collect(),
        Mode::Cdi => match &request.devices {
            VisibleDevices::NotRequested => return Ok(Route::Nothing),
            VisibleDevices::NoGpus => vec![qualify("none")],
            VisibleDevices::All => vec![qualify("all")],
            VisibleDevices::List(ids) => ids.iter().map(|d| qualify(d)).collect(),
        },
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
            request
                .annotation_devices
                .iter()
                .map(|d| d.device.clone())
                .collect()
        }
        Mode::Auto => match &request.devices {
            VisibleDevices::NotRequested => return Ok(Route::Nothing),
            VisibleDevices::NoGpus | VisibleDevices::All => return Ok(Route::Legacy),
            VisibleDevices::List(ids) => {
                let (qualified, unqualified): (Vec<String>, Vec<String>) = ids
                    .iter()
                    .cloned()
                    .partition(|d| cdi_name::looks_qualified(d));
                if qualified.is_empty() {
                    return Ok(Route::Legacy);
                }
                if !unqualified.is_empty() {
                    return Err(RequestError::MixedDeviceNames {
                        qualified,
                        unqualified,
                    });
                }
                qualified
            }
        },
    };
    let mut out: Vec<String> = Vec::new();
    for n in names {
        cdi_name::parse_qualified_name(&n)?;
        if !out.contains(&n) {
            out.push(n);
        }
    }
    Ok(Route::Cdi(out))
}

/// What the host offers, to check requirements against.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostFacts {
    pub driver_version: String,
    /// The CUDA version the driver supports (what `cuDriverGetVersion` reports).
    pub cuda_version: Option<String>,
    /// Per selected GPU: compute capability (`9.0`) and brand (`tesla`), when known.
    pub gpus: Vec<GpuFacts>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuFacts {
    pub arch: Option<String>,
    pub brand: Option<String>,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum RequirementError {
    #[error("unsatisfied condition: {var}={expr:?} (host: driver {driver}, CUDA {cuda}); set NVIDIA_DISABLE_REQUIRE=true to skip the check")]
    Unmet {
        var: String,
        expr: String,
        driver: String,
        cuda: String,
    },
    #[error("cannot check {var}={expr:?}: the GPU's {what} is unknown without NVML (is libnvidia-ml.so.1 under the driver root?)")]
    Unknown {
        var: String,
        expr: String,
        what: &'static str,
    },
}

impl Term {
    /// Evaluates against the host; `Err(what)` when a needed fact is unknown.
    fn holds(&self, facts: &HostFacts) -> Result<bool, &'static str> {
        let version = |have: &str| {
            let (Some(a), Some(b)) = (parse_version(have), parse_version(&self.value)) else {
                return false;
            };
            self.op.holds(compare_versions(&a, &b))
        };
        match self.property {
            Property::Driver => Ok(version(&facts.driver_version)),
            Property::Cuda => facts
                .cuda_version
                .as_deref()
                .map(version)
                .ok_or("CUDA version"),
            // Every selected GPU must match (libnvidia-container checks each device).
            Property::Arch => facts.gpus.iter().try_fold(true, |ok, g| {
                g.arch
                    .as_deref()
                    .map(|a| ok && version(a))
                    .ok_or("architecture")
            }),
            Property::Brand => facts.gpus.iter().try_fold(true, |ok, g| {
                g.brand
                    .as_deref()
                    .map(|b| {
                        let eq = b.eq_ignore_ascii_case(&self.value);
                        ok && match self.op {
                            Op::Eq => eq,
                            Op::Ne => !eq,
                            _ => false,
                        }
                    })
                    .ok_or("brand")
            }),
        }
    }
}

impl Requirement {
    /// True when any alternative holds entirely. An expression whose terms were all unknown
    /// properties holds.
    pub fn check(&self, facts: &HostFacts) -> Result<(), RequirementError> {
        if self.any_of.is_empty() {
            return Ok(());
        }
        let mut unknown = None;
        for alternative in &self.any_of {
            let mut all = true;
            for term in alternative {
                match term.holds(facts) {
                    Ok(true) => {}
                    Ok(false) => {
                        all = false;
                        break;
                    }
                    Err(what) => {
                        unknown.get_or_insert(what);
                        all = false;
                        break;
                    }
                }
            }
            if all {
                return Ok(());
            }
        }
        Err(match unknown {
            Some(what) => RequirementError::Unknown {
                var: self.var.clone(),
                expr: self.expr.clone(),
                what,
            },
            None => RequirementError::Unmet {
                var: self.var.clone(),
                expr: self.expr.clone(),
                driver: facts.driver_version.clone(),
                cuda: facts
                    .cuda_version
                    .clone()
                    .unwrap_or_else(|| "unknown".into()),
            },
        })
    }

    /// True when a term needs per-GPU facts (arch or brand), which cost an NVML load.
    pub fn needs_gpu_facts(&self) -> bool {
        self.any_of
            .iter()
            .flatten()
            .any(|t| matches!(t.property, Property::Arch | Property::Brand))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
        cfg.accept_envvar_unprivileged = false;
        let r = from_spec(&spec, &cfg).unwrap();
        assert!(!r.wants_gpus());
        assert!(r.ignored_unprivileged_env);
        let spec = json!({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=1"], "capabilities": {"bounding": ["CAP_SYS_ADMIN"]}}});
        assert!(from_spec(&spec, &cfg).unwrap().wants_gpus());
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

    fn cdi(names: &[&str]) -> Result<Route, RequestError> {
        Ok(Route::Cdi(names.iter().map(|s| s.to_string()).collect()))
    }

    #[test]
    fn route_auto() {
        let env = |v: &str| json!({"process": {"env": [format!("NVIDIA_VISIBLE_DEVICES={v}")]}});
        assert_eq!(route_of(json!({}), Mode::Auto), Ok(Route::Nothing));
        assert_eq!(route_of(env("0,1"), Mode::Auto), Ok(Route::Legacy));
        assert_eq!(route_of(env("all"), Mode::Auto), Ok(Route::Legacy));
        assert_eq!(
            route_of(
                env("nvidia.com/gpu=0,nvidia.com/gpu=1,nvidia.com/gpu=0"),
                Mode::Auto
            ),
            cdi(&["nvidia.com/gpu=0", "nvidia.com/gpu=1"])
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
            cdi(&["nvidia.com/gpu=0", "nvidia.com/gpu=1"])
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
            cdi(&[
                "nvidia.com/gpu=0",
                "nvidia.com/gpu=1",
                "nvidia.com/gpu=GPU-abc"
            ])
        );
        assert_eq!(
            route_of(env("all"), Mode::Cdi),
            cdi(&["nvidia.com/gpu=all"])
        );
        assert_eq!(route_of(env("void"), Mode::Cdi), Ok(Route::Nothing));
        assert_eq!(
            route_of(json!({"annotations": {"cdi.k8s.io/x": "0"}}), Mode::Cdi),
            cdi(&["nvidia.com/gpu=0"])
        );
        // Legacy mode does not read annotations at all.
        assert_eq!(
            route_of(
                json!({"annotations": {"cdi.k8s.io/x": "nvidia.com/gpu=0"}}),
                Mode::Legacy
            ),
            Ok(Route::Nothing)
        );
        assert_eq!(
            route_of(env("nvidia.com/gpu=0"), Mode::Legacy),
            Ok(Route::Legacy)
        );
    }
}
