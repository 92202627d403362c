//! The container's whole environment (`process.env`, any image sets it) through `env_map`,
//! `from_spec` and `route`.
//!
//! Input: newline-separated env entries. Properties: no panic; later entries win and each key
//! appears once; the whole request is read in bounded time (the dedupe was once quadratic:
//! 150,000 entries took 15 s).
#![no_main]

use std::collections::HashSet;
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use nvshim::config::{Config, Mode};
use nvshim::request::{self, env_map};
use serde_json::json;

/// Inputs above this are not interesting for the parser and would only slow the run.
const MAX_INPUT: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    if data.len() > MAX_INPUT {
        return;
    }
    let text = String::from_utf8_lossy(data);
    let entries: Vec<&str> = text.split('\n').collect();
    let spec = json!({"process": {"env": entries}});
    let start = Instant::now();
    if let Ok(env) = env_map(&spec) {
        let mut seen = HashSet::new();
        for (k, v) in &env {
            assert!(seen.insert(*k), "key {k:?} twice");
            let last = entries
                .iter()
                .rev()
                .find_map(|e| e.split_once('=').filter(|(key, _)| key == k))
                .map(|(_, v)| v);
            assert_eq!(last, Some(*v), "{k:?}: not the last value");
        }
    }
    for mode in [Mode::Auto, Mode::Legacy, Mode::Cdi] {
        let cfg = Config {
            mode,
            accept_envvar_unprivileged: nvshim::config::UnprivilegedEnv::Accept,
            ..Config::default()
        };
        if let Ok(req) = request::from_spec(&spec, &cfg) {
            if let Ok(request::Route::Cdi(names, _)) = request::route(&req, &cfg) {
                let unique: HashSet<&String> = names.iter().collect();
                assert_eq!(unique.len(), names.len(), "duplicate CDI names {names:?}");
                for n in &names {
                    assert!(n.starts_with("nvidia.com/gpu="), "env reached kind of {n:?}");
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
