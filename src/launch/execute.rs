//! Executing a run on this node: `start` (a fresh run, or `--resume` of the newest unfinished
//! one), `resume` (a given run directory), the multi-node agent that restarts the job's worker,
//! the node worker (rendezvous, the run directory and checkpoint agreed through node 0, the NCCL
//! id exchange), and `execute`, which trains and writes `config.toml`, `metrics.jsonl`,
//! `summary.json`, `logs/` and checkpoints.

use std::fs::{self, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::resume::{prepare_resume, Resumption};
use super::run_dir::{
    claim_run_dir, first_missing, is_empty_dir, lock_run_dir, newest_unfinished, stored_config,
    write_json,
};
use super::summary::{BestSummary, EarlyStopSummary, Summary};
use super::{run, NodeLink, RunResult};
use crate::backend::{self, Placement, Resolved as Backend};
use crate::checkpoint::Store;
use crate::config::{self, Config, Resolved};
use crate::data;
use crate::error::{Error, Result};
use crate::plan::Plan;
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
        lock_run_dir(d)?;
        let res = prepare_resume(d, r, None, a.quiet)?;
        return execute(r, d, Some(res), a.quiet, None);
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
            lock_run_dir(&dir)?;
            let res = prepare_resume(&dir, r, None, a.quiet)?;
            return execute(r, &dir, Some(res), a.quiet, None);
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
    let (run_dir, made) = match &a.run_dir {
        Some(d) => (d.clone(), take_run_dir(d)?),
        None => claim_run_dir(Path::new(&c.experiment.output_dir), &c.experiment.name)?,
    };
    let result = execute(r, &run_dir, None, a.quiet, None);
    if result.as_ref().is_err_and(|e| e.exit_code() == 2) {
        super::run_dir::release_unused(&run_dir, made.as_deref());
    }
    result
}

/// `--run-dir DIR` for a new run: refused when it is not a directory or holds a run (checked
/// before and again after taking its lock); returns what creating it made.
fn take_run_dir(d: &Path) -> Result<Option<PathBuf>> {
    let holds = |d: &Path| {
        Error::Usage(format!(
            "--run-dir `{}` already holds a run (or is not a directory); choose a new directory (kiln never overwrites a run)",
            d.display()
        ))
    };
    if d.exists() && !is_empty_dir(d) {
        if let Some(pid) = super::run_dir::holder(d) {
            return Err(Error::Usage(format!(
                "run directory `{}` is in use by another kiln process (pid {pid}); wait for it to finish or stop it",
                d.display()
            )));
        }
        return Err(holds(d));
    }
    let made = first_missing(d);
    lock_run_dir(d)?;
    if !is_empty_dir(d) {
        super::run_dir::unlock_run_dir(d);
        return Err(holds(d));
    }
    Ok(made)
}

/// `kiln resume`: continues the run in `run_dir` with `sets` applied, from its newest verified
/// checkpoint or `from`.
pub fn resume(run_dir: &Path, sets: &[String], from: Option<&str>, quiet: bool) -> Result<()> {
    // before its config.toml is read through a link (the checkpoint directory is checked once
    // the config names it)
    super::run_dir::refuse_links(run_dir, "")?;
    let file = super::run_dir::run_config_file(run_dir)?;
    let env: Vec<(String, String)> = std::env::vars().collect();
    let r = config::load(&file, &env, sets)?;
    if r.config.launch.nnodes > 1 {
        // every node runs `kiln resume DIR`; node 0 picks the checkpoint (and holds the
        // directory), the others follow
        return run_node(
            &r,
            &Target::Dir(run_dir.to_path_buf(), from.map(str::to_string)),
            quiet,
        );
    }
    lock_run_dir(run_dir)?;
    let res = prepare_resume(&run_dir, &r, from, quiet)?;
    execute(&r, &run_dir, Some(res), quiet, None)
}

/// Where a multi-node job runs (node 0 decides; the other nodes follow what it publishes).
enum Target {
    /// A new run: in this directory (which must not hold a run), or the next free one.
    New(Option<PathBuf>),
    /// `--resume`: the newest unfinished run of the experiment, else a new one.
    Newest,
    /// `kiln resume DIR [--from step-N]`.
    Dir(PathBuf, Option<String>),
}

