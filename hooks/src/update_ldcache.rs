//! The `update-ldcache` hook: makes the injected libraries resolvable by the container's
//! dynamic linker, without running a binary from the container or the host.
//!
//! glibc images (anything that is not musl): `/etc/ld.so.conf` is created if missing (with
//! `include /etc/ld.so.conf.d/*.conf`), the folders that the image's configuration and its
//! ldconfig's built-in directories do not already name (compared by inode, as ldconfig does) are
//! written to `/etc/ld.so.conf.d/00-nvshim.conf`, and `/etc/ld.so.cache` is rewritten by
//! [`crate::ldconfig`] and [`crate::ldcache`]:
//! - with an existing cache, every entry is kept except those of the scanned folders, which are
//!   rescanned (so a stale entry of a scanned folder whose file is gone disappears, as ldconfig
//!   would do). The rest of the image's libraries keep resolving exactly as before: the hook
//!   never re-indexes the whole image (nvidia-container-toolkit#123, docs/field-notes.md §2.3).
//!   When config.json's mounts are known ([`Options::mounted`]) and a folder is one the image's
//!   own configuration names, on the root's file system (no mount over it or above it), the
//!   image's ldconfig indexed its files: only the names mounted there and the names ldconfig
//!   files those libraries under (a SONAME or development link, made by create-symlinks or the
//!   image; [`Scanner::search_dir_only`]) are read, the image's entries for the other names
//!   that are still there are kept, those whose name is gone dropped. A driver's libraries go
//!   into `/usr/lib/x86_64-linux-gnu`, beside the 100 to 200 of a Debian or Ubuntu base image,
//!   every one of which ldconfig would open and read (about six system calls each): on the
//!   bench's Debian 12 image, a GPU container's hooks 3.83 → 2.67 ms (docs/benchmarks.md).
//!   What it gives up, by design: a library of the image changed after the image's ldconfig
//!   ran keeps the image's entry, where NVIDIA's hook (a full `ldconfig`) would read it again;
//!   The directories named by `/etc/ld.so.conf.d/00-compat-*.conf` (what `enable-cuda-compat`
//!   writes just before this hook, nvshim's or NVIDIA's) are rescanned too: NVIDIA's hook
//!   relies on a full ldconfig run to index them;
//! - with no cache, or one that cannot be parsed, every configured directory is scanned: the
//!   result is what `ldconfig -r ROOT` writes.
//!
//! The generator string differs from ldconfig's (`nvshim-hook <version>`); everything else is
//! byte-for-byte ldconfig 2.36's, which the tests check against `/sbin/ldconfig -r`.
//!
//! musl images (`/etc/alpine-release` or `/lib/ld-musl-<arch>.so.1`): the folders are appended
//! to `/etc/ld-musl-<arch>.path` (created with musl's default `/lib:/usr/local/lib:/usr/lib`),
//! and the SONAME links are made in the folders, since musl has no cache and looks names up as
//! files (NVIDIA's 1.18.2 fix for Alpine).
//!
//! Only on a machine the native writer does not know (not x86-64 or aarch64) is the cache
//! built by the host's ldconfig, isolated as [`crate::fallback`] describes.
//!
//! Writes below `/etc` are resolved with `no_xdev`: an image whose `/etc` (or `ld.so.conf.d`)
//! is a symlink into a directory the runtime bind-mounted from the host (for example the
//! writable `/tmp/nvidia-mps`) gets an error instead of files written on the host.

use std::collections::BTreeSet;

// foldhash (seeded per process) where std would use SipHash: the listings hashed here are a
// library folder's hundred-odd names, a few lookups each.
use foldhash::{HashMap, HashMapExt as _, HashSet, HashSetExt as _};
use std::io;
use std::os::fd::AsFd;
use std::path::PathBuf;

use thiserror::Error;

