//! Executing a run on this node: `start` (a fresh run, or `--resume` of the newest unfinished
//! one), `resume` (a given run directory), and `execute`, which trains one session in a run
//! directory. Every single-node session goes through `run_in` (the directory held for the
//! whole session, a fresh run refused as bad input taken back), every node of a job through
//! `node.rs`; both hand `execute` an [`Entry`]. A session goes in order, each step needing what the one before made:
//! [`Prepared`] (data, model, plan and checkpoint, checked), the checks passed ([`Passed`]),
//! the job's NCCL variables exported ([`NcclEnv`]), the run's files begun ([`RunFiles`]),
//! training, then `summary.json` and the report. Multi-node jobs go through `node.rs` (and
//! its restart agent, `node_agent`) to the same `execute`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::node::{run_node, Target};
use super::prepare::Prepared;
use super::resume::{prepare_resume, Resumption};
use super::session::{summary_of, SummaryInputs};
use super::session::{PendingChecks, RunFiles};
use super::{train_ranks, NodeLink, RunResult};
use crate::backend::{self, BackendKind, Placement};
use crate::checkpoint::{CheckpointDir, Loaded};
use crate::config::{self, Config, Resolved};
use crate::error::{Error, Result};
use crate::rendezvous::nccl_env::NcclEnv;
use crate::rendezvous::Job;
use crate::rundir::{
    claim_run_dir, first_missing, is_empty_dir, lock_run_dir, newest_unfinished, RunLock,
};
use crate::train::{TrainError, TrainEvent, TrainInput};
use crate::ui::{self, Progress};

/// How `kiln run` was asked to run (besides the config).
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Write the run here instead of `<output_dir>/<experiment.name>` (must not hold a run).
    pub run_dir: Option<PathBuf>,
    pub quiet: bool,
    /// Resume the newest unfinished run of the experiment (a fresh run when there is none).
    pub resume: bool,
}

pub fn start(r: &Resolved, a: &RunOptions) -> Result<()> {
    // Everything that can be bad input is checked before the run directory exists.
    let c = &r.config;
    if !a.quiet {
        for n in r.notes() {
            crate::ui::note(&n);
        }
    }
    // torchrun restarting its worker group (`--max-restarts`): the group continues the run the
    // first round started, from its newest verified checkpoint
    let restarted = std::env::var("TORCHELASTIC_RESTART_COUNT")
        .ok()
        .and_then(|n| n.trim().parse::<u64>().ok())
        .is_some_and(|n| n > 0);
    if let Some(d) = a
        .run_dir
        .as_ref()
        .filter(|d| restarted && d.join("config.toml").is_file())
    {
        if c.launch.nnodes > 1 {
            return run_node(r, &Target::Dir(d.clone(), None), a.quiet);
        }
        return continue_in(d, r, None, a.quiet);
    }
    let a = &RunOptions {
        resume: a.resume || (restarted && a.run_dir.is_none()),
        ..a.clone()
    };
    if c.launch.nnodes > 1 {
        let target = match (&a.run_dir, a.resume || c.checkpoint.auto_resume) {
            (Some(_), true) => return Err(Error::Usage(
                "--resume finds the run directory itself; use `kiln resume DIR` for a given one"
                    .into(),
            )),
            (d, false) => Target::New(d.clone()),
            (None, true) => Target::Newest,
        };
        return run_node(r, &target, a.quiet);
    }
    if a.resume || c.checkpoint.auto_resume {
        if a.run_dir.is_some() {
            return Err(Error::Usage(
                "--resume finds the run directory itself; use `kiln resume DIR` for a given one"
                    .into(),
            ));
        }
        if let Some(dir) =
            newest_unfinished(Path::new(&c.experiment.output_dir), &c.experiment.name)
        {
            return continue_in(&dir, r, None, a.quiet);
        }
        if !a.quiet {
            ui::note(&format!(
                "no unfinished run of `{}` to resume: starting a new one",
                c.experiment.name
            ));
        }
    }
    // the directory, and what claiming it creates (removed again when the run is refused as
    // bad input)
    let (lock, made) = match &a.run_dir {
        Some(d) => take_run_dir(d)?,
        None => claim_run_dir(Path::new(&c.experiment.output_dir), &c.experiment.name)?,
    };
    run_in(lock, Start::Fresh { made }, r, a.quiet)
}

