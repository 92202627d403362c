//! `apply-cuda-memory-limits`: a per-container GPU memory limit through NVML, NVIDIA's
//! createRuntime hook of the same name (docs/capabilities.md, "GPU memory limits", says what
//! NVIDIA's hook does; this module follows it and differs only where a driver cannot do it).
//!
//! The container asks with two variables in config.json's `process.env`,
//! `NVIDIA_GPU_MEMORY_REQUEST` and `NVIDIA_GPU_MEMORY_LIMIT`, both whole MiB. Without both the
//! hook does nothing and loads nothing. With both, for every `--gpu-id` (a `GPU-<uuid>`, a
//! `MIG-<uuid>`, or an NVML index), it calls
//! `nvmlDeviceSetMemoryLimits_v1(device, {nameSpace, softLimit, hardLimit})` with the
//! container's cgroup v2 directory as the name space (`/sys/fs/cgroup` joined with the `0::`
//! line of `/proc/<pid>/cgroup`, `pid` from the OCI state: the container's init process, which
//! runc has placed in its cgroup by the time createRuntime hooks run), the request as the soft
//! limit and the limit as the hard one, in bytes.
//!
//! What fails the hook (and so the container), as NVIDIA's does: a value that is not a whole
//! number of MiB, a request above the limit, no `libnvidia-ml.so.1` under the driver root,
//! NVML not initialising, an unknown GPU id, and any error of the call other than the two
//! below. What only warns, once, and lets the container start without a limit (NVIDIA's fails
//! instead): a driver that does not offer the call, that is one without the symbol (before
//! R615) or one answering `NVML_ERROR_NOT_SUPPORTED` or `NVML_ERROR_FUNCTION_NOT_FOUND`, and a
//! host whose `/sys/fs/cgroup` is not cgroup v2 (the name space NVML takes is a cgroup v2
//! directory). The warning names the driver version and says the limit was not applied.
//! runc discards a hook's stderr when the hook succeeds, so with `--log-file F` (nvshim-runtime
//! passes its own log file) the warning is appended to `F` too.
//!
//! The library is found as the dynamic linker would under the driver root: the root's
//! `etc/ld.so.cache` ([`crate::ldcache`]), else the usual library directories below the root
//! ([`DRIVER_LIBRARY_DIRS`]). It is loaded with `dlopen` and its symbols with `dlsym` (`libc` only; the
//! hook takes no loader crate), resolved when needed, so a missing one is an answer, not a
//! crash. The environment is never read: the two variables come from config.json, everything
//! else from argv and the state.
//!
//! One file (690 lines of code, 180 of tests): one hook; reading the limits, finding the cgroup,
//! finding and loading NVML and the one call are the steps of [`run`], and the `dlopen` wrapper
//! serves only that call.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::fs::OpenOptions;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::ldcache::LdCache;
use crate::ldconfig::DRIVER_LIBRARY_DIRS;
use crate::state::{State, StateError};

/// The memory the container asks for, in MiB: NVML's soft limit.
pub const REQUEST_ENV: &str = "NVIDIA_GPU_MEMORY_REQUEST";
/// The most memory the container may use, in MiB: NVML's hard limit.
pub const LIMIT_ENV: &str = "NVIDIA_GPU_MEMORY_LIMIT";
/// Where the cgroup v2 hierarchy must be mounted.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// `CGROUP2_SUPER_MAGIC` (linux/magic.h), statfs's `f_type` of a cgroup v2 mount.
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
/// The driver's NVML library.
pub const NVML_SONAME: &str = "libnvidia-ml.so.1";
/// The call that sets the limits (CUDA 13.4's nvml.h, drivers from R615).
pub const SET_MEMORY_LIMITS: &str = "nvmlDeviceSetMemoryLimits_v1";

/// `NVML_SUCCESS`.
const NVML_SUCCESS: c_int = 0;
/// `NVML_ERROR_NOT_SUPPORTED`.
pub const NVML_ERROR_NOT_SUPPORTED: c_int = 3;
/// `NVML_ERROR_FUNCTION_NOT_FOUND`.
pub const NVML_ERROR_FUNCTION_NOT_FOUND: c_int = 13;
/// `NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE`.
const DRIVER_VERSION_LEN: usize = 80;
/// Largest `/proc/<pid>/cgroup` read (a hybrid host has a dozen short lines).
const MAX_PROC_CGROUP: u64 = 64 << 10;

