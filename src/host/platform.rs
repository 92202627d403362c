//! Which kind of host this is: one with NVIDIA's kernel driver (`nvml`), Windows' WSL2
//! (`wsl`), or a Jetson served from NVIDIA's CSV file lists (`csv`). NVIDIA's runtime decides
//! the same way (go-nvlib `pkg/nvlib/info/resolver.go`, `property-extractor.go`): WSL when
//! `libdxcore.so` is there; Tegra when `/etc/nv_tegra_release` exists or
//! `/sys/devices/soc0/family` starts with `tegra`, and either NVML is absent or a GPU is
//! integrated. NVIDIA asks NVML for that (no `libnvidia-ml.so.1`; a GPU named `(nvgpu)` or
//! `NVIDIA Thor`, or at PCI `0000:01:00.0`); nvshim loads nothing and asks the kernel instead:
//! an Orin's nvgpu driver has no `/proc/driver/nvidia/gpus`, a Thor's driver lists its iGPU
//! there at `0000:01:00.0`. Both are served from the CSV lists, as NVIDIA serves them; Tegra
//! files beside discrete GPUs only are an NVIDIA-driver host.

use std::fs;
use std::path::{Path, PathBuf};

use thiserror::Error;

use super::{under_root, Host, HostFile};
use crate::config::Platform;

/// The driver store's and dxcore's directory under the driver root on WSL.
pub const WSL_LIB_DIR: &str = "/usr/lib/wsl/lib";

#[derive(Debug, Error)]
pub enum PlatformError {
    #[error("WSL: no {path}: the container would start without its GPU; is the Windows NVIDIA driver installed and `nvidia-smi` working in this WSL distribution? (`wsl --update` on Windows brings the GPU paravirtualization)")]
    NoDxg { path: PathBuf },
    #[error("WSL: no {path}: CUDA on WSL loads it; update WSL on Windows (`wsl --update`), or set platform = \"nvml\" in the nvshim config if this is not a WSL host")]
    NoDxcore { path: PathBuf },
    #[error("WSL: no driver store under {dir} holds libcuda.so.1.1; install the Windows NVIDIA driver (it shares its store with WSL), then run `nvidia-smi` in WSL to check")]
    NoDriverStore { dir: PathBuf },
    #[error("WSL exposes the GPUs as one device, /dev/dxg: NVIDIA_VISIBLE_DEVICES={value} names GPUs it cannot pick; ask for NVIDIA_VISIBLE_DEVICES=all (NVIDIA's runtime refuses these ids on WSL too)")]
    WslDeviceIds { value: String },
    #[error("Jetson (CSV mode): no CSV file lists in {dir} ({which}); install NVIDIA's nvidia-container package of JetPack, which writes them, or set csv-mount-spec-path in the nvshim config to where they are")]
    NoCsvFiles { dir: PathBuf, which: &'static str },
    #[error("Jetson (CSV mode): {path} is owned by uid {uid} with mode {mode:o}: the CSV lists name the host files and devices every GPU container gets, so they and their directory must be owned by root and writable by no one else; `chown root: {path}; chmod go-w {path}`")]
    UntrustedCsv { path: PathBuf, uid: u32, mode: u32 },
    #[error("cannot read the CSV file list {path}: {source}; make it readable or remove it")]
    CsvRead {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("Jetson (CSV mode): none of the device nodes the CSV files {files} list exists under {dev}: the container would start without its GPU; is the GPU driver loaded (`ls /dev/nvhost-* /dev/nvgpu`)?")]
    NoCsvDevices { files: String, dev: PathBuf },
    #[error("Jetson (CSV mode) has one GPU, device 0: NVIDIA_VISIBLE_DEVICES={value} names one it does not have; ask for 0 or all (NVIDIA's CSV mode accepts only those)")]
    CsvDeviceIds { value: String },
    #[error("{what} asks for what a {platform} host does not have (IMEX channels and MIG capabilities need NVIDIA's datacenter driver); remove {what} from the container's environment")]
    Unsupported {
        what: &'static str,
        platform: &'static str,
    },
    #[error("NVIDIA_VISIBLE_DEVICES={value}: the container is unprivileged and accept-envvar-unprivileged = \"allocation-backed\", and on this {platform} host no device-plugin allocation can back a GPU id; unset NVIDIA_VISIBLE_DEVICES in the pod")]
    Unbacked {
        value: String,
        platform: &'static str,
    },
}

/// The platform `setting` names, or the one detected on `host` for `auto`, with why.
pub fn detect(host: &Host, setting: Platform) -> (Platform, String) {
    if setting != Platform::Auto {
        return (
            setting,
            format!("platform = \"{}\" in the config", setting.name()),
        );
    }
    let root = &host.roots().driver_root;
    let dxcore = under_root(root, &format!("{WSL_LIB_DIR}/libdxcore.so"));
    if dxcore.is_file() {
        return (Platform::Wsl, format!("{} found", dxcore.display()));
    }
    let release = under_root(root, "/etc/nv_tegra_release");
    let family = host.sys_root().join("devices/soc0/family");
    let tegra = if release.is_file() {
        Some(format!("{} found", release.display()))
    } else {
        fs::read_to_string(&family)
            .ok()
            .filter(|f| f.to_ascii_lowercase().starts_with("tegra"))
            .map(|_| format!("{} says tegra", family.display()))
    };
    let Some(why) = tegra else {
        return (Platform::Nvml, "no WSL or Jetson files".into());
    };
    // A Thor's iGPU is always at 0000:01:00.0 (`isIntegratedGPU`, `pkg/nvcdi/lib-csv.go`).
    let gpus = host.roots().proc_root.join("driver/nvidia/gpus");
    let buses: Vec<String> = fs::read_dir(&gpus)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().to_ascii_lowercase())
                .collect()
        })
        .unwrap_or_default();
    if buses.is_empty() {
        return (
            Platform::Csv,
            format!("{why} and no GPU under {} (an Orin)", gpus.display()),
        );
    }
    if buses.iter().any(|b| b.starts_with("0000:01:00.")) {
        return (
            Platform::Csv,
            format!("{why} and an integrated GPU at 0000:01:00.0 (a Thor)"),
        );
    }
    (
        Platform::Nvml,
        format!(
            "{why}, but only discrete GPUs under {}: served through the NVIDIA driver",
            gpus.display()
        ),
    )
}

