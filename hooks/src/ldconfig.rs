//! ldconfig without exec: glibc 2.36's `elf/ldconfig.c` configuration reading and directory
//! scanning, on file descriptors below a container root.
//!
//! What is ported, with its ldconfig function:
//! - `parse_conf` / `parse_conf_include`: `include` lines with shell globs (sorted in C
//!   collation, as `glob(3)` does), `hwcap` lines ignored, `dir=libc6` type suffixes, comments
//!   after `#`, leading blanks, trailing blanks and slashes; relative `include` patterns taken
//!   relative to the including file's directory.
//! - `add_dir_1` / `add_single_dir`: directories identified by inode (the first name wins, so a
//!   merged-`/usr` `/lib/x86_64-linux-gnu` names the files of `/usr/lib/x86_64-linux-gnu`), the
//!   built-in system directories last, `glibc-hwcaps/<name>` subdirectories queued right after
//!   their parent and every such name interned in the string table, used or not.
//! - `search_dir`: `lib*.so*`/`ld-*.so*` names, prelink temporaries skipped, links resolved
//!   inside the root, a link kept as its own entry only when its name is the SONAME or the
//!   `.so` development name of it, one entry per SONAME per directory (files preferred to links,
//!   then the `_dl_cache_libcmp`-newest name), legacy hwcap subdirectories (`tls`, `haswell`,
//!   `x86_64`, ...) queued with their hwcap bits, and the SONAME symlinks (`create_links`).
//!
//! Deliberate differences, each on the safe side:
//! - Stale `*.so.*` symlinks are left alone (ldconfig deletes them).
//! - A SONAME containing `/` (or `.`/`..`) gets its cache entry but no symlink: ldconfig
//!   would create it relative to the directory, which for a hook outside the chroot could
//!   leave the root.
//! - A file that is not regular behind a link is skipped without being opened (ldconfig opens
//!   it, and blocks forever on a FIFO).
//! - After creating SONAME links in a directory, the directory is scanned once more, so that a
//!   `libfoo.so -> libfoo.so.1` link that was dangling until now is indexed in this run rather
//!   than the next: one run gives what ldconfig gives after two, and a second run changes nothing.
//! - Include nesting stops at depth 8 and configuration files above 1 MiB are skipped with a
//!   warning (ldconfig recurses without bound on an include loop); the `include` globs of one
//!   run list at most 1024 directories, read at most 16384 entries and produce at most 4096
//!   paths, counted as they expand ([`Budget`]): self-links or a link loop make the full
//!   expansion exponential. At a limit the hook warns once and goes on with what it has.
//!
//! Names are bytes throughout (configuration lines, file names, SONAMEs, cache strings), as in
//! ldconfig: a name that is not UTF-8 is kept, not dropped.
//! - Legacy hwcap subdirectory names are known for x86-64 only (`sysdeps/x86/dl-hwcap.h`,
//!   `dl-procinfo.h`); on aarch64 only `tls` is recognised.
//! - The auxiliary cache (`/var/cache/ldconfig/aux-cache`) is neither read nor written: it only
//!   saves ldconfig from re-reading unchanged files.
//!
//! One file (1080 lines of code, 60 of tests): a port of one upstream file, `elf/ldconfig.c` (with
//! the `glob`/`fnmatch` and hwcap rules it relies on), kept in one piece so that it reads side by
//! side with the original; [`Config`] and [`Scanner`] carry the state ldconfig keeps in globals
//! from configuration reading to the scan.

use std::collections::BTreeSet;

// foldhash (seeded per process) where std would use SipHash: the listings hashed here are a
// library folder's hundred-odd names, a few lookups each.
use foldhash::{HashMap, HashMapExt as _, HashSet};
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd};

use crate::elf::{self, Arch, FLAG_ELF, FLAG_ELF_LIBC5, FLAG_ELF_LIBC6};
use crate::ldcache::{libcmp, CacheEntry};
use crate::root::{self, Root};

/// Largest configuration file read.
const MAX_CONF_LEN: u64 = 1 << 20;
/// Deepest `include` nesting followed.
const MAX_INCLUDE_DEPTH: u32 = 8;
/// Most configuration files read in one run.
const MAX_CONF_FILES: usize = 4096;
/// Most directories in the search list.
const MAX_DIRS: usize = 4096;
/// Most bytes of configuration read in one run, all files together.
const MAX_CONF_TOTAL: usize = 8 << 20;
/// Most lines naming a directory in one run, all files together.
const MAX_DIR_LINES: usize = 16_384;
/// Most directories `include` globs list in one run, all patterns together.
pub const MAX_GLOB_DIRS: usize = 1024;
/// Most directory entries `include` globs read in one run, all listings together.
pub const MAX_GLOB_NAMES: usize = 16_384;
/// Most paths `include` globs produce in one run (intermediate directories and matches).
pub const MAX_GLOB_MATCHES: usize = 4096;
/// Longest `include` pattern expanded (`PATH_MAX`); no file name is longer than `NAME_MAX`,
/// so neither is a pattern component that could match one.
const MAX_PATTERN_LEN: usize = 4096;
const NAME_MAX: usize = 255;
/// `FLAG_ANY`: a directory with no `=type` suffix.
const FLAG_ANY: i32 = -1;
/// The bit `tls` subdirectories set in `hwcap` (`TLS_HWCAP_BIT`).
const TLS_HWCAP_BIT: u32 = 63;

/// Where the driver's libraries are looked for under a driver root that has no ld.so.cache (a
/// driver directory such as GKE's `/home/kubernetes/bin/nvidia`): NVIDIA's library locator's
/// search paths (nvidia-container-toolkit `internal/lookup/library.go`), then the plain `lib`
/// and 32-bit directories a driver directory keeps its 32-bit libraries in (ldconfig tells the
/// word sizes apart by ELF class). nvshim's host discovery scans them as `ldconfig -r` would;
/// the memory-limit hook looks for `libnvidia-ml.so.1` in them.
pub const DRIVER_LIBRARY_DIRS: &[&str] = &[
    "/",
    "/usr/lib64",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu/nvidia/current",
    "/usr/lib/aarch64-linux-gnu/nvidia/current",
    "/lib64",
    "/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/lib/x86_64-linux-gnu/nvidia/current",
    "/lib/aarch64-linux-gnu/nvidia/current",
    "/glibc/lib",
    "/lib",
    "/usr/lib",
    "/lib32",
    "/usr/lib32",
    "/lib/i386-linux-gnu",
    "/usr/lib/i386-linux-gnu",
];

