//! TOML editing helpers shared by the containerd and CRI-O writers: `toml_edit` keeps comments,
//! key order and formatting of everything nvshim does not touch.

use std::path::Path;

use toml_edit::{DocumentMut, InlineTable, Item, Table, TableLike, Value};

use super::EngineError;

/// Parses `text` (a missing file is an empty document).
pub fn parse(path: &Path, text: Option<&str>) -> Result<DocumentMut, EngineError> {
    text.unwrap_or("")
        .parse::<DocumentMut>()
        .map_err(|e| EngineError::Parse {
            path: path.to_path_buf(),
            message: e.to_string().trim_end().to_string(),
        })
}

/// Checks that what nvshim produced parses again (it always should: this guards against a
/// toml_edit layout that would make the engine refuse to start).
pub fn reparse(path: &Path, text: &str) -> Result<(), EngineError> {
    text.parse::<DocumentMut>()
        .map(|_| ())
        .map_err(|e| EngineError::Produced {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
}

/// `a.b."c.d"` for messages.
pub fn dotted(keys: &[&str]) -> String {
    keys.iter()
        .map(|k| {
            if !k.is_empty()
                && k.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                k.to_string()
            } else {
                format!("{k:?}")
            }
        })
        .collect::<Vec<_>>()
        .join(".")
}

fn kind(item: &Item) -> &'static str {
    match item {
        Item::None => "missing",
        Item::Value(Value::String(_)) => "a string",
        Item::Value(Value::Integer(_)) => "an integer",
        Item::Value(Value::Float(_)) => "a float",
        Item::Value(Value::Boolean(_)) => "a boolean",
        Item::Value(Value::Datetime(_)) => "a datetime",
        Item::Value(Value::Array(_)) => "an array",
        Item::Value(Value::InlineTable(_)) | Item::Table(_) => "a table",
        Item::ArrayOfTables(_) => "an array of tables",
    }
}

pub fn shape_error(path: &Path, keys: &[&str], expected: &'static str, item: &Item) -> EngineError {
    EngineError::Shape {
        path: path.to_path_buf(),
        key: dotted(keys),
        expected,
        found: kind(item).to_string(),
    }
}

/// The table at `keys` below `root`, if every step exists and is a table; an error if a step
/// exists but is something else.
pub fn get<'a>(
    path: &Path,
    root: &'a Item,
    keys: &[&str],
) -> Result<Option<&'a dyn TableLike>, EngineError> {
    let mut cur = root;
    for (i, k) in keys.iter().enumerate() {
        let Some(t) = cur.as_table_like() else {
            return Err(shape_error(path, &keys[..i], "a table", cur));
        };
        match t.get(k) {
            None => return Ok(None),
            Some(next) => cur = next,
        }
    }
    match cur.as_table_like() {
        Some(t) => Ok(Some(t)),
        None => Err(shape_error(path, keys, "a table", cur)),
    }
}

/// The table at `keys` below `root`, created (as implicit headers, or inline tables inside an
/// inline table) where missing.
pub fn ensure<'a>(
    path: &Path,
    root: &'a mut Item,
    keys: &[&str],
) -> Result<&'a mut Item, EngineError> {
    let mut cur = root;
    for (i, k) in keys.iter().enumerate() {
        let inline = matches!(cur, Item::Value(Value::InlineTable(_)));
        if !cur.is_table_like() {
            return Err(shape_error(path, &keys[..i], "a table", cur));
        }
        let Some(t) = cur.as_table_like_mut() else {
            return Err(shape_error(path, &keys[..i], "a table", &Item::None));
        };
        if t.get(k).is_none() {
            let new = if inline {
                Item::Value(Value::InlineTable(InlineTable::new()))
            } else {
                let mut t = Table::new();
                // Intermediate tables print no header of their own.
                t.set_implicit(true);
                Item::Table(t)
            };
            t.insert(k, new);
        }
        match t.get_mut(k) {
            Some(next) if next.is_table_like() => cur = next,
            Some(next) => return Err(shape_error(path, &keys[..=i], "a table", next)),
            None => return Err(shape_error(path, &keys[..=i], "a table", &Item::None)),
        }
    }
    Ok(cur)
}

/// Sets `key = value` in the table `item` unless it already holds exactly that value, so an
/// unchanged file keeps its formatting byte for byte.
pub fn set(item: &mut Item, key: &str, value: Value) {
    let Some(t) = item.as_table_like_mut() else {
        return;
    };
    if let Some(Item::Value(old)) = t.get(key) {
        if values_equal(old, &value) {
            return;
        }
    }
    match t.get_mut(key) {
        // Keep the key's place and the comment after the value.
        Some(Item::Value(old)) => {
            let decor = old.decor().clone();
            *old = value;
            *old.decor_mut() = decor;
        }
        _ => {
            t.insert(key, Item::Value(value));
        }
    }
}

/// Adds `s` to the string array `key` (creating it) unless it is there.
pub fn add_to_array(
    path: &Path,
    keys: &[&str],
    item: &mut Item,
    key: &str,
    s: &str,
) -> Result<(), EngineError> {
    let Some(t) = item.as_table_like_mut() else {
        return Ok(());
    };
    match t.get_mut(key) {
        None => {
            let mut a = toml_edit::Array::new();
            a.push(s);
            t.insert(key, Item::Value(Value::Array(a)));
        }
        Some(Item::Value(Value::Array(a))) => {
            if !a.iter().any(|v| v.as_str() == Some(s)) {
                a.push(s);
            }
        }
        Some(other) => {
            let mut full = keys.to_vec();
            full.push(key);
            return Err(shape_error(path, &full, "an array", other));
        }
    }
    Ok(())
}

