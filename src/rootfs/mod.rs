//! Where runc will put the mounts nvshim adds: each destination resolved inside the bundle's
//! root filesystem, as runc resolves it (symlinks followed, absolute targets and `..` kept
//! inside the root), so `create` can refuse a destination that the image's own symlinks lead
//! into a bind mount.
//!
//! runc makes a missing mountpoint (an empty file or directory) at the resolved destination
//! before mounting. With an image whose `/usr/lib/x86_64-linux-gnu` is a symlink to
//! `/tmp/nvidia-mps`, where a DRA claim mounts the MPS pipe directory read-write from the host,
//! every library nvshim mounts would have runc create a root-owned file in that host directory.
//! A library there is useless to the container anyway; the container is refused with the
//! destination, the symlink's result and the mount named. So is a destination inside a volume
//! (a pod's volume at the driver's library folder, or at a folder above it) whose host
//! directory lacks the mountpoint: runc would create it there the same way, and the hook could
//! not make the driver's links in a folder that is another mount.
//!
//! Read-only and by file descriptor: the root is opened once and each component is looked up
//! with `fstatat(AT_SYMLINK_NOFOLLOW)`/`readlinkat` relative to the directory resolved so far,
//! which holds no symlink by construction; no process runs in the container yet. Parents are
//! resolved once per distinct directory (the driver's libraries share a handful), so the check
//! costs a few dozen syscalls on a create that mounts the whole driver.

use std::borrow::Cow;
use std::cell::{Cell, OnceCell};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::fcntl::{readlinkat, AtFlags, OFlag};
use nix::sys::stat::{fstatat, Mode, SFlag};
use serde_json::Value;
use thiserror::Error;

use crate::edits::{go_clean, is_clean, Mount};

/// Symlinks followed in one resolution, as the kernel's `MAXSYMLINKS`.
const MAX_SYMLINKS: u32 = 40;

#[derive(Debug, Error, PartialEq, Eq)]
#[error("mount destination {destination} resolves, through the image's symlinks, to {resolved}, inside the bind mount at {bind} ({source_path}): runc would create its mountpoint there, on the host; fix the image's symlink (or the mount), or remove the volume from the container")]
pub struct IntoBindMount {
    pub destination: String,
    pub resolved: String,
    pub bind: String,
    pub source_path: String,
}

/// An added mount inside a directory the engine binds from the host (a volume), where the
/// host directory lacks the mountpoint: runc would create it there.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("mount destination {destination} lies inside the volume mounted at {bind} from {source_path}, which has no {missing}: runc would create that on the host (a root-owned empty file or directory) to mount the driver's file over, and nvshim's hook could not make the driver's links there; mount the volume somewhere other than {folder} or a folder above it")]
pub struct IntoVolume {
    pub destination: String,
    pub bind: String,
    pub source_path: String,
    /// The host path runc would create.
    pub missing: String,
    /// The destination's folder.
    pub folder: String,
}

/// Why [`check_added_mounts`] refuses a mount.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum MountCheckError {
    #[error(transparent)]
    IntoBindMount(Box<IntoBindMount>),
    #[error(transparent)]
    IntoVolume(Box<IntoVolume>),
}

impl From<IntoBindMount> for MountCheckError {
    fn from(e: IntoBindMount) -> Self {
        MountCheckError::IntoBindMount(Box::new(e))
    }
}

impl From<IntoVolume> for MountCheckError {
    fn from(e: IntoVolume) -> Self {
        MountCheckError::IntoVolume(Box::new(e))
    }
}

/// The root filesystem, opened once.
pub struct RootFs {
    fd: OwnedFd,
    /// Resolved directories, by container path.
    dirs: foldhash::HashMap<String, String>,
    /// Resolved paths the root does not have: nothing below one is looked up (an image without
    /// `/etc/OpenCL` has no `/etc/OpenCL/vendors/nvidia.icd` either).
    missing: foldhash::HashSet<String>,
}

