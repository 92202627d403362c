//! End-to-end tests with the real engines: dockerd and containerd (Debian's `docker.io` and
//! `containerd`) configured by `nvshim runtime configure`, running busybox containers on the
//! simulated GPU host; the configure command's file handling; `nvshim system
//! create-dev-char-symlinks`.
//!
//! The engines are whichever are first on `PATH`: scripts/test.sh runs this file with Debian
//! 12's (containerd 1.6, Docker 20.10, runc 1.1.5), then with Debian 13's (containerd 1.7,
//! Docker 26, runc 1.1.15, crun 1.21) and sid's (containerd 2.1, Docker 28.5, runc 1.3, crun
//! 1.28) from scripts/install-engines.sh. What differs by release is asked of the installed
//! engine (`dockerd_version`, `containerd_version`, the config version it prints), never
//! assumed: Docker's CDI (`features.cdi`, `--device nvidia.com/gpu=0` from 25), containerd's
//! CDI (`CDI_devices` from 1.7) and its config layout (version 3 from 2.0).
//!
//! Each engine runs from its Debian package, in its own temp dirs. Every daemon gets its own
//! directories and socket under the test's temp dir and its own session, and a [`Daemon`] guard
//! stops it, kills what it left (shims, container processes) and unmounts everything below its
//! directory, on failure as on success. Daemon tests take [`serial`]: one engine at a time (two
//! cores, and every containerd shim puts its socket in `/run/containerd/s`).
//!
//! `NVSHIM_CONFIG` reaches `nvshim-runtime` through the daemons' environment: dockerd → its
//! containerd → `containerd-shim-runc-v2` → the runtime binary, and containerd → shim → runtime
//! (the shim is started with containerd's environment). The tests would fail if it did not: the
//! default config points at a host without GPUs.
//!
//! Needs root, the engines, runc, crun and `cargo build --workspace` (for `nvshim-hook`).

use std::fs::{self, File};
use std::os::unix::fs::{symlink, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::thread::sleep;
use std::time::{Duration, Instant};

use nvshim_testsupport::probe::assert_no_problems;
use nvshim_testsupport::{unique_id, FakeGpu, ProbeReport, ProbeSpec, Rootfs};
use serde_json::{json, Value};

use super::common::{hook_path, shim_log, NVSHIM, SHIM};
use super::world::{SpecDirs, World};

/// Images the tests import (no registry is reachable).
const IMAGE: &str = "nvshim.test/busybox:1";
const PAUSE: &str = "nvshim.test/pause:1";

/// One engine at a time (see the module comment). A test that panicked poisons nothing that
/// matters: the guard only orders the tests.
fn serial() -> MutexGuard<'static, ()> {
    static DAEMONS: Mutex<()> = Mutex::new(());
    DAEMONS.lock().unwrap_or_else(|e| e.into_inner())
}

// ---- commands ---------------------------------------------------------------------------------

/// What a command did.
struct Out {
    command: String,
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Out {
    fn ok(&self) -> bool {
        self.code == Some(0)
    }

    #[track_caller]
    fn expect_ok(self) -> Out {
        assert!(self.ok(), "command failed:\n{self}");
        self
    }
}

impl std::fmt::Display for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let cut = |s: &str| {
            let s = s.trim_end();
            if s.len() > 6000 {
                format!("...{}", &s[s.len() - 6000..])
            } else {
                s.to_string()
            }
        };
        write!(
            f,
            "$ {}\nexit code: {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.command,
            self.code,
            cut(&self.stdout),
            cut(&self.stderr)
        )
    }
}

/// Runs `cmd` to completion (killed after `timeout`), output through files so that a process
/// that hands its stdio on (a container) cannot block us on a pipe.
fn run(cmd: &mut Command, timeout: Duration) -> Out {
    let scratch = tempfile::tempdir().unwrap();
    let (out_path, err_path) = (scratch.path().join("out"), scratch.path().join("err"));
    let command = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(File::create(&out_path).unwrap())
        .stderr(File::create(&err_path).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {command}: {e}"));
    let code = nvshim_testsupport::runner::wait_with_deadline(
        &mut child,
        Instant::now(),
        timeout,
        Duration::from_millis(50),
    )
    .unwrap()
    .and_then(|status| status.code());
    let read = |p: &Path| String::from_utf8_lossy(&fs::read(p).unwrap_or_default()).into_owned();
    Out {
        command,
        code,
        stdout: read(&out_path),
        stderr: read(&err_path),
    }
}

fn nvshim(args: &[&str]) -> Out {
    run(Command::new(NVSHIM).args(args), Duration::from_secs(30))
}

/// The `--backup-dir` the tests give `runtime configure` and `unconfigure` for the engine
/// config `config`: beside it, in the test's temp dir, so no test leaves backups in the host's
/// /var/lib/nvshim/backups.
fn backup_dir(config: &Path) -> PathBuf {
    config.parent().unwrap().join("nvshim-backups")
}

/// `nvshim runtime VERB --runtime ENGINE --config CONFIG --backup-dir ([backup_dir]) EXTRA...`.
fn runtime_cmd(verb: &str, engine: &str, config: &Path, extra: &[&str]) -> Out {
    let backups = backup_dir(config);
    let mut args = vec!["runtime", verb, "--runtime", engine, "--config", s(config)];
    args.extend(["--backup-dir", s(&backups)]);
    args.extend_from_slice(extra);
    nvshim(&args)
}

/// The release of the dockerd on PATH (Debian 12's 20.10, or the newer ones CI puts first).
fn dockerd_version() -> (u64, u64) {
    nvshim::ops::engine::detect_version(
        nvshim::ops::engine::Engine::Docker,
        std::env::var_os("PATH").as_deref(),
    )
    .expect("dockerd --version")
}

/// `Some(true)` where `runtime configure` turns Docker's CDI on (`features.cdi`: Docker 25 to
/// 27 have it off by default; before 25 there is none, from 28 it is on).
fn docker_cdi_turned_on() -> Option<bool> {
    ((25, 0)..(28, 0))
        .contains(&dockerd_version())
        .then_some(true)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

// ---- daemons ----------------------------------------------------------------------------------

/// A daemon a test started: its own session and process group, its own directory. Dropping it
/// stops it (SIGTERM, then SIGKILL), kills every process left that runs below its directory or
/// names it on its command line, and unmounts everything below the directory.
struct Daemon {
    name: String,
    child: Child,
    dir: PathBuf,
    log: PathBuf,
    /// Host directories the engines create outside their configured dirs, which did not exist
    /// when the daemon started: removed again when empty.
    created: Vec<PathBuf>,
}

/// Where the engines put things whatever their config says: containerd shims' sockets
/// (`/run/containerd/s`, containerd `runtime/v2/shim`), ctr's stdio FIFOs and dockerd's plugin
/// directory.
const HOST_DIRS: &[&str] = &[
    "/run/containerd/s",
    "/run/containerd/fifo",
    "/run/containerd",
    "/run/docker/plugins",
    "/run/docker",
];

impl Daemon {
    fn spawn(name: &str, dir: &Path, mut cmd: Command) -> Daemon {
        fs::create_dir_all(dir).unwrap();
        let created = HOST_DIRS
            .iter()
            .map(PathBuf::from)
            .filter(|p| !p.exists())
            .collect();
        let log = dir.join(format!("{name}.log"));
        let f = File::create(&log).unwrap();
        cmd.stdin(Stdio::null())
            .stdout(f.try_clone().unwrap())
            .stderr(f);
        // SAFETY: between fork and exec the child only calls setsid(2), which is
        // async-signal-safe and touches no memory shared with the parent.
        unsafe {
            cmd.pre_exec(|| {
                nix::unistd::setsid()
                    .map(|_| ())
                    .map_err(std::io::Error::from)
            });
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        Daemon {
            name: name.to_string(),
            child,
            dir: dir.to_path_buf(),
            log,
            created,
        }
    }

    fn log_tail(&self) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Polls `ready` until it holds; panics with the daemon's log if it exits or times out.
    fn wait_until(&mut self, what: &str, timeout: Duration, mut ready: impl FnMut() -> bool) {
        let start = Instant::now();
        loop {
            if ready() {
                return;
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!(
                    "{} exited ({status}) before {what}:\n{}",
                    self.name,
                    self.log_tail()
                );
            }
            if start.elapsed() > timeout {
                panic!(
                    "{} not {what} after {timeout:?}:\n{}",
                    self.name,
                    self.log_tail()
                );
            }
            sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        use nix::sys::signal::{killpg, Signal};
        use nix::unistd::Pid;
        let pgid = Pid::from_raw(self.child.id() as i32);
        let _ = killpg(pgid, Signal::SIGTERM);
        let start = Instant::now();
        while self.child.try_wait().ok().flatten().is_none() {
            if start.elapsed() > Duration::from_secs(30) {
                let _ = killpg(pgid, Signal::SIGKILL);
                let _ = self.child.wait();
                break;
            }
            sleep(Duration::from_millis(100));
        }
        // Whatever else of the group is left (dockerd's containerd, say).
        let _ = killpg(pgid, Signal::SIGKILL);
        kill_processes_below(&self.dir);
        unmount_below(&self.dir);
        for d in &self.created {
            // Fails (and keeps it) unless empty.
            let _ = fs::remove_dir(d);
        }
    }
}

/// Kills processes whose root is below `dir` (containers) or whose command line names it
/// (shims: `-address <dir>/...`). Only what this test started can match: the directory is its
/// own temp dir.
fn kill_processes_below(dir: &Path) {
    let needle = dir.as_os_str().as_encoded_bytes();
    let me = std::process::id();
    for _ in 0..10 {
        let mut found = Vec::new();
        for entry in fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            if pid == me {
                continue;
            }
            let cmdline = fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let named = cmdline.windows(needle.len()).any(|w| w == needle);
            let rooted = fs::read_link(entry.path().join("root")).is_ok_and(|r| r.starts_with(dir));
            if named || rooted {
                found.push(pid);
            }
        }
        if found.is_empty() {
            return;
        }
        for pid in found {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        sleep(Duration::from_millis(300));
    }
}

/// Unmounts (lazily, deepest first) every mount point below `dir`.
fn unmount_below(dir: &Path) {
    let unescape = |s: &str| {
        // mountinfo escapes space, tab, newline and backslash as \ooo.
        let mut out = Vec::new();
        let b = s.as_bytes();
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'\\' && i + 3 < b.len() {
                if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8) {
                    out.push(v);
                    i += 4;
                    continue;
                }
            }
            out.push(b[i]);
            i += 1;
        }
        PathBuf::from(String::from_utf8_lossy(&out).into_owned())
    };
    for _ in 0..5 {
        let info = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut points: Vec<PathBuf> = info
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .map(unescape)
            .filter(|p| p.starts_with(dir))
            .collect();
        if points.is_empty() {
            return;
        }
        points.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
        points.dedup();
        for p in points {
            let _ = nix::mount::umount2(&p, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

// ---- on the world ------------------------------------------------------------------------------

/// The CDI spec directories of this world's nvshim config.
fn config_cdi_dirs(w: &World) -> Vec<PathBuf> {
    nvshim::config::Config::load(&w.config)
        .unwrap()
        .cdi_spec_dirs
}

fn dir(w: &World, name: &str) -> PathBuf {
    let d = w.tmp.path().join(name);
    fs::create_dir_all(&d).unwrap();
    d
}

fn script(w: &World) -> String {
    ProbeSpec::for_host(&w.host).script()
}

/// Parses the probe's output of a container run, failing with everything useful.
#[track_caller]
fn report(w: &World, what: &str, out: &Out) -> ProbeReport {
    assert!(
        out.ok(),
        "{what}: the container did not run:\n{out}\n--- nvshim.log ---\n{}",
        w.shim_log()
    );
    ProbeReport::parse(&out.stdout)
}

/// The selected GPUs and the control devices are there, nothing else.
#[track_caller]
fn assert_gpus(w: &World, what: &str, report: &ProbeReport, selected: &[&FakeGpu]) {
    assert_no_problems(what, &report.gpu_problems(&w.host, selected), report);
    if selected.is_empty() {
        assert_no_problems(what, &report.no_nvidia_problems(&w.host), report);
    } else {
        assert_no_problems(what, &report.control_device_problems(&w.host), report);
    }
}

/// A CDI spec for the fake host: `nvidia.com/gpu=<index>` per GPU, control nodes common.
fn write_cdi_spec(w: &World, dir: &Path) {
    let node = |path: &str| json!({"path": path, "hostPath": s(&w.host.root().join(path.trim_start_matches('/')))});
    let devices: Vec<Value> = w
        .host
        .gpus_by_bus()
        .iter()
        .enumerate()
        .map(|(i, g)| {
            json!({"name": i.to_string(),
                   "containerEdits": {"deviceNodes": [node(&format!("/dev/nvidia{}", g.minor))]}})
        })
        .collect();
    let spec = json!({
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": devices,
        "containerEdits": {"deviceNodes": [node("/dev/nvidiactl"), node("/dev/nvidia-uvm"), node("/dev/nvidia-uvm-tools")]}
    });
    fs::create_dir_all(dir).unwrap();
    fs::write(
        dir.join("nvshim-e2e.json"),
        serde_json::to_vec_pretty(&spec).unwrap(),
    )
    .unwrap();
}

fn busybox_tar(dir: &Path) -> PathBuf {
    let rootfs = Rootfs::busybox(&dir.join("rootfs")).unwrap();
    let tar = dir.join("rootfs.tar");
    run(
        Command::new("tar").args([
            "--numeric-owner",
            "-C",
            s(rootfs.path()),
            "-cf",
            s(&tar),
            ".",
        ]),
        Duration::from_secs(60),
    )
    .expect_ok();
    tar
}

fn sha256(path: &Path) -> String {
    let out = run(Command::new("sha256sum").arg(path), Duration::from_secs(60)).expect_ok();
    out.stdout.split_whitespace().next().unwrap().to_string()
}

/// An OCI image layout archive (`oci-layout`, `index.json`, `blobs/sha256/*`) holding one image
/// named `name`: the busybox rootfs as one uncompressed layer, with `config` as the image's
/// runtime config (`Entrypoint`, `Cmd`, `Env`). What `ctr images import` reads; no registry.
fn oci_archive(dir: &Path, layer_tar: &Path, name: &str, config: Value) -> PathBuf {
    let work = dir.join(format!("oci-{}", unique_id("img")));
    let blobs = work.join("blobs/sha256");
    fs::create_dir_all(&blobs).unwrap();
    let add_blob = |path: &Path| -> (String, u64) {
        let digest = sha256(path);
        let size = fs::metadata(path).unwrap().len();
        fs::copy(path, blobs.join(&digest)).unwrap();
        (format!("sha256:{digest}"), size)
    };
    let add_json = |v: &Value| -> (String, u64) {
        let p = work.join("blob.json");
        fs::write(&p, serde_json::to_vec(v).unwrap()).unwrap();
        let r = add_blob(&p);
        fs::remove_file(&p).unwrap();
        r
    };
    let (layer, layer_size) = add_blob(layer_tar);
    let (cfg, cfg_size) = add_json(&json!({
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [layer]},
    }));
    let (manifest, manifest_size) = add_json(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cfg, "size": cfg_size},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer, "size": layer_size}],
    }));
    fs::write(
        work.join("index.json"),
        serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": manifest,
                "size": manifest_size,
                "annotations": {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name.rsplit(':').next().unwrap()},
            }],
        }))
        .unwrap(),
    )
    .unwrap();
    fs::write(work.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    let out = dir.join(format!("{}.oci.tar", name.replace(['/', ':'], "_")));
    run(
        Command::new("tar").args([
            "-C",
            s(&work),
            "-cf",
            s(&out),
            "oci-layout",
            "index.json",
            "blobs",
        ]),
        Duration::from_secs(60),
    )
    .expect_ok();
    fs::remove_dir_all(&work).unwrap();
    out
}

