//! Registering `nvshim-runtime` with container engines: `nvshim runtime configure|unconfigure`.
//!
//! Each engine module turns [`Options`] into a [`Plan`]: the files it would change, with their
//! text before and after. Nothing is written while planning, so a config that does not parse
//! (or has an unexpected shape) is an error that leaves every file as it was, and `--dry-run`
//! is the same plan printed as a diff. [`Plan::apply`] then backs up each existing file it
//! changes and replaces it atomically.
//!
//! What field experience asks of this: never rewrite the user's config,
//! keep every other key, carry the default runtime's options (`SystemdCgroup` above all,
//! nvidia-docker#1788), and use drop-ins where the engine has them (containerd#6389).
//! A plan with no changes is how idempotency shows: a second `configure` plans nothing.

pub mod containerd;
pub mod crio;
pub mod docker;
mod file;
mod tomldoc;

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use thiserror::Error;

pub use file::{backup_path, Applied};

/// The runtime name engines know nvshim by (`docker run --runtime=nvidia`, the Kubernetes
/// RuntimeClass handler): NVIDIA's name, so existing manifests and scripts keep working.
pub const DEFAULT_RUNTIME_NAME: &str = "nvidia";
/// Where the packages install the runtime binary.
pub const DEFAULT_RUNTIME_PATH: &str = "/usr/bin/nvshim-runtime";
/// Where `configure` keeps the content of the files it changes ([`backup_path`]): outside every
/// directory an engine reads. CRI-O reads every file in `crio.conf.d` whatever its name, and
/// containerd's `imports` globs may match any name, so a backup beside a drop-in is a config.
pub const DEFAULT_BACKUP_DIR: &str = "/var/lib/nvshim/backups";
/// First line of every drop-in file nvshim writes; `unconfigure` deletes only files that
/// carry it, and `configure` refuses to overwrite a file without it.
pub const DROP_IN_MARKER: &str = "# Written by `nvshim runtime configure`";
/// The CDI annotation prefix that CRI must pass through to the OCI spec for nvshim to see
/// device requests made by device plugins (`cdi.k8s.io/<name>` container annotations).
pub const CDI_ANNOTATION_PATTERN: &str = "cdi.k8s.io/*";

#[derive(Debug, Error)]
pub enum EngineError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot parse {path}: {message} (nothing was changed)")]
    Parse { path: PathBuf, message: String },
    #[error("{path}: {key} is {found}, expected {expected} (nothing was changed)")]
    Shape {
        path: PathBuf,
        key: String,
        expected: &'static str,
        found: String,
    },
    #[error("{path}: {message} (nothing was changed)")]
    Unsupported { path: PathBuf, message: String },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot back up {path} to {backup}: {source} (the file was not changed)")]
    Backup {
        path: PathBuf,
        backup: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot remove {path}: {source}")]
    Remove {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("internal error: the edited {path} does not parse: {message} (nothing was changed)")]
    Produced { path: PathBuf, message: String },
}

/// The engines nvshim can register with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Docker,
    Containerd,
    Crio,
}

impl Engine {
    pub const ALL: [Engine; 3] = [Engine::Docker, Engine::Containerd, Engine::Crio];

    pub fn name(self) -> &'static str {
        match self {
            Engine::Docker => "docker",
            Engine::Containerd => "containerd",
            Engine::Crio => "crio",
        }
    }

    /// The engine's main config file, as its Debian and RPM packages install it (the same
    /// defaults as `nvidia-ctk runtime configure`).
    pub fn default_config(self) -> PathBuf {
        PathBuf::from(match self {
            Engine::Docker => "/etc/docker/daemon.json",
            Engine::Containerd => "/etc/containerd/config.toml",
            Engine::Crio => "/etc/crio/crio.conf",
        })
    }

    /// The drop-in nvshim writes for a main config at `config`: `conf.d/99-nvshim.toml` beside
    /// containerd's config (used when the config has `imports`), `crio.conf.d/99-nvshim.toml`
    /// beside CRI-O's. Docker has no drop-ins. The name sorts after NVIDIA's `99-nvidia.toml`,
    /// so on a host migrating from the toolkit nvshim's definition of `nvidia` wins.
    pub fn default_drop_in(self, config: &Path) -> Option<PathBuf> {
        let dir = config.parent().unwrap_or(Path::new("/"));
        match self {
            Engine::Docker => None,
            Engine::Containerd => Some(dir.join("conf.d").join("99-nvshim.toml")),
            Engine::Crio => Some(dir.join("crio.conf.d").join("99-nvshim.toml")),
        }
    }
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Engine {
    type Err = String;
    fn from_str(s: &str) -> Result<Engine, String> {
        match s {
            "docker" => Ok(Engine::Docker),
            "containerd" => Ok(Engine::Containerd),
            "crio" | "cri-o" => Ok(Engine::Crio),
            other => Err(format!(
                "unknown engine {other:?} (expected docker, containerd or crio)"
            )),
        }
    }
}