use crate::elf::Arch;
use crate::fallback::{self, FallbackError};
use crate::ldcache::{self, CacheEntry, MAX_CACHE_LEN};
use crate::ldconfig::{self, Listing, Scan, Scanner};
use crate::root::{self, Root, RootError};

/// The configuration file nvshim owns.
pub const OWN_CONF: &str = "/etc/ld.so.conf.d/00-nvshim.conf";
const LD_SO_CONF: &str = "/etc/ld.so.conf";
const LD_SO_CACHE: &str = "/etc/ld.so.cache";
/// What glibc's packages ship in `/etc/ld.so.conf`.
const DEFAULT_LD_SO_CONF: &str = "include /etc/ld.so.conf.d/*.conf\n";
/// musl's built-in library path (`ldso/dynlink.c`).
const MUSL_DEFAULT_PATH: &str = "/lib:/usr/local/lib:/usr/lib";
/// Largest musl path file read.
const MAX_MUSL_PATH_LEN: u64 = 1 << 20;

#[derive(Debug, Error)]
pub enum UpdateError {
    #[error(transparent)]
    Root(#[from] RootError),
    #[error("{path}: {source}")]
    Write {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("--folder {0:?}: not an absolute path")]
    RelativeFolder(String),
    #[error(transparent)]
    Fallback(#[from] FallbackError),
}

/// What to do.
#[derive(Debug, Clone)]
pub struct Options {
    /// Container directories holding the injected libraries.
    pub folders: Vec<String>,
    /// Host ldconfig for the fallback (NVIDIA's `--ldconfig-path`; `@` prefix accepted).
    pub ldconfig_path: Option<PathBuf>,
    /// The cache's generator string.
    pub generator: String,
    /// The image's ldconfig built-in directories; `None` guesses them from the image.
    pub system_dirs: Option<Vec<String>>,
    /// Use the host ldconfig even where the native writer works (tests of the fallback).
    pub force_fallback: bool,
    /// What the runtime mounted into the container (config.json's mount destinations). With
    /// them and the image's own cache, a folder is rescanned for the mounted libraries and the
    /// links to them only (module documentation); `None` rescans every library in it.
    pub mounted: Option<Vec<String>>,
    /// The machine whose ldconfig rules and cache flags apply: the hook's own ([`Arch::host`]),
    /// as it runs on the node whose driver libraries it indexes, and a container runs that
    /// machine's code. Tests set the other one.
    pub arch: Option<Arch>,
}

impl Options {
    /// Options for these folders with the defaults.
    pub fn new(folders: Vec<String>) -> Options {
        Options {
            folders,
            ldconfig_path: None,
            generator: format!("nvshim-hook {}", env!("CARGO_PKG_VERSION")),
            system_dirs: None,
            force_fallback: false,
            mounted: None,
            arch: Arch::host(),
        }
    }
}

/// Which C library the image uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Libc {
    Glibc,
    Musl,
}

/// What a run did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    pub libc: Option<Libc>,
    /// Files written (container paths).
    pub written: Vec<String>,
    /// Cache entries, for glibc.
    pub entries: usize,
    /// Whether the host ldconfig built the cache.
    pub fallback: bool,
    pub warnings: Vec<String>,
}

fn write_error(root: &Root, path: &str, source: io::Error) -> UpdateError {
    UpdateError::Write {
        path: root.display(path),
        source,
    }
}

/// musl's name for `arch` (`/lib/ld-musl-<arch>.so.1`).
fn musl_arch(arch: Option<Arch>) -> &'static str {
    match arch {
        Some(a) => a.musl_name(),
        None => std::env::consts::ARCH,
    }
}

/// Detects musl as NVIDIA's hook does (`/etc/alpine-release`), or by its dynamic linker.
pub fn detect_libc(root: &Root, arch: Option<Arch>) -> Libc {
    let musl_ld = format!("/lib/ld-musl-{}.so.1", musl_arch(arch));
    for path in ["/etc/alpine-release", musl_ld.as_str()] {
        if let Ok(Some(_)) = root.stat(path) {
            return Libc::Musl;
        }
    }
    Libc::Glibc
}

