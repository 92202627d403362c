//! The simulated GPU host: a directory nvshim can use as driver root, dev root and proc root.
//!
//! Layout (the contract with the shim, which reads only these): the 580 driver's file set as it
//! ships (see [`DRIVER_LIBS`] for where the list comes from), on a merged-/usr Debian host.
//!
//! ```text
//! lib -> usr/lib, bin -> usr/bin, sbin -> usr/sbin, lib64 -> usr/lib64     merged /usr
//! proc/devices                                   kernel format: "%3d %s" under "Character devices:"
//! proc/driver/nvidia/version                     the open modules' banner (default) or the proprietary one
//!                                                (see [`KernelModules`])
//! proc/driver/nvidia/params                      the driver's parameters (ModifyDeviceFiles: 1)
//! proc/driver/nvidia/gpus/<bus id>/information   Model, IRQ, GPU UUID, ..., Bus Location, Device Minor
//! sys/bus/pci/devices/<bus id>/{vendor,class,drm/{cardN,renderDN}}   beside proc, as /sys is beside /proc
//! dev/nvidia<minor> (195:minor), dev/nvidiactl (195:255), dev/nvidia-modeset (195:254),
//! dev/nvidia-uvm (uvm:0), dev/nvidia-uvm-tools (uvm:1)        real nodes (mknod), mode 0666
//! dev/dri/card0 (a non-NVIDIA display), cardN and renderDN per GPU (226:*, 0660, groups
//! video 44 and render 105), dev/dri/by-path/pci-<bus>-{card,render}
//! usr/lib/x86_64-linux-gnu/<lib>.so.<v> + SONAME links       64-bit ELF stubs built by gcc
//! usr/lib/x86_64-linux-gnu/{vdpau,gbm,nvidia/xorg}/...       outside ld.so.cache, as shipped
//! usr/lib/i386-linux-gnu/<lib>.so.<v> + SONAME links         32-bit stubs (compat32)
//! usr/lib/firmware/nvidia/<v>/gsp_*.bin
//! usr/share/{glvnd,egl,vulkan,vulkansc,nvidia,X11}/..., etc/OpenCL/vendors/nvidia.icd
//! run/nvidia-persistenced/socket, run/nvidia-fabricmanager/socket   unix sockets
//! etc/ld.so.conf (+ ld.so.conf.d/*), etc/ld.so.cache         built by `/sbin/ldconfig -r <root>`
//! usr/bin/nvidia-smi, nvidia-debugdump, nvidia-persistenced, nvidia-cuda-mps-{control,server},
//! nvidia-imex, nvidia-imex-ctl, nvidia-xconfig, ...
//! ```
//!
//! [`FakeHost::build_split`] lays the same files out as NVIDIA's GPU Operator does: the driver
//! (libraries, binaries, firmware, `etc/ld.so.cache`) under one root, as the driver container's
//! `/run/nvidia/driver`, and `dev/` and `proc/` under another, the host's. Optional extras:
//! MIG capabilities ([`FakeHost::add_mig_caps`]: `proc/driver/nvidia-caps/mig-minors` and
//! `dev/nvidia-caps/nvidia-cap<N>`), IMEX channels ([`FakeHost::add_imex_channels`]), a real
//! node's own libraries in `etc/ld.so.cache` ([`FakeHost::add_system_libraries`]) and, set in
//! the spec, an HGX node's GDS, InfiniBand, GDRCopy and NVSwitch nodes ([`crate::gated`]).
//!
//! One file (1520 lines of code, 65 of tests): the layout above is one contract, and [`FakeHost`]'s
//! builder writes exactly what the tables beside it list ([`DRIVER_LIBS`], [`DRIVER_LIBS_32`],
//! [`DRIVER_BINS`], the data files), which the tests also read to know what to expect. Holds the
//! host spec, the driver file tables and the builder; the tables could move to their own module.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, ensure, Context, Result};
use nix::sys::stat::{makedev, mknod, Mode, SFlag};

use crate::stubs;

/// Where the driver's libraries live, relative to the host root (Debian's multiarch dir).
pub const LIB_DIR: &str = "usr/lib/x86_64-linux-gnu";

/// The minor of the fabric IMEX management capability ([`FakeHost::add_fabric_imex_mgmt`]):
/// modelled (no GB200 node's files are in this repository) as the first minor after the MIG
/// table's 4,322 (`config`, `monitor` and the 32 GPUs' instances: [`mig_minors_table`]).
pub const FABRIC_IMEX_MGMT_MINOR: u32 = 4323;

/// Major number of the NVIDIA character devices (`/dev/nvidia<N>`, nvidiactl, nvidia-modeset).
pub const NVIDIA_MAJOR: u32 = 195;
/// Minor of `/dev/nvidiactl`.
pub const NVIDIACTL_MINOR: u32 = 255;
/// Minor of `/dev/nvidia-modeset`.
pub const MODESET_MINOR: u32 = 254;
/// `mig-minors` minor of the MIG `config` capability.
pub const MIG_CONFIG_MINOR: u32 = 1;
/// `mig-minors` minor of the MIG `monitor` capability.
pub const MIG_MONITOR_MINOR: u32 = 2;
/// GPU instances per GPU and compute instances per GPU instance in the driver's `mig-minors`
/// table (`gi0`..`gi14`, `ci0`..`ci7`).
const MIG_GPU_INSTANCES: u32 = 15;
const MIG_COMPUTE_INSTANCES: u32 = 8;
/// GPUs the driver's `mig-minors` table has rows for.
const MIG_MAX_GPUS: u32 = 32;

/// The `nvidia-cap<N>` minor the driver gives a MIG capability: `config` 1, `monitor` 2, then
/// per GPU minor a block of 15 GPU instances, each its `access` followed by 8 compute
/// instances (`gpu0/gi1/access 12`, `gpu0/gi1/ci0/access 13`), as the driver's
/// `/proc/driver/nvidia-caps/mig-minors` lists them. `ci = None` is the GPU instance's own
/// capability.
pub fn mig_cap_minor(gpu_minor: u32, gi: u32, ci: Option<u32>) -> u32 {
    let per_gi = 1 + MIG_COMPUTE_INSTANCES;
    3 + gpu_minor * MIG_GPU_INSTANCES * per_gi + gi * per_gi + ci.map_or(0, |c| 1 + c)
}

/// The driver's `/proc/driver/nvidia-caps/mig-minors`: `config`, `monitor`, then every
/// capability of the 32 GPUs the driver provides for, whatever is installed (4,322 lines, as
/// the lent H200's 580.159.04 driver writes it: tests/fixtures/host/h200-mig-minors.txt).
pub fn mig_minors_table() -> String {
    let mut table = format!("config {MIG_CONFIG_MINOR}\nmonitor {MIG_MONITOR_MINOR}\n");
    for g in 0..MIG_MAX_GPUS {
        for gi in 0..MIG_GPU_INSTANCES {
            let _ = writeln!(table, "gpu{g}/gi{gi}/access {}", mig_cap_minor(g, gi, None));
            for ci in 0..MIG_COMPUTE_INSTANCES {
                let _ = writeln!(
                    table,
                    "gpu{g}/gi{gi}/ci{ci}/access {}",
                    mig_cap_minor(g, gi, Some(ci))
                );
            }
        }
    }
    table
}

/// One simulated GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeGpu {
    /// Marketing name, as `Model:` in the proc information file.
    pub model: String,
    /// `GPU-<uuid>`.
    pub uuid: String,
    /// PCI bus id with a four-digit domain, lower case: `0000:1b:00.0`.
    pub bus_id: String,
    /// Device minor: the GPU is `/dev/nvidia<minor>`, char `195:<minor>`.
    pub minor: u32,
}

/// What to simulate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeHostSpec {
    /// The GPUs, in any order (nvidia-smi numbers them by bus id, not by minor).
    pub gpus: Vec<FakeGpu>,
    /// Driver version, digits and dots: `580.65.06`.
    pub driver_version: String,
    /// What the stub `cuDriverGetVersion` reports: 1000 * major + 10 * minor (`13000` = 13.0).
    pub cuda_version: u32,
    /// Dynamic major of `nvidia-uvm` in `/proc/devices`.
    pub uvm_major: u32,
    /// Dynamic major of `nvidia-caps` in `/proc/devices`.
    pub caps_major: u32,
    /// Dynamic major of `nvidia-caps-imex-channels` in `/proc/devices`.
    pub caps_imex_major: u32,
    /// Name of major 195 in `/proc/devices`: `nvidia`, or `nvidia-frontend` before driver 550.
    pub frontend_name: String,
    /// Which kernel modules the driver loaded: they print different version banners.
    pub kernel_modules: KernelModules,
    /// Where the distribution puts the driver's libraries.
    pub layout: Layout,
    /// GDS, MOFED, GDRCopy and NVSwitch nodes (and GDS's files), in `/proc/devices` and
    /// `dev/` ([`crate::gated`]); `None`: none, as on a plain GPU server.
    pub gated: Option<crate::gated::GatedDevices>,
}