/// One directory ldconfig searches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dir {
    /// The name as configured (the first one, for a directory named twice): bytes, as
    /// ldconfig takes any.
    pub path: Vec<u8>,
    pub dev: u64,
    pub ino: u64,
    /// The `=libc5`/`=libc6` type suffix, or `FLAG_ANY`.
    pub flag: i32,
    /// The `glibc-hwcaps` subdirectory name, for `<dir>/glibc-hwcaps/<name>`.
    pub hwcaps: Option<Vec<u8>>,
}

/// A directory named by the configuration (duplicates included), and whether the naming line
/// came from nvshim's own configuration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named {
    pub dev: u64,
    pub ino: u64,
    pub own: bool,
}

/// The search list ldconfig would build.
#[derive(Debug, Clone, Default)]
pub struct Config {
    pub dirs: Vec<Dir>,
    pub named: Vec<Named>,
    /// Every `glibc-hwcaps` subdirectory name found, for the string table.
    pub hwcaps_names: BTreeSet<Vec<u8>>,
    pub warnings: Vec<String>,
    /// What the `include` globs cost.
    pub globbed: Budget,
}

/// What `include` globs may still cost in one configuration read, spent while they expand
/// (self-links, symlink loops, wide or deep trees and `*/*/*` patterns make the full expansion
/// exponential): once a limit is reached, expansion stops with what it has and one warning.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Budget {
    /// Directories listed.
    pub dirs: usize,
    /// Directory entries read.
    pub names: usize,
    /// Paths produced, intermediate or final.
    pub matches: usize,
    /// Why expansion stopped, once it has.
    pub stopped: Option<String>,
}

impl Budget {
    fn stop(&mut self, why: String) {
        self.stopped.get_or_insert(why);
    }
}

impl Config {
    /// The search-list entry for the directory with this identity.
    pub fn find(&self, dev: u64, ino: u64) -> Option<usize> {
        self.dirs
            .iter()
            .position(|d| d.dev == dev && d.ino == ino && d.hwcaps.is_none())
    }

    fn add_single_dir(&mut self, dir: Dir) -> bool {
        if let Some(existing) = self
            .dirs
            .iter_mut()
            .find(|d| d.dev == dir.dev && d.ino == dir.ino)
        {
            // "Use the newer information."
            existing.flag = dir.flag;
            return false;
        }
        if self.dirs.len() >= MAX_DIRS {
            self.warnings.push(format!(
                "more than {MAX_DIRS} library directories; {} ignored",
                String::from_utf8_lossy(&dir.path)
            ));
            return false;
        }
        self.dirs.push(dir);
        true
    }
}

/// The directories the container's own ldconfig adds after its configuration: Debian's build
/// (`/etc/debian_version` present) adds the multiarch directories and `/lib`, `/usr/lib`, as
/// `ldconfig -v` on Debian 12 shows; other distributions build with `slibdir=/lib64` (x86-64's
/// `add_system_dir` in `sysdeps/unix/sysv/linux/x86_64/dl-cache.h` then adds `/lib`, `/lib64`,
/// `/libx32` and the `/usr` equivalents).
pub fn system_dirs(root: &Root, arch: Arch) -> Vec<String> {
    let debian = matches!(root.stat("/etc/debian_version"), Ok(Some(_)));
    let t = arch.triplet();
    let dirs: Vec<String> = if debian {
        vec![
            format!("/lib/{t}"),
            format!("/usr/lib/{t}"),
            "/lib".into(),
            "/usr/lib".into(),
        ]
    } else {
        match arch {
            Arch::X86_64 => [
                "/lib",
                "/lib64",
                "/libx32",
                "/usr/lib",
                "/usr/lib64",
                "/usr/libx32",
            ]
            .map(String::from)
            .to_vec(),
            // aarch64's `add_system_dir` (`sysdeps/unix/sysv/linux/aarch64/dl-cache.h`) adds
            // `/lib`, `/lib64` and `/libilp32` for `/lib64`, and the same under `/usr`.
            Arch::Aarch64 => [
                "/lib",
                "/lib64",
                "/libilp32",
                "/usr/lib",
                "/usr/lib64",
                "/usr/libilp32",
            ]
            .map(String::from)
            .to_vec(),
        }
    };
    dirs
}

/// Reads the configuration below `root` as ldconfig does: `conf` (normally `/etc/ld.so.conf`),
/// then `system`. Lines read from `own_file` are marked in [`Config::named`].
pub fn read_config(root: &Root, conf: &str, system: &[String], own_file: &str) -> Config {
    read_config_from(root, conf, None, system, own_file)
}

/// [`read_config`] with `conf`'s content already read (`first`), as update-ldcache has it.
pub fn read_config_from(
    root: &Root,
    conf: &str,
    first: Option<&[u8]>,
    system: &[String],
    own_file: &str,
) -> Config {
    let mut reader = ConfigReader {
        root,
        own_file,
        files: 0,
        bytes: 0,
        dir_lines: 0,
        limits_met: Vec::new(),
        config: Config::default(),
        first,
    };
    reader.parse_conf(conf.as_bytes(), 0);
    if let Some(why) = reader.config.globbed.stopped.clone() {
        reader.warn(why);
    }
    for dir in system {
        reader.add_dir(dir.as_bytes(), false);
    }
    reader.config
}

struct ConfigReader<'a> {
    root: &'a Root,
    own_file: &'a str,
    files: usize,
    /// Configuration bytes read so far.
    bytes: usize,
    /// Lines naming a directory so far.
    dir_lines: usize,
    /// The limits met so far ([`ConfigReader::limit`]).
    limits_met: Vec<&'static str>,
    config: Config,
    /// The top file's content, when the caller read it.
    first: Option<&'a [u8]>,
}

/// C `isspace` in the C locale.
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\x0b' | b'\x0c' | b'\r')
}

