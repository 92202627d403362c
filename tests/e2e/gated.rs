//! Feature-gated devices: `NVIDIA_GDS`, `NVIDIA_MOFED`, `NVIDIA_GDRCOPY` and `NVIDIA_NVSWITCH`
//! set to `enabled` beside a GPU request, on a simulated HGX node
//! (`nvshim_testsupport::gated`), through nvshim-runtime over runc, and the specs of
//! `nvshim cdi generate --mode gds|mofed|gdrcopy|nvswitch` through its CDI path.
//!
//! What NVIDIA's runtime gives for each, the tables these tests hold nvshim to
//! (nvidia-container-toolkit):
//! - the nodes: `internal/discover/gds.go` (`/dev/nvidia-fs*`, and only with such nodes
//!   `/etc/cufile.json` and `/run/udev`, read-only), `mofed.go` (`/dev/infiniband/uverbs*`,
//!   `/dev/infiniband/rdma_cm`), `gdrcopy.go` (`/dev/gdrdrv`), `nvswitch.go`
//!   (`/dev/nvidia-nvswitchctl`, `/dev/nvidia-nvswitch*`); a pattern that matches nothing is
//!   only logged (`internal/discover/mounts.go`);
//! - when: the exact value `enabled` (`internal/modifier/cdi.go`, `gatedDevices`), and only
//!   beside a device request, `none` included (`internal/modifier/gated.go`: any visible
//!   device; `internal/config/image/devices.go`: `none` lists one empty id, `void` none);
//! - the specs: `pkg/nvcdi/gated.go` and `pkg/nvcdi/lib_test.go` (kind `nvidia.com/<mode>`,
//!   one device `all`, global `NVIDIA_VISIBLE_DEVICES=void`).

use std::fs;
use std::os::unix::fs::PermissionsExt;

use base64::Engine;
use nvshim_testsupport::gated::VARIABLES;
use nvshim_testsupport::kubelet::allocate_response;
use nvshim_testsupport::probe::assert_no_problems;
use nvshim_testsupport::{Bundle, FakeHostSpec, GatedDevices, ProbeReport, ProbeSpec};
use serde_json::{json, Value};

use super::world::{assert_rejected, SpecDirs, World};

fn hgx() -> World {
    let mut spec = FakeHostSpec::with_gpus(2);
    spec.gated = Some(GatedDevices::hgx());
    World::builder().spec(spec).spec_dirs(SpecDirs::Run).build()
}

fn gated(w: &World) -> &GatedDevices {
    w.host.spec().gated.as_ref().unwrap()
}

/// The probe, also `mknod`ing the first node of each feature: allowed gives [`ALLOWED`],
/// denied `EPERM`.
fn probe_args(w: &World) -> Vec<String> {
    let mut spec = ProbeSpec::for_host(&w.host);
    if let Some(g) = &w.host.spec().gated {
        for v in VARIABLES {
            let n = &g.nodes_for(v)[0];
            spec.mknod.push((n.major, n.minor));
        }
    }
    spec.args()
}

fn bundle(w: &World, name: &str, env: &[(&str, &str)]) -> Bundle {
    let args = probe_args(w);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    w.bundle(name, &args, env)
}

/// What opening a node the devices cgroup allows gives without its driver: `ENXIO` for a
/// major nobody registered, `ENODEV` from the misc driver (`rdma_cm`, major 10) for a minor
/// nobody registered. A denied node gives `EPERM`.
const ALLOWED: [&str; 2] = ["ENXIO", "ENODEV"];

/// Problems unless the container has exactly the nodes of `enabled` among the feature-gated
/// ones, each with its numbers and openable ([`ALLOWED`], never `EPERM`), a node of every other
/// feature denied, and GDS's files exactly with `NVIDIA_GDS`.
fn gated_problems(r: &ProbeReport, g: &GatedDevices, enabled: &[&str]) -> Vec<String> {
    let mut p = Vec::new();
    for v in VARIABLES {
        let on = enabled.contains(&v);
        for n in g.nodes_for(v) {
            let path = format!("/dev/{}", n.path);
            match (r.devices.get(&path), on) {
                (None, true) => p.push(format!("{v}: {path} is missing")),
                (Some(_), false) => p.push(format!("{v} not enabled, but {path} is there")),
                (Some(d), true) => {
                    if (d.kind.as_str(), d.major, d.minor) != ("c", n.major, n.minor) {
                        p.push(format!(
                            "{path} is {} {}:{}, expected c {}:{}",
                            d.kind, d.major, d.minor, n.major, n.minor
                        ));
                    }
                    if !ALLOWED.contains(&d.open.as_str()) {
                        p.push(format!(
                            "opening {path} gave {}, expected {ALLOWED:?}",
                            d.open
                        ));
                    }
                }
                (None, false) => {}
            }
        }
        let first = &g.nodes_for(v)[0];
        let want: &[&str] = if on { &ALLOWED } else { &["EPERM"] };
        match r.mknod.get(&(first.major, first.minor)) {
            Some(got) if want.contains(&got.as_str()) => {}
            got => p.push(format!(
                "{v}: a mknod'ed {}:{} gave {got:?}, expected {want:?}",
                first.major, first.minor
            )),
        }
    }
    let gds = enabled.contains(&"NVIDIA_GDS");
    for file in ["/etc/cufile.json", "/run/udev"] {
        match (r.files.contains(file), r.mount(file), gds) {
            (true, Some(m), true) if m.is_readonly() => {}
            (false, None, false) => {}
            (seen, mount, _) => p.push(format!(
                "{file}: present {seen}, mounted {mount:?}, with NVIDIA_GDS {gds}"
            )),
        }
    }
    p
}

