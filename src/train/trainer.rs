//! The step loop of one rank, as a `Trainer`: `step` runs one optimizer step (its micro-steps,
//! unit by unit, in `step.rs`; the strategy's update), and `after_step` does what follows one
//! when it is due: evaluation (`eval.rs`), early stopping and the best checkpoint (`watch.rs`),
//! the metrics line, a checkpoint (`save.rs`) and a stop request (`preempt.rs`).

use std::sync::Arc;
use std::time::Instant;

use super::eval::{evaluate, evaluate_by_units, reduce_eval};
use super::events::{
    round4, EvalMetrics, EvalSums, MetricLine, Outcome, RankSink, TrainError, TrainEvent,
    TrainInput,
};
use super::loader::{data_file, Assembler, Loader, LoaderState, Pos, Source, Taken};
use super::placement::Placement;
use super::save::{Checkpointer, Progress};
use super::scaler::LossScaler;
use super::schedule::lr_at;
use super::start::{start_from, total_steps};
use super::step::{micro_step, resident, MicroOpts};
use super::timing::{Clock, Phase};
use super::totals::StepTotals;
use super::watch::MetricWatch;
use crate::checkpoint::{DataPosition, DocumentsPosition};
use crate::config::Config;
use crate::data::Augment;
use crate::model::{Compute, ComputeOn, StepKey, Task};
use crate::params::RawFn;
use crate::plan::DataSplit;
use crate::strategy::{with_params, Memory, Strategy};

/// What one step did.
struct Stepped {
    loss: f64,
    /// The part of `loss` that is the model's own (Mixtral's load-balancing loss).
    own_loss: Option<f64>,
    lr: f64,
    /// The loss scale it ran with (f16), and whether its gradient overflowed so it was skipped.
    loss_scale: Option<f64>,
    skipped: bool,
    /// A rank was asked to stop (a signal), seen by every rank at this step.
    stop: bool,
    /// The epoch the step began in.
    epoch_at_start: u64,
}

/// Why the loop ended before its last step.
enum Ending {
    /// A stop request: what asked.
    Preempted(String),
    /// Early stopping, at this step.
    Stopped(usize),
    /// `train.pause_at_step`, at this step.
    Paused(usize),
}

/// One rank's training between steps.
struct Trainer<'a, B: ComputeOn> {
    input: &'a TrainInput<'a>,
    strategy: &'a mut dyn Strategy,
    sink: &'a mut dyn RankSink,
    clock: &'a Clock,
    compute: Box<dyn Compute<B>>,
    task: Task,
    rank: usize,
    world: usize,
    /// Steps done; the data position the next one starts at.
    step: usize,
    pos: Pos,
    first_step: usize,
    total: usize,
    checkpointing: bool,
    /// Where this rank computes and keeps its state, chosen once here.
    placement: Placement<B::InnerBackend>,
    /// This thread's transfer counts when the rank started.
    transfers_start: crate::params::Transfers,
    eval: Evaluation,
    tracing: bool,
    window: Window,
    samples_total: f64,
    last_loss: f64,
    /// f16's dynamic loss scaling.
    scaler: Option<LossScaler>,
    saving: Saving<'a>,
    /// Training documents: where their stream stands after the last micro-batch taken.
    documents: Option<Arc<DocumentsPosition>>,
}

/// The steps since the previous metrics line, whose throughput it reports.
struct Window {
    start: Instant,
    samples: f64,
    steps: usize,
}

/// Evaluation: this rank's samples, the last result, and what watches the results.
struct Evaluation {
    /// This rank's evaluation samples: r, r + world, ... (no padding).
    idx: Vec<usize>,
    last: Option<EvalSums>,
    early_stopping: Option<MetricWatch>,
    best: Option<MetricWatch>,
}

/// Checkpoints: where they go (none without a run directory), the saves so far, and the wall
/// seconds training waited for them (the phase breakdown charges a save's barriers to the
/// barrier phase; this counts the whole wait).
struct Saving<'a> {
    checkpointer: Option<Checkpointer<'a>>,
    saves: usize,
    blocked: f64,
}