/// What a single-node session starts from.
enum Start {
    /// A new run in a directory claimed for it; `made`: the outermost directory claiming it
    /// created.
    Fresh { made: Option<PathBuf> },
    /// A run continued (from its newest verified checkpoint, or one given).
    Continue(Box<Resumption>),
}

/// The one way a single-node session trains: in the directory `lock` holds for the whole
/// session. A fresh run refused as bad input (exit 2) leaves nothing behind: the directory
/// claiming made is removed again, still held.
fn run_in(lock: RunLock, start: Start, r: &Resolved, quiet: bool) -> Result<()> {
    let (resume, made) = match start {
        Start::Fresh { made } => (None, Some(made)),
        Start::Continue(res) => (Some(*res), None),
    };
    let entry = Entry {
        run_dir: lock.dir(),
        resume,
        job: None,
        prepared: None,
    };
    let result = execute(r, entry, quiet);
    if let Some(made) = made.filter(|_| result.as_ref().is_err_and(|e| e.exit_code() == 2)) {
        crate::rundir::release_unused(lock.dir(), made.as_deref());
    }
    result
}

/// A single-node session continuing the run in `dir` (from its newest verified checkpoint,
/// or `from`), the directory held for the whole session.
fn continue_in(dir: &Path, r: &Resolved, from: Option<&str>, quiet: bool) -> Result<()> {
    let lock = lock_run_dir(dir)?;
    let res = prepare_resume(dir, r, from, quiet)?;
    run_in(lock, Start::Continue(Box::new(res)), r, quiet)
}

/// `--run-dir DIR` for a new run: refused when it is not a directory or holds a run (checked
/// before and again after taking its lock); returns its guard and what creating it made.
pub(super) fn take_run_dir(d: &Path) -> Result<(RunLock, Option<PathBuf>)> {
    let holds = |d: &Path| {
        Error::Usage(format!(
            "--run-dir `{}` already holds a run (or is not a directory); choose a new directory (kiln never overwrites a run)",
            d.display()
        ))
    };
    if d.exists() && !is_empty_dir(d) {
        if let Some(pid) = crate::rundir::holder(d) {
            return Err(Error::Usage(format!(
                "run directory `{}` is in use by another kiln process (pid {pid}); wait for it to finish or stop it",
                d.display()
            )));
        }
        return Err(holds(d));
    }
    let made = first_missing(d);
    let lock = lock_run_dir(d)?;
    if !is_empty_dir(d) {
        return Err(holds(d));
    }
    Ok((lock, made))
}

/// `kiln resume`: continues the run in `run_dir` with `sets` applied, from its newest verified
/// checkpoint or `from`.
pub fn resume(
    run_dir: &Path,
    sets: &[String],
    flags: &[config::Flag],
    from: Option<&str>,
    quiet: bool,
) -> Result<()> {
    // before its config.toml is read through a link (the checkpoint directory is checked once
    // the config names it)
    crate::rundir::refuse_links(run_dir, "")?;
    let file = crate::rundir::run_config_file(run_dir)?;
    let env: Vec<(String, String)> = std::env::vars().collect();
    let r = config::load_run(&file, &env, sets, flags)?;
    if !quiet {
        for n in r.notes() {
            crate::ui::note(&n);
        }
    }
    if r.config.launch.nnodes > 1 {
        // every node runs `kiln resume DIR`; node 0 picks the checkpoint (and holds the
        // directory), the others follow
        return run_node(
            &r,
            &Target::Dir(run_dir.to_path_buf(), from.map(str::to_string)),
            quiet,
        );
    }
    continue_in(run_dir, &r, from, quiet)
}

/// How a session enters `execute`: where, continuing what, as which node of a job.
pub(super) struct Entry<'a> {
    /// The run directory. Its holder (`RunLock`) is the caller: a single-node session through
    /// `run_in`, node 0 of a job in `node_worker` (or its agent); the other nodes only write
    /// their logs there.
    pub run_dir: &'a Path,
    /// A run continued (`None`: a fresh one).
    pub resume: Option<Resumption>,
    /// A job of several nodes: this node's part of it.
    pub job: Option<Job>,
    /// What a node prepared while the others joined (made here when `None`, and again when
    /// the checkpoint's seeds replace the config's).
    pub prepared: Option<Prepared>,
}

