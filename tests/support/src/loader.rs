//! A dynamic C program that loads `libcuda.so.1` by its SONAME, as CUDA's runtime does, put in a
//! busybox rootfs with the C library it was built against: glibc (the host's loader and
//! `libc.so.6` at Debian's paths, and an `/etc/ld.so.cache` the image's own `ldconfig` builds)
//! or musl (Debian's `musl`: `/lib/ld-musl-x86_64.so.1`, built with `musl-gcc`, as an Alpine
//! image has it). Run in the container it prints one line:
//!
//! ```text
//! CUDA <device count> <file the library was loaded from>   or
//! DLOPEN_FAILED <dlerror>                                  or   CUDA_FAILED
//! ```
//!
//! The fake `libcuda` links `libc.so.6`; musl's loader takes any `libc.*` as itself.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// Where the program is in the rootfs.
pub const PROGRAM: &str = "/bin/dlopen-cuda";

const SOURCE: &str = r#"#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) { printf("DLOPEN_FAILED %s\n", dlerror()); return 2; }
    int (*init)(unsigned) = (int (*)(unsigned))dlsym(h, "cuInit");
    int (*count)(int *) = (int (*)(int *))dlsym(h, "cuDeviceGetCount");
    int n = -1;
    Dl_info info = {0};
    if (!init || !count || init(0) || count(&n) || !dladdr((void *)init, &info)) {
        printf("CUDA_FAILED\n");
        return 3;
    }
    printf("CUDA %d %s\n", n, info.dli_fname);
    return 0;
}
"#;

/// The C library of an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Libc {
    Glibc,
    Musl,
}

/// Adds [`PROGRAM`] built against `libc`, and that C library, to the rootfs at `root`.
pub fn add_dlopen_program(root: &Path, libc: Libc) -> Result<()> {
    let work = tempfile::tempdir().context("creating a build dir")?;
    let src = work.path().join("dlopen-cuda.c");
    fs::write(&src, SOURCE).with_context(|| format!("writing {}", src.display()))?;
    let out = root.join(PROGRAM.trim_start_matches('/'));
    let (cc, files): (&str, &[(&str, &str)]) = match libc {
        Libc::Glibc => (
            "gcc",
            &[
                ("/lib64/ld-linux-x86-64.so.2", "lib64/ld-linux-x86-64.so.2"),
                (
                    "/lib/x86_64-linux-gnu/libc.so.6",
                    "lib/x86_64-linux-gnu/libc.so.6",
                ),
            ],
        ),
        Libc::Musl => (
            "musl-gcc",
            &[("/lib/ld-musl-x86_64.so.1", "lib/ld-musl-x86_64.so.1")],
        ),
    };
    let built = Command::new(cc)
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .output()
        .with_context(|| format!("running {cc} (musl-gcc: apt-get install musl-tools)"))?;
    if !built.status.success() {
        bail!("{cc}: {}", String::from_utf8_lossy(&built.stderr));
    }
    for (host, image) in files {
        let dst: PathBuf = root.join(image);
        fs::create_dir_all(dst.parent().unwrap())
            .with_context(|| format!("creating {}", dst.display()))?;
        // The file itself, not the distribution's link to it.
        fs::copy(fs::canonicalize(host)?, &dst)
            .with_context(|| format!("copying {host} to {}", dst.display()))?;
    }
    if libc == Libc::Glibc {
        // A Debian image has its own cache, listing its own libraries only.
        let status = Command::new(crate::rootfs::LDCONFIG)
            .arg("-r")
            .arg(root)
            .status()
            .context("running ldconfig -r")?;
        if !status.success() {
            bail!("ldconfig -r {} failed: {status}", root.display());
        }
    }
    Ok(())
}

/// What [`PROGRAM`] printed: (device count, file) when it loaded the library.
pub fn parse(stdout: &str) -> Option<(u32, String)> {
    let line = stdout.lines().find(|l| l.starts_with("CUDA "))?;
    let mut parts = line.splitn(3, ' ').skip(1);
    let n = parts.next()?.parse().ok()?;
    Some((n, parts.next()?.to_string()))
}
