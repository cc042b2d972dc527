//! What a rank's training takes in and gives out: its inputs, the events and metric lines it
//! sends, how it ended and how it failed (kept apart from the step loop, which every other file
//! of `train/` would otherwise import back).

use serde::Serialize;

use super::timing::{Span, Totals};
use crate::checkpoint::{CheckpointDir, CheckpointError, Loaded, LossScaleState, WatchState};
use crate::collective::CollectiveError;
use crate::config::Config;
use crate::data::Data;
use crate::model::{Model, ModelError, Task};
use crate::plan::Plan;
use crate::strategy::Memory;

/// One line of `metrics.jsonl`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct MetricLine {
    pub step: usize,
    pub epoch: f64,
    pub loss: f64,
    pub lr: f64,
    pub samples_per_sec: f64,
    /// A language model's tokens per second (samples/s times the tokens predicted per window).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_per_sec: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_loss: Option<f64>,
    /// The part of `loss` that is the model's own: Mixtral's `router_aux_loss_coef` x its
    /// load-balancing loss.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aux_loss: Option<f64>,
    /// Classification only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_accuracy: Option<f64>,
    /// Language models only: exp(eval_loss).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_perplexity: Option<f64>,
    /// f16's dynamic loss scale the step ran with (`backend.precision = "f16"`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loss_scale: Option<f64>,
    /// Set on a step f16's loss scaling skipped (its gradient overflowed: no update).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub skipped: bool,
    /// When the line was logged: seconds since the Unix epoch (wall-clock plots).
    pub ts: f64,
    /// This rank's share of the time since the previous logged line, by phase.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time: Option<serde_json::Value>,
    /// The mean training step since the previous logged line, in ms: this rank's time in the
    /// step's phases (evaluation and checkpoints left out) over its steps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_ms: Option<f64>,
}

/// What the loop reports while it runs (rank 0 only).
#[derive(Debug, Clone)]
pub enum TrainEvent {
    Started {
        first_step: usize,
        total_steps: usize,
    },
    /// A checkpoint was written.
    Checkpoint { step: usize },
    /// A step finished (`line` is set when it is a logged step).
    Step {
        step: usize,
        loss: f64,
        samples_per_sec: f64,
        line: Option<Box<MetricLine>>,
    },
}

/// The result of a finished run on one rank.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub steps: usize,
    pub epochs: f64,
    pub final_loss: f64,
    pub eval: Option<EvalSums>,
    pub wall_seconds: f64,
    pub samples_per_sec: f64,
    /// What the model was trained to do (which metrics apply).
    pub task: Task,
    /// The final parameters, on rank 0 when `TrainInput::keep_params` asked for them (empty
    /// otherwise).
    pub params: Vec<f32>,
    /// sha256 of the final parameters (f32 little-endian, flat order).
    pub params_sha256: String,
    pub memory: Memory,
    /// Seconds per phase over this session's steps (the compute thread's: communication there
    /// is the exposed part).
    pub time: Totals,
    /// Seconds per collective op on the rank's communication thread (`strategy.overlap`).
    pub comm_time: Totals,
    /// The profiled steps' spans (empty unless `[profile]` traces this rank).
    pub spans: Vec<Span>,
    /// Set when a signal stopped the run before its end (at `steps`, with a checkpoint there):
    /// what asked, e.g. "SIGTERM".
    pub preempted: Option<String>,
    /// The step at which `train.early_stopping` stopped the run.
    pub stopped_early: Option<usize>,
    /// The step `train.pause_at_step` ended this session at (with a checkpoint there).
    pub paused: Option<usize>,
    /// Where `train.early_stopping` and `checkpoint.keep_best` stand at the end.
    pub early_stopping: Option<WatchState>,
    pub best: Option<WatchState>,
    /// f16's loss scale at the end, with the steps it skipped.
    pub loss_scale: Option<LossScaleState>,
    /// The checkpoints this session saved, the wall seconds training waited for them (the
    /// whole saves when synchronous) and the seconds their background writers took
    /// (`checkpoint.async`).
    pub saves: usize,
    pub blocked_seconds: f64,
    pub background_seconds: f64,
}

