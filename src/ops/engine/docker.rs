//! Docker: `runtimes.<name> = {"path": ..., "args": []}` (and `default-runtime`) merged into
//! `daemon.json`, every other key kept in its order.
//!
//! dockerd reads the file only at start (or `SIGHUP` for a few keys, `runtimes` among them:
//! moby `daemon/reload.go`), so the caller restarts or reloads it. This is the layout
//! `nvidia-ctk runtime configure --runtime docker` writes (`pkg/config/engine/docker`).
//!
//! Two more settings, each only when asked ([`Options::set_as_default`],
//! [`Options::enable_cdi`]): `default-runtime` (Docker before 29.2 serves `--gpus` with NVIDIA's
//! prestart hook, which only works when nvshim-runtime runs the container) and
//! `features.cdi = true` (Docker 25-27 ignore CDI `--device` names without it; 28 and later
//! have it on). dockerd refuses unknown keys in daemon.json, so what these replaced is kept
//! in a state file beside it ([`state_path`]), which `unconfigure` reads to put back exactly
//! what nvshim changed, and removes.
//!
//! One file (340 lines of code, 280 of tests): `configure`, `unconfigure` and `registration` read
//! and write the same `daemon.json` and its state file, and the state written by the one is what
//! the other puts back.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::file::read_optional;
use super::{change, EngineError, FileChange, Options};

pub fn configure(opts: &Options) -> Result<Vec<FileChange>, EngineError> {
    let path = &opts.config;
    let before = read_optional(path)?;
    let mut doc = parse(path, before.as_deref())?;
    let original = doc.clone();

    let runtimes = object_entry(&mut doc, "runtimes", path)?;
    let args = match runtimes.get(&opts.runtime_name) {
        None => Value::Array(Vec::new()),
        Some(Value::Object(entry)) => match entry.get("args") {
            // Arguments the admin gave the runtime are theirs to keep.
            Some(a @ Value::Array(_)) => a.clone(),
            _ => Value::Array(Vec::new()),
        },
        Some(other) => {
            return Err(shape(
                path,
                &format!("runtimes.{}", opts.runtime_name),
                "an object",
                other,
            ))
        }
    };
    let mut entry = Map::new();
    entry.insert(
        "path".into(),
        Value::String(opts.runtime_path.to_string_lossy().into_owned()),
    );
    entry.insert("args".into(), args);
    // An entry that already says the same (whatever its key order) is left as it is.
    if runtimes.get(&opts.runtime_name) != Some(&Value::Object(entry.clone())) {
        runtimes.insert(opts.runtime_name.clone(), Value::Object(entry));
    }
    let state_file = state_path(path);
    let state_before = read_optional(&state_file)?;
    let mut state = parse(&state_file, state_before.as_deref())?;
    let state_original = state.clone();
    if opts.set_as_default {
        let ours = Value::String(opts.runtime_name.clone());
        let was = doc.get("default-runtime").cloned();
        if was.as_ref() != Some(&ours) {
            remember(&mut state, "default-runtime", was);
            doc.insert("default-runtime".into(), ours);
        }
    }
    if opts.enable_cdi && cdi_enabled(path, &doc, opts.engine_version)? == Some(false) {
        let features = object_entry(&mut doc, "features", path)?;
        remember(&mut state, "features.cdi", features.get("cdi").cloned());
        features.insert("cdi".into(), Value::Bool(true));
    }
    // Docker's CDI reads /etc/cdi and /var/run/cdi unless told otherwise: where nvshim reads
    // other directories, Docker is told the same. Only on a Docker known to have the key
    // (25+): an older dockerd refuses to start on a key it does not know.
    let defaults = super::ENGINE_CDI_SPEC_DIRS.map(PathBuf::from);
    if opts.enable_cdi
        && opts.engine_version.is_some_and(|v| v >= (25, 0))
        && !doc.contains_key("cdi-spec-dirs")
        && opts.cdi_spec_dirs.as_slice() != defaults.as_slice()
    {
        remember(&mut state, "cdi-spec-dirs", None);
        doc.insert("cdi-spec-dirs".into(), spec_dirs_value(&opts.cdi_spec_dirs));
    }
    let mut changes = finish(path, before, &original, &doc);
    if state != state_original {
        changes.extend(change(
            &state_file,
            state_before,
            Some(render(&state, None)),
        ));
    }
    Ok(changes)
}

