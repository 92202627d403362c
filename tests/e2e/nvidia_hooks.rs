//! NVIDIA's hook command lines in real runc containers, with only nvshim installed: a spec
//! whose createContainer hooks name `nvidia-cdi-hook` (the link the packages install to
//! `nvshim-hook`) in the order NVIDIA's generator writes them (create-symlinks,
//! enable-cuda-compat, update-ldcache, disable-device-node-modification,
//! update-application-profile), and one naming the older
//! `nvidia-ctk hook ...` form. The container's shell reports what it sees.
//!
//! The fake host (`FakeHost::with_gpus(2)`, driver 580.65.06) has no kernel driver, so nothing
//! shows `/proc/driver/nvidia` in the container's procfs. To stand in for the driver, a first
//! createContainer hook bind-mounts the fake host's `proc/driver` over the container's
//! `/proc/driver` (runc refuses spec mounts inside `/proc`), with a params file saying
//! `ModifyDeviceFiles: 1`; `disable-device-node-modification` is pointed at the same file with
//! its hidden `--host-params`. The image carries a CUDA 13.0 compat library
//! (`/usr/local/cuda -> cuda-13.0`) whose ELF note lists driver branch 580.
//!
//! Needs root, runc, gcc, and `cargo build --workspace` first (for `nvshim-hook`).

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

use nvshim_testsupport::{unique_id, Bundle, Runtime};
use serde_json::{json, Value};

use super::world::World;

const PARAMS: &str = "ResmanDebugLevel: 4294967295\nRmLogonRC: 1\nModifyDeviceFiles: 1\n\
                      DeviceFileUID: 0\nDeviceFileGID: 0\nDeviceFileMode: 438\n";
const COMPAT_VERSION: &str = "580.95.05";
/// The driver's library directory in the container (the fake host's `LIB_DIR`).
const LIB_DIR: &str = "/usr/lib/x86_64-linux-gnu";

/// The fake two-GPU host with the driver's module parameters in its `/proc`.
fn world() -> World {
    let w = World::new();
    fs::write(host_params_file(&w), PARAMS).unwrap();
    w
}

fn host_params_file(w: &World) -> PathBuf {
    w.host.proc_root().join("driver/nvidia/params")
}

/// A busybox bundle running `script`, with GPU minor 1 and the control node, and the fake
/// driver's libcuda mounted read-only as NVIDIA's specs mount it.
fn hook_bundle(w: &World, name: &str, script: &str) -> Bundle {
    let b = w.bundle(name, &["/bin/sh", "-c", script], &[]);
    for (path, minor) in [("/dev/nvidia1", 1), ("/dev/nvidiactl", 255)] {
        b.add_char_device(path, 195, minor).unwrap();
        b.allow_char_device(195, minor, "rw").unwrap();
    }
    let libcuda = w.host.container_lib_path("libcuda");
    let source = w.host.host_path(&libcuda);
    b.edit(move |c| {
        c["mounts"].as_array_mut().unwrap().push(json!({
            "destination": libcuda,
            "type": "bind",
            "source": source,
            "options": ["ro", "nosuid", "nodev", "rbind", "rprivate"],
        }));
        Ok(())
    })
    .unwrap();
    b
}

fn run_runc(w: &World, b: &Bundle) -> String {
    let rt = Runtime::new("runc", &w.tmp.path().join("state")).unwrap();
    let out = rt.run(b, &unique_id("nvidia-hooks")).unwrap();
    assert!(out.success(), "the container failed\n{out}");
    out.stdout
}

/// A createContainer hook as NVIDIA's generator writes it (explicit env), named `argv0`.
fn hook(path: &Path, argv: &[&str]) -> Value {
    json!({
        "path": path.to_string_lossy(),
        "args": argv,
        "env": ["NVIDIA_CTK_DEBUG=false"],
    })
}

fn set_hooks(b: &Bundle, hooks: Vec<Value>) {
    b.edit(move |c| {
        c["hooks"] = json!({ "createContainer": hooks });
        Ok(())
    })
    .unwrap();
}

