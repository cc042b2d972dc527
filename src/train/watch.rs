//! A metric watched at each evaluation: early stopping's patience and the best checkpoint's
//! `keep_best`. Its state is saved in checkpoints, so a resumed run keeps counting.

use super::events::EvalSums;
use crate::checkpoint::WatchState;
use crate::config::{EvalMetric, MetricMode};

/// A metric watched at each evaluation (early stopping, the best checkpoint).
pub(super) struct MetricWatch {
    metric: EvalMetric,
    mode: MetricMode,
    min_delta: f64,
    pub state: Option<WatchState>,
}

impl MetricWatch {
    /// Watching `metric`, continuing from `resumed` when it watched the same metric the same way.
    pub fn new(
        metric: EvalMetric,
        mode: MetricMode,
        min_delta: f64,
        resumed: Option<&WatchState>,
    ) -> MetricWatch {
        let mode_name = mode_name(mode);
        MetricWatch {
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
    pub fn observe(&mut self, sums: &EvalSums, step: usize) -> bool {
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
                self.state = Some(WatchState {
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
    pub fn bad_evals(&self) -> usize {
        self.state.as_ref().map_or(0, |w| w.bad_evals)
    }
}

fn mode_name(mode: MetricMode) -> &'static str {
    match mode {
        MetricMode::Min => "min",
        MetricMode::Max => "max",
    }
}
