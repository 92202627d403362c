//! The `enable-cuda-compat` hook: `--host-driver-version V [--host-cuda-version X.Y]
//! [--cuda-compat-container-root DIR]`, NVIDIA's `nvidia-cdi-hook enable-cuda-compat`
//! (`cmd/nvidia-cdi-hook/cudacompat/`).
//!
//! An image built with CUDA forward compatibility ships a newer user-space driver,
//! `<compat dir>/libcuda.so.<version>` (default dir `/usr/local/cuda/compat`). When the host's
//! driver is older and that library supports the host's driver branch, the hook names the compat
//! directory in `/etc/ld.so.conf.d/00-compat-nvshim.conf`, which sorts before the driver
//! folders' `00-nvshim.conf`, so the later `update-ldcache` hook indexes the compat `libcuda`
//! first. It mounts nothing and runs nothing from the image: the CVE-2024-0132 and
//! CVE-2025-23359 bugs came from mounting compat libraries from the container, which NVIDIA
//! replaced with this ld.so.conf.d file in 1.17.5.
//!
//! The decision is NVIDIA's (v1.19.1, `cuda-elf-header.go` `UseCompat`):
//! - no host version given: nothing happens (the root is not even opened);
//! - the compat directory must hold exactly one regular file `libcuda.so.*.*`; its version is
//!   the rest of the name;
//! - with the library's ELF note `.note.cuda.fwd_compatibility` (owner `NVIDIA Corporation`,
//!   JSON `{"Format", "CUDA Version", "Driver": [branches], "Device"}`): given both driver
//!   versions, use compat if the host driver's major is in `Driver` and the compat version is
//!   newer than the host's; else, given a host CUDA version, if the note's `CUDA Version` is
//!   newer; else not;
//! - without a note: not if a host CUDA version is given, else if the host's major is older
//!   than the compat library's.
//!
//! Differences, on purpose: the file has a fixed name instead of NVIDIA's `00-compat-<uuid>`,
//! so a restarted container gets it replaced (atomically, temp name with
//! `O_CREAT|O_EXCL|O_NOFOLLOW` then rename, never written through a symlink) rather than one
//! more file, and when compat is not (or no longer) used, a file of that name left by an earlier
//! start is removed. A note that is not valid JSON is warned about and treated as absent.
//!
//! Every path is resolved inside the root ([`crate::root`]); the library is opened only after
//! `lstat` shows a regular file, non-blocking and without following a symlink, and at most the
//! ELF header, section headers and the note are read ([`crate::elf::note`]). Writes below
//! `/etc` refuse to cross into another mount, as update-ldcache's do.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};

use thiserror::Error;

use crate::elf;
use crate::root::{self, Root, RootError};

/// NVIDIA's default `--cuda-compat-container-root`.
pub const DEFAULT_COMPAT_DIR: &str = "/usr/local/cuda/compat";
/// The file written, named like NVIDIA's `00-compat-*.conf` so that it sorts first.
pub const COMPAT_CONF: &str = "/etc/ld.so.conf.d/00-compat-nvshim.conf";
const CONF_DIR: &str = "/etc/ld.so.conf.d";
const CONF_NAME: &str = "00-compat-nvshim.conf";
/// The note section and its owner.
pub const NOTE_SECTION: &str = ".note.cuda.fwd_compatibility";
pub const NOTE_OWNER: &str = "NVIDIA Corporation";
/// Largest existing conf file read back (to skip an identical rewrite).
const MAX_CONF_LEN: u64 = 1 << 20;
/// Most `libcuda.so.*.*` names looked at in the compat directory.
const MAX_CANDIDATES: usize = 64;

#[derive(Debug, Error)]
pub enum CompatError {
    #[error(transparent)]
    Root(#[from] RootError),
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
}

/// What the command line asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    /// `--host-driver-version`.
    pub host_driver_version: Option<String>,
    /// `--host-cuda-version`.
    pub host_cuda_version: Option<String>,
    /// `--cuda-compat-container-root`; `None` is [`DEFAULT_COMPAT_DIR`].
    pub compat_dir: Option<String>,
}

impl Options {
    /// True when no host version was given: the hook does nothing (NVIDIA returns before
    /// reading the state).
    pub fn is_noop(&self) -> bool {
        let empty = |v: &Option<String>| v.as_deref().is_none_or(str::is_empty);
        empty(&self.host_driver_version) && empty(&self.host_cuda_version)
    }
}

/// What a run did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    /// The compat library looked at (container path).
    pub library: Option<String>,
    /// The compat directory written to the conf file (resolved inside the root).
    pub compat_dir: Option<String>,
    /// Files written or removed (container paths).
    pub written: Vec<String>,
    pub removed: Vec<String>,
    pub warnings: Vec<String>,
}

