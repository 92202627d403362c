//! NVML's answer for a create, kept in `cache-dir` (`nvml-<hash>`). A create asks NVML only to
//! map a MIG id given as `MIG-<uuid>` or `G:M`, or to decide an `arch` or `brand` requirement
//! term, and then through the `nvshim nvml-query` helper (`NvmlAccess::Helper`): a process
//! that loads and initialises NVML, milliseconds per create on a real driver, more per GPU
//! where it initialises slowly (docs/benchmarks.md, figure 8, has the bench's figure with the
//! fake NVML). What it answers changes only when the driver, a GPU or a MIG instance does.
//!
//! The answer is used only while every file that would show such a change gives the [`Key`] it
//! was cached with, the same rule as the GPUs' and capabilities' caches (`gpu_cache.rs`,
//! `src/cache.rs`): the library NVML was loaded from and the ld.so.cache that named it,
//! `driver/nvidia/version`, each GPU's `information`, and the `access` file of every MIG GPU
//! instance and compute instance under `driver/nvidia/capabilities`, in one [`Fingerprint`]. procfs makes a new inode, stamped with
//! the clock, when the driver creates a file again, so a reloaded driver, a GPU removed and
//! added back, or a MIG instance destroyed and created (same GPU and compute instance ids,
//! new UUID) all show a new key: a container asking for a destroyed instance's UUID can never
//! be given the instance that replaced it. Keyed by the MIG layout as ids alone, it could.
//!
//! A create checks only what its look-ups rely on: the library, the version and every GPU's
//! `information` always (which GPUs there are, their NVML indices and facts); for a UUID, the
//! two files of the instance the cached answer gives it (instances made or destroyed beside it
//! do not move it); for `G:M`, every instance of GPU `G` (`M` is an index among them). A UUID
//! the cached answer does not hold asks NVML. On the bench's 8-GPU x 7-MIG host, a create of
//! one MIG device by UUID made 690 system calls checking every instance (the 65 directories of
//! a whole walk), 306 checking its GPU's, 252 checking its own two files (`strace -c`).
//!
//! An answer is kept only when the fingerprint of every GPU's instances was the same before
//! and after NVML was asked, every key in it was more than [`cache::RACY_NS`] old, and every MIG
//! device NVML reported has its two `access` files in it (a host whose `/proc` does not list its
//! instances is asked every time). Persistence mode is not part of the answer: it changes
//! without any file changing, and a create does not use it (`nvshim doctor` asks NVML itself).

use std::path::{Path, PathBuf};

use super::{GpuInfo, Lookup, MigInfo, NvmlHost};
use crate::cache::{self, Key};
use crate::host::Host;

const MAGIC: &[u8] = b"nvshim-nvml 3\n";

/// Files with their keys, a line each (`F\t<path>\t<key>\n`), as one byte string to compare.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Lines {
    bytes: Vec<u8>,
    /// Every key older than [`cache::RACY_NS`] at the read.
    trusted: bool,
}

impl Lines {
    fn new() -> Lines {
        Lines {
            bytes: Vec::new(),
            trusted: true,
        }
    }

    /// Adds `path`'s key; `None` when it cannot be `stat`ed or holds a tab or newline.
    fn add(&mut self, path: &Path, read_at: i64) -> Option<()> {
        self.add_stat(path, &std::fs::metadata(path).ok()?, read_at)
    }

    /// [`Lines::add`] with `path` already `stat`ed.
    fn add_stat(&mut self, path: &Path, meta: &std::fs::Metadata, read_at: i64) -> Option<()> {
        use std::os::unix::ffi::OsStrExt;
        let key = Key::of(meta);
        self.trusted &= key.trusted_at(read_at);
        let mut fields = Vec::with_capacity(64);
        cache::key_fields(&key, &mut fields);
        cache::line(
            &mut self.bytes,
            &[b"F", path.as_os_str().as_bytes(), &fields],
        )
    }
}

