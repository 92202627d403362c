//! Whether a CDI spec still describes this host: one definition for `nvshim doctor`, which
//! reports it, and `nvshim cdi refresh`, which regenerates a spec only when it finds something.
//!
//! Everything here is read from `/proc`, `/dev` and the spec, never from NVML, so a check costs
//! a few file reads: the refresh timer (packaging/systemd) runs it every 30 s, and MIG
//! reconfigurations are noticed that way because procfs gives inotify no events.
//!
//! What makes a spec stale:
//! - the file-level findings of [`registry::stale_spec`]: device numbers that moved, device
//!   nodes that vanished, library mounts of another driver version or missing;
//! - for `nvidia.com/gpu`, the GPU set: a device named by UUID or index for a GPU the host does
//!   not have, or a host GPU (not serving MIG devices) the spec names no device for;
//! - the MIG layout: a MIG device whose compute instance no longer exists, or an instance the
//!   driver lists in `capabilities/gpu<N>/mig/gi<G>/ci<C>` that no device carries (instances
//!   are matched through their `nvidia-cap<N>` nodes and `nvidia-caps/mig-minors`);
//! - a spec with no devices.
//!
//! Parsing a generated spec for these checks cost about as much as generating it (callgrind,
//! release build, the 8-GPU fake host of scripts/bench.sh and its 42 KB spec: 11.9 M
//! instructions for a refresh of a current spec, 12.3 M for `cdi generate`; 0.84 M with the
//! stamp below), so a YAML spec nvshim writes starts with a
//! comment holding [`HostView::stamp`], a hash of the host facts above as they were read
//! before the spec was generated; `nvshim cdi refresh` compares it with a fresh stamp and
//! parses the spec only when they differ. What the stamp cannot see, the full check still
//! does where it runs (`nvshim doctor`, a refresh whose stamp differs): a library file
//! removed while the same driver stays loaded.

use crate::cdi::registry;
use crate::cdi::spec::Spec;
use crate::host::{Gpu, Host};

/// How the stamp line of a spec starts.
const STAMP_PREFIX: &str = "# nvshim host state: ";

/// The host facts a spec is compared with: a snapshot, so callers decide when to read it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostView {
    /// The loaded driver's version; `None` when it is not loaded (or its banner is unreadable).
    pub driver_version: Option<String>,
    pub gpus: Vec<Gpu>,
    /// (GPU minor, GPU instance, compute instance), as [`Host::mig_instances`].
    pub mig_instances: Vec<(u32, u32, u32)>,
    /// `nvidia-caps/mig-minors`: capability path and minor, as [`Host::mig_minors`].
    pub mig_minors: Vec<(String, u32)>,
}

impl HostView {
    /// Reads the host; what cannot be read is left empty (the checks then find nothing about
    /// it rather than inventing differences).
    pub fn read(host: &Host) -> HostView {
        HostView {
            driver_version: host.driver_version().ok(),
            gpus: host.gpus().unwrap_or_default(),
            mig_instances: host.mig_instances(),
            mig_minors: host.mig_minors().unwrap_or_default(),
        }
    }

    /// A hash of what a spec generated now is checked against: this view, the NVIDIA lines of
    /// `/proc/devices` (device majors) and the names of the NVIDIA nodes in `/dev` and
    /// `/dev/nvidia-caps` (nodes gone or added), and the options it is generated with (a
    /// `profile` changed in the config makes the spec stale). A few reads, no NVML.
    pub fn stamp(&self, host: &Host, opts: &super::generate::Options) -> u64 {
        let roots = host.roots();
        // The view's and the options' Debug text: every field, in order, and nothing else.
        let mut text = format!("{self:?}\n{opts:?}\n");
        let devices = crate::hostfile::read_to_string(
            &roots.proc_root.join("devices"),
            crate::hostfile::KERNEL_FILE_LIMIT,
        )
        .unwrap_or_default();
        for line in devices.lines().filter(|l| l.contains("nvidia")) {
            text.push_str(line);
            text.push('\n');
        }
        for dir in [
            roots.dev_root.join("dev"),
            roots.dev_root.join("dev/nvidia-caps"),
        ] {
            let mut names: Vec<String> = std::fs::read_dir(&dir)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("nvidia"))
                .collect();
            names.sort();
            text.push_str(&names.join(" "));
            text.push('\n');
        }
        crate::cache::hash(text.as_bytes())
    }

    fn minor_of(&self, cap: &str) -> Option<u32> {
        self.mig_minors
            .iter()
            .find(|(c, _)| c == cap)
            .map(|(_, m)| *m)
    }
}

/// `text` (a YAML spec) with the stamp line first.
pub fn stamped(text: &str, stamp: u64) -> String {
    format!("{STAMP_PREFIX}{stamp:016x}\n{text}")
}

