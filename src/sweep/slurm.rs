//! `kiln sweep FILE --executor slurm`: the Slurm executor. A grid's trials go as one Slurm job
//! array, at most `parallel` at once (`%N`); an asha sweep's segments as a job each
//! (`asha_slurm.rs` says how they go on). Each array task runs `kiln resume <trial dir>` (a fresh start when the trial has
//! no checkpoint), so a requeued, cancelled or failed trial continues where it stopped when the
//! sweep is submitted again. The ledger records each trial's job and array index; `refresh`
//! folds Slurm's states and the trials' summaries back into it, and a new submission skips the
//! trials that are done, queued or running.

use std::fs;
use std::path::{Path, PathBuf};

use super::asha_slurm::Decide;
use super::policy::{fill, is_asha, Again, AshaPolicy, Executor, Grid, Job, Policy};
use super::{add_pending, dir_of, ledger_io, plan, record, rows, write_results, Lock};
use super::{to_text, ExecutorKind, Ledger, Planned, Record, SweepSpec, TrialState};
use crate::config;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::slurm::{self as sl, absolute, have_sbatch};
use crate::ui;

/// Brings the ledger up to date for trials submitted to Slurm: done (their summary says
/// finished), queued or running (Slurm still has them), preempted (stopped with a checkpoint
/// and no longer queued), or failed (why, from the summary or Slurm). A trial Slurm could not
/// be asked about keeps its state; the returned lines say which and why.
pub fn refresh(dir: &Path, ledger: &Ledger, metric: &str) -> Result<Vec<String>> {
    let mut unknown = Vec::new();
    for (id, rec) in ledger.latest() {
        let (Some(job), Some(idx)) = (rec.job.clone(), rec.array_index) else {
            continue;
        };
        if !matches!(
            rec.state,
            TrialState::Queued | TrialState::Running | TrialState::Preempted | TrialState::Failed
        ) {
            continue;
        }
        let summary = crate::rundir::SummaryFile::read(&dir.join(&id));
        let status = summary.as_ref().map(|s| s.status.clone());
        let task = format!("{job}_{idx}");
        let slurm = match sl::query(&task) {
            Ok(s) => s,
            Err(why) => {
                unknown.push(format!("trial {id} (Slurm task {task}): {why}"));
                continue;
            }
        };
        // a failed trial changes only when it finished after all or Slurm runs it again
        if rec.state == TrialState::Failed
            && status.as_deref() != Some("finished")
            && !slurm.as_ref().is_some_and(|s| s.live())
        {
            continue;
        }
        let mut next = Record {
            time: rec.time,
            exit: None,
            metric: None,
            error: None,
            ..rec.clone()
        };
        next.state = match (status.as_deref(), &slurm) {
            (Some("finished"), _) => {
                next.metric = summary.as_ref().and_then(|s| s.number(metric));
                next.exit = Some(0);
                TrialState::Done
            }
            (_, Some(st)) if st.live() => match st.word() {
                "running" => TrialState::Running,
                _ => TrialState::Queued,
            },
            // an asha segment that paused at its rung and whose job ended before `kiln sweep
            // advance` recorded it
            (Some("paused"), _)
                if rec.rung.is_some()
                    && summary.as_ref().and_then(|s| s.steps) == rec.rung.map(|r| r as u64) =>
            {
                next.metric = summary.as_ref().and_then(|s| s.number(metric)).or_else(|| {
                    super::asha::metric_at(&dir.join(&id), rec.rung.unwrap_or(0), metric)
                });
                next.exit = Some(0);
                TrialState::Paused
            }
            // an asha segment cancelled before it trained (no summary, or its last rung's):
            // stopped, not failed; a submission runs it again
            (None | Some("paused"), Some(st))
                if rec.rung.is_some()
                    && (st.word() == "preempted" || st.state.starts_with("CANCELLED")) =>
            {
                next.error = Some(format!(
                    "Slurm task {task} ended {} before it reached step {}: submit the sweep again to continue it",
                    st.state,
                    rec.rung.unwrap_or(0)
                ));
                TrialState::Preempted
            }
            (Some("preempted"), _) => {
                next.error = Some(format!(
                    "preempted at step {}; not queued any more (Slurm task {task}): submit the sweep again to continue it",
                    summary.as_ref().map(|s| s.json["steps"].to_string()).unwrap_or_default()
                ));
                TrialState::Preempted
            }
            (_, st) => {
                next.error = Some(
                    summary
                        .as_ref()
                        .and_then(|s| s.error.as_deref())
                        .map(|e| e.lines().next().unwrap_or("").to_string())
                        .unwrap_or_else(|| match st {
                            Some(st) => format!("Slurm task {task} ended {}", st.state),
                            None => {
                                format!("Slurm task {task} is gone and the trial did not finish")
                            }
                        }),
                );
                TrialState::Failed
            }
        };
        if next.state != rec.state || next.error != rec.error {
            next.time = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0);
            ledger.append(&next).map_err(ledger_io)?;
        }
    }
    Ok(unknown)
}

