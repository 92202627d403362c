//! Reading CDI spec files the way the reference library does, and writing YAML that every
//! consumer reads back unchanged.
//!
//! The reference decodes every spec, `.json` or `.yaml`, with `sigs.k8s.io/yaml`: YAML 1.1
//! scalars from `gopkg.in/yaml.v2`, then `encoding/json` with unknown fields rejected and keys
//! matched case-insensitively (docs/cdi-rules.md §2.2). A typed serde YAML decoder gets several
//! of these wrong for real specs: `fileMode: 0666` is octal (438) in YAML 1.1 but decimal in
//! YAML 1.2 (serde_yaml, serde_norway, serde_yml), an unquoted `name: 0` must become the string
//! `"0"`, `KIND:` must match `kind`. So this module reads the document with yaml-rust2's event
//! parser (maintained, pure Rust, keeps each scalar's raw text and quoting style) into a small
//! tree, and [`to_json`] converts it to JSON guided by the CDI [`Shape`]: YAML 1.1 resolution of
//! plain scalars, the reference's coercion of numbers and booleans into string fields, key
//! matching, unknown-field and duplicate-key errors with the path and line. The typed structs
//! then deserialise from that JSON.
//!
//! The event parser resolves aliases but not YAML 1.1 merge keys (`<<`), so [`parse`] applies
//! them as the reference's strict yaml.v2 does; it also bounds alias expansion and nesting
//! ([`MAX_ALIAS_NODES`], [`MAX_DEPTH`]), which an event parser leaves to its user.
//!
//! Output ([`emit`]) is block YAML that quotes every string a YAML 1.1 reader could take for
//! something else, so Go consumers (podman, containerd, CRI-O) read exactly what was written.
//!
//! One file (780 lines of code, 200 of tests): the reader ([`parse`] into [`Node`]), the
//! shape-guided conversion ([`to_json`]) and the writer ([`emit`]) share one rule, YAML 1.1's
//! reading of plain scalars: what the reader resolves as a number, boolean or null is what the
//! writer must quote.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use serde_json::{Map, Number, Value};
use thiserror::Error;
use yaml_rust2::parser::{Event, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// A decoding error: where, and what.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{}{message}", location(*line, *col, path))]
pub struct YamlError {
    /// 1-based line, 0 when unknown.
    pub line: usize,
    pub col: usize,
    /// `devices[0].containerEdits.deviceNodes[1].major`, empty at the top.
    pub path: String,
    pub message: String,
}

fn location(line: usize, col: usize, path: &str) -> String {
    let mut s = String::new();
    if line > 0 {
        let _ = write!(s, "line {line} column {col}: ");
    }
    if !path.is_empty() {
        let _ = write!(s, "{path}: ");
    }
    s
}

/// A parsed YAML node. Scalars keep their raw text; `plain` is false for quoted and block
/// scalars and for `!!str`-tagged ones, which are always strings.
#[derive(Debug, Clone)]
pub enum Node {
    Scalar {
        text: String,
        plain: bool,
        line: usize,
        col: usize,
    },
    Seq(Vec<Node>, usize),
    Map(Vec<(Node, Node)>, usize),
}

impl Node {
    fn line(&self) -> (usize, usize) {
        match self {
            Node::Scalar { line, col, .. } => (*line, *col),
            Node::Seq(_, line) | Node::Map(_, line) => (*line, 0),
        }
    }
}

/// A plain scalar after YAML 1.1 resolution (yaml.v2 `resolve.go`).
#[derive(Debug, Clone, PartialEq)]
enum Scalar {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
}

/// Nodes that aliases may copy into one document, in all. Go's YAML decoder stops documents
/// whose aliases expand far beyond their size; a spec has no use for more than a few aliases,
/// and without a bound ten nested levels of ten aliases each make 10^10 nodes out of a few
/// hundred bytes (the runtime would be killed for memory).
pub const MAX_ALIAS_NODES: usize = 1_000_000;
/// Nesting depth of collections. A spec nests about eight levels; past this a document is not
/// a spec, and the reader (recursive, like dropping the tree) would run out of stack.
pub const MAX_DEPTH: usize = 256;

struct Reader<'a> {
    parser: Parser<std::str::Chars<'a>>,
    /// Anchor id → the node and its size in nodes.
    anchors: HashMap<usize, (Node, usize)>,
    /// Nodes copied through aliases so far ([`MAX_ALIAS_NODES`]).
    alias_nodes: usize,
    depth: usize,
}

