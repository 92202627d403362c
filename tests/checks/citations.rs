//! Everything the code cites can be followed from a clone of this repository.
//!
//! Scans `src/`, `hooks/src/`, `tests/` (not `tests/fixtures/`, which holds other projects'
//! files), `scripts/`, `fuzz/` (not its corpus) and `packaging/`, every line, comments and
//! strings alike, and fails naming `file:line` for:
//! - a `something.md` that is not a file here: resolved against the repository root, the
//!   citing file's directory, and `docs/` for a bare name; upstream files named as such are in
//!   [`UPSTREAM_MD`];
//! - a `§N` whose document cannot be told (no `.md` named before it on the line or earlier in
//!   the same comment block), or whose document is ours but has no heading or numbered item N;
//! - the team's notes that never were in the repository (the [`NOTES`] names, any `shared/`
//!   path): what the code relies on from them is in `docs/cdi-rules.md`,
//!   `docs/nvidia-behaviour.md` and `docs/field-notes.md`;
//! - references to our own issue tracker (`issue 16`, `the CDI issue`): a reader of the code
//!   cannot open it, so a comment states the fact or cites `docs/`. Upstream threads are
//!   written `owner/repo#N` or `repo#N`, which these patterns do not match.

use std::fs;
use std::path::{Path, PathBuf};

/// `.md` files of other projects that comments name as upstream sources. Matched against the
/// whole mention or its last path components.
const UPSTREAM_MD: &[&str] = &[
    // The CDI specification (cncf-tags/container-device-interface), whose prose the code
    // contrasts with the library's behaviour.
    "SPEC.md",
    // containerd's config documentation and release notes (src/ops/engine/containerd.rs).
    "docs/cri/config.md",
    "RELEASES.md",
    // The OCI runtime spec's runtime.md, "State" (the hooks read the state it defines).
    "runtime.md",
    // Not a citation: the table scripts/bench.sh writes into its output directory.
    "table.md",
];

/// The team's notes that lived outside the repository, by the names the code used to cite.
const NOTES: &[&str] = &[
    "shared/reference",
    "field-lessons",
    "cdi-conformance",
    "nvidia-toolkit-behaviour",
    "rust-style-youki",
];

/// Where to look, relative to the repository root.
const ROOTS: &[&str] = &["src", "hooks/src", "tests", "scripts", "fuzz", "packaging"];

/// Never scanned: other projects' files, fuzz inputs, build output, and this file (which
/// names what it looks for).
const SKIP: &[&str] = &[
    "tests/fixtures",
    "fuzz/corpus",
    "fuzz/artifacts",
    "fuzz/target",
    "tests/checks/citations.rs",
];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn files(root: &Path, rel: &str, out: &mut Vec<String>) {
    if SKIP.contains(&rel) || rel.ends_with("/target") {
        return;
    }
    let path = root.join(rel);
    if path.is_dir() {
        let mut entries: Vec<String> = fs::read_dir(&path)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        entries.sort();
        for name in entries {
            files(root, &format!("{rel}/{name}"), out);
        }
    } else if path.is_file() {
        out.push(rel.to_string());
    }
}

fn path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/')
}

/// Every `something.md` on the line, with its byte offset: a run of path characters ending in
/// `.md` that is not the start of a longer name (`.mdx`).
fn md_mentions(line: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut start = None;
    let chars: Vec<(usize, char)> = line.char_indices().collect();
    for (k, &(i, c)) in chars.iter().enumerate() {
        if path_char(c) {
            start.get_or_insert(i);
        }
        let next_is_path = chars.get(k + 1).is_some_and(|&(_, n)| path_char(n));
        if path_char(c) && !next_is_path {
            let s = start.take().unwrap();
            let token = line[s..i + c.len_utf8()].trim_end_matches('.');
            if let Some(stem) = token.strip_suffix(".md") {
                if !stem.is_empty() && !stem.ends_with('/') {
                    out.push((s, token.trim_start_matches("./").to_string()));
                }
            }
        }
    }
    out
}

fn upstream(token: &str) -> bool {
    UPSTREAM_MD
        .iter()
        .any(|u| token == *u || token.ends_with(&format!("/{u}")))
}

/// The repository file a mention names, if any.
fn resolve(root: &Path, file: &str, token: &str) -> Option<PathBuf> {
    let dir = root.join(file).parent().unwrap().to_path_buf();
    let mut tries = vec![root.join(token.trim_start_matches('/')), dir.join(token)];
    if !token.contains('/') || token.starts_with('/') {
        // A bare name, or an install path such as /usr/share/doc/nvshim/README.md.
        let base = token.rsplit('/').next().unwrap();
        tries.push(root.join(base));
        tries.push(root.join("docs").join(base));
    }
    tries.into_iter().find(|p| p.is_file())
}

