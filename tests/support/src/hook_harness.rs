//! The harness of the hook crate's tests (`hooks/tests/hooks/`, one test binary): image trees
//! built by hand, stub libraries with any SONAME, the reference `ldconfig -r`, CUDA compat libraries carrying
//! NVIDIA's forward-compatibility note, the shipped (static) hook binary, and running a hook the
//! way runc runs it (argv0, the OCI state on stdin, cwd = the rootfs, a time limit, optionally in
//! a private mount namespace).
//!
//! Unlike the rest of this crate, which simulates a whole GPU host, these helpers build the
//! small, often hostile, image roots the hooks are tried against; busybox rootfs, bundles and
//! runc itself come from [`crate::Rootfs`], [`crate::Bundle`] and [`crate::Runtime`]. They panic
//! on failure, as the test code calling them would.
//!
//! What needs root (mknod, `ldconfig -r`'s chroot, mount namespaces, runc) calls
//! [`require_root`] first, which fails with one line saying so.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use nix::mount::{mount, MsFlags};
use nix::sched::{unshare, CloneFlags};

use crate::rootfs::LDCONFIG;

/// Panics with one line unless the test runs as root ([`crate::require_root`]).
pub fn require_root() {
    if let Err(e) = crate::require_root() {
        panic!("{e}");
    }
}

/// FNV-1a over `data` ([`crate::stubs`]'s).
fn fnv(data: &[u8]) -> u64 {
    crate::stubs::fnv1a(data.iter().copied())
}

/// Where compiled stubs are kept, shared by every test process: the stub source is written
/// once, each library is built under a private name and renamed into place.
fn stub_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir()
            .join("nvshim-testsupport")
            .join("hook-stubs-1");
        fs::create_dir_all(&dir).unwrap();
        let src = dir.join("stub.c");
        if !src.exists() {
            let tmp = dir.join(format!("stub.c.{}", std::process::id()));
            fs::write(&tmp, "int nvshim_stub(void) { return 42; }\n").unwrap();
            fs::rename(&tmp, &src).unwrap();
        }
        dir
    })
}

/// A shared object with this SONAME (compiled once, then reused).
pub fn stub(soname: &str) -> PathBuf {
    stub_for("gcc", soname)
}

/// [`stub`] compiled by `cc` (`gcc`, or [`crate::arm64::CC`] for an aarch64 one).
pub fn stub_for(cc: &str, soname: &str) -> PathBuf {
    static LOCK: Mutex<()> = Mutex::new(());
    let _guard = LOCK.lock().unwrap();
    let prefix = if cc == "gcc" {
        String::new()
    } else {
        format!("{cc}/")
    };
    let out = stub_dir().join(format!("{prefix}{}.so", soname.replace('/', "%")));
    fs::create_dir_all(out.parent().unwrap()).unwrap();
    if !out.exists() {
        // Built under a private name and renamed: other test binaries may race for it.
        let tmp = stub_dir().join(format!(
            "{prefix}{}.{}.tmp",
            soname.replace('/', "%"),
            std::process::id()
        ));
        compile_shared_with(
            cc,
            &stub_dir().join("stub.c"),
            &tmp,
            &[&format!("-Wl,-soname,{soname}")],
        );
        fs::rename(&tmp, &out).unwrap();
    }
    out
}

/// A directory tree under construction; paths are written as in the image (`/etc/...`).
pub struct Tree {
    pub root: PathBuf,
}

impl Tree {
    pub fn new(root: &Path) -> Tree {
        fs::create_dir_all(root).unwrap();
        Tree {
            root: root.to_path_buf(),
        }
    }

    /// `p` (absolute in the image) on the host.
    pub fn path(&self, p: &str) -> PathBuf {
        self.root.join(p.trim_start_matches('/'))
    }

    pub fn dir(&self, p: &str) -> &Self {
        fs::create_dir_all(self.path(p)).unwrap();
        self
    }

    pub fn file(&self, p: &str, contents: &str) -> &Self {
        let path = self.path(p);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, contents).unwrap();
        self
    }

    pub fn link(&self, p: &str, target: &str) -> &Self {
        let path = self.path(p);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        symlink(target, path).unwrap();
        self
    }

    /// Places a stub library with `soname` at `p`.
    pub fn lib(&self, p: &str, soname: &str) -> &Self {
        self.lib_for("gcc", p, soname)
    }

    /// [`Tree::lib`] compiled by `cc` ([`stub_for`]).
    pub fn lib_for(&self, cc: &str, p: &str, soname: &str) -> &Self {
        let path = self.path(p);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::copy(stub_for(cc, soname), path).unwrap();
        self
    }
}

/// `cp -a src dst`.
pub fn copy_tree(src: &Path, dst: &Path) {
    let status = Command::new("cp")
        .arg("-a")
        .arg(src)
        .arg(dst)
        .status()
        .unwrap();
    assert!(status.success());
}

