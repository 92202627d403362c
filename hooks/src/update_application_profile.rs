//! The `update-application-profile` hook, NVIDIA's `nvidia-cdi-hook update-application-profile`
//! (`cmd/nvidia-cdi-hook/update-application-profile/`, new in 1.20), the CDI successor of libnvidia-container's `update_app_profile`.
//!
//! The GPUs a container was given are its `/dev/nvidia<N>` character devices. The driver's EGL
//! and Vulkan loaders would still enumerate every GPU the kernel module knows; an application
//! profile with `EGLVisibleDGPUDevices` (a bit mask of device minors) restricts them to those.
//! The hook lists `<root>/dev` by fd, takes every entry named `nvidia[0-9]+` that is itself a
//! character device (`lstat`: a symlink does not count), sets bit `minor` for minors 0..=63
//! (others are dropped with a warning) and, when the mask is not empty, writes NVIDIA's JSON to
//! `/etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf`, byte for byte
//! (`buildApplicationProfileConfig`: `0x` and lower-case hex, no newline):
//!
//! ```text
//! {"profiles":[{"name":"_container_","settings":["EGLVisibleDGPUDevices",0x3]}],"rules":[{"pattern":[],"profile":"_container_"}]}
//! ```
//!
//! Missing directories are created 0555 inside the root and the file is 0444, as NVIDIA's. The
//! file is replaced atomically (temp name with `O_CREAT|O_EXCL|O_NOFOLLOW`, then rename): a
//! symlink or FIFO the image put at that name is replaced, never written through. Like the
//! other writes below `/etc`, resolution refuses to cross into another mount.

use std::io;
use std::os::fd::AsFd;

use thiserror::Error;

use crate::root::{self, Root, RootError};

/// The profile file.
pub const PROFILE_FILE: &str = "/etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf";
const PROFILE_DIR: &str = "/etc/nvidia/nvidia-application-profiles-rc.d";
const PROFILE_NAME: &str = "10-container.conf";

