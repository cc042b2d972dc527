//! Resuming a run directory: the config change check (`model.*`/`data.*` refused, the rest
//! listed), the choice of checkpoint (the newest verified one, or `--from`), and trimming
//! `metrics.jsonl` to it (once the checkpoint has loaded).

use std::fs;
use std::path::{Path, PathBuf};

use crate::checkpoint::{self, CheckpointDir, State};
use crate::config::{Config, Resolved};
use crate::error::{Error, Result};
use crate::rundir::stored_config;
use crate::ui;

/// What a resume starts from: a checkpoint (its directory and state; the tensors are loaded
/// once the model is built), or nothing (no checkpoint was saved yet: the run starts over in
/// place).
pub struct Resumption {
    pub from: Option<(PathBuf, State)>,
}

/// (key, old, new) for every value that differs.
pub fn config_changes(old: &Config, new: &Config) -> Vec<(String, String, String)> {
    let (a, b) = (crate::config::flat(old), crate::config::flat(new));
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

/// Data keys that change how batches are made, never which: a resume may change them.
const LOADER_KEYS: &[&str] = &["data.workers", "data.prefetch"];

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
        // the checkpoints stay where the run keeps them: loading from one directory while
        // saving (and setting newer ones aside) in another would split the run
        .filter(|(k, _, _)| {
            (k.starts_with("model.") || k.starts_with("data.") || k == "checkpoint.dir")
                && !LOADER_KEYS.contains(&k.as_str())
        })
        .map(|(k, a, b)| format!("  `{k}`: {a} -> {b}"))
        .collect();
    if !refused.is_empty() {
        return Err(Error::Usage(format!(
            "cannot resume `{}` with a different model, data or checkpoint.dir:\n{}\n  = help: undo these changes, or start a new run with `kiln run`",
            dir.display(),
            refused.join("\n")
        )));
    }
    // where this job's node 0 listens and which node this is change with every job (a Slurm
    // requeue, torchrun), and where this session pauses (an asha segment's rung): not worth a
    // warning
    let per_job = [
        "train.pause_at_step",
        "launch.master_addr",
        "launch.master_port",
        "launch.node_rank",
        "launch.local_rank",
        "launch.token_file",
        "backend.threads",
        "data.workers",
        "data.prefetch",
    ];
    for (k, a, b) in changes
        .iter()
        .filter(|(k, _, _)| !per_job.contains(&k.as_str()))
    {
        ui::note(&format!("warning: resuming with `{k}` changed: {a} -> {b}"));
    }

    // the same files as when the run was made: a re-tokenized corpus or another tokenizer
    // would go on training on other ids (issue 45, defect 14)
    crate::rundir::inputs::refuse_changed(dir, r, None, "cannot resume")?;
    let store = CheckpointDir::new(dir.join(&old.checkpoint.dir));
    let chosen = choose_checkpoint(&store, from)?;
    let from = match chosen {
        Some(path) => {
            let state = checkpoint::read_state(&path).map_err(Error::Checkpoint)?;
            if !quiet {
                ui::note(&format!(
                    "resuming {} from {} (step {})",
                    dir.display(),
                    path.display(),
                    state.step
                ));
            }
            Some((path, state))
        }
        None => {
            // a run that never started (a submitted job's first start) has nothing to say
            if dir.join("metrics.jsonl").exists() || store.dir.exists() {
                ui::note(&format!(
                    "no verified checkpoint in {}: the run starts over from step 0",
                    store.dir.display()
                ));
            }
            None
        }
    };
    Ok(Resumption { from })
}

/// The checkpoint to continue from: `from` (a name such as `step-00000020`, which must verify),
/// or the newest one that verifies (saying which newer ones it skips and why); `None` when
/// there is none.
pub fn choose_checkpoint(store: &CheckpointDir, from: Option<&str>) -> Result<Option<PathBuf>> {
    choose(store, from, false)
}

