//! Hostile images against the built binary: each fixture is tried with every hook, under each
//! name that runs it (`nvshim-hook` and NVIDIA's `nvidia-cdi-hook` for ours, `nvidia-cdi-hook`
//! for NVIDIA's other hooks), with the OCI state on stdin and a bundle whose config.json points
//! at the fixture's rootfs. Every run must finish quickly, leave every watched host path as it
//! was (a temp "host" directory the fixtures' symlinks point into, with the modes of its
//! directories, plus the real `/etc/ld.so.cache`, `/etc/ld.so.conf` and `/etc/ld.so.conf.d`),
//! leave no mount in the test's namespace, and never run the `LD_PRELOAD` library (which would
//! create a marker file). `disable-device-node-modification` mounts, so it runs in a private
//! mount namespace of its own, as runc runs it in the container's.
//!
//! The binary under test is the static build, as shipped. The dynamically linked build that cargo
//! makes serves as the positive control of the `LD_PRELOAD` fixture: it does load the library,
//! which proves the marker would be seen.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nvshim_testsupport::hook_harness::{
    compat_json, compat_lib, fingerprint, hook_bundle, mkfifo, mknod_chr, preload_library,
    require_root, run_hook, run_hook_with, static_hook, NoteBuild, Run, Tree,
};

const PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
const LIBDIR: &str = "/usr/lib/x86_64-linux-gnu";
/// Where [`static_hook`] builds the shipped binary.
const TARGET_TMPDIR: &str = env!("CARGO_TARGET_TMPDIR");
const TIMEOUT: Duration = Duration::from_secs(20);
const NVIDIA: &str = "NVIDIA Corporation";
const COMPAT_DIR: &str = "/usr/local/cuda/compat";
const PARAMS: &str = "/proc/driver/nvidia/params";
const PROFILE: &str = "/etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf";

/// A host directory that fixtures point at, a marker path, and what must not change.
struct Host {
    _dir: tempfile::TempDir,
    dir: PathBuf,
    marker: PathBuf,
    preload: PathBuf,
}

impl Host {
    /// Checks for root first: every test with a host builds fixture images (mknod).
    fn new() -> Host {
        require_root();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        let t = Tree::new(&path.join("host"));
        t.file("/etc/passwd", "root:x:0:0:root:/root:/bin/sh\n")
            .file("/etc/ld.so.cache", "the host's cache\n")
            .file("/etc/ld.so.conf.d/host.conf", "/host/lib\n")
            .file("/lib/libhost.so.1", "not a library\n")
            .file("/etc/nvidia/host-profile.conf", "{}\n")
            .file("/proc/driver/nvidia/params", "ModifyDeviceFiles: 1\n")
            .file("/params", "ModifyDeviceFiles: 1\n")
            .dir("/empty");
        // A compat library that a compat directory symlinked to the host would lead to.
        t.dir("/compat");
        fs::copy(
            compat_lib(NVIDIA, &compat_json("13.0", &[580]), NoteBuild::Asm),
            t.path("/compat/libcuda.so.590.44.01"),
        )
        .unwrap();
        let marker = path.join("owned");
        let preload = preload_library(&path, &marker);
        Host {
            dir: path.join("host"),
            marker,
            preload,
            _dir: dir,
        }
    }

    fn watched(&self) -> Vec<PathBuf> {
        vec![
            self.dir.clone(),
            self.marker.clone(),
            "/etc/ld.so.cache".into(),
            "/etc/ld.so.conf".into(),
            "/etc/ld.so.conf.d".into(),
        ]
    }
}

