//! An index of the CDI spec directories, so that a `create` does not parse every spec file on
//! the node (a DRA driver writes one file per claim into `/var/run/cdi`).
//!
//! Without it every CDI `create` parses every spec file ([`Registry::load`]). With it a
//! `create` reads one file, `stat`s each spec directory and each spec file, and parses only
//! the files that define the requested devices. Measured on the 2-core CI machine
//! (`scripts/bench.sh`, docs/benchmarks.md): with 1,000 claim specs beside the node spec, a
//! create costs about 1.3 ms more than with 2 files; with 500, 0.6 ms more, against 6 ms more
//! without the index.
//!
//! # What the index holds, and why an answer from it cannot be stale
//!
//! `<cache-dir>/cdi-index-<hash of the directory list>`: for each spec directory its identity
//! (device, inode, mtime, ctime) and its spec file names, and for each spec file its identity
//! (device, inode, size, mtime, ctime of the file it names, symlinks followed) with the kind
//! and device names it defines, or the error it failed with. An entry is used only when a
//! fresh `stat` gives the same identity, so a changed, added, removed or renamed file (or a
//! directory whose entries changed: its mtime and ctime move) is always read again. That
//! holds only where the file system stamps inodes and times itself on every change
//! ([`crate::cache::trusts_identity`]: ext4, xfs, btrfs, tmpfs, ...): a spec directory on
//! squashfs or erofs (an image swapped on a reused loop device keeps every key), an overlay,
//! NFS or FUSE is listed and its files read again on every create, and so is a spec file
//! reached through a symlink onto another file system than its directory's.
//!
//! File times come from a coarse clock: two writes within one tick can leave the same mtime
//! and ctime (and, with the same size, the same identity). An entry is therefore trusted only
//! when its ctime is more than [`RACY_NS`] older than the moment nvshim started reading it
//! (git's "racily clean" rule): any later write gets a later ctime. A younger entry is read
//! again on every use until it ages. ctime cannot be set by `utimes`, and with the inode it
//! also tells apart a file replaced by another of the same size and mtime.
//!
//! The files that define the requested devices are then read in full: the `fstat` of what was
//! read must equal the indexed identity and its kind and devices what the index says;
//! otherwise, as when a requested name is not in the index at all, the answer comes from a
//! full scan ([`Registry::load`]), which also gives its exact error messages.
//!
//! # Safety of the file itself
//!
//! Written to a temporary file and renamed over the old one, so concurrent `create`s each read
//! a whole index (the last writer wins; every reader re-validates what it uses). The file ends
//! with its length and a checksum: a truncated or corrupt index is not used (and is rewritten). It
//! is used only when owned by root or this user and writable by its owner only (the directory
//! is made 0700): otherwise whoever could write it could hide a higher-priority definition.
//! When the cache directory cannot be written (read-only root), nothing is written and every
//! `create` scans as without an index.
//!
//! The format is binary: fixed-width little-endian keys and length-prefixed names and texts,
//! which the entries borrow from the file's bytes, so that an unchanged entry costs its
//! `fstatat` and little else. The text format before it (a line per entry, numbers in decimal,
//! names escaped and copied) cost about 3,800 instructions per spec file beside the system
//! call; this one about 740 (callgrind, a create asking for one node-spec GPU and one claim
//! with 1,000 spec files: 6.30 M → 3.23 M instructions, 2.49 M with 2 files). The file ends
//! with a [`checksum`] of a word at a time rather than std's SipHash, which took 0.85 M of a
//! create's 7.8 M instructions on the 200 KB index of 1,000 spec files. What cannot go is the
//! `fstatat` of each file, about 0.63 µs each on tmpfs on the 2-core CI machine (a C loop over
//! figure 7's 1,000 spec names, best of 30, docs/benchmarks.md): no directory time moves when
//! a file is rewritten in place.
//!
//! One file (620 lines of code, 600 of tests): the on-disk format and the staleness rule are one
//! design, since the identity (`Key`) that is written is the one a fresh `stat` is compared with,
//! and the refresh, the selection and the encoder and decoder all work on the same `Index`.

use std::borrow::Cow;
use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::registry::{LoadedSpec, Registry, ScanError};
use super::spec::{self, Spec};
use super::spec_cache;
use crate::cache::{hash, now_ns, read_private, seal, unseal, write_private, Key};
use nvshim_hook::bytes::{self, Finder};

const MAGIC: &str = "nvshim-cdi-index 3";

/// What a spec file holds, as far as resolution needs it. Entries read from the index borrow
/// their text from the file's bytes (no copy per entry); entries read again own theirs.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Content<'a> {
    /// `<kind> <device> <device> ...`: one string, as the index stores it (a valid kind or
    /// device name holds no space: `name.rs`), split only for the kinds a `create` asks for.
    /// Bytes, not `str`: checking 1,000 entries as UTF-8 on every create cost 0.14 M
    /// instructions, and only the few a request selects are ever shown.
    Spec(Cow<'a, [u8]>),
    /// The message it failed to load with (UTF-8, as written).
    Error(Cow<'a, [u8]>),
}

impl Content<'_> {
    fn of(spec: &Spec) -> Content<'static> {
        let mut s = spec.kind.clone();
        for d in &spec.devices {
            s.push(' ');
            s.push_str(&d.name);
        }
        Content::Spec(Cow::Owned(s.into_bytes()))
    }

    fn error(message: String) -> Content<'static> {
        Content::Error(Cow::Owned(message.into_bytes()))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct FileEntry<'a> {
    /// The file name, as its bytes.
    name: Cow<'a, [u8]>,
    key: Key,
    trusted: bool,
    content: Content<'a>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct DirEntry<'a> {
    /// The directory (cleaned), as configured.
    path: Vec<u8>,
    /// `None`: the directory does not exist.
    key: Option<Key>,
    trusted: bool,
    files: Vec<FileEntry<'a>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Index<'a> {
    dirs: Vec<DirEntry<'a>>,
}

/// Where the index of `dirs` lives under `cache_dir`.
pub fn index_path(cache_dir: &Path, dirs: &[PathBuf]) -> PathBuf {
    let mut joined = Vec::new();
    for d in dirs {
        joined.extend_from_slice(d.as_os_str().as_bytes());
        joined.push(0);
    }
    cache_dir.join(format!("cdi-index-{:016x}", hash(&joined)))
}

/// The registry for resolving `names` from `dirs` (cleaned, as [`Registry::load`] cleans them),
/// through the index in `cache_dir`: the same answer as [`Registry::load`] for those names.
/// Its [`Registry::errors`] are the spec files that failed to load and conflicts among the
/// files read; conflicts between other specs are not looked for (`nvshim cdi validate` and
/// doctor report them).
/// An empty `cache_dir` (`cache-dir = ""`) means no index: a full scan.
pub fn load_for(dirs: &[PathBuf], names: &[String], cache_dir: &Path) -> Registry {
    if cache_dir.as_os_str().is_empty() {
        return Registry::load(dirs);
    }
    load_at(dirs, names, cache_dir, now_ns()).0
}

/// What one [`load_for`] did, for tests and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Spec files parsed.
    pub parsed: usize,
    /// Spec files taken from their parsed form in the cache (`spec_cache.rs`).
    pub cached: usize,
    /// Whether the index was (re)written.
    pub wrote: bool,
    /// Whether the answer came from a full scan instead.
    pub full_scan: bool,
}

