//! Device requests in OCI annotations: the `cdi.k8s.io/` protocol (docs/cdi-rules.md §3.2).
//!
//! Keys that start with one of the configured prefixes carry comma-separated device names.
//! Keys are taken in sorted order (the reference iterates a Go map, in random order; NVIDIA's
//! runtime sorts, and a stable order keeps edits reproducible). Items are not trimmed and may
//! not be empty, as in `ParseAnnotations`; whether each must be fully qualified is the caller's
//! decision (NVIDIA's `cdi` mode prefixes the default kind to bare names).

use serde_json::Value;
use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AnnotationError {
    #[error("annotation {key:?}: value {value:?} has an empty device name; the value must be a comma list of CDI device names (vendor.com/class=name)")]
    EmptyItem { key: String, value: String },
    #[error("annotation {key:?}: value is not a string; the value must be a comma list of CDI device names (vendor.com/class=name)")]
    NotAString { key: String },
}

/// One requested device and the annotation key it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnnotatedDevice {
    pub key: String,
    pub device: String,
}

/// Reads the device requests from `annotations` (the config.json `annotations` object).
pub fn parse(
    annotations: Option<&Value>,
    prefixes: &[String],
) -> Result<Vec<AnnotatedDevice>, AnnotationError> {
    let Some(map) = annotations.and_then(Value::as_object) else {
        return Ok(Vec::new());
    };
    let mut keys: Vec<&String> = map
        .keys()
        .filter(|k| {
            prefixes
                .iter()
                .any(|p| !p.is_empty() && k.starts_with(p.as_str()))
        })
        .collect();
    keys.sort();
    let mut out = Vec::new();
    for key in keys {
        let value = map[key.as_str()]
            .as_str()
            .ok_or_else(|| AnnotationError::NotAString { key: key.clone() })?;
        for item in value.split(',') {
            if item.is_empty() {
                return Err(AnnotationError::EmptyItem {
                    key: key.clone(),
                    value: value.into(),
                });
            }
            out.push(AnnotatedDevice {
                key: key.clone(),
                device: item.into(),
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn prefixes() -> Vec<String> {
        vec!["cdi.k8s.io/".into()]
    }

    #[test]
    fn sorted_keys_split_values() {
        let a = json!({
            "cdi.k8s.io/vendor2": "vendor2.com/device=dev2",
            "cdi.k8s.io/vendor1": "vendor1.com/device=a,vendor1.com/device=b",
            "other/key": "x.com/y=z",
        });
        let got: Vec<String> = parse(Some(&a), &prefixes())
            .unwrap()
            .into_iter()
            .map(|d| d.device)
            .collect();
        assert_eq!(
            got,
            [
                "vendor1.com/device=a",
                "vendor1.com/device=b",
                "vendor2.com/device=dev2"
            ]
        );
    }

    #[test]
    fn empty_items_fail_and_nothing_is_fine() {
        assert!(parse(None, &prefixes()).unwrap().is_empty());
        assert!(parse(Some(&json!({})), &prefixes()).unwrap().is_empty());
        let a = json!({"cdi.k8s.io/x": "a/b=c,"});
        assert!(matches!(
            parse(Some(&a), &prefixes()),
            Err(AnnotationError::EmptyItem { .. })
        ));
        // Not trimmed: " a/b=c" stays as is (and is then not a valid name).
        let a = json!({"cdi.k8s.io/x": "a/b=c, a/b=d"});
        assert_eq!(parse(Some(&a), &prefixes()).unwrap()[1].device, " a/b=d");
    }
}
