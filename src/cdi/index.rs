//! An index of the CDI spec directories, so that a `create` costs the same with 2 spec files or
//! 1,000 (a DRA driver writes one file per claim into `/var/run/cdi`).
//!
//! Without it every CDI `create` parses every spec file ([`Registry::load`]): measured on the
//! 2-core CI machine, +0.9 ms over the floor with 2 files, +8 to +10 ms with 500. With it a
//! `create` reads one small file, `stat`s each spec directory and each spec file, and parses
//! only the files that define the requested devices.
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
//! The files that define the requested devices are then read in full, and the `fstat` of what
//! was read must equal the indexed identity; otherwise, as when a requested name is not in the
//! index at all, the answer comes from a full scan ([`Registry::load`]), which also gives its
//! exact error messages.
//!
//! # Safety of the file itself
//!
//! Written to a temporary file and renamed over the old one, so concurrent `create`s each read
//! a whole index (the last writer wins; every reader re-validates what it uses). The file ends
//! with its length and a hash: a truncated or corrupt index is not used (and is rewritten). It
//! is used only when owned by this user and not writable by others (the directory is made
//! 0700): otherwise whoever could write it could hide a higher-priority definition. When the
//! cache directory cannot be written (read-only root), nothing is written and every `create`
//! scans as without an index.
//!
//! The format is a line per entry, not JSON: serde_json over a 500-file index costs more than
//! the stats it saves (about 0.2 ms measured against 0.03 ms for this parser on the CI machine);
//! the hash is a word-at-a-time multiply-xorshift for the same reason (SipHash over 60 KB is
//! about 40 µs).

use std::collections::HashMap;
use std::fs::Metadata;
use std::io::Write as _;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use super::registry::{LoadedSpec, Registry, ScanError};
use super::spec::{self, Spec};

/// How much older than the read an entry's ctime must be to be trusted: file timestamps come
/// from a clock that ticks every few milliseconds (and every second or two on some file
/// systems), so 2 s covers every tick.
pub const RACY_NS: i128 = 2_000_000_000;

const MAGIC: &str = "nvshim-cdi-index 1";

/// What identifies one version of a file or directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Key {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: i128,
    ctime: i128,
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
            mtime: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
            ctime: i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
        }
    }

    fn trusted_at(&self, read_at: i128) -> bool {
        self.ctime + RACY_NS < read_at
    }
}

/// What a spec file holds, as far as resolution needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Content {
    /// Kind and device names.
    Spec(String, Vec<String>),
    /// The message it failed to load with.
    Error(String),
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

fn now_ns() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128)
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
pub fn load_for(dirs: &[PathBuf], names: &[String], cache_dir: &Path) -> Registry {
    load_at(dirs, names, cache_dir, now_ns()).0
}

