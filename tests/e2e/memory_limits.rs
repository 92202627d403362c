//! GPU memory limits end to end: `NVIDIA_GPU_MEMORY_REQUEST` / `NVIDIA_GPU_MEMORY_LIMIT` in a
//! real runc container created through nvshim-runtime on the fake two-GPU host, with the fake
//! NVML (`tests/fake-nvml`) as the host's libnvidia-ml. runc runs the createRuntime hook with
//! the hook's env only, so the fake reads its topology from the file beside the library
//! (`nvshim_fake_nvml::topology_file_beside`), and records each successful
//! `nvmlDeviceSetMemoryLimits_v1` in `calls.jsonl`.
//!
//! NVML limits memory per cgroup v2 directory. On a host whose `/sys/fs/cgroup` is cgroup v1
//! or hybrid (the v2 hierarchy at `/sys/fs/cgroup/unified`), the runtime runs in a private
//! mount namespace with the unified hierarchy bound over `/sys/fs/cgroup`, so runc and the
//! hook see a cgroup v2 host; the checks read the same hierarchy from outside.
//!
//! Needs root, runc, and `cargo build --workspace` first (for `nvshim-hook` and the fake NVML).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use nvshim_fake_nvml::{memory_limit_calls, topology_file_beside, Gpu as NvmlGpu, Topology};
use nvshim_testsupport::{unique_id, Bundle, Runtime};
use serde_json::{json, Value};

use super::common::{fake_nvml, shim_at, SHIM};
use super::world::{SpecDirs, World};

const MIB: u64 = 1024 * 1024;
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

fn is_cgroup2(path: &str) -> bool {
    let c = std::ffi::CString::new(path).unwrap();
    let mut fs = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: a NUL-terminated path and a writable statfs buffer.
    if unsafe { libc::statfs(c.as_ptr(), fs.as_mut_ptr()) } != 0 {
        return false;
    }
    // SAFETY: statfs succeeded.
    #[allow(clippy::unnecessary_cast)]
    let t = unsafe { fs.assume_init() }.f_type as i64;
    t == CGROUP2_SUPER_MAGIC
}

/// Where the cgroup v2 hierarchy is mounted on this host (`None`: nowhere).
fn cgroup2_mount() -> Option<&'static str> {
    ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .into_iter()
        .find(|p| is_cgroup2(p))
}

/// The fake host with the fake NVML (unless `offers` is `None`) and one spec dir;
/// `offers`: whether its driver offers memory limits. `None`: the fake host's stub
/// libnvidia-ml stays, which has no `nvmlDeviceSetMemoryLimits_v1` (a driver before R615).
fn world(offers: Option<bool>) -> World {
    let w = World::builder().spec_dirs(SpecDirs::Run).build();
    let lib = w.host.host_path(&w.host.container_lib_path("libnvidia-ml"));
    if offers.is_some() {
        fs::copy(fake_nvml(), &lib).unwrap();
    }
    let topology = Topology {
        driver_version: w.host.driver_version().to_string(),
        cuda_driver_version: 13000,
        gpus: w
            .host
            .gpus()
            .iter()
            .map(|g| NvmlGpu {
                name: g.model.clone(),
                uuid: g.uuid.clone(),
                minor: g.minor,
                bus_id: g.bus_id.clone(),
                ..Default::default()
            })
            .collect(),
        memory_limits: offers,
        memory_limit_log: Some(calls(&w)),
    };
    fs::write(
        topology_file_beside(&lib),
        serde_json::to_string_pretty(&topology).unwrap(),
    )
    .unwrap();
    w
}

/// Where the fake NVML records its `nvmlDeviceSetMemoryLimits_v1` calls.
fn calls(w: &World) -> PathBuf {
    w.tmp.path().join("calls.jsonl")
}

/// nvshim-runtime, in a mount namespace where `/sys/fs/cgroup` is cgroup v2 when the host
/// mounts v2 elsewhere.
fn cgroup2_shim(w: &World) -> Runtime {
    let program = match cgroup2_mount() {
        Some("/sys/fs/cgroup") | None => PathBuf::from(SHIM),
        Some(unified) => {
            let script = w.tmp.path().join("shim-in-cgroup2.sh");
            fs::write(
                &script,
                format!(
                    "#!/bin/sh\nexec unshare -m --propagation private sh -c \
                     'mount --bind {unified} /sys/fs/cgroup && exec \"$0\" \"$@\"' {SHIM} \"$@\"\n"
                ),
            )
            .unwrap();
            fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
            script
        }
    };
    shim_at(program, w.tmp.path(), &w.config)
}

/// What a create saw: the container's init pid and its cgroup v2 path (`0::` line).
struct Created {
    pid: i64,
    cgroup: String,
    /// The cgroup's directory existed and its `cgroup.procs` listed the pid.
    pid_in_cgroup: bool,
    config: Value,
}

