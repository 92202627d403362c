//! The fake library carries the SONAME the real one has (`libnvidia-ml.so.1`, as
//! `readelf -d` shows on a driver's `libnvidia-ml.so.<version>`): copied over a fake host's
//! driver file, it is indexed by ldconfig (and nvshim-hook's port of it) as the real one is.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
}
