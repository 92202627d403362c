//! Paths inside a container root, resolved by file descriptor.
//!
//! A hook works on a root filesystem that the image controls, from a process whose `/` is still
//! the host's: runc runs createContainer hooks in the container's mount namespace but before
//! pivot_root. A string join such as `format!("{root}/etc/ld.so.cache")` follows an image
//! symlink `etc -> /` straight onto the host; that is CVE-2024-0134 (create-symlinks) and
//! CVE-2025-23267 (update-ldcache), docs/field-notes.md §3. So the root is opened once as a
//! directory fd and every path below it is resolved against that fd with
//! `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`: absolute symlinks and `..` stop at the
//! root, and magic links such as `/proc/self/root` are refused.
//!
//! Kernels before 5.6 have no openat2 (Ubuntu 20.04's 5.4, RHEL 8's 4.18), so the same rules are
//! also implemented in user space, used when openat2 answers ENOSYS: a walk one component at a
//! time with `O_PATH|O_NOFOLLOW`, reading each symlink with `readlinkat` and restarting at the
//! root fd for absolute targets, `..` popping a stack of directory fds that never goes above the
//! root. Magic links are read as plain strings there, so they resolve inside the root too.
//! `no_xdev` compares mount ids, as the kernel does (`statx` `STATX_MNT_ID` from Linux 5.8, else
//! `mnt_id:` in `/proc/self/fdinfo`, there since 3.15): comparing `st_dev` instead would let
//! the walk into a bind mount of the host filesystem the root itself lives on (a rootfs on the
//! host's `/var` with a host directory from `/var` mounted into it), and a write there lands on
//! the host. Only where neither source answers is `st_dev` compared. One difference from the
//! kernel remains, harmless in a createContainer hook: the walk does not notice a directory
//! being renamed out of the root under it (openat2 answers EAGAIN); while the hook runs, the
//! container's only process is its blocked init.
//!
//! Written here rather than taken from the `pathrs` crate: the hooks need a handful of
//! operations, and a short-lived hook should not pay for libpathrs' procfs handles at start-up.
//!
//! Writes never open an existing file. A new file or symlink is made under a temporary name with
//! `O_CREAT|O_EXCL|O_NOFOLLOW` (or `symlinkat`) in a directory fd and renamed over the final
//! name, so a symlink, FIFO or device node at the final name is replaced, never written through;
//! a directory there makes the rename fail.
//!
//! One file (970 lines of code, 240 of tests): one security rule, "nothing below the root leads out
//! of it", implemented twice (openat2 and the user-space walk, which must agree) and used by the
//! fd-relative reads and replacing writes beside them; keeping them together lets the rule be
//! reviewed in one place.

use std::cell::Cell;
use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::Path;

use thiserror::Error;

/// Symlinks followed in one resolution, as the kernel's `MAXSYMLINKS`.
const MAX_SYMLINKS: u32 = 40;
/// Longest symlink target read (`PATH_MAX`).
const MAX_LINK_LEN: usize = 4096;
/// Most entries read from one directory. A real library directory has a few thousand.
pub const MAX_DIR_ENTRIES: usize = 200_000;

#[derive(Debug, Error)]
pub enum RootError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("{path}: not a regular file")]
    NotRegular { path: String },
    #[error("{path}: {size} bytes, more than the {limit} accepted")]
    TooLarge { path: String, size: u64, limit: u64 },
    #[error("{path}: more than {MAX_DIR_ENTRIES} directory entries")]
    TooManyEntries { path: String },
}

impl RootError {
    /// The underlying errno, if this is an I/O error.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            RootError::Io { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

/// How a path is resolved below the root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolver {
    /// `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)` (Linux 5.6).
    Openat2,
    /// The user-space walk described in the module documentation.
    Walk,
}

/// One directory entry from [`read_dir`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEnt {
    pub name: Vec<u8>,
    /// `d_type`: `libc::DT_REG`, `DT_LNK`, `DT_DIR`, `DT_UNKNOWN`, ...
    pub kind: u8,
}

/// A container root filesystem, opened once.
#[derive(Debug)]
pub struct Root {
    fd: OwnedFd,
    dev: u64,
    /// The root's mount ([`mount_id`]); `None` where the kernel tells no mount ids.
    mnt: Option<u64>,
    display: String,
    resolver: Cell<Resolver>,
}

/// `struct open_how` from `linux/openat2.h` (libc's is `non_exhaustive`).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

const RESOLVE_NO_XDEV: u64 = 0x01;
const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
const RESOLVE_IN_ROOT: u64 = 0x10;

fn cstring(path: &[u8]) -> io::Result<CString> {
    CString::new(path).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// `openat(2)` relative to `dir`, always with `O_CLOEXEC`.
pub fn openat(dir: BorrowedFd, name: &[u8], flags: libc::c_int, mode: u32) -> io::Result<OwnedFd> {
    let c = cstring(name)?;
    // SAFETY: `c` is a valid NUL-terminated string and `dir` a live fd for the call's duration.
    let fd = check(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            flags | libc::O_CLOEXEC,
            mode as libc::c_uint,
        )
    })?;
    // SAFETY: openat returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `fstat(2)`.
pub fn fstat(fd: BorrowedFd) -> io::Result<libc::stat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `st` is writable memory of the right size; fstat fills it on success.
    check(unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) })?;
    // SAFETY: fstat succeeded, so `st` is initialised.
    Ok(unsafe { st.assume_init() })
}