/// What to register, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    pub engine: Engine,
    /// The engine's main config file.
    pub config: PathBuf,
    /// The drop-in file (containerd with `imports`, CRI-O); `None` for Docker.
    pub drop_in: Option<PathBuf>,
    /// The name the engine knows the runtime by (`nvidia`).
    pub runtime_name: String,
    /// Absolute path of `nvshim-runtime` as the engine will exec it.
    pub runtime_path: PathBuf,
    /// Also make it the engine's default runtime.
    pub set_as_default: bool,
    /// Turn on the engine's own CDI support where it is off (containerd 1.7's `enable_cdi`,
    /// Docker 25-27's `features.cdi`), so that CDI devices named over the CRI or with
    /// `--device` reach containers.
    pub enable_cdi: bool,
    /// containerd: turn NRI on where it is off (1.7), for NRI plugins such as nvshim-nri.
    pub enable_nri: bool,
    /// containerd 2.2 and later: NRI's default validator requires nvshim-nri, so no container
    /// is created while it is absent (`containerd::NRI_PLUGIN_NAME`).
    pub require_nri: bool,
    /// The installed engine's release, `(major, minor)`, when known: it decides whether CDI is
    /// on when the config does not say (containerd 2.x, Docker 28+) or not supported at all
    /// (containerd 1.6, Docker before 25).
    pub engine_version: Option<(u64, u64)>,
    /// The spec directories written with the engine CDI that `enable_cdi` turns on
    /// (containerd's `cdi_spec_dirs`): nvshim's own, so that both read the same specs.
    pub cdi_spec_dirs: Vec<PathBuf>,
    /// Where backups go ([`DEFAULT_BACKUP_DIR`]).
    pub backup_dir: PathBuf,
}

impl Options {
    /// Defaults for `engine`: its standard config path and drop-in, runtime `nvidia` at
    /// `runtime_path`.
    pub fn new(engine: Engine, runtime_path: PathBuf) -> Options {
        let config = engine.default_config();
        Options {
            engine,
            drop_in: engine.default_drop_in(&config),
            config,
            runtime_name: DEFAULT_RUNTIME_NAME.to_string(),
            runtime_path,
            set_as_default: false,
            enable_cdi: false,
            enable_nri: false,
            require_nri: false,
            engine_version: None,
            cdi_spec_dirs: crate::config::Config::default().cdi_spec_dirs,
            backup_dir: PathBuf::from(DEFAULT_BACKUP_DIR),
        }
    }
}

/// The installed engine's release, from `dockerd --version` (`Docker version 20.10.24+dfsg1,
/// build 297e128`) or `containerd --version` (`containerd github.com/containerd/containerd
/// v1.6.20 ...`), looking for the daemon on `path_var`; `None` when it is not there or prints
/// no version. CRI-O's CDI support does not depend on its release, so it is not asked.
pub fn detect_version(engine: Engine, path_var: Option<&std::ffi::OsStr>) -> Option<(u64, u64)> {
    let daemon = match engine {
        Engine::Docker => "dockerd",
        Engine::Containerd => "containerd",
        Engine::Crio => return None,
    };
    let exe = crate::runtime::find_on_path(path_var, daemon)?;
    let out = std::process::Command::new(exe)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    parse_version(&String::from_utf8_lossy(&out.stdout))
}

