//! `nvshim::runtime::parse_args`: the runc command line, scanned leniently on every call the
//! shim sees (an engine, or anyone who can run it, writes it).
//!
//! Input: NUL-separated arguments. Properties: no panic; only `create` and `run` edit a bundle.
#![no_main]

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;

use libfuzzer_sys::fuzz_target;
use nvshim::runtime::parse_args;

fuzz_target!(|data: &[u8]| {
    let args: Vec<OsString> = data
        .split(|&b| b == 0)
        .map(|a| OsString::from_vec(a.to_vec()))
        .collect();
    if let Ok(inv) = parse_args(&args) {
        if inv.edits_bundle() {
            assert!(matches!(inv.subcommand.as_deref(), Some("create" | "run")));
        }
        let _ = inv.bundle_dir();
    }
});
