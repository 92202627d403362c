//! The fake host as a program sees it: a layout check and a real `dlopen` of the stub libraries.
//! Needs root (mknod) and gcc, like the fake host itself.

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::process::Command;

use nvshim_testsupport::{FakeHost, FakeHostSpec};

fn build(n: usize) -> (tempfile::TempDir, FakeHost) {
    let tmp = tempfile::tempdir().unwrap();
    let host = FakeHost::build(&tmp.path().join("host"), &FakeHostSpec::with_gpus(n)).unwrap();
    (tmp, host)
}

#[test]
fn layout_matches_the_contract() {
    let (_tmp, host) = build(2);
    let root = host.root();

    let devices = fs::read_to_string(root.join("proc/devices")).unwrap();
    assert!(
        devices.starts_with("Character devices:\n  1 mem\n"),
        "{devices}"
    );
    for line in [
        "195 nvidia\n",
        "508 nvidia-uvm\n",
        "509 nvidia-caps\n",
        "\nBlock devices:\n",
    ] {
        assert!(devices.contains(line), "{line:?} missing from {devices}");
    }
    let version = fs::read_to_string(root.join("proc/driver/nvidia/version")).unwrap();
    // The open kernel modules' banner is the default: what most 560+ hosts print.
    assert!(
        version.starts_with("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  "),
        "{version}"
    );

    for gpu in host.gpus() {
        let info = fs::read_to_string(
            root.join("proc/driver/nvidia/gpus")
                .join(&gpu.bus_id)
                .join("information"),
        )
        .unwrap();
        assert!(
            info.contains(&format!("GPU UUID:        {}\n", gpu.uuid)),
            "{info}"
        );
        assert!(
            info.contains(&format!("Device Minor:    {}\n", gpu.minor)),
            "{info}"
        );
        assert!(
            info.contains(&format!("Bus Location:    {}\n", gpu.bus_id)),
            "{info}"
        );
        let node = fs::metadata(root.join(format!("dev/nvidia{}", gpu.minor))).unwrap();
        assert!(node.file_type().is_char_device());
        assert_eq!(
            node.rdev(),
            nix::sys::stat::makedev(195, u64::from(gpu.minor))
        );
        assert_eq!(node.mode() & 0o777, 0o666);
    }
    // Index is bus order, not minor order.
    assert_eq!(host.gpu_at_index(0).unwrap().minor, 1);
    assert_eq!(host.gpu_at_index(1).unwrap().minor, 0);

    let uvm = fs::metadata(root.join("dev/nvidia-uvm-tools")).unwrap();
    assert_eq!(uvm.rdev(), nix::sys::stat::makedev(508, 1));

    let lib = root.join("usr/lib/x86_64-linux-gnu");
    assert_eq!(
        fs::read_link(lib.join("libcuda.so.1")).unwrap().to_str(),
        Some("libcuda.so.580.65.06")
    );
    assert_eq!(
        fs::read_link(lib.join("libcuda.so")).unwrap().to_str(),
        Some("libcuda.so.1")
    );
    assert!(lib.join("vdpau/libvdpau_nvidia.so.1").exists());

    let cache = Command::new("/sbin/ldconfig")
        .arg("-p")
        .arg("-C")
        .arg(root.join("etc/ld.so.cache"))
        .output()
        .unwrap();
    let cache = String::from_utf8_lossy(&cache.stdout);
    for soname in [
        "libcuda.so.1",
        "libnvidia-ml.so.1",
        "libnvidia-nvvm.so.4",
        "libGLX_nvidia.so.0",
    ] {
        assert!(
            cache.contains(&format!("\t{soname} (libc6,x86-64)")),
            "{soname} not in {cache}"
        );
    }
}

#[test]
fn stub_libraries_load_and_answer() {
    let (tmp, host) = build(3);
    let src = tmp.path().join("probe.c");
    fs::write(
        &src,
        r#"#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv) {
    void *cuda = dlopen(argv[1], RTLD_NOW);
    void *nvml = dlopen(argv[2], RTLD_NOW);
    if (!cuda || !nvml) { fprintf(stderr, "%s\n", dlerror()); return 2; }
    int (*init)(unsigned) = (int (*)(unsigned))dlsym(cuda, "cuInit");
    int (*count)(int *) = (int (*)(int *))dlsym(cuda, "cuDeviceGetCount");
    int (*ver)(char *, unsigned) = (int (*)(char *, unsigned))dlsym(nvml, "nvmlSystemGetDriverVersion");
    int n = -1; char v[80] = "";
    if (!init || !count || !ver || init(0) || count(&n) || ver(v, sizeof v)) return 3;
    printf("%d %s\n", n, v);
    return 0;
}
"#,
    )
    .unwrap();
    let exe = tmp.path().join("probe");
    let st = Command::new("gcc")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .arg("-ldl")
        .status()
        .unwrap();
    assert!(st.success());
    let lib = host.root().join("usr/lib/x86_64-linux-gnu");
    let out = Command::new(&exe)
        .arg(lib.join("libcuda.so.1"))
        .arg(lib.join("libnvidia-ml.so.1"))
        .env("NVSHIM_FAKE_DEV", host.root().join("dev"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "3 580.65.06\n");
}

