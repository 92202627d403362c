//! config.json parsed faithfully: the document nvshim edits and writes back must be the one runc
//! would read. JSON allows a key twice in an object; serde_json's `Value` keeps the last, while
//! runc (Go's `encoding/json`) merges both into the spec struct field by field. A config.json
//! with `"linux"` twice, the second without namespaces, was read by nvshim as "no namespaces",
//! written back that way, and run by runc in the host's pid, net and mount namespaces. So a
//! duplicate key anywhere is refused, naming the key and where it is.
//!
//! The check is part of the one parse (a `DeserializeSeed` that builds the same `Value`
//! serde_json would, with a key set per object): no second pass over the document. Numbers go
//! through serde_json's own `Number` conversions, so the workspace's `float_roundtrip` keeps
//! them exact.

use std::collections::HashSet;
use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// Parses `bytes` as JSON, refusing a key that appears twice in one object. The error names the
/// key and its JSON pointer (`duplicate key "linux" in the object at /`), with serde_json's
/// line and column.
pub fn parse_unique(bytes: &[u8]) -> Result<Value, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = Node { pointer: "" }.deserialize(&mut de)?;
    de.end()?;
    Ok(value)
}

/// A value at `pointer` (JSON pointer of its parent object or array, plus its own key).
struct Node<'p> {
    pointer: &'p str,
}

/// RFC 6901 escaping of one reference token.
fn token(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

impl<'de> DeserializeSeed<'de> for Node<'_> {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Node<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        loop {
            let pointer = format!("{}/{}", self.pointer, out.len());
            match seq.next_element_seed(Node { pointer: &pointer })? {
                Some(v) => out.push(v),
                None => return Ok(Value::Array(out)),
            }
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        let mut seen: HashSet<String> = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.clone()) {
                let at = if self.pointer.is_empty() {
                    "/"
                } else {
                    self.pointer
                };
                return Err(de::Error::custom(format_args!(
                    "duplicate key {key:?} in the object at {at} (runc would merge both; remove one)"
                )));
            }
            let pointer = format!("{}/{}", self.pointer, token(&key));
            let value = map.next_value_seed(Node { pointer: &pointer })?;
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_value_as_serde_json() {
        for text in [
            r#"{"a":1,"b":[1,2.5,-3,{"c":null}],"d":"x\u00e9","e":true,"f":{}}"#,
            r#"[18446744073709551615, 18446744073709551616, 1.5e300, -0.0, 0.1]"#,
            r#"{"z":1,"a":2,"m":{"y":1,"b":2}}"#,
        ] {
            let want: Value = serde_json::from_str(text).unwrap();
            let have = parse_unique(text.as_bytes()).unwrap();
            assert_eq!(have, want, "{text}");
            // Key order kept (preserve_order).
            assert_eq!(
                serde_json::to_string(&have).unwrap(),
                serde_json::to_string(&want).unwrap()
            );
        }
    }

    #[test]
    fn duplicate_keys_are_named_with_their_place() {
        let cases = [
            (
                r#"{"linux":{},"linux":{}}"#,
                r#"duplicate key "linux" in the object at /"#,
            ),
            (
                r#"{"linux":{"namespaces":[],"namespaces":[]}}"#,
                r#"duplicate key "namespaces" in the object at /linux"#,
            ),
            (
                r#"{"mounts":[{"destination":"/a"},{"type":"x","type":"y"}]}"#,
                r#"duplicate key "type" in the object at /mounts/1"#,
            ),
            (
                r#"{"annotations":{"a/b":{"k":1,"k":2}}}"#,
                r#"duplicate key "k" in the object at /annotations/a~1b"#,
            ),
        ];
        for (text, want) in cases {
            let err = parse_unique(text.as_bytes()).unwrap_err().to_string();
            assert!(err.contains(want), "{text}: {err}");
        }
        // Keys that differ only in case are distinct JSON keys (runc's struct fields would
        // fold them, but the document keeps both and nvshim edits neither by that name).
        assert!(parse_unique(br#"{"Linux":{},"linux":{}}"#).is_ok());
    }

    #[test]
    fn trailing_garbage_and_broken_json_are_errors() {
        assert!(parse_unique(br#"{"a":1} x"#).is_err());
        assert!(parse_unique(br#"{"a":"#).is_err());
        assert!(parse_unique(br#"{"a":"\ud800"}"#).is_err());
    }
}
