//! `nvshim-runtime`: an OCI runtime shim. Called exactly as runc is; edits the bundle on
//! `create` and `run`, then execs the low-level runtime with the same argv.

use std::ffi::OsString;
use std::process::ExitCode;

use nvshim::config::{Config, CONFIG_ENV};
use nvshim::{create, logging, runtime};

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    // A command line nvshim cannot scan is runc's to reject, unless nvshim had to edit.
    let inv = runtime::parse_args(&args).unwrap_or_default();
    let err = run(&args, &inv);
    let msg = format!("nvshim: {err:#}");
    tracing::error!("{msg}");
    if let Some(log) = &inv.log {
        logging::write_runc_error(log, inv.json_log(), &msg);
    }
    eprintln!("{msg}");
    ExitCode::FAILURE
}

/// Only returns on error: success is an exec.
fn run(args: &[OsString], inv: &runtime::Invocation) -> anyhow::Error {
    let config_path = Config::path_from_env(std::env::var_os(CONFIG_ENV));
    let config = match Config::load(&config_path) {
        Ok(c) => c,
        Err(e) => return e.into(),
    };
    logging::init(config.log_file.as_deref(), config.log_level, inv.debug);
    if inv.edits_bundle() {
        if let Err(e) = runtime::parse_args(args) {
            return e.into();
        }
    }
    let self_exe = std::env::current_exe().ok();
    // Find the runtime before touching the bundle: no runtime, no edit.
    let runc = match runtime::find_low_level_runtime(
        &config.low_level_runtimes,
        std::env::var_os("PATH").as_deref(),
        self_exe.as_deref(),
    ) {
        Ok(p) => p,
        Err(e) => return e.into(),
    };
    if inv.version && inv.subcommand.is_none() {
        // As NVIDIA's shim does: our version, then the low-level runtime's.
        println!("nvshim-runtime version {}", env!("CARGO_PKG_VERSION"));
        println!("low-level runtime: {}", runc.display());
    }
    if inv.edits_bundle() {
        let hook = create::hook_path(&config, self_exe.as_deref());
        if let Err(e) = create::create(&config, &inv.bundle_dir(), &hook) {
            return e.into();
        }
    }
    tracing::debug!(runtime = %runc.display(), "exec");
    runtime::exec(&runc, args).into()
}
