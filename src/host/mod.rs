//! A read-only view of the GPU host under the three roots (`driver-root`, `dev-root`,
//! `proc-root`): driver version, GPUs, device majors, device nodes, libraries and binaries,
//! read by [`Inventory::read`] into one value ([`inventory`]).
//!
//! Everything here reads files only. NVML is never loaded on this path: `/proc` already says
//! which GPUs exist (`driver/nvidia/gpus/<bus>/information`, written by the kernel module),
//! which is what keeps `create` fast on many-GPU nodes.
//!
//! [`Host`]'s methods each read one kind of fact under the same three roots and share its
//! per-command cache of resolved in-root directories; beside them, the parsers of the files
//! they read (`/proc/devices`, the driver banner, a GPU's `information`). NVML, the one part
//! that is not a file read, is in [`nvml`].

use std::fs;
use std::os::unix::fs::FileTypeExt;
use std::path::{Component, Path, PathBuf};

use nvshim_hook::elf::Arch;
use nvshim_hook::ldcache::{Entry as LdCacheEntry, LdCache};

use crate::nvidia::{self, DataFile, Library, Naming};
use thiserror::Error;

#[cfg(test)]
mod arch_tests;
pub mod csv;
pub mod gated;
mod gpu_cache;
pub mod inventory;
mod mig_table;
pub mod nvml;
pub mod platform;
pub mod wsl;

pub use inventory::{Inventory, MigInstance, MigKey, ReadSettings, Scope};

#[derive(Debug, Error)]
pub enum HostError {
    #[error("cannot read {path}: {source}; is the NVIDIA driver loaded (`nvshim doctor` checks), and do driver-root, dev-root and proc-root in the nvshim config point at the GPU host?")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}; nvshim cannot read what the driver wrote there: please report it with the file's content")]
    Parse { path: PathBuf, message: String },
    #[error("{path} does not exist: the NVIDIA driver is not loaded; load it with `modprobe nvidia` (`dmesg | grep -i nvrm` says why it failed), or set proc-root in the nvshim config if the host's /proc is elsewhere")]
    NotLoaded { path: PathBuf },
    #[error("no NVIDIA character device major in {path} (expected a line like \"195 nvidia\"): the NVIDIA driver is not loaded; load it with `modprobe nvidia` (`dmesg | grep -i nvrm` says why it failed)")]
    NoNvidiaMajor { path: PathBuf },
    #[error("host ld.so.cache {path}: {source}; rebuild it with `ldconfig` (`ldconfig -r <driver-root>` for a driver root other than /)")]
    LdCache {
        path: PathBuf,
        source: nvshim_hook::ldcache::LdCacheError,
    },
}

/// The three roots that locate the host. Tests point them at a simulated host directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRoots {
    pub driver_root: PathBuf,
    pub dev_root: PathBuf,
    pub proc_root: PathBuf,
}

/// One GPU as the kernel module reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// Position in PCI bus order, as nvidia-smi and CUDA (with `CUDA_DEVICE_ORDER=PCI_BUS_ID`)
    /// number GPUs.
    pub index: usize,
    /// `/dev/nvidia<minor>`.
    pub minor: u32,
    pub uuid: String,
    /// Normalised `dddd:bb:dd.f`, lower case.
    pub bus_id: String,
    pub model: String,
}

/// Character device majors from `/proc/devices`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceMajors {
    /// `nvidia` (`nvidia-frontend` before driver 550): GPUs, nvidiactl (255), modeset (254).
    pub nvidia: u32,
    pub nvidia_uvm: Option<u32>,
    pub nvidia_caps: Option<u32>,
    pub nvidia_caps_imex_channels: Option<u32>,
}

/// A device node found on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostDeviceNode {
    /// Path in the container, e.g. `/dev/nvidia0`.
    pub container_path: String,
    /// Path on the host (under dev-root).
    pub host_path: PathBuf,
    pub kind: char,
    pub major: u32,
    pub minor: u32,
    pub file_mode: u32,
    pub uid: u32,
    pub gid: u32,
}

/// A file under the driver root and where it goes in the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFile {
    pub host_path: PathBuf,
    pub container_path: String,
}

/// Which libraries of the host's ld.so.cache: the 64-bit ones, or the 32-bit x86 ones
/// (`compat32`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WordSize {
    Bits64,
    Bits32,
}

impl WordSize {
    /// Whether `e` is a library of this word size for `arch` (none for a machine without
    /// ldconfig rules here; no 32-bit ones on aarch64).
    fn matches(self, e: &LdCacheEntry, arch: Option<Arch>) -> bool {
        arch.is_some_and(|arch| match self {
            WordSize::Bits64 => e.is_lib64_of(arch),
            WordSize::Bits32 => e.is_lib32_of(arch),
        })
    }
}

/// The `<stem>.so.<n>` symlink beside `file` that points at it (a SONAME link ldconfig made).
fn soname_link_beside(file: &Path, stem: &str, name: &str) -> Option<String> {
    let dir = file.parent()?;
    fs::read_dir(dir).ok()?.flatten().find_map(|e| {
        let link = e.file_name().to_string_lossy().into_owned();
        let n = link.strip_prefix(stem)?.strip_prefix(".so.")?;
        let digits = !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit());
        (digits && fs::read_link(e.path()).ok()? == Path::new(name)).then_some(link)
    })
}

/// A driver library: the versioned file to mount, and the SONAME link the dynamic linker uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverLibrary {
    pub file: HostFile,
    /// E.g. `libcuda.so.1`, from the host's ld.so.cache.
    pub soname: String,
}

#[derive(Debug, Clone)]
pub struct Host {
    roots: HostRoots,
    /// In-root directories already resolved by [`Host::resolve_in_driver_root`] (the driver's
    /// libraries share a handful of directories: resolving each directory once instead of per
    /// library halves a create's `statx` calls). A `Host` lives for one command, so the host
    /// cannot change under it in a way that matters.
    resolved_dirs: std::cell::RefCell<std::collections::HashMap<String, Option<String>>>,
    /// Where [`Host::gpus`] keeps what it read (`gpu_cache.rs`); `None`: nowhere.
    cache_dir: Option<PathBuf>,
    /// `<dev-root>/dev`, opened by the first [`Host::device_node`] (`None` inside: it would
    /// not open), so that each node is `stat`ed by its name in it rather than by its whole
    /// path: a MIG `all` create on 8 GPUs × 7 MIG devices `stat`s 124.
    dev_dir: std::cell::OnceCell<Option<std::sync::Arc<std::os::fd::OwnedFd>>>,
    /// The driver's MIG minors as kept in `cache_dir` (`mig_table.rs`), looked up by the first
    /// [`Host::capability_minors`] (`None` inside: not there or not kept): a create asking for
    /// MIG devices and the `config` or `monitor` capability asks twice.
    mig_table: std::cell::OnceCell<Option<mig_table::MigTable>>,
    /// The node's machine, whose libraries are taken from its ld.so.cache: this binary's own
    /// ([`Arch::host`]), as nvshim runs on the node it serves. Not the cache's: a node's cache
    /// holds several machines' libraries (x86-64 and i386). Tests set the other one.
    arch: Option<Arch>,
}

/// Joins an absolute in-host path below a root (`/usr/lib/x` under `/run/nvidia/driver`).
/// The paths come from the host's own files (ld.so.cache, the driver's /proc), never from a
/// container.
pub fn under_root(root: &Path, abs: &str) -> PathBuf {
    root.join(abs.trim_start_matches('/'))
}