#[test]
fn each_variable_gives_what_nvidias_runtime_gives() {
    let w = hgx();
    let g = gated(&w);
    for v in VARIABLES {
        let name = v.to_ascii_lowercase();
        let b = bundle(
            &w,
            &name,
            &[("NVIDIA_VISIBLE_DEVICES", "0"), (v, "enabled")],
        );
        let r = w.run(&b);
        assert_no_problems(v, &gated_problems(&r, g, &[v]), &r);
        assert_no_problems(v, &r.gpu_problems(&w.host, &[w.gpu(0)]), &r);
    }
    // All four at once, beside `none` (a device request for NVIDIA: its one empty id).
    let b = bundle(
        &w,
        "all-four",
        &[
            ("NVIDIA_VISIBLE_DEVICES", "none"),
            ("NVIDIA_GDS", "enabled"),
            ("NVIDIA_MOFED", "enabled"),
            ("NVIDIA_GDRCOPY", "enabled"),
            ("NVIDIA_NVSWITCH", "enabled"),
        ],
    );
    let r = w.run(&b);
    assert_no_problems("all four", &gated_problems(&r, g, &VARIABLES), &r);
    assert_no_problems("all four", &r.gpu_problems(&w.host, &[]), &r);
}

#[test]
fn other_values_or_no_device_request_bring_nothing() {
    let w = hgx();
    let g = gated(&w);
    let cases: [(&str, &[(&str, &str)]); 3] = [
        ("unset", &[("NVIDIA_VISIBLE_DEVICES", "0")]),
        (
            "other-values",
            &[
                ("NVIDIA_VISIBLE_DEVICES", "0"),
                ("NVIDIA_GDS", "true"),
                ("NVIDIA_MOFED", "Enabled"),
                ("NVIDIA_GDRCOPY", "1"),
                ("NVIDIA_NVSWITCH", "enabled "),
            ],
        ),
        (
            "void",
            &[
                ("NVIDIA_VISIBLE_DEVICES", "void"),
                ("NVIDIA_GDS", "enabled"),
                ("NVIDIA_MOFED", "enabled"),
                ("NVIDIA_GDRCOPY", "enabled"),
                ("NVIDIA_NVSWITCH", "enabled"),
            ],
        ),
    ];
    for (name, env) in cases {
        let r = w.run(&bundle(&w, name, env));
        assert_no_problems(name, &gated_problems(&r, g, &[]), &r);
    }
}