/// Where a distribution puts the driver's libraries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Layout {
    /// Debian and Ubuntu: multiarch `usr/lib/x86_64-linux-gnu` and `usr/lib/i386-linux-gnu`,
    /// X.Org modules in `<libdir>/nvidia/xorg`.
    #[default]
    Debian,
    /// RHEL, Fedora, SUSE: `usr/lib64` and (32-bit) `usr/lib`, X.Org modules in
    /// `usr/lib64/xorg/modules/{drivers,extensions}` (the RPM Fusion 580 packages' paths).
    Rhel,
    /// A driver directory on an Ubuntu system, as NVIDIA's CUDA images and the lent GPU
    /// machines keep it (seen there on 2026-11-25: `/usr/local/nvidia/{lib64,lib,bin}`, a
    /// read-only mount, listed in `/etc/ld.so.conf.d`, nvidia-smi in its `bin/`). The same
    /// directory as a driver root of its own, with no `etc/ld.so.cache`, is GKE's
    /// `/home/kubernetes/bin/nvidia`.
    UsrLocalNvidia,
    /// Debian and Ubuntu on arm64 (Grace: GH200, GB200): multiarch `usr/lib/aarch64-linux-gnu`,
    /// X.Org modules in `<libdir>/nvidia/xorg`, and no 32-bit libraries (NVIDIA's aarch64
    /// driver ships none). An aarch64 host: its stubs are aarch64 objects
    /// ([`crate::arm64::CC`]) and its `ld.so.cache` is written by Debian's arm64 `ldconfig`
    /// ([`crate::arm64::root`]), so that the flags in it are glibc's for aarch64.
    DebianAarch64,
}

impl Layout {
    /// The machine of a host with this layout, as the kernel and `uname -m` name it.
    pub fn machine(self) -> &'static str {
        match self {
            Layout::DebianAarch64 => "aarch64",
            _ => "x86_64",
        }
    }

    /// True for an aarch64 host.
    pub fn is_aarch64(self) -> bool {
        self == Layout::DebianAarch64
    }

    /// The 64-bit library directory, relative to the root.
    pub fn lib_dir(self) -> &'static str {
        match self {
            Layout::Debian => LIB_DIR,
            Layout::Rhel => "usr/lib64",
            Layout::UsrLocalNvidia => "usr/local/nvidia/lib64",
            Layout::DebianAarch64 => "usr/lib/aarch64-linux-gnu",
        }
    }

    /// The 32-bit library directory, relative to the root (none is installed on aarch64).
    pub fn lib_dir_32(self) -> &'static str {
        match self {
            Layout::Debian | Layout::DebianAarch64 => LIB_DIR_32,
            Layout::Rhel => "usr/lib",
            Layout::UsrLocalNvidia => "usr/local/nvidia/lib",
        }
    }

    /// Where the driver's binaries are, relative to the root.
    pub fn bin_dir(self) -> &'static str {
        match self {
            Layout::Debian | Layout::Rhel | Layout::DebianAarch64 => "usr/bin",
            Layout::UsrLocalNvidia => "usr/local/nvidia/bin",
        }
    }

    /// The X.Org modules, relative to the root: (driver, GLX server module).
    fn xorg_modules(self, v: &str) -> (String, String) {
        match self {
            Layout::Debian | Layout::UsrLocalNvidia | Layout::DebianAarch64 => (
                format!("{}/nvidia/xorg/nvidia_drv.so", self.lib_dir()),
                format!("{}/nvidia/xorg/libglxserver_nvidia.so.{v}", self.lib_dir()),
            ),
            Layout::Rhel => (
                "usr/lib64/xorg/modules/drivers/nvidia_drv.so".into(),
                format!("usr/lib64/xorg/modules/extensions/libglxserver_nvidia.so.{v}"),
            ),
        }
    }

    /// `etc/ld.so.conf.d` files: Debian's multiarch files list `/lib/<triplet>` before
    /// `/usr/lib/<triplet>`; a RHEL ldconfig has `/lib64` and `/usr/lib64` built in, written
    /// out here since the ldconfig that builds the cache is Debian's.
    fn ld_conf(self) -> Vec<(&'static str, &'static str)> {
        match self {
            Layout::Debian => vec![
                (
                    "etc/ld.so.conf.d/x86_64-linux-gnu.conf",
                    "# Multiarch support\n/usr/local/lib/x86_64-linux-gnu\n/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n",
                ),
                (
                    "etc/ld.so.conf.d/i386-linux-gnu.conf",
                    "# Multiarch support\n/usr/local/lib/i386-linux-gnu\n/lib/i386-linux-gnu\n/usr/lib/i386-linux-gnu\n/usr/local/lib/i686-linux-gnu\n/lib/i686-linux-gnu\n/usr/lib/i686-linux-gnu\n",
                ),
            ],
            Layout::Rhel => vec![(
                "etc/ld.so.conf.d/00-system-dirs.conf",
                "/lib64\n/usr/lib64\n/lib\n/usr/lib\n",
            )],
            Layout::UsrLocalNvidia => {
                let mut files = Layout::Debian.ld_conf();
                files.push((
                    "etc/ld.so.conf.d/nvidia.conf",
                    "/usr/local/nvidia/lib64\n/usr/local/nvidia/lib\n",
                ));
                files
            }
            // As Debian 12's libc6:arm64 ships it.
            Layout::DebianAarch64 => vec![(
                "etc/ld.so.conf.d/aarch64-linux-gnu.conf",
                "# Multiarch support\n/usr/local/lib/aarch64-linux-gnu\n/lib/aarch64-linux-gnu\n/usr/lib/aarch64-linux-gnu\n",
            )],
        }
    }

    /// The driver's 32-bit libraries on a host with this layout: none on aarch64.
    pub fn libraries_32(self) -> &'static [DriverLib] {
        if self.is_aarch64() {
            &[]
        } else {
            DRIVER_LIBS_32
        }
    }
}

/// The two flavours of NVIDIA's kernel modules. Each writes its own first line in
/// `/proc/driver/nvidia/version`; the banners below are the 580 driver's, as real hosts print
/// them (the open one from a 580.95.05 host, the proprietary one from a 580.65.06 host).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KernelModules {
    /// The open GPU kernel modules: the default since driver 560 and the only choice on
    /// Blackwell. `NVIDIA UNIX Open Kernel Module for x86_64  <v>  Release Build  (...)  <date>`.
    #[default]
    Open,
    /// The proprietary modules: `NVIDIA UNIX x86_64 Kernel Module  <v>  <date>`.
    Proprietary,
}

impl KernelModules {
    /// The whole `/proc/driver/nvidia/version` file for `version` on `machine` (`x86_64`, or
    /// `aarch64` on Grace: `... Open Kernel Module for aarch64  580.95.05  Release Build ...`,
    /// the banner src/host/mod.rs's parser tests hold).
    pub fn banner(self, version: &str, machine: &str) -> String {
        match self {
            KernelModules::Open => format!(
                "NVRM version: NVIDIA UNIX Open Kernel Module for {machine}  {version}  Release Build  \
                 (dvs-builder@U22-I3-AF03-09-1)  Thu Sep 25 01:12:42 UTC 2025\n\
                 GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04) \n"
            ),
            KernelModules::Proprietary => format!(
                "NVRM version: NVIDIA UNIX {machine} Kernel Module  {version}  Tue Jul  8 14:11:38 UTC 2025\n\
                 GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1) \n"
            ),
        }
    }
}

const MODELS: [&str; 4] = [
    "NVIDIA H100 80GB HBM3",
    "NVIDIA A100-SXM4-80GB",
    "NVIDIA L40S",
    "NVIDIA H200",
];
const BUSES: [u8; 8] = [0x1b, 0x3b, 0x5d, 0x86, 0xaf, 0xd8, 0xdb, 0xde];

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl FakeGpu {
    /// A deterministic GPU for `minor`, placed at bus slot `slot` (slot 0 = lowest bus id).
    pub fn synthetic(minor: u32, slot: usize) -> Self {
        let mut seed = 0x6e76_7368_696d_0000 ^ u64::from(minor);
        let a = splitmix64(&mut seed);
        let b = splitmix64(&mut seed);
        let uuid = format!(
            "GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xffff,
            b >> 48,
            b & 0xffff_ffff_ffff
        );
        FakeGpu {
            model: MODELS[minor as usize % MODELS.len()].to_string(),
            uuid,
            bus_id: format!(
                "{:04x}:{:02x}:00.0",
                slot / BUSES.len(),
                BUSES[slot % BUSES.len()]
            ),
            minor,
        }
    }
}

impl FakeHostSpec {
    /// `n` GPUs with minors `0..n` and distinct UUIDs, placed on the bus in *reverse* minor order
    /// (for two: minor 0 at `0000:3b:00.0`, minor 1 at `0000:1b:00.0`), so that index 0 is the
    /// highest minor and a shim that confuses index with minor is caught. Driver 580.65.06.
    pub fn with_gpus(n: usize) -> Self {
        let gpus = (0..n)
            .map(|i| FakeGpu::synthetic(i as u32, n - 1 - i))
            .collect();
        FakeHostSpec {
            gpus,
            driver_version: "580.65.06".to_string(),
            cuda_version: 13000,
            uvm_major: 508,
            caps_major: 509,
            caps_imex_major: 510,
            frontend_name: "nvidia".to_string(),
            kernel_modules: KernelModules::default(),
            layout: Layout::default(),
            gated: None,
        }
    }

