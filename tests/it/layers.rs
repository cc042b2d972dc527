//! The layering of the crate (see `src/lib.rs`): every top-level module imports only modules
//! of a lower layer, so there are no import cycles and, e.g., `params`, `collective`, `config`,
//! `checkpoint`, `data` and `ui` never reach up, and `strategy` never imports `train`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Each top-level module's layer: a module may import only modules of a lower number.
const LAYERS: &[(&str, u32)] = &[
    ("rng", 0),
    ("memory", 0),
    ("panic", 0),
    ("config", 0),
    ("ui", 0),
    ("testdir", 0),
    ("checkpoint", 0),
    ("kernels", 0),
    ("params", 1),
    ("data", 1),
    ("cuda", 2),
    ("plan", 2),
    ("model", 2),
    ("collective", 3),
    ("strategy", 4),
    ("train", 5),
    ("backend", 5),
    ("error", 6),
    ("rundir", 7),
    ("rendezvous", 7),
    ("track", 8),
    ("launch", 9),
    ("slurm", 10),
    ("tools", 10),
    ("sweep", 11),
    ("report", 12),
    ("cli", 13),
];

fn layer(module: &str) -> Option<u32> {
    LAYERS.iter().find(|(m, _)| *m == module).map(|(_, l)| *l)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level modules a source text names through `crate::`, including grouped imports
/// (`use crate::{a, b::c}`) and the crate's re-exports (`crate::Result` is `error`). `depth` is
/// how deep the file's module sits (`src/a.rs` and `src/a/mod.rs`: 1, `src/a/b.rs`: 2), so that
/// a `super::` chain that climbs to the crate root counts as `crate::`.
pub fn crate_refs(text: &str, depth: usize) -> BTreeSet<String> {
    let mut text: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    text = text.replace(" ::", "::").replace(":: ", "::");
    // `super::` repeated `depth` times reaches the root
    let root = "super::".repeat(depth);
    let text = text.replace(&root, "crate::");
    let mut out = BTreeSet::new();
    let mut rest = text.as_str();
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // top-level names of the group
            let mut depth = 0;
            let mut item = String::new();
            for ch in group.chars() {
                match ch {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.insert(head(&item));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                if depth == 0 {
                    item.push(ch);
                }
            }
            out.insert(head(&item));
        } else {
            out.insert(head(rest));
        }
    }
    out.remove("");
    out
}

fn head(s: &str) -> String {
    let name: String = s
        .trim()
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    match name.as_str() {
        // re-exported at the crate root from `error`
        "Error" | "Result" => "error".into(),
        "self" => String::new(),
        _ => name,
    }
}

#[test]
fn grouped_and_plain_imports_are_both_seen() {
    let refs = crate_refs(
        "use crate::{backend, config::{self, Config}, Result};\nlet x = crate :: params::Grads::Host;",
        2,
    );
    let want: BTreeSet<String> = ["backend", "config", "error", "params"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(refs, want);
    // `super::super::` from a depth-2 file is the crate root; `super::` alone is its module
    let refs = crate_refs("use super::super::launch::x; use super::api::Y;", 2);
    assert_eq!(refs, ["launch".to_string()].into());
    let refs = crate_refs("use super::launch;", 1);
    assert_eq!(refs, ["launch".to_string()].into());
}

#[test]
fn every_module_imports_only_lower_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut violations = Vec::new();
    let mut seen = BTreeSet::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let p = entry.unwrap().path();
        let name = p.file_stem().unwrap().to_string_lossy().into_owned();
        if name == "lib" || name == "main" {
            continue;
        }
        let Some(own) = layer(&name) else {
            violations.push(format!("src/{name}: not in LAYERS; give it a layer"));
            continue;
        };
        seen.insert(name.clone());
        let mut files = Vec::new();
        if p.is_dir() {
            rust_files(&p, &mut files);
        } else {
            files.push(p.clone());
        }
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            // src/a.rs and src/a/mod.rs are module `a` (depth 1); src/a/b.rs is `a::b` (depth 2)
            let rel = f.strip_prefix(&src).unwrap();
            let parts = rel.components().count();
            let depth = if f.file_name().is_some_and(|n| n == "mod.rs") {
                parts - 1
            } else {
                parts
            };
            for r in crate_refs(&text, depth) {
                // the temporary directories of every layer's own tests
                if r == name || r == "testdir" {
                    continue;
                }
                match layer(&r) {
                    Some(l) if l < own => {}
                    Some(l) => violations.push(format!(
                        "{}: `{name}` (layer {own}) imports `{r}` (layer {l})",
                        f.strip_prefix(&src).unwrap().display()
                    )),
                    // an item re-exported at the root or reached from an inline module
                    None => {}
                }
            }
        }
    }
    assert!(violations.is_empty(), "{}", violations.join("\n"));
    let listed: BTreeSet<String> = LAYERS.iter().map(|(m, _)| m.to_string()).collect();
    let missing: Vec<_> = listed.difference(&seen).collect();
    assert!(
        missing.is_empty(),
        "LAYERS lists missing modules: {missing:?}"
    );
}

/// The `(module, layer)` rows of a Markdown layer table (`| N | \`a\`, \`b\` ... | ... |`),
/// each line stripped of `prefix` first (`//! ` in a crate doc).
fn documented_layers(text: &str, prefix: &str) -> BTreeSet<(String, u32)> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let line = line
            .trim_start()
            .strip_prefix(prefix)
            .unwrap_or(line)
            .trim();
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let (Some(n), Some(mods)) = (cells.get(1), cells.get(2)) else {
            continue;
        };
        let Ok(n) = n.parse::<u32>() else { continue };
        for m in mods.split('`').skip(1).step_by(2) {
            out.insert((m.to_string(), n));
        }
    }
    out
}