#[test]
fn a_feature_the_host_lacks_is_a_warning_and_the_container_starts() {
    // A plain GPU server: no nvidia-fs, no InfiniBand, no gdrdrv, no NVSwitch.
    let w = World::new();
    let b = bundle(
        &w,
        "lacking",
        &[("NVIDIA_VISIBLE_DEVICES", "0"), ("NVIDIA_GDS", "enabled")],
    );
    let r = w.run(&b);
    assert_no_problems("no GDS", &r.gpu_problems(&w.host, &[w.gpu(0)]), &r);
    assert!(!r.files.contains("/etc/cufile.json"), "{}", r.raw);
    let log = w.shim_log();
    assert!(
        log.contains("NVIDIA_GDS=enabled: the container starts without GPUDirect Storage")
            && log.contains("/dev/nvidia-fs*"),
        "{log}"
    );
    // `nvshim explain` says the same.
    let out = w.nvshim(&["explain", "--bundle", b.dir().to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("NVIDIA_GDS=enabled: the container starts without"),
        "{text}"
    );
}

#[test]
fn explain_shows_each_feature_as_a_cause_with_its_nodes() {
    let w = hgx();
    let b = bundle(
        &w,
        "explained",
        &[
            ("NVIDIA_VISIBLE_DEVICES", "0"),
            ("NVIDIA_GDS", "enabled"),
            ("NVIDIA_GDRCOPY", "enabled"),
        ],
    );
    let out = w.nvshim(&[
        "explain",
        "--format",
        "json",
        "--bundle",
        b.dir().to_str().unwrap(),
    ]);
    let e: Value = serde_json::from_slice(&out.stdout).unwrap();
    let requests = e["requests"].as_array().unwrap();
    for v in ["NVIDIA_GDS", "NVIDIA_GDRCOPY"] {
        assert!(
            requests
                .iter()
                .any(|r| r["key"] == v && r["honoured"] == true),
            "{v} not among the requests: {requests:?}"
        );
    }
    let groups = e["groups"].as_array().unwrap();
    let gds = groups
        .iter()
        .find(|g| g["cause"] == json!({"type": "feature", "variable": "NVIDIA_GDS", "mode": "gds"}))
        .unwrap_or_else(|| panic!("no NVIDIA_GDS group: {groups:?}"));
    let paths: Vec<&str> = gds["deviceNodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|d| d["path"].as_str())
        .collect();
    let want: Vec<String> = gated(&w)
        .nodes_for("NVIDIA_GDS")
        .iter()
        .map(|n| format!("/dev/{}", n.path))
        .collect();
    assert_eq!(paths, want);
    assert_eq!(gds["cgroupRules"].as_array().unwrap().len(), want.len());
    let mounts: Vec<&str> = gds["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["destination"].as_str())
        .collect();
    assert_eq!(mounts, ["/etc/cufile.json", "/run/udev"]);
    assert!(groups
        .iter()
        .any(|g| g["cause"]["variable"] == "NVIDIA_GDRCOPY"));
    assert!(!groups
        .iter()
        .any(|g| g["cause"]["variable"] == "NVIDIA_MOFED"));
}

#[test]
fn generated_specs_give_the_same_through_the_cdi_path() {
    let w = hgx();
    let g = gated(&w);
    for v in VARIABLES {
        let mode = v.trim_start_matches("NVIDIA_").to_ascii_lowercase();
        let path = w.run_cdi.join(format!("{mode}.json"));
        let out = w.nvshim(&["cdi", "generate", "--mode", &mode, "--format", "json"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let spec: Value = serde_json::from_slice(&out.stdout).unwrap();
        // pkg/nvcdi/lib_test.go: kind nvidia.com/<mode>, one device `all`, `void` globally.
        assert_eq!(spec["kind"], format!("nvidia.com/{mode}"));
        let names: Vec<&Value> = spec["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| &d["name"])
            .collect();
        assert_eq!(names, [&json!("all")]);
        assert_eq!(
            spec["containerEdits"]["env"],
            json!(["NVIDIA_VISIBLE_DEVICES=void"])
        );
        fs::write(&path, &out.stdout).unwrap();

        let b = bundle(&w, &format!("cdi-{mode}"), &[]);
        let device = format!("nvidia.com/{mode}=all");
        b.edit(move |c| {
            c["annotations"] = json!({ "cdi.k8s.io/nvshim-e2e": device });
            Ok(())
        })
        .unwrap();
        let r = w.run(&b);
        assert_no_problems(v, &gated_problems(&r, g, &[v]), &r);
        fs::remove_file(&path).unwrap();
    }
    // Without the nodes there is nothing to describe: one clear error.
    let plain = World::new();
    let out = plain.nvshim(&["cdi", "generate", "--mode", "gds"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("no /dev/nvidia-fs* device node for --mode gds"),
        "{stderr}"
    );
}

#[test]
fn split_roots_give_nodes_from_the_dev_root_and_gds_files_from_the_driver_root() {
    // The GPU Operator's layout: NVIDIA's discoverers take the nodes from the dev root and
    // GDS's files from the driver root (`internal/discover/gds.go`).
    let mut spec = FakeHostSpec::with_gpus(1);
    spec.gated = Some(GatedDevices::hgx());
    let w = World::builder().spec(spec).split().build();
    assert!(w.host.root().join("etc/cufile.json").is_file());
    assert!(w.host.dev_root().join("dev/nvidia-fs0").exists());
    assert!(!w.host.dev_root().join("etc/cufile.json").exists());
    let b = bundle(
        &w,
        "split",
        &[("NVIDIA_VISIBLE_DEVICES", "all"), ("NVIDIA_GDS", "enabled")],
    );
    let r = w.run(&b);
    assert_no_problems("split", &gated_problems(&r, gated(&w), &["NVIDIA_GDS"]), &r);
}

/// The kubelet checkpoint's `AllocResp`: base64 of the allocate response.
fn alloc_resp(envs: &[(&str, &str)]) -> String {
    base64::engine::general_purpose::STANDARD.encode(allocate_response(envs))
}

/// `accept-envvar-unprivileged = "allocation-backed"` on a containerd node: a feature variable
/// of an unprivileged pod is served only when the device plugin's allocate response (NVIDIA's
/// `internal/plugin/server.go`: `NVIDIA_GDS=enabled` with `--gds-enabled`), as the kubelet's
/// checkpoint records it, sets it; otherwise the create fails naming the fix. Privileged
/// containers are served as before.
#[test]
fn allocation_backed_feature_variables_need_the_device_plugins_word() {
    let w = hgx();
    let g = gated(&w);
    let gpu = w.gpu(0);
    let checkpoint = w
        .tmp
        .path()
        .join("kubelet/device-plugins/kubelet_internal_checkpoint");
    fs::create_dir_all(checkpoint.parent().unwrap()).unwrap();
    // The kubelet devicemanager/checkpoint shape (as in k8s::allocation_backed_envvar_policy);
    // the device plugin's envvar strategy with --device-id-strategy=index: its env names the
    // GPU by index, the DeviceIDs by UUID.
    let write_checkpoint = |envs: &[(&str, &str)]| {
        let doc = json!({"Data": {"PodDeviceEntries": [{
            "PodUID": "5e7a-uid", "ContainerName": "cuda", "ResourceName": "nvidia.com/gpu",
            "DeviceIDs": {"0": [gpu.uuid]}, "AllocResp": alloc_resp(envs)
        }], "RegisteredDevices": {"nvidia.com/gpu": [gpu.uuid]}}, "Checksum": 1});
        fs::write(&checkpoint, doc.to_string()).unwrap();
        fs::set_permissions(&checkpoint, fs::Permissions::from_mode(0o600)).unwrap();
    };
    w.configure(&format!(
        "accept-envvar-unprivileged = \"allocation-backed\"\nkubelet-device-checkpoint = \"{}\"\n",
        checkpoint.display()
    ));
    let pod = |name: &str, privileged: bool| {
        let b = bundle(
            &w,
            name,
            &[("NVIDIA_VISIBLE_DEVICES", "0"), ("NVIDIA_GDS", "enabled")],
        );
        b.edit(move |c| {
            c["annotations"] = json!({
                "io.kubernetes.cri.sandbox-uid": "5e7a-uid",
                "io.kubernetes.cri.container-name": "cuda",
            });
            if privileged {
                c["process"]["capabilities"]["bounding"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!("CAP_SYS_ADMIN"));
            }
            Ok(())
        })
        .unwrap();
        b
    };
    let rt = w.shim();
    // The device plugin run with --gds-enabled.
    write_checkpoint(&[("NVIDIA_VISIBLE_DEVICES", "0"), ("NVIDIA_GDS", "enabled")]);
    let r = w.run(&pod("backed", false));
    assert_no_problems("backed", &gated_problems(&r, g, &["NVIDIA_GDS"]), &r);
    assert_no_problems("backed", &r.gpu_problems(&w.host, &[gpu]), &r);
    // A pod adding a feature its allocation does not set.
    let b = pod("unbacked-mofed", false);
    b.set_env("NVIDIA_MOFED", "enabled").unwrap();
    assert_rejected(
        &w,
        &rt,
        &b,
        &[
            "NVIDIA_MOFED=\"enabled\" is refused",
            "allocation-backed",
            "--mofed-enabled",
        ],
    );
    // The device plugin without --gds-enabled.
    write_checkpoint(&[("NVIDIA_VISIBLE_DEVICES", "0")]);
    assert_rejected(
        &w,
        &rt,
        &pod("unbacked", false),
        &[
            "NVIDIA_GDS=\"enabled\" is refused",
            "accept-envvar-unprivileged = \"allocation-backed\"",
            "--gds-enabled",
        ],
    );
    let r = w.run(&pod("privileged", true));
    assert_no_problems("privileged", &gated_problems(&r, g, &["NVIDIA_GDS"]), &r);
    // `false`: never from the environment of an unprivileged container (here the GPU itself
    // comes from the device plugin's volume-mounts marker).
    w.configure("accept-envvar-unprivileged = false\naccept-volume-mounts = true\n");
    let b = bundle(
        &w,
        "refused",
        &[
            (
                "NVIDIA_VISIBLE_DEVICES",
                "/var/run/nvidia-container-devices",
            ),
            ("NVIDIA_GDS", "enabled"),
        ],
    );
    let uuid = gpu.uuid.clone();
    b.edit(move |c| {
        c["mounts"].as_array_mut().unwrap().push(json!({
            "destination": format!("/var/run/nvidia-container-devices/{uuid}"),
            "type": "bind", "source": "/dev/null", "options": ["rbind", "rprivate", "rw"]
        }));
        Ok(())
    })
    .unwrap();
    assert_rejected(
        &w,
        &rt,
        &b,
        &[
            "NVIDIA_GDS=\"enabled\" is refused",
            "accept-envvar-unprivileged = false",
        ],
    );
}