fn read(path: &Path) -> Result<String, HostError> {
    read_kernel_file(path).map_err(|source| HostError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// A file of the driver's `/proc` (or another kernel file) under the host's roots, read as
/// [`crate::hostfile`] reads (the roots are settings: a FIFO there must not block).
pub fn read_kernel_file(path: &Path) -> std::io::Result<String> {
    crate::hostfile::read_to_string(path, crate::hostfile::KERNEL_FILE_LIMIT)
}

/// The most of ld.so.cache read: the parser's own limit.
pub const LD_CACHE_LIMIT: u64 = nvshim_hook::ldcache::MAX_CACHE_LEN as u64;

/// Normalises a PCI bus id: `1B:00.0`, `0000:1b:00.0`, `00000000:1b:00.0` → `0000:1b:00.0`.
pub fn normalize_bus_id(id: &str) -> Option<String> {
    let id = id.trim().to_ascii_lowercase();
    let (domain, rest) = match id.matches(':').count() {
        1 => ("0", id.as_str()),
        2 => id.split_once(':')?,
        _ => return None,
    };
    let (bus, devfn) = rest.split_once(':')?;
    let (dev, func) = devfn.split_once('.')?;
    let hex = |s: &str, max: u32| u32::from_str_radix(s, 16).ok().filter(|v| *v <= max);
    let domain = hex(domain, 0xffff_ffff)?;
    let bus = hex(bus, 0xff)?;
    let dev = hex(dev, 0x1f)?;
    let func = hex(func, 0x7)?;
    Some(format!(
        "{:04x}:{bus:02x}:{dev:02x}.{func:x}",
        domain & 0xffff
    ))
}

impl Host {
    pub fn new(roots: HostRoots) -> Host {
        Host {
            roots,
            resolved_dirs: Default::default(),
            cache_dir: None,
            dev_dir: Default::default(),
            mig_table: Default::default(),
            arch: Arch::host(),
        }
    }

    /// This host, taking the libraries of `arch` (tests: aarch64 rules on an x86-64 machine).
    pub fn with_arch(mut self, arch: Option<Arch>) -> Host {
        self.arch = arch;
        self
    }

    /// Where this host keeps what it read between commands; `None`: nowhere.
    pub fn cache_dir(&self) -> Option<&Path> {
        self.cache_dir.as_deref()
    }

    /// This host, keeping what [`Host::gpus`] reads in `cache_dir` (`src/host/gpu_cache.rs`);
    /// an empty path keeps nothing (`cache-dir = ""`).
    pub fn with_cache_dir(mut self, cache_dir: &Path) -> Host {
        self.cache_dir = (!cache_dir.as_os_str().is_empty()).then(|| cache_dir.to_path_buf());
        self
    }

    pub fn roots(&self) -> &HostRoots {
        &self.roots
    }

    /// The driver version from `proc/driver/nvidia/version` (see [`parse_driver_banner`]).
    pub fn driver_version(&self) -> Result<String, HostError> {
        let path = self.roots.proc_root.join("driver/nvidia/version");
        let text = match read_kernel_file(&path) {
            Ok(t) => t,
            // The kernel module writes the file when it loads.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(HostError::NotLoaded { path })
            }
            Err(source) => return Err(HostError::Read { path, source }),
        };
        parse_driver_banner(&text).map_err(|message| HostError::Parse { path, message })
    }

    /// The GPUs under `proc/driver/nvidia/gpus/*/information`, in PCI bus order.
    pub fn gpus(&self) -> Result<Vec<Gpu>, HostError> {
        gpu_cache::gpus(
            &self.roots.proc_root.join("driver/nvidia/gpus"),
            self.cache_dir.as_deref(),
            crate::cache::now_ns(),
        )
    }

    /// Majors from `proc/devices` (character section).
    pub fn device_majors(&self) -> Result<DeviceMajors, HostError> {
        let path = self.roots.proc_root.join("devices");
        parse_devices(&read(&path)?).ok_or(HostError::NoNvidiaMajor { path })
    }

    /// Stats `<dev-root>/dev/<name>` (no symlink following). `None` when it does not exist or
    /// is not a device node.
    pub fn device_node(&self, name: &str) -> Option<HostDeviceNode> {
        // One allocation for the path (two `join`s made three): a MIG `all` create stats 124.
        let root = &self.roots.dev_root;
        let mut host_path = PathBuf::with_capacity(root.as_os_str().len() + 5 + name.len());
        host_path.push(root);
        host_path.push("dev");
        host_path.push(name);
        let dev = self.dev_dir.get_or_init(|| {
            Some(std::sync::Arc::new(
                crate::hostfile::open_dir(&root.join("dev")).ok()?.into(),
            ))
        });
        let dev = std::os::fd::AsFd::as_fd(dev.as_deref()?);
        let st = nvshim_hook::root::lstatat(dev, name.as_bytes()).ok()?;
        let kind = match st.st_mode & libc::S_IFMT {
            libc::S_IFCHR => 'c',
            libc::S_IFBLK => 'b',
            _ => return None,
        };
        Some(HostDeviceNode {
            container_path: ["/dev/", name].concat(),
            host_path,
            kind,
            major: nix::sys::stat::major(st.st_rdev) as u32,
            minor: nix::sys::stat::minor(st.st_rdev) as u32,
            file_mode: st.st_mode & 0o7777,
            uid: st.st_uid,
            gid: st.st_gid,
        })
    }

    /// The MIG devices the driver has created, as (GPU minor, GPU instance, compute
    /// instance), from `proc/driver/nvidia/capabilities/gpu<N>/mig/gi<G>/ci<C>/access`: the
    /// driver lists every created instance there (NVIDIA's MIG user guide, "Device Nodes and
    /// Capabilities"). Read without NVML, so `all` never loads it. Sorted.
    pub fn mig_instances(&self) -> Vec<(u32, u32, u32)> {
        use nvshim_hook::root;
        use std::os::fd::{AsFd, BorrowedFd};
        // Each directory opened relative to its parent's fd and listed with one buffer on the
        // stack: std's `read_dir` (musl's `opendir`) mapped, touched and unmapped a buffer for
        // each of the 66 directories of an 8-GPU host with 7 MIG devices a GPU, 7 system calls
        // and a page fault a directory where this makes 4 (strace).
        fn numbered(dir: BorrowedFd, prefix: &[u8]) -> Vec<(u32, Vec<u8>)> {
            root::read_dir_fresh(dir)
                .unwrap_or_default()
                .into_iter()
                .filter_map(|e| {
                    let n = std::str::from_utf8(e.name.strip_prefix(prefix)?)
                        .ok()?
                        .parse()
                        .ok()?;
                    Some((n, e.name))
                })
                .collect()
        }
        let open = |dir: BorrowedFd, name: &[u8]| {
            root::openat(dir, name, libc::O_RDONLY | libc::O_DIRECTORY, 0).ok()
        };
        let dir = self.roots.proc_root.join("driver/nvidia/capabilities");
        let Ok(caps) = crate::hostfile::open_dir(&dir) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut mig_name = Vec::new();
        for (minor, gpu) in numbered(caps.as_fd(), b"gpu") {
            mig_name.clear();
            mig_name.extend_from_slice(&gpu);
            mig_name.extend_from_slice(b"/mig");
            let Some(mig) = open(caps.as_fd(), &mig_name) else {
                continue;
            };
            for (gi, gi_name) in numbered(mig.as_fd(), b"gi") {
                let Some(gi_dir) = open(mig.as_fd(), &gi_name) else {
                    continue;
                };
                for (ci, _) in numbered(gi_dir.as_fd(), b"ci") {
                    out.push((minor, gi, ci));
                }
            }
        }
        out.sort_unstable();
        out
    }

    /// Minors of the GPUs with MIG instances ([`Host::mig_instances`]).
    pub fn gpus_with_mig_instances(&self) -> Vec<u32> {
        let mut out: Vec<u32> = self.mig_instances().iter().map(|(m, _, _)| *m).collect();
        out.dedup();
        out
    }

    /// The host's ld.so.cache under the driver root. A driver root that has none (a driver
    /// directory rather than a whole system: GKE's `/home/kubernetes/bin/nvidia`, the
    /// `/usr/local/nvidia` of CUDA images, with `lib64/`, `lib/` and `bin/`) gets the cache
    /// `ldconfig -r <driver-root>` would write for
    /// [`DRIVER_LIBRARY_DIRS`](nvshim_hook::ldconfig::DRIVER_LIBRARY_DIRS), built read-only
    /// (no SONAME links made) by the hook crate's port of ldconfig's directory scan. Only a
    /// root where that finds no library at all is an error.
    pub fn ld_cache(&self) -> Result<LdCache, HostError> {
        self.ld_cache_only(|_| true)
    }

    /// [`Host::ld_cache`] with only the entries named `<stem>.so.<anything>` for one of
    /// `stems` (none of which holds `.so.`): what [`Host::libraries`] looks up for them
    /// ([`LdCache::parse_only`] says why).
    pub fn ld_cache_of(&self, stems: &[&str]) -> Result<LdCache, HostError> {
        // Looked up by the stem's first 8 bytes and length, as one integer: a binary search
        // of the names themselves cost 490 instructions an entry, most of it `memcmp` calls.
        let key = |stem: &[u8]| {
            let mut word = [0u8; 8];
            let n = stem.len().min(8);
            word[..n].copy_from_slice(&stem[..n]);
            (u64::from_le_bytes(word), stem.len())
        };
        let mut keys: Vec<((u64, usize), &str)> =
            stems.iter().map(|s| (key(s.as_bytes()), *s)).collect();
        keys.sort_unstable();
        let keep = |name: &[u8]| {
            let Some(at) = name.windows(4).position(|w| w == b".so.") else {
                return false;
            };
            let stem = &name[..at];
            let k = key(stem);
            let first = keys.partition_point(|(other, _)| *other < k);
            keys[first..]
                .iter()
                .take_while(|(other, _)| *other == k)
                .any(|(_, s)| s.as_bytes() == stem)
        };
        self.ld_cache_only(keep)
    }

    fn ld_cache_only(&self, keep: impl FnMut(&[u8]) -> bool) -> Result<LdCache, HostError> {
        let path = under_root(&self.roots.driver_root, "/etc/ld.so.cache");
        let bytes = match crate::hostfile::read(&path, LD_CACHE_LIMIT) {
            Ok(bytes) => bytes,
            Err(source) if source.kind() == std::io::ErrorKind::NotFound => {
                return match self.scanned_ld_cache(keep) {
                    Some(cache) if !cache.entries.is_empty() => Ok(cache),
                    _ => Err(HostError::Read { path, source }),
                };
            }
            Err(source) => return Err(HostError::Read { path, source }),
        };
        LdCache::parse_only(&bytes, keep).map_err(|source| HostError::LdCache { path, source })
    }

    /// The libraries of the driver library directories under the driver root, as cache entries in
    /// ldconfig's order. `None` where the root cannot be opened or the architecture has no
    /// ldconfig rules here.
    fn scanned_ld_cache(&self, mut keep: impl FnMut(&[u8]) -> bool) -> Option<LdCache> {
        use nvshim_hook::ldconfig::{Scanner, DRIVER_LIBRARY_DIRS};
        let root = nvshim_hook::root::Root::open(&self.roots.driver_root).ok()?;
        let scanner = Scanner {
            root: &root,
            arch: self.arch?,
            make_links: false,
        };
        let (_, scan) = scanner.scan_dirs(DRIVER_LIBRARY_DIRS.iter().copied());
        let mut entries: Vec<_> = scan
            .entries
            .into_iter()
            .map(|(e, _, _)| e)
            .filter(|e| keep(&e.name))
            .collect();
        entries.sort_by(nvshim_hook::ldcache::compare);
        Some(LdCache {
            // A driver library whose name is not UTF-8 is not one nvshim mounts.
            entries: entries
                .into_iter()
                .filter_map(|e| {
                    Some(LdCacheEntry {
                        flags: e.flags,
                        name: String::from_utf8(e.name).ok()?,
                        path: String::from_utf8(e.path).ok()?,
                        os_version: e.os_version,
                        hwcap: e.hwcap,
                    })
                })
                .collect(),
            generator: None,
            hwcaps: Vec::new(),
        })
    }

    /// The canonical in-root path of a regular file: every symlink on the way, the directories'
    /// too, followed inside the driver root (an absolute target, or `..` at the top, stays in
    /// it), as `realpath` would inside a chroot. On a merged-/usr host the ld.so.cache says
    /// `/lib/x86_64-linux-gnu/libcuda.so.1` (ldconfig lists `/lib/x86_64-linux-gnu` first), and
    /// the file is mounted where it really is, `/usr/lib/x86_64-linux-gnu/libcuda.so.<v>`, as
    /// NVIDIA's tools do. At most 40 links, as the kernel allows.
    pub(crate) fn resolve_in_driver_root(&self, abs: &str) -> Option<String> {
        let Some((dir, name)) = abs.rsplit_once('/') else {
            return self.walk_in_driver_root(abs, true);
        };
        if matches!(name, "" | "." | "..") {
            return self.walk_in_driver_root(abs, true);
        }
        let dir = if dir.is_empty() { "/" } else { dir };
        let cached = self.resolved_dirs.borrow().get(dir).cloned();
        let resolved_dir = match cached {
            Some(r) => r,
            None => {
                let r = self.walk_in_driver_root(dir, false);
                self.resolved_dirs
                    .borrow_mut()
                    .insert(dir.to_string(), r.clone());
                r
            }
        }?;
        // The last component: links within the directory (the SONAME links) followed here;
        // a link anywhere else takes the whole walk.
        let mut name = name.to_string();
        for _ in 0..40 {
            let candidate = if resolved_dir == "/" {
                format!("/{name}")
            } else {
                format!("{resolved_dir}/{name}")
            };
            let host = under_root(&self.roots.driver_root, &candidate);
            let meta = fs::symlink_metadata(&host).ok()?;
            if !meta.file_type().is_symlink() {
                return meta.is_file().then_some(candidate);
            }
            let target = fs::read_link(&host).ok()?;
            match target.to_str() {
                Some(t) if !t.is_empty() && !t.contains('/') && t != "." && t != ".." => {
                    name = t.to_string();
                }
                _ => return self.walk_in_driver_root(&candidate, true),
            }
        }
        None
    }

    /// [`Host::resolve_in_driver_root`] the long way: every component of `abs` from the top;
    /// the result must be a regular file (`file`) or a directory.
    fn walk_in_driver_root(&self, abs: &str, file: bool) -> Option<String> {
        fn names(p: &Path) -> Vec<std::ffi::OsString> {
            clean(p)
                .components()
                .filter_map(|c| match c {
                    Component::Normal(n) => Some(n.to_os_string()),
                    _ => None,
                })
                .collect()
        }
        let root = &self.roots.driver_root;
        let mut done = PathBuf::from("/");
        let mut todo: std::collections::VecDeque<std::ffi::OsString> = names(Path::new(abs)).into();
        let mut links = 0;
        while let Some(name) = todo.pop_front() {
            let candidate = done.join(&name);
            let host = under_root(root, candidate.to_str()?);
            if !fs::symlink_metadata(&host).ok()?.file_type().is_symlink() {
                done = candidate;
                continue;
            }
            links += 1;
            if links > 40 {
                return None;
            }
            let target = fs::read_link(&host).ok()?;
            // The target, then what was left, resolved from the top again.
            let next = if target.is_absolute() {
                target
            } else {
                done.join(target)
            };
            let mut again: std::collections::VecDeque<_> = names(&next).into();
            again.extend(todo.drain(..));
            todo = again;
            done = PathBuf::from("/");
        }
        let host = under_root(root, done.to_str()?);
        let meta = fs::metadata(host).ok()?;
        (if file { meta.is_file() } else { meta.is_dir() })
            .then(|| done.to_string_lossy().into_owned())
    }

    /// Whether the in-root path `abs` is a symlink under the driver root (not followed).
    pub fn is_symlink(&self, abs: &str) -> bool {
        let host = under_root(&self.roots.driver_root, abs);
        fs::symlink_metadata(host).is_ok_and(|m| m.file_type().is_symlink())
    }

    /// The library whose in-root path is `file`, known to the dynamic linker as `soname`.
    fn library_at(&self, file: String, soname: &str) -> DriverLibrary {
        DriverLibrary {
            file: HostFile {
                host_path: under_root(&self.roots.driver_root, &file),
                container_path: file,
            },
            soname: soname.to_string(),
        }
    }

    /// The libraries of `rules` of one word size, through the host's ld.so.cache as
    /// libnvidia-container finds them (src/nvc_info.c `find_library_paths`): each cache entry
    /// named `<stem>.so.<n>` is followed (inside the driver root) to its file, which must be
    /// `<stem>.so.<driver version>` ([`Naming::DriverVersion`]) or any `<stem>.so.*`
    /// ([`Naming::OwnVersion`]). [`Naming::Subdir`] libraries, which the cache does not index,
    /// are looked for in that subdirectory of the directories the others were found in (or of
    /// `fallback_dirs`), with the `<stem>.so.<n>` link beside them as their SONAME. Missing
    /// libraries are skipped: not every driver ships every one.
    pub fn libraries<'a>(
        &self,
        cache: &LdCache,
        rules: impl IntoIterator<Item = &'a Library>,
        driver_version: &str,
        word: WordSize,
    ) -> Vec<DriverLibrary> {
        let versioned = format!(".so.{driver_version}");
        let mut found: Vec<DriverLibrary> = Vec::new();
        let mut subdir_rules = Vec::new();
        let entries: Vec<_> = cache
            .entries
            .iter()
            .filter(|e| word.matches(e, self.arch))
            .collect();
        for rule in rules {
            if let Naming::Subdir(d) = rule.naming {
                subdir_rules.push((d, rule.stem));
                continue;
            }
            let prefix = format!("{}.so.", rule.stem);
            for e in entries.iter().filter(|e| e.name.starts_with(&prefix)) {
                let Some(file) = self.resolve_in_driver_root(&e.path) else {
                    continue;
                };
                let (_, name) = file.rsplit_once('/').unwrap_or(("", &file));
                let ok = match rule.naming {
                    Naming::DriverVersion => name == format!("{}{versioned}", rule.stem),
                    _ => name.starts_with(&prefix),
                };
                if ok && !found.iter().any(|l| l.file.container_path == file) {
                    found.push(self.library_at(file, &e.name));
                }
            }
        }
        let mut dirs: Vec<String> = Vec::new();
        for l in &found {
            if let Some((dir, _)) = l.file.container_path.rsplit_once('/') {
                if !dirs.iter().any(|d| d == dir) {
                    dirs.push(dir.to_string());
                }
            }
        }
        for (subdir, stem) in subdir_rules {
            for dir in &dirs {
                let name = format!("{stem}{versioned}");
                let container_path = format!("{dir}/{subdir}/{name}");
                let host_path = under_root(&self.roots.driver_root, &container_path);
                // Its SONAME link, if any, is beside it: the same directory.
                if !fs::metadata(&host_path).is_ok_and(|m| m.is_file()) {
                    continue;
                }
                let soname = soname_link_beside(&host_path, stem, &name).unwrap_or(name);
                found.push(DriverLibrary {
                    file: HostFile {
                        host_path,
                        container_path,
                    },
                    soname,
                });
            }
        }
        found
    }

    /// The first existing host path of each data file (`{v}` replaced by the driver version),
    /// with its container path.
    pub fn data_files<'a>(
        &self,
        rules: impl IntoIterator<Item = &'a DataFile>,
        driver_version: &str,
    ) -> Vec<HostFile> {
        let mut out = Vec::new();
        for rule in rules {
            let found = rule.host_paths.iter().find_map(|p| {
                let p = p.replace("{v}", driver_version);
                let host_path = under_root(&self.roots.driver_root, &p);
                fs::metadata(&host_path)
                    .is_ok_and(|m| m.is_file())
                    .then_some((p, host_path))
            });
            if let Some((p, host_path)) = found {
                let container_path = rule.container_path.map_or(p, str::to_string);
                out.push(HostFile {
                    host_path,
                    container_path,
                });
            }
        }
        out
    }

    /// The X.Org modules ([`nvidia::XORG_MODULES`]), each from the first of
    /// [`nvidia::XORG_MODULE_DIRS`] that holds it (`{lib}`: each of `lib_dirs`).
    pub fn xorg_modules(&self, lib_dirs: &[String], driver_version: &str) -> Vec<HostFile> {
        let mut dirs: Vec<String> = Vec::new();
        for pattern in nvidia::XORG_MODULE_DIRS {
            if pattern.contains("{lib}") {
                for lib in lib_dirs {
                    dirs.push(pattern.replace("{lib}", lib));
                }
            } else {
                dirs.push(pattern.to_string());
            }
        }
        let mut out = Vec::new();
        for module in nvidia::XORG_MODULES {
            let module = module.replace("{v}", driver_version);
            let found = dirs.iter().find_map(|dir| {
                let container_path = format!("{dir}/{module}");
                let host_path = under_root(&self.roots.driver_root, &container_path);
                fs::metadata(&host_path)
                    .is_ok_and(|m| m.is_file())
                    .then_some(HostFile {
                        host_path,
                        container_path,
                    })
            });
            out.extend(found);
        }
        out
    }

    /// The host's sysfs: beside its procfs (`/sys` for `/proc`, `/host/sys` for `/host/proc`).
    pub fn sys_root(&self) -> PathBuf {
        self.roots
            .proc_root
            .parent()
            .map_or_else(|| PathBuf::from("/sys"), |p| p.join("sys"))
    }

    /// The DRM nodes of the GPU at `bus_id` (`/dev/dri/card1`, `/dev/dri/renderD128`), from
    /// `<sys-root>/bus/pci/devices/<bus>/drm/`, as the kernel ties them to the PCI device; only
    /// those that exist under dev-root as character devices. Sorted by name.
    pub fn drm_nodes(&self, bus_id: &str) -> Vec<HostDeviceNode> {
        let dir = self
            .sys_root()
            .join("bus/pci/devices")
            .join(bus_id)
            .join("drm");
        let Ok(entries) = fs::read_dir(&dir) else {
            return Vec::new();
        };
        let mut names: Vec<String> = entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| {
                let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
                n.strip_prefix("card").is_some_and(digits)
                    || n.strip_prefix("renderD").is_some_and(digits)
            })
            .collect();
        names.sort();
        names
            .iter()
            .filter_map(|n| self.device_node(&format!("dri/{n}")))
            .filter(|n| n.kind == 'c')
            .collect()
    }

    /// The links of `<dev-root>/dev/dri/by-path`: (`../card1`,
    /// `/dev/dri/by-path/pci-0000:1b:00.0-card`), sorted ([`Inventory::drm_by_path_links`]
    /// picks those of a GPU's nodes).
    pub fn drm_by_path_links(&self) -> Vec<(String, String)> {
        let dir = self.roots.dev_root.join("dev/dri/by-path");
        let Ok(entries) = fs::read_dir(&dir) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for e in entries.flatten() {
            let Ok(target) = fs::read_link(e.path()) else {
                continue;
            };
            let link = format!("/dev/dri/by-path/{}", e.file_name().to_string_lossy());
            out.push((target.to_string_lossy().into_owned(), link));
        }
        out.sort();
        out
    }

    /// The device nodes in `<dev-root>/dev/<dir>`, by their name under `dev` (`<dir>/<name>`).
    pub fn device_nodes_in(&self, dir: &str) -> Vec<(String, HostDeviceNode)> {
        let Ok(entries) = fs::read_dir(self.roots.dev_root.join("dev").join(dir)) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| {
                let name = [dir, "/", e.file_name().to_str()?].concat();
                let node = self.device_node(&name)?;
                Some((name, node))
            })
            .collect()
    }

    /// The IMEX channels that exist: `<dev-root>/dev/nvidia-caps-imex-channels/channel<N>`
    /// device nodes, by number.
    pub fn imex_channel_nodes(&self) -> Vec<(u32, HostDeviceNode)> {
        let dir = self.roots.dev_root.join("dev/nvidia-caps-imex-channels");
        let mut out: Vec<(u32, HostDeviceNode)> = fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let n = name.strip_prefix("channel")?;
                if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                let n: u32 = n.parse().ok()?;
                let node = self.device_node(&format!("nvidia-caps-imex-channels/{name}"))?;
                Some((n, node))
            })
            .collect();
        out.sort_unstable_by_key(|(n, _)| *n);
        out
    }

    /// Finds driver binaries under the driver root: first in the `bin/` beside each
    /// `lib`/`lib64` directory the driver's libraries were found in (`lib_dirs`, in-root),
    /// where a driver directory keeps them (`/usr/local/nvidia/bin` of CUDA images and GKE
    /// nodes, whose ld.so.cache names `/usr/local/nvidia/lib64`), then in the standard bin
    /// directories. The driver's own directory comes first because the lent GPU machine also
    /// has a `/usr/bin/nvidia-smi` of its own, not the driver's: a shell script pointing at
    /// `/usr/local/nvidia/bin`, which fails in an image without `/bin/sh`. Each is mounted at
    /// `/usr/bin/<name>`, where libnvidia-container puts every driver binary, so it is on every
    /// image's `PATH` wherever the host keeps it.
    pub fn binaries(&self, names: &[&str], lib_dirs: &[String]) -> Vec<HostFile> {
        const DIRS: &[&str] = &["/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/bin"];
        let mut dirs: Vec<String> = Vec::new();
        for lib in lib_dirs {
            let Some((prefix, last)) = lib.rsplit_once('/') else {
                continue;
            };
            let bin = format!("{prefix}/bin");
            if matches!(last, "lib" | "lib64") && !dirs.contains(&bin) {
                dirs.push(bin);
            }
        }
        for dir in DIRS {
            if !dirs.iter().any(|d| d == dir) {
                dirs.push(dir.to_string());
            }
        }
        let mut out = Vec::new();
        for name in names {
            for dir in &dirs {
                let host_path = under_root(&self.roots.driver_root, &format!("{dir}/{name}"));
                if fs::metadata(&host_path).is_ok_and(|m| m.is_file()) {
                    out.push(HostFile {
                        host_path,
                        container_path: format!("/usr/bin/{name}"),
                    });
                    break;
                }
            }
        }
        out
    }

    /// `<proc-root>/sys/kernel/osrelease`, trimmed; empty when it cannot be read.
    pub fn kernel_release(&self) -> String {
        read_kernel_file(&self.roots.proc_root.join("sys/kernel/osrelease"))
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    }

    /// GSP firmware of this driver version: `nvidia/<version>/gsp*.bin` under the kernel's
    /// firmware search path inside the driver root (`/lib/firmware/updates/<release>`,
    /// `/lib/firmware/updates`, `/lib/firmware/<release>`, `/lib/firmware`; the release from
    /// `<proc-root>/sys/kernel/osrelease`), as NVIDIA's generator looks for it.
    pub fn firmware_files(&self, driver_version: &str) -> Vec<HostFile> {
        let release = self.kernel_release();
        let mut dirs = Vec::new();
        if !release.is_empty() {
            dirs.push(format!("/lib/firmware/updates/{release}"));
        }
        dirs.push("/lib/firmware/updates".to_string());
        if !release.is_empty() {
            dirs.push(format!("/lib/firmware/{release}"));
        }
        dirs.push("/lib/firmware".to_string());
        let mut out: Vec<HostFile> = Vec::new();
        for dir in dirs {
            let dir = format!("{dir}/nvidia/{driver_version}");
            let host_dir = under_root(&self.roots.driver_root, &dir);
            let Ok(entries) = fs::read_dir(host_dir) else {
                continue;
            };
            let mut names: Vec<String> = entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("gsp") && n.ends_with(".bin"))
                .collect();
            names.sort();
            for n in names {
                let container_path = format!("{dir}/{n}");
                if !out.iter().any(|f| f.container_path == container_path) {
                    out.push(HostFile {
                        host_path: under_root(&self.roots.driver_root, &container_path),
                        container_path,
                    });
                }
            }
        }
        out
    }

    /// The driver's IPC endpoints that exist under the driver root: the persistenced and
    /// fabricmanager sockets (under `/run`, else `/var/run`) and the MPS pipe directory
    /// (NVIDIA `internal/discover/ipc.go`).
    pub fn ipc_paths(&self) -> Vec<HostFile> {
        let mut out = Vec::new();
        for socket in ["nvidia-persistenced/socket", "nvidia-fabricmanager/socket"] {
            for run in ["/run", "/var/run"] {
                let container_path = format!("{run}/{socket}");
                let host_path = under_root(&self.roots.driver_root, &container_path);
                if fs::symlink_metadata(&host_path).is_ok_and(|m| m.file_type().is_socket()) {
                    out.push(HostFile {
                        host_path,
                        container_path,
                    });
                    break;
                }
            }
        }
        let mps = "/tmp/nvidia-mps";
        let host_path = under_root(&self.roots.driver_root, mps);
        if fs::symlink_metadata(&host_path).is_ok_and(|m| m.is_dir()) {
            out.push(HostFile {
                host_path,
                container_path: mps.to_string(),
            });
        }
        out
    }

    /// `<proc-root>/driver/nvidia-caps/mig-minors`: `gpu<minor>/gi<g>/access <cap minor>`,
    /// `gpu<minor>/gi<g>/ci<c>/access <cap minor>`, `config`, `monitor`. Empty when the file
    /// does not exist (no MIG-capable driver).
    pub fn mig_minors(&self) -> Result<Vec<(String, u32)>, HostError> {
        let mut out = Vec::new();
        self.each_mig_minor(|cap, minor| out.push((cap.to_string(), minor)))?;
        Ok(out)
    }

    /// The minors of MIG capabilities `caps` (named as `mig-minors` names them: `config`,
    /// `monitor`, `gpu<N>/gi<G>/access`, `gpu<N>/gi<G>/ci<C>/access`); `None`: no such
    /// capability. With a `cache-dir`, from the grid of `driver/nvidia-caps/mig-minors` kept
    /// there (`mig_table.rs`: the table is read once, it cost the lent H200's driver 2.9 ms to
    /// open); else from each capability's own file, `driver/nvidia/capabilities/{mig/config,
    /// gpu<N>/mig/gi<G>/ci<C>/access, ...}`, whose `DeviceFileMinor: <n>` line NVIDIA's device
    /// plugin reads too (11 µs each there; `None`: no such file, no such instance). Which
    /// instances exist is the caller's to know: the capabilities directory lists them.
    pub fn capability_minors(&self, caps: &[&str]) -> Result<Vec<Option<u32>>, HostError> {
        if let Some(cache_dir) = &self.cache_dir {
            let table = self.mig_table.get_or_init(|| {
                let path = self.roots.proc_root.join("driver/nvidia-caps/mig-minors");
                mig_table::table(&path, cache_dir, crate::cache::now_ns()).flatten()
            });
            if let Some(table) = table {
                return Ok(caps.iter().map(|cap| table.minor(cap)).collect());
            }
        }
        let caps_dir = self.roots.proc_root.join("driver/nvidia/capabilities");
        // Every file looked up relative to the directory, opened once.
        let dir = match crate::hostfile::open_dir(&caps_dir) {
            Ok(dir) => dir,
            // No capabilities at all: no such file.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(vec![None; caps.len()])
            }
            Err(source) => {
                return Err(HostError::Read {
                    path: caps_dir,
                    source,
                })
            }
        };
        caps.iter()
            .map(|&cap| {
                let rel = match cap {
                    "config" | "monitor" => ["mig/", cap].concat(),
                    _ => match cap.split_once('/') {
                        Some((gpu, rest)) => [gpu, "/mig/", rest].concat(),
                        None => cap.to_string(),
                    },
                };
                read_capability_minor(std::os::fd::AsFd::as_fd(&dir), &caps_dir, &rel)
            })
            .collect()
    }

    /// Calls `f` with each `<capability> <minor>` line of `driver/nvidia-caps/mig-minors`; no
    /// file is no MIG support (nothing called).
    fn each_mig_minor(&self, mut f: impl FnMut(&str, u32)) -> Result<(), HostError> {
        let path = self.roots.proc_root.join("driver/nvidia-caps/mig-minors");
        let text = match read_kernel_file(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(source) => return Err(HostError::Read { path, source }),
        };
        // ASCII splitting by hand, by byte: the table is the kernel module's, ASCII, and a
        // MIG host's has a thousand lines (the `split_whitespace` iterators were half of this
        // function, the `char` searches half of what was left).
        for line in crate::cache::split(&text, b'\n') {
            let line = line.trim_ascii();
            if line.is_empty() {
                continue;
            }
            let not_two_words = || HostError::Parse {
                path: path.clone(),
                message: format!("line {line:?} is not \"<capability> <minor>\""),
            };
            let (cap, minor) = mig_minors_words(line).ok_or_else(not_two_words)?;
            let minor = minor.parse::<u32>().map_err(|_| HostError::Parse {
                path: path.clone(),
                message: format!("minor {minor:?} in line {line:?} is not a number"),
            })?;
            f(cap, minor);
        }
        Ok(())
    }
}

