//! The `disable-device-node-modification` hook, NVIDIA's `nvidia-cdi-hook
//! disable-device-node-modification` (`cmd/nvidia-cdi-hook/disable-device-node-modification/`).
//!
//! The driver's user-space libraries (libnvidia-ml, nvidia-smi) create missing `/dev/nvidia*`
//! nodes themselves when `/proc/driver/nvidia/params` says `ModifyDeviceFiles: 1`. In a
//! container that would undo the runtime's choice of GPUs, so when the host's file says 1 the
//! container is shown a copy that says 0: the host's file, line by line (`bufio.Scanner`'s
//! lines, each written back with `\n`), with the line `ModifyDeviceFiles: 1` replaced; nothing
//! happens if the file is missing, says 0, or has no such line.
//!
//! The copy is a file in a private tmpfs, bind-mounted read-only, `nosuid`, `nodev`, `noexec`
//! and `private` over `<root>/proc/driver/nvidia/params`. runc runs createContainer hooks in the
//! container's mount namespace before pivot_root, where `<root>/proc` is already the container's
//! procfs, so the mount is the container's alone and disappears with it.
//!
//! How it stays inside the root: the target is resolved by fd inside the root
//! ([`Root::open_at`], `RESOLVE_IN_ROOT`, the final component not followed) and must be a
//! regular file; the mounts are made through `/proc/self/fd/N` of `O_PATH` fds, as runc's
//! `utils.WithProcfd` does, so no path string is resolved again; after the bind the target is
//! resolved once more and must be the new file, which is then remounted read-only through its
//! own fd. The tmpfs is mounted on a directory the hook creates directly under the root fd
//! (`.nvshim-params-<pid>`, no path walked), and is detached and the directory removed before
//! the hook returns: unlike NVIDIA's `/run/nvidia-ctk-hook<uuid>`, nothing stays visible in the
//! container but the one file.
//!
//! The host file is read with a size limit, non-blocking, and must be a regular file (procfs
//! files are, with size 0, so the limit is on what is read, not on `st_size`). Its path is the
//! constant [`HOST_PARAMS`] unless the hidden `--host-params FILE` flag names another (tests,
//! and hosts whose driver proc is elsewhere); the environment is never read.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;

use thiserror::Error;

use crate::root::{self, Root};

/// The host's driver parameters.
pub const HOST_PARAMS: &str = "/proc/driver/nvidia/params";
/// The same file, as the container sees it.
pub const CONTAINER_PARAMS: &str = "/proc/driver/nvidia/params";
/// Largest params file read (a real one is under 1 KiB; `bufio.Scanner`'s line limit is 64 KiB).
pub const MAX_PARAMS: u64 = 64 << 10;
/// `statfs` magic of tmpfs (`linux/magic.h`).
const TMPFS_MAGIC: u64 = 0x0102_1994;
/// The name of the copy inside the tmpfs (NVIDIA's).
const COPY_NAME: &str = "nvct-params";

#[derive(Debug, Error)]
pub enum ParamsError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("{path}: not a regular file")]
    NotRegular { path: String },
    #[error("{path}: more than {MAX_PARAMS} bytes")]
    TooLarge { path: String },
    #[error("{what}: {source}")]
    Mount {
        what: String,
        #[source]
        source: io::Error,
    },
}

/// What a run did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    /// The container path mounted over, when the copy was mounted.
    pub mounted: Option<String>,
    /// Why nothing was done, when nothing was.
    pub skipped: Option<String>,
}

/// NVIDIA's `getModifiedParamsFileContentsFromReader`: the file with `ModifyDeviceFiles: 1`
/// replaced by `ModifyDeviceFiles: 0`, or `None` when nothing needs changing (the line says 0,
/// or there is no such line).
pub fn modified_params(content: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(content.len() + 1);
    let mut modified = false;
    let body = content.strip_suffix(b"\n").unwrap_or(content);
    if content.is_empty() {
        return None;
    }
    for line in body.split(|&b| b == b'\n') {
        // bufio.ScanLines drops a trailing '\r'.
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let mut line = line;
        if line.starts_with(b"ModifyDeviceFiles: ") {
            if line == b"ModifyDeviceFiles: 0" {
                return None;
            }
            if line == b"ModifyDeviceFiles: 1" {
                line = b"ModifyDeviceFiles: 0";
                modified = true;
            }
        }
        out.extend_from_slice(line);
        out.push(b'\n');
    }
    modified.then_some(out)
}

