//! CRI-O: a drop-in `crio.conf.d/99-nvshim.toml` with `[crio.runtime.runtimes.nvidia]`
//! (`runtime_path`, `runtime_type = "oci"`), copying the default runtime's other settings
//! (`runtime_root`, `monitor_path`, `monitor_env`, ...).
//!
//! CRI-O reads `crio.conf`, then each file of `crio.conf.d` in lexical order, whatever its
//! name, each one's keys overriding earlier ones key by key (crio.conf.d(5): "Files in the
//! configuration directory are sorted by name in lexical order and applied in that order"), so
//! the drop-in needs only the runtime, and no other file of nvshim's may stay in that directory
//! (backups go to [`super::DEFAULT_BACKUP_DIR`]);
//! the main file is never edited (minimal drop-ins only). The
//! layout is `nvidia-ctk runtime configure --runtime crio`'s (`pkg/config/engine/crio`). CRI-O
//! injects CDI devices named in `cdi.k8s.io/*` annotations itself, so no annotation setting is
//! needed here.

use std::fs;
use std::path::{Path, PathBuf};

use toml_edit::{DocumentMut, Item};

use super::file::read_optional;
use super::tomldoc::{self, ensure, get, set};
use super::{change, check_ours, drop_in_header, EngineError, FileChange, Options, DROP_IN_MARKER};

pub fn configure(opts: &Options) -> Result<Vec<FileChange>, EngineError> {
    let drop_in = drop_in_path(opts);
    let before = read_optional(&drop_in)?;
    check_ours(&drop_in, before.as_deref())?;

    // The effective default runtime and its table, from the main file and the other drop-ins.
    let mut default_name: Option<String> = None;
    let mut runtimes: Vec<(String, Item)> = Vec::new();
    for file in config_files(&opts.config, &drop_in)? {
        let Some(text) = read_optional(&file)? else {
            continue;
        };
        let doc = tomldoc::parse(&file, Some(&text))?;
        if let Some(rt) = get(&file, doc.as_item(), &["crio", "runtime"])? {
            if let Some(name) = rt.get("default_runtime").and_then(Item::as_str) {
                default_name = Some(name.to_string());
            }
        }
        if let Some(rts) = get(&file, doc.as_item(), &["crio", "runtime", "runtimes"])? {
            for (name, item) in rts.iter() {
                if let Some(t) = item.as_table_like() {
                    runtimes.retain(|(n, _)| n != name);
                    runtimes.push((name.to_string(), tomldoc::fresh_copy(t, false)));
                }
            }
        }
    }
    // CRI-O's built-in default is crun since 1.28, runc before.
    let candidates: Vec<String> = match default_name {
        Some(n) => vec![n],
        None => vec!["crun".into(), "runc".into()],
    };
    let source = candidates
        .iter()
        .filter(|c| **c != opts.runtime_name)
        .find_map(|c| {
            runtimes
                .iter()
                .find(|(n, _)| n == c)
                .map(|(_, t)| t.clone())
        })
        .filter(|t| {
            t.get("runtime_type")
                .and_then(Item::as_str)
                .is_none_or(|ty| ty == "oci" || ty.is_empty())
        });

    let mut doc = DocumentMut::new();
    let mut changes = legacy_backup_removal(&drop_in)?;
    if opts.set_as_default {
        let rt = ensure(&drop_in, doc.as_item_mut(), &["crio", "runtime"])?;
        set(rt, "default_runtime", opts.runtime_name.as_str().into());
    }
    let runtimes_item = ensure(
        &drop_in,
        doc.as_item_mut(),
        &["crio", "runtime", "runtimes"],
    )?;
    if let (Some(t), Some(source)) = (runtimes_item.as_table_like_mut(), source) {
        t.insert(&opts.runtime_name, source);
    }
    let runtime = ensure(
        &drop_in,
        doc.as_item_mut(),
        &["crio", "runtime", "runtimes", &opts.runtime_name],
    )?;
    set(
        runtime,
        "runtime_path",
        opts.runtime_path.to_string_lossy().as_ref().into(),
    );
    set(runtime, "runtime_type", "oci".into());
    let after = format!("{}{}", drop_in_header(opts), doc);
    tomldoc::reparse(&drop_in, &after)?;
    changes.extend(change(&drop_in, before, Some(after)));
    Ok(changes)
}

pub fn unconfigure(opts: &Options) -> Result<Vec<FileChange>, EngineError> {
    let drop_in = drop_in_path(opts);
    let mut changes = legacy_backup_removal(&drop_in)?;
    if let Some(text) = read_optional(&drop_in)? {
        if text.starts_with(DROP_IN_MARKER) {
            changes.extend(change(&drop_in, Some(text), None));
        }
    }
    Ok(changes)
}

/// Removes `<drop-in>.nvshim.bak`, where earlier nvshim kept the previous drop-in: CRI-O
/// reads it as a config (an old `runtime_path` after the new one's drop-in, or the runtime
/// still registered after `unconfigure`). Only a file nvshim wrote.
fn legacy_backup_removal(drop_in: &Path) -> Result<Vec<FileChange>, EngineError> {
    let mut name = drop_in.file_name().unwrap_or_default().to_os_string();
    name.push(".nvshim.bak");
    let legacy = drop_in.with_file_name(name);
    Ok(match read_optional(&legacy)? {
        Some(text) if text.starts_with(DROP_IN_MARKER) => {
            change(&legacy, Some(text), None).into_iter().collect()
        }
        _ => Vec::new(),
    })
}

