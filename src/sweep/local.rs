//! Sweeps run here: the local executor (jobs as child `kiln` processes, up to `parallel` at
//! once, each with its share of the CPU and its GPUs) and its loop, for every policy; the
//! record of how a trial ended, and the closing table.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::policy::{fill, is_asha, AshaPolicy, Executor, Grid, Job, Policy};
use super::{
    check_metric, dir_of, plan, refuse_run_dir, rows, to_text, write_results, ExecutorKind, Ledger,
    Lock, Planned, Record, SweepSpec, TrialState,
};
use crate::config::{Config, SweepConfig};
use crate::error::{Error, Result};
use crate::rundir::{MetricsFile, SummaryFile};
use crate::ui::SweepProgress;

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// GPUs a trial needs: its device count on CUDA, none on the CPU (and on wgpu, whose ranks
/// share one adapter that kiln does not count).
pub(super) fn gpus_needed(c: &Config) -> usize {
    match c.backend.device {
        crate::config::Device::Cuda => c.strategy.devices.count(),
        crate::config::Device::Cpu | crate::config::Device::Wgpu => 0,
    }
}

/// GPUs on this machine (0 without the `cuda` feature or a driver).
pub(super) fn gpu_count() -> usize {
    #[cfg(feature = "cuda")]
    {
        crate::cuda::device_count().unwrap_or(0)
    }
    #[cfg(not(feature = "cuda"))]
    {
        0
    }
}

pub(super) fn ledger_io(e: std::io::Error) -> Error {
    Error::io("writing sweep.jsonl", e)
}

pub(super) fn record(p: &Planned, state: TrialState) -> Record {
    Record {
        trial: p.id.clone(),
        index: p.trial.index,
        overrides: p
            .trial
            .overrides
            .iter()
            .map(|(k, v)| (k.clone(), v.to_string()))
            .collect(),
        state,
        exit: None,
        metric: None,
        error: None,
        job: None,
        array_index: None,
        rung: None,
        time: now(),
    }
}

/// Starts trial `p` (or continues it from its newest checkpoint when its run directory holds
/// a run), with `extra` sets on top.
pub(super) fn spawn(
    spec: &SweepSpec,
    p: &Planned,
    run_dir: &Path,
    log: &Path,
    threads: usize,
    gpus: &[usize],
    extra: &[String],
) -> Result<Child> {
    let exe = std::env::current_exe().map_err(|e| Error::io("finding the kiln executable", e))?;
    let threads = format!("backend.threads={threads}");
    let mut cmd = Command::new(exe);
    if run_dir.join("config.toml").is_file() {
        // interrupted or failed before: continue from its newest verified checkpoint
        cmd.args([
            "resume",
            &run_dir.display().to_string(),
            "--quiet",
            "--set",
            &threads,
        ]);
        for s in extra {
            cmd.args(["--set", s]);
        }
    } else {
        if run_dir.exists() {
            fs::remove_dir_all(run_dir)
                .map_err(|e| Error::io(format!("clearing {}", run_dir.display()), e))?;
        }
        cmd.args([
            "run",
            &spec.file.display().to_string(),
            "--quiet",
            "--run-dir",
            &run_dir.display().to_string(),
        ]);
        for s in spec.sets.iter().cloned().chain(p.trial.set_args()) {
            cmd.args(["--set", &s]);
        }
        cmd.args(["--set", &threads]);
        for s in extra {
            cmd.args(["--set", s]);
        }
    }
    let out = File::options()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| Error::io(format!("opening {}", log.display()), e))?;
    let err = out
        .try_clone()
        .map_err(|e| Error::io(format!("opening {}", log.display()), e))?;
    if !gpus.is_empty() {
        // whole devices per trial: the trial sees only its GPUs, renumbered from 0
        let list: Vec<String> = gpus.iter().map(|g| g.to_string()).collect();
        cmd.env("CUDA_VISIBLE_DEVICES", list.join(","));
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err));
    // its own process group: a Ctrl-C reaches the sweep only, which stops its trials with
    // SIGTERM once they can take it
    {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
    }
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: prctl is async-signal-safe; the child dies with the sweep, so a killed sweep
        // leaves no trial running behind the next one.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
    }
    cmd.spawn().map_err(|e| Error::io("starting a trial", e))
}

