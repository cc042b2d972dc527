//! `kiln bench`'s measurement: training throughput of an experiment on each chosen placement
//! (no run directory, nothing written), the median of several runs each.

use crate::backend;
use crate::config::{CpuBackend, Resolved};
use crate::data;
use crate::error::Result;
use crate::launch::train;
use crate::plan::Plan;
use crate::train::{Phase, TrainEvent, TrainInput};

/// What a benchmark reports, as it goes.
#[derive(Debug, Clone, PartialEq)]
pub enum BenchEvent {
    /// Every placement was checked; measuring starts.
    Plan { describe: String, repeats: usize },
    /// A backend left out, and why.
    Skipped { backend: &'static str, why: String },
    /// One placement measured: the median of `repeats` runs.
    Row {
        backend: &'static str,
        threads: usize,
        /// Data loader threads per rank (`data.workers`).
        loaders: usize,
        steps_per_sec: f64,
        samples_per_sec: f64,
        /// The steady state: the median time between one step's end and the next's (the first
        /// step, with its warm-up, is never counted), median over the repeats; none for a run
        /// of one step.
        step_ms: Option<f64>,
        /// Tokens per second at `step_ms` (language models: samples x positions).
        tokens_per_sec: Option<f64>,
        /// The share of the step time spent waiting for batches (the breakdown's `data`).
        data_fraction: f64,
        /// The largest rank's measured peak bytes (the counting allocator; none without it).
        peak_bytes: Option<u64>,
    },
}

/// Measures `r` for `steps` optimizer steps, `repeats` times on each of `cpus` (a CUDA or wgpu
/// config measures its device placement instead), reporting through `on_event`.
pub fn bench(
    mut r: Resolved,
    steps: usize,
    repeats: usize,
    cpus: &[CpuBackend],
    on_event: &mut dyn FnMut(BenchEvent),
) -> Result<()> {
    r.config.train.max_steps = Some(steps);
    r.config.train.eval_every = 0;
    let mut data = data::load(&r)?;
    data.eval = None;
    let model = crate::model::build(&r, &data.input_shape())?;
    let plan = Plan::new(&r.config, data.train.len(), model.num_params());
    let mut configs = Vec::new();
    let mut skipped = Vec::new();
    if !r.config.backend.device.on_host() {
        configs.push(r.config.clone());
    } else {
        let half = r.config.backend.precision != crate::config::Precision::F32;
        for &cpu in cpus {
            // ndarray computes in f32 only
            if half && cpu == CpuBackend::Ndarray {
                if cpus.len() == 1 {
                    return Err(crate::Error::Usage(format!(
                        "--cpu ndarray: ndarray computes in f32 only, but `backend.precision` = \"{}\"; use --cpu flex, or leave `backend.precision` unset",
                        crate::config::choice_name(&r.config.backend.precision)
                    )));
                }
                skipped.push("ndarray");
                continue;
            }
            let mut c = r.config.clone();
            c.backend.cpu = cpu;
            configs.push(c);
        }
    }
    // every placement checked before anything is reported
    let mut runs = Vec::new();
    for c in configs {
        let placement = backend::resolve(&c)?;
        runs.push((c, placement));
    }
    on_event(BenchEvent::Plan {
        describe: plan.describe(),
        repeats,
    });
    for backend in skipped {
        on_event(BenchEvent::Skipped {
            backend,
            why: format!(
                "it computes in f32 only (backend.precision = \"{}\")",
                crate::config::choice_name(&r.config.backend.precision)
            ),
        });
    }
    for (c, placement) in runs {
        // the config's NCCL variables, before anything loads NCCL (CUDA only)
        let nccl = crate::rendezvous::nccl_env::export(&c, None, std::time::Duration::ZERO)?;
        let input = TrainInput {
            config: &c,
            plan: &plan,
            data: &data,
            model: model.as_ref(),
            store: None,
            resume: None,
            init: None,
            shared_init: Default::default(),
            keep_params: false,
        };
        // (steps/s, data share) of each measurement; the median by speed is reported
        let mut runs = Vec::with_capacity(repeats);
        let mut peak = None;
        let mut steady = Vec::with_capacity(repeats);
        for _ in 0..repeats.max(1) {
            let mut ends = Vec::with_capacity(steps);
            let res = train(&placement, &input, None, None, &nccl, &mut |ev| {
                if let TrainEvent::Step { .. } = ev {
                    ends.push(std::time::Instant::now());
                }
            })?;
            let mut gaps: Vec<f64> = ends
                .windows(2)
                .map(|w| (w[1] - w[0]).as_secs_f64() * 1e3)
                .collect();
            if let Some(m) = median(&mut gaps) {
                steady.push(m);
            }
            peak = res
                .memory
                .iter()
                .filter_map(|m| m.peak_bytes)
                .max()
                .max(peak);
            let out = res.outcome;
            let data = out.time.get(Phase::Data) / out.time.total().max(1e-12);
            runs.push((out.steps as f64 / out.wall_seconds.max(1e-9), data));
        }
        runs.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (median_rate, data_fraction) = runs[runs.len() / 2];
        let step_ms = median(&mut steady);
        let tokens = match model.task() {
            crate::model::Task::LanguageModel { block, .. } => Some(block),
            _ => None,
        };
        on_event(BenchEvent::Row {
            backend: placement.backend.name(),
            threads: backend::threads(&c.backend, c.strategy.devices.count(), c.data.workers),
            loaders: c.data.workers,
            steps_per_sec: median_rate,
            samples_per_sec: median_rate * plan.global_batch as f64,
            step_ms,
            tokens_per_sec: step_ms
                .zip(tokens)
                .map(|(ms, t)| (plan.global_batch * t) as f64 / (ms / 1e3)),
            data_fraction,
            peak_bytes: peak,
        });
    }
    Ok(())
}

/// The median of `xs` (the upper one of an even count), none for none.
fn median(xs: &mut [f64]) -> Option<f64> {
    xs.sort_by(f64::total_cmp);
    xs.get(xs.len() / 2).copied()
}
