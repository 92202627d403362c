//! The library's layers, checked (no root needed): every top-level module of `src/` uses only
//! the modules before it in [`ORDER`], the layers `src/lib.rs`'s map describes. So no two modules
//! import each other, the operator tool (`ops`) comes last and nothing uses it (`nvshim-runtime`
//! never links it), and a newcomer reads the library front to back.
//!
//! A use is a `crate::<module>` path, or a name in a `crate::{...}` group, on a line that is not
//! a comment (a doc link does not link code). `src/bin/` may use everything.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// The top-level modules in dependency order: model and edges first, then the `create`
/// pipeline stage by stage, then the operator tool.
const ORDER: &[&str] = &[
    // model and edges: depend on nothing but earlier ones
    "hostfile",
    "atomic",
    "cache",
    "config",
    "report",
    "runtime",
    "features",
    "logging",
    "nvidia",
    "json",
    "bundle",
    "host",
    "edits",
    // the create pipeline
    "cdi",
    // after cdi: a long-running process hands its kept CDI registry to create in `Tools`
    "install",
    "rootfs",
    "request",
    "legacy",
    "memory_limits",
    "userns",
    "nri_answer",
    "create",
    // the operator tool
    "ops",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The modules a line uses through `crate::`.
fn uses(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("crate::") {
        let after = &rest[at + "crate::".len()..];
        if let Some(group) = after.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let name: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    out.push(name);
                }
            }
        } else {
            let name: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.push(name);
            }
        }
        rest = after;
    }
    out
}

#[test]
fn every_module_uses_only_the_modules_before_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let rank: BTreeMap<&str, usize> = ORDER.iter().enumerate().map(|(i, m)| (*m, i)).collect();
    let mut problems = Vec::new();
    let mut seen_modules = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let module = first.trim_end_matches(".rs").to_string();
        if module == "bin" || module == "lib" {
            continue;
        }
        let Some(&own) = rank.get(module.as_str()) else {
            problems.push(format!(
                "src/{}: module {module} is not in tests/checks/layers.rs ORDER; place it there (and in \
                 src/lib.rs) after the modules it uses",
                rel.display()
            ));
            continue;
        };
        seen_modules.push(module.clone());
        let text = fs::read_to_string(file).unwrap();
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            for used in uses(line) {
                if used == module {
                    continue;
                }
                match rank.get(used.as_str()) {
                    Some(&r) if r < own => {}
                    Some(_) => problems.push(format!(
                        "src/{}:{}: {module} uses {used}, which comes after it in the layers",
                        rel.display(),
                        n + 1
                    )),
                    None => {}
                }
            }
        }
    }
    for m in ORDER {
        if !seen_modules.iter().any(|s| s == m) {
            problems.push(format!("ORDER names {m}, which src/ does not have"));
        }
    }
    assert!(
        problems.is_empty(),
        "layer violations:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn uses_are_read_from_paths_and_groups() {
    assert_eq!(uses("use crate::host::{Gpu, Host};"), ["host"]);
    assert_eq!(
        uses("use crate::{bundle, config::Config};"),
        ["bundle", "config"]
    );
    assert_eq!(
        uses("let h = crate::install::host_from(crate::config::load());"),
        ["install", "config"]
    );
    assert!(uses("let crate_name = 1;").is_empty());
}