impl Outcome {
    /// Tokens per second for a language model.
    pub fn tokens_per_sec(&self) -> Option<f64> {
        match self.task {
            Task::LanguageModel { block, .. } => Some(round4(self.samples_per_sec * block as f64)),
            Task::Classification { .. } => None,
        }
    }
    /// The final evaluation's metrics.
    pub fn eval_metrics(&self) -> Option<EvalMetrics> {
        self.eval.map(|e| EvalMetrics::of(self.task, &e))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Collective(#[from] CollectiveError),
    /// The loss, the gradient or the parameters stopped being finite at `step`.
    #[error("training diverged at step {step}: {cause}\n  = help: lower `optim.lr`, set `optim.grad_clip_norm`, or add warm-up (`schedule.warmup_steps`)")]
    Diverged { step: usize, cause: String },
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The rank's device cannot run the config (a precision it lacks).
    #[error("rank {rank}: {reason}")]
    Backend { rank: usize, reason: String },
    #[error("rank {rank} panicked: {message}")]
    Panic { rank: usize, message: String },
    /// The data loader could not give the next micro-batch.
    #[error("{0}")]
    Data(String),
    /// The data the loader reached is bad (a record that is not what it should be, an id past
    /// the vocabulary): bad input, found mid-run.
    #[error("{0}")]
    BadData(String),
}

/// Everything the loop needs, built before it starts (shared by all ranks).
pub struct TrainInput<'a> {
    pub config: &'a Config,
    pub plan: &'a Plan,
    pub data: &'a Data,
    pub model: &'a dyn Model,
    /// Where checkpoints go (`None`: never saved, e.g. `kiln bench`).
    pub store: Option<&'a CheckpointDir>,
    /// The checkpoint to continue from.
    pub resume: Option<&'a Loaded>,
    /// Initial parameters in place of the model's seeded initialisation (`model.init_from`).
    pub init: Option<&'a [f32]>,
    /// The seeded initialisation, made once for the ranks of this process (`SharedInit::default()`).
    pub shared_init: SharedInit,
    /// Whether rank 0's `Outcome::params` holds the final parameters (tests, exports); a run
    /// needs only their hash.
    pub keep_params: bool,
}

/// The seeded initial parameters, made by the first rank that asks and shared with the others
/// of this process while any holds them: the process holds one copy at start, not one per rank.
#[derive(Default)]
pub struct SharedInit(std::sync::Mutex<std::sync::Weak<Vec<f32>>>);

impl SharedInit {
    /// The shared parameters, made with `make` when no rank holds them now.
    pub fn get(&self, make: impl FnOnce() -> Vec<f32>) -> std::sync::Arc<Vec<f32>> {
        let mut cell = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(init) = cell.upgrade() {
            return init;
        }
        let init = std::sync::Arc::new(make());
        *cell = std::sync::Arc::downgrade(&init);
        init
    }
}

/// Where a rank sends what it has to say.
pub trait RankSink {
    /// Progress and metrics (only rank 0's are shown and written).
    fn event(&mut self, event: TrainEvent);
    /// A line for this rank's log.
    fn log(&mut self, line: &str);
}

/// `v` to 4 decimals (metrics and the summary).
pub(super) fn round4(v: f64) -> f64 {
    (v * 1e4).round() / 1e4
}

/// Exact evaluation totals: every sample counted once.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EvalSums {
    pub loss_sum: f64,
    /// Correct predictions (a language model's samples count the fraction of their tokens).
    pub correct: f64,
    pub count: u64,
}

impl EvalSums {
    pub fn loss(&self) -> f64 {
        self.loss_sum / self.count.max(1) as f64
    }
    pub fn accuracy(&self) -> f64 {
        self.correct / self.count.max(1) as f64
    }
    /// exp(mean loss): a language model's perplexity.
    pub fn perplexity(&self) -> f64 {
        self.loss().exp()
    }
}

/// What an evaluation reports, decided once for the task: the mean loss, and accuracy for a
/// classifier or perplexity (exp of the mean loss) for a language model, over `samples`. The
/// metrics lines, the eval log line, `summary.json`, `kiln eval` and a run's last line all take
/// it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EvalMetrics {
    pub loss: f64,
    pub accuracy: Option<f64>,
    pub perplexity: Option<f64>,
    pub samples: u64,
}

impl EvalMetrics {
    pub fn of(task: Task, sums: &EvalSums) -> EvalMetrics {
        let lm = matches!(task, Task::LanguageModel { .. });
        EvalMetrics {
            loss: sums.loss(),
            accuracy: (!lm).then(|| sums.accuracy()),
            perplexity: lm.then(|| sums.perplexity()),
            samples: sums.count,
        }
    }

    /// The task's metric by its name and value, `accuracy 0.5` or `perplexity 3.2`, with
    /// `value` formatting the number.
    pub fn metric(&self, value: impl Fn(f64) -> String) -> String {
        match (self.accuracy, self.perplexity) {
            (Some(a), _) => format!("accuracy {}", value(a)),
            (None, Some(p)) => format!("perplexity {}", value(p)),
            (None, None) => String::new(),
        }
    }
}
