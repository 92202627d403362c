//! The feature-gated devices of an HGX node, which NVIDIA's runtime gives a GPU container that
//! sets `NVIDIA_GDS`, `NVIDIA_MOFED`, `NVIDIA_GDRCOPY` or `NVIDIA_NVSWITCH` to `enabled`
//! (nvidia-container-toolkit `internal/discover/{gds,mofed,gdrcopy,nvswitch}.go` name the nodes,
//! `internal/discover/gds.go` the two GDS files): optional in [`crate::FakeHostSpec`]
//! (`gated`), so hosts without them stay as they were.
//!
//! The model: names, minors and `/proc/devices` names as the kernel modules register them.
//! `infiniband_verbs` has the fixed major 231, uverbs minors from 192 (Linux
//! `drivers/infiniband/core/uverbs_main.c`, `IB_UVERBS_MAJOR`, `IB_UVERBS_BASE_MINOR`), and
//! `infiniband_mad` shares 231 (`user_mad.c`); `rdma_cm` is a misc device (major 10) with a
//! dynamic minor (`ucma.c`; 58 here, in the range kernels before 6.x hand out from 63 down); `nvidia-fs` (`/dev/nvidia-fs<N>`, minor N), `gdrdrv` (minor 0) and
//! `nvidia-nvswitch` (`/dev/nvidia-nvswitch<N>`, minor N, `nvidia-nvswitchctl` minor 255)
//! register dynamic majors, listed in `/proc/devices` under those names. The dynamic numbers
//! here are made up, from the range the fake host's other dynamic majors use. Every node is
//! mode 0666, as the modules' udev rules (or `nvidia-modprobe`) make them.

use std::fs;
use std::path::Path;

use anyhow::{Context, Result};

/// `infiniband_verbs`' (and `infiniband_mad`'s) major.
pub const INFINIBAND_MAJOR: u32 = 231;
/// The first uverbs minor.
pub const UVERBS_BASE_MINOR: u32 = 192;
/// The misc devices' major (`rdma_cm`).
pub const MISC_MAJOR: u32 = 10;
/// `nvidia-nvswitchctl`'s minor.
pub const NVSWITCH_CTL_MINOR: u32 = 255;

/// What to make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatedDevices {
    /// Dynamic major of `nvidia-fs`, and how many `nvidia-fs<N>` nodes.
    pub nvidia_fs_major: u32,
    pub nvidia_fs_nodes: u32,
    /// Dynamic major of `gdrdrv`.
    pub gdrdrv_major: u32,
    /// Dynamic major of `nvidia-nvswitch`, and how many switches (`nvidia-nvswitch<N>`).
    pub nvswitch_major: u32,
    pub nvswitches: u32,
    /// How many `infiniband/uverbs<N>` (one per adapter port driver instance).
    pub uverbs_nodes: u32,
    /// `infiniband/rdma_cm`'s misc minor.
    pub rdma_cm_minor: u32,
    /// Write `etc/cufile.json` (GDS's configuration) and make `run/udev/` under the driver root.
    pub gds_files: bool,
}

/// One node, `path` below `/dev`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatedNode {
    pub path: String,
    pub major: u32,
    pub minor: u32,
}

/// The content of the fake `etc/cufile.json` (a trimmed version of the file GDS installs).
pub const CUFILE_JSON: &str = "{\n  \"logging\": { \"level\": \"ERROR\" },\n  \"properties\": { \"use_poll_mode\": false }\n}\n";

impl GatedDevices {
    /// An HGX node: 16 nvidia-fs nodes (what the module makes), 4 NVSwitches (HGX H100), 8
    /// InfiniBand adapters, GDS installed.
    pub fn hgx() -> GatedDevices {
        GatedDevices {
            nvidia_fs_major: 505,
            nvidia_fs_nodes: 16,
            gdrdrv_major: 506,
            nvswitch_major: 507,
            nvswitches: 4,
            uverbs_nodes: 8,
            rdma_cm_minor: 58,
            gds_files: true,
        }
    }

    /// The lines this adds to `/proc/devices`' character section.
    pub fn proc_devices(&self) -> Vec<(u32, &'static str)> {
        vec![
            (INFINIBAND_MAJOR, "infiniband_mad"),
            (INFINIBAND_MAJOR, "infiniband_verbs"),
            (self.nvidia_fs_major, "nvidia-fs"),
            (self.gdrdrv_major, "gdrdrv"),
            (self.nvswitch_major, "nvidia-nvswitch"),
        ]
    }

    /// The nodes NVIDIA's runtime gives for `variable` (`NVIDIA_GDS`, ...), sorted by path.
    pub fn nodes_for(&self, variable: &str) -> Vec<GatedNode> {
        let node = |path: String, major, minor| GatedNode { path, major, minor };
        let mut out: Vec<GatedNode> = match variable {
            "NVIDIA_GDS" => (0..self.nvidia_fs_nodes)
                .map(|i| node(format!("nvidia-fs{i}"), self.nvidia_fs_major, i))
                .collect(),
            "NVIDIA_MOFED" => (0..self.uverbs_nodes)
                .map(|i| {
                    let minor = UVERBS_BASE_MINOR + i;
                    node(format!("infiniband/uverbs{i}"), INFINIBAND_MAJOR, minor)
                })
                .chain([node(
                    "infiniband/rdma_cm".into(),
                    MISC_MAJOR,
                    self.rdma_cm_minor,
                )])
                .collect(),
            "NVIDIA_GDRCOPY" => vec![node("gdrdrv".into(), self.gdrdrv_major, 0)],
            "NVIDIA_NVSWITCH" => (0..self.nvswitches)
                .map(|i| node(format!("nvidia-nvswitch{i}"), self.nvswitch_major, i))
                .chain([node(
                    "nvidia-nvswitchctl".into(),
                    self.nvswitch_major,
                    NVSWITCH_CTL_MINOR,
                )])
                .collect(),
            other => panic!("{other} is not a feature-gated variable"),
        };
        out.sort_by(|a, b| a.path.cmp(&b.path));
        out
    }

    /// Every node, of the four variables.
    pub fn all_nodes(&self) -> Vec<GatedNode> {
        VARIABLES.iter().flat_map(|v| self.nodes_for(v)).collect()
    }

    /// Makes the nodes under `dev` and GDS's files under `driver_root`.
    pub fn make(&self, dev: &Path, driver_root: &Path) -> Result<()> {
        for n in self.all_nodes() {
            let path = dev.join(&n.path);
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent)
                    .with_context(|| format!("creating {}", parent.display()))?;
            }
            crate::host::make_char_node(&path, n.major, n.minor)?;
        }
        if self.gds_files {
            let cufile = driver_root.join("etc/cufile.json");
            fs::create_dir_all(driver_root.join("etc"))?;
            fs::write(&cufile, CUFILE_JSON)
                .with_context(|| format!("writing {}", cufile.display()))?;
            // udev's database, which cuFile reads to find the NVMe and RDMA devices.
            let data = driver_root.join("run/udev/data");
            fs::create_dir_all(&data).with_context(|| format!("creating {}", data.display()))?;
            fs::write(
                data.join(format!("c{INFINIBAND_MAJOR}:{UVERBS_BASE_MINOR}")),
                "E:ID_NET_DRIVER=mlx5_core\n",
            )?;
        }
        Ok(())
    }
}

/// The four variables, in NVIDIA's order (`internal/modifier/cdi.go`, `gatedDevices`).
pub const VARIABLES: [&str; 4] = [
    "NVIDIA_GDS",
    "NVIDIA_MOFED",
    "NVIDIA_GDRCOPY",
    "NVIDIA_NVSWITCH",
];
