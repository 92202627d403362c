//! nvshim-nri, the NRI plugin, with containerd's CRI driven as the kubelet drives it and the
//! default `runc` handler: no `nvidia` runtime class, nvshim-runtime nowhere in the path. The
//! plugin gets its requests over containerd's NRI socket (turned on in the test's config,
//! as containerd 2.x has it by default) and each container's view of its GPUs is checked
//! from inside with the probe script. containerd 1.6 has no NRI: skipped there. With
//! `NVSHIM_CRIO` set (CRI-O built by hand, see [`crio_binary`]) the same tests drive CRI-O.

use super::*;
use std::io::{BufRead, Read, Write};
use std::sync::Arc;

/// `nvshim-nri`, which `cargo build --workspace` puts next to the root package's binaries.
fn plugin_binary() -> PathBuf {
    let p = Path::new(NVSHIM).with_file_name("nvshim-nri");
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --workspace` first",
        p.display()
    );
    p
}

/// An env entry or an annotation.
type Pair<'a> = (&'a str, &'a str);

/// containerd with NRI on (`nvshim runtime configure --nri`: containerd 1.7 has it off),
/// its socket `nri_sock`.
fn containerd_with_nri(w: &World, d: &Path, nri_sock: &Path) -> Containerd {
    containerd_configured_with(w, d, nri_sock, &["--nri"])
}

/// [`containerd_with_nri`] with `args` for `nvshim runtime configure` (`--nri-required`).
fn containerd_configured_with(w: &World, d: &Path, nri_sock: &Path, args: &[&str]) -> Containerd {
    let nri_sock = nri_sock.to_path_buf();
    let d2 = d.to_path_buf();
    Containerd::start_with(w, d, args, move |doc| {
        let nri = &mut doc["plugins"]["io.containerd.nri.v1.nri"];
        nri["socket_path"] = toml_edit::value(s(&nri_sock));
        nri["plugin_path"] = toml_edit::value(s(&d2.join("nri-plugins")));
        nri["plugin_config_path"] = toml_edit::value(s(&d2.join("nri-conf")));
    })
}

/// CRI-O's binary when `NVSHIM_CRIO` names one: the tests then drive CRI-O instead of
/// containerd. CI has none (no registry here packages CRI-O): it is built by hand from its
/// repository, `NVSHIM_CRIO_PINNS` (default: `pinns` beside it) and `NVSHIM_CRIO_CONMON`
/// (default: Debian's /usr/bin/conmon) with it.
fn crio_binary() -> Option<PathBuf> {
    std::env::var_os("NVSHIM_CRIO").map(PathBuf::from)
}

/// The engine behind the NRI socket, driven through its CRI.
enum Engine {
    Containerd(Containerd),
    Crio(Crio),
}

impl Engine {
    /// containerd on PATH, or CRI-O where [`crio_binary`] names it, with NRI on at
    /// `nri_sock` and the test images in its store.
    fn start(w: &World, d: &Path, nri_sock: &Path) -> Engine {
        match crio_binary() {
            Some(crio) => Engine::Crio(Crio::start(w, d, nri_sock, &crio)),
            None => {
                let ctd = containerd_with_nri(w, d, nri_sock);
                ctd.import_images("k8s.io");
                Engine::Containerd(ctd)
            }
        }
    }

    fn sock(&self) -> &Path {
        match self {
            Engine::Containerd(c) => &c.sock,
            Engine::Crio(c) => &c.sock,
        }
    }

    fn log_tail(&self) -> String {
        match self {
            Engine::Containerd(c) => c.log_tail(),
            Engine::Crio(c) => c.daemon.log_tail(),
        }
    }

    /// Whether it injects the CDI devices an adjustment names (containerd 2.1, CRI-O 1.34).
    fn injects_cdi(&self) -> bool {
        match self {
            Engine::Containerd(_) => containerd_version() >= (2, 1),
            Engine::Crio(c) => c.version >= (1, 34),
        }
    }
}

/// CRI-O in its own directories under `d`: its storage (vfs), run dir, CRI socket, namespace
/// pins and CNI config there, runc (first on PATH) as its default runtime with cgroupfs, NRI
/// on at its socket, CDI specs read from the test's spec dirs.
struct Crio {
    daemon: Daemon,
    sock: PathBuf,
    version: (u64, u64),
}

impl Crio {
    fn start(w: &World, d: &Path, nri_sock: &Path, crio: &Path) -> Crio {
        fs::create_dir_all(d).unwrap();
        let version = crio_version(crio);
        let p = |name: &str| d.join(name);
        let sock = p("crio.sock");
        let pinns = std::env::var_os("NVSHIM_CRIO_PINNS")
            .map_or_else(|| crio.with_file_name("pinns"), PathBuf::from);
        let conmon = std::env::var_os("NVSHIM_CRIO_CONMON")
            .map_or_else(|| PathBuf::from("/usr/bin/conmon"), PathBuf::from);
        let runc = nvshim::runtime::find_on_path(std::env::var_os("PATH").as_deref(), "runc")
            .expect("runc on PATH");
        Crio::import_images(d);
        // Accept the local images: CRI-O reads a signature policy even for them.
        fs::write(
            p("policy.json"),
            r#"{"default": [{"type": "insecureAcceptAnything"}]}"#,
        )
        .unwrap();
        for dir in ["hooks.d", "conf.d", "cni", "cni-bin"] {
            fs::create_dir_all(p(dir)).unwrap();
        }
        let strings = |v: &[PathBuf]| v.iter().map(|p| s(p)).collect::<toml_edit::Array>();
        let mut doc = toml_edit::DocumentMut::new();
        let crio_t = &mut doc["crio"];
        crio_t["root"] = toml_edit::value(s(&p("root")));
        crio_t["runroot"] = toml_edit::value(s(&p("run")));
        crio_t["storage_driver"] = toml_edit::value("vfs");
        crio_t["log_dir"] = toml_edit::value(s(&p("pod-logs")));
        crio_t["version_file"] = toml_edit::value(s(&p("version")));
        crio_t["version_file_persist"] = toml_edit::value(s(&p("version-persist")));
        crio_t["clean_shutdown_file"] = toml_edit::value(s(&p("clean.shutdown")));
        crio_t["api"]["listen"] = toml_edit::value(s(&sock));
        crio_t["api"]["stream_address"] = toml_edit::value("127.0.0.1");
        crio_t["api"]["stream_port"] = toml_edit::value("0");
        let rt = &mut crio_t["runtime"];
        rt["default_runtime"] = toml_edit::value("runc");
        rt["cgroup_manager"] = toml_edit::value("cgroupfs");
        // CRI-O's default capabilities and MKNOD, which containerd's have: the probe checks
        // the device cgroup with mknod.
        rt["default_capabilities"] = toml_edit::value(toml_edit::Array::from_iter([
            "CHOWN",
            "DAC_OVERRIDE",
            "FSETID",
            "FOWNER",
            "SETGID",
            "SETUID",
            "SETPCAP",
            "NET_BIND_SERVICE",
            "KILL",
            "MKNOD",
        ]));
        rt["pinns_path"] = toml_edit::value(s(&pinns));
        rt["namespaces_dir"] = toml_edit::value(s(&p("ns")));
        rt["container_exits_dir"] = toml_edit::value(s(&p("exits")));
        rt["container_attach_socket_dir"] = toml_edit::value(s(&p("attach")));
        rt["hooks_dir"] = toml_edit::value(strings(&[p("hooks.d")]));
        rt["cdi_spec_dirs"] = toml_edit::value(strings(&config_cdi_dirs(w)));
        rt["decryption_keys_path"] = toml_edit::value(s(&p("keys")));
        rt["irqbalance_config_file"] = toml_edit::value(s(&p("irqbalance")));
        let runc_t = &mut rt["runtimes"]["runc"];
        runc_t["runtime_path"] = toml_edit::value(s(&runc));
        runc_t["runtime_root"] = toml_edit::value(s(&p("runc")));
        runc_t["monitor_path"] = toml_edit::value(s(&conmon));
        runc_t["monitor_cgroup"] = toml_edit::value("pod");
        let image = &mut crio_t["image"];
        image["pause_image"] = toml_edit::value(PAUSE);
        // The pause image's own entrypoint (a `sleep`).
        image["pause_command"] = toml_edit::value("");
        image["signature_policy"] = toml_edit::value(s(&p("policy.json")));
        crio_t["network"]["network_dir"] = toml_edit::value(s(&p("cni")));
        crio_t["network"]["plugin_dirs"] = toml_edit::value(strings(&[p("cni-bin")]));
        let nri = &mut crio_t["nri"];
        nri["enable_nri"] = toml_edit::value(true);
        nri["nri_listen"] = toml_edit::value(s(nri_sock));
        nri["nri_plugin_dir"] = toml_edit::value(s(&p("nri-plugins")));
        nri["nri_plugin_config_dir"] = toml_edit::value(s(&p("nri-conf")));
        let config = p("crio.toml");
        fs::write(&config, doc.to_string()).unwrap();
        let mut cmd = Command::new(crio);
        cmd.arg("--config")
            .arg(&config)
            .arg("--config-dir")
            .arg(p("conf.d"))
            .env("NVSHIM_CONFIG", &w.config);
        let mut daemon = Daemon::spawn("crio", d, cmd);
        let answering = |sock: &Path| std::os::unix::net::UnixStream::connect(sock).is_ok();
        daemon.wait_until("answering", Duration::from_secs(60), || answering(&sock));
        Crio {
            daemon,
            sock,
            version,
        }
    }

    /// The busybox and pause images, put into CRI-O's storage by podman (CRI-O's CRI has
    /// no import and no registry is reachable).
    fn import_images(d: &Path) {
        let images = d.join("images");
        fs::create_dir_all(&images).unwrap();
        let layer = busybox_tar(&images);
        let podman = |args: &[&str]| {
            run(
                Command::new("podman")
                    .args(["--root", s(&d.join("root")), "--runroot", s(&d.join("run"))])
                    .args(["--storage-driver", "vfs", "--events-backend", "none"])
                    .args(args),
                Duration::from_secs(120),
            )
            .expect_ok()
        };
        let busybox = json!({"Env": [PATH_ENV], "Cmd": ["sh"]});
        let pause = json!({"Env": [PATH_ENV], "Entrypoint": ["/bin/sleep", "3600"]});
        for (name, config) in [(IMAGE, busybox), (PAUSE, pause)] {
            let archive = oci_archive(&images, &layer, name, config);
            let pulled = podman(&["pull", "-q", &format!("oci-archive:{}", s(&archive))]);
            podman(&["tag", pulled.stdout.trim(), name]);
        }
    }
}

/// `crio --version`'s release: `crio version 1.36.3`.
fn crio_version(crio: &Path) -> (u64, u64) {
    let out = run(Command::new(crio).arg("--version"), Duration::from_secs(30)).expect_ok();
    let v = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("crio version "))
        .unwrap_or_else(|| panic!("no version in {out}"))
        .trim()
        .to_string();
    let mut parts = v.split('.').map(|n| n.parse::<u64>().unwrap());
    (parts.next().unwrap(), parts.next().unwrap())
}

/// The plugin, registered with the engine behind `nri_sock`; `env`: its environment's
/// additions (the fake NVML's topology).
fn start_plugin(
    w: &World,
    d: &Path,
    nri_sock: &Path,
    extra: &[&str],
    env: &[(&str, &Path)],
) -> Daemon {
    let mut cmd = Command::new(plugin_binary());
    cmd.args(["--socket", s(nri_sock), "--config", s(&w.config)])
        .args(extra)
        .envs(env.iter().copied());
    let mut plugin = Daemon::spawn("nvshim-nri", d, cmd);
    wait_registered(&mut plugin, 1);
    plugin
}

/// Waits until the plugin's log says it registered `times` times.
fn wait_registered(plugin: &mut Daemon, times: usize) {
    let log = plugin.log.clone();
    plugin.wait_until("registered", Duration::from_secs(30), || {
        fs::read_to_string(&log)
            .unwrap_or_default()
            .matches("registered as NRI plugin")
            .count()
            >= times
    });
}

/// An engine whose log a failing test prints: [`Engine`], or a containerd a test of
/// containerd's own settings starts.
trait EngineLog {
    fn engine_log(&self) -> String;
}

impl EngineLog for Engine {
    fn engine_log(&self) -> String {
        self.log_tail()
    }
}

impl EngineLog for Containerd {
    fn engine_log(&self) -> String {
        self.log_tail()
    }
}

fn logs(plugin: &Daemon, engine: &impl EngineLog) -> String {
    format!(
        "--- nvshim-nri ---\n{}\n--- engine ---\n{}",
        plugin.log_tail(),
        engine.engine_log()
    )
}

fn nri_available() -> bool {
    if crio_binary().is_none() && containerd_version() < (1, 7) {
        eprintln!("skipped: containerd {:?} has no NRI", containerd_version());
        return false;
    }
    true
}

/// By env (index and UUID), by `cdi.k8s.io` annotation and by the device plugin's env
/// strategy beside its DeviceSpec: each container has exactly its GPUs; an unprivileged env request refused by the policy fails the
/// container with nvshim's reason in the CRI's answer, as nvshim-runtime's refusal does; the
/// engine restarted, the plugin registers again and serves the next container.
#[test]
fn nri_plugin_serves_gpu_requests_through_containerd_cri() {
    if !nri_available() {
        return;
    }
    let _one_engine = serial();
    let w = World::builder().spec_dirs(SpecDirs::Run).build();
    write_cdi_spec(&w, &w.run_cdi);
    let d = dir(&w, "nri");
    let nri_sock = d.join("nri.sock");
    let ctd = Engine::start(&w, &d.join("ctd"), &nri_sock);
    let mut plugin = start_plugin(&w, &d, &nri_sock, &[], &[]);
    let script = script(&w);
    let tokio = cri::runtime();
    tokio.block_on(async {
        let channel = cri::connect(ctd.sock()).await;
        let mut pod = cri::run_pod(channel, "runc", &d.join("pods")).await;
        // "env-cdi": a CDI name only the plugin reads (engines resolve annotations and CRI's
        // CDI_devices themselves): where the engine injects CDI, only its NRI CDI injection
        // can give the GPU.
        let cases: [(&str, &[Pair], &[Pair], usize); 4] = [
            ("env", &[("NVIDIA_VISIBLE_DEVICES", "1")], &[], 1),
            (
                "annotation",
                &[],
                &[("cdi.k8s.io/nvshim-e2e", "nvidia.com/gpu=0")],
                0,
            ),
            (
                "env-uuid",
                &[("NVIDIA_VISIBLE_DEVICES", w.gpu(1).uuid.as_str())],
                &[],
                1,
            ),
            (
                "env-cdi",
                &[("NVIDIA_VISIBLE_DEVICES", "nvidia.com/gpu=1")],
                &[],
                1,
            ),
        ];
        for (name, env, annotations, gpu) in cases {
            let what = format!("NRI, handler runc, {name}");
            let out = pod
                .run_container(name, &script, env, annotations, &[], &[])
                .await
                .unwrap_or_else(|e| panic!("{what}: {e}\n{}", logs(&plugin, &ctd)));
            assert_gpus(&w, &what, &ProbeReport::parse(&out), &[w.gpu(gpu)]);
        }
        // No request: nothing of the GPUs.
        let out = pod
            .run_container("plain", &script, &[], &[], &[], &[])
            .await
            .unwrap_or_else(|e| panic!("plain: {e}\n{}", logs(&plugin, &ctd)));
        assert_gpus(&w, "NRI, no request", &ProbeReport::parse(&out), &[]);

        // The policy, read for each container: an unprivileged env request refused.
        w.configure("accept-envvar-unprivileged = false\n");
        let err = pod
            .run_container(
                "refused",
                &script,
                &[("NVIDIA_VISIBLE_DEVICES", "1")],
                &[],
                &[],
                &[],
            )
            .await
            .expect_err("an unprivileged env request should be refused");
        for needle in [
            "nvshim:",
            "NVIDIA_VISIBLE_DEVICES",
            "accept-envvar-unprivileged",
        ] {
            assert!(
                err.contains(needle),
                "{needle:?} not in {err}\n{}",
                logs(&plugin, &ctd)
            );
        }
        // The device plugin's env strategy with its DeviceSpec (CRI `devices`) under
        // "allocation-backed": the node backs the variable.
        w.configure("accept-envvar-unprivileged = \"allocation-backed\"\n");
        let gpu = w.gpu(1);
        let node = w.host.dev_root().join(format!("dev/nvidia{}", gpu.minor));
        let container_node = format!("/dev/nvidia{}", gpu.minor);
        let what = "NRI, NVIDIA_VISIBLE_DEVICES=<uuid> beside its DeviceSpec";
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
            .unwrap_or_else(|e| panic!("{what}: {e}\n{}", logs(&plugin, &ctd)));
        assert_gpus(&w, what, &ProbeReport::parse(&out), &[gpu]);
        // The device plugin's volume-mounts strategy: `/dev/null` at the device's path under
        // /var/run/nvidia-container-devices is the request; the plugin removes the mount.
        w.configure("accept-volume-mounts = true\naccept-envvar-unprivileged = false\n");
        let root = nvshim::request::DEVICE_MOUNT_ROOT;
        pod.mounts = vec![(format!("{root}/{}", w.gpu(0).uuid), "/dev/null".into())];
        let what = "NRI, device plugin volume-mounts";
        let out = pod
            .run_container(
                "volume-mounts",
                &format!("{script}\nls {root} 2>&1 | sed 's/^/DPMOUNT /'\n"),
                &[("NVIDIA_VISIBLE_DEVICES", root)],
                &[],
                &[],
                &[],
            )
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}\n{}", logs(&plugin, &ctd)));
        pod.mounts.clear();
        assert_gpus(&w, what, &ProbeReport::parse(&out), &[w.gpu(0)]);
        // The device plugin's `/dev/null` placeholder stays (harmless): it is the request the
        // plugin plans again at StartContainer.
        assert!(
            out.lines()
                .any(|l| l.starts_with("DPMOUNT ") && l.contains(&w.gpu(0).uuid)),
            "{what}: the device plugin's mount is gone:\n{out}"
        );
        w.configure("");
        pod.remove().await;
    });
    // How each was served, in the plugin's log: containerd 2.1 and CRI-O 1.34 inject CDI
    // devices named in an adjustment themselves; before them, the plugin sends the spec's edits.
    let log = fs::read_to_string(&plugin.log).unwrap();
    eprintln!("{log}");
    assert!(
        log.contains("container env ") && log.contains("raw adjustment"),
        "{log}"
    );
    // Each served container, planned again at StartContainer, has what it asked for.
    assert!(!log.contains("at StartContainer"), "{log}");
    let cdi_how = if ctd.injects_cdi() {
        "NRI CDI injection"
    } else {
        "raw adjustment"
    };
    for name in ["annotation", "env-cdi"] {
        assert!(
            log.lines()
                .any(|l| l.contains(&format!("container {name} ")) && l.contains(cdi_how)),
            "{name}: {log}"
        );
    }
    // The engine restarted (a new containerd on the same NRI socket): the plugin connects
    // again by itself and serves the next pod.
    drop(ctd);
    let ctd = Engine::start(&w, &d.join("ctd2"), &nri_sock);
    wait_registered(&mut plugin, 2);
    tokio.block_on(async {
        let channel = cri::connect(ctd.sock()).await;
        let mut pod = cri::run_pod(channel, "runc", &d.join("pods2")).await;
        let what = "NRI after the engine restarted, NVIDIA_VISIBLE_DEVICES=0";
        let out = pod
            .run_container(
                "again",
                &script,
                &[("NVIDIA_VISIBLE_DEVICES", "0")],
                &[],
                &[],
                &[],
            )
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}\n{}", logs(&plugin, &ctd)));
        assert_gpus(&w, what, &ProbeReport::parse(&out), &[w.gpu(0)]);
        pod.remove().await;
    });
    drop(ctd);
    drop(plugin);
    assert_nothing_mounted_below(w.tmp.path());
}

/// By MIG device UUID (the plugin asks the fake NVML in process, as `nvshim explain` does)
/// and by IMEX channel (the operator's `cdi-env-kinds` opt-in): the MIG device's parent GPU and
/// exactly its two capability nodes; GPU 0 and exactly channel 5. MIG config: refused to an
/// unprivileged container, served to a privileged one.
#[test]
fn nri_plugin_serves_mig_and_imex_requests() {
    if !nri_available() {
        return;
    }
    let _one_engine = serial();
    let (w, topology, topo_file) = crate::k8s::mig_world();
    w.configure("cdi-env-kinds = [\"nvidia.com/gpu\", \"nvidia.com/imex-channel\"]\n");
    w.host.add_imex_channels(&[0, 3, 5]).unwrap();
    let d = dir(&w, "nri-mig");
    let nri_sock = d.join("nri.sock");
    let ctd = Engine::start(&w, &d.join("ctd"), &nri_sock);
    let plugin = start_plugin(
        &w,
        &d,
        &nri_sock,
        &[],
        &[(nvshim_fake_nvml::TOPOLOGY_ENV, &topo_file)],
    );
    let parent = &topology.gpus[0];
    let mig = &parent.mig_devices[0];
    let caps_major = w.host.spec().caps_major;
    let mut want_caps: Vec<(u32, u32)> = [
        nvshim_testsupport::host::mig_cap_minor(parent.minor, mig.gpu_instance_id, None),
        nvshim_testsupport::host::mig_cap_minor(parent.minor, mig.gpu_instance_id, Some(0)),
    ]
    .iter()
    .map(|m| (*m, caps_major))
    .collect();
    want_caps.sort_unstable();
    let script = script(&w);
    let tokio = cri::runtime();
    tokio.block_on(async {
        let channel = cri::connect(ctd.sock()).await;
        let mut pod = cri::run_pod(channel, "runc", &d.join("pods")).await;
        let what = format!("NRI, MIG device {}", mig.uuid);
        let out = pod
            .run_container(
                "mig",
                &script,
                &[("NVIDIA_VISIBLE_DEVICES", mig.uuid.as_str())],
                &[],
                &[],
                &[],
            )
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}\n{}", logs(&plugin, &ctd)));
        let r = ProbeReport::parse(&out);
        assert_gpus(&w, &what, &r, &[w.gpu(0)]);
        assert_eq!(crate::k8s::caps_nodes(&r), want_caps, "{what}: {}", r.raw);

        let what = "NRI, NVIDIA_IMEX_CHANNELS=5";
        let out = pod
            .run_container(
                "imex",
                &script,
                &[
                    ("NVIDIA_VISIBLE_DEVICES", "0"),
                    ("NVIDIA_IMEX_CHANNELS", "5"),
                ],
                &[],
                &[],
                &[],
            )
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}\n{}", logs(&plugin, &ctd)));
        let r = ProbeReport::parse(&out);
        assert_gpus(&w, what, &r, &[w.gpu(0)]);
        let major = w.host.spec().caps_imex_major;
        assert_eq!(
            crate::k8s::imex_nodes(&r),
            vec![(
                "/dev/nvidia-caps-imex-channels/channel5".to_string(),
                major,
                5
            )],
            "{what}: {}",
            r.raw
        );
        // The MIG config capability is for privileged containers only: NRI shows no
        // capabilities, so the plugin takes CRI's allow-all device rule for privilege.
        let env = [
            ("NVIDIA_VISIBLE_DEVICES", "0"),
            ("NVIDIA_MIG_CONFIG_DEVICES", "all"),
        ];
        let err = pod
            .run_container("mig-config", &script, &env, &[], &[], &[])
            .await
            .expect_err("MIG config from an unprivileged container should be refused");
        assert!(
            err.contains("NVIDIA_MIG_CONFIG_DEVICES") && err.contains("privileged"),
            "{err}"
        );
        pod.remove().await;
        if matches!(ctd, Engine::Crio(_)) {
            // CRI-O gives a privileged container every capability it knows; runc cannot
            // apply CAP_SYS_RESOURCE, which these machines' bounding set lacks (seen).
            eprintln!("skipped on CRI-O: a privileged container (CAP_SYS_RESOURCE)");
            return;
        }
        let channel = cri::connect(ctd.sock()).await;
        let mut pod = cri::run_pod_with(channel, "runc", &d.join("pods-priv"), true).await;
        let out = pod
            .run_container("mig-config-priv", &script, &env, &[], &[], &[])
            .await
            .unwrap_or_else(|e| panic!("privileged MIG config: {e}\n{}", logs(&plugin, &ctd)));
        let r = ProbeReport::parse(&out);
        assert!(
            crate::k8s::caps_nodes(&r)
                .contains(&(nvshim_testsupport::host::MIG_CONFIG_MINOR, caps_major)),
            "privileged MIG config: no config capability node: {}",
            r.raw
        );
        pod.remove().await;
    });
    drop(ctd);
    drop(plugin);
    assert_nothing_mounted_below(w.tmp.path());
}

/// The plugin killed: containerd creates the next containers without asking anyone (NRI has
/// no plugin then), and starts one of them. The plugin restarted, it finds them at
/// `Synchronize` (and the created one at `StartContainer`), plans them again and,
/// `--mandatory`, fails the created one's start with the reason and kills the running one
/// (CRI: exited, 137, SIGKILL); at its default (fail-open) both run, named in warnings.
/// Served containers before and after pass every check.
#[test]
fn nri_plugin_restarted_finds_containers_created_without_it() {
    if !nri_available() {
        return;
    }
    let _one_engine = serial();
    let w = World::builder().spec_dirs(SpecDirs::Run).build();
    let d = dir(&w, "nri-restart");
    let nri_sock = d.join("nri.sock");
    let ctd = Engine::start(&w, &d.join("ctd"), &nri_sock);
    let script = script(&w);
    let tokio = cri::runtime();
    let env = [("NVIDIA_VISIBLE_DEVICES", "1")];
    for (mode, extra) in [("mandatory", &["--mandatory"][..]), ("fail-open", &[][..])] {
        let plugin_dir = d.join(mode);
        let plugin = start_plugin(&w, &plugin_dir, &nri_sock, extra, &[]);
        tokio.block_on(async {
            let channel = cri::connect(ctd.sock()).await;
            let mut pod = cri::run_pod(channel, "runc", &d.join(format!("pods-{mode}"))).await;
            let out = pod
                .run_container("served", &script, &env, &[], &[], &[])
                .await
                .unwrap_or_else(|e| panic!("{mode}, served: {e}\n{}", logs(&plugin, &ctd)));
            assert_gpus(&w, mode, &ProbeReport::parse(&out), &[w.gpu(1)]);
            drop(plugin);
            let created = pod
                .create_container("unserved", &script, &env, &[], &[], &[])
                .await
                .expect("containerd creates containers with no NRI plugin");
            let running = pod
                .create_container("unserved-running", "exec sleep 600", &env, &[], &[], &[])
                .await
                .expect("containerd creates containers with no NRI plugin");
            pod.start(&running)
                .await
                .expect("containerd starts containers with no NRI plugin");
            let plugin = start_plugin(&w, &plugin_dir, &nri_sock, extra, &[]);
            let started = pod.start_to_end("unserved", created).await;
            let log = fs::read_to_string(&plugin.log).unwrap();
            assert!(
                log.contains("container unserved") && log.contains("at Synchronize"),
                "{mode}: {log}"
            );
            match mode {
                "mandatory" => {
                    let err = started.expect_err("the unserved container should not start");
                    // CRI-O answers with runc's error (the plugin stopped the created
                    // container); the reason is in the plugin's log.
                    let reason = if matches!(ctd, Engine::Crio(_)) {
                        &log
                    } else {
                        &err
                    };
                    for needle in ["nvshim:", "unserved", "lacks device nodes"] {
                        assert!(reason.contains(needle), "{needle:?} not in {err}\n{log}");
                    }
                    // Started while the plugin was down: killed once it is back.
                    let code = pod.wait_exited(&running).await.unwrap_or_else(|e| {
                        panic!("mandatory, unserved-running: {e}\n{}", logs(&plugin, &ctd))
                    });
                    let log = fs::read_to_string(&plugin.log).unwrap();
                    assert_eq!(code, 137, "unserved-running: not SIGKILLed\n{log}");
                    assert!(
                        log.lines()
                            .any(|l| l.contains("stopped container unserved-running")
                                && l.contains("SIGKILL")
                                && l.contains("of pod nvshim-e2e/gpu-pod")),
                        "{log}"
                    );
                }
                _ => {
                    let out = started.unwrap_or_else(|e| panic!("fail-open: {e}\n{log}"));
                    assert_gpus(&w, "fail-open, unserved", &ProbeReport::parse(&out), &[]);
                    assert!(log.contains("fail-open"), "{log}");
                    // Started while the plugin was down: it keeps running, named in a warning.
                    assert!(
                        log.lines().any(|l| l.contains("container unserved-running")
                            && l.contains("at Synchronize")
                            && l.contains("fail-open")),
                        "{log}"
                    );
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    let status = pod.status(&running).await.unwrap();
                    assert_eq!(
                        status.state,
                        k8s_cri::v1::ContainerState::ContainerRunning as i32,
                        "fail-open, unserved-running\n{}",
                        logs(&plugin, &ctd)
                    );
                }
            }
            let out = pod
                .run_container("served-again", &script, &env, &[], &[], &[])
                .await
                .unwrap_or_else(|e| panic!("{mode}, served again: {e}\n{}", logs(&plugin, &ctd)));
            assert_gpus(&w, mode, &ProbeReport::parse(&out), &[w.gpu(1)]);
            pod.remove().await;
        });
    }
    drop(ctd);
    assert_nothing_mounted_below(w.tmp.path());
}

/// `--no-hooks` (an engine whose NRI validator rejects OCI hooks): the adjustment has none,
/// and `libcuda.so.1` is still in the container, the driver's `libcuda.so.<version>` mounted
/// at the SONAME path: the same bytes as the host's library.
#[test]
fn nri_plugin_without_hooks_still_gives_libcuda_so_1() {
    if !nri_available() {
        return;
    }
    let _one_engine = serial();
    let w = World::builder().spec_dirs(SpecDirs::Run).build();
    let d = dir(&w, "nri-no-hooks");
    let nri_sock = d.join("nri.sock");
    let ctd = Engine::start(&w, &d.join("ctd"), &nri_sock);
    let plugin = start_plugin(&w, &d, &nri_sock, &["--no-hooks"], &[]);
    let lib = w.host.container_lib_path("libcuda");
    let soname = format!("{}/libcuda.so.1", lib.rsplit_once('/').unwrap().0);
    let host_sum = sha256(&w.host.host_path(&lib));
    let tokio = cri::runtime();
    tokio.block_on(async {
        let channel = cri::connect(ctd.sock()).await;
        let mut pod = cri::run_pod(channel, "runc", &d.join("pods")).await;
        let script = format!("{}\necho libcuda\nsha256sum {soname}\n", script(&w));
        let out = pod
            .run_container(
                "no-hooks",
                &script,
                &[("NVIDIA_VISIBLE_DEVICES", "0")],
                &[],
                &[],
                &[],
            )
            .await
            .unwrap_or_else(|e| panic!("--no-hooks: {e}\n{}", logs(&plugin, &ctd)));
        let seen = out
            .lines()
            .skip_while(|l| *l != "libcuda")
            .nth(1)
            .unwrap_or("");
        assert_eq!(
            seen.split(' ').next(),
            Some(host_sum.as_str()),
            "{soname} in the container is not the host's {lib}:\n{out}"
        );
        assert_gpus(&w, "--no-hooks", &ProbeReport::parse(&out), &[w.gpu(0)]);
        pod.remove().await;
    });
    let log = fs::read_to_string(&plugin.log).unwrap();
    assert!(
        log.contains("--no-hooks: not done: ") && log.contains("ld.so.cache update"),
        "{log}"
    );
    drop(ctd);
    drop(plugin);
    assert_nothing_mounted_below(w.tmp.path());
}

/// A user-namespaced pod (`hostUsers: false`, as in
/// `engines::containerd_cri_runs_gpu_pods_in_a_user_namespace`) with the default `runc`
/// handler asking by env: the plugin sees the user namespace in NRI's
/// `Container.linux.namespaces`, its adjustment bind-mounts the GPU's node from dev-root
/// (src/userns.rs) and adds the node at its host path for the cgroup rule. Checked from inside
/// as in [`super::super::userns`]. By `cdi.k8s.io` annotation: refused at create with the
/// reason. containerd 2.0 is the first with user-namespaced pods; CRI-O has them.
#[test]
fn nri_plugin_serves_a_user_namespaced_pod() {
    if !nri_available() || (crio_binary().is_none() && containerd_version() < (2, 0)) {
        eprintln!("skipped: no NRI or no user-namespaced pods in this containerd");
        return;
    }
    use super::super::userns::{problems, script};
    let _one_engine = serial();
    let w = World::builder().spec_dirs(SpecDirs::Run).build();
    // runc init and the hook run as host uid 100000: the fake host must be reachable.
    fs::set_permissions(w.tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
    w.generate();
    let d = dir(&w, "nri-userns");
    let nri_sock = d.join("nri.sock");
    ptp_cni(&d.join("ctd"));
    let ctd = Engine::start(&w, &d.join("ctd"), &nri_sock);
    let plugin = start_plugin(&w, &d, &nri_sock, &[], &[]);
    let script = script();
    let userns = cri::pod_user_namespace();
    let tokio = cri::runtime();
    tokio.block_on(async {
        let channel = cri::connect(ctd.sock()).await;
        let mut pod = cri::run_pod_in(channel, "runc", &d.join("pods"), Some(userns)).await;
        let what = "NRI, user-namespaced pod, NVIDIA_VISIBLE_DEVICES=1";
        let env = [("NVIDIA_VISIBLE_DEVICES", "1")];
        let out = pod
            .run_container("env", &script, &env, &[], &[], &[])
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}\n{}", logs(&plugin, &ctd)));
        let report = ProbeReport::parse(&out);
        assert_no_problems(what, &problems(&w, &report, w.gpu(1)), &report);
        // By `cdi.k8s.io` annotation: containerd injects the spec's nodes itself before NRI
        // and keeps them whatever the adjustment removes; runc would bind the GPU's node from
        // the host's /dev, where this host has none (dev-root is the fake host's). Refused at
        // create with that reason, instead of runc's error at start.
        let annotation = [("cdi.k8s.io/nvshim-e2e", "nvidia.com/gpu=0")];
        let err = pod
            .run_container("annotation", &script, &[], &annotation, &[], &[])
            .await
            .expect_err("a user-namespaced annotation request cannot start here");
        let dev_root = s(w.host.dev_root());
        let node = format!("/dev/nvidia{}", w.gpu(0).minor);
        for needle in [
            "CreateContainer",
            "nvshim:",
            &node,
            dev_root,
            "NRI cannot remove a device the engine added",
            "NVIDIA_VISIBLE_DEVICES",
            "`nvidia` runtime class",
        ] {
            assert!(
                err.contains(needle),
                "{needle:?} not in {err}\n{}",
                logs(&plugin, &ctd)
            );
        }
        pod.remove().await;
    });
    drop(ctd);
    assert_nothing_mounted_below(w.tmp.path());
}

/// `--nri-required` against the containerd on PATH when it is older than 2.2 (sid's 2.1.9,
/// trixie's 1.7.24), its release from `containerd --version`: one error naming the release and
/// the fallback (`nvshim-nri --mandatory`), exit status 1, the config untouched. Such a
/// containerd would ignore the validator's keys with only a warning ("Ignoring unknown key").
#[test]
fn nri_required_refused_before_containerd_2_2() {
    let version = containerd_version();
    if version >= (2, 2) {
        eprintln!("skipped: containerd {version:?} has NRI's default validator");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let config = d.path().join("config.toml");
    let default = run(
        Command::new("containerd").args(["config", "default"]),
        Duration::from_secs(30),
    )
    .expect_ok();
    fs::write(&config, &default.stdout).unwrap();
    let out = runtime_cmd(
        "configure",
        "containerd",
        &config,
        &["--nri", "--nri-required"],
    );
    assert_eq!(out.code, Some(1), "{out}");
    let release = format!("containerd {}.{}", version.0, version.1);
    for needle in [
        release.as_str(),
        "--nri-required needs containerd 2.2 or later",
        "Ignoring unknown key",
        "nvshim-nri with --mandatory",
        "nothing was changed",
    ] {
        assert!(out.stderr.contains(needle), "{needle:?} not in:\n{out}");
    }
    assert_eq!(out.stderr.lines().count(), 1, "one error:\n{out}");
    assert_eq!(fs::read_to_string(&config).unwrap(), default.stdout);
    assert!(!config.with_file_name("conf.d").exists());
    assert!(!backup_dir(&config).exists(), "nothing backed up");
}

/// containerd 2.2 and later, configured with `--nri --nri-required`: while nvshim-nri is
/// absent NRI's default validator refuses every container at CreateContainer (a GPU request
/// never starts without its GPUs) but those of a pod annotated
/// `nvshim.io/tolerate-missing-nri: "true"`; with the plugin registered the request is served.
/// Skipped (printed) on older containerd: put containerd 2.2+ first on PATH to run it.
#[test]
fn nri_required_refuses_containers_while_the_plugin_is_absent() {
    let version = containerd_version();
    if version < (2, 2) {
        eprintln!("skipped: containerd {version:?} has no NRI default validator (2.2 and later)");
        return;
    }
    let _one_engine = serial();
    let w = World::builder().spec_dirs(SpecDirs::Run).build();
    let d = dir(&w, "nri-required");
    let nri_sock = d.join("nri.sock");
    let ctd =
        containerd_configured_with(&w, &d.join("ctd"), &nri_sock, &["--nri", "--nri-required"]);
    ctd.import_images("k8s.io");
    let script = script(&w);
    let env = [("NVIDIA_VISIBLE_DEVICES", "1")];
    let tokio = cri::runtime();
    tokio.block_on(async {
        let channel = cri::connect(&ctd.sock).await;
        let mut pod = cri::run_pod(channel, "runc", &d.join("pods")).await;
        let err = pod
            .create_container("no-plugin", &script, &env, &[], &[], &[])
            .await
            .expect_err("containerd should refuse a container while nvshim-nri is absent");
        // The CRI error quotes the validator's message (`required plugin "nvshim" not
        // present`) with its quotes escaped.
        for needle in [
            "00-default-validator",
            "required plugin",
            "nvshim",
            "not present",
        ] {
            assert!(
                err.contains(needle),
                "{needle:?} not in {err}\n{}",
                ctd.log_tail()
            );
        }
        // A pod annotated as the plugin's own and the installer's pods are
        // (packaging/kubernetes/overlays/nri) starts without the plugin; a GPU request there
        // gets nothing, as with no plugin at all.
        let mut config = pod.config.clone();
        let meta = config.metadata.as_mut().unwrap();
        meta.uid = format!("{}-tolerated", meta.uid);
        meta.name = "tolerated-pod".into();
        config.annotations.insert(
            nvshim::ops::engine::containerd::NRI_TOLERATE_ANNOTATION.into(),
            "true".into(),
        );
        let log_dir = pod.log_dir.join("tolerated");
        fs::create_dir_all(&log_dir).unwrap();
        config.log_directory = s(&log_dir).into();
        let sandbox = k8s_cri::v1::RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: "runc".into(),
        };
        let id = (pod.rt.run_pod_sandbox(sandbox).await)
            .unwrap_or_else(|e| panic!("tolerated pod: {e}\n{}", ctd.log_tail()))
            .into_inner()
            .pod_sandbox_id;
        let mut tolerated = cri::Pod {
            rt: pod.rt.clone(),
            id,
            config,
            log_dir,
            privileged: false,
            mounts: Vec::new(),
        };
        let out = tolerated
            .run_container("tolerated", &script, &env, &[], &[], &[])
            .await
            .unwrap_or_else(|e| panic!("tolerated pod: {e}\n{}", ctd.log_tail()));
        assert_gpus(&w, "tolerated, no plugin", &ProbeReport::parse(&out), &[]);
        tolerated.remove().await;

        let plugin = start_plugin(&w, &d, &nri_sock, &[], &[]);
        let out = pod
            .run_container("served", &script, &env, &[], &[], &[])
            .await
            .unwrap_or_else(|e| panic!("with the plugin: {e}\n{}", logs(&plugin, &ctd)));
        assert_gpus(
            &w,
            "--nri-required, plugin up",
            &ProbeReport::parse(&out),
            &[w.gpu(1)],
        );
        pod.remove().await;
        drop(plugin);
    });
    drop(ctd);
    assert_nothing_mounted_below(w.tmp.path());
}