/// The number of nodes in `node`.
fn size(node: &Node) -> usize {
    match node {
        Node::Scalar { .. } => 1,
        Node::Seq(items, _) => 1 + items.iter().map(size).sum::<usize>(),
        Node::Map(entries, _) => {
            1 + entries
                .iter()
                .map(|(k, v)| size(k) + size(v))
                .sum::<usize>()
        }
    }
}

/// A merge key: a plain `<<` (YAML 1.1 merge type, which yaml.v2 applies).
fn is_merge_key(node: &Node) -> bool {
    matches!(node, Node::Scalar { text, plain: true, .. } if text == "<<")
}

/// How a key is compared when merging: resolved, as Go's `map[interface{}]interface{}` keys.
fn merge_identity(node: &Node) -> Option<String> {
    scalar_of(node).map(|s| format!("{s:?}"))
}

/// Applies the merge keys of one mapping: the mappings a `<<` names (one, or a sequence of
/// them) add their keys to it. The reference decodes with yaml.v2 in strict mode, where every
/// key, merged or not, is set through one check that refuses a key already in the map: so a
/// merged key the mapping also sets, or that two merged mappings both set, is an error there
/// (`key "x" already set in map`), not an override. The same here.
fn merge(entries: Vec<(Node, Node)>) -> Result<Vec<(Node, Node)>, YamlError> {
    if !entries.iter().any(|(k, _)| is_merge_key(k)) {
        return Ok(entries);
    }
    let mut own = Vec::new();
    let mut sources = Vec::new();
    for (k, v) in entries {
        if !is_merge_key(&k) {
            own.push((k, v));
            continue;
        }
        let (kl, kc) = k.line();
        let not_a_map = || YamlError {
            line: kl,
            col: kc,
            path: String::new(),
            message: "map merge requires map or sequence of maps as the value".into(),
        };
        match v {
            Node::Map(e, _) => sources.push(e),
            Node::Seq(items, _) => {
                for item in items {
                    match item {
                        Node::Map(e, _) => sources.push(e),
                        _ => return Err(not_a_map()),
                    }
                }
            }
            _ => return Err(not_a_map()),
        }
    }
    let mut present: HashSet<String> = own.iter().filter_map(|(k, _)| merge_identity(k)).collect();
    for (k, v) in sources.into_iter().flatten() {
        if let Some(id) = merge_identity(&k) {
            if !present.insert(id) {
                let (line, col) = k.line();
                let key = key_string(&k, &At::Top("")).unwrap_or_default();
                return Err(YamlError {
                    line,
                    col,
                    path: String::new(),
                    message: format!(
                        "key {key:?} already set in map (a merge key `<<` may only add keys the mapping does not set itself, as the reference's strict decoder requires): remove one of the two"
                    ),
                });
            }
        }
        own.push((k, v));
    }
    Ok(own)
}

