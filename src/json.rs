//! JSON text written from a `serde_json::Value`, byte for byte as serde_json's `to_writer` and
//! `to_writer_pretty` write it (two-space indent), with room for members kept as raw text
//! (`bundle`'s lean load keeps `linux.seccomp` so).
//!
//! Why not serde_json's own writer: a GPU create writes the whole config.json, most of it the
//! mounts, device nodes and cgroup rules it adds, and serde_json's generic `Serializer` and
//! `Formatter` push each comma, colon and indent through `io::Write` one small `memcpy` at a
//! time. Writing a MIG `all` create's 53 KB document took 0.90 M of its 3.2 M instructions
//! that way (callgrind, docs/benchmarks.md). Here the pieces are pushed onto the `Vec`
//! directly and a string is checked for characters to escape sixteen bytes at a time (a scan
//! of its own: memchr, behind `nvshim_hook::bytes`, finds up to three given bytes, and
//! serde_json escapes 34). Numbers other than integers are written by serde_json itself;
//! tests hold every other byte to its output.

use serde_json::{Number, Value};

/// Two spaces per level, as serde_json's `PrettyFormatter::new()`.
const INDENT: &[u8] = b"  ";
const SPACES: &[u8; 64] = b"                                                                ";

/// A document being written.
pub struct Writer {
    out: Vec<u8>,
    pretty: bool,
    depth: usize,
}

/// The members of an object being written ([`Writer::object`]).
pub struct Members<'a> {
    w: &'a mut Writer,
    empty: bool,
}

impl Members<'_> {
    /// Writes the separator and `key`; the member's value is written next, to the writer
    /// returned.
    pub fn key(&mut self, key: &str) -> &mut Writer {
        self.w.separator(self.empty);
        self.empty = false;
        self.w.string(key);
        if self.w.pretty {
            self.w.out.extend_from_slice(b": ");
        } else {
            self.w.out.push(b':');
        }
        self.w
    }
}

/// The items of an array being written ([`Writer::array`]).
pub struct Items<'a> {
    w: &'a mut Writer,
    empty: bool,
}

impl Items<'_> {
    /// Writes the separator; the item is written next, to the writer returned.
    pub fn item(&mut self) -> &mut Writer {
        self.w.separator(self.empty);
        self.empty = false;
        self.w
    }
}

impl Writer {
    /// A writer into a buffer of `capacity` bytes; `pretty` as `to_writer_pretty`.
    pub fn new(capacity: usize, pretty: bool) -> Writer {
        Writer {
            out: Vec::with_capacity(capacity),
            pretty,
            depth: 0,
        }
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.out
    }

    /// Text already JSON, written as it is (serde_json's `RawValue`).
    pub fn raw(&mut self, text: &str) {
        self.out.extend_from_slice(text.as_bytes());
    }

