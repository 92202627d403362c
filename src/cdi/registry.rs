//! The spec directories as one registry of devices: scanning, priorities, conflicts, and the
//! resolution of requested names into one [`ContainerEdits`] (docs/cdi-rules.md §4, §5.1).
//!
//! nvshim is one-shot: no watcher survives the process (docs/cdi-rules.md §4.4).
//! [`Registry::load`] scans the directories and parses every spec (`nvshim cdi
//! list|validate`, doctor); a `create` uses [`Registry::load_for`], which parses only the
//! specs that define the requested devices, found through an index that is checked against
//! every spec file's identity on each use ([`super::index`]).
//!
//! One file (580 lines of code, 70 of tests): one type, [`Registry`], built by scanning and queried
//! by resolution, with the checks of loaded specs against the host (`stale_*`,
//! `missing_device_nodes`) that `create`, `explain` and `ops::freshness` run on what it loaded;
//! those checks use only [`ContainerEdits`] and [`Spec`] and could move to their own module.

use std::collections::{BTreeMap, HashSet};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};

use thiserror::Error;

use super::spec::{self, Spec, SpecFileError};
use crate::edits::ContainerEdits;

/// A problem met while scanning: the files concerned are skipped, the rest still serve.
#[derive(Debug, Error)]
pub enum ScanError {
    #[error(transparent)]
    Spec(#[from] SpecFileError),
    #[error("cannot read CDI spec directory {}: {source}; its specs are skipped (the other directories still serve): fix its permissions or remove it", dir.display())]
    Dir {
        dir: PathBuf,
        source: std::io::Error,
    },
    /// A spec file's failure as the CDI index recorded it (`index.rs`): the same text as when
    /// it was read.
    #[error("{message}")]
    Cached { path: PathBuf, message: String },
    #[error("{}: conflicting device {name:?} (specs {:?}, {:?})", path.display(), first.display(), second.display())]
    Conflict {
        path: PathBuf,
        name: String,
        first: PathBuf,
        second: PathBuf,
    },
}

impl ScanError {
    /// The file or directory the problem is about.
    pub fn path(&self) -> &Path {
        match self {
            ScanError::Spec(e) => &e.path,
            ScanError::Dir { dir, .. } => dir,
            ScanError::Cached { path, .. } => path,
            ScanError::Conflict { path, .. } => path,
        }
    }
}

/// Requested devices that no loaded spec provides. Says why for each, so an operator need not
/// guess (docs/field-notes.md §2.6: users otherwise see only "unresolvable CDI devices").
#[derive(Debug, Error)]
#[error("unresolvable CDI devices {}: {why}", missing.join(", "))]
pub struct ResolveError {
    pub missing: Vec<String>,
    pub why: String,
}

/// Where a group of resolved edits comes from ([`Registry::resolve_grouped`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EditsOrigin {
    /// The global `containerEdits` of the spec at `path`, added once, with the first requested
    /// device it provides.
    Spec { path: PathBuf, kind: String },
    /// The requested device `name`'s own `containerEdits`, from the spec at `path`.
    Device { name: String, path: PathBuf },
}

/// A spec that loaded, with where it came from.
#[derive(Debug, Clone)]
pub struct LoadedSpec {
    pub path: PathBuf,
    /// The index of its directory: later directories win.
    pub priority: usize,
    pub spec: Spec,
}

/// Every device of every valid spec in the spec directories.
#[derive(Debug, Default)]
pub struct Registry {
    dirs: Vec<PathBuf>,
    specs: Vec<LoadedSpec>,
    /// Qualified name → (spec index, device index).
    devices: BTreeMap<String, (usize, usize)>,
    /// Names dropped because two specs of equal priority define them.
    conflicts: BTreeMap<String, Vec<PathBuf>>,
    errors: Vec<ScanError>,
}

/// `filepath.Clean` for the directory names (lexical; `..` at the root stays at the root).
pub fn clean(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    out
}

pub fn is_spec_file(name: &str) -> bool {
    // `filepath.Ext` is exactly `.json` or `.yaml`: not `.yml`, not `.JSON`.
    name.ends_with(".json") || name.ends_with(".yaml")
}

