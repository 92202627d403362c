//! End-to-end CDI tests: `nvshim cdi generate` on a simulated host (through a fake NVML and
//! through the /proc fallback), `nvshim-runtime` injecting CDI devices in front of real runc,
//! `nvshim cdi list|validate`, and podman (an independent CDI consumer) given the same spec.
//!
//! The fake host (`FakeHostSpec::with_gpus(n)`) numbers GPUs in bus order against their minors:
//! with two GPUs, index 0 is `/dev/nvidia1` and index 1 is `/dev/nvidia0`. Everything runs as
//! root; each test has its own temp dirs, runc `--root` and container ids.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;

use nix::sys::stat::{makedev, mknod, Mode, SFlag};
use nvshim::cdi::spec::{self, Spec};
use nvshim_fake_nvml::{Gpu as NvmlGpu, MigDevice, Topology, TOPOLOGY_ENV};
use nvshim_testsupport::podman::{Podman, SystemSpec};
use nvshim_testsupport::probe::assert_no_problems;
use nvshim_testsupport::{unique_id, Bundle, FakeGpu, FakeHost, ProbeReport, ProbeSpec};
use serde_json::json;

use super::common::hook_path;
use super::world::{SpecDirs, World};

/// The fake host with `gpus` GPUs and both spec dirs.
fn world(gpus: usize) -> World {
    World::builder()
        .gpus(gpus)
        .spec_dirs(SpecDirs::EtcAndRun)
        .build()
}

