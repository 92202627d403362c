//! `nvshim-runtime`: an OCI runtime shim. Called exactly as runc is; edits the bundle on
//! `create` and `run`, then execs the low-level runtime with the same argv.
//!
//! `no_main`, as `nvshim-hook` (hooks/src/main.rs): the C `main` below skips Rust's runtime
//! set-up, for two reasons.
//! - Fidelity: that set-up sets SIGPIPE to "ignore", and an ignored signal stays ignored across
//!   `execve` (signal(7)), so runc started through the shim ran with SIGPIPE ignored while runc
//!   started directly did not. Skipping it hands runc exactly the signal dispositions the engine
//!   gave the shim.
//! - Cost: it also installs the stack-overflow handler (a sigaltstack and its mapping) and has
//!   glibc parse `/proc/self/maps` for the main thread's stack bounds: about 100,000
//!   instructions and 19 system calls on every call, pass-through ones included
//!   (docs/benchmarks.md).
//!
//! The arguments are read from `main`'s own (`nvshim_hook::cli::args_of_main`: std finds them
//! before `main` only on glibc). What the runtime did that still matters is done here: fds 0-2
//! are made to exist, so no file the shim opens (config.json's temporary file) can land on them
//! and receive an error message.

#![no_main]

use std::ffi::OsString;
use std::os::raw::{c_char, c_int};

use nvshim::config::{Config, CONFIG_ENV};
use nvshim::{create, install, logging, runtime};

/// # Safety
/// Called by the C runtime only, with its own argc and argv.
#[no_mangle]
pub unsafe extern "C" fn main(argc: c_int, argv: *const *const c_char) -> c_int {
    // `/dev/null` on a closed fd 0, 1 or 2, as Rust's runtime does before `main` (and so as
    // the shim always did: runc sees the same fds as before).
    nvshim_hook::cli::ensure_std_fds();
    // SAFETY: the argc and argv the C runtime passed to `main`.
    let all: Vec<OsString> = unsafe { nvshim_hook::cli::args_of_main(argc, argv) };
    let args = all.get(1..).unwrap_or_default();
    // A command line nvshim cannot scan is runc's to reject, unless nvshim had to edit.
    let inv = runtime::parse_args(args).unwrap_or_default();
    let err = run(args, &inv);
    let msg = format!("nvshim: {}", nvshim::report::error_text(err.as_ref()));
    tracing::error!("{msg}");
    if let Some(log) = &inv.log {
        logging::write_runc_error(log, inv.json_log(), &msg);
    }
    eprintln!("{msg}");
    1
}

/// Only returns on error: success is an exec.
fn run(args: &[OsString], inv: &runtime::Invocation) -> anyhow::Error {
    let config_path = Config::path_from_env(std::env::var_os(CONFIG_ENV));
    let mut config = match Config::load(&config_path) {
        Ok(c) => c,
        Err(e) => return e.into(),
    };
    logging::init(config.log_file.as_deref(), config.log_level, inv.debug);
    // Once per create, the one invocation that uses the caches.
    if let Some(why) = config
        .cache_dir_refused
        .as_ref()
        .filter(|_| inv.edits_bundle())
    {
        tracing::warn!("{why}");
    }
    if inv.edits_bundle() {
        if let Err(e) = runtime::parse_args(args) {
            return e.into();
        }
    }
    let self_exe = install::self_exe();
    // Find the runtime before touching the bundle: no runtime, no edit.
    let runc = match runtime::find_low_level_runtime(
        &config.low_level_runtimes,
        std::env::var_os("PATH").as_deref(),
        self_exe.as_deref(),
    ) {
        Ok(p) => p,
        Err(e) => return e.into(),
    };
    config.profile = runtime::profile_for(config.profile, &runc);
    if inv.version && inv.subcommand.is_none() {
        // As NVIDIA's shim does: our version, then the low-level runtime's.
        println!("nvshim-runtime version {}", env!("CARGO_PKG_VERSION"));
        println!("low-level runtime: {}", runc.display());
    }
    if inv.subcommand.as_deref() == Some("features") {
        return features(&runc, args, &config);
    }
    if inv.edits_bundle() {
        let tools = install::Tools::for_runtime(&config, self_exe.as_deref());
        match create::create(&config, &inv.bundle_dir(), &tools) {
            // The plan holds the parsed and the edited config.json; freeing them node by node
            // just before `execv` replaces the whole address space was about 10% of a create's
            // instructions (callgrind, docs/benchmarks.md).
            // `None`: config.json asks for no GPU and nvshim cannot read it: runc's to judge.
            Ok(plan) => std::mem::forget(plan),
            Err(e) => return e.into(),
        }
    }
    tracing::debug!(runtime = %runc.display(), "exec");
    runtime::exec(&runc, args).into()
}

/// `features`: the low-level runtime's answer with what nvshim changes (`nvshim::features`);
/// its exit status is the runtime's. An answer that is not a JSON object (an error, a runtime
/// without `features`) passes through unchanged, with a warning in the log.
fn features(runc: &std::path::Path, args: &[OsString], config: &Config) -> anyhow::Error {
    use std::io::Write;
    let (status, stdout) = match runtime::stdout_of(runc, args) {
        Ok(o) => o,
        Err(e) => return e.into(),
    };
    let out = match nvshim::features::answer(&stdout, runc, config) {
        Some(out) => out,
        None => {
            tracing::warn!(runtime = %runc.display(), %status, "features: the low-level runtime's answer is not a JSON object; passed on unchanged");
            stdout
        }
    };
    let mut w = std::io::stdout().lock();
    if let Err(e) = w.write_all(&out).and_then(|()| w.flush()) {
        return anyhow::anyhow!("writing the features answer: {e}");
    }
    // The runtime's own status; a signal counts as runc's failure.
    std::process::exit(status.code().unwrap_or(1))
}
