//! What update-ldcache read of each library (its SONAME and cache flags, or that it is no
//! library), kept in nvshim's cache dir between containers, by the file's identity.
//!
//! Why: the driver's libraries a GPU container gets are the host's files, bind-mounted, the
//! same inodes in every container of the node; reading one (its ELF head and dynamic section)
//! costs five system calls (`openat`, `fstat`, two `pread`s, `close`), finding it here one
//! `fstatat`, the call that gives its identity. On the bench's image (37 driver libraries,
//! scripts/bench.sh), update-ldcache made 307 system calls, 185 of them those reads
//! (docs/benchmarks.md).
//!
//! Safe by the identity rule of [`crate::cache`]: an entry is used only while the file gives
//! the same [`Key`] (device, inode, size, mtime, ctime: a file written in place gets a new
//! ctime, one replaced is another inode), and kept only when that ctime is more than
//! [`RACY_NS`] older than the hook's start, so that no later change can leave the same key.
//! Keyed by device and inode, an entry describes one file wherever it is seen: a file the
//! container made is another inode. Only files on another file system than the container's
//! root are kept or looked up: what the runtime bind-mounted from the host. The image's own
//! file system is left out because the rule does not hold there: an overlay (or a btrfs
//! snapshot) takes a device number freed by an earlier container's, while its files show
//! their layers' ctimes, which may be older than an entry kept from that earlier container.
//! The file is read only when it is private to root or this
//! user (as nvshim-runtime reads its own caches, `src/cache.rs`) and its trailer checks
//! ([`cache::unseal`]); anything else is only rebuilt.
//!
//! The hook writes only into a cache dir that exists (nvshim-runtime makes it for its own
//! caches, `/run/nvshim` unless its config says otherwise, and passes another one to its
//! fix-ups hook as `--cache-dir`); it never makes the directory, and `--cache-dir=` turns the
//! file off. It is written only when something new was read, as a new file renamed over the
//! old one ([`root::replace_file`]). Hooks of containers starting at once may each write it
//! (and, each in its container's PID namespace, may share a temporary name): what is left is
//! one writer's whole file, or one whose trailer does not check, which is then rebuilt.

use std::cell::RefCell;
use std::fs::File;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use foldhash::{HashMap, HashMapExt as _, HashSet, HashSetExt as _};

use crate::cache::{self, Key, RACY_NS};
use crate::elf::{Arch, DsoInfo};
use crate::root;

const MAGIC: &[u8] = b"nvshim-elf-facts 1\n";
/// Entries kept at most: a node's driver has about forty libraries per folder.
const MAX_ENTRIES: usize = 4096;
/// Largest file read (4,096 entries of a long SONAME fit).
const MAX_LEN: u64 = 2 << 20;

/// An entry: what one version of a file is.
type Entry = (Key, Option<DsoInfo>);

/// The kept facts, and those read in this run.
pub struct Facts {
    /// Where the file lives: the cache dir and its name there; `None`: nothing kept or written.
    file: Option<(PathBuf, String)>,
    kept: HashMap<(u64, u64), Entry>,
    fresh: RefCell<Vec<Entry>>,
    /// When the hook started (ns since the epoch): what an entry's ctime must be older than.
    started: i64,
    /// The device of the container's root file system, whose files are never kept.
    image_dev: u64,
}

impl Facts {
    /// No file: every library is read.
    pub fn none() -> Facts {
        Facts {
            file: None,
            kept: HashMap::new(),
            fresh: RefCell::new(Vec::new()),
            started: cache::now_ns(),
            image_dev: 0,
        }
    }

    /// The facts kept in `cache_dir` for `arch`'s libraries, for a container whose root is on
    /// `image_dev`; none when the file is missing, damaged or not private (then rebuilt).
    pub fn load(cache_dir: &Path, arch: Arch, image_dev: u64) -> Facts {
        let started = cache::now_ns();
        let name = format!("elf-facts-{}", arch.triplet());
        let path = cache_dir.join(&name);
        let kept = read_private(&path)
            .and_then(|bytes| decode(&bytes))
            .unwrap_or_default();
        Facts {
            file: Some((cache_dir.to_path_buf(), name)),
            kept,
            fresh: RefCell::new(Vec::new()),
            started,
            image_dev,
        }
    }

    /// Whether any entry is kept: without one, a look-up is a wasted `fstatat`.
    pub fn any(&self) -> bool {
        !self.kept.is_empty()
    }

