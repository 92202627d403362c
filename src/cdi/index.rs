//! An index of the CDI spec directories, so that a `create` does not parse every spec file on
//! the node (a DRA driver writes one file per claim into `/var/run/cdi`).
//!
//! Without it every CDI `create` parses every spec file ([`Registry::load`]). With it a
//! `create` reads one file, `stat`s each spec directory and each spec file, and parses only
//! the files that define the requested devices. Measured on the 2-core CI machine
//! (`scripts/bench.sh`, docs/benchmarks.md): with 1,000 claim specs beside the node spec, a
//! create costs about 2 ms more than with 2 files, against 11 ms more without the index; of
//! those 2 ms, about 1 ms is the 1,000 `fstatat` calls and 0.4 ms reading and decoding the
//! 200 KB index (allocation and page faults included).
//!
//! # What the index holds, and why an answer from it cannot be stale
//!
//! `<cache-dir>/cdi-index-<hash of the directory list>`: for each spec directory its identity
//! (device, inode, mtime, ctime) and its spec file names, and for each spec file its identity
//! (device, inode, size, mtime, ctime of the file it names, symlinks followed) with the kind
//! and device names it defines, or the error it failed with. An entry is used only when a
//! fresh `stat` gives the same identity, so a changed, added, removed or renamed file (or a
//! directory whose entries changed: its mtime and ctime move) is always read again.
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
//! The format is a line per entry, not JSON: decoding it costs about 0.15 ms for 1,000 entries
//! in a warm loop, where serde_json into `Value`s took 0.67 ms for 500 (release build, this
//! repository's CI machine). The file ends with a [`checksum`] of a word at a time rather than
//! std's SipHash, which took 0.85 M of a create's 7.8 M instructions on the 200 KB index of
//! 1,000 spec files (callgrind).
//!
//! One file (700 lines of code, 350 of tests): the on-disk format and the staleness rule are one
//! design, since the identity (`Key`) that is written is the one a fresh `stat` is compared with,
//! and the refresh, the selection and the encoder and decoder all work on the same `Index`.

use std::collections::HashMap;
use std::fs::Metadata;
use std::io::Write as _;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use super::registry::{LoadedSpec, Registry, ScanError};
use super::spec::{self, Spec};
use super::spec_cache;

/// How much older than the read an entry's ctime must be to be trusted: file timestamps come
/// from a clock that ticks every few milliseconds (and every second or two on some file
/// systems), so 2 s covers every tick.
pub const RACY_NS: i64 = 2_000_000_000;

const MAGIC: &str = "nvshim-cdi-index 2";

/// What identifies one version of a file or directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Key {
    pub(super) dev: u64,
    pub(super) ino: u64,
    pub(super) size: u64,
    /// Nanoseconds since the epoch (an i64 holds them until 2262).
    pub(super) mtime: i64,
    pub(super) ctime: i64,
}

impl Key {
    const ZERO: Key = Key {
        dev: 0,
        ino: 0,
        size: 0,
        mtime: 0,
        ctime: 0,
    };

    fn of(m: &Metadata) -> Key {
        Key {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: m
                .mtime()
                .saturating_mul(1_000_000_000)
                .saturating_add(m.mtime_nsec()),
            ctime: m
                .ctime()
                .saturating_mul(1_000_000_000)
                .saturating_add(m.ctime_nsec()),
        }
    }

    /// From `fstatat`, which a directory walk uses (same fields as [`Key::of`]).
    fn of_stat(st: &nix::sys::stat::FileStat) -> Key {
        Key {
            dev: st.st_dev,
            ino: st.st_ino,
            size: st.st_size as u64,
            mtime: st
                .st_mtime
                .saturating_mul(1_000_000_000)
                .saturating_add(st.st_mtime_nsec),
            ctime: st
                .st_ctime
                .saturating_mul(1_000_000_000)
                .saturating_add(st.st_ctime_nsec),
        }
    }

    pub(super) fn trusted_at(&self, read_at: i64) -> bool {
        self.ctime.saturating_add(RACY_NS) < read_at
    }
}