#[derive(Debug, Error)]
pub enum MemoryLimitError {
    #[error("{var}={value:?} is not a whole number of MiB; set it to one (e.g. {var}=2048), or unset {REQUEST_ENV} and {LIMIT_ENV} for no GPU memory limit")]
    BadValue { var: &'static str, value: String },
    #[error("memory request ({request} MiB, {REQUEST_ENV}) exceeds memory limit ({limit} MiB, {LIMIT_ENV}); make the request at most the limit")]
    RequestOverLimit { request: u64, limit: u64 },
    #[error(transparent)]
    State(#[from] StateError),
    #[error("the OCI state of container {id:?} has no pid, so its cgroup is unknown; run the hook as a createRuntime hook, after the container's process exists")]
    NoPid { id: String },
    #[error("reading {path}: {source} (the container's process is gone?)")]
    ProcCgroup { path: PathBuf, source: io::Error },
    #[error("{path} has no cgroup v2 line (`0::/...`), so the container has no cgroup v2 directory for NVML")]
    NoCgroupV2 { path: PathBuf },
    #[error("statfs {path}: {source}")]
    Statfs { path: PathBuf, source: io::Error },
    #[error("no {NVML_SONAME} under the driver root {root} (not in its etc/ld.so.cache, not in {dirs}); pass the driver's root with --driver-root, or install the driver")]
    NoLibrary { root: PathBuf, dirs: String },
    #[error("cannot load {lib}: {message}; check the driver installation under the driver root")]
    Load { lib: PathBuf, message: String },
    #[error("{lib} lacks {symbol}, so it is not a usable NVML; check the driver installation")]
    NoSymbol { lib: PathBuf, symbol: &'static str },
    #[error("NVML ({lib}) did not initialise: {message} (error {code}); check the driver with `nvidia-smi` on the host")]
    Init {
        lib: PathBuf,
        code: i32,
        message: String,
    },
    #[error("GPU {id:?}: NVML does not know it: {message} (error {code}); name a GPU by its UUID (`nvidia-smi -L`), MIG UUID or index")]
    UnknownGpu {
        id: String,
        code: i32,
        message: String,
    },
    #[error("GPU {id:?}: {SET_MEMORY_LIMITS} (soft {soft} bytes, hard {hard} bytes, cgroup {namespace}) failed: {message} (error {code}); check the values and the driver's log (`dmesg`), or unset {LIMIT_ENV}")]
    Set {
        id: String,
        namespace: String,
        soft: u64,
        hard: u64,
        code: i32,
        message: String,
    },
    #[error("the {helper} answer is unreadable: {message}")]
    Helper { helper: String, message: String },
}

/// The hook's flags.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    /// `--driver-root`: where the driver's files are (`""` is `/`).
    pub driver_root: String,
    /// `--gpu-id`, repeated.
    pub gpu_ids: Vec<String>,
    /// `--log-file` (nvshim's): where a warning is appended besides stderr.
    pub log_file: Option<PathBuf>,
}

/// The limits a container asks for, in MiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub request_mib: u64,
    pub limit_mib: u64,
}

const MIB: u64 = 1024 * 1024;

impl Limits {
    /// NVML's soft limit, in bytes.
    pub fn soft_bytes(&self) -> u64 {
        self.request_mib * MIB
    }