impl Registry {
    /// Scans `dirs` in order (priority = position; later wins). A missing directory is skipped;
    /// one that cannot be read is recorded, warned about and skipped, and the scan goes on, as
    /// CDI 1.1.0's directory walk goes on (silently there). The reference's main branch after
    /// 1.1.0 stops the whole scan instead, which lets a broken `/etc/cdi` hide every spec in
    /// `/var/run/cdi`; nvshim keeps the 1.1.0 behaviour.
    pub fn load(dirs: &[PathBuf]) -> Registry {
        let mut reg = Registry {
            dirs: dirs.iter().map(|d| clean(d)).collect(),
            ..Default::default()
        };
        let dirs = reg.dirs.clone();
        'dirs: for (priority, dir) in dirs.iter().enumerate() {
            let entries = match std::fs::read_dir(dir) {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(source) => {
                    reg.dir_error(dir, source);
                    continue;
                }
            };
            let mut files: Vec<(String, bool)> = Vec::new();
            for entry in entries {
                let entry = match entry {
                    Ok(e) => e,
                    Err(source) => {
                        reg.dir_error(dir, source);
                        continue 'dirs;
                    }
                };
                let name = entry.file_name().to_string_lossy().into_owned();
                // The entry's own type: a symlink to a directory is not skipped here and fails
                // to read below, as in the reference.
                let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
                files.push((name, is_dir));
            }
            // os.ReadDir sorts by name.
            files.sort();
            for (name, is_dir) in files {
                if is_dir || !is_spec_file(&name) {
                    continue;
                }
                let path = dir.join(&name);
                match spec::read_file(&path) {
                    Ok(spec) => reg.add(LoadedSpec {
                        path,
                        priority,
                        spec,
                    }),
                    Err(e) => reg.errors.push(ScanError::Spec(e)),
                }
            }
        }
        reg.drop_conflicts();
        reg
    }

    /// [`Registry::load`] for resolving `names` only, through the index of the spec
    /// directories kept in `cache_dir` ([`super::index`]): the same answer, with only the spec
    /// files that define those names read. A spec taken from its cached parsed form
    /// (`spec_cache.rs`) holds the edits and annotations of the devices in `names`
    /// only, the others by name: for [`Registry::resolve`] of those names, not for listing.
    pub fn load_for(dirs: &[PathBuf], names: &[String], cache_dir: &Path) -> Registry {
        super::index::load_for(dirs, names, cache_dir)
    }

    /// The registry of files already read, as [`Registry::load`] would build it from them:
    /// `files` in scan order (directory, then name), each its spec or its failure's text. For
    /// a process that keeps the files and reads again only those that changed (nvshim-nri).
    pub fn from_read(
        dirs: &[PathBuf],
        files: impl IntoIterator<Item = (PathBuf, usize, Result<Spec, String>)>,
    ) -> Registry {
        let mut reg = Registry::empty(&dirs.iter().map(|d| clean(d)).collect::<Vec<_>>());
        for (path, priority, read) in files {
            match read {
                Ok(spec) => reg.add(LoadedSpec {
                    path,
                    priority,
                    spec,
                }),
                Err(message) => reg.push_error(ScanError::Cached { path, message }),
            }
        }
        reg.drop_conflicts();
        reg
    }

    /// No specs yet, for `dirs` (already cleaned).
    pub(super) fn empty(dirs: &[PathBuf]) -> Registry {
        Registry {
            dirs: dirs.to_vec(),
            ..Default::default()
        }
    }

    pub(super) fn push_error(&mut self, e: ScanError) {
        self.errors.push(e);
    }

    /// A name defined twice at one priority is dropped, even where a higher-priority spec also
    /// defines it (cache.go `refresh`, docs/cdi-rules.md §4.3).
    pub(super) fn drop_conflicts(&mut self) {
        for name in self.conflicts.keys() {
            self.devices.remove(name);
        }
    }

    fn dir_error(&mut self, dir: &Path, source: std::io::Error) {
        let e = ScanError::Dir {
            dir: dir.to_path_buf(),
            source,
        };
        tracing::warn!("{e}");
        self.errors.push(e);
    }

    /// Adds one loaded spec's devices, resolving conflicts against those already there.
    pub(super) fn add(&mut self, loaded: LoadedSpec) {
        let index = self.specs.len();
        for (d, device) in loaded.spec.devices.iter().enumerate() {
            let qualified = format!("{}={}", loaded.spec.kind, device.name);
            match self.devices.get(&qualified).copied() {
                None => {
                    self.devices.insert(qualified, (index, d));
                }
                Some((held, _)) => {
                    let old = &self.specs[held];
                    if loaded.priority > old.priority {
                        self.devices.insert(qualified, (index, d));
                    } else if loaded.priority == old.priority {
                        let (first, second) = (old.path.clone(), loaded.path.clone());
                        for path in [&first, &second] {
                            self.errors.push(ScanError::Conflict {
                                path: path.clone(),
                                name: qualified.clone(),
                                first: first.clone(),
                                second: second.clone(),
                            });
                        }
                        let files = self.conflicts.entry(qualified).or_default();
                        for p in [first, second] {
                            if !files.contains(&p) {
                                files.push(p);
                            }
                        }
                    }
                }
            }
        }
        self.specs.push(loaded);
    }

    /// The directories scanned, cleaned.
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// Specs that loaded, in scan order.
    pub fn specs(&self) -> &[LoadedSpec] {
        &self.specs
    }

    /// What went wrong while scanning.
    pub fn errors(&self) -> &[ScanError] {
        &self.errors
    }

    /// Every resolvable qualified name with the spec that provides it, sorted by name.
    pub fn devices(&self) -> impl Iterator<Item = (&str, &LoadedSpec)> {
        self.devices
            .iter()
            .map(|(name, (s, _))| (name.as_str(), &self.specs[*s]))
    }

    /// The spec and device a qualified name resolves to (exact, case-sensitive match).
    pub fn device(&self, qualified: &str) -> Option<(&LoadedSpec, &spec::Device)> {
        self.devices
            .get(qualified)
            .map(|(s, d)| (&self.specs[*s], &self.specs[*s].spec.devices[*d]))
    }

    /// The edits for `names`, accumulated as the reference's `InjectDevices` does
    /// (docs/cdi-rules.md §5.1): for each name in order, its spec's global edits the first time
    /// that spec is seen, then the device's own. Fails naming every name that does not
    /// resolve, before anything is built.
    pub fn resolve(&self, names: &[String]) -> Result<ContainerEdits, ResolveError> {
        let mut edits = ContainerEdits::default();
        for (_, group) in self.resolve_grouped(names)? {
            edits.append(&group);
        }
        Ok(edits)
    }

    /// [`Registry::resolve`], one group per source of edits, in the order they apply (what
    /// `nvshim explain` shows): a spec's global edits (left out when empty) before the first
    /// device it provides, then each device's own.
    pub fn resolve_grouped(
        &self,
        names: &[String],
    ) -> Result<Vec<(EditsOrigin, ContainerEdits)>, ResolveError> {
        let order = self.group_order(names)?;
        Ok(order
            .into_iter()
            .map(|(origin, (s, d))| {
                let spec = &self.specs[s].spec;
                let edits = d.map_or(&spec.container_edits, |d| &spec.devices[d].container_edits);
                (origin, normalized(edits.clone()))
            })
            .collect())
    }

    /// [`Registry::resolve_grouped`], taking the edits out of the registry instead of copying
    /// them: what a `create` does, which needs nothing else of it. Copying a node spec's 65
    /// global mounts and then dropping both copies was a tenth of a CDI create (callgrind).
    pub fn into_grouped(
        mut self,
        names: &[String],
    ) -> Result<Vec<(EditsOrigin, ContainerEdits)>, ResolveError> {
        let order = self.group_order(names)?;
        let mut groups = Vec::with_capacity(order.len());
        for (i, (origin, at)) in order.iter().enumerate() {
            let (s, d) = *at;
            let spec = &mut self.specs[s].spec;
            let edits = match d {
                Some(d) => &mut spec.devices[d].container_edits,
                None => &mut spec.container_edits,
            };
            // A device named twice applies twice: only its last use takes the edits.
            let edits = if order[i + 1..].iter().any(|(_, later)| later == at) {
                edits.clone()
            } else {
                std::mem::take(edits)
            };
            groups.push((origin.clone(), normalized(edits)));
        }
        Ok(groups)
    }

    /// The groups of [`Registry::resolve_grouped`], each as where its edits are: (spec,
    /// `None` for its global edits or `Some(device)`). Fails naming every name that does not
    /// resolve.
    #[allow(clippy::type_complexity)]
    fn group_order(
        &self,
        names: &[String],
    ) -> Result<Vec<(EditsOrigin, (usize, Option<usize>))>, ResolveError> {
        let missing: Vec<String> = names
            .iter()
            .filter(|n| !self.devices.contains_key(*n))
            .cloned()
            .collect();
        if !missing.is_empty() {
            let why = self.explain(&missing);
            return Err(ResolveError { missing, why });
        }
        let mut order = Vec::new();
        let mut seen: HashSet<usize> = HashSet::new();
        for name in names {
            let Some(&(s, d)) = self.devices.get(name) else {
                continue;
            };
            let loaded = &self.specs[s];
            if seen.insert(s) && !loaded.spec.container_edits.is_empty() {
                let origin = EditsOrigin::Spec {
                    path: loaded.path.clone(),
                    kind: loaded.spec.kind.clone(),
                };
                order.push((origin, (s, None)));
            }
            let origin = EditsOrigin::Device {
                name: name.clone(),
                path: loaded.path.clone(),
            };
            order.push((origin, (s, Some(d))));
        }
        Ok(order)
    }

    fn explain(&self, missing: &[String]) -> String {
        let dirs: Vec<String> = self
            .dirs
            .iter()
            .map(|d| {
                if d.exists() {
                    d.display().to_string()
                } else {
                    format!("{} (missing)", d.display())
                }
            })
            .collect();
        let target = self
            .dirs
            .last()
            .map_or_else(|| PathBuf::from("/var/run/cdi"), Clone::clone)
            .join("nvidia.yaml");
        let generate = format!("nvshim cdi generate --output {}", target.display());
        let mut reasons: Vec<String> = Vec::new();
        let mut next: Vec<String> = Vec::new();
        let mut add_next = |n: String| {
            if !next.contains(&n) {
                next.push(n);
            }
        };
        for name in missing {
            if let Some(files) = self.conflicts.get(name) {
                let files: Vec<String> = files.iter().map(|p| p.display().to_string()).collect();
                reasons.push(format!(
                    "{name} is defined by more than one spec in the same directory ({}), so by none",
                    files.join(", ")
                ));
                add_next("remove all but one of those specs".into());
                continue;
            }
            let kind = name.split_once('=').map_or(name.as_str(), |(k, _)| k);
            let specs: Vec<&LoadedSpec> =
                self.specs.iter().filter(|s| s.spec.kind == kind).collect();
            if specs.is_empty() {
                reasons.push(format!("no valid spec defines kind {kind:?}"));
                add_next(format!("generate one with `{generate}`"));
            } else {
                let mut have: Vec<&str> = specs
                    .iter()
                    .flat_map(|s| s.spec.devices.iter().map(|d| d.name.as_str()))
                    .collect();
                have.sort_unstable();
                have.dedup();
                let shown: Vec<&str> = have.iter().take(12).copied().collect();
                let more = if have.len() > shown.len() {
                    ", ..."
                } else {
                    ""
                };
                let files: Vec<String> =
                    specs.iter().map(|s| s.path.display().to_string()).collect();
                reasons.push(format!(
                    "{} (kind {kind:?}) has no device {:?}; it has {}{more}",
                    files.join(", "),
                    name.split_once('=').map_or("", |(_, n)| n),
                    shown.join(", ")
                ));
                add_next(format!(
                    "ask for one of those (`nvshim cdi list` shows them all), or run `{generate}` if the GPUs changed"
                ));
            }
        }
        let failed: Vec<String> = self
            .errors
            .iter()
            .filter(|e| {
                matches!(
                    e,
                    ScanError::Spec(_) | ScanError::Dir { .. } | ScanError::Cached { .. }
                )
            })
            .map(|e| e.to_string())
            .collect();
        if !failed.is_empty() {
            reasons.push(format!(
                "{} spec file(s) or directories failed to load: {}",
                failed.len(),
                failed.join("; ")
            ));
            add_next("fix or remove the specs that failed to load".into());
        }
        // The directories searched and what to do next close the sentence: the operator should
        // not have to guess where nvshim looked (docs/field-notes.md §2.6).
        format!(
            "{}; spec dirs searched: {}; {}",
            reasons.join("; "),
            dirs.join(", "),
            next.join(", or ")
        )
    }
}

