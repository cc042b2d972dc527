//! ASHA, asynchronous successive halving (Li et al., "A System for Massively Parallel
//! Hyperparameter Tuning"; Ray Tune's `ASHAScheduler`, Optuna's `SuccessiveHalvingPruner`):
//! every trial trains to the first rung and pauses there with a checkpoint; whenever a worker is
//! free, a paused trial in the top 1/rf of the trials that reached its rung (and at most
//! floor(n / rf) of them per rung) goes on to the next rung, else a new trial starts. A
//! promoted trial resumes from its rung checkpoint, so it ends with the bits of a run that never
//! paused. What the ledger records (each trial's rung results and the rung it was sent to) is
//! all the state: a re-run of the sweep makes the same decisions.

use std::collections::BTreeMap;

use super::{ended, Planned, Record, TrialState};
use crate::config::{MetricMode, SweepConfig};
use crate::rundir::SummaryFile;

/// The rungs and the ranking.
#[derive(Debug, Clone)]
pub struct Asha {
    /// Rung steps, ascending; the last is `train.max_steps`.
    pub rungs: Vec<usize>,
    pub rf: usize,
    pub mode: MetricMode,
}

/// What the ledger says of one trial.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Progress {
    /// Its index in the sweep (ties go to the earlier trial).
    pub index: usize,
    /// The metric at each rung it reached (`None`: the summary had none).
    pub results: BTreeMap<usize, Option<f64>>,
    /// The furthest rung it was sent to (0: never started).
    pub furthest: usize,
    /// Whether it is done (at the last rung, or stopped early by `train.early_stopping`):
    /// never promoted.
    pub done: bool,
}

impl Asha {
    pub fn new(s: &SweepConfig, max_steps: usize) -> Self {
        Asha {
            rungs: s.rungs(max_steps),
            rf: s.reduction_factor.max(2),
            mode: s.mode,
        }
    }

    /// Each trial's progress, from every ledger record in order.
    pub fn progress(records: &[Record]) -> BTreeMap<String, Progress> {
        let mut out: BTreeMap<String, Progress> = BTreeMap::new();
        for r in records {
            let p = out.entry(r.trial.clone()).or_default();
            p.index = r.index;
            p.done = r.state == TrialState::Done;
            let Some(rung) = r.rung else { continue };
            p.furthest = p.furthest.max(rung);
            if matches!(r.state, TrialState::Paused | TrialState::Done) {
                p.results.insert(rung, r.metric);
            }
        }
        out
    }

    /// The best promotion there is now, highest rung first: a trial and the rung step it goes
    /// on to.
    pub fn promotion(&self, progress: &BTreeMap<String, Progress>) -> Option<(String, usize)> {
        for k in (0..self.rungs.len().saturating_sub(1)).rev() {
            let rung = self.rungs[k];
            let mut at: Vec<(&String, &Progress, f64)> = progress
                .iter()
                .filter_map(|(id, p)| p.results.get(&rung).map(|m| (id, p, self.worst(*m))))
                .collect();
            let quota = at.len() / self.rf;
            let promoted = at.iter().filter(|(_, p, _)| p.furthest > rung).count();
            if promoted >= quota {
                continue;
            }
            at.sort_by(|a, b| {
                let by = match self.mode {
                    MetricMode::Min => a.2.total_cmp(&b.2),
                    MetricMode::Max => b.2.total_cmp(&a.2),
                };
                by.then(a.1.index.cmp(&b.1.index))
            });
            if let Some((id, _, _)) = at[..quota]
                .iter()
                .find(|(_, p, _)| p.furthest <= rung && !p.done)
            {
                return Some(((*id).clone(), self.rungs[k + 1]));
            }
        }
        None
    }

