//! config.json editing: `Bundle` (load and render), `request::from_spec` and `request::route`
//! over the loaded document, and `edits::apply` of container edits into it.
//!
//! Input: config.json bytes, a 0xFF byte, then `containerEdits` JSON (CDI's shape). A bundle
//! is written by whoever starts the container; edits come from CDI spec files.
//!
//! Properties: no panic; the duplicate-refusing parse gives serde_json's value; applying the same edits twice changes nothing (a retried `create`
//! must not stack devices or mounts, docs/design.md §5); the edited document renders and
//! reads back equal (the atomic save writes exactly what was computed), in the bytes
//! serde_json's writer gives (src/json.rs writes it); the lean load
//! (`linux.seccomp` kept as text) accepts the same documents and renders the same document;
//! what `create` writes with the mounts, device nodes and cgroup rules the edits add kept out
//! of the document (`edits::apply_all_deferred`, written straight from the edits) is byte for
//! byte the document with them applied.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use nvshim::bundle::Bundle;
use nvshim::config::{Config, Mode};
use nvshim::edits::{self, ContainerEdits};
use nvshim::request;

fuzz_target!(|data: &[u8]| {
    let (config, edits) = match data.iter().position(|&b| b == 0xff) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &b""[..]),
    };
    // The faithful parse agrees with serde_json's wherever it accepts a document (it refuses
    // only what serde_json would collapse: a key twice).
    if let Ok(v) = nvshim::bundle::parse_faithful(config) {
        let plain: serde_json::Value = serde_json::from_slice(config).expect("serde_json refused");
        assert_eq!(v, plain);
    }
    let Ok(mut bundle) = Bundle::from_bytes(Path::new("/nonexistent-bundle"), config.to_vec())
    else {
        return;
    };
    for mode in [Mode::Auto, Mode::Legacy, Mode::Cdi] {
        let cfg = Config {
            mode,
            ..Config::default()
        };
        if let Ok(req) = request::from_spec(&bundle.spec, &cfg) {
            let _ = request::route(&req, &cfg);
        }
    }
    let Ok(edits) = serde_json::from_slice::<ContainerEdits>(edits) else {
        return;
    };
    let mut once = bundle.spec.clone();
    if edits::apply(&mut once, &edits).is_err() {
        return;
    }
    let mut twice = once.clone();
    edits::apply(&mut twice, &edits).expect("edits that applied once apply again");
    assert_eq!(
        twice, once,
        "applying the same edits twice changed the document"
    );
    let lean = Bundle::from_bytes_lean(Path::new("/nonexistent-bundle"), config.to_vec())
        .expect("the lean load refused what the full load accepts");
    let mut lean_built = lean.spec.clone();
    edits::apply(&mut lean_built, &edits).expect("edits that applied to the full load");
    let lean_rendered = lean.render_spec(&lean_built);
    let mut deferred = lean.spec.clone();
    let parts = [&edits];
    let left = edits::apply_all_deferred(&mut deferred, &parts)
        .expect("edits that applied built in apply deferred");
    assert_eq!(
        left.render(&lean, &deferred, &parts),
        lean_rendered,
        "the edits written straight differ from the edits built in"
    );
    bundle.spec = once;
    let rendered = bundle.render();
    // nvshim's writer (src/json.rs) writes what serde_json's would, in both layouts.
    let mut serde_text = if config.contains(&b'\n') {
        serde_json::to_vec_pretty(&bundle.spec)
    } else {
        serde_json::to_vec(&bundle.spec)
    }
    .expect("a Value serialises");
    if config.contains(&b'\n') {
        serde_text.push(b'\n');
    }
    assert_eq!(rendered, serde_text, "rendered differently from serde_json");
    let back: serde_json::Value =
        serde_json::from_slice(&rendered).expect("rendered config.json parses");
    assert_eq!(
        back, bundle.spec,
        "rendered config.json reads back different"
    );
    let lean_back: serde_json::Value =
        serde_json::from_slice(&lean_rendered).expect("the lean render parses");
    assert_eq!(lean_back, back, "the lean render differs from the full one");
});