/// A node running both: nvshim-nri registered and nvshim-runtime as the `nvidia` handler
/// (what [`Containerd::start`] registers). A pod with runtime class `nvidia` asking by
/// `NVIDIA_VISIBLE_DEVICES` and one asking by `cdi.k8s.io` annotation: the plugin adjusts
/// each container at create, nvshim-runtime then finds that spec. Each gets exactly its GPUs
/// (device nodes, libcuda in `ldconfig -p`, nvidia-smi), no mount point twice and no hook
/// twice in the spec runc ran, and nothing in either log is an error.
#[test]
fn nri_plugin_beside_the_nvidia_runtime_class() {
    if !nri_available() {
        return;
    }
    let _one_engine = serial();
    let w = World::builder().spec_dirs(SpecDirs::Run).build();
    write_cdi_spec(&w, &w.run_cdi);
    let d = dir(&w, "nri-both");
    let nri_sock = d.join("nri.sock");
    let ctd = containerd_with_nri(&w, &d.join("ctd"), &nri_sock);
    ctd.import_images("k8s.io");
    let plugin = start_plugin(&w, &d, &nri_sock, &[], &[]);
    // The probe, then every mount point of the container, one per line.
    let script = format!(
        "{}\nawk '{{print \"MOUNTPOINT \" $5}}' /proc/self/mountinfo\nsleep 1\n",
        script(&w)
    );
    let tokio = cri::runtime();
    tokio.block_on(async {
        let channel = cri::connect(&ctd.sock).await;
        let mut pod = cri::run_pod(channel, "nvidia", &d.join("pods")).await;
        let cases: [(&str, &[Pair], &[Pair], usize); 2] = [
            ("env", &[("NVIDIA_VISIBLE_DEVICES", "1")], &[], 1),
            (
                "annotation",
                &[],
                &[("cdi.k8s.io/nvshim-e2e", "nvidia.com/gpu=0")],
                0,
            ),
        ];
        for (name, env, annotations, gpu) in cases {
            let what = format!("NRI plugin and handler nvidia, {name}");
            let fail = |e: String| {
                panic!(
                    "{what}: {e}\n{}\n--- nvshim.log ---\n{}",
                    logs(&plugin, &ctd),
                    w.shim_log()
                )
            };
            let created = pod
                .create_container(name, &script, env, annotations, &[], &[])
                .await
                .unwrap_or_else(fail);
            // The spec runc ran: the bundle's config.json once runc created the container
            // (`init.pid`), read while the container sleeps; containerd removes the bundle
            // when it exits.
            let bundle = ctd
                .dir
                .join("state/io.containerd.runtime.v2.task/k8s.io")
                .join(&created);
            let spec = async {
                loop {
                    if bundle.join("init.pid").exists() {
                        let text = fs::read_to_string(bundle.join("config.json")).unwrap();
                        return serde_json::from_str::<Value>(&text).unwrap();
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            };
            let (out, spec) = tokio::join!(pod.start_to_end(name, created), spec);
            let out = out.unwrap_or_else(fail);
            assert_gpus(&w, &what, &ProbeReport::parse(&out), &[w.gpu(gpu)]);
            let mut seen = std::collections::BTreeSet::new();
            let twice: Vec<&str> = out
                .lines()
                .filter_map(|l| l.strip_prefix("MOUNTPOINT "))
                .filter(|m| !seen.insert(*m))
                .collect();
            assert!(twice.is_empty(), "{what}: mounted twice: {twice:?}\n{out}");
            // A hook is the same job when it runs the same binary's same subcommand (the
            // runtime's fix-ups hook differs from the plugin's only by `--bundle`).
            let hooks = spec["hooks"].as_object().cloned().unwrap_or_default();
            for (kind, list) in hooks {
                let mut seen = std::collections::BTreeSet::new();
                for h in list.as_array().cloned().unwrap_or_default() {
                    let job = (h["path"].to_string(), h["args"][1].to_string());
                    assert!(seen.insert(job), "{what}: {kind} hook twice: {h}\n{spec:#}");
                }
            }
            let mut seen = std::collections::BTreeSet::new();
            for dev in spec["linux"]["devices"]
                .as_array()
                .cloned()
                .unwrap_or_default()
            {
                assert!(
                    seen.insert(dev["path"].to_string()),
                    "{what}: device {} twice\n{spec:#}",
                    dev["path"]
                );
            }
        }
        pod.remove().await;
    });
    let shim_log = w.shim_log();
    let plugin_log = fs::read_to_string(&plugin.log).unwrap();
    eprintln!("--- nvshim.log ---\n{shim_log}\n--- nvshim-nri ---\n{plugin_log}");
    for (who, log) in [("nvshim-runtime", &shim_log), ("nvshim-nri", &plugin_log)] {
        assert!(
            !log.lines()
                .any(|l| l.contains("ERROR") || l.contains("WARN")),
            "{who} logged a problem:\n{log}"
        );
    }
    drop(ctd);
    drop(plugin);
    assert_nothing_mounted_below(w.tmp.path());
}

/// A stand-in for the Kubernetes API's events endpoint (`POST /api/v1/namespaces/NS/events`,
/// answered 201 as kube-apiserver answers it), over HTTPS with a certificate openssl makes:
/// it takes requests with its bearer token only and keeps their paths and JSON bodies. The
/// plugin's request itself was checked by hand against kube-apiserver v1.36.2 (accepted,
/// shown by `kubectl describe pod`).
struct EventsEndpoint {
    /// A kubeconfig for `nvshim-nri --kubeconfig`: the server, its CA and the token.
    kubeconfig: PathBuf,
    posted: Arc<Mutex<Vec<(String, Value)>>>,
}

fn events_endpoint(dir: &Path) -> EventsEndpoint {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    const TOKEN: &str = "nvshim-nri-test-token";
    fs::create_dir_all(dir).unwrap();
    // A CA and the server's certificate it signs, as a cluster's are (webpki refuses a CA
    // certificate as the server's own).
    let (ca, ca_key) = (dir.join("ca.crt"), dir.join("ca.key"));
    let (cert, key) = (dir.join("server.crt"), dir.join("server.key"));
    let openssl = |subject: &str, key: &Path, cert: &Path, extra: &[&str]| {
        let made = Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
            ])
            .args([
                "-nodes",
                "-days",
                "1",
                "-subj",
                subject,
                "-keyout",
                s(key),
                "-out",
                s(cert),
            ])
            .args(extra)
            .output()
            .expect("openssl");
        assert!(made.status.success(), "{made:?}");
    };
    openssl("/CN=test-ca", &ca_key, &ca, &[]);
    let signed = [
        "-CA",
        s(&ca),
        "-CAkey",
        s(&ca_key),
        "-addext",
        "basicConstraints=CA:FALSE",
    ];
    let san = ["-addext", "subjectAltName=IP:127.0.0.1"];
    openssl(
        "/CN=127.0.0.1",
        &key,
        &cert,
        &[&signed[..], &san[..]].concat(),
    );
    let certs = CertificateDer::pem_file_iter(&cert)
        .unwrap()
        .map(Result::unwrap);
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs.collect(), PrivateKeyDer::from_pem_file(&key).unwrap())
    .unwrap();
    let config = Arc::new(config);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let posted = Arc::new(Mutex::new(Vec::new()));
    let kept = Arc::clone(&posted);
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let conn = rustls::ServerConnection::new(Arc::clone(&config)).unwrap();
            let mut tls = std::io::BufReader::new(rustls::StreamOwned::new(conn, stream));
            let (mut line, mut head) = (String::new(), Vec::new());
            while tls.read_line(&mut line).unwrap_or(0) > 2 {
                head.push(std::mem::take(&mut line).trim_end().to_string());
            }
            let header = |name: &str| {
                head.iter()
                    .find_map(|h| {
                        h.split_once(": ")
                            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
                    })
                    .map(|(_, v)| v.to_string())
            };
            let length = header("content-length")
                .and_then(|l| l.parse().ok())
                .unwrap_or(0);
            let mut body = vec![0; length];
            let _ = tls.read_exact(&mut body);
            let path = head.first().cloned().unwrap_or_default();
            let status = if header("authorization") == Some(format!("Bearer {TOKEN}")) {
                let doc = serde_json::from_slice(&body).unwrap_or(Value::Null);
                kept.lock().unwrap().push((path, doc));
                "201 Created"
            } else {
                "401 Unauthorized"
            };
            let tls = tls.get_mut();
            let answer = format!("HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}");
            let _ = tls.write_all(answer.as_bytes()).and_then(|()| tls.flush());
            tls.conn.send_close_notify();
            let _ = tls.flush();
        }
    });
    let kubeconfig = dir.join("kubeconfig");
    fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: test\nclusters:\n- name: test\n  cluster:\n    server: https://127.0.0.1:{port}\n    certificate-authority: ca.crt\ncontexts:\n- name: test\n  context: {{cluster: test, user: plugin}}\nusers:\n- name: plugin\n  user:\n    token: {TOKEN}\n"
        ),
    )
    .unwrap();
    EventsEndpoint { kubeconfig, posted }
}

