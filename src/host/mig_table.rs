//! The minors of MIG capabilities from the driver's own table,
//! `/proc/driver/nvidia-caps/mig-minors`, kept in `cache-dir` as the grid it is.
//!
//! The driver publishes there the minor of every MIG capability it can make, for 32 GPUs
//! whatever is installed: `config`, `monitor`, then per GPU and GPU instance its `access` and
//! its compute instances' (tests/fixtures/host/h200-mig-minors.txt, copied from the lent H200:
//! 4,322 lines). Opening it cost that driver 2.9 ms (it writes the whole table at open), a
//! capability's own file under `driver/nvidia/capabilities` 11 µs to read and 1.9 µs to
//! `stat`. A create used to read those files and keep each minor with its file's key, so that
//! a MIG `all` create on 8 GPUs × 7 MIG devices `stat`ed 112 of them: 0.45 ms of its time on
//! the bench's simulated host (paired, 400 rounds, against answering without them).
//!
//! The table is a grid: `minor = base + gpu × per_gpu + gi × per_gi`, plus `1 + ci` for a
//! compute instance, where `per_gi` is one more than the compute instances per GPU instance
//! and `per_gpu` is `per_gi` times the GPU instances per GPU. [`MigTable::parse`] takes a table
//! only when every line is such a cell, each cell is there once and holds that minor, and
//! `config` and `monitor` are there once; a table that is not (no driver writes one) is kept
//! as such, and each create reads the capabilities' own files then (`Host::capability_minors`).
//!
//! The grid is kept while the table's file gives the [`Key`] it had when read, a key more than
//! [`cache::RACY_NS`] old (`src/cache.rs`): procfs stamps the file when the driver makes it (at
//! module load), so a reloaded driver shows a new key; a simulated host's table rewritten in
//! place shows a new size or mtime. The table is read only when the cache can keep what it
//! gives (its key old enough, `cache-dir` writable): otherwise the capabilities' own files are
//! cheaper for any create (a MIG device's two, or `all`'s 112 at 11 µs, against 2.9 ms).
//! Which MIG instances exist is not in the table: the create lists them
//! (`driver/nvidia/capabilities/gpu<N>/mig`) or NVML's cached answer names them.

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::cache::{self, Key};

const MAGIC: &[u8] = b"nvshim-mig-minors 1\n";

/// A driver's `mig-minors` table as the grid it follows (module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct MigTable {
    config: u32,
    monitor: u32,
    /// The minor of `gpu0/gi0/access`.
    base: u32,
    gpus: u32,
    gpu_instances: u32,
    compute_instances: u32,
}

/// A MIG capability as `mig-minors` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cap {
    Config,
    Monitor,
    /// `gpu<gpu>/gi<gi>/access`, or with `ci`, `gpu<gpu>/gi<gi>/ci<ci>/access`.
    Instance {
        gpu: u32,
        gi: u32,
        ci: Option<u32>,
    },
}

impl Cap {
    /// Parsed by byte, not with `split_once`: a MIG `all` create on 8 GPUs × 7 MIG devices
    /// asks for 112 names, whose substring searches cost it 140,000 instructions (callgrind).
    fn parse(name: &str) -> Option<Cap> {
        match name {
            "config" => return Some(Cap::Config),
            "monitor" => return Some(Cap::Monitor),
            _ => {}
        }
        let (gpu, rest) = leading_number(name.strip_prefix("gpu")?)?;
        let (gi, rest) = leading_number(rest.strip_prefix("/gi")?)?;
        let ci = match rest {
            "/access" => None,
            _ => match leading_number(rest.strip_prefix("/ci")?)? {
                (ci, "/access") => Some(ci),
                _ => return None,
            },
        };
        Some(Cap::Instance { gpu, gi, ci })
    }
}

/// The [`number`] `text` starts with, and what follows it.
fn leading_number(text: &str) -> Option<(u32, &str)> {
    let end = text
        .bytes()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(text.len());
    // `end` is an ASCII byte's index (or the end): a `str` boundary.
    Some((number(&text[..end])?, &text[end..]))
}