/// The first `[v]MAJOR.MINOR` word of a `--version` line.
pub fn parse_version(text: &str) -> Option<(u64, u64)> {
    text.split(|c: char| c.is_whitespace() || c == ',')
        .find_map(|word| {
            let word = word.strip_prefix('v').unwrap_or(word);
            let mut parts = word.split(|c: char| !c.is_ascii_digit());
            let major = parts.next()?.parse().ok()?;
            let rest = word.split_once('.')?.1;
            let minor: String = rest.chars().take_while(char::is_ascii_digit).collect();
            Some((major, minor.parse().ok()?))
        })
}

/// One file a plan changes. `after == None` removes the file; `before == None` creates it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileChange {
    pub path: PathBuf,
    pub before: Option<String>,
    pub after: Option<String>,
}

/// The files a `configure` or `unconfigure` changes; empty when everything is already in place.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub changes: Vec<FileChange>,
    /// What the caller should tell the operator (a config version newer than nvshim knows).
    pub warnings: Vec<String>,
    /// Where [`Plan::apply`] keeps backups ([`Options::backup_dir`]).
    pub backup_dir: PathBuf,
    /// An `unconfigure` plan: it writes no backup and removes those of the files it changes.
    pub unconfigure: bool,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// A unified diff of every change (`/dev/null` for a created or removed file).
    pub fn diff(&self) -> String {
        let mut out = String::new();
        for c in &self.changes {
            out.push_str(&file::unified_diff(c));
        }
        out
    }

    /// Writes the plan: each existing file `configure` edits is first copied to its
    /// [`backup_path`] (unless a backup is there already: it keeps the content from before
    /// nvshim's first change), then replaced atomically (or removed). An `unconfigure` plan
    /// then removes the backups of the files it changed. Stops at the first error; files
    /// already written stay written, each with its backup.
    pub fn apply(&self) -> Result<Vec<Applied>, EngineError> {
        (self.changes.iter())
            .map(|c| file::apply_change(c, &self.backup_dir, self.unconfigure))
            .collect()
    }
}

/// Plans registering the runtime with `opts.engine`.
pub fn configure(opts: &Options) -> Result<Plan, EngineError> {
    let mut plan = match opts.engine {
        Engine::Docker => docker::configure(opts).map(Plan::from),
        Engine::Containerd => containerd::configure(opts),
        Engine::Crio => crio::configure(opts).map(Plan::from),
    }?;
    plan.backup_dir = opts.backup_dir.clone();
    Ok(plan)
}

/// Plans removing what [`configure`] added: the runtime entry, the default-runtime setting when
/// it names the runtime, and drop-ins nvshim wrote. A file whose content is then the content of
/// its backup gets the backup's bytes back (its formatting, comments and final newline).
pub fn unconfigure(opts: &Options) -> Result<Plan, EngineError> {
    let mut plan = match opts.engine {
        Engine::Docker => docker::unconfigure(opts).map(Plan::from),
        Engine::Containerd => containerd::unconfigure(opts),
        Engine::Crio => crio::unconfigure(opts).map(Plan::from),
    }?;
    for c in &mut plan.changes {
        let Some(after) = &c.after else { continue };
        let Some(saved) = file::read_backup(&opts.backup_dir, &c.path)? else {
            continue;
        };
        if saved != *after && same_content(opts.engine, &saved, after) {
            c.after = Some(saved);
        }
    }
    plan.changes.retain(|c| c.before != c.after);
    plan.backup_dir = opts.backup_dir.clone();
    plan.unconfigure = true;
    Ok(plan)
}

/// Whether two texts of an engine's config say the same (daemon.json's JSON, else TOML): key
/// order, formatting and comments aside. Text that does not parse is never the same.
fn same_content(engine: Engine, a: &str, b: &str) -> bool {
    match engine {
        Engine::Docker => {
            // dockerd reads an empty daemon.json as `{}`.
            let parse = |t: &str| match t.trim() {
                "" => Ok(serde_json::Value::Object(Default::default())),
                t => serde_json::from_str::<serde_json::Value>(t),
            };
            matches!((parse(a), parse(b)), (Ok(x), Ok(y)) if x == y)
        }
        Engine::Containerd | Engine::Crio => matches!(
            (toml::from_str::<toml::Table>(a), toml::from_str::<toml::Table>(b)),
            (Ok(x), Ok(y)) if x == y
        ),
    }
}