/// Why a trial failed, from its summary or its log.
fn failure_reason(run_dir: &Path, log: &Path, code: Option<i32>) -> String {
    let from_summary = SummaryFile::read(run_dir)
        .and_then(|s| s.error)
        .map(|e| e.lines().next().unwrap_or("").to_string());
    from_summary
        .or_else(|| {
            fs::read_to_string(log).ok().and_then(|t| {
                t.lines()
                    .rev()
                    .find(|l| l.starts_with("error:"))
                    .map(|l| l.trim_start_matches("error: ").to_string())
            })
        })
        .unwrap_or_else(|| match code {
            Some(c) => format!("exit status {c}"),
            None => "killed by a signal".into(),
        })
}

fn last_progress(run_dir: &Path) -> Option<String> {
    let v = MetricsFile::last_line(run_dir)?;
    Some(format!(
        "step {} loss {:.4}",
        v["step"],
        v["loss"].as_f64()?
    ))
}

/// Runs (or continues) a sweep here, grid, random or asha alike: the policy's jobs as child
/// processes, at most `parallel` at once. Returns the results table.
pub fn run_trials(spec: &SweepSpec, parallel: Option<usize>, quiet: bool) -> Result<String> {
    let env: Vec<(String, String)> = std::env::vars().collect();
    let (base, planned) = plan(spec, &env)?;
    check_metric(&base, &planned)?;
    let s = &base.sweep;
    let parallel = parallel.unwrap_or(s.parallel).max(1);
    let (dir, _lock, spec_abs, ledger) = open_local(spec, &base, &planned)?;
    let total = planned.len();
    let (mut policy, done): (Box<dyn Policy>, usize) = if is_asha(s) {
        refuse_slurm_segments(&dir, &ledger)?;
        let done = ledger
            .latest()
            .values()
            .filter(|r| r.state == TrialState::Done)
            .count();
        let asha = AshaPolicy::local(&base, &planned, &ledger);
        (Box::new(asha), done)
    } else {
        let grid = grid_here(&planned, &ledger, s.retries);
        let done = total - grid.len();
        (Box::new(grid), done)
    };
    let ui = SweepProgress::new(total, done, quiet);
    if !is_asha(s) && done == total {
        ui.info(&format!(
            "all {total} trials of {} are done; nothing to run",
            dir.display()
        ));
    }
    let mut local = Local {
        dir: dir.clone(),
        spec: spec_abs,
        parallel,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        running: Vec::new(),
        free_gpus: free_gpus(&planned),
        stopping: false,
        ui,
    };
    let mut failures = ledger.failures();
    loop {
        // a stop signal: no new jobs; the running ones checkpoint and stop (they get SIGTERM,
        // which never escalates, even when a Ctrl-C reached them too)
        if !local.stopping && crate::train::preempt::requested().is_some() {
            local.stopping = true;
            terminate(&local.running);
            local
                .ui
                .info("stopping: the running trials checkpoint and stop");
        }
        fill(policy.as_mut(), &mut local, &planned, &ledger)?;
        if local.running.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
        for (r, status) in local.poll()? {
            let rec = r
                .job
                .ended(&dir, &r.planned, status, local.stopping, &s.metric);
            if rec.state == TrialState::Failed {
                let n = failures.entry(r.job.id.clone()).or_insert(0);
                *n += 1;
                if *n <= s.retries {
                    policy.again(r.job, true);
                }
            }
            ledger.append(&rec).map_err(ledger_io)?;
            policy.report(&mut local.ui, &rec);
        }
    }
    local.ui.finish();
    let closing = policy.closing(&planned, &ledger);
    conclude(&dir, &ledger, s, local.stopping, total, closing)
}

/// A job running here.
pub(super) struct Running {
    pub job: Job,
    pub planned: Planned,
    pub child: Child,
    /// The GPUs this trial holds (CUDA trials get whole devices).
    pub gpus: Vec<usize>,
}

/// The executor of a sweep run here: jobs as child `kiln` processes, at most `parallel` at
/// once, each with its share of the CPU's threads and its own GPUs.
struct Local {
    dir: PathBuf,
    /// The spec, its paths absolute.
    spec: SweepSpec,
    parallel: usize,
    cores: usize,
    running: Vec<Running>,
    free_gpus: Vec<usize>,
    /// The sweep's stop came: nothing new starts; the running jobs checkpoint and stop.
    stopping: bool,
    ui: SweepProgress,
}