/// Runs the hook on `root`.
pub fn run(root: &Root, opts: &Options) -> Result<Report, UpdateError> {
    let mut report = Report::default();
    let mut folders: Vec<String> = Vec::new();
    for f in &opts.folders {
        if !f.starts_with('/') {
            return Err(UpdateError::RelativeFolder(f.clone()));
        }
        let f = f.trim_end_matches('/');
        let f = if f.is_empty() { "/" } else { f };
        if !folders.iter().any(|g| g == f) {
            folders.push(f.to_string());
        }
    }
    if folders.is_empty() {
        return Ok(report);
    }
    let libc = detect_libc(root, opts.arch);
    report.libc = Some(libc);
    match libc {
        Libc::Musl => musl(root, opts.arch, &folders, &mut report)?,
        Libc::Glibc => glibc(root, opts, &folders, &mut report)?,
    }
    Ok(report)
}

fn musl(
    root: &Root,
    arch: Option<Arch>,
    folders: &[String],
    report: &mut Report,
) -> Result<(), UpdateError> {
    let name = format!("ld-musl-{}.path", musl_arch(arch));
    let path = format!("/etc/{name}");
    let old = root.read_regular(&path, MAX_MUSL_PATH_LEN)?;
    // Bytes, as musl reads them: a directory whose name is not UTF-8 is kept as written.
    let mut content = match &old {
        Some(bytes) => bytes.clone(),
        None => format!("{MUSL_DEFAULT_PATH}\n").into_bytes(),
    };
    let present: Vec<Vec<u8>> = content
        .split(|&b| b == b':' || b == b'\n')
        .map(|s| {
            let mut s = s.trim_ascii();
            while let [rest @ .., b'/'] = s {
                s = rest;
            }
            s.to_vec()
        })
        .filter(|s| !s.is_empty())
        .collect();
    for f in folders {
        if !present.iter().any(|p| p == f.as_bytes()) {
            if !content.is_empty() && !content.ends_with(b"\n") {
                content.push(b'\n');
            }
            content.extend_from_slice(f.as_bytes());
            content.push(b'\n');
        }
    }
    if old.as_deref() != Some(content.as_slice()) {
        let etc = root.mkdir_all("/etc", 0o755, true)?;
        root::replace_file(etc.as_fd(), &name, &content, 0o644)
            .map_err(|e| write_error(root, &path, e))?;
        report.written.push(path);
    }
    // musl finds libraries by file name: make the SONAME links that ldconfig would.
    if let Some(arch) = arch {
        let scanner = Scanner {
            root,
            arch,
            make_links: true,
        };
        let (_, scan) = scanner.scan_dirs(folders.iter().map(|f| f.as_str()));
        report.written.extend(scan.links);
        report.warnings.extend(scan.warnings);
    }
    Ok(())
}

fn render_own_conf(folders: &[&String]) -> String {
    let mut s = String::from(
        "# Written by nvshim-hook update-ldcache: the container's GPU driver libraries.\n",
    );
    for f in folders {
        s.push_str(f);
        s.push('\n');
    }
    s
}

