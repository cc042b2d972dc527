//! Range and combination checks that the types alone cannot express. Each failure names the
//! dotted key, its source and what is allowed.

use std::path::PathBuf;

use super::cross;
use super::error::{ConfigError, KeyError, KeyErrorKind};
use super::load::{describe_source, Resolved};

impl Resolved {
    /// An error about `key`, naming the source that set it.
    pub fn key_error(&self, key: &str, message: String, help: Option<String>) -> ConfigError {
        self.error_of_kind(KeyErrorKind::Other, key, message, help)
    }

    /// An error about `key`'s value alone, out of its range (`KeyErrorKind::Range`): the
    /// loader sets the key aside and goes on judging the others.
    pub fn range_error(&self, key: &str, message: String, help: Option<String>) -> ConfigError {
        self.error_of_kind(KeyErrorKind::Range, key, message, help)
    }

    /// An error of `kind` about `key`, naming the source that set it.
    pub fn error_of_kind(
        &self,
        kind: KeyErrorKind,
        key: &str,
        message: String,
        help: Option<String>,
    ) -> ConfigError {
        ConfigError::Key(KeyError {
            key: key.to_string(),
            kind,
            message,
            source: describe_source(&self.figment, key),
            help,
        })
    }

    /// A path-valued key, resolved relative to the file that set it (as given when it came from
    /// the environment or `--set`, i.e. relative to the working directory).
    pub fn path_of(&self, key: &str, value: &str) -> PathBuf {
        let p = PathBuf::from(value);
        if p.is_absolute() {
            return p;
        }
        let from_file = self
            .figment
            .find_metadata(key)
            .and_then(|m| m.source.as_ref())
            .and_then(|s| s.file_path())
            .and_then(|f| f.parent().map(|d| d.join(&p)));
        from_file.unwrap_or(p)
    }

    /// The config with every key that names an input file (the data files, `model.init_from`,
    /// a tokenizer.json) as that file's absolute, resolved path: the same config however the
    /// experiment file was reached (`sw.toml`, `/abs/sw.toml`, `../dir/sw.toml`) and wherever
    /// it is run from. What the run directory stores, and what `canonical_hash` hashes.
    pub fn canonical(&self) -> super::Config {
        let mut c = self.config.clone();
        let abs = |key: &str, v: &str| {
            let p = self.path_of(key, v);
            p.canonicalize()
                .or_else(|_| std::path::absolute(&p))
                .unwrap_or(p)
                .display()
                .to_string()
        };
        let d = &mut c.data;
        for (key, value) in [
            ("data.path", &mut d.path),
            ("data.eval_path", &mut d.eval_path),
            ("data.labels_path", &mut d.labels_path),
            ("data.eval_labels_path", &mut d.eval_labels_path),
            ("data.chat_template", &mut d.chat_template),
        ] {
            *value = value.as_deref().map(|v| abs(key, v));
        }
        for m in &mut c.data.mix {
            m.path = abs("data.mix", &m.path);
        }
        c.model.init_from = c
            .model
            .init_from
            .as_deref()
            .map(|v| abs("model.init_from", v));
        if let Some(l) = &mut c.model.lora {
            l.init_from = l
                .init_from
                .as_deref()
                .map(|v| abs("model.lora.init_from", v));
        }
        if !matches!(c.data.tokenizer.as_str(), "bytes" | "gpt2") {
            c.data.tokenizer = abs("data.tokenizer", &c.data.tokenizer);
        }
        c
    }

    /// The config hash of `canonical()`: one hash for one experiment, however its file was
    /// spelled (issue 58, defect 1: the tokenizer found beside `model.init_from` entered the
    /// hash as the experiment file was spelled, and a sweep resumed from elsewhere re-ran
    /// every trial under new ids).
    pub fn canonical_hash(&self) -> String {
        super::config_hash(&self.canonical())
    }

    /// Settings that are not errors but do nothing here, each said in a line naming the key,
    /// its source and why: what `kiln check` and a run's start say (issue 45, defect 28:
    /// `strategy.unit` and `strategy.sharding` were silent under single, dp and ddp; refusing
    /// them would break experiment files shared by several strategies).
    pub fn notes(&self) -> Vec<String> {
        use super::StrategyKind;
        let c = &self.config;
        let set = |key: &str| describe_source(&self.figment, key) != super::load::DEFAULT_SOURCE;
        let mut out = Vec::new();
        for key in &self.left_out {
            out.push(format!(
                "note: `{key}` of the run's config.toml is left out: `strategy.kind` = \"{}\" ({}) does not have it",
                super::choice_name(&c.strategy.kind),
                describe_source(&self.figment, "strategy.kind")
            ));
        }
        if c.strategy.kind != StrategyKind::Fsdp {
            for key in [
                "strategy.unit",
                "strategy.sharding",
                "strategy.reshard_after_forward",
            ] {
                if set(key) {
                    out.push(format!(
                        "note: `{key}` ({}) applies to fsdp only; `strategy.kind` = \"{}\" ignores it",
                        describe_source(&self.figment, key),
                        super::choice_name(&c.strategy.kind)
                    ));
                }
            }
        }
        if c.strategy.kind == StrategyKind::Fsdp
            && c.strategy.reshard_after_forward == Some(true)
            && (c.strategy.sharding != super::Sharding::Full
                || c.strategy.unit != super::FsdpUnit::Layer)
        {
            out.push(format!(
                "note: `strategy.reshard_after_forward` ({}) applies to `strategy.sharding` = \"full\" with `strategy.unit` = \"layer\" only (gathered a stage at a time); here the whole parameters stay for the step",
                describe_source(&self.figment, "strategy.reshard_after_forward")
            ));
        }
        if c.schedule.decay_steps.is_some()
            && !matches!(
                c.schedule.kind,
                super::ScheduleKind::Cosine | super::ScheduleKind::Linear
            )
        {
            out.push(format!(
                "note: `schedule.decay_steps` ({}) applies to the cosine and linear schedules only; `schedule.kind` = \"{}\" ignores it",
                describe_source(&self.figment, "schedule.decay_steps"),
                super::choice_name(&c.schedule.kind)
            ));
        }
        out
    }
}

