//! The README's configuration table against the schema: every key the config accepts has a
//! row, and every row names a key the config accepts (`sweep.*` and `slurm.*` stand for their
//! sections, which the README describes elsewhere).

use std::collections::BTreeSet;

use figment::providers::{Format, Serialized, Toml};
use figment::Figment;

use super::{Config, ModelConfig};

/// The keys the table of README.md's "Configuration" section names (a cell may name several).
fn readme_keys() -> BTreeSet<String> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let start = readme
        .find("\n## Configuration")
        .expect("a Configuration section");
    let table = readme[start..]
        .lines()
        .skip_while(|l| !l.starts_with("| key | default | meaning |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'));
    let mut keys = BTreeSet::new();
    for row in table {
        let cell = row.split('|').nth(1).unwrap_or_default();
        for quoted in cell.split('`').skip(1).step_by(2) {
            keys.insert(quoted.to_string());
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

/// Every key the config accepts, dotted, tables included (`valid`), and the keys the table
/// must have (`required`): a table the README names as one row stands for its keys; a table
/// it does not name needs a row for each of its keys.
fn schema_keys(
    readme: &BTreeSet<String>,
    family_keys: &[String],
) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut valid, mut required) = (BTreeSet::new(), BTreeSet::new());
    let mut todo: Vec<String> = accepted_sections();
    while let Some(path) = todo.pop() {
        let keys = if path == "model" {
            let mut k = ModelConfig::known_keys();
            k.extend(family_keys.iter().cloned());
            k
        } else {
            table_keys(&path).unwrap_or_else(|| panic!("[{path}] is no table"))
        };
        for k in keys {
            let key = format!("{path}.{k}");
            valid.insert(key.clone());
            if readme.contains(&key) || path == "model" {
                required.insert(key);
            } else if table_keys(&key).is_some() {
                todo.push(key);
            } else {
                required.insert(key);
            }
        }
    }
    (valid, required)
}

/// The config's sections, less the two the README describes elsewhere.
fn accepted_sections() -> Vec<String> {
    probe("__kiln_probe__ = 1\n")
        .expect("an unknown section is an unknown-key error")
        .into_iter()
        .filter(|s| !matches!(s.as_str(), "sweep" | "slurm"))
        .collect()
}

/// The README's table against the schema, with `family_keys` (the model families' own keys,
/// which the model layer knows) among `[model]`'s; panics naming the keys out of step.
pub(crate) fn check_readme_table(family_keys: &[String]) {
    let readme = readme_keys();
    let (valid, required) = schema_keys(&readme, family_keys);
    assert!(
        required.len() > 80,
        "the probe found too few keys: {required:?}"
    );
    let undocumented: Vec<_> = required.difference(&readme).collect();
    let unknown: Vec<_> = readme
        .difference(&valid)
        .filter(|k| !matches!(k.as_str(), "sweep.*" | "slurm.*"))
        .collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty(),
        "README.md's config table is out of step with the schema:\n  keys with no row: {undocumented:?}\n  rows naming no key: {unknown:?}"
    );
}