    /// NVML's hard limit, in bytes.
    pub fn hard_bytes(&self) -> u64 {
        self.limit_mib * MIB
    }
}

fn mib(var: &'static str, value: &str) -> Result<u64, MemoryLimitError> {
    let bad = || MemoryLimitError::BadValue {
        var,
        value: value.chars().take(100).collect(),
    };
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let n: u64 = value.parse().map_err(|_| bad())?;
    // The value must still be a byte count NVML can take.
    n.checked_mul(MIB).ok_or_else(bad)?;
    Ok(n)
}

/// The limits in a process environment (`KEY=VALUE` entries, the last of a key winning, as
/// execve's environment does for getenv): `None` unless both variables are there.
pub fn limits_from_env<S: AsRef<str>>(env: &[S]) -> Result<Option<Limits>, MemoryLimitError> {
    let mut request = None;
    let mut limit = None;
    for entry in env {
        match entry.as_ref().split_once('=') {
            Some((REQUEST_ENV, v)) => request = Some(v),
            Some((LIMIT_ENV, v)) => limit = Some(v),
            _ => {}
        }
    }
    let (Some(request), Some(limit)) = (request, limit) else {
        return Ok(None);
    };
    let limits = Limits {
        request_mib: mib(REQUEST_ENV, request)?,
        limit_mib: mib(LIMIT_ENV, limit)?,
    };
    if limits.request_mib > limits.limit_mib {
        return Err(MemoryLimitError::RequestOverLimit {
            request: limits.request_mib,
            limit: limits.limit_mib,
        });
    }
    Ok(Some(limits))
}

/// The cgroup v2 path in `/proc/<pid>/cgroup` text: the `0::<path>` line (on a hybrid host,
/// beside the v1 `N:controllers:<path>` lines).
pub fn cgroup_v2_path(proc_cgroup: &str) -> Option<&str> {
    proc_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .filter(|p| p.starts_with('/'))
}

/// The container's cgroup v2 directory: `cgroup_root` joined with the `0::` path of `pid`.
pub fn cgroup_dir(
    proc_root: &Path,
    pid: i64,
    cgroup_root: &Path,
) -> Result<PathBuf, MemoryLimitError> {
    let path = proc_root.join(pid.to_string()).join("cgroup");
    let text = crate::hostfile::read_to_string(&path, MAX_PROC_CGROUP).map_err(|source| {
        MemoryLimitError::ProcCgroup {
            path: path.clone(),
            source,
        }
    })?;
    let rel = cgroup_v2_path(&text).ok_or(MemoryLimitError::NoCgroupV2 { path })?;
    Ok(cgroup_root.join(rel.trim_start_matches('/')))
}

/// True when `path` is a cgroup v2 mount.
pub fn is_cgroup2(path: &Path) -> Result<bool, MemoryLimitError> {
    let err = |source| MemoryLimitError::Statfs {
        path: path.to_path_buf(),
        source,
    };
    let c = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| err(io::Error::from(io::ErrorKind::InvalidInput)))?;
    let mut fs = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: `c` is a NUL-terminated path and `fs` a writable statfs buffer.
    if unsafe { libc::statfs(c.as_ptr(), fs.as_mut_ptr()) } != 0 {
        return Err(err(io::Error::last_os_error()));
    }
    // SAFETY: statfs succeeded, so it filled the buffer.
    let fs = unsafe { fs.assume_init() };
    #[allow(clippy::unnecessary_cast)] // f_type's width differs between architectures.
    Ok(fs.f_type as i64 == CGROUP2_SUPER_MAGIC)
}

/// `path` (absolute) below `root`.
fn under(root: &Path, path: &str) -> PathBuf {
    root.join(path.trim_start_matches('/'))
}

/// `libnvidia-ml.so.1` under `root`: through the root's ld.so.cache, else in [`DRIVER_LIBRARY_DIRS`].
pub fn find_library(root: &Path) -> Option<PathBuf> {
    let cache = root.join("etc/ld.so.cache");
    if let Ok(buf) = crate::hostfile::read(&cache, crate::ldcache::MAX_CACHE_LEN as u64) {
        if let Some(path) = LdCache::parse(&buf)
            .ok()
            .and_then(|c| c.lookup(NVML_SONAME).map(|p| under(root, p)))
            .filter(|p| p.exists())
        {
            return Some(path);
        }
    }
    DRIVER_LIBRARY_DIRS
        .iter()
        .map(|d| under(root, d).join(NVML_SONAME))
        .find(|p| p.exists())
}

/// What the set calls came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetOutcome {
    /// Every GPU has the limits.
    Applied,
    /// The driver does not offer the call: why (naming the driver).
    NotOffered(String),
}

type NvmlDevice = *mut c_void;

/// `nvmlSetMemoryLimits_v1_t` (nvml.h, CUDA 13.4): 24 bytes on 64-bit machines.
#[repr(C)]
struct SetMemoryLimitsV1 {
    name_space: *const c_char,
    soft_limit: u64,
    hard_limit: u64,
}

/// A loaded NVML. It is never unloaded: the hook exits right after.
struct Nvml {
    handle: *mut c_void,
    lib: PathBuf,
}

