//! The driver's entries of the host's ld.so.cache
//! ([`Host::ld_cache_of`](super::Host::ld_cache_of)), kept in `cache-dir` (`ldcache-<hash>`)
//! between creates. A real node's cache has about 500
//! entries (520 on the lent H200, tests/fixtures/host) and a legacy create wants the driver's few
//! dozen: reading them out of the whole cache took 0.24 M of a legacy create's 1.9 M
//! instructions (callgrind, the bench's 478-entry cache), reading them from here about 0.05 M.
//!
//! The entries are used only while `etc/ld.so.cache` gives the [`Key`] they were kept with, a
//! key more than [`cache::RACY_NS`] old when they were (`src/cache.rs`): `ldconfig` writes a new
//! cache to a temporary file and renames it over the old one, so a new cache is a new inode.
//! They are kept per set of stems (a create's capabilities choose which libraries it wants).
//! A driver root without an ld.so.cache is scanned every time, as before.

use std::path::Path;

use nvshim_hook::ldcache::{Entry, LdCache, LdCacheError};

use crate::cache::{self, Key};

const MAGIC: &[u8] = b"nvshim-ldcache 1\n";

/// The entries of the ld.so.cache at `path` for `stems` (sorted, as the caller keeps them),
/// from `cache_dir` when kept there with the file's current key, else from `parse` of the
/// file's bytes (then kept when the key is old enough). `None` when `path` cannot be `stat`ed:
/// the caller reads it its own way. `read_at` is now, in ns since the epoch.
pub(super) fn entries_of(
    path: &Path,
    stems: &[&str],
    cache_dir: &Path,
    read_at: i64,
    parse: impl FnOnce(&[u8]) -> Result<LdCache, LdCacheError>,
) -> Option<std::io::Result<Result<LdCache, LdCacheError>>> {
    use std::os::unix::ffi::OsStrExt;
    let key = Key::at(path)?;
    let mut key_text = Vec::with_capacity(64);
    cache::key_fields(&key, &mut key_text);
    let mut name = path.as_os_str().as_bytes().to_vec();
    for stem in stems {
        name.push(0);
        name.extend_from_slice(stem.as_bytes());
    }
    let file = cache_dir.join(format!("ldcache-{:016x}", cache::hash(&name)));
    let bytes = cache::read_private(&file, "ld.so.cache entries");
    if let Some(hit) = bytes.as_deref().and_then(|b| decode(b, &key_text, stems)) {
        return Some(Ok(Ok(hit)));
    }
    let bytes = match crate::hostfile::read(path, super::LD_CACHE_LIMIT) {
        Ok(bytes) => bytes,
        Err(e) => return Some(Err(e)),
    };
    let parsed = parse(&bytes);
    let same = Key::at(path) == Some(key);
    if let Ok(entries) = &parsed {
        if same && key.trusted_at(read_at) {
            if let Some(body) = encode(&key_text, stems, entries) {
                if let Err(e) = cache::write_private(cache_dir, &file, &body) {
                    tracing::debug!("ld.so.cache entries {} not written: {e}", file.display());
                }
            }
        }
    }
    Some(Ok(parsed))
}

/// `K\t<key>`, `S\t<stems...>`, `X\t<generator>`, an `H\t<name>` line per `glibc-hwcaps` name,
/// then an `E` line per entry (flags, name, path, OS version, hwcap), sealed; `None` when a
/// field holds a tab or newline.
fn encode(key_text: &[u8], stems: &[&str], cache: &LdCache) -> Option<Vec<u8>> {
    let mut body = MAGIC.to_vec();
    cache::line(&mut body, &[b"K", key_text])?;
    let mut fields: Vec<&[u8]> = vec![b"S"];
    fields.extend(stems.iter().map(|s| s.as_bytes()));
    cache::line(&mut body, &fields)?;
    let generator = cache::optional_field(cache.generator.as_deref());
    cache::line(&mut body, &[b"X", &generator])?;
    for name in &cache.hwcaps {
        cache::line(&mut body, &[b"H", name.as_bytes()])?;
    }
    for e in &cache.entries {
        let numbers = [
            e.flags.to_string(),
            e.os_version.to_string(),
            e.hwcap.to_string(),
        ];
        let line: [&[u8]; 6] = [
            b"E",
            numbers[0].as_bytes(),
            e.name.as_bytes(),
            e.path.as_bytes(),
            numbers[1].as_bytes(),
            numbers[2].as_bytes(),
        ];
        cache::line(&mut body, &line)?;
    }
    Some(cache::seal(body))
}