/// What every answer depends on: the library NVML was loaded from and the ld.so.cache that
/// named it (when the driver root has one), the driver's version file and each GPU's
/// `information` (`None`: something could not be read; nothing is cached); and whether there
/// was an ld.so.cache.
fn common(host: &Host, lib: &Path, read_at: i64) -> Option<(Lines, bool)> {
    let mut lines = Lines::new();
    lines.add(lib, read_at)?;
    let ld_so_cache = crate::host::under_root(&host.roots().driver_root, "/etc/ld.so.cache");
    // One `stat`: whether there is a cache, and its key.
    let indexed = match std::fs::metadata(&ld_so_cache) {
        Ok(meta) => {
            lines.add_stat(&ld_so_cache, &meta, read_at)?;
            true
        }
        Err(_) => false,
    };
    let nvidia = host.roots().proc_root.join("driver/nvidia");
    lines.add(&nvidia.join("version"), read_at)?;
    let gpus = nvidia.join("gpus");
    for name in names(&gpus)? {
        lines.add(&gpus.join(name).join("information"), read_at)?;
    }
    Some((lines, indexed))
}

/// The MIG instances of GPU `minor`: the `access` file of each GPU instance and compute
/// instance under `capabilities/gpu<minor>/mig`, with the instances as (minor, gi, ci) added to
/// `instances`. Empty without MIG instances.
fn mig_instances(
    host: &Host,
    minor: u32,
    read_at: i64,
    instances: &mut Vec<(u32, u32, u32)>,
) -> Option<Lines> {
    let mig = host
        .roots()
        .proc_root
        .join(format!("driver/nvidia/capabilities/gpu{minor}/mig"));
    let mut lines = Lines::new();
    for (gi, gi_dir) in numbered(&mig, "gi")? {
        lines.add(&gi_dir.join("access"), read_at)?;
        for (ci, ci_dir) in numbered(&gi_dir, "ci")? {
            lines.add(&ci_dir.join("access"), read_at)?;
            instances.push((minor, gi, ci));
        }
    }
    Some(lines)
}

/// Everything an answer may be kept with: [`common`] and every GPU's [`mig_instances`].
#[derive(Debug, PartialEq, Eq)]
struct Fingerprint {
    common: Lines,
    /// By GPU minor, the GPUs with a `capabilities/gpu<minor>` directory.
    gpus: Vec<(u32, Lines)>,
    instances: Vec<(u32, u32, u32)>,
}

impl Fingerprint {
    fn of(host: &Host, common: Lines, read_at: i64) -> Option<Fingerprint> {
        let caps = host.roots().proc_root.join("driver/nvidia/capabilities");
        let mut instances = Vec::new();
        let gpus = numbered(&caps, "gpu")?
            .into_iter()
            .map(|(minor, _)| Some((minor, mig_instances(host, minor, read_at, &mut instances)?)))
            .collect::<Option<_>>()?;
        Some(Fingerprint {
            common,
            gpus,
            instances,
        })
    }

    fn trusted(&self) -> bool {
        self.common.trusted && self.gpus.iter().all(|(_, l)| l.trusted)
    }

    /// Whether every MIG device in `answer` is one of the instances `/proc` lists.
    fn covers(&self, answer: &NvmlHost) -> bool {
        answer.gpus.iter().all(|g| {
            g.migs.iter().all(|m| {
                self.instances
                    .contains(&(g.minor, m.gpu_instance, m.compute_instance))
            })
        })
    }
}

/// The names in `dir`, sorted; none when it does not exist.
fn names(dir: &Path) -> Option<Vec<std::ffi::OsString>> {
    use std::os::unix::ffi::OsStringExt;
    let mut out: Vec<std::ffi::OsString> = match nvshim_hook::root::list_dir(dir) {
        Ok(entries) => entries
            .into_iter()
            .map(|e| std::ffi::OsString::from_vec(e.name))
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(_) => return None,
    };
    out.sort();
    Some(out)
}

