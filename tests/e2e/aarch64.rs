//! nvshim's aarch64 binaries on a simulated GB200 compute tray (Grace: aarch64), run for real on
//! this x86-64 machine: the aarch64 `nvshim-runtime` and `nvshim-hook` of
//! `scripts/build-release.sh --target aarch64-unknown-linux-gnu` execute through qemu-user and
//! binfmt_misc, in front of this machine's runc, for arm64 busybox images whose own glibc
//! `ldconfig -p` reads the cache the aarch64 hook wrote. The host ([`FakeHostSpec::gb200`]):
//! four GPUs, IMEX channels, aarch64 stub libraries in `/usr/lib/aarch64-linux-gnu` and an
//! `ld.so.cache` written by Debian's arm64 ldconfig.
//!
//! Needs `scripts/install-arm64.sh` (the binfmt handler, the arm64 root); without it each test
//! says so on one line and passes, except under `CI=true`, where it fails.

use std::path::{Path, PathBuf};
use std::process::Command;

use nvshim_testsupport::arm64;
use nvshim_testsupport::{Bundle, FakeHostSpec, Rootfs, Runtime};
use serde_json::{json, Value};

use crate::common::shim_at;
use crate::world::World;

/// The aarch64 release binaries (`$NVSHIM_AARCH64_BIN_DIR`, default [`arm64::BIN_DIR`] of this
/// workspace) and the arm64 root, or `None` when this machine cannot run them.
fn setup(test: &str) -> Option<(PathBuf, PathBuf)> {
    let root = arm64::root_or_skip(test)?;
    let bin = std::env::var_os("NVSHIM_AARCH64_BIN_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join(arm64::BIN_DIR),
        PathBuf::from,
    );
    for b in ["nvshim", "nvshim-runtime", "nvshim-hook"] {
        if !bin.join(b).is_file() {
            let why = format!(
                "no {}: scripts/build-release.sh --target aarch64-unknown-linux-gnu",
                bin.join(b).display()
            );
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{test}: {why}"
            );
            eprintln!("{test}: skipped: {why}");
            return None;
        }
    }
    Some((bin, root))
}

/// A GB200 world whose config names the aarch64 hook, with IMEX channels 0 and 1 and the
/// fabric's IMEX management capability.
fn grace(bin: &Path) -> World {
    let w = World::builder().spec(FakeHostSpec::gb200()).build();
    w.configure(&format!(
        "hook-path = {:?}\n",
        bin.join("nvshim-hook").display().to_string()
    ));
    w.host.add_imex_channels(&[0, 1]).unwrap();
    w.host.add_fabric_imex_mgmt().unwrap();
    w
}

/// An arm64 busybox bundle running `script` with `env`.
fn arm64_bundle(w: &World, root: &Path, name: &str, script: &str, env: &[(&str, &str)]) -> Bundle {
    let b = Bundle::new_with(&w.tmp.path().join(name), &["sh", "-c", script], |dir| {
        Rootfs::busybox_from(dir, &root.join("bin/busybox"), &root.join("sbin/ldconfig"))
    })
    .unwrap();
    for (k, v) in env {
        b.set_env(k, v).unwrap();
    }
    b
}

/// Runs `bundle` through the aarch64 nvshim-runtime; its output.
fn run(w: &World, rt: &Runtime, bundle: &Bundle) -> String {
    let out = rt
        .run(bundle, &nvshim_testsupport::unique_id("aarch64"))
        .unwrap();
    if std::env::var_os("NVSHIM_E2E_VERBOSE").is_some() {
        eprintln!("{out}");
    }
    assert!(
        out.success(),
        "the container failed\n{out}\n--- nvshim.log ---\n{}",
        w.shim_log()
    );
    out.stdout
}

const LOOK: &str = "uname -m; ls /dev | grep '^nvidia[0-9]' | tr '\\n' ' '; echo; \
    ls /dev/nvidia-caps-imex-channels 2> /dev/null | tr '\\n' ' '; echo; \
    ls /dev/nvidia-caps 2> /dev/null | tr '\\n' ' '; echo; \
    ldconfig -p | grep -F libcuda.so.1; ls /usr/lib; nvidia-smi -L";