/// Go leaves an empty string where YAML has `hostPath: ""`, and the reference treats "" as
/// unset (`fillMissingInfo`: an empty hostPath is the path; an empty mount type is omitted from
/// the OCI mount). The serde model keeps `Some("")`; make it `None` before applying.
fn normalized(mut edits: ContainerEdits) -> ContainerEdits {
    normalize_empty(&mut edits);
    edits
}

fn normalize_empty(edits: &mut ContainerEdits) {
    let empty = |o: &mut Option<String>| {
        if o.as_deref() == Some("") {
            *o = None;
        }
    };
    for d in &mut edits.device_nodes {
        empty(&mut d.host_path);
        empty(&mut d.kind);
        empty(&mut d.permissions);
    }
    for m in &mut edits.mounts {
        empty(&mut m.kind);
    }
}

/// Device nodes whose declared major:minor differs from the host node they name: the mark of
/// a spec generated before a driver reload or reboot moved a dynamic major (nvidia-uvm), which
/// otherwise gives a container where `nvidia-smi` works and `cuInit` fails (docs/field-notes.md
/// §2.6). One `lstat` per node; a missing node is left to [`crate::edits::apply`] to report.
pub fn stale_device_nodes(edits: &ContainerEdits) -> Vec<String> {
    edits
        .device_nodes
        .iter()
        .filter_map(|d| host_node(d)?.0)
        .collect()
}

