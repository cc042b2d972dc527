//! The configuration reference, `docs/src/configuration.md`, generated from the schema's doc
//! comments, as ripgrep builds its man page from its flag definitions: each section struct's
//! `///` and each field's `///` (its meaning, then `Default: ...`) become a table. A test
//! fails when the page in the repository and the one the schema gives differ, and when the
//! page and the keys the config accepts differ (a key with no row, a row naming no key), and
//! when a doc comment's default is one literal that `Config::default()` does not have;
//! `KILN_BLESS=1 cargo test --release --lib reference` writes the page again.
//!
//! The doc comments are read from the source (`src/config/*.rs` and the built-in families'
//! `keys.rs`) by a small line reader: the schema is `rustfmt`ed, one field per line.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use figment::providers::{Format, Serialized, Toml};
use figment::Figment;

use super::{Config, ModelConfig};

/// The page, relative to the crate.
pub(crate) const PAGE: &str = "docs/src/configuration.md";

/// A field of a schema struct, as its source declares it.
#[derive(Debug, Clone)]
struct Field {
    /// The key (serde's name: a `rename` applied, `r#` taken off).
    key: String,
    /// Another name serde accepts for it.
    alias: Option<String>,
    /// Its type, as written.
    ty: String,
    /// Its doc comment, one entry per line, `/// ` taken off.
    doc: Vec<String>,
}

/// A schema struct: its doc comment and its fields (serde's `skip` and `flatten` left out).
#[derive(Debug, Clone, Default)]
struct Struct {
    doc: Vec<String>,
    fields: Vec<Field>,
}

/// The value of `name = "..."` in a `#[serde(...)]` attribute.
fn attr_value(attr: &str, name: &str) -> Option<String> {
    let at = attr.find(&format!("{name} = \""))? + name.len() + 4;
    let end = attr[at..].find('"')?;
    Some(attr[at..at + end].to_string())
}

/// Every `pub struct Name { ... }` of `src` (rustfmt's layout), by name.
fn parse(src: &str, out: &mut BTreeMap<String, Struct>) {
    let mut lines = src.lines().peekable();
    let mut doc: Vec<String> = Vec::new();
    let mut attrs = String::new();
    let mut current: Option<(String, Struct)> = None;
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        if let Some(d) = t.strip_prefix("///") {
            doc.push(d.strip_prefix(' ').unwrap_or(d).to_string());
            continue;
        }
        if t.starts_with("#[") {
            let mut attr = t.to_string();
            while !attr.trim_end().ends_with(']') {
                match lines.next() {
                    Some(more) => attr.push_str(more.trim()),
                    None => break,
                }
            }
            attrs.push_str(&attr);
            continue;
        }
        if current.is_none() {
            // (a struct at the top of its file only: one inside `mod tests` is no section)
            let head = line
                .strip_prefix("pub ")
                .or_else(|| line.strip_prefix("pub(crate) "));
            if let Some(rest) = head.and_then(|h| h.strip_prefix("struct ")) {
                if let Some(name) = rest.strip_suffix(" {") {
                    let name = name.split('<').next().unwrap_or(name).to_string();
                    current = Some((
                        name,
                        Struct {
                            doc: std::mem::take(&mut doc),
                            fields: Vec::new(),
                        },
                    ));
                }
            }
        } else if line.starts_with('}') {
            let (name, s) = current.take().expect("in a struct");
            out.insert(name, s);
        } else if let Some(field) = t.strip_prefix("pub ") {
            let (name, ty) = field.split_once(": ").unwrap_or((field, ""));
            let skipped = attrs.contains("skip)")
                || attrs.contains("skip,")
                || attrs.contains("flatten")
                || attrs.contains("skip_deserializing");
            if !skipped {
                let (_, s) = current.as_mut().expect("in a struct");
                s.fields.push(Field {
                    key: attr_value(&attrs, "rename")
                        .unwrap_or_else(|| name.trim_start_matches("r#").to_string()),
                    alias: attr_value(&attrs, "alias"),
                    ty: ty.trim_end_matches(',').to_string(),
                    doc: std::mem::take(&mut doc),
                });
            }
        }
        doc.clear();
        attrs.clear();
    }
}

