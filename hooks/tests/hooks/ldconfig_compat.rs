//! The native `update-ldcache` against the reference: for the same files, the cache it writes
//! is byte-for-byte the one `/sbin/ldconfig -r ROOT` (glibc 2.36) writes, once the generator
//! string is set to ldconfig's, and the SONAME links are the same.
//!
//! Each case builds an image root, copies it, runs the hook on one copy, gives the other copy
//! the same configuration files, runs `ldconfig -r` on it, and compares.

use std::fs;
use std::path::Path;
use std::sync::OnceLock;

use nvshim_hook::ldcache::LdCache;
use nvshim_hook::root::{Resolver, Root};
use nvshim_hook::update_ldcache::{self, Libc, Options, Report};
use nvshim_testsupport::hook_harness::{
    bind_file, compat_json, compat_lib, compile_shared, copy_tree, enter_private_mount_ns,
    fingerprint, ldconfig_r, ldconfig_r_with, mount_tmpfs, require_root, symlinks, NoteBuild, Tree,
};
use nvshim_testsupport::rootfs::LDCONFIG;

const LIBDIR: &str = "/usr/lib/x86_64-linux-gnu";
const DEBIAN_SYSTEM_DIRS: [&str; 4] = [
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib",
    "/usr/lib",
];

/// The generator string the reference ldconfig writes.
fn ldconfig_generator() -> String {
    static G: OnceLock<String> = OnceLock::new();
    G.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("etc")).unwrap();
        ldconfig_r(dir.path());
        let bytes = fs::read(dir.path().join("etc/ld.so.cache")).unwrap();
        LdCache::parse(&bytes)
            .unwrap()
            .generator
            .expect("ldconfig 2.36 writes a generator")
    })
    .clone()
}

fn options(folders: &[&str], debian_system_dirs: bool) -> Options {
    let mut o = Options::new(folders.iter().map(|s| s.to_string()).collect());
    o.generator = ldconfig_generator();
    if debian_system_dirs {
        // The reference binary is Debian's ldconfig: its built-in directories.
        o.system_dirs = Some(DEBIAN_SYSTEM_DIRS.map(String::from).to_vec());
    }
    o
}

fn hook(root: &Path, opts: &Options, resolver: Resolver) -> Report {
    let r = Root::open(root).unwrap();
    r.set_resolver(resolver);
    update_ldcache::run(&r, opts).unwrap()
}

/// A Debian/Ubuntu image: merged /usr, multiarch configuration, a few libraries with the usual
/// links, a glibc-hwcaps and a tls subdirectory.
fn debian_image(t: &Tree) {
    t.dir("/usr/lib/x86_64-linux-gnu")
        .dir("/usr/local/lib")
        .link("/lib", "usr/lib")
        .link("/lib64", "usr/lib64")
        .dir("/usr/lib64")
        .file("/etc/debian_version", "12.0\n")
        .file("/etc/ld.so.conf", "include /etc/ld.so.conf.d/*.conf\n\n")
        .file("/etc/ld.so.conf.d/libc.conf", "# libc default configuration\n/usr/local/lib\n")
        .file(
            "/etc/ld.so.conf.d/x86_64-linux-gnu.conf",
            "# Multiarch support\n/usr/local/lib/x86_64-linux-gnu\n/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n",
        )
        .lib("/usr/lib/x86_64-linux-gnu/libz.so.1.2.13", "libz.so.1")
        .link("/usr/lib/x86_64-linux-gnu/libz.so.1", "libz.so.1.2.13")
        .link("/usr/lib/x86_64-linux-gnu/libz.so", "libz.so.1.2.13")
        .lib("/usr/lib/x86_64-linux-gnu/libxml2.so.2.9.14", "libxml2.so.2")
        .link("/usr/lib/x86_64-linux-gnu/libxml2.so.2", "libxml2.so.2.9.14")
        .lib("/usr/lib/x86_64-linux-gnu/libc.so.6", "libc.so.6")
        .lib("/usr/lib/x86_64-linux-gnu/libfoo.so.1.0", "libfoo.so.1")
        .lib("/usr/lib/x86_64-linux-gnu/libfoo.so.1.10", "libfoo.so.1")
        .lib("/usr/lib/x86_64-linux-gnu/glibc-hwcaps/x86-64-v3/libz.so.1.2.13", "libz.so.1")
        .dir("/usr/lib/x86_64-linux-gnu/glibc-hwcaps/x86-64-v4")
        .lib("/usr/lib/x86_64-linux-gnu/tls/libz.so.1.2.13", "libz.so.1")
        .lib("/usr/local/lib/libcuda.so.1", "libcuda.so.1")
        .file("/usr/lib/x86_64-linux-gnu/libnotelf.so.1", "GROUP ( libc.so.6 )\n");
}

/// Driver libraries as the runtime bind-mounts them (here: copies), with their SONAME links
/// when `links` (the create-symlinks hook runs first in the real flow).
fn inject_driver(t: &Tree, dir: &str, links: bool) {
    for (stem, so) in [
        ("libcuda", "libcuda.so.1"),
        ("libnvidia-ml", "libnvidia-ml.so.1"),
        ("libnvidia-ptxjitcompiler", "libnvidia-ptxjitcompiler.so.1"),
        ("libnvidia-glcore", "libnvidia-glcore.so.580.65.06"),
        ("libEGL_nvidia", "libEGL_nvidia.so.0"),
    ] {
        let file = format!("{stem}.so.580.65.06");
        t.lib(&format!("{dir}/{file}"), so);
        if links && so != file {
            t.link(&format!("{dir}/{so}"), &file);
        }
    }
    if links {
        t.link(&format!("{dir}/libcuda.so"), "libcuda.so.1");
    }
}