impl Nvml {
    fn load(lib: &Path) -> Result<Nvml, MemoryLimitError> {
        let c = CString::new(lib.as_os_str().as_encoded_bytes()).map_err(|_| {
            MemoryLimitError::Load {
                lib: lib.to_path_buf(),
                message: "the path has a NUL byte".into(),
            }
        })?;
        // SAFETY: a NUL-terminated path; loading runs the library's constructors, which is
        // what loading the driver's own NVML means (the operator's driver root names it).
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(MemoryLimitError::Load {
                lib: lib.to_path_buf(),
                message: dlerror(),
            });
        }
        Ok(Nvml {
            handle,
            lib: lib.to_path_buf(),
        })
    }

    /// The address of `name`, if the library exports it.
    fn symbol(&self, name: &str) -> Option<*mut c_void> {
        let c = CString::new(name).ok()?;
        // SAFETY: a live handle from dlopen and a NUL-terminated name.
        let p = unsafe { libc::dlsym(self.handle, c.as_ptr()) };
        (!p.is_null()).then_some(p)
    }

    fn required(&self, name: &'static str) -> Result<*mut c_void, MemoryLimitError> {
        self.symbol(name).ok_or(MemoryLimitError::NoSymbol {
            lib: self.lib.clone(),
            symbol: name,
        })
    }

    /// `nvmlErrorString`, or the bare code.
    fn error_string(&self, code: c_int) -> String {
        let Some(p) = self.symbol("nvmlErrorString") else {
            return format!("NVML error {code}");
        };
        // SAFETY: nvml.h: `const char* nvmlErrorString(nvmlReturn_t result)`.
        let f: extern "C" fn(c_int) -> *const c_char = unsafe { std::mem::transmute(p) };
        let s = f(code);
        if s.is_null() {
            return format!("NVML error {code}");
        }
        // SAFETY: NVML returns a static NUL-terminated string.
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    }

    /// `nvmlSystemGetDriverVersion`, or `None` where the library cannot say.
    fn driver_version(&self) -> Option<String> {
        let p = self.symbol("nvmlSystemGetDriverVersion")?;
        // SAFETY: nvml.h: `nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned
        // int length)`.
        let f: extern "C" fn(*mut c_char, c_uint) -> c_int = unsafe { std::mem::transmute(p) };
        let mut buf = [0u8; DRIVER_VERSION_LEN];
        if f(buf.as_mut_ptr().cast(), buf.len() as c_uint) != NVML_SUCCESS {
            return None;
        }
        let s = CStr::from_bytes_until_nul(&buf).ok()?;
        Some(s.to_string_lossy().into_owned()).filter(|s| !s.is_empty())
    }

    fn init(&self) -> Result<(), MemoryLimitError> {
        let p = self.required("nvmlInit_v2")?;
        // SAFETY: nvml.h: `nvmlReturn_t nvmlInit_v2(void)`.
        let f: extern "C" fn() -> c_int = unsafe { std::mem::transmute(p) };
        match f() {
            NVML_SUCCESS => Ok(()),
            code => Err(MemoryLimitError::Init {
                lib: self.lib.clone(),
                code,
                message: self.error_string(code),
            }),
        }
    }

    fn shutdown(&self) {
        if let Some(p) = self.symbol("nvmlShutdown") {
            // SAFETY: nvml.h: `nvmlReturn_t nvmlShutdown(void)`.
            let f: extern "C" fn() -> c_int = unsafe { std::mem::transmute(p) };
            f();
        }
    }

    /// The device an id names: all digits is an NVML index, anything else a (GPU or MIG) UUID.
    fn device(&self, id: &str) -> Result<NvmlDevice, MemoryLimitError> {
        let unknown = |code: c_int, message: String| MemoryLimitError::UnknownGpu {
            id: id.to_string(),
            code,
            message,
        };
        let mut device: NvmlDevice = std::ptr::null_mut();
        let code = if !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()) {
            let index: c_uint = id.parse().map_err(|_| unknown(0, "not an index".into()))?;
            let p = self.required("nvmlDeviceGetHandleByIndex_v2")?;
            // SAFETY: nvml.h: `nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index,
            // nvmlDevice_t *device)`.
            let f: extern "C" fn(c_uint, *mut NvmlDevice) -> c_int =
                unsafe { std::mem::transmute(p) };
            f(index, &mut device)
        } else {
            let c = CString::new(id).map_err(|_| unknown(0, "the id has a NUL byte".into()))?;
            let p = self.required("nvmlDeviceGetHandleByUUID")?;
            // SAFETY: nvml.h: `nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid,
            // nvmlDevice_t *device)`; `c` outlives the call.
            let f: extern "C" fn(*const c_char, *mut NvmlDevice) -> c_int =
                unsafe { std::mem::transmute(p) };
            f(c.as_ptr(), &mut device)
        };
        if code != NVML_SUCCESS {
            return Err(unknown(code, self.error_string(code)));
        }
        Ok(device)
    }
}

