//! End-to-end tests of the request forms NVIDIA's Kubernetes components hand down, each
//! through `nvshim-runtime` in front of real runc on a simulated host and checked from inside the container by the probe:
//!
//! - the device plugin's three strategies: `NVIDIA_VISIBLE_DEVICES` with UUIDs (time-sliced
//!   replicas repeat one), `/dev/null` volume mounts under `/var/run/nvidia-container-devices`,
//!   and `cdi.k8s.io/nvidia-device-plugin_<id>` annotations;
//! - the DRA driver's transient specs (a base spec of kind `k8s.gpu.nvidia.com/device` and a
//!   claim spec of kind `k8s.gpu.nvidia.com/claim` with MPS edits), also through podman, and a
//!   second `create` of an already applied bundle changing nothing;
//! - a spec naming NVIDIA's `nvidia-cdi-hook`, run with only nvshim installed;
//! - MIG devices by index and UUID (fake NVML topology, `mig-minors`), and the MIG config and
//!   monitor capabilities;
//! - IMEX channels by environment variable and through `nvshim cdi generate --mode imex`;
//! - the GPU Operator's layout (driver root and dev root apart), and the MPS pipe directory.
//!
//! The fake host (`FakeHostSpec::with_gpus(2)`) puts minor 0 at bus 0000:3b:00.0 and minor 1 at
//! 0000:1b:00.0, so index 0 (bus order) is `/dev/nvidia1` and index 1 is `/dev/nvidia0`. The
//! specs the tests write are shaped like the real producers' (k8s-dra-driver-gpu
//! `cmd/gpu-kubelet-plugin/cdi.go` and `sharing.go`, nvidia-ctk's generator), with host paths
//! into the fake host. Everything runs as root; each test has its own temp dirs, runc `--root`
//! and container ids.

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};

use nvshim::cdi::spec;
use nvshim_fake_nvml::{Gpu as NvmlGpu, MigDevice, Topology, TOPOLOGY_ENV};
use nvshim_testsupport::host::{mig_cap_minor, MIG_CONFIG_MINOR, MIG_MONITOR_MINOR};
use nvshim_testsupport::podman::{Podman, SystemSpec};
use nvshim_testsupport::probe::assert_no_problems;
use nvshim_testsupport::{
    unique_id, Bundle, FakeGpu, FakeHost, ProbeReport, ProbeSpec, RunOutput, Runtime,
};
use serde_json::{json, Value};

use super::common::hook_path;
use super::world::{create_at_once, SpecDirs, World};

const LIB_DIR: &str = "/usr/lib/x86_64-linux-gnu";
const DEVICE_MOUNT_ROOT: &str = "/var/run/nvidia-container-devices";
/// The options nvidia-ctk and the DRA driver give driver file mounts.
const DRIVER_MOUNT_OPTIONS: &[&str] = &["ro", "nosuid", "nodev", "rbind", "rprivate"];

/// The fake two-GPU host with one spec dir, `<tmp>/run-cdi` (the `/var/run/cdi` role).
fn world() -> World {
    World::builder().spec_dirs(SpecDirs::Run).build()
}

/// A probe bundle with mknod checks for every GPU minor plus `extra_mknod`.
fn mknod_bundle(w: &World, name: &str, extra_mknod: &[(u32, u32)]) -> Bundle {
    let mut probe = ProbeSpec::for_host(&w.host);
    probe.mknod.extend_from_slice(extra_mknod);
    let args = probe.args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    w.bundle(name, &args, &[])
}

fn annotated_bundle(w: &World, name: &str, annotations: Value) -> Bundle {
    let b = w.probe_bundle(name, &[]);
    b.edit(move |c| {
        c["annotations"] = annotations;
        Ok(())
    })
    .unwrap();
    b
}

/// `create` must fail before touching anything: non-zero exit, stderr containing each of
/// `needles`, config.json byte-identical, no container left.
#[track_caller]
fn assert_rejected(w: &World, rt: &Runtime, bundle: &Bundle, needles: &[&str]) -> RunOutput {
    let before = bundle.config_bytes().unwrap();
    let id = unique_id("k8s-e2e-reject");
    let out = rt.create(bundle, &id).unwrap();
    let (_, stderr) = rt.container_output(&id).unwrap();
    assert!(
        !out.success(),
        "create should have failed\n{out}\n--- nvshim.log ---\n{}",
        w.shim_log()
    );
    for n in needles {
        assert!(stderr.contains(n), "stderr should mention {n:?}: {stderr}");
    }
    assert_eq!(
        bundle.config_bytes().unwrap(),
        before,
        "config.json changed although create failed"
    );
    assert_eq!(rt.status(&id).unwrap(), None, "runc knows container {id}");
    out
}

fn sorted(mut p: Vec<String>) -> Vec<String> {
    p.sort();
    p.dedup();
    p
}

/// Exactly `selected` GPUs, the control nodes, libcuda mounted read-only and in the ld cache.
fn gpu_container_problems(r: &ProbeReport, host: &FakeHost, selected: &[&FakeGpu]) -> Vec<String> {
    let mut p = r.gpu_problems(host, selected);
    p.extend(r.control_device_problems(host));
    p.extend(r.library_mounted_problems(host, "libcuda"));
    p.extend(r.ldcache_problems("libcuda.so.1"));
    sorted(p)
}

fn env_problems(r: &ProbeReport, key: &str, want: Option<&str>) -> Vec<String> {
    if r.env.get(key).map(String::as_str) == want {
        Vec::new()
    } else {
        vec![format!(
            "{key} is {:?} in the container, expected {want:?}",
            r.env.get(key)
        )]
    }
}

fn privileged(b: &Bundle) {
    b.edit(|c| {
        let caps = c
            .pointer_mut("/process/capabilities/bounding")
            .and_then(Value::as_array_mut)
            .unwrap();
        caps.push(json!("CAP_SYS_ADMIN"));
        Ok(())
    })
    .unwrap();
}

// ---- the device plugin -------------------------------------------------------------------------

#[test]
fn device_plugin_envvar_strategy_with_time_sliced_replicas() {
    let w = world();
    let gpu = w.gpu(1);
    // A time-sliced GPU shared twice by one container: the plugin strips the replica suffixes
    // (`GPU-x::0`, `GPU-x::1`) and lists the UUID twice.
    let list = format!("{0},{0}", gpu.uuid);
    let b = w.probe_bundle("b1", &[("NVIDIA_VISIBLE_DEVICES", &list)]);
    let r = w.run(&b);
    let mut p = gpu_container_problems(&r, &w.host, &[gpu]);
    p.extend(r.smi_problems(&[gpu]));
    assert_no_problems("envvar strategy, time-sliced UUID twice", &p, &r);

    // A node that trusts only the kubelet: the variable from an unprivileged container fails
    // the create (naming the setting and the fix) instead of running without its GPU; a CUDA
    // image's own `all` is not a request there; a privileged container is honoured.
    w.configure("accept-envvar-unprivileged = false\n");
    let b = w.probe_bundle("b2", &[("NVIDIA_VISIBLE_DEVICES", &list)]);
    assert_rejected(
        &w,
        &w.shim(),
        &b,
        &[
            "NVIDIA_VISIBLE_DEVICES",
            "is refused",
            "accept-envvar-unprivileged = false",
            "volume-mounts",
        ],
    );
    let b = w.probe_bundle("b2all", &[("NVIDIA_VISIBLE_DEVICES", "all")]);
    let before = b.config_bytes().unwrap();
    let r = w.run(&b);
    assert_no_problems(
        "a CUDA image's all, unprivileged, accept-envvar-unprivileged = false",
        &r.no_nvidia_problems(&w.host),
        &r,
    );
    assert_eq!(b.config_bytes().unwrap(), before, "config.json changed");
    let b = w.probe_bundle("b3", &[("NVIDIA_VISIBLE_DEVICES", &list)]);
    privileged(&b);
    let r = w.run(&b);
    assert_no_problems(
        "privileged with accept-envvar-unprivileged = false",
        &gpu_container_problems(&r, &w.host, &[gpu]),
        &r,
    );
}

/// A `linux.devices` entry as containerd writes a device plugin's `DeviceSpec`
/// (`PASS_DEVICE_SPECS=true`) or a CDI device node it applied: the host node's numbers.
fn engine_device(minor: u32) -> Value {
    json!({"path": format!("/dev/nvidia{minor}"), "type": "c", "major": 195, "minor": minor, "fileMode": 8630, "uid": 0, "gid": 0})
}