/// Reads the host's params file: `None` when it does not exist.
pub fn read_host_params(path: &Path) -> Result<Option<Vec<u8>>, ParamsError> {
    let display = path.display().to_string();
    let io_err = |source| ParamsError::Io {
        path: display.clone(),
        source,
    };
    // Non-blocking, regular, bounded ([`crate::hostfile`]): a FIFO named there must not hang
    // the container's start.
    match crate::hostfile::read(path, MAX_PARAMS) {
        Ok(buf) => Ok(Some(buf)),
        Err(e) if root::is_missing(&e) => Ok(None),
        Err(e) => Err(match crate::hostfile::refused(&e) {
            Some(crate::hostfile::Refused::NotRegular(_)) => {
                ParamsError::NotRegular { path: display }
            }
            Some(crate::hostfile::Refused::TooLarge { .. }) => {
                ParamsError::TooLarge { path: display }
            }
            None => io_err(e),
        }),
    }
}

fn check(ret: libc::c_int) -> io::Result<()> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `mount(2)` with optional source, target and fs type as C strings.
fn mount(
    source: Option<&CString>,
    target: &CString,
    fstype: Option<&CString>,
    flags: libc::c_ulong,
    data: Option<&CString>,
) -> io::Result<()> {
    let ptr = |c: Option<&CString>| c.map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: every pointer is null or a valid NUL-terminated string for the call's duration.
    check(unsafe {
        libc::mount(
            ptr(source),
            target.as_ptr(),
            ptr(fstype),
            flags,
            ptr(data).cast(),
        )
    })
}

/// `fstatfs(2)`'s `f_type`.
fn fs_type(fd: BorrowedFd) -> io::Result<u64> {
    let mut sfs = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: live fd and writable memory of the right size.
    check(unsafe { libc::fstatfs(fd.as_raw_fd(), sfs.as_mut_ptr()) })?;
    // SAFETY: fstatfs succeeded, so `sfs` is initialised.
    let sfs = unsafe { sfs.assume_init() };
    // `f_type` is signed or unsigned, 32 or 64 bits, depending on the architecture.
    Ok(sfs.f_type as u64 & 0xffff_ffff)
}

/// The scratch tmpfs: a directory made under the root fd with a tmpfs mounted on it. Dropping
/// it detaches the tmpfs (the bind mount of the copy keeps the copy alive) and removes the
/// directory.
struct Scratch<'a> {
    root: &'a Root,
    name: String,
    /// Whether the hook made the directory (and so removes it).
    created: bool,
    /// The tmpfs's root, once mounted.
    mounted: Option<OwnedFd>,
}

impl Scratch<'_> {
    fn new(root: &Root) -> io::Result<Scratch<'_>> {
        let name = format!(".nvshim-params-{}", std::process::id());
        let c = CString::new(name.as_bytes())
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // A single component directly under the root fd: nothing of the image's is walked. An
        // existing entry of that name is used only if it is a directory (O_NOFOLLOW below), and
        // then left in place.
        // SAFETY: valid C string and a live directory fd.
        let ret = unsafe { libc::mkdirat(root.fd().as_raw_fd(), c.as_ptr(), 0o700) };
        let created = ret == 0;
        if !created {
            let err = io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EEXIST) {
                return Err(err);
            }
        }
        let mut scratch = Scratch {
            root,
            name,
            created,
            mounted: None,
        };
        let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW;
        let dir = root::openat(root.fd(), scratch.name.as_bytes(), flags, 0)?;
        let tmpfs = CString::from(c"tmpfs");
        let data = CString::from(c"mode=0755,size=1m,nr_inodes=16");
        mount(
            Some(&tmpfs),
            &root::proc_fd_path(dir.as_fd())?,
            Some(&tmpfs),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            Some(&data),
        )?;
        // `dir` still names the directory under the tmpfs; the name now leads to its root.
        let top = root::openat(root.fd(), scratch.name.as_bytes(), flags, 0)?;
        let is_tmpfs = fs_type(top.as_fd())? == TMPFS_MAGIC;
        let top_path = root::proc_fd_path(top.as_fd())?;
        scratch.mounted = Some(top);
        if !is_tmpfs {
            return Err(io::Error::from_raw_os_error(libc::EXDEV));
        }
        mount(None, &top_path, None, libc::MS_PRIVATE, None)?;
        Ok(scratch)
    }

    /// Writes `content` as a new file in the tmpfs and returns an `O_PATH` fd on it.
    fn write(&self, content: &[u8]) -> io::Result<OwnedFd> {
        let top = self
            .mounted
            .as_ref()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EIO))?;
        root::replace_file(top.as_fd(), COPY_NAME, content, 0o444)?;
        root::openat(
            top.as_fd(),
            COPY_NAME.as_bytes(),
            libc::O_PATH | libc::O_NOFOLLOW,
            0,
        )
    }
}