/// [`load_for`] as if reading at `read_at` (ns since the epoch).
fn load_at(
    dirs: &[PathBuf],
    names: &[String],
    cache_dir: &Path,
    read_at: i64,
) -> (Registry, Stats) {
    let clean: Vec<PathBuf> = dirs.iter().map(|d| super::registry::clean(d)).collect();
    let path = index_path(cache_dir, &clean);
    let bytes = read_private(&path, "CDI index");
    let old = bytes.as_deref().and_then(|b| decode(b, clean.len()));
    let full = |mut stats: Stats| {
        stats.full_scan = true;
        (Registry::load(dirs), stats)
    };
    let Some((index, mut parsed, changed)) = refresh(&clean, old, cache_dir, read_at) else {
        return full(Stats::default());
    };
    let mut stats = Stats {
        parsed: parsed.len(),
        ..Stats::default()
    };
    if changed {
        match write_index(cache_dir, &path, &index) {
            Ok(()) => stats.wrote = true,
            Err(e) => tracing::debug!("CDI index {} not written: {e}", path.display()),
        }
    }
    match select(&clean, &index, names, &mut parsed, cache_dir, &mut stats) {
        Some(reg) => (reg, stats),
        None => full(stats),
    }
}

/// Specs parsed while refreshing, by path, with the identity of what was read.
type Parsed = HashMap<PathBuf, (Spec, Key)>;

/// The index as the directories are now: entries whose identity is unchanged and trusted are
/// kept (moved, not copied), the others read again. `None` when something calls for a full
/// scan instead (a directory that cannot be read or listed). The cached specs of files gone
/// from a directory are removed from `cache_dir`.
fn refresh<'a>(
    dirs: &[PathBuf],
    old: Option<Index<'a>>,
    cache_dir: &Path,
    read_at: i64,
) -> Option<(Index<'a>, Parsed, bool)> {
    let mut index = Index::default();
    let mut parsed = Parsed::new();
    let mut changed = old.is_none();
    let mut old_dirs = old.map(|o| o.dirs).unwrap_or_default().into_iter();
    for dir in dirs {
        let dir_bytes = dir.as_os_str().as_bytes().to_vec();
        let old_dir = old_dirs.next().filter(|d| d.path == dir_bytes);
        // Each file is `stat`ed relative to the directory (one path component to walk, not
        // the whole path), through the descriptor that also gives the directory's own key.
        let dir_fd = match nix::fcntl::open(
            dir,
            nix::fcntl::OFlag::O_PATH
                | nix::fcntl::OFlag::O_DIRECTORY
                | nix::fcntl::OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        ) {
            // SAFETY: `open` just returned this descriptor and nothing else owns it.
            Ok(fd) => unsafe { OwnedFd::from_raw_fd(fd) },
            Err(nix::errno::Errno::ENOENT) => {
                changed |= old_dir.is_none_or(|d| d.key.is_some());
                index.dirs.push(DirEntry {
                    path: dir_bytes,
                    key: None,
                    trusted: true,
                    files: Vec::new(),
                });
                continue;
            }
            Err(_) => return None,
        };
        let key = Key::of_stat(&nix::sys::stat::fstat(dir_fd.as_raw_fd()).ok()?);
        // The names: the index's, in its order, when the directory is the same; else listed
        // again and matched to the old entries by name.
        // Trusted only on a file system that stamps its own inodes and times (module doc):
        // asked when the directory is listed; a trusted directory was asked then.
        let mut local = true;
        let (mut same, mut by_name): (Vec<FileEntry>, HashMap<Cow<[u8]>, FileEntry>) = match old_dir
        {
            Some(d) if d.key == Some(key) && d.trusted => (d.files, HashMap::new()),
            other => {
                changed = true;
                local = crate::cache::trusts_identity(dir);
                let listed = list(dir)?;
                let old: HashMap<Cow<[u8]>, FileEntry> = other
                    .map(|d| d.files.into_iter().map(|f| (f.name.clone(), f)).collect())
                    .unwrap_or_default();
                let placeholders = listed
                    .into_iter()
                    .map(|name| FileEntry {
                        name: Cow::Owned(name),
                        key: Key::ZERO,
                        trusted: false,
                        content: Content::error(String::new()),
                    })
                    .collect();
                (placeholders, old)
            }
        };
        for entry in &mut same {
            // Unchanged directory: no map to look in (no hash of every name on the hot path).
            let old = if by_name.is_empty() {
                None
            } else {
                by_name.remove(&entry.name[..])
            };
            let stat = key_at(&dir_fd, &entry.name);
            let candidate = old.as_ref().unwrap_or(entry);
            // A file elsewhere than its directory's file system (a symlink) is not trusted.
            let trust = |k: &Key| local && k.dev == key.dev;
            if let Some(key) = stat {
                if candidate.trusted && candidate.key == key && trust(&key) {
                    if let Some(old) = old {
                        *entry = old;
                    }
                    continue;
                }
            }
            changed = true;
            let path = dir.join(std::ffi::OsStr::from_bytes(&entry.name));
            match (stat, spec::read_file_with_meta(&path)) {
                (Some(_), Ok((spec, meta))) => {
                    let key = Key::of(&meta);
                    entry.content = Content::of(&spec);
                    entry.key = key;
                    entry.trusted = trust(&key) && key.trusted_at(read_at);
                    parsed.insert(path, (spec, key));
                }
                (Some(key), Err(e)) => {
                    entry.content = Content::error(e.to_string());
                    entry.key = key;
                    entry.trusted = trust(&key) && key.trusted_at(read_at);
                }
                // A dangling symlink, or a file gone since the listing: the error a full
                // scan reports, tried again on every use (the zero key is never trusted).
                (None, Err(e)) => {
                    entry.content = Content::error(e.to_string());
                    entry.key = Key::ZERO;
                    entry.trusted = false;
                }
                (None, Ok(_)) => return None,
            }
        }
        // What is left of the old listing is gone from the directory.
        for (name, gone) in by_name {
            if gone.key.size >= spec_cache::MIN_BYTES {
                spec_cache::forget(cache_dir, &dir.join(std::ffi::OsStr::from_bytes(&name)));
            }
        }
        index.dirs.push(DirEntry {
            path: dir_bytes,
            key: Some(key),
            trusted: local && key.trusted_at(read_at),
            files: same,
        });
    }
    Some((index, parsed, changed))
}

/// Whether `devices` (` <device> <device> ...`, as [`Content::Spec`] holds them after the kind)
/// lists `device`. A substring search rather than a split of every entry: a claim request
/// looks through every claim spec of its kind, 1,000 on a busy node.
fn lists(devices: &[u8], device: &Finder) -> bool {
    let len = device.needle().len();
    device.find_iter(devices).any(|at| {
        devices.get(at.wrapping_sub(1)) == Some(&b' ')
            && matches!(devices.get(at + len), None | Some(b' '))
    })
}

