//! CDI device annotations (`cdi.k8s.io/*`, set by device plugins and DRA drivers, or by
//! whoever writes a pod spec) through `from_spec` and `route`.
//!
//! Input: newline-separated `key=value` annotations; a key not starting with `!` gets the
//! `cdi.k8s.io/` prefix. Properties: no panic; routed names are unique, valid and at most
//! `MAX_DEVICE_NAMES`; bounded time (200,000 names in one annotation once took 52 s).
#![no_main]

use std::collections::HashSet;
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use nvshim::cdi::name::parse_qualified_name;
use nvshim::config::{Config, Mode};
use nvshim::request::{self, MAX_DEVICE_NAMES};
use serde_json::{Map, Value};

/// Inputs above this are not interesting for the parser and would only slow the run.
const MAX_INPUT: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    if data.len() > MAX_INPUT {
        return;
    }
    let text = String::from_utf8_lossy(data);
    let mut annotations = Map::new();
    for line in text.split('\n') {
        let (k, v) = line.split_once('=').unwrap_or((line, ""));
        let key = match k.strip_prefix('!') {
            Some(raw) => raw.to_string(),
            None => format!("cdi.k8s.io/{k}"),
        };
        annotations.insert(key, Value::String(v.to_string()));
    }
    let spec = serde_json::json!({
        "process": {"env": ["NVIDIA_VISIBLE_DEVICES=void"]},
        "annotations": annotations,
    });
    let start = Instant::now();
    for mode in [Mode::Auto, Mode::Cdi] {
        let cfg = Config {
            mode,
            ..Config::default()
        };
        if let Ok(req) = request::from_spec(&spec, &cfg) {
            if let Ok(request::Route::Cdi(names, _)) = request::route(&req, &cfg) {
                assert!(names.len() <= MAX_DEVICE_NAMES);
                let unique: HashSet<&String> = names.iter().collect();
                assert_eq!(unique.len(), names.len(), "duplicate CDI names {names:?}");
                for n in &names {
                    assert!(parse_qualified_name(n).is_ok(), "invalid name {n:?} routed");
                }
            }
        }
    }
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{} bytes took {:?}",
        data.len(),
        start.elapsed()
    );
});
