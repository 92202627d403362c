//! The one way nvshim reads a file outside a container: its config, engine configs, CDI spec
//! files, config.json (the hook's too), ld.so.cache, `/proc` and `/sys` files. Here, in the
//! library both binaries link (`src/hostfile.rs` in the `nvshim` crate re-exports it), so
//! that the rule has one home.
//!
//! Opened `O_NONBLOCK` (a FIFO at the path would otherwise block the open until something
//! writes to it: `nvshim cdi refresh` runs every 30 s and would pile up, a `create` would
//! hang runc's caller), then `fstat` on the open file: regular files only (symlinks followed,
//! as every reader of these files follows them; a device such as `/dev/zero` never ends), and
//! at most a caller's limit of bytes. The limit is also applied while reading, so a file that
//! grows after the `fstat`, or a kernel file that reports size 0 (procfs), is read up to it.
//!
//! Errors are `std::io::Error`s, so callers keep telling "not there" (`NotFound`) from the
//! rest; the two this module adds carry a [`Refused`] whose text says what to do. Callers'
//! own errors name the path.

use std::fs::{File, Metadata, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use thiserror::Error;

/// Why a file that exists was not read.
#[derive(Debug, Error)]
pub enum Refused {
    #[error("{0}, not a regular file: nvshim reads only regular files here (a FIFO would block it, a device may never end); replace it with the file meant, or remove it")]
    NotRegular(&'static str),
    #[error("larger than the {limit} bytes nvshim reads from such a file ({size} bytes); check that the path names the file meant")]
    TooLarge { size: u64, limit: u64 },
}

impl From<Refused> for io::Error {
    fn from(r: Refused) -> io::Error {
        let kind = match r {
            Refused::NotRegular(_) => io::ErrorKind::InvalidInput,
            Refused::TooLarge { .. } => io::ErrorKind::FileTooLarge,
        };
        io::Error::new(kind, r)
    }
}

/// The [`Refused`] inside an error of this module, if it is one.
pub fn refused(e: &io::Error) -> Option<&Refused> {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<Refused>())
}

/// What a file type is called in messages; `None` for a regular file.
pub fn special_kind(ft: std::fs::FileType) -> Option<&'static str> {
    Some(if ft.is_file() {
        return None;
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_dir() {
        "a directory"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_char_device() || ft.is_block_device() {
        "a device"
    } else {
        "not a file"
    })
}

/// Opens `path` for reading without blocking, and checks it is a regular file of at most
/// `limit` bytes (module doc).
pub fn open(path: &Path, limit: u64) -> io::Result<(File, Metadata)> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(path)?;
    let meta = file.metadata()?;
    if let Some(what) = special_kind(meta.file_type()) {
        return Err(Refused::NotRegular(what).into());
    }
    if meta.len() > limit {
        return Err(Refused::TooLarge {
            size: meta.len(),
            limit,
        }
        .into());
    }
    Ok((file, meta))
}

/// Reads what is left of `r`, at most `limit` bytes (one more is read to notice a larger
/// file); `hint` is the size expected (the `fstat` size; 0 for kernel files).
pub fn read_bounded(r: impl Read, hint: u64, limit: u64) -> io::Result<Vec<u8>> {
    // Room up front: `take` hides the size from `read_to_end`, which otherwise starts small and
    // doubles; a kernel file gives no size, and a page is what procfs hands out per read.
    let room = if hint == 0 { 4096 } else { hint };
    let mut bytes = Vec::with_capacity(room.min(limit) as usize + 1);
    r.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(Refused::TooLarge {
            size: bytes.len() as u64,
            limit,
        }
        .into());
    }
    Ok(bytes)
}

/// The bytes of `path`, with the `fstat` of the file read.
pub fn read_with_meta(path: &Path, limit: u64) -> io::Result<(Vec<u8>, Metadata)> {
    let (file, meta) = open(path, limit)?;
    let bytes = read_bounded(file, meta.len(), limit)?;
    Ok((bytes, meta))
}

/// The bytes of `path` (module doc).
pub fn read(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    read_with_meta(path, limit).map(|(bytes, _)| bytes)
}

/// The text of `path`; not UTF-8 is `InvalidData`, as `std::fs::read_to_string` says.
pub fn read_to_string(path: &Path, limit: u64) -> io::Result<String> {
    String::from_utf8(read(path, limit)?).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "stream did not contain valid UTF-8",
        )
    })
}

/// Opens a directory for listing or for reads relative to it; `O_DIRECTORY` makes anything else
/// (a FIFO included) `ENOTDIR` before the open could block.
pub fn open_dir(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(path)
}

/// Limit for a kernel file (`/proc`, `/sys`): they are a few lines; a MIG host's
/// `mig-minors` table is about 30 KB.
pub const KERNEL_FILE_LIMIT: u64 = 4 << 20;

/// Limit for a configuration file (nvshim's own, an engine's): real ones are a few KB.
pub const CONFIG_LIMIT: u64 = 16 << 20;

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// Runs `f` on a thread; a hang is a failure after 20 s, not a stuck test run.
    fn finishes<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || tx.send(f()));
        rx.recv_timeout(Duration::from_secs(20))
            .expect("the read blocked")
    }

    #[test]
    fn regular_files_are_read_whole() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, "abc").unwrap();
        assert_eq!(read(&p, 3).unwrap(), b"abc");
        assert_eq!(read_to_string(&p, 10).unwrap(), "abc");
        let e = read(&p, 2).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::FileTooLarge);
        assert!(e.to_string().contains("larger than the 2 bytes"), "{e}");
        assert_eq!(
            read(&d.path().join("missing"), 1).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }

    #[test]
    fn fifos_devices_and_directories_are_refused_without_blocking() {
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("fifo");
        nvshim_testsupport::hook_harness::mkfifo(&fifo);
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&fifo, &link).unwrap();
        for (p, what) in [
            (fifo, "a FIFO"),
            (link, "a FIFO"),
            ("/dev/zero".into(), "a device"),
            (d.path().to_path_buf(), "a directory"),
        ] {
            let e = finishes(move || read(&p, CONFIG_LIMIT).unwrap_err());
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
            assert!(e.to_string().starts_with(what), "{e}");
        }
    }

    #[test]
    fn kernel_files_of_size_zero_are_read_up_to_the_limit() {
        let text = read_to_string(Path::new("/proc/self/status"), KERNEL_FILE_LIMIT).unwrap();
        assert!(text.contains("Pid:"), "{text}");
        let e = read(Path::new("/proc/self/status"), 8).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::FileTooLarge);
    }
}
