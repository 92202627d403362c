//! The GPUs as their `/proc/driver/nvidia/gpus/<bus>/information` files describe them, kept
//! under `cache-dir` between creates. On the lent H200 (driver 580.159.04, the open kernel
//! modules) reading one `information` file took 194 µs (median of 50; the driver asks the GPU
//! for what it prints), where `version` took 10 µs: a legacy create on an 8-GPU node read about
//! 1.5 ms of facts that do not change while the driver has the GPU. (The minors of MIG
//! capabilities are kept the same way, from the driver's table: `mig_table.rs`.)
//!
//! The cache answers only when `/proc/driver/nvidia/gpus` lists the same directories and each
//! `information` file's fresh `stat` gives the [`Key`] it was cached with, a key more than
//! [`RACY_NS`] old when it was cached (`src/cache.rs`). procfs stamps an inode with the clock
//! when it makes it, and makes a new one when the driver creates the file again (the driver
//! reloaded, a GPU removed and added back), so such a file cannot show an old key; a file of
//! a simulated host rewritten in place shows a new size or mtime. Anything else, a missing,
//! damaged or foreign cache file or an unwritable `cache-dir`, reads the files as before.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::{parse_information, read, Gpu, HostError};
use crate::cache::{self, Key};

const MAGIC: &[u8] = b"nvshim-gpus 1\n";

/// The GPUs under `gpus_dir` (`<proc-root>/driver/nvidia/gpus`), sorted by bus id and indexed,
/// through the cache in `cache_dir` when there is one (module doc); `read_at` is now, in ns
/// since the epoch.
pub(super) fn gpus(
    gpus_dir: &Path,
    cache_dir: Option<&Path>,
    read_at: i64,
) -> Result<Vec<Gpu>, HostError> {
    let mut names: Vec<PathBuf> = match nvshim_hook::root::list_dir(gpus_dir) {
        Ok(entries) => entries
            .into_iter()
            .map(|e| PathBuf::from(OsStr::from_bytes(&e.name)))
            .collect(),
        // No GPU directory: the driver is loaded but sees no GPU (or is not loaded; the
        // version file says which).
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(HostError::Read {
                path: gpus_dir.to_path_buf(),
                source,
            })
        }
    };
    names.sort();
    let info = |name: &Path| gpus_dir.join(name).join("information");
    let key = |name: &Path| Key::at(&info(name));
    let keys: Vec<Option<Key>> = match cache_dir {
        Some(_) => names.iter().map(|n| key(n)).collect(),
        None => vec![None; names.len()],
    };
    let file = cache_dir.map(|dir| {
        let h = cache::hash(gpus_dir.as_os_str().as_bytes());
        (dir, dir.join(format!("gpus-{h:016x}")))
    });
    let cached = file
        .as_ref()
        .and_then(|(_, f)| cache::read_private(f, "GPU cache"));
    if let Some(gpus) = cached.as_deref().and_then(|b| decode(b, &names, &keys)) {
        return Ok(gpus);
    }
    let mut gpus = Vec::with_capacity(names.len());
    let mut entries = Vec::with_capacity(names.len());
    for (name, before) in names.iter().zip(&keys) {
        let path = info(name);
        let gpu = parse_information(&path, &read(&path)?)?;
        // Kept only when the file is the one stat'ed before it was read, and old enough.
        let trusted = before
            .filter(|k| k.trusted_at(read_at) && key(name) == Some(*k))
            .map(|k| (name.as_os_str(), k));
        entries.push(trusted);
        gpus.push(gpu);
    }
    gpus.sort_by(|a, b| a.bus_id.cmp(&b.bus_id));
    for (i, g) in gpus.iter_mut().enumerate() {
        g.index = i;
    }
    let whole: Option<Vec<(&OsStr, Key)>> = entries.into_iter().collect();
    if let (Some((dir, file)), Some(body)) = (file, whole.and_then(|e| encode(&e, &gpus))) {
        if let Err(e) = cache::write_private(dir, &file, &body) {
            tracing::debug!("GPU cache {} not written: {e}", file.display());
        }
    }
    Ok(gpus)
}

/// The directory names with their files' keys, then the GPUs, a line each: tab-separated
/// fields, none of which may hold a tab or newline (`None` then: nothing is cached).
fn encode(entries: &[(&OsStr, Key)], gpus: &[Gpu]) -> Option<Vec<u8>> {
    let mut out = MAGIC.to_vec();
    for (name, k) in entries {
        let mut key = Vec::new();
        cache::key_fields(k, &mut key);
        cache::line(&mut out, &[b"D", name.as_bytes(), &key])?;
    }
    for g in gpus {
        let minor = g.minor.to_string();
        let fields: [&[u8]; 5] = [
            b"G",
            minor.as_bytes(),
            g.uuid.as_bytes(),
            g.bus_id.as_bytes(),
            g.model.as_bytes(),
        ];
        cache::line(&mut out, &fields)?;
    }
    Some(cache::seal(out))
}