impl Drop for Scratch<'_> {
    fn drop(&mut self) {
        if let Some(top) = self.mounted.take() {
            if let Ok(path) = root::proc_fd_path(top.as_fd()) {
                // SAFETY: a valid C string; the result is deliberately ignored (cleanup).
                unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
            }
        }
        if !self.created {
            return;
        }
        if let Ok(c) = CString::new(self.name.as_bytes()) {
            // SAFETY: valid C string and live fd; the result is deliberately ignored (cleanup).
            unsafe { libc::unlinkat(self.root.fd().as_raw_fd(), c.as_ptr(), libc::AT_REMOVEDIR) };
        }
    }
}

/// Mounts `content` read-only over the container's params file. `Ok(false)` when the target
/// does not exist (no driver proc in the container).
pub fn mount_params(root: &Root, content: &[u8]) -> Result<bool, ParamsError> {
    let display = root.display(CONTAINER_PARAMS);
    let io_err = |source| ParamsError::Io {
        path: display.clone(),
        source,
    };
    let mount_err = |what: &str, source| ParamsError::Mount {
        what: format!("{what} {display}"),
        source,
    };
    // The final component is not followed: a symlink there is refused below, not resolved.
    let target = match root.open_at(CONTAINER_PARAMS, libc::O_PATH | libc::O_NOFOLLOW, 0, false) {
        Ok(fd) => fd,
        Err(e) if root::is_missing(&e) => return Ok(false),
        Err(e) => return Err(io_err(e)),
    };
    let st = root::fstat(target.as_fd()).map_err(io_err)?;
    if !root::is_regular(&st) {
        return Err(ParamsError::NotRegular { path: display });
    }
    let scratch = Scratch::new(root).map_err(|e| ParamsError::Mount {
        what: format!(
            "mounting a scratch tmpfs at {}",
            root.display(format!(".nvshim-params-{}", std::process::id()))
        ),
        source: e,
    })?;
    let copy = scratch
        .write(content)
        .map_err(|e| mount_err("writing the copy for", e))?;
    let copy_st = root::fstat(copy.as_fd()).map_err(io_err)?;
    let source = root::proc_fd_path(copy.as_fd()).map_err(io_err)?;
    let target_path = root::proc_fd_path(target.as_fd()).map_err(io_err)?;
    mount(Some(&source), &target_path, None, libc::MS_BIND, None)
        .map_err(|e| mount_err("bind-mounting over", e))?;
    // The target fd names what is under the new mount; resolve the path again to reach the new
    // mount, check it is the copy, and make that mount read-only through its own fd.
    let result = (|| {
        let top = root
            .open_at(CONTAINER_PARAMS, libc::O_PATH | libc::O_NOFOLLOW, 0, false)
            .map_err(io_err)?;
        let top_st = root::fstat(top.as_fd()).map_err(io_err)?;
        if (top_st.st_dev, top_st.st_ino) != (copy_st.st_dev, copy_st.st_ino) {
            return Err(io_err(io::Error::from_raw_os_error(libc::EAGAIN)));
        }
        let top_path = root::proc_fd_path(top.as_fd()).map_err(io_err)?;
        mount(
            None,
            &top_path,
            None,
            libc::MS_REMOUNT
                | libc::MS_BIND
                | libc::MS_RDONLY
                | libc::MS_NOSUID
                | libc::MS_NODEV
                | libc::MS_NOEXEC,
            None,
        )
        .map_err(|e| mount_err("remounting read-only", e))?;
        mount(None, &top_path, None, libc::MS_PRIVATE, None)
            .map_err(|e| mount_err("making private", e))?;
        Ok(top_path)
    })();
    if let Err(e) = result {
        // Undo the bind rather than leave a writable copy: detach the mount the copy is on.
        if let Ok(top) = root.open_at(CONTAINER_PARAMS, libc::O_PATH | libc::O_NOFOLLOW, 0, false) {
            if root::fstat(top.as_fd())
                .is_ok_and(|s| (s.st_dev, s.st_ino) == (copy_st.st_dev, copy_st.st_ino))
            {
                if let Ok(p) = root::proc_fd_path(top.as_fd()) {
                    // SAFETY: a valid C string; best-effort cleanup.
                    unsafe { libc::umount2(p.as_ptr(), libc::MNT_DETACH) };
                }
            }
        }
        return Err(e);
    }
    drop(scratch);
    Ok(true)
}

