//! containerd: a CRI runtime `nvidia` of type `io.containerd.runc.v2` whose runc shim execs
//! `nvshim-runtime` (`options.BinaryName`), carrying over the default runtime's settings.
//!
//! Config layouts (containerd `docs/cri/config.md`, `RELEASES.md`): version 1 has the CRI
//! plugin at `plugins.cri`, version 2 (containerd 1.x) at `plugins."io.containerd.grpc.v1.cri"`,
//! version 3 (containerd 2.x) splits it and runtimes live under
//! `plugins."io.containerd.cri.v1.runtime"` (the toolkit's PR#805/#862, field-lessons.md §2.7).
//!
//! Two containerd 1.6 behaviours shape this file, both seen with `containerd config dump`:
//! - A file that names any CRI runtime replaces the built-in runtimes map, so adding `nvidia` to
//!   a config that relies on the built-in `runc` would remove `runc`: the writer then adds
//!   `runc` explicitly.
//! - An imported file's plugin section *replaces* the main file's section for that plugin
//!   (`mergeConfig` in `services/server/config`: "Replace entire sections instead of merging
//!   map's values"; containerd#6389). A drop-in holding only the `nvidia` runtime would wipe
//!   `sandbox_image`, `SystemdCgroup` and every other CRI setting. So when the config uses
//!   `imports`, the drop-in carries the whole effective CRI section (main file, then each
//!   import in order) plus the runtime, as NVIDIA's 1.18 drop-ins do. A later edit of the CRI
//!   section in the main file then needs `configure` again; `unconfigure` removes the drop-in.

use std::fs;
use std::path::{Path, PathBuf};

use toml_edit::{DocumentMut, Item, Table, TableLike, Value};

use super::file::read_optional;
use super::tomldoc::{self, add_to_array, ensure, get, remove_and_prune, set, shape_error};
use super::{change, check_ours, drop_in_header, EngineError, FileChange, Options};
use super::{CDI_ANNOTATION_PATTERN, DROP_IN_MARKER};

/// The runc shim: it runs `options.BinaryName` with runc's command line.
pub const RUNC_SHIM: &str = "io.containerd.runc.v2";

/// Where the CRI plugin's config lives for a config `version`.
pub fn cri_plugin(version: i64) -> &'static str {
    match version {
        1 => "cri",
        2 => "io.containerd.grpc.v1.cri",
        _ => "io.containerd.cri.v1.runtime",
    }
}

/// The config version: the `version` key, else 1 for a file with plugin sections (containerd
/// 1.x reads an unversioned file as version 1), else `None` for an empty file, which gets
/// `version = 2` (read by containerd 1.6, 1.7 and, migrated, by 2.x).
fn version(path: &Path, doc: &DocumentMut) -> Result<Option<i64>, EngineError> {
    match doc.get("version") {
        None if doc.contains_key("plugins") => Ok(Some(1)),
        None => Ok(None),
        Some(Item::Value(Value::Integer(v))) => match *v.value() {
            v @ 1..=3 => Ok(Some(v)),
            v => Err(EngineError::Unsupported {
                path: path.to_path_buf(),
                message: format!("config version {v} is not one nvshim knows (1, 2, 3)"),
            }),
        },
        Some(other) => Err(shape_error(path, &["version"], "an integer", other)),
    }
}

fn imports(path: &Path, doc: &DocumentMut) -> Result<Vec<String>, EngineError> {
    match doc.get("imports") {
        None => Ok(Vec::new()),
        Some(Item::Value(Value::Array(a))) => a
            .iter()
            .map(|v| {
                v.as_str().map(str::to_string).ok_or_else(|| {
                    shape_error(path, &["imports"], "an array of strings", &Item::None)
                })
            })
            .collect(),
        Some(other) => Err(shape_error(path, &["imports"], "an array", other)),
    }
}

