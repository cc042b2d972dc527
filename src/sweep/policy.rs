//! What a sweep runs next, whatever runs it: a [`Policy`] (grid and random: each trial once,
//! to its end; ASHA: segments to rungs and promotions) hands out [`Job`]s, an [`Executor`]
//! (child processes here, `local.rs`; Slurm jobs, `slurm.rs`) starts them, and [`fill`] is
//! the one place the two meet: while the executor has room, the policy's next job starts.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitStatus;

use super::asha::{pause_at, segment_record};
use super::{ended, record, Asha, Ledger, Planned, Record, TrialState};
use crate::config::{Config, SweepConfig};
use crate::error::Result;
use crate::ui::SweepProgress;

/// One process's work for a trial: to its end, or (asha) to a rung step, where it pauses.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Job {
    /// The trial's id.
    pub id: String,
    /// asha: the rung step it is sent to.
    pub rung: Option<usize>,
    /// Its `train.pause_at_step` (0: none; asha's last rung runs to the end).
    pub pause: usize,
}

impl Job {
    fn to_end(id: &str) -> Job {
        Job {
            id: id.to_string(),
            rung: None,
            pause: 0,
        }
    }

    fn to_rung(asha: &Asha, id: String, target: usize) -> Job {
        Job {
            id,
            rung: Some(target),
            pause: pause_at(asha, target),
        }
    }

    /// Its trial in the plan (`None`: a trial of an earlier plan the ledger still holds).
    pub fn planned<'a>(&self, planned: &'a [Planned]) -> Option<&'a Planned> {
        planned.iter().find(|p| p.id == self.id)
    }

    /// How progress names it.
    pub fn describe(&self, p: &Planned) -> String {
        match self.rung {
            Some(target) => format!("{} to step {target}", p.trial.describe()),
            None => p.trial.describe(),
        }
    }

    /// Its ledger record in `state` (asha: with its rung).
    pub fn record(&self, p: &Planned, state: TrialState) -> Record {
        let mut r = record(p, state);
        r.rung = self.rung;
        r
    }

    /// The ledger record of the job's process, which ended with `status` (see `ended` and
    /// `segment_record`).
    pub fn ended(
        &self,
        dir: &Path,
        p: &Planned,
        status: ExitStatus,
        stopping: bool,
        metric: &str,
    ) -> Record {
        match self.rung {
            Some(target) => segment_record(dir, p, target, status, stopping, metric),
            None => ended(dir, p, status, stopping, metric),
        }
    }
}

/// What a sweep runs next, and what becomes of a job that could not start or failed.
pub(super) trait Policy {
    /// The next job, of none of the `busy` trials (those with a job now); `None`: nothing to
    /// start now.
    fn next(&mut self, planned: &[Planned], busy: &[String], ledger: &Ledger) -> Option<Job>;
    /// `job` again: it could not start yet (its GPUs are held: first next time), or it failed
    /// with retries left (`failed`).
    fn again(&mut self, job: Job, failed: bool);
    /// What progress says of a job that ended with `rec`.
    fn report(&self, ui: &mut SweepProgress, rec: &Record);
    /// The closing table's last line, if any.
    fn closing(&self, planned: &[Planned], ledger: &Ledger) -> Option<String>;
}

/// While `exec` has room, starts `policy`'s next job (one `policy.next` at a time, so that a
/// decision sees every job started before it), then hands over what was started.
pub(super) fn fill(
    policy: &mut dyn Policy,
    exec: &mut dyn Executor,
    planned: &[Planned],
    ledger: &Ledger,
) -> Result<()> {
    loop {
        let busy = exec.busy(ledger);
        if !exec.room(busy.len()) {
            break;
        }
        let Some(job) = policy.next(planned, &busy, ledger) else {
            break;
        };
        let Some(p) = job.planned(planned) else {
            break;
        };
        if !exec.start(p, &job, ledger)? {
            policy.again(job, false);
            break;
        }
    }
    exec.flush(ledger)
}

/// What runs a sweep's jobs: child processes here, or Slurm jobs.
pub(super) trait Executor {
    /// The trials with a job now (running here; queued or running in Slurm).
    fn busy(&self, ledger: &Ledger) -> Vec<String>;
    /// Whether another job may start beside `busy` ones.
    fn room(&self, busy: usize) -> bool;
    /// Starts `job` of trial `p` and records it in the ledger; `Ok(false)`: not now (its GPUs
    /// are held by running trials).
    fn start(&mut self, p: &Planned, job: &Job, ledger: &Ledger) -> Result<bool>;
    /// Hands over what `start` gathered (a job array: one submission).
    fn flush(&mut self, ledger: &Ledger) -> Result<()> {
        let _ = ledger;
        Ok(())
    }
}