    /// When no trial reached the last rung and nothing else can run: the best paused trial of
    /// the highest rung that has one goes on to the next rung (issue 58, defect 3: with 6
    /// trials and rf 3, floor(2 / 3) = 0 promotions at the middle rung, and the sweep ended with
    /// no trial trained to `train.max_steps`). Ray Tune's asynchronous rule promotes the first
    /// trial at a rung for the same reason. `None` once a trial has reached the last rung.
    pub fn last_resort(&self, progress: &BTreeMap<String, Progress>) -> Option<(String, usize)> {
        let last = *self.rungs.last()?;
        if progress.values().any(|p| p.results.contains_key(&last)) {
            return None;
        }
        for k in (0..self.rungs.len().saturating_sub(1)).rev() {
            let rung = self.rungs[k];
            let best = progress
                .iter()
                .filter(|(_, p)| p.results.contains_key(&rung) && p.furthest <= rung && !p.done)
                .min_by(|a, b| {
                    let (x, y) = (
                        self.worst(a.1.results[&rung]),
                        self.worst(b.1.results[&rung]),
                    );
                    let by = match self.mode {
                        MetricMode::Min => x.total_cmp(&y),
                        MetricMode::Max => y.total_cmp(&x),
                    };
                    by.then(a.1.index.cmp(&b.1.index))
                });
            if let Some((id, _)) = best {
                return Some((id.clone(), self.rungs[k + 1]));
            }
        }
        None
    }

    /// How many trials reached the last rung (`train.max_steps`).
    pub fn finished(&self, progress: &BTreeMap<String, Progress>) -> usize {
        let last = self.rungs.last().copied().unwrap_or(0);
        progress
            .values()
            .filter(|p| p.results.contains_key(&last))
            .count()
    }

    /// A metric to rank by: a missing or NaN one ranks last.
    fn worst(&self, m: Option<f64>) -> f64 {
        match (m, self.mode) {
            (Some(v), _) if !v.is_nan() => v,
            (_, MetricMode::Min) => f64::INFINITY,
            (_, MetricMode::Max) => f64::NEG_INFINITY,
        }
    }

    /// The rung index of step `s` (for tables), if it is a rung.
    pub fn rung_of(&self, s: usize) -> Option<usize> {
        self.rungs.iter().position(|&r| r == s)
    }
}

/// The ledger record of a segment of trial `p` to rung step `target` whose process ended with
/// `status`: paused or done at the step it reached (with the metric there), else preempted or
/// failed on the way, as `ended` says.
pub(super) fn segment_record(
    dir: &std::path::Path,
    p: &Planned,
    target: usize,
    status: std::process::ExitStatus,
    stopping: bool,
    metric: &str,
) -> Record {
    let mut rec = ended(dir, p, status, stopping, metric);
    rec.rung = Some(match rec.state {
        TrialState::Paused | TrialState::Done => SummaryFile::read(&dir.join(&p.id))
            .and_then(|v| v.steps)
            .map_or(target, |s| s as usize),
        _ => target,
    });
    if rec.state == TrialState::Paused && rec.metric.is_none() {
        rec.metric = metric_at(&dir.join(&p.id), rec.rung.unwrap_or(0), metric);
    }
    rec
}

/// The metric a run's metrics.jsonl has at `step` (a run paused again without a step, having
/// resumed from its rung's checkpoint, has none in its summary).
pub(super) fn metric_at(run_dir: &std::path::Path, step: usize, metric: &str) -> Option<f64> {
    let key = if metric == "final_loss" {
        "loss"
    } else {
        metric
    };
    crate::rundir::MetricsFile::read(run_dir)
        .lines
        .iter()
        .rev()
        .find(|l| l["step"].as_u64() == Some(step as u64) && l[key].is_number())
        .and_then(|l| l[key].as_f64())
}