    /// An object whose members `members` writes ([`Members::key`], then the value).
    pub fn object(&mut self, members: impl FnOnce(&mut Members<'_>)) {
        self.enclosed(b'{', b'}', |w| {
            let mut m = Members { w, empty: true };
            members(&mut m);
            m.empty
        });
    }

    /// An array whose items `items` writes ([`Items::item`], then the item).
    pub fn array(&mut self, items: impl FnOnce(&mut Items<'_>)) {
        self.enclosed(b'[', b']', |w| {
            let mut i = Items { w, empty: true };
            items(&mut i);
            i.empty
        });
    }

    /// `open`, what `body` writes (it says whether that was nothing), `close`.
    fn enclosed(&mut self, open: u8, close: u8, body: impl FnOnce(&mut Writer) -> bool) {
        self.open(open);
        let empty = body(self);
        self.close(close, empty);
    }

    pub fn value(&mut self, v: &Value) {
        match v {
            Value::Null => self.out.extend_from_slice(b"null"),
            Value::Bool(true) => self.out.extend_from_slice(b"true"),
            Value::Bool(false) => self.out.extend_from_slice(b"false"),
            Value::Number(n) => self.number(n),
            Value::String(s) => self.string(s),
            Value::Array(items) => {
                self.open(b'[');
                for (i, item) in items.iter().enumerate() {
                    self.separator(i == 0);
                    self.value(item);
                }
                self.close(b']', items.is_empty());
            }
            Value::Object(map) => self.object(|m| {
                for (key, value) in map {
                    m.key(key).value(value);
                }
            }),
        }
    }

    fn number(&mut self, n: &Number) {
        if let Some(u) = n.as_u64() {
            self.out
                .extend_from_slice(itoa::Buffer::new().format(u).as_bytes());
        } else if let Some(i) = n.as_i64() {
            self.out
                .extend_from_slice(itoa::Buffer::new().format(i).as_bytes());
        } else {
            // A float: serde_json's own shortest form (ryu). Writing into a `Vec` cannot fail.
            let _ = serde_json::to_writer(&mut self.out, n);
        }
    }

    fn open(&mut self, bracket: u8) {
        self.out.push(bracket);
        self.depth += 1;
    }

    fn close(&mut self, bracket: u8, empty: bool) {
        self.depth -= 1;
        if self.pretty && !empty {
            self.newline();
        }
        self.out.push(bracket);
    }

    fn separator(&mut self, first: bool) {
        if !first {
            self.out.push(b',');
        }
        if self.pretty {
            self.newline();
        }
    }

    fn newline(&mut self) {
        self.out.push(b'\n');
        let mut left = self.depth * INDENT.len();
        while left > 0 {
            let n = left.min(SPACES.len());
            self.out.extend_from_slice(&SPACES[..n]);
            left -= n;
        }
    }

    /// `s` quoted, escaped as serde_json escapes: `"`, `\` and the control characters below
    /// 0x20 (`\b`, `\t`, `\n`, `\f`, `\r`, else `\u00XX` in lower-case hex); nothing else.
    pub fn string(&mut self, s: &str) {
        let bytes = s.as_bytes();
        self.out.reserve(bytes.len() + 2);
        self.out.push(b'"');
        let mut start = 0;
        while let Some(at) = next_escape(bytes, start) {
            self.out.extend_from_slice(&bytes[start..at]);
            escape(&mut self.out, bytes[at]);
            start = at + 1;
        }
        self.out.extend_from_slice(&bytes[start..]);
        self.out.push(b'"');
    }
}

/// Whether serde_json escapes byte `b`.
fn needs_escape(b: u8) -> bool {
    b < 0x20 || b == b'"' || b == b'\\'
}

/// The index of the first byte at or after `from` that needs escaping: sixteen bytes at a time
/// with SSE2 (part of every x86-64 CPU, so no detection), then [`next_escape_words`].
#[cfg(target_arch = "x86_64")]
fn next_escape(bytes: &[u8], from: usize) -> Option<usize> {
    use std::arch::x86_64::{
        _mm_cmpeq_epi8, _mm_loadu_si128, _mm_min_epu8, _mm_movemask_epi8, _mm_or_si128,
        _mm_set1_epi8,
    };
    let mut i = from;
    // SAFETY: SSE2 is in the x86-64 baseline; each load reads the 16 bytes `bytes[i..i + 16]`.
    unsafe {
        let quote = _mm_set1_epi8(b'"' as i8);
        let backslash = _mm_set1_epi8(b'\\' as i8);
        let control = _mm_set1_epi8(0x1f);
        while i + 16 <= bytes.len() {
            let v = _mm_loadu_si128(bytes.as_ptr().add(i).cast());
            // `min(v, 0x1f) == v`: the byte is at most 0x1f, unsigned.
            let hits = _mm_or_si128(
                _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)),
                _mm_cmpeq_epi8(_mm_min_epu8(v, control), v),
            );
            let mask = _mm_movemask_epi8(hits);
            if mask != 0 {
                return Some(i + mask.trailing_zeros() as usize);
            }
            i += 16;
        }
    }
    next_escape_words(bytes, i)
}

#[cfg(not(target_arch = "x86_64"))]
fn next_escape(bytes: &[u8], from: usize) -> Option<usize> {
    next_escape_words(bytes, from)
}

/// [`next_escape`] eight bytes at a time in a `u64`, then byte by byte.
fn next_escape_words(bytes: &[u8], from: usize) -> Option<usize> {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    // Whether a word holds a zero byte (exact as a yes or no, which is all that is asked).
    let has_zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGHS != 0;
    let mut i = from;
    while i + 8 <= bytes.len() {
        let mut word = [0u8; 8];
        word.copy_from_slice(&bytes[i..i + 8]);
        let x = u64::from_ne_bytes(word);
        // A byte below 0x20, a `"` or a `\` (each test exact for "any"; then the bytes).
        let below = x.wrapping_sub(ONES * 0x20) & !x & HIGHS != 0;
        if below
            || has_zero(x ^ (ONES * u64::from(b'"')))
            || has_zero(x ^ (ONES * u64::from(b'\\')))
        {
            break;
        }
        i += 8;
    }
    bytes[i..]
        .iter()
        .position(|&b| needs_escape(b))
        .map(|p| i + p)
}