/// Every GPU with IMEX channel 0 (privileged, as NVIDIA's runtime serves the variable): the
/// four nodes, the channel but not the fabric's IMEX management node (the IMEX daemon's, not
/// the workload's: no NVIDIA request brings it), and libcuda in the image's cache as an aarch64
/// entry for glibc's own ldconfig (`libc6,AArch64`: flags 0x0a03).
#[test]
fn grace_container_sees_its_gpus_imex_channel_and_libraries() {
    let Some((bin, root)) = setup("grace_container_sees_its_gpus_imex_channel_and_libraries")
    else {
        return;
    };
    let w = grace(&bin);
    let b = arm64_bundle(
        &w,
        &root,
        "all",
        LOOK,
        &[
            ("NVIDIA_VISIBLE_DEVICES", "all"),
            ("NVIDIA_DRIVER_CAPABILITIES", "compute,utility"),
            ("NVIDIA_IMEX_CHANNELS", "0"),
        ],
    );
    b.edit(|c| {
        c.pointer_mut("/process/capabilities/bounding")
            .and_then(Value::as_array_mut)
            .unwrap()
            .push(json!("CAP_SYS_ADMIN"));
        Ok(())
    })
    .unwrap();
    let rt = shim_at(bin.join("nvshim-runtime"), w.tmp.path(), &w.config);
    let out = run(&w, &rt, &b);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "aarch64", "{out}");
    assert_eq!(lines[1], "nvidia0 nvidia1 nvidia2 nvidia3 ", "{out}");
    assert_eq!(lines[2], "channel0 ", "{out}");
    assert_eq!(lines[3], "", "{out}");
    let libcuda = "libcuda.so.1 (libc6,AArch64) => /usr/lib/aarch64-linux-gnu/libcuda.so.1";
    assert!(
        out.lines().any(|l| l.trim() == libcuda),
        "no `{libcuda}` in ldconfig -p:\n{out}"
    );
    let listed = out.lines().filter(|l| l.starts_with("GPU ")).count();
    assert_eq!(listed, 4, "nvidia-smi -L:\n{out}");
    // The aarch64 runtime's own log: it served the four GPUs.
    let log = w.shim_log();
    assert!(w.host.gpus().iter().all(|g| log.contains(&g.uuid)), "{log}");
}

/// One GPU by index, every capability: `compat32` brings nothing on aarch64 (no 32-bit
/// directory appears), the GPU is the one at that index in bus order, and no IMEX channel
/// without asking.
#[test]
fn grace_one_gpu_and_compat32_brings_no_32bit_libraries() {
    let Some((bin, root)) = setup("grace_one_gpu_and_compat32_brings_no_32bit_libraries") else {
        return;
    };
    let w = grace(&bin);
    let b = arm64_bundle(
        &w,
        &root,
        "one",
        LOOK,
        &[
            ("NVIDIA_VISIBLE_DEVICES", "1"),
            ("NVIDIA_DRIVER_CAPABILITIES", "all"),
        ],
    );
    let rt = shim_at(bin.join("nvshim-runtime"), w.tmp.path(), &w.config);
    let out = run(&w, &rt, &b);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[1], format!("nvidia{} ", w.gpu(1).minor), "{out}");
    assert_eq!(lines[2], "", "{out}");
    for dir in ["i386-linux-gnu", "arm-linux-gnueabihf"] {
        assert!(!out.lines().any(|l| l == dir), "{dir} in /usr/lib:\n{out}");
    }
    assert!(out.lines().any(|l| l == "aarch64-linux-gnu"), "{out}");
}

/// The aarch64 `nvshim` (dynamic: its loader and libc from the arm64 root): `--version`;
/// `doctor` reads the `for aarch64` banner and finds the driver's libraries through the
/// cache's aarch64 entries; `cdi generate` for the Grace host names aarch64 library paths and
/// the four GPUs.
#[test]
fn grace_nvshim_doctor_and_cdi_generate() {
    let Some((bin, root)) = setup("grace_nvshim_doctor_and_cdi_generate") else {
        return;
    };
    let w = grace(&bin);
    let run_nvshim = |args: &[&str]| {
        Command::new(bin.join("nvshim"))
            .args(args)
            .env("NVSHIM_CONFIG", &w.config)
            .env("QEMU_LD_PREFIX", &root)
            .output()
            .unwrap()
    };
    let nvshim = |args: &[&str]| {
        let out = run_nvshim(args);
        assert!(
            out.status.success(),
            "nvshim {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(nvshim(&["--version"]).starts_with("nvshim "));
    // Doctor's errors here are the machine's engines, not configured for nvshim.
    let doctor = String::from_utf8_lossy(&run_nvshim(&["doctor"]).stdout).into_owned();
    let check = |name: &str| {
        doctor
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(name))
            .unwrap_or_else(|| panic!("no {name} check:\n{doctor}"))
            .to_string()
    };
    assert!(
        check("driver").starts_with("ok ") && check("driver").contains("580.95.05"),
        "{doctor}"
    );
    let libraries = check("libraries");
    assert!(
        libraries.starts_with("ok ")
            && libraries.contains("/usr/lib/aarch64-linux-gnu/libcuda.so.580.95.05"),
        "{doctor}"
    );
    let spec = w.tmp.path().join("nvidia.yaml");
    nvshim(&["cdi", "generate", "--output", spec.to_str().unwrap()]);
    let text = std::fs::read_to_string(&spec).unwrap();
    assert!(
        text.contains("/usr/lib/aarch64-linux-gnu/libcuda.so.580.95.05"),
        "{text}"
    );
    assert!(!text.contains("i386") && !text.contains("x86_64"), "{text}");
    for gpu in w.host.gpus() {
        assert!(text.contains(&gpu.uuid), "{} not in the spec", gpu.uuid);
    }
}
