//! The CDI spec-directory reader (`nvshim::cdi::Registry::load`): what every `create` that asks
//! for CDI devices runs over `/etc/cdi` and `/var/run/cdi`, whose files come from whatever
//! wrote them (device plugins, operators, stale packages).
//!
//! Input: records `[kind][len: u16 LE][len bytes]` (a short last record takes what is left),
//! at most 8. Record `i` becomes an entry of the first directory (even `i`) or the second
//! (odd `i`), named `<i>.<ext>` with the extension from `kind` (`yaml`, `json`, or `yml`,
//! which is not read); `kind % 8 == 6` makes it a symlink to the previous entry and
//! `kind % 8 == 7` a subdirectory (neither is a regular file of the directory itself).
//!
//! Properties: no panic, no hang; every device the registry lists resolves; every error names
//! a path inside the two directories.
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use libfuzzer_sys::fuzz_target;
use nvshim::cdi::Registry;

static ROUND: AtomicU64 = AtomicU64::new(0);

fn records(mut data: &[u8]) -> Vec<(u8, &[u8])> {
    let mut out = Vec::new();
    while out.len() < 8 {
        let [kind, lo, hi, rest @ ..] = data else {
            break;
        };
        let len = usize::from(u16::from_le_bytes([*lo, *hi])).min(rest.len());
        out.push((*kind, &rest[..len]));
        data = &rest[len..];
    }
    out
}

fn populate(dirs: &[PathBuf; 2], data: &[u8]) {
    let mut previous: Option<PathBuf> = None;
    for (i, (kind, body)) in records(data).into_iter().enumerate() {
        let ext = ["yaml", "json", "yml", "yaml"][usize::from(kind % 4)];
        let path = dirs[i % 2].join(format!("{i}.{ext}"));
        match (kind % 8, &previous) {
            (6, Some(target)) => std::os::unix::fs::symlink(target, &path),
            (7, _) => std::fs::create_dir(&path),
            _ => std::fs::write(&path, body),
        }
        .unwrap_or_else(|e| panic!("fuzz setup: {}: {e}", path.display()));
        previous = Some(path);
    }
}

fn check(root: &Path, dirs: &[PathBuf; 2]) {
    let registry = Registry::load(dirs);
    let names: Vec<String> = registry.devices().map(|(n, _)| n.to_string()).collect();
    if let Err(e) = registry.resolve(&names) {
        panic!("a listed device does not resolve: {e}");
    }
    for e in registry.errors() {
        assert!(e.path().starts_with(root), "error outside the dirs: {e}");
    }
}

fuzz_target!(|data: &[u8]| {
    let root = std::env::temp_dir().join(format!(
        "nvshim-fuzz-spec-dir-{}-{}",
        std::process::id(),
        ROUND.fetch_add(1, Ordering::Relaxed)
    ));
    let dirs = [root.join("etc/cdi"), root.join("run/cdi")];
    for d in &dirs {
        std::fs::create_dir_all(d).unwrap_or_else(|e| panic!("fuzz setup: {}: {e}", d.display()));
    }
    populate(&dirs, data);
    check(&root, &dirs);
    let _ = std::fs::remove_dir_all(&root);
});
