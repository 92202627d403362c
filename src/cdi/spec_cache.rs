//! The parsed form of each large spec file, so that a `create` does not parse the node spec's
//! YAML every time.
//!
//! The index ([`super::index`]) narrows a `create` to the files that define its devices, but
//! each of those was still read and parsed in full: for the 40 KB spec `nvshim cdi generate`
//! writes for 8 GPUs, the YAML reader, the shape-guided conversion and validation were 13.3 M
//! of a CDI create's 16.2 M instructions (callgrind, docs/benchmarks.md). This cache keeps the
//! spec as it came out of validation, as compact serde_json of the typed [`Spec`]: the spec
//! without its devices on one line, then a line per device (its name, then the device), so a
//! `create` decodes the global edits and the devices it asks for, and only the names of the
//! others. Measured on that spec (35 KB of JSON, 17 devices), one device asked for: decoding
//! the whole spec took 1.07 M instructions, the spec and the one device 0.50 M; checking the
//! file 0.15 M with SipHash, 0.02 M with [`cache::checksum`]. The create went from 16.2 M to
//! 3.0 M instructions. serde_json rather than a format of our own: the spec is a tree of a dozen
//! types, and the derived decoder is the one the specs already go through. Except for the global
//! mounts, the bulk of a generated spec (65 for 8 GPUs): a tab-separated line each after the
//! spec's line (host path, container path, type, options), which took a CDI create from 2.38 M
//! to 2.22 M instructions, the same config.json (callgrind).
//!
//! So a spec from the cache holds the edits and annotations of the requested devices only; the
//! others are there by name, which is all the registry needs of them (priorities, conflicts,
//! the index's check of the names, the names an error lists): [`super::Registry::load_for`]
//! says so.
//!
//! # What a cache file holds, and why its answer cannot be stale
//!
//! `<cache-dir>/cdi-spec-<hash of the spec file's path>`: the identity of the file version it
//! was parsed from (device, inode, size, mtime, ctime: the index's [`Key`], from the `fstat`
//! of the open file that was read) and that version's spec. It is used only when
//! - the index trusts the file's entry: a fresh `stat` of the file in this `create` gave the
//!   same identity, and its ctime is more than [`crate::cache::RACY_NS`] older than the
//!   moment this `create` started reading (git's racily-clean rule), and
//! - that identity equals the cached one.
//!
//! A cache file is written only for a version whose ctime was already that old when this
//! `create` started reading it; any write since, in place or by a rename over it, gives the file
//! a later ctime (and a rename a new inode), so its identity can never again equal the cached
//! one, and the file is parsed again. The path in the name only finds the cache file: two paths
//! whose hashes collide just overwrite each other's cache, never give each other's spec.
//!
//! The spec is cached only after it parsed and validated, and only where the index found the
//! kind and device names it expects, so the errors of a broken spec still come from the parse
//! itself (and a full scan gives their exact messages, as before). The first line names the
//! nvshim version that wrote it: a spec cached by another build, whose validation may differ,
//! is parsed again.
//!
//! # Safety of the file itself
//!
//! As the index's: written with [`crate::atomic::write`] (mode 0600, directory 0700), ending
//! with its length and a checksum, so a truncated or corrupt file is not used (and is rewritten);
//! used only when owned by root or this user and writable by its owner only. When the cache
//! directory cannot be written, nothing is written and the spec is parsed as without a cache.
//!
//! Files under [`MIN_BYTES`] are not cached: reading and parsing a DRA driver's claim spec
//! (270 bytes) costs about 81,000 instructions, 2% of a create, and caching them would leave a
//! file per claim in the cache directory. A cache file whose spec file the index sees removed is
//! removed with it.

use std::io::Write as _;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::spec::{Device, Spec};
use crate::cache::{self, Key};
use crate::edits::Mount;

const MAGIC: &str = concat!("nvshim-cdi-spec 2 ", env!("CARGO_PKG_VERSION"));

/// Spec files smaller than this are parsed, never cached (module doc).
pub(super) const MIN_BYTES: u64 = 4096;

/// Where the parsed form of the spec file at `spec_path` lives under `cache_dir`.
pub(super) fn path(cache_dir: &Path, spec_path: &Path) -> PathBuf {
    let h = cache::hash(spec_path.as_os_str().as_bytes());
    cache_dir.join(format!("cdi-spec-{h:016x}"))
}

/// The spec cached for `spec_path` when it was parsed from the file version `key`, with the
/// edits and annotations of the devices named in `wanted` only: the others have just their
/// names (module doc).
pub(super) fn read(cache_dir: &Path, spec_path: &Path, key: &Key, wanted: &[&str]) -> Option<Spec> {
    decode(
        &cache::read_private(&path(cache_dir, spec_path), "CDI spec cache")?,
        key,
        wanted,
    )
}

