//! GPU and MIG discovery through NVML: for `nvshim cdi generate`, and for `create` only when a
//! request names a MIG device in a form that only NVML can map (`MIG-<uuid>`, `G:M`), then
//! through the `nvshim nvml-query` helper ([`NvmlAccess`]). Every other create reads `/proc`
//! and never loads NVML (loading and initialising it costs milliseconds per container start,
//! more on many-GPU nodes).
//!
//! The library is the host's `libnvidia-ml.so.1` as the host's own ld.so.cache under the
//! driver root names it, loaded by path, so a driver root such as `/run/nvidia/driver` is
//! honoured the way the shim honours it. nvml-wrapper resolves NVML symbols lazily; a symbol
//! the library lacks is an error of the call that needs it, never a crash.

mod cache;

use std::path::PathBuf;

use nvml_wrapper::error::{nvml_try, NvmlError};
use nvml_wrapper::{Device, Nvml};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::host::{normalize_bus_id, under_root, Host};

/// `NVML_DEVICE_MIG_ENABLE`.
const MIG_ENABLED: u32 = 1;

#[derive(Debug, Error)]
pub enum NvmlDiscoveryError {
    #[error("no 64-bit libnvidia-ml.so.1 in the host's ld.so.cache under {0}")]
    NotInCache(PathBuf),
    #[error("{context}: {source}")]
    Host {
        context: &'static str,
        source: crate::host::HostError,
    },
    #[error("NVML through {}: {message}", helper.display())]
    Helper { helper: PathBuf, message: String },
    #[error("NVML ({}): {what}: {source}", lib.display())]
    Nvml {
        lib: PathBuf,
        what: String,
        source: NvmlError,
    },
}

/// One MIG device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigInfo {
    /// Its handle index on the parent (`<gpu>:<index>` names it).
    pub index: u32,
    /// `MIG-<uuid>`.
    pub uuid: String,
    pub gpu_instance: u32,
    pub compute_instance: u32,
    /// `NVIDIA H100 80GB HBM3 MIG 1g.10gb`.
    pub name: String,
}

/// One physical GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// NVML index (PCI bus order).
    pub index: u32,
    /// `/dev/nvidia<minor>`.
    pub minor: u32,
    pub uuid: String,
    pub name: String,
    /// `0000:1b:00.0`.
    pub bus_id: String,
    pub mig_enabled: bool,
    pub migs: Vec<MigInfo>,
    /// Compute capability (`9.0`), for `NVIDIA_REQUIRE_*` `arch` terms; `None` if not reported.
    pub arch: Option<String>,
    /// libnvidia-container's brand name (`tesla`, ...), for `brand` terms.
    pub brand: Option<String>,
    /// Persistence mode (`nvshim doctor`); `None` where NVML does not report it.
    pub persistence_mode: Option<bool>,
}

/// What NVML reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvmlHost {
    pub lib: PathBuf,
    pub driver_version: String,
    pub gpus: Vec<GpuInfo>,
}

/// The host path of `libnvidia-ml.so.1`, from the driver root's ld.so.cache.
pub fn library_path(host: &Host) -> Result<PathBuf, NvmlDiscoveryError> {
    let root = &host.roots().driver_root;
    // Only libnvidia-ml's entries: a real node's cache has about 500 (tests/fixtures/host).
    let cache = host
        .ld_cache_of(&["libnvidia-ml"])
        .map_err(|source| NvmlDiscoveryError::Host {
            context: "reading the host's ld.so.cache",
            source,
        })?;
    cache
        .entries
        .iter()
        .find(|e| e.is_64bit() && e.name == "libnvidia-ml.so.1")
        .map(|e| under_root(root, &e.path))
        .ok_or_else(|| NvmlDiscoveryError::NotInCache(root.clone()))
}

/// The GPU and compute instance ids of a MIG device. nvml-wrapper 0.13 does not wrap these two
/// calls, so they go through its raw bindings.
fn instance_ids(nvml: &Nvml, dev: &Device) -> Result<(u32, u32), NvmlError> {
    let lib = nvml.lib();
    let gi_fn = lib
        .nvmlDeviceGetGpuInstanceId
        .as_ref()
        .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
    let ci_fn = lib
        .nvmlDeviceGetComputeInstanceId
        .as_ref()
        .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
    let (mut gi, mut ci) = (0u32, 0u32);
    // SAFETY: `dev.handle()` is a live MIG device handle obtained from `nvml`, which outlives
    // this call; `gi` is a valid, writable `unsigned int`.
    nvml_try(unsafe { gi_fn(dev.handle(), &mut gi) })?;
    // SAFETY: as above, for `ci`.
    nvml_try(unsafe { ci_fn(dev.handle(), &mut ci) })?;
    Ok((gi, ci))
}