/// C `isblank`.
fn is_blank(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

impl ConfigReader<'_> {
    fn warn(&mut self, message: String) {
        self.config.warnings.push(message);
    }

    /// Warns of the first time a limit of `kind` is met only: a hostile image meets one
    /// thousands of times.
    fn limit(&mut self, kind: &'static str, message: String) {
        if !self.limits_met.contains(&kind) {
            self.limits_met.push(kind);
            self.warn(message);
        }
    }

    fn parse_conf(&mut self, filename: &[u8], depth: u32) {
        if depth > MAX_INCLUDE_DEPTH {
            let file = self.root.display(filename);
            self.limit(
                "depth",
                format!("{file}: include nesting deeper than {MAX_INCLUDE_DEPTH}; not read"),
            );
            return;
        }
        if self.files >= MAX_CONF_FILES {
            let file = self.root.display(filename);
            self.limit(
                "files",
                format!("more than {MAX_CONF_FILES} configuration files; {file} not read"),
            );
            return;
        }
        self.files += 1;
        let read;
        let data: &[u8] = match self.first.take().filter(|_| depth == 0) {
            Some(first) => first,
            None => match self.root.read_regular(filename, MAX_CONF_LEN) {
                Ok(Some(data)) => {
                    read = data;
                    &read
                }
                Ok(None) => return,
                Err(e) => {
                    self.limit("unreadable", format!("ignoring configuration file: {e}"));
                    return;
                }
            },
        };
        self.bytes += data.len();
        if self.bytes > MAX_CONF_TOTAL {
            let file = self.root.display(filename);
            self.limit(
                "bytes",
                format!("more than {MAX_CONF_TOTAL} bytes of configuration; {file} not read"),
            );
            return;
        }
        let own = filename == self.own_file.as_bytes();
        for raw in data.split(|&b| b == b'\n') {
            // Cut at '#', skip leading white space, ignore blank lines.
            let line = raw.split(|&b| b == b'#').next().unwrap_or_default();
            let start = line
                .iter()
                .position(|&b| !is_space(b))
                .unwrap_or(line.len());
            let line = &line[start..];
            if line.is_empty() {
                continue;
            }
            if line.len() > 7 && line.starts_with(b"include") && is_blank(line[7]) {
                for pattern in line[8..].split(|&b| is_blank(b)).filter(|p| !p.is_empty()) {
                    self.parse_include(filename, pattern, depth);
                }
            } else if line.len() > 5
                && line[..5].eq_ignore_ascii_case(b"hwcap")
                && is_blank(line[5])
            {
                // "hwcap directive ignored"
            } else if self.dir_lines >= MAX_DIR_LINES {
                let file = self.root.display(filename);
                self.limit(
                    "lines",
                    format!(
                        "more than {MAX_DIR_LINES} directory lines; the rest of {file} ignored"
                    ),
                );
                return;
            } else {
                self.dir_lines += 1;
                self.add_dir(line, own);
            }
        }
    }

    fn parse_include(&mut self, config_file: &[u8], pattern: &[u8], depth: u32) {
        let pattern = match crate::bytes::rfind(b'/', config_file) {
            Some(i) if pattern.first() != Some(&b'/') => {
                let dir: &[u8] = if i == 0 { b"/" } else { &config_file[..i] };
                join(dir, pattern)
            }
            _ => pattern.to_vec(),
        };
        for file in glob(self.root, &pattern, &mut self.config.globbed) {
            self.parse_conf(&file, depth + 1);
        }
    }

    /// `add_dir_1`.
    fn add_dir(&mut self, line: &[u8], own: bool) {
        let (path, flag) = match crate::bytes::find(b'=', line) {
            Some(i) => {
                let flag = match trim_end(&line[i + 1..], is_space) {
                    b"libc4" => 0,
                    b"libc5" => FLAG_ELF_LIBC5,
                    b"libc6" | b"glibc2" => FLAG_ELF_LIBC6,
                    _ => FLAG_ANY,
                };
                (&line[..i], flag)
            }
            None => (line, FLAG_ANY),
        };
        let path = trim_end(trim_end(path, is_space), |b| b == b'/');
        if path.is_empty() {
            return;
        }
        let st = match self.root.stat(path) {
            Ok(Some(st)) => st,
            _ => return,
        };
        self.config.named.push(Named {
            dev: st.st_dev,
            ino: st.st_ino,
            own,
        });
        let added = self.config.add_single_dir(Dir {
            path: path.to_vec(),
            dev: st.st_dev,
            ino: st.st_ino,
            flag,
            hwcaps: None,
        });
        if added {
            self.add_glibc_hwcaps_subdirectories(path, flag);
        }
    }

    fn add_glibc_hwcaps_subdirectories(&mut self, path: &[u8], flag: i32) {
        let hw = join(path, b"glibc-hwcaps");
        let Ok(Some(fd)) = self.root.open_dir(&hw, false) else {
            return;
        };
        let Ok(entries) = root::read_dir_fresh(fd.as_fd()) else {
            return;
        };
        for e in entries {
            // Hidden names, regular files and names with ':' are skipped.
            if e.name.first() == Some(&b'.') || e.kind == libc::DT_REG || e.name.contains(&b':') {
                continue;
            }
            let name = e.name;
            let sub = join(&hw, &name);
            let Ok(Some(st)) = self.root.stat(&sub) else {
                continue;
            };
            if !root::is_dir(&st) {
                continue;
            }
            self.config.hwcaps_names.insert(name.clone());
            self.config.add_single_dir(Dir {
                path: sub,
                dev: st.st_dev,
                ino: st.st_ino,
                flag,
                hwcaps: Some(name),
            });
        }
    }
}

/// `s` without the bytes at its end that `drop` selects.
fn trim_end(s: &[u8], drop: impl Fn(u8) -> bool) -> &[u8] {
    let keep = s.iter().rposition(|&b| !drop(b)).map_or(0, |i| i + 1);
    &s[..keep]
}

/// `dir/name`.
fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    [dir, b"/", name].concat()
}