#[test]
fn write_config_lets_extra_keys_override_defaults() {
    let (tmp, host) = build(1);
    let path = tmp.path().join("cfg/config.toml");
    host.write_config(
        &path,
        "log-level = \"info\"\nhook-path = \"/x/nvshim-hook\"\n",
    )
    .unwrap();
    let text = fs::read_to_string(&path).unwrap();
    assert_eq!(text.matches("log-level").count(), 1, "{text}");
    assert!(text.contains("log-level = \"info\""));
    assert!(text.contains(&format!("driver-root = \"{}\"", host.root().display())));
    assert!(text.contains(&format!("proc-root = \"{}/proc\"", host.root().display())));
    assert!(text.contains("low-level-runtimes = [\"runc\"]"));
}

#[test]
fn building_into_a_non_empty_dir_fails_with_its_path() {
    let tmp = tempfile::tempdir().unwrap();
    fs::write(tmp.path().join("stray"), "x").unwrap();
    let err = FakeHost::build(tmp.path(), &FakeHostSpec::with_gpus(1)).unwrap_err();
    assert!(
        format!("{err:#}").contains(&tmp.path().display().to_string()),
        "{err:#}"
    );
}

/// The 580 driver's whole file set: the real `ldconfig` indexes every 64-bit and 32-bit
/// SONAME (through `/lib`, as on a merged-/usr Debian host) and none of the libraries in
/// subdirectories; the graphics manifests, X.Org modules, sockets and params are there.
#[test]
fn the_whole_driver_is_there_as_a_real_host_has_it() {
    let (_tmp, host) = build(2);
    let root = host.root();
    let v = host.driver_version();
    let out = Command::new("/sbin/ldconfig")
        .args(["-p", "-C"])
        .arg(root.join("etc/ld.so.cache"))
        .output()
        .unwrap();
    let cache = String::from_utf8_lossy(&out.stdout);
    for lib in host.libraries() {
        if !lib.subdir.is_empty() {
            continue;
        }
        let line = format!(
            "{} (libc6,x86-64) => /lib/x86_64-linux-gnu/{}",
            lib.soname(v),
            lib.soname(v)
        );
        assert!(cache.contains(&line), "{line} not in\n{cache}");
    }
    for lib in host.libraries_32() {
        if !lib.subdir.is_empty() {
            continue;
        }
        let line = format!(
            "{} (libc6) => /lib/i386-linux-gnu/{}",
            lib.soname(v),
            lib.soname(v)
        );
        assert!(cache.contains(&line), "{line} not in\n{cache}");
    }
    for absent in ["/vdpau/", "/gbm/", "/xorg/", "nvidia_drv"] {
        assert!(!cache.contains(absent), "{absent} in the cache:\n{cache}");
    }
    for (link, target) in [
        ("lib", "usr/lib"),
        ("bin", "usr/bin"),
        ("lib64", "usr/lib64"),
    ] {
        assert_eq!(
            fs::read_link(root.join(link)).unwrap().to_str(),
            Some(target)
        );
    }
    for path in [
        format!("usr/lib/firmware/nvidia/{v}/gsp_ga10x.bin"),
        format!("usr/lib/x86_64-linux-gnu/nvidia/xorg/libglxserver_nvidia.so.{v}"),
        "usr/lib/x86_64-linux-gnu/nvidia/xorg/nvidia_drv.so".into(),
        "usr/share/glvnd/egl_vendor.d/10_nvidia.json".into(),
        "usr/share/vulkan/icd.d/nvidia_icd.json".into(),
        "etc/OpenCL/vendors/nvidia.icd".into(),
        format!("usr/lib/i386-linux-gnu/vdpau/libvdpau_nvidia.so.{v}"),
        "usr/bin/nvidia-imex".into(),
        "usr/bin/nvidia-xconfig".into(),
    ] {
        assert!(root.join(&path).is_file(), "{path} missing");
    }
    assert_eq!(
        fs::read_link(root.join("usr/lib/x86_64-linux-gnu/gbm/nvidia-drm_gbm.so"))
            .unwrap()
            .to_str(),
        Some("../libnvidia-allocator.so.1")
    );
    for sock in [
        "run/nvidia-persistenced/socket",
        "run/nvidia-fabricmanager/socket",
    ] {
        assert!(
            fs::symlink_metadata(root.join(sock))
                .unwrap()
                .file_type()
                .is_socket(),
            "{sock}"
        );
    }
    let params = fs::read_to_string(host.proc_root().join("driver/nvidia/params")).unwrap();
    assert!(params.contains("ModifyDeviceFiles: 1\n"), "{params}");
}