/// A number as the driver writes one: decimal digits, no sign, no leading zero.
fn number(text: &str) -> Option<u32> {
    let digits = !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
    (digits && (text == "0" || !text.starts_with('0')))
        .then(|| text.parse().ok())
        .flatten()
}

impl MigTable {
    /// The grid of table `text` (`<capability> <minor>` lines); `None` when it is not one
    /// (module doc).
    pub(super) fn parse(text: &str) -> Option<MigTable> {
        let (mut config, mut monitor) = (None, None);
        let (mut gpus, mut gpu_instances, mut compute_instances) = (0u32, 0u32, 0u32);
        let mut cells = Vec::with_capacity(text.len() / 20);
        for line in cache::split(text, b'\n') {
            let line = line.trim_ascii();
            if line.is_empty() {
                continue;
            }
            let (cap, minor) = super::mig_minors_words(line)?;
            let minor = number(minor)?;
            match Cap::parse(cap)? {
                Cap::Config if config.replace(minor).is_some() => return None,
                Cap::Monitor if monitor.replace(minor).is_some() => return None,
                Cap::Config | Cap::Monitor => {}
                Cap::Instance { gpu, gi, ci } => {
                    gpus = gpus.max(gpu.checked_add(1)?);
                    gpu_instances = gpu_instances.max(gi.checked_add(1)?);
                    if let Some(ci) = ci {
                        compute_instances = compute_instances.max(ci.checked_add(1)?);
                    }
                    cells.push((gpu, gi, ci, minor));
                }
            }
        }
        let mut table = MigTable {
            config: config?,
            monitor: monitor?,
            base: 0,
            gpus,
            gpu_instances,
            compute_instances,
        };
        let size = usize::try_from(table.per_gpu()?.checked_mul(gpus)?).ok()?;
        if cells.len() != size {
            return None;
        }
        table.base = cells
            .iter()
            .find(|&&(gpu, gi, ci, _)| (gpu, gi, ci) == (0, 0, None))?
            .3;
        let mut seen = vec![false; size];
        for (gpu, gi, ci, minor) in cells {
            let cell = table.cell(gpu, gi, ci)?;
            if std::mem::replace(&mut seen[cell as usize], true)
                || table.base.checked_add(cell) != Some(minor)
            {
                return None;
            }
        }
        Some(table)
    }

    /// The minor of capability `name` (as `mig-minors` names it); `None` when it is not in the
    /// table.
    pub(super) fn minor(&self, name: &str) -> Option<u32> {
        match Cap::parse(name)? {
            Cap::Config => Some(self.config),
            Cap::Monitor => Some(self.monitor),
            Cap::Instance { gpu, gi, ci } => self.base.checked_add(self.cell(gpu, gi, ci)?),
        }
    }

    fn per_gpu(&self) -> Option<u32> {
        self.gpu_instances
            .checked_mul(self.compute_instances.checked_add(1)?)
    }

    /// The cell's offset from `base`; `None` outside the grid.
    fn cell(&self, gpu: u32, gi: u32, ci: Option<u32>) -> Option<u32> {
        if gpu >= self.gpus
            || gi >= self.gpu_instances
            || ci.is_some_and(|c| c >= self.compute_instances)
        {
            return None;
        }
        let per_gi = self.compute_instances + 1;
        let own = ci.map_or(0, |c| c + 1);
        gpu.checked_mul(self.per_gpu()?)?
            .checked_add(gi.checked_mul(per_gi)?)?
            .checked_add(own)
    }
}

/// The grid of the table at `path` (`<proc-root>/driver/nvidia-caps/mig-minors`) through
/// `cache_dir`: `Some(None)` when the table is not a grid, `None` when there is no table or it
/// is not read now (module doc); `read_at` is now, in ns since the epoch.
pub(super) fn table(path: &Path, cache_dir: &Path, read_at: i64) -> Option<Option<MigTable>> {
    let key = Key::at(path)?;
    let mut key_text = Vec::with_capacity(64);
    cache::key_fields(&key, &mut key_text);
    let file = cache_dir.join(format!(
        "mig-minors-{:016x}",
        cache::hash(path.as_os_str().as_bytes())
    ));
    let kept = cache::read_private(&file, "MIG minors cache");
    if let Some(hit) = kept.as_deref().and_then(|b| decode(b, &key_text)) {
        return Some(hit);
    }
    let writable = nix::unistd::access(cache_dir, nix::unistd::AccessFlags::W_OK).is_ok();
    if !key.trusted_at(read_at) || !writable {
        return None;
    }
    let text = super::read_kernel_file(path).ok()?;
    let table = MigTable::parse(&text);
    // Kept only when the file is the one `stat`ed before it was read.
    if Key::at(path) == Some(key) {
        if let Err(e) = cache::write_private(cache_dir, &file, &encode(&key_text, table)) {
            tracing::debug!("MIG minors cache {} not written: {e}", file.display());
        }
    }
    Some(table)
}