/// `glob(3)` below the root for the `*`, `?` and `[...]` patterns of an `include` line, with
/// glibc's defaults: a leading `.` only matched explicitly, results sorted by `strcmp`. What it
/// lists, reads and produces is taken from `budget` as it goes ([`Budget`]): at a limit the
/// expansion stops and returns what it has.
pub fn glob(root: &Root, pattern: &[u8], budget: &mut Budget) -> Vec<Vec<u8>> {
    let comps: Vec<&[u8]> = pattern
        .split(|&b| b == b'/')
        .filter(|c| !c.is_empty())
        .collect();
    if comps.is_empty() {
        return Vec::new();
    }
    let absolute = pattern.first() == Some(&b'/');
    let lead: &[u8] = if absolute { b"/" } else { b"" };
    if !has_magic(pattern) {
        // One path, nothing listed: also after a limit was reached.
        let path: Vec<Vec<u8>> = comps.iter().map(|c| unescape(c)).collect();
        return vec![[lead, &path.join(&b'/')].concat()];
    }
    if budget.stopped.is_some() {
        return Vec::new();
    }
    let shown = String::from_utf8_lossy(pattern);
    if pattern.len() > MAX_PATTERN_LEN || comps.iter().any(|c| c.len() > NAME_MAX) {
        budget.stop(format!(
            "include pattern {:?}: longer than a path; not expanded",
            shown.chars().take(64).collect::<String>()
        ));
        return Vec::new();
    }
    let mut found: Vec<Vec<u8>> = vec![Vec::new()];
    for (i, comp) in comps.iter().enumerate() {
        let last = i + 1 == comps.len();
        let mut next = Vec::new();
        let mut add = |budget: &mut Budget, path: Vec<u8>| {
            if budget.matches >= MAX_GLOB_MATCHES {
                budget.stop(format!(
                    "include {shown:?}: more than {MAX_GLOB_MATCHES} paths; expansion stopped"
                ));
                return false;
            }
            budget.matches += 1;
            next.push(path);
            true
        };
        for base in &found {
            let join = |name: &[u8]| {
                if base.is_empty() {
                    [lead, name].concat()
                } else {
                    join(base, name)
                }
            };
            if !has_magic(comp) {
                if !add(budget, join(&unescape(comp))) {
                    break;
                }
                continue;
            }
            if budget.dirs >= MAX_GLOB_DIRS {
                budget.stop(format!(
                    "include {shown:?}: more than {MAX_GLOB_DIRS} directories listed; \
                     expansion stopped"
                ));
                break;
            }
            let dir: &[u8] = match (base.is_empty(), absolute) {
                (false, _) => base,
                (true, true) => b"/",
                (true, false) => b".",
            };
            let Ok(Some(fd)) = root.open_dir(dir, false) else {
                continue;
            };
            budget.dirs += 1;
            let left = MAX_GLOB_NAMES - budget.names;
            let Ok(entries) = root::read_dir_upto(fd.as_fd(), left) else {
                continue;
            };
            budget.names += entries.len();
            if entries.len() == left {
                budget.stop(format!(
                    "include {shown:?}: more than {MAX_GLOB_NAMES} directory entries read; \
                     expansion stopped"
                ));
            }
            for e in entries {
                if !fnmatch(comp, &e.name) {
                    continue;
                }
                let path = join(&e.name);
                if !last && !matches!(root.stat(&path), Ok(Some(ref st)) if root::is_dir(st)) {
                    continue;
                }
                if !add(budget, path) {
                    break;
                }
            }
            if budget.stopped.is_some() {
                break;
            }
        }
        if budget.stopped.is_some() && !last {
            // Directories still to be searched: no file found.
            return Vec::new();
        }
        found = next;
    }
    found.sort();
    found.dedup();
    found
}

fn has_magic(s: &[u8]) -> bool {
    s.iter().any(|b| matches!(b, b'*' | b'?' | b'['))
}

fn unescape(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.iter();
    while let Some(&b) = bytes.next() {
        if b == b'\\' {
            if let Some(&n) = bytes.next() {
                out.push(n);
            }
        } else {
            out.push(b);
        }
    }
    out
}

/// `fnmatch(pattern, name, FNM_PERIOD)` for one path component.
pub fn fnmatch(pattern: &[u8], name: &[u8]) -> bool {
    if name.first() == Some(&b'.') && pattern.first() != Some(&b'.') {
        return false;
    }
    fn go(p: &[u8], n: &[u8]) -> bool {
        // A '[' after the last ']' is never closed: an ordinary character, found without
        // scanning the rest of the pattern each time.
        let closed_before = p.iter().rposition(|&c| c == b']').unwrap_or(0);
        let (mut pi, mut ni) = (0usize, 0usize);
        // Backtracking point for the last '*': (pattern index after '*', name index).
        let mut star: Option<(usize, usize)> = None;
        while ni < n.len() {
            let step = if pi < p.len() {
                match p[pi] {
                    b'*' => {
                        star = Some((pi + 1, ni));
                        pi += 1;
                        continue;
                    }
                    b'?' => Some(pi + 1),
                    b'[' if pi >= closed_before => (n[ni] == b'[').then_some(pi + 1),
                    b'[' => match bracket(&p[pi..], n[ni]) {
                        Some((true, len)) => Some(pi + len),
                        Some((false, _)) => None,
                        // An unterminated '[' is an ordinary character.
                        None if n[ni] == b'[' => Some(pi + 1),
                        None => None,
                    },
                    b'\\' if pi + 1 < p.len() => (p[pi + 1] == n[ni]).then_some(pi + 2),
                    c => (c == n[ni]).then_some(pi + 1),
                }
            } else {
                None
            };
            match step {
                Some(next) => {
                    pi = next;
                    ni += 1;
                }
                None => match star {
                    Some((sp, sn)) => {
                        pi = sp;
                        ni = sn + 1;
                        star = Some((sp, sn + 1));
                    }
                    None => return false,
                },
            }
        }
        p[pi..].iter().all(|&c| c == b'*')
    }
    go(pattern, name)
}

/// Matches one byte against a bracket expression at the start of `p`; returns whether it
/// matched and the expression's length, or `None` if the bracket is not closed.
fn bracket(p: &[u8], c: u8) -> Option<(bool, usize)> {
    let mut i = 1;
    let negate = matches!(p.get(i), Some(b'!') | Some(b'^'));
    if negate {
        i += 1;
    }
    let mut matched = false;
    let mut first = true;
    while i < p.len() {
        let mut lo = p[i];
        if lo == b']' && !first {
            return Some((matched != negate, i + 1));
        }
        first = false;
        if lo == b'\\' && i + 1 < p.len() {
            i += 1;
            lo = p[i];
        }
        if i + 2 < p.len() && p[i + 1] == b'-' && p[i + 2] != b']' {
            let mut hi = p[i + 2];
            let mut adv = 3;
            if hi == b'\\' && i + 3 < p.len() {
                hi = p[i + 3];
                adv = 4;
            }
            if lo <= c && c <= hi {
                matched = true;
            }
            i += adv;
        } else {
            if lo == c {
                matched = true;
            }
            i += 1;
        }
    }
    None
}

/// `_dl_is_dso` (`elf/dl-is_dso.h`): `lib*.so*`, `ld-*.so*`, `ld.so.*`, `ld64.so.*`.
pub fn is_dso(name: &[u8]) -> bool {
    ((name.starts_with(b"lib") || name.starts_with(b"ld-"))
        && crate::bytes::find_str(name, b".so").is_some())
        || name.starts_with(b"ld.so.")
        || name.starts_with(b"ld64.so.")
}

/// x86's `_dl_string_hwcap` (`sysdeps/x86/dl-hwcap.h`): the index of a hwcap name.
fn string_hwcap(arch: Arch, name: &str) -> Option<u32> {
    match arch {
        Arch::X86_64 => ["sse2", "x86_64", "avx512_1"]
            .iter()
            .position(|n| *n == name)
            .map(|i| i as u32),
        Arch::Aarch64 => None,
    }
}

/// `_dl_string_platform`: platform names map to bits from `_DL_FIRST_PLATFORM` (48), which
/// puts `haswell` at bit 50 (confirmed against ldconfig 2.36's cache).
fn string_platform(arch: Arch, name: &str) -> Option<u32> {
    match arch {
        Arch::X86_64 => ["i586", "i686", "haswell", "xeon_phi"]
            .iter()
            .position(|n| *n == name)
            .map(|i| 48 + i as u32),
        Arch::Aarch64 => None,
    }
}