/// The entries of `dir` named `<prefix><number>`, by number, with their paths.
fn numbered(dir: &Path, prefix: &str) -> Option<Vec<(u32, PathBuf)>> {
    let mut out: Vec<(u32, PathBuf)> = names(dir)?
        .into_iter()
        .filter_map(|n| {
            let number = n.to_str()?.strip_prefix(prefix)?.parse().ok()?;
            Some((number, dir.join(n)))
        })
        .collect();
    out.sort_unstable();
    Some(out)
}

/// NVML's answer for `lookups` through the cache in `host`'s `cache-dir` (module doc): `ask`
/// runs only when the cache does not answer, with the library `library` names. `read_at` is
/// now, in ns since the epoch.
pub(super) fn answer<E>(
    host: &Host,
    read_at: i64,
    lookups: &[Lookup<'_>],
    library: impl Fn() -> Result<PathBuf, E>,
    ask: impl FnOnce(PathBuf) -> Result<NvmlHost, E>,
) -> Result<NvmlHost, E> {
    let Some(dir) = host.cache_dir.as_deref() else {
        return ask(library()?).map(without_persistence);
    };
    let file = dir.join(format!("nvml-{:016x}", file_hash(host)));
    let bytes = cache::read_private(&file, "NVML cache");
    // What `library` said, when the hit check had to ask it.
    let mut looked_up = None;
    if let Some(cached) = bytes.as_deref().and_then(Cached::decode) {
        // The library as the cached answer names it: `common` holds the key of the
        // ld.so.cache it was found in. A driver root without one is scanned (`Host::ld_cache`):
        // the library is looked up again.
        let lib = cached.answer.lib.clone();
        if let Some((now, indexed)) = common(host, &lib, read_at) {
            let same = indexed || {
                let found = library();
                let same = found.as_ref().is_ok_and(|l| *l == lib);
                looked_up = Some(found);
                same
            };
            if let Some(hit) = same
                .then(|| cached.answers(host, &now, lookups, read_at))
                .flatten()
            {
                return Ok(hit);
            }
        }
    }
    let lib = looked_up.unwrap_or_else(&library)?;
    let before = common(host, &lib, read_at).and_then(|(c, _)| Fingerprint::of(host, c, read_at));
    let answer = without_persistence(ask(lib.clone())?);
    let keep = before.filter(|fp| {
        answer.lib == lib
            && fp.trusted()
            && fp.covers(&answer)
            && common(host, &lib, read_at)
                .and_then(|(c, _)| Fingerprint::of(host, c, read_at))
                .as_ref()
                == Some(fp)
    });
    if let Some(body) = keep.and_then(|fp| encode(&fp, &answer)) {
        if let Err(e) = cache::write_private(dir, &file, &body) {
            tracing::debug!("NVML cache {} not written: {e}", file.display());
        }
    }
    Ok(answer)
}

/// The cache file's name: one per `/proc` and driver root.
fn file_hash(host: &Host) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let roots = host.roots();
    let mut bytes = roots.proc_root.as_os_str().as_bytes().to_vec();
    bytes.push(0);
    bytes.extend_from_slice(roots.driver_root.as_os_str().as_bytes());
    cache::hash(&bytes)
}

fn without_persistence(mut answer: NvmlHost) -> NvmlHost {
    for g in &mut answer.gpus {
        g.persistence_mode = None;
    }
    answer
}