/// `runtime_path` of the runtime from `crio.conf` and every drop-in, later files winning key by
/// key as CRI-O merges them.
pub fn registration(opts: &Options) -> Result<super::Registration, EngineError> {
    let drop_in = drop_in_path(opts);
    let mut files = config_files(&opts.config, &drop_in)?;
    if drop_in.is_file() {
        files.push(drop_in);
        files.sort_by(|a, b| (a != &opts.config).cmp(&(b != &opts.config)).then(a.cmp(b)));
    }
    let mut binary: Option<String> = None;
    for file in &files {
        let Some(text) = read_optional(file)? else {
            continue;
        };
        let doc = tomldoc::parse(file, Some(&text))?;
        let keys = ["crio", "runtime", "runtimes", &opts.runtime_name];
        if let Some(rt) = get(file, doc.as_item(), &keys)? {
            if let Some(p) = rt.get("runtime_path").and_then(Item::as_str) {
                binary = Some(p.to_string());
            } else if binary.is_none() {
                binary = Some(String::new());
            }
        }
    }
    // CRI-O has read CDI specs for `cdi.k8s.io/*` annotations and CRI CDI devices since 1.23,
    // with no switch to turn it off.
    Ok(super::Registration {
        files,
        binary,
        cdi_enabled: None,
        cdi_setting: None,
        cdi_spec_dirs: None,
        warnings: Vec::new(),
    })
}

fn drop_in_path(opts: &Options) -> PathBuf {
    opts.drop_in.clone().unwrap_or_else(|| {
        super::Engine::Crio
            .default_drop_in(&opts.config)
            .unwrap_or_else(|| PathBuf::from("/etc/crio/crio.conf.d/99-nvshim.toml"))
    })
}

/// The main config, then the files of the drop-in's directory in lexical order (every one, as
/// CRI-O reads them), without the drop-in itself.
fn config_files(config: &Path, drop_in: &Path) -> Result<Vec<PathBuf>, EngineError> {
    let mut files = vec![config.to_path_buf()];
    let Some(dir) = drop_in.parent() else {
        return Ok(files);
    };
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(files),
        Err(source) => {
            return Err(EngineError::Read {
                path: dir.to_path_buf(),
                source,
            })
        }
    };
    let mut others: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p != drop_in && p.is_file())
        .collect();
    others.sort();
    files.extend(others);
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::engine::{configure as plan, unconfigure as unplan, Engine};

    fn opts(dir: &Path) -> Options {
        let mut o = Options::new(Engine::Crio, "/usr/bin/nvshim-runtime".into());
        o.config = dir.join("crio.conf");
        o.backup_dir = dir.join("backups");
        o.drop_in = Engine::Crio.default_drop_in(&o.config);
        o
    }

    #[test]
    fn drop_in_copies_the_default_runtime() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = opts(dir.path());
        o.set_as_default = true;
        let main = "[crio.runtime]\ndefault_runtime = \"runc\"\n\n[crio.runtime.runtimes.runc]\nruntime_path = \"/usr/bin/runc\"\nruntime_root = \"/run/runc\"\nmonitor_path = \"/usr/libexec/crio/conmon\"\n";
        fs::write(&o.config, main).unwrap();
        let p = plan(&o).unwrap();
        assert_eq!(p.changes.len(), 1);
        assert_eq!(
            p.changes[0].path,
            dir.path().join("crio.conf.d/99-nvshim.toml")
        );
        let text = p.changes[0].after.clone().unwrap();
        assert!(text.starts_with(DROP_IN_MARKER));
        let t: toml::Table = toml::from_str(&text).unwrap();
        let rt = &t["crio"]["runtime"];
        assert_eq!(rt["default_runtime"].as_str(), Some("nvidia"));
        let nv = &rt["runtimes"]["nvidia"];
        assert_eq!(nv["runtime_path"].as_str(), Some("/usr/bin/nvshim-runtime"));
        assert_eq!(nv["runtime_type"].as_str(), Some("oci"));
        assert_eq!(nv["runtime_root"].as_str(), Some("/run/runc"));
        assert_eq!(
            nv["monitor_path"].as_str(),
            Some("/usr/libexec/crio/conmon")
        );
        p.apply().unwrap();
        assert_eq!(
            fs::read_to_string(&o.config).unwrap(),
            main,
            "main file untouched"
        );
        assert!(plan(&o).unwrap().is_empty(), "idempotent");
        let un = unplan(&o).unwrap();
        assert_eq!(un.changes[0].after, None);
    }

    #[test]
    fn no_config_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let o = opts(dir.path());
        let p = plan(&o).unwrap();
        let text = p.changes[0].after.clone().unwrap();
        let t: toml::Table = toml::from_str(&text).unwrap();
        let nv = &t["crio"]["runtime"]["runtimes"]["nvidia"];
        assert_eq!(nv["runtime_path"].as_str(), Some("/usr/bin/nvshim-runtime"));
        assert!(t["crio"]["runtime"].get("default_runtime").is_none());
    }

    #[test]
    fn later_drop_ins_win_and_bad_ones_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let o = opts(dir.path());
        fs::create_dir_all(dir.path().join("crio.conf.d")).unwrap();
        fs::write(
            dir.path().join("crio.conf.d/10-crun.conf"),
            "[crio.runtime.runtimes.crun]\nruntime_root = \"/run/crun\"\n",
        )
        .unwrap();
        let text = plan(&o).unwrap().changes[0].after.clone().unwrap();
        let t: toml::Table = toml::from_str(&text).unwrap();
        assert_eq!(
            t["crio"]["runtime"]["runtimes"]["nvidia"]["runtime_root"].as_str(),
            Some("/run/crun")
        );
        fs::write(dir.path().join("crio.conf.d/20-bad.conf"), "[crio\n").unwrap();
        let err = plan(&o).unwrap_err().to_string();
        assert!(err.contains("20-bad.conf"), "{err}");
    }
}
