//! nvshim's configuration file: TOML at `$NVSHIM_CONFIG`, else `/etc/nvshim/config.toml`.
//!
//! A missing file means defaults; a file that does not parse, or has a key nvshim does not know,
//! is an error that names the file (a typo in a security knob must not pass silently).

use std::path::{Path, PathBuf};

use serde::Deserialize;
use thiserror::Error;

/// Environment variable naming the config file.
pub const CONFIG_ENV: &str = "NVSHIM_CONFIG";
/// Where the config lives when `$NVSHIM_CONFIG` is not set.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/nvshim/config.toml";

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read nvshim config {path}: {source}; make it readable, or point NVSHIM_CONFIG at another file")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid nvshim config {path}: {message}; fix it (README.md \"Configuration\" lists the keys), or remove the file to run with the defaults")]
    Parse { path: PathBuf, message: String },
}

/// How requests are turned into edits (docs/nvidia-behaviour.md §1.3): `auto` uses CDI when
/// every request is a fully qualified CDI name, `legacy` always resolves against the host, `cdi`
/// always uses specs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    #[default]
    Auto,
    Legacy,
    Cdi,
}

impl Mode {
    /// The name the config file uses.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Auto => "auto",
            Mode::Legacy => "legacy",
            Mode::Cdi => "cdi",
        }
    }
}

/// `profile`: what nvshim adds to a GPU container besides its devices and driver files
/// (README.md "Sandboxed runtimes").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Profile {
    /// `sandbox` when the low-level runtime is gVisor's `runsc` or a Kata runtime, else
    /// `standard` (`runtime::profile_for`).
    #[default]
    Auto,
    /// The fix-ups hook, the daemons' sockets and the `/proc` params overmount.
    Standard,
    /// None of those: the libraries are also mounted at their SONAMEs where the image's own
    /// loader looks (`legacy::sandbox`).
    Sandbox,
}

/// Which kind of host serves GPU requests (NVIDIA's platform, go-nvlib `pkg/nvlib/info`):
/// `auto` detects it ([`crate::host::platform::detect`]), `nvml` is a host with NVIDIA's
/// kernel driver (`/proc/driver/nvidia`), `wsl` Windows' WSL2 (`/dev/dxg` and the driver
/// store under `/usr/lib/wsl`), `csv` a Jetson served from NVIDIA's CSV file lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Platform {
    #[default]
    Auto,
    Nvml,
    Wsl,
    Csv,
}

impl Platform {
    /// The name the config file uses.
    pub fn name(self) -> &'static str {
        match self {
            Platform::Auto => "auto",
            Platform::Nvml => "nvml",
            Platform::Wsl => "wsl",
            Platform::Csv => "csv",
        }
    }
}

/// NVIDIA's `modes.csv.mount-spec-path`: where a Jetson's CSV file lists are.
pub const DEFAULT_CSV_MOUNT_SPEC_PATH: &str =
    "/etc/nvidia-container-runtime/host-files-for-container.d";

/// `accept-envvar-unprivileged`: `true`, `false` or `"allocation-backed"`
/// (`request::env_policy` applies it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UnprivilegedEnv {
    /// `true`: honoured (Docker hosts, where `-e NVIDIA_VISIBLE_DEVICES` is the API).
    #[default]
    Accept,
    /// `"allocation-backed"`: honoured when what the kubelet put beside it (the device
    /// plugin's mounts or device nodes, CDI annotations) names the same GPUs.
    AllocationBacked,
    /// `false`: a GPU list is refused (the create fails); `all`, a CUDA image's own default,
    /// is ignored.
    Refuse,
}

impl UnprivilegedEnv {
    /// The value as the config file spells it.
    pub fn name(self) -> &'static str {
        match self {
            UnprivilegedEnv::Accept => "true",
            UnprivilegedEnv::AllocationBacked => "\"allocation-backed\"",
            UnprivilegedEnv::Refuse => "false",
        }
    }
}