/// `nvshim ARGS` with the world's config and extra environment.
fn nvshim(w: &World, args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut cmd = w.nvshim_command(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// Generates `<run-cdi>/nvidia.yaml` and returns it parsed (validated) with stderr.
fn generate(w: &World, extra: &[&str], env: &[(&str, &Path)]) -> (Spec, String) {
    let stderr = cdi_into_run_dir(w, "generate", extra, env);
    let spec = spec::read_file(&w.run_cdi.join("nvidia.yaml")).unwrap_or_else(|e| panic!("{e}"));
    (spec, stderr)
}

/// `nvshim cdi SUBCOMMAND --output <run-cdi>/nvidia.yaml EXTRA`; asserts success, returns
/// stderr.
fn cdi_into_run_dir(w: &World, subcommand: &str, extra: &[&str], env: &[(&str, &Path)]) -> String {
    let out_path = w.run_cdi.join("nvidia.yaml");
    let mut args = vec!["cdi", subcommand, "--output", out_path.to_str().unwrap()];
    args.extend_from_slice(extra);
    let out = nvshim(w, &args, env);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "nvshim cdi {subcommand} failed: {stderr}"
    );
    stderr
}

/// A busybox bundle running the probe, asking for `devices` through a CDI annotation.
fn annotated_bundle(w: &World, name: &str, devices: &str) -> Bundle {
    let b = w.probe_bundle(name, &[]);
    let devices = devices.to_string();
    b.edit(move |c| {
        c["annotations"] = json!({"cdi.k8s.io/nvshim-e2e": devices});
        Ok(())
    })
    .unwrap();
    b
}

/// The GPU problems plus the control nodes, libcuda mounted and in the ld cache, and the
/// spec's `NVIDIA_VISIBLE_DEVICES=void`.
fn cdi_container_problems(r: &ProbeReport, host: &FakeHost, selected: &[&FakeGpu]) -> Vec<String> {
    let mut p = r.gpu_problems(host, selected);
    p.extend(r.control_device_problems(host));
    p.extend(r.library_mounted_problems(host, "libcuda"));
    p.extend(r.ldcache_problems("libcuda.so.1"));
    if r.env.get("NVIDIA_VISIBLE_DEVICES").map(String::as_str) != Some("void") {
        p.push(format!(
            "NVIDIA_VISIBLE_DEVICES is {:?}, expected void (set by the spec)",
            r.env.get("NVIDIA_VISIBLE_DEVICES")
        ));
    }
    p.sort();
    p.dedup();
    p
}

fn device_names(spec: &Spec) -> Vec<String> {
    let mut n: Vec<String> = spec.devices.iter().map(|d| d.name.clone()).collect();
    n.sort();
    n
}

fn node_paths(spec: &Spec, device: &str) -> Vec<String> {
    spec.device(device)
        .unwrap_or_else(|| panic!("no device {device:?} in {:?}", device_names(spec)))
        .container_edits
        .device_nodes
        .iter()
        .map(|d| d.path.clone())
        .collect()
}

// ---- generate ---------------------------------------------------------------------------------

#[test]
fn generate_falls_back_to_proc_without_nvml() {
    let w = world(2);
    // The fake host's stub libnvidia-ml has nvmlInit but no device functions.
    let (spec, stderr) = generate(&w, &[], &[]);
    assert!(stderr.contains("NVML not used"), "{stderr}");
    assert!(stderr.contains("GPUs from /proc"), "{stderr}");
    let mut want = vec![
        "0".to_string(),
        "1".to_string(),
        "all".to_string(),
        w.gpu(0).uuid.clone(),
        w.gpu(1).uuid.clone(),
    ];
    want.sort();
    assert_eq!(device_names(&spec), want);
    assert_eq!(spec.kind, "nvidia.com/gpu");
    // Digit-led names and hostPath need 0.5.0; the DRM nodes' groups in `additionalGids`
    // (the simulated host's are 0660, groups video and render), as NVIDIA writes them, 0.7.0.
    assert_eq!(spec.cdi_version, "0.7.0");
    let mut gids: Vec<u32> = spec
        .device("0")
        .unwrap()
        .container_edits
        .additional_gids
        .clone();
    gids.sort_unstable();
    assert_eq!(gids, [44, 105]);
    // Each full GPU: its node, then its DRM card and render nodes (found through sysfs).
    let with_drm = |g: &FakeGpu| {
        let mut v = vec![format!("/dev/nvidia{}", g.minor)];
        v.extend(drm_paths(&w.host, g));
        v
    };
    assert_eq!(node_paths(&spec, "0"), with_drm(w.gpu(0)));
    assert_eq!(node_paths(&spec, &w.gpu(1).uuid), with_drm(w.gpu(1)));
    assert_eq!(node_paths(&spec, "all").len(), 2 * 3);
    let node = &spec.device("0").unwrap().container_edits.device_nodes[0];
    assert_eq!(
        (node.major, node.minor),
        (Some(195), Some(w.gpu(0).minor.into()))
    );
    assert_eq!(
        node.host_path.as_deref(),
        Some(
            w.host
                .root()
                .join(format!("dev/nvidia{}", w.gpu(0).minor))
                .to_str()
                .unwrap()
        )
    );
    let g = &spec.container_edits;
    assert_eq!(g.env, ["NVIDIA_VISIBLE_DEVICES=void"]);
    let controls: Vec<&str> = g.device_nodes.iter().map(|d| d.path.as_str()).collect();
    assert_eq!(
        controls,
        [
            "/dev/nvidia-modeset",
            "/dev/nvidia-uvm-tools",
            "/dev/nvidia-uvm",
            "/dev/nvidiactl"
        ]
    );
    let mounts: Vec<&str> = g.mounts.iter().map(|m| m.container_path.as_str()).collect();
    for want in [
        w.host.container_lib_path("libcuda"),
        w.host.container_lib_path("libnvidia-ml"),
        w.host.container_lib_path("libvdpau_nvidia"),
        "/usr/bin/nvidia-smi".to_string(),
        format!(
            "/lib/firmware/nvidia/{}/gsp_ga10x.bin",
            w.host.driver_version()
        ),
    ] {
        assert!(
            mounts.contains(&want.as_str()),
            "{want} not mounted: {mounts:?}"
        );
    }
    for m in &g.mounts {
        // The daemons' sockets are writable (clients connect), never executable.
        let want: &[&str] = if m.container_path.ends_with("/socket") {
            &["rw", "nosuid", "nodev", "noexec", "rbind", "rprivate"]
        } else {
            &["ro", "nosuid", "nodev", "rbind", "rprivate"]
        };
        assert_eq!(m.options, want, "{}", m.container_path);
        assert!(m.host_path.starts_with(w.host.root().to_str().unwrap()));
    }
    let hook = hook_path();
    let hooks: Vec<(&str, &str)> = g
        .hooks
        .iter()
        .map(|h| (h.hook_name.as_str(), h.args[1].as_str()))
        .collect();
    // NVIDIA's five container fix-ups as one hook, in NVIDIA's order.
    assert_eq!(hooks, [("createContainer", "fixups")]);
    let args = &g.hooks[0].args;
    let at = |flag: &str| args.iter().position(|a| a == flag);
    let order = [
        "--link",
        "--host-driver-version",
        "--folder",
        "--disable-device-node-modification",
        "--update-application-profile",
    ];
    let positions: Vec<Option<usize>> = order.iter().map(|f| at(f)).collect();
    assert!(positions.iter().all(Option::is_some), "{args:?}");
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{args:?}");
    for h in &g.hooks {
        assert_eq!(Path::new(&h.path), hook);
        assert_eq!(h.args[0], "nvshim-hook");
        assert_eq!(
            h.env.as_deref(),
            Some(
                &["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string()]
                    [..]
            ),
            "hooks never inherit the container's environment"
        );
    }
    assert!(args.contains(&"libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so".to_string()));
    assert!(args.contains(&"/usr/lib/x86_64-linux-gnu".to_string()));
}

/// The GPU's DRM nodes on the simulated host, as sysfs ties them to its PCI device.
fn drm_paths(host: &FakeHost, g: &FakeGpu) -> Vec<String> {
    let dir = host
        .sys_root()
        .join("bus/pci/devices")
        .join(&g.bus_id)
        .join("drm");
    let mut names: Vec<String> = fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names.into_iter().map(|n| format!("/dev/dri/{n}")).collect()
}

/// The fake host's GPUs as NVML reports them, with MIG on bus indices 2 (two devices) and 5
/// (three), and MIG supported but disabled on index 6.
fn mig_topology(host: &FakeHost) -> Topology {
    let mut gpus = Vec::new();
    for (i, g) in host.gpus_by_bus().into_iter().enumerate() {
        let mig = |n: usize| -> Vec<MigDevice> {
            (0..n)
                .map(|m| MigDevice {
                    uuid: format!("MIG-{:08x}-0000-4000-8000-{:012x}", g.minor, m),
                    gpu_instance_id: (m as u32) + 1,
                    compute_instance_id: 0,
                    profile: "1g.10gb".into(),
                    slice_count: 1,
                    memory_total: 10 << 30,
                })
                .collect()
        };
        gpus.push(NvmlGpu {
            name: g.model.clone(),
            uuid: g.uuid.clone(),
            minor: g.minor,
            bus_id: g.bus_id.clone(),
            memory_total: 80 << 30,
            mig_enabled: match i {
                2 | 5 => Some(true),
                6 => Some(false),
                _ => None,
            },
            mig_devices: match i {
                2 => mig(2),
                5 => mig(3),
                _ => Vec::new(),
            },
            ..Default::default()
        });
    }
    Topology {
        driver_version: host.driver_version().to_string(),
        cuda_driver_version: 13000,
        gpus,
        ..Default::default()
    }
}

/// Writes `proc/driver/nvidia-caps/mig-minors` and the `dev/nvidia-caps/nvidia-cap<N>` nodes
/// for the topology's MIG devices; returns (capability path → minor).
fn install_mig_caps(host: &FakeHost, topology: &Topology) -> Vec<(String, u32)> {
    let mut caps = vec![("config".to_string(), 1), ("monitor".to_string(), 2)];
    let mut next = 3;
    for g in &topology.gpus {
        for m in &g.mig_devices {
            for cap in [
                format!("gpu{}/gi{}/access", g.minor, m.gpu_instance_id),
                format!(
                    "gpu{}/gi{}/ci{}/access",
                    g.minor, m.gpu_instance_id, m.compute_instance_id
                ),
            ] {
                caps.push((cap, next));
                next += 1;
            }
        }
    }
    let text: String = caps.iter().map(|(c, m)| format!("{c} {m}\n")).collect();
    let proc_caps = host.proc_root().join("driver/nvidia-caps");
    fs::create_dir_all(&proc_caps).unwrap();
    fs::write(proc_caps.join("mig-minors"), text).unwrap();
    let dev = host.root().join("dev/nvidia-caps");
    fs::create_dir_all(&dev).unwrap();
    for (_, minor) in &caps {
        let node = dev.join(format!("nvidia-cap{minor}"));
        mknod(
            &node,
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o444),
            makedev(u64::from(host.spec().caps_major), u64::from(*minor)),
        )
        .unwrap();
    }
    caps
}

fn cap_minor(caps: &[(String, u32)], cap: &str) -> u32 {
    caps.iter().find(|(c, _)| c == cap).unwrap().1
}

#[test]
fn generate_through_fake_nvml_eight_gpus_with_mig() {
    let w = world(8);
    let topology = mig_topology(&w.host);
    let caps = install_mig_caps(&w.host, &topology);
    let topo_file = w.install_fake_nvml(&topology);
    let (spec, stderr) = generate(&w, &[], &[(TOPOLOGY_ENV, &topo_file)]);
    assert!(!stderr.contains("NVML not used"), "{stderr}");
    assert!(stderr.contains("GPUs from NVML"), "{stderr}");

    let mut want: Vec<String> = vec!["all".into()];
    for (i, g) in topology.gpus.iter().enumerate() {
        if g.mig_enabled == Some(true) {
            for (m, d) in g.mig_devices.iter().enumerate() {
                want.push(format!("{i}:{m}"));
                want.push(d.uuid.clone());
            }
        } else {
            want.push(i.to_string());
            want.push(g.uuid.clone());
        }
    }
    want.sort();
    assert_eq!(
        device_names(&spec),
        want,
        "MIG-enabled GPUs are served by their MIG devices only"
    );
    // The whole GPUs' DRM groups in `additionalGids`.
    assert_eq!(spec.cdi_version, "0.7.0");

    // A MIG device: its parent GPU node plus the GPU-instance and compute-instance caps.
    let parent = &topology.gpus[5];
    let d = &topology.gpus[5].mig_devices[1];
    let gi = cap_minor(
        &caps,
        &format!("gpu{}/gi{}/access", parent.minor, d.gpu_instance_id),
    );
    let ci = cap_minor(
        &caps,
        &format!(
            "gpu{}/gi{}/ci{}/access",
            parent.minor, d.gpu_instance_id, d.compute_instance_id
        ),
    );
    let want_nodes = vec![
        format!("/dev/nvidia{}", parent.minor),
        format!("/dev/nvidia-caps/nvidia-cap{gi}"),
        format!("/dev/nvidia-caps/nvidia-cap{ci}"),
    ];
    assert_eq!(node_paths(&spec, "5:1"), want_nodes);
    assert_eq!(node_paths(&spec, &d.uuid), want_nodes);
    let cap_node = &spec.device("5:1").unwrap().container_edits.device_nodes[1];
    assert_eq!(
        (cap_node.major, cap_node.minor),
        (Some(w.host.spec().caps_major.into()), Some(gi.into()))
    );
    // `all`: 6 full GPUs with their card and render nodes, 2 MIG parents (MIG devices get no
    // DRM nodes), 2 caps per MIG device (5 devices).
    assert_eq!(node_paths(&spec, "all").len(), 6 * 3 + 2 + 2 * 5);

    // The same through JSON and the type-index strategy.
    let out = nvshim(
        &w,
        &[
            "cdi",
            "generate",
            "--format",
            "json",
            "--device-name-strategy",
            "type-index",
        ],
        &[(TOPOLOGY_ENV, &topo_file)],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json_spec = spec::parse(&out.stdout).unwrap();
    json_spec.validate().unwrap();
    assert!(json_spec.device("gpu0").is_some());
    assert!(json_spec.device("mig5:1").is_some());
    assert!(json_spec.device("gpu5").is_none());
    // type-index names start with a letter: 0.7.0 only for the DRM groups.
    assert_eq!(json_spec.cdi_version, "0.7.0");
}

// ---- consume through nvshim-runtime and runc ------------------------------------------------

#[test]
fn annotation_selects_one_gpu_through_runc() {
    let w = world(2);
    generate(&w, &[], &[]);
    // A broken spec beside it is skipped with a warning; the good one still serves.
    fs::write(
        w.etc_cdi.join("broken.yaml"),
        "cdiVersion: 9.9.9\nkind: x/y\n",
    )
    .unwrap();
    let bundle = annotated_bundle(&w, "b1", "nvidia.com/gpu=1");
    let r = w.run(&bundle);
    assert_no_problems(
        "annotation nvidia.com/gpu=1",
        &cdi_container_problems(&r, &w.host, &[w.gpu(1)]),
        &r,
    );
    let log = w.shim_log();
    assert!(
        log.contains("broken.yaml") && log.contains("invalid version"),
        "{log}"
    );
}

#[test]
fn qualified_names_in_env_use_cdi_in_auto_mode() {
    let w = world(2);
    generate(&w, &[], &[]);
    let bundle = w.probe_bundle("b1", &[]);
    bundle
        .set_env(
            "NVIDIA_VISIBLE_DEVICES",
            &format!("nvidia.com/gpu={}", w.gpu(0).uuid),
        )
        .unwrap();
    let r = w.run(&bundle);
    assert_no_problems(
        "NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=<uuid of index 0>",
        &cdi_container_problems(&r, &w.host, &[w.gpu(0)]),
        &r,
    );
}

#[test]
fn mig_device_through_runc() {
    let w = world(8);
    let topology = mig_topology(&w.host);
    let caps = install_mig_caps(&w.host, &topology);
    let topo_file = w.install_fake_nvml(&topology);
    generate(&w, &[], &[(TOPOLOGY_ENV, &topo_file)]);
    let bundle = annotated_bundle(&w, "b1", "nvidia.com/gpu=2:1");
    let r = w.run(&bundle);
    let parent = w.gpu(2);
    let mut p = r.gpu_problems(&w.host, &[parent]);
    let d = &topology.gpus[2].mig_devices[1];
    for cap in [
        format!("gpu{}/gi{}/access", parent.minor, d.gpu_instance_id),
        format!(
            "gpu{}/gi{}/ci{}/access",
            parent.minor, d.gpu_instance_id, d.compute_instance_id
        ),
    ] {
        let minor = cap_minor(&caps, &cap);
        if !r.cgroup_allows('c', w.host.spec().caps_major, minor, "r") {
            p.push(format!(
                "devices.list does not allow the {cap} capability (minor {minor})"
            ));
        }
    }
    assert_no_problems("MIG device 2:1", &p, &r);
}

#[test]
fn unresolvable_devices_fail_create_and_leave_the_bundle() {
    let w = world(2);
    generate(&w, &[], &[]);
    let bundle = annotated_bundle(
        &w,
        "b1",
        "nvidia.com/gpu=9,nvidia.com/gpu=0,nvidia.com/gpu=GPU-nope",
    );
    let before = bundle.config_bytes().unwrap();
    let out = w.shim().run(&bundle, &unique_id("cdi-e2e")).unwrap();
    assert!(!out.success(), "{out}");
    assert!(
        out.stderr
            .contains("unresolvable CDI devices nvidia.com/gpu=9, nvidia.com/gpu=GPU-nope"),
        "{out}"
    );
    assert!(out.stderr.contains("has no device \"9\""), "{out}");
    assert_eq!(
        bundle.config_bytes().unwrap(),
        before,
        "config.json must be untouched"
    );
}

// ---- list and validate ------------------------------------------------------------------------

#[test]
fn list_and_validate() {
    let w = world(2);
    generate(&w, &[], &[]);
    let broken = w.etc_cdi.join("broken.json");
    fs::write(&broken, r#"{"cdiVersion": "0.3.0", "kind": "vendor.com/x", "devices": [{"name": "0", "containerEdits": {"env": ["A=1"]}}]}"#).unwrap();
    let out = nvshim(&w, &["cdi", "list"], &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let good = w.run_cdi.join("nvidia.yaml");
    assert!(
        stdout.contains(&format!("nvidia.com/gpu=0\t{}", good.display())),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("nvidia.com/gpu=all\t{}", good.display())),
        "{stdout}"
    );
    assert!(stdout.contains("# failed to load:"), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "{}: invalid CDI Spec: the spec version must be at least v0.5.0",
            broken.display()
        )),
        "{stdout}"
    );

    let out = nvshim(&w, &["cdi", "validate", good.to_str().unwrap()], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = nvshim(
        &w,
        &[
            "cdi",
            "validate",
            good.to_str().unwrap(),
            broken.to_str().unwrap(),
        ],
        &[],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("valid: kind nvidia.com/gpu"), "{stdout}");
    assert!(stdout.contains("must be at least v0.5.0"), "{stdout}");
}

// ---- podman: an independent consumer of the same spec ------------------------------------------

#[test]
fn podman_sees_what_nvshim_runtime_gives() {
    let w = world(2);
    let class = format!("gpu-e2e{}", std::process::id());
    let kind = format!("nvidia.com/{class}");
    // Debian 12's podman 4.3 reads CDI up to 0.5.0: the DRM groups (`additionalGids`, 0.7.0)
    // left out, as for any engine whose CDI stops below 0.7.0.
    let (spec, _) = generate(&w, &["--class", &class, "--no-additional-gids"], &[]);
    assert_eq!(spec.kind, kind);
    assert_eq!(spec.cdi_version, "0.5.0");
    // podman 4.3 reads CDI specs from /etc/cdi and /var/run/cdi only; the class is unique to
    // this process so the file cannot collide with any other spec there.
    let system_spec = SystemSpec::write(
        Path::new("/var/run/cdi"),
        &format!("nvshim-e2e-{class}.yaml"),
        &fs::read_to_string(w.run_cdi.join("nvidia.yaml")).unwrap(),
    )
    .unwrap();

    // podman, from an image of the same busybox rootfs the bundles use.
    let podman = Podman::new(&w.tmp.path().join("podman")).unwrap();
    let image = format!("localhost/nvshim-e2e-cdi:{}", std::process::id());
    podman.import_busybox(&image).unwrap();
    let device = format!("{kind}=1");
    let script = ProbeSpec::for_host(&w.host).script();
    let out = podman
        .run(&image, &[&device], &["sh", "-c", &script])
        .unwrap();
    let podman_report = ProbeReport::parse(&String::from_utf8_lossy(&out.stdout));
    assert!(
        out.status.success() && podman_report.complete,
        "podman run --device {device} failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    assert_no_problems(
        "podman --device",
        &cdi_container_problems(&podman_report, &w.host, &[w.gpu(1)]),
        &podman_report,
    );

    // nvshim-runtime, the same device by annotation.
    let bundle = annotated_bundle(&w, "b1", &device);
    let shim_report = w.run(&bundle);
    let (podman_view, shim_view) = (
        podman_report.nvidia_view(&w.host),
        shim_report.nvidia_view(&w.host),
    );
    if std::env::var_os("NVSHIM_E2E_VERBOSE").is_some() {
        eprintln!("{}", serde_json::to_string_pretty(&podman_view).unwrap());
    }
    assert_eq!(
        podman_view,
        shim_view,
        "podman and nvshim-runtime disagree on {device}\npodman: {}\nnvshim: {}",
        serde_json::to_string_pretty(&podman_view).unwrap(),
        serde_json::to_string_pretty(&shim_view).unwrap()
    );
    // Sanity: the view is not trivially empty.
    assert!(
        podman_view["mounts"].as_array().unwrap().len() > 10,
        "{podman_view}"
    );
    assert!(
        podman_view["devices"].as_array().unwrap().len() >= 5,
        "{podman_view}"
    );
    drop(system_spec);
}

// ---- security: a CDI hook never runs with the container's environment ------------------------

/// runc runs a hook whose config.json entry has no `env` from `runc init`, with the
/// container's environment: an image's `LD_PRELOAD` would load into a root process on the
/// host. The spec's hook has no env; the image sets `LD_PRELOAD` to a library that writes a
/// host marker. The positive control (a spec that itself sets `LD_PRELOAD` for its hook) shows
/// the library does load when asked to, so the marker's absence means something.
#[test]
fn cdi_hook_without_env_does_not_get_the_image_ld_preload() {
    let w = world(1);
    let lib_dir = w.tmp.path().join("lib");
    fs::create_dir_all(&lib_dir).unwrap();
    let marker = lib_dir.join("owned");
    let preload = nvshim_testsupport::hook_harness::preload_library(&lib_dir, &marker);
    // A dynamic binary the loader preloads into; `true` exits 0 as a hook must.
    let hook = ["/usr/bin/true", "/bin/true"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("true(1) on the host");
    let spec = |hook_env: &str| {
        format!(
            "cdiVersion: 0.5.0\nkind: vendor.com/device\ndevices:\n- name: d\n  containerEdits:\n    env: [NVCT_VENDOR_DEVICE=d]\n    hooks:\n    - hookName: createContainer\n      path: {hook}\n{hook_env}"
        )
    };
    fs::write(w.run_cdi.join("vendor.yaml"), spec("")).unwrap();
    let bundle = annotated_bundle(&w, "b1", "vendor.com/device=d");
    bundle
        .set_env("LD_PRELOAD", &preload.display().to_string())
        .unwrap();
    let r = w.run(&bundle);
    assert_eq!(
        r.env.get("NVCT_VENDOR_DEVICE").map(String::as_str),
        Some("d")
    );
    assert!(
        !marker.exists(),
        "the image's LD_PRELOAD library ran in the CDI hook on the host"
    );
    let config: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(bundle.dir().join("config.json")).unwrap())
            .unwrap();
    assert_eq!(
        config["hooks"]["createContainer"][0]["env"],
        json!([nvshim::nvidia::HOOK_ENV]),
        "{config}"
    );

    // Positive control: the spec's own env is kept, and the library then loads.
    fs::write(
        w.run_cdi.join("vendor.yaml"),
        spec(&format!(
            "      env: [\"LD_PRELOAD={}\"]\n",
            preload.display()
        )),
    )
    .unwrap();
    let bundle = annotated_bundle(&w, "b2", "vendor.com/device=d");
    w.run(&bundle);
    assert!(
        marker.exists(),
        "the positive control did not load the library"
    );
}

// ---- `nvshim cdi validate` on files as the reference reads them ---------------------------------

/// tests/fixtures/cdi: byte-order marks (UTF-8, UTF-16 LE and BE, YAML and JSON) and merge keys
/// are accepted as the reference accepts them, a merge key whose keys are set again is not; keys differing in case resolve to the
/// byte-greatest; a hook without env is valid but warned about; UTF-16 without a mark and a
/// version nvshim does not read are errors that say why.
#[test]
fn validate_probes_as_the_reference() {
    let w = world(1);
    let fixture = |name: &str| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/cdi")
            .join(name)
    };
    let validate = |name: &str| {
        let out = nvshim(
            &w,
            &["cdi", "validate", fixture(name).to_str().unwrap()],
            &[],
        );
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    for ok in [
        "bom-utf8.yaml",
        "bom-utf8.json",
        "utf16le.yaml",
        "utf16be.json",
        "merge-keys.yaml",
    ] {
        let (code, stdout) = validate(ok);
        assert_eq!(code, Some(0), "{ok}: {stdout}");
        assert!(
            stdout.contains("valid: kind vendor.com/device") && !stdout.contains("warning"),
            "{ok}: {stdout}"
        );
    }
    let (code, stdout) = validate("key-case.yaml");
    assert_eq!(code, Some(0), "{stdout}");
    assert!(
        stdout.contains("valid: kind vendor.com/device,"),
        "{stdout}"
    );

    let (code, stdout) = validate("hook-without-env.yaml");
    assert_eq!(code, Some(0), "{stdout}");
    assert!(
        stdout.contains("hook-without-env.yaml: warning: device \"d\": createContainer hook /usr/bin/vendor-hook has no env"),
        "{stdout}"
    );

    let (code, stdout) = validate("utf16le-no-bom.yaml");
    assert_eq!(code, Some(1), "{stdout}");
    assert!(stdout.contains("utf16le-no-bom.yaml"), "{stdout}");
    // The reference decodes in yaml.v2's strict mode: a merged key set again is an error.
    let (code, stdout) = validate("merge-key-override.yaml");
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        stdout.contains("key \"env\" already set in map"),
        "{stdout}"
    );
    let (code, stdout) = validate("version-1.2.0.yaml");
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        stdout.contains("invalid version \"1.2.0\": nvshim reads CDI spec versions 1.1.0, 1.0.0,"),
        "{stdout}"
    );
}

