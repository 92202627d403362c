//! A fake `libnvidia-ml.so.1` for nvshim's tests.
//!
//! Built as a `cdylib`, it exports every NVML entry point NVIDIA's device plugin, GPU feature
//! discovery and DRA driver link (tests/fixtures/nvml/go-nvml-symbols.txt, where the list comes
//! from), and answers from a JSON [`Topology`] in the file named by [`TOPOLOGY_ENV`]: devices,
//! MIG devices and their GPU and compute instances (`instances`), memory, PCI, and in
//! `telemetry` events that never fire, no processes, PCI topology and NVLink, clocks and power
//! as constants. The rest answer `NVML_ERROR_NOT_SUPPORTED` (`unsupported`). `nvmlInit*` and
//! `nvmlShutdown` are counted as NVML counts them. The C types come from nvml-wrapper-sys, the
//! bindings nvml-wrapper itself uses, so the layouts cannot drift from what the caller expects.
//! NVIDIA's DRA driver stops at a GPU whose compute capability answers
//! `NVML_ERROR_NOT_SUPPORTED` (go-nvlib's `GetCudaComputeCapabilityAsString`): a topology for
//! it sets `computeCapability`, which also gives the architecture.
//!
//! Device handles are addresses of records leaked once at `nvmlInit_v2`; every handle passed
//! in is checked against them before use, so a bad handle is `NVML_ERROR_INVALID_ARGUMENT`,
//! never a wild read. MIG devices follow NVML: a MIG-enabled GPU reports
//! `nvmlDeviceGetMaxMigDeviceCount` = 7 and `nvmlDeviceGetMigDeviceHandleByIndex` answers
//! `NVML_ERROR_NOT_FOUND` for unused slots; a GPU without `migEnabled` answers
//! `NVML_ERROR_NOT_SUPPORTED` to MIG queries, as a GPU without MIG support does.
//!
//! Where the topology comes from: the file named by [`TOPOLOGY_ENV`] when the variable is set,
//! else [`TOPOLOGY_FILE`] in the directory of the library itself (its path as loaded, found
//! with `dladdr` on one of its own functions). The second form serves processes that get no
//! environment from the test: OCI hooks, which runc runs with the hook's explicit `env` only
//! (`nvshim-hook apply-cuda-memory-limits` loading the fake host's libnvidia-ml). Tests put the
//! file beside the copy of this library they install ([`topology_file_beside`]).
//!
//! GPU memory limits (`nvmlDeviceSetMemoryLimits_v1`, CUDA 13.4's nvml.h): a topology with
//! `memoryLimits: false` plays a driver that does not offer them (the call answers
//! `NVML_ERROR_FUNCTION_NOT_FOUND`); otherwise each successful call is appended as one JSON
//! line ([`MemoryLimitCall`]) to the topology's `memoryLimitLog` file, so tests can check what
//! a hook asked for.
//!
//! As an `rlib` it gives tests the [`Topology`] types to write the JSON with.

use std::ffi::{c_char, c_int, c_uint, CStr};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nvml_wrapper_sys::bindings::{
    nvmlDeviceAttributes_t, nvmlDevice_t,
    nvmlEnableState_enum_NVML_FEATURE_DISABLED as NVML_FEATURE_DISABLED,
    nvmlEnableState_enum_NVML_FEATURE_ENABLED as NVML_FEATURE_ENABLED, nvmlEnableState_t,
    nvmlMemory_t, nvmlPciInfo_t,
    nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND as FUNCTION_NOT_FOUND,
    nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE as INSUFFICIENT_SIZE,
    nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT as INVALID_ARGUMENT,
    nvmlReturn_enum_NVML_ERROR_NOT_FOUND as NOT_FOUND,
    nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED as NOT_SUPPORTED,
    nvmlReturn_enum_NVML_ERROR_UNINITIALIZED as UNINITIALIZED,
    nvmlReturn_enum_NVML_ERROR_UNKNOWN as UNKNOWN, nvmlReturn_enum_NVML_SUCCESS as SUCCESS,
    nvmlReturn_t, NVML_DEVICE_MIG_DISABLE, NVML_DEVICE_MIG_ENABLE,
};
use serde::{Deserialize, Serialize};

mod instances;
mod telemetry;
mod unsupported;

/// The environment variable naming the topology JSON file.
pub const TOPOLOGY_ENV: &str = "NVSHIM_FAKE_NVML_TOPOLOGY";

/// The topology file's name beside the library, read when [`TOPOLOGY_ENV`] is not set.
pub const TOPOLOGY_FILE: &str = "nvshim-fake-nvml-topology.json";

/// Where the library installed at `lib` looks for its topology without [`TOPOLOGY_ENV`].
pub fn topology_file_beside(lib: &Path) -> PathBuf {
    lib.with_file_name(TOPOLOGY_FILE)
}