fn glibc(
    root: &Root,
    opts: &Options,
    folders: &[String],
    report: &mut Report,
) -> Result<(), UpdateError> {
    let arch = opts.arch;
    let etc = root.mkdir_all("/etc", 0o755, true)?;
    // ld.so.conf: created if missing; anything but a regular file is an error.
    let conf = root.read_regular(LD_SO_CONF, 1 << 20)?;
    if conf.is_none() {
        root::replace_file(
            etc.as_fd(),
            "ld.so.conf",
            DEFAULT_LD_SO_CONF.as_bytes(),
            0o644,
        )
        .map_err(|e| write_error(root, LD_SO_CONF, e))?;
        report.written.push(LD_SO_CONF.into());
    }
    let system = match (&opts.system_dirs, arch) {
        (Some(dirs), _) => dirs.clone(),
        (None, Some(arch)) => ldconfig::system_dirs(root, arch),
        (None, None) => Vec::new(),
    };
    let conf = conf.as_deref().unwrap_or(DEFAULT_LD_SO_CONF.as_bytes());
    let mut config = ldconfig::read_config_from(root, LD_SO_CONF, Some(conf), &system, OWN_CONF);

    // Folders that exist, with their identity; the rest are reported and skipped, as ldconfig
    // skips a configured directory it cannot stat.
    let mut present: Vec<(&String, u64, u64)> = Vec::new();
    for f in folders {
        match root.stat(f) {
            Ok(Some(st)) if root::is_dir(&st) => present.push((f, st.st_dev, st.st_ino)),
            _ => report
                .warnings
                .push(format!("{}: not a directory; skipped", root.display(f))),
        }
    }
    let new: Vec<&String> = present
        .iter()
        .filter(|(_, dev, ino)| {
            !config
                .named
                .iter()
                .any(|n| !n.own && n.dev == *dev && n.ino == *ino)
        })
        .map(|(f, _, _)| *f)
        .collect();
    if !new.is_empty() {
        let desired = render_own_conf(&new);
        let existing = root.read_regular(OWN_CONF, 1 << 20)?;
        if existing.as_deref() != Some(desired.as_bytes()) {
            let dir = root.mkdir_all("/etc/ld.so.conf.d", 0o755, true)?;
            root::replace_file(dir.as_fd(), "00-nvshim.conf", desired.as_bytes(), 0o644)
                .map_err(|e| write_error(root, OWN_CONF, e))?;
            report.written.push(OWN_CONF.into());
            config = ldconfig::read_config_from(root, LD_SO_CONF, Some(conf), &system, OWN_CONF);
        }
        // An ld.so.conf that does not include ld.so.conf.d: include our file first.
        let missing = new.iter().any(|f| {
            let (_, dev, ino) = present
                .iter()
                .find(|(g, _, _)| g == f)
                .copied()
                .unwrap_or((f, 0, 0));
            config.find(dev, ino).is_none()
        });
        if missing {
            let old = root.read_regular(LD_SO_CONF, 1 << 20)?.unwrap_or_default();
            let mut content = format!("include {OWN_CONF}\n").into_bytes();
            content.extend_from_slice(&old);
            root::replace_file(etc.as_fd(), "ld.so.conf", &content, 0o644)
                .map_err(|e| write_error(root, LD_SO_CONF, e))?;
            report.written.push(LD_SO_CONF.into());
            config = ldconfig::read_config(root, LD_SO_CONF, &system, OWN_CONF);
        }
    }
    report.warnings.append(&mut config.warnings);

    let arch = match arch {
        Some(arch) if !opts.force_fallback => arch,
        _ => {
            let ldconfig = opts
                .ldconfig_path
                .clone()
                .unwrap_or_else(|| PathBuf::from(fallback::DEFAULT_LDCONFIG));
            fallback::run(root, &ldconfig)?;
            report.fallback = true;
            report.written.push(LD_SO_CACHE.into());
            return Ok(());
        }
    };

    // A FIFO, device or directory there, or a file too big to be a cache, is hostile: an
    // error. A symlink loop is only broken: the cache is rebuilt over it, as ldconfig would.
    let old_bytes = match root.read_regular(LD_SO_CACHE, MAX_CACHE_LEN as u64) {
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            report.warnings.push(format!("{e}; replacing it"));
            None
        }
        other => other?,
    };
    let old = match old_bytes.as_deref().map(ldcache::cache_entries) {
        Some(Ok(entries)) => Some(entries),
        Some(Err(e)) => {
            report.warnings.push(format!(
                "{}: {e}; rebuilding it from every configured directory",
                root.display(LD_SO_CACHE)
            ));
            None
        }
        None => None,
    };
    let scanner = Scanner {
        root,
        arch,
        make_links: true,
    };
    let mut hwcaps_names = config.hwcaps_names.clone();
    let mut all: Vec<(CacheEntry, usize, usize)> = match &old {
        None => ldconfig::full_scan(&scanner, &mut config).entries_into(report),
        Some(old) => {
            let mut scan = Scan::default();
            let mut scanned: BTreeSet<usize> = BTreeSet::new();
            // Folders rescanned for what was mounted in them only, with what they listed.
            let mut kept: HashMap<usize, Listing> = HashMap::new();
            let compat: Vec<usize> = compat_dirs(root)
                .into_iter()
                .filter_map(|(dev, ino)| config.find(dev, ino))
                .collect();
            let root_dev = root.dev();
            for &(folder, dev, ino) in &present {
                let Some(i) = config.find(dev, ino) else {
                    continue;
                };
                if scanned.contains(&i) || kept.contains_key(&i) {
                    continue;
                }
                // Only a folder the image's own configuration names was indexed by the
                // image's ldconfig: one that 00-nvshim.conf adds is read whole.
                let only = match &opts.mounted {
                    Some(mounted)
                        if dev == root_dev && !compat.contains(&i) && !new.contains(&folder) =>
                    {
                        let paths = [folder.as_bytes(), config.dirs[i].path.as_slice()];
                        mounted_names(root, mounted, (dev, ino), &paths)
                    }
                    _ => None,
                };
                match only
                    .and_then(|only| scanner.search_dir_only(&mut config, i, &only, &mut scan))
                {
                    Some(listing) => {
                        kept.insert(i, listing);
                    }
                    None => {
                        scanner.search_dir(&mut config, i, false, &mut scan);
                        scanned.insert(i);
                    }
                }
            }
            for i in compat {
                if !kept.contains_key(&i) && scanned.insert(i) {
                    scanner.search_dir(&mut config, i, false, &mut scan);
                }
            }
            let scanned_paths: BTreeSet<&[u8]> = scanned
                .iter()
                .map(|&i| config.dirs[i].path.as_slice())
                .collect();
            let kept_paths: HashMap<&[u8], &Listing> = kept
                .iter()
                .map(|(&i, l)| (config.dirs[i].path.as_slice(), l))
                .collect();
            let rescanned: BTreeSet<&[u8]> = scan
                .entries
                .iter()
                .map(|(e, _, _)| e.path.as_slice())
                .collect();
            let rank: HashMap<&[u8], usize> = config
                .dirs
                .iter()
                .enumerate()
                .rev()
                .map(|(i, d)| (d.path.as_slice(), i))
                .collect();
            let mut all: Vec<(CacheEntry, usize, usize)> = Vec::new();
            for (seq, e) in old.iter().cloned().enumerate() {
                let (dir, file): (&[u8], &[u8]) = match crate::bytes::rfind(b'/', &e.path) {
                    Some(i) => (&e.path[..i], &e.path[i + 1..]),
                    None => (b"", b""),
                };
                if scanned_paths.contains(dir) {
                    continue;
                }
                // In a folder kept from the image's cache: the image's entry stays while its
                // name is there and was not looked at again (then the rescan answers for it).
                if let Some(l) = kept_paths.get(dir) {
                    if !l.names.contains(file)
                        || l.looked_at.contains(file)
                        || rescanned.contains(e.path.as_slice())
                    {
                        continue;
                    }
                }
                if let Some(h) = &e.hwcaps {
                    hwcaps_names.insert(h.clone());
                }
                let r = rank.get(dir).copied().unwrap_or(usize::MAX);
                all.push((e, r, seq));
            }
            all.extend(scan.entries_into(report));
            all
        }
    };
    // ldconfig's order; ties keep directory order, then the order within a directory.
    all.sort_by(|a, b| {
        ldcache::compare(&a.0, &b.0)
            .then(a.1.cmp(&b.1))
            .then(a.2.cmp(&b.2))
    });
    let entries: Vec<CacheEntry> = all.into_iter().map(|(e, _, _)| e).collect();
    report.entries = entries.len();
    let bytes = ldcache::serialize(&entries, &hwcaps_names, &opts.generator);
    if old_bytes.as_deref() != Some(bytes.as_slice()) {
        root::replace_file(etc.as_fd(), "ld.so.cache", &bytes, 0o644)
            .map_err(|e| write_error(root, LD_SO_CACHE, e))?;
        report.written.push(LD_SO_CACHE.into());
    }
    Ok(())
}