/// A spec directory that cannot be read (here `/etc/cdi` is a file) does not hide the specs of
/// the next one, and a FIFO named like a spec (which a blocking open would wait on forever)
/// is refused: the container still gets its GPU, and the log names both.
#[test]
fn broken_etc_cdi_and_a_fifo_do_not_stop_create() {
    let w = world(2);
    generate(&w, &[], &[]);
    fs::remove_dir(&w.etc_cdi).unwrap();
    fs::write(&w.etc_cdi, "not a directory").unwrap();
    let fifo = w.run_cdi.join("a-fifo.yaml");
    nix::unistd::mkfifo(&fifo, Mode::from_bits_truncate(0o644)).unwrap();
    let bundle = annotated_bundle(&w, "b1", "nvidia.com/gpu=0");
    let r = w.run(&bundle);
    assert_no_problems(
        "nvidia.com/gpu=0 with a broken etc dir and a FIFO",
        &cdi_container_problems(&r, &w.host, &[w.gpu(0)]),
        &r,
    );
    let log = w.shim_log();
    assert!(
        log.contains(&w.etc_cdi.display().to_string()) && log.contains("a-fifo.yaml"),
        "{log}"
    );
}

// ---- refresh ----------------------------------------------------------------------------------

/// `nvshim cdi refresh --output <run-cdi>/nvidia.yaml ARGS`; asserts success, returns stderr.
fn refresh(w: &World, extra: &[&str], env: &[(&str, &Path)]) -> String {
    cdi_into_run_dir(w, "refresh", extra, env)
}

