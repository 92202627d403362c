//! NVIDIA's other hooks through the library, on image trees built here: the ELF note reader on
//! libraries made with gcc and objcopy, `enable-cuda-compat`'s decisions and file, the
//! `disable-device-node-modification` mount (in a private mount namespace of a test thread),
//! `update-application-profile` and `chmod` against images whose paths lead to the host. The
//! hostile fixtures run through the shipped binary in `malicious.rs`; real containers in the
//! workspace's `tests/e2e/nvidia_hooks.rs`.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{symlink, FileExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nvshim_hook::disable_device_node_modification as ddnm;
use nvshim_hook::elf;
use nvshim_hook::enable_cuda_compat::{self as compat, CompatNote, Options};
use nvshim_hook::root::{Resolver, Root};
use nvshim_testsupport::hook_harness::{
    compat_json, compat_lib, enter_private_mount_ns, mkfifo, mknod_chr, require_root, NoteBuild,
    Tree,
};

const OWNER: &str = "NVIDIA Corporation";
const SECTION: &str = ".note.cuda.fwd_compatibility";
const RESOLVERS: [Resolver; 2] = [Resolver::Openat2, Resolver::Walk];

fn note_of(path: &Path) -> Option<Vec<u8>> {
    let f = File::open(path).unwrap();
    let size = f.metadata().unwrap().len();
    elf::note(&f, size, SECTION, OWNER)
}

#[test]
fn note_is_read_from_gcc_and_objcopy_libraries() {
    let json = compat_json("13.1", &[535, 550, 570, 575, 580, 590]);
    for how in [NoteBuild::Asm, NoteBuild::Objcopy(4)] {
        let lib = compat_lib(OWNER, &json, how);
        let desc = note_of(&lib).unwrap_or_else(|| panic!("{how:?}: no note"));
        assert_eq!(String::from_utf8(desc.clone()).unwrap(), json, "{how:?}");
        let n = CompatNote::parse(&desc).unwrap();
        assert_eq!(n.cuda_version, "13.1");
        assert_eq!(n.driver, [535, 550, 570, 575, 580, 590]);
        assert_eq!(n.format, 1);
    }
    // Another owner, or no note section: nothing.
    assert_eq!(note_of(&compat_lib("ACME", &json, NoteBuild::Asm)), None);
    assert_eq!(note_of(&compat_lib(OWNER, &json, NoteBuild::None)), None);
    // NVIDIA pads the name to the section's sh_addralign: with alignment 1 the descriptor is
    // read one byte early and cut one byte short, which is no longer JSON (read as absent).
    let skewed = note_of(&compat_lib(OWNER, &json, NoteBuild::Objcopy(1))).unwrap();
    assert_eq!(skewed, json.as_bytes()[..json.len() - 1]);
    assert!(CompatNote::parse(&skewed).is_err());
}