/// One successful `nvmlDeviceSetMemoryLimits_v1` call, as appended to `memoryLimitLog`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryLimitCall {
    /// The device's UUID (`GPU-...` or `MIG-...`).
    pub uuid: String,
    pub name_space: String,
    /// Bytes.
    pub soft_limit: u64,
    /// Bytes.
    pub hard_limit: u64,
    /// The file name of the program that made the call (`/proc/self/exe`): a static
    /// `nvshim-hook` must leave NVML to the dynamic `nvshim`.
    #[serde(default)]
    pub caller: String,
}

/// The calls recorded in a `memoryLimitLog` file (none when it does not exist).
pub fn memory_limit_calls(log: &Path) -> Vec<MemoryLimitCall> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// MIG slots NVML reports for a MIG-enabled GPU (an A100/H100 has at most 7 instances).
pub const MAX_MIG_DEVICES: u32 = 7;

/// What the fake NVML reports.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Topology {
    /// `nvmlSystemGetDriverVersion`.
    pub driver_version: String,
    /// `nvmlSystemGetCudaDriverVersion`: 1000 * major + 10 * minor.
    #[serde(default)]
    pub cuda_driver_version: i32,
    /// In NVML index order (PCI bus order on a real host).
    pub gpus: Vec<Gpu>,
    /// Whether the driver offers `nvmlDeviceSetMemoryLimits_v1` (R615 and later); `None` is
    /// yes. `Some(false)` answers `NVML_ERROR_FUNCTION_NOT_FOUND`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limits: Option<bool>,
    /// The file each successful `nvmlDeviceSetMemoryLimits_v1` call is appended to, one
    /// [`MemoryLimitCall`] JSON line each.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit_log: Option<PathBuf>,
}

/// One physical GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Gpu {
    pub name: String,
    /// `GPU-<uuid>`.
    pub uuid: String,
    /// `/dev/nvidia<minor>`.
    pub minor: u32,
    /// `0000:1b:00.0`.
    pub bus_id: String,
    /// Bytes.
    #[serde(default)]
    pub memory_total: u64,
    /// `None`: no MIG support; `Some(enabled)`: the current (and pending) MIG mode.
    #[serde(default)]
    pub mig_enabled: Option<bool>,
    /// The MIG devices, in handle-index order (only used when MIG is enabled).
    #[serde(default)]
    pub mig_devices: Vec<MigDevice>,
    /// `nvmlDeviceGetPersistenceMode`; `None` answers `NVML_ERROR_NOT_SUPPORTED`.
    #[serde(default)]
    pub persistence_mode: Option<bool>,
    /// `nvmlDeviceGetCudaComputeCapability`, `"9.0"`; `None` answers `NVML_ERROR_NOT_SUPPORTED`.
    #[serde(default)]
    pub compute_capability: Option<String>,
    /// `nvmlDeviceGetBrand`, by libnvidia-container's name (`tesla`, `geforcertx`, ...);
    /// `None` is `NVML_BRAND_UNKNOWN`.
    #[serde(default)]
    pub brand: Option<String>,
}

/// One MIG device (a compute instance inside a GPU instance).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MigDevice {
    /// `MIG-<uuid>`.
    pub uuid: String,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    /// The profile, e.g. `1g.10gb`: part of the device name NVML reports.
    pub profile: String,
    /// GPU-instance slices of the profile (the `1` of `1g.10gb`).
    #[serde(default)]
    pub slice_count: u32,
    /// Bytes.
    #[serde(default)]
    pub memory_total: u64,
}

impl Topology {
    /// Parses a topology, checking what NVML guarantees: distinct minors and UUIDs, at most
    /// [`MAX_MIG_DEVICES`] MIG devices per GPU.
    pub fn parse(text: &str) -> Result<Topology, String> {
        let t: Topology = serde_json::from_str(text).map_err(|e| e.to_string())?;
        for (i, g) in t.gpus.iter().enumerate() {
            if t.gpus[..i]
                .iter()
                .any(|o| o.minor == g.minor || o.uuid == g.uuid)
            {
                return Err(format!("GPU {i} repeats a minor or UUID"));
            }
            if g.mig_devices.len() > MAX_MIG_DEVICES as usize {
                return Err(format!(
                    "GPU {i} has more than {MAX_MIG_DEVICES} MIG devices"
                ));
            }
        }
        Ok(t)
    }
}

/// What a handle is: NVML's device, GPU instance and compute instance handles are all opaque
/// pointers, so each record says which it is and a handle of one kind is refused as another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Device,
    GpuInstance,
    ComputeInstance,
}

/// A handle's target.
#[derive(Debug)]
struct Record {
    kind: Kind,
    gpu: usize,
    /// `Some(i)`: MIG device `i` of `gpu` (its own device handle or its compute instance), or
    /// the first MIG device of a GPU instance.
    mig: Option<usize>,
}