    /// A GB200 compute tray (Grace, aarch64): four GPUs, [`Layout::DebianAarch64`], the open
    /// modules' `for aarch64` banner, driver 580.95.05. Each GPU in a PCI domain of its own, as
    /// on Grace (the ids are modelled, not copied from a node); minors in reverse bus order as
    /// in [`FakeHostSpec::with_gpus`]. Its IMEX channels come after the build
    /// ([`FakeHost::add_imex_channels`]).
    pub fn gb200() -> Self {
        const BUS_IDS: [&str; 4] = [
            "0008:01:00.0",
            "0009:01:00.0",
            "0018:01:00.0",
            "0019:01:00.0",
        ];
        let mut spec = Self::with_gpus(BUS_IDS.len());
        for gpu in &mut spec.gpus {
            gpu.bus_id = BUS_IDS[BUS_IDS.len() - 1 - gpu.minor as usize].to_string();
            gpu.model = "NVIDIA GB200".to_string();
        }
        spec.layout = Layout::DebianAarch64;
        spec.driver_version = "580.95.05".to_string();
        spec
    }

    fn validate(&self) -> Result<()> {
        ensure!(
            !self.driver_version.is_empty()
                && self
                    .driver_version
                    .chars()
                    .all(|c| c.is_ascii_digit() || c == '.'),
            "driver version {:?} must be digits and dots",
            self.driver_version
        );
        let mut minors = BTreeSet::new();
        let mut uuids = BTreeSet::new();
        let mut buses = BTreeSet::new();
        for gpu in &self.gpus {
            ensure!(
                gpu.minor < MODESET_MINOR,
                "GPU {} has minor {}, which collides with nvidia-modeset/nvidiactl",
                gpu.uuid,
                gpu.minor
            );
            ensure!(
                minors.insert(gpu.minor),
                "two GPUs have minor {}",
                gpu.minor
            );
            ensure!(uuids.insert(&gpu.uuid), "two GPUs have UUID {}", gpu.uuid);
            ensure!(
                buses.insert(gpu.bus_id.to_ascii_lowercase()),
                "two GPUs have bus id {}",
                gpu.bus_id
            );
            ensure!(
                !gpu.model.contains('|') && !gpu.model.contains('\n'),
                "GPU model {:?} may not contain '|' or a newline",
                gpu.model
            );
        }
        Ok(())
    }
}

/// How a library's SONAME is formed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Soname {
    /// `<stem>.so.<major>`, e.g. `libcuda.so.1`: a symlink to the versioned file.
    Major(&'static str),
    /// `<stem>.so.<driver version>`: the file itself (libnvidia-glcore and friends).
    FullVersion,
    /// A file with a version of its own and its SONAME: `("libnvidia-egl-gbm.so.1.1.3",
    /// "libnvidia-egl-gbm.so.1")` (the EGL platform libraries, NVVM 7.0, the NVAPI library).
    Own(&'static str, &'static str),
}

/// One library of the fake driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriverLib {
    /// `libcuda`.
    pub stem: &'static str,
    /// How its SONAME is formed.
    pub soname: Soname,
    /// Subdirectory of its library directory (`vdpau` for libvdpau_nvidia), or empty.
    pub subdir: &'static str,
    /// The `NVIDIA_DRIVER_CAPABILITIES` value that brings it in (libnvidia-container's lists,
    /// or the stack that uses it for the libraries newer than those lists).
    pub capability: &'static str,
    /// Its library directory: [`LIB_DIR`], or [`LIB_DIR_32`] for the 32-bit builds.
    pub base: &'static str,
}

impl DriverLib {
    /// `libcuda.so.1`, or `libnvidia-glcore.so.580.65.06`.
    pub fn soname(&self, version: &str) -> String {
        match self.soname {
            Soname::Major(m) => format!("{}.so.{m}", self.stem),
            Soname::FullVersion => self.file_name(version),
            Soname::Own(_, soname) => soname.to_string(),
        }
    }

    /// `libcuda.so.580.65.06` (`libnvidia-egl-gbm.so.1.1.3` for one with its own version).
    pub fn file_name(&self, version: &str) -> String {
        match self.soname {
            Soname::Own(file, _) => file.to_string(),
            _ => format!("{}.so.{version}", self.stem),
        }
    }

    /// True for a 32-bit build (`compat32`).
    pub fn is_32bit(&self) -> bool {
        self.base == LIB_DIR_32
    }

    /// The directory holding it, relative to the root: `usr/lib/x86_64-linux-gnu[/vdpau]`.
    pub fn dir(&self) -> String {
        if self.subdir.is_empty() {
            self.base.to_string()
        } else {
            format!("{}/{}", self.base, self.subdir)
        }
    }

    /// Path inside a container (and relative to the host root, with a leading `/`):
    /// `/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06`.
    pub fn container_path(&self, version: &str) -> String {
        format!("/{}/{}", self.dir(), self.file_name(version))
    }
}

const fn lib(
    stem: &'static str,
    soname: Soname,
    subdir: &'static str,
    capability: &'static str,
) -> DriverLib {
    DriverLib {
        stem,
        soname,
        subdir,
        capability,
        base: LIB_DIR,
    }
}

const fn lib32(stem: &'static str, soname: Soname, subdir: &'static str) -> DriverLib {
    DriverLib {
        stem,
        soname,
        subdir,
        capability: "compat32",
        base: LIB_DIR_32,
    }
}

/// The fake driver's 64-bit libraries: the 580 driver's, as NVIDIA's `nvidia-ctk cdi generate`
/// selected them on an Ubuntu 580.159.03 host (its log, published in a public bug report) and
/// as the RPM Fusion 580.142 packages list them, with the SONAMEs those packages' links carry.
/// The non-driver-versioned ones (EGL platform libraries, NVVM 7.0, NVAPI) carry the versions
/// the 580 driver ships. A Grace host ([`Layout::DebianAarch64`]) gets the same list: NVIDIA's
/// aarch64 driver ships these less the 32-bit ones and a few x86-only ones, and which those are
/// is recorded nowhere in this repository, so they stay (nvshim takes the libraries its rules
/// name that the cache lists; one a real Grace node lacks is skipped as missing there).
pub const DRIVER_LIBS: &[DriverLib] = &[
    lib("libnvidia-ml", Soname::Major("1"), "", "utility"),
    lib("libnvidia-cfg", Soname::Major("1"), "", "utility"),
    lib("libnvidia-sandboxutils", Soname::Major("1"), "", "utility"),
    lib("libcuda", Soname::Major("1"), "", "compute"),
    lib("libcudadebugger", Soname::Major("1"), "", "compute"),
    lib("libnvidia-opencl", Soname::Major("1"), "", "compute"),
    lib(
        "libnvidia-ptxjitcompiler",
        Soname::Major("1"),
        "",
        "compute",
    ),
    lib("libnvidia-nvvm", Soname::Major("4"), "", "compute"),
    lib(
        "libnvidia-nvvm70",
        Soname::Own("libnvidia-nvvm70.so.4", "libnvidia-nvvm70.so.4"),
        "",
        "compute",
    ),
    lib("libnvidia-pkcs11", Soname::FullVersion, "", "compute"),
    lib(
        "libnvidia-pkcs11-openssl3",
        Soname::FullVersion,
        "",
        "compute",
    ),
    lib("libnvidia-gpucomp", Soname::FullVersion, "", "compute"),
    lib("libnvidia-allocator", Soname::Major("1"), "", "compute"),
    lib("libnvcuvid", Soname::Major("1"), "", "video"),
    lib("libnvidia-encode", Soname::Major("1"), "", "video"),
    lib("libnvidia-opticalflow", Soname::Major("1"), "", "video"),
    lib("libvdpau_nvidia", Soname::Major("1"), "vdpau", "video"),
    lib("libnvidia-eglcore", Soname::FullVersion, "", "graphics"),
    lib("libnvidia-glcore", Soname::FullVersion, "", "graphics"),
    lib("libnvidia-tls", Soname::FullVersion, "", "graphics"),
    lib("libnvidia-glsi", Soname::FullVersion, "", "graphics"),
    lib("libnvidia-glvkspirv", Soname::FullVersion, "", "graphics"),
    lib("libnvidia-rtcore", Soname::FullVersion, "", "graphics"),
    lib("libnvidia-present", Soname::FullVersion, "", "graphics"),
    lib(
        "libnvidia-wayland-client",
        Soname::FullVersion,
        "",
        "graphics",
    ),
    lib("libnvidia-vksc-core", Soname::Major("1"), "", "graphics"),
    lib("libnvidia-fbc", Soname::Major("1"), "", "graphics"),
    lib("libnvoptix", Soname::Major("1"), "", "graphics"),
    lib("libGLX_nvidia", Soname::Major("0"), "", "graphics"),
    lib("libEGL_nvidia", Soname::Major("0"), "", "graphics"),
    lib("libGLESv2_nvidia", Soname::Major("2"), "", "graphics"),
    lib("libGLESv1_CM_nvidia", Soname::Major("1"), "", "graphics"),
    lib(
        "libnvidia-api",
        Soname::Own("libnvidia-api.so.1", "libnvidia-api.so.1"),
        "",
        "graphics",
    ),
    lib(
        "libnvidia-egl-gbm",
        Soname::Own("libnvidia-egl-gbm.so.1.1.3", "libnvidia-egl-gbm.so.1"),
        "",
        "graphics",
    ),
    lib(
        "libnvidia-egl-wayland",
        Soname::Own(
            "libnvidia-egl-wayland.so.1.1.13",
            "libnvidia-egl-wayland.so.1",
        ),
        "",
        "graphics",
    ),
    lib(
        "libnvidia-egl-xcb",
        Soname::Own("libnvidia-egl-xcb.so.1.0.1", "libnvidia-egl-xcb.so.1"),
        "",
        "graphics",
    ),
    lib(
        "libnvidia-egl-xlib",
        Soname::Own("libnvidia-egl-xlib.so.1.0.1", "libnvidia-egl-xlib.so.1"),
        "",
        "graphics",
    ),
    // nvidia-settings' front ends, which the .run installer puts beside the driver's libraries.
    lib("libnvidia-gtk2", Soname::FullVersion, "", "display"),
    lib("libnvidia-gtk3", Soname::FullVersion, "", "display"),
    lib("libnvidia-ngx", Soname::Major("1"), "", "ngx"),
];

