//! The private cache files nvshim keeps under `cache-dir` (`/run/nvshim`: the CDI index and
//! parsed specs, `src/cdi/index.rs` and `src/cdi/spec_cache.rs`; what the GPUs' `/proc` files
//! say, `src/host/gpu_cache.rs`; the driver's MIG minors, `src/host/mig_table.rs`; NVML's
//! answer, `src/host/nvml/cache.rs`), at most [`MAX_FILES`] of them, and the identity rule that
//! makes an answer
//! from them safe: an entry is used only while a fresh `stat` of what it describes gives the
//! same [`Key`], and only once that key's ctime is more than [`RACY_NS`] older than the moment
//! it was read (git's "racily clean" rule). A cache file is written atomically, is private to
//! root or this user, and ends with a [`checksum`]: a damaged, truncated or foreign one is not
//! used (and is rebuilt); an unwritable cache dir costs only the cache.

use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

// The identity rule and the trailer, in the library the hook links too (one home).
pub use nvshim_hook::cache::{checksum, now_ns, private, seal, unseal, Key, RACY_NS};

/// Whether a [`Key`] of a file in `dir` names one version of it: the file system is a local
/// one that stamps inodes and times itself on every change (disk and memory file systems).
/// Not an image file system (squashfs, erofs: inodes and times come from the image, so an
/// image swapped on a reused loop device keeps every part of the key), an overlay (whose
/// layers may be such images), `/proc` or `/sys` (directories keep the time they were first
/// looked at), nor network and FUSE file systems (times from a server or a daemon). Anything
/// not listed is not trusted: its files are read again every time.
pub fn trusts_identity(dir: &Path) -> bool {
    // `statfs` magics (linux/magic.h; ZFS's and bcachefs's their own), as numbers.
    const LOCAL: [u32; 8] = [
        0xef53,      // ext2, ext3, ext4
        0x5846_5342, // xfs
        0x9123_683e, // btrfs
        0x0102_1994, // tmpfs
        0xf2f5_2010, // f2fs
        0x2fc1_2fc1, // zfs
        0xca45_1a4e, // bcachefs
        0x8584_58f6, // ramfs
    ];
    // The low 32 bits: `f_type` is a signed word on some targets.
    nix::sys::statfs::statfs(dir).is_ok_and(|fs| LOCAL.contains(&(fs.filesystem_type().0 as u32)))
}

/// Why `dir` may not hold nvshim's caches, or `None` when it may: the directory above it (and
/// `dir` itself once it exists) must be owned by root or this user and writable by no one
/// else. Otherwise another user could make `dir`, or swap it, before root writes there (a
/// `cache-dir` under `/tmp`), and [`read_private`]'s check of each file would rest on a
/// directory they control. Only these two levels are checked: `/run/nvshim`, the default,
/// costs two `stat`s per create.
pub fn untrusted_dir(dir: &Path) -> Option<String> {
    let euid = nix::unistd::geteuid().as_raw();
    let parent = dir.parent().filter(|p| !p.as_os_str().is_empty());
    let parent = parent.unwrap_or(Path::new("."));
    for (d, must_exist) in [(parent, true), (dir, false)] {
        let meta = match std::fs::metadata(d) {
            Ok(m) => m,
            Err(e) if !must_exist && e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Some(format!("{}: {e}", d.display())),
        };
        let owner_ok = meta.uid() == 0 || meta.uid() == euid;
        if !owner_ok || meta.permissions().mode() & 0o022 != 0 {
            return Some(format!(
                "{} is owned by uid {} with mode {:o}: a cache-dir and the directory above it must be owned by root (or uid {euid}) and writable by no one else",
                d.display(),
                meta.uid(),
                meta.permissions().mode() & 0o7777
            ));
        }
    }
    None
}

/// std's SipHash with its fixed keys, for the names of the cache files: a file named by
/// another build that hashes differently is only rebuilt.
pub fn hash(bytes: &[u8]) -> u64 {
    use std::hash::Hasher;
    #[allow(deprecated)]
    let mut h = std::hash::SipHasher::new();
    h.write(bytes);
    h.finish()
}

