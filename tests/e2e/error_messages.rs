//! The wording of the errors `nvshim-runtime create` reports most often: each names the input
//! that caused it and says what to do next, in one line (a large share of the issues users file
//! against NVIDIA's toolkit quote an error that names neither). The real binary runs against the simulated GPU
//! host; the low-level runtime is `/bin/false`, so a create that wrongly succeeded fails
//! without a message and no container is ever made.

use std::fs;
use std::path::Path;
use std::process::Command;

use serde_json::json;

use super::common::{NVSHIM, SHIM};
use super::world::{SpecDirs, World};

/// The fake two-GPU host with both spec dirs named in the config but not made, and
/// `/bin/false` as the low-level runtime unless `extra_toml` names one.
fn world(extra_toml: &str) -> World {
    let runtimes = if extra_toml.contains("low-level-runtimes") {
        ""
    } else {
        "low-level-runtimes = [\"/bin/false\"]\n"
    };
    World::builder()
        .spec_dirs(SpecDirs::EtcAndRun)
        .spec_dirs_missing()
        .config(&format!("{runtimes}{extra_toml}"))
        .build()
}

/// Runs `nvshim-runtime create` on `dir` and returns its one-line error, after checking
/// that it failed, said one line, and left config.json as it was.
#[track_caller]
fn create_error(w: &World, dir: &Path) -> String {
    let config_json = dir.join("config.json");
    let before = fs::read(&config_json).ok();
    let out = Command::new(SHIM)
        .args(["--root"])
        .arg(w.tmp.path().join("state"))
        .args(["create", "--bundle"])
        .arg(dir)
        .arg("nvshim-errors")
        .env("NVSHIM_CONFIG", &w.config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "create should fail: {out:?}");
    assert_eq!(stderr.lines().count(), 1, "one line expected: {stderr:?}");
    assert!(stderr.starts_with("nvshim: "), "{stderr:?}");
    assert!(
        !stderr.trim_end().ends_with('.'),
        "no trailing period: {stderr:?}"
    );
    assert_eq!(fs::read(&config_json).ok(), before, "config.json changed");
    stderr.trim_end().to_string()
}

#[track_caller]
fn assert_has(msg: &str, needles: &[&str]) {
    for n in needles {
        assert!(msg.contains(n), "{n:?} missing from:\n{msg}");
    }
}

#[test]
fn unknown_gpu_lists_the_gpus_there_are() {
    let w = world("");
    let b = w.bundle("bundle", &["true"], &[("NVIDIA_VISIBLE_DEVICES", "7")]);
    let msg = create_error(&w, b.dir());
    let g0 = w.host.gpu_at_index(0).unwrap();
    let g1 = w.host.gpu_at_index(1).unwrap();
    assert_has(
        &msg,
        &[
            "unknown GPU \"7\" in NVIDIA_VISIBLE_DEVICES",
            &format!(
                "this host has GPUs 0 ({}, {}), 1 ({}, {})",
                g0.uuid, g0.bus_id, g1.uuid, g1.bus_id
            ),
            "name one of those by index, UUID or PCI bus id",
        ],
    );
}

#[test]
fn unknown_cdi_device_lists_the_devices_and_the_dirs_searched() {
    let w = world("");
    w.generate();
    let b = w.bundle("bundle", &["true"], &[]);
    b.edit(|c| {
        c["annotations"] = json!({"cdi.k8s.io/gpu": "nvidia.com/gpu=9"});
        Ok(())
    })
    .unwrap();
    let msg = create_error(&w, b.dir());
    let spec = w.run_cdi.join("nvidia.yaml");
    assert_has(
        &msg,
        &[
            &format!(
                "{}: unresolvable CDI devices nvidia.com/gpu=9",
                b.config_path().display()
            ),
            &format!(
                "{} (kind \"nvidia.com/gpu\") has no device \"9\"; it has 0, 1, ",
                spec.display()
            ),
            ", all;",
            &format!(
                "spec dirs searched: {} (missing), {}",
                w.etc_cdi.display(),
                w.run_cdi.display()
            ),
            "`nvshim cdi list` shows them all",
            &format!("`nvshim cdi generate --output {}`", spec.display()),
        ],
    );
}

