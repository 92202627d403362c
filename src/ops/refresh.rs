//! `nvshim cdi refresh`: keeps the node's own spec (`/var/run/cdi/nvidia.yaml`) current.
//!
//! Run at boot before the engines, by udev when the driver binds a GPU, when the config or the
//! kernel's modules change, and every 30 s by a timer (packaging/systemd), so it must be cheap
//! when nothing changed and never harm a node:
//! - the driver not loaded: nothing is written or removed (an engine finding no spec fails
//!   loudly; a spec removed under a running pod would not). With `wait`, and an NVIDIA display
//!   device on the PCI bus (sysfs `vendor` 0x10de, `class` 0x03xxxx), it first waits that long
//!   for the module to load, so a boot-time run ordered before the engines has a spec for them;
//!   without such a device it does not wait at all.
//! - a YAML spec whose stamp line ([`freshness::HostView::stamp`]: driver version, GPU set,
//!   MIG layout, device majors and nodes, read from `/proc` and `/dev`, no NVML; and the
//!   generate options, the profile among them) is the host's and options' now is left alone
//!   without parsing it; one without it that parses and is fresh by
//!   [`freshness`] (also device numbers and library files, by `stat`) is left alone without
//!   generating when it is JSON (no comment to hold a stamp), and regenerated once to carry
//!   the stamp when it is YAML; `force` skips these shortcuts (package upgrades use it: a new
//!   nvshim may write a different spec for the same host).
//! - otherwise the spec is generated and written atomically only when its bytes differ, so
//!   consumers watching the directory (containerd, CRI-O, DRA drivers) see no event for an
//!   identical file.
//! - only `output` is ever written; nothing else in its directory is touched, so specs of DRA
//!   drivers and device plugins beside it stay as their producers wrote them.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use thiserror::Error;

use super::freshness::{self, HostView};
use super::generate::{self, GenerateError};
use crate::cdi::spec;
use crate::host::Host;

/// The node's spec, where NVIDIA's packages keep theirs.
pub const DEFAULT_OUTPUT: &str = "/var/run/cdi/nvidia.yaml";

#[derive(Debug, Error)]
pub enum RefreshError {
    #[error("refreshing {}: {source}", path.display())]
    Generate {
        path: PathBuf,
        #[source]
        source: Box<GenerateError>,
    },
    #[error("cannot refresh {}: {source}", path.display())]
    Output {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What to refresh, and how.
#[derive(Debug, Clone)]
pub struct Options {
    pub output: PathBuf,
    /// Regenerate even when the spec is fresh.
    pub force: bool,
    /// How long to wait for the driver to load when an NVIDIA GPU is on the PCI bus.
    pub wait: Duration,
    pub generate: generate::Options,
}

/// What a refresh did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The driver is not loaded (after waiting `waited`): nothing written.
    DriverNotLoaded { waited: Duration },
    /// The spec was fresh; nothing generated.
    Fresh,
    /// Generated, and identical to the file: nothing written.
    Unchanged { reasons: Vec<String> },
    /// Written, because of `reasons` (empty with `force` or a missing file).
    Written {
        reasons: Vec<String>,
        devices: usize,
        created: bool,
    },
}

/// Refreshes `opts.output` for `host`.
pub fn refresh(
    host: &Host,
    opts: &Options,
    progress: &mut dyn FnMut(&str),
) -> Result<Outcome, RefreshError> {
    let err = |source| RefreshError::Generate {
        path: opts.output.clone(),
        source: Box::new(source),
    };
    let start = Instant::now();
    if !wait_for_driver(host, opts.wait) {
        return Ok(Outcome::DriverNotLoaded {
            waited: start.elapsed(),
        });
    }
    // A FIFO or device there is refused before anything reads it (it would block or never
    // end); a symlink is followed, and its target written ([`crate::atomic::target`]).
    let target = crate::atomic::target(&opts.output).map_err(|source| RefreshError::Output {
        path: opts.output.clone(),
        source,
    })?;
    let (existing, unreadable) = match crate::hostfile::read(&target, spec::MAX_SPEC_BYTES) {
        Ok(bytes) => (Some(bytes), None),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (None, None),
        Err(e) => (None, Some(e)),
    };
    let format = spec::Format::for_path(&opts.output);
    // Read before generating: a host that changes meanwhile leaves an older stamp, so the
    // next refresh looks again.
    let view = HostView::read(host);
    let stamp = (format == spec::Format::Yaml).then(|| view.stamp(host, &opts.generate));
    let stamped = |bytes: &[u8]| stamp.is_some() && freshness::stamp_of(bytes) == stamp;
    if !opts.force && existing.as_deref().is_some_and(stamped) {
        return Ok(Outcome::Fresh);
    }
    let reasons = match existing.as_deref().map(spec::parse) {
        None => match unreadable {
            Some(e) => vec![format!("cannot be read: {e}")],
            None => vec!["does not exist".to_string()],
        },
        Some(Err(e)) => vec![format!("does not parse: {e}")],
        Some(Ok(current)) => {
            let reasons = freshness::stale_reasons(&current, &view);
            match (reasons.is_empty() && !opts.force, stamp) {
                (false, _) => reasons,
                (true, None) => return Ok(Outcome::Fresh),
                (true, Some(_)) => {
                    vec!["its host-state line is not this host's and options' now".to_string()]
                }
            }
        }
    };
    let discovery = generate::discover_with_progress(host, progress).map_err(err)?;
    let inv = generate::read_inventory(host).map_err(err)?;
    let spec = generate::generate_with_progress(&inv, &discovery, &opts.generate, progress)
        .map_err(err)?;
    let text = generate::render(&spec, format);
    let text = match stamp {
        Some(s) => freshness::stamped(&text, s),
        None => text,
    };
    if existing.as_deref() == Some(text.as_bytes()) {
        return Ok(Outcome::Unchanged { reasons });
    }
    generate::write_atomically(&opts.output, &text).map_err(err)?;
    Ok(Outcome::Written {
        reasons,
        devices: spec.devices.len(),
        created: existing.is_none(),
    })
}

/// `reasons` for one log line: the first few, and how many there are in all (a driver upgrade
/// finds every library of the old driver, some sixty lines).
pub fn summary(reasons: &[String]) -> String {
    const SHOWN: usize = 2;
    let mut out = reasons
        .iter()
        .take(SHOWN)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join("; ");
    if reasons.len() > SHOWN {
        out.push_str(&format!(
            "; and {} more ({} findings, `nvshim doctor` lists them)",
            reasons.len() - SHOWN,
            reasons.len()
        ));
    }
    out
}

/// Whether the driver is loaded, waiting up to `wait` for it when an NVIDIA display device is
/// on the PCI bus (a GPU whose module has not loaded yet).
fn wait_for_driver(host: &Host, wait: Duration) -> bool {
    let loaded = || host.driver_version().is_ok();
    if loaded() {
        return true;
    }
    if wait.is_zero() || !nvidia_pci_display_device(&host.sys_root()) {
        return false;
    }
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        if loaded() {
            return true;
        }
    }
    false
}