/// Appends `fields` to `out` as one line, tab-separated; `None` (with `out` cut back) when a
/// field holds a tab or newline, which the line could not keep apart.
pub fn line(out: &mut Vec<u8>, fields: &[&[u8]]) -> Option<()> {
    let start = out.len();
    for (i, f) in fields.iter().enumerate() {
        if f.contains(&b'\t') || f.contains(&b'\n') {
            out.truncate(start);
            return None;
        }
        if i > 0 {
            out.push(b'\t');
        }
        out.extend_from_slice(f);
    }
    out.push(b'\n');
    Some(())
}

/// The lines of a cache file's `body`, without their `\n` (a last one without it too).
pub fn lines(body: &str) -> impl Iterator<Item = &str> {
    // [`split`] less the empty field after a final `\n`; an empty body has no line at all.
    let count = if body.is_empty() { 0 } else { usize::MAX };
    split(body.strip_suffix('\n').unwrap_or(body), b'\n').take(count)
}

/// `line` split at every `sep` (ASCII), by byte: `str::split(char)` cost a MIG `all` create
/// 150,000 instructions decoding the 112 cached capability minors (callgrind).
pub fn split(line: &str, sep: u8) -> impl Iterator<Item = &str> {
    debug_assert!(sep.is_ascii());
    let mut start = 0;
    nvshim_hook::bytes::positions(sep, line.as_bytes())
        .chain([line.len()])
        .map(move |end| {
            // `sep` is ASCII: both ends are `str` boundaries.
            let field = line.get(start..end).unwrap_or_default();
            start = end + 1;
            field
        })
}

/// `line` [`split`] into exactly `N` fields; `None` for another count.
pub fn fields<const N: usize>(line: &str, sep: u8) -> Option<[&str; N]> {
    let mut out = [""; N];
    let mut n = 0;
    for field in split(line, sep) {
        *out.get_mut(n)? = field;
        n += 1;
    }
    (n == N).then_some(out)
}

/// A key as [`key_fields`] writes it.
pub fn parse_key(text: &str) -> Option<Key> {
    let [dev, ino, size, mtime, ctime] = fields(text, b' ')?;
    Some(Key {
        dev: dev.parse().ok()?,
        ino: ino.parse().ok()?,
        size: size.parse().ok()?,
        mtime: mtime.parse().ok()?,
        ctime: ctime.parse().ok()?,
    })
}

/// An optional text as a field: `None` empty, `Some(x)` as `=x`.
pub fn optional_field(v: Option<&str>) -> Vec<u8> {
    v.map_or_else(Vec::new, |v| [b"=", v.as_bytes()].concat())
}

/// What [`optional_field`] wrote; `None` when it is not such a field.
pub fn parse_optional_field(field: &str) -> Option<Option<String>> {
    match field {
        "" => Some(None),
        f => Some(Some(f.strip_prefix('=')?.to_string())),
    }
}

/// `k` as five decimal fields, space-separated (the spec cache's key line).
pub fn key_fields(k: &Key, out: &mut Vec<u8>) {
    let mut buf = itoa::Buffer::new();
    out.extend_from_slice(buf.format(k.dev).as_bytes());
    for n in [k.ino, k.size] {
        out.push(b' ');
        out.extend_from_slice(buf.format(n).as_bytes());
    }
    for n in [k.mtime, k.ctime] {
        out.push(b' ');
        out.extend_from_slice(buf.format(n).as_bytes());
    }
}

