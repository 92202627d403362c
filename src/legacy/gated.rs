//! The feature-gated requests resolved ([`crate::request::gated`]): one [`Cause::Feature`]
//! group per feature with what the host has for it ([`crate::host::gated::discover`]).
//!
//! As NVIDIA's runtime (`internal/modifier/gated.go`, `internal/discover/*.go`): the nodes
//! with `rwm` cgroup rules, GDS's files mounted read-only at their paths (`ro, nosuid, nodev,
//! rbind, rprivate`, `internal/discover/mounts.go`), and anything missing only logged: the
//! features are optional, so a host without them still starts the container. Nodes are
//! written as for the DRM nodes (number, mode and owner as found; the group added to the
//! container's groups when the node is not world read-write, as NVIDIA ≥ 1.19 does).

use crate::edits::{Cause, ContainerEdits, EditGroup};
use crate::host::gated::Found;
use crate::nvidia::MOUNT_OPTIONS;

/// The groups, and what to warn about.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Gated {
    /// One per feature that has anything on this host.
    pub groups: Vec<EditGroup>,
    /// Per feature asked for, what is not there (logged and shown by `nvshim explain`).
    pub warnings: Vec<String>,
}

/// The edits for what `found` holds (the discovery of the features a request enables).
pub fn resolve(found: &[Found]) -> Gated {
    let mut out = Gated::default();
    for f in found {
        let var = f.feature.variable();
        if f.nodes.is_empty() {
            out.warnings.push(format!(
                "{var}=enabled: the container starts without {}: {}",
                f.feature.title(),
                f.notes.join("; ")
            ));
            continue;
        }
        for note in &f.notes {
            out.warnings.push(format!("{var}=enabled: {note}"));
        }
        let mut edits = ContainerEdits::default();
        for (node, gid) in f.nodes.iter().map(super::drm_node) {
            edits.device_nodes.push(node);
            if let Some(g) = gid.filter(|g| !edits.additional_gids.contains(g)) {
                edits.additional_gids.push(g);
            }
        }
        for file in &f.files {
            edits.mounts.push(super::bind(
                &file.host_path,
                &file.container_path,
                MOUNT_OPTIONS,
            ));
        }
        out.groups.push(EditGroup {
            cause: Cause::Feature(f.feature),
            edits,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::gated::Feature;
    use crate::host::{HostDeviceNode, HostFile};

    fn node(path: &str, major: u32, minor: u32, mode: u32, gid: u32) -> HostDeviceNode {
        HostDeviceNode {
            container_path: path.into(),
            host_path: format!("/host{path}").into(),
            kind: 'c',
            major,
            minor,
            file_mode: mode,
            uid: 0,
            gid,
        }
    }

    #[test]
    fn nodes_and_files_in_one_group_per_feature() {
        let found = [
            Found {
                feature: Feature::Gds,
                nodes: vec![node("/dev/nvidia-fs0", 506, 0, 0o666, 0)],
                files: vec![HostFile {
                    host_path: "/host/etc/cufile.json".into(),
                    container_path: "/etc/cufile.json".into(),
                }],
                notes: vec![],
            },
            Found {
                feature: Feature::Mofed,
                nodes: vec![node("/dev/infiniband/uverbs0", 231, 192, 0o660, 109)],
                files: vec![],
                notes: vec!["no /dev/infiniband/rdma_cm char device under /host/dev".into()],
            },
        ];
        let g = resolve(&found);
        assert_eq!(g.groups.len(), 2);
        assert_eq!(g.groups[0].cause, Cause::Feature(Feature::Gds));
        let gds = &g.groups[0].edits;
        assert_eq!(gds.device_nodes[0].major, Some(506));
        assert_eq!(gds.device_nodes[0].permissions.as_deref(), Some("rwm"));
        assert_eq!(gds.mounts[0].host_path, "/host/etc/cufile.json");
        assert_eq!(gds.mounts[0].options, MOUNT_OPTIONS);
        // A node only its group may use: the group is added, as NVIDIA does.
        assert_eq!(g.groups[1].edits.additional_gids, vec![109]);
        assert_eq!(
            g.warnings,
            vec!["NVIDIA_MOFED=enabled: no /dev/infiniband/rdma_cm char device under /host/dev"]
        );
    }

    #[test]
    fn nothing_on_the_host_is_a_warning_not_an_error() {
        let found = [Found {
            feature: Feature::Gdrcopy,
            nodes: vec![],
            files: vec![],
            notes: vec!["no /dev/gdrdrv char device under /host/dev".into()],
        }];
        let g = resolve(&found);
        assert!(g.groups.is_empty());
        assert!(g.warnings[0].contains("NVIDIA_GDRCOPY=enabled"), "{g:?}");
        assert!(g.warnings[0].contains("/dev/gdrdrv"), "{g:?}");
    }
}
