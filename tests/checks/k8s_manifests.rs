//! Packaging checks that need no daemon:
//! - every manifest under `packaging/kubernetes` parses as its Kubernetes API type
//!   (k8s-openapi, API 1.34) and survives the round trip: those types ignore unknown fields, so a
//!   misspelt field would otherwise be dropped silently, here as by the API server;
//! - every kustomization there (the base and each overlay) renders with `kubectl kustomize`,
//!   and what it renders passes the same checks; an overlay's config is the base's with only
//!   its own settings changed ([`OVERLAY_SETTINGS`]). Without kubectl these are skipped, except
//!   under `CI=true`, where they fail (scripts/install-engines.sh fetches sid's kubectl);
//! - what the manifests say to each other and to the installer script and image;
//! - the configs they and the packages install parse with nvshim's own config parser, and the
//!   defaults `packaging/config.toml` documents are nvshim's defaults.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, ServiceAccount};
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::api::resource::v1::ResourceClaim;
use nvshim::config::Config;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn kubernetes_dir() -> PathBuf {
    root().join("packaging/kubernetes")
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            yaml_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(path);
        }
    }
    out.sort();
}

/// The YAML documents of `text`, `what` naming it in errors.
fn parse_documents(what: &str, text: &str) -> Vec<(usize, Value)> {
    assert!(
        !text.contains('\t'),
        "{what}: tabs are not YAML indentation"
    );
    let mut docs = Vec::new();
    for (i, de) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let v = Value::deserialize(de).unwrap_or_else(|e| panic!("{what} document {i}: {e}"));
        if !v.is_null() {
            docs.push((i, v));
        }
    }
    docs
}

/// Every document of every manifest: (file, index in the file, document). The overlays'
/// files and the kustomizations are kustomize input, checked as what they render
/// ([`every_kustomization_renders_valid_manifests`]).
fn documents() -> Vec<(PathBuf, usize, Value)> {
    let mut files = Vec::new();
    yaml_files(&kubernetes_dir(), &mut files);
    files.retain(|f| {
        !f.starts_with(kubernetes_dir().join("overlays"))
            && f.file_name().is_some_and(|n| n != "kustomization.yaml")
    });
    assert!(!files.is_empty(), "no manifests found");
    let mut docs = Vec::new();
    for file in files {
        let text = fs::read_to_string(&file).unwrap();
        for (i, v) in parse_documents(&file.display().to_string(), &text) {
            docs.push((file.clone(), i, v));
        }
    }
    docs
}

/// Paths present in `original` that the typed round trip lost or changed.
fn lost(original: &Value, typed: &Value, path: &str, out: &mut Vec<String>) {
    match (original, typed) {
        (Value::Object(o), Value::Object(t)) => {
            for (k, v) in o {
                let p = format!("{path}.{k}");
                match t.get(k) {
                    Some(tv) => lost(v, tv, &p, out),
                    None => out.push(format!("{p} (unknown field?)")),
                }
            }
        }
        (Value::Array(o), Value::Array(t)) if o.len() == t.len() => {
            for (i, (a, b)) in o.iter().zip(t).enumerate() {
                lost(a, b, &format!("{path}[{i}]"), out);
            }
        }
        (a, b) if a == b => {}
        (a, b) => out.push(format!("{path}: {a} became {b}")),
    }
}

fn typed<T: DeserializeOwned + Serialize>(what: &str, doc: &Value) -> T {
    let t: T = serde_json::from_value(doc.clone()).unwrap_or_else(|e| panic!("{what}: {e}"));
    let back = serde_json::to_value(&t).unwrap();
    let mut problems = Vec::new();
    lost(doc, &back, "", &mut problems);
    assert!(
        problems.is_empty(),
        "{what}: not what the API types say:\n  {}",
        problems.join("\n  ")
    );
    t
}

/// All the manifests, typed.
#[derive(Default)]
struct Manifests {
    namespaces: Vec<Namespace>,
    config_maps: Vec<ConfigMap>,
    daemon_sets: Vec<DaemonSet>,
    runtime_classes: Vec<RuntimeClass>,
    pods: Vec<(PathBuf, Pod)>,
    claims: Vec<(PathBuf, ResourceClaim)>,
    service_accounts: Vec<ServiceAccount>,
    cluster_roles: Vec<ClusterRole>,
    cluster_role_bindings: Vec<ClusterRoleBinding>,
}

fn manifests() -> Manifests {
    typed_manifests(documents())
}

