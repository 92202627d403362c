//! The one `World` every area's tests build: a temp dir holding a fake GPU host, the nvshim
//! config for it, optionally CDI spec dirs, and whatever the test adds (bundles, runc state,
//! engine configs). Everything goes when it drops, so tests stay independent and run in
//! parallel. What only one area needs stays in that area, as functions taking a `&World`.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::PathBuf;
use std::process::{Command, Output};

use nvshim_fake_nvml::Topology;
use nvshim_testsupport::{
    unique_id, Bundle, FakeGpu, FakeHost, FakeHostSpec, ProbeReport, ProbeSpec, RunOutput, Runtime,
};
use tempfile::TempDir;

use super::common::{fake_nvml, hook_path, shim_at, shim_log, NVSHIM, SHIM};

/// The CDI spec dirs a world's nvshim config names, in priority order.
pub enum SpecDirs {
    None,
    /// `run-cdi` alone (the `/var/run/cdi` role).
    Run,
    /// `etc-cdi` (the `/etc/cdi` role) below `run-cdi`.
    EtcAndRun,
}

pub struct World {
    pub tmp: TempDir,
    pub host: FakeHost,
    /// `<tmp>/nvshim/config.toml`; nvshim's log goes beside it.
    pub config: PathBuf,
    /// `<tmp>/etc-cdi`, named in the config with [`SpecDirs::EtcAndRun`].
    pub etc_cdi: PathBuf,
    /// `<tmp>/run-cdi`, where generated specs go.
    pub run_cdi: PathBuf,
    /// Variables every [`World::nvshim_command`] gets (diagnostics: an empty `PATH`, so that no
    /// engine installed on the machine is detected, and the fake NVML's topology).
    pub env: Vec<(String, PathBuf)>,
    /// Which spec dirs [`World::configure`] names.
    spec_dirs: SpecDirs,
}

/// How to build a [`World`]: two GPUs, no spec dirs, no extra config unless told.
pub struct Builder {
    spec: FakeHostSpec,
    split: bool,
    spec_dirs: SpecDirs,
    make_spec_dirs: bool,
    config: String,
}

impl Builder {
    pub fn gpus(mut self, n: usize) -> Builder {
        self.spec = FakeHostSpec::with_gpus(n);
        self
    }

    pub fn spec(mut self, spec: FakeHostSpec) -> Builder {
        self.spec = spec;
        self
    }

    /// The GPU Operator's layout: the driver in `<tmp>/run/nvidia/driver`, `dev/` and `proc/`
    /// in `<tmp>/host`.
    pub fn split(mut self) -> Builder {
        self.split = true;
        self
    }

    pub fn spec_dirs(mut self, dirs: SpecDirs) -> Builder {
        self.spec_dirs = dirs;
        self
    }

    /// Names the spec dirs in the config without making them, as on a host with no specs yet.
    pub fn spec_dirs_missing(mut self) -> Builder {
        self.make_spec_dirs = false;
        self
    }

    /// TOML appended to the config ([`World::configure`]).
    pub fn config(mut self, extra_toml: &str) -> Builder {
        self.config = extra_toml.to_string();
        self
    }

    pub fn build(self) -> World {
        // Short prefix: the engines' unix socket paths below it must stay under 108 bytes.
        let tmp = tempfile::Builder::new()
            .prefix("nvshim-e2e-")
            .tempdir()
            .unwrap();
        let d = tmp.path();
        let host = if self.split {
            FakeHost::build_split(&d.join("run/nvidia/driver"), &d.join("host"), &self.spec)
        } else {
            FakeHost::build(&d.join("host"), &self.spec)
        }
        .unwrap();
        let w = World {
            config: d.join("nvshim/config.toml"),
            etc_cdi: d.join("etc-cdi"),
            run_cdi: d.join("run-cdi"),
            env: Vec::new(),
            spec_dirs: self.spec_dirs,
            host,
            tmp,
        };
        if self.make_spec_dirs {
            for dir in w.spec_dir_paths() {
                fs::create_dir_all(dir).unwrap();
            }
        }
        w.configure(&self.config);
        w
    }
}