/// The driver's files in `image` (named `*.so.580.65.06`), as container paths: what the
/// runtime bind-mounts, and so what config.json's mounts name.
fn driver_mounts(image: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut dirs = vec![image.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for e in fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let ty = e.file_type().unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            if ty.is_dir() {
                dirs.push(e.path());
            } else if ty.is_file() && name.ends_with(".so.580.65.06") {
                let rel = e
                    .path()
                    .strip_prefix(image)
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .to_string();
                out.push(format!("/{rel}"));
            }
        }
    }
    out.sort();
    out
}

/// [`compare_one`] twice: rescanning every library of the folders (no mounts known), and
/// with the driver's files named as config.json's mounts (the image's cache kept for the rest
/// of the folders): both must give what ldconfig gives. Returns the first hook's root.
fn compare(work: &Path, image: &Path, opts: &Options, resolver: Resolver) -> std::path::PathBuf {
    let mut full = opts.clone();
    full.mounted = None;
    let ours = compare_one(&work.join("full"), image, &full, resolver);
    let mut kept = opts.clone();
    kept.mounted = Some(driver_mounts(image));
    let ours_kept = compare_one(&work.join("kept"), image, &kept, resolver);
    assert_eq!(symlinks(&ours), symlinks(&ours_kept));
    ours
}

/// Runs the hook on a copy of `image` and the reference on another copy with the hook's
/// configuration files, then compares caches and links. Returns the hook's root.
fn compare_one(
    work: &Path,
    image: &Path,
    opts: &Options,
    resolver: Resolver,
) -> std::path::PathBuf {
    fs::create_dir_all(work).unwrap();
    let ours = work.join("ours");
    let theirs = work.join("theirs");
    copy_tree(image, &ours);
    copy_tree(image, &theirs);
    let report = hook(&ours, opts, resolver);
    assert_eq!(report.libc, Some(Libc::Glibc));
    // The reference reads the same configuration.
    let _ = fs::remove_dir_all(theirs.join("etc"));
    copy_tree(&ours.join("etc"), &theirs.join("etc"));
    let _ = fs::remove_file(theirs.join("etc/ld.so.cache"));
    if image.join("etc/ld.so.cache").exists() {
        fs::copy(
            image.join("etc/ld.so.cache"),
            theirs.join("etc/ld.so.cache"),
        )
        .unwrap();
    }
    ldconfig_r(&theirs);
    let a = fs::read(ours.join("etc/ld.so.cache")).unwrap();
    let b = fs::read(theirs.join("etc/ld.so.cache")).unwrap();
    if a != b {
        let show = |bytes: &[u8]| {
            let mut s = format!("{} bytes\n", bytes.len());
            for e in nvshim_hook::ldcache::cache_entries(bytes).unwrap() {
                s.push_str(&format!(
                    "  {} {:#x} {:#x} {:?} {}\n",
                    String::from_utf8_lossy(&e.name),
                    e.flags,
                    e.hwcap,
                    e.hwcaps,
                    String::from_utf8_lossy(&e.path)
                ));
            }
            s
        };
        panic!("caches differ\nours:\n{}theirs:\n{}", show(&a), show(&b));
    }
    assert_eq!(symlinks(&ours), symlinks(&theirs), "SONAME links differ");
    // Running again changes nothing.
    let again = hook(&ours, opts, resolver);
    assert!(
        again.written.is_empty(),
        "second run wrote {:?}",
        again.written
    );
    assert_eq!(fs::read(ours.join("etc/ld.so.cache")).unwrap(), a);
    ours
}

#[test]
fn debian_image_without_cache() {
    for resolver in [Resolver::Openat2, Resolver::Walk] {
        let work = tempfile::tempdir().unwrap();
        let image = work.path().join("image");
        let t = Tree::new(&image);
        debian_image(&t);
        inject_driver(&t, LIBDIR, true);
        let ours = compare(work.path(), &image, &options(&[LIBDIR], false), resolver);
        // The folder is configured (x86_64-linux-gnu.conf): no conf of ours.
        assert!(!ours.join("etc/ld.so.conf.d/00-nvshim.conf").exists());
        let cache = LdCache::parse(&fs::read(ours.join("etc/ld.so.cache")).unwrap()).unwrap();
        // merged /usr: the first configured name of the directory wins.
        assert_eq!(
            cache.lookup("libnvidia-ml.so.1"),
            Some("/lib/x86_64-linux-gnu/libnvidia-ml.so.1")
        );
        // As with ldconfig, /usr/local/lib (libc.conf) comes before the multiarch directories:
        // an image's own libcuda there is found first.
        assert_eq!(
            cache.lookup("libcuda.so.1"),
            Some("/usr/local/lib/libcuda.so.1")
        );
    }
}

#[test]
fn debian_image_with_cache_keeps_every_entry() {
    for resolver in [Resolver::Openat2, Resolver::Walk] {
        let work = tempfile::tempdir().unwrap();
        let image = work.path().join("image");
        let t = Tree::new(&image);
        debian_image(&t);
        ldconfig_r(&image);
        let before = LdCache::parse(&fs::read(image.join("etc/ld.so.cache")).unwrap()).unwrap();
        inject_driver(&t, LIBDIR, true);
        let ours = compare(work.path(), &image, &options(&[LIBDIR], false), resolver);
        let after = LdCache::parse(&fs::read(ours.join("etc/ld.so.cache")).unwrap()).unwrap();
        for e in &before.entries {
            assert!(after.entries.contains(e), "lost {e:?}");
        }
        assert_eq!(
            after.lookup("libnvidia-ml.so.1"),
            Some("/lib/x86_64-linux-gnu/libnvidia-ml.so.1")
        );
        // The image's own libcuda in /usr/local/lib stays, after the driver's.
        let cuda: Vec<&str> = after
            .entries
            .iter()
            .filter(|e| e.name == "libcuda.so.1")
            .map(|e| e.path.as_str())
            .collect();
        assert_eq!(
            cuda,
            [
                "/usr/local/lib/libcuda.so.1",
                "/lib/x86_64-linux-gnu/libcuda.so.1"
            ]
        );
    }
}

