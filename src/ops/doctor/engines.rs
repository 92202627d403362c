//! doctor's engine checks: is each engine (Docker, containerd, CRI-O) installed, does it
//! register nvshim-runtime as its GPU runtime, does its own CDI read nvshim's spec
//! directories; then the low-level runtime nvshim execs and the hook it writes. None of them
//! reads the GPU host: they need only the [`Options`] paths.

use std::path::{Path, PathBuf};

use super::{check, Check, Options, Status};
use crate::install;
use crate::ops::engine::{self, Engine};
use crate::runtime;

fn is_executable(p: &Path) -> bool {
    crate::runtime::is_executable_file(p).is_some()
}

pub(super) fn engine_check(engine: Engine, opts: &Options) -> Check {
    let (config, daemon, service) = match engine {
        Engine::Docker => (&opts.docker_config, "dockerd", "docker"),
        Engine::Containerd => (&opts.containerd_config, "containerd", "containerd"),
        Engine::Crio => (&opts.crio_config, "crio", "crio"),
    };
    let name = format!("engine-{engine}");
    let installed =
        config.exists() || crate::runtime::find_on_path(opts.path_var.as_deref(), daemon).is_some();
    if !installed {
        return check(
            &name,
            Status::Skip,
            format!(
                "not installed (no {}, no {daemon} on PATH)",
                config.display()
            ),
            None,
        );
    }
    let mut fix = format!("nvshim runtime configure --runtime {engine}");
    if *config != engine.default_config() {
        fix.push_str(&format!(" --config {}", config.display()));
    }
    fix.push_str(&format!(" && systemctl restart {service}"));
    // The same parsers `nvshim runtime configure` edits with, read-only.
    let mut eopts = engine::Options::new(engine, PathBuf::from(engine::DEFAULT_RUNTIME_PATH));
    eopts.drop_in = engine.default_drop_in(config);
    eopts.config = config.clone();
    eopts.engine_version = engine::detect_version(engine, opts.path_var.as_deref());
    let reg = match engine::registration(&eopts) {
        Ok(r) => r,
        // Only a file that does not parse stops the engine; a shape nvshim does not read may
        // still be one the engine takes.
        Err(e @ engine::EngineError::Parse { .. }) => {
            return check(
                &name,
                Status::Error,
                format!("{e}: {engine} will not start with it"),
                Some(format!("fix the file, then {fix}")),
            )
        }
        Err(e) => {
            return check(
                &name,
                Status::Error,
                format!("nvshim cannot read the runtime from it: {e}"),
                Some(format!("fix the file, then {fix}")),
            )
        }
    };
    let mut c = runtime_check(engine, &name, &fix, &eopts, &reg);
    if let Some(w) = reg.warnings.first() {
        if c.status == Status::Ok {
            c.status = Status::Warning;
        }
        c.message.push_str(&format!("; {w}"));
    }
    if reg.cdi_enabled == Some(false) {
        if let Some(spec) = first_cdi_spec(&opts.config.cdi_spec_dirs) {
            let setting = reg.cdi_setting.as_deref().unwrap_or("its config");
            let why = format!(
                "CDI is off in {engine} ({setting}) while {} exists: the CDI devices of DRA \
                 claims and device plugins (and `--device nvidia.com/gpu=...`) are dropped",
                spec.display()
            );
            if c.status == Status::Ok {
                c.status = Status::Warning;
                c.message = why;
                c.fix = Some(fix.clone());
            } else {
                c.message.push_str(&format!("; {why}"));
            }
        }
    }
    if let (Some(true), Some(engine_dirs)) = (reg.cdi_enabled, &reg.cdi_spec_dirs) {
        // The engine resolves CDI names itself (containerd: CRI CDI devices and `cdi.k8s.io/*`
        // annotations; Docker: `--device`, `--gpus` from 29.2) from its own directories.
        let unread = opts.config.cdi_spec_dirs.iter().find_map(|d| {
            let spec = first_cdi_spec(std::slice::from_ref(d))?;
            (!engine_dirs.iter().any(|e| same_dir(e, d))).then_some(spec)
        });
        if let Some(spec) = unread {
            let list: Vec<String> = engine_dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect();
            let key = match engine {
                Engine::Docker => "cdi-spec-dirs",
                _ => "cdi_spec_dirs",
            };
            let why = format!(
                "{engine}'s own CDI reads specs from {} only, so the devices of {} (in nvshim's cdi-spec-dirs) fail there with \"unresolvable CDI devices\"",
                list.join(", "),
                spec.display()
            );
            let dir_fix = format!(
                "add {} to {key} in {}, then restart {engine}",
                spec.parent().unwrap_or(Path::new("/")).display(),
                config.display()
            );
            if c.status == Status::Ok {
                c.status = Status::Warning;
                c.message = why;
                c.fix = Some(dir_fix);
            } else {
                c.message.push_str(&format!("; {why}"));
            }
        }
    }
    c
}

/// Whether two directory paths name the same directory (`/var/run/cdi` is `/run/cdi` where
/// `/var/run` links to `/run`); lexically when either cannot be resolved.
fn same_dir(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => {
            crate::edits::go_clean(&a.to_string_lossy())
                == crate::edits::go_clean(&b.to_string_lossy())
        }
    }
}