/// `is_hwcap_platform`: a subdirectory ldconfig descends into. Only the hwcaps in
/// `HWCAP_IMPORTANT` count (`x86_64`, `avx512_1`), plus platforms and `tls`.
pub fn is_hwcap_platform(arch: Arch, name: &[u8]) -> bool {
    let Ok(name) = std::str::from_utf8(name) else {
        return false;
    };
    if let Some(i) = string_hwcap(arch, name) {
        if (1u64 << i) & 0b110 != 0 {
            return true;
        }
    }
    string_platform(arch, name).is_some() || name == "tls"
}

/// `path_hwcap`: the hwcap bits of the trailing hwcap components of a directory path.
pub fn path_hwcap(arch: Arch, path: &[u8]) -> u64 {
    let mut hwcap: u64 = 0;
    let mut rest = path;
    while let Some(slash) = crate::bytes::rfind(b'/', rest) {
        let Ok(comp) = std::str::from_utf8(&rest[slash + 1..]) else {
            break;
        };
        let bit = match string_hwcap(arch, comp).or_else(|| string_platform(arch, comp)) {
            Some(b) => b,
            None if comp == "tls" => TLS_HWCAP_BIT,
            None => break,
        };
        hwcap = hwcap.wrapping_add(1u64 << bit);
        rest = &rest[..slash];
    }
    hwcap
}

/// ldconfig's prelink temporaries: `*.#prelink#` and `*.#prelink#.XXXXXX`.
fn is_prelink_temp(name: &[u8]) -> bool {
    name.ends_with(b".#prelink#")
        || (name.len() >= ".#prelink#.XXXXXX".len()
            && name[name.len() - ".#prelink#.XXXXXX".len()..].starts_with(b".#prelink#."))
}

/// Links followed by name inside one directory before resolving from the root.
const MAX_LOCAL_LINKS: usize = 8;

/// Per-directory state of one scan.
struct DirScan<'a> {
    fd: BorrowedFd<'a>,
    arch: Arch,
    /// `d_type` of every name in the listing.
    kinds: HashMap<Vec<u8>, u8>,
    /// Entries looked at, by name: a library and the links to it cost one look.
    locals: HashMap<Vec<u8>, Local>,
    /// Symlink targets read, by entry name.
    links: HashMap<Vec<u8>, Vec<u8>>,
    /// ELF information by inode, for files reached from the root.
    seen: HashMap<(u64, u64), Option<elf::DsoInfo>>,
}

/// One entry of the scanned directory, not followed.
#[derive(Clone)]
struct Local {
    st: libc::stat,
    /// The ELF information, once read (regular files only).
    info: Option<Option<elf::DsoInfo>>,
}

impl DirScan<'_> {
    /// `only`, the links of the listing whose plain target is among them (to a fixpoint), the
    /// links whose target has a `/`, and the names the listing could not type: what a scan
    /// restricted to `only` must look at to find what ldconfig would find for those names.
    /// Each link is read once (kept for [`Scanner::resolve`]).
    fn leading_to(&mut self, only: &HashSet<Vec<u8>>) -> HashSet<Vec<u8>> {
        let mut include: HashSet<Vec<u8>> = only.clone();
        let mut pending: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        for (name, &kind) in &self.kinds {
            match kind {
                libc::DT_LNK => match root::readlinkat(self.fd, name) {
                    Ok(target) => {
                        self.links.insert(name.clone(), target.clone());
                        pending.push((name.clone(), target));
                    }
                    Err(_) => continue,
                },
                libc::DT_UNKNOWN => {
                    include.insert(name.clone());
                }
                _ => {}
            }
        }
        loop {
            let before = include.len();
            pending.retain(|(name, target)| {
                let leads = target.contains(&b'/') || include.contains(target);
                if leads {
                    include.insert(name.clone());
                }
                !leads
            });
            if include.len() == before {
                return include;
            }
        }
    }

    /// Looks at `name`. A name the listing says is a regular file is opened at once, with
    /// `O_NOFOLLOW|O_NONBLOCK`, and read (it is a library candidate, and `fstat` on the open
    /// file is as cheap as `lstat`); anything else is only `lstat`ed, so that no FIFO or device
    /// is ever opened.
    fn local(&mut self, name: &[u8]) -> Option<Local> {
        if let Some(l) = self.locals.get(name) {
            return Some(l.clone());
        }
        let mut found = None;
        let regular = self.kinds.get(name) == Some(&libc::DT_REG);
        if regular {
            if let Ok(fd) = root::openat(
                self.fd,
                name,
                libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY,
                0,
            ) {
                let file = File::from(fd);
                if let Ok(st) = root::fstat(file.as_fd()) {
                    let info = root::is_regular(&st)
                        .then(|| elf::inspect(&file, st.st_size as u64, self.arch))
                        .flatten();
                    found = Some(Local {
                        st,
                        info: Some(info),
                    });
                }
            }
        }
        let local = match found {
            Some(l) => l,
            None => Local {
                st: root::lstatat(self.fd, name).ok()?,
                info: None,
            },
        };
        self.locals.insert(name.to_vec(), local.clone());
        Some(local)
    }
}

/// A directory entry after following links.
struct Target {
    st: libc::stat,
    /// The final name, when it is in the scanned directory itself.
    local: Option<Vec<u8>>,
    /// The entry's container path (for resolution from the root).
    path: Vec<u8>,
}

/// One library a directory scan found (`struct dlib_entry`).
#[derive(Debug, Clone)]
struct Dlib {
    name: Vec<u8>,
    soname: Vec<u8>,
    flag: i32,
    is_link: bool,
}

/// The outcome of scanning directories.
#[derive(Debug, Default)]
pub struct Scan {
    /// Cache entries with their position in ldconfig's insertion order.
    pub entries: Vec<(CacheEntry, usize, usize)>,
    /// SONAME symlinks created (`dir/soname -> name`).
    pub links: Vec<String>,
    pub warnings: Vec<String>,
}

/// What [`Scanner::search_dir_only`] saw of a directory.
#[derive(Debug, Default)]
pub struct Listing {
    /// Every name listed.
    pub names: HashSet<Vec<u8>>,
    /// The names scanned: those asked for and the links leading to them.
    pub looked_at: HashSet<Vec<u8>>,
}

/// Scans directories for libraries, as ldconfig's `search_dir`.
pub struct Scanner<'a> {
    pub root: &'a Root,
    pub arch: Arch,
    /// Create the SONAME symlinks (ldconfig's default; `-X` turns it off).
    pub make_links: bool,
}