/// nvshim's CDI spec directories as daemon.json's `cdi-spec-dirs` holds them.
fn spec_dirs_value(dirs: &[PathBuf]) -> Value {
    Value::Array(
        dirs.iter()
            .map(|d| Value::String(d.to_string_lossy().into_owned()))
            .collect(),
    )
}

/// Where nvshim keeps the values it replaced in `daemon.json`: `<file>.nvshim-state.json`
/// beside it (dockerd reads no other file in its directory).
pub fn state_path(config: &Path) -> PathBuf {
    let mut name = config.file_name().unwrap_or_default().to_os_string();
    name.push(".nvshim-state.json");
    config.with_file_name(name)
}

/// Records the value `key` had before nvshim's first change to it (`null`: it was not set).
fn remember(state: &mut Map<String, Value>, key: &str, was: Option<Value>) {
    if !state.contains_key(key) {
        let mut entry = Map::new();
        entry.insert("was".into(), was.unwrap_or(Value::Null));
        state.insert(key.into(), Value::Object(entry));
    }
}

/// Whether dockerd reads CDI `--device` names with this daemon.json: `features.cdi` when set,
/// else on from Docker 28 (off before it). `None` for a Docker without CDI (before 25).
fn cdi_enabled(
    path: &Path,
    doc: &Map<String, Value>,
    engine_version: Option<(u64, u64)>,
) -> Result<Option<bool>, EngineError> {
    if matches!(engine_version, Some(v) if v < (25, 0)) {
        return Ok(None);
    }
    match doc.get("features").map(|f| (f, f.get("cdi"))) {
        // An unknown release is taken as one that needs the key (25-27).
        None | Some((Value::Object(_), None)) => {
            Ok(Some(engine_version.is_some_and(|v| v >= (28, 0))))
        }
        Some((Value::Object(_), Some(Value::Bool(b)))) => Ok(Some(*b)),
        Some((Value::Object(_), Some(other))) => {
            Err(shape(path, "features.cdi", "a boolean", other))
        }
        Some((other, _)) => Err(shape(path, "features", "an object", other)),
    }
}

pub fn unconfigure(opts: &Options) -> Result<Vec<FileChange>, EngineError> {
    let path = &opts.config;
    let before = read_optional(path)?;
    if before.is_none() {
        return Ok(Vec::new());
    }
    let mut doc = parse(path, before.as_deref())?;
    let original = doc.clone();
    let state_file = state_path(path);
    let state_text = read_optional(&state_file)?;
    let state = parse(&state_file, state_text.as_deref())?;
    if let Some(runtimes) = doc.get_mut("runtimes") {
        let Value::Object(map) = runtimes else {
            return Err(shape(path, "runtimes", "an object", runtimes));
        };
        map.shift_remove(&opts.runtime_name);
        if map.is_empty() {
            doc.shift_remove("runtimes");
        }
    }
    if doc.get("default-runtime").and_then(Value::as_str) == Some(opts.runtime_name.as_str()) {
        // The default nvshim replaced, else none (dockerd's own default is runc).
        match state.get("default-runtime").and_then(|e| e.get("was")) {
            Some(was @ Value::String(_)) if was.as_str() != Some(opts.runtime_name.as_str()) => {
                doc.insert("default-runtime".into(), was.clone());
            }
            _ => {
                doc.shift_remove("default-runtime");
            }
        }
    }
    // `features.cdi` goes back only if nvshim turned it on and it is still on.
    if let Some(was) = state.get("features.cdi").and_then(|e| e.get("was")) {
        if let Some(Value::Object(features)) = doc.get_mut("features") {
            if features.get("cdi") == Some(&Value::Bool(true)) {
                match was {
                    Value::Bool(_) => {
                        features.insert("cdi".into(), was.clone());
                    }
                    _ => {
                        features.shift_remove("cdi");
                    }
                }
                if features.is_empty() {
                    doc.shift_remove("features");
                }
            }
        }
    }
    // `cdi-spec-dirs` goes only if nvshim wrote it and it still says what nvshim wrote.
    if state.get("cdi-spec-dirs").is_some()
        && doc.get("cdi-spec-dirs") == Some(&spec_dirs_value(&opts.cdi_spec_dirs))
    {
        doc.shift_remove("cdi-spec-dirs");
    }
    let mut changes = finish(path, before, &original, &doc);
    if let Some(text) = state_text {
        changes.extend(change(&state_file, Some(text), None));
    }
    Ok(changes)
}

