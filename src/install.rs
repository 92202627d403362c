//! Where nvshim's own binaries are, and the host the config points at: what the runtime, the
//! resolvers and the operator tool all need before they read a request. One home for "our
//! binary next to me, else `/usr/bin`", and for which binary is running ([`self_exe`],
//! [`build_id`]).
//!
//! Neither needs `/proc/self` ([`self_exe`] falls back to it only where the kernel ran no
//! path): the first look into it costs a process about 0.03 ms, most of it when the process's
//! `/proc/<pid>` entries are torn down at its end (a static C program that reads
//! `/proc/self/exe` before it execs `/bin/true`, against the same without, 1,500 paired
//! rounds: +0.031 ms), and `nvshim-runtime` looked into it on every call.

use std::path::{Path, PathBuf};

use crate::config::Config;
use crate::host::nvml::NvmlAccess;
use crate::host::{Host, HostRoots};

/// The host as the config locates it, keeping what it reads of the GPUs in `cache-dir`.
pub fn host_from(config: &Config) -> Host {
    Host::new(HostRoots {
        driver_root: config.driver_root.clone(),
        dev_root: config.dev_root.clone(),
        proc_root: config.proc_root.clone(),
    })
    .with_cache_dir(&config.cache_dir)
}

/// The host binaries `create` writes into the spec or runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tools {
    /// The `nvshim-hook` written into hooks.
    pub hook: PathBuf,
    /// How the NVML inventory is obtained, the rare times a request needs it.
    pub nvml: NvmlAccess,
}

impl Tools {
    /// For `nvshim-runtime` (statically linked): NVML through the `nvshim` installed next to
    /// it, else `/usr/bin/nvshim`.
    pub fn for_runtime(config: &Config, self_exe: Option<&Path>) -> Tools {
        Tools {
            hook: hook_path(config, self_exe),
            nvml: NvmlAccess::Helper(sibling(self_exe, "nvshim")),
        }
    }

    /// For `nvshim` itself (`explain`): NVML in process.
    pub fn in_process(config: &Config, self_exe: Option<&Path>) -> Tools {
        Tools {
            hook: hook_path(config, self_exe),
            nvml: NvmlAccess::InProcess,
        }
    }
}

/// The running binary, symlinks resolved, as [`std::env::current_exe`] gives it: the path the
/// kernel ran it from (`AT_EXECFN`) with its links resolved, else `current_exe`
/// (`/proc/self/exe`) where that is not a path to a file (an `execveat` of a descriptor gives
/// `/dev/fd/<n>`).
pub fn self_exe() -> Option<PathBuf> {
    exec_path()
        .filter(|p| !p.starts_with("/dev/fd") && !p.starts_with("/proc"))
        .and_then(|p| resolve_links(&p))
        .or_else(|| std::env::current_exe().ok())
}

/// `path` made absolute with every symlink resolved and `.` and `..` removed, by a `readlink`
/// of each component: what `realpath(3)` answers (and `std::fs::canonicalize`, which calls
/// it), without musl's `realpath`, whose answer comes from the C library's `malloc`: its first
/// use sets up musl's heap beside the runtime's own allocator (five more system calls and a
/// page). `None` for a missing component or a loop (more than 40 links, as Linux allows).
fn resolve_links(path: &Path) -> Option<PathBuf> {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let parts = |p: &[u8]| -> Vec<Vec<u8>> {
        p.split(|b| *b == b'/')
            .filter(|c| !c.is_empty())
            .rev()
            .map(<[u8]>::to_vec)
            .collect()
    };
    let bytes = path.as_os_str().as_bytes();
    let mut out = if bytes.first() == Some(&b'/') {
        Vec::new()
    } else {
        std::env::current_dir().ok()?.into_os_string().into_vec()
    };
    let mut pending = parts(bytes);
    let mut links = 0;
    while let Some(name) = pending.pop() {
        match name.as_slice() {
            b"." => continue,
            b".." => {
                let cut = out.iter().rposition(|b| *b == b'/').unwrap_or(0);
                out.truncate(cut);
                continue;
            }
            _ => {}
        }
        let len = out.len();
        out.push(b'/');
        out.extend_from_slice(&name);
        match std::fs::read_link(std::ffi::OsStr::from_bytes(&out)) {
            Ok(target) => {
                links += 1;
                if links > 40 {
                    return None;
                }
                let target = target.into_os_string().into_vec();
                out.truncate(if target.first() == Some(&b'/') {
                    0
                } else {
                    len
                });
                pending.extend(parts(&target));
            }
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            Err(_) => return None,
        }
    }
    if out.is_empty() {
        out.push(b'/');
    }
    Some(PathBuf::from(std::ffi::OsString::from_vec(out)))
}

