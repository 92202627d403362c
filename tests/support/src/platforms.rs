//! Simulated hosts of the two platforms without NVIDIA's kernel driver: Windows' WSL2 and a
//! Jetson Orin served in NVIDIA's CSV mode. Just files: device nodes made with `mknod`, ELF
//! stubs with real SONAMEs (x86-64 ones, also where a Jetson keeps aarch64 libraries: the
//! container is x86-64 busybox), symlinks and the CSV lists.
//!
//! Where the model comes from:
//! - WSL: the driver-store files NVIDIA's generator requires are its list in
//!   `pkg/nvcdi/driver-wsl.go` (`requiredDriverStoreFiles`); `libdxcore.so` lives in
//!   `/usr/lib/wsl/lib` (`dxcoreLibraries`), the store under `/usr/lib/wsl/drivers/<inf>_amd64_<hash>`
//!   (what `internal/dxcore` returns for an adapter). `/dev/dxg` is a misc character device,
//!   major 10 with a minor the kernel picks at boot: [`DXG_MINOR`] stands for it. The store's
//!   other files and a second, Intel, store are illustrative: they test the rule of
//!   `getAdditionalFilesFromDriverStore` (every `*.so*`, `*.bin`, `*.dll` of NVIDIA's store).
//! - Jetson: the CSV lines are copied from NVIDIA's JetPack 6 Orin lists in
//!   `testdata/lookup/rootfs-orin/etc/nvidia-container-runtime/host-files-for-container.d/`
//!   (`devices.csv`, `drivers.csv`) of nvidia-container-toolkit, and the `dir` and cuDNN lines
//!   from its older sample `tests/input/csv_samples/jetson.csv`. The majors are dynamic on a
//!   Jetson (nvhost, nvgpu) or misc (nvmap): the numbers here stand for them.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::hook_harness::stub;
use crate::host::{make_char_node, make_char_node_mode, write, write_executable as script};

/// `/dev/dxg`: misc major 10, and a minor standing for the one a WSL kernel assigns.
pub const DXG_MINOR: u32 = 125;
/// The NVIDIA driver store's directory name (desktop driver INF, hash illustrative).
pub const WSL_STORE: &str = "nv_dispi.inf_amd64_7f3c1a2b9d4e5f60";

/// The Jetson's device nodes: (path under `/dev`, major, minor).
pub const ORIN_NODES: &[(&str, u32, u32)] = &[
    ("nvhost-ctrl-gpu", 508, 0),
    ("nvhost-gpu", 508, 1),
    ("nvhost-as-gpu", 508, 2),
    ("nvgpu/igpu0/ctrl", 507, 0),
    ("nvgpu/igpu0/channel", 507, 1),
    ("nvmap", 10, 126),
    ("nvidia0", 195, 0),
    ("dri/card0", 226, 0),
    ("dri/renderD128", 226, 128),
];

/// Where the CSV lists live under the Jetson's root (NVIDIA's `mount-spec-path`).
pub const CSV_DIR: &str = "etc/nvidia-container-runtime/host-files-for-container.d";

fn lib(path: &Path, soname: &str) -> Result<()> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    fs::copy(stub(soname), path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

fn link(path: &Path, target: &str) -> Result<()> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    symlink(target, path).with_context(|| format!("linking {} -> {target}", path.display()))
}

fn node(root: &Path, name: &str, major: u32, minor: u32) -> Result<()> {
    let p = root.join("dev").join(name);
    fs::create_dir_all(p.parent().unwrap())?;
    make_char_node(&p, major, minor)
}

