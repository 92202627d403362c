//! The CDI registry of the spec directories, kept in memory for as long as the plugin runs
//! and read again after a change inotify reports.
//!
//! A create of `nvshim-runtime` resolves CDI names through the on-disk index
//! (`src/cdi/index.rs`), which `stat`s every spec file per create: with 1,000 claim specs
//! that was most of nvshim-nri's 1.9 ms of CPU per CDI request (docs/benchmarks.md). Here a
//! request costs one non-blocking `read` of the inotify descriptor instead.
//!
//! Why an answer cannot be stale: the watches are added before the directories are read, and
//! the kernel queues an event in the same system call that creates, writes, renames or
//! removes an entry, so a change made before the engine sends `CreateContainer` is in the
//! queue when the request drains it, and any event (an overflowed queue too) reads the
//! directories again. Where that does not hold the plugin keeps nothing and reads the
//! directories per request as `nvshim-runtime` does: a spec directory on a file system
//! whose changes need not come through this kernel (NFS, FUSE, overlay, squashfs:
//! [`nvshim::cache::trusts_identity`]), or a spec file that is a symlink (its target's
//! changes raise no event in the watched directory). A directory missing at load is looked
//! for (`stat`) on each request and read once it appears. An event naming a spec file reads
//! that file again (a DRA driver writes one per claim); any other reads them all.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use nix::errno::Errno;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use nvshim::cdi::registry::{clean, is_spec_file};
use nvshim::cdi::{spec, Registry};

/// The spec files read, by (directory's priority, file name): each its spec or its
/// failure's text. Kept so that an event reads again only the files it names.
type Files = BTreeMap<(usize, OsString), Result<nvshim::cdi::Spec, String>>;

/// The registry of one list of spec directories and what tells when it changed.
struct Watched {
    dirs: Vec<PathBuf>,
    inotify: Inotify,
    /// The watch of each directory that exists, with its priority.
    watches: Vec<(WatchDescriptor, usize)>,
    /// Directories that did not exist at load: not watched, looked for on each request.
    missing: Vec<PathBuf>,
    files: Files,
    registry: Arc<Registry>,
}

/// The spec directories' registry, shared by the plugin's request threads.
#[derive(Default)]
pub struct Specs {
    watched: Mutex<Option<Watched>>,
}

/// What changed since the registry was built.
enum Change {
    Nothing,
    /// These spec files (a file written, renamed or removed).
    Files(Vec<(usize, OsString)>),
    /// Anything else (a directory removed or appeared, the queue overflowed): read it all.
    All,
}

impl Specs {
    /// The registry of `dirs` as they are now, or `None` where it cannot be kept (see the
    /// module's comment): the caller then reads the directories itself.
    pub fn registry(&self, dirs: &[PathBuf]) -> Option<Arc<Registry>> {
        let mut held = self.watched.lock().unwrap_or_else(|e| e.into_inner());
        let change = match held.as_ref() {
            Some(w) if w.dirs == dirs => changed(w),
            _ => Change::All,
        };
        match change {
            Change::Nothing => {}
            Change::Files(files) => {
                let w = held.as_mut().expect("a change of a kept registry");
                if !reread(w, files) {
                    *held = load(dirs);
                }
            }
            Change::All => *held = load(dirs),
        }
        if held.is_none() {
            tracing::debug!("CDI spec directories read per request");
        }
        held.as_ref().map(|w| Arc::clone(&w.registry))
    }
}

/// What changed since `w` was built; an inotify error counts as a change of everything.
fn changed(w: &Watched) -> Change {
    let mut files = Vec::new();
    loop {
        let events = match w.inotify.read_events() {
            Ok(events) if events.is_empty() => break,
            Ok(events) => events,
            Err(Errno::EAGAIN) => break,
            Err(Errno::EINTR) => continue,
            Err(_) => return Change::All,
        };
        for e in events {
            let dir = w
                .watches
                .iter()
                .find(|(wd, _)| *wd == e.wd)
                .map(|(_, p)| *p);
            match (dir, e.name) {
                (Some(p), Some(name)) if !e.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) => {
                    if is_spec_file(&name.to_string_lossy()) {
                        files.push((p, name));
                    }
                }
                _ => return Change::All,
            }
        }
    }
    if w.missing.iter().any(|d| d.exists()) {
        Change::All
    } else if files.is_empty() {
        Change::Nothing
    } else {
        Change::Files(files)
    }
}

/// Reads `files` of `w` again and rebuilds its registry; `false` where one became a symlink
/// (the registry can no longer be kept).
fn reread(w: &mut Watched, mut files: Vec<(usize, OsString)>) -> bool {
    files.sort();
    files.dedup();
    for (p, name) in files {
        let path = clean(&w.dirs[p]).join(&name);
        match path.symlink_metadata() {
            Ok(m) if m.file_type().is_symlink() => return false,
            Ok(m) if m.is_dir() => {
                w.files.remove(&(p, name));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                w.files.remove(&(p, name));
            }
            _ => {
                w.files.insert((p, name), read(&path));
            }
        }
    }
    w.registry = Arc::new(build(&w.dirs, &w.files));
    true
}

fn read(path: &std::path::Path) -> Result<nvshim::cdi::Spec, String> {
    spec::read_file(path).map_err(|e| e.to_string())
}