/// `AT_EXECFN`: the path `execve` was given, as the kernel copied it for the process.
fn exec_path() -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: getauxval reads the auxiliary vector the kernel gave the process; no
    // preconditions. AT_EXECFN, when present, points at a NUL-terminated string on the initial
    // stack, which lives as long as the process.
    let at = unsafe { libc::getauxval(libc::AT_EXECFN) } as *const libc::c_char;
    if at.is_null() {
        return None;
    }
    // SAFETY: as above: a valid C string for the life of the process.
    let bytes = unsafe { std::ffi::CStr::from_ptr(at) }.to_bytes();
    (!bytes.is_empty()).then(|| PathBuf::from(std::ffi::OsStr::from_bytes(bytes)))
}

/// The running build's GNU build ID in hex (the linker's hash of the program it wrote), read
/// from the program's own `PT_NOTE` headers in memory: it names the build, not the file, so it
/// serves as the key of what this build's tables computed (`legacy::files_cache`). `None` when
/// the linker wrote none.
pub fn build_id() -> Option<&'static str> {
    static ID: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        let mut found: Option<&'static [u8]> = None;
        // SAFETY: the callback only reads the headers dl_iterate_phdr hands it, and the notes
        // they locate in the program's own mapped, read-only segments (which stay mapped for
        // the life of the process), and writes `found` through the pointer passed in `data`.
        unsafe {
            libc::dl_iterate_phdr(Some(note_of), (&mut found as *mut Option<&[u8]>).cast());
        }
        found.map(|id| id.iter().map(|b| format!("{b:02x}")).collect())
    })
    .as_deref()
}

/// [`build_id`]'s callback: the `NT_GNU_BUILD_ID` note among the first object's `PT_NOTE`
/// segments (the program itself; a static program has no other).
unsafe extern "C" fn note_of(
    info: *mut libc::dl_phdr_info,
    _size: libc::size_t,
    data: *mut libc::c_void,
) -> libc::c_int {
    const NT_GNU_BUILD_ID: u32 = 3;
    // SAFETY: dl_iterate_phdr passes a valid `info` whose `dlpi_phdr` has `dlpi_phnum` headers,
    // and `data` is `build_id`'s `found`.
    let (info, found) = unsafe { (&*info, &mut *data.cast::<Option<&'static [u8]>>()) };
    // SAFETY: as above.
    let headers = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
    for h in headers.iter().filter(|h| h.p_type == libc::PT_NOTE) {
        // SAFETY: a PT_NOTE segment is mapped at the load address plus its virtual address,
        // `p_memsz` bytes, for the life of the process.
        let notes: &'static [u8] = unsafe {
            std::slice::from_raw_parts(
                (info.dlpi_addr as usize + h.p_vaddr as usize) as *const u8,
                h.p_memsz as usize,
            )
        };
        let mut at = 0;
        // Each note: name size, descriptor size, type, then the name and the descriptor, each
        // padded to 4 bytes.
        while let Some(head) = notes.get(at..at + 12) {
            let word = |i: usize| u32::from_ne_bytes(head[i..i + 4].try_into().unwrap_or([0; 4]));
            let (name_len, desc_len, kind) = (word(0) as usize, word(4) as usize, word(8));
            let name_at = at + 12;
            let desc_at = name_at + name_len.next_multiple_of(4);
            let Some(desc) = notes.get(desc_at..desc_at + desc_len) else {
                break;
            };
            if kind == NT_GNU_BUILD_ID && notes.get(name_at..name_at + name_len) == Some(b"GNU\0") {
                *found = Some(desc);
                return 1;
            }
            at = desc_at + desc_len.next_multiple_of(4);
        }
    }
    // The first object is the program: stop there.
    1
}

/// `name` installed next to the running binary, else in `/usr/bin`.
fn sibling(self_exe: Option<&Path>, name: &str) -> PathBuf {
    self_exe
        .and_then(Path::parent)
        .map(|d| d.join(name))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| Path::new("/usr/bin").join(name))
}