/// The container path of a host path under `root` (`<root>/usr/lib/x` → `/usr/lib/x`).
pub(crate) fn container_path(root: &Path, host_path: &Path) -> Option<String> {
    let rel = host_path.strip_prefix(root).ok()?;
    Some(format!("/{}", rel.to_string_lossy()))
}

/// A file under the driver root mounted at its own path.
pub(crate) fn host_file(root: &Path, host_path: PathBuf) -> Option<HostFile> {
    let container_path = container_path(root, &host_path)?;
    Some(HostFile {
        host_path,
        container_path,
    })
}

/// A library's `DT_SONAME`, as ldconfig reads it (`None`: not a library of this machine).
pub(crate) fn soname(path: &Path) -> Option<String> {
    let file = fs::File::open(path).ok()?;
    let size = file.metadata().ok()?.len();
    let info = nvshim_hook::elf::inspect(&file, size, nvshim_hook::elf::Arch::host()?)?;
    String::from_utf8(info.soname?).ok()
}

/// The entries of `dir` whose names match the glob `pattern` (one path component), sorted.
pub(crate) fn glob_in(dir: &Path, pattern: &str) -> Vec<PathBuf> {
    if !pattern.contains(['*', '?', '[']) {
        let p = dir.join(pattern);
        return if fs::symlink_metadata(&p).is_ok() {
            vec![p]
        } else {
            Vec::new()
        };
    }
    let mut out: Vec<PathBuf> = fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    nvshim_hook::ldconfig::fnmatch(
                        pattern.as_bytes(),
                        e.file_name().as_encoded_bytes(),
                    )
                })
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::HostRoots;

    fn host(root: &Path) -> Host {
        Host::new(HostRoots {
            driver_root: root.into(),
            dev_root: root.into(),
            proc_root: root.join("proc"),
        })
    }

    /// go-nvlib's order: WSL first, then Tegra files without a discrete driver, else NVML;
    /// a setting other than `auto` wins.
    #[test]
    fn detects_wsl_then_tegra_then_nvml() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let p = |r: &Path| detect(&host(r), Platform::Auto).0;
        assert_eq!(p(root), Platform::Nvml);
        fs::create_dir_all(root.join("sys/devices/soc0")).unwrap();
        fs::write(root.join("sys/devices/soc0/family"), "Tegra\n").unwrap();
        assert_eq!(p(root), Platform::Csv);
        // A Thor: its iGPU at 0000:01:00.0 in /proc, as NVIDIA's Tegra platform.
        fs::create_dir_all(root.join("proc/driver/nvidia/gpus/0000:01:00.0")).unwrap();
        assert_eq!(p(root), Platform::Csv);
        // Discrete GPUs only beside the Tegra files: the NVIDIA driver's host.
        fs::remove_dir(root.join("proc/driver/nvidia/gpus/0000:01:00.0")).unwrap();
        fs::create_dir_all(root.join("proc/driver/nvidia/gpus/0005:03:00.0")).unwrap();
        assert_eq!(p(root), Platform::Nvml);
        fs::create_dir_all(root.join("usr/lib/wsl/lib")).unwrap();
        fs::write(root.join("usr/lib/wsl/lib/libdxcore.so"), "").unwrap();
        assert_eq!(p(root), Platform::Wsl);
        assert_eq!(detect(&host(root), Platform::Csv).0, Platform::Csv);
    }
}