/// What one [`load_for`] did, for tests and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Spec files parsed.
    pub parsed: usize,
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
    read_at: i128,
) -> (Registry, Stats) {
    let clean: Vec<PathBuf> = dirs.iter().map(|d| super::registry::clean(d)).collect();
    let path = index_path(cache_dir, &clean);
    let old = read_index(&path, clean.len());
    let full = |mut stats: Stats| {
        stats.full_scan = true;
        (Registry::load(dirs), stats)
    };
    let Some((index, mut parsed, changed)) = refresh(&clean, old.as_ref(), read_at) else {
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
    match select(&clean, &index, names, &mut parsed, &mut stats) {
        Some(reg) => (reg, stats),
        None => full(stats),
    }
}

/// Specs parsed while refreshing, by path, with the identity of what was read.
type Parsed = HashMap<PathBuf, (Spec, Key)>;

/// The index as the directories are now: entries whose identity is unchanged and trusted are
/// kept, the others read again. `None` when something calls for a full scan instead (a
/// directory that cannot be read, a file that vanished meanwhile).
fn refresh(dirs: &[PathBuf], old: Option<&Index>, read_at: i128) -> Option<(Index, Parsed, bool)> {
    let mut index = Index::default();
    let mut parsed = Parsed::new();
    let mut changed = old.is_none();
    for (i, dir) in dirs.iter().enumerate() {
        let dir_bytes = dir.as_os_str().as_bytes().to_vec();
        let old_dir = old
            .and_then(|o| o.dirs.get(i))
            .filter(|d| d.path == dir_bytes);
        let meta = match std::fs::metadata(dir) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
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
        let key = Key::of(&meta);
        // The names: the index's when the directory is the same, else read again.
        let names: Vec<Vec<u8>> = match old_dir {
            Some(d) if d.key == Some(key) && d.trusted => {
                d.files.iter().map(|f| f.name.clone()).collect()
            }
            _ => {
                changed = true;
                list(dir)?
            }
        };
        let old_files: HashMap<&[u8], &FileEntry> = old_dir
            .map(|d| d.files.iter().map(|f| (f.name.as_slice(), f)).collect())
            .unwrap_or_default();
        let mut files = Vec::with_capacity(names.len());
        for name in names {
            let path = dir.join(std::ffi::OsStr::from_bytes(&name));
            let key = match std::fs::metadata(&path) {
                Ok(m) => Key::of(&m),
                Err(_) => {
                    // A dangling symlink, or a file gone since the listing: the error a full
                    // scan reports, tried again on every use (the zero key is never trusted).
                    changed = true;
                    let message = match spec::read_file(&path) {
                        Err(e) => e.to_string(),
                        Ok(_) => return None,
                    };
                    files.push(FileEntry {
                        name,
                        key: Key::ZERO,
                        trusted: false,
                        content: Content::Error(message),
                    });
                    continue;
                }
            };
            if let Some(f) = old_files.get(name.as_slice()) {
                if f.key == key && f.trusted {
                    files.push((*f).clone());
                    continue;
                }
            }
            changed = true;
            let (key, content) = match spec::read_file_with_meta(&path) {
                Ok((spec, meta)) => {
                    let key = Key::of(&meta);
                    let content = Content::Spec(
                        spec.kind.clone(),
                        spec.devices.iter().map(|d| d.name.clone()).collect(),
                    );
                    parsed.insert(path, (spec, key));
                    (key, content)
                }
                Err(e) => (key, Content::Error(e.to_string())),
            };
            files.push(FileEntry {
                name,
                key,
                trusted: key.trusted_at(read_at),
                content,
            });
        }
        index.dirs.push(DirEntry {
            path: dir_bytes,
            key: Some(key),
            trusted: key.trusted_at(read_at),
            files,
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

/// The registry of the files that define `names`, read and checked against the index; `None`
/// when a name is not in the index or a file changed since.
fn select(
    dirs: &[PathBuf],
    index: &Index,
    names: &[String],
    parsed: &mut Parsed,
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
            let path = dir.join(std::ffi::OsStr::from_bytes(&f.name));
            let (kind, devices) = match &f.content {
                Content::Error(message) => {
                    reg.push_error(ScanError::Cached {
                        path,
                        message: message.clone(),
                    });
                    continue;
                }
                Content::Spec(kind, devices) => (kind, devices),
            };
            let Some(want) = wanted.get(kind.as_str()) else {
                continue;
            };
            if !devices.iter().any(|d| want.contains(&d.as_str())) {
                continue;
            }
            for d in devices {
                if want.contains(&d.as_str()) {
                    missing.remove(format!("{kind}={d}").as_str());
                }
            }
            let (spec, key) = match parsed.remove(&path) {
                Some(p) => p,
                None => {
                    stats.parsed += 1;
                    let (spec, meta) = spec::read_file_with_meta(&path).ok()?;
                    (spec, Key::of(&meta))
                }
            };
            if key != f.key {
                return None;
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

/// A 64-bit multiply-xorshift over 8-byte words (see the module doc for why not SipHash): it
/// only has to notice a damaged file, not resist an attacker (who could not write it).
fn hash(bytes: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut h = bytes.len() as u64 ^ K;
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_le_bytes(c.try_into().unwrap_or([0; 8]));
        h = (h ^ w).wrapping_mul(K);
        h ^= h >> 29;
    }
    let mut tail = [0u8; 8];
    tail[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
    h = (h ^ u64::from_le_bytes(tail)).wrapping_mul(K);
    h ^ (h >> 32)
}

fn key_fields(k: &Key, out: &mut Vec<u8>) {
    let _ = write!(
        out,
        "{} {} {} {} {}",
        k.dev, k.ino, k.size, k.mtime, k.ctime
    );
}

fn encode(index: &Index) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + index.dirs.len() * 64);
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
            match &f.content {
                Content::Spec(kind, devices) => {
                    out.extend_from_slice(b" S ");
                    escape(kind.as_bytes(), &mut out);
                    for dev in devices {
                        out.push(b' ');
                        escape(dev.as_bytes(), &mut out);
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
    let h = hash(&out);
    let _ = writeln!(out, "END {body_len} {h:016x}");
    out
}

fn parse_key<'a>(fields: &mut impl Iterator<Item = &'a [u8]>) -> Option<Key> {
    let mut num = || -> Option<i128> { std::str::from_utf8(fields.next()?).ok()?.parse().ok() };
    Some(Key {
        dev: u64::try_from(num()?).ok()?,
        ino: u64::try_from(num()?).ok()?,
        size: u64::try_from(num()?).ok()?,
        mtime: num()?,
        ctime: num()?,
    })
}

fn decode(bytes: &[u8], dirs: usize) -> Option<Index> {
    // The trailer first: a truncated or damaged file is not read at all.
    let body_end = bytes[..bytes.len().checked_sub(1)?]
        .iter()
        .rposition(|&b| b == b'\n')?
        + 1;
    let (body, trailer) = bytes.split_at(body_end);
    let trailer = std::str::from_utf8(trailer).ok()?.trim_end_matches('\n');
    let mut t = trailer.split(' ');
    if t.next()? != "END"
        || t.next()?.parse::<usize>().ok()? != body.len()
        || u64::from_str_radix(t.next()?, 16).ok()? != hash(body)
    {
        return None;
    }
    let mut lines = body.split(|&b| b == b'\n');
    if lines.next()? != MAGIC.as_bytes() {
        return None;
    }
    let mut index = Index::default();
    for line in lines {
        if line.is_empty() {
            continue;
        }
        let mut fields = line.split(|&b| b == b' ');
        match fields.next()? {
            b"D" => {
                let path = unescape(fields.next()?)?;
                if line.ends_with(b" missing") {
                    index.dirs.push(DirEntry {
                        path,
                        key: None,
                        trusted: true,
                        files: Vec::new(),
                    });
                    continue;
                }
                let key = parse_key(&mut fields)?;
                let trusted = fields.next()? == b"1";
                index.dirs.push(DirEntry {
                    path,
                    key: Some(key),
                    trusted,
                    files: Vec::new(),
                });
            }
            b"F" => {
                let key = parse_key(&mut fields)?;
                let trusted = fields.next()? == b"1";
                let name = unescape(fields.next()?)?;
                let content = match fields.next()? {
                    b"S" => {
                        let kind = String::from_utf8(unescape(fields.next()?)?).ok()?;
                        let devices = fields
                            .map(|f| unescape(f).and_then(|d| String::from_utf8(d).ok()))
                            .collect::<Option<Vec<String>>>()?;
                        Content::Spec(kind, devices)
                    }
                    b"E" => Content::Error(String::from_utf8(unescape(fields.next()?)?).ok()?),
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
    (index.dirs.len() == dirs).then_some(index)
}

/// The index at `path`, when it is whole, for `dirs` directories, and only this user can
/// have written it.
fn read_index(path: &Path, dirs: usize) -> Option<Index> {
    use std::io::Read;
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    let meta = file.metadata().ok()?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if !meta.is_file() || meta.uid() != euid || meta.permissions().mode() & 0o022 != 0 {
        tracing::warn!(
            "CDI index {} is not a file owned by uid {euid} and writable only by it: not used (remove it)",
            path.display()
        );
        return None;
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.read_to_end(&mut bytes).ok()?;
    decode(&bytes, dirs)
}

/// Writes the index with [`crate::atomic::write`], mode 0600 in a 0700 directory. Not flushed:
/// it lives on /run (tmpfs), and a lost or damaged one is only rebuilt.
fn write_index(cache_dir: &Path, path: &Path, index: &Index) -> std::io::Result<()> {
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
    crate::atomic::write(path, &encode(index), &opts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// A moment after every file a test writes: entries count as trusted (not racy).
    fn later() -> i128 {
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
        fn check(&self, names: &[&str], read_at: i128) -> Stats {
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
                            content: Content::Spec(
                                "v.com/c".into(),
                                vec!["a".into(), "b:1".into()],
                            ),
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
