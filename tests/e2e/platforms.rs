//! The hosts without NVIDIA's kernel driver that NVIDIA's runtime serves: WSL2 and a Jetson
//! Orin in CSV mode (`tests/support/src/platforms.rs` builds them and says where each file
//! list comes from). Each test runs a busybox container through nvshim-runtime over real runc,
//! by `NVIDIA_VISIBLE_DEVICES` and by the CDI spec `nvshim cdi generate` writes, and checks
//! from inside what NVIDIA's runtime gives there:
//! - WSL (`pkg/nvcdi/lib-wsl.go`, `driver-wsl.go`, `device-wsl.go` of
//!   nvidia-container-toolkit): `/dev/dxg` and no `/dev/nvidia*`; `libdxcore.so` from
//!   `/usr/lib/wsl/lib` and not its other files; the NVIDIA driver store's required files and
//!   its other `*.so*`, `*.bin`, `*.dll`, not its other files, nor another adapter's store; the
//!   `/usr/bin/nvidia-smi` link to the store's; both folders in the ld.so.cache.
//! - CSV (`pkg/nvcdi/lib-csv.go`, `internal/platform-support/tegra/{csv,tegra,symlinks}.go`,
//!   `internal/discover/symlinks.go`, `internal/modifier/{csv,cdi}.go`): the listed nodes that
//!   exist (globs expanded), the `lib` files, each hop of the `sym` chains recreated, no link for
//!   a `sym` that ends in a directory (NVIDIA's locator takes files only), the `dir`
//!   directories, `/etc/nv_tegra_release`, the libraries in the ld.so.cache, and the other CSV
//!   files only with `NVIDIA_REQUIRE_JETPACK=csv-mounts=all`.

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use nvshim_testsupport::platforms::{self, DXG_MINOR, ORIN_NODES};
use nvshim_testsupport::{unique_id, Bundle, Runtime};
use tempfile::TempDir;

use super::common::{hook_path, shim_at, shim_log, NVSHIM, SHIM};

/// A simulated platform host, its nvshim config and a CDI spec dir.
struct Host {
    tmp: TempDir,
    root: PathBuf,
    config: PathBuf,
    cdi: PathBuf,
}

impl Host {
    fn new(build: fn(&Path) -> anyhow::Result<()>, extra_toml: &str) -> Host {
        let tmp = TempDir::new().unwrap();
        let root = tmp.path().join("host");
        fs::create_dir_all(&root).unwrap();
        build(&root).unwrap();
        let cdi = tmp.path().join("cdi");
        fs::create_dir_all(&cdi).unwrap();
        let config = tmp.path().join("nvshim/config.toml");
        let toml = format!(
            "hook-path = {:?}\ncdi-spec-dirs = [{:?}]\ncsv-mount-spec-path = {:?}\n{extra_toml}",
            hook_path().display().to_string(),
            cdi.display().to_string(),
            root.join(platforms::CSV_DIR).display().to_string(),
        );
        platforms::write_config(&root, &config, &toml).unwrap();
        Host {
            tmp,
            root,
            config,
            cdi,
        }
    }

    fn shim(&self) -> Runtime {
        shim_at(SHIM, self.tmp.path(), &self.config)
    }

    fn nvshim(&self, args: &[&str]) -> std::process::Output {
        Command::new(NVSHIM)
            .args(args)
            .env("NVSHIM_CONFIG", &self.config)
            .env("PATH", "")
            .output()
            .unwrap()
    }

    /// A bundle running [`script`] over `devs` and `paths`, with `env`.
    fn bundle(&self, devs: &[String], paths: &[String], env: &[(&str, &str)]) -> Bundle {
        let b = Bundle::new(
            &self.tmp.path().join(unique_id("b")),
            &["/bin/sh", "-c", &script(devs, paths)],
        )
        .unwrap();
        for (k, v) in env {
            b.set_env(k, v).unwrap();
        }
        b
    }

