//! `kiln bench`: parses the arguments, runs `tools::bench` (training throughput of an
//! experiment on each CPU backend; no run directory, nothing written) and prints its table.

use clap::Args;

use super::ConfigArgs;
use crate::config::CpuBackend;
use crate::error::{Error, Result};
use crate::tools::{self, BenchEvent};

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
    /// Which CPU backends: all, ndarray or flex (a config with `backend.device = "cuda"` or
    /// `"wgpu"` measures its device placement instead).
    #[arg(long, default_value = "all")]
    pub cpu: String,
}

pub fn bench(a: &BenchArgs) -> Result<()> {
    let r = a.config.resolve()?;
    if a.steps == 0 || a.repeats == 0 {
        return Err(Error::Usage(
            "--steps and --repeats must be at least 1".into(),
        ));
    }
    let cpus = match a.cpu.as_str() {
        "all" => vec![CpuBackend::Ndarray, CpuBackend::Flex],
        "ndarray" => vec![CpuBackend::Ndarray],
        "flex" => vec![CpuBackend::Flex],
        other => {
            return Err(Error::Usage(format!(
                "--cpu `{other}`: expected all, ndarray or flex"
            )))
        }
    };
    tools::bench(r, a.steps, a.repeats, &cpus, &mut |ev| {
        match ev {
        BenchEvent::Plan { describe, repeats } => {
            crate::outln!("{describe}");
            crate::outln!(
                "cpu: {}; flex's kernels: {}",
                crate::ui::printable(&crate::rundir::record::cpu_model()),
                crate::kernels::instructions()
            );
            crate::outln!("backend   threads  loaders  steps/s  samples/s  ms/step  tokens/s  data  peak/rank  (median of {repeats}; ms/step: steady state, the first step not counted; peak: the largest rank's, measured)");
        }
        BenchEvent::Skipped { backend, why } => crate::outln!("{backend:<9} skipped: {why}"),
        BenchEvent::Row {
            backend,
            threads,
            loaders,
            steps_per_sec,
            samples_per_sec,
            step_ms,
            tokens_per_sec,
            data_fraction,
            peak_bytes,
        } => crate::outln!(
            "{backend:<9} {threads:>7}  {loaders:>7}  {steps_per_sec:>7.2}  {samples_per_sec:>9.1}  {:>7}  {:>8}  {:>3.0}%  {:>9}",
            step_ms.map_or("-".to_string(), |m| format!("{m:.2}")),
            tokens_per_sec.map_or("-".to_string(), |t| format!("{t:.0}")),
            100.0 * data_fraction,
            peak_bytes.map_or("-".to_string(), crate::ui::bytes)
        ),
    }
    })
}