impl RootFs {
    /// Opens `path`; `None` when it cannot be opened (no rootfs yet: nothing to check against).
    pub fn open(path: &Path) -> Option<RootFs> {
        let fd = nix::fcntl::open(
            path,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .ok()?;
        // SAFETY: open returned a new fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Some(RootFs {
            fd,
            dirs: Default::default(),
            missing: Default::default(),
        })
    }

    /// `path` with every symlink resolved inside the root; components that do not exist are
    /// taken as they are (runc creates them as directories).
    pub fn resolve(&mut self, path: &str) -> String {
        let (parent, name) = match path.trim_end_matches('/').rsplit_once('/') {
            Some((p, n)) => (p, n),
            None => ("", path),
        };
        let dir = self.resolve_dir(parent, 0);
        if name.is_empty() || name == "." {
            return dir;
        }
        self.step(&dir, name, 0)
    }

    /// `dir` resolved, each of its prefixes looked up once per root (the driver's files share
    /// a handful of directories).
    fn resolve_dir(&mut self, dir: &str, depth: u32) -> String {
        let key = dir.trim_end_matches('/');
        if key.is_empty() {
            return "/".into();
        }
        if let Some(r) = self.dirs.get(key) {
            return r.clone();
        }
        let (parent, name) = key.rsplit_once('/').unwrap_or(("", key));
        let base = self.resolve_dir(parent, depth);
        let resolved = if name.is_empty() || name == "." {
            base
        } else {
            self.step(&base, name, depth)
        };
        self.dirs.insert(key.to_string(), resolved.clone());
        resolved
    }

    /// Resolves `rest` from the resolved directory `base`.
    fn resolve_from(&mut self, base: &str, rest: &str, depth: u32) -> String {
        let mut cur = base.to_string();
        for comp in rest.split('/').filter(|c| !c.is_empty() && *c != ".") {
            cur = self.step(&cur, comp, depth);
        }
        cur
    }

    /// One component below the resolved directory `cur`.
    fn step(&mut self, cur: &str, comp: &str, depth: u32) -> String {
        if comp == ".." {
            return match cur.rsplit_once('/') {
                Some((p, _)) if !p.is_empty() => p.to_string(),
                _ => "/".into(),
            };
        }
        let next = join(cur, comp);
        if self.missing.contains(cur) {
            self.missing.insert(next.clone());
            return next;
        }
        let relative = next.trim_start_matches('/');
        let is_link = match fstatat(
            Some(self.fd.as_raw_fd()),
            relative,
            AtFlags::AT_SYMLINK_NOFOLLOW,
        ) {
            Ok(st) => SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFLNK,
            // Not there (or below a file): nor is anything below it.
            Err(nix::errno::Errno::ENOENT | nix::errno::Errno::ENOTDIR) => {
                self.missing.insert(next.clone());
                false
            }
            Err(_) => false,
        };
        if !is_link || depth >= MAX_SYMLINKS {
            return next;
        }
        let Ok(target) = readlinkat(Some(self.fd.as_raw_fd()), relative) else {
            return next;
        };
        let target = target.to_string_lossy().into_owned();
        let base = if target.starts_with('/') { "/" } else { cur };
        let base = base.to_string();
        self.resolve_from(&base, &target, depth + 1)
    }
}

/// `dir/name` (`/name` at the root), without the formatting machinery: every step of every
/// added destination's resolution joins one.
fn join(dir: &str, name: &str) -> String {
    let dir = if dir == "/" { "" } else { dir };
    let mut out = String::with_capacity(dir.len() + 1 + name.len());
    out.push_str(dir);
    out.push('/');
    out.push_str(name);
    out
}

/// A bind mount of the spec (by its type or options), whose source is asked whether it is a
/// directory only when that matters, once.
struct Bind<'a> {
    destination: &'a str,
    source: &'a str,
    /// The engine's own (a volume), not one nvshim adds; else its place among the added.
    added: Option<usize>,
    is_dir: OnceCell<bool>,
    resolved: OnceCell<String>,
}

impl Bind<'_> {
    /// Whether the host source is a directory (or cannot be told): only those can hold a
    /// mountpoint runc creates. File binds (Docker's and the kubelet's `/etc/hosts`,
    /// `/etc/resolv.conf`, `/dev/termination-log`, every library nvshim mounts) cannot.
    /// `known` answers for an added bind by its place where it can, without a `stat`.
    fn is_dir(&self, known: impl FnOnce(usize) -> Option<bool>) -> bool {
        *self.is_dir.get_or_init(|| {
            self.added.and_then(known).unwrap_or_else(|| {
                self.source.is_empty()
                    || std::fs::metadata(self.source).map_or(true, |md| md.is_dir())
            })
        })
    }
}