/// Where the 32-bit libraries live (Debian's i386 multiarch dir).
pub const LIB_DIR_32: &str = "usr/lib/i386-linux-gnu";

/// The 32-bit builds the driver ships for `compat32` (the `.run` installer's 32-bit set, as
/// Ubuntu's `:i386` packages of the 580 driver hold them).
pub const DRIVER_LIBS_32: &[DriverLib] = &[
    lib32("libcuda", Soname::Major("1"), ""),
    lib32("libnvidia-ml", Soname::Major("1"), ""),
    lib32("libnvidia-ptxjitcompiler", Soname::Major("1"), ""),
    lib32("libnvidia-opencl", Soname::Major("1"), ""),
    lib32("libnvidia-gpucomp", Soname::FullVersion, ""),
    lib32("libnvcuvid", Soname::Major("1"), ""),
    lib32("libnvidia-encode", Soname::Major("1"), ""),
    lib32("libnvidia-fbc", Soname::Major("1"), ""),
    lib32("libnvidia-allocator", Soname::Major("1"), ""),
    lib32("libGLX_nvidia", Soname::Major("0"), ""),
    lib32("libEGL_nvidia", Soname::Major("0"), ""),
    lib32("libGLESv2_nvidia", Soname::Major("2"), ""),
    lib32("libGLESv1_CM_nvidia", Soname::Major("1"), ""),
    lib32("libnvidia-glcore", Soname::FullVersion, ""),
    lib32("libnvidia-eglcore", Soname::FullVersion, ""),
    lib32("libnvidia-glsi", Soname::FullVersion, ""),
    lib32("libnvidia-tls", Soname::FullVersion, ""),
    lib32("libnvidia-glvkspirv", Soname::FullVersion, ""),
    lib32("libvdpau_nvidia", Soname::Major("1"), "vdpau"),
];

/// A real GPU node's `ld.so.cache` as `ldconfig -p` lists it, one `NAME (libc6,x86-64) PATH`
/// a line (`tests/fixtures/host/README.md` says where it comes from).
const NODE_LD_CACHE: &str = include_str!("../../fixtures/host/h200-ubuntu-24.04-ldconfig-p.txt");
const NODE_LD_CACHE_PATH: &str = "tests/fixtures/host/h200-ubuntu-24.04-ldconfig-p.txt";

/// The names in the real node's cache that are not the fake driver's libraries (neither
/// `<stem>.so` nor `<stem>.so.*` for a stem of [`DRIVER_LIBS`] or [`DRIVER_LIBS_32`]), each
/// once, in the file's order: the distribution's libraries and the CUDA toolkit's.
pub fn system_library_names() -> Result<Vec<&'static str>> {
    let is_driver = |name: &str| {
        DRIVER_LIBS.iter().chain(DRIVER_LIBS_32).any(|l| {
            name.strip_prefix(l.stem)
                .and_then(|rest| rest.strip_prefix(".so"))
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
        })
    };
    let mut seen = BTreeSet::new();
    let mut names = Vec::new();
    for (i, line) in NODE_LD_CACHE.lines().enumerate() {
        let fields: Vec<&str> = line.split(' ').collect();
        let [name, "(libc6,x86-64)", path] = fields[..] else {
            bail!(
                "{NODE_LD_CACHE_PATH} line {}: {line:?} is not `NAME (libc6,x86-64) PATH`",
                i + 1
            );
        };
        ensure!(
            path.rsplit_once('/').is_some_and(|(_, file)| file == name),
            "{NODE_LD_CACHE_PATH} line {}: {path} is not a file named {name}",
            i + 1
        );
        if !is_driver(name) && seen.insert(name) {
            names.push(name);
        }
    }
    Ok(names)
}

/// The fake driver's executables in `usr/bin`, with their capability (the 580 packages').
pub const DRIVER_BINS: &[(&str, &str)] = &[
    ("nvidia-smi", "utility"),
    ("nvidia-debugdump", "utility"),
    ("nvidia-persistenced", "utility"),
    ("nvidia-cuda-mps-control", "compute"),
    ("nvidia-cuda-mps-server", "compute"),
    ("nvidia-imex", "compute"),
    ("nvidia-imex-ctl", "compute"),
    ("nvidia-xconfig", "display"),
    ("nvidia-ngx-updater", "ngx"),
    ("nvidia-powerd", "none"),
    ("nvidia-modprobe", "none"),
    ("nvidia-bug-report.sh", "none"),
];

/// The DRM character major.
pub const DRM_MAJOR: u32 = 226;
/// The groups of the DRM nodes, as Debian's base-passwd and systemd allocate them (`video` is
/// fixed at 44; `render` is a dynamic system group, 105 on a fresh Debian 12).
pub const VIDEO_GID: u32 = 44;
pub const RENDER_GID: u32 = 105;
/// The BMC's display controller: a non-NVIDIA DRM device (`card0`).
const BMC_BUS: &str = "0000:03:00.0";

/// `/proc/driver/nvidia/params` as the 580 driver prints it (abridged to the lines that matter
/// to a container).
const PARAMS: &str = "ResmanDebugLevel: 4294967295\nRmLogonRC: 1\nModifyDeviceFiles: 1\n\
DeviceFileUID: 0\nDeviceFileGID: 0\nDeviceFileMode: 438\nInitializeSystemMemoryAllocations: 1\n\
UsePageAttributeTable: 4294967295\nEnableMSI: 1\nEnablePCIeGen3: 0\nMemoryPoolSize: 0\n\
KMallocHeapMaxSize: 0\nVMallocHeapMaxSize: 0\nIgnoreMMIOCheck: 0\nEnableStreamMemOPs: 0\n\
EnableUserNUMAManagement: 1\nNvLinkDisable: 0\nRmProfilingAdminOnly: 1\nPreserveVideoMemoryAllocations: 0\n\
EnableS0ixPowerManagement: 0\nS0ixPowerManagementVideoMemoryThreshold: 256\nDynamicPowerManagement: 3\n\
DynamicPowerManagementVideoMemoryThreshold: 200\nRegisterPCIDriver: 1\nEnablePCIERelaxedOrderingMode: 0\n\
EnableResizableBar: 0\nEnableGpuFirmware: 18\nEnableGpuFirmwareLogs: 2\nEnableDbgBreakpoint: 0\n\
OpenRmEnableUnsupportedGpus: 1\nDmaRemapPeerMmio: 1\nImexChannelCount: 2048\nCreateImexChannel0: 0\n\
GrdmaPciTopoCheckOverride: 0\n";

