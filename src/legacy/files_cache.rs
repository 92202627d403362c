//! The driver's files a create mounts ([`super::driver_files`] but the daemons' sockets and
//! the DRM nodes, looked at every time), kept in `cache-dir` (`driver-files-<hash>`, one file
//! per driver root and set of capabilities) between creates. Looking them up through the driver root was 372,000 of a legacy create's
//! 1.72 M instructions and 60-odd of its `stat` and `readlink` calls (callgrind and strace,
//! the bench's 8-GPU host: one per library, its SONAME link and its development link, per
//! binary and search directory, per data file and firmware directory). A hit costs a
//! `stat` per directory the look-up read (17 there) and the decoding of the lines below.
//!
//! An answer depends on, and is kept with:
//! - nvshim's own build (its build ID, `crate::install::build_id`): `crate::nvidia`'s tables
//!   say what to look for;
//! - the driver version, the capabilities, the kernel release (firmware directories) and the
//!   driver root;
//! - the key of the driver root's `etc/ld.so.cache`, which names the libraries (`ldconfig`
//!   writes a new cache and renames it in: a new inode);
//! - the key of every directory a look-up read an entry of ([`Host::record_lookups`]): a file
//!   made, removed, renamed or replaced there, a symlink made anew, changes the directory's
//!   mtime and ctime; a directory replaced, moved or mounted over gives another inode or device
//!   through the same path. A missing directory is kept as missing, with its parents up to the
//!   first that exists (where it would appear).
//!
//! Nothing in the answer depends on a file's content or mode, which leave their directory
//! alone: only on names, types and link targets. The answer is kept only when every key's
//! ctime is more than [`cache::RACY_NS`] old (`src/cache.rs`): a change while the files were
//! looked up leaves a young ctime where it happened, and the ld.so.cache must give the same
//! key before and after; and only when every directory is on a file system whose directory
//! times the kernel keeps itself ([`cache::keeps_dir_times`]: not NFS or FUSE, whose times
//! come from a server or a daemon). Paths holding a tab or newline, or not UTF-8, are not
//! kept (looked up every time).

use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::cache::{self, Key};
use crate::edits::Mount;
use crate::host::{under_root, DriverLibrary, Host, HostFile};
use crate::nvidia::Capabilities;

use super::DriverFiles;

const MAGIC: &[u8] = b"nvshim-driver-files 1\n";

/// [`DriverFiles`] without sockets and DRM nodes for `caps`: from `cache_dir` when kept there and every
/// key still holds, else from `look_up` (then kept when the keys are old enough). `read_at` is
/// now, in ns since the epoch.
pub(super) fn files_of<E>(
    host: &Host,
    caps: &Capabilities,
    driver_version: &str,
    cache_dir: &Path,
    read_at: i64,
    look_up: impl FnOnce() -> Result<DriverFiles, E>,
) -> Result<DriverFiles, E> {
    let root = &host.roots().driver_root;
    let ld_cache = under_root(root, "/etc/ld.so.cache");
    // A driver root without an ld.so.cache is scanned by directory: not kept.
    let Some(ld_key) = Key::at(&ld_cache) else {
        return look_up();
    };
    let caps = caps.names().join(",");
    let mut name = root.as_os_str().as_bytes().to_vec();
    name.push(0);
    name.extend_from_slice(caps.as_bytes());
    let file = cache_dir.join(format!("driver-files-{:016x}", cache::hash(&name)));
    let head = head(root, &ld_key, driver_version, &caps, &host.kernel_release());
    let kept = cache::read_private(&file, "driver files");
    if let Some(hit) = head
        .as_deref()
        .zip(kept.as_deref())
        .and_then(|(head, bytes)| decode(bytes, head))
    {
        return Ok(hit);
    }
    host.record_lookups();
    let looked_up = look_up();
    let dirs = host.take_lookups();
    let files = looked_up?;
    let trusted = |k: &Key| k.trusted_at(read_at);
    if let Some(head) = head.filter(|_| Key::at(&ld_cache) == Some(ld_key) && trusted(&ld_key)) {
        let dirs = dir_keys(dirs);
        let local =
            |(dir, key): (&PathBuf, &Option<Key>)| key.is_none() || cache::keeps_dir_times(dir);
        if dirs.values().flatten().all(trusted) && dirs.iter().all(local) {
            if let Some(body) = encode(&head, &dirs, &files) {
                if let Err(e) = cache::write_private(cache_dir, &file, &body) {
                    tracing::debug!("driver files {} not written: {e}", file.display());
                }
            }
        }
    }
    Ok(files)
}