fn dlerror() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated string valid until the next dl call.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        return "dlopen failed".into();
    }
    // SAFETY: non-null, NUL-terminated (above).
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Why the limit was not applied, in the one warning's words.
fn not_applied(limits: &Limits, why: &str) -> String {
    format!(
        "{LIMIT_ENV}={} MiB ({REQUEST_ENV}={} MiB) was NOT applied: {why}; the container \
         starts without a GPU memory limit",
        limits.limit_mib, limits.request_mib
    )
}

fn driver_words(version: Option<&str>) -> String {
    match version {
        Some(v) => format!("driver {v}"),
        None => "the driver (version unknown)".into(),
    }
}

/// Loads NVML from `lib` and sets `limits` for the cgroup `namespace` on every GPU of `ids`.
pub fn set_limits(
    lib: &Path,
    namespace: &str,
    limits: &Limits,
    ids: &[String],
) -> Result<SetOutcome, MemoryLimitError> {
    let nvml = Nvml::load(lib)?;
    nvml.init()?;
    let result = set_limits_with(&nvml, namespace, limits, ids);
    nvml.shutdown();
    result
}

fn set_limits_with(
    nvml: &Nvml,
    namespace: &str,
    limits: &Limits,
    ids: &[String],
) -> Result<SetOutcome, MemoryLimitError> {
    let Some(set) = nvml.symbol(SET_MEMORY_LIMITS) else {
        let driver = driver_words(nvml.driver_version().as_deref());
        return Ok(SetOutcome::NotOffered(format!(
            "{driver} does not offer {SET_MEMORY_LIMITS} ({} has no such symbol; drivers from \
             R615 do)",
            nvml.lib.display()
        )));
    };
    // SAFETY: nvml.h (CUDA 13.4): `nvmlReturn_t nvmlDeviceSetMemoryLimits_v1(nvmlDevice_t
    // device, nvmlSetMemoryLimits_v1_t *limits)`, with the struct laid out as
    // `SetMemoryLimitsV1`.
    let set: unsafe extern "C" fn(NvmlDevice, *mut SetMemoryLimitsV1) -> c_int =
        unsafe { std::mem::transmute(set) };
    let ns = CString::new(namespace).map_err(|_| MemoryLimitError::Set {
        id: String::new(),
        namespace: namespace.to_string(),
        soft: limits.soft_bytes(),
        hard: limits.hard_bytes(),
        code: 0,
        message: "the cgroup path has a NUL byte".into(),
    })?;
    for id in ids {
        let device = nvml.device(id)?;
        let mut arg = SetMemoryLimitsV1 {
            name_space: ns.as_ptr(),
            soft_limit: limits.soft_bytes(),
            hard_limit: limits.hard_bytes(),
        };
        // SAFETY: `device` is a handle NVML gave for `id`; `ns` outlives the call and `arg` is
        // a valid struct of the header's layout, borrowed exclusively for it.
        match unsafe { set(device, &mut arg) } {
            NVML_SUCCESS => {}
            code @ (NVML_ERROR_NOT_SUPPORTED | NVML_ERROR_FUNCTION_NOT_FOUND) => {
                let driver = driver_words(nvml.driver_version().as_deref());
                return Ok(SetOutcome::NotOffered(format!(
                    "{driver} answers {SET_MEMORY_LIMITS} on GPU {id} with \"{}\" (error {code})",
                    nvml.error_string(code)
                )));
            }
            code => {
                return Err(MemoryLimitError::Set {
                    id: id.clone(),
                    namespace: namespace.to_string(),
                    soft: limits.soft_bytes(),
                    hard: limits.hard_bytes(),
                    code,
                    message: nvml.error_string(code),
                })
            }
        }
    }
    Ok(SetOutcome::Applied)
}

/// Where a process finds things on the host: overridden only by tests.
#[derive(Debug, Clone)]
pub struct HostPaths {
    pub proc_root: PathBuf,
    pub cgroup_root: PathBuf,
}