impl<'a, B: ComputeOn> Trainer<'a, B> {
    /// The trainer at its first step: the strategy holds the initial (or resumed) parameters.
    fn new(
        input: &'a TrainInput<'a>,
        strategy: &'a mut dyn Strategy,
        device: &B::Device,
        raw_fn: Option<RawFn<B::InnerBackend>>,
        sink: &'a mut dyn RankSink,
        clock: &'a Clock,
    ) -> Result<Self, TrainError> {
        let TrainInput {
            config: c,
            plan,
            data,
            model,
            ..
        } = *input;
        let rank = strategy.rank();
        let world = strategy.world();
        let (step, pos) = start_from(input, strategy)?;
        let total = total_steps(c, plan, step, pos);
        sink.event(TrainEvent::Started {
            first_step: step,
            total_steps: total,
        });
        sink.log(&format!("rank {rank}/{world}: {}", plan.describe()));
        if step > 0 {
            sink.log(&format!(
                "resumed at step {step}, epoch {}, cursor {}",
                pos.epoch,
                plan.cursor(pos.start, pos.j)
            ));
        }
        let transfers_start = crate::params::transfers::counted();
        // torch's CPU offload keeps parameters, gradients and optimizer state on the host
        let placement = Placement::choose(raw_fn, c.strategy.offload, device);
        if let Some(p) = placement.proto() {
            if let Some(d) = strategy.on_device() {
                d.keep(p);
            }
        }
        let resumed = input.resume.map(|l| &l.state);
        let early_stopping = c.train.early_stopping.as_ref().map(|e| {
            MetricWatch::new(
                e.metric,
                e.mode(),
                e.min_delta,
                resumed.and_then(|s| s.early_stopping.as_ref()),
            )
        });
        let best = c.checkpoint.keep_best.as_ref().map(|b| {
            MetricWatch::new(
                b.metric,
                b.mode(),
                0.0,
                resumed.and_then(|s| s.best.as_ref()),
            )
        });
        let scaler = (c.backend.precision == crate::config::Precision::F16).then(|| {
            LossScaler::new(
                &c.backend.loss_scale,
                resumed.and_then(|s| s.loss_scale.as_ref()),
            )
        });
        Ok(Trainer {
            documents: resumed.and_then(|s| s.documents.clone()).map(Arc::new),
            scaler,
            saving: Saving {
                checkpointer: input
                    .store
                    .map(|store| Checkpointer::new(store, c.checkpoint.async_save)),
                saves: 0,
                blocked: 0.0,
            },
            compute: B::compute(model, device, c.backend.fused),
            task: model.task(),
            rank,
            world,
            step,
            pos,
            first_step: step,
            total,
            checkpointing: c.train.activation_checkpointing
                == crate::config::ActivationCheckpointing::Units,
            placement,
            transfers_start,
            eval: Evaluation {
                idx: data
                    .eval
                    .as_ref()
                    .map(|d| (rank..d.len()).step_by(world).collect())
                    .unwrap_or_default(),
                last: None,
                early_stopping,
                best,
            },
            tracing: c.profile.traces(rank),
            window: Window {
                start: Instant::now(),
                samples: 0.0,
                steps: 0,
            },
            samples_total: 0.0,
            // a resumed run that has no step left still reports the loss it reached
            last_loss: input.resume.map_or(f64::NAN, |l| l.state.last_loss),
            input,
            strategy,
            sink,
            clock,
        })
    }