pub(super) fn at_least(
    r: &Resolved,
    key: &str,
    value: usize,
    min: usize,
) -> Result<(), ConfigError> {
    if value < min {
        return Err(r.range_error(
            key,
            format!("`{key}` = {value} is out of range: must be at least {min}"),
            None,
        ));
    }
    Ok(())
}

pub(super) fn in_range(
    r: &Resolved,
    key: &str,
    value: f64,
    ok: bool,
    allowed: &str,
) -> Result<(), ConfigError> {
    if !ok || !value.is_finite() {
        return Err(r.range_error(
            key,
            format!("`{key}` = {value} is out of range: must be {allowed}"),
            None,
        ));
    }
    Ok(())
}

/// Each path-valued key that is set names an existing file (relative to the file that set it).
pub(super) fn files_exist(
    r: &Resolved,
    keys: &[(&str, &Option<String>)],
) -> Result<(), ConfigError> {
    for (key, value) in keys {
        let Some(value) = value else { continue };
        let resolved = r.path_of(key, value);
        match std::fs::metadata(&resolved) {
            Ok(m) if m.is_file() => {}
            Ok(m) => {
                let what = if m.is_dir() {
                    "a directory"
                } else {
                    "a FIFO, socket or device"
                };
                return Err(r.key_error(
                    key,
                    format!(
                        "`{key}` = \"{value}\": `{}` is not a regular file (it is {what})",
                        resolved.display()
                    ),
                    Some("give the path of the data file itself".into()),
                ));
            }
            Err(_) => {
                return Err(r.key_error(
                    key,
                    format!(
                        "`{key}` = \"{value}\": file `{}` not found",
                        resolved.display()
                    ),
                    Some("paths are relative to the experiment file that sets them".into()),
                ))
            }
        }
    }
    Ok(())
}

/// Checks every value and combination; the first problem is returned. Each section checks
/// itself (`check`, beside its struct); `cross` holds the checks that span sections.
pub fn validate(r: &Resolved) -> Result<(), ConfigError> {
    let c = &r.config;
    c.profile.check(r)?;
    c.slurm.check(r)?;
    cross::slurm_gpus(r)?;
    cross::waits(r)?;
    cross::profile_ranks(r)?;
    cross::shard_size(r)?;
    c.experiment.check(r)?;
    c.checkpoint.check(r)?;
    c.model.check(r)?;
    c.data.check(r)?;
    cross::features(r)?;
    cross::classes(r)?;
    c.train.check(r)?;
    cross::sizes(r)?;
    c.backend.check(r)?;
    c.data.check_loader(r)?;
    cross::evaluations(r)?;
    c.optim.check(r)?;
    cross::host_ranks(r)?;
    c.strategy.check(r)?;
    cross::placement(r)?;
    c.launch.check(r)?;
    cross::nodes(r)?;
    c.schedule.check(r)?;
    cross::schedule_floor(r)?;
    c.sweep.check(r)?;
    c.log.check(r)?;
    Ok(())
}

/// Ranks per node on the CPU or a wgpu adapter (threads of one process).
pub const MAX_HOST_RANKS: usize = 256;
/// `backend.threads`: math threads of one rank.
pub const MAX_THREADS: usize = 1024;
/// Math threads of all ranks of a node on the CPU.
pub const MAX_HOST_THREADS: usize = 4096;
/// Trials of one sweep (the grid's product times the random samples).
pub const MAX_TRIALS: usize = 10_000;

/// The numbers of `summary.json` a sweep can rank its trials by.
pub const SWEEP_METRICS: &[&str] = &[
    "eval_loss",
    "final_loss",
    "eval_accuracy",
    "eval_perplexity",
    "samples_per_sec",
    "tokens_per_sec",
    "wall_seconds",
    "steps",
    "epochs",
    "peak_rss_bytes",
    "flops_per_sec",
    "mfu",
    "flops_per_sample",
    "num_params",
    "global_batch",
    "world_size",
    "eval_samples",
    "resumed_from_step",
];

/// `skip_serializing_if` helpers: defaults left out of the stored config and its hash, so a new
/// key does not change the hash of configs that leave it at its default.
pub(super) fn is_false(b: &bool) -> bool {
    !*b
}

pub(super) fn is_zero(n: &usize) -> bool {
    *n == 0
}