#[test]
fn missing_cdi_spec_dirs_are_named_with_the_command_that_makes_a_spec() {
    let w = world("");
    let b = w.bundle(
        "bundle",
        &["true"],
        &[("NVIDIA_VISIBLE_DEVICES", "nvidia.com/gpu=0")],
    );
    let msg = create_error(&w, b.dir());
    assert_has(
        &msg,
        &[
            "unresolvable CDI devices nvidia.com/gpu=0",
            "no valid spec defines kind \"nvidia.com/gpu\"",
            &format!(
                "spec dirs searched: {} (missing), {} (missing)",
                w.etc_cdi.display(),
                w.run_cdi.display()
            ),
            &format!(
                "generate one with `nvshim cdi generate --output {}`",
                w.run_cdi.join("nvidia.yaml").display()
            ),
        ],
    );
}

#[test]
fn unmet_requirement_shows_the_host_and_the_way_out() {
    let w = world("");
    let b = w.bundle(
        "bundle",
        &["true"],
        &[
            ("NVIDIA_VISIBLE_DEVICES", "0"),
            ("NVIDIA_REQUIRE_CUDA", "cuda>=99.0"),
        ],
    );
    let msg = create_error(&w, b.dir());
    assert_has(
        &msg,
        &[
            "unsatisfied condition: NVIDIA_REQUIRE_CUDA=\"cuda>=99.0\" (host: driver 580.65.06, CUDA 13.0)",
            "set NVIDIA_DISABLE_REQUIRE=true in the container (disable-require = true in the nvshim config for every container) to skip the check",
        ],
    );
}

/// A shim installed without its hook refuses the GPU container with the path and the config
/// key, instead of letting runc kill it with `fork/exec ...: no such file or directory`.
#[test]
fn missing_hook_binary_is_named_with_its_config_key() {
    let w = world("hook-path = \"/nonexistent/nvshim-hook\"\n");
    let b = w.bundle("bundle", &["true"], &[("NVIDIA_VISIBLE_DEVICES", "0")]);
    let msg = create_error(&w, b.dir());
    assert_has(
        &msg,
        &[
            "the hook binary /nonexistent/nvshim-hook does not exist",
            "set hook-path in the nvshim config",
        ],
    );
}