struct State {
    topology: Topology,
    /// Leaked once per first `nvmlInit_v2`: handles stay valid for the process.
    records: &'static [Record],
    /// `nvmlInit*` calls not yet matched by `nvmlShutdown` (NVML counts them: the library
    /// shuts down at the last).
    refs: u32,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

/// The path this library was loaded from, through `dladdr` on one of its own functions.
fn own_path() -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    let addr = nvmlInit_v2 as *const libc::c_void;
    // SAFETY: `addr` is an address in this library and `info` a writable Dl_info.
    if unsafe { libc::dladdr(addr, info.as_mut_ptr()) } == 0 {
        return None;
    }
    // SAFETY: dladdr succeeded, so it filled `info`.
    let info = unsafe { info.assume_init() };
    if info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the dynamic linker.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    Some(PathBuf::from(std::ffi::OsStr::from_bytes(name.to_bytes())))
}

fn load() -> Result<Topology, String> {
    let path = match std::env::var_os(TOPOLOGY_ENV) {
        Some(p) => PathBuf::from(p),
        None => own_path()
            .map(|lib| topology_file_beside(&lib))
            .filter(|p| p.exists())
            .ok_or_else(|| {
                format!(
                    "{TOPOLOGY_ENV} is not set and there is no {TOPOLOGY_FILE} beside the library"
                )
            })?,
    };
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read {}: {e}", path.to_string_lossy()))?;
    Topology::parse(&text).map_err(|e| format!("{}: {e}", path.to_string_lossy()))
}

/// Runs `f` on the initialised state, or answers `NVML_ERROR_UNINITIALIZED`.
fn with_state(f: impl FnOnce(&State) -> nvmlReturn_t) -> nvmlReturn_t {
    match STATE.lock() {
        Ok(guard) => match guard.as_ref() {
            Some(state) => f(state),
            None => UNINITIALIZED,
        },
        Err(_) => UNKNOWN,
    }
}

/// The device record a handle points at, if it is one of ours.
fn record(state: &State, handle: nvmlDevice_t) -> Option<&'static Record> {
    record_of(state, handle as *const u8, Kind::Device)
}

/// The record of `kind` a handle points at, if it is one of ours.
fn record_of(state: &State, handle: *const u8, kind: Kind) -> Option<&'static Record> {
    state
        .records
        .iter()
        .find(|r| r.kind == kind && std::ptr::eq(*r as *const Record as *const u8, handle))
}

/// The record of `kind` for GPU `gpu` and MIG slot `mig`.
fn find(state: &State, kind: Kind, gpu: usize, mig: Option<usize>) -> Option<&'static Record> {
    state
        .records
        .iter()
        .find(|r| r.kind == kind && r.gpu == gpu && r.mig == mig)
}

fn handle_of(r: &'static Record) -> nvmlDevice_t {
    r as *const Record as nvmlDevice_t
}

/// Writes `value` NUL-terminated into `buf` of `len` bytes.
///
/// # Safety
/// `buf` must be null or valid for writes of `len` bytes.
unsafe fn write_str(value: &str, buf: *mut c_char, len: c_uint) -> nvmlReturn_t {
    if buf.is_null() {
        return INVALID_ARGUMENT;
    }
    let bytes = value.as_bytes();
    if bytes.len() + 1 > len as usize {
        return INSUFFICIENT_SIZE;
    }
    // SAFETY: the caller guarantees `buf` holds `len` bytes, and `bytes.len() + 1 <= len`.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.cast::<u8>(), bytes.len());
        *buf.add(bytes.len()) = 0;
    }
    SUCCESS
}

/// Stores `value` through `out`.
///
/// # Safety
/// `out` must be null or valid for a write of `T`.
unsafe fn put<T>(out: *mut T, value: T) -> nvmlReturn_t {
    if out.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: non-null, and the caller guarantees it is valid for a write of `T`.
    unsafe { out.write(value) };
    SUCCESS
}

/// `nvmlInit_v2`: reads the topology at the first call; later ones only count.
#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    let Ok(mut guard) = STATE.lock() else {
        return UNKNOWN;
    };
    if let Some(state) = guard.as_mut() {
        state.refs += 1;
        return SUCCESS;
    }
    let topology = match load() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("nvshim-fake-nvml: {e}");
            return UNKNOWN;
        }
    };
    let mut records = Vec::new();
    for (gpu, g) in topology.gpus.iter().enumerate() {
        records.push(Record {
            kind: Kind::Device,
            gpu,
            mig: None,
        });
        for i in 0..g.mig_devices.len() {
            let mig = Some(i);
            records.push(Record {
                kind: Kind::Device,
                gpu,
                mig,
            });
            records.push(Record {
                kind: Kind::ComputeInstance,
                gpu,
                mig,
            });
            if first_of_instance(g, i) == i {
                records.push(Record {
                    kind: Kind::GpuInstance,
                    gpu,
                    mig,
                });
            }
        }
    }
    let records: &'static [Record] = Box::leak(records.into_boxed_slice());
    *guard = Some(State {
        topology,
        records,
        refs: 1,
    });
    SUCCESS
}

/// `nvmlInit` (v1): the same.
#[no_mangle]
pub extern "C" fn nvmlInit() -> nvmlReturn_t {
    nvmlInit_v2()
}

/// `nvmlInitWithFlags`: flags ignored.
#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    nvmlInit_v2()
}

