//! The OCI bundle's `config.json`: read as a JSON document that keeps every field (including
//! fields newer than oci-spec knows, in their original order), and written back atomically.
//!
//! NVIDIA's runtime decodes config.json into Go structs and truncates the file in place
//! (docs/nvidia-behaviour.md §1.2): unknown fields are lost and a crash mid-write
//! leaves a torn file. Here the document stays a `serde_json::Value` (with `preserve_order`),
//! only the parts nvshim edits are touched, and the new file replaces the old one by `rename`.
//!
//! The document must be parsed faithfully before it is rewritten: runc (Go's encoding/json)
//! merges an object that appears twice under one key, while `serde_json::Value` keeps only the
//! last, so a rewrite would silently drop what runc would have applied (namespaces, masked
//! paths). serde_json has no duplicate-key option, so [`Faithful`] is a small visitor that
//! builds the same `Value` in the same single pass and refuses a repeated key, naming its
//! JSON pointer. Go also matches a member to a struct field ignoring case, so `process` and
//! `Process` in one object reach runc as one merged field while nvshim would read only one:
//! members that differ only in case are refused the same way, at every level that is a Go
//! struct in runc's spec types; in its maps (`annotations`, `linux.sysctl`, ...) Go keeps keys
//! exactly, and so do they here ([`At::is_go_map`]).
//!
//! `create` loads the document lean ([`Bundle::load_lean`]): the seccomp profile
//! (`linux.seccomp`), which nvshim never reads or edits, is kept as the text it was and written
//! back as that text, in its place. Docker writes its default profile into every container's
//! config.json: of Docker 28.5.2's 9.7 KB (tests/fixtures/oci/docker-28.5.2-config.json), 6 KB
//! are the profile, and parsing it into a `Value` and writing it out again was a quarter of a
//! GPU create's instructions there (callgrind, docs/benchmarks.md). Its text goes to runc
//! exactly as the engine wrote it.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use std::cell::RefCell;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum BundleError {
    #[error("cannot read {path}: {source}; check the bundle directory given with --bundle (runc reads config.json there)")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not valid JSON: {source}; whatever wrote the bundle wrote a broken file (check it with `jq . {path}`)")]
    Malformed {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{path}: {source}; runc would merge the repeated members, which nvshim cannot edit faithfully: remove the duplicate key from config.json")]
    DuplicateKey {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{path} is not an OCI runtime spec: {what}; compare it with the config.json `runc spec` writes")]
    NotASpec { path: PathBuf, what: &'static str },
    #[error("cannot write {path}: {source} (the original config.json is unchanged); check that the bundle directory is writable and has space")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A loaded bundle: where it is and its config.json document.
#[derive(Debug, Clone)]
pub struct Bundle {
    dir: PathBuf,
    config_path: PathBuf,
    /// The bytes as read, to decide the output layout and to detect "no change".
    original: Vec<u8>,
    /// The document; without `linux.seccomp` when loaded lean ([`Bundle::load_lean`]).
    pub spec: Value,
    /// `linux.seccomp` as its text, when loaded lean.
    raw: Option<RawMember>,
}

/// The most of config.json read: the hook's limit.
pub const MAX_CONFIG_BYTES: u64 = nvshim_hook::state::MAX_CONFIG;

/// The bytes of `<dir>/config.json` ([`crate::hostfile`]: a FIFO there does not block).
pub fn read_config(dir: &Path) -> Result<Vec<u8>, BundleError> {
    let path = dir.join("config.json");
    crate::hostfile::read(&path, MAX_CONFIG_BYTES)
        .map_err(|source| BundleError::Read { path, source })
}

/// A member of the `linux` object kept as the text it was (module doc).
#[derive(Debug, Clone)]
struct RawMember {
    /// Its position among the members `linux` had.
    index: usize,
    text: Box<RawValue>,
}

/// A member of the document by its path of keys from the top, and what writes its value in
/// its place, given the value the document holds there ([`Bundle::render_spec_with`]).
pub type MemberWriter<'a> = (&'a [&'a str], &'a dyn Fn(&mut crate::json::Writer, &Value));

/// The object that holds the raw member, and the member's name.
const RAW_PARENT: &str = "linux";
const RAW_KEY: &str = "seccomp";

impl Bundle {
    /// Loads `<dir>/config.json`. `dir` is used as given (runc resolves a relative bundle
    /// against its cwd, and so do we, since we exec runc from the same cwd).
    pub fn load(dir: &Path) -> Result<Bundle, BundleError> {
        Bundle::from_bytes(dir, read_config(dir)?)
    }

    /// [`Bundle::load`], keeping `linux.seccomp` as its text, out of [`Bundle::spec`]; it is
    /// written back in its place by [`Bundle::render_spec`] (module doc).
    pub fn load_lean(dir: &Path) -> Result<Bundle, BundleError> {
        Bundle::from_bytes_lean(dir, read_config(dir)?)
    }

    /// [`Bundle::from_bytes`], lean as [`Bundle::load_lean`].
    pub fn from_bytes_lean(dir: &Path, original: Vec<u8>) -> Result<Bundle, BundleError> {
        Bundle::parse_with(dir, dir.join("config.json"), original, true)
    }

    /// Loads a config.json kept outside a bundle (`nvshim explain --spec FILE`); errors name
    /// the file, and the bundle directory is the file's directory.
    pub fn load_file(path: &Path) -> Result<Bundle, BundleError> {
        let original =
            crate::hostfile::read(path, MAX_CONFIG_BYTES).map_err(|source| BundleError::Read {
                path: path.to_path_buf(),
                source,
            })?;
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        Bundle::parse(dir, path.to_path_buf(), original)
    }

    /// A bundle at `dir` whose config.json holds `original` (what [`Bundle::load`] read; the
    /// fuzz target `bundle_edits` feeds it bytes without a file).
    pub fn from_bytes(dir: &Path, original: Vec<u8>) -> Result<Bundle, BundleError> {
        Bundle::parse(dir, dir.join("config.json"), original)
    }

    fn parse(dir: &Path, config_path: PathBuf, original: Vec<u8>) -> Result<Bundle, BundleError> {
        Bundle::parse_with(dir, config_path, original, false)
    }

    fn parse_with(
        dir: &Path,
        config_path: PathBuf,
        original: Vec<u8>,
        lean: bool,
    ) -> Result<Bundle, BundleError> {
        let raw = RefCell::new(None);
        let spec = parse_faithful_with(&original, lean.then_some(&raw)).map_err(|source| {
            if source.is_data() {
                BundleError::DuplicateKey {
                    path: config_path.clone(),
                    source,
                }
            } else {
                BundleError::Malformed {
                    path: config_path.clone(),
                    source,
                }
            }
        })?;
        if !spec.is_object() {
            return Err(BundleError::NotASpec {
                path: config_path,
                what: "the top level is not an object",
            });
        }
        if let Some(process) = spec.get("process") {
            if !process.is_object() {
                return Err(BundleError::NotASpec {
                    path: config_path,
                    what: "\"process\" is not an object",
                });
            }
            if let Some(env) = process.get("env") {
                let ok = env
                    .as_array()
                    .is_some_and(|a| a.iter().all(|v| v.is_string()));
                if !ok {
                    return Err(BundleError::NotASpec {
                        path: config_path,
                        what: "\"process.env\" is not a list of strings",
                    });
                }
            }
        }
        Ok(Bundle {
            dir: dir.to_path_buf(),
            config_path,
            original,
            spec,
            raw: raw.into_inner(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    /// Serialises the document in the layout the original used (pretty if it had newlines).
    pub fn render(&self) -> Vec<u8> {
        self.render_spec(&self.spec)
    }

    /// Serialises `spec` in the layout the original used (pretty if it had newlines), as
    /// serde_json would (`crate::json` says why not serde_json itself).
    pub fn render_spec(&self, spec: &Value) -> Vec<u8> {
        self.render_spec_with(spec, &[])
    }

    /// [`Bundle::render_spec`], with each of `members` (a member by its path of keys from the
    /// top, where `spec` has it) written by its writer, given the value `spec` holds there,
    /// instead of from `spec`: `create` writes the mounts, device nodes and cgroup rules it
    /// adds straight from its edits (`edits::Deferred`).
    pub fn render_spec_with(&self, spec: &Value, members: &[MemberWriter<'_>]) -> Vec<u8> {
        let pretty = self.original.contains(&b'\n');
        // Room for the edits up front: growing the buffer while writing copied it several
        // times (about 5% of a create's instructions, callgrind). A CDI create on NVIDIA's
        // 8-GPU spec writes 29 KB from 3 KB, a MIG `all` one 53 KB; pages never written are
        // never touched, so the room costs no memory.
        let mut w = crate::json::Writer::new(self.original.len() * 2 + 64 * 1024, pretty);
        match spec.as_object() {
            Some(root) if self.raw.is_some() || !members.is_empty() => {
                self.write_object(&mut w, root, &mut Vec::new(), members)
            }
            _ => w.value(spec),
        }
        let mut out = w.into_bytes();
        if pretty {
            out.push(b'\n');
        }
        out
    }

    /// Writes the document to config.json atomically; see [`Bundle::save_spec`].
    pub fn save(&self) -> Result<(), BundleError> {
        self.save_spec(&self.spec)
    }

    /// Writes `spec` (an edited copy of the document; no clone of the bundle needed) to
    /// config.json with [`crate::atomic::write`], its data flushed ([`Durability::Data`]): a
    /// reader (runc), a shim killed half way, or a host that loses power sees the old file or
    /// the new one, never a torn or empty one. The mode of the old file is kept.
    ///
    /// [`Durability::Data`]: crate::atomic::Durability::Data
    ///
    /// Cost: one flush where the bundle is on disk (podman keeps bundles under
    /// /var/lib/containers; docs/benchmarks.md measures it), nothing on the tmpfs under /run
    /// where containerd, Docker and CRI-O keep theirs.
    pub fn save_spec(&self, spec: &Value) -> Result<(), BundleError> {
        self.write(&self.render_spec(spec))
    }

    /// Writes `bytes` (a rendered document) as [`Bundle::save_spec`] does, unless they are the
    /// bytes that were read (a retried `create`): then nothing is written. Whether it wrote.
    pub fn write_changed(&self, bytes: &[u8]) -> Result<bool, BundleError> {
        if bytes == self.original {
            return Ok(false);
        }
        self.write(bytes).map(|()| true)
    }

    /// The object `map`, at `at` (its path of keys from the top), with the raw member in
    /// `linux` (loaded lean) and `members` written in their places; objects on the way to one
    /// of them written member by member, every other value whole.
    fn write_object<'v>(
        &self,
        w: &mut crate::json::Writer,
        map: &'v Map<String, Value>,
        at: &mut Vec<&'v str>,
        members: &[MemberWriter<'_>],
    ) {
        let raw = self.raw.as_ref().filter(|_| matches!(at[..], [RAW_PARENT]));
        // After any members edits appended, when the object had fewer before it.
        let raw_at = raw.map(|r| r.index.min(map.len()));
        w.object(|m| {
            for (i, (key, value)) in map.iter().enumerate() {
                if let (Some(raw), true) = (raw, raw_at == Some(i)) {
                    m.key(RAW_KEY).raw(raw.text.get());
                }
                at.push(key);
                let below = |path: &[&str]| path.len() > at.len() && path.starts_with(at);
                if let Some((_, write)) = members.iter().find(|(path, _)| **path == at[..]) {
                    write(m.key(key), value);
                } else if let Some(object) = value.as_object().filter(|_| {
                    members.iter().any(|(path, _)| below(path))
                        || (self.raw.is_some() && matches!(at[..], [RAW_PARENT]))
                }) {
                    self.write_object(m.key(key), object, at, members);
                } else {
                    m.key(key).value(value);
                }
                at.pop();
            }
            if let (Some(raw), true) = (raw, raw_at == Some(map.len())) {
                m.key(RAW_KEY).raw(raw.text.get());
            }
        });
    }

    fn write(&self, bytes: &[u8]) -> Result<(), BundleError> {
        let err = |source| BundleError::Write {
            path: self.config_path.clone(),
            source,
        };
        let mode = fs::metadata(&self.config_path)
            .map(|m| m.permissions().mode() & 0o7777)
            .unwrap_or(0o644);
        let opts = crate::atomic::Options {
            mode,
            owner: None,
            durability: crate::atomic::Durability::Data,
        };
        crate::atomic::write(&self.config_path, bytes, &opts).map_err(err)
    }
}

/// Parses JSON into a `Value` as `serde_json::from_slice` does, refusing duplicate keys at any
/// depth (the only data error it raises; syntax errors stay syntax errors).
pub fn parse_faithful(bytes: &[u8]) -> Result<Value, serde_json::Error> {
    parse_faithful_with(bytes, None)
}

/// [`parse_faithful`]; with `raw`, `linux.seccomp` is left out of the `Value` and kept there.
fn parse_faithful_with(
    bytes: &[u8],
    raw: Option<&RefCell<Option<RawMember>>>,
) -> Result<Value, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = Faithful { at: At::ROOT, raw }.deserialize(&mut de)?;
    de.end()?;
    Ok(value)
}

/// Where a value sits, as a chain on the stack: a JSON pointer is only built for an error.
#[derive(Clone, Copy)]
struct At<'a> {
    seg: Seg<'a>,
    parent: Option<&'a At<'a>>,
}

#[derive(Clone, Copy)]
enum Seg<'a> {
    Root,
    Key(&'a str),
    Index(usize),
}

impl<'a> At<'a> {
    const ROOT: At<'static> = At {
        seg: Seg::Root,
        parent: None,
    };

    /// RFC 6901 pointer (`/linux/namespaces/0`).
    fn pointer(&self) -> String {
        let mut segs = Vec::new();
        let mut at = Some(self);
        while let Some(a) = at {
            match a.seg {
                Seg::Root => {}
                Seg::Key(k) => segs.push(k.replace('~', "~0").replace('/', "~1")),
                Seg::Index(i) => segs.push(i.to_string()),
            }
            at = a.parent;
        }
        segs.iter().rev().fold(String::new(), |p, s| p + "/" + s)
    }
}

impl At<'_> {
    /// Whether the object here is a Go map in runc's `specs.Spec` (runtime-spec's
    /// `specs-go/config.go`), whose keys Go keeps exactly as written: `annotations`,
    /// `linux.sysctl`, `linux.resources.unified`, `linux.resources.rdma`, `linux.netDevices`,
    /// and anything in `windows.credentialSpec` (an `interface{}`). Every other object is a
    /// Go struct there, or a member Go ignores, where a case-insensitive duplicate is refused.
    fn is_go_map(&self) -> bool {
        let mut keys = Vec::new();
        let mut at = Some(self);
        while let Some(a) = at {
            match a.seg {
                Seg::Key(k) => keys.push(k),
                Seg::Index(_) => keys.push(""),
                Seg::Root => {}
            }
            at = a.parent;
        }
        keys.reverse();
        matches!(
            keys[..],
            ["annotations"]
                | ["linux", "sysctl"]
                | ["linux", "resources", "unified" | "rdma"]
                | ["linux", "netDevices"]
        ) || keys.starts_with(&["windows", "credentialSpec"])
    }
}

/// Whether Go's encoding/json decodes members `a` and `b` into one struct field: it matches a
/// name to a field ignoring case, folding each character with `unicode.ToUpper(ToLower(r))`
/// (`foldName` in encoding/json/fold.go), under which `ſ` (U+017F) is `S`, the Kelvin sign
/// (U+212A) `K`, and `ı` (U+0131) and `İ` (U+0130) `I`. The spec's field names are ASCII, so other
/// characters are compared as they are.
fn go_same_field(a: &str, b: &str) -> bool {
    fn fold(c: char) -> char {
        match c {
            '\u{17f}' => 'S',
            '\u{212a}' => 'K',
            '\u{130}' | '\u{131}' => 'I',
            c => c.to_ascii_uppercase(),
        }
    }
    a.chars().map(fold).eq(b.chars().map(fold))
}

/// Seed and visitor building a `Value` at [`At`]; with `raw`, `linux.seccomp` goes there.
#[derive(Clone, Copy)]
struct Faithful<'a> {
    at: At<'a>,
    raw: Option<&'a RefCell<Option<RawMember>>>,
}

impl<'de> DeserializeSeed<'de> for Faithful<'_> {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Faithful<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        // As serde_json's own Value visitor: JSON text cannot hold a non-finite number.
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        self.deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(v) = seq.next_element_seed(Faithful {
            at: At {
                seg: Seg::Index(out.len()),
                parent: Some(&self.at),
            },
            raw: self.raw,
        })? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        // In `linux` (a member of the root), when loading lean.
        let raw_here = self.raw.filter(|_| {
            matches!(self.at.seg, Seg::Key(RAW_PARENT))
                && self.at.parent.is_some_and(|p| matches!(p.seg, Seg::Root))
        });
        while let Some(key) = map.next_key::<String>()? {
            let duplicate = |key: &str| {
                let at = At {
                    seg: Seg::Key(key),
                    parent: Some(&self.at),
                };
                de::Error::custom(format_args!("duplicate key {key:?} at {}", at.pointer()))
            };
            // A member Go reads as the same struct field as an earlier one (module doc).
            let raw_held = raw_here.is_some_and(|r| r.borrow().is_some());
            let earlier = out
                .keys()
                .map(String::as_str)
                .chain(raw_held.then_some(RAW_KEY))
                .find(|k| *k != key && go_same_field(k, &key));
            if let Some(earlier) = earlier.filter(|_| !self.at.is_go_map()) {
                let at = At {
                    seg: Seg::Key(&key),
                    parent: Some(&self.at),
                };
                return Err(de::Error::custom(format_args!(
                    "duplicate key {key:?} at {} (the same field as {earlier:?} to runc, whose Go decoder matches member names ignoring case and merges them)",
                    at.pointer()
                )));
            }
            if let Some(raw) = raw_here.filter(|_| key == RAW_KEY) {
                if raw_held || out.contains_key(&key) {
                    return Err(duplicate(&key));
                }
                let text: Box<RawValue> = map.next_value()?;
                *raw.borrow_mut() = Some(RawMember {
                    index: out.len(),
                    text,
                });
                continue;
            }
            // One look-up of the key (SipHash: serde_json's map is an `IndexMap` with std's
            // hasher), where `contains_key` and then `insert` made two.
            match out.entry(key) {
                serde_json::map::Entry::Occupied(slot) => return Err(duplicate(slot.key())),
                serde_json::map::Entry::Vacant(slot) => {
                    let at = At {
                        seg: Seg::Key(slot.key()),
                        parent: Some(&self.at),
                    };
                    let value = map.next_value_seed(Faithful { at, raw: self.raw })?;
                    slot.insert(value);
                }
            }
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_beyond_u64_survive_a_rewrite() {
        // Regression: fuzz/corpus/bundle_edits/seed-regression-big-integer.
        let dir = tempfile::tempdir().unwrap();
        let text = r#"{"x":5555550000000000000000000000000000001850190698,"y":1.1e-7}"#;
        fs::write(dir.path().join("config.json"), text).unwrap();
        let b = Bundle::load(dir.path()).unwrap();
        let back: Value = serde_json::from_slice(&b.render()).unwrap();
        assert_eq!(back, b.spec);
    }

    /// Item 2: a repeated key at any depth is refused with its JSON pointer, and the file is
    /// left as it was.
    #[test]
    fn duplicate_keys_refused_at_any_depth() {
        for (text, pointer) in [
            (
                r#"{"linux":{"namespaces":[]},"linux":{}}"#,
                "\"linux\" at /linux",
            ),
            (r#"{"linux":{"a":1,"a":2}}"#, "\"a\" at /linux/a"),
            (
                r#"{"linux":{"namespaces":[{"type":"pid","type":"net"}]}}"#,
                "\"type\" at /linux/namespaces/0/type",
            ),
            (
                r#"{"process":{"env":[]},"process":{"env":[]}}"#,
                "at /process",
            ),
            (r#"{"a/b~":{"x":1,"x":1}}"#, "at /a~1b~0/x"),
            (r#"{"annotations":{"k":"v","k":"v"}}"#, "at /annotations/k"),
        ] {
            let dir = tempfile::tempdir().unwrap();
            fs::write(dir.path().join("config.json"), text).unwrap();
            let err = Bundle::load(dir.path()).unwrap_err().to_string();
            assert!(
                err.contains("duplicate key \"")
                    && err.contains(pointer)
                    && err.contains("config.json")
                    && !err.contains('\n'),
                "{text}: {err}"
            );
            assert_eq!(
                fs::read(dir.path().join("config.json")).unwrap(),
                text.as_bytes()
            );
        }
        // Same key in different objects is fine, and the Value equals serde_json's.
        let ok = r#"{"a":{"x":1},"b":{"x":[1,{"x":null}]},"n":-3,"f":1.5e300,"s":"\u00e9"}"#;
        assert_eq!(
            parse_faithful(ok.as_bytes()).unwrap(),
            serde_json::from_str::<Value>(ok).unwrap()
        );
    }

    /// Members Go merges into one struct field (names equal ignoring case, with Go's folds of
    /// `ſ`, `K`, `ı`, `İ`) are refused at every struct level, lean or not; Go maps keep
    /// keys that differ in case apart, and so does nvshim.
    #[test]
    fn members_differing_only_in_case_refused_where_go_merges_them() {
        for (text, pointer) in [
            (
                r#"{"process":{"env":[]},"Process":{}}"#,
                "\"Process\" at /Process",
            ),
            (r#"{"PROCESS":{},"process":{}}"#, "\"process\" at /process"),
            (
                r#"{"linux":{"devices":[],"Devices":[]}}"#,
                "at /linux/Devices",
            ),
            (
                r#"{"mounts":[{"type":"bind","Type":"none"}]}"#,
                "at /mounts/0/Type",
            ),
            (
                r#"{"process":{"args":[],"arg\u017f":[]}}"#,
                "at /process/arg\u{17f}",
            ),
            (
                r#"{"linux":{"seccomp":{},"Seccomp":{}}}"#,
                "at /linux/Seccomp",
            ),
            (
                r#"{"linux":{"Seccomp":{},"seccomp":{}}}"#,
                "at /linux/seccomp",
            ),
            (
                r#"{"linux":{"resources":{"unified":{}},"Resources":{}}}"#,
                "at /linux/Resources",
            ),
        ] {
            for lean in [false, true] {
                let dir = tempfile::tempdir().unwrap();
                fs::write(dir.path().join("config.json"), text).unwrap();
                let load = if lean {
                    Bundle::load_lean
                } else {
                    Bundle::load
                };
                let err = load(dir.path()).unwrap_err().to_string();
                assert!(
                    err.contains(pointer) && err.contains("ignoring case"),
                    "{text}: {err}"
                );
            }
        }
        for ok in [
            r#"{"annotations":{"a":"1","A":"2"}}"#,
            r#"{"linux":{"sysctl":{"net.x":"1","NET.X":"2"},"resources":{"unified":{"a":"1","A":"2"},"rdma":{"m":{},"M":{}}},"netDevices":{"e":{},"E":{}}}}"#,
            r#"{"windows":{"credentialSpec":{"a":{"b":1,"B":2},"A":1}}}"#,
        ] {
            let dir = tempfile::tempdir().unwrap();
            fs::write(dir.path().join("config.json"), ok).unwrap();
            Bundle::load(dir.path()).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
    }

    /// The duplicate check's cost against serde_json's own `Value` parse, on the config.json
    /// given in `NVSHIM_PARSE_COST` (e.g. what `runc spec` writes):
    /// `NVSHIM_PARSE_COST=config.json cargo test -p nvshim --lib parse_cost -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn parse_cost() {
        let path = std::env::var("NVSHIM_PARSE_COST").unwrap();
        let bytes = fs::read(path).unwrap();
        let n = 20_000;
        let t = std::time::Instant::now();
        for _ in 0..n {
            std::hint::black_box(serde_json::from_slice::<Value>(&bytes).unwrap());
        }
        let plain = t.elapsed() / n;
        let t = std::time::Instant::now();
        for _ in 0..n {
            std::hint::black_box(parse_faithful(&bytes).unwrap());
        }
        let faithful = t.elapsed() / n;
        println!(
            "{} bytes: serde_json Value {plain:?}, duplicate-checking {faithful:?}",
            bytes.len()
        );
    }

    #[test]
    fn malformed_json_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("config.json"), b"{\"process\": ").unwrap();
        let err = Bundle::load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("config.json is not valid JSON"), "{err}");
    }

    #[test]
    fn env_must_be_strings() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(
            dir.path().join("config.json"),
            br#"{"process":{"env":[1]}}"#,
        )
        .unwrap();
        assert!(matches!(
            Bundle::load(dir.path()),
            Err(BundleError::NotASpec { .. })
        ));
    }

    #[test]
    fn round_trip_keeps_unknown_fields_and_order() {
        let dir = tempfile::tempdir().unwrap();
        let text = r#"{"ociVersion":"1.2.0","zzzFuture":{"b":1,"a":[1,2]},"process":{"env":[],"newField":true},"linux":{"netDevices":{"eth0":{"name":"x"}}}}"#;
        fs::write(dir.path().join("config.json"), text).unwrap();
        let b = Bundle::load(dir.path()).unwrap();
        b.save().unwrap();
        assert_eq!(
            fs::read_to_string(dir.path().join("config.json")).unwrap(),
            text
        );
    }

    #[test]
    fn failed_save_leaves_original() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        fs::write(&path, b"{}").unwrap();
        let mut b = Bundle::load(dir.path()).unwrap();
        b.spec["x"] = Value::from(1);
        // A directory where the temp file would go makes the create fail.
        fs::create_dir(
            dir.path()
                .join(format!(".config.json.nvshim-{}.tmp", std::process::id())),
        )
        .unwrap();
        assert!(b.save().is_err());
        assert_eq!(fs::read(&path).unwrap(), b"{}");
    }

    /// Docker 28.5.2's config.json for `docker run -e NVIDIA_VISIBLE_DEVICES=0,3 ...`, as it
    /// handed it to its runtime (captured by a runtime that copied it, then ran runc).
    const DOCKER: &str = include_str!("../tests/fixtures/oci/docker-28.5.2-config.json");

    /// Lean and full loads of `text` in a bundle, and their renders after `edit`.
    fn lean_and_full(text: &str, edit: impl Fn(&mut Value)) -> (Bundle, Vec<u8>, Vec<u8>) {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("config.json"), text).unwrap();
        let mut lean = Bundle::load_lean(dir.path()).unwrap();
        let mut full = Bundle::load(dir.path()).unwrap();
        edit(&mut lean.spec);
        edit(&mut full.spec);
        let (l, f) = (lean.render(), full.render());
        (lean, l, f)
    }

    #[test]
    fn lean_load_keeps_the_seccomp_profile_as_its_text_in_its_place() {
        let add_device = |spec: &mut Value| {
            spec["linux"]["devices"] = serde_json::json!([{"path": "/dev/nvidia0", "type": "c"}]);
            spec["process"]["env"]
                .as_array_mut()
                .unwrap()
                .push("X=1".into());
        };
        // Docker's compact document: the same bytes as a full load, with or without edits.
        let (lean, l, f) = lean_and_full(DOCKER, |_| {});
        assert!(lean.spec.pointer("/linux/seccomp").is_none());
        assert!(lean.spec.pointer("/linux/maskedPaths").is_some());
        assert_eq!(l, f);
        let (_, l, f) = lean_and_full(DOCKER, add_device);
        assert_eq!(String::from_utf8(l).unwrap(), String::from_utf8(f).unwrap());
        // Pretty, with the profile first, in the middle and last among linux's members.
        let full: Value = serde_json::from_str(DOCKER).unwrap();
        let seccomp = full["linux"]["seccomp"].clone();
        for at in [0, 2, 99] {
            let mut doc = full.clone();
            let linux = doc["linux"].as_object_mut().unwrap();
            linux.shift_remove("seccomp");
            let at = at.min(linux.len());
            linux.shift_insert(at, "seccomp".into(), seccomp.clone());
            let text = serde_json::to_string_pretty(&doc).unwrap() + "\n";
            let (_, l, f) = lean_and_full(&text, add_device);
            assert_eq!(String::from_utf8(l).unwrap(), String::from_utf8(f).unwrap());
        }
        // Without a profile, or with `linux` elsewhere, nothing is kept apart.
        let (lean, l, f) =
            lean_and_full(r#"{"x":{"linux":{"seccomp":1}},"linux":{"a":1}}"#, |_| {});
        assert!(lean.raw.is_none());
        assert_eq!(l, f);
    }

    #[test]
    fn lean_load_refuses_a_repeated_seccomp_key() {
        let dir = tempfile::tempdir().unwrap();
        let text = r#"{"linux":{"seccomp":{"defaultAction":"SCMP_ACT_ERRNO"},"seccomp":{}}}"#;
        fs::write(dir.path().join("config.json"), text).unwrap();
        let err = Bundle::load_lean(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("duplicate key \"seccomp\" at /linux/seccomp"),
            "{err}"
        );
    }
}