/// A stub `libcuda.so.1` carrying NVIDIA's `.note.cuda.fwd_compatibility` (an assembler note
/// section, padded to 4 as the section's alignment).
fn compat_library(dir: &Path) -> PathBuf {
    let json = br#"{"Format":1,"CUDA Version":"13.0","Driver":[535,550,570,575,580],"Device":[1,2,7,8,9,10,11,12,13,14]}"#;
    let owner = b"NVIDIA Corporation\0";
    let mut note = Vec::new();
    note.extend_from_slice(&(owner.len() as u32).to_le_bytes());
    note.extend_from_slice(&(json.len() as u32).to_le_bytes());
    note.extend_from_slice(&0u32.to_le_bytes());
    for part in [&owner[..], &json[..]] {
        note.extend_from_slice(part);
        while note.len() % 4 != 0 {
            note.push(0);
        }
    }
    let bytes: Vec<String> = note.iter().map(|b| format!("0x{b:02x}")).collect();
    fs::write(
        dir.join("note.s"),
        format!(
            ".section .note.cuda.fwd_compatibility,\"a\",@note\n.balign 4\n.byte {}\n\
             .section .note.GNU-stack,\"\",@progbits\n",
            bytes.join(",")
        ),
    )
    .unwrap();
    fs::write(dir.join("stub.c"), "int cuInit(unsigned f) { return 0; }\n").unwrap();
    let out = dir.join(format!("libcuda.so.{COMPAT_VERSION}"));
    let status = Command::new("gcc")
        .args(["-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o"])
        .arg(&out)
        .arg(dir.join("stub.c"))
        .arg(dir.join("note.s"))
        .status()
        .unwrap();
    assert!(status.success(), "gcc failed");
    out
}

/// The sections of the probe script's output, split at `===` lines.
fn sections(stdout: &str) -> Vec<String> {
    stdout.split("===\n").map(str::to_string).collect()
}

/// This process's mounts, less those inside other tests' worlds: tests run in parallel, and a
/// reliability test mounts a small tmpfs in its own world meanwhile.
fn mountinfo(w: &World) -> String {
    let own = w.tmp.path().to_string_lossy().into_owned();
    // Every world is a `nvshim-e2e-*` directory beside this one (tests/e2e/world.rs).
    let worlds = format!("{}/nvshim-e2e-", w.tmp.path().parent().unwrap().display());
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| {
            let point = l.split(' ').nth(4).unwrap_or("");
            !point.starts_with(&worlds) || point.starts_with(&own)
        })
        .map(|l| format!("{l}\n"))
        .collect()
}

