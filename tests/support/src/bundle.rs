//! An OCI bundle (`config.json` + busybox `rootfs/`) made the way `runc spec` makes one.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::rootfs::Rootfs;

/// An OCI bundle directory. The config is always read from and written to disk, so what a test
/// sees is exactly what the runtime will see.
#[derive(Debug, Clone)]
pub struct Bundle {
    dir: PathBuf,
    rootfs: Rootfs,
}

fn obj<'a>(v: &'a mut Value, key: &str) -> Result<&'a mut serde_json::Map<String, Value>> {
    let map = v
        .as_object_mut()
        .with_context(|| format!("parent of {key:?} in config.json is not an object"))?;
    map.entry(key.to_string())
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .with_context(|| format!("{key:?} in config.json is not an object"))
}

fn arr<'a>(v: &'a mut Value, key: &str) -> Result<&'a mut Vec<Value>> {
    let map = v
        .as_object_mut()
        .with_context(|| format!("parent of {key:?} in config.json is not an object"))?;
    map.entry(key.to_string())
        .or_insert_with(|| json!([]))
        .as_array_mut()
        .with_context(|| format!("{key:?} in config.json is not an array"))
}

impl Bundle {
    /// Makes a bundle in `dir`: a busybox rootfs in `dir/rootfs` and the config.json of
    /// `runc spec --bundle dir`, edited: `process.terminal = false`, `process.args = args`, and
    /// `CAP_MKNOD` added to the bounding, effective and permitted sets (the rest kept, and
    /// `root.readonly` left at runc's default, true).
    pub fn new(dir: &Path, args: &[&str]) -> Result<Bundle> {
        Bundle::new_with(dir, args, Rootfs::busybox)
    }