/// `choose_checkpoint` for a resume (`reading` false: every skipped checkpoint is said, and
/// when none verifies the way to start over is given) or for a command that only reads one
/// (`reading` true: an unfinished `.tmp` is the save a live run is writing, passed over
/// quietly, and a reader is never told to move checkpoints away).
fn choose(store: &CheckpointDir, from: Option<&str>, reading: bool) -> Result<Option<PathBuf>> {
    let mut entries = store.list().map_err(Error::Checkpoint)?;
    // a reader of a live run: a checkpoint that failed to verify because retention took it
    // away meanwhile is not damaged, and a listing made while a save renamed its `.tmp` into
    // place and retention renamed the old one away can hold no finished checkpoint: look
    // again (for a second at most) while the store is changing
    for _ in 0..100 {
        let vanished = entries
            .iter()
            .any(|e| e.status.is_err() && !e.path.exists());
        let none = !entries.iter().any(|e| e.status.is_ok());
        if !reading || !(vanished || (none && store.is_changing())) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
        entries = store.list().map_err(Error::Checkpoint)?;
    }
    if reading {
        entries.retain(|e| e.status.is_ok() || e.path.exists());
    }
    let best_name;
    let from = match from {
        Some("best") => {
            best_name = best_mark(store)?
                .map(|b| format!("step-{:08}", b.best_step))
                .ok_or_else(|| {
                Error::Usage(format!(
                    "no best checkpoint in {}: the run keeps none (set `[checkpoint] keep_best = {{ metric = \"eval_loss\" }}`) or has not evaluated yet",
                    store.dir.display()
                ))
            })?;
            Some(best_name.as_str())
        }
        other => other,
    };
    Ok(match from {
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
                    Err(_) if reading && e.path.to_string_lossy().ends_with(".tmp") => {}
                    Err(why) => ui::note(&format!(
                        "skipping {}: {why}",
                        e.path
                            .file_name()
                            .map(|f| f.to_string_lossy().into_owned())
                            .unwrap_or_default()
                    )),
                }
            }
            // finished checkpoints that all fail verification were damaged: starting over
            // would train past them and delete them
            let damaged = entries
                .iter()
                .any(|e| !e.path.to_string_lossy().ends_with(".tmp"));
            if pick.is_none() && damaged && reading {
                return Err(Error::Usage(format!(
                    "no checkpoint in {} verifies (each is listed above with why)\n  = help: `kiln ckpt list` shows them",
                    store.dir.display()
                )));
            }
            if pick.is_none() && damaged {
                return Err(Error::Usage(format!(
                    "no checkpoint in {} verifies (each is listed above with why)\n  = help: `kiln ckpt list` shows them; to start this run over, move them away; or start a new run with `kiln run`",
                    store.dir.display()
                )));
            }
            pick
        }
    })
}

/// `r` with the seeds of a checkpoint's random streams (`state.json`'s `rng`) when the config
/// says other ones, saying which; `None` when they agree. The data's own seed (`data.seed`) is
/// a data key a resume cannot change.
pub(super) fn restore_seeds(r: &Resolved, rng: &checkpoint::RngState) -> Option<Resolved> {
    let c = &r.config;
    let mut changed = Vec::new();
    if c.experiment.seed != rng.init_seed || c.experiment.seed != rng.dropout_seed {
        changed.push(format!(
            "experiment.seed = {} (the config says {})",
            rng.dropout_seed, c.experiment.seed
        ));
    }
    if c.sampler.seed != rng.sampler_seed {
        changed.push(format!(
            "sampler.seed = {} (the config says {})",
            rng.sampler_seed, c.sampler.seed
        ));
    }
    if changed.is_empty() {
        return None;
    }
    ui::note(&format!(
        "warning: the checkpoint's random streams are restored: {}; a new run (`kiln run`) takes other seeds",
        changed.join(", ")
    ));
    let mut out = r.clone();
    out.config.experiment.seed = rng.dropout_seed;
    out.config.sampler.seed = rng.sampler_seed;
    Some(out)
}