const PATH_ENV: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

// ---- runtime configure ------------------------------------------------------------------------

#[test]
fn configure_docker_keeps_keys_backs_up_and_is_idempotent() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("daemon.json");
    let original = "{\n  \"log-driver\": \"journald\",\n  \"runtimes\": {\n    \"runsc\": {\"path\": \"/usr/bin/runsc\"}\n  },\n  \"storage-driver\": \"overlay2\"\n}\n";
    fs::write(&path, original).unwrap();

    let dry = runtime_cmd("configure", "docker", &path, &["--dry-run"]).expect_ok();
    assert!(dry.stdout.contains("+    \"nvidia\": {"), "{dry}");
    assert!(
        dry.stdout.starts_with(&format!("--- {}", path.display())),
        "{dry}"
    );
    assert_eq!(
        fs::read_to_string(&path).unwrap(),
        original,
        "--dry-run wrote"
    );

    runtime_cmd("configure", "docker", &path, &["--set-as-default"]).expect_ok();
    let v: Value = serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
    let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
    // The installed dockerd decides `features.cdi` (see docker_cdi_turned_on).
    let mut want = vec![
        "log-driver",
        "runtimes",
        "storage-driver",
        "default-runtime",
    ];
    if docker_cdi_turned_on().is_some() {
        want.push("features");
    }
    assert_eq!(keys, want);
    assert_eq!(v["runtimes"]["runsc"]["path"], "/usr/bin/runsc");
    assert_eq!(v["runtimes"]["nvidia"], json!({"path": SHIM, "args": []}));
    assert_eq!(v["default-runtime"], "nvidia");
    let backup = backup_of(&path, &path);
    assert_eq!(fs::read_to_string(&backup).unwrap(), original);
    assert_eq!(
        entries_beside(&path),
        2,
        "only daemon.json and its state file beside it"
    );

    let written = fs::read_to_string(&path).unwrap();
    let again = runtime_cmd("configure", "docker", &path, &["--set-as-default"]).expect_ok();
    assert!(again.stdout.contains("nothing to change"), "{again}");
    assert_eq!(fs::read_to_string(&path).unwrap(), written);

    runtime_cmd("unconfigure", "docker", &path, &[]).expect_ok();
    assert_eq!(
        fs::read_to_string(&path).unwrap(),
        original,
        "the same bytes"
    );
    assert!(!backup.exists(), "the backup is removed");
}

/// How many entries the directory of `config` holds, but for the tests' [`backup_dir`].
fn entries_beside(config: &Path) -> usize {
    fs::read_dir(config.parent().unwrap())
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path() != backup_dir(config))
        .count()
}

/// The backup `runtime configure --config CONFIG` keeps of `file` ([`backup_dir`] + its path).
fn backup_of(config: &Path, file: &Path) -> PathBuf {
    nvshim::ops::engine::backup_path(&backup_dir(config), file)
}

/// A one-line daemon.json without a final newline comes back byte for byte after configure and
/// unconfigure; one edited in between keeps the edit (the content is rewritten, not the
/// backup's bytes put back).
#[test]
fn unconfigure_docker_gives_the_bytes_back() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("daemon.json");
    let original = r#"{"log-driver":"journald","storage-driver":"overlay2"}"#;
    fs::write(&path, original).unwrap();
    runtime_cmd("configure", "docker", &path, &[]).expect_ok();
    assert_ne!(fs::read_to_string(&path).unwrap(), original);
    runtime_cmd("unconfigure", "docker", &path, &[]).expect_ok();
    assert_eq!(fs::read_to_string(&path).unwrap(), original);
    assert!(!backup_of(&path, &path).exists());
    assert_eq!(entries_beside(&path), 1, "nothing left beside it");

    runtime_cmd("configure", "docker", &path, &[]).expect_ok();
    let mut edited: Value = serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
    edited["debug"] = json!(true);
    fs::write(&path, serde_json::to_string_pretty(&edited).unwrap()).unwrap();
    runtime_cmd("unconfigure", "docker", &path, &[]).expect_ok();
    let back: Value = serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(
        back,
        json!({"log-driver": "journald", "storage-driver": "overlay2", "debug": true})
    );
    assert!(!backup_of(&path, &path).exists());
}

#[test]
fn configure_refuses_unparsable_configs_and_leaves_them_untouched() {
    let tmp = tempfile::tempdir().unwrap();
    for (engine, name, text) in [
        ("docker", "daemon.json", "{\"runtimes\": {"),
        (
            "containerd",
            "config.toml",
            "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"\n",
        ),
        ("crio", "crio.conf", "[crio.runtime\n"),
    ] {
        let path = tmp.path().join(name);
        fs::write(&path, text).unwrap();
        let out = runtime_cmd("configure", engine, &path, &[]);
        assert!(!out.ok(), "{out}");
        assert!(
            out.stderr.contains(s(&path)),
            "the error names the file: {out}"
        );
        assert_eq!(fs::read_to_string(&path).unwrap(), text);
        let entries: Vec<_> = fs::read_dir(tmp.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(
            entries.len(),
            1,
            "{engine}: nothing else written: {entries:?}"
        );
        fs::remove_file(&path).unwrap();
    }
}

/// `containerd config dump` (containerd's own parser and merge) on configs nvshim wrote: the
/// default config with `SystemdCgroup = true`, and a config with `imports`.
#[test]
fn configure_containerd_config_dump_shows_the_runtime() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("config.toml");
    let default = run(
        Command::new("containerd").args(["config", "default"]),
        Duration::from_secs(30),
    )
    .expect_ok();
    fs::write(
        &path,
        default
            .stdout
            .replace("SystemdCgroup = false", "SystemdCgroup = true"),
    )
    .unwrap();
    runtime_cmd("configure", "containerd", &path, &[]).expect_ok();
    assert!(runtime_cmd("configure", "containerd", &path, &[])
        .expect_ok()
        .stdout
        .contains("nothing to change"));
    let dumped = dump(&path);
    let nvidia = &cri_runtime(&dumped)["containerd"]["runtimes"]["nvidia"];
    assert_eq!(
        nvidia["runtime_type"].as_str(),
        Some("io.containerd.runc.v2")
    );
    assert_eq!(nvidia["options"]["BinaryName"].as_str(), Some(SHIM));
    assert_eq!(
        nvidia["options"]["SystemdCgroup"].as_bool(),
        Some(true),
        "runc's options carried over"
    );
    assert_eq!(
        nvidia["container_annotations"][0].as_str(),
        Some("cdi.k8s.io/*")
    );

    // imports: the drop-in must keep the CRI settings of the files before it (containerd 1.6
    // replaces a whole plugin section per imported file).
    let dir = tmp.path().join("imports");
    fs::create_dir_all(dir.join("conf.d")).unwrap();
    let main = dir.join("config.toml");
    fs::write(
        &main,
        format!("version = 2\nimports = [\"{}/conf.d/*.toml\"]\n\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"site/pause:9\"\n  [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n    runtime_type = \"io.containerd.runc.v2\"\n    [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n      SystemdCgroup = true\n", dir.display()),
    )
    .unwrap();
    let before = fs::read_to_string(&main).unwrap();
    let out = runtime_cmd("configure", "containerd", &main, &[]).expect_ok();
    assert!(out.stdout.contains("99-nvshim.toml"), "{out}");
    assert_eq!(
        fs::read_to_string(&main).unwrap(),
        before,
        "the main file stays as it was"
    );
    let dumped = dump(&main);
    let cri = cri_runtime(&dumped);
    assert_eq!(sandbox_image(&dumped), Some("site/pause:9"), "{dumped:#?}");
    assert_eq!(
        cri["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"].as_bool(),
        Some(true)
    );
    assert_eq!(
        cri["containerd"]["runtimes"]["nvidia"]["options"]["BinaryName"].as_str(),
        Some(SHIM)
    );
    runtime_cmd("unconfigure", "containerd", &main, &[]).expect_ok();
    assert!(!dir.join("conf.d/99-nvshim.toml").exists());
}

