//! The in-container checker: a busybox `sh` script that prints one parseable line per fact, and
//! the parser and assertions over what it printed.
//!
//! This plays the part of youki's static `runtimetest` binary: it runs as the container's process,
//! observes from inside, and the test decides. The same script runs against plain runc on a
//! hand-edited config.json (proving the assertions detect a GPU when one is there and its absence
//! when not) and against nvshim.
//!
//! Lines printed (fields separated by single spaces):
//!
//! ```text
//! DEV <path> <c|d|f|...> <major hex> <minor hex> <open result>   each /dev/nvidia* entry, and
//!                                                                those in /dev/nvidia-caps,
//!                                                                /dev/nvidia-caps-imex-channels
//!                                                                and /dev/infiniband, /dev/gdrdrv
//! CGROUP <type> <major>:<minor> <access>                         /sys/fs/cgroup/devices/devices.list
//! MKNOD <major>:<minor> <open result>                            a node made with mknod, then opened
//! MOUNT <destination> <fstype> <options>                         /proc/mounts
//! WRITE <destination> <open result>                              open(O_APPEND) of file mounts under /usr, /lib
//! FILE <path> / LINK <path> <target>                             driver libraries (64- and 32-bit),
//!                                                                binaries, firmware, graphics
//!                                                                manifests, X.Org modules, profiles,
//!                                                                GDS's /etc/cufile.json, /run/udev
//! SOCK <path>                                                    the driver daemons' sockets
//! DRI <path> <major hex> <minor hex> <gid>                       /dev/dri card and render nodes
//! GROUPS <gid> ...                                               `id -G` of the process
//! LDP <line>                                                     `ldconfig -p`
//! SMI <line> / SMI_RC <code>                                     `nvidia-smi`, when present
//! ENV <key>=<value>                                              NVIDIA_* / CUDA_* / NVCT_* env
//! PROBE_DONE
//! ```
//!
//! Open results: `OK`, `EPERM`, `ENXIO`, `ENOENT`, `EROFS`, `EACCES`, `ENODEV`, `OTHER:<msg>`.
//! Nodes are made in `/dev` (a tmpfs without `nodev`): with runc's default `root.readonly: true`,
//! `/tmp` is read-only.
//!
//! One file (690 lines of code, 50 of tests): the script's line format and the parser of those
//! lines must change together, and the assertions read only what the parser built
//! ([`ProbeReport`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use crate::host::{FakeGpu, FakeHost, NVIDIACTL_MINOR, NVIDIA_MAJOR};

