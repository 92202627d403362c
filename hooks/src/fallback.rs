//! The host's ldconfig, isolated: used only where the native cache writer cannot be, that is
//! on a machine other than x86-64 and aarch64, whose ldconfig flag and hwcap rules
//! (`sysdeps/unix/sysv/linux/*/readelflib.c`, `dl-hwcap.h`) are not ported.
//!
//! The hardening follows what NVIDIA's hook does since CVE-2025-23267 and CVE-2024-0136/0137
//! (an image's `LD_PRELOAD` library ran as root through a hook), minus the parts a static
//! binary does not need:
//! - never a binary from the container: the host path is opened before anything else and its
//!   contents copied into a sealed memfd, which is what gets executed (runc's CVE-2019-5736 fix,
//!   NVIDIA PR#941), so nothing in the container can write to the binary while it runs;
//! - an empty environment (CVE-2025-23266: no `LD_PRELOAD`, no `LD_LIBRARY_PATH`);
//! - a private mount namespace of its own, in which the container's `/proc` and `/sys` are
//!   covered by empty read-only tmpfs mounts, so that `/proc/<pid>/root` and friends cannot lead
//!   ldconfig out of the root; then `chroot` into the root, so every path ldconfig opens,
//!   writes or links resolves inside it (`-r` would chroot too, but only after ldconfig starts);
//! - a time limit: ldconfig opens libraries without `O_NONBLOCK` and blocks forever on a FIFO
//!   named like one.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::root::Root;

/// NVIDIA's default (`--ldconfig-path`).
pub const DEFAULT_LDCONFIG: &str = "/sbin/ldconfig";
/// Largest ldconfig binary copied (Debian's static ldconfig is about 1 MiB).
const MAX_BINARY: u64 = 64 << 20;
/// How long ldconfig may run.
const TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, Error)]
pub enum FallbackError {
    #[error("host ldconfig {path}: {source}")]
    Binary {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("host ldconfig {path}: {what}: {source}")]
    Spawn {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("host ldconfig {path} failed in {root}: {status}")]
    Failed {
        path: PathBuf,
        root: String,
        status: String,
    },
}

/// NVIDIA's normalisation: a leading `@` means "host path" (the only kind accepted here), and
/// Debian's `ldconfig.real` is preferred when it exists next to the wrapper.
pub fn host_ldconfig(path: &Path) -> PathBuf {
    let raw = path.to_string_lossy();
    let path = PathBuf::from(raw.strip_prefix('@').unwrap_or(&raw));
    let real = PathBuf::from(format!("{}.real", path.display()));
    if real.is_file() {
        real
    } else {
        path
    }
}

/// Copies the binary into a sealed memfd.
fn sealed_copy(path: &Path) -> io::Result<OwnedFd> {
    // Non-blocking, regular ([`crate::hostfile`]); an ldconfig is about 1 MB.
    let (mut src, _) = crate::hostfile::open(path, 256 << 20)?;
    let name =
        CString::new("nvshim-ldconfig").map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: valid C string; memfd_create returns a new fd or -1.
    let fd =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: memfd_create returned a new fd that nothing else owns.
    let memfd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut dst = File::from(memfd);
    let copied = io::copy(&mut (&mut src).take(MAX_BINARY + 1), &mut dst)?;
    if copied > MAX_BINARY {
        return Err(io::Error::from_raw_os_error(libc::EFBIG));
    }
    let seals = libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
    // SAFETY: live fd; F_ADD_SEALS takes an int argument.
    if unsafe { libc::fcntl(dst.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(OwnedFd::from(dst))
}

/// Runs the host ldconfig (`path`) on `root` and waits for it.
pub fn run(root: &Root, path: &Path) -> Result<(), FallbackError> {
    let path = host_ldconfig(path);
    let binary = sealed_copy(&path).map_err(|source| FallbackError::Binary {
        path: path.clone(),
        source,
    })?;
    let spawn_err = |what, source| FallbackError::Spawn {
        path: path.clone(),
        what,
        source,
    };
    // Everything the child needs is prepared before fork: it only makes system calls.
    let c = |s: &str| {
        CString::new(s)
            .map_err(|_| spawn_err("argument", io::Error::from_raw_os_error(libc::EINVAL)))
    };
    let argv_c = [
        c("ldconfig")?,
        c("-f")?,
        c("/etc/ld.so.conf")?,
        c("-C")?,
        c("/etc/ld.so.cache")?,
    ];
    let mut argv: Vec<*const libc::c_char> = argv_c.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let envp: [*const libc::c_char; 1] = [std::ptr::null()];
    let empty = c("")?;
    let dot = c(".")?;
    let slash = c("/")?;
    let tmpfs = c("tmpfs")?;
    let masks: Vec<OwnedFd> = ["/proc", "/sys"]
        .iter()
        .filter_map(|p| {
            root.open_at(p, libc::O_PATH | libc::O_DIRECTORY, 0, false)
                .ok()
        })
        .collect();
    let root_fd = root.fd().as_raw_fd();
    let binary_fd = binary.as_fd().as_raw_fd();

    // SAFETY: fork in a single-threaded process; the child below only calls async-signal-safe
    // system calls on data prepared before the fork, then execs or exits.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(spawn_err("fork", io::Error::last_os_error()));
    }
    if pid == 0 {
        // SAFETY: child side; raw system calls on valid pointers prepared above.
        unsafe {
            let fail = |code: libc::c_int| -> ! { libc::_exit(code) };
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                fail(120);
            }
            if libc::mount(
                std::ptr::null(),
                slash.as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ) != 0
            {
                fail(121);
            }
            for m in &masks {
                if libc::fchdir(m.as_raw_fd()) != 0
                    || libc::mount(
                        tmpfs.as_ptr(),
                        dot.as_ptr(),
                        tmpfs.as_ptr(),
                        libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                        std::ptr::null(),
                    ) != 0
                {
                    fail(122);
                }
            }
            if libc::fchdir(root_fd) != 0
                || libc::chroot(dot.as_ptr()) != 0
                || libc::chdir(slash.as_ptr()) != 0
            {
                fail(123);
            }
            libc::syscall(
                libc::SYS_execveat,
                binary_fd,
                empty.as_ptr(),
                argv.as_ptr(),
                envp.as_ptr(),
                libc::AT_EMPTY_PATH,
            );
            fail(127);
        }
    }
    let start = Instant::now();
    let mut delay = Duration::from_micros(200);
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: `status` is writable; pid is our child.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
                return Ok(());
            }
            let status = if libc::WIFEXITED(status) {
                format!("exit status {}", libc::WEXITSTATUS(status))
            } else {
                format!("signal {}", libc::WTERMSIG(status))
            };
            return Err(FallbackError::Failed {
                path,
                root: root.display("/"),
                status,
            });
        }
        if r < 0 {
            return Err(spawn_err("waitpid", io::Error::last_os_error()));
        }
        if start.elapsed() > TIMEOUT {
            // SAFETY: our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
            return Err(FallbackError::Failed {
                path,
                root: root.display("/"),
                status: format!("killed after {}s", TIMEOUT.as_secs()),
            });
        }
        std::thread::sleep(delay);
        delay = (delay * 2).min(Duration::from_millis(50));
    }
}