/// `train.pause_at_step` for a segment to rung step `target`: 0 (none) for the last rung.
pub(super) fn pause_at(asha: &Asha, target: usize) -> usize {
    if asha.rungs.last() == Some(&target) {
        0
    } else {
        target
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(trial: &str, index: usize, state: TrialState, rung: usize, metric: f64) -> Record {
        Record {
            trial: trial.into(),
            index,
            overrides: Default::default(),
            state,
            exit: None,
            metric: Some(metric),
            error: None,
            job: None,
            array_index: None,
            rung: Some(rung),
            time: 0.0,
        }
    }

    #[test]
    fn a_rung_promotes_its_top_third_as_trials_reach_it() {
        let s = SweepConfig {
            grace_steps: 6,
            reduction_factor: 3,
            ..Default::default()
        };
        let asha = Asha::new(&s, 54);
        assert_eq!(asha.rungs, vec![6, 18, 54]);
        let mut ledger = Vec::new();
        // two trials at rung 6: no promotion yet (floor(2 / 3) = 0)
        ledger.push(rec("a", 0, TrialState::Paused, 6, 3.0));
        ledger.push(rec("b", 1, TrialState::Paused, 6, 1.0));
        assert_eq!(asha.promotion(&Asha::progress(&ledger)), None);
        // a third: the best of the three goes on to 18
        ledger.push(rec("c", 2, TrialState::Paused, 6, 2.0));
        assert_eq!(
            asha.promotion(&Asha::progress(&ledger)),
            Some(("b".into(), 18))
        );
        ledger.push(rec("b", 1, TrialState::Running, 18, f64::NAN));
        assert_eq!(asha.promotion(&Asha::progress(&ledger)), None);
        // three more, all better than b: the quota is 2, one is left, the best unpromoted
        for (t, i, m) in [("d", 3, 0.5), ("e", 4, 0.4), ("f", 5, 0.6)] {
            ledger.push(rec(t, i, TrialState::Paused, 6, m));
        }
        assert_eq!(
            asha.promotion(&Asha::progress(&ledger)),
            Some(("e".into(), 18))
        );
        // higher rungs first: three at 18 promote one to 54
        ledger.push(rec("e", 4, TrialState::Paused, 18, 0.2));
        ledger.push(rec("b", 1, TrialState::Paused, 18, 0.3));
        ledger.push(rec("d", 3, TrialState::Running, 18, f64::NAN));
        assert_eq!(asha.promotion(&Asha::progress(&ledger)), None);
        ledger.push(rec("d", 3, TrialState::Paused, 18, 0.1));
        assert_eq!(
            asha.promotion(&Asha::progress(&ledger)),
            Some(("d".into(), 54))
        );
        // max mode ranks the other way; a missing metric ranks last
        let asha = Asha {
            mode: MetricMode::Max,
            ..asha
        };
        let mut l = vec![
            rec("a", 0, TrialState::Paused, 6, 3.0),
            rec("b", 1, TrialState::Paused, 6, 1.0),
            rec("c", 2, TrialState::Paused, 6, 2.0),
        ];
        l[0].metric = None;
        assert_eq!(asha.promotion(&Asha::progress(&l)), Some(("c".into(), 18)));
    }

    #[test]
    fn with_nothing_left_the_best_of_the_highest_rung_goes_on_until_one_reaches_the_end() {
        let s = SweepConfig {
            grace_steps: 6,
            reduction_factor: 3,
            ..Default::default()
        };
        let asha = Asha::new(&s, 54);
        // 6 trials, rf 3: two promoted to 18, floor(2 / 3) = 0 promotions there
        let mut ledger: Vec<Record> = ["a", "b", "c", "d", "e", "f"]
            .iter()
            .enumerate()
            .map(|(i, t)| rec(t, i, TrialState::Paused, 6, i as f64))
            .collect();
        ledger.push(rec("a", 0, TrialState::Paused, 18, 0.5));
        ledger.push(rec("b", 1, TrialState::Paused, 18, 0.25));
        let progress = Asha::progress(&ledger);
        assert_eq!(asha.promotion(&progress), None);
        assert_eq!(asha.finished(&progress), 0);
        // the best at 18 (not the best at 6) goes on to the end
        assert_eq!(asha.last_resort(&progress), Some(("b".into(), 54)));
        // it failed there for good: the next best at 18 goes on
        ledger.push(rec("b", 1, TrialState::Failed, 54, f64::NAN));
        assert_eq!(
            asha.last_resort(&Asha::progress(&ledger)),
            Some(("a".into(), 54))
        );
        // one reached the end: nothing more
        ledger.push(rec("a", 0, TrialState::Done, 54, 0.1));
        let progress = Asha::progress(&ledger);
        assert_eq!(asha.last_resort(&progress), None);
        assert_eq!(asha.finished(&progress), 1);
        // only rung-6 results (two of them diverged, ranking last): the best at 6 goes on
        let l = vec![
            rec("a", 0, TrialState::Paused, 6, f64::NAN),
            rec("b", 1, TrialState::Paused, 6, 2.0),
        ];
        assert_eq!(
            asha.last_resort(&Asha::progress(&l)),
            Some(("b".into(), 18))
        );
    }
}