/// `fstatat(2)` with `AT_SYMLINK_NOFOLLOW`: the entry itself, not what it points to.
pub fn lstatat(dir: BorrowedFd, name: &[u8]) -> io::Result<libc::stat> {
    let c = cstring(name)?;
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: valid C string, live fd, writable `st`.
    check(unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            c.as_ptr(),
            st.as_mut_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    // SAFETY: fstatat succeeded.
    Ok(unsafe { st.assume_init() })
}

/// `readlinkat(2)`; an empty `name` reads the link that `dir` itself is (an `O_PATH` fd).
pub fn readlinkat(dir: BorrowedFd, name: &[u8]) -> io::Result<Vec<u8>> {
    let c = cstring(name)?;
    // Not zero-filled: this runs for every link a scan meets.
    let mut buf = std::mem::MaybeUninit::<[u8; MAX_LINK_LEN + 1]>::uninit();
    // SAFETY: `buf` has MAX_LINK_LEN + 1 writable bytes; readlinkat writes at most that many.
    let n = unsafe {
        libc::readlinkat(
            dir.as_raw_fd(),
            c.as_ptr(),
            buf.as_mut_ptr().cast(),
            MAX_LINK_LEN + 1,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let n = n as usize;
    if n > MAX_LINK_LEN {
        return Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG));
    }
    // SAFETY: readlinkat initialised the first `n` bytes.
    let bytes = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), n) };
    Ok(bytes.to_vec())
}

fn is_kind(st: &libc::stat, kind: libc::mode_t) -> bool {
    st.st_mode & libc::S_IFMT == kind
}

/// True for a regular file.
pub fn is_regular(st: &libc::stat) -> bool {
    is_kind(st, libc::S_IFREG)
}

/// True for a directory.
pub fn is_dir(st: &libc::stat) -> bool {
    is_kind(st, libc::S_IFDIR)
}

/// True for a symbolic link.
pub fn is_symlink(st: &libc::stat) -> bool {
    is_kind(st, libc::S_IFLNK)
}

/// The components of a container path; `/` and empty components dropped.
fn components(path: &[u8]) -> impl DoubleEndedIterator<Item = &[u8]> {
    path.split(|&b| b == b'/').filter(|c| !c.is_empty())
}

