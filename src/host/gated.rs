//! Feature-gated devices: what the host has for the four variables with which a GPU container
//! asks NVIDIA's runtime for more than GPUs (`NVIDIA_GDS`, `NVIDIA_MOFED`, `NVIDIA_GDRCOPY`,
//! `NVIDIA_NVSWITCH`, each `=enabled`), found as NVIDIA's toolkit finds them
//! (`internal/discover/{gds,mofed,gdrcopy,nvswitch}.go`): char device nodes by name under
//! `<dev-root>/dev`, and for GPUDirect Storage `/etc/cufile.json` and the `/run/udev` directory
//! under the driver root, only when an `nvidia-fs` node exists.
//!
//! One difference: a node is kept only when `/proc/devices` lists its driver under the node's
//! major. NVIDIA takes any node it finds; a node left behind by an unloaded module (or one whose
//! dynamic major now belongs to another driver) would open that other driver's devices.

use std::fs;

use super::{char_devices, read_kernel_file, under_root, Host, HostDeviceNode, HostFile};

/// One of the feature-gated requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Feature {
    /// GPUDirect Storage: `/dev/nvidia-fs*`, `/etc/cufile.json`, `/run/udev`.
    Gds,
    /// MOFED (RDMA): `/dev/infiniband/uverbs*`, `/dev/infiniband/rdma_cm`.
    Mofed,
    /// GDRCopy: `/dev/gdrdrv`.
    Gdrcopy,
    /// NVSwitch: `/dev/nvidia-nvswitchctl`, `/dev/nvidia-nvswitch*`.
    Nvswitch,
}

/// Device nodes of a feature: a name under `/dev`, or all names starting with it (`glob`), and
/// the driver `/proc/devices` lists them under.
struct Nodes {
    name: &'static str,
    glob: bool,
    driver: &'static str,
}

const GDS_NODES: &[Nodes] = &[Nodes {
    name: "nvidia-fs",
    glob: true,
    driver: "nvidia-fs",
}];
const MOFED_NODES: &[Nodes] = &[
    Nodes {
        name: "infiniband/uverbs",
        glob: true,
        driver: "infiniband_verbs",
    },
    Nodes {
        name: "infiniband/rdma_cm",
        glob: false,
        driver: "misc",
    },
];
const GDRCOPY_NODES: &[Nodes] = &[Nodes {
    name: "gdrdrv",
    glob: false,
    driver: "gdrdrv",
}];
const NVSWITCH_NODES: &[Nodes] = &[
    Nodes {
        name: "nvidia-nvswitchctl",
        glob: false,
        driver: "nvidia-nvswitch",
    },
    Nodes {
        name: "nvidia-nvswitch",
        glob: true,
        driver: "nvidia-nvswitch",
    },
];

impl Feature {
    /// In NVIDIA's order (`internal/modifier/cdi.go`, `gatedDevices`).
    pub const ALL: [Feature; 4] = [
        Feature::Gds,
        Feature::Mofed,
        Feature::Gdrcopy,
        Feature::Nvswitch,
    ];

    /// The variable that asks for it with the value `enabled`.
    pub fn variable(self) -> &'static str {
        match self {
            Feature::Gds => "NVIDIA_GDS",
            Feature::Mofed => "NVIDIA_MOFED",
            Feature::Gdrcopy => "NVIDIA_GDRCOPY",
            Feature::Nvswitch => "NVIDIA_NVSWITCH",
        }
    }

    /// NVIDIA's name for it: the `nvidia-ctk cdi generate --mode` and the class of its spec.
    pub fn mode(self) -> &'static str {
        match self {
            Feature::Gds => "gds",
            Feature::Mofed => "mofed",
            Feature::Gdrcopy => "gdrcopy",
            Feature::Nvswitch => "nvswitch",
        }
    }

    pub fn from_mode(mode: &str) -> Option<Feature> {
        Feature::ALL.into_iter().find(|f| f.mode() == mode)
    }

    /// What it is, for people.
    pub fn title(self) -> &'static str {
        match self {
            Feature::Gds => "GPUDirect Storage",
            Feature::Mofed => "MOFED (RDMA)",
            Feature::Gdrcopy => "GDRCopy",
            Feature::Nvswitch => "NVSwitch",
        }
    }

    /// The nodes, as NVIDIA's discoverers name them; drivers as the kernel modules register
    /// them (`rdma_cm` is a misc device, major 10).
    fn nodes(self) -> &'static [Nodes] {
        match self {
            Feature::Gds => GDS_NODES,
            Feature::Mofed => MOFED_NODES,
            Feature::Gdrcopy => GDRCOPY_NODES,
            Feature::Nvswitch => NVSWITCH_NODES,
        }
    }

    /// The nodes as NVIDIA's discoverers write them (`/dev/nvidia-fs*`).
    pub fn patterns(self) -> String {
        let list: Vec<String> = self
            .nodes()
            .iter()
            .map(|n| format!("/dev/{}{}", n.name, if n.glob { "*" } else { "" }))
            .collect();
        list.join(", ")
    }
}

/// What the host has for one feature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub feature: Feature,
    /// Its char device nodes, sorted by path, each with a major `/proc/devices` lists for its
    /// driver.
    pub nodes: Vec<HostDeviceNode>,
    /// GDS with nodes: `/etc/cufile.json` (a file) and `/run/udev` (a directory), those that
    /// exist under the driver root.
    pub files: Vec<HostFile>,
    /// Why something asked for is not there: nothing matched a pattern, a node left out.
    pub notes: Vec<String>,
}

/// The GDS files, each with whether it is a directory.
const GDS_FILES: &[(&str, bool)] = &[("/etc/cufile.json", false), ("/run/udev", true)];

