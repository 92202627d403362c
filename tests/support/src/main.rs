//! `nvshim-fake-host DIR [--gpus N] [--driver-version V] [--frontend-name NAME]
//!                  [--kernel-modules open|proprietary] [--mig N] [--system-libs]
//!                  [--gated] [--config FILE]`
//!
//! Builds a simulated GPU host in DIR (for the demo and the benchmarks) and prints its layout.
//! With `--mig N`, every GPU has N MIG devices (GPU instances 1..=N, compute instance 0 each:
//! their capability nodes and the driver's `mig-minors` table). With `--system-libs`, its
//! ld.so.cache also holds a real node's own libraries, as large as that node's
//! (`FakeHost::add_system_libraries`). With `--gated`, an HGX node's GDS, InfiniBand, GDRCopy
//! and NVSwitch nodes (`GatedDevices::hgx`). With `--config FILE`, also writes an nvshim config.toml
//! pointing at it. Needs root and gcc.
//!
//! `nvshim-fake-host --bundle DIR [--env KEY=VALUE]... -- ARGS...`
//!
//! Makes a busybox OCI bundle in DIR (as `runc spec` does, with `terminal: false` and
//! `CAP_MKNOD`) whose process is ARGS, with KEY=VALUE added to its environment.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use nvshim_testsupport::{Bundle, FakeHost, FakeHostSpec, KernelModules};

const USAGE: &str = "usage: nvshim-fake-host DIR [--gpus N] [--driver-version V] \
                     [--frontend-name nvidia|nvidia-frontend] \
                     [--kernel-modules open|proprietary] [--mig N] [--system-libs] \
                     [--gated] [--config FILE]\n       \
                     nvshim-fake-host --bundle DIR [--env KEY=VALUE]... -- ARGS...";

struct Args {
    dir: PathBuf,
    gpus: usize,
    driver_version: Option<String>,
    frontend_name: Option<String>,
    kernel_modules: KernelModules,
    mig: u32,
    system_libs: bool,
    gated: bool,
    config: Option<PathBuf>,
    bundle: bool,
    env: Vec<String>,
    process: Vec<String>,
}

fn parse_args() -> Result<Option<Args>> {
    let mut dir = None;
    let mut gpus = 2;
    let mut driver_version = None;
    let mut frontend_name = None;
    let mut kernel_modules = KernelModules::default();
    let mut mig = 0;
    let mut system_libs = false;
    let mut gated = false;
    let mut config = None;
    let mut bundle = false;
    let mut env = Vec::new();
    let mut process = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .with_context(|| format!("{name} needs a value\n{USAGE}"))
        };
        match arg.as_str() {
            "-h" | "--help" => return Ok(None),
            "--gpus" => {
                let v = value("--gpus")?;
                gpus = v
                    .parse()
                    .with_context(|| format!("--gpus {v:?} is not a number"))?;
            }
            "--driver-version" => driver_version = Some(value("--driver-version")?),
            "--frontend-name" => frontend_name = Some(value("--frontend-name")?),
            "--kernel-modules" => {
                kernel_modules = match value("--kernel-modules")?.as_str() {
                    "open" => KernelModules::Open,
                    "proprietary" => KernelModules::Proprietary,
                    v => bail!("--kernel-modules {v:?}: open or proprietary\n{USAGE}"),
                }
            }
            "--mig" => {
                let v = value("--mig")?;
                mig = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=7).contains(n))
                    .with_context(|| format!("--mig {v:?}: 1 to 7 MIG devices per GPU"))?;
            }
            "--system-libs" => system_libs = true,
            "--gated" => gated = true,
            "--config" => config = Some(PathBuf::from(value("--config")?)),
            "--bundle" => {
                bundle = true;
                dir = Some(PathBuf::from(value("--bundle")?));
            }
            "--env" => {
                let v = value("--env")?;
                if !v.contains('=') {
                    bail!("--env {v:?} is not KEY=VALUE");
                }
                env.push(v);
            }
            "--" => {
                process.extend(args.by_ref());
            }
            s if s.starts_with('-') => bail!("unknown option {s}\n{USAGE}"),
            _ if dir.is_none() => dir = Some(PathBuf::from(arg)),
            _ => bail!("unexpected argument {arg:?}\n{USAGE}"),
        }
    }
    let dir = dir.with_context(|| format!("missing DIR\n{USAGE}"))?;
    if bundle && process.is_empty() {
        bail!("--bundle needs the container's command after --\n{USAGE}");
    }
    if !bundle && (!env.is_empty() || !process.is_empty()) {
        bail!("--env and -- ARGS go with --bundle\n{USAGE}");
    }
    Ok(Some(Args {
        dir,
        gpus,
        driver_version,
        frontend_name,
        kernel_modules,
        mig,
        system_libs,
        gated,
        config,
        bundle,
        env,
        process,
    }))
}

fn main() -> ExitCode {
    match real_main() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nvshim-fake-host: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn real_main() -> Result<()> {
    let Some(args) = parse_args()? else {
        println!("{USAGE}");
        return Ok(());
    };
    if args.bundle {
        let process: Vec<&str> = args.process.iter().map(String::as_str).collect();
        let bundle = Bundle::new(&args.dir, &process)?;
        for kv in &args.env {
            if let Some((k, v)) = kv.split_once('=') {
                bundle.set_env(k, v)?;
            }
        }
        println!("busybox bundle at {}", bundle.dir().display());
        return Ok(());
    }
    let mut spec = FakeHostSpec::with_gpus(args.gpus);
    if let Some(v) = args.driver_version {
        spec.driver_version = v;
    }
    if let Some(n) = args.frontend_name {
        spec.frontend_name = n;
    }
    spec.kernel_modules = args.kernel_modules;
    if args.gated {
        spec.gated = Some(nvshim_testsupport::GatedDevices::hgx());
    }
    let host = FakeHost::build(&args.dir, &spec)?;
    if args.mig > 0 {
        let instances: Vec<(u32, u32, u32)> = host
            .gpus()
            .iter()
            .flat_map(|g| (1..=args.mig).map(move |gi| (g.minor, gi, 0)))
            .collect();
        host.add_mig_caps(&instances)?;
    }
    let system_libs = if args.system_libs {
        host.add_system_libraries()?
    } else {
        0
    };
    print!("{}", host.describe());
    if args.mig > 0 {
        println!(
            "  MIG: {} devices per GPU (caps nodes in dev/nvidia-caps)",
            args.mig
        );
    }
    if args.system_libs {
        println!("  system libraries: {system_libs} more in etc/ld.so.cache (a real node's)");
    }
    if let Some(config) = args.config {
        host.write_config(&config, "")?;
        println!("  nvshim config: {}", config.display());
    }
    Ok(())
}
