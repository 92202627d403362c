//! End-to-end tests: `nvshim-runtime` in front of real runc, on a simulated two-GPU host, checked
//! from inside a busybox container by the probe script (`nvshim_testsupport::probe`).
//!
//! The `harness_*` tests run the same checks against plain runc on a hand-edited config.json, to
//! prove that the checks detect a GPU when one is there and its absence when not (as youki
//! validates its contest suite against runc). Everything runs as root; each test has its own temp
//! dirs, runc `--root` and container ids, so they run in parallel.
//!
//! The fake host (`FakeHostSpec::with_gpus(2)`) puts minor 0 at bus 0000:3b:00.0 and minor 1 at
//! 0000:1b:00.0, so index 0 (bus order) is `/dev/nvidia1` and index 1 is `/dev/nvidia0`.

use std::fs;
use std::os::unix::fs::symlink;
use std::process::Command;

use nvshim_testsupport::probe::assert_no_problems;
use nvshim_testsupport::{
    unique_id, Bundle, FakeGpu, FakeHost, FakeHostSpec, KernelModules, Layout, ProbeReport, Runtime,
};
use serde_json::{json, Value};

use super::common::NVSHIM;
use super::world::{assert_rejected, World};

/// Plain runc with a fresh state dir under the world's temp dir: the harness tests' reference.
fn runc(w: &World) -> Runtime {
    Runtime::new(
        "runc",
        &w.tmp.path().join(format!("state-{}", unique_id("r"))),
    )
    .unwrap()
}

fn sorted(mut p: Vec<String>) -> Vec<String> {
    p.sort();
    p.dedup();
    p
}

/// Every NVIDIA file mount under /usr or /lib is read-only and cannot be opened for writing.
fn readonly_mount_problems(r: &ProbeReport) -> Vec<String> {
    let mut p = Vec::new();
    for m in r.nvidia_mounts() {
        let d = &m.destination;
        if !(d.starts_with("/usr/") || d.starts_with("/lib/")) {
            continue;
        }
        if !m.is_readonly() {
            p.push(format!(
                "{d} is mounted without ro ({})",
                m.options.join(",")
            ));
        }
        if r.writes.get(d).map(String::as_str) == Some("OK") {
            p.push(format!("{d} could be opened for writing"));
        }
    }
    p
}

/// `ldconfig -p` lists libcuda.so.1 and the path it gives exists in the container.
fn libcuda_cache_problems(r: &ProbeReport) -> Vec<String> {
    let mut p = r.ldcache_problems("libcuda.so.1");
    if let Some(path) = r.ldcache.get("libcuda.so.1") {
        if !r.files.contains(path) && !r.links.contains_key(path) {
            p.push(format!(
                "ldconfig -p maps libcuda.so.1 to {path}, which does not exist"
            ));
        }
    }
    p
}

/// The full check for a compute GPU container seeing exactly `selected`.
fn gpu_container_problems(r: &ProbeReport, host: &FakeHost, selected: &[&FakeGpu]) -> Vec<String> {
    let mut p = r.gpu_problems(host, selected);
    p.extend(r.control_device_problems(host));
    p.extend(r.library_mounted_problems(host, "libcuda"));
    p.extend(r.library_mounted_problems(host, "libnvidia-ml"));
    p.extend(readonly_mount_problems(r));
    p.extend(libcuda_cache_problems(r));
    sorted(p)
}

#[track_caller]
fn assert_gpu_container(w: &World, r: &ProbeReport, selected: &[&FakeGpu], what: &str) {
    let p = gpu_container_problems(r, &w.host, selected);
    if !p.is_empty() {
        eprintln!("--- nvshim.log ---\n{}", w.shim_log());
    }
    assert_no_problems(what, &p, r);
}

// ---------------------------------------------------------------------------------------------
// The harness proved against plain runc.
// ---------------------------------------------------------------------------------------------

/// Hand-edits `bundle` the way a correct shim would for `gpus`: device nodes, cgroup rules,
/// nvidiactl and nvidia-uvm, read-only (or not) mounts of libcuda, libnvidia-ml and nvidia-smi,
/// the SONAME link and an ld.so.cache in the rootfs.
fn hand_edit_gpu_bundle(w: &World, bundle: &Bundle, gpus: &[&FakeGpu], readonly: bool) {
    let uvm = w.host.spec().uvm_major;
    for g in gpus {
        let path = format!("/dev/nvidia{}", g.minor);
        bundle.add_char_device(&path, 195, g.minor).unwrap();
        bundle.allow_char_device(195, g.minor, "rwm").unwrap();
    }
    for (path, major, minor) in [("/dev/nvidiactl", 195, 255), ("/dev/nvidia-uvm", uvm, 0)] {
        bundle.add_char_device(path, major, minor).unwrap();
        bundle.allow_char_device(major, minor, "rwm").unwrap();
    }
    for stem in ["libcuda", "libnvidia-ml"] {
        let path = w.host.container_lib_path(stem);
        bundle
            .add_bind_mount(&w.host.host_path(&path), &path, readonly)
            .unwrap();
    }
    bundle
        .add_bind_mount(
            &w.host.host_path("/usr/bin/nvidia-smi"),
            "/usr/bin/nvidia-smi",
            true,
        )
        .unwrap();
    let rootfs = bundle.rootfs().path();
    let libdir = rootfs.join("usr/lib/x86_64-linux-gnu");
    fs::create_dir_all(&libdir).unwrap();
    symlink("libcuda.so.580.65.06", libdir.join("libcuda.so.1")).unwrap();
    // The cache a correct shim's hook writes: the container's own path of libcuda.so.1.
    use nvshim_hook::ldcache::{serialize, CacheEntry, FLAG_ELF_LIBC6, FLAG_X8664_LIB64};
    let entry = CacheEntry {
        flags: FLAG_ELF_LIBC6 | FLAG_X8664_LIB64,
        name: "libcuda.so.1".into(),
        path: "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
        os_version: 0,
        hwcap: 0,
        hwcaps: None,
        isa_level: 0,
    };
    fs::write(
        rootfs.join("etc/ld.so.cache"),
        serialize(&[entry], &Default::default(), "hand-edited"),
    )
    .unwrap();
}

#[test]
fn harness_detects_gpu_on_hand_edited_runc_bundle() {
    let w = World::new();
    let bundle = w.probe_bundle("bundle", &[]);
    let gpu = w.gpu(1);
    hand_edit_gpu_bundle(&w, &bundle, &[gpu], true);
    let r = w.probe(&runc(&w), &bundle, false);

    assert_gpu_container(&w, &r, &[gpu], "plain runc, hand-edited for index 1");
    assert_no_problems("nvidia-smi", &r.smi_problems(&[gpu]), &r);
    // The raw facts the checks rest on, spelled out once.
    assert_eq!(r.mknod[&(195, gpu.minor)], "ENXIO", "{}", r.raw);
    let other = w.gpu(0);
    assert_eq!(r.mknod[&(195, other.minor)], "EPERM", "{}", r.raw);
    assert!(r.no_nvidia_problems(&w.host).len() > 3, "{}", r.raw);
}