/// Grid and random search: each trial once, to its end, in trial order.
pub(super) struct Grid {
    /// The trials to run, last first (popped from the back).
    queue: Vec<String>,
}

impl Grid {
    /// The trials of `planned` that `todo` passes, in trial order.
    pub fn new(planned: &[Planned], todo: impl Fn(&Planned) -> bool) -> Grid {
        let mut queue: Vec<String> = planned
            .iter()
            .filter(|p| todo(p))
            .map(|p| p.id.clone())
            .collect();
        queue.reverse();
        Grid { queue }
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }
}

impl Policy for Grid {
    fn next(&mut self, _: &[Planned], _: &[String], _: &Ledger) -> Option<Job> {
        self.queue.pop().map(|id| Job::to_end(&id))
    }
    fn again(&mut self, job: Job, failed: bool) {
        match failed {
            // (a retry goes after the trials not tried yet)
            true => self.queue.insert(0, job.id),
            false => self.queue.push(job.id),
        }
    }
    fn report(&self, ui: &mut SweepProgress, rec: &Record) {
        ui.finished(
            &rec.trial,
            matches!(rec.state, TrialState::Done | TrialState::Paused),
            rec.error.as_deref().unwrap_or_default(),
        );
    }
    fn closing(&self, _: &[Planned], _: &Ledger) -> Option<String> {
        None
    }
}

/// Which segments that did not reach their rung an asha sweep on Slurm runs again.
#[derive(Debug, Clone, Copy)]
pub(super) enum Again {
    /// A submission: every one, stopped or failed.
    All,
    /// A job going on with the sweep: failed ones while they failed at most this often (a
    /// stopped one was cancelled or preempted: the requeued job or the next submission).
    FailedWithin(usize),
}

/// ASHA: a trial left in flight first, then the best promotion, else a new trial to the first
/// rung (`Asha`'s rules).
pub(super) struct AshaPolicy {
    pub asha: Asha,
    metric: String,
    /// Segments to run first: each trial and the rung step it was sent to, last first.
    again: Vec<(String, usize)>,
    /// On Slurm, where every decision is another process's, the ledger is the only memory:
    /// `again` is read from it before each decision, as this says.
    reread: Option<Again>,
}

impl AshaPolicy {
    /// A local sweep's: the segments the ledger has in flight (a sweep that stopped) or failed
    /// while retries are left, of this plan's trials, go on first.
    pub fn local(base: &Config, planned: &[Planned], ledger: &Ledger) -> AshaPolicy {
        let s = &base.sweep;
        let mut again = in_flight(ledger, &ledger.failures(), s.retries);
        // (only this plan's trials: a changed grid leaves other trials in the ledger)
        again.retain(|(id, _)| planned.iter().any(|p| &p.id == id));
        AshaPolicy {
            asha: Asha::new(s, base.train.max_steps.unwrap_or(1)),
            metric: s.metric.clone(),
            again,
            reread: None,
        }
    }

    /// A Slurm sweep's: what runs again is read from the ledger at each decision.
    pub fn on_slurm(base: &Config, again: Again) -> AshaPolicy {
        let s = &base.sweep;
        AshaPolicy {
            asha: Asha::new(s, base.train.max_steps.unwrap_or(1)),
            metric: s.metric.clone(),
            again: Vec::new(),
            reread: Some(again),
        }
    }
}

