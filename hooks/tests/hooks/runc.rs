//! The hooks in real containers: runc runs them as createContainer hooks (in the container's
//! mount namespace, before pivot_root, cwd = rootfs) on a busybox rootfs into which a stub
//! `libcuda.so.580.65.06` is bind-mounted read-only, and the container's `ldconfig -p` (the
//! host's static ldconfig copied in) must list it; and a musl rootfs whose loader must find it through
//! /etc/ld-musl-x86_64.path. Kept small: the full end-to-end harness
//! lives in the workspace's tests.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use nvshim_hook::ldcache::LdCache;
use nvshim_testsupport::hook_harness::{
    ldconfig_r, preload_library, require_root, static_hook, stub, Tree,
};
use nvshim_testsupport::{unique_id, Bundle, Runtime};
use serde_json::{json, Value};

const LIBDIR: &str = "/usr/lib/x86_64-linux-gnu";
const PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A runc bundle (busybox rootfs) in `work/bundle`; first of all, checks for root.
fn new_bundle(work: &Path) -> Bundle {
    require_root();
    Bundle::new(&work.join("bundle"), &[]).unwrap()
}

fn hook(args: &[&str], env: bool) -> Value {
    let mut h = json!({
        "path": static_hook(env!("CARGO_TARGET_TMPDIR")),
        "args": args,
    });
    if env {
        h["env"] = json!([PATH]);
    }
    h
}

/// The createContainer hooks the runtime shim writes.
fn driver_hooks(env: bool) -> Vec<Value> {
    vec![
        hook(
            &[
                "nvshim-hook",
                "create-symlinks",
                "--link",
                "libcuda.so.580.65.06::/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                "--link",
                "libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so",
            ],
            env,
        ),
        hook(&["nvshim-hook", "update-ldcache", "--folder", LIBDIR], env),
    ]
}

/// Runs `ldconfig -p` in the bundle's container with the glibc stub libcuda bind-mounted;
/// returns its stdout.
fn run_container(bundle: &Bundle, hooks: Vec<Value>, process_env: &[&str]) -> String {
    run_container_with(
        bundle,
        hooks,
        process_env,
        &["/sbin/ldconfig", "-p"],
        &stub("libcuda.so.1"),
    )
}

/// As [`run_container`], with the container's `args` and the library mounted as libcuda.
fn run_container_with(
    bundle: &Bundle,
    hooks: Vec<Value>,
    process_env: &[&str],
    args: &[&str],
    lib: &Path,
) -> String {
    bundle.set_args(args).unwrap();
    bundle
        .edit(|config| {
            let mut env: Vec<Value> = vec![json!(PATH)];
            env.extend(process_env.iter().map(|e| json!(e)));
            config["process"]["env"] = json!(env);
            config["mounts"].as_array_mut().unwrap().push(json!({
                "destination": format!("{LIBDIR}/libcuda.so.580.65.06"),
                "type": "bind",
                "source": lib,
                "options": ["ro", "nosuid", "nodev", "rbind", "rprivate"],
            }));
            config["hooks"] = json!({ "createContainer": hooks });
            Ok(())
        })
        .unwrap();
    let runtime = Runtime::new("runc", &bundle.dir().join("runc-state"))
        .unwrap()
        .timeout(Duration::from_secs(60));
    let out = runtime.run(bundle, &unique_id("nvshim-hook")).unwrap();
    assert!(out.success(), "runc run: {out}");
    out.stdout
}

/// `ldconfig -p` lines as (name, path).
fn listed(output: &str) -> Vec<(String, String)> {
    output
        .lines()
        .filter_map(|l| {
            let (left, path) = l.trim().split_once(" => ")?;
            let name = left.split(" (").next()?;
            Some((name.to_string(), path.to_string()))
        })
        .collect()
}

fn has(output: &str, name: &str, path: &str) -> bool {
    listed(output).iter().any(|(n, p)| n == name && p == path)
}