    fn config(&self) -> &'a Config {
        self.input.config
    }

    /// Whether the data of `train.epochs` is used up (never with `train.max_steps`).
    fn exhausted(&self, p: Pos) -> bool {
        let c = self.config();
        c.train.max_steps.is_none() && p.epoch >= c.train.epochs as u64
    }

    /// One optimizer step: its micro-steps (the last one synchronises the gradients), the
    /// update, and the loss averaged over ranks, with a stop request and non-finite
    /// gradients riding along in the same reduction so every rank decides alike.
    fn step(&mut self, loader: &mut Loader<'_, '_>) -> Result<Stepped, TrainError> {
        let c = self.config();
        let plan = self.input.plan;
        let first_step = self.first_step;
        self.clock.begin_step(
            self.step + 1,
            self.tracing && c.profile.records(self.step - first_step),
        );
        let lr = lr_at(&c.schedule, c.optim.lr, self.step, self.total);
        let mut totals = StepTotals::default();
        self.pos = self.pos.normalize(plan);
        let epoch_at_start = self.pos.epoch;
        let micro_in_step = self.micro_steps(loader, lr, &mut totals)?;
        // a NaN or inf in any rank's gradient makes the averaged one non-finite too: found
        // here, and agreed on by every rank, before the optimizer spreads it into the
        // parameters (and a checkpoint), or f16's loss scaling skips the step
        let strategy = &mut *self.strategy;
        let grad_bad = self
            .clock
            .time(Phase::Optimizer, || strategy.grads_non_finite())?;
        totals.stop = super::preempt::requested().map_or(0.0, |s| s as f64);
        totals.bad_grads = f64::from(u8::from(grad_bad));
        totals.sum_over_ranks(&mut *self.strategy)?;
        // single/ddp weights are 1 per rank: average over ranks; dp weights sum to 1 already
        let per_rank = match plan.split {
            DataSplit::Distributed => self.world as f64,
            DataSplit::SplitBatch => 1.0,
        };
        let loss = totals.weighted_loss / per_rank / micro_in_step.max(1) as f64;
        let own_loss = (totals.owns > 0.0)
            .then(|| totals.weighted_own / per_rank / micro_in_step.max(1) as f64);
        self.samples_total += totals.samples;
        self.window.samples += totals.samples;
        self.window.steps += 1;
        self.step += 1;
        let step = self.step;
        if !loss.is_finite() {
            // (a loss scale cannot help: it acts on the backward only)
            let cause = match self.scaler {
                Some(_) => format!("the loss is {loss} (the f16 forward overflowed; bf16 has f32's range: `backend.precision = \"bf16\"`)"),
                None => format!("the loss is {loss}"),
            };
            return Err(TrainError::Diverged { step, cause });
        }
        let loss_scale = self.scaler.as_ref().map(|s| s.scale());
        let skipped = totals.bad_grads > 0.0 && self.scaler.is_some();
        if let Some(scaler) = self.scaler.as_mut() {
            scaler.update(skipped);
        }
        let scale_now = self.scaler.as_ref().map_or(1.0, |s| s.scale());
        if skipped && self.scaler.as_ref().is_some_and(|s| s.exhausted()) {
            // no scale fixes a gradient that overflows at every one (a NaN in the parameters or
            // the data): the run stops instead of skipping forever
            return Err(TrainError::Diverged {
                step,
                cause: format!(
                    "the f16 gradient overflowed at every loss scale down to {scale_now:e}; no scale helps (is there a NaN or an infinity in the data?)"
                ),
            });
        }
        let strategy = &mut *self.strategy;
        if skipped {
            self.clock
                .time(Phase::Optimizer, || strategy.discard_grads())?;
            self.sink.log(&format!(
                "step {step} skipped: the gradient overflowed at loss scale {}; the scale is now {scale_now}",
                loss_scale.unwrap_or(1.0),
            ));
        } else if totals.bad_grads == 0.0 {
            self.clock.time(Phase::Optimizer, || {
                strategy.update(lr, c.optim.grad_clip_norm)
            })?;
        }
        if totals.bad_grads > 0.0 && !skipped {
            let on = match (self.world, totals.bad_grads as usize) {
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
        self.last_loss = loss;
        self.pos = self.pos.normalize(plan);
        if self.placement.on_device() && step == first_step + 1 {
            self.log_placement();
        }
        Ok(Stepped {
            loss,
            own_loss,
            lr,
            loss_scale,
            skipped,
            stop: totals.stop > 0.0,
            epoch_at_start,
        })
    }

    /// The step's micro-steps (up to `train.grad_accum_steps`, fewer where the data of
    /// `train.epochs` runs out), each one's weighted loss and samples added to `totals`; returns
    /// how many ran.
    fn micro_steps(
        &mut self,
        loader: &mut Loader<'_, '_>,
        lr: f64,
        totals: &mut StepTotals,
    ) -> Result<usize, TrainError> {
        let c = self.config();
        let plan = self.input.plan;
        let mut micro_in_step = 0;
        // rows of documents weigh by their targets: the step's micro-batches are taken first,
        // and their targets counted over every rank (transformers' `num_items_in_batch`)
        let mut taken = self.take_documents(loader)?;
        let per_rank = match plan.split {
            DataSplit::Distributed => self.world as f64,
            DataSplit::SplitBatch => 1.0,
        };
        for k in 0..plan.accum {
            let mut micro = match taken.as_mut() {
                Some((micros, _)) => match micros.pop_front() {
                    Some(m) => m,
                    None => break,
                },
                None => {
                    self.pos = self.pos.normalize(plan);
                    if self.exhausted(self.pos) {
                        break;
                    }
                    let pos = self.pos;
                    let m = self
                        .clock
                        .time(Phase::Data, || loader.next(pos))
                        .map_err(TrainError::from)?;
                    self.pos.j += 1;
                    m
                }
            };
            let weight = match &taken {
                Some((_, targets)) => {
                    micro.targets as f64 * per_rank * plan.accum as f64 / targets.max(1.0)
                }
                None => self.strategy.grad_weight(micro.samples, micro.global),
            };
            let last_micro = k + 1 == plan.accum
                || match &taken {
                    Some((micros, _)) => micros.is_empty(),
                    None => self.exhausted(self.pos.normalize(plan)),
                };
            self.strategy.before_micro(
                lr,
                c.optim.grad_clip_norm,
                last_micro,
                self.scaler.is_some(),
            );
            let opts = MicroOpts::<B> {
                checkpointing: self.checkpointing,
                reshard: c.strategy.reshard_after_forward.unwrap_or(true),
                sync: last_micro || !c.strategy.no_sync,
                placement: &self.placement,
                grads: crate::model::GradScale {
                    weight: 1.0,
                    loss_scale: self.scaler.as_ref().map_or(1.0, |s| s.scale()),
                    round_to: (c.strategy.reduce_dtype != crate::config::Precision::F32)
                        .then(|| crate::params::float_dtype(c.strategy.reduce_dtype)),
                },
            };
            let key = StepKey {
                seed: c.experiment.seed,
                counters: [self.step as u64, k as u64, self.rank as u64],
                rows: std::sync::Arc::from(std::mem::take(&mut micro.ids)),
            };
            // ranks without samples run the same collectives
            let batch = micro.input.map(|b| (b, key, weight / plan.accum as f64));
            let loss = micro_step(
                self.compute.as_ref(),
                &mut *self.strategy,
                batch,
                &opts,
                self.clock,
            )?;
            if let Some((loss, own)) = loss {
                totals.weighted_loss += loss * weight;
                if let Some(own) = own {
                    totals.weighted_own += own * weight;
                    totals.owns += 1.0;
                }
            }
            totals.samples += micro.samples as f64;
            micro_in_step += 1;
        }
        Ok(micro_in_step)
    }

    /// Epochs done: of the samples, or (documents) the passes of the stream's first source.
    fn epochs(&self) -> f64 {
        match &self.documents {
            Some(d) => d.sources.first().map_or(0.0, |s| s.epoch as f64),
            None => self.pos.epochs(self.input.plan),
        }
    }

    /// Training documents: the step's micro-batches, and their targets summed over every rank
    /// (before any backward, so each micro-batch's loss weighs by its share of them); `None`
    /// for other data, whose micro-batches come one at a time.
    fn take_documents(&mut self, loader: &mut Loader<'_, '_>) -> Result<Option<Taken>, TrainError> {
        if !self.input.data.train.is_stream() {
            return Ok(None);
        }
        let (clock, accum) = (self.clock, self.input.plan.accum);
        let micros = clock
            .time(Phase::Data, || loader.take(&mut self.pos, accum))
            .map_err(TrainError::from)?;
        for note in micros.iter().flat_map(|m| &m.notes) {
            self.sink.log(note);
        }
        let mut targets = [micros.iter().map(|m| m.targets as f64).sum::<f64>()];
        self.documents = micros.back().and_then(|m| m.documents.clone());
        self.strategy.sum(&mut targets)?;
        Ok(Some((micros, targets[0])))
    }

    /// Where the rank keeps what on its device backend, as the first step left it (rank logs).
    fn log_placement(&mut self) {
        let grads = match (self.placement.raw_fn().is_some(), self.strategy.comm_mut().device_ops().is_some()) {
            (true, true) => "gradients: on the device, reduced there by NCCL",
            (true, false) if self.world > 1 => {
                "gradients: on the device; collectives host-staged (read to the host, reduced there, written back)"
            }
            (true, false) => "gradients: on the device",
            (false, _) => "gradients: read to the host after each unit's backward (strategy.offload = \"cpu\")",
        };
        self.sink.log(grads);
        let placement = self.strategy.placement();
        self.sink.log(&placement);
    }

    /// Evaluates the current parameters exactly (every rank takes part).
    fn evaluate(&mut self) -> Result<Option<EvalSums>, TrainError> {
        let Some(ds) = &self.input.data.eval else {
            return Ok(None);
        };
        let micro_batch = self.input.plan.micro_batch;
        let (compute, strategy, idx) = (self.compute.as_ref(), &mut *self.strategy, &self.eval.idx);
        let placement = &self.placement;
        // the most batches any rank has (rank 0 has the most samples)
        let batches = ds.len().div_ceil(self.world).div_ceil(micro_batch.max(1));
        let sums = self
            .clock
            .time(Phase::Eval, || -> Result<EvalSums, TrainError> {
                // parameters kept on the device are read there, unit by unit
                let by_units =
                    strategy.shards_params() || (placement.proto().is_some() && resident(strategy));
                let out = if by_units {
                    evaluate_by_units(compute, strategy, ds, idx, micro_batch, batches, placement)
                        .inspect(|_| strategy.release_params())?
                } else {
                    // fsdp by model: the whole parameters are gathered for this, not for the steps
                    with_params(strategy, |params| {
                        if placement.on_device() {
                            crate::params::transfers::record(
                                crate::params::Moved::ParamsToDevice,
                                params.len(),
                            );
                        }
                        evaluate(compute, params, ds, idx, micro_batch)
                    })??
                };
                reduce_eval(strategy, &out, ds.len(), ds.is_packed())
            })?;
        let metric = EvalMetrics::of(self.task, &sums).metric(|v| v.to_string());
        let unit = if ds.is_packed() { "tokens" } else { "samples" };
        self.sink.log(&format!(
            "eval at step {} on {} {unit}: loss {}, {metric}",
            self.step,
            sums.count,
            sums.loss()
        ));
        Ok(Some(sums))
    }

    /// What follows step `s` when it is due: evaluation and what it means (the best so far,
    /// early stopping), the metrics line, a checkpoint, a stop. `Some` ends the loop.
    fn after_step(&mut self, s: Stepped) -> Result<Option<Ending>, TrainError> {
        let c = self.config();
        let plan = self.input.plan;
        let done = self.step;
        let is_last = done == self.total;
        let do_eval = self.input.data.eval.is_some()
            && (is_last || (c.train.eval_every > 0 && done.is_multiple_of(c.train.eval_every)));
        // what this evaluation means (every rank has the same sums, so decides alike)
        let mut new_best = false;
        let mut stop_early = false;
        if do_eval {
            self.eval.last = self.evaluate()?;
            if let Some(sums) = self.eval.last.as_ref() {
                if let Some(w) = self.eval.best.as_mut() {
                    new_best = w.observe(sums, done);
                }
                if let (Some(w), Some(cfg)) = (
                    self.eval.early_stopping.as_mut(),
                    c.train.early_stopping.as_ref(),
                ) {
                    w.observe(sums, done);
                    stop_early = w.bad_evals() >= cfg.patience && !is_last;
                }
            }
        }
        self.log_step(&s, do_eval, is_last);

        // a stop before the end saves the step it stops at (once), and so does a pause
        let stopping = s.stop && !is_last;
        let pausing = c.train.pause_at_step == done && !is_last;
        let entered = (self.pos.epoch > s.epoch_at_start).then_some(self.pos.epoch);
        let ends_here = stop_early || stopping || pausing;
        let save = super::save::due(c, done, entered, is_last, ends_here, new_best);
        let clock = self.clock;
        if let (true, Some(checkpointer)) = (save, self.saving.checkpointer.as_mut()) {
            // one save in flight: the previous one first (training waits only for what is
            // left of it)
            let start = Instant::now();
            let committed = clock.time(Phase::Checkpoint, || checkpointer.wait())?;
            announce(&mut *self.sink, committed);
            let position = DataPosition {
                epoch: self.pos.epoch,
                cursor: plan.cursor(self.pos.start, self.pos.j),
                segment_start: self.pos.start,
                segment_micro: self.pos.j,
            };
            let progress = Progress {
                step: done,
                position,
                loss: s.loss,
                lr: s.lr,
                watched: [&self.eval.early_stopping, &self.eval.best]
                    .map(|w| w.as_ref().and_then(|w| w.state.clone())),
                loss_scale: self.scaler.as_ref().map(|s| s.state().clone()),
                documents: self.documents.clone(),
            };
            let (input, strategy) = (self.input, &mut *self.strategy);
            let in_background = checkpointer.in_background();
            clock.time(Phase::Checkpoint, || {
                checkpointer.save(input, strategy, progress)
            })?;
            self.saving.saves += 1;
            self.saving.blocked += start.elapsed().as_secs_f64();
            let best = if new_best { " (the best so far)" } else { "" };
            if in_background {
                self.sink.log(&format!(
                    "checkpoint step-{done:08}{best} copied to host memory; writing in the background"
                ));
            } else {
                self.sink
                    .log(&format!("checkpoint step-{done:08} saved{best}"));
                self.sink.event(TrainEvent::Checkpoint { step: done });
            }
        } else {
            // a failed background write fails the run now
            let committed = match self.saving.checkpointer.as_mut() {
                Some(c) => c.poll()?,
                None => None,
            };
            announce(&mut *self.sink, committed);
        }
        // a stop request at the step early stopping ends the run: the run is complete
        if stopping && !stop_early {
            let why = match super::preempt::requested() {
                Some(sig) => super::preempt::signal_name(sig).to_string(),
                None => "a stop request on another rank".to_string(),
            };
            self.sink.log(&format!("stopped at step {done} ({why})"));
            return Ok(Some(Ending::Preempted(why)));
        }
        if stop_early {
            if let (Some(w), Some(cfg)) = (
                self.eval
                    .early_stopping
                    .as_ref()
                    .and_then(|w| w.state.as_ref()),
                c.train.early_stopping.as_ref(),
            ) {
                self.sink.log(&format!(
                    "stopped early at step {done}: {} has not improved by more than {} for {} evaluations (best {} at step {})",
                    w.metric, cfg.min_delta, cfg.patience, w.best, w.best_step
                ));
            }
            return Ok(Some(Ending::Stopped(done)));
        }
        if pausing {
            self.sink
                .log(&format!("paused at step {done} (train.pause_at_step)"));
            return Ok(Some(Ending::Paused(done)));
        }
        Ok(None)
    }

    /// Waits for the checkpoint in flight (the end of the run, a stop): no run ends before its
    /// checkpoints are saved.
    fn settle(&mut self) -> Result<(), TrainError> {
        let clock = self.clock;
        let start = Instant::now();
        let committed = match self.saving.checkpointer.as_mut() {
            Some(c) => clock.time(Phase::Checkpoint, || c.wait())?,
            None => None,
        };
        self.saving.blocked += start.elapsed().as_secs_f64();
        announce(&mut *self.sink, committed);
        Ok(())
    }

    /// The step's progress event, and on logged steps its metrics line and log line.
    fn log_step(&mut self, s: &Stepped, do_eval: bool, is_last: bool) {
        let c = self.config();
        let done = self.step;
        let lm = matches!(self.task, Task::LanguageModel { .. });
        let elapsed = self.window.start.elapsed().as_secs_f64().max(1e-9);
        let sps = self.window.samples / elapsed;
        let log = is_last || do_eval || done.is_multiple_of(c.train.log_every);
        let eval = self
            .eval
            .last
            .filter(|_| do_eval)
            .map(|e| EvalMetrics::of(self.task, &e));
        // (the window since the previous logged line, taken when this one is)
        let window = if log {
            self.clock.lock().take_window()
        } else {
            Default::default()
        };
        let line = log.then(|| MetricLine {
            ts: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| (d.as_secs_f64() * 1e3).round() / 1e3)
                .unwrap_or(0.0),
            time: Some(window.fractions_json()),
            step_ms: Some((window.step_ms(self.window.steps) * 100.0).round() / 100.0),
            step: done,
            epoch: round4(self.epochs()),
            loss: s.loss,
            aux_loss: s.own_loss,
            lr: s.lr,
            samples_per_sec: round4(sps),
            tokens_per_sec: lm.then(|| round4(sps * self.task.targets_per_sample() as f64)),
            eval_loss: eval.map(|m| m.loss),
            eval_accuracy: eval.and_then(|m| m.accuracy),
            eval_perplexity: eval.and_then(|m| m.perplexity),
            loss_scale: s.loss_scale,
            skipped: s.skipped,
        });
        if log {
            self.window.start = Instant::now();
            self.window.samples = 0.0;
            self.window.steps = 0;
            self.sink.log(&format!(
                "step {done} loss {} lr {} samples/s {sps:.1}",
                s.loss, s.lr
            ));
        }
        self.sink.event(TrainEvent::Step {
            step: done,
            loss: s.loss,
            samples_per_sec: sps,
            line: line.map(Box::new),
        });
    }

    /// The rank's outcome: the final parameters' hash (a unit at a time: fsdp never holds the
    /// whole model for it), its time and memory.
    fn finish(
        self,
        ending: Option<Ending>,
        wall: f64,
        memory_key: Option<usize>,
    ) -> Result<Outcome, TrainError> {
        let (params, params_sha256) = {
            use sha2::{Digest, Sha256};
            let keep = self.input.keep_params && self.rank == 0;
            let mut h = Sha256::new();
            let mut params = Vec::new();
            self.strategy.visit_params(&mut |p| {
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
        self.sink.log(&format!(
            "finished {} steps ({} this session) in {wall:.2}s",
            self.step,
            self.step - self.first_step
        ));
        let transfers = crate::params::transfers::counted().since(&self.transfers_start);
        if self.placement.on_device() {
            let b = crate::ui::bytes;
            self.sink.log(&format!(
                "host transfers: parameters {} to the device, {} back; optimizer state {} to the device, {} back; gradients {} to the host, {} back",
                b(transfers.params_to_device),
                b(transfers.params_to_host),
                b(transfers.state_to_device),
                b(transfers.state_to_host),
                b(transfers.grads_to_host),
                b(transfers.grads_to_device),
            ));
        }
        let clock = self.clock;
        clock.end_step();
        // one lock at a time: the clock's mutexes are not reentrant
        let time = clock.lock().totals();
        let comm_time = clock.comm().totals();
        let (preempted, stopped_early, paused) = match ending {
            Some(Ending::Preempted(why)) => (Some(why), None, None),
            Some(Ending::Stopped(step)) => (None, Some(step), None),
            Some(Ending::Paused(step)) => (None, None, Some(step)),
            None => (None, None, None),
        };
        Ok(Outcome {
            steps: self.step,
            epochs: round4(self.epochs()),
            final_loss: self.last_loss,
            eval: self.eval.last,
            wall_seconds: round4(wall),
            samples_per_sec: round4(self.samples_total / wall.max(1e-9)),
            task: self.task,
            params,
            params_sha256,
            memory: Memory {
                peak_bytes: memory_key.and_then(crate::memory::peak_bytes),
                host_transfers: self.placement.on_device().then_some(transfers),
                ..self.strategy.memory()
            },
            time,
            comm_time,
            spans: clock.take_spans(),
            preempted,
            stopped_early,
            paused,
            early_stopping: self.eval.early_stopping.and_then(|w| w.state),
            best: self.eval.best.and_then(|w| w.state),
            loss_scale: self.scaler.as_ref().map(|s| s.state().clone()),
            saves: self.saving.saves,
            blocked_seconds: round4(self.saving.blocked),
            background_seconds: round4(
                self.saving
                    .checkpointer
                    .as_ref()
                    .map_or(0.0, Checkpointer::background_seconds),
            ),
        })
    }
}

/// Says that checkpoint `step` is saved (committed), if one is.
fn announce(sink: &mut dyn RankSink, step: Option<usize>) {
    if let Some(step) = step {
        sink.log(&format!("checkpoint step-{step:08} saved"));
        sink.event(TrainEvent::Checkpoint { step });
    }
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
    let mut t = Trainer::<B>::new(input, strategy, device, raw_fn, sink, clock)?;
    let c = input.config;
    let plan = input.plan;
    // this rank's measured peak counts from here
    let memory_key = crate::memory::attributed();
    if let Some(k) = memory_key {
        crate::memory::reset_peak(k);
    }
    // the micro-batches this session will take, in the loop's order
    let source = Source::new(
        plan,
        t.rank,
        t.pos,
        t.total.saturating_sub(t.step).saturating_mul(plan.accum),
        c.train.max_steps.is_none().then_some(c.train.epochs as u64),
    );
    let assembler = Assembler {
        data: &input.data.train,
        task: t.task,
        augment: Augment::new(&c.data, c.experiment.seed),
        file: data_file(c),
        rank: t.rank,
    };
    let source = match &input.data.train.samples {
        crate::data::Samples::Stream(src) => {
            let at = input.resume.and_then(|l| l.state.documents.as_ref());
            if let Some(at) = at {
                src.check_resume(at)
                    .map_err(|e| TrainError::BadData(e.to_string()))?;
            }
            source.documents(crate::data::stream::Stream::new(src.clone(), at))
        }
        _ => source,
    };
    let loader_state = LoaderState::new(source);
    let start = Instant::now();
    t.window.start = start;
    // the breakdown covers the steps, not the set-up (module, initial broadcast, resume load)
    clock.reset();
    let ending = std::thread::scope(|scope| -> Result<Option<Ending>, TrainError> {
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
        // resumed at or past `train.pause_at_step` (stopped by a signal at that very step, whose
        // checkpoint it resumed from): paused there again, not trained past it
        let pause = c.train.pause_at_step;
        if pause > 0 && t.step >= pause && t.step < t.total {
            t.sink.log(&format!(
                "paused at step {} (train.pause_at_step = {pause})",
                t.step
            ));
            return Ok(Some(Ending::Paused(t.step)));
        }
        while t.step < t.total {
            let s = t.step(&mut loader)?;
            if let Some(end) = t.after_step(s)? {
                return Ok(Some(end));
            }
        }
        Ok(None)
    })?;
    t.settle()?;
    let wall = start.elapsed().as_secs_f64();
    t.finish(ending, wall, memory_key)
}