/// Submits what a sweep can run now: a grid's trials that are not done, queued or running as
/// one job array; an asha sweep's segments, each a job, while fewer than `parallel` are queued
/// or running (the jobs submit the next ones, `kiln sweep advance`).
pub fn submit(spec: &SweepSpec, parallel: Option<usize>) -> Result<String> {
    let env: Vec<(String, String)> = std::env::vars().collect();
    let (base, planned) = plan(spec, &env)?;
    super::check_metric(&base, &planned)?;
    let s = &base.sweep;
    let asha = is_asha(s);
    let opened = Submission::open(spec, &base, &planned)?;
    let Submission {
        dir,
        jobs,
        old_spec,
        ledger,
        ..
    } = &opened;
    // asha decides under `Decide`, as its jobs do, and they submit the next segments with the
    // `parallel` last given
    let _decide = asha.then(|| Decide::take(dir)).transpose()?;
    let mut spec = spec.clone();
    let parallel = match asha {
        true => {
            let stored = old_spec
                .as_deref()
                .and_then(|b| serde_json::from_slice::<SweepSpec>(b).ok())
                .and_then(|s| s.parallel);
            let parallel = parallel.or(stored).unwrap_or(s.parallel).max(1);
            spec.parallel = Some(parallel);
            parallel
        }
        false => parallel.unwrap_or(s.parallel).max(1),
    };
    spec.store(dir, ExecutorKind::Slurm)?;
    opened.refresh(
        &planned,
        &s.metric,
        if asha { "segments" } else { "trials" },
    )?;
    // (a submission runs stopped and failed trials again, and an asha sweep's segments)
    let mut policy: Box<dyn Policy> = match asha {
        true => Box::new(AshaPolicy::on_slurm(&base, Again::All)),
        false => {
            let latest = ledger.latest();
            Box::new(Grid::new(&planned, |p| {
                !matches!(
                    latest.get(&p.id).map(|r| r.state),
                    Some(TrialState::Done | TrialState::Queued | TrialState::Running)
                )
            }))
        }
    };
    let mut exec = Slurm::new(dir, &base, (&planned, jobs), parallel, asha);
    if let Err(e) = fill(policy.as_mut(), &mut exec, &planned, ledger) {
        if exec.sent.is_empty() {
            // nothing submitted: take back what this call wrote
            opened.take_back(exec.script.as_deref(), &exec.made);
        } else {
            ui::out(&format!("submitted {}", exec.sent.join(", ")));
        }
        return Err(e);
    }
    let rows = rows(dir, ledger, s);
    if asha || exec.sent.is_empty() {
        write_results(dir, &rows, &s.metric)?;
    }
    if exec.sent.is_empty() {
        ui::out(&to_text(&rows, &s.metric));
        ui::out(&match asha {
            true => format!("nothing to submit: no segment of {} can run now (done, paused below its rung's quota, queued or running)", dir.display()),
            false => format!("nothing to submit: every trial of {} is done, queued or running", dir.display()),
        });
        return Ok(String::new());
    }
    Ok(exec.announce(planned.len()))
}

