//! `kiln bench`: training throughput of an experiment on each CPU backend (no run directory,
//! nothing written). The median of `--repeats` runs is reported.

use clap::Args;

use super::ConfigArgs;
use crate::backend::{self, Resolved};
use crate::config::{CpuBackend, Device};
use crate::data;
use crate::error::{Error, Result};
use crate::plan::Plan;
use crate::train::TrainInput;

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Optimizer steps per measurement.
    #[arg(long, default_value_t = 100)]
    pub steps: usize,
    /// Measurements per backend (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
    /// Which CPU backends: all, ndarray or flex (a config with `backend.device = "cuda"` measures
    /// its GPU placement instead).
    #[arg(long, default_value = "all")]
    pub cpu: String,
}

pub fn bench(a: &BenchArgs) -> Result<()> {
    let mut r = a.config.resolve()?;
    if a.steps == 0 || a.repeats == 0 {
        return Err(Error::Usage(
            "--steps and --repeats must be at least 1".into(),
        ));
    }
    r.config.train.max_steps = Some(a.steps);
    r.config.train.eval_every = 0;
    let data = data::load(&r)?;
    let mut c = r.config.clone();
    let mut no_eval = data.clone();
    no_eval.eval = None;
    let model = crate::model::build(&c.model, &data.input_shape())?;
    let plan = Plan::new(&c, data.train.len(), model.num_params());
    let backends: Vec<Option<CpuBackend>> = if c.backend.device == Device::Cuda {
        // the configured GPU placement
        vec![None]
    } else {
        match a.cpu.as_str() {
            "all" => vec![Some(CpuBackend::Ndarray), Some(CpuBackend::Flex)],
            "ndarray" => vec![Some(CpuBackend::Ndarray)],
            "flex" => vec![Some(CpuBackend::Flex)],
            other => {
                return Err(Error::Usage(format!(
                    "--cpu `{other}`: expected all, ndarray or flex"
                )))
            }
        }
    };
    // every placement checked before anything is printed
    let mut runs = Vec::new();
    for cpu in backends {
        if let Some(cpu) = cpu {
            c.backend.cpu = cpu;
        }
        runs.push((c.clone(), backend::resolve(&c)?));
    }
    println!("{}", plan.describe());
    println!(
        "backend   threads  steps/s  samples/s  (median of {})",
        a.repeats
    );
    for (c, placement) in runs {
        let be: Resolved = placement.backend;
        let input = TrainInput {
            config: &c,
            plan: &plan,
            data: &no_eval,
            model: model.as_ref(),
            store: None,
            resume: None,
        };
        let mut rates = Vec::new();
        for _ in 0..a.repeats {
            let out = crate::launch::train(&placement, &input, None, None, &mut |_| {})?.outcome;
            rates.push(out.steps as f64 / out.wall_seconds.max(1e-9));
        }
        rates.sort_by(f64::total_cmp);
        let median = rates[rates.len() / 2];
        println!(
            "{:<9} {:>7}  {:>7.1}  {:>9.0}",
            be.name(),
            backend::threads(&c.backend, c.strategy.devices.count()),
            median,
            median * plan.global_batch as f64
        );
    }
    Ok(())
}