impl Root {
    /// Opens the container root (a host path from the runtime, trusted).
    pub fn open(path: &Path) -> Result<Root, RootError> {
        let display = path.display().to_string();
        let io_err = |source| RootError::Io {
            path: display.clone(),
            source,
        };
        let c = cstring(path.as_os_str().as_encoded_bytes()).map_err(io_err)?;
        // SAFETY: valid C string.
        let fd = check(unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        })
        .map_err(io_err)?;
        // SAFETY: open returned a new fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Root::from_fd(
            fd,
            display.trim_end_matches('/').to_string(),
            Resolver::Openat2,
        )
        .map_err(io_err)
    }

    fn from_fd(fd: OwnedFd, display: String, resolver: Resolver) -> io::Result<Root> {
        let st = fstat(fd.as_fd())?;
        Ok(Root {
            mnt: mount_id(fd.as_fd()),
            fd,
            dev: st.st_dev,
            display,
            resolver: Cell::new(resolver),
        })
    }

    /// The directory `name` directly below the root, as a root of its own: the one way across a
    /// mount boundary that the hooks take, for the container's `/dev` (the runtime's tmpfs,
    /// where CDI specs put `/dev/dri/by-path` links). `name` itself must be a real directory,
    /// not a symlink: an image's `dev -> /run/some-volume` is refused (ENOTDIR).
    pub fn child(&self, name: &str) -> Result<Root, RootError> {
        let display = format!("{}/{name}", self.display);
        let io_err = |source| RootError::Io {
            path: display.clone(),
            source,
        };
        if name.is_empty() || name.contains('/') || name == "." || name == ".." {
            return Err(io_err(io::Error::from_raw_os_error(libc::EINVAL)));
        }
        let fd = openat(
            self.fd.as_fd(),
            name.as_bytes(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            0,
        )
        .map_err(io_err)?;
        Root::from_fd(fd, display.clone(), self.resolver.get()).map_err(io_err)
    }

    /// Whether `fd` (with `st`, its `fstat`) is on the root's mount.
    fn same_mount(&self, fd: BorrowedFd, st: &libc::stat) -> bool {
        match (self.mnt, mount_id(fd)) {
            (Some(root), Some(here)) => root == here,
            _ => st.st_dev == self.dev,
        }
    }

    /// Chooses the resolver (tests run every escape fixture through both).
    pub fn set_resolver(&self, resolver: Resolver) {
        self.resolver.set(resolver);
    }

    /// The resolver in use.
    pub fn resolver(&self) -> Resolver {
        self.resolver.get()
    }

    /// The device of the root directory (`st_dev`).
    pub fn dev(&self) -> u64 {
        self.dev
    }

    /// The root directory fd (`O_PATH`).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// `<root><path>`, for messages only: never opened as a string.
    pub fn display(&self, path: impl AsRef<[u8]>) -> String {
        let path = String::from_utf8_lossy(path.as_ref());
        if path.starts_with('/') {
            format!("{}{}", self.display, path)
        } else {
            format!("{}/{}", self.display, path)
        }
    }

    fn io_error(&self, path: impl AsRef<[u8]>, source: io::Error) -> RootError {
        RootError::Io {
            path: self.display(path),
            source,
        }
    }

    /// Opens `path` below the root with `flags` (`O_CLOEXEC` is added), resolving every symlink
    /// inside the root. `no_xdev` refuses to cross into another mount.
    pub fn open_at(
        &self,
        path: impl AsRef<[u8]>,
        flags: libc::c_int,
        mode: u32,
        no_xdev: bool,
    ) -> io::Result<OwnedFd> {
        let path = path.as_ref();
        if self.resolver.get() == Resolver::Openat2 {
            match self.openat2(path, flags, mode, no_xdev) {
                Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
                    self.resolver.set(Resolver::Walk)
                }
                other => return other,
            }
        }
        self.walk(path, flags, mode, no_xdev)
    }

    fn openat2(
        &self,
        path: &[u8],
        flags: libc::c_int,
        mode: u32,
        no_xdev: bool,
    ) -> io::Result<OwnedFd> {
        let c = cstring(path)?;
        let mut resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
        if no_xdev {
            resolve |= RESOLVE_NO_XDEV;
        }
        let how = OpenHow {
            flags: (flags | libc::O_CLOEXEC) as u64,
            // openat2 rejects a mode without O_CREAT.
            mode: if flags & libc::O_CREAT != 0 {
                u64::from(mode)
            } else {
                0
            },
            resolve,
        };
        // RESOLVE_IN_ROOT answers EAGAIN when a rename or mount raced the lookup: retry a few
        // times (Documentation/filesystems/path-lookup, openat2(2)).
        for _ in 0..16 {
            // SAFETY: `c` and `how` are valid for the call; the size matches `struct open_how`.
            let fd = unsafe {
                libc::syscall(
                    libc::SYS_openat2,
                    self.fd.as_raw_fd(),
                    c.as_ptr(),
                    &how as *const OpenHow,
                    std::mem::size_of::<OpenHow>(),
                )
            };
            if fd >= 0 {
                // SAFETY: openat2 returned a new fd that nothing else owns.
                return Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) });
            }
            let err = io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EAGAIN) {
                return Err(err);
            }
        }
        Err(io::Error::from_raw_os_error(libc::EAGAIN))
    }

    /// The user-space resolver (see the module documentation).
    fn walk(
        &self,
        path: &[u8],
        flags: libc::c_int,
        mode: u32,
        no_xdev: bool,
    ) -> io::Result<OwnedFd> {
        // Components still to resolve, in order; a symlink's target is pushed to the front.
        let mut pending: Vec<Vec<u8>> = components(path).rev().map(<[u8]>::to_vec).collect();
        // Directories entered below the root; empty means "at the root".
        let mut stack: Vec<OwnedFd> = Vec::new();
        let mut links = 0u32;
        while let Some(name) = pending.pop() {
            if name == b"." {
                continue;
            }
            if name == b".." {
                stack.pop();
                continue;
            }
            let last = pending.is_empty();
            let dir = stack.last().map_or(self.fd.as_fd(), |d| d.as_fd());
            let fd = match openat(dir, &name, libc::O_PATH | libc::O_NOFOLLOW, 0) {
                Ok(fd) => fd,
                Err(e)
                    if last
                        && e.raw_os_error() == Some(libc::ENOENT)
                        && flags & libc::O_CREAT != 0 =>
                {
                    return openat(dir, &name, flags | libc::O_NOFOLLOW, mode);
                }
                Err(e) => return Err(e),
            };
            if last && flags & libc::O_CREAT != 0 && flags & libc::O_EXCL != 0 {
                return Err(io::Error::from_raw_os_error(libc::EEXIST));
            }
            let st = fstat(fd.as_fd())?;
            if is_symlink(&st) {
                if last && flags & libc::O_NOFOLLOW != 0 {
                    if flags & libc::O_PATH != 0 {
                        return Ok(fd);
                    }
                    return Err(io::Error::from_raw_os_error(libc::ELOOP));
                }
                links += 1;
                if links > MAX_SYMLINKS {
                    return Err(io::Error::from_raw_os_error(libc::ELOOP));
                }
                let target = readlinkat(fd.as_fd(), b"")?;
                if target.first() == Some(&b'/') {
                    stack.clear();
                }
                pending.extend(components(&target).rev().map(<[u8]>::to_vec));
                continue;
            }
            if no_xdev && !self.same_mount(fd.as_fd(), &st) {
                return Err(io::Error::from_raw_os_error(libc::EXDEV));
            }
            if last {
                return reopen(dir, &name, fd, &st, flags, mode);
            }
            if !is_dir(&st) {
                return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
            }
            stack.push(fd);
        }
        // The path named a directory reached through `..`, `.` or a symlink: reopen it.
        let dir = stack.last().map_or(self.fd.as_fd(), |d| d.as_fd());
        if flags & libc::O_CREAT != 0 && flags & libc::O_EXCL != 0 {
            return Err(io::Error::from_raw_os_error(libc::EEXIST));
        }
        openat(dir, b".", flags & !(libc::O_CREAT | libc::O_EXCL), 0)
    }

    /// `stat` of `path`, following symlinks inside the root; `None` when it does not exist.
    pub fn stat(&self, path: impl AsRef<[u8]>) -> io::Result<Option<libc::stat>> {
        match self.open_at(path, libc::O_PATH, 0, false) {
            Ok(fd) => fstat(fd.as_fd()).map(Some),
            Err(e) if is_missing(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Opens a regular file for reading; `None` when it does not exist. Anything else (FIFO,
    /// device, directory, socket) is an error *before* it is opened for reading, so a FIFO
    /// cannot block and a device's open has no side effect.
    pub fn open_regular(&self, path: impl AsRef<[u8]>) -> Result<Option<(File, u64)>, RootError> {
        let path = path.as_ref();
        let fd = match self.open_at(path, libc::O_PATH, 0, false) {
            Ok(fd) => fd,
            Err(e) if is_missing(&e) => return Ok(None),
            Err(e) => return Err(self.io_error(path, e)),
        };
        let st = fstat(fd.as_fd()).map_err(|e| self.io_error(path, e))?;
        if !is_regular(&st) {
            return Err(RootError::NotRegular {
                path: self.display(path),
            });
        }
        let file = self
            .open_at(
                path,
                libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY,
                0,
                false,
            )
            .map_err(|e| self.io_error(path, e))?;
        let st2 = fstat(file.as_fd()).map_err(|e| self.io_error(path, e))?;
        if (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino) || !is_regular(&st2) {
            return Err(self.io_error(path, io::Error::from_raw_os_error(libc::EAGAIN)));
        }
        Ok(Some((File::from(file), st2.st_size as u64)))
    }

    /// Reads a whole regular file of at most `limit` bytes; `None` when it does not exist.
    /// Bigger is an error found from `fstat` before anything is read (a 2 GiB sparse file costs
    /// nothing).
    pub fn read_regular(
        &self,
        path: impl AsRef<[u8]>,
        limit: u64,
    ) -> Result<Option<Vec<u8>>, RootError> {
        let path = path.as_ref();
        let Some((file, size)) = self.open_regular(path)? else {
            return Ok(None);
        };
        if size > limit {
            return Err(RootError::TooLarge {
                path: self.display(path),
                size,
                limit,
            });
        }
        read_bounded(&file, size, limit)
            .map(Some)
            .map_err(|e| match e {
                ReadError::Io(source) => self.io_error(path, source),
                ReadError::TooLarge(size) => RootError::TooLarge {
                    path: self.display(path),
                    size,
                    limit,
                },
            })
    }

    /// Opens a directory for listing; `None` when it does not exist.
    pub fn open_dir(
        &self,
        path: impl AsRef<[u8]>,
        no_xdev: bool,
    ) -> Result<Option<OwnedFd>, RootError> {
        let path = path.as_ref();
        match self.open_at(path, libc::O_RDONLY | libc::O_DIRECTORY, 0, no_xdev) {
            Ok(fd) => Ok(Some(fd)),
            Err(e) if is_missing(&e) => Ok(None),
            Err(e) => Err(self.io_error(path, e)),
        }
    }

    /// Opens directory `path` below the root, creating missing components (mode `mode`) inside
    /// the root as it goes. Returns an `O_PATH` directory fd for `*at` calls. A dangling symlink
    /// on the way is an error (ENOENT), as in libpathrs' `MkdirAllHandle`.
    pub fn mkdir_all(&self, path: &str, mode: u32, no_xdev: bool) -> Result<OwnedFd, RootError> {
        let flags = libc::O_PATH | libc::O_DIRECTORY;
        // The whole path first: where it exists (every link of a GPU container's driver goes
        // in one directory) the walk below would end by opening this same path, with the same
        // resolution, after two calls per component (80 of the hooks' 370 system calls for the
        // ten links of the bench's legacy container, strace). Any error walks, for the
        // component the error names.
        if let Ok(fd) = self.open_at(path, flags, 0, no_xdev) {
            return Ok(fd);
        }
        let mut prefix = String::new();
        let mut dir = self
            .open_at("/", flags, 0, no_xdev)
            .map_err(|e| self.io_error("/", e))?;
        for comp in path.split('/').filter(|c| !c.is_empty() && *c != ".") {
            prefix.push('/');
            prefix.push_str(comp);
            dir = match self.open_at(&prefix, flags, 0, no_xdev) {
                Ok(fd) => fd,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    let c = cstring(comp.as_bytes()).map_err(|e| self.io_error(&prefix, e))?;
                    // SAFETY: valid C string and a live directory fd.
                    let ret =
                        unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), mode as libc::mode_t) };
                    if ret < 0 {
                        let err = io::Error::last_os_error();
                        if err.raw_os_error() != Some(libc::EEXIST) {
                            return Err(self.io_error(&prefix, err));
                        }
                    }
                    self.open_at(&prefix, flags, 0, no_xdev)
                        .map_err(|e| self.io_error(&prefix, e))?
                }
                Err(e) => return Err(self.io_error(&prefix, e)),
            };
        }
        Ok(dir)
    }
}