/// The driver's configuration and data files, with their content: the loader manifests (glvnd
/// EGL vendor, EGL external platforms, Vulkan ICD and layers, Vulkan SC, OpenCL), OptiX's
/// data, the application profiles and the X.Org configuration, at the paths the 580 packages
/// install them (`<v>`: the driver version).
fn data_files(v: &str) -> Vec<(String, String)> {
    let platform = |lib: &str| {
        format!(
            "{{\n    \"file_format_version\" : \"1.0.0\",\n    \"ICD\" : {{\n        \"library_path\" : \"{lib}\"\n    }}\n}}\n"
        )
    };
    vec![
        (
            "usr/share/glvnd/egl_vendor.d/10_nvidia.json".into(),
            platform("libEGL_nvidia.so.0"),
        ),
        (
            "usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json".into(),
            platform("libnvidia-egl-gbm.so.1"),
        ),
        (
            "usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json".into(),
            platform("libnvidia-egl-wayland.so.1"),
        ),
        (
            "usr/share/egl/egl_external_platform.d/20_nvidia_xcb.json".into(),
            platform("libnvidia-egl-xcb.so.1"),
        ),
        (
            "usr/share/egl/egl_external_platform.d/20_nvidia_xlib.json".into(),
            platform("libnvidia-egl-xlib.so.1"),
        ),
        (
            "usr/share/vulkan/icd.d/nvidia_icd.json".into(),
            "{\n    \"file_format_version\" : \"1.0.1\",\n    \"ICD\": {\n        \"library_path\": \"libGLX_nvidia.so.0\",\n        \"api_version\" : \"1.4.312\"\n    }\n}\n".into(),
        ),
        (
            "usr/share/vulkan/implicit_layer.d/nvidia_layers.json".into(),
            "{\n    \"file_format_version\" : \"1.0.1\",\n    \"layer\": {\n        \"name\": \"VK_LAYER_NV_optimus\",\n        \"type\": \"INSTANCE\",\n        \"library_path\": \"libGLX_nvidia.so.0\",\n        \"api_version\" : \"1.4.312\",\n        \"implementation_version\" : \"1\",\n        \"description\" : \"NVIDIA Optimus layer\"\n    }\n}\n".into(),
        ),
        (
            "usr/share/vulkansc/icd.d/nvidia_icd_vksc.json".into(),
            "{\n    \"file_format_version\" : \"1.0.1\",\n    \"ICD\": {\n        \"library_path\": \"libnvidia-vksc-core.so.1\",\n        \"api_version\" : \"1.0.17\"\n    }\n}\n".into(),
        ),
        (
            "etc/OpenCL/vendors/nvidia.icd".into(),
            "libnvidia-opencl.so.1\n".into(),
        ),
        (
            "usr/share/nvidia/nvoptix.bin".into(),
            format!("nvshim fake OptiX data {v}\n"),
        ),
        (
            format!("usr/share/nvidia/nvidia-application-profiles-{v}-rc"),
            "{\n    \"rules\": [],\n    \"profiles\": []\n}\n".into(),
        ),
        (
            format!("usr/share/nvidia/nvidia-application-profiles-{v}-key-documentation"),
            "EGLVisibleDGPUDevices: the GPUs EGL may use, as a bit mask of device minors\n".into(),
        ),
        (
            "usr/share/X11/xorg.conf.d/10-nvidia.conf".into(),
            "Section \"OutputClass\"\n    Identifier \"nvidia\"\n    MatchDriver \"nvidia-drm\"\n    Driver \"nvidia\"\n    Option \"AllowEmptyInitialConfiguration\"\n    ModulePath \"/usr/lib/x86_64-linux-gnu/nvidia/xorg\"\nEndSection\n".into(),
        ),
    ]
}

/// GSP firmware files, relative to the root (`<v>` = driver version).
const FIRMWARE: &[&str] = &["gsp_ga10x.bin", "gsp_tu10x.bin"];

/// A built fake host. The directory stays until the caller removes it (it lives in the caller's
/// temp dir in tests).
#[derive(Debug, Clone)]
pub struct FakeHost {
    /// Driver files (the driver root).
    root: PathBuf,
    /// Holds `dev/` (the dev root): `root` unless built split.
    dev_root: PathBuf,
    /// The proc root: `<root>/proc` unless built split.
    proc_root: PathBuf,
    spec: FakeHostSpec,
}

pub(crate) fn write(path: &Path, contents: &str) -> Result<()> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    fs::write(path, contents).with_context(|| format!("writing {}", path.display()))
}

pub(crate) fn write_executable(path: &Path, contents: &str) -> Result<()> {
    write(path, contents)?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o755))
        .with_context(|| format!("making {} executable", path.display()))
}

/// `mknod PATH c MAJOR MINOR`, mode 0666 (less the umask).
pub(crate) fn make_char_node(path: &Path, major: u32, minor: u32) -> Result<()> {
    make_char_node_mode(path, major, minor, 0o666)
}

pub(crate) fn make_char_node_mode(path: &Path, major: u32, minor: u32, mode: u32) -> Result<()> {
    mknod(
        path,
        SFlag::S_IFCHR,
        Mode::from_bits_truncate(mode),
        makedev(u64::from(major), u64::from(minor)),
    )
    .with_context(|| {
        format!(
            "mknod {} c {major} {minor} (the fake host needs root)",
            path.display()
        )
    })?;
    // mknod's mode is filtered by the umask; the driver's nodes are 0666 (capabilities 0444).
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {mode:o} {}", path.display()))
}

fn toml_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// True if `toml` assigns `key` at the start of a line (`key = ...`).
fn defines_key(toml: &str, key: &str) -> bool {
    toml.lines().any(|line| {
        line.trim_start()
            .strip_prefix(key)
            .is_some_and(|rest| rest.trim_start().starts_with('='))
    })
}

impl FakeHost {
    /// Builds a fake host in `root`, which must not exist or be an empty directory. Needs root
    /// (mknod, `ldconfig -r`) and gcc.
    pub fn build(root: &Path, spec: &FakeHostSpec) -> Result<FakeHost> {
        crate::require_root()?;
        spec.validate()?;
        fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?;
        let root = root
            .canonicalize()
            .with_context(|| format!("resolving {}", root.display()))?;
        let mut entries =
            fs::read_dir(&root).with_context(|| format!("reading {}", root.display()))?;
        ensure!(
            entries.next().is_none(),
            "fake host root {} is not empty",
            root.display()
        );
        let host = FakeHost {
            dev_root: root.clone(),
            proc_root: root.join("proc"),
            root,
            spec: spec.clone(),
        };
        host.write_proc()?;
        host.make_dev_nodes()?;
        host.install_libraries()?;
        host.install_binaries()?;
        host.install_sockets_and_params()?;
        host.make_drm_nodes()?;
        host.build_ld_cache()?;
        Ok(host)
    }

    /// Builds a host split as NVIDIA's GPU Operator runs the driver: libraries, binaries,
    /// firmware and `etc/ld.so.cache` under `driver_root` (its `/run/nvidia/driver`), device
    /// nodes in `<dev_root>/dev` and the proc files in `<dev_root>/proc` (the host's). Both
    /// directories must not exist or be empty, and must differ.
    pub fn build_split(
        driver_root: &Path,
        dev_root: &Path,
        spec: &FakeHostSpec,
    ) -> Result<FakeHost> {
        crate::require_root()?;
        spec.validate()?;
        let mut roots = Vec::new();
        for dir in [driver_root, dev_root] {
            fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            let dir = dir
                .canonicalize()
                .with_context(|| format!("resolving {}", dir.display()))?;
            let mut entries =
                fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?;
            ensure!(
                entries.next().is_none(),
                "fake host root {} is not empty",
                dir.display()
            );
            roots.push(dir);
        }
        ensure!(
            roots[0] != roots[1],
            "driver root and dev root are both {}",
            roots[0].display()
        );
        let host = FakeHost {
            proc_root: roots[1].join("proc"),
            dev_root: roots[1].clone(),
            root: roots[0].clone(),
            spec: spec.clone(),
        };
        host.write_proc()?;
        host.make_dev_nodes()?;
        host.install_libraries()?;
        host.install_binaries()?;
        host.install_sockets_and_params()?;
        host.make_drm_nodes()?;
        host.build_ld_cache()?;
        Ok(host)
    }

    /// The host root, where the driver's files are: use it as `driver-root` (and, unless built
    /// with [`FakeHost::build_split`], as `dev-root`).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The directory holding `dev/`: use it as `dev-root` (the root, unless built split).
    pub fn dev_root(&self) -> &Path {
        &self.dev_root
    }

    /// `<root>/proc` (split: `<dev root>/proc`): use it as `proc-root`.
    pub fn proc_root(&self) -> PathBuf {
        self.proc_root.clone()
    }

    /// Makes MIG capabilities: writes `proc/driver/nvidia-caps/mig-minors` with the driver's
    /// whole table for this host's GPU minors (see [`mig_cap_minor`]), and the
    /// `dev/nvidia-caps/nvidia-cap<N>` nodes (mode 0444, major `caps_major`) of `config`,
    /// `monitor` and, per `(gpu minor, gpu instance, compute instance)` in `instances`, the GPU
    /// instance's and compute instance's `access` (the nodes `nvidia-smi` creates for the
    /// instances that exist). Returns the node minors made.
    pub fn add_mig_caps(&self, instances: &[(u32, u32, u32)]) -> Result<Vec<u32>> {
        write(
            &self.proc_root.join("driver/nvidia-caps/mig-minors"),
            &mig_minors_table(),
        )?;
        // `config` and `monitor` have their own files too, with the modes the H200's driver
        // gives them (0400, 0444).
        let caps = self.proc_root.join("driver/nvidia/capabilities/mig");
        for (name, minor, mode) in [
            ("config", MIG_CONFIG_MINOR, 256),
            ("monitor", MIG_MONITOR_MINOR, 292),
        ] {
            write(
                &caps.join(name),
                &format!("DeviceFileMinor: {minor}\nDeviceFileMode: {mode}\nDeviceFileModify: 1\n"),
            )?;
        }
        let mut made = vec![MIG_CONFIG_MINOR, MIG_MONITOR_MINOR];

        for &(g, gi, ci) in instances {
            ensure!(
                self.spec.gpus.iter().any(|x| x.minor == g),
                "no GPU with minor {g} for MIG instance gi{gi}/ci{ci}"
            );
            ensure!(
                gi < MIG_GPU_INSTANCES && ci < MIG_COMPUTE_INSTANCES,
                "MIG instance gi{gi}/ci{ci} is out of the driver's range"
            );
            for m in [mig_cap_minor(g, gi, None), mig_cap_minor(g, gi, Some(ci))] {
                if !made.contains(&m) {
                    made.push(m);
                }
            }
        }
        // The driver lists each created instance under /proc (NVIDIA's MIG user guide, "Device
        // Nodes and Capabilities"): `capabilities/gpu<N>/mig/gi<G>/access` and `.../ci<C>/access`.
        for &(g, gi, ci) in instances {
            let base = self
                .proc_root
                .join(format!("driver/nvidia/capabilities/gpu{g}/mig/gi{gi}"));
            for (dir, minor) in [
                (base.clone(), mig_cap_minor(g, gi, None)),
                (base.join(format!("ci{ci}")), mig_cap_minor(g, gi, Some(ci))),
            ] {
                write(
                    &dir.join("access"),
                    &format!(
                        "DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n"
                    ),
                )?;
            }
        }
        let dir = self.dev_root.join("dev/nvidia-caps");
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        for m in &made {
            let node = dir.join(format!("nvidia-cap{m}"));
            if !node.exists() {
                make_char_node_mode(&node, self.spec.caps_major, *m, 0o444)?;
            }
        }
        Ok(made)
    }

