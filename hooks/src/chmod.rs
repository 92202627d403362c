//! The `chmod` hook: `--mode OCTAL --path P [--path ...]`, NVIDIA's deprecated `nvidia-cdi-hook
//! chmod` (`cmd/nvidia-cdi-hook/chmod/chmod.go`), a workaround
//! for rootless podman with old crun, which created `/dev/dri` and `/dev/nvidia-caps` without
//! the modes the devices need. NVIDIA's generator no longer emits it, but old specs carry it.
//!
//! NVIDIA's hook joins the paths to the root as strings and calls `os.Chmod`, which follows an
//! image symlink anywhere on the host (docs/nvidia-behaviour.md §3.3). Here each path is resolved
//! by fd inside the root ([`Root::open_at`]: symlinks followed but kept inside the root, magic
//! links refused), and the mode is set on what that fd holds: `fchmod` on the directory reopened
//! from it, or, for anything else, `chmod` through `/proc/self/fd/N` of the `O_PATH` fd, so a
//! device node or FIFO is never opened. Otherwise NVIDIA's meaning:
//! - paths are container paths (relative ones from the root); a path that does not resolve is
//!   skipped;
//! - the mode is octal; as in NVIDIA's hook, where Go's `os.Chmod` takes the number as an
//!   `fs.FileMode` whose set-id and sticky flags are other bits, only the permission bits
//!   (`0777`) are applied, so this hook never sets set-user-ID, set-group-ID or sticky;
//! - a path already in that mode is left alone (the comparison includes the set-id and sticky
//!   bits, which a change clears);
//! - EPERM and EACCES are ignored (as NVIDIA's hook does: `/dev` bind-mounted whole and read-only is not
//!   an error).

use std::io;
use std::os::fd::{AsFd, AsRawFd};

use thiserror::Error;

use crate::root::{self, Root};

#[derive(Debug, Error)]
pub enum ChmodError {
    #[error("--mode {0:?}: not an octal mode")]
    BadMode(String),
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
}

/// What a run did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    /// Paths whose mode was changed.
    pub changed: Vec<String>,
    /// Paths left alone, with the reason.
    pub skipped: Vec<String>,
}

/// Parses `--mode` as Go's `strconv.ParseUint(s, 8, 32)` does: octal digits only.
pub fn parse_mode(s: &str) -> Result<u32, ChmodError> {
    if s.is_empty() || !s.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
        return Err(ChmodError::BadMode(s.to_string()));
    }
    u32::from_str_radix(s, 8).map_err(|_| ChmodError::BadMode(s.to_string()))
}

fn ignorable(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EPERM) | Some(libc::EACCES))
}