/// A `!!binary` scalar's text: yaml.v2 (under sigs.k8s.io/yaml, which the CDI reference reads
/// specs with) decodes it as standard base64, line breaks ignored, into the string's bytes;
/// bytes that are not UTF-8 become U+FFFD, as Go's JSON encoder writes them.
fn decode_binary(text: &str) -> Option<String> {
    use base64::Engine as _;
    let packed: String = text.chars().filter(|c| !matches!(c, '\n' | '\r')).collect();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(packed)
        .ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

fn scan_error(e: yaml_rust2::ScanError) -> YamlError {
    YamlError {
        line: e.marker().line(),
        col: e.marker().col() + 1,
        path: String::new(),
        message: e.info().to_string(),
    }
}

impl Reader<'_> {
    fn next(&mut self) -> Result<(Event, Marker), YamlError> {
        self.parser.next_token().map_err(scan_error)
    }

    fn node(&mut self, event: Event, mark: Marker) -> Result<Node, YamlError> {
        let line = mark.line();
        Ok(match event {
            Event::Scalar(text, style, anchor, tag) => {
                let is_str_tag = tag.as_ref().is_some_and(|t| t.suffix == "str");
                let is_binary = tag.as_ref().is_some_and(|t| t.suffix == "binary");
                let text = if is_binary {
                    decode_binary(&text).ok_or_else(|| YamlError {
                        line,
                        col: mark.col() + 1,
                        path: String::new(),
                        message: "!!binary value contains invalid base64 data".into(),
                    })?
                } else {
                    text
                };
                let node = Node::Scalar {
                    text,
                    plain: style == TScalarStyle::Plain && !is_str_tag && !is_binary,
                    line,
                    col: mark.col() + 1,
                };
                self.remember(anchor, &node);
                node
            }
            Event::SequenceStart(anchor, _) => {
                self.enter(line, mark.col())?;
                let mut items = Vec::new();
                loop {
                    let (ev, m) = self.next()?;
                    if ev == Event::SequenceEnd {
                        break;
                    }
                    items.push(self.node(ev, m)?);
                }
                self.depth -= 1;
                let node = Node::Seq(items, line);
                self.remember(anchor, &node);
                node
            }
            Event::MappingStart(anchor, _) => {
                self.enter(line, mark.col())?;
                let mut entries = Vec::new();
                loop {
                    let (ev, m) = self.next()?;
                    if ev == Event::MappingEnd {
                        break;
                    }
                    let key = self.node(ev, m)?;
                    let (ev, m) = self.next()?;
                    let value = self.node(ev, m)?;
                    entries.push((key, value));
                }
                self.depth -= 1;
                let node = Node::Map(merge(entries)?, line);
                self.remember(anchor, &node);
                node
            }
            Event::Alias(id) => {
                let err = |message: String| YamlError {
                    line,
                    col: mark.col() + 1,
                    path: String::new(),
                    message,
                };
                let (node, n) = self
                    .anchors
                    .get(&id)
                    .ok_or_else(|| err("unknown anchor".into()))?;
                self.alias_nodes += n;
                if self.alias_nodes > MAX_ALIAS_NODES {
                    return Err(err(format!(
                        "aliases expand to more than {MAX_ALIAS_NODES} nodes (an alias bomb?); write the spec without nested aliases"
                    )));
                }
                node.clone()
            }
            other => {
                return Err(YamlError {
                    line,
                    col: mark.col() + 1,
                    path: String::new(),
                    message: format!("unexpected YAML event {other:?}"),
                })
            }
        })
    }

    fn remember(&mut self, anchor: usize, node: &Node) {
        if anchor > 0 {
            self.anchors.insert(anchor, (node.clone(), size(node)));
        }
    }

    fn enter(&mut self, line: usize, col: usize) -> Result<(), YamlError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(YamlError {
                line,
                col: col + 1,
                path: String::new(),
                message: format!(
                    "collections nested more than {MAX_DEPTH} deep; a CDI spec nests a few levels"
                ),
            });
        }
        Ok(())
    }
}

/// Parses the first document of `text`; `None` for an empty document or stream. Later
/// documents are not read (yaml.v2 `Unmarshal` decodes the first one only).
pub fn parse(text: &str) -> Result<Option<Node>, YamlError> {
    let mut r = Reader {
        parser: Parser::new_from_str(text),
        anchors: HashMap::new(),
        alias_nodes: 0,
        depth: 0,
    };
    loop {
        let (ev, mark) = r.next()?;
        match ev {
            Event::StreamStart | Event::DocumentStart | Event::Nothing => continue,
            Event::StreamEnd | Event::DocumentEnd => return Ok(None),
            ev => return r.node(ev, mark).map(Some),
        }
    }
}

/// Go's `strconv.ParseInt(s, 0, 64)` (and ParseUint), as yaml.v2 uses it: optional sign, then
/// `0x`, `0o`, `0b`, a leading `0` for octal, or decimal.
fn parse_go_int(s: &str) -> Option<i128> {
    let (neg, body) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let (radix, digits) =
        if let Some(d) = body.strip_prefix("0x").or_else(|| body.strip_prefix("0X")) {
            (16, d)
        } else if let Some(d) = body.strip_prefix("0o").or_else(|| body.strip_prefix("0O")) {
            (8, d)
        } else if let Some(d) = body.strip_prefix("0b").or_else(|| body.strip_prefix("0B")) {
            (2, d)
        } else if body.len() > 1 && body.starts_with('0') {
            (8, &body[1..])
        } else {
            (10, body)
        };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let v = i128::from_str_radix(digits, radix).ok()?;
    let v = if neg { -v } else { v };
    // int64 or uint64, as yaml.v2 tries both.
    (v >= i128::from(i64::MIN) && v <= i128::from(u64::MAX)).then_some(v)
}

/// yaml.v2's float pattern `^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`.
fn is_yaml_float(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    if matches!(b.first(), Some(b'-' | b'+')) {
        i = 1;
    }
    let digits = |i: &mut usize| {
        let start = *i;
        while *i < b.len() && b[*i].is_ascii_digit() {
            *i += 1;
        }
        *i - start
    };
    if b.get(i) == Some(&b'.') {
        i += 1;
        if digits(&mut i) == 0 {
            return false;
        }
    } else {
        if digits(&mut i) == 0 {
            return false;
        }
        if b.get(i) == Some(&b'.') {
            i += 1;
            digits(&mut i);
        }
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'-' | b'+')) {
            i += 1;
        }
        if digits(&mut i) == 0 {
            return false;
        }
    }
    i == b.len()
}