impl From<Vec<FileChange>> for Plan {
    fn from(changes: Vec<FileChange>) -> Plan {
        Plan {
            changes,
            ..Plan::default()
        }
    }
}

/// Where containerd and Docker read CDI specs when their config does not say.
pub const ENGINE_CDI_SPEC_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];

/// How an engine's config files register a runtime, read the way the engine reads them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// The config files read, in the engine's order (main file, then imports or drop-ins).
    pub files: Vec<PathBuf>,
    /// The runtime's binary: `None` when no file defines the runtime, `Some("")` when one
    /// defines it without a binary (the engine then runs its default, plain runc).
    pub binary: Option<String>,
    /// Whether the engine's own CDI support is on, as the files (and the engine's release
    /// where they do not say) decide it: `None` when the engine has no such switch (CRI-O
    /// always reads CDI) or its release does not support CDI.
    pub cdi_enabled: Option<bool>,
    /// The file and key that turn CDI off (for messages), when `cdi_enabled == Some(false)`.
    pub cdi_setting: Option<String>,
    /// Where the engine's own CDI reads specs (containerd's `cdi_spec_dirs`, Docker's
    /// `cdi-spec-dirs`, else their default `/etc/cdi`, `/var/run/cdi`), when it has CDI.
    pub cdi_spec_dirs: Option<Vec<PathBuf>>,
    /// What the caller should tell the operator (a config version newer than nvshim knows).
    pub warnings: Vec<String>,
}

/// Reads, without changing anything, what `opts.engine`'s config says about the runtime
/// `opts.runtime_name` (`nvshim doctor` uses it; the writers above use the same parsers).
pub fn registration(opts: &Options) -> Result<Registration, EngineError> {
    match opts.engine {
        Engine::Docker => docker::registration(opts),
        Engine::Containerd => containerd::registration(opts),
        Engine::Crio => crio::registration(opts),
    }
}

/// A change if `after` differs from `before`.
fn change(path: &Path, before: Option<String>, after: Option<String>) -> Option<FileChange> {
    (before != after).then(|| FileChange {
        path: path.to_path_buf(),
        before,
        after,
    })
}

/// The header of a drop-in: the marker line and what wrote it.
fn drop_in_header(opts: &Options) -> String {
    format!(
        "{DROP_IN_MARKER} --runtime {}: registers {} as the runtime {:?}.\n\
         # `nvshim runtime unconfigure --runtime {}` removes this file. Do not edit: it is rewritten.\n",
        opts.engine,
        opts.runtime_path.display(),
        opts.runtime_name,
        opts.engine,
    )
}