/// Sets `mode` on the inode `fd` (an `O_PATH` fd) holds.
fn chmod_fd(fd: std::os::fd::BorrowedFd, st: &libc::stat, mode: u32) -> io::Result<()> {
    if root::is_dir(st) {
        let dir = root::openat(fd, b".", libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
        let st2 = root::fstat(dir.as_fd())?;
        if (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino) {
            return Err(io::Error::from_raw_os_error(libc::EAGAIN));
        }
        // SAFETY: a live fd.
        if unsafe { libc::fchmod(dir.as_raw_fd(), mode as libc::mode_t) } < 0 {
            return Err(io::Error::last_os_error());
        }
        return Ok(());
    }
    let path = root::proc_fd_path(fd)?;
    // SAFETY: a valid C string. The magic link leads to exactly the inode `fd` holds.
    if unsafe { libc::chmod(path.as_ptr(), mode as libc::mode_t) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Runs the hook: sets `mode` on each of `paths` below `root`. Every path is tried; the first
/// error is returned after the others were done.
pub fn run(root: &Root, mode: u32, paths: &[String]) -> Result<Report, ChmodError> {
    let mode = mode & 0o777;
    let mut report = Report::default();
    let mut first_error = None;
    for p in paths {
        let display = root.display(p);
        let fd = match root.open_at(p, libc::O_PATH, 0, false) {
            Ok(fd) => fd,
            Err(e) => {
                report.skipped.push(format!("{display}: {e}"));
                continue;
            }
        };
        let st = match root::fstat(fd.as_fd()) {
            Ok(st) => st,
            Err(e) => {
                report.skipped.push(format!("{display}: {e}"));
                continue;
            }
        };
        if st.st_mode & 0o7777 == mode {
            report
                .skipped
                .push(format!("{display}: already mode {mode:o}"));
            continue;
        }
        match chmod_fd(fd.as_fd(), &st, mode) {
            Ok(()) => report.changed.push(p.clone()),
            Err(e) if ignorable(&e) => report.skipped.push(format!("{display}: {e}; ignored")),
            Err(source) => {
                first_error.get_or_insert(ChmodError::Io {
                    path: display,
                    source,
                });
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(report),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, PermissionsExt};
    use std::path::Path;

    use crate::root::Resolver;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn modes_parse_as_octal() {
        assert_eq!(parse_mode("755").unwrap(), 0o755);
        assert_eq!(parse_mode("0755").unwrap(), 0o755);
        assert_eq!(parse_mode("4755").unwrap(), 0o4755);
        for bad in ["", "8", "0o755", "-1", "7 55", "77777777777777"] {
            assert!(parse_mode(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn chmods_inside_and_never_follows_out() {
        for resolver in [Resolver::Openat2, Resolver::Walk] {
            let host = tempfile::tempdir().unwrap();
            let secret = host.path().join("secret");
            std::fs::write(&secret, "host").unwrap();
            std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
            let hostdir = host.path().join("hostdir");
            std::fs::create_dir(&hostdir).unwrap();
            std::fs::set_permissions(&hostdir, std::fs::Permissions::from_mode(0o700)).unwrap();
            let rootdir = host.path().join("root");
            let dri = rootdir.join("dev/dri");
            std::fs::create_dir_all(&dri).unwrap();
            std::fs::set_permissions(&dri, std::fs::Permissions::from_mode(0o700)).unwrap();
            std::fs::write(rootdir.join("dev/file"), "").unwrap();
            // Symlinks to host paths, absolute and climbing, and a magic link.
            symlink(&secret, rootdir.join("dev/abs")).unwrap();
            symlink(&hostdir, rootdir.join("dev/absdir")).unwrap();
            symlink(
                format!("../../../../../../..{}", secret.display()),
                rootdir.join("dev/up"),
            )
            .unwrap();
            symlink("/proc/self/root/etc/hostname", rootdir.join("dev/magic")).unwrap();
            // A symlink inside the root is followed inside it.
            symlink("/dev/dri", rootdir.join("dri-link")).unwrap();
            let root = Root::open(&rootdir).unwrap();
            root.set_resolver(resolver);
            let paths: Vec<String> = [
                "/dev/abs",
                "/dev/absdir",
                "dev/up",
                "/dev/magic",
                "/../../dev/up",
                "/dri-link",
                "/dev/file",
                "/missing",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            let r = run(&root, 0o4755, &paths).unwrap();
            assert_eq!(r.changed, ["/dri-link", "/dev/file"], "{r:?}");
            assert_eq!(mode(&dri), 0o755, "set-id bits are never set");
            assert_eq!(mode(&rootdir.join("dev/file")), 0o755);
            assert_eq!(mode(&secret), 0o600);
            assert_eq!(mode(&hostdir), 0o700);
            assert_eq!(std::fs::read_to_string(&secret).unwrap(), "host");
            // Already in that mode: skipped.
            let r = run(&root, 0o755, &["/dev/dri".to_string()]).unwrap();
            assert!(r.changed.is_empty(), "{r:?}");
        }
    }

    #[test]
    fn device_nodes_and_fifos_are_not_opened() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let root = Root::open(dir.path()).unwrap();
        // An open of the FIFO would block forever without a writer.
        let r = run(&root, 0o666, &["/fifo".to_string()]).unwrap();
        assert_eq!(r.changed, ["/fifo"]);
        assert_eq!(mode(&fifo), 0o666);
    }
}