/// Node 0's run directory, whether it continues a run there, and from which checkpoint
/// (`None`: the newest verified one). Within a job with restarts the agent has fixed the
/// directory (`KILN_WORKER_RUN_DIR`) and later rounds always continue.
fn node0_dir(target: &Target, c: &Config, round: usize) -> Result<(PathBuf, bool, Option<String>)> {
    // a worker under its agent: the agent chose (and holds) the directory
    if let Some(d) = std::env::var_os("KILN_WORKER_RUN_DIR") {
        let d = PathBuf::from(d);
        let started = d.join("config.toml").is_file();
        let (resume, from) = match target {
            _ if round > 0 => (true, None),
            Target::Dir(_, from) => (true, from.clone()),
            Target::Newest => (started, None),
            Target::New(_) => (false, None),
        };
        return Ok((d, resume, from));
    }
    let out = Path::new(&c.experiment.output_dir);
    Ok(match target {
        Target::New(Some(d)) => {
            take_run_dir(d)?;
            (d.clone(), false, None)
        }
        Target::New(None) => (claim_run_dir(out, &c.experiment.name)?.0, false, None),
        Target::Newest => match newest_unfinished(out, &c.experiment.name) {
            Some(d) => {
                lock_run_dir(&d)?;
                (d, true, None)
            }
            None => (claim_run_dir(out, &c.experiment.name)?.0, false, None),
        },
        Target::Dir(d, from) => {
            lock_run_dir(d)?;
            (d.clone(), true, from.clone())
        }
    })
}

/// One node of a multi-node job. With `launch.max_restarts` > 0 this process is the node's
/// agent: it runs the node's worker as a child and restarts the whole job (every node's agent
/// does the same) from the newest verified checkpoint when a worker dies.
fn run_node(r: &Resolved, target: &Target, quiet: bool) -> Result<()> {
    let c = &r.config;
    backend::resolve(c)?;
    let d = data::load(r)?;
    let model = crate::model::build(r, &d.input_shape())?;
    super::weights::init_weights(r, model.as_ref())?;
    let (token, generated) =
        crate::launch::rendezvous::token(c, std::env::var("KILN_JOB_TOKEN").ok())
            .map_err(Error::Usage)?;
    if generated {
        ui::note(&format!(
            "job token: {token}\n  = give it to the other nodes: KILN_JOB_TOKEN={token}"
        ));
    }
    match std::env::var("KILN_WORKER_ROUND")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        Some(round) => node_worker(target, quiet, r, &token, round),
        None if c.launch.max_restarts > 0 => node_agent(target, c, &token),
        None => node_worker(target, quiet, r, &token, 0),
    }
}

/// The agent: runs rounds of the worker until one succeeds or no restarts are left.
fn node_agent(target: &Target, c: &Config, token: &str) -> Result<()> {
    let node = c.launch.node_rank;
    let max = c.launch.max_restarts;
    let run_dir = if node == 0 {
        let (dir, _, _) = node0_dir(target, c, 0)?;
        fs::create_dir_all(dir.join("logs"))
            .map_err(|e| Error::io(format!("creating run directory {}", dir.display()), e))?;
        Some(dir.canonicalize().unwrap_or(dir))
    } else {
        None
    };
    let exe = std::env::current_exe().map_err(|e| Error::io("finding the kiln executable", e))?;
    for round in 0..=max {
        // asked to stop: no new round (its worker could die of the signal before it handles it)
        if crate::train::preempt::requested().is_some() {
            return Err(Error::Preempted(format!(
                "node {node}: asked to stop; not starting the worker again"
            )));
        }
        let mut cmd = std::process::Command::new(&exe);
        cmd.args(std::env::args_os().skip(1))
            .env("KILN_WORKER_ROUND", round.to_string())
            .env("KILN_JOB_TOKEN", token);
        if let Some(d) = &run_dir {
            cmd.env("KILN_WORKER_RUN_DIR", d);
        }
        #[cfg(target_os = "linux")]
        {
            use std::os::unix::process::CommandExt;
            // SAFETY: prctl is async-signal-safe; the worker dies with its agent.
            unsafe {
                cmd.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    Ok(())
                });
            }
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| Error::io("starting the node's worker", e))?;
        // a stop request to the agent goes on to its worker as SIGTERM (a second SIGINT to
        // the worker would stop it at once; SIGTERM never does)
        let mut forwarded = false;
        let status = loop {
            if let Some(s) = child
                .try_wait()
                .map_err(|e| Error::io("waiting for the node's worker", e))?
            {
                break s;
            }
            if !forwarded && crate::train::preempt::requested().is_some() {
                forwarded = true;
                // SAFETY: kill(2) on our own child's pid.
                unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        if status.success() {
            return Ok(());
        }
        if status.code() == Some(crate::train::preempt::EXIT_PREEMPTED)
            || (crate::train::preempt::requested().is_some() && status.code().is_none())
        {
            return Err(Error::Preempted(format!(
                "node {node}: the worker stopped with a checkpoint (preempted); not restarting"
            )));
        }
        if crate::train::preempt::requested().is_some() {
            return Err(Error::Invalid(format!(
                "node {node}: the worker exited with status {} while stopping; not restarting",
                status.code().unwrap_or(-1)
            )));
        }
        if status.code() == Some(2) {
            return Err(Error::Usage(format!(
                "node {node}: the worker rejected its input (see above); not restarting"
            )));
        }
        let cause = match status.code() {
            Some(code) => format!("exited with status {code}"),
            None => {
                use std::os::unix::process::ExitStatusExt;
                format!("was killed by signal {}", status.signal().unwrap_or(0))
            }
        };
        if round == max {
            return Err(Error::Invalid(format!(
                "node {node}: the worker {cause}, and no restarts are left (launch.max_restarts = {max})"
            )));
        }
        let line = format!(
            "node {node}: the worker {cause}; restarting the job from the newest verified checkpoint (restart {} of {max})",
            round + 1
        );
        ui::note(&line);
        if let Some(d) = &run_dir {
            use std::io::Write as _;
            if let Ok(mut f) = super::run_dir::open_no_follow(
                OpenOptions::new().create(true).append(true),
                &d.join("logs/restarts.log"),
            ) {
                let _ = writeln!(f, "{line}");
            }
        }
    }
    Ok(())
}