/// [`common`]'s lines, then per GPU `G\t<minor>\n` and its [`mig_instances`] lines, then the
/// answer: `L\t<library>`, `V\t<driver version>`, and per GPU an `N` line (index, minor, UUID,
/// name, bus id, MIG enabled, arch, brand) with an `M` line per MIG device (index, UUID, GPU
/// instance, compute instance, name); sealed. Tab-separated lines, not JSON: decoding the
/// answer of the bench's 8 GPUs x 7 MIG devices as JSON took 241,000 instructions of a
/// 2.64 M create (callgrind). `None` when a field holds a tab or newline.
fn encode(fp: &Fingerprint, answer: &NvmlHost) -> Option<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    let mut body = MAGIC.to_vec();
    body.extend_from_slice(&fp.common.bytes);
    for (minor, lines) in &fp.gpus {
        cache::line(&mut body, &[b"G", minor.to_string().as_bytes()])?;
        body.extend_from_slice(&lines.bytes);
    }
    cache::line(&mut body, &[b"L", answer.lib.as_os_str().as_bytes()])?;
    cache::line(&mut body, &[b"V", answer.driver_version.as_bytes()])?;
    for g in &answer.gpus {
        let (index, minor) = (g.index.to_string(), g.minor.to_string());
        let mig = if g.mig_enabled { b"1" } else { b"0" };
        let (arch, brand) = (
            cache::optional_field(g.arch.as_deref()),
            cache::optional_field(g.brand.as_deref()),
        );
        let n: [&[u8]; 9] = [
            b"N",
            index.as_bytes(),
            minor.as_bytes(),
            g.uuid.as_bytes(),
            g.name.as_bytes(),
            g.bus_id.as_bytes(),
            mig,
            &arch,
            &brand,
        ];
        cache::line(&mut body, &n)?;
        for m in &g.migs {
            let numbers = [m.index, m.gpu_instance, m.compute_instance].map(|n| n.to_string());
            let line: [&[u8]; 6] = [
                b"M",
                numbers[0].as_bytes(),
                m.uuid.as_bytes(),
                numbers[1].as_bytes(),
                numbers[2].as_bytes(),
                m.name.as_bytes(),
            ];
            cache::line(&mut body, &line)?;
        }
    }
    Some(cache::seal(body))
}

/// A whole cache file, its fingerprint lines borrowed.
struct Cached<'a> {
    common: &'a [u8],
    gpus: Vec<(u32, &'a [u8])>,
    answer: NvmlHost,
}