fn typed_manifests(docs: Vec<(PathBuf, usize, Value)>) -> Manifests {
    let mut m = Manifests::default();
    for (file, i, doc) in docs {
        let what = format!("{} document {i}", file.display());
        let api = doc["apiVersion"].as_str().unwrap_or_default();
        let kind = doc["kind"].as_str().unwrap_or_default();
        match (api, kind) {
            ("v1", "Namespace") => m.namespaces.push(typed(&what, &doc)),
            ("v1", "ConfigMap") => m.config_maps.push(typed(&what, &doc)),
            ("v1", "Pod") => m.pods.push((file.clone(), typed(&what, &doc))),
            ("apps/v1", "DaemonSet") => m.daemon_sets.push(typed(&what, &doc)),
            ("node.k8s.io/v1", "RuntimeClass") => m.runtime_classes.push(typed(&what, &doc)),
            ("v1", "ServiceAccount") => m.service_accounts.push(typed(&what, &doc)),
            ("rbac.authorization.k8s.io/v1", "ClusterRole") => {
                m.cluster_roles.push(typed(&what, &doc))
            }
            ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
                m.cluster_role_bindings.push(typed(&what, &doc))
            }
            ("resource.k8s.io/v1", "ResourceClaim") => {
                m.claims.push((file.clone(), typed(&what, &doc)))
            }
            _ => panic!("{what}: {api}/{kind} is not checked by this test: add it"),
        }
    }
    m
}

#[test]
fn every_manifest_is_a_valid_api_object() {
    let m = manifests();
    assert_eq!(m.daemon_sets.len(), 1);
    assert_eq!(m.runtime_classes.len(), 1);
    assert!(m.pods.len() >= 2, "the two example pods");
    assert_eq!(m.claims.len(), 1);
}

#[test]
fn a_typo_is_caught() {
    let doc: Value = serde_yaml::from_str(
        "apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata: {name: nvidia}\nhandler: nvidia\nschedulng: {}\n",
    )
    .unwrap();
    let err = std::panic::catch_unwind(|| typed::<RuntimeClass>("typo", &doc)).unwrap_err();
    let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(msg.contains(".schedulng (unknown field?)"), "{msg}");
}

#[test]
fn runtime_class_names_the_handler_nvshim_registers() {
    let m = manifests();
    check_runtime_class(&m);
    let name = m.runtime_classes[0].metadata.name.clone().unwrap();
    for (file, pod) in &m.pods {
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(
            spec.runtime_class_name.as_deref(),
            Some(name.as_str()),
            "{}: the example pods use the RuntimeClass",
            file.display()
        );
    }
}

/// The RuntimeClass names the handler nvshim registers, on the nodes the installer runs on.
fn check_runtime_class(m: &Manifests) {
    let rc = &m.runtime_classes[0];
    assert_eq!(rc.handler, nvshim::ops::engine::DEFAULT_RUNTIME_NAME);
    // Pods of the class are scheduled only where the installer registers the handler.
    let ds_spec = m.daemon_sets[0]
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .clone()
        .unwrap();
    assert_eq!(
        rc.scheduling.as_ref().unwrap().node_selector,
        ds_spec.node_selector,
        "RuntimeClass scheduling and DaemonSet nodeSelector"
    );
}

#[test]
fn dra_example_claims_a_gpu_the_pod_uses() {
    let m = manifests();
    let (claim_file, claim) = &m.claims[0];
    let requests = &claim
        .spec
        .devices
        .as_ref()
        .unwrap()
        .requests
        .as_ref()
        .unwrap();
    assert_eq!(
        requests[0].exactly.as_ref().unwrap().device_class_name,
        "gpu.nvidia.com"
    );
    let claim_name = claim.metadata.name.clone().unwrap();
    let (_, pod) = m
        .pods
        .iter()
        .find(|(f, _)| f == claim_file)
        .expect("the DRA pod is in the claim's file");
    let spec = pod.spec.as_ref().unwrap();
    let pod_claims = spec.resource_claims.as_ref().unwrap();
    assert_eq!(
        pod_claims[0].resource_claim_name.as_deref(),
        Some(claim_name.as_str())
    );
    let container_claims = spec.containers[0]
        .resources
        .as_ref()
        .unwrap()
        .claims
        .as_ref()
        .unwrap();
    assert_eq!(container_claims[0].name, pod_claims[0].name);
}

