//! Generates the NRI messages and ttRPC stubs from proto/nri.proto into OUT_DIR.

use std::path::PathBuf;

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo:rerun-if-changed=proto/nri.proto");
    ttrpc_codegen::Codegen::new()
        .out_dir(&out)
        .inputs(["proto/nri.proto"])
        .include("proto")
        .rust_protobuf()
        .customize(ttrpc_codegen::Customize::default())
        .run()
        .expect("generating the NRI protocol code from proto/nri.proto");
    // The generated files open with inner attributes and docs (`#![allow(..)]`, `//!`),
    // which `include!` cannot take: src/proto.rs puts its own on the modules instead.
    for name in ["nri.rs", "nri_ttrpc.rs"] {
        let path = out.join(name);
        let text = std::fs::read_to_string(&path).expect("reading the generated code");
        let kept: String = text
            .lines()
            .filter(|l| !l.starts_with("#![") && !l.starts_with("//!"))
            .map(|l| format!("{l}\n"))
            .collect();
        std::fs::write(&path, kept).expect("writing the generated code");
    }
}