/// A `mig-minors` line's two words, `<capability> <minor>`, the line trimmed and not blank;
/// `None` for one word or three.
fn mig_minors_words(line: &str) -> Option<(&str, &str)> {
    let at = line.bytes().position(|b| b.is_ascii_whitespace())?;
    // `at` is an ASCII byte's index, so both halves are `str` boundaries.
    let (cap, minor) = (&line[..at], line[at..].trim_ascii_start());
    (!minor.bytes().any(|b| b.is_ascii_whitespace())).then_some((cap, minor))
}

/// A capability file's minor (its `DeviceFileMinor: <n>` line), `rel` in `caps_dir` (opened as
/// `dir`); `Ok(None)` when it does not exist. One `read` into a buffer on the stack: the file
/// is three short lines, and `read_to_string` added a `statx` and a second `read` to each of
/// a MIG `all` create's 112.
fn read_capability_minor(
    dir: std::os::fd::BorrowedFd,
    caps_dir: &Path,
    rel: &str,
) -> Result<Option<u32>, HostError> {
    let mut buf = [0u8; 256];
    // Non-blocking and bounded as `crate::hostfile` reads, without its `fstat` (112 more system
    // calls in a MIG `all` create): a FIFO under a configured proc root reads as empty, a
    // device stops at the limit.
    let flags = libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY;
    let read = nvshim_hook::root::openat(dir, rel.as_bytes(), flags, 0)
        .map(fs::File::from)
        .and_then(|mut f| {
            use std::io::Read;
            let n = f.read(&mut buf)?;
            if n < buf.len() {
                return Ok(String::from_utf8_lossy(&buf[..n]).into_owned());
            }
            let rest = crate::hostfile::read_bounded(f, 0, crate::hostfile::KERNEL_FILE_LIMIT)?;
            Ok(String::from_utf8_lossy(&[&buf[..], &rest].concat()).into_owned())
        });
    let text = match read {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(HostError::Read {
                path: caps_dir.join(rel),
                source,
            })
        }
    };
    let minor = text
        .lines()
        .find_map(|l| l.strip_prefix("DeviceFileMinor:"))
        .and_then(|m| m.trim().parse::<u32>().ok());
    match minor {
        Some(m) => Ok(Some(m)),
        None => Err(HostError::Parse {
            message: format!("no \"DeviceFileMinor: <number>\" line in {text:?}"),
            path: caps_dir.join(rel),
        }),
    }
}