#[test]
fn harness_detects_absence_on_plain_runc_bundle() {
    let w = World::new();
    let bundle = w.probe_bundle("bundle", &[]);
    let r = w.probe(&runc(&w), &bundle, false);

    assert_no_problems("plain runc", &r.no_nvidia_problems(&w.host), &r);
    let gpu = w.gpu(1);
    let p = gpu_container_problems(&r, &w.host, &[gpu]);
    for expected in [
        "GPU nodes: expected",
        "devices.list does not allow c 195:0",
        "gave EPERM, expected ENXIO",
        "/dev/nvidiactl is missing",
        "/dev/nvidia-uvm is missing",
        "libcuda.so.580.65.06 is missing",
        "libcuda.so.580.65.06 is not a mount point",
        "ldconfig -p does not list libcuda.so.1",
    ] {
        assert!(
            p.iter().any(|m| m.contains(expected)),
            "the checks missed {expected:?}; they reported {p:#?}"
        );
    }
    assert!(!r.smi_problems(&[gpu]).is_empty());
}

#[test]
fn harness_detects_extra_gpu_and_writable_mount() {
    let w = World::new();
    let bundle = w.probe_bundle("bundle", &[]);
    // Both GPUs and read-write library mounts: wrong for a request of index 1.
    hand_edit_gpu_bundle(&w, &bundle, &[w.gpu(0), w.gpu(1)], false);
    let r = w.probe(&runc(&w), &bundle, false);

    let p = gpu_container_problems(&r, &w.host, &[w.gpu(1)]);
    for expected in [
        "GPU nodes: expected",
        "devices.list allows the unselected GPU c 195:1",
        "unselected GPU 195:1 gave ENXIO, expected EPERM",
        "libcuda.so.580.65.06 is mounted without ro",
        "libcuda.so.580.65.06 could be opened for writing",
    ] {
        assert!(
            p.iter().any(|m| m.contains(expected)),
            "the checks missed {expected:?}; they reported {p:#?}"
        );
    }
    // nvidia-smi numbers both, in bus order.
    assert_no_problems("nvidia-smi", &r.smi_problems(&[w.gpu(0), w.gpu(1)]), &r);
    assert!(!r.smi_problems(&[w.gpu(1)]).is_empty());
}

// ---------------------------------------------------------------------------------------------
// nvshim-runtime over runc.
// ---------------------------------------------------------------------------------------------

#[test]
fn index_selects_by_bus_order_with_run() {
    let w = World::new();
    let bundle = w.gpu_bundle("bundle", "1");
    let r = w.probe(&w.shim(), &bundle, false);
    let gpu = w.gpu(1);
    assert_eq!(gpu.minor, 0, "index 1 is minor 0 on the fake host");
    assert_gpu_container(&w, &r, &[gpu], "NVIDIA_VISIBLE_DEVICES=1 (run)");
    assert_eq!(r.mknod[&(195, 1)], "EPERM", "{}", r.raw);
}

#[test]
fn index_selects_by_bus_order_with_create_start() {
    let w = World::new();
    let bundle = w.gpu_bundle("bundle", "1");
    let r = w.probe(&w.shim(), &bundle, true);
    assert_gpu_container(
        &w,
        &r,
        &[w.gpu(1)],
        "NVIDIA_VISIBLE_DEVICES=1 (create+start)",
    );
}

#[test]
fn pre_550_frontend_major_name_is_understood() {
    let mut spec = FakeHostSpec::with_gpus(2);
    spec.frontend_name = "nvidia-frontend".to_string();
    let w = World::builder().spec(spec).build();
    let bundle = w.gpu_bundle("bundle", "1");
    let r = w.probe(&w.shim(), &bundle, false);
    assert_gpu_container(&w, &r, &[w.gpu(1)], "195 nvidia-frontend in /proc/devices");
}

/// A CUDA image on either kernel-module flavour (each writes its own version banner): the
/// container gets libcuda.so.1 through its ld.so.cache, and `NVIDIA_REQUIRE_CUDA` in the shape
/// the nvidia/cuda 12.x images set it (`cuda>=X` or brand/driver ranges) is met by the 580
/// driver's CUDA 13.0 without loading NVML.
#[test]
fn cuda_image_starts_on_open_and_proprietary_kernel_modules() {
    let require =
        "cuda>=12.8 brand=unknown,driver>=470,driver<471 brand=grid,driver>=470,driver<471 \
                   brand=tesla,driver>=470,driver<471 brand=nvidia,driver>=535,driver<536 \
                   brand=tesla,driver>=550,driver<551";
    for modules in [KernelModules::Open, KernelModules::Proprietary] {
        let mut spec = FakeHostSpec::with_gpus(2);
        spec.kernel_modules = modules;
        let w = World::builder().spec(spec).build();
        let bundle = w.gpu_bundle("bundle", "1");
        bundle.set_env("NVIDIA_REQUIRE_CUDA", require).unwrap();
        let r = w.probe(&w.shim(), &bundle, false);
        assert_gpu_container(&w, &r, &[w.gpu(1)], &format!("{modules:?} kernel modules"));
    }
}

#[test]
fn all_selects_every_gpu() {
    let w = World::new();
    let bundle = w.gpu_bundle("bundle", "all");
    let r = w.probe(&w.shim(), &bundle, false);
    assert_gpu_container(&w, &r, &[w.gpu(0), w.gpu(1)], "NVIDIA_VISIBLE_DEVICES=all");
}

#[test]
fn none_gives_control_nodes_and_libraries_but_no_gpu() {
    let w = World::new();
    let bundle = w.gpu_bundle("bundle", "none");
    let r = w.probe(&w.shim(), &bundle, false);
    assert_gpu_container(&w, &r, &[], "NVIDIA_VISIBLE_DEVICES=none");
}

#[test]
fn void_empty_and_unset_are_not_gpu_containers() {
    let w = World::new();
    for (name, visible) in [("void", Some("void")), ("empty", Some("")), ("unset", None)] {
        let bundle = w.probe_bundle(name, &[]);
        if let Some(v) = visible {
            bundle.set_env("NVIDIA_VISIBLE_DEVICES", v).unwrap();
        }
        let r = w.probe(&w.shim(), &bundle, false);
        assert_no_problems(
            &format!("NVIDIA_VISIBLE_DEVICES {name}"),
            &r.no_nvidia_problems(&w.host),
            &r,
        );
    }
}

#[test]
fn uuid_selects_that_gpu() {
    let w = World::new();
    let gpu = w.gpu(0);
    let bundle = w.gpu_bundle("bundle", &gpu.uuid);
    let r = w.probe(&w.shim(), &bundle, false);
    assert_gpu_container(&w, &r, &[gpu], "NVIDIA_VISIBLE_DEVICES=<uuid of index 0>");
}