/// (inode, modification time) of the refreshed spec: what a directory watcher sees change.
fn spec_identity(w: &World) -> (u64, std::time::SystemTime) {
    use std::os::unix::fs::MetadataExt;
    let m = fs::metadata(w.run_cdi.join("nvidia.yaml")).unwrap();
    (m.ino(), m.modified().unwrap())
}

/// A claim spec as NVIDIA's DRA driver leaves it beside the node spec (kind
/// `k8s.gpu.nvidia.com/claim`, file named by `cdiapi.GenerateTransientSpecName`, as in
/// k8s.rs): refresh must never touch it.
fn dra_claim_spec(w: &World) -> (PathBuf, Vec<u8>) {
    let path = w
        .run_cdi
        .join("k8s.gpu.nvidia.com-claim_b0d6a7a2-6f0e-4a43-9c52-2f1d0e6f3c11.yaml");
    let text = format!(
        "cdiVersion: 0.5.0\nkind: k8s.gpu.nvidia.com/claim\ndevices:\n- name: b0d6a7a2-6f0e-4a43-9c52-2f1d0e6f3c11-gpu-0\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia{}\n      hostPath: {}\n",
        w.gpu(0).minor,
        w.host.root().join(format!("dev/nvidia{}", w.gpu(0).minor)).display()
    );
    fs::write(&path, &text).unwrap();
    (path, text.into_bytes())
}