/// `nvmlShutdown`: the last of the `nvmlInit*` calls shuts down (`NVML_ERROR_UNINITIALIZED`
/// when none is left). Handles stay readable (they are leaked), but calls answer uninitialised.
#[no_mangle]
pub extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    let Ok(mut guard) = STATE.lock() else {
        return UNKNOWN;
    };
    match guard.as_mut() {
        None => UNINITIALIZED,
        Some(state) if state.refs > 1 => {
            state.refs -= 1;
            SUCCESS
        }
        Some(_) => {
            *guard = None;
            SUCCESS
        }
    }
}

/// `nvmlErrorString`.
#[no_mangle]
pub extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    let s: &'static [u8] = match result {
        SUCCESS => b"Success\0",
        UNINITIALIZED => b"Uninitialized\0",
        INVALID_ARGUMENT => b"Invalid Argument\0",
        NOT_SUPPORTED => b"Not Supported\0",
        NOT_FOUND => b"Not Found\0",
        FUNCTION_NOT_FOUND => b"Function Not Found\0",
        INSUFFICIENT_SIZE => b"Insufficient Size\0",
        _ => b"Unknown Error\0",
    };
    s.as_ptr().cast()
}

/// `nvmlSystemGetDriverVersion`.
///
/// # Safety
/// `version` must be valid for writes of `length` bytes.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    // SAFETY: forwarded caller contract.
    with_state(|s| unsafe { write_str(&s.topology.driver_version, version, length) })
}

/// `nvmlSystemGetCudaDriverVersion`.
///
/// # Safety
/// `version` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(version: *mut c_int) -> nvmlReturn_t {
    // SAFETY: forwarded caller contract.
    with_state(|s| unsafe { put(version, s.topology.cuda_driver_version) })
}

/// `nvmlSystemGetCudaDriverVersion_v2`.
///
/// # Safety
/// `version` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) -> nvmlReturn_t {
    // SAFETY: forwarded caller contract.
    unsafe { nvmlSystemGetCudaDriverVersion(version) }
}

/// `nvmlDeviceGetCount_v2`: physical GPUs only.
///
/// # Safety
/// `count` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: forwarded caller contract.
    with_state(|s| unsafe { put(count, s.topology.gpus.len() as c_uint) })
}

/// `nvmlDeviceGetHandleByIndex_v2`.
///
/// # Safety
/// `device` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    with_state(|s| {
        match find(s, Kind::Device, index as usize, None) {
            // SAFETY: forwarded caller contract.
            Some(r) => unsafe { put(device, handle_of(r)) },
            None => INVALID_ARGUMENT,
        }
    })
}

/// `nvmlDeviceGetHandleByUUID`: a GPU or MIG device by its UUID.
///
/// # Safety
/// `uuid` must be a NUL-terminated string and `device` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    if uuid.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: forwarded caller contract.
    let wanted = unsafe { CStr::from_ptr(uuid) }.to_string_lossy();
    with_state(|s| {
        let found = s
            .records
            .iter()
            .filter(|r| r.kind == Kind::Device)
            .find(|r| {
                let g = &s.topology.gpus[r.gpu];
                match r.mig {
                    None => g.uuid == wanted,
                    Some(m) => g.mig_devices[m].uuid == wanted,
                }
            });
        match found {
            // SAFETY: forwarded caller contract.
            Some(r) => unsafe { put(device, handle_of(r)) },
            None => NOT_FOUND,
        }
    })
}

/// `nvmlSetMemoryLimits_v1_t` (CUDA 13.4's nvml.h; nvml-wrapper-sys predates it).
#[repr(C)]
pub struct SetMemoryLimitsV1 {
    pub name_space: *const c_char,
    pub soft_limit: u64,
    pub hard_limit: u64,
}