/// A minimal image with the driver library in place, a CUDA compat library, a GPU node, the
/// driver's params where the container's procfs would show them, then the fixture's damage.
fn image(root: &Path, host: &Host, fixture: &str) {
    let t = Tree::new(root);
    t.dir("/etc")
        .file("/etc/ld.so.conf", "include /etc/ld.so.conf.d/*.conf\n")
        .lib(&format!("{LIBDIR}/libcuda.so.580.65.06"), "libcuda.so.1")
        .file(PARAMS, "ModifyDeviceFiles: 1\n")
        .dir("/dev/dri")
        .dir(COMPAT_DIR);
    fs::copy(
        compat_lib(NVIDIA, &compat_json("13.0", &[580]), NoteBuild::Asm),
        t.path(&format!("{COMPAT_DIR}/libcuda.so.580.95.05")),
    )
    .unwrap();
    mknod_chr(&t.path("/dev/nvidia0"), 195, 0);
    let h = host.dir.display().to_string();
    let up = "../../../../../../../../../../..";
    match fixture {
        "plain" => {}
        "conf.d-symlink-to-host" => {
            t.link("/etc/ld.so.conf.d", &format!("{h}/etc/ld.so.conf.d"));
        }
        "conf.d-dotdot-to-host" => {
            t.link("/etc/ld.so.conf.d", &format!("{up}{h}/etc/ld.so.conf.d"));
        }
        "etc-symlink-to-slash" => {
            fs::remove_dir_all(t.path("/etc")).unwrap();
            t.link("/etc", "/");
        }
        "etc-symlink-to-host" => {
            fs::remove_dir_all(t.path("/etc")).unwrap();
            t.link("/etc", &format!("{h}/etc"));
        }
        "cache-symlink-to-host" => {
            t.link("/etc/ld.so.cache", &format!("{h}/etc/ld.so.cache"));
        }
        "cache-symlink-to-real-host-cache" => {
            t.link("/etc/ld.so.cache", "/etc/ld.so.cache");
        }
        "cache-dotdot-to-host" => {
            t.link("/etc/ld.so.cache", &format!("{up}{h}/etc/ld.so.cache"));
        }
        "proc-magic-link" => {
            t.link("/etc/ld.so.conf.d", "/proc/self/root/etc/ld.so.conf.d");
            t.link("/etc/ld.so.cache", "/proc/1/root/etc/ld.so.cache");
        }
        "libdir-symlink-to-host" => {
            fs::remove_dir_all(t.path(LIBDIR)).unwrap();
            t.link(LIBDIR, &format!("{up}{h}/lib"));
        }
        "fifo-cache" => mkfifo(&t.path("/etc/ld.so.cache")),
        "fifo-conf" => {
            fs::remove_file(t.path("/etc/ld.so.conf")).unwrap();
            mkfifo(&t.path("/etc/ld.so.conf"));
        }
        "fifo-own-conf" => {
            t.dir("/etc/ld.so.conf.d");
            mkfifo(&t.path("/etc/ld.so.conf.d/00-nvshim.conf"));
        }
        "fifo-libraries" => {
            mkfifo(&t.path(&format!("{LIBDIR}/libfifo.so.1")));
            t.link(&format!("{LIBDIR}/libviafifo.so.1"), "libfifo.so.1");
            t.dir("/etc/ld.so.conf.d");
            mkfifo(&t.path("/etc/ld.so.conf.d/fifo.conf"));
        }
        "sparse-2g-cache" => {
            let f = fs::File::create(t.path("/etc/ld.so.cache")).unwrap();
            f.set_len(2 << 30).unwrap();
        }
        "dir-at-cache" => {
            t.dir("/etc/ld.so.cache/x");
        }
        "include-loop" => {
            t.file(
                "/etc/ld.so.conf",
                "include /etc/ld.so.conf\ninclude /etc/ld.so.conf.d/*.conf\n",
            )
            .dir("/etc/ld.so.conf.d");
        }
        "soname-with-slash" => {
            t.lib(&format!("{LIBDIR}/libevil.so.1"), &format!("{up}{h}/pwned"));
        }
        "etc-nvidia-symlink-to-host" => {
            t.link("/etc/nvidia", &format!("{h}/etc/nvidia"));
        }
        "etc-nvidia-dotdot-to-host" => {
            t.link("/etc/nvidia", &format!("{up}{h}/etc/nvidia"));
        }
        "profile-symlink-to-host" => {
            t.link(PROFILE, &format!("{up}{h}/etc/nvidia/host-profile.conf"));
        }
        "fifo-profile" => {
            t.dir("/etc/nvidia/nvidia-application-profiles-rc.d");
            mkfifo(&t.path(PROFILE));
        }
        "compat-symlink-to-host" => {
            fs::remove_dir_all(t.path(COMPAT_DIR)).unwrap();
            t.link(COMPAT_DIR, &format!("{h}/compat"));
        }
        "compat-dotdot-to-host" => {
            fs::remove_dir_all(t.path(COMPAT_DIR)).unwrap();
            t.link(COMPAT_DIR, &format!("{up}{h}/compat"));
        }
        "compat-conf-symlink-to-host" => {
            t.link(
                "/etc/ld.so.conf.d/00-compat-nvshim.conf",
                &format!("{h}/etc/ld.so.conf.d/host.conf"),
            );
        }
        "fifo-compat-conf" => {
            t.dir("/etc/ld.so.conf.d");
            mkfifo(&t.path("/etc/ld.so.conf.d/00-compat-nvshim.conf"));
        }
        "huge-libcuda" => {
            let lib = t.path(&format!("{COMPAT_DIR}/libcuda.so.580.95.05"));
            let f = fs::OpenOptions::new().write(true).open(lib).unwrap();
            f.set_len(2 << 30).unwrap();
        }
        "fifo-libcuda" => {
            let lib = t.path(&format!("{COMPAT_DIR}/libcuda.so.580.95.05"));
            fs::remove_file(&lib).unwrap();
            mkfifo(&lib);
        }
        "params-symlink-to-host" => {
            fs::remove_file(t.path(PARAMS)).unwrap();
            t.link(PARAMS, &format!("{h}/proc/driver/nvidia/params"));
        }
        "params-dotdot-to-host" => {
            fs::remove_file(t.path(PARAMS)).unwrap();
            t.link(PARAMS, &format!("{up}{h}/etc/passwd"));
        }
        "proc-symlink-to-host" => {
            fs::remove_dir_all(t.path("/proc")).unwrap();
            t.link("/proc", &format!("{h}/proc"));
        }
        "fifo-params" => {
            fs::remove_file(t.path(PARAMS)).unwrap();
            mkfifo(&t.path(PARAMS));
        }
        "dev-dri-symlink-to-host" => {
            fs::remove_dir_all(t.path("/dev/dri")).unwrap();
            t.link("/dev/dri", &format!("{h}/empty"));
        }
        "dev-symlink-to-host" => {
            fs::remove_dir_all(t.path("/dev")).unwrap();
            t.link("/dev", &format!("{up}{h}/etc"));
        }
        bomb if bomb.starts_with("include-") && bomb != "include-loop" => {
            include_bomb(&t, &bomb["include-".len()..])
        }
        other => panic!("unknown fixture {other}"),
    }
}

