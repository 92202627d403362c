//! The CDI spec parser (`nvshim::cdi::spec::parse`: YAML 1.1 or JSON, one parser) and the
//! consumer's validation. Spec files come from whatever wrote /etc/cdi or /var/run/cdi (a
//! device plugin, an operator, a stale package).
//!
//! Properties: no panic; a spec that parses and validates, written out as JSON or as YAML by
//! nvshim's own writer (what `nvshim cdi generate` emits), parses back equal.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nvshim::cdi::spec::{self, Format};

fuzz_target!(|data: &[u8]| {
    let Ok(parsed) = spec::parse(data) else {
        return;
    };
    if parsed.validate().is_err() {
        return;
    }
    for format in [Format::Json, Format::Yaml] {
        let text = parsed.to_text(format);
        let back = spec::parse(text.as_bytes())
            .unwrap_or_else(|e| panic!("{format:?} nvshim wrote does not parse: {e}\n{text}"));
        assert_eq!(
            back, parsed,
            "{format:?} round trip changed the spec\n{text}"
        );
    }
});