/// `nvmlDeviceSetMemoryLimits_v1`: recorded in `memoryLimitLog`, or
/// `NVML_ERROR_FUNCTION_NOT_FOUND` where the topology's driver does not offer it.
///
/// # Safety
/// `limits` must be null or point to a valid struct whose `name_space` is null or a
/// NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceSetMemoryLimits_v1(
    device: nvmlDevice_t,
    limits: *mut SetMemoryLimitsV1,
) -> nvmlReturn_t {
    if limits.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: non-null, and valid by the caller's contract.
    let l = unsafe { &*limits };
    if l.name_space.is_null() || l.soft_limit > l.hard_limit {
        return INVALID_ARGUMENT;
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    let name_space = unsafe { CStr::from_ptr(l.name_space) }
        .to_string_lossy()
        .into_owned();
    let (offered, log) = match STATE.lock() {
        Ok(guard) => match guard.as_ref() {
            Some(s) => (
                s.topology.memory_limits.unwrap_or(true),
                s.topology.memory_limit_log.clone(),
            ),
            None => return UNINITIALIZED,
        },
        Err(_) => return UNKNOWN,
    };
    if !offered {
        return FUNCTION_NOT_FOUND;
    }
    let (soft_limit, hard_limit) = (l.soft_limit, l.hard_limit);
    with_device(device, |g, mig| {
        let call = MemoryLimitCall {
            uuid: mig.map_or(g.uuid.clone(), |(_, m)| m.uuid.clone()),
            name_space,
            soft_limit,
            hard_limit,
            caller: std::env::current_exe()
                .ok()
                .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                .unwrap_or_default(),
        };
        if let Some(log) = &log {
            let line = serde_json::to_string(&call).unwrap_or_default();
            let written = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .and_then(|mut f| writeln!(f, "{line}"));
            if let Err(e) = written {
                eprintln!("nvshim-fake-nvml: {}: {e}", log.display());
                return UNKNOWN;
            }
        }
        SUCCESS
    })
}

/// Runs `f` with the topology entries a handle names.
fn with_device(
    handle: nvmlDevice_t,
    f: impl FnOnce(&Gpu, Option<(usize, &MigDevice)>) -> nvmlReturn_t,
) -> nvmlReturn_t {
    with_state(|s| match record(s, handle) {
        Some(r) => {
            let gpu = &s.topology.gpus[r.gpu];
            f(gpu, r.mig.map(|m| (m, &gpu.mig_devices[m])))
        }
        None => INVALID_ARGUMENT,
    })
}

/// `nvmlDeviceGetUUID`.
///
/// # Safety
/// `uuid` must be valid for writes of `length` bytes.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    with_device(device, |g, mig| {
        let value = mig.map_or(g.uuid.as_str(), |(_, m)| m.uuid.as_str());
        // SAFETY: forwarded caller contract.
        unsafe { write_str(value, uuid, length) }
    })
}

/// `nvmlDeviceGetName`: MIG devices read `<GPU name> MIG <profile>`, as NVML names them.
///
/// # Safety
/// `name` must be valid for writes of `length` bytes.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    with_device(device, |g, mig| {
        let value = match mig {
            Some((_, m)) => format!("{} MIG {}", g.name, m.profile),
            None => g.name.clone(),
        };
        // SAFETY: forwarded caller contract.
        unsafe { write_str(&value, name, length) }
    })
}

/// `nvmlDeviceGetMinorNumber`: physical GPUs only.
///
/// # Safety
/// `minor` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    device: nvmlDevice_t,
    minor: *mut c_uint,
) -> nvmlReturn_t {
    with_device(device, |g, mig| match mig {
        Some(_) => NOT_SUPPORTED,
        // SAFETY: forwarded caller contract.
        None => unsafe { put(minor, g.minor) },
    })
}

/// `nvmlDeviceGetPersistenceMode`: physical GPUs only.
///
/// # Safety
/// `mode` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPersistenceMode(
    device: nvmlDevice_t,
    mode: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    with_device(device, |g, mig| match (mig, g.persistence_mode) {
        (None, Some(on)) => {
            let state = if on {
                NVML_FEATURE_ENABLED
            } else {
                NVML_FEATURE_DISABLED
            };
            // SAFETY: forwarded caller contract.
            unsafe { put(mode, state) }
        }
        _ => NOT_SUPPORTED,
    })
}

/// `nvmlDeviceGetCudaComputeCapability`: physical GPUs only.
///
/// # Safety
/// `major` and `minor` must be valid for writes.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> nvmlReturn_t {
    with_device(device, |g, mig| {
        let cc = g.compute_capability.as_deref().and_then(|c| {
            let (a, b) = c.split_once('.')?;
            Some((a.parse::<c_int>().ok()?, b.parse::<c_int>().ok()?))
        });
        match (mig, cc) {
            (None, Some((a, b))) => {
                // SAFETY: forwarded caller contract.
                let r = unsafe { put(major, a) };
                if r != SUCCESS {
                    return r;
                }
                // SAFETY: forwarded caller contract.
                unsafe { put(minor, b) }
            }
            _ => NOT_SUPPORTED,
        }
    })
}

/// NVML's `nvmlBrandType_t` values, by libnvidia-container's brand names (`src/nvc_info.c`).
const BRANDS: &[(&str, c_uint)] = &[
    ("unknown", 0),
    ("quadro", 1),
    ("tesla", 2),
    ("nvs", 3),
    ("grid", 4),
    ("geforce", 5),
    ("titan", 6),
    ("nvidiavapps", 7),
    ("nvidiavpc", 8),
    ("nvidiavcs", 9),
    ("nvidiavws", 10),
    ("nvidiacloudgaming", 11),
    ("quadrortx", 12),
    ("nvidiartx", 13),
    ("nvidia", 14),
    ("geforcertx", 15),
    ("titanrtx", 16),
];

/// `nvmlDeviceGetBrand`.
///
/// # Safety
/// `brand` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetBrand(
    device: nvmlDevice_t,
    brand: *mut nvml_wrapper_sys::bindings::nvmlBrandType_t,
) -> nvmlReturn_t {
    with_device(device, |g, _| {
        let value = BRANDS
            .iter()
            .find(|(n, _)| Some(*n) == g.brand.as_deref())
            .map_or(0, |(_, v)| *v);
        // SAFETY: forwarded caller contract.
        unsafe { put(brand, value) }
    })
}