/// [`stale_device_nodes`] for `create`, which then applies the edits: a node the spec gives
/// its numbers gets the type and mode it leaves out from the host node `lstat`ed here, as
/// [`crate::edits::apply`] would fill them from its own `lstat` of the same node (CDI
/// `fillMissingInfo`: an empty type is the host's, a missing mode the host's, the numbers the
/// spec's), so each node is `lstat`ed once, not twice. `nvshim cdi generate` writes nodes so.
pub fn stale_device_nodes_filling(edits: &mut ContainerEdits) -> Vec<String> {
    let mut out = Vec::new();
    for d in &mut edits.device_nodes {
        let Some((stale, kind, mode)) = host_node(d) else {
            continue;
        };
        let declared = d.kind.as_deref().unwrap_or("");
        // A declared type other than the host's is left to `apply`, as before.
        if declared.is_empty() || declared == kind {
            d.kind = Some(kind.into());
            d.file_mode.get_or_insert(mode);
        }
        out.extend(stale);
    }
    out
}

/// For a node with its numbers (major not 0) whose host node is a character or block
/// device: what is stale about it, if anything, the host node's type (`c` or `b`) and its
/// mode (permission bits). One `lstat`.
fn host_node(d: &crate::edits::DeviceNode) -> Option<(Option<String>, &'static str, u32)> {
    let (major, minor) = (d.major?, d.minor?);
    if major == 0 {
        return None;
    }
    let host = d.host_path.as_deref().unwrap_or(&d.path);
    let meta = std::fs::symlink_metadata(host).ok()?;
    let ft = meta.file_type();
    if !(ft.is_char_device() || ft.is_block_device()) {
        return None;
    }
    let rdev = meta.rdev();
    let (hmaj, hmin) = (
        nix::sys::stat::major(rdev) as i64,
        nix::sys::stat::minor(rdev) as i64,
    );
    let stale = ((hmaj, hmin) != (major, minor)).then(|| {
        format!(
            "{} is {major}:{minor} in the spec but {hmaj}:{hmin} on the host ({host}); regenerate the spec",
            d.path
        )
    });
    let kind = if ft.is_char_device() { "c" } else { "b" };
    Some((stale, kind, meta.mode() & 0o7777))
}