/// Enumerates GPUs and MIG devices through the NVML library at `lib`.
pub fn discover(lib: PathBuf) -> Result<NvmlHost, NvmlDiscoveryError> {
    discover_with_progress(lib, &mut |_| {})
}

/// [`discover`], telling `progress` what it is doing: initialising NVML can take seconds per
/// GPU when persistence mode is off, and a large node has 8 or 16 GPUs with MIG devices.
pub fn discover_with_progress(
    lib: PathBuf,
    progress: &mut dyn FnMut(&str),
) -> Result<NvmlHost, NvmlDiscoveryError> {
    progress("initialising NVML");
    let err = |what: String| {
        let lib = lib.clone();
        move |source| NvmlDiscoveryError::Nvml { lib, what, source }
    };
    let nvml = Nvml::builder()
        .lib_path(lib.as_os_str())
        .init()
        .map_err(err("loading and initialising".into()))?;
    let driver_version = nvml
        .sys_driver_version()
        .map_err(err("driver version".into()))?;
    let count = nvml.device_count().map_err(err("device count".into()))?;
    let mut gpus = Vec::new();
    for index in 0..count {
        progress(&format!("NVML: GPU {} of {count}", index + 1));
        let what = |w: &str| format!("GPU {index}: {w}");
        let dev = nvml.device_by_index(index).map_err(err(what("handle")))?;
        let uuid = dev.uuid().map_err(err(what("UUID")))?;
        let minor = dev.minor_number().map_err(err(what("minor number")))?;
        let name = dev.name().map_err(err(what("name")))?;
        let pci = dev.pci_info().map_err(err(what("PCI info")))?;
        let bus_id = normalize_bus_id(&pci.bus_id).unwrap_or(pci.bus_id);
        // A GPU without MIG support answers NotSupported.
        let mig_enabled = match dev.mig_mode() {
            Ok(mode) => mode.current == MIG_ENABLED,
            Err(NvmlError::NotSupported) => false,
            Err(e) => return Err(err(what("MIG mode"))(e)),
        };
        let mut migs = Vec::new();
        if mig_enabled {
            let max = dev
                .mig_device_count()
                .map_err(err(what("MIG device count")))?;
            for m in 0..max {
                let mig = match dev.mig_device_by_index(m) {
                    Ok(d) => d,
                    // An unused MIG slot.
                    Err(NvmlError::NotFound) => continue,
                    Err(e) => return Err(err(what(&format!("MIG device {m}")))(e)),
                };
                let (gpu_instance, compute_instance) =
                    instance_ids(&nvml, &mig).map_err(err(what(&format!("MIG device {m} ids"))))?;
                migs.push(MigInfo {
                    index: m,
                    uuid: mig
                        .uuid()
                        .map_err(err(what(&format!("MIG device {m} UUID"))))?,
                    gpu_instance,
                    compute_instance,
                    name: mig.name().unwrap_or_default(),
                });
            }
        }
        // Both answer NotSupported on some GPUs and drivers; a requirement on them then says so.
        let arch = dev
            .cuda_compute_capability()
            .ok()
            .map(|cc| format!("{}.{}", cc.major, cc.minor));
        let brand = dev.brand().ok().map(|b| brand_name(&b).to_string());
        let persistence_mode = dev.is_in_persistent_mode().ok();
        gpus.push(GpuInfo {
            index,
            minor,
            uuid,
            name,
            bus_id,
            mig_enabled,
            migs,
            arch,
            brand,
            persistence_mode,
        });
    }
    Ok(NvmlHost {
        lib,
        driver_version,
        gpus,
    })
}