/// `nvmlDeviceGetIndex`.
///
/// # Safety
/// `index` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(
    device: nvmlDevice_t,
    index: *mut c_uint,
) -> nvmlReturn_t {
    with_state(|s| match record(s, device) {
        Some(r) if r.mig.is_none() => {
            // SAFETY: forwarded caller contract.
            unsafe { put(index, r.gpu as c_uint) }
        }
        Some(_) => NOT_SUPPORTED,
        None => INVALID_ARGUMENT,
    })
}

/// Parses `dddd:bb:dd.f` into (domain, bus, device).
fn bus_parts(bus_id: &str) -> Option<(u32, u32, u32)> {
    let mut it = bus_id.split(':');
    let domain = u32::from_str_radix(it.next()?, 16).ok()?;
    let bus = u32::from_str_radix(it.next()?, 16).ok()?;
    let dev = it.next()?.split('.').next()?;
    Some((domain, bus, u32::from_str_radix(dev, 16).ok()?))
}

fn fill_c_string<const N: usize>(dst: &mut [c_char; N], s: &str) {
    for (d, b) in dst.iter_mut().zip(s.bytes().take(N - 1)) {
        *d = b as c_char;
    }
}

/// `nvmlDeviceGetPciInfo_v3`: `busId` as NVML writes it (eight-digit domain, upper case).
///
/// # Safety
/// `pci` must be valid for a write of `nvmlPciInfo_t`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    with_device(device, |g, _| {
        let Some((domain, bus, dev)) = bus_parts(&g.bus_id) else {
            return UNKNOWN;
        };
        // SAFETY: plain C data; all-zero is a valid value.
        let mut info: nvmlPciInfo_t = unsafe { std::mem::zeroed() };
        info.domain = domain;
        info.bus = bus;
        info.device = dev;
        info.pciDeviceId = 0x2330_10de;
        fill_c_string(
            &mut info.busId,
            &format!("{domain:08X}:{bus:02X}:{dev:02X}.0"),
        );
        fill_c_string(
            &mut info.busIdLegacy,
            &format!("{domain:04X}:{bus:02X}:{dev:02X}.0"),
        );
        // SAFETY: forwarded caller contract.
        unsafe { put(pci, info) }
    })
}

/// `nvmlDeviceGetMemoryInfo`: all memory free.
///
/// # Safety
/// `memory` must be valid for a write of `nvmlMemory_t`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    with_device(device, |g, mig| {
        let total = mig.map_or(g.memory_total, |(_, m)| m.memory_total);
        // SAFETY: forwarded caller contract.
        unsafe {
            put(
                memory,
                nvmlMemory_t {
                    total,
                    free: total,
                    used: 0,
                },
            )
        }
    })
}

/// `nvmlDeviceGetMigMode`.
///
/// # Safety
/// `current` and `pending` must be valid for writes.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> nvmlReturn_t {
    with_device(device, |g, mig| {
        let (None, Some(enabled)) = (mig, g.mig_enabled) else {
            return NOT_SUPPORTED;
        };
        let mode = if enabled {
            NVML_DEVICE_MIG_ENABLE
        } else {
            NVML_DEVICE_MIG_DISABLE
        };
        // SAFETY: forwarded caller contract.
        match unsafe { put(current, mode) } {
            SUCCESS => unsafe { put(pending, mode) },
            e => e,
        }
    })
}

/// `nvmlDeviceGetMaxMigDeviceCount`.
///
/// # Safety
/// `count` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: nvmlDevice_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    with_device(device, |g, mig| match (mig, g.mig_enabled) {
        (None, Some(true)) => {
            // SAFETY: forwarded caller contract.
            unsafe { put(count, MAX_MIG_DEVICES) }
        }
        (None, Some(false)) => {
            // SAFETY: forwarded caller contract.
            unsafe { put(count, 0) }
        }
        _ => NOT_SUPPORTED,
    })
}

/// `nvmlDeviceGetMigDeviceHandleByIndex`.
///
/// # Safety
/// `mig_device` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: nvmlDevice_t,
    index: c_uint,
    mig_device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    with_state(|s| {
        let Some(parent) = record(s, device) else {
            return INVALID_ARGUMENT;
        };
        if parent.mig.is_some() || s.topology.gpus[parent.gpu].mig_enabled != Some(true) {
            return NOT_SUPPORTED;
        }
        if index >= MAX_MIG_DEVICES {
            return INVALID_ARGUMENT;
        }
        match find(s, Kind::Device, parent.gpu, Some(index as usize)) {
            // SAFETY: forwarded caller contract.
            Some(r) => unsafe { put(mig_device, handle_of(r)) },
            None => NOT_FOUND,
        }
    })
}

/// `nvmlDeviceIsMigDeviceHandle`.
///
/// # Safety
/// `is_mig` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(
    device: nvmlDevice_t,
    is_mig: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: forwarded caller contract.
    with_device(device, |_, mig| unsafe {
        put(is_mig, c_uint::from(mig.is_some()))
    })
}