/// The worker of restart round `round`: rendezvous, agree on the run directory (node 0 picks
/// it) and, after a restart, on the checkpoint to continue from; train.
fn node_worker(
    target: &Target,
    quiet: bool,
    r: &Resolved,
    token: &str,
    round: usize,
) -> Result<()> {
    let c = &r.config;
    // node 0 checks its directory before it serves the store: bad input stops it early
    let chosen = if c.launch.node_rank == 0 {
        Some(node0_dir(target, c, round)?)
    } else {
        None
    };
    let mut job = crate::launch::rendezvous::join(c, c.strategy.devices.count(), token, round)?;
    let t = std::time::Duration::from_secs(c.launch.rendezvous_timeout_secs);
    let (run_dir, resume) = if let Some((dir, resuming, from)) = chosen {
        fs::create_dir_all(&dir)
            .map_err(|e| Error::io(format!("creating run directory {}", dir.display()), e))?;
        let abs = dir.canonicalize().unwrap_or(dir);
        let resume = if resuming {
            Some(prepare_resume(&abs, r, from.as_deref(), quiet)?)
        } else {
            None
        };
        let from = resume
            .as_ref()
            .and_then(|res| res.from.as_ref())
            .map(|(p, _)| p.display().to_string())
            .unwrap_or_default();
        job.client.set("resume_from", &from)?;
        job.client.set("run_dir", &abs.display().to_string())?;
        (abs, resume)
    } else {
        let keys = ["run_dir".to_string(), "resume_from".to_string()];
        let v = match job.client.wait(&keys, t)? {
            Ok(v) => v,
            Err(_) => {
                return Err(Error::Usage(
                    "node 0 never published the run directory".into(),
                ))
            }
        };
        let resume = match v.get(1).filter(|p| !p.is_empty()) {
            Some(p) => Some(Resumption {
                from: Some((
                    PathBuf::from(p),
                    crate::checkpoint::read_state(Path::new(p)).map_err(Error::Checkpoint)?,
                )),
            }),
            None if round > 0 => Some(Resumption { from: None }),
            None => None,
        };
        (PathBuf::from(&v[0]), resume)
    };
    execute(r, &run_dir, resume, quiet, Some(job))
}

/// Node 0 creates the job's NCCL unique id and publishes it; the other nodes read it.
#[cfg(feature = "cuda")]
fn share_nccl_id(
    j: &mut crate::launch::rendezvous::Job,
    c: &Config,
) -> Result<crate::collective::nccl::Id> {
    use crate::collective::nccl;
    if j.node == 0 {
        let id = nccl::new_id().map_err(|e| Error::Train(e.into()))?;
        let hex: String = id
            .internal()
            .iter()
            .map(|b| format!("{:02x}", *b as u8))
            .collect();
        j.client.set("nccl_id", &hex)?;
        return Ok(id);
    }
    let t = std::time::Duration::from_secs(c.launch.rendezvous_timeout_secs);
    let hex = match j.client.wait(&["nccl_id".to_string()], t)? {
        Ok(v) => v.into_iter().next().unwrap_or_default(),
        Err(_) => return Err(Error::Usage("node 0 never published the NCCL id".into())),
    };
    let mut raw = [0 as std::ffi::c_char; 128];
    for (i, b) in raw.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2).unwrap_or("00"), 16).unwrap_or(0)
            as std::ffi::c_char;
    }
    Ok(nccl::Id::uninit(raw))
}

