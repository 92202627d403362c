//! The sandbox profile ([`crate::config::Profile::Sandbox`]): the edits of a GPU container for a
//! runtime that skips or refuses OCI hooks and runs the container in its own kernel (gVisor's
//! `runsc`, Kata). The container keeps its device nodes and driver files and loses what needs a
//! hook or the host's kernel objects: the fix-ups hook (SONAME links, ld.so.cache, CUDA compat,
//! the `/proc/driver/nvidia/params` overmount, application profiles) and the daemons' sockets
//! and pipe directory (persistenced, fabric manager, MPS).
//!
//! Without the hook nothing adds the driver's folder to the image's ld.so.cache, so each 64-bit
//! library is also mounted at its SONAME in the folders the image's own loader searches when
//! its cache does not name the library: `/usr/lib` (glibc's built-in path on Debian and Ubuntu,
//! `ld.so --help`; musl's default `/lib:/usr/local/lib:/usr/lib` when the image has no
//! `/etc/ld-musl-<arch>.path`) and `/usr/lib64` (glibc's built-in path where it is configured
//! with lib64, as on Fedora and RHEL). Plain read-only bind mounts: no environment variable the
//! image or a CDI consumer would replace, nothing written into the image, and a setuid program
//! finds them too.

use crate::edits::{ContainerEdits, Mount};
use crate::host::DriverLibrary;
use crate::nvidia::{self, IPC_MOUNT_OPTIONS};

use super::MPS_PIPE_ENV;

/// Where each library is mounted again, at its SONAME.
pub const LOADER_DIRS: &[&str] = &["/usr/lib", "/usr/lib64"];

/// Makes `edits` (the driver's edits, with the mounts of `libs`) the sandbox profile's: no
/// hooks, no mount of a daemon's socket or pipe directory (the mounts with
/// [`IPC_MOUNT_OPTIONS`]) and no MPS variable, and each 64-bit library of `libs` mounted at
/// `<dir>/<SONAME>` for each of [`LOADER_DIRS`], as its own mount is.
pub fn confine(edits: &mut ContainerEdits, libs: &[DriverLibrary]) {
    edits.hooks.clear();
    edits.mounts.retain(|m| m.options != IPC_MOUNT_OPTIONS);
    edits
        .env
        .retain(|e| !e.starts_with(&format!("{MPS_PIPE_ENV}=")));
    let mut added: Vec<Mount> = Vec::new();
    for l in libs {
        let (dir, _) = l.file.container_path.rsplit_once('/').unwrap_or(("", ""));
        // A library in its own subfolder (`vdpau/`) is found by that path, not by the loader.
        let in_subdir = nvidia::LIBRARIES.iter().any(
            |r| matches!(r.naming, nvidia::Naming::Subdir(d) if dir.ends_with(&format!("/{d}"))),
        );
        // `libs` lists the 64-bit libraries first ([`super::DriverFiles::libs`]): a 32-bit one
        // has the SONAME of one already placed and is skipped.
        let placed = added
            .iter()
            .any(|m| m.container_path.ends_with(&format!("/{}", l.soname)));
        let own = edits
            .mounts
            .iter()
            .find(|m| m.container_path == l.file.container_path);
        let (Some(own), false, false) = (own, in_subdir, placed) else {
            continue;
        };
        for d in LOADER_DIRS {
            let container_path = format!("{d}/{}", l.soname);
            if !edits
                .mounts
                .iter()
                .any(|m| m.container_path == container_path)
            {
                added.push(Mount {
                    container_path,
                    ..own.clone()
                });
            }
        }
    }
    edits.mounts.extend(added);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::edits::Hook;
    use crate::host::HostFile;
    use crate::nvidia::MOUNT_OPTIONS;

    fn lib(container_path: &str, soname: &str) -> DriverLibrary {
        DriverLibrary {
            file: HostFile {
                host_path: format!("/driver{container_path}").into(),
                container_path: container_path.into(),
            },
            soname: soname.into(),
        }
    }

    fn mount(l: &DriverLibrary, options: &[&str]) -> Mount {
        Mount {
            host_path: l.file.host_path.to_string_lossy().into_owned(),
            container_path: l.file.container_path.clone(),
            kind: Some("bind".into()),
            options: options.iter().map(|o| o.to_string()).collect(),
        }
    }

    /// The 64-bit library at its SONAME in both folders, as its own mount is; not the 32-bit
    /// one of the same SONAME, nor the one in `vdpau/`; hooks, the socket mount and the MPS
    /// variable gone, everything else kept.
    #[test]
    fn confined_edits() {
        let libs = [
            lib(
                "/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06",
                "libcuda.so.1",
            ),
            lib(
                "/usr/lib/x86_64-linux-gnu/vdpau/libvdpau_nvidia.so.580.65.06",
                "libvdpau_nvidia.so.1",
            ),
            lib(
                "/usr/lib/i386-linux-gnu/libcuda.so.580.65.06",
                "libcuda.so.1",
            ),
        ];
        let socket = Mount {
            host_path: "/run/nvidia-persistenced/socket".into(),
            container_path: "/run/nvidia-persistenced/socket".into(),
            kind: Some("bind".into()),
            options: IPC_MOUNT_OPTIONS.iter().map(|o| o.to_string()).collect(),
        };
        let mut edits = ContainerEdits {
            mounts: libs.iter().map(|l| mount(l, MOUNT_OPTIONS)).collect(),
            env: vec![format!("{MPS_PIPE_ENV}=/tmp/nvidia-mps"), "A=1".into()],
            hooks: vec![Hook {
                hook_name: "createContainer".into(),
                path: "/usr/bin/nvshim-hook".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        edits.mounts.push(socket);
        confine(&mut edits, &libs);
        assert!(edits.hooks.is_empty());
        assert_eq!(edits.env, ["A=1"]);
        let paths: Vec<&str> = edits
            .mounts
            .iter()
            .map(|m| m.container_path.as_str())
            .collect();
        assert_eq!(
            paths,
            [
                "/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06",
                "/usr/lib/x86_64-linux-gnu/vdpau/libvdpau_nvidia.so.580.65.06",
                "/usr/lib/i386-linux-gnu/libcuda.so.580.65.06",
                "/usr/lib/libcuda.so.1",
                "/usr/lib64/libcuda.so.1",
            ]
        );
        let added = &edits.mounts[3];
        assert_eq!(
            (added.host_path.as_str(), &added.options, &added.kind),
            (
                "/driver/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06",
                &edits.mounts[0].options,
                &Some("bind".to_string())
            )
        );
        // Twice is once.
        let before = edits.clone();
        confine(&mut edits, &libs);
        assert_eq!(edits, before);
    }
}