/// `accept-envvar-unprivileged = "allocation-backed"` for each device-plugin strategy: the
/// variable is honoured when the allocation beside it names (mounts, annotations) or holds
/// (device nodes) the same GPUs, and a pod that widens it fails to create.
#[test]
fn allocation_backed_envvar_policy() {
    let w = world();
    w.configure("accept-envvar-unprivileged = \"allocation-backed\"\n");
    let (gpu, other) = (w.gpu(1), w.gpu(0));
    let rt = w.shim();
    // The envvar strategy at its defaults: nothing beside the variable.
    let b = w.probe_bundle("bare", &[("NVIDIA_VISIBLE_DEVICES", &gpu.uuid)]);
    assert_rejected(
        &w,
        &rt,
        &b,
        &["allocation-backed", "device checkpoint", &gpu.uuid],
    );
    // envvar with PASS_DEVICE_SPECS=true: the engine put the GPU's node in the spec.
    let with_node = |name: &str, env: &str, minor: u32| {
        let b = w.probe_bundle(name, &[("NVIDIA_VISIBLE_DEVICES", env)]);
        b.edit(move |c| {
            let devices = c
                .pointer_mut("/linux/devices")
                .and_then(Value::as_array_mut);
            match devices {
                Some(d) => d.push(engine_device(minor)),
                None => c["linux"]["devices"] = json!([engine_device(minor)]),
            }
            Ok(())
        })
        .unwrap();
        b
    };
    let r = w.run(&with_node("specs", &gpu.uuid, gpu.minor));
    assert_no_problems(
        "envvar + device specs, allocation-backed",
        &gpu_container_problems(&r, &w.host, &[gpu]),
        &r,
    );
    // The same allocation, and a pod that asks for every GPU or another one (also by CDI
    // name, which a device node cannot back).
    let b = with_node("wide-cdi", "nvidia.com/gpu=all", gpu.minor);
    assert_rejected(&w, &rt, &b, &["allocation-backed", "not CDI names"]);
    for (name, env) in [
        ("wide-all", "all".to_string()),
        ("wide-other", format!("{},{}", gpu.uuid, other.uuid)),
    ] {
        let b = with_node(name, &env, gpu.minor);
        assert_rejected(&w, &rt, &b, &["allocation-backed", "is refused"]);
    }
    // volume-mounts markers back the variable even with accept-volume-mounts off.
    let with_marker = |name: &str, env: &str| {
        let b = w.probe_bundle(name, &[("NVIDIA_VISIBLE_DEVICES", env)]);
        let mount = device_mount(&gpu.uuid);
        b.edit(move |c| {
            c["mounts"].as_array_mut().unwrap().push(mount);
            Ok(())
        })
        .unwrap();
        b
    };
    let r = w.run(&with_marker("marker", &gpu.uuid));
    assert_no_problems(
        "envvar + volume-mount marker, allocation-backed",
        &gpu_container_problems(&r, &w.host, &[gpu]),
        &r,
    );
    let b = with_marker("marker-wide", &other.uuid);
    assert_rejected(&w, &rt, &b, &["does not name", &other.uuid]);
    // A CUDA image's `all` in a pod without a GPU: not a request, the container runs without.
    let b = w.probe_bundle("image-all", &[("NVIDIA_VISIBLE_DEVICES", "all")]);
    let r = w.run(&b);
    assert_no_problems(
        "image all, nothing allocated",
        &r.no_nvidia_problems(&w.host),
        &r,
    );

    // The envvar strategy at its defaults on a containerd node: the kubelet's checkpoint
    // names the container's devices (shaped as kubelet devicemanager/checkpoint writes it;
    // `::1` a time-sliced replica).
    let checkpoint = w
        .tmp
        .path()
        .join("kubelet/device-plugins/kubelet_internal_checkpoint");
    fs::create_dir_all(checkpoint.parent().unwrap()).unwrap();
    let write_checkpoint = |uid: &str, ids: Value, mode: u32| {
        let doc = json!({"Data": {"PodDeviceEntries": [{
            "PodUID": uid, "ContainerName": "cuda", "ResourceName": "nvidia.com/gpu",
            "DeviceIDs": ids, "AllocResp": "CgA="
        }], "RegisteredDevices": {"nvidia.com/gpu": [gpu.uuid, other.uuid]}}, "Checksum": 1});
        let _ = fs::remove_file(&checkpoint);
        fs::write(&checkpoint, doc.to_string()).unwrap();
        fs::set_permissions(&checkpoint, fs::Permissions::from_mode(mode)).unwrap();
    };
    w.configure(&format!(
        "accept-envvar-unprivileged = \"allocation-backed\"\nkubelet-device-checkpoint = \"{}\"\n",
        checkpoint.display()
    ));
    let pod = |name: &str, env: &str| {
        let b = w.probe_bundle(name, &[("NVIDIA_VISIBLE_DEVICES", env)]);
        b.edit(|c| {
            c["annotations"] = json!({
                "io.kubernetes.cri.sandbox-uid": "0d6f1c2e-uid",
                "io.kubernetes.cri.container-name": "cuda",
            });
            Ok(())
        })
        .unwrap();
        b
    };
    for (form, ids) in [
        ("per-NUMA", json!({"0": [format!("{}::1", gpu.uuid)]})),
        ("pre-1.20 list", json!([gpu.uuid])),
    ] {
        write_checkpoint("0d6f1c2e-uid", ids, 0o600);
        let r = w.run(&pod(&format!("ckpt-{}", form.len()), &gpu.uuid));
        assert_no_problems(
            &format!("envvar at defaults, checkpoint {form}"),
            &gpu_container_problems(&r, &w.host, &[gpu]),
            &r,
        );
        let b = pod(&format!("ckpt-all-{}", form.len()), "all");
        assert_rejected(&w, &rt, &b, &["more than its allocation", &gpu.uuid]);
        let b = pod(&format!("ckpt-other-{}", form.len()), &other.uuid);
        assert_rejected(&w, &rt, &b, &["does not name", &other.uuid]);
    }
    // Another pod's entry, or a checkpoint others can write, backs nothing.
    write_checkpoint("another-pod", json!({"0": [gpu.uuid]}), 0o600);
    assert_rejected(&w, &rt, &pod("ckpt-foreign", &gpu.uuid), &["is refused"]);
    write_checkpoint("0d6f1c2e-uid", json!({"0": [gpu.uuid]}), 0o666);
    assert_rejected(&w, &rt, &pod("ckpt-writable", &gpu.uuid), &["is refused"]);
}

/// A `/dev/null` mount as the kubelet writes the device plugin's `Mount` into the OCI spec.
fn device_mount(id: &str) -> Value {
    json!({
        "destination": format!("{DEVICE_MOUNT_ROOT}/{id}"),
        "type": "bind",
        "source": "/dev/null",
        "options": ["rbind", "rprivate", "rw"]
    })
}

fn volume_mount_bundle(w: &World, name: &str, ids: &[&str]) -> Bundle {
    // The plugin's env value for this strategy (it replaces a CUDA image's `all`).
    let b = w.probe_bundle(name, &[("NVIDIA_VISIBLE_DEVICES", DEVICE_MOUNT_ROOT)]);
    let mounts: Vec<Value> = ids.iter().map(|id| device_mount(id)).collect();
    b.edit(move |c| {
        c["mounts"].as_array_mut().unwrap().extend(mounts);
        Ok(())
    })
    .unwrap();
    b
}

#[test]
fn device_plugin_volume_mount_strategy() {
    let w = world();
    // The hardened node setup NVIDIA documents for this strategy.
    w.configure("accept-volume-mounts = true\naccept-envvar-unprivileged = false\n");
    let gpu = w.gpu(0);
    let b = volume_mount_bundle(&w, "b1", &[&gpu.uuid]);
    let r = w.run(&b);
    let mut p = gpu_container_problems(&r, &w.host, &[gpu]);
    if let Some(m) = r
        .mounts
        .iter()
        .find(|m| m.destination.starts_with(DEVICE_MOUNT_ROOT))
    {
        p.push(format!(
            "the request mount {} reached the container",
            m.destination
        ));
    }
    let left: Vec<Value> = b.config().unwrap()["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| {
            m["destination"]
                .as_str()
                .is_some_and(|d| d.starts_with(DEVICE_MOUNT_ROOT))
        })
        .cloned()
        .collect();
    if !left.is_empty() {
        p.push(format!("config.json still has the request mounts {left:?}"));
    }
    assert_no_problems("volume-mounts strategy", &p, &r);

    // Off (the default): the plugin's env value is not a GPU id, and the error says what to set.
    w.configure("");
    let b = volume_mount_bundle(&w, "b2", &[&gpu.uuid]);
    assert_rejected(
        &w,
        &w.shim(),
        &b,
        &[DEVICE_MOUNT_ROOT, "accept-volume-mounts = true"],
    );
}

