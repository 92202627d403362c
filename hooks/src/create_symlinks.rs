//! The `create-symlinks` hook: `--link TARGET::LINK`, as NVIDIA's `nvidia-cdi-hook
//! create-symlinks`. TARGET is written verbatim (relative or absolute; it is only ever the
//! content of the link, never opened). LINK is a path inside the container root, relative paths
//! taken from the root (NVIDIA's CVE-2024-0134 fix, `d0d85a8c`).
//!
//! For each link: the parent directory is resolved inside the root, missing components created
//! there (`..` stops at the root, symlinks on the way stay inside it); if LINK is already a
//! symlink to TARGET nothing happens; otherwise a symlink is made under a temporary name and
//! renamed over LINK, which replaces a file or symlink atomically and fails on a directory
//! (NVIDIA's v1.19.1 fix for the TOCTOU race, `3e9bab5e`).
//!
//! Resolution never crosses into another mount, with one exception: a link below `/dev` is
//! resolved from the container's `/dev` (the runtime's tmpfs, where NVIDIA's specs put
//! `/dev/dri/by-path` links), which must itself be a directory, not an image symlink. Any other
//! mount below the root is a volume or a host directory mounted read-write (the MPS pipe
//! directory, a socket directory), and an image symlink such as
//! `usr/lib/x86_64-linux-gnu -> /tmp/nvidia-mps` would otherwise have the hook create directories
//! and links on the host, as root.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use thiserror::Error;

use crate::root::{self, Root, RootError};

#[derive(Debug, Error)]
pub enum SymlinkError {
    #[error("--link {0:?}: expected TARGET::LINK")]
    Syntax(String),
    #[error("--link {0:?}: LINK names no file")]
    NoName(String),
    #[error(transparent)]
    Root(#[from] RootError),
    #[error("--link {0:?}: {1}: the link's directory is on another mount than the container's root (a volume or host directory mounted into it, reached through the image's own paths); links are only made in the root filesystem and /dev, so nothing is written on the host: fix the image's symlink or the mount")]
    OtherMount(String, RootError),
    #[error("{path}: {source}")]
    Link {
        path: String,
        #[source]
        source: io::Error,
    },
}

/// One `--link`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub target: String,
    pub link: String,
}

impl Link {
    /// Parses `TARGET::LINK` (exactly one `::`, both sides non-empty).
    pub fn parse(spec: &str) -> Result<Link, SymlinkError> {
        let mut parts = spec.split("::");
        match (parts.next(), parts.next(), parts.next()) {
            (Some(target), Some(link), None) if !target.is_empty() && !link.is_empty() => {
                Ok(Link {
                    target: target.to_string(),
                    link: link.to_string(),
                })
            }
            _ => Err(SymlinkError::Syntax(spec.to_string())),
        }
    }
}

/// What a run did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    /// Links created or replaced (container paths).
    pub created: Vec<String>,
    /// Links already right.
    pub unchanged: Vec<String>,
}

/// `parent` relative to `/dev` when it is `/dev` or below (`.` and empty components aside; a
/// `..` anywhere keeps it on the root's rules).
fn dev_relative(parent: &str) -> Option<&str> {
    let trimmed = parent.trim_start_matches('/');
    let below = trimmed.strip_prefix("dev")?;
    if !(below.is_empty() || below.starts_with('/')) || parent.split('/').any(|c| c == "..") {
        return None;
    }
    Some(if below.is_empty() { "/" } else { below })
}

/// The container's `/dev` as a root of its own; made in the root filesystem when missing (an
/// unpacked image before its runtime mounts `/dev`).
fn dev_root(root: &Root) -> Result<Root, SymlinkError> {
    match root.child("dev") {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
            root.mkdir_all("/dev", 0o755, true)?;
            Ok(root.child("dev")?)
        }
        other => Ok(other?),
    }
}

/// EXDEV said in words: the link's directory is on another mount.
fn crossing(e: RootError, spec: &str) -> SymlinkError {
    if e.raw_os_error() == Some(libc::EXDEV) {
        SymlinkError::OtherMount(spec.to_string(), e)
    } else {
        SymlinkError::Root(e)
    }
}

