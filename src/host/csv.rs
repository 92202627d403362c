//! What a Jetson's CSV file lists give GPU containers, read as NVIDIA's CSV mode reads them
//! (`internal/platform-support/tegra/csv/{csv,mount_spec}.go`, `tegra/{csv,tegra,symlinks}.go`,
//! `pkg/nvcdi/lib-csv.go`, `internal/discover/symlinks.go`).
//!
//! Each line is `<type>, <path>`; `dev` a character device, `dir` a directory, `lib` a file
//! (symlinks resolved: the final file is mounted at its own path), `sym` a symlink (its final
//! file mounted, and every hop of its chain recreated by the hook). Other lines are skipped;
//! the last path component may be a glob. Only `devices.csv`, `drivers.csv` and `l4t.csv` are
//! read unless the container sets `NVIDIA_REQUIRE_JETPACK=csv-mounts=all`
//! (`internal/modifier/cdi.go`). A path that is not there is skipped, as NVIDIA skips it.

use std::fs;
use std::path::{Path, PathBuf};

use super::platform::{container_path, glob_in, host_file, soname, PlatformError};
use super::{under_root, Host, HostDeviceNode, HostFile};

/// The files read without `csv-mounts=all` (`csv.BaseFilesOnly`).
pub const BASE_FILES: &[&str] = &["devices.csv", "drivers.csv", "l4t.csv"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dev,
    Dir,
    Lib,
    Sym,
}

/// One line of a CSV file list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub kind: Kind,
    pub path: String,
}

/// A line as `NewMountSpecFromLine` reads it; `None` for a line it skips.
pub fn parse_line(line: &str) -> Option<Entry> {
    let (kind, path) = line.trim().split_once(',')?;
    let kind = match kind.trim() {
        "dev" => Kind::Dev,
        "dir" => Kind::Dir,
        "lib" => Kind::Lib,
        "sym" => Kind::Sym,
        _ => return None,
    };
    let path = path.trim();
    (!path.is_empty()).then(|| Entry {
        kind,
        path: path.to_string(),
    })
}

