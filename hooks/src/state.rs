//! The OCI state on a hook's stdin, and the container root it names.
//!
//! runtime-spec `runtime.md` "State": `ociVersion, id, status, pid, bundle, annotations`. crun
//! adds a non-standard `root` (the rootfs path), which NVIDIA's hooks prefer when present
//! (`internal/oci/state.go`); otherwise the root is `root.path` of `<bundle>/config.json`,
//! joined to the bundle when relative. Both files are read with a size limit and only the fields
//! needed are decoded. A `root.path` that leads out of the bundle or to the host's `/` is refused
//! ([`Container::open`]).
//!
//! A rootless container whose user is not mapped into it (podman `--userns=nomap`) runs its
//! hooks as a container root that cannot read `<bundle>/config.json` (the user's, mode 0600).
//! runc runs a `createContainer` hook from the container's init, in its mount namespace, after
//! `chdir` to the root filesystem (runc `libcontainer/rootfs_linux.go`, `prepareRootfs`): when
//! config.json is refused and the state says so (status `creating`, `pid` our parent), the
//! root is the working directory ([`State::root_from_cwd`]). Seen with podman 5.4 and runc
//! (tests/e2e/rootless.rs).

use std::io::{self, Read};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use thiserror::Error;

use crate::root::{self, Root, RootError};

/// Largest state document read from stdin.
const MAX_STATE: u64 = 1 << 20;
/// Largest config.json read (real ones are tens of KiB); nvshim-runtime's limit too.
pub const MAX_CONFIG: u64 = 16 << 20;

