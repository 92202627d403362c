//! End-to-end tests of the operator diagnostics: `nvshim explain` (what `create` would do,
//! from the same plan) and `nvshim doctor` (host checks with exit status 0/1/2), run as the
//! built binaries against the simulated GPU host in healthy and broken states, plus the
//! progress display of `nvshim cdi generate`.
//!
//! The fake host (`FakeHostSpec::with_gpus(2)`) numbers GPUs in bus order against their minors:
//! index 0 is `/dev/nvidia1`, index 1 is `/dev/nvidia0`. Everything runs as root.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use nvshim_fake_nvml::{Gpu as NvmlGpu, Topology, TOPOLOGY_ENV};
use serde_json::{json, Value};

use super::common::{NVSHIM, SHIM};
use super::world::{SpecDirs, World};

/// The fake two-GPU host with both spec dirs, engine configs and an nvshim config, all in the
/// world's temp dir; `PATH` for nvshim is a directory of the world holding nothing, so no
/// engine installed on the machine running the tests is detected.
fn world(extra_toml: &str) -> World {
    let mut w = World::builder()
        .spec_dirs(SpecDirs::EtcAndRun)
        .config(extra_toml)
        .build();
    let path = w.tmp.path().join("empty-path");
    fs::create_dir_all(&path).unwrap();
    w.env.push(("PATH".into(), path));
    w
}

// The engine configs and /dev/char that doctor is pointed at, in the world's temp dir.

fn docker_config(w: &World) -> PathBuf {
    w.tmp.path().join("docker/daemon.json")
}

fn containerd_config(w: &World) -> PathBuf {
    w.tmp.path().join("containerd/config.toml")
}

fn crio_config(w: &World) -> PathBuf {
    w.tmp.path().join("crio/crio.conf")
}

fn dev_char_dir(w: &World) -> PathBuf {
    w.tmp.path().join("dev-char")
}

/// `nvshim doctor` on this world's engine configs and `/dev/char`, with `extra` arguments.
fn run_doctor(w: &World, extra: &[&str]) -> std::process::Output {
    let paths = [
        ("--docker-config", docker_config(w)),
        ("--containerd-config", containerd_config(w)),
        ("--crio-config", crio_config(w)),
        ("--dev-char-path", dev_char_dir(w)),
    ];
    let mut args = vec!["doctor"];
    args.extend_from_slice(extra);
    for (flag, path) in &paths {
        args.push(flag);
        args.push(path.to_str().unwrap());
    }
    w.nvshim(&args)
}

fn doctor(w: &World) -> Doctor {
    let out = run_doctor(w, &["--format", "json"]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let report: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("doctor printed no JSON ({e}):\n{stdout}\n{out:?}"));
    Doctor {
        code: out.status.code(),
        report,
    }
}

/// The text form, for the report's samples.
fn doctor_text(w: &World) -> String {
    String::from_utf8_lossy(&run_doctor(w, &[]).stdout).into_owned()
}

