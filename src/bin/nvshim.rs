//! `nvshim`: the operator's tool. A thin clap front over the library.

use std::path::PathBuf;
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("nvshim: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let path = cli
        .config
        .unwrap_or_else(|| Config::path_from_env(std::env::var_os(CONFIG_ENV)));
    let config = Config::load(&path).with_context(|| "loading the nvshim config")?;
    match cli.command {
        Command::Config => {
            println!("# {}", path.display());
            println!("{config:#?}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