fn dump(config: &Path) -> toml::Table {
    let out = run(
        Command::new("containerd").args(["--config", s(config), "config", "dump"]),
        Duration::from_secs(30),
    )
    .expect_ok();
    toml::from_str(&out.stdout).unwrap()
}

/// The CRI runtime section of a containerd config (or of `config dump`): version 3's
/// `io.containerd.cri.v1.runtime` (containerd 2.x dumps every config in that layout), else
/// version 2's CRI plugin.
fn cri_runtime(config: &toml::Table) -> &toml::Value {
    let plugins = &config["plugins"];
    plugins
        .get("io.containerd.cri.v1.runtime")
        .unwrap_or(&plugins["io.containerd.grpc.v1.cri"])
}

/// The sandbox (pause) image of a dumped config, in either layout.
fn sandbox_image(config: &toml::Table) -> Option<&str> {
    let plugins = &config["plugins"];
    match plugins.get("io.containerd.cri.v1.images") {
        Some(images) => images["pinned_images"]["sandbox"].as_str(),
        None => plugins["io.containerd.grpc.v1.cri"]["sandbox_image"].as_str(),
    }
}

/// The release of the containerd on PATH (Debian 12's 1.6, or the newer ones CI puts first).
fn containerd_version() -> (u64, u64) {
    nvshim::ops::engine::detect_version(
        nvshim::ops::engine::Engine::Containerd,
        std::env::var_os("PATH").as_deref(),
    )
    .expect("containerd --version")
}

/// The default configs of containerd 1.6 and 1.7 (tests/fixtures/engine-configs/; the
/// installed containerd reads their version 2), configured through a chain of two links
/// (absolute, then relative) as `--config`: `containerd config dump` reads the runtime, the
/// links stay, and unconfigure gives the text back. The 1.7 one gets `enable_cdi = true`. Where
/// the installed containerd reads them, the 2.1 and 2.3 defaults (versions 3 and 4) go through
/// the same steps.
#[test]
fn configure_containerd_fixtures_through_links_config_dump() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/engine-configs");
    // The installed containerd dumps them: 1.6 and 1.7 read version 2, 2.0 to 2.2 versions
    // 2 and 3, 2.3 also 4.
    let installed = containerd_version();
    let mut fixtures_read = vec![
        ("containerd-1.6.20-default.toml", "1.6"),
        ("containerd-1.7.34-default.toml", "1.7"),
    ];
    if installed >= (2, 0) {
        fixtures_read.push(("containerd-2.1.9-default.toml", "2.1"));
    }
    if installed >= (2, 3) {
        fixtures_read.push(("containerd-2.3.4-default.toml", "2.3"));
    }
    for (name, release) in fixtures_read {
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().join("cm/containerd.toml");
        fs::create_dir_all(real.parent().unwrap()).unwrap();
        let original = fs::read_to_string(fixtures.join(name)).unwrap();
        fs::write(&real, &original).unwrap();
        let middle = tmp.path().join("cm/current.toml");
        symlink("containerd.toml", &middle).unwrap();
        let config = tmp.path().join("config.toml");
        symlink(&middle, &config).unwrap();
        let args = |verb: &'static str| {
            vec![
                "runtime".to_string(),
                verb.to_string(),
                "--runtime".into(),
                "containerd".into(),
                "--config".into(),
                s(&config).into(),
                "--backup-dir".into(),
                s(&backup_dir(&config)).into(),
            ]
        };
        let mut configure = args("configure");
        configure.extend(["--engine-version".into(), release.into()]);
        let configure: Vec<&str> = configure.iter().map(String::as_str).collect();
        nvshim(&configure).expect_ok();
        assert!(fs::symlink_metadata(&config)
            .unwrap()
            .file_type()
            .is_symlink());
        assert!(fs::symlink_metadata(&middle)
            .unwrap()
            .file_type()
            .is_symlink());
        let written = fs::read_to_string(&real).unwrap();
        // Only 1.7 has CDI off by default (2.x prints `enable_cdi = true`, 1.6 has no CDI).
        assert_eq!(
            written.contains("enable_cdi = true # set by"),
            release == "1.7",
            "{name}: {written}"
        );
        let dumped = dump(&config);
        let cri = cri_runtime(&dumped);
        let nvidia = &cri["containerd"]["runtimes"]["nvidia"];
        assert_eq!(
            nvidia["options"]["BinaryName"].as_str(),
            Some(SHIM),
            "{name}: {nvidia:#?}"
        );
        assert!(
            cri["containerd"]["runtimes"].get("runc").is_some(),
            "{name}"
        );
        let unconfigure = args("unconfigure");
        let unconfigure: Vec<&str> = unconfigure.iter().map(String::as_str).collect();
        nvshim(&unconfigure).expect_ok();
        assert_eq!(fs::read_to_string(&real).unwrap(), original, "{name}");
        assert!(fs::symlink_metadata(&config)
            .unwrap()
            .file_type()
            .is_symlink());
    }
}

/// Where configure turns containerd 1.7's CDI on and the file names no spec directories, it
/// writes nvshim's own (`$NVSHIM_CONFIG`'s `cdi-spec-dirs`), so both read the same specs; the
/// engine's `--config` is never taken for nvshim's.
#[test]
fn configure_containerd_gives_engine_cdi_nvshim_s_spec_dirs() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("config.toml");
    fs::write(&config, "version = 2\n").unwrap();
    let nvshim_config = tmp.path().join("nvshim.toml");
    fs::write(
        &nvshim_config,
        "cdi-spec-dirs = [\"/srv/cdi\", \"/var/run/cdi\"]\n",
    )
    .unwrap();
    let out = run(
        Command::new(NVSHIM)
            .args([
                "runtime",
                "configure",
                "--runtime",
                "containerd",
                "--config",
            ])
            .arg(&config)
            .arg("--backup-dir")
            .arg(backup_dir(&config))
            .args(["--engine-version", "1.7"])
            .env("NVSHIM_CONFIG", &nvshim_config),
        Duration::from_secs(30),
    )
    .expect_ok();
    assert!(!out.stderr.contains("warning"), "{out}");
    let written: toml::Table = toml::from_str(&fs::read_to_string(&config).unwrap()).unwrap();
    let cri = &written["plugins"]["io.containerd.grpc.v1.cri"];
    assert_eq!(cri["enable_cdi"].as_bool(), Some(true));
    assert_eq!(
        cri["cdi_spec_dirs"].as_array().unwrap(),
        &[
            toml::Value::from("/srv/cdi"),
            toml::Value::from("/var/run/cdi")
        ]
    );
}

/// A config that sets `enable_cdi = false` (containerd 1.7's default) is read by a containerd
/// with CDI, whichever containerd is on PATH (here Debian 12's 1.6, which has none: k3s's or one
/// off PATH reads the file): configure turns CDI on in it, and the containerd on the test's PATH
/// reads it so where it has CDI (1.7 and later).
#[test]
fn configure_containerd_turns_on_cdi_a_config_sets_whatever_is_on_path() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/engine-configs");
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("config.toml");
    fs::copy(fixtures.join("containerd-1.7.34-default.toml"), &config).unwrap();
    let debian_path = "/usr/sbin:/usr/bin:/sbin:/bin";
    let on_path = nvshim::ops::engine::detect_version(
        nvshim::ops::engine::Engine::Containerd,
        Some(std::ffi::OsStr::new(debian_path)),
    );
    eprintln!("containerd on the configure's PATH: {on_path:?}");
    run(
        Command::new(NVSHIM)
            .args([
                "runtime",
                "configure",
                "--runtime",
                "containerd",
                "--config",
            ])
            .arg(&config)
            .arg("--backup-dir")
            .arg(backup_dir(&config))
            .env("PATH", debian_path),
        Duration::from_secs(30),
    )
    .expect_ok();
    let written = fs::read_to_string(&config).unwrap();
    assert!(written.contains("enable_cdi = true # set by"), "{written}");
    if containerd_version() >= (1, 7) {
        let dumped = dump(&config);
        let cri = cri_runtime(&dumped);
        assert_eq!(cri["enable_cdi"].as_bool(), Some(true), "{cri:#?}");
    }
    runtime_cmd("unconfigure", "containerd", &config, &[]).expect_ok();
    assert_eq!(
        fs::read(&config).unwrap(),
        fs::read(fixtures.join("containerd-1.7.34-default.toml")).unwrap()
    );
}

/// README's "From source" installs what the .deb installs (Cargo.toml's
/// `package.metadata.deb` assets): every destination, both hook links among them, so that
/// `docker run --runtime=nvidia --gpus` works after a source install.
#[test]
fn readme_source_install_matches_the_package() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = fs::read_to_string(repo.join("README.md")).unwrap();
    let section = readme
        .split("### From source")
        .nth(1)
        .and_then(|r| r.split("```sh").nth(1))
        .and_then(|r| r.split("```").next())
        .expect("README has a From source sh block");
    let cargo: toml::Table =
        toml::from_str(&fs::read_to_string(repo.join("Cargo.toml")).unwrap()).unwrap();
    let assets = cargo["package"]["metadata"]["deb"]["assets"]
        .as_array()
        .unwrap();
    for asset in assets {
        let (source, dest) = match asset {
            toml::Value::Array(a) => (a[0].as_str().unwrap(), a[1].as_str().unwrap()),
            toml::Value::Table(t) => {
                let dest = t["dest"].as_str().unwrap();
                let link = format!("ln -sf {} /{dest}", t["link_name"].as_str().unwrap());
                assert!(section.contains(&link), "README lacks `{link}`:\n{section}");
                continue;
            }
            other => panic!("asset {other:?}"),
        };
        let name = Path::new(source).file_name().unwrap().to_str().unwrap();
        let dest = format!("/{}", dest.trim_end_matches('/'));
        assert!(
            section.contains(&dest),
            "README's source install lacks {dest} (for {source}):\n{section}"
        );
        assert!(
            section.contains(name) || section.contains(source),
            "README's source install lacks {source}:\n{section}"
        );
    }
}

