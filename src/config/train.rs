//! `[train]`: epochs, steps, batch, evaluation and early stopping.

use serde::{Deserialize, Serialize};

use super::error::ConfigError;
use super::load::Resolved;
use super::validate::*;
#[allow(unused_imports)]
use super::*;

/// `[train]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    /// Passes over the training data. Default: `1`.
    pub epochs: usize,
    /// When set, training ends after this many optimizer steps whatever `epochs` says.
    /// Default: unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<usize>,
    /// Micro-batch size of one device (rank). Default: `32`.
    pub batch_size: usize,
    /// Micro-batches per optimizer step. Default: `1`.
    pub grad_accum_steps: usize,
    /// Evaluate every N optimizer steps; 0 evaluates only at the end. Default: `0`.
    pub eval_every: usize,
    /// Log a metrics line every N optimizer steps (and always the last). Default: `10`.
    pub log_every: usize,
    /// `[train.early_stopping]`: stop when the metric stops improving (Lightning's
    /// EarlyStopping), checked at each evaluation. Default: unset (off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub early_stopping: Option<EarlyStoppingConfig>,
    /// none, or units: the forward keeps only each stage's input and the backward recomputes
    /// the stage (torch `checkpoint_wrapper` on every block), trading a second forward for the
    /// activations; fsdp with full sharding needs it for its memory (a kept graph holds the
    /// gathered parameters). Losses are the same bits either way. Default: `"none"`.
    pub activation_checkpointing: ActivationCheckpointing,
    /// End this session after step N with a checkpoint there (status "paused", exit 0);
    /// `kiln resume` continues the run, to the end or to a later pause. Nothing else changes:
    /// the schedule still runs to `max_steps`, so a run paused and resumed has the bits of one
    /// that never paused (what ASHA's paused trials need). A run resumed at or past step N
    /// pauses again at once: resume with a later N, or 0, to go on. 0: never. Default: `0`.
    #[serde(skip_serializing_if = "is_zero")]
    pub pause_at_step: usize,
}

/// `train.activation_checkpointing`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ActivationCheckpointing {
    None,
    Units,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            epochs: 1,
            max_steps: None,
            batch_size: 32,
            grad_accum_steps: 1,
            eval_every: 0,
            log_every: 10,
            early_stopping: None,
            activation_checkpointing: ActivationCheckpointing::None,
            pause_at_step: 0,
        }
    }
}

/// An evaluation metric that early stopping and the best checkpoint watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EvalMetric {
    EvalLoss,
    /// Classification only.
    EvalAccuracy,
    /// Language models only.
    EvalPerplexity,
}

impl EvalMetric {
    pub fn name(self) -> &'static str {
        match self {
            EvalMetric::EvalLoss => "eval_loss",
            EvalMetric::EvalAccuracy => "eval_accuracy",
            EvalMetric::EvalPerplexity => "eval_perplexity",
        }
    }
    /// Which way is better when the config does not say: up for accuracy, down otherwise.
    pub fn default_mode(self) -> MetricMode {
        match self {
            EvalMetric::EvalAccuracy => MetricMode::Max,
            _ => MetricMode::Min,
        }
    }
}

/// `[train.early_stopping]`: after `patience` evaluations in a row in which `metric` did not
/// improve on its best by more than `min_delta`, training stops and saves a checkpoint there
/// (whatever `checkpoint.at_end` says: a resume must know the run is complete).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EarlyStoppingConfig {
    /// eval_loss, eval_accuracy (classification) or eval_perplexity (language model).
    /// Default: `"eval_loss"`.
    pub metric: EvalMetric,
    /// min or max. Default: `"max"` for eval_accuracy, else `"min"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<MetricMode>,
    /// Evaluations without improvement before stopping. Default: `3`.
    pub patience: usize,
    /// The least change that counts as an improvement. Default: `0.0`.
    pub min_delta: f64,
}

impl Default for EarlyStoppingConfig {
    fn default() -> Self {
        EarlyStoppingConfig {
            metric: EvalMetric::EvalLoss,
            mode: None,
            patience: 3,
            min_delta: 0.0,
        }
    }
}

impl EarlyStoppingConfig {
    pub fn mode(&self) -> MetricMode {
        self.mode.unwrap_or(self.metric.default_mode())
    }
}

impl TrainConfig {
    /// Epochs, steps, batch and accumulation at least 1; early stopping's patience and delta.
    pub(super) fn check(&self, r: &Resolved) -> Result<(), ConfigError> {
        at_least(r, "train.epochs", self.epochs, 1)?;
        if let Some(m) = self.max_steps {
            at_least(r, "train.max_steps", m, 1)?;
        }
        at_least(r, "train.batch_size", self.batch_size, 1)?;
        at_least(r, "train.grad_accum_steps", self.grad_accum_steps, 1)?;
        at_least(r, "train.log_every", self.log_every, 1)?;
        if let Some(e) = &self.early_stopping {
            at_least(r, "train.early_stopping.patience", e.patience, 1)?;
            in_range(
                r,
                "train.early_stopping.min_delta",
                e.min_delta,
                e.min_delta >= 0.0,
                "at least 0",
            )?;
        }
        Ok(())
    }
}