#[test]
fn bus_id_selects_that_gpu_with_and_without_domain() {
    let w = World::new();
    let gpu = w.gpu(1);
    let short = gpu.bus_id.trim_start_matches("0000:").to_string();
    let short_domain = format!("0:{short}");
    for (name, visible) in [
        ("full", gpu.bus_id.as_str()),
        ("short", short.as_str()),
        ("zero", short_domain.as_str()),
    ] {
        let bundle = w.gpu_bundle(name, visible);
        let r = w.probe(&w.shim(), &bundle, false);
        assert_gpu_container(&w, &r, &[gpu], &format!("NVIDIA_VISIBLE_DEVICES={visible}"));
    }
}

#[test]
fn utility_capability_brings_nvml_and_smi_but_not_cuda() {
    let w = World::new();
    let bundle = w.gpu_bundle("bundle", "1");
    bundle
        .set_env("NVIDIA_DRIVER_CAPABILITIES", "utility")
        .unwrap();
    let r = w.probe(&w.shim(), &bundle, false);
    let gpu = w.gpu(1);
    let mut p = r.gpu_problems(&w.host, &[gpu]);
    p.extend(r.control_device_problems(&w.host));
    p.extend(r.library_mounted_problems(&w.host, "libnvidia-ml"));
    p.extend(r.library_absent_problems("libcuda"));
    p.extend(readonly_mount_problems(&r));
    if !r.files.contains("/usr/bin/nvidia-smi") {
        p.push("/usr/bin/nvidia-smi is missing".into());
    }
    p.extend(r.smi_problems(&[gpu]));
    if !p.is_empty() {
        eprintln!("--- nvshim.log ---\n{}", w.shim_log());
    }
    assert_no_problems("NVIDIA_DRIVER_CAPABILITIES=utility", &sorted(p), &r);
}

/// Removing a binary from the driver root, adding one, and putting a library's development
/// link beside it each show in the next container (a stale answer would have runc mount a file
/// that is gone, or leave out one that came).
#[test]
fn the_driver_files_follow_the_driver_root() {
    let w = World::new();
    let mounted = |name: &str, dest: &str| {
        let r = w.probe(&w.shim(), &w.gpu_bundle(name, "0"), false);
        let mut p = r.gpu_problems(&w.host, &[w.gpu(0)]);
        p.extend(r.library_mounted_problems(&w.host, "libnvidia-ml"));
        assert_no_problems(name, &p, &r);
        (r.files.contains(dest), r)
    };
    let smi = "/usr/bin/nvidia-smi";
    assert!(mounted("first", smi).0);

    let host_smi = w.host.host_path(smi);
    let bytes = fs::read(&host_smi).unwrap();
    fs::remove_file(&host_smi).unwrap();
    assert!(!mounted("smi removed", smi).0);
    fs::write(&host_smi, &bytes).unwrap();
    fs::set_permissions(
        &host_smi,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    assert!(mounted("smi back", smi).0);

    // libnvidia-ml.so beside the library: the hook makes the same link in the container.
    let lib = w.host.container_lib_path("libnvidia-ml");
    let (dir, _) = lib.rsplit_once('/').unwrap();
    let dev = format!("{dir}/libnvidia-ml.so");
    symlink("libnvidia-ml.so.1", w.host.host_path(&dev)).unwrap();
    let (_, r) = mounted("development link", smi);
    assert!(
        r.links.contains_key(&dev),
        "{dev} not linked in the container:\n{}",
        r.raw
    );
}

#[test]
fn unknown_uuid_is_rejected_before_runc() {
    let w = World::new();
    let uuid = "GPU-00000000-1111-2222-3333-444444444444";
    let bundle = w.gpu_bundle("bundle", uuid);
    assert_rejected(&w, &w.shim(), &bundle, &[uuid]);
}

#[test]
fn unknown_uuid_is_logged_as_json_error() {
    let w = World::new();
    let uuid = "GPU-00000000-1111-2222-3333-444444444444";
    let bundle = w.gpu_bundle("bundle", uuid);
    let log = w.tmp.path().join("runtime-log.json");
    let rt = w.shim().json_log(&log);
    assert_rejected(&w, &rt, &bundle, &[uuid]);
    let text =
        fs::read_to_string(&log).unwrap_or_else(|e| panic!("no --log file {}: {e}", log.display()));
    let errors: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["level"] == "error")
        .collect();
    assert!(
        errors
            .iter()
            .any(|e| e["msg"].as_str().is_some_and(|m| m.contains(uuid)) && e["time"].is_string()),
        "no {{\"level\":\"error\",\"msg\":\"...{uuid}...\",\"time\":...}} line in {}:\n{text}",
        log.display()
    );
}

#[test]
fn unknown_index_is_rejected_before_runc() {
    let w = World::new();
    let bundle = w.gpu_bundle("bundle", "7");
    assert_rejected(&w, &w.shim(), &bundle, &["7"]);
}

/// A broken config.json that may ask for a GPU is refused by nvshim, naming the file; one that
/// asks for none is runc's to refuse (it does), untouched either way.
#[test]
fn malformed_config_json_is_rejected_before_runc() {
    let w = World::new();
    let bundle = w.probe_bundle("bundle", &[]);
    // A GPU marker: without one, an unreadable config.json is runc's to judge.
    bundle
        .write_config_bytes(
            b"{\"ociVersion\": \"1.0.2\", \"process\": {\"env\": [\"NVIDIA_VISIBLE_DEVICES=0\"",
        )
        .unwrap();
    assert_rejected(&w, &w.shim(), &bundle, &["config.json"]);

    let plain = w.probe_bundle("plain", &[]);
    let broken = b"{\"ociVersion\": \"1.0.2\", \"process\": {";
    plain.write_config_bytes(broken).unwrap();
    let out = w
        .shim()
        .create(&plain, &unique_id("nvshim-e2e-plain"))
        .unwrap();
    assert!(!out.success(), "runc accepted a broken config.json\n{out}");
    assert!(
        w.shim_log().contains("passed on untouched"),
        "nvshim did not pass it to runc:\n{}",
        w.shim_log()
    );
    assert_eq!(plain.config_bytes().unwrap(), broken);
}

#[test]
fn unmet_requirement_is_rejected_before_runc() {
    let w = World::new();
    let bundle = w.gpu_bundle("bundle", "1");
    bundle
        .set_env("NVIDIA_REQUIRE_DRIVER", "driver>=999.0")
        .unwrap();
    assert_rejected(&w, &w.shim(), &bundle, &[]);
}