/// DRM: a non-NVIDIA card0, then per GPU in bus order a card and a render node, in the groups
/// video and render, with by-path links and the sysfs entries that tie them to the GPU.
#[test]
fn drm_nodes_belong_to_their_gpus() {
    let (_tmp, host) = build(2);
    let dri = host.dev_root().join("dev/dri");
    let card0 = fs::metadata(dri.join("card0")).unwrap();
    assert!(card0.file_type().is_char_device());
    for (k, g) in host.gpus_by_bus().iter().enumerate() {
        for (kind, name, minor, gid) in [
            ("card", format!("card{}", k + 1), k as u64 + 1, 44),
            ("render", format!("renderD{}", 128 + k), 128 + k as u64, 105),
        ] {
            let m = fs::metadata(dri.join(&name)).unwrap();
            assert!(m.file_type().is_char_device(), "{name}");
            assert_eq!(
                (
                    nix::sys::stat::major(m.rdev()),
                    nix::sys::stat::minor(m.rdev())
                ),
                (226, minor),
                "{name}"
            );
            assert_eq!((m.gid(), m.mode() & 0o777), (gid, 0o660), "{name}");
            let link = dri.join(format!("by-path/pci-{}-{kind}", g.bus_id));
            assert_eq!(
                fs::read_link(link).unwrap().to_str(),
                Some(&*format!("../{name}"))
            );
            assert!(host
                .sys_root()
                .join("bus/pci/devices")
                .join(&g.bus_id)
                .join("drm")
                .join(&name)
                .is_dir());
        }
    }
}

/// The RHEL layout: libraries in usr/lib64 (32-bit in usr/lib), indexed through /lib64 as a
/// RHEL ldconfig lists its built-in directories.
#[test]
fn rhel_layout_puts_the_driver_in_lib64() {
    let tmp = tempfile::tempdir().unwrap();
    let mut spec = FakeHostSpec::with_gpus(1);
    spec.layout = nvshim_testsupport::Layout::Rhel;
    let host = FakeHost::build(&tmp.path().join("host"), &spec).unwrap();
    let v = host.driver_version();
    let out = Command::new("/sbin/ldconfig")
        .args(["-p", "-C"])
        .arg(host.root().join("etc/ld.so.cache"))
        .output()
        .unwrap();
    let cache = String::from_utf8_lossy(&out.stdout);
    for line in [
        "libcuda.so.1 (libc6,x86-64) => /lib64/libcuda.so.1",
        "libcuda.so.1 (libc6) => /lib/libcuda.so.1",
    ] {
        assert!(cache.contains(line), "{line} not in\n{cache}");
    }
    assert_eq!(
        host.container_lib_path("libcuda"),
        format!("/usr/lib64/libcuda.so.{v}")
    );
    assert!(host
        .root()
        .join("usr/lib64/xorg/modules/drivers/nvidia_drv.so")
        .is_file());
}

/// A real node's own libraries: stubs with their names as SONAMEs, indexed by the real
/// `ldconfig` beside the driver's (whose entries stay as they were), added once.
#[test]
fn system_libraries_join_the_driver_in_the_cache() {
    let (_tmp, host) = build(1);
    let list = |host: &FakeHost| {
        let out = Command::new("/sbin/ldconfig")
            .args(["-p", "-C"])
            .arg(host.root().join("etc/ld.so.cache"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let before = list(&host);
    assert_eq!(host.add_system_libraries().unwrap(), 423);
    let after = list(&host);
    for line in before.lines().skip(1) {
        assert!(after.contains(line), "{line} gone from\n{after}");
    }
    for soname in ["libc.so.6", "libcudart.so.13", "libz.so"] {
        let line = format!("\t{soname} (libc6,x86-64) => /lib/x86_64-linux-gnu/{soname}\n");
        assert!(after.contains(&line), "{line:?} not in\n{after}");
    }
    let entries = after.lines().count() - 1;
    assert!(entries > 450, "{entries} entries:\n{after}");
    assert_eq!(host.add_system_libraries().unwrap(), 0);
}