/// The kept entries when the file is whole and was written for `key_text` and `stems`.
fn decode(bytes: &[u8], key_text: &[u8], stems: &[&str]) -> Option<LdCache> {
    let body = std::str::from_utf8(cache::unseal(bytes)?.strip_prefix(MAGIC)?).ok()?;
    let mut lines = cache::lines(body);
    if lines.next()?.strip_prefix("K\t")?.as_bytes() != key_text {
        return None;
    }
    let written: Vec<&str> = lines.next()?.split('\t').collect();
    if written.first() != Some(&"S") || written[1..] != *stems {
        return None;
    }
    let generator = cache::parse_optional_field(lines.next()?.strip_prefix("X\t")?)?;
    let mut out = LdCache {
        entries: Vec::new(),
        generator,
        hwcaps: Vec::new(),
    };
    for line in lines {
        if let Some(name) = line.strip_prefix("H\t") {
            out.hwcaps.push(name.to_string());
            continue;
        }
        let ["E", flags, name, path, os_version, hwcap] = cache::fields(line, b'\t')? else {
            return None;
        };
        out.entries.push(Entry {
            flags: flags.parse().ok()?,
            name: name.to_string(),
            path: path.to_string(),
            os_version: os_version.parse().ok()?,
            hwcap: hwcap.parse().ok()?,
        });
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::RACY_NS;
    use crate::host::tests::ld_so_cache_of as ld_so_cache;
    use std::cell::Cell;
    use std::fs;

    /// Writes `path` as a new file, as ldconfig does (a temporary file renamed over it).
    fn replace(path: &Path, bytes: &[u8]) {
        let new = path.with_extension("new");
        fs::write(&new, bytes).unwrap();
        fs::rename(&new, path).unwrap();
    }

    #[test]
    fn kept_while_the_cache_keeps_its_key_per_set_of_stems() {
        let tmp = tempfile::tempdir().unwrap();
        let (path, dir) = (tmp.path().join("ld.so.cache"), tmp.path().join("cache"));
        replace(
            &path,
            &ld_so_cache(&["libcuda.so.1", "libz.so.1", "libnvidia-ml.so.1"]),
        );
        let parses = Cell::new(0);
        let read = |stems: &[&str], at: i64| {
            let keep = |name: &[u8]| stems.iter().any(|s| name.starts_with(s.as_bytes()));
            let cache = entries_of(&path, stems, &dir, at, |bytes| {
                parses.set(parses.get() + 1);
                LdCache::parse_only(bytes, keep)
            })
            .unwrap()
            .unwrap()
            .unwrap();
            let names: Vec<String> = cache.entries.into_iter().map(|e| e.name).collect();
            (names, parses.replace(0))
        };
        let later = cache::now_ns() + 10 * RACY_NS;
        let cuda = ["libcuda"];
        // A young cache: parsed, not kept.
        assert_eq!(
            read(&cuda, cache::now_ns()),
            (vec!["libcuda.so.1".into()], 1)
        );
        assert!(!dir.exists());
        assert_eq!(read(&cuda, later), (vec!["libcuda.so.1".into()], 1));
        assert_eq!(read(&cuda, later), (vec!["libcuda.so.1".into()], 0));
        // Other stems: their own entries.
        let both = ["libcuda", "libnvidia-ml"];
        let want: Vec<String> = vec!["libcuda.so.1".into(), "libnvidia-ml.so.1".into()];
        assert_eq!(read(&both, later), (want.clone(), 1));
        assert_eq!(read(&both, later), (want, 0));
        // ldconfig run again: the new cache is read.
        replace(&path, &ld_so_cache(&["libcuda.so.1", "libcuda.so.2"]));
        let two = vec!["libcuda.so.1".to_string(), "libcuda.so.2".into()];
        assert_eq!(read(&cuda, later), (two.clone(), 1));
        assert_eq!(read(&cuda, later), (two, 0));
        // What was kept reads back whole (the generator too); a damaged file is not used.
        let whole = LdCache::parse_only(&fs::read(&path).unwrap(), |_| true).unwrap();
        let key = Key::of(&fs::metadata(&path).unwrap());
        let mut key_text = Vec::new();
        cache::key_fields(&key, &mut key_text);
        let kept = encode(&key_text, &cuda, &whole).unwrap();
        let back = decode(&kept, &key_text, &cuda).unwrap();
        assert_eq!(back.entries, whole.entries);
        assert_eq!(back.generator, whole.generator);
        assert_eq!(back.hwcaps, whole.hwcaps);
        assert!(decode(&kept, &key_text, &both).is_none());
        assert!(decode(&kept[1..], &key_text, &cuda).is_none());
        assert!(decode(&kept, b"1 2 3 4 5", &cuda).is_none());
        // No file to stat: the caller reads it its own way.
        let gone = tmp.path().join("none");
        assert!(entries_of(&gone, &cuda, &dir, later, |_| unreachable!()).is_none());
    }
}
