//! CDI names: `vendor/class` kinds, device names and fully qualified `vendor/class=name`.
//!
//! The grammar and the error texts are the reference library's (`pkg/parser/parser.go`,
//! docs/cdi-rules.md §2.4 and §3.1), not SPEC.md's prose, which differs (no `:` in device
//! names, DNS rules on the vendor): specs in the field are written against the library.
//! Character classes are ASCII; anything else is an invalid character.

use std::fmt;

use thiserror::Error;

/// Why a vendor, class or device name is invalid. The texts are the reference's, including its
/// "invalid class" for a device name that starts badly.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NameError {
    #[error("invalid {what}. empty name")]
    Empty { what: &'static str },
    #[error("invalid {what}. {name:?}, should start with letter")]
    BadStart { what: &'static str, name: String },
    #[error("invalid {what}. invalid character {ch:?} in name {name:?}")]
    BadChar {
        what: &'static str,
        ch: char,
        name: String,
    },
    #[error("invalid {what}. {name:?}, should end with a letter or digit")]
    BadEnd { what: &'static str, name: String },
    #[error("invalid (empty) device name")]
    EmptyDevice,
    #[error("invalid class {0:?}, should start with a letter or digit")]
    DeviceBadStart(String),
    #[error("invalid character {ch:?} in device name {name:?}")]
    DeviceBadChar { ch: char, name: String },
    #[error("invalid name {0:?}, should end with a letter or digit")]
    DeviceBadEnd(String),
}

/// Why a string is not a valid fully qualified device name.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum QualifiedNameError {
    #[error("unqualified device {0:?}, missing vendor")]
    MissingVendor(String),
    #[error("unqualified device {0:?}, missing class")]
    MissingClass(String),
    #[error("unqualified device {0:?}, missing device name")]
    MissingName(String),
    #[error("invalid device {device:?}: {source}")]
    Invalid { device: String, source: NameError },
}

/// A valid `vendor/class=name`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QualifiedName {
    pub vendor: String,
    pub class: String,
    pub name: String,
}

impl QualifiedName {
    /// `vendor/class`.
    pub fn kind(&self) -> String {
        format!("{}/{}", self.vendor, self.class)
    }
}

impl fmt::Display for QualifiedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}={}", self.vendor, self.class, self.name)
    }
}

fn is_letter(b: u8) -> bool {
    b.is_ascii_alphabetic()
}

fn is_alnum(b: u8) -> bool {
    b.is_ascii_alphanumeric()
}

/// The characters strictly between the first and the last byte, as Go's `range` over
/// `name[1:len-1]` sees them (a split multi-byte sequence reads as U+FFFD, which is invalid).
fn middle(name: &str) -> Vec<char> {
    let bytes = name.as_bytes();
    if bytes.len() <= 2 {
        return Vec::new();
    }
    String::from_utf8_lossy(&bytes[1..bytes.len() - 1])
        .chars()
        .collect()
}

fn validate_vendor_or_class(what: &'static str, name: &str) -> Result<(), NameError> {
    let bytes = name.as_bytes();
    let (Some(&first), Some(&last)) = (bytes.first(), bytes.last()) else {
        return Err(NameError::Empty { what });
    };
    if !is_letter(first) {
        return Err(NameError::BadStart {
            what,
            name: name.into(),
        });
    }
    for ch in middle(name) {
        if !(ch.is_ascii_alphanumeric() || matches!(ch, '_' | '-' | '.')) {
            return Err(NameError::BadChar {
                what,
                ch,
                name: name.into(),
            });
        }
    }
    if !is_alnum(last) {
        return Err(NameError::BadEnd {
            what,
            name: name.into(),
        });
    }
    Ok(())
}

/// `^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$`.
pub fn validate_vendor_name(vendor: &str) -> Result<(), NameError> {
    validate_vendor_or_class("vendor", vendor)
}

/// Same rule as the vendor.
pub fn validate_class_name(class: &str) -> Result<(), NameError> {
    validate_vendor_or_class("class", class)
}

/// `^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$` (`:` for MIG names such as `0:1`).
pub fn validate_device_name(name: &str) -> Result<(), NameError> {
    let bytes = name.as_bytes();
    let (Some(&first), Some(&last)) = (bytes.first(), bytes.last()) else {
        return Err(NameError::EmptyDevice);
    };
    if !is_alnum(first) {
        return Err(NameError::DeviceBadStart(name.into()));
    }
    if bytes.len() == 1 {
        return Ok(());
    }
    for ch in middle(name) {
        if !(ch.is_ascii_alphanumeric() || matches!(ch, '_' | '-' | '.' | ':')) {
            return Err(NameError::DeviceBadChar {
                ch,
                name: name.into(),
            });
        }
    }
    if !is_alnum(last) {
        return Err(NameError::DeviceBadEnd(name.into()));
    }
    Ok(())
}

/// Splits a kind at its first `/` (`ParseQualifier`); `("", "")` when either side is empty.
pub fn parse_qualifier(kind: &str) -> (&str, &str) {
    match kind.split_once('/') {
        Some((v, c)) if !v.is_empty() && !c.is_empty() => (v, c),
        _ => ("", ""),
    }
}

/// Splits a device string into vendor, class and name without validating (`ParseDevice`).
/// Anything not shaped `vendor/class=name` (including paths such as `/dev/null`) comes back as
/// `("", "", s)`.
pub fn parse_device(s: &str) -> (&str, &str, &str) {
    if s.is_empty() || s.starts_with('/') {
        return ("", "", s);
    }
    let Some((qualifier, name)) = s.split_once('=') else {
        return ("", "", s);
    };
    if qualifier.is_empty() || name.is_empty() {
        return ("", "", s);
    }
    let (vendor, class) = parse_qualifier(qualifier);
    if vendor.is_empty() {
        return ("", "", s);
    }
    (vendor, class, name)
}

