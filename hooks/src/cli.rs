//! Command line: a small hand parser (no clap: two subcommands, three flags, and a binary that
//! should start fast). The name the binary was started under picks the dialect:
//! - `nvshim-hook SUBCOMMAND ...`: ours; an unknown subcommand or flag is a usage error (2).
//! - `nvidia-cdi-hook HOOK ...`: NVIDIA's (`cmd/nvidia-cdi-hook`), so CDI specs generated for
//!   NVIDIA's toolkit keep working: `update-ldcache --folder X [--ldconfig-path P]` and
//!   `create-symlinks --link T::L` with the same meaning; its other hooks, an unknown hook or
//!   no hook at all warn and exit 0, as NVIDIA's does for forward compatibility.
//! - `nvidia-container-runtime-hook` / `nvidia-container-toolkit`: Docker's legacy `--gpus`
//!   prestart hook, which nvshim replaces; it fails with directions.
//!
//! Flags are accepted as `--flag VALUE`, `--flag=VALUE`, `-flag VALUE` and `-flag=VALUE`
//! (urfave/cli's forms). The global `--debug`/`-d` and `--quiet` are accepted and ignored.
//!
//! The environment is never read: the hook's behaviour depends only on argv, the state on stdin
//! and the files below the container root.

use std::ffi::OsString;
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use crate::create_symlinks::{self, Link};
use crate::root::Root;
use crate::state::State;
use crate::update_ldcache;

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
flags:
  --container-spec FILE   read the OCI state from FILE instead of stdin
  --ldconfig-path PATH    host ldconfig, used only where the cache cannot be written natively
  --help, --version
";

const LEGACY_HOOK: &str = "\
nvshim: Docker's legacy --gpus prestart hook (nvidia-container-runtime-hook) is not part of \
nvshim and does nothing here. Configure nvshim-runtime as Docker's runtime with \
`nvshim runtime configure --runtime docker`, restart dockerd, then start GPU containers with \
`docker run --runtime=nvidia ...` (--gpus works through that runtime too).";

/// NVIDIA hooks accepted and skipped.
const NVIDIA_OTHER_HOOKS: &[&str] = &[
    "enable-cuda-compat",
    "disable-device-node-modification",
    "update-application-profile",
    "chmod",
    "noop",
];

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
    /// Warn and succeed (NVIDIA's unknown or unimplemented hooks).
    Skip(String),
    LegacyHook,
    CreateSymlinks {
        links: Vec<Link>,
        spec: Option<String>,
    },
    UpdateLdcache {
        folders: Vec<String>,
        ldconfig_path: Option<PathBuf>,
        spec: Option<String>,
    },
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
    match sub.as_str() {
        "create-symlinks" | "update-ldcache" => {}
        "help" => return Ok(Command::Help),
        other => {
            return match dialect {
                Dialect::Nvidia if NVIDIA_OTHER_HOOKS.contains(&other) => Ok(Command::Skip(
                    format!("hook {other} is not implemented by nvshim; skipped"),
                )),
                Dialect::Nvidia => Ok(Command::Skip(format!("unknown hook {other}; skipped"))),
                Dialect::Nvshim => Err(Usage(format!("unknown subcommand {other}"))),
            };
        }
    }
    let mut links = Vec::new();
    let mut folders = Vec::new();
    let mut ldconfig_path = None;
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
            _ => return Err(Usage(format!("{sub}: unknown flag {a}"))),
        }
    }
    Ok(if sub == "create-symlinks" {
        Command::CreateSymlinks { links, spec }
    } else {
        Command::UpdateLdcache {
            folders,
            ldconfig_path,
            spec,
        }
    })
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

/// Reads the state (from `spec`, or stdin for `None`, `""` or `-`) and opens the root.
fn open_root(spec: Option<&str>, stdin: impl Read) -> Result<Root, String> {
    let state = match spec.filter(|s| !s.is_empty() && *s != "-") {
        Some(path) => {
            let file = File::open(path).map_err(|e| format!("{path}: {e}"))?;
            State::read(file, path)
        }
        None => State::read(stdin, "stdin"),
    }
    .map_err(|e| e.to_string())?;
    let root = state.container_root().map_err(|e| e.to_string())?;
    Root::open(&root).map_err(|e| e.to_string())
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
            open_root(spec.as_deref(), stdin).and_then(|root| {
                let mut opts = update_ldcache::Options::new(folders);
                opts.ldconfig_path = ldconfig_path;
                update_ldcache::run(&root, &opts)
                    .map(|r| r.warnings)
                    .map_err(|e| format!("update-ldcache: {e}"))
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

/// `main` for the binary.
pub fn main() -> i32 {
    let args: Vec<OsString> = std::env::args_os().collect();
    run(
        &args,
        std::io::stdin().lock(),
        &mut std::io::stderr().lock(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Command, Usage> {
        let v: Vec<OsString> = args.iter().map(OsString::from).collect();
        parse(&v)
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
        assert!(p(&["nvshim-hook", "enable-cuda-compat"]).is_err());
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
        assert!(matches!(
            p(&[
                "/usr/bin/nvidia-cdi-hook",
                "enable-cuda-compat",
                "--host-driver-version=580.65.06"
            ]),
            Ok(Command::Skip(_))
        ));
        assert!(matches!(
            p(&["nvidia-cdi-hook", "some-future-hook", "--x"]),
            Ok(Command::Skip(_))
        ));
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
    fn exit_codes() {
        let run_args = |args: &[&str]| {
            let v: Vec<OsString> = args.iter().map(OsString::from).collect();
            let mut err = Vec::new();
            let code = run(&v, &b""[..], &mut err);
            (code, String::from_utf8(err).unwrap())
        };
        assert_eq!(run_args(&["nvshim-hook", "frobnicate"]).0, EXIT_USAGE);
        assert_eq!(run_args(&["nvidia-cdi-hook", "frobnicate"]).0, 0);
        let (code, msg) = run_args(&["nvidia-container-runtime-hook", "prestart"]);
        assert_eq!(code, EXIT_FAILURE);
        assert!(
            msg.contains("nvshim runtime configure --runtime docker"),
            "{msg}"
        );
        assert!(msg.contains("--runtime=nvidia"), "{msg}");
        // A bad state is one line naming where it came from.
        let (code, msg) = run_args(&["nvshim-hook", "update-ldcache", "--folder", "/x"]);
        assert_eq!(code, EXIT_FAILURE);
        assert!(msg.contains("stdin"), "{msg}");
        assert_eq!(msg.lines().count(), 1, "{msg}");
    }
}