/// The names in the folder `id` (named `paths`) at which config.json's `mounted` destinations
/// put something, compared by the identity of their parent directory; `None` when a mount
/// covers the folder itself or a directory above it (its files are then not the image's).
fn mounted_names(
    root: &Root,
    mounted: &[String],
    id: (u64, u64),
    paths: &[&[u8]],
) -> Option<HashSet<Vec<u8>>> {
    let mut names = HashSet::new();
    let mut parents: HashMap<&str, Option<(u64, u64)>> = HashMap::new();
    for m in mounted {
        let m = m.trim_end_matches('/');
        let covers = |p: &&[u8]| {
            m.is_empty()
                || p.strip_prefix(m.as_bytes())
                    .is_some_and(|r| r.is_empty() || r.starts_with(b"/"))
        };
        if paths.iter().any(covers) {
            return None;
        }
        let Some((parent, name)) = m.rsplit_once('/') else {
            continue;
        };
        let parent = if parent.is_empty() { "/" } else { parent };
        if paths.contains(&parent.as_bytes()) {
            names.insert(name.as_bytes().to_vec());
            continue;
        }
        // A directory named otherwise may still be the folder (`/lib` and `/usr/lib` in a
        // merged-/usr image): compared by identity, for library names only (the sockets,
        // binaries and device nodes a GPU container mounts cost no look).
        if !ldconfig::is_dso(name.as_bytes()) {
            continue;
        }
        let pid = *parents.entry(parent).or_insert_with(|| {
            root.stat(parent)
                .ok()
                .flatten()
                .filter(root::is_dir)
                .map(|st| (st.st_dev, st.st_ino))
        });
        if pid == Some(id) && !name.is_empty() {
            names.insert(name.as_bytes().to_vec());
        }
    }
    Some(names)
}