/// The stamp on the first line of a spec's bytes, if it has one.
pub fn stamp_of(bytes: &[u8]) -> Option<u64> {
    let line = bytes.split(|b| *b == b'\n').next()?;
    let hex = std::str::from_utf8(line).ok()?.strip_prefix(STAMP_PREFIX)?;
    u64::from_str_radix(hex, 16).ok()
}

/// Everything that makes `spec` stale on the host `view` describes, each finding once, in a
/// stable order; empty when the spec is current.
pub fn stale_reasons(spec: &Spec, view: &HostView) -> Vec<String> {
    let mut out = registry::stale_spec(spec, view.driver_version.as_deref());
    if spec.devices.is_empty() {
        out.push("has no devices".to_string());
    }
    if spec.kind == "nvidia.com/gpu" {
        out.extend(gpu_set(spec, view));
        out.extend(mig_layout(spec, view));
    }
    out
}

/// A UUID the driver has not read from the GPU yet: `/proc` shows question marks until the GPU
/// is initialised (no persistence daemon).
fn uuid_known(uuid: &str) -> bool {
    uuid.starts_with("GPU-") && !uuid.contains('?')
}

fn gpu_set(spec: &Spec, view: &HostView) -> Vec<String> {
    let mut out = Vec::new();
    if view.gpus.is_empty() {
        return out;
    }
    let names: Vec<&str> = spec.devices.iter().map(|d| d.name.as_str()).collect();
    // GPUs serving MIG devices appear through those only (as `cdi generate` writes them).
    let with_mig: Vec<u32> = view.mig_instances.iter().map(|(m, _, _)| *m).collect();
    let full: Vec<&Gpu> = view
        .gpus
        .iter()
        .filter(|g| !with_mig.contains(&g.minor))
        .collect();
    let uuids_known = view.gpus.iter().all(|g| uuid_known(&g.uuid));
    let by_uuid = names.iter().any(|n| n.starts_with("GPU-"));
    if by_uuid && uuids_known {
        for n in names.iter().filter(|n| n.starts_with("GPU-")) {
            if !view.gpus.iter().any(|g| g.uuid == *n) {
                out.push(format!("has device {n}, a GPU this host does not have"));
            }
        }
        for g in &full {
            if !names.contains(&g.uuid.as_str()) {
                out.push(format!("lacks this host's GPU {}", g.uuid));
            }
        }
    }
    let indices: Vec<usize> = names.iter().filter_map(|n| n.parse().ok()).collect();
    if !indices.is_empty() {
        for i in indices.iter().filter(|i| **i >= view.gpus.len()) {
            out.push(format!(
                "has device {i}, but this host has {} GPUs",
                view.gpus.len()
            ));
        }
        for g in &full {
            if !indices.contains(&g.index) {
                out.push(format!(
                    "lacks device {} for this host's GPU {}",
                    g.index, g.bus_id
                ));
            }
        }
    }
    out
}

/// The minor in `/dev/nvidia-caps/nvidia-cap<N>`.
fn cap_minor(path: &str) -> Option<u32> {
    path.strip_prefix("/dev/nvidia-caps/nvidia-cap")?
        .parse()
        .ok()
}