impl Default for HostPaths {
    fn default() -> Self {
        HostPaths {
            proc_root: PathBuf::from("/proc"),
            cgroup_root: PathBuf::from(CGROUP_ROOT),
        }
    }
}

/// Runs the hook for the container of `state`; the warnings (at most one).
pub fn run(
    state: &State,
    options: &Options,
    host: &HostPaths,
) -> Result<Vec<String>, MemoryLimitError> {
    let env = state.process_env()?;
    let Some(limits) = limits_from_env(&env)? else {
        return Ok(Vec::new());
    };
    if options.gpu_ids.is_empty() {
        return Ok(Vec::new());
    }
    let warnings = match apply(state, options, host, &limits)? {
        SetOutcome::Applied => Vec::new(),
        SetOutcome::NotOffered(why) => vec![not_applied(&limits, &why)],
    };
    if let Some(log) = &options.log_file {
        for w in &warnings {
            append_log(log, w);
        }
    }
    Ok(warnings)
}

fn apply(
    state: &State,
    options: &Options,
    host: &HostPaths,
    limits: &Limits,
) -> Result<SetOutcome, MemoryLimitError> {
    if !is_cgroup2(&host.cgroup_root)? {
        return Ok(SetOutcome::NotOffered(format!(
            "{} is not a cgroup v2 file system (a cgroup v1 or hybrid host), and NVML limits \
             GPU memory per cgroup v2 directory",
            host.cgroup_root.display()
        )));
    }
    let pid = state
        .pid
        .filter(|p| *p > 0)
        .ok_or_else(|| MemoryLimitError::NoPid {
            id: state.id.clone(),
        })?;
    let namespace = cgroup_dir(&host.proc_root, pid, &host.cgroup_root)?;
    let root = Path::new(if options.driver_root.is_empty() {
        "/"
    } else {
        options.driver_root.as_str()
    });
    let lib = find_library(root).ok_or_else(|| MemoryLimitError::NoLibrary {
        root: root.to_path_buf(),
        dirs: DRIVER_LIBRARY_DIRS.join(", "),
    })?;
    let namespace = namespace.to_string_lossy().into_owned();
    helper::set_limits(&lib, &namespace, limits, &options.gpu_ids)
}

/// Appends one line to nvshim's log; a log that cannot be written is not an error.
fn append_log(path: &Path, message: &str) {
    if let Ok(mut f) = OpenOptions::new().create(true).append(true).open(path) {
        let _ = writeln!(f, "WARN nvshim-hook apply-cuda-memory-limits: {message}");
    }
}

/// Where the NVML calls run. A dynamically linked hook loads NVML itself. The released
/// `nvshim-hook` is static-pie (scripts/build-release.sh), and a static glibc program cannot
/// load libnvidia-ml safely (the library would bring the host's `libc.so.6` in beside the
/// static one; src/host/nvml/mod.rs says the same of nvshim-runtime): it runs the dynamically
/// linked `nvshim` installed beside it, `nvshim nvml-set-memory-limits ...`, with an empty
/// environment, and reads its one-line JSON answer. Which one is decided at run time, not by
/// `cfg!(target_feature = "crt-static")`: build-release.sh links only the final binary
/// statically, so this library is compiled without that feature even inside the static hook
/// (the lent H200 showed it: the static hook dlopen'd NVML itself and died of SIGFPE).
pub mod helper {
    use super::*;

    /// Whether this process runs without an ELF interpreter (a static or static-pie binary),
    /// where glibc's `dlopen` of the driver's NVML is unsafe. The kernel passes the
    /// interpreter's load address as `AT_BASE` (auxv(3)); it is 0 when there is none.
    pub fn statically_linked() -> bool {
        // SAFETY: getauxval only reads this process's auxiliary vector.
        unsafe { libc::getauxval(libc::AT_BASE) == 0 }
    }

    /// The hidden `nvshim` subcommand.
    pub const SUBCOMMAND: &str = "nvml-set-memory-limits";

    /// The answer the helper prints: `{"applied":true}`, `{"notOffered":"why"}` or
    /// `{"error":"message"}`.
    pub fn answer(result: &Result<SetOutcome, MemoryLimitError>) -> String {
        let v = match result {
            Ok(SetOutcome::Applied) => serde_json::json!({ "applied": true }),
            Ok(SetOutcome::NotOffered(why)) => serde_json::json!({ "notOffered": why }),
            Err(e) => serde_json::json!({ "error": e.to_string() }),
        };
        v.to_string()
    }