#[test]
fn env_example_asks_with_nvidia_visible_devices() {
    let m = manifests();
    let asks = m.pods.iter().any(|(_, p)| {
        p.spec.as_ref().unwrap().containers.iter().any(|c| {
            c.env
                .iter()
                .flatten()
                .any(|e| e.name == "NVIDIA_VISIBLE_DEVICES")
        })
    });
    assert!(asks);
}

#[test]
fn daemon_set_matches_the_installer_script_and_image() {
    check_daemon_set(&manifests());
}

/// The DaemonSet agrees with the installer script, the image and its ConfigMap; returns the
/// config file it installs, checked with nvshim's parser.
fn check_daemon_set(m: &Manifests) -> String {
    let ds = m
        .daemon_sets
        .iter()
        .find(|d| d.metadata.name.as_deref() == Some("nvshim-installer"))
        .expect("the installer DaemonSet");
    let spec = ds.spec.as_ref().unwrap();
    let labels = spec
        .template
        .metadata
        .as_ref()
        .unwrap()
        .labels
        .clone()
        .unwrap();
    for (k, v) in spec.selector.match_labels.as_ref().unwrap() {
        assert_eq!(
            labels.get(k),
            Some(v),
            "selector {k}={v} does not match the pod template"
        );
    }
    let pod = spec.template.spec.as_ref().unwrap();
    assert_eq!(
        pod.host_pid,
        Some(true),
        "restarting containerd needs the host's PID 1"
    );
    let c = &pod.containers[0];
    assert_eq!(
        c.image.as_deref(),
        Some(format!("nvshim-installer:{}", env!("CARGO_PKG_VERSION")).as_str()),
        "the tag scripts/build-installer-image.sh gives the image"
    );
    let script = fs::read_to_string(root().join("packaging/kubernetes/nvshim-install.sh")).unwrap();
    let builder = fs::read_to_string(root().join("scripts/build-installer-image.sh")).unwrap();
    let command = c.command.as_ref().unwrap();
    assert_eq!(command[0], "/usr/bin/nvshim-install");
    assert!(
        builder.contains("usr/bin/nvshim-install"),
        "the image builder installs the entrypoint"
    );
    let env: BTreeMap<String, String> = c
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect();
    for name in env.keys() {
        assert!(
            script.contains(&format!("${{{name}")),
            "nvshim-install.sh does not read {name}"
        );
    }
    // The mounts are where the environment says.
    let mounts: BTreeMap<String, String> = c
        .volume_mounts
        .iter()
        .flatten()
        .map(|v| (v.name.clone(), v.mount_path.clone()))
        .collect();
    let host_volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.host_path.as_ref().is_some_and(|h| h.path == "/"))
        .expect("the host's root as a hostPath volume");
    assert_eq!(mounts.get(&host_volume.name), env.get("HOST_ROOT"));
    let config_volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.config_map.is_some())
        .expect("the config as a ConfigMap volume");
    let config_dir = Path::new(&env["NVSHIM_CONFIG_SOURCE"])
        .parent()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    assert_eq!(mounts.get(&config_volume.name), Some(&config_dir));
    let cm_name = config_volume.config_map.as_ref().unwrap().name.clone();
    let ns = ds.metadata.namespace.clone();
    let cm = m
        .config_maps
        .iter()
        .find(|cm| {
            cm.metadata.name.as_deref() == Some(cm_name.as_str()) && cm.metadata.namespace == ns
        })
        .expect("the ConfigMap the DaemonSet mounts, in its namespace");
    assert!(
        m.namespaces.iter().any(|n| n.metadata.name == ns),
        "the namespace is created"
    );
    let file = Path::new(&env["NVSHIM_CONFIG_SOURCE"])
        .file_name()
        .unwrap()
        .to_str()
        .unwrap();
    let toml = &cm.data.as_ref().unwrap()[file];
    Config::parse(Path::new("ConfigMap nvshim-config"), toml).unwrap();
    toml.clone()
}