/// Resolves a plain scalar with YAML 1.1 rules (yaml.v2). Timestamps stay strings.
fn resolve_plain(text: &str) -> Scalar {
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Scalar::Null,
        "y" | "Y" | "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => {
            return Scalar::Bool(true)
        }
        "n" | "N" | "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => {
            return Scalar::Bool(false)
        }
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => {
            return Scalar::Float(f64::INFINITY)
        }
        "-.inf" | "-.Inf" | "-.INF" => return Scalar::Float(f64::NEG_INFINITY),
        ".nan" | ".NaN" | ".NAN" => return Scalar::Float(f64::NAN),
        _ => {}
    }
    if text.starts_with(|c: char| c.is_ascii_digit() || matches!(c, '+' | '-' | '.')) {
        let plain = text.replace('_', "");
        if let Some(v) = parse_go_int(&plain) {
            return Scalar::Int(v);
        }
        if is_yaml_float(&plain) {
            if let Ok(f) = plain.parse::<f64>() {
                return Scalar::Float(f);
            }
        }
    }
    Scalar::Str(text.to_string())
}

fn scalar_of(node: &Node) -> Option<Scalar> {
    match node {
        Node::Scalar { text, plain, .. } => Some(if *plain {
            resolve_plain(text)
        } else {
            Scalar::Str(text.clone())
        }),
        _ => None,
    }
}

/// A number or boolean as sigs.k8s.io/yaml writes it into a string field
/// (`strconv.FormatInt`, `FormatFloat(f, 'g', -1, 64)`, `FormatBool`); a string as it is
/// (moved, not copied).
fn scalar_into_string(s: Scalar) -> Option<String> {
    Some(match s {
        Scalar::Null => return None,
        Scalar::Bool(b) => b.to_string(),
        Scalar::Int(i) => i.to_string(),
        Scalar::Float(f) if f.is_infinite() => if f > 0.0 { "+Inf" } else { "-Inf" }.into(),
        Scalar::Float(f) if f.is_nan() => "NaN".into(),
        Scalar::Float(f) => format!("{f}"),
        Scalar::Str(s) => s,
    })
}

/// The JSON shape a spec field decodes into.
#[derive(Debug, Clone, Copy)]
pub enum Shape {
    Str,
    /// `int64` / `int`.
    Int,
    /// `uint32`.
    U32,
    Bool,
    List(&'static Shape),
    /// `map[string]string`.
    StrMap,
    Object(&'static [(&'static str, Shape)]),
}

fn describe(node: &Node) -> &'static str {
    match node {
        Node::Seq(..) => "a sequence",
        Node::Map(..) => "a mapping",
        Node::Scalar { .. } => match scalar_of(node) {
            Some(Scalar::Null) => "null",
            Some(Scalar::Bool(_)) => "a boolean",
            Some(Scalar::Int(_)) => "an integer",
            Some(Scalar::Float(_)) => "a number",
            _ => "a string",
        },
    }
}