/// The `nvshim-hook` written into hooks: the configured path, else the one installed next to
/// the running binary, else `/usr/bin/nvshim-hook`.
pub fn hook_path(config: &Config, self_exe: Option<&Path>) -> PathBuf {
    match &config.hook_path {
        Some(p) => p.clone(),
        None => sibling(self_exe, "nvshim-hook"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The path found without `/proc` is the one `/proc/self/exe` names.
    #[test]
    fn self_exe_is_what_proc_names() {
        let want = std::fs::canonicalize(std::env::current_exe().unwrap()).unwrap();
        assert_eq!(self_exe(), Some(want));
    }

    /// Links resolved as `realpath` resolves them: relative and absolute targets, chains, `.`
    /// and `..` (after a link: from where the link led), a relative start; a loop and a
    /// missing component are `None`.
    #[test]
    fn links_resolve_as_realpath_does() {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir().unwrap();
        let d = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir_all(d.join("opt/nvshim/bin")).unwrap();
        std::fs::write(d.join("opt/nvshim/bin/nvshim-runtime"), "").unwrap();
        std::fs::create_dir_all(d.join("usr/bin")).unwrap();
        symlink("usr/bin", d.join("bin")).unwrap();
        symlink(
            d.join("opt/nvshim/bin/nvshim-runtime"),
            d.join("usr/bin/abs"),
        )
        .unwrap();
        symlink("../../opt/nvshim/bin/nvshim-runtime", d.join("usr/bin/rel")).unwrap();
        symlink("rel", d.join("usr/bin/chain")).unwrap();
        symlink("../nvshim", d.join("usr/bin/up")).unwrap();
        symlink("loop2", d.join("usr/bin/loop1")).unwrap();
        symlink("loop1", d.join("usr/bin/loop2")).unwrap();
        for p in [
            "bin/abs",
            "bin/rel",
            "bin/chain",
            "usr/bin/./chain",
            "bin/../bin/rel",
            "opt/nvshim/bin/nvshim-runtime",
            "usr/bin",
            "bin/up/../bin",
        ] {
            let want = std::fs::canonicalize(d.join(p)).ok();
            assert_eq!(resolve_links(&d.join(p)), want, "{p}");
        }
        assert_eq!(resolve_links(&d.join("bin/loop1")), None);
        assert_eq!(resolve_links(&d.join("bin/missing")), None);
        assert_eq!(resolve_links(Path::new("/")), Some(PathBuf::from("/")));
        let here = std::env::current_dir().unwrap();
        assert_eq!(
            resolve_links(Path::new(".")),
            std::fs::canonicalize(&here).ok()
        );
    }

    /// The build ID read from memory is the one in the binary's file, after its `GNU` note
    /// name, and the same on every call.
    #[test]
    fn build_id_is_the_files_note() {
        let id = build_id().expect("the test binary has a build ID (gcc's and lld's default)");
        assert!(id.len() >= 16 && id.len() % 2 == 0, "{id}");
        let raw: Vec<u8> = (0..id.len() / 2)
            .map(|i| u8::from_str_radix(&id[2 * i..2 * i + 2], 16).unwrap())
            .collect();
        let file = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let note = [b"GNU\0".as_slice(), &raw].concat();
        assert!(file.windows(note.len()).any(|w| w == note));
        assert_eq!(build_id(), Some(id));
    }
}