pub fn configure(opts: &Options) -> Result<Vec<FileChange>, EngineError> {
    let path = &opts.config;
    let before = read_optional(path)?;
    let mut doc = tomldoc::parse(path, before.as_deref())?;
    let found = version(path, &doc)?;
    let version = found.unwrap_or(2);
    let imports = imports(path, &doc)?;

    if imports.is_empty() {
        if found.is_none() {
            doc.insert("version", toml_edit::value(version));
        }
        add_runtime(path, doc.as_item_mut(), version, opts)?;
        let after = doc.to_string();
        tomldoc::reparse(path, &after)?;
        return Ok(change(path, before, Some(after)).into_iter().collect());
    }

    let drop_in = drop_in_path(opts);
    let drop_before = read_optional(&drop_in)?;
    check_ours(&drop_in, drop_before.as_deref())?;
    let cri = cri_plugin(version);
    let mut effective =
        get(path, doc.as_item(), &["plugins", cri])?.map(|t| tomldoc::fresh_copy(t, false));
    for file in expand_imports(path, &imports)? {
        if file == drop_in {
            continue;
        }
        let Some(text) = read_optional(&file)? else {
            continue;
        };
        let imported = tomldoc::parse(&file, Some(&text))?;
        if let Some(t) = get(&file, imported.as_item(), &["plugins", cri])? {
            effective = Some(tomldoc::fresh_copy(t, false));
        }
    }
    let mut out = DocumentMut::new();
    out.insert("version", toml_edit::value(version));
    if let Some(section) = effective {
        let plugins = ensure(&drop_in, out.as_item_mut(), &["plugins"])?;
        if let Some(t) = plugins.as_table_like_mut() {
            t.insert(cri, section);
        }
    }
    add_runtime(&drop_in, out.as_item_mut(), version, opts)?;
    let drop_after = format!("{}{}", drop_in_header(opts), out);
    tomldoc::reparse(&drop_in, &drop_after)?;

    let mut changes: Vec<FileChange> = Vec::new();
    if !imports
        .iter()
        .any(|pattern| import_matches(path, pattern, &drop_in))
    {
        if let Some(Item::Value(Value::Array(existing))) = doc.get_mut("imports") {
            existing.push(drop_in.to_string_lossy().as_ref());
        }
        let after = doc.to_string();
        tomldoc::reparse(path, &after)?;
        changes.extend(change(path, before, Some(after)));
    }
    changes.extend(change(&drop_in, drop_before, Some(drop_after)));
    Ok(changes)
}

/// `options.BinaryName` of the runtime, from the main file and then each import in
/// containerd's order (a later file's CRI section replaces an earlier one's).
pub fn registration(opts: &Options) -> Result<super::Registration, EngineError> {
    let path = &opts.config;
    let text = read_optional(path)?;
    let doc = tomldoc::parse(path, text.as_deref())?;
    let cri = cri_plugin(version(path, &doc)?.unwrap_or(2));
    let mut files = vec![path.clone()];
    files.extend(expand_imports(path, &imports(path, &doc)?)?);
    let mut binary = None;
    for file in &files {
        let imported;
        let doc = if file == path {
            &doc
        } else {
            let Some(text) = read_optional(file)? else {
                continue;
            };
            imported = tomldoc::parse(file, Some(&text))?;
            &imported
        };
        let keys = ["plugins", cri, "containerd", "runtimes", &opts.runtime_name];
        if get(file, doc.as_item(), &["plugins", cri])?.is_some() {
            binary = get(file, doc.as_item(), &keys)?.map(|rt| {
                rt.get("options")
                    .and_then(Item::as_table_like)
                    .and_then(|o| o.get("BinaryName"))
                    .and_then(Item::as_str)
                    .unwrap_or_default()
                    .to_string()
            });
        }
    }
    Ok(super::Registration { files, binary })
}

