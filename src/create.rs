//! `create`: from a bundle and the host to an edited config.json, or a clear error and an
//! untouched bundle. `nvshim explain` runs [`plan`] alone, without the write.

use std::path::{Path, PathBuf};

use serde_json::Value;
use thiserror::Error;

use crate::bundle::{Bundle, BundleError};
use crate::cdi;
use crate::config::{Config, Platform};
use crate::edits::{self, Cause, ContainerEdits, EditError, EditGroup};
use crate::host::nvml::{self, NvmlAccess};
use crate::host::{cuda_version_for_driver, Gpu, Host, HostError, Inventory};
use crate::install::{host_from, Tools};
use crate::legacy::{self, LegacyError};
use crate::request::{self, GpuFacts, HostFacts, Request, RequestError, RequirementError, Route};

#[derive(Debug, Error)]
pub enum CreateError {
    #[error(transparent)]
    Bundle(#[from] BundleError),
    #[error("{path}: {source}")]
    Request { path: PathBuf, source: RequestError },
    #[error(transparent)]
    Legacy(#[from] LegacyError),
    #[error(transparent)]
    Host(#[from] HostError),
    #[error(transparent)]
    Requirement(#[from] RequirementError),
    #[error("{path}: {source}")]
    Platform {
        path: PathBuf,
        source: crate::host::platform::PlatformError,
    },
    #[error("cannot edit {path}: {source}")]
    Edit { path: PathBuf, source: EditError },
    #[error("{path}: {source}")]
    Cdi {
        path: PathBuf,
        source: cdi::ResolveError,
    },
    #[error("{path}: {source}")]
    MountIntoBindMount {
        path: PathBuf,
        source: crate::rootfs::MountCheckError,
    },
    #[error("the hook binary {hook} does not exist, so the container would die in runc with `fork/exec {hook}: no such file or directory`; install nvshim-hook there (`cargo build --release` builds it beside nvshim-runtime), or set hook-path in the nvshim config to where it is")]
    HookMissing { hook: String },
    #[error("the hook binary {hook} named by a CDI spec does not exist, so the container would die in runc; install it, or regenerate the spec (`nvshim cdi generate`)")]
    SpecHookMissing { hook: String },
}

/// Everything `create` would do, computed without writing.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The bundle as loaded; its document has moved to `edited`.
    pub bundle: Bundle,
    pub request: Request,
    /// How the request is served.
    pub route: Route,
    /// The GPUs resolved (legacy requests).
    pub gpus: Vec<Gpu>,
    /// The CDI devices injected (CDI requests), fully qualified.
    pub cdi_devices: Vec<String>,
    /// The edits grouped by what caused them, as the resolvers made them (what `nvshim explain`
    /// shows): per GPU and the driver (legacy), per spec and device (CDI), then the memory-limit
    /// hook. Applied as their concatenation ([`edits::apply_all_deferred`]), never copied into
    /// one.
    pub groups: Vec<EditGroup>,
    /// config.json after the edits, but for its `mounts`, `linux.devices` and
    /// `linux.resources.devices`: those as loaded, what the edits make of them in `deferred`
    /// ([`Plan::document`] has both in one document).
    pub edited: Value,
    /// The mounts, device nodes and cgroup rules the edits add, kept as the edits' own and
    /// written straight into config.json ([`edits::Deferred`]).
    pub deferred: edits::Deferred,
    /// Whether planning edited the document at all: an edit applied, Docker's hook or the
    /// device plugin's mounts removed. A touched document can still equal the original (a
    /// retried create applies the same edits again), which [`Bundle::write_changed`] finds.
    pub touched: bool,
}

/// What [`plan_bundle`] found on its way, for `nvshim explain`: the hooks it removed and its
/// warnings (their one home), and the request, route and GPUs as far as it got, which a
/// failed plan has nowhere else.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    pub request: Option<Request>,
    pub route: Option<Route>,
    pub gpus: Vec<Gpu>,
    /// Prestart hooks removed from config.json: NVIDIA's legacy hook that `docker run --gpus`
    /// adds, which would edit the container a second time behind runc's back.
    pub removed_hooks: Vec<Value>,
    /// Things worth an operator's attention that do not stop `create` (also logged).
    pub warnings: Vec<String>,
}

impl Trace {
    fn warn(&mut self, message: String) {
        tracing::warn!("{message}");
        self.warnings.push(message);
    }
}

impl Plan {
    fn parts(&self) -> impl Iterator<Item = &ContainerEdits> {
        self.groups.iter().map(|g| &g.edits)
    }

    /// The edits as the list [`edits::Deferred`] takes them.
    fn part_list(&self) -> Vec<&ContainerEdits> {
        self.parts().collect()
    }

    /// config.json after the edits as one document (`edited` with `deferred` built in).
    pub fn document(&self) -> Result<Value, edits::EditError> {
        let mut doc = self.edited.clone();
        self.deferred.materialize(&mut doc, &self.part_list())?;
        Ok(doc)
    }

    /// The bind mounts of the edited document (`edits::binds`), its added mounts among them.
    fn binds(&self) -> Vec<(&str, &str)> {
        self.deferred.binds(&self.edited, &self.part_list())
    }

    /// Writes the edited document into the bundle unless it renders to the bytes that were
    /// read ([`crate::bundle::Bundle::write_changed`]); whether it wrote.
    fn save(&self) -> Result<bool, crate::bundle::BundleError> {
        self.deferred
            .save_changed(&self.bundle, &self.edited, &self.part_list())
    }
}

fn check_requirements(
    config: &Config,
    host: &Host,
    inv: &Inventory,
    request: &Request,
    gpus: &[Gpu],
    nvml: &NvmlAccess,
) -> Result<(), CreateError> {
    if config.disable_require || request.disable_require || request.requirements.is_empty() {
        return Ok(());
    }
    let driver_version = inv.driver_version.clone();
    let mut facts = HostFacts {
        cuda_version: cuda_version_for_driver(&driver_version).map(String::from),
        driver_version,
        gpus: gpus.iter().map(|_| GpuFacts::default()).collect(),
    };
    for r in &request.requirements {
        match r.check(&facts) {
            Ok(()) => {}
            // An `arch` or `brand` term had to be decided: the one case that loads NVML on
            // this path, once, for the GPUs the container gets.
            Err(RequirementError::Unknown { .. })
                if facts.gpus.iter().all(|g| g.arch.is_none()) =>
            {
                let inventory = nvml::inventory(host, nvml, &[]).map_err(|e| {
                    RequirementError::NvmlUnavailable {
                        var: r.var.clone(),
                        expr: r.expr.clone(),
                        reason: e.to_string(),
                    }
                })?;
                for (slot, gpu) in facts.gpus.iter_mut().zip(gpus) {
                    if let Some(f) = inventory
                        .gpus
                        .iter()
                        .find(|f| f.uuid.eq_ignore_ascii_case(&gpu.uuid))
                    {
                        slot.arch = f.arch.clone();
                        slot.brand = f.brand.clone();
                    }
                }
                r.check(&facts)?;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Computes what `create` would do to the bundle at `dir`.
pub fn plan(config: &Config, dir: &Path, tools: &Tools) -> Result<Plan, CreateError> {
    plan_bundle(
        config,
        Bundle::load_lean(dir)?,
        tools,
        &mut Trace::default(),
    )
}

/// Computes what `create` would do to `bundle`, recording in `trace` what it found on the way
/// (so a failure can still be explained).
pub fn plan_bundle(
    config: &Config,
    mut bundle: Bundle,
    tools: &Tools,
    trace: &mut Trace,
) -> Result<Plan, CreateError> {
    let config_path = bundle.config_path().to_path_buf();
    let request_error = |source| CreateError::Request {
        path: config_path.clone(),
        source,
    };
    let mut request = request::from_spec(&bundle.spec, config).map_err(request_error)?;
    // The kubelet's checkpoint is read only for an env request the rest did not back.
    if request.wants_checkpoint() {
        let allocated = kubelet_allocated(&bundle.spec, config);
        if !allocated.is_empty() || !allocated.envs.is_empty() {
            request = request::from_spec_allocated(&bundle.spec, config, allocated)
                .map_err(request_error)?;
        }
    }
    trace.request = Some(request.clone());
    if let Some(source) = request.refused.first() {
        return Err(CreateError::Request {
            path: config_path,
            source: source.clone(),
        });
    }
    if request.ignored_unprivileged_env {
        trace.warn(format!(
            "{}: ignoring NVIDIA_VISIBLE_DEVICES from an unprivileged container (accept-envvar-unprivileged = {}): all and none are a CUDA image's defaults, not an allocation",
            config_path.display(),
            config.accept_envvar_unprivileged.name()
        ));
    }
    // Moved, not copied: `create` needs only the edited document (and the original bytes).
    let mut edited = std::mem::take(&mut bundle.spec);
    if request.sources.contains(&request::Source::DockerGpusHook) {
        let before = legacy_hooks(&edited);
        edits::remove_legacy_hooks(&mut edited);
        let after = legacy_hooks(&edited);
        trace.removed_hooks = before.into_iter().filter(|h| !after.contains(h)).collect();
    }
    let route = request::route(&request, config).map_err(|source| CreateError::Request {
        path: config_path.clone(),
        source,
    })?;
    trace.route = Some(route.clone());
    // Device nodes back GPU ids the host resolves ([`check_backed`], legacy route only).
    if matches!(route, Route::Cdi(..)) && !request.unbacked.is_empty() {
        return Err(CreateError::Request {
            path: config_path,
            source: RequestError::Refused {
                var: request::VISIBLE_DEVICES,
                value: request.unbacked.join(","),
                reason: format!(
                    "the container is unprivileged and accept-envvar-unprivileged = \"allocation-backed\", and its allocation ({}) does not name these CDI devices: device nodes back GPU ids resolved on the host, not CDI names; unset NVIDIA_VISIBLE_DEVICES in the pod",
                    request.allocation.describe()
                ),
            },
        });
    }
    let mounts_removed = !matches!(route, Route::Nothing(_)) && !request.device_mounts.is_empty();
    if mounts_removed {
        // The device plugin's `/dev/null` mounts were the request and carry nothing else.
        request::remove_device_mounts(&mut edited, &request.device_mounts);
    }
    let mut plan = Plan {
        bundle,
        request,
        route: route.clone(),
        gpus: Vec::new(),
        cdi_devices: Vec::new(),
        groups: Vec::new(),
        edited,
        deferred: edits::Deferred::default(),
        touched: false,
    };
    // Mount sources known not to be directories (a legacy request's driver files); `None`:
    // asked of the host through the bind-source cache (a CDI request's).
    let mut not_dirs: Option<Vec<String>> = None;
    match route {
        Route::Nothing(_) => {}
        Route::Cdi(names, _) => {
            // As NVIDIA's `cdi` mode: the devices are the spec's (`nvidia.com/gds=all` & co.).
            for f in &plan.request.features {
                let (var, mode) = (f.variable(), f.mode());
                trace.warn(format!("{var}=enabled is ignored beside CDI devices: ask for the CDI device nvidia.com/{mode}=all (`nvshim cdi generate --mode {mode}` writes its spec)"));
            }
            apply_cdi(config, &mut plan, names, tools, trace)?
        }
        Route::Legacy(_) => {
            let host = host_from(config);
            let settings = legacy::Settings {
                bundle: absolute_bundle(&plan)
                    .filter(|_| !legacy::unnamed_fixups_in(&plan.edited, &tools.hook)),
                ..legacy::Settings::new(config, tools)
            };
            let (platform, _) = crate::host::platform::detect(&host, config.platform);
            let mut resolved = if matches!(platform, Platform::Wsl | Platform::Csv) {
                platform_resolve(config, &plan, &host, &settings, platform, trace)?
            } else {
                // NVML, for MIG ids that need it: asked once, its answer kept for both uses
                // below.
                let mut answer = None;
                let mut nvml = |lookups: &[nvml::Lookup<'_>]| {
                    if let Some(gpus) = &answer {
                        return Ok(Clone::clone(gpus));
                    }
                    let gpus = nvml::inventory(&host, &settings.nvml, lookups)?.gpus;
                    answer = Some(gpus.clone());
                    Ok(gpus)
                };
                // The host read once, for what this request can use (`legacy::scope`): the MIG
                // devices it names, when it names them.
                let scope = legacy::scope(&plan.request);
                let named = match &plan.request.devices {
                    // `all`: every device the driver lists.
                    _ if !scope.mig => None,
                    request::VisibleDevices::All => None,
                    _ => Some(legacy::named_mig_devices(
                        &plan.request,
                        &host.gpus()?,
                        &mut nvml,
                    )?),
                };
                let inv = Inventory::of_mig_devices(
                    &host,
                    scope,
                    &config.mps_pipe_directory,
                    named.as_deref(),
                )?;
                check_backed(&plan.request, &inv, &config_path)?;
                let resolved = legacy::resolve(&plan.request, &inv, &settings, &mut nvml)?;
                trace.gpus = resolved.gpus.clone();
                check_requirements(
                    config,
                    &host,
                    &inv,
                    &plan.request,
                    &resolved.gpus,
                    &tools.nvml,
                )?;
                resolved
            };
            // NVIDIA applies the feature-gated devices in its legacy and CSV modes alike
            // (src/legacy/gated.rs).
            let found = crate::host::gated::discover(&host, &plan.request.features);
            let gated = legacy::gated::resolve(&found);
            gated.warnings.into_iter().for_each(|w| trace.warn(w));
            resolved.groups.extend(gated.groups);
            trace.gpus = resolved.gpus.clone();
            let parts: Vec<&ContainerEdits> = resolved.groups.iter().map(|g| &g.edits).collect();
            plan.deferred =
                edits::apply_all_deferred(&mut plan.edited, &parts).map_err(|source| {
                    CreateError::Edit {
                        path: config_path,
                        source,
                    }
                })?;
            plan.gpus = resolved.gpus;
            plan.groups = resolved.groups;
            not_dirs = Some(resolved.not_dirs);
        }
    }
    add_memory_limit_hook(config, &mut plan, tools, trace)?;
    plan.touched =
        mounts_removed || !trace.removed_hooks.is_empty() || plan.parts().any(|e| !e.is_empty());
    check_hooks_exist(plan.parts().flat_map(|e| &e.hooks), &tools.hook, trace)?;
    if let Some(rootfs) = crate::rootfs::rootfs_path(&plan.edited, plan.bundle.dir()) {
        let added = plan.parts().flat_map(|e| &e.mounts);
        let kinds = |sources: &[&str]| match &mut not_dirs {
            Some(files) => {
                files.sort_unstable();
                let known = |s: &&str| files.binary_search_by(|f| f.as_str().cmp(s)).is_ok();
                sources.iter().map(|s| known(s).then_some(false)).collect()
            }
            None => vec![None; sources.len()],
        };
        crate::rootfs::check_added_mounts(&plan.binds(), &rootfs, added, kinds).map_err(
            |source| CreateError::MountIntoBindMount {
                path: plan.bundle.config_path().to_path_buf(),
                source,
            },
        )?;
    }
    if crate::userns::has_user_namespace(&plan.edited) {
        in_user_namespace(config, &mut plan, trace)?;
    }
    Ok(plan)
}

/// A container in a user namespace ([`crate::userns`]): device nodes runc would bind from the
/// wrong host path become binds of the right one, and added gids it cannot map are dropped.
/// The document is built whole for that (what was deferred, materialized).
fn in_user_namespace(
    config: &Config,
    plan: &mut Plan,
    trace: &mut Trace,
) -> Result<(), CreateError> {
    let path = plan.bundle.config_path().to_path_buf();
    let mut doc = plan.document().map_err(|source| CreateError::Edit {
        path: path.clone(),
        source,
    })?;
    let parts = plan.part_list();
    let moved = crate::userns::bind_device_nodes(&mut doc, &parts, &config.dev_root);
    let gids = crate::userns::drop_unmapped_gids(&mut doc, &parts);
    if moved.is_empty() && gids.is_empty() {
        return Ok(());
    }
    if !moved.is_empty() {
        tracing::info!(bundle = %plan.bundle.dir().display(), nodes = ?moved, "user namespace: device nodes bind-mounted from dev-root");
    }
    if !gids.is_empty() {
        trace.warn(format!(
            "{}: the container has a user namespace whose gid mappings do not map {gids:?}: these supplementary groups of the device nodes are not added (runc's setgroups would fail); map them 1:1 in linux.gidMappings to keep them",
            path.display()
        ));
    }
    plan.edited = doc;
    plan.deferred = edits::Deferred::default();
    plan.touched = true;
    Ok(())
}

/// A legacy request on a WSL or Jetson (CSV) host ([`legacy::platform`]). The
/// `NVIDIA_REQUIRE_*` checks need the driver's CUDA version, which nvshim reads from
/// `/proc/driver/nvidia` these hosts lack: they are skipped with a warning (NVIDIA's runtime
/// skips them on WSL too).
fn platform_resolve(
    config: &Config,
    plan: &Plan,
    host: &Host,
    settings: &legacy::Settings,
    platform: Platform,
    trace: &mut Trace,
) -> Result<legacy::Resolved, CreateError> {
    let path = plan.bundle.config_path();
    // The last of repeated keys counts, as in NVIDIA's image (`internal/modifier/cdi.go`
    // compares the whole value).
    let all_csv = request::env_map(&plan.edited).is_ok_and(|env| {
        env.iter()
            .rev()
            .find(|(k, _)| *k == "NVIDIA_REQUIRE_JETPACK")
            .is_some_and(|(_, v)| *v == "csv-mounts=all")
    });
    let resolved = legacy::platform::resolve(
        platform,
        &plan.request,
        host,
        settings,
        &config.csv_mount_spec_path,
        all_csv,
    )
    .map_err(|source| CreateError::Platform {
        path: path.to_path_buf(),
        source,
    })?;
    let checked = !(config.disable_require || plan.request.disable_require);
    if checked && !plan.request.requirements.is_empty() {
        trace.warn(format!(
            "{}: NVIDIA_REQUIRE_* not checked on this {} host (no /proc/driver/nvidia to read the CUDA version from)",
            path.display(),
            platform.name()
        ));
    }
    Ok(resolved)
}

/// The annotations containerd's CRI sets on every container (containerd
/// `pkg/cri/annotations`): the pod's UID and the container's name, as the kubelet's
/// checkpoint keys its entries. A pod cannot set them: containerd passes pod annotations on
/// only for the operator's `pod_annotations` patterns.
const SANDBOX_UID: &str = "io.kubernetes.cri.sandbox-uid";
const CONTAINER_NAME: &str = "io.kubernetes.cri.container-name";

/// The device ids the kubelet's device manager allocated to this container, from its
/// checkpoint (`kubelet-device-checkpoint`), for `accept-envvar-unprivileged =
/// "allocation-backed"` only. The kubelet writes an allocation there when it admits the pod,
/// before it asks for the container; its format (kubelet `devicemanager/checkpoint`):
/// `{"Data": {"PodDeviceEntries": [{"PodUID", "ContainerName", "ResourceName", "DeviceIDs":
/// {"<numa node>": [ids]} (a plain list before Kubernetes 1.20), "AllocResp"}]}, "Checksum"}`.
/// A time-sliced replica's id `<id>::<n>` counts as `<id>` (what NVIDIA's plugin puts in the
/// variable). The envs of `AllocResp` ([`request::kubelet`]) are kept, and the ids of an
/// `NVIDIA_VISIBLE_DEVICES` among them added (the device plugin's own value: indexes with its
/// `--device-id-strategy=index`). Anything missing or unreadable is no allocation: the request
/// is then judged on the rest.
fn kubelet_allocated(spec: &Value, config: &Config) -> request::Allocation {
    let mut allocation = request::Allocation::default();
    let path = &config.kubelet_device_checkpoint;
    if config.accept_envvar_unprivileged != crate::config::UnprivilegedEnv::AllocationBacked
        || path.as_os_str().is_empty()
    {
        return allocation;
    }
    let annotation = |k: &str| spec.get("annotations")?.get(k)?.as_str();
    let (Some(uid), Some(name)) = (annotation(SANDBOX_UID), annotation(CONTAINER_NAME)) else {
        return allocation;
    };
    let Some(bytes) = crate::cache::read_private(path, "kubelet device checkpoint") else {
        return allocation;
    };
    let Ok(doc) = serde_json::from_slice::<Value>(&bytes) else {
        tracing::warn!("{}: not JSON; its allocations are not used", path.display());
        return allocation;
    };
    let entries = doc
        .pointer("/Data/PodDeviceEntries")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|e| {
            e.get("PodUID").and_then(Value::as_str) == Some(uid)
                && e.get("ContainerName").and_then(Value::as_str) == Some(name)
        });
    let out = &mut allocation.names;
    for e in entries {
        let lists: Vec<&Value> = match e.get("DeviceIDs") {
            Some(Value::Object(per_numa)) => per_numa.values().collect(),
            Some(list @ Value::Array(_)) => vec![list],
            _ => Vec::new(),
        };
        let envs = e
            .get("AllocResp")
            .and_then(Value::as_str)
            .and_then(request::kubelet::allocate_envs)
            .unwrap_or_default();
        let env_ids = envs
            .iter()
            .filter(|(k, _)| k == request::VISIBLE_DEVICES)
            .flat_map(|(_, v)| v.split(','));
        let ids = lists
            .into_iter()
            .filter_map(Value::as_array)
            .flatten()
            .filter_map(Value::as_str)
            .chain(env_ids);
        for id in ids {
            let id = id.split_once("::").map_or(id, |(base, _)| base);
            if !id.is_empty() && !out.iter().any(|x| x == id) {
                out.push(id.to_string());
            }
        }
        allocation.envs.extend(envs);
    }
    allocation
}

/// `accept-envvar-unprivileged = "allocation-backed"`: ids the allocation's names did not back
/// ([`Request::unbacked`]) pass when every GPU they resolve to has its node among the
/// allocation's device nodes. A MIG id never does: a GPU's node does not say which of its MIG
/// devices was allocated.
fn check_backed(request: &Request, inv: &Inventory, path: &Path) -> Result<(), CreateError> {
    if request.unbacked.is_empty() {
        return Ok(());
    }
    let (gpu_ids, migs) =
        legacy::split_mig_ids(&request::VisibleDevices::List(request.unbacked.clone()));
    let nvidia = inv.majors.nvidia;
    let outside: Vec<String> = legacy::select_gpus(&gpu_ids, &inv.gpus)?
        .into_iter()
        .filter(|g| !request.allocation.nodes.contains(&(nvidia, g.minor)))
        .map(|g| format!("GPU {} ({})", g.index, g.uuid))
        .chain(migs.into_iter().map(|(id, _)| format!("MIG device {id}")))
        .collect();
    if outside.is_empty() {
        return Ok(());
    }
    Err(CreateError::Request {
        path: path.to_path_buf(),
        source: RequestError::Refused {
            var: request::VISIBLE_DEVICES,
            value: request.unbacked.join(","),
            reason: format!(
                "the container is unprivileged and accept-envvar-unprivileged = \"allocation-backed\", and its allocation ({}) does not hold {}; unset NVIDIA_VISIBLE_DEVICES in the pod, or let the device plugin name its GPUs (volume-mounts or CDI strategies)",
                request.allocation.describe(),
                outside.join(", ")
            ),
        },
    })
}

/// Adds the `apply-cuda-memory-limits` hook when the container asks for GPU memory limits
/// ([`crate::memory_limits`]); one scan of the env otherwise.
fn add_memory_limit_hook(
    config: &Config,
    plan: &mut Plan,
    tools: &Tools,
    trace: &mut Trace,
) -> Result<(), CreateError> {
    if !crate::memory_limits::requested(&plan.edited) {
        return Ok(());
    }
    let host = host_from(config);
    let selection = crate::memory_limits::Selection {
        edited: &plan.edited,
        route: &plan.route,
        request: &plan.request,
        gpus: &plan.gpus,
        cdi_devices: &plan.cdi_devices,
        groups: &plan.groups,
    };
    let (hook, warnings) = crate::memory_limits::hook(config, &host, &selection, &tools.hook)?;
    for w in warnings {
        trace.warn(w);
    }
    let Some(hook) = hook else {
        return Ok(());
    };
    // A hook only: `edits::apply` would build a mount or device node into `edited`, beside
    // `plan.deferred`.
    let added = ContainerEdits {
        hooks: vec![hook],
        ..Default::default()
    };
    edits::apply(&mut plan.edited, &added).map_err(|source| CreateError::Edit {
        path: plan.bundle.config_path().to_path_buf(),
        source,
    })?;
    plan.groups.push(EditGroup {
        cause: Cause::GpuMemoryLimits,
        edits: added,
    });
    Ok(())
}

/// The prestart hooks of a spec (to tell which ones [`edits::remove_legacy_hooks`] removed).
fn legacy_hooks(spec: &Value) -> Vec<Value> {
    spec.pointer("/hooks/prestart")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

/// The bundle directory as runc sees it: made absolute against the same working directory.
fn absolute_bundle(plan: &Plan) -> Option<PathBuf> {
    std::path::absolute(plan.bundle.dir()).ok()
}

/// Serves a CDI request from the spec directories: reads the spec files that define the
/// requested devices (through the index in `cache-dir`) and nothing else of the host (no NVML,
/// no /proc).
fn warn_spec_errors(registry: &cdi::Registry, trace: &mut Trace) {
    for e in registry.errors() {
        trace.warn(format!("skipping CDI spec: {e}"));
    }
}

fn apply_cdi(
    config: &Config,
    plan: &mut Plan,
    names: Vec<String>,
    tools: &Tools,
    trace: &mut Trace,
) -> Result<(), CreateError> {
    let path = plan.bundle.config_path().to_path_buf();
    // A long-running process (nvshim-nri) keeps the registry in memory; a create loads it.
    let resolved = match &tools.cdi {
        Some(registry) => {
            warn_spec_errors(registry, trace);
            registry.resolve_grouped(&names)
        }
        None => {
            let registry =
                cdi::Registry::load_for(&config.cdi_spec_dirs, &names, &config.cache_dir);
            warn_spec_errors(&registry, trace);
            registry.into_grouped(&names)
        }
    };
    let grouped = match resolved {
        Ok(g) => g,
        Err(source) if plan.request.cdi_already_applied => {
            trace.warn(format!(
                "{}: NVIDIA_VISIBLE_DEVICES=void next to CDI annotations and {source}: assuming the engine applied them",
                path.display()
            ));
            return Ok(());
        }
        Err(source) => return Err(CreateError::Cdi { path, source }),
    };
    let mut groups: Vec<EditGroup> = grouped
        .into_iter()
        .map(|(origin, edits)| EditGroup {
            cause: match origin {
                cdi::registry::EditsOrigin::Spec { path, kind } => Cause::CdiSpec { path, kind },
                cdi::registry::EditsOrigin::Device { name, path } => {
                    Cause::CdiDevice { name, path }
                }
            },
            edits,
        })
        .collect();
    // A spec nvshim generated runs nvshim's fix-ups hook: one process for all its devices,
    // and named the bundle, it need not wait for the OCI state (as for a legacy request).
    legacy::merge_fixups(&mut groups, &tools.hook);
    let named =
        absolute_bundle(plan).filter(|_| !legacy::unnamed_fixups_in(&plan.edited, &tools.hook));
    if let Some(bundle) = named {
        for hook in groups.iter_mut().flat_map(|g| &mut g.edits.hooks) {
            legacy::name_bundle(hook, &tools.hook, &bundle);
        }
    }
    let stale: Vec<String> = groups
        .iter_mut()
        .flat_map(|g| cdi::registry::stale_device_nodes_filling(&mut g.edits))
        .collect();
    let parts: Vec<&ContainerEdits> = groups.iter().map(|g| &g.edits).collect();
    for stale in stale {
        trace.warn(format!("stale CDI spec: {stale}"));
    }
    if plan.request.cdi_already_applied {
        // Decided from the content, not from `void` (which an image can set itself): the
        // engine applied the devices when every device node they bring is already there.
        let present: std::collections::HashSet<&str> = plan
            .edited
            .pointer("/linux/devices")
            .and_then(Value::as_array)
            .map(|d| d.iter().filter_map(|x| x.get("path")?.as_str()).collect())
            .unwrap_or_default();
        if parts
            .iter()
            .flat_map(|e| &e.device_nodes)
            .all(|d| present.contains(d.path.as_str()))
        {
            return Ok(());
        }
        trace.warn(format!(
            "{}: NVIDIA_VISIBLE_DEVICES=void next to CDI annotations, but the engine has not applied {}: nvshim applies them",
            path.display(),
            names.join(", ")
        ));
    }
    plan.deferred = edits::apply_all_deferred(&mut plan.edited, &parts)
        .map_err(|source| CreateError::Edit { path, source })?;
    plan.cdi_devices = names;
    plan.groups = groups;
    Ok(())
}

/// Every hook the edits add must exist on the host: runc runs it before the container starts,
/// and a missing one kills the container with an error that names neither nvshim nor the fix.
/// Two kinds are not the host's to check: a `startContainer` hook's path is resolved in the
/// container (the OCI runtime spec's `startContainer` hooks), so its binary may exist only in
/// the image; and a failed `poststop` hook is only logged by runc after the container is gone,
/// so a missing one is a warning. One `stat` per hook (two to five per GPU container).
fn check_hooks_exist<'a>(
    hooks: impl IntoIterator<Item = &'a edits::Hook>,
    own_hook: &Path,
    trace: &mut Trace,
) -> Result<(), CreateError> {
    // Each path once: a spec's hooks mostly run the same binary (NVIDIA's three, nvshim's).
    let mut found: Vec<&str> = Vec::new();
    for h in hooks {
        if h.hook_name == "startContainer" || found.contains(&h.path.as_str()) {
            continue;
        }
        let path = Path::new(&h.path);
        if std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
            found.push(&h.path);
            continue;
        }
        let hook = h.path.clone();
        if h.hook_name == "poststop" {
            trace.warn(format!(
                "the poststop hook {hook} named by a CDI spec does not exist; runc will log its \
                 failure when the container is deleted"
            ));
            continue;
        }
        return Err(if path == own_hook {
            CreateError::HookMissing { hook }
        } else {
            CreateError::SpecHookMissing { hook }
        });
    }
    Ok(())
}

/// The env entries that ask for devices, as they start in config.json's JSON (`"KEY=`):
/// every other `NVIDIA_*` variable (`NVIDIA_REQUIRE_CUDA`, `NVIDIA_PRODUCT_NAME`,
/// `NVIDIA_DRIVER_CAPABILITIES`, ... which CUDA base images set) asks for nothing alone.
const REQUEST_ENV_MARKERS: &[&str] = &[
    "\"NVIDIA_VISIBLE_DEVICES=",
    "\"NVIDIA_IMEX_CHANNELS=",
    "\"NVIDIA_MIG_CONFIG_DEVICES=",
    "\"NVIDIA_MIG_MONITOR_DEVICES=",
];

/// True when config.json's raw bytes could hold a GPU request: a request variable
/// ([`REQUEST_ENV_MARKERS`]), a CDI annotation prefix, NVIDIA's legacy hook or the device
/// plugin's mount root. Checked only when the document cannot be read: a bundle without any
/// of these is not nvshim's business, whatever runc accepts in it (a JSON escape can hide a
/// marker, but then the container only goes without GPUs, as it would under runc alone).
pub fn may_request_gpus(bytes: &[u8], config: &Config) -> bool {
    let has =
        |needle: &[u8]| !needle.is_empty() && bytes.windows(needle.len()).any(|w| w == needle);
    // Env entries are JSON strings: the quote keeps a script in `process.args` that only
    // mentions the names from counting.
    REQUEST_ENV_MARKERS.iter().any(|m| has(m.as_bytes()))
        || has(request::DEVICE_MOUNT_ROOT.as_bytes())
        || edits::LEGACY_HOOK_NAMES.iter().any(|n| has(n.as_bytes()))
        || config
            .cdi_annotation_prefixes
            .iter()
            .any(|p| has(p.as_bytes()))
}

/// Plans and, when anything changes, writes config.json atomically. `Ok(None)`: the bundle
/// could not be read but asks for no GPU, so it is passed on untouched for runc to judge.
pub fn create(config: &Config, dir: &Path, tools: &Tools) -> Result<Option<Plan>, CreateError> {
    let plan = match plan(config, dir, tools) {
        Ok(plan) => plan,
        Err(e @ (CreateError::Bundle(_) | CreateError::Request { .. })) => {
            let marked = match crate::bundle::read_config(dir) {
                Ok(bytes) => may_request_gpus(&bytes, config),
                Err(_) => true,
            };
            if marked {
                return Err(e);
            }
            tracing::info!(bundle = %dir.display(), "no GPU request in a config.json nvshim cannot read ({e}); passed on untouched");
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    if plan.touched && plan.save()? {
        tracing::info!(
            bundle = %dir.display(),
            gpus = ?plan.gpus.iter().map(|g| g.uuid.as_str()).collect::<Vec<_>>(),
            cdi_devices = ?plan.cdi_devices,
            devices = plan.parts().map(|e| e.device_nodes.len()).sum::<usize>(),
            mounts = plan.parts().map(|e| e.mounts.len()).sum::<usize>(),
            "edited config.json"
        );
    }
    Ok(Some(plan))
}