/// Caches `spec`, parsed and validated from the version `key` of the file at `spec_path`.
/// The caller checks that `key` is trusted ([`Key::trusted_at`] the start of the read).
pub(super) fn write(cache_dir: &Path, spec_path: &Path, key: &Key, spec: &Spec) {
    let target = path(cache_dir, spec_path);
    let Some(bytes) = encode(key, spec) else {
        return;
    };
    if let Err(e) = cache::write_private(cache_dir, &target, &bytes) {
        tracing::debug!("CDI spec cache {} not written: {e}", target.display());
    }
}

/// Removes what is cached for `spec_path` (a spec file that is gone).
pub(super) fn forget(cache_dir: &Path, spec_path: &Path) {
    let _ = std::fs::remove_file(path(cache_dir, spec_path));
}

fn key_line(key: &Key) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    cache::key_fields(key, &mut out);
    out
}

/// The magic line, the key line, the spec without its devices and global mounts, a line per
/// global mount (a tab, then its fields tab-separated: `None` when one holds a tab or newline),
/// then a line per device: its name, a space, the device. Compact JSON holds no newline (one in
/// a string is escaped), and a valid device name no space or newline (`name.rs`; checked again
/// here), nor starts with a tab.
fn encode(key: &Key, spec: &Spec) -> Option<Vec<u8>> {
    if spec.devices.iter().any(|d| d.name.contains([' ', '\n'])) {
        return None;
    }
    let mut out = Vec::with_capacity(256 + key.size as usize);
    let _ = writeln!(out, "{MAGIC}");
    out.extend_from_slice(&key_line(key));
    out.push(b'\n');
    let mut head = Spec {
        devices: Vec::new(),
        ..spec.clone()
    };
    let mounts = std::mem::take(&mut head.container_edits.mounts);
    serde_json::to_writer(&mut out, &head).ok()?;
    out.push(b'\n');
    for m in &mounts {
        m.cache_line(&mut out, b"")?;
    }
    for d in &spec.devices {
        out.extend_from_slice(d.name.as_bytes());
        out.push(b' ');
        serde_json::to_writer(&mut out, d).ok()?;
        out.push(b'\n');
    }
    Some(seal(out))
}

/// Appends the trailer: the body's length and checksum.
fn seal(mut body: Vec<u8>) -> Vec<u8> {
    let (len, h) = (body.len(), cache::checksum(&body));
    let _ = writeln!(body, "END {len} {h:016x}");
    body
}

fn decode(bytes: &[u8], key: &Key, wanted: &[&str]) -> Option<Spec> {
    // The trailer first: a truncated or damaged file is not read at all.
    let without_newline = bytes.strip_suffix(b"\n")?;
    let body_end = nvshim_hook::bytes::rfind(b'\n', without_newline)? + 1;
    let (body, trailer) = bytes.split_at(body_end);
    let trailer = std::str::from_utf8(&trailer[..trailer.len() - 1]).ok()?;
    let mut t = trailer.split(' ');
    if t.next()? != "END"
        || t.next()?.parse::<usize>().ok()? != body.len()
        || u64::from_str_radix(t.next()?, 16).ok()? != cache::checksum(body)
        || t.next().is_some()
    {
        return None;
    }
    let rest = body.strip_prefix(MAGIC.as_bytes())?.strip_prefix(b"\n")?;
    let key_end = nvshim_hook::bytes::find(b'\n', rest)?;
    if rest[..key_end] != key_line(key)[..] {
        return None;
    }
    let mut lines = &rest[key_end + 1..];
    let mut spec: Spec = serde_json::from_slice(next_line(&mut lines)?).ok()?;
    if !spec.devices.is_empty() || !spec.container_edits.mounts.is_empty() {
        return None;
    }
    // Both lists sized up front: grown a push at a time, the 65 global mounts of NVIDIA's
    // 8-GPU spec left 9 KB of outgrown blocks behind, in fresh pages.
    let (mut line_count, mut mount_count) = (0usize, usize::from(lines.first() == Some(&b'\t')));
    for at in nvshim_hook::bytes::positions(b'\n', lines) {
        line_count += 1;
        mount_count += usize::from(lines.get(at + 1) == Some(&b'\t'));
    }
    spec.container_edits.mounts.reserve_exact(mount_count);
    spec.devices
        .reserve_exact(line_count.saturating_sub(mount_count));
    // The global mounts, a line each, after a tab (no device name starts with one).
    while lines.first() == Some(&b'\t') {
        let line = std::str::from_utf8(next_line(&mut lines)?).ok()?;
        let fields = cache::split(line.get(1..)?, b'\t');
        spec.container_edits
            .mounts
            .push(Mount::from_cache_fields(fields)?);
    }
    while let Some(line) = next_line(&mut lines) {
        let space = nvshim_hook::bytes::find(b' ', line)?;
        let name = std::str::from_utf8(&line[..space]).ok()?;
        let device = if wanted.contains(&name) {
            let d: Device = serde_json::from_slice(&line[space + 1..]).ok()?;
            (d.name == name).then_some(d)?
        } else {
            Device {
                name: name.to_string(),
                ..Device::default()
            }
        };
        spec.devices.push(device);
    }
    lines.is_empty().then_some(spec)
}