impl<'de> Deserialize<'de> for UnprivilegedEnv {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Bool(bool),
            Name(String),
        }
        match Raw::deserialize(d)? {
            Raw::Bool(true) => Ok(UnprivilegedEnv::Accept),
            Raw::Bool(false) => Ok(UnprivilegedEnv::Refuse),
            Raw::Name(n) if n == "allocation-backed" => Ok(UnprivilegedEnv::AllocationBacked),
            Raw::Name(n) => Err(serde::de::Error::custom(format!(
                "accept-envvar-unprivileged is true, false or \"allocation-backed\", not {n:?}"
            ))),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum LogLevel {
    Error,
    Warn,
    #[default]
    Info,
    Debug,
    Trace,
}

impl LogLevel {
    pub fn as_tracing(self) -> tracing::Level {
        match self {
            LogLevel::Error => tracing::Level::ERROR,
            LogLevel::Warn => tracing::Level::WARN,
            LogLevel::Info => tracing::Level::INFO,
            LogLevel::Debug => tracing::Level::DEBUG,
            LogLevel::Trace => tracing::Level::TRACE,
        }
    }
}

/// The whole configuration, resolved once at start and passed down. Library code never reads
/// the process environment.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct Config {
    /// Low-level runtimes to try, in order: names looked up on PATH, or absolute paths.
    pub low_level_runtimes: Vec<String>,
    /// Where driver libraries, binaries and the host's `etc/ld.so.cache` are found.
    pub driver_root: PathBuf,
    /// Device nodes are `<dev-root>/dev/nvidia*`.
    pub dev_root: PathBuf,
    /// `devices`, `driver/nvidia/version`, `driver/nvidia/gpus/<bus>/information`.
    pub proc_root: PathBuf,
    /// Where nvshim logs (never stdout: it may be the container's console).
    pub log_file: Option<PathBuf>,
    pub log_level: LogLevel,
    /// Whether `NVIDIA_VISIBLE_DEVICES` from containers without `CAP_SYS_ADMIN` is honoured
    /// ([`UnprivilegedEnv`]).
    pub accept_envvar_unprivileged: UnprivilegedEnv,
    /// Honour `/var/run/nvidia-container-devices/<id>` volume-mount requests.
    pub accept_volume_mounts: bool,
    /// Honour `NVIDIA_VISIBLE_DEVICES` from unprivileged containers that carry NVIDIA's legacy
    /// prestart hook, as `docker run --gpus` adds it. Off by default: the hook's name proves
    /// nothing (CRI-O adds NVIDIA's `oci-nvidia-hook.json` to every container when it is left
    /// in hooks.d), so only the operator can say the hook means "dockerd's --gpus".
    pub accept_docker_gpus_hook: bool,
    /// The kubelet's device-manager checkpoint: with `accept-envvar-unprivileged =
    /// "allocation-backed"`, the device ids it records for a containerd container (by the
    /// `io.kubernetes.cri.sandbox-uid` and `io.kubernetes.cri.container-name` annotations)
    /// back its `NVIDIA_VISIBLE_DEVICES`: what makes NVIDIA's device plugin at its defaults
    /// work. Read only when root owns it and nobody else can write it; empty: not read.
    pub kubelet_device_checkpoint: PathBuf,
    /// Kinds of CDI devices a container may name in `NVIDIA_VISIBLE_DEVICES`; default: only
    /// `cdi-default-kind`. Other kinds (IMEX channels, DRA claims, network devices) come only
    /// from annotations the orchestrator sets.
    pub cdi_env_kinds: Option<Vec<String>>,
    /// The host MPS control daemon's pipe directory (its `CUDA_MPS_PIPE_DIRECTORY`). When it
    /// exists, compute containers of legacy requests get it mounted at the same path with the
    /// variable set, so their CUDA clients reach the daemon.
    pub mps_pipe_directory: PathBuf,
    /// The `nvshim-hook` binary written into hooks; default: next to the running executable,
    /// else `/usr/bin/nvshim-hook`.
    pub hook_path: Option<PathBuf>,
    pub mode: Mode,
    /// The kind of host ([`Platform`]); `auto`: detected.
    pub platform: Platform,
    /// The directory of a Jetson's CSV file lists (NVIDIA's `mount-spec-path`), on the host.
    pub csv_mount_spec_path: PathBuf,
    /// CDI spec directories, lowest priority first.
    pub cdi_spec_dirs: Vec<PathBuf>,
    /// Where `create` keeps its index of the CDI spec directories (`cdi::index`), so that a
    /// CDI request reads only the specs that define its devices, the GPUs' `/proc` facts
    /// (`host::gpu_cache`), the driver's MIG capability minors (`host::mig_table`) and NVML's
    /// answer for MIG ids (`host::nvml::cache`); empty: none of them (every CDI `create` reads
    /// every spec). Made 0700 on first use; a read-only one only costs the caches.
    pub cache_dir: PathBuf,
    /// Why `cache-dir` was turned off ([`crate::cache::untrusted_dir`]), for the one warning
    /// the binary logs once its log is open; not a setting.
    #[serde(skip)]
    pub cache_dir_refused: Option<String>,
    /// Annotation key prefixes read as CDI device requests.
    pub cdi_annotation_prefixes: Vec<String>,
    /// Kind used for unqualified device names in `cdi` mode.
    pub cdi_default_kind: String,
    /// Skip every container's `NVIDIA_REQUIRE_*` checks, as `NVIDIA_DISABLE_REQUIRE=true` does
    /// for one (NVIDIA's `disable-require`). Off by default: an image built for a newer driver
    /// is refused with the reason instead of failing later inside CUDA.
    pub disable_require: bool,
    /// [`Profile`]: `auto`, `standard` or `sandbox`.
    pub profile: Profile,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            low_level_runtimes: vec!["runc".into(), "crun".into()],
            driver_root: PathBuf::from("/"),
            dev_root: PathBuf::from("/"),
            proc_root: PathBuf::from("/proc"),
            log_file: None,
            log_level: LogLevel::Info,
            accept_envvar_unprivileged: UnprivilegedEnv::Accept,
            accept_volume_mounts: false,
            accept_docker_gpus_hook: false,
            kubelet_device_checkpoint: PathBuf::from(
                "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint",
            ),
            cdi_env_kinds: None,
            mps_pipe_directory: PathBuf::from("/tmp/nvidia-mps"),
            hook_path: None,
            mode: Mode::Auto,
            platform: Platform::Auto,
            csv_mount_spec_path: PathBuf::from(DEFAULT_CSV_MOUNT_SPEC_PATH),
            cdi_spec_dirs: vec![PathBuf::from("/etc/cdi"), PathBuf::from("/var/run/cdi")],
            cache_dir: PathBuf::from(nvshim_hook::cache::DEFAULT_DIR),
            cache_dir_refused: None,
            cdi_annotation_prefixes: vec!["cdi.k8s.io/".into()],
            cdi_default_kind: "nvidia.com/gpu".into(),
            disable_require: false,
            profile: Profile::Auto,
        }
    }
}

