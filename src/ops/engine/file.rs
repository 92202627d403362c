//! Reading, backing up, diffing and atomically replacing engine config files.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::{EngineError, FileChange};

/// What [`super::Plan::apply`] did to one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    pub path: PathBuf,
    /// Where the previous content was saved (`None` for a file that did not exist).
    pub backup: Option<PathBuf>,
    pub removed: bool,
}

/// `<file>.nvshim.bak` beside the file: the content just before nvshim's last change to it.
/// The suffix keeps it out of the engines' drop-in globs (`conf.d/*.toml`).
pub fn backup_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".nvshim.bak");
    path.with_file_name(name)
}

/// The file's text, `None` if it does not exist.
pub fn read_optional(path: &Path) -> Result<Option<String>, EngineError> {
    match fs::read_to_string(path) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(EngineError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

pub fn unified_diff(c: &FileChange) -> String {
    let before = c.before.as_deref().unwrap_or("");
    let after = c.after.as_deref().unwrap_or("");
    let shown = c.path.display().to_string();
    let a = if c.before.is_some() {
        shown.as_str()
    } else {
        "/dev/null"
    };
    let b = if c.after.is_some() {
        shown.as_str()
    } else {
        "/dev/null"
    };
    similar::TextDiff::from_lines(before, after)
        .unified_diff()
        .context_radius(3)
        .header(a, b)
        .to_string()
}

pub fn apply_change(c: &FileChange) -> Result<Applied, EngineError> {
    let write_err = |source| EngineError::Write {
        path: c.path.clone(),
        source,
    };
    // A config that is a symlink (config management keeps the real file elsewhere) is
    // written through the link: the link stays, its final target gets the new text.
    let target = match &c.after {
        Some(_) => resolve_links(&c.path).map_err(write_err)?,
        None => c.path.clone(),
    };
    // The existing file's mode and owner are kept (daemon.json may be 0600 on purpose).
    let (mode, owner) = match fs::metadata(&target) {
        Ok(m) => (m.permissions().mode() & 0o7777, Some((m.uid(), m.gid()))),
        Err(_) => (0o644, None),
    };
    let backup = if c.before.is_some() {
        let backup = backup_path(&c.path);
        fs::copy(&c.path, &backup).map_err(|source| EngineError::Backup {
            path: c.path.clone(),
            backup: backup.clone(),
            source,
        })?;
        Some(backup)
    } else {
        None
    };
    match &c.after {
        None => {
            fs::remove_file(&c.path).map_err(|source| EngineError::Remove {
                path: c.path.clone(),
                source,
            })?;
            Ok(Applied {
                path: c.path.clone(),
                backup,
                removed: true,
            })
        }
        Some(text) => {
            if let Some(dir) = target.parent() {
                fs::create_dir_all(dir).map_err(write_err)?;
            }
            write_atomic(&target, text.as_bytes(), mode, owner).map_err(write_err)?;
            Ok(Applied {
                path: c.path.clone(),
                backup,
                removed: false,
            })
        }
    }
}

/// Follows `path` while it is a symlink (a relative target is read from the link's
/// directory) to the file a write must replace; a dangling chain ends at the missing target,
/// which is then created.
pub fn resolve_links(path: &Path) -> std::io::Result<PathBuf> {
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
            Ok(_) => return Ok(cur),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(cur),
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::other(format!(
        "more than 40 symlinks from {}; point it at the real file",
        path.display()
    )))
}

/// Replaces the engine's file ([`crate::atomic::write`]), flushed with its directory: the
/// engine (or a crash) never sees a half-written config, and a written config survives a power
/// loss. `path` is never a symlink here.
fn write_atomic(
    path: &Path,
    bytes: &[u8],
    mode: u32,
    owner: Option<(u32, u32)>,
) -> std::io::Result<()> {
    let opts = crate::atomic::Options {
        mode,
        owner,
        durability: crate::atomic::Durability::DataAndDirectory,
    };
    crate::atomic::write(path, bytes, &opts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backup_name() {
        assert_eq!(
            backup_path(Path::new("/etc/docker/daemon.json")),
            PathBuf::from("/etc/docker/daemon.json.nvshim.bak")
        );
    }

    #[test]
    fn diff_of_new_file() {
        let d = unified_diff(&FileChange {
            path: "/etc/x.toml".into(),
            before: None,
            after: Some("a = 1\n".into()),
        });
        assert!(d.starts_with("--- /dev/null\n+++ /etc/x.toml\n"), "{d}");
        assert!(d.contains("+a = 1"), "{d}");
    }

    #[test]
    fn apply_backs_up_and_keeps_mode() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("daemon.json");
        fs::write(&p, "{}").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
        let applied = apply_change(&FileChange {
            path: p.clone(),
            before: Some("{}".into()),
            after: Some("{\"a\": 1}\n".into()),
        })
        .unwrap();
        assert_eq!(applied.backup, Some(backup_path(&p)));
        assert_eq!(fs::read_to_string(backup_path(&p)).unwrap(), "{}");
        assert_eq!(fs::read_to_string(&p).unwrap(), "{\"a\": 1}\n");
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 2, "no temp file left behind");
    }
}