#[test]
fn note_reader_is_bounded_on_broken_files() {
    let json = compat_json("13.0", &[580]);
    let lib = fs::read(compat_lib(OWNER, &json, NoteBuild::Asm)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let check = |name: &str, bytes: &[u8]| {
        let p = dir.path().join(name);
        fs::write(&p, bytes).unwrap();
        note_of(&p)
    };
    // Section headers cut off, a section table far past the end, a huge section count.
    assert_eq!(check("half", &lib[..lib.len() / 2]), None);
    let mut far = lib.clone();
    far[40..48].copy_from_slice(&(u64::MAX - 8).to_le_bytes());
    assert_eq!(check("far", &far), None);
    let mut many = lib.clone();
    many[60..62].copy_from_slice(&0u16.to_le_bytes());
    assert_eq!(check("many", &many), None);
    assert_eq!(check("garbage", &[0x7f; 4096]), None);
    // A 2 GiB sparse file: refused from the header, nothing big is read.
    let big = dir.path().join("big");
    let f = File::create(&big).unwrap();
    f.write_all_at(&lib[..64], 0).unwrap();
    f.set_len(2 << 30).unwrap();
    let start = std::time::Instant::now();
    assert_eq!(note_of(&big), None);
    assert!(start.elapsed() < std::time::Duration::from_secs(2));
}

/// An image with CUDA 13.0 installed the way NVIDIA's images do (`/usr/local/cuda ->
/// cuda-13.0`), its compat library carrying `json` (or no note).
fn cuda_image(root: &Path, json: Option<&str>) -> Tree {
    let t = Tree::new(root);
    let lib = match json {
        Some(j) => compat_lib(OWNER, j, NoteBuild::Asm),
        None => compat_lib(OWNER, "", NoteBuild::None),
    };
    t.dir("/etc/ld.so.conf.d")
        .dir("/usr/local/cuda-13.0/compat")
        .link("/usr/local/cuda", "cuda-13.0")
        .link(
            "/usr/local/cuda-13.0/compat/libcuda.so.1",
            "libcuda.so.580.95.05",
        )
        .link("/usr/local/cuda-13.0/compat/libcuda.so", "libcuda.so.1");
    fs::copy(
        lib,
        t.path("/usr/local/cuda-13.0/compat/libcuda.so.580.95.05"),
    )
    .unwrap();
    t
}

fn opts(driver: Option<&str>, cuda: Option<&str>) -> Options {
    Options {
        host_driver_version: driver.map(String::from),
        host_cuda_version: cuda.map(String::from),
        compat_dir: None,
    }
}

const CONF: &str = "etc/ld.so.conf.d/00-compat-nvshim.conf";

#[test]
fn enable_cuda_compat_names_the_resolved_compat_dir() {
    let json = compat_json("13.0", &[535, 550, 570, 575, 580]);
    for resolver in RESOLVERS {
        let dir = tempfile::tempdir().unwrap();
        cuda_image(dir.path(), Some(&json));
        let root = Root::open(dir.path()).unwrap();
        root.set_resolver(resolver);
        let conf = dir.path().join(CONF);
        // Host 580.65.06: branch supported, compat newer.
        let r = compat::run(&root, &opts(Some("580.65.06"), None)).unwrap();
        assert_eq!(
            r.library.as_deref(),
            Some("/usr/local/cuda/compat/libcuda.so.580.95.05")
        );
        assert_eq!(r.compat_dir.as_deref(), Some("/usr/local/cuda-13.0/compat"));
        assert_eq!(r.written, ["/etc/ld.so.conf.d/00-compat-nvshim.conf"]);
        let text = fs::read_to_string(&conf).unwrap();
        assert!(
            text.ends_with("\n/usr/local/cuda-13.0/compat\n"),
            "{text:?}"
        );
        assert_eq!(
            fs::metadata(&conf).unwrap().permissions().mode() & 0o7777,
            0o644
        );
        // Again: nothing to write.
        let r = compat::run(&root, &opts(Some("580.65.06"), None)).unwrap();
        assert!(r.written.is_empty(), "{r:?}");
        // The host driver is newer now (a restarted container): the file goes.
        let r = compat::run(&root, &opts(Some("580.99.01"), None)).unwrap();
        assert_eq!(r.removed, ["/etc/ld.so.conf.d/00-compat-nvshim.conf"]);
        assert!(!conf.exists());
        // A branch the note does not list.
        compat::run(&root, &opts(Some("565.57.01"), None)).unwrap();
        assert!(!conf.exists());
        // Only a host CUDA version (CSV/Tegra specs): the note's CUDA version decides.
        compat::run(&root, &opts(None, Some("12.8"))).unwrap();
        assert!(conf.exists());
        compat::run(&root, &opts(None, Some("13.0"))).unwrap();
        assert!(!conf.exists());
        // An explicit compat root, through a symlink of its own.
        symlink("/usr/local/cuda/compat", dir.path().join("compat-link")).unwrap();
        let mut o = opts(Some("575.64.05"), None);
        o.compat_dir = Some("/compat-link".into());
        let r = compat::run(&root, &o).unwrap();
        assert_eq!(r.compat_dir.as_deref(), Some("/usr/local/cuda-13.0/compat"));
        // No host version at all: nothing, not even a removal.
        compat::run(&root, &opts(None, None)).unwrap();
        assert!(conf.exists());
    }
}

#[test]
fn enable_cuda_compat_without_note_or_with_several_libraries() {
    let dir = tempfile::tempdir().unwrap();
    let t = cuda_image(dir.path(), None);
    let root = Root::open(dir.path()).unwrap();
    let conf = dir.path().join(CONF);
    // No note: the driver majors decide, and a host CUDA version means no.
    compat::run(&root, &opts(Some("575.57.08"), None)).unwrap();
    assert!(conf.exists());
    compat::run(&root, &opts(Some("580.10.01"), None)).unwrap();
    assert!(!conf.exists());
    compat::run(&root, &opts(Some("575.57.08"), Some("12.0"))).unwrap();
    assert!(!conf.exists());
    // Two libraries: NVIDIA uses neither.
    fs::copy(
        t.path("/usr/local/cuda-13.0/compat/libcuda.so.580.95.05"),
        t.path("/usr/local/cuda-13.0/compat/libcuda.so.590.44.01"),
    )
    .unwrap();
    let r = compat::run(&root, &opts(Some("575.57.08"), None)).unwrap();
    assert!(!conf.exists());
    assert!(r.warnings[0].contains("2 CUDA compat libraries"), "{r:?}");
    // Only symlinks named like the library: none.
    for f in ["libcuda.so.580.95.05", "libcuda.so.590.44.01"] {
        fs::remove_file(t.path(&format!("/usr/local/cuda-13.0/compat/{f}"))).unwrap();
    }
    t.link(
        "/usr/local/cuda-13.0/compat/libcuda.so.580.95.05",
        "/etc/passwd",
    );
    compat::run(&root, &opts(Some("575.57.08"), None)).unwrap();
    assert!(!conf.exists());
    // No compat directory: nothing.
    let empty = tempfile::tempdir().unwrap();
    let r = compat::run(
        &Root::open(empty.path()).unwrap(),
        &opts(Some("575.57.08"), None),
    )
    .unwrap();
    assert_eq!(r, Default::default());
}

#[test]
fn enable_cuda_compat_stays_inside_the_root() {
    let json = compat_json("13.0", &[580]);
    for resolver in RESOLVERS {
        let host = tempfile::tempdir().unwrap();
        // A compat directory on the "host", which must never be read or named.
        let host_compat = host.path().join("compat");
        fs::create_dir(&host_compat).unwrap();
        fs::copy(
            compat_lib(OWNER, &json, NoteBuild::Asm),
            host_compat.join("libcuda.so.580.95.05"),
        )
        .unwrap();
        let host_etc = host.path().join("etc");
        fs::create_dir(&host_etc).unwrap();
        let rootdir = host.path().join("root");
        let t = Tree::new(&rootdir);
        t.dir("/usr/local/cuda")
            .link("/usr/local/cuda/compat", &host_compat.display().to_string());
        let root = Root::open(&rootdir).unwrap();
        root.set_resolver(resolver);
        let r = compat::run(&root, &opts(Some("580.65.06"), None)).unwrap();
        assert_eq!(r.library, None);
        assert!(!rootdir.join(CONF).exists());
        // A compat dir inside, /etc pointing at the host: the write fails, the host is untouched.
        fs::remove_file(rootdir.join("usr/local/cuda/compat")).unwrap();
        fs::remove_dir_all(&rootdir).unwrap();
        cuda_image(&rootdir, Some(&json));
        fs::remove_dir_all(rootdir.join("etc")).unwrap();
        symlink(&host_etc, rootdir.join("etc")).unwrap();
        let root = Root::open(&rootdir).unwrap();
        root.set_resolver(resolver);
        assert!(compat::run(&root, &opts(Some("580.65.06"), None)).is_err());
        assert_eq!(fs::read_dir(&host_etc).unwrap().count(), 0);
        // /etc/ld.so.conf.d a symlink climbing out to the host's etc: the same.
        fs::remove_file(rootdir.join("etc")).unwrap();
        fs::create_dir(rootdir.join("etc")).unwrap();
        symlink(
            format!("../../../../../../../..{}", host_etc.display()),
            rootdir.join("etc/ld.so.conf.d"),
        )
        .unwrap();
        assert!(compat::run(&root, &opts(Some("580.65.06"), None)).is_err());
        assert_eq!(fs::read_dir(&host_etc).unwrap().count(), 0);
        // A FIFO at the conf name is replaced, not opened.
        fs::remove_file(rootdir.join("etc/ld.so.conf.d")).unwrap();
        fs::create_dir(rootdir.join("etc/ld.so.conf.d")).unwrap();
        mkfifo(&rootdir.join(CONF));
        compat::run(&root, &opts(Some("580.65.06"), None)).unwrap();
        assert!(fs::symlink_metadata(rootdir.join(CONF)).unwrap().is_file());
    }
}

// ---- disable-device-node-modification, in a private mount namespace ----------------------------

/// Runs `f` on a thread of its own in a new mount namespace with every mount private:
/// `unshare(CLONE_NEWNS)` changes only the calling thread, and nothing it mounts is seen by the
/// test's namespace.
fn in_mount_ns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    require_root();
    std::thread::spawn(move || {
        enter_private_mount_ns().expect("unshare(CLONE_NEWNS) and making / private");
        f()
    })
    .join()
    .unwrap()
}

