//! Conformance cases from the CDI reference (docs/cdi-rules.md §6): versions, decoding,
//! validation, names, spec directories and conflicts, and edit application with exact
//! before/after config.json. Each test names the reference test it follows.
//!
//! One file (all 1150 lines are tests, compiled only under `cfg(test)`): one suite that follows the
//! reference's test files section by section in the order of docs/cdi-rules.md, sharing the spec,
//! directory and before/after helpers at its top.

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::registry::{Registry, ScanError};
use super::spec::{self, Spec};
use crate::edits::{self, ContainerEdits, DeviceNode, Hook, IntelRdt, Mount, NetDevice};

fn spec_from(yaml: &str) -> Spec {
    spec::parse(yaml.as_bytes()).unwrap_or_else(|e| panic!("{e}\n{yaml}"))
}

fn validate(yaml: &str) -> Result<(), String> {
    let s = spec::parse(yaml.as_bytes()).map_err(|e| format!("parse: {e}"))?;
    s.validate().map_err(|e| e.to_string())
}

/// A spec with one device `dev` carrying `edits` and the given version.
fn with_edits(version: &str, edits: ContainerEdits) -> Spec {
    Spec {
        cdi_version: version.into(),
        kind: "vendor.com/device".into(),
        devices: vec![spec::Device {
            name: "dev".into(),
            container_edits: ContainerEdits {
                env: vec!["X=1".into()],
                ..Default::default()
            },
            ..Default::default()
        }],
        container_edits: edits,
        ..Default::default()
    }
}

// ---- docs/cdi-rules.md §1: versions (specs-go/version_test.go) ----

#[test]
fn minimum_required_version() {
    let base = || with_edits("1.1.0", ContainerEdits::default());
    assert_eq!(base().minimum_version(), "0.3.0", "empty spec");

    let mut s = base();
    s.container_edits.mounts.push(Mount {
        host_path: "/a".into(),
        container_path: "/a".into(),
        kind: Some("tmpfs".into()),
        options: vec![],
    });
    assert_eq!(s.minimum_version(), "0.4.0", "mount type");

    let mut s = base();
    s.container_edits.device_nodes.push(DeviceNode {
        path: "/dev/x".into(),
        host_path: Some("/dev/x".into()),
        ..Default::default()
    });
    assert_eq!(s.minimum_version(), "0.5.0", "hostPath, even equal to path");

    let mut s = base();
    s.devices[0].name = "0example".into();
    assert_eq!(
        s.minimum_version(),
        "0.5.0",
        "device name starting with a digit"
    );
    s.devices[0].name = "device0".into();
    assert_eq!(s.minimum_version(), "0.3.0", "device0");
    s.devices[0].name = "0".into();
    assert_eq!(s.minimum_version(), "0.5.0", "device name 0");

    let mut s = base();
    s.annotations.insert("a".into(), "b".into());
    assert_eq!(s.minimum_version(), "0.6.0", "spec annotation");
    let mut s = base();
    s.devices[0].annotations.insert("a".into(), "b".into());
    assert_eq!(s.minimum_version(), "0.6.0", "device annotation");
    let mut s = base();
    s.kind = "example.com/example.class".into();
    assert_eq!(s.minimum_version(), "0.6.0", "dot in class");

    let mut s = base();
    s.container_edits.additional_gids = vec![1];
    assert_eq!(s.minimum_version(), "0.7.0", "additionalGids");
    let mut s = base();
    s.devices[0].container_edits.additional_gids = vec![1];
    assert_eq!(s.minimum_version(), "0.7.0", "device-scoped gids");
    let mut s = base();
    s.container_edits.intel_rdt = Some(IntelRdt::default());
    assert_eq!(s.minimum_version(), "0.7.0", "intelRdt: {{}}");
    let mut s = base();
    s.devices[0].container_edits.intel_rdt = Some(IntelRdt::default());
    assert_eq!(s.minimum_version(), "0.7.0", "device intelRdt");

    let mut s = base();
    s.container_edits.intel_rdt = Some(IntelRdt {
        schemata: Some(vec![]),
        ..Default::default()
    });
    assert_eq!(s.minimum_version(), "1.1.0", "explicit empty schemata");
    let mut s = base();
    s.container_edits.intel_rdt = Some(IntelRdt {
        enable_monitoring: Some(true),
        ..Default::default()
    });
    assert_eq!(s.minimum_version(), "1.1.0", "enableMonitoring");
    let mut s = base();
    s.container_edits.intel_rdt = Some(IntelRdt {
        enable_monitoring: Some(false),
        ..Default::default()
    });
    assert_eq!(
        s.minimum_version(),
        "0.7.0",
        "enableMonitoring false is unset"
    );
    let mut s = base();
    s.devices[0]
        .container_edits
        .net_devices
        .push(NetDevice::default());
    assert_eq!(s.minimum_version(), "1.1.0", "netDevices [{{}}]");

    // The newest feature wins.
    let mut s = base();
    s.annotations.insert("a".into(), "b".into());
    s.container_edits.additional_gids = vec![1];
    s.container_edits.net_devices.push(NetDevice::default());
    assert_eq!(s.minimum_version(), "1.1.0");
}

#[test]
fn validate_version() {
    let v = |version: &str, gids: bool| {
        let mut s = with_edits(version, ContainerEdits::default());
        if gids {
            s.container_edits.additional_gids = vec![5];
        }
        s.validate_version().map_err(|e| e.to_string())
    };
    assert_eq!(v("1.1.0", false), Ok(()));
    assert_eq!(v("v1.1.0", false), Ok(()));
    assert_eq!(v("0.3.0", false), Ok(()));
    assert_eq!(
        v("0.1.0", false),
        Err("the spec version must be at least v0.3.0".into())
    );
    assert_eq!(
        v("v0.2.0", false),
        Err("the spec version must be at least v0.3.0".into())
    );
    // A version nvshim does not read (the proposed 1.2.0) fails naming it and those it reads.
    let e = v("1.2.0", false).unwrap_err();
    assert!(e.starts_with("invalid version \"1.2.0\": nvshim reads CDI spec versions 1.1.0, 1.0.0, 0.8.0, 0.7.0, 0.6.0, 0.5.0, 0.4.0, 0.3.0;"), "{e}");
    for bad in ["not-a-version", "", "1.1", "1.1.0-rc1", "0.0.0", "vv1.1.0"] {
        assert!(
            v(bad, false).unwrap_err().starts_with("invalid version"),
            "{bad}"
        );
    }
    assert_eq!(
        v("0.6.0", true),
        Err("the spec version must be at least v0.7.0".into())
    );
    assert_eq!(v("0.7.0", true), Ok(()));
    assert_eq!(v("1.1.0", true), Ok(()));
    // Newer than needed is fine.
    assert_eq!(v("1.0.0", false), Ok(()));
}