#[test]
fn busybox_container_sees_libcuda() {
    let work = tempfile::tempdir().unwrap();
    let bundle = new_bundle(work.path());
    let out = run_container(&bundle, driver_hooks(true), &[]);
    assert!(
        has(&out, "libcuda.so.1", &format!("{LIBDIR}/libcuda.so.1")),
        "{out}"
    );
    assert!(
        has(&out, "libcuda.so", &format!("{LIBDIR}/libcuda.so")),
        "{out}"
    );
    let rootfs = bundle.rootfs().path();
    assert_eq!(
        fs::read_link(rootfs.join("usr/lib/x86_64-linux-gnu/libcuda.so.1")).unwrap(),
        PathBuf::from("libcuda.so.580.65.06")
    );
    assert!(rootfs.join("etc/ld.so.conf.d/00-nvshim.conf").is_file());
}

/// A musl image (Alpine's layout: `/lib/ld-musl-x86_64.so.1`, no ld.so.cache, no ldconfig): the
/// hook appends the injected folder to `/etc/ld-musl-x86_64.path`, and a musl program linked
/// against `libcuda.so.1` starts, which it cannot unless musl's loader finds the library there.
#[test]
fn musl_container_resolves_libcuda() {
    let work = tempfile::tempdir().unwrap();
    let bundle = new_bundle(work.path());
    // Not busybox: the image holds musl's loader and the probe only.
    let rootfs = bundle.rootfs().path().to_path_buf();
    fs::remove_dir_all(&rootfs).unwrap();
    let t = Tree::new(&rootfs);
    t.dir("/bin")
        .dir("/lib")
        .dir("/etc")
        .dir("/proc")
        .dir("/dev")
        .dir("/sys")
        .dir("/tmp");
    // musl's libc.so is also its dynamic loader (Debian's musl package, as Alpine ships it).
    fs::copy(
        "/lib/x86_64-linux-musl/libc.so",
        t.path("/lib/ld-musl-x86_64.so.1"),
    )
    .expect("musl is installed (apt-get install musl-tools)");

    // A libcuda without libc (a glibc-built one would need libc.so.6, which musl lacks), and a
    // musl program that needs it by SONAME.
    let build = work.path().join("build");
    fs::create_dir_all(&build).unwrap();
    fs::write(
        build.join("cuda.c"),
        "int cuInit(unsigned flags) { return (int)flags; }\n",
    )
    .unwrap();
    let lib = build.join("libcuda.so.580.65.06");
    let status = Command::new("gcc")
        .args([
            "-shared",
            "-fPIC",
            "-nostdlib",
            "-Wl,-soname,libcuda.so.1",
            "-o",
        ])
        .arg(&lib)
        .arg(build.join("cuda.c"))
        .status()
        .unwrap();
    assert!(status.success(), "gcc (stub libcuda)");
    std::os::unix::fs::symlink(&lib, build.join("libcuda.so")).unwrap();
    fs::write(
        build.join("probe.c"),
        "#include <stdio.h>\nint cuInit(unsigned);\nint main(void) { printf(\"cuInit=%d\\n\", cuInit(0)); return 0; }\n",
    )
    .unwrap();
    let status = Command::new("musl-gcc")
        .arg("-o")
        .arg(t.path("/bin/probe"))
        .arg(build.join("probe.c"))
        .arg(format!("-L{}", build.display()))
        .arg("-lcuda")
        .status()
        .expect("musl-gcc runs (apt-get install musl-tools)");
    assert!(status.success(), "musl-gcc (probe)");

    let out = run_container_with(&bundle, driver_hooks(true), &[], &["/bin/probe"], &lib);
    assert_eq!(out.trim(), "cuInit=0", "{out}");
    let path = fs::read_to_string(rootfs.join("etc/ld-musl-x86_64.path")).unwrap();
    assert!(
        path.lines().any(|l| l.split(':').any(|d| d == LIBDIR)),
        "{path}"
    );
    assert!(
        !rootfs.join("etc/ld.so.cache").exists(),
        "a musl image gets no glibc cache"
    );
}