#[test]
fn refresh_writes_the_spec_once_then_only_when_the_gpus_change() {
    let w = world(2);
    let (claim, claim_text) = dra_claim_spec(&w);
    let spec_path = w.run_cdi.join("nvidia.yaml");

    let stderr = refresh(&w, &[], &[]);
    assert!(
        stderr.contains(&format!("wrote {}", spec_path.display())),
        "{stderr}"
    );
    // The same spec `cdi generate` writes.
    let generated = w.tmp.path().join("generated.yaml");
    let out = nvshim(
        &w,
        &["cdi", "generate", "--output", generated.to_str().unwrap()],
        &[],
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(fs::read(&spec_path).unwrap(), fs::read(&generated).unwrap());
    let spec = spec::read_file(&spec_path).unwrap();
    let (g0, g1) = (w.gpu(0).clone(), w.gpu(1).clone());
    let mut want = vec!["0", "1", "all", g0.uuid.as_str(), g1.uuid.as_str()];
    want.sort();
    assert_eq!(device_names(&spec), want);

    // Nothing changed: silent, and the file is not rewritten (no event for the watchers).
    let before = spec_identity(&w);
    assert_eq!(refresh(&w, &[], &[]), "");
    assert_eq!(spec_identity(&w), before);
    // --force regenerates, and still writes nothing for the same bytes.
    let stderr = refresh(&w, &["--force"], &[]);
    assert!(stderr.contains("content unchanged"), "{stderr}");
    assert_eq!(spec_identity(&w), before);

    // The GPU at bus index 1 falls off the bus.
    w.host.unplug_gpu(&g1.bus_id).unwrap();
    let stderr = refresh(&w, &[], &[]);
    assert!(
        stderr.contains(&format!("updated {}", spec_path.display()))
            && stderr.contains(&format!(
                "has device {}, a GPU this host does not have",
                g1.uuid
            )),
        "{stderr}"
    );
    let spec = spec::read_file(&spec_path).unwrap();
    let mut want = vec!["0", "all", g0.uuid.as_str()];
    want.sort();
    assert_eq!(device_names(&spec), want);

    // The DRA driver's spec is as its producer wrote it, and no temp file is left behind.
    assert_eq!(fs::read(&claim).unwrap(), claim_text);
    let mut files: Vec<String> = fs::read_dir(&w.run_cdi)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            claim.file_name().unwrap().to_string_lossy().into_owned(),
            "nvidia.yaml".to_string()
        ]
    );
}