impl Executor for Local {
    fn busy(&self, _: &Ledger) -> Vec<String> {
        self.running.iter().map(|r| r.job.id.clone()).collect()
    }
    fn room(&self, busy: usize) -> bool {
        !self.stopping && busy < self.parallel
    }
    fn start(&mut self, p: &Planned, job: &Job, ledger: &Ledger) -> Result<bool> {
        let Some(gpus) = claim_gpus(p, &mut self.free_gpus, self.running.len())? else {
            // it waits for a running trial to give its GPUs back
            return Ok(false);
        };
        let run_dir = self.dir.join(&p.id);
        let log = self.dir.join("logs").join(format!("{}.log", p.id));
        let threads =
            (self.cores / self.parallel / p.config.strategy.devices.count().max(1)).max(1);
        ledger
            .append(&job.record(p, TrialState::Running))
            .map_err(ledger_io)?;
        // an asha segment pauses at its rung (0 for the last: a run that paused before goes
        // on to the end)
        let extra: Vec<String> = match job.rung {
            Some(_) => vec![format!("train.pause_at_step={}", job.pause)],
            None => Vec::new(),
        };
        let child = spawn(&self.spec, p, &run_dir, &log, threads, &gpus, &extra)?;
        self.ui.started(&p.id, &job.describe(p));
        self.running.push(Running {
            job: job.clone(),
            planned: p.clone(),
            child,
            gpus,
        });
        Ok(true)
    }
}

impl Local {
    /// The jobs whose processes ended, with how (their GPUs given back); the others' progress
    /// shown.
    fn poll(&mut self) -> Result<Vec<(Running, std::process::ExitStatus)>> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.running.len() {
            let status = self.running[i]
                .child
                .try_wait()
                .map_err(|e| Error::io("waiting for a trial", e))?;
            let Some(status) = status else {
                let id = &self.running[i].job.id;
                if let Some(msg) = last_progress(&self.dir.join(id)) {
                    self.ui.update(id, &msg);
                }
                i += 1;
                continue;
            };
            let done = self.running.swap_remove(i);
            self.free_gpus.extend(&done.gpus);
            self.free_gpus.sort_unstable();
            out.push((done, status));
        }
        Ok(out)
    }
}

/// An asha sweep's segments queued or running in Slurm: running the sweep here too would run
/// a trial twice.
fn refuse_slurm_segments(dir: &Path, ledger: &Ledger) -> Result<()> {
    let with_slurm = ledger.latest().values().filter(|r| r.with_slurm()).count();
    if with_slurm > 0 {
        return Err(Error::Usage(format!(
            "{with_slurm} segment(s) of the sweep in {} are queued or running in Slurm; running it here too would run a trial twice\n  = help: let the Slurm jobs go on (`kiln sweep status {}`), or cancel them (scancel) first",
            dir.display(),
            dir.display()
        )));
    }
    Ok(())
}

/// A grid or random sweep's trials to run here, in trial order: not done, not with Slurm, and
/// failed ones while retries are left.
fn grid_here(planned: &[Planned], ledger: &Ledger, retries: usize) -> Grid {
    let (latest, failures) = (ledger.latest(), ledger.failures());
    Grid::new(planned, |p| match latest.get(&p.id) {
        Some(r) if r.state == TrialState::Done || r.with_slurm() => false,
        Some(r) if r.state == TrialState::Failed => {
            failures.get(&p.id).copied().unwrap_or(0) <= retries
        }
        _ => true,
    })
}

/// A local sweep's directory, opened: checked, `logs/` made, locked (the lock is returned),
/// the spec stored (returned with absolute paths), its ledger, which never holds a trial Slurm
/// still has, with every planned trial in it.
pub(super) fn open_local(
    spec: &SweepSpec,
    base: &Config,
    planned: &[Planned],
) -> Result<(PathBuf, Lock, SweepSpec, Ledger)> {
    let dir = dir_of(spec, base);
    refuse_run_dir(&dir)?;
    fs::create_dir_all(dir.join("logs"))
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let lock = Lock::take(&dir)?;
    let spec_abs = spec.store(&dir, ExecutorKind::Local)?;
    let ledger = Ledger {
        path: dir.join("sweep.jsonl"),
    };
    refuse_unknown_slurm_trials(&dir, &ledger, &base.sweep.metric)?;
    add_pending(&ledger, planned, &ledger.latest())?;
    Ok((dir, lock, spec_abs, ledger))
}

/// The GPUs trials may take: this machine's, when any trial needs GPUs.
pub(super) fn free_gpus(planned: &[Planned]) -> Vec<usize> {
    if planned.iter().any(|p| gpus_needed(&p.config) > 0) {
        (0..gpu_count()).collect()
    } else {
        Vec::new()
    }
}

/// Trial `p`'s GPUs, taken from `free`; `None` while the `running` trials hold them (it waits
/// for them), an error when there are too few with none running.
pub(super) fn claim_gpus(
    p: &Planned,
    free: &mut Vec<usize>,
    running: usize,
) -> Result<Option<Vec<usize>>> {
    let need = gpus_needed(&p.config);
    if need <= free.len() {
        return Ok(Some(free.drain(..need).collect()));
    }
    if running > 0 {
        return Ok(None);
    }
    Err(Error::Usage(format!(
        "sweep trial {} ({}) needs {need} GPU(s) but {} are free on this machine",
        p.trial.index,
        p.trial.describe(),
        free.len()
    )))
}

