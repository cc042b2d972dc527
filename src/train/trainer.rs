//! The step loop of one rank: micro-batches from the sampler, accumulation, the strategy's
//! synchronisation and update, the LR schedule, exact evaluation and metrics events.

use std::time::Instant;

use serde::Serialize;

use super::loader::{Assembler, Loader, LoaderState, Pos, Source};
use super::schedule::lr_at;
use super::step::{micro_step, MicroOpts};
use super::timing::{Clock, Phase, Span, Totals};
use crate::checkpoint::{
    encode_files, CheckpointError, DataPosition, Loaded, OptimizerInfo, RngState, SchedulerInfo,
    State, Store, Watched, FORMAT,
};
use crate::collective::CollectiveError;
use crate::config::{Config, EvalMetric, MetricMode};
use crate::data::{Augment, Data, Dataset};
use crate::model::{Batch, Compute, ComputeOn, Model, ModelError, StepKey, Task};
use crate::params::{DeviceFlat, DeviceTensor, RawFn};
use crate::plan::{DataSplit, Plan};
use crate::strategy::{Memory, Strategy};

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
    /// Classification only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_accuracy: Option<f64>,
    /// Language models only: exp(eval_loss).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_perplexity: Option<f64>,
    /// When the line was logged: seconds since the Unix epoch (wall-clock plots).
    pub ts: f64,
    /// This rank's share of the time since the previous logged line, by phase.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time: Option<serde_json::Value>,
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
        line: Option<MetricLine>,
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
    /// Where `train.early_stopping` and `checkpoint.keep_best` stand at the end.
    pub early_stopping: Option<Watched>,
    pub best: Option<Watched>,
}

/// A metric watched at each evaluation (early stopping, the best checkpoint).
struct Watch {
    metric: EvalMetric,
    mode: MetricMode,
    min_delta: f64,
    state: Option<Watched>,
}

impl Watch {
    /// Watching `metric`, continuing from `resumed` when it watched the same metric the same way.
    fn new(
        metric: EvalMetric,
        mode: MetricMode,
        min_delta: f64,
        resumed: Option<&Watched>,
    ) -> Watch {
        let mode_name = mode_name(mode);
        Watch {
            metric,
            mode,
            min_delta,
            state: resumed
                .filter(|w| w.metric == metric.name() && w.mode == mode_name)
                .cloned(),
        }
    }
    /// Records the value at an evaluation at `step`; whether it improved on the best by more
    /// than `min_delta` (a NaN never does).
    fn observe(&mut self, sums: &EvalSums, step: usize) -> bool {
        let value = match self.metric {
            EvalMetric::EvalLoss => sums.loss(),
            EvalMetric::EvalAccuracy => sums.accuracy(),
            EvalMetric::EvalPerplexity => sums.perplexity(),
        };
        // (a best is always finite: state.json holds it as a JSON number)
        let better = value.is_finite()
            && match &self.state {
                None => true,
                Some(w) => match self.mode {
                    MetricMode::Min => value < w.best - self.min_delta,
                    MetricMode::Max => value > w.best + self.min_delta,
                },
            };
        match &mut self.state {
            Some(w) if !better => w.bad_evals += 1,
            _ if better => {
                self.state = Some(Watched {
                    metric: self.metric.name().to_string(),
                    mode: mode_name(self.mode).to_string(),
                    best: value,
                    best_step: step,
                    bad_evals: 0,
                })
            }
            _ => {}
        }
        better
    }
    fn bad_evals(&self) -> usize {
        self.state.as_ref().map_or(0, |w| w.bad_evals)
    }
}

fn mode_name(mode: MetricMode) -> &'static str {
    match mode {
        MetricMode::Min => "min",
        MetricMode::Max => "max",
    }
}