impl Root {
    /// The canonical path of `path` below the root: every symlink resolved inside the root (an
    /// absolute target restarts at the root, `..` stops there), `.` and `..` removed, as
    /// `filepath-securejoin` resolves NVIDIA's CUDA compat directory before naming it in an
    /// `ld.so.conf.d` file. The walk is the user-space resolver's (module documentation); the
    /// answer is checked by opening it with the current resolver and comparing the inode with
    /// what `path` itself resolves to (EAGAIN if they differ).
    pub fn real_path(&self, path: &str) -> io::Result<String> {
        let mut pending: Vec<Vec<u8>> = components(path.as_bytes())
            .rev()
            .map(<[u8]>::to_vec)
            .collect();
        // (name, fd) of each directory entered below the root.
        let mut stack: Vec<(Vec<u8>, OwnedFd)> = Vec::new();
        let mut links = 0u32;
        while let Some(name) = pending.pop() {
            if name == b"." {
                continue;
            }
            if name == b".." {
                stack.pop();
                continue;
            }
            let dir = stack.last().map_or(self.fd.as_fd(), |(_, d)| d.as_fd());
            let fd = openat(dir, &name, libc::O_PATH | libc::O_NOFOLLOW, 0)?;
            let st = fstat(fd.as_fd())?;
            if is_symlink(&st) {
                links += 1;
                if links > MAX_SYMLINKS {
                    return Err(io::Error::from_raw_os_error(libc::ELOOP));
                }
                let target = readlinkat(fd.as_fd(), b"")?;
                if target.first() == Some(&b'/') {
                    stack.clear();
                }
                pending.extend(components(&target).rev().map(<[u8]>::to_vec));
                continue;
            }
            if !pending.is_empty() && !is_dir(&st) {
                return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
            }
            stack.push((name, fd));
        }
        let mut out = Vec::new();
        for (name, _) in &stack {
            out.push(b'/');
            out.extend_from_slice(name);
        }
        if out.is_empty() {
            out.push(b'/');
        }
        let out = String::from_utf8(out).map_err(|_| io::Error::from_raw_os_error(libc::EILSEQ))?;
        let want = fstat(self.open_at(path, libc::O_PATH, 0, false)?.as_fd())?;
        let got = fstat(self.open_at(&out, libc::O_PATH, 0, false)?.as_fd())?;
        if (want.st_dev, want.st_ino) != (got.st_dev, got.st_ino) {
            return Err(io::Error::from_raw_os_error(libc::EAGAIN));
        }
        Ok(out)
    }
}

/// Opens the last component for real once the walk has checked it is not a symlink, and
/// checks that it is still the same inode.
fn reopen(
    dir: BorrowedFd,
    name: &[u8],
    path_fd: OwnedFd,
    st: &libc::stat,
    flags: libc::c_int,
    mode: u32,
) -> io::Result<OwnedFd> {
    if flags & libc::O_DIRECTORY != 0 && !is_dir(st) {
        return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
    }
    if flags & libc::O_PATH != 0 {
        return Ok(path_fd);
    }
    let fd = openat(dir, name, flags | libc::O_NOFOLLOW, mode)?;
    let st2 = fstat(fd.as_fd())?;
    if (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino) {
        return Err(io::Error::from_raw_os_error(libc::EAGAIN));
    }
    Ok(fd)
}