impl Policy for AshaPolicy {
    fn next(&mut self, planned: &[Planned], busy: &[String], ledger: &Ledger) -> Option<Job> {
        if let Some(again_as) = self.reread {
            let latest = ledger.latest();
            let retries = match again_as {
                Again::All => usize::MAX,
                Again::FailedWithin(n) => n,
            };
            self.again = in_flight(ledger, &ledger.failures(), retries);
            self.again.retain(|(id, _)| {
                let stopped = latest.get(id).map(|r| r.state) == Some(TrialState::Preempted);
                !busy.contains(id)
                    && planned.iter().any(|p| &p.id == id)
                    && (matches!(again_as, Again::All) || !stopped)
            });
        }
        let idle = busy.is_empty();
        let is_busy = |id: &str| busy.iter().any(|b| b == id);
        let mut progress = Asha::progress(&ledger.read());
        // trials of an earlier plan (another grid) neither run nor count
        progress.retain(|id, _| planned.iter().any(|p| &p.id == id));
        let asha = &self.asha;
        let (id, target) = self
            .again
            .pop()
            .or_else(|| asha.promotion(&progress).filter(|(id, _)| !is_busy(id)))
            .or_else(|| {
                planned
                    .iter()
                    .find(|p| {
                        !is_busy(&p.id) && progress.get(&p.id).is_none_or(|g| g.furthest == 0)
                    })
                    .map(|p| (p.id.clone(), asha.rungs[0]))
            })
            // nothing new, nothing in flight: the sweep must not end without a trial at the end
            .or_else(|| idle.then(|| asha.last_resort(&progress)).flatten())?;
        Some(Job::to_rung(asha, id, target))
    }
    fn again(&mut self, job: Job, _failed: bool) {
        if let Some(target) = job.rung {
            self.again.push((job.id, target));
        }
    }
    fn report(&self, ui: &mut SweepProgress, rec: &Record) {
        let (asha, metric) = (&self.asha, &self.metric);
        match rec.state {
            TrialState::Paused => ui.paused(
                &rec.trial,
                &format!(
                    "paused at rung {} (step {}), {} {}",
                    rec.rung.and_then(|g| asha.rung_of(g)).unwrap_or(0),
                    rec.rung.unwrap_or(0),
                    metric,
                    rec.metric.map_or("-".into(), |m| m.to_string())
                ),
            ),
            st => ui.finished(
                &rec.trial,
                st == TrialState::Done,
                rec.error.as_deref().unwrap_or_default(),
            ),
        }
    }
    fn closing(&self, planned: &[Planned], ledger: &Ledger) -> Option<String> {
        let mut progress = Asha::progress(&ledger.read());
        progress.retain(|id, _| planned.iter().any(|p| &p.id == id));
        Some(format!(
            "{} of {} trials reached train.max_steps = {}",
            self.asha.finished(&progress),
            planned.len(),
            self.asha.rungs.last().copied().unwrap_or(0)
        ))
    }
}

/// The segments the ledger has in flight (a sweep that stopped) or failed while retries are
/// left: each trial and the rung step it was sent to.
pub(super) fn in_flight(
    ledger: &Ledger,
    failures: &BTreeMap<String, usize>,
    retries: usize,
) -> Vec<(String, usize)> {
    ledger
        .latest()
        .values()
        .filter(|r| match r.state {
            // (pending with a rung: stopped by the sweep's stop before it could checkpoint)
            TrialState::Running | TrialState::Preempted | TrialState::Pending => true,
            TrialState::Failed => failures.get(&r.trial).copied().unwrap_or(0) <= retries,
            _ => false,
        })
        .filter_map(|r| r.rung.map(|g| (r.trial.clone(), g)))
        .collect()
}

