//! `nvshim`: the operator's tool. A thin clap front over the library.
//!
//! One file (850 lines of code, no tests here: the e2e tests run the binary): the clap tree is one
//! type, [`Cli`], which `completions` and `generate-man` walk whole, and each subcommand's handler
//! is a thin call into the library next to its arguments.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

use nvshim::config::{Config, CONFIG_ENV};

#[derive(Debug, Parser)]
#[command(
    name = "nvshim",
    version,
    about = "GPU container runtime: operator's tool"
)]
struct Cli {
    /// Config file (default: $NVSHIM_CONFIG, else /etc/nvshim/config.toml).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show the configuration nvshim resolves (file, defaults applied).
    Config,
    /// Register nvshim-runtime with a container engine (docker, containerd, cri-o).
    #[command(subcommand)]
    Runtime(RuntimeCommand),
    /// Prepare the host for GPU containers.
    #[command(subcommand)]
    System(SystemCommand),
    /// CDI specs: generate one for this host's GPUs, list the devices in the spec
    /// directories, validate spec files.
    #[command(subcommand)]
    Cdi(CdiCommand),
    /// Show what nvshim-runtime create would do to a bundle, and why, changing nothing: the
    /// requests and their sources, the mode, the GPUs, every edit grouped by its cause, a diff
    /// of config.json, and the error create would fail with (exit 1 then).
    Explain(ExplainArgs),
    /// Check the host for GPU containers: driver, device nodes, /dev/char links, persistence
    /// mode, CDI specs, engines, runc. One line per check with the command that fixes each
    /// problem; exit 0 (all ok), 1 (warnings) or 2 (errors).
    Doctor(DoctorArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions { shell: clap_complete::Shell },
    /// Write the man pages into a directory (for packaging).
    #[command(hide = true)]
    GenerateMan { out_dir: PathBuf },
    /// Print the NVML inventory as JSON (what the statically linked nvshim-runtime asks for
    /// the rare times it needs NVML: MIG ids, arch/brand requirements).
    #[command(hide = true, name = "nvml-query")]
    NvmlQuery {
        /// The libnvidia-ml.so.1 to load.
        #[arg(long)]
        lib: PathBuf,
    },
    /// Set NVML GPU memory limits for a cgroup and print the outcome as JSON (what the
    /// statically linked nvshim-hook asks for in `apply-cuda-memory-limits`).
    #[command(hide = true, name = "nvml-set-memory-limits")]
    NvmlSetMemoryLimits {
        /// The libnvidia-ml.so.1 to load.
        #[arg(long)]
        lib: PathBuf,
        /// The container's cgroup v2 directory.
        #[arg(long)]
        namespace: String,
        #[arg(long)]
        request_mib: u64,
        #[arg(long)]
        limit_mib: u64,
        #[arg(long = "gpu-id")]
        gpu_ids: Vec<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("nvshim: {}", nvshim::report::error_text(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    if let Some(result) = run_without_config(&cli) {
        return result;
    }
    let path = cli
        .config
        .unwrap_or_else(|| Config::path_from_env(std::env::var_os(CONFIG_ENV)));
    if let Command::Doctor(args) = &cli.command {
        // A config that does not load is one of doctor's findings, not a reason to stop.
        return Ok(diagnostics::doctor_command(args, &path));
    }
    let config = Config::load(&path).with_context(|| "loading the nvshim config")?;
    match cli.command {
        Command::Config => {
            println!("# {}", path.display());
            println!("{config:#?}");
        }
        Command::System(cmd) => return system_command(cmd, &config),
        Command::Cdi(cmd) => return cdi_command(cmd, &config),
        Command::Explain(args) => return Ok(diagnostics::explain_command(&args, &config, &path)),
        Command::Doctor(_) => {}
        // Handled by run_without_config.
        Command::Runtime(_)
        | Command::Completions { .. }
        | Command::GenerateMan { .. }
        | Command::NvmlQuery { .. }
        | Command::NvmlSetMemoryLimits { .. } => {}
    }
    Ok(ExitCode::SUCCESS)
}

// ---- `runtime`, `system`, `completions`, `generate-man` --------------------------------------

#[derive(Debug, Subcommand)]
enum RuntimeCommand {
    /// Register nvshim-runtime as the runtime `nvidia` in the engine's config (idempotent; a
    /// changed file is first copied under /var/lib/nvshim/backups, where no engine reads it).
    Configure(EngineArgs),
    /// Remove what `configure` added: the runtime, nvshim's drop-in, and the settings it
    /// changed (Docker's previous default runtime and `features.cdi`, containerd's
    /// `enable_cdi`) put back as they were; a file unchanged since gets its backup's bytes
    /// back, and the backups are removed.
    Unconfigure(EngineArgs),
}

#[derive(Debug, clap::Args)]
struct EngineArgs {
    /// The container engine.
    #[arg(long, value_parser = parse_engine)]
    runtime: nvshim::ops::engine::Engine,
    /// The engine's config file [default: /etc/docker/daemon.json,
    /// /etc/containerd/config.toml, /etc/crio/crio.conf].
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
    /// The drop-in nvshim writes (containerd when its config has `imports`; cri-o always)
    /// [default: conf.d/99-nvshim.toml beside containerd's config,
    /// crio.conf.d/99-nvshim.toml beside cri-o's].
    #[arg(long, value_name = "PATH")]
    drop_in_config: Option<PathBuf>,
    /// The name the engine knows the runtime by.
    #[arg(long, alias = "nvidia-runtime-name", default_value = nvshim::ops::engine::DEFAULT_RUNTIME_NAME)]
    runtime_name: String,
    /// nvshim-runtime as the engine will run it [default: next to this binary, else
    /// /usr/bin/nvshim-runtime].
    #[arg(long, alias = "nvidia-runtime-path", value_name = "PATH")]
    runtime_path: Option<PathBuf>,
    /// Also make it the engine's default runtime (configure only; the default for docker,
    /// whose `--gpus` before Docker 29.2 works only through nvshim-runtime).
    #[arg(long, alias = "nvidia-set-as-default")]
    set_as_default: bool,
    /// Leave Docker's default runtime as it is (configure only).
    #[arg(long, conflicts_with = "set_as_default")]
    no_set_as_default: bool,
    /// Leave the engine's own CDI support as it is (configure turns it on where it is off:
    /// containerd 1.7's `enable_cdi`, Docker 25-27's `features.cdi`).
    #[arg(long)]
    no_cdi: bool,
    /// containerd: also turn NRI on where it is off (1.7; on by default from 2.0), for the
    /// nvshim-nri plugin. `unconfigure` turns it off again if configure turned it on.
    #[arg(long)]
    nri: bool,
    /// containerd 2.2 and later, with --nri: make nvshim-nri a required NRI plugin (NRI's
    /// default validator), so containerd refuses to create any container while the plugin is
    /// absent; pods annotated `nvshim.io/tolerate-missing-nri: "true"` (the plugin's own)
    /// still start. Refused for older containerd, which would ignore it: use `nvshim-nri
    /// --mandatory` there. `unconfigure` removes what it added.
    #[arg(long, requires = "nri")]
    nri_required: bool,
    /// The engine's release, MAJOR.MINOR, when the daemon on PATH is not the one that reads the
    /// config [default: from `dockerd --version` / `containerd --version`].
    #[arg(long, value_name = "MAJOR.MINOR", value_parser = parse_engine_version)]
    engine_version: Option<(u64, u64)>,
    /// Where configure keeps the content of the files it changes, and unconfigure finds it;
    /// give both the same one [default: /var/lib/nvshim/backups].
    #[arg(long, value_name = "DIR")]
    backup_dir: Option<PathBuf>,
    /// Print the changes as a unified diff and write nothing.
    #[arg(long)]
    dry_run: bool,
}

fn parse_engine(s: &str) -> Result<nvshim::ops::engine::Engine, String> {
    s.parse()
}

fn parse_engine_version(s: &str) -> Result<(u64, u64), String> {
    nvshim::ops::engine::parse_version(s)
        .ok_or_else(|| format!("{s:?} is not MAJOR.MINOR (e.g. 1.7)"))
}

#[derive(Debug, Subcommand)]
enum SystemCommand {
    /// Create /dev/char/MAJ:MIN links for the NVIDIA device nodes, which runc's systemd cgroup
    /// driver needs to keep GPU access across `systemctl daemon-reload`.
    CreateDevCharSymlinks {
        /// Where to create the links.
        #[arg(long, default_value = nvshim::ops::system::DEFAULT_DEV_CHAR_PATH)]
        dev_char_path: PathBuf,
        /// Link every node the driver can have (from /proc/devices and the GPUs in
        /// /proc/driver/nvidia/gpus), not only the nodes that exist now.
        #[arg(long)]
        create_all: bool,
        /// Print what would be done and change nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

/// Commands that never read nvshim's own config: a broken config.toml must not stop an engine
/// from being configured or unconfigured.
fn run_without_config(cli: &Cli) -> Option<anyhow::Result<ExitCode>> {
    match &cli.command {
        Command::Runtime(cmd) => Some(runtime_command(cmd)),
        Command::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(*shell, &mut cmd, "nvshim", &mut std::io::stdout());
            Some(Ok(ExitCode::SUCCESS))
        }
        Command::GenerateMan { out_dir } => Some(generate_man(out_dir).map(|()| ExitCode::SUCCESS)),
        Command::NvmlQuery { lib } => Some(
            nvshim::host::nvml::discover(lib.clone())
                .map_err(anyhow::Error::from)
                .and_then(|inventory| Ok(serde_json::to_writer(std::io::stdout(), &inventory)?))
                .map(|()| ExitCode::SUCCESS),
        ),
        Command::NvmlSetMemoryLimits {
            lib,
            namespace,
            request_mib,
            limit_mib,
            gpu_ids,
        } => {
            use nvshim_hook::apply_cuda_memory_limits::{helper, set_limits, Limits};
            let limits = Limits {
                request_mib: *request_mib,
                limit_mib: *limit_mib,
            };
            // The answer, errors included, is the JSON line the hook reads.
            println!(
                "{}",
                helper::answer(&set_limits(lib, namespace, &limits, gpu_ids))
            );
            Some(Ok(ExitCode::SUCCESS))
        }
        _ => None,
    }
}

fn runtime_command(cmd: &RuntimeCommand) -> anyhow::Result<ExitCode> {
    use nvshim::ops::engine::{self, Options};
    let (args, configure) = match cmd {
        RuntimeCommand::Configure(a) => (a, true),
        RuntimeCommand::Unconfigure(a) => (a, false),
    };
    let runtime_path = match &args.runtime_path {
        Some(p) => p.clone(),
        None => default_runtime_path(),
    };
    let mut opts = Options::new(args.runtime, runtime_path);
    if let Some(c) = &args.config {
        // The drop-in beside it goes into containerd's `imports`, which must be absolute.
        let c = std::path::absolute(c).with_context(|| format!("resolving {}", c.display()))?;
        opts.drop_in = args.runtime.default_drop_in(&c);
        opts.config = c;
    }
    if let Some(d) = &args.drop_in_config {
        anyhow::ensure!(
            d.is_absolute(),
            "--drop-in-config must be an absolute path (the engine resolves it)"
        );
        opts.drop_in = Some(d.clone());
    }
    if let Some(d) = &args.backup_dir {
        opts.backup_dir =
            std::path::absolute(d).with_context(|| format!("resolving {}", d.display()))?;
    }
    opts.runtime_name = args.runtime_name.clone();
    opts.set_as_default = match args.runtime {
        engine::Engine::Docker => !args.no_set_as_default,
        _ => args.set_as_default,
    };
    opts.enable_cdi = !args.no_cdi;
    anyhow::ensure!(
        !args.nri || args.runtime == engine::Engine::Containerd,
        "--nri is for containerd (CRI-O has NRI on from 1.30: its `enable_nri`)"
    );
    opts.enable_nri = args.nri;
    opts.require_nri = args.nri_required;
    // The engine's CDI reads the spec directories nvshim reads. Best effort: a config that does
    // not load leaves the defaults (the engine's own) and stops nothing. Here `--config` is the
    // engine's file, so nvshim's own comes from $NVSHIM_CONFIG or its default path only.
    let nvshim_config = Config::path_from_env(std::env::var_os(CONFIG_ENV));
    match Config::load(&nvshim_config) {
        Ok(c) => opts.cdi_spec_dirs = c.cdi_spec_dirs,
        Err(e) if opts.enable_cdi => eprintln!(
            "nvshim: warning: {e}; the engine's CDI spec directories are left at their defaults"
        ),
        Err(_) => {}
    }
    opts.engine_version = args.engine_version.or_else(|| {
        let path = std::env::var_os("PATH");
        engine::detect_version(args.runtime, path.as_deref())
    });
    let plan = if configure {
        engine::configure(&opts)?
    } else {
        engine::unconfigure(&opts)?
    };
    for w in &plan.warnings {
        eprintln!("nvshim: warning: {w}");
    }
    if plan.is_empty() {
        println!(
            "nvshim: {} is already {}: nothing to change",
            args.runtime,
            if configure {
                "configured"
            } else {
                "unconfigured"
            }
        );
        return Ok(ExitCode::SUCCESS);
    }
    if args.dry_run {
        print!("{}", plan.diff());
        return Ok(ExitCode::SUCCESS);
    }
    for applied in plan.apply()? {
        let verb = if applied.removed { "removed" } else { "wrote" };
        match &applied.backup {
            Some(b) => println!(
                "nvshim: {verb} {} (previous content in {})",
                applied.path.display(),
                b.display()
            ),
            None => println!("nvshim: {verb} {}", applied.path.display()),
        }
    }
    println!(
        "nvshim: restart {} to apply (e.g. systemctl restart {})",
        args.runtime, args.runtime
    );
    Ok(ExitCode::SUCCESS)
}

/// The nvshim-runtime installed beside this binary (a package's /usr/bin, a release tarball, a
/// build's target dir), else the packages' path.
fn default_runtime_path() -> PathBuf {
    nvshim::install::self_exe()
        .and_then(|exe| exe.parent().map(|d| d.join("nvshim-runtime")))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(nvshim::ops::engine::DEFAULT_RUNTIME_PATH))
}

fn system_command(cmd: SystemCommand, config: &Config) -> anyhow::Result<ExitCode> {
    use nvshim::ops::system::{create_dev_char_symlinks, DevCharOptions, LinkAction};
    let SystemCommand::CreateDevCharSymlinks {
        dev_char_path,
        create_all,
        dry_run,
    } = cmd;
    let host = nvshim::install::host_from(config);
    let opts = DevCharOptions {
        dev_char_path,
        create_all,
        dry_run,
    };
    let links = create_dev_char_symlinks(&host, &opts)?;
    let would = if dry_run { "would " } else { "" };
    for l in &links {
        let (link, target) = (l.link.display(), l.target.display());
        match &l.action {
            LinkAction::Create => println!("{would}create {link} -> {target}"),
            LinkAction::Replace { old } => {
                println!(
                    "{would}replace {link} -> {target} (was -> {})",
                    old.display()
                )
            }
            LinkAction::Keep => println!("keep {link} -> {target}"),
            LinkAction::Blocked => {
                eprintln!("nvshim: {link} exists and is not a symlink: left alone")
            }
        }
    }
    if links.is_empty() {
        eprintln!(
            "nvshim: no NVIDIA device nodes under {}/dev (pass --create-all to link the nodes the driver will create)",
            config.dev_root.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `nvshim.1`, one page per subcommand (`nvshim-runtime-configure.1`, ...), and
/// `nvshim-runtime.8` for the runtime binary, all from clap definitions.
fn generate_man(out_dir: &std::path::Path) -> anyhow::Result<()> {
    fn write(out_dir: &std::path::Path, name: &str, cmd: clap::Command) -> anyhow::Result<()> {
        let path = out_dir.join(name);
        let mut buf = Vec::new();
        clap_mangen::Man::new(cmd).render(&mut buf)?;
        std::fs::write(&path, buf).with_context(|| format!("writing {}", path.display()))
    }
    fn leaves(out_dir: &std::path::Path, cmd: &clap::Command) -> anyhow::Result<()> {
        // clap's generated `help` subcommands mirror the real ones: no pages of their own.
        let subs = cmd.get_subcommands();
        for sub in subs.filter(|s| !s.is_hide_set() && s.get_name() != "help") {
            if sub.has_subcommands() {
                // Group pages would clash with the binaries' names (`nvshim runtime` vs
                // `nvshim-runtime`); nvshim.1 lists the groups.
                leaves(out_dir, sub)?;
            } else {
                let name = sub.get_display_name().unwrap_or(sub.get_name()).to_string();
                write(out_dir, &format!("{name}.1"), sub.clone())?;
            }
        }
        Ok(())
    }
    std::fs::create_dir_all(out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let mut cmd = <Cli as clap::CommandFactory>::command();
    cmd.build();
    write(out_dir, "nvshim.1", cmd.clone())?;
    leaves(out_dir, &cmd)?;
    let runtime = clap::Command::new("nvshim-runtime")
        .version(env!("CARGO_PKG_VERSION"))
        .about("OCI runtime shim that makes NVIDIA GPUs appear in containers")
        .long_about(
            "nvshim-runtime takes runc's exact command line. On `create` and `run` it edits the \
             bundle's config.json for the GPUs the container requests (NVIDIA_VISIBLE_DEVICES, \
             cdi.k8s.io/* annotations, Docker's --gpus), then execs the low-level runtime (runc, \
             else crun; `low-level-runtimes` in the config) with the same arguments. Other \
             commands are passed through untouched. Engines run it as the runtime `nvidia`: see \
             nvshim-runtime-configure(1).",
        )
        .after_help(
            "ENVIRONMENT: NVSHIM_CONFIG names the config file (default /etc/nvshim/config.toml).",
        )
        .disable_help_flag(true)
        .disable_version_flag(true)
        .arg(
            clap::Arg::new("runc-args")
                .value_name("RUNC ARGUMENTS")
                .num_args(0..)
                .help("Global flags, a command and its arguments, exactly as for runc(8)"),
        );
    write(out_dir, "nvshim-runtime.8", runtime)
}

// ---- `cdi` ------------------------------------------------------------------------------------

#[derive(Debug, Subcommand)]
enum CdiCommand {
    /// Write a CDI spec for this host's GPUs: kind nvidia.com/gpu, a device per GPU (and MIG
    /// device) under each naming strategy, and `all`. GPUs come from NVML when the driver
    /// root's libnvidia-ml.so.1 loads, else from /proc (no MIG).
    Generate(GenerateArgs),
    /// Keep the node's spec current: regenerate it when the driver version, the GPU set, the
    /// MIG layout or a device node or library it names no longer matches the host, and write it
    /// (atomically) only when its content changed. Nothing is done while the driver is not
    /// loaded. The packages run it at boot, on driver load and every 30 s (systemd units).
    Refresh(RefreshArgs),
    /// List the devices the spec directories (cdi-spec-dirs) provide, and every spec that
    /// failed to load with its error.
    List,
    /// Check spec files as a consumer reads them; exit 1 naming the reason for each invalid
    /// one.
    Validate {
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
    },
}

#[derive(Debug, clap::Args)]
struct GenerateArgs {
    /// Write the spec here (atomically, mode 0644) instead of to stdout.
    #[arg(long, short, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Output format [default: json for a .json --output, else yaml].
    #[arg(long, value_parser = ["yaml", "json"])]
    format: Option<String>,
    /// What to describe: auto (GPUs and MIG devices, from NVML or /proc), imex (the IMEX
    /// channels under <dev-root>/dev/nvidia-caps-imex-channels, kind nvidia.com/imex-channel),
    /// or as NVIDIA's modes of the same names one `all` device of kind nvidia.com/<mode>: gds
    /// (/dev/nvidia-fs*, /etc/cufile.json, /run/udev), mofed (/dev/infiniband/uverbs*,
    /// rdma_cm), gdrcopy (/dev/gdrdrv), nvswitch (/dev/nvidia-nvswitch*).
    #[arg(long, default_value = "auto", value_parser = ["auto", "imex", "gds", "mofed", "gdrcopy", "nvswitch"])]
    mode: String,
    #[command(flatten)]
    naming: NamingArgs,
}

/// How generated devices are named and what they carry (`generate` and `refresh`).
#[derive(Debug, clap::Args)]
struct NamingArgs {
    /// How devices are named: index (0, MIG 0:1), uuid (GPU-…, MIG-…), type-index (gpu0,
    /// mig0:1); repeat or comma-separate [default: index,uuid].
    #[arg(
        long = "device-name-strategy",
        value_delimiter = ',',
        value_name = "STRATEGY"
    )]
    strategies: Vec<String>,
    /// The vendor part of the kind.
    #[arg(long, default_value = "nvidia.com")]
    vendor: String,
    /// The class part of the kind [default: gpu; imex-channel with --mode imex; the mode's
    /// name with gds, mofed, gdrcopy and nvswitch].
    #[arg(long)]
    class: Option<String>,
    /// Leave out the `all` device.
    #[arg(long)]
    no_all_device: bool,
    /// Leave the DRM nodes' groups out of `additionalGids` (NVIDIA's
    /// no-additional-gids-for-device-nodes): the spec then needs no CDI 0.7.0, for podman 4
    /// and containerd 1.7; a non-root user outside the video and render groups cannot open
    /// the nodes.
    #[arg(long)]
    no_additional_gids: bool,
    /// standard (nvshim's fix-ups hook, the daemons' sockets) or sandbox (neither; the
    /// libraries also at their SONAMEs in /usr/lib and /usr/lib64, for gVisor and Kata)
    /// [default: the config's `profile`; `auto` is sandbox when the low-level runtime
    /// nvshim-runtime would exec is runsc or Kata's].
    #[arg(long, value_parser = ["standard", "sandbox"])]
    profile: Option<String>,
}

impl NamingArgs {
    fn options(
        &self,
        config: &Config,
        default_class: &str,
    ) -> anyhow::Result<nvshim::ops::generate::Options> {
        let mut opts = nvshim::ops::generate::Options {
            vendor: self.vendor.clone(),
            class: self
                .class
                .clone()
                .unwrap_or_else(|| default_class.to_string()),
            all_device: !self.no_all_device,
            additional_gids: !self.no_additional_gids,
            hook_path: nvshim::install::hook_path(config, nvshim::install::self_exe().as_deref()),
            sandbox: match self.profile.as_deref() {
                Some(p) => p == "sandbox",
                None => node_profile(config) == nvshim::config::Profile::Sandbox,
            },
            ..Default::default()
        };
        if !self.strategies.is_empty() {
            opts.strategies = self
                .strategies
                .iter()
                .map(|s| s.parse())
                .collect::<Result<_, _>>()?;
        }
        Ok(opts)
    }
}

/// The config's `profile`, `auto` resolved as nvshim-runtime resolves it: against the
/// low-level runtime it would exec (the one beside this binary skipped, as it skips itself).
fn node_profile(config: &Config) -> nvshim::config::Profile {
    let shim = nvshim::install::self_exe()
        .as_deref()
        .and_then(Path::parent)
        .map(|d| d.join("nvshim-runtime"));
    match nvshim::runtime::find_low_level_runtime(
        &config.low_level_runtimes,
        std::env::var_os("PATH").as_deref(),
        shim.as_deref(),
    ) {
        Ok(runc) => nvshim::runtime::profile_for(config.profile, &runc),
        Err(_) => nvshim::runtime::profile_for(config.profile, Path::new("")),
    }
}

#[derive(Debug, clap::Args)]
struct RefreshArgs {
    /// The spec this node keeps current; nothing else in its directory is touched.
    #[arg(long, short, value_name = "FILE", default_value = nvshim::ops::refresh::DEFAULT_OUTPUT)]
    output: PathBuf,
    /// Regenerate even when the spec matches the host (after an nvshim upgrade).
    #[arg(long)]
    force: bool,
    /// With an NVIDIA GPU on the PCI bus and the driver not loaded yet, wait this many seconds
    /// for it (boot, before the engines start); 0 does not wait.
    #[arg(long, value_name = "SECONDS", default_value_t = 0)]
    wait_for_driver: u64,
    #[command(flatten)]
    naming: NamingArgs,
}

fn cdi_command(cmd: CdiCommand, config: &Config) -> anyhow::Result<ExitCode> {
    use nvshim::cdi::{spec, Registry};
    use nvshim::config::Platform;
    use nvshim::ops::generate;
    match cmd {
        CdiCommand::Generate(args) => {
            let gated = nvshim::host::gated::Feature::from_mode(&args.mode);
            let default_class = match gated {
                Some(f) => f.mode(),
                None if args.mode == "imex" => generate::IMEX_CLASS,
                None => "gpu",
            };
            let opts = args.naming.options(config, default_class)?;
            let format = match (args.format.as_deref(), &args.output) {
                (Some("json"), _) => spec::Format::Json,
                (Some(_), _) | (None, None) => spec::Format::Yaml,
                (None, Some(path)) => spec::Format::for_path(path),
            };
            let host = nvshim::install::host_from(config);
            let (platform, _) = nvshim::host::platform::detect(&host, config.platform);
            let on_platform = matches!(platform, Platform::Wsl | Platform::Csv);
            // A YAML GPU spec carries the host state it was made for, read before discovery,
            // as `cdi refresh` writes it (src/ops/freshness.rs).
            let stamp = (gated.is_none()
                && args.mode != "imex"
                && !on_platform
                && format == spec::Format::Yaml)
                .then(|| {
                    use nvshim::ops::freshness::HostView;
                    HostView::read(&host).stamp(&host, &opts)
                });
            let (spec, origin) = if let Some(f) = gated {
                let spec = generate::generate_gated(&host, f, &opts)
                    .with_context(|| format!("generating the {} spec", f.mode()))?;
                (spec, format!("{} nodes", f.title()))
            } else if args.mode == "imex" {
                let inv = generate::read_inventory(&host).context("reading the host")?;
                let spec = generate::generate_imex(&inv, &opts)
                    .context("generating the IMEX channel spec")?;
                (spec, "IMEX channel nodes".to_string())
            } else if on_platform {
                nvshim::ops::platform_spec::generate(
                    &host,
                    platform,
                    &config.csv_mount_spec_path,
                    &opts,
                )
                .context("generating the CDI spec")?
            } else {
                // Progress on a terminal only: a script's stderr stays as it was.
                let mut progress = diagnostics::TermProgress::new();
                let discovery = generate::discover_with_progress(&host, &mut |m| progress.step(m))
                    .context("discovering GPUs")?;
                progress.clear();
                let from = match &discovery.source {
                    generate::Source::Nvml(lib) => format!("NVML {}", lib.display()),
                    generate::Source::Proc { reason } => {
                        eprintln!(
                            "nvshim: NVML not used ({reason}); GPUs from /proc, no MIG devices"
                        );
                        "/proc".to_string()
                    }
                };
                let inv = generate::read_inventory(&host).context("reading the host")?;
                let spec = generate::generate_with_progress(&inv, &discovery, &opts, &mut |m| {
                    progress.step(m)
                })
                .context("generating the CDI spec")?;
                progress.clear();
                (
                    spec,
                    format!("driver {}, GPUs from {from}", discovery.driver_version),
                )
            };
            let text = generate::render(&spec, format);
            let text = match stamp {
                Some(s) => nvshim::ops::freshness::stamped(&text, s),
                None => text,
            };
            match &args.output {
                Some(path) => {
                    generate::write_atomically(path, &text)?;
                    eprintln!(
                        "nvshim: wrote {} ({} devices of kind {}, cdiVersion {}, {origin})",
                        path.display(),
                        spec.devices.len(),
                        spec.kind,
                        spec.cdi_version,
                    );
                }
                None => print!("{text}"),
            }
            Ok(ExitCode::SUCCESS)
        }
        CdiCommand::Refresh(args) => {
            use nvshim::ops::refresh::{self, Outcome};
            let opts = refresh::Options {
                generate: args.naming.options(config, "gpu")?,
                output: args.output,
                force: args.force,
                wait: std::time::Duration::from_secs(args.wait_for_driver),
            };
            let host = nvshim::install::host_from(config);
            let mut progress = diagnostics::TermProgress::new();
            let outcome = refresh::refresh(&host, &opts, &mut |m| progress.step(m))?;
            progress.clear();
            let path = opts.output.display();
            let why = |reasons: &[String]| {
                if reasons.is_empty() {
                    String::new()
                } else {
                    format!(": {}", refresh::summary(reasons))
                }
            };
            match outcome {
                Outcome::DriverNotLoaded { .. } => eprintln!(
                    "nvshim: the NVIDIA driver is not loaded ({} does not exist); {path} left as it is",
                    host.roots().proc_root.join("driver/nvidia/version").display()
                ),
                // Silent: the timer runs this every 30 s.
                Outcome::Fresh => {}
                // Said when asked for (--force); from the timer it would repeat every 30 s
                // while a finding cannot change the content (MIG devices without NVML), which
                // `nvshim doctor` reports instead.
                Outcome::Unchanged { reasons } if opts.force => {
                    eprintln!("nvshim: {path} regenerated, content unchanged{}", why(&reasons))
                }
                Outcome::Unchanged { .. } => {}
                Outcome::Written {
                    reasons,
                    devices,
                    created,
                } => eprintln!(
                    "nvshim: {} {path} ({devices} devices){}",
                    if created { "wrote" } else { "updated" },
                    why(&reasons)
                ),
            }
            Ok(ExitCode::SUCCESS)
        }
        CdiCommand::List => {
            let registry = Registry::load(&config.cdi_spec_dirs);
            for (name, loaded) in registry.devices() {
                println!("{name}\t{}", loaded.path.display());
            }
            if !registry.errors().is_empty() {
                println!("# failed to load:");
                for e in registry.errors() {
                    println!("{e}");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        CdiCommand::Validate { files } => {
            let mut ok = true;
            for f in &files {
                match spec::read_file(f) {
                    Ok(s) => {
                        let ext = f.extension().and_then(|e| e.to_str());
                        let note = if matches!(ext, Some("json" | "yaml")) {
                            ""
                        } else {
                            " (consumers only read *.json and *.yaml files)"
                        };
                        println!(
                            "{}: valid: kind {}, cdiVersion {} (content needs {}), {} devices{note}",
                            f.display(),
                            s.kind,
                            s.cdi_version,
                            s.minimum_version(),
                            s.devices.len()
                        );
                        for hook in s.hooks_without_env() {
                            println!(
                                "{}: warning: {hook} has no env: runc would run it with the container's environment (LD_PRELOAD included); nvshim gives it PATH only, other runtimes do not: add an env (at least PATH=...) to the hook",
                                f.display()
                            );
                        }
                    }
                    Err(e) => {
                        ok = false;
                        println!("{e}");
                    }
                }
            }
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
    }
}

// ---- `explain`, `doctor` ---------------------------------------------------------------------

use diagnostics::{DoctorArgs, ExplainArgs};

mod diagnostics {
    use std::path::{Path, PathBuf};
    use std::process::ExitCode;

    use std::io::{IsTerminal, Write};

    use nvshim::config::Config;
    use nvshim::ops::{doctor, explain};
    use nvshim::{install, runtime};

    /// One status line on stderr, rewritten in place, for long operations (`cdi generate` on a
    /// large node, where NVML alone can take seconds per GPU). Silent when stderr is not a
    /// terminal, so logs and scripts see exactly what they saw before.
    pub struct TermProgress {
        on: bool,
        shown: bool,
    }

    impl TermProgress {
        pub fn new() -> TermProgress {
            TermProgress {
                on: std::io::stderr().is_terminal(),
                shown: false,
            }
        }

        pub fn step(&mut self, what: &str) {
            if self.on {
                // Carriage return and "erase line" (ECMA-48 EL): the next step replaces this.
                let mut err = std::io::stderr().lock();
                let _ = write!(err, "\r\x1b[2Knvshim: {what}...");
                let _ = err.flush();
                self.shown = true;
            }
        }

        /// Removes the line, before anything else is printed.
        pub fn clear(&mut self) {
            if self.shown {
                let mut err = std::io::stderr().lock();
                let _ = write!(err, "\r\x1b[2K");
                let _ = err.flush();
                self.shown = false;
            }
        }
    }

    impl Drop for TermProgress {
        fn drop(&mut self) {
            self.clear();
        }
    }

    #[derive(Debug, clap::Args)]
    pub struct ExplainArgs {
        /// The bundle directory; its config.json is read, never written [default: .].
        #[arg(long, short, value_name = "DIR", conflicts_with = "spec")]
        bundle: Option<PathBuf>,
        /// A config.json outside a bundle.
        #[arg(long, value_name = "FILE")]
        spec: Option<PathBuf>,
        /// Output format.
        #[arg(long, value_parser = ["text", "json"], default_value = "text")]
        format: String,
    }

    #[derive(Debug, clap::Args)]
    pub struct DoctorArgs {
        /// Docker's config.
        #[arg(long, value_name = "PATH", default_value = "/etc/docker/daemon.json")]
        docker_config: PathBuf,
        /// containerd's config.
        #[arg(
            long,
            value_name = "PATH",
            default_value = "/etc/containerd/config.toml"
        )]
        containerd_config: PathBuf,
        /// CRI-O's config (its crio.conf.d drop-ins are read beside it).
        #[arg(long, value_name = "PATH", default_value = "/etc/crio/crio.conf")]
        crio_config: PathBuf,
        /// Where the /dev/char links are expected.
        #[arg(long, value_name = "PATH", default_value = nvshim::ops::system::DEFAULT_DEV_CHAR_PATH)]
        dev_char_path: PathBuf,
        /// Output format.
        #[arg(long, value_parser = ["text", "json"], default_value = "text")]
        format: String,
        /// List nvshim's files in cache-dir (size, age, whether used) instead of checking.
        #[arg(long, conflicts_with = "clear_caches")]
        caches: bool,
        /// Remove nvshim's files from cache-dir instead of checking (rebuilt as needed).
        #[arg(long)]
        clear_caches: bool,
    }

    pub fn explain_command(args: &ExplainArgs, config: &Config, config_path: &Path) -> ExitCode {
        let input = match (&args.spec, &args.bundle) {
            (Some(file), _) => explain::Input::Spec(file.clone()),
            (None, Some(dir)) => explain::Input::Bundle(dir.clone()),
            (None, None) => explain::Input::Bundle(PathBuf::from(".")),
        };
        let self_exe = nvshim::install::self_exe();
        let hook = install::hook_path(config, self_exe.as_deref());
        // The lookup nvshim-runtime makes (it skips itself, so pass the runtime beside us).
        let shim = self_exe
            .as_deref()
            .and_then(Path::parent)
            .map(|d| d.join("nvshim-runtime"));
        let runc = runtime::find_low_level_runtime(
            &config.low_level_runtimes,
            std::env::var_os("PATH").as_deref(),
            shim.as_deref(),
        );
        let shown_config = config_path.exists().then_some(config_path);
        // The profile nvshim-runtime would use with that runtime.
        let mut config = config.clone();
        if let Ok(r) = &runc {
            config.profile = runtime::profile_for(config.profile, r);
        }
        let e = explain::explain(&config, shown_config, &input, &hook, runc);
        if args.format == "json" {
            println!("{}", serde_json::to_string_pretty(&e).unwrap_or_default());
        } else {
            print!("{}", explain::render_text(&e));
        }
        if e.error.is_some() {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        }
    }

    pub fn doctor_command(args: &DoctorArgs, config_path: &Path) -> ExitCode {
        let (config, error) = match Config::load(config_path) {
            Ok(c) => (c, None),
            Err(e) => (Config::default(), Some(e.to_string())),
        };
        if args.caches || args.clear_caches {
            let (text, ok) = doctor::caches::caches_command(&config.cache_dir, args.clear_caches);
            if ok {
                print!("{text}");
                return ExitCode::SUCCESS;
            }
            eprint!("nvshim: {text}");
            return ExitCode::FAILURE;
        }
        let mut opts = doctor::Options::system(config, config_path.to_path_buf());
        opts.config_error = error;
        opts.docker_config = args.docker_config.clone();
        opts.containerd_config = args.containerd_config.clone();
        opts.crio_config = args.crio_config.clone();
        opts.dev_char_path = args.dev_char_path.clone();
        opts.path_var = std::env::var_os("PATH");
        opts.self_exe = nvshim::install::self_exe();
        let checks = doctor::run(&opts);
        if args.format == "json" {
            println!("{}", doctor::render_json(&checks));
        } else {
            print!("{}", doctor::render_text(&checks));
        }
        ExitCode::from(doctor::exit_code(&checks))
    }
}