// ---- docs/cdi-rules.md §2.2, §2.3: decoding and validation (pkg/cdi/spec_test.go,
// device_test.go) ----

#[test]
fn read_spec_cases() {
    // TestReadSpec / TestNewSpec.
    assert!(validate("xyzzy: garbled\n")
        .unwrap_err()
        .contains("unknown field \"xyzzy\""));
    assert_eq!(
        validate(
            "kind: vendor.com/device\ndevices:\n- name: d\n  containerEdits:\n    env: [A=1]\n"
        ),
        Err(spec::SpecError::InvalidVersion {
            declared: String::new()
        }
        .to_string())
    );
    assert!(matches!(spec::parse(b""), Err(spec::ParseError::NoData)));
    assert!(matches!(
        spec::parse(b"---\n"),
        Err(spec::ParseError::NoData)
    ));
    assert_eq!(
        validate("cdiVersion: 0.3.0\nkind: vendor.com/device\ndevices:\n- name: d\n  containerEdits:\n    env: [A=1]\n"),
        Ok(())
    );
    assert!(validate("cdiVersion: 0.0.0\nkind: vendor.com/device\ndevices: [{name: d, containerEdits: {env: [A=1]}}]").unwrap_err().contains("invalid version"));
    assert_eq!(
        validate("cdiVersion: 0.3.0\ndevices: [{name: d, containerEdits: {env: [A=1]}}]"),
        Err("invalid vendor. empty name".into()),
        "missing kind"
    );
    assert_eq!(
        validate("cdiVersion: 0.3.0\nkind: vendor.com-/device\ndevices: [{name: d, containerEdits: {env: [A=1]}}]"),
        Err("invalid vendor. \"vendor.com-\", should end with a letter or digit".into())
    );
    assert_eq!(
        validate("cdiVersion: 0.3.0\nkind: vendor.com/device=\ndevices: [{name: d, containerEdits: {env: [A=1]}}]"),
        Err("invalid class. \"device=\", should end with a letter or digit".into())
    );
    assert_eq!(
        validate("cdiVersion: 0.3.0\nkind: vendor.com/device\ndevices: [{name: dev1}]"),
        Err("failed add device \"dev1\": invalid device, empty device edits".into())
    );
    assert_eq!(
        validate("cdiVersion: 0.3.0\nkind: vendor.com/device\ndevices: [{name: dev1, containerEdits: {env: [A=1]}}, {name: dev1, containerEdits: {env: [B=1]}}]"),
        Err("invalid spec, multiple device \"dev1\"".into())
    );
    assert_eq!(
        validate("cdiVersion: 0.3.0\nkind: vendor.com/device\ndevices: [{name: dev1, containerEdits: {env: [A=1]}}, {name: dev2, containerEdits: {env: [B=1]}}, {name: dev3, containerEdits: {env: [C=1]}}]"),
        Ok(())
    );
    assert_eq!(
        validate("cdiVersion: 0.3.0\nkind: vendor.com/device\ndevices: []"),
        Err("invalid spec, no devices".into())
    );
    // device_test.go
    assert_eq!(
        validate("cdiVersion: 0.3.0\nkind: vendor.com/device\ndevices: [{name: dev, containerEdits: {env: [\"=BAR\"]}}]"),
        Err("failed add device \"dev\": invalid device \"dev\": invalid container edits: invalid environment variable \"=BAR\"".into())
    );
    assert_eq!(
        validate("cdiVersion: 0.3.0\nkind: vendor.com/device\ndevices: [{name: a dev ice, containerEdits: {env: [A=1]}}]"),
        Err("failed add device \"a dev ice\": invalid character ' ' in device name \"a dev ice\"".into())
    );
    // A leading digit needs 0.5.0.
    assert_eq!(
        validate("cdiVersion: 0.4.0\nkind: vendor.com/device\ndevices: [{name: \"0\", containerEdits: {env: [A=1]}}]"),
        Err("the spec version must be at least v0.5.0".into())
    );
}

#[test]
fn decoding_quirks() {
    // An unquoted numeric device name is the string "0"; fileMode 0666 is octal (YAML 1.1);
    // keys match case-insensitively.
    let s = spec_from(
        "CDIVersion: 0.5.0\nKIND: vendor.com/device\ndevices:\n- name: 0\n  containerEdits:\n    deviceNodes:\n    - path: /dev/x\n      fileMode: 0666\n",
    );
    assert_eq!(s.devices[0].name, "0");
    assert_eq!(
        s.devices[0].container_edits.device_nodes[0].file_mode,
        Some(0o666)
    );
    assert_eq!(s.cdi_version, "0.5.0");
    // Type mismatches fail.
    for bad in [
        "cdiVersion: 0.3.0\nkind: v.com/d\ndevices: [{name: d, containerEdits: {deviceNodes: [{path: /dev/x, major: \"195\"}]}}]",
        "cdiVersion: 0.3.0\nkind: v.com/d\ndevices: [{name: d, containerEdits: {deviceNodes: [{path: /dev/x, uid: -1}]}}]",
        "cdiVersion: 0.3.0\nkind: v.com/d\ndevices: [{name: d, containerEdits: {deviceNodes: [{path: /dev/x, fileMode: rw}]}}]",
        // enableCMT/enableMBM were removed in 1.1.0: unknown fields now.
        "cdiVersion: 0.7.0\nkind: v.com/d\ndevices: [{name: d, containerEdits: {intelRdt: {enableCMT: true}}}]",
        // containerEdits is an object, not SPEC.md's array.
        "cdiVersion: 0.3.0\nkind: v.com/d\ncontainerEdits: []\ndevices: [{name: d, containerEdits: {env: [A=1]}}]",
    ] {
        assert!(spec::parse(bad.as_bytes()).is_err(), "{bad}");
    }
    // Negative timeouts decode (a Go int).
    let s = spec_from("cdiVersion: 0.3.0\nkind: v.com/d\ndevices: [{name: d, containerEdits: {hooks: [{hookName: poststop, path: /x, timeout: -1}]}}]");
    assert_eq!(s.devices[0].container_edits.hooks[0].timeout, Some(-1));
}