#[test]
fn cuda_compat_dir_is_indexed_first_with_an_existing_cache() {
    // enable-cuda-compat ran before update-ldcache: its 00-compat file names a directory the
    // image's cache does not cover. ldconfig (NVIDIA's update-ldcache) indexes every configured
    // directory; ours rescans that one too, with the same result.
    use nvshim_hook::enable_cuda_compat::{self as compat, Options as CompatOptions};
    for resolver in [Resolver::Openat2, Resolver::Walk] {
        let work = tempfile::tempdir().unwrap();
        let image = work.path().join("image");
        let t = Tree::new(&image);
        debian_image(&t);
        ldconfig_r(&image);
        inject_driver(&t, LIBDIR, true);
        t.link("/usr/local/cuda", "cuda-13.0");
        fs::create_dir_all(t.path("/usr/local/cuda-13.0/compat")).unwrap();
        fs::copy(
            compat_lib(
                "NVIDIA Corporation",
                &compat_json("13.0", &[570, 575, 580]),
                NoteBuild::Asm,
            ),
            t.path("/usr/local/cuda-13.0/compat/libcuda.so.580.95.05"),
        )
        .unwrap();
        let r = compat::run(
            &Root::open(&image).unwrap(),
            &CompatOptions {
                host_driver_version: Some("580.65.06".into()),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(r.compat_dir.as_deref(), Some("/usr/local/cuda-13.0/compat"));
        let ours = compare(work.path(), &image, &options(&[LIBDIR], false), resolver);
        let cache = LdCache::parse(&fs::read(ours.join("etc/ld.so.cache")).unwrap()).unwrap();
        assert_eq!(
            cache.lookup("libcuda.so.1"),
            Some("/usr/local/cuda-13.0/compat/libcuda.so.1")
        );
        // ldconfig made the SONAME link in the compat directory, and so did we.
        assert_eq!(
            fs::read_link(ours.join("usr/local/cuda-13.0/compat/libcuda.so.1")).unwrap(),
            Path::new("libcuda.so.580.95.05")
        );
    }
}

#[test]
fn driver_folder_outside_configuration_gets_own_conf() {
    // NVIDIA's CDI specs put libraries at the host's path, e.g. /usr/lib64 from a RHEL host.
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("image");
    let t = Tree::new(&image);
    debian_image(&t);
    ldconfig_r(&image);
    inject_driver(&t, "/opt/nvidia/lib", false);
    let ours = compare(
        work.path(),
        &image,
        &options(&["/opt/nvidia/lib/"], false),
        Resolver::Openat2,
    );
    assert_eq!(
        fs::read_to_string(ours.join("etc/ld.so.conf.d/00-nvshim.conf")).unwrap(),
        "# Written by nvshim-hook update-ldcache: the container's GPU driver libraries.\n/opt/nvidia/lib\n"
    );
    let cache = LdCache::parse(&fs::read(ours.join("etc/ld.so.cache")).unwrap()).unwrap();
    // 00-nvshim.conf sorts first: the driver's libcuda wins over the image's.
    assert_eq!(
        cache.lookup("libcuda.so.1"),
        Some("/opt/nvidia/lib/libcuda.so.1")
    );
    // SONAME links were made, as ldconfig makes them.
    assert_eq!(
        fs::read_link(ours.join("opt/nvidia/lib/libnvidia-ml.so.1")).unwrap(),
        Path::new("libnvidia-ml.so.580.65.06")
    );
}

/// A RHEL/UBI image: /lib64 layout, relative include, no /etc/debian_version.
fn rhel_image(t: &Tree) {
    t.dir("/usr/lib64/dyninst")
        .dir("/usr/lib")
        .link("/lib64", "usr/lib64")
        .link("/lib", "usr/lib")
        .file(
            "/etc/redhat-release",
            "Red Hat Enterprise Linux release 9.4 (Plow)\n",
        )
        .file("/etc/ld.so.conf", "include ld.so.conf.d/*.conf\n")
        .file(
            "/etc/ld.so.conf.d/dyninst-x86_64.conf",
            "/usr/lib64/dyninst\n",
        )
        .lib(
            "/usr/lib64/dyninst/libdyninstAPI.so.12.3.0",
            "libdyninstAPI.so.12.3",
        )
        .lib("/usr/lib64/libz.so.1.2.11", "libz.so.1")
        .link("/usr/lib64/libz.so.1", "libz.so.1.2.11")
        .lib("/usr/lib64/libc.so.6", "libc.so.6");
}

#[test]
fn rhel_image_with_and_without_cache() {
    for with_cache in [false, true] {
        let work = tempfile::tempdir().unwrap();
        let image = work.path().join("image");
        let t = Tree::new(&image);
        rhel_image(&t);
        if with_cache {
            ldconfig_r(&image);
        }
        inject_driver(&t, "/usr/lib64", true);
        // Against Debian's ldconfig, /usr/lib64 is not built in: the hook names it.
        let ours = compare(
            work.path(),
            &image,
            &options(&["/usr/lib64"], true),
            Resolver::Openat2,
        );
        let conf = fs::read_to_string(ours.join("etc/ld.so.conf.d/00-nvshim.conf")).unwrap();
        assert!(conf.ends_with("\n/usr/lib64\n"), "{conf}");
    }
}

#[test]
fn rhel_image_uses_rhel_builtin_directories() {
    // With the image's own (RHEL) ldconfig directories, /usr/lib64 is built in (as /lib64):
    // no configuration is written and entries are named /lib64/..., as RHEL's ldconfig does.
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("image");
    let t = Tree::new(&image);
    rhel_image(&t);
    inject_driver(&t, "/usr/lib64", true);
    let ours = work.path().join("ours");
    copy_tree(&image, &ours);
    let r = hook(&ours, &options(&["/usr/lib64"], false), Resolver::Openat2);
    assert!(
        !ours.join("etc/ld.so.conf.d/00-nvshim.conf").exists(),
        "{r:?}"
    );
    let cache = LdCache::parse(&fs::read(ours.join("etc/ld.so.cache")).unwrap()).unwrap();
    assert_eq!(cache.lookup("libcuda.so.1"), Some("/lib64/libcuda.so.1"));
    assert_eq!(cache.lookup("libc.so.6"), Some("/lib64/libc.so.6"));
    // The reference, told the same directories in the same order, agrees.
    let theirs = work.path().join("theirs");
    copy_tree(&image, &theirs);
    fs::write(
        theirs.join("etc/ld.so.conf.d/zz-rhel-builtin.conf"),
        "/lib\n/lib64\n/libx32\n/usr/lib\n/usr/lib64\n/usr/libx32\n",
    )
    .unwrap();
    ldconfig_r(&theirs);
    assert_eq!(
        fs::read(ours.join("etc/ld.so.cache")).unwrap(),
        fs::read(theirs.join("etc/ld.so.cache")).unwrap()
    );
}

#[test]
fn busybox_image_without_etc() {
    for resolver in [Resolver::Openat2, Resolver::Walk] {
        let work = tempfile::tempdir().unwrap();
        let image = work.path().join("image");
        let t = Tree::new(&image);
        t.dir("/bin").file("/bin/busybox", "not really");
        inject_driver(&t, LIBDIR, false);
        let ours = compare(work.path(), &image, &options(&[LIBDIR], false), resolver);
        assert_eq!(
            fs::read_to_string(ours.join("etc/ld.so.conf")).unwrap(),
            "include /etc/ld.so.conf.d/*.conf\n"
        );
        assert!(ours.join("etc/ld.so.conf.d/00-nvshim.conf").exists());
        let cache = LdCache::parse(&fs::read(ours.join("etc/ld.so.cache")).unwrap()).unwrap();
        assert_eq!(
            cache.lookup("libcuda.so.1"),
            Some("/usr/lib/x86_64-linux-gnu/libcuda.so.1")
        );
    }
}

#[test]
fn ld_so_conf_without_include_gets_ours_first() {
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("image");
    let t = Tree::new(&image);
    t.file("/etc/ld.so.conf", "/usr/local/lib\n")
        .lib("/usr/local/lib/libx.so.1", "libx.so.1");
    inject_driver(&t, "/opt/drv", false);
    let ours = compare(
        work.path(),
        &image,
        &options(&["/opt/drv"], false),
        Resolver::Openat2,
    );
    assert_eq!(
        fs::read_to_string(ours.join("etc/ld.so.conf")).unwrap(),
        "include /etc/ld.so.conf.d/00-nvshim.conf\n/usr/local/lib\n"
    );
}

#[test]
fn dangling_dev_link_is_indexed_in_one_run() {
    // libg.so -> libg.so.1, and libg.so.1 is made by this very run: ldconfig needs a second run
    // to index libg.so; the hook gets there in one.
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("image");
    let t = Tree::new(&image);
    t.file("/etc/ld.so.conf", "/opt/g\n")
        .lib("/opt/g/libg.so.1.0", "libg.so.1")
        .link("/opt/g/libg.so", "libg.so.1");
    let ours = work.path().join("ours");
    let theirs = work.path().join("theirs");
    copy_tree(&image, &ours);
    copy_tree(&image, &theirs);
    hook(&ours, &options(&["/opt/g"], false), Resolver::Openat2);
    fs::copy(ours.join("etc/ld.so.conf"), theirs.join("etc/ld.so.conf")).unwrap();
    ldconfig_r(&theirs);
    ldconfig_r(&theirs);
    assert_eq!(
        fs::read(ours.join("etc/ld.so.cache")).unwrap(),
        fs::read(theirs.join("etc/ld.so.cache")).unwrap()
    );
    let cache = LdCache::parse(&fs::read(ours.join("etc/ld.so.cache")).unwrap()).unwrap();
    assert_eq!(cache.lookup("libg.so"), Some("/opt/g/libg.so"));
}

#[test]
fn corrupt_cache_is_rebuilt_like_ldconfig() {
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("image");
    let t = Tree::new(&image);
    debian_image(&t);
    inject_driver(&t, LIBDIR, true);
    t.file("/etc/ld.so.cache", "garbage, not a cache");
    let ours = work.path().join("ours");
    copy_tree(&image, &ours);
    let r = hook(&ours, &options(&[LIBDIR], false), Resolver::Openat2);
    assert!(r.warnings.iter().any(|w| w.contains("rebuilding")), "{r:?}");
    let theirs = work.path().join("theirs");
    copy_tree(&image, &theirs);
    ldconfig_r(&theirs);
    assert_eq!(
        fs::read(ours.join("etc/ld.so.cache")).unwrap(),
        fs::read(theirs.join("etc/ld.so.cache")).unwrap()
    );
}

#[test]
fn musl_image_gets_path_file_and_links() {
    for alpine_marker in [true, false] {
        let work = tempfile::tempdir().unwrap();
        let root = work.path().join("root");
        let t = Tree::new(&root);
        if alpine_marker {
            t.file("/etc/alpine-release", "3.20.0\n");
        } else {
            t.file("/lib/ld-musl-x86_64.so.1", "musl");
        }
        inject_driver(&t, LIBDIR, false);
        let opts = Options::new(vec![LIBDIR.into(), "/usr/lib".into()]);
        let r = hook(&root, &opts, Resolver::Openat2);
        assert_eq!(r.libc, Some(Libc::Musl));
        assert_eq!(
            fs::read_to_string(root.join("etc/ld-musl-x86_64.path")).unwrap(),
            "/lib:/usr/local/lib:/usr/lib\n/usr/lib/x86_64-linux-gnu\n"
        );
        assert!(!root.join("etc/ld.so.cache").exists());
        assert_eq!(
            fs::read_link(root.join("usr/lib/x86_64-linux-gnu/libcuda.so.1")).unwrap(),
            Path::new("libcuda.so.580.65.06")
        );
        let again = hook(&root, &opts, Resolver::Openat2);
        assert!(again.written.is_empty(), "{again:?}");
        // An existing path file is appended to.
        fs::write(root.join("etc/ld-musl-x86_64.path"), "/lib\n/usr/lib").unwrap();
        hook(&root, &opts, Resolver::Openat2);
        assert_eq!(
            fs::read_to_string(root.join("etc/ld-musl-x86_64.path")).unwrap(),
            "/lib\n/usr/lib\n/usr/lib/x86_64-linux-gnu\n"
        );
        // A line that is not UTF-8 is kept byte for byte (issue 38 item 8).
        fs::write(root.join("etc/ld-musl-x86_64.path"), b"/opt/\xff\xfe/lib\n").unwrap();
        hook(&root, &opts, Resolver::Openat2);
        assert_eq!(
            fs::read(root.join("etc/ld-musl-x86_64.path")).unwrap(),
            b"/opt/\xff\xfe/lib\n/usr/lib/x86_64-linux-gnu\n/usr/lib\n"
        );
    }
}

#[test]
fn host_ldconfig_fallback_matches_and_stays_inside() {
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("image");
    let t = Tree::new(&image);
    debian_image(&t);
    inject_driver(&t, LIBDIR, true);
    // A hostile /proc in the image (runc mounts the real one there before hooks run).
    t.link(
        "/etc/ld.so.conf.d/evil.conf",
        "/proc/self/root/etc/ld.so.conf",
    );
    let ours = work.path().join("ours");
    copy_tree(&image, &ours);
    let mut opts = options(&[LIBDIR], false);
    opts.force_fallback = true;
    opts.ldconfig_path = Some(LDCONFIG.into());
    let host_before = fingerprint(&["/etc/ld.so.cache".into(), "/etc/ld.so.conf.d".into()]);
    let r = hook(&ours, &opts, Resolver::Openat2);
    assert!(r.fallback);
    assert_eq!(
        fingerprint(&["/etc/ld.so.cache".into(), "/etc/ld.so.conf.d".into()]),
        host_before
    );
    let theirs = work.path().join("theirs");
    copy_tree(&image, &theirs);
    ldconfig_r(&theirs);
    let a = LdCache::parse(&fs::read(ours.join("etc/ld.so.cache")).unwrap()).unwrap();
    let b = LdCache::parse(&fs::read(theirs.join("etc/ld.so.cache")).unwrap()).unwrap();
    assert_eq!(a.entries, b.entries);
}

/// The shared libraries of this machine's own Debian base (the packages a debian:bookworm image
/// holds that ship libraries in `/usr/lib/x86_64-linux-gnu`), files and links as installed:
/// real string tables, where the stubs above have one name each. `None` without dpkg.
fn real_base_libraries(t: &Tree) -> Option<usize> {
    let pkgs = [
        "libc6",
        "zlib1g",
        "libzstd1",
        "liblzma5",
        "libbz2-1.0",
        "libgcc-s1",
        "libstdc++6",
        "libacl1",
        "libattr1",
        "libselinux1",
        "libpcre2-8-0",
        "libcap2",
        "libcrypt1",
        "libgmp10",
        "libtinfo6",
        "libudev1",
        "libsystemd0",
        "libgcrypt20",
        "libgpg-error0",
        "liblz4-1",
    ];
    let out = std::process::Command::new("dpkg")
        .arg("-L")
        .args(pkgs)
        .output()
        .ok()?;
    let mut n = 0;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(name) = line
            .strip_prefix("/usr/lib/x86_64-linux-gnu/")
            .or_else(|| line.strip_prefix("/lib/x86_64-linux-gnu/"))
        else {
            continue;
        };
        if name.contains('/') || !name.contains(".so") {
            continue;
        }
        let src = Path::new(line);
        let dst = format!("{LIBDIR}/{name}");
        if t.path(&dst).symlink_metadata().is_ok() {
            continue;
        }
        match fs::read_link(src) {
            Ok(target) => {
                t.link(&dst, target.to_str().unwrap());
            }
            Err(_) if src.is_file() => {
                fs::copy(src, t.path(&dst)).unwrap();
                n += 1;
            }
            Err(_) => {}
        }
    }
    (n > 0).then_some(n)
}

#[test]
fn this_machines_own_libraries_with_and_without_cache() {
    for with_cache in [false, true] {
        let work = tempfile::tempdir().unwrap();
        let image = work.path().join("image");
        let t = Tree::new(&image);
        debian_image(&t);
        let Some(n) = real_base_libraries(&t) else {
            eprintln!("skipped: no dpkg, no Debian base libraries to copy");
            return;
        };
        assert!(n >= 20, "only {n} libraries copied");
        if with_cache {
            ldconfig_r(&image);
        }
        inject_driver(&t, LIBDIR, true);
        compare(
            work.path(),
            &image,
            &options(&[LIBDIR], false),
            Resolver::Openat2,
        );
    }
}

/// The Debian image with its cache and the driver injected, and then libz's file made no ELF
/// file (read again, its entry goes).
fn image_with_libz_garbled(work: &Path) -> (std::path::PathBuf, Tree) {
    let image = work.join("image");
    let t = Tree::new(&image);
    debian_image(&t);
    ldconfig_r(&image);
    inject_driver(&t, LIBDIR, true);
    fs::write(
        t.path(&format!("{LIBDIR}/libz.so.1.2.13")),
        "not an ELF file",
    )
    .unwrap();
    (image, t)
}

/// The kept-cache mode, where it differs from ldconfig by design: a library of the image is
/// not read again, so one whose file changed after the image's ldconfig ran keeps the image's
/// entry (a full rescan drops it), while one whose name is gone loses it, as with ldconfig.
#[test]
fn kept_cache_does_not_read_the_images_own_libraries() {
    let work = tempfile::tempdir().unwrap();
    let (image, t) = image_with_libz_garbled(work.path());
    // libxml2 gone too.
    fs::remove_file(t.path(&format!("{LIBDIR}/libxml2.so.2.9.14"))).unwrap();
    fs::remove_file(t.path(&format!("{LIBDIR}/libxml2.so.2"))).unwrap();
    let mut opts = options(&[LIBDIR], false);
    opts.mounted = Some(driver_mounts(&image));
    let r = hook(&image, &opts, Resolver::Openat2);
    let has = |cache: &LdCache, path: &str| cache.entries.iter().any(|e| e.path == path);
    let libz = "/lib/x86_64-linux-gnu/libz.so.1";
    let cache = LdCache::parse(&fs::read(image.join("etc/ld.so.cache")).unwrap()).unwrap();
    assert!(has(&cache, libz), "{r:?}");
    assert_eq!(cache.lookup("libxml2.so.2"), None);
    assert_eq!(
        cache.lookup("libnvidia-ml.so.1"),
        Some("/lib/x86_64-linux-gnu/libnvidia-ml.so.1")
    );
    assert_eq!(
        cache.lookup("libcuda.so.1"),
        Some("/usr/local/lib/libcuda.so.1")
    );
    // A full rescan reads libz and drops it.
    opts.mounted = None;
    hook(&image, &opts, Resolver::Openat2);
    let cache = LdCache::parse(&fs::read(image.join("etc/ld.so.cache")).unwrap()).unwrap();
    assert!(!has(&cache, libz));
}

/// A mount that covers the folder itself (or a directory above it) hides the image's files:
/// every library there is read, as with no mounts known.
#[test]
fn a_mount_over_the_folder_rescans_all_of_it() {
    for over in [LIBDIR, "/usr/lib", "/usr/lib/x86_64-linux-gnu/"] {
        let work = tempfile::tempdir().unwrap();
        let (image, _) = image_with_libz_garbled(work.path());
        let mut opts = options(&[LIBDIR], false);
        let mut mounted = driver_mounts(&image);
        mounted.push(over.to_string());
        opts.mounted = Some(mounted);
        hook(&image, &opts, Resolver::Openat2);
        let cache = LdCache::parse(&fs::read(image.join("etc/ld.so.cache")).unwrap()).unwrap();
        let libz = "/lib/x86_64-linux-gnu/libz.so.1";
        assert!(
            !cache.entries.iter().any(|e| e.path == libz),
            "mount at {over}"
        );
        assert!(cache.lookup("libnvidia-ml.so.1").is_some());
    }
}

/// A mounted library without a SONAME: ldconfig files it under its own name and under the
/// name of each link to it, so every link of the folder is followed; the result is still
/// ldconfig's, in both modes.
#[test]
fn mounted_library_without_soname() {
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("image");
    let t = Tree::new(&image);
    debian_image(&t);
    ldconfig_r(&image);
    inject_driver(&t, LIBDIR, true);
    let c = work.path().join("nosoname.c");
    fs::write(&c, "int nvshim_nosoname(void) { return 0; }\n").unwrap();
    let lib = t.path(&format!("{LIBDIR}/libnvidia-nosoname.so.580.65.06"));
    compile_shared(&c, &lib, &[]);
    t.link(
        &format!("{LIBDIR}/libnvidia-nosoname.so.1"),
        "libnvidia-nosoname.so.580.65.06",
    );
    let ours = compare(
        work.path(),
        &image,
        &options(&[LIBDIR], false),
        Resolver::Openat2,
    );
    let cache = LdCache::parse(&fs::read(ours.join("etc/ld.so.cache")).unwrap()).unwrap();
    assert_eq!(
        cache.lookup("libnvidia-nosoname.so.1"),
        Some("/lib/x86_64-linux-gnu/libnvidia-nosoname.so.1")
    );
}

/// The driver's libraries bind-mounted from the host (here a tmpfs, another file system than
/// the image's, as a host's is): a second start writes the same cache, and a library written
/// in place (the same inode) is read again, the cache ldconfig's (the hook keeps nothing of a
/// library between starts).
#[test]
fn a_library_written_in_place_is_read_again() {
    use std::os::unix::fs::MetadataExt as _;
    require_root();
    std::thread::spawn(|| {
        enter_private_mount_ns().unwrap();
        let work = tempfile::tempdir().unwrap();
        let image = work.path().join("image");
        let t = Tree::new(&image);
        debian_image(&t);
        ldconfig_r(&image);
        let host_dir = work.path().join("host");
        fs::create_dir(&host_dir).unwrap();
        mount_tmpfs(&host_dir);
        let host = Tree::new(&host_dir);
        inject_driver(&host, LIBDIR, true);
        // The runtime's bind mounts of the files, and the links create-symlinks makes.
        for e in fs::read_dir(host.path(LIBDIR)).unwrap() {
            let e = e.unwrap();
            let at = t.path(&format!("{LIBDIR}/{}", e.file_name().to_str().unwrap()));
            match fs::read_link(e.path()) {
                Ok(target) => std::os::unix::fs::symlink(target, &at).unwrap(),
                Err(_) => bind_file(&e.path(), &at),
            }
        }
        let image_cache = fs::read(image.join("etc/ld.so.cache")).unwrap();
        let mut opts = options(&[LIBDIR], false);
        opts.mounted = Some(driver_mounts(&image));
        let start = |opts: &Options| {
            fs::write(image.join("etc/ld.so.cache"), &image_cache).unwrap();
            hook(&image, opts, Resolver::Openat2);
            fs::read(image.join("etc/ld.so.cache")).unwrap()
        };
        let first = start(&opts);
        assert_eq!(start(&opts), first);

        // libnvidia-ml's file rewritten in place with another SONAME.
        let ml = format!("{LIBDIR}/libnvidia-ml.so.580.65.06");
        let other = Tree::new(&work.path().join("other"));
        other.lib("/libnvidia-ml.so.580.65.06", "libnvidia-ml.so.7");
        let ino = fs::metadata(host.path(&ml)).unwrap().ino();
        let bytes = fs::read(other.path("/libnvidia-ml.so.580.65.06")).unwrap();
        fs::write(host.path(&ml), bytes).unwrap();
        assert_eq!(fs::metadata(t.path(&ml)).unwrap().ino(), ino);
        let ours = start(&opts);
        let cache = LdCache::parse(&ours).unwrap();
        assert_eq!(
            cache.lookup("libnvidia-ml.so.7"),
            Some("/lib/x86_64-linux-gnu/libnvidia-ml.so.7")
        );
        let theirs = work.path().join("theirs");
        copy_tree(&image, &theirs);
        fs::write(theirs.join("etc/ld.so.cache"), &image_cache).unwrap();
        ldconfig_r(&theirs);
        let theirs = fs::read(theirs.join("etc/ld.so.cache")).unwrap();
        assert_eq!(LdCache::parse(&theirs).unwrap().entries, cache.entries);
    })
    .join()
    .unwrap();
}

/// Issue 38 item 8: names that are not UTF-8, which glibc's ldconfig keeps as the bytes they
/// are: a library file name, a SONAME (and so the link ldconfig makes for it), a directory named
/// by an ld.so.conf line, a `glibc-hwcaps` subdirectory and a configuration file matched by an
/// include glob. Byte for byte
/// against `ldconfig -r`, without and with the image's own cache (which the hook then keeps).
#[test]
fn names_that_are_not_utf8_are_kept_as_bytes() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    for with_cache in [false, true] {
        let work = tempfile::tempdir().unwrap();
        let image = work.path().join("image");
        let t = Tree::new(&image);
        debian_image(&t);
        let at = |p: &[u8]| image.join(OsStr::from_bytes(&p[1..]));
        // Latin-1 "ete" with accents as a file name and a SONAME; a SONAME alone; a directory.
        fs::write(
            at(b"/usr/lib/x86_64-linux-gnu/lib\xe9t\xe9.so.1"),
            stub_with_soname(b"lib\xe9t\xe9.so.1"),
        )
        .unwrap();
        fs::write(
            at(b"/usr/lib/x86_64-linux-gnu/libnamed.so.2.0"),
            stub_with_soname(b"libn\xffmed.so.2"),
        )
        .unwrap();
        fs::create_dir_all(at(b"/opt/\xff\xfe/lib")).unwrap();
        fs::write(
            at(b"/opt/\xff\xfe/lib/libopt.so.1"),
            stub_with_soname(b"libopt.so.1"),
        )
        .unwrap();
        fs::write(at(b"/etc/ld.so.conf.d/\xe9.conf"), b"/opt/\xff\xfe/lib\n").unwrap();
        // A glibc-hwcaps subdirectory whose name is not UTF-8, with a library in it.
        fs::create_dir_all(at(b"/opt/\xff\xfe/lib/glibc-hwcaps/\xe9v9")).unwrap();
        fs::write(
            at(b"/opt/\xff\xfe/lib/glibc-hwcaps/\xe9v9/libopt.so.1"),
            stub_with_soname(b"libopt.so.1"),
        )
        .unwrap();
        if with_cache {
            ldconfig_r(&image);
        }
        inject_driver(&t, LIBDIR, true);
        let ours = compare(
            work.path(),
            &image,
            &options(&[LIBDIR], false),
            Resolver::Openat2,
        );
        let cache = fs::read(ours.join("etc/ld.so.cache")).unwrap();
        let entries = nvshim_hook::ldcache::cache_entries(&cache).unwrap();
        for (name, path) in [
            // Merged /usr: the directory's first configured name.
            (
                &b"lib\xe9t\xe9.so.1"[..],
                &b"/lib/x86_64-linux-gnu/lib\xe9t\xe9.so.1"[..],
            ),
            (
                b"libn\xffmed.so.2",
                b"/lib/x86_64-linux-gnu/libn\xffmed.so.2",
            ),
            (b"libopt.so.1", b"/opt/\xff\xfe/lib/libopt.so.1"),
        ] {
            assert!(
                entries.iter().any(|e| e.name == name && e.path == path),
                "with_cache {with_cache}: no {:?}",
                String::from_utf8_lossy(path)
            );
        }
    }
}