/// Creates every bundle at once, each through its own runtime (a `Runtime` is not shared
/// between threads), all released by one barrier; `meanwhile` runs on this thread as they
/// start. Each outcome with its container id (`<name>-<k>`) and runtime, in the bundles' order.
pub fn create_at_once<'b>(
    bundles: impl IntoIterator<Item = &'b Bundle>,
    runtimes: Vec<Runtime>,
    name: &str,
    meanwhile: impl FnOnce(),
) -> Vec<(RunOutput, String, Runtime)> {
    let bundles: Vec<&Bundle> = bundles.into_iter().collect();
    let barrier = std::sync::Barrier::new(bundles.len() + 1);
    std::thread::scope(|s| {
        let handles: Vec<_> = bundles
            .into_iter()
            .zip(runtimes)
            .enumerate()
            .map(|(k, (b, rt))| {
                let barrier = &barrier;
                s.spawn(move || {
                    let id = unique_id(&format!("{name}-{k:02}"));
                    barrier.wait();
                    (rt.create(b, &id).unwrap(), id, rt)
                })
            })
            .collect();
        barrier.wait();
        meanwhile();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

impl World {
    pub fn builder() -> Builder {
        Builder {
            spec: FakeHostSpec::with_gpus(2),
            split: false,
            spec_dirs: SpecDirs::None,
            make_spec_dirs: true,
            config: String::new(),
        }
    }

    /// Two GPUs, a config naming the built hook, no spec dirs.
    pub fn new() -> World {
        World::builder().build()
    }

    fn spec_dir_paths(&self) -> Vec<&PathBuf> {
        match self.spec_dirs {
            SpecDirs::None => vec![],
            SpecDirs::Run => vec![&self.run_cdi],
            SpecDirs::EtcAndRun => vec![&self.etc_cdi, &self.run_cdi],
        }
    }

    /// (Re)writes the nvshim config: the host's roots, the built hook (unless `extra_toml`
    /// names one), the spec dirs, then `extra_toml`.
    pub fn configure(&self, extra_toml: &str) {
        let mut text = String::new();
        if !extra_toml.contains("hook-path") {
            text += &format!("hook-path = {:?}\n", hook_path().display().to_string());
        }
        let dirs = self.spec_dir_paths();
        if !dirs.is_empty() {
            let dirs: Vec<String> = dirs
                .iter()
                .map(|d| format!("{:?}", d.display().to_string()))
                .collect();
            text += &format!("cdi-spec-dirs = [{}]\n", dirs.join(", "));
        }
        text += extra_toml;
        self.host.write_config(&self.config, &text).unwrap();
    }

    /// The config's `cache-dir` (beside the config), and the names of its files that start
    /// with `prefix` (`gpus-`, `nvml-`, `driver-files-`).
    pub fn cache_files(&self, prefix: &str) -> (PathBuf, Vec<String>) {
        let cache = self.config.parent().unwrap().join("cache");
        let names = fs::read_dir(&cache)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(prefix))
            .collect();
        (cache, names)
    }

    /// The GPU `NVIDIA_VISIBLE_DEVICES=<index>` selects.
    pub fn gpu(&self, index: usize) -> &FakeGpu {
        self.host.gpu_at_index(index).unwrap()
    }

    /// nvshim-runtime with this world's config and a fresh runc state dir.
    pub fn shim(&self) -> Runtime {
        shim_at(SHIM, self.tmp.path(), &self.config)
    }

    pub fn shim_log(&self) -> String {
        shim_log(&self.config)
    }

    /// `nvshim ARGS` with this world's config and [`World::env`].
    pub fn nvshim_command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(NVSHIM);
        cmd.args(args).env("NVSHIM_CONFIG", &self.config);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    pub fn nvshim(&self, args: &[&str]) -> Output {
        self.nvshim_command(args).output().unwrap()
    }

    /// `nvshim cdi generate` into `<run-cdi>/nvidia.yaml` (made if missing), which it returns.
    pub fn generate(&self) -> PathBuf {
        fs::create_dir_all(&self.run_cdi).unwrap();
        let out_path = self.run_cdi.join("nvidia.yaml");
        let out = self.nvshim(&["cdi", "generate", "--output", out_path.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "nvshim cdi generate failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out_path
    }

    /// A busybox bundle in `<tmp>/<name>` running `args` with `env` set.
    pub fn bundle(&self, name: &str, args: &[&str], env: &[(&str, &str)]) -> Bundle {
        let b = Bundle::new(&self.tmp.path().join(name), args).unwrap();
        for (k, v) in env {
            b.set_env(k, v).unwrap();
        }
        b
    }

    /// A bundle whose process is the probe script for this host.
    pub fn probe_bundle(&self, name: &str, env: &[(&str, &str)]) -> Bundle {
        let args = ProbeSpec::for_host(&self.host).args();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.bundle(name, &args, env)
    }

    /// The probe bundle asking for `visible` in `NVIDIA_VISIBLE_DEVICES`.
    pub fn gpu_bundle(&self, name: &str, visible: &str) -> Bundle {
        self.probe_bundle(name, &[("NVIDIA_VISIBLE_DEVICES", visible)])
    }

    /// Runs the container through `rt` (with `run`, or `create`+`start`), asserts it ran to
    /// completion, and parses the probe.
    pub fn probe(&self, rt: &Runtime, bundle: &Bundle, create_start: bool) -> ProbeReport {
        let id = unique_id("nvshim-e2e");
        let out = if create_start {
            rt.create_start(bundle, &id).unwrap()
        } else {
            rt.run(bundle, &id).unwrap()
        };
        let report = ProbeReport::parse(&out.stdout);
        if std::env::var_os("NVSHIM_E2E_VERBOSE").is_some() {
            eprintln!("{out}");
        }
        assert!(
            out.success() && report.complete,
            "the container did not run to completion\n{out}\n--- nvshim.log ---\n{}",
            self.shim_log()
        );
        report
    }

    /// [`World::probe`] through nvshim-runtime with `run`.
    pub fn run(&self, bundle: &Bundle) -> ProbeReport {
        self.probe(&self.shim(), bundle, false)
    }

    /// Replaces the host's libnvidia-ml with the fake NVML and writes `topology`; returns the
    /// topology file for `NVSHIM_FAKE_NVML_TOPOLOGY`.
    pub fn install_fake_nvml(&self, topology: &Topology) -> PathBuf {
        let lib = self
            .host
            .host_path(&self.host.container_lib_path("libnvidia-ml"));
        fs::copy(fake_nvml(), &lib).unwrap();
        let path = self.tmp.path().join("topology.json");
        fs::write(&path, serde_json::to_string_pretty(topology).unwrap()).unwrap();
        path
    }

    /// `<tmp>/bin/<name>`, a symlink to the built `nvshim-hook`: what the packages install as
    /// `/usr/bin/nvidia-cdi-hook` and the like.
    pub fn hook_link(&self, name: &str) -> PathBuf {
        let dir = self.tmp.path().join("bin");
        fs::create_dir_all(&dir).unwrap();
        let link = dir.join(name);
        if !link.exists() {
            symlink(hook_path(), &link).unwrap();
        }
        link
    }
}

/// `create` must fail before touching anything: non-zero exit, a message on stderr containing
/// each of `needles`, config.json byte-identical, no container in runc's state dir.
#[track_caller]
pub fn assert_rejected(w: &World, rt: &Runtime, bundle: &Bundle, needles: &[&str]) -> RunOutput {
    let before = bundle.config_bytes().unwrap();
    let id = unique_id("nvshim-e2e-reject");
    let out = rt.create(bundle, &id).unwrap();
    let log = w.shim_log();
    assert!(
        !out.success(),
        "create should have failed\n{out}\n--- nvshim.log ---\n{log}"
    );
    // With create, the runtime's own stderr is the container stderr file.
    let (_, stderr) = rt.container_output(&id).unwrap();
    for n in needles {
        assert!(
            stderr.contains(n),
            "stderr should mention {n:?}\n{out}\n--- nvshim.log ---\n{log}"
        );
    }
    assert!(
        stderr.trim().lines().count() <= 2,
        "the error should be short: {stderr:?}"
    );
    assert_eq!(
        bundle.config_bytes().unwrap(),
        before,
        "config.json changed although create failed"
    );
    assert_eq!(rt.status(&id).unwrap(), None, "runc knows container {id}");
    assert!(rt.list().unwrap().is_empty(), "runc state dir is not empty");
    out
}
