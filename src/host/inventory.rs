//! The node's inventory: what the resolvers need of the GPU host (driver version, GPUs, MIG
//! devices, device nodes with their majors, DRM and IMEX nodes, the driver's files per
//! capability, its sockets), read by one function, [`Inventory::read`], into one plain value.
//! `create` reads it once per command, `cdi generate`, `doctor` and `explain` read the same
//! value, and a long-running process can hold one and read it again when the host changes.
//! The legacy resolver (`crate::legacy::resolve`) is a function of it, so its tests build one
//! by hand.
//!
//! A [`Scope`] says which parts to read: the driver files of which capabilities, and whether
//! the MIG, DRM and IMEX parts at all. `create` reads what its request can use (a compute
//! request on 8 GPUs reads no graphics library, DRM node or MIG directory: the per-request
//! reads it made before, measured in the commit that made this); the others read
//! [`Scope::ALL`]. NVML is not part of it: the legacy resolver asks it, through a function
//! it is given, only for the MIG ids that need it.
//!
//! A new device class or platform plugs in here: a field for what it finds, filled by
//! [`Inventory::read`] from a discovery function in its own file of `src/host` (gated by a
//! [`Scope`] flag when it costs a create something), and a step of the legacy resolver in
//! `src/legacy` that turns the field into edits.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::nvidia::{self, brings, Capabilities};

use super::{
    DeviceMajors, DriverLibrary, Gpu, Host, HostDeviceNode, HostError, HostFile, HostRoots,
    WordSize,
};

/// Which parts of the host [`Inventory::read`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scope {
    /// The driver files of these capabilities, and with a graphics capability the GPUs' DRM
    /// nodes (`nvidia::DRM_BROUGHT_BY`).
    pub capabilities: Capabilities,
    /// The MIG devices the driver lists, their capability minors and nodes, and the `config`
    /// and `monitor` capabilities.
    pub mig: bool,
    /// The IMEX channel nodes.
    pub imex: bool,
}

impl Scope {
    /// Everything: what `cdi generate`, `doctor` and a long-running process read.
    pub const ALL: Scope = Scope {
        capabilities: Capabilities::ALL,
        mig: true,
        imex: true,
    };

    /// Whether the driver files of `caps` were read.
    pub fn covers(&self, caps: &Capabilities) -> bool {
        let s = &self.capabilities;
        [
            (caps.compute, s.compute),
            (caps.compat32, s.compat32),
            (caps.graphics, s.graphics),
            (caps.utility, s.utility),
            (caps.video, s.video),
            (caps.display, s.display),
            (caps.ngx, s.ngx),
        ]
        .iter()
        .all(|(wanted, read)| !wanted || *read)
    }
}

/// A MIG device by its numbers: (GPU minor, GPU instance, compute instance).
pub type MigKey = (u32, u32, u32);

/// A MIG device the driver has created: its GPU's minor, GPU instance and compute instance,
/// and the minors of its two capabilities.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigInstance {
    pub gpu_minor: u32,
    pub gpu_instance: u32,
    pub compute_instance: u32,
    /// The minors of the capabilities [`MigInstance::capabilities`] names, in its order
    /// (GPU instance, compute instance); `None`: no file or table row for it.
    pub minors: [Option<u32>; 2],
}

/// The driver's files as found for the capabilities of a [`Scope`]; `crate::legacy::driver_files`
/// picks those of a request's capabilities.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriverFileSet {
    /// 64-bit libraries, in `nvidia::LIBRARIES` order (those in a subdirectory last).
    pub libs64: Vec<DriverLibrary>,
    /// 32-bit libraries (`compat32`), in the same order.
    pub libs32: Vec<DriverLibrary>,
    /// The development links (`<stem>.so`, symlinks) the host has beside the libraries, as
    /// container paths.
    pub dev_links: Vec<String>,
    /// Executables, each at `/usr/bin/<name>`, in `nvidia::EXECUTABLES` order.
    pub binaries: Vec<HostFile>,
    /// Data files, each with its index in `nvidia::DATA_FILES`.
    pub data_files: Vec<(usize, HostFile)>,
    pub xorg_modules: Vec<HostFile>,
    pub firmware: Vec<HostFile>,
    /// The daemons' IPC endpoints that exist under the driver root (`Host::ipc_paths`): the
    /// persistenced and fabric manager sockets, the MPS pipe directory.
    pub ipc: Vec<HostFile>,
}