/// nvshim's build as a field: its build ID (`install::build_id`, no `/proc` look-up), else the
/// key of `/proc/self/exe` (a build linked without one).
fn build_key(out: &mut Vec<u8>) -> Option<()> {
    match crate::install::build_id() {
        Some(id) => {
            out.extend_from_slice(b"id:");
            out.extend_from_slice(id.as_bytes());
        }
        None => cache::key_fields(&Key::at(Path::new("/proc/self/exe"))?, out),
    }
    Some(())
}

/// The first line: nvshim's build, the ld.so.cache's key, the driver version, the capabilities,
/// the kernel release and the driver root; `None` when one cannot be a field (a tab, a newline,
/// not UTF-8).
fn head(
    root: &Path,
    ld_key: &Key,
    driver_version: &str,
    caps: &str,
    release: &str,
) -> Option<Vec<u8>> {
    let (mut exe_text, mut ld_text) = (Vec::new(), Vec::new());
    build_key(&mut exe_text)?;
    cache::key_fields(ld_key, &mut ld_text);
    let mut out = Vec::new();
    cache::line(
        &mut out,
        &[
            b"F",
            &exe_text,
            &ld_text,
            driver_version.as_bytes(),
            caps.as_bytes(),
            release.as_bytes(),
            // The file is read back as UTF-8: another root is looked up every time.
            root.to_str()?.as_bytes(),
        ],
    )?;
    Some(out)
}

/// Each directory noted, with its key or `None` when missing; for a missing one, its parents
/// up to the first that exists too.
fn dir_keys(dirs: Vec<PathBuf>) -> BTreeMap<PathBuf, Option<Key>> {
    let mut out = BTreeMap::new();
    for dir in dirs {
        for d in dir.ancestors() {
            if d.as_os_str().is_empty() || out.contains_key(d) {
                break;
            }
            let key = Key::at(d);
            out.insert(d.to_path_buf(), key);
            if key.is_some() {
                break;
            }
        }
    }
    out
}

/// `head`, a `D` line per directory (path, key or empty), then an `M` line per mount (host
/// path, container path, type, options...), an `L` line per library (host path, container
/// path, SONAME), a `K` line per link (target, link) and a `V` line per development link,
/// sealed; `None` when a field holds a tab or newline or is not UTF-8.
fn encode(
    head: &[u8],
    dirs: &BTreeMap<PathBuf, Option<Key>>,
    files: &DriverFiles,
) -> Option<Vec<u8>> {
    let mut body = MAGIC.to_vec();
    body.extend_from_slice(head);
    let mut key_text = Vec::with_capacity(64);
    for (dir, key) in dirs {
        key_text.clear();
        if let Some(k) = key {
            cache::key_fields(k, &mut key_text);
        }
        cache::line(&mut body, &[b"D", dir.to_str()?.as_bytes(), &key_text])?;
    }
    for m in &files.mounts {
        m.cache_line(&mut body, b"M")?;
    }
    for l in &files.libs {
        cache::line(
            &mut body,
            &[
                b"L",
                l.file.host_path.to_str()?.as_bytes(),
                l.file.container_path.as_bytes(),
                l.soname.as_bytes(),
            ],
        )?;
    }
    for (target, link) in &files.links {
        cache::line(&mut body, &[b"K", target.as_bytes(), link.as_bytes()])?;
    }
    for link in &files.dev_links {
        cache::line(&mut body, &[b"V", link.as_bytes()])?;
    }
    Some(cache::seal(body))
}

