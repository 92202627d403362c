//! Command line: a small hand parser (no clap: a handful of subcommands and flags, and a binary
//! that should start fast). The name the binary was started under picks the dialect:
//! - `nvshim-hook SUBCOMMAND ...`: ours (`create-symlinks`, `update-ldcache`); an unknown
//!   subcommand or flag is a usage error (2).
//! - `nvidia-cdi-hook HOOK ...`: NVIDIA's (`cmd/nvidia-cdi-hook`), so CDI specs generated for
//!   NVIDIA's toolkit keep working, every hook with NVIDIA's meaning and nvshim's rules:
//!   `update-ldcache --folder X [--ldconfig-path P]`, `create-symlinks --link T::L`,
//!   `enable-cuda-compat --host-driver-version V [--host-cuda-version X.Y]
//!   [--cuda-compat-container-root DIR]`, `disable-device-node-modification` (hidden
//!   `--host-params FILE`), `update-application-profile`, `chmod --mode M --path P`, and the
//!   hidden `noop`, and the createRuntime hook `apply-cuda-memory-limits --driver-root R
//!   --gpu-id ID ...` ([`crate::apply_cuda_memory_limits`]). An unknown hook, or no hook at all, warns and exits 0, as NVIDIA's does for
//!   forward compatibility.
//! - `nvidia-ctk hook HOOK ...`: the same hooks as the older command line that specs generated
//!   by `nvidia-ctk cdi generate` before `nvidia-cdi-hook` existed name (`/usr/bin/nvidia-ctk`
//!   with args `["nvidia-ctk", "hook", ...]`). Any other
//!   `nvidia-ctk` command fails: nvshim provides only that one.
//! - `nvidia-container-runtime-hook` / `nvidia-container-toolkit`: Docker's legacy `--gpus`
//!   prestart hook, which nvshim replaces; it fails with directions.
//!
//! Flags are accepted as `--flag VALUE`, `--flag=VALUE`, `-flag VALUE` and `-flag=VALUE`
//! (urfave/cli's forms). The global `--debug`/`-d` and `--quiet` are accepted and ignored.
//!
//! The environment is never read: the hook's behaviour depends only on argv, the state on stdin
//! and the files below the container root (and, for `disable-device-node-modification`, the
//! host's driver parameters).
//!
//! One file (610 lines of code, 410 of tests): the four dialects parse into one [`Command`] and
//! [`run`] dispatches on it, so a hook's flags, its usage text and its dispatch are read and
//! changed together.

use std::ffi::{CStr, OsStr, OsString};
use std::io::{Read, Write};
use std::os::raw::{c_char, c_int};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::apply_cuda_memory_limits as memory_limits;
use crate::create_symlinks::{self, Link};
use crate::root::Root;
use crate::state::State;
use crate::{chmod, disable_device_node_modification as ddnm, enable_cuda_compat};
use crate::{update_application_profile, update_ldcache};

/// Exit status for a usage error.
pub const EXIT_USAGE: i32 = 2;
/// Exit status for a failure.
pub const EXIT_FAILURE: i32 = 1;

const USAGE: &str = "\
usage: nvshim-hook SUBCOMMAND [FLAGS] < OCI-STATE

OCI createContainer hooks for nvshim. The OCI state JSON is read from stdin.

subcommands:
  create-symlinks --link TARGET::LINK ...   make LINK (in the container) a symlink to TARGET
  update-ldcache --folder DIR ...           make the libraries in DIR resolvable by the
                                            container's dynamic linker
  enable-cuda-compat --host-driver-version V
                                            use the image's CUDA forward-compatibility
                                            libraries when they are newer than the driver
  disable-device-node-modification          show the container ModifyDeviceFiles: 0
  update-application-profile                limit EGL and Vulkan to the container's GPUs
  apply-cuda-memory-limits --driver-root R --gpu-id ID ... [--log-file F]
                                            (createRuntime) NVIDIA_GPU_MEMORY_REQUEST/LIMIT
                                            of config.json as NVML limits of the cgroup
  fixups [--link T::L ...] [--host-driver-version V] [--folder DIR ...]
         [--disable-device-node-modification] [--update-application-profile]
         [--bundle DIR] [--cache-dir DIR]   all of the above in one process, in that order;
                                            with --bundle, the container is found from
                                            DIR/config.json and the state is not read
flags:
  --container-spec FILE   read the OCI state from FILE instead of stdin
  --ldconfig-path PATH    host ldconfig, used only where the cache cannot be written natively
  --cache-dir DIR         (update-ldcache, fixups) ignored: bundles of older versions name it
  --help, --version

The last three are optional: when one cannot apply it warns and exits 0.
Started as nvidia-cdi-hook (or as `nvidia-ctk hook`), it also runs NVIDIA's chmod hook.
";

/// Docker before 29.2 adds this prestart hook for `--gpus`; nvshim-runtime removes it and
/// serves the request, so reaching it means the container runs without nvshim-runtime.
const LEGACY_HOOK: &str = "\
nvshim: Docker's --gpus prestart hook (nvidia-container-runtime-hook) is served only by \
nvshim-runtime, and this container runs without it (plain runc), so it gets no GPU. Any one \
of these fixes it:
  1. make nvshim-runtime Docker's default runtime, so --gpus works as it is: \
`sudo nvshim runtime configure --runtime docker && sudo systemctl restart docker`
  2. name the runtime per container (registered by the same command): \
`docker run --runtime=nvidia --gpus ...`
  3. on Docker 29.2 and later (--gpus through CDI), a current CDI spec: \
`sudo nvshim cdi generate --output /var/run/cdi/nvidia.yaml`";