/// The schema's structs: kiln's config and the built-in families' keys.
fn schema() -> BTreeMap<String, Struct> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files: Vec<_> = std::fs::read_dir(root.join("src/config"))
        .expect("src/config")
        .map(|e| e.expect("src/config entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .collect();
    files.sort();
    files.push(root.join("src/model/gpt/keys.rs"));
    files.push(root.join("src/model/llama/keys.rs"));
    let mut out = BTreeMap::new();
    for f in files {
        let src = std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        parse(&src, &mut out);
    }
    out
}

/// The struct a field's type names, when it is a table of the schema (`Option<T>`, `T`).
fn table_of<'a>(ty: &str, schema: &'a BTreeMap<String, Struct>) -> Option<&'a Struct> {
    let inner = ty
        .strip_prefix("Option<")
        .and_then(|t| t.strip_suffix('>'))
        .unwrap_or(ty);
    let name = inner.rsplit("::").next().unwrap_or(inner);
    schema.get(name)
}

/// A doc comment as one Markdown paragraph: lines joined, a list's items kept apart, `|`
/// escaped for a table cell.
fn paragraph(doc: &[String]) -> String {
    let mut out = String::new();
    for line in doc {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(item) = line.strip_prefix("- ") {
            out.push_str("<br>• ");
            out.push_str(item);
        } else {
            if !out.is_empty() {
                out.push(' ');
            }
            out.push_str(line);
        }
    }
    out.replace('|', "\\|")
}

/// A field's meaning and default: the doc comment up to its last `Default:`, and what follows
/// (`None` when it names none).
fn meaning_and_default(doc: &[String]) -> (String, Option<String>) {
    let text = paragraph(doc);
    match text.rfind("Default:") {
        Some(at) => {
            let default = text[at + "Default:".len()..].trim().trim_end_matches('.');
            (text[..at].trim().to_string(), Some(default.to_string()))
        }
        None => (text, None),
    }
}

/// The rows of table `path` (`s`'s fields), then the sections of its sub-tables that are
/// structs of `schema` (`None`: none expanded, a family's table is one row, as its keys are
/// read by the family); `missing` gathers the keys whose doc names no default (and whose
/// table does not say its keys are unset).
fn section(
    out: &mut String,
    (title, path): (&str, &str),
    s: &Struct,
    schema: Option<&BTreeMap<String, Struct>>,
    missing: &mut Vec<String>,
) {
    out.push_str(&format!("\n## {title}\n\n"));
    // the struct's doc, less the table's name it opens with (the heading says it)
    let doc = paragraph(&s.doc).replace("\\|", "|");
    let intro = doc
        .strip_prefix(&format!("`[{path}]`"))
        .map_or(doc.as_str(), |rest| {
            rest.trim_start_matches([':', '.', ' '])
        });
    let mut chars = intro.chars();
    if let Some(first) = chars.next() {
        out.push_str(&format!("{}{}\n\n", first.to_uppercase(), chars.as_str()));
    }
    let unset_by_default = paragraph(&s.doc).contains("unset by default");
    let mut subtables = Vec::new();
    out.push_str("| key | default | meaning |\n| --- | --- | --- |\n");
    for f in &s.fields {
        let key = format!("{path}.{}", f.key);
        let (meaning, default) = meaning_and_default(&f.doc);
        let default = match default {
            Some(d) => d,
            None if unset_by_default => "unset".to_string(),
            None => {
                missing.push(key.clone());
                String::new()
            }
        };
        let meaning = match schema.and_then(|sc| table_of(&f.ty, sc)) {
            Some(t) => {
                subtables.push((key.clone(), t));
                format!("{meaning} See [`[{key}]`](#{}).", slug(&key))
            }
            None => meaning,
        };
        let cell = match &f.alias {
            Some(alias) => format!("`{key}` (also `{path}.{alias}`)"),
            None => format!("`{key}`"),
        };
        out.push_str(&format!("| {cell} | {default} | {meaning} |\n"));
    }
    for (key, t) in subtables {
        section(out, (&format!("`[{key}]`"), &key), t, schema, missing);
    }
}

