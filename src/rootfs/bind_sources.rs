//! Which of a create's bind-mount sources on the host are directories, kept in `cache-dir`
//! while the directories holding them keep their keys.
//!
//! The mount check ([`super::check_added_mounts`]) asks whether any bind source is a directory:
//! only a directory can hold a mountpoint runc creates. A CDI request on NVIDIA's 8-GPU spec
//! adds 65 file binds from 15 directories, and their 65 `stat`s, each path walked from `/`,
//! cost the create 0.11 ms (a build that skipped them, 300 paired runs; docs/benchmarks.md).
//! Kept here, in one file, `<cache-dir>/bind-sources`: a `P` line per directory (its path and
//! key), then a line per source, `D` for a directory and `F` for anything else. A create
//! reads it, `stat`s each directory its sources are in once, and `lstat`s only the sources
//! the file does not vouch for; what those teach is merged in (the file is written again),
//! up to [`MAX_ENTRIES`] sources.
//!
//! Why a kept kind cannot be stale: a source that is not a symlink is an entry of its
//! directory, and making, removing, renaming or replacing an entry changes the directory's
//! mtime and ctime; another directory through the same path (replaced, moved, a symlink on the
//! way pointed elsewhere, mounted over) gives another device or inode. A mount on the source
//! itself cannot change its kind (the kernel mounts a directory only on a directory, a file
//! only on a file). A symlink's target can change anywhere, so a symlink is asked every time,
//! as is a source on a file system whose directory times the kernel does not keep itself
//! (`/proc`, `/sys`, NFS and FUSE, whose attributes may be cached or made up:
//! [`cache::keeps_dir_times`]). The directories' keys are taken before and after the sources'
//! `lstat`s, and what was learnt is kept only when they agree and every ctime is more than
//! [`cache::RACY_NS`] old (`src/cache.rs`).

use std::borrow::Cow;
use std::path::Path;

use foldhash::HashMapExt as _;
use nix::sys::stat::{lstat, SFlag};

use crate::cache::{self, Key};

const MAGIC: &[u8] = b"nvshim-bind-sources 1\n";

/// Sources kept at most: past it, the file starts again from what the current create learnt
/// (a node whose claims each bring a file of their own would otherwise grow it forever).
const MAX_ENTRIES: usize = 4096;

/// For each of `sources`, whether it is a directory, where that is known without a `stat` of
/// its own (`None`: not known, for the caller to ask; so are a symlink, a missing source and
/// one written with `.`, `..` or an empty part): from `cache_dir` when kept there and its
/// directory keeps its key, else by `lstat` (then kept when the keys are old enough). `read_at`
/// is now, in ns since the epoch.
pub fn kinds(sources: &[&str], cache_dir: Option<&Path>, read_at: i64) -> Vec<Option<bool>> {
    let Some(cache_dir) = cache_dir else {
        return sources.iter().map(|s| looked_up(s)).collect();
    };
    let file = cache_dir.join("bind-sources");
    let bytes = cache::read_private(&file, "bind-source cache");
    let mut kept = bytes.as_deref().and_then(decode).unwrap_or_default();
    // Each directory asked about, `stat`ed once: its key now, and whether it is the kept one
    // (compared as text: only the directories asked about are formatted, none parsed).
    let mut now: foldhash::HashMap<&str, (Option<Key>, bool)> = Default::default();
    let mut key_text = Vec::with_capacity(64);
    let mut learnt: Vec<(&str, bool)> = Vec::new();
    let mut out = Vec::with_capacity(sources.len());
    for &source in sources {
        let Some(dir) = keepable_dir(source) else {
            out.push(None);
            continue;
        };
        let (_, valid) = *now.entry(dir).or_insert_with(|| {
            let key = Key::at(Path::new(dir));
            let valid = key.is_some_and(|k| {
                key_text.clear();
                cache::key_fields(&k, &mut key_text);
                kept.parents
                    .get(dir)
                    .is_some_and(|kept| **kept == key_text[..])
            });
            (key, valid)
        });
        match kept.entries.get(source).filter(|_| valid) {
            Some(&is_dir) => out.push(Some(is_dir)),
            None => {
                let found = looked_up(source);
                if let Some(is_dir) = found {
                    learnt.push((source, is_dir));
                }
                out.push(found);
            }
        }
    }
    if learnt.is_empty() {
        return out;
    }
    // Kept only when each directory learnt in gives the same old key after the `lstat`s, on a
    // file system whose directory times the kernel keeps.
    let mut dirs: Vec<&str> = learnt.iter().filter_map(|(s, _)| keepable_dir(s)).collect();
    dirs.sort_unstable();
    dirs.dedup();
    let holds = |dir: &&str| {
        let before = now.get(dir).and_then(|(key, _)| *key);
        before.is_some_and(|k| k.trusted_at(read_at))
            && Key::at(Path::new(dir)) == before
            && cache::keeps_dir_times(Path::new(dir))
    };
    if !dirs.iter().all(holds) {
        return out;
    }
    // A directory with a new key loses what was kept of it; past the bound, the file starts
    // again from what this create learnt.
    if kept.entries.len() + learnt.len() > MAX_ENTRIES {
        kept = Kept::default();
    }
    for dir in &dirs {
        let Some(key) = now.get(dir).and_then(|(key, _)| *key) else {
            continue;
        };
        key_text.clear();
        cache::key_fields(&key, &mut key_text);
        if kept.parents.get(dir).map(|kept| &kept[..]) != Some(&key_text[..]) {
            kept.entries.retain(|s, _| keepable_dir(s) != Some(dir));
            kept.parents.insert(dir, Cow::Owned(key_text.clone()));
        }
    }
    // Sources whose directory has no line (a damaged merge) are not written.
    kept.entries
        .retain(|s, _| keepable_dir(s).is_some_and(|d| kept.parents.contains_key(d)));
    for (source, is_dir) in learnt {
        kept.entries.insert(source, is_dir);
    }
    if let Some(body) = encode(&kept) {
        if let Err(e) = cache::write_private(cache_dir, &file, &body) {
            tracing::debug!("bind-source cache {} not written: {e}", file.display());
        }
    }
    out
}

