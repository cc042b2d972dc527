//! Renders a resolved config as TOML with the source of every value (`kiln check`), and as plain
//! TOML (the run directory's `config.toml`).

use sha2::{Digest, Sha256};

use super::load::{describe_source, Resolved};
use super::{Config, SECTIONS};

/// Keys that may be unset; shown as comments when they are.
const OPTIONAL: &[&str] = &[
    "data.path",
    "data.eval_path",
    "train.max_steps",
    "optim.grad_clip_norm",
];

/// Plain TOML of the config.
pub fn to_toml(config: &Config) -> String {
    toml::to_string(config).unwrap_or_default()
}

/// A short, stable hash of the resolved config.
pub fn config_hash(config: &Config) -> String {
    let digest = Sha256::digest(to_toml(config).as_bytes());
    digest.iter().take(6).map(|b| format!("{b:02x}")).collect()
}

/// TOML with a `# source` comment after every value.
pub fn annotated(r: &Resolved) -> String {
    let table = toml::Table::try_from(&r.config).unwrap_or_default();
    let mut out = String::new();
    for section in SECTIONS {
        let Some(toml::Value::Table(t)) = table.get(*section) else {
            continue;
        };
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&format!("[{section}]\n"));
        let mut rows: Vec<(String, String)> = t
            .iter()
            .map(|(k, v)| {
                let key = format!("{section}.{k}");
                (format!("{k} = {v}"), describe_source(&r.figment, &key))
            })
            .collect();
        for key in OPTIONAL {
            if let Some(k) = key.strip_prefix(&format!("{section}.")) {
                if !t.contains_key(k) {
                    rows.push((format!("# {k} = (unset)"), describe_source(&r.figment, key)));
                }
            }
        }
        let width = rows.iter().map(|(l, _)| l.len()).max().unwrap_or(0);
        for (line, source) in rows {
            out.push_str(&format!("{line:<width$}  # {source}\n"));
        }
    }
    out
}
