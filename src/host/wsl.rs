//! What a WSL2 host gives GPU containers, as NVIDIA's CDI generator finds it
//! (`pkg/nvcdi/lib-wsl.go`, `driver-wsl.go`, `device-wsl.go`): the `/dev/dxg` node (the GPU
//! paravirtualization device, all GPUs in one), `libdxcore.so` from `/usr/lib/wsl/lib`, and
//! the NVIDIA driver store the Windows driver shares with WSL: its required files, then every
//! other `*.so*`, `*.bin` and `*.dll` in it. NVIDIA asks libdxcore for the adapters' driver
//! stores and takes the one holding `libcuda.so.1.1`; nvshim loads no library for it and looks
//! for that file in the stores under `/usr/lib/wsl/drivers` (where WSL mounts them), which
//! finds the same directory.

use std::fs;
use std::path::PathBuf;

use super::platform::{glob_in, host_file, PlatformError, WSL_LIB_DIR};
use super::{under_root, Host, HostDeviceNode, HostFile};

/// Where WSL mounts the Windows driver stores.
pub const DRIVER_STORE_ROOT: &str = "/usr/lib/wsl/drivers";

/// The file that marks NVIDIA's store (`driver-wsl.go`, `libcudaSo`).
const LIBCUDA: &str = "libcuda.so.1.1";

/// The files NVIDIA's generator looks for in the store first (`requiredDriverStoreFiles`).
pub const REQUIRED: &[&str] = &[
    "libcuda.so.1.1",
    "libcuda_loader.so",
    "libnvidia-ptxjitcompiler.so.1",
    "libnvidia-ml.so.1",
    "libnvidia-ml_loader.so",
    "libnvdxgdmal.so.1",
    "nvcubins.bin",
    "nvidia-smi",
];

/// The WSL driver as found on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WslDriver {
    pub dxg: HostDeviceNode,
    /// The store's directory, as the container sees it.
    pub store: String,
    /// `libdxcore.so`, the store's required files found, then its other files; each mounted
    /// at its own path.
    pub files: Vec<HostFile>,
    /// Required files the store lacks (NVIDIA's generator skips them too).
    pub missing: Vec<&'static str>,
    /// The store's `nvidia-smi`, linked from `/usr/bin/nvidia-smi` in the container.
    pub smi: Option<String>,
}

/// Finds the WSL driver. No `/dev/dxg`, no `libdxcore.so` or no store with `libcuda.so.1.1`
/// is an error: a container would have no GPU.
pub fn discover(host: &Host) -> Result<WslDriver, PlatformError> {
    let roots = host.roots();
    let root = &roots.driver_root;
    let dxg = host
        .device_node("dxg")
        .ok_or_else(|| PlatformError::NoDxg {
            path: roots.dev_root.join("dev/dxg"),
        })?;
    let dxcore = under_root(root, &format!("{WSL_LIB_DIR}/libdxcore.so"));
    if !dxcore.is_file() {
        return Err(PlatformError::NoDxcore { path: dxcore });
    }
    let stores_dir = under_root(root, DRIVER_STORE_ROOT);
    let mut stores: Vec<PathBuf> = fs::read_dir(&stores_dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    stores.sort();
    let store = stores
        .into_iter()
        .find(|s| s.join(LIBCUDA).is_file())
        .ok_or(PlatformError::NoDriverStore { dir: stores_dir })?;
    let mut files: Vec<HostFile> = host_file(root, dxcore).into_iter().collect();
    let mut missing = Vec::new();
    let mut smi = None;
    for name in REQUIRED {
        match host_file(root, store.join(name)).filter(|f| f.host_path.is_file()) {
            Some(f) => {
                if *name == "nvidia-smi" {
                    smi = Some(f.container_path.clone());
                }
                files.push(f);
            }
            None => missing.push(*name),
        }
    }
    for pattern in ["*.so*", "*.bin", "*.dll"] {
        for p in glob_in(&store, pattern) {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
            if name.is_some_and(|n| REQUIRED.contains(&n.as_str())) || !p.is_file() {
                continue;
            }
            files.extend(host_file(root, p));
        }
    }
    Ok(WslDriver {
        dxg,
        store: super::platform::container_path(root, &store).unwrap_or_default(),
        files,
        missing,
        smi,
    })
}