/// overlays/nri: the plugin runs the binary the installer puts on the host, from the
/// installer's image, in the host's pid namespace, and the installer turns containerd's NRI
/// on (`--nri`).
fn check_nri_daemon_set(m: &Manifests) {
    let by_name = |n: &str| {
        m.daemon_sets
            .iter()
            .find(|d| d.metadata.name.as_deref() == Some(n))
            .unwrap_or_else(|| panic!("DaemonSet {n}"))
    };
    let pod_spec = |n: &str| {
        let spec = by_name(n).spec.as_ref().unwrap();
        spec.template.spec.clone().unwrap()
    };
    let container = |n: &str| pod_spec(n).containers[0].clone();
    let installer = container("nvshim-installer");
    let plugin = container("nvshim-nri");
    // `--mandatory` kills a container's process by the pid the engine gives (nri/src/stop.rs).
    assert_eq!(
        pod_spec("nvshim-nri").host_pid,
        Some(true),
        "nvshim-nri needs hostPID"
    );
    assert_eq!(plugin.image, installer.image, "the installer's image");
    let env: BTreeMap<String, String> = installer
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect();
    assert_eq!(env.get("ENABLE_NRI").map(String::as_str), Some("true"));
    let command = plugin.command.unwrap().join(" ");
    let installed = format!("{}/bin/nvshim-nri", env["NVSHIM_INSTALL_DIR"]);
    assert!(
        command.contains(&format!("chroot {} {installed}", env["HOST_ROOT"])),
        "{command}: runs the installed {installed} in the host's root"
    );
    let script = fs::read_to_string(root().join("packaging/kubernetes/nvshim-install.sh")).unwrap();
    assert!(script.contains("nvshim-nri") && script.contains("--nri"));
    // Both pods start while the plugin is absent where REQUIRE_NRI (`--nri-required`) made
    // containerd require it: the annotation configure names.
    assert!(script.contains("REQUIRE_NRI") && script.contains("--nri-required"));
    let annotation = nvshim::ops::engine::containerd::NRI_TOLERATE_ANNOTATION;
    for name in ["nvshim-installer", "nvshim-nri"] {
        let annotations = by_name(name)
            .spec
            .as_ref()
            .unwrap()
            .template
            .metadata
            .as_ref()
            .and_then(|m| m.annotations.clone())
            .unwrap_or_default();
        assert_eq!(
            annotations.get(annotation).map(String::as_str),
            Some("true"),
            "{name}: {annotations:?}"
        );
    }
    // Its Kubernetes events: posted as its service account, bound to a role that creates them.
    let pod = pod_spec("nvshim-nri");
    let sa = pod
        .service_account_name
        .as_deref()
        .expect("serviceAccountName");
    let ns = by_name("nvshim-nri").metadata.namespace.clone();
    assert!(m
        .service_accounts
        .iter()
        .any(|a| a.metadata.name.as_deref() == Some(sa) && a.metadata.namespace == ns));
    let binding = m
        .cluster_role_bindings
        .iter()
        .find(|b| {
            b.subjects
                .iter()
                .flatten()
                .any(|s| s.kind == "ServiceAccount" && s.name == sa && s.namespace == ns)
        })
        .expect("a ClusterRoleBinding of the plugin's service account");
    let role = m
        .cluster_roles
        .iter()
        .find(|r| r.metadata.name.as_deref() == Some(binding.role_ref.name.as_str()))
        .expect("the bound ClusterRole");
    assert!(role.rules.iter().flatten().any(|r| {
        r.resources.iter().flatten().any(|x| x == "events")
            && r.api_groups.iter().flatten().any(|g| g.is_empty())
            && r.verbs.iter().any(|v| v == "create")
    }));
    let node = plugin.env.iter().flatten().find(|e| e.name == "NODE_NAME");
    let field = node.and_then(|e| e.value_from.as_ref()?.field_ref.as_ref());
    assert_eq!(field.map(|f| f.field_path.as_str()), Some("spec.nodeName"));
}

/// What each overlay changes in the base's config, and nothing else (the rest of its config
/// file is the base's). An overlay that is not here fails the check until it is added.
const OVERLAY_SETTINGS: &[(&str, &[(&str, &str)])] = &[
    (
        "driver-container",
        &[("driver-root", "\"/run/nvidia/driver\"")],
    ),
    ("gpu-operator", &[("driver-root", "\"/run/nvidia/driver\"")]),
    ("nri", &[]),
    (
        "strict",
        &[
            ("accept-envvar-unprivileged", "false"),
            ("accept-volume-mounts", "false"),
            ("accept-docker-gpus-hook", "false"),
        ],
    ),
];

/// The kubectl to render with: `$NVSHIM_KUBECTL`, else `kubectl` on PATH. `None` (the check
/// skipped) without one, except under `CI=true`.
fn kubectl() -> Option<PathBuf> {
    let found = std::env::var_os("NVSHIM_KUBECTL")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
                .map(|d| d.join("kubectl"))
                .find(|p| p.is_file())
        });
    if found.is_none() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "no kubectl to render packaging/kubernetes with: scripts/install-engines.sh sid \
             fetches Debian sid's (scripts/test.sh sets NVSHIM_KUBECTL to it)"
        );
        eprintln!("kustomize checks skipped: no kubectl (set NVSHIM_KUBECTL or put it on PATH)");
    }
    found
}