/// The key of `name` in `dir` (symlinks followed), `None` when it cannot be `stat`ed. The name
/// goes to `fstatat` from the stack: nix's conversion scanned it twice for a NUL, 0.18 M
/// instructions over 1,000 spec files (callgrind), a fifth of what each file cost beside its
/// system call.
fn key_at(dir: &OwnedFd, name: &[u8]) -> Option<Key> {
    // NAME_MAX is 255: a longer name, or one holding a NUL, names no file.
    let mut path = [0u8; 256];
    if name.len() >= path.len() || bytes::find(0, name).is_some() {
        return None;
    }
    path[..name.len()].copy_from_slice(name);
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `path` is NUL-terminated (zeroed, and the name is shorter and holds no NUL);
    // `st` is a `stat` buffer that `fstatat` fills when it returns 0.
    let rc = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            path.as_ptr().cast(),
            st.as_mut_ptr(),
            libc::AT_NO_AUTOMOUNT,
        )
    };
    // SAFETY: `fstatat` returned 0, so it filled `st`.
    (rc == 0).then(|| Key::of_stat(unsafe { &st.assume_init() }))
}

/// The spec file names of `dir`, sorted as `os.ReadDir` sorts them; directories and names
/// without `.json` or `.yaml` left out, as [`Registry::load`] leaves them out.
fn list(dir: &Path) -> Option<Vec<Vec<u8>>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).ok()? {
        let entry = entry.ok()?;
        let name = entry.file_name();
        let s = name.to_string_lossy();
        if entry.file_type().is_ok_and(|t| t.is_dir()) || !super::registry::is_spec_file(&s) {
            continue;
        }
        names.push(name.as_bytes().to_vec());
    }
    names.sort();
    Some(names)
}

/// The registry of the files that define `names`, read (or taken from their cached parsed
/// form) and checked against the index; `None` when a name is not in the index or a file
/// changed since.
fn select(
    dirs: &[PathBuf],
    index: &Index<'_>,
    names: &[String],
    parsed: &mut Parsed,
    cache_dir: &Path,
    stats: &mut Stats,
) -> Option<Registry> {
    // The kinds asked for, each with its devices: a request names one or two kinds, so a
    // look along a list, not a hash of every file's kind.
    // Each device with its substring finder, built once (building one per file cost more
    // than the search).
    let mut wanted: Vec<(&str, Vec<(&str, Finder)>)> = Vec::new();
    for n in names {
        let (kind, device) = n.split_once('=')?;
        let entry = (device, Finder::new(device.as_bytes()));
        match wanted.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, devices)) => devices.push(entry),
            None => wanted.push((kind, vec![entry])),
        }
    }
    let mut missing: std::collections::HashSet<&str> = names.iter().map(String::as_str).collect();
    let mut reg = Registry::empty(dirs);
    for (priority, (dir, entry)) in dirs.iter().zip(&index.dirs).enumerate() {
        for f in &entry.files {
            let spec_line = match &f.content {
                Content::Error(message) => {
                    reg.push_error(ScanError::Cached {
                        path: dir.join(std::ffi::OsStr::from_bytes(&f.name)),
                        message: String::from_utf8_lossy(message).into_owned(),
                    });
                    continue;
                }
                Content::Spec(line) => line,
            };
            let kind_end = bytes::find(b' ', spec_line).unwrap_or(spec_line.len());
            let (kind, devices) = spec_line.split_at(kind_end);
            let Some((kind, want)) = wanted.iter().find(|(k, _)| k.as_bytes() == kind) else {
                continue;
            };
            let mut defines = false;
            for (d, finder) in want {
                if lists(devices, finder) {
                    defines = true;
                    missing.remove(format!("{kind}={d}").as_str());
                }
            }
            if !defines {
                continue;
            }
            let path = dir.join(std::ffi::OsStr::from_bytes(&f.name));
            let large = f.key.size >= spec_cache::MIN_BYTES;
            // A file refresh just read is not read again. Otherwise `f.key` is this create's
            // `stat` of the file, and trusted: the cached parse of that version is the file's
            // content now (spec_cache.rs).
            let (spec, key, from_cache) = if let Some((spec, key)) = parsed.remove(&path) {
                (spec, key, false)
            } else if let Some(spec) = (large && f.trusted)
                .then(|| {
                    let devices: Vec<&str> = want.iter().map(|(d, _)| *d).collect();
                    spec_cache::read(cache_dir, &path, &f.key, &devices)
                })
                .flatten()
            {
                stats.cached += 1;
                (spec, f.key, true)
            } else {
                stats.parsed += 1;
                let (spec, meta) = spec::read_file_with_meta(&path).ok()?;
                (spec, Key::of(&meta), false)
            };
            // What was read is the version the index describes, or the index is not used.
            if key != f.key || Content::of(&spec) != f.content {
                return None;
            }
            if !from_cache && large && f.trusted {
                spec_cache::write(cache_dir, &path, &key, &spec);
            }
            reg.add(LoadedSpec {
                path,
                priority,
                spec,
            });
        }
    }
    if !missing.is_empty() {
        return None;
    }
    reg.drop_conflicts();
    Some(reg)
}

// ---- the file ------------------------------------------------------------------------------

// The file: the magic line, then for each directory `D`, its path (a u32 length, the bytes), a
// state byte (0 missing, 1 untrusted, 2 trusted), its key unless missing, and its files (a
// u32 count); for each file its key, a flags byte (1 trusted, 2 an error message), the name's
// and the content's u32 lengths, the name and the content. A key is five little-endian u64s.
// Then the body's length and checksum ([`seal`]).

const TRUSTED: u8 = 1;
const ERROR: u8 = 2;

fn put_u32(out: &mut Vec<u8>, n: usize) {
    // A name, path or message of 4 GiB cannot come from a directory listing or a spec.
    out.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes());
}

fn put_key(out: &mut Vec<u8>, k: &Key) {
    for n in [k.dev, k.ino, k.size, k.mtime as u64, k.ctime as u64] {
        out.extend_from_slice(&n.to_le_bytes());
    }
}

fn encode(index: &Index<'_>) -> Vec<u8> {
    let files: usize = index.dirs.iter().map(|d| d.files.len()).sum();
    let mut out = Vec::with_capacity(64 + files * 200);
    out.extend_from_slice(MAGIC.as_bytes());
    out.push(b'\n');
    for d in &index.dirs {
        out.push(b'D');
        put_u32(&mut out, d.path.len());
        out.extend_from_slice(&d.path);
        match &d.key {
            None => out.push(0),
            Some(k) => {
                out.push(1 + u8::from(d.trusted));
                put_key(&mut out, k);
            }
        }
        put_u32(&mut out, d.files.len());
        for f in &d.files {
            put_key(&mut out, &f.key);
            let (flag, text) = match &f.content {
                Content::Spec(line) => (0, line),
                Content::Error(m) => (ERROR, m),
            };
            out.push(flag | if f.trusted { TRUSTED } else { 0 });
            put_u32(&mut out, f.name.len());
            put_u32(&mut out, text.len());
            out.extend_from_slice(&f.name);
            out.extend_from_slice(text);
        }
    }
    seal(out)
}

