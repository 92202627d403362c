//! What a container asks for through its environment: `NVIDIA_VISIBLE_DEVICES`,
//! `NVIDIA_DRIVER_CAPABILITIES` and `NVIDIA_REQUIRE_*` (any image can set these; an
//! unprivileged user controls them).
//!
//! Input: one selector byte, then the value. Properties: no panic; the device list has no
//! empty and no duplicate entries; a parsed capability set parses the same from its own
//! rendering as a comma list.
#![no_main]

use std::collections::BTreeSet;

use libfuzzer_sys::fuzz_target;
use nvshim::nvidia::Capabilities;
use nvshim::request::{parse_requirement, parse_visible_devices, VisibleDevices};

fn caps_text(c: &Capabilities) -> String {
    c.names().join(",")
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let Ok(value) = std::str::from_utf8(rest) else {
        return;
    };
    match which % 3 {
        0 => {
            if let VisibleDevices::List(ids) = parse_visible_devices(Some(value)) {
                let mut seen = BTreeSet::new();
                for id in &ids {
                    assert!(!id.trim().is_empty(), "empty device id from {value:?}");
                    assert!(seen.insert(id), "duplicate device id {id:?} from {value:?}");
                }
            }
        }
        1 => {
            if let Ok(caps) = Capabilities::parse(Some(value)) {
                let text = caps_text(&caps);
                if !text.is_empty() {
                    let again =
                        Capabilities::parse(Some(&text)).expect("rendered capabilities parse");
                    assert_eq!(again, caps, "capabilities {value:?} -> {text:?} changed");
                }
            }
        }
        _ => {
            let _ = parse_requirement("NVIDIA_REQUIRE_CUDA", value);
        }
    }
});