    /// What the file `st` describes was found to be, when kept for exactly this version.
    pub fn get(&self, st: &libc::stat) -> Option<Option<DsoInfo>> {
        if st.st_dev == self.image_dev {
            return None;
        }
        let key = Key::of_stat(st);
        match self.kept.get(&(key.dev, key.ino)) {
            Some((k, info)) if *k == key => Some(info.clone()),
            _ => None,
        }
    }

    /// Notes what the regular file `st` (from `fstat` of the file read) was found to be, to
    /// be kept when its ctime is old enough.
    pub fn record(&self, st: &libc::stat, info: &Option<DsoInfo>) {
        let key = Key::of_stat(st);
        let old = key.ctime.saturating_add(RACY_NS) < self.started;
        if self.file.is_some() && old && key.dev != self.image_dev {
            self.fresh.borrow_mut().push((key, info.clone()));
        }
    }

    /// Writes the file when something new was read: the new entries, then the kept ones they
    /// do not replace, up to [`MAX_ENTRIES`]. Best effort: a cache dir that is missing or
    /// unwritable costs only the cache.
    pub fn save(&self) {
        let fresh = self.fresh.borrow();
        let Some((dir, name)) = self.file.as_ref().filter(|_| !fresh.is_empty()) else {
            return;
        };
        let mut seen = HashSet::new();
        let entries: Vec<&Entry> = fresh
            .iter()
            .chain(self.kept.values())
            .filter(|(k, _)| seen.insert((k.dev, k.ino)))
            .take(MAX_ENTRIES)
            .collect();
        let Ok(dir_file) = File::open(dir) else {
            return;
        };
        let _ = root::replace_file(dir_file.as_fd(), name, &encode(&entries), 0o600);
    }
}

/// The file's bytes when it is [`cache::private`] (not followed if a symlink).
fn read_private(path: &Path) -> Option<Vec<u8>> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    let st = root::fstat(file.as_fd()).ok()?;
    if !cache::private(root::is_regular(&st), st.st_uid, st.st_mode) {
        return None;
    }
    root::read_bounded(&file, st.st_size as u64, MAX_LEN).ok()
}

fn encode(entries: &[&Entry]) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    for (k, info) in entries {
        for n in [k.dev, k.ino, k.size] {
            out.extend_from_slice(&n.to_le_bytes());
        }
        for n in [k.mtime, k.ctime] {
            out.extend_from_slice(&n.to_le_bytes());
        }
        let (kind, flags, soname) = match info {
            None => (0u8, 0, &b""[..]),
            Some(DsoInfo {
                soname: None,
                flags,
            }) => (1, *flags, &b""[..]),
            Some(DsoInfo {
                soname: Some(s),
                flags,
            }) => (2, *flags, s.as_slice()),
        };
        out.push(kind);
        out.extend_from_slice(&flags.to_le_bytes());
        // A SONAME longer than a u16 is not kept; the library is then read each time.
        let len = u16::try_from(soname.len()).unwrap_or(0);
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&soname[..len as usize]);
    }
    cache::seal(out)
}

/// A bounded reader over a kept file's body.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*head)
    }

    fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(head)
    }
}