fn file_type(kind: u8) -> libc::mode_t {
    match kind {
        libc::DT_LNK => libc::S_IFLNK,
        libc::DT_REG => libc::S_IFREG,
        libc::DT_DIR => libc::S_IFDIR,
        _ => 0,
    }
}

impl Scanner<'_> {
    /// Scans `config.dirs[index]`. With `subdirs`, legacy hwcap subdirectories found are
    /// appended to `config.dirs` (ldconfig scans them after the configured ones).
    pub fn search_dir(&self, config: &mut Config, index: usize, subdirs: bool, scan: &mut Scan) {
        self.search(config, index, subdirs, None, scan);
    }

    /// Scans only the names in `only` of `config.dirs[index]`, and the links that lead to
    /// them (by plain names, to a fixpoint; a link whose target has a `/` is scanned too):
    /// what update-ldcache rescans in a folder whose other entries it keeps from the image's
    /// cache. `None` when the directory could not be read.
    pub fn search_dir_only(
        &self,
        config: &mut Config,
        index: usize,
        only: &HashSet<Vec<u8>>,
        scan: &mut Scan,
    ) -> Option<Listing> {
        self.search(config, index, false, Some(only), scan)
    }

    fn search(
        &self,
        config: &mut Config,
        index: usize,
        subdirs: bool,
        only: Option<&HashSet<Vec<u8>>>,
        scan: &mut Scan,
    ) -> Option<Listing> {
        let dir = config.dirs[index].clone();
        let Ok(Some(fd)) = self.root.open_dir(&dir.path, false) else {
            return None;
        };
        let (mut dlibs, created, mut listed) = self.scan_once(
            &dir,
            fd.as_fd(),
            config,
            subdirs,
            self.make_links,
            only,
            scan,
        );
        if created {
            // See the module documentation: index the links just made, in this run.
            let again = self.scan_once(&dir, fd.as_fd(), config, false, false, only, scan);
            (dlibs, listed) = (again.0, again.2.or(listed));
        }
        let hwcap = if dir.hwcaps.is_none() {
            path_hwcap(self.arch, &dir.path)
        } else {
            0
        };
        // ldconfig pushes each new library at the head of its list, then walks the list.
        for (seq, d) in dlibs.into_iter().rev().enumerate() {
            let filename = if dir.hwcaps.is_none() {
                &d.soname
            } else {
                &d.name
            };
            scan.entries.push((
                CacheEntry {
                    flags: d.flag,
                    name: d.soname.clone(),
                    path: join(&dir.path, filename),
                    os_version: 0,
                    hwcap,
                    hwcaps: dir.hwcaps.clone(),
                    isa_level: 0,
                },
                index,
                seq,
            ));
        }
        listed
    }

    /// One pass over a directory (over `only` and the links to it, when given). Returns the
    /// libraries in insertion order, whether any SONAME link was created and, with `only`,
    /// the names listed and looked at.
    #[allow(clippy::too_many_arguments)]
    fn scan_once(
        &self,
        dir: &Dir,
        fd: BorrowedFd,
        config: &mut Config,
        subdirs: bool,
        make_links: bool,
        only: Option<&HashSet<Vec<u8>>>,
        scan: &mut Scan,
    ) -> (Vec<Dlib>, bool, Option<Listing>) {
        // The first pass lists the directory just opened; the second starts it again.
        let listing = if make_links {
            root::read_dir_fresh(fd)
        } else {
            root::read_dir(fd)
        };
        let entries = match listing {
            Ok(e) => e,
            Err(e) => {
                scan.warnings
                    .push(format!("{}: {e}", self.root.display(&dir.path)));
                return (Vec::new(), false, None);
            }
        };
        let mut ctx = DirScan {
            fd,
            arch: self.arch,
            kinds: entries.iter().map(|e| (e.name.clone(), e.kind)).collect(),
            locals: HashMap::new(),
            links: HashMap::new(),
            seen: HashMap::new(),
        };
        let include = only.map(|only| self.looked_at(dir, &mut ctx, only));
        let mut dlibs: Vec<Dlib> = Vec::new();
        for ent in entries {
            if include.as_ref().is_some_and(|i| !i.contains(&ent.name[..])) {
                continue;
            }
            if !matches!(
                ent.kind,
                libc::DT_UNKNOWN | libc::DT_LNK | libc::DT_REG | libc::DT_DIR
            ) {
                continue;
            }
            let name = ent.name.as_slice();
            if !is_dso(name)
                && (ent.kind == libc::DT_REG
                    || (dir.hwcaps.is_none() && !is_hwcap_platform(self.arch, name)))
            {
                continue;
            }
            if is_prelink_temp(name) {
                continue;
            }
            let mode = if ent.kind != libc::DT_UNKNOWN {
                file_type(ent.kind)
            } else {
                match root::lstatat(fd, name) {
                    Ok(st) => st.st_mode & libc::S_IFMT,
                    Err(_) => continue,
                }
            };
            let is_link = mode == libc::S_IFLNK;
            if mode != libc::S_IFREG && mode != libc::S_IFDIR && !is_link {
                continue;
            }
            // What the entry is, links followed inside the root. A dangling link is skipped
            // (ldconfig would also delete a stale `*.so.*` one).
            let Some(target) = self.resolve(dir, &mut ctx, name, mode) else {
                continue;
            };
            if dir.hwcaps.is_none()
                && root::is_dir(&target.st)
                && is_hwcap_platform(self.arch, name)
            {
                if subdirs {
                    config.add_single_dir(Dir {
                        path: join(&dir.path, name),
                        dev: target.st.st_dev,
                        ino: target.st.st_ino,
                        flag: dir.flag,
                        hwcaps: None,
                    });
                }
                continue;
            }
            if !root::is_regular(&target.st) {
                continue;
            }
            let Some(info) = self.inspect(&mut ctx, &target) else {
                continue;
            };
            let mut soname = info.soname.unwrap_or_else(|| name.to_vec());
            // "If the path the link points to isn't its soname or it is not the .so symlink
            // for ld(1), we treat it as a normal file." With ldconfig chrooted, the path it
            // compares is the link's own name.
            let mut link = is_link;
            if link && name != soname && !(name.ends_with(b".so") && soname.starts_with(name)) {
                link = false;
            }
            if link {
                soname = name.to_vec();
            }
            let mut flag = info.flags;
            if flag == FLAG_ELF && (dir.flag == FLAG_ELF_LIBC5 || dir.flag == FLAG_ELF_LIBC6) {
                flag = dir.flag;
            }
            if let Some(d) = dlibs.iter_mut().find(|d| d.soname == soname) {
                // Prefer a file to a link, otherwise the newer name.
                if (!link && d.is_link)
                    || (link == d.is_link && libcmp(&d.name, name) == std::cmp::Ordering::Less)
                {
                    if d.flag != flag {
                        // ldconfig takes the newer file's type when one of the two is plain
                        // ELF and the other libc5/libc6 (either way round).
                        let libc = |f: i32| f == FLAG_ELF_LIBC5 || f == FLAG_ELF_LIBC6;
                        if (d.flag == FLAG_ELF && libc(flag)) || (libc(d.flag) && flag == FLAG_ELF)
                        {
                            d.flag = flag;
                        } else {
                            scan.warnings.push(format!(
                                "libraries {} and {} in directory {} have same soname but different type",
                                String::from_utf8_lossy(&d.name),
                                String::from_utf8_lossy(name),
                                String::from_utf8_lossy(&dir.path)
                            ));
                        }
                    }
                    d.name = name.to_vec();
                    d.is_link = link;
                }
            } else {
                dlibs.push(Dlib {
                    name: name.to_vec(),
                    soname,
                    flag,
                    is_link: link,
                });
            }
        }
        let mut created = false;
        if make_links && dir.hwcaps.is_none() {
            for d in dlibs.iter().rev().filter(|d| !d.is_link) {
                // The common case, read during the scan: the link is already right.
                if ctx.links.get(&d.soname).map(Vec::as_slice) == Some(d.name.as_slice()) {
                    continue;
                }
                match self.create_link(dir, fd, &d.name, &d.soname) {
                    Ok(true) => {
                        created = true;
                        let link = join(&dir.path, &d.soname);
                        scan.links.push(String::from_utf8_lossy(&link).into_owned());
                    }
                    Ok(false) => {}
                    Err(e) => scan.warnings.push(e),
                }
            }
        }
        let listed = include.map(|looked_at| Listing {
            names: ctx.kinds.into_keys().collect(),
            looked_at,
        });
        (dlibs, created, listed)
    }

    /// What a scan restricted to `only` must look at: `only`, and the names ldconfig files a
    /// library of `only` under, its SONAME and a development name (`*.so`) the SONAME starts
    /// with, so that no other link of the directory is read (a Debian image's folder has 50).
    /// Where a library of `only` has no SONAME (ldconfig then files it under the name of each
    /// link to it) or the listing could not type a name: every link leading to `only`
    /// ([`DirScan::leading_to`]).
    fn looked_at(&self, dir: &Dir, ctx: &mut DirScan, only: &HashSet<Vec<u8>>) -> HashSet<Vec<u8>> {
        if ctx.kinds.values().any(|&k| k == libc::DT_UNKNOWN) {
            return ctx.leading_to(only);
        }
        let mut sonames: Vec<Vec<u8>> = Vec::new();
        for name in only {
            let Some(&kind) = ctx.kinds.get(name) else {
                continue;
            };
            let Some(target) = self.resolve(dir, ctx, name, file_type(kind)) else {
                continue;
            };
            if !root::is_regular(&target.st) {
                continue;
            }
            match self.inspect(ctx, &target) {
                Some(elf::DsoInfo {
                    soname: Some(soname),
                    ..
                }) => sonames.push(soname),
                Some(_) => return ctx.leading_to(only),
                None => {}
            }
        }
        let mut include: HashSet<Vec<u8>> = only.clone();
        for name in ctx.kinds.keys() {
            let files_under =
                |s: &Vec<u8>| s == name || (name.ends_with(b".so") && s.starts_with(name));
            if sonames.iter().any(files_under) {
                include.insert(name.clone());
            }
        }
        include
    }

    /// Resolves a directory entry. Links whose targets are plain names are followed with
    /// `readlinkat`/`fstatat` in the directory (the usual `libfoo.so.1 -> libfoo.so.1.2.3`);
    /// any other target is resolved from the root ([`Root::open_at`]).
    fn resolve(
        &self,
        dir: &Dir,
        ctx: &mut DirScan,
        name: &[u8],
        mode: libc::mode_t,
    ) -> Option<Target> {
        if mode != libc::S_IFLNK {
            let st = ctx.local(name)?.st;
            return Some(Target {
                st,
                local: Some(name.to_vec()),
                path: join(&dir.path, name),
            });
        }
        let mut current = name.to_vec();
        for _ in 0..MAX_LOCAL_LINKS {
            let target = match ctx.links.get(&current) {
                Some(t) if current == name => t.clone(),
                _ => root::readlinkat(ctx.fd, &current).ok()?,
            };
            if current == name {
                ctx.links.insert(name.to_vec(), target.clone());
            }
            let plain =
                !target.is_empty() && !target.contains(&b'/') && target != b"." && target != b"..";
            if !plain {
                break;
            }
            let next = target;
            let st = ctx.local(&next)?.st;
            if !root::is_symlink(&st) {
                return Some(Target {
                    st,
                    path: join(&dir.path, &next),
                    local: Some(next),
                });
            }
            current = next;
        }
        // A target with a '/' (or a long chain): from the root, as ldconfig in its chroot.
        let path = join(&dir.path, name);
        let st = self.root.stat(&path).ok()??;
        Some(Target {
            st,
            local: None,
            path,
        })
    }

    /// The ELF information of a resolved regular file, read once.
    fn inspect(&self, ctx: &mut DirScan, target: &Target) -> Option<elf::DsoInfo> {
        if let Some(local) = &target.local {
            if let Some(info) = ctx.local(local).and_then(|l| l.info) {
                return info;
            }
        }
        let id = (target.st.st_dev, target.st.st_ino);
        if let Some(info) = ctx.seen.get(&id) {
            return info.clone();
        }
        let file = match &target.local {
            // A regular file the listing did not type (DT_UNKNOWN): lstat said regular.
            Some(local) => File::from(
                root::openat(
                    ctx.fd,
                    local,
                    libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY,
                    0,
                )
                .ok()?,
            ),
            None => self.root.open_regular(&target.path).ok()??.0,
        };
        // The file opened must be the regular file that was looked at.
        let st = root::fstat(file.as_fd()).ok()?;
        if (st.st_dev, st.st_ino) != id || !root::is_regular(&st) {
            return None;
        }
        let info = elf::inspect(&file, st.st_size as u64, self.arch);
        ctx.seen.insert(id, info.clone());
        info
    }

    /// ldconfig's `create_links`: makes `dir/soname` a symlink to `libname` unless it already
    /// resolves to the same file, or is a real file. Returns whether a link was made.
    fn create_link(
        &self,
        dir: &Dir,
        fd: BorrowedFd,
        libname: &[u8],
        soname: &[u8],
    ) -> Result<bool, String> {
        if soname == libname {
            return Ok(false);
        }
        let full_soname = join(&dir.path, soname);
        let full_lib = join(&dir.path, libname);
        if soname.is_empty() || soname == b"." || soname == b".." || soname.contains(&b'/') {
            return Err(format!(
                "{}: SONAME {:?} is not a file name; no link made",
                self.root.display(&full_lib),
                String::from_utf8_lossy(soname)
            ));
        }
        if let Ok(Some(so)) = self.root.stat(&full_soname) {
            match self.root.stat(&full_lib) {
                Ok(Some(lib)) if (lib.st_dev, lib.st_ino) == (so.st_dev, so.st_ino) => {
                    return Ok(false)
                }
                Ok(Some(_)) => {}
                _ => return Err(format!("can't stat {}", self.root.display(&full_lib))),
            }
            if let Ok(st) = root::lstatat(fd, soname) {
                if !root::is_symlink(&st) {
                    return Err(format!(
                        "{} is not a symbolic link",
                        self.root.display(&full_soname)
                    ));
                }
            }
        }
        root::replace_symlink(fd, soname, libname)
            .map(|()| true)
            .map_err(|e| {
                format!(
                    "can't link {} to {}: {e}",
                    self.root.display(&full_soname),
                    String::from_utf8_lossy(libname)
                )
            })
    }
}

