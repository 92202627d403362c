//! Containers with their own user namespace (container uid/gid 0 → host 100000, 65536 ids)
//! asking for a GPU through nvshim-runtime over runc: by `NVIDIA_VISIBLE_DEVICES` and by CDI
//! annotation. In a user namespace runc cannot `mknod` and bind-mounts device nodes from the
//! host instead (src/userns.rs); the fix-ups hook runs as the container's root, mapped. Checked
//! from inside: the mapping, the GPU and control nodes (owned by the overflow uid, as any host
//! root's file), `ldconfig -p` listing libcuda, `nvidia-smi`; from the host: the ld cache the
//! hook wrote belongs to the mapped uid, not to host root.
//!
//! runc: `$NVSHIM_USERNS_RUNC`, else sid's (`/var/cache/nvshim-engines/sid/bin/runc`, 1.3, from
//! scripts/install-engines.sh) when installed, else the `runc` on `PATH`. The rootfs is a copy
//! chowned to the mapped root, as containerd's snapshotter makes one for a user-namespaced pod
//! without idmapped mounts.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use nvshim_testsupport::probe::assert_no_problems;
use nvshim_testsupport::{unique_id, Bundle, FakeGpu, ProbeReport, ProbeSpec, Runtime};
use serde_json::{json, Value};

use super::common::{shim_at, SHIM};
use super::world::{SpecDirs, World};

/// The mapping: container 0 → host 100000, 65536 ids (the kubelet's default range size).
pub const HOST_ID: u32 = 100_000;
pub const SIZE: u32 = 65_536;
/// The kernel's overflow uid and gid: how an unmapped host id (root's) shows inside.
const OVERFLOW: &str = "65534";

fn runc() -> PathBuf {
    if let Some(p) = std::env::var_os("NVSHIM_USERNS_RUNC") {
        return p.into();
    }
    let sid = Path::new("/var/cache/nvshim-engines/sid/bin/runc");
    if sid.is_file() {
        return sid.to_path_buf();
    }
    PathBuf::from("runc")
}

