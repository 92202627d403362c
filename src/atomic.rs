//! The one way nvshim replaces a file: a temporary file in the same directory, written whole,
//! given its mode (and owner), flushed as far as the caller needs, then renamed over the
//! target. A reader (runc reading config.json, an engine reading its config, a CDI consumer
//! scanning a spec directory, a `create` reading the CDI index), a process killed half way, or
//! a host that loses power sees the old file or the new one, never a torn or empty one.
//!
//! The temporary name is `.<name>.nvshim-<pid>.tmp`: hidden, and never ending in `.json` or
//! `.yaml`, so a CDI consumer scanning the directory meanwhile skips it. It is created with
//! `O_EXCL | O_NOFOLLOW` (a symlink planted under that name is not followed; a leftover of a
//! killed process with the same pid is removed and the create retried once). On any error the
//! temporary file is removed and the target is untouched.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// How far the new content is flushed before the rename.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Not flushed: files on tmpfs (`/run`), or that are only a cache.
    None,
    /// The data flushed (`fdatasync`) before the rename. Without it a rename can reach the
    /// disk before the data does (XFS, ext4 with `noauto_da_alloc`), and a power loss leaves
    /// an empty file; losing the rename itself leaves the old, intact file.
    Data,
    /// The data, then the directory after the rename: the new file survives a power loss
    /// (an engine's config, which nvshim reports as written).
    DataAndDirectory,
}

/// What the new file gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Its permission bits, set after creation (the umask does not narrow them).
    pub mode: u32,
    /// Its owner and group; `None`: the writing process's.
    pub owner: Option<(u32, u32)>,
    pub durability: Durability,
}

/// The temporary file next to `path`.
fn temp_path(path: &Path) -> PathBuf {
    let mut name = std::ffi::OsString::from(".");
    name.push(path.file_name().unwrap_or_default());
    name.push(format!(".nvshim-{}.tmp", std::process::id()));
    path.with_file_name(name)
}

fn create_temp(tmp: &Path, mode: u32) -> std::io::Result<fs::File> {
    let open = || {
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(tmp)
    };
    match open() {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            // A leftover of a killed process that had this pid (unlink does not follow links).
            fs::remove_file(tmp)?;
            open()
        }
        other => other,
    }
}

/// Replaces `path` with `bytes` (see the module doc).
pub fn write(path: &Path, bytes: &[u8], opts: &Options) -> std::io::Result<()> {
    let tmp = temp_path(path);
    let result = (|| {
        let mut f = create_temp(&tmp, opts.mode)?;
        f.write_all(bytes)?;
        if let Some((uid, gid)) = opts.owner {
            // Before the mode: a chown clears set-id bits.
            std::os::unix::fs::fchown(&f, Some(uid), Some(gid))?;
        }
        f.set_permissions(fs::Permissions::from_mode(opts.mode))?;
        if opts.durability != Durability::None {
            f.sync_data()?;
        }
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
        return result;
    }
    if opts.durability == Durability::DataAndDirectory {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// The file a replace of `path` must write: `path` followed while it is a symlink (config
/// management keeps the real file elsewhere; the link stays and its final target gets the new
/// bytes; a relative target is read from the link's directory), a dangling chain ending at
/// the missing target, which is then created. A FIFO, device, socket or directory there is
/// refused ([`crate::hostfile::Refused`]): it is not what the caller meant to replace, and
/// reading the old content first would block or never end.
pub fn target(path: &Path) -> std::io::Result<PathBuf> {
    let mut cur = path.to_path_buf();
    // The kernel's own limit on a chain (ELOOP after 40 links).
    for _ in 0..40 {
        match fs::symlink_metadata(&cur) {
            Ok(m) if m.file_type().is_symlink() => {
                let next = fs::read_link(&cur)?;
                cur = match cur.parent() {
                    Some(dir) if next.is_relative() => dir.join(next),
                    _ => next,
                };
            }
            Ok(m) => {
                if let Some(what) = crate::hostfile::special_kind(m.file_type()) {
                    return Err(crate::hostfile::Refused::NotRegular(what).into());
                }
                return Ok(cur);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(cur),
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::other(format!(
        "more than 40 symlinks from {}; point it at the real file",
        path.display()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPTS: Options = Options {
        mode: 0o640,
        owner: None,
        durability: Durability::Data,
    };

    #[test]
    fn replaces_the_file_with_its_mode_and_leaves_no_temp() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a.json");
        fs::write(&p, "old").unwrap();
        write(&p, b"new", &OPTS).unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "new");
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o7777,
            0o640
        );
        let names: Vec<_> = fs::read_dir(d.path()).unwrap().flatten().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn a_planted_temp_symlink_is_not_followed() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("config.json");
        let victim = d.path().join("victim");
        fs::write(&victim, "keep").unwrap();
        std::os::unix::fs::symlink(&victim, temp_path(&p)).unwrap();
        write(&p, b"{}", &OPTS).unwrap();
        assert_eq!(fs::read_to_string(&victim).unwrap(), "keep");
        assert_eq!(fs::read_to_string(&p).unwrap(), "{}");
        assert!(fs::symlink_metadata(temp_path(&p)).is_err());
    }

    #[test]
    fn a_failed_write_leaves_the_target_and_no_temp() {
        let d = tempfile::tempdir().unwrap();
        // The target is a non-empty directory: the rename fails.
        let p = d.path().join("target");
        fs::create_dir(&p).unwrap();
        fs::write(p.join("x"), "").unwrap();
        assert!(write(&p, b"new", &OPTS).is_err());
        assert!(p.join("x").exists());
        assert!(fs::symlink_metadata(temp_path(&p)).is_err());
    }

    #[test]
    fn target_follows_links_and_refuses_special_files() {
        let d = tempfile::tempdir().unwrap();
        let real = d.path().join("real.yaml");
        let link = d.path().join("link.yaml");
        std::os::unix::fs::symlink("real.yaml", &link).unwrap();
        // Dangling: the missing target is what a write creates.
        assert_eq!(target(&link).unwrap(), real);
        fs::write(&real, "x").unwrap();
        assert_eq!(target(&link).unwrap(), real);
        let fifo = d.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        for p in [fifo.as_path(), Path::new("/dev/null"), d.path()] {
            let e = target(p).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{e}");
        }
    }
}