/// The kept answer when the file is whole, was written for `head`, and every directory still
/// gives the key it was kept with.
fn decode(bytes: &[u8], head: &[u8]) -> Option<DriverFiles> {
    let body = cache::unseal(bytes)?
        .strip_prefix(MAGIC)?
        .strip_prefix(head)?;
    let body = std::str::from_utf8(body).ok()?;
    let mut out = DriverFiles::default();
    for line in cache::lines(body) {
        let mut fields = cache::split(line, b'\t');
        match fields.next()? {
            "D" => {
                let [dir, key] = [fields.next()?, fields.next()?];
                let kept = match key {
                    "" => None,
                    k => Some(cache::parse_key(k)?),
                };
                if fields.next().is_some() || Key::at(Path::new(dir)) != kept {
                    return None;
                }
            }
            "M" => out.mounts.push(Mount::from_cache_fields(fields)?),
            "L" => {
                let [host_path, container_path, soname] =
                    [fields.next()?, fields.next()?, fields.next()?];
                if fields.next().is_some() {
                    return None;
                }
                out.libs.push(DriverLibrary {
                    file: HostFile {
                        host_path: PathBuf::from(host_path),
                        container_path: container_path.to_string(),
                    },
                    soname: soname.to_string(),
                });
            }
            "K" => {
                let [target, link] = [fields.next()?, fields.next()?];
                if fields.next().is_some() {
                    return None;
                }
                out.links.push((target.to_string(), link.to_string()));
            }
            "V" => {
                let link = fields.next()?;
                if fields.next().is_some() {
                    return None;
                }
                out.dev_links.push(link.to_string());
            }
            _ => return None,
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::RACY_NS;
    use std::fs;
    use std::os::unix::fs::symlink;

    const V: &str = "580.95.05";

    /// Every capability, so that every kind of look-up runs (32-bit libraries, `vdpau/` and
    /// its SONAME link, X.Org modules, data files, binaries, firmware); and the default.
    const CAPS: [&str; 2] = [
        "compute,compat32,graphics,utility,video,display",
        "compute,utility",
    ];

    fn caps(text: &str) -> Capabilities {
        Capabilities::parse(Some(text)).unwrap()
    }

    /// A new `Host` per create, as a command has (its resolved directories are its own).
    fn fresh(host: &Host) -> Host {
        Host::new(host.roots().clone())
    }

    /// The files for `caps` through the cache at `at`, and whether they were looked up.
    fn through_cache(host: &Host, caps: &Capabilities, dir: &Path, at: i64) -> (DriverFiles, bool) {
        let host = fresh(host);
        let mut looked = false;
        let files = files_of(&host, caps, V, dir, at, || {
            looked = true;
            super::super::host_files(&host, caps, V)
        })
        .unwrap();
        (files, looked)
    }

    fn looked_up(host: &Host, caps: &Capabilities) -> DriverFiles {
        super::super::host_files(&fresh(host), caps, V).unwrap()
    }

    /// Timestamps tick with the kernel's clock: a change made in the tick the answer was kept
    /// in would not show (a real answer is kept only when its keys are 2 s old).
    fn next_tick() {
        std::thread::sleep(std::time::Duration::from_millis(25));
    }

    /// Every file and link under `root` but the ld.so.cache and `/proc`, deepest first.
    fn entries(root: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        let mut todo = vec![root.to_path_buf()];
        while let Some(dir) = todo.pop() {
            for e in fs::read_dir(&dir).unwrap().flatten() {
                let (path, ft) = (e.path(), e.file_type().unwrap());
                if path == root.join("proc") || path == root.join("etc/ld.so.cache") {
                    continue;
                }
                if ft.is_dir() {
                    todo.push(path);
                } else {
                    out.push(path);
                }
            }
        }
        out.sort();
        out
    }

    /// The property the cache rests on: after any change to the names the look-ups read (each
    /// file and link of the driver root removed and put back, files added where the look-ups
    /// search, a link pointed elsewhere, a linked directory made a real one), a create gets
    /// what a look-up finds then.
    #[test]
    fn every_change_to_what_was_looked_up_is_seen() {
        let (tmp, host) = super::super::tests::driver_root();
        let root = tmp.path();
        let cache_tmp = tempfile::tempdir().unwrap();
        let dir = cache_tmp.path().join("cache-dir");
        let later = cache::now_ns() + 10 * RACY_NS;
        let check = |what: &str| {
            for c in CAPS {
                let c = caps(c);
                let (got, _) = through_cache(&host, &c, &dir, later);
                assert_eq!(got, looked_up(&host, &c), "{what}, {c:?}");
                // Kept: the same answer without a look-up.
                let (again, looked) = through_cache(&host, &c, &dir, later);
                assert!(!looked, "{what}: not kept");
                assert_eq!(again, got, "{what}");
            }
        };
        check("first");
        for entry in entries(root) {
            let target = fs::read_link(&entry).ok();
            next_tick();
            fs::remove_file(&entry).unwrap();
            check(&format!("{} removed", entry.display()));
            next_tick();
            match &target {
                Some(t) => symlink(t, &entry).unwrap(),
                None => fs::write(&entry, b"stub").unwrap(),
            }
            check(&format!("{} back", entry.display()));
        }
        let add = |p: &str| {
            next_tick();
            let p = root.join(p);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, b"stub").unwrap();
        };
        add("usr/bin/nvidia-debugdump");
        check("a binary added");
        add("usr/local/bin/nvidia-persistenced");
        check("a binary added where no directory was");
        add(&format!("usr/lib/firmware/nvidia/{V}/gsp_tu10x.bin"));
        check("firmware added");
        add("usr/lib/x86_64-linux-gnu/libcuda.so.580.95.06");
        next_tick();
        let link = root.join("usr/lib/x86_64-linux-gnu/libcuda.so.1");
        fs::remove_file(&link).unwrap();
        symlink("libcuda.so.580.95.06", &link).unwrap();
        check("a SONAME link pointed at another file");
        next_tick();
        let dev = root.join("usr/lib/x86_64-linux-gnu/libnvidia-ml.so");
        symlink("libnvidia-ml.so.1", &dev).unwrap();
        check("a development link made");
        assert!(looked_up(&host, &caps(CAPS[1]))
            .dev_links
            .contains(&"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so".to_string()));
        next_tick();
        fs::remove_file(&dev).unwrap();
        check("a development link removed");
        // /lib a directory of its own instead of a link to usr/lib.
        next_tick();
        fs::remove_file(root.join("lib")).unwrap();
        add(&format!("lib/x86_64-linux-gnu/libcuda.so.{V}"));
        symlink(
            format!("libcuda.so.{V}"),
            root.join("lib/x86_64-linux-gnu/libcuda.so.1"),
        )
        .unwrap();
        check("/lib made a directory");
        // The answer without libcuda is not the one kept with it.
        next_tick();
        fs::remove_dir_all(root.join("lib/x86_64-linux-gnu")).unwrap();
        check("a directory removed");
    }

    #[test]
    fn kept_only_when_old_whole_and_for_the_same_driver() {
        let (tmp, host) = super::super::tests::driver_root();
        let cache_tmp = tempfile::tempdir().unwrap();
        let dir = cache_tmp.path().join("cache-dir");
        let c = caps(CAPS[1]);
        // Just made: looked up, not kept.
        let (young, looked) = through_cache(&host, &c, &dir, cache::now_ns());
        assert!(looked && !dir.exists());
        let later = cache::now_ns() + 10 * RACY_NS;
        let (kept, _) = through_cache(&host, &c, &dir, later);
        assert_eq!(kept, young);
        assert!(!through_cache(&host, &c, &dir, later).1);
        // Damaged: looked up again, and kept anew.
        let file = fs::read_dir(&dir).unwrap().next().unwrap().unwrap().path();
        let mut bytes = fs::read(&file).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 1;
        fs::write(&file, &bytes).unwrap();
        assert!(through_cache(&host, &c, &dir, later).1);
        assert!(!through_cache(&host, &c, &dir, later).1);
        // Another driver version: its own look-up.
        let other = files_of(&fresh(&host), &c, "580.95.06", &dir, later, || {
            Ok::<_, ()>(DriverFiles::default())
        });
        assert_eq!(other, Ok(DriverFiles::default()));
        // A new ld.so.cache (ldconfig renames one in): looked up again.
        next_tick();
        let ld = tmp.path().join("etc/ld.so.cache");
        fs::copy(&ld, ld.with_extension("new")).unwrap();
        fs::rename(ld.with_extension("new"), &ld).unwrap();
        assert!(through_cache(&host, &c, &dir, later).1);
        // No ld.so.cache: looked up every time, nothing kept.
        fs::remove_dir_all(&dir).unwrap();
        fs::remove_file(&ld).unwrap();
        let none = files_of(&fresh(&host), &c, V, &dir, later, || {
            Ok::<_, ()>(DriverFiles::default())
        });
        assert_eq!(none, Ok(DriverFiles::default()));
        assert!(!dir.exists());
    }
}