/// Runs the reference `ldconfig -r ROOT` (the host's, [`LDCONFIG`]; as root it chroots there).
pub fn ldconfig_r(root: &Path) {
    ldconfig_r_with(Path::new(LDCONFIG), root)
}

/// [`ldconfig_r`] with another `ldconfig` (an arm64 one: [`crate::arm64::root`]'s).
pub fn ldconfig_r_with(ldconfig: &Path, root: &Path) {
    require_root();
    let out = Command::new(ldconfig)
        .arg("-r")
        .arg(root)
        .env_clear()
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ldconfig -r: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every symlink below `dir`: relative path -> target.
pub fn symlinks(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        let Ok(rd) = fs::read_dir(dir) else { return };
        for e in rd {
            let e = e.unwrap();
            let p = e.path();
            let meta = fs::symlink_metadata(&p).unwrap();
            if meta.file_type().is_symlink() {
                out.insert(
                    p.strip_prefix(base).unwrap().display().to_string(),
                    fs::read_link(&p).unwrap().display().to_string(),
                );
            } else if meta.is_dir() {
                walk(base, &p, out);
            }
        }
    }
    walk(dir, dir, &mut out);
    out
}

/// Content fingerprint of files and symlinks under `paths` (FNV-1a of type, target, bytes).
pub fn fingerprint(paths: &[PathBuf]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    fn walk(p: &Path, out: &mut BTreeMap<String, String>, depth: u32) {
        let Ok(meta) = fs::symlink_metadata(p) else {
            out.insert(p.display().to_string(), "absent".into());
            return;
        };
        let ft = meta.file_type();
        let key = p.display().to_string();
        if ft.is_symlink() {
            out.insert(key, format!("link {}", fs::read_link(p).unwrap().display()));
        } else if ft.is_file() {
            // Sparse giants are fingerprinted by size only.
            if meta.len() > 64 << 20 {
                out.insert(key, format!("file size {}", meta.len()));
            } else {
                out.insert(
                    key,
                    format!(
                        "file {:x} mode {:o}",
                        fnv(&fs::read(p).unwrap()),
                        meta.permissions().mode()
                    ),
                );
            }
        } else if ft.is_dir() {
            out.insert(key, "dir".into());
            if depth < 4 {
                let mut names: Vec<_> = fs::read_dir(p)
                    .unwrap()
                    .map(|e| e.unwrap().path())
                    .collect();
                names.sort();
                for n in names {
                    walk(&n, out, depth + 1);
                }
            }
        } else {
            out.insert(key, format!("special {:o}", meta.permissions().mode()));
        }
    }
    for p in paths {
        walk(p, &mut out, 0);
    }
    out
}

/// A bundle directory whose config.json points at `rootfs` (elsewhere) and whose process asks
/// for `LD_PRELOAD=/evil.so`; returns the OCI state JSON runc gives a hook on stdin.
pub fn hook_bundle(dir: &Path, rootfs: &Path) -> String {
    fs::create_dir_all(dir).unwrap();
    fs::write(
        dir.join("config.json"),
        format!(
            r#"{{"ociVersion":"1.0.2","root":{{"path":"{}"}},"process":{{"env":["LD_PRELOAD=/evil.so"]}}}}"#,
            rootfs.display()
        ),
    )
    .unwrap();
    format!(
        r#"{{"ociVersion":"1.0.2","id":"test","status":"creating","pid":1,"bundle":"{}","annotations":{{}}}}"#,
        dir.display()
    )
}

/// `mkfifo`.
pub fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(status.success());
}

/// `mknod PATH c MAJOR MINOR`, mode 0666 (less the umask), panicking with the path.
pub fn mknod_chr(path: &Path, major: u32, minor: u32) {
    require_root();
    if let Err(e) = crate::host::make_char_node(path, major, minor) {
        panic!("{e:#}");
    }
}

/// Makes the calling thread's mount namespace a new one with every mount private
/// (`unshare(CLONE_NEWNS)`, then `/` made `rprivate`), so that nothing mounted afterwards is seen
/// by the test's namespace. Only two system calls and no allocation: safe in a `pre_exec`.
pub fn enter_private_mount_ns() -> std::io::Result<()> {
    unshare(CloneFlags::CLONE_NEWNS)?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )?;
    Ok(())
}

/// Mounts a new tmpfs on `dir` (in a mount namespace of the test's own,
/// [`enter_private_mount_ns`]): a file system of its own, as a host's is beside an image's.
pub fn mount_tmpfs(dir: &Path) {
    let none = None::<&str>;
    mount(Some("tmpfs"), dir, Some("tmpfs"), MsFlags::empty(), none).expect("tmpfs mounted");
}