/// `nvshim` prints an error's causes once, as `nvshim-runtime` does (one printer for both).
#[test]
fn nvshim_says_each_cause_once() {
    let w = world("");
    fs::remove_file(w.host.proc_root().join("driver/nvidia/version")).unwrap();
    let out = Command::new(NVSHIM)
        .args(["cdi", "generate"])
        .env("NVSHIM_CONFIG", &w.config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("does not exist").count(), 1, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn malformed_config_json_is_named() {
    let w = world("");
    let dir = w.tmp.path().join("broken");
    fs::create_dir_all(&dir).unwrap();
    // A GPU request in the broken document: nvshim refuses it itself (a broken document
    // without one is runc's to refuse).
    fs::write(
        dir.join("config.json"),
        "{\"process\": {\"env\": [\"NVIDIA_VISIBLE_DEVICES=0\"]",
    )
    .unwrap();
    let msg = create_error(&w, &dir);
    let path = dir.join("config.json");
    assert_has(
        &msg,
        &[
            &format!("{} is not valid JSON: EOF while parsing", path.display()),
            &format!("check it with `jq . {}`", path.display()),
        ],
    );
}

#[test]
fn invalid_nvshim_config_names_the_file_line_and_key() {
    let w = world("");
    fs::write(&w.config, "log-level = \"debug\"\ndriver-rot = \"/\"\n").unwrap();
    let b = w.bundle("bundle", &["true"], &[("NVIDIA_VISIBLE_DEVICES", "0")]);
    let msg = create_error(&w, b.dir());
    assert_has(
        &msg,
        &[
            &format!(
                "invalid nvshim config {}: line 2: unknown field `driver-rot`",
                w.config.display()
            ),
            "remove the file to run with the defaults",
        ],
    );
}

#[test]
fn no_low_level_runtime_says_what_was_searched() {
    let w = world("low-level-runtimes = [\"/nonexistent/runc\", \"no-such-crun\"]\n");
    let b = w.bundle("bundle", &["true"], &[("NVIDIA_VISIBLE_DEVICES", "0")]);
    let msg = create_error(&w, b.dir());
    assert_has(
        &msg,
        &[
            "no low-level runtime found: none of /nonexistent/runc, no-such-crun is an executable file on PATH or in /usr/local/sbin",
            "install runc or crun, or set low-level-runtimes in the nvshim config",
        ],
    );
}

#[test]
fn driver_not_loaded_says_so() {
    let w = world("");
    w.host.unload_driver().unwrap();
    let b = w.bundle("bundle", &["true"], &[("NVIDIA_VISIBLE_DEVICES", "0")]);
    let msg = create_error(&w, b.dir());
    assert_has(
        &msg,
        &[
            &format!(
                "{} does not exist: the NVIDIA driver is not loaded",
                w.host.proc_root().join("driver/nvidia/version").display()
            ),
            "load it with `modprobe nvidia`",
        ],
    );
}

#[test]
fn json_log_carries_the_same_message() {
    let w = world("");
    let b = w.bundle(
        "bundle",
        &["true"],
        &[("NVIDIA_VISIBLE_DEVICES", "GPU-nope")],
    );
    let log = w.tmp.path().join("runc-log.json");
    let out = Command::new(SHIM)
        .arg("--log")
        .arg(&log)
        .args(["--log-format", "json", "create", "--bundle"])
        .arg(b.dir())
        .arg("nvshim-errors-log")
        .env("NVSHIM_CONFIG", &w.config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = fs::read_to_string(&log).unwrap();
    let entry: serde_json::Value = serde_json::from_str(line.lines().last().unwrap()).unwrap();
    assert_eq!(entry["level"], "error");
    assert_eq!(entry["msg"].as_str().unwrap(), stderr.trim_end());
    assert!(stderr.contains("unknown GPU \"GPU-nope\""), "{stderr}");
}

/// config.json members that differ only in case are one field to runc (Go's decoder matches
/// names ignoring case and merges them), so nvshim, which reads only one of them, refuses them
/// as it refuses exact duplicates: at the top level, in `process`, `linux`, `root` and a mount,
/// with Go's Unicode folds (`ſ` is `s`). Each: one line naming the member's JSON pointer, the
/// same message as runc's JSON log line, config.json byte for byte as it was. Go maps
/// (`annotations`) keep keys that differ in case apart: no such error there.
#[test]
fn members_differing_only_in_case_are_refused_like_duplicates() {
    let w = world("");
    type Edit = fn(&mut serde_json::Value);
    let cases: [(&str, Edit, &str); 6] = [
        (
            "top",
            |c| c["Process"] = json!({"env": ["NVIDIA_VISIBLE_DEVICES=none"]}),
            "\"Process\" at /Process",
        ),
        (
            "env",
            |c| c["process"]["Env"] = json!(["PATH=/bin"]),
            "\"Env\" at /process/Env",
        ),
        (
            "linux",
            |c| c["linux"]["Namespaces"] = json!([]),
            "\"Namespaces\" at /linux/Namespaces",
        ),
        (
            "root",
            |c| c["root"]["PATH"] = json!("/"),
            "\"PATH\" at /root/PATH",
        ),
        (
            "mount",
            |c| c["mounts"][0]["Type"] = json!("tmpfs"),
            "\"Type\" at /mounts/0/Type",
        ),
        (
            "fold",
            |c| c["proce\u{17f}s"] = json!({}),
            "\"proce\u{17f}s\" at /proce\u{17f}s",
        ),
    ];
    for (name, edit, pointer) in cases {
        let b = w.bundle(name, &["true"], &[("NVIDIA_VISIBLE_DEVICES", "0")]);
        b.edit(|c| {
            edit(c);
            Ok(())
        })
        .unwrap();
        let msg = create_error(&w, b.dir());
        assert_has(&msg, &[pointer, "ignoring case", "config.json"]);
        let log = w.tmp.path().join(format!("{name}-log.json"));
        let out = Command::new(SHIM)
            .arg("--log")
            .arg(&log)
            .args(["--log-format", "json", "create", "--bundle"])
            .arg(b.dir())
            .arg(format!("nvshim-case-{name}"))
            .env("NVSHIM_CONFIG", &w.config)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let line = fs::read_to_string(&log).unwrap();
        let entry: serde_json::Value = serde_json::from_str(line.lines().last().unwrap()).unwrap();
        assert_eq!(entry["level"], "error");
        assert_eq!(entry["msg"].as_str().unwrap(), stderr.trim_end());
    }
    // Annotations are a Go map: `a` and `A` are two keys to runc, and pass (the create then
    // fails only at /bin/false, silently).
    let b = w.bundle("annotations", &["true"], &[("NVIDIA_VISIBLE_DEVICES", "0")]);
    b.edit(|c| {
        c["annotations"] = json!({"a": "1", "A": "2"});
        Ok(())
    })
    .unwrap();
    let out = Command::new(SHIM)
        .arg("--root")
        .arg(w.tmp.path().join("state"))
        .args(["create", "--bundle"])
        .arg(b.dir())
        .arg("nvshim-case-annotations")
        .env("NVSHIM_CONFIG", &w.config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("duplicate key"), "{stderr}");
}