/// mdBook's anchor of a heading `` `[key]` ``.
fn slug(key: &str) -> String {
    key.chars()
        .filter(|c| c.is_alphanumeric() || *c == '_' || *c == '-' || *c == ' ')
        .collect::<String>()
        .to_lowercase()
        .replace(' ', "-")
}

/// The page the schema gives, and the keys whose doc comment names no default.
pub(crate) fn generate() -> (String, Vec<String>) {
    let schema = schema();
    let root = schema.get("Config").expect("struct Config in src/config");
    let mut out = String::from(
        "# Configuration reference\n\n\
         <!-- Generated from the doc comments of the config schema (src/config/*.rs and the \
         built-in families' keys.rs) by src/config/reference.rs; a test fails when they \
         differ. Edit the doc comments, then: KILN_BLESS=1 cargo test --release --lib \
         reference -->\n\n\
         Every key an experiment file, a `KILN_<SECTION>__<KEY>` variable or `--set` may set, \
         section by section, with its default and its meaning. How the layers combine, and \
         what `kiln check` shows, is in [How values are layered](configuration-layers.md).\n",
    );
    let mut missing = Vec::new();
    for f in &root.fields {
        let table = table_of(&f.ty, &schema).expect("a section is a table");
        let title = format!("`[{}]`", f.key);
        section(
            &mut out,
            (&title, &f.key),
            table,
            Some(&schema),
            &mut missing,
        );
        if f.key == "model" {
            for (family, name) in [("gpt", "GptKeys"), ("llama", "LlamaKeys")] {
                let keys = schema.get(name).expect("a built-in family's keys");
                let title = format!("`[model]`: {family}'s own keys");
                section(&mut out, (&title, "model"), keys, None, &mut missing);
            }
        }
    }
    (out, missing)
}

/// The keys a page names: in its table rows' first cells and its `` `[table]` `` headings.
fn page_keys(page: &str) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    for line in page.lines() {
        if let Some(h) = line.strip_prefix("## `[") {
            if let Some(k) = h.split("]`").next() {
                keys.insert(k.to_string());
            }
        } else if let Some(row) = line.strip_prefix("| `") {
            let cell = row.split(" | ").next().unwrap_or_default();
            // `key` and `key (also `alias`)`: every quoted name
            keys.extend(cell.split('`').step_by(2).map(str::to_string));
        }
    }
    keys
}

/// The keys the schema accepts under `path`, or `None` when `path` is no table (its probe
/// fails as a wrong type, not as an unknown key).
fn table_keys(path: &str) -> Option<Vec<String>> {
    probe(&format!("[{path}]\n__kiln_probe__ = 1\n"))
}

/// The keys figment's "unknown key" error lists for `toml` merged over the defaults (`None`
/// when it is no such error).
fn probe(toml: &str) -> Option<Vec<String>> {
    let err = Figment::from(Serialized::defaults(Config::default()))
        .merge(Toml::string(toml))
        .extract::<Config>()
        .err()?;
    err.into_iter().find_map(|e| match e.kind {
        figment::error::Kind::UnknownField(_, expected) => {
            Some(expected.iter().map(|k| k.to_string()).collect())
        }
        _ => None,
    })
}