#[test]
fn configure_crio_writes_a_drop_in() {
    let tmp = tempfile::tempdir().unwrap();
    let main = tmp.path().join("crio.conf");
    fs::write(&main, "[crio.runtime]\ndefault_runtime = \"crun\"\n[crio.runtime.runtimes.crun]\nruntime_path = \"/usr/bin/crun\"\nmonitor_path = \"/usr/libexec/crio/conmon\"\n").unwrap();
    let before = fs::read_to_string(&main).unwrap();
    runtime_cmd("configure", "crio", &main, &[]).expect_ok();
    assert_eq!(fs::read_to_string(&main).unwrap(), before);
    let drop_in: toml::Table =
        toml::from_str(&fs::read_to_string(tmp.path().join("crio.conf.d/99-nvshim.toml")).unwrap())
            .unwrap();
    let nv = &drop_in["crio"]["runtime"]["runtimes"]["nvidia"];
    assert_eq!(nv["runtime_path"].as_str(), Some(SHIM));
    assert_eq!(nv["runtime_type"].as_str(), Some("oci"));
    assert_eq!(
        nv["monitor_path"].as_str(),
        Some("/usr/libexec/crio/conmon")
    );
    runtime_cmd("unconfigure", "crio", &main, &[]).expect_ok();
    assert!(!tmp.path().join("crio.conf.d/99-nvshim.toml").exists());
}

/// The `runtime_path` of CRI-O's runtime `nvidia` as CRI-O merges its config, and the names in
/// `crio.conf.d`. CRI-O is not in Debian's registry (bookworm, trixie nor sid), so this models
/// its documented rule, quoted in src/ops/engine/crio.rs from crio.conf.d(5): `crio.conf`, then
/// every file of `crio.conf.d`, whatever its name, sorted by name, later keys winning.
fn crio_view(main: &Path) -> (Option<String>, Vec<String>) {
    let conf_d = main.with_file_name("crio.conf.d");
    let mut names: Vec<String> = fs::read_dir(&conf_d)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    let mut path = None;
    let files = std::iter::once(main.to_path_buf()).chain(names.iter().map(|n| conf_d.join(n)));
    for file in files {
        let Ok(text) = fs::read_to_string(&file) else {
            continue;
        };
        let t: toml::Table = toml::from_str(&text).unwrap();
        let nvidia = t
            .get("crio")
            .and_then(|c| c.get("runtime"))
            .and_then(|r| r.get("runtimes"))
            .and_then(|r| r.get("nvidia"));
        if let Some(p) = nvidia.and_then(|n| n.get("runtime_path")) {
            path = p.as_str().map(str::to_string);
        }
    }
    (path, names)
}

/// configure, configure again with another `--runtime-path`, unconfigure: CRI-O's view follows
/// each step, as no backup is left in `crio.conf.d` (CRI-O would read it as config: before, the
/// old `.nvshim.bak` kept the first path after a reconfigure and the runtime after unconfigure).
/// A `99-nvshim.toml.nvshim.bak` an earlier nvshim left there is removed.
#[test]
fn configure_crio_reconfigure_and_unconfigure_as_crio_reads_them() {
    let tmp = tempfile::tempdir().unwrap();
    let main = tmp.path().join("crio.conf");
    fs::write(&main, "[crio.runtime]\ndefault_runtime = \"crun\"\n").unwrap();
    let drop_in = tmp.path().join("crio.conf.d/99-nvshim.toml");
    runtime_cmd("configure", "crio", &main, &[]).expect_ok();
    assert_eq!(
        crio_view(&main),
        (Some(SHIM.to_string()), vec!["99-nvshim.toml".to_string()])
    );
    let first = fs::read_to_string(&drop_in).unwrap();
    let other = "/opt/nvshim/bin/nvshim-runtime";
    runtime_cmd("configure", "crio", &main, &["--runtime-path", other]).expect_ok();
    assert_eq!(
        crio_view(&main),
        (Some(other.to_string()), vec!["99-nvshim.toml".to_string()])
    );
    assert_eq!(
        fs::read_to_string(backup_of(&main, &drop_in)).unwrap(),
        first
    );
    runtime_cmd("unconfigure", "crio", &main, &[]).expect_ok();
    assert_eq!(crio_view(&main), (None, vec![]));
    assert!(!backup_of(&main, &drop_in).exists());

    let legacy = tmp.path().join("crio.conf.d/99-nvshim.toml.nvshim.bak");
    fs::write(&legacy, &first).unwrap();
    assert_eq!(crio_view(&main).0.as_deref(), Some(SHIM));
    runtime_cmd("unconfigure", "crio", &main, &[]).expect_ok();
    assert_eq!(crio_view(&main), (None, vec![]));
}

// ---- system create-dev-char-symlinks ----------------------------------------------------------