/// `disable-require = true` (NVIDIA's config key): the requirement is not checked and the GPU
/// container starts, as on NVIDIA's default mode.
#[test]
fn disable_require_in_the_config_skips_requirements() {
    let w = World::builder().config("disable-require = true\n").build();
    let bundle = w.gpu_bundle("bundle", "1");
    bundle.set_env("NVIDIA_REQUIRE_CUDA", "cuda>=99.0").unwrap();
    let r = w.probe(&w.shim(), &bundle, false);
    assert_gpu_container(&w, &r, &[w.gpu(1)], "disable-require = true");
}

#[test]
fn missing_low_level_runtime_is_rejected() {
    let w = World::builder()
        .config("low-level-runtimes = [\"/nonexistent/runc\"]\n")
        .build();
    let bundle = w.gpu_bundle("bundle", "1");
    assert_rejected(&w, &w.shim(), &bundle, &["/nonexistent/runc"]);
}

#[test]
fn non_gpu_bundles_are_byte_identical_after_create() {
    let w = World::new();
    for (name, visible) in [("unset", None), ("empty", Some("")), ("void", Some("void"))] {
        let bundle = w.probe_bundle(name, &[]);
        if let Some(v) = visible {
            bundle.set_env("NVIDIA_VISIBLE_DEVICES", v).unwrap();
        }
        let before = bundle.config_bytes().unwrap();
        let rt = w.shim();
        let id = unique_id("nvshim-e2e-plain");
        let out = rt.create(&bundle, &id).unwrap();
        assert!(
            out.success(),
            "create failed ({name})\n{out}\n{}",
            w.shim_log()
        );
        assert_eq!(
            String::from_utf8_lossy(&bundle.config_bytes().unwrap()),
            String::from_utf8_lossy(&before),
            "config.json changed for NVIDIA_VISIBLE_DEVICES {name}"
        );
        let del = rt.delete(&id, true).unwrap();
        assert!(del.success(), "{del}");
    }
}

fn count(config: &Value, pointer: &str) -> usize {
    config
        .pointer(pointer)
        .and_then(Value::as_array)
        .map_or(0, Vec::len)
}

#[test]
fn second_create_on_an_edited_bundle_adds_nothing() {
    let w = World::new();
    let bundle = w.gpu_bundle("bundle", "1");
    let rt = w.shim();

    let first = unique_id("nvshim-e2e-twice");
    let out = rt.create(&bundle, &first).unwrap();
    assert!(out.success(), "{out}\n{}", w.shim_log());
    rt.force_delete(&first);
    let after_first = bundle.config().unwrap();

    let second = unique_id("nvshim-e2e-twice");
    let out = rt.create(&bundle, &second).unwrap();
    assert!(out.success(), "{out}\n{}", w.shim_log());
    rt.force_delete(&second);
    let after_second = bundle.config().unwrap();

    let summary = |c: &Value| {
        format!(
            "devices {}, cgroup rules {}, mounts {}, createContainer hooks {}, prestart hooks {}, env {}",
            count(c, "/linux/devices"),
            count(c, "/linux/resources/devices"),
            count(c, "/mounts"),
            count(c, "/hooks/createContainer"),
            count(c, "/hooks/prestart"),
            count(c, "/process/env"),
        )
    };
    assert!(
        after_first == after_second,
        "the second create changed config.json\nafter 1st: {}\nafter 2nd: {}\n--- 2nd ---\n{}",
        summary(&after_first),
        summary(&after_second),
        serde_json::to_string_pretty(&after_second).unwrap()
    );
    // And the twice-edited bundle still runs correctly.
    let r = w.probe(&rt, &bundle, false);
    assert_gpu_container(&w, &r, &[w.gpu(1)], "bundle edited twice");
}

#[test]
fn unknown_fields_and_annotations_survive_create() {
    let w = World::new();
    let bundle = w.gpu_bundle("bundle", "1");
    let extras = [
        (
            "/x-nvshim-top",
            json!({"keep": [1, 2, 3], "nested": {"a": null}}),
        ),
        ("/process/x-nvshim-process", json!("kept")),
        ("/linux/x-nvshim-linux", json!({"n": 7})),
        ("/annotations", json!({"org.example/keep": "yes"})),
    ];
    bundle
        .edit(|c| {
            c["x-nvshim-top"] = extras[0].1.clone();
            c["process"]["x-nvshim-process"] = extras[1].1.clone();
            c["linux"]["x-nvshim-linux"] = extras[2].1.clone();
            c["annotations"] = extras[3].1.clone();
            Ok(())
        })
        .unwrap();
    let rt = w.shim();
    let id = unique_id("nvshim-e2e-fields");
    let out = rt.create(&bundle, &id).unwrap();
    assert!(out.success(), "{out}\n{}", w.shim_log());
    let after = bundle.config().unwrap();
    for (pointer, value) in &extras {
        assert_eq!(
            after.pointer(pointer),
            Some(value),
            "{pointer} did not survive create"
        );
    }
    assert!(
        count(&after, "/linux/devices") > 0,
        "the bundle was not edited at all: {}",
        serde_json::to_string_pretty(&after).unwrap()
    );
    rt.force_delete(&id);
}

/// `docker run --gpus device=<uuid>` through `--runtime=nvidia`: dockerd appends
/// `NVIDIA_VISIBLE_DEVICES` and `NVIDIA_DRIVER_CAPABILITIES` to the env and a prestart hook
/// `nvidia-container-runtime-hook prestart` (moby daemon/nvidia_linux.go). nvshim serves the
/// request itself and drops that hook, so the container looks exactly as with the env alone
/// (the hook path does not exist here: had it stayed, runc would fail to start the container).
#[test]
fn docker_gpus_hook_spec_gives_the_same_view_as_the_env_alone() {
    let w = World::new();
    let gpu = w.gpu(1);
    let caps = "compute,utility";

    let plain = w.gpu_bundle("plain", &gpu.uuid);
    plain.set_env("NVIDIA_DRIVER_CAPABILITIES", caps).unwrap();
    let expected = w.probe(&w.shim(), &plain, false);

    let docker = w.probe_bundle("docker", &[]);
    docker
        .edit(|c| {
            let env = c["process"]["env"].as_array_mut().unwrap();
            env.push(json!(format!("NVIDIA_VISIBLE_DEVICES={}", gpu.uuid)));
            env.push(json!(format!("NVIDIA_DRIVER_CAPABILITIES={caps}")));
            c["hooks"] = json!({"prestart": [{
                "path": "/usr/bin/nvidia-container-runtime-hook",
                "args": ["nvidia-container-runtime-hook", "prestart"],
                "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
            }]});
            Ok(())
        })
        .unwrap();
    let got = w.probe(&w.shim(), &docker, false);

    assert_gpu_container(&w, &got, &[gpu], "docker --gpus style spec");
    assert_eq!(
        format!("{:?}", got.gpu_nodes()),
        format!("{:?}", expected.gpu_nodes())
    );
    let dests =
        |r: &ProbeReport| sorted(r.nvidia_mounts().iter().map(|m| format!("{m:?}")).collect());
    assert_eq!(dests(&got), dests(&expected));
    let hooks = docker.config().unwrap()["hooks"]["prestart"].clone();
    assert_eq!(hooks, json!([]), "the legacy hook must be gone");
}

