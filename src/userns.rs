//! Containers with their own user namespace (`hostUsers: false` pods, `linux.namespaces` with
//! a `user` entry).
//!
//! In a user namespace the low-level runtime cannot `mknod`: runc (libcontainer
//! `createDevices`; seen with 1.1.5 and 1.3.6) bind-mounts each `linux.devices` entry from the
//! host path equal to its container path instead. Where nvshim's `dev-root` is
//! not `/` (a driver container's `/run/nvidia/driver`, the test host), that is not where the
//! node is, and the container fails to start (`error creating device nodes: mount /dev/nvidia1
//! ...: no such file or directory`). [`bind_device_nodes`] writes those entries as the bind
//! mounts runc would have made, from the right host path; the cgroup rules stay as they are.
//! docs/design.md ("User namespaces") says where each of nvshim's fix-ups runs and why.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::edits::ContainerEdits;

/// True when config.json puts the container in a user namespace of its own or joins one.
pub fn has_user_namespace(spec: &Value) -> bool {
    spec.pointer("/linux/namespaces")
        .and_then(Value::as_array)
        .is_some_and(|ns| {
            ns.iter()
                .any(|n| n.get("type").and_then(Value::as_str) == Some("user"))
        })
}

/// Whether the host node at `path` is the device `kind` `major:minor` (symlinks followed, as a
/// bind mount follows them).
fn is_device(path: &Path, kind: &str, major: u64, minor: u64) -> bool {
    let Ok(meta) = std::fs::metadata(path) else {
        return false;
    };
    let ft = meta.file_type();
    let kind_ok = match kind {
        "c" | "u" => ft.is_char_device(),
        "b" => ft.is_block_device(),
        _ => false,
    };
    let rdev = meta.rdev();
    kind_ok && nix::sys::stat::major(rdev) == major && nix::sys::stat::minor(rdev) == minor
}

/// Replaces each `linux.devices` entry that runc would bind-mount from the wrong host path
/// with a bind mount of the right one: the host path the edits gave the node (a CDI
/// `hostPath`), else the node under `dev_root`, used only when it is that very device. An
/// entry whose container path on the host already is the device stays (runc binds it
/// itself), and so does one whose node nvshim cannot find (runc's error names it). Covers the
/// entries an engine put there too (containerd's own CDI injection, which keeps only the
/// container path). Returns the container paths moved.
pub fn bind_device_nodes(
    spec: &mut Value,
    parts: &[&ContainerEdits],
    dev_root: &Path,
) -> Vec<String> {
    let Some(devices) = spec.pointer("/linux/devices").and_then(Value::as_array) else {
        return Vec::new();
    };
    let host_path_of = |path: &str| -> PathBuf {
        parts
            .iter()
            .flat_map(|e| &e.device_nodes)
            .rev()
            .find(|n| n.path == path)
            .and_then(|n| n.host_path.as_deref())
            .map_or_else(
                || dev_root.join(path.trim_start_matches('/')),
                PathBuf::from,
            )
    };
    let mut binds: Vec<(usize, String, PathBuf)> = Vec::new();
    for (i, d) in devices.iter().enumerate() {
        let (Some(path), Some(kind), Some(major), Some(minor)) = (
            d.get("path").and_then(Value::as_str),
            d.get("type").and_then(Value::as_str),
            d.get("major").and_then(Value::as_u64),
            d.get("minor").and_then(Value::as_u64),
        ) else {
            continue;
        };
        if is_device(Path::new(path), kind, major, minor) {
            continue;
        }
        let host = host_path_of(path);
        if is_device(&host, kind, major, minor) {
            binds.push((i, path.to_string(), host));
        }
    }
    if binds.is_empty() {
        return Vec::new();
    }
    if let Some(Value::Array(devices)) = spec.pointer_mut("/linux/devices") {
        for (i, _, _) in binds.iter().rev() {
            devices.remove(*i);
        }
    }
    let Some(root) = spec.as_object_mut() else {
        return Vec::new();
    };
    let mounts = root
        .entry("mounts")
        .or_insert_with(|| Value::Array(Vec::new()));
    if !mounts.is_array() {
        *mounts = Value::Array(Vec::new());
    }
    let Value::Array(mounts) = mounts else {
        return Vec::new();
    };
    let mut moved = Vec::with_capacity(binds.len());
    for (_, path, host) in binds {
        // As CDI merges a mount: the first with the same destination gives way.
        if let Some(at) = mounts
            .iter()
            .position(|m| m.get("destination").and_then(Value::as_str) == Some(&path))
        {
            mounts.remove(at);
        }
        // What runc's own bind of a device node is (`bindMountDeviceNode`: MS_BIND only).
        mounts.push(json!({
            "destination": path,
            "type": "bind",
            "source": host.to_string_lossy(),
            "options": ["bind"],
        }));
        moved.push(path);
    }
    moved
}