/// `runtimes.<name>.path` from daemon.json.
pub fn registration(opts: &Options) -> Result<super::Registration, EngineError> {
    let path = &opts.config;
    let doc = parse(path, read_optional(path)?.as_deref())?;
    let cdi = cdi_enabled(path, &doc, opts.engine_version)?;
    let cdi_setting =
        (cdi == Some(false)).then(|| match doc.get("features").and_then(|f| f.get("cdi")) {
            Some(_) => format!("features.cdi = false in {}", path.display()),
            None => format!(
                "no features.cdi in {} (Docker before 28 needs it)",
                path.display()
            ),
        });
    let binary = doc
        .get("runtimes")
        .and_then(|r| r.get(&opts.runtime_name))
        .map(|r| {
            r.get("path")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        });
    let cdi_spec_dirs = cdi.map(
        |_| match doc.get("cdi-spec-dirs").and_then(Value::as_array) {
            Some(dirs) => dirs
                .iter()
                .filter_map(Value::as_str)
                .map(PathBuf::from)
                .collect(),
            None => super::ENGINE_CDI_SPEC_DIRS.map(PathBuf::from).to_vec(),
        },
    );
    Ok(super::Registration {
        files: vec![path.clone()],
        binary,
        cdi_enabled: cdi,
        cdi_setting,
        cdi_spec_dirs,
        warnings: Vec::new(),
    })
}

/// An empty or missing file is `{}` (dockerd runs without one).
fn parse(path: &Path, text: Option<&str>) -> Result<Map<String, Value>, EngineError> {
    let text = text.unwrap_or("");
    if text.trim().is_empty() {
        return Ok(Map::new());
    }
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(other) => Err(shape(path, "the top level", "an object", &other)),
        Err(e) => Err(EngineError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        }),
    }
}

fn object_entry<'a>(
    doc: &'a mut Map<String, Value>,
    key: &str,
    path: &Path,
) -> Result<&'a mut Map<String, Value>, EngineError> {
    let v = doc
        .entry(key.to_string())
        .or_insert_with(|| Value::Object(Map::new()));
    match v {
        Value::Object(m) => Ok(m),
        other => Err(shape(path, key, "an object", other)),
    }
}

fn shape(path: &Path, key: &str, expected: &'static str, found: &Value) -> EngineError {
    let found = match found {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    };
    EngineError::Shape {
        path: path.to_path_buf(),
        key: key.to_string(),
        expected,
        found: found.to_string(),
    }
}

/// The change, if the document's value changed. An unchanged value is never re-serialised, so
/// a second run does not even reformat the file.
fn finish(
    path: &Path,
    before: Option<String>,
    original: &Map<String, Value>,
    doc: &Map<String, Value>,
) -> Vec<FileChange> {
    if doc == original {
        return Vec::new();
    }
    let after = render(doc, before.as_deref());
    change(path, before, Some(after)).into_iter().collect()
}

/// Pretty JSON with the indentation the file already uses (tabs or N spaces; 4 by default, as
/// nvidia-ctk writes it).
fn render(doc: &Map<String, Value>, before: Option<&str>) -> String {
    let indent = before.map(detect_indent).unwrap_or_else(|| "    ".into());
    let mut out = Vec::new();
    let fmt = serde_json::ser::PrettyFormatter::with_indent(indent.as_bytes());
    let mut ser = serde_json::Serializer::with_formatter(&mut out, fmt);
    // Serialising a map of JSON values into a Vec cannot fail.
    let _ = serde::Serialize::serialize(doc, &mut ser);
    let mut text = String::from_utf8_lossy(&out).into_owned();
    text.push('\n');
    text
}