const SCRIPT_HEAD: &str = r#"
classify() {
    case "$1" in
        *"Operation not permitted"*) echo EPERM ;;
        *"No such device or address"*) echo ENXIO ;;
        *"No such file or directory"*) echo ENOENT ;;
        *"Read-only file system"*) echo EROFS ;;
        *"Permission denied"*) echo EACCES ;;
        *"No such device"*) echo ENODEV ;;
        *) echo "OTHER:$(echo "$1" | tr ' \n' '__')" ;;
    esac
}
tryopen() { if out=$(dd if="$1" of=/dev/null bs=1 count=0 2>&1); then echo OK; else classify "$out"; fi; }
trywrite() { if out=$( (: >> "$1") 2>&1); then echo OK; else classify "$out"; fi; }
for f in /dev/nvidia* /dev/nvidia-caps/* /dev/nvidia-caps-imex-channels/* /dev/infiniband/* /dev/gdrdrv; do
    [ -e "$f" ] || continue
    if [ -c "$f" ]; then
        echo "DEV $f c $(stat -c '%t %T' "$f") $(tryopen "$f")"
    elif [ -d "$f" ]; then
        echo "DEV $f d 0 0 -"
    else
        echo "DEV $f f 0 0 -"
    fi
done
if [ -r /sys/fs/cgroup/devices/devices.list ]; then
    while read -r l; do echo "CGROUP $l"; done < /sys/fs/cgroup/devices/devices.list
else
    echo "CGROUP_UNAVAILABLE"
fi
mk() {
    p="/dev/nvshim-probe-$1-$2"
    if out=$(mknod "$p" c "$1" "$2" 2>&1); then
        echo "MKNOD $1:$2 $(tryopen "$p")"
        rm -f "$p"
    else
        echo "MKNOD $1:$2 MKNOD_FAILED:$(classify "$out")"
    fi
}
"#;

const SCRIPT_TAIL: &str = r#"
while read -r src dst fs opts rest; do
    echo "MOUNT $dst $fs $opts"
    case "$dst" in
        /usr/*|/lib/*|/lib64/*|/opt/*) [ -f "$dst" ] && echo "WRITE $dst $(trywrite "$dst")" ;;
    esac
done < /proc/mounts
for f in /usr/lib/x86_64-linux-gnu/* /usr/lib/x86_64-linux-gnu/vdpau/* /usr/lib64/* \
         /usr/lib/x86_64-linux-gnu/gbm/* /usr/lib/x86_64-linux-gnu/nvidia/xorg/* \
         /usr/lib64/gbm/* /usr/lib64/vdpau/* /usr/lib64/xorg/modules/*/* \
         /usr/lib/i386-linux-gnu/* /usr/lib/i386-linux-gnu/vdpau/* /usr/lib/* /usr/lib/vdpau/* \
         /usr/local/nvidia/lib64/* /usr/local/nvidia/lib/* /lib64/* /lib/* \
         /usr/bin/nvidia* /lib/firmware/nvidia/*/* /usr/lib/firmware/nvidia/*/* \
         /usr/share/glvnd/egl_vendor.d/* /usr/share/egl/egl_external_platform.d/* \
         /etc/vulkan/icd.d/* /etc/vulkan/implicit_layer.d/* /usr/share/vulkansc/icd.d/* \
         /etc/OpenCL/vendors/* /usr/share/nvidia/* /usr/share/X11/xorg.conf.d/* \
         /etc/nvidia/nvidia-application-profiles-rc.d/* /dev/dri/by-path/* \
         /etc/cufile.json /run/udev; do
    if [ -S "$f" ]; then
        echo "SOCK $f"
    elif [ -L "$f" ]; then
        echo "LINK $f $(readlink "$f")"
    elif [ -e "$f" ]; then
        echo "FILE $f"
    fi
done
for f in /run/nvidia-persistenced/* /run/nvidia-fabricmanager/*; do
    [ -S "$f" ] && echo "SOCK $f"
done
for f in /dev/dri/card* /dev/dri/renderD*; do
    [ -c "$f" ] && echo "DRI $f $(stat -c '%t %T %g' "$f")"
done
echo "GROUPS $(id -G)"
if [ -x /sbin/ldconfig ]; then
    /sbin/ldconfig -p 2>&1 | while IFS= read -r l; do echo "LDP $l"; done
fi
if [ -e /usr/bin/nvidia-smi ]; then
    out=$(/usr/bin/nvidia-smi 2>&1)
    rc=$?
    echo "$out" | while IFS= read -r l; do echo "SMI $l"; done
    echo "SMI_RC $rc"
fi
env | grep -E '^(NVIDIA_|CUDA_|NVCT_)' | while IFS= read -r l; do echo "ENV $l"; done
echo PROBE_DONE
"#;

/// What the probe script should try beyond its fixed checks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProbeSpec {
    /// `(major, minor)` char nodes to `mknod` in `/dev` and open: a denied device gives `EPERM`,
    /// an allowed one without a driver `ENXIO`.
    pub mknod: Vec<(u32, u32)>,
}

impl ProbeSpec {
    /// Probes `mknod` for every GPU minor of the host (selected ones should open or give
    /// `ENXIO`, the others `EPERM`).
    pub fn for_host(host: &FakeHost) -> ProbeSpec {
        ProbeSpec {
            mknod: host
                .gpus()
                .iter()
                .map(|g| (NVIDIA_MAJOR, g.minor))
                .collect(),
        }
    }

    /// The script text, for `sh -c`.
    pub fn script(&self) -> String {
        let mut s = String::from(SCRIPT_HEAD);
        for (major, minor) in &self.mknod {
            let _ = writeln!(s, "mk {major} {minor}");
        }
        s.push_str(SCRIPT_TAIL);
        s
    }

    /// `["sh", "-c", <script>]`, for `process.args`.
    pub fn args(&self) -> Vec<String> {
        vec!["sh".into(), "-c".into(), self.script()]
    }
}

/// A `/dev/nvidia*` entry seen in the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceEntry {
    pub path: String,
    /// `c` for a char device, `d` directory, `f` anything else.
    pub kind: String,
    pub major: u32,
    pub minor: u32,
    /// Result of opening it (see the module docs).
    pub open: String,
}

/// One line of `devices.list`: `c 195:1 rwm`, `a *:* rwm`. `None` = `*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupRule {
    pub kind: char,
    pub major: Option<u32>,
    pub minor: Option<u32>,
    pub access: String,
}

/// One line of `/proc/mounts`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub destination: String,
    pub fstype: String,
    pub options: Vec<String>,
}

impl MountEntry {
    /// Mounted read-only.
    pub fn is_readonly(&self) -> bool {
        self.options.iter().any(|o| o == "ro")
    }
}

/// Everything the probe printed, parsed.
#[derive(Debug, Clone, Default)]
pub struct ProbeReport {
    pub devices: BTreeMap<String, DeviceEntry>,
    /// `None` if the devices cgroup was not readable.
    pub cgroup: Option<Vec<CgroupRule>>,
    pub mknod: BTreeMap<(u32, u32), String>,
    pub mounts: Vec<MountEntry>,
    pub writes: BTreeMap<String, String>,
    /// Regular files (and other non-links) found.
    pub files: BTreeSet<String>,
    /// Symlinks found, with their targets.
    pub links: BTreeMap<String, String>,
    /// `ldconfig -p`: library name → path (first entry wins).
    pub ldcache: BTreeMap<String, String>,
    pub ldconfig_lines: Vec<String>,
    pub smi: Vec<String>,
    pub smi_rc: Option<i32>,
    pub env: BTreeMap<String, String>,
    /// Unix sockets found.
    pub sockets: BTreeSet<String>,
    /// `/dev/dri` character devices: path → (major, minor, gid).
    pub dri: BTreeMap<String, (u32, u32, u32)>,
    /// The process's groups (`id -G`).
    pub groups: Vec<u32>,
    /// The script reached its last line.
    pub complete: bool,
    /// The text parsed.
    pub raw: String,
}

fn parse_rule(line: &str) -> Option<CgroupRule> {
    let mut parts = line.split_whitespace();
    let kind = parts.next()?.chars().next()?;
    let (major, minor) = parts.next()?.split_once(':')?;
    let num = |s: &str| {
        if s == "*" {
            Ok(None)
        } else {
            s.parse().map(Some)
        }
    };
    Some(CgroupRule {
        kind,
        major: num(major).ok()?,
        minor: num(minor).ok()?,
        access: parts.next()?.to_string(),
    })
}

impl ProbeReport {
    /// Parses the probe's stdout. Lines it does not know are ignored.
    pub fn parse(stdout: &str) -> ProbeReport {
        let mut r = ProbeReport {
            raw: stdout.to_string(),
            ..ProbeReport::default()
        };
        for line in stdout.lines() {
            let (tag, rest) = line.split_once(' ').unwrap_or((line, ""));
            match tag {
                "DEV" => {
                    let f: Vec<&str> = rest.split(' ').collect();
                    if let [path, kind, major, minor, open] = f[..] {
                        r.devices.insert(
                            path.to_string(),
                            DeviceEntry {
                                path: path.to_string(),
                                kind: kind.to_string(),
                                major: u32::from_str_radix(major, 16).unwrap_or(u32::MAX),
                                minor: u32::from_str_radix(minor, 16).unwrap_or(u32::MAX),
                                open: open.to_string(),
                            },
                        );
                    }
                }
                "CGROUP" => {
                    if let Some(rule) = parse_rule(rest) {
                        r.cgroup.get_or_insert_with(Vec::new).push(rule);
                    }
                }
                "MKNOD" => {
                    if let Some((dev, result)) = rest.split_once(' ') {
                        if let Some((ma, mi)) = dev.split_once(':') {
                            if let (Ok(ma), Ok(mi)) = (ma.parse(), mi.parse()) {
                                r.mknod.insert((ma, mi), result.to_string());
                            }
                        }
                    }
                }
                "MOUNT" => {
                    let f: Vec<&str> = rest.split(' ').collect();
                    if let [dst, fstype, opts] = f[..] {
                        r.mounts.push(MountEntry {
                            destination: dst.to_string(),
                            fstype: fstype.to_string(),
                            options: opts.split(',').map(str::to_string).collect(),
                        });
                    }
                }
                "WRITE" => {
                    if let Some((dst, result)) = rest.split_once(' ') {
                        r.writes.insert(dst.to_string(), result.to_string());
                    }
                }
                "FILE" => {
                    r.files.insert(rest.to_string());
                }
                "LINK" => {
                    if let Some((path, target)) = rest.split_once(' ') {
                        r.links.insert(path.to_string(), target.to_string());
                    }
                }
                "LDP" => {
                    r.ldconfig_lines.push(rest.to_string());
                    // "\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1"
                    if let (Some((name, _)), Some((_, path))) =
                        (rest.trim().split_once(" ("), rest.split_once(" => "))
                    {
                        r.ldcache
                            .entry(name.to_string())
                            .or_insert_with(|| path.trim().to_string());
                    }
                }
                "SMI" => r.smi.push(rest.to_string()),
                "SMI_RC" => r.smi_rc = rest.trim().parse().ok(),
                "ENV" => {
                    if let Some((k, v)) = rest.split_once('=') {
                        r.env.insert(k.to_string(), v.to_string());
                    }
                }
                "SOCK" => {
                    r.sockets.insert(rest.to_string());
                }
                "DRI" => {
                    let f: Vec<&str> = rest.split(' ').collect();
                    if let [path, major, minor, gid] = f[..] {
                        let hex = |s: &str| u32::from_str_radix(s, 16).unwrap_or(u32::MAX);
                        r.dri.insert(
                            path.to_string(),
                            (hex(major), hex(minor), gid.parse().unwrap_or(u32::MAX)),
                        );
                    }
                }
                "GROUPS" => {
                    r.groups = rest
                        .split_whitespace()
                        .filter_map(|g| g.parse().ok())
                        .collect();
                }
                "PROBE_DONE" => r.complete = true,
                _ => {}
            }
        }
        r
    }

    /// `/dev/nvidia<N>` entries (GPU nodes), by path.
    pub fn gpu_nodes(&self) -> Vec<&DeviceEntry> {
        self.devices
            .values()
            .filter(|d| {
                d.path
                    .strip_prefix("/dev/nvidia")
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            })
            .collect()
    }

    /// Whether one `devices.list` rule grants all of `access` on `kind major:minor` (cgroup v1
    /// semantics: `a` matches any type, `*` any number). False if the cgroup was unreadable.
    pub fn cgroup_allows(&self, kind: char, major: u32, minor: u32, access: &str) -> bool {
        self.cgroup.as_ref().is_some_and(|rules| {
            rules.iter().any(|r| {
                (r.kind == 'a' || r.kind == kind)
                    && r.major.is_none_or(|m| m == major)
                    && r.minor.is_none_or(|m| m == minor)
                    && access.chars().all(|c| r.access.contains(c))
            })
        })
    }

    /// The last mount at `destination` (the one in effect).
    pub fn mount(&self, destination: &str) -> Option<&MountEntry> {
        self.mounts
            .iter()
            .rev()
            .find(|m| m.destination == destination)
    }

    /// Mounts that look like NVIDIA driver files (libraries, binaries, firmware, devices).
    pub fn nvidia_mounts(&self) -> Vec<&MountEntry> {
        self.mounts
            .iter()
            .filter(|m| {
                let d = m.destination.to_ascii_lowercase();
                ["nvidia", "cuda", "nvcuvid", "nvoptix", "vdpau"]
                    .iter()
                    .any(|k| d.contains(k))
            })
            .collect()
    }

    /// Files or links whose name starts with `<stem>.so` anywhere the probe looked.
    pub fn library_entries(&self, stem: &str) -> Vec<String> {
        let prefix = format!("{stem}.so");
        self.files
            .iter()
            .chain(self.links.keys())
            .filter(|p| {
                p.rsplit('/')
                    .next()
                    .is_some_and(|name| name.starts_with(&prefix))
            })
            .cloned()
            .collect()
    }

    fn base_problems(&self) -> Vec<String> {
        if self.complete {
            Vec::new()
        } else {
            vec!["the probe did not print PROBE_DONE (did the container run?)".to_string()]
        }
    }

    /// Problems with the GPU device nodes: exactly `selected` are present at `/dev/nvidia<minor>`
    /// with 195:minor, allowed `rw` in the cgroup and openable (or `ENXIO`, never `EPERM`); every
    /// other GPU of `host` is absent and denied, and a node made for it with mknod gives `EPERM`.
    pub fn gpu_problems(&self, host: &FakeHost, selected: &[&FakeGpu]) -> Vec<String> {
        let mut p = self.base_problems();
        let want: BTreeSet<String> = selected
            .iter()
            .map(|g| format!("/dev/nvidia{}", g.minor))
            .collect();
        let have: BTreeSet<String> = self.gpu_nodes().iter().map(|d| d.path.clone()).collect();
        if want != have {
            p.push(format!("GPU nodes: expected {want:?}, found {have:?}"));
        }
        if self.cgroup.is_none() {
            p.push("the devices cgroup (devices.list) was not readable".to_string());
        }
        for g in selected {
            let path = format!("/dev/nvidia{}", g.minor);
            if let Some(d) = self.devices.get(&path) {
                if d.kind != "c" || d.major != NVIDIA_MAJOR || d.minor != g.minor {
                    p.push(format!(
                        "{path} is {} {}:{}, expected c {NVIDIA_MAJOR}:{}",
                        d.kind, d.major, d.minor, g.minor
                    ));
                }
                if d.open != "OK" && d.open != "ENXIO" {
                    p.push(format!(
                        "opening {path} gave {}, expected OK or ENXIO",
                        d.open
                    ));
                }
            }
            if !self.cgroup_allows('c', NVIDIA_MAJOR, g.minor, "rw") {
                p.push(format!(
                    "devices.list does not allow c {NVIDIA_MAJOR}:{} rw",
                    g.minor
                ));
            }
            if let Some(r) = self.mknod.get(&(NVIDIA_MAJOR, g.minor)) {
                if r != "OK" && r != "ENXIO" {
                    p.push(format!(
                        "a mknod'ed node for the selected GPU {NVIDIA_MAJOR}:{} gave {r}, expected ENXIO",
                        g.minor
                    ));
                }
            }
        }
        for g in host.gpus() {
            if selected.iter().any(|s| s.minor == g.minor) {
                continue;
            }
            if self.cgroup.is_some() && self.cgroup_allows('c', NVIDIA_MAJOR, g.minor, "r") {
                p.push(format!(
                    "devices.list allows the unselected GPU c {NVIDIA_MAJOR}:{}",
                    g.minor
                ));
            }
            if let Some(r) = self.mknod.get(&(NVIDIA_MAJOR, g.minor)) {
                if r != "EPERM" {
                    p.push(format!(
                        "a mknod'ed node for the unselected GPU {NVIDIA_MAJOR}:{} gave {r}, expected EPERM",
                        g.minor
                    ));
                }
            }
        }
        p
    }

    /// Problems with the control nodes every GPU container gets: `/dev/nvidiactl` (195:255) and
    /// `/dev/nvidia-uvm` (uvm:0) present, allowed and not `EPERM`.
    pub fn control_device_problems(&self, host: &FakeHost) -> Vec<String> {
        let mut p = self.base_problems();
        for (path, major, minor) in [
            ("/dev/nvidiactl", NVIDIA_MAJOR, NVIDIACTL_MINOR),
            ("/dev/nvidia-uvm", host.spec().uvm_major, 0),
        ] {
            match self.devices.get(path) {
                None => p.push(format!("{path} is missing")),
                Some(d) => {
                    if d.kind != "c" || d.major != major || d.minor != minor {
                        p.push(format!(
                            "{path} is {} {}:{}, expected c {major}:{minor}",
                            d.kind, d.major, d.minor
                        ));
                    }
                    if d.open == "EPERM" {
                        p.push(format!("opening {path} gave EPERM"));
                    }
                }
            }
            if !self.cgroup_allows('c', major, minor, "rw") {
                p.push(format!("devices.list does not allow c {major}:{minor} rw"));
            }
        }
        p
    }

    /// Problems with one driver library: present at its host path (minus the root), mounted
    /// read-only there, and not writable.
    pub fn library_mounted_problems(&self, host: &FakeHost, stem: &str) -> Vec<String> {
        let mut p = self.base_problems();
        let path = host.container_lib_path(stem);
        if !self.files.contains(&path) {
            p.push(format!("{path} is missing"));
        }
        match self.mount(&path) {
            None => p.push(format!("{path} is not a mount point")),
            Some(m) if !m.is_readonly() => p.push(format!(
                "{path} is mounted without ro: {}",
                m.options.join(",")
            )),
            Some(_) => {}
        }
        match self.writes.get(&path).map(String::as_str) {
            None => p.push(format!(
                "{path} was not tried for writing (not a file mount?)"
            )),
            Some("OK") => p.push(format!("{path} could be opened for writing")),
            Some(_) => {}
        }
        p
    }

    /// Problems if any file of library `stem` is visible.
    pub fn library_absent_problems(&self, stem: &str) -> Vec<String> {
        let mut p = self.base_problems();
        let found = self.library_entries(stem);
        if !found.is_empty() {
            p.push(format!("{stem} should be absent, found {found:?}"));
        }
        p
    }

    /// Problems if `ldconfig -p` does not list `soname`.
    pub fn ldcache_problems(&self, soname: &str) -> Vec<String> {
        let mut p = self.base_problems();
        if !self.ldcache.contains_key(soname) {
            p.push(format!(
                "ldconfig -p does not list {soname} (it printed: {:?})",
                self.ldconfig_lines
            ));
        }
        p
    }

    /// Problems if `nvidia-smi` did not list exactly `gpus` (given in bus order), or printed
    /// `No devices found.` when `gpus` is empty.
    pub fn smi_problems(&self, gpus: &[&FakeGpu]) -> Vec<String> {
        let mut p = self.base_problems();
        let want: Vec<String> = if gpus.is_empty() {
            vec!["No devices found.".to_string()]
        } else {
            gpus.iter()
                .enumerate()
                .map(|(i, g)| format!("GPU {i}: {} (UUID: {})", g.model, g.uuid))
                .collect()
        };
        if self.smi_rc.is_none() {
            p.push("nvidia-smi did not run (/usr/bin/nvidia-smi missing?)".to_string());
        } else if self.smi != want {
            p.push(format!(
                "nvidia-smi printed {:?}, expected {want:?}",
                self.smi
            ));
        }
        p
    }

    /// What the container sees of the NVIDIA devices, as one comparable value: nodes with
    /// their numbers, the NVIDIA cgroup rules, the env, the NVIDIA mounts (ro or not), and the
    /// ld cache entries of NVIDIA libraries. Two runtimes given the same device (podman and
    /// nvshim-runtime on one CDI spec) must agree on it.
    pub fn nvidia_view(&self, host: &FakeHost) -> serde_json::Value {
        let majors = [NVIDIA_MAJOR, host.spec().uvm_major, host.spec().caps_major];
        let devices: Vec<String> = self
            .devices
            .values()
            .map(|d| format!("{} {} {}:{}", d.path, d.kind, d.major, d.minor))
            .collect();
        let mut cgroup: Vec<String> = self
            .cgroup
            .iter()
            .flatten()
            .filter(|c| c.major.is_some_and(|m| majors.contains(&m)))
            .map(|c| {
                let n = |v: Option<u32>| v.map_or("*".to_string(), |v| v.to_string());
                format!("{} {}:{} {}", c.kind, n(c.major), n(c.minor), c.access)
            })
            .collect();
        cgroup.sort();
        let mut mounts: Vec<String> = self
            .nvidia_mounts()
            .iter()
            .map(|m| format!("{} ro={}", m.destination, m.is_readonly()))
            .collect();
        mounts.sort();
        let ld: Vec<String> = self
            .ldcache
            .iter()
            .filter(|(k, _)| k.contains("nvidia") || k.contains("cuda"))
            .map(|(k, v)| format!("{k} => {v}"))
            .collect();
        serde_json::json!({"devices": devices, "cgroup": cgroup, "env": self.env, "mounts": mounts, "ldcache": ld})
    }

    /// Problems if anything NVIDIA is visible: `/dev/nvidia*`, a cgroup rule for major 195 or the
    /// uvm major, an NVIDIA mount, a driver library or binary, `libcuda` in the ld cache.
    pub fn no_nvidia_problems(&self, host: &FakeHost) -> Vec<String> {
        let mut p = self.base_problems();
        if !self.devices.is_empty() {
            let found: Vec<&String> = self.devices.keys().collect();
            p.push(format!("NVIDIA device nodes present: {found:?}"));
        }
        if let Some(rules) = &self.cgroup {
            for r in rules {
                if r.major == Some(NVIDIA_MAJOR) || r.major == Some(host.spec().uvm_major) {
                    p.push(format!(
                        "devices.list has an NVIDIA rule: {} {:?}:{:?} {}",
                        r.kind, r.major, r.minor, r.access
                    ));
                }
            }
        }
        let mounts: Vec<&String> = self
            .nvidia_mounts()
            .iter()
            .map(|m| &m.destination)
            .collect();
        if !mounts.is_empty() {
            p.push(format!("NVIDIA mounts present: {mounts:?}"));
        }
        let files: Vec<&String> = self.files.iter().chain(self.links.keys()).collect();
        if !files.is_empty() {
            p.push(format!("driver files present: {files:?}"));
        }
        if self
            .ldcache
            .keys()
            .any(|k| k.contains("nvidia") || k.contains("cuda"))
        {
            p.push("the ld cache lists NVIDIA libraries".to_string());
        }
        p
    }
}

/// Panics with every problem and the probe's full output if `problems` is not empty.
#[track_caller]
pub fn assert_no_problems(what: &str, problems: &[String], report: &ProbeReport) {
    if !problems.is_empty() {
        panic!(
            "{what}: {} problem(s):\n  - {}\n--- probe output ---\n{}",
            problems.len(),
            problems.join("\n  - "),
            report.raw
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_probe_lines() {
        let r = ProbeReport::parse(
            "DEV /dev/nvidia0 c c3 0 ENXIO\n\
             DEV /dev/nvidia-uvm c 1fc 0 ENXIO\n\
             CGROUP c 195:0 rwm\n\
             CGROUP c *:* m\n\
             MKNOD 195:1 EPERM\n\
             MOUNT /usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06 ext4 ro,nosuid,nodev,relatime\n\
             WRITE /usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06 EROFS\n\
             LDP 2 libs found in cache `/etc/ld.so.cache'\n\
             LDP \tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1\n\
             SMI GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\n\
             SMI_RC 0\n\
             ENV NVIDIA_VISIBLE_DEVICES=1\n\
             PROBE_DONE\n",
        );
        assert!(r.complete);
        assert_eq!(r.gpu_nodes().len(), 1);
        assert_eq!(r.devices["/dev/nvidia-uvm"].major, 508);
        assert!(r.cgroup_allows('c', 195, 0, "rw"));
        assert!(!r.cgroup_allows('c', 195, 1, "r"));
        assert!(r.cgroup_allows('c', 195, 1, "m"));
        assert_eq!(r.mknod[&(195, 1)], "EPERM");
        assert!(r
            .mount("/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06")
            .unwrap()
            .is_readonly());
        assert_eq!(
            r.ldcache["libcuda.so.1"],
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
        );
        assert_eq!(r.smi_rc, Some(0));
        assert_eq!(r.env["NVIDIA_VISIBLE_DEVICES"], "1");
    }

    #[test]
    fn wildcard_rules_match() {
        let r = ProbeReport::parse("CGROUP a *:* rwm\n");
        assert!(r.cgroup_allows('c', 195, 7, "rwm"));
        assert!(r.cgroup_allows('b', 8, 0, "r"));
    }
}