#[test]
fn device_plugin_cdi_annotation_strategy() {
    let w = world();
    // The plugin's own spec: kind k8s.device-plugin.nvidia.com/gpu, devices named by UUID.
    let out = w.nvshim(&[
        "cdi",
        "generate",
        "--vendor",
        "k8s.device-plugin.nvidia.com",
        "--class",
        "gpu",
        "--device-name-strategy",
        "uuid",
        "--output",
        w.run_cdi
            .join("k8s.device-plugin.nvidia.com-gpu.yaml")
            .to_str()
            .unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Annotations come from the kubelet: they need no privilege, and win over the image's
    // `NVIDIA_VISIBLE_DEVICES=all`.
    w.configure("accept-envvar-unprivileged = false\n");
    let gpu = w.gpu(1);
    let b = annotated_bundle(
        &w,
        "b1",
        json!({
            // cdi.AnnotationKey("nvidia-device-plugin", <response UUID>)
            "cdi.k8s.io/nvidia-device-plugin_4d7e9b0a-39c1-4bd0-9f3e-0c2b8f1e6a55":
                format!("k8s.device-plugin.nvidia.com/gpu={}", gpu.uuid)
        }),
    );
    b.set_env("NVIDIA_VISIBLE_DEVICES", "all").unwrap();
    let r = w.run(&b);
    let mut p = gpu_container_problems(&r, &w.host, &[gpu]);
    p.extend(env_problems(&r, "NVIDIA_VISIBLE_DEVICES", Some("void")));
    assert_no_problems("CDI annotation strategy", &p, &r);
}

// ---- specs shaped like NVIDIA's producers -----------------------------------------------------

/// A device node edit for `/dev/<name>` on the fake host.
fn node(host: &FakeHost, name: &str) -> Value {
    json!({
        "path": format!("/dev/{name}"),
        "hostPath": host.dev_root().join("dev").join(name).to_string_lossy(),
    })
}

fn hook(path: &Path, args: &[&str]) -> Value {
    let mut argv = vec!["nvidia-cdi-hook".to_string()];
    argv.extend(args.iter().map(|a| a.to_string()));
    json!({
        "hookName": "createContainer",
        "path": path.to_string_lossy(),
        "args": argv,
        "env": ["NVIDIA_CTK_DEBUG=false"],
    })
}

/// The global edits NVIDIA's generator (`nvcdi`, NVML mode) writes, as the DRA driver's base
/// spec and `nvidia-ctk cdi generate` carry them: `NVIDIA_VISIBLE_DEVICES=void`, the control
/// nodes, the driver's libraries and binaries read-only, and the `nvidia-cdi-hook` hooks in
/// their generated order (create-symlinks, enable-cuda-compat, update-ldcache,
/// disable-device-node-modification; docs/nvidia-behaviour.md §3.1).
fn nvidia_common_edits(host: &FakeHost, hook_path: &Path) -> Value {
    let v = host.driver_version();
    let mut mounts = Vec::new();
    let mut links = Vec::new();
    for lib in host.libraries() {
        let path = lib.container_path(v);
        mounts.push(json!({
            "hostPath": host.host_path(&path).to_string_lossy(),
            "containerPath": path,
            "options": DRIVER_MOUNT_OPTIONS,
        }));
        let soname = lib.soname(v);
        if soname != lib.file_name(v) {
            links.push(format!("{}::/{}/{soname}", lib.file_name(v), lib.dir()));
        }
    }
    links.push(format!("libcuda.so.1::{LIB_DIR}/libcuda.so"));
    for bin in [
        "nvidia-smi",
        "nvidia-cuda-mps-control",
        "nvidia-cuda-mps-server",
    ] {
        let path = format!("/usr/bin/{bin}");
        mounts.push(json!({
            "hostPath": host.host_path(&path).to_string_lossy(),
            "containerPath": path,
            "options": DRIVER_MOUNT_OPTIONS,
        }));
    }
    let mut symlink_args = vec!["create-symlinks"];
    for l in &links {
        symlink_args.extend(["--link", l.as_str()]);
    }
    let compat = format!("--host-driver-version={v}");
    json!({
        "env": [format!("NVIDIA_CTK_LIBCUDA_DIR={LIB_DIR}"), "NVIDIA_VISIBLE_DEVICES=void"],
        "deviceNodes": [
            node(host, "nvidia-modeset"),
            node(host, "nvidia-uvm-tools"),
            node(host, "nvidia-uvm"),
            node(host, "nvidiactl"),
        ],
        "hooks": [
            hook(hook_path, &symlink_args),
            hook(hook_path, &["enable-cuda-compat", &compat]),
            hook(hook_path, &["update-ldcache", "--folder", LIB_DIR, "--folder", &format!("{LIB_DIR}/vdpau")]),
            hook(hook_path, &["disable-device-node-modification"]),
        ],
        "mounts": mounts,
    })
}

/// The host-side directories of one MPS control daemon (the DRA driver's
/// `/var/lib/kubelet/plugins/gpu.nvidia.com/mps/<claim>-<hash>/{pipe,shm}`).
struct MpsDirs {
    pipe: PathBuf,
    shm: PathBuf,
}

impl MpsDirs {
    fn new(w: &World, claim_uid: &str) -> MpsDirs {
        let root = w
            .tmp
            .path()
            .join("kubelet/plugins/gpu.nvidia.com/mps")
            .join(format!("{claim_uid}-3f2a1"));
        let dirs = MpsDirs {
            pipe: root.join("pipe"),
            shm: root.join("shm"),
        };
        fs::create_dir_all(&dirs.pipe).unwrap();
        fs::create_dir_all(&dirs.shm).unwrap();
        dirs
    }
}

/// One device per GPU, in bus order, named by `name(index)`, with the GPU's node.
fn gpu_devices(w: &World, name: impl Fn(usize) -> String) -> Vec<Value> {
    w.host
        .gpus_by_bus()
        .iter()
        .enumerate()
        .map(|(i, g)| {
            json!({
                "name": name(i),
                "containerEdits": {"deviceNodes": [node(&w.host, &format!("nvidia{}", g.minor))]}
            })
        })
        .collect()
}

/// The DRA driver's two transient specs for a claim on the GPU at bus index 1 with MPS
/// sharing: file name and YAML text of the base spec (kind `k8s.gpu.nvidia.com/device`, one
/// device per GPU, `gpu-<index>`) and of the claim spec (kind `k8s.gpu.nvidia.com/claim`,
/// device `<claimUID>-gpu-1` carrying `MpsControlDaemon.GetCDIContainerEdits`).
fn dra_specs(w: &World, claim_uid: &str, mps: &MpsDirs) -> [(String, String); 2] {
    let devices = gpu_devices(w, |i| format!("gpu-{i}"));
    let base = json!({
        "cdiVersion": "0.5.0",
        "kind": "k8s.gpu.nvidia.com/device",
        "devices": devices,
        "containerEdits": nvidia_common_edits(&w.host, &w.hook_link("nvidia-cdi-hook")),
    });
    let claim = json!({
        "cdiVersion": "0.5.0",
        "kind": "k8s.gpu.nvidia.com/claim",
        "devices": [{
            "name": format!("{claim_uid}-gpu-1"),
            "containerEdits": {
                "env": ["CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"],
                "mounts": [
                    {"containerPath": "/dev/shm", "hostPath": mps.shm.to_string_lossy(),
                     "options": ["rw", "nosuid", "nodev", "bind"]},
                    {"containerPath": "/tmp/nvidia-mps", "hostPath": mps.pipe.to_string_lossy(),
                     "options": ["rw", "nosuid", "nodev", "bind"]},
                ],
            },
        }],
    });
    // cdiapi.GenerateTransientSpecName(vendor, class, id) + ".yaml", as the driver's
    // `cache.WriteSpec` names them.
    [
        (
            "k8s.gpu.nvidia.com-device_base.yaml".to_string(),
            serde_yaml::to_string(&base).unwrap(),
        ),
        (
            format!("k8s.gpu.nvidia.com-claim_{claim_uid}.yaml"),
            serde_yaml::to_string(&claim).unwrap(),
        ),
    ]
}

fn write_specs(dir: &Path, specs: &[(String, String)]) {
    for (name, text) in specs {
        let path = dir.join(name);
        fs::write(&path, text).unwrap();
        // What `nvshim cdi validate` says is what a consumer will say.
        spec::read_file(&path).unwrap_or_else(|e| panic!("{e}\n{text}"));
    }
}

/// The claim's devices as the kubelet annotates a container with them
/// (`cdi.k8s.io/<driver>_<claimUID>`).
fn claim_annotations(claim_uid: &str, devices: &[String]) -> Value {
    json!({ format!("cdi.k8s.io/gpu.nvidia.com_{claim_uid}"): devices.join(",") })
}

fn mps_problems(r: &ProbeReport, pipe: &str) -> Vec<String> {
    let mut p = env_problems(r, "CUDA_MPS_PIPE_DIRECTORY", Some(pipe));
    match r.mount(pipe) {
        None => p.push(format!("the MPS pipe directory {pipe} is not mounted")),
        Some(m) if m.is_readonly() => p.push(format!("{pipe} is mounted read-only")),
        Some(_) => {}
    }
    p
}

#[test]
fn dra_base_and_claim_specs_through_runc() {
    let w = world();
    let claim_uid = "b0d6a7a2-6f0e-4a43-9c52-2f1d0e6f3c11";
    let mps = MpsDirs::new(&w, claim_uid);
    write_specs(&w.run_cdi, &dra_specs(&w, claim_uid, &mps));
    let gpu = w.gpu(1);
    let devices = vec![
        "k8s.gpu.nvidia.com/device=gpu-1".to_string(),
        format!("k8s.gpu.nvidia.com/claim={claim_uid}-gpu-1"),
    ];

    // The MPS-shared claim: the union of the base device and the claim device.
    let b = annotated_bundle(&w, "mps", claim_annotations(claim_uid, &devices));
    b.set_env("NVIDIA_VISIBLE_DEVICES", "all").unwrap();
    let r = w.run(&b);
    let mut p = gpu_container_problems(&r, &w.host, &[gpu]);
    p.extend(mps_problems(&r, "/tmp/nvidia-mps"));
    p.extend(env_problems(&r, "NVIDIA_VISIBLE_DEVICES", Some("void")));
    if r.mount("/dev/shm").is_none() {
        p.push("the MPS daemon's shm directory is not mounted at /dev/shm".into());
    }
    if r.links
        .get(&format!("{LIB_DIR}/libcuda.so"))
        .map(String::as_str)
        != Some("libcuda.so.1")
    {
        p.push("nvidia-cdi-hook create-symlinks made no libcuda.so -> libcuda.so.1".into());
    }
    assert_no_problems("DRA base + MPS claim", &p, &r);

    // The engine has applied the specs itself (containerd 2.x, CRI-O) and kept the annotations:
    // a second create sees `NVIDIA_VISIBLE_DEVICES=void` and leaves config.json as it is.
    let applied = b.config_bytes().unwrap();
    let rt = w.shim();
    let id = unique_id("k8s-e2e-applied");
    let out = rt.create(&b, &id).unwrap();
    assert!(out.success(), "{out}\n--- nvshim.log ---\n{}", w.shim_log());
    assert_eq!(
        String::from_utf8_lossy(&b.config_bytes().unwrap()),
        String::from_utf8_lossy(&applied),
        "create changed a bundle whose CDI devices were already applied"
    );
    rt.force_delete(&id);

    // A time-sliced claim on the same GPU: the driver writes no claim device for it, so the
    // container gets the base device alone, and no MPS.
    let b = annotated_bundle(&w, "ts", claim_annotations(claim_uid, &devices[..1]));
    let r = w.run(&b);
    let mut p = gpu_container_problems(&r, &w.host, &[gpu]);
    if r.mount("/tmp/nvidia-mps").is_some() {
        p.push("a time-sliced claim got the MPS pipe directory".into());
    }
    assert_no_problems("DRA base device, time-sliced", &p, &r);
}

#[test]
fn dra_specs_through_podman_match_nvshim() {
    let w = world();
    let podman = Podman::new(&w.tmp.path().join("podman")).unwrap();
    // Unique per run, so a claim spec left by a killed run cannot collide.
    let claim_uid = format!("6c1f2b4e-0d3a-4e5f-8a9b-{:012x}", std::process::id());
    let mps = MpsDirs::new(&w, &claim_uid);
    let specs = dra_specs(&w, &claim_uid, &mps);
    write_specs(&w.run_cdi, &specs);
    // podman 4.3 reads /etc/cdi and /var/run/cdi only; the files go where the driver puts them.
    let _system: Vec<SystemSpec> = specs
        .iter()
        .map(|(name, text)| SystemSpec::write(Path::new("/var/run/cdi"), name, text).unwrap())
        .collect();
    let image = format!("localhost/nvshim-e2e-k8s:{}", std::process::id());
    podman.import_busybox(&image).unwrap();
    let devices = vec![
        "k8s.gpu.nvidia.com/device=gpu-1".to_string(),
        format!("k8s.gpu.nvidia.com/claim={claim_uid}-gpu-1"),
    ];
    let script = ProbeSpec::for_host(&w.host).script();
    let device_refs: Vec<&str> = devices.iter().map(String::as_str).collect();
    let out = podman
        .run(&image, &device_refs, &["sh", "-c", &script])
        .unwrap();
    let podman_report = ProbeReport::parse(&String::from_utf8_lossy(&out.stdout));
    assert!(
        out.status.success() && podman_report.complete,
        "podman run {devices:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    let mut p = gpu_container_problems(&podman_report, &w.host, &[w.gpu(1)]);
    p.extend(mps_problems(&podman_report, "/tmp/nvidia-mps"));
    assert_no_problems("podman --device (DRA specs)", &p, &podman_report);

    let b = annotated_bundle(&w, "b1", claim_annotations(&claim_uid, &devices));
    let shim_report = w.run(&b);
    let (podman_view, shim_view) = (
        podman_report.nvidia_view(&w.host),
        shim_report.nvidia_view(&w.host),
    );
    assert_eq!(
        podman_view,
        shim_view,
        "podman and nvshim-runtime disagree on the DRA devices\npodman: {}\nnvshim: {}",
        serde_json::to_string_pretty(&podman_view).unwrap(),
        serde_json::to_string_pretty(&shim_view).unwrap()
    );
    assert!(
        podman_view["mounts"].as_array().unwrap().len() > 10,
        "{podman_view}"
    );
}

#[test]
fn spec_naming_nvidia_cdi_hook_runs_with_only_nvshim() {
    let w = world();
    // What the packages install: /usr/bin/nvidia-cdi-hook -> nvshim-hook. No NVIDIA binary is
    // involved: the spec's hooks name this link and nothing else.
    let hook = w.hook_link("nvidia-cdi-hook");
    assert_eq!(fs::read_link(&hook).unwrap(), hook_path());
    // `nvidia-ctk cdi generate`'s shape: kind nvidia.com/gpu, devices by index.
    let devices = gpu_devices(&w, |i| i.to_string());
    let spec = json!({
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": devices,
        "containerEdits": nvidia_common_edits(&w.host, &hook),
    });
    write_specs(
        &w.run_cdi,
        &[("nvidia.yaml".into(), serde_yaml::to_string(&spec).unwrap())],
    );
    for h in spec["containerEdits"]["hooks"].as_array().unwrap() {
        assert_eq!(h["path"], json!(hook.to_string_lossy()), "{h}");
    }
    let b = annotated_bundle(
        &w,
        "b1",
        json!({"cdi.k8s.io/nvshim-e2e": "nvidia.com/gpu=0"}),
    );
    let r = w.run(&b);
    let mut p = gpu_container_problems(&r, &w.host, &[w.gpu(0)]);
    // update-ldcache --folder, create-symlinks --link, with NVIDIA's meaning.
    p.extend(r.ldcache_problems("libnvidia-ml.so.1"));
    p.extend(r.ldcache_problems("libvdpau_nvidia.so.1"));
    if r.links
        .get(&format!("{LIB_DIR}/libcuda.so"))
        .map(String::as_str)
        != Some("libcuda.so.1")
    {
        p.push("create-symlinks made no libcuda.so -> libcuda.so.1".into());
    }
    p.extend(r.smi_problems(&[w.gpu(0)]));
    assert_no_problems("spec naming nvidia-cdi-hook", &sorted(p), &r);
}

// ---- MIG ---------------------------------------------------------------------------------------

/// The fake host's GPUs as NVML reports them (NVML index = bus order), MIG enabled on index 0
/// with two devices: `0:0` = GPU instance 1 / compute instance 0, `0:1` = GI 2 / CI 0.
fn mig_topology(host: &FakeHost) -> Topology {
    let gpus = host
        .gpus_by_bus()
        .into_iter()
        .enumerate()
        .map(|(i, g)| NvmlGpu {
            name: g.model.clone(),
            uuid: g.uuid.clone(),
            minor: g.minor,
            bus_id: g.bus_id.clone(),
            memory_total: 80 << 30,
            mig_enabled: Some(i == 0),
            mig_devices: if i == 0 {
                (0..2u32)
                    .map(|m| MigDevice {
                        uuid: format!("MIG-{:08x}-5a5a-4000-8000-{:012x}", g.minor, m),
                        gpu_instance_id: m + 1,
                        compute_instance_id: 0,
                        profile: "3g.40gb".into(),
                        slice_count: 3,
                        memory_total: 40 << 30,
                    })
                    .collect()
            } else {
                Vec::new()
            },
            ..Default::default()
        })
        .collect();
    Topology {
        driver_version: host.driver_version().to_string(),
        cuda_driver_version: 13000,
        gpus,
        ..Default::default()
    }
}

/// A host with the MIG topology: the fake NVML in place of libnvidia-ml, its topology file,
/// and the capabilities of both MIG devices. Returns the topology file.
pub(super) fn mig_world() -> (World, Topology, PathBuf) {
    let w = world();
    let topology = mig_topology(&w.host);
    let file = w.install_fake_nvml(&topology);
    let parent = &topology.gpus[0];
    let instances: Vec<(u32, u32, u32)> = parent
        .mig_devices
        .iter()
        .map(|m| (parent.minor, m.gpu_instance_id, m.compute_instance_id))
        .collect();
    w.host.add_mig_caps(&instances).unwrap();
    (w, topology, file)
}

/// The `/dev/nvidia-caps/*` nodes seen, as (minor, major).
pub(super) fn caps_nodes(r: &ProbeReport) -> Vec<(u32, u32)> {
    let mut v: Vec<(u32, u32)> = r
        .devices
        .values()
        .filter(|d| d.path.starts_with("/dev/nvidia-caps/") && d.kind == "c")
        .map(|d| (d.minor, d.major))
        .collect();
    v.sort_unstable();
    v
}

/// Exactly the capability nodes `want` (minors), allowed in the cgroup; every other capability
/// in `denied` refused when mknod'ed.
fn caps_problems(r: &ProbeReport, host: &FakeHost, want: &[u32], denied: &[u32]) -> Vec<String> {
    let major = host.spec().caps_major;
    let mut p = Vec::new();
    let mut expected: Vec<(u32, u32)> = want.iter().map(|m| (*m, major)).collect();
    expected.sort_unstable();
    let seen = caps_nodes(r);
    if seen != expected {
        p.push(format!(
            "capability nodes (minor, major): expected {expected:?}, found {seen:?}"
        ));
    }
    for m in want {
        if !r.cgroup_allows('c', major, *m, "r") {
            p.push(format!("devices.list does not allow c {major}:{m}"));
        }
    }
    for m in denied {
        match r.mknod.get(&(major, *m)).map(String::as_str) {
            Some("EPERM") => {}
            other => p.push(format!(
                "a mknod'ed node for capability c {major}:{m} gave {other:?}, expected EPERM"
            )),
        }
    }
    p
}

#[test]
fn mig_devices_by_index_and_uuid() {
    let (w, topology, topo_file) = mig_world();
    let parent_gpu = w.gpu(0);
    let minor = topology.gpus[0].minor;
    assert_eq!(minor, parent_gpu.minor);
    let caps_major = w.host.spec().caps_major;
    let instance = |gi: u32| {
        [
            mig_cap_minor(minor, gi, None),
            mig_cap_minor(minor, gi, Some(0)),
        ]
    };
    let all_caps: Vec<u32> = [
        vec![MIG_CONFIG_MINOR, MIG_MONITOR_MINOR],
        instance(1).to_vec(),
        instance(2).to_vec(),
    ]
    .concat();
    // NVML is loaded for MIG ids only: without its topology the fake NVML cannot initialise,
    // which a MIG id reports and a whole-GPU request never notices. First, before an answer
    // is in cache-dir (`mig_answers_are_cached_until_an_instance_is_recreated`).
    let b = w.probe_bundle("no-nvml-gpu", &[("NVIDIA_VISIBLE_DEVICES", "1")]);
    let r = w.run(&b);
    assert_no_problems(
        "whole GPU on a MIG host, NVML unusable",
        &gpu_container_problems(&r, &w.host, &[w.gpu(1)]),
        &r,
    );
    let b = w.probe_bundle("no-nvml-mig", &[("NVIDIA_VISIBLE_DEVICES", "0:1")]);
    assert_rejected(&w, &w.shim(), &b, &["\"0:1\"", "NVML"]);

    let shim = w.shim().env(TOPOLOGY_ENV, &topo_file);
    for (id, gi) in [
        ("0:1".to_string(), 2),
        (topology.gpus[0].mig_devices[0].uuid.clone(), 1),
    ] {
        let want = instance(gi);
        let denied: Vec<u32> = all_caps
            .iter()
            .copied()
            .filter(|m| !want.contains(m))
            .collect();
        let mknod: Vec<(u32, u32)> = denied.iter().map(|m| (caps_major, *m)).collect();
        let b = mknod_bundle(&w, &format!("b-{gi}"), &mknod);
        b.set_env("NVIDIA_VISIBLE_DEVICES", &id).unwrap();
        let r = w.probe(&shim, &b, false);
        let mut p = gpu_container_problems(&r, &w.host, &[parent_gpu]);
        p.extend(caps_problems(&r, &w.host, &want, &denied));
        assert_no_problems(&format!("MIG device {id}"), &p, &r);
    }

    let b = w.probe_bundle("unknown-mig", &[("NVIDIA_VISIBLE_DEVICES", "0:5")]);
    assert_rejected(&w, &shim, &b, &["\"0:5\"", "0:1 (MIG-"]);
}

/// Twenty creates at once, asking for the two MIG devices by UUID in turn, while NVML's answer
/// goes into cache-dir for the first time (src/host/nvml/cache.rs; the host's files 2 s old, so
/// every create may write it): each gets its own device's two capability nodes and no other,
/// and one answer is kept.
#[test]
fn concurrent_creates_by_mig_uuid_share_the_nvml_answer() {
    let (w, topology, topo_file) = mig_world();
    let minor = topology.gpus[0].minor;
    let devices = &topology.gpus[0].mig_devices;
    std::thread::sleep(std::time::Duration::from_millis(2100));
    let bundles: Vec<(Bundle, u32)> = (0..20)
        .map(|k| {
            let m = &devices[k % devices.len()];
            let b = w.probe_bundle(&format!("c{k:02}"), &[("NVIDIA_VISIBLE_DEVICES", &m.uuid)]);
            (b, m.gpu_instance_id)
        })
        .collect();
    // A runtime per thread, moved into it (a `Runtime` is not shared between threads).
    let runtimes: Vec<Runtime> = (0..bundles.len())
        .map(|_| w.shim().env(TOPOLOGY_ENV, &topo_file))
        .collect();
    let outcomes = create_at_once(bundles.iter().map(|(b, _)| b), runtimes, "mig-uuid", || {});
    let mut problems = Vec::new();
    for ((out, id, rt), (b, gi)) in outcomes.iter().zip(&bundles) {
        if !out.success() {
            problems.push(format!("{id}: create failed: {out}"));
            continue;
        }
        let config: Value = serde_json::from_slice(&b.config_bytes().unwrap()).unwrap();
        let mut caps: Vec<u64> = config["linux"]["devices"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| {
                d["path"]
                    .as_str()
                    .is_some_and(|p| p.starts_with("/dev/nvidia-caps/"))
            })
            .filter_map(|d| d["minor"].as_u64())
            .collect();
        caps.sort_unstable();
        let want = vec![
            u64::from(mig_cap_minor(minor, *gi, None)),
            u64::from(mig_cap_minor(minor, *gi, Some(0))),
        ];
        if caps != want {
            problems.push(format!(
                "{id} (gi{gi}): capability minors {caps:?}, expected {want:?}"
            ));
        }
        rt.force_delete(id);
    }
    assert!(
        problems.is_empty(),
        "{problems:#?}\n--- nvshim.log ---\n{}",
        w.shim_log()
    );
    let (cache, kept) = w.cache_files("nvml-");
    assert_eq!(
        kept.len(),
        1,
        "NVML answers in {}: {kept:?}",
        cache.display()
    );
}

/// `all` on a MIG host: every GPU and every MIG device (the parent's caps of both instances),
/// as NVIDIA's `all`; not the config and monitor caps. The MIG devices come from the driver's
/// /proc, so NVML is not needed: the same container starts without the fake NVML.
#[test]
fn all_on_a_mig_host_includes_every_mig_device() {
    let (w, topology, topo_file) = mig_world();
    let minor = topology.gpus[0].minor;
    let caps_major = w.host.spec().caps_major;
    let want: Vec<u32> = [1, 2]
        .iter()
        .flat_map(|&gi| {
            [
                mig_cap_minor(minor, gi, None),
                mig_cap_minor(minor, gi, Some(0)),
            ]
        })
        .collect();
    let denied = [MIG_CONFIG_MINOR, MIG_MONITOR_MINOR];
    let mknod: Vec<(u32, u32)> = denied.iter().map(|m| (caps_major, *m)).collect();
    let b = mknod_bundle(&w, "all-mig", &mknod);
    b.set_env("NVIDIA_VISIBLE_DEVICES", "all").unwrap();
    let r = w.probe(&w.shim().env(TOPOLOGY_ENV, &topo_file), &b, false);
    let mut p = gpu_container_problems(&r, &w.host, &[w.gpu(0), w.gpu(1)]);
    p.extend(caps_problems(&r, &w.host, &want, &denied));
    assert_no_problems("all on a MIG host", &p, &r);

    let b = mknod_bundle(&w, "all-mig-no-nvml", &mknod);
    b.set_env("NVIDIA_VISIBLE_DEVICES", "all").unwrap();
    let r = w.run(&b);
    let mut p = gpu_container_problems(&r, &w.host, &[w.gpu(0), w.gpu(1)]);
    p.extend(caps_problems(&r, &w.host, &want, &denied));
    assert_no_problems("all on a MIG host, without NVML", &p, &r);
}

/// NVML's answer for a MIG UUID is kept in cache-dir (src/host/nvml/cache.rs) once the files it
/// depends on are 2 s old: the same container then starts without NVML, its capabilities'
/// minors from the driver's `mig-minors` table kept there too. The instance destroyed
/// and created again (same GPU and compute instance ids, so the same minors; a new UUID, as
/// NVIDIA's driver gives it) makes the driver's `/proc` files anew: the old UUID is refused
/// and the new one served, from NVML, although nothing else on the host changed.
#[test]
fn mig_answers_are_cached_until_an_instance_is_recreated() {
    let (w, mut topology, topo_file) = mig_world();
    let minor = topology.gpus[0].minor;
    let want = [
        mig_cap_minor(minor, 1, None),
        mig_cap_minor(minor, 1, Some(0)),
    ];
    // What the cache is keyed by: older than its 2 s rule.
    std::thread::sleep(std::time::Duration::from_millis(2100));
    let with_nvml = w.shim().env(TOPOLOGY_ENV, &topo_file);
    let old_uuid = topology.gpus[0].mig_devices[0].uuid.clone();
    let serves = |shim: &Runtime, name: &str, uuid: &str| {
        let b = w.probe_bundle(name, &[("NVIDIA_VISIBLE_DEVICES", uuid)]);
        let r = w.probe(shim, &b, false);
        let mut p = gpu_container_problems(&r, &w.host, &[w.gpu(0)]);
        p.extend(caps_problems(&r, &w.host, &want, &[]));
        assert_no_problems(&format!("{name}: MIG device {uuid}"), &p, &r);
    };
    serves(&with_nvml, "asked", &old_uuid);
    let (cache, kept) = w.cache_files("nvml-");
    assert_eq!(kept.len(), 1, "no NVML answer in {}", cache.display());
    // The capabilities' minors came from the driver's table, kept as its grid
    // (src/host/mig_table.rs), old enough too.
    let (cache, kept) = w.cache_files("mig-minors-");
    assert_eq!(kept.len(), 1, "no MIG minors table in {}", cache.display());
    // NVML unusable (no topology): the cache answers.
    serves(&w.shim(), "cached", &old_uuid);

    // `nvidia-smi mig -dci -gi 1; -dgi -gi 1; -cgi ... -C`: the same ids, a new UUID.
    w.host.destroy_mig_instance(minor, 1).unwrap();
    w.host.add_mig_caps(&[(minor, 1, 0)]).unwrap();
    let new_uuid = format!("MIG-{minor:08x}-5a5a-4000-8000-00000000beef");
    topology.gpus[0].mig_devices[0].uuid = new_uuid.clone();
    std::fs::write(&topo_file, serde_json::to_string(&topology).unwrap()).unwrap();
    let b = w.probe_bundle("destroyed", &[("NVIDIA_VISIBLE_DEVICES", &old_uuid)]);
    assert_rejected(&w, &with_nvml, &b, &[old_uuid.as_str(), &new_uuid]);
    serves(&with_nvml, "recreated", &new_uuid);
}

/// The DRM card and render nodes of `gpu` on the simulated host, found as udev links them:
/// (container path, major, minor, group).
fn drm_nodes(w: &World, gpu: &FakeGpu) -> Vec<(String, u32, u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    let dri = w.host.dev_root().join("dev/dri");
    ["card", "render"]
        .iter()
        .map(|kind| {
            let link = dri.join(format!("by-path/pci-{}-{kind}", gpu.bus_id));
            let target = fs::read_link(&link).unwrap();
            let name = target.file_name().unwrap().to_string_lossy().into_owned();
            let meta = fs::metadata(dri.join(&name)).unwrap();
            let rdev = meta.rdev();
            (
                format!("/dev/dri/{name}"),
                nix::sys::stat::major(rdev) as u32,
                nix::sys::stat::minor(rdev) as u32,
                meta.gid(),
            )
        })
        .collect()
}

/// Every GPU's DRM nodes, to mknod in the container and open.
fn every_drm_node(w: &World) -> Vec<(u32, u32)> {
    w.host
        .gpus()
        .iter()
        .flat_map(|g| drm_nodes(w, g))
        .map(|(_, major, minor, _)| (major, minor))
        .collect()
}

/// Exactly the DRM nodes of the GPUs in `whole` are in the container, with their `by-path`
/// links and groups, and open (a node mknod'ed with their numbers is not refused); every other
/// GPU's are not there and a node mknod'ed with their numbers is refused (`EPERM`).
fn drm_problems(w: &World, r: &ProbeReport, whole: &[&FakeGpu]) -> Vec<String> {
    let mut p = Vec::new();
    let mut groups_wanted = Vec::new();
    let mut groups_other = Vec::new();
    for g in w.host.gpus() {
        let want = whole.iter().any(|x| x.minor == g.minor);
        for (path, major, minor, gid) in drm_nodes(w, g) {
            let opened = r.mknod.get(&(major, minor)).map(String::as_str);
            let kind = if path.contains("render") {
                "render"
            } else {
                "card"
            };
            let link = format!("/dev/dri/by-path/pci-{}-{kind}", g.bus_id);
            if want {
                groups_wanted.push(gid);
                if !r.dri.contains_key(&path) {
                    p.push(format!("{path} of GPU {} missing", g.bus_id));
                }
                if matches!(opened, None | Some("EPERM")) {
                    p.push(format!("{path} ({major}:{minor}) refused: {opened:?}"));
                }
                if !r.links.contains_key(&link) {
                    p.push(format!("{link} missing"));
                }
            } else {
                groups_other.push(gid);
                if r.dri.contains_key(&path) {
                    p.push(format!("{path} of GPU {} is in the container", g.bus_id));
                }
                if opened != Some("EPERM") {
                    p.push(format!(
                        "{path} ({major}:{minor}) of GPU {} gave {opened:?}, expected EPERM",
                        g.bus_id
                    ));
                }
                if r.links.contains_key(&link) {
                    p.push(format!("{link} is in the container"));
                }
            }
        }
    }
    for gid in &groups_wanted {
        if *gid != 0 && !r.groups.contains(gid) {
            p.push(format!("group {gid} not among {:?}", r.groups));
        }
    }
    for gid in groups_other {
        if gid != 0 && !groups_wanted.contains(&gid) && r.groups.contains(&gid) {
            p.push(format!(
                "group {gid} of a DRM node not given is among {:?}",
                r.groups
            ));
        }
    }
    p
}

/// A MIG device gets no DRM node of its GPU, whatever the capabilities and however it is
/// named (a legacy request for a slice used to get the whole GPU's render node); a whole GPU
/// asked for beside it still gets its own, and `all` serves a MIG-enabled GPU through its MIG
/// devices, as the `all` device of `nvshim cdi generate` does.
#[test]
fn mig_devices_get_no_drm_nodes_of_their_gpu() {
    let (w, topology, topo_file) = mig_world();
    let shim = w.shim().env(TOPOLOGY_ENV, &topo_file);
    let (parent, other) = (w.gpu(0), w.gpu(1));
    let mig_uuid = topology.gpus[0].mig_devices[0].uuid.clone();
    let mig_path = format!("MIG-{}/2/0", parent.uuid);
    let cases: Vec<(&str, &str, Vec<&FakeGpu>, Vec<&FakeGpu>)> = vec![
        ("0:1", "graphics", vec![parent], vec![]),
        (&mig_uuid, "display", vec![parent], vec![]),
        (&mig_path, "all", vec![parent], vec![]),
        ("0:0", "utility,graphics,display", vec![parent], vec![]),
        ("1,0:0", "graphics", vec![parent, other], vec![other]),
        ("0:1,0", "all", vec![parent], vec![parent]),
        ("all", "graphics", vec![parent, other], vec![other]),
    ];
    for (i, (id, caps, gpus, whole)) in cases.into_iter().enumerate() {
        let b = mknod_bundle(&w, &format!("drm-{i}"), &every_drm_node(&w));
        b.set_env("NVIDIA_VISIBLE_DEVICES", id).unwrap();
        b.set_env("NVIDIA_DRIVER_CAPABILITIES", caps).unwrap();
        let r = w.probe(&shim, &b, false);
        let mut p = r.gpu_problems(&w.host, &gpus);
        p.extend(drm_problems(&w, &r, &whole));
        assert_no_problems(&format!("{id} with {caps}"), &sorted(p), &r);
    }
}

/// The devices a container sees: GPU, MIG capability and DRM nodes with their `by-path`
/// links, what a node mknod'ed with each GPU's and DRM node's numbers gives, and the groups.
fn device_view(r: &ProbeReport) -> Value {
    json!({
        "nodes": r.devices.keys().chain(r.dri.keys()).collect::<Vec<_>>(),
        "by-path": r.links.keys().filter(|l| l.starts_with("/dev/dri/by-path/")).collect::<Vec<_>>(),
        "mknod": r.mknod.iter().map(|((a, b), o)| format!("{a}:{b} {o}")).collect::<Vec<_>>(),
        "groups": r.groups,
    })
}

/// The createContainer hooks in an edited config.json: the processes runc runs there.
fn create_container_hooks(b: &Bundle) -> Vec<Value> {
    let config = b.config().unwrap();
    config
        .pointer("/hooks/createContainer")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

/// One rule for which nodes a device gets (`legacy::device_nodes`): each device asked for
/// through `NVIDIA_VISIBLE_DEVICES` (every capability) and through the spec `nvshim cdi
/// generate` writes gives the container the same nodes, groups (the spec's `additionalGids`)
/// and `by-path` links, seen from inside through runc, and either way the container runs one
/// hook process (the spec's per-device hooks used to run one process each).
#[test]
fn legacy_requests_and_the_generated_spec_give_a_device_the_same_nodes() {
    let (w, topology, topo_file) = mig_world();
    let shim = w.shim().env(TOPOLOGY_ENV, &topo_file);
    let spec_path = w.run_cdi.join("nvidia.yaml");
    let generate = |extra: &[&str]| {
        let mut args = vec!["cdi", "generate", "--output", spec_path.to_str().unwrap()];
        args.extend_from_slice(extra);
        let out = w
            .nvshim_command(&args)
            .env(TOPOLOGY_ENV, &topo_file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        spec::read_file(&spec_path).unwrap()
    };
    // Without the DRM groups the spec stays readable by podman 4 and containerd 1.7.
    let lean = generate(&["--no-additional-gids"]);
    assert_eq!(lean.cdi_version, "0.5.0");
    assert!(lean
        .devices
        .iter()
        .all(|d| d.container_edits.additional_gids.is_empty()));
    let spec = generate(&[]);
    assert_eq!(spec.cdi_version, "0.7.0");
    let whole = w.gpu(1);
    let gids: Vec<u32> = drm_nodes(&w, whole).iter().map(|n| n.3).collect();
    for d in &spec.devices {
        let want: Vec<u32> = if d.name == "1" || d.name == whole.uuid || d.name == "all" {
            gids.clone()
        } else {
            Vec::new()
        };
        assert_eq!(d.container_edits.additional_gids, want, "device {}", d.name);
    }

    let mig = &topology.gpus[0].mig_devices;
    let pairs = [
        ("1".to_string(), "1".to_string()),
        (whole.uuid.clone(), whole.uuid.clone()),
        ("0:0".into(), "0:0".into()),
        (mig[1].uuid.clone(), mig[1].uuid.clone()),
        (format!("MIG-{}/2/0", w.gpu(0).uuid), "0:1".into()),
        ("all".into(), "all".into()),
    ];
    let mut p = Vec::new();
    for (i, (legacy_id, cdi_name)) in pairs.iter().enumerate() {
        let b = mknod_bundle(&w, &format!("legacy-{i}"), &every_drm_node(&w));
        b.set_env("NVIDIA_VISIBLE_DEVICES", legacy_id).unwrap();
        b.set_env("NVIDIA_DRIVER_CAPABILITIES", "all").unwrap();
        let legacy = w.probe(&shim, &b, false);
        let legacy_hooks = create_container_hooks(&b).len();

        let b = mknod_bundle(&w, &format!("cdi-{i}"), &every_drm_node(&w));
        let device = format!("nvidia.com/gpu={cdi_name}");
        b.edit(move |c| {
            c["annotations"] = json!({"cdi.k8s.io/nvshim-e2e": device});
            Ok(())
        })
        .unwrap();
        let cdi = w.probe(&shim, &b, false);
        let cdi_hooks = create_container_hooks(&b);

        let (lv, cv) = (device_view(&legacy), device_view(&cdi));
        if lv != cv {
            p.push(format!(
                "{legacy_id} / {cdi_name}: legacy {lv:#}\nCDI {cv:#}"
            ));
        }
        if (legacy_hooks, cdi_hooks.len()) != (1, 1) {
            p.push(format!(
                "{legacy_id} / {cdi_name}: {legacy_hooks} legacy and {} CDI createContainer hooks, expected one each: {cdi_hooks:#?}",
                cdi_hooks.len()
            ));
        }
    }
    assert!(
        p.is_empty(),
        "{}\n--- nvshim.log ---\n{}",
        p.join("\n"),
        w.shim_log()
    );
}

#[test]
fn mig_config_and_monitor_are_for_privileged_containers() {
    let (w, _topology, _file) = mig_world();
    let caps_major = w.host.spec().caps_major;
    // No MIG id: NVML is not needed (the shim runs without the topology).
    let b = w.probe_bundle("priv", &[]);
    for (k, v) in [
        ("NVIDIA_VISIBLE_DEVICES", "1"),
        ("NVIDIA_MIG_CONFIG_DEVICES", "all"),
        ("NVIDIA_MIG_MONITOR_DEVICES", "all"),
    ] {
        b.set_env(k, v).unwrap();
    }
    privileged(&b);
    let r = w.run(&b);
    let mut p = gpu_container_problems(&r, &w.host, &[w.gpu(1)]);
    p.extend(caps_problems(
        &r,
        &w.host,
        &[MIG_CONFIG_MINOR, MIG_MONITOR_MINOR],
        &[],
    ));
    assert_no_problems("MIG config and monitor, privileged", &p, &r);

    let b = mknod_bundle(&w, "unpriv", &[(caps_major, MIG_MONITOR_MINOR)]);
    b.set_env("NVIDIA_VISIBLE_DEVICES", "1").unwrap();
    b.set_env("NVIDIA_MIG_MONITOR_DEVICES", "all").unwrap();
    assert_rejected(
        &w,
        &w.shim(),
        &b,
        &["NVIDIA_MIG_MONITOR_DEVICES", "privileged"],
    );
}

// ---- IMEX --------------------------------------------------------------------------------------

pub(super) fn imex_nodes(r: &ProbeReport) -> Vec<(String, u32, u32)> {
    r.devices
        .values()
        .filter(|d| d.path.starts_with("/dev/nvidia-caps-imex-channels/") && d.kind == "c")
        .map(|d| (d.path.clone(), d.major, d.minor))
        .collect()
}

#[test]
fn imex_channels_by_env_and_by_cdi() {
    let w = world();
    w.host.add_imex_channels(&[0, 3, 5]).unwrap();
    let major = w.host.spec().caps_imex_major;
    let channel = |n: u32| {
        (
            format!("/dev/nvidia-caps-imex-channels/channel{n}"),
            major,
            n,
        )
    };

    // Unprivileged: refused under every accept-envvar-unprivileged value (IMEX channels come
    // from the orchestrator), also when the GPU itself is allocation-backed.
    for (i, config) in [
        "",
        "accept-envvar-unprivileged = false\n",
        "accept-envvar-unprivileged = \"allocation-backed\"\n",
    ]
    .into_iter()
    .enumerate()
    {
        w.configure(config);
        for value in ["7", "0,3", "all,5"] {
            let b = mknod_bundle(&w, &format!("unpriv{i}-{value}"), &[(major, 5)]);
            b.set_env("NVIDIA_VISIBLE_DEVICES", "0").unwrap();
            b.set_env("NVIDIA_IMEX_CHANNELS", value).unwrap();
            if i == 2 {
                let m = device_mount("0");
                b.edit(move |c| {
                    c["mounts"].as_array_mut().unwrap().push(m);
                    Ok(())
                })
                .unwrap();
            }
            let needle = if i == 1 {
                "NVIDIA_VISIBLE_DEVICES"
            } else {
                "NVIDIA_IMEX_CHANNELS"
            };
            assert_rejected(&w, &w.shim(), &b, &[needle, "is refused"]);
        }
    }
    w.configure("");
    // Beside a CDI annotation (the orchestrator's channel) the variable is not served.
    let mixed = annotated_bundle(
        &w,
        "mixed",
        json!({"cdi.k8s.io/compute-domain": "nvidia.com/imex-channel=3"}),
    );
    mixed.set_env("NVIDIA_VISIBLE_DEVICES", "all").unwrap();
    mixed.set_env("NVIDIA_IMEX_CHANNELS", "5").unwrap();
    let mixed_spec = w.run_cdi.join("nvidia-imex.yaml");
    // The operator's opt-in (cdi-env-kinds), then privileged containers.
    w.configure("cdi-env-kinds = [\"nvidia.com/gpu\", \"nvidia.com/imex-channel\"]\n");
    let b2 = w.probe_bundle(
        "optin",
        &[
            ("NVIDIA_VISIBLE_DEVICES", "0"),
            ("NVIDIA_IMEX_CHANNELS", "5"),
        ],
    );
    let r = w.run(&b2);
    assert_eq!(imex_nodes(&r), vec![channel(5)], "{}", r.raw);
    w.configure("");

    let b = mknod_bundle(&w, "env", &[(major, 5)]);
    b.set_env("NVIDIA_VISIBLE_DEVICES", "0").unwrap();
    b.set_env("NVIDIA_IMEX_CHANNELS", "0,3").unwrap();
    privileged(&b);
    let r = w.run(&b);
    let mut p = gpu_container_problems(&r, &w.host, &[w.gpu(0)]);
    let seen = imex_nodes(&r);
    if seen != vec![channel(0), channel(3)] {
        p.push(format!(
            "IMEX channel nodes: expected channel0 and channel3, found {seen:?}"
        ));
    }
    for n in [0, 3] {
        if !r.cgroup_allows('c', major, n, "rw") {
            p.push(format!("devices.list does not allow channel {n}"));
        }
    }
    if r.mknod.get(&(major, 5)).map(String::as_str) != Some("EPERM") {
        p.push(format!(
            "channel 5 was not denied: {:?}",
            r.mknod.get(&(major, 5))
        ));
    }
    assert_no_problems("NVIDIA_IMEX_CHANNELS=0,3", &p, &r);

    let b = w.probe_bundle(
        "missing",
        &[
            ("NVIDIA_VISIBLE_DEVICES", "0"),
            ("NVIDIA_IMEX_CHANNELS", "7"),
        ],
    );
    privileged(&b);
    assert_rejected(&w, &w.shim(), &b, &["IMEX channel 7", "channel7"]);

    // `nvshim cdi generate --mode imex`: kind nvidia.com/imex-channel, a device per channel.
    let path = w.run_cdi.join("nvidia-imex.yaml");
    let out = w.nvshim(&[
        "cdi",
        "generate",
        "--mode",
        "imex",
        "--output",
        path.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let spec = spec::read_file(&path).unwrap();
    assert_eq!(spec.kind, "nvidia.com/imex-channel");
    let names: Vec<&str> = spec.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["0", "3", "5", "all"]);
    let b = annotated_bundle(
        &w,
        "cdi",
        json!({"cdi.k8s.io/compute-domain": "nvidia.com/imex-channel=3"}),
    );
    let r = w.run(&b);
    let seen = imex_nodes(&r);
    assert_eq!(seen, vec![channel(3)], "{}", r.raw);
    // The annotation's channel only, whatever the unprivileged image's variable says.
    assert_eq!(path, mixed_spec);
    let r = w.run(&mixed);
    assert_eq!(imex_nodes(&r), vec![channel(3)], "{}", r.raw);
}

// ---- GPU Operator layout and MPS ----------------------------------------------------------------

#[test]
fn split_driver_root_and_dev_root() {
    let w = World::builder().split().spec_dirs(SpecDirs::Run).build();
    let (driver, dev) = (w.host.root(), w.host.dev_root());
    assert_ne!(driver, dev);
    assert!(!driver.join("dev").exists() && !dev.join("usr").exists());
    let gpu = w.gpu(1);
    let b = w.probe_bundle("b1", &[("NVIDIA_VISIBLE_DEVICES", "1")]);
    let r = w.run(&b);
    let mut p = gpu_container_problems(&r, &w.host, &[gpu]);
    p.extend(r.library_mounted_problems(&w.host, "libnvidia-ml"));
    p.extend(r.smi_problems(&[gpu]));
    // The driver's files are mounted from the driver root, at their paths relative to it.
    let config = b.config().unwrap();
    let libcuda = w.host.container_lib_path("libcuda");
    let source = config["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["destination"] == json!(libcuda))
        .and_then(|m| m["source"].as_str())
        .map(PathBuf::from);
    if source.as_deref() != Some(w.host.host_path(&libcuda).as_path()) {
        p.push(format!(
            "{libcuda} is mounted from {source:?}, expected {}",
            w.host.host_path(&libcuda).display()
        ));
    }
    assert_no_problems("driver root apart from dev root", &p, &r);
}

#[test]
fn mps_pipe_directory_reaches_compute_containers() {
    let w = world();
    let pipe = w.tmp.path().join("mps/pipe");
    w.configure(&format!(
        "mps-pipe-directory = {:?}\n",
        pipe.display().to_string()
    ));
    let pipe_str = pipe.to_string_lossy().into_owned();

    // No daemon (no directory): nothing.
    let b = w.probe_bundle("none", &[("NVIDIA_VISIBLE_DEVICES", "0")]);
    let r = w.run(&b);
    let mut p = env_problems(&r, "CUDA_MPS_PIPE_DIRECTORY", None);
    if r.mount(&pipe_str).is_some() {
        p.push("mounted a pipe directory that does not exist".into());
    }
    assert_no_problems("no MPS daemon", &p, &r);

    fs::create_dir_all(&pipe).unwrap();
    let b = w.probe_bundle("compute", &[("NVIDIA_VISIBLE_DEVICES", "0")]);
    let r = w.run(&b);
    let mut p = gpu_container_problems(&r, &w.host, &[w.gpu(0)]);
    p.extend(mps_problems(&r, &pipe_str));
    if let Some(m) = r.mount(&pipe_str) {
        for o in ["nosuid", "nodev", "noexec"] {
            if !m.options.iter().any(|x| x == o) {
                p.push(format!(
                    "{pipe_str} is mounted without {o}: {:?}",
                    m.options
                ));
            }
        }
    }
    assert_no_problems("MPS daemon, compute container", &p, &r);

    let b = w.probe_bundle(
        "utility",
        &[
            ("NVIDIA_VISIBLE_DEVICES", "0"),
            ("NVIDIA_DRIVER_CAPABILITIES", "utility"),
        ],
    );
    let r = w.run(&b);
    let mut p = env_problems(&r, "CUDA_MPS_PIPE_DIRECTORY", None);
    if r.mount(&pipe_str).is_some() {
        p.push("a utility-only container got the MPS pipe directory".into());
    }
    assert_no_problems("MPS daemon, utility container", &p, &r);
}

// ---- requirements on arch and brand ------------------------------------------------------------

/// `NVIDIA_REQUIRE_*` terms on `arch` and `brand` are the one thing a plain GPU request needs
/// NVML for, and nvshim loads it only when such a term must be decided: here `cuda>=99.0`
/// fails on the host's driver, so the alternative `brand=tesla,arch>=9.0` is checked through
/// (fake) NVML.
#[test]
fn arch_and_brand_requirements_are_checked_through_nvml() {
    let w = world();
    let mut topology = mig_topology(&w.host);
    for g in &mut topology.gpus {
        g.mig_enabled = None;
        g.mig_devices.clear();
        g.compute_capability = Some("9.0".into());
        g.brand = Some("tesla".into());
    }
    let topo_file = w.install_fake_nvml(&topology);

    // NVML that cannot initialise (no topology): the error says so, and how to proceed. First,
    // before an answer is in cache-dir.
    let b = w.probe_bundle(
        "no-nvml",
        &[
            ("NVIDIA_VISIBLE_DEVICES", "1"),
            ("NVIDIA_REQUIRE_ARCH", "arch>=8.0"),
        ],
    );
    assert_rejected(
        &w,
        &w.shim(),
        &b,
        &["arch>=8.0", "NVML", "NVIDIA_DISABLE_REQUIRE"],
    );

    let shim = w.shim().env(TOPOLOGY_ENV, &topo_file);
    let met = "cuda>=99.0 brand=tesla,arch>=9.0";
    let b = w.probe_bundle(
        "met",
        &[
            ("NVIDIA_VISIBLE_DEVICES", "1"),
            ("NVIDIA_REQUIRE_CUDA", met),
        ],
    );
    let r = w.probe(&shim, &b, false);
    assert_no_problems(
        "arch and brand met",
        &gpu_container_problems(&r, &w.host, &[w.gpu(1)]),
        &r,
    );

    let unmet = "cuda>=99.0 brand=geforce,arch>=9.0 brand=tesla,arch>=10.0";
    let b = w.probe_bundle(
        "unmet",
        &[
            ("NVIDIA_VISIBLE_DEVICES", "1"),
            ("NVIDIA_REQUIRE_CUDA", unmet),
        ],
    );
    assert_rejected(
        &w,
        &shim,
        &b,
        &["unsatisfied condition", "NVIDIA_REQUIRE_CUDA"],
    );
}

/// An image's own `NVIDIA_VISIBLE_DEVICES=void` next to CDI
/// annotations, on an engine that did not apply CDI, still gets the annotated devices: whether
/// the engine applied them is read from config.json (their device nodes), not from `void`.
#[test]
fn void_from_the_image_next_to_unapplied_cdi_annotations_still_gets_the_devices() {
    let w = world();
    let claim_uid = "c1d6a7a2-6f0e-4a43-9c52-2f1d0e6f3c12";
    let mps = MpsDirs::new(&w, claim_uid);
    write_specs(&w.run_cdi, &dra_specs(&w, claim_uid, &mps));
    let gpu = w.gpu(1);
    let devices = vec!["k8s.gpu.nvidia.com/device=gpu-1".to_string()];
    for (name, value) in [
        ("void", "void"),
        ("void-list", "0,void"),
        ("void-space", " void "),
    ] {
        let b = annotated_bundle(&w, name, claim_annotations(claim_uid, &devices));
        b.set_env("NVIDIA_VISIBLE_DEVICES", value).unwrap();
        let r = w.run(&b);
        let p = gpu_container_problems(&r, &w.host, &[gpu]);
        assert_no_problems(&format!("image NVIDIA_VISIBLE_DEVICES={value:?}"), &p, &r);
        assert!(
            w.shim_log().contains("engine has not applied"),
            "no warning in the log:\n{}",
            w.shim_log()
        );
    }
}

/// The red team's image: its library directory a symlink to `/tmp/nvidia-mps`, where a DRA
/// claim mounts the MPS pipe directory read-write from the host; annotated for `devices`.
fn red_team_bundle(w: &World, name: &str, claim_uid: &str, devices: &[String]) -> Bundle {
    let b = annotated_bundle(w, name, claim_annotations(claim_uid, devices));
    let lib_dir = b.rootfs().path().join(LIB_DIR.trim_start_matches('/'));
    let _ = fs::remove_dir_all(&lib_dir);
    fs::create_dir_all(lib_dir.parent().unwrap()).unwrap();
    symlink("/tmp/nvidia-mps", &lib_dir).unwrap();
    b
}

#[test]
fn an_image_whose_library_directory_leads_into_the_mps_mount_is_refused() {
    // The red team's image: its library directory is a symlink to where the DRA claim mounts
    // the MPS pipe directory read-write from the host. runc would create a mountpoint file in
    // that host directory for every library; nvshim refuses the container before runc runs.
    let w = world();
    let claim_uid = "0e4f9d2c-7a1b-4c3d-9e8f-5a6b7c8d9e0f";
    let mps = MpsDirs::new(&w, claim_uid);
    write_specs(&w.run_cdi, &dra_specs(&w, claim_uid, &mps));
    let devices = vec![
        "k8s.gpu.nvidia.com/device=gpu-1".to_string(),
        format!("k8s.gpu.nvidia.com/claim={claim_uid}-gpu-1"),
    ];
    let b = red_team_bundle(&w, "symlinked-libdir", claim_uid, &devices);
    let before = b.config_bytes().unwrap();

    let rt = w.shim();
    let id = unique_id("k8s-e2e-symlinked");
    let out = rt.create(&b, &id).unwrap();
    rt.force_delete(&id);
    assert!(!out.success(), "the container was created:\n{out}");
    for want in [
        "resolves, through the image's symlinks, to /tmp/nvidia-mps/",
        "inside the bind mount at /tmp/nvidia-mps",
        "on the host",
    ] {
        assert!(out.stderr.contains(want), "stderr lacks {want:?}:\n{out}");
    }
    assert_eq!(b.config_bytes().unwrap(), before, "the bundle was edited");
    assert_eq!(
        fs::read_dir(&mps.pipe).unwrap().count(),
        0,
        "files were made in the host's MPS pipe directory"
    );
}

/// A pod's volume at the driver's library folder, at a folder above it, or at `/usr/bin` where
/// the driver's binaries go (runc used to make root-owned empty files in the volume's host
/// directory, then the hook failed): refused at create naming the volume's destination and
/// source and what to do, for a legacy request and for nvshim's own spec, with the bundle and
/// the host directory untouched. A volume elsewhere is no business of nvshim's.
#[test]
fn a_volume_over_a_folder_nvshim_mounts_files_into_is_refused() {
    let w = world();
    w.generate();
    let volume = w.tmp.path().join("pod-volume");
    fs::create_dir_all(&volume).unwrap();
    let with_volume = |name: &str, at: &str, env: &[(&str, &str)], cdi: bool| {
        let b = w.probe_bundle(name, env);
        let (at, source) = (at.to_string(), volume.to_string_lossy().into_owned());
        b.edit(move |c| {
            c["mounts"].as_array_mut().unwrap().push(json!({
                "destination": at, "type": "bind", "source": source,
                "options": ["rbind", "rw"],
            }));
            if cdi {
                c["annotations"] = json!({"cdi.k8s.io/nvshim-e2e": "nvidia.com/gpu=0"});
            }
            Ok(())
        })
        .unwrap();
        b
    };
    let source = volume.to_string_lossy().into_owned();
    let gpu = [("NVIDIA_VISIBLE_DEVICES", "0")];
    for (i, (at, cdi)) in [
        (LIB_DIR, false),
        ("/usr/lib", false),
        ("/usr/bin", false),
        (LIB_DIR, true),
        ("/usr", true),
    ]
    .into_iter()
    .enumerate()
    {
        let env: &[(&str, &str)] = if cdi { &[] } else { &gpu };
        let b = with_volume(&format!("volume-{i}"), at, env, cdi);
        assert_rejected(
            &w,
            &w.shim(),
            &b,
            &[
                &format!("lies inside the volume mounted at {at} from {source}"),
                "runc would create that on the host",
                "mount the volume somewhere other than",
            ],
        );
        assert_eq!(
            fs::read_dir(&volume).unwrap().count(),
            0,
            "files were made in the volume's host directory ({at})"
        );
    }
    let b = with_volume("volume-elsewhere", "/data", &gpu, false);
    let r = w.run(&b);
    assert_no_problems(
        "a volume at /data",
        &gpu_container_problems(&r, &w.host, &[w.gpu(0)]),
        &r,
    );
}

/// A mount source that was a file at one create and is then made a directory is seen as one:
/// the red team's image above is refused (a stale answer would let runc create its
/// mountpoints in the host directory).
#[test]
fn a_mount_source_made_a_directory_after_a_create_is_seen() {
    let w = world();
    let claim_uid = "5b7c1e0a-2d4f-4e6a-8b9c-0d1e2f3a4b5c";
    let mps = MpsDirs::new(&w, claim_uid);
    // The pipe a file when the first container is made (the MPS daemon makes the directory).
    fs::remove_dir(&mps.pipe).unwrap();
    fs::write(&mps.pipe, b"").unwrap();
    write_specs(&w.run_cdi, &dra_specs(&w, claim_uid, &mps));
    let devices = vec![
        "k8s.gpu.nvidia.com/device=gpu-1".to_string(),
        format!("k8s.gpu.nvidia.com/claim={claim_uid}-gpu-1"),
    ];
    let rt = w.shim();
    let first = annotated_bundle(&w, "pipe-a-file", claim_annotations(claim_uid, &devices));
    let id = unique_id("k8s-e2e-kept-file");
    let out = rt.create(&first, &id).unwrap();
    rt.force_delete(&id);
    assert!(out.success(), "{out}\n--- nvshim.log ---\n{}", w.shim_log());

    fs::remove_file(&mps.pipe).unwrap();
    fs::create_dir(&mps.pipe).unwrap();
    let b = red_team_bundle(&w, "symlinked-after", claim_uid, &devices);
    let before = b.config_bytes().unwrap();
    let id = unique_id("k8s-e2e-kept-dir");
    let out = rt.create(&b, &id).unwrap();
    rt.force_delete(&id);
    assert!(!out.success(), "the container was created:\n{out}");
    assert!(
        out.stderr
            .contains("inside the bind mount at /tmp/nvidia-mps"),
        "{out}"
    );
    assert_eq!(b.config_bytes().unwrap(), before, "the bundle was edited");
    assert_eq!(fs::read_dir(&mps.pipe).unwrap().count(), 0);
}