/// Where a node sits, as `devices[0].containerEdits`: a chain on the stack, written out only
/// for an error. Formatting it for every node was 9% of a CDI create's instructions
/// (callgrind, docs/benchmarks.md).
#[derive(Clone, Copy)]
enum At<'a> {
    Top(&'a str),
    Field(&'a At<'a>, &'a str),
    Index(&'a At<'a>, usize),
}

impl At<'_> {
    fn render(&self) -> String {
        let mut out = String::new();
        self.write(&mut out);
        out
    }

    fn write(&self, out: &mut String) {
        match self {
            At::Top(path) => out.push_str(path),
            At::Field(parent, key) => {
                parent.write(out);
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            At::Index(parent, i) => {
                parent.write(out);
                let _ = write!(out, "[{i}]");
            }
        }
    }
}

/// Converts `node` to JSON for `shape`. A null comes back as `Value::Null`; objects drop keys
/// whose value is null, as Go leaves such fields unset.
pub fn to_json(node: &Node, shape: &Shape, path: &str) -> Result<Value, YamlError> {
    convert(node, shape, &At::Top(path))
}

fn convert(node: &Node, shape: &Shape, at: &At) -> Result<Value, YamlError> {
    let (line, col) = node.line();
    let err = |message: String| YamlError {
        line,
        col,
        path: at.render(),
        message,
    };
    let scalar = scalar_of(node);
    if scalar == Some(Scalar::Null) {
        return Ok(Value::Null);
    }
    match shape {
        Shape::Str => match scalar.and_then(scalar_into_string) {
            Some(s) => Ok(Value::String(s)),
            None => Err(err(format!("expected a string, found {}", describe(node)))),
        },
        Shape::Int | Shape::U32 => {
            let v = match scalar {
                Some(Scalar::Int(i)) => Some(i),
                // yaml.v2 reads `08` as the float 8; JSON then carries `8`, which Go accepts.
                Some(Scalar::Float(f)) if f.fract() == 0.0 && f.abs() < 9.2e18 => Some(f as i128),
                _ => None,
            }
            .ok_or_else(|| err(format!("expected an integer, found {}", describe(node))))?;
            let (lo, hi) = match shape {
                Shape::U32 => (0, i128::from(u32::MAX)),
                _ => (i128::from(i64::MIN), i128::from(i64::MAX)),
            };
            if v < lo || v > hi {
                return Err(err(format!("integer {v} out of range")));
            }
            // In range of i64 by the check above.
            Ok(Value::Number(Number::from(v as i64)))
        }
        Shape::Bool => match scalar {
            Some(Scalar::Bool(b)) => Ok(Value::Bool(b)),
            _ => Err(err(format!("expected a boolean, found {}", describe(node)))),
        },
        Shape::List(item) => {
            let Node::Seq(items, _) = node else {
                return Err(err(format!(
                    "expected a sequence, found {}",
                    describe(node)
                )));
            };
            items
                .iter()
                .enumerate()
                .map(|(i, n)| {
                    let v = convert(n, item, &At::Index(at, i))?;
                    Ok(if v.is_null() { zero(item) } else { v })
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Value::Array)
        }
        Shape::StrMap => {
            let Node::Map(entries, _) = node else {
                return Err(err(format!("expected a mapping, found {}", describe(node))));
            };
            let mut out = Map::new();
            for (k, v) in entries {
                let key = key_string(k, at)?;
                if out.contains_key(&key) {
                    return Err(duplicate(k, at, &key));
                }
                let value = convert(v, &Shape::Str, &At::Field(at, &key))?;
                let value = if value.is_null() {
                    Value::String(String::new())
                } else {
                    value
                };
                out.insert(key, value);
            }
            Ok(Value::Object(out))
        }
        Shape::Object(fields) => {
            let Node::Map(entries, _) = node else {
                return Err(err(format!("expected a mapping, found {}", describe(node))));
            };
            let mut seen: HashSet<String> = HashSet::with_capacity(entries.len());
            let mut matched = Vec::with_capacity(entries.len());
            for (k, v) in entries {
                let key = key_string(k, at)?;
                // yaml.v2 strict mode: an exact duplicate key is an error.
                if !seen.insert(key.clone()) {
                    return Err(duplicate(k, at, &key));
                }
                // encoding/json: an exact match first, then a case-insensitive one.
                let field = fields.iter().find(|(name, _)| *name == key).or_else(|| {
                    let folded = fold(&key);
                    fields.iter().find(|(name, _)| fold(name) == folded)
                });
                let Some((name, shape)) = field else {
                    let (line, col) = k.line();
                    return Err(YamlError {
                        line,
                        col,
                        path: at.render(),
                        message: format!("unknown field {key:?}"),
                    });
                };
                matched.push((key, *name, shape, v));
            }
            // sigs.k8s.io/yaml turns the mapping into a JSON object with keys in byte order
            // (encoding/json sorts map keys), and encoding/json then sets each field from every
            // key that matches it, in that order: of keys differing only in case, the
            // byte-greatest wins, wherever it stands in the file.
            matched.sort_by(|a, b| a.0.cmp(&b.0));
            let mut out = Map::new();
            for (_, name, shape, v) in matched {
                let value = convert(v, shape, &At::Field(at, name))?;
                if value.is_null() {
                    // JSON null leaves a Go string, number or bool as it was and clears a
                    // slice, map or pointer.
                    if !matches!(shape, Shape::Str | Shape::Int | Shape::U32 | Shape::Bool) {
                        out.remove(name);
                    }
                } else {
                    out.insert(name.to_string(), value);
                }
            }
            Ok(Value::Object(out))
        }
    }
}

/// A key as encoding/json compares it with a field name: each character lowered then raised,
/// so `KIND`, `kind` and `\u{212a}ind` (Kelvin sign) are one name, as in Go.
fn fold(s: &str) -> String {
    s.chars()
        .flat_map(char::to_lowercase)
        .flat_map(char::to_uppercase)
        .collect()
}

fn duplicate(k: &Node, at: &At, key: &str) -> YamlError {
    let (line, col) = k.line();
    YamlError {
        line,
        col,
        path: at.render(),
        message: format!("mapping key {key:?} already defined"),
    }
}

fn key_string(k: &Node, at: &At) -> Result<String, YamlError> {
    scalar_of(k)
        .map(|s| scalar_into_string(s).unwrap_or_default())
        .ok_or_else(|| {
            let (line, col) = k.line();
            YamlError {
                line,
                col,
                path: at.render(),
                message: "mapping keys must be scalars".into(),
            }
        })
}

/// The zero value Go leaves for a null list element.
fn zero(shape: &Shape) -> Value {
    match shape {
        Shape::Str => Value::String(String::new()),
        Shape::Int | Shape::U32 => Value::from(0),
        Shape::Bool => Value::Bool(false),
        Shape::List(_) => Value::Array(Vec::new()),
        Shape::StrMap | Shape::Object(_) => Value::Object(Map::new()),
    }
}

/// True when a string can be written plain and every YAML 1.1 and 1.2 reader reads it back as
/// the same string: it starts with a letter or `/`, uses a conservative character set, and is
/// not a YAML 1.1 boolean or null word.
fn plain_ok(s: &str) -> bool {
    let Some(first) = s.chars().next() else {
        return false;
    };
    if !(first.is_ascii_alphabetic() || first == '/') {
        return false;
    }
    if !s
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '.' | '_' | '-' | '+' | '='))
    {
        return false;
    }
    !matches!(
        s.to_ascii_lowercase().as_str(),
        "y" | "n" | "yes" | "no" | "true" | "false" | "on" | "off" | "null"
    )
}