#[derive(Debug, Error)]
pub enum StateError {
    #[error("reading the OCI state from {from}: {source}")]
    Read {
        from: String,
        #[source]
        source: io::Error,
    },
    #[error("{from}: more than {limit} bytes")]
    TooLarge { from: String, limit: u64 },
    #[error("{from}: not a valid OCI state: {source}")]
    Parse {
        from: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{from}: the OCI state names no bundle and no root")]
    NoBundle { from: String },
    #[error("{path}: {source}")]
    Config {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: not a valid config.json: {source}")]
    ConfigParse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: config.json has no root.path")]
    NoRootPath { path: PathBuf },
    #[error("refusing container root {0:?}: it must be a directory other than /")]
    BadRoot(PathBuf),
    #[error("{path}: refusing root.path {root:?}: {why}")]
    Escapes {
        path: PathBuf,
        root: String,
        why: &'static str,
    },
    #[error(transparent)]
    Root(#[from] RootError),
}

/// The fields of the state a hook uses.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub struct State {
    #[serde(default)]
    pub id: String,
    #[serde(default)]
    pub bundle: String,
    /// crun's extension.
    #[serde(default)]
    pub root: Option<String>,
    /// The container's init process (0 or absent before it exists).
    #[serde(default)]
    pub pid: Option<i64>,
    /// `creating`, `created`, `running`, `stopped`.
    #[serde(default)]
    pub status: String,
}

#[derive(Deserialize)]
struct Config {
    root: Option<ConfigRoot>,
    mounts: Option<Vec<ConfigMount>>,
}

#[derive(Deserialize)]
struct ConfigMount {
    #[serde(default)]
    destination: String,
}

/// What a hook learns about the container from its state and config.json.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Container {
    /// The root filesystem on the host.
    pub root: PathBuf,
    /// Where config.json mounts something (`mounts[].destination`), container paths; `None`
    /// when config.json could not be read (crun's state names the root without it).
    pub mounts: Option<Vec<String>>,
    /// The bundle, when config.json's `root.path` is relative to it: the root must then lie
    /// below it.
    pub bundle: Option<PathBuf>,
}

impl Container {
    /// Opens the root, refusing one that is the host's `/` (`/tmp/..`, a `rootfs` symlink to
    /// `/`), or, for a relative `root.path`, one that does not lie below the bundle (a
    /// symlinked `rootfs` leading out of it). Both are told by the directory's identity, not
    /// its name. An absolute `root.path` may be anywhere: Docker and Podman write their
    /// storage's paths (tests/fixtures/oci/docker-28.5.2-config.json).
    pub fn open(&self) -> Result<Root, StateError> {
        let root = Root::open(&self.root)?;
        let io = |source| RootError::Io {
            path: self.root.display().to_string(),
            source,
        };
        let st = root::fstat(root.fd()).map_err(io)?;
        // An absolute name: the hook's own `/`, whatever the fd.
        let top = root::lstatat(root.fd(), b"/").map_err(io)?;
        if (st.st_dev, st.st_ino) == (top.st_dev, top.st_ino) {
            return Err(StateError::BadRoot(self.root.clone()));
        }
        if let Some(bundle) = &self.bundle {
            let outside = || StateError::Escapes {
                path: bundle.join("config.json"),
                root: self.root.display().to_string(),
                why: "it does not lie below the bundle",
            };
            let b = Root::open(bundle).map_err(|_| outside())?;
            let b = root::fstat(b.fd()).map_err(io)?;
            if !root::is_below(root.fd(), &b).map_err(io)? {
                return Err(outside());
            }
        }
        Ok(root)
    }
}

#[derive(Deserialize)]
struct ConfigProcess {
    process: Option<ProcessEnv>,
}

#[derive(Deserialize)]
struct ProcessEnv {
    #[serde(default)]
    env: Vec<String>,
}

#[derive(Deserialize)]
struct ConfigRoot {
    path: Option<String>,
}

fn read_limited(mut r: impl Read, limit: u64, from: &str) -> Result<Vec<u8>, StateError> {
    // Room for a real config.json up front: `take` hides the file's size from `read_to_end`,
    // which otherwise starts at 32 bytes and doubles (11 reads for the bench's 12 KB config;
    // pages are touched only as the read fills them).
    let mut buf = Vec::with_capacity(limit.min(32 * 1024) as usize);
    (&mut r)
        .take(limit + 1)
        .read_to_end(&mut buf)
        .map_err(|source| StateError::Read {
            from: from.to_string(),
            source,
        })?;
    if buf.len() as u64 > limit {
        return Err(StateError::TooLarge {
            from: from.to_string(),
            limit,
        });
    }
    Ok(buf)
}

impl State {
    /// Reads the state document (`from` names the source in messages: "stdin", a path).
    pub fn read(r: impl Read, from: &str) -> Result<State, StateError> {
        let buf = read_limited(r, MAX_STATE, from)?;
        serde_json::from_slice(&buf).map_err(|source| StateError::Parse {
            from: from.to_string(),
            source,
        })
    }

    /// `process.env` of the bundle's config.json (empty when it has none).
    pub fn process_env(&self) -> Result<Vec<String>, StateError> {
        let (_, config): (_, ConfigProcess) = self.config()?;
        Ok(config.process.map(|p| p.env).unwrap_or_default())
    }

    /// The container's root filesystem on the host (without reading config.json for its
    /// mounts when crun's state names the root).
    pub fn container_root(&self) -> Result<Container, StateError> {
        self.locate(false)
    }

    /// The bundle's config.json (its path, and its fields as far as `T` decodes them).
    fn config<T: serde::de::DeserializeOwned>(&self) -> Result<(PathBuf, T), StateError> {
        if self.bundle.is_empty() {
            return Err(StateError::NoBundle {
                from: format!("state of container {:?}", self.id),
            });
        }
        let path = Path::new(&self.bundle).join("config.json");
        // Non-blocking, a regular file ([`crate::hostfile`]): a FIFO there does not hang runc.
        let (file, _) =
            crate::hostfile::open(&path, MAX_CONFIG).map_err(|source| StateError::Config {
                path: path.clone(),
                source,
            })?;
        let buf = read_limited(file, MAX_CONFIG, &path.display().to_string())?;
        let config = serde_json::from_slice(&buf).map_err(|source| StateError::ConfigParse {
            path: path.clone(),
            source,
        })?;
        Ok((path, config))
    }