/// The driver version in the kernel module's banner, `proc/driver/nvidia/version`. Its forms:
///
/// - proprietary: `NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Tue Jul  8 ...`
/// - open (the default since 560, the only one on Blackwell):
///   `NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (...)  ...`
/// - other architectures in place of `x86_64` (`aarch64` on Grace and Jetson, `ppc64le`), and
///   builds without a date or with a localised one.
///
/// The version is the first word after `Module` that reads `N.N` or `N.N.N` (all digits). Anything
/// else is an error naming the line: a version such as `for` would silently give containers an
/// empty driver (no library matches `*.so.for`).
pub fn parse_driver_banner(text: &str) -> Result<String, String> {
    let Some(line) = text.lines().find(|l| l.starts_with("NVRM version:")) else {
        return Err("no \"NVRM version:\" line".into());
    };
    let mut words = line.split_whitespace();
    if !words.any(|w| w == "Module") {
        return Err(format!("no \"Kernel Module\" in the line {line:?}"));
    }
    words
        .find(|w| is_driver_version(w))
        .map(str::to_string)
        .ok_or_else(|| {
            format!("no driver version (N.N or N.N.N) after \"Module\" in the line {line:?}")
        })
}

/// `N.N` or `N.N.N`, every part decimal digits: the shape of every NVIDIA driver version.
fn is_driver_version(word: &str) -> bool {
    let parts: Vec<&str> = word.split('.').collect();
    (2..=3).contains(&parts.len())
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// The CUDA version a driver supports, from its branch (the major of the driver version),
/// without loading libcuda: NVIDIA's CUDA toolkit release notes, "CUDA Toolkit and
/// Corresponding Driver Versions" (the version nvidia-smi prints as "CUDA Version"). A branch
/// newer than the table reports the newest known version, which only under-states it.
pub fn cuda_version_for_driver(driver_version: &str) -> Option<&'static str> {
    const TABLE: &[(u64, &str)] = &[
        (590, "13.1"),
        (580, "13.0"),
        (575, "12.9"),
        (570, "12.8"),
        (565, "12.7"),
        (560, "12.6"),
        (555, "12.5"),
        (550, "12.4"),
        (545, "12.3"),
        (535, "12.2"),
        (530, "12.1"),
        (525, "12.0"),
        (520, "11.8"),
        (515, "11.7"),
        (510, "11.6"),
        (495, "11.5"),
        (470, "11.4"),
        (465, "11.3"),
        (460, "11.2"),
        (455, "11.1"),
        (450, "11.0"),
        (440, "10.2"),
        (418, "10.1"),
        (410, "10.0"),
    ];
    let major: u64 = driver_version.split('.').next()?.parse().ok()?;
    TABLE.iter().find(|(m, _)| major >= *m).map(|(_, v)| *v)
}