/// Registers nvshim-runtime with every engine, in this world's engine configs.
fn configure_engines(w: &World) {
    let (docker, containerd, crio) = (docker_config(w), containerd_config(w), crio_config(w));
    let backups = w.tmp.path().join("backups");
    // Docker's CDI told where this world's specs are, as an operator with specs outside
    // /etc/cdi and /var/run/cdi does (configure writes it only for a Docker it knows is
    // 25 or later; none is installed here).
    fs::create_dir_all(docker.parent().unwrap()).unwrap();
    fs::write(
        &docker,
        serde_json::to_string(&serde_json::json!({"cdi-spec-dirs": [w.etc_cdi, w.run_cdi]}))
            .unwrap(),
    )
    .unwrap();
    for (engine, config) in [
        ("docker", &docker),
        ("containerd", &containerd),
        ("crio", &crio),
    ] {
        fs::create_dir_all(config.parent().unwrap()).unwrap();
        let out = w.nvshim(&[
            "runtime",
            "configure",
            "--runtime",
            engine,
            "--config",
            config.to_str().unwrap(),
            "--runtime-path",
            SHIM,
            // Not the host's /var/lib/nvshim/backups.
            "--backup-dir",
            backups.to_str().unwrap(),
        ]);
        assert!(
            out.status.success(),
            "configure {engine}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // CRI-O is detected by its config file, which configure leaves alone (drop-in only).
    fs::write(&crio, "").unwrap();
}

fn create_dev_char_links(w: &World) {
    let out = w.nvshim(&[
        "system",
        "create-dev-char-symlinks",
        "--dev-char-path",
        dev_char_dir(w).to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
}

/// Replaces the host's libnvidia-ml with the fake NVML answering with these persistence
/// modes (by bus index), and sets the topology variable for every later nvshim call.
fn install_fake_nvml(w: &mut World, persistence: &[bool]) {
    let gpus = w
        .host
        .gpus_by_bus()
        .into_iter()
        .zip(persistence)
        .map(|(g, on)| NvmlGpu {
            name: g.model.clone(),
            uuid: g.uuid.clone(),
            minor: g.minor,
            bus_id: g.bus_id.clone(),
            persistence_mode: Some(*on),
            ..Default::default()
        })
        .collect();
    let topology = Topology {
        driver_version: w.host.driver_version().to_string(),
        cuda_driver_version: 13000,
        gpus,
        ..Default::default()
    };
    let path = w.install_fake_nvml(&topology);
    w.env.push((TOPOLOGY_ENV.into(), path));
}

/// Everything in order: spec, engines, links, NVML with persistence on.
fn healthy() -> World {
    let mut w = world("");
    install_fake_nvml(&mut w, &[true, true]);
    w.generate();
    configure_engines(&w);
    create_dev_char_links(&w);
    w
}

fn explain(w: &World, args: &[&str]) -> (Option<i32>, Value) {
    let mut all = vec!["explain", "--format", "json"];
    all.extend_from_slice(args);
    let out = w.nvshim(&all);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let v: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "explain printed no JSON ({e}):\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code(), v)
}

fn explain_text(w: &World, args: &[&str]) -> String {
    let mut all = vec!["explain"];
    all.extend_from_slice(args);
    String::from_utf8_lossy(&w.nvshim(&all).stdout).into_owned()
}

struct Doctor {
    code: Option<i32>,
    report: Value,
}

impl Doctor {
    /// The checks named `name` (cdi-spec may appear once per spec).
    fn checks(&self, name: &str) -> Vec<&Value> {
        self.report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["name"] == name)
            .collect()
    }

    #[track_caller]
    fn one(&self, name: &str) -> &Value {
        let found = self.checks(name);
        assert_eq!(
            found.len(),
            1,
            "one {name} check expected in {:#}",
            self.report
        );
        found[0]
    }

    #[track_caller]
    fn status(&self, name: &str) -> String {
        self.one(name)["status"].as_str().unwrap().to_string()
    }

    #[track_caller]
    fn assert(&self, name: &str, status: &str, message_has: &[&str], fix_has: &[&str]) {
        let c = self.one(name);
        assert_eq!(c["status"], status, "{name}: {c:#}\n{:#}", self.report);
        let message = c["message"].as_str().unwrap();
        for m in message_has {
            assert!(message.contains(m), "{name} message lacks {m:?}: {message}");
        }
        let fix = c["fix"].as_str().unwrap_or("");
        for f in fix_has {
            assert!(fix.contains(f), "{name} fix lacks {f:?}: {fix:?}");
        }
    }

    /// Checks other than `except` must not be warnings or errors.
    #[track_caller]
    fn others_fine(&self, except: &[&str]) {
        for c in self.report["checks"].as_array().unwrap() {
            let name = c["name"].as_str().unwrap();
            if except.contains(&name) {
                continue;
            }
            assert!(
                c["status"] == "ok" || c["status"] == "skip",
                "{name} should be ok: {c:#}"
            );
        }
    }
}

// ---- doctor ------------------------------------------------------------------------------------

#[test]
fn doctor_healthy_host_is_all_ok() {
    let w = healthy();
    let d = doctor(&w);
    d.others_fine(&[]);
    assert_eq!(d.code, Some(0), "{:#}", d.report);
    d.assert("driver", "ok", &["580.65.06", "CUDA 13.0"], &[]);
    d.assert(
        "device-nodes",
        "ok",
        &["nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"],
        &[],
    );
    d.assert("dev-char", "ok", &["6 links"], &[]);
    d.assert("persistence", "ok", &["on for 2 GPU(s)"], &[]);
    d.assert(
        "cdi-spec",
        "ok",
        &["nvidia.yaml", "matches the host and driver 580.65.06"],
        &[],
    );
    for engine in ["engine-docker", "engine-containerd", "engine-crio"] {
        d.assert(engine, "ok", &[SHIM], &[]);
    }
    d.assert("low-level-runtime", "ok", &["runc"], &[]);
    d.assert("hook", "ok", &["nvshim-hook"], &[]);
    let text = doctor_text(&w);
    assert!(text.lines().next().unwrap().starts_with("ok "), "{text}");
    assert!(text.contains("0 errors, 0 warnings"), "{text}");
}

#[test]
fn doctor_reports_a_stale_spec_after_a_driver_upgrade() {
    let w = healthy();
    // The spec an upgrade from 575.64.05 leaves behind, beside the current one.
    let stale = w.etc_cdi.join("nvidia-old.json");
    w.host.write_cdi_spec(&stale, "575.64.05").unwrap();
    let d = doctor(&w);
    assert_eq!(d.code, Some(2), "{:#}", d.report);
    let specs = d.checks("cdi-spec");
    let bad: Vec<_> = specs.iter().filter(|c| c["status"] == "error").collect();
    assert_eq!(bad.len(), 1, "{specs:#?}");
    let msg = bad[0]["message"].as_str().unwrap();
    assert!(
        msg.contains(&format!("{} is stale", stale.display())),
        "{msg}"
    );
    assert!(
        msg.contains("libcuda.so.575.64.05 of driver 575.64.05, but driver 580.65.06 is running"),
        "{msg}"
    );
    assert_eq!(
        bad[0]["fix"],
        format!("nvshim cdi generate --output {}", stale.display())
    );
    d.others_fine(&["cdi-spec"]);
}

#[test]
fn doctor_reports_a_spec_whose_device_major_moved() {
    let w = healthy();
    w.host.move_uvm_major(511).unwrap();
    let d = doctor(&w);
    assert_eq!(d.code, Some(2), "{:#}", d.report);
    let spec = w.run_cdi.join("nvidia.yaml");
    d.assert(
        "cdi-spec",
        "error",
        &["/dev/nvidia-uvm is 508:0 in the spec but 511:0 on the host"],
        &[&format!("nvshim cdi refresh --output {}", spec.display())],
    );
    // The links now lead to nodes with other numbers: 511:0 and 511:1 are missing.
    d.assert(
        "dev-char",
        "warning",
        &["511:0"],
        &["create-dev-char-symlinks"],
    );
    d.others_fine(&["cdi-spec", "dev-char"]);
}

#[test]
fn doctor_reports_a_missing_and_an_empty_node_spec_with_the_refresh_command() {
    let w = healthy();
    let spec = w.run_cdi.join("nvidia.yaml");
    let refresh = format!("nvshim cdi refresh --output {}", spec.display());
    fs::remove_file(&spec).unwrap();
    let d = doctor(&w);
    d.assert(
        "cdi-spec",
        "warning",
        &[
            "no CDI spec for nvidia.com devices",
            "unresolvable CDI devices",
        ],
        &[&refresh, "nvshim-cdi-refresh.timer"],
    );
    // What a producer that found no GPU leaves: consumers refuse a spec without devices, so
    // the node has none.
    fs::write(
        &spec,
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\n",
    )
    .unwrap();
    let d = doctor(&w);
    let checks = d.checks("cdi-spec");
    let empty = checks
        .iter()
        .find(|c| c["message"].as_str().unwrap().contains("no devices"))
        .unwrap_or_else(|| panic!("{:#}", d.report));
    assert_eq!(empty["status"], "error");
    assert!(
        empty["fix"].as_str().unwrap().contains(&refresh),
        "{empty:#}"
    );
    assert!(checks.iter().any(|c| c["status"] == "warning"
        && c["message"]
            .as_str()
            .unwrap()
            .contains("no CDI spec for nvidia.com devices")));
}

#[test]
fn doctor_reports_engine_cdi_reading_other_directories() {
    // Docker's own CDI (on: configure set `features.cdi`) told to read /etc/cdi only, while
    // nvshim's node spec is in this world's run-cdi: Docker's `--device nvidia.com/gpu=0` (and
    // `--gpus` from 29.2) would not find it.
    let w = healthy();
    let mut conf: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(docker_config(&w)).unwrap()).unwrap();
    conf["cdi-spec-dirs"] = serde_json::json!(["/etc/cdi"]);
    fs::write(docker_config(&w), conf.to_string()).unwrap();
    let d = doctor(&w);
    d.assert(
        "engine-docker",
        "warning",
        &[
            "docker's own CDI reads specs from /etc/cdi only",
            &w.run_cdi.join("nvidia.yaml").display().to_string(),
            "unresolvable CDI devices",
        ],
        &[&format!(
            "add {} to cdi-spec-dirs in {}",
            w.run_cdi.display(),
            docker_config(&w).display()
        )],
    );
    d.others_fine(&["engine-docker"]);
}

#[test]
fn doctor_reports_a_missing_device_node() {
    let w = healthy();
    w.host.remove_device_node("nvidia0").unwrap();
    let d = doctor(&w);
    assert_eq!(d.code, Some(2), "{:#}", d.report);
    d.assert(
        "device-nodes",
        "error",
        &["dev/nvidia0 is missing (expected c 195:0)"],
        &["nvidia-modprobe -c 0"],
    );
    // The spec names the node too.
    d.assert(
        "cdi-spec",
        "error",
        &["/dev/nvidia0", "does not exist on the host"],
        &[],
    );
    d.others_fine(&["device-nodes", "cdi-spec"]);
}

#[test]
fn doctor_warns_about_missing_dev_char_links() {
    let mut w = world("");
    install_fake_nvml(&mut w, &[true, true]);
    w.generate();
    configure_engines(&w);
    let d = doctor(&w);
    assert_eq!(d.code, Some(1), "only a warning: {:#}", d.report);
    d.assert(
        "dev-char",
        "warning",
        &["6 of 6 links", "195:0 missing", "daemon-reload"],
        &[&format!(
            "nvshim system create-dev-char-symlinks --dev-char-path {}",
            dev_char_dir(&w).display()
        )],
    );
    d.others_fine(&["dev-char"]);
}

#[test]
fn doctor_reports_engines_not_configured() {
    let w = healthy();
    // Docker without the runtime; containerd's runtime pointing at a binary that is gone.
    fs::write(docker_config(&w), r#"{"log-level": "warn"}"#).unwrap();
    let text = fs::read_to_string(containerd_config(&w)).unwrap();
    fs::write(
        containerd_config(&w),
        text.replace(SHIM, "/opt/gone/nvshim-runtime"),
    )
    .unwrap();
    let d = doctor(&w);
    assert_eq!(d.code, Some(2), "{:#}", d.report);
    d.assert(
        "engine-docker",
        "error",
        &["no runtime \"nvidia\"", docker_config(&w).to_str().unwrap()],
        &[&format!(
            "nvshim runtime configure --runtime docker --config {} && systemctl restart docker",
            docker_config(&w).display()
        )],
    );
    d.assert(
        "engine-containerd",
        "error",
        &["/opt/gone/nvshim-runtime, which is not an executable file"],
        &["nvshim runtime configure --runtime containerd"],
    );
    d.others_fine(&["engine-docker", "engine-containerd"]);
}

/// containerd's own default config of each release (tests/fixtures/engine-configs/), configured:
/// the doctor reads the runtime where that containerd does, config version 4 (containerd 2.3)
/// included; a 1.7 config configured with `--no-cdi` keeps CDI off, which the doctor reports
/// while a CDI spec exists.
#[test]
fn doctor_reads_every_containerd_config_version_and_reports_cdi_off() {
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/engine-configs");
    for (name, extra) in [
        ("containerd-1.6.20-default.toml", None),
        ("containerd-1.7.34-default.toml", None),
        ("containerd-2.1.9-default.toml", None),
        ("containerd-2.3.4-default.toml", None),
        ("containerd-1.7.34-default.toml", Some("--no-cdi")),
    ] {
        let w = healthy();
        let containerd = containerd_config(&w);
        let backups = w.tmp.path().join("backups");
        let conf_d = containerd.with_file_name("conf.d");
        // The operator's spec directories are this world's (containerd prints its defaults).
        let dirs = format!(
            "cdi_spec_dirs = ['{}', '{}']",
            w.etc_cdi.display(),
            w.run_cdi.display()
        );
        let text = fs::read_to_string(format!("{fixtures}/{name}"))
            .unwrap()
            .replace("/etc/containerd/conf.d", conf_d.to_str().unwrap())
            .replace("cdi_spec_dirs = [\"/etc/cdi\", \"/var/run/cdi\"]", &dirs)
            .replace("cdi_spec_dirs = ['/etc/cdi', '/var/run/cdi']", &dirs);
        fs::write(&containerd, text).unwrap();
        let mut args = vec![
            "runtime",
            "configure",
            "--runtime",
            "containerd",
            "--config",
            containerd.to_str().unwrap(),
            "--runtime-path",
            SHIM,
            // Not the host's /var/lib/nvshim/backups.
            "--backup-dir",
            backups.to_str().unwrap(),
        ];
        args.extend(extra);
        let out = w.nvshim(&args);
        assert!(out.status.success(), "{name}: {out:?}");
        assert!(
            !String::from_utf8_lossy(&out.stderr).contains("warning"),
            "{name}: {out:?}"
        );
        let d = doctor(&w);
        if extra.is_none() {
            d.assert("engine-containerd", "ok", &[SHIM], &[]);
            d.others_fine(&[]);
            continue;
        }
        assert_eq!(d.code, Some(1), "{name}: {:#}", d.report);
        d.assert(
            "engine-containerd",
            "warning",
            &[
                "CDI is off in containerd (enable_cdi = false in",
                "nvidia.yaml exists",
                "DRA",
            ],
            &["nvshim runtime configure --runtime containerd"],
        );
        d.others_fine(&["engine-containerd"]);
    }
}

#[test]
fn doctor_warns_when_persistence_mode_is_off() {
    let mut w = healthy();
    w.env.retain(|(k, _)| k != TOPOLOGY_ENV);
    install_fake_nvml(&mut w, &[true, false]);
    let d = doctor(&w);
    assert_eq!(d.code, Some(1), "{:#}", d.report);
    let uuid = &w.host.gpu_at_index(1).unwrap().uuid;
    d.assert(
        "persistence",
        "warning",
        &[&format!("off on GPU 1 ({uuid})")],
        &["nvidia-persistenced"],
    );
}

#[test]
fn doctor_without_driver_skips_what_needs_it() {
    let w = healthy();
    w.host.unload_driver().unwrap();
    let d = doctor(&w);
    assert_eq!(d.code, Some(2), "{:#}", d.report);
    d.assert(
        "driver",
        "error",
        &["not loaded", "driver/nvidia/version does not exist"],
        &["modprobe nvidia"],
    );
    for name in [
        "gpus",
        "device-nodes",
        "dev-char",
        "persistence",
        "libraries",
    ] {
        assert_eq!(d.status(name), "skip", "{name}");
    }
}

#[test]
fn doctor_reports_a_broken_config_and_goes_on() {
    let w = healthy();
    fs::write(&w.config, "driver-rot = \"/\"\n").unwrap();
    let d = doctor(&w);
    assert_eq!(d.code, Some(2), "{:#}", d.report);
    d.assert(
        "config",
        "error",
        &[w.config.to_str().unwrap(), "line 1", "driver-rot"],
        &[],
    );
    // With the defaults, the other checks still run (against the real host).
    assert!(d.checks("low-level-runtime").len() == 1);
}

/// `doctor` says which request-policy mode the node is in, for each value; `explain` marks a
/// refused request as refused, with the error create fails with.
#[test]
fn doctor_and_explain_tell_the_request_policy() {
    for (value, says) in [
        ("true", "any container may pick GPUs"),
        ("false", "envvar strategy does not work here"),
        ("\"allocation-backed\"", "kubelet's device checkpoint"),
    ] {
        let w = world(&format!("accept-envvar-unprivileged = {value}\n"));
        let d = doctor(&w);
        d.assert(
            "request-policy",
            "ok",
            &[&format!("accept-envvar-unprivileged = {value}"), says],
            &[],
        );
        if value == "true" {
            continue;
        }
        let b = w.probe_bundle("refused", &[("NVIDIA_VISIBLE_DEVICES", "1")]);
        let (code, e) = explain(&w, &["--bundle", b.dir().to_str().unwrap()]);
        assert_ne!(code, Some(0), "{e:#}");
        let item = list(&e, "/requests")
            .into_iter()
            .find(|r| r["key"] == "NVIDIA_VISIBLE_DEVICES")
            .unwrap_or_else(|| panic!("{e:#}"));
        assert_eq!(item["honoured"], false, "{e:#}");
        assert!(
            item["note"].as_str().unwrap().starts_with("refused"),
            "{e:#}"
        );
        assert!(e["error"].as_str().unwrap().contains("is refused"), "{e:#}");
    }
}

#[test]
fn doctor_reports_no_low_level_runtime() {
    let w = world("low-level-runtimes = [\"/nonexistent/runc\"]\n");
    let d = doctor(&w);
    d.assert(
        "low-level-runtime",
        "error",
        &["/nonexistent/runc"],
        &["install runc", w.config.to_str().unwrap()],
    );
}

// ---- explain -----------------------------------------------------------------------------------

/// The entries of `doc[key...]` (an array), or none.
fn list(doc: &Value, pointer: &str) -> Vec<Value> {
    doc.pointer(pointer)
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

#[test]
fn explain_legacy_request_matches_what_create_does() {
    // A low-level runtime that does nothing: create edits the bundle, then "runs" it.
    let w = world("low-level-runtimes = [\"/bin/true\"]\n");
    let b = w.bundle("legacy", &["true"], &[("NVIDIA_VISIBLE_DEVICES", "1")]);
    let before = b.config_bytes().unwrap();
    let (code, e) = explain(&w, &["--bundle", b.dir().to_str().unwrap()]);
    assert_eq!(code, Some(0), "{e:#}");
    assert_eq!(e["error"], Value::Null);
    assert_eq!(e["route"]["mode"], "legacy");
    assert_eq!(
        e["requests"],
        json!([{"source": "env", "key": "NVIDIA_VISIBLE_DEVICES", "value": "1", "honoured": true}])
    );
    assert_eq!(e["capabilities"], json!(["compute", "utility"]));
    // Index 1 in bus order is minor 0.
    let gpu = w.host.gpu_at_index(1).unwrap();
    assert_eq!(
        e["gpus"],
        json!([{"index": 1, "uuid": gpu.uuid, "minor": 0, "busId": gpu.bus_id, "model": gpu.model}])
    );
    let groups = e["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 2, "{e:#}");
    assert_eq!(groups[0]["cause"]["type"], "gpu");
    assert_eq!(groups[0]["cause"]["gpu"]["uuid"], gpu.uuid.as_str());
    assert_eq!(
        groups[0]["deviceNodes"],
        json!([{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0, "fileMode": 0o666, "uid": 0, "gid": 0}])
    );
    assert_eq!(
        groups[0]["cgroupRules"],
        json!([{"allow": true, "type": "c", "major": 195, "minor": 0, "access": "rwm"}])
    );
    assert_eq!(groups[1]["cause"]["type"], "driver");
    let driver_nodes: Vec<&str> = groups[1]["deviceNodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["path"].as_str().unwrap())
        .collect();
    assert!(driver_nodes.contains(&"/dev/nvidiactl"), "{driver_nodes:?}");
    let libcuda = w.host.container_lib_path("libcuda");
    assert!(
        groups[1]["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["destination"] == libcuda.as_str()),
        "{e:#}"
    );
    // NVIDIA's container fix-ups in one hook, in NVIDIA's order (compute brings CUDA
    // compatibility; no graphics, so no application profile).
    let hooks = groups[1]["hooks"].as_array().unwrap();
    assert_eq!(hooks.len(), 1, "{e:#}");
    let args: Vec<&str> = hooks[0]["hook"]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args[1], "fixups");
    let flags: Vec<&str> = args
        .iter()
        .copied()
        .filter(|a| a.starts_with("--") && !a.starts_with("--host-params"))
        .fold(Vec::new(), |mut v, a| {
            if v.last() != Some(&a) {
                v.push(a);
            }
            v
        });
    assert_eq!(
        flags,
        [
            "--link",
            "--host-driver-version",
            "--folder",
            "--disable-device-node-modification",
            "--bundle",
        ],
        "{e:#}"
    );
    // The bundle, absolute, so the hook need not wait for the OCI state.
    let bundle = args.iter().position(|a| *a == "--bundle").unwrap();
    assert_eq!(args[bundle + 1], b.dir().to_str().unwrap(), "{e:#}");
    assert_eq!(e["changesBundle"], true);
    let diff = e["diff"].as_str().unwrap();
    assert!(
        diff.lines()
            .any(|l| l.starts_with('+') && l.contains("\"path\": \"/dev/nvidia0\"")),
        "{diff}"
    );
    assert_eq!(
        b.config_bytes().unwrap(),
        before,
        "explain wrote config.json"
    );

    let text = explain_text(&w, &["--bundle", b.dir().to_str().unwrap()]);
    for needle in [
        "Mode: legacy",
        "Under nvshim-nri: raw adjustment",
        &format!("GPU 1 ({}", gpu.uuid),
        "device  /dev/nvidia0  c 195:0",
        "cgroup  allow c 195:0 rwm",
        "Result: create would rewrite config.json",
        &format!("+++ {}/config.json (after create)", b.dir().display()),
    ] {
        assert!(text.contains(needle), "text lacks {needle:?}:\n{text}");
    }

    // What create writes is what explain showed: run the shim with a low-level runtime that
    // does nothing, and compare every device node, cgroup rule and mount added.
    assert_eq!(e["lowLevelRuntime"], "/bin/true");
    let out = Command::new(SHIM)
        .args(["create", "--bundle", b.dir().to_str().unwrap(), "c1"])
        .env("NVSHIM_CONFIG", &w.config)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let created = b.config().unwrap();
    let original: Value = serde_json::from_slice(&before).unwrap();
    for (pointer, key) in [
        ("/linux/devices", "deviceNodes"),
        ("/linux/resources/devices", "cgroupRules"),
        ("/mounts", "mounts"),
    ] {
        let added: Vec<Value> = list(&created, pointer)
            .into_iter()
            .filter(|v| !list(&original, pointer).contains(v))
            .collect();
        let explained: Vec<Value> = groups
            .iter()
            .flat_map(|g| g[key].as_array().unwrap().clone())
            .collect();
        assert_eq!(added.len(), explained.len(), "{pointer}");
        for v in &explained {
            assert!(
                added.contains(v),
                "{pointer}: {v} explained but not created"
            );
        }
    }
    // `--format json` carries the whole resulting config.json: exactly what create wrote.
    assert_eq!(
        e["result"], created,
        "explain's result differs from create's config.json"
    );
}

#[test]
fn explain_cdi_request_groups_by_device_and_spec() {
    let w = world("");
    let spec = w.generate();
    let b = w.bundle("cdi", &["true"], &[]);
    b.edit(|c| {
        c["annotations"] = json!({"cdi.k8s.io/gpu": "nvidia.com/gpu=0"});
        Ok(())
    })
    .unwrap();
    let (code, e) = explain(&w, &["--bundle", b.dir().to_str().unwrap()]);
    assert_eq!(code, Some(0), "{e:#}");
    assert_eq!(e["route"]["mode"], "cdi");
    assert_eq!(e["route"]["cdiDevices"], json!(["nvidia.com/gpu=0"]));
    assert_eq!(e["requests"][0]["source"], "annotation");
    assert_eq!(e["requests"][0]["key"], "cdi.k8s.io/gpu");
    let groups = e["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 2, "{e:#}");
    assert_eq!(
        groups[0]["cause"],
        json!({"type": "cdiSpec", "spec": spec, "kind": "nvidia.com/gpu"})
    );
    assert_eq!(
        groups[0]["env"],
        json!([{"entry": "NVIDIA_VISIBLE_DEVICES=void"}])
    );
    assert_eq!(
        groups[1]["cause"],
        json!({"type": "cdiDevice", "device": "nvidia.com/gpu=0", "spec": spec})
    );
    // Index 0 is /dev/nvidia1.
    assert_eq!(groups[1]["deviceNodes"][0]["path"], "/dev/nvidia1");
    assert_eq!(groups[1]["cgroupRules"][0]["minor"], 1);
    // What nvshim-nri would answer instead (nri/src/adjust.rs takes the same choice).
    let nri = e["nri"].as_str().unwrap();
    assert!(
        nri.starts_with("NRI CDI injection on containerd 2.1+ and CRI-O 1.34+"),
        "{nri}"
    );
    let text = explain_text(&w, &["--bundle", b.dir().to_str().unwrap()]);
    assert!(
        text.contains("Under nvshim-nri: NRI CDI injection"),
        "{text}"
    );
}

/// containerd 2.x, CRI-O and podman apply CDI devices themselves; the spec's
/// `NVIDIA_VISIBLE_DEVICES=void` then reaches nvshim next to the annotation, and nothing is done.
#[test]
fn explain_says_when_the_engine_applied_cdi_already() {
    let w = world("");
    w.generate();
    // What the engine writes: the device applied (explain's `result` is the config.json with
    // it), and the spec's NVIDIA_VISIBLE_DEVICES=void in the env.
    let b = w.bundle("applied", &["true"], &[]);
    b.edit(|c| {
        c["annotations"] = json!({"cdi.k8s.io/gpu": "nvidia.com/gpu=0"});
        Ok(())
    })
    .unwrap();
    let (_, before) = explain(&w, &["--bundle", b.dir().to_str().unwrap()]);
    let applied = before["result"].clone();
    assert!(applied.is_object(), "{before:#}");
    b.edit(move |c| {
        *c = applied;
        Ok(())
    })
    .unwrap();
    assert!(b
        .config()
        .unwrap()
        .pointer("/process/env")
        .and_then(|e| e.as_array())
        .is_some_and(|e| e.iter().any(|v| v == "NVIDIA_VISIBLE_DEVICES=void")));
    let (code, e) = explain(&w, &["--bundle", b.dir().to_str().unwrap()]);
    assert_eq!(code, Some(0), "{e:#}");
    // Whether the engine applied the devices is decided from config.json's content (its
    // device nodes are there), not from the variable alone: the devices resolve, and applying
    // them again changes nothing.
    assert_eq!(e["requests"][0]["source"], "annotation");
    assert_eq!(e["requests"][0]["honoured"], false, "{e:#}");
    assert!(
        e["requests"][0]["note"]
            .as_str()
            .is_some_and(|n| n.contains("already applied by the engine")),
        "{e:#}"
    );
    assert_eq!(e["changesBundle"], false, "{e:#}");
}

#[test]
fn explain_shows_the_docker_gpus_hook_removed() {
    let w = world("");
    let b = w.bundle("docker", &["true"], &[("NVIDIA_VISIBLE_DEVICES", "all")]);
    let hook = json!({"path": "/usr/bin/nvidia-container-runtime-hook", "args": ["nvidia-container-runtime-hook", "prestart"]});
    let h = hook.clone();
    b.edit(move |c| {
        c["hooks"] = json!({"prestart": [h]});
        Ok(())
    })
    .unwrap();
    let (code, e) = explain(&w, &["--bundle", b.dir().to_str().unwrap()]);
    assert_eq!(code, Some(0), "{e:#}");
    assert_eq!(e["removedHooks"], json!([hook]));
    let sources: Vec<&str> = e["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["source"].as_str().unwrap())
        .collect();
    assert_eq!(sources, vec!["dockerGpusHook", "env"]);
    assert_eq!(e["gpus"].as_array().unwrap().len(), 2);
    let text = explain_text(&w, &["--bundle", b.dir().to_str().unwrap()]);
    assert!(
        text.contains("removed hook    prestart  /usr/bin/nvidia-container-runtime-hook prestart"),
        "{text}"
    );
}

#[test]
fn explain_reports_the_error_create_would_fail_with() {
    let w = world("");
    let b = w.bundle("unknown", &["true"], &[("NVIDIA_VISIBLE_DEVICES", "7")]);
    let before = b.config_bytes().unwrap();
    let (code, e) = explain(&w, &["--bundle", b.dir().to_str().unwrap()]);
    assert_eq!(code, Some(1), "{e:#}");
    let err = e["error"].as_str().unwrap();
    assert!(
        err.contains("unknown GPU \"7\" in NVIDIA_VISIBLE_DEVICES"),
        "{err}"
    );
    // What was found on the way is still shown.
    assert_eq!(e["requests"][0]["value"], "7");
    assert_eq!(e["route"]["mode"], "legacy");
    assert_eq!(b.config_bytes().unwrap(), before);

    // --spec: a config.json outside a bundle.
    let file = w.tmp.path().join("elsewhere.json");
    fs::write(&file, &before).unwrap();
    let (code, e) = explain(&w, &["--spec", file.to_str().unwrap()]);
    assert_eq!(code, Some(1));
    assert_eq!(e["configJson"], file.to_str().unwrap());
    let text = explain_text(&w, &["--spec", file.to_str().unwrap()]);
    assert!(
        text.contains("Result: create would fail: unknown GPU \"7\""),
        "{text}"
    );
}

#[test]
fn explain_warns_about_a_stale_spec() {
    let w = world("");
    w.generate();
    w.host.move_uvm_major(511).unwrap();
    let b = w.bundle(
        "stale",
        &["true"],
        &[("NVIDIA_VISIBLE_DEVICES", "nvidia.com/gpu=all")],
    );
    let (code, e) = explain(&w, &["--bundle", b.dir().to_str().unwrap()]);
    assert_eq!(code, Some(0), "{e:#}");
    let warnings = e["warnings"].to_string();
    assert!(
        warnings
            .contains("stale CDI spec: /dev/nvidia-uvm is 508:0 in the spec but 511:0 on the host"),
        "{warnings}"
    );
    // A spec whose libraries belong to another driver.
    fs::remove_file(w.run_cdi.join("nvidia.yaml")).unwrap();
    w.host
        .write_cdi_spec(&w.run_cdi.join("nvidia.json"), "575.64.05")
        .unwrap();
    let (_, e) = explain(&w, &["--bundle", b.dir().to_str().unwrap()]);
    let warnings = e["warnings"].to_string();
    assert!(
        warnings
            .contains("libcuda.so.575.64.05 of driver 575.64.05, but driver 580.65.06 is running"),
        "{warnings}"
    );
}

#[test]
fn explain_needs_no_root_and_writes_nothing() {
    let w = world("");
    let b = w.bundle("nobody", &["true"], &[("NVIDIA_VISIBLE_DEVICES", "0")]);
    // Readable by others, writable by root only.
    for p in [w.tmp.path(), b.dir(), w.config.parent().unwrap()] {
        fs::set_permissions(p, fs::Permissions::from_mode(0o755)).unwrap();
    }
    let out = Command::new(NVSHIM)
        .args([
            "explain",
            "--format",
            "json",
            "--bundle",
            b.dir().to_str().unwrap(),
        ])
        .env("NVSHIM_CONFIG", &w.config)
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let e: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(e["error"], Value::Null, "{e:#}");
    assert_eq!(e["changesBundle"], true);
}

// ---- progress ------------------------------------------------------------------------------------

#[test]
fn generate_shows_progress_on_a_terminal_only() {
    let w = world("");
    let out_path = w.run_cdi.join("nvidia.yaml");
    let out = w.nvshim(&["cdi", "generate", "--output", out_path.to_str().unwrap()]);
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains('\r') && !stderr.contains('\x1b'),
        "{stderr:?}"
    );
    assert!(!stderr.contains("GPU 1 of 2"), "{stderr:?}");

    // script(1) gives the command a pseudo-terminal.
    let script = Path::new("/usr/bin/script");
    if !script.exists() {
        eprintln!("skipping the terminal half: no /usr/bin/script");
        return;
    }
    let cmd = format!(
        "{NVSHIM} cdi generate --output {}",
        w.run_cdi.join("tty.yaml").display()
    );
    let out = Command::new(script)
        .args(["-qec", &cmd, "/dev/null"])
        .env("NVSHIM_CONFIG", &w.config)
        .output()
        .unwrap();
    let seen = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{seen}");
    assert!(
        seen.contains("\r\x1b[2Knvshim: GPU 1 of 2: device nodes..."),
        "{seen:?}"
    );
    assert!(seen.contains("nvshim: wrote"), "{seen:?}");
}

// ---- cache-dir -------------------------------------------------------------------------------

/// nvshim's files in the world's cache-dir (src/cache.rs `PREFIXES`: index, parsed specs, GPU
/// facts, MIG minors, NVML answers).
fn nvshim_cache_files(w: &World) -> Vec<String> {
    let prefixes = ["cdi-index-", "cdi-spec-", "gpus-", "mig-minors-", "nvml-"];
    let (_, names) = w.cache_files("");
    names
        .into_iter()
        .filter(|n| prefixes.iter().any(|p| n.starts_with(p)))
        .collect()
}

/// cache-dir holds a bounded number of files whatever the churn (src/cache.rs `MAX_FILES`,
/// 128): 150 creates, each under a config naming another list of spec directories (its own
/// index file), asking for a DRA claim whose spec (over 4 KB: its parsed form is kept) is then
/// deleted, with other claims' specs rewritten and the GPUs asked for by legacy requests on the
/// way. Without the bound they left 286 files. `nvshim doctor` counts them, `--caches` lists
/// them (a file others can write shows as ignored), `--clear-caches` removes them (and nothing
/// else in the directory), and a create afterwards rebuilds what it needs; a cache-dir whose
/// parent others can write is reported as not used.
#[test]
fn cache_dir_stays_bounded_under_churn_and_doctor_lists_and_clears_it() {
    let w = World::new();
    let kind = "k8s.gpu.nvidia.com/claim";
    let claim = |i: usize, v: &str| {
        let mut t = format!(
            "cdiVersion: 0.5.0\nkind: {kind}\ndevices:\n- name: c{i}\n  containerEdits:\n    env: [\"CLAIM={i}-{v}\"]\ncontainerEdits:\n  env:\n"
        );
        for k in 0..120 {
            t += &format!("  - PADDING_{k:03}=to-make-the-spec-over-4-kb\n");
        }
        t
    };
    let claims = w.tmp.path().join("claims");
    fs::create_dir_all(&claims).unwrap();
    let rounds = 150;
    for i in 0..rounds {
        fs::write(claims.join(format!("claim-{i}.yaml")), claim(i, "a")).unwrap();
    }
    // Older than 2 s: trusted, so their parsed forms are kept.
    std::thread::sleep(std::time::Duration::from_millis(2100));
    let rt = w.shim();
    for i in 0..rounds {
        let other = w.tmp.path().join(format!("other-{i}"));
        fs::create_dir_all(&other).unwrap();
        w.configure(&format!(
            "low-level-runtimes = [\"/bin/true\"]\ncdi-spec-dirs = [{:?}, {:?}]\ncdi-env-kinds = [{kind:?}]\n",
            claims.display().to_string(),
            other.display().to_string()
        ));
        let b = w.bundle(
            &format!("b{i}"),
            &["true"],
            &[("NVIDIA_VISIBLE_DEVICES", &format!("{kind}=c{i}"))],
        );
        let out = rt.create(&b, &format!("churn-{i}")).unwrap();
        assert!(out.success(), "round {i}: {out}");
        fs::remove_file(claims.join(format!("claim-{i}.yaml"))).unwrap();
        if i % 10 == 0 {
            let next = claims.join(format!("claim-{}.yaml", i + 1));
            fs::write(&next, claim(i + 1, "b")).unwrap();
            let b = w.bundle(
                &format!("g{i}"),
                &["true"],
                &[("NVIDIA_VISIBLE_DEVICES", "0")],
            );
            let out = rt.create(&b, &format!("churn-gpu-{i}")).unwrap();
            assert!(out.success(), "round {i}, legacy: {out}");
        }
        let kept = nvshim_cache_files(&w);
        assert!(kept.len() <= 128, "round {i}: {} files", kept.len());
    }
    let kept = nvshim_cache_files(&w);
    assert!(
        kept.len() > 100,
        "the churn did not reach the bound: {kept:?}"
    );

    let (cache, _) = w.cache_files("");
    // The file made foreign is the newest parsed form of a claim spec since deleted: doctor
    // rewrites the index and the GPU facts it reads, and at the bound a write removes the
    // oldest file, so either could replace or remove another pick (read_dir order is random).
    let newest = |names: &[String]| -> String {
        names
            .iter()
            .max_by_key(|n| {
                let spec = n.starts_with("cdi-spec-");
                let time = fs::metadata(cache.join(n)).unwrap().modified().unwrap();
                (spec, time)
            })
            .unwrap()
            .clone()
    };
    let foreign_name = newest(&kept);
    let foreign = cache.join(&foreign_name);
    fs::set_permissions(&foreign, fs::Permissions::from_mode(0o666)).unwrap();
    fs::write(cache.join("not-nvshims"), "kept").unwrap();
    let d = doctor(&w);
    d.assert(
        "cache-dir",
        "warning",
        &["files of at most 128", "1 ignored"],
        &["--clear-caches"],
    );
    let kept = nvshim_cache_files(&w);
    let out = run_doctor(&w, &["--caches"]);
    let listed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(listed.lines().count(), kept.len() + 1, "{listed}");
    assert!(
        listed
            .lines()
            .any(|l| l.starts_with(&foreign_name) && l.ends_with("ignored")),
        "{listed}"
    );
    assert!(!listed.contains("not-nvshims"), "{listed}");
    let out = run_doctor(&w, &["--clear-caches"]);
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{out:?}");
    assert!(
        said.contains(&format!("removed {} cache files", kept.len())),
        "{said}"
    );
    assert!(nvshim_cache_files(&w).is_empty());
    assert_eq!(
        fs::read_to_string(cache.join("not-nvshims")).unwrap(),
        "kept"
    );
    fs::write(claims.join("claim-0.yaml"), claim(0, "c")).unwrap();
    let b = w.bundle(
        "after",
        &["true"],
        &[("NVIDIA_VISIBLE_DEVICES", &format!("{kind}=c0"))],
    );
    let out = rt.create(&b, "churn-after").unwrap();
    assert!(out.success(), "{out}");
    assert!(
        !nvshim_cache_files(&w).is_empty(),
        "the index was not written again"
    );
    // A cache-dir whose parent others can write is not used: doctor says so.
    let parent = cache.parent().unwrap();
    fs::set_permissions(parent, fs::Permissions::from_mode(0o777)).unwrap();
    let d = doctor(&w);
    fs::set_permissions(parent, fs::Permissions::from_mode(0o755)).unwrap();
    d.assert(
        "cache-dir",
        "warning",
        &["not used", "mode 777"],
        &["parent"],
    );
}