/// `include` lines whose full expansion is exponential or huge (issue 38 item 3: 60 self-links
/// took an earlier hook past 40 s and 650 MB), written into the image `t`. Each keeps the
/// usual `include /etc/ld.so.conf.d/*.conf` first, as Debian's ld.so.conf has it.
pub(crate) fn include_bomb(t: &Tree, kind: &str) {
    let conf = |lines: &str| {
        t.file(
            "/etc/ld.so.conf",
            &format!("include /etc/ld.so.conf.d/*.conf\n{lines}"),
        );
    };
    match kind {
        // 60 links to their own directory: `*/*/*/*` is 60^4 paths.
        "self-links" => {
            for i in 0..60 {
                t.link(&format!("/etc/ld.so.conf.d/l{i:02}"), ".");
            }
            conf("include /etc/ld.so.conf.d/*/*/*/*/*.conf\n");
        }
        // Two directories whose links lead to each other, eight each way.
        "two-dir-loop" => {
            for i in 0..8 {
                t.link(&format!("/etc/loop/a/b{i}"), "../b");
                t.link(&format!("/etc/loop/b/a{i}"), "../a");
            }
            conf(&format!("include /etc/loop/a/{}x.conf\n", "*/".repeat(12)));
        }
        // More entries than are read, every one a match.
        "wide-dir" => {
            let dir = t.path("/etc/wide");
            fs::create_dir_all(&dir).unwrap();
            for i in 0..17_000 {
                fs::File::create(dir.join(format!("w{i:05}.conf"))).unwrap();
            }
            conf("include /etc/wide/*.conf\n");
        }
        // A chain of 1100 directories, a `*` for each.
        "deep-dirs" => {
            let chain = "d/".repeat(1100);
            t.dir(&format!("/etc/deep/{chain}"));
            conf(&format!("include /etc/deep/{}x.conf\n", "*/".repeat(1100)));
        }
        // Thirty files that each include all thirty again.
        "recursion" => {
            for i in 0..30 {
                t.file(
                    &format!("/etc/ld.so.conf.d/r{i:02}.conf"),
                    "include /etc/ld.so.conf.d/*.conf\ninclude r*.conf\n",
                );
            }
        }
        // Twenty `*` from the root, which four links lead back to.
        "many-stars" => {
            for i in 0..4 {
                t.link(&format!("/opt/up{i}"), "/");
            }
            conf(&format!("include /{}x.conf\n", "*/".repeat(20)));
        }
        other => panic!("unknown include bomb {other}"),
    }
}