/// The CSV files of `dir` (`csv.GetFileList`): `*.csv`, not `.csv`, not directories, sorted;
/// only [`BASE_FILES`] unless `all`.
pub fn list_files(dir: &Path, all: bool) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_type().is_ok_and(|t| !t.is_dir()))
                .map(|e| e.path())
                .filter(|p| {
                    let name = p.file_name().unwrap_or_default().to_string_lossy();
                    let csv = name != ".csv" && name.to_ascii_lowercase().ends_with(".csv");
                    csv && (all || BASE_FILES.contains(&name.as_ref()))
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// The Jetson driver as the CSV files list it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CsvDriver {
    pub files: Vec<PathBuf>,
    /// `dev` entries found under the dev root.
    pub devices: Vec<HostDeviceNode>,
    /// Directories, files (`lib` and the final files of `sym` chains) and
    /// `/etc/nv_tegra_release`, each at its own path.
    pub mounts: Vec<HostFile>,
    /// The mounted libraries (`lib*.so*`) with their SONAME: their folders go into the
    /// container's ld.so.cache.
    pub libs: Vec<(HostFile, String)>,
    /// Links the hook makes, (target, link): each hop of the `sym` chains as the host has it,
    /// and the `.so` links NVIDIA adds for libraries (`WithDriverDotSoSymlinks`).
    pub links: Vec<(String, String)>,
}

/// Reads the CSV files of `dir` and finds what they list on `host`.
pub fn discover(host: &Host, dir: &Path, all: bool) -> Result<CsvDriver, PlatformError> {
    let files = list_files(dir, all);
    if files.is_empty() {
        return Err(PlatformError::NoCsvFiles {
            dir: dir.to_path_buf(),
            which: if all {
                "*.csv"
            } else {
                "devices.csv, drivers.csv, l4t.csv"
            },
        });
    }
    for p in std::iter::once(dir).chain(files.iter().map(PathBuf::as_path)) {
        trusted(p)?;
    }
    let mut entries = Vec::new();
    for f in &files {
        let text = crate::hostfile::read_to_string(f, crate::hostfile::CONFIG_LIMIT).map_err(
            |source| PlatformError::CsvRead {
                path: f.clone(),
                source,
            },
        )?;
        entries.extend(text.lines().filter_map(parse_line));
    }
    let root = &host.roots().driver_root;
    let mut out = CsvDriver {
        files,
        ..Default::default()
    };
    // By type, in NVIDIA's order (`newDiscovererFromMountSpecs`): devices, directories,
    // libraries, symlinks.
    for kind in [Kind::Dev, Kind::Dir, Kind::Lib, Kind::Sym] {
        for e in entries.iter().filter(|e| e.kind == kind) {
            match kind {
                Kind::Dev => add_devices(host, &e.path, &mut out),
                Kind::Dir => {
                    for p in expand(root, &e.path).into_iter().filter(|p| p.is_dir()) {
                        add_mount(&mut out, host_file(root, p));
                    }
                }
                Kind::Lib => {
                    for p in expand(root, &e.path) {
                        add_file(host, &p, &mut out);
                    }
                }
                Kind::Sym => {
                    for p in expand(root, &e.path) {
                        add_chain(host, &p, &mut out);
                    }
                }
            }
        }
    }
    add_mount(
        &mut out,
        host_file(root, under_root(root, "/etc/nv_tegra_release"))
            .filter(|f| f.host_path.is_file()),
    );
    Ok(out)
}

/// A CSV list or its directory is trusted when root (or the user running nvshim) owns it and
/// no one else can write it: its lines become mounts and device nodes of every GPU container.
fn trusted(path: &Path) -> Result<(), PlatformError> {
    use std::os::unix::fs::MetadataExt;
    let meta = fs::metadata(path).map_err(|source| PlatformError::CsvRead {
        path: path.to_path_buf(),
        source,
    })?;
    let euid = nix::unistd::geteuid().as_raw();
    if (meta.uid() == 0 || meta.uid() == euid) && meta.mode() & 0o022 == 0 {
        return Ok(());
    }
    Err(PlatformError::UntrustedCsv {
        path: path.to_path_buf(),
        uid: meta.uid(),
        mode: meta.mode() & 0o7777,
    })
}

/// `path` under `root`, its last component expanded as a glob.
fn expand(root: &Path, path: &str) -> Vec<PathBuf> {
    let abs = under_root(root, path);
    match (abs.parent(), abs.file_name()) {
        (Some(dir), Some(name)) => glob_in(dir, &name.to_string_lossy()),
        _ => Vec::new(),
    }
}

fn add_devices(host: &Host, path: &str, out: &mut CsvDriver) {
    // NVIDIA's older lists name nodes without `/dev/` (`nvhost-ctrl`).
    let name = path
        .strip_prefix("/dev/")
        .unwrap_or(path.trim_start_matches('/'));
    let dev = host.roots().dev_root.join("dev");
    let (dir, pattern) = match name.rsplit_once('/') {
        Some((d, p)) => (dev.join(d), p),
        None => (dev.clone(), name),
    };
    for p in glob_in(&dir, pattern) {
        let Ok(rel) = p.strip_prefix(&dev) else {
            continue;
        };
        if let Some(n) = host.device_node(&rel.to_string_lossy()) {
            if n.kind == 'c'
                && !out
                    .devices
                    .iter()
                    .any(|d| d.container_path == n.container_path)
            {
                out.devices.push(n);
            }
        }
    }
}

fn add_mount(out: &mut CsvDriver, f: Option<HostFile>) {
    if let Some(f) = f {
        if !out
            .mounts
            .iter()
            .any(|m| m.container_path == f.container_path)
        {
            out.mounts.push(f);
        }
    }
}

/// A `lib` entry (or a `sym` chain's end): the final file, every link on the way followed
/// inside the driver root, mounted at its path. Whether there was one.
fn add_file(host: &Host, p: &Path, out: &mut CsvDriver) -> bool {
    let root = &host.roots().driver_root;
    let Some(real) = container_path(root, p).and_then(|c| host.resolve_in_driver_root(&c)) else {
        return false;
    };
    let f = HostFile {
        host_path: under_root(root, &real),
        container_path: real,
    };
    let name = f
        .container_path
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_string();
    if name.starts_with("lib") && name.contains(".so") {
        dot_so_links(&f, &name, out);
        if !out
            .libs
            .iter()
            .any(|(l, _)| l.container_path == f.container_path)
        {
            let so = soname(&f.host_path).unwrap_or_else(|| name.clone());
            out.libs.push((f.clone(), so));
        }
    }
    add_mount(out, Some(f));
    true
}

/// `internal/discover/symlinks.go`: `libcuda.so -> libcuda.so.1` beside `libcuda.so.*.*`, and
/// the `.so` link to the SONAME where the host has one.
fn dot_so_links(f: &HostFile, name: &str, out: &mut CsvDriver) {
    let dir = f.container_path.rsplit_once('/').map_or("", |(d, _)| d);
    let mut add = |target: String, link: String| {
        if !out.links.iter().any(|(_, l)| *l == link) {
            out.links.push((target, link));
        }
    };
    let two_dots = |stem: &str| {
        name.strip_prefix(stem)
            .and_then(|r| r.strip_prefix('.'))
            .is_some_and(|r| r.contains('.'))
    };
    if two_dots("libcuda.so") {
        add("libcuda.so.1".into(), format!("{dir}/libcuda.so"));
    }
    let Some(so) = soname(&f.host_path) else {
        return;
    };
    let host_dir = f.host_path.parent().unwrap_or(Path::new("/"));
    let is_link = |n: &str| fs::symlink_metadata(host_dir.join(n)).is_ok_and(|m| m.is_symlink());
    if let Some((stem, _)) = so.split_once(".so") {
        let dev = format!("{stem}.so");
        if dev != so && is_link(&dev) {
            add(so.clone(), format!("{dir}/{dev}"));
        }
    }
}

/// A `sym` entry: every hop of its chain recreated, its final file mounted. A chain that ends
/// in a directory or nowhere is skipped whole (NVIDIA's locator takes files only).
fn add_chain(host: &Host, start: &Path, out: &mut CsvDriver) {
    let root = &host.roots().driver_root;
    let mut hops = Vec::new();
    let mut at = start.to_path_buf();
    while let Ok(target) = fs::read_link(&at) {
        if hops.len() > 40 {
            return;
        }
        let Some(link) = container_path(root, &at) else {
            return;
        };
        let link = super::clean(Path::new(&link))
            .to_string_lossy()
            .into_owned();
        let target_s = target.to_string_lossy().into_owned();
        hops.push((target_s, link));
        at = if target.is_absolute() {
            under_root(root, &target.to_string_lossy())
        } else {
            at.parent().unwrap_or(root).join(target)
        };
    }
    // A chain that ends in a directory or nowhere is skipped whole.
    if !add_file(host, start, out) {
        return;
    }
    for (target, link) in hops {
        if !out.links.iter().any(|(_, l)| *l == link) {
            out.links.push((target, link));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The parser's cases of NVIDIA's `tests/input/csv_samples` (`spaced.csv`,
    /// `simple_wrong.csv`): spaces around both fields, unknown types and empty paths skipped.
    #[test]
    fn lines_parse_as_nvidia_parses_them() {
        let e = |kind, path: &str| {
            Some(Entry {
                kind,
                path: path.into(),
            })
        };
        assert_eq!(
            parse_line("dev, /dev/nvhost-ctrl"),
            e(Kind::Dev, "/dev/nvhost-ctrl")
        );
        assert_eq!(
            parse_line("  lib ,  /usr/lib/x.so  "),
            e(Kind::Lib, "/usr/lib/x.so")
        );
        assert_eq!(parse_line("sym,/a/b"), e(Kind::Sym, "/a/b"));
        assert_eq!(
            parse_line("dir, /usr/local/cuda"),
            e(Kind::Dir, "/usr/local/cuda")
        );
        assert_eq!(parse_line("dev, /a, b"), e(Kind::Dev, "/a, b"));
        for skipped in [
            "",
            "lib",
            "lib,",
            "lib, ",
            "file, /x",
            "# dev, /x",
            "DEV, /x",
        ] {
            assert_eq!(parse_line(skipped), None, "{skipped:?}");
        }
    }

    /// `GetFileList` and `BaseFilesOnly`: `*.csv` (any case) but `.csv`, no directories; the
    /// base three unless `all`.
    #[test]
    fn file_list_takes_base_files_unless_all() {
        let dir = tempfile::tempdir().unwrap();
        for f in [
            "devices.csv",
            "drivers.csv",
            "l4t.csv",
            "cudnn.CSV",
            ".csv",
            "x.txt",
        ] {
            fs::write(dir.path().join(f), "dev, /dev/x\n").unwrap();
        }
        fs::create_dir(dir.path().join("sub.csv")).unwrap();
        let names = |all| -> Vec<String> {
            list_files(dir.path(), all)
                .iter()
                .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
                .collect()
        };
        assert_eq!(names(false), ["devices.csv", "drivers.csv", "l4t.csv"]);
        assert_eq!(
            names(true),
            ["cudnn.CSV", "devices.csv", "drivers.csv", "l4t.csv"]
        );
    }
}