/// The next line of `lines`, without its `\n`, taken off `lines`.
fn next_line<'a>(lines: &mut &'a [u8]) -> Option<&'a [u8]> {
    let end = nvshim_hook::bytes::find(b'\n', lines)?;
    let line = &lines[..end];
    *lines = &lines[end + 1..];
    Some(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Key {
        Key {
            dev: 1,
            ino: 2,
            size: 3,
            mtime: 4,
            ctime: 5,
        }
    }

    fn sample() -> Spec {
        let text = "cdiVersion: 0.7.0\nkind: v.com/c\nannotations: {a: b}\ndevices:\n- name: \"0\"\n  containerEdits:\n    env: [\"A=1\\n2\"]\n    deviceNodes: [{path: /dev/x, fileMode: 0666, type: c}]\n    hooks: [{hookName: createContainer, path: /bin/h, env: []}]\n- name: gpu-1\n  annotations: {x: y}\n  containerEdits: {env: [B=2]}\ncontainerEdits:\n  intelRdt: {}\n  mounts: [{hostPath: /a, containerPath: /b, options: [ro]}]\n  additionalGids: [5]\n";
        let spec = crate::cdi::spec::parse(text.as_bytes()).unwrap();
        spec.validate().unwrap();
        spec
    }

    #[test]
    fn round_trips_only_for_its_own_version_of_the_file() {
        let spec = sample();
        let bytes = encode(&key(), &spec).unwrap();
        assert_eq!(decode(&bytes, &key(), &["0", "gpu-1"]), Some(spec.clone()));
        // The devices not asked for: their names only.
        let only = decode(&bytes, &key(), &["gpu-1", "7"]).unwrap();
        let names_only = Spec {
            devices: vec![
                Device {
                    name: "0".into(),
                    ..Device::default()
                },
                spec.devices[1].clone(),
            ],
            ..spec.clone()
        };
        assert_eq!(only, names_only);
        for other in [
            Key { ino: 9, ..key() },
            Key { size: 9, ..key() },
            Key { mtime: 9, ..key() },
            Key { ctime: 9, ..key() },
            Key { dev: 9, ..key() },
        ] {
            assert_eq!(decode(&bytes, &other, &["0"]), None);
        }
    }

    #[test]
    fn global_mounts_read_back_as_written() {
        let mut spec = sample();
        let m = |host: &str, kind: Option<&str>, options: &[&str]| Mount {
            host_path: host.into(),
            container_path: "/c".into(),
            kind: kind.map(String::from),
            options: options.iter().map(|o| o.to_string()).collect(),
        };
        spec.container_edits.mounts = vec![
            m("/a", None, &[]),
            m("/b", Some("bind"), &["ro", "", "nosuid"]),
            m("/d é", Some(""), &["x=y,z"]),
        ];
        let bytes = encode(&key(), &spec).unwrap();
        assert_eq!(decode(&bytes, &key(), &["0", "gpu-1"]), Some(spec.clone()));
        // A field a line cannot hold: not cached.
        spec.container_edits.mounts.push(m("/a\tb", None, &[]));
        assert_eq!(encode(&key(), &spec), None);
    }

    #[test]
    fn damaged_or_foreign_bytes_are_refused() {
        let good = encode(&key(), &sample()).unwrap();
        let mut flipped = good.clone();
        let i = good.iter().position(|&b| b == b'/').unwrap();
        flipped[i + 1] ^= 1;
        // Whole, but written by another build.
        let body = &good[..good.windows(4).rposition(|w| w == b"END ").unwrap()];
        let other_build = seal(
            String::from_utf8(body.to_vec())
                .unwrap()
                .replacen(env!("CARGO_PKG_VERSION"), "0.0.0-other", 1)
                .into_bytes(),
        );
        assert!(decode(&seal(body.to_vec()), &key(), &[]).is_some());
        let mut extra = good.clone();
        extra.extend_from_slice(b"x\n");
        for bad in [
            &good[..good.len() / 2],
            &good[..good.len() - 1],
            &flipped[..],
            &other_build[..],
            &extra[..],
            b"",
            b"\n",
            b"END 0 0\n",
        ] {
            assert_eq!(decode(bad, &key(), &["0"]), None);
        }
    }
}