    /// Makes `dev/nvidia-caps-imex-channels/channel<N>` (major `caps_imex_major`, minor `N`,
    /// mode 0666) for each id.
    pub fn add_imex_channels(&self, ids: &[u32]) -> Result<()> {
        let dir = self.dev_root.join("dev/nvidia-caps-imex-channels");
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        for id in ids {
            let node = dir.join(format!("channel{id}"));
            if !node.exists() {
                make_char_node(&node, self.spec.caps_imex_major, *id)?;
            }
        }
        Ok(())
    }

    /// Adds the NVLink fabric's IMEX management capability, as the driver exposes it on an
    /// NVLink-fabric node such as GB200 (its `nv-caps` "sys" table): the capability file
    /// `proc/driver/nvidia/capabilities/fabric-imex-mgmt`, in the format of the MIG ones
    /// (tests/fixtures/host/README.md), and its node `dev/nvidia-caps/nvidia-cap<minor>` (major
    /// `caps_major`, mode 0400: for the IMEX daemon, not for containers). The minor is
    /// [`FABRIC_IMEX_MGMT_MINOR`], which it returns.
    pub fn add_fabric_imex_mgmt(&self) -> Result<u32> {
        let minor = FABRIC_IMEX_MGMT_MINOR;
        write(
            &self
                .proc_root()
                .join("driver/nvidia/capabilities/fabric-imex-mgmt"),
            &format!("DeviceFileMinor: {minor}\nDeviceFileMode: 256\nDeviceFileModify: 1\n"),
        )?;
        let dir = self.dev_root.join("dev/nvidia-caps");
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let node = dir.join(format!("nvidia-cap{minor}"));
        if !node.exists() {
            make_char_node_mode(&node, self.spec.caps_major, minor, 0o400)?;
        }
        Ok(minor)
    }

    /// Adds a real GPU node's own libraries to the host's `ld.so.cache`, so that it is about as
    /// large as that node's (`tests/fixtures/host/`: 520 entries; the fake driver's alone are
    /// 56, with these about 480): per name of [`system_library_names`], a 64-bit stub whose
    /// SONAME is that name, unless a file of that name is there already. They all go in one
    /// directory, where the node has them in several (its distribution's and the CUDA
    /// toolkit's): a simplification, a reader of the cache meets the same names under other
    /// paths. That directory is the layout's 64-bit library directory, but the Debian one for
    /// [`Layout::UsrLocalNvidia`], whose `usr/local/nvidia/lib64` holds only the driver's. Then
    /// rebuilds the cache. Returns how many stubs it added.
    pub fn add_system_libraries(&self) -> Result<usize> {
        let dir = self.root.join(match self.spec.layout {
            Layout::UsrLocalNvidia => Layout::Debian.lib_dir(),
            layout => layout.lib_dir(),
        });
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let template_path = stubs::compiled_system_stub()?;
        let template = fs::read(&template_path)
            .with_context(|| format!("reading {}", template_path.display()))?;
        let mut added = 0;
        for name in system_library_names()? {
            let path = dir.join(name);
            if fs::symlink_metadata(&path).is_ok() {
                continue;
            }
            fs::write(&path, stubs::system_stub(&template, name)?)
                .with_context(|| format!("writing {}", path.display()))?;
            added += 1;
        }
        self.build_ld_cache()?;
        Ok(added)
    }

    /// The GPUs as specified (for [`FakeHostSpec::with_gpus`]: by minor).
    pub fn gpus(&self) -> &[FakeGpu] {
        &self.spec.gpus
    }

    /// The spec this host was built from.
    pub fn spec(&self) -> &FakeHostSpec {
        &self.spec
    }

    /// Driver version, e.g. `580.65.06`.
    pub fn driver_version(&self) -> &str {
        &self.spec.driver_version
    }

    /// The GPUs in PCI bus-id order: position = the index nvidia-smi and `NVIDIA_VISIBLE_DEVICES`
    /// use.
    pub fn gpus_by_bus(&self) -> Vec<&FakeGpu> {
        let mut gpus: Vec<&FakeGpu> = self.spec.gpus.iter().collect();
        gpus.sort_by_key(|g| g.bus_id.to_ascii_lowercase());
        gpus
    }

    /// The GPU that `NVIDIA_VISIBLE_DEVICES=<index>` selects.
    pub fn gpu_at_index(&self, index: usize) -> Option<&FakeGpu> {
        self.gpus_by_bus().get(index).copied()
    }