/// A WSL2 host under `root`: `/dev/dxg`, `/usr/lib/wsl/lib` and two driver stores.
pub fn build_wsl(root: &Path) -> Result<()> {
    crate::require_root()?;
    node(root, "dxg", 10, DXG_MINOR)?;
    let wsl_lib = root.join("usr/lib/wsl/lib");
    lib(&wsl_lib.join("libdxcore.so"), "libdxcore.so")?;
    // Direct3D's, which NVIDIA's generator does not mount.
    lib(&wsl_lib.join("libd3d12.so"), "libd3d12.so")?;
    let store = root.join("usr/lib/wsl/drivers").join(WSL_STORE);
    for (file, soname) in [
        ("libcuda.so.1.1", "libcuda.so.1"),
        ("libcuda_loader.so", "libcuda_loader.so"),
        (
            "libnvidia-ptxjitcompiler.so.1",
            "libnvidia-ptxjitcompiler.so.1",
        ),
        ("libnvidia-ml.so.1", "libnvidia-ml.so.1"),
        ("libnvidia-ml_loader.so", "libnvidia-ml_loader.so"),
        ("libnvdxgdmal.so.1", "libnvdxgdmal.so.1"),
        ("libnvidia-encode.so.1", "libnvidia-encode.so.1"),
    ] {
        lib(&store.join(file), soname)?;
    }
    write(&store.join("nvcubins.bin"), "nvshim fake cubins\n")?;
    write(
        &store.join("nvptxJitCompiler64.dll"),
        "MZ nvshim fake dll\n",
    )?;
    write(&store.join("nv_dispi.inf"), "; not mounted\n")?;
    script(
        &store.join("nvidia-smi"),
        "#!/bin/sh\necho \"NVIDIA-SMI nvshim fake (WSL driver store)\"\n",
    )?;
    // An Intel adapter's store: no libcuda.so.1.1, so not NVIDIA's.
    let intel = root.join("usr/lib/wsl/drivers/iigd_dch.inf_amd64_0123456789abcdef");
    lib(&intel.join("libigd12umd64.so"), "libigd12umd64.so")?;
    Ok(())
}

/// The CSV lines of the simulated Orin, per file (see the module comment for their source).
pub const ORIN_CSV: &[(&str, &str)] = &[
    (
        "devices.csv",
        "dev, /dev/dri/card*\n\
         dev, /dev/dri/renderD*\n\
         dev, /dev/nvhost-as-gpu\n\
         dev, /dev/nvhost-ctrl-gpu\n\
         dev, /dev/nvhost-ctrl-nvdla0\n\
         dev, /dev/nvhost-gpu\n\
         dev, /dev/nvgpu/igpu0/channel\n\
         dev, /dev/nvgpu/igpu0/ctrl\n\
         dev, /dev/nvidia0\n\
         dev, /dev/nvmap\n",
    ),
    (
        "drivers.csv",
        "lib, /usr/lib/aarch64-linux-gnu/nvidia/libcuda.so.1.1\n\
         lib, /usr/lib/aarch64-linux-gnu/nvidia/libnvidia-ml.so.1\n\
         lib, /usr/lib/aarch64-linux-gnu/nvidia/libnvos.so\n\
         lib, /usr/lib/aarch64-linux-gnu/nvidia/libnvrm_gpu.so\n\
         lib, /usr/lib/aarch64-linux-gnu/nvidia/libnvrm_mem.so\n\
         sym, /usr/lib/aarch64-linux-gnu/libcuda.so\n\
         sym, /usr/lib/aarch64-linux-gnu/nvidia/libcuda.so\n\
         sym, /usr/lib/aarch64-linux-gnu/nvidia/libcuda.so.1\n\
         sym, /usr/lib/aarch64-linux-gnu/tegra\n\
         sym, /usr/share/glvnd/egl_vendor.d/10_nvidia.json\n\
         lib, /usr/sbin/nvidia-smi\n",
    ),
    ("l4t.csv", "dir, /usr/lib/aarch64-linux-gnu/tegra-egl\n"),
    // Read only with NVIDIA_REQUIRE_JETPACK=csv-mounts=all.
    ("cudnn.csv", "lib, /usr/lib/aarch64-linux-gnu/libcudnn.so\n"),
];