/// Whether `doc` has a heading (`## 2.`, `### 2.3 `) or a numbered item (`5. `) numbered `n`.
fn has_section(doc: &str, n: &str) -> bool {
    doc.lines().any(|l| {
        let l = l.trim_start_matches('#').trim_start();
        l.strip_prefix(n).is_some_and(|rest| {
            rest.starts_with(". ") || rest.starts_with(' ') || rest == "." || rest.is_empty()
        })
    })
}

/// The section numbers cited on the line (`§2.3` gives `2.3`), with their byte offsets.
fn sections(line: &str) -> Vec<(usize, String)> {
    line.match_indices('§')
        .filter_map(|(i, _)| {
            let n: String = line[i + '§'.len_utf8()..]
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.')
                .collect();
            let n = n.trim_end_matches('.');
            (!n.is_empty()).then(|| (i, n.to_string()))
        })
        .collect()
}

fn is_comment(line: &str) -> bool {
    let t = line.trim_start();
    t.starts_with("//") || t.starts_with('#') || t.starts_with('*')
}

/// Words of a line, lower-cased, edge punctuation and a possessive `'s` removed.
fn words(line: &str) -> Vec<String> {
    line.split(|c: char| c.is_whitespace() || matches!(c, '(' | ')' | '"' | '`' | '[' | ']'))
        .map(|w| {
            let w = w.trim_matches(|c: char| !c.is_ascii_alphanumeric() && c != '#' && c != '/');
            w.strip_suffix("'s").unwrap_or(w).to_ascii_lowercase()
        })
        .filter(|w| w.chars().any(|c| c.is_ascii_alphanumeric()))
        .collect()
}

/// Why the line reads as a reference to our issue tracker: `issue 16` (unless a repository
/// path such as `owner/repo` comes just before), or `the [one or two words] issue`. `prev` is
/// the previous line, for a phrase broken across lines.
fn tracker_reference(prev: &str, line: &str) -> Option<String> {
    let before = words(prev);
    let here = words(line);
    let tail = before.len().saturating_sub(3);
    let all: Vec<&str> = before[tail..]
        .iter()
        .chain(here.iter())
        .map(String::as_str)
        .collect();
    let first = all.len() - here.len();
    for k in first..all.len() {
        if all[k] != "issue" {
            continue;
        }
        if let Some(j) = (k.saturating_sub(3)..k).rev().find(|&j| all[j] == "the") {
            return Some(format!("\"{}\"", all[j..=k].join(" ")));
        }
        let numbered = all
            .get(k + 1)
            .is_some_and(|n| n.chars().next().is_some_and(|c| c.is_ascii_digit()));
        if numbered && !(k > 0 && all[k - 1].contains('/')) {
            return Some(format!("\"issue {}\"", all[k + 1]));
        }
    }
    None
}

fn check_file(root: &Path, file: &str, problems: &mut Vec<String>) {
    let Ok(bytes) = fs::read(root.join(file)) else {
        return;
    };
    let Ok(text) = String::from_utf8(bytes) else {
        return;
    };
    // The document `§N` refers to when a line names none: the last one named in this comment
    // block.
    let mut block_doc: Option<String> = None;
    let mut prev = "";
    for (i, line) in text.lines().enumerate() {
        let at = format!("{file}:{}", i + 1);
        if !is_comment(line) {
            block_doc = None;
        }
        for note in NOTES {
            if line.contains(note) {
                problems.push(format!(
                    "{at}: cites the team's notes (\"{note}\"), which are not in the \
                     repository; cite docs/cdi-rules.md, docs/nvidia-behaviour.md or \
                     docs/field-notes.md instead"
                ));
            }
        }
        for (k, _) in line.match_indices("shared/") {
            let before = line[..k].chars().next_back();
            if before.is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_' || c == '-')) {
                problems.push(format!(
                    "{at}: names a path under shared/, which is not in the repository"
                ));
            }
        }
        let mentions = md_mentions(line);
        for (_, token) in &mentions {
            if !upstream(token) && resolve(root, file, token).is_none() {
                problems.push(format!(
                    "{at}: cites {token}, which is not a file in the repository (an upstream \
                     file named as such belongs in UPSTREAM_MD, tests/checks/citations.rs)"
                ));
            }
        }
        for (pos, n) in sections(line) {
            let doc = mentions
                .iter()
                .rev()
                .find(|(p, _)| *p < pos)
                .map(|(_, t)| t.clone())
                .or_else(|| block_doc.clone());
            let Some(doc) = doc else {
                problems.push(format!(
                    "{at}: §{n} without the document it refers to (name it: docs/x.md §{n})"
                ));
                continue;
            };
            if upstream(&doc) {
                continue;
            }
            if let Some(path) = resolve(root, file, &doc) {
                let body = fs::read_to_string(&path).unwrap_or_default();
                if !has_section(&body, &n) {
                    problems.push(format!("{at}: {doc} has no section {n}"));
                }
            }
        }
        if let Some((_, last)) = mentions.last() {
            if is_comment(line) {
                block_doc = Some(last.clone());
            }
        }
        if let Some(what) = tracker_reference(prev, line) {
            problems.push(format!(
                "{at}: {what} reads as a reference to our issue tracker, which a reader of \
                 the code cannot open; state the fact or cite docs/"
            ));
        }
        prev = line;
    }
}