/// [`include_bomb`]s, each tried in [`FIXTURES`] (but the wide directory, slow to make 40 times).
const INCLUDE_BOMBS: &[&str] = &[
    "self-links",
    "two-dir-loop",
    "wide-dir",
    "deep-dirs",
    "recursion",
    "many-stars",
];

const FIXTURES: &[&str] = &[
    "plain",
    "conf.d-symlink-to-host",
    "conf.d-dotdot-to-host",
    "etc-symlink-to-slash",
    "etc-symlink-to-host",
    "cache-symlink-to-host",
    "cache-symlink-to-real-host-cache",
    "cache-dotdot-to-host",
    "proc-magic-link",
    "libdir-symlink-to-host",
    "fifo-cache",
    "fifo-conf",
    "fifo-own-conf",
    "fifo-libraries",
    "sparse-2g-cache",
    "dir-at-cache",
    "include-loop",
    "soname-with-slash",
    "etc-nvidia-symlink-to-host",
    "etc-nvidia-dotdot-to-host",
    "profile-symlink-to-host",
    "fifo-profile",
    "compat-symlink-to-host",
    "compat-dotdot-to-host",
    "compat-conf-symlink-to-host",
    "fifo-compat-conf",
    "huge-libcuda",
    "fifo-libcuda",
    "params-symlink-to-host",
    "params-dotdot-to-host",
    "proc-symlink-to-host",
    "fifo-params",
    "dev-dri-symlink-to-host",
    "dev-symlink-to-host",
    "include-self-links",
    "include-two-dir-loop",
    "include-deep-dirs",
    "include-recursion",
    "include-many-stars",
];

/// One hook command line, the names it runs under, and whether it mounts.
struct Hook {
    args: Vec<String>,
    names: &'static [&'static str],
    mounts: bool,
}

/// The hooks as the runtime and NVIDIA's specs write them, plus paths aimed at the host.
fn hooks(host: &Host) -> Vec<Hook> {
    let h = host.dir.display().to_string();
    let up = "../../../../../../../../../..";
    let ours: &[&str] = &["nvshim-hook", "nvidia-cdi-hook"];
    let nvidia: &[&str] = &["nvidia-cdi-hook"];
    let hook = |args: Vec<String>, names, mounts| Hook {
        args,
        names,
        mounts,
    };
    vec![
        hook(
            vec![
                "create-symlinks".into(),
                "--link".into(),
                "libcuda.so.580.65.06::/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
                "--link".into(),
                "libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so".into(),
                "--link".into(),
                format!("{h}/etc/passwd::/{up}{h}/etc/pwned-link"),
                "--link".into(),
                format!("{up}{h}/etc/passwd::/usr/lib/../../../../{up}{h}/empty/x"),
                "--link".into(),
                format!("x::{h}/etc/ld.so.cache"),
            ],
            ours,
            false,
        ),
        hook(
            vec!["update-ldcache".into(), "--folder".into(), LIBDIR.into()],
            ours,
            false,
        ),
        hook(
            vec![
                "enable-cuda-compat".into(),
                "--host-driver-version=580.65.06".into(),
            ],
            nvidia,
            false,
        ),
        hook(
            vec![
                "enable-cuda-compat".into(),
                "--host-driver-version=580.65.06".into(),
                format!("--cuda-compat-container-root={up}{h}/compat"),
            ],
            nvidia,
            false,
        ),
        hook(
            vec![
                "disable-device-node-modification".into(),
                format!("--host-params={h}/params"),
            ],
            nvidia,
            true,
        ),
        hook(vec!["update-application-profile".into()], nvidia, false),
        hook(
            vec![
                "chmod".into(),
                "--mode=777".into(),
                "--path=/dev/dri".into(),
                "--path=/etc/passwd".into(),
                format!("--path={h}/etc/passwd"),
                format!("--path={up}{h}/empty"),
            ],
            nvidia,
            false,
        ),
    ]
}

