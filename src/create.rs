//! `create`: from a bundle and the host to an edited config.json, or a clear error and an
//! untouched bundle. `nvshim explain` runs [`plan`] alone, without the write.

use std::path::{Path, PathBuf};

use serde_json::Value;
use thiserror::Error;

use crate::bundle::{Bundle, BundleError};
use crate::cdi;
use crate::config::Config;
use crate::edits::{self, ContainerEdits, EditError};
use crate::host::{cuda_version_for_driver, Gpu, Host, HostError, HostRoots};
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
    #[error("cannot edit {path}: {source}")]
    Edit { path: PathBuf, source: EditError },
    #[error("{path}: {source}")]
    Cdi {
        path: PathBuf,
        source: cdi::ResolveError,
    },
}

/// Everything `create` would do, computed without writing.
#[derive(Debug, Clone)]
pub struct Plan {
    pub bundle: Bundle,
    pub request: Request,
    /// The GPUs resolved (legacy requests).
    pub gpus: Vec<Gpu>,
    /// The CDI devices injected (CDI requests), fully qualified.
    pub cdi_devices: Vec<String>,
    pub edits: ContainerEdits,
    /// config.json after the edits.
    pub edited: Value,
}

impl Plan {
    pub fn changes_bundle(&self) -> bool {
        self.edited != self.bundle.spec
    }
}

/// The host as the config locates it.
pub fn host_from(config: &Config) -> Host {
    Host::new(HostRoots {
        driver_root: config.driver_root.clone(),
        dev_root: config.dev_root.clone(),
        proc_root: config.proc_root.clone(),
    })
}

/// The `nvshim-hook` written into hooks: the configured path, else the one installed next to
/// the running binary, else `/usr/bin/nvshim-hook`.
pub fn hook_path(config: &Config, self_exe: Option<&Path>) -> PathBuf {
    if let Some(p) = &config.hook_path {
        return p.clone();
    }
    self_exe
        .and_then(Path::parent)
        .map(|d| d.join("nvshim-hook"))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("/usr/bin/nvshim-hook"))
}

fn check_requirements(host: &Host, request: &Request, gpus: &[Gpu]) -> Result<(), CreateError> {
    if request.disable_require || request.requirements.is_empty() {
        return Ok(());
    }
    let driver_version = host.driver_version()?;
    let facts = HostFacts {
        cuda_version: cuda_version_for_driver(&driver_version).map(String::from),
        driver_version,
        // Architecture and brand are only known through NVML, which stays off this path; a
        // requirement on them reports that plainly (RequirementError::Unknown).
        gpus: gpus.iter().map(|_| GpuFacts::default()).collect(),
    };
    for r in &request.requirements {
        r.check(&facts)?;
    }
    Ok(())
}

/// Computes what `create` would do to the bundle at `dir`.
pub fn plan(config: &Config, dir: &Path, hook_path: &Path) -> Result<Plan, CreateError> {
    let bundle = Bundle::load(dir)?;
    let request =
        request::from_spec(&bundle.spec, config).map_err(|source| CreateError::Request {
            path: bundle.config_path().to_path_buf(),
            source,
        })?;
    if request.ignored_unprivileged_env {
        tracing::warn!(
            bundle = %dir.display(),
            "ignoring NVIDIA_VISIBLE_DEVICES from an unprivileged container (accept-envvar-unprivileged = false)"
        );
    }
    let mut plan = Plan {
        edited: bundle.spec.clone(),
        bundle,
        request,
        gpus: Vec::new(),
        cdi_devices: Vec::new(),
        edits: ContainerEdits::default(),
    };
    if plan
        .request
        .sources
        .contains(&request::Source::DockerGpusHook)
    {
        edits::remove_legacy_hooks(&mut plan.edited);
    }
    let route = request::route(&plan.request, config).map_err(|source| CreateError::Request {
        path: plan.bundle.config_path().to_path_buf(),
        source,
    })?;
    match route {
        Route::Nothing => return Ok(plan),
        Route::Cdi(names) => {
            apply_cdi(config, &mut plan, names)?;
            return Ok(plan);
        }
        Route::Legacy => {}
    }
    let host = host_from(config);
    let (gpus, edits) = legacy::resolve(&host, &plan.request, hook_path)?;
    check_requirements(&host, &plan.request, &gpus)?;
    edits::apply(&mut plan.edited, &edits).map_err(|source| CreateError::Edit {
        path: plan.bundle.config_path().to_path_buf(),
        source,
    })?;
    plan.gpus = gpus;
    plan.edits = edits;
    Ok(plan)
}

/// Serves a CDI request from the spec directories: reads the spec files and nothing else of
/// the host (no NVML, no /proc), so a CDI create costs one directory scan.
fn apply_cdi(config: &Config, plan: &mut Plan, names: Vec<String>) -> Result<(), CreateError> {
    let path = plan.bundle.config_path().to_path_buf();
    let registry = cdi::Registry::load(&config.cdi_spec_dirs);
    for e in registry.errors() {
        tracing::warn!("skipping CDI spec: {e}");
    }
    let edits = registry
        .resolve(&names)
        .map_err(|source| CreateError::Cdi {
            path: path.clone(),
            source,
        })?;
    for stale in cdi::registry::stale_device_nodes(&edits) {
        tracing::warn!("stale CDI spec: {stale}");
    }
    edits::apply(&mut plan.edited, &edits).map_err(|source| CreateError::Edit { path, source })?;
    plan.cdi_devices = names;
    plan.edits = edits;
    Ok(())
}

/// Plans and, when anything changes, writes config.json atomically.
pub fn create(config: &Config, dir: &Path, hook_path: &Path) -> Result<Plan, CreateError> {
    let plan = plan(config, dir, hook_path)?;
    if plan.changes_bundle() {
        let mut bundle = plan.bundle.clone();
        bundle.spec = plan.edited.clone();
        bundle.save()?;
        tracing::info!(
            bundle = %dir.display(),
            gpus = ?plan.gpus.iter().map(|g| g.uuid.as_str()).collect::<Vec<_>>(),
            cdi_devices = ?plan.cdi_devices,
            devices = plan.edits.device_nodes.len(),
            mounts = plan.edits.mounts.len(),
            "edited config.json"
        );
    }
    Ok(plan)
}