/// What the host has for each of `features`: one [`Found`] each, in their order. Reads
/// `/proc/devices` and `<dev-root>/dev` (and its `infiniband/`) only when asked for something.
pub fn discover(host: &Host, features: &[Feature]) -> Vec<Found> {
    if features.is_empty() {
        return Vec::new();
    }
    let devices_path = host.roots().proc_root.join("devices");
    let devices = read_kernel_file(&devices_path).unwrap_or_default();
    let majors = |driver: &str| -> Vec<u32> {
        char_devices(&devices)
            .filter(|(_, name)| *name == driver)
            .map(|(m, _)| m)
            .collect()
    };
    let dev = host.roots().dev_root.join("dev");
    features
        .iter()
        .map(|&feature| {
            let mut found = Found {
                feature,
                nodes: Vec::new(),
                files: Vec::new(),
                notes: Vec::new(),
            };
            for rule in feature.nodes() {
                let names: Vec<String> = if rule.glob {
                    let (dir, prefix) = rule.name.rsplit_once('/').unwrap_or(("", rule.name));
                    let mut names: Vec<String> = fs::read_dir(dev.join(dir))
                        .into_iter()
                        .flatten()
                        .flatten()
                        .filter_map(|e| e.file_name().into_string().ok())
                        .filter(|n| n.starts_with(prefix))
                        .map(|n| if dir.is_empty() { n } else { format!("{dir}/{n}") })
                        .collect();
                    names.sort();
                    names
                } else {
                    vec![rule.name.to_string()]
                };
                let mut matched = false;
                for name in names {
                    // Char devices only, as NVIDIA's locator (`devices.AssertCharDevice`).
                    let Some(node) = host.device_node(&name).filter(|n| n.kind == 'c') else {
                        continue;
                    };
                    matched = true;
                    if found.nodes.iter().any(|n| n.host_path == node.host_path) {
                        continue;
                    }
                    let listed = majors(rule.driver);
                    if listed.contains(&node.major) {
                        found.nodes.push(node);
                    } else {
                        found.notes.push(format!(
                            "{} (char {}:{}) left out: {} lists no {:?} driver under major {} (is the module loaded?)",
                            node.host_path.display(),
                            node.major,
                            node.minor,
                            devices_path.display(),
                            rule.driver,
                            node.major
                        ));
                    }
                }
                if !matched {
                    found.notes.push(format!(
                        "no /dev/{}{} char device under {}",
                        rule.name,
                        if rule.glob { "*" } else { "" },
                        dev.display()
                    ));
                }
            }
            found.nodes.sort_by(|a, b| a.container_path.cmp(&b.container_path));
            if feature == Feature::Gds && !found.nodes.is_empty() {
                for (path, dir) in GDS_FILES {
                    let host_path = under_root(&host.roots().driver_root, path);
                    if fs::metadata(&host_path).is_ok_and(|m| m.is_dir() == *dir) {
                        found.files.push(HostFile {
                            host_path,
                            container_path: path.to_string(),
                        });
                    }
                }
            }
            found
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::HostRoots;
    use nix::sys::stat::{makedev, mknod, Mode, SFlag};

    fn chr(path: &std::path::Path, major: u64, minor: u64) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        mknod(
            path,
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o666),
            makedev(major, minor),
        )
        .unwrap();
    }

    /// Needs root (mknod), as the e2e suite does.
    #[test]
    fn nodes_need_their_driver_in_proc_devices_and_gds_files_need_nodes() {
        nvshim_testsupport::require_root().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        fs::write(
            root.join("devices"),
            "Character devices:\n 10 misc\n231 infiniband_verbs\n505 nvidia-fs\n\nBlock devices:\n507 nvidia-nvswitch\n",
        )
        .unwrap();
        chr(&root.join("dev/nvidia-fs0"), 505, 0);
        chr(&root.join("dev/nvidia-fs1"), 505, 1);
        chr(&root.join("dev/infiniband/uverbs0"), 231, 192);
        chr(&root.join("dev/infiniband/rdma_cm"), 10, 58);
        // A node whose module is gone (the Block section does not count), and a file.
        chr(&root.join("dev/nvidia-nvswitch0"), 507, 0);
        fs::write(root.join("dev/gdrdrv"), "").unwrap();
        fs::create_dir_all(root.join("etc")).unwrap();
        fs::write(root.join("etc/cufile.json"), "{}").unwrap();
        let host = Host::new(HostRoots {
            driver_root: root.into(),
            dev_root: root.into(),
            proc_root: root.into(),
        });
        let found = discover(&host, &Feature::ALL);
        let paths = |f: &Found| -> Vec<String> {
            f.nodes.iter().map(|n| n.container_path.clone()).collect()
        };
        assert_eq!(paths(&found[0]), ["/dev/nvidia-fs0", "/dev/nvidia-fs1"]);
        // `/run/udev` is not there: only the file that is.
        let files: Vec<&str> = found[0]
            .files
            .iter()
            .map(|f| f.container_path.as_str())
            .collect();
        assert_eq!(files, ["/etc/cufile.json"]);
        assert_eq!(
            paths(&found[1]),
            ["/dev/infiniband/rdma_cm", "/dev/infiniband/uverbs0"]
        );
        assert!(found[2].nodes.is_empty());
        assert_eq!(found[2].notes.len(), 1, "{:?}", found[2].notes);
        assert!(found[3].nodes.is_empty());
        assert!(
            found[3].notes.iter().any(|n| n.contains("left out")),
            "{:?}",
            found[3].notes
        );
        assert!(discover(&host, &[]).is_empty());
    }
}