/// libnvidia-container's names for NVML brands (`src/nvc_info.c`), the words images use in
/// `NVIDIA_REQUIRE_CUDA` (`brand=tesla,driver>=470,driver<471 brand=nvidiartx,...`).
pub fn brand_name(brand: &nvml_wrapper::enum_wrappers::device::Brand) -> &'static str {
    use nvml_wrapper::enum_wrappers::device::Brand::*;
    match brand {
        Unknown => "unknown",
        Quadro => "quadro",
        Tesla => "tesla",
        NVS => "nvs",
        GRID => "grid",
        GeForce => "geforce",
        Titan => "titan",
        VApps => "nvidiavapps",
        VPC => "nvidiavpc",
        VCS => "nvidiavcs",
        VWS => "nvidiavws",
        CloudGaming | VGaming => "nvidiacloudgaming",
        QuadroRTX => "quadrortx",
        NvidiaRTX => "nvidiartx",
        Nvidia => "nvidia",
        GeForceRTX => "geforcertx",
        TitanRTX => "titanrtx",
    }
}

/// How a process gets the NVML inventory.
///
/// `nvshim-runtime` ships statically linked (a create costs about 0.35 ms less than
/// dynamically linked, a pass-through call about 0.3 ms less: docs/benchmarks.md), and a static
/// program cannot `dlopen` libnvidia-ml safely: the library pulls the host's `libc.so.6` in
/// beside the static C library. So the shim asks the dynamically linked `nvshim` instead, the rare times it needs NVML
/// (a MIG id, an `arch` or `brand` requirement). The helper is a host binary next to the shim;
/// it inherits the shim's environment, which comes from the engine, never from the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NvmlAccess {
    /// Load libnvidia-ml in this process (`nvshim` itself).
    InProcess,
    /// Run `<path> nvml-query --lib <libnvidia-ml>` and read its JSON.
    Helper(PathBuf),
}

/// The hidden `nvshim` subcommand [`NvmlAccess::Helper`] runs.
pub const HELPER_SUBCOMMAND: &str = "nvml-query";

/// What a create looks up in the NVML inventory, beside the GPUs' facts: which MIG devices'
/// GPUs the answer must still describe ([`cache`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup<'a> {
    /// `MIG-<uuid>`.
    MigUuid(&'a str),
    /// `G:M`: a MIG device of the GPU with NVML index `gpu`.
    MigIndex { gpu: u32 },
}

/// The NVML inventory a create asks for to make `lookups` (none: only the GPUs' facts), through
/// `access`, or from `host`'s `cache-dir` while no file it relies on has changed ([`cache`]);
/// without persistence modes.
pub fn inventory(
    host: &Host,
    access: &NvmlAccess,
    lookups: &[Lookup<'_>],
) -> Result<NvmlHost, NvmlDiscoveryError> {
    cache::answer(
        host,
        crate::cache::now_ns(),
        lookups,
        || library_path(host),
        |lib| query(lib, access),
    )
}

/// What NVML at `lib` reports, through `access`.
fn query(lib: PathBuf, access: &NvmlAccess) -> Result<NvmlHost, NvmlDiscoveryError> {
    let helper = match access {
        NvmlAccess::InProcess => return discover(lib),
        NvmlAccess::Helper(helper) => helper,
    };
    let fail = |message: String| NvmlDiscoveryError::Helper {
        helper: helper.clone(),
        message,
    };
    let out = std::process::Command::new(helper)
        .arg(HELPER_SUBCOMMAND)
        .arg("--lib")
        .arg(&lib)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| fail(e.to_string()))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(fail(format!("{}: {}", out.status, stderr.trim())));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| fail(format!("unreadable answer: {e}")))
}

/// One GPU's persistence mode as NVML reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Persistence {
    /// NVML index (PCI bus order).
    pub index: u32,
    pub uuid: String,
    /// `None`: NVML does not support asking on this GPU.
    pub enabled: Option<bool>,
}

/// Persistence mode of every GPU, for `nvshim doctor`. With it off, the driver tears a GPU down
/// when its last client exits and initialises it again on the next open: seconds per container
/// start on large nodes, and RPC time-outs on 8- and 16-GPU ones.
pub fn persistence_modes(lib: PathBuf) -> Result<Vec<Persistence>, NvmlDiscoveryError> {
    Ok(discover(lib)?
        .gpus
        .into_iter()
        .map(|g| Persistence {
            index: g.index,
            uuid: g.uuid,
            enabled: g.persistence_mode,
        })
        .collect())
}