    /// The container's root filesystem on the host, and what config.json mounts in it.
    pub fn container(&self) -> Result<Container, StateError> {
        self.locate(true)
    }

    /// The root, and the mounts when `mounts` is asked for: crun's state names the root, so
    /// config.json is then read only for its mounts, and only by a hook that uses them.
    fn locate(&self, mounts: bool) -> Result<Container, StateError> {
        let (root, mounts, bundle) = match self.root.as_deref().filter(|r| !r.is_empty()) {
            // The mounts only help (update-ldcache): without them, nothing fails.
            Some(r) => (
                PathBuf::from(r),
                mounts
                    .then(|| self.config::<Config>().ok())
                    .flatten()
                    .and_then(|(_, c)| c.mounts),
                None,
            ),
            None => {
                let (path, config): (_, Config) = match self.config() {
                    Ok(c) => c,
                    Err(e) => return self.root_from_cwd(e),
                };
                let rel = config
                    .root
                    .and_then(|r| r.path)
                    .filter(|p| !p.is_empty())
                    .ok_or(StateError::NoRootPath { path: path.clone() })?;
                // Engines write clean paths; `..` and /proc's links only lead elsewhere.
                let why = if rel.split('/').any(|c| c == "..") {
                    Some("it climbs with `..`")
                } else if rel.split('/').find(|c| !c.is_empty()) == Some("proc")
                    && rel.starts_with('/')
                {
                    Some("it goes through /proc, whose links lead to other roots")
                } else {
                    None
                };
                if let Some(why) = why {
                    return Err(StateError::Escapes {
                        path,
                        root: rel,
                        why,
                    });
                }
                let bundle = (!rel.starts_with('/')).then(|| PathBuf::from(&self.bundle));
                (Path::new(&self.bundle).join(rel), config.mounts, bundle)
            }
        };
        // NVIDIA refuses "" and "/": a hook must never treat the host root as the container's.
        if root.as_os_str().is_empty()
            || root
                .components()
                .all(|c| matches!(c, std::path::Component::RootDir))
        {
            return Err(StateError::BadRoot(root));
        }
        Ok(Container {
            root,
            mounts: mounts.map(|m| m.into_iter().map(|m| m.destination).collect()),
            bundle,
        })
    }

    /// The root when config.json was refused (`err`, returned otherwise): the working
    /// directory, when this is a `createContainer` hook of runc's, run by the container's init
    /// (our parent is the state's `pid`, in our pid namespace) while `creating`. The root must
    /// still not be the hook's `/` ([`Container::open`]); no mounts are known.
    fn root_from_cwd(&self, err: StateError) -> Result<Container, StateError> {
        let refused = matches!(&err, StateError::Config { source, .. }
            if source.kind() == io::ErrorKind::PermissionDenied);
        let by_init = self
            .pid
            .is_some_and(|p| p > 0 && p == i64::from(std::os::unix::process::parent_id()));
        if !(refused && by_init && self.status == "creating") {
            return Err(err);
        }
        let root = std::env::current_dir().map_err(|_| err)?;
        Ok(Container {
            root,
            mounts: None,
            bundle: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mounts_from_config_with_either_root() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"root":{"path":"rootfs"},"mounts":[{"destination":"/proc","type":"proc"},{"destination":"/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06","type":"bind","source":"/x"},{"type":"tmpfs"}]}"#,
        )
        .unwrap();
        let bundle = dir.path().to_str().unwrap().to_string();
        let want = Some(vec![
            "/proc".to_string(),
            "/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06".to_string(),
            String::new(),
        ]);
        let state = State {
            bundle: bundle.clone(),
            ..State::default()
        };
        let c = state.container().unwrap();
        assert_eq!(
            (c.root, c.mounts),
            (dir.path().join("rootfs"), want.clone())
        );
        // crun names the root: config.json is still read for its mounts, and not needed.
        let state = State {
            bundle,
            root: Some("/run/crun/c1/rootfs".into()),
            ..State::default()
        };
        assert_eq!(state.container().unwrap().mounts, want);
        std::fs::remove_file(dir.path().join("config.json")).unwrap();
        let c = state.container().unwrap();
        assert_eq!(
            (c.root, c.mounts),
            (PathBuf::from("/run/crun/c1/rootfs"), None)
        );
    }