/// Device nodes a spec names that do not exist on the host: a GPU removed or not yet probed,
/// or a node the driver has not created since boot (`create` fails on them when the spec
/// leaves the numbers to a `stat`).
pub fn missing_device_nodes(edits: &ContainerEdits) -> Vec<String> {
    edits
        .device_nodes
        .iter()
        .filter_map(|d| {
            let host = d
                .host_path
                .as_deref()
                .filter(|h| !h.is_empty())
                .unwrap_or(&d.path);
            std::fs::symlink_metadata(host)
                .is_err()
                .then(|| format!("{} ({host}) does not exist on the host", d.path))
        })
        .collect()
}

/// The driver version a library file name carries, when it looks like one: `libcuda.so.580.65.06`
/// → `580.65.06`. Driver branches are three-digit numbers, which keeps out libraries shipped
/// with the driver under their own versions (`libnvidia-egl-wayland.so.1.1.13`).
fn library_driver_version(path: &str) -> Option<&str> {
    let file = path.rsplit('/').next()?;
    let (_, version) = file.split_once(".so.")?;
    let parts: Vec<&str> = version.split('.').collect();
    let numeric = parts
        .iter()
        .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    let branch: u32 = parts.first()?.parse().ok()?;
    (numeric && (2..=3).contains(&parts.len()) && branch >= 100).then_some(version)
}

