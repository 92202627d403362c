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
