//! `nvshim-runtime features`: the low-level runtime's own answer (the OCI runtime-spec's
//! features document), with only what nvshim changes. containerd asks the runtime binary
//! for it and admits pods by it (user namespaces through `linux.namespaces` and
//! `linux.mountExtensions.idmap`, recursive read-only mounts through `mountOptions`), so
//! everything runc or crun said about themselves stays as they said it: nvshim execs them for
//! every container, and its own edits work wherever they work (src/userns.rs for user
//! namespaces).

use std::path::Path;

use serde_json::{Map, Value};

use crate::config::Config;

/// The annotation naming nvshim's version in the answer.
pub const VERSION_ANNOTATION: &str = "nvshim.runtime.version";
/// The annotation naming the low-level runtime nvshim execs (the one that answered).
pub const RUNTIME_ANNOTATION: &str = "nvshim.runtime.low-level";

/// What nvshim changes in the low-level runtime's answer `doc`:
/// - `annotations`: its version and the runtime it execs are added (the runtime-spec's place
///   for implementation facts), the runtime's own kept;
/// - `potentiallyUnsafeConfigAnnotations`: the CDI annotation prefixes of the nvshim config
///   are added, since nvshim gives a container the host devices they name; an engine must not
///   let a pod author set them. The runtime-spec marks a prefix by a trailing `.`, which a CDI
///   prefix (`cdi.k8s.io/`) does not have: it is listed as configured.
///
/// Nothing else: the hooks, namespaces, mount options and mount extensions nvshim needs are
/// the runtime's (its device nodes and fix-ups work in a user namespace: docs/design.md).
pub fn adjust(doc: &mut Map<String, Value>, runtime: &Path, config: &Config) {
    let annotations = doc
        .entry("annotations")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Value::Object(a) = annotations {
        a.insert(
            VERSION_ANNOTATION.into(),
            Value::String(env!("CARGO_PKG_VERSION").into()),
        );
        a.insert(
            RUNTIME_ANNOTATION.into(),
            Value::String(runtime.to_string_lossy().into_owned()),
        );
    }
    let unsafe_list = doc
        .entry("potentiallyUnsafeConfigAnnotations")
        .or_insert_with(|| Value::Array(Vec::new()));
    if let Value::Array(list) = unsafe_list {
        for p in &config.cdi_annotation_prefixes {
            let v = Value::String(p.clone());
            if !p.is_empty() && !list.contains(&v) {
                list.push(v);
            }
        }
    }
}

/// The answer to print for the low-level runtime's `stdout`: adjusted ([`adjust`]) and
/// rendered as runc renders it (indented), or `None` when it is not a JSON object (the
/// caller passes it through unchanged).
pub fn answer(stdout: &[u8], runtime: &Path, config: &Config) -> Option<Vec<u8>> {
    let Ok(Value::Object(mut doc)) = serde_json::from_slice::<Value>(stdout) else {
        return None;
    };
    adjust(&mut doc, runtime, config);
    let mut out = serde_json::to_vec_pretty(&Value::Object(doc)).ok()?;
    out.push(b'\n');
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_annotations_and_the_unsafe_list_change() {
        let runc = json!({
            "ociVersionMin": "1.0.0",
            "hooks": ["prestart", "createContainer"],
            "linux": {"namespaces": ["user"], "mountExtensions": {"idmap": {"enabled": true}}},
            "annotations": {"org.opencontainers.runc.version": "1.3.6"},
            "potentiallyUnsafeConfigAnnotations": ["bundle", "org.systemd.property."]
        });
        let out = answer(
            &serde_json::to_vec(&runc).unwrap(),
            Path::new("/usr/bin/runc"),
            &Config::default(),
        )
        .unwrap();
        let got: Value = serde_json::from_slice(&out).unwrap();
        for key in ["ociVersionMin", "hooks", "linux"] {
            assert_eq!(got[key], runc[key], "{key}");
        }
        assert_eq!(
            got["annotations"]["org.opencontainers.runc.version"],
            "1.3.6"
        );
        assert_eq!(got["annotations"][RUNTIME_ANNOTATION], "/usr/bin/runc");
        assert_eq!(
            got["potentiallyUnsafeConfigAnnotations"],
            json!(["bundle", "org.systemd.property.", "cdi.k8s.io/"])
        );
    }

    #[test]
    fn not_an_object_is_not_adjusted() {
        let c = Config::default();
        assert!(answer(b"runc: unknown command", Path::new("runc"), &c).is_none());
        assert!(answer(b"[1]", Path::new("runc"), &c).is_none());
    }
}
