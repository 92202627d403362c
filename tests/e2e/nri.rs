//! nvshim-nri, the NRI plugin, with containerd's CRI driven as the kubelet drives it and the
//! default `runc` handler: no `nvidia` runtime class, nvshim-runtime nowhere in the path. The
//! plugin gets its requests over containerd's NRI socket (turned on in the test's config,
//! as containerd 2.x has it by default) and each container's view of its GPUs is checked
//! from inside with the probe script. containerd 1.6 has no NRI: skipped there.

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
    let nri_sock = nri_sock.to_path_buf();
    let d2 = d.to_path_buf();
    Containerd::start_with(w, d, &["--nri"], move |doc| {
        let nri = &mut doc["plugins"]["io.containerd.nri.v1.nri"];
        nri["socket_path"] = toml_edit::value(s(&nri_sock));
        nri["plugin_path"] = toml_edit::value(s(&d2.join("nri-plugins")));
        nri["plugin_config_path"] = toml_edit::value(s(&d2.join("nri-conf")));
    })
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

fn logs(plugin: &Daemon, ctd: &Containerd) -> String {
    format!(
        "--- nvshim-nri ---\n{}\n--- containerd ---\n{}",
        plugin.log_tail(),
        ctd.log_tail()
    )
}

fn nri_available() -> bool {
    if containerd_version() < (1, 7) {
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
    let ctd = containerd_with_nri(&w, &d.join("ctd"), &nri_sock);
    ctd.import_images("k8s.io");
    let mut plugin = start_plugin(&w, &d, &nri_sock, &[], &[]);
    let script = script(&w);
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tokio.block_on(async {
        let channel = cri::connect(&ctd.sock).await;
        let mut pod = cri::run_pod(channel, "runc", &d.join("pods")).await;
        let cases: [(&str, &[Pair], &[Pair], usize); 3] = [
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
        // containerd 1.7.24 keeps the placeholder the plugin asks to remove (seen here); it is
        // the device plugin's `/dev/null`, harmless, and the GPU is served either way.
        if containerd_version() >= (2, 0) {
            assert!(
                !out.lines()
                    .any(|l| l.starts_with("DPMOUNT ") && l.contains("GPU-")),
                "{what}: the device plugin's mount is still there:\n{out}"
            );
        }
        w.configure("");
        pod.remove().await;
    });
    // How each was served, in the plugin's log: containerd 2.1 injects CDI devices named in
    // an adjustment itself; before it, the plugin sends the spec's edits.
    let log = fs::read_to_string(&plugin.log).unwrap();
    eprintln!("{log}");
    assert!(
        log.contains("container env ") && log.contains("raw adjustment"),
        "{log}"
    );
    let cdi_how = if containerd_version() >= (2, 1) {
        "NRI CDI injection"
    } else {
        "raw adjustment"
    };
    assert!(
        log.lines()
            .any(|l| l.contains("container annotation ") && l.contains(cdi_how)),
        "{log}"
    );
    // The engine restarted (a new containerd on the same NRI socket): the plugin connects
    // again by itself and serves the next pod.
    drop(ctd);
    let ctd = containerd_with_nri(&w, &d.join("ctd2"), &nri_sock);
    ctd.import_images("k8s.io");
    wait_registered(&mut plugin, 2);
    tokio.block_on(async {
        let channel = cri::connect(&ctd.sock).await;
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
    let ctd = containerd_with_nri(&w, &d.join("ctd"), &nri_sock);
    ctd.import_images("k8s.io");
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
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tokio.block_on(async {
        let channel = cri::connect(&ctd.sock).await;
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
        let channel = cri::connect(&ctd.sock).await;
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

/// The plugin killed: containerd creates the next container without asking anyone (NRI has
/// no plugin then). The plugin restarted, it finds that container at `Synchronize` and at
/// `StartContainer`, plans it again and, `--mandatory`, fails its start with the reason; at
/// its default (fail-open) the container runs, named in a warning. Served containers before
/// and after pass both checks.
#[test]
fn nri_plugin_restarted_finds_containers_created_without_it() {
    if !nri_available() {
        return;
    }
    let _one_engine = serial();
    let w = World::builder().spec_dirs(SpecDirs::Run).build();
    let d = dir(&w, "nri-restart");
    let nri_sock = d.join("nri.sock");
    let ctd = containerd_with_nri(&w, &d.join("ctd"), &nri_sock);
    ctd.import_images("k8s.io");
    let script = script(&w);
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let env = [("NVIDIA_VISIBLE_DEVICES", "1")];
    for (mode, extra) in [("mandatory", &["--mandatory"][..]), ("fail-open", &[][..])] {
        let plugin_dir = d.join(mode);
        let plugin = start_plugin(&w, &plugin_dir, &nri_sock, extra, &[]);
        tokio.block_on(async {
            let channel = cri::connect(&ctd.sock).await;
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
                    for needle in ["nvshim:", "unserved", "lacks device nodes"] {
                        assert!(err.contains(needle), "{needle:?} not in {err}\n{log}");
                    }
                }
                _ => {
                    let out = started.unwrap_or_else(|e| panic!("fail-open: {e}\n{log}"));
                    assert_gpus(&w, "fail-open, unserved", &ProbeReport::parse(&out), &[]);
                    assert!(log.contains("fail-open"), "{log}");
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
    let ctd = containerd_with_nri(&w, &d.join("ctd"), &nri_sock);
    ctd.import_images("k8s.io");
    let plugin = start_plugin(&w, &d, &nri_sock, &["--no-hooks"], &[]);
    let lib = w.host.container_lib_path("libcuda");
    let soname = format!("{}/libcuda.so.1", lib.rsplit_once('/').unwrap().0);
    let host_sum = sha256(&w.host.host_path(&lib));
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tokio.block_on(async {
        let channel = cri::connect(&ctd.sock).await;
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
/// as in [`super::super::userns`]. containerd 2.0 is the first with user-namespaced pods.
#[test]
fn nri_plugin_serves_a_user_namespaced_pod() {
    if !nri_available() || containerd_version() < (2, 0) {
        eprintln!("skipped: no NRI or no user-namespaced pods in this containerd");
        return;
    }
    use super::super::userns::{problems, script, HOST_ID, SIZE};
    let _one_engine = serial();
    let w = World::builder().spec_dirs(SpecDirs::Run).build();
    // runc init and the hook run as host uid 100000: the fake host must be reachable.
    fs::set_permissions(w.tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
    w.generate();
    let d = dir(&w, "nri-userns");
    let nri_sock = d.join("nri.sock");
    ptp_cni(&d.join("ctd"));
    let ctd = containerd_with_nri(&w, &d.join("ctd"), &nri_sock);
    ctd.import_images("k8s.io");
    let plugin = start_plugin(&w, &d, &nri_sock, &[], &[]);
    let script = script();
    let map = vec![k8s_cri::v1::IdMapping {
        host_id: HOST_ID,
        container_id: 0,
        length: SIZE,
    }];
    let userns = k8s_cri::v1::UserNamespace {
        mode: k8s_cri::v1::NamespaceMode::Pod as i32,
        uids: map.clone(),
        gids: map,
    };
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tokio.block_on(async {
        let channel = cri::connect(&ctd.sock).await;
        let mut pod = cri::run_pod_in(channel, "runc", &d.join("pods"), Some(userns)).await;
        let what = "NRI, user-namespaced pod, NVIDIA_VISIBLE_DEVICES=1";
        let env = [("NVIDIA_VISIBLE_DEVICES", "1")];
        let out = pod
            .run_container("env", &script, &env, &[], &[], &[])
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}\n{}", logs(&plugin, &ctd)));
        let report = ProbeReport::parse(&out);
        assert_no_problems(what, &problems(&w, &report, w.gpu(1)), &report);
        pod.remove().await;
    });
    drop(ctd);
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
/// pod` lists) naming the container: `GPUsMissing` or `GPURequestRefused`.
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
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
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
            pod.remove().await;
            drop(plugin);
        });
    }
    drop(ctd);
    assert_nothing_mounted_below(w.tmp.path());
}