#[test]
fn refresh_follows_a_mig_reconfiguration() {
    let w = world(8);
    let mut topology = mig_topology(&w.host);
    // The instances NVML reports, as the driver lists them under /proc and in mig-minors.
    let instances: Vec<(u32, u32, u32)> = topology
        .gpus
        .iter()
        .flat_map(|g| {
            g.mig_devices
                .iter()
                .map(|m| (g.minor, m.gpu_instance_id, m.compute_instance_id))
        })
        .collect();
    w.host.add_mig_caps(&instances).unwrap();
    let topo_file = w.install_fake_nvml(&topology);
    let env: &[(&str, &Path)] = &[(TOPOLOGY_ENV, &topo_file)];
    let spec_path = w.run_cdi.join("nvidia.yaml");

    let stderr = refresh(&w, &[], env);
    assert!(stderr.contains("wrote"), "{stderr}");
    let names = device_names(&spec::read_file(&spec_path).unwrap());
    for n in ["2:0", "2:1", "5:0", "5:1", "5:2"] {
        assert!(names.contains(&n.to_string()), "{n} in {names:?}");
    }
    assert_eq!(refresh(&w, &[], env), "", "a current MIG layout is fresh");

    // The operator destroys GPU instance 3 on the GPU at bus index 5 (`nvidia-smi mig -dci -gi
    // 3; nvidia-smi mig -dgi -gi 3`): NVML and /proc both stop listing it.
    let gpu5 = topology.gpus[5].minor;
    let gone = topology.gpus[5].mig_devices.pop().unwrap();
    assert_eq!(gone.gpu_instance_id, 3);
    fs::write(&topo_file, serde_json::to_string_pretty(&topology).unwrap()).unwrap();
    w.host.destroy_mig_instance(gpu5, 3).unwrap();
    let stderr = refresh(&w, &[], env);
    assert!(
        stderr.contains("updated")
            && stderr.contains(&format!(
                "has MIG device gpu{gpu5}/gi3/ci0, which no longer exists"
            )),
        "{stderr}"
    );
    let names = device_names(&spec::read_file(&spec_path).unwrap());
    assert!(
        !names.contains(&"5:2".to_string()) && !names.contains(&gone.uuid),
        "{names:?}"
    );
    assert!(names.contains(&"5:1".to_string()), "{names:?}");
    assert_eq!(refresh(&w, &[], env), "");
}

#[test]
fn refresh_waits_for_the_driver_and_does_nothing_without_it() {
    let w = world(2);
    let version = w.host.proc_root().join("driver/nvidia/version");
    let banner = fs::read(&version).unwrap();
    w.host.unload_driver().unwrap();
    let spec_path = w.run_cdi.join("nvidia.yaml");

    // Not loaded: nothing written, exit 0 (the boot unit must not fail a node without GPUs).
    let stderr = refresh(&w, &[], &[]);
    assert!(stderr.contains("driver is not loaded"), "{stderr}");
    assert!(!spec_path.exists());
    // A spec from before stays (a running pod's devices are not taken away).
    fs::write(
        &spec_path,
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\n",
    )
    .unwrap();
    refresh(&w, &[], &[]);
    assert_eq!(
        fs::read_to_string(&spec_path).unwrap(),
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\n"
    );

    // At boot the GPUs are on the PCI bus (sysfs vendor 0x10de) before the module loads: the
    // unit waits for it, bounded, so the engines started after it find a spec.
    let loader = {
        let version = version.clone();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(500));
            fs::write(version, banner).unwrap();
        })
    };
    let stderr = refresh(&w, &["--wait-for-driver", "60"], &[]);
    loader.join().unwrap();
    assert!(
        stderr.contains("updated") && stderr.contains("has no devices"),
        "{stderr}"
    );
    assert_eq!(
        device_names(&spec::read_file(&spec_path).unwrap()).len(),
        5,
        "0, 1, their UUIDs and all"
    );
}

// ---- producers: specs as the world writes them -----------------------------------------------

/// A spec a real producer writes (tests/fixtures/cdi/producers/README.md says whose and from
/// which of its sources), and the devices a container asks for from it.
struct Producer {
    file: &'static str,
    devices: &'static [&'static str],
}

const PRODUCERS: &[Producer] = &[
    Producer {
        file: "nvidia-ctk-0.5.0-driver-container.yaml",
        devices: &["nvidia.com/gpu=0"],
    },
    Producer {
        file: "nvidia-device-plugin-0.6.0.json",
        devices: &["k8s.device-plugin.nvidia.com/gpu=@GPU1_UUID@"],
    },
    Producer {
        file: "nvidia-ctk-0.7.0-graphics.yaml",
        devices: &["nvidia.com/gpu=0"],
    },
    Producer {
        file: "cdi-current-version-0.8.0.yaml",
        devices: &["nvidia.com/gpu=1"],
    },
    Producer {
        file: "dra-gpu-claim-mig.yaml",
        devices: &["k8s.gpu.nvidia.com/claim=4f0c3f4e-9f0a-4d3e-8a7f-2b1c0d9e8f7a-gpu-0-mig-1-0"],
    },
    Producer {
        file: "dra-compute-domain-channel.yaml",
        devices: &[
            "k8s.compute-domain.nvidia.com/claim=0b6f2d3c-1a2b-4c5d-9e8f-7a6b5c4d3e2f-channel-0",
        ],
    },
    Producer {
        file: "dra-compute-domain-daemon-base.yaml",
        devices: &["k8s.compute-domain.nvidia.com/device=all"],
    },
    Producer {
        file: "dra-compute-domain-daemon-claim.yaml",
        devices: &[
            "k8s.compute-domain.nvidia.com/claim=7c1e5a9b-3d2f-4e6a-8b0c-1d2e3f4a5b6c-daemon",
        ],
    },
    Producer {
        file: "dra-vfio.yaml",
        devices: &["k8s.gpu.nvidia.com/claim=2d3e4f5a-6b7c-4d8e-9f0a-1b2c3d4e5f6a-vfio-0"],
    },
    Producer {
        file: "dra-vfio-iommufd.yaml",
        devices: &["k8s.gpu.nvidia.com/claim=2d3e4f5a-6b7c-4d8e-9f0a-1b2c3d4e5f6a-vfio-1"],
    },
    Producer {
        file: "amd-ctk-0.6.0.json",
        devices: &["amd.com/gpu=0"],
    },
    Producer {
        file: "intel-gaudi-dra.yaml",
        devices: &[
            "intel.com/gaudi=0000-4d-00-0-0x1020",
            "intel.com/gaudi=5e6f7a8b-9c0d-4e1f-a2b3-c4d5e6f7a8b9",
        ],
    },
];

/// The nodes the fixtures' producers find on a real host that the simulated one lacks: VFIO's
/// container (misc 10:196), a VFIO group, iommufd (misc, dynamic minor) and a device cdev, and a
/// Gaudi's accel nodes (the accel major 261). Numbers as such hosts show them.
const EXTRA_NODES: &[(&str, u64, u64)] = &[
    ("dev/vfio/vfio", 10, 196),
    ("dev/vfio/42", 509, 0),
    ("dev/iommu", 10, 123),
    ("dev/vfio/devices/vfio0", 508, 0),
    ("dev/accel/accel0", 261, 0),
    ("dev/accel/accel_controlD0", 261, 64),
];

/// What a user of the spec checks from inside the container, keyed by what it is about:
/// `node:<path>` → `<major>:<minor>` (and `present:<path>` for every node of the GPU and
/// accelerator families, so that an extra one shows), `cgroup:<type>_<major>:<minor>` → access,
/// `env:<key>` → value, `mount:<path>` → `ro`/`rw`,
/// `link:<path>` → target, `gid:<n>` → `member`, `ldcache:<dir>` → `yes` when `ldconfig -p`
/// lists a library there, `hook:<name>` → how many times a createRuntime hook ran.
type View = std::collections::BTreeMap<String, String>;