/// Mount points (field 5) and options of this thread's mount namespace.
fn mounts() -> BTreeMap<String, String> {
    fs::read_to_string("/proc/thread-self/mountinfo")
        .unwrap()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f[4].to_string(), f[5].to_string())
        })
        .collect()
}

const PARAMS: &str = "ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 1\nDeviceFileUID: 0\n";

/// A host dir with a driver params file saying 1 and an image whose "procfs" has the driver's
/// params (a plain file here: in a container it is the container's procfs).
fn params_world() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let host = tempfile::tempdir().unwrap();
    let host_params = host.path().join("host-params");
    fs::write(&host_params, PARAMS).unwrap();
    let rootdir = host.path().join("root");
    Tree::new(&rootdir).file("/proc/driver/nvidia/params", PARAMS);
    (host, host_params, rootdir)
}

#[test]
fn params_copy_is_mounted_read_only_inside_the_namespace_only() {
    for resolver in RESOLVERS {
        let (_host, host_params, rootdir) = params_world();
        let target = rootdir.join("proc/driver/nvidia/params");
        let (t, hp) = (target.clone(), host_params.clone());
        let rd = rootdir.clone();
        in_mount_ns(move || {
            let root = Root::open(&rd).unwrap();
            root.set_resolver(resolver);
            let list = |d: &Path| {
                let mut v: Vec<_> = fs::read_dir(d)
                    .unwrap()
                    .map(|e| e.unwrap().path())
                    .collect();
                v.sort();
                v
            };
            let before = list(&rd);
            let r = ddnm::run(&root, &hp).unwrap();
            assert_eq!(r.mounted.as_deref(), Some("/proc/driver/nvidia/params"));
            assert_eq!(
                fs::read_to_string(&t).unwrap(),
                PARAMS.replace("ModifyDeviceFiles: 1", "ModifyDeviceFiles: 0")
            );
            // Read-only, nosuid, nodev, noexec; a write fails.
            let f = File::open(&t).unwrap();
            let mut vfs = std::mem::MaybeUninit::<libc::statvfs>::uninit();
            // SAFETY: live fd, writable memory of the right size.
            assert_eq!(
                unsafe { libc::fstatvfs(f.as_raw_fd(), vfs.as_mut_ptr()) },
                0
            );
            // SAFETY: fstatvfs succeeded.
            let flags = unsafe { vfs.assume_init() }.f_flag;
            for (bit, name) in [
                (libc::ST_RDONLY, "ro"),
                (libc::ST_NOSUID, "nosuid"),
                (libc::ST_NODEV, "nodev"),
                (libc::ST_NOEXEC, "noexec"),
            ] {
                assert!(flags & bit != 0, "{name} missing: {flags:#x}");
            }
            let err = fs::OpenOptions::new().write(true).open(&t).unwrap_err();
            assert_eq!(err.raw_os_error(), Some(libc::EROFS));
            // One new mount, on the params file; the scratch tmpfs and its directory are gone.
            let m = mounts();
            assert!(m.contains_key(&t.display().to_string()), "{m:#?}");
            assert!(!m.keys().any(|k| k.contains(".nvshim-params")), "{m:#?}");
            assert_eq!(before, list(&rd));
        });
        // The test's namespace never saw it.
        assert_eq!(fs::read_to_string(&target).unwrap(), PARAMS);
        assert!(!mounts()
            .keys()
            .any(|k| k.starts_with(&rootdir.display().to_string())));
    }
}