/// The node's inventory ([module docs](self)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inventory {
    /// Where it was read from (error messages name paths under them).
    pub roots: HostRoots,
    /// What was read.
    pub scope: Scope,
    pub driver_version: String,
    /// In PCI bus order.
    pub gpus: Vec<Gpu>,
    pub majors: DeviceMajors,
    /// The device nodes found under `<dev-root>/dev`, by their name there (`nvidia0`,
    /// `nvidia-caps/nvidia-cap12`, `dri/card1`): the GPUs', the control nodes, the MIG
    /// capability nodes, the IMEX channels. Absent: not there, or not a device node.
    pub nodes: BTreeMap<String, HostDeviceNode>,
    /// Each GPU's DRM card and render nodes, by PCI bus id (graphics scope).
    pub drm: BTreeMap<String, Vec<HostDeviceNode>>,
    /// The `<dev-root>/dev/dri/by-path` links: (target, link), sorted.
    pub drm_by_path: Vec<(String, String)>,
    /// The MIG devices the driver lists, sorted by GPU minor, GPU and compute instance.
    pub mig: Vec<MigInstance>,
    /// The minors of the `config` and `monitor` MIG capabilities; `None`: none.
    pub mig_config_minor: Option<u32>,
    pub mig_monitor_minor: Option<u32>,
    /// The IMEX channels whose nodes exist, sorted.
    pub imex_channels: Vec<u32>,
    pub files: DriverFileSet,
    /// The host MPS daemon's pipe directory, when it is one (compute scope).
    pub mps_pipe_directory: Option<PathBuf>,
}

/// What selects the reads besides the roots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadSettings {
    pub scope: Scope,
    /// `cache-dir`: where the host keeps the GPU and MIG facts it read; empty: nowhere.
    pub cache_dir: PathBuf,
    /// `mps-pipe-directory`.
    pub mps_pipe_directory: PathBuf,
}

impl ReadSettings {
    /// What `config` sets (`cache-dir`, `mps-pipe-directory`), for `scope`.
    pub fn new(config: &crate::config::Config, scope: Scope) -> ReadSettings {
        ReadSettings {
            scope,
            cache_dir: config.cache_dir.clone(),
            mps_pipe_directory: config.mps_pipe_directory.clone(),
        }
    }
}

/// The roots `config` names.
pub fn roots(config: &crate::config::Config) -> HostRoots {
    HostRoots {
        driver_root: config.driver_root.clone(),
        dev_root: config.dev_root.clone(),
        proc_root: config.proc_root.clone(),
    }
}

impl Inventory {
    /// Reads the inventory of the host under `roots`: what a long-running process holds, and
    /// reads again when the host changes (`Inventory::read(&roots(&config),
    /// &ReadSettings::new(&config, Scope::ALL))`).
    pub fn read(roots: &HostRoots, settings: &ReadSettings) -> Result<Inventory, HostError> {
        let host = Host::new(roots.clone()).with_cache_dir(&settings.cache_dir);
        Inventory::of(&host, settings.scope, &settings.mps_pipe_directory)
    }

    /// [`Inventory::read`] through a [`Host`] the caller already has.
    pub fn of(
        host: &Host,
        scope: Scope,
        mps_pipe_directory: &Path,
    ) -> Result<Inventory, HostError> {
        Inventory::of_mig_devices(host, scope, mps_pipe_directory, None)
    }

