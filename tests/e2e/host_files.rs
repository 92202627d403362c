//! Files nvshim reads and writes on the host that are not regular files: a FIFO, a device or a
//! huge file at each path class (nvshim's config, an engine's config, a CDI spec in a spec
//! directory, `cdi refresh`'s and `cdi generate`'s output, a bundle's config.json) ends in a
//! clear error or a skip naming the path, never in a process that blocks (the systemd unit runs
//! `cdi refresh` every 30 s) or reads forever. Each command runs under [`finishes`], which
//! turns a hang into a failure. A symlinked node spec stays a symlink after a refresh, as
//! engine configs do. A `cache-dir` below a directory others can write is not used.

use std::fs;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use nix::sys::stat::Mode;

use super::common::SHIM;
use super::world::{SpecDirs, World};

/// Runs `cmd` to its end; one still running after 60 s is killed and the test fails (a
/// blocked open of a FIFO never ends by itself).
#[track_caller]
fn finishes(mut cmd: Command) -> Output {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            panic!("{cmd:?} did not finish (blocked on a special file?)");
        }
    }
}

fn mkfifo(path: &Path) {
    nix::unistd::mkfifo(path, Mode::from_bits_truncate(0o644)).unwrap();
}

fn is_fifo(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_fifo())
}

/// Fails with one error naming `path` and `what` (`a FIFO`, `a device`, `larger than`).
#[track_caller]
fn refused(out: &Output, path: &Path, what: &str) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "should fail: {out:?}");
    assert!(
        stderr.contains(&path.display().to_string()) && stderr.contains(what),
        "{stderr}"
    );
    stderr
}

/// `nvshim-runtime create` of the bundle in `dir` with `config` as nvshim's config.
fn create(w: &World, dir: &Path, config: &Path) -> Command {
    let mut cmd = Command::new(SHIM);
    cmd.arg("--root")
        .arg(w.tmp.path().join("state"))
        .args(["create", "--bundle"])
        .arg(dir)
        .arg(format!(
            "nvshim-host-files-{}",
            nvshim_testsupport::unique_id("c")
        ))
        .env("NVSHIM_CONFIG", config);
    cmd
}

fn world() -> World {
    World::builder().spec_dirs(SpecDirs::EtcAndRun).build()
}

#[test]
fn nvshim_config_that_is_a_fifo_a_device_or_huge_is_refused() {
    let w = world();
    let fifo = w.tmp.path().join("config-fifo.toml");
    mkfifo(&fifo);
    let huge = w.tmp.path().join("huge.toml");
    fs::File::create(&huge)
        .unwrap()
        .set_len(nvshim::hostfile::CONFIG_LIMIT + 1)
        .unwrap();
    for (path, what) in [
        (fifo.as_path(), "a FIFO"),
        (Path::new("/dev/zero"), "a device"),
        (huge.as_path(), "larger than"),
    ] {
        // `nvshim config`, and a create through nvshim-runtime (which reads it first).
        let mut cmd = w.nvshim_command(&["config"]);
        cmd.env("NVSHIM_CONFIG", path);
        refused(&finishes(cmd), path, what);
        let bundle = w.gpu_bundle(&format!("b-{}", what.replace(' ', "-")), "0");
        refused(&finishes(create(&w, bundle.dir(), path)), path, what);
    }
    // doctor reports it as a finding and goes on.
    let mut cmd = w.nvshim_command(&["doctor"]);
    cmd.env("NVSHIM_CONFIG", &fifo);
    let out = finishes(cmd);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("a FIFO"), "{stdout}");
}