/// The modes of everything under `dir` (the fingerprint has file modes, not directories').
fn modes(dir: &Path) -> Vec<(PathBuf, u32)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(p) = todo.pop() {
        let meta = fs::symlink_metadata(&p).unwrap();
        out.push((p.clone(), meta.permissions().mode()));
        if meta.is_dir() {
            todo.extend(fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
        }
    }
    out.sort();
    out
}

fn mountinfo() -> String {
    fs::read_to_string("/proc/self/mountinfo").unwrap()
}

fn run_fixture(
    bin: &Path,
    argv0: &str,
    fixture: &str,
    hook: &[String],
    host: &Host,
    env: &[(&str, &str)],
) -> Run {
    run_fixture_with(bin, argv0, fixture, hook, host, env, false)
}

fn run_fixture_with(
    bin: &Path,
    argv0: &str,
    fixture: &str,
    hook: &[String],
    host: &Host,
    env: &[(&str, &str)],
    private_mount_ns: bool,
) -> Run {
    let work = tempfile::tempdir().unwrap();
    let rootfs = work.path().join("rootfs");
    image(&rootfs, host, fixture);
    let state = hook_bundle(&work.path().join("bundle"), &rootfs);
    let args: Vec<&str> = hook.iter().map(String::as_str).collect();
    // runc runs createContainer hooks with cwd = the rootfs.
    run_hook_with(
        bin,
        argv0,
        &args,
        &state,
        env,
        &rootfs,
        TIMEOUT,
        private_mount_ns,
    )
}