#[test]
fn dev_char_symlinks_for_the_fake_host() {
    let w = World::new();
    let chars = w.tmp.path().join("dev-char");
    let args = |extra: &[&str]| {
        let mut a = vec![
            "--config",
            s(&w.config),
            "system",
            "create-dev-char-symlinks",
            "--dev-char-path",
            s(&chars),
        ];
        a.extend_from_slice(extra);
        a.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let call = |extra: &[&str]| {
        let a = args(extra);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        nvshim(&a).expect_ok()
    };

    let dry = call(&["--dry-run"]);
    assert!(dry.stdout.contains("would create"), "{dry}");
    assert!(!chars.exists(), "--dry-run created {}", chars.display());

    call(&[]);
    let uvm = w.host.spec().uvm_major;
    let mut want: Vec<(u32, u32, String)> = w
        .host
        .gpus()
        .iter()
        .map(|g| (195, g.minor, format!("nvidia{}", g.minor)))
        .collect();
    want.extend([
        (195, 255, "nvidiactl".to_string()),
        (195, 254, "nvidia-modeset".to_string()),
        (uvm, 0, "nvidia-uvm".to_string()),
        (uvm, 1, "nvidia-uvm-tools".to_string()),
    ]);
    for (major, minor, name) in &want {
        let link = chars.join(format!("{major}:{minor}"));
        assert_eq!(
            fs::read_link(&link).unwrap(),
            w.host.root().join("dev").join(name)
        );
        // What runc's systemd driver checks: the path resolves to that very device.
        let meta = fs::metadata(&link).unwrap();
        assert!(meta.file_type().is_char_device());
        assert_eq!(
            (
                nix::sys::stat::major(meta.rdev()) as u32,
                nix::sys::stat::minor(meta.rdev()) as u32
            ),
            (*major, *minor)
        );
    }
    assert_eq!(fs::read_dir(&chars).unwrap().count(), want.len());

    let again = call(&[]);
    assert!(
        !again.stdout.contains("create"),
        "second run changed something: {again}"
    );
}

// ---- dockerd ----------------------------------------------------------------------------------

#[test]
fn docker_runs_gpu_containers_through_the_nvidia_runtime() {
    let _one_engine = serial();
    let w = World::builder().spec_dirs(SpecDirs::Run).build();
    let cdi_dir = &w.run_cdi;
    write_cdi_spec(&w, cdi_dir);
    // Docker 25 and later read CDI specs (`--device nvidia.com/gpu=0`); older ones refuse the
    // key.
    let docker_cdi = dockerd_version() >= (25, 0);
    let d = dir(&w, "dk");
    let sock = d.join("docker.sock");
    let daemon_json = d.join("daemon.json");
    // daemon.json as config management keeps it: a link (relative, then absolute) to the file.
    let managed = d.join("managed/daemon.json");
    fs::create_dir_all(managed.parent().unwrap()).unwrap();
    symlink("managed/daemon.json", d.join("daemon-link.json")).unwrap();
    symlink(d.join("daemon-link.json"), &daemon_json).unwrap();
    let mut daemon_conf = json!({
        "data-root": d.join("data"),
        "exec-root": d.join("x"),
        "pidfile": d.join("docker.pid"),
        "hosts": [format!("unix://{}", sock.display())],
        "iptables": false,
        "ip-masq": false,
        "bridge": "none",
    });
    if docker_cdi {
        daemon_conf["cdi-spec-dirs"] = json!([cdi_dir]);
    }
    fs::write(&managed, serde_json::to_vec_pretty(&daemon_conf).unwrap()).unwrap();
    runtime_cmd("configure", "docker", &daemon_json, &[]).expect_ok();
    let conf: Value = serde_json::from_slice(&fs::read(&daemon_json).unwrap()).unwrap();
    assert_eq!(conf["runtimes"]["nvidia"]["path"], SHIM);
    assert_eq!(conf["bridge"], "none");
    // nvshim-runtime is the default runtime, so `--gpus` works without `--runtime`; dockerd
    // before 25 has no CDI (no `features.cdi`), 25 to 27 have it off (turned on), 28 on.
    assert_eq!(conf["default-runtime"], "nvidia");
    assert_eq!(
        conf.pointer("/features/cdi").and_then(Value::as_bool),
        docker_cdi_turned_on(),
        "{conf:#}"
    );
    assert!(fs::symlink_metadata(&daemon_json)
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(fs::symlink_metadata(d.join("daemon-link.json"))
        .unwrap()
        .file_type()
        .is_symlink());

    // dockerd registers its `--gpus` driver when nvidia-container-runtime-hook is on its PATH
    // (moby daemon/nvidia_linux.go); nvshim-hook answers to that name.
    let bin = dir(&w, "dk-bin");
    symlink(hook_path(), bin.join("nvidia-container-runtime-hook")).unwrap();
    let path_env = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // dockerd 20.10 creates /etc/docker/key.json when missing: take it away again.
    let key = Path::new("/etc/docker/key.json");
    let key_existed = key.exists();

    let mut cmd = Command::new("dockerd");
    cmd.arg("--config-file")
        .arg(&daemon_json)
        .env("NVSHIM_CONFIG", &w.config)
        .env("PATH", &path_env);
    let mut daemon = Daemon::spawn("dockerd", &d, cmd);
    let docker = |args: &[&str]| {
        run(
            Command::new("docker")
                .env("DOCKER_HOST", format!("unix://{}", sock.display()))
                .env("DOCKER_CONFIG", d.join("cli"))
                .args(args),
            Duration::from_secs(120),
        )
    };
    daemon.wait_until("answering", Duration::from_secs(60), || {
        docker(&["version"]).ok()
    });

    let tar = busybox_tar(&dir(&w, "dk-image"));
    docker(&["import", s(&tar), IMAGE]).expect_ok();
    let script = script(&w);
    let docker_run = |extra: &[&str]| {
        let mut a = vec!["run", "--rm", "--network", "none"];
        a.extend_from_slice(extra);
        a.extend([IMAGE, "sh", "-c", script.as_str()]);
        docker(&a)
    };

    let what = "docker run --runtime=nvidia -e NVIDIA_VISIBLE_DEVICES=1";
    let r = report(
        &w,
        what,
        &docker_run(&["--runtime=nvidia", "-e", "NVIDIA_VISIBLE_DEVICES=1"]),
    );
    assert_gpus(&w, what, &r, &[w.gpu(1)]);

    let what = "docker run --runtime=nvidia (no request)";
    let r = report(&w, what, &docker_run(&["--runtime=nvidia"]));
    assert_gpus(&w, what, &r, &[]);

    let what = "docker run --runtime=nvidia --gpus device=0";
    let r = report(
        &w,
        what,
        &docker_run(&["--runtime=nvidia", "--gpus", "device=0"]),
    );
    assert_gpus(&w, what, &r, &[w.gpu(0)]);

    // Through the default runtime: no `--runtime` at all.
    let what = "docker run -e NVIDIA_VISIBLE_DEVICES=0 (default runtime)";
    let r = report(&w, what, &docker_run(&["-e", "NVIDIA_VISIBLE_DEVICES=0"]));
    assert_gpus(&w, what, &r, &[w.gpu(0)]);
    let what = "docker run --gpus device=1 (default runtime)";
    let r = report(&w, what, &docker_run(&["--gpus", "device=1"]));
    assert_gpus(&w, what, &r, &[w.gpu(1)]);
    let what = "docker run --gpus all (default runtime)";
    let r = report(&w, what, &docker_run(&["--gpus", "all"]));
    assert_gpus(&w, what, &r, &[w.gpu(0), w.gpu(1)]);
    if docker_cdi {
        // Docker's own CDI resolves the device; the default runtime then finds it applied.
        let what = "docker run --device nvidia.com/gpu=0 (Docker's CDI)";
        let r = report(&w, what, &docker_run(&["--device", "nvidia.com/gpu=0"]));
        assert_gpus(&w, what, &r, &[w.gpu(0)]);
    }
    let what = "docker run (default runtime, no request)";
    let r = report(&w, what, &docker_run(&[]));
    assert_gpus(&w, what, &r, &[]);

    // runc itself with --gpus: the hook is run outside nvshim-runtime and refuses, naming
    // the fixes.
    let out = docker_run(&["--runtime=runc", "--gpus", "all"]);
    assert!(!out.ok(), "{out}");
    for fix in [
        "nvshim runtime configure --runtime docker",
        "docker run --runtime=nvidia --gpus",
        "nvshim cdi generate --output /var/run/cdi/nvidia.yaml",
    ] {
        assert!(
            out.stderr.contains(fix),
            "the refusal names {fix:?}:\n{out}"
        );
    }

    drop(daemon);
    // Unconfigure through the links: the default runtime goes away with the runtime.
    runtime_cmd("unconfigure", "docker", &daemon_json, &[]).expect_ok();
    let conf: Value = serde_json::from_slice(&fs::read(&managed).unwrap()).unwrap();
    assert!(conf.get("default-runtime").is_none(), "{conf:#}");
    assert!(conf.get("runtimes").is_none(), "{conf:#}");
    assert!(fs::symlink_metadata(&daemon_json)
        .unwrap()
        .file_type()
        .is_symlink());
    if !key_existed {
        let _ = fs::remove_file(key);
    }
    assert_nothing_mounted_below(w.tmp.path());
}

#[track_caller]
fn assert_nothing_mounted_below(dir: &Path) {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let left: Vec<&str> = info.lines().filter(|l| l.contains(s(dir))).collect();
    assert!(left.is_empty(), "mounts left behind: {left:#?}");
}

// ---- containerd -------------------------------------------------------------------------------

/// A containerd of the test's own: `containerd config default` with every path moved below
/// `d`, the CRI plugin's sandbox image set to the imported pause image, then `nvshim runtime
/// configure --runtime containerd`.
struct Containerd {
    daemon: Daemon,
    sock: PathBuf,
    dir: PathBuf,
}

impl Containerd {
    fn start(w: &World, d: &Path) -> Containerd {
        Containerd::start_with(w, d, &[], |_| {})
    }

    /// [`Containerd::start`] with `edit` applied to the config before configure writes it, and
    /// `configure_args` added to configure's (tests/e2e/nri.rs: its NRI socket, `--nri`).
    fn start_with(
        w: &World,
        d: &Path,
        configure_args: &[&str],
        edit: impl FnOnce(&mut toml_edit::DocumentMut),
    ) -> Containerd {
        let sock = d.join("c.sock");
        let config = d.join("config.toml");
        let default = run(
            Command::new("containerd").args(["config", "default"]),
            Duration::from_secs(30),
        )
        .expect_ok();
        let mut doc: toml_edit::DocumentMut = default.stdout.parse().unwrap();
        let p = |name: &str| toml_edit::value(s(&d.join(name)));
        doc["root"] = p("root");
        doc["state"] = p("state");
        // containerd 2.3 prints version 4: its sockets are the server plugins' addresses,
        // which override `[grpc]` (seen: it served /run/containerd/containerd.sock instead).
        if doc.get("version").and_then(toml_edit::Item::as_integer) >= Some(4) {
            doc["plugins"]["io.containerd.server.v1.grpc"]["address"] = toml_edit::value(s(&sock));
            doc["plugins"]["io.containerd.server.v1.ttrpc"]["address"] = p("c.sock.ttrpc");
        } else {
            doc["grpc"]["address"] = toml_edit::value(s(&sock));
        }
        doc["plugins"]["io.containerd.internal.v1.opt"]["path"] = p("opt");
        // containerd 2.x prints version 3: the CRI settings split into `cri.v1.runtime` and
        // `cri.v1.images`, with the streaming server left in the CRI plugin.
        let v3 = doc.get("version").and_then(toml_edit::Item::as_integer) >= Some(3);
        if v3 {
            doc["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"] =
                toml_edit::value(PAUSE);
            doc["plugins"]["io.containerd.grpc.v1.cri"]["stream_server_port"] =
                toml_edit::value("0");
        }
        let cri = if v3 {
            &mut doc["plugins"]["io.containerd.cri.v1.runtime"]
        } else {
            let cri = &mut doc["plugins"]["io.containerd.grpc.v1.cri"];
            cri["sandbox_image"] = toml_edit::value(PAUSE);
            cri["stream_server_port"] = toml_edit::value("0");
            cri
        };
        cri["disable_apparmor"] = toml_edit::value(true);
        // These machines refuse lowering oom_score_adj (the sandbox's -998 fails in runc's
        // nsexec): clamp to containerd's own, as for rootless or nested nodes.
        cri["restrict_oom_score_adj"] = toml_edit::value(true);
        cri["cni"]["conf_dir"] = p("cni");
        if v3 {
            cri["cni"]["bin_dirs"] =
                toml_edit::value(toml_edit::Array::from_iter([s(&d.join("cni-bin"))]));
        } else {
            cri["cni"]["bin_dir"] = p("cni-bin");
        }
        // runc's state for CRI containers, carried over to the nvidia runtime by configure.
        cri["containerd"]["runtimes"]["runc"]["options"]["Root"] = p("runc");
        // containerd 1.7 and 2.x print their CDI spec directories: where the operator keeps
        // specs elsewhere, containerd is told so too.
        if cri.get("cdi_spec_dirs").is_some() {
            cri["cdi_spec_dirs"] = toml_edit::value(
                config_cdi_dirs(w)
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<toml_edit::Array>(),
            );
        }
        // Kept elsewhere by "config management", config.toml a relative link to it: configure
        // writes through the link.
        edit(&mut doc);
        let managed = d.join("managed/config.toml");
        fs::create_dir_all(managed.parent().unwrap()).unwrap();
        fs::write(&managed, doc.to_string()).unwrap();
        symlink("managed/config.toml", &config).unwrap();
        // Version 2 with `--engine-version 1.7`: the CDI settings nvshim writes when it cannot
        // ask containerd its release; Debian 12's containerd (1.6, no CDI) must still start
        // with them. Version 3 (2.x, CDI on by default): the release as detected.
        let mut configure = Command::new(NVSHIM);
        configure
            .args([
                "runtime",
                "configure",
                "--runtime",
                "containerd",
                "--config",
                s(&config),
                "--backup-dir",
                s(&backup_dir(&config)),
            ])
            .env("NVSHIM_CONFIG", &w.config);
        if !v3 {
            configure.args(["--engine-version", "1.7"]);
        }
        configure.args(configure_args);
        run(&mut configure, Duration::from_secs(30)).expect_ok();
        assert!(fs::symlink_metadata(&config)
            .unwrap()
            .file_type()
            .is_symlink());
        let written = fs::read_to_string(&managed).unwrap();
        assert_eq!(
            written.contains("enable_cdi = true # set by `nvshim runtime configure`"),
            !v3,
            "{written}"
        );
        let dumped = dump(&config);
        let nvidia = &cri_runtime(&dumped)["containerd"]["runtimes"]["nvidia"];
        assert_eq!(
            nvidia["options"]["BinaryName"].as_str(),
            Some(SHIM),
            "config dump: {nvidia:#?}"
        );

        let mut cmd = Command::new("containerd");
        cmd.arg("--config")
            .arg(&config)
            .env("NVSHIM_CONFIG", &w.config);
        let mut daemon = Daemon::spawn("containerd", d, cmd);
        let c = |sock: &Path| {
            run(
                Command::new("ctr").args(["-a", s(sock), "version"]),
                Duration::from_secs(10),
            )
            .ok()
        };
        daemon.wait_until("answering", Duration::from_secs(60), || c(&sock));
        Containerd {
            daemon,
            sock,
            dir: d.to_path_buf(),
        }
    }

    fn log_tail(&self) -> String {
        self.daemon.log_tail()
    }

    fn ctr(&self, ns: &str, args: &[&str]) -> Out {
        run(
            Command::new("ctr")
                .args(["-a", s(&self.sock), "-n", ns])
                .args(args),
            Duration::from_secs(120),
        )
    }

    /// Imports the busybox image (and the pause image for CRI) into namespace `ns`.
    fn import_images(&self, ns: &str) {
        let images = self.dir.join("images");
        fs::create_dir_all(&images).unwrap();
        let layer = busybox_tar(&images);
        let busybox = oci_archive(
            &images,
            &layer,
            IMAGE,
            json!({"Env": [PATH_ENV], "Cmd": ["sh"]}),
        );
        let pause = oci_archive(
            &images,
            &layer,
            PAUSE,
            json!({"Env": [PATH_ENV], "Entrypoint": ["/bin/sleep", "3600"]}),
        );
        for archive in [busybox, pause] {
            self.ctr(ns, &["images", "import", s(&archive)]).expect_ok();
        }
        let list = self.ctr(ns, &["images", "ls", "-q"]).expect_ok();
        for name in [IMAGE, PAUSE] {
            assert!(
                list.stdout.lines().any(|l| l == name),
                "{name} not imported: {list}"
            );
        }
    }
}

/// Whether crun (1.8) can run containers here: not on a hybrid host (v1 controllers plus a v2
/// hierarchy at /sys/fs/cgroup/unified) whose v2 hierarchy still has a controller, as these
/// machines have (hugetlb); crun checks that before anything else.
fn crun_runs_containers_here() -> bool {
    let unified = fs::read_to_string("/sys/fs/cgroup/unified/cgroup.controllers");
    !matches!(unified, Ok(c) if !c.trim().is_empty())
}

#[test]
fn containerd_ctr_runs_gpu_containers_with_runc_and_crun() {
    let _one_engine = serial();
    let w = World::new();
    let d = dir(&w, "ctd");
    let ctd = Containerd::start(&w, &d);
    ctd.import_images("default");
    let script = script(&w);
    let runc_root = d.join("ctr-runc");
    let ctr_run_once = |binary: &Path, env: &str| {
        let id = unique_id("nvshim-ctr");
        ctd.ctr(
            "default",
            &[
                "run",
                "--rm",
                "--runtime",
                "io.containerd.runc.v2",
                "--runc-binary",
                s(binary),
                "--runc-root",
                s(&runc_root),
                "--env",
                env,
                // containerd's default spec has no cgroup mount (CRI and docker add one); the
                // probe reads the container's devices.list through it.
                "--mount",
                "type=cgroup,src=cgroup,dst=/sys/fs/cgroup,options=ro:nosuid:noexec:nodev",
                IMAGE,
                &id,
                "sh",
                "-c",
                &script,
            ],
        )
    };
    // Seen once in a CI dry run on a loaded machine: `ctr run` exited 0 with none of the
    // container's output (ctr relays it through FIFOs it attaches to the task). That is a
    // lost relay, not a container that ran differently, so only that case is tried again,
    // and it is reported; a failure or a wrong view still fails at once.
    let ctr_run = |binary: &Path, env: &str| {
        let mut attempt = 1;
        loop {
            let out = ctr_run_once(binary, env);
            if !out.ok() || out.stdout.contains("PROBE_DONE") || attempt == 3 {
                return out;
            }
            eprintln!("ctr run exited 0 without the container's output (attempt {attempt}); again");
            attempt += 1;
        }
    };

    let what = "ctr run --runc-binary nvshim-runtime --env NVIDIA_VISIBLE_DEVICES=0";
    let r = report(
        &w,
        what,
        &ctr_run(Path::new(SHIM), "NVIDIA_VISIBLE_DEVICES=0"),
    );
    assert_gpus(&w, what, &r, &[w.gpu(0)]);

    // crun as the low-level runtime: a second nvshim config, chosen by a wrapper as the
    // runtime binary (the daemon's environment names the first).
    let crun_config = w.tmp.path().join("nvshim-crun/config.toml");
    w.host
        .write_config(
            &crun_config,
            &format!(
                "hook-path = \"{}\"\nlow-level-runtimes = [\"crun\"]\n",
                hook_path().display()
            ),
        )
        .unwrap();
    let wrapper = d.join("nvshim-runtime-crun");
    fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nNVSHIM_CONFIG='{}' exec '{SHIM}' \"$@\"\n",
            crun_config.display()
        ),
    )
    .unwrap();
    fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755)).unwrap();
    let what = "ctr run (nvshim-runtime over crun) --env NVIDIA_VISIBLE_DEVICES=1";
    let out = ctr_run(&wrapper, "NVIDIA_VISIBLE_DEVICES=1");
    let log = shim_log(&crun_config);
    if crun_runs_containers_here() {
        assert!(out.ok(), "{what}:\n{out}\n--- nvshim.log ---\n{log}");
        let r = ProbeReport::parse(&out.stdout);
        assert_gpus(&w, what, &r, &[w.gpu(1)]);
    } else {
        // crun 1.8 runs no container at all on a hybrid cgroup host whose v2 hierarchy has a
        // controller (these machines: hugetlb), with or without its cgroup manager. What can
        // be checked: nvshim edited the bundle and handed it to crun, which failed on that.
        eprintln!("{what}: crun cannot run containers on this host (hybrid cgroups); checking the hand-over only");
        assert!(
            out.stderr.contains("cgroups in hybrid mode not supported"),
            "{what}: expected crun's hybrid-cgroup error:\n{out}\n--- nvshim.log ---\n{log}"
        );
    }
    assert!(
        log.contains("edited config.json"),
        "nvshim did not edit the bundle:\n{log}"
    );
    assert!(
        log.lines()
            .any(|l| l.contains("exec runtime=") && l.trim_end().ends_with("/crun")),
        "nvshim did not exec crun:\n{log}"
    );

    drop(ctd);
    assert_nothing_mounted_below(w.tmp.path());
}