    #[test]
    fn root_from_bundle_config() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"ociVersion":"1.0.2","root":{"path":"rootfs","readonly":true},"process":{"env":["X=1"]}}"#,
        )
        .unwrap();
        let state = format!(
            r#"{{"ociVersion":"1.0.2","id":"c1","status":"creating","pid":42,"bundle":"{}","annotations":{{"a":"b"}}}}"#,
            dir.path().display()
        );
        let s = State::read(state.as_bytes(), "stdin").unwrap();
        assert_eq!(s.container_root().unwrap().root, dir.path().join("rootfs"));
        assert_eq!(s.pid, Some(42));
        assert_eq!(s.process_env().unwrap(), ["X=1"]);
    }

    /// A FIFO at `<bundle>/config.json` is an error naming it, not a hook that blocks runc.
    #[test]
    fn a_fifo_config_json_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config.json");
        nvshim_testsupport::hook_harness::mkfifo(&config);
        let state = format!(r#"{{"id":"c","bundle":{:?}}}"#, dir.path());
        let s = State::read(state.as_bytes(), "stdin").unwrap();
        let e = s.process_env().unwrap_err().to_string();
        assert!(e.contains("config.json") && e.contains("a FIFO"), "{e}");
    }

    /// config.json refused: the working directory is the root only for runc's createContainer
    /// hook (run by the container's init while creating); any other error, or another
    /// caller, keeps the error.
    #[test]
    fn refused_config_falls_back_to_the_working_directory_for_runc_create() {
        let refused = || StateError::Config {
            path: "/b/config.json".into(),
            source: io::Error::from(io::ErrorKind::PermissionDenied),
        };
        let parent = i64::from(std::os::unix::process::parent_id());
        let state = |pid: i64, status: &str| State {
            bundle: "/b".into(),
            pid: Some(pid),
            status: status.into(),
            ..State::default()
        };
        let c = state(parent, "creating").root_from_cwd(refused()).unwrap();
        assert_eq!(c.root, std::env::current_dir().unwrap());
        assert_eq!((c.mounts, c.bundle), (None, None));
        for s in [
            state(parent + 1, "creating"),
            state(parent, "created"),
            state(0, "creating"),
        ] {
            assert!(
                matches!(s.root_from_cwd(refused()), Err(StateError::Config { .. })),
                "{s:?}"
            );
        }
        let missing = StateError::Config {
            path: "/b/config.json".into(),
            source: io::Error::from(io::ErrorKind::NotFound),
        };
        assert!(state(parent, "creating").root_from_cwd(missing).is_err());
    }

    #[test]
    fn crun_root_wins() {
        let s = State::read(
            &br#"{"id":"c","bundle":"/nonexistent","root":"/run/crun/c/rootfs"}"#[..],
            "stdin",
        )
        .unwrap();
        assert_eq!(
            s.container_root().unwrap().root,
            PathBuf::from("/run/crun/c/rootfs")
        );
    }

    #[test]
    fn refuses_host_root_and_garbage() {
        let s = State::read(&br#"{"id":"c","root":"/"}"#[..], "stdin").unwrap();
        assert!(matches!(s.container_root(), Err(StateError::BadRoot(_))));
        assert!(State::read(&b"not json"[..], "stdin").is_err());
        let big = vec![b' '; (MAX_STATE + 10) as usize];
        assert!(matches!(
            State::read(&big[..], "stdin"),
            Err(StateError::TooLarge { .. })
        ));
        let s = State::read(&br#"{"id":"c"}"#[..], "stdin").unwrap();
        assert!(matches!(
            s.container_root(),
            Err(StateError::NoBundle { .. })
        ));
    }
}