/// `schema/testdata`: the on-disk fixtures.
#[test]
fn schema_fixtures() {
    let minimal = r#"{
  "cdiVersion": "0.3.0",
  "kind": "vendor.com/device",
  "devices": [
    {
      "name": "myDevice",
      "containerEdits": {
        "deviceNodes": [
          {"path": "/dev/card1"}
        ]
      }
    }
  ]
}"#;
    assert_eq!(validate(minimal), Ok(()));
    let example = r#"{
  "cdiVersion": "0.6.0",
  "kind": "vendor.com/device",
  "devices": [
    {
      "name": "myDevice",
      "containerEdits": {
        "deviceNodes": [
          {"hostPath": "/vendor/dev/card1", "path": "/dev/card1", "type": "c", "major": 25, "minor": 25, "fileMode": 384, "permissions": "rw", "uid": 1000, "gid": 1000},
          {"path": "/dev/card-render1", "type": "c", "major": 25, "minor": 25, "fileMode": 384, "permissions": "rwm", "uid": 1000, "gid": 1000}
        ]
      }
    }
  ],
  "containerEdits": {
    "env": ["FOO=VALID_SPEC", "BAR=BARVALUE1"],
    "deviceNodes": [{"path": "/dev/vendorctl", "type": "b", "major": 25, "minor": 25, "fileMode": 384, "permissions": "rw", "uid": 1000, "gid": 1000}],
    "mounts": [
      {"hostPath": "/bin/vendorBin", "containerPath": "/bin/vendorBin"},
      {"hostPath": "/usr/lib/libVendor.so.0", "containerPath": "/usr/lib/libVendor.so.0"},
      {"hostPath": "tmpfs", "containerPath": "/tmp/data", "type": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}
    ],
    "hooks": [
      {"hookName": "createContainer", "path": "/bin/vendor-hook"},
      {"hookName": "startContainer", "path": "/usr/bin/ldconfig"}
    ]
  }
}"#;
    assert_eq!(validate(example), Ok(()));
    assert_eq!(spec_from(example).minimum_version(), "0.5.0");
    assert!(matches!(spec::parse(b""), Err(spec::ParseError::NoData)));
    assert!(validate("{}")
        .unwrap_err()
        .starts_with("invalid version \"\":"));
}

fn edits_err(e: ContainerEdits) -> bool {
    spec::validate_edits(&e).is_err()
}

