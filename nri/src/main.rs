//! `nvshim-nri`: the NRI plugin daemon (README.md, "Kubernetes without a runtime class").

use std::path::PathBuf;
use std::sync::Arc;

use clap::Parser;
use nvshim::config::Config;
use nvshim_nri::adjust::Options;
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
    /// Fail a container whose requested device nodes the engine dropped (default: warn).
    #[arg(long)]
    mandatory: bool,
    /// Never put OCI hooks in an adjustment (for engines whose NRI validator rejects them).
    #[arg(long)]
    no_hooks: bool,
    /// Answer CDI requests with raw device nodes and mounts even where the engine injects
    /// CDI devices itself.
    #[arg(long)]
    no_native_cdi: bool,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let config_path = cli
        .config
        .unwrap_or_else(|| Config::path_from_env(std::env::var_os("NVSHIM_CONFIG")));
    // Read now to fail early on a broken config; read again for every container.
    let config = Config::load(&config_path)?;
    if let Some(why) = &config.cache_dir_refused {
        tracing::warn!("{why}");
    }
    let options = Options {
        no_hooks: cli.no_hooks,
        no_native_cdi: cli.no_native_cdi,
    };
    let handler = Arc::new(Handler::new(config_path, options, cli.mandatory));
    let conn = Connection {
        socket: cli.socket,
        name: cli.name,
        index: cli.index,
    };
    plugin::run(&conn, handler)
}