/// The executor of a sweep on Slurm. A grid's trials go as one job array, at most `parallel`
/// at once (`%N`), which `flush` submits; an asha sweep's segments each as a job (a one-task
/// array) while fewer than `parallel` are queued or running, since which segment comes next
/// depends on the rungs the others reach.
pub(super) struct Slurm<'a> {
    dir: &'a Path,
    base: &'a Config,
    /// The planned trials, and each one's config as its job runs it.
    planned: &'a [Planned],
    jobs: &'a [Config],
    parallel: usize,
    /// asha: a job per segment.
    segments: bool,
    /// A job array's trials (their places in `planned`), gathered by `start`.
    array: Vec<usize>,
    /// The run directories this submission made and the script it wrote: taken back when
    /// sbatch refuses the first job.
    pub made: Vec<PathBuf>,
    pub script: Option<PathBuf>,
    /// What was submitted: the job array's id, or "trial I to step S (job J)" per segment.
    pub sent: Vec<String>,
    /// The job array's trials' indices.
    indices: Vec<usize>,
}

impl<'a> Slurm<'a> {
    pub fn new(
        dir: &'a Path,
        base: &'a Config,
        (planned, jobs): (&'a [Planned], &'a [Config]),
        parallel: usize,
        segments: bool,
    ) -> Slurm<'a> {
        Slurm {
            dir,
            base,
            planned,
            jobs,
            parallel,
            segments,
            array: Vec::new(),
            made: Vec::new(),
            script: None,
            sent: Vec::new(),
            indices: Vec::new(),
        }
    }

    fn job_of(&self, p: &Planned) -> Result<(usize, &'a Config)> {
        let i = self
            .planned
            .iter()
            .position(|q| q.id == p.id)
            .ok_or_else(|| Error::Invalid(format!("trial {} is not planned", p.id)))?;
        Ok((i, &self.jobs[i]))
    }

    /// Writes trial `p`'s job config and the script of its segment (to rung step `target`,
    /// pausing at `pause`) and submits it: the job id.
    fn submit_segment(&mut self, p: &Planned, job: &Job, target: usize) -> Result<String> {
        let (_, config) = self.job_of(p)?;
        let kiln = sl::kiln_exe()?;
        let mut trials = Vec::new();
        write_trials(self.dir, &[(p, config)], &mut self.made, &mut trials)?;
        let path = self
            .dir
            .join(format!("slurm/{}-step-{target}.sbatch", p.id));
        let seg = sl::Segment {
            sweep_dir: self.dir,
            trial: &p.id,
            pause_at: job.pause,
        };
        let script = sl::array_script(self.base, &kiln, self.dir, &trials, 1, Some(&seg));
        fs::write(&path, &script)
            .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
        sl::sbatch(&path, &[]).inspect_err(|_| {
            let _ = fs::remove_file(&path);
        })
    }

    /// What a successful submission says, and returns.
    fn announce(&self, trials: usize) -> String {
        let dir = self.dir.display();
        if self.segments {
            ui::out(&format!(
                "submitted asha segment(s): {}; at most {} queued or running, each job submits the next as trials reach their rungs; sweep dir: {dir}",
                self.sent.join(", "),
                self.parallel,
            ));
            ui::note(&format!(
                "  = `kiln sweep status {dir}` shows the rungs; the jobs' output is in logs/slurm-<job>_<index>.out"
            ));
            return self.sent.join(",");
        }
        let id = self.sent.join(",");
        let indices: Vec<String> = self.indices.iter().map(|i| i.to_string()).collect();
        ui::out(&format!(
            "submitted Slurm job array {id}: trial(s) {} of {trials}, at most {} at once; sweep dir: {dir}",
            indices.join(","),
            self.parallel,
        ));
        ui::note(&format!(
            "  = `kiln sweep status {dir}` shows them; their output is in logs/slurm-{id}_<index>.out"
        ));
        id
    }
}