fn is_within(path: &str, dir: &str) -> bool {
    let dir = dir.trim_end_matches('/');
    dir.is_empty() || path == dir || path.strip_prefix(dir).is_some_and(|r| r.starts_with('/'))
}

/// Refuses the first of `added` (mounts nvshim adds; already among `binds`, the bind mounts of
/// the edited document as (destination, source): [`crate::edits::binds`]) whose destination
/// resolves inside another of `binds` through the image's symlinks, or lies inside a directory
/// the engine binds whose host side lacks it, with the root filesystem at `rootfs`. `kinds` is asked at most once, with the added binds' sources, whether each is a
/// directory where that is known (a legacy request's driver files are not): those are not
/// `stat`ed here.
///
/// What it costs depends on the spec: a source is `stat`ed to learn whether it is a directory,
/// a destination resolved with a lookup per component. The engine's own binds are few and go
/// first. When none is a directory (runc's and Docker's specs: files in `/etc`), the added
/// ones are asked; all files (libraries, binaries), nothing needs resolving. When one is (a
/// Kubernetes pod's service-account token, a DRA claim's directory), every added destination
/// must be resolved anyway, and a bind is asked whether it is a directory only when a
/// destination the image's symlinks lead elsewhere lands inside it: a create in a pod asks
/// none of the mounts it adds (65 for a CDI request on NVIDIA's 8-GPU spec), and nothing is
/// looked up below a path the image lacks.
pub fn check_added_mounts<'a>(
    binds: &[(&'a str, &'a str)],
    rootfs: &Path,
    added: impl IntoIterator<Item = &'a Mount>,
    kinds: impl FnOnce(&[&str]) -> Vec<Option<bool>>,
) -> Result<(), MountCheckError> {
    let added: Vec<&Mount> = added.into_iter().collect();
    if added.is_empty() {
        return Ok(());
    }
    let added_here: foldhash::HashSet<&str> =
        added.iter().map(|m| m.container_path.as_str()).collect();
    let mut sources: Vec<&str> = Vec::new();
    let binds: Vec<Bind> = binds
        .iter()
        .map(|&(destination, source)| {
            let added = added_here.contains(destination).then(|| {
                sources.push(source);
                sources.len() - 1
            });
            Bind {
                destination,
                source,
                added,
                is_dir: Default::default(),
                resolved: Default::default(),
            }
        })
        .collect();
    // Asked once, when an added source's type is first needed.
    let (asker, known) = (Cell::new(Some(kinds)), OnceCell::new());
    let known = |i: usize| -> Option<bool> {
        let known: &Vec<Option<bool>> =
            known.get_or_init(|| asker.take().map_or_else(Vec::new, |ask| ask(&sources)));
        known.get(i).copied().flatten()
    };
    let own_dir = binds
        .iter()
        .filter(|b| b.added.is_none())
        .any(|b| b.is_dir(known));
    if !own_dir
        && !binds
            .iter()
            .filter(|b| b.added.is_some())
            .any(|b| b.is_dir(known))
    {
        return Ok(());
    }
    let Some(mut root) = RootFs::open(rootfs) else {
        return Ok(());
    };
    // Every added destination resolved first, and kept as its bind's: a destination the
    // image's symlinks lead elsewhere (any under `/lib` in a merged-/usr image) is compared
    // with every bind's, and asking whether a bind is a directory is left to the binds it
    // lands in (asking every added source's kind cost a pod's create 19 system calls).
    let by_destination: foldhash::HashMap<&str, &Bind> =
        binds.iter().rev().map(|b| (b.destination, b)).collect();
    let resolved: Vec<String> = added
        .iter()
        .map(|m| {
            let r = root.resolve(&m.container_path);
            if let Some(b) = by_destination.get(m.container_path.as_str()) {
                let _ = b.resolved.set(r.clone());
            }
            r
        })
        .collect();
    for (m, resolved) in added.iter().zip(resolved) {
        // A destination inside a volume (the innermost: the last mounted): fine only where the
        // host directory has its mountpoint already (GKE's driver directory at
        // `/usr/local/nvidia`); anywhere else runc would create it on the host.
        let volume = binds
            .iter()
            .filter(|b| {
                b.added.is_none()
                    && b.destination != m.container_path
                    && b.is_dir(known)
                    && is_within(
                        &resolved,
                        b.resolved.get_or_init(|| root.resolve(b.destination)),
                    )
            })
            .max_by_key(|b| b.resolved.get().map_or(0, String::len));
        // Files only (the driver's, beside which the hook makes links): an added directory (the
        // MPS pipe directory under a pod's `/tmp` volume) is left to the check below.
        let is_file = || {
            by_destination
                .get(m.container_path.as_str())
                .is_some_and(|own| !own.is_dir(known))
        };
        if let Some(b) = volume.filter(|_| is_file()) {
            let inside = b.resolved.get().map_or("", String::as_str);
            let rest = resolved[inside.trim_end_matches('/').len()..].trim_start_matches('/');
            if !host_has(b.source, rest) {
                let folder = m.container_path.rsplit_once('/').map_or("/", |(d, _)| d);
                return Err(IntoVolume {
                    destination: m.container_path.clone(),
                    bind: b.destination.to_string(),
                    source_path: b.source.to_string(),
                    missing: join(b.source.trim_end_matches('/'), rest),
                    folder: if folder.is_empty() { "/" } else { folder }.to_string(),
                }
                .into());
            }
        }
        // Otherwise a destination written inside a volume is the operator's choice; only the
        // image's symlinks leading there are refused.
        if resolved == *as_written(&m.container_path) {
            continue;
        }
        // Every bind but the mount itself (a spec's own volumes, such as a DRA claim's MPS
        // directory, count: they are mounted from the host too).
        let into = binds.iter().find(|b| {
            b.destination != m.container_path
                && is_within(
                    &resolved,
                    b.resolved.get_or_init(|| root.resolve(b.destination)),
                )
                && b.is_dir(known)
        });
        if let Some(b) = into {
            return Err(IntoBindMount {
                destination: m.container_path.clone(),
                resolved,
                bind: b.destination.to_string(),
                source_path: b.source.to_string(),
            }
            .into());
        }
    }
    Ok(())
}