    /// The helper's argv after the subcommand.
    pub fn args(lib: &Path, namespace: &str, limits: &Limits, ids: &[String]) -> Vec<String> {
        let mut a = vec![
            "--lib".to_string(),
            lib.to_string_lossy().into_owned(),
            "--namespace".into(),
            namespace.to_string(),
            "--request-mib".into(),
            limits.request_mib.to_string(),
            "--limit-mib".into(),
            limits.limit_mib.to_string(),
        ];
        for id in ids {
            a.push("--gpu-id".into());
            a.push(id.clone());
        }
        a
    }

    /// [`super::set_limits`] in this process, or through `nvshim` for a static hook.
    pub fn set_limits(
        lib: &Path,
        namespace: &str,
        limits: &Limits,
        ids: &[String],
    ) -> Result<SetOutcome, MemoryLimitError> {
        if !statically_linked() {
            return super::set_limits(lib, namespace, limits, ids);
        }
        let exe = std::env::current_exe().unwrap_or_default();
        let helper = exe.with_file_name("nvshim");
        let fail = |message: String| MemoryLimitError::Helper {
            helper: format!("{} {SUBCOMMAND}", helper.display()),
            message,
        };
        let out = std::process::Command::new(&helper)
            .arg(SUBCOMMAND)
            .args(args(lib, namespace, limits, ids))
            .env_clear()
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| {
                fail(format!(
                    "cannot run it: {e}; install nvshim beside nvshim-hook"
                ))
            })?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| {
            fail(format!(
                "{e} ({}: {})",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        })?;
        if v.get("applied").is_some() {
            return Ok(SetOutcome::Applied);
        }
        if let Some(why) = v.get("notOffered").and_then(|w| w.as_str()) {
            return Ok(SetOutcome::NotOffered(why.to_string()));
        }
        let message = v
            .get("error")
            .and_then(|e| e.as_str())
            .unwrap_or("no answer");
        Err(fail(message.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_absent_is_a_no_op() {
        assert_eq!(limits_from_env::<&str>(&[]).unwrap(), None);
        assert_eq!(
            limits_from_env(&["PATH=/bin", "NVIDIA_GPU_MEMORY_LIMIT=2048"]).unwrap(),
            None
        );
        assert_eq!(
            limits_from_env(&["NVIDIA_GPU_MEMORY_REQUEST=1024"]).unwrap(),
            None
        );
    }

    #[test]
    fn env_values() {
        let l = limits_from_env(&[
            "NVIDIA_GPU_MEMORY_REQUEST=1",
            "NVIDIA_GPU_MEMORY_REQUEST=1024",
            "NVIDIA_GPU_MEMORY_LIMIT=2048",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            l,
            Limits {
                request_mib: 1024,
                limit_mib: 2048
            }
        );
        assert_eq!(l.soft_bytes(), 1024 * 1024 * 1024);
        assert_eq!(l.hard_bytes(), 2048 * 1024 * 1024);
        // Equal is fine.
        assert!(limits_from_env(&[
            "NVIDIA_GPU_MEMORY_REQUEST=2048",
            "NVIDIA_GPU_MEMORY_LIMIT=2048"
        ])
        .unwrap()
        .is_some());
    }

    #[test]
    fn env_bad_values() {
        for (req, lim, var) in [
            ("1G", "2048", REQUEST_ENV),
            ("1024", "2GiB", LIMIT_ENV),
            ("-1", "2048", REQUEST_ENV),
            ("", "2048", REQUEST_ENV),
            ("1024", " 2048", LIMIT_ENV),
            ("1024", "18446744073709551615", LIMIT_ENV),
        ] {
            let e = limits_from_env(&[
                format!("NVIDIA_GPU_MEMORY_REQUEST={req}"),
                format!("NVIDIA_GPU_MEMORY_LIMIT={lim}"),
            ])
            .unwrap_err();
            match &e {
                MemoryLimitError::BadValue { var: v, .. } => assert_eq!(*v, var, "{e}"),
                other => panic!("{req} {lim}: {other}"),
            }
            assert!(e.to_string().contains(var), "{e}");
        }
        let e = limits_from_env(&[
            "NVIDIA_GPU_MEMORY_REQUEST=4096",
            "NVIDIA_GPU_MEMORY_LIMIT=2048",
        ])
        .unwrap_err();
        assert!(matches!(
            e,
            MemoryLimitError::RequestOverLimit {
                request: 4096,
                limit: 2048
            }
        ));
        assert!(
            e.to_string()
                .starts_with("memory request (4096 MiB, NVIDIA_GPU_MEMORY_REQUEST) exceeds memory limit (2048 MiB"),
            "{e}"
        );
    }

    #[test]
    fn cgroup_lines() {
        assert_eq!(
            cgroup_v2_path("0::/system.slice/runc-abc.scope\n"),
            Some("/system.slice/runc-abc.scope")
        );
        // A hybrid host: v1 controllers, then the unified line.
        let hybrid = "12:pids:/user.slice\n4:memory:/docker/abc\n1:name=systemd:/docker/abc\n\
                      0::/docker/abc\n";
        assert_eq!(cgroup_v2_path(hybrid), Some("/docker/abc"));
        // A v1-only host has no `0::` line.
        assert_eq!(cgroup_v2_path("4:memory:/x\n1:name=systemd:/x\n"), None);
        assert_eq!(cgroup_v2_path(""), None);
        // The root cgroup.
        assert_eq!(cgroup_v2_path("0::/\n"), Some("/"));
    }

    #[test]
    fn cgroup_dir_joins_the_mount() {
        let proc = tempfile::tempdir().unwrap();
        std::fs::create_dir(proc.path().join("42")).unwrap();
        std::fs::write(
            proc.path().join("42/cgroup"),
            "3:cpuset:/c\n0::/kubepods/pod1/ctr\n",
        )
        .unwrap();
        assert_eq!(
            cgroup_dir(proc.path(), 42, Path::new("/sys/fs/cgroup")).unwrap(),
            PathBuf::from("/sys/fs/cgroup/kubepods/pod1/ctr")
        );
        std::fs::create_dir(proc.path().join("43")).unwrap();
        std::fs::write(proc.path().join("43/cgroup"), "3:cpuset:/c\n").unwrap();
        let e = cgroup_dir(proc.path(), 43, Path::new("/sys/fs/cgroup")).unwrap_err();
        assert!(matches!(e, MemoryLimitError::NoCgroupV2 { .. }), "{e}");
        assert!(matches!(
            cgroup_dir(proc.path(), 44, Path::new("/sys/fs/cgroup")),
            Err(MemoryLimitError::ProcCgroup { .. })
        ));
    }

    #[test]
    fn library_in_the_usual_directories() {
        let root = tempfile::tempdir().unwrap();
        assert_eq!(find_library(root.path()), None);
        let dir = root.path().join("usr/lib64");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(NVML_SONAME), b"").unwrap();
        assert_eq!(find_library(root.path()), Some(dir.join(NVML_SONAME)));
    }

    #[test]
    fn limits_struct_is_nvml_layout() {
        assert_eq!(std::mem::size_of::<SetMemoryLimitsV1>(), 24);
    }

    #[test]
    fn missing_library_is_an_error_naming_the_root() {
        let e = MemoryLimitError::NoLibrary {
            root: PathBuf::from("/run/nvidia/driver"),
            dirs: DRIVER_LIBRARY_DIRS.join(", "),
        };
        let m = e.to_string();
        assert!(
            m.contains("/run/nvidia/driver") && m.contains("--driver-root"),
            "{m}"
        );
    }

    #[test]
    fn a_test_binary_is_dynamically_linked() {
        // cargo's test binaries have an ELF interpreter: NVML is loaded in process there.
        assert!(!helper::statically_linked());
    }

    #[test]
    fn helper_answers_round_trip() {
        assert_eq!(
            helper::answer(&Ok(SetOutcome::Applied)),
            r#"{"applied":true}"#
        );
        let a = helper::answer(&Ok(SetOutcome::NotOffered("driver 580".into())));
        assert_eq!(a, r#"{"notOffered":"driver 580"}"#);
        let args = helper::args(
            Path::new("/l.so"),
            "/sys/fs/cgroup/x",
            &Limits {
                request_mib: 1,
                limit_mib: 2,
            },
            &["GPU-1".into()],
        );
        assert_eq!(args.last().map(String::as_str), Some("GPU-1"));
    }
}
