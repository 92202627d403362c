//! containerd: a CRI runtime `nvidia` of type `io.containerd.runc.v2` whose runc shim execs
//! `nvshim-runtime` (`options.BinaryName`), carrying over the default runtime's settings.
//!
//! Config layouts (containerd `docs/cri/config.md`, `RELEASES.md`): version 1 has the CRI
//! plugin at `plugins.cri`, version 2 (containerd 1.x) at `plugins."io.containerd.grpc.v1.cri"`,
//! version 3 (containerd 2.0-2.2) splits it and runtimes live under
//! `plugins."io.containerd.cri.v1.runtime"` (NVIDIA's toolkit PR#805/#862).
//! Version 4 (containerd 2.3) keeps that runtime section; a later version is read the same way,
//! with a warning. What each release's `containerd config default` prints is in
//! tests/fixtures/engine-configs/ (2.3's imports `conf.d/*.toml`, so nvshim writes its drop-in).
//!
//! Engine CDI: the CRI plugin's `enable_cdi` (in the same section as the runtimes) is off by
//! default in containerd 1.7 and on in 2.x; 1.6 has no CDI. Where it is off, `configure` turns
//! it on with a comment marking the line as nvshim's, and `unconfigure` reverts marked lines
//! only.
//!
//! Two containerd 1.6 behaviours shape this file, both seen with `containerd config dump`:
//! - A file that names any CRI runtime replaces the built-in runtimes map, so adding `nvidia` to
//!   a config that relies on the built-in `runc` would remove `runc`: the writer then adds
//!   `runc` explicitly.
//! - An imported file's plugin section *replaces* the main file's section for that plugin
//!   (`mergeConfig` in `services/server/config`: "Replace entire sections instead of merging
//!   map's values"; containerd#6389). A drop-in holding only the `nvidia` runtime would wipe
//!   `sandbox_image`, `SystemdCgroup` and every other CRI setting. So for containerd 1.x
//!   (config version 2) with `imports`, the drop-in carries the whole effective CRI section
//!   (main file, then each import in order) plus the runtime, as NVIDIA's 1.18 drop-ins do.
//!
//! containerd 2.x (config version 3 and 4) merges imports key by key instead (its
//! `mergeConfig` no longer replaces plugin sections). There the drop-in holds the `nvidia`
//! runtime alone: a copy of the whole section would silently override every later edit of the
//! main file's CRI section (seen by hand with containerd 2.3.4's `config dump`: an admin's new
//! `cdi_spec_dirs` in config.toml was lost behind the copy). `unconfigure` removes the drop-in.
//!
//! One file (720 lines of code, 740 of tests): `configure`, `unconfigure` and `registration` edit
//! or read the same TOML document, and every step (the CRI section by config version, the
//! `enable_cdi` mark, the `imports` globs and the drop-in) depends on the version rules above.

use std::fs;
use std::path::{Path, PathBuf};

use toml_edit::{DocumentMut, Item, Table, TableLike, Value};

use super::file::read_optional;
use super::tomldoc::{self, add_to_array, ensure, get, remove_and_prune, set, shape_error};
use super::{change, check_ours, drop_in_header, EngineError, FileChange, Options, Plan};
use super::{CDI_ANNOTATION_PATTERN, DROP_IN_MARKER};

/// The runc shim: it runs `options.BinaryName` with runc's command line.
pub const RUNC_SHIM: &str = "io.containerd.runc.v2";

/// The newest config version nvshim has seen containerd write: 4 (`containerd config default`
/// of containerd 2.3; tests/fixtures/engine-configs/). Later versions are read with version 3's
/// layout, with a warning.
pub const NEWEST_KNOWN_VERSION: i64 = 4;

/// Where the CRI plugin's config lives for a config `version`. Version 4 (containerd 2.3)
/// changed other plugins but kept version 3's CRI runtime section, and NVIDIA's nvidia-ctk
/// reads every version from 3 up that way too.
pub fn cri_plugin(version: i64) -> &'static str {
    match version {
        ..=1 => "cri",
        2 => "io.containerd.grpc.v1.cri",
        _ => "io.containerd.cri.v1.runtime",
    }
}

/// What nvshim says about a config version newer than it knows.
fn version_warning(path: &Path, version: i64) -> Option<String> {
    (version > NEWEST_KNOWN_VERSION).then(|| {
        format!(
            "{}: config version {version} is newer than nvshim knows ({NEWEST_KNOWN_VERSION}); \
             it is read with version 3's layout (CRI runtimes under plugins.{:?}.containerd.runtimes): \
             check `containerd config dump` after restarting containerd",
            path.display(),
            cri_plugin(version)
        )
    })
}