/// Bind-mounts the file `source` onto `target` (made empty first), as a runtime mounts a
/// host's library into a container.
pub fn bind_file(source: &Path, target: &Path) {
    fs::write(target, b"").unwrap();
    let none = None::<&str>;
    mount(Some(source), target, none, MsFlags::MS_BIND, none).expect("bind mount");
}

/// The hook binary static-pie, as it ships (`-C target-feature=+crt-static`: linked with glibc,
/// as scripts/build-release.sh links it), so the dynamic loader never runs and `LD_PRELOAD`
/// cannot inject code. Built once per test process with `cargo rustc` into its own target directory under `target_tmpdir`
/// (the calling test's `env!("CARGO_TARGET_TMPDIR")`): the flag applies to the final link
/// only, and a separate directory keeps the cargo-built binary untouched.
pub fn static_hook(target_tmpdir: &str) -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let target = Path::new(target_tmpdir).join("nvshim-hook-static");
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../hooks/Cargo.toml");
        let out = Command::new(env!("CARGO"))
            .args([
                "rustc",
                "--offline",
                "--quiet",
                "--bin",
                "nvshim-hook",
                "--manifest-path",
            ])
            .arg(&manifest)
            .arg("--target-dir")
            .arg(&target)
            .args(["--", "-C", "target-feature=+crt-static"])
            .env_remove("CARGO_TARGET_DIR")
            .env_remove("CARGO_BUILD_TARGET")
            .output()
            .expect("cargo runs");
        assert!(
            out.status.success(),
            "static build failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let bin = target.join("debug/nvshim-hook");
        let file = Command::new("file").arg(&bin).output().unwrap();
        let desc = String::from_utf8_lossy(&file.stdout).to_string();
        assert!(desc.contains("static"), "not a static binary: {desc}");
        bin
    })
    .clone()
}

/// One hook run.
#[derive(Debug)]
pub struct Run {
    /// Exit status; `None` if it had to be killed.
    pub code: Option<i32>,
    pub stderr: String,
    pub elapsed: Duration,
}

/// Runs `bin` as `argv0 ARGS...` with exactly `env`, `state` on stdin, killed after `timeout`.
pub fn run_hook(
    bin: &Path,
    argv0: &str,
    args: &[&str],
    state: &str,
    env: &[(&str, &str)],
    cwd: &Path,
    timeout: Duration,
) -> Run {
    run_hook_with(bin, argv0, args, state, env, cwd, timeout, false)
}

/// [`run_hook`], optionally in a new private mount namespace ([`enter_private_mount_ns`] in the
/// child before exec), where a hook that mounts (`disable-device-node-modification`) cannot
/// leave a mount in the test's namespace.
#[allow(clippy::too_many_arguments)]
pub fn run_hook_with(
    bin: &Path,
    argv0: &str,
    args: &[&str],
    state: &str,
    env: &[(&str, &str)],
    cwd: &Path,
    timeout: Duration,
    private_mount_ns: bool,
) -> Run {
    use std::io::{Read, Write};
    use std::os::unix::process::CommandExt;
    use std::process::Stdio;
    let start = Instant::now();
    let mut command = Command::new(bin);
    command
        .arg0(argv0)
        .args(args)
        .env_clear()
        .envs(env.iter().copied())
        .current_dir(cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if private_mount_ns {
        require_root();
        // SAFETY: the closure runs in the forked child before exec and makes only two system
        // calls (async-signal-safe), allocating nothing.
        unsafe {
            command.pre_exec(enter_private_mount_ns);
        }
    }
    let mut child = command.spawn().expect("hook starts");
    let mut stdin = child.stdin.take().unwrap();
    let state = state.to_string();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(state.as_bytes());
    });
    let code =
        crate::runner::wait_with_deadline(&mut child, start, timeout, Duration::from_millis(2))
            .unwrap()
            .and_then(|status| status.code());
    let _ = writer.join();
    let mut stderr = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut stderr);
    Run {
        code,
        stderr,
        elapsed: start.elapsed(),
    }
}

/// Compiles a library whose constructor creates `marker`: what an image's `LD_PRELOAD` would
/// do to a dynamically linked hook (CVE-2025-23266, "NVIDIAScape").
pub fn preload_library(dir: &Path, marker: &Path) -> PathBuf {
    let src = dir.join("preload.c");
    fs::write(
        &src,
        format!(
            "#include <fcntl.h>\n#include <unistd.h>\n\
             __attribute__((constructor)) static void owned(void) {{\n\
               int fd = open(\"{}\", O_CREAT | O_WRONLY, 0644);\n\
               if (fd >= 0) {{ write(fd, \"owned\\n\", 6); close(fd); }}\n}}\n",
            marker.display()
        ),
    )
    .unwrap();
    let out = dir.join("preload.so");
    compile_shared(&src, &out, &[]);
    out
}