#[test]
fn existing_cache_entries_survive() {
    let work = tempfile::tempdir().unwrap();
    let bundle = new_bundle(work.path());
    let t = Tree::new(bundle.rootfs().path());
    t.file("/etc/ld.so.conf", "include /etc/ld.so.conf.d/*.conf\n")
        .file(
            "/etc/ld.so.conf.d/local.conf",
            "/usr/local/lib\n/opt/app/lib\n",
        )
        .lib("/usr/local/lib/libfoo.so.1.2.3", "libfoo.so.1")
        .lib("/opt/app/lib/libapp.so.7", "libapp.so.7")
        .lib("/usr/lib/libbar.so.2.0", "libbar.so.2")
        .link("/usr/lib/libbar.so", "libbar.so.2");
    ldconfig_r(bundle.rootfs().path());
    let before =
        LdCache::parse(&fs::read(bundle.rootfs().path().join("etc/ld.so.cache")).unwrap()).unwrap();
    assert_eq!(before.entries.len(), 3, "{before:?}");
    let out = run_container(&bundle, driver_hooks(true), &[]);
    for e in &before.entries {
        assert!(
            has(&out, &e.name, &e.path),
            "lost {} => {}:\n{out}",
            e.name,
            e.path
        );
    }
    assert!(
        has(&out, "libcuda.so.1", &format!("{LIBDIR}/libcuda.so.1")),
        "{out}"
    );
}

/// A glibc image whose library folder the driver's libcuda is mounted into, with the cache its
/// ldconfig wrote: the hook reads config.json's mounts through the state runc gives it, reads
/// the mounted library and the links to it, and keeps the image's own entries without reading
/// its libraries (libz's file, garbled after the image's ldconfig ran, keeps its entry).
#[test]
fn image_cache_of_the_folder_kept_and_mounted_libcuda_added() {
    let work = tempfile::tempdir().unwrap();
    let bundle = new_bundle(work.path());
    let t = Tree::new(bundle.rootfs().path());
    t.file("/etc/ld.so.conf", "include /etc/ld.so.conf.d/*.conf\n")
        .file(
            "/etc/ld.so.conf.d/x86_64-linux-gnu.conf",
            &format!("{LIBDIR}\n"),
        )
        .lib(&format!("{LIBDIR}/libz.so.1.2.13"), "libz.so.1")
        .link(&format!("{LIBDIR}/libz.so.1"), "libz.so.1.2.13")
        .lib(&format!("{LIBDIR}/libbar.so.2.0"), "libbar.so.2")
        .link(&format!("{LIBDIR}/libbar.so.2"), "libbar.so.2.0");
    ldconfig_r(bundle.rootfs().path());
    fs::write(
        t.path(&format!("{LIBDIR}/libz.so.1.2.13")),
        "not an ELF file",
    )
    .unwrap();
    let out = run_container(&bundle, driver_hooks(true), &[]);
    for (name, file) in [
        ("libz.so.1", "libz.so.1"),
        ("libbar.so.2", "libbar.so.2"),
        ("libcuda.so.1", "libcuda.so.1"),
        ("libcuda.so", "libcuda.so"),
    ] {
        assert!(
            has(&out, name, &format!("{LIBDIR}/{file}")),
            "{name}:\n{out}"
        );
    }
    // The folder is the image's own: no configuration of nvshim's.
    assert!(!bundle
        .rootfs()
        .path()
        .join("etc/ld.so.conf.d/00-nvshim.conf")
        .exists());
}

#[test]
fn nvidiascape_image_cannot_preload_into_the_hook() {
    // CVE-2025-23266: a hook without `env` inherits the container's environment from runc, and
    // the image sets LD_PRELOAD to a library in its own rootfs (the hook's cwd). The shipped
    // static hook has no dynamic loader to honour it.
    let work = tempfile::tempdir().unwrap();
    let bundle = new_bundle(work.path());
    let rootfs = bundle.rootfs().path();
    let marker = work.path().join("owned");
    let poc = preload_library(work.path(), &marker);
    fs::copy(&poc, rootfs.join("poc.so")).unwrap();
    let out = run_container(
        &bundle,
        driver_hooks(false),
        &[
            "LD_PRELOAD=/proc/self/cwd/poc.so",
            "LD_LIBRARY_PATH=/proc/self/cwd",
        ],
    );
    assert!(
        has(&out, "libcuda.so.1", &format!("{LIBDIR}/libcuda.so.1")),
        "{out}"
    );
    assert!(
        !marker.exists(),
        "the image's LD_PRELOAD library ran in a hook"
    );
}