/// A version as NVIDIA parses it (Masterminds `semver.NewVersion`): an optional `v`, one to
/// three numeric parts (missing ones are 0, leading zeros allowed: `580.65.06`), an optional
/// `-prerelease` or `+build` suffix, which is ignored here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub major: u64,
    pub minor: u64,
    pub patch: u64,
}

impl Version {
    pub fn parse(s: &str) -> Option<Version> {
        let s = s.trim();
        let s = s.strip_prefix('v').unwrap_or(s);
        let core = s.split(['-', '+']).next()?;
        let mut parts = [0u64; 3];
        for (n, p) in core.split('.').enumerate() {
            if n == 3 || p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            parts[n] = p.parse().ok()?;
        }
        Some(Version {
            major: parts[0],
            minor: parts[1],
            patch: parts[2],
        })
    }
}

/// The JSON of `.note.cuda.fwd_compatibility`, e.g. `{"Format":1,"CUDA Version":"13.1",
/// "Driver":[535,550,570,575,580,590],"Device":[1,2,7,8,9,10,11,12,13,14]}`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompatNote {
    pub format: i64,
    pub cuda_version: String,
    pub driver: Vec<i64>,
    pub device: Vec<i64>,
}

impl CompatNote {
    /// Decodes the note as Go's `encoding/json` decodes it into NVIDIA's `compatElfHeader`: keys
    /// matched case-insensitively, unknown keys and `null` values ignored, a value of the wrong
    /// type an error.
    pub fn parse(desc: &[u8]) -> Result<CompatNote, String> {
        let value: serde_json::Value = serde_json::from_slice(desc).map_err(|e| e.to_string())?;
        let obj = value
            .as_object()
            .ok_or_else(|| "not a JSON object".to_string())?;
        let ints = |key: &str, v: &serde_json::Value| -> Result<Vec<i64>, String> {
            v.as_array()
                .ok_or_else(|| format!("{key:?} is not an array"))?
                .iter()
                .map(|x| x.as_i64().ok_or_else(|| format!("{key:?} holds {x}")))
                .collect()
        };
        let mut note = CompatNote::default();
        for (key, v) in obj {
            if v.is_null() {
                continue;
            }
            match key.to_ascii_lowercase().as_str() {
                "format" => {
                    note.format = v
                        .as_i64()
                        .ok_or_else(|| format!("\"Format\" is {v}, not an integer"))?
                }
                "cuda version" => {
                    note.cuda_version = v
                        .as_str()
                        .ok_or_else(|| format!("\"CUDA Version\" is {v}, not a string"))?
                        .to_string()
                }
                "driver" => note.driver = ints("Driver", v)?,
                "device" => note.device = ints("Device", v)?,
                _ => {}
            }
        }
        Ok(note)
    }
}

/// NVIDIA's decision (module documentation). `compat` is the compat library's version (from its
/// file name); versions that did not parse are `None`.
pub fn use_compat(
    note: Option<&CompatNote>,
    compat: Option<Version>,
    host_driver: Option<Version>,
    host_cuda: Option<Version>,
) -> bool {
    match note {
        Some(note) => match (compat, host_driver) {
            (Some(compat), Some(host)) => {
                note.driver
                    .iter()
                    .any(|&b| b >= 0 && b as u64 == host.major)
                    && compat > host
            }
            _ => match (Version::parse(&note.cuda_version), host_cuda) {
                (Some(container), Some(host)) => container > host,
                _ => false,
            },
        },
        None => {
            if host_cuda.is_some() {
                return false;
            }
            match (compat, host_driver) {
                (Some(compat), Some(host)) => host.major < compat.major,
                _ => false,
            }
        }
    }
}

/// `libcuda.so.*.*` as Go's `filepath.Match` reads it: the prefix, then anything with a dot.
fn is_compat_name(name: &[u8]) -> bool {
    name.strip_prefix(b"libcuda.so.")
        .is_some_and(|rest| rest.contains(&b'.'))
}

fn io_error(root: &Root, path: &str, source: io::Error) -> CompatError {
    CompatError::Io {
        path: root.display(path),
        source,
    }
}