/// Reads the index's fields in order; every read is bounds-checked.
struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.rest.split_at_checked(n)?;
        self.rest = rest;
        Some(head)
    }

    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }

    fn u32(&mut self) -> Option<usize> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?) as usize)
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    fn key(&mut self) -> Option<Key> {
        Some(Key {
            dev: self.u64()?,
            ino: self.u64()?,
            size: self.u64()?,
            mtime: self.u64()? as i64,
            ctime: self.u64()? as i64,
        })
    }
}

/// The index in `bytes`, borrowing its names and texts from them, when it is whole and for
/// `dirs` directories.
fn decode(bytes: &[u8], dirs: usize) -> Option<Index<'_>> {
    // The trailer first: a truncated or damaged file is not read at all.
    let body = unseal(bytes)?;
    let mut r = Reader {
        rest: body.strip_prefix(MAGIC.as_bytes())?.strip_prefix(b"\n")?,
    };
    let mut index = Index {
        dirs: Vec::with_capacity(dirs),
    };
    while !r.rest.is_empty() {
        if r.u8()? != b'D' {
            return None;
        }
        let len = r.u32()?;
        let path = r.take(len)?.to_vec();
        let (key, trusted) = match r.u8()? {
            0 => (None, true),
            state @ (1 | 2) => (Some(r.key()?), state == 2),
            _ => return None,
        };
        let count = r.u32()?;
        // Each file takes at least its key, flags and lengths: a damaged count cannot make
        // this allocate more than the file could hold.
        let mut files = Vec::with_capacity(count.min(r.rest.len() / 49));
        for _ in 0..count {
            let key = r.key()?;
            let flags = r.u8()?;
            let (name_len, text_len) = (r.u32()?, r.u32()?);
            let name = r.take(name_len)?;
            // A file name, never a path: one holding `/` (or `.`, `..`, a NUL) would make
            // `dir.join(name)` read a file outside the spec directory. Only a forged or foreign
            // index holds one ([`list`] keeps directory entries); the whole index is refused.
            if name.is_empty()
                || name == b"."
                || name == b".."
                || name.contains(&b'/')
                || name.contains(&0)
            {
                return None;
            }
            let name = Cow::Borrowed(name);
            let text = Cow::Borrowed(r.take(text_len)?);
            files.push(FileEntry {
                name,
                key,
                trusted: flags & TRUSTED != 0,
                content: if flags & ERROR != 0 {
                    Content::Error(text)
                } else {
                    Content::Spec(text)
                },
            });
        }
        index.dirs.push(DirEntry {
            path,
            key,
            trusted,
            files,
        });
    }
    (index.dirs.len() == dirs).then_some(index)
}

