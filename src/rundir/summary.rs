//! `summary.json`: the schema of a run's summary.

use serde::Serialize;

use crate::config::StrategyKind;
use crate::strategy::Memory;

/// `summary.json`.
#[derive(Debug, Serialize)]
pub struct Summary {
    /// "finished", "failed", "preempted" (stopped by a signal at `steps`, with a checkpoint
    /// there; `kiln resume` continues it) or "paused" (`train.pause_at_step`, likewise).
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What stopped a preempted run, e.g. "SIGTERM".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped_by: Option<String>,
    /// With `train.early_stopping`: whether it ended the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped_early: Option<bool>,
    /// With `train.early_stopping`: the best value, its step, and where the run stopped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub early_stopping: Option<EarlyStopSummary>,
    /// With `checkpoint.keep_best`: the best checkpoint and its metric.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub best_checkpoint: Option<BestSummary>,
    pub steps: usize,
    pub epochs: f64,
    pub final_loss: Option<f64>,
    pub eval_loss: Option<f64>,
    /// Classification only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_accuracy: Option<f64>,
    /// Language models only: exp(eval_loss).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_perplexity: Option<f64>,
    /// Evaluation samples counted (each exactly once, whatever the world size).
    pub eval_samples: Option<u64>,
    pub wall_seconds: f64,
    pub samples_per_sec: f64,
    /// Language models only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_per_sec: Option<f64>,
    pub world_size: usize,
    pub strategy: StrategyKind,
    pub global_batch: usize,
    pub backend: &'static str,
    /// The compute dtype (`backend.precision`): f32, bf16 or f16 (parameters and optimizer
    /// state are f32 masters below f32).
    pub precision: crate::config::Precision,
    /// f16's dynamic loss scaling at the end: the scale, its count of good steps and the steps
    /// it skipped (their gradient overflowed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loss_scale: Option<crate::checkpoint::LossScaleState>,
    pub num_params: usize,
    /// Parameters that train (`num_params` less the frozen ones: `model.freeze`, LoRA's base).
    pub trainable_params: usize,
    pub config_hash: String,
    /// The step this session started from (0 unless resumed).
    pub resumed_from_step: usize,
    /// sha256 of the final parameters (little-endian f32), to compare runs bit for bit.
    pub params_sha256: Option<String>,
    /// Per rank: the model state's bytes (parameters, gradients and optimizer state, by
    /// formula) and the measured peak (`peak_bytes`).
    pub memory: Vec<Memory>,
    /// This process's peak resident set size in bytes (node 0's process for a multi-node run).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_rss_bytes: Option<u64>,
    /// Training FLOPs per sample (forward and backward), for models whose count kiln knows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flops_per_sample: Option<f64>,
    /// Achieved training FLOP/s (`flops_per_sample` x `samples_per_sec`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flops_per_sec: Option<f64>,
    /// Model FLOP utilisation against the GPUs' peak (CUDA on A100, H100, H200).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mfu: Option<f64>,
    /// Why there is no `mfu`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mfu_note: Option<String>,
    /// The checkpoints this session saved: how long training was blocked by them and how long
    /// background writers took (`checkpoint.async`), rank 0's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<CheckpointSummary>,
    /// Where the time went: `step_ms`, `clock`, and seconds and fractions per phase, as a mean
    /// and per rank of this node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time: Option<serde_json::Value>,
}

/// `summary.json`'s `checkpoint`.
#[derive(Debug, Clone, Serialize)]
pub struct CheckpointSummary {
    #[serde(rename = "async")]
    pub async_save: bool,
    pub saves: usize,
    /// Seconds the training waited for checkpoints (copies to host memory, a previous save
    /// still in flight; with `async = false` the whole writes).
    pub blocked_seconds: f64,
    /// Seconds the background writers took beside the training (0 with `async = false`).
    pub background_seconds: f64,
}

/// `summary.json`'s `early_stopping`.
#[derive(Debug, Clone, Serialize)]
pub struct EarlyStopSummary {
    #[serde(flatten)]
    pub watched: crate::checkpoint::WatchState,
    /// The step early stopping ended the run at (absent when it ran to its end).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped_at_step: Option<usize>,
}

/// `summary.json`'s `best_checkpoint`.
#[derive(Debug, Clone, Serialize)]
pub struct BestSummary {
    /// Its directory name, e.g. `step-00000040`.
    pub checkpoint: String,
    #[serde(flatten)]
    pub watched: crate::checkpoint::WatchState,
}