/// The one regular `libcuda.so.*.*` in the directory `dir` (container path `dir_path`), opened
/// read-only: `(name, file, size)`. `None` with a warning when there are none or several.
fn find_library(
    root: &Root,
    dir_path: &str,
    dir: &OwnedFd,
    report: &mut Report,
) -> Result<Option<(String, File, u64)>, CompatError> {
    let entries = root::read_dir(dir.as_fd()).map_err(|e| io_error(root, dir_path, e))?;
    let mut found: Vec<(String, libc::stat)> = Vec::new();
    for e in entries.into_iter().filter(|e| is_compat_name(&e.name)) {
        if found.len() >= MAX_CANDIDATES {
            break;
        }
        let Ok(name) = String::from_utf8(e.name) else {
            continue;
        };
        // lstat: a symlink named like the library does not count, as in NVIDIA's glob.
        match root::lstatat(dir.as_fd(), name.as_bytes()) {
            Ok(st) if root::is_regular(&st) => found.push((name, st)),
            _ => {}
        }
    }
    if found.len() != 1 {
        let names: Vec<&str> = found.iter().map(|(n, _)| n.as_str()).collect();
        report.warnings.push(format!(
            "{}: {} CUDA compat libraries ({names:?}) where one was expected; compat not used",
            root.display(dir_path),
            found.len()
        ));
        return Ok(None);
    }
    let (name, st) = found.remove(0);
    let path = format!("{}/{name}", dir_path.trim_end_matches('/'));
    // Non-blocking and not following a symlink: the entry was a regular file an instant ago and
    // must still be that inode.
    let fd = root::openat(
        dir.as_fd(),
        name.as_bytes(),
        libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_NOCTTY,
        0,
    )
    .map_err(|e| io_error(root, &path, e))?;
    let st2 = root::fstat(fd.as_fd()).map_err(|e| io_error(root, &path, e))?;
    if (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino) || !root::is_regular(&st2) {
        return Err(io_error(
            root,
            &path,
            io::Error::from_raw_os_error(libc::EAGAIN),
        ));
    }
    report.library = Some(path);
    Ok(Some((name, File::from(fd), st2.st_size as u64)))
}

/// Decides, for the compat directory `dir_path`, whether its library is used.
fn decide(
    root: &Root,
    opts: &Options,
    dir_path: &str,
    report: &mut Report,
) -> Result<bool, CompatError> {
    let Some(dir) = root.open_dir(dir_path, false)? else {
        return Ok(false);
    };
    let Some((name, file, size)) = find_library(root, dir_path, &dir, report)? else {
        return Ok(false);
    };
    let parse = |what: &str, v: &Option<String>, report: &mut Report| {
        let v = v.as_deref().filter(|v| !v.is_empty())?;
        let parsed = Version::parse(v);
        if parsed.is_none() {
            report
                .warnings
                .push(format!("{what} {v:?} is not a version; ignored"));
        }
        parsed
    };
    let compat = parse(
        "compat library version",
        &Some(name["libcuda.so.".len()..].to_string()),
        report,
    );
    let host_driver = parse("--host-driver-version", &opts.host_driver_version, report);
    let host_cuda = parse("--host-cuda-version", &opts.host_cuda_version, report);
    let note = match elf::note(&file, size, NOTE_SECTION, NOTE_OWNER) {
        None => None,
        Some(desc) => match CompatNote::parse(&desc) {
            Ok(note) => Some(note),
            Err(e) => {
                report.warnings.push(format!(
                    "{}: {NOTE_SECTION}: {e}; read as if absent",
                    report
                        .library
                        .as_deref()
                        .map_or(String::new(), |l| root.display(l))
                ));
                None
            }
        },
    };
    Ok(use_compat(note.as_ref(), compat, host_driver, host_cuda))
}

fn render(dir: &str) -> String {
    format!("# Written by nvshim-hook enable-cuda-compat: CUDA forward compatibility.\n{dir}\n")
}