/// The bytes of a cache file (`what`: its name in the warning) that only root or this user can
/// have written: a regular file (not followed if a symlink) owned by root or this user and
/// writable by its owner only. Otherwise whoever could write it could hide a higher-priority
/// definition or change what a device brings.
pub fn read_private(path: &Path, what: &str) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    let meta = file.metadata().ok()?;
    if !private(meta.is_file(), meta.uid(), meta.permissions().mode()) {
        let euid = nix::unistd::geteuid();
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

/// Writes a cache file with [`crate::atomic::write`], mode 0600 in a 0700 directory. Not
/// flushed: it lives on /run (tmpfs), and a lost or damaged one is only rebuilt. Then keeps
/// the directory within [`MAX_FILES`] ([`bound`]).
pub fn write_private(cache_dir: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
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
    crate::atomic::write(path, bytes, &opts)?;
    bound(cache_dir);
    Ok(())
}

/// The names nvshim's cache files start with: the CDI index (`cdi-index-`, `src/cdi/index.rs`),
/// parsed specs (`cdi-spec-`), the GPUs' `/proc` facts (`gpus-`), the driver's MIG minors
/// (`mig-minors-`) and NVML's answers (`nvml-`). Nothing else in `cache-dir` is nvshim's.
pub const PREFIXES: [&str; 5] = ["cdi-index-", "cdi-spec-", "gpus-", "mig-minors-", "nvml-"];

/// Cache files kept at most: the names hash the paths they describe (config roots, spec
/// directory lists, spec files), so changed configs and churned spec files would otherwise
/// each leave a file behind. Past it the least recently written go ([`write_private`]).
pub const MAX_FILES: usize = 128;

/// One of nvshim's files in `cache-dir`, as [`list`] finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheFile {
    pub path: std::path::PathBuf,
    pub bytes: u64,
    /// Written this long ago (a clock that went back counts as now).
    pub age: std::time::Duration,
    /// Whether nvshim uses it: a regular file owned by root or this user, writable only by
    /// its owner ([`private`]); any other is ignored.
    pub used: bool,
}

/// Whether `name` is one of nvshim's cache files, or the temporary file of one
/// (`crate::atomic`'s `.<name>.nvshim-<pid>.tmp`, left by a writer killed mid-write).
fn is_cache_name(name: &[u8]) -> bool {
    let name = match name.strip_prefix(b".") {
        Some(rest) if name.ends_with(b".tmp") => rest,
        Some(_) => return false,
        None => name,
    };
    PREFIXES.iter().any(|p| name.starts_with(p.as_bytes()))
}

/// nvshim's files in `dir` (temporary ones included), least recently written first; none when
/// `dir` does not exist. Symlinks are listed, not followed.
pub fn list(dir: &Path) -> std::io::Result<Vec<CacheFile>> {
    use std::os::unix::ffi::OsStrExt;
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let now = std::time::SystemTime::now();
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry?;
        if !is_cache_name(entry.file_name().as_bytes()) {
            continue;
        }
        let Ok(meta) = std::fs::symlink_metadata(entry.path()) else {
            continue;
        };
        out.push(CacheFile {
            path: entry.path(),
            bytes: meta.len(),
            age: meta
                .modified()
                .ok()
                .and_then(|m| now.duration_since(m).ok())
                .unwrap_or_default(),
            used: private(meta.is_file(), meta.uid(), meta.permissions().mode()),
        });
    }
    out.sort_by(|a, b| b.age.cmp(&a.age).then_with(|| a.path.cmp(&b.path)));
    Ok(out)
}