/// Whether `path` is a directory, by `lstat`; `None` for a symlink (its target can change
/// anywhere) or a path that cannot be `lstat`ed.
fn looked_up(path: &str) -> Option<bool> {
    let st = lstat(path).ok()?;
    match SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT {
        SFlag::S_IFLNK => None,
        kind => Some(kind == SFlag::S_IFDIR),
    }
}

/// The directory of an absolute source written without `.`, `..` or empty parts (what the
/// directory's key can vouch for: [`crate::edits::is_clean`]); `None` for another, and for `/`.
fn keepable_dir(source: &str) -> Option<&str> {
    if source.len() < 2 || !source.starts_with('/') || !crate::edits::is_clean(source) {
        return None;
    }
    // By byte (memchr's `memrchr`): `rsplit_once('/')` went through `str`'s char searcher, a
    // tenth of this cache's instructions on a CDI create.
    let dir = source.get(..nvshim_hook::bytes::rfind(b'/', source.as_bytes())?)?;
    Some(if dir.is_empty() { "/" } else { dir })
}

/// What the file holds: each directory's key (as [`cache::key_fields`] writes it), and each
/// source's kind (a directory or not).
#[derive(Default)]
struct Kept<'a> {
    parents: foldhash::HashMap<&'a str, Cow<'a, [u8]>>,
    entries: foldhash::HashMap<&'a str, bool>,
}

/// A `P` line per directory with its key, then a line per source, `D` for a directory and `F`
/// for anything else, each sorted; `None` when a path holds a tab or newline.
fn encode(kept: &Kept) -> Option<Vec<u8>> {
    let mut body = MAGIC.to_vec();
    let mut parents: Vec<(&&str, &Cow<[u8]>)> = kept.parents.iter().collect();
    parents.sort_unstable_by_key(|(dir, _)| **dir);
    for (dir, key) in parents {
        cache::line(&mut body, &[b"P", dir.as_bytes(), key])?;
    }
    let mut entries: Vec<(&&str, &bool)> = kept.entries.iter().collect();
    entries.sort_unstable();
    for (source, is_dir) in entries {
        let kind: &[u8] = if *is_dir { b"D" } else { b"F" };
        cache::line(&mut body, &[kind, source.as_bytes()])?;
    }
    Some(cache::seal(body))
}