#[test]
fn the_documented_layers_are_the_tested_ones() {
    let tested: BTreeSet<(String, u32)> = LAYERS.iter().map(|(m, l)| (m.to_string(), *l)).collect();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (file, prefix) in [("src/lib.rs", "//!"), ("docs/src/architecture.md", "")] {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        // `main` sits beside `cli`; it is not a module of the library
        let documented: BTreeSet<(String, u32)> = documented_layers(&text, prefix)
            .into_iter()
            .filter(|(m, _)| m != "main")
            .collect();
        assert_eq!(
            documented, tested,
            "{file}'s layer table differs from tests/it/layers.rs's LAYERS"
        );
    }
}

/// `text` with comments, string literals (raw ones too) and char literals blanked out, lines
/// kept: what is left of braces is the code's own.
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let keep_lines = |s: &[u8], out: &mut String| {
        for &c in s {
            if c == b'\n' {
                out.push('\n');
            }
        }
    };
    while i < b.len() {
        let rest = &b[i..];
        if rest.starts_with(b"//") {
            let end = rest.iter().position(|&c| c == b'\n').unwrap_or(rest.len());
            i += end;
        } else if rest.starts_with(b"/*") {
            let end = text[i + 2..].find("*/").map_or(rest.len(), |e| e + 4);
            keep_lines(&rest[..end], &mut out);
            i += end;
        } else if (rest.starts_with(b"r\"") || rest.starts_with(b"r#"))
            && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_'))
        {
            let hashes = rest[1..].iter().take_while(|&&c| c == b'#').count();
            if rest.get(1 + hashes) != Some(&b'"') {
                out.push(b[i] as char);
                i += 1;
                continue;
            }
            let close = format!("\"{}", "#".repeat(hashes));
            let start = i + 2 + hashes;
            let end = text[start..]
                .find(&close)
                .map_or(b.len(), |e| start + e + close.len());
            keep_lines(&b[i..end], &mut out);
            out.push_str("\"\"");
            i = end;
        } else if rest[0] == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            keep_lines(&b[i..j.min(b.len())], &mut out);
            out.push_str("\"\"");
            i = j + 1;
        } else if rest[0] == b'\'' {
            // a char literal ('x', '\n', '\u{..}'), not a lifetime ('a)
            let end = if rest.get(1) == Some(&b'\\') {
                rest[2..].iter().position(|&c| c == b'\'').map(|p| p + 3)
            } else if rest.get(2) == Some(&b'\'') {
                Some(3)
            } else {
                None
            };
            match end {
                Some(e) => {
                    out.push_str("' '");
                    i += e;
                }
                None => {
                    out.push('\'');
                    i += 1;
                }
            }
        } else {
            // multi-byte UTF-8 stays whole
            let ch = text[i..].chars().next().unwrap();
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

/// Every function with a body in `code` (as `code_only` leaves it): its name, first line and
/// length in lines.
fn functions(code: &str) -> Vec<(String, usize, usize)> {
    let b = code.as_bytes();
    let line_of = |pos: usize| code[..pos].matches('\n').count() + 1;
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(p) = code[from..].find("fn ") {
        let at = from + p;
        from = at + 3;
        if at > 0 && (b[at - 1].is_ascii_alphanumeric() || b[at - 1] == b'_') {
            continue;
        }
        let name: String = code[at + 3..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() {
            continue;
        }
        // the body's `{`, unless a `;` ends the declaration first (brackets of the signature
        // skipped)
        let (mut depth, mut k) = (0i32, at + 3);
        let open = loop {
            match b.get(k) {
                None => break None,
                Some(b'(' | b'[') => depth += 1,
                Some(b')' | b']') => depth -= 1,
                Some(b';') if depth == 0 => break None,
                Some(b'{') if depth == 0 => break Some(k),
                _ => {}
            }
            k += 1;
        };
        let Some(open) = open else { continue };
        let mut depth = 0;
        let mut end = open;
        for (j, &c) in b[open..].iter().enumerate() {
            match c {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + j;
                        break;
                    }
                }
                _ => {}
            }
        }
        let first = line_of(at);
        out.push((name, first, line_of(end) - first + 1));
    }
    out
}

#[test]
fn the_function_scanner_sees_bodies_not_braces_in_strings() {
    let text = "fn a() {\n    let s = \"{ not a brace\";\n    let c = '{';\n    // }\n}\nfn b<'x>(v: &'x str) -> [u8; 2] where X: Y {\n    [1, 2]\n}\ntrait T { fn c(&self); }\n";
    let found = functions(&code_only(text));
    let want: Vec<(String, usize, usize)> = vec![("a".into(), 1, 5), ("b".into(), 6, 3)];
    assert_eq!(found, want);
}

/// No function in `src/` is longer than 120 lines (a long function is one a newcomer cannot
/// change safely; split it into named steps).
#[test]
fn no_function_in_src_is_longer_than_120_lines() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut long = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for (name, line, len) in functions(&code_only(&text)) {
            if len > 120 {
                let rel = f.strip_prefix(&src).unwrap().display().to_string();
                long.push(format!("src/{rel}:{line} fn {name}: {len} lines"));
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions over 120 lines:\n{}",
        long.join("\n")
    );
}

/// No source file in `src/` is longer than 900 lines (tests included): a longer one holds more
/// than one concern; give each its own file.
#[test]
fn no_file_in_src_is_longer_than_900_lines() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let n = std::fs::read_to_string(f).unwrap().lines().count();
            let rel = f.strip_prefix(&src).unwrap().display().to_string();
            (n > 900).then(|| format!("src/{rel}: {n} lines"))
        })
        .collect();
    long.sort();
    assert!(
        long.is_empty(),
        "files over 900 lines:\n{}",
        long.join("\n")
    );
}
