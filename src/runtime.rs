//! The runc command line as nvshim sees it, finding the low-level runtime, and exec'ing it.
//!
//! The shim must accept every runc flag, including ones it does not model (`--rootless`,
//! `--criu`, future flags), so argv is scanned leniently, the way runc's urfave/cli parses it
//! (`-flag` and `--flag`, `--flag=value` or `--flag value`), and passed on untouched. Strict
//! clap parsing would reject flags nvshim has never heard of (docs/nvidia-behaviour.md §1.1).

use std::ffi::{CString, OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::config::Profile;

#[derive(Debug, Error)]
pub enum RuntimeError {
    #[error("no low-level runtime found: none of {tried} is an executable file on PATH or in /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin; install runc or crun, or set low-level-runtimes in the nvshim config to an absolute path")]
    NotFound { tried: String },
    #[error("the {flag} option requires an argument; fix the runc command line the engine or script passed to nvshim-runtime")]
    MissingValue { flag: String },
    #[error("cannot exec low-level runtime {path}: {source}; check that it is a working runc or crun (low-level-runtimes in the nvshim config)")]
    Exec { path: PathBuf, source: nix::Error },
    #[error("argument contains a NUL byte: {0:?}; fix the command line the engine or script passed to nvshim-runtime")]
    NulInArgument(OsString),
    #[error("cannot run low-level runtime {path}: {source}; check that it is a working runc or crun (low-level-runtimes in the nvshim config)")]
    Run {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Global flags that take a value, of runc (main.go: `--log`, `--log-format`, `--root`,
/// `--criu`, `--rootless`) and of crun (src/crun.c argp options: also `--cgroup-manager`,
/// `--log-level`, `--handler`). Both accept `--flag value` as well as `--flag=value`: a flag
/// missing here makes its value look like the subcommand, so the bundle would pass unedited.
const GLOBAL_VALUE_FLAGS: &[&str] = &[
    "log",
    "log-format",
    "log-level",
    "root",
    "criu",
    "rootless",
    "cgroup-manager",
    "handler",
];
/// Value flags of `create` and `run` besides `--bundle` (runc create.go, run.go).
const CREATE_VALUE_FLAGS: &[&str] = &["console-socket", "pid-file", "preserve-fds", "pidfd-socket"];

/// What nvshim needs from a runc command line. The argv itself is never changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Invocation {
    /// The subcommand (`create`, `run`, `start`, ...), if any.
    pub subcommand: Option<String>,
    /// `--bundle`/`-b`, last one wins; `None` means the current directory.
    pub bundle: Option<PathBuf>,
    /// runc's `--log` file.
    pub log: Option<PathBuf>,
    /// runc's `--log-format` (`text` or `json`).
    pub log_format: Option<String>,
    /// `--debug` was given.
    pub debug: bool,
    /// `--version`/`-v` was given (before any subcommand).
    pub version: bool,
}

impl Invocation {
    /// True when nvshim edits the bundle before handing over: `create`, and `run` (which is
    /// create + start in one call; runc bundles in CI use it).
    pub fn edits_bundle(&self) -> bool {
        matches!(self.subcommand.as_deref(), Some("create" | "run"))
    }

    /// The bundle directory: `--bundle`, else the current directory (runc's default).
    pub fn bundle_dir(&self) -> PathBuf {
        self.bundle.clone().unwrap_or_else(|| PathBuf::from("."))
    }

    pub fn json_log(&self) -> bool {
        self.log_format.as_deref() == Some("json")
    }
}

/// Splits `-x`, `--x`, `--x=v` into (name, inline value); `None` for a non-flag.
fn flag(arg: &OsStr) -> Option<(&str, Option<&OsStr>)> {
    let bytes = arg.as_bytes();
    if bytes.len() < 2 || bytes[0] != b'-' {
        return None;
    }
    let body = if bytes.starts_with(b"--") {
        &bytes[2..]
    } else {
        &bytes[1..]
    };
    let (name, value) = match body.iter().position(|&b| b == b'=') {
        Some(i) => (&body[..i], Some(OsStr::from_bytes(&body[i + 1..]))),
        None => (body, None),
    };
    std::str::from_utf8(name).ok().map(|n| (n, value))
}

/// A flag's value: inline (`--x=v`), else the next argument (`--x v`), which `i` then
/// points at; `flag` names the flag in the error when there is none.
fn flag_value(
    args: &[OsString],
    i: &mut usize,
    inline: Option<&OsStr>,
    flag: impl FnOnce() -> String,
) -> Result<OsString, RuntimeError> {
    if let Some(v) = inline {
        return Ok(v.to_os_string());
    }
    *i += 1;
    args.get(*i)
        .cloned()
        .ok_or_else(|| RuntimeError::MissingValue { flag: flag() })
}

/// Scans runc's argv (without argv[0]).
pub fn parse_args(args: &[OsString]) -> Result<Invocation, RuntimeError> {
    let mut inv = Invocation::default();
    let mut i = 0;
    // Global flags, up to the subcommand.
    while i < args.len() {
        let arg = &args[i];
        if arg == "--" {
            i += 1;
            break;
        }
        let Some((name, inline)) = flag(arg) else {
            break;
        };
        if GLOBAL_VALUE_FLAGS.contains(&name) {
            let value = flag_value(args, &mut i, inline, || format!("--{name}"))?;
            match name {
                "log" => inv.log = Some(PathBuf::from(value)),
                "log-format" => inv.log_format = Some(value.to_string_lossy().into_owned()),
                _ => {}
            }
        } else {
            match name {
                "debug" => inv.debug = inline.is_none_or(|v| v != "false"),
                "version" | "v" => inv.version = true,
                _ => {}
            }
        }
        i += 1;
    }
    let Some(sub) = args.get(i) else {
        return Ok(inv);
    };
    inv.subcommand = Some(sub.to_string_lossy().into_owned());
    if !inv.edits_bundle() {
        return Ok(inv);
    }
    i += 1;
    while i < args.len() {
        let arg = &args[i];
        if arg == "--" {
            break;
        }
        if let Some((name, inline)) = flag(arg) {
            let takes_value = name == "bundle" || name == "b" || CREATE_VALUE_FLAGS.contains(&name);
            if takes_value {
                let value =
                    flag_value(args, &mut i, inline, || arg.to_string_lossy().into_owned())?;
                if name == "bundle" || name == "b" {
                    inv.bundle = Some(PathBuf::from(value));
                }
            }
        }
        i += 1;
    }
    Ok(inv)
}

/// Directories searched after `$PATH`, as NVIDIA's runtime does (pkg/lookup/path.go), so a
/// runtime is found even when containerd starts the shim with a minimal PATH.
const DEFAULT_SEARCH_DIRS: &[&str] = &[
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
];

/// `path`'s metadata when it is a regular file (symlinks followed) with an execute bit.
pub fn is_executable_file(path: &Path) -> Option<std::fs::Metadata> {
    let meta = std::fs::metadata(path).ok()?;
    (meta.is_file() && meta.permissions().mode() & 0o111 != 0).then_some(meta)
}

/// The first executable file `name` in the directories of `path_var` (a `$PATH` value).
pub fn find_on_path(path_var: Option<&OsStr>, name: &str) -> Option<PathBuf> {
    std::env::split_paths(path_var?)
        .map(|d| d.join(name))
        .find(|p| is_executable_file(p).is_some())
}

/// Finds the first low-level runtime from `candidates` (names searched on `path_var` then the
/// default dirs, or absolute paths). `self_exe` is skipped, so an nvshim installed under the
/// name `runc` never execs itself in a loop.
pub fn find_low_level_runtime(
    candidates: &[String],
    path_var: Option<&OsStr>,
    self_exe: Option<&Path>,
) -> Result<PathBuf, RuntimeError> {
    let self_id = self_exe
        .and_then(|p| std::fs::metadata(p).ok())
        .map(|m| (m.dev(), m.ino()));
    let is_self = |m: &std::fs::Metadata| Some((m.dev(), m.ino())) == self_id;
    let mut dirs: Vec<PathBuf> = path_var
        .map(|p| std::env::split_paths(p).collect())
        .unwrap_or_default();
    for d in DEFAULT_SEARCH_DIRS {
        if !dirs.iter().any(|x| x == Path::new(d)) {
            dirs.push(PathBuf::from(d));
        }
    }
    for candidate in candidates {
        if candidate.contains('/') {
            let path = PathBuf::from(candidate);
            if let Some(m) = is_executable_file(&path) {
                if !is_self(&m) {
                    return Ok(path);
                }
            }
            continue;
        }
        for dir in &dirs {
            let path = dir.join(candidate);
            if let Some(m) = is_executable_file(&path) {
                if !is_self(&m) {
                    return Ok(path);
                }
            }
        }
    }
    Err(RuntimeError::NotFound {
        tried: if candidates.is_empty() {
            "nothing (low-level-runtimes is empty)".into()
        } else {
            candidates.join(", ")
        },
    })
}

/// What [`Profile::Auto`] means when nvshim execs `runtime`: [`Profile::Sandbox`] for gVisor's
/// `runsc` and Kata's OCI runtimes (`kata-runtime`, `kata-qemu`, ...), named so or a link to a
/// file named so; they skip or refuse OCI hooks and run the container in their own kernel,
/// where the host's `/proc` overmount and daemon sockets mean nothing. Other settings stand.
pub fn profile_for(configured: Profile, runtime: &Path) -> Profile {
    if configured != Profile::Auto {
        return configured;
    }
    let sandboxed = |p: &Path| {
        p.file_name()
            .and_then(OsStr::to_str)
            .is_some_and(|n| n == "runsc" || n.starts_with("kata"))
    };
    // One `readlink` (EINVAL for a plain file): a create pays nothing more.
    let target = std::fs::read_link(runtime).ok();
    if sandboxed(runtime) || target.as_deref().is_some_and(sandboxed) {
        Profile::Sandbox
    } else {
        Profile::Standard
    }
}

/// Replaces this process with `runtime`, argv unchanged after argv[0], environment unchanged
/// (runc needs e.g. `NOTIFY_SOCKET` and `XDG_RUNTIME_DIR` from its caller). Only returns on error.
pub fn exec(runtime: &Path, args: &[OsString]) -> RuntimeError {
    let to_c = |s: &OsStr| {
        CString::new(s.as_bytes()).map_err(|_| RuntimeError::NulInArgument(s.to_os_string()))
    };
    let path = match to_c(runtime.as_os_str()) {
        Ok(p) => p,
        Err(e) => return e,
    };
    let mut argv = Vec::with_capacity(args.len() + 1);
    argv.push(path.clone());
    for a in args {
        match to_c(a) {
            Ok(c) => argv.push(c),
            Err(e) => return e,
        }
    }
    match nix::unistd::execv(&path, &argv) {
        Err(source) => RuntimeError::Exec {
            path: runtime.to_path_buf(),
            source,
        },
        Ok(never) => match never {},
    }
}

/// Runs `runtime` with `args` (argv unchanged, environment and stdin/stderr inherited) and
/// returns its exit status and stdout: for `features`, whose answer nvshim adjusts.
pub fn stdout_of(
    runtime: &Path,
    args: &[OsString],
) -> Result<(std::process::ExitStatus, Vec<u8>), RuntimeError> {
    let out = std::process::Command::new(runtime)
        .args(args)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|source| RuntimeError::Run {
            path: runtime.to_path_buf(),
            source,
        })?;
    Ok((out.status, out.stdout))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(args: &[&str]) -> Invocation {
        let v: Vec<OsString> = args.iter().map(OsString::from).collect();
        parse_args(&v).unwrap()
    }

    #[test]
    fn containerd_create_line() {
        // What containerd's runc shim runs (runc/v2 shim, go-runc).
        let inv = scan(&[
            "--root",
            "/run/containerd/runc/k8s.io",
            "--log",
            "/run/containerd/io.containerd.runtime.v2.task/k8s.io/abc/log.json",
            "--log-format",
            "json",
            "--systemd-cgroup",
            "create",
            "--bundle",
            "/run/containerd/io.containerd.runtime.v2.task/k8s.io/abc",
            "--pid-file",
            "/run/x/init.pid",
            "abc",
        ]);
        assert_eq!(inv.subcommand.as_deref(), Some("create"));
        assert_eq!(
            inv.bundle.as_deref(),
            Some(Path::new(
                "/run/containerd/io.containerd.runtime.v2.task/k8s.io/abc"
            ))
        );
        assert!(inv.json_log());
        assert!(inv.edits_bundle());
    }

    #[test]
    fn bundle_spellings() {
        for (args, want) in [
            (&["create", "-b", "/b1", "id"][..], Some("/b1")),
            (&["create", "--bundle=/b2", "id"], Some("/b2")),
            (&["create", "-bundle", "/b3", "id"], Some("/b3")),
            (&["create", "-b=/b4", "id"], Some("/b4")),
            (&["run", "-d", "--bundle", "/b5", "id"], Some("/b5")),
            (
                &["create", "-b", "/x", "--bundle", "/last", "id"],
                Some("/last"),
            ),
            (&["create", "id"], None),
            // `create` as the value of --pid-file is not the subcommand's bundle.
            (&["create", "--pid-file", "-b", "id"], None),
        ] {
            assert_eq!(
                scan(args).bundle.as_deref(),
                want.map(Path::new),
                "{args:?}"
            );
        }
    }

    #[test]
    fn create_as_a_value_is_not_the_subcommand() {
        let inv = scan(&["--root", "create", "start", "x"]);
        assert_eq!(inv.subcommand.as_deref(), Some("start"));
        assert!(!inv.edits_bundle());
        let inv = scan(&["--log=create", "state", "create"]);
        assert_eq!(inv.subcommand.as_deref(), Some("state"));
    }

    /// Every value-taking global flag of runc and crun, in both spellings, before `create` or
    /// `run` with the bundle flag in every position (docs/reliability.md, "Request parsing
    /// classes").
    #[test]
    fn global_value_flags_table() {
        let globals: &[(&str, &str)] = &[
            ("--root", "/run/runc"),
            ("--log", "/tmp/l.json"),
            ("--log-format", "json"),
            ("--log-level", "debug"),
            ("--criu", "/usr/sbin/criu"),
            ("--rootless", "false"),
            ("--cgroup-manager", "cgroupfs"),
            ("--cgroup-manager", "systemd"),
            ("--handler", "wasm"),
            ("-root", "/run/runc"),
        ];
        for (flag, value) in globals {
            let joined = format!("{flag}={value}");
            let forms: Vec<Vec<&str>> = vec![vec![flag, value], vec![joined.as_str()]];
            for form in &forms {
                for sub in ["create", "run"] {
                    for bflag in ["--bundle", "-b", "--bundle=", "-b="] {
                        let b = format!("{bflag}/bundles/x");
                        let bundle_args: Vec<&str> = if bflag.ends_with('=') {
                            vec![b.as_str()]
                        } else {
                            vec![bflag, "/bundles/x"]
                        };
                        // Bundle flag first, after another create flag, and last.
                        let positions: [Vec<&str>; 3] = [
                            [bundle_args.clone(), vec!["--pid-file", "/p", "id"]].concat(),
                            [vec!["--pid-file", "/p"], bundle_args.clone(), vec!["id"]].concat(),
                            [vec!["--pid-file", "/p", "id"], bundle_args.clone()].concat(),
                        ];
                        for tail in &positions {
                            let mut argv: Vec<&str> = vec!["--debug"];
                            argv.extend(form.iter());
                            argv.push(sub);
                            argv.extend(tail.iter());
                            let inv = scan(&argv);
                            assert_eq!(inv.subcommand.as_deref(), Some(sub), "{argv:?}");
                            assert_eq!(
                                inv.bundle.as_deref(),
                                Some(Path::new("/bundles/x")),
                                "{argv:?}"
                            );
                            assert!(inv.edits_bundle(), "{argv:?}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn passthrough_commands() {
        for sub in [
            "start", "state", "kill", "delete", "exec", "ps", "list", "events", "update",
        ] {
            assert!(!scan(&[sub, "x"]).edits_bundle(), "{sub}");
        }
        assert!(scan(&["--version"]).version);
        assert_eq!(scan(&[]).subcommand, None);
    }

    #[test]
    fn missing_bundle_value_is_an_error() {
        let v: Vec<OsString> = ["create", "--bundle"].iter().map(OsString::from).collect();
        assert!(matches!(
            parse_args(&v),
            Err(RuntimeError::MissingValue { .. })
        ));
    }

    #[test]
    fn finds_runtime_and_skips_self() {
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("runc");
        std::fs::write(&fake, b"#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = dir.path().as_os_str();
        let found = find_low_level_runtime(&["runc".into()], Some(path), None).unwrap();
        assert_eq!(found, fake);
        // The same file as the running shim is skipped.
        let err = find_low_level_runtime(
            &[fake.to_string_lossy().into_owned()],
            Some(path),
            Some(&fake),
        );
        assert!(matches!(err, Err(RuntimeError::NotFound { .. })));
        let err = find_low_level_runtime(&["no-such-runtime-x".into()], Some(path), None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("no-such-runtime-x"), "{err}");
    }

    #[test]
    fn sandboxed_runtimes_choose_the_sandbox_profile() {
        let dir = tempfile::tempdir().unwrap();
        let runsc = dir.path().join("runsc");
        std::fs::write(&runsc, b"#!/bin/sh\n").unwrap();
        // An engine that only knows `runc` pointed at gVisor through a link.
        let runc = dir.path().join("runc");
        std::os::unix::fs::symlink(&runsc, &runc).unwrap();
        for (path, want) in [
            (runsc.as_path(), Profile::Sandbox),
            (runc.as_path(), Profile::Sandbox),
            (Path::new("/opt/kata/bin/kata-runtime"), Profile::Sandbox),
            (Path::new("/usr/bin/kata-qemu"), Profile::Sandbox),
            (Path::new("/usr/sbin/runc"), Profile::Standard),
            (Path::new("/usr/bin/crun"), Profile::Standard),
        ] {
            assert_eq!(profile_for(Profile::Auto, path), want, "{}", path.display());
        }
        // A setting other than `auto` is kept whatever the runtime.
        assert_eq!(profile_for(Profile::Standard, &runsc), Profile::Standard);
        assert_eq!(
            profile_for(Profile::Sandbox, Path::new("/usr/sbin/runc")),
            Profile::Sandbox
        );
    }
}