/// Runs the hook on `root`.
pub fn run(root: &Root, opts: &Options) -> Result<Report, CompatError> {
    let mut report = Report::default();
    if opts.is_noop() {
        return Ok(report);
    }
    let dir_path = match opts.compat_dir.as_deref().filter(|d| !d.is_empty()) {
        Some(d) => d,
        None => DEFAULT_COMPAT_DIR,
    };
    if decide(root, opts, dir_path, &mut report)? {
        // The directory as the image's symlinks resolve it inside the root: what ldconfig and
        // update-ldcache will compare by inode.
        let real = root
            .real_path(dir_path)
            .map_err(|e| io_error(root, dir_path, e))?;
        let content = render(&real);
        report.compat_dir = Some(real);
        if root
            .read_regular(COMPAT_CONF, MAX_CONF_LEN)
            .ok()
            .flatten()
            .as_deref()
            == Some(content.as_bytes())
        {
            return Ok(report);
        }
        let dir = root.mkdir_all(CONF_DIR, 0o755, true)?;
        root::replace_file(dir.as_fd(), CONF_NAME, content.as_bytes(), 0o644)
            .map_err(|e| io_error(root, COMPAT_CONF, e))?;
        report.written.push(COMPAT_CONF.into());
    } else {
        // A file left by an earlier start of this container (the host driver was older then)
        // would put a compat libcuda the host no longer needs first: remove it.
        match root.open_at(CONF_DIR, libc::O_PATH | libc::O_DIRECTORY, 0, true) {
            Ok(dir) => {
                if let Ok(st) = root::lstatat(dir.as_fd(), CONF_NAME.as_bytes()) {
                    if !root::is_dir(&st) {
                        root::remove_file(dir.as_fd(), CONF_NAME)
                            .map_err(|e| io_error(root, COMPAT_CONF, e))?;
                        report.removed.push(COMPAT_CONF.into());
                    }
                }
            }
            Err(e) if root::is_missing(&e) => {}
            Err(e) => return Err(io_error(root, CONF_DIR, e)),
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Option<Version> {
        Version::parse(s)
    }

    fn note_12_9() -> CompatNote {
        CompatNote {
            format: 1,
            cuda_version: "12.9".into(),
            driver: vec![535, 550, 560, 565, 570, 575],
            device: vec![1, 2, 7, 8, 9, 10, 11, 12, 13, 14],
        }
    }

    #[test]
    fn versions_parse_like_masterminds_semver() {
        assert_eq!(
            v("580.65.06"),
            Some(Version {
                major: 580,
                minor: 65,
                patch: 6
            })
        );
        assert_eq!(v("12.9").unwrap().minor, 9);
        assert!(v("12.10") > v("12.9"));
        assert_eq!(v("v575"), v("575.0.0"));
        assert_eq!(v("580.65.06-beta+x"), v("580.65.6"));
        for bad in ["", "a.b", "1.2.3.4", "1..2", "-1", "1.2."] {
            assert_eq!(v(bad), None, "{bad}");
        }
    }

    #[test]
    fn note_json_decodes_like_go() {
        let n = CompatNote::parse(
            br#"{"Format":1,"CUDA Version":"13.1","Driver":[535,550,570,575,580,590],"Device":[1,2,7,8,9,10,11,12,13,14]}"#,
        )
        .unwrap();
        assert_eq!(n.cuda_version, "13.1");
        assert_eq!(n.driver, [535, 550, 570, 575, 580, 590]);
        // Case-insensitive keys, unknown keys and nulls ignored.
        let n = CompatNote::parse(br#"{"driver":[580],"cuda version":"13.0","X":1,"Device":null}"#)
            .unwrap();
        assert_eq!((n.driver, n.cuda_version.as_str()), (vec![580], "13.0"));
        for bad in [
            &br#"{"Driver":"580"}"#[..],
            br#"{"Driver":[1.5]}"#,
            b"[1]",
            b"{",
            br#"{"CUDA Version":13}"#,
        ] {
            assert!(
                CompatNote::parse(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    /// NVIDIA's `TestUseCompat` cases (cuda-elf-header_test.go), then the no-note rules.
    #[test]
    fn decision_rule_is_nvidias() {
        let n = note_12_9();
        let cases = [
            ("", "", "12.8", true),
            ("", "", "12.9", false),
            ("", "", "12.10", false),
            ("575.57.08", "590.44.01", "", false),
            ("575.57.08", "570.211.01", "", true),
            ("575.57.08", "575.10.10", "", true),
            ("575.57.08", "575.57.08", "", false),
            ("575.57.08", "575.99.99", "", false),
        ];
        for (compat, host, cuda, want) in cases {
            assert_eq!(
                use_compat(Some(&n), v(compat), v(host), v(cuda)),
                want,
                "{compat} {host} {cuda}"
            );
        }
        // Both driver versions known: the CUDA version is not looked at.
        assert!(!use_compat(Some(&n), v("575.57.08"), v("590.1"), v("12.0")));
        // An empty Driver list supports no branch.
        let empty = CompatNote {
            driver: vec![],
            ..note_12_9()
        };
        assert!(!use_compat(
            Some(&empty),
            v("575.57.08"),
            v("570.1.1"),
            None
        ));
        // No note: never with a host CUDA version, else by driver major.
        assert!(!use_compat(None, v("575.57.08"), v("570.1.1"), v("12.0")));
        assert!(use_compat(None, v("575.57.08"), v("570.1.1"), None));
        assert!(!use_compat(None, v("575.57.08"), v("575.1.1"), None));
        assert!(!use_compat(None, v("575.57.08"), None, None));
        assert!(!use_compat(None, None, v("570.1.1"), None));
    }

    #[test]
    fn compat_names() {
        assert!(is_compat_name(b"libcuda.so.580.95.05"));
        assert!(is_compat_name(b"libcuda.so.1.1"));
        assert!(!is_compat_name(b"libcuda.so.1"));
        assert!(!is_compat_name(b"libcuda.so"));
        assert!(!is_compat_name(b"libcudart.so.12.9"));
    }

    #[test]
    fn no_host_version_is_a_noop() {
        assert!(Options::default().is_noop());
        assert!(Options {
            host_driver_version: Some(String::new()),
            ..Default::default()
        }
        .is_noop());
        assert!(!Options {
            host_cuda_version: Some("12.9".into()),
            ..Default::default()
        }
        .is_noop());
    }
}