/// The substitutions that put a fixture on this world's simulated host.
fn producer_vars(w: &World, hooks: &Path, state: &Path) -> Vec<(&'static str, String)> {
    let g0 = w.gpu(0);
    let g1 = w.gpu(1);
    let drm = drm_paths(&w.host, g0);
    let card = drm.iter().find(|p| p.contains("card")).unwrap();
    let render = drm.iter().find(|p| p.contains("render")).unwrap();
    vec![
        ("@DRIVER_ROOT@", w.host.root().display().to_string()),
        ("@DEV_ROOT@", w.host.dev_root().display().to_string()),
        ("@HOOKS@", hooks.display().to_string()),
        ("@STATE@", state.display().to_string()),
        ("@VERSION@", w.host.driver_version().to_string()),
        ("@GPU0_MINOR@", g0.minor.to_string()),
        ("@GPU1_MINOR@", g1.minor.to_string()),
        ("@GPU0_UUID@", g0.uuid.clone()),
        ("@GPU1_UUID@", g1.uuid.clone()),
        (
            "@GPU0_CARD@",
            card.trim_start_matches("/dev/dri/").to_string(),
        ),
        (
            "@GPU0_RENDER@",
            render.trim_start_matches("/dev/dri/").to_string(),
        ),
        ("@CAPS_MAJOR@", w.host.spec().caps_major.to_string()),
        ("@IMEX_MAJOR@", w.host.spec().caps_imex_major.to_string()),
    ]
}

fn substitute(text: &str, vars: &[(&str, String)]) -> String {
    vars.iter()
        .fold(text.to_string(), |t, (k, v)| t.replace(k, v))
}

/// The edits that apply to `devices` of `spec` (theirs and the spec's own), as JSON.
fn applied_edits(spec: &serde_json::Value, devices: &[String]) -> Vec<serde_json::Value> {
    let mut edits = vec![spec["containerEdits"].clone()];
    for d in spec["devices"].as_array().unwrap() {
        let name = d["name"].as_str().unwrap();
        if devices.iter().any(|q| q.rsplit('=').next() == Some(name)) {
            edits.push(d["containerEdits"].clone());
        }
    }
    edits
}

/// What the spec says a container asking for `devices` must see (the view), and the probe
/// script that prints it.
fn expected_view(spec: &serde_json::Value, devices: &[String]) -> (View, String) {
    let mut want = View::new();
    let mut script = String::new();
    let arr = |v: &serde_json::Value| v.as_array().cloned().unwrap_or_default();
    for e in applied_edits(spec, devices) {
        for n in arr(&e["deviceNodes"]) {
            let path = n["path"].as_str().unwrap().to_string();
            let (major, minor) = match (n["major"].as_u64(), n["minor"].as_u64()) {
                (Some(a), Some(b)) => (a, b),
                _ => {
                    let host = n["hostPath"].as_str().unwrap_or(&path);
                    let rdev = nix::sys::stat::stat(host).unwrap().st_rdev;
                    (nix::sys::stat::major(rdev), nix::sys::stat::minor(rdev))
                }
            };
            want.insert(format!("node:{path}"), format!("{major:x}:{minor:x}"));
            want.insert(format!("present:{path}"), "yes".into());
            let access = n["permissions"].as_str().unwrap_or("rwm");
            want.insert(format!("cgroup:c_{major}:{minor}"), access.to_string());
            script.push_str(&format!(
                "echo \"node:{path} $([ -c {path} ] && stat -c '%t:%T' {path})\"\n"
            ));
        }
        for kv in arr(&e["env"]) {
            let (k, v) = kv.as_str().unwrap().split_once('=').unwrap();
            want.insert(format!("env:{k}"), v.to_string());
            script.push_str(&format!("echo \"env:{k} ${{{k}}}\"\n"));
        }
        for m in arr(&e["mounts"]) {
            let dest = m["containerPath"].as_str().unwrap();
            let ro = arr(&m["options"]).iter().any(|o| o == "ro");
            want.insert(format!("mount:{dest}"), if ro { "ro" } else { "rw" }.into());
            // The last mount on the path is the one the container sees.
            script.push_str(&format!(
                "echo \"mount:{dest} $(awk -v p={dest} '$5 == p {{ split($6, o, \",\"); m = o[1] }} END {{ print m }}' /proc/self/mountinfo)\"\n"
            ));
        }
        for g in arr(&e["additionalGids"]) {
            want.insert(format!("gid:{g}"), "member".into());
            script.push_str(&format!(
                "for g in $(id -G); do [ \"$g\" = {g} ] && echo \"gid:{g} member\"; done\n"
            ));
        }
        for h in arr(&e["hooks"]) {
            let args: Vec<String> = arr(&h["args"])
                .iter()
                .map(|a| a.as_str().unwrap().to_string())
                .collect();
            for pair in args.windows(2) {
                if pair[0] == "--link" {
                    let (target, link) = pair[1].split_once("::").unwrap();
                    want.insert(format!("link:{link}"), target.to_string());
                    script.push_str(&format!("echo \"link:{link} $(readlink {link})\"\n"));
                }
                if pair[0] == "--folder" {
                    let dir = &pair[1];
                    want.insert(format!("ldcache:{dir}"), "yes".into());
                    script.push_str(&format!(
                        "/sbin/ldconfig -p | grep -q '=> {dir}/' && echo \"ldcache:{dir} yes\"\n"
                    ));
                }
            }
            if h["hookName"] == "createRuntime" {
                want.insert(format!("hook:{}", args[0]), "1".into());
            }
        }
    }
    // Nothing of these device families beyond what the spec gives (NVIDIA_VISIBLE_DEVICES=void
    // keeps an NVIDIA runtime from adding the GPUs).
    script.push_str(&format!(
        "for f in {DEVICE_FAMILIES}; do [ -c \"$f\" ] && echo \"present:$f yes\"; done\n"
    ));
    script.push_str("echo PRODUCER_DONE\n");
    (want, script)
}

/// The device nodes a GPU, accelerator or passthrough spec may give.
const DEVICE_FAMILIES: &str = "/dev/nvidia* /dev/nvidia-caps/* /dev/nvidia-caps-imex-channels/* /dev/dri/* /dev/vfio/* /dev/vfio/devices/* /dev/iommu /dev/kfd /dev/accel/*";