/// A Jetson Orin under `root`, served in CSV mode: `/etc/nv_tegra_release`, the CSV lists in
/// [`CSV_DIR`], the nodes of [`ORIN_NODES`] (not `nvhost-ctrl-nvdla0`, which a list names),
/// and the files the lists name.
pub fn build_orin(root: &Path) -> Result<()> {
    crate::require_root()?;
    write(
        &root.join("etc/nv_tegra_release"),
        "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64, DATE: Wed Jan  8 01:49:37 UTC 2025\n",
    )?;
    for (file, text) in ORIN_CSV {
        write(&root.join(CSV_DIR).join(file), text)?;
    }
    for (name, major, minor) in ORIN_NODES {
        node(root, name, *major, *minor)?;
    }
    let lib_dir = root.join("usr/lib/aarch64-linux-gnu");
    let nv = lib_dir.join("nvidia");
    lib(&nv.join("libcuda.so.1.1"), "libcuda.so.1")?;
    link(&nv.join("libcuda.so.1"), "libcuda.so.1.1")?;
    link(&nv.join("libcuda.so"), "libcuda.so.1")?;
    link(&lib_dir.join("libcuda.so"), "nvidia/libcuda.so")?;
    link(&lib_dir.join("tegra"), "nvidia")?;
    lib(&nv.join("libnvidia-ml.so.1"), "libnvidia-ml.so.1")?;
    for l in ["libnvos.so", "libnvrm_gpu.so", "libnvrm_mem.so"] {
        lib(&nv.join(l), l)?;
    }
    write(
        &nv.join("nvidia_egl_vendor.json"),
        "{\"file_format_version\": \"1.0.0\", \"ICD\": {\"library_path\": \"libEGL_nvidia.so.0\"}}\n",
    )?;
    link(
        &root.join("usr/share/glvnd/egl_vendor.d/10_nvidia.json"),
        "/usr/lib/aarch64-linux-gnu/nvidia/nvidia_egl_vendor.json",
    )?;
    lib(
        &lib_dir.join("tegra-egl/libEGL_nvidia.so.0"),
        "libEGL_nvidia.so.0",
    )?;
    lib(&lib_dir.join("libcudnn.so"), "libcudnn.so.9")?;
    script(
        &root.join("usr/sbin/nvidia-smi"),
        "#!/bin/sh\necho \"NVIDIA-SMI nvshim fake (Jetson Orin)\"\n",
    )?;
    Ok(())
}

/// A Jetson Thor under `root`: the Orin's files, and what NVIDIA's Thor fixture
/// (`testdata/lookup/rootfs-thor-dgpu`) adds: the iGPU listed by its driver at PCI
/// `0000:01:00.0`, `/dev/nvidiactl`, `/dev/nvmap` readable by its owner and group 44 only (so
/// the group joins the container's), and the Thor list's `nvidia1` and `nvidiactl` lines (no
/// dGPU here: no `nvidia1` node).
pub fn build_thor(root: &Path) -> Result<()> {
    build_orin(root)?;
    let devices = root.join(CSV_DIR).join("devices.csv");
    let mut text = fs::read_to_string(&devices)?;
    text += "dev, /dev/nvidia1\ndev, /dev/nvidiactl\n";
    write(&devices, &text)?;
    write(
        &root.join("proc/driver/nvidia/gpus/0000:01:00.0/information"),
        "Model: \t\t NVIDIA Thor\nDevice Minor: \t 0\nBus Location: \t 0000:01:00.0\n",
    )?;
    node(root, "nvidiactl", 195, 255)?;
    let nvmap = root.join("dev/nvmap");
    fs::remove_file(&nvmap)?;
    make_char_node_mode(&nvmap, 10, 126, 0o440)?;
    std::os::unix::fs::chown(&nvmap, Some(0), Some(THOR_NVMAP_GID))
        .with_context(|| format!("chown {}", nvmap.display()))?;
    Ok(())
}

/// `/dev/nvmap`'s group on the simulated Thor (NVIDIA's fixture: 44).
pub const THOR_NVMAP_GID: u32 = 44;

/// The container path of the WSL store.
pub fn wsl_store() -> String {
    format!("/usr/lib/wsl/drivers/{WSL_STORE}")
}

/// An nvshim config for a simulated platform host at `root`: driver, dev and proc roots, the
/// log beside the config, and `extra_toml`.
pub fn write_config(root: &Path, config: &Path, extra_toml: &str) -> Result<PathBuf> {
    let dir = config.parent().context("config path has no parent")?;
    let text = format!(
        "low-level-runtimes = [\"runc\"]\ndriver-root = {root:?}\ndev-root = {root:?}\nproc-root = {proc:?}\nlog-file = {log:?}\nlog-level = \"debug\"\ncache-dir = {cache:?}\n{extra_toml}\n",
        root = root.display().to_string(),
        proc = root.join("proc").display().to_string(),
        log = dir.join("nvshim.log").display().to_string(),
        cache = dir.join("cache").display().to_string(),
    );
    write(config, &text)?;
    Ok(config.to_path_buf())
}