/// The id of the mount `fd` is on: `statx` with `STATX_MNT_ID` (Linux 5.8), else the `mnt_id:`
/// line of `/proc/self/fdinfo/<fd>` (Linux 3.15); `None` when neither answers.
pub fn mount_id(fd: BorrowedFd) -> Option<u64> {
    // SAFETY: an all-zero statx is a valid value of the plain C struct the kernel fills.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: a live fd, an empty C string with AT_EMPTY_PATH (the fd itself), a valid buffer.
    let ret = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_MNT_ID,
            &mut stx,
        )
    };
    if ret == 0 && stx.stx_mask & libc::STATX_MNT_ID != 0 {
        return Some(stx.stx_mnt_id);
    }
    let text = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).ok()?;
    fdinfo_mount_id(&text)
}

/// `mnt_id:` of an fdinfo file.
fn fdinfo_mount_id(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("mnt_id:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Whether the directory `dir` lies strictly below the directory whose `stat` is `ancestor`:
/// `..` is followed up to the top of the tree (the directory that is its own parent), across
/// mounts as the kernel walks them, so a symlink or mount that led elsewhere is seen.
pub fn is_below(dir: BorrowedFd, ancestor: &libc::stat) -> io::Result<bool> {
    let id = |st: &libc::stat| (st.st_dev, st.st_ino);
    let parent = |fd: BorrowedFd| openat(fd, b"..", libc::O_PATH | libc::O_DIRECTORY, 0);
    let mut here = parent(dir)?;
    let mut st = fstat(here.as_fd())?;
    // PATH_MAX / 2: no deeper directory has a path.
    for _ in 0..2048 {
        if id(&st) == id(ancestor) {
            return Ok(true);
        }
        let up = parent(here.as_fd())?;
        let up_st = fstat(up.as_fd())?;
        if id(&up_st) == id(&st) {
            return Ok(false);
        }
        (here, st) = (up, up_st);
    }
    Ok(false)
}

/// ENOENT, or ENOTDIR from a path through a regular file: "not there".
pub fn is_missing(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR))
}

pub(crate) enum ReadError {
    Io(io::Error),
    TooLarge(u64),
}

/// Reads the first `size` bytes (the `fstat` size, already checked against `limit`) of a file:
/// if it grows meanwhile, the rest is not read.
pub(crate) fn read_bounded(file: &File, size: u64, limit: u64) -> Result<Vec<u8>, ReadError> {
    if size > limit {
        return Err(ReadError::TooLarge(size));
    }
    let mut buf = vec![0u8; size as usize];
    let mut done = 0usize;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(ReadError::Io(e)),
        }
    }
    buf.truncate(done);
    Ok(buf)
}

/// Lists a directory fd (opened `O_RDONLY|O_DIRECTORY`) with `getdents64`, in the kernel's
/// order, which is `readdir`'s and so ldconfig's. `.` and `..` are left out.
pub fn read_dir(dir: BorrowedFd) -> io::Result<Vec<DirEnt>> {
    // From the start, also when the fd was listed before (a rescan).
    // SAFETY: live fd; lseek on a directory rewinds its getdents position.
    if unsafe { libc::lseek(dir.as_raw_fd(), 0, libc::SEEK_SET) } < 0 {
        return Err(io::Error::last_os_error());
    }
    read_dir_fresh(dir)
}

/// [`read_dir_fresh`] of the directory at a host path (not in a container root: no
/// resolution beneath a root). What `create` uses in place of std's `read_dir`, which on musl
/// is `opendir`: its `DIR` comes from musl's malloc as a fresh mapping, mapped and unmapped
/// for each directory.
pub fn list_dir(path: &Path) -> io::Result<Vec<DirEnt>> {
    read_dir_fresh(crate::hostfile::open_dir(path)?.as_fd())
}

/// [`read_dir`] of a directory fd just opened (never listed, so at its start): without the
/// rewind, one system call fewer per directory (a walk of a MIG host's `/proc` opens 66).
pub fn read_dir_fresh(dir: BorrowedFd) -> io::Result<Vec<DirEnt>> {
    let out = read_dir_upto(dir, MAX_DIR_ENTRIES + 1)?;
    if out.len() > MAX_DIR_ENTRIES {
        return Err(io::Error::from_raw_os_error(libc::EFBIG));
    }
    Ok(out)
}

/// The first `limit` entries of a directory fd just opened ([`read_dir_fresh`]), in the
/// kernel's order: the rest is not read.
pub fn read_dir_upto(dir: BorrowedFd, limit: usize) -> io::Result<Vec<DirEnt>> {
    let mut out = Vec::new();
    // Not zeroed: the kernel writes what is read (zeroing 32 KiB per directory was an eighth of
    // a GPU container's fix-ups hook, callgrind). One page on the stack: a larger frame is probed
    // page by page, and 32 KiB cost a legacy create five page faults; a directory of more entries
    // takes more calls.
    let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
    loop {
        // SAFETY: `buf` has `buf.len()` writable bytes; getdents64 writes at most that many.
        let n = unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                dir.as_raw_fd(),
                buf.as_mut_ptr(),
                buf.len(),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n == 0 {
            return Ok(out);
        }
        let n = n as usize;
        // SAFETY: getdents64 initialised the first `n` bytes, and `n <= buf.len()`.
        let buf = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), n) };
        let mut at = 0usize;
        // struct linux_dirent64 { u64 d_ino; i64 d_off; u16 d_reclen; u8 d_type; char d_name[]; }
        while at + 19 <= n {
            let reclen = u16::from_ne_bytes([buf[at + 16], buf[at + 17]]) as usize;
            if reclen < 19 || at + reclen > n {
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
            let kind = buf[at + 18];
            let name_bytes = &buf[at + 19..at + reclen];
            let len = name_bytes
                .iter()
                .position(|&b| b == 0)
                .unwrap_or(name_bytes.len());
            let name = &name_bytes[..len];
            if name != b"." && name != b".." {
                if out.len() >= limit {
                    return Ok(out);
                }
                out.push(DirEnt {
                    name: name.to_vec(),
                    kind,
                });
            }
            at += reclen;
        }
    }
}

/// A name for a temporary file next to `name`, unique to this process (whose id is asked
/// once: a GPU container's fixups make ten links and more).
fn temp_name(name: &[u8]) -> Vec<u8> {
    static PID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    let mut tmp = b".".to_vec();
    tmp.extend_from_slice(name);
    tmp.extend_from_slice(format!(".nvshim-{}", PID.get_or_init(std::process::id)).as_bytes());
    tmp
}