/// Values compared by content, ignoring formatting.
pub fn values_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::String(x), Value::String(y)) => x.value() == y.value(),
        (Value::Integer(x), Value::Integer(y)) => x.value() == y.value(),
        (Value::Boolean(x), Value::Boolean(y)) => x.value() == y.value(),
        (Value::Float(x), Value::Float(y)) => x.value() == y.value(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y.iter()).all(|(p, q)| values_equal(p, q))
        }
        (Value::InlineTable(x), Value::InlineTable(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| values_equal(v, w)))
        }
        (Value::Datetime(x), Value::Datetime(y)) => x.value() == y.value(),
        _ => false,
    }
}

/// A copy of a table's keys and values without its layout: no header comments, no document
/// positions (so the copy prints right after the table it is inserted next to), inline where
/// the destination is inline.
pub fn fresh_copy(src: &dyn TableLike, inline: bool) -> Item {
    if inline {
        let mut t = InlineTable::new();
        for (k, v) in src.iter() {
            if let Some(v) = copy_value(v) {
                t.insert(k, v);
            }
        }
        return Item::Value(Value::InlineTable(t));
    }
    let mut t = Table::new();
    for (k, v) in src.iter() {
        match v {
            Item::Table(sub) => {
                t.insert(k, fresh_copy(sub, false));
            }
            Item::Value(Value::InlineTable(sub)) => {
                t.insert(k, fresh_copy(sub, true));
            }
            Item::Value(v) => {
                let mut v = v.clone();
                v.decor_mut().clear();
                t.insert(k, Item::Value(v));
            }
            Item::ArrayOfTables(a) => {
                t.insert(k, Item::ArrayOfTables(a.clone()));
            }
            Item::None => {}
        }
    }
    Item::Table(t)
}

fn copy_value(item: &Item) -> Option<Value> {
    match item {
        Item::Value(v) => {
            let mut v = v.clone();
            v.decor_mut().clear();
            Some(v)
        }
        Item::Table(t) => match fresh_copy(t, true) {
            Item::Value(v) => Some(v),
            _ => None,
        },
        _ => None,
    }
}

/// Removes `key` from the table at `keys`, then every table on the way up that this leaves
/// empty and that carries no comment, so configure + unconfigure gives the original text back.
pub fn remove_and_prune(root: &mut Item, keys: &[&str], key: &str) -> bool {
    fn walk(cur: &mut Item, keys: &[&str], key: &str) -> bool {
        let Some(t) = cur.as_table_like_mut() else {
            return false;
        };
        match keys.split_first() {
            None => t.remove(key).is_some(),
            Some((first, rest)) => {
                let Some(child) = t.get_mut(first) else {
                    return false;
                };
                let removed = walk(child, rest, key);
                if removed && is_prunable(child) {
                    t.remove(first);
                }
                removed
            }
        }
    }
    walk(root, keys, key)
}

fn is_prunable(item: &Item) -> bool {
    match item {
        Item::Table(t) => {
            t.is_empty()
                && t.decor()
                    .prefix()
                    .and_then(|p| p.as_str())
                    .is_none_or(|p| !p.contains('#'))
        }
        Item::Value(Value::InlineTable(t)) => t.is_empty(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ensure_creates_implicit_tables() {
        let mut doc = parse(Path::new("x"), Some("version = 2\n")).unwrap();
        let t = ensure(Path::new("x"), doc.as_item_mut(), &["a", "b.c", "d"]).unwrap();
        set(t, "k", "v".into());
        assert_eq!(doc.to_string(), "version = 2\n\n[a.\"b.c\".d]\nk = \"v\"\n");
    }

    #[test]
    fn ensure_reports_wrong_shapes() {
        let mut doc = parse(Path::new("/c.toml"), Some("[a]\nb = 1\n")).unwrap();
        let err = ensure(Path::new("/c.toml"), doc.as_item_mut(), &["a", "b", "c"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("/c.toml: a.b is an integer, expected a table"),
            "{err}"
        );
    }

    #[test]
    fn ensure_inside_inline_tables() {
        let mut doc = parse(Path::new("x"), Some("a = { b = { c = 1 } }\n")).unwrap();
        let t = ensure(Path::new("x"), doc.as_item_mut(), &["a", "b", "d"]).unwrap();
        set(t, "k", true.into());
        assert_eq!(
            doc.to_string(),
            "a = { b = { c = 1 , d = { k = true } } }\n"
        );
        reparse(Path::new("x"), &doc.to_string()).unwrap();
    }

    #[test]
    fn set_keeps_identical_values_untouched() {
        let text = "[t]\nk   =   \"v\"   # why\n";
        let mut doc = parse(Path::new("x"), Some(text)).unwrap();
        set(&mut doc["t"], "k", "v".into());
        assert_eq!(doc.to_string(), text);
        set(&mut doc["t"], "k", "w".into());
        assert_eq!(doc.to_string(), "[t]\nk   =   \"w\"   # why\n");
    }

    #[test]
    fn prune_restores_text() {
        let text = "a = 1\n";
        let mut doc = parse(Path::new("x"), Some(text)).unwrap();
        let t = ensure(Path::new("x"), doc.as_item_mut(), &["p", "q"]).unwrap();
        set(t, "k", 1.into());
        assert!(remove_and_prune(doc.as_item_mut(), &["p", "q"], "k"));
        assert_eq!(doc.to_string(), text);
    }
}