fn mig_layout(spec: &Spec, view: &HostView) -> Vec<String> {
    let mut out = Vec::new();
    if view.mig_minors.is_empty() || view.driver_version.is_none() {
        return out;
    }
    let in_spec: Vec<u32> = spec
        .devices
        .iter()
        .flat_map(|d| &d.container_edits.device_nodes)
        .filter_map(|n| cap_minor(&n.path))
        .collect();
    for (g, gi, ci) in &view.mig_instances {
        let cap = format!("gpu{g}/gi{gi}/ci{ci}/access");
        if let Some(minor) = view.minor_of(&cap) {
            if !in_spec.contains(&minor) {
                out.push(format!("lacks MIG device gpu{g}/gi{gi}/ci{ci}"));
            }
        }
    }
    // Compute-instance capabilities the spec carries for instances that are gone.
    for (cap, minor) in &view.mig_minors {
        let Some(rest) = cap.strip_suffix("/access") else {
            continue;
        };
        let ids: Vec<u32> = rest
            .split('/')
            .filter_map(|p| {
                p.strip_prefix("gpu")
                    .or_else(|| p.strip_prefix("gi"))
                    .or_else(|| p.strip_prefix("ci"))
                    .and_then(|n| n.parse().ok())
            })
            .collect();
        let [g, gi, ci] = ids[..] else {
            continue;
        };
        if in_spec.contains(minor) && !view.mig_instances.contains(&(g, gi, ci)) {
            out.push(format!(
                "has MIG device gpu{g}/gi{gi}/ci{ci}, which no longer exists"
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdi::spec::Device;
    use crate::edits::{ContainerEdits, DeviceNode};

    fn gpu(index: usize, minor: u32, uuid: &str) -> Gpu {
        Gpu {
            index,
            minor,
            uuid: uuid.into(),
            bus_id: format!("0000:{:02x}:00.0", 0x10 + index),
            model: "NVIDIA H100 80GB HBM3".into(),
        }
    }

    fn device(name: &str, caps: &[u32]) -> Device {
        Device {
            name: name.into(),
            container_edits: ContainerEdits {
                device_nodes: caps
                    .iter()
                    .map(|c| DeviceNode {
                        path: format!("/dev/nvidia-caps/nvidia-cap{c}"),
                        // A node that exists, so only the MIG comparison speaks.
                        host_path: Some("/dev/null".into()),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn spec(devices: Vec<Device>) -> Spec {
        Spec {
            cdi_version: "0.5.0".into(),
            kind: "nvidia.com/gpu".into(),
            devices,
            ..Default::default()
        }
    }

    fn view() -> HostView {
        HostView {
            driver_version: Some("580.95.05".into()),
            gpus: vec![gpu(0, 1, "GPU-a"), gpu(1, 0, "GPU-b")],
            ..Default::default()
        }
    }

    #[test]
    fn current_gpu_set_is_fresh() {
        let s = spec(vec![
            device("0", &[]),
            device("1", &[]),
            device("GPU-a", &[]),
            device("GPU-b", &[]),
            device("all", &[]),
        ]);
        assert_eq!(stale_reasons(&s, &view()), Vec::<String>::new());
    }

    #[test]
    fn gpus_added_and_removed_are_named() {
        let s = spec(vec![
            device("0", &[]),
            device("2", &[]),
            device("GPU-z", &[]),
        ]);
        let r = stale_reasons(&s, &view());
        assert!(
            r.contains(&"has device GPU-z, a GPU this host does not have".into()),
            "{r:?}"
        );
        assert!(r.contains(&"lacks this host's GPU GPU-a".into()), "{r:?}");
        assert!(
            r.contains(&"has device 2, but this host has 2 GPUs".into()),
            "{r:?}"
        );
        assert!(
            r.contains(&"lacks device 1 for this host's GPU 0000:11:00.0".into()),
            "{r:?}"
        );
    }

    #[test]
    fn unread_uuids_are_not_compared() {
        let mut v = view();
        v.gpus[1].uuid = "GPU-????????-????-????-????-????????????".into();
        let s = spec(vec![device("GPU-a", &[]), device("GPU-old", &[])]);
        assert_eq!(stale_reasons(&s, &v), Vec::<String>::new());
    }

    #[test]
    fn empty_spec_is_stale() {
        assert_eq!(
            stale_reasons(&spec(vec![]), &view()),
            vec!["has no devices"]
        );
    }

    #[test]
    fn mig_layout_changes_are_found() {
        let mut v = view();
        // GPU minor 1 (index 0) serves MIG devices; its full-GPU names are not expected.
        v.mig_minors = vec![
            ("config".into(), 1),
            ("gpu1/gi1/access".into(), 10),
            ("gpu1/gi1/ci0/access".into(), 11),
            ("gpu1/gi2/access".into(), 20),
            ("gpu1/gi2/ci0/access".into(), 21),
        ];
        v.mig_instances = vec![(1, 1, 0), (1, 2, 0)];
        let current = spec(vec![
            device("1", &[]),
            device("0:0", &[10, 11]),
            device("0:1", &[20, 21]),
        ]);
        assert_eq!(stale_reasons(&current, &v), Vec::<String>::new());
        // gi2 destroyed, gi3 created in its place.
        v.mig_minors.push(("gpu1/gi3/ci0/access".into(), 31));
        v.mig_instances = vec![(1, 1, 0), (1, 3, 0)];
        assert_eq!(
            stale_reasons(&current, &v),
            vec![
                "lacks MIG device gpu1/gi3/ci0",
                "has MIG device gpu1/gi2/ci0, which no longer exists"
            ]
        );
    }

    #[test]
    fn stamp_line_round_trips() {
        let text = stamped("---\ncdiVersion: 0.5.0\n", 0x0123_4567_89ab_cdef);
        assert!(
            text.starts_with("# nvshim host state: 0123456789abcdef\n---\n"),
            "{text}"
        );
        assert_eq!(stamp_of(text.as_bytes()), Some(0x0123_4567_89ab_cdef));
        assert_eq!(stamp_of(b"---\ncdiVersion: 0.5.0\n"), None);
        assert_eq!(stamp_of(b"# nvshim host state: xyz\n"), None);
        // A spec with the line still parses.
        crate::cdi::spec::parse(
            stamped("---\ncdiVersion: 0.5.0\nkind: v.com/d\ndevices: []\n", 1).as_bytes(),
        )
        .unwrap();
    }

    #[test]
    fn other_kinds_are_only_checked_for_files() {
        let mut s = spec(vec![device("channel0", &[])]);
        s.kind = "nvidia.com/imex-channel".into();
        assert_eq!(stale_reasons(&s, &view()), Vec::<String>::new());
    }
}