pub fn unconfigure(opts: &Options) -> Result<Vec<FileChange>, EngineError> {
    let path = &opts.config;
    let mut changes = Vec::new();
    if let Some(before) = read_optional(path)? {
        let mut doc = tomldoc::parse(path, Some(&before))?;
        if let Some(version) = version(path, &doc)? {
            remove_runtime(path, doc.as_item_mut(), version, opts)?;
        }
        let drop_in = drop_in_path(opts);
        if let Some(Item::Value(Value::Array(a))) = doc.get_mut("imports") {
            a.retain(|v| v.as_str().map(Path::new) != Some(drop_in.as_path()));
        }
        let after = doc.to_string();
        changes.extend(change(path, Some(before), Some(after)));
    }
    let drop_in = drop_in_path(opts);
    if let Some(text) = read_optional(&drop_in)? {
        if text.starts_with(DROP_IN_MARKER) {
            changes.extend(change(&drop_in, Some(text), None));
        }
    }
    Ok(changes)
}

fn drop_in_path(opts: &Options) -> PathBuf {
    opts.drop_in.clone().unwrap_or_else(|| {
        super::Engine::Containerd
            .default_drop_in(&opts.config)
            .unwrap_or_else(|| PathBuf::from("/etc/containerd/conf.d/99-nvshim.toml"))
    })
}

/// Is `runtime_type` one the runc shim serves (absent means containerd's default, runc v2)?
fn is_runc_shim(t: &dyn TableLike) -> bool {
    match t.get("runtime_type").and_then(Item::as_str) {
        None | Some("") => true,
        Some(ty) => ty.starts_with("io.containerd.runc."),
    }
}

/// Adds (or brings up to date) the runtime under `root` (a whole config, or a drop-in).
fn add_runtime(
    path: &Path,
    root: &mut Item,
    version: i64,
    opts: &Options,
) -> Result<(), EngineError> {
    let cri = cri_plugin(version);
    let ctd_keys = ["plugins", cri, "containerd"];
    let rt_keys = ["plugins", cri, "containerd", "runtimes"];
    let name = opts.runtime_name.as_str();

    // Read what is there before changing anything.
    let default_name = get(path, root, &ctd_keys)?
        .and_then(|t| t.get("default_runtime_name"))
        .and_then(Item::as_str)
        .filter(|n| !n.is_empty() && *n != name)
        .unwrap_or("runc")
        .to_string();
    let (runtimes_empty, exists, source) = match get(path, root, &rt_keys)? {
        None => (true, false, None),
        Some(rts) => {
            let mut source = None;
            // The options of the runtime pods get today (SystemdCgroup, above all: without it
            // the node's cgroup driver and the GPU pods' disagree, nvidia-docker#1788).
            for candidate in [default_name.as_str(), "runc", "crun"] {
                if candidate == name {
                    continue;
                }
                let Some(item) = rts.get(candidate) else {
                    continue;
                };
                let Some(t) = item.as_table_like() else {
                    let mut keys = rt_keys.to_vec();
                    keys.push(candidate);
                    return Err(shape_error(path, &keys, "a table", item));
                };
                if is_runc_shim(t) {
                    source = Some(tomldoc::fresh_copy(t, item.is_inline_table()));
                    break;
                }
            }
            (rts.is_empty(), rts.contains_key(name), source)
        }
    };

    let runtimes = ensure(path, root, &rt_keys)?;
    let inline = runtimes.is_inline_table();
    let new_table = || {
        if inline {
            Item::Value(Value::InlineTable(Default::default()))
        } else {
            Item::Table(Table::new())
        }
    };
    if let Some(t) = runtimes.as_table_like_mut() {
        if runtimes_empty && !t.contains_key("runc") {
            // See the module comment: naming `nvidia` alone would drop the built-in `runc`.
            let mut runc = new_table();
            set(&mut runc, "runtime_type", RUNC_SHIM.into());
            t.insert("runc", runc);
        }
        if !exists {
            t.insert(name, source.unwrap_or_else(new_table));
        }
    }
    let mut keys = rt_keys.to_vec();
    keys.push(name);
    let runtime = ensure(path, root, &keys)?;
    set(runtime, "runtime_type", RUNC_SHIM.into());
    // CRI copies container annotations into the OCI spec only when the runtime lists them:
    // device plugins ask for CDI devices with `cdi.k8s.io/<name>` annotations.
    add_to_array(
        path,
        &keys,
        runtime,
        "container_annotations",
        CDI_ANNOTATION_PATTERN,
    )?;
    keys.push("options");
    let options = ensure(path, root, &keys)?;
    set(
        options,
        "BinaryName",
        opts.runtime_path.to_string_lossy().as_ref().into(),
    );
    if opts.set_as_default {
        let ctd = ensure(path, root, &ctd_keys)?;
        set(ctd, "default_runtime_name", name.into());
    }
    Ok(())
}