#[test]
fn engine_configs_that_are_fifos_are_refused_and_kept() {
    let w = world();
    let run = |engine: &str, verb: &str, config: &Path, drop_in: Option<&Path>| {
        let mut args = vec!["runtime", verb, "--runtime", engine];
        args.extend(["--config", config.to_str().unwrap()]);
        if let Some(d) = drop_in {
            args.extend(["--drop-in-config", d.to_str().unwrap()]);
        }
        finishes(w.nvshim_command(&args))
    };
    for (engine, name) in [
        ("docker", "daemon.json"),
        ("containerd", "config.toml"),
        ("crio", "crio.conf"),
    ] {
        let dir = w.tmp.path().join(engine);
        fs::create_dir_all(&dir).unwrap();
        let config = dir.join(name);
        mkfifo(&config);
        // CRI-O's unconfigure reads only its drop-in.
        let verbs: &[&str] = match engine {
            "crio" => &["configure"],
            _ => &["configure", "unconfigure"],
        };
        for verb in verbs {
            refused(&run(engine, verb, &config, None), &config, "a FIFO");
            assert!(is_fifo(&config), "{engine} {verb}: the FIFO was replaced");
        }
    }
    // CRI-O's drop-in, and containerd's, as FIFOs beside a regular main config.
    for (engine, main) in [("crio", "crio.conf"), ("containerd", "config.toml")] {
        let dir = w.tmp.path().join(format!("{engine}-drop-in"));
        fs::create_dir_all(dir.join("conf.d")).unwrap();
        let config = dir.join(main);
        let fifo = dir.join("conf.d/99-nvidia.toml");
        // containerd writes a drop-in only for a config with `imports`.
        let text = match engine {
            "containerd" => format!(
                "version = 2\nimports = [{:?}]\n",
                fifo.display().to_string()
            ),
            _ => String::new(),
        };
        fs::write(&config, text).unwrap();
        mkfifo(&fifo);
        for verb in ["configure", "unconfigure"] {
            refused(&run(engine, verb, &config, Some(&fifo)), &fifo, "a FIFO");
            assert!(is_fifo(&fifo), "{engine} {verb}: the FIFO was replaced");
        }
    }
}

#[test]
fn a_fifo_spec_in_a_spec_dir_is_skipped_by_list_and_named_by_validate() {
    let w = world();
    w.generate();
    let fifo = w.etc_cdi.join("a-fifo.yaml");
    mkfifo(&fifo);
    let out = finishes(w.nvshim_command(&["cdi", "list"]));
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(all.contains("nvidia.com/gpu=0"), "{all}");
    assert!(
        all.contains("a-fifo.yaml") && all.contains("a FIFO"),
        "{all}"
    );
    let out = finishes(w.nvshim_command(&["cdi", "validate", fifo.to_str().unwrap()]));
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{all}");
    assert!(all.contains("a FIFO"), "{all}");
}

#[test]
fn refresh_and_generate_refuse_a_fifo_or_device_at_their_output() {
    let w = world();
    fs::create_dir_all(&w.run_cdi).unwrap();
    let fifo = w.run_cdi.join("nvidia.yaml");
    mkfifo(&fifo);
    for sub in ["refresh", "generate"] {
        let out = finishes(w.nvshim_command(&["cdi", sub, "--output", fifo.to_str().unwrap()]));
        refused(&out, &fifo, "a FIFO");
        assert!(is_fifo(&fifo), "{sub} replaced the FIFO");
    }
    // A link to a FIFO, and a device: refused the same way, the device untouched.
    let link = w.run_cdi.join("linked.yaml");
    std::os::unix::fs::symlink(&fifo, &link).unwrap();
    let out = finishes(w.nvshim_command(&["cdi", "refresh", "--output", link.to_str().unwrap()]));
    refused(&out, &link, "a FIFO");
    let out = finishes(w.nvshim_command(&["cdi", "generate", "--output", "/dev/null"]));
    refused(&out, Path::new("/dev/null"), "a device");
    assert!(fs::metadata("/dev/null")
        .unwrap()
        .file_type()
        .is_char_device());
}