/// Removes nvshim's files from `dir` (nothing else there); how many were removed.
pub fn clear(dir: &Path) -> std::io::Result<usize> {
    let mut removed = 0;
    for f in list(dir)? {
        match std::fs::remove_file(&f.path) {
            Ok(()) => removed += 1,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(removed)
}

/// Keeps `dir` at [`MAX_FILES`] of nvshim's files: counts them with one listing, and only past
/// the bound looks at their times and removes the least recently written. A file removed
/// under a reader costs that reader a re-read, never a wrong answer.
fn bound(dir: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let count = std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .filter_map(Result::ok)
            .filter(|e| is_cache_name(e.file_name().as_bytes()))
            .count()
    });
    if count <= MAX_FILES {
        return;
    }
    let Ok(files) = list(dir) else { return };
    for f in &files[..files.len().saturating_sub(MAX_FILES)] {
        let _ = std::fs::remove_file(&f.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A private file gives its bytes, then the new ones once replaced. A file others could
    /// write is not used.
    #[test]
    fn private_files_give_their_bytes() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        for len in [0, 1, 4096, 65535, 65536, 65537, 200_000] {
            let path = dir.path().join(format!("f{len}"));
            let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            write_private(dir.path(), &path, &bytes).unwrap();
            let got = read_private(&path, "test").unwrap();
            assert_eq!(&got[..], &bytes[..], "{len}");
            write_private(dir.path(), &path, b"new").unwrap();
            assert_eq!(&read_private(&path, "test").unwrap()[..], b"new");
        }
        let shared = dir.path().join("shared");
        std::fs::write(&shared, vec![0u8; 8192]).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(read_private(&shared, "test").is_none());
    }

    #[test]
    fn lines_and_fields_split_as_written() {
        let body = "a\tb\n\nc\td\te\nlast";
        let got: Vec<&str> = lines(body).collect();
        assert_eq!(got, ["a\tb", "", "c\td\te", "last"]);
        assert_eq!(lines("x\n").collect::<Vec<_>>(), ["x"]);
        assert_eq!(lines("").count(), 0);
        assert_eq!(fields::<2>("a\tb", b'\t'), Some(["a", "b"]));
        assert_eq!(fields::<3>("c\t\té", b'\t'), Some(["c", "", "é"]));
        assert_eq!(fields::<2>("a\tb\tc", b'\t'), None);
        assert_eq!(fields::<2>("a", b'\t'), None);
        let k = Key {
            dev: 1,
            ino: 2,
            size: 3,
            mtime: -4,
            ctime: 5,
        };
        let mut text = Vec::new();
        key_fields(&k, &mut text);
        assert_eq!(parse_key(std::str::from_utf8(&text).unwrap()), Some(k));
        assert_eq!(parse_key("1 2 3 4"), None);
        assert_eq!(parse_key("1 2 3 4 x"), None);
    }

    #[test]
    fn key_fields_are_the_decimal_numbers() {
        let k = Key {
            dev: u64::MAX,
            ino: 0,
            size: 42,
            mtime: -1_500_000_000,
            ctime: i64::MAX,
        };
        let mut out = b"x ".to_vec();
        key_fields(&k, &mut out);
        let want = format!("x {} 0 42 -1500000000 {}", u64::MAX, i64::MAX);
        assert_eq!(String::from_utf8(out).unwrap(), want);
    }

    #[test]
    fn directory_times_kept_by_the_kernel_only_on_local_file_systems() {
        assert!(trusts_identity(&std::env::temp_dir()));
        assert!(!trusts_identity(Path::new("/proc")));
        assert!(!trusts_identity(Path::new("/sys")));
        assert!(!trusts_identity(Path::new("/no/such/dir")));
    }

    /// A cache dir under `/tmp` (world-writable), below a group-writable directory or one of
    /// another user, or itself writable by others, is refused; one under a private directory
    /// of this user is not, made or not.
    #[test]
    fn cache_dirs_others_could_write_are_refused() {
        assert!(untrusted_dir(Path::new("/tmp/nvshim-cache")).is_some());
        let d = tempfile::tempdir().unwrap();
        let parent = d.path().join("p");
        std::fs::create_dir(&parent).unwrap();
        let cache = parent.join("cache");
        let mode = |p: &Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
        };
        mode(&parent, 0o755);
        assert_eq!(untrusted_dir(&cache), None);
        std::fs::create_dir(&cache).unwrap();
        assert_eq!(untrusted_dir(&cache), None);
        mode(&cache, 0o777);
        assert!(untrusted_dir(&cache).is_some());
        mode(&cache, 0o700);
        mode(&parent, 0o775);
        let why = untrusted_dir(&cache).unwrap();
        assert!(
            why.contains(&parent.display().to_string()) && why.contains("775"),
            "{why}"
        );
        if nix::unistd::geteuid().is_root() {
            mode(&parent, 0o755);
            std::os::unix::fs::chown(&parent, Some(65534), None).unwrap();
            assert!(untrusted_dir(&cache).is_some());
        }
    }
}