    /// [`Inventory::of`], with the MIG part (in a MIG scope) for the devices `mig_devices`
    /// names, as (GPU minor, GPU instance, compute instance), instead of every device the
    /// driver lists: a create that names its MIG devices (mapped through NVML first, when
    /// they need it) reads the minors and nodes of those alone, not of every device on the
    /// node (`/proc`'s capabilities tree is 66 directories on 8 GPUs x 7 devices).
    pub fn of_mig_devices(
        host: &Host,
        scope: Scope,
        mps_pipe_directory: &Path,
        mig_devices: Option<&[MigKey]>,
    ) -> Result<Inventory, HostError> {
        let majors = host.device_majors()?;
        let driver_version = host.driver_version()?;
        let gpus = host.gpus()?;
        let caps = &scope.capabilities;
        let mut inv = Inventory {
            roots: host.roots().clone(),
            scope,
            files: read_driver_files(host, caps, &driver_version)?,
            driver_version,
            gpus,
            majors,
            nodes: BTreeMap::new(),
            drm: BTreeMap::new(),
            drm_by_path: Vec::new(),
            mig: Vec::new(),
            mig_config_minor: None,
            mig_monitor_minor: None,
            imex_channels: Vec::new(),
            mps_pipe_directory: None,
        };
        let stat = |nodes: &mut BTreeMap<String, HostDeviceNode>, name: String| {
            if let Some(n) = host.device_node(&name) {
                nodes.insert(name, n);
            }
        };
        for g in &inv.gpus {
            stat(
                &mut inv.nodes,
                ["nvidia", itoa::Buffer::new().format(g.minor)].concat(),
            );
        }
        for name in [
            "nvidiactl",
            "nvidia-uvm",
            "nvidia-uvm-tools",
            "nvidia-modeset",
        ] {
            stat(&mut inv.nodes, name.to_string());
        }
        if brings(caps, nvidia::DRM_BROUGHT_BY) {
            for g in &inv.gpus {
                let drm = host.drm_nodes(&g.bus_id);
                for n in &drm {
                    let name = n.container_path.trim_start_matches("/dev/");
                    inv.nodes.insert(name.to_string(), n.clone());
                }
                inv.drm.insert(g.bus_id.clone(), drm);
            }
            inv.drm_by_path = host.drm_by_path_links();
        }
        if scope.mig {
            let found = match mig_devices {
                Some(named) => {
                    let mut named = named.to_vec();
                    named.sort_unstable();
                    named.dedup();
                    named
                }
                None => host.mig_instances(),
            };
            let mut names: Vec<String> = vec!["config".into(), "monitor".into()];
            let mut mig: Vec<MigInstance> = found
                .into_iter()
                .map(|(gpu_minor, gpu_instance, compute_instance)| MigInstance {
                    gpu_minor,
                    gpu_instance,
                    compute_instance,
                    minors: [None; 2],
                })
                .collect();
            for m in &mig {
                names.extend(m.capabilities());
            }
            // All the capabilities in one look-up: one read of the cache for them all.
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            let minors = host.capability_minors(&refs)?;
            for minor in minors.iter().flatten() {
                let mut buf = itoa::Buffer::new();
                stat(
                    &mut inv.nodes,
                    ["nvidia-caps/nvidia-cap", buf.format(*minor)].concat(),
                );
            }
            inv.mig_config_minor = minors[0];
            inv.mig_monitor_minor = minors[1];
            for (m, pair) in mig.iter_mut().zip(minors[2..].chunks(2)) {
                m.minors = [pair[0], pair[1]];
            }
            inv.mig = mig;
        }
        if scope.imex {
            for (channel, node) in host.imex_channel_nodes() {
                inv.imex_channels.push(channel);
                inv.nodes.insert(
                    [
                        "nvidia-caps-imex-channels/channel",
                        itoa::Buffer::new().format(channel),
                    ]
                    .concat(),
                    node,
                );
            }
        }
        if caps.compute && mps_pipe_directory.is_absolute() && mps_pipe_directory.is_dir() {
            inv.mps_pipe_directory = Some(mps_pipe_directory.to_path_buf());
        }
        Ok(inv)
    }

    /// The host node `<dev-root>/dev/<name>` as read; `None`: not there (or not read).
    pub fn node(&self, name: &str) -> Option<&HostDeviceNode> {
        self.nodes.get(name)
    }

    /// The DRM nodes of the GPU at `bus_id` (none without a graphics scope).
    pub fn drm_nodes(&self, bus_id: &str) -> &[HostDeviceNode] {
        self.drm.get(bus_id).map_or(&[], Vec::as_slice)
    }

    /// The `by-path` links that point at one of `nodes`: (`../card1`,
    /// `/dev/dri/by-path/pci-0000:1b:00.0-card`), as the `create-symlinks` hook takes them.
    pub fn drm_by_path_links(&self, nodes: &[HostDeviceNode]) -> Vec<(String, String)> {
        self.drm_by_path
            .iter()
            .filter(|(target, _)| {
                let name = target.rsplit('/').next().unwrap_or(target);
                nodes
                    .iter()
                    .any(|n| n.container_path.strip_prefix("/dev/dri/") == Some(name))
            })
            .cloned()
            .collect()
    }

    /// The MIG device `compute_instance` of GPU instance `gpu_instance` on the GPU with minor
    /// `gpu_minor`, when the driver lists it.
    pub fn mig_instance(
        &self,
        gpu_minor: u32,
        gpu_instance: u32,
        compute_instance: u32,
    ) -> Option<&MigInstance> {
        let key = (gpu_minor, gpu_instance, compute_instance);
        self.mig
            .binary_search_by_key(&key, |m| (m.gpu_minor, m.gpu_instance, m.compute_instance))
            .ok()
            .map(|i| &self.mig[i])
    }

    /// Minors of the GPUs with MIG devices.
    pub fn gpus_with_mig(&self) -> Vec<u32> {
        let mut out: Vec<u32> = self.mig.iter().map(|m| m.gpu_minor).collect();
        out.dedup();
        out
    }
}

