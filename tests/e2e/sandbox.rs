//! The sandbox profile (`profile = "sandbox"`, `nvshim cdi generate --profile sandbox`): no
//! hook, no daemon socket, no `/proc` overmount, and the image's own loader still finds
//! `libcuda.so.1`, in a glibc image and in a musl one.
//!
//! gVisor's `runsc` and Kata cannot be installed here (no package in Debian 12, and Kata needs
//! a hypervisor), so the containers run on real runc: what is checked is what nvshim hands the
//! runtime (config.json, the spec) and that a container given exactly that works without the
//! hook. The profile's auto-detection from the runtime's name is `runtime::tests`'
//! `sandboxed_runtimes_choose_the_sandbox_profile`.

use std::fs;

use nvshim_testsupport::loader::{self, Libc};
use nvshim_testsupport::probe::assert_no_problems;
use nvshim_testsupport::{ProbeReport, ProbeSpec};
use serde_json::Value;

use super::world::{SpecDirs, World};

/// The fake host's daemon endpoints, as `nvshim cdi generate` finds them under the driver root.
const IPC: &[&str] = &[
    "/run/nvidia-persistenced/socket",
    "/run/nvidia-fabricmanager/socket",
    "/tmp/nvidia-mps",
];

/// A host whose daemons' endpoints are there, so that leaving them out means something; a
/// legacy request finds the MPS pipe directory at `mps-pipe-directory`, set to the fake one.
fn world(profile: &str) -> World {
    let w = World::builder()
        .gpus(2)
        .spec_dirs(SpecDirs::EtcAndRun)
        .build();
    let root = w.host.root();
    let mps = root.join("tmp/nvidia-mps");
    fs::create_dir_all(&mps).unwrap();
    w.configure(&format!(
        "profile = \"{profile}\"\nmps-pipe-directory = {:?}\n",
        mps.display().to_string()
    ));
    for s in &IPC[..2] {
        let p = root.join(s.trim_start_matches('/'));
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        let _ = fs::remove_file(&p);
        std::os::unix::net::UnixListener::bind(&p).unwrap();
    }
    w
}

/// What a config.json or spec asks for besides devices and libraries: its hooks, and the
/// mounts of the daemons' endpoints.
fn extras(
    hooks: &Value,
    mounts: &[Value],
    destination: &str,
    ipc: &[&str],
) -> (usize, Vec<String>) {
    // All hooks but the test's own stand-in ([`stand_in`]).
    let ours = |v: &Value| {
        v.as_array()
            .map_or(0, |a| a.iter().filter(|h| h["path"] != "/bin/sh").count())
    };
    let hooks = hooks
        .as_object()
        .map(|h| h.values().map(ours).sum())
        .or_else(|| Some(ours(hooks)))
        .unwrap_or(0);
    let ipc = mounts
        .iter()
        .filter_map(|m| m[destination].as_str())
        .filter(|d| ipc.contains(d))
        .map(str::to_string)
        .collect();
    (hooks, ipc)
}

/// Test set-up, as in nvidia_hooks.rs: the kernel driver's /proc/driver as the container
/// would see it (the fake host's, saying `ModifyDeviceFiles: 1`), bind-mounted by a first
/// createContainer hook, which runc runs from the root filesystem.
fn stand_in(w: &World, b: &nvshim_testsupport::Bundle) {
    let driver = w.host.proc_root().join("driver");
    b.edit(|c| {
        c["hooks"]["createContainer"] = serde_json::json!([{
            "path": "/bin/sh",
            "args": ["sh", "-c", format!("mount --bind '{}' \"$PWD/proc/driver\"", driver.display())],
            "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"],
        }]);
        Ok(())
    })
    .unwrap();
}