/// Whether the host directory `source` has `rest` (relative, clean) with no symlink on the
/// way, looked up by file descriptor below it: only then does runc find its mountpoint there
/// rather than create one. A source that cannot be opened counts as having it (runc fails on
/// it itself).
fn host_has(source: &str, rest: &str) -> bool {
    let Some(mut dir) = RootFs::open(Path::new(source)) else {
        return true;
    };
    let path = join("/", rest);
    dir.resolve(&path) == path && !dir.missing.contains(&path)
}

/// A destination as it is written, cleaned and made absolute (what [`RootFs::resolve`] gives
/// when no symlink is on the way); an absolute one is not joined to `/` first, which made
/// every destination `//...` and cleaned it by splitting and joining (a pod's create: 111,000
/// instructions for 65 mounts, callgrind), and a clean one is its own form (no copy).
fn as_written(destination: &str) -> Cow<'_, str> {
    if destination.starts_with('/') && is_clean(destination) {
        Cow::Borrowed(destination)
    } else if destination.starts_with('/') {
        Cow::Owned(go_clean(destination))
    } else {
        Cow::Owned(go_clean(&join("/", destination)))
    }
}

/// The root filesystem of a config.json in `bundle_dir` (`root.path`, relative to the bundle).
pub fn rootfs_path(spec: &Value, bundle_dir: &Path) -> Option<PathBuf> {
    let p = spec.pointer("/root/path")?.as_str()?;
    Some(bundle_dir.join(p))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::os::unix::fs::symlink;

    /// Nothing known of the added sources: each is `stat`ed.
    fn unknown(sources: &[&str]) -> Vec<Option<bool>> {
        vec![None; sources.len()]
    }

    /// The check over `spec`'s bind mounts, as `create` gives them.
    fn check(
        spec: &Value,
        r: &Path,
        added: &[Mount],
        kinds: impl FnOnce(&[&str]) -> Vec<Option<bool>>,
    ) -> Result<(), IntoBindMount> {
        check_any(spec, r, added, kinds).map_err(|e| match e {
            MountCheckError::IntoBindMount(e) => *e,
            other => panic!("{other}"),
        })
    }

    fn check_any(
        spec: &Value,
        r: &Path,
        added: &[Mount],
        kinds: impl FnOnce(&[&str]) -> Vec<Option<bool>>,
    ) -> Result<(), MountCheckError> {
        check_added_mounts(&crate::edits::binds(spec), r, added, kinds)
    }

    fn lib(dest: &str) -> Mount {
        Mount {
            host_path: format!(
                "/usr/lib/x86_64-linux-gnu/{}",
                dest.rsplit('/').next().unwrap()
            ),
            container_path: dest.into(),
            kind: Some("bind".into()),
            options: vec!["ro".into(), "nosuid".into(), "nodev".into(), "bind".into()],
        }
    }

    #[test]
    fn symlinks_resolve_inside_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        std::fs::create_dir_all(r.join("usr/lib/x86_64-linux-gnu")).unwrap();
        symlink("usr/lib", r.join("lib")).unwrap();
        symlink("/../../..", r.join("usr/up")).unwrap();
        symlink("loop2", r.join("loop1")).unwrap();
        symlink("loop1", r.join("loop2")).unwrap();
        let mut root = RootFs::open(r).unwrap();
        assert_eq!(
            root.resolve("/lib/x86_64-linux-gnu/libcuda.so.1"),
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
        );
        assert_eq!(root.resolve("/usr/up/etc/x"), "/etc/x");
        assert_eq!(root.resolve("/../../etc/x"), "/etc/x");
        assert_eq!(root.resolve("/missing/dir/x"), "/missing/dir/x");
        // Below a missing directory nothing is looked up, and `..` climbs back out of it.
        assert!(root.missing.contains("/missing/dir/x"));
        assert_eq!(
            root.resolve("/missing/../lib/x86_64-linux-gnu/x"),
            "/usr/lib/x86_64-linux-gnu/x"
        );
        // A loop stops at the bound and leaves the rest as written.
        assert!(root.resolve("/loop1/x").ends_with("/x"));
    }

    #[test]
    fn a_library_led_into_a_bind_mount_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        std::fs::create_dir_all(r.join("usr/lib")).unwrap();
        std::fs::create_dir_all(r.join("tmp/nvidia-mps")).unwrap();
        symlink("/tmp/nvidia-mps", r.join("usr/lib/x86_64-linux-gnu")).unwrap();
        let added = vec![lib("/usr/lib/x86_64-linux-gnu/libcuda.so.1")];
        let spec = json!({"root": {"path": "rootfs"}, "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/tmp/nvidia-mps", "type": "bind",
             "source": "/var/lib/kubelet/plugins/gpu.nvidia.com/mps/x/pipe",
             "options": ["rw", "nosuid", "nodev", "bind"]},
            // The added mount itself, as edits::apply wrote it.
            {"destination": "/usr/lib/x86_64-linux-gnu/libcuda.so.1", "type": "bind",
             "source": "/usr/lib/x86_64-linux-gnu/libcuda.so.1", "options": ["ro", "bind"]},
        ]});
        let err = check(&spec, r, &added, unknown).unwrap_err();
        assert_eq!(err.resolved, "/tmp/nvidia-mps/libcuda.so.1");
        assert_eq!(err.bind, "/tmp/nvidia-mps");
        assert!(err.to_string().contains("on the host"), "{err}");

        // The same image without the volume, or with the directory real: fine.
        let no_volume = json!({"mounts": [spec["mounts"][0], spec["mounts"][2]]});
        assert_eq!(check(&no_volume, r, &added, unknown), Ok(()));
        std::fs::remove_file(r.join("usr/lib/x86_64-linux-gnu")).unwrap();
        std::fs::create_dir(r.join("usr/lib/x86_64-linux-gnu")).unwrap();
        assert_eq!(check(&spec, r, &added, unknown), Ok(()));
    }

    /// The MPS directory as a mount nvshim adds (a DRA claim's CDI spec brings it): refused
    /// the same; and not `stat`ed when the caller says its source is not a directory (a
    /// legacy request's driver files), so then the check trusts it.
    #[test]
    fn an_added_directory_counts_unless_the_caller_knows_it_is_not_one() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        let pipe = dir.path().join("pipe");
        std::fs::create_dir_all(&pipe).unwrap();
        std::fs::create_dir_all(r.join("usr/lib")).unwrap();
        symlink("/tmp/nvidia-mps", r.join("usr/lib/x86_64-linux-gnu")).unwrap();
        let mut mps = lib("/tmp/nvidia-mps");
        mps.host_path = pipe.to_string_lossy().into_owned();
        let added = vec![mps, lib("/usr/lib/x86_64-linux-gnu/libcuda.so.1")];
        let spec = json!({"mounts": [
            {"destination": "/tmp/nvidia-mps", "type": "bind", "source": added[0].host_path,
             "options": ["rw", "bind"]},
            {"destination": "/usr/lib/x86_64-linux-gnu/libcuda.so.1", "type": "bind",
             "source": added[1].host_path, "options": ["ro", "bind"]},
        ]});
        let err = check(&spec, r, &added, unknown).unwrap_err();
        assert_eq!(err.bind, "/tmp/nvidia-mps");
        let trusted = |sources: &[&str]| {
            assert_eq!(sources, [added[0].host_path.as_str(), &added[1].host_path]);
            vec![Some(false), None]
        };
        assert_eq!(check(&spec, r, &added, trusted), Ok(()));
    }

    /// The added sources' types are asked for once, and not at all where no added source
    /// matters: a pod's directory volume, no destination led elsewhere.
    #[test]
    fn added_sources_asked_once_and_only_when_needed() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        std::fs::create_dir_all(r.join("usr/lib/x86_64-linux-gnu")).unwrap();
        let added = vec![
            lib("/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
            lib("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"),
        ];
        let mut mounts: Vec<Value> = added
            .iter()
            .map(|m| json!({"destination": m.container_path, "type": "bind", "source": m.host_path, "options": ["ro", "bind"]}))
            .collect();
        let asked = Cell::new(0);
        let ask = |sources: &[&str]| {
            asked.set(asked.get() + 1);
            vec![Some(false); sources.len()]
        };
        let spec = json!({"mounts": mounts});
        assert_eq!(check(&spec, r, &added, ask), Ok(()));
        assert_eq!(asked.get(), 1);
        // A pod's service-account directory: destinations resolved, sources not asked.
        mounts.push(
            json!({"destination": "/var/run/secrets/kubernetes.io/serviceaccount",
            "type": "bind", "source": r.to_str().unwrap(), "options": ["rbind", "ro"]}),
        );
        let spec = json!({"mounts": mounts});
        assert_eq!(check(&spec, r, &added, ask), Ok(()));
        assert_eq!(asked.get(), 1);
        // A merged-/usr image leads `/lib/...` into `/usr/lib/...`, inside no bind: still not
        // asked (only a bind a destination lands in is asked whether it is a directory).
        symlink("usr/lib", r.join("lib")).unwrap();
        let mut added = added;
        added.push(lib("/lib/firmware/nvidia/gsp_ga10x.bin"));
        mounts.push(
            json!({"destination": "/lib/firmware/nvidia/gsp_ga10x.bin", "type": "bind",
            "source": "/lib/firmware/nvidia/gsp_ga10x.bin", "options": ["ro", "bind"]}),
        );
        let spec = json!({"mounts": mounts});
        assert_eq!(check(&spec, r, &added, ask), Ok(()));
        assert_eq!(asked.get(), 1);
    }

    #[test]
    fn a_destination_written_inside_a_volume_is_the_operator_s_choice() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        std::fs::create_dir_all(r.join("usr/local/nvidia/lib64")).unwrap();
        let added = vec![lib("/usr/local/nvidia/lib64/libcuda.so.1")];
        let spec = json!({"mounts": [
            {"destination": "/usr/local/nvidia", "type": "bind", "source": "/home/kubernetes/bin/nvidia",
             "options": ["rbind", "ro"]},
        ]});
        assert_eq!(check(&spec, r, &added, unknown), Ok(()));
    }

    /// A volume at the driver's library folder, at a folder above it, or at `/usr/bin` (where
    /// the driver's binaries go): refused unless the host directory has the mountpoint already
    /// (GKE's driver directory as `/usr/local/nvidia`); an added directory is not (the MPS
    /// pipe directory under a pod's `/tmp`).
    #[test]
    fn a_file_into_a_volume_without_its_mountpoint_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path().join("rootfs");
        std::fs::create_dir_all(r.join("usr/lib/x86_64-linux-gnu")).unwrap();
        std::fs::create_dir_all(r.join("usr/bin")).unwrap();
        let volume = dir.path().join("volume");
        std::fs::create_dir_all(&volume).unwrap();
        let v = volume.to_str().unwrap();
        let smi = Mount {
            host_path: "/usr/bin/nvidia-smi".into(),
            ..lib("/usr/bin/nvidia-smi")
        };
        let lib64 = lib("/usr/lib/x86_64-linux-gnu/libcuda.so.1");
        let files = |_: &[&str]| vec![Some(false); 2];
        let spec_with = |at: &str| {
            json!({"mounts": [
                {"destination": at, "type": "bind", "source": v, "options": ["rbind", "rw"]},
                {"destination": lib64.container_path, "type": "bind", "source": lib64.host_path, "options": ["ro", "bind"]},
                {"destination": smi.container_path, "type": "bind", "source": smi.host_path, "options": ["ro", "bind"]},
            ]})
        };
        let added = vec![lib64.clone(), smi.clone()];
        for (at, destination, missing) in [
            (
                "/usr/lib/x86_64-linux-gnu",
                lib64.container_path.as_str(),
                format!("{v}/libcuda.so.1"),
            ),
            (
                "/usr/lib",
                lib64.container_path.as_str(),
                format!("{v}/x86_64-linux-gnu/libcuda.so.1"),
            ),
            (
                "/usr/bin",
                smi.container_path.as_str(),
                format!("{v}/nvidia-smi"),
            ),
        ] {
            let err = check_any(&spec_with(at), &r, &added, files).unwrap_err();
            let MountCheckError::IntoVolume(e) = &err else {
                panic!("{at}: {err}");
            };
            assert_eq!(
                (e.destination.as_str(), e.bind.as_str(), e.missing.as_str()),
                (destination, at, missing.as_str()),
                "{err}"
            );
            assert!(err.to_string().contains(v), "{err}");
        }
        // The host directory has the mountpoints: fine.
        std::fs::write(volume.join("libcuda.so.1"), b"").unwrap();
        std::fs::write(volume.join("nvidia-smi"), b"").unwrap();
        for at in ["/usr/lib/x86_64-linux-gnu", "/usr/bin"] {
            assert_eq!(check_any(&spec_with(at), &r, &added, files), Ok(()), "{at}");
        }
        // A link where the mountpoint should be is not one: runc would follow it.
        std::fs::remove_file(volume.join("nvidia-smi")).unwrap();
        symlink("/etc/passwd", volume.join("nvidia-smi")).unwrap();
        assert!(check_any(&spec_with("/usr/bin"), &r, &added, files).is_err());
        // An added directory under a pod's `/tmp`: not this check's business.
        let pipe = dir.path().join("pipe");
        std::fs::create_dir_all(&pipe).unwrap();
        let mps = Mount {
            host_path: pipe.to_string_lossy().into_owned(),
            ..lib("/tmp/nvidia-mps")
        };
        let spec = json!({"mounts": [
            {"destination": "/tmp", "type": "bind", "source": v, "options": ["rbind", "rw"]},
            {"destination": "/tmp/nvidia-mps", "type": "bind", "source": mps.host_path, "options": ["rw", "bind"]},
        ]});
        assert_eq!(check_any(&spec, &r, &[mps], unknown), Ok(()));
    }

    #[test]
    fn merged_usr_images_are_fine() {
        // Debian and Ubuntu images: /lib -> usr/lib; Docker's file binds in /etc.
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        std::fs::create_dir_all(r.join("usr/lib/x86_64-linux-gnu")).unwrap();
        std::fs::create_dir_all(r.join("etc")).unwrap();
        symlink("usr/lib", r.join("lib")).unwrap();
        let added = vec![lib("/lib/x86_64-linux-gnu/libcuda.so.1")];
        let spec = json!({"mounts": [
            {"destination": "/etc/hosts", "type": "bind", "source": "/var/lib/docker/x/hosts",
             "options": ["rbind", "rprivate"]},
            {"destination": "/etc/resolv.conf", "type": "bind", "source": "/var/lib/docker/x/resolv.conf",
             "options": ["rbind", "rprivate"]},
        ]});
        assert_eq!(check(&spec, r, &added, unknown), Ok(()));
    }
}