fn escape(out: &mut Vec<u8>, b: u8) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let short = match b {
        b'"' => b'"',
        b'\\' => b'\\',
        0x08 => b'b',
        0x09 => b't',
        0x0A => b'n',
        0x0C => b'f',
        0x0D => b'r',
        _ => {
            out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 0xF)],
            ]);
            return;
        }
    };
    out.extend_from_slice(&[b'\\', short]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The whole document `v`, as this module writes it.
    fn to_vec(v: &Value, pretty: bool) -> Vec<u8> {
        let mut w = Writer::new(128, pretty);
        w.value(v);
        w.into_bytes()
    }

    fn same_as_serde_json(v: &Value) {
        assert_eq!(
            String::from_utf8(to_vec(v, false)).unwrap(),
            serde_json::to_string(v).unwrap()
        );
        assert_eq!(
            String::from_utf8(to_vec(v, true)).unwrap(),
            serde_json::to_string_pretty(v).unwrap()
        );
    }

    #[test]
    fn every_byte_escaped_as_serde_json_escapes_it() {
        for b in 0..=0x7fu8 {
            let s = String::from(b as char);
            for text in [
                s.clone(),
                format!("abcdefgh{s}"),
                format!("abcdefghijklmno{s}pq"),
                format!("{s}{s}abcdefghijklmnopqrstuvw{s}"),
            ] {
                same_as_serde_json(&Value::String(text));
            }
        }
        for text in [
            "",
            "é",
            "日本語/パス",
            "\u{7f}\u{80}\u{10ffff}",
            "a\"b\\c\u{1}d\u{1f}",
        ] {
            same_as_serde_json(&Value::String(text.into()));
            same_as_serde_json(&json!({ text: text }));
        }
        // Every byte at every place of a 40-byte run (the 16-byte and 8-byte steps and the
        // tail), with both searches.
        for b in 0..=0xffu8 {
            for at in 0..40 {
                let mut run = [b'a'; 40];
                run[at] = b;
                let want = needs_escape(b).then_some(at);
                assert_eq!(next_escape(&run, 0), want, "{b:#x} at {at}");
                assert_eq!(next_escape_words(&run, 0), want, "{b:#x} at {at}");
            }
        }
    }

    #[test]
    fn numbers_nesting_and_empties_as_serde_json_writes_them() {
        same_as_serde_json(&json!({
            "u": u64::MAX, "i": i64::MIN, "zero": 0, "neg": -1,
            "f": 1.5, "g": 1e300, "h": -0.0, "k": 1.1e-7, "big": 12345678901234567890u64,
            "empty": {}, "list": [], "nested": [[], {}, [[{}]], {"a": [1, {"b": null}]}],
            "bools": [true, false, null],
        }));
        same_as_serde_json(&json!([]));
        same_as_serde_json(&json!("x"));
        let deep = (0..40).fold(json!(1), |v, _| json!([v]));
        same_as_serde_json(&deep);
        let deeper = (0..40).fold(json!({}), |v, i| json!({ format!("k{i}"): v, "z": [] }));
        same_as_serde_json(&deeper);
    }

    /// Real documents (an engine's config.json, producers' CDI specs: every JSON file under
    /// tests/fixtures that parses), written both ways.
    #[test]
    fn real_documents_as_serde_json_writes_them() {
        fn walk(dir: &std::path::Path, seen: &mut usize) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    walk(&path, seen);
                } else if path.extension().is_some_and(|e| e == "json") {
                    let bytes = std::fs::read(&path).unwrap();
                    if let Ok(v) = serde_json::from_slice::<Value>(&bytes) {
                        same_as_serde_json(&v);
                        *seen += 1;
                    }
                }
            }
        }
        let mut seen = 0;
        walk(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"),
            &mut seen,
        );
        assert!(seen >= 3, "{seen} documents");
    }
}
