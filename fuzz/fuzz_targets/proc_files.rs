//! The /proc parsers of `nvshim::host`: `/proc/devices`, `driver/nvidia/gpus/*/information`
//! and PCI bus ids. A driver, a kernel or a `proc-root` of the operator's choosing writes
//! these; none of them may make the shim panic.
//!
//! Input: one selector byte, then the text. Properties: no panic; a bus id that normalises
//! is in the canonical `dddd:bb:dd.f` form and normalises to itself; a parsed GPU's bus id is
//! canonical.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use nvshim::host::{normalize_bus_id, parse_devices, parse_information};

fn assert_canonical(id: &str) {
    assert_eq!(
        normalize_bus_id(id).as_deref(),
        Some(id),
        "normalised bus id {id:?} does not normalise to itself"
    );
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    match which % 3 {
        0 => {
            let _ = parse_devices(text);
        }
        1 => {
            if let Ok(gpu) =
                parse_information(Path::new("/proc/driver/nvidia/gpus/x/information"), text)
            {
                assert_canonical(&gpu.bus_id);
            }
        }
        _ => {
            if let Some(id) = normalize_bus_id(text) {
                assert_canonical(&id);
            }
        }
    }
});
