//! Packaging checks that need no daemon:
//! - every manifest under `packaging/kubernetes` parses as its Kubernetes API type
//!   (k8s-openapi, API 1.34) and survives the round trip: those types ignore unknown fields, so a
//!   misspelt field would otherwise be dropped silently, here as by the API server;
//! - what the manifests say to each other and to the installer script and image;
//! - the configs they and the packages install parse with nvshim's own config parser, and the
//!   defaults `packaging/config.toml` documents are nvshim's defaults.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::api::resource::v1::ResourceClaim;
use nvshim::config::Config;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
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

/// Every document of every manifest: (file, index in the file, document).
fn documents() -> Vec<(PathBuf, usize, Value)> {
    let mut files = Vec::new();
    yaml_files(&root().join("packaging/kubernetes"), &mut files);
    assert!(!files.is_empty(), "no manifests found");
    let mut docs = Vec::new();
    for file in files {
        let text = fs::read_to_string(&file).unwrap();
        assert!(
            !text.contains('\t'),
            "{}: tabs are not YAML indentation",
            file.display()
        );
        for (i, de) in serde_yaml::Deserializer::from_str(&text).enumerate() {
            let v = Value::deserialize(de)
                .unwrap_or_else(|e| panic!("{} document {i}: {e}", file.display()));
            if !v.is_null() {
                docs.push((file.clone(), i, v));
            }
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
}

fn manifests() -> Manifests {
    let mut m = Manifests::default();
    for (file, i, doc) in documents() {
        let what = format!("{} document {i}", file.display());
        let api = doc["apiVersion"].as_str().unwrap_or_default();
        let kind = doc["kind"].as_str().unwrap_or_default();
        match (api, kind) {
            ("v1", "Namespace") => m.namespaces.push(typed(&what, &doc)),
            ("v1", "ConfigMap") => m.config_maps.push(typed(&what, &doc)),
            ("v1", "Pod") => m.pods.push((file.clone(), typed(&what, &doc))),
            ("apps/v1", "DaemonSet") => m.daemon_sets.push(typed(&what, &doc)),
            ("node.k8s.io/v1", "RuntimeClass") => m.runtime_classes.push(typed(&what, &doc)),
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
    let rc = &m.runtime_classes[0];
    assert_eq!(rc.handler, nvshim::ops::engine::DEFAULT_RUNTIME_NAME);
    let name = rc.metadata.name.clone().unwrap();
    for (file, pod) in &m.pods {
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(
            spec.runtime_class_name.as_deref(),
            Some(name.as_str()),
            "{}: the example pods use the RuntimeClass",
            file.display()
        );
    }
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
    let m = manifests();
    let ds = &m.daemon_sets[0];
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