impl Executor for Slurm<'_> {
    fn busy(&self, ledger: &Ledger) -> Vec<String> {
        ledger
            .latest()
            .values()
            .filter(|r| r.with_slurm())
            .map(|r| r.trial.clone())
            .collect()
    }
    fn room(&self, busy: usize) -> bool {
        // (a job array holds every trial, `%parallel` of them at once; a cancelled job's
        // `kiln sweep advance` submits nothing more)
        !self.segments || (busy < self.parallel && !super::asha_slurm::stopped())
    }
    fn start(&mut self, p: &Planned, job: &Job, ledger: &Ledger) -> Result<bool> {
        if !self.segments {
            let (i, _) = self.job_of(p)?;
            self.array.push(i);
            return Ok(true);
        }
        let target = job.rung.unwrap_or(0);
        let id = self.submit_segment(p, job, target)?;
        let mut r = job.record(p, TrialState::Queued);
        r.job = Some(id.clone());
        r.array_index = Some(p.trial.index);
        ledger.append(&r).map_err(ledger_io)?;
        self.sent.push(format!(
            "trial {} to step {target} (job {id})",
            p.trial.index
        ));
        Ok(true)
    }
    fn flush(&mut self, ledger: &Ledger) -> Result<()> {
        if self.array.is_empty() {
            return Ok(());
        }
        let todo: Vec<(&Planned, &Config)> = self
            .array
            .iter()
            .map(|&i| (&self.planned[i], &self.jobs[i]))
            .collect();
        let mut trials: Vec<(usize, PathBuf)> = Vec::new();
        let n = fs::read_dir(self.dir.join("slurm"))
            .map(|d| d.count())
            .unwrap_or(0);
        let script_path = self.dir.join(format!("slurm/array-{}.sbatch", n + 1));
        self.script = Some(script_path.clone());
        write_trials(self.dir, &todo, &mut self.made, &mut trials)?;
        let kiln = sl::kiln_exe()?;
        let script = sl::array_script(self.base, &kiln, self.dir, &trials, self.parallel, None);
        fs::write(&script_path, &script)
            .map_err(|e| Error::io(format!("writing {}", script_path.display()), e))?;
        let id = sl::sbatch(&script_path, &[])?;
        self.sent.push(id.clone());
        self.indices = trials.iter().map(|(i, _)| *i).collect();
        for (p, _) in &todo {
            let mut r = record(p, TrialState::Queued);
            r.job = Some(id.clone());
            r.array_index = Some(p.trial.index);
            ledger.append(&r).map_err(ledger_io)?;
        }
        self.array.clear();
        Ok(())
    }
}

/// A Slurm sweep's directory opened for a submission: every trial's job config checked before
/// anything is written, `logs/` and `slurm/` made, the sweep locked, the spec as it was (for
/// taking back what a refused submission wrote), its ledger.
pub(super) struct Submission {
    pub dir: PathBuf,
    /// Each planned trial's config as its job runs it.
    pub jobs: Vec<Config>,
    /// The outermost directory this submission creates: removed again if sbatch refuses.
    created: Option<PathBuf>,
    spec_path: PathBuf,
    pub old_spec: Option<Vec<u8>>,
    pub ledger: Ledger,
    _lock: Lock,
}

impl Submission {
    pub(super) fn open(spec: &SweepSpec, base: &Config, planned: &[Planned]) -> Result<Submission> {
        can_submit(base)?;
        let dir = absolute(dir_of(spec, base))?;
        super::refuse_run_dir(&dir)?;
        let jobs = job_configs(planned, &base.slurm, &dir)?;
        let created = crate::rundir::first_missing(&dir);
        fs::create_dir_all(dir.join("logs"))
            .and_then(|_| fs::create_dir_all(dir.join("slurm")))
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        let lock = Lock::take(&dir)?;
        let spec_path = dir.join("sweep.json");
        let old_spec = fs::read(&spec_path).ok();
        let ledger = Ledger {
            path: dir.join("sweep.jsonl"),
        };
        Ok(Submission {
            dir,
            jobs,
            created,
            spec_path,
            old_spec,
            ledger,
            _lock: lock,
        })
    }

    /// Adds the planned trials the ledger lacks and brings it up to date with Slurm; refuses
    /// (submitting nothing) when Slurm could not be asked about `what` submitted before.
    pub(super) fn refresh(&self, planned: &[Planned], metric: &str, what: &str) -> Result<()> {
        add_pending(&self.ledger, planned, &self.ledger.latest())?;
        let unknown = refresh(&self.dir, &self.ledger, metric)?;
        if !unknown.is_empty() {
            return Err(Error::Invalid(format!(
                "Slurm could not be asked about {what} submitted before; submitting nothing (a live trial could be submitted twice):\n  {}\n  = help: submit again when `squeue` answers",
                unknown.join("\n  ")
            )));
        }
        Ok(())
    }

    /// Takes back what this submission wrote when sbatch refused its first job (`script`, if
    /// written).
    pub(super) fn take_back(&self, script: Option<&Path>, made: &[PathBuf]) {
        take_back(
            self.created.as_deref(),
            script,
            made,
            &self.spec_path,
            self.old_spec.as_deref(),
        );
    }
}

