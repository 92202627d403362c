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
    match crate::hostfile::read_to_string(path, crate::hostfile::CONFIG_LIMIT) {
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
    // A config that is a symlink is written through the link (`atomic::target`).
    let target = match &c.after {
        Some(_) => crate::atomic::target(&c.path).map_err(write_err)?,
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