/// What a fixture does to the image.
type Damage = Box<dyn Fn() + Send>;

#[test]
fn params_mount_refuses_symlinks_fifos_and_leading_paths() {
    for resolver in RESOLVERS {
        let (host, host_params, rootdir) = params_world();
        let host_file = host.path().join("passwd");
        fs::write(&host_file, "root:x:0:0\n").unwrap();
        let host_proc = host.path().join("proc");
        Tree::new(&host_proc).file("/driver/nvidia/params", PARAMS);
        let target = rootdir.join("proc/driver/nvidia/params");
        let cases: Vec<(&str, Damage)> = vec![
            ("symlink to a host file", {
                let (t, h) = (target.clone(), host_file.clone());
                Box::new(move || {
                    fs::remove_file(&t).unwrap();
                    symlink(&h, &t).unwrap();
                })
            }),
            ("symlink climbing to a host file", {
                let (t, h) = (target.clone(), host_file.clone());
                Box::new(move || {
                    fs::remove_file(&t).unwrap();
                    symlink(format!("../../../../../../../../..{}", h.display()), &t).unwrap();
                })
            }),
            ("fifo", {
                let t = target.clone();
                Box::new(move || {
                    fs::remove_file(&t).unwrap();
                    mkfifo(&t);
                })
            }),
            ("proc a symlink to the host's proc", {
                let (r, p) = (rootdir.clone(), host_proc.clone());
                Box::new(move || {
                    fs::remove_dir_all(r.join("proc")).unwrap();
                    symlink(&p, r.join("proc")).unwrap();
                })
            }),
            ("nvidia a directory symlink to the host's", {
                let (r, p) = (rootdir.clone(), host_proc.clone());
                Box::new(move || {
                    fs::remove_dir_all(r.join("proc/driver/nvidia")).unwrap();
                    symlink(p.join("driver/nvidia"), r.join("proc/driver/nvidia")).unwrap();
                })
            }),
            ("missing", {
                let r = rootdir.clone();
                Box::new(move || fs::remove_dir_all(r.join("proc")).unwrap())
            }),
        ];
        for (what, damage) in cases {
            // A fresh image each time.
            let _ = fs::remove_dir_all(&rootdir);
            Tree::new(&rootdir).file("/proc/driver/nvidia/params", PARAMS);
            damage();
            let (rd, hp) = (rootdir.clone(), host_params.clone());
            let (result, m) = in_mount_ns(move || {
                let root = Root::open(&rd).unwrap();
                root.set_resolver(resolver);
                let r = ddnm::run(&root, &hp).map_err(|e| e.to_string());
                (r, mounts())
            });
            match what {
                "missing" | "proc a symlink to the host's proc" => {
                    let r = result.unwrap();
                    assert!(r.mounted.is_none() && r.skipped.is_some(), "{what}: {r:?}");
                }
                "nvidia a directory symlink to the host's" => {
                    // Absolute, so re-read inside the root where it does not exist.
                    let r = result.unwrap();
                    assert!(r.mounted.is_none(), "{what}: {r:?}");
                }
                _ => {
                    let e = result.unwrap_err();
                    assert!(e.contains("not a regular file"), "{what}: {e}");
                }
            }
            let host_prefix = host.path().display().to_string();
            assert!(
                !m.keys().any(|k| k.starts_with(&host_prefix)),
                "{what}: {m:#?}"
            );
            assert_eq!(fs::read_to_string(&host_file).unwrap(), "root:x:0:0\n");
            assert_eq!(
                fs::read_to_string(host_proc.join("driver/nvidia/params")).unwrap(),
                PARAMS
            );
        }
    }
}

