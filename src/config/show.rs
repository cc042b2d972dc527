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

/// The config as dotted leaf keys and their values, TOML-written (arrays are leaves): what a
/// resume compares with the run's config, and what the nodes of a job compare.
pub fn flat(config: &Config) -> std::collections::BTreeMap<String, String> {
    fn walk(prefix: &str, v: &toml::Value, out: &mut std::collections::BTreeMap<String, String>) {
        match v {
            toml::Value::Table(t) => {
                for (k, v) in t {
                    let key = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(&key, v, out);
                }
            }
            other => {
                out.insert(prefix.to_string(), other.to_string());
            }
        }
    }
    let mut out = std::collections::BTreeMap::new();
    if let Ok(t) = toml::Table::try_from(config) {
        walk("", &toml::Value::Table(t), &mut out);
    }
    out
}

/// Keys renamed since hashes were pinned, `(section, name now, name hashed)`: a config hashes
/// under the old names, so the hash of a config (and a sweep's trial directories) does not
/// change with a rename.
const RENAMED: &[(&str, &str, &str)] = &[("data", "vocab", "tokens")];

/// A short, stable hash of the resolved config.
pub fn config_hash(config: &Config) -> String {
    let mut text = String::new();
    let mut section = "";
    let toml = to_toml(config);
    for line in toml.split_inclusive('\n') {
        if let Some(name) = line.trim_end().strip_prefix('[') {
            section = name.strip_suffix(']').unwrap_or(section);
        }
        let renamed = RENAMED.iter().find_map(|(s, now, then)| {
            let rest = line.strip_prefix(now)?.strip_prefix(" = ")?;
            (*s == section).then(|| format!("{then} = {rest}"))
        });
        text.push_str(renamed.as_deref().unwrap_or(line));
    }
    let digest = Sha256::digest(text.as_bytes());
    digest.iter().take(6).map(|b| format!("{b:02x}")).collect()
}

