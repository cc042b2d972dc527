//! `[sweep]`: a grid or random search over config keys.

use serde::{Deserialize, Serialize};

use super::error::ConfigError;
use super::load::Resolved;
use super::validate::*;
#[allow(unused_imports)]
use super::*;

/// Whether a sweep metric is minimised or maximised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MetricMode {
    Min,
    Max,
}

/// A distribution of `[sweep.random] space`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub enum Distribution {
    /// Log-uniform between two positive bounds.
    LogUniform([f64; 2]),
    /// Uniform between two bounds.
    Uniform([f64; 2]),
    /// One of the listed values.
    Choice(Vec<toml::Value>),
}

/// `[sweep] random`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RandomSearch {
    /// How many samples to draw. Default: none (required).
    pub samples: usize,
    /// Seed of the draws. Default: `0`.
    #[serde(default)]
    pub seed: u64,
    /// Dotted key -> distribution (see Sweeps). Default: none (required).
    pub space: std::collections::BTreeMap<String, Distribution>,
}

/// `[sweep]`: only `kiln sweep` reads it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SweepConfig {
    /// The sweep directory under `experiment.output_dir`. Default: `experiment.name`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Dotted key -> values; the trials are the cartesian product. Default: empty.
    pub grid: std::collections::BTreeMap<String, Vec<toml::Value>>,
    /// Random samples (combined with every grid point when both are given). Default: unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub random: Option<RandomSearch>,
    /// The summary field that ranks trials (e.g. eval_loss, eval_accuracy, final_loss).
    /// Default: `"eval_loss"`.
    pub metric: String,
    /// min or max. Default: `"min"`.
    pub mode: MetricMode,
    /// Trials run at once. Default: `1`.
    pub parallel: usize,
    /// How often a failed trial is tried again. Default: `0`.
    pub retries: usize,
    /// none (every trial trains to the end) or asha (asynchronous successive halving: trials
    /// pause at rungs and the best go on). Default: `"none"`.
    #[serde(skip_serializing_if = "SweepScheduler::is_none")]
    pub scheduler: SweepScheduler,
    /// asha: a rung keeps the top 1/N of the trials that reached it. Default: `3`.
    #[serde(skip_serializing_if = "is_three")]
    pub reduction_factor: usize,
    /// asha: the first rung's step; rungs at grace x rf^k below `train.max_steps`, and
    /// `train.max_steps`. Default: `0` (required with asha).
    #[serde(skip_serializing_if = "is_zero")]
    pub grace_steps: usize,
}

// (defaults left out of the config hash: the hashes of sweeps without asha stay as they were)
fn is_three(n: &usize) -> bool {
    *n == 3
}

/// `sweep.scheduler`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SweepScheduler {
    None,
    Asha,
}

impl SweepScheduler {
    fn is_none(&self) -> bool {
        *self == SweepScheduler::None
    }
}

impl Default for SweepConfig {
    fn default() -> Self {
        SweepConfig {
            name: None,
            grid: Default::default(),
            random: None,
            metric: "eval_loss".into(),
            mode: MetricMode::Min,
            parallel: 1,
            retries: 0,
            scheduler: SweepScheduler::None,
            reduction_factor: 3,
            grace_steps: 0,
        }
    }
}

impl SweepConfig {
    /// asha's rungs for a run of `max_steps`: grace x rf^k below it, then `max_steps`.
    pub fn rungs(&self, max_steps: usize) -> Vec<usize> {
        let mut out = Vec::new();
        let mut r = self.grace_steps.max(1);
        while r < max_steps {
            out.push(r);
            r = r.saturating_mul(self.reduction_factor.max(2));
        }
        out.push(max_steps);
        out
    }

    /// asha: a step count, rungs on evaluations (for an evaluation metric).
    fn check_asha(&self, r: &Resolved) -> Result<(), ConfigError> {
        let c = &r.config;
        at_least(r, "sweep.reduction_factor", self.reduction_factor, 2)?;
        let Some(max) = c.train.max_steps else {
            return Err(r.key_error(
                "sweep.scheduler",
                "`sweep.scheduler` = \"asha\" pauses trials at steps, but `train.max_steps` is unset".into(),
                Some("set `train.max_steps` (the last rung)".into()),
            ));
        };
        if self.grace_steps == 0 || self.grace_steps >= max {
            return Err(r.key_error(
                "sweep.grace_steps",
                format!(
                    "`sweep.grace_steps` = {} must be a step before `train.max_steps` = {max} (the first rung)",
                    self.grace_steps
                ),
                None,
            ));
        }
        if self.metric.starts_with("eval_") {
            let every = c.train.eval_every;
            // (the last step is always evaluated)
            let rungs = self.rungs(max);
            if let Some(&bad) = rungs[..rungs.len() - 1]
                .iter()
                .find(|&&s| every == 0 || s % every != 0)
            {
                return Err(r.key_error(
                    "train.eval_every",
                    format!(
                        "asha ranks trials by `{}` at each rung, but rung {bad} is not an evaluation step (`train.eval_every` = {every})",
                        self.metric
                    ),
                    Some(format!("set `train.eval_every` to a divisor of every rung ({:?})", self.rungs(max))),
                ));
            }
        }
        Ok(())
    }

    /// The number of trials bounded before any is expanded, and a metric a trial's summary has.
    pub(super) fn check(&self, r: &Resolved) -> Result<(), ConfigError> {
        let s = self;
        if !SWEEP_METRICS.contains(&s.metric.as_str()) {
            let hint = match closest(&s.metric, SWEEP_METRICS) {
                Some(m) => format!("did you mean `{m}`? "),
                None => String::new(),
            };
            return Err(r.key_error(
                "sweep.metric",
                format!(
                    "`sweep.metric` = {:?} is not a number a trial's summary.json has",
                    s.metric
                ),
                Some(format!("{hint}one of: {}", SWEEP_METRICS.join(", "))),
            ));
        }
        let grid = s
            .grid
            .values()
            .try_fold(1usize, |a, v| a.checked_mul(v.len().max(1)));
        let samples = s.random.as_ref().map_or(1, |x| x.samples.max(1));
        let trials = grid.and_then(|g| g.checked_mul(samples));
        if trials.is_none_or(|t| t > MAX_TRIALS) {
            let key = if s.random.as_ref().is_some_and(|x| x.samples > MAX_TRIALS) {
                "sweep.random.samples"
            } else {
                "sweep.grid"
            };
            return Err(r.key_error(
                key,
                format!(
                    "the sweep has {} trials, more than {MAX_TRIALS}",
                    trials.map_or("too many to count".to_string(), |t| t.to_string()),
                ),
                Some("search fewer values per key (or a random search with fewer samples), then narrow it around the best trials".into()),
            ));
        }
        if s.scheduler == SweepScheduler::Asha {
            s.check_asha(r)?;
        }
        Ok(())
    }
}
