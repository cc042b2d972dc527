//! The step loop: micro-batches from the sampler, accumulation, clipping, the optimizer, the LR
//! schedule, periodic evaluation and metrics events.

use std::time::Instant;

use burn::tensor::backend::AutodiffBackend;
use serde::Serialize;

use super::optim::{clip_by_norm, sum_squares, Optimizer};
use super::schedule::lr_at;
use super::step::{evaluate, forward_backward, EvalSums, StepError};
use crate::config::Config;
use crate::data::Data;
use crate::model::Mlp;
use crate::plan::Plan;

/// One line of `metrics.jsonl`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct MetricLine {
    pub step: usize,
    pub epoch: f64,
    pub loss: f64,
    pub lr: f64,
    pub samples_per_sec: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_loss: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_accuracy: Option<f64>,
}

/// What the loop reports while it runs.
#[derive(Debug, Clone)]
pub enum TrainEvent {
    Started { total_steps: usize },
    /// A step finished (`line` is set when it is a logged step).
    Step {
        step: usize,
        loss: f64,
        samples_per_sec: f64,
        line: Option<MetricLine>,
    },
}

/// The result of a finished run.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub steps: usize,
    pub epochs: f64,
    pub final_loss: f64,
    pub eval: Option<EvalSums>,
    pub wall_seconds: f64,
    pub samples_per_sec: f64,
    pub params: Vec<f32>,
    pub optim_bytes: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Step(#[from] StepError),
    #[error("training diverged: the loss is {loss} at step {step}\n  = help: lower `optim.lr`, set `optim.grad_clip_norm`, or add warm-up (`schedule.warmup_steps`)")]
    Diverged { step: usize, loss: f64 },
}

/// Everything the loop needs, built before it starts.
pub struct TrainInput<'a> {
    pub config: &'a Config,
    pub plan: &'a Plan,
    pub data: &'a Data,
    pub mlp: &'a Mlp,
}

/// Runs the whole training on one device.
pub fn train<B: AutodiffBackend>(
    input: &TrainInput<'_>,
    device: &B::Device,
    on_event: &mut (dyn FnMut(TrainEvent) + Send),
) -> Result<Outcome, TrainError> {
    let TrainInput {
        config: c,
        plan,
        data,
        mlp,
    } = *input;
    let rank = 0usize;
    let mut params = mlp.init(c.experiment.seed);
    let mut opt = Optimizer::new(&c.optim);
    let eval_idx: Vec<usize> = data.eval.as_ref().map(|d| (0..d.len()).collect()).unwrap_or_default();
    on_event(TrainEvent::Started {
        total_steps: plan.total_steps,
    });

    let start = Instant::now();
    let mut window_start = Instant::now();
    let mut window_samples = 0usize;
    let mut epoch_cache: Option<(u64, Vec<usize>)> = None;
    let mut micro = 0usize;
    let mut last_loss = f64::NAN;
    let mut last_eval = None;
    let mut samples_total = 0usize;
    for step in 0..plan.total_steps {
        let lr = lr_at(&c.schedule, c.optim.lr, step, plan.total_steps);
        let mut grads = vec![0f32; params.len()];
        let mut loss = 0.0;
        let mut micro_in_step = 0;
        for k in 0..plan.accum {
            if micro >= plan.total_micro {
                break;
            }
            let epoch = (micro / plan.micro_per_epoch) as u64;
            let j = micro % plan.micro_per_epoch;
            if epoch_cache.as_ref().map(|(e, _)| *e) != Some(epoch) {
                epoch_cache = Some((epoch, plan.sampler.indices(epoch, rank)));
            }
            let order = epoch_cache.as_ref().map(|(_, o)| o.as_slice()).unwrap_or(&[]);
            let lo = (j * plan.micro_batch).min(order.len());
            let hi = ((j + 1) * plan.micro_batch).min(order.len());
            let (x, y) = data.train.gather(&order[lo..hi]);
            let masks = mlp.dropout_masks(y.len(), c.experiment.seed, &[step as u64, k as u64, rank as u64]);
            let out = forward_backward::<B>(mlp, &params, x, &y, masks, 1.0 / plan.accum as f64, device)?;
            for (a, g) in grads.iter_mut().zip(&out.grads) {
                *a += g;
            }
            loss += out.loss;
            samples_total += y.len();
            window_samples += y.len();
            micro_in_step += 1;
            micro += 1;
        }
        let loss = loss / micro_in_step.max(1) as f64;
        if !loss.is_finite() {
            return Err(TrainError::Diverged { step: step + 1, loss });
        }
        if let Some(max_norm) = c.optim.grad_clip_norm {
            let norm = sum_squares(&grads).sqrt();
            clip_by_norm(&mut grads, norm, max_norm);
        }
        opt.step(&mut params, &grads, lr);
        last_loss = loss;

        let done = step + 1;
        let is_last = done == plan.total_steps;
        let do_eval = data.eval.is_some()
            && (is_last || (c.train.eval_every > 0 && done % c.train.eval_every == 0));
        if do_eval {
            if let Some(ds) = &data.eval {
                last_eval = Some(evaluate::<B::InnerBackend>(
                    mlp,
                    &params,
                    ds,
                    &eval_idx,
                    plan.micro_batch,
                    &device_inner::<B>(device),
                )?);
            }
        }
        let elapsed = window_start.elapsed().as_secs_f64().max(1e-9);
        let sps = window_samples as f64 / elapsed;
        let log = is_last || do_eval || done % c.train.log_every == 0;
        let line = log.then(|| MetricLine {
            step: done,
            epoch: round4(micro as f64 / plan.micro_per_epoch as f64),
            loss,
            lr,
            samples_per_sec: round4(sps),
            eval_loss: do_eval.then(|| last_eval.map(|e| e.loss())).flatten(),
            eval_accuracy: do_eval.then(|| last_eval.map(|e| e.accuracy())).flatten(),
        });
        if log {
            window_start = Instant::now();
            window_samples = 0;
        }
        on_event(TrainEvent::Step {
            step: done,
            loss,
            samples_per_sec: sps,
            line,
        });
    }
    let wall = start.elapsed().as_secs_f64();
    Ok(Outcome {
        steps: plan.total_steps,
        epochs: round4(micro as f64 / plan.micro_per_epoch as f64),
        final_loss: last_loss,
        eval: last_eval,
        wall_seconds: round4(wall),
        samples_per_sec: round4(samples_total as f64 / wall.max(1e-9)),
        params,
        optim_bytes: opt.state_bytes(),
    })
}

fn device_inner<B: AutodiffBackend>(device: &B::Device) -> <B::InnerBackend as burn::tensor::backend::BackendTypes>::Device {
    device.clone()
}

fn round4(v: f64) -> f64 {
    (v * 1e4).round() / 1e4
}
