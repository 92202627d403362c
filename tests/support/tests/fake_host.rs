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