// ---- containerd's CRI (the kubelet's path) ----------------------------------------------------

mod cri {
    use super::*;
    use k8s_cri::v1::image_service_client::ImageServiceClient;
    use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
    use k8s_cri::v1::*;
    use tonic::transport::{Channel, Endpoint, Uri};

    /// The one-thread runtime a test drives its CRI calls on.
    pub fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// A pod's own user namespace, as the kubelet asks for `hostUsers: false`: ids 0..SIZE
    /// mapped from HOST_ID (tests/e2e/userns.rs's mapping).
    pub fn pod_user_namespace() -> UserNamespace {
        use super::super::userns::{HOST_ID, SIZE};
        let map = vec![IdMapping {
            host_id: HOST_ID,
            container_id: 0,
            length: SIZE,
        }];
        UserNamespace {
            mode: NamespaceMode::Pod as i32,
            uids: map.clone(),
            gids: map,
        }
    }

    pub async fn connect(sock: &Path) -> Channel {
        let sock = sock.to_path_buf();
        Endpoint::try_from("http://[::]:50051")
            .unwrap()
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let sock = sock.clone();
                async move {
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                        tokio::net::UnixStream::connect(sock).await?,
                    ))
                }
            }))
            .await
            .expect("connecting to containerd's CRI socket")
    }

    /// A pod sandbox on the host network with runtime handler `handler`, and what runs in it.
    pub struct Pod {
        pub rt: RuntimeServiceClient<Channel>,
        pub id: String,
        pub config: PodSandboxConfig,
        pub log_dir: PathBuf,
        /// Its containers are privileged (`securityContext.privileged`).
        pub privileged: bool,
        /// Bind mounts (container path, host path) its next containers get, as the kubelet
        /// sends a device plugin's `Mount`s.
        pub mounts: Vec<(String, String)>,
    }

    pub async fn run_pod(channel: Channel, handler: &str, log_dir: &Path) -> Pod {
        run_pod_full(channel, handler, log_dir, None, false).await
    }

    /// [`run_pod`], with the sandbox and every container privileged when `privileged`.
    pub async fn run_pod_with(
        channel: Channel,
        handler: &str,
        log_dir: &Path,
        privileged: bool,
    ) -> Pod {
        run_pod_full(channel, handler, log_dir, None, privileged).await
    }

    /// [`run_pod`], in its own user namespace when `userns` is given: what the kubelet sends
    /// for `hostUsers: false` (mode POD with the pod's mappings, in the sandbox's and each
    /// container's namespace options). Such a pod cannot share the host's network namespace
    /// (the kubelet refuses `hostNetwork` with it): it gets its own, loopback only
    /// ([`super::Containerd::start`]'s CNI config).
    pub async fn run_pod_in(
        channel: Channel,
        handler: &str,
        log_dir: &Path,
        userns: Option<UserNamespace>,
    ) -> Pod {
        run_pod_full(channel, handler, log_dir, userns, false).await
    }

    async fn run_pod_full(
        channel: Channel,
        handler: &str,
        log_dir: &Path,
        userns: Option<UserNamespace>,
        privileged: bool,
    ) -> Pod {
        let mut rt = RuntimeServiceClient::new(channel.clone());
        let version = rt
            .version(VersionRequest::default())
            .await
            .expect("CRI Version");
        // containerd, or CRI-O for tests/e2e/nri.rs under `NVSHIM_CRIO`.
        let name = version.get_ref().runtime_name.clone();
        assert!(
            name == "containerd" || name == "cri-o",
            "CRI runtime {name}"
        );
        // CRI-O: each container its own PID namespace, as the kubelet asks without
        // `shareProcessNamespace`. CRI-O then runs no pause container, whose oom_score_adj
        // (-998) these machines refuse (no CAP_SYS_RESOURCE; containerd's is clamped by
        // `restrict_oom_score_adj`).
        let pid = if name == "cri-o" {
            NamespaceMode::Container
        } else {
            NamespaceMode::Pod
        };
        let mut images = ImageServiceClient::new(channel);
        let listed = images
            .list_images(ListImagesRequest::default())
            .await
            .expect("CRI ListImages")
            .into_inner();
        assert!(
            listed
                .images
                .iter()
                .any(|i| i.repo_tags.iter().any(|t| t == IMAGE)),
            "CRI does not see {IMAGE}: {listed:?}"
        );
        let uid = unique_id("pod");
        let log_dir = log_dir.join(&uid);
        fs::create_dir_all(&log_dir).unwrap();
        let config = PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: "gpu-pod".into(),
                uid: uid.clone(),
                namespace: "nvshim-e2e".into(),
                attempt: 0,
            }),
            // The kubelet sets no hostname for host-network pods (kuberuntime_sandbox.go):
            // there is no UTS namespace to set it in.
            log_directory: s(&log_dir).into(),
            linux: Some(LinuxPodSandboxConfig {
                security_context: Some(LinuxSandboxSecurityContext {
                    privileged,
                    namespace_options: Some(NamespaceOption {
                        // Pod networking is not needed: the host's network namespace.
                        network: if userns.is_some() {
                            NamespaceMode::Pod
                        } else {
                            NamespaceMode::Node
                        } as i32,
                        pid: pid as i32,
                        ipc: NamespaceMode::Pod as i32,
                        userns_options: userns,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let resp = rt
            .run_pod_sandbox(RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: handler.into(),
            })
            .await
            .unwrap_or_else(|e| panic!("RunPodSandbox with handler {handler}: {e}"));
        Pod {
            rt,
            id: resp.into_inner().pod_sandbox_id,
            config,
            log_dir,
            privileged,
            mounts: Vec::new(),
        }
    }

    impl Pod {
        /// Runs one container to completion and returns what it printed to stdout. `devices`:
        /// CRI devices (container path, host path), what the kubelet sends for a device
        /// plugin's `DeviceSpec`s.
        pub async fn run_container(
            &mut self,
            name: &str,
            script: &str,
            envs: &[(&str, &str)],
            annotations: &[(&str, &str)],
            cdi_devices: &[&str],
            devices: &[(&str, &str)],
        ) -> Result<String, String> {
            let created = self
                .create_container(name, script, envs, annotations, cdi_devices, devices)
                .await?;
            self.start_to_end(name, created).await
        }

        /// CRI CreateContainer alone: the container's id.
        pub async fn create_container(
            &mut self,
            name: &str,
            script: &str,
            envs: &[(&str, &str)],
            annotations: &[(&str, &str)],
            cdi_devices: &[&str],
            devices: &[(&str, &str)],
        ) -> Result<String, String> {
            let log_name = format!("{name}.log");
            let pod = self.config.metadata.clone().unwrap_or_default();
            let config = ContainerConfig {
                metadata: Some(ContainerMetadata {
                    name: name.into(),
                    attempt: 0,
                }),
                image: Some(ImageSpec {
                    image: IMAGE.into(),
                    // As the kubelet sends it: CRI-O checks its signature policy against it.
                    user_specified_image: IMAGE.into(),
                    ..Default::default()
                }),
                command: vec!["sh".into(), "-c".into()],
                args: vec![script.into()],
                envs: envs
                    .iter()
                    .map(|(k, v)| KeyValue {
                        key: (*k).into(),
                        value: (*v).into(),
                    })
                    .collect(),
                annotations: annotations
                    .iter()
                    .map(|(k, v)| ((*k).into(), (*v).into()))
                    .collect(),
                // The labels the kubelet gives every container: CRI-O names the container to
                // NRI plugins by `io.kubernetes.container.name`.
                labels: [
                    ("io.kubernetes.container.name", name),
                    ("io.kubernetes.pod.name", &pod.name),
                    ("io.kubernetes.pod.namespace", &pod.namespace),
                    ("io.kubernetes.pod.uid", &pod.uid),
                ]
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
                log_path: log_name.clone(),
                linux: Some(LinuxContainerConfig {
                    // The pod's namespaces, its user namespace among them, as the kubelet
                    // repeats them for each container.
                    security_context: Some(LinuxContainerSecurityContext {
                        privileged: self.privileged,
                        namespace_options: self
                            .config
                            .linux
                            .as_ref()
                            .and_then(|l| l.security_context.as_ref())
                            .and_then(|c| c.namespace_options.clone())
                            .filter(|n| {
                                n.userns_options.is_some() || n.pid != NamespaceMode::Pod as i32
                            }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                mounts: self
                    .mounts
                    .iter()
                    .map(|(container, host)| Mount {
                        container_path: container.clone(),
                        host_path: host.clone(),
                        ..Default::default()
                    })
                    .collect(),
                // What the kubelet sends for DRA claims (CRI `CDI_devices`, Kubernetes 1.28+).
                cdi_devices: cdi_devices
                    .iter()
                    .map(|n| CdiDevice { name: (*n).into() })
                    .collect(),
                devices: devices
                    .iter()
                    .map(|(container, host)| Device {
                        container_path: (*container).into(),
                        host_path: (*host).into(),
                        permissions: "rw".into(),
                    })
                    .collect(),
                ..Default::default()
            };
            Ok(self
                .rt
                .create_container(CreateContainerRequest {
                    pod_sandbox_id: self.id.clone(),
                    config: Some(config),
                    sandbox_config: Some(self.config.clone()),
                })
                .await
                .map_err(|e| format!("CreateContainer: {e}"))?
                .into_inner()
                .container_id)
        }

        /// Starts the created container `created` (named `name`), waits for it to exit and
        /// removes it: what it printed to stdout.
        pub async fn start_to_end(
            &mut self,
            name: &str,
            created: String,
        ) -> Result<String, String> {
            let log_name = format!("{name}.log");
            let started = self
                .rt
                .start_container(StartContainerRequest {
                    container_id: created.clone(),
                })
                .await;
            let result = match started {
                Err(e) => Err(format!("StartContainer: {e}")),
                Ok(_) => self.wait_exited(&created).await,
            };
            let _ = self
                .rt
                .remove_container(RemoveContainerRequest {
                    container_id: created,
                })
                .await;
            let code = result?;
            let log = fs::read_to_string(self.log_dir.join(&log_name)).unwrap_or_default();
            // CRI log lines: `<RFC3339 time> <stream> <P|F> <text>`.
            let stdout: String = log
                .lines()
                .filter_map(|l| {
                    let mut parts = l.splitn(4, ' ');
                    let (_, stream, _, text) = (
                        parts.next()?,
                        parts.next()?,
                        parts.next()?,
                        parts.next().unwrap_or(""),
                    );
                    (stream == "stdout").then(|| format!("{text}\n"))
                })
                .collect();
            if code != 0 {
                return Err(format!("container exited with {code}:\n{log}"));
            }
            Ok(stdout)
        }

        /// CRI StartContainer alone.
        pub async fn start(&mut self, id: &str) -> Result<(), String> {
            self.rt
                .start_container(StartContainerRequest {
                    container_id: id.into(),
                })
                .await
                .map(|_| ())
                .map_err(|e| format!("StartContainer: {e}"))
        }

        /// The container's CRI ContainerStatus.
        pub async fn status(&mut self, id: &str) -> Result<ContainerStatus, String> {
            self.rt
                .container_status(ContainerStatusRequest {
                    container_id: id.into(),
                    verbose: false,
                })
                .await
                .map_err(|e| format!("ContainerStatus: {e}"))?
                .into_inner()
                .status
                .ok_or_else(|| "ContainerStatus without a status".into())
        }

        /// Waits (60 s at most) for the container to exit: its exit code.
        pub async fn wait_exited(&mut self, id: &str) -> Result<i32, String> {
            let start = Instant::now();
            loop {
                let status = self.status(id).await?;
                if status.state == ContainerState::ContainerExited as i32 {
                    return Ok(status.exit_code);
                }
                if start.elapsed() > Duration::from_secs(60) {
                    return Err(format!("container still {:?} after 60 s", status.state));
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }

        pub async fn remove(mut self) {
            let _ = self
                .rt
                .stop_pod_sandbox(StopPodSandboxRequest {
                    pod_sandbox_id: self.id.clone(),
                })
                .await;
            let _ = self
                .rt
                .remove_pod_sandbox(RemovePodSandboxRequest {
                    pod_sandbox_id: self.id.clone(),
                })
                .await;
        }
    }
}

#[test]
fn containerd_cri_runs_gpu_pods_with_runtime_handler_nvidia() {
    let _one_engine = serial();
    let w = World::builder().spec_dirs(SpecDirs::Run).build();
    let cdi_dir = &w.run_cdi;
    write_cdi_spec(&w, cdi_dir);
    let d = dir(&w, "cri");
    let ctd = Containerd::start(&w, &d);
    ctd.import_images("k8s.io");
    let script = script(&w);

    let tokio = cri::runtime();
    tokio.block_on(async {
        let channel = cri::connect(&ctd.sock).await;
        let mut pod = cri::run_pod(channel, "nvidia", &d.join("pods")).await;

        // A container's probe report, or a failure with both logs.
        let report = |what: &str, out: Result<String, String>| {
            let stdout = out.unwrap_or_else(|e| {
                panic!(
                    "{what}: {e}\n--- nvshim.log ---\n{}\n--- containerd ---\n{}",
                    w.shim_log(),
                    ctd.log_tail()
                )
            });
            ProbeReport::parse(&stdout)
        };

        let what = "CRI container, handler nvidia, NVIDIA_VISIBLE_DEVICES=1";
        let out = pod
            .run_container(
                "env",
                &script,
                &[("NVIDIA_VISIBLE_DEVICES", "1")],
                &[],
                &[],
                &[],
            )
            .await;
        assert_gpus(&w, what, &report(what, out), &[w.gpu(1)]);

        let what = "CRI container, handler nvidia, annotation cdi.k8s.io/gpu: nvidia.com/gpu=0";
        let annotations = [("cdi.k8s.io/nvshim-e2e", "nvidia.com/gpu=0")];
        let out = pod
            .run_container("cdi", &script, &[], &annotations, &[], &[])
            .await;
        assert_gpus(&w, what, &report(what, out), &[w.gpu(0)]);

        // CRI `CDI_devices` (DRA claims): containerd 1.7 (CDI turned on by configure) and 2.x
        // resolve them; 1.6 has no CDI and drops the field.
        if containerd_version() >= (1, 7) {
            let what = "CRI container, handler nvidia, CDI_devices nvidia.com/gpu=1";
            let out = pod
                .run_container("cdi-devices", &script, &[], &[], &["nvidia.com/gpu=1"], &[])
                .await;
            assert_gpus(&w, what, &report(what, out), &[w.gpu(1)]);
        }

        pod.remove().await;
    });
    drop(ctd);
    assert_nothing_mounted_below(w.tmp.path());
}

/// CNI for a user-namespaced pod, which has its own network namespace (containerd needs an
/// address for it): loopback and a point-to-point link from Debian's CNI plugins, the config in
/// `d`/cni and the plugins in `d`/cni-bin, where [`Containerd::start`] points containerd.
pub(crate) fn ptp_cni(d: &Path) {
    let (cni, bins) = (d.join("cni"), d.join("cni-bin"));
    fs::create_dir_all(&cni).unwrap();
    fs::create_dir_all(&bins).unwrap();
    fs::write(
        cni.join("10-nvshim-e2e.conflist"),
        serde_json::to_vec_pretty(&json!({
            "cniVersion": "1.0.0",
            "name": "nvshim-e2e",
            "plugins": [{
                "type": "ptp",
                "ipMasq": false,
                "ipam": {
                    "type": "host-local",
                    "subnet": "10.254.254.0/24",
                    "dataDir": s(&d.join("cni-ipam"))
                }
            }, {"type": "loopback"}]
        }))
        .unwrap(),
    )
    .unwrap();
    for plugin in ["ptp", "host-local", "loopback"] {
        symlink(Path::new("/usr/lib/cni").join(plugin), bins.join(plugin)).unwrap();
    }
}

/// A user-namespaced pod (`hostUsers: false`: CRI `userns_options`, mode POD, container 0 →
/// host 100000) with runtime handler `nvidia` gets its GPU by env, by CDI annotation and by
/// `CDI_devices` (containerd's own CDI), checked from inside as in [`super::userns`]. containerd
/// 2.0 is the first with user-namespaced pods; an older one is skipped. The pod has its own
/// network namespace, loopback and a point-to-point link from Debian's CNI plugins
/// (containerd needs an address for the pod).
#[test]
fn containerd_cri_runs_gpu_pods_in_a_user_namespace() {
    if containerd_version() < (2, 0) {
        eprintln!(
            "skipped: containerd {:?} has no user-namespaced pods",
            containerd_version()
        );
        return;
    }
    use super::userns::{problems, script};
    let _one_engine = serial();
    let w = World::builder().spec_dirs(SpecDirs::Run).build();
    // runc init and the hook run as host uid 100000: the bundles and the fake host below the
    // test's dir must be reachable, as `/run/containerd` is.
    fs::set_permissions(w.tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
    // nvshim's spec, libraries and fix-ups hook included: containerd applies it itself for
    // the annotation and `CDI_devices`.
    w.generate();
    let d = dir(&w, "cri");
    ptp_cni(&d);
    let ctd = Containerd::start(&w, &d);
    ctd.import_images("k8s.io");
    let script = script();
    let userns = cri::pod_user_namespace();

    let tokio = cri::runtime();
    tokio.block_on(async {
        let channel = cri::connect(&ctd.sock).await;
        let mut pod = cri::run_pod_in(channel, "nvidia", &d.join("pods"), Some(userns)).await;
        let check = |what: &str, out: Result<String, String>, gpu: &FakeGpu| {
            let stdout = out.unwrap_or_else(|e| {
                panic!(
                    "{what}: {e}\n--- nvshim.log ---\n{}\n--- containerd ---\n{}",
                    w.shim_log(),
                    ctd.log_tail()
                )
            });
            let report = ProbeReport::parse(&stdout);
            assert_no_problems(what, &problems(&w, &report, gpu), &report);
        };

        let what = "user-namespaced pod, handler nvidia, NVIDIA_VISIBLE_DEVICES=1";
        let env = [("NVIDIA_VISIBLE_DEVICES", "1")];
        let out = pod.run_container("env", &script, &env, &[], &[], &[]).await;
        check(what, out, w.gpu(1));

        let what = "user-namespaced pod, handler nvidia, annotation nvidia.com/gpu=0";
        let annotations = [("cdi.k8s.io/nvshim-e2e", "nvidia.com/gpu=0")];
        let out = pod
            .run_container("cdi", &script, &[], &annotations, &[], &[])
            .await;
        check(what, out, w.gpu(0));

        let what = "user-namespaced pod, handler nvidia, CDI_devices nvidia.com/gpu=1";
        let out = pod
            .run_container("cdi-devices", &script, &[], &[], &["nvidia.com/gpu=1"], &[])
            .await;
        check(what, out, w.gpu(1));

        pod.remove().await;
    });
    drop(ctd);
    assert_nothing_mounted_below(w.tmp.path());
}

/// Through containerd's CRI, as the kubelet drives it, with the installer's policy
/// (`accept-envvar-unprivileged = "allocation-backed"`): an unprivileged container whose
/// `NVIDIA_VISIBLE_DEVICES` nothing backs fails with nvshim's error in the CRI's answer (what
/// `kubectl describe pod` shows), and the same variable next to the GPU's node as a device
/// plugin's `DeviceSpec` (CRI `devices`, `PASS_DEVICE_SPECS=true`) gets that GPU; widening it
/// to `all` fails. With the kubelet's device checkpoint naming the container, the variable
/// alone (the device plugin at its defaults) gets its GPU.
#[test]
fn containerd_cri_refused_request_fails_the_container_with_the_reason() {
    let _one_engine = serial();
    let w = World::builder()
        .spec_dirs(SpecDirs::Run)
        .config("accept-envvar-unprivileged = \"allocation-backed\"\n")
        .build();
    let d = dir(&w, "cri-refused");
    let ctd = Containerd::start(&w, &d);
    ctd.import_images("k8s.io");
    let script = script(&w);
    let gpu = w.gpu(1);
    let node = w.host.dev_root().join(format!("dev/nvidia{}", gpu.minor));
    let container_node = format!("/dev/nvidia{}", gpu.minor);
    let tokio = cri::runtime();
    tokio.block_on(async {
        let channel = cri::connect(&ctd.sock).await;
        let mut pod = cri::run_pod(channel, "nvidia", &d.join("pods")).await;
        let logs = || {
            format!(
                "--- nvshim.log ---\n{}\n--- containerd ---\n{}",
                w.shim_log(),
                ctd.log_tail()
            )
        };
        for (name, env) in [("bare", gpu.uuid.as_str()), ("wide", "all")] {
            let devices: &[(&str, &str)] = if name == "wide" {
                &[(&container_node, s(&node))]
            } else {
                &[]
            };
            let err = pod
                .run_container(
                    name,
                    &script,
                    &[("NVIDIA_VISIBLE_DEVICES", env)],
                    &[],
                    &[],
                    devices,
                )
                .await
                .expect_err("the container should not have run");
            eprintln!("{name}: {err}");
            for needle in [
                "nvshim:",
                "NVIDIA_VISIBLE_DEVICES",
                "is refused",
                "allocation-backed",
            ] {
                assert!(
                    err.contains(needle),
                    "{name}: {needle:?} not in {err}\n{}",
                    logs()
                );
            }
        }
        let what = "CRI container, NVIDIA_VISIBLE_DEVICES=<uuid> beside its DeviceSpec";
        let out = pod
            .run_container(
                "backed",
                &script,
                &[("NVIDIA_VISIBLE_DEVICES", &gpu.uuid)],
                &[],
                &[],
                &[(&container_node, s(&node))],
            )
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}\n{}", logs()));
        assert_gpus(&w, what, &ProbeReport::parse(&out), &[gpu]);

        // NVIDIA's device plugin at its defaults (envvar strategy): the kubelet's checkpoint,
        // keyed by the pod UID and container name that containerd writes into config.json.
        let checkpoint = d.join("kubelet_internal_checkpoint");
        let uid = pod.config.metadata.as_ref().unwrap().uid.clone();
        let doc = json!({"Data": {"PodDeviceEntries": [{
            "PodUID": uid, "ContainerName": "ckpt", "ResourceName": "nvidia.com/gpu",
            "DeviceIDs": {"0": [gpu.uuid]}, "AllocResp": "CgA="
        }], "RegisteredDevices": {}}, "Checksum": 1});
        fs::write(&checkpoint, doc.to_string()).unwrap();
        fs::set_permissions(&checkpoint, fs::Permissions::from_mode(0o600)).unwrap();
        w.configure(&format!(
            "accept-envvar-unprivileged = \"allocation-backed\"\nkubelet-device-checkpoint = \"{}\"\n",
            checkpoint.display()
        ));
        // "ckpt" is the container the checkpoint names; "other" is not.
        for name in ["ckpt", "other"] {
            let what = format!("CRI container {name}, NVIDIA_VISIBLE_DEVICES=<uuid>, checkpoint");
            let env = [("NVIDIA_VISIBLE_DEVICES", gpu.uuid.as_str())];
            let out = pod.run_container(name, &script, &env, &[], &[], &[]).await;
            match (name, out) {
                ("ckpt", Ok(out)) => assert_gpus(&w, &what, &ProbeReport::parse(&out), &[gpu]),
                ("other", Err(err)) => {
                    assert!(err.contains("is refused"), "{what}: {err}\n{}", logs())
                }
                (_, out) => panic!("{what}: {out:?}\n{}", logs()),
            }
        }
        pod.remove().await;
    });
    drop(ctd);
    assert_nothing_mounted_below(w.tmp.path());
}

// ---- the Kubernetes installer image -------------------------------------------------------------

/// The image's filesystem, unpacked from an OCI archive (its single layer).
fn unpack_oci_image(archive: &Path, work: &Path, into: &Path) {
    fs::create_dir_all(work).unwrap();
    fs::create_dir_all(into).unwrap();
    run(
        Command::new("tar").args(["-C", s(work), "-xf", s(archive)]),
        Duration::from_secs(120),
    )
    .expect_ok();
    let blob = |digest: &str| {
        work.join("blobs/sha256")
            .join(digest.trim_start_matches("sha256:"))
    };
    let index: Value = serde_json::from_slice(&fs::read(work.join("index.json")).unwrap()).unwrap();
    let manifest: Value = serde_json::from_slice(
        &fs::read(blob(index["manifests"][0]["digest"].as_str().unwrap())).unwrap(),
    )
    .unwrap();
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1);
    let layer = blob(layers[0]["digest"].as_str().unwrap());
    run(
        Command::new("tar").args(["-C", s(into), "-xf", s(&layer)]),
        Duration::from_secs(120),
    )
    .expect_ok();
}

/// The installer image (scripts/build-installer-image.sh, here from the debug binaries) run by
/// containerd as the DaemonSet runs it, against a stand-in host root: `run` installs the
/// binaries and the config and registers the runtime with host paths; SIGTERM (what deleting
/// the DaemonSet sends) undoes all of it.
#[test]
fn installer_image_installs_and_uninstalls_on_a_host_root() {
    let _one_engine = serial();
    let w = World::new();
    let d = dir(&w, "inst");
    let bin_dir = Path::new(SHIM).parent().unwrap();
    hook_path();
    let image = d.join("installer.oci.tar");
    run(
        Command::new(root().join("scripts/build-installer-image.sh")).args([
            "-b",
            s(bin_dir),
            "-o",
            s(&image),
        ]),
        Duration::from_secs(300),
    )
    .expect_ok();

    // The stand-in host: the image's own filesystem (the glibc and shell that nvshim needs when
    // the installer chroots into the host), without nvshim's config, plus a containerd config.
    let host = d.join("hostroot");
    unpack_oci_image(&image, &d.join("oci"), &host);
    fs::remove_dir_all(host.join("etc/nvshim")).unwrap();
    let containerd_config = host.join("etc/containerd/config.toml");
    fs::create_dir_all(containerd_config.parent().unwrap()).unwrap();
    let original = run(
        Command::new("containerd").args(["config", "default"]),
        Duration::from_secs(30),
    )
    .expect_ok()
    .stdout;
    fs::write(&containerd_config, &original).unwrap();

    let ctd = Containerd::start(&w, &dir(&w, "inst-ctd"));
    ctd.ctr("default", &["images", "import", s(&image)])
        .expect_ok();
    let name = format!(
        "docker.io/library/nvshim-installer:{}",
        env!("CARGO_PKG_VERSION")
    );
    let id = unique_id("installer");
    let runc_root = d.join("runc");
    let mount = format!(
        "type=bind,src={},dst=/host,options=rbind:rw",
        host.display()
    );
    ctd.ctr(
        "default",
        &[
            "run",
            "-d",
            "--runc-root",
            s(&runc_root),
            "--mount",
            &mount,
            "--env",
            "RESTART_CONTAINERD=none",
            "--env",
            "CREATE_DEV_CHAR_SYMLINKS=false",
            &name,
            &id,
        ],
    )
    .expect_ok();
    let ready = || {
        ctd.ctr(
            "default",
            &[
                "tasks",
                "exec",
                "--exec-id",
                &unique_id("probe"),
                &id,
                "test",
                "-e",
                "/tmp/nvshim-ready",
            ],
        )
        .ok()
    };
    let start = Instant::now();
    while !ready() {
        let tasks = ctd.ctr("default", &["tasks", "ls"]);
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "installer not ready:\n{tasks}\n{}",
            ctd.log_tail()
        );
        sleep(Duration::from_millis(300));
    }

    let bin = host.join("usr/local/nvshim/bin");
    // nvshim-nri: `cargo build --workspace` built it, so the image has it.
    for b in ["nvshim", "nvshim-runtime", "nvshim-hook", "nvshim-nri"] {
        assert!(bin.join(b).is_file(), "{b} not installed");
    }
    assert_eq!(
        fs::read_link(bin.join("nvidia-cdi-hook")).unwrap(),
        PathBuf::from("nvshim-hook")
    );
    assert_eq!(
        fs::read_to_string(host.join("etc/nvshim/config.toml")).unwrap(),
        fs::read_to_string(root().join("packaging/config.toml")).unwrap()
    );
    // containerd 2.x: the runtime is in the drop-in beside config.toml (its `imports` name
    // the host's path, so it is read here rather than dumped).
    let drop_in = host.join("etc/containerd/conf.d/99-nvshim.toml");
    let configured: toml::Table = toml::from_str(
        &fs::read_to_string(if drop_in.exists() {
            &drop_in
        } else {
            &containerd_config
        })
        .unwrap(),
    )
    .unwrap();
    let nvidia = &cri_runtime(&configured)["containerd"]["runtimes"]["nvidia"];
    assert_eq!(
        nvidia["options"]["BinaryName"].as_str(),
        Some("/usr/local/nvshim/bin/nvshim-runtime"),
        "the host's path, not the container's"
    );

    ctd.ctr("default", &["tasks", "kill", "-s", "SIGTERM", &id])
        .expect_ok();
    let start = Instant::now();
    loop {
        let tasks = ctd.ctr("default", &["tasks", "ls"]).expect_ok();
        if tasks
            .stdout
            .lines()
            .any(|l| l.starts_with(&id) && l.contains("STOPPED"))
        {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "installer did not stop:\n{tasks}"
        );
        sleep(Duration::from_millis(300));
    }
    assert_eq!(
        fs::read_to_string(&containerd_config).unwrap(),
        original,
        "containerd's config restored"
    );
    assert!(!host.join("usr/local/nvshim").exists(), "binaries removed");
    assert!(!host.join("etc/nvshim").exists(), "config removed");
    ctd.ctr("default", &["tasks", "rm", &id]).expect_ok();
    ctd.ctr("default", &["containers", "rm", &id]).expect_ok();
    drop(ctd);
    assert_nothing_mounted_below(w.tmp.path());
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The NRI plugin (nvshim-nri) with containerd's CRI and its default runc handler.
#[path = "nri.rs"]
mod nri;