/// A stub library whose SONAME is `soname`, any bytes: built with an ASCII stand-in of the
/// same length (gcc takes no other argument), whose bytes are then replaced in the file.
fn stub_with_soname(soname: &[u8]) -> Vec<u8> {
    let stand_in: String = soname
        .iter()
        .map(|&b| if b.is_ascii() { b as char } else { 'Q' })
        .collect();
    let mut lib = fs::read(nvshim_testsupport::hook_harness::stub(&stand_in)).unwrap();
    let mut replaced = 0;
    let mut at = 0;
    while let Some(i) = lib[at..]
        .windows(soname.len())
        .position(|w| w == stand_in.as_bytes())
    {
        lib[at + i..at + i + soname.len()].copy_from_slice(soname);
        at += i + soname.len();
        replaced += 1;
    }
    assert!(replaced > 0, "{stand_in} not found in the stub");
    lib
}

/// The native writer with aarch64's rules (`Options::arch`, on this x86-64 machine) against
/// the reference for aarch64, Debian 12's arm64 ldconfig: for an arm64 Debian image with
/// aarch64 driver libraries, the same cache byte for byte (every entry `FLAG_AARCH64_LIB64 |
/// FLAG_ELF_LIBC6`, 0x0a03) and the same SONAME links.
#[test]
fn aarch64_image_matches_arm64_ldconfig() {
    use nvshim_hook::elf::Arch;
    use nvshim_testsupport::arm64;
    let Some(arm) = arm64::root_or_skip("aarch64_image_matches_arm64_ldconfig") else {
        return;
    };
    require_root();
    const AARCH64_LIBDIR: &str = "/usr/lib/aarch64-linux-gnu";
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("image");
    let t = Tree::new(&image);
    t.dir(AARCH64_LIBDIR)
        .dir("/usr/local/lib")
        .link("/lib", "usr/lib")
        .file("/etc/ld.so.conf", "include /etc/ld.so.conf.d/*.conf\n\n")
        .file(
            "/etc/ld.so.conf.d/aarch64-linux-gnu.conf",
            &fs::read_to_string(arm.join("etc/ld.so.conf.d/aarch64-linux-gnu.conf")).unwrap(),
        )
        .lib_for(
            arm64::CC,
            "/usr/lib/aarch64-linux-gnu/libz.so.1.2.13",
            "libz.so.1",
        )
        .link("/usr/lib/aarch64-linux-gnu/libz.so.1", "libz.so.1.2.13")
        .file("/etc/debian_version", "12.0\n")
        // Found through ldconfig's built-in directories only (Debian's: the multiarch ones,
        // /lib and /usr/lib).
        .lib_for(arm64::CC, "/usr/lib/libexpat.so.1.8.10", "libexpat.so.1");
    for (stem, so) in [
        ("libcuda", "libcuda.so.1"),
        ("libnvidia-ml", "libnvidia-ml.so.1"),
        ("libnvidia-glcore", "libnvidia-glcore.so.580.95.05"),
    ] {
        t.lib_for(
            arm64::CC,
            &format!("{AARCH64_LIBDIR}/{stem}.so.580.95.05"),
            so,
        );
    }
    let ours = work.path().join("ours");
    let theirs = work.path().join("theirs");
    copy_tree(&image, &ours);
    copy_tree(&image, &theirs);
    // The reference's generator string, from a run on an empty root.
    let empty = work.path().join("empty");
    fs::create_dir_all(empty.join("etc")).unwrap();
    ldconfig_r_with(&arm.join("sbin/ldconfig"), &empty);
    let generator = LdCache::parse(&fs::read(empty.join("etc/ld.so.cache")).unwrap())
        .unwrap()
        .generator
        .unwrap();
    let mut opts = Options::new(vec![AARCH64_LIBDIR.into()]);
    opts.arch = Some(Arch::Aarch64);
    opts.generator = generator;
    let report = hook(&ours, &opts, Resolver::Openat2);
    assert_eq!(report.libc, Some(Libc::Glibc));
    assert!(!report.fallback, "{report:?}");
    // Debian 12's arm64 glibc ldconfig: static, run by qemu through binfmt_misc.
    ldconfig_r_with(&arm.join("sbin/ldconfig"), &theirs);
    let a = fs::read(ours.join("etc/ld.so.cache")).unwrap();
    let b = fs::read(theirs.join("etc/ld.so.cache")).unwrap();
    let cache = LdCache::parse(&a).unwrap();
    assert_eq!(a, b, "caches differ: ours {cache:?}");
    assert_eq!(symlinks(&ours), symlinks(&theirs), "SONAME links differ");
    assert_eq!(cache.entries.len(), 5, "{cache:?}");
    assert!(cache.entries.iter().all(|e| e.flags == 0x0a03), "{cache:?}");
    if cfg!(target_arch = "x86_64") {
        assert_eq!(
            cache.lookup("libcuda.so.1"),
            None,
            "an x86-64 hook's lookup takes no aarch64 entry"
        );
    }
    assert!(cache.entries.iter().any(|e| e.name == "libcuda.so.1"
        && e.path == "/lib/aarch64-linux-gnu/libcuda.so.1"
        && e.is_lib64_of(Arch::Aarch64)));
}