/// Removes the entry `dir/name` (never a directory; a symlink itself, not its target). A
/// missing entry is not an error.
pub fn remove_file(dir: BorrowedFd, name: &str) -> io::Result<()> {
    let c = cstring(name.as_bytes())?;
    // SAFETY: valid C string and a live fd.
    match check(unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), 0) }) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        other => other.map(drop),
    }
}

/// `statfs` magic of procfs (`linux/magic.h`).
const PROC_SUPER_MAGIC: u64 = 0x9fa0;

/// `/proc/self/fd/N` for `fd`: the name through which a path-only system call (`mount`,
/// `chmod`) reaches exactly the inode, and the mount, that `fd` holds, as runc's
/// `utils.WithProcfd` does. The hook's `/proc` is the host's (a createContainer hook runs before
/// pivot_root), which the image cannot replace; it is still checked to be procfs, so that a
/// missing or mounted-over `/proc` is an error rather than a path resolved somewhere else.
pub fn proc_fd_path(fd: BorrowedFd) -> io::Result<CString> {
    let mut sfs = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: a constant C string and writable memory of the right size.
    check(unsafe { libc::statfs(c"/proc/self/fd".as_ptr(), sfs.as_mut_ptr()) })?;
    // SAFETY: statfs succeeded, so `sfs` is initialised.
    let sfs = unsafe { sfs.assume_init() };
    // `f_type` is signed or unsigned, 32 or 64 bits, depending on the architecture.
    if sfs.f_type as u64 & 0xffff_ffff != PROC_SUPER_MAGIC {
        return Err(io::Error::from_raw_os_error(libc::EXDEV));
    }
    cstring(format!("/proc/self/fd/{}", fd.as_raw_fd()).as_bytes())
}

fn unlink(dir: BorrowedFd, name: &[u8]) {
    if let Ok(c) = cstring(name) {
        // SAFETY: valid C string and live fd; the result is deliberately ignored (cleanup).
        unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), 0) };
    }
}

fn rename(dir: BorrowedFd, from: &[u8], to: &[u8]) -> io::Result<()> {
    let from_c = cstring(from)?;
    let to_c = cstring(to)?;
    // SAFETY: valid C strings and a live fd.
    check(unsafe {
        libc::renameat(
            dir.as_raw_fd(),
            from_c.as_ptr(),
            dir.as_raw_fd(),
            to_c.as_ptr(),
        )
    })
    .map(drop)
}

/// Creates the temporary name exclusively; a stale one left by a killed run is removed first.
fn create_temp(dir: BorrowedFd, tmp: &[u8], mode: u32) -> io::Result<OwnedFd> {
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
    match openat(dir, tmp, flags, mode) {
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
            unlink(dir, tmp);
            openat(dir, tmp, flags, mode)
        }
        other => other,
    }
}

/// Atomically replaces `dir/name` with a new regular file holding `data` (mode `mode`, not
/// subject to the umask). Whatever was at `name` (file, symlink, FIFO, device) is replaced, not
/// written to; a directory there is an error.
///
/// The file is written nameless (`O_TMPFILE`) and only then linked under its temporary name and
/// renamed over `name`, so a hook killed while writing leaves nothing behind in the image's
/// directory (tests/e2e/reliability.rs kills update-ldcache 200 times). Filesystems without
/// `O_TMPFILE` (overlayfs before Linux 6.6) take the named temporary file from the start.
pub fn replace_file(dir: BorrowedFd, name: &str, data: &[u8], mode: u32) -> io::Result<()> {
    let tmp = temp_name(name.as_bytes());
    let anonymous = match openat(dir, b".", libc::O_TMPFILE | libc::O_WRONLY, mode) {
        Ok(fd) => Some(fd),
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EOPNOTSUPP) | Some(libc::EISDIR) | Some(libc::EINVAL)
            ) =>
        {
            None
        }
        Err(e) => return Err(e),
    };
    let named = anonymous.is_none();
    let fd = match anonymous {
        Some(fd) => fd,
        None => create_temp(dir, &tmp, mode)?,
    };
    let result = (|| {
        let file = File::from(fd);
        let mut done = 0usize;
        while done < data.len() {
            match file.write_at(&data[done..], done as u64) {
                Ok(0) => return Err(io::Error::from_raw_os_error(libc::EIO)),
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        // SAFETY: live fd.
        check(unsafe { libc::fchmod(file.as_raw_fd(), mode as libc::mode_t) })?;
        if !named {
            link_anonymous(file.as_fd(), dir, &tmp)?;
        }
        rename(dir, &tmp, name.as_bytes())
    })();
    if result.is_err() {
        unlink(dir, &tmp);
    }
    result
}

/// Gives an `O_TMPFILE` file the name `dir/name` (a stale entry there, left by a run killed
/// between this link and its rename, is removed first). Through `/proc/self/fd`, which needs
/// no capability, unlike `AT_EMPTY_PATH`.
fn link_anonymous(fd: BorrowedFd, dir: BorrowedFd, name: &[u8]) -> io::Result<()> {
    let from = proc_fd_path(fd)?;
    let to = cstring(name)?;
    let link = || {
        // SAFETY: valid C strings and live fds.
        check(unsafe {
            libc::linkat(
                libc::AT_FDCWD,
                from.as_ptr(),
                dir.as_raw_fd(),
                to.as_ptr(),
                libc::AT_SYMLINK_FOLLOW,
            )
        })
    };
    match link() {
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
            unlink(dir, name);
            link().map(drop)
        }
        other => other.map(drop),
    }
}