/// `TestValidateContainerEdits`.
#[test]
fn validate_container_edits() {
    let env = |v: &str| ContainerEdits {
        env: vec![v.into()],
        ..Default::default()
    };
    assert!(!edits_err(ContainerEdits::default()));
    assert!(!edits_err(env("BAR=BARVALUE1")));
    assert!(!edits_err(env("FOO=")));
    for bad in ["", "=foo", "FOOBAR"] {
        assert!(edits_err(env(bad)), "{bad:?}");
    }
    let node = |path: &str, kind: Option<&str>, perms: Option<&str>| ContainerEdits {
        device_nodes: vec![DeviceNode {
            path: path.into(),
            kind: kind.map(Into::into),
            permissions: perms.map(Into::into),
            ..Default::default()
        }],
        ..Default::default()
    };
    assert!(!edits_err(node("/dev/null", None, None)));
    assert!(!edits_err(node("/dev/null", Some("c"), None)));
    assert!(!edits_err(node("/dev/null", Some("b"), Some("rwm"))));
    assert!(!edits_err(node("/dev/null", Some("b"), Some("mwr"))));
    assert!(!edits_err(node("/dev/null", Some("b"), Some("rr"))));
    assert!(!edits_err(node("/dev/null", Some("c"), Some("none"))));
    assert!(edits_err(node("", None, None)));
    assert!(edits_err(node("/dev/vendorctl", Some("f"), None)));
    assert!(edits_err(node(
        "/dev/vendorctl",
        Some("b"),
        Some("to land")
    )));
    let mount = |h: &str, c: &str| ContainerEdits {
        mounts: vec![Mount {
            host_path: h.into(),
            container_path: c.into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    assert!(!edits_err(mount("/dev/vendorctl", "/dev/vendorctl")));
    assert!(edits_err(mount("", "/dev/vendorctl")));
    assert!(edits_err(mount("/dev/vendorctl", "")));
    let hook = |name: &str, path: &str, env: &[&str]| ContainerEdits {
        hooks: vec![Hook {
            hook_name: name.into(),
            path: path.into(),
            env: Some(env.iter().map(|s| s.to_string()).collect()),
            ..Default::default()
        }],
        ..Default::default()
    };
    for name in edits::HOOK_NAMES {
        assert!(
            !edits_err(hook(name, "/usr/local/bin/hook", &["V=1"])),
            "{name}"
        );
    }
    assert!(edits_err(hook("prestart", "", &[])));
    assert!(edits_err(hook("misCreateRuntime", "/x", &[])));
    assert!(edits_err(hook("poststart", "/x", &["=value2"])));
    let clos = |c: &str| ContainerEdits {
        intel_rdt: Some(IntelRdt {
            clos_id: Some(c.into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    assert!(!edits_err(clos("foo.bar")));
    assert!(!edits_err(clos("/")));
    assert!(!edits_err(clos("")));
    for bad in ["foo/bar", ".", "..", "foo\nbar"] {
        assert!(edits_err(clos(bad)), "{bad:?}");
    }
    let net = |h: &str, n: &str| NetDevice {
        host_interface_name: h.into(),
        name: n.into(),
    };
    let nets = |v: Vec<NetDevice>| ContainerEdits {
        net_devices: v,
        ..Default::default()
    };
    assert!(!edits_err(nets(vec![net("eno1", "netdev0")])));
    assert!(edits_err(nets(vec![net("", "netdev0")])));
    assert!(edits_err(nets(vec![net("eno1", "")])));
    assert!(edits_err(nets(vec![net("eno1", "a"), net("eno1", "b")])));
    assert!(edits_err(nets(vec![net("eno1", "a"), net("eno2", "a")])));
}

// ---- docs/cdi-rules.md §4: spec directories (pkg/cdi/cache_test.go, spec-dirs_test.go) ----

struct Dirs {
    _tmp: tempfile::TempDir,
    etc: PathBuf,
    run: PathBuf,
}

fn dirs() -> Dirs {
    let tmp = tempfile::tempdir().unwrap();
    let etc = tmp.path().join("etc/cdi");
    let run = tmp.path().join("run/cdi");
    fs::create_dir_all(&etc).unwrap();
    fs::create_dir_all(&run).unwrap();
    Dirs {
        _tmp: tmp,
        etc,
        run,
    }
}

fn write(dir: &Path, name: &str, text: &str) {
    fs::write(dir.join(name), text).unwrap();
}

/// A spec of kind `vendor.com/device` with one env-only device per name.
fn devices_spec(names: &[&str], tag: &str) -> String {
    let mut s = String::from("cdiVersion: 0.3.0\nkind: vendor.com/device\ndevices:\n");
    for n in names {
        s.push_str(&format!(
            "- name: {n}\n  containerEdits:\n    env: [\"{}={tag}\"]\n",
            n.to_uppercase()
        ));
    }
    s
}

fn names(reg: &Registry) -> Vec<String> {
    reg.devices().map(|(n, _)| n.to_string()).collect()
}

fn provider(reg: &Registry, name: &str) -> PathBuf {
    reg.device(name).unwrap().0.path.clone()
}

#[test]
fn cache_no_dirs_and_no_files() {
    let d = dirs();
    let reg = Registry::load(&[d.etc.join("missing"), d.run.join("missing")]);
    assert!(names(&reg).is_empty());
    assert!(
        reg.errors().is_empty(),
        "a missing directory is not an error"
    );
    let reg = Registry::load(&[d.etc.clone(), d.run.clone()]);
    assert!(names(&reg).is_empty());
}

#[test]
fn cache_override_by_later_directory() {
    let d = dirs();
    write(
        &d.etc,
        "vendor.yaml",
        &devices_spec(&["dev1", "dev2"], "etc"),
    );
    write(&d.run, "vendor.yaml", &devices_spec(&["dev1"], "run"));
    let reg = Registry::load(&[d.etc.clone(), d.run.clone()]);
    assert_eq!(
        names(&reg),
        ["vendor.com/device=dev1", "vendor.com/device=dev2"]
    );
    assert_eq!(
        provider(&reg, "vendor.com/device=dev1"),
        d.run.join("vendor.yaml")
    );
    assert_eq!(
        provider(&reg, "vendor.com/device=dev2"),
        d.etc.join("vendor.yaml")
    );
    assert!(reg.errors().is_empty());
}

#[test]
fn cache_conflicts_drop_the_device_everywhere() {
    let d = dirs();
    write(&d.etc, "a.yaml", &devices_spec(&["dev1", "dev2"], "a"));
    write(&d.etc, "b.json", &devices_spec(&["dev1", "dev3"], "b"));
    // Even a higher-priority definition does not save dev1 (cache.go refresh).
    write(&d.run, "c.yaml", &devices_spec(&["dev1"], "c"));
    let reg = Registry::load(&[d.etc.clone(), d.run.clone()]);
    assert_eq!(
        names(&reg),
        ["vendor.com/device=dev2", "vendor.com/device=dev3"]
    );
    let conflicts: Vec<&Path> = reg
        .errors()
        .iter()
        .filter(|e| matches!(e, ScanError::Conflict { .. }))
        .map(|e| e.path())
        .collect();
    assert_eq!(conflicts, [d.etc.join("a.yaml"), d.etc.join("b.json")]);
    let err = reg
        .resolve(&["vendor.com/device=dev1".into()])
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("unresolvable CDI devices vendor.com/device=dev1: "),
        "{err}"
    );
    assert!(
        err.contains("more than one spec in the same directory"),
        "{err}"
    );
}

#[test]
fn cache_invalid_files_skipped_others_serve() {
    let d = dirs();
    write(&d.etc, "a.yaml", &devices_spec(&["dev1"], "a"));
    write(
        &d.etc,
        "b.yaml",
        "cdiVersion: 0.3.0\nkind: vendor.com/other\ndevices: [{name: x}]\n",
    );
    write(
        &d.etc,
        "c.json",
        &devices_spec(&["dev3"], "c").replace("vendor.com/device", "vendor.com/third"),
    );
    write(&d.etc, "empty.json", "");
    // Not spec files: other extensions are ignored, and so are directories.
    write(&d.etc, "d.yml", "garbage");
    write(&d.etc, "e.JSON", "garbage");
    fs::create_dir(d.etc.join("sub.yaml")).unwrap();
    let reg = Registry::load(&[d.etc.clone(), d.run.clone()]);
    assert_eq!(
        names(&reg),
        ["vendor.com/device=dev1", "vendor.com/third=dev3"]
    );
    let failed: Vec<String> = reg.errors().iter().map(|e| e.to_string()).collect();
    assert_eq!(failed.len(), 2, "{failed:?}");
    assert!(
        failed[0].contains("b.yaml") && failed[0].contains("empty device edits"),
        "{failed:?}"
    );
    assert!(
        failed[1].contains("empty.json") && failed[1].contains("no Spec data"),
        "{failed:?}"
    );
}

#[test]
fn unresolvable_names_every_missing_device() {
    let d = dirs();
    write(&d.etc, "a.yaml", &devices_spec(&["dev1"], "a"));
    let reg = Registry::load(&[d.etc.clone(), d.run.clone()]);
    let err = reg
        .resolve(&[
            "vendor.com/device=dev1".into(),
            "vendor.com/device=dev2".into(),
            "other.com/x=y".into(),
        ])
        .unwrap_err();
    assert_eq!(err.missing, ["vendor.com/device=dev2", "other.com/x=y"]);
    let msg = err.to_string();
    assert!(msg.contains("has no device \"dev2\"; it has dev1"), "{msg}");
    assert!(msg.contains("defines kind \"other.com/x\""), "{msg}");
}

// ---- docs/cdi-rules.md §5: edit application, exact before/after (container-edits_test.go,
// cache_test.go TestInjectDevice, regressions_test.go) ----

fn apply(before: Value, edits: ContainerEdits) -> Value {
    let mut spec = before;
    edits::apply(&mut spec, &edits).unwrap();
    spec
}

fn env(v: &[&str]) -> ContainerEdits {
    ContainerEdits {
        env: v.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn null_node(perms: Option<&str>) -> DeviceNode {
    DeviceNode {
        path: "/dev/null".into(),
        permissions: perms.map(Into::into),
        ..Default::default()
    }
}

#[test]
fn apply_env() {
    assert_eq!(apply(json!({}), ContainerEdits::default()), json!({}));
    assert_eq!(
        apply(json!({}), env(&["BAR=BARVALUE1"])),
        json!({"process": {"env": ["BAR=BARVALUE1"]}})
    );
    // Duplicate env vars: the last value, at the first one's place.
    assert_eq!(
        apply(json!({}), env(&["FOO=1", "BAR=2", "FOO=3"])),
        json!({"process": {"env": ["FOO=3", "BAR=2"]}})
    );
    // HEAD: an existing key is replaced in place.
    assert_eq!(
        apply(
            json!({"process": {"env": ["FOO=old", "BAR=old"]}}),
            env(&["FOO=new"])
        ),
        json!({"process": {"env": ["FOO=new", "BAR=old"]}})
    );
}

#[test]
fn apply_device_nodes() {
    let rule = |access: &str| json!({"allow": true, "type": "c", "major": 1, "minor": 3, "access": access});
    let dev = json!({"path": "/dev/null", "type": "c", "major": 1, "minor": 3, "fileMode": 0o666});
    let edits = |perms| ContainerEdits {
        device_nodes: vec![null_node(perms)],
        ..Default::default()
    };
    assert_eq!(
        apply(json!({}), edits(None)),
        json!({"linux": {"devices": [dev], "resources": {"devices": [rule("rwm")]}}}),
        "filled from the host, omitted permissions are rwm"
    );
    assert_eq!(
        apply(json!({}), edits(Some("none"))),
        json!({"linux": {"devices": [dev], "resources": {"devices": [{"allow": true, "type": "c", "major": 1, "minor": 3}]}}}),
        "none gives an empty access string, left out as the reference's omitempty does"
    );
    assert_eq!(
        apply(json!({}), edits(Some("rw"))),
        json!({"linux": {"devices": [dev], "resources": {"devices": [rule("rw")]}}})
    );
    // Device and env together.
    let mut e = edits(None);
    e.env = vec!["FOO=BAR".into()];
    e.device_nodes[0].kind = Some("c".into());
    assert_eq!(
        apply(json!({}), e),
        json!({"process": {"env": ["FOO=BAR"]}, "linux": {"devices": [dev], "resources": {"devices": [rule("rwm")]}}})
    );
    // uid/gid default to the process user's when set and non-zero.
    let out = apply(
        json!({"process": {"user": {"uid": 1000, "gid": 1000}}}),
        edits(None),
    );
    assert_eq!(out["linux"]["devices"][0]["uid"], json!(1000));
    assert_eq!(out["linux"]["devices"][0]["gid"], json!(1000));
    // Declared type, major and minor are trusted without a host node ("minimal" node).
    let out = apply(
        json!({}),
        ContainerEdits {
            device_nodes: vec![DeviceNode {
                path: "/dev/loop8".into(),
                kind: Some("b".into()),
                major: Some(7),
                minor: Some(8),
                host_path: Some("/nonexistent/loop8".into()),
                ..Default::default()
            }],
            ..Default::default()
        },
    );
    assert_eq!(
        out["linux"]["devices"],
        json!([{"path": "/dev/loop8", "type": "b", "major": 7, "minor": 8}])
    );
    // A host type mismatch fails.
    let mut spec = json!({});
    let err = edits::apply(
        &mut spec,
        &ContainerEdits {
            device_nodes: vec![DeviceNode {
                path: "/dev/null".into(),
                kind: Some("b".into()),
                ..Default::default()
            }],
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(err.to_string().contains("/dev/null"), "{err}");
    assert_eq!(spec, json!({}));
}

#[test]
fn apply_mounts_and_order() {
    let m = |h: &str, c: &str| Mount {
        host_path: h.into(),
        container_path: c.into(),
        ..Default::default()
    };
    assert_eq!(
        apply(
            json!({}),
            ContainerEdits {
                mounts: vec![m("/dev/host-vendorctl", "/dev/cntr-vendorctl")],
                ..Default::default()
            }
        ),
        json!({"mounts": [{"destination": "/dev/cntr-vendorctl", "source": "/dev/host-vendorctl"}]})
    );
    // "apply mount edits do not change the order of original mounts" (stable sort by depth).
    let before = json!({"mounts": [
        {"destination": "/some/where/else"}, {"destination": "/other/place"}, {"destination": "/a"}
    ]});
    let out = apply(
        before,
        ContainerEdits {
            mounts: vec![m("/h", "/dest/path"), m("/h2", "/x")],
            ..Default::default()
        },
    );
    let order: Vec<&str> = out["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["destination"].as_str().unwrap())
        .collect();
    assert_eq!(
        order,
        ["/a", "/x", "/other/place", "/dest/path", "/some/where/else"]
    );
    // "mount added by edit comes after existing ones of same number of path parts".
    let out = apply(
        json!({"mounts": [{"destination": "/dest/path/b"}, {"destination": "/dest/path/a"}]}),
        ContainerEdits {
            mounts: vec![m("/h", "/dest/edit/c")],
            ..Default::default()
        },
    );
    let order: Vec<&str> = out["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["destination"].as_str().unwrap())
        .collect();
    assert_eq!(order, ["/dest/path/b", "/dest/path/a", "/dest/edit/c"]);
}

#[test]
fn apply_hooks_all_six_lists() {
    let hooks: Vec<Hook> = edits::HOOK_NAMES
        .iter()
        .enumerate()
        .map(|(i, name)| Hook {
            hook_name: name.to_string(),
            path: format!("/usr/local/bin/{name}-vendor-hook"),
            args: if i == 5 {
                vec![]
            } else {
                vec![format!("--{i}")]
            },
            env: (i < 5).then(|| vec![format!("VENDOR_ENV{i}=value{i}")]),
            timeout: None,
        })
        .collect();
    let out = apply(
        json!({}),
        ContainerEdits {
            hooks,
            ..Default::default()
        },
    );
    assert_eq!(
        out,
        json!({"hooks": {
            "prestart": [{"path": "/usr/local/bin/prestart-vendor-hook", "args": ["--0"], "env": ["VENDOR_ENV0=value0"]}],
            "createRuntime": [{"path": "/usr/local/bin/createRuntime-vendor-hook", "args": ["--1"], "env": ["VENDOR_ENV1=value1"]}],
            "createContainer": [{"path": "/usr/local/bin/createContainer-vendor-hook", "args": ["--2"], "env": ["VENDOR_ENV2=value2"]}],
            "startContainer": [{"path": "/usr/local/bin/startContainer-vendor-hook", "args": ["--3"], "env": ["VENDOR_ENV3=value3"]}],
            "poststart": [{"path": "/usr/local/bin/poststart-vendor-hook", "args": ["--4"], "env": ["VENDOR_ENV4=value4"]}],
            // A hook without env gets nvshim's hook env: never the container's.
            "poststop": [{"path": "/usr/local/bin/poststop-vendor-hook", "env": [edits::hook_env(None)[0]]}]
        }})
    );
}

#[test]
fn apply_rdt_net_devices_and_gids() {
    let rdt = |clos: &str| ContainerEdits {
        intel_rdt: Some(IntelRdt {
            clos_id: Some(clos.into()),
            l3_cache_schema: Some("L3:0=ff".into()),
            schemata: Some(vec!["MB:0=50".into()]),
            enable_monitoring: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    };
    assert_eq!(
        apply(json!({}), rdt("clos-1")),
        json!({"linux": {"intelRdt": {"closID": "clos-1", "l3CacheSchema": "L3:0=ff", "schemata": ["MB:0=50"], "enableMonitoring": true}}})
    );
    // Replaced wholesale, no field merge.
    assert_eq!(
        apply(
            json!({"linux": {"intelRdt": {"closID": "old", "memBwSchema": "MB:0=10"}}}),
            ContainerEdits {
                intel_rdt: Some(IntelRdt {
                    clos_id: Some("new".into()),
                    ..Default::default()
                }),
                ..Default::default()
            }
        ),
        json!({"linux": {"intelRdt": {"closID": "new"}}})
    );
    let net = |h: &str, n: &str| NetDevice {
        host_interface_name: h.into(),
        name: n.into(),
    };
    assert_eq!(
        apply(
            json!({"linux": {"netDevices": {"eth0": {"name": "old"}}}}),
            ContainerEdits {
                net_devices: vec![net("eth0", "new"), net("eth1", "ctr1")],
                ..Default::default()
            }
        ),
        json!({"linux": {"netDevices": {"eth0": {"name": "new"}, "eth1": {"name": "ctr1"}}}})
    );
    let gids = |g: &[u32]| ContainerEdits {
        additional_gids: g.to_vec(),
        ..Default::default()
    };
    assert_eq!(
        apply(json!({}), gids(&[4, 5, 6])),
        json!({"process": {"user": {"additionalGids": [4, 5, 6]}}})
    );
    assert_eq!(
        apply(
            json!({"process": {"user": {"additionalGids": [5]}}}),
            gids(&[4, 5, 6])
        ),
        json!({"process": {"user": {"additionalGids": [5, 4, 6]}}}),
        "an existing gid is not duplicated"
    );
    assert_eq!(
        apply(json!({}), gids(&[5, 5, 0, 6, 6])),
        json!({"process": {"user": {"additionalGids": [5, 6]}}}),
        "duplicates ignored, 0 skipped"
    );
}

/// `TestAppend`: lists concatenate; intelRdt is last-wins; gids are not de-duplicated here.
#[test]
fn append_semantics() {
    let mut a = env(&["var0=val0"]);
    a.additional_gids = vec![5, 0];
    let mut b = env(&["var1=val1"]);
    b.additional_gids = vec![5, 6];
    b.intel_rdt = Some(IntelRdt {
        clos_id: Some("b".into()),
        ..Default::default()
    });
    let mut c = env(&["var2=val2"]);
    c.additional_gids = vec![7, 6];
    a.append(&b);
    a.append(&c);
    assert_eq!(a.env, ["var0=val0", "var1=val1", "var2=val2"]);
    assert_eq!(a.additional_gids, [5, 0, 5, 6, 7, 6]);
    assert_eq!(a.intel_rdt.unwrap().clos_id.as_deref(), Some("b"));
}

/// `TestInjectDevice` and `regressions_test.go`: through the registry, global edits once per
/// spec in request order, exact output; an unresolvable device leaves the config untouched.
#[test]
fn inject_through_registry() {
    let d = dirs();
    write(
        &d.etc,
        "vendor1.yaml",
        "cdiVersion: 0.3.0\nkind: vendor1.com/device\ncontainerEdits:\n  env: [FOO=injected]\ndevices:\n- name: dev1\n  containerEdits:\n    env: [VENDOR1=present]\n    deviceNodes: [{path: /dev/loop8, type: b, major: 7, minor: 8}]\n- name: dev2\n  containerEdits:\n    env: [VENDOR1_2=present]\n    hooks: [{hookName: prestart, path: /bin/vendor1-hook}]\n",
    );
    write(
        &d.run,
        "vendor2.json",
        r#"{"cdiVersion": "0.3.0", "kind": "vendor2.com/device", "containerEdits": {"env": ["BAR=injected"]},
            "devices": [{"name": "dev1", "containerEdits": {"env": ["VENDOR2=present"], "deviceNodes": [{"path": "/dev/loop9", "type": "b", "major": 7, "minor": 9}]}}]}"#,
    );
    let reg = Registry::load(&[d.etc.clone(), d.run.clone()]);
    assert!(reg.errors().is_empty(), "{:?}", reg.errors());
    let before = json!({"process": {"env": ["PATH=/bin"]}, "linux": {"devices": [
        {"path": "/dev/null", "type": "c", "major": 1, "minor": 3},
        {"path": "/dev/zero", "type": "c", "major": 1, "minor": 5}
    ]}});
    let names: Vec<String> = [
        "vendor1.com/device=dev1",
        "vendor2.com/device=dev1",
        "vendor1.com/device=dev2",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let edits = reg.resolve(&names).unwrap();
    let out = apply(before.clone(), edits);
    assert_eq!(
        out,
        json!({
            "process": {"env": ["PATH=/bin", "FOO=injected", "VENDOR1=present", "BAR=injected", "VENDOR2=present", "VENDOR1_2=present"]},
            "linux": {
                "devices": [
                    {"path": "/dev/null", "type": "c", "major": 1, "minor": 3},
                    {"path": "/dev/zero", "type": "c", "major": 1, "minor": 5},
                    {"path": "/dev/loop8", "type": "b", "major": 7, "minor": 8},
                    {"path": "/dev/loop9", "type": "b", "major": 7, "minor": 9}
                ],
                "resources": {"devices": [
                    {"allow": true, "type": "b", "major": 7, "minor": 8, "access": "rwm"},
                    {"allow": true, "type": "b", "major": 7, "minor": 9, "access": "rwm"}
                ]}
            },
            // The one difference from the reference: a hook gets nvshim's env when it has none.
            "hooks": {"prestart": [{"path": "/bin/vendor1-hook", "env": [crate::nvidia::HOOK_ENV]}]}
        })
    );
    let err = reg
        .resolve(&["vendor1.com/device=dev3".into()])
        .unwrap_err();
    assert_eq!(err.missing, ["vendor1.com/device=dev3"]);
}

/// `hostPath: ""` is the path and `type: ""` is unset, as Go's zero values are.
#[test]
fn empty_strings_are_unset() {
    let d = dirs();
    write(
        &d.etc,
        "v.yaml",
        "cdiVersion: 0.5.0\nkind: vendor.com/device\ndevices:\n- name: dev\n  containerEdits:\n    deviceNodes: [{path: /dev/null, hostPath: \"\", type: \"\"}]\n    mounts: [{hostPath: /h, containerPath: /c, type: \"\"}]\n",
    );
    let reg = Registry::load(std::slice::from_ref(&d.etc));
    let edits = reg.resolve(&["vendor.com/device=dev".into()]).unwrap();
    let out = apply(json!({}), edits);
    assert_eq!(
        out["linux"]["devices"],
        json!([{"path": "/dev/null", "type": "c", "major": 1, "minor": 3, "fileMode": 0o666}])
    );
    assert_eq!(
        out["mounts"],
        json!([{"destination": "/c", "source": "/h"}])
    );
}

// ---- docs/cdi-rules.md §6.2: files nobody on this team wrote, as the reference reads them ----

const PROBE: &str = "cdiVersion: 0.3.0\nkind: vendor.com/device\ndevices:\n- name: d\n  containerEdits:\n    env: [A=1]\n";
const PROBE_JSON: &str = r#"{"cdiVersion": "0.3.0", "kind": "vendor.com/device", "devices": [{"name": "d", "containerEdits": {"env": ["A=1"]}}]}"#;

fn utf16(text: &str, be: bool) -> Vec<u8> {
    let mut out = if be {
        vec![0xFE, 0xFF]
    } else {
        vec![0xFF, 0xFE]
    };
    for u in text.encode_utf16() {
        out.extend(if be { u.to_be_bytes() } else { u.to_le_bytes() });
    }
    out
}

#[test]
fn byte_order_marks_utf8_and_utf16() {
    let want = spec_from(PROBE);
    for text in [PROBE, PROBE_JSON] {
        let mut bom = vec![0xEF, 0xBB, 0xBF];
        bom.extend(text.as_bytes());
        assert_eq!(spec::parse(&bom).unwrap(), want);
        assert_eq!(spec::parse(&utf16(text, false)).unwrap(), want);
        assert_eq!(spec::parse(&utf16(text, true)).unwrap(), want);
    }
    // UTF-16 without a mark is not text the reference reads; nor is a lone surrogate.
    let no_mark = utf16(PROBE, false)[2..].to_vec();
    assert!(spec::parse(&no_mark).is_err());
    assert!(matches!(
        spec::parse(&[0xFF, 0xFE, 0x00, 0xD8]),
        Err(spec::ParseError::BadUtf16)
    ));
    // A mark in the middle is still an error in a key.
    assert!(spec::parse("cdiVersion: 0.3.0\n\u{feff}kind: x\n".as_bytes()).is_err());
}

#[test]
fn merge_keys_in_a_spec() {
    let text = "cdiVersion: 0.3.0\nkind: vendor.com/device\ndevices:\n- name: a\n  containerEdits: &edits\n    env: [A=1]\n    mounts: [{hostPath: /h, containerPath: /c}]\n- name: b\n  containerEdits:\n    <<: *edits\n    additionalGids: [5]\n- name: c\n  containerEdits: {<<: [*edits]}\n";
    assert_eq!(
        validate(text),
        Err("the spec version must be at least v0.7.0".into())
    );
    let s = spec_from(text);
    assert_eq!(s.devices[1].container_edits.env, ["A=1"]);
    assert_eq!(s.devices[1].container_edits.additional_gids, [5]);
    assert_eq!(s.devices[2].container_edits, s.devices[0].container_edits);
    // Overriding a merged key fails in the reference's strict decoder.
    let e = spec::parse(text.replace("additionalGids: [5]", "env: [B=2]").as_bytes()).unwrap_err();
    assert!(
        e.to_string().contains("key \"env\" already set in map"),
        "{e}"
    );
}

#[test]
fn keys_differing_in_case_byte_greatest_wins() {
    // `kind` > `KIND` in byte order: it wins before or after.
    for text in [
        "cdiVersion: 0.3.0\nkind: vendor.com/device\nKIND: other.com/x\ndevices: [{name: d, containerEdits: {env: [A=1]}}]\n",
        "cdiVersion: 0.3.0\nKIND: other.com/x\nkind: vendor.com/device\ndevices: [{name: d, containerEdits: {env: [A=1]}}]\n",
    ] {
        assert_eq!(spec_from(text).kind, "vendor.com/device", "{text}");
    }
    // `Kind` < `kind` too; `kinD` < `kind`.
    let s = spec_from("cdiVersion: 0.3.0\nkind: vendor.com/device\nkinD: x.com/y\nKind: z.com/w\ndevices: [{name: d, containerEdits: {env: [A=1]}}]\n");
    assert_eq!(s.kind, "vendor.com/device");
}

#[test]
fn unreadable_dir_does_not_hide_later_ones() {
    let d = dirs();
    write(&d.run, "vendor.yaml", &devices_spec(&["dev1"], "run"));
    // A file where a directory is expected cannot be read (root reads any mode, so no chmod).
    fs::remove_dir(&d.etc).unwrap();
    fs::write(&d.etc, "not a directory").unwrap();
    let reg = Registry::load(&[d.etc.clone(), d.run.clone()]);
    assert_eq!(names(&reg), ["vendor.com/device=dev1"]);
    assert!(
        matches!(reg.errors(), [ScanError::Dir { .. }]),
        "{:?}",
        reg.errors()
    );
    let e = reg.errors()[0].to_string();
    assert!(
        e.contains(&d.etc.display().to_string()) && e.contains("still serve"),
        "{e}"
    );
}

#[test]
fn fifo_and_oversized_files_are_refused_without_blocking() {
    let d = dirs();
    let fifo = d.run.join("a-fifo.yaml");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let mut big = String::from(PROBE);
    big.push('#');
    big.push_str(&"x".repeat(spec::MAX_SPEC_BYTES as usize));
    write(&d.run, "b-big.yaml", &big);
    write(&d.run, "c-good.yaml", &devices_spec(&["dev1"], "run"));
    // Would block forever on the FIFO if it were opened blocking.
    let reg = Registry::load(std::slice::from_ref(&d.run));
    assert_eq!(names(&reg), ["vendor.com/device=dev1"]);
    let errors: Vec<String> = reg.errors().iter().map(|e| e.to_string()).collect();
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(
        errors[0].contains("a-fifo.yaml") && errors[0].contains("a FIFO"),
        "{errors:?}"
    );
    assert!(
        errors[1].contains("b-big.yaml") && errors[1].contains("limit"),
        "{errors:?}"
    );
}

#[test]
fn hundred_thousand_devices_validate_in_linear_time() {
    let load = |n: usize| {
        let mut text = String::from("cdiVersion: 0.3.0\nkind: vendor.com/device\ndevices:\n");
        for i in 0..n {
            text.push_str(&format!(
                "- {{name: d{i}, containerEdits: {{env: [A=1]}}}}\n"
            ));
        }
        let d = dirs();
        write(&d.run, "many.yaml", &text);
        let start = std::time::Instant::now();
        let reg = Registry::load(std::slice::from_ref(&d.run));
        let last = format!("vendor.com/device=d{}", n - 1);
        assert_eq!(reg.resolve(&[last]).unwrap().env, ["A=1"]);
        assert_eq!(reg.devices().count(), n);
        start.elapsed()
    };
    let small = load(20_000);
    let large = load(100_000);
    // Five times the devices: about five times the time when linear, 25 when quadratic (the
    // duplicate-name check took 21 s for 100,000 names). A ratio, not a wall-clock bound, so
    // a loaded machine slows both alike.
    let ratio = large.as_secs_f64() / small.as_secs_f64();
    assert!(ratio < 12.0, "{small:?} for 20,000, {large:?} for 100,000");
}

#[test]
fn later_fixes_kept() {
    // `deviceNodes: [~]` is refused naming the missing field; `permissions: none` is valid.
    let e = spec::parse(
        b"cdiVersion: 0.3.0\nkind: vendor.com/device\ndevices:\n- name: d\n  containerEdits:\n    deviceNodes: [~]\n",
    )
    .unwrap_err();
    assert!(e.to_string().contains("missing field `path`"), "{e}");
    assert_eq!(
        validate("cdiVersion: 0.3.0\nkind: vendor.com/device\ndevices: [{name: d, containerEdits: {deviceNodes: [{path: /dev/null, permissions: none}]}}]"),
        Ok(())
    );
    // A one-letter vendor and class.
    assert_eq!(
        validate(
            "cdiVersion: 0.3.0\nkind: a/b\ndevices: [{name: d, containerEdits: {env: [A=1]}}]"
        ),
        Ok(())
    );
}
