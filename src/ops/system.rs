//! Host setup: `/dev/char/MAJ:MIN` links for the NVIDIA device nodes
//! (`nvshim system create-dev-char-symlinks`).
//!
//! Why: with the systemd cgroup driver, runc turns each `linux.resources.devices` rule into
//! `DeviceAllow=/dev/char/MAJ:MIN` and, since runc 1.1.3, silently drops rules whose
//! `/dev/char` path does not exist (runc#3671, runc#3708). The NVIDIA nodes are made with
//! `mknod` by nvidia-modprobe, not through the kernel's `device_create`, so udev never links
//! them; the unit then lacks the GPU rules and the next `systemctl daemon-reload` re-applies
//! it, revoking the GPUs: "Failed to initialize NVML: Unknown Error" (nvidia-container-toolkit#48,
//! docs/field-notes.md §2.1). NVIDIA's fix is these links, made at boot and by a udev rule
//! (`nvidia-ctk system create-dev-char-symlinks`).
//!
//! Unlike nvidia-ctk, which always looks under `/` whatever `--driver-root` says (its
//! documented quirk), nodes are found under the configured `dev-root` and majors read from
//! `proc-root`, the same discovery the shim uses ([`crate::host`]).

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::{symlink, FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::host::{DeviceMajors, Host, HostError};

/// Where udev keeps the links.
pub const DEFAULT_DEV_CHAR_PATH: &str = "/dev/char";

use crate::nvidia::{MODESET_MINOR, NVIDIACTL_MINOR};

#[derive(Debug, Error)]
pub enum SystemError {
    #[error(transparent)]
    Host(#[from] HostError),
    #[error("cannot list {path}: {source}")]
    List {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot create the link {path}: {source}")]
    Link {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// One wanted link: `<dev-char>/<major>:<minor>` → `target`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevCharLink {
    pub major: u32,
    pub minor: u32,
    /// The device node, as a path on this host.
    pub target: PathBuf,
    pub link: PathBuf,
    pub action: LinkAction,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkAction {
    /// Made (or would be, in a dry run).
    Create,
    /// An existing link pointing elsewhere was replaced.
    Replace { old: PathBuf },
    /// Already a link to the target, or to a node with the same numbers (udev's `../nvidia0`).
    Keep,
    /// Something that is not a symlink is in the way; left alone.
    Blocked,
}

/// What to link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevCharOptions {
    pub dev_char_path: PathBuf,
    /// Link every node the driver can have (from `/proc/devices` and the GPUs in
    /// `/proc/driver/nvidia/gpus`), existing or not, as NVIDIA's `--create-all`: meant for a boot
    /// service that runs before the nodes are made. Otherwise only existing nodes are linked.
    pub create_all: bool,
    pub dry_run: bool,
}

impl Default for DevCharOptions {
    fn default() -> Self {
        DevCharOptions {
            dev_char_path: PathBuf::from(DEFAULT_DEV_CHAR_PATH),
            create_all: false,
            dry_run: false,
        }
    }
}

/// The NVIDIA nodes to link as `(major, minor, target)`, sorted, one per device number.
pub fn wanted_links(
    host: &Host,
    create_all: bool,
) -> Result<Vec<(u32, u32, PathBuf)>, SystemError> {
    let majors = host.device_majors()?;
    let dev = host.roots().dev_root.join("dev");
    let mut out: Vec<(u32, u32, PathBuf)> = Vec::new();
    let mut seen = BTreeSet::new();
    let mut push = |major: u32, minor: u32, target: PathBuf| {
        if seen.insert((major, minor)) {
            out.push((major, minor, target));
        }
    };
    if create_all {
        for gpu in host.gpus()? {
            push(
                majors.nvidia,
                gpu.minor,
                dev.join(format!("nvidia{}", gpu.minor)),
            );
        }
        push(majors.nvidia, NVIDIACTL_MINOR, dev.join("nvidiactl"));
        push(majors.nvidia, MODESET_MINOR, dev.join("nvidia-modeset"));
        if let Some(uvm) = majors.nvidia_uvm {
            push(uvm, 0, dev.join("nvidia-uvm"));
            push(
                uvm,
                crate::nvidia::UVM_TOOLS_MINOR,
                dev.join("nvidia-uvm-tools"),
            );
        }
    }
    // Existing nodes: `/dev/nvidia*` and the capability and IMEX channel directories, kept
    // only when their major is one of the driver's. That leaves out nvidia-fs, nvswitch and
    // nvlink nodes (other drivers' majors), which NVIDIA skips by name.
    let nvidia_majors = driver_majors(&majors);
    for name in node_names(&dev)? {
        if let Some(node) = host.device_node(&name) {
            if node.kind == 'c' && nvidia_majors.contains(&node.major) {
                push(node.major, node.minor, node.host_path);
            }
        }
    }
    out.sort();
    Ok(out)
}

fn driver_majors(m: &DeviceMajors) -> Vec<u32> {
    let mut v = vec![m.nvidia];
    v.extend(m.nvidia_uvm);
    v.extend(m.nvidia_caps);
    v.extend(m.nvidia_caps_imex_channels);
    v
}

/// Names below `dev` (relative, as [`Host::device_node`] takes them) that may be NVIDIA nodes.
fn node_names(dev: &Path) -> Result<Vec<String>, SystemError> {
    let list = |dir: &Path| -> Result<Vec<String>, SystemError> {
        match fs::read_dir(dir) {
            Ok(entries) => Ok(entries
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(source) => Err(SystemError::List {
                path: dir.to_path_buf(),
                source,
            }),
        }
    };
    let mut names: Vec<String> = list(dev)?
        .into_iter()
        .filter(|n| n.starts_with("nvidia"))
        .collect();
    for sub in ["nvidia-caps", "nvidia-caps-imex-channels"] {
        names.extend(
            list(&dev.join(sub))?
                .into_iter()
                .map(|n| format!("{sub}/{n}")),
        );
    }
    names.sort();
    Ok(names)
}

/// Creates (or, with `dry_run`, plans) the links. Idempotent: a link that already leads to the
/// right node is kept.
pub fn create_dev_char_symlinks(
    host: &Host,
    opts: &DevCharOptions,
) -> Result<Vec<DevCharLink>, SystemError> {
    let mut out = Vec::new();
    for (major, minor, target) in wanted_links(host, opts.create_all)? {
        let link = opts.dev_char_path.join(format!("{major}:{minor}"));
        let action = decide(&link, &target, major, minor);
        if !opts.dry_run {
            match &action {
                LinkAction::Create | LinkAction::Replace { .. } => place_link(&link, &target)?,
                LinkAction::Keep | LinkAction::Blocked => {}
            }
        }
        out.push(DevCharLink {
            major,
            minor,
            target,
            link,
            action,
        });
    }
    Ok(out)
}

fn decide(link: &Path, target: &Path, major: u32, minor: u32) -> LinkAction {
    let Ok(meta) = fs::symlink_metadata(link) else {
        return LinkAction::Create;
    };
    if !meta.file_type().is_symlink() {
        return LinkAction::Blocked;
    }
    let old = fs::read_link(link).unwrap_or_default();
    if old == target {
        return LinkAction::Keep;
    }
    // A link udev made (`../nvidia0`) that reaches the same device is as good as ours.
    if let Ok(m) = fs::metadata(link) {
        let rdev = m.rdev();
        if m.file_type().is_char_device()
            && nix::sys::stat::major(rdev) as u32 == major
            && nix::sys::stat::minor(rdev) as u32 == minor
        {
            return LinkAction::Keep;
        }
    }
    LinkAction::Replace { old }
}

/// Makes the link under a temporary name and renames it into place, so a link being replaced
/// never goes missing (runc may be reading `/dev/char` at that moment).
fn place_link(link: &Path, target: &Path) -> Result<(), SystemError> {
    let err = |source| SystemError::Link {
        path: link.to_path_buf(),
        source,
    };
    if let Some(dir) = link.parent() {
        fs::create_dir_all(dir).map_err(err)?;
    }
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(link.file_name().unwrap_or_default());
    tmp_name.push(format!(".nvshim-{}", std::process::id()));
    let tmp = link.with_file_name(tmp_name);
    let _ = fs::remove_file(&tmp);
    symlink(target, &tmp).map_err(err)?;
    fs::rename(&tmp, link).map_err(|e| {
        let _ = fs::remove_file(&tmp);
        err(e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::HostRoots;

    fn host_with_proc(dir: &Path) -> Host {
        let proc_root = dir.join("proc");
        fs::create_dir_all(proc_root.join("driver/nvidia/gpus/0000:3b:00.0")).unwrap();
        fs::write(
            proc_root.join("devices"),
            "Character devices:\n195 nvidia\n508 nvidia-uvm\n\nBlock devices:\n",
        )
        .unwrap();
        fs::write(
            proc_root.join("driver/nvidia/gpus/0000:3b:00.0/information"),
            "Model: X\nGPU UUID: GPU-1\nBus Location: 0000:3b:00.0\nDevice Minor: 3\n",
        )
        .unwrap();
        Host::new(HostRoots {
            driver_root: dir.to_path_buf(),
            dev_root: dir.to_path_buf(),
            proc_root,
        })
    }

    #[test]
    fn create_all_links_every_possible_node_without_nodes() {
        let dir = tempfile::tempdir().unwrap();
        let host = host_with_proc(dir.path());
        let want = wanted_links(&host, true).unwrap();
        let dev = dir.path().join("dev");
        assert_eq!(
            want,
            vec![
                (195, 3, dev.join("nvidia3")),
                (195, 254, dev.join("nvidia-modeset")),
                (195, 255, dev.join("nvidiactl")),
                (508, 0, dev.join("nvidia-uvm")),
                (508, 1, dev.join("nvidia-uvm-tools")),
            ]
        );
        assert!(wanted_links(&host, false).unwrap().is_empty());
        let opts = DevCharOptions {
            dev_char_path: dir.path().join("char"),
            create_all: true,
            dry_run: false,
        };
        let made = create_dev_char_symlinks(&host, &opts).unwrap();
        assert!(made.iter().all(|l| l.action == LinkAction::Create));
        assert_eq!(
            fs::read_link(dir.path().join("char/195:3")).unwrap(),
            dev.join("nvidia3")
        );
        let again = create_dev_char_symlinks(&host, &opts).unwrap();
        assert!(
            again.iter().all(|l| l.action == LinkAction::Keep),
            "{again:?}"
        );
    }

    #[test]
    fn wrong_links_are_replaced_and_files_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let host = host_with_proc(dir.path());
        let chars = dir.path().join("char");
        fs::create_dir_all(&chars).unwrap();
        symlink("/nowhere", chars.join("195:3")).unwrap();
        fs::write(chars.join("195:255"), "").unwrap();
        let opts = DevCharOptions {
            dev_char_path: chars.clone(),
            create_all: true,
            dry_run: true,
        };
        let plan = create_dev_char_symlinks(&host, &opts).unwrap();
        assert_eq!(
            plan[0].action,
            LinkAction::Replace {
                old: PathBuf::from("/nowhere")
            }
        );
        assert_eq!(plan[2].action, LinkAction::Blocked);
        assert_eq!(
            fs::read_link(chars.join("195:3")).unwrap(),
            PathBuf::from("/nowhere")
        );
        let done = create_dev_char_symlinks(
            &host,
            &DevCharOptions {
                dry_run: false,
                ..opts
            },
        )
        .unwrap();
        assert_eq!(done.len(), 5);
        assert_eq!(
            fs::read_link(chars.join("195:3")).unwrap(),
            dir.path().join("dev/nvidia3")
        );
        assert!(fs::symlink_metadata(chars.join("195:255"))
            .unwrap()
            .is_file());
    }
}