impl Outcome {
    /// Tokens per second for a language model.
    pub fn tokens_per_sec(&self) -> Option<f64> {
        match self.task {
            Task::LanguageModel { block, .. } => Some(round4(self.samples_per_sec * block as f64)),
            Task::Classification { .. } => None,
        }
    }
    /// Evaluation accuracy (classification) or perplexity (language model).
    pub fn eval_accuracy(&self) -> Option<f64> {
        match self.task {
            Task::Classification { .. } => self.eval.map(|e| e.accuracy()),
            Task::LanguageModel { .. } => None,
        }
    }
    pub fn eval_perplexity(&self) -> Option<f64> {
        match self.task {
            Task::LanguageModel { .. } => self.eval.map(|e| e.perplexity()),
            Task::Classification { .. } => None,
        }
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
    #[error("rank {rank} panicked: {message}")]
    Panic { rank: usize, message: String },
    /// The data loader could not give the next micro-batch.
    #[error("{0}")]
    Data(String),
}

/// Everything the loop needs, built before it starts (shared by all ranks).
pub struct TrainInput<'a> {
    pub config: &'a Config,
    pub plan: &'a Plan,
    pub data: &'a Data,
    pub model: &'a dyn Model,
    /// Where checkpoints go (`None`: never saved, e.g. `kiln bench`).
    pub store: Option<&'a Store>,
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

/// Where a checkpoint's data position continues: exactly (same world, batch and strategy) or by
/// the global cursor.
fn resume_pos(plan: &Plan, c: &Config, s: &State) -> Pos {
    let p = s.position;
    let same = s.world_size == plan.world_size
        && s.micro_batch == plan.micro_batch
        && s.strategy == format!("{:?}", c.strategy.kind).to_lowercase();
    if same {
        Pos {
            epoch: p.epoch,
            start: p.segment_start,
            j: p.segment_micro,
        }
    } else {
        Pos {
            epoch: p.epoch,
            start: p.cursor,
            j: 0,
        }
    }
    .normalize(plan)
}

/// Steps the run ends at, from step `step` at position `pos`.
fn total_steps(c: &Config, plan: &Plan, step: usize, pos: Pos) -> usize {
    if let Some(m) = c.train.max_steps {
        return m;
    }
    let epochs = c.train.epochs as u64;
    let remaining = if pos.epoch < epochs {
        (plan.segment_micro(pos.start) - pos.j)
            + (epochs - pos.epoch - 1) as usize * plan.micro_per_epoch
    } else {
        0
    };
    step + remaining.div_ceil(plan.accum)
}

/// Where a rank sends what it has to say.
pub trait RankSink {
    /// Progress and metrics (only rank 0's are shown and written).
    fn event(&mut self, event: TrainEvent);
    /// A line for this rank's log.
    fn log(&mut self, line: &str);
}

/// `[rows, ...sample shape]`.
fn batch_shape(rows: usize, ds: &Dataset) -> Vec<usize> {
    let mut shape = Vec::with_capacity(1 + ds.shape.len());
    shape.push(rows);
    shape.extend(&ds.shape);
    shape
}

/// Per-sample losses and correctness of `params` on the rows `idx` of `ds`, in batches of
/// `batch`.
fn evaluate<B: ComputeOn>(
    compute: &dyn Compute<B>,
    params: &[f32],
    ds: &Dataset,
    idx: &[usize],
    batch: usize,
) -> Result<(Vec<f64>, Vec<f64>), ModelError> {
    let mut batches = idx.chunks(batch.max(1)).map(|chunk| {
        let (x, y) = ds.gather(chunk);
        Batch {
            x,
            shape: batch_shape(chunk.len(), ds),
            y,
        }
    });
    let out = compute.evaluate(params, &mut batches)?;
    Ok((out.losses, out.correct))
}

/// Evaluates `params` on `ds` exactly as a run of `world` ranks with micro-batches of `batch`
/// does: rank r's samples r, r + world, ... in its batches, summed in global index order. So
/// the sums are the bits the run logged (`kiln eval`).
pub fn evaluate_like_run<B: ComputeOn>(
    compute: &dyn Compute<B>,
    params: &[f32],
    ds: &Dataset,
    world: usize,
    batch: usize,
) -> Result<EvalSums, ModelError> {
    let world = world.max(1);
    let per_rank = (0..world)
        .map(|r| {
            let idx: Vec<usize> = (r..ds.len()).step_by(world).collect();
            evaluate(compute, params, ds, &idx, batch)
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(sum_in_global_order(ds.len(), world, |r, p| {
        (per_rank[r].0[p], per_rank[r].1[p])
    }))
}

/// The sums of `n` per-sample (loss, correct) results spread over `world` ranks (global index i
/// on rank i % world at position i / world, as `get(rank, position)` gives them), added in
/// global index order: the same bits for every world size.
fn sum_in_global_order(
    n: usize,
    world: usize,
    get: impl Fn(usize, usize) -> (f64, f64),
) -> EvalSums {
    let mut sums = EvalSums::default();
    for i in 0..n {
        let (loss, correct) = get(i % world, i / world);
        sums.loss_sum += loss;
        sums.correct += correct;
        sums.count += 1;
    }
    sums
}

/// Runs the whole training of one rank. `raw_fn` is how the backend exposes device addresses
/// (CUDA): with it, and a collective that works on device buffers (NCCL), gradients stay on the
/// device until they are reduced.
pub fn train<B: ComputeOn>(
    input: &TrainInput<'_>,
    strategy: &mut dyn Strategy,
    device: &B::Device,
    raw_fn: Option<RawFn<B::InnerBackend>>,
    sink: &mut dyn RankSink,
    clock: &Clock,
) -> Result<Outcome, TrainError> {
    let TrainInput {
        config: c,
        plan,
        data,
        model,
        ..
    } = *input;
    let compute = B::compute(model, device);
    let task = model.task();
    let lm = matches!(task, Task::LanguageModel { .. });
    let tokens_per_sample = task.targets_per_sample();
    let rank = strategy.rank();
    let world = strategy.world();
    let (mut step, mut pos) = match input.resume {
        Some(l) => {
            strategy.init(&l.params)?;
            strategy.load_optimizer(&l.opt);
            (l.state.step, resume_pos(plan, c, &l.state))
        }
        None => {
            match input.init {
                Some(p) => strategy.init(p)?,
                None => {
                    // one seeded initialisation for the process's ranks, freed once they took it
                    let init = input.shared_init.get(|| model.init(c.experiment.seed));
                    strategy.init(&init)?;
                }
            }
            (
                0,
                Pos {
                    epoch: 0,
                    start: 0,
                    j: 0,
                },
            )
        }
    };
    let first_step = step;
    let total = total_steps(c, plan, step, pos);
    let exhausted = |p: Pos| c.train.max_steps.is_none() && p.epoch >= c.train.epochs as u64;
    // Exact evaluation: rank r takes eval indices r, r+world, ... (no padding).
    let eval_idx: Vec<usize> = data
        .eval
        .as_ref()
        .map(|d| (rank..d.len()).step_by(world).collect())
        .unwrap_or_default();
    sink.event(TrainEvent::Started {
        first_step,
        total_steps: total,
    });
    sink.log(&format!("rank {rank}/{world}: {}", plan.describe()));
    if first_step > 0 {
        sink.log(&format!(
            "resumed at step {first_step}, epoch {}, cursor {}",
            pos.epoch,
            plan.cursor(pos.start, pos.j)
        ));
    }

    let raw_fn = raw_fn.filter(|_| strategy.comm_mut().device_ops().is_some());
    if raw_fn.is_some() {
        sink.log(
            "gradients: accumulated and reduced on the device (NCCL on the backend's buffers)",
        );
        use crate::config::{Precision, Sharding, StrategyKind};
        let f32_params = c.backend.precision == Precision::F32;
        sink.log(match c.strategy.kind {
            StrategyKind::Single | StrategyKind::Ddp | StrategyKind::Dp if f32_params => {
                "parameters and optimizer state: on the device, where the update runs (copied to the host for evaluation and checkpoints)"
            }
            StrategyKind::Fsdp if c.strategy.sharding == Sharding::Full => {
                "parameters: shards on the host, all-gathered into device buffers for the forward; the optimizer runs on the host shard"
            }
            _ => "parameters: on the host, where the optimizer runs (uploaded for each forward)",
        });
    }
    // a device buffer that device gathers are made like
    let proto: Option<Box<dyn DeviceTensor>> = raw_fn.map(|f| {
        Box::new(DeviceFlat::<B::InnerBackend>::new(
            burn::tensor::Tensor::zeros([1], device),
            f,
        )) as Box<dyn DeviceTensor>
    });
    // this rank's measured peak counts from here
    let memory_key = crate::memory::attributed();
    if let Some(k) = memory_key {
        crate::memory::reset_peak(k);
    }
    let checkpointing =
        c.train.activation_checkpointing == crate::config::ActivationCheckpointing::Units;
    let start = Instant::now();
    let mut window_start = Instant::now();
    let mut window_samples = 0.0;
    let mut samples_total = 0.0;
    // a resumed run that has no step left still reports the loss it reached
    let mut last_loss = input.resume.map_or(f64::NAN, |l| l.state.last_loss);
    let mut last_eval = None;
    let mut preempted = None;
    let mut stopped_early = None;
    let resumed_state = input.resume.map(|l| &l.state);
    let mut early = c.train.early_stopping.as_ref().map(|e| {
        Watch::new(
            e.metric,
            e.mode(),
            e.min_delta,
            resumed_state.and_then(|s| s.early_stopping.as_ref()),
        )
    });
    let mut best = c.checkpoint.keep_best.as_ref().map(|b| {
        Watch::new(
            b.metric,
            b.mode(),
            0.0,
            resumed_state.and_then(|s| s.best.as_ref()),
        )
    });
    let order_rank = match plan.split {
        DataSplit::Distributed => rank,
        DataSplit::SplitBatch => 0,
    };
    let tracing = c.profile.traces(rank);
    // the micro-batches this session will take, in the loop's order
    let source = Source::new(
        plan,
        order_rank,
        rank,
        pos,
        total.saturating_sub(step).saturating_mul(plan.accum),
        c.train.max_steps.is_none().then_some(c.train.epochs as u64),
    );
    let assembler = Assembler {
        data: &data.train,
        task,
        augment: Augment::new(&c.data, c.experiment.seed),
        file: data_file(c),
        rank,
    };
    let loader_state = LoaderState::new(source);
    // the breakdown covers the steps, not the set-up (module, initial broadcast, resume load)
    clock.reset();
    std::thread::scope(|scope| -> Result<(), TrainError> {
        let mut loader = if c.data.workers > 0 {
            Loader::threaded(
                scope,
                &loader_state,
                &assembler,
                c.data.workers,
                c.data.prefetch,
            )
        } else {
            Loader::inline(&loader_state, &assembler)
        };
        while step < total {
            clock.begin_step(step + 1, tracing && c.profile.records(step - first_step));
            let lr = lr_at(&c.schedule, c.optim.lr, step, total);
            // [weighted loss, samples] summed over micro-steps, then over ranks, with a stop
            // request and the ranks whose gradient is not finite riding along: every rank sees
            // them at the same step
            let mut totals = [0.0f64, 0.0, 0.0, 0.0];
            let mut micro_in_step = 0;
            pos = pos.normalize(plan);
            let epoch_at_start = pos.epoch;
            for k in 0..plan.accum {
                pos = pos.normalize(plan);
                if exhausted(pos) {
                    break;
                }
                let micro = clock
                    .time(Phase::Data, || loader.next(pos))
                    .map_err(TrainError::Data)?;
                let weight = strategy.grad_weight(micro.samples, micro.global);
                let samples = micro.samples;
                pos.j += 1;
                let last_micro = k + 1 == plan.accum || exhausted(pos.normalize(plan));
                let opts = MicroOpts::<B> {
                    checkpointing,
                    sync: last_micro || !c.strategy.no_sync,
                    proto: proto.as_deref(),
                    raw_fn,
                };
                let key = StepKey {
                    seed: c.experiment.seed,
                    counters: [step as u64, k as u64, rank as u64],
                };
                // ranks without samples run the same collectives
                let batch = micro.input.map(|b| (b, key, weight / plan.accum as f64));
                if let Some(loss) = micro_step(compute.as_ref(), strategy, batch, &opts, clock)? {
                    totals[0] += loss * weight;
                }
                totals[1] += samples as f64;
                micro_in_step += 1;
            }
            // a NaN or inf in any rank's gradient makes the averaged one non-finite too: found
            // here, before the optimizer spreads it into the parameters (and a checkpoint)
            let grad_bad = clock.time(Phase::Optimizer, || strategy.grads_non_finite())?;
            clock.time(Phase::Optimizer, || {
                strategy.update(lr, c.optim.grad_clip_norm)
            })?;
            totals[2] = super::preempt::requested().map_or(0.0, |s| s as f64);
            totals[3] = f64::from(u8::from(grad_bad));
            strategy.sum(&mut totals)?;
            let stop = totals[2] > 0.0;
            // single/ddp weights are 1 per rank: average over ranks; dp weights sum to 1 already
            let per_rank = match plan.split {
                DataSplit::Distributed => world as f64,
                DataSplit::SplitBatch => 1.0,
            };
            let loss = totals[0] / per_rank / micro_in_step.max(1) as f64;
            samples_total += totals[1];
            window_samples += totals[1];
            step += 1;
            if !loss.is_finite() {
                return Err(TrainError::Diverged {
                    step,
                    cause: format!("the loss is {loss}"),
                });
            }
            if totals[3] > 0.0 {
                let on = match (world, totals[3] as usize) {
                    (1, _) => String::new(),
                    (_, 1) => " on 1 rank".to_string(),
                    (_, n) => format!(" on {n} ranks"),
                };
                return Err(TrainError::Diverged {
                    step,
                    cause: format!(
                        "the gradient has NaN or infinite values{on}, while the loss is {loss}"
                    ),
                });
            }
            last_loss = loss;
            pos = pos.normalize(plan);

            let done = step;
            let is_last = done == total;
            let do_eval = data.eval.is_some()
                && (is_last || (c.train.eval_every > 0 && done % c.train.eval_every == 0));
            if do_eval {
                if let Some(ds) = &data.eval {
                    let sums = clock.time(Phase::Eval, || -> Result<EvalSums, TrainError> {
                        let params = strategy.params()?;
                        let (losses, correct) =
                            evaluate(compute.as_ref(), params, ds, &eval_idx, plan.micro_batch)?;
                        // fsdp: the whole parameters were gathered for this; not for the steps
                        strategy.release_params();
                        reduce_eval(strategy, &losses, &correct, ds.len())
                    })?;
                    last_eval = Some(sums);
                    let metric = match task {
                        Task::LanguageModel { .. } => format!("perplexity {}", sums.perplexity()),
                        Task::Classification { .. } => format!("accuracy {}", sums.accuracy()),
                    };
                    sink.log(&format!(
                        "eval at step {done} on {} samples: loss {}, {metric}",
                        sums.count,
                        sums.loss()
                    ));
                }
            }
            // what this evaluation means (every rank has the same sums, so decides alike)
            let mut new_best = false;
            let mut stop_early = false;
            if let (true, Some(sums)) = (do_eval, last_eval.as_ref()) {
                if let Some(w) = best.as_mut() {
                    new_best = w.observe(sums, done);
                }
                if let (Some(w), Some(cfg)) = (early.as_mut(), c.train.early_stopping.as_ref()) {
                    w.observe(sums, done);
                    stop_early = w.bad_evals() >= cfg.patience && !is_last;
                }
            }
            let elapsed = window_start.elapsed().as_secs_f64().max(1e-9);
            let sps = window_samples / elapsed;
            let log = is_last || do_eval || done % c.train.log_every == 0;
            let window = log.then(|| clock.lock().take_window());
            let line = log.then(|| MetricLine {
                ts: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| (d.as_secs_f64() * 1e3).round() / 1e3)
                    .unwrap_or(0.0),
                time: window.map(|w| w.fractions_json()),
                step: done,
                epoch: round4(pos.epochs(plan)),
                loss,
                lr,
                samples_per_sec: round4(sps),
                tokens_per_sec: lm.then(|| round4(sps * tokens_per_sample as f64)),
                eval_loss: do_eval.then(|| last_eval.map(|e| e.loss())).flatten(),
                eval_accuracy: (do_eval && !lm)
                    .then(|| last_eval.map(|e| e.accuracy()))
                    .flatten(),
                eval_perplexity: (do_eval && lm)
                    .then(|| last_eval.map(|e| e.perplexity()))
                    .flatten(),
            });
            if log {
                window_start = Instant::now();
                window_samples = 0.0;
                sink.log(&format!(
                    "step {done} loss {loss} lr {lr} samples/s {sps:.1}"
                ));
            }
            sink.event(TrainEvent::Step {
                step: done,
                loss,
                samples_per_sec: sps,
                line,
            });

            let ck = &c.checkpoint;
            let epoch_boundary = pos.epoch > epoch_at_start
                && ck.every_epochs > 0
                && pos.epoch % ck.every_epochs as u64 == 0;
            let save = (ck.every_steps > 0 && done % ck.every_steps == 0)
            || epoch_boundary
            || (is_last && ck.at_end)
            // the step early stopping ends at is always saved: without it a resume would go
            // back to an older checkpoint and train what the run decided not to
            || stop_early
            || new_best;
            // a stop before the end saves the step it stops at (once)
            let stopping = stop && !is_last;
            if let (true, Some(store)) = (save || stopping, input.store) {
                let position = DataPosition {
                    epoch: pos.epoch,
                    cursor: plan.cursor(pos.start, pos.j),
                    segment_start: pos.start,
                    segment_micro: pos.j,
                };
                clock.time(Phase::Checkpoint, || {
                    let watched = [&early, &best].map(|w| w.as_ref().and_then(|w| w.state.clone()));
                    save_checkpoint(input, strategy, store, done, position, loss, lr, watched)
                })?;
                sink.log(&format!(
                    "checkpoint step-{done:08} saved{}",
                    if new_best { " (the best so far)" } else { "" }
                ));
                sink.event(TrainEvent::Checkpoint { step: done });
            }
            // a stop request at the step early stopping ends the run: the run is complete
            if stopping && !stop_early {
                let why = match super::preempt::requested() {
                    Some(sig) => super::preempt::signal_name(sig).to_string(),
                    None => "a stop request on another rank".to_string(),
                };
                sink.log(&format!("stopped at step {done} ({why})"));
                preempted = Some(why);
                break;
            }
            if stop_early {
                if let (Some(w), Some(cfg)) = (
                    early.as_ref().and_then(|w| w.state.as_ref()),
                    c.train.early_stopping.as_ref(),
                ) {
                    sink.log(&format!(
                    "stopped early at step {done}: {} has not improved by more than {} for {} evaluations (best {} at step {})",
                    w.metric, cfg.min_delta, cfg.patience, w.best, w.best_step
                ));
                }
                stopped_early = Some(done);
                break;
            }
        }
        Ok(())
    })?;
    let wall = start.elapsed().as_secs_f64();
    // the final parameters, a unit at a time (fsdp never holds the whole model for this)
    let (params, params_sha256) = {
        use sha2::{Digest, Sha256};
        let keep = input.keep_params && rank == 0;
        let mut h = Sha256::new();
        let mut params = Vec::new();
        strategy.visit_params(&mut |p| {
            for v in p {
                h.update(v.to_le_bytes());
            }
            if keep {
                params.extend_from_slice(p);
            }
        })?;
        let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
        (params, hex)
    };
    sink.log(&format!(
        "finished {step} steps ({} this session) in {wall:.2}s",
        step - first_step
    ));
    // one lock at a time: the clock's mutex is not reentrant
    clock.end_step();
    let time = clock.lock().totals();
    let comm_time = clock.comm().totals();
    let spans = clock.take_spans();
    Ok(Outcome {
        steps: step,
        epochs: round4(pos.epochs(plan)),
        final_loss: last_loss,
        eval: last_eval,
        wall_seconds: round4(wall),
        samples_per_sec: round4(samples_total / wall.max(1e-9)),
        task,
        params,
        params_sha256,
        memory: Memory {
            peak_bytes: memory_key.and_then(crate::memory::peak_bytes),
            ..strategy.memory()
        },
        time,
        comm_time,
        spans,
        preempted,
        stopped_early,
        early_stopping: early.and_then(|w| w.state),
        best: best.and_then(|w| w.state),
    })
}

/// The training data as the config names it, for the loader's errors.
fn data_file(c: &Config) -> String {
    match &c.data.path {
        Some(p) => format!("data.path = {p:?}"),
        None => format!("the {} data", crate::config::choice_name(&c.data.kind)),
    }
}

/// Writes checkpoint `step`: rank 0 opens it, every rank writes its files, rank 0 commits.
#[allow(clippy::too_many_arguments)]
fn save_checkpoint(
    input: &TrainInput<'_>,
    strategy: &mut dyn Strategy,
    store: &Store,
    step: usize,
    position: DataPosition,
    loss: f64,
    lr: f64,
    [early_stopping, best]: [Option<Watched>; 2],
) -> Result<(), TrainError> {
    let c = input.config;
    let rank = strategy.rank();
    if rank == 0 {
        store.begin(step as u64)?;
    }
    strategy.barrier()?;
    let snap = strategy.snapshot()?;
    // never a checkpoint of NaN or infinite parameters (an optimizer step that overflowed):
    // every rank checks its part, and all agree before anything is written
    let mut bad = [snap.data.as_ref().map_or(0.0, |(p, _)| {
        f64::from(u8::from(!crate::params::all_finite(p)))
    })];
    strategy.sum(&mut bad)?;
    if bad[0] > 0.0 {
        return Err(TrainError::Diverged {
            step,
            cause: format!("the parameters have NaN or infinite values (the loss is {loss})"),
        });
    }
    if let Some((params, opt)) = &snap.data {
        let files = encode_files(
            &snap.layout,
            rank,
            &input.model.layout().specs(),
            params,
            opt,
        )
        .map_err(|why| CheckpointError::Invalid {
            path: store.dir.clone(),
            why,
        })?;
        for (name, bytes) in &files {
            store.write_file(step as u64, name, bytes)?;
        }
    }
    strategy.barrier()?;
    if rank == 0 {
        let state = State {
            format: FORMAT.to_string(),
            step,
            position,
            accum_position: 0,
            rng: RngState {
                init_seed: c.experiment.seed,
                dropout_seed: c.experiment.seed,
                sampler_seed: c.sampler.seed,
                data_seed: c.data.seed,
            },
            world_size: input.plan.world_size,
            strategy: format!("{:?}", c.strategy.kind).to_lowercase(),
            micro_batch: input.plan.micro_batch,
            grad_accum_steps: input.plan.accum,
            num_params: input.model.num_params(),
            input_shape: input.data.input_shape(),
            params: snap.layout.clone(),
            optimizer: OptimizerInfo {
                kind: format!("{:?}", c.optim.kind).to_lowercase(),
                steps: step as u64,
            },
            scheduler: SchedulerInfo {
                kind: format!("{:?}", c.schedule.kind).to_lowercase(),
                last_step: step,
                last_lr: lr,
            },
            last_loss: loss,
            config_hash: crate::config::config_hash(c),
            kiln_version: env!("CARGO_PKG_VERSION").to_string(),
            early_stopping,
            best,
        };
        store.commit(
            step as u64,
            &state,
            c.checkpoint.keep_last,
            c.checkpoint.keep_every as u64,
        )?;
    }
    strategy.barrier()?;
    Ok(())
}

/// Gathers every rank's per-sample results and sums them in global index order, so the totals
/// are identical for every world size.
fn reduce_eval(
    strategy: &mut dyn Strategy,
    losses: &[f64],
    correct: &[f64],
    n: usize,
) -> Result<EvalSums, TrainError> {
    let world = strategy.world();
    let per = n.div_ceil(world);
    let mut mine = vec![f64::NAN; 2 * per];
    mine[..losses.len()].copy_from_slice(losses);
    mine[per..per + correct.len()].copy_from_slice(correct);
    let all = strategy.gather(&mine)?;
    Ok(sum_in_global_order(n, world, |r, p| {
        (all[r * 2 * per + p], all[r * 2 * per + per + p])
    }))
}

fn round4(v: f64) -> f64 {
    (v * 1e4).round() / 1e4
}