/// Fail-open and fail-closed made visible to Kubernetes: a container created while the plugin
/// was down runs without its GPUs (fail-open) or is refused its start (`--mandatory`), and the
/// plugin, started with a kubeconfig, posts a Warning event on its pod (what `kubectl describe
/// pod` lists) naming the container: `GPUsMissing` or `GPURequestRefused`; one started while
/// the plugin was down is stopped under `--mandatory`, as `ContainerStoppedWithoutGPUs`.
#[test]
fn nri_plugin_puts_a_warning_event_on_the_pod() {
    if !nri_available() {
        return;
    }
    let _one_engine = serial();
    let w = World::builder().spec_dirs(SpecDirs::Run).build();
    let d = dir(&w, "nri-events");
    let nri_sock = d.join("nri.sock");
    let ctd = containerd_with_nri(&w, &d.join("ctd"), &nri_sock);
    ctd.import_images("k8s.io");
    let script = script(&w);
    let api = events_endpoint(&d.join("api"));
    let env = [("NVIDIA_VISIBLE_DEVICES", "1")];
    let tokio = cri::runtime();
    for (mode, reason) in [
        ("fail-open", "GPUsMissing"),
        ("mandatory", "GPURequestRefused"),
    ] {
        let mut extra = vec![
            "--kubeconfig",
            s(&api.kubeconfig),
            "--node-name",
            "gpu-node-1",
        ];
        if mode == "mandatory" {
            extra.push("--mandatory");
        }
        tokio.block_on(async {
            let channel = cri::connect(&ctd.sock).await;
            let mut pod = cri::run_pod(channel, "runc", &d.join(format!("pods-{mode}"))).await;
            let created = pod
                .create_container("unserved", &script, &env, &[], &[], &[])
                .await
                .expect("containerd creates containers with no NRI plugin");
            // Mandatory: also one started while the plugin is down, which it stops.
            if mode == "mandatory" {
                let running = pod
                    .create_container("unserved-running", "exec sleep 600", &env, &[], &[], &[])
                    .await
                    .expect("containerd creates containers with no NRI plugin");
                pod.start(&running)
                    .await
                    .expect("containerd starts containers with no NRI plugin");
            }
            let plugin = start_plugin(&w, &d.join(mode), &nri_sock, &extra, &[]);
            let started = pod.start_to_end("unserved", created).await;
            match mode {
                "mandatory" => assert!(started.is_err(), "{mode}: {started:?}"),
                _ => {
                    let out =
                        started.unwrap_or_else(|e| panic!("{mode}: {e}\n{}", logs(&plugin, &ctd)));
                    assert_gpus(&w, mode, &ProbeReport::parse(&out), &[]);
                }
            }
            let meta = pod.config.metadata.clone().unwrap();
            let start = Instant::now();
            let (line, body) = loop {
                let posted = api.posted.lock().unwrap().clone();
                let ours = |e: &Value| e["involvedObject"]["uid"] == *meta.uid;
                if let Some(e) = posted
                    .into_iter()
                    .find(|(_, e)| e["reason"] == reason && ours(e))
                {
                    break e;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "{mode}: no {reason} event posted\n{}",
                    logs(&plugin, &ctd)
                );
                sleep(Duration::from_millis(100));
            };
            let events = format!("POST /api/v1/namespaces/{}/events HTTP/1.1", meta.namespace);
            assert_eq!(line, events);
            assert_eq!(body["type"], "Warning");
            let o = &body["involvedObject"];
            assert_eq!(
                (
                    o["kind"].as_str(),
                    o["namespace"].as_str(),
                    o["name"].as_str()
                ),
                (Some("Pod"), Some(&*meta.namespace), Some(&*meta.name)),
                "{body}"
            );
            assert_eq!(o["fieldPath"], "spec.containers{unserved}");
            assert_eq!(body["source"]["host"], "gpu-node-1");
            let message = body["message"].as_str().unwrap();
            assert!(message.contains("container unserved"), "{message}");
            assert_eq!(
                message.contains("fail-open"),
                mode == "fail-open",
                "{message}"
            );
            if mode == "mandatory" {
                let start = Instant::now();
                let stopped = loop {
                    let posted = api.posted.lock().unwrap().clone();
                    if let Some((_, e)) = posted.into_iter().find(|(_, e)| {
                        e["reason"] == "ContainerStoppedWithoutGPUs"
                            && e["involvedObject"]["uid"] == *meta.uid
                    }) {
                        break e;
                    }
                    assert!(
                        start.elapsed() < Duration::from_secs(10),
                        "no ContainerStoppedWithoutGPUs event posted\n{}",
                        logs(&plugin, &ctd)
                    );
                    sleep(Duration::from_millis(100));
                };
                assert_eq!(
                    stopped["involvedObject"]["fieldPath"],
                    "spec.containers{unserved-running}"
                );
                let message = stopped["message"].as_str().unwrap();
                assert!(message.contains("SIGKILL"), "{message}");
            }
            pod.remove().await;
            drop(plugin);
        });
    }
    drop(ctd);
    assert_nothing_mounted_below(w.tmp.path());
}