/// Issue 38 item 3: an image whose `include` lines expand without end (60 self-links, and the
/// wide directory of 17,000 matches) still starts, and its dynamic linker finds libcuda: the
/// hook stops expanding at its limits and warns.
#[test]
fn include_bombs_do_not_stop_the_container() {
    for bomb in ["self-links", "wide-dir"] {
        let work = tempfile::tempdir().unwrap();
        let bundle = new_bundle(work.path());
        crate::malicious::include_bomb(&Tree::new(bundle.rootfs().path()), bomb);
        let out = run_container(&bundle, driver_hooks(true), &[]);
        assert!(
            has(&out, "libcuda.so.1", &format!("{LIBDIR}/libcuda.so.1")),
            "{bomb}: {out}"
        );
    }
}

/// Issue 38 item 8: a container whose configuration names a directory that is not UTF-8, through
/// a configuration file whose name is not UTF-8 either: its dynamic linker's cache lists the
/// library there, as `ldconfig` would.
#[test]
fn container_indexes_names_that_are_not_utf8() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let work = tempfile::tempdir().unwrap();
    let bundle = new_bundle(work.path());
    let rootfs = bundle.rootfs().path();
    let at = |p: &[u8]| rootfs.join(OsStr::from_bytes(&p[1..]));
    Tree::new(rootfs).file("/etc/ld.so.conf", "include /etc/ld.so.conf.d/*.conf\n");
    fs::create_dir_all(at(b"/etc/ld.so.conf.d")).unwrap();
    fs::write(at(b"/etc/ld.so.conf.d/\xe9.conf"), b"/opt/\xff\xfe/lib\n").unwrap();
    fs::create_dir_all(at(b"/opt/\xff\xfe/lib")).unwrap();
    fs::copy(stub("libopt.so.1"), at(b"/opt/\xff\xfe/lib/libopt.so.1")).unwrap();
    let out = run_container(&bundle, driver_hooks(true), &[]);
    // The runner reads the container's output lossily: each byte that is not UTF-8 is U+FFFD.
    assert!(
        has(&out, "libopt.so.1", "/opt/\u{fffd}\u{fffd}/lib/libopt.so.1"),
        "{out}"
    );
    assert!(
        has(&out, "libcuda.so.1", &format!("{LIBDIR}/libcuda.so.1")),
        "{out}"
    );
}

/// Issue 38 "defence in depth": runc runs a container whose `root.path` climbs out of the
/// bundle with `..` (it joins and cleans the path; a symlinked `rootfs` it refuses itself,
/// "not an absolute path, or a symlink"); the fix-ups hook (`--bundle`, as nvshim-runtime
/// writes it) refuses it, and the container does not start, with nothing written there. The
/// same bundle with its rootfs in place starts and gets the link.
#[test]
fn fixups_refuse_a_root_path_climbing_out_of_the_bundle() {
    let work = tempfile::tempdir().unwrap();
    let bundle = new_bundle(work.path());
    let link = format!("{LIBDIR}/libcuda.so.1");
    let fixups = hook(
        &[
            "nvshim-hook",
            "fixups",
            "--link",
            &format!("libcuda.so.580.65.06::{link}"),
            "--bundle",
            bundle.dir().to_str().unwrap(),
        ],
        true,
    );
    bundle.set_args(&["/bin/true"]).unwrap();
    bundle
        .edit(|config| {
            config["hooks"] = json!({ "createContainer": [fixups] });
            Ok(())
        })
        .unwrap();
    let runtime = Runtime::new("runc", &bundle.dir().join("runc-state"))
        .unwrap()
        .timeout(Duration::from_secs(60));
    let rootfs = bundle.rootfs().path().to_path_buf();
    let out = runtime.run(&bundle, &unique_id("nvshim-hook")).unwrap();
    assert!(out.success(), "{out}");
    assert!(fs::symlink_metadata(rootfs.join(&link[1..])).is_ok());
    fs::remove_file(rootfs.join(&link[1..])).unwrap();
    // The rootfs moved out of the bundle, named from it with `..`.
    let outside = work.path().join("outside-rootfs");
    fs::rename(&rootfs, &outside).unwrap();
    bundle
        .edit(|config| {
            config["root"]["path"] = json!("../outside-rootfs");
            Ok(())
        })
        .unwrap();
    let out = runtime.run(&bundle, &unique_id("nvshim-hook")).unwrap();
    assert!(!out.success(), "{out}");
    assert!(out.stderr.contains("it climbs with `..`"), "{out}");
    assert!(fs::symlink_metadata(outside.join(&link[1..])).is_err());
}