/// `kubectl kustomize dir`, as documents.
fn render(kubectl: &Path, dir: &Path) -> Vec<(PathBuf, usize, Value)> {
    let out = Command::new(kubectl)
        .arg("kustomize")
        .arg(dir)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", kubectl.display()));
    let what = format!("kubectl kustomize {}", dir.display());
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    parse_documents(&what, &text)
        .into_iter()
        .map(|(i, v)| (PathBuf::from(&what), i, v))
        .collect()
}

fn toml_table(what: &str, text: &str) -> toml::Table {
    text.parse()
        .unwrap_or_else(|e| panic!("{what}: config.toml: {e}"))
}

#[test]
fn every_kustomization_renders_valid_manifests() {
    let Some(kubectl) = kubectl() else {
        return;
    };
    let base = typed_manifests(render(&kubectl, &kubernetes_dir().join("base")));
    assert_eq!(base.namespaces.len(), 1);
    assert_eq!(base.runtime_classes.len(), 1);
    check_runtime_class(&base);
    let base_config = toml_table("base", &check_daemon_set(&base));

    let mut overlays: Vec<PathBuf> = fs::read_dir(kubernetes_dir().join("overlays"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("kustomization.yaml").is_file())
        .collect();
    overlays.sort();
    assert!(overlays.len() >= OVERLAY_SETTINGS.len());
    for dir in overlays {
        let name = dir.file_name().unwrap().to_str().unwrap().to_string();
        let m = typed_manifests(render(&kubectl, &dir));
        // overlays/nri adds the NRI plugin's DaemonSet beside the installer.
        let plugins = usize::from(name == "nri");
        assert_eq!(m.daemon_sets.len(), 1 + plugins, "{name}: one installer");
        if plugins == 1 {
            check_nri_daemon_set(&m);
        }
        assert_eq!(m.config_maps.len(), 1, "{name}: one ConfigMap");
        assert!(
            m.pods.is_empty() && m.claims.is_empty(),
            "{name}: no examples"
        );
        // The GPU Operator creates and owns RuntimeClass `nvidia` itself.
        if name == "gpu-operator" {
            assert!(
                m.runtime_classes.is_empty(),
                "{name}: the operator's RuntimeClass"
            );
        } else {
            assert_eq!(m.runtime_classes.len(), 1, "{name}");
            check_runtime_class(&m);
        }
        let config = toml_table(&name, &check_daemon_set(&m));
        let Some((_, settings)) = OVERLAY_SETTINGS.iter().find(|(n, _)| *n == name) else {
            panic!("overlays/{name}: say what it changes in OVERLAY_SETTINGS");
        };
        let mut expected = base_config.clone();
        for (key, value) in *settings {
            let value: toml::Table = format!("v = {value}").parse().unwrap();
            expected.insert(key.to_string(), value["v"].clone());
        }
        assert_eq!(
            config, expected,
            "overlays/{name}/config.yaml: the base's config.toml with only {settings:?} changed \
             (copy the base's file again and set those)"
        );
    }
}

/// `packaging/config.toml` (the packages' /etc/nvshim/config.toml): parses to the defaults, and
/// so does every commented-out `#key = value` line, uncommented: the documented defaults are the
/// real ones.
#[test]
fn packaged_config_documents_the_defaults() {
    let path = root().join("packaging/config.toml");
    let text = fs::read_to_string(&path).unwrap();
    assert_eq!(Config::parse(&path, &text).unwrap(), Config::default());
    let uncommented: String = text
        .lines()
        .map(|l| match l.strip_prefix('#') {
            Some(rest)
                if rest.split_once(" = ").is_some_and(|(k, _)| {
                    !k.is_empty() && k.chars().all(|c| c.is_ascii_lowercase() || c == '-')
                }) =>
            {
                rest
            }
            _ => l,
        })
        .map(|l| format!("{l}\n"))
        .collect();
    let keys = uncommented
        .lines()
        .filter(|l| l.contains(" = ") && !l.starts_with('#'))
        .count();
    assert!(
        keys >= 10,
        "expected the documented keys, found {keys}:\n{uncommented}"
    );
    assert_eq!(
        Config::parse(&path, &uncommented).unwrap(),
        Config::default()
    );
}