/// The copy the container should see: `None` when the host's file (normally [`HOST_PARAMS`]) is
/// missing or allows no device node modification. Read before the container's state, as
/// NVIDIA's hook does.
pub fn wanted(host_params: &Path) -> Result<Option<Vec<u8>>, ParamsError> {
    Ok(read_host_params(host_params)?.and_then(|host| modified_params(&host)))
}

/// Mounts `content` (from [`wanted`]) over the container's params file.
pub fn apply(root: &Root, content: &[u8]) -> Result<Report, ParamsError> {
    let mut report = Report::default();
    if mount_params(root, content)? {
        report.mounted = Some(CONTAINER_PARAMS.into());
    } else {
        report.skipped = Some(format!(
            "{}: not in the container (no driver proc there); not masked",
            root.display(CONTAINER_PARAMS)
        ));
    }
    Ok(report)
}

/// The whole hook: [`wanted`], then [`apply`] when there is something to mount.
pub fn run(root: &Root, host_params: &Path) -> Result<Report, ParamsError> {
    match wanted(host_params)? {
        Some(content) => apply(root, &content),
        None => Ok(Report::default()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REAL: &str = "ResmanDebugLevel: 4294967295\nRmLogonRC: 1\nModifyDeviceFiles: 1\nDeviceFileUID: 0\nDeviceFileGID: 0\nDeviceFileMode: 438\n";

    #[test]
    fn params_are_modified_as_nvidia_does() {
        let out = modified_params(REAL.as_bytes()).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            REAL.replace("ModifyDeviceFiles: 1", "ModifyDeviceFiles: 0")
        );
        // Already 0, no such line, empty: nothing to do.
        assert_eq!(modified_params(b"ModifyDeviceFiles: 0\n"), None);
        assert_eq!(modified_params(b"ResmanDebugLevel: 1\n"), None);
        assert_eq!(modified_params(b""), None);
        // 0 anywhere stops, as NVIDIA's early return does.
        assert_eq!(
            modified_params(b"ModifyDeviceFiles: 1\nModifyDeviceFiles: 0\n"),
            None
        );
        // Scanner lines: no final newline, CRLF, and every line written with '\n'.
        assert_eq!(
            modified_params(b"A: 1\r\nModifyDeviceFiles: 1").unwrap(),
            b"A: 1\nModifyDeviceFiles: 0\n"
        );
        // Other values are left alone, and alone do not ask for a change.
        assert_eq!(modified_params(b"ModifyDeviceFiles: 2\n"), None);
    }

    #[test]
    fn host_params_are_read_bounded_and_regular_only() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_host_params(&dir.path().join("missing")).unwrap(), None);
        let p = dir.path().join("params");
        std::fs::write(&p, REAL).unwrap();
        assert_eq!(read_host_params(&p).unwrap().unwrap(), REAL.as_bytes());
        std::fs::write(&p, vec![b'x'; MAX_PARAMS as usize + 1]).unwrap();
        assert!(matches!(
            read_host_params(&p),
            Err(ParamsError::TooLarge { .. })
        ));
        let fifo = dir.path().join("fifo");
        let c = CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        assert!(matches!(
            read_host_params(&fifo),
            Err(ParamsError::NotRegular { .. })
        ));
    }
}