/// Writes the index ([`write_private`]).
fn write_index(cache_dir: &Path, path: &Path, index: &Index<'_>) -> std::io::Result<()> {
    write_private(cache_dir, path, &encode(index))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::RACY_NS;
    use std::fs;
    use std::io::Write as _;
    use std::os::unix::fs::PermissionsExt;
    use std::time::SystemTime;

    /// A moment after every file a test writes: entries count as trusted (not racy).
    fn later() -> i64 {
        now_ns() + 10 * RACY_NS
    }

    fn spec_text(kind: &str, devices: &[(&str, &str)]) -> String {
        let mut t = format!("cdiVersion: 0.5.0\nkind: {kind}\ndevices:\n");
        for (name, env) in devices {
            t.push_str(&format!(
                "- name: {name}\n  containerEdits:\n    env: [\"{env}\"]\n"
            ));
        }
        t
    }

    struct Dirs {
        _tmp: tempfile::TempDir,
        etc: PathBuf,
        run: PathBuf,
        cache: PathBuf,
    }

    impl Dirs {
        fn new() -> Dirs {
            let tmp = tempfile::tempdir().unwrap();
            let (etc, run) = (tmp.path().join("etc"), tmp.path().join("run"));
            fs::create_dir_all(&etc).unwrap();
            fs::create_dir_all(&run).unwrap();
            let cache = tmp.path().join("cache");
            Dirs {
                _tmp: tmp,
                etc,
                run,
                cache,
            }
        }

        fn dirs(&self) -> Vec<PathBuf> {
            vec![self.etc.clone(), self.run.clone()]
        }

        /// `(origin path, env)` of each group `names` resolve to, or the error text.
        fn answer(reg: &Registry, names: &[String]) -> Result<Vec<(String, Vec<String>)>, String> {
            reg.resolve_grouped(names)
                .map(|g| {
                    g.into_iter()
                        .map(|(o, e)| (format!("{o:?}"), e.env.clone()))
                        .collect()
                })
                .map_err(|e| e.to_string())
        }

        /// The index's answer for `names` equals a full scan's; returns the index's stats.
        fn check(&self, names: &[&str], read_at: i64) -> Stats {
            let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
            let full = Registry::load(&self.dirs());
            let (reg, stats) = load_at(&self.dirs(), &names, &self.cache, read_at);
            assert_eq!(
                Dirs::answer(&reg, &names),
                Dirs::answer(&full, &names),
                "{names:?} ({stats:?})"
            );
            stats
        }
    }

    #[test]
    fn same_answer_as_a_full_scan_and_only_the_defining_files_read() {
        let d = Dirs::new();
        for i in 0..50 {
            fs::write(
                d.run.join(format!("claim-{i:03}.yaml")),
                spec_text("k8s.gpu.nvidia.com/claim", &[(&format!("c{i}"), "A=1")]),
            )
            .unwrap();
        }
        fs::write(
            d.etc.join("nvidia.yaml"),
            spec_text("nvidia.com/gpu", &[("0", "GPU=0"), ("1", "GPU=1")]),
        )
        .unwrap();
        // A higher-priority redefinition, a same-priority conflict, a broken file.
        fs::write(
            d.run.join("nvidia.yaml"),
            spec_text("nvidia.com/gpu", &[("1", "GPU=run1")]),
        )
        .unwrap();
        fs::write(d.etc.join("a.yaml"), spec_text("x.com/y", &[("z", "Z=a")])).unwrap();
        fs::write(d.etc.join("b.yaml"), spec_text("x.com/y", &[("z", "Z=b")])).unwrap();
        fs::write(d.run.join("broken.yaml"), "kind: [").unwrap();
        let t = later();
        let cold = d.check(&["nvidia.com/gpu=0", "k8s.gpu.nvidia.com/claim=c7"], t);
        assert!(cold.wrote && !cold.full_scan, "{cold:?}");
        let warm = d.check(&["nvidia.com/gpu=0", "k8s.gpu.nvidia.com/claim=c7"], t);
        assert_eq!(
            warm,
            Stats {
                parsed: 2,
                cached: 0,
                wrote: false,
                full_scan: false
            }
        );
        let warm = d.check(&["nvidia.com/gpu=1"], t);
        assert_eq!(warm.parsed, 2, "both definitions, for the priority rule");
        // The conflict and the missing name: the full scan's error, word for word.
        assert!(d.check(&["x.com/y=z"], t).parsed <= 2);
        assert!(d.check(&["nvidia.com/gpu=7"], t).full_scan);
        // The broken file's error is reported from the index.
        let (reg, _) = load_at(&d.dirs(), &["nvidia.com/gpu=0".into()], &d.cache, t);
        let errors: Vec<String> = reg.errors().iter().map(|e| e.to_string()).collect();
        let full: Vec<String> = Registry::load(&d.dirs())
            .errors()
            .iter()
            .filter(|e| matches!(e, ScanError::Spec(_)))
            .map(|e| e.to_string())
            .collect();
        assert_eq!(errors, full);
    }

    #[test]
    fn a_file_changed_in_place_with_its_size_and_mtime_kept_is_read_again() {
        let d = Dirs::new();
        let f = d.run.join("nvidia.yaml");
        fs::write(&f, spec_text("nvidia.com/gpu", &[("0", "V=1")])).unwrap();
        let t = later();
        d.check(&["nvidia.com/gpu=0"], t);
        let mtime = fs::metadata(&f).unwrap().modified().unwrap();
        // Same length, same mtime: only the ctime (and the content) tell.
        fs::OpenOptions::new()
            .write(true)
            .open(&f)
            .unwrap()
            .write_all(spec_text("nvidia.com/gpu", &[("0", "V=2")]).as_bytes())
            .unwrap();
        fs::File::options()
            .write(true)
            .open(&f)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        let names = vec!["nvidia.com/gpu=0".to_string()];
        let (reg, stats) = load_at(&d.dirs(), &names, &d.cache, t);
        assert_eq!(
            Dirs::answer(&reg, &names).unwrap()[0].1,
            vec!["V=2".to_string()],
            "{stats:?}"
        );
    }

    #[test]
    fn added_removed_and_renamed_files_are_seen() {
        let d = Dirs::new();
        fs::write(d.run.join("a.yaml"), spec_text("v.com/c", &[("a", "A=1")])).unwrap();
        let t = later();
        d.check(&["v.com/c=a"], t);
        fs::write(d.run.join("b.yaml"), spec_text("v.com/c", &[("b", "B=1")])).unwrap();
        assert!(!d.check(&["v.com/c=b"], t).full_scan);
        fs::rename(d.run.join("b.yaml"), d.etc.join("b.yaml")).unwrap();
        d.check(&["v.com/c=b"], t);
        fs::remove_file(d.run.join("a.yaml")).unwrap();
        d.check(&["v.com/c=a"], t);
        // A same-priority duplicate appearing makes the name unresolvable, as in a full scan.
        fs::write(d.etc.join("c.yaml"), spec_text("v.com/c", &[("b", "B=2")])).unwrap();
        d.check(&["v.com/c=b"], t);
        fs::remove_dir_all(&d.etc).unwrap();
        d.check(&["v.com/c=b"], t);
    }

    #[test]
    fn a_dangling_symlink_is_reported_as_a_full_scan_reports_it() {
        let d = Dirs::new();
        fs::write(d.run.join("a.yaml"), spec_text("v.com/c", &[("a", "A=1")])).unwrap();
        std::os::unix::fs::symlink("/nonexistent/spec.yaml", d.run.join("gone.yaml")).unwrap();
        let t = later();
        d.check(&["v.com/c=a"], t);
        let names = vec!["v.com/c=a".to_string()];
        let (reg, stats) = load_at(&d.dirs(), &names, &d.cache, t);
        assert!(!stats.full_scan, "{stats:?}");
        let errors: Vec<String> = reg.errors().iter().map(|e| e.to_string()).collect();
        let full: Vec<String> = Registry::load(&d.dirs())
            .errors()
            .iter()
            .map(|e| e.to_string())
            .collect();
        assert_eq!(errors, full);
    }

    #[test]
    fn young_entries_are_not_trusted() {
        let d = Dirs::new();
        fs::write(d.run.join("a.yaml"), spec_text("v.com/c", &[("a", "A=1")])).unwrap();
        // Read right now: the file's ctime is within the racy window, so it is read again
        // every time (and the index rewritten) until it ages.
        let now = now_ns();
        d.check(&["v.com/c=a"], now);
        let again = d.check(&["v.com/c=a"], now);
        assert!(again.parsed >= 1 && again.wrote, "{again:?}");
        let aged = d.check(&["v.com/c=a"], later());
        let settled = d.check(&["v.com/c=a"], later());
        assert!(
            aged.wrote && !settled.wrote && settled.parsed == 1,
            "{aged:?} {settled:?}"
        );
    }

    #[test]
    fn a_damaged_or_foreign_index_is_not_used() {
        let d = Dirs::new();
        fs::write(d.run.join("a.yaml"), spec_text("v.com/c", &[("a", "A=1")])).unwrap();
        let t = later();
        d.check(&["v.com/c=a"], t);
        let path = index_path(&d.cache, &d.dirs());
        let good = fs::read(&path).unwrap();
        assert!(decode(&good, 2).is_some());
        // Truncated, one byte changed, empty, garbage: all refused, and rebuilt.
        let mut flipped = good.clone();
        flipped[good.len() / 2] ^= 1;
        for bad in [&good[..good.len() / 2], &flipped[..], b"", b"\n\n\xff"] {
            assert!(decode(bad, 2).is_none());
            fs::write(&path, bad).unwrap();
            let s = d.check(&["v.com/c=a"], t);
            assert!(s.wrote && s.parsed == 1, "{s:?}");
        }
        // Writable by others: not used (and replaced by this user's).
        fs::set_permissions(&path, fs::Permissions::from_mode(0o666)).unwrap();
        assert!(read_private(&path, "CDI index").is_none());
        d.check(&["v.com/c=a"], t);
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(
            fs::metadata(&d.cache).unwrap().permissions().mode() & 0o777,
            0o700
        );
    }

    /// A directory on a file system whose directory times the kernel does not keep (`/proc`
    /// here; NFS and FUSE on a node) is listed again on every create: an added file there
    /// could leave its time as it was. A local one is listed once.
    #[test]
    fn a_listing_is_kept_only_where_the_kernel_keeps_directory_times() {
        let d = Dirs::new();
        let t = later();
        let (_, first) = load_at(&[PathBuf::from("/proc")], &[], &d.cache, t);
        let (_, again) = load_at(&[PathBuf::from("/proc")], &[], &d.cache, t);
        assert!(first.wrote && again.wrote, "{first:?} {again:?}");
        fs::write(d.run.join("a.yaml"), spec_text("v.com/c", &[("a", "A=1")])).unwrap();
        let (_, first) = load_at(std::slice::from_ref(&d.run), &[], &d.cache, t);
        let (_, again) = load_at(std::slice::from_ref(&d.run), &[], &d.cache, t);
        assert!(first.wrote && !again.wrote, "{first:?} {again:?}");
    }

    /// Spec files on image file systems (squashfs, erofs: the kernel's own, from
    /// squashfs-tools and erofs-utils), whose inodes and times come from the image: a second
    /// image with other contents, the same sizes and times, attached to the same loop device
    /// keeps every part of each file's key (asserted, so the case is the real one). The answer
    /// after the swap is the new image's, for a small spec (the index), a large one (the parsed
    /// spec cache), and one reached by a symlink from a local directory. Before
    /// `trusts_identity` left image file systems out, the old image's env came back.
    #[test]
    fn spec_files_on_a_swapped_image_are_read_again() {
        use std::process::Command;
        let have = |tool: &str| {
            Command::new(tool)
                .arg("--help")
                .output()
                .is_ok_and(|o| !o.stdout.is_empty() || !o.stderr.is_empty())
        };
        if !nix::unistd::geteuid().is_root() || !have("mksquashfs") || !have("mkfs.erofs") {
            eprintln!("skipped: needs root, mksquashfs (squashfs-tools), mkfs.erofs (erofs-utils)");
            return;
        }
        let run = |cmd: &mut Command| {
            let out = cmd.output().unwrap();
            assert!(out.status.success(), "{cmd:?}: {out:?}");
            String::from_utf8(out.stdout).unwrap().trim().to_string()
        };
        std::thread::spawn(move || {
            nvshim_testsupport::hook_harness::enter_private_mount_ns().unwrap();
            let d = Dirs::new();
            let base = d.etc.parent().unwrap().to_path_buf();
            let time = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
            for v in ["1", "2"] {
                let src = base.join(format!("src{v}"));
                fs::create_dir(&src).unwrap();
                let files = [
                    (
                        "small.yaml",
                        spec_text("v.com/small", &[("a", &format!("V={v}"))]),
                    ),
                    (
                        "large.yaml",
                        large_spec_text("v.com/large", "a", &format!("V={v}")),
                    ),
                ];
                for (name, text) in files {
                    fs::write(src.join(name), text).unwrap();
                    set_mtime(&src.join(name), time);
                }
                fs::File::open(&src).unwrap().set_modified(time).unwrap();
            }
            let mnt = base.join("mnt");
            fs::create_dir(&mnt).unwrap();
            let images = [
                ("squashfs", "mksquashfs", "-all-time"),
                ("erofs", "mkfs.erofs", "-T"),
            ];
            for (fstype, mkfs, time_flag) in images {
                let image = |v: &str| {
                    let (src, img) = (
                        base.join(format!("src{v}")),
                        base.join(format!("{fstype}{v}")),
                    );
                    let mut cmd = Command::new(mkfs);
                    if fstype == "squashfs" {
                        cmd.arg(&src)
                            .arg(&img)
                            .args(["-noappend", "-quiet", "-all-root"]);
                        cmd.args([time_flag, "1700000000", "-mkfs-time", "1700000000"]);
                    } else {
                        cmd.arg(format!("{time_flag}1700000000")).arg("--all-root");
                        cmd.arg(&img).arg(&src);
                    }
                    run(&mut cmd);
                    img
                };
                let (one, two) = (image("1"), image("2"));
                let dev = run(Command::new("losetup").args(["-f", "--show"]).arg(&one));
                let mount = || {
                    run(Command::new("mount")
                        .args(["-t", fstype, "-o", "ro", &dev])
                        .arg(&mnt))
                };
                mount();
                let dirs = vec![mnt.clone(), d.run.clone()];
                let ask = |name: &str| {
                    let names = vec![name.to_string()];
                    let (reg, _) = load_at(&dirs, &names, &d.cache, later());
                    Dirs::answer(&reg, &names)
                        .unwrap()
                        .last()
                        .unwrap()
                        .1
                        .clone()
                };
                for name in ["v.com/small=a", "v.com/large=a"] {
                    assert_eq!(ask(name), ["V=1"], "{fstype} {name}");
                    assert_eq!(ask(name), ["V=1"], "{fstype} {name}, again");
                }
                let keys = |dir: &Path| {
                    ["small.yaml", "large.yaml", "."].map(|n| Key::at(&dir.join(n)).unwrap())
                };
                let before = keys(&mnt);
                run(Command::new("umount").arg(&mnt));
                run(Command::new("losetup").args(["-d", &dev]));
                run(Command::new("losetup").arg(&dev).arg(&two));
                mount();
                assert_eq!(keys(&mnt), before, "{fstype}: the swap kept every key");
                for name in ["v.com/small=a", "v.com/large=a"] {
                    assert_eq!(ask(name), ["V=2"], "{fstype} {name} after the swap");
                }
                // The same file through a symlink in a local (trusted) directory, which the
                // swap leaves as it is.
                run(Command::new("umount").arg(&mnt));
                run(Command::new("losetup").args(["-d", &dev]));
                run(Command::new("losetup").arg(&dev).arg(&one));
                mount();
                let link = d.run.join("linked.yaml");
                std::os::unix::fs::symlink(mnt.join("small.yaml"), &link).unwrap();
                let linked = |want: &str| {
                    let names = vec!["v.com/small=a".to_string()];
                    let (reg, _) = load_at(std::slice::from_ref(&d.run), &names, &d.cache, later());
                    let env = Dirs::answer(&reg, &names)
                        .unwrap()
                        .last()
                        .unwrap()
                        .1
                        .clone();
                    assert_eq!(env, [want], "{fstype}: linked");
                };
                linked("V=1");
                linked("V=1");
                run(Command::new("umount").arg(&mnt));
                run(Command::new("losetup").args(["-d", &dev]));
                run(Command::new("losetup").arg(&dev).arg(&two));
                mount();
                linked("V=2");
                fs::remove_file(&link).unwrap();
                run(Command::new("umount").arg(&mnt));
                run(Command::new("losetup").args(["-d", &dev]));
            }
        })
        .join()
        .unwrap();
    }

    #[test]
    fn an_unwritable_cache_dir_costs_only_the_index() {
        let d = Dirs::new();
        fs::write(d.run.join("a.yaml"), spec_text("v.com/c", &[("a", "A=1")])).unwrap();
        // A file where the directory should be: nothing can be written under it.
        fs::write(&d.cache, "").unwrap();
        let s = d.check(&["v.com/c=a"], later());
        assert!(!s.wrote && !s.full_scan, "{s:?}");
    }

    /// A spec over [`spec_cache::MIN_BYTES`]: `device` with `env`, a device `extra`, and
    /// padding in the global edits.
    fn large_spec_text(kind: &str, device: &str, env: &str) -> String {
        let mut t = spec_text(kind, &[(device, env), ("extra", "EXTRA=1")]);
        t.push_str("containerEdits:\n  env:\n");
        for i in 0..200 {
            t.push_str(&format!("  - PADDING_{i:03}=some-value-to-make-it-large\n"));
        }
        assert!(t.len() as u64 > spec_cache::MIN_BYTES);
        t
    }

    /// The env of `name`'s device group, and the stats, from the index (checked against a
    /// full scan).
    fn env_of(d: &Dirs, name: &str, read_at: i64) -> (Vec<String>, Stats) {
        let names = vec![name.to_string()];
        let stats = d.check(&[name], read_at);
        let (reg, _) = load_at(&d.dirs(), &names, &d.cache, read_at);
        let groups = Dirs::answer(&reg, &names).unwrap();
        (groups.last().unwrap().1.clone(), stats)
    }

    /// Backdates the file's mtime to `mtime`, as a copy preserving times does.
    fn set_mtime(f: &Path, mtime: SystemTime) {
        fs::File::options()
            .write(true)
            .open(f)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
    }

    #[test]
    fn a_large_spec_is_parsed_once_then_taken_from_the_cache() {
        let d = Dirs::new();
        let f = d.etc.join("nvidia.yaml");
        fs::write(&f, large_spec_text("nvidia.com/gpu", "0", "V=1")).unwrap();
        fs::write(
            d.run.join("small.yaml"),
            spec_text("v.com/c", &[("a", "A=1")]),
        )
        .unwrap();
        let t = later();
        let (env, cold) = env_of(&d, "nvidia.com/gpu=0", t);
        assert_eq!(env, ["V=1"]);
        // A new index reads every file.
        assert_eq!((cold.parsed, cold.cached), (2, 0), "{cold:?}");
        let cache = spec_cache::path(&d.cache, &f);
        assert_eq!(
            fs::metadata(&cache).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let (env, warm) = env_of(&d, "nvidia.com/gpu=0", t);
        assert_eq!(env, ["V=1"]);
        assert_eq!(
            (warm.parsed, warm.cached, warm.wrote),
            (0, 1, false),
            "{warm:?}"
        );
        // Each device asked for comes with its edits (the others by name only).
        let (env, warm) = env_of(&d, "nvidia.com/gpu=extra", t);
        assert_eq!((env, warm.cached), (vec!["EXTRA=1".to_string()], 1));
        let both = d.check(&["nvidia.com/gpu=extra", "nvidia.com/gpu=0"], t);
        assert_eq!((both.parsed, both.cached), (0, 1), "{both:?}");
        // Small specs are parsed every time, and not cached.
        let (_, small) = env_of(&d, "v.com/c=a", t);
        assert_eq!((small.parsed, small.cached), (1, 0), "{small:?}");
        let small_cache = spec_cache::path(&d.cache, &d.run.join("small.yaml"));
        assert!(!small_cache.exists());
        // The spec file removed: its cached parse goes with it.
        fs::remove_file(&f).unwrap();
        d.check(&["v.com/c=a"], t);
        assert!(!cache.exists());
    }

    #[test]
    fn a_cached_spec_changed_with_its_size_and_mtime_kept_is_parsed_again() {
        let d = Dirs::new();
        let f = d.run.join("nvidia.yaml");
        fs::write(&f, large_spec_text("nvidia.com/gpu", "0", "V=1")).unwrap();
        let t = later();
        env_of(&d, "nvidia.com/gpu=0", t);
        assert_eq!(env_of(&d, "nvidia.com/gpu=0", t).1.cached, 1);
        let mtime = fs::metadata(&f).unwrap().modified().unwrap();
        // In place, same length, mtime put back: only the ctime tells.
        fs::OpenOptions::new()
            .write(true)
            .open(&f)
            .unwrap()
            .write_all(large_spec_text("nvidia.com/gpu", "0", "V=2").as_bytes())
            .unwrap();
        set_mtime(&f, mtime);
        let (env, s) = env_of(&d, "nvidia.com/gpu=0", t);
        assert_eq!((env, s.cached), (vec!["V=2".to_string()], 0), "{s:?}");
        // Replaced by a rename (a new inode), same length and mtime.
        let new = d.run.join(".new");
        fs::write(&new, large_spec_text("nvidia.com/gpu", "0", "V=3")).unwrap();
        set_mtime(&new, mtime);
        fs::rename(&new, &f).unwrap();
        let (env, s) = env_of(&d, "nvidia.com/gpu=0", t);
        assert_eq!((env, s.cached), (vec!["V=3".to_string()], 0), "{s:?}");
        // The new version is cached in turn.
        let (env, s) = env_of(&d, "nvidia.com/gpu=0", t);
        assert_eq!((env, s.cached), (vec!["V=3".to_string()], 1), "{s:?}");
    }

    #[test]
    fn a_cached_parse_of_another_file_version_is_not_used() {
        let d = Dirs::new();
        let (a, b) = (d.run.join("a.yaml"), d.run.join("b.yaml"));
        fs::write(&a, large_spec_text("v.com/c", "x", "FROM=a")).unwrap();
        fs::write(&b, large_spec_text("v.com/c", "x", "FROM=b")).unwrap();
        let t = later();
        // Both define v.com/c=x at one priority: a conflict, but each is parsed and cached.
        d.check(&["v.com/c=x"], t);
        d.check(&["v.com/c=x"], t);
        // b's cache file holding a's parse: refused (its identity is a's), b parsed again.
        fs::copy(
            spec_cache::path(&d.cache, &a),
            spec_cache::path(&d.cache, &b),
        )
        .unwrap();
        fs::remove_file(&a).unwrap();
        let (env, s) = env_of(&d, "v.com/c=x", t);
        assert_eq!((env, s.parsed), (vec!["FROM=b".to_string()], 1), "{s:?}");
    }

    #[test]
    fn young_spec_files_are_not_cached() {
        let d = Dirs::new();
        let f = d.run.join("nvidia.yaml");
        fs::write(&f, large_spec_text("nvidia.com/gpu", "0", "V=1")).unwrap();
        let now = now_ns();
        env_of(&d, "nvidia.com/gpu=0", now);
        let (_, s) = env_of(&d, "nvidia.com/gpu=0", now);
        assert_eq!(s.cached, 0, "{s:?}");
        assert!(!spec_cache::path(&d.cache, &f).exists());
    }

    #[test]
    fn a_damaged_or_foreign_spec_cache_is_not_used() {
        let d = Dirs::new();
        let f = d.run.join("nvidia.yaml");
        fs::write(&f, large_spec_text("nvidia.com/gpu", "0", "V=1")).unwrap();
        let t = later();
        env_of(&d, "nvidia.com/gpu=0", t);
        let cache = spec_cache::path(&d.cache, &f);
        let good = fs::read(&cache).unwrap();
        let mut flipped = good.clone();
        let i = good.windows(3).position(|w| w == b"V=1").unwrap();
        flipped[i + 2] = b'9';
        // Truncated, one byte changed, empty, garbage: each parsed again, and rewritten.
        for bad in [&good[..good.len() / 2], &flipped[..], b"", b"\n\n\xff"] {
            fs::write(&cache, bad).unwrap();
            let (env, s) = env_of(&d, "nvidia.com/gpu=0", t);
            assert_eq!((env, s.parsed, s.cached), (vec!["V=1".to_string()], 1, 0));
            assert_eq!(fs::read(&cache).unwrap(), good);
        }
        // Writable by others: not used, and replaced by this user's.
        fs::set_permissions(&cache, fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(env_of(&d, "nvidia.com/gpu=0", t).1.parsed, 1);
        assert_eq!(
            fs::metadata(&cache).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(env_of(&d, "nvidia.com/gpu=0", t).1.cached, 1);
        // Owned by another user (only root can hand it over): not used.
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            std::os::unix::fs::chown(&cache, Some(65534), Some(65534)).unwrap();
            let (env, s) = env_of(&d, "nvidia.com/gpu=0", t);
            assert_eq!((env, s.parsed, s.cached), (vec!["V=1".to_string()], 1, 0));
        }
        // A symlink in its place is not followed.
        fs::remove_file(&cache).unwrap();
        let elsewhere = d.run.join("elsewhere");
        fs::write(&elsewhere, &good).unwrap();
        fs::set_permissions(&elsewhere, fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &cache).unwrap();
        assert_eq!(
            spec_cache::read(&d.cache, &f, &Key::of(&fs::metadata(&f).unwrap()), &["0"]),
            None
        );
    }

    #[test]
    fn an_unwritable_cache_dir_means_a_parse_every_time() {
        let d = Dirs::new();
        fs::write(
            d.run.join("nvidia.yaml"),
            large_spec_text("nvidia.com/gpu", "0", "V=1"),
        )
        .unwrap();
        fs::write(&d.cache, "").unwrap();
        for _ in 0..2 {
            let (env, s) = env_of(&d, "nvidia.com/gpu=0", later());
            assert_eq!((env, s.parsed, s.cached), (vec!["V=1".to_string()], 1, 0));
        }
    }

    #[test]
    fn keys_read_back_and_short_ones_are_refused() {
        let key = Key {
            dev: u64::MAX,
            ino: 0,
            size: 40_337,
            mtime: -1_700_000_000_123_456_789,
            ctime: i64::MAX,
        };
        let mut bytes = Vec::new();
        put_key(&mut bytes, &key);
        bytes.extend_from_slice(b"rest");
        let mut r = Reader { rest: &bytes };
        assert_eq!(r.key(), Some(key));
        assert_eq!(r.rest, b"rest");
        for len in 0..40 {
            assert_eq!(
                Reader {
                    rest: &bytes[..len]
                }
                .key(),
                None,
                "{len} bytes"
            );
        }
    }

    #[test]
    fn a_device_is_listed_only_as_a_whole_word() {
        let lists = |devices: &[u8], d: &str| lists(devices, &Finder::new(d.as_bytes()));
        assert!(lists(b" gpu0 gpu1", "gpu1"));
        assert!(lists(b" gpu0 gpu1", "gpu0"));
        assert!(lists(b" gpu01 gpu0", "gpu0"));
        assert!(!lists(b" gpu0 gpu1", "gpu"));
        assert!(!lists(b" xgpu0 gpu01", "gpu0"));
        assert!(!lists(b"gpu0", "gpu0"));
        assert!(!lists(b"", "gpu0"));
    }

    #[test]
    fn names_and_messages_with_odd_bytes_round_trip() {
        let index = Index {
            dirs: vec![
                DirEntry {
                    path: b"/etc/cdi".to_vec(),
                    key: None,
                    trusted: true,
                    files: Vec::new(),
                },
                DirEntry {
                    path: b"/var/run/my cdi".to_vec(),
                    key: Some(Key {
                        dev: 1,
                        ino: 2,
                        size: 3,
                        mtime: -4,
                        ctime: 5,
                    }),
                    trusted: false,
                    files: vec![
                        FileEntry {
                            name: Cow::Owned(b"a b%\n\xff.yaml".to_vec()),
                            key: Key {
                                dev: 6,
                                ino: 7,
                                size: 8,
                                mtime: 9,
                                ctime: 10,
                            },
                            trusted: true,
                            content: Content::Error(Cow::Borrowed(b"line 1: bad\tthing %")),
                        },
                        FileEntry {
                            name: Cow::Borrowed(b"n.json"),
                            key: Key {
                                dev: 6,
                                ino: 8,
                                size: 8,
                                mtime: 9,
                                ctime: 10,
                            },
                            trusted: true,
                            content: Content::Spec(Cow::Borrowed(b"v.com/c a b:1")),
                        },
                    ],
                },
            ],
        };
        assert_eq!(decode(&encode(&index), 2), Some(index.clone()));
        assert_eq!(decode(&encode(&index), 3), None);
        // Damage that gets past the checksum (a file sealed again after it was cut or changed)
        // is refused or read, never a panic or a huge allocation: every read is bounds-checked.
        let bytes = encode(&index);
        let body = &bytes[..bytes.len() - 16];
        let sealed = |body: &[u8]| seal(body.to_vec());
        assert_eq!(decode(&sealed(body), 2), Some(index.clone()));
        for cut in 0..body.len() {
            assert_eq!(decode(&sealed(&body[..cut]), 2), None, "cut at {cut}");
        }
        for at in 0..body.len() {
            for change in [0x01, 0x80, 0xff] {
                let mut damaged = body.to_vec();
                damaged[at] ^= change;
                let _ = decode(&sealed(&damaged), 2);
            }
        }
    }

    #[test]
    fn concurrent_creates_while_a_spec_is_rewritten_get_whole_answers() {
        let d = Dirs::new();
        let f = d.run.join("nvidia.yaml");
        fs::write(&f, spec_text("nvidia.com/gpu", &[("0", "V=1")])).unwrap();
        let t = later();
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in 0..200 {
                    let v = format!("V={}", i % 2 + 1);
                    let opts = crate::atomic::Options {
                        mode: 0o644,
                        owner: None,
                        durability: crate::atomic::Durability::None,
                    };
                    crate::atomic::write(
                        &f,
                        spec_text("nvidia.com/gpu", &[("0", &v)]).as_bytes(),
                        &opts,
                    )
                    .unwrap();
                }
                stop.store(true, std::sync::atomic::Ordering::SeqCst);
            });
            for _ in 0..8 {
                s.spawn(|| {
                    let names = vec!["nvidia.com/gpu=0".to_string()];
                    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                        let (reg, stats) = load_at(&d.dirs(), &names, &d.cache, t);
                        let env = &Dirs::answer(&reg, &names).unwrap()[0].1;
                        assert!(env == &["V=1"] || env == &["V=2"], "{env:?} {stats:?}");
                    }
                });
            }
        });
        // Settled: the index gives the last version.
        let names = vec!["nvidia.com/gpu=0".to_string()];
        let (reg, _) = load_at(&d.dirs(), &names, &d.cache, t);
        assert_eq!(Dirs::answer(&reg, &names).unwrap()[0].1, vec!["V=2"]);
    }

    /// A forged index naming a file by a path (`../x.yaml`, `sub/x.yaml`) or by `.`/`..` is
    /// refused whole (it is then rebuilt from the directories), a plain name read back.
    #[test]
    fn entries_whose_names_are_paths_are_refused() {
        let index = |name: &[u8]| Index {
            dirs: vec![DirEntry {
                path: b"/etc/cdi".to_vec(),
                key: None,
                trusted: true,
                files: vec![FileEntry {
                    name: Cow::Owned(name.to_vec()),
                    key: Key {
                        dev: 1,
                        ino: 2,
                        size: 3,
                        mtime: 4,
                        ctime: 5,
                    },
                    trusted: true,
                    content: Content::Spec(Cow::Borrowed(b"x")),
                }],
            }],
        };
        let good = encode(&index(b"nvidia.yaml"));
        assert_eq!(decode(&good, 1), Some(index(b"nvidia.yaml")));
        for bad in [
            &b"../../etc/shadow.yaml"[..],
            b"sub/nvidia.yaml",
            b"/abs.yaml",
            b"..",
            b".",
            b"",
            b"a\0.yaml",
        ] {
            assert_eq!(decode(&encode(&index(bad)), 1), None, "{bad:?}");
        }
    }
}