/// What stops a submission before anything is written: a CUDA sweep of several tasks per
/// node, or no `sbatch` here.
fn can_submit(base: &Config) -> Result<()> {
    if base.slurm.tasks_per_node > 1 && base.backend.device.needs_gpus() {
        return Err(Error::Usage(
            "`slurm.tasks_per_node` > 1 with backend.device = \"cuda\": one kiln process drives all of a node's GPUs".into(),
        ));
    }
    if !have_sbatch() {
        return Err(Error::Usage(
            "`sbatch` is not on PATH: `kiln sweep --executor slurm` submits through Slurm's sbatch\n  = help: run it on a machine of the cluster (a login node), or use the local executor".into(),
        ));
    }
    Ok(())
}

/// Every trial's config as its Slurm job runs it (`slurm.nodes` x `slurm.tasks_per_node` kiln
/// nodes, a token file in its run directory), each checked as `kiln run` would.
pub(super) fn job_configs(
    planned: &[Planned],
    shape: &config::SlurmConfig,
    dir: &Path,
) -> Result<Vec<Config>> {
    let nnodes = shape.nodes * shape.tasks_per_node;
    let mut jobs = Vec::with_capacity(planned.len());
    for p in planned {
        let mut r = p.resolved.clone();
        r.config.launch.nnodes = nnodes;
        r.config.launch.node_rank = 0;
        if nnodes > 1 {
            r.config.launch.token_file =
                Some(dir.join(&p.id).join("slurm/token").display().to_string());
        }
        let named = |e: Error| {
            Error::Usage(format!(
                "sweep trial {} ({}) as a Slurm job of {nnodes} kiln node(s): {e}",
                p.trial.index,
                p.trial.describe()
            ))
        };
        if nnodes > 1 && r.config.strategy.kind == config::StrategyKind::Single {
            return Err(named(Error::Usage(
                "strategy.kind = \"single\" runs in one process; use ddp or fsdp across nodes"
                    .into(),
            )));
        }
        config::validate(&r).map_err(|e| named(e.into()))?;
        crate::launch::check(&r).map_err(named)?;
        jobs.push(crate::rundir::stored_config_for_elsewhere(&r));
    }
    Ok(jobs)
}

/// Writes each trial's job config (and token) into its run directory before the array starts,
/// on every submission (a changed job shape applies to a trial resubmitted); `made` gets the
/// directories it created and `trials` each trial's index and directory, also on an error.
pub(super) fn write_trials(
    dir: &Path,
    todo: &[(&Planned, &Config)],
    made: &mut Vec<PathBuf>,
    trials: &mut Vec<(usize, PathBuf)>,
) -> Result<()> {
    for (p, job) in todo {
        let run = dir.join(&p.id);
        if !run.exists() {
            made.push(run.clone());
        }
        fs::create_dir_all(run.join("slurm"))
            .map_err(|e| Error::io(format!("creating {}", run.display()), e))?;
        if let Some(token) = &job.launch.token_file {
            if !Path::new(token).exists() {
                sl::write_token(Path::new(token))?;
            }
        }
        let cfg = run.join("config.toml");
        let tmp = run.join("config.toml.tmp");
        fs::write(&tmp, config::to_toml(job))
            .and_then(|_| fs::rename(&tmp, &cfg))
            .map_err(|e| Error::io(format!("writing {}", cfg.display()), e))?;
        trials.push((p.trial.index, run));
    }
    Ok(())
}

/// Takes back what a submission that sbatch refused wrote: the directory it created, or its
/// script, the trial directories it made and the spec as it was before.
fn take_back(
    created: Option<&Path>,
    script_path: Option<&Path>,
    made: &[PathBuf],
    spec_path: &Path,
    old_spec: Option<&[u8]>,
) {
    match created {
        Some(c) => {
            let _ = fs::remove_dir_all(c);
        }
        None => {
            if let Some(script) = script_path {
                let _ = fs::remove_file(script);
            }
            for d in made {
                let _ = fs::remove_dir_all(d);
            }
            let _ = match old_spec {
                Some(old) => fs::write(spec_path, old),
                None => fs::remove_file(spec_path),
            };
        }
    }
}