#[test]
fn a_symlinked_node_spec_stays_a_symlink_after_refresh() {
    let w = world();
    fs::create_dir_all(&w.run_cdi).unwrap();
    let real_dir = w.tmp.path().join("managed");
    fs::create_dir_all(&real_dir).unwrap();
    let real = real_dir.join("nvidia.yaml");
    fs::write(
        &real,
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\n",
    )
    .unwrap();
    let link = w.run_cdi.join("nvidia.yaml");
    // Relative, as config management often links.
    std::os::unix::fs::symlink("../managed/nvidia.yaml", &link).unwrap();
    for extra in [&[][..], &["--force"][..]] {
        let mut args = vec!["cdi", "refresh", "--output", link.to_str().unwrap()];
        args.extend_from_slice(extra);
        let out = finishes(w.nvshim_command(&args));
        assert!(out.status.success(), "{out:?}");
        assert!(
            fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink(),
            "the link was replaced by a file"
        );
        let spec = nvshim::cdi::spec::read_file(&real).unwrap();
        assert!(
            spec.devices.iter().any(|d| d.name == "0"),
            "the target did not get the spec"
        );
    }
    // A dangling link: its target is created, the link kept.
    fs::remove_file(&real).unwrap();
    let out = finishes(w.nvshim_command(&["cdi", "generate", "--output", link.to_str().unwrap()]));
    assert!(out.status.success(), "{out:?}");
    assert!(fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(real.is_file());
}

#[test]
fn a_bundle_config_json_that_is_a_fifo_fails_the_create() {
    let w = world();
    let bundle = w.gpu_bundle("fifo-config", "0");
    let config_json = bundle.dir().join("config.json");
    fs::remove_file(&config_json).unwrap();
    mkfifo(&config_json);
    let cmd = create(&w, bundle.dir(), &w.config);
    refused(&finishes(cmd), &config_json, "a FIFO");
    assert!(is_fifo(&config_json));
}

/// A `cache-dir` another user could write above (a world-writable parent, a parent of another
/// owner) is not used: the container still gets its GPU through the CDI spec, nothing is
/// written there, and the log says once why. The same world with a root-owned 0755 parent
/// writes the CDI index there (what shows the check is the only difference).
#[test]
fn a_cache_dir_others_could_write_is_not_used() {
    use std::os::unix::fs::PermissionsExt;
    let w = world();
    w.generate();
    let parent = w.tmp.path().join("shared");
    fs::create_dir_all(&parent).unwrap();
    let cache = parent.join("cache");
    for (case, mode, owner) in [
        ("world-writable", 0o777, 0),
        ("group-writable", 0o775, 0),
        ("another user's", 0o755, 65534),
        ("root's 0755", 0o755, 0),
    ] {
        let _ = fs::remove_dir_all(&cache);
        fs::set_permissions(&parent, fs::Permissions::from_mode(mode)).unwrap();
        std::os::unix::fs::chown(&parent, Some(owner), Some(owner)).unwrap();
        w.configure(&format!("cache-dir = {:?}\n", cache.display().to_string()));
        let _ = fs::remove_file(w.config.with_file_name("nvshim.log"));
        let bundle = w.probe_bundle(&format!("cache-{owner}-{mode:o}"), &[]);
        bundle
            .edit(|c| {
                c["annotations"] = serde_json::json!({"cdi.k8s.io/e2e": "nvidia.com/gpu=0"});
                Ok(())
            })
            .unwrap();
        let r = w.run(&bundle);
        let problems = r.gpu_problems(&w.host, &[w.gpu(0)]);
        assert!(problems.is_empty(), "{case}: {problems:?}");
        let log = w.shim_log();
        let used = cache.exists() && fs::read_dir(&cache).unwrap().next().is_some();
        if case == "root's 0755" {
            assert!(used, "{case}: no index written");
            assert!(!log.contains("caches off"), "{log}");
        } else {
            assert!(!used, "{case}: the cache dir was used");
            assert_eq!(log.matches("caches off").count(), 1, "{case}: {log}");
            assert!(log.contains(&parent.display().to_string()), "{log}");
        }
    }
}