/// Errors unless `text` (an existing drop-in at `path`) was written by nvshim.
fn check_ours(path: &Path, text: Option<&str>) -> Result<(), EngineError> {
    match text {
        Some(t) if !t.starts_with(DROP_IN_MARKER) => Err(EngineError::Unsupported {
            path: path.to_path_buf(),
            message: "exists and was not written by nvshim; move it away or pass \
                      --drop-in-config with another path"
                .into(),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_names_round_trip() {
        for e in Engine::ALL {
            assert_eq!(e.name().parse::<Engine>().unwrap(), e);
        }
        assert_eq!("cri-o".parse::<Engine>().unwrap(), Engine::Crio);
        assert!("podman".parse::<Engine>().is_err());
    }

    #[test]
    fn default_paths() {
        let o = Options::new(Engine::Containerd, DEFAULT_RUNTIME_PATH.into());
        assert_eq!(o.config, Path::new("/etc/containerd/config.toml"));
        assert_eq!(
            o.drop_in.as_deref(),
            Some(Path::new("/etc/containerd/conf.d/99-nvshim.toml"))
        );
        let o = Options::new(Engine::Crio, DEFAULT_RUNTIME_PATH.into());
        assert_eq!(
            o.drop_in.as_deref(),
            Some(Path::new("/etc/crio/crio.conf.d/99-nvshim.toml"))
        );
        assert_eq!(
            Options::new(Engine::Docker, DEFAULT_RUNTIME_PATH.into()).drop_in,
            None
        );
    }

    #[test]
    fn registrations_are_read_as_each_engine_merges_files() {
        let dir = tempfile::tempdir().unwrap();
        let opts = |engine, config: PathBuf| {
            let mut o = Options::new(engine, DEFAULT_RUNTIME_PATH.into());
            o.drop_in = engine.default_drop_in(&config);
            o.config = config;
            o
        };
        let d = dir.path().join("daemon.json");
        std::fs::write(
            &d,
            r#"{"runtimes": {"nvidia": {"path": "/x/nvshim-runtime"}}}"#,
        )
        .unwrap();
        let r = registration(&opts(Engine::Docker, d)).unwrap();
        assert_eq!(r.binary.as_deref(), Some("/x/nvshim-runtime"));

        let c = dir.path().join("config.toml");
        let conf_d = dir.path().join("conf.d");
        std::fs::write(
            &c,
            format!(
                "version = 2\nimports = [\"{}/*.toml\"]\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n",
                conf_d.display()
            ),
        )
        .unwrap();
        assert_eq!(
            registration(&opts(Engine::Containerd, c.clone()))
                .unwrap()
                .binary,
            None
        );
        std::fs::create_dir(&conf_d).unwrap();
        std::fs::write(
            conf_d.join("99.toml"),
            "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia.options]\nBinaryName = \"/y/nvshim-runtime\"\n",
        )
        .unwrap();
        let r = registration(&opts(Engine::Containerd, c)).unwrap();
        assert_eq!(r.binary.as_deref(), Some("/y/nvshim-runtime"));
        assert_eq!(r.files.len(), 2);

        let crio = dir.path().join("crio.conf");
        std::fs::create_dir(dir.path().join("crio.conf.d")).unwrap();
        std::fs::write(
            dir.path().join("crio.conf.d/99-nvshim.toml"),
            "[crio.runtime.runtimes.nvidia]\nruntime_path = \"/z/nvshim-runtime\"\n",
        )
        .unwrap();
        let r = registration(&opts(Engine::Crio, crio)).unwrap();
        assert_eq!(r.binary.as_deref(), Some("/z/nvshim-runtime"));
    }

    /// Each engine's file that `configure` edits, made a relative symlink into `real/` (one
    /// link) or a chain of two links (relative, then absolute): the links stay links, the real
    /// file gets the change with its mode and owner, and `unconfigure` writes back through them.
    #[test]
    fn symlinked_configs_are_written_through() {
        use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
        let drop_in_text = |o: &Options| {
            format!(
                "{}{}",
                drop_in_header(o),
                "[crio.runtime.runtimes.nvidia]\n"
            )
        };
        for engine in Engine::ALL {
            for chain in [1, 2] {
                let dir = tempfile::tempdir().unwrap();
                let etc = dir.path().join("etc");
                let real = dir.path().join("real");
                std::fs::create_dir_all(&etc).unwrap();
                std::fs::create_dir_all(&real).unwrap();
                let config = etc.join(match engine {
                    Engine::Docker => "daemon.json",
                    Engine::Containerd => "config.toml",
                    Engine::Crio => "crio.conf",
                });
                let mut o = Options::new(engine, DEFAULT_RUNTIME_PATH.into());
                o.drop_in = engine.default_drop_in(&config);
                o.config = config.clone();
                o.backup_dir = dir.path().join("backups");
                // CRI-O's main file is never edited: its drop-in is the file to link.
                let (edited, text) = match engine {
                    Engine::Docker => (config.clone(), "{\"debug\": true}\n".to_string()),
                    Engine::Containerd => (config.clone(), "version = 2\n".to_string()),
                    Engine::Crio => (o.drop_in.clone().unwrap(), drop_in_text(&o)),
                };
                std::fs::create_dir_all(edited.parent().unwrap()).unwrap();
                let file = real.join("managed");
                std::fs::write(&file, &text).unwrap();
                std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
                std::os::unix::fs::chown(&file, Some(4321), Some(8765)).unwrap();
                let rel = |from: &Path| {
                    let depth = from.strip_prefix(dir.path()).unwrap().components().count() - 1;
                    let mut p = PathBuf::new();
                    for _ in 0..depth {
                        p.push("..");
                    }
                    p.join("real/managed")
                };
                if chain == 1 {
                    symlink(rel(&edited), &edited).unwrap();
                } else {
                    let middle = real.join("middle");
                    symlink("managed", &middle).unwrap();
                    symlink(&middle, &edited).unwrap();
                }
                let plan = configure(&o).unwrap();
                assert_eq!(plan.changes.len(), 1, "{engine}: {plan:?}");
                plan.apply().unwrap();
                let what = format!("{engine}, chain of {chain}");
                assert!(
                    std::fs::symlink_metadata(&edited)
                        .unwrap()
                        .file_type()
                        .is_symlink(),
                    "{what}: still a link"
                );
                let m = std::fs::metadata(&file).unwrap();
                assert!(m.is_file());
                assert_eq!(m.permissions().mode() & 0o7777, 0o640, "{what}");
                assert_eq!((m.uid(), m.gid()), (4321, 8765), "{what}");
                let now = std::fs::read_to_string(&file).unwrap();
                assert!(now.contains("nvshim-runtime"), "{what}: {now}");
                assert_eq!(
                    std::fs::read_to_string(file::backup_path(&o.backup_dir, &edited)).unwrap(),
                    text,
                    "{what}"
                );
                let leftovers: Vec<_> = std::fs::read_dir(&real)
                    .unwrap()
                    .flatten()
                    .map(|e| e.file_name())
                    .filter(|n| {
                        let n = n.to_string_lossy();
                        n.starts_with('.') && n.ends_with(".tmp")
                    })
                    .collect();
                assert!(leftovers.is_empty(), "{what}: {leftovers:?}");
                if engine != Engine::Crio {
                    unconfigure(&o).unwrap().apply().unwrap();
                    assert!(std::fs::symlink_metadata(&edited)
                        .unwrap()
                        .file_type()
                        .is_symlink());
                    assert!(!std::fs::read_to_string(&file)
                        .unwrap()
                        .contains("nvshim-runtime"));
                }
            }
        }
    }

    #[test]
    fn engine_versions_from_version_lines() {
        for (line, want) in [
            (
                "Docker version 20.10.24+dfsg1, build 297e128",
                Some((20, 10)),
            ),
            ("Docker version 28.5.2, build ecc6942", Some((28, 5))),
            (
                "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+b1",
                Some((1, 6)),
            ),
            (
                "containerd github.com/containerd/containerd/v2 v2.3.4 0123abcd",
                Some((2, 3)),
            ),
            ("containerd containerd.io 1.7.34 deadbeef", Some((1, 7))),
            ("no version here", None),
        ] {
            assert_eq!(parse_version(line), want, "{line}");
        }
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("containerd");
        std::fs::write(
            &fake,
            "#!/bin/sh\necho containerd github.com/containerd/containerd v1.7.34 abc\n",
        )
        .unwrap();
        std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let path = std::ffi::OsString::from(dir.path());
        // A script just written can be briefly "text file busy" while another test thread
        // forks: a few tries.
        let found = (0..5).find_map(|_| {
            detect_version(Engine::Containerd, Some(&path)).or_else(|| {
                std::thread::sleep(std::time::Duration::from_millis(50));
                None
            })
        });
        assert_eq!(found, Some((1, 7)));
        assert_eq!(detect_version(Engine::Docker, Some(&path)), None);
        assert_eq!(detect_version(Engine::Crio, Some(&path)), None);
    }

    #[test]
    fn foreign_drop_in_is_refused() {
        let err = check_ours(Path::new("/x/99.toml"), Some("[crio]\n")).unwrap_err();
        assert!(err.to_string().contains("/x/99.toml"), "{err}");
        check_ours(Path::new("/x"), None).unwrap();
        check_ours(Path::new("/x"), Some(&format!("{DROP_IN_MARKER} x\n"))).unwrap();
    }
}
