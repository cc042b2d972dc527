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
    /// How many samples to draw.
    pub samples: usize,
    /// Seed of the draws. Default: `0`.
    #[serde(default)]
    pub seed: u64,
    /// Dotted key -> distribution.
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
        }
    }
}

impl SweepConfig {
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
        Ok(())
    }
}