#[derive(Debug, Error)]
pub enum ProfileError {
    #[error(transparent)]
    Root(#[from] RootError),
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
    pub mask: u64,
    pub written: Vec<String>,
    pub warnings: Vec<String>,
}

/// True for `nvidia[0-9]+` (NVIDIA's `^nvidia[0-9]+$`).
pub fn is_gpu_node_name(name: &[u8]) -> bool {
    name.strip_prefix(b"nvidia")
        .is_some_and(|n| !n.is_empty() && n.iter().all(u8::is_ascii_digit))
}

/// The mask of `minors`, and the minors dropped for being outside 0..=63.
pub fn mask(minors: &[u64]) -> (u64, Vec<u64>) {
    let mut mask = 0u64;
    let mut dropped = Vec::new();
    for &m in minors {
        if m < 64 {
            mask |= 1 << m;
        } else {
            dropped.push(m);
        }
    }
    (mask, dropped)
}

/// NVIDIA's `buildApplicationProfileConfig`.
pub fn render(mask: u64) -> String {
    format!(
        r#"{{"profiles":[{{"name":"_container_","settings":["EGLVisibleDGPUDevices",0x{mask:x}]}}],"rules":[{{"pattern":[],"profile":"_container_"}}]}}"#
    )
}

/// Minors of the GPU device nodes in the container's `/dev`.
fn gpu_minors(root: &Root) -> Result<Vec<u64>, ProfileError> {
    let Some(dev) = root.open_dir("/dev", false)? else {
        return Ok(Vec::new());
    };
    let entries = root::read_dir(dev.as_fd()).map_err(|source| ProfileError::Io {
        path: root.display("/dev"),
        source,
    })?;
    let mut minors = Vec::new();
    for e in entries {
        if !is_gpu_node_name(&e.name) {
            continue;
        }
        if let Ok(st) = root::lstatat(dev.as_fd(), &e.name) {
            if st.st_mode & libc::S_IFMT == libc::S_IFCHR {
                minors.push(u64::from(libc::minor(st.st_rdev)));
            }
        }
    }
    minors.sort_unstable();
    Ok(minors)
}

/// Runs the hook on `root`.
pub fn run(root: &Root) -> Result<Report, ProfileError> {
    let mut report = Report::default();
    let (mask, dropped) = mask(&gpu_minors(root)?);
    for m in dropped {
        report.warnings.push(format!(
            "dropping device minor {m} from EGLVisibleDGPUDevices: it must be in 0..=63"
        ));
    }
    report.mask = mask;
    if mask == 0 {
        return Ok(report);
    }
    let content = render(mask);
    if root
        .read_regular(PROFILE_FILE, 1 << 20)
        .ok()
        .flatten()
        .as_deref()
        == Some(content.as_bytes())
    {
        return Ok(report);
    }
    let dir = root.mkdir_all(PROFILE_DIR, 0o555, true)?;
    root::replace_file(dir.as_fd(), PROFILE_NAME, content.as_bytes(), 0o444).map_err(|source| {
        ProfileError::Io {
            path: root.display(PROFILE_FILE),
            source,
        }
    })?;
    report.written.push(PROFILE_FILE.into());
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_and_json_are_nvidias() {
        assert_eq!(mask(&[0, 1]), (0x3, vec![]));
        assert_eq!(mask(&[63]), (1 << 63, vec![]));
        assert_eq!(mask(&[2, 64, 200]), (0x4, vec![64, 200]));
        assert_eq!(mask(&[]), (0, vec![]));
        assert_eq!(
            render(0x3),
            r#"{"profiles":[{"name":"_container_","settings":["EGLVisibleDGPUDevices",0x3]}],"rules":[{"pattern":[],"profile":"_container_"}]}"#
        );
        assert!(render(0xa0).contains(",0xa0]"));
        assert!(render(1 << 63).contains(",0x8000000000000000]"));
    }

    #[test]
    fn gpu_node_names() {
        for ok in ["nvidia0", "nvidia12", "nvidia63"] {
            assert!(is_gpu_node_name(ok.as_bytes()), "{ok}");
        }
        for bad in [
            "nvidia",
            "nvidiactl",
            "nvidia-uvm",
            "nvidia0a",
            "xnvidia0",
            "nvidia-caps",
        ] {
            assert!(!is_gpu_node_name(bad.as_bytes()), "{bad}");
        }
    }

    fn mknod(path: &std::path::Path, kind: libc::mode_t, minor: u32) {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: valid C string.
        let ret = unsafe { libc::mknod(c.as_ptr(), kind | 0o666, libc::makedev(195, minor)) };
        assert_eq!(
            ret,
            0,
            "mknod {}: {}",
            path.display(),
            io::Error::last_os_error()
        );
    }

    #[test]
    fn writes_the_mask_of_the_containers_gpu_nodes() {
        let dir = tempfile::tempdir().unwrap();
        let dev = dir.path().join("dev");
        std::fs::create_dir(&dev).unwrap();
        mknod(&dev.join("nvidia1"), libc::S_IFCHR, 1);
        mknod(&dev.join("nvidia3"), libc::S_IFCHR, 3);
        // Not counted: control nodes, block devices, symlinks and files with GPU names.
        mknod(&dev.join("nvidiactl"), libc::S_IFCHR, 255);
        mknod(&dev.join("nvidia5"), libc::S_IFBLK, 5);
        std::os::unix::fs::symlink("nvidia1", dev.join("nvidia7")).unwrap();
        std::fs::write(dev.join("nvidia9"), "").unwrap();
        let root = Root::open(dir.path()).unwrap();
        let r = run(&root).unwrap();
        assert_eq!(r.mask, 0b1010);
        let file = dir
            .path()
            .join("etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), render(0b1010));
        use std::os::unix::fs::PermissionsExt;
        let mode =
            |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&file), 0o444);
        assert_eq!(mode(file.parent().unwrap()), 0o555);
        assert_eq!(mode(&dir.path().join("etc/nvidia")), 0o555);
        // Again: nothing to write.
        assert!(run(&root).unwrap().written.is_empty());
        // No GPU node: no file written or changed.
        let empty = tempfile::tempdir().unwrap();
        let r = run(&Root::open(empty.path()).unwrap()).unwrap();
        assert_eq!((r.mask, r.written.len()), (0, 0));
        assert!(!empty.path().join("etc").exists());
    }
}