// ---------------------------------------------------------------------------------------------
// The whole driver: what a container gets with every capability, on the 580 file set the
// simulated host models (tests/support/src/host.rs says where its file list comes from).
// ---------------------------------------------------------------------------------------------

/// `<dev-root>/dev/dri/by-path/pci-<bus>-<kind>`'s node name (`card1`, `renderD128`).
fn drm_node_of(w: &World, bus_id: &str, kind: &str) -> Option<String> {
    let link = w
        .host
        .dev_root()
        .join("dev/dri/by-path")
        .join(format!("pci-{bus_id}-{kind}"));
    let target = fs::read_link(link).ok()?;
    Some(target.file_name()?.to_string_lossy().into_owned())
}

/// `NVIDIA_DRIVER_CAPABILITIES=all` for one GPU: from inside the container, every driver library
/// of both word sizes is there and in `ldconfig -p`, the graphics stack's manifests, the X.Org
/// modules, the firmware, the daemons' sockets, the GPU's DRM nodes (and not the other GPU's)
/// with their cgroup rules and groups, the hooks' links and the application profile.
#[test]
fn all_capabilities_give_the_whole_driver() {
    let w = World::new();
    let bundle = w.gpu_bundle("bundle", "1");
    bundle.set_env("NVIDIA_DRIVER_CAPABILITIES", "all").unwrap();
    let r = w.probe(&w.shim(), &bundle, false);
    let gpu = w.gpu(1);
    let other = w.gpu(0);
    let v = w.host.driver_version().to_string();
    let mut p = gpu_container_problems(&r, &w.host, &[gpu]);
    let seen = |path: &str| r.files.contains(path) || r.links.contains_key(path);

    // Libraries: every 64-bit one the host's ld.so.cache indexes, and the 32-bit ones.
    let x64 = "/usr/lib/x86_64-linux-gnu";
    let i386 = "/usr/lib/i386-linux-gnu";
    for lib in w.host.libraries() {
        let path = w.host.lib_path(lib);
        if !seen(&path) {
            p.push(format!("{path} missing"));
        }
    }
    let has_ldp = |soname: &str, arch: &str| {
        r.ldconfig_lines
            .iter()
            .any(|l| l.trim_start().starts_with(&format!("{soname} ({arch})")))
    };
    for soname in ["libcuda.so.1", "libGLX_nvidia.so.0", "libnvidia-ml.so.1"] {
        if !has_ldp(soname, "libc6,x86-64") {
            p.push(format!("ldconfig -p lacks the 64-bit {soname}"));
        }
    }
    if fs::metadata(w.host.root().join(&i386[1..])).is_ok() {
        for soname in ["libcuda.so.1", "libGLX_nvidia.so.0"] {
            if !seen(&format!("{i386}/{}", soname)) {
                p.push(format!("{i386}/{soname} missing"));
            }
            if !has_ldp(soname, "libc6") {
                p.push(format!("ldconfig -p lacks the 32-bit {soname}"));
            }
        }
    } else {
        p.push("the simulated host has no 32-bit libraries".into());
    }

    // The graphics stack, X.Org, firmware.
    for path in [
        "/usr/share/glvnd/egl_vendor.d/10_nvidia.json".to_string(),
        "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json".into(),
        "/etc/vulkan/icd.d/nvidia_icd.json".into(),
        "/etc/vulkan/implicit_layer.d/nvidia_layers.json".into(),
        "/etc/OpenCL/vendors/nvidia.icd".into(),
        "/usr/share/nvidia/nvoptix.bin".into(),
        format!("{x64}/nvidia/xorg/nvidia_drv.so"),
        format!("{x64}/nvidia/xorg/libglxserver_nvidia.so.{v}"),
        format!("{x64}/libnvidia-egl-gbm.so.1"),
        format!("/lib/firmware/nvidia/{v}/gsp_ga10x.bin"),
        "/usr/bin/nvidia-smi".into(),
        "/usr/bin/nvidia-xconfig".into(),
    ] {
        if !seen(&path) {
            p.push(format!("{path} missing"));
        }
    }
    // Links the hooks made.
    for (link, target) in [
        (
            format!("{x64}/gbm/nvidia-drm_gbm.so"),
            "../libnvidia-allocator.so.1".to_string(),
        ),
        (
            format!("{x64}/vdpau/libvdpau_nvidia.so.1"),
            format!("libvdpau_nvidia.so.{v}"),
        ),
    ] {
        if r.links.get(&link) != Some(&target) {
            p.push(format!("{link} -> {:?}, want {target}", r.links.get(&link)));
        }
    }
    // Sockets, writable.
    for sock in ["/run/nvidia-persistenced/socket"] {
        if !r.sockets.contains(sock) {
            p.push(format!("socket {sock} missing"));
        } else if r.mount(sock).is_some_and(|m| m.is_readonly()) {
            p.push(format!("socket {sock} is read-only"));
        }
    }
    // DRM: this GPU's card and render nodes, allowed, with their groups; not the other GPU's.
    let mut groups_wanted = Vec::new();
    for kind in ["card", "render"] {
        let Some(node) = drm_node_of(&w, &gpu.bus_id, kind) else {
            p.push(format!(
                "the simulated host has no {kind} node for {}",
                gpu.bus_id
            ));
            continue;
        };
        let path = format!("/dev/dri/{node}");
        match r.dri.get(&path) {
            None => p.push(format!("{path} missing")),
            Some((major, minor, gid)) => {
                if !r.cgroup_allows('c', *major, *minor, "rwm") {
                    p.push(format!(
                        "{path} ({major}:{minor}) not allowed by the cgroup"
                    ));
                }
                groups_wanted.push(*gid);
            }
        }
        let link = format!("/dev/dri/by-path/pci-{}-{kind}", gpu.bus_id);
        if r.links.get(&link) != Some(&format!("../{node}")) {
            p.push(format!("{link} -> {:?}", r.links.get(&link)));
        }
        if let Some(other_node) = drm_node_of(&w, &other.bus_id, kind) {
            if r.dri.contains_key(&format!("/dev/dri/{other_node}")) {
                p.push(format!("the other GPU's {other_node} is in the container"));
            }
        }
    }
    for g in groups_wanted {
        if g != 0 && !r.groups.contains(&g) {
            p.push(format!(
                "group {g} of a DRM node not among the process's groups {:?}",
                r.groups
            ));
        }
    }
    // No cgroup rule twice.
    if let Some(rules) = &r.cgroup {
        let mut seen_rules = std::collections::BTreeSet::new();
        for rule in rules.iter().filter(|r| r.kind == 'c') {
            if !seen_rules.insert((rule.major, rule.minor, rule.access.clone())) {
                p.push(format!("cgroup rule {rule:?} twice"));
            }
        }
    }
    // The application profile limits EGL to this GPU (bit <minor>).
    let profile = "/etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf";
    if !seen(profile) {
        p.push(format!("{profile} missing"));
    }
    assert_no_problems("NVIDIA_DRIVER_CAPABILITIES=all", &sorted(p), &r);
}