    /// [`Bundle::new`] with the rootfs `make_rootfs` makes in `dir/rootfs` (an arm64 one:
    /// [`Rootfs::busybox_from`]).
    pub fn new_with(
        dir: &Path,
        args: &[&str],
        make_rootfs: impl FnOnce(&Path) -> Result<Rootfs>,
    ) -> Result<Bundle> {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let dir = dir
            .canonicalize()
            .with_context(|| format!("resolving {}", dir.display()))?;
        let rootfs = make_rootfs(&dir.join("rootfs"))?;
        let out = Command::new("runc")
            .arg("spec")
            .arg("--bundle")
            .arg(&dir)
            .output()
            .context("running `runc spec`")?;
        if !out.status.success() {
            bail!(
                "runc spec --bundle {} failed: {}",
                dir.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let bundle = Bundle { dir, rootfs };
        bundle.edit(|c| {
            let process = obj(c, "process")?;
            process.insert("terminal".into(), json!(false));
            process.insert("args".into(), json!(args));
            let caps = c
                .pointer_mut("/process/capabilities")
                .context("runc spec wrote no process.capabilities")?;
            for set in ["bounding", "effective", "permitted"] {
                let list = arr(caps, set)?;
                if !list.iter().any(|v| v == "CAP_MKNOD") {
                    list.push(json!("CAP_MKNOD"));
                }
            }
            Ok(())
        })?;
        Ok(bundle)
    }

    /// The bundle directory (absolute).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `<bundle>/config.json`.
    pub fn config_path(&self) -> PathBuf {
        self.dir.join("config.json")
    }

    /// The rootfs.
    pub fn rootfs(&self) -> &Rootfs {
        &self.rootfs
    }

    /// The raw bytes of config.json, for byte-identity checks.
    pub fn config_bytes(&self) -> Result<Vec<u8>> {
        let p = self.config_path();
        fs::read(&p).with_context(|| format!("reading {}", p.display()))
    }

    /// config.json parsed (key order kept).
    pub fn config(&self) -> Result<Value> {
        let p = self.config_path();
        serde_json::from_slice(&self.config_bytes()?)
            .with_context(|| format!("parsing {}", p.display()))
    }

    /// Replaces config.json with `config`, pretty-printed.
    pub fn write_config(&self, config: &Value) -> Result<()> {
        let p = self.config_path();
        let mut bytes = serde_json::to_vec_pretty(config)
            .with_context(|| format!("serialising {}", p.display()))?;
        bytes.push(b'\n');
        fs::write(&p, bytes).with_context(|| format!("writing {}", p.display()))
    }

    /// Replaces config.json with raw bytes (for malformed-config tests).
    pub fn write_config_bytes(&self, bytes: &[u8]) -> Result<()> {
        let p = self.config_path();
        fs::write(&p, bytes).with_context(|| format!("writing {}", p.display()))
    }

    /// Reads config.json, lets `f` change it, writes it back.
    pub fn edit(&self, f: impl FnOnce(&mut Value) -> Result<()>) -> Result<()> {
        let mut config = self.config()?;
        f(&mut config).with_context(|| format!("editing {}", self.config_path().display()))?;
        self.write_config(&config)
    }

    /// `process.args`.
    pub fn set_args(&self, args: &[&str]) -> Result<()> {
        self.edit(|c| {
            obj(c, "process")?.insert("args".into(), json!(args));
            Ok(())
        })
    }

    /// Sets `key=value` in `process.env`, replacing an existing entry for `key`.
    pub fn set_env(&self, key: &str, value: &str) -> Result<()> {
        self.edit(|c| {
            let env = arr(c.pointer_mut("/process").context("no process")?, "env")?;
            let prefix = format!("{key}=");
            env.retain(|e| !e.as_str().is_some_and(|s| s.starts_with(&prefix)));
            env.push(json!(format!("{key}={value}")));
            Ok(())
        })
    }

    /// Removes every `key=...` entry from `process.env`.
    pub fn remove_env(&self, key: &str) -> Result<()> {
        self.edit(|c| {
            let env = arr(c.pointer_mut("/process").context("no process")?, "env")?;
            let prefix = format!("{key}=");
            env.retain(|e| !e.as_str().is_some_and(|s| s.starts_with(&prefix)));
            Ok(())
        })
    }

    /// Sets `root.readonly`.
    pub fn set_readonly_root(&self, readonly: bool) -> Result<()> {
        self.edit(|c| {
            obj(c, "root")?.insert("readonly".into(), json!(readonly));
            Ok(())
        })
    }

    /// Hand edit: adds a char device to `linux.devices` (mode 0666, owned by root).
    pub fn add_char_device(&self, path: &str, major: u32, minor: u32) -> Result<()> {
        self.edit(|c| {
            let linux = c.pointer_mut("/linux").context("no linux section")?;
            arr(linux, "devices")?.push(json!({
                "path": path, "type": "c", "major": major, "minor": minor,
                "fileMode": 0o666, "uid": 0, "gid": 0
            }));
            Ok(())
        })
    }

    /// Hand edit: adds `{allow: true, type: "c", major, minor, access}` to
    /// `linux.resources.devices`.
    pub fn allow_char_device(&self, major: u32, minor: u32, access: &str) -> Result<()> {
        self.edit(|c| {
            let linux = c.pointer_mut("/linux").context("no linux section")?;
            let resources = obj(linux, "resources")?;
            let devices = resources
                .entry("devices")
                .or_insert_with(|| json!([]))
                .as_array_mut()
                .context("linux.resources.devices is not an array")?;
            devices.push(json!({
                "allow": true, "type": "c", "major": major, "minor": minor, "access": access
            }));
            Ok(())
        })
    }

    /// Hand edit: adds a bind mount of `source` (host path) at `destination`.
    pub fn add_bind_mount(&self, source: &Path, destination: &str, readonly: bool) -> Result<()> {
        let mut options = vec!["bind", "nosuid", "nodev"];
        if readonly {
            options.push("ro");
        }
        let source = source.to_string_lossy().into_owned();
        self.edit(move |c| {
            arr(c, "mounts")?.push(json!({
                "destination": destination, "type": "bind", "source": source, "options": options
            }));
            Ok(())
        })
    }

    /// `process.env` as written.
    pub fn env(&self) -> Result<Vec<String>> {
        Ok(self
            .config()?
            .pointer("/process/env")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default())
    }
}