fn remove_runtime(
    path: &Path,
    root: &mut Item,
    version: i64,
    opts: &Options,
) -> Result<(), EngineError> {
    let cri = cri_plugin(version);
    let ctd_keys = ["plugins", cri, "containerd"];
    let name = opts.runtime_name.as_str();
    let is_default = get(path, root, &ctd_keys)?
        .and_then(|t| t.get("default_runtime_name"))
        .and_then(Item::as_str)
        == Some(name);
    remove_and_prune(root, &["plugins", cri, "containerd", "runtimes"], name);
    if is_default {
        // containerd's own default is runc.
        remove_and_prune(root, &ctd_keys, "default_runtime_name");
    }
    Ok(())
}

/// Where containerd looks for one `imports` entry (`resolveImports` in containerd 1.6/1.7
/// `services/server/config`): a plain relative path is joined to the config's directory, but a
/// pattern with `*` goes to `filepath.Glob` as it is, relative to the daemon's working
/// directory, which is `/` under systemd.
fn resolve_import(config: &Path, entry: &str) -> PathBuf {
    if Path::new(entry).is_absolute() {
        PathBuf::from(entry)
    } else if entry.contains('*') {
        Path::new("/").join(entry)
    } else {
        config.parent().unwrap_or(Path::new("/")).join(entry)
    }
}

/// The files an `imports` list names, in containerd's order: each entry in turn, a `*`
/// pattern expanded (in the file name only) and sorted, as Go's `filepath.Glob` does.
fn expand_imports(config: &Path, imports: &[String]) -> Result<Vec<PathBuf>, EngineError> {
    let mut out = Vec::new();
    for entry in imports {
        let full = resolve_import(config, entry);
        if !entry.contains('*') {
            out.push(full);
            continue;
        }
        let (Some(parent), Some(name)) = (full.parent(), full.file_name()) else {
            continue;
        };
        let name = name.to_string_lossy();
        let entries = match fs::read_dir(parent) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => {
                return Err(EngineError::Read {
                    path: parent.to_path_buf(),
                    source,
                })
            }
        };
        let mut matched: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .filter(|e| glob_match(&name, &e.file_name().to_string_lossy()))
            .map(|e| e.path())
            .collect();
        matched.sort();
        out.extend(matched);
    }
    Ok(out)
}

fn import_matches(config: &Path, entry: &str, file: &Path) -> bool {
    let full = resolve_import(config, entry);
    if !entry.contains('*') {
        return full == file;
    }
    match (
        full.parent(),
        full.file_name(),
        file.parent(),
        file.file_name(),
    ) {
        (Some(pd), Some(pn), Some(fd), Some(fname)) => {
            pd == fd && glob_match(&pn.to_string_lossy(), &fname.to_string_lossy())
        }
        _ => false,
    }
}