impl Scanner<'_> {
    /// Scans `dirs` (root-relative, in order) that exist, each directory once however many
    /// names reach it (`lib64 -> lib`), as ldconfig identifies directories by inode; no
    /// configuration file and no hwcap subdirectories. What a hook scans for the folders it
    /// mounted, and host discovery for a driver directory without ld.so.cache.
    pub fn scan_dirs<'d>(&self, dirs: impl IntoIterator<Item = &'d str>) -> (Config, Scan) {
        let mut config = Config::default();
        let mut scan = Scan::default();
        for dir in dirs {
            let Ok(Some(st)) = self.root.stat(dir) else {
                continue;
            };
            if config.find(st.st_dev, st.st_ino).is_some() {
                continue;
            }
            config.dirs.push(Dir {
                path: dir.as_bytes().to_vec(),
                dev: st.st_dev,
                ino: st.st_ino,
                flag: -1,
                hwcaps: None,
            });
            let index = config.dirs.len() - 1;
            self.search_dir(&mut config, index, false, &mut scan);
        }
        (config, scan)
    }
}

/// Builds the list of directories and scans all of them: what `ldconfig -r ROOT` does.
pub fn full_scan(scanner: &Scanner, config: &mut Config) -> Scan {
    let mut scan = Scan::default();
    let mut i = 0;
    while i < config.dirs.len() {
        scanner.search_dir(config, i, true, &mut scan);
        i += 1;
    }
    scan
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnmatch_basics() {
        assert!(fnmatch(b"*.conf", b"libc.conf"));
        assert!(!fnmatch(b"*.conf", b".hidden.conf"));
        assert!(fnmatch(b".*.conf", b".hidden.conf"));
        assert!(!fnmatch(b"*.conf", b"libc.conf.bak"));
        assert!(fnmatch(b"x86_64-*.conf", b"x86_64-linux-gnu.conf"));
        assert!(fnmatch(b"[0-9][0-9]-*", b"00-nvshim.conf"));
        assert!(!fnmatch(b"[!0-9]*", b"00-nvshim.conf"));
        assert!(fnmatch(b"a?c", b"abc"));
        assert!(fnmatch(b"a\\*c", b"a*c"));
        assert!(!fnmatch(b"a\\*c", b"abc"));
        assert!(fnmatch(b"*a*b*", b"xxaxxbxx"));
        assert!(fnmatch(b"[", b"["));
    }

    /// ldconfig's built-in directories per machine: Debian's multiarch ones, else what each
    /// machine's `add_system_dir` makes of `slibdir=/lib64` (x86-64: `libx32`; aarch64:
    /// `libilp32`).
    #[test]
    fn system_dirs_per_machine() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::open(dir.path()).unwrap();
        assert_eq!(
            system_dirs(&root, Arch::Aarch64),
            [
                "/lib",
                "/lib64",
                "/libilp32",
                "/usr/lib",
                "/usr/lib64",
                "/usr/libilp32"
            ]
        );
        assert_eq!(
            system_dirs(&root, Arch::X86_64),
            [
                "/lib",
                "/lib64",
                "/libx32",
                "/usr/lib",
                "/usr/lib64",
                "/usr/libx32"
            ]
        );
        std::fs::create_dir(dir.path().join("etc")).unwrap();
        std::fs::write(dir.path().join("etc/debian_version"), "12.0\n").unwrap();
        assert_eq!(
            system_dirs(&root, Arch::Aarch64),
            [
                "/lib/aarch64-linux-gnu",
                "/usr/lib/aarch64-linux-gnu",
                "/lib",
                "/usr/lib"
            ]
        );
    }

    #[test]
    fn dso_names() {
        for yes in [
            "libcuda.so.1",
            "libc.so",
            "ld-linux-x86-64.so.2",
            "ld.so.1",
            "ld64.so.2",
            "libfoo.so.1.2.3",
        ] {
            assert!(is_dso(yes.as_bytes()), "{yes}");
        }
        for no in ["cuda.so", "libfoo.a", "lib", "ld.so", "README"] {
            assert!(!is_dso(no.as_bytes()), "{no}");
        }
    }

    #[test]
    fn hwcap_paths() {
        let a = Arch::X86_64;
        assert_eq!(path_hwcap(a, b"/usr/lib/x86_64-linux-gnu"), 0);
        assert_eq!(path_hwcap(a, b"/lib/tls"), 1 << 63);
        assert_eq!(path_hwcap(a, b"/lib/haswell"), 1 << 50);
        assert_eq!(path_hwcap(a, b"/lib/x86_64"), 1 << 1);
        assert_eq!(path_hwcap(a, b"/lib/haswell/x86_64"), (1 << 50) + (1 << 1));
        assert!(is_hwcap_platform(a, b"tls"));
        assert!(is_hwcap_platform(a, b"x86_64"));
        assert!(!is_hwcap_platform(a, b"sse2"));
        assert!(!is_hwcap_platform(a, b"x86_64-linux-gnu"));
    }

    #[test]
    fn prelink_temporaries() {
        assert!(is_prelink_temp(b"libfoo.so.1.#prelink#"));
        assert!(is_prelink_temp(b"libfoo.so.1.#prelink#.abc123"));
        assert!(!is_prelink_temp(b"libfoo.so.1"));
    }
}