/// The kept directories and sources when the file is whole. A source counts only with its
/// directory's line, which [`kinds`] looks up anyway.
/// Keys are kept as their text and parsed never: a create compares the few directories it
/// asks about as text. Tags and fields are split by byte and the maps sized up front (the
/// `str` splits, the keys' parsing and the maps' growth were 0.07 M of the 0.25 M
/// instructions this took on a CDI create with 88 lines kept, callgrind).
fn decode(bytes: &[u8]) -> Option<Kept<'_>> {
    let body = cache::unseal(bytes)?.strip_prefix(MAGIC)?;
    let body = std::str::from_utf8(body).ok()?;
    let lines = nvshim_hook::bytes::positions(b'\n', body.as_bytes()).count();
    let mut kept = Kept {
        parents: foldhash::HashMap::with_capacity(lines.min(64)),
        entries: foldhash::HashMap::with_capacity(lines),
    };
    for line in cache::lines(body) {
        // `<tag>\t<rest>`: the tag is one ASCII byte, so `rest` starts on a `str` boundary.
        let (tag, rest) = match line.as_bytes() {
            [tag, b'\t', ..] => (*tag, line.get(2..)?),
            _ => return None,
        };
        match tag {
            b'P' => {
                let [dir, key] = cache::fields(rest, b'\t')?;
                kept.parents.insert(dir, Cow::Borrowed(key.as_bytes()));
            }
            b'D' => {
                kept.entries.insert(rest, true);
            }
            b'F' => {
                kept.entries.insert(rest, false);
            }
            _ => return None,
        }
    }
    Some(kept)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::RACY_NS;
    use std::fs;
    use std::os::unix::fs::{symlink, MetadataExt};

    /// Timestamps tick with the kernel's clock: a change made in the tick the answer was kept
    /// in would not show (a real answer is kept only when its keys are 2 s old).
    fn next_tick() {
        std::thread::sleep(std::time::Duration::from_millis(25));
    }

    /// The answer through the cache at `at`, and whether the cache file was left as it was.
    fn asked(sources: &[&str], cache_dir: &Path, at: i64) -> (Vec<Option<bool>>, bool) {
        // A file written again is renamed in: another inode.
        let file = || {
            fs::metadata(cache_dir.join("bind-sources"))
                .ok()
                .map(|m| m.ino())
        };
        let before = file();
        let got = kinds(sources, Some(cache_dir), at);
        (got, before.is_some() && file() == before)
    }

    /// What a look-up says now (a source written with `..` is left to the caller).
    fn truth(sources: &[&str]) -> Vec<Option<bool>> {
        sources
            .iter()
            .map(|s| looked_up(s).filter(|_| !s.contains("..")))
            .collect()
    }

    /// The property the cache rests on: after any change to a source (removed, made a
    /// directory, a symlink to one, put back) or to a directory on the way (replaced by a
    /// symlink to another), a create gets what `lstat` says then, and the answer is kept.
    #[test]
    fn every_change_to_a_source_or_its_directories_is_seen() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("host");
        let lib = root.join("usr/lib");
        fs::create_dir_all(&lib).unwrap();
        fs::create_dir_all(root.join("run/mps")).unwrap();
        fs::write(lib.join("libcuda.so.1"), b"elf").unwrap();
        fs::write(lib.join("libnvidia-ml.so.1"), b"elf").unwrap();
        symlink("libcuda.so.1", lib.join("libcuda.so")).unwrap();
        let cache_dir = tmp.path().join("cache");
        let s = |p: &str| root.join(p).to_str().unwrap().to_string();
        let sources = [
            s("usr/lib/libcuda.so.1"),
            s("usr/lib/libnvidia-ml.so.1"),
            s("usr/lib/libcuda.so"),
            s("run/mps"),
            s("usr/lib/missing"),
            s("usr/lib/../lib/libcuda.so.1"),
        ];
        let sources: Vec<&str> = sources.iter().map(String::as_str).collect();
        let later = cache::now_ns() + 10 * RACY_NS;
        let check = |what: &str| {
            let (got, _) = asked(&sources, &cache_dir, later);
            assert_eq!(got, truth(&sources), "{what}");
            let (again, untouched) = asked(&sources, &cache_dir, later);
            assert_eq!(again, got, "{what}");
            assert!(untouched, "{what}: not kept");
        };
        check("first");
        assert_eq!(
            truth(&sources),
            [Some(false), Some(false), None, Some(true), None, None]
        );
        let ml = lib.join("libnvidia-ml.so.1");
        next_tick();
        fs::remove_file(&ml).unwrap();
        check("a source removed");
        next_tick();
        fs::create_dir(&ml).unwrap();
        check("a source made a directory");
        next_tick();
        fs::remove_dir(&ml).unwrap();
        symlink("../../run/mps", &ml).unwrap();
        check("a source made a symlink to a directory");
        next_tick();
        fs::remove_file(&ml).unwrap();
        fs::write(&ml, b"elf").unwrap();
        check("a source put back");
        next_tick();
        fs::remove_dir(root.join("run/mps")).unwrap();
        fs::write(root.join("run/mps"), b"").unwrap();
        check("a directory source made a file");
        // usr/lib replaced by a symlink to a directory where libcuda.so.1 is a directory.
        next_tick();
        let other = root.join("other");
        fs::create_dir_all(other.join("libcuda.so.1")).unwrap();
        fs::write(other.join("libnvidia-ml.so.1"), b"elf").unwrap();
        fs::rename(&lib, root.join("usr/lib.old")).unwrap();
        symlink("../other", &lib).unwrap();
        check("a directory on the way pointed elsewhere");
        assert_eq!(kinds(&sources, Some(&cache_dir), later)[0], Some(true));
    }

    #[test]
    fn only_plain_absolute_sources_are_vouched_for() {
        assert_eq!(keepable_dir("/usr/lib/libcuda.so.1"), Some("/usr/lib"));
        assert_eq!(keepable_dir("/socket"), Some("/"));
        assert_eq!(keepable_dir("/a/.hidden/..x"), Some("/a/.hidden"));
        for bad in [
            "", "/", "rel/x", "/a//b", "/a/./b", "/a/../b", "/a/b/", "/a/.", "/a/..", "//a",
        ] {
            assert_eq!(keepable_dir(bad), None, "{bad}");
        }
    }

    #[test]
    fn kept_only_when_old_and_whole_merged_and_bounded() {
        let tmp = tempfile::tempdir().unwrap();
        let lib = tmp.path().join("lib");
        fs::create_dir_all(&lib).unwrap();
        let names: Vec<String> = (0..MAX_ENTRIES + 1)
            .map(|i| {
                let p = lib.join(format!("lib{i}.so"));
                fs::write(&p, b"elf").unwrap();
                p.to_str().unwrap().to_string()
            })
            .collect();
        let (a, b, c) = (names[0].as_str(), names[1].as_str(), names[2].as_str());
        let cache_dir = tmp.path().join("cache");
        let file = cache_dir.join("bind-sources");
        // Just made: answered, not kept.
        let known = Some(false);
        assert_eq!(
            kinds(&[a, b], Some(&cache_dir), cache::now_ns()),
            [known; 2]
        );
        assert!(!cache_dir.exists());
        let later = cache::now_ns() + 10 * RACY_NS;
        assert_eq!(asked(&[a, b], &cache_dir, later), (vec![known; 2], false));
        assert_eq!(asked(&[b, a], &cache_dir, later), (vec![known; 2], true));
        // Another create's sources are merged in; then each answers from the file.
        assert_eq!(asked(&[c, a], &cache_dir, later), (vec![known; 2], false));
        assert_eq!(asked(&[a, b, c], &cache_dir, later), (vec![known; 3], true));
        assert_eq!(asked(&[c], &cache_dir, later), (vec![known], true));
        // Damaged: asked again, and kept anew.
        let kept = fs::read(&file).unwrap();
        let mut bad = kept.clone();
        bad[MAGIC.len() + 3] ^= 1;
        fs::write(&file, &bad).unwrap();
        assert_eq!(
            asked(&[a, b, c], &cache_dir, later),
            (vec![known; 3], false)
        );
        assert_eq!(fs::read(&file).unwrap(), kept);
        // Past the bound, what was kept before gives way to what this create learnt.
        let rest: Vec<&str> = names[3..].iter().map(String::as_str).collect();
        assert!(rest.len() + 3 > MAX_ENTRIES);
        assert!(!asked(&rest, &cache_dir, later).1);
        assert_eq!(asked(&rest[..2], &cache_dir, later), (vec![known; 2], true));
        assert_eq!(asked(&[a], &cache_dir, later), (vec![known], false));
        // No cache dir: looked up every time.
        assert_eq!(
            kinds(&[a, lib.to_str().unwrap(), "/no/such"], None, later),
            [known, Some(true), None]
        );
    }
}