/// The config version: the `version` key, else 1 for a file with plugin sections (containerd
/// 1.x reads an unversioned file as version 1), else `None` for an empty file, which gets
/// `version = 2` (read by containerd 1.6, 1.7 and, migrated, by 2.x).
fn version(path: &Path, doc: &DocumentMut) -> Result<Option<i64>, EngineError> {
    match doc.get("version") {
        None if doc.contains_key("plugins") => Ok(Some(1)),
        None => Ok(None),
        Some(Item::Value(Value::Integer(v))) => match *v.value() {
            v @ 1.. => Ok(Some(v)),
            v => Err(EngineError::Unsupported {
                path: path.to_path_buf(),
                message: format!(
                    "config version {v} is not one containerd writes (1 and up); \
                     set `version` to what `containerd config default` prints"
                ),
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

pub fn configure(opts: &Options) -> Result<Plan, EngineError> {
    let path = &opts.config;
    let before = read_optional(path)?;
    let mut doc = tomldoc::parse(path, before.as_deref())?;
    let found = version(path, &doc)?;
    let version = found.unwrap_or(2);
    let mut warnings: Vec<String> = version_warning(path, version).into_iter().collect();
    let imports = imports(path, &doc)?;

    if imports.is_empty() {
        if found.is_none() {
            doc.insert("version", toml_edit::value(version));
        }
        add_runtime(path, doc.as_item_mut(), version, opts)?;
        if opts.enable_cdi {
            enable_cdi(path, doc.as_item_mut(), version, opts)?;
        }
        if opts.enable_nri {
            enable_nri(path, doc.as_item_mut(), version, opts)?;
        }
        if opts.require_nri {
            warnings.extend(require_nri(path, doc.as_item_mut(), version, opts)?);
        }
        let after = doc.to_string();
        tomldoc::reparse(path, &after)?;
        return Ok(Plan {
            changes: change(path, before, Some(after)).into_iter().collect(),
            warnings,
            ..Plan::default()
        });
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
    if opts.enable_cdi {
        enable_cdi(&drop_in, out.as_item_mut(), version, opts)?;
    }
    if merges_imports(version) {
        out = runtime_only(&drop_in, &out, version, cri, opts)?;
    }
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
    }
    // NRI in the main file: a containerd 1.x drop-in naming the NRI plugin would replace the
    // whole section the main file has (module comment).
    if opts.enable_nri {
        enable_nri(path, doc.as_item_mut(), version, opts)?;
    }
    if opts.require_nri {
        warnings.extend(require_nri(path, doc.as_item_mut(), version, opts)?);
    }
    let after = doc.to_string();
    if before.as_deref() != Some(after.as_str()) {
        tomldoc::reparse(path, &after)?;
        changes.extend(change(path, before, Some(after)));
    }
    changes.extend(change(&drop_in, drop_before, Some(drop_after)));
    Ok(Plan {
        changes,
        warnings,
        ..Plan::default()
    })
}

/// containerd 2.x (config version 3 and later) merges an imported file into the config key by
/// key (`mergeConfig` in `cmd/containerd/server/config`, mergo with override); containerd 1.x
/// replaced each plugin section an import names (module comment).
fn merges_imports(version: i64) -> bool {
    version >= 3
}

/// The drop-in for a containerd that merges imports: the runtime's own table alone, with the
/// options [`add_runtime`] carried over from the default runtime. Everything else stays where
/// the admin wrote it, so a later edit of the main file's CRI section still takes effect
/// (copying the whole section there would silently override it).
fn runtime_only(
    drop_in: &Path,
    full: &DocumentMut,
    version: i64,
    cri: &str,
    opts: &Options,
) -> Result<DocumentMut, EngineError> {
    let keys = ["plugins", cri, "containerd", "runtimes"];
    let mut out = DocumentMut::new();
    out.insert("version", toml_edit::value(version));
    let runtimes = get(drop_in, full.as_item(), &keys)?;
    if let Some(rt) = runtimes.and_then(|r| r.get(&opts.runtime_name)) {
        let Some(rt) = rt.as_table_like() else {
            return Err(shape_error(drop_in, &keys, "a table", rt));
        };
        let copy = tomldoc::fresh_copy(rt, false);
        let parent = ensure(drop_in, out.as_item_mut(), &keys)?;
        if let Some(t) = parent.as_table_like_mut() {
            t.insert(&opts.runtime_name, copy);
        }
    }
    Ok(out)
}

/// `options.BinaryName` of the runtime, from the main file and then each import in
/// containerd's order (a later file's CRI section replaces an earlier one's in 1.x; in 2.x a
/// later file's keys override).
pub fn registration(opts: &Options) -> Result<super::Registration, EngineError> {
    let path = &opts.config;
    let text = read_optional(path)?;
    let doc = tomldoc::parse(path, text.as_deref())?;
    let version = version(path, &doc)?.unwrap_or(2);
    let warnings: Vec<String> = version_warning(path, version).into_iter().collect();
    let cri = cri_plugin(version);
    let mut files = vec![path.clone()];
    files.extend(expand_imports(path, &imports(path, &doc)?)?);
    let mut binary = None;
    let default_cdi = cdi_default(version, opts.engine_version);
    let mut cdi_enabled = default_cdi;
    let mut cdi_setting = None;
    let mut cdi_dirs: Option<Vec<PathBuf>> = None;
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
        if let Some(section) = get(file, doc.as_item(), &["plugins", cri])? {
            // containerd 1.x: the section replaces the earlier files' one (module comment),
            // `enable_cdi` too; 2.x: only the keys it sets override.
            let set = section.get("enable_cdi").and_then(Item::as_bool);
            let dirs = section
                .get("cdi_spec_dirs")
                .and_then(Item::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str())
                        .map(PathBuf::from)
                        .collect()
                });
            if dirs.is_some() || !merges_imports(version) {
                cdi_dirs = dirs;
            }
            if default_cdi.is_some() && (set.is_some() || !merges_imports(version)) {
                cdi_enabled = set.or(default_cdi);
                cdi_setting = Some(match set {
                    Some(v) => format!("enable_cdi = {v} in {}", file.display()),
                    None => format!("no enable_cdi in {}", file.display()),
                });
            }
            let found = get(file, doc.as_item(), &keys)?.map(|rt| {
                rt.get("options")
                    .and_then(Item::as_table_like)
                    .and_then(|o| o.get("BinaryName"))
                    .and_then(Item::as_str)
                    .unwrap_or_default()
                    .to_string()
            });
            if found.is_some() || !merges_imports(version) {
                binary = found;
            }
        }
    }
    Ok(super::Registration {
        files,
        binary,
        cdi_enabled,
        cdi_setting: (cdi_enabled == Some(false))
            .then_some(cdi_setting)
            .flatten(),
        cdi_spec_dirs: cdi_enabled.map(|_| {
            cdi_dirs.unwrap_or_else(|| super::ENGINE_CDI_SPEC_DIRS.map(PathBuf::from).to_vec())
        }),
        warnings,
    })
}

pub fn unconfigure(opts: &Options) -> Result<Plan, EngineError> {
    let path = &opts.config;
    let mut changes = Vec::new();
    let mut warnings = Vec::new();
    if let Some(before) = read_optional(path)? {
        let mut doc = tomldoc::parse(path, Some(&before))?;
        if let Some(version) = version(path, &doc)? {
            warnings.extend(version_warning(path, version));
            remove_runtime(path, doc.as_item_mut(), version, opts)?;
            revert_cdi(doc.as_item_mut(), version);
            revert_nri(doc.as_item_mut());
            revert_require_nri(doc.as_item_mut());
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
    Ok(Plan {
        changes,
        warnings,
        ..Plan::default()
    })
}

/// The comment nvshim leaves on the CDI settings it writes: `unconfigure` reverts exactly the
/// settings that carry it, and the admin reading the file sees where they came from.
const CDI_SET_MARK: &str = "set by `nvshim runtime configure`";
/// The same, on an `enable_cdi` that was `false` before.
const CDI_WAS_FALSE: &str = "(was false)";

/// Whether CDI is on when the CRI section does not set `enable_cdi`; `None` when this
/// containerd has no CDI support (1.6). Without a known release the config version tells:
/// containerd 2.x (versions 3 and up) has CDI on by default, 1.7 off.
fn cdi_default(version: i64, engine_version: Option<(u64, u64)>) -> Option<bool> {
    match engine_version {
        Some(v) if v < (1, 7) => None,
        Some(v) => Some(v >= (2, 0)),
        None => Some(version >= 3),
    }
}

/// Turns on the CRI plugin's CDI support where it is off: the CDI devices the kubelet passes
/// over the CRI (DRA claims, device plugins' CDI devices) are dropped while it is off. Where
/// the file has no `cdi_spec_dirs`, nvshim's spec directories are written beside it (the
/// defaults are containerd's own, `/etc/cdi` and `/var/run/cdi`), so the setting is visible in
/// the file and containerd reads the specs nvshim reads.
fn enable_cdi(
    path: &Path,
    root: &mut Item,
    version: i64,
    opts: &Options,
) -> Result<(), EngineError> {
    let cri_keys = ["plugins", cri_plugin(version)];
    let current = get(path, root, &cri_keys)?.and_then(|t| t.get("enable_cdi").cloned());
    let was = match &current {
        None => None,
        Some(Item::Value(Value::Boolean(b))) => Some(*b.value()),
        Some(other) => {
            return Err(shape_error(
                path,
                &["plugins", cri_plugin(version), "enable_cdi"],
                "a boolean",
                other,
            ))
        }
    };
    let default = match cdi_default(version, opts.engine_version) {
        Some(default) => default,
        // The containerd found has no CDI (1.6), but the file sets `enable_cdi`, a key only
        // 1.7 and later read: the containerd that reads this file is another one (k3s's, one
        // off PATH), and has CDI.
        None if was.is_some() => false,
        None => return Ok(()),
    };
    if was.unwrap_or(default) {
        return Ok(());
    }
    let cri = ensure(path, root, &cri_keys)?;
    let Some(t) = cri.as_table_like_mut() else {
        return Ok(());
    };
    let was_false = match was {
        Some(false) => CDI_WAS_FALSE,
        _ => "",
    };
    put_marked(t, "enable_cdi", Value::from(true), was_false);
    if !t.contains_key("cdi_spec_dirs") {
        let dirs: Value = opts
            .cdi_spec_dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect::<toml_edit::Array>()
            .into();
        put_marked(t, "cdi_spec_dirs", dirs, "");
    }
    Ok(())
}

/// NRI's plugin section: `disable = true` in containerd 1.7's default config, `false` from
/// 2.0 (tests/fixtures/engine-configs/).
const NRI_PLUGIN: &str = "io.containerd.nri.v1.nri";
/// The mark on a `disable = false` that replaced a `disable = true`.
const NRI_WAS_DISABLED: &str = "(was true)";

/// `--nri`: turns NRI on where it is off, for NRI plugins (nvshim-nri) to connect; the mark
/// lets `unconfigure` revert it. Nothing else of the section changes (socket path, timeouts).
fn enable_nri(
    path: &Path,
    root: &mut Item,
    version: i64,
    opts: &Options,
) -> Result<(), EngineError> {
    let keys = ["plugins", NRI_PLUGIN];
    let was = match get(path, root, &keys)?.and_then(|t| t.get("disable").cloned()) {
        None => None,
        Some(Item::Value(Value::Boolean(b))) => Some(*b.value()),
        Some(other) => {
            return Err(shape_error(
                path,
                &["plugins", NRI_PLUGIN, "disable"],
                "a boolean",
                &other,
            ))
        }
    };
    let off_by_default = match opts.engine_version {
        Some(v) => v < (2, 0),
        None => version < 3,
    };
    if !was.unwrap_or(off_by_default) {
        return Ok(());
    }
    let section = ensure(path, root, &keys)?;
    let Some(t) = section.as_table_like_mut() else {
        return Ok(());
    };
    let was_disabled = match was {
        Some(true) => NRI_WAS_DISABLED,
        _ => "",
    };
    put_marked(t, "disable", Value::from(false), was_disabled);
    Ok(())
}

/// Undoes [`enable_nri`]: only a `disable` that still carries nvshim's comment.
fn revert_nri(root: &mut Item) {
    let Some(t) = table_at_mut(root, &["plugins", NRI_PLUGIN]) else {
        return;
    };
    match mark_of(t.get("disable")).map(|m| m.contains(NRI_WAS_DISABLED)) {
        Some(true) => unmark(t, "disable", Value::from(true)),
        Some(false) => {
            remove_and_prune(root, &["plugins", NRI_PLUGIN], "disable");
        }
        None => {}
    }
}

/// The name nvshim-nri registers with NRI (its `--name` default): what `required_plugins` lists.
pub const NRI_PLUGIN_NAME: &str = "nvshim";
/// The pod annotation that lets a pod's containers start while nvshim-nri is absent
/// (`"true"`), written as the validator's `tolerate_missing_plugins_annotation`. The plugin's
/// own pod carries it (packaging/kubernetes/overlays/nri), or it could never start.
pub const NRI_TOLERATE_ANNOTATION: &str = "nvshim.io/tolerate-missing-nri";
/// NRI's built-in validator, in the NRI plugin's section (containerd 2.2 and later:
/// `internal/nri/config.go`, the same place in config versions 3 and 4).
const NRI_VALIDATOR: &str = "default_validator";
/// The marks on validator settings nvshim changed rather than added.
const VALIDATOR_WAS_EMPTY: &str = "(was '')";
const VALIDATOR_ADDED: &str = "(added \"nvshim\")";

/// `--nri-required`: containerd's NRI default validator on, with nvshim-nri among its
/// `required_plugins`, so containerd refuses to create a container while the plugin is absent
/// instead of running it without its GPUs. Each setting nvshim writes carries the mark, so
/// `unconfigure` takes back exactly those (and only `"nvshim"` from a list the admin had).
/// Returns what to tell the admin.
fn require_nri(
    path: &Path,
    root: &mut Item,
    version: i64,
    opts: &Options,
) -> Result<Vec<String>, EngineError> {
    validator_supported(path, version, opts.engine_version)?;
    let keys = ["plugins", NRI_PLUGIN, NRI_VALIDATOR];
    let shape = |key: &'static str, expected: &'static str, item: &Item| {
        shape_error(
            path,
            &["plugins", NRI_PLUGIN, NRI_VALIDATOR, key],
            expected,
            item,
        )
    };
    let current = get(path, root, &keys)?;
    let enable = match current.and_then(|t| t.get("enable")) {
        None => None,
        Some(Item::Value(Value::Boolean(b))) => Some(*b.value()),
        Some(other) => return Err(shape("enable", "a boolean", other)),
    };
    let listed = match current.and_then(|t| t.get("required_plugins")) {
        None => None,
        Some(item @ Item::Value(Value::Array(a))) => {
            let names: Option<Vec<&str>> = a.iter().map(Value::as_str).collect();
            let names = names.ok_or_else(|| shape("required_plugins", "strings", item))?;
            Some(names.contains(&NRI_PLUGIN_NAME))
        }
        Some(other) => return Err(shape("required_plugins", "an array", other)),
    };
    let tolerate = match current.and_then(|t| t.get("tolerate_missing_plugins_annotation")) {
        None => None,
        Some(Item::Value(Value::String(v))) => Some(v.value().clone()),
        Some(other) => {
            return Err(shape(
                "tolerate_missing_plugins_annotation",
                "a string",
                other,
            ))
        }
    };

    let section = ensure(path, root, &keys)?;
    let Some(t) = section.as_table_like_mut() else {
        return Ok(Vec::new());
    };
    match enable {
        Some(true) => {}
        Some(false) => put_marked(t, "enable", Value::from(true), CDI_WAS_FALSE),
        None => put_marked(t, "enable", Value::from(true), ""),
    }
    match listed {
        Some(true) => {}
        Some(false) => {
            if let Some(Item::Value(Value::Array(a))) = t.get_mut("required_plugins") {
                a.push(NRI_PLUGIN_NAME);
                let kept = a.decor().suffix().and_then(|s| s.as_str()).unwrap_or("");
                let suffix = format!("{kept} # {CDI_SET_MARK} {VALIDATOR_ADDED}");
                a.decor_mut().set_suffix(suffix);
            }
        }
        None => {
            let names: toml_edit::Array = [NRI_PLUGIN_NAME].into_iter().collect();
            put_marked(t, "required_plugins", names.into(), "");
        }
    }
    let mut warnings = Vec::new();
    match tolerate.as_deref() {
        Some(NRI_TOLERATE_ANNOTATION) => {}
        Some("") => put_marked(
            t,
            "tolerate_missing_plugins_annotation",
            Value::from(NRI_TOLERATE_ANNOTATION),
            VALIDATOR_WAS_EMPTY,
        ),
        None => put_marked(
            t,
            "tolerate_missing_plugins_annotation",
            Value::from(NRI_TOLERATE_ANNOTATION),
            "",
        ),
        Some(theirs) => warnings.push(format!(
            "{}: tolerate_missing_plugins_annotation is {theirs:?}, kept: pods that must start \
             while nvshim-nri is down (its own DaemonSet pod, which carries \
             {NRI_TOLERATE_ANNOTATION:?}) need the annotation {theirs:?}: \"true\"",
            path.display()
        )),
    }
    Ok(warnings)
}

/// NRI's default validator, and so `required_plugins`, came with containerd 2.2; 2.0 and 2.1
/// skip the section with a warning ("Ignoring unknown key") and would start containers without
/// the plugin. Without a known release only config version 4 tells: containerd 2.0 to 2.2 all
/// write version 3.
fn validator_supported(
    path: &Path,
    version: i64,
    release: Option<(u64, u64)>,
) -> Result<(), EngineError> {
    let fallback = "run nvshim-nri with --mandatory instead (a container it did not adjust \
                    fails at its start)";
    match release {
        Some(v) if v >= (2, 2) => Ok(()),
        None if version >= 4 => Ok(()),
        Some((major, minor)) => Err(EngineError::Unsupported {
            path: path.to_path_buf(),
            message: format!(
                "--nri-required needs containerd 2.2 or later (NRI's default validator); \
                 containerd {major}.{minor} ignores the validator's settings (\"Ignoring \
                 unknown key\") and would create containers while nvshim-nri is absent: \
                 {fallback}, or pass --engine-version if another containerd reads this file"
            ),
        }),
        None => Err(EngineError::Unsupported {
            path: path.to_path_buf(),
            message: format!(
                "--nri-required needs containerd 2.2 or later and no `containerd --version` \
                 says which release reads this file (config version {version} is written by \
                 2.0 to 2.2): pass --engine-version, or {fallback}"
            ),
        }),
    }
}

/// Undoes [`require_nri`]: only the validator settings that still carry nvshim's mark.
fn revert_require_nri(root: &mut Item) {
    let keys = ["plugins", NRI_PLUGIN, NRI_VALIDATOR];
    let Some(t) = table_at_mut(root, &keys) else {
        return;
    };
    let mut remove = Vec::new();
    match mark_of(t.get("enable")) {
        Some(m) if m.contains(CDI_WAS_FALSE) => unmark(t, "enable", Value::from(false)),
        Some(_) => remove.push("enable"),
        None => {}
    }
    match mark_of(t.get("required_plugins")) {
        Some(m) if m.contains(VALIDATOR_ADDED) => {
            if let Some(Item::Value(Value::Array(a))) = t.get_mut("required_plugins") {
                a.retain(|v| v.as_str() != Some(NRI_PLUGIN_NAME));
                let theirs = m.replace(&format!(" # {CDI_SET_MARK} {VALIDATOR_ADDED}"), "");
                a.decor_mut().set_suffix(theirs);
            }
        }
        Some(_) => remove.push("required_plugins"),
        None => {}
    }
    let key = "tolerate_missing_plugins_annotation";
    match mark_of(t.get(key)) {
        Some(m) if m.contains(VALIDATOR_WAS_EMPTY) => unmark(t, key, Value::from("")),
        Some(_) => remove.push(key),
        None => {}
    }
    for key in remove {
        remove_and_prune(root, &keys, key);
    }
}

/// The table at `keys`, without creating it (`Item::get_mut` would).
fn table_at_mut<'a>(root: &'a mut Item, keys: &[&str]) -> Option<&'a mut dyn TableLike> {
    let mut cur = root.as_table_like_mut()?;
    for k in keys {
        cur = cur.get_mut(k)?.as_table_like_mut()?;
    }
    Some(cur)
}

/// Puts `value` at `key` with nvshim's mark (and `note`, what it replaced) after it: in the
/// place of the value it replaces (inserting would drop the key's indentation), else indented
/// like the table's other keys.
fn put_marked(t: &mut dyn TableLike, key: &str, mut value: Value, note: &str) {
    let mark = match note {
        "" => format!(" # {CDI_SET_MARK}"),
        note => format!(" # {CDI_SET_MARK} {note}"),
    };
    value.decor_mut().set_suffix(mark);
    match t.get_mut(key) {
        Some(Item::Value(old)) => {
            value
                .decor_mut()
                .set_prefix(old.decor().prefix().cloned().unwrap_or_default());
            *old = value;
        }
        _ => {
            value.decor_mut().set_prefix(" ");
            insert_indented(t, key, value);
        }
    }
}

/// The comment after a value when it carries nvshim's mark.
fn mark_of(item: Option<&Item>) -> Option<String> {
    item.and_then(Item::as_value)
        .and_then(|v| v.decor().suffix())
        .and_then(|s| s.as_str())
        .filter(|s| s.contains(CDI_SET_MARK))
        .map(str::to_string)
}

/// Gives `key` back the value nvshim replaced, in the same place, without the mark.
fn unmark(t: &mut dyn TableLike, key: &str, mut value: Value) {
    if let Some(Item::Value(v)) = t.get_mut(key) {
        value
            .decor_mut()
            .set_prefix(v.decor().prefix().cloned().unwrap_or_default());
        *v = value;
    }
}

/// Inserts `key = value` indented like the table's other keys (`containerd config default`
/// indents by nesting depth).
fn insert_indented(t: &mut dyn TableLike, key: &str, value: Value) {
    let indent = t
        .iter()
        .find(|(_, v)| v.is_value())
        .map(|(k, _)| k.to_string())
        .and_then(|k| t.get_key_value(&k).map(|(k, _)| k.leaf_decor().clone()))
        .and_then(|d| d.prefix().and_then(|p| p.as_str()).map(str::to_string));
    t.insert(key, Item::Value(value));
    if let (Some(indent), Some(mut k)) = (indent, t.key_mut(key)) {
        k.leaf_decor_mut().set_prefix(indent);
    }
}

/// Undoes [`enable_cdi`]: only settings that still carry nvshim's comment.
fn revert_cdi(root: &mut Item, version: i64) {
    let cri = cri_plugin(version);
    let ours = |item: Option<&Item>| mark_of(item).map(|m| m.contains(CDI_WAS_FALSE));
    // Through `as_table_like_mut`: `Item::get_mut` would create the missing tables.
    let Some(t) = root
        .as_table_like_mut()
        .and_then(|r| r.get_mut("plugins"))
        .and_then(Item::as_table_like_mut)
        .and_then(|p| p.get_mut(cri))
        .and_then(Item::as_table_like_mut)
    else {
        return;
    };
    let enable = ours(t.get("enable_cdi"));
    let dirs = ours(t.get("cdi_spec_dirs"));
    match enable {
        Some(true) => unmark(t, "enable_cdi", Value::from(false)),
        Some(false) => {
            remove_and_prune(root, &["plugins", cri], "enable_cdi");
        }
        None => {}
    }
    if dirs.is_some() {
        remove_and_prune(root, &["plugins", cri], "cdi_spec_dirs");
    }
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
    use crate::ops::engine::{configure as plan, unconfigure as unplan, Engine, Plan};

    fn opts(dir: &Path) -> Options {
        let mut o = Options::new(Engine::Containerd, "/usr/bin/nvshim-runtime".into());
        o.config = dir.join("config.toml");
        o.backup_dir = dir.join("backups");
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

    /// The config after `configure` of a file holding `text`.
    fn configured(o: &Options, text: &str) -> toml::Table {
        fs::write(&o.config, text).unwrap();
        parsed(&only_after(&plan(o).unwrap()))
    }

    /// The `nvidia` runtime's table under the CRI `plugin` (`io.containerd.grpc.v1.cri`, ...).
    fn nvidia_runtime<'a>(t: &'a toml::Table, plugin: &str) -> &'a toml::Value {
        at(t, &["plugins", plugin, "containerd", "runtimes", "nvidia"])
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
        let nv = nvidia_runtime(&t, "io.containerd.grpc.v1.cri");
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
        let t = configured(
            &o,
            "version = 3\n\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]\n  runtime_type = 'io.containerd.runc.v2'\n  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]\n    SystemdCgroup = true\n",
        );
        let nv = nvidia_runtime(&t, "io.containerd.cri.v1.runtime");
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
        let t = configured(
            &o,
            "[plugins.cri.containerd]\n  snapshotter = \"overlayfs\"\n",
        );
        assert!(t.get("version").is_none());
        let nv = nvidia_runtime(&t, "cri");
        assert_eq!(nv["runtime_type"].as_str(), Some(RUNC_SHIM));
    }

    #[test]
    fn existing_runtime_keeps_admin_settings() {
        let dir = tempfile::tempdir().unwrap();
        let o = opts(dir.path());
        let t = configured(
            &o,
            "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia]\n  runtime_type = \"io.containerd.runc.v2\"\n  privileged_without_host_devices = true\n  [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia.options]\n    BinaryName = \"/usr/bin/nvidia-container-runtime\"\n",
        );
        let nv = nvidia_runtime(&t, "io.containerd.grpc.v1.cri");
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
        let t = configured(
            &o,
            "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\nruntimes = { runc = { runtime_type = \"io.containerd.runc.v2\", options = { SystemdCgroup = true } } }\n",
        );
        let nv = nvidia_runtime(&t, "io.containerd.grpc.v1.cri");
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
            ("version = -1\n", "config version -1"),
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

    /// `containerd config default` of each release (tests/fixtures/engine-configs/): version,
    /// CRI section, `enable_cdi` as printed.
    const FIXTURES: [(&str, i64, &str, Option<bool>); 4] = [
        (
            "containerd-1.6.20-default.toml",
            2,
            "io.containerd.grpc.v1.cri",
            None,
        ),
        (
            "containerd-1.7.34-default.toml",
            2,
            "io.containerd.grpc.v1.cri",
            Some(false),
        ),
        (
            "containerd-2.1.9-default.toml",
            3,
            "io.containerd.cri.v1.runtime",
            Some(true),
        ),
        (
            "containerd-2.3.4-default.toml",
            4,
            "io.containerd.cri.v1.runtime",
            Some(true),
        ),
    ];

    /// `--nri`: containerd 1.7's default config gets `disable = false` in its NRI section,
    /// marked, and nothing else of the section changes; unconfigure gives the bytes back.
    /// containerd 2.x (NRI on by default) is left as it is.
    #[test]
    fn nri_turned_on_for_1_7_and_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = opts(dir.path());
        o.enable_nri = true;
        o.engine_version = Some((1, 7));
        let original = fixture("containerd-1.7.34-default.toml");
        fs::write(&o.config, &original).unwrap();
        let after = only_after(&plan(&o).unwrap());
        let t = parsed(&after);
        let nri = at(&t, &["plugins", NRI_PLUGIN]);
        assert_eq!(nri["disable"].as_bool(), Some(false), "{after}");
        assert_eq!(nri["socket_path"].as_str(), Some("/var/run/nri/nri.sock"));
        assert!(after.contains("disable = false # set by `nvshim runtime configure` (was true)"));
        fs::write(&o.config, &after).unwrap();
        let back = unplan(&o).unwrap();
        let restored = back.changes[0].after.clone().unwrap();
        assert_eq!(restored, original);

        o.engine_version = Some((2, 1));
        let two = fixture("containerd-2.1.9-default.toml");
        fs::write(&o.config, &two).unwrap();
        let after = only_after(&plan(&o).unwrap());
        let t = parsed(&after);
        assert_eq!(
            at(&t, &["plugins", NRI_PLUGIN])["disable"].as_bool(),
            Some(false)
        );
        assert!(!after.contains("(was true)"));
    }

    /// What containerd 2.2's `containerd config default` prints, derived: 2.1.9's (the
    /// fixture) plus the NRI section's `default_validator`, with the fields and zero values of
    /// containerd v2.2.0's `internal/nri/config.go` (`DefaultConfig`) and its vendored NRI's
    /// `DefaultValidatorConfig` (no `reject_sysctl_adjustment`, which 2.3 added). 2.2 still
    /// writes config version 3 (its `migrations` end at version 3).
    fn containerd_2_2_default() -> String {
        let text = fixture("containerd-2.1.9-default.toml");
        let nri_end = "    disable_connections = false\n";
        assert_eq!(text.matches(nri_end).count(), 1);
        text.replace(
            nri_end,
            &format!(
                "{nri_end}\n    [plugins.'io.containerd.nri.v1.nri'.default_validator]\n\
                 \x20     enable = false\n\
                 \x20     reject_oci_hook_adjustment = false\n\
                 \x20     reject_runtime_default_seccomp_adjustment = false\n\
                 \x20     reject_unconfined_seccomp_adjustment = false\n\
                 \x20     reject_custom_seccomp_adjustment = false\n\
                 \x20     reject_namespace_adjustment = false\n\
                 \x20     required_plugins = []\n\
                 \x20     tolerate_missing_plugins_annotation = ''\n"
            ),
        )
    }

    const VALIDATOR_KEYS: [&str; 3] = ["plugins", NRI_PLUGIN, NRI_VALIDATOR];

    /// `--nri --nri-required` on containerd 2.2 (its default, and a 2.1-shaped file it reads
    /// after an upgrade: no validator table yet) and 2.3 (its default, release known or told
    /// by config version 4 alone): the validator on, `nvshim` required, nvshim's tolerate
    /// annotation, every other setting kept; a second run changes nothing; unconfigure gives
    /// the text back, and with the file edited since, takes back only its own settings.
    #[test]
    fn nri_required_written_kept_and_taken_back() {
        let cases = [
            ("2.2 default", containerd_2_2_default(), Some((2, 2))),
            (
                "2.1.9 file read by 2.2",
                fixture("containerd-2.1.9-default.toml"),
                Some((2, 2)),
            ),
            (
                "2.3.4 default",
                fixture("containerd-2.3.4-default.toml"),
                Some((2, 3)),
            ),
            (
                "2.3.4 default, no containerd on PATH",
                fixture("containerd-2.3.4-default.toml"),
                None,
            ),
        ];
        for (name, text, release) in cases {
            let dir = tempfile::tempdir().unwrap();
            let mut o = opts(dir.path());
            o.enable_nri = true;
            o.require_nri = true;
            o.engine_version = release;
            let conf_d = o.config.with_file_name("conf.d");
            let original = text.replace("/etc/containerd/conf.d", &conf_d.to_string_lossy());
            fs::write(&o.config, &original).unwrap();
            let p = plan(&o).unwrap();
            assert!(p.warnings.is_empty(), "{name}: {:?}", p.warnings);
            p.apply().unwrap();
            // In the main file also where a drop-in carries the runtime (as `--nri`).
            let after = fs::read_to_string(&o.config).unwrap();
            let mut got = parsed(&after);
            let v = at(&got, &VALIDATOR_KEYS);
            assert_eq!(v["enable"].as_bool(), Some(true), "{name}: {after}");
            assert_eq!(
                v["required_plugins"],
                toml::Value::Array(vec!["nvshim".into()]),
                "{name}"
            );
            assert_eq!(
                v["tolerate_missing_plugins_annotation"].as_str(),
                Some(NRI_TOLERATE_ANNOTATION),
                "{name}"
            );
            assert!(after.contains("enable = true # set by `nvshim runtime configure`"));
            // Everything else as it was (the runtime aside, where it is in the main file).
            let rts = ["plugins", cri_plugin(3), "containerd", "runtimes"];
            table_mut(&mut got, &rts).remove("nvidia");
            let v = at(&got, &VALIDATOR_KEYS).as_table().unwrap().clone();
            let mut want = parsed(&original);
            if want["plugins"][NRI_PLUGIN].get(NRI_VALIDATOR).is_some() {
                let w = table_mut(&mut want, &VALIDATOR_KEYS);
                for key in [
                    "enable",
                    "required_plugins",
                    "tolerate_missing_plugins_annotation",
                ] {
                    w.insert(key.into(), v[key].clone());
                }
            } else {
                let added = v.clone();
                assert_eq!(added.len(), 3, "{name}: {added:?}");
                table_mut(&mut want, &["plugins", NRI_PLUGIN])
                    .insert(NRI_VALIDATOR.into(), added.into());
            }
            assert_eq!(got, want, "{name}: every other setting kept");
            assert!(plan(&o).unwrap().is_empty(), "{name}: idempotent");

            // Unconfigure: the file's own bytes back (from the backup).
            unplan(&o).unwrap().apply().unwrap();
            assert_eq!(fs::read_to_string(&o.config).unwrap(), original, "{name}");

            // Edited since configure (the backup no longer matches): only nvshim's settings go,
            // the values they replaced come back, the admin's edit stays.
            plan(&o).unwrap().apply().unwrap();
            let edited = fs::read_to_string(&o.config).unwrap().replace(
                "plugin_request_timeout = '2s'",
                "plugin_request_timeout = '3s'",
            );
            fs::write(&o.config, &edited).unwrap();
            unplan(&o).unwrap().apply().unwrap();
            let back = fs::read_to_string(&o.config).unwrap();
            let mut want = parsed(&original);
            table_mut(&mut want, &["plugins", NRI_PLUGIN])
                .insert("plugin_request_timeout".into(), "3s".into());
            assert_eq!(parsed(&back), want, "{name}: {back}");
            assert!(!back.contains(CDI_SET_MARK), "{name}: {back}");
        }
    }

    /// The admin's own validator settings: other required plugins stay (nvshim is added to
    /// the list, and only nvshim is taken out again), an `enable = true` is not nvshim's to
    /// revert, and another tolerate annotation is kept with a warning naming it.
    #[test]
    fn nri_required_merges_with_the_admins_validator() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = opts(dir.path());
        o.enable_nri = true;
        o.require_nri = true;
        o.engine_version = Some((2, 3));
        let original = "version = 3\n\n\
            [plugins.'io.containerd.nri.v1.nri'.default_validator]\n\
            \x20 enable = true\n\
            \x20 reject_oci_hook_adjustment = true\n\
            \x20 required_plugins = ['topology'] # the site's\n\
            \x20 tolerate_missing_plugins_annotation = 'example.com/tolerate'\n";
        fs::write(&o.config, original).unwrap();
        let p = plan(&o).unwrap();
        assert!(
            p.warnings.len() == 1
                && p.warnings[0].contains("\"example.com/tolerate\"")
                && p.warnings[0].contains(NRI_TOLERATE_ANNOTATION),
            "{:?}",
            p.warnings
        );
        let after = only_after(&p);
        let t = parsed(&after);
        let v = at(&t, &VALIDATOR_KEYS);
        assert_eq!(
            v["required_plugins"],
            toml::Value::Array(vec!["topology".into(), "nvshim".into()]),
            "{after}"
        );
        assert_eq!(v["enable"].as_bool(), Some(true));
        assert_eq!(v["reject_oci_hook_adjustment"].as_bool(), Some(true));
        assert_eq!(
            v["tolerate_missing_plugins_annotation"].as_str(),
            Some("example.com/tolerate")
        );
        assert!(after.contains("# the site's # set by"), "{after}");
        fs::write(&o.config, &after).unwrap();
        assert!(plan(&o).unwrap().changes.is_empty(), "idempotent");
        // No backup here: the revert itself gives the section's text back (configure's
        // explicit `runc` runtime stays, as without --nri-required).
        let back = unplan(&o).unwrap().changes[0].after.clone().unwrap();
        assert!(back.starts_with(original), "{back}");
        assert_eq!(
            parsed(&back)["plugins"][NRI_PLUGIN],
            parsed(original)["plugins"][NRI_PLUGIN]
        );

        // Already listed: nothing of the list is nvshim's.
        let listed = original.replace("['topology']", "['nvshim']");
        fs::write(&o.config, &listed).unwrap();
        let after = only_after(&plan(&o).unwrap());
        assert!(after.starts_with(&listed), "{after}");
    }

    /// containerd before 2.2 has no default validator and would ignore the settings with a
    /// warning: one error naming the release and the fallback, nothing planned. Without a
    /// known release, config version 3 (2.0-2.2) asks for --engine-version.
    #[test]
    fn nri_required_refused_before_2_2() {
        let cases = [
            (
                "containerd-1.7.34-default.toml",
                Some((1, 7)),
                "containerd 1.7",
            ),
            (
                "containerd-2.1.9-default.toml",
                Some((2, 1)),
                "containerd 2.1",
            ),
            ("containerd-2.1.9-default.toml", None, "--engine-version"),
        ];
        for (name, release, says) in cases {
            let dir = tempfile::tempdir().unwrap();
            let mut o = opts(dir.path());
            o.enable_nri = true;
            o.require_nri = true;
            o.engine_version = release;
            let original = install_fixture(name, &o);
            let err = plan(&o).unwrap_err().to_string();
            for needle in [
                says,
                "containerd 2.2 or later",
                "--mandatory",
                "nothing was changed",
            ] {
                assert!(
                    err.contains(needle),
                    "{name} {release:?}: {needle:?} not in {err}"
                );
            }
            assert_eq!(fs::read_to_string(&o.config).unwrap(), original);
        }
    }

    fn fixture(name: &str) -> String {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/engine-configs/"
        );
        fs::read_to_string(format!("{dir}{name}")).unwrap()
    }

    fn table_mut<'a>(t: &'a mut toml::Table, keys: &[&str]) -> &'a mut toml::Table {
        let mut cur = t;
        for k in keys {
            cur = cur.get_mut(*k).unwrap().as_table_mut().unwrap();
        }
        cur
    }

    /// The fixture as a node has it, its `imports` (2.x defaults import
    /// `/etc/containerd/conf.d/*.toml`) moved into the test's directory.
    fn install_fixture(name: &str, o: &Options) -> String {
        let conf_d = o.config.with_file_name("conf.d");
        let text = fixture(name).replace("/etc/containerd/conf.d", &conf_d.to_string_lossy());
        fs::write(&o.config, &text).unwrap();
        text
    }

    /// The config containerd runs with: the main file, then the drop-in: its CRI section
    /// replacing the main file's (containerd 1.x), or merged into it key by key (2.x; see the
    /// module comment).
    fn effective(o: &Options, cri: &str) -> toml::Table {
        fn merge(into: &mut toml::Table, from: &toml::Table) {
            for (k, v) in from {
                match (into.get_mut(k), v) {
                    (Some(toml::Value::Table(a)), toml::Value::Table(b)) => merge(a, b),
                    _ => {
                        into.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        let mut main = parsed(&fs::read_to_string(&o.config).unwrap());
        let drop_in = o.drop_in.clone().unwrap();
        if let Ok(text) = fs::read_to_string(&drop_in) {
            let imported = parsed(&text);
            let section = at(&imported, &["plugins", cri]).clone();
            let plugins = table_mut(&mut main, &["plugins"]);
            match (cri, plugins.get_mut(cri), &section) {
                (
                    "io.containerd.cri.v1.runtime",
                    Some(toml::Value::Table(t)),
                    toml::Value::Table(from),
                ) => merge(t, from),
                _ => {
                    plugins.insert(cri.into(), section);
                }
            }
        }
        main
    }

    /// containerd 2.3 (config version 4, `imports` of conf.d): the drop-in holds the `nvidia`
    /// runtime alone, so an admin's later edit of the main file's CRI section still takes
    /// effect (a whole-section copy in the drop-in would hide it).
    #[test]
    fn containerd_2_drop_in_holds_the_runtime_alone() {
        let dir = tempfile::tempdir().unwrap();
        let o = opts(dir.path());
        install_fixture("containerd-2.3.4-default.toml", &o);
        plan(&o).unwrap().apply().unwrap();
        let cri = "io.containerd.cri.v1.runtime";
        let drop_in = parsed(&fs::read_to_string(o.drop_in.clone().unwrap()).unwrap());
        let section = at(&drop_in, &["plugins", cri]);
        let keys =
            |v: &toml::Value| -> Vec<String> { v.as_table().unwrap().keys().cloned().collect() };
        assert_eq!(keys(section), ["containerd"], "{drop_in:#?}");
        let runtimes = at(&drop_in, &["plugins", cri, "containerd", "runtimes"]);
        assert_eq!(keys(runtimes), ["nvidia"], "{drop_in:#?}");
        let nv = at(
            &drop_in,
            &["plugins", cri, "containerd", "runtimes", "nvidia"],
        );
        assert_eq!(nv["runtime_type"].as_str(), Some("io.containerd.runc.v2"));
        // The admin edits the main file afterwards: the edit is what containerd runs with.
        let main = fs::read_to_string(&o.config).unwrap();
        let edited = main.replace(
            "cdi_spec_dirs = ['/etc/cdi', '/var/run/cdi']",
            "cdi_spec_dirs = ['/etc/cdi-admin']",
        );
        assert_ne!(edited, main, "the fixture has no cdi_spec_dirs line");
        fs::write(&o.config, edited).unwrap();
        let eff = effective(&o, cri);
        assert_eq!(
            at(&eff, &["plugins", cri])["cdi_spec_dirs"],
            toml::Value::Array(vec!["/etc/cdi-admin".into()])
        );
        assert!(keys(at(&eff, &["plugins", cri, "containerd", "runtimes"]))
            .contains(&"nvidia".to_string()));
        assert_eq!(
            registration(&o).unwrap().binary.as_deref(),
            Some("/usr/bin/nvshim-runtime")
        );
    }

    #[test]
    fn every_fixture_configures_reconfigures_and_unconfigures() {
        for (name, version, cri, cdi) in FIXTURES {
            let dir = tempfile::tempdir().unwrap();
            let mut o = opts(dir.path());
            o.enable_cdi = true;
            let original = install_fixture(name, &o);
            let before = registration(&o).unwrap();
            assert_eq!(before.binary, None, "{name}");
            assert!(before.warnings.is_empty(), "{name}: {:?}", before.warnings);
            // Without a known release the version decides: 1.x configs read as 1.7.
            assert_eq!(before.cdi_enabled, Some(cdi.unwrap_or(false)), "{name}");

            let p = plan(&o).unwrap();
            assert!(p.warnings.is_empty(), "{name}: {:?}", p.warnings);
            for c in &p.changes {
                parsed(c.after.as_deref().unwrap());
            }
            p.apply().unwrap();
            // 2.3's default imports conf.d/*.toml: nvshim writes a drop-in there and leaves
            // the main file as it was.
            if original.contains("conf.d/*.toml") {
                assert_eq!(fs::read_to_string(&o.config).unwrap(), original, "{name}");
            }
            let mut got = effective(&o, cri);
            assert_eq!(got["version"].as_integer(), Some(version), "{name}");
            let rts = ["plugins", cri, "containerd", "runtimes"];
            let nv = at(&got, &[&rts[..], &["nvidia"]].concat()).clone();
            let runc = at(&got, &[&rts[..], &["runc"]].concat()).clone();
            assert_eq!(nv["runtime_type"].as_str(), Some(RUNC_SHIM), "{name}");
            assert_eq!(
                nv["options"]["BinaryName"].as_str(),
                Some("/usr/bin/nvshim-runtime"),
                "{name}"
            );
            // Every runc option carried over, BinaryName aside.
            for (k, v) in runc["options"].as_table().unwrap() {
                if k != "BinaryName" {
                    assert_eq!(nv["options"].get(k), Some(v), "{name}: options.{k}");
                }
            }
            assert_eq!(
                at(&got, &["plugins", cri, "enable_cdi"]).as_bool(),
                Some(true)
            );

            // The whole effective document, minus what nvshim adds, is the original.
            table_mut(&mut got, &rts).remove("nvidia");
            let mut want = parsed(&original);
            if cdi == Some(false) {
                table_mut(&mut want, &["plugins", cri]).insert("enable_cdi".into(), true.into());
            } else if cdi.is_none() {
                let section = table_mut(&mut got, &["plugins", cri]);
                assert!(section.remove("enable_cdi").is_some(), "{name}");
                assert!(section.remove("cdi_spec_dirs").is_some(), "{name}");
            }
            assert_eq!(got, want, "{name}: every other setting kept");

            assert!(plan(&o).unwrap().is_empty(), "{name}: idempotent");
            let reg = registration(&o).unwrap();
            assert_eq!(
                reg.binary.as_deref(),
                Some("/usr/bin/nvshim-runtime"),
                "{name}"
            );
            assert_eq!(reg.cdi_enabled, Some(true), "{name}");

            unplan(&o).unwrap().apply().unwrap();
            assert_eq!(
                fs::read_to_string(&o.config).unwrap(),
                original,
                "{name}: unconfigure gives the text back"
            );
            assert!(!o.drop_in.as_ref().unwrap().exists(), "{name}");
            assert_eq!(registration(&o).unwrap().binary, None, "{name}");
        }
    }

    #[test]
    fn fixtures_with_the_engine_release_known() {
        // containerd 1.6 has no CDI: nothing is added; 2.x has it on: nothing is changed.
        for (name, release) in [
            ("containerd-1.6.20-default.toml", (1, 6)),
            ("containerd-2.1.9-default.toml", (2, 1)),
            ("containerd-2.3.4-default.toml", (2, 3)),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let mut o = opts(dir.path());
            o.enable_cdi = true;
            o.engine_version = Some(release);
            let original = install_fixture(name, &o);
            let p = plan(&o).unwrap();
            let cri = if release.0 == 1 {
                "io.containerd.grpc.v1.cri"
            } else {
                "io.containerd.cri.v1.runtime"
            };
            for c in &p.changes {
                assert!(
                    !c.after.as_deref().unwrap().contains(CDI_SET_MARK),
                    "{name}"
                );
            }
            p.apply().unwrap();
            assert_eq!(
                at(&effective(&o, cri), &["plugins", cri]).get("enable_cdi"),
                at(&parsed(&original), &["plugins", cri]).get("enable_cdi"),
                "{name}"
            );
            let reg = registration(&o).unwrap();
            assert_eq!(reg.cdi_enabled, (release.0 == 2).then_some(true), "{name}");
        }
    }

    #[test]
    fn cdi_left_alone_with_no_cdi_and_reverted_only_where_nvshim_set_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = opts(dir.path());
        let original = fixture("containerd-1.7.34-default.toml");
        fs::write(&o.config, &original).unwrap();
        // --no-cdi: CDI stays off.
        let after = only_after(&plan(&o).unwrap());
        assert!(after.contains("enable_cdi = false\n"), "{after}");
        let reg = registration(&o).unwrap();
        assert_eq!(reg.cdi_enabled, Some(false));
        assert!(reg.cdi_setting.unwrap().contains("enable_cdi = false in"));
        // An admin's own `enable_cdi = true` survives unconfigure.
        o.enable_cdi = true;
        let admin = original.replace("enable_cdi = false", "enable_cdi = true");
        fs::write(&o.config, &admin).unwrap();
        plan(&o).unwrap().apply().unwrap();
        assert_eq!(only_after(&unplan(&o).unwrap()), admin);
        // A minimal config: both keys added, both removed.
        let minimal = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"p:1\"\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n";
        fs::write(&o.config, minimal).unwrap();
        let after = only_after(&plan(&o).unwrap());
        let t = parsed(&after);
        let cri = at(&t, &["plugins", "io.containerd.grpc.v1.cri"]);
        assert_eq!(cri["enable_cdi"].as_bool(), Some(true));
        assert_eq!(cri["cdi_spec_dirs"].as_array().unwrap().len(), 2, "{after}");
        fs::write(&o.config, &after).unwrap();
        assert_eq!(only_after(&unplan(&o).unwrap()), minimal);
    }

    #[test]
    fn versions_newer_than_known_read_as_version_3_with_a_warning() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = opts(dir.path());
        o.enable_cdi = true;
        let text = install_fixture("containerd-2.3.4-default.toml", &o)
            .replace("version = 4", "version = 7");
        fs::write(&o.config, &text).unwrap();
        let p = plan(&o).unwrap();
        assert_eq!(p.warnings.len(), 1, "{:?}", p.warnings);
        assert!(
            p.warnings[0].contains("config version 7") && p.warnings[0].contains("config.toml"),
            "{:?}",
            p.warnings
        );
        p.apply().unwrap();
        let t = effective(&o, "io.containerd.cri.v1.runtime");
        nvidia_runtime(&t, "io.containerd.cri.v1.runtime");
        let reg = registration(&o).unwrap();
        assert_eq!(reg.binary.as_deref(), Some("/usr/bin/nvshim-runtime"));
        assert_eq!(reg.warnings.len(), 1);
        let un = unplan(&o).unwrap();
        assert_eq!(un.warnings.len(), 1);
        un.apply().unwrap();
        assert_eq!(fs::read_to_string(&o.config).unwrap(), text);
        // Version 0 and negative ones are no containerd's.
        fs::write(&o.config, "version = 0\n").unwrap();
        let err = plan(&o).unwrap_err().to_string();
        assert!(
            err.contains("config version 0") && err.contains("config.toml"),
            "{err}"
        );
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
