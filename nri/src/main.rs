//! `nvshim-nri`: the NRI plugin daemon (README.md, "Kubernetes without a runtime class").

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use nvshim::config::Config;
use nvshim::install::{self, Tools};
use nvshim_nri::adjust::{self, Engine, Options};
use nvshim_nri::events::{ApiServer, Events};
use nvshim_nri::plugin::{self, Connection, Handler};

/// Serves nvshim's GPU requests (NVIDIA_VISIBLE_DEVICES, device-plugin mounts and
/// annotations, cdi.k8s.io annotations, MIG, IMEX) to an NRI-enabled engine.
#[derive(Parser, Debug)]
#[command(name = "nvshim-nri", version)]
struct Cli {
    /// The engine's NRI socket.
    #[arg(long, default_value = "/var/run/nri/nri.sock")]
    socket: PathBuf,
    /// The plugin's name in the engine.
    #[arg(long, default_value = "nvshim")]
    name: String,
    /// The plugin's index: the engine calls plugins in index order.
    #[arg(long, default_value = "10")]
    index: String,
    /// nvshim's config (the runtime's: same request policy); default $NVSHIM_CONFIG, else
    /// /etc/nvshim/config.toml.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Fail the start of a container whose requested device nodes are missing (the engine
    /// dropped them, or it was created while the plugin was down), and stop (SIGKILL) one
    /// found running so when the plugin connects (default: warn). Needs the host's pid
    /// namespace.
    #[arg(long)]
    mandatory: bool,
    /// Never put OCI hooks in an adjustment (for engines whose NRI validator rejects them).
    #[arg(long)]
    no_hooks: bool,
    /// Answer CDI requests with raw device nodes and mounts even where the engine injects
    /// CDI devices itself.
    #[arg(long)]
    no_native_cdi: bool,
    /// A runtime handler whose pods nvshim-runtime serves (the name `nvshim runtime
    /// configure --runtime-name` gave it): their containers are not stopped or refused for
    /// what NRI cannot see in their config.json. Repeat for several.
    #[arg(
        long = "runtime-handler",
        value_name = "NAME",
        default_value = "nvidia"
    )]
    runtime_handlers: Vec<String>,
    /// Say what the plugin would answer for a container of this config.json (native CDI or
    /// raw adjustments, hooks or not) and exit, without connecting.
    #[arg(long, value_name = "CONFIG_JSON")]
    explain: Option<PathBuf>,
    /// Post warnings and refusals as Kubernetes events with this kubeconfig's current context
    /// (a node's /etc/kubernetes/kubelet.conf may); default: the pod's service account when
    /// run in a pod, else no events.
    #[arg(long, value_name = "PATH")]
    kubeconfig: Option<PathBuf>,
    /// The service account's token and ca.crt, used when $KUBERNETES_SERVICE_HOST is set and
    /// there is no --kubeconfig (the DaemonSet mounts them here for the chrooted plugin).
    #[arg(long, value_name = "DIR", default_value = nvshim_nri::events::SERVICE_ACCOUNT)]
    service_account_dir: PathBuf,
    /// The node, as the events name their source; default $NODE_NAME, else the hostname.
    #[arg(long)]
    node_name: Option<String>,
    /// With --explain: the engine, as its NRI `Configure` names it.
    #[arg(long, default_value = "containerd", requires = "explain")]
    engine: String,
    /// With --explain: the engine's version (containerd 2.1 and CRI-O 1.34 inject CDI).
    #[arg(long, default_value = "2.1.0", requires = "explain")]
    engine_version: String,
}

/// `--explain`: the answer to a container of `path`, as the log would give it.
fn explain(config: &Config, options: &Options, engine: Engine, path: &Path) -> anyhow::Result<()> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let doc: serde_json::Value = serde_json::from_slice(&bytes)
        .with_context(|| format!("{} is not JSON", path.display()))?;
    let container = adjust::container_of(&doc);
    let tools = Tools::in_process(config, install::self_exe().as_deref());
    let answer = adjust::answer(config, &tools, &engine, options, &container)
        .map_err(|e| anyhow::anyhow!("refused: {}", nvshim::report::error_text(&e)))?;
    println!("engine: {} {}", engine.name, engine.version);
    println!("answer: {}", answer.how.name());
    println!("served: {}", answer.served.join(", "));
    let hooks = answer.adjust.hooks.as_ref().map_or(0, |h| {
        h.prestart.len()
            + h.create_runtime.len()
            + h.create_container.len()
            + h.start_container.len()
            + h.poststart.len()
            + h.poststop.len()
    });
    println!("OCI hooks: {hooks}");
    let linux = answer.adjust.linux.as_ref();
    println!("device nodes: {}", linux.map_or(0, |l| l.devices.len()));
    println!("mounts: {}", answer.adjust.mounts.len());
    println!("CDI devices: {}", answer.adjust.cdi_devices.len());
    for d in &answer.dropped {
        println!("not done (--no-hooks): {d}");
    }
    for w in &answer.warnings {
        println!("warning: {w}");
    }
    Ok(())
}

/// The Kubernetes events sink: `--kubeconfig`, else the service account in a pod, else none
/// (said once in the log). Events are optional: a credential that cannot be used is a warning,
/// and the plugin serves containers without them.
fn events(cli: &Cli) -> Option<Events> {
    start_events(cli).unwrap_or_else(|e| {
        tracing::warn!("Kubernetes events off: {e:#}");
        None
    })
}

fn start_events(cli: &Cli) -> anyhow::Result<Option<Events>> {
    let api = match &cli.kubeconfig {
        Some(path) => ApiServer::from_kubeconfig(path)?,
        None => match ApiServer::in_cluster(&cli.service_account_dir) {
            Some(api) => api?,
            None => {
                tracing::info!("Kubernetes events off: no --kubeconfig and no service account (warnings go to this log only)");
                return Ok(None);
            }
        },
    };
    let node = match cli
        .node_name
        .clone()
        .or_else(|| std::env::var("NODE_NAME").ok())
    {
        Some(n) => n,
        None => nix::unistd::gethostname()
            .context("cannot read the hostname; give --node-name")?
            .to_string_lossy()
            .into_owned(),
    };
    tracing::info!(server = %api.server, node = %node, "Kubernetes events on");
    Ok(Some(Events::start(api, node)?))
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let config_path = cli
        .config
        .clone()
        .unwrap_or_else(|| Config::path_from_env(std::env::var_os("NVSHIM_CONFIG")));
    // Read now to fail early on a broken config; read again for every container.
    let config = Config::load(&config_path)?;
    if let Some(why) = &config.cache_dir_refused {
        tracing::warn!("{why}");
    }
    let options = Options {
        no_hooks: cli.no_hooks,
        no_native_cdi: cli.no_native_cdi,
        runtime_handlers: cli.runtime_handlers.clone(),
    };
    if let Some(path) = &cli.explain {
        let engine = Engine {
            name: cli.engine,
            version: cli.engine_version,
        };
        return explain(&config, &options, engine, path);
    }
    let events = events(&cli);
    let handler = Arc::new(Handler::new(config_path, options, cli.mandatory).with_events(events));
    let conn = Connection {
        socket: cli.socket,
        name: cli.name,
        index: cli.index,
    };
    plugin::run(&conn, handler)
}
