//! Where a value came from: the file and line, variable or flag that set a key, as every
//! error and `kiln check` name it.

use std::path::Path;

use figment::Figment;

use super::load::DEFAULT_SOURCE;

/// Where the value at dotted `key` came from: "file:line", "environment variable X",
/// "--set k=v", "flag --nnodes" or "default".
pub fn describe_source(figment: &Figment, key: &str) -> String {
    let Some(meta) = figment.find_metadata(key) else {
        return DEFAULT_SOURCE.to_string();
    };
    // (a `--set` of a URL with a password names it without the password)
    let name = super::redact(&meta.name);
    match meta.source.as_ref().and_then(|s| s.file_path()) {
        Some(path) => match find_line(path, key) {
            Some(line) => format!("{name}:{line}"),
            None => name,
        },
        None => name,
    }
}

/// The 1-based line of dotted `key` in a TOML file, by following table headers.
pub fn find_line(path: &Path, key: &str) -> Option<usize> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut table = String::new();
    let mut header_line = None;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if let Some(h) = line.strip_prefix('[') {
            table = h.trim_end_matches(']').trim().replace(['"', ' '], "");
            if table == key {
                header_line = Some(i + 1);
            }
            continue;
        }
        if let Some((k, _)) = line.split_once('=') {
            let k = k.trim().replace(['"', ' '], "");
            let full = if table.is_empty() {
                k
            } else {
                format!("{table}.{k}")
            };
            if full == key {
                return Some(i + 1);
            }
        }
    }
    header_line
}