/// What a spec file holds, as far as resolution needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Content {
    /// `<kind> <device> <device> ...`: one string, as the index stores it (a valid kind or
    /// device name holds no space: `name.rs`), split only for the kinds a `create` asks for.
    Spec(String),
    /// The message it failed to load with.
    Error(String),
}

impl Content {
    fn of(spec: &Spec) -> Content {
        let mut s = spec.kind.clone();
        for d in &spec.devices {
            s.push(' ');
            s.push_str(&d.name);
        }
        Content::Spec(s)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct FileEntry {
    /// The file name (bytes, escaped on disk).
    name: Vec<u8>,
    key: Key,
    trusted: bool,
    content: Content,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct DirEntry {
    /// The directory (cleaned), as configured.
    path: Vec<u8>,
    /// `None`: the directory does not exist.
    key: Option<Key>,
    trusted: bool,
    files: Vec<FileEntry>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Index {
    dirs: Vec<DirEntry>,
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// std's SipHash with its fixed keys, for the names of the cache files: a file named by
/// another build that hashes differently is only rebuilt.
pub(super) fn hash(bytes: &[u8]) -> u64 {
    use std::hash::Hasher;
    #[allow(deprecated)]
    let mut h = std::hash::SipHasher::new();
    h.write(bytes);
    h.finish()
}

/// The checksum that ends a cache file (the index, `spec_cache.rs`). It only has to notice a
/// damaged or truncated file, since only root or this user can write one (`read_private`): so
/// FxHash's step over 8-byte words (rotate, xor the word, multiply by an odd constant), about
/// 0.6 instructions a byte where SipHash took 4.3. Each step is a bijection of the running
/// value, so a change within one word always changes the result; the length is mixed in first.
pub(super) fn checksum(bytes: &[u8]) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let step =
        |h: u64, word: [u8; 8]| (h.rotate_left(5) ^ u64::from_le_bytes(word)).wrapping_mul(K);
    let mut words = bytes.chunks_exact(8);
    let mut h = step(0, (bytes.len() as u64).to_le_bytes());
    for w in &mut words {
        let mut word = [0u8; 8];
        word.copy_from_slice(w);
        h = step(h, word);
    }
    let mut tail = [0u8; 8];
    tail[..words.remainder().len()].copy_from_slice(words.remainder());
    step(h, tail)
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
    let old = read_index(&path, clean.len());
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
    match select(
        &clean,
        &index,
        names,
        &mut parsed,
        cache_dir,
        read_at,
        &mut stats,
    ) {
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
fn refresh(
    dirs: &[PathBuf],
    old: Option<Index>,
    cache_dir: &Path,
    read_at: i64,
) -> Option<(Index, Parsed, bool)> {
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
        let (mut same, mut by_name): (Vec<FileEntry>, HashMap<Vec<u8>, FileEntry>) = match old_dir {
            Some(d) if d.key == Some(key) && d.trusted => (d.files, HashMap::new()),
            other => {
                changed = true;
                let listed = list(dir)?;
                let old: HashMap<Vec<u8>, FileEntry> = other
                    .map(|d| d.files.into_iter().map(|f| (f.name.clone(), f)).collect())
                    .unwrap_or_default();
                let placeholders = listed
                    .into_iter()
                    .map(|name| FileEntry {
                        name,
                        key: Key::ZERO,
                        trusted: false,
                        content: Content::Error(String::new()),
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
                by_name.remove(&entry.name)
            };
            let stat = nix::sys::stat::fstatat(
                Some(dir_fd.as_raw_fd()),
                std::ffi::OsStr::from_bytes(&entry.name),
                nix::fcntl::AtFlags::AT_NO_AUTOMOUNT,
            );
            let candidate = old.as_ref().unwrap_or(entry);
            if let Ok(st) = &stat {
                if candidate.trusted && candidate.key == Key::of_stat(st) {
                    if let Some(old) = old {
                        *entry = old;
                    }
                    continue;
                }
            }
            changed = true;
            let path = dir.join(std::ffi::OsStr::from_bytes(&entry.name));
            match (stat, spec::read_file_with_meta(&path)) {
                (Ok(_), Ok((spec, meta))) => {
                    let key = Key::of(&meta);
                    entry.content = Content::of(&spec);
                    entry.key = key;
                    entry.trusted = key.trusted_at(read_at);
                    parsed.insert(path, (spec, key));
                }
                (Ok(st), Err(e)) => {
                    let key = Key::of_stat(&st);
                    entry.content = Content::Error(e.to_string());
                    entry.key = key;
                    entry.trusted = key.trusted_at(read_at);
                }
                // A dangling symlink, or a file gone since the listing: the error a full
                // scan reports, tried again on every use (the zero key is never trusted).
                (Err(_), Err(e)) => {
                    entry.content = Content::Error(e.to_string());
                    entry.key = Key::ZERO;
                    entry.trusted = false;
                }
                (Err(_), Ok(_)) => return None,
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
            trusted: key.trusted_at(read_at),
            files: same,
        });
    }
    Some((index, parsed, changed))
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
    index: &Index,
    names: &[String],
    parsed: &mut Parsed,
    cache_dir: &Path,
    read_at: i64,
    stats: &mut Stats,
) -> Option<Registry> {
    let mut wanted: HashMap<&str, Vec<&str>> = HashMap::new();
    for n in names {
        let (kind, device) = n.split_once('=')?;
        wanted.entry(kind).or_default().push(device);
    }
    let mut missing: std::collections::HashSet<&str> = names.iter().map(String::as_str).collect();
    let mut reg = Registry::empty(dirs);
    for (priority, (dir, entry)) in dirs.iter().zip(&index.dirs).enumerate() {
        for f in &entry.files {
            let spec_line = match &f.content {
                Content::Error(message) => {
                    reg.push_error(ScanError::Cached {
                        path: dir.join(std::ffi::OsStr::from_bytes(&f.name)),
                        message: message.clone(),
                    });
                    continue;
                }
                Content::Spec(line) => line,
            };
            let mut fields = spec_line.split(' ');
            let kind = fields.next().unwrap_or_default();
            let Some(want) = wanted.get(kind) else {
                continue;
            };
            let mut defines = false;
            for d in fields {
                if want.contains(&d) {
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
                .then(|| spec_cache::read(cache_dir, &path, &f.key, want))
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
            if !from_cache && large && key.trusted_at(read_at) {
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

/// Bytes outside `!`..`~`, and `%`, as `%XX`: names and messages stay one field on one line.
fn escape(bytes: &[u8], out: &mut Vec<u8>) {
    for &b in bytes {
        if b <= b' ' || b == b'%' || b >= 0x7f {
            out.extend_from_slice(format!("%{b:02x}").as_bytes());
        } else {
            out.push(b);
        }
    }
}

fn unescape(s: &[u8]) -> Option<Vec<u8>> {
    if memchr::memchr(b'%', s).is_none() {
        return Some(s.to_vec());
    }
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'%' {
            let hex = std::str::from_utf8(s.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(s[i]);
            i += 1;
        }
    }
    Some(out)
}

pub(super) fn key_fields(k: &Key, out: &mut Vec<u8>) {
    let _ = write!(
        out,
        "{} {} {} {} {}",
        k.dev, k.ino, k.size, k.mtime, k.ctime
    );
}

fn encode(index: &Index) -> Vec<u8> {
    let files: usize = index.dirs.iter().map(|d| d.files.len()).sum();
    let mut out = Vec::with_capacity(64 + files * 200);
    let _ = writeln!(out, "{MAGIC}");
    for d in &index.dirs {
        out.extend_from_slice(b"D ");
        escape(&d.path, &mut out);
        match &d.key {
            None => out.extend_from_slice(b" missing\n"),
            Some(k) => {
                out.push(b' ');
                key_fields(k, &mut out);
                let _ = writeln!(out, " {}", u8::from(d.trusted));
            }
        }
        for f in &d.files {
            out.extend_from_slice(b"F ");
            key_fields(&f.key, &mut out);
            let _ = write!(out, " {} ", u8::from(f.trusted));
            escape(&f.name, &mut out);
            // Space-separated words for a spec (a word holds no space), one escaped field for
            // an error message.
            match &f.content {
                Content::Spec(line) => {
                    out.extend_from_slice(b" S");
                    for word in line.split(' ') {
                        out.push(b' ');
                        escape(word.as_bytes(), &mut out);
                    }
                }
                Content::Error(m) => {
                    out.extend_from_slice(b" E ");
                    escape(m.as_bytes(), &mut out);
                }
            }
            out.push(b'\n');
        }
    }
    let body_len = out.len();
    let h = checksum(&out);
    let _ = writeln!(out, "END {body_len} {h:016x}");
    out
}

/// The next space-separated field of `line` from `*at`.
fn field<'a>(line: &'a [u8], at: &mut usize) -> Option<&'a [u8]> {
    let rest = line.get(*at..)?;
    let end = memchr::memchr(b' ', rest).unwrap_or(rest.len());
    *at += end + 1;
    Some(&rest[..end])
}

fn number(f: &[u8]) -> Option<i64> {
    let (neg, digits) = match f.split_first()? {
        (b'-', rest) => (true, rest),
        _ => (false, f),
    };
    if digits.is_empty() {
        return None;
    }
    let mut n: u64 = 0;
    for &b in digits {
        if !b.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    let n = i64::try_from(n).ok()?;
    Some(if neg { -n } else { n })
}

fn parse_key(line: &[u8], at: &mut usize) -> Option<Key> {
    let mut unsigned = || -> Option<u64> {
        let f = field(line, at)?;
        let mut n: u64 = 0;
        for &b in f {
            if !b.is_ascii_digit() {
                return None;
            }
            n = n.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
        }
        (!f.is_empty()).then_some(n)
    };
    let (dev, ino, size) = (unsigned()?, unsigned()?, unsigned()?);
    Some(Key {
        dev,
        ino,
        size,
        mtime: number(field(line, at)?)?,
        ctime: number(field(line, at)?)?,
    })
}

fn decode(bytes: &[u8], dirs: usize) -> Option<Index> {
    // The trailer first: a truncated or damaged file is not read at all.
    let body_end = memchr::memrchr(b'\n', &bytes[..bytes.len().checked_sub(1)?])? + 1;
    let (body, trailer) = bytes.split_at(body_end);
    let trailer = std::str::from_utf8(trailer).ok()?.trim_end_matches('\n');
    let mut t = trailer.split(' ');
    if t.next()? != "END"
        || t.next()?.parse::<usize>().ok()? != body.len()
        || u64::from_str_radix(t.next()?, 16).ok()? != checksum(body)
    {
        return None;
    }
    let rest = body.strip_prefix(MAGIC.as_bytes())?.strip_prefix(b"\n")?;
    let mut index = Index::default();
    let mut start = 0;
    for end in memchr::memchr_iter(b'\n', rest) {
        let line = &rest[start..end];
        start = end + 1;
        let mut at = 2;
        match line.get(..2)? {
            b"D " => {
                let path = unescape(field(line, &mut at)?)?;
                if line.ends_with(b" missing") {
                    index.dirs.push(DirEntry {
                        path,
                        key: None,
                        trusted: true,
                        files: Vec::new(),
                    });
                    continue;
                }
                let key = parse_key(line, &mut at)?;
                let trusted = field(line, &mut at)? == b"1";
                index.dirs.push(DirEntry {
                    path,
                    key: Some(key),
                    trusted,
                    files: Vec::new(),
                });
            }
            b"F " => {
                let key = parse_key(line, &mut at)?;
                let trusted = field(line, &mut at)? == b"1";
                let name = unescape(field(line, &mut at)?)?;
                let tag = field(line, &mut at)?;
                let text = String::from_utf8(unescape(line.get(at..)?)?).ok()?;
                let content = match tag {
                    b"S" => Content::Spec(text),
                    b"E" => Content::Error(text),
                    _ => return None,
                };
                index.dirs.last_mut()?.files.push(FileEntry {
                    name,
                    key,
                    trusted,
                    content,
                });
            }
            _ => return None,
        }
    }
    (start == rest.len() && index.dirs.len() == dirs).then_some(index)
}

/// The index at `path`, when it is whole, for `dirs` directories, and only root or this user
/// can have written it.
fn read_index(path: &Path, dirs: usize) -> Option<Index> {
    decode(&read_private(path, "CDI index")?, dirs)
}

/// The bytes of a cache file (`what`: its name in the warning) that only root or this user can
/// have written: a regular file (not followed if a symlink) owned by root or this user and
/// writable by its owner only. Otherwise whoever could write it could hide a higher-priority
/// definition or change what a device brings.
pub(super) fn read_private(path: &Path, what: &str) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    let meta = file.metadata().ok()?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    let owner_ok = meta.uid() == euid || meta.uid() == 0;
    if !meta.is_file() || !owner_ok || meta.permissions().mode() & 0o022 != 0 {
        tracing::warn!(
            "{what} {} is not a file owned by root or uid {euid} and writable only by its owner: not used (remove it)",
            path.display()
        );
        return None;
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize + 1);
    file.read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

/// Writes the index ([`write_private`]).
fn write_index(cache_dir: &Path, path: &Path, index: &Index) -> std::io::Result<()> {
    write_private(cache_dir, path, &encode(index))
}

/// Writes a cache file with [`crate::atomic::write`], mode 0600 in a 0700 directory. Not
/// flushed: it lives on /run (tmpfs), and a lost or damaged one is only rebuilt.
pub(super) fn write_private(cache_dir: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(cache_dir)?;
    let opts = crate::atomic::Options {
        mode: 0o600,
        owner: None,
        durability: crate::atomic::Durability::None,
    };
    crate::atomic::write(path, bytes, &opts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

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
        let i = good.iter().position(|&b| b == b'S').unwrap();
        flipped[i + 2] ^= 1;
        for bad in [&good[..good.len() / 2], &flipped[..], b"", b"\n\n\xff"] {
            assert!(decode(bad, 2).is_none());
            fs::write(&path, bad).unwrap();
            let s = d.check(&["v.com/c=a"], t);
            assert!(s.wrote && s.parsed == 1, "{s:?}");
        }
        // Writable by others: not used (and replaced by this user's).
        fs::set_permissions(&path, fs::Permissions::from_mode(0o666)).unwrap();
        assert!(read_index(&path, 2).is_none());
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
    fn keys_read_back_and_malformed_ones_are_refused() {
        let key = Key {
            dev: u64::MAX,
            ino: 0,
            size: 40_337,
            mtime: -1_700_000_000_123_456_789,
            ctime: i64::MAX,
        };
        let mut line = Vec::new();
        key_fields(&key, &mut line);
        line.extend_from_slice(b" rest");
        let mut at = 0;
        assert_eq!(parse_key(&line, &mut at), Some(key));
        assert_eq!(&line[at..], b"rest");
        for bad in [
            &b"1 2 3 4"[..],
            b"1 2 3 4 ",
            b"1  2 3 4 5",
            b"1 2 -3 4 5",
            b"1 2 3 4 -",
            b"1 2 3 4 5x",
            b"1 2 3 4 9223372036854775808",
            b"18446744073709551616 2 3 4 5",
        ] {
            assert_eq!(
                parse_key(bad, &mut 0),
                None,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn the_checksum_notices_any_one_changed_byte_and_the_length() {
        let bytes: Vec<u8> = (0..41u8).collect();
        let sum = checksum(&bytes);
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut changed = bytes.clone();
                changed[i] ^= 1 << bit;
                assert_ne!(checksum(&changed), sum, "byte {i} bit {bit}");
            }
        }
        assert_ne!(checksum(&bytes[..40]), sum);
        assert_ne!(checksum(&[&bytes[..], &[0]].concat()), sum);
        assert_ne!(checksum(b""), checksum(b"\0"));
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
                            name: b"a b%\n\xff.yaml".to_vec(),
                            key: Key {
                                dev: 6,
                                ino: 7,
                                size: 8,
                                mtime: 9,
                                ctime: 10,
                            },
                            trusted: true,
                            content: Content::Error("line 1: bad\tthing %".into()),
                        },
                        FileEntry {
                            name: b"n.json".to_vec(),
                            key: Key {
                                dev: 6,
                                ino: 8,
                                size: 8,
                                mtime: 9,
                                ctime: 10,
                            },
                            trusted: true,
                            content: Content::Spec("v.com/c a b:1".into()),
                        },
                    ],
                },
            ],
        };
        assert_eq!(decode(&encode(&index), 2), Some(index.clone()));
        assert_eq!(decode(&encode(&index), 3), None);
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
}