/// `nvshim cdi generate --format json EXTRA` into `<run-cdi>/nvidia.json`: the spec's text.
fn generate(w: &World, extra: &[&str]) -> String {
    let spec_path = w.run_cdi.join("nvidia.json");
    let mut args = vec!["cdi", "generate", "--output", spec_path.to_str().unwrap()];
    args.extend_from_slice(extra);
    let out = w.nvshim(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    fs::read_to_string(&spec_path).unwrap()
}

/// The probe, then the dlopen program.
fn args(w: &World) -> Vec<String> {
    let probe = ProbeSpec::for_host(&w.host).script();
    vec![
        "sh".into(),
        "-c".into(),
        format!(
            "grep ModifyDeviceFiles /proc/driver/nvidia/params\n{probe}\n{}",
            loader::PROGRAM
        ),
    ]
}

/// A GPU through nvshim-runtime, standard then sandbox profile, in a glibc and a musl image:
/// the sandbox config.json has no hook, no daemon mount, the container no params overmount,
/// and its loader finds libcuda.so.1 at `/usr/lib/libcuda.so.1`. The standard profile is the
/// control: the same checks see its hook and sockets.
#[test]
fn sandbox_profile_loads_libcuda_without_hooks() {
    for libc in [Libc::Glibc, Libc::Musl] {
        for profile in ["standard", "sandbox"] {
            let w = world(profile);
            let args = args(&w);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let b = w.bundle(
                "b",
                &args,
                &[
                    ("NVIDIA_VISIBLE_DEVICES", "0"),
                    ("NVIDIA_DRIVER_CAPABILITIES", "all"),
                    // A limit needs a hook: the sandbox profile warns instead.
                    ("NVIDIA_GPU_MEMORY_REQUEST", "1024"),
                    ("NVIDIA_GPU_MEMORY_LIMIT", "2048"),
                ],
            );
            loader::add_dlopen_program(b.rootfs().path(), libc).unwrap();
            stand_in(&w, &b);
            let id = nvshim_testsupport::unique_id("nvshim-e2e-sandbox");
            let out = w.shim().run(&b, &id).unwrap();
            let what = format!("{libc:?} image, {profile} profile");
            let report = ProbeReport::parse(&out.stdout);
            assert!(report.complete, "{what}: {out}\n{}", w.shim_log());
            let config = b.config().unwrap();
            let mounts = config["mounts"].as_array().unwrap();
            let mps = w.host.root().join("tmp/nvidia-mps");
            let legacy_ipc = [IPC[0], IPC[1], mps.to_str().unwrap()];
            let (hooks, ipc) = extras(&config["hooks"], mounts, "destination", &legacy_ipc);
            let mps_env = b
                .env()
                .unwrap()
                .into_iter()
                .filter(|e| e.starts_with("CUDA_MPS_PIPE_DIRECTORY="))
                .count();
            let params = report.mount("/proc/driver/nvidia/params");
            let loaded = loader::parse(&out.stdout);
            // The hook's overmount says 0; without it, the host's file says 1.
            let modify = if profile == "standard" { 0 } else { 1 };
            assert!(
                out.stdout
                    .contains(&format!("ModifyDeviceFiles: {modify}\n")),
                "{what}: {out}"
            );
            if profile == "standard" {
                assert!(params.is_some(), "{what}: no params overmount");
                assert!(
                    hooks > 0 && ipc.len() == 3 && mps_env == 1,
                    "{what}: {hooks} hooks, {ipc:?}, {mps_env} MPS variable"
                );
                continue;
            }
            assert_eq!(
                (hooks, &ipc[..], mps_env),
                (0, &[][..], 0),
                "{what}: {config:#}"
            );
            assert!(params.is_none(), "{what}: {params:?}");
            assert_no_problems(&what, &report.gpu_problems(&w.host, &[w.gpu(0)]), &report);
            let log = w.shim_log();
            assert!(
                log.contains("NVIDIA_GPU_MEMORY_LIMIT not applied: the sandbox profile"),
                "{what}: {log}"
            );
            assert_eq!(
                loaded,
                Some((1, "/usr/lib/libcuda.so.1".to_string())),
                "{what}: the image's loader did not load libcuda.so.1\n{out}"
            );
        }
    }
}

/// `nvshim cdi generate --profile sandbox`: no hook anywhere in the spec, no daemon mount; a
/// container given its device through nvshim-runtime (CDI annotation) loads libcuda.so.1 with
/// the image's loader, glibc and musl.
#[test]
fn sandbox_spec_has_no_hooks_and_still_loads_libcuda() {
    let w = world("standard");
    for (profile, want_hooks) in [("standard", true), ("sandbox", false)] {
        let spec: Value = serde_json::from_str(&generate(&w, &["--profile", profile])).unwrap();
        let mut edits = vec![&spec["containerEdits"]];
        edits.extend(
            spec["devices"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| &d["containerEdits"]),
        );
        let hooks: usize = edits
            .iter()
            .map(|e| e["hooks"].as_array().map_or(0, Vec::len))
            .sum();
        let (_, ipc) = extras(
            &Value::Null,
            spec["containerEdits"]["mounts"].as_array().unwrap(),
            "containerPath",
            IPC,
        );
        assert_eq!(hooks > 0, want_hooks, "{profile}: {hooks} hooks");
        assert_eq!(!ipc.is_empty(), want_hooks, "{profile}: {ipc:?}");
    }
    for libc in [Libc::Glibc, Libc::Musl] {
        let args = args(&w);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let name = format!("b-{libc:?}");
        let b = w.bundle(&name, &args, &[]);
        b.edit(|c| {
            c["annotations"]["cdi.k8s.io/nvshim"] = "nvidia.com/gpu=0".into();
            Ok(())
        })
        .unwrap();
        loader::add_dlopen_program(b.rootfs().path(), libc).unwrap();
        stand_in(&w, &b);
        let id = nvshim_testsupport::unique_id("nvshim-e2e-sandbox");
        let out = w.shim().run(&b, &id).unwrap();
        let what = format!("{libc:?} image, sandbox spec");
        assert!(
            out.stdout.contains("ModifyDeviceFiles: 1\n"),
            "{what}: {out}"
        );
        let report = ProbeReport::parse(&out.stdout);
        assert!(report.complete, "{what}: {out}\n{}", w.shim_log());
        let config = b.config().unwrap();
        let (hooks, _) = extras(&config["hooks"], &[], "destination", IPC);
        assert_eq!(hooks, 0, "{what}: {:#}", config["hooks"]);
        assert_no_problems(&what, &report.gpu_problems(&w.host, &[w.gpu(0)]), &report);
        assert_eq!(
            loader::parse(&out.stdout),
            Some((1, "/usr/lib/libcuda.so.1".to_string())),
            "{what}\n{out}"
        );
    }
}

/// `profile = "auto"` (the default) with a low-level runtime named `runsc`: here a link of
/// that name to runc, the only way to run it on these machines. nvshim-runtime, `nvshim cdi
/// generate` without `--profile` and `nvshim explain` all take the sandbox profile.
#[test]
fn a_runtime_named_runsc_selects_the_sandbox_profile() {
    let w = world("auto");
    let runc = nvshim::runtime::find_low_level_runtime(
        &["runc".into()],
        std::env::var_os("PATH").as_deref(),
        None,
    )
    .unwrap();
    let bin = w.tmp.path().join("bin");
    fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(&runc, bin.join("runsc")).unwrap();
    let mps = w.host.root().join("tmp/nvidia-mps");
    w.configure(&format!(
        "low-level-runtimes = [{:?}]\nmps-pipe-directory = {:?}\n",
        bin.join("runsc").display().to_string(),
        mps.display().to_string()
    ));

    let args = args(&w);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let b = w.bundle("b", &args, &[("NVIDIA_VISIBLE_DEVICES", "0")]);
    loader::add_dlopen_program(b.rootfs().path(), Libc::Glibc).unwrap();
    let explained = w.nvshim(&[
        "explain",
        "--bundle",
        b.dir().to_str().unwrap(),
        "--format",
        "json",
    ]);
    let explained: Value = serde_json::from_slice(&explained.stdout).unwrap();
    let (hooks, _) = extras(&explained["result"]["hooks"], &[], "destination", IPC);
    let sandboxed = explained["result"]["mounts"].as_array().is_some_and(|m| {
        m.iter()
            .any(|m| m["destination"] == "/usr/lib/libcuda.so.1")
    });
    assert!(hooks == 0 && sandboxed, "explain: {explained:#}");

    let id = nvshim_testsupport::unique_id("nvshim-e2e-sandbox");
    let out = w.shim().run(&b, &id).unwrap();
    assert!(
        ProbeReport::parse(&out.stdout).complete,
        "{out}\n{}",
        w.shim_log()
    );
    let config = b.config().unwrap();
    let (hooks, _) = extras(&config["hooks"], &[], "destination", IPC);
    assert_eq!(hooks, 0, "{:#}", config["hooks"]);
    assert_eq!(
        loader::parse(&out.stdout),
        Some((1, "/usr/lib/libcuda.so.1".to_string())),
        "{out}"
    );

    let spec = generate(&w, &[]);
    assert!(!spec.contains("\"hooks\""), "{spec}");
    assert!(spec.contains("\"/usr/lib/libcuda.so.1\""), "{spec}");
}

/// `profile` changed in the config (the packages' path unit then runs `nvshim cdi refresh`):
/// the node's spec, current for the host, is regenerated for the new profile, and left alone
/// once it is.
#[test]
fn refresh_follows_a_profile_change() {
    let w = world("standard");
    let spec_path = w.run_cdi.join("nvidia.yaml");
    let refresh = |w: &World| {
        let out = w.nvshim(&["cdi", "refresh", "--output", spec_path.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    refresh(&w);
    assert!(fs::read_to_string(&spec_path).unwrap().contains("hooks:"));
    assert_eq!(refresh(&w), "", "a current spec is left alone");
    let mps = w.host.root().join("tmp/nvidia-mps");
    w.configure(&format!(
        "profile = \"sandbox\"\nmps-pipe-directory = {:?}\n",
        mps.display().to_string()
    ));
    let stderr = refresh(&w);
    let spec = fs::read_to_string(&spec_path).unwrap();
    assert!(
        !spec.contains("hooks:") && spec.contains("/usr/lib/libcuda.so.1"),
        "{stderr}\n{spec}"
    );
    assert_eq!(refresh(&w), "", "a current spec is left alone");
}