const NVIDIA_CTK_ONLY_HOOK: &str = "nvshim provides only the `nvidia-ctk hook HOOK ...` command \
line (the hooks of CDI specs generated by older nvidia-ctk); use the `nvshim` tool for the rest";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dialect {
    Nvshim,
    Nvidia,
}

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Help,
    Version,
    /// Warn and succeed (NVIDIA's unknown hooks).
    Skip(String),
    /// NVIDIA's hidden `noop` hook.
    Noop,
    LegacyHook,
    /// An `nvidia-ctk` command other than `hook`.
    NotProvided(String),
    CreateSymlinks {
        links: Vec<Link>,
        spec: Option<String>,
    },
    UpdateLdcache {
        folders: Vec<String>,
        ldconfig_path: Option<PathBuf>,
        spec: Option<String>,
    },
    EnableCudaCompat {
        options: enable_cuda_compat::Options,
        spec: Option<String>,
    },
    DisableDeviceNodeModification {
        host_params: PathBuf,
        spec: Option<String>,
    },
    UpdateApplicationProfile {
        spec: Option<String>,
    },
    Chmod {
        mode: u32,
        paths: Vec<String>,
        spec: Option<String>,
    },
    /// NVIDIA's createRuntime hook: the container's GPU memory limits through NVML.
    ApplyCudaMemoryLimits {
        options: memory_limits::Options,
        spec: Option<String>,
    },
    /// All of nvshim's container fix-ups in one process (one exec, one open of the root), in
    /// NVIDIA's hook order.
    Fixups(Box<Fixups>),
}

/// What `fixups` does, in this order: the links, CUDA forward compatibility, the ld.so.cache,
/// the device-node parameters, the application profile. The links and the cache are required
/// (the libraries would not resolve without them): their failure fails the hook. The rest are
/// optional, as the separate hooks are: a failure is a warning.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Fixups {
    pub links: Vec<Link>,
    pub compat: enable_cuda_compat::Options,
    pub folders: Vec<String>,
    pub ldconfig_path: Option<PathBuf>,
    /// `disable-device-node-modification` with this host params file.
    pub host_params: Option<PathBuf>,
    pub application_profile: bool,
    pub spec: Option<String>,
    /// `--bundle DIR`: the bundle nvshim-runtime edited. The root is then found from its
    /// config.json and the OCI state on stdin is not read: runc runs a createContainer hook from
    /// `runc init`, whose Go runtime writes the state a few milliseconds after the hook starts
    /// (1 to 7 ms measured with runc 1.1.5 and 1.3.6, docs/benchmarks.md figure 9), and a hook that
    /// waits for it waits that long. A runtime tolerates a hook that leaves its stdin
    /// unread, as it must for any hook that needs no state.
    pub bundle: Option<PathBuf>,
}

/// A usage error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage(pub String);