/// Whether `s`'s scheduler is ASHA (else grid or random search: `Grid`).
pub(super) fn is_asha(s: &SweepConfig) -> bool {
    s.scheduler == crate::config::SweepScheduler::Asha
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::{plan, ExecutorKind, SweepSpec};

    /// Three trials (`optim.lr`), planned from a file in `dir`; asha with rungs at 2, 6, 8.
    fn planned(dir: &Path, asha: bool) -> (Config, Vec<Planned>) {
        let file = dir.join("sweep.toml");
        let scheduler = match asha {
            true => "scheduler = \"asha\"\ngrace_steps = 2\n",
            false => "",
        };
        std::fs::write(
            &file,
            format!("[train]\nmax_steps = 8\neval_every = 2\n\n[sweep]\n{scheduler}grid = {{ \"optim.lr\" = [0.1, 0.2, 0.3] }}\n"),
        )
        .unwrap();
        let spec = SweepSpec {
            file,
            sets: Vec::new(),
            executor: ExecutorKind::Local,
            parallel: None,
            dir: None,
        };
        plan(&spec, &[]).unwrap()
    }

    /// An executor that starts what it is handed, `parallel` at once, refusing a trial's
    /// start once when told (its GPUs held), and nothing after the sweep's stop.
    struct Fake {
        parallel: usize,
        running: Vec<String>,
        started: Vec<Job>,
        refuse: Option<String>,
        stopping: bool,
    }

    impl Fake {
        fn new(parallel: usize) -> Fake {
            Fake {
                parallel,
                running: Vec::new(),
                started: Vec::new(),
                refuse: None,
                stopping: false,
            }
        }
        /// The trials started since the last call, by their place in `planned`.
        fn take(&mut self, planned: &[Planned]) -> Vec<usize> {
            let out = self
                .started
                .drain(..)
                .map(|j| planned.iter().position(|p| p.id == j.id).unwrap())
                .collect();
            out
        }
        fn end(&mut self, planned: &[Planned], i: usize) -> Job {
            self.running.retain(|id| *id != planned[i].id);
            Job::to_end(&planned[i].id)
        }
    }

    impl Executor for Fake {
        fn busy(&self, _: &Ledger) -> Vec<String> {
            self.running.clone()
        }
        fn room(&self, busy: usize) -> bool {
            !self.stopping && busy < self.parallel
        }
        fn start(&mut self, p: &Planned, job: &Job, _: &Ledger) -> Result<bool> {
            if self.refuse.as_deref() == Some(p.id.as_str()) {
                self.refuse = None;
                return Ok(false);
            }
            self.running.push(job.id.clone());
            self.started.push(job.clone());
            Ok(true)
        }
    }

    fn ledger(dir: &Path) -> Ledger {
        Ledger {
            path: dir.join("sweep.jsonl"),
        }
    }

    #[test]
    fn a_grid_starts_trials_in_order_as_room_allows_and_a_retry_after_the_new_ones() {
        let dir = crate::testdir::tempdir().unwrap();
        let (_, planned) = planned(dir.path(), false);
        let ledger = ledger(dir.path());
        let mut grid = Grid::new(&planned, |_| true);
        let mut exec = Fake::new(2);
        fill(&mut grid, &mut exec, &planned, &ledger).unwrap();
        assert_eq!(exec.take(&planned), [0, 1]);
        fill(&mut grid, &mut exec, &planned, &ledger).unwrap();
        assert!(exec.take(&planned).is_empty(), "no room");
        // trial 0 failed with retries left: it runs after trial 2
        let failed = exec.end(&planned, 0);
        grid.again(failed, true);
        fill(&mut grid, &mut exec, &planned, &ledger).unwrap();
        assert_eq!(exec.take(&planned), [2]);
        exec.end(&planned, 1);
        fill(&mut grid, &mut exec, &planned, &ledger).unwrap();
        assert_eq!(exec.take(&planned), [0]);
    }

    #[test]
    fn a_job_that_cannot_start_yet_is_the_first_next_time() {
        let dir = crate::testdir::tempdir().unwrap();
        let (_, planned) = planned(dir.path(), false);
        let ledger = ledger(dir.path());
        let mut grid = Grid::new(&planned, |p| p.id != planned[1].id);
        let mut exec = Fake::new(3);
        exec.refuse = Some(planned[0].id.clone());
        fill(&mut grid, &mut exec, &planned, &ledger).unwrap();
        assert!(exec.take(&planned).is_empty());
        fill(&mut grid, &mut exec, &planned, &ledger).unwrap();
        assert_eq!(exec.take(&planned), [0, 2]);
    }

    #[test]
    fn after_the_stop_nothing_starts_not_even_a_retry() {
        // (the grid loop once queued a trial that failed during the stop and started it again)
        let dir = crate::testdir::tempdir().unwrap();
        let (_, planned) = planned(dir.path(), false);
        let ledger = ledger(dir.path());
        let mut grid = Grid::new(&planned, |_| true);
        let mut exec = Fake::new(1);
        fill(&mut grid, &mut exec, &planned, &ledger).unwrap();
        assert_eq!(exec.take(&planned), [0]);
        exec.stopping = true;
        let failed = exec.end(&planned, 0);
        grid.again(failed, true);
        fill(&mut grid, &mut exec, &planned, &ledger).unwrap();
        assert!(exec.take(&planned).is_empty());
    }

    #[test]
    fn asha_on_slurm_reads_what_runs_again_from_the_ledger_at_each_decision() {
        let dir = crate::testdir::tempdir().unwrap();
        let (base, planned) = planned(dir.path(), true);
        let ledger = ledger(dir.path());
        // trial 1 failed once on its way to step 2
        let mut failed = record(&planned[1], TrialState::Failed);
        failed.rung = Some(2);
        ledger.append(&failed).unwrap();
        // a submission runs it again first, to its rung; new trials follow, to the first rung
        let mut all = AshaPolicy::on_slurm(&base, Again::All);
        let mut exec = Fake::new(2);
        fill(&mut all, &mut exec, &planned, &ledger).unwrap();
        assert_eq!(exec.take(&planned), [1, 0]);
        // a job going on with the sweep, no retries left: trial 1 stays failed
        let mut within = AshaPolicy::on_slurm(&base, Again::FailedWithin(0));
        let mut exec = Fake::new(3);
        fill(&mut within, &mut exec, &planned, &ledger).unwrap();
        let jobs: Vec<(usize, Option<usize>, usize)> = exec
            .started
            .iter()
            .map(|j| {
                let i = planned.iter().position(|p| p.id == j.id).unwrap();
                (i, j.rung, j.pause)
            })
            .collect();
        assert_eq!(jobs, [(0, Some(2), 2), (2, Some(2), 2)]);
    }
}