fn decode(bytes: &[u8]) -> Option<HashMap<(u64, u64), Entry>> {
    let body = cache::unseal(bytes)?.strip_prefix(MAGIC)?;
    let mut c = Cursor(body);
    let count = u32::from_le_bytes(c.take()?) as usize;
    let mut out = HashMap::with_capacity(count.min(MAX_ENTRIES));
    for _ in 0..count {
        let u = |b: [u8; 8]| u64::from_le_bytes(b);
        let i = |b: [u8; 8]| i64::from_le_bytes(b);
        let key = Key {
            dev: u(c.take()?),
            ino: u(c.take()?),
            size: u(c.take()?),
            mtime: i(c.take()?),
            ctime: i(c.take()?),
        };
        let [kind] = c.take()?;
        let flags = i32::from_le_bytes(c.take()?);
        let len = u16::from_le_bytes(c.take()?) as usize;
        let soname = c.bytes(len)?;
        let info = match kind {
            0 => None,
            1 => Some(DsoInfo {
                soname: None,
                flags,
            }),
            2 => Some(DsoInfo {
                soname: Some(soname.to_vec()),
                flags,
            }),
            _ => return None,
        };
        out.insert((key.dev, key.ino), (key, info));
    }
    c.0.is_empty().then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    /// A device no test file is on: the container's root elsewhere.
    const IMAGE: u64 = u64::MAX;

    fn stat(path: &Path) -> libc::stat {
        let f = File::open(path).unwrap();
        root::fstat(f.as_fd()).unwrap()
    }

    fn lib(soname: Option<&str>, flags: i32) -> Option<DsoInfo> {
        Some(DsoInfo {
            soname: soname.map(|s| s.as_bytes().to_vec()),
            flags,
        })
    }

    /// A hook started `age` ns after `path`'s ctime.
    fn facts_aged(dir: &Path, path: &Path, age: i64) -> Facts {
        let mut f = Facts::load(dir, Arch::X86_64, IMAGE);
        f.started = Key::of_stat(&stat(path)).ctime + age;
        f
    }

    #[test]
    fn what_was_read_is_found_again_for_the_same_version_only() {
        let dir = tempfile::tempdir().unwrap();
        let so = dir.path().join("libnvidia-ml.so.580.95.05");
        std::fs::write(&so, b"\x7fELF...").unwrap();
        let (old, racy) = (RACY_NS + 1, RACY_NS);

        // Too young a ctime: not kept.
        let f = facts_aged(dir.path(), &so, racy);
        f.record(&stat(&so), &lib(Some("libnvidia-ml.so.1"), 0x303));
        f.save();
        assert!(!Facts::load(dir.path(), Arch::X86_64, IMAGE).any());

        let f = facts_aged(dir.path(), &so, old);
        f.record(&stat(&so), &lib(Some("libnvidia-ml.so.1"), 0x303));
        let notes = dir.path().join("notes.txt");
        std::fs::write(&notes, b"not a library").unwrap();
        f.record(&stat(&notes), &None);
        f.save();
        let mode = std::fs::metadata(dir.path().join("elf-facts-x86_64-linux-gnu"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);

        let f = Facts::load(dir.path(), Arch::X86_64, IMAGE);
        assert_eq!(
            f.get(&stat(&so)),
            Some(lib(Some("libnvidia-ml.so.1"), 0x303))
        );
        assert_eq!(f.get(&stat(&notes)), Some(None));
        // Another architecture's file is another file.
        assert!(!Facts::load(dir.path(), Arch::Aarch64, IMAGE).any());

        // Written in place (same inode): a new ctime, not found.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&so, b"\x7fELF,,,").unwrap();
        assert_eq!(f.get(&stat(&so)), None);
        // Replaced by another file: another inode, not found.
        let other = dir.path().join("other");
        std::fs::write(&other, b"\x7fELF...").unwrap();
        std::fs::rename(&other, &notes).unwrap();
        assert_eq!(f.get(&stat(&notes)), None);
    }

    /// The container's own file system: nothing kept, nothing looked up.
    #[test]
    fn files_of_the_containers_root_file_system_are_left_out() {
        let dir = tempfile::tempdir().unwrap();
        let so = dir.path().join("libz.so.1.2.13");
        std::fs::write(&so, b"\x7fELF").unwrap();
        let st = stat(&so);
        let mut f = Facts::load(dir.path(), Arch::X86_64, st.st_dev);
        f.started = Key::of_stat(&st).ctime + RACY_NS + 1;
        f.record(&st, &lib(Some("libz.so.1"), 0x303));
        f.save();
        assert!(!dir.path().join("elf-facts-x86_64-linux-gnu").exists());
        f.image_dev = IMAGE;
        f.record(&st, &lib(Some("libz.so.1"), 0x303));
        f.save();
        let mut f = Facts::load(dir.path(), Arch::X86_64, IMAGE);
        assert!(f.get(&st).is_some());
        f.image_dev = st.st_dev;
        assert_eq!(f.get(&st), None);
    }

    #[test]
    fn new_entries_are_added_to_the_kept_ones_and_the_file_is_written_only_when_needed() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("liba.so.1");
        let b = dir.path().join("libb.so.1");
        std::fs::write(&a, b"a").unwrap();
        std::fs::write(&b, b"b").unwrap();
        let file = dir.path().join("elf-facts-x86_64-linux-gnu");

        let f = facts_aged(dir.path(), &a, RACY_NS + 1);
        f.save();
        assert!(!file.exists(), "nothing read, nothing written");
        f.record(&stat(&a), &lib(Some("liba.so.1"), 1));
        f.save();

        let f = facts_aged(dir.path(), &b, RACY_NS + 1);
        f.record(&stat(&b), &lib(None, 2));
        f.save();
        let f = Facts::load(dir.path(), Arch::X86_64, IMAGE);
        assert_eq!(f.get(&stat(&a)), Some(lib(Some("liba.so.1"), 1)));
        assert_eq!(f.get(&stat(&b)), Some(lib(None, 2)));

        // All found: the file is left as it is.
        let before = std::fs::metadata(&file).unwrap().ino();
        f.save();
        use std::os::unix::fs::MetadataExt as _;
        assert_eq!(std::fs::metadata(&file).unwrap().ino(), before);
    }

    #[test]
    fn a_damaged_foreign_or_shared_file_is_not_used() {
        let dir = tempfile::tempdir().unwrap();
        let so = dir.path().join("libcuda.so.580.95.05");
        std::fs::write(&so, b"\x7fELF").unwrap();
        let f = facts_aged(dir.path(), &so, RACY_NS + 1);
        f.record(&stat(&so), &lib(Some("libcuda.so.1"), 0x303));
        f.save();
        let file = dir.path().join("elf-facts-x86_64-linux-gnu");
        let good = std::fs::read(&file).unwrap();
        assert!(Facts::load(dir.path(), Arch::X86_64, IMAGE).any());

        for cut in [0, 1, MAGIC.len(), good.len() - 17, good.len() - 1] {
            std::fs::write(&file, &good[..cut]).unwrap();
            assert!(
                !Facts::load(dir.path(), Arch::X86_64, IMAGE).any(),
                "cut at {cut}"
            );
        }
        for at in 0..good.len() {
            let mut bad = good.clone();
            bad[at] ^= 0x10;
            std::fs::write(&file, &bad).unwrap();
            assert!(
                !Facts::load(dir.path(), Arch::X86_64, IMAGE).any(),
                "byte {at}"
            );
        }
        std::fs::write(&file, &good).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(
            !Facts::load(dir.path(), Arch::X86_64, IMAGE).any(),
            "writable by others"
        );
        std::fs::remove_file(&file).unwrap();
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), &file).unwrap();
        std::fs::write(dir.path().join("elsewhere"), &good).unwrap();
        assert!(
            !Facts::load(dir.path(), Arch::X86_64, IMAGE).any(),
            "a symlink"
        );
    }

    /// Writers at once, sharing one temporary name (threads of one process, as hooks in
    /// different PID namespaces can): the file left is always one writer's whole file.
    #[test]
    fn concurrent_writers_leave_a_whole_file() {
        let dir = tempfile::tempdir().unwrap();
        let libs: Vec<PathBuf> = (0..16)
            .map(|i| {
                let p = dir.path().join(format!("lib{i}.so.1"));
                std::fs::write(&p, [i as u8]).unwrap();
                p
            })
            .collect();
        let old = Key::of_stat(&stat(&libs[0])).ctime + RACY_NS + 1;
        for _ in 0..20 {
            std::thread::scope(|s| {
                for lib in &libs {
                    s.spawn(|| {
                        let mut f = Facts::load(dir.path(), Arch::X86_64, IMAGE);
                        f.started = old;
                        f.kept.clear();
                        f.record(&stat(lib), &lib_info(lib));
                        f.save();
                    });
                }
            });
            let f = Facts::load(dir.path(), Arch::X86_64, IMAGE);
            assert_eq!(f.kept.len(), 1);
            let (key, info) = f.kept.values().next().unwrap();
            let lib = libs
                .iter()
                .find(|l| Key::of_stat(&stat(l)) == *key)
                .unwrap();
            assert_eq!(*info, lib_info(lib));
        }
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| !n.starts_with("lib"))
            .collect();
        assert_eq!(
            names,
            ["elf-facts-x86_64-linux-gnu"],
            "temporary files left"
        );
    }

    fn lib_info(path: &Path) -> Option<DsoInfo> {
        let name = path.file_name().unwrap().to_str().unwrap();
        lib(Some(name), 0x303)
    }

    #[test]
    fn a_missing_cache_dir_is_never_made() {
        let dir = tempfile::tempdir().unwrap();
        let so = dir.path().join("liba.so.1");
        std::fs::write(&so, b"a").unwrap();
        let missing = dir.path().join("run-nvshim");
        let mut f = Facts::load(&missing, Arch::X86_64, IMAGE);
        f.started = Key::of_stat(&stat(&so)).ctime + RACY_NS + 1;
        f.record(&stat(&so), &lib(Some("liba.so.1"), 1));
        f.save();
        assert!(!missing.exists());
        let f = Facts::none();
        f.record(&stat(&so), &lib(Some("liba.so.1"), 1));
        f.save();
        assert!(!f.any());
    }
}
