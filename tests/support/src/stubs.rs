//! ELF stub libraries for the fake driver, compiled with gcc once per driver version and cached.
//!
//! Each stub is a real shared object with the driver's SONAME, so `ldconfig` indexes it and the
//! dynamic linker can load it. `libcuda` and `libnvidia-ml` export a few real entry points; the
//! others export one marker function. The cache lives in the system temp dir, keyed by driver
//! version, CUDA version and a hash of the sources, and is filled atomically (build in a sibling
//! temp dir, then rename) so that concurrent tests share it safely.
//!
//! The distribution's libraries ([`crate::FakeHost::add_system_libraries`]), some 400, are
//! copies of one stub compiled with a placeholder SONAME, patched to each name: one gcc run
//! instead of 400.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{bail, ensure, Context, Result};

use crate::host::{DriverLib, Layout, DRIVER_LIBS};

const CUDA_SOURCE: &str = r#"/* nvshim fake libcuda: just enough of the driver API for a test program. */
#include <ctype.h>
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult; /* CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1 */

const char nvshim_fake_driver_version[] = "@VERSION@";

CUresult cuInit(unsigned int flags) { (void)flags; return 0; }

CUresult cuDriverGetVersion(int *version) {
    if (!version) return 1;
    *version = @CUDA@;
    return 0;
}

/* Counts the /dev/nvidia<N> entries present (NVSHIM_FAKE_DEV overrides /dev, for host-side tests). */
CUresult cuDeviceGetCount(int *count) {
    const char *dir = getenv("NVSHIM_FAKE_DEV");
    if (!count) return 1;
    *count = 0;
    if (!dir || !*dir) dir = "/dev";
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const char *n = e->d_name;
        if (strncmp(n, "nvidia", 6) != 0 || !isdigit((unsigned char)n[6])) continue;
        const char *p = n + 6;
        while (isdigit((unsigned char)*p)) p++;
        if (*p == '\0') (*count)++;
    }
    closedir(d);
    return 0;
}
"#;

const NVML_SOURCE: &str = r#"/* nvshim fake libnvidia-ml. */
#include <string.h>

const char nvshim_fake_driver_version[] = "@VERSION@";

int nvmlInit_v2(void) { return 0; }
int nvmlInit(void) { return 0; }
int nvmlShutdown(void) { return 0; }

/* NVML_ERROR_INVALID_ARGUMENT = 2, NVML_ERROR_INSUFFICIENT_SIZE = 7 */
int nvmlSystemGetDriverVersion(char *buf, unsigned int len) {
    static const char v[] = "@VERSION@";
    if (!buf) return 2;
    if (len < sizeof v) return 7;
    memcpy(buf, v, sizeof v);
    return 0;
}
"#;

const GENERIC_SOURCE: &str = r#"/* nvshim fake driver library @STEM@. */
const char nvshim_fake_driver_version[] = "@VERSION@";
int nvshim_fake_@IDENT@(void) { return 0; }
"#;

fn source_for(lib: &DriverLib, version: &str, cuda: u32) -> String {
    // 32-bit stubs are built without a C library (no 32-bit libc is installed): one marker.
    let template = match lib.stem {
        "libcuda" if !lib.is_32bit() => CUDA_SOURCE,
        "libnvidia-ml" if !lib.is_32bit() => NVML_SOURCE,
        _ => GENERIC_SOURCE,
    };
    let ident: String = lib
        .stem
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    template
        .replace("@VERSION@", version)
        .replace("@CUDA@", &cuda.to_string())
        .replace("@STEM@", lib.stem)
        .replace("@IDENT@", &ident)
}

/// FNV-1a: stable across Rust versions, unlike `DefaultHasher`, so a cache key made with it
/// is too.
pub(crate) fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes.into_iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Where a library's stub is in the stub directory: its file name, under `i386/` for a 32-bit
/// build.
fn stub_name(lib: &DriverLib, version: &str) -> String {
    if lib.is_32bit() {
        format!("i386/{}", lib.file_name(version))
    } else {
        lib.file_name(version)
    }
}