#[test]
fn hostile_images_change_nothing_on_the_host() {
    let host = Host::new();
    let bin = static_hook(TARGET_TMPDIR);
    let preload = format!("LD_PRELOAD={}", host.preload.display());
    let env = [
        ("PATH", &PATH["PATH=".len()..]),
        ("LD_PRELOAD", &preload["LD_PRELOAD=".len()..]),
        ("LD_LIBRARY_PATH", "/proc/self/cwd/lib"),
    ];
    let before = fingerprint(&host.watched());
    let modes_before = modes(&host.dir);
    let mounts_before = mountinfo();
    let mut failures = Vec::new();
    for fixture in FIXTURES {
        for hook in hooks(&host) {
            for &argv0 in hook.names {
                let run =
                    run_fixture_with(&bin, argv0, fixture, &hook.args, &host, &env, hook.mounts);
                let what = format!("{fixture} / {argv0} {}", hook.args[0]);
                if run.code.is_none() {
                    failures.push(format!("{what}: still running after {TIMEOUT:?}"));
                }
                if !matches!(run.code, Some(0) | Some(1)) {
                    failures.push(format!("{what}: exit {:?}: {}", run.code, run.stderr));
                }
                if run.code == Some(1) && run.stderr.lines().count() != 1 {
                    failures.push(format!("{what}: error is not one line: {:?}", run.stderr));
                }
                let after = fingerprint(&host.watched());
                if after != before {
                    let changed: Vec<_> = after
                        .iter()
                        .filter(|(k, v)| before.get(*k) != Some(v))
                        .map(|(k, _)| k.clone())
                        .chain(before.keys().filter(|k| !after.contains_key(*k)).cloned())
                        .collect();
                    panic!("{what}: host changed: {changed:?}");
                }
                assert!(
                    modes(&host.dir) == modes_before,
                    "{what}: a host mode changed"
                );
                assert!(mountinfo() == mounts_before, "{what}: a mount appeared");
            }
        }
    }
    assert!(!host.marker.exists(), "the LD_PRELOAD library ran");
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Fixtures whose outcome is fixed: the error names the path, nothing blocks.
#[test]
fn hostile_cache_files_are_errors_naming_the_path() {
    let host = Host::new();
    let bin = static_hook(TARGET_TMPDIR);
    let update = hooks(&host).remove(1).args;
    for (fixture, want) in [
        ("sparse-2g-cache", "ld.so.cache: 2147483648 bytes"),
        ("fifo-cache", "ld.so.cache: not a regular file"),
        ("fifo-conf", "ld.so.conf: not a regular file"),
        ("fifo-own-conf", "00-nvshim.conf: not a regular file"),
        ("dir-at-cache", "ld.so.cache: not a regular file"),
    ] {
        let run = run_fixture(&bin, "nvshim-hook", fixture, &update, &host, &[]);
        assert_eq!(run.code, Some(1), "{fixture}: {run:?}");
        assert!(run.stderr.contains(want), "{fixture}: {:?}", run.stderr);
        assert!(
            run.elapsed < Duration::from_secs(5),
            "{fixture}: took {:?}",
            run.elapsed
        );
    }
    // A FIFO named like a library is skipped, and the rest is indexed.
    let run = run_fixture(&bin, "nvshim-hook", "fifo-libraries", &update, &host, &[]);
    assert_eq!(run.code, Some(0), "{run:?}");
}

/// Each [`include_bomb`]: the expansion stops at its limits (counted, not timed), the hook
/// warns once, exits 0 and indexes the driver's folder all the same.
#[test]
fn include_globs_stop_at_their_limits() {
    use nvshim_hook::ldcache::LdCache;
    use nvshim_hook::ldconfig::{self, MAX_GLOB_DIRS, MAX_GLOB_MATCHES, MAX_GLOB_NAMES};
    use nvshim_hook::root::Root;
    let host = Host::new();
    let bin = static_hook(TARGET_TMPDIR);
    let update = hooks(&host).remove(1).args;
    for bomb in INCLUDE_BOMBS {
        let fixture = format!("include-{bomb}");
        let work = tempfile::tempdir().unwrap();
        let rootfs = work.path().join("rootfs");
        image(&rootfs, &host, &fixture);
        let config =
            ldconfig::read_config(&Root::open(&rootfs).unwrap(), "/etc/ld.so.conf", &[], "");
        let g = &config.globbed;
        assert!(
            g.dirs <= MAX_GLOB_DIRS && g.names <= MAX_GLOB_NAMES && g.matches <= MAX_GLOB_MATCHES,
            "{bomb}: {g:?}"
        );
        if *bomb != "two-dir-loop" {
            // The loop ends at the kernel's 40 links; the others run into a limit.
            assert!(g.stopped.is_some(), "{bomb}: {g:?}");
        }
        let state = hook_bundle(&work.path().join("bundle"), &rootfs);
        let args: Vec<&str> = update.iter().map(String::as_str).collect();
        let run = run_hook(&bin, "nvshim-hook", &args, &state, &[], &rootfs, TIMEOUT);
        assert_eq!(run.code, Some(0), "{bomb}: {run:?}");
        let stopped = run.stderr.matches("expansion stopped").count()
            + run.stderr.matches("not expanded").count();
        assert!(stopped <= 1, "{bomb}: {:?}", run.stderr);
        assert_eq!(
            stopped,
            usize::from(g.stopped.is_some()),
            "{bomb}: {:?}",
            run.stderr
        );
        let cache = LdCache::parse(&fs::read(rootfs.join("etc/ld.so.cache")).unwrap()).unwrap();
        assert_eq!(
            cache.lookup("libcuda.so.1"),
            Some(format!("{LIBDIR}/libcuda.so.1").as_str()),
            "{bomb}"
        );
    }
}

#[test]
fn etc_symlinks_are_followed_inside_the_root_only() {
    let host = Host::new();
    let bin = static_hook(TARGET_TMPDIR);
    let work = tempfile::tempdir().unwrap();
    let rootfs = work.path().join("rootfs");
    image(&rootfs, &host, "etc-symlink-to-slash");
    let state = hook_bundle(&work.path().join("bundle"), &rootfs);
    let run = run_hook(
        &bin,
        "nvshim-hook",
        &["update-ldcache", "--folder", LIBDIR],
        &state,
        &[],
        &rootfs,
        TIMEOUT,
    );
    assert_eq!(run.code, Some(0), "{run:?}");
    // /etc -> / inside the root is the root itself.
    assert!(rootfs.join("ld.so.cache").is_file());
    assert!(rootfs.join("ld.so.conf.d/00-nvshim.conf").is_file());
    // The symlinked cache is replaced, not written through.
    let work = tempfile::tempdir().unwrap();
    let rootfs = work.path().join("rootfs");
    image(&rootfs, &host, "cache-symlink-to-host");
    let state = hook_bundle(&work.path().join("bundle"), &rootfs);
    let run = run_hook(
        &bin,
        "nvshim-hook",
        &["update-ldcache", "--folder", LIBDIR],
        &state,
        &[],
        &rootfs,
        TIMEOUT,
    );
    assert_eq!(run.code, Some(0), "{run:?}");
    let meta = fs::symlink_metadata(rootfs.join("etc/ld.so.cache")).unwrap();
    assert!(meta.is_file());
    assert_eq!(
        fs::read_to_string(host.dir.join("etc/ld.so.cache")).unwrap(),
        "the host's cache\n"
    );
}

#[test]
fn ld_preload_reaches_only_a_dynamic_build() {
    let host = Host::new();
    let env_preload = host.preload.display().to_string();
    let env = [("LD_PRELOAD", env_preload.as_str())];
    let update = hooks(&host).remove(1).args;
    // Positive control: the loader of a dynamically linked binary runs the library.
    let run = run_fixture(
        Path::new(env!("CARGO_BIN_EXE_nvshim-hook")),
        "nvshim-hook",
        "plain",
        &update,
        &host,
        &env,
    );
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(
        host.marker.exists(),
        "control failed: the preload library did not run"
    );
    fs::remove_file(&host.marker).unwrap();
    // The shipped, static binary has no loader: nothing runs.
    for hook in hooks(&host) {
        let run = run_fixture_with(
            &static_hook(TARGET_TMPDIR),
            hook.names[hook.names.len() - 1],
            "plain",
            &hook.args,
            &host,
            &env,
            hook.mounts,
        );
        assert_eq!(run.code, Some(0), "{:?}: {run:?}", hook.args);
    }
    assert!(
        !host.marker.exists(),
        "the LD_PRELOAD library ran in the static hook"
    );
}

#[test]
fn legacy_hook_name_fails_with_directions() {
    let run = run_hook(
        &static_hook(TARGET_TMPDIR),
        "nvidia-container-runtime-hook",
        &["prestart"],
        "{}",
        &[],
        Path::new("/"),
        TIMEOUT,
    );
    assert_eq!(run.code, Some(1));
    assert!(
        run.stderr
            .contains("nvshim runtime configure --runtime docker"),
        "{}",
        run.stderr
    );
}

#[test]
fn nvidia_hooks_run_under_nvidias_names_only() {
    // An unknown hook warns and succeeds under NVIDIA's names, as NVIDIA's does.
    for (argv0, args) in [
        ("nvidia-cdi-hook", vec!["a-hook-from-the-future", "--x"]),
        ("nvidia-ctk", vec!["hook", "a-hook-from-the-future"]),
    ] {
        let run = run_hook(
            &static_hook(TARGET_TMPDIR),
            argv0,
            &args,
            "{}",
            &[],
            Path::new("/"),
            TIMEOUT,
        );
        assert_eq!(run.code, Some(0), "{args:?}: {run:?}");
        assert!(run.stderr.contains("warning"), "{args:?}: {run:?}");
    }
    // NVIDIA's chmod is not an nvshim-hook subcommand; the container fix-ups are (without a
    // host driver version, enable-cuda-compat has nothing to do).
    let run = run_hook(
        &static_hook(TARGET_TMPDIR),
        "nvshim-hook",
        &["chmod", "--mode", "755", "--path", "/dev/dri"],
        "{}",
        &[],
        Path::new("/"),
        TIMEOUT,
    );
    assert_eq!(run.code, Some(2));
    let run = run_hook(
        &static_hook(TARGET_TMPDIR),
        "nvshim-hook",
        &["enable-cuda-compat"],
        "{}",
        &[],
        Path::new("/"),
        TIMEOUT,
    );
    assert_eq!(run.code, Some(0), "{run:?}");
    // nvidia-ctk answers only to `hook`.
    let run = run_hook(
        &static_hook(TARGET_TMPDIR),
        "nvidia-ctk",
        &["cdi", "generate"],
        "{}",
        &[],
        Path::new("/"),
        TIMEOUT,
    );
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(run.stderr.contains("nvidia-ctk hook"), "{run:?}");
}

/// The new hooks on the plain image, through the binary: what each writes.
#[test]
fn nvidia_hooks_do_their_work_on_a_plain_image() {
    let host = Host::new();
    let work = tempfile::tempdir().unwrap();
    let rootfs = work.path().join("rootfs");
    image(&rootfs, &host, "plain");
    let state = hook_bundle(&work.path().join("bundle"), &rootfs);
    let run = |argv0: &str, args: &[&str]| {
        run_hook(
            &static_hook(TARGET_TMPDIR),
            argv0,
            args,
            &state,
            &[],
            &rootfs,
            TIMEOUT,
        )
    };
    let r = run(
        "nvidia-cdi-hook",
        &["enable-cuda-compat", "--host-driver-version", "580.65.06"],
    );
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(
        fs::read_to_string(rootfs.join("etc/ld.so.conf.d/00-compat-nvshim.conf"))
            .unwrap()
            .ends_with("\n/usr/local/cuda/compat\n")
    );
    // The old command line of nvidia-ctk-generated specs.
    let r = run("nvidia-ctk", &["hook", "update-application-profile"]);
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(fs::read_to_string(rootfs.join(&PROFILE[1..]))
        .unwrap()
        .contains(r#""EGLVisibleDGPUDevices",0x1]"#));
    let r = run(
        "nvidia-cdi-hook",
        &["chmod", "--mode", "751", "--path", "/dev/dri"],
    );
    assert_eq!(r.code, Some(0), "{r:?}");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        fs::metadata(rootfs.join("dev/dri"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777,
        0o751
    );
}

/// Fixtures whose outcome is fixed for NVIDIA's hooks: a params file that is not one is refused
/// with a warning naming it (the hook is optional: the container starts, unmasked); a huge or
/// FIFO compat library is never read.
#[test]
fn hostile_params_and_compat_files_are_refused() {
    let host = Host::new();
    let bin = static_hook(TARGET_TMPDIR);
    let hooks = hooks(&host);
    let disable = &hooks[4].args;
    for fixture in [
        "fifo-params",
        "params-symlink-to-host",
        "params-dotdot-to-host",
    ] {
        let run = run_fixture_with(&bin, "nvidia-cdi-hook", fixture, disable, &host, &[], true);
        assert_eq!(run.code, Some(0), "{fixture}: {run:?}");
        assert!(
            run.stderr
                .contains("proc/driver/nvidia/params: not a regular file")
                && run.stderr.contains("warning"),
            "{fixture}: {run:?}"
        );
    }
    let run = run_fixture_with(
        &bin,
        "nvidia-cdi-hook",
        "proc-symlink-to-host",
        disable,
        &host,
        &[],
        true,
    );
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(run.stderr.contains("not masked"), "{run:?}");
    let compat = &hooks[2].args;
    for fixture in ["huge-libcuda", "fifo-libcuda"] {
        let run = run_fixture(&bin, "nvidia-cdi-hook", fixture, compat, &host, &[]);
        assert_eq!(run.code, Some(0), "{fixture}: {run:?}");
        assert!(
            run.elapsed < Duration::from_secs(5),
            "{fixture}: took {:?}",
            run.elapsed
        );
    }
}

#[test]
fn symlink_outside_root_via_host_link_is_inside() {
    // `libdir-symlink-to-host`: the library directory is an image symlink climbing to a host
    // path; inside the root that path does not exist, so the links cannot be made there.
    let host = Host::new();
    let create = hooks(&host).remove(0).args;
    let run = run_fixture(
        &static_hook(TARGET_TMPDIR),
        "nvshim-hook",
        "libdir-symlink-to-host",
        &create,
        &host,
        &[],
    );
    assert_eq!(run.code, Some(1), "{run:?}");
    assert_eq!(fs::read_dir(host.dir.join("lib")).unwrap().count(), 1);
}