/// Mounts that give a spec away as generated for another driver: a host file that no longer
/// exists, or (with `driver_version`, the running driver's) a library of another driver
/// version. After a driver upgrade these are what users meet as "open failed:
/// libnvidia-tls.so.575.64.05" (docs/field-notes.md §2.6).
pub fn stale_library_mounts(edits: &ContainerEdits, driver_version: Option<&str>) -> Vec<String> {
    let mut out = Vec::new();
    for m in &edits.mounts {
        let version = library_driver_version(&m.host_path);
        if let (Some(have), Some(running)) = (version, driver_version) {
            if have != running {
                out.push(format!(
                    "mounts {} of driver {have}, but driver {running} is running",
                    m.host_path
                ));
                continue;
            }
        }
        let is_bind = m.kind.as_deref() == Some("bind")
            || m.options.iter().any(|o| o == "bind" || o == "rbind");
        if is_bind && std::fs::symlink_metadata(&m.host_path).is_err() {
            out.push(format!(
                "mounts {}, which does not exist on the host",
                m.host_path
            ));
        }
    }
    out
}

/// Everything that makes a loaded spec stale on this host, each finding once: device numbers
/// that moved, device nodes that vanished, library mounts of another driver or missing.
pub fn stale_spec(spec: &Spec, driver_version: Option<&str>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let all = std::iter::once(&spec.container_edits)
        .chain(spec.devices.iter().map(|d| &d.container_edits));
    for edits in all {
        let found = stale_device_nodes(edits)
            .into_iter()
            .chain(missing_device_nodes(edits))
            .chain(stale_library_mounts(edits, driver_version));
        for f in found {
            if !out.contains(&f) {
                out.push(f);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::edits::DeviceNode;

    /// Filling a node from the staleness check's `lstat` gives the document `apply` gives from
    /// its own: every combination of a declared type and mode, on a real node (`/dev/null`,
    /// c 1:3), with the numbers right and stale.
    #[test]
    fn filling_from_the_staleness_check_gives_what_apply_fills() {
        for (major, minor) in [(1, 3), (1, 5)] {
            for kind in [None, Some(""), Some("c"), Some("b"), Some("u"), Some("p")] {
                for file_mode in [None, Some(0o600)] {
                    let node = DeviceNode {
                        path: "/dev/null".into(),
                        kind: kind.map(str::to_string),
                        major: Some(major),
                        minor: Some(minor),
                        file_mode,
                        ..Default::default()
                    };
                    let plain = ContainerEdits {
                        device_nodes: vec![node],
                        ..Default::default()
                    };
                    let mut filled = plain.clone();
                    let stale = stale_device_nodes_filling(&mut filled);
                    assert_eq!(stale, stale_device_nodes(&plain));
                    assert_eq!(stale.is_empty(), minor == 3);
                    let (mut a, mut b) = (serde_json::json!({}), serde_json::json!({}));
                    let (ra, rb) = (
                        crate::edits::apply(&mut a, &plain),
                        crate::edits::apply(&mut b, &filled),
                    );
                    let case = format!("{kind:?} {file_mode:?} {major}:{minor}");
                    assert_eq!(ra.is_ok(), rb.is_ok(), "{case}");
                    assert_eq!(a, b, "{case}");
                }
            }
        }
    }

    #[test]
    fn into_grouped_gives_what_resolve_grouped_gives() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(
            tmp.path().join("a.yaml"),
            "cdiVersion: 0.5.0\nkind: v.com/g\ncontainerEdits:\n  env: [\"G=1\"]\ndevices:\n\
             - name: a\n  containerEdits:\n    env: [\"A=1\"]\n\
             - name: b\n  containerEdits:\n    env: [\"B=1\"]\n",
        )
        .unwrap();
        let load = || Registry::load(&[tmp.path().to_path_buf()]);
        let reg = load();
        assert!(reg.errors().is_empty(), "{:?}", reg.errors());
        for names in [&["v.com/g=a"][..], &["v.com/g=b", "v.com/g=a", "v.com/g=b"]] {
            let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
            let expected = reg.resolve_grouped(&names).unwrap();
            assert_eq!(expected.len(), names.len() + 1);
            assert_eq!(load().into_grouped(&names).unwrap(), expected);
        }
        let missing = vec!["v.com/g=c".to_string()];
        assert_eq!(
            load().into_grouped(&missing).unwrap_err().to_string(),
            reg.resolve_grouped(&missing).unwrap_err().to_string()
        );
    }

    #[test]
    fn stale_major_minor_is_reported() {
        let node = |major, minor| DeviceNode {
            path: "/dev/null".into(),
            major: Some(major),
            minor: Some(minor),
            ..Default::default()
        };
        let edits = ContainerEdits {
            device_nodes: vec![node(1, 3), node(1, 4)],
            ..Default::default()
        };
        let stale = stale_device_nodes(&edits);
        assert_eq!(stale.len(), 1, "{stale:?}");
        assert!(
            stale[0].contains("1:4 in the spec but 1:3 on the host"),
            "{stale:?}"
        );
    }

    #[test]
    fn library_versions_and_missing_files() {
        assert_eq!(
            library_driver_version("/usr/lib/libcuda.so.580.65.06"),
            Some("580.65.06")
        );
        assert_eq!(
            library_driver_version("/usr/lib/libnvidia-egl-wayland.so.1.1.13"),
            None
        );
        assert_eq!(library_driver_version("/usr/lib/libcuda.so.1"), None);
        let mount = |p: &str| crate::edits::Mount {
            host_path: p.into(),
            container_path: p.into(),
            kind: None,
            options: vec!["ro".into(), "rbind".into()],
        };
        let edits = ContainerEdits {
            mounts: vec![
                mount("/nonexistent/libcuda.so.575.64.05"),
                mount("/nonexistent/libnvidia-ml.so.580.65.06"),
                mount("/dev/null"),
            ],
            ..Default::default()
        };
        let stale = stale_library_mounts(&edits, Some("580.65.06"));
        assert_eq!(stale.len(), 2, "{stale:?}");
        assert!(
            stale[0].contains("of driver 575.64.05, but driver 580.65.06"),
            "{stale:?}"
        );
        assert!(stale[1].contains("which does not exist"), "{stale:?}");
        let missing = missing_device_nodes(&ContainerEdits {
            device_nodes: vec![DeviceNode {
                path: "/dev/nvidia-nope".into(),
                ..Default::default()
            }],
            ..Default::default()
        });
        assert_eq!(missing.len(), 1);
    }
}