/// Keeps the metrics lines up to `step`: the resumed run writes the rest again.
pub(super) fn trim_metrics(path: &Path, step: usize) -> Result<()> {
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
    crate::rundir::replace_file(path, kept.as_bytes())
        .map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

/// A resume from an older checkpoint branches the run: the newer checkpoints (which retention
/// would otherwise keep over the new ones, and a later resume would jump back to) move to
/// `abandoned-<unix seconds>/` beside them, where `kiln ckpt list` shows them.
pub(super) fn set_aside_newer(store: &CheckpointDir, step: u64) -> Result<()> {
    let newer: Vec<_> = store
        .list()
        .map_err(Error::Checkpoint)?
        .into_iter()
        // finished checkpoints that verify: a `.tmp` one is the store's to clean, a damaged
        // one was never a step the run reached
        .filter(|e| {
            e.step > step && e.status.is_ok() && !e.path.to_string_lossy().ends_with(".tmp")
        })
        .collect();
    if newer.is_empty() {
        return Ok(());
    }
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    // a directory of its own, even for two branches within a second
    let mut aside = store.dir.join(format!("abandoned-{secs}"));
    let mut n = 1;
    loop {
        match fs::create_dir(&aside) {
            Ok(()) => break,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => {
                n += 1;
                aside = store.dir.join(format!("abandoned-{secs}-{n}"));
            }
            Err(e) => return Err(Error::io(format!("creating {}", aside.display()), e)),
        }
    }
    let mut names = Vec::new();
    for e in newer {
        let Some(name) = e.path.file_name() else {
            continue;
        };
        let to = aside.join(name);
        fs::rename(&e.path, &to)
            .map_err(|err| Error::io(format!("moving {} aside", e.path.display()), err))?;
        names.push(name.to_string_lossy().into_owned());
    }
    ui::note(&format!(
        "resuming from step {step}, an older checkpoint: the newer {} moved to {} (this run branches here)",
        names.join(", "),
        aside.display()
    ));
    Ok(())
}

/// The best checkpoint (`checkpoint.keep_best`) as the newest verified checkpoint records it:
/// its metric, value and step; `None` when the run keeps none.
pub fn best_mark(store: &CheckpointDir) -> Result<Option<checkpoint::WatchState>> {
    let entries = store.list().map_err(Error::Checkpoint)?;
    let Some(newest) = entries.iter().find(|e| e.status.is_ok()) else {
        return Ok(None);
    };
    let state = checkpoint::read_state(&newest.path).map_err(Error::Checkpoint)?;
    Ok(state.best)
}

/// The checkpoint a reader (eval, export, sample) takes, read by `read`: when a live run's
/// retention deletes it while it is read (a run with `keep_last` saves and deletes while the
/// reader works), the newest one is chosen and read again.
pub fn read_checkpoint<T>(
    store: &CheckpointDir,
    from: Option<&str>,
    mut read: impl FnMut(&Path) -> Result<T>,
) -> Result<(PathBuf, T)> {
    let mut tries = 0;
    loop {
        tries += 1;
        let path = require_checkpoint(store, from)?;
        match read(&path) {
            // gone meanwhile (retention renames a checkpoint away before it deletes it)
            Err(_) if tries < 20 && !path.exists() => continue,
            other => return other.map(|t| (path, t)),
        }
    }
}

/// `read_checkpoint` of a whole checkpoint: its state, the model of `r` built for the
/// checkpoint's input shape, and its tensors.
pub fn read_model_checkpoint(
    store: &CheckpointDir,
    from: Option<&str>,
    r: &Resolved,
) -> Result<(
    PathBuf,
    (State, crate::model::SharedModel, checkpoint::Loaded),
)> {
    read_checkpoint(store, from, |p| {
        let state = checkpoint::read_state(p)?;
        let model = crate::model::build(r, &state.input_shape)?;
        let loaded = checkpoint::load(p, &model.layout().specs())?;
        Ok((state, model, loaded))
    })
}

/// `choose_checkpoint` for a reader, where having none is an error saying how to get one.
pub fn require_checkpoint(store: &CheckpointDir, from: Option<&str>) -> Result<PathBuf> {
    choose(store, from, true)?.ok_or_else(|| {
        Error::Usage(format!(
            "no verified checkpoint in {}; train with `[checkpoint] at_end = true` (or every_steps)",
            store.dir.display()
        ))
    })
}