/// The data position of a checkpoint against the data it resumes on: a cursor past the
/// training samples, or more micro-batches into a segment than it has, is no run's (it would
/// skip an epoch silently).
fn check_position(
    c: &Config,
    plan: &Plan,
    s: &crate::checkpoint::State,
    path: &Path,
) -> Result<()> {
    let p = &s.position;
    let n = plan.train_samples;
    let same = s.world_size == plan.world_size
        && s.micro_batch == plan.micro_batch
        && s.strategy == config::choice_name(&c.strategy.kind);
    let why = if p.cursor > n || p.segment_start > n || p.segment_start > p.cursor {
        Some(format!(
            "`position` (cursor {}, segment_start {}) is not within the {n} training samples",
            p.cursor, p.segment_start
        ))
    } else if same && p.segment_micro > plan.segment_micro(p.segment_start) {
        Some(format!(
            "`position.segment_micro` = {} is past the {} micro-batches of its segment",
            p.segment_micro,
            plan.segment_micro(p.segment_start)
        ))
    } else {
        None
    };
    match why {
        Some(why) => Err(Error::Checkpoint(
            crate::checkpoint::CheckpointError::Invalid {
                path: path.to_path_buf(),
                why: format!("state.json: {why}"),
            },
        )),
        None => Ok(()),
    }
}

