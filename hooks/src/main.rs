//! `nvshim-hook`: OCI createContainer hooks (see the library for what each does).
//!
//! `no_main`: the C `main` below skips Rust's runtime set-up (SIGPIPE, the stack-overflow
//! handler with its sigaltstack, and the main thread's stack bounds, which glibc finds by
//! parsing `/proc/self/maps`), about 20 system calls that a hook run on every container start
//! does not need. The arguments are read from `main`'s own (`cli::args_of_main`: std finds
//! them before `main` only on glibc). What the runtime did that still matters is done here:
//! stdin, stdout and stderr are made to exist, so that no file the hook opens can land on fd
//! 0-2 and receive its messages.

#![no_main]

use std::os::raw::{c_char, c_int};

/// # Safety
/// Called by the C runtime only, with its own argc and argv.
#[no_mangle]
pub unsafe extern "C" fn main(argc: c_int, argv: *const *const c_char) -> c_int {
    nvshim_hook::cli::ensure_std_fds();
    // SAFETY: the argc and argv the C runtime passed to `main`.
    let args = unsafe { nvshim_hook::cli::args_of_main(argc, argv) };
    nvshim_hook::cli::main(&args)
}
