//! Stopping a running container's process, for `--mandatory` at `Synchronize`: a container
//! created and started while the plugin was down runs without its GPUs, and NRI honours no
//! eviction outside `CreateContainer`/`UpdateContainer` answers, so the plugin kills the
//! process itself.
//!
//! Race-free: a pidfd is opened on the pid the engine named, then `/proc/<pid>/cgroup` must
//! name the container's id (containerd's cgroup paths end in it: `/<parent>/<id>` with
//! cgroupfs, `cri-containerd-<id>.scope` with systemd), then the signal goes through the
//! pidfd. Had the process ended and its pid been reused in between, the pidfd would refer
//! to the ended process and the signal would fail (ESRCH): it never reaches another one.

use std::io;

use rustix::process::{pidfd_open, pidfd_send_signal, Pid, PidfdFlags, Signal};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum StopError {
    #[error(
        "the engine gave no process id for container {id}; stop it by hand (crictl stop {id})"
    )]
    NoPid { id: String },
    #[error("cannot open process {pid} of container {id} (pidfd_open: {source}); has it ended? `crictl inspect {id}` tells; does nvshim-nri run in the host's pid namespace (hostPID: true)?")]
    Open {
        pid: u32,
        id: String,
        source: io::Error,
    },
    #[error("cannot read /proc/{pid}/cgroup to check that process {pid} is container {id}'s: {source}; stop it by hand (crictl stop {id})")]
    Cgroup {
        pid: u32,
        id: String,
        source: io::Error,
    },
    #[error("process {pid} is not container {id}'s (its /proc/{pid}/cgroup does not name the container): left alone; stop the container by hand (crictl stop {id})")]
    NotThatContainer { pid: u32, id: String },
    #[error("cannot send SIGKILL to process {pid} of container {id}: {source}")]
    Signal {
        pid: u32,
        id: String,
        source: io::Error,
    },
}

/// Whether a `/proc/<pid>/cgroup` text puts the process in container `id`'s cgroup: a
/// line's path names the id (an empty id names nothing).
pub fn in_container_cgroup(cgroup: &str, id: &str) -> bool {
    !id.is_empty()
        && cgroup
            .lines()
            .filter_map(|l| l.splitn(3, ':').nth(2))
            .any(|path| path.contains(id))
}

/// Sends SIGKILL to process `pid`, once its cgroup shows it is container `id`'s.
pub fn kill_container_process(pid: u32, id: &str) -> Result<(), StopError> {
    let Some(target) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
        return Err(StopError::NoPid { id: id.into() });
    };
    let open = |source: rustix::io::Errno| StopError::Open {
        pid,
        id: id.into(),
        source: source.into(),
    };
    let fd = pidfd_open(target, PidfdFlags::empty()).map_err(open)?;
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).map_err(|source| {
        StopError::Cgroup {
            pid,
            id: id.into(),
            source,
        }
    })?;
    if !in_container_cgroup(&cgroup, id) {
        return Err(StopError::NotThatContainer { pid, id: id.into() });
    }
    pidfd_send_signal(&fd, Signal::KILL).map_err(|e| StopError::Signal {
        pid,
        id: id.into(),
        source: e.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f1c0a9e7b2d4c6e8f0a1b2c3d4e5f60718293a4b5c6d7e8f90123456789abcd";

    /// The lines' shapes: cgroup v1 (`N:controller:path`) and v2 (`0::path`), with the
    /// paths containerd makes (its CRI `getCgroupsPath`: `parent/id`, or the systemd driver's
    /// `parent:cri-containerd:id`, a `cri-containerd-<id>.scope` unit).
    #[test]
    fn the_cgroup_path_names_the_container() {
        let cgroupfs = format!("4:memory:/kubepods/besteffort/pod1/{ID}\n0::/\n");
        assert!(in_container_cgroup(&cgroupfs, ID));
        let systemd =
            format!("0::/kubepods.slice/kubepods-besteffort.slice/cri-containerd-{ID}.scope\n");
        assert!(in_container_cgroup(&systemd, ID));
        // Seen from a pod's cgroup namespace, the path climbs out with `..`.
        assert!(in_container_cgroup(&format!("0::/../../{ID}\n"), ID));
        assert!(!in_container_cgroup(
            "0::/system.slice/containerd.service\n",
            ID
        ));
        assert!(!in_container_cgroup(&cgroupfs, ""));
        // A controller's name is not a path.
        assert!(!in_container_cgroup("4:memory:/\n", "memory"));
    }

    /// A live process of another cgroup is left alone; a pid with no process is an error
    /// naming it. Both seen through the real syscalls.
    #[test]
    fn another_process_is_never_signalled() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let err = kill_container_process(child.id(), ID).unwrap_err();
        assert!(matches!(err, StopError::NotThatContainer { .. }), "{err}");
        assert!(child.try_wait().unwrap().is_none(), "the child was killed");
        child.kill().unwrap();
        child.wait().unwrap();
        let err = kill_container_process(0, ID).unwrap_err();
        assert!(matches!(err, StopError::NoPid { .. }), "{err}");
        // The largest pid Linux can give (PID_MAX_LIMIT): none has it.
        let err = kill_container_process(4_194_304, ID).unwrap_err();
        assert!(err.to_string().contains("4194304"), "{err}");
    }
}