/// Trains one session of `r` as `entry` says.
pub(super) fn execute(r: &Resolved, entry: Entry, quiet: bool) -> Result<()> {
    let Entry {
        run_dir,
        resume,
        mut job,
        prepared,
    } = entry;
    // the random streams of a resumed run are the checkpoint's (its `rng`), whatever seeds
    // the config now says: a resume continues the run it resumes, bit for bit
    let restored = resume
        .as_ref()
        .and_then(|res| res.from.as_ref())
        .and_then(|(_, state)| super::resume::restore_seeds(r, &state.rng));
    let prepared = prepared.filter(|_| restored.is_none());
    let r = restored.as_ref().unwrap_or(r);
    let c = &r.config;
    // node 0 (or a single-node run) writes the run's shared files; other nodes their logs
    let primary = job.as_ref().map(|j| j.node == 0).unwrap_or(true);
    let t = Duration::from_secs(c.launch.rendezvous_timeout_secs);
    let checks = PendingChecks::new(&mut job);
    let from_checkpoint = resume.as_ref().is_some_and(|res| res.from.is_some());
    let mut p = match prepared {
        Some(p) => p,
        None => Prepared::new(r, from_checkpoint)?,
    };
    p.check(r)?;
    let loaded = p.load_checkpoint(c, resume.as_ref())?;
    if loaded.is_some() {
        // a resumed run continues from its checkpoint, not from model.init_from
        p.init = None;
    }
    if primary {
        // everything a run changes is checked before the first change (and before the other
        // nodes are told to go on), so that a check that fails leaves a finished run's files
        // as they were
        preflight(run_dir, &c.checkpoint.dir)?;
    }
    // every node has what it needs: now node 0 may change files of a resumed run
    let passed = checks.pass(resume.is_some(), t)?;
    // the job's NCCL variables, in this process before anything loads NCCL
    let nccl = crate::rendezvous::nccl_env::export(c, job.as_mut(), t)?;
    if let Some(done) = loaded
        .as_ref()
        .and_then(|l| already_complete(c, run_dir, l))
    {
        if primary {
            ui::out(&done);
        }
        if let Some(j) = job.as_mut() {
            j.finish(t);
        }
        return Ok(());
    }
    let from_step = loaded.as_ref().map(|l| l.state.step);
    let files = RunFiles::begin(
        r,
        run_dir,
        primary,
        resume.is_some(),
        from_step,
        p.placement.backend.name(),
        &passed,
    )?;
    let session = Session {
        c,
        run_dir,
        p: &p,
        loaded: loaded.as_ref(),
        store: CheckpointDir::new(run_dir.join(&c.checkpoint.dir)),
        first_step: from_step.unwrap_or(0),
    };
    session.train_and_report(files, job, &nccl, quiet)
}

/// A finished run resumed at (or past) its end has nothing to train: what to say, with every
/// file left as it is (a run whose summary does not say finished goes on, and gets its
/// summary).
fn already_complete(c: &Config, run_dir: &Path, l: &Loaded) -> Option<String> {
    let finished =
        crate::rundir::SummaryFile::read(run_dir).is_some_and(|s| s.status == "finished");
    if !finished {
        return None;
    }
    let (done, limit) = match c.train.max_steps {
        Some(m) => (l.state.step >= m, format!("train.max_steps = {m}")),
        None => (
            l.state.position.epoch >= c.train.epochs as u64,
            format!("train.epochs = {}", c.train.epochs),
        ),
    };
    // a run that early stopping ended is complete while the same patience would end it
    let stopped = c.train.early_stopping.as_ref().and_then(|e| {
        let w = l.state.early_stopping.as_ref()?;
        let mode = config::choice_name(&e.mode());
        (w.metric == e.metric.name() && w.mode == mode && w.bad_evals >= e.patience).then(|| {
            format!(
                "train.early_stopping: {} has not improved for {} evaluations, patience = {}",
                w.metric, w.bad_evals, e.patience
            )
        })
    });
    let (limit, help) = match stopped {
        Some(why) if !done => (
            why,
            "raise train.early_stopping.patience (or remove train.early_stopping) with --set to train further",
        ),
        _ if done => (
            limit,
            "raise train.max_steps or train.epochs with --set to train further",
        ),
        _ => return None,
    };
    Some(format!(
        "{} is already complete at step {} ({limit}): nothing to train\n  = help: {help}",
        run_dir.display(),
        l.state.step
    ))
}