/// What a run checks in its directory before it changes anything there: no symbolic link
/// where it writes, and no entry in `checkpoints/` under a checkpoint's name that is not one
/// (a file `step-00000010` would fail the save at step 10, after the steps were trained).
/// Other `step-*` names are not kiln's: they are left alone, with a warning.
fn preflight(run_dir: &Path, checkpoint_dir: &str) -> Result<()> {
    super::run_dir::refuse_links(run_dir, checkpoint_dir)?;
    let store = Store::new(run_dir.join(checkpoint_dir));
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

fn store_of(c: &Config, run_dir: &Path) -> Store {
    Store::new(run_dir.join(&c.checkpoint.dir))
}

/// Trains `r` in `run_dir`, fresh or continuing `resume`.
pub fn execute(
    r: &Resolved,
    run_dir: &Path,
    resume: Option<Resumption>,
    quiet: bool,
    mut job: Option<crate::launch::rendezvous::Job>,
) -> Result<()> {
    // the random streams of a resumed run are the checkpoint's (its `rng`), whatever seeds
    // the config now says: a resume continues the run it resumes, bit for bit
    let restored;
    let r = match resume.as_ref().and_then(|res| res.from.as_ref()) {
        Some((_, state)) => match super::resume::restore_seeds(r, &state.rng) {
            Some(x) => {
                restored = x;
                &restored
            }
            None => r,
        },
        None => r,
    };
    let c = &r.config;
    // node 0 (or a single-node run) writes the run's shared files; other nodes their logs
    let primary = job.as_ref().map(|j| j.node == 0).unwrap_or(true);
    if job.is_none() {
        // no other kiln process in this directory meanwhile (a no-op when already held)
        lock_run_dir(run_dir)?;
    }
    let rendezvous_t = std::time::Duration::from_secs(c.launch.rendezvous_timeout_secs);
    let checks = Checks {
        job: &mut job,
        passed: false,
    };
    let placement = backend::resolve(c)?;
    let be = placement.backend;
    let data = data::load(r)?;
    let model = crate::model::build(&r, &data.input_shape())?;
    super::check::watched_metrics(r, model.task(), data.eval.is_some())?;
    let plan = Plan::new(c, data.train.len(), model.num_params());
    super::check::fits(
        r,
        &crate::strategy::estimate(c, model.layout(), plan.world_size),
        model.as_ref(),
    )?;
    let loaded = match resume.as_ref().and_then(|res| res.from.as_ref()) {
        Some((path, state)) => {
            if state.num_params != model.num_params() {
                return Err(Error::Usage(format!(
                    "the checkpoint has {} parameters but the model has {}; the model config changed",
                    state.num_params,
                    model.num_params()
                )));
            }
            let mut l = crate::checkpoint::load(path, &model.layout().specs())
                .map_err(Error::Checkpoint)?;
            check_position(c, &plan, &l.state, path)?;
            // optimizer state of another kind (sgd momentum vs Adam moments) would be misread
            let kind = format!("{:?}", c.optim.kind).to_lowercase();
            let family = |k: &str| if k.starts_with("adam") { "adam" } else { "sgd" };
            if family(&l.state.optimizer.kind) != family(&kind) {
                ui::note(&format!(
                    "warning: the checkpoint's optimizer is {} but optim.kind is {kind}: its state is dropped and {kind} starts fresh",
                    l.state.optimizer.kind
                ));
                l.opt = crate::checkpoint::OptState::default();
            }
            Some(l)
        }
        None => None,
    };
    if primary {
        // everything a run changes is checked before the first change (and before the other
        // nodes are told to go on), so that a check that fails leaves a finished run's files
        // as they were
        preflight(run_dir, &c.checkpoint.dir)?;
    }
    // every node has what it needs: now node 0 may change files of a resumed run
    checks.pass(resume.is_some(), rendezvous_t)?;
    // the job's NCCL variables, in this process before anything loads NCCL
    super::nccl_env::export(c, job.as_mut(), rendezvous_t)?;
    // a finished run resumed at (or past) its end has nothing to train: every file stays as
    // it is (one whose summary does not say finished goes on, and gets its summary)
    let finished = fs::read_to_string(run_dir.join("summary.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .is_some_and(|v| v["status"] == "finished");
    if let Some(l) = loaded.as_ref().filter(|_| finished) {
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
            (w.metric == e.metric.name() && w.mode == mode && w.bad_evals >= e.patience).then(
                || {
                    format!(
                    "train.early_stopping: {} has not improved for {} evaluations, patience = {}",
                    w.metric, w.bad_evals, e.patience
                )
                },
            )
        });
        let early = stopped.is_some() && !done;
        let (done, limit) = match stopped {
            Some(why) if !done => (true, why),
            _ => (done, limit),
        };
        if done {
            if primary {
                let help = if early {
                    "raise train.early_stopping.patience (or remove train.early_stopping) with --set to train further"
                } else {
                    "raise train.max_steps or train.epochs with --set to train further"
                };
                ui::out(&format!(
                    "{} is already complete at step {} ({limit}): nothing to train\n  = help: {help}",
                    run_dir.display(),
                    l.state.step
                ));
            }
            if let Some(j) = job.as_mut() {
                j.finish(rendezvous_t);
            }
            return Ok(());
        }
    }
    if primary {
        // the unfinished checkpoints of an interrupted save (or deletion), before any file
        // of the run changes: one that cannot be removed stops the run here
        store_of(c, run_dir)
            .clean_tmp()
            .map_err(Error::Checkpoint)?;
    }
    if primary && resume.is_some() {
        let step = loaded.as_ref().map(|l| l.state.step).unwrap_or(0);
        super::resume::set_aside_newer(&store_of(c, run_dir), step as u64)?;
        super::resume::trim_metrics(&run_dir.join("metrics.jsonl"), step)?;
    }
    // a resumed run continues from its checkpoint, not from model.init_from
    let init = match &loaded {
        Some(_) => None,
        None => super::weights::init_weights(r, model.as_ref())?,
    };
    fs::create_dir_all(run_dir)
        .map_err(|e| Error::io(format!("creating run directory {}", run_dir.display()), e))?;
    let config_hash = config::config_hash(c);
    if primary {
        super::run_dir::replace_file(
            &run_dir.join("config.toml"),
            config::to_toml(&stored_config(r)).as_bytes(),
        )
        .map_err(|e| Error::io(format!("writing {}/config.toml", run_dir.display()), e))?;
    }
    if primary {
        // what produced this session of the run (a resume appends its own)
        super::record::append_session(run_dir, r, be.name())?;
    }
    if primary && c.profile.enabled {
        // a resumed run's traces are this session's only (node 0 merges whatever it finds)
        let _ = fs::remove_dir_all(run_dir.join("trace"));
    }
    let summary_path = run_dir.join("summary.json");
    if primary && summary_path.exists() {
        fs::remove_file(&summary_path)
            .map_err(|e| Error::io(format!("removing {}", summary_path.display()), e))?;
    }
    ui::out(&format!("run dir: {}", run_dir.display()));

    let mut ui = Progress::new(quiet).with_tokens(match model.task() {
        crate::model::Task::LanguageModel { block, .. } => Some(block),
        crate::model::Task::Classification { .. } => None,
    });
    ui.info(&plan.describe());
    ui.info(&format!(
        "backend: {} ({}), strategy {} on {} device{}",
        be.name(),
        backend::cpu_split(c),
        config::choice_name(&c.strategy.kind),
        plan.world_size,
        if plan.world_size == 1 { "" } else { "s" }
    ));
    let logs = run_dir.join("logs");
    fs::create_dir_all(&logs).map_err(|e| Error::io(format!("creating {}", logs.display()), e))?;
    let store = Store::new(run_dir.join(&c.checkpoint.dir));
    let metrics_path = if primary {
        run_dir.join("metrics.jsonl")
    } else {
        PathBuf::from("/dev/null")
    };
    let metrics_file = if resume.is_some() || !primary {
        super::run_dir::open_no_follow(OpenOptions::new().append(true).create(true), &metrics_path)
    } else {
        super::run_dir::open_no_follow(
            OpenOptions::new().write(true).create(true).truncate(true),
            &metrics_path,
        )
    }
    .map_err(|e| super::run_dir::open_error("opening", &metrics_path, e))?;
    let mut metrics = BufWriter::new(metrics_file);
    let mut write_err: Option<std::io::Error> = None;
    let loaded = loaded.as_ref();
    let first_step = loaded.map(|l| l.state.step).unwrap_or(0);
    // TensorBoard's event file of this session (`[log] tensorboard`); one that cannot be
    // written is said once and left, the run goes on (metrics.jsonl has every line)
    let mut tb = if primary && c.log.tensorboard {
        match super::tensorboard::EventWriter::create(
            run_dir,
            &super::record::hostname(),
            loaded.map(|l| l.state.step + 1),
        ) {
            Ok(w) => Some(w),
            Err(e) => {
                ui::note(&format!(
                    "warning: cannot write TensorBoard events in {}/tb: {e}; metrics.jsonl has every line",
                    run_dir.display()
                ));
                None
            }
        }
    } else {
        None
    };
    // the step and epoch the run got to, for the summary of a run that fails
    let mut reached: (Option<usize>, Option<f64>) = (None, None);
    let input = TrainInput {
        config: c,
        plan: &plan,
        data: &data,
        model: model.as_ref(),
        store: Some(&store),
        resume: loaded,
        init: init.as_deref(),
        shared_init: Default::default(),
        keep_params: false,
    };
    if let Some(note) = &placement.note {
        ui.info(note);
    }
    #[cfg(feature = "cuda")]
    let nccl_id = match job.as_mut() {
        Some(j) if placement.collective == backend::CommKind::Nccl => Some(share_nccl_id(j, c)?),
        _ => None,
    };
    let link = job.as_mut().map(|j| crate::launch::NodeLink {
        node: j.node,
        nnodes: j.nnodes,
        ring: j.ring.take(),
        stop: std::sync::Arc::clone(&j.stop),
        #[cfg(feature = "cuda")]
        nccl_id,
    });
    let result = train(&placement, &input, Some(&logs), link, &mut |ev| match ev {
        TrainEvent::Started { total_steps, .. } => ui.start(total_steps, first_step),
        TrainEvent::Checkpoint { step } => ui.info(&format!("saved checkpoint step-{step:08}")),
        TrainEvent::Step {
            step,
            loss,
            samples_per_sec,
            line,
        } => {
            ui.step(step, loss, samples_per_sec, line.is_some());
            reached.0 = Some(step);
            if let Some(line) = line {
                reached.1 = Some(line.epoch);
                let failed = tb.as_mut().and_then(|w| {
                    let json = serde_json::to_value(&line).unwrap_or_default();
                    w.line(&json)
                        .err()
                        .map(|e| (w.path().display().to_string(), e))
                });
                if let Some((path, e)) = failed {
                    ui::note(&format!(
                        "warning: writing {path} failed ({e}); no more TensorBoard events this session"
                    ));
                    tb = None;
                }
                let res = serde_json::to_string(&line)
                    .map_err(std::io::Error::other)
                    .and_then(|s| writeln!(metrics, "{s}"))
                    .and_then(|_| metrics.flush());
                if let Err(e) = res {
                    write_err.get_or_insert(e);
                }
            }
        }
    });
    ui.finish();
    // a metrics file that could not be written (a full disk) fails the run like any error:
    // the failed summary, no `.tmp` left
    let metrics_failed =
        write_err.map(|e| Error::io(format!("writing {}", metrics_path.display()), e));
    let asynchronous = be.name().starts_with("cuda");
    let flops_per_sample = model.flops_per_sample();
    let summary = |status, error: Option<String>, res: Option<&RunResult>| {
        let o = res.map(|r| &r.outcome);
        let flops_per_sec = flops_per_sample
            .zip(o.map(|o| o.samples_per_sec))
            .map(|(f, s)| (f * s).round());
        let (mfu, mfu_note) = match (flops_per_sec, o) {
            (Some(f), _) => super::profile::mfu(
                be.name(),
                c.backend.precision,
                f,
                plan.world_size,
                placement.ordinals.first().copied().unwrap_or(0),
            ),
            (None, None) => (None, None),
            (None, Some(_)) => (
                None,
                Some(format!(
                    "kiln knows no FLOP count for model.kind = \"{}\"",
                    model.kind()
                )),
            ),
        };
        Summary {
            stopped_by: o.and_then(|o| o.preempted.clone()),
            stopped_early: c
                .train
                .early_stopping
                .as_ref()
                .map(|_| o.is_some_and(|o| o.stopped_early.is_some())),
            early_stopping: o.and_then(|o| {
                o.early_stopping.as_ref().map(|w| EarlyStopSummary {
                    watched: w.clone(),
                    stopped_at_step: o.stopped_early,
                })
            }),
            best_checkpoint: o.and_then(|o| {
                o.best.as_ref().map(|w| BestSummary {
                    checkpoint: format!("step-{:08}", w.best_step),
                    watched: w.clone(),
                })
            }),
            flops_per_sample,
            flops_per_sec,
            mfu,
            mfu_note,
            status,
            error,
            steps: o
                .map(|o| o.steps)
                .unwrap_or(reached.0.unwrap_or(first_step)),
            epochs: o.map(|o| o.epochs).unwrap_or(
                reached
                    .1
                    .unwrap_or(loaded.map_or(0.0, |l| l.state.position.epoch as f64)),
            ),
            final_loss: o.map(|o| o.final_loss),
            eval_loss: o.and_then(|o| o.eval.map(|e| e.loss())),
            eval_accuracy: o.and_then(|o| o.eval_accuracy()),
            eval_perplexity: o.and_then(|o| o.eval_perplexity()),
            eval_samples: o.and_then(|o| o.eval.map(|e| e.count)),
            wall_seconds: o.map(|o| o.wall_seconds).unwrap_or(0.0),
            samples_per_sec: o.map(|o| o.samples_per_sec).unwrap_or(0.0),
            tokens_per_sec: o.and_then(|o| o.tokens_per_sec()),
            world_size: plan.world_size,
            strategy: c.strategy.kind,
            global_batch: plan.global_batch,
            backend: be.name(),
            precision: c.backend.precision,
            loss_scale: o.and_then(|o| o.loss_scale.clone()),
            num_params: plan.num_params,
            config_hash: config_hash.clone(),
            resumed_from_step: first_step,
            params_sha256: o.map(|o| o.params_sha256.clone()),
            memory: res.map(|r| r.memory.clone()).unwrap_or_default(),
            peak_rss_bytes: crate::memory::peak_rss_bytes(),
            time: res.map(|r| {
                super::profile::time_section(
                    r,
                    r.outcome.steps.saturating_sub(first_step),
                    asynchronous,
                )
            }),
        }
    };
    // traces before `finish`: a node that has finished has its files on disk for node 0
    let node = job.as_ref().map(|j| j.node).unwrap_or(0);
    let traces = result
        .as_ref()
        .ok()
        .map(|res| super::profile::write_traces(c, run_dir, res, node));
    if let Some(j) = job.as_mut() {
        if result.is_ok() {
            j.finish(std::time::Duration::from_secs(
                c.launch.rendezvous_timeout_secs,
            ));
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
    // a job stopped under this node (a silent node, a lost store) is the cause when the ranks
    // failed in a collective (stopped, or cut off by the closed ring); any other failure is the
    // ranks' own
    let stopped = job.as_ref().and_then(|j| j.stop.reason());
    let result = match (result, stopped) {
        (Err(TrainError::Collective(_)), Some(why)) => Err(Error::Launch(why.into())),
        (r, _) => r.map_err(Error::from),
    };
    let result = match metrics_failed {
        Some(e) => Err(e),
        None => result,
    };
    match result {
        Ok(res) if res.outcome.preempted.is_some() => {
            let step = res.outcome.steps;
            if primary {
                write_json(&summary_path, &summary("preempted", None, Some(&res)))?;
            }
            let why = res.outcome.preempted.clone().unwrap_or_default();
            let saved = if input.store.is_some() {
                format!("checkpoint step-{step:08} is saved")
            } else {
                "no checkpoint (this run saves none)".into()
            };
            Err(Error::Preempted(format!(
                "stopped at step {step} ({why}): {saved}; run dir: {}\n  = help: continue it with `kiln resume {}`",
                run_dir.display(),
                run_dir.display()
            )))
        }
        Ok(res) => {
            if primary {
                write_json(&summary_path, &summary("finished", None, Some(&res)))?;
            }
            match traces {
                Some(Ok(Some(all))) => ui::out(&format!(
                    "trace: {} (open it in https://ui.perfetto.dev or chrome://tracing)",
                    all.display()
                )),
                // the run itself finished: a trace that could not be written is a warning
                Some(Err(e)) => ui::note(&format!("warning: the trace was not written: {e}")),
                _ => {}
            }
            let steps = res.outcome.steps.saturating_sub(first_step);
            if steps > 0 {
                ui::out(&super::profile::breakdown_line(&res, steps));
            }
            let out = &res.outcome;
            let eval = match (out.eval, out.eval_accuracy(), out.eval_perplexity()) {
                (Some(e), Some(acc), _) => {
                    format!(", eval loss {:.4}, eval accuracy {acc:.3}", e.loss())
                }
                (Some(e), None, Some(ppl)) => {
                    format!(", eval loss {:.4}, eval perplexity {ppl:.3}", e.loss())
                }
                _ => String::new(),
            };
            ui::out(&format!(
                "finished {} steps in {:.1}s: final loss {:.4}{eval}; run dir: {}",
                out.steps,
                out.wall_seconds,
                out.final_loss,
                run_dir.display()
            ));
            Ok(())
        }
        Err(e) => {
            if primary {
                // a checkpoint cut short (a full disk) leaves no `.tmp` behind
                let _ = store.clean_tmp();
                let mut s = summary("failed", Some(e.to_string()), None);
                // a diverged run reached its step
                if let Error::Train(TrainError::Diverged { step, .. }) = &e {
                    s.steps = *step;
                }
                // the first failure is the error; a summary that cannot be written is said
                if let Err(w) = write_json(&summary_path, &s) {
                    ui::note(&format!("warning: the run failed, and {w}"));
                }
            }
            ui::out(&format!("failed; run dir: {}", run_dir.display()));
            Err(e)
        }
    }
}

/// A node's checks before a multi-node run starts (its data, model, memory and checkpoint).
/// Dropped before `pass`, it stops the job, so the other nodes fail at once instead of waiting
/// in their first collective, and node 0 never sets checkpoints aside or trims metrics for a
/// resume that another node refused.
struct Checks<'a> {
    job: &'a mut Option<crate::launch::rendezvous::Job>,
    passed: bool,
}

impl Checks<'_> {
    /// This node's checks passed. Every node says so; node 0 of a resumed run waits until the
    /// others have said it too.
    fn pass(mut self, resuming: bool, timeout: std::time::Duration) -> Result<()> {
        self.passed = true;
        let Some(j) = self.job.as_mut() else {
            return Ok(());
        };
        if j.node != 0 {
            j.client.set(&format!("checked/{}", j.node), "ok")?;
            return Ok(());
        }
        if !resuming {
            return Ok(());
        }
        let keys: Vec<String> = (1..j.nnodes).map(|n| format!("checked/{n}")).collect();
        match j.client.wait(&keys, timeout) {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(missing)) => Err(Error::Launch(
                format!(
                    "{} did not finish their checks within launch.rendezvous_timeout_secs = {}s; no file of the run was changed",
                    missing.join(", ").replace("checked/", "node "),
                    timeout.as_secs()
                )
                .into(),
            )),
            Err(e) => Err(Error::Launch(
                format!("{e}; no file of the run was changed").into(),
            )),
        }
    }
}