/// The probe's lines as a view (`hook:` entries are added by the caller, from the host).
fn parse_view(stdout: &str) -> View {
    stdout
        .lines()
        .filter_map(|l| l.split_once(' ').or(Some((l, ""))))
        .filter(|(k, _)| k.contains(':'))
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The cgroup device rules a container got (`/sys/fs/cgroup/devices/devices.list`, cgroup v1),
/// as `cgroup:<type>_<major>:<minor> <access>` lines.
const CGROUP_PROBE: &str = "[ -r /sys/fs/cgroup/devices/devices.list ] && sed 's/^\\([a-z]\\) \\([^ ]*\\) /cgroup:\\1_\\2 /' /sys/fs/cgroup/devices/devices.list\n";

#[test]
fn producer_specs_through_nvshim_runtime_and_podman() {
    let w = world(2);
    // The hook binaries where the producers put them: NVIDIA's as links to nvshim-hook (what
    // nvshim's packages install) or, as the DRA driver does, a copy under the kubelet's plugin
    // dir; Habana's a script that counts its runs.
    let hooks = w.tmp.path().join("hooks");
    let state = w.tmp.path().join("state");
    for link in [
        "usr/bin/nvidia-ctk",
        "usr/bin/nvidia-cdi-hook",
        "usr/local/nvidia/toolkit/nvidia-ctk",
    ] {
        let path = hooks.join(link);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(hook_path(), &path).unwrap();
    }
    let copied = hooks.join("var/lib/kubelet/plugins/compute-domain.nvidia.com/nvidia-cdi-hook");
    fs::create_dir_all(copied.parent().unwrap()).unwrap();
    fs::copy(hook_path(), &copied).unwrap();
    let habana_runs = state.join("habana-container-hook.runs");
    let habana = hooks.join("usr/bin/habana-container-hook");
    fs::create_dir_all(state.join("domains/9a8b7c6d-5e4f-4a3b-2c1d-0e9f8a7b6c5d")).unwrap();
    fs::write(
        &habana,
        format!(
            "#!/bin/sh\ncat > /dev/null\necho \"$*\" >> {}\n",
            habana_runs.display()
        ),
    )
    .unwrap();
    fs::set_permissions(&habana, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    for (path, major, minor) in EXTRA_NODES {
        let path = w.host.dev_root().join(path);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        mknod(
            &path,
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o666),
            makedev(*major, *minor),
        )
        .unwrap();
    }
    let vars = producer_vars(&w, &hooks, &state);
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cdi/producers");
    let podman_dir = w.tmp.path().join("podman");
    let image = format!("localhost/nvshim-e2e-producers:{}", std::process::id());
    let mut podman: Option<Podman> = None;
    let mut compared = Vec::new();
    let mut problems = Vec::new();
    for (i, p) in PRODUCERS.iter().enumerate() {
        let text = substitute(&fs::read_to_string(fixtures.join(p.file)).unwrap(), &vars);
        let devices: Vec<String> = p.devices.iter().map(|d| substitute(d, &vars)).collect();
        let spec: serde_json::Value = serde_yaml::from_str(&text).unwrap();
        let version = spec["cdiVersion"].as_str().unwrap().to_string();
        // The spec alone in the spec dirs: two fixtures may define the same device.
        for dir in [&w.etc_cdi, &w.run_cdi] {
            fs::remove_dir_all(dir).unwrap();
            fs::create_dir_all(dir).unwrap();
        }
        let path = w.run_cdi.join(p.file);
        fs::write(&path, &text).unwrap();
        let out = nvshim(&w, &["cdi", "validate", path.to_str().unwrap()], &[]);
        if !out.status.success() {
            problems.push(format!(
                "{}: nvshim cdi validate refused it: {}{}",
                p.file,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
            continue;
        }
        let (want, script) = expected_view(&spec, &devices);
        let script = format!("{script}{CGROUP_PROBE}");

        // nvshim-runtime over runc, the devices by annotation as the kubelet writes them.
        let _ = fs::remove_file(&habana_runs);
        let b = Bundle::new(&w.tmp.path().join(format!("p{i}")), &["sh", "-c", &script]).unwrap();
        // A spec saying NVIDIA_VISIBLE_DEVICES=void means it for images that ask for every GPU
        // (nvidia/cuda images carry NVIDIA_VISIBLE_DEVICES=all): the spec's value wins, and no
        // GPU beyond the spec's appears.
        if want.get("env:NVIDIA_VISIBLE_DEVICES").map(String::as_str) == Some("void") {
            b.set_env("NVIDIA_VISIBLE_DEVICES", "all").unwrap();
        }
        let joined = devices.join(",");
        b.edit(move |c| {
            c["annotations"] = json!({"cdi.k8s.io/producer": joined});
            Ok(())
        })
        .unwrap();
        let out = w.shim().run(&b, &unique_id("producer")).unwrap();
        if !out.success() || !out.stdout.contains("PRODUCER_DONE") {
            problems.push(format!(
                "{}: nvshim-runtime did not run it: {out}\n--- nvshim.log ---\n{}",
                p.file,
                w.shim_log()
            ));
            continue;
        }
        let hook_runs = |v: &mut View| {
            if let Ok(t) = fs::read_to_string(&habana_runs) {
                v.insert(
                    "hook:habana-container-hook".into(),
                    t.lines().count().to_string(),
                );
            }
            let _ = fs::remove_file(&habana_runs);
        };
        // Of the cgroup rules, those for the spec's nodes (the engines add their defaults).
        let of_spec = |mut v: View| {
            v.retain(|k, _| !k.starts_with("cgroup:") || want.contains_key(k));
            v
        };
        let mut shim_view = of_spec(parse_view(&out.stdout));
        hook_runs(&mut shim_view);
        if std::env::var_os("NVSHIM_E2E_VERBOSE").is_some() {
            eprintln!("{}: {shim_view:#?}", p.file);
        }
        if shim_view != want {
            problems.push(format!(
                "{}: nvshim-runtime's container differs from the spec\nwant: {want:#?}\ngot: {shim_view:#?}",
                p.file
            ));
        }

        // The same devices through podman, which reads the spec with its own CDI library.
        let Some(pm) = podman_reading(&version, &podman_dir, &image, &mut podman) else {
            eprintln!(
                "{}: no podman here reads CDI {version}; compared with the spec only",
                p.file
            );
            continue;
        };
        let _guard = pm.put_spec(p.file, &text).unwrap();
        let args = ["sh", "-c", script.as_str()];
        let names: Vec<&str> = devices.iter().map(String::as_str).collect();
        let out = pm.run(&image, &names, &args).unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() || !stdout.contains("PRODUCER_DONE") {
            problems.push(format!(
                "{}: podman did not run it: {}\n{stdout}",
                p.file,
                String::from_utf8_lossy(&out.stderr)
            ));
            continue;
        }
        let mut pm_view = of_spec(parse_view(&stdout));
        hook_runs(&mut pm_view);
        if pm_view != shim_view {
            problems.push(format!(
                "{}: podman and nvshim-runtime disagree\npodman: {pm_view:#?}\nnvshim: {shim_view:#?}",
                p.file
            ));
        }
        compared.push(p.file);
    }
    eprintln!("compared with podman: {compared:?}");
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}

/// A podman that reads CDI `version` (imported image `image`, made once): the newer podman of
/// `$NVSHIM_PODMAN` when there is one (scripts/test.sh points it at Debian 13's podman 5), else
/// Debian 12's system podman 4.3 for the versions it knows.
fn podman_reading<'a>(
    version: &str,
    dir: &Path,
    image: &str,
    cached: &'a mut Option<Podman>,
) -> Option<&'a Podman> {
    if cached.is_none() {
        let p = match Podman::newer(dir).unwrap() {
            Some(p) => p,
            None => Podman::new(dir).unwrap(),
        };
        p.import_busybox(image).unwrap();
        *cached = Some(p);
    }
    cached.as_ref().filter(|p| p.reads_cdi(version))
}