#[test]
fn every_citation_resolves_in_the_repository() {
    let root = repo();
    let mut all = Vec::new();
    for r in ROOTS {
        files(&root, r, &mut all);
    }
    assert!(
        all.len() > 50,
        "found only {} files to scan under {ROOTS:?}",
        all.len()
    );
    let mut problems = Vec::new();
    for file in &all {
        check_file(&root, file, &mut problems);
    }
    assert!(
        problems.is_empty(),
        "{} citation(s) a clone of the repository cannot follow:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn the_checks_catch_what_they_should_and_nothing_else() {
    let m = |l: &str| -> Vec<String> { md_mentions(l).into_iter().map(|(_, t)| t).collect() };
    assert_eq!(m("see docs/cdi-rules.md §2.3."), ["docs/cdi-rules.md"]);
    assert_eq!(m("(README.md, \"Install\")"), ["README.md"]);
    assert_eq!(m("`./docs/design.md` and x.mdx"), ["docs/design.md"]);
    assert!(m("a .md file, markdown").is_empty());
    assert_eq!(
        sections("docs/a.md §4, §5.1 step 2"),
        [(10, "4".to_string()), (15, "5.1".to_string())]
    );
    assert!(upstream(
        "containerd docs/cri/config.md".rsplit(' ').next().unwrap()
    ));
    assert!(upstream("out/table.md"));
    assert!(has_section("# T\n## 2. Data\n### 2.3 Validation\n", "2.3"));
    assert!(has_section("1. one\n5. `edits`: the model\n", "5"));
    assert!(!has_section("## 2.3 Validation\n", "2"));
    assert!(!has_section("## 12. Twelve\n", "1"));

    let t = |prev: &str, l: &str| tracker_reference(prev, l).is_some();
    assert!(t("", "(security issue 16, item 7)"));
    assert!(t("", "// ---- issue 13: files"));
    assert!(t("", "(see the CDI issue): auto"));
    assert!(t("", "the benchmarks-and-hardening issue, \"Reliability\""));
    assert!(t(
        "//! forms (the",
        "//! Kubernetes request-forms issue), each"
    ));
    assert!(t("", "Built as the issue describes it"));
    assert!(t("", "(glibc static; the issue's 0.33 ms)"));
    assert!(!t("", "(NVIDIA/nvidia-container-toolkit issue 48)"));
    assert!(!t("", "(nvidia-container-toolkit#48, runc#3671)"));
    assert!(!t(
        "",
        "One issue in five on NVIDIA's toolkit quotes an opaque error"
    ));
    assert!(!t("", "a large share of the issues users file"));
}

#[test]
fn a_file_is_checked_line_by_line() {
    let root = tempfile::tempdir().unwrap();
    let root = root.path();
    fs::create_dir_all(root.join("docs")).unwrap();
    fs::create_dir_all(root.join("src")).unwrap();
    fs::write(
        root.join("docs/a.md"),
        "# A\n## 2. Two\n### 2.3 Two three\n",
    )
    .unwrap();
    let lines = [
        "//! Follows docs/a.md §2.3 and the CDI library's SPEC.md §3 (upstream).",
        "//! Then more (§2), in the same comment block as docs/a.md.",
        "fn f() {}",
        "//! Gone: docs/a.md §4, docs/b.md, a.md §2.9.",
        "//! Dangling (§7).",
        "// field-lessons.md §2.8; shared/design.md",
        "// (security issue 16, item 7)",
    ];
    fs::write(root.join("src/x.rs"), lines.join("\n")).unwrap();
    let mut problems = Vec::new();
    check_file(root, "src/x.rs", &mut problems);
    let at: Vec<&str> = problems
        .iter()
        .map(|p| p.split(": ").next().unwrap())
        .collect();
    assert_eq!(
        at,
        [
            "src/x.rs:4", // docs/a.md has no §4
            "src/x.rs:4", // docs/b.md does not exist
            "src/x.rs:4", // a.md (docs/a.md) has no §2.9
            "src/x.rs:5", // § without a document
            "src/x.rs:6", // the notes' name
            "src/x.rs:6", // field-lessons.md is no file
            "src/x.rs:6", // shared/design.md is no file
            "src/x.rs:6", // shared/
            "src/x.rs:7", // our tracker
        ],
        "{problems:#?}"
    );
}