/// The world with its config naming `runc()`, its temp dir traversable by the mapped root (runc
/// init and the hook run as host uid 100000: the rootfs and the fake host's files must be
/// reachable, as `/run/containerd` is).
fn world() -> World {
    let w = World::builder()
        .spec_dirs(SpecDirs::Run)
        .config(&format!(
            "low-level-runtimes = [{:?}]\n",
            runc().display().to_string()
        ))
        .build();
    fs::set_permissions(w.tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
    w
}

/// Lines printed before the probe's: the ids and the uid map as the process sees them, and
/// `ls -ln` of the NVIDIA nodes.
const ID_LINES: &str = r#"
echo "ID $(id -u) $(id -g)"
while read -r a b c; do echo "UIDMAP $a $b $c"; done < /proc/self/uid_map
ls -ln /dev/nvidia* | while read -r l; do echo "LSN $l"; done
"#;

/// A probe bundle ([`script`]) in a user namespace, its rootfs owned by the mapped root.
fn userns_bundle(w: &World, name: &str, env: &[(&str, &str)], annotations: Value) -> Bundle {
    let b = w.bundle(name, &["sh", "-c", &script()], env);
    b.edit(move |c| {
        c["linux"]["namespaces"]
            .as_array_mut()
            .unwrap()
            .push(json!({"type": "user"}));
        let map = json!([{"containerID": 0, "hostID": HOST_ID, "size": SIZE}]);
        c["linux"]["uidMappings"] = map.clone();
        c["linux"]["gidMappings"] = map;
        if !annotations.is_null() {
            c["annotations"] = annotations;
        }
        Ok(())
    })
    .unwrap();
    let rootfs = b.dir().join("rootfs");
    let out = Command::new("chown")
        .args(["-R", &format!("{HOST_ID}:{HOST_ID}")])
        .arg(&rootfs)
        .output()
        .unwrap();
    assert!(out.status.success(), "chown: {out:?}");
    b
}

fn shim(w: &World) -> Runtime {
    shim_at(SHIM, w.tmp.path(), &w.config)
}

/// The probe script with [`ID_LINES`] first, without the `mknod` probe: a user namespace
/// cannot make device nodes at all, allowed or not.
pub fn script() -> String {
    format!("{ID_LINES}{}", ProbeSpec { mknod: vec![] }.script())
}

/// What a user checks inside: ids 0 mapped to [`HOST_ID`], exactly the GPU `gpu`, the
/// control nodes, libcuda in the ld cache, nvidia-smi, and the GPU node owned by the overflow
/// ids (the host's root is not mapped).
pub fn problems(w: &World, report: &ProbeReport, gpu: &FakeGpu) -> Vec<String> {
    let lines: Vec<&str> = report.raw.lines().collect();
    let mut problems = report.gpu_problems(&w.host, &[gpu]);
    if !lines.contains(&"ID 0 0") {
        problems.push("`id` does not show uid and gid 0".into());
    }
    if !lines.contains(&format!("UIDMAP 0 {HOST_ID} {SIZE}").as_str()) {
        problems.push(format!("/proc/self/uid_map is not 0 {HOST_ID} {SIZE}"));
    }
    problems.extend(report.control_device_problems(&w.host));
    problems.extend(report.ldcache_problems("libcuda.so.1"));
    problems.extend(report.smi_problems(&[gpu]));
    // `ls -ln`: `crw-rw-rw- 1 65534 65534 195, 1 ... /dev/nvidia1`, the host's node as seen
    // through the mapping.
    let node = format!("/dev/nvidia{}", gpu.minor);
    let ls = lines
        .iter()
        .find(|l| l.starts_with("LSN ") && l.ends_with(&node));
    match ls.map(|l| l.split_whitespace().collect::<Vec<_>>()) {
        Some(f) if f.len() > 4 && f[3] == OVERFLOW && f[4] == OVERFLOW => {}
        _ => problems.push(format!(
            "ls -ln {node}: {ls:?}, expected owner {OVERFLOW}:{OVERFLOW}"
        )),
    }
    problems
}

/// Runs the bundle and checks what a user would ([`problems`]), then from the host: the
/// hook's ld cache owned by the mapped root, and the GPU node a bind of the dev-root's.
#[track_caller]
fn assert_runs_with_gpu(w: &World, what: &str, b: &Bundle, gpu: &FakeGpu) {
    let out = shim(w).run(b, &unique_id("userns")).unwrap();
    let report = ProbeReport::parse(&out.stdout);
    assert!(
        out.success() && report.complete,
        "{what}: the container did not run ({})\n{out}\n--- nvshim.log ---\n{}",
        runc().display(),
        w.shim_log()
    );
    let problems = problems(w, &report, gpu);
    let node = format!("/dev/nvidia{}", gpu.minor);
    assert_no_problems(what, &problems, &report);
    let cache = fs::metadata(b.dir().join("rootfs/etc/ld.so.cache")).unwrap();
    assert_eq!(
        (cache.uid(), cache.gid()),
        (HOST_ID, HOST_ID),
        "{what}: the hook's ld cache is not the mapped root's"
    );
    // No device entry for an NVIDIA node is left for runc to look up at its container path.
    let config: Value = b.config().unwrap();
    let devices = config.pointer("/linux/devices").and_then(Value::as_array);
    assert!(
        devices
            .into_iter()
            .flatten()
            .all(|d| !d["path"].as_str().unwrap_or("").starts_with("/dev/nvidia")),
        "{what}: {devices:#?}"
    );
    let source = w.host.dev_root().join(node.trim_start_matches('/'));
    assert!(
        config["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["destination"] == node.as_str()
                && m["source"] == source.to_str().unwrap()
                && m["type"] == "bind"),
        "{what}: no bind of {} at {node}: {:#?}",
        source.display(),
        config["mounts"]
    );
}

#[test]
fn env_request_in_a_user_namespace_through_runc() {
    let w = world();
    let b = userns_bundle(&w, "env", &[("NVIDIA_VISIBLE_DEVICES", "1")], Value::Null);
    assert_runs_with_gpu(&w, "userns, NVIDIA_VISIBLE_DEVICES=1", &b, w.gpu(1));
}

#[test]
fn cdi_annotation_in_a_user_namespace_through_runc() {
    let w = world();
    w.generate();
    let b = userns_bundle(
        &w,
        "cdi",
        &[],
        json!({"cdi.k8s.io/nvshim-e2e": "nvidia.com/gpu=0"}),
    );
    assert_runs_with_gpu(&w, "userns, annotation nvidia.com/gpu=0", &b, w.gpu(0));
}
