//! `nvshim doctor`: checks the host for what GPU containers need, one line per check, each
//! problem with the command that fixes it.
//!
//! One issue in five on NVIDIA's toolkit quotes an opaque error, and a self-diagnostic command
//! has been asked for since 2023 (docs/field-notes.md §4, nvidia-container-toolkit#179). The
//! checks follow the failures users meet most (docs/field-notes.md §2): the driver not loaded,
//! device nodes missing or with numbers that moved (§2.2), `/dev/char` links missing for the
//! systemd cgroup driver ("Failed to initialize NVML: Unknown Error" after a daemon-reload,
//! §2.1), persistence mode off (seconds per container start, §1), CDI specs that no longer
//! match the driver (the most reported CDI failure, §2.6), engines without the `nvidia`
//! runtime or pointing at a binary that is gone (§2.4, §2.5), no runc or crun.
//!
//! Every check reads through the same code the runtime uses ([`crate::host`],
//! [`crate::cdi::Registry`], [`crate::ops::system`], [`crate::runtime`], [`crate::ops::engine`]) and
//! changes nothing. Every path comes from [`Options`], so tests point it at a fake host and
//! temporary engine configs.
//!
//! One module over 600 lines (the command is tested end to end in `tests/e2e/diagnostics.rs`):
//! [`run`] threads the driver version and the GPUs from one check into the next, and every
//! check returns the same [`Check`] from the same [`Options`]. Holds the host and CDI checks and
//! both renderers; the engine checks, which read no host state, are [`engines`].

use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::cdi::Registry;
use crate::config::Config;
use crate::host::{cuda_version_for_driver, Gpu, Host, HostError, Inventory, Scope};
use crate::install;
use crate::ops::engine::Engine;
use crate::ops::freshness::{self, HostView};
use crate::ops::system::{self, DevCharOptions, LinkAction};

pub mod caches;
mod engines;
mod platform;
pub mod rootless;
use engines::{engine_check, hook_check, low_level_runtime_check};