#[test]
fn nvidia_cdi_hook_spec_in_nvidias_order() {
    let w = world();
    let script = "cat /proc/driver/nvidia/params; echo ===; \
                  cat /etc/ld.so.conf.d/00-compat-nvshim.conf; echo ===; \
                  cat /etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf; echo; echo ===; \
                  ldconfig -p; echo ===; \
                  grep ' /proc/driver/nvidia/params ' /proc/self/mountinfo; echo ===; \
                  if (echo x > /proc/driver/nvidia/params) 2>/dev/null; then echo writable; fi; \
                  ls -a /; echo ===";
    let b = hook_bundle(&w, "b1", script);
    let rootfs = b.rootfs().path().to_path_buf();
    // The image: CUDA 13.0 with its forward-compatibility library.
    let compat = rootfs.join("usr/local/cuda-13.0/compat");
    fs::create_dir_all(&compat).unwrap();
    compat_library(&compat);
    symlink(
        format!("libcuda.so.{COMPAT_VERSION}"),
        compat.join("libcuda.so.1"),
    )
    .unwrap();
    symlink("cuda-13.0", rootfs.join("usr/local/cuda")).unwrap();

    let cdi_hook = w.hook_link("nvidia-cdi-hook");
    let v = w.host.driver_version().to_string();
    let driver_proc = w.host.proc_root().join("driver");
    let stand_in = format!(
        "mount --bind '{}' '{}/proc/driver'",
        driver_proc.display(),
        rootfs.display()
    );
    let host_params = format!("--host-params={}", host_params_file(&w).display());
    set_hooks(
        &b,
        vec![
            // Test set-up: the kernel driver's /proc/driver/nvidia, as the container would see it.
            json!({
                "path": "/bin/sh",
                "args": ["sh", "-c", stand_in],
                "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"],
            }),
            hook(
                &cdi_hook,
                &[
                    "nvidia-cdi-hook",
                    "create-symlinks",
                    "--link",
                    &format!("libcuda.so.{v}::{LIB_DIR}/libcuda.so.1"),
                    "--link",
                    &format!("libcuda.so.1::{LIB_DIR}/libcuda.so"),
                ],
            ),
            hook(
                &cdi_hook,
                &[
                    "nvidia-cdi-hook",
                    "enable-cuda-compat",
                    &format!("--host-driver-version={v}"),
                ],
            ),
            hook(
                &cdi_hook,
                &["nvidia-cdi-hook", "update-ldcache", "--folder", LIB_DIR],
            ),
            hook(
                &cdi_hook,
                &[
                    "nvidia-cdi-hook",
                    "disable-device-node-modification",
                    &host_params,
                ],
            ),
            hook(
                &cdi_hook,
                &["nvidia-cdi-hook", "update-application-profile"],
            ),
        ],
    );
    let mounts_before = mountinfo(&w);
    let out = run_runc(&w, &b);
    let s = sections(&out);
    assert!(s.len() >= 7, "{out}");

    // disable-device-node-modification: the copy, read-only.
    assert_eq!(
        s[0],
        PARAMS.replace("ModifyDeviceFiles: 1", "ModifyDeviceFiles: 0"),
        "{out}"
    );
    let opts = s[4].split(' ').nth(5).unwrap_or_default();
    for o in ["ro", "nosuid", "nodev", "noexec"] {
        assert!(opts.split(',').any(|x| x == o), "{o} missing: {}", s[4]);
    }
    assert!(!s[5].contains("writable"), "{out}");
    assert!(!s[5].contains(".nvshim-params"), "scratch left: {out}");
    // enable-cuda-compat: the compat directory as the image's symlinks resolve it.
    assert!(
        s[1].ends_with("\n/usr/local/cuda-13.0/compat\n"),
        "{:?}",
        s[1]
    );
    // update-application-profile: /dev/nvidia1 is minor 1.
    assert_eq!(
        s[2].trim_end(),
        r#"{"profiles":[{"name":"_container_","settings":["EGLVisibleDGPUDevices",0x2]}],"rules":[{"pattern":[],"profile":"_container_"}]}"#
    );
    // update-ldcache, after enable-cuda-compat: the compat libcuda first, the driver's next.
    let cuda: Vec<&str> = s[3]
        .lines()
        .filter(|l| l.trim_start().starts_with("libcuda.so.1 "))
        .filter_map(|l| l.split(" => ").nth(1))
        .collect();
    assert_eq!(
        cuda,
        [
            "/usr/local/cuda-13.0/compat/libcuda.so.1",
            &format!("{LIB_DIR}/libcuda.so.1")
        ],
        "{}",
        s[3]
    );
    assert!(
        s[3].contains(&format!(
            "libcuda.so (libc6,x86-64) => {LIB_DIR}/libcuda.so\n"
        )),
        "{}",
        s[3]
    );

    // The host: its params file unchanged, no mount left in the test's namespace.
    assert_eq!(fs::read_to_string(host_params_file(&w)).unwrap(), PARAMS);
    assert_eq!(mountinfo(&w), mounts_before);
}

#[test]
fn old_nvidia_ctk_hook_command_lines() {
    let w = world();
    let b = hook_bundle(
        &w,
        "b1",
        "ldconfig -p; echo ===; readlink /usr/lib/x86_64-linux-gnu/libcuda.so; echo ===; \
         cat /etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf",
    );
    // What `nvidia-ctk cdi generate` wrote before nvidia-cdi-hook existed.
    let ctk = w.hook_link("nvidia-ctk");
    let v = w.host.driver_version().to_string();
    set_hooks(
        &b,
        vec![
            hook(
                &ctk,
                &[
                    "nvidia-ctk",
                    "hook",
                    "create-symlinks",
                    "--link",
                    &format!("libcuda.so.{v}::{LIB_DIR}/libcuda.so.1"),
                    "--link",
                    &format!("libcuda.so.1::{LIB_DIR}/libcuda.so"),
                ],
            ),
            hook(
                &ctk,
                &["nvidia-ctk", "hook", "update-ldcache", "--folder", LIB_DIR],
            ),
            hook(&ctk, &["nvidia-ctk", "hook", "update-application-profile"]),
            // A hook this version does not know: a warning, not a failed start.
            hook(&ctk, &["nvidia-ctk", "hook", "a-hook-from-the-future"]),
        ],
    );
    let out = run_runc(&w, &b);
    let s = sections(&out);
    assert!(
        s[0].contains(&format!(
            "libcuda.so.1 (libc6,x86-64) => {LIB_DIR}/libcuda.so.1"
        )),
        "{out}"
    );
    assert_eq!(s[1].trim(), "libcuda.so.1", "{out}");
    assert!(s[2].contains(r#""EGLVisibleDGPUDevices",0x2]"#), "{out}");
}