/// Shell-style matching of one path component: `*`, `?` and `[...]` classes (with `^`/`!`
/// negation and ranges), as Go's `filepath.Match`.
fn glob_match(pattern: &str, name: &str) -> bool {
    fn class(p: &[char], c: char) -> Option<(bool, usize)> {
        // Returns (matched, length of the class including brackets).
        let mut i = 1;
        let negate = matches!(p.get(i), Some('^') | Some('!'));
        if negate {
            i += 1;
        }
        let mut matched = false;
        let mut first = true;
        while i < p.len() {
            if p[i] == ']' && !first {
                return Some((matched != negate, i + 1));
            }
            first = false;
            let lo = p[i];
            if p.get(i + 1) == Some(&'-') && p.get(i + 2).is_some_and(|c| *c != ']') {
                let hi = p[i + 2];
                matched |= lo <= c && c <= hi;
                i += 3;
            } else {
                matched |= lo == c;
                i += 1;
            }
        }
        None
    }
    fn go(p: &[char], n: &[char]) -> bool {
        match p.first() {
            None => n.is_empty(),
            Some('*') => (0..=n.len()).any(|k| go(&p[1..], &n[k..])),
            Some('?') => !n.is_empty() && go(&p[1..], &n[1..]),
            Some('[') => match (n.first(), class(p, n.first().copied().unwrap_or('\0'))) {
                (Some(_), Some((true, len))) => go(&p[len..], &n[1..]),
                _ => false,
            },
            Some(c) => n.first() == Some(c) && go(&p[1..], &n[1..]),
        }
    }
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    go(&p, &n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{configure as plan, unconfigure as unplan, Engine, Plan};

    fn opts(dir: &Path) -> Options {
        let mut o = Options::new(Engine::Containerd, "/usr/bin/nvshim-runtime".into());
        o.config = dir.join("config.toml");
        o.drop_in = Engine::Containerd.default_drop_in(&o.config);
        o
    }

    fn only_after(plan: &Plan) -> String {
        assert_eq!(plan.changes.len(), 1, "{plan:?}");
        plan.changes[0].after.clone().unwrap()
    }

    fn parsed(text: &str) -> toml::Table {
        toml::from_str(text).unwrap()
    }

    fn at<'a>(t: &'a toml::Table, keys: &[&str]) -> &'a toml::Value {
        let mut cur = t.get(keys[0]).unwrap_or_else(|| panic!("no {}", keys[0]));
        for k in &keys[1..] {
            cur = cur.get(k).unwrap_or_else(|| panic!("no {k} in {keys:?}"));
        }
        cur
    }

    const V2: &str = r#"# containerd config (site managed)