fn program_name(arg0: &OsString) -> String {
    Path::new(arg0)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Splits `-flag`, `--flag`, `--flag=value` into (name, inline value).
fn flag(arg: &str) -> Option<(&str, Option<&str>)> {
    let body = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-'))?;
    if body.is_empty() {
        return None;
    }
    Some(match body.split_once('=') {
        Some((n, v)) => (n, Some(v)),
        None => (body, None),
    })
}

/// Parses argv (including argv[0]).
pub fn parse(args: &[OsString]) -> Result<Command, Usage> {
    let name = args.first().map(program_name).unwrap_or_default();
    let dialect = match name.as_str() {
        "nvidia-container-runtime-hook" | "nvidia-container-toolkit" => {
            return Ok(Command::LegacyHook)
        }
        "nvidia-cdi-hook" => Dialect::Nvidia,
        "nvidia-ctk" => return parse_nvidia_ctk(args),
        _ => Dialect::Nvshim,
    };
    let mut strings: Vec<String> = Vec::new();
    for a in args.iter().skip(1) {
        match a.clone().into_string() {
            Ok(s) => strings.push(s),
            Err(a) => return Err(Usage(format!("argument {a:?} is not UTF-8"))),
        }
    }
    let mut it = strings.into_iter().peekable();
    let mut global_spec: Option<String> = None;
    // Global flags, before the subcommand.
    let sub = loop {
        let Some(a) = it.next() else {
            return match dialect {
                Dialect::Nvidia => Ok(Command::Skip("no hook name given".into())),
                Dialect::Nvshim => Err(Usage("no subcommand given".into())),
            };
        };
        match flag(&a) {
            Some(("help" | "h", None)) => return Ok(Command::Help),
            Some(("version" | "V" | "v", None)) => return Ok(Command::Version),
            Some(("debug" | "d" | "quiet", _)) => continue,
            Some(("container-spec", v)) => {
                global_spec = Some(value(v, &mut it, "container-spec")?);
            }
            Some(_) => return Err(Usage(format!("unknown flag {a}"))),
            None => break a,
        }
    };
    match (dialect, sub.as_str()) {
        (
            _,
            "create-symlinks"
            | "update-ldcache"
            | "enable-cuda-compat"
            | "disable-device-node-modification"
            | "update-application-profile"
            | "apply-cuda-memory-limits",
        ) => {}
        (Dialect::Nvshim, "fixups") => {}
        (Dialect::Nvidia, "chmod" | "noop") => {}
        (_, "help") => return Ok(Command::Help),
        (Dialect::Nvidia, other) => {
            return Ok(Command::Skip(format!("unknown hook {other}; skipped")))
        }
        (Dialect::Nvshim, other) => return Err(Usage(format!("unknown subcommand {other}"))),
    }
    let mut links = Vec::new();
    let mut folders = Vec::new();
    let mut ldconfig_path = None;
    let mut compat = enable_cuda_compat::Options::default();
    let mut host_params = PathBuf::from(ddnm::HOST_PARAMS);
    let mut mode: Option<String> = None;
    let mut paths = Vec::new();
    let mut fixups = Fixups::default();
    let mut memory = memory_limits::Options::default();
    let mut spec = global_spec;
    while let Some(a) = it.next() {
        let Some((name, inline)) = flag(&a) else {
            return Err(Usage(format!("{sub}: unexpected argument {a}")));
        };
        match (sub.as_str(), name) {
            (_, "help" | "h") => return Ok(Command::Help),
            (_, "container-spec") => spec = Some(value(inline, &mut it, name)?),
            ("create-symlinks", "link") => {
                let v = value(inline, &mut it, name)?;
                links.push(Link::parse(&v).map_err(|e| Usage(e.to_string()))?);
            }
            ("update-ldcache", "folder") => folders.push(value(inline, &mut it, name)?),
            ("update-ldcache", "ldconfig-path") => {
                ldconfig_path = Some(PathBuf::from(value(inline, &mut it, name)?))
            }
            // What earlier versions kept of each library between containers (no longer kept).
            ("update-ldcache" | "fixups", "cache-dir") => {
                value(inline, &mut it, name)?;
            }
            ("enable-cuda-compat", "host-driver-version") => {
                compat.host_driver_version = Some(value(inline, &mut it, name)?)
            }
            ("enable-cuda-compat", "host-cuda-version") => {
                compat.host_cuda_version = Some(value(inline, &mut it, name)?)
            }
            ("enable-cuda-compat", "cuda-compat-container-root") => {
                compat.compat_dir = Some(value(inline, &mut it, name)?)
            }
            ("disable-device-node-modification", "host-params") => {
                host_params = PathBuf::from(value(inline, &mut it, name)?)
            }
            ("fixups", "link") => {
                let v = value(inline, &mut it, name)?;
                fixups
                    .links
                    .push(Link::parse(&v).map_err(|e| Usage(e.to_string()))?);
            }
            ("fixups", "host-driver-version") => {
                fixups.compat.host_driver_version = Some(value(inline, &mut it, name)?)
            }
            ("fixups", "folder") => fixups.folders.push(value(inline, &mut it, name)?),
            ("fixups", "ldconfig-path") => {
                fixups.ldconfig_path = Some(PathBuf::from(value(inline, &mut it, name)?))
            }
            ("fixups", "disable-device-node-modification") if inline.is_none() => {
                fixups
                    .host_params
                    .get_or_insert_with(|| PathBuf::from(ddnm::HOST_PARAMS));
            }
            ("fixups", "host-params") => {
                fixups.host_params = Some(PathBuf::from(value(inline, &mut it, name)?))
            }
            ("fixups", "update-application-profile") if inline.is_none() => {
                fixups.application_profile = true
            }
            ("fixups", "bundle") => {
                fixups.bundle = Some(PathBuf::from(value(inline, &mut it, name)?))
            }
            ("apply-cuda-memory-limits", "driver-root") => {
                memory.driver_root = value(inline, &mut it, name)?
            }
            ("apply-cuda-memory-limits", "gpu-id") => {
                memory.gpu_ids.push(value(inline, &mut it, name)?)
            }
            ("apply-cuda-memory-limits", "log-file") => {
                memory.log_file = Some(PathBuf::from(value(inline, &mut it, name)?))
            }
            ("chmod", "mode") => mode = Some(value(inline, &mut it, name)?),
            ("chmod", "path") => paths.push(value(inline, &mut it, name)?),
            _ => return Err(Usage(format!("{sub}: unknown flag {a}"))),
        }
    }
    Ok(match sub.as_str() {
        "create-symlinks" => Command::CreateSymlinks { links, spec },
        "apply-cuda-memory-limits" => Command::ApplyCudaMemoryLimits {
            options: memory,
            spec,
        },
        "update-ldcache" => Command::UpdateLdcache {
            folders,
            ldconfig_path,
            spec,
        },
        "enable-cuda-compat" => Command::EnableCudaCompat {
            options: compat,
            spec,
        },
        "disable-device-node-modification" => {
            Command::DisableDeviceNodeModification { host_params, spec }
        }
        "update-application-profile" => Command::UpdateApplicationProfile { spec },
        "fixups" => Command::Fixups(Box::new(Fixups { spec, ..fixups })),
        "chmod" => {
            // NVIDIA: "a non-empty mode must be specified".
            let mode = mode
                .filter(|m| !m.is_empty())
                .ok_or_else(|| Usage("chmod: a non-empty --mode must be specified".into()))?;
            let mode = chmod::parse_mode(&mode).map_err(|e| Usage(format!("chmod: {e}")))?;
            Command::Chmod { mode, paths, spec }
        }
        _ => Command::Noop,
    })
}

/// `nvidia-ctk [--debug|--quiet] hook HOOK ...` is `nvidia-cdi-hook HOOK ...`; any other
/// `nvidia-ctk` command is not provided.
fn parse_nvidia_ctk(args: &[OsString]) -> Result<Command, Usage> {
    let mut rest = args.iter().skip(1);
    let mut skipped = 1;
    let command = loop {
        let Some(a) = rest.next() else {
            break None;
        };
        skipped += 1;
        match a.to_str().and_then(flag) {
            Some(("debug" | "d" | "quiet", _)) => continue,
            _ => break Some(a.to_string_lossy().into_owned()),
        }
    };
    match command.as_deref() {
        Some("hook") => {
            let mut argv = vec![OsString::from("nvidia-cdi-hook")];
            argv.extend(args.iter().skip(skipped).cloned());
            parse(&argv)
        }
        Some(other) => Ok(Command::NotProvided(format!(
            "nvidia-ctk {other}: {NVIDIA_CTK_ONLY_HOOK}"
        ))),
        None => Ok(Command::NotProvided(format!(
            "nvidia-ctk: no command given; {NVIDIA_CTK_ONLY_HOOK}"
        ))),
    }
}

fn value(
    inline: Option<&str>,
    it: &mut std::iter::Peekable<std::vec::IntoIter<String>>,
    name: &str,
) -> Result<String, Usage> {
    match inline {
        Some(v) => Ok(v.to_string()),
        None => it
            .next()
            .ok_or_else(|| Usage(format!("--{name} needs a value"))),
    }
}

/// Reads the state from `spec`, or stdin for `None`, `""` or `-`.
fn read_state(spec: Option<&str>, stdin: impl Read) -> Result<State, String> {
    match spec.filter(|s| !s.is_empty() && *s != "-") {
        Some(path) => {
            // `read` bounds it; opened as every host file is ([`crate::hostfile`]).
            let (file, _) = crate::hostfile::open(Path::new(path), u64::MAX)
                .map_err(|e| format!("{path}: {e}"))?;
            State::read(file, path)
        }
        None => State::read(stdin, "stdin"),
    }
    .map_err(|e| e.to_string())
}

/// Reads the state (see [`read_state`]) and opens the root.
fn open_root(spec: Option<&str>, stdin: impl Read) -> Result<Root, String> {
    let state = read_state(spec, stdin)?;
    let c = state.container_root().map_err(|e| e.to_string())?;
    c.open().map_err(|e| e.to_string())
}

/// The container's root, opened, and what config.json mounts in it (update-ldcache reads
/// only the libraries mounted into a folder whose image cache it keeps).
fn open_container(
    spec: Option<&str>,
    stdin: impl Read,
) -> Result<(Root, Option<Vec<String>>), String> {
    let state = read_state(spec, stdin)?;
    opened(&state)
}

fn opened(state: &State) -> Result<(Root, Option<Vec<String>>), String> {
    let c = state.container().map_err(|e| e.to_string())?;
    Ok((c.open().map_err(|e| e.to_string())?, c.mounts))
}

/// The container's root from the bundle's config.json, as [`State::container`] finds it
/// from a state naming that bundle (`fixups --bundle`).
fn open_bundle(bundle: &Path) -> Result<(Root, Option<Vec<String>>), String> {
    let dir = bundle
        .to_str()
        .ok_or_else(|| format!("--bundle {}: not UTF-8", bundle.display()))?;
    opened(&State {
        bundle: dir.to_string(),
        ..State::default()
    })
}

/// Runs the hook: parses `args`, reads the state from `stdin`, reports on `err`. Returns the
/// exit status.
pub fn run(args: &[OsString], stdin: impl Read, err: &mut dyn Write) -> i32 {
    let prog = args
        .first()
        .map(program_name)
        .unwrap_or_else(|| "nvshim-hook".into());
    let command = match parse(args) {
        Ok(c) => c,
        Err(Usage(message)) => {
            let _ = writeln!(err, "{prog}: {message}\n\n{USAGE}");
            return EXIT_USAGE;
        }
    };
    let result = match command {
        Command::Help => {
            let _ = write!(err, "{USAGE}");
            return 0;
        }
        Command::Version => {
            let _ = writeln!(err, "nvshim-hook {}", env!("CARGO_PKG_VERSION"));
            return 0;
        }
        Command::LegacyHook => {
            let _ = writeln!(err, "{LEGACY_HOOK}");
            return EXIT_FAILURE;
        }
        Command::Skip(why) => {
            let _ = writeln!(err, "{prog}: warning: {why}");
            return 0;
        }
        Command::Noop => return 0,
        Command::NotProvided(message) => {
            let _ = writeln!(err, "{message}");
            return EXIT_FAILURE;
        }
        Command::CreateSymlinks { links, spec } => {
            if links.is_empty() {
                return 0;
            }
            open_root(spec.as_deref(), stdin).and_then(|root| {
                create_symlinks::run(&root, &links)
                    .map(|_| Vec::new())
                    .map_err(|e| format!("create-symlinks: {e}"))
            })
        }
        Command::UpdateLdcache {
            folders,
            ldconfig_path,
            spec,
        } => {
            if folders.is_empty() {
                return 0;
            }
            open_container(spec.as_deref(), stdin).and_then(|(root, mounts)| {
                let mut opts = update_ldcache::Options::new(folders);
                opts.ldconfig_path = ldconfig_path;
                opts.mounted = mounts;
                update_ldcache::run(&root, &opts)
                    .map(|r| r.warnings)
                    .map_err(|e| format!("update-ldcache: {e}"))
            })
        }
        Command::EnableCudaCompat { options, spec } => {
            if options.is_noop() {
                return 0;
            }
            optional(open_root(spec.as_deref(), stdin).and_then(|root| {
                enable_cuda_compat::run(&root, &options)
                    .map(|r| r.warnings)
                    .map_err(|e| format!("enable-cuda-compat: {e}"))
            }))
        }
        Command::DisableDeviceNodeModification { host_params, spec } => {
            optional(match ddnm::wanted(&host_params) {
                Ok(None) => return 0,
                Ok(Some(content)) => open_root(spec.as_deref(), stdin).and_then(|root| {
                    ddnm::apply(&root, &content)
                        .map(|r| r.skipped.into_iter().collect())
                        .map_err(|e| format!("disable-device-node-modification: {e}"))
                }),
                Err(e) => Err(format!("disable-device-node-modification: {e}")),
            })
        }
        Command::UpdateApplicationProfile { spec } => {
            optional(open_root(spec.as_deref(), stdin).and_then(|root| {
                update_application_profile::run(&root)
                    .map(|r| r.warnings)
                    .map_err(|e| format!("update-application-profile: {e}"))
            }))
        }
        Command::Fixups(f) => match &f.bundle {
            Some(bundle) => open_bundle(bundle),
            None => open_container(f.spec.as_deref(), stdin),
        }
        .and_then(|(root, mounts)| run_fixups(&root, &f, mounts)),
        Command::ApplyCudaMemoryLimits { options, spec } => read_state(spec.as_deref(), stdin)
            .and_then(|state| {
                memory_limits::run(&state, &options, &memory_limits::HostPaths::default())
                    .map_err(|e| format!("apply-cuda-memory-limits: {e}"))
            }),
        Command::Chmod { mode, paths, spec } => {
            if paths.is_empty() {
                return 0;
            }
            open_root(spec.as_deref(), stdin).and_then(|root| {
                chmod::run(&root, mode, &paths)
                    .map(|_| Vec::new())
                    .map_err(|e| format!("chmod: {e}"))
            })
        }
    };
    match result {
        Ok(warnings) => {
            for w in warnings {
                let _ = writeln!(err, "{prog}: warning: {w}");
            }
            0
        }
        Err(message) => {
            let _ = writeln!(err, "{prog}: {message}");
            EXIT_FAILURE
        }
    }
}

/// Runs `fixups` on the opened root; the warnings of the optional steps, or the first error of
/// a required one.
fn run_fixups(root: &Root, f: &Fixups, mounts: Option<Vec<String>>) -> Result<Vec<String>, String> {
    let mut warnings = Vec::new();
    if !f.links.is_empty() {
        create_symlinks::run(root, &f.links).map_err(|e| format!("create-symlinks: {e}"))?;
    }
    if !f.compat.is_noop() {
        warnings.extend(optional(
            enable_cuda_compat::run(root, &f.compat)
                .map(|r| r.warnings)
                .map_err(|e| format!("enable-cuda-compat: {e}")),
        )?);
    }
    if !f.folders.is_empty() {
        let mut opts = update_ldcache::Options::new(f.folders.clone());
        opts.ldconfig_path = f.ldconfig_path.clone();
        opts.mounted = mounts;
        let report =
            update_ldcache::run(root, &opts).map_err(|e| format!("update-ldcache: {e}"))?;
        warnings.extend(report.warnings);
    }
    if let Some(params) = &f.host_params {
        let step = match ddnm::wanted(params) {
            Ok(None) => Ok(Vec::new()),
            Ok(Some(content)) => ddnm::apply(root, &content)
                .map(|r| r.skipped.into_iter().collect())
                .map_err(|e| format!("disable-device-node-modification: {e}")),
            Err(e) => Err(format!("disable-device-node-modification: {e}")),
        };
        warnings.extend(optional(step)?);
    }
    if f.application_profile {
        warnings.extend(optional(
            update_application_profile::run(root)
                .map(|r| r.warnings)
                .map_err(|e| format!("update-application-profile: {e}")),
        )?);
    }
    Ok(warnings)
}

/// The result of a hook the container does not need to start (CUDA forward compatibility, the
/// device-node parameters, the application profile): its failure is one warning, and the
/// container starts, e.g. with a read-only root or `/etc/nvidia`, without the driver's `/proc`
/// in the container, or in a user namespace where a mount is refused.
fn optional(result: Result<Vec<String>, String>) -> Result<Vec<String>, String> {
    result.or_else(|message| {
        Ok(vec![format!(
            "{message} (optional: the container starts without it)"
        )])
    })
}

/// Opens `/dev/null` on whichever of fds 0, 1 and 2 is closed (what Rust's runtime does before
/// `main`, for a binary that skips it).
pub fn ensure_std_fds() {
    for fd in 0..3 {
        // SAFETY: F_GETFD only queries the descriptor.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
            // SAFETY: a constant C string; the lowest free fd is the one that was closed.
            unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) };
        }
    }
}