    /// The library with this stem (`libcuda`), if the fake driver has it.
    pub fn library(&self, stem: &str) -> Option<&'static DriverLib> {
        DRIVER_LIBS.iter().find(|l| l.stem == stem)
    }

    /// All the fake driver's libraries.
    pub fn libraries(&self) -> &'static [DriverLib] {
        DRIVER_LIBS
    }

    /// Where a library appears in a container (and, below the root, on the host):
    /// `/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06`. Panics on an unknown stem: this is a
    /// test helper and the stems are fixed.
    pub fn container_lib_path(&self, stem: &str) -> String {
        match self.library(stem) {
            Some(lib) => self.lib_path(lib),
            None => panic!("the fake driver has no library {stem}"),
        }
    }

    /// Where `lib` is in this host's layout, as a container sees it:
    /// `/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06` (`/usr/lib64/...` on RHEL).
    pub fn lib_path(&self, lib: &DriverLib) -> String {
        format!(
            "/{}/{}",
            self.lib_dir_of(lib),
            lib.file_name(&self.spec.driver_version)
        )
    }

    /// `lib`'s directory in this host's layout, relative to the root.
    pub fn lib_dir_of(&self, lib: &DriverLib) -> String {
        let base = if lib.is_32bit() {
            self.spec.layout.lib_dir_32()
        } else {
            self.spec.layout.lib_dir()
        };
        if lib.subdir.is_empty() {
            base.to_string()
        } else {
            format!("{base}/{}", lib.subdir)
        }
    }

    /// The X.Org modules' paths in a container: (driver, GLX server module).
    pub fn xorg_module_paths(&self) -> (String, String) {
        let (a, b) = self.spec.layout.xorg_modules(&self.spec.driver_version);
        (format!("/{a}"), format!("/{b}"))
    }

    /// The host path of a path as seen in a container (`/usr/bin/nvidia-smi` → `<root>/usr/bin/...`).
    pub fn host_path(&self, container_path: &str) -> PathBuf {
        self.root.join(container_path.trim_start_matches('/'))
    }

    /// Writes an nvshim `config.toml` at `path` pointing at this host: low-level runtime `runc`,
    /// the three roots, `log-file` next to the config (`nvshim.log`), debug logging, env requests
    /// accepted from unprivileged containers. `extra_toml` is appended; a top-level key it assigns
    /// replaces the default one (so `extra_toml = "log-level = \"info\""` works).
    pub fn write_config(&self, path: &Path, extra_toml: &str) -> Result<()> {
        let dir = path
            .parent()
            .with_context(|| format!("config path {} has no parent", path.display()))?;
        let root = self.root.to_string_lossy();
        let defaults: [(&str, String); 8] = [
            ("low-level-runtimes", "[\"runc\"]".to_string()),
            ("driver-root", toml_string(&root)),
            ("dev-root", toml_string(&self.dev_root.to_string_lossy())),
            (
                "proc-root",
                toml_string(&self.proc_root().to_string_lossy()),
            ),
            (
                "log-file",
                toml_string(&dir.join("nvshim.log").to_string_lossy()),
            ),
            ("log-level", toml_string("debug")),
            ("accept-envvar-unprivileged", "true".to_string()),
            // The CDI index next to the config, not in the machine's /run/nvshim.
            (
                "cache-dir",
                toml_string(&dir.join("cache").to_string_lossy()),
            ),
        ];
        let mut out = format!(
            "# nvshim configuration for the fake GPU host at {root} (written by nvshim-testsupport)\n"
        );
        for (key, value) in &defaults {
            if !defines_key(extra_toml, key) {
                let _ = writeln!(out, "{key} = {value}");
            }
        }
        if !extra_toml.is_empty() {
            out.push_str(extra_toml);
            if !extra_toml.ends_with('\n') {
                out.push('\n');
            }
        }
        write(path, &out)
    }

    /// A human-readable summary of the layout, for the `nvshim-fake-host` binary and the demo.
    pub fn describe(&self) -> String {
        let v = &self.spec.driver_version;
        let mut s = String::new();
        let _ = writeln!(s, "fake GPU host at {}", self.root.display());
        let _ = writeln!(
            s,
            "  driver {v}, {} GPU(s); use it as driver-root and dev-root, proc-root = {}",
            self.spec.gpus.len(),
            self.proc_root().display()
        );
        let _ = writeln!(
            s,
            "  GPUs (index = PCI bus order, as nvidia-smi numbers them):"
        );
        for (i, g) in self.gpus_by_bus().iter().enumerate() {
            let _ = writeln!(
                s,
                "    index {i}: {}  {}  bus {}  /dev/nvidia{} (char {NVIDIA_MAJOR}:{})",
                g.model, g.uuid, g.bus_id, g.minor, g.minor
            );
        }
        let _ = writeln!(
            s,
            "  control nodes: dev/nvidiactl ({NVIDIA_MAJOR}:{NVIDIACTL_MINOR}), dev/nvidia-modeset \
             ({NVIDIA_MAJOR}:{MODESET_MINOR}), dev/nvidia-uvm ({0}:0), dev/nvidia-uvm-tools ({0}:1)",
            self.spec.uvm_major
        );
        let _ = writeln!(
            s,
            "  proc: proc/devices ({NVIDIA_MAJOR} {}, {} nvidia-uvm, {} nvidia-caps), \
             proc/driver/nvidia/version, proc/driver/nvidia/gpus/<bus>/information",
            self.spec.frontend_name, self.spec.uvm_major, self.spec.caps_major
        );
        let _ = writeln!(s, "  libraries ({LIB_DIR}, SONAME links, etc/ld.so.cache):");
        for l in DRIVER_LIBS {
            let _ = writeln!(
                s,
                "    {:<10} {}/{} (SONAME {})",
                l.capability,
                l.dir(),
                l.file_name(v),
                l.soname(v)
            );
        }
        let bins: Vec<&str> = DRIVER_BINS.iter().map(|(b, _)| *b).collect();
        let _ = writeln!(s, "  binaries (usr/bin): {}", bins.join(", "));
        let _ = writeln!(
            s,
            "  firmware: lib/firmware/nvidia/{v}/{}",
            FIRMWARE.join(", ")
        );
        s
    }

    fn write_proc(&self) -> Result<()> {
        let spec = &self.spec;
        let proc_dir = self.proc_root();

        // /proc/devices: the kernel prints "%3d %s\n" per major, sorted by major.
        let mut chars: Vec<(u32, String)> = [
            (1, "mem"),
            (4, "/dev/vc/0"),
            (4, "tty"),
            (4, "ttyS"),
            (5, "/dev/tty"),
            (5, "/dev/console"),
            (5, "/dev/ptmx"),
            (7, "vcs"),
            (10, "misc"),
            (13, "input"),
            (29, "fb"),
            (128, "ptm"),
            (136, "pts"),
            (180, "usb"),
            (226, "drm"),
        ]
        .iter()
        .map(|(m, n)| (*m, (*n).to_string()))
        .collect();
        chars.push((NVIDIA_MAJOR, spec.frontend_name.clone()));
        chars.push((spec.uvm_major, "nvidia-uvm".to_string()));
        chars.push((spec.caps_major, "nvidia-caps".to_string()));
        chars.push((
            spec.caps_imex_major,
            "nvidia-caps-imex-channels".to_string(),
        ));
        if let Some(g) = &spec.gated {
            chars.extend(
                g.proc_devices()
                    .into_iter()
                    .map(|(m, n)| (m, n.to_string())),
            );
        }
        chars.sort_by_key(|(m, _)| *m);
        let mut devices = String::from("Character devices:\n");
        for (major, name) in &chars {
            let _ = writeln!(devices, "{major:3} {name}");
        }
        devices.push_str("\nBlock devices:\n");
        for (major, name) in [
            (7, "loop"),
            (8, "sd"),
            (9, "md"),
            (11, "sr"),
            (65, "sd"),
            (253, "device-mapper"),
            (254, "mdp"),
            (259, "blkext"),
        ] {
            let _ = writeln!(devices, "{major:3} {name}");
        }
        write(&proc_dir.join("devices"), &devices)?;

        let nvidia = proc_dir.join("driver/nvidia");
        write(
            &nvidia.join("version"),
            &spec
                .kernel_modules
                .banner(&spec.driver_version, spec.layout.machine()),
        )?;
        for (i, gpu) in spec.gpus.iter().enumerate() {
            let mut info = String::new();
            for (key, value) in [
                ("Model:", gpu.model.clone()),
                ("IRQ:", (112 + 2 * i).to_string()),
                ("GPU UUID:", gpu.uuid.clone()),
                ("Video BIOS:", "96.00.99.00.01".to_string()),
                ("Bus Type:", "PCIe".to_string()),
                ("DMA Size:", "52 bits".to_string()),
                ("DMA Mask:", "0xfffffffffffff".to_string()),
                ("Bus Location:", gpu.bus_id.clone()),
                ("Device Minor:", gpu.minor.to_string()),
                ("GPU Excluded:", "No".to_string()),
            ] {
                let _ = writeln!(info, "{key:<17}{value}");
            }
            write(
                &nvidia.join("gpus").join(&gpu.bus_id).join("information"),
                &info,
            )?;
        }
        Ok(())
    }

    fn make_dev_nodes(&self) -> Result<()> {
        let dev = self.dev_root.join("dev");
        fs::create_dir_all(&dev).with_context(|| format!("creating {}", dev.display()))?;
        for gpu in &self.spec.gpus {
            make_char_node(
                &dev.join(format!("nvidia{}", gpu.minor)),
                NVIDIA_MAJOR,
                gpu.minor,
            )?;
        }
        make_char_node(&dev.join("nvidiactl"), NVIDIA_MAJOR, NVIDIACTL_MINOR)?;
        make_char_node(&dev.join("nvidia-modeset"), NVIDIA_MAJOR, MODESET_MINOR)?;
        make_char_node(&dev.join("nvidia-uvm"), self.spec.uvm_major, 0)?;
        make_char_node(&dev.join("nvidia-uvm-tools"), self.spec.uvm_major, 1)?;
        if let Some(g) = &self.spec.gated {
            g.make(&dev, &self.root)?;
        }
        Ok(())
    }

    fn install_libraries(&self) -> Result<()> {
        let v = &self.spec.driver_version;
        // Merged /usr, as on Debian 12 and Ubuntu 24.04: /lib is a link to usr/lib, so the
        // firmware's `/lib/firmware` path and ldconfig's `/lib/x86_64-linux-gnu` go through it.
        for (link, target) in [
            ("lib", "usr/lib"),
            ("bin", "usr/bin"),
            ("sbin", "usr/sbin"),
            ("lib64", "usr/lib64"),
        ] {
            fs::create_dir_all(self.root.join(target))
                .with_context(|| format!("creating {target}"))?;
            let l = self.root.join(link);
            if fs::symlink_metadata(&l).is_err() {
                symlink(target, &l)
                    .with_context(|| format!("linking {} -> {target}", l.display()))?;
            }
        }
        let stub_dir = stubs::compiled_stubs(v, self.spec.cuda_version, self.spec.layout)?;
        for lib in DRIVER_LIBS.iter().chain(self.libraries_32()) {
            let dir = self.root.join(self.lib_dir_of(lib));
            let file = lib.file_name(v);
            stubs::install(&stub_dir, lib, v, &dir.join(&file))?;
            let soname = lib.soname(v);
            if soname != file {
                let link = dir.join(&soname);
                symlink(&file, &link)
                    .with_context(|| format!("linking {} -> {file}", link.display()))?;
            }
        }
        // The development link the driver installer also creates.
        let lib_dir = self.spec.layout.lib_dir();
        let dev_link = self.root.join(lib_dir).join("libcuda.so");
        symlink("libcuda.so.1", &dev_link)
            .with_context(|| format!("linking {} -> libcuda.so.1", dev_link.display()))?;
        // GBM's backend is a link to the allocator.
        let gbm = self.root.join(lib_dir).join("gbm");
        fs::create_dir_all(&gbm).with_context(|| format!("creating {}", gbm.display()))?;
        symlink("../libnvidia-allocator.so.1", gbm.join("nvidia-drm_gbm.so"))
            .context("linking gbm/nvidia-drm_gbm.so")?;
        // The X.Org modules, where the distribution's packages put them, and the GLX server
        // module's development link.
        let (driver, glx) = self.spec.layout.xorg_modules(v);
        for path in [&driver, &glx] {
            write(
                &self.root.join(path),
                &format!("nvshim fake X.Org module {path} {v}\n"),
            )?;
        }
        let glx = self.root.join(&glx);
        symlink(
            format!("libglxserver_nvidia.so.{v}"),
            glx.with_file_name("libglxserver_nvidia.so"),
        )
        .context("linking libglxserver_nvidia.so")?;

        let firmware = self.root.join("lib/firmware/nvidia").join(v);
        for name in FIRMWARE {
            write(
                &firmware.join(name),
                &format!("nvshim fake GSP firmware {v}\n"),
            )?;
        }
        for (path, content) in data_files(v) {
            write(&self.root.join(path), &content)?;
        }
        Ok(())
    }

    /// The daemons' sockets (real unix sockets, as nvidia-persistenced and the fabric manager
    /// leave them) and the driver's `params` file.
    fn install_sockets_and_params(&self) -> Result<()> {
        for dir in ["run/nvidia-persistenced", "run/nvidia-fabricmanager"] {
            let d = self.root.join(dir);
            fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
            let sock = d.join("socket");
            // Binding creates the socket file; it stays after the listener closes.
            std::os::unix::net::UnixListener::bind(&sock)
                .with_context(|| format!("binding {}", sock.display()))?;
        }
        write(&self.proc_root().join("driver/nvidia/params"), PARAMS)
    }

    /// The DRM nodes: a non-NVIDIA `card0` (the BMC's display), then per GPU in bus order a
    /// card node (226:N from 1) and a render node (226:128+k), mode 0660 in the groups
    /// `video` and `render`, their `by-path` links, and the sysfs entries that tie them to the
    /// GPU's PCI device (`<sys>/bus/pci/devices/<bus>/drm/<node>`), as udev and the kernel lay
    /// them out.
    fn make_drm_nodes(&self) -> Result<()> {
        let dri = self.dev_root.join("dev/dri");
        let by_path = dri.join("by-path");
        fs::create_dir_all(&by_path).with_context(|| format!("creating {}", by_path.display()))?;
        let sys = self.sys_root().join("bus/pci/devices");
        let mut nodes = vec![(BMC_BUS.to_string(), "card0".to_string(), 0u32, VIDEO_GID)];
        for (k, g) in self.gpus_by_bus().iter().enumerate() {
            let k = k as u32;
            nodes.push((g.bus_id.clone(), format!("card{}", k + 1), k + 1, VIDEO_GID));
            nodes.push((
                g.bus_id.clone(),
                format!("renderD{}", 128 + k),
                128 + k,
                RENDER_GID,
            ));
        }
        for (bus, name, minor, gid) in nodes {
            let node = dri.join(&name);
            make_char_node_mode(&node, DRM_MAJOR, minor, 0o660)?;
            nix::unistd::chown(&node, None, Some(nix::unistd::Gid::from_raw(gid)))
                .with_context(|| format!("chgrp {gid} {}", node.display()))?;
            let kind = if name.starts_with("card") {
                "card"
            } else {
                "render"
            };
            symlink(
                format!("../{name}"),
                by_path.join(format!("pci-{bus}-{kind}")),
            )
            .with_context(|| format!("linking by-path for {name}"))?;
            let d = sys.join(&bus).join("drm").join(&name);
            fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
            // The PCI ids as sysfs prints them: NVIDIA's vendor and the 3D-controller class of
            // data-centre GPUs; the BMC an ASPEED VGA device.
            let (vendor, class) = if bus == BMC_BUS {
                ("0x1a03", "0x030000")
            } else {
                ("0x10de", "0x030200")
            };
            write(&sys.join(&bus).join("vendor"), &format!("{vendor}\n"))?;
            write(&sys.join(&bus).join("class"), &format!("{class}\n"))?;
        }
        Ok(())
    }

    /// The host's sysfs, beside its procfs (as `/sys` is beside `/proc`).
    pub fn sys_root(&self) -> PathBuf {
        self.proc_root()
            .parent()
            .map_or_else(|| PathBuf::from("/sys"), |p| p.join("sys"))
    }

    /// The 32-bit libraries (none on aarch64).
    pub fn libraries_32(&self) -> &'static [DriverLib] {
        self.spec.layout.libraries_32()
    }

    fn build_ld_cache(&self) -> Result<()> {
        // As Debian writes them: ld.so.conf includes ld.so.conf.d, whose multiarch files list
        // /lib/<triplet> before /usr/lib/<triplet>, so on a merged-/usr host the cache names
        // every library through /lib.
        write(
            &self.root.join("etc/ld.so.conf"),
            "include /etc/ld.so.conf.d/*.conf\n\n",
        )?;
        for (path, text) in self.spec.layout.ld_conf() {
            write(&self.root.join(path), text)?;
        }
        // ldconfig -r chroots into the root, reads etc/ld.so.conf there and writes
        // etc/ld.so.cache there; -X keeps it from touching our SONAME links. An aarch64 host's
        // is the arm64 glibc's ldconfig (static, run by qemu through binfmt_misc): this
        // machine's would skip aarch64 objects.
        let ldconfig = if self.spec.layout.is_aarch64() {
            crate::arm64::root()
                .map_err(|why| anyhow::anyhow!("building an aarch64 host: {why}"))?
                .join("sbin/ldconfig")
        } else {
            PathBuf::from("/sbin/ldconfig")
        };
        let out = Command::new(&ldconfig)
            .arg("-X")
            .arg("-r")
            .arg(&self.root)
            .output()
            .with_context(|| format!("running {}", ldconfig.display()))?;
        if !out.status.success() {
            bail!(
                "{} -r {} failed: {}",
                ldconfig.display(),
                self.root.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let cache = self.root.join("etc/ld.so.cache");
        ensure!(
            cache.exists(),
            "{} -r {} wrote no {}",
            ldconfig.display(),
            self.root.display(),
            cache.display()
        );
        Ok(())
    }

    fn install_binaries(&self) -> Result<()> {
        let bin = self.root.join(self.spec.layout.bin_dir());
        let v = &self.spec.driver_version;
        write_executable(&bin.join("nvidia-smi"), &self.nvidia_smi_script())?;
        for (name, _) in DRIVER_BINS.iter().filter(|(n, _)| *n != "nvidia-smi") {
            write_executable(
                &bin.join(name),
                &format!(
                    "#!/bin/sh\n# nvshim fake driver {v}: a stand-in for {name}.\n\
                     echo \"{name} (nvshim fake driver {v})\"\n"
                ),
            )?;
        }
        Ok(())
    }

    /// A busybox-compatible `nvidia-smi` that lists the GPUs whose `/dev/nvidia<minor>` node is
    /// present, numbered in bus order among those present, as the real tool does in a container.
    fn nvidia_smi_script(&self) -> String {
        let mut table = String::new();
        for g in self.gpus_by_bus() {
            let _ = writeln!(table, "{}|{}|{}|{}", g.minor, g.bus_id, g.uuid, g.model);
        }
        format!(
            r#"#!/bin/sh
# nvidia-smi stand-in from nvshim's fake GPU host (driver {v}).
# Lists the GPUs whose /dev/nvidia<minor> node is present, numbered in PCI bus order.
# Table: minor|bus id|uuid|model, sorted by bus id.
i=0
while IFS='|' read -r minor bus uuid model; do
    if [ -c "/dev/nvidia$minor" ]; then
        echo "GPU $i: $model (UUID: $uuid)"
        i=$((i + 1))
    fi
done <<'EOF'
{table}EOF
if [ "$i" -eq 0 ]; then
    echo "No devices found."
    exit 6
fi
exit 0
"#,
            v = self.spec.driver_version
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_gpus_puts_minor_order_against_bus_order() {
        let spec = FakeHostSpec::with_gpus(2);
        assert_eq!(spec.gpus[0].minor, 0);
        assert_eq!(spec.gpus[0].bus_id, "0000:3b:00.0");
        assert_eq!(spec.gpus[1].minor, 1);
        assert_eq!(spec.gpus[1].bus_id, "0000:1b:00.0");
        assert_ne!(spec.gpus[0].uuid, spec.gpus[1].uuid);
        assert!(spec.gpus[0].uuid.starts_with("GPU-"));
        assert_eq!(spec.gpus[0].uuid.len(), 40);
        spec.validate().unwrap();
        let many = FakeHostSpec::with_gpus(12);
        many.validate().unwrap();
    }

    #[test]
    fn defines_key_matches_assignments_only() {
        assert!(defines_key("log-level = \"info\"\n", "log-level"));
        assert!(defines_key("  log-level=\"info\"", "log-level"));
        assert!(!defines_key("log-level-x = 1", "log-level"));
        assert!(!defines_key("# log-level = 1", "log-level"));
    }

    /// The real node's cache less the fake driver's libraries: its distribution's and the CUDA
    /// toolkit's, each short enough for the stub's SONAME.
    #[test]
    fn the_mig_minors_table_is_the_drivers() {
        assert_eq!(
            mig_minors_table(),
            include_str!("../../fixtures/host/h200-mig-minors.txt")
        );
    }

    #[test]
    fn system_libraries_are_the_node_cache_less_the_driver() {
        let names = system_library_names().unwrap();
        assert_eq!(names.len(), 423);
        for name in [
            "libc.so.6",
            "libcudart.so.13",
            "libnvrtc.so.13",
            "libXNVCtrl.so.0",
        ] {
            assert!(names.contains(&name), "{name} missing");
        }
        for name in [
            "libcuda.so",
            "libcuda.so.1",
            "libnvidia-ml.so.1",
            "libnvidia-pkcs11-openssl3.so.580.159.04",
        ] {
            assert!(!names.contains(&name), "{name} is the driver's");
        }
        let longest = names.iter().map(|n| n.len()).max().unwrap();
        assert!(longest < stubs::SONAME_PLACEHOLDER.len(), "{longest}");
    }

    #[test]
    fn toml_strings_are_escaped() {
        assert_eq!(toml_string(r#"a"b\c"#), r#""a\"b\\c""#);
    }
}