fn detect_indent(text: &str) -> String {
    text.lines()
        .skip(1)
        .find_map(|l| {
            let ws: String = l.chars().take_while(|c| *c == ' ' || *c == '\t').collect();
            (!ws.is_empty()).then_some(ws)
        })
        .unwrap_or_else(|| "    ".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::engine::{
        configure as plan_configure, unconfigure as plan_unconfigure, Engine,
    };
    use std::path::PathBuf;

    fn opts(dir: &Path) -> Options {
        let mut o = Options::new(Engine::Docker, "/usr/bin/nvshim-runtime".into());
        o.config = dir.join("daemon.json");
        o.backup_dir = dir.join("backups");
        o
    }

    fn after(plan: &crate::ops::engine::Plan) -> Value {
        serde_json::from_str(plan.changes[0].after.as_deref().unwrap()).unwrap()
    }

    #[test]
    fn missing_file_gets_the_runtime() {
        let dir = tempfile::tempdir().unwrap();
        let plan = plan_configure(&opts(dir.path())).unwrap();
        assert_eq!(plan.changes.len(), 1);
        assert_eq!(plan.changes[0].before, None);
        assert_eq!(
            after(&plan),
            serde_json::json!({"runtimes": {"nvidia": {"path": "/usr/bin/nvshim-runtime", "args": []}}})
        );
    }

    #[test]
    fn keeps_every_other_key_in_order_and_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let o = opts(dir.path());
        let text = "{\n\t\"log-driver\": \"json-file\",\n\t\"runtimes\": {\"runsc\": {\"path\": \"/usr/bin/runsc\"}},\n\t\"zzz\": [1, 2],\n\t\"data-root\": \"/d\"\n}\n";
        std::fs::write(&o.config, text).unwrap();
        let mut o2 = o.clone();
        o2.set_as_default = true;
        let plan = plan_configure(&o2).unwrap();
        let out = plan.changes[0].after.clone().unwrap();
        // Order kept, tabs kept.
        let keys: Vec<String> = after(&plan).as_object().unwrap().keys().cloned().collect();
        assert_eq!(
            keys,
            [
                "log-driver",
                "runtimes",
                "zzz",
                "data-root",
                "default-runtime"
            ]
        );
        assert!(out.contains("\n\t\"log-driver\""), "{out}");
        let v = after(&plan);
        assert_eq!(v["runtimes"]["runsc"]["path"], "/usr/bin/runsc");
        assert_eq!(v["runtimes"]["nvidia"]["path"], "/usr/bin/nvshim-runtime");
        assert_eq!(v["default-runtime"], "nvidia");
        plan.apply().unwrap();
        assert!(
            plan_configure(&o2).unwrap().is_empty(),
            "second run changes nothing"
        );
        // Unconfigure restores the original value.
        let un = plan_unconfigure(&o).unwrap();
        let restored: Value =
            serde_json::from_str(un.changes[0].after.as_deref().unwrap()).unwrap();
        assert_eq!(restored, serde_json::from_str::<Value>(text).unwrap());
    }

    #[test]
    fn keeps_admin_args() {
        let dir = tempfile::tempdir().unwrap();
        let o = opts(dir.path());
        std::fs::write(
            &o.config,
            r#"{"runtimes": {"nvidia": {"path": "nvidia-container-runtime", "args": ["--debug"]}}}"#,
        )
        .unwrap();
        let v = after(&plan_configure(&o).unwrap());
        assert_eq!(
            v["runtimes"]["nvidia"],
            serde_json::json!({"path": "/usr/bin/nvshim-runtime", "args": ["--debug"]})
        );
    }

    #[test]
    fn unparsable_and_misshapen_files_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let o = opts(dir.path());
        std::fs::write(&o.config, "{\"a\": 1,").unwrap();
        let err = plan_configure(&o).unwrap_err().to_string();
        assert!(err.contains("daemon.json"), "{err}");
        std::fs::write(&o.config, r#"{"runtimes": []}"#).unwrap();
        let err = plan_configure(&o).unwrap_err().to_string();
        assert!(
            err.contains("runtimes is an array, expected an object"),
            "{err}"
        );
        std::fs::write(&o.config, "[]").unwrap();
        assert!(plan_configure(&o).is_err());
    }

    fn read(p: &Path) -> Value {
        serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
    }

    #[test]
    fn default_runtime_is_restored_from_the_state_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = opts(dir.path());
        o.set_as_default = true;
        let text = "{\n  \"default-runtime\": \"crun\",\n  \"runtimes\": {\"crun\": {\"path\": \"/usr/bin/crun\"}}\n}\n";
        std::fs::write(&o.config, text).unwrap();
        let plan = plan_configure(&o).unwrap();
        assert_eq!(plan.changes.len(), 2, "{plan:?}");
        assert_eq!(after(&plan)["default-runtime"], "nvidia");
        let state = state_path(&o.config);
        assert_eq!(plan.changes[1].path, state);
        plan.apply().unwrap();
        assert_eq!(
            read(&state),
            serde_json::json!({"default-runtime": {"was": "crun"}})
        );
        assert!(plan_configure(&o).unwrap().is_empty(), "idempotent");
        // Unconfigure puts crun back and removes the state file.
        let un = plan_unconfigure(&o).unwrap();
        assert_eq!(un.changes.len(), 2);
        assert_eq!(un.changes[1].after, None);
        un.apply().unwrap();
        assert_eq!(
            read(&o.config),
            serde_json::from_str::<Value>(text).unwrap()
        );
        assert!(!state.exists());
        // No default before: none after.
        std::fs::write(&o.config, "{}").unwrap();
        plan_configure(&o).unwrap().apply().unwrap();
        assert_eq!(
            read(&state),
            serde_json::json!({"default-runtime": {"was": null}})
        );
        plan_unconfigure(&o).unwrap().apply().unwrap();
        assert_eq!(read(&o.config), serde_json::json!({}));
        // --no-set-as-default: the default stays.
        o.set_as_default = false;
        std::fs::write(&o.config, text).unwrap();
        let plan = plan_configure(&o).unwrap();
        assert_eq!(plan.changes.len(), 1);
        assert_eq!(after(&plan)["default-runtime"], "crun");
    }

    #[test]
    fn cdi_spec_dirs_follow_nvshim_s_on_docker_25_and_later() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = opts(dir.path());
        o.enable_cdi = true;
        o.cdi_spec_dirs = vec![PathBuf::from("/srv/cdi")];
        for (release, want) in [
            (Some((26, 1)), Some(serde_json::json!(["/srv/cdi"]))),
            (Some((28, 5)), Some(serde_json::json!(["/srv/cdi"]))),
            // Before 25 dockerd refuses the key; an unknown release might be such a one.
            (Some((20, 10)), None),
            (None, None),
        ] {
            o.engine_version = release;
            std::fs::write(&o.config, "{}").unwrap();
            plan_configure(&o).unwrap().apply().unwrap();
            assert_eq!(
                read(&o.config).get("cdi-spec-dirs"),
                want.as_ref(),
                "{release:?}"
            );
            let reg = crate::ops::engine::registration(&o).unwrap();
            if want.is_some() {
                assert_eq!(reg.cdi_spec_dirs, Some(vec![PathBuf::from("/srv/cdi")]));
            }
            plan_unconfigure(&o).unwrap().apply().unwrap();
            assert_eq!(read(&o.config), serde_json::json!({}), "{release:?}");
        }
        // nvshim's defaults are Docker's: nothing written; an admin's own list is kept.
        o.engine_version = Some((26, 1));
        o.cdi_spec_dirs = crate::ops::engine::ENGINE_CDI_SPEC_DIRS
            .map(PathBuf::from)
            .to_vec();
        std::fs::write(&o.config, "{}").unwrap();
        plan_configure(&o).unwrap().apply().unwrap();
        assert_eq!(read(&o.config).get("cdi-spec-dirs"), None);
        o.cdi_spec_dirs = vec![PathBuf::from("/srv/cdi")];
        std::fs::write(&o.config, r#"{"cdi-spec-dirs": ["/etc/cdi"]}"#).unwrap();
        plan_configure(&o).unwrap().apply().unwrap();
        assert_eq!(
            read(&o.config)["cdi-spec-dirs"],
            serde_json::json!(["/etc/cdi"])
        );
        plan_unconfigure(&o).unwrap().apply().unwrap();
        assert_eq!(
            read(&o.config)["cdi-spec-dirs"],
            serde_json::json!(["/etc/cdi"])
        );
    }

    #[test]
    fn cdi_feature_follows_the_docker_release() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = opts(dir.path());
        o.enable_cdi = true;
        let with = |o: &Options, text: &str| {
            std::fs::write(&o.config, text).unwrap();
            after(&plan_configure(o).unwrap())
        };
        // 25-27 and unknown releases: turned on; 28+ has it on; before 25 there is no CDI.
        for (release, want) in [
            (Some((25, 0)), Some(true)),
            (Some((27, 5)), Some(true)),
            (None, Some(true)),
            (Some((28, 5)), None),
            (Some((20, 10)), None),
        ] {
            o.engine_version = release;
            let v = with(&o, r#"{"features": {"buildkit": true}}"#);
            assert_eq!(v["features"]["buildkit"], true);
            assert_eq!(
                v["features"].get("cdi").and_then(Value::as_bool),
                want,
                "{release:?}"
            );
        }
        // Turned off on 28: turned on again, and back off on unconfigure.
        o.engine_version = Some((28, 5));
        std::fs::write(&o.config, r#"{"features": {"cdi": false}}"#).unwrap();
        let before = crate::ops::engine::registration(&o).unwrap();
        assert_eq!(before.cdi_enabled, Some(false));
        assert!(before.cdi_setting.unwrap().contains("features.cdi = false"));
        plan_configure(&o).unwrap().apply().unwrap();
        assert_eq!(read(&o.config)["features"]["cdi"], true);
        assert_eq!(
            crate::ops::engine::registration(&o).unwrap().cdi_enabled,
            Some(true)
        );
        plan_unconfigure(&o).unwrap().apply().unwrap();
        assert_eq!(
            read(&o.config),
            serde_json::json!({"features": {"cdi": false}})
        );
        // An admin's own `cdi: true` is not nvshim's to remove.
        o.engine_version = Some((26, 1));
        std::fs::write(&o.config, r#"{"features": {"cdi": true}}"#).unwrap();
        plan_configure(&o).unwrap().apply().unwrap();
        plan_unconfigure(&o).unwrap().apply().unwrap();
        assert_eq!(
            read(&o.config),
            serde_json::json!({"features": {"cdi": true}})
        );
        // Added where absent: removed with the `features` object it needed.
        std::fs::write(&o.config, "{}").unwrap();
        plan_configure(&o).unwrap().apply().unwrap();
        plan_unconfigure(&o).unwrap().apply().unwrap();
        assert_eq!(read(&o.config), serde_json::json!({}));
        std::fs::write(&o.config, r#"{"features": {"cdi": "yes"}}"#).unwrap();
        let err = plan_configure(&o).unwrap_err().to_string();
        assert!(
            err.contains("features.cdi is a string, expected a boolean"),
            "{err}"
        );
    }

    #[test]
    fn empty_file_is_an_empty_config() {
        let dir = tempfile::tempdir().unwrap();
        let o = opts(dir.path());
        std::fs::write(&o.config, "\n").unwrap();
        let v = after(&plan_configure(&o).unwrap());
        assert!(v["runtimes"]["nvidia"].is_object());
        assert_eq!(detect_indent("{\n  \"a\": 1\n}"), "  ");
        let _ = PathBuf::new();
    }
}