version = 2
root = "/var/lib/containerd"

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "registry.k8s.io/pause:3.9"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes]
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
          runtime_type = "io.containerd.runc.v2"
          privileged_without_host_devices = false
          [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
            SystemdCgroup = true # the node uses systemd
            BinaryName = ""
    [plugins."io.containerd.grpc.v1.cri".registry]
      config_path = "/etc/containerd/certs.d"
"#;

    #[test]
    fn v2_copies_runc_options_and_keeps_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let o = opts(dir.path());
        fs::write(&o.config, V2).unwrap();
        let after = only_after(&plan(&o).unwrap());
        assert!(after.starts_with(V2.lines().next().unwrap()), "{after}");
        assert!(
            after.contains("SystemdCgroup = true # the node uses systemd"),
            "{after}"
        );
        let t = parsed(&after);
        let rt = [
            "plugins",
            "io.containerd.grpc.v1.cri",
            "containerd",
            "runtimes",
            "nvidia",
        ];
        let nv = at(&t, &rt);
        assert_eq!(nv["runtime_type"].as_str(), Some(RUNC_SHIM));
        assert_eq!(nv["options"]["SystemdCgroup"].as_bool(), Some(true));
        assert_eq!(
            nv["options"]["BinaryName"].as_str(),
            Some("/usr/bin/nvshim-runtime")
        );
        assert_eq!(nv["privileged_without_host_devices"].as_bool(), Some(false));
        assert_eq!(
            nv["container_annotations"].as_array().unwrap()[0].as_str(),
            Some("cdi.k8s.io/*")
        );
        // runc untouched, default untouched without --set-as-default.
        let runc = at(
            &t,
            &[
                "plugins",
                "io.containerd.grpc.v1.cri",
                "containerd",
                "runtimes",
                "runc",
            ],
        );
        assert_eq!(runc["options"]["BinaryName"].as_str(), Some(""));
        assert_eq!(
            at(
                &t,
                &[
                    "plugins",
                    "io.containerd.grpc.v1.cri",
                    "containerd",
                    "default_runtime_name"
                ]
            )
            .as_str(),
            Some("runc")
        );
        assert_eq!(at(&t, &["root"]).as_str(), Some("/var/lib/containerd"));
        // The new table prints right after runc's.
        let runc_opts = after.find("runtimes.runc.options]").unwrap();
        let nvidia = after.find("runtimes.nvidia]").unwrap();
        let registry = after.find(".registry]").unwrap();
        assert!(runc_opts < nvidia && nvidia < registry, "{after}");
        // Idempotent, and unconfigure gives the original text back.
        plan(&o).unwrap().apply().unwrap();
        assert!(plan(&o).unwrap().is_empty());
        assert_eq!(only_after(&unplan(&o).unwrap()), V2);
    }

    #[test]
    fn set_as_default_and_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = opts(dir.path());
        o.set_as_default = true;
        fs::write(&o.config, V2).unwrap();
        let p = plan(&o).unwrap();
        let t = parsed(&only_after(&p));
        assert_eq!(
            at(
                &t,
                &[
                    "plugins",
                    "io.containerd.grpc.v1.cri",
                    "containerd",
                    "default_runtime_name"
                ]
            )
            .as_str(),
            Some("nvidia")
        );
        p.apply().unwrap();
        assert!(plan(&o).unwrap().is_empty());
        // Unconfigure removes the runtime and the default that named it (containerd's default
        // is runc again).
        let back = parsed(&only_after(&unplan(&o).unwrap()));
        let ctd = at(
            &back,
            &["plugins", "io.containerd.grpc.v1.cri", "containerd"],
        );
        assert!(ctd.get("default_runtime_name").is_none());
        assert!(ctd["runtimes"].get("nvidia").is_none());
    }

    #[test]
    fn v3_layout() {
        let dir = tempfile::tempdir().unwrap();
        let o = opts(dir.path());
        fs::write(
            &o.config,
            "version = 3\n\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]\n  runtime_type = 'io.containerd.runc.v2'\n  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]\n    SystemdCgroup = true\n",
        )
        .unwrap();
        let t = parsed(&only_after(&plan(&o).unwrap()));
        let nv = at(
            &t,
            &[
                "plugins",
                "io.containerd.cri.v1.runtime",
                "containerd",
                "runtimes",
                "nvidia",
            ],
        );
        assert_eq!(nv["options"]["SystemdCgroup"].as_bool(), Some(true));
        assert_eq!(
            nv["options"]["BinaryName"].as_str(),
            Some("/usr/bin/nvshim-runtime")
        );
    }

    #[test]
    fn missing_or_empty_file_gets_version_2_and_keeps_runc() {
        let dir = tempfile::tempdir().unwrap();
        let o = opts(dir.path());
        for text in [None, Some("# nothing here\n")] {
            if let Some(text) = text {
                fs::write(&o.config, text).unwrap();
            }
            let after = only_after(&plan(&o).unwrap());
            let t = parsed(&after);
            assert_eq!(t["version"].as_integer(), Some(2));
            let rts = at(
                &t,
                &[
                    "plugins",
                    "io.containerd.grpc.v1.cri",
                    "containerd",
                    "runtimes",
                ],
            );
            assert_eq!(
                rts["runc"]["runtime_type"].as_str(),
                Some(RUNC_SHIM),
                "{after}"
            );
            assert_eq!(
                rts["nvidia"]["options"]["BinaryName"].as_str(),
                Some("/usr/bin/nvshim-runtime")
            );
        }
    }

    #[test]
    fn version_1_layout() {
        let dir = tempfile::tempdir().unwrap();
        let o = opts(dir.path());
        fs::write(
            &o.config,
            "[plugins.cri.containerd]\n  snapshotter = \"overlayfs\"\n",
        )
        .unwrap();
        let t = parsed(&only_after(&plan(&o).unwrap()));
        assert!(t.get("version").is_none());
        let nv = at(&t, &["plugins", "cri", "containerd", "runtimes", "nvidia"]);
        assert_eq!(nv["runtime_type"].as_str(), Some(RUNC_SHIM));
    }

    #[test]
    fn existing_runtime_keeps_admin_settings() {
        let dir = tempfile::tempdir().unwrap();
        let o = opts(dir.path());
        fs::write(
            &o.config,
            "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia]\n  runtime_type = \"io.containerd.runc.v2\"\n  privileged_without_host_devices = true\n  [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia.options]\n    BinaryName = \"/usr/bin/nvidia-container-runtime\"\n",
        )
        .unwrap();
        let t = parsed(&only_after(&plan(&o).unwrap()));
        let nv = at(
            &t,
            &[
                "plugins",
                "io.containerd.grpc.v1.cri",
                "containerd",
                "runtimes",
                "nvidia",
            ],
        );
        assert_eq!(nv["privileged_without_host_devices"].as_bool(), Some(true));
        assert_eq!(
            nv["options"]["BinaryName"].as_str(),
            Some("/usr/bin/nvshim-runtime")
        );
    }

    #[test]
    fn inline_tables_are_edited_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let o = opts(dir.path());
        fs::write(
            &o.config,
            "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\nruntimes = { runc = { runtime_type = \"io.containerd.runc.v2\", options = { SystemdCgroup = true } } }\n",
        )
        .unwrap();
        let t = parsed(&only_after(&plan(&o).unwrap()));
        let nv = at(
            &t,
            &[
                "plugins",
                "io.containerd.grpc.v1.cri",
                "containerd",
                "runtimes",
                "nvidia",
            ],
        );
        assert_eq!(nv["options"]["SystemdCgroup"].as_bool(), Some(true));
        assert_eq!(
            nv["options"]["BinaryName"].as_str(),
            Some("/usr/bin/nvshim-runtime")
        );
    }

    #[test]
    fn errors_leave_files_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let o = opts(dir.path());
        for (text, want) in [
            ("version = 2\n[plugins\n", "cannot parse"),
            ("version = 9\n", "config version 9"),
            (
                "version = 2\nplugins = 3\n",
                "plugins is an integer, expected a table",
            ),
            (
                "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\nruntimes = []\n",
                "runtimes is an array, expected a table",
            ),
        ] {
            fs::write(&o.config, text).unwrap();
            let err = plan(&o).unwrap_err().to_string();
            assert!(
                err.contains(want) && err.contains("config.toml"),
                "{text:?}: {err}"
            );
            assert_eq!(fs::read_to_string(&o.config).unwrap(), text);
        }
    }

    #[test]
    fn imports_get_a_drop_in_with_the_whole_cri_section() {
        let dir = tempfile::tempdir().unwrap();
        let o = opts(dir.path());
        let main = format!(
            "imports = [\"{}/conf.d/*.toml\"]\n{}",
            dir.path().display(),
            V2.replace("# containerd config (site managed)\n", "")
        );
        fs::write(&o.config, &main).unwrap();
        fs::create_dir_all(dir.path().join("conf.d")).unwrap();
        // An earlier import that replaces the CRI section: it is what containerd uses.
        fs::write(
            dir.path().join("conf.d/10-site.toml"),
            "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"site/pause:1\"\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n  SystemdCgroup = true\n",
        )
        .unwrap();
        let p = plan(&o).unwrap();
        assert_eq!(
            p.changes.len(),
            1,
            "the main file already imports conf.d/*.toml: {p:?}"
        );
        let drop_in = dir.path().join("conf.d/99-nvshim.toml");
        assert_eq!(p.changes[0].path, drop_in);
        let text = p.changes[0].after.clone().unwrap();
        assert!(text.starts_with(DROP_IN_MARKER), "{text}");
        let t = parsed(&text);
        let cri = at(&t, &["plugins", "io.containerd.grpc.v1.cri"]);
        assert_eq!(cri["sandbox_image"].as_str(), Some("site/pause:1"));
        let nv = &cri["containerd"]["runtimes"]["nvidia"];
        assert_eq!(nv["options"]["SystemdCgroup"].as_bool(), Some(true));
        assert!(cri["containerd"]["runtimes"].get("runc").is_some());
        p.apply().unwrap();
        assert_eq!(
            fs::read_to_string(&o.config).unwrap(),
            main,
            "main config untouched"
        );
        assert!(plan(&o).unwrap().is_empty());
        let un = unplan(&o).unwrap();
        assert_eq!(un.changes.len(), 1);
        assert_eq!(un.changes[0].after, None);
    }

    #[test]
    fn imports_not_covering_the_drop_in_are_extended() {
        let dir = tempfile::tempdir().unwrap();
        let o = opts(dir.path());
        fs::write(
            &o.config,
            "version = 2\nimports = [\"/elsewhere/*.toml\"]\n",
        )
        .unwrap();
        let p = plan(&o).unwrap();
        assert_eq!(p.changes.len(), 2);
        let t = parsed(p.changes[0].after.as_deref().unwrap());
        let drop_in = dir.path().join("conf.d/99-nvshim.toml");
        assert_eq!(
            t["imports"].as_array().unwrap()[1].as_str(),
            Some(drop_in.to_str().unwrap())
        );
        p.apply().unwrap();
        assert!(plan(&o).unwrap().is_empty());
        let un = unplan(&o).unwrap();
        assert_eq!(
            un.changes[0].after.as_deref(),
            Some("version = 2\nimports = [\"/elsewhere/*.toml\"]\n")
        );
    }

    #[test]
    fn foreign_drop_in_is_not_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let o = opts(dir.path());
        fs::write(
            &o.config,
            format!(
                "version = 2\nimports = [\"{}/conf.d/*.toml\"]\n",
                dir.path().display()
            ),
        )
        .unwrap();
        fs::create_dir_all(dir.path().join("conf.d")).unwrap();
        fs::write(dir.path().join("conf.d/99-nvshim.toml"), "version = 2\n").unwrap();
        assert!(plan(&o).is_err());
    }

    #[test]
    fn globs() {
        assert!(glob_match("*.toml", "99-nvshim.toml"));
        assert!(!glob_match("*.toml", "99-nvshim.toml.nvshim.bak"));
        assert!(glob_match("9?-*.toml", "99-a.toml"));
        assert!(glob_match("[0-9]*.toml", "5.toml"));
        assert!(!glob_match("[!0-9]*.toml", "5.toml"));
        let drop_in = Path::new("/etc/containerd/conf.d/99-nvshim.toml");
        let config = Path::new("/etc/containerd/config.toml");
        assert!(import_matches(
            config,
            "/etc/containerd/conf.d/*.toml",
            drop_in
        ));
        assert!(import_matches(config, "conf.d/99-nvshim.toml", drop_in));
        // containerd globs a relative pattern from its working directory, not the config's.
        assert!(!import_matches(config, "conf.d/*.toml", drop_in));
        assert!(import_matches(
            config,
            "etc/containerd/conf.d/*.toml",
            drop_in
        ));
        assert!(!import_matches(
            Path::new("/etc/containerd/config.toml"),
            "/etc/other/*.toml",
            Path::new("/etc/containerd/conf.d/99-nvshim.toml")
        ));
    }
}