/// Creates the container, reads its pid and cgroup while it exists, then starts and deletes it.
fn create(w: &World, rt: &Runtime, b: &Bundle) -> Created {
    let id = unique_id("memlimits");
    let out = rt.create(b, &id).unwrap();
    assert!(
        out.success(),
        "create failed\n{out}\n--- nvshim.log ---\n{}",
        w.shim_log()
    );
    let state: Value = serde_json::from_str(&rt.state(&id).unwrap().stdout).unwrap();
    let pid = state["pid"].as_i64().unwrap();
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let cgroup = text
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap_or_default()
        .to_string();
    let pid_in_cgroup = cgroup2_mount().is_some_and(|mount| {
        let procs = Path::new(mount)
            .join(cgroup.trim_start_matches('/'))
            .join("cgroup.procs");
        fs::read_to_string(procs)
            .unwrap_or_default()
            .lines()
            .any(|l| l.trim() == pid.to_string())
    });
    let config = b.config().unwrap();
    let started = rt.start(&id).unwrap();
    assert!(started.success(), "start failed\n{started}");
    let _ = rt.delete(&id, true);
    Created {
        pid,
        cgroup,
        pid_in_cgroup,
        config,
    }
}

/// The createRuntime hooks that run apply-cuda-memory-limits.
fn memory_hooks(config: &Value) -> Vec<Value> {
    config
        .pointer("/hooks/createRuntime")
        .and_then(Value::as_array)
        .map(|hooks| {
            hooks
                .iter()
                .filter(|h| {
                    h["args"]
                        .as_array()
                        .is_some_and(|a| a.iter().any(|x| x == "apply-cuda-memory-limits"))
                })
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

/// The recorded calls are one per GPU, for the container's cgroup, with these limits.
fn assert_applied(w: &World, c: &Created, uuids: &[&str], soft_mib: u64, hard_mib: u64) {
    let calls = memory_limit_calls(&calls(w));
    assert_eq!(
        calls.iter().map(|c| c.uuid.as_str()).collect::<Vec<_>>(),
        uuids,
        "calls {calls:?}\n--- nvshim.log ---\n{}",
        w.shim_log()
    );
    for call in &calls {
        assert_eq!(call.soft_limit, soft_mib * MIB);
        assert_eq!(call.hard_limit, hard_mib * MIB);
        // The hook saw the v2 hierarchy at /sys/fs/cgroup; here it may be at .../unified.
        let expected = format!("/sys/fs/cgroup{}", c.cgroup);
        assert_eq!(call.name_space, expected, "pid {}", c.pid);
        assert!(!c.cgroup.is_empty() && c.cgroup != "/", "{}", c.cgroup);
    }
    // The directory existed, with the container's init in it, while the container did.
    assert!(c.pid_in_cgroup, "pid {} not in {}", c.pid, c.cgroup);
}

fn needs_cgroup2() -> bool {
    if cgroup2_mount().is_none() {
        eprintln!("skipped: this host mounts no cgroup v2 hierarchy");
        return false;
    }
    true
}

#[test]
fn legacy_request_gets_the_limit_on_its_gpu() {
    if !needs_cgroup2() {
        return;
    }
    let w = world(Some(true));
    let gpu = w.host.gpu_at_index(0).unwrap().uuid.clone();
    let b = w.bundle(
        "legacy",
        &["/bin/sh", "-c", "true"],
        &[
            ("NVIDIA_VISIBLE_DEVICES", "0"),
            ("NVIDIA_GPU_MEMORY_REQUEST", "1024"),
            ("NVIDIA_GPU_MEMORY_LIMIT", "2048"),
        ],
    );
    let c = create(&w, &cgroup2_shim(&w), &b);
    let hooks = memory_hooks(&c.config);
    assert_eq!(hooks.len(), 1, "{hooks:?}");
    let args: Vec<&str> = hooks[0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let root = w.host.root().display().to_string();
    assert_eq!(
        &args[..6],
        [
            "nvshim-hook",
            "apply-cuda-memory-limits",
            "--driver-root",
            root.as_str(),
            "--gpu-id",
            gpu.as_str()
        ]
    );
    assert_eq!(
        hooks[0]["env"],
        json!(["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"])
    );
    assert_applied(&w, &c, &[&gpu], 1024, 2048);
    assert!(!w.shim_log().contains("NOT applied"), "{}", w.shim_log());
}

#[test]
fn a_driver_without_the_call_warns_once_and_the_container_starts() {
    let w = world(Some(false));
    let b = w.bundle(
        "old-driver",
        &["/bin/sh", "-c", "true"],
        &[
            ("NVIDIA_VISIBLE_DEVICES", "1"),
            ("NVIDIA_GPU_MEMORY_REQUEST", "512"),
            ("NVIDIA_GPU_MEMORY_LIMIT", "1024"),
        ],
    );
    let c = create(&w, &cgroup2_shim(&w), &b);
    assert_eq!(memory_hooks(&c.config).len(), 1);
    assert!(memory_limit_calls(&calls(&w)).is_empty());
    let log = w.shim_log();
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains("NOT applied")).collect();
    assert_eq!(warnings.len(), 1, "{log}");
    assert!(
        warnings[0].contains("NVIDIA_GPU_MEMORY_LIMIT=1024 MiB"),
        "{log}"
    );
    if cgroup2_mount().is_some() {
        // The driver answered: its version and the call are named.
        assert!(warnings[0].contains(w.host.driver_version()), "{log}");
        assert!(
            warnings[0].contains("nvmlDeviceSetMemoryLimits_v1"),
            "{log}"
        );
    }
}

#[test]
fn a_driver_without_the_symbol_warns_once_and_the_container_starts() {
    if !needs_cgroup2() {
        return;
    }
    let w = world(None);
    let b = w.bundle(
        "no-symbol",
        &["/bin/sh", "-c", "true"],
        &[
            ("NVIDIA_VISIBLE_DEVICES", "0"),
            ("NVIDIA_GPU_MEMORY_REQUEST", "512"),
            ("NVIDIA_GPU_MEMORY_LIMIT", "1024"),
        ],
    );
    create(&w, &cgroup2_shim(&w), &b);
    let log = w.shim_log();
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains("NOT applied")).collect();
    assert_eq!(warnings.len(), 1, "{log}");
    assert!(
        warnings[0].contains(&format!(
            "driver {} does not offer",
            w.host.driver_version()
        )),
        "{log}"
    );
}

#[test]
fn nvidia_cdi_spec_hook_applies_the_limit() {
    if !needs_cgroup2() {
        return;
    }
    let w = world(Some(true));
    let gpu = w.host.gpu_at_index(0).unwrap().clone();
    let dev = |name: &str| w.host.dev_root().join("dev").join(name);
    // As nvidia-ctk writes it: the device's node, the control node, and the createRuntime
    // hook naming the GPU by UUID (the driver root is the fake host's, where its NVML is).
    let spec = json!({
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [{
            "name": "0",
            "containerEdits": {
                "deviceNodes": [{
                    "path": format!("/dev/nvidia{}", gpu.minor),
                    "hostPath": dev(&format!("nvidia{}", gpu.minor)),
                }],
            },
        }],
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": [{"path": "/dev/nvidiactl", "hostPath": dev("nvidiactl")}],
            "hooks": [{
                "hookName": "createRuntime",
                "path": w.hook_link("nvidia-cdi-hook"),
                "args": ["nvidia-cdi-hook", "apply-cuda-memory-limits",
                         "--driver-root", w.host.root(), "--gpu-id", gpu.uuid],
                "env": ["NVIDIA_CTK_DEBUG=false"],
            }],
        },
    });
    fs::write(w.run_cdi.join("nvidia.json"), spec.to_string()).unwrap();
    let b = w.bundle(
        "cdi",
        &["/bin/sh", "-c", "true"],
        &[
            ("NVIDIA_GPU_MEMORY_REQUEST", "1024"),
            ("NVIDIA_GPU_MEMORY_LIMIT", "4096"),
        ],
    );
    b.edit(|c| {
        c["annotations"] = json!({"cdi.k8s.io/memlimits": "nvidia.com/gpu=0"});
        Ok(())
    })
    .unwrap();
    let c = create(&w, &cgroup2_shim(&w), &b);
    // The spec's hook, and no second one from nvshim-runtime.
    let hooks = memory_hooks(&c.config);
    assert_eq!(hooks.len(), 1, "{hooks:?}");
    assert_eq!(hooks[0]["args"][0], "nvidia-cdi-hook");
    assert_applied(&w, &c, &[&gpu.uuid], 1024, 4096);
}

#[test]
fn cdi_device_without_a_spec_hook_gets_nvshims() {
    if !needs_cgroup2() {
        return;
    }
    let w = world(Some(true));
    let gpu = w.host.gpu_at_index(1).unwrap().clone();
    let spec = json!({
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [{
            "name": "1",
            "containerEdits": {
                "deviceNodes": [{
                    "path": format!("/dev/nvidia{}", gpu.minor),
                    "hostPath": w.host.dev_root().join(format!("dev/nvidia{}", gpu.minor)),
                }],
            },
        }],
    });
    fs::write(w.run_cdi.join("nvidia.json"), spec.to_string()).unwrap();
    let b = w.bundle(
        "cdi-own",
        &["/bin/sh", "-c", "true"],
        &[
            ("NVIDIA_GPU_MEMORY_REQUEST", "100"),
            ("NVIDIA_GPU_MEMORY_LIMIT", "200"),
        ],
    );
    b.edit(|c| {
        c["annotations"] = json!({"cdi.k8s.io/memlimits": "nvidia.com/gpu=1"});
        Ok(())
    })
    .unwrap();
    let c = create(&w, &cgroup2_shim(&w), &b);
    let hooks = memory_hooks(&c.config);
    assert_eq!(hooks.len(), 1, "{hooks:?}");
    assert_eq!(hooks[0]["args"][0], "nvshim-hook");
    assert_applied(&w, &c, &[&gpu.uuid], 100, 200);
}

#[test]
fn no_variables_no_hook() {
    let w = world(Some(true));
    for (name, env) in [
        ("none", &[("NVIDIA_VISIBLE_DEVICES", "all")][..]),
        (
            "limit-only",
            &[
                ("NVIDIA_VISIBLE_DEVICES", "0"),
                ("NVIDIA_GPU_MEMORY_LIMIT", "2048"),
            ][..],
        ),
    ] {
        let b = w.bundle(name, &["/bin/sh", "-c", "true"], env);
        let c = create(&w, &cgroup2_shim(&w), &b);
        assert!(memory_hooks(&c.config).is_empty(), "{name}: {}", c.config);
        assert!(
            c.config.pointer("/hooks/createContainer").is_some(),
            "{name}"
        );
    }
    assert!(memory_limit_calls(&calls(&w)).is_empty());
}

/// The GPU a CDI device's limit applies to is the one whose node the container gets, by the
/// host node's numbers, whatever the node is called in the container (`path: /dev/nvidia<A>` over
/// the host's `nvidia<B>` used to have GPU A limited): a renamed node, a swapped
/// pair, a node under another name, and a non-GPU node named like a GPU (no limit, no hook).
#[test]
fn cdi_limits_follow_the_host_node_not_the_container_path() {
    if !needs_cgroup2() {
        return;
    }
    let w = world(Some(true));
    let (a, b) = (
        w.host.gpu_at_index(0).unwrap().clone(),
        w.host.gpu_at_index(1).unwrap().clone(),
    );
    let host_node = |minor: u32| w.host.dev_root().join(format!("dev/nvidia{minor}"));
    let node = |path: String, host: PathBuf| json!({"path": path, "hostPath": host});
    let cases: Vec<(&str, Vec<Value>, Vec<&str>)> = vec![
        (
            "renamed",
            vec![node(format!("/dev/nvidia{}", a.minor), host_node(b.minor))],
            vec![&b.uuid],
        ),
        (
            "swapped",
            vec![
                node(format!("/dev/nvidia{}", a.minor), host_node(b.minor)),
                node(format!("/dev/nvidia{}", b.minor), host_node(a.minor)),
            ],
            vec![&b.uuid, &a.uuid],
        ),
        (
            "another-name",
            vec![node("/dev/gpu-x".into(), host_node(a.minor))],
            vec![&a.uuid],
        ),
        (
            "not-a-gpu",
            vec![node(
                format!("/dev/nvidia{}", a.minor),
                PathBuf::from("/dev/null"),
            )],
            vec![],
        ),
    ];
    for (name, nodes, want) in cases {
        let _ = fs::remove_file(calls(&w));
        let spec = json!({
            "cdiVersion": "0.5.0",
            "kind": "nvidia.com/gpu",
            "devices": [{"name": name, "containerEdits": {"deviceNodes": nodes}}],
        });
        fs::write(w.run_cdi.join("nvidia.json"), spec.to_string()).unwrap();
        let bundle = w.bundle(
            name,
            &["/bin/sh", "-c", "true"],
            &[
                ("NVIDIA_GPU_MEMORY_REQUEST", "100"),
                ("NVIDIA_GPU_MEMORY_LIMIT", "200"),
            ],
        );
        let device = format!("nvidia.com/gpu={name}");
        bundle
            .edit(move |c| {
                c["annotations"] = json!({"cdi.k8s.io/memlimits": device});
                Ok(())
            })
            .unwrap();
        let c = create(&w, &cgroup2_shim(&w), &bundle);
        let hooks = memory_hooks(&c.config);
        if want.is_empty() {
            assert!(hooks.is_empty(), "{name}: {hooks:?}");
            assert!(memory_limit_calls(&calls(&w)).is_empty(), "{name}");
            continue;
        }
        assert_eq!(hooks.len(), 1, "{name}: {hooks:?}");
        assert_applied(&w, &c, &want, 100, 200);
    }
}