/// Creates the links below `root`. Stops at the first error.
pub fn run(root: &Root, links: &[Link]) -> Result<Report, SymlinkError> {
    let mut report = Report::default();
    let mut seen: Vec<&Link> = Vec::new();
    // The directory of the link before: a driver's links share one.
    let mut last: Option<(&str, OwnedFd)> = None;
    for l in links {
        if seen.contains(&l) {
            continue;
        }
        seen.push(l);
        let spec = format!("{}::{}", l.target, l.link);
        let (parent, name) =
            root::split_parent(&l.link).ok_or_else(|| SymlinkError::NoName(spec.clone()))?;
        if last.as_ref().is_some_and(|(p, _)| *p != parent) {
            last = None;
        }
        let dir = match &mut last {
            Some((_, dir)) => &*dir,
            slot @ None => {
                let dir = match dev_relative(parent) {
                    Some(below) => dev_root(root)?.mkdir_all(below, 0o755, true),
                    None => root.mkdir_all(parent, 0o755, true),
                }
                .map_err(|e| crossing(e, &spec))?;
                &slot.insert((parent, dir)).1
            }
        };
        let display = root.display(&l.link);
        let made = root::create_symlink(dir.as_fd(), name, &l.target).map_err(|source| {
            SymlinkError::Link {
                path: display.clone(),
                source,
            }
        })?;
        if made {
            report.created.push(l.link.clone());
            continue;
        }
        let current =
            root::symlink_target(dir.as_fd(), name).map_err(|source| SymlinkError::Link {
                path: display.clone(),
                source,
            })?;
        if current.as_deref() == Some(l.target.as_bytes()) {
            report.unchanged.push(l.link.clone());
            continue;
        }
        root::replace_symlink(dir.as_fd(), name, &l.target).map_err(|source| {
            SymlinkError::Link {
                path: display,
                source,
            }
        })?;
        report.created.push(l.link.clone());
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;
    use std::path::Path;

    use crate::root::Resolver;

    fn link(t: &str, l: &str) -> Link {
        Link {
            target: t.into(),
            link: l.into(),
        }
    }

    fn read_link(p: &Path) -> String {
        std::fs::read_link(p)
            .unwrap()
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn parses_target_and_link() {
        assert_eq!(
            Link::parse("libcuda.so.1::/usr/lib/libcuda.so").unwrap(),
            link("libcuda.so.1", "/usr/lib/libcuda.so")
        );
        for bad in ["a", "::b", "a::", "a::b::c", ""] {
            assert!(Link::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn creates_replaces_and_skips() {
        for resolver in [Resolver::Openat2, Resolver::Walk] {
            let dir = tempfile::tempdir().unwrap();
            let root = Root::open(dir.path()).unwrap();
            root.set_resolver(resolver);
            let links = [
                link(
                    "libcuda.so.580.65.06",
                    "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                ),
                link("libcuda.so.1", "usr/lib/x86_64-linux-gnu/libcuda.so"),
                link("../card1", "/dev/dri/by-path/pci-0000:1b:00.0-card"),
            ];
            let r = run(&root, &links).unwrap();
            assert_eq!(r.created.len(), 3);
            let lib = dir.path().join("usr/lib/x86_64-linux-gnu");
            assert_eq!(read_link(&lib.join("libcuda.so.1")), "libcuda.so.580.65.06");
            assert_eq!(read_link(&lib.join("libcuda.so")), "libcuda.so.1");
            // Second run: nothing to do.
            let r = run(&root, &links).unwrap();
            assert!(r.created.is_empty());
            assert_eq!(r.unchanged.len(), 3);
            // A wrong link and a regular file are replaced.
            std::fs::remove_file(lib.join("libcuda.so")).unwrap();
            std::fs::write(lib.join("libcuda.so"), "x").unwrap();
            std::fs::remove_file(lib.join("libcuda.so.1")).unwrap();
            symlink("/etc/passwd", lib.join("libcuda.so.1")).unwrap();
            let r = run(&root, &links).unwrap();
            assert_eq!(r.created.len(), 2);
            assert_eq!(read_link(&lib.join("libcuda.so")), "libcuda.so.1");
            // A directory at LINK is an error, not a link inside it.
            std::fs::create_dir(dir.path().join("d")).unwrap();
            assert!(run(&root, &[link("x", "/d")]).is_err());
            assert!(std::fs::read_dir(dir.path().join("d"))
                .unwrap()
                .next()
                .is_none());
        }
    }

    #[test]
    fn dev_relative_paths() {
        assert_eq!(dev_relative("/dev/dri/by-path"), Some("/dri/by-path"));
        assert_eq!(dev_relative("dev"), Some("/"));
        assert_eq!(dev_relative("/dev/"), Some("/"));
        assert_eq!(dev_relative("/devices/x"), None);
        assert_eq!(dev_relative("/dev/../etc"), None);
        assert_eq!(dev_relative("/usr/dev"), None);
    }

    #[test]
    fn a_symlinked_dev_is_refused() {
        for resolver in [Resolver::Openat2, Resolver::Walk] {
            let host = tempfile::tempdir().unwrap();
            let outside = host.path().join("outside");
            let rootdir = host.path().join("root");
            std::fs::create_dir_all(rootdir.join("run")).unwrap();
            std::fs::create_dir(&outside).unwrap();
            // An image whose dev is a symlink to a directory a volume is mounted on.
            symlink("/run", rootdir.join("dev")).unwrap();
            let root = Root::open(&rootdir).unwrap();
            root.set_resolver(resolver);
            assert!(run(&root, &[link("../card1", "/dev/dri/by-path/x")]).is_err());
            assert!(!rootdir.join("run/dri").exists());
        }
    }

    #[test]
    fn links_are_not_made_through_an_image_symlink_into_a_mounted_host_directory() {
        // The red team's image: its library directory is a symlink to where the DRA driver
        // mounts the MPS pipe directory read-write from the host.
        for resolver in [Resolver::Openat2, Resolver::Walk] {
            let host = tempfile::tempdir().unwrap();
            let pipe = host.path().join("mps-pipe");
            let rootdir = host.path().join("root");
            std::fs::create_dir_all(&pipe).unwrap();
            std::fs::create_dir_all(rootdir.join("tmp/nvidia-mps")).unwrap();
            std::fs::create_dir_all(rootdir.join("usr/lib")).unwrap();
            symlink("/tmp/nvidia-mps", rootdir.join("usr/lib/x86_64-linux-gnu")).unwrap();
            let Some(_mount) =
                crate::root::tests::BindMount::new(&pipe, &rootdir.join("tmp/nvidia-mps"))
            else {
                eprintln!("skipped: bind mounts need root");
                return;
            };
            let root = Root::open(&rootdir).unwrap();
            root.set_resolver(resolver);
            for l in [
                "/usr/lib/x86_64-linux-gnu/libcuda.so",
                "/usr/lib/x86_64-linux-gnu/vdpau/libvdpau_nvidia.so",
            ] {
                let err = run(&root, &[link("libcuda.so.1", l)]).unwrap_err();
                assert!(matches!(err, SymlinkError::OtherMount(..)), "{err}");
                assert!(err.to_string().contains("another mount"), "{err}");
            }
            assert_eq!(
                std::fs::read_dir(&pipe).unwrap().count(),
                0,
                "nothing on the host"
            );
        }
    }

    #[test]
    fn dotdot_and_symlinked_parents_stay_inside() {
        for resolver in [Resolver::Openat2, Resolver::Walk] {
            let host = tempfile::tempdir().unwrap();
            let outside = host.path().join("outside");
            std::fs::create_dir(&outside).unwrap();
            let rootdir = host.path().join("root");
            std::fs::create_dir(&rootdir).unwrap();
            symlink(&outside, rootdir.join("abs")).unwrap();
            symlink("../../..", rootdir.join("up")).unwrap();
            let root = Root::open(&rootdir).unwrap();
            root.set_resolver(resolver);
            run(&root, &[link("t", "/../../../../x")]).unwrap();
            assert_eq!(read_link(&rootdir.join("x")), "t");
            run(&root, &[link("t", "/up/y")]).unwrap();
            assert_eq!(read_link(&rootdir.join("y")), "t");
            // `abs` points at a host path, which does not exist inside the root: a dangling
            // parent is an error, and nothing appears on the host.
            assert!(run(&root, &[link("t", "/abs/z")]).is_err());
            assert!(std::fs::read_dir(&outside).unwrap().next().is_none());
            assert!(matches!(
                run(&root, &[link("t", "/..")]),
                Err(SymlinkError::NoName(_))
            ));
        }
    }
}