/// A check's verdict, in increasing order of gravity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    /// Not checked (what it needs is absent, e.g. NVML or the engine).
    Skip,
    Warning,
    Error,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Skip => "skip",
            Status::Warning => "warning",
            Status::Error => "error",
        }
    }
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Check {
    /// Short and stable: `driver`, `device-nodes`, `dev-char`, `persistence`, `cdi-spec`,
    /// `engine-docker`, ...
    pub name: String,
    pub status: Status,
    pub message: String,
    /// The command (or the action) that fixes a warning or an error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

fn check(name: &str, status: Status, message: impl Into<String>, fix: Option<String>) -> Check {
    Check {
        name: name.into(),
        status,
        message: message.into(),
        fix,
    }
}

/// Where to look. [`Options::system`] gives the real paths.
#[derive(Debug, Clone)]
pub struct Options {
    pub config: Config,
    /// The nvshim config file and why it did not load, if it did not (then `config` is the
    /// defaults).
    pub config_path: PathBuf,
    pub config_error: Option<String>,
    pub docker_config: PathBuf,
    pub containerd_config: PathBuf,
    pub crio_config: PathBuf,
    pub dev_char_path: PathBuf,
    /// `PATH`: where engines' daemons and runc are looked for.
    pub path_var: Option<OsString>,
    /// The running `nvshim` binary: `nvshim-runtime` and `nvshim-hook` are expected beside it.
    pub self_exe: Option<PathBuf>,
}

impl Options {
    /// The real system's paths for `config`.
    pub fn system(config: Config, config_path: PathBuf) -> Options {
        Options {
            config,
            config_path,
            config_error: None,
            docker_config: Engine::Docker.default_config(),
            containerd_config: Engine::Containerd.default_config(),
            crio_config: Engine::Crio.default_config(),
            dev_char_path: PathBuf::from(system::DEFAULT_DEV_CHAR_PATH),
            path_var: None,
            self_exe: None,
        }
    }
}

/// The exit status for a report: 0 all ok, 1 warnings, 2 errors.
pub fn exit_code(checks: &[Check]) -> u8 {
    match checks.iter().map(|c| c.status).max() {
        Some(Status::Error) => 2,
        Some(Status::Warning) => 1,
        _ => 0,
    }
}

/// Runs every check.
pub fn run(opts: &Options) -> Vec<Check> {
    let mut out = Vec::new();
    out.push(config_check(opts));
    out.push(request_policy_check(&opts.config));
    let host = install::host_from(&opts.config);
    let platform = platform::platform_checks(&host, &opts.config);
    let on_platform = platform.len() > 1;
    out.extend(platform);
    if on_platform {
        for engine in Engine::ALL {
            out.push(engine_check(engine, opts));
        }
        out.push(low_level_runtime_check(opts));
        out.push(hook_check(opts));
        out.push(caches::cache_check(&opts.config));
        return out;
    }
    let driver = driver_check(&host);
    let loaded = driver.1.clone();
    out.push(driver.0);
    match &loaded {
        Some(version) => {
            let gpus = gpus_check(&host, &mut out);
            // The value `create`, `cdi generate` and `explain` read.
            let inv = Inventory::of(&host, Scope::ALL, &opts.config.mps_pipe_directory);
            out.push(device_nodes_check(&host, inv.as_ref(), &gpus));
            out.push(dev_char_check(&host, opts));
            out.push(persistence_check(&host));
            out.push(libraries_check(&host, version));
            // A regular user running doctor is asking about rootless containers.
            if !nix::unistd::geteuid().is_root() {
                out.extend(rootless::current_user(&opts.config, &host, &gpus));
            }
        }
        None => {
            for name in [
                "gpus",
                "device-nodes",
                "dev-char",
                "persistence",
                "libraries",
            ] {
                out.push(check(
                    name,
                    Status::Skip,
                    "not checked: the driver is not loaded",
                    None,
                ));
            }
        }
    }
    let host_gpus = host.gpus().unwrap_or_default();
    out.extend(cdi_checks(
        &opts.config,
        &host,
        loaded.as_deref(),
        &host_gpus,
    ));
    for engine in Engine::ALL {
        out.push(engine_check(engine, opts));
    }
    out.push(low_level_runtime_check(opts));
    out.push(hook_check(opts));
    out.push(caches::cache_check(&opts.config));
    out
}

fn config_check(opts: &Options) -> Check {
    let path = opts.config_path.display();
    match &opts.config_error {
        Some(e) => check(
            "config",
            Status::Error,
            format!("{e} (the other checks use the defaults)"),
            Some(format!(
                "fix {path}, or move it away to run with the defaults"
            )),
        ),
        None if opts.config_path.exists() => check("config", Status::Ok, format!("{path}"), None),
        None => check(
            "config",
            Status::Ok,
            format!("{path} does not exist: the defaults apply"),
            None,
        ),
    }
}

/// Which mode the node is in for unprivileged env requests (`request::env_policy`), and what
/// that mode guarantees with NVIDIA's device plugin (README, "On Kubernetes").
fn request_policy_check(config: &Config) -> Check {
    use crate::config::UnprivilegedEnv;
    let setting = format!(
        "accept-envvar-unprivileged = {}",
        config.accept_envvar_unprivileged.name()
    );
    let mounts = if config.accept_volume_mounts {
        "the device plugin's volume mounts are read as requests"
    } else {
        "the device plugin's volume-mounts strategy fails (accept-volume-mounts = false)"
    };
    let what = match config.accept_envvar_unprivileged {
        UnprivilegedEnv::Accept => "any container may pick GPUs by NVIDIA_VISIBLE_DEVICES and every node of a feature by NVIDIA_GDS & co. (a pod can widen its device-plugin allocation): for Docker hosts and nodes whose pods may all use every GPU",
        UnprivilegedEnv::AllocationBacked => "an unprivileged NVIDIA_VISIBLE_DEVICES is honoured only when the kubelet's device checkpoint (kubelet-device-checkpoint, containerd nodes), the device plugin's mounts, CDI annotations or device nodes (PASS_DEVICE_SPECS=true) name the same GPUs, and NVIDIA_GDS, _MOFED, _GDRCOPY, _NVSWITCH only when the device plugin's allocate response in that checkpoint sets them; others fail to create",
        UnprivilegedEnv::Refuse => "an unprivileged GPU list in NVIDIA_VISIBLE_DEVICES fails to create: the device plugin's envvar strategy does not work here",
    };
    check(
        "request-policy",
        Status::Ok,
        format!("{setting}: {what}; {mounts}; IMEX and MIG management variables count from privileged containers only; DRA claims need the engine's CDI (see the engine checks)"),
        None,
    )
}

/// The driver check, and the running driver version when it is loaded.
fn driver_check(host: &Host) -> (Check, Option<String>) {
    let file = host.roots().proc_root.join("driver/nvidia/version");
    match host.driver_version() {
        Ok(v) => {
            let cuda = cuda_version_for_driver(&v)
                .map(|c| format!(", CUDA {c}"))
                .unwrap_or_default();
            (
                check(
                    "driver",
                    Status::Ok,
                    format!("NVIDIA driver {v} loaded{cuda}"),
                    None,
                ),
                Some(v),
            )
        }
        Err(e) => {
            let message = if file.exists() {
                e.to_string()
            } else {
                format!(
                    "the NVIDIA driver is not loaded ({} does not exist)",
                    file.display()
                )
            };
            (
                check(
                    "driver",
                    Status::Error,
                    message,
                    Some("modprobe nvidia (if it fails, `dmesg | grep -i nvrm` says why; without a driver, install one)".into()),
                ),
                None,
            )
        }
    }
}

fn gpus_check(host: &Host, out: &mut Vec<Check>) -> Vec<Gpu> {
    let dir = host.roots().proc_root.join("driver/nvidia/gpus");
    match host.gpus() {
        Ok(gpus) if gpus.is_empty() => {
            out.push(check(
                "gpus",
                Status::Warning,
                format!("the driver is loaded but sees no GPU (nothing under {})", dir.display()),
                Some("check that the GPUs are on the bus (`lspci -d 10de:`) and `dmesg | grep -i nvrm` for errors".into()),
            ));
            gpus
        }
        Ok(gpus) => {
            let list: Vec<String> = gpus
                .iter()
                .map(|g| format!("{} {} ({})", g.index, g.uuid, g.bus_id))
                .collect();
            out.push(check(
                "gpus",
                Status::Ok,
                format!("{} GPU(s): {}", gpus.len(), list.join(", ")),
                None,
            ));
            gpus
        }
        Err(e) => {
            out.push(check(
                "gpus",
                Status::Error,
                e.to_string(),
                Some("reload the driver (`modprobe -r nvidia && modprobe nvidia`) or check `dmesg | grep -i nvrm`".into()),
            ));
            Vec::new()
        }
    }
}

use crate::nvidia::NVIDIACTL_MINOR;

fn device_nodes_check(host: &Host, inv: Result<&Inventory, &HostError>, gpus: &[Gpu]) -> Check {
    let devices = host.roots().proc_root.join("devices");
    let (inv, majors) = match inv {
        Ok(inv) => (inv, &inv.majors),
        Err(e) => {
            return check(
                "device-nodes",
                Status::Error,
                e.to_string(),
                Some("modprobe nvidia".into()),
            )
        }
    };
    // (name, major, minor, the command that creates it)
    let mut wanted: Vec<(String, u32, u32, String)> = gpus
        .iter()
        .map(|g| {
            (
                format!("nvidia{}", g.minor),
                majors.nvidia,
                g.minor,
                format!("nvidia-modprobe -c {}", g.minor),
            )
        })
        .collect();
    wanted.push((
        "nvidiactl".into(),
        majors.nvidia,
        NVIDIACTL_MINOR,
        "nvidia-modprobe -c 0".into(),
    ));
    let mut problems: Vec<String> = Vec::new();
    let mut fixes: Vec<String> = Vec::new();
    let mut status = Status::Ok;
    match majors.nvidia_uvm {
        Some(uvm) => wanted.push((
            "nvidia-uvm".into(),
            uvm,
            0,
            "nvidia-modprobe -u -c 0".into(),
        )),
        None => {
            status = Status::Error;
            problems.push(format!(
                "no nvidia-uvm major in {}: CUDA cannot start without the nvidia-uvm module",
                devices.display()
            ));
            fixes.push("modprobe nvidia-uvm".into());
        }
    }
    let dev = host.roots().dev_root.join("dev");
    let mut present = Vec::new();
    for (name, major, minor, fix) in &wanted {
        let path = dev.join(name);
        match inv.node(name) {
            Some(n) if (n.major, n.minor) == (*major, *minor) => present.push(name.clone()),
            Some(n) => {
                status = Status::Error;
                problems.push(format!(
                    "{} is c {}:{} but the driver's numbers are {major}:{minor} ({})",
                    path.display(),
                    n.major,
                    n.minor,
                    devices.display()
                ));
                fixes.push(format!("rm {} && {fix}", path.display()));
            }
            None => {
                status = Status::Error;
                let what = if path.exists() {
                    "is not a device node"
                } else {
                    "is missing"
                };
                problems.push(format!(
                    "{} {what} (expected c {major}:{minor})",
                    path.display()
                ));
                if !fixes.contains(fix) {
                    fixes.push(fix.clone());
                }
            }
        }
    }
    if problems.is_empty() {
        check(
            "device-nodes",
            Status::Ok,
            format!(
                "{} under {} with the majors of {} (nvidia {}{})",
                present.join(", "),
                dev.display(),
                devices.display(),
                majors.nvidia,
                majors
                    .nvidia_uvm
                    .map(|u| format!(", nvidia-uvm {u}"))
                    .unwrap_or_default()
            ),
            None,
        )
    } else {
        check(
            "device-nodes",
            status,
            problems.join("; "),
            Some(format!(
                "{} (or run `nvidia-smi` once as root, which creates the nodes)",
                fixes.join("; ")
            )),
        )
    }
}

fn dev_char_check(host: &Host, opts: &Options) -> Check {
    let dry = DevCharOptions {
        dev_char_path: opts.dev_char_path.clone(),
        create_all: false,
        dry_run: true,
    };
    let mut fix = "nvshim system create-dev-char-symlinks".to_string();
    if opts.dev_char_path != Path::new(system::DEFAULT_DEV_CHAR_PATH) {
        fix.push_str(&format!(
            " --dev-char-path {}",
            opts.dev_char_path.display()
        ));
    }
    let links = match system::create_dev_char_symlinks(host, &dry) {
        Ok(l) => l,
        Err(e) => return check("dev-char", Status::Error, e.to_string(), Some(fix)),
    };
    if links.is_empty() {
        return check(
            "dev-char",
            Status::Skip,
            "no NVIDIA device nodes to link",
            None,
        );
    }
    let bad: Vec<String> = links
        .iter()
        .filter(|l| l.action != LinkAction::Keep)
        .map(|l| {
            let state = match &l.action {
                LinkAction::Create => "missing".to_string(),
                LinkAction::Replace { old } => format!("points at {}", old.display()),
                LinkAction::Blocked => "is not a symlink".to_string(),
                LinkAction::Keep => String::new(),
            };
            format!("{} {state}", l.link.display())
        })
        .collect();
    if bad.is_empty() {
        return check(
            "dev-char",
            Status::Ok,
            format!(
                "{} links under {} lead to the NVIDIA nodes",
                links.len(),
                opts.dev_char_path.display()
            ),
            None,
        );
    }
    // A warning, not an error: only runc's systemd cgroup driver needs them, and which driver
    // the engines use is not visible from here.
    check(
        "dev-char",
        Status::Warning,
        format!(
            "{} of {} links missing or wrong: {}; with the systemd cgroup driver runc drops the GPU device rules, and the next `systemctl daemon-reload` revokes GPU access (\"Failed to initialize NVML: Unknown Error\")",
            bad.len(),
            links.len(),
            bad.join(", ")
        ),
        Some(fix),
    )
}

fn persistence_check(host: &Host) -> Check {
    let modes =
        crate::host::nvml::library_path(host).and_then(crate::host::nvml::persistence_modes);
    let modes = match modes {
        Ok(m) => m,
        Err(e) => {
            return check(
                "persistence",
                Status::Skip,
                format!("not checked: NVML did not load or answer ({e})"),
                None,
            )
        }
    };
    let off: Vec<String> = modes
        .iter()
        .filter(|p| p.enabled == Some(false))
        .map(|p| format!("GPU {} ({})", p.index, p.uuid))
        .collect();
    let known = modes.iter().filter(|p| p.enabled.is_some()).count();
    if known == 0 {
        return check(
            "persistence",
            Status::Skip,
            "not checked: NVML does not report persistence mode on these GPUs",
            None,
        );
    }
    if off.is_empty() {
        return check(
            "persistence",
            Status::Ok,
            format!("persistence mode is on for {known} GPU(s)"),
            None,
        );
    }
    check(
        "persistence",
        Status::Warning,
        format!(
            "persistence mode is off on {}: every container start initialises the GPU again (seconds on large nodes)",
            off.join(", ")
        ),
        Some("systemctl enable --now nvidia-persistenced (or `nvidia-smi -pm 1`)".into()),
    )
}

fn libraries_check(host: &Host, version: &str) -> Check {
    let root = &host.roots().driver_root;
    let cache_path = crate::host::under_root(root, "/etc/ld.so.cache");
    let ldconfig = if root == Path::new("/") {
        "ldconfig".to_string()
    } else {
        format!("ldconfig -r {}", root.display())
    };
    let cache = match host.ld_cache() {
        Ok(c) => c,
        Err(e) => {
            return check("libraries", Status::Error, e.to_string(), Some(ldconfig));
        }
    };
    // A driver directory has no ld.so.cache: `Host::ld_cache` scanned it instead.
    let through = if cache_path.exists() {
        cache_path.display().to_string()
    } else {
        format!(
            "a scan of {}'s library directories (it has no etc/ld.so.cache)",
            root.display()
        )
    };
    // The two every GPU container needs: CUDA's and NVML's.
    let wanted: Vec<&crate::nvidia::Library> = crate::nvidia::LIBRARIES
        .iter()
        .filter(|l| l.stem == "libcuda" || l.stem == "libnvidia-ml")
        .collect();
    let found = host.libraries(
        &cache,
        wanted.iter().copied(),
        version,
        crate::host::WordSize::Bits64,
    );
    let missing: Vec<String> = wanted
        .iter()
        .filter(|w| {
            !found
                .iter()
                .any(|l| l.soname.starts_with(&format!("{}.so.", w.stem)))
        })
        .map(|w| format!("{}.so.{version}", w.stem))
        .collect();
    if missing.is_empty() {
        let files: Vec<String> = found
            .iter()
            .map(|l| l.file.container_path.clone())
            .collect();
        check(
            "libraries",
            Status::Ok,
            format!("{} (through {through})", files.join(", ")),
            None,
        )
    } else {
        check(
            "libraries",
            Status::Error,
            format!(
                "{} not found through {through}: GPU containers would get no driver library of version {version}",
                missing.join(", "),
            ),
            Some(format!(
                "{ldconfig} (or reinstall the driver's user-space libraries for {version})"
            )),
        )
    }
}

fn cdi_checks(
    config: &Config,
    host: &Host,
    driver_version: Option<&str>,
    gpus: &[Gpu],
) -> Vec<Check> {
    let registry = Registry::load(&config.cdi_spec_dirs);
    let target = config
        .cdi_spec_dirs
        .last()
        .map_or_else(|| PathBuf::from("/var/run/cdi"), Clone::clone)
        .join("nvidia.yaml");
    // The node's own spec is `cdi refresh`'s to keep; others are regenerated where they are.
    let regenerate = |path: &Path| {
        if path == target {
            format!(
                "nvshim cdi refresh --output {} (the packages' nvshim-cdi-refresh.timer keeps it current: systemctl enable --now nvshim-cdi-refresh.timer)",
                path.display()
            )
        } else {
            format!("nvshim cdi generate --output {}", path.display())
        }
    };
    let mut out = Vec::new();
    for e in registry.errors() {
        out.push(check(
            "cdi-spec",
            Status::Error,
            format!("{e} (its devices are unavailable)"),
            Some(format!(
                "fix or remove {}, or regenerate it: {}",
                e.path().display(),
                regenerate(e.path())
            )),
        ));
    }
    let view = HostView {
        driver_version: driver_version.map(str::to_string),
        gpus: gpus.to_vec(),
        mig_instances: host.mig_instances(),
        mig_minors: host.mig_minors().unwrap_or_default(),
    };
    let mut nvidia_specs = 0;
    for loaded in registry.specs() {
        let spec = &loaded.spec;
        if spec.kind.starts_with("nvidia.com/") {
            nvidia_specs += 1;
        }
        let stale = freshness::stale_reasons(spec, &view);
        let path = loaded.path.display();
        if stale.is_empty() {
            out.push(check(
                "cdi-spec",
                Status::Ok,
                format!(
                    "{path}: kind {}, {} devices, matches the host{}",
                    spec.kind,
                    spec.devices.len(),
                    driver_version
                        .map(|v| format!(" and driver {v}"))
                        .unwrap_or_default()
                ),
                None,
            ));
        } else {
            let shown: Vec<&str> = stale.iter().take(3).map(String::as_str).collect();
            let more = if stale.len() > shown.len() {
                format!(" (and {} more)", stale.len() - shown.len())
            } else {
                String::new()
            };
            out.push(check(
                "cdi-spec",
                Status::Error,
                format!(
                    "{path} is stale: {}{more}; containers given its devices fail or get the wrong libraries",
                    shown.join("; ")
                ),
                Some(regenerate(&loaded.path)),
            ));
        }
    }
    if nvidia_specs == 0 {
        let dirs: Vec<String> = config
            .cdi_spec_dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect();
        out.push(check(
            "cdi-spec",
            Status::Warning,
            format!(
                "no CDI spec for nvidia.com devices in {}: CDI requests (Kubernetes device plugins, Docker's --gpus since 29.2) fail with \"unresolvable CDI devices\"",
                dirs.join(", ")
            ),
            Some(regenerate(&target)),
        ));
    }
    out
}

// ---- engines ---------------------------------------------------------------------------------

/// The text report: one line per check, then a summary.
pub fn render_text(checks: &[Check]) -> String {
    let mut o = String::new();
    let width = checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
    for c in checks {
        let _ = write!(
            o,
            "{:<8} {:<width$}  {}",
            c.status.as_str(),
            c.name,
            c.message
        );
        if let Some(fix) = &c.fix {
            let _ = write!(o, "; fix: {fix}");
        }
        o.push('\n');
    }
    let count = |s: Status| checks.iter().filter(|c| c.status == s).count();
    let _ = writeln!(
        o,
        "{} errors, {} warnings, {} ok, {} skipped",
        count(Status::Error),
        count(Status::Warning),
        count(Status::Ok),
        count(Status::Skip)
    );
    o
}

/// The JSON report.
pub fn render_json(checks: &[Check]) -> String {
    let v = serde_json::json!({
        "checks": checks,
        "exitCode": exit_code(checks),
    });
    serde_json::to_string_pretty(&v).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Options over a temp dir as the host: no driver, no engine, no spec dir, empty `PATH`.
    fn bare_host(dir: &Path) -> Options {
        let config = Config {
            driver_root: dir.to_path_buf(),
            dev_root: dir.to_path_buf(),
            proc_root: dir.join("proc"),
            cdi_spec_dirs: vec![dir.join("etc-cdi"), dir.join("run-cdi")],
            cache_dir: dir.join("cache"),
            ..Config::default()
        };
        Options {
            config_path: dir.join("config.toml"),
            docker_config: dir.join("docker/daemon.json"),
            containerd_config: dir.join("containerd/config.toml"),
            crio_config: dir.join("crio/crio.conf"),
            dev_char_path: dir.join("dev/char"),
            path_var: Some(OsString::new()),
            self_exe: None,
            ..Options::system(config, dir.join("config.toml"))
        }
    }

    fn status_of<'a>(checks: &'a [Check], name: &str) -> &'a Check {
        checks
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("no check {name}: {checks:?}"))
    }

    /// The whole report on a host without a driver, no root needed: the driver check fails
    /// with its fix, the checks that need the driver are skipped rather than failed, and no
    /// engine is found.
    #[test]
    fn a_host_without_a_driver() {
        let dir = tempfile::tempdir().unwrap();
        let checks = run(&bare_host(dir.path()));
        let driver = status_of(&checks, "driver");
        assert_eq!(driver.status, Status::Error);
        assert!(driver.message.contains("not loaded"), "{driver:?}");
        assert!(driver
            .fix
            .as_deref()
            .is_some_and(|f| f.contains("modprobe nvidia")));
        for name in [
            "gpus",
            "device-nodes",
            "dev-char",
            "persistence",
            "libraries",
        ] {
            assert_eq!(status_of(&checks, name).status, Status::Skip, "{name}");
        }
        for engine in ["engine-docker", "engine-containerd", "engine-crio"] {
            assert_eq!(status_of(&checks, engine).status, Status::Skip, "{engine}");
        }
        let config = status_of(&checks, "config");
        assert_eq!(config.status, Status::Ok);
        assert!(config.message.contains("the defaults apply"), "{config:?}");
        assert_eq!(exit_code(&checks), 2);
    }

    /// A loaded driver's banner gives the version and its CUDA; a broken one fails naming the
    /// file's problem, not "not loaded".
    #[test]
    fn the_driver_banner() {
        let dir = tempfile::tempdir().unwrap();
        let version = dir.path().join("proc/driver/nvidia/version");
        std::fs::create_dir_all(version.parent().unwrap()).unwrap();
        std::fs::write(
            &version,
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  \
             (dvs-builder@U22-I3-AF03-09-1)  Thu Sep 25 01:12:42 UTC 2025\n",
        )
        .unwrap();
        let host = install::host_from(&bare_host(dir.path()).config);
        let (c, v) = driver_check(&host);
        assert_eq!(v.as_deref(), Some("580.95.05"));
        assert_eq!(c.status, Status::Ok);
        assert!(
            c.message.contains("580.95.05") && c.message.contains("CUDA 13.0"),
            "{c:?}"
        );
        std::fs::write(&version, "garbage\n").unwrap();
        let (c, v) = driver_check(&host);
        assert_eq!((c.status, v), (Status::Error, None));
        assert!(!c.message.contains("not loaded"), "{c:?}");
    }

    #[test]
    fn reports_render_every_check_and_a_summary() {
        let checks = [
            check("driver", Status::Ok, "NVIDIA driver 580.95.05 loaded", None),
            check(
                "dev-char",
                Status::Warning,
                "no links",
                Some("nvshim system create-dev-char-links".into()),
            ),
            check("engine-crio", Status::Skip, "not installed", None),
        ];
        let text = render_text(&checks);
        // Names padded to the widest, so the messages line up.
        assert!(
            text.lines()
                .any(|l| l
                    == "warning  dev-char     no links; fix: nvshim system create-dev-char-links"),
            "{text}"
        );
        assert!(
            text.ends_with("0 errors, 1 warnings, 1 ok, 1 skipped\n"),
            "{text}"
        );
        let json: serde_json::Value = serde_json::from_str(&render_json(&checks)).unwrap();
        assert_eq!(json["exitCode"], 1);
        assert_eq!(
            json["checks"][1]["fix"],
            "nvshim system create-dev-char-links"
        );
        assert!(json["checks"][0].get("fix").is_none());
    }

    #[test]
    fn exit_codes() {
        let c = |s| check("x", s, "", None);
        assert_eq!(exit_code(&[c(Status::Ok), c(Status::Skip)]), 0);
        assert_eq!(exit_code(&[c(Status::Ok), c(Status::Warning)]), 1);
        assert_eq!(exit_code(&[c(Status::Error), c(Status::Warning)]), 2);
    }
}