impl<'a> Cached<'a> {
    /// `None` when the file is not whole.
    fn decode(bytes: &'a [u8]) -> Option<Cached<'a>> {
        let body = cache::unseal(bytes)?.strip_prefix(MAGIC)?;
        // The fingerprint's lines start with `F` or `G`: the answer starts at the first `L`.
        let split = if body.starts_with(b"L\t") {
            0
        } else {
            nvshim_hook::bytes::find_str(body, b"\nL\t")? + 1
        };
        let (fingerprint, answer) = body.split_at(split);
        // Sections start at the `G` lines; what comes before them is the common part.
        let mut starts: Vec<usize> = Vec::new();
        let mut at = 0;
        while at < fingerprint.len() {
            let end = at + nvshim_hook::bytes::find(b'\n', &fingerprint[at..])? + 1;
            let line = &fingerprint[at..end];
            if line.starts_with(b"G\t") {
                starts.push(at);
            } else if !line.starts_with(b"F\t") {
                return None;
            }
            at = end;
        }
        let common = &fingerprint[..starts.first().copied().unwrap_or(fingerprint.len())];
        let mut gpus = Vec::with_capacity(starts.len());
        for (i, &start) in starts.iter().enumerate() {
            let end = starts.get(i + 1).copied().unwrap_or(fingerprint.len());
            let section = &fingerprint[start..end];
            let head = nvshim_hook::bytes::find(b'\n', section)? + 1;
            let minor = std::str::from_utf8(&section[2..head - 1])
                .ok()?
                .parse()
                .ok()?;
            gpus.push((minor, &section[head..]));
        }
        Some(Cached {
            common,
            gpus,
            answer: decode_answer(std::str::from_utf8(answer).ok()?)?,
        })
    }

    /// The cached answer when `now` (the host's [`common`] part) is the cached one and every
    /// GPU a look-up relies on has the cached MIG instances; `None` otherwise, or when a
    /// look-up is not in the answer.
    fn answers(
        self,
        host: &Host,
        now: &Lines,
        lookups: &[Lookup<'_>],
        read_at: i64,
    ) -> Option<NvmlHost> {
        if now.bytes != self.common {
            return None;
        }
        let gpus = &self.answer.gpus;
        let section = |minor: u32| {
            self.gpus
                .iter()
                .find(|(m, _)| *m == minor)
                .map_or(&[][..], |(_, lines)| lines)
        };
        for lookup in lookups {
            match lookup {
                // A UUID stays its instance's while the instance's two files keep their keys:
                // instances made or destroyed beside it do not move it.
                Lookup::MigUuid(uuid) => {
                    let (gpu, mig) = gpus.iter().find_map(|g| {
                        let m = g.migs.iter().find(|m| m.uuid.eq_ignore_ascii_case(uuid))?;
                        Some((g, m))
                    })?;
                    let gi = host.roots().proc_root.join(format!(
                        "driver/nvidia/capabilities/gpu{}/mig/gi{}",
                        gpu.minor, mig.gpu_instance
                    ));
                    let ci = gi.join(format!("ci{}", mig.compute_instance));
                    for file in [gi.join("access"), ci.join("access")] {
                        let mut fresh = Lines::new();
                        fresh.add(&file, read_at)?;
                        // A whole cached line: `F\t` starts one only, as no path holds a tab.
                        nvshim_hook::bytes::find_str(section(gpu.minor), &fresh.bytes)?;
                    }
                }
                // `M` is a handle index among the GPU's instances: all of them must be the same.
                Lookup::MigIndex { gpu } => {
                    let parent = gpus.iter().find(|g| g.index == *gpu)?;
                    let fresh = mig_instances(host, parent.minor, read_at, &mut Vec::new())?;
                    if fresh.bytes != section(parent.minor) {
                        return None;
                    }
                }
            }
        }
        Some(self.answer)
    }
}

/// The answer as [`encode`] writes it.
fn decode_answer(text: &str) -> Option<NvmlHost> {
    let mut lines = cache::lines(text.strip_suffix('\n')?);
    let lib = PathBuf::from(lines.next()?.strip_prefix("L\t")?);
    let driver_version = lines.next()?.strip_prefix("V\t")?.to_string();
    let mut gpus: Vec<GpuInfo> = Vec::new();
    for line in lines {
        if line.starts_with("M\t") {
            let [_, index, uuid, gi, ci, name] = cache::fields(line, b'\t')?;
            gpus.last_mut()?.migs.push(MigInfo {
                index: index.parse().ok()?,
                uuid: uuid.to_string(),
                gpu_instance: gi.parse().ok()?,
                compute_instance: ci.parse().ok()?,
                name: name.to_string(),
            });
            continue;
        }
        let ["N", index, minor, uuid, name, bus_id, mig, arch, brand] = cache::fields(line, b'\t')?
        else {
            return None;
        };
        gpus.push(GpuInfo {
            index: index.parse().ok()?,
            minor: minor.parse().ok()?,
            uuid: uuid.to_string(),
            name: name.to_string(),
            bus_id: bus_id.to_string(),
            mig_enabled: match mig {
                "1" => true,
                "0" => false,
                _ => return None,
            },
            migs: Vec::new(),
            arch: cache::parse_optional_field(arch)?,
            brand: cache::parse_optional_field(brand)?,
            persistence_mode: None,
        });
    }
    Some(NvmlHost {
        lib,
        driver_version,
        gpus,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::RACY_NS;
    use crate::host::nvml::{GpuInfo, MigInfo};
    use crate::host::HostRoots;
    use std::cell::Cell;
    use std::fs;

    /// A host's `/proc` with two GPUs (minors 0 and 1), MIG instance gi1/ci0 on GPU 0, and a
    /// library file.
    struct Proc {
        tmp: tempfile::TempDir,
        host: Host,
        lib: PathBuf,
    }

    /// Writes `path` as a new file, as procfs makes a new inode for a file the driver creates
    /// again (written in place, the same size within one clock tick would keep its key).
    fn replace(path: &Path, text: &str) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        let new = path.with_extension("new");
        fs::write(&new, text).unwrap();
        fs::rename(&new, path).unwrap();
    }

    fn later() -> i64 {
        cache::now_ns() + 10 * RACY_NS
    }

    impl Proc {
        fn new() -> Proc {
            let tmp = tempfile::tempdir().unwrap();
            let proc_root = tmp.path().join("proc");
            let nvidia = proc_root.join("driver/nvidia");
            replace(&nvidia.join("version"), "NVRM version: 580.159.04\n");
            for (minor, bus) in [(0, "0000:1b:00.0"), (1, "0000:3b:00.0")] {
                let info = nvidia.join("gpus").join(bus).join("information");
                replace(&info, &format!("Device Minor: {minor}\n"));
            }
            let lib = tmp.path().join("libnvidia-ml.so.1");
            replace(&lib, "ELF");
            let host = Host::new(HostRoots {
                driver_root: tmp.path().to_path_buf(),
                dev_root: tmp.path().to_path_buf(),
                proc_root,
            })
            .with_cache_dir(&tmp.path().join("cache"));
            let p = Proc { tmp, host, lib };
            p.instance(0, 1, 0);
            p
        }

        fn nvidia(&self) -> PathBuf {
            self.host.roots().proc_root.join("driver/nvidia")
        }

        /// Creates MIG instance `gi`/`ci` on GPU `gpu`: its two `access` files, made again.
        fn instance(&self, gpu: u32, gi: u32, ci: u32) {
            let dir = self
                .nvidia()
                .join(format!("capabilities/gpu{gpu}/mig/gi{gi}"));
            for file in [dir.join("access"), dir.join(format!("ci{ci}/access"))] {
                replace(&file, &format!("DeviceFileMinor: {gi}{ci}\n"));
            }
        }

        /// What NVML says: GPU 0 (index 0) with MIG device `uuid` at gi1/ci0, and GPU 1.
        fn nvml(&self, uuid: &str) -> NvmlHost {
            let gpu = |index: u32, migs: Vec<MigInfo>| GpuInfo {
                index,
                minor: index,
                uuid: format!("GPU-{index}"),
                name: "NVIDIA H200".into(),
                bus_id: format!("0000:{}b:00.0", 1 + 2 * index),
                mig_enabled: !migs.is_empty(),
                migs,
                arch: Some("9.0".into()),
                brand: Some("nvidia".into()),
                persistence_mode: Some(true),
            };
            let mig = MigInfo {
                index: 0,
                uuid: uuid.into(),
                gpu_instance: 1,
                compute_instance: 0,
                name: "NVIDIA H200 MIG 1g.18gb".into(),
            };
            NvmlHost {
                lib: self.lib.clone(),
                driver_version: "580.159.04".into(),
                gpus: vec![gpu(0, vec![mig]), gpu(1, Vec::new())],
            }
        }

        /// The MIG UUID on GPU 0 that the cache, or NVML saying `says`, answers for `lookup`
        /// at `at`, and whether NVML was asked.
        fn ask(&self, says: &str, lookup: Option<Lookup<'_>>, at: i64) -> (String, bool) {
            let asked = Cell::new(false);
            let lookups: Vec<Lookup<'_>> = lookup.into_iter().collect();
            let library = || Ok::<_, ()>(self.lib.clone());
            let answer = answer(&self.host, at, &lookups, library, |_| {
                asked.set(true);
                Ok(self.nvml(says))
            })
            .unwrap();
            assert_eq!(answer.gpus[0].persistence_mode, None);
            (answer.gpus[0].migs[0].uuid.clone(), asked.get())
        }

        fn uuid(&self, says: &str, uuid: &str, at: i64) -> (String, bool) {
            self.ask(says, Some(Lookup::MigUuid(uuid)), at)
        }
    }

    #[test]
    fn kept_while_the_files_keep_their_keys_and_asked_again_when_an_instance_is_recreated() {
        let p = Proc::new();
        // Young files: asked every time, not kept.
        assert_eq!(
            p.uuid("MIG-a", "MIG-a", cache::now_ns()),
            ("MIG-a".into(), true)
        );
        assert!(!p.tmp.path().join("cache").exists());
        // Old enough: kept, then answered without NVML (case aside, as NVML compares).
        assert_eq!(p.uuid("MIG-a", "MIG-a", later()), ("MIG-a".into(), true));
        assert_eq!(p.uuid("MIG-b", "mig-A", later()), ("MIG-a".into(), false));
        // A UUID the answer does not hold: NVML is asked (and its answer kept).
        assert_eq!(p.uuid("MIG-b", "MIG-new", later()), ("MIG-b".into(), true));
        assert_eq!(p.uuid("MIG-c", "MIG-b", later()), ("MIG-b".into(), false));
        // The instance destroyed and created again (its files made anew): NVML is asked.
        p.instance(0, 1, 0);
        assert_eq!(p.uuid("MIG-c", "MIG-b", later()), ("MIG-c".into(), true));
        assert_eq!(p.uuid("MIG-d", "MIG-c", later()), ("MIG-c".into(), false));
        // Instances made beside it, on another GPU or on its own, do not move a UUID...
        p.instance(1, 2, 0);
        p.instance(0, 2, 0);
        assert_eq!(p.uuid("MIG-d", "MIG-c", later()), ("MIG-c".into(), false));
        // ...but `G:M` relies on every instance of GPU G (only G's).
        let index = Some(Lookup::MigIndex { gpu: 0 });
        assert_eq!(p.ask("MIG-d", index, later()), ("MIG-d".into(), true));
        assert_eq!(p.ask("MIG-e", index, later()), ("MIG-d".into(), false));
        p.instance(1, 3, 0);
        assert_eq!(p.ask("MIG-e", index, later()), ("MIG-d".into(), false));
        p.instance(0, 3, 0);
        assert_eq!(p.ask("MIG-e", index, later()), ("MIG-e".into(), true));
        // Without a MIG look-up (`arch`, `brand`), only the GPUs matter.
        p.instance(0, 3, 0);
        assert_eq!(p.ask("MIG-f", None, later()), ("MIG-e".into(), false));
        // The driver reloaded, the library replaced, a GPU added: each asks again.
        let nvidia = p.nvidia();
        let changes: [&dyn Fn(); 3] = [
            &|| replace(&nvidia.join("version"), "NVRM version: 580.159.05\n"),
            &|| replace(&p.lib, "ELF"),
            &|| replace(&nvidia.join("gpus/0000:5b:00.0/information"), "x"),
        ];
        for (i, change) in changes.iter().enumerate() {
            let (says, next) = (format!("MIG-{i}"), format!("MIG-{}", i + 1));
            change();
            assert_eq!(p.ask(&says, None, later()), (says.clone(), true), "{i}");
            assert_eq!(p.ask(&next, None, later()), (says, false), "{i}");
        }
        // Another instance destroyed: still its; its own destroyed: asked again.
        fs::remove_dir_all(nvidia.join("capabilities/gpu0/mig/gi2")).unwrap();
        assert_eq!(p.uuid("MIG-x", "MIG-2", later()), ("MIG-2".into(), false));
        fs::remove_dir_all(nvidia.join("capabilities/gpu0/mig/gi1/ci0")).unwrap();
        assert_eq!(p.uuid("MIG-x", "MIG-2", later()), ("MIG-x".into(), true));
    }

    #[test]
    fn the_library_is_looked_up_again_only_without_an_ld_so_cache() {
        let p = Proc::new();
        let ld_so_cache = p.tmp.path().join("etc/ld.so.cache");
        replace(&ld_so_cache, "glibc-ld.so.cache1.1");
        let (looked_up, asked) = (Cell::new(0), Cell::new(0));
        let ask = |lib: &Path| {
            let library = || {
                looked_up.set(looked_up.get() + 1);
                Ok::<_, ()>(lib.to_path_buf())
            };
            answer(&p.host, later(), &[], library, |_| {
                asked.set(asked.get() + 1);
                Ok(p.nvml("MIG-a"))
            })
            .unwrap();
            (looked_up.replace(0), asked.replace(0))
        };
        assert_eq!(ask(&p.lib), (1, 1));
        // Its key stands for the look-up.
        assert_eq!(ask(&p.lib), (0, 0));
        replace(&ld_so_cache, "glibc-ld.so.cache1.1 again");
        assert_eq!(ask(&p.lib), (1, 1));
        assert_eq!(ask(&p.lib), (0, 0));
        // Without one (a scanned driver root), the library is looked up on every hit, and
        // another library asks NVML.
        fs::remove_file(&ld_so_cache).unwrap();
        assert_eq!(ask(&p.lib), (1, 1));
        assert_eq!(ask(&p.lib), (1, 0));
        let other = p.tmp.path().join("other/libnvidia-ml.so.1");
        replace(&other, "ELF");
        assert_eq!(ask(&other), (1, 1));
    }

    #[test]
    fn the_answer_reads_back_as_it_was_written() {
        let p = Proc::new();
        let mut answer = p.nvml("MIG-a");
        answer.gpus[0].persistence_mode = None;
        answer.gpus[1].persistence_mode = None;
        answer.gpus[1].arch = None;
        answer.gpus[1].brand = Some(String::new());
        answer.gpus[0].migs.push(MigInfo {
            index: 6,
            uuid: "MIG-b".into(),
            gpu_instance: 13,
            compute_instance: 2,
            name: String::new(),
        });
        let common = common(&p.host, &p.lib, later()).unwrap().0;
        let fp = Fingerprint::of(&p.host, common, later()).unwrap();
        let written = encode(&fp, &answer).unwrap();
        let cached = Cached::decode(&written).unwrap();
        assert_eq!(cached.answer, answer);
        assert_eq!(cached.common, &fp.common.bytes[..]);
        assert_eq!(cached.gpus, [(0, &fp.gpus[0].1.bytes[..])]);
        // A field the lines could not keep apart: nothing is written.
        answer.gpus[0].name = "NVIDIA\tH200".into();
        assert_eq!(encode(&fp, &answer), None);
    }

    #[test]
    fn not_kept_when_proc_does_not_list_a_mig_device_nvml_reports() {
        let p = Proc::new();
        fs::remove_dir_all(p.nvidia().join("capabilities")).unwrap();
        assert_eq!(p.uuid("MIG-a", "MIG-a", later()), ("MIG-a".into(), true));
        assert_eq!(p.uuid("MIG-b", "MIG-a", later()), ("MIG-b".into(), true));
    }

    #[test]
    fn a_damaged_or_foreign_cache_is_not_used_and_no_cache_dir_asks_every_time() {
        let p = Proc::new();
        p.uuid("MIG-a", "MIG-a", later());
        let file = fs::read_dir(p.tmp.path().join("cache"))
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        let good = fs::read(&file).unwrap();
        for bad in [&good[..good.len() - 1], b"", &good[1..]] {
            fs::write(&file, bad).unwrap();
            assert_eq!(p.uuid("MIG-b", "MIG-a", later()), ("MIG-b".into(), true));
            fs::write(&file, &good).unwrap();
        }
        // What decoding sees: both GPUs' sections (GPU 1 has none), and the answer.
        let cached = Cached::decode(&good).unwrap();
        assert_eq!(cached.gpus.len(), 1);
        assert_eq!(cached.gpus[0].0, 0);
        assert_eq!(cached.answer.gpus.len(), 2);
        // Written for another host: refused.
        let other = Lines {
            bytes: b"F\t/other\t0 0 0 0 0\n".to_vec(),
            trusted: true,
        };
        let cached = Cached::decode(&good).unwrap();
        assert_eq!(cached.answers(&p.host, &other, &[], later()), None);
        // No cache dir: NVML every time.
        let host = Host::new(p.host.roots().clone());
        let asked = Cell::new(0);
        for _ in 0..2 {
            let library = || Ok::<_, ()>(p.lib.clone());
            answer(&host, later(), &[], library, |_| {
                asked.set(asked.get() + 1);
                Ok(p.nvml("MIG-a"))
            })
            .unwrap();
        }
        assert_eq!(asked.get(), 2);
    }
}