impl Config {
    /// The CDI kinds `NVIDIA_VISIBLE_DEVICES` may name (`cdi-env-kinds`, else
    /// `cdi-default-kind`).
    pub fn env_cdi_kinds(&self) -> Vec<&str> {
        match &self.cdi_env_kinds {
            Some(kinds) => kinds.iter().map(String::as_str).collect(),
            None => vec![self.cdi_default_kind.as_str()],
        }
    }

    /// The config path: `$NVSHIM_CONFIG` (passed in by the binary) or the default.
    pub fn path_from_env(env_value: Option<std::ffi::OsString>) -> PathBuf {
        env_value
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG_PATH))
    }

    /// Loads `path`; a missing file means defaults. A `cache-dir` that others could write is
    /// turned off (empty), the reason kept in `cache_dir_refused`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let mut config = match crate::hostfile::read_to_string(path, crate::hostfile::CONFIG_LIMIT)
        {
            Ok(text) => Config::parse(path, &text)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Config::default(),
            Err(source) => {
                return Err(ConfigError::Read {
                    path: path.to_path_buf(),
                    source,
                })
            }
        };
        if !config.cache_dir.as_os_str().is_empty() {
            if let Some(why) = crate::cache::untrusted_dir(&config.cache_dir) {
                config.cache_dir_refused = Some(format!("caches off: {why}"));
                config.cache_dir = PathBuf::new();
            }
        }
        Ok(config)
    }

    pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|e| {
            // The parser's message names the key; the line says where it is.
            let line = e
                .span()
                .and_then(|s| text.as_bytes().get(..s.start))
                .map(|before| before.iter().filter(|b| **b == b'\n').count() + 1);
            ConfigError::Parse {
                path: path.to_path_buf(),
                message: match line {
                    Some(n) => format!("line {n}: {}", e.message()),
                    None => e.message().to_string(),
                },
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_file_is_defaults() {
        let cfg = Config::load(Path::new("/nonexistent/nvshim.toml")).unwrap();
        assert_eq!(cfg, Config::default());
    }

    #[test]
    fn keys_parse() {
        let cfg = Config::parse(
            Path::new("c.toml"),
            r#"
            low-level-runtimes = ["/usr/bin/crun"]
            driver-root = "/run/nvidia/driver"
            dev-root = "/"
            proc-root = "/host/proc"
            log-file = "/var/log/nvshim.log"
            log-level = "debug"
            accept-envvar-unprivileged = false
            accept-volume-mounts = true
            mps-pipe-directory = "/run/mps/pipe"
            mode = "cdi"
            cdi-spec-dirs = ["/etc/cdi"]
            profile = "sandbox"
            "#,
        )
        .unwrap();
        assert_eq!(cfg.low_level_runtimes, vec!["/usr/bin/crun"]);
        assert_eq!(cfg.driver_root, PathBuf::from("/run/nvidia/driver"));
        assert_eq!(cfg.proc_root, PathBuf::from("/host/proc"));
        assert_eq!(cfg.log_level, LogLevel::Debug);
        assert_eq!(cfg.accept_envvar_unprivileged, UnprivilegedEnv::Refuse);
        let parse = |v: &str| {
            Config::parse(
                Path::new("c.toml"),
                &format!("accept-envvar-unprivileged = {v}"),
            )
            .map(|c| c.accept_envvar_unprivileged)
        };
        assert_eq!(parse("true").unwrap(), UnprivilegedEnv::Accept);
        assert_eq!(
            parse("\"allocation-backed\"").unwrap(),
            UnprivilegedEnv::AllocationBacked
        );
        let err = parse("\"maybe\"").unwrap_err().to_string();
        assert!(
            err.contains("allocation-backed") && err.contains("c.toml"),
            "{err}"
        );
        assert!(cfg.accept_volume_mounts);
        assert_eq!(cfg.mps_pipe_directory, PathBuf::from("/run/mps/pipe"));
        assert_eq!(cfg.mode, Mode::Cdi);
        assert_eq!(cfg.profile, Profile::Sandbox);
        assert_eq!(Config::default().profile, Profile::Auto);
        assert_eq!(
            cfg.cdi_annotation_prefixes,
            Config::default().cdi_annotation_prefixes
        );
    }

    #[test]
    fn unknown_key_names_file_and_key() {
        let err = Config::parse(Path::new("/etc/nvshim/config.toml"), "driver-rot = \"/\"")
            .unwrap_err()
            .to_string();
        assert!(err.contains("/etc/nvshim/config.toml"), "{err}");
        assert!(err.contains("driver-rot"), "{err}");
    }

    #[test]
    fn env_path_precedence() {
        assert_eq!(
            Config::path_from_env(Some("/tmp/x.toml".into())),
            PathBuf::from("/tmp/x.toml")
        );
        assert_eq!(
            Config::path_from_env(None),
            PathBuf::from(DEFAULT_CONFIG_PATH)
        );
        assert_eq!(
            Config::path_from_env(Some("".into())),
            PathBuf::from(DEFAULT_CONFIG_PATH)
        );
    }
}
