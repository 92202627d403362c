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

/// Where the backup of `path` goes: `path` itself under `dir` (`/etc/docker/daemon.json` ->
/// `/var/lib/nvshim/backups/etc/docker/daemon.json`), where no engine reads it.
pub fn backup_path(dir: &Path, path: &Path) -> PathBuf {
    dir.join(path.strip_prefix("/").unwrap_or(path))
}

/// The backup of `path` under `dir`, when there is one this process can trust: a regular file
/// of its own user that nobody else may write (`unconfigure` may write its bytes back into an
/// engine's config). `None` otherwise.
pub fn read_backup(dir: &Path, path: &Path) -> Result<Option<String>, EngineError> {
    let backup = backup_path(dir, path);
    let trusted = fs::symlink_metadata(&backup).is_ok_and(|m| {
        m.is_file() && m.uid() == nix::unistd::geteuid().as_raw() && m.mode() & 0o022 == 0
    });
    if !trusted {
        return Ok(None);
    }
    read_optional(&backup)
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

/// Writes one change. `configure` (not `unconfigure`) first keeps a file it edits in place
/// under `backups`, unless a backup from an earlier `configure` is there; `unconfigure` removes
/// the backup once the change is written.
pub fn apply_change(
    c: &FileChange,
    backups: &Path,
    unconfigure: bool,
) -> Result<Applied, EngineError> {
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
    let backup = backup_path(backups, &c.path);
    let backup = if c.before.is_some() && c.after.is_some() && !unconfigure {
        if fs::symlink_metadata(&backup).is_err() {
            save_backup(&c.path, &backup)?;
        }
        Some(backup)
    } else {
        None
    };
    let applied = write_change(c, &target, mode, owner, backup)?;
    if unconfigure {
        let backup = backup_path(backups, &c.path);
        match fs::remove_file(&backup) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(EngineError::Remove {
                    path: backup,
                    source: e,
                })
            }
            _ => {}
        }
        // Its directories too, while empty, up to the backup directory.
        let mut dir = backup.parent();
        while let Some(d) = dir.filter(|d| d.starts_with(backups) && *d != backups) {
            if fs::remove_dir(d).is_err() {
                break;
            }
            dir = d.parent();
        }
    }
    Ok(applied)
}

/// Copies `path` to `backup`, in directories only root can enter.
fn save_backup(path: &Path, backup: &Path) -> Result<(), EngineError> {
    use std::os::unix::fs::DirBuilderExt;
    let err = |source| EngineError::Backup {
        path: path.to_path_buf(),
        backup: backup.to_path_buf(),
        source,
    };
    if let Some(dir) = backup.parent() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(err)?;
    }
    fs::copy(path, backup).map_err(err)?;
    fs::set_permissions(backup, fs::Permissions::from_mode(0o600)).map_err(err)
}

fn write_change(
    c: &FileChange,
    target: &Path,
    mode: u32,
    owner: Option<(u32, u32)>,
    backup: Option<PathBuf>,
) -> Result<Applied, EngineError> {
    let write_err = |source| EngineError::Write {
        path: c.path.clone(),
        source,
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
            write_atomic(target, text.as_bytes(), mode, owner).map_err(write_err)?;
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
            backup_path(
                Path::new("/var/lib/nvshim/backups"),
                Path::new("/etc/crio/crio.conf.d/99-nvshim.toml")
            ),
            PathBuf::from("/var/lib/nvshim/backups/etc/crio/crio.conf.d/99-nvshim.toml")
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

    /// The backup goes under the backup directory (0700, the copy 0600), the first one stays
    /// through a second configure, and an unconfigure removes it.
    #[test]
    fn apply_backs_up_and_keeps_mode() {
        let dir = tempfile::tempdir().unwrap();
        let backups = dir.path().join("backups");
        let p = dir.path().join("etc/daemon.json");
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, "{}").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).unwrap();
        let step = |before: &str, after: &str, unconfigure: bool| {
            apply_change(
                &FileChange {
                    path: p.clone(),
                    before: Some(before.into()),
                    after: Some(after.into()),
                },
                &backups,
                unconfigure,
            )
            .unwrap()
        };
        let applied = step("{}", "{\"a\": 1}\n", false);
        let backup = backup_path(&backups, &p);
        assert_eq!(applied.backup.as_ref(), Some(&backup));
        assert_eq!(fs::read_to_string(&backup).unwrap(), "{}");
        assert_eq!(fs::read_to_string(&p).unwrap(), "{\"a\": 1}\n");
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o644
        );
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&backup), 0o600);
        assert_eq!(mode(backup.parent().unwrap()), 0o700);
        assert_eq!(read_backup(&backups, &p).unwrap().as_deref(), Some("{}"));
        let names: Vec<_> = fs::read_dir(p.parent().unwrap()).unwrap().collect();
        assert_eq!(names.len(), 1, "nothing beside the config");

        step("{\"a\": 1}\n", "{\"a\": 2}\n", false);
        assert_eq!(fs::read_to_string(&backup).unwrap(), "{}", "the first kept");
        let applied = step("{\"a\": 2}\n", "{}", true);
        assert_eq!(applied.backup, None);
        assert!(!backup.exists());
        assert_eq!(
            fs::read_dir(&backups).unwrap().count(),
            0,
            "no empty directory left"
        );
        assert_eq!(read_backup(&backups, &p).unwrap(), None);

        // A backup others may write is not read.
        step("{}", "{\"a\": 1}\n", false);
        fs::set_permissions(&backup, fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(read_backup(&backups, &p).unwrap(), None);
    }
}