/// `gcc -shared -fPIC FLAGS -o out src`: a shared object for a test.
pub fn compile_shared(src: &Path, out: &Path, flags: &[&str]) {
    compile_shared_with("gcc", src, out, flags)
}

/// [`compile_shared`] with another compiler (`cc`).
pub fn compile_shared_with(cc: &str, src: &Path, out: &Path, flags: &[&str]) {
    let status = Command::new(cc)
        .args(["-shared", "-fPIC"])
        .args(flags)
        .arg("-o")
        .arg(out)
        .arg(src)
        .status()
        .unwrap_or_else(|e| panic!("{cc} does not run: {e}"));
    assert!(status.success(), "{cc} failed for {}", out.display());
}

/// How a test CUDA compat library carries its `.note.cuda.fwd_compatibility`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoteBuild {
    /// An assembler `.section ...,"a",@note` (4-byte aligned) linked in by gcc.
    Asm,
    /// Added to the linked stub by `objcopy --add-section`, then given this alignment.
    Objcopy(u32),
    /// No note at all.
    None,
}

/// The note NVIDIA's compat libraries carry: `Elf32_Nhdr`, owner, JSON descriptor, each padded
/// to 4 bytes.
pub fn note_bytes(owner: &str, desc: &[u8]) -> Vec<u8> {
    let mut name = owner.as_bytes().to_vec();
    name.push(0);
    let mut out = Vec::new();
    out.extend_from_slice(&(name.len() as u32).to_le_bytes());
    out.extend_from_slice(&(desc.len() as u32).to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    for part in [&name[..], desc] {
        out.extend_from_slice(part);
        while out.len() % 4 != 0 {
            out.push(0);
        }
    }
    out
}

/// A shared object with SONAME `libcuda.so.1` and a CUDA forward-compatibility note holding
/// `json` (owner `owner`), built with gcc (and objcopy) once per content and reused.
pub fn compat_lib(owner: &str, json: &str, how: NoteBuild) -> PathBuf {
    static LOCK: Mutex<()> = Mutex::new(());
    let _guard = LOCK.lock().unwrap();
    let hash = fnv(format!("{owner}\0{json}\0{how:?}").as_bytes());
    let out = stub_dir().join(format!("compat-{hash:016x}.so"));
    if out.exists() {
        return out;
    }
    let tmp = stub_dir().join(format!("compat-{hash:016x}.{}", std::process::id()));
    fs::create_dir_all(&tmp).unwrap();
    let note = note_bytes(owner, json.as_bytes());
    let mut sources = vec![stub_dir().join("stub.c")];
    if how == NoteBuild::Asm {
        let bytes: Vec<String> = note.iter().map(|b| format!("0x{b:02x}")).collect();
        let asm = tmp.join("note.s");
        fs::write(
            &asm,
            format!(
                ".section .note.cuda.fwd_compatibility,\"a\",@note\n.balign 4\n.byte {}\n\
                 .section .note.GNU-stack,\"\",@progbits\n",
                bytes.join(",")
            ),
        )
        .unwrap();
        sources.push(asm);
    }
    let linked = tmp.join("linked.so");
    let status = Command::new("gcc")
        .args(["-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o"])
        .arg(&linked)
        .args(&sources)
        .status()
        .expect("gcc runs");
    assert!(status.success(), "gcc failed");
    if let NoteBuild::Objcopy(align) = how {
        let bin = tmp.join("note.bin");
        fs::write(&bin, &note).unwrap();
        let added = tmp.join("added.so");
        let section = ".note.cuda.fwd_compatibility";
        let status = Command::new("objcopy")
            .arg("--add-section")
            .arg(format!("{section}={}", bin.display()))
            .arg("--set-section-flags")
            .arg(format!("{section}=readonly,contents"))
            .arg(&linked)
            .arg(&added)
            .status()
            .expect("objcopy runs");
        assert!(status.success());
        // A second pass: objcopy applies no alignment to a section it adds in the same run.
        let status = Command::new("objcopy")
            .arg("--set-section-alignment")
            .arg(format!("{section}={align}"))
            .arg(&added)
            .arg(&linked)
            .status()
            .expect("objcopy runs");
        assert!(status.success());
    }
    fs::rename(&linked, &out).unwrap();
    let _ = fs::remove_dir_all(&tmp);
    out
}

/// NVIDIA's note for a CUDA compat library supporting these driver branches.
pub fn compat_json(cuda: &str, drivers: &[u32]) -> String {
    let d: Vec<String> = drivers.iter().map(u32::to_string).collect();
    format!(
        r#"{{"Format":1,"CUDA Version":"{cuda}","Driver":[{}],"Device":[1,2,7,8,9,10,11,12,13,14]}}"#,
        d.join(",")
    )
}