/// Lexically cleans an absolute path (`..` cannot climb above `/`).
pub(crate) fn clean(p: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            _ => {}
        }
    }
    out
}

/// Parses one `information` file (`Model:`, `GPU UUID:`, `Bus Location:`, `Device Minor:` ... one
/// `Key: value` per line, as the kernel module writes it).
pub fn parse_information(path: &Path, text: &str) -> Result<Gpu, HostError> {
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .map(|v| v.trim_start_matches(':').trim().to_string())
    };
    let missing = |what: &str| HostError::Parse {
        path: path.to_path_buf(),
        message: format!("no \"{what}:\" line"),
    };
    let minor = field("Device Minor")
        .ok_or_else(|| missing("Device Minor"))?
        .parse::<u32>()
        .map_err(|_| HostError::Parse {
            path: path.to_path_buf(),
            message: "\"Device Minor\" is not a number".into(),
        })?;
    let uuid = field("GPU UUID").ok_or_else(|| missing("GPU UUID"))?;
    let bus = field("Bus Location").ok_or_else(|| missing("Bus Location"))?;
    let bus_id = normalize_bus_id(&bus).ok_or_else(|| HostError::Parse {
        path: path.to_path_buf(),
        message: format!("\"Bus Location\" {bus:?} is not a PCI address"),
    })?;
    Ok(Gpu {
        index: 0,
        minor,
        uuid,
        bus_id,
        model: field("Model").unwrap_or_default(),
    })
}