/// `create` through the shim of a bundle `name` whose process is `true`, with `env`; asserts it
/// succeeded, deletes the container and returns the edited config.json.
fn created_config(w: &World, name: &str, env: &[(&str, &str)]) -> Value {
    let bundle = w.bundle(name, &["true"], env);
    let rt = w.shim();
    let id = unique_id("nvshim-e2e");
    let out = rt.create(&bundle, &id).unwrap();
    assert!(
        out.success(),
        "create ({name}) failed\n{out}\n{}",
        w.shim_log()
    );
    rt.force_delete(&id);
    bundle.config().unwrap()
}

/// A node's own libraries in its ld.so.cache (a real node's, `FakeHost::add_system_libraries`)
/// are not the driver's: legacy create of `all` writes the same mounts into config.json with
/// them as without, none of them a library of the node's (`libcudart.so.13` looks like
/// libcuda).
#[test]
fn system_libraries_in_the_cache_are_not_mounted() {
    let w = World::new();
    let env = [
        ("NVIDIA_VISIBLE_DEVICES", "0"),
        ("NVIDIA_DRIVER_CAPABILITIES", "all"),
    ];
    let mounts = |name: &str| created_config(&w, name, &env)["mounts"].clone();
    let driver_only = mounts("driver-only");
    let libcuda = w.host.container_lib_path("libcuda");
    assert!(
        driver_only
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["destination"] == *libcuda),
        "{libcuda} not mounted: {driver_only}"
    );
    assert!(w.host.add_system_libraries().unwrap() > 400);
    let with_system = mounts("with-system");
    let system = nvshim_testsupport::host::system_library_names().unwrap();
    let mounted_system: Vec<&str> = with_system
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["destination"].as_str())
        .filter(|d| system.iter().any(|s| d.rsplit('/').next() == Some(*s)))
        .collect();
    assert!(
        mounted_system.is_empty(),
        "the node's own libraries are mounted: {mounted_system:?}"
    );
    assert!(
        with_system == driver_only,
        "the mounts changed with the node's libraries in the cache\nwithout: {}\nwith: {}",
        serde_json::to_string_pretty(&driver_only).unwrap(),
        serde_json::to_string_pretty(&with_system).unwrap()
    );
}

/// The optional hooks never stop a container: `/etc/nvidia` read-only (NVIDIA 1.20.0 broke
/// device plugins there) and no driver `/proc` in the container; the container starts, and the
/// libraries still resolve.
#[test]
fn optional_hooks_that_cannot_apply_let_the_container_start() {
    let w = World::new();
    let bundle = w.gpu_bundle("bundle", "1");
    bundle
        .set_env("NVIDIA_DRIVER_CAPABILITIES", "graphics,compute,utility")
        .unwrap();
    let ro = w.tmp.path().join("etc-nvidia");
    fs::create_dir_all(&ro).unwrap();
    bundle.add_bind_mount(&ro, "/etc/nvidia", true).unwrap();
    let r = w.probe(&w.shim(), &bundle, false);
    assert_gpu_container(&w, &r, &[w.gpu(1)], "read-only /etc/nvidia");
}

/// A RHEL-style host (`/usr/lib64`, 32-bit in `/usr/lib`, X.Org modules under
/// `xorg/modules`): the same container view in that layout's paths.
#[test]
fn rhel_layout_gives_the_same_driver_in_its_own_paths() {
    let mut spec = FakeHostSpec::with_gpus(2);
    spec.layout = Layout::Rhel;
    let w = World::builder().spec(spec).build();
    let bundle = w.gpu_bundle("bundle", "1");
    bundle.set_env("NVIDIA_DRIVER_CAPABILITIES", "all").unwrap();
    let r = w.probe(&w.shim(), &bundle, false);
    let mut p = r.gpu_problems(&w.host, &[w.gpu(1)]);
    p.extend(r.library_mounted_problems(&w.host, "libcuda"));
    let seen = |path: &str| r.files.contains(path) || r.links.contains_key(path);
    let v = w.host.driver_version().to_string();
    let (xorg_driver, xorg_glx) = w.host.xorg_module_paths();
    for path in [
        format!("/usr/lib64/libcuda.so.{v}"),
        format!("/usr/lib64/vdpau/libvdpau_nvidia.so.{v}"),
        format!("/usr/lib/libcuda.so.{v}"),
        xorg_driver,
        xorg_glx,
    ] {
        if !seen(&path) {
            p.push(format!("{path} missing"));
        }
    }
    for (soname, arch, dir) in [
        ("libcuda.so.1", "libc6,x86-64", "/usr/lib64"),
        ("libcuda.so.1", "libc6", "/usr/lib"),
    ] {
        let want = format!("{soname} ({arch}) => {dir}/{soname}");
        if !r.ldconfig_lines.iter().any(|l| l.trim() == want) {
            p.push(format!("ldconfig -p lacks {want:?}"));
        }
    }
    assert_no_problems("RHEL layout", &sorted(p), &r);
}