/// `nvmlDeviceGetDeviceHandleFromMigDeviceHandle`.
///
/// # Safety
/// `device` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    mig_device: nvmlDevice_t,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    with_state(|s| match record(s, mig_device) {
        Some(r) if r.mig.is_some() => {
            match find(s, Kind::Device, r.gpu, None) {
                // SAFETY: forwarded caller contract.
                Some(p) => unsafe { put(device, handle_of(p)) },
                None => UNKNOWN,
            }
        }
        Some(_) => INVALID_ARGUMENT,
        None => INVALID_ARGUMENT,
    })
}

/// `nvmlDeviceGetGpuInstanceId`: MIG devices only.
///
/// # Safety
/// `id` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    with_device(device, |_, mig| match mig {
        // SAFETY: forwarded caller contract.
        Some((_, m)) => unsafe { put(id, m.gpu_instance_id) },
        None => NOT_SUPPORTED,
    })
}

/// `nvmlDeviceGetComputeInstanceId`: MIG devices only.
///
/// # Safety
/// `id` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    with_device(device, |_, mig| match mig {
        // SAFETY: forwarded caller contract.
        Some((_, m)) => unsafe { put(id, m.compute_instance_id) },
        None => NOT_SUPPORTED,
    })
}

/// `nvmlDeviceGetAttributes_v2`: MIG devices only (slices and memory of the profile).
///
/// # Safety
/// `attributes` must be valid for a write of `nvmlDeviceAttributes_t`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetAttributes_v2(
    device: nvmlDevice_t,
    attributes: *mut nvmlDeviceAttributes_t,
) -> nvmlReturn_t {
    with_device(device, |_, mig| {
        let Some((_, m)) = mig else {
            return NOT_SUPPORTED;
        };
        // SAFETY: plain C data; all-zero is a valid value.
        let mut a: nvmlDeviceAttributes_t = unsafe { std::mem::zeroed() };
        a.gpuInstanceSliceCount = m.slice_count;
        a.computeInstanceSliceCount = m.slice_count;
        a.multiprocessorCount = 16 * m.slice_count;
        a.memorySizeMB = m.memory_total / (1024 * 1024);
        // SAFETY: forwarded caller contract.
        unsafe { put(attributes, a) }
    })
}

/// The index of the first MIG device of `g` in the GPU instance of MIG device `i`.
fn first_of_instance(g: &Gpu, i: usize) -> usize {
    let id = g.mig_devices[i].gpu_instance_id;
    g.mig_devices
        .iter()
        .position(|m| m.gpu_instance_id == id)
        .unwrap_or(i)
}

/// The slices of MIG device `m`'s compute instance: `N` of a `Nc.` profile (`1c.3g.40gb`),
/// else the whole GPU instance.
fn compute_slices(m: &MigDevice) -> u32 {
    m.profile
        .split_once("c.")
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or(m.slice_count)
        .max(1)
}

/// nvml.h's `NVML_GPU_INSTANCE_PROFILE_<N>_SLICE` and `NVML_COMPUTE_INSTANCE_PROFILE_<N>_SLICE`
/// IDs (the two share these values), by slice count `N`: the profiles a 7-slice GPU (A100,
/// H100) offers.
const PROFILE_IDS: &[(u32, c_uint)] = &[(1, 0), (2, 1), (3, 2), (4, 3), (7, 4)];

fn profile_id(slices: u32) -> Option<c_uint> {
    PROFILE_IDS
        .iter()
        .find(|(n, _)| *n == slices)
        .map(|(_, id)| *id)
}

fn profile_slices(id: c_uint) -> Option<u32> {
    PROFILE_IDS.iter().find(|(_, i)| *i == id).map(|(n, _)| *n)
}

/// `nvmlDeviceGetCount` (v1): the same as v2 (every GPU is accessible).
///
/// # Safety
/// `count` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount(count: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: forwarded caller contract.
    unsafe { nvmlDeviceGetCount_v2(count) }
}

/// `nvmlDeviceGetHandleByIndex` (v1): the same as v2.
///
/// # Safety
/// `device` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    // SAFETY: forwarded caller contract.
    unsafe { nvmlDeviceGetHandleByIndex_v2(index, device) }
}

/// `nvmlDeviceGetHandleByPciBusId_v2`: `domain:bus:device.function` or `bus:device.function`,
/// hexadecimal in either case, as NVML accepts it.
///
/// # Safety
/// `bus_id` must be a NUL-terminated string and `device` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    bus_id: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    if bus_id.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: forwarded caller contract.
    let wanted = unsafe { CStr::from_ptr(bus_id) }.to_string_lossy();
    let wanted = if wanted.matches(':').count() == 1 {
        format!("0:{wanted}")
    } else {
        wanted.into_owned()
    };
    let Some(wanted) = bus_parts(&wanted) else {
        return INVALID_ARGUMENT;
    };
    with_state(|s| {
        let gpu = s
            .topology
            .gpus
            .iter()
            .position(|g| bus_parts(&g.bus_id) == Some(wanted));
        match gpu.and_then(|gpu| find(s, Kind::Device, gpu, None)) {
            // SAFETY: forwarded caller contract.
            Some(r) => unsafe { put(device, handle_of(r)) },
            None => NOT_FOUND,
        }
    })
}

