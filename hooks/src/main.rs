//! `nvshim-hook`: OCI createContainer hooks (see the library for what each does).
//!
//! `no_main`: the C `main` below skips Rust's runtime set-up (SIGPIPE, the stack-overflow
//! handler with its sigaltstack, and the main thread's stack bounds, which glibc finds by
//! parsing `/proc/self/maps`), about 20 system calls that a hook run on every container start
//! does not need. `std::env::args_os` still works: std records argv from `.init_array` on glibc.
//! What the runtime did that still matters is done here: stdin, stdout and stderr are made to
//! exist, so that no file the hook opens can land on fd 0-2 and receive its messages.

#![no_main]

use std::os::raw::{c_char, c_int};

#[no_mangle]
pub extern "C" fn main(_argc: c_int, _argv: *const *const c_char) -> c_int {
    nvshim_hook::cli::ensure_std_fds();
    nvshim_hook::cli::main()
}