/// A driver directory, as NVIDIA's CUDA images and the lent GPU machines keep it
/// (`/usr/local/nvidia/{lib64,lib,bin}`, listed in ld.so.conf.d): with driver-root `/` the
/// libraries come through the host's ld.so.cache and nvidia-smi from the `bin/` beside them;
/// with the directory itself as driver root (GKE's `/home/kubernetes/bin/nvidia`), which has
/// no ld.so.cache, the same files are found by scanning its `lib64/` and `lib/`. In both,
/// nvidia-smi is at `/usr/bin` and runs, and the container's ld cache resolves libcuda.
#[test]
fn driver_directory_layouts_give_the_driver_with_or_without_an_ld_cache() {
    let mut spec = FakeHostSpec::with_gpus(2);
    spec.layout = Layout::UsrLocalNvidia;
    for gke in [false, true] {
        let w = World::builder().spec(spec.clone()).build();
        let v = w.host.driver_version().to_string();
        let driver_dir = w.host.root().join("usr/local/nvidia");
        assert!(!driver_dir.join("etc/ld.so.cache").exists());
        let (case, lib64, lib32) = if gke {
            w.configure(&format!("driver-root = \"{}\"\n", driver_dir.display()));
            ("driver-root = the driver directory", "/lib64", "/lib")
        } else {
            (
                "driver-root /",
                "/usr/local/nvidia/lib64",
                "/usr/local/nvidia/lib",
            )
        };
        let bundle = w.gpu_bundle("bundle", "1");
        bundle
            .set_env("NVIDIA_DRIVER_CAPABILITIES", "compute,utility,compat32")
            .unwrap();
        let r = w.probe(&w.shim(), &bundle, false);
        let mut p = r.gpu_problems(&w.host, &[w.gpu(1)]);
        for path in [
            format!("{lib64}/libcuda.so.{v}"),
            format!("{lib64}/libnvidia-ml.so.{v}"),
            format!("{lib32}/libcuda.so.{v}"),
            "/usr/bin/nvidia-smi".to_string(),
        ] {
            if !r.files.contains(&path) {
                p.push(format!("{path} missing"));
            }
        }
        for (arch, dir) in [("libc6,x86-64", lib64), ("libc6", lib32)] {
            let want = format!("libcuda.so.1 ({arch}) => {dir}/libcuda.so.1");
            if !r.ldconfig_lines.iter().any(|l| l.trim() == want) {
                p.push(format!("ldconfig -p lacks {want:?}"));
            }
        }
        if r.smi_rc != Some(0) {
            p.push(format!("nvidia-smi exited {:?}: {:?}", r.smi_rc, r.smi));
        }
        // doctor finds the same libraries and says how.
        let doctor = Command::new(NVSHIM)
            .args(["doctor", "--format", "json"])
            .env("NVSHIM_CONFIG", &w.config)
            .output()
            .unwrap();
        let report: Value = serde_json::from_slice(&doctor.stdout).unwrap();
        let libraries = report["checks"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["name"] == "libraries"))
            .cloned()
            .unwrap_or_default();
        let how = if gke { "a scan of" } else { "/etc/ld.so.cache" };
        let message = libraries["message"].as_str().unwrap_or_default();
        if libraries["status"] != "ok"
            || !message.contains(&format!("{lib64}/libcuda.so.{v}"))
            || !message.contains(how)
        {
            p.push(format!("doctor's libraries check: {libraries}"));
        }
        assert_no_problems(case, &sorted(p), &r);
    }
}

/// A GPU bundle with a repeated key at any depth is refused, one line naming the key's JSON
/// pointer, config.json untouched (runc merges what a rewrite would drop; docs/reliability.md,
/// "Request parsing classes": duplicate JSON keys).
#[test]
fn duplicate_keys_in_a_gpu_bundle_are_refused_untouched() {
    let w = World::new();
    for (i, (from, to, pointer)) in [
        ("{", "{\"linux\":{\"namespaces\":[]},", "/linux"),
        (
            "\"linux\":{",
            "\"linux\":{\"maskedPaths\":[],",
            "/linux/maskedPaths",
        ),
        ("{", "{\"process\":{},", "/process"),
        ("\"env\":[", "\"env\":[],\"env\":[", "/process/env"),
    ]
    .into_iter()
    .enumerate()
    {
        let bundle = w.gpu_bundle(&format!("dup{i}"), "1");
        let v: Value = serde_json::from_slice(&bundle.config_bytes().unwrap()).unwrap();
        let text = serde_json::to_string(&v).unwrap().replacen(from, to, 1);
        bundle.write_config_bytes(text.as_bytes()).unwrap();
        assert_rejected(&w, &w.shim(), &bundle, &["duplicate key", pointer]);
    }
}

/// A bundle without any GPU marker that nvshim cannot read (but runc runs) is passed on
/// untouched, also with a CUDA base image's variables; the same oddity next to any request
/// variable is refused (docs/reliability.md, "Request parsing classes": unreadable
/// config.json of a non-GPU container).
#[test]
fn unreadable_non_gpu_bundles_pass_to_runc_untouched() {
    let w = World::new();
    let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
    let variants: Vec<(&str, String, String)> = vec![
        (
            "latin1",
            "\"env\":[".into(),
            "\"env\":[\"LANG_X=caf\u{e9}\",".into(),
        ),
        (
            "surrogate",
            "\"env\":[".into(),
            "\"env\":[\"X=\\ud800\",".into(),
        ),
        ("deep", "{".into(), format!("{{\"org.example.ext\":{deep},")),
        ("dup", "{".into(), "{\"hostname\":\"a\",".into()),
    ];
    // A CUDA base image's own variables (nvidia/cuda's Dockerfiles set these) ask for nothing;
    // each request variable alone marks a possible GPU request.
    let cuda_image: &[(&str, &str)] = &[
        (
            "NVIDIA_REQUIRE_CUDA",
            "cuda>=12.4 brand=tesla,driver>=470,driver<471",
        ),
        ("NVIDIA_PRODUCT_NAME", "CUDA"),
        ("NVIDIA_DRIVER_CAPABILITIES", "compute,utility"),
        ("NVIDIA_CUDA_END_OF_LIFE", "1"),
    ];
    let kinds: &[(&str, Option<(&str, &str)>)] = &[
        ("plain", None),
        ("cuda-image", None),
        ("visible", Some(("NVIDIA_VISIBLE_DEVICES", "1"))),
        ("imex", Some(("NVIDIA_IMEX_CHANNELS", "7"))),
        ("mig-config", Some(("NVIDIA_MIG_CONFIG_DEVICES", "all"))),
        ("mig-monitor", Some(("NVIDIA_MIG_MONITOR_DEVICES", "all"))),
    ];
    for (name, from, to) in &variants {
        for (kind, marker) in kinds {
            let gpu = marker.is_some();
            let mut env: Vec<(&str, &str)> = Vec::new();
            if *kind != "plain" {
                env.extend_from_slice(cuda_image);
            }
            env.extend(*marker);
            let bundle = w.probe_bundle(&format!("{name}-{kind}"), &env);
            let mut v: Value = serde_json::from_slice(&bundle.config_bytes().unwrap()).unwrap();
            // The harness's probe script greps for NVIDIA_ variables: a marker of its own.
            v["process"]["args"] = serde_json::json!(["/bin/sh", "-c", "true"]);
            let mut text = serde_json::to_string(&v)
                .unwrap()
                .replacen(from, to, 1)
                .into_bytes();
            if *name == "latin1" {
                // One Latin-1 byte, not UTF-8.
                let at = text
                    .windows(4)
                    .position(|w| w == &"caf\u{e9}".as_bytes()[..4])
                    .unwrap();
                text.splice(at + 3..at + 5, [0xe9u8]);
            }
            if *name == "dup" && !text.windows(10).any(|w| w == b"\"hostname\"") {
                continue;
            }
            bundle.write_config_bytes(&text).unwrap();
            if gpu {
                assert_rejected(&w, &w.shim(), &bundle, &["config.json"]);
                continue;
            }
            let rt = w.shim();
            let id = unique_id("nvshim-e2e-odd");
            let out = rt.create(&bundle, &id).unwrap();
            assert!(
                out.success(),
                "{name} {kind}: create failed\n{out}\n{}\n{}",
                w.shim_log(),
                String::from_utf8_lossy(&text)
            );
            assert_eq!(
                bundle.config_bytes().unwrap(),
                text,
                "{name}: config.json changed"
            );
            let del = rt.delete(&id, true).unwrap();
            assert!(del.success(), "{del}");
        }
    }
}