/// Whether `section.key` belongs to another model family, data kind, optimizer or schedule
/// than `c` chose (for families kiln does not know, nothing is another's).
fn elsewhere(c: &Config, section: &str, key: &str) -> bool {
    use super::{DataKind, OptimKind, ScheduleKind};
    let not = |keys: &[&str]| keys.contains(&key);
    match section {
        "model" => match c.model.kind.as_str() {
            "gpt" | "llama" | "qwen3" | "gemma3" | "phi3" | "mixtral" => not(&[
                "input_size",
                "hidden_sizes",
                "channels",
                "kernel_size",
                "classes",
                "activation",
            ]),
            "mlp" => not(&["channels", "kernel_size", "vocab_size", "block_size"]),
            "cnn" => not(&["vocab_size", "block_size"]),
            _ => false,
        },
        "data" => {
            let synthetic = ["samples", "eval_samples", "features"];
            let csv = ["label_column", "header"];
            let idx = ["labels_path", "eval_labels_path"];
            let text = ["eval_fraction", "tokenizer"];
            let on_disk = ["path", "eval_path"];
            let docs = [
                "text_field",
                "packing",
                "mix",
                "mix_stop",
                "format",
                "messages_field",
                "chat_template",
                "train_on_prompt",
                "truncation",
            ];
            let others: Vec<&str> = match c.data.kind {
                DataKind::Synthetic => [&csv[..], &idx, &text, &on_disk, &docs].concat(),
                DataKind::Csv => [&synthetic[..], &idx, &text, &docs].concat(),
                DataKind::Idx => [&synthetic[..], &csv, &text, &docs].concat(),
                DataKind::Text | DataKind::Tokens => [
                    &synthetic[..],
                    &csv,
                    &idx,
                    &[
                        "classes",
                        "text_field",
                        "packing",
                        "format",
                        "messages_field",
                        "chat_template",
                        "train_on_prompt",
                        "truncation",
                    ],
                ]
                .concat(),
                DataKind::Jsonl | DataKind::Parquet => [
                    &synthetic[..],
                    &csv,
                    &idx,
                    &["classes", "eval_fraction", "stride", "dtype"],
                ]
                .concat(),
            };
            others.contains(&key)
        }
        "optim" => match c.optim.kind {
            OptimKind::Sgd => not(&["betas", "eps"]),
            OptimKind::Adam | OptimKind::Adamw => not(&["momentum", "nesterov"]),
        },
        "schedule" => match c.schedule.kind {
            ScheduleKind::Constant => not(&["step_size", "gamma", "min_lr", "decay_steps"]),
            ScheduleKind::Step => not(&["min_lr", "decay_steps"]),
            ScheduleKind::Cosine | ScheduleKind::Linear => not(&["step_size", "gamma"]),
        },
        _ => false,
    }
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
        let set = |key: &str| describe_source(&r.figment, key) != super::load::DEFAULT_SOURCE;
        let mut rows: Vec<(String, String)> = t
            .iter()
            // a key of another model family, data kind, optimizer or schedule, left at its
            // default, is not this experiment's (issue 58, defect 26: a llama listed the mlp's
            // and the csv reader's keys)
            .filter(|(k, _)| set(&format!("{section}.{k}")) || !elsewhere(&r.config, section, k))
            .map(|(k, v)| {
                let key = format!("{section}.{k}");
                (format!("{k} = {v}"), describe_source(&r.figment, &key))
            })
            .collect();
        // a key a layer sets to its default value, which the plain TOML leaves out: shown too,
        // with its source
        if let Ok(figment::value::Value::Dict(_, given)) = r.figment.find_value(section) {
            for (k, v) in given {
                let key = format!("{section}.{k}");
                if t.contains_key(&k) || !set(&key) {
                    continue;
                }
                if let Ok(v) = v.deserialize::<toml::Value>() {
                    rows.push((format!("{k} = {v}"), describe_source(&r.figment, &key)));
                }
            }
        }
        for key in OPTIONAL {
            if let Some(k) = key.strip_prefix(&format!("{section}.")) {
                if !t.contains_key(k) && !elsewhere(&r.config, section, k) {
                    rows.push((format!("# {k} = (unset)"), describe_source(&r.figment, key)));
                }
            }
        }
        // aligned on the longest line of up to 1,000 bytes: a longer one (a long node list) is
        // not padded to, and `format!`'s width stays far below its limit of 65,535 (issue 45,
        // defect 2: a longer line panicked)
        let width = rows
            .iter()
            .map(|(l, _)| l.len())
            .filter(|n| *n <= 1000)
            .max()
            .unwrap_or(0);
        for (line, source) in rows {
            // (a password in a URL is never shown: issue 58, defect 9)
            let (line, source) = (super::redact(&line), super::redact(&source));
            out.push_str(&format!("{line:<width$}  # {source}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::config_hash;
    use crate::config::load::{build_figment, extract};
    use crate::config::Config;
    use std::path::Path;

    /// The config hash of the default config and of every shipped experiment, pinned: a run's
    /// `config_hash` and a sweep's trial directories are these hashes, so a new key (or a
    /// renamed or reordered one) must leave them alone, e.g. by not serialising its default
    /// (`skip_serializing_if`, as `backend.fused`). A change meant to alter them rewrites
    /// `tests/fixtures/config-hashes.txt` (the failure prints the new list) and says so in
    /// CHANGELOG.md.
    #[test]
    fn the_config_hashes_of_the_default_and_every_shipped_experiment_are_pinned() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut files: Vec<_> = std::fs::read_dir(root.join("experiments"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "toml"))
            .collect();
        files.sort();
        let mut got = vec![format!("default {}", config_hash(&Config::default()))];
        for f in &files {
            // resolved as `kiln check` does, without the checks that read other files
            // (gpt2-finetune's weights are not shipped)
            let figment = build_figment(f, &[], &[]).unwrap();
            let config = extract(&figment).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            let name = f.file_name().unwrap().to_string_lossy();
            got.push(format!("experiments/{name} {}", config_hash(&config)));
        }
        let got = got.join("\n") + "\n";
        let want = std::fs::read_to_string(root.join("tests/fixtures/config-hashes.txt")).unwrap();
        // a shipped experiment added since: its line is new, the others must stand
        let want_lines: Vec<&str> = want.lines().collect();
        let missing: Vec<&str> = want_lines
            .iter()
            .filter(|l| !got.lines().any(|g| g == **l))
            .copied()
            .collect();
        assert!(
            missing.is_empty(),
            "config hashes changed (sweep trial ids and run hashes would change):\n{}\nnow:\n{got}",
            missing.join("\n")
        );
        assert_eq!(
            got.lines().count(),
            want_lines.len(),
            "a shipped experiment is not pinned yet: add its line to \
             tests/fixtures/config-hashes.txt:\n{got}"
        );
    }
}