/// Atomically makes `dir/name` a symlink to `target` (`symlinkat` to a temporary name, then
/// `renameat` over `name`), as NVIDIA's create-symlinks does since v1.19.1.
pub fn replace_symlink(
    dir: BorrowedFd,
    name: impl AsRef<[u8]>,
    target: impl AsRef<[u8]>,
) -> io::Result<()> {
    let name = name.as_ref();
    let tmp = temp_name(name);
    let target_c = cstring(target.as_ref())?;
    let tmp_c = cstring(&tmp)?;
    // SAFETY: valid C strings and a live fd.
    let mut ret = unsafe { libc::symlinkat(target_c.as_ptr(), dir.as_raw_fd(), tmp_c.as_ptr()) };
    if ret < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EEXIST) {
        unlink(dir, &tmp);
        // SAFETY: as above.
        ret = unsafe { libc::symlinkat(target_c.as_ptr(), dir.as_raw_fd(), tmp_c.as_ptr()) };
    }
    check(ret)?;
    let result = rename(dir, &tmp, name);
    if result.is_err() {
        unlink(dir, &tmp);
    }
    result
}

/// Makes `dir/name` a new symlink to `target`: `false`, changing nothing, when `name` exists.
/// One system call for what a container's first start finds missing, where reading the old
/// link first and replacing it through a temporary name took three.
pub fn create_symlink(dir: BorrowedFd, name: &str, target: &str) -> io::Result<bool> {
    let target_c = cstring(target.as_bytes())?;
    let name_c = cstring(name.as_bytes())?;
    // SAFETY: valid C strings and a live fd.
    match check(unsafe { libc::symlinkat(target_c.as_ptr(), dir.as_raw_fd(), name_c.as_ptr()) }) {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Reads the target of `dir/name` if it is a symlink; `None` if it is missing or not a symlink.
pub fn symlink_target(dir: BorrowedFd, name: &str) -> io::Result<Option<Vec<u8>>> {
    match readlinkat(dir, name.as_bytes()) {
        Ok(t) => Ok(Some(t)),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOENT)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Splits a container path into its parent and final name. `None` for a path that names no
/// entry (`/`, `..`, `a/.`).
pub fn split_parent(path: &str) -> Option<(&str, &str)> {
    let trimmed = path.trim_end_matches('/');
    let (parent, name) = match trimmed.rfind('/') {
        Some(i) => (&trimmed[..i], &trimmed[i + 1..]),
        None => ("", trimmed),
    };
    if name.is_empty() || name == "." || name == ".." {
        return None;
    }
    Some((if parent.is_empty() { "/" } else { parent }, name))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn both(root: &Root, f: impl Fn(&Root)) {
        for r in [Resolver::Openat2, Resolver::Walk] {
            root.set_resolver(r);
            f(root);
        }
    }

    #[test]
    fn mount_ids_from_statx_and_fdinfo_agree() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::open(dir.path()).unwrap();
        let fdinfo =
            std::fs::read_to_string(format!("/proc/self/fdinfo/{}", root.fd().as_raw_fd()))
                .unwrap();
        assert_eq!(mount_id(root.fd()), fdinfo_mount_id(&fdinfo));
        assert!(mount_id(root.fd()).is_some());
        assert_eq!(
            fdinfo_mount_id("pos:\t0\nflags:\t012100000\nmnt_id:\t1542\nino:\t7\n"),
            Some(1542)
        );
        assert_eq!(fdinfo_mount_id("pos:\t0\n"), None);
    }

    /// Unmounts on drop (also when the test fails).
    pub(crate) struct BindMount(std::path::PathBuf);

    impl BindMount {
        /// Bind-mounts `src` on `dst`; `None` without the privilege to mount (tests not run as
        /// root).
        pub(crate) fn new(src: &Path, dst: &Path) -> Option<BindMount> {
            let c = |p: &Path| cstring(p.as_os_str().as_encoded_bytes()).unwrap();
            let (s, d) = (c(src), c(dst));
            // SAFETY: valid C strings; a bind mount takes no fstype or data.
            let ret = unsafe {
                libc::mount(
                    s.as_ptr(),
                    d.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND,
                    std::ptr::null(),
                )
            };
            (ret == 0).then(|| BindMount(dst.to_path_buf()))
        }
    }

    impl Drop for BindMount {
        fn drop(&mut self) {
            let d = cstring(self.0.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: a valid C string.
            unsafe { libc::umount2(d.as_ptr(), libc::MNT_DETACH) };
        }
    }

    #[test]
    fn no_xdev_refuses_a_bind_mount_of_the_root_s_own_filesystem() {
        // The red team's case: a rootfs and a host directory on the same filesystem (same
        // st_dev), the directory mounted read-write into the container. The image's
        // `usr/lib/x86_64-linux-gnu -> /vol` leads there.
        let host = tempfile::tempdir().unwrap();
        let hostdir = host.path().join("hostdir");
        let rootdir = host.path().join("root");
        std::fs::create_dir_all(&hostdir).unwrap();
        std::fs::create_dir_all(rootdir.join("vol")).unwrap();
        std::fs::create_dir_all(rootdir.join("usr/lib")).unwrap();
        symlink("/vol", rootdir.join("usr/lib/x86_64-linux-gnu")).unwrap();
        let Some(_mount) = BindMount::new(&hostdir, &rootdir.join("vol")) else {
            eprintln!("skipped: bind mounts need root");
            return;
        };
        let root = Root::open(&rootdir).unwrap();
        both(&root, |root| {
            for path in ["/vol/x", "/usr/lib/x86_64-linux-gnu/x"] {
                let err = root.mkdir_all(path, 0o755, true).unwrap_err();
                assert_eq!(err.raw_os_error(), Some(libc::EXDEV), "{path}: {err}");
            }
            // Without no_xdev (reads of mounted files) the path resolves.
            root.mkdir_all("/vol", 0o755, false).unwrap();
        });
        assert_eq!(
            std::fs::read_dir(&hostdir).unwrap().count(),
            0,
            "nothing made on the host"
        );
    }

    #[test]
    fn child_roots_refuse_a_symlink() {
        let host = tempfile::tempdir().unwrap();
        let rootdir = host.path().join("root");
        std::fs::create_dir_all(rootdir.join("dev/dri")).unwrap();
        symlink("/run", rootdir.join("dev2")).unwrap();
        let root = Root::open(&rootdir).unwrap();
        let dev = root.child("dev").unwrap();
        assert!(dev.mkdir_all("/dri/by-path", 0o755, true).is_ok());
        assert!(rootdir.join("dev/dri/by-path").is_dir());
        for bad in ["dev2", "..", "dev/dri", ""] {
            assert!(root.child(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn absolute_symlinks_and_dotdot_stay_inside() {
        let host = tempfile::tempdir().unwrap();
        let outside = host.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("secret"), "host").unwrap();
        let rootdir = host.path().join("root");
        std::fs::create_dir_all(rootdir.join("etc")).unwrap();
        std::fs::write(rootdir.join("etc/secret"), "container").unwrap();
        // etc2 -> / ; up -> ../../.. ; abs -> <host>/outside
        symlink("/", rootdir.join("etc2")).unwrap();
        symlink("../../..", rootdir.join("etc/up")).unwrap();
        symlink(&outside, rootdir.join("abs")).unwrap();
        let root = Root::open(&rootdir).unwrap();
        both(&root, |root| {
            let read = |p: &str| root.read_regular(p, 100).unwrap();
            assert_eq!(read("/etc2/etc/secret").unwrap(), b"container");
            assert_eq!(read("/etc/up/etc/secret").unwrap(), b"container");
            assert_eq!(read("/../../etc/secret").unwrap(), b"container");
            // The host path, re-read inside the root, does not exist there.
            assert!(read("/abs/secret").is_none());
        });
    }

    #[test]
    fn magic_links_do_not_lead_out() {
        let host = tempfile::tempdir().unwrap();
        let rootdir = host.path().join("root");
        std::fs::create_dir_all(&rootdir).unwrap();
        symlink("/proc/self/root/etc/hostname", rootdir.join("magic")).unwrap();
        let root = Root::open(&rootdir).unwrap();
        both(&root, |root| {
            // Inside the root /proc does not exist: nothing is found, nothing escapes.
            assert!(root.read_regular("/magic", 1 << 20).unwrap().is_none());
        });
    }

    #[test]
    fn fifo_and_huge_files_are_refused_without_blocking() {
        let host = tempfile::tempdir().unwrap();
        let rootdir = host.path();
        let fifo = rootdir.join("fifo");
        let c = CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let big = File::create(rootdir.join("big")).unwrap();
        big.set_len(2 << 30).unwrap();
        let root = Root::open(rootdir).unwrap();
        both(&root, |root| {
            assert!(matches!(
                root.read_regular("/fifo", 100),
                Err(RootError::NotRegular { .. })
            ));
            assert!(matches!(
                root.read_regular("/big", 1 << 20),
                Err(RootError::TooLarge { .. })
            ));
        });
    }

    #[test]
    fn mkdir_all_creates_inside_through_symlinks() {
        let host = tempfile::tempdir().unwrap();
        let outside = host.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        let rootdir = host.path().join("root");
        std::fs::create_dir(&rootdir).unwrap();
        symlink(&outside, rootdir.join("etc")).unwrap();
        let root = Root::open(&rootdir).unwrap();
        both(&root, |root| {
            let dir = root.mkdir_all("/etc/ld.so.conf.d", 0o755, true);
            // `etc` points at a host path that does not exist inside: dangling, so an error.
            assert!(dir.is_err(), "{dir:?}");
        });
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
        std::fs::remove_file(rootdir.join("etc")).unwrap();
        symlink("/", rootdir.join("etc")).unwrap();
        both(&root, |root| {
            let dir = root.mkdir_all("/etc/a/b", 0o755, true).unwrap();
            replace_file(dir.as_fd(), "f", b"x", 0o644).unwrap();
        });
        assert_eq!(std::fs::read(rootdir.join("a/b/f")).unwrap(), b"x");
    }

    #[test]
    fn replace_file_replaces_symlinks_and_fifos() {
        let host = tempfile::tempdir().unwrap();
        let target = host.path().join("target");
        std::fs::write(&target, "host").unwrap();
        let dir = host.path().join("d");
        std::fs::create_dir(&dir).unwrap();
        symlink(&target, dir.join("link")).unwrap();
        let root = Root::open(&dir).unwrap();
        let d = root.mkdir_all("/", 0o755, false).unwrap();
        replace_file(d.as_fd(), "link", b"new", 0o644).unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"host");
        assert_eq!(std::fs::read(dir.join("link")).unwrap(), b"new");
        std::fs::create_dir(dir.join("sub")).unwrap();
        assert!(replace_file(d.as_fd(), "sub", b"x", 0o644).is_err());
        assert!(std::fs::read_dir(&dir).unwrap().all(|e| !e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .contains("nvshim")));
    }

    #[test]
    fn real_path_resolves_symlinks_inside_the_root() {
        let host = tempfile::tempdir().unwrap();
        let rootdir = host.path().join("root");
        std::fs::create_dir_all(rootdir.join("usr/local/cuda-13.0/compat")).unwrap();
        symlink("cuda-13.0", rootdir.join("usr/local/cuda")).unwrap();
        symlink("/usr/local/cuda/../cuda", rootdir.join("abs")).unwrap();
        symlink(host.path(), rootdir.join("out")).unwrap();
        let root = Root::open(&rootdir).unwrap();
        both(&root, |root| {
            let real = |p: &str| root.real_path(p).map_err(|e| e.raw_os_error());
            let want = Ok("/usr/local/cuda-13.0/compat".to_string());
            assert_eq!(real("/usr/local/cuda/compat"), want);
            assert_eq!(real("usr/local/cuda/./compat/"), want);
            assert_eq!(real("/../abs/compat"), want);
            assert_eq!(real("/"), Ok("/".to_string()));
            // A host path re-read inside the root is not there.
            assert_eq!(real("/out/root"), Err(Some(libc::ENOENT)));
        });
    }

    #[test]
    fn split_parent_rejects_nameless_paths() {
        assert_eq!(split_parent("/usr/lib/x"), Some(("/usr/lib", "x")));
        assert_eq!(split_parent("x"), Some(("/", "x")));
        assert_eq!(split_parent("/x/"), Some(("/", "x")));
        assert_eq!(split_parent("/"), None);
        assert_eq!(split_parent("/a/.."), None);
    }
}