/// The directories (by identity) that `/etc/ld.so.conf.d/00-compat-*.conf` files name: CUDA
/// compat directories added by `enable-cuda-compat`. Files that cannot be read, and lines that
/// name no directory, are left out (the configuration reader reports them).
fn compat_dirs(root: &Root) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut budget = ldconfig::Budget::default();
    for file in ldconfig::glob(root, b"/etc/ld.so.conf.d/00-compat-*.conf", &mut budget) {
        let Ok(Some(data)) = root.read_regular(&file, 1 << 20) else {
            continue;
        };
        for line in data.split(|&b| b == b'\n') {
            let line = line.split(|&b| b == b'#').next().unwrap_or_default();
            let line = line.trim_ascii();
            let path = line.split(|&b| b == b'=').next().unwrap_or_default();
            let path = path.trim_ascii_end();
            if !path.starts_with(b"/") {
                continue;
            }
            if let Ok(Some(st)) = root.stat(path) {
                if root::is_dir(&st) {
                    out.push((st.st_dev, st.st_ino));
                }
            }
        }
    }
    out
}

impl Scan {
    /// Moves the entries out, and the links and warnings into the report.
    fn entries_into(self, report: &mut Report) -> Vec<(CacheEntry, usize, usize)> {
        report.written.extend(self.links);
        report.warnings.extend(self.warnings);
        self.entries
    }
}