impl MigInstance {
    /// The `mig-minors` names of its two capabilities (GPU instance, compute instance).
    pub fn capabilities(&self) -> [String; 2] {
        // Concatenated rather than `format!`ed: a MIG `all` create makes two for each of its
        // devices.
        let mut bufs = [
            itoa::Buffer::new(),
            itoa::Buffer::new(),
            itoa::Buffer::new(),
        ];
        let [a, b, c] = &mut bufs;
        let gpu = a.format(self.gpu_minor);
        let gi = b.format(self.gpu_instance);
        let ci = c.format(self.compute_instance);
        [
            ["gpu", gpu, "/gi", gi, "/access"].concat(),
            ["gpu", gpu, "/gi", gi, "/ci", ci, "/access"].concat(),
        ]
    }
}

fn split(path: &str) -> (&str, &str) {
    path.rsplit_once('/').unwrap_or(("", path))
}

/// The development link (`<dir>/<stem>.so`) a library named by the driver version may have
/// beside it, with its stem.
pub fn dev_link_of<'a>(l: &'a DriverLibrary, suffix: &str) -> Option<(&'a str, String)> {
    let (dir, file) = split(&l.file.container_path);
    let stem = file.strip_suffix(suffix)?;
    Some((stem, format!("{dir}/{stem}.so")))
}

/// Whether a library's development link is made whatever the host has (NVIDIA's rules).
pub fn dev_link_always(l: &DriverLibrary, stem: &str) -> bool {
    l.soname == "libcuda.so.1" || stem == "libnvidia-opticalflow"
}

/// The directories of `libs` not in a library's own subdirectory (`vdpau/`): where the
/// binaries' `bin/`, the X.Org modules and GBM's backend link are looked for.
pub fn library_dirs(libs: &[DriverLibrary]) -> Vec<String> {
    let mut lib_dirs: Vec<String> = Vec::new();
    for l in libs {
        let (dir, _) = split(&l.file.container_path);
        let in_subdir = nvidia::LIBRARIES.iter().any(
            |r| matches!(r.naming, nvidia::Naming::Subdir(d) if dir.ends_with(&format!("/{d}"))),
        );
        if !in_subdir && !lib_dirs.iter().any(|d| d == dir) {
            lib_dirs.push(dir.to_string());
        }
    }
    lib_dirs
}

/// The driver's files `caps` brings, looked up in the driver root.
pub fn read_driver_files(
    host: &Host,
    caps: &Capabilities,
    driver_version: &str,
) -> Result<DriverFileSet, HostError> {
    // Only the cache entries of the libraries `caps` brings are read out of the node's cache.
    let stems: Vec<&str> = nvidia::libraries_for(caps)
        .chain(nvidia::libraries_32bit_for(caps))
        .filter(|l| !matches!(l.naming, nvidia::Naming::Subdir(_)))
        .map(|l| l.stem)
        .collect();
    let mut out = DriverFileSet::default();
    let cache = host.ld_cache_of(&stems)?;
    out.libs64 = host.libraries(
        &cache,
        nvidia::libraries_for(caps),
        driver_version,
        WordSize::Bits64,
    );
    out.libs32 = host.libraries(
        &cache,
        nvidia::libraries_32bit_for(caps),
        driver_version,
        WordSize::Bits32,
    );
    let lib_dirs = library_dirs(&out.libs64);
    let suffix = format!(".so.{driver_version}");
    for l in out.libs64.iter().chain(&out.libs32) {
        if let Some((stem, dev_link)) = dev_link_of(l, &suffix) {
            if !dev_link_always(l, stem) && host.is_symlink(&dev_link) {
                out.dev_links.push(dev_link);
            }
        }
    }
    out.binaries = host.binaries(&nvidia::executables_for(caps), &lib_dirs);
    for (i, rule) in nvidia::DATA_FILES.iter().enumerate() {
        if brings(caps, rule.brought_by) {
            out.data_files.extend(
                host.data_files([rule], driver_version)
                    .into_iter()
                    .map(|f| (i, f)),
            );
        }
    }
    if brings(caps, nvidia::XORG_BROUGHT_BY) {
        out.xorg_modules = host.xorg_modules(&lib_dirs, driver_version);
    }
    if brings(caps, nvidia::FIRMWARE_BROUGHT_BY) {
        out.firmware = host.firmware_files(driver_version);
    }
    if brings(caps, nvidia::SOCKETS_BROUGHT_BY) {
        out.ipc = host.ipc_paths();
    }
    Ok(out)
}
