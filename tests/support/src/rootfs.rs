//! A minimal busybox root filesystem.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// Where the static busybox comes from (Debian's `busybox-static`).
pub const BUSYBOX: &str = "/usr/bin/busybox";
/// The host's static-pie `ldconfig`, copied in so that `ldconfig -p` works in the container.
pub const LDCONFIG: &str = "/sbin/ldconfig";

/// A root filesystem directory.
#[derive(Debug, Clone)]
pub struct Rootfs {
    path: PathBuf,
}

impl Rootfs {
    /// Makes `dir` a busybox rootfs: `bin/busybox` with a symlink per applet, the host's
    /// `/sbin/ldconfig` as `sbin/ldconfig` (a busybox `ldconfig` applet, if any, is not linked, so
    /// it cannot shadow it), and empty `tmp`, `etc`, `proc`, `dev`, `sys`.
    pub fn busybox(dir: &Path) -> Result<Rootfs> {
        Rootfs::busybox_from(dir, Path::new(BUSYBOX), Path::new(LDCONFIG))
    }

    /// [`Rootfs::busybox`] with another machine's static `busybox` and `ldconfig` (an arm64
    /// image: [`crate::arm64::root`]'s, run through binfmt_misc).
    pub fn busybox_from(dir: &Path, busybox_bin: &Path, ldconfig_bin: &Path) -> Result<Rootfs> {
        let bin = dir.join("bin");
        let sbin = dir.join("sbin");
        for d in [&bin, &sbin] {
            fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        for d in ["tmp", "etc", "proc", "dev", "sys", "root"] {
            let p = dir.join(d);
            fs::create_dir_all(&p).with_context(|| format!("creating {}", p.display()))?;
        }
        let busybox = bin.join("busybox");
        fs::copy(busybox_bin, &busybox).with_context(|| {
            format!("copying {} to {}", busybox_bin.display(), busybox.display())
        })?;
        let list = Command::new(busybox_bin)
            .arg("--list")
            .output()
            .with_context(|| format!("running {} --list", busybox_bin.display()))?;
        if !list.status.success() {
            bail!(
                "{} --list failed with {}",
                busybox_bin.display(),
                list.status
            );
        }
        for applet in String::from_utf8_lossy(&list.stdout).lines() {
            let applet = applet.trim();
            // `--list` names busybox itself: linking it would replace the binary with a loop.
            if applet.is_empty()
                || applet == "busybox"
                || applet == "ldconfig"
                || applet.contains('/')
            {
                continue;
            }
            let link = bin.join(applet);
            symlink("busybox", &link).with_context(|| format!("linking {}", link.display()))?;
        }
        let ldconfig = sbin.join("ldconfig");
        fs::copy(ldconfig_bin, &ldconfig).with_context(|| {
            format!(
                "copying {} to {}",
                ldconfig_bin.display(),
                ldconfig.display()
            )
        })?;
        fs::write(dir.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n")
            .with_context(|| format!("writing {}", dir.join("etc/passwd").display()))?;
        fs::write(dir.join("etc/group"), "root:x:0:\n")
            .with_context(|| format!("writing {}", dir.join("etc/group").display()))?;
        Ok(Rootfs {
            path: dir.to_path_buf(),
        })
    }

    /// The rootfs directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}