/// Every key the config accepts, dotted, tables included, found by probing the config
/// itself (not its source): `[model]`'s are its shared keys and `family_keys`.
fn accepted_keys(family_keys: &[String]) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    let mut todo: Vec<String> =
        probe("__kiln_probe__ = 1\n").expect("an unknown section is an unknown-key error");
    keys.extend(todo.iter().cloned());
    while let Some(path) = todo.pop() {
        let found = if path == "model" {
            let mut k = ModelConfig::known_keys();
            k.extend(family_keys.iter().cloned());
            k
        } else {
            table_keys(&path).unwrap_or_else(|| panic!("[{path}] is no table"))
        };
        for k in found {
            let key = format!("{path}.{k}");
            // ([model] takes any key, a family's; its own tables are probed: `[model.lora]`)
            if (path != "model" || key == "model.lora") && table_keys(&key).is_some() {
                todo.push(key.clone());
            }
            keys.insert(key);
        }
    }
    keys
}

/// The rows of `page` whose default is one literal (`` `0.01` ``, `` `"sgd"` ``, `` `[500]` ``)
/// that differs from the value `Config::default()` has there, each as "key: doc says X, the
/// default is Y". `[model]`'s rows are left out (its defaults are the families' and the data's,
/// resolved when the model is built), as are keys the default leaves unset.
fn stale_defaults(page: &str) -> Vec<String> {
    let defaults = Figment::from(Serialized::defaults(Config::default()));
    let mut out = Vec::new();
    for line in page.lines() {
        let cells: Vec<&str> = line.split(" | ").collect();
        let (Some(key), Some(doc)) = (cells.first(), cells.get(1)) else {
            continue;
        };
        let Some(key) = key.strip_prefix("| `").and_then(|k| k.strip_suffix('`')) else {
            continue;
        };
        let Some(lit) = doc.strip_prefix('`').and_then(|d| d.strip_suffix('`')) else {
            continue;
        };
        if key.starts_with("model.") || lit.contains('`') {
            continue;
        }
        let Ok(actual) = defaults.find_value(key) else {
            continue;
        };
        let Ok(mut said) = toml::from_str::<toml::Table>(&format!("v = {lit}")) else {
            out.push(format!("{key}: `{lit}` is no TOML value"));
            continue;
        };
        let said = serde_json::to_value(said.remove("v")).unwrap_or_default();
        let actual = serde_json::to_value(&actual).unwrap_or_default();
        let same = match (said.as_f64(), actual.as_f64()) {
            (Some(a), Some(b)) => a == b,
            _ => said == actual,
        };
        if !same {
            out.push(format!(
                "{key}: the doc says `{lit}`, the default is {actual}"
            ));
        }
    }
    out
}

/// The page in the repository against the schema: the same text as `generate` gives, every
/// key the config accepts (with `family_keys` among `[model]`'s) named, and no other.
/// `KILN_BLESS=1` writes the page first.
pub(crate) fn check(family_keys: &[String]) {
    let (page, missing) = generate();
    assert!(
        missing.is_empty(),
        "these keys' doc comments name no `Default:` (src/config): {missing:?}"
    );
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(PAGE);
    if std::env::var_os("KILN_BLESS").is_some() {
        std::fs::write(&path, &page).expect("write the configuration page");
    }
    let stale = stale_defaults(&page);
    assert!(
        stale.is_empty(),
        "these keys' doc comments name a default that is not `Config::default()`'s:\n{}",
        stale.join("\n")
    );
    let accepted = accepted_keys(family_keys);
    assert!(
        accepted.len() > 100,
        "the probe found too few keys: {accepted:?}"
    );
    let named = page_keys(&page);
    let no_row: Vec<_> = accepted.difference(&named).collect();
    let no_key: Vec<_> = named.difference(&accepted).collect();
    assert!(
        no_row.is_empty() && no_key.is_empty(),
        "the configuration page and the schema differ:\n  keys with no row: {no_row:?}\n  rows naming no key: {no_key:?}"
    );
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == page,
        "{PAGE} is not what the schema's doc comments give: run \
         KILN_BLESS=1 cargo test --release --lib reference and commit the page"
    );
}