/// Returns a directory holding one compiled stub per entry of [`DRIVER_LIBS`] and the
/// layout's 32-bit libraries, each carrying its SONAME, for the layout's machine (aarch64 ones
/// built by [`crate::arm64::CC`]). Compiles them on first use.
pub(crate) fn compiled_stubs(version: &str, cuda: u32, layout: Layout) -> Result<PathBuf> {
    let sources: Vec<(String, &DriverLib)> = DRIVER_LIBS
        .iter()
        .chain(layout.libraries_32())
        .map(|lib| (source_for(lib, version, cuda), lib))
        .collect();
    let cc = if layout.is_aarch64() {
        crate::arm64::CC
    } else {
        "gcc"
    };
    // Bump STUB_FORMAT when how stubs are built changes (flags, links): the key covers only
    // the sources and names otherwise.
    const STUB_FORMAT: &str = "3: 32-bit stubs need libc.so.6";
    let mut key_parts: Vec<String> = vec![
        STUB_FORMAT.to_string(),
        version.to_string(),
        cuda.to_string(),
        cc.to_string(),
    ];
    for (src, lib) in &sources {
        key_parts.push(src.clone());
        key_parts.push(lib.soname(version));
        key_parts.push(stub_name(lib, version));
    }
    let key = fnv1a(
        key_parts
            .iter()
            .flat_map(|p| p.bytes().chain(std::iter::once(0))),
    );
    cached_dir(&format!("stubs-{version}-{key:016x}"), |build| {
        build_driver_stubs(build, &sources, version, cc)
    })
}

/// `<temp dir>/nvshim-testsupport/<name>`, filled by `build` on first use: it fills a sibling
/// temp dir, which is then renamed into place with a `.complete` marker, so that concurrent
/// tests share one copy safely.
fn cached_dir(name: &str, build: impl FnOnce(&Path) -> Result<()>) -> Result<PathBuf> {
    let parent = std::env::temp_dir().join("nvshim-testsupport");
    let dir = parent.join(name);
    if dir.join(".complete").exists() {
        return Ok(dir);
    }
    fs::create_dir_all(&parent).with_context(|| format!("creating {}", parent.display()))?;
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}-build-"))
        .tempdir_in(&parent)
        .with_context(|| format!("creating a build dir in {}", parent.display()))?;
    build(tmp.path())?;
    fs::write(tmp.path().join(".complete"), b"")
        .with_context(|| format!("marking {} complete", tmp.path().display()))?;

    let built = tmp.keep();
    if let Err(e) = fs::rename(&built, &dir) {
        // Another test won the race: use its copy, drop ours.
        let _ = fs::remove_dir_all(&built);
        if !dir.join(".complete").exists() {
            return Err(e)
                .with_context(|| format!("moving {} to {}", built.display(), dir.display()));
        }
    }
    Ok(dir)
}

