//! `kiln resume RUN_DIR`: continues a run in place from its newest verified checkpoint (or
//! `--from step-N`). Changes to `model.*` or `data.*` are refused; other changes are allowed and
//! listed. Newer checkpoints that do not verify are skipped with the reason.

use std::fs;
use std::path::{Path, PathBuf};

use clap::Args;

use super::run::{execute, stored_config};
use crate::checkpoint::{self, Loaded, Store};
use crate::config::{self, Config, Resolved};
use crate::error::{Error, Result};

#[derive(Debug, Args)]
pub struct ResumeArgs {
    /// The run directory (it holds config.toml and checkpoints/).
    pub run_dir: PathBuf,
    /// Override a key for the rest of the run (model.* and data.* cannot change).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
    /// Resume from this checkpoint (e.g. `step-00000020`) instead of the newest verified one.
    #[arg(long, value_name = "step-N")]
    pub from: Option<String>,
    /// No progress bar and no status lines.
    #[arg(long)]
    pub quiet: bool,
}

/// What a resume starts from: a loaded checkpoint, or nothing (no checkpoint was saved yet: the
/// run starts over in place).
pub struct Resumption {
    pub loaded: Option<Loaded>,
}

pub fn resume(a: &ResumeArgs) -> Result<()> {
    let file = a.run_dir.join("config.toml");
    if !file.is_file() {
        return Err(Error::Usage(format!(
            "`{}` is not a kiln run directory (no config.toml); pass the directory `kiln run` printed",
            a.run_dir.display()
        )));
    }
    let env: Vec<(String, String)> = std::env::vars().collect();
    let r = config::load(&file, &env, &a.sets)?;
    if r.config.launch.nnodes > 1 {
        return Err(Error::Usage(
            "this run spans several nodes; resuming multi-node runs is not supported yet (resume it on one node with `--set launch.nnodes=1 --set strategy.devices=N`)".into(),
        ));
    }
    let res = prepare_resume(&a.run_dir, &r, a.from.as_deref(), a.quiet)?;
    execute(&r, &a.run_dir, Some(res), a.quiet, None)
}

/// Dotted leaf keys and their values (arrays are leaves).
fn flatten(prefix: &str, v: &toml::Value, out: &mut Vec<(String, String)>) {
    match v {
        toml::Value::Table(t) => {
            for (k, v) in t {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out);
            }
        }
        other => out.push((prefix.to_string(), other.to_string())),
    }
}

/// (key, old, new) for every value that differs.
pub fn config_changes(old: &Config, new: &Config) -> Vec<(String, String, String)> {
    let flat = |c: &Config| {
        let mut out = Vec::new();
        if let Ok(t) = toml::Table::try_from(c) {
            flatten("", &toml::Value::Table(t), &mut out);
        }
        out.into_iter()
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    let (a, b) = (flat(old), flat(new));
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    let unset = "(unset)".to_string();
    keys.into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .map(|k| {
            (
                k.clone(),
                a.get(k).unwrap_or(&unset).clone(),
                b.get(k).unwrap_or(&unset).clone(),
            )
        })
        .collect()
}

/// Checks the config change, picks and loads the checkpoint, and trims `metrics.jsonl` to it.
pub fn prepare_resume(
    dir: &Path,
    r: &Resolved,
    from: Option<&str>,
    quiet: bool,
) -> Result<Resumption> {
    let old_path = dir.join("config.toml");
    let old_text = fs::read_to_string(&old_path)
        .map_err(|e| Error::io(format!("reading {}", old_path.display()), e))?;
    let old: Config = toml::from_str(&old_text).map_err(|e| {
        Error::Usage(format!(
            "`{}` does not parse ({}); was it edited by hand?",
            old_path.display(),
            e.message()
        ))
    })?;
    let changes = config_changes(&old, &stored_config(r));
    let refused: Vec<String> = changes
        .iter()
        .filter(|(k, _, _)| k.starts_with("model.") || k.starts_with("data."))
        .map(|(k, a, b)| format!("  `{k}`: {a} -> {b}"))
        .collect();
    if !refused.is_empty() {
        return Err(Error::Usage(format!(
            "cannot resume `{}` with a different model or data:\n{}\n  = help: undo these changes, or start a new run with `kiln run`",
            dir.display(),
            refused.join("\n")
        )));
    }
    for (k, a, b) in &changes {
        eprintln!("warning: resuming with `{k}` changed: {a} -> {b}");
    }

    let store = Store::new(dir.join(&old.checkpoint.dir));
    let entries = store.list().map_err(Error::Checkpoint)?;
    let chosen = match from {
        Some(name) => {
            let e = entries
                .iter()
                .find(|e| e.path.file_name().is_some_and(|f| f == name))
                .ok_or_else(|| {
                    let names: Vec<String> = entries
                        .iter()
                        .filter_map(|e| {
                            e.path.file_name().map(|f| f.to_string_lossy().into_owned())
                        })
                        .collect();
                    Error::Usage(format!(
                        "no checkpoint `{name}` in {}; there are: {}",
                        store.dir.display(),
                        if names.is_empty() {
                            "none".into()
                        } else {
                            names.join(", ")
                        }
                    ))
                })?;
            if let Err(why) = &e.status {
                return Err(Error::Usage(format!(
                    "checkpoint `{name}` cannot be resumed from: {why}"
                )));
            }
            Some(e.path.clone())
        }
        None => {
            let mut pick = None;
            for e in &entries {
                match &e.status {
                    Ok(()) => {
                        pick = Some(e.path.clone());
                        break;
                    }
                    Err(why) => eprintln!(
                        "skipping {}: {why}",
                        e.path
                            .file_name()
                            .map(|f| f.to_string_lossy().into_owned())
                            .unwrap_or_default()
                    ),
                }
            }
            pick
        }
    };
    let loaded = match chosen {
        Some(path) => {
            let l = checkpoint::load(&path).map_err(Error::Checkpoint)?;
            if !quiet {
                eprintln!(
                    "resuming {} from {} (step {})",
                    dir.display(),
                    path.display(),
                    l.state.step
                );
            }
            Some(l)
        }
        None => {
            eprintln!(
                "no verified checkpoint in {}: the run starts over from step 0",
                store.dir.display()
            );
            None
        }
    };
    trim_metrics(
        &dir.join("metrics.jsonl"),
        loaded.as_ref().map(|l| l.state.step).unwrap_or(0),
    )?;
    Ok(Resumption { loaded })
}

/// Keeps the metrics lines up to `step`: the resumed run writes the rest again.
fn trim_metrics(path: &Path, step: usize) -> Result<()> {
    let Ok(text) = fs::read_to_string(path) else {
        return Ok(());
    };
    let kept: String = text
        .lines()
        .filter(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()
                .and_then(|v| v["step"].as_u64())
                .is_some_and(|s| s as usize <= step)
        })
        .map(|l| format!("{l}\n"))
        .collect();
    let tmp = path.with_extension("jsonl.tmp");
    fs::write(&tmp, kept).map_err(|e| Error::io(format!("writing {}", tmp.display()), e))?;
    fs::rename(&tmp, path).map_err(|e| Error::io(format!("writing {}", path.display()), e))
}
