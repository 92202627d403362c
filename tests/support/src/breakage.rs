//! Breaking a fake host the ways real GPU hosts break, for the tests of
//! `nvshim doctor` and `nvshim explain`: a device node that is gone, a driver that is not
//! loaded, a dynamic major that moved with a driver reload, a GPU gone from the bus, a MIG
//! instance destroyed, and a CDI spec written for another driver version.

use std::fs;
use std::path::Path;

use anyhow::{Context, Result};
use nix::sys::stat::{makedev, mknod, Mode, SFlag};
use serde_json::json;

use crate::host::{FakeHost, LIB_DIR, NVIDIACTL_MINOR, NVIDIA_MAJOR};

impl FakeHost {
    /// Removes `<dev root>/dev/<name>` (e.g. `nvidia0`): a node nobody recreated after a
    /// reboot, or a GPU that fell off the bus.
    pub fn remove_device_node(&self, name: &str) -> Result<()> {
        let path = self.dev_root().join("dev").join(name);
        fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))
    }

    /// Makes the driver look unloaded: removes `proc/driver/nvidia/version`, which the kernel
    /// module writes when it loads.
    pub fn unload_driver(&self) -> Result<()> {
        let path = self.proc_root().join("driver/nvidia/version");
        fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))
    }

    /// Makes a GPU disappear from the driver, as when it falls off the bus (Xid 79) or is
    /// unbound: removes `proc/driver/nvidia/gpus/<bus id>`.
    pub fn unplug_gpu(&self, bus_id: &str) -> Result<()> {
        let path = self.proc_root().join("driver/nvidia/gpus").join(bus_id);
        fs::remove_dir_all(&path).with_context(|| format!("removing {}", path.display()))
    }

    /// Destroys a MIG GPU instance with its compute instances, as `nvidia-smi mig -dci` and
    /// `-dgi` do: the driver stops listing `capabilities/gpu<minor>/mig/gi<gi>` (the
    /// `nvidia-cap` nodes stay, as nvidia-modprobe made them).
    pub fn destroy_mig_instance(&self, gpu_minor: u32, gi: u32) -> Result<()> {
        let path = self.proc_root().join(format!(
            "driver/nvidia/capabilities/gpu{gpu_minor}/mig/gi{gi}"
        ));
        fs::remove_dir_all(&path).with_context(|| format!("removing {}", path.display()))
    }

    /// Moves `nvidia-uvm` to another dynamic major, as a driver reload can: `/proc/devices` and
    /// the `nvidia-uvm`, `nvidia-uvm-tools` nodes change together (a spec written before is
    /// now stale: "nvidia-smi works, cuInit fails").
    pub fn move_uvm_major(&self, major: u32) -> Result<()> {
        let old = self.spec().uvm_major;
        let devices = self.proc_root().join("devices");
        let text = fs::read_to_string(&devices)
            .with_context(|| format!("reading {}", devices.display()))?;
        let text = text.replace(
            &format!("{old:3} nvidia-uvm\n"),
            &format!("{major:3} nvidia-uvm\n"),
        );
        fs::write(&devices, text).with_context(|| format!("writing {}", devices.display()))?;
        for (name, minor) in [("nvidia-uvm", 0), ("nvidia-uvm-tools", 1)] {
            let path = self.dev_root().join("dev").join(name);
            let _ = fs::remove_file(&path);
            mknod(
                &path,
                SFlag::S_IFCHR,
                Mode::from_bits_truncate(0o666),
                makedev(u64::from(major), minor),
            )
            .with_context(|| format!("mknod {} c {major} {minor}", path.display()))?;
        }
        Ok(())
    }

    /// Writes a small CDI spec (JSON, kind `nvidia.com/gpu`) at `path` as a generator would
    /// have written it on this host for driver `driver_version`: a device per GPU index with
    /// its node, `all`, and global edits with nvidiactl and the driver's `libcuda` and
    /// `libnvidia-ml` mounted. With another version than the host's, the library mounts name
    /// files that do not exist: the spec a driver upgrade leaves behind.
    pub fn write_cdi_spec(&self, path: &Path, driver_version: &str) -> Result<()> {
        let dev = self.dev_root().join("dev");
        let node = |name: &str, major: u32, minor: u32| {
            json!({
                "path": format!("/dev/{name}"),
                "hostPath": dev.join(name).to_string_lossy(),
                "major": major,
                "minor": minor,
                "permissions": "rwm",
            })
        };
        let mut devices = Vec::new();
        let mut all_nodes = Vec::new();
        for (index, gpu) in self.gpus_by_bus().into_iter().enumerate() {
            let n = node(&format!("nvidia{}", gpu.minor), NVIDIA_MAJOR, gpu.minor);
            all_nodes.push(n.clone());
            for name in [index.to_string(), gpu.uuid.clone()] {
                devices.push(json!({"name": name, "containerEdits": {"deviceNodes": [n.clone()]}}));
            }
        }
        devices.push(json!({"name": "all", "containerEdits": {"deviceNodes": all_nodes}}));
        let mounts: Vec<_> = ["libcuda", "libnvidia-ml"]
            .iter()
            .map(|stem| {
                let p = format!("/{LIB_DIR}/{stem}.so.{driver_version}");
                json!({
                    "hostPath": self.root().join(p.trim_start_matches('/')).to_string_lossy(),
                    "containerPath": p,
                    "options": ["ro", "nosuid", "nodev", "rbind", "rprivate"],
                })
            })
            .collect();
        let spec = json!({
            "cdiVersion": "0.6.0",
            "kind": "nvidia.com/gpu",
            "devices": devices,
            "containerEdits": {
                "env": ["NVIDIA_VISIBLE_DEVICES=void"],
                "deviceNodes": [node("nvidiactl", NVIDIA_MAJOR, NVIDIACTL_MINOR)],
                "mounts": mounts,
            },
        });
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let text = serde_json::to_string_pretty(&spec).context("serialising the CDI spec")?;
        fs::write(path, text).with_context(|| format!("writing {}", path.display()))
    }
}