/// One session's training, once its files are begun.
struct Session<'a> {
    c: &'a Config,
    run_dir: &'a Path,
    p: &'a Prepared,
    loaded: Option<&'a Loaded>,
    store: CheckpointDir,
    first_step: usize,
}

impl Session<'_> {
    /// Trains, then ends the job's part of this node and reports.
    fn train_and_report(
        &self,
        mut files: RunFiles,
        mut job: Option<Job>,
        nccl: &NcclEnv,
        quiet: bool,
    ) -> Result<()> {
        let (c, p) = (self.c, self.p);
        // (under torchrun the job's rank 0 only: `speaks`)
        let mut ui = Progress::new(quiet || !super::session::speaks(files.primary)).with_tokens(
            match p.model.task() {
                crate::model::Task::LanguageModel { block, .. } => Some(block),
                crate::model::Task::Classification { .. } => None,
            },
        );
        ui.info(&p.plan.describe());
        if let Some(line) = p.data.describe() {
            ui.info(&line);
        }
        ui.info(&format!(
            "backend: {} ({}), strategy {} on {} device{}",
            p.placement.backend.name(),
            backend::cpu_split(c),
            config::choice_name(&c.strategy.kind),
            p.plan.world_size,
            if p.plan.world_size == 1 { "" } else { "s" }
        ));
        if let Some(note) = &p.placement.note {
            ui.info(note);
        }
        let input = TrainInput {
            config: c,
            plan: &p.plan,
            data: &p.data,
            model: p.model.as_ref(),
            store: Some(&self.store),
            resume: self.loaded,
            init: p.init.as_deref(),
            shared_init: Default::default(),
            keep_params: false,
        };
        #[cfg(feature = "cuda")]
        let nccl_id = match job.as_mut() {
            Some(j) if p.placement.collective == backend::CommKind::Nccl => {
                Some(nccl.share_id(j, c)?)
            }
            _ => None,
        };
        let link = job.as_mut().map(|j| NodeLink {
            node: j.node,
            nnodes: j.nnodes,
            ring: j.ring.take(),
            stop: std::sync::Arc::clone(&j.stop),
            links: std::sync::Arc::clone(&j.links),
            #[cfg(feature = "cuda")]
            nccl_id,
        });
        // the step and epoch the run got to, for the summary of a run that fails
        let mut reached: (Option<usize>, Option<f64>) = (None, None);
        let logs = files.logs();
        let first_step = self.first_step;
        let result = train(
            &p.placement,
            &input,
            Some(&logs),
            link,
            nccl,
            &mut |ev| match ev {
                TrainEvent::Started { total_steps, .. } => ui.start(total_steps, first_step),
                TrainEvent::Checkpoint { step } => {
                    ui.info(&format!("saved checkpoint step-{step:08}"))
                }
                TrainEvent::Step {
                    step,
                    loss,
                    samples_per_sec,
                    line,
                } => {
                    ui.step(step, loss, samples_per_sec, line.is_some());
                    reached.0 = Some(step);
                    // an evaluation, when it happens (issue 58, defect 19: it reached
                    // metrics.jsonl only)
                    if let Some(eval) = line.as_ref().and_then(|l| l.eval_loss.map(|e| (l, e))) {
                        let (l, e) = eval;
                        let metric = match (l.eval_perplexity, l.eval_accuracy) {
                            (Some(p), _) => format!(", eval perplexity {p:.3}"),
                            (_, Some(a)) => format!(", eval accuracy {a:.4}"),
                            _ => String::new(),
                        };
                        ui.info(&format!("eval at step {step}: eval loss {e:.4}{metric}"));
                    }
                    if let Some(line) = line {
                        reached.1 = Some(line.epoch);
                        files.line(&line);
                    }
                }
            },
        );
        ui.finish();
        let result = self.end_job(result, &mut job, &mut ui);
        // a metrics file that could not be written (a full disk) fails the run like any
        // error: the failed summary, no `.tmp` left
        let result = match files.take_error() {
            Some(e) => Err(e),
            None => result,
        };
        self.report(result, &files, reached)
    }

    /// Writes this node's traces and ends its part in the job; the error to report is the
    /// job's stop when the ranks failed in a collective under it.
    fn end_job(
        &self,
        result: std::result::Result<RunResult, TrainError>,
        job: &mut Option<Job>,
        ui: &mut Progress,
    ) -> Result<(RunResult, Option<Result<Option<PathBuf>>>)> {
        let c = self.c;
        // traces before `finish`: a node that has finished has its files on disk for node 0
        let node = job.as_ref().map(|j| j.node).unwrap_or(0);
        let traces = result
            .as_ref()
            .ok()
            .map(|res| super::profile::write_traces(c, self.run_dir, res, node));
        if let Some(j) = job.as_mut() {
            if result.is_ok() {
                j.finish(Duration::from_secs(c.launch.rendezvous_timeout_secs));
            } else {
                // failing: the heartbeat thread must not pre-empt the error report
                j.done.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
        if let Some(server) = job.as_ref().and_then(|j| j.server.as_ref()) {
            for r in server.rejected() {
                ui.info(&format!("rendezvous store refused a connection from {r}"));
            }
        }
        // a job stopped under this node (a silent node, a lost store) is the cause when the
        // ranks failed in a collective (stopped, or cut off by the closed ring); any other
        // failure is the ranks' own
        let stopped = job.as_ref().and_then(|j| j.stop.reason());
        match (result, stopped) {
            (Err(TrainError::Collective(_)), Some(why)) => Err(Error::Launch(why.into())),
            (r, _) => r.map(|res| (res, traces)).map_err(Error::from),
        }
    }

    /// `summary.json` and what the session says at its end.
    fn report(
        &self,
        result: Result<(RunResult, Option<Result<Option<PathBuf>>>)>,
        files: &RunFiles,
        reached: (Option<usize>, Option<f64>),
    ) -> Result<()> {
        let (c, p) = (self.c, self.p);
        let inputs = SummaryInputs {
            config: c,
            plan: &p.plan,
            placement: &p.placement,
            model_kind: p.model.kind().to_string(),
            flops_per_sample: p.model.flops_per_sample(),
            config_hash: config::config_hash(c),
            first_step: self.first_step,
            first_epoch: self.loaded.map_or(0.0, |l| l.state.position.epoch as f64),
        };
        let summary = |status, error, res| summary_of(&inputs, status, error, res, reached);
        let run_dir = self.run_dir;
        // (under torchrun the job's rank 0 only: `speaks`; errors still reach `main`)
        let speaks = super::session::speaks(files.primary);
        let say = |line: &str| {
            if speaks {
                ui::out(line)
            }
        };
        match result {
            Ok((res, _)) if res.outcome.preempted.is_some() => {
                let step = res.outcome.steps;
                files.summary(&summary("preempted", None, Some(&res)))?;
                let why = res.outcome.preempted.clone().unwrap_or_default();
                Err(Error::Preempted(format!(
                    "stopped at step {step} ({why}): checkpoint step-{step:08} is saved; run dir: {}\n  = help: continue it with `kiln resume {}`",
                    run_dir.display(),
                    run_dir.display()
                )))
            }
            Ok((res, _)) if res.outcome.paused.is_some() => {
                let step = res.outcome.steps;
                files.summary(&summary("paused", None, Some(&res)))?;
                say(&format!(
                    "paused at step {step} (train.pause_at_step): checkpoint step-{step:08} is saved; run dir: {}\n  = help: continue it with `kiln resume {}`",
                    run_dir.display(),
                    run_dir.display()
                ));
                Ok(())
            }
            Ok((res, traces)) => {
                files.summary(&summary("finished", None, Some(&res)))?;
                match traces {
                    Some(Ok(Some(all))) => say(&format!(
                        "trace: {} (open it in https://ui.perfetto.dev or chrome://tracing)",
                        all.display()
                    )),
                    // the run itself finished: a trace that could not be written is a warning
                    Some(Err(e)) => ui::note(&format!("warning: the trace was not written: {e}")),
                    _ => {}
                }
                let steps = res.outcome.steps.saturating_sub(self.first_step);
                if steps > 0 {
                    say(&super::profile::breakdown_line(&res, steps));
                }
                let out = &res.outcome;
                let eval = out.eval_metrics().map_or(String::new(), |m| {
                    format!(
                        ", eval loss {:.4}, eval {}",
                        m.loss,
                        m.metric(|v| format!("{v:.3}"))
                    )
                });
                // (issue 58, defect 19: an early stop said nothing of itself)
                let early = match (out.stopped_early, out.early_stopping.as_ref()) {
                    (Some(at), Some(w)) => format!(
                        "; stopped early at step {at} of {}: {} did not improve for {} evaluations (best {:.4} at step {})",
                        p.plan.total_steps,
                        w.metric,
                        w.bad_evals,
                        w.best,
                        w.best_step
                    ),
                    (Some(at), None) => {
                        format!("; stopped early at step {at} of {}", p.plan.total_steps)
                    }
                    _ => String::new(),
                };
                say(&format!(
                    "finished {} steps in {:.1}s: final loss {:.4}{eval}{early}; run dir: {}",
                    out.steps,
                    out.wall_seconds,
                    out.final_loss,
                    run_dir.display()
                ));
                Ok(())
            }
            Err(e) => {
                // a checkpoint cut short (a full disk) leaves no `.tmp` behind
                if files.primary {
                    let _ = self.store.clean_tmp();
                }
                let mut s = summary("failed", Some(e.to_string()), None);
                // a diverged run reached its step
                if let Error::Train(TrainError::Diverged { step, .. }) = &e {
                    s.steps = *step;
                }
                // the first failure is the error; a summary that cannot be written is said
                if let Err(w) = files.summary(&s) {
                    ui::note(&format!("warning: the run failed, and {w}"));
                }
                say(&format!("failed; run dir: {}", run_dir.display()));
                Err(e)
            }
        }
    }
}

/// What a run checks in its directory before it changes anything there: no symbolic link
/// where it writes, and no entry in `checkpoints/` under a checkpoint's name that is not one
/// (a file `step-00000010` would fail the save at step 10, after the steps were trained).
/// Other `step-*` names are not kiln's: they are left alone, with a warning.
fn preflight(run_dir: &Path, checkpoint_dir: &str) -> Result<()> {
    crate::rundir::refuse_links(run_dir, checkpoint_dir)?;
    let store = CheckpointDir::new(run_dir.join(checkpoint_dir));
    for p in store.strays() {
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if crate::checkpoint::step_of(&name).is_some_and(|(tmp, _)| !tmp) {
            return Err(Error::Usage(format!(
                "`{}` has a checkpoint's name but is not a checkpoint directory; saving that step would fail\n  = help: move it out of {}",
                p.display(),
                store.dir.display()
            )));
        }
        ui::note(&format!(
            "warning: skipping `{}`: not a checkpoint kiln wrote (checkpoints are directories named step- and 8 digits)",
            p.display()
        ));
    }
    Ok(())
}

/// Trains every rank of this node as placed; `logs` receives `rank-<r>.log`.
pub fn train(
    placement: &Placement,
    input: &TrainInput<'_>,
    logs: Option<&Path>,
    link: Option<NodeLink>,
    _: &NcclEnv,
    on_event: &mut dyn FnMut(TrainEvent),
) -> std::result::Result<RunResult, TrainError> {
    let n = backend::threads(
        &input.config.backend,
        input.config.strategy.devices.count(),
        input.config.data.workers,
    );
    backend::set_matmul_threads(n);
    macro_rules! dispatch {
        ($($(#[$a:meta])* $v:ident = $name:literal => $ty:ty),* $(,)?) => {
            match placement.backend {
                $($(#[$a])* BackendKind::$v => train_ranks::<$ty>(input, placement, n, logs, link, on_event),)*
            }
        };
    }
    crate::model::for_each_backend!(dispatch)
}