/// Compiles the driver's stubs from `sources` into `build`.
fn build_driver_stubs(
    build: &Path,
    sources: &[(String, &DriverLib)],
    version: &str,
    cc: &str,
) -> Result<()> {
    // Start every gcc at once, then wait: a few hundred ms in all instead of a few seconds.
    let mut children: Vec<(String, Child)> = Vec::new();
    fs::create_dir_all(build.join("i386"))
        .with_context(|| format!("creating {}/i386", build.display()))?;
    // No 32-bit C library is installed, so the 32-bit stubs link against a stand-in
    // `libc.so.6`: its name in their DT_NEEDED is what makes ldconfig tag them `libc6`, as it
    // tags the real driver's 32-bit libraries (and what a reader of the cache keys on).
    let libc32 = build.join("libc.so.6");
    let libc_c = build.join("libc32.c");
    fs::write(&libc_c, "int nvshim_fake_libc(void) { return 0; }\n")
        .with_context(|| format!("writing {}", libc_c.display()))?;
    // (None on aarch64: no stand-in to build.)
    if sources.iter().any(|(_, lib)| lib.is_32bit()) {
        let out = Command::new("gcc")
            .args([
                "-shared",
                "-fPIC",
                "-m32",
                "-nostdlib",
                "-Wl,-soname,libc.so.6",
                "-o",
            ])
            .arg(&libc32)
            .arg(&libc_c)
            .output()
            .context("running gcc -m32 (needed for the fake driver's 32-bit libraries)")?;
        if !out.status.success() {
            bail!(
                "gcc -m32 failed to build the 32-bit libc stand-in: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
    }
    for (src, lib) in sources {
        let c_file = build.join(format!("{}.c", stub_name(lib, version)));
        fs::write(&c_file, src).with_context(|| format!("writing {}", c_file.display()))?;
        let out = build.join(stub_name(lib, version));
        let arch: Vec<std::ffi::OsString> = if lib.is_32bit() {
            vec![
                "-m32".into(),
                "-nostdlib".into(),
                "-Wl,--no-as-needed".into(),
                libc32.clone().into(),
            ]
        } else {
            Vec::new()
        };
        let child = Command::new(cc)
            .args(["-shared", "-fPIC", "-O2"])
            .args(&arch)
            .arg(format!("-Wl,-soname,{}", lib.soname(version)))
            .arg("-o")
            .arg(&out)
            .arg(&c_file)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| {
                format!("running {cc} (needed to build the fake driver's stub libraries)")
            })?;
        children.push((lib.stem.to_string(), child));
    }
    let mut failures = Vec::new();
    for (stem, child) in children {
        let out = child
            .wait_with_output()
            .with_context(|| format!("waiting for gcc building {stem}"))?;
        if !out.status.success() {
            failures.push(format!(
                "{stem}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    if !failures.is_empty() {
        bail!(
            "gcc failed to build stub libraries: {}",
            failures.join("; ")
        );
    }
    for (_, lib) in sources {
        let c_file = build.join(format!("{}.c", stub_name(lib, version)));
        fs::remove_file(&c_file).with_context(|| format!("removing {}", c_file.display()))?;
    }
    for f in [&libc32, &libc_c] {
        if f.exists() {
            fs::remove_file(f).with_context(|| format!("removing {}", f.display()))?;
        }
    }
    Ok(())
}

/// The SONAME the system-library stub is compiled with: 100 bytes, longer than any name
/// [`system_stub`] puts in its place.
pub(crate) const SONAME_PLACEHOLDER: &str =
    "nvshim-system-stub-soname-placeholder-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx";

/// Returns one compiled 64-bit shared object whose SONAME is [`SONAME_PLACEHOLDER`], the
/// template of [`system_stub`]. Compiles it on first use (one gcc run, not one per library).
pub(crate) fn compiled_system_stub() -> Result<PathBuf> {
    const SOURCE: &str = "/* nvshim fake host: a distribution library. */\n\
                          int nvshim_fake_system_library(void) { return 0; }\n";
    let key = fnv1a(SOURCE.bytes().chain(SONAME_PLACEHOLDER.bytes()));
    let dir = cached_dir(&format!("system-stub-{key:016x}"), |build| {
        let c_file = build.join("system.c");
        fs::write(&c_file, SOURCE).with_context(|| format!("writing {}", c_file.display()))?;
        let out = Command::new("gcc")
            .args(["-shared", "-fPIC", "-O2"])
            .arg(format!("-Wl,-soname,{SONAME_PLACEHOLDER}"))
            .arg("-o")
            .arg(build.join("libsystem.so"))
            .arg(&c_file)
            .output()
            .context("running gcc (needed to build the fake host's system libraries)")?;
        if !out.status.success() {
            bail!(
                "gcc failed to build the system library stub: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        fs::remove_file(&c_file).with_context(|| format!("removing {}", c_file.display()))
    })?;
    Ok(dir.join("libsystem.so"))
}

/// `template` (the bytes of [`compiled_system_stub`]) with every occurrence of
/// [`SONAME_PLACEHOLDER`] (in `.dynstr`) replaced by `soname` and NUL bytes to the same
/// length: ldconfig and the dynamic linker read DT_SONAME up to its first NUL.
pub(crate) fn system_stub(template: &[u8], soname: &str) -> Result<Vec<u8>> {
    let placeholder = SONAME_PLACEHOLDER.as_bytes();
    ensure!(
        soname.len() < placeholder.len() && !soname.contains('\0'),
        "SONAME {soname:?} does not fit the stub's {}-byte placeholder",
        placeholder.len()
    );
    let mut name = soname.as_bytes().to_vec();
    name.resize(placeholder.len(), 0);
    let mut out = template.to_vec();
    let mut replaced = 0;
    let mut from = 0;
    while let Some(at) = out[from..]
        .windows(placeholder.len())
        .position(|w| w == placeholder)
    {
        let at = from + at;
        out[at..at + placeholder.len()].copy_from_slice(&name);
        from = at + placeholder.len();
        replaced += 1;
    }
    ensure!(
        replaced > 0,
        "the system library stub does not hold its placeholder SONAME"
    );
    Ok(out)
}

/// Copies a compiled stub to `dest`, creating its parent directory.
pub(crate) fn install(stub_dir: &Path, lib: &DriverLib, version: &str, dest: &Path) -> Result<()> {
    let src = stub_dir.join(stub_name(lib, version));
    if let Some(parent) = dest.parent() {
        fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    fs::copy(&src, dest)
        .with_context(|| format!("copying {} to {}", src.display(), dest.display()))?;
    Ok(())
}