/// The cached GPUs when the cache is whole and describes `names` with `keys` exactly.
fn decode(bytes: &[u8], names: &[PathBuf], keys: &[Option<Key>]) -> Option<Vec<Gpu>> {
    let body = std::str::from_utf8(cache::unseal(bytes)?.strip_prefix(MAGIC)?).ok()?;
    let mut dirs = 0;
    let mut gpus = Vec::new();
    for line in cache::lines(body) {
        if let Some(["D", name, key]) = cache::fields(line, b'\t') {
            let expected = keys.get(dirs).copied().flatten()?;
            let mut fresh = Vec::new();
            cache::key_fields(&expected, &mut fresh);
            if names.get(dirs)?.as_os_str().as_bytes() != name.as_bytes() || fresh != key.as_bytes()
            {
                return None;
            }
            dirs += 1;
        } else {
            let ["G", minor, uuid, bus_id, model] = cache::fields(line, b'\t')? else {
                return None;
            };
            gpus.push(Gpu {
                index: gpus.len(),
                minor: minor.parse().ok()?,
                uuid: uuid.to_string(),
                bus_id: bus_id.to_string(),
                model: model.to_string(),
            });
        }
    }
    (dirs == names.len() && gpus.len() == names.len()).then_some(gpus)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::RACY_NS;
    use std::fs;

    fn information(minor: u32, bus: &str) -> String {
        format!(
            "Model: \t\t NVIDIA H200\nIRQ:   \t\t 41\nGPU UUID: \t GPU-{minor:08x}-4547-98fe-b221-25fc993f041f\n\
             Bus Location: \t {bus}\nDevice Minor: \t {minor}\nGPU Excluded:\t No\n"
        )
    }

    struct Proc {
        _tmp: tempfile::TempDir,
        gpus: PathBuf,
        cache: PathBuf,
    }

    impl Proc {
        fn new() -> Proc {
            let tmp = tempfile::tempdir().unwrap();
            let gpus = tmp.path().join("driver/nvidia/gpus");
            let cache = tmp.path().join("run/nvshim");
            Proc {
                _tmp: tmp,
                gpus,
                cache,
            }
        }

        fn add(&self, minor: u32, bus: &str) {
            fs::create_dir_all(self.gpus.join(bus)).unwrap();
            fs::write(
                self.gpus.join(bus).join("information"),
                information(minor, bus),
            )
            .unwrap();
        }

        /// The one file the cache dir holds.
        fn cache_file(&self) -> PathBuf {
            let mut files = fs::read_dir(&self.cache).unwrap();
            files.next().unwrap().unwrap().path()
        }

        /// The GPUs as read at `at`: (index, minor, bus id).
        fn gpus(&self, at: i64) -> Vec<(usize, u32, String)> {
            gpus(&self.gpus, Some(&self.cache), at)
                .unwrap()
                .into_iter()
                .map(|g| (g.index, g.minor, g.bus_id))
                .collect()
        }
    }

    fn later() -> i64 {
        cache::now_ns() + 10 * RACY_NS
    }

    #[test]
    fn cached_while_the_files_are_the_same_and_read_again_when_they_are_not() {
        let p = Proc::new();
        p.add(1, "0000:3b:00.0");
        p.add(0, "0000:1b:00.0");
        let expected = vec![
            (0, 0, "0000:1b:00.0".to_string()),
            (1, 1, "0000:3b:00.0".to_string()),
        ];
        // Young files are read and not cached.
        assert_eq!(p.gpus(cache::now_ns()), expected);
        assert!(!p.cache.exists());
        assert_eq!(p.gpus(later()), expected);
        assert!(p.cache.exists());
        // What a create checks before it takes the cache's answer: the same names and keys.
        let file = p.cache_file();
        let names = [PathBuf::from("0000:1b:00.0"), PathBuf::from("0000:3b:00.0")];
        let keys: Vec<Option<Key>> = names
            .iter()
            .map(|n| {
                Some(Key::of(
                    &fs::metadata(p.gpus.join(n).join("information")).unwrap(),
                ))
            })
            .collect();
        let hit = decode(&fs::read(&file).unwrap(), &names, &keys).unwrap();
        assert_eq!(hit.len(), 2);
        // An information file written again (a simulated host's: procfs makes a new one)
        // has a new key: read again.
        fs::write(
            p.gpus.join("0000:1b:00.0/information"),
            information(7, "0000:1b:00.0"),
        )
        .unwrap();
        assert_eq!(p.gpus(later())[0].1, 7);
        // A cache without the file's key does not answer; a gone cache dir is no error.
        assert_eq!(
            decode(&fs::read(&file).unwrap(), &names, &[None, keys[1]]),
            None
        );
        // A GPU added, then removed: read again each time.
        p.add(2, "0000:5b:00.0");
        assert_eq!(p.gpus(later()).len(), 3);
        fs::remove_dir_all(p.gpus.join("0000:5b:00.0")).unwrap();
        assert_eq!(p.gpus(later()).len(), 2);
        // No GPU directory: no GPU.
        fs::remove_dir_all(&p.gpus).unwrap();
        assert!(p.gpus(later()).is_empty());
    }

    #[test]
    fn a_damaged_or_foreign_cache_is_not_used() {
        let p = Proc::new();
        p.add(0, "0000:1b:00.0");
        p.gpus(later());
        let file = p.cache_file();
        let good = fs::read(&file).unwrap();
        for bad in [&good[..good.len() - 1], b"", &good[1..]] {
            fs::write(&file, bad).unwrap();
            assert_eq!(p.gpus(later())[0].1, 0);
            assert_eq!(fs::read(&file).unwrap(), good, "rewritten whole");
        }
        // A cache of other directories (another proc root's, a GPU since replaced) is refused.
        let entries = [(OsStr::new("0000:1b:00.0"), Key::ZERO)];
        let gpus = gpus(&p.gpus, Some(&p.cache), later()).unwrap();
        let other = encode(&entries, &gpus).unwrap();
        let names = [PathBuf::from("0000:1b:00.0")];
        assert_eq!(
            decode(&other, &names, &[Some(Key::ZERO)]),
            Some(gpus.clone())
        );
        assert_eq!(decode(&other, &names, &[None]), None);
        assert_eq!(
            decode(&other, &[PathBuf::from("0000:2b:00.0")], &[Some(Key::ZERO)]),
            None
        );
        // A model with a tab is not cached.
        let mut odd = gpus[0].clone();
        odd.model = "a\tb".into();
        assert_eq!(encode(&entries, &[odd]), None);
    }
}
