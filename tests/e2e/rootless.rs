//! Rootless podman (Debian 13's podman 5, `$NVSHIM_PODMAN`, else the system one) given the spec
//! `nvshim cdi generate` writes, as a user with subordinate ids, with `--userns=keep-id` and
//! with the default rootless mapping (the user is root in the container).
//!
//! The GPU nodes are where a GPU host has them, at `/dev` ([`RootlessUser::command`] says why
//! the fake host's are put there for podman); the fake driver's files stay under its root,
//! readable by everyone as a host's `/usr/lib` is.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use nvshim_testsupport::loader::{self, Libc};
use nvshim_testsupport::podman::{Podman, SystemSpec};
use nvshim_testsupport::probe::assert_no_problems;
use nvshim_testsupport::rootless::RootlessUser;
use nvshim_testsupport::{ProbeReport, ProbeSpec};

use super::world::{SpecDirs, World};

#[test]
fn rootless_podman_gets_the_gpu_and_its_libraries() {
    let w = World::builder()
        .gpus(2)
        .spec_dirs(SpecDirs::EtcAndRun)
        .build();
    fs::set_permissions(w.tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let class = format!("gpu-rootless{}", std::process::id());
    let user = RootlessUser::ensure().unwrap();
    let dir = w.tmp.path().join("podman");
    let podman = Podman::rootless(&dir, &user, &w.host.root().join("dev")).unwrap();
    let spec_path = w.run_cdi.join("nvidia.yaml");
    // The DRM groups (`additionalGids`) need CDI 0.7.0: left out for a podman 4 only.
    let mut args = vec![
        "cdi",
        "generate",
        "--class",
        &class,
        "--output",
        spec_path.to_str().unwrap(),
    ];
    if !podman.reads_cdi("0.7.0") {
        args.push("--no-additional-gids");
    }
    let out = w.nvshim(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _spec = SystemSpec::write(
        Path::new("/var/run/cdi"),
        &format!("nvshim-e2e-{class}.yaml"),
        &fs::read_to_string(&spec_path).unwrap(),
    )
    .unwrap();

    // The busybox image with a glibc program that loads libcuda.so.1 by its SONAME.
    let image_root = w.tmp.path().join("image");
    nvshim_testsupport::Rootfs::busybox(&image_root).unwrap();
    loader::add_dlopen_program(&image_root, Libc::Glibc).unwrap();
    let image = format!("localhost/nvshim-e2e-rootless:{}", std::process::id());
    podman.import_rootfs(&image_root, &image).unwrap();

    // Test set-up: the kernel driver's /proc/driver/nvidia as the container would see it (the
    // fake host's, bind-mounted over the container's by a hook that runs before nvshim's, as
    // in nvidia_hooks.rs); runc runs it from the root filesystem, its working directory.
    let stand_in = format!(
        "cdiVersion: 0.5.0\nkind: nvshim-e2e.test/proc{class}\ndevices:\n- name: driver\n  containerEdits:\n    hooks:\n    - hookName: createContainer\n      path: /bin/sh\n      args: [sh, -c, 'mount --bind {} \"$PWD/proc/driver\"']\n      env: [PATH=/usr/sbin:/usr/bin:/sbin:/bin]\n",
        w.host.proc_root().join("driver").display()
    );
    let _stand_in = SystemSpec::write(
        Path::new("/var/run/cdi"),
        &format!("nvshim-e2e-proc{class}.yaml"),
        &stand_in,
    )
    .unwrap();
    let proc_driver = format!("nvshim-e2e.test/proc{class}=driver");
    let device = format!("nvidia.com/{class}=1");
    let probe = ProbeSpec::for_host(&w.host).script();
    let script = format!(
        "echo UID $(id -u)\ngrep ModifyDeviceFiles /proc/driver/nvidia/params\n{probe}\n{}\n\
         for f in /dev/dri/card* /dev/dri/renderD*; do echo \"DRIOPEN $f $(tryopen $f)\"; done",
        loader::PROGRAM
    );
    // keep-id: the user is itself in the container; the default: the user is root there;
    // nomap: the user is not mapped at all, so the hooks cannot read the bundle's config.json.
    for (options, uid) in [
        (&["--userns=keep-id"][..], user.uid),
        (&[][..], 0),
        (&["--userns=nomap"][..], 0),
    ] {
        let out = podman
            .run_with(
                &image,
                &[&proc_driver, &device],
                options,
                &["sh", "-c", &script],
            )
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let what = format!("rootless podman {options:?}");
        let report = ProbeReport::parse(&stdout);
        assert!(
            out.status.success() && report.complete,
            "{what} failed: {}\n{stdout}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains(&format!("UID {uid}\n")), "{what}: {stdout}");
        // The fix-ups hook's params overmount, made inside the user namespace.
        assert!(
            stdout.contains("ModifyDeviceFiles: 0\n"),
            "{what}: {stdout}"
        );
        let params = report.mount("/proc/driver/nvidia/params");
        assert!(
            params.is_some_and(|m| m.is_readonly()),
            "{what}: {params:?}"
        );
        // No device cgroup confines a rootless container (podman cannot write one) and it
        // cannot mknod at all: the user namespace is the barrier, so the GPU it did not ask for
        // is reachable only if its node is there, which `gpu_problems` checks.
        let mut problems: Vec<String> = report
            .gpu_problems(&w.host, &[w.gpu(1)])
            .into_iter()
            .filter(|p| !p.contains("mknod'ed") && !p.contains("devices.list"))
            .collect();
        for (node, result) in &report.mknod {
            if !result.starts_with("MKNOD_FAILED") {
                problems.push(format!(
                    "mknod {node:?} worked in a rootless container: {result}"
                ));
            }
        }
        problems.extend(report.control_device_problems(&w.host));
        problems.extend(report.library_mounted_problems(&w.host, "libcuda"));
        problems.extend(report.ldcache_problems("libcuda.so.1"));
        assert_no_problems(&what, &problems, &report);
        let (count, _) = loader::parse(&stdout)
            .unwrap_or_else(|| panic!("{what}: libcuda.so.1 did not load\n{stdout}"));
        assert_eq!(count, 1, "{what}: {stdout}");
        // The GPU's DRM nodes (0660, groups video and render) are there, and closed: runc
        // sets the container's own groups (the spec's additionalGids, ids inside the user
        // namespace), so the user's host groups never apply (README "Rootless podman").
        let dri: Vec<&str> = stdout
            .lines()
            .filter(|l| l.starts_with("DRIOPEN "))
            .collect();
        assert!(
            dri.len() == 2 && dri.iter().all(|l| l.ends_with(" EACCES")),
            "{what}: {dri:?}"
        );
    }

    // `nvshim doctor` as the user: its subordinate ids are there; the fake host's nodes are
    // not at /dev, which it says.
    let out = std::process::Command::new("runuser")
        .args(["-u", nvshim_testsupport::rootless::USER, "--", "env"])
        .arg(format!("NVSHIM_CONFIG={}", w.config.display()))
        .arg(super::common::NVSHIM)
        .args(["doctor", "--format", "json"])
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let status = |name: &str| {
        report["checks"]
            .as_array()
            .and_then(|a| a.iter().find(|c| c["name"] == name))
            .map(|c| {
                (
                    c["status"].as_str().unwrap_or("").to_string(),
                    c["message"].to_string(),
                )
            })
            .unwrap_or_else(|| panic!("no {name} in {report:#}"))
    };
    assert_eq!(status("rootless-subids").0, "ok", "{report:#}");
    let devices = status("rootless-devices");
    assert!(
        devices.0 == "warning" && devices.1.contains("dev-root"),
        "{devices:?}"
    );
}