/// The first CDI spec file (`.yaml`, `.yml`, `.json`) in `dirs`: a DRA driver's or a device
/// plugin's, or one `nvshim cdi generate` wrote.
fn first_cdi_spec(dirs: &[PathBuf]) -> Option<PathBuf> {
    dirs.iter().find_map(|d| {
        let mut specs: Vec<PathBuf> = std::fs::read_dir(d)
            .ok()?
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.is_file()
                    && matches!(
                        p.extension().and_then(|e| e.to_str()),
                        Some("yaml" | "yml" | "json")
                    )
            })
            .collect();
        specs.sort();
        specs.into_iter().next()
    })
}

/// The runtime's registration: present, a binary, nvshim-runtime, set up as `configure` sets
/// it up.
fn runtime_check(
    engine: Engine,
    name: &str,
    fix: &str,
    eopts: &engine::Options,
    reg: &engine::Registration,
) -> Check {
    let name = name.to_string();
    let fix = fix.to_string();
    let config = &eopts.config;
    let runtime_name = engine::DEFAULT_RUNTIME_NAME;
    let mut eopts = eopts.clone();
    let (files, configured) = (reg.files.clone(), reg.binary.clone());
    let shown: Vec<String> = files
        .iter()
        .filter(|f| f.exists())
        .map(|f| f.display().to_string())
        .collect();
    let shown = if shown.is_empty() {
        config.display().to_string()
    } else {
        shown.join(", ")
    };
    let Some(binary) = configured else {
        return check(
            &name,
            Status::Error,
            format!(
                "no runtime {runtime_name:?} in {shown}: `--runtime={runtime_name}` and the RuntimeClass {runtime_name:?} fail"
            ),
            Some(fix),
        );
    };
    if binary.is_empty() {
        return check(
            &name,
            Status::Error,
            format!("runtime {runtime_name:?} in {shown} names no binary, so {engine} runs plain runc for it"),
            Some(fix),
        );
    }
    let path = Path::new(&binary);
    if !path.is_absolute() || !is_executable(path) {
        return check(
            &name,
            Status::Error,
            format!(
                "runtime {runtime_name:?} in {shown} points at {binary}, which is not an executable file"
            ),
            Some(fix),
        );
    }
    let base = path.file_name().map(|n| n.to_string_lossy().into_owned());
    if base.as_deref() != Some("nvshim-runtime") {
        return check(
            &name,
            Status::Warning,
            format!(
                "runtime {runtime_name:?} in {shown} points at {binary}, not at nvshim-runtime"
            ),
            Some(fix),
        );
    }
    // The engine writer's own verdict: a configure that would change nothing means the runtime
    // is set up exactly as nvshim sets it up (CDI annotations passed through, runc's options
    // carried over, ...).
    eopts.runtime_path = path.to_path_buf();
    match engine::configure(&eopts) {
        Ok(plan) if plan.is_empty() => check(
            &name,
            Status::Ok,
            format!("runtime {runtime_name:?} is {binary} ({shown})"),
            None,
        ),
        Ok(plan) => {
            let changed: Vec<String> = plan
                .changes
                .iter()
                .map(|c| c.path.display().to_string())
                .collect();
            check(
                &name,
                Status::Warning,
                format!(
                    "runtime {runtime_name:?} is {binary}, but `nvshim runtime configure` would still change {} (`--dry-run` shows how)",
                    changed.join(", ")
                ),
                Some(fix),
            )
        }
        Err(e) => check(&name, Status::Error, e.to_string(), Some(fix)),
    }
}

pub(super) fn low_level_runtime_check(opts: &Options) -> Check {
    let runtime_exe = opts
        .self_exe
        .as_deref()
        .and_then(Path::parent)
        .map(|d| d.join("nvshim-runtime"));
    match runtime::find_low_level_runtime(
        &opts.config.low_level_runtimes,
        opts.path_var.as_deref(),
        runtime_exe.as_deref(),
    ) {
        Ok(p) => check(
            "low-level-runtime",
            Status::Ok,
            format!("{} (nvshim-runtime execs it)", p.display()),
            None,
        ),
        Err(e) => check(
            "low-level-runtime",
            Status::Error,
            e.to_string(),
            Some(format!(
                "apt-get install runc (or dnf install runc), or set low-level-runtimes in {}",
                opts.config_path.display()
            )),
        ),
    }
}

pub(super) fn hook_check(opts: &Options) -> Check {
    let hook = install::hook_path(&opts.config, opts.self_exe.as_deref());
    if is_executable(&hook) {
        check(
            "hook",
            Status::Ok,
            format!("{} (written into GPU containers' hooks)", hook.display()),
            None,
        )
    } else {
        check(
            "hook",
            Status::Error,
            format!(
                "{} is not an executable file: every GPU container's createContainer hook would fail",
                hook.display()
            ),
            Some(format!(
                "install nvshim-hook there, or set hook-path in {}",
                opts.config_path.display()
            )),
        )
    }
}