    /// Runs `bundle` through nvshim-runtime; its output, the run having succeeded.
    fn run(&self, bundle: &Bundle) -> String {
        let out = self.shim().run(bundle, &unique_id("plat")).unwrap();
        if std::env::var_os("NVSHIM_E2E_VERBOSE").is_some() {
            eprintln!("{out}");
        }
        assert!(
            out.success() && out.stdout.contains("PROBE_DONE"),
            "the container did not run to completion\n{out}\n--- nvshim.log ---\n{}",
            shim_log(&self.config)
        );
        out.stdout
    }

    /// Runs `bundle`; the runtime's error, the run having failed and config.json unchanged.
    fn refused(&self, bundle: &Bundle) -> String {
        let before = bundle.config_bytes().unwrap();
        let out = self.shim().run(bundle, &unique_id("plat")).unwrap();
        assert!(!out.success(), "the container ran\n{out}");
        assert_eq!(
            bundle.config_bytes().unwrap(),
            before,
            "config.json changed"
        );
        out.stderr
    }

    /// `nvshim cdi generate` into the spec dir.
    fn generate(&self) -> String {
        let path = self.cdi.join("nvidia.yaml");
        let out = self.nvshim(&["cdi", "generate", "--output", path.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "nvshim cdi generate failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        fs::read_to_string(path).unwrap()
    }
}

/// The in-container check: per device `DEV <path> <major hex>:<minor hex>` or `NODEV <path>`;
/// per path `LINK <path> <target>`, `FILE`, `DIR` or `ABSENT`; `LDP` lines of `ldconfig -p`;
/// `SMI` and `nvidia-smi`'s output from `PATH`; no `/dev/nvidia*` but those listed.
fn script(devs: &[String], paths: &[String]) -> String {
    let mut s = String::new();
    for d in devs {
        s += &format!(
            "if [ -c {d} ]; then echo \"DEV {d} $(stat -c %t:%T {d})\"; else echo \"NODEV {d}\"; fi\n"
        );
    }
    for p in paths {
        s += &format!(
            "if [ -L {p} ]; then echo \"LINK {p} $(readlink {p})\"; elif [ -f {p} ]; then echo \"FILE {p}\"; elif [ -d {p} ]; then echo \"DIR {p}\"; else echo \"ABSENT {p}\"; fi\n"
        );
    }
    s += "echo \"GROUPS $(id -G)\"\n";
    s += "for f in /dev/nvidia*; do [ -e \"$f\" ] && echo \"NVDEV $f\"; done\n";
    s += "/sbin/ldconfig -p | while IFS= read -r l; do echo \"LDP $l\"; done\n";
    s += "echo \"SMI $(PATH=/usr/bin:/usr/sbin:/bin nvidia-smi 2>&1)\"\necho PROBE_DONE\n";
    s
}

fn lines(out: &str) -> BTreeSet<String> {
    out.lines().map(|l| l.trim().to_string()).collect()
}

fn assert_lines(out: &str, expected: &[String], what: &str) {
    let got = lines(out);
    let missing: Vec<&String> = expected.iter().filter(|e| !got.contains(*e)).collect();
    assert!(
        missing.is_empty(),
        "{what}: missing {missing:#?}\n--- output ---\n{out}"
    );
}

/// `ldconfig -p` in the container lists `soname` at a path under `dir`.
fn assert_ldcache(out: &str, soname: &str, dir: &str) {
    assert!(
        out.lines()
            .any(|l| l.starts_with(&format!("LDP \t{soname} ("))
                && l.contains(&format!("=> {dir}/"))),
        "ldconfig -p does not list {soname} in {dir}\n{out}"
    );
}

/// NVIDIA's `requiredDriverStoreFiles` (`pkg/nvcdi/driver-wsl.go`), written out here rather
/// than taken from `src/host/wsl.rs`, so that the test checks nvshim's list against NVIDIA's.
const WSL_REQUIRED: &[&str] = &[
    "libcuda.so.1.1",
    "libcuda_loader.so",
    "libnvidia-ptxjitcompiler.so.1",
    "libnvidia-ml.so.1",
    "libnvidia-ml_loader.so",
    "libnvdxgdmal.so.1",
    "nvcubins.bin",
    "nvidia-smi",
];

fn wsl_paths() -> Vec<String> {
    let store = platforms::wsl_store();
    let mut p: Vec<String> = WSL_REQUIRED
        .iter()
        .map(|f| format!("{store}/{f}"))
        .collect();
    for f in [
        "libnvidia-encode.so.1",
        "nvptxJitCompiler64.dll",
        "nv_dispi.inf",
        "libcuda.so.1",
    ] {
        p.push(format!("{store}/{f}"));
    }
    p.extend(
        [
            "/usr/lib/wsl/lib/libdxcore.so",
            "/usr/lib/wsl/lib/libd3d12.so",
            "/usr/lib/wsl/drivers/iigd_dch.inf_amd64_0123456789abcdef/libigd12umd64.so",
            "/usr/bin/nvidia-smi",
        ]
        .map(String::from),
    );
    p
}

/// What NVIDIA's runtime gives a WSL container asking for `all`.
fn wsl_expected() -> Vec<String> {
    let store = platforms::wsl_store();
    let mut e = vec![format!("DEV /dev/dxg a:{DXG_MINOR:x}")];
    for f in WSL_REQUIRED
        .iter()
        .chain(&["libnvidia-encode.so.1", "nvptxJitCompiler64.dll"])
    {
        e.push(format!("FILE {store}/{f}"));
    }
    e.extend([
        "FILE /usr/lib/wsl/lib/libdxcore.so".to_string(),
        format!("LINK /usr/bin/nvidia-smi {store}/nvidia-smi"),
        // The SONAME link ldconfig makes in NVIDIA's update-ldcache hook.
        format!("LINK {store}/libcuda.so.1 libcuda.so.1.1"),
        format!("ABSENT {store}/nv_dispi.inf"),
        "ABSENT /usr/lib/wsl/lib/libd3d12.so".to_string(),
        "ABSENT /usr/lib/wsl/drivers/iigd_dch.inf_amd64_0123456789abcdef/libigd12umd64.so"
            .to_string(),
        "SMI NVIDIA-SMI nvshim fake (WSL driver store)".to_string(),
    ]);
    e
}

fn assert_wsl_container(out: &str, what: &str) {
    assert_lines(out, &wsl_expected(), what);
    assert!(
        !out.contains("NVDEV"),
        "{what}: /dev/nvidia* in a WSL container\n{out}"
    );
    let store = platforms::wsl_store();
    assert_ldcache(out, "libcuda.so.1", &store);
    assert_ldcache(out, "libnvidia-ml.so.1", &store);
    assert_ldcache(out, "libdxcore.so", "/usr/lib/wsl/lib");
}

/// WSL by `NVIDIA_VISIBLE_DEVICES=all` and by the generated spec's `nvidia.com/gpu=all`: the
/// dxg node and the driver store as NVIDIA's runtime injects them; the same from both.
#[test]
fn wsl_all_gets_dxg_and_the_driver_store_as_nvidia_gives_them() {
    let h = Host::new(platforms::build_wsl, "");
    let devs = vec!["/dev/dxg".to_string(), "/dev/nvidiactl".to_string()];
    let legacy = h.run(&h.bundle(&devs, &wsl_paths(), &[("NVIDIA_VISIBLE_DEVICES", "all")]));
    assert_wsl_container(&legacy, "NVIDIA_VISIBLE_DEVICES=all");
    assert!(legacy.contains("NODEV /dev/nvidiactl"), "{legacy}");
    // `nvshim explain` shows the same plan without running it.
    let b = h.bundle(&devs, &[], &[("NVIDIA_VISIBLE_DEVICES", "all")]);
    let out = h.nvshim(&[
        "explain",
        "--format",
        "json",
        "--bundle",
        b.dir().to_str().unwrap(),
    ]);
    let e: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(0), "{e:#}");
    assert_eq!(e["route"]["mode"], "legacy", "{e:#}");
    assert!(e["groups"].to_string().contains("/dev/dxg"), "{e:#}");

    let spec = h.generate();
    assert!(
        spec.contains("name: all") && !spec.contains("name: \"0\""),
        "{spec}"
    );
    let cdi = h.run(&h.bundle(
        &devs,
        &wsl_paths(),
        &[("NVIDIA_VISIBLE_DEVICES", "nvidia.com/gpu=all")],
    ));
    assert_wsl_container(&cdi, "the generated spec's nvidia.com/gpu=all");
    assert_eq!(
        lines(&cdi),
        lines(&legacy),
        "the CDI path differs from the env path"
    );
}

/// WSL's one device cannot be split: a GPU index is refused as NVIDIA's runtime refuses it
/// (its WSL spec has only `all`); no `/dev/dxg` fails naming the node; `none` gets the driver
/// store without the node; IMEX and MIG variables fail the create.
#[test]
fn wsl_refuses_gpu_ids_and_a_missing_dxg() {
    let h = Host::new(platforms::build_wsl, "");
    let devs = vec!["/dev/dxg".to_string()];
    let err = h.refused(&h.bundle(&devs, &[], &[("NVIDIA_VISIBLE_DEVICES", "0")]));
    assert!(err.contains("WSL exposes the GPUs as one device"), "{err}");
    let none = h.run(&h.bundle(&devs, &wsl_paths(), &[("NVIDIA_VISIBLE_DEVICES", "none")]));
    assert!(none.contains("NODEV /dev/dxg"), "{none}");
    assert!(
        none.contains(&format!("FILE {}/libcuda.so.1.1", platforms::wsl_store())),
        "{none}"
    );
    // IMEX channels and MIG capabilities need the datacenter driver: refused, not dropped.
    for var in ["NVIDIA_IMEX_CHANNELS", "NVIDIA_MIG_CONFIG_DEVICES"] {
        let b = h.bundle(&devs, &[], &[("NVIDIA_VISIBLE_DEVICES", "all"), (var, "0")]);
        b.edit(|c| {
            let caps = c
                .pointer_mut("/process/capabilities/bounding")
                .and_then(serde_json::Value::as_array_mut)
                .unwrap();
            caps.push("CAP_SYS_ADMIN".into());
            Ok(())
        })
        .unwrap();
        let err = h.refused(&b);
        assert!(err.contains(&format!("remove {var}")), "{err}");
    }
    fs::remove_file(h.root.join("dev/dxg")).unwrap();
    let err = h.refused(&h.bundle(&devs, &[], &[("NVIDIA_VISIBLE_DEVICES", "all")]));
    assert!(
        err.contains("dev/dxg") && err.contains("wsl --update"),
        "{err}"
    );
}

fn orin_devs() -> Vec<String> {
    let mut d: Vec<String> = ORIN_NODES
        .iter()
        .map(|(n, _, _)| format!("/dev/{n}"))
        .collect();
    d.push("/dev/nvhost-ctrl-nvdla0".into());
    d
}

const AARCH64: &str = "/usr/lib/aarch64-linux-gnu";

fn orin_paths() -> Vec<String> {
    [
        "nvidia/libcuda.so.1.1",
        "nvidia/libcuda.so.1",
        "nvidia/libcuda.so",
        "libcuda.so",
        "tegra",
        "nvidia/libnvidia-ml.so.1",
        "nvidia/libnvos.so",
        "nvidia/libnvrm_gpu.so",
        "nvidia/libnvrm_mem.so",
        "nvidia/nvidia_egl_vendor.json",
        "tegra-egl",
        "tegra-egl/libEGL_nvidia.so.0",
        "libcudnn.so",
    ]
    .iter()
    .map(|p| format!("{AARCH64}/{p}"))
    .chain(
        [
            "/usr/share/glvnd/egl_vendor.d/10_nvidia.json",
            "/usr/sbin/nvidia-smi",
            "/etc/nv_tegra_release",
        ]
        .map(String::from),
    )
    .collect()
}

/// What NVIDIA's CSV mode gives an Orin container asking for `all` (or `0`).
fn orin_expected() -> Vec<String> {
    let mut e: Vec<String> = ORIN_NODES
        .iter()
        .map(|(n, major, minor)| format!("DEV /dev/{n} {major:x}:{minor:x}"))
        .collect();
    e.push("NODEV /dev/nvhost-ctrl-nvdla0".into());
    for (kind, p) in [
        ("FILE", "nvidia/libcuda.so.1.1"),
        ("LINK", "nvidia/libcuda.so.1 libcuda.so.1.1"),
        ("LINK", "nvidia/libcuda.so libcuda.so.1"),
        ("LINK", "libcuda.so nvidia/libcuda.so"),
        ("ABSENT", "tegra"),
        ("FILE", "nvidia/libnvidia-ml.so.1"),
        ("FILE", "nvidia/libnvos.so"),
        ("FILE", "nvidia/libnvrm_gpu.so"),
        ("FILE", "nvidia/libnvrm_mem.so"),
        ("FILE", "nvidia/nvidia_egl_vendor.json"),
        ("DIR", "tegra-egl"),
        ("FILE", "tegra-egl/libEGL_nvidia.so.0"),
        ("ABSENT", "libcudnn.so"),
    ] {
        e.push(format!("{kind} {AARCH64}/{p}"));
    }
    e.extend([
        format!("LINK /usr/share/glvnd/egl_vendor.d/10_nvidia.json {AARCH64}/nvidia/nvidia_egl_vendor.json"),
        "FILE /usr/sbin/nvidia-smi".to_string(),
        "FILE /etc/nv_tegra_release".to_string(),
        "SMI NVIDIA-SMI nvshim fake (Jetson Orin)".to_string(),
    ]);
    e
}

fn assert_orin_container(out: &str, what: &str) {
    assert_lines(out, &orin_expected(), what);
    let nv = format!("{AARCH64}/nvidia");
    assert_ldcache(out, "libcuda.so.1", &nv);
    assert_ldcache(out, "libnvrm_gpu.so", &nv);
    assert_ldcache(out, "libnvidia-ml.so.1", &nv);
}

/// A Jetson Orin by `NVIDIA_VISIBLE_DEVICES=all` and `0`, and by the generated spec: what the
/// CSV lists name, as NVIDIA's CSV mode serves it, the same from each.
#[test]
fn orin_csv_lists_give_their_nodes_files_and_links_as_nvidia_does() {
    let h = Host::new(platforms::build_orin, "");
    let all = h.run(&h.bundle(
        &orin_devs(),
        &orin_paths(),
        &[("NVIDIA_VISIBLE_DEVICES", "all")],
    ));
    assert_orin_container(&all, "NVIDIA_VISIBLE_DEVICES=all");
    let zero = h.run(&h.bundle(
        &orin_devs(),
        &orin_paths(),
        &[("NVIDIA_VISIBLE_DEVICES", "0")],
    ));
    assert_eq!(lines(&zero), lines(&all), "0 and all differ");

    let spec = h.generate();
    assert!(
        spec.contains("name: all") && spec.contains("name: \"0\""),
        "{spec}"
    );
    let cdi = h.run(&h.bundle(
        &orin_devs(),
        &orin_paths(),
        &[("NVIDIA_VISIBLE_DEVICES", "nvidia.com/gpu=0")],
    ));
    assert_orin_container(&cdi, "the generated spec's nvidia.com/gpu=0");
    assert_eq!(
        lines(&cdi),
        lines(&all),
        "the CDI path differs from the env path"
    );
}

/// A Jetson Thor (its iGPU in `/proc` at 0000:01:00.0) is served from its CSV lists too, as
/// NVIDIA's Tegra platform serves it (`HasAnIntegratedGPU`, go-nvlib `info/resolver.go`):
/// the Orin's nodes and files plus `nvidiactl`, and `/dev/nvmap`'s group (the node is not
/// world-usable) among the process's groups, as NVIDIA's `internal/edits/device.go` adds it.
#[test]
fn thor_is_served_from_its_csv_lists_with_the_nvmap_group() {
    let h = Host::new(platforms::build_thor, "");
    let mut devs = orin_devs();
    devs.extend(["/dev/nvidiactl".to_string(), "/dev/nvidia1".to_string()]);
    let out = h.run(&h.bundle(&devs, &orin_paths(), &[("NVIDIA_VISIBLE_DEVICES", "all")]));
    assert_orin_container(&out, "Thor, NVIDIA_VISIBLE_DEVICES=all");
    assert_lines(
        &out,
        &[
            "DEV /dev/nvidiactl c3:ff".into(),
            "NODEV /dev/nvidia1".into(),
        ],
        "Thor",
    );
    let groups = out
        .lines()
        .find_map(|l| l.strip_prefix("GROUPS "))
        .unwrap_or("");
    assert!(
        groups
            .split(' ')
            .any(|g| g == platforms::THOR_NVMAP_GID.to_string()),
        "nvmap's group is not among the process's: {groups}\n{out}"
    );
    let doctor = String::from_utf8_lossy(&h.nvshim(&["doctor"]).stdout).into_owned();
    assert!(doctor.contains("a Thor"), "{doctor}");
}

/// `NVIDIA_REQUIRE_JETPACK=csv-mounts=all` adds the CSV files beyond the base ones
/// (`internal/modifier/cdi.go`); another GPU id is refused as NVIDIA's pure-CSV mode refuses
/// it; no CSV lists, or no listed node, fails naming the directory, not a GPU-less start.
#[test]
fn orin_csv_mounts_all_other_ids_and_missing_lists() {
    let h = Host::new(platforms::build_orin, "");
    let out = h.run(&h.bundle(
        &[],
        &orin_paths(),
        &[
            ("NVIDIA_VISIBLE_DEVICES", "all"),
            ("NVIDIA_REQUIRE_JETPACK", "csv-mounts=all"),
        ],
    ));
    assert!(
        out.contains(&format!("FILE {AARCH64}/libcudnn.so")),
        "{out}"
    );
    assert_ldcache(&out, "libcudnn.so.9", AARCH64);

    let err = h.refused(&h.bundle(&[], &[], &[("NVIDIA_VISIBLE_DEVICES", "1")]));
    assert!(err.contains("has one GPU, device 0"), "{err}");

    // A list others can write would let them give every GPU container any host file or
    // device: refused, naming it.
    let devices_csv = h.root.join(platforms::CSV_DIR).join("devices.csv");
    fs::set_permissions(&devices_csv, fs::Permissions::from_mode(0o666)).unwrap();
    let err = h.refused(&h.bundle(&[], &[], &[("NVIDIA_VISIBLE_DEVICES", "all")]));
    assert!(
        err.contains(&devices_csv.display().to_string()) && err.contains("writable by no one else"),
        "{err}"
    );
    fs::set_permissions(&devices_csv, fs::Permissions::from_mode(0o644)).unwrap();

    for (name, _, _) in ORIN_NODES {
        fs::remove_file(h.root.join("dev").join(name)).unwrap();
    }
    let err = h.refused(&h.bundle(&[], &[], &[("NVIDIA_VISIBLE_DEVICES", "all")]));
    assert!(err.contains("none of the device nodes"), "{err}");

    let csv_dir = h.root.join(platforms::CSV_DIR);
    fs::remove_dir_all(&csv_dir).unwrap();
    let err = h.refused(&h.bundle(&[], &[], &[("NVIDIA_VISIBLE_DEVICES", "all")]));
    assert!(
        err.contains(&csv_dir.display().to_string()) && err.contains("csv-mount-spec-path"),
        "{err}"
    );
}

/// `nvshim doctor` says which platform it detected and what it found there.
#[test]
fn doctor_names_the_detected_platform() {
    for (build, platform, found) in [
        (
            platforms::build_wsl as fn(&Path) -> anyhow::Result<()>,
            "wsl",
            "driver store /usr/lib/wsl/drivers/",
        ),
        (platforms::build_orin, "csv", "9 device nodes"),
    ] {
        let h = Host::new(build, "");
        let out = h.nvshim(&["doctor"]);
        let text = String::from_utf8_lossy(&out.stdout);
        let line = |name: &str| {
            text.lines()
                .find(|l| l.contains(name))
                .unwrap_or_else(|| panic!("no {name} line\n{text}"))
                .to_string()
        };
        assert!(line("platform").contains(platform), "{text}");
        assert!(line("platform-driver").contains(found), "{text}");
    }
}