/// `nvmlDeviceGetHandleByPciBusId` (v1): the same as v2.
///
/// # Safety
/// `bus_id` must be a NUL-terminated string and `device` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId(
    bus_id: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    // SAFETY: forwarded caller contract.
    unsafe { nvmlDeviceGetHandleByPciBusId_v2(bus_id, device) }
}

/// `nvmlSystemGetNVMLVersion`: `<CUDA major>.<driver version>`, as NVML writes it
/// (`12.535.104.05`).
///
/// # Safety
/// `version` must be valid for writes of `length` bytes.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    with_state(|s| {
        let t = &s.topology;
        let value = format!("{}.{}", t.cuda_driver_version / 1000, t.driver_version);
        // SAFETY: forwarded caller contract.
        unsafe { write_str(&value, version, length) }
    })
}

/// `nvmlDeviceGetArchitecture`: from the compute capability (nvml.h's
/// `NVML_DEVICE_ARCH_*`); a MIG device answers for its GPU.
///
/// # Safety
/// `arch` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetArchitecture(
    device: nvmlDevice_t,
    arch: *mut nvml_wrapper_sys::bindings::nvmlDeviceArchitecture_t,
) -> nvmlReturn_t {
    use nvml_wrapper_sys::bindings as b;
    with_device(device, |g, _| {
        let value = match g.compute_capability.as_deref() {
            Some(cc) if cc.starts_with("3.") => b::NVML_DEVICE_ARCH_KEPLER,
            Some(cc) if cc.starts_with("5.") => b::NVML_DEVICE_ARCH_MAXWELL,
            Some(cc) if cc.starts_with("6.") => b::NVML_DEVICE_ARCH_PASCAL,
            Some("7.0" | "7.2") => b::NVML_DEVICE_ARCH_VOLTA,
            Some("7.5") => b::NVML_DEVICE_ARCH_TURING,
            Some("8.9") => b::NVML_DEVICE_ARCH_ADA,
            Some(cc) if cc.starts_with("8.") => b::NVML_DEVICE_ARCH_AMPERE,
            Some(cc) if cc.starts_with("9.") => b::NVML_DEVICE_ARCH_HOPPER,
            Some(cc) if cc.starts_with("10.") || cc.starts_with("12.") => {
                b::NVML_DEVICE_ARCH_BLACKWELL
            }
            _ => b::NVML_DEVICE_ARCH_UNKNOWN,
        };
        // SAFETY: forwarded caller contract.
        unsafe { put(arch, value) }
    })
}

/// `nvmlDeviceGetMemoryInfo_v2`: as v1, nothing reserved; `version` is left as the caller
/// set it.
///
/// # Safety
/// `memory` must be valid for reads and writes of `nvmlMemory_v2_t`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory: *mut nvml_wrapper_sys::bindings::nvmlMemory_v2_t,
) -> nvmlReturn_t {
    if memory.is_null() {
        return INVALID_ARGUMENT;
    }
    with_device(device, |g, mig| {
        let total = mig.map_or(g.memory_total, |(_, m)| m.memory_total);
        // SAFETY: non-null, and valid for reads and writes by the caller's contract.
        let m = unsafe { &mut *memory };
        m.total = total;
        m.reserved = 0;
        m.free = total;
        m.used = 0;
        SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topology_round_trip_and_checks() {
        let t = Topology {
            driver_version: "580.65.06".into(),
            cuda_driver_version: 13000,
            gpus: vec![Gpu {
                name: "NVIDIA H100 80GB HBM3".into(),
                uuid: "GPU-1".into(),
                minor: 0,
                bus_id: "0000:1b:00.0".into(),
                memory_total: 80 << 30,
                mig_enabled: Some(true),
                mig_devices: vec![MigDevice {
                    uuid: "MIG-1".into(),
                    gpu_instance_id: 1,
                    compute_instance_id: 0,
                    profile: "1g.10gb".into(),
                    slice_count: 1,
                    memory_total: 10 << 30,
                }],
                persistence_mode: Some(true),
                compute_capability: Some("9.0".into()),
                brand: Some("tesla".into()),
            }],
            memory_limits: Some(false),
            memory_limit_log: Some("/tmp/calls.jsonl".into()),
        };
        let text = serde_json::to_string(&t).unwrap();
        assert_eq!(Topology::parse(&text).unwrap(), t);
        let mut dup = t.clone();
        dup.gpus.push(t.gpus[0].clone());
        assert!(Topology::parse(&serde_json::to_string(&dup).unwrap()).is_err());
        assert_eq!(bus_parts("0000:1b:00.0"), Some((0, 0x1b, 0)));
    }
}