#[test]
fn nothing_is_mounted_when_the_host_needs_no_change() {
    let (_host, host_params, rootdir) = params_world();
    fs::write(&host_params, "ModifyDeviceFiles: 0\n").unwrap();
    let rd = rootdir.clone();
    let (r, m) = in_mount_ns(move || {
        let root = Root::open(&rd).unwrap();
        (ddnm::run(&root, &host_params).unwrap(), mounts())
    });
    assert_eq!(r, Default::default());
    assert!(!m
        .keys()
        .any(|k| k.starts_with(&rootdir.display().to_string())));
}

// ---- update-application-profile and chmod against host paths ----------------------------------

#[test]
fn application_profile_is_never_written_on_the_host() {
    use nvshim_hook::update_application_profile as profile;
    for resolver in RESOLVERS {
        let host = tempfile::tempdir().unwrap();
        let host_nvidia = host.path().join("nvidia");
        fs::create_dir(&host_nvidia).unwrap();
        for target in [
            host_nvidia.display().to_string(),
            format!("../../../../../../../..{}", host_nvidia.display()),
        ] {
            let rootdir = host.path().join("root");
            let _ = fs::remove_dir_all(&rootdir);
            let t = Tree::new(&rootdir);
            t.dir("/dev").dir("/etc").link("/etc/nvidia", &target);
            mknod_chr(&t.path("/dev/nvidia0"), 195, 0);
            let root = Root::open(&rootdir).unwrap();
            root.set_resolver(resolver);
            // The symlink dangles inside the root: an error, and nothing on the host.
            assert!(profile::run(&root).is_err());
            assert_eq!(fs::read_dir(&host_nvidia).unwrap().count(), 0);
        }
        // A symlink and a FIFO at the file name are replaced, not written through.
        let rootdir = host.path().join("root2");
        let t = Tree::new(&rootdir);
        t.dir("/dev")
            .dir("/etc/nvidia/nvidia-application-profiles-rc.d")
            .link(
                "/etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf",
                &host.path().join("victim").display().to_string(),
            );
        fs::write(host.path().join("victim"), "host").unwrap();
        mknod_chr(&t.path("/dev/nvidia2"), 195, 2);
        let root = Root::open(&rootdir).unwrap();
        root.set_resolver(resolver);
        profile::run(&root).unwrap();
        assert_eq!(
            fs::read_to_string(host.path().join("victim")).unwrap(),
            "host"
        );
        let file = t.path("/etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf");
        assert!(fs::read_to_string(&file).unwrap().contains("0x4]"));
        fs::remove_file(&file).unwrap();
        mkfifo(&file);
        profile::run(&root).unwrap();
        assert!(fs::symlink_metadata(&file).unwrap().is_file());
    }
}