fn emit_scalar(out: &mut String, v: &Value) {
    match v {
        Value::String(s) if plain_ok(s) => out.push_str(s),
        // A JSON string literal is a valid YAML double-quoted scalar with the same value.
        Value::String(s) => out.push_str(&Value::String(s.clone()).to_string()),
        other => out.push_str(&other.to_string()),
    }
}

fn is_block(v: &Value) -> bool {
    match v {
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
        _ => false,
    }
}

fn emit_value(out: &mut String, v: &Value, indent: usize) {
    match v {
        Value::Object(map) => {
            let mut first = true;
            for (k, val) in map {
                if !first {
                    out.push_str(&" ".repeat(indent));
                }
                first = false;
                emit_scalar(out, &Value::String(k.clone()));
                out.push(':');
                emit_child(out, val, indent);
            }
        }
        Value::Array(items) => {
            let mut first = true;
            for item in items {
                if !first {
                    out.push_str(&" ".repeat(indent));
                }
                first = false;
                out.push_str("- ");
                if is_block(item) {
                    emit_value(out, item, indent + 2);
                } else {
                    emit_flow(out, item);
                    out.push('\n');
                }
            }
        }
        other => {
            emit_flow(out, other);
            out.push('\n');
        }
    }
}

fn emit_flow(out: &mut String, v: &Value) {
    match v {
        Value::Array(_) => out.push_str("[]"),
        Value::Object(_) => out.push_str("{}"),
        other => emit_scalar(out, other),
    }
}

/// After `key:` in a mapping at `indent`.
fn emit_child(out: &mut String, v: &Value, indent: usize) {
    match v {
        // Sequences in a mapping sit at the key's indentation ("- " is the indentation).
        Value::Array(a) if !a.is_empty() => {
            out.push('\n');
            out.push_str(&" ".repeat(indent));
            emit_value(out, v, indent);
        }
        Value::Object(o) if !o.is_empty() => {
            out.push('\n');
            out.push_str(&" ".repeat(indent + 2));
            emit_value(out, v, indent + 2);
        }
        other => {
            out.push(' ');
            emit_flow(out, other);
            out.push('\n');
        }
    }
}