/// The character section of `/proc/devices`: (major, driver name) per line, in order. A name
/// may be listed under several majors (`infiniband_verbs` past 32 adapters).
pub fn char_devices(text: &str) -> impl Iterator<Item = (u32, &str)> {
    let mut in_char = false;
    text.lines().filter_map(move |line| {
        let line = line.trim();
        if line == "Character devices:" {
            in_char = true;
            return None;
        }
        if line.ends_with("devices:") {
            in_char = false;
        }
        if !in_char {
            return None;
        }
        let (major, name) = line.split_once(char::is_whitespace)?;
        Some((major.parse::<u32>().ok()?, name.trim()))
    })
}

/// Parses `/proc/devices`, character section only.
pub fn parse_devices(text: &str) -> Option<DeviceMajors> {
    let mut majors = DeviceMajors::default();
    let mut frontend = None;
    for (major, name) in char_devices(text) {
        match name {
            "nvidia" => majors.nvidia = major,
            "nvidia-frontend" => frontend = Some(major),
            "nvidia-uvm" => majors.nvidia_uvm = Some(major),
            "nvidia-caps" => majors.nvidia_caps = Some(major),
            "nvidia-caps-imex-channels" => majors.nvidia_caps_imex_channels = Some(major),
            _ => {}
        }
    }
    if majors.nvidia == 0 {
        majors.nvidia = frontend?;
    }
    Some(majors)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEVICES: &str = "Character devices:\n  1 mem\n  4 /dev/vc/0\n195 nvidia\n508 nvidia-uvm\n509 nvidia-caps\n510 nvidia-caps-imex-channels\n\nBlock devices:\n  8 sd\n195 nvidia-bogus-block\n";

    /// An ld.so.cache (glibc's format, written by the hook crate's writer) of 64-bit x86-64
    /// entries named `names`, each in `/usr/lib/x86_64-linux-gnu`.
    pub(super) fn ld_so_cache_of(names: &[&str]) -> Vec<u8> {
        use nvshim_hook::ldcache::{serialize, CacheEntry};
        let entries: Vec<CacheEntry> = names
            .iter()
            .map(|n| CacheEntry {
                flags: 0x0303,
                name: n.as_bytes().to_vec(),
                path: format!("/usr/lib/x86_64-linux-gnu/{n}").into_bytes(),
                os_version: 0,
                hwcap: 0,
                hwcaps: None,
                isa_level: 0,
            })
            .collect();
        serialize(&entries, &Default::default(), "ldconfig (GNU libc) 2.39")
    }

    /// Banners as real hosts print them (each line copied from a host's
    /// `/proc/driver/nvidia/version`), with the version each must give.
    #[test]
    fn ld_cache_of_keeps_exactly_the_entries_of_the_stems() {
        let tmp = tempfile::tempdir().unwrap();
        fs::create_dir_all(tmp.path().join("etc")).unwrap();
        let names = [
            "libcuda.so.1",
            "libcuda.so",
            "libcudart.so.13",
            "libcudadebugger.so.1",
            "libnvidia-ml.so.1",
            "libnvidia-gl.so.1",
            "libnvidia-glcore.so.580.65.06",
            "libnvidia-glcore.so.x.so.1",
            "libz.so.1",
            "libnvidia-ml",
        ];
        fs::write(tmp.path().join("etc/ld.so.cache"), ld_so_cache_of(&names)).unwrap();
        let host = Host::new(HostRoots {
            driver_root: tmp.path().into(),
            dev_root: tmp.path().into(),
            proc_root: tmp.path().into(),
        });
        let stems = [
            "libnvidia-glcore",
            "libcuda",
            "libnvidia-ml",
            "libnvidia-gl",
        ];
        // What `Host::libraries` looks for: `<stem>.so.` at the start of the name.
        let expected: Vec<LdCacheEntry> = host
            .ld_cache()
            .unwrap()
            .entries
            .into_iter()
            .filter(|e| {
                stems
                    .iter()
                    .any(|s| e.name.starts_with(&format!("{s}.so.")))
            })
            .collect();
        let kept = host.ld_cache_of(&stems).unwrap().entries;
        assert_eq!(kept, expected);
        let mut kept_names: Vec<&str> = kept.iter().map(|e| e.name.as_str()).collect();
        kept_names.sort_unstable();
        assert_eq!(
            kept_names,
            [
                "libcuda.so.1",
                "libnvidia-gl.so.1",
                "libnvidia-glcore.so.580.65.06",
                "libnvidia-glcore.so.x.so.1",
                "libnvidia-ml.so.1"
            ]
        );
    }

    #[test]
    fn mig_minors_table_parsed_strictly_and_filtered() {
        let tmp = tempfile::tempdir().unwrap();
        let caps = tmp.path().join("driver/nvidia-caps");
        fs::create_dir_all(&caps).unwrap();
        let host = Host::new(HostRoots {
            driver_root: tmp.path().into(),
            dev_root: tmp.path().into(),
            proc_root: tmp.path().into(),
        });
        // No file: no MIG support, nothing.
        assert!(host.mig_minors().unwrap().is_empty());
        fs::write(
            caps.join("mig-minors"),
            "config 1\nmonitor 2\n\ngpu0/gi0/access 3\r\n  gpu0/gi0/ci0/access\t4  \n",
        )
        .unwrap();
        assert_eq!(
            host.mig_minors().unwrap(),
            [
                ("config".to_string(), 1),
                ("monitor".to_string(), 2),
                ("gpu0/gi0/access".to_string(), 3),
                ("gpu0/gi0/ci0/access".to_string(), 4)
            ]
        );
        for bad in ["config 1 2\n", "config\n", "config x\n"] {
            fs::write(caps.join("mig-minors"), bad).unwrap();
            let e = host.mig_minors().unwrap_err().to_string();
            assert!(e.contains("mig-minors") && e.contains("config"), "{e}");
        }
    }

    /// The capability files as the lent H200's driver (580.159.04) writes them.
    #[test]
    fn capability_minors_from_their_own_files() {
        let tmp = tempfile::tempdir().unwrap();
        let caps = tmp.path().join("driver/nvidia/capabilities");
        fs::create_dir_all(caps.join("mig")).unwrap();
        fs::create_dir_all(caps.join("gpu3/mig/gi1/ci0")).unwrap();
        let file = |minor: u32, mode: u32| {
            format!("DeviceFileMinor: {minor}\nDeviceFileMode: {mode}\nDeviceFileModify: 1\n")
        };
        fs::write(caps.join("mig/config"), file(1, 256)).unwrap();
        fs::write(caps.join("gpu3/mig/gi1/access"), file(417, 292)).unwrap();
        fs::write(caps.join("gpu3/mig/gi1/ci0/access"), file(418, 292)).unwrap();
        let host = Host::new(HostRoots {
            driver_root: tmp.path().into(),
            dev_root: tmp.path().into(),
            proc_root: tmp.path().into(),
        });
        let minor = |cap: &str| host.capability_minors(&[cap]).unwrap()[0];
        assert_eq!(minor("config"), Some(1));
        assert_eq!(minor("monitor"), None);
        assert_eq!(minor("gpu3/gi1/access"), Some(417));
        assert_eq!(minor("gpu3/gi1/ci0/access"), Some(418));
        assert_eq!(minor("gpu3/gi2/access"), None);
        fs::write(caps.join("mig/monitor"), "DeviceFileMode: 292\n").unwrap();
        let e = host
            .capability_minors(&["monitor"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("mig/monitor") && e.contains("DeviceFileMinor"),
            "{e}"
        );
    }

    /// With a `cache-dir`, the minors come from the driver's table once it is old enough to
    /// keep: the same as each capability's own file gives (the files of an instance that
    /// exists; which exist is the caller's to know).
    #[test]
    fn capability_minors_from_the_kept_table_match_their_files() {
        let tmp = tempfile::tempdir().unwrap();
        let proc = tmp.path();
        let caps = proc.join("driver/nvidia/capabilities");
        fs::create_dir_all(proc.join("driver/nvidia-caps")).unwrap();
        fs::write(
            proc.join("driver/nvidia-caps/mig-minors"),
            nvshim_testsupport::host::mig_minors_table(),
        )
        .unwrap();
        let names = [
            "config",
            "monitor",
            "gpu3/gi1/access",
            "gpu3/gi1/ci0/access",
        ];
        for (name, minor) in names.iter().zip([1, 2, 417, 418]) {
            let rel = match name.split_once('/') {
                Some((gpu, rest)) => format!("{gpu}/mig/{rest}"),
                None => format!("mig/{name}"),
            };
            fs::create_dir_all(caps.join(&rel).parent().unwrap()).unwrap();
            let text = format!("DeviceFileMinor: {minor}\nDeviceFileMode: 292\n");
            fs::write(caps.join(rel), text).unwrap();
        }
        let roots = HostRoots {
            driver_root: proc.into(),
            dev_root: proc.into(),
            proc_root: proc.into(),
        };
        let from_files = Host::new(roots.clone()).capability_minors(&names).unwrap();
        assert_eq!(from_files, [Some(1), Some(2), Some(417), Some(418)]);
        let cached = || {
            let host = Host::new(roots.clone()).with_cache_dir(&proc.join("cache"));
            host.capability_minors(&names).unwrap()
        };
        // The table just written: too young to keep, so not read; then read and kept.
        assert_eq!(cached(), from_files);
        std::thread::sleep(std::time::Duration::from_millis(2100));
        fs::create_dir(proc.join("cache")).unwrap();
        assert_eq!(cached(), from_files);
        assert_eq!(fs::read_dir(proc.join("cache")).unwrap().count(), 1);
        // The capabilities' files gone: answered from the kept table.
        fs::remove_dir_all(&caps).unwrap();
        assert_eq!(cached(), from_files);
        assert_eq!(
            Host::new(roots).capability_minors(&names).unwrap(),
            [None; 4]
        );
    }

    #[test]
    fn driver_banner_every_form() {
        let cases = [
            // Proprietary modules, current and old.
            ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Tue Jul  8 14:11:38 UTC 2025\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n", "580.65.06"),
            ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  384.98  Thu Oct 26 15:16:01 PDT 2017\nGCC version:  gcc version 7.2.0 (Ubuntu 7.2.0-8ubuntu3) \n", "384.98"),
            ("NVRM version: NVIDIA UNIX aarch64 Kernel Module  550.54.15  Tue Mar  5 22:15:33 UTC 2024\n", "550.54.15"),
            // Open modules: the default since 560.
            ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (dvs-builder@U22-I3-AF03-09-1)  Thu Sep 25 01:12:42 UTC 2025\nGCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04) \n", "580.95.05"),
            ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  565.57.01  Release Build  (dvs-builder@U16-A24-9-2)  Thu Oct 10 12:15:00 UTC 2024\n", "565.57.01"),
            // Distribution builds: no date, a trailing space, a localised date.
            ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  525.60.11  Release Build  (archlinux-builder@localhost)  \nGCC version:  gcc version 12.2.0 (GCC) \n", "525.60.11"),
            ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  555.58  Release Build  (portage@localhost)  \u{421}\u{431} 29 \u{438}\u{44e}\u{43d} 2024 14:36:22 MSK\n", "555.58"),
            // Grace (aarch64) and Jetson.
            ("NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.95.05  Release Build  (dvs-builder@U22-I3-AF03-09-1)  Thu Sep 25 01:12:42 UTC 2025\n", "580.95.05"),
            ("NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  35.3.1  Release Build  (buildbrain@mobile-u64-6289-d7000)  Sun Mar 19 08:09:33 PDT 2023\n", "35.3.1"),
        ];
        for (banner, want) in cases {
            assert_eq!(parse_driver_banner(banner).as_deref(), Ok(want), "{banner}");
        }
    }

    #[test]
    fn driver_banner_without_version_is_an_error_naming_the_line() {
        for banner in [
            "",
            "GCC version:  gcc version 12.2.0\n",
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  Release Build\n",
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06beta  Tue Jul  8\n",
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580  Tue Jul  8\n",
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  1.2.3.4  x\n",
            "NVRM version: something else 580.65.06\n",
        ] {
            let err = parse_driver_banner(banner).unwrap_err();
            if banner.starts_with("NVRM") {
                assert!(err.contains(banner.trim_end()), "{err}");
            }
        }
        assert!(!is_driver_version("for"));
        assert!(!is_driver_version("x86_64"));
        assert!(is_driver_version("580.95.05"));
    }

    #[test]
    fn devices_majors() {
        let m = parse_devices(DEVICES).unwrap();
        assert_eq!(m.nvidia, 195);
        assert_eq!(m.nvidia_uvm, Some(508));
        assert_eq!(m.nvidia_caps, Some(509));
        assert_eq!(m.nvidia_caps_imex_channels, Some(510));
    }

    #[test]
    fn devices_frontend_before_550() {
        let m = parse_devices("Character devices:\n195 nvidia-frontend\n511 nvidia-uvm\n").unwrap();
        assert_eq!(m.nvidia, 195);
        assert!(parse_devices("Character devices:\n  1 mem\n").is_none());
    }

    #[test]
    fn information_file() {
        let text = "Model:           NVIDIA H100 80GB HBM3\nIRQ:             112\nGPU UUID:        GPU-a4f8c2d1-e5f6-7a8b-9c0d-1e2f3a4b5c6d\nBus Location:    0000:1B:00.0\nDevice Minor:    3\n";
        let g = parse_information(Path::new("x"), text).unwrap();
        assert_eq!(g.minor, 3);
        assert_eq!(g.bus_id, "0000:1b:00.0");
        assert_eq!(g.model, "NVIDIA H100 80GB HBM3");
        assert_eq!(g.uuid, "GPU-a4f8c2d1-e5f6-7a8b-9c0d-1e2f3a4b5c6d");
        let err = parse_information(Path::new("/p/info"), "Model: x\n").unwrap_err();
        assert!(err.to_string().contains("/p/info"));
    }

    #[test]
    fn bus_ids() {
        assert_eq!(normalize_bus_id("1B:00.0").as_deref(), Some("0000:1b:00.0"));
        assert_eq!(
            normalize_bus_id("00000000:1b:00.0").as_deref(),
            Some("0000:1b:00.0")
        );
        assert_eq!(
            normalize_bus_id("0:3b:0.0").as_deref(),
            Some("0000:3b:00.0")
        );
        assert_eq!(normalize_bus_id("1b:00"), None);
        assert_eq!(normalize_bus_id("zz:00.0"), None);
        assert_eq!(normalize_bus_id("1"), None);
    }

    #[test]
    fn cuda_for_driver() {
        assert_eq!(cuda_version_for_driver("580.65.06"), Some("13.0"));
        assert_eq!(cuda_version_for_driver("535.104.05"), Some("12.2"));
        assert_eq!(cuda_version_for_driver("999.1"), Some("13.1"));
        assert_eq!(cuda_version_for_driver("390.1"), None);
    }

    #[test]
    fn clean_never_climbs_above_root() {
        assert_eq!(clean(Path::new("/a/../../etc")), PathBuf::from("/etc"));
    }
}
