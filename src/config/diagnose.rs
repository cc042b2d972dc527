//! figment's and TOML's errors in kiln's words: the key, where its value came from, what type
//! or choice it must be (TOML's words, not serde's or Rust's), and for a typo the closest key.

use figment::Figment;

use super::error::{closest, ConfigError, KeyError, KeyErrorKind};
use super::provenance::describe_source;
use super::Config;

/// Extracts the typed config, turning the first figment error into a [`KeyError`].
pub fn extract(figment: &Figment) -> Result<Config, ConfigError> {
    figment
        .extract::<Config>()
        .map_err(|e| ConfigError::Key(key_error(figment, e)))
}

pub(super) fn key_error(figment: &Figment, e: figment::Error) -> KeyError {
    use figment::error::Kind;
    let e = e
        .into_iter()
        .next()
        .unwrap_or_else(|| figment::Error::from("unknown error".to_string()));
    let path = e.path.join(".");
    let mut ke = match &e.kind {
        Kind::UnknownField(field, expected) => {
            // figment's path may or may not already end with the unknown field.
            let mut parts = e.path.clone();
            if parts.last() == Some(field) {
                parts.pop();
            }
            let parent = parts.join(".");
            let key = if parent.is_empty() {
                field.clone()
            } else {
                format!("{parent}.{field}")
            };
            let prefix = if parent.is_empty() {
                String::new()
            } else {
                format!("{parent}.")
            };
            let path = parent;
            let help = match (
                super::elsewhere::known_elsewhere(field),
                closest(field, expected),
            ) {
                (Some((ours, how)), _) => format!("kiln's key is `{ours}`{how}"),
                (None, Some(c)) => format!("did you mean `{prefix}{c}`?"),
                (None, None) if path.is_empty() => {
                    format!("valid sections: {}", expected.join(", "))
                }
                (None, None) => format!("valid keys in [{path}]: {}", expected.join(", ")),
            };
            KeyError {
                kind: KeyErrorKind::Other,
                key: String::new(),
                message: format!("unknown key `{key}`"),
                source: describe_source(figment, &key),
                help: Some(help),
            }
        }
        Kind::UnknownVariant(value, expected) => {
            // "ReLU" means relu: the case is the likeliest slip
            let lower = value.to_ascii_lowercase();
            let help = match closest(&lower, expected).or_else(|| closest(value, expected)) {
                Some(c) => format!("did you mean \"{c}\"? allowed: {}", expected.join(", ")),
                None => format!("allowed: {}", expected.join(", ")),
            };
            KeyError {
                kind: KeyErrorKind::Other,
                key: String::new(),
                message: format!("`{path}` = \"{value}\" is not a known choice"),
                source: describe_source(figment, &path),
                help: Some(help),
            }
        }
        Kind::InvalidType(actual, expected) => KeyError {
            kind: KeyErrorKind::Other,
            key: String::new(),
            message: format!(
                "`{path}` has the wrong type: found {}, expected {}",
                toml_words(&actual.to_string()),
                toml_words(expected)
            ),
            source: describe_source(figment, &path),
            help: None,
        },
        Kind::InvalidValue(actual, expected) => KeyError {
            kind: KeyErrorKind::Other,
            key: String::new(),
            message: format!(
                "`{path}` has an invalid value: found {}, expected {}",
                toml_words(&actual.to_string()),
                toml_words(expected)
            ),
            source: describe_source(figment, &path),
            help: None,
        },
        Kind::InvalidLength(n, expected) => KeyError {
            kind: KeyErrorKind::Other,
            key: String::new(),
            message: format!("`{path}` has {n} items, expected {expected}"),
            source: describe_source(figment, &path),
            help: None,
        },
        other => KeyError {
            kind: KeyErrorKind::Other,
            key: String::new(),
            message: format!("`{path}`: {other}"),
            source: describe_source(figment, &path),
            help: None,
        },
    };
    ke.key = match &e.kind {
        Kind::UnknownField(field, _) if e.path.last() != Some(field) && !path.is_empty() => {
            format!("{path}.{field}")
        }
        Kind::UnknownField(field, _) if path.is_empty() => field.clone(),
        _ => path,
    };
    ke
}

pub(super) fn parse_message(text: &str, e: &toml::de::Error) -> String {
    let line = e
        .span()
        .map(|s| text[..s.start.min(text.len())].lines().count().max(1));
    let msg = e.message().trim().to_string();
    match line {
        Some(l) => format!("line {l}: {msg}"),
        None => msg,
    }
}

/// serde's and Rust's type words in TOML's: `usize` is "a non-negative integer", a "signed
/// int" an "integer", and so on.
fn toml_words(s: &str) -> String {
    let words = [
        ("unsigned int", "integer"),
        ("signed int", "integer"),
        ("a map", "a table"),
        ("map", "table"),
        ("a sequence", "an array"),
        ("sequence", "array"),
        ("a boolean", "a boolean (true or false)"),
    ];
    let mut out = s.to_string();
    for (from, to) in words {
        if out.contains(from) {
            out = out.replacen(from, to, 1);
            break;
        }
    }
    match out.as_str() {
        "usize" | "u64" | "u32" => "a non-negative integer".into(),
        "u16" => "an integer from 0 to 65535".into(),
        "u8" => "an integer from 0 to 255".into(),
        "isize" | "i64" | "i32" | "i16" | "i8" => "an integer".into(),
        "f64" | "f32" => "a number".into(),
        "a string" | "string" => "a string".into(),
        _ => out,
    }
}