/// True when `s` is shaped `vendor/class=name`, valid or not: the caller meant a CDI name.
pub fn looks_qualified(s: &str) -> bool {
    !parse_device(s).0.is_empty()
}

/// Parses and validates a fully qualified name (`ParseQualifiedName`).
pub fn parse_qualified_name(s: &str) -> Result<QualifiedName, QualifiedNameError> {
    let (vendor, class, name) = parse_device(s);
    if vendor.is_empty() {
        return Err(QualifiedNameError::MissingVendor(s.into()));
    }
    if class.is_empty() {
        return Err(QualifiedNameError::MissingClass(s.into()));
    }
    if name.is_empty() {
        return Err(QualifiedNameError::MissingName(s.into()));
    }
    let invalid = |source| QualifiedNameError::Invalid {
        device: s.into(),
        source,
    };
    validate_vendor_name(vendor).map_err(invalid)?;
    validate_class_name(class).map_err(invalid)?;
    validate_device_name(name).map_err(invalid)?;
    Ok(QualifiedName {
        vendor: vendor.into(),
        class: class.into(),
        name: name.into(),
    })
}

/// `IsQualifiedName`.
pub fn is_qualified(s: &str) -> bool {
    parse_qualified_name(s).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qualified_names_from_the_reference_parser_tests() {
        // pkg/parser/parser_test.go, the valid ones.
        for s in [
            "vendor.com/class=dev",
            "a/b=c",
            "aa/b=cc",
            "a/bb=cc",
            "vendor.com/class=0",
            "vendor1.com/class.subclass=dev1",
            "other-vendor1.com/class_1=dev_1",
            "yet_another-vendor2.com/c-lass_2=dev_1:2.3",
            "nvidia.com/gpu=0:1",
            "nvidia.com/gpu=MIG-a4f8c2d1-e5f6-7a8b-9c0d-1e2f3a4b5c6d",
        ] {
            let q = parse_qualified_name(s).unwrap_or_else(|e| panic!("{s}: {e}"));
            assert_eq!(q.to_string(), s);
        }
        // Parsable but invalid.
        for s in [
            "_invalid.com/class=dev",
            "invalid2.com-/class=dev",
            "vendor.com/_class=dev",
            "vendor.com/class_=dev",
            "vendor.com/class=-dev",
            "vendor.com/class=dev:",
            "*.com/*dev=*gpu*",
        ] {
            assert!(
                matches!(
                    parse_qualified_name(s),
                    Err(QualifiedNameError::Invalid { .. })
                ),
                "{s}"
            );
            assert!(looks_qualified(s), "{s}");
        }
    }

    #[test]
    fn unqualified_forms() {
        assert_eq!(parse_device("/dev/null"), ("", "", "/dev/null"));
        assert_eq!(parse_device("0"), ("", "", "0"));
        assert_eq!(parse_device("vendor.com=dev"), ("", "", "vendor.com=dev"));
        assert_eq!(parse_device("a/b=c=d"), ("a", "b", "c=d"));
        assert_eq!(
            parse_qualified_name("0").unwrap_err().to_string(),
            "unqualified device \"0\", missing vendor"
        );
        assert_eq!(
            parse_qualified_name("a/b=c=d").unwrap_err().to_string(),
            "invalid device \"a/b=c=d\": invalid character '=' in device name \"c=d\""
        );
        assert_eq!(
            parse_qualified_name("vendor.com/class/x=n")
                .unwrap_err()
                .to_string(),
            "invalid device \"vendor.com/class/x=n\": invalid class. invalid character '/' in name \"class/x\""
        );
        assert!(!looks_qualified("GPU-abc"));
    }

    #[test]
    fn vendor_and_class_messages() {
        assert_eq!(
            validate_vendor_name("").unwrap_err().to_string(),
            "invalid vendor. empty name"
        );
        assert_eq!(
            validate_vendor_name("1abc").unwrap_err().to_string(),
            "invalid vendor. \"1abc\", should start with letter"
        );
        assert_eq!(
            validate_vendor_name("vendor.com-").unwrap_err().to_string(),
            "invalid vendor. \"vendor.com-\", should end with a letter or digit"
        );
        assert_eq!(
            validate_class_name("device=").unwrap_err().to_string(),
            "invalid class. \"device=\", should end with a letter or digit"
        );
        assert_eq!(
            validate_class_name("foo/").unwrap_err().to_string(),
            "invalid class. \"foo/\", should end with a letter or digit"
        );
        // A single letter is valid (it panicked before e1a6596).
        assert!(validate_vendor_name("a").is_ok());
        assert!(validate_class_name("b").is_ok());
        assert!(validate_vendor_name("Vendor_X.com").is_ok());
        // Non-ASCII is an invalid character.
        assert!(validate_class_name("gpü").is_err());
    }

    #[test]
    fn device_name_messages() {
        assert_eq!(
            validate_device_name("").unwrap_err().to_string(),
            "invalid (empty) device name"
        );
        assert_eq!(
            validate_device_name("-a").unwrap_err().to_string(),
            "invalid class \"-a\", should start with a letter or digit"
        );
        assert_eq!(
            validate_device_name("a dev ice").unwrap_err().to_string(),
            "invalid character ' ' in device name \"a dev ice\""
        );
        assert_eq!(
            validate_device_name("dev:").unwrap_err().to_string(),
            "invalid name \"dev:\", should end with a letter or digit"
        );
        assert!(validate_device_name("0").is_ok());
        assert!(validate_device_name("0:1").is_ok());
        assert!(validate_device_name("ab").is_ok());
        assert!(validate_device_name("aé").is_err());
    }
}