/// The GPUs' `/proc` information is kept in `cache-dir` once its files are 2 s old
/// (src/host/gpu_cache.rs: a real driver takes 0.2 ms per GPU to write one), and read again
/// when a file is written again: after the two GPUs' `Device Minor`s are swapped, a legacy
/// create of GPU 0 names the other node. (A real driver writes these files only when it
/// creates them; the swap stands for a reload that numbered the GPUs the other way.)
#[test]
fn gpu_information_is_cached_and_read_again_when_it_changes() {
    let w = World::new();
    let gpus: Vec<(String, u32)> = w
        .host
        .gpus_by_bus()
        .iter()
        .map(|g| (g.bus_id.clone(), g.minor))
        .collect();
    assert_eq!(gpus.len(), 2);
    // What the create decides from: older than the cache's 2 s rule.
    std::thread::sleep(std::time::Duration::from_millis(2100));
    let node_of_gpu0 = |name: &str| {
        let config = created_config(&w, name, &[("NVIDIA_VISIBLE_DEVICES", "0")]);
        let nodes: Vec<String> = config["linux"]["devices"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|d| d["path"].as_str())
            .filter(|p| p.trim_start_matches("/dev/nvidia").parse::<u32>().is_ok())
            .map(str::to_string)
            .collect();
        nodes
    };
    assert_eq!(node_of_gpu0("first"), [format!("/dev/nvidia{}", gpus[0].1)]);
    let (cache, cached) = w.cache_files("gpus-");
    assert_eq!(cached.len(), 1, "no GPU cache in {}", cache.display());
    assert_eq!(
        node_of_gpu0("cached"),
        [format!("/dev/nvidia{}", gpus[0].1)]
    );
    // Swap the minors: each file written again.
    let info = |bus: &str| {
        w.host
            .proc_root()
            .join("driver/nvidia/gpus")
            .join(bus)
            .join("information")
    };
    let texts: Vec<String> = gpus
        .iter()
        .map(|(bus, _)| std::fs::read_to_string(info(bus)).unwrap())
        .collect();
    for (i, (bus, minor)) in gpus.iter().enumerate() {
        let other = gpus[1 - i].1;
        let swapped: String = texts[i]
            .lines()
            .map(|l| match l.strip_prefix("Device Minor:") {
                Some(m) if m.trim() == minor.to_string() => format!("Device Minor:    {other}\n"),
                _ => format!("{l}\n"),
            })
            .collect();
        assert_ne!(
            swapped,
            texts[i],
            "no Device Minor line in {}",
            info(bus).display()
        );
        std::fs::write(info(bus), swapped).unwrap();
    }
    assert_eq!(node_of_gpu0("after"), [format!("/dev/nvidia{}", gpus[1].1)]);
}

/// `nvshim-runtime features` is the low-level runtime's own answer with nvshim's two changes
/// (src/features.rs): its version and the runtime's path added to `annotations`, the CDI
/// annotation prefix added to `potentiallyUnsafeConfigAnnotations`; every other field as the
/// runtime printed it. For Debian 12's runc (1.1.5, whose `features` has no unsafe list), and
/// sid's runc 1.3.6 and crun 1.28 where scripts/install-engines.sh put them. An answer that is
/// not JSON (a runtime's error) passes through byte for byte with its exit status, and nvshim
/// logs a warning.
#[test]
fn features_is_the_low_level_runtime_s_answer_with_nvshim_s_changes() {
    let engines = std::path::Path::new("/var/cache/nvshim-engines/sid/bin");
    let mut runtimes = vec![String::from("/usr/sbin/runc")];
    for name in ["runc", "crun"] {
        if engines.join(name).is_file() {
            runtimes.push(engines.join(name).display().to_string());
        }
    }
    let w = World::new();
    for rt in &runtimes {
        w.configure(&format!("low-level-runtimes = [{rt:?}]\n"));
        let own = Command::new(rt).arg("features").output().unwrap();
        assert!(own.status.success(), "{rt} features: {own:?}");
        let own: Value = serde_json::from_slice(&own.stdout).unwrap();
        let out = Command::new(super::common::SHIM)
            .arg("features")
            .env("NVSHIM_CONFIG", &w.config)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "nvshim-runtime features over {rt}: {out:?}"
        );
        let ours: Value = serde_json::from_slice(&out.stdout).unwrap();
        let (own, ours) = (own.as_object().unwrap(), ours.as_object().unwrap());
        let changed = ["annotations", "potentiallyUnsafeConfigAnnotations"];
        // Identical: the versions, hooks, mount options and everything under `linux`
        // (namespaces, capabilities, cgroup, seccomp, mount extensions such as idmap).
        for (k, v) in own.iter().filter(|(k, _)| !changed.contains(&k.as_str())) {
            assert_eq!(ours.get(k), Some(v), "{rt}: field {k}");
        }
        assert_eq!(
            ours.keys()
                .filter(|k| !changed.contains(&k.as_str()))
                .count(),
            own.keys()
                .filter(|k| !changed.contains(&k.as_str()))
                .count(),
            "{rt}: nvshim added a field"
        );
        let mut want_annotations = own["annotations"].as_object().unwrap().clone();
        want_annotations.insert(
            "nvshim.runtime.version".into(),
            json!(env!("CARGO_PKG_VERSION")),
        );
        want_annotations.insert("nvshim.runtime.low-level".into(), json!(rt));
        assert_eq!(ours["annotations"], Value::Object(want_annotations), "{rt}");
        let mut want_unsafe = own
            .get("potentiallyUnsafeConfigAnnotations")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        want_unsafe.push(json!("cdi.k8s.io/"));
        assert_eq!(
            ours["potentiallyUnsafeConfigAnnotations"],
            Value::Array(want_unsafe),
            "{rt}"
        );
    }

    // A runtime whose answer is not JSON: passed through unchanged, exit status included.
    let fake = w.tmp.path().join("old-runtime");
    fs::write(
        &fake,
        "#!/bin/sh\necho 'No help topic for features'\nexit 3\n",
    )
    .unwrap();
    fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    w.configure(&format!(
        "low-level-runtimes = [{:?}]\n",
        fake.display().to_string()
    ));
    let out = Command::new(super::common::SHIM)
        .arg("features")
        .env("NVSHIM_CONFIG", &w.config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert_eq!(out.stdout, b"No help topic for features\n");
    let log = w.shim_log();
    assert!(
        log.contains("features: the low-level runtime's answer is not a JSON object"),
        "{log}"
    );
}