/// The arguments C `main` was given, as `std::env::args_os` lists them. A `no_main` binary
/// cannot rely on std for them: std records argv before `main` only on glibc (its
/// `.init_array` functions receive argc and argv); musl calls them without, and a musl build
/// saw no arguments at all.
///
/// # Safety
/// `argv` must be `main`'s own: `argc` pointers to NUL-terminated strings that live as long
/// as the process.
pub unsafe fn args_of_main(argc: c_int, argv: *const *const c_char) -> Vec<OsString> {
    let count = usize::try_from(argc).unwrap_or(0);
    if argv.is_null() {
        return Vec::new();
    }
    (0..count)
        .map_while(|i| {
            // SAFETY: i < argc, so argv[i] is within the array the caller vouches for.
            let arg = unsafe { *argv.add(i) };
            // SAFETY: a non-null argv entry is a NUL-terminated string (caller's contract).
            (!arg.is_null()).then(|| unsafe { CStr::from_ptr(arg) })
        })
        .map(|arg| OsStr::from_bytes(arg.to_bytes()).to_os_string())
        .collect()
}

/// `main` for the binary, with the arguments [`args_of_main`] read.
pub fn main(args: &[OsString]) -> i32 {
    run(args, std::io::stdin().lock(), &mut std::io::stderr().lock())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Command, Usage> {
        let v: Vec<OsString> = args.iter().map(OsString::from).collect();
        parse(&v)
    }

    /// What C `main` is given comes back as std lists it, bytes that are not UTF-8 included;
    /// a null entry ends the list early, a null array or a negative count gives nothing.
    #[test]
    fn arguments_are_read_from_mains_own() {
        let owned = [c"nvshim-runtime", c"create", c"--bundle", c"/run/b\xff"];
        let mut argv: Vec<*const c_char> = owned.iter().map(|a| a.as_ptr()).collect();
        // SAFETY: four live C strings.
        let args = unsafe { args_of_main(4, argv.as_ptr()) };
        let want: Vec<OsString> = owned
            .iter()
            .map(|a| OsStr::from_bytes(a.to_bytes()).to_os_string())
            .collect();
        assert_eq!(args, want);
        assert_eq!(args[3].as_bytes(), b"/run/b\xff");
        argv[2] = std::ptr::null();
        // SAFETY: as above, with a null in place of the third.
        assert_eq!(unsafe { args_of_main(4, argv.as_ptr()) }, want[..2]);
        // SAFETY: nothing is read.
        assert!(unsafe { args_of_main(-1, argv.as_ptr()) }.is_empty());
        // SAFETY: a null array is checked before any read.
        assert!(unsafe { args_of_main(2, std::ptr::null()) }.is_empty());
    }

    /// A stdin that must not be read.
    struct Untouched;
    impl Read for Untouched {
        fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
            panic!("the hook read its stdin");
        }
    }

    #[test]
    fn fixups_with_a_bundle_finds_the_root_without_the_state() {
        let dir = tempfile::tempdir().unwrap();
        let bundle = dir.path();
        std::fs::create_dir_all(bundle.join("rootfs/usr/lib")).unwrap();
        std::fs::write(bundle.join("config.json"), r#"{"root":{"path":"rootfs"}}"#).unwrap();
        let args: Vec<OsString> = [
            "nvshim-hook",
            "fixups",
            "--link",
            "libcuda.so.1::/usr/lib/libcuda.so",
            "--bundle",
            bundle.to_str().unwrap(),
        ]
        .iter()
        .map(OsString::from)
        .collect();
        let mut err = Vec::new();
        assert_eq!(
            run(&args, Untouched, &mut err),
            0,
            "{}",
            String::from_utf8_lossy(&err)
        );
        assert_eq!(
            std::fs::read_link(bundle.join("rootfs/usr/lib/libcuda.so")).unwrap(),
            Path::new("libcuda.so.1")
        );
        // A bundle whose config.json names no root fails as a state naming it would.
        std::fs::write(bundle.join("config.json"), "{}").unwrap();
        let mut err = Vec::new();
        assert_eq!(run(&args, Untouched, &mut err), EXIT_FAILURE);
        assert!(String::from_utf8_lossy(&err).contains("no root.path"));
    }

    /// Defence in depth (docs/reliability.md): a `root.path` that leads out of the bundle (`..`, /proc's
    /// links, a `rootfs` symlink leaving it) or to the host's `/` is refused before anything is
    /// written; the layouts engines write (a `rootfs` below the bundle, an absolute path
    /// anywhere, as Docker's in tests/fixtures/oci) still work.
    #[test]
    fn fixups_refuse_a_root_path_that_leaves_the_bundle() {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir().unwrap();
        let top = dir.path();
        let (bundle, outside) = (top.join("bundle"), top.join("outside"));
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::create_dir_all(top.join("real")).unwrap();
        symlink(top.join("real"), top.join("via-link")).unwrap();
        // What a wrong resolution would write: in `outside`, or below the host's `/`.
        let probe = format!("nvshim-escape-probe-{}", std::process::id());
        let link = format!("x::/{probe}/l");
        let fixups = |bundle: &Path, root_path: &str, rootfs: Option<&str>| {
            let _ = std::fs::remove_dir_all(bundle);
            std::fs::create_dir_all(bundle).unwrap();
            match rootfs {
                Some(target) => symlink(target, bundle.join("rootfs")).unwrap(),
                None => std::fs::create_dir_all(bundle.join("rootfs")).unwrap(),
            }
            std::fs::create_dir_all(bundle.join("real-rootfs")).unwrap();
            let config = serde_json::json!({ "root": { "path": root_path } });
            std::fs::write(bundle.join("config.json"), config.to_string()).unwrap();
            let args: Vec<OsString> = ["nvshim-hook", "fixups", "--link", &link, "--bundle"]
                .iter()
                .map(OsString::from)
                .chain([bundle.as_os_str().to_owned()])
                .collect();
            let mut err = Vec::new();
            let code = run(&args, Untouched, &mut err);
            (code, String::from_utf8_lossy(&err).into_owned())
        };
        let outside_abs = outside.to_str().unwrap();
        let root_link = top.join("link-to-slash");
        symlink("/", &root_link).unwrap();
        for (root_path, rootfs, want) in [
            ("/tmp/..", None, "climbs with `..`"),
            ("rootfs/../..", None, "climbs with `..`"),
            ("../outside", None, "climbs with `..`"),
            ("/proc/self/root", None, "goes through /proc"),
            (
                &format!("/proc/1/root{outside_abs}"),
                None,
                "goes through /proc",
            ),
            ("/", None, "other than /"),
            (root_link.to_str().unwrap(), None, "other than /"),
            ("rootfs", Some("/"), "other than /"),
            ("rootfs", Some(outside_abs), "does not lie below the bundle"),
            (
                "rootfs",
                Some("../outside"),
                "does not lie below the bundle",
            ),
        ] {
            let (code, err) = fixups(&bundle, root_path, rootfs);
            assert_eq!(code, EXIT_FAILURE, "{root_path} ({rootfs:?}): {err}");
            assert!(err.contains(want), "{root_path} ({rootfs:?}): {err}");
            assert_eq!(err.lines().count(), 1, "{err}");
            assert_eq!(
                std::fs::read_dir(&outside).unwrap().count(),
                0,
                "{root_path}"
            );
            assert!(!Path::new("/").join(&probe).exists(), "{root_path}");
        }
        // What engines write: a rootfs below the bundle (a symlink staying in it too), an
        // absolute path elsewhere, a bundle reached through a symlinked directory.
        let via_link = top.join("via-link/bundle");
        for (bundle, root_path, rootfs, made) in [
            (&bundle, "rootfs", None, bundle.join("rootfs")),
            (&bundle, "./rootfs/", None, bundle.join("rootfs")),
            (
                &bundle,
                "rootfs",
                Some("real-rootfs"),
                bundle.join("real-rootfs"),
            ),
            (&bundle, outside_abs, None, outside.clone()),
            (&via_link, "rootfs", None, via_link.join("rootfs")),
        ] {
            let (code, err) = fixups(bundle, root_path, rootfs);
            assert_eq!(code, 0, "{root_path} ({rootfs:?}): {err}");
            assert_eq!(
                std::fs::read_link(made.join(&probe).join("l")).unwrap(),
                Path::new("x"),
                "{root_path}"
            );
        }
    }

    #[test]
    fn own_dialect() {
        assert_eq!(
            p(&[
                "/usr/bin/nvshim-hook",
                "update-ldcache",
                "--folder",
                "/a",
                "--folder=/b"
            ])
            .unwrap(),
            Command::UpdateLdcache {
                folders: vec!["/a".into(), "/b".into()],
                ldconfig_path: None,
                spec: None
            }
        );
        // Older nvshim-runtime versions named a cache dir: accepted, ignored.
        let hook = ["nvshim-hook", "update-ldcache", "--folder", "/a"];
        assert_eq!(p(&[&hook[..], &["--cache-dir=/x"]].concat()), p(&hook));
        let fixups = ["nvshim-hook", "fixups", "--folder", "/a"];
        assert_eq!(
            p(&[&fixups[..], &["--cache-dir", "/y"]].concat()),
            p(&fixups)
        );
        assert_eq!(
            p(&[
                "nvshim-hook",
                "create-symlinks",
                "--link",
                "a::/b",
                "-link=c::/d"
            ])
            .unwrap(),
            Command::CreateSymlinks {
                links: vec![Link::parse("a::/b").unwrap(), Link::parse("c::/d").unwrap()],
                spec: None
            }
        );
        assert!(p(&["nvshim-hook", "enable-cuda-compat", "--bogus"]).is_err());
        assert!(p(&["nvshim-hook"]).is_err());
        assert!(p(&["nvshim-hook", "update-ldcache", "--bogus"]).is_err());
        assert!(p(&["nvshim-hook", "update-ldcache", "--folder"]).is_err());
        assert!(p(&["nvshim-hook", "create-symlinks", "--link", "nolink"]).is_err());
    }

    #[test]
    fn nvidia_dialect() {
        assert_eq!(
            p(&[
                "nvidia-cdi-hook",
                "update-ldcache",
                "--folder",
                "/a",
                "--ldconfig-path",
                "@/sbin/ldconfig"
            ])
            .unwrap(),
            Command::UpdateLdcache {
                folders: vec!["/a".into()],
                ldconfig_path: Some("@/sbin/ldconfig".into()),
                spec: None
            }
        );
        assert_eq!(
            p(&[
                "/usr/bin/nvidia-cdi-hook",
                "enable-cuda-compat",
                "--host-driver-version=580.65.06",
                "--host-cuda-version",
                "13.0",
                "-cuda-compat-container-root=/usr/local/cuda/compat_orin",
            ])
            .unwrap(),
            Command::EnableCudaCompat {
                options: enable_cuda_compat::Options {
                    host_driver_version: Some("580.65.06".into()),
                    host_cuda_version: Some("13.0".into()),
                    compat_dir: Some("/usr/local/cuda/compat_orin".into()),
                },
                spec: None
            }
        );
        assert_eq!(
            p(&["nvidia-cdi-hook", "disable-device-node-modification"]).unwrap(),
            Command::DisableDeviceNodeModification {
                host_params: PathBuf::from("/proc/driver/nvidia/params"),
                spec: None
            }
        );
        assert_eq!(
            p(&[
                "nvidia-cdi-hook",
                "disable-device-node-modification",
                "--host-params=/tmp/p",
                "--container-spec",
                "-"
            ])
            .unwrap(),
            Command::DisableDeviceNodeModification {
                host_params: PathBuf::from("/tmp/p"),
                spec: Some("-".into())
            }
        );
        assert_eq!(
            p(&["nvidia-cdi-hook", "update-application-profile"]).unwrap(),
            Command::UpdateApplicationProfile { spec: None }
        );
        assert_eq!(
            p(&[
                "nvidia-cdi-hook",
                "chmod",
                "--mode",
                "755",
                "--path",
                "/dev/dri",
                "--path=/dev/nvidia-caps"
            ])
            .unwrap(),
            Command::Chmod {
                mode: 0o755,
                paths: vec!["/dev/dri".into(), "/dev/nvidia-caps".into()],
                spec: None
            }
        );
        assert!(p(&["nvidia-cdi-hook", "chmod", "--path", "/dev/dri"]).is_err());
        assert!(p(&["nvidia-cdi-hook", "chmod", "--mode", "9"]).is_err());
        assert!(p(&["nvidia-cdi-hook", "enable-cuda-compat", "--bogus"]).is_err());
        assert_eq!(p(&["nvidia-cdi-hook", "noop"]).unwrap(), Command::Noop);
        // nvshim's legacy path runs the container fix-ups under its own name; chmod and noop
        // are NVIDIA's alone.
        for hook in [
            "enable-cuda-compat",
            "disable-device-node-modification",
            "update-application-profile",
        ] {
            assert!(p(&["nvshim-hook", hook]).is_ok(), "{hook}");
        }
        for hook in ["chmod", "noop"] {
            assert!(p(&["nvshim-hook", hook]).is_err(), "{hook}");
        }
        assert!(matches!(
            p(&["nvidia-cdi-hook", "some-future-hook", "--x"]),
            Ok(Command::Skip(_))
        ));
        // nvshim's one-process fix-ups: every step's flags, in any order; NVIDIA's names do
        // not know it.
        let f = match p(&[
            "nvshim-hook",
            "fixups",
            "--link",
            "libcuda.so.1::/usr/lib/libcuda.so",
            "--folder=/usr/lib",
            "--host-driver-version",
            "580.95.05",
            "--disable-device-node-modification",
            "--host-params=/p",
            "--update-application-profile",
        ])
        .unwrap()
        {
            Command::Fixups(f) => f,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            f.links,
            vec![Link::parse("libcuda.so.1::/usr/lib/libcuda.so").unwrap()]
        );
        assert_eq!(f.folders, ["/usr/lib"]);
        assert_eq!(f.compat.host_driver_version.as_deref(), Some("580.95.05"));
        assert_eq!(f.host_params, Some(PathBuf::from("/p")));
        assert!(f.application_profile);
        let f = match p(&[
            "nvshim-hook",
            "fixups",
            "--disable-device-node-modification",
        ])
        .unwrap()
        {
            Command::Fixups(f) => f,
            other => panic!("{other:?}"),
        };
        assert_eq!(f.host_params, Some(PathBuf::from(ddnm::HOST_PARAMS)));
        assert!(p(&["nvshim-hook", "fixups", "--update-application-profile=1"]).is_err());
        assert!(matches!(
            p(&["nvidia-cdi-hook", "fixups"]),
            Ok(Command::Skip(_))
        ));
        // NVIDIA's createRuntime hook, as the toolkit writes it: an empty driver root, GPU
        // UUIDs; nvshim's name takes the same flags and its own --log-file.
        let memory = |ids: &[&str], root: &str, log: Option<&str>| Command::ApplyCudaMemoryLimits {
            options: memory_limits::Options {
                driver_root: root.into(),
                gpu_ids: ids.iter().map(|s| s.to_string()).collect(),
                log_file: log.map(PathBuf::from),
            },
            spec: None,
        };
        assert_eq!(
            p(&[
                "/usr/bin/nvidia-cdi-hook",
                "apply-cuda-memory-limits",
                "--driver-root",
                "",
                "--gpu-id",
                "GPU-4f0b7a5e-6c2d-4a59-8e3a-6b1d0c9f1a21",
            ])
            .unwrap(),
            memory(&["GPU-4f0b7a5e-6c2d-4a59-8e3a-6b1d0c9f1a21"], "", None)
        );
        assert_eq!(
            p(&[
                "nvshim-hook",
                "apply-cuda-memory-limits",
                "--driver-root=/run/nvidia/driver",
                "--gpu-id",
                "GPU-a",
                "--gpu-id=MIG-b",
                "-gpu-id",
                "3",
                "--log-file",
                "/var/log/nvshim.log",
            ])
            .unwrap(),
            memory(
                &["GPU-a", "MIG-b", "3"],
                "/run/nvidia/driver",
                Some("/var/log/nvshim.log")
            )
        );
        assert!(p(&[
            "nvidia-cdi-hook",
            "apply-cuda-memory-limits",
            "--memory-limit",
            "1G"
        ])
        .is_err());
        assert!(p(&["nvidia-cdi-hook", "apply-cuda-memory-limits", "--gpu-id"]).is_err());
        assert!(matches!(p(&["nvidia-cdi-hook"]), Ok(Command::Skip(_))));
        assert!(matches!(
            p(&[
                "nvidia-cdi-hook",
                "--debug",
                "create-symlinks",
                "--link",
                "a::b"
            ]),
            Ok(Command::CreateSymlinks { .. })
        ));
        assert_eq!(
            p(&["nvidia-container-runtime-hook", "prestart"]).unwrap(),
            Command::LegacyHook
        );
    }

    #[test]
    fn nvidia_ctk_hook_is_nvidia_cdi_hook() {
        assert_eq!(
            p(&[
                "/usr/bin/nvidia-ctk",
                "hook",
                "update-ldcache",
                "--folder",
                "/a"
            ])
            .unwrap(),
            p(&["nvidia-cdi-hook", "update-ldcache", "--folder", "/a"]).unwrap()
        );
        assert_eq!(
            p(&[
                "nvidia-ctk",
                "--debug",
                "hook",
                "create-symlinks",
                "--link",
                "a::b"
            ])
            .unwrap(),
            p(&["nvidia-cdi-hook", "create-symlinks", "--link", "a::b"]).unwrap()
        );
        assert!(matches!(
            p(&["nvidia-ctk", "hook", "a-hook-from-the-future"]),
            Ok(Command::Skip(_))
        ));
        assert!(matches!(p(&["nvidia-ctk", "hook"]), Ok(Command::Skip(_))));
        assert_eq!(
            p(&[
                "nvidia-ctk",
                "hook",
                "apply-cuda-memory-limits",
                "--driver-root",
                "",
                "--gpu-id",
                "GPU-a",
                "--container-spec",
                "-",
            ])
            .unwrap(),
            Command::ApplyCudaMemoryLimits {
                options: memory_limits::Options {
                    driver_root: String::new(),
                    gpu_ids: vec!["GPU-a".into()],
                    log_file: None,
                },
                spec: Some("-".into()),
            }
        );
        for other in [
            &["nvidia-ctk", "cdi", "generate"][..],
            &["nvidia-ctk", "runtime", "configure"],
            &["nvidia-ctk", "--version"],
            &["nvidia-ctk"],
        ] {
            match p(other) {
                Ok(Command::NotProvided(m)) => {
                    assert!(m.contains("nvidia-ctk hook"), "{m}")
                }
                x => panic!("{other:?}: {x:?}"),
            }
        }
    }

    #[test]
    fn exit_codes() {
        let run_args = |args: &[&str]| {
            let v: Vec<OsString> = args.iter().map(OsString::from).collect();
            let mut err = Vec::new();
            let code = run(&v, &b""[..], &mut err);
            (code, String::from_utf8(err).unwrap())
        };
        assert_eq!(run_args(&["nvshim-hook", "frobnicate"]).0, EXIT_USAGE);
        assert_eq!(run_args(&["nvidia-cdi-hook", "frobnicate"]).0, 0);
        assert_eq!(run_args(&["nvidia-cdi-hook", "noop"]), (0, String::new()));
        let (code, msg) = run_args(&["nvidia-ctk", "cdi", "list"]);
        assert_eq!(code, EXIT_FAILURE);
        assert_eq!(msg.lines().count(), 1, "{msg}");
        // No host version: nothing to do, the state is not even read.
        assert_eq!(run_args(&["nvidia-cdi-hook", "enable-cuda-compat"]).0, 0);
        // No driver parameters on the host: nothing to do either.
        let (code, msg) = run_args(&[
            "nvidia-cdi-hook",
            "disable-device-node-modification",
            "--host-params=/nonexistent/params",
        ]);
        assert_eq!((code, msg.as_str()), (0, ""));
        let (code, msg) = run_args(&["nvidia-container-runtime-hook", "prestart"]);
        assert_eq!(code, EXIT_FAILURE);
        assert!(
            msg.contains("nvshim runtime configure --runtime docker"),
            "{msg}"
        );
        assert!(msg.contains("docker run --runtime=nvidia --gpus"), "{msg}");
        assert!(
            msg.contains("nvshim cdi generate --output /var/run/cdi/nvidia.yaml"),
            "{msg}"
        );
        assert!(msg.contains("29.2"), "{msg}");
        // GPU memory limits: nothing asked, nothing done; a bad value is one line naming it.
        let bundle = tempfile::tempdir().unwrap();
        let state = format!(
            r#"{{"id":"c","pid":1,"bundle":"{}"}}"#,
            bundle.path().display()
        );
        let memory = |env: &[&str]| {
            std::fs::write(
                bundle.path().join("config.json"),
                serde_json::json!({"process": {"env": env}}).to_string(),
            )
            .unwrap();
            let v: Vec<OsString> = [
                "nvidia-cdi-hook",
                "apply-cuda-memory-limits",
                "--driver-root",
                "",
                "--gpu-id",
                "GPU-a",
            ]
            .iter()
            .map(OsString::from)
            .collect();
            let mut err = Vec::new();
            let code = run(&v, state.as_bytes(), &mut err);
            (code, String::from_utf8(err).unwrap())
        };
        assert_eq!(memory(&["PATH=/bin"]), (0, String::new()));
        let (code, msg) = memory(&[
            "NVIDIA_GPU_MEMORY_REQUEST=1Gi",
            "NVIDIA_GPU_MEMORY_LIMIT=2048",
        ]);
        assert_eq!(code, EXIT_FAILURE);
        assert_eq!(msg.lines().count(), 1, "{msg}");
        assert!(msg.contains("NVIDIA_GPU_MEMORY_REQUEST=\"1Gi\""), "{msg}");
        let (code, msg) = memory(&[
            "NVIDIA_GPU_MEMORY_REQUEST=4096",
            "NVIDIA_GPU_MEMORY_LIMIT=2048",
        ]);
        assert_eq!(code, EXIT_FAILURE);
        assert!(msg.contains("exceeds memory limit (2048 MiB"), "{msg}");
        // A bad state is one line naming where it came from.
        let (code, msg) = run_args(&["nvshim-hook", "update-ldcache", "--folder", "/x"]);
        assert_eq!(code, EXIT_FAILURE);
        assert!(msg.contains("stdin"), "{msg}");
        assert_eq!(msg.lines().count(), 1, "{msg}");
    }
}