impl Drop for Checks<'_> {
    fn drop(&mut self) {
        if self.passed {
            return;
        }
        if let Some(j) = self.job.as_mut() {
            let _ = j.client.abort(&format!(
                "node {} refused the run (its error is in its own output)",
                j.node
            ));
        }
    }
}

/// Trains every rank of this node as placed; `logs` receives `rank-<r>.log`.
pub fn train(
    placement: &Placement,
    input: &TrainInput<'_>,
    logs: Option<&Path>,
    link: Option<NodeLink>,
    on_event: &mut dyn FnMut(TrainEvent),
) -> std::result::Result<RunResult, TrainError> {
    let n = backend::threads(
        &input.config.backend,
        input.config.strategy.devices.count(),
        input.config.data.workers,
    );
    // ndarray's matmul reads its thread count once from the environment.
    if std::env::var_os("MATMUL_NUM_THREADS").is_none() {
        std::env::set_var("MATMUL_NUM_THREADS", n.to_string());
    }
    macro_rules! dispatch {
        ($($(#[$a:meta])* $v:ident = $name:literal => $ty:ty),* $(,)?) => {
            match placement.backend {
                $($(#[$a])* Backend::$v => run::<$ty>(input, placement, n, logs, link, on_event),)*
            }
        };
    }
    crate::model::for_each_backend!(dispatch)
}