/// An NVIDIA (vendor 0x10de) display-class (0x03xxxx: VGA, 3D controller) PCI device in
/// `<sys>/bus/pci/devices`.
pub fn nvidia_pci_display_device(sys: &Path) -> bool {
    let read = |p: PathBuf| {
        crate::hostfile::read_to_string(&p, crate::hostfile::KERNEL_FILE_LIMIT).unwrap_or_default()
    };
    std::fs::read_dir(sys.join("bus/pci/devices"))
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| {
            read(e.path().join("vendor")).trim() == "0x10de"
                && read(e.path().join("class")).trim().starts_with("0x03")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A driver upgrade's findings (a mount per library of the old driver, as
    /// `registry::stale_library_mounts` words them) make one short line with their count.
    #[test]
    fn many_reasons_are_summarised() {
        let reasons: Vec<String> = (0..62)
            .map(|i| {
                format!(
                    "mounts /usr/lib/x86_64-linux-gnu/libnvidia-lib{i}.so.570.133.20 of driver \
                     570.133.20, but driver 580.95.05 is running"
                )
            })
            .collect();
        let line = summary(&reasons);
        assert!(line.len() < 300, "{} bytes: {line}", line.len());
        assert!(line.starts_with(&reasons[0]), "{line}");
        assert!(
            line.ends_with("; and 60 more (62 findings, `nvshim doctor` lists them)"),
            "{line}"
        );
        assert_eq!(summary(&reasons[..2]), reasons[..2].join("; "));
        assert_eq!(summary(&[]), "");
    }

    #[test]
    fn pci_display_devices_are_recognised() {
        let dir = tempfile::tempdir().unwrap();
        let dev = |bus: &str, vendor: &str, class: &str| {
            let d = dir.path().join("bus/pci/devices").join(bus);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("vendor"), format!("{vendor}\n")).unwrap();
            std::fs::write(d.join("class"), format!("{class}\n")).unwrap();
        };
        assert!(!nvidia_pci_display_device(dir.path()));
        // An ASPEED BMC display and an NVIDIA bridge (ConnectX-class devices are not NVIDIA's id).
        dev("0000:02:00.0", "0x1a03", "0x030000");
        dev("0000:05:00.0", "0x10de", "0x068000");
        assert!(!nvidia_pci_display_device(dir.path()));
        dev("0000:3b:00.0", "0x10de", "0x030200");
        assert!(nvidia_pci_display_device(dir.path()));
    }
}