/// Whether container gid `gid` is inside one of config.json's `linux.gidMappings`.
fn gid_mapped(spec: &Value, gid: u64) -> bool {
    spec.pointer("/linux/gidMappings")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|m| {
            let field = |k: &str| m.get(k).and_then(Value::as_u64);
            matches!((field("containerID"), field("size")), (Some(start), Some(size)) if gid >= start && gid - start < size)
        })
}

/// Removes the `process.user.additionalGids` the edits added that the container's gid
/// mappings leave unmapped: runc's `setgroups` fails on an unmapped gid (EINVAL) and the
/// container would not start, for a group that could not have owned a host node as seen from
/// inside anyway (unmapped host groups show as the overflow gid). Returns the gids removed.
pub fn drop_unmapped_gids(spec: &mut Value, parts: &[&ContainerEdits]) -> Vec<u32> {
    let added: Vec<u32> = parts
        .iter()
        .flat_map(|e| &e.additional_gids)
        .copied()
        .filter(|g| !gid_mapped(spec, u64::from(*g)))
        .collect();
    if added.is_empty() {
        return added;
    }
    if let Some(Value::Array(gids)) = spec.pointer_mut("/process/user/additionalGids") {
        gids.retain(|g| {
            !g.as_u64()
                .is_some_and(|g| added.iter().any(|a| u64::from(*a) == g))
        });
    }
    added
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::edits::DeviceNode;

    fn userns_spec(devices: Value) -> Value {
        json!({
            "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
            "linux": {
                "namespaces": [{"type": "mount"}, {"type": "user"}],
                "gidMappings": [{"containerID": 0, "hostID": 100000, "size": 65536}],
                "devices": devices,
                "resources": {"devices": [{"allow": true, "type": "c", "major": 1, "minor": 3, "access": "rwm"}]}
            },
            "process": {"user": {"uid": 0, "gid": 0, "additionalGids": [5, 70000]}}
        })
    }

    #[test]
    fn user_namespace_is_seen() {
        assert!(has_user_namespace(&userns_spec(json!([]))));
        assert!(!has_user_namespace(
            &json!({"linux": {"namespaces": [{"type": "pid"}]}})
        ));
        assert!(!has_user_namespace(&json!({})));
    }

    /// `/dev/null` (1:3) stands for a GPU node: found under a "dev-root" that is `/`, it stays
    /// a device entry; named by a `hostPath` elsewhere, it becomes a bind mount of that path.
    #[test]
    fn only_nodes_runc_would_miss_become_binds() {
        let dev_null = json!({"path": "/dev/null", "type": "c", "major": 1, "minor": 3});
        let mut spec = userns_spec(json!([dev_null]));
        assert!(bind_device_nodes(&mut spec, &[], Path::new("/")).is_empty());
        assert_eq!(spec["linux"]["devices"].as_array().unwrap().len(), 1);

        let odd = json!({"path": "/dev/nvidia0", "type": "c", "major": 1, "minor": 3});
        let wrong = json!({"path": "/dev/nvidia1", "type": "c", "major": 1, "minor": 5});
        let mut spec = userns_spec(json!([odd, wrong]));
        let edits = ContainerEdits {
            device_nodes: vec![
                DeviceNode {
                    path: "/dev/nvidia0".into(),
                    host_path: Some("/dev/null".into()),
                    ..Default::default()
                },
                DeviceNode {
                    path: "/dev/nvidia1".into(),
                    host_path: Some("/dev/null".into()),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let moved = bind_device_nodes(&mut spec, &[&edits], Path::new("/nonexistent"));
        assert_eq!(moved, ["/dev/nvidia0"]);
        // 1:5 is not what /dev/null is: left for runc to report.
        assert_eq!(spec["linux"]["devices"], json!([wrong]));
        assert_eq!(
            spec["mounts"][1],
            json!({"destination": "/dev/nvidia0", "type": "bind", "source": "/dev/null", "options": ["bind"]})
        );
        // The cgroup rules are untouched.
        assert_eq!(
            spec["linux"]["resources"]["devices"]
                .as_array()
                .unwrap()
                .len(),
            1
        );
    }

    #[test]
    fn unmapped_added_gids_are_dropped() {
        let mut spec = userns_spec(json!([]));
        let edits = ContainerEdits {
            additional_gids: vec![5, 70000],
            ..Default::default()
        };
        assert_eq!(drop_unmapped_gids(&mut spec, &[&edits]), [70000]);
        assert_eq!(spec["process"]["user"]["additionalGids"], json!([5]));
    }
}