/// One line: the table's key, then the grid's numbers, or nothing for a table that is not one.
fn encode(key_text: &[u8], table: Option<MigTable>) -> Vec<u8> {
    let mut body = MAGIC.to_vec();
    body.extend_from_slice(key_text);
    if let Some(t) = table {
        for n in [
            t.config,
            t.monitor,
            t.base,
            t.gpus,
            t.gpu_instances,
            t.compute_instances,
        ] {
            body.push(b'\t');
            body.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
        }
    }
    body.push(b'\n');
    cache::seal(body)
}

/// The kept grid (or that there is none) when the cache is whole and was written for the key
/// `key_text`.
fn decode(bytes: &[u8], key_text: &[u8]) -> Option<Option<MigTable>> {
    let body = cache::unseal(bytes)?
        .strip_prefix(MAGIC)?
        .strip_prefix(key_text)?
        .strip_suffix(b"\n")?;
    if body.is_empty() {
        return Some(None);
    }
    let body = std::str::from_utf8(body.strip_prefix(b"\t")?).ok()?;
    let [config, monitor, base, gpus, gpu_instances, compute_instances] =
        cache::fields(body, b'\t')?.map(number);
    Some(Some(MigTable {
        config: config?,
        monitor: monitor?,
        base: base?,
        gpus: gpus?,
        gpu_instances: gpu_instances?,
        compute_instances: compute_instances?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::RACY_NS;
    use std::fs;

    /// The lent H200's table (driver 580.159.04), as the driver wrote it.
    const H200: &str = include_str!("../../tests/fixtures/host/h200-mig-minors.txt");

    fn later() -> i64 {
        cache::now_ns() + 10 * RACY_NS
    }

    /// A small grid as the driver lays one out: `gpus` × `gis` GPU instances × `cis` compute
    /// instances, from minor 3.
    fn grid(gpus: u32, gis: u32, cis: u32) -> String {
        let mut out = String::from("config 1\nmonitor 2\n");
        let mut minor = 3;
        for g in 0..gpus {
            for i in 0..gis {
                out += &format!("gpu{g}/gi{i}/access {minor}\n");
                minor += 1;
                for c in 0..cis {
                    out += &format!("gpu{g}/gi{i}/ci{c}/access {minor}\n");
                    minor += 1;
                }
            }
        }
        out
    }

    #[test]
    fn the_drivers_table_is_a_grid_and_answers_each_line() {
        let table = MigTable::parse(H200).expect("the H200's table is a grid");
        assert_eq!(
            (table.gpus, table.gpu_instances, table.compute_instances),
            (32, 15, 8)
        );
        let mut lines = 0;
        for line in H200.lines() {
            let (name, minor) = line.split_once(' ').unwrap();
            assert_eq!(table.minor(name), Some(minor.parse().unwrap()), "{line}");
            lines += 1;
        }
        assert_eq!(lines, 4322);
        for outside in [
            "gpu32/gi0/access",
            "gpu0/gi15/access",
            "gpu0/gi0/ci8/access",
            "gpu01/gi0/access",
            "gpu0/gi0",
            "gpu0/gi0/ci0",
            "gpu0/mig/gi0/access",
            "gpu0/gi0/access/",
            "gpu-1/gi0/access",
            "gpu+1/gi0/access",
            "",
        ] {
            assert_eq!(table.minor(outside), None, "{outside}");
        }
    }

    #[test]
    fn a_table_off_the_grid_is_not_one() {
        assert!(MigTable::parse(&grid(2, 3, 2)).is_some());
        // Surrounding blanks and blank lines are the driver's to add.
        assert!(MigTable::parse(&grid(2, 3, 2).replace('\n', "  \n\n")).is_some());
        let good = grid(2, 3, 2);
        let bad = [
            good.replace("gpu1/gi2/ci1/access 20", "gpu1/gi2/ci1/access 21"),
            good.replace("gpu1/gi2/ci1/access 20\n", ""),
            good.replace("gpu1/gi2/ci1/access 20", "gpu1/gi2/ci0/access 19"),
            good.replace("config 1\n", ""),
            good.replace("monitor 2\n", "monitor 2\nmonitor 2\n"),
            good.replace("gpu0/gi0/access 3", "gpu0/gi0/access 03"),
            good.replace("gpu0/gi0/access 3", "gpu0/gi0/access"),
            good.replace("gpu0/gi0/access 3", "gpu0/gi0/access 3 4"),
            good.replace("config 1", "fabric 1"),
            good.clone() + "gpu2/gi0/access 30\n",
            good.clone() + "gpu0/gi0/ci9/access 30\n",
            String::new(),
        ];
        for (n, text) in bad.iter().enumerate() {
            assert_eq!(MigTable::parse(text), None, "case {n}:\n{text}");
        }
    }

    #[test]
    fn kept_while_the_table_keeps_its_key() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("mig-minors");
        let cache_dir = tmp.path().join("cache");
        fs::create_dir(&cache_dir).unwrap();
        let kept = || fs::read_dir(&cache_dir).unwrap().count();
        // No table: no MIG support here.
        assert_eq!(table(&path, &cache_dir, later()), None);
        fs::write(&path, grid(2, 3, 2)).unwrap();
        // Too young to keep: not read (the capabilities' files answer).
        assert_eq!(table(&path, &cache_dir, cache::now_ns()), None);
        assert_eq!(kept(), 0);
        let first = table(&path, &cache_dir, later()).unwrap().unwrap();
        assert_eq!(first.minor("gpu1/gi2/ci1/access"), Some(20));
        assert_eq!(kept(), 1);
        // Answered from the cache while the file keeps its key.
        let file = fs::read_dir(&cache_dir)
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        let written = fs::read(&file).unwrap();
        assert_eq!(table(&path, &cache_dir, later()), Some(Some(first)));
        // A new table (a driver loaded again: a new key) is read again.
        fs::write(&path, grid(4, 3, 2)).unwrap();
        let second = table(&path, &cache_dir, later()).unwrap().unwrap();
        assert_eq!(second.minor("gpu3/gi0/access"), Some(3 + 3 * 9));
        assert_ne!(fs::read(&file).unwrap(), written);
        // A table that is not a grid is kept as such: not read again each create.
        fs::write(&path, grid(4, 3, 2) + "gpu9/gi0/access 1000\n").unwrap();
        assert_eq!(table(&path, &cache_dir, later()), Some(None));
        let not_a_grid = fs::read(&file).unwrap();
        assert_eq!(table(&path, &cache_dir, later()), Some(None));
        // A damaged or foreign cache is not used.
        fs::write(&path, grid(2, 3, 2)).unwrap();
        let key = Key::at(&path).unwrap();
        let mut key_text = Vec::new();
        cache::key_fields(&key, &mut key_text);
        assert_eq!(decode(&not_a_grid, &key_text), None, "another key's");
        let good = encode(&key_text, Some(first));
        assert_eq!(decode(&good, &key_text), Some(Some(first)));
        for cut in [1, good.len() / 2, good.len() - 1] {
            assert_eq!(decode(&good[..cut], &key_text), None);
        }
        fs::write(&file, &good[..good.len() - 1]).unwrap();
        assert_eq!(table(&path, &cache_dir, later()), Some(Some(first)));
        assert_eq!(fs::read(&file).unwrap(), good, "rewritten whole");
    }

    #[test]
    fn not_read_where_it_cannot_be_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("mig-minors");
        fs::write(&path, grid(1, 1, 1)).unwrap();
        // A `cache-dir` that cannot be written (here: under a file; a read-only root alike).
        let cache_dir = path.join("cache");
        assert_eq!(table(&path, &cache_dir, later()), None);
    }
}