/// Records as pending the planned trials the ledger does not know yet.
pub(super) fn add_pending(
    ledger: &Ledger,
    planned: &[Planned],
    known: &BTreeMap<String, Record>,
) -> Result<()> {
    for p in planned {
        if !known.contains_key(&p.id) {
            ledger
                .append(&record(p, TrialState::Pending))
                .map_err(ledger_io)?;
        }
    }
    Ok(())
}

/// SIGTERM to every running trial (they checkpoint and stop; it never escalates).
pub(super) fn terminate(running: &[Running]) {
    for r in running {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(r.child.id() as i32, libc::SIGTERM) };
    }
}

/// Trials submitted to Slurm before: never run one here that Slurm still has (or that Slurm
/// cannot be asked about).
fn refuse_unknown_slurm_trials(dir: &Path, ledger: &Ledger, metric: &str) -> Result<()> {
    if ledger.latest().values().any(|r| r.job.is_some()) {
        let unknown = super::refresh(dir, ledger, metric)?;
        if !unknown.is_empty() {
            return Err(Error::Invalid(format!(
                "some trials were submitted to Slurm and Slurm could not be asked about them; not running anything here, which could run a trial twice:\n  {}",
                unknown.join("\n  ")
            )));
        }
    }
    Ok(())
}

/// The ledger record of trial `p`, whose process ended with `status`: done (with its metric),
/// preempted, failed (with why), or pending again when the sweep's stop came before it could
/// checkpoint.
pub(super) fn ended(
    dir: &Path,
    p: &Planned,
    status: std::process::ExitStatus,
    stopping: bool,
    metric: &str,
) -> Record {
    let run_dir = dir.join(&p.id);
    let mut rec = record(p, TrialState::Done);
    rec.exit = status.code();
    let summary = SummaryFile::read(&run_dir);
    rec.metric = summary.as_ref().and_then(|v| v.number(metric));
    if stopping && status.code().is_none() {
        // stopped before it could take the signal: it starts again next time
        rec.state = TrialState::Pending;
        rec.metric = None;
        rec.error = Some("stopped by the sweep's stop before it could checkpoint".into());
    } else if status.code() == Some(crate::train::preempt::EXIT_PREEMPTED) {
        rec.state = TrialState::Preempted;
        rec.metric = None;
        rec.error = summary.as_ref().map(|v| {
            format!(
                "preempted at step {} ({}); continues from there",
                v.json["steps"],
                v.stopped_by.as_deref().unwrap_or("a signal")
            )
        });
    } else if status.success() && summary.as_ref().is_some_and(|v| v.status == "paused") {
        // `train.pause_at_step`: a checkpoint there, continued later
        rec.state = TrialState::Paused;
    } else if !status.success() {
        rec.state = TrialState::Failed;
        rec.error = Some(failure_reason(
            &run_dir,
            &dir.join("logs").join(format!("{}.log", p.id)),
            status.code(),
        ));
    }
    rec
}

/// The results table (written, and printed), and the sweep's outcome: stopped, some trials
/// failed, or done; `closing`: a last line to say (asha: how many trials reached the end).
pub(super) fn conclude(
    dir: &Path,
    ledger: &Ledger,
    s: &SweepConfig,
    stopping: bool,
    total: usize,
    closing: Option<String>,
) -> Result<String> {
    let rows = rows(dir, ledger, s);
    write_results(dir, &rows, &s.metric)?;
    let table = to_text(&rows, &s.metric);
    if stopping {
        crate::ui::out(&table);
        let n = rows
            .iter()
            .filter(|r| r.status == TrialState::Preempted)
            .count();
        return Err(Error::Preempted(format!(
            "the sweep stopped: {n} trial(s) preempted with a checkpoint; sweep dir: {}\n  = help: continue it with `kiln sweep --resume {}`",
            dir.display(),
            dir.display()
        )));
    }
    let failed = rows
        .iter()
        .filter(|r| r.status == TrialState::Failed)
        .count();
    crate::ui::out(&table);
    crate::ui::out(&format!("sweep dir: {}", dir.display()));
    if let Some(line) = closing {
        crate::ui::out(&line);
    }
    if failed > 0 {
        return Err(Error::Invalid(format!(
            "{failed} of {total} trials failed; see the error column and {}/logs/",
            dir.display()
        )));
    }
    Ok(table)
}