/// Writes a JSON document as a block-style YAML document starting with `---`.
pub fn emit(v: &Value) -> String {
    let mut out = String::from("---\n");
    if is_block(v) {
        emit_value(&mut out, v, 0);
    } else {
        emit_flow(&mut out, v);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const FIELDS: &[(&str, Shape)] = &[
        ("name", Shape::Str),
        ("fileMode", Shape::U32),
        ("major", Shape::Int),
        ("flag", Shape::Bool),
        ("list", Shape::List(&Shape::Str)),
        ("annotations", Shape::StrMap),
    ];
    const OBJ: Shape = Shape::Object(FIELDS);

    fn convert(text: &str) -> Result<Value, YamlError> {
        let node = parse(text)?.expect("a document");
        to_json(&node, &OBJ, "")
    }

    #[test]
    fn yaml_1_1_scalars() {
        let v =
            convert("name: 0\nfileMode: 0666\nmajor: 0x10\nflag: yes\nlist: [on, 1.5, '07', ~]\n")
                .unwrap();
        assert_eq!(
            v,
            json!({"name": "0", "fileMode": 438, "major": 16, "flag": true, "list": ["true", "1.5", "07", ""]})
        );
        // Octal digits only: 08 is yaml.v2's float 8.
        assert_eq!(convert("major: 08").unwrap(), json!({"major": 8}));
        assert_eq!(convert("major: 1_000").unwrap(), json!({"major": 1000}));
        assert_eq!(convert("name: \"0666\"").unwrap(), json!({"name": "0666"}));
        assert_eq!(convert("name: !!str 12").unwrap(), json!({"name": "12"}));
    }

    /// yaml.v2 (the reference's reader, through sigs.k8s.io/yaml) decodes `!!binary` into the
    /// string's bytes, line breaks in a block ignored; bad base64 is an error.
    #[test]
    fn binary_scalars_are_decoded() {
        assert_eq!(
            convert("name: !!binary bnZpZGlh").unwrap(),
            json!({"name": "nvidia"})
        );
        assert_eq!(
            convert(
                "list:\n- !!binary \"L2Rldi9udmlk\"\n- !!binary |\n    L2Rldi9u\n    dmlkaWEw\n"
            )
            .unwrap(),
            json!({"list": ["/dev/nvid", "/dev/nvidia0"]})
        );
        // Decoded text is a string even where it reads as a number.
        assert_eq!(
            convert("name: !!binary MTk1").unwrap(),
            json!({"name": "195"})
        );
        assert!(convert("major: !!binary MTk1").is_err());
        let e = convert("name: !!binary not*base64").unwrap_err();
        assert!(e.to_string().contains("invalid base64"), "{e}");
    }

    #[test]
    fn keys_case_insensitive_unknown_and_duplicates() {
        assert_eq!(convert("NAME: x").unwrap(), json!({"name": "x"}));
        let e = convert("name: x\nxyzzy: garbled\n").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.to_string().contains("unknown field \"xyzzy\""), "{e}");
        let e = convert("name: x\nname: y\n").unwrap_err();
        assert!(e.to_string().contains("already defined"), "{e}");
        // Differing only in case: the byte-greatest key wins wherever it stands (keys reach
        // encoding/json sorted), so `name` beats `NAME` in either order.
        assert_eq!(convert("name: x\nNAME: z\n").unwrap(), json!({"name": "x"}));
        assert_eq!(convert("NAME: z\nname: x\n").unwrap(), json!({"name": "x"}));
        assert_eq!(convert("Name: a\nNAME: b\n").unwrap(), json!({"name": "a"}));
        // A null from the greater key leaves a string field as it was.
        assert_eq!(convert("NAME: z\nname: ~\n").unwrap(), json!({"name": "z"}));
        // Go folds Unicode too: the Kelvin sign matches `k`.
        assert_eq!(fold("\u{212a}IND"), fold("kind"));
        assert_eq!(
            convert("\u{17f}ame: y").unwrap_err().message,
            "unknown field \"\u{17f}ame\""
        );
        assert_eq!(
            convert("annotation\u{17f}: {a: b}").unwrap(),
            json!({"annotations": {"a": "b"}})
        );
    }

    #[test]
    fn type_errors_name_the_path() {
        let e = convert("major: \"195\"").unwrap_err();
        assert_eq!(e.path, "major");
        assert!(e.message.contains("expected an integer"), "{e}");
        assert!(convert("fileMode: -1").is_err());
        assert!(convert("flag: 1").is_err());
        assert!(convert("list: x").is_err());
        assert_eq!(convert("list: [a, [b]]").unwrap_err().path, "list[1]");
        assert_eq!(
            convert("annotations: {k: [x]}").unwrap_err().path,
            "annotations.k"
        );
        let node = parse("devices:\n- name: a\n  containerEdits:\n    deviceNodes:\n    - path: /dev/x\n    - {path: /dev/y, major: x}\n")
            .unwrap()
            .unwrap();
        let shape = &crate::cdi::spec::SPEC_SHAPE;
        let e = to_json(&node, shape, "").unwrap_err();
        assert_eq!(e.path, "devices[0].containerEdits.deviceNodes[1].major");
        let e = to_json(&node, shape, "spec").unwrap_err();
        assert_eq!(
            e.path,
            "spec.devices[0].containerEdits.deviceNodes[1].major"
        );
        let e = convert("name: x\nbogus: 1\n").unwrap_err();
        assert_eq!((e.path.as_str(), e.line), ("", 2));
    }

    #[test]
    fn json_is_yaml_and_nulls_are_unset() {
        assert_eq!(
            convert(r#"{"name": "a", "major": null, "list": null}"#).unwrap(),
            json!({"name": "a"})
        );
        assert!(parse("").unwrap().is_none());
        // An empty document is a null node: the spec reader reports "no Spec data".
        let empty = parse("---\n").unwrap().unwrap();
        assert!(to_json(&empty, &OBJ, "").unwrap().is_null());
        // Only the first document counts.
        assert_eq!(
            convert("name: a\n---\nname: b\n").unwrap(),
            json!({"name": "a"})
        );
    }

    #[test]
    fn anchors_and_aliases() {
        let v = convert("list: &l [a, b]\nannotations: {x: *l}\n");
        assert!(v.is_err(), "a sequence is not a string");
        let v = convert("name: &n abc\nlist: [*n]\n").unwrap();
        assert_eq!(v, json!({"name": "abc", "list": ["abc"]}));
    }

    #[test]
    fn emitted_yaml_reads_back_identically() {
        let doc = json!({
            "cdiVersion": "0.5.0",
            "kind": "nvidia.com/gpu",
            "devices": [
                {"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0", "major": 195, "fileMode": 438}]}},
                {"name": "0:1", "containerEdits": {"env": ["A=yes", "B=", "on"]}},
                {"name": "yes", "containerEdits": {}},
            ],
            "containerEdits": {"hooks": [{"hookName": "createContainer", "args": ["a", "--link", "libcuda.so.1::/usr/lib/libcuda.so"], "env": []}], "nested": [[1, 2], []]},
            "annotations": {"a/b": "#x", "c": " lead"}
        });
        let text = emit(&doc);
        assert!(
            text.starts_with(
                "---\ncdiVersion: \"0.5.0\"\nkind: nvidia.com/gpu\ndevices:\n- name: \"0\"\n"
            ),
            "{text}"
        );
        // Read back with YAML 1.1 resolution: every scalar typed as written.
        let node = parse(&text).unwrap().unwrap();
        fn generic(node: &Node) -> Value {
            match node {
                Node::Scalar { text, plain, .. } => match if *plain {
                    resolve_plain(text)
                } else {
                    Scalar::Str(text.clone())
                } {
                    Scalar::Int(i) => json!(i as i64),
                    Scalar::Str(s) => json!(s),
                    other => panic!("unexpected {other:?}"),
                },
                Node::Seq(items, _) => Value::Array(items.iter().map(generic).collect()),
                Node::Map(entries, _) => Value::Object(
                    entries
                        .iter()
                        .map(|(k, v)| (generic(k).as_str().unwrap().to_string(), generic(v)))
                        .collect(),
                ),
            }
        }
        assert_eq!(generic(&node), doc, "{text}");
    }

    #[test]
    fn merge_keys_add_keys_and_refuse_overrides() {
        let pick = |text: &str, index: usize| {
            let Node::Map(top, _) = parse(text)?.expect("a document") else {
                panic!("not a mapping")
            };
            to_json(&top[index].1, &OBJ, "")
        };
        let base = "defaults: &d {name: base, major: 1}\n";
        assert_eq!(
            pick(&format!("{base}x:\n  <<: *d\n  flag: yes\n"), 1).unwrap(),
            json!({"name": "base", "major": 1, "flag": true})
        );
        let two = "a: &a {name: a}\nb: &b {fileMode: 2}\nx: {major: 3, <<: [*a, *b]}\n";
        assert_eq!(
            pick(two, 2).unwrap(),
            json!({"name": "a", "major": 3, "fileMode": 2})
        );
        // yaml.v2 strict: a merged key the mapping sets too, before or after the `<<`, or two
        // merged mappings setting one key, is an error.
        for text in [
            format!("{base}x:\n  <<: *d\n  name: own\n"),
            format!("{base}x:\n  name: own\n  <<: *d\n"),
            "a: &a {name: a}\nb: &b {name: b}\nx: {<<: [*a, *b]}\n".to_string(),
        ] {
            let e = parse(&text).unwrap_err();
            assert!(
                e.message.contains("key \"name\" already set in map"),
                "{text}: {e}"
            );
        }
        // A quoted "<<" is an ordinary key; merging a scalar is an error.
        assert!(convert("\"<<\": {name: a}")
            .unwrap_err()
            .message
            .contains("unknown field"));
        let e = parse("a: &a x\nb: {<<: *a}\n").unwrap_err();
        assert!(e.message.contains("map merge requires map"), "{e}");
    }

    #[test]
    fn alias_bomb_and_deep_nesting_stop() {
        let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..10 {
            let p = i - 1;
            text.push_str(&format!(
                "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
            ));
        }
        let e = parse(&text).unwrap_err();
        assert!(e.message.contains("aliases expand"), "{e}");
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        // yaml-rust2 has its own limit, below MAX_DEPTH; either stops it.
        assert!(parse(&deep).is_err());
    }
}