/// The registry of the files read, as [`Registry::load`] builds it (the specs are copied:
/// the registry hands its edits out by value).
fn build(dirs: &[PathBuf], files: &Files) -> Registry {
    let clean: Vec<PathBuf> = dirs.iter().map(|d| clean(d)).collect();
    Registry::from_read(
        dirs,
        files
            .iter()
            .map(|((p, name), read)| (clean[*p].join(name), *p, read.clone())),
    )
}

fn load(dirs: &[PathBuf]) -> Option<Watched> {
    let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).ok()?;
    let mask = AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_CLOSE_WRITE
        | AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_MOVE_SELF;
    let mut missing = Vec::new();
    let mut watches = Vec::new();
    let mut files = Files::new();
    for (p, dir) in dirs.iter().enumerate() {
        let dir = clean(dir);
        if !dir.exists() {
            missing.push(dir);
            continue;
        }
        if !nvshim::cache::trusts_identity(&dir) {
            return None;
        }
        // Watched before it is read: a change during the read is an event for the next
        // request.
        watches.push((inotify.add_watch(dir.as_path(), mask).ok()?, p));
        for entry in std::fs::read_dir(&dir).ok()? {
            let entry = entry.ok()?;
            let name = entry.file_name();
            if !is_spec_file(&name.to_string_lossy()) {
                continue;
            }
            let kind = entry.file_type().ok()?;
            if kind.is_symlink() {
                // Its target may change with no event in `dir`.
                return None;
            }
            if !kind.is_dir() {
                let read = read(&entry.path());
                files.insert((p, name), read);
            }
        }
    }
    let registry = Arc::new(build(dirs, &files));
    Some(Watched {
        dirs: dirs.to_vec(),
        inotify,
        watches,
        missing,
        files,
        registry,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(kind: &str, device: &str) -> String {
        format!("cdiVersion: 0.5.0\nkind: {kind}\ndevices:\n- name: {device}\n  containerEdits:\n    env:\n    - CLAIM={device}\n")
    }

    fn names(r: &Registry) -> Vec<String> {
        r.devices().map(|(n, _)| n.to_string()).collect()
    }

    #[test]
    fn a_written_or_removed_spec_is_seen_by_the_next_request() {
        let tmp = tempfile::tempdir().unwrap();
        let (etc, run) = (tmp.path().join("etc"), tmp.path().join("run"));
        std::fs::create_dir(&etc).unwrap();
        let dirs = vec![etc.clone(), run.clone()];
        let specs = Specs::default();
        let first = specs.registry(&dirs).expect("tmpfs or ext4 is watched");
        assert!(names(&first).is_empty());
        let again = specs.registry(&dirs).unwrap();
        assert!(Arc::ptr_eq(&first, &again), "nothing changed: nothing read");

        let claim = etc.join("claim.yaml");
        std::fs::write(&claim, spec("example.com/claim", "a")).unwrap();
        let r = specs.registry(&dirs).unwrap();
        assert_eq!(names(&r), ["example.com/claim=a"]);
        assert!(r.resolve(&["example.com/claim=a".into()]).is_ok());

        // Rewritten in place: no directory time moves, the event still comes.
        std::fs::write(&claim, spec("example.com/claim", "b")).unwrap();
        assert_eq!(
            names(&specs.registry(&dirs).unwrap()),
            ["example.com/claim=b"]
        );

        // A directory that did not exist when loaded.
        std::fs::create_dir(&run).unwrap();
        std::fs::write(run.join("other.yaml"), spec("example.com/x", "c")).unwrap();
        assert_eq!(
            names(&specs.registry(&dirs).unwrap()),
            ["example.com/claim=b", "example.com/x=c"]
        );

        // Written aside and renamed into place, as a DRA driver writes a claim's spec; and a
        // spec that does not parse: the same registry as a full scan gives.
        let tmp_spec = etc.join("d.tmp");
        std::fs::write(&tmp_spec, spec("example.com/claim", "d")).unwrap();
        std::fs::rename(&tmp_spec, etc.join("d.yaml")).unwrap();
        std::fs::write(etc.join("broken.json"), "{").unwrap();
        let r = specs.registry(&dirs).unwrap();
        let full = Registry::load(&dirs);
        assert_eq!(names(&r), names(&full));
        assert_eq!(names(&r).len(), 3);
        let errors = |r: &Registry| r.errors().iter().map(|e| e.to_string()).collect::<Vec<_>>();
        assert_eq!(errors(&r), errors(&full));
        assert_eq!(errors(&r).len(), 1);

        std::fs::remove_file(&claim).unwrap();
        let r = specs.registry(&dirs).unwrap();
        let err = r.resolve(&["example.com/claim=b".into()]).unwrap_err();
        assert!(err.to_string().contains("example.com/claim=b"), "{err}");
    }

    #[test]
    fn a_symlinked_spec_is_read_per_request() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("cdi");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(tmp.path().join("real.yaml"), spec("example.com/claim", "a")).unwrap();
        std::os::unix::fs::symlink(tmp.path().join("real.yaml"), dir.join("a.yaml")).unwrap();
        assert!(Specs::default().registry(&[dir]).is_none());
    }
}
