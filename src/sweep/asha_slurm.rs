//! `kiln sweep FILE --executor slurm` with `sweep.scheduler = "asha"`: promotion as
//! resubmission. Every segment (a trial trained to its next rung, where it pauses with a
//! checkpoint) is its own Slurm job, a one-task array running `kiln resume` with
//! `train.pause_at_step`; at most `parallel` segments are queued or running. When a segment
//! ends by itself its job runs `kiln sweep advance`, which records the rung's result in the
//! ledger and submits the next segments as the local executor would pick them: a trial left in
//! flight, the best promotion, else a new trial to the first rung. Decisions are taken under an
//! exclusive lock (`sweep.decide.lock`), so two jobs ending at once never promote one trial
//! twice. A segment stopped by a signal (a cancel, a preemption) is left to Slurm's requeue or
//! to the next submission, which `refresh`es the ledger and fills the free places again.

use std::fs;
use std::path::Path;

use super::asha::segment_record;
use super::policy::{fill, Again, AshaPolicy};
use super::slurm::{job_configs, refresh, Slurm};
use super::{ledger_io, plan, read_spec, rows, write_results};
use super::{ExecutorKind, Ledger, Planned, SweepSpec, TrialState};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::ui;

/// An exclusive `flock` on `sweep.decide.lock`, held while the ledger is read and decided on
/// (by a submission, `kiln sweep advance` in a job, `kiln sweep status`); released when
/// dropped.
pub(super) struct Decide {
    _file: fs::File,
}

impl Decide {
    pub(super) fn take(dir: &Path) -> Result<Decide> {
        use std::os::fd::AsRawFd;
        let path = dir.join("sweep.decide.lock");
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
        loop {
            // SAFETY: flock(2) on a descriptor this function owns.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(Decide { _file: file });
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(Error::Invalid(format!(
                    "cannot lock {} ({e}): an asha sweep on Slurm decides under flock(2), from every node, so its directory must be on a file system where flock works across nodes (NFSv4, Lustre mounted with -o flock, GPFS)",
                    path.display()
                )));
            }
        }
    }
}

/// A segment's job, as its script names it to `kiln sweep advance`.
#[derive(Debug, Clone, Copy)]
pub struct Segment<'a> {
    pub trial: &'a str,
    /// Its Slurm job (the one-task array's `SLURM_ARRAY_JOB_ID`).
    pub job: &'a str,
}

/// The sweep in `dir` as its submission planned it, checked to be an asha sweep on Slurm.
fn planned_sweep(dir: &Path) -> Result<(SweepSpec, Config, Vec<Planned>)> {
    let spec = read_spec(dir)?;
    // the trials as the submission planned them: without what Slurm and the job script set
    // for the job's own launch (a config would read them as `launch.*`)
    let env: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| !is_launcher_var(k))
        .collect();
    let (base, planned) = plan(&spec, &env)?;
    if base.sweep.scheduler != crate::config::SweepScheduler::Asha
        || spec.executor != ExecutorKind::Slurm
    {
        return Err(Error::Usage(format!(
            "`kiln sweep advance` goes on with an asha sweep on Slurm; {} is not one",
            dir.display()
        )));
    }
    Ok((spec, base, planned))
}

/// The ledger's record of `seg` while it is queued or running (the ledger has this job for
/// the trial); read under `Decide`.
fn live_record(ledger: &Ledger, seg: Segment) -> Option<super::Record> {
    ledger
        .latest()
        .remove(seg.trial)
        .filter(|r| r.with_slurm() && r.job.as_deref() == Some(seg.job))
}

/// `kiln sweep advance DIR --trial ID --job J --check`, before a segment's job runs it:
/// whether it may run (`run`), else `skip`. It may while the trial's latest ledger record
/// names job J and is not done or paused (queued, running, or failed or preempted when Slurm
/// runs it again after a lost node or a preemption: then it counts as running again). A job
/// whose segment was recorded, or whose submission never reached the ledger, must not train
/// in a run directory another job may be using; it fills the place it leaves instead.
pub fn check_segment(dir: &Path, seg: Segment) -> Result<bool> {
    catch_stops();
    let (spec, base, planned) = planned_sweep(dir)?;
    let _decide = Decide::take(dir)?;
    let ledger = Ledger {
        path: dir.join("sweep.jsonl"),
    };
    let latest = ledger.latest().remove(seg.trial);
    if let Some(rec) = latest.filter(|r| r.job.as_deref() == Some(seg.job)) {
        match rec.state {
            TrialState::Queued | TrialState::Running => return Ok(true),
            TrialState::Failed | TrialState::Preempted => {
                let mut r = rec.clone();
                r.state = TrialState::Running;
                r.error = None;
                r.exit = None;
                ledger.append(&r).map_err(ledger_io)?;
                return Ok(true);
            }
            _ => {}
        }
    }
    let jobs = job_configs(&planned, &base.slurm, dir)?;
    submit_next(dir, (&spec, &base, &planned, &jobs), &ledger)?;
    Ok(false)
}

/// `kiln sweep advance DIR --trial ID --job J --exit RC`, run by a segment's job when its
/// `kiln resume` ended: records where the trial got (paused or done at its rung, with the
/// metric there, or preempted or failed), then, unless `submit` is false (the job was
/// cancelled), brings the ledger up to date with Slurm and submits the sweep's next segments.
pub fn advance(dir: &Path, seg: Segment, exit: i32, submit: bool) -> Result<()> {
    use std::os::unix::process::ExitStatusExt;
    catch_stops();
    let (spec, base, planned) = planned_sweep(dir)?;
    let s = &base.sweep;
    let jobs = job_configs(&planned, &base.slurm, dir)?;
    let Some(p) = planned.iter().find(|p| p.id == seg.trial) else {
        return Err(Error::Usage(format!(
            "trial {} is not a trial of the sweep in {}: its experiment file ({}) changed since the sweep was submitted\n  = help: put the file back as it was, then `kiln sweep --resume {}`",
            seg.trial,
            dir.display(),
            spec.file.display(),
            dir.display()
        )));
    };
    let _decide = Decide::take(dir)?;
    let ledger = Ledger {
        path: dir.join("sweep.jsonl"),
    };
    // (recorded already when a refresh saw the job end first)
    if let Some(rec) = live_record(&ledger, seg) {
        let status = std::process::ExitStatus::from_raw((exit & 0xff) << 8);
        let target = rec.rung.unwrap_or(0);
        let mut r = segment_record(dir, p, target, status, false, &s.metric);
        // no job: Slurm has nothing more to say of this segment
        r.array_index = rec.array_index;
        ledger.append(&r).map_err(ledger_io)?;
        ui::out(&format!(
            "kiln: trial {} {} at step {}{}",
            seg.trial,
            r.state.word(),
            r.rung.unwrap_or(0),
            r.error.map(|e| format!(": {e}")).unwrap_or_default()
        ));
    }
    let res = if submit {
        submit_next(dir, (&spec, &base, &planned, &jobs), &ledger)
    } else {
        Ok(())
    };
    write_results(dir, &rows(dir, &ledger, s), &s.metric)?;
    res
}

/// A job going on with the sweep (under `Decide`): brings the ledger up to date with Slurm
/// (segments that ended without a word, a lost node or a time limit, give their places back;
/// a trial Slurm cannot be asked about keeps its state) and submits the next segments.
fn submit_next(
    dir: &Path,
    (spec, base, planned, jobs): (&SweepSpec, &Config, &[Planned], &[Config]),
    ledger: &Ledger,
) -> Result<()> {
    let s = &base.sweep;
    if this_job_cancelled() {
        // (a stop signal can come before `kiln sweep advance` has its handler, or reach only
        // the job's script: Slurm's word on the job is the last check)
        STOPPED.store(true, std::sync::atomic::Ordering::SeqCst);
    }
    for line in refresh(dir, ledger, &s.metric)? {
        ui::out(&format!("kiln: state unknown: {line}"));
    }
    let parallel = spec.parallel.unwrap_or(s.parallel).max(1);
    let mut policy = AshaPolicy::on_slurm(base, Again::FailedWithin(s.retries));
    let mut exec = Slurm::new(dir, base, (planned, jobs), parallel, true);
    let res = fill(&mut policy, &mut exec, planned, ledger);
    for l in &exec.sent {
        ui::out(&format!("kiln: submitted {l}"));
    }
    res
}

/// A cancel of the job (SIGTERM to all of it) must not cut a decision in half, between a
/// segment's sbatch and its ledger record (a decision takes well under Slurm's KillWait): a
/// stop signal to `kiln sweep advance` stops the submitting of more instead.
fn catch_stops() {
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGUSR1] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            libc::signal(
                sig,
                on_stop as extern "C" fn(libc::c_int) as libc::sighandler_t,
            )
        };
    }
}

/// Whether Slurm says the job running this process is ending (a cancelled job is COMPLETING
/// while its script ends), so its segments' decisions submit nothing; said in the job's log
/// when so. Not in a job, Slurm cannot be asked, or a state a live job can be in
/// (RUNNING, SUSPENDED, ...): no.
fn this_job_cancelled() -> bool {
    // (the task's own record: the array's id alone lists every task of the array)
    let id = match (
        std::env::var("SLURM_ARRAY_JOB_ID"),
        std::env::var("SLURM_ARRAY_TASK_ID"),
    ) {
        (Ok(job), Ok(task)) => format!("{job}_{task}"),
        _ => match std::env::var("SLURM_JOB_ID") {
            Ok(id) => id,
            Err(_) => return false,
        },
    };
    let Ok(Some(st)) = crate::slurm::query(&id) else {
        return false;
    };
    let word = st.state.split_whitespace().next().unwrap_or("");
    let ending = matches!(
        word,
        "COMPLETING"
            | "COMPLETED"
            | "CANCELLED"
            | "TIMEOUT"
            | "PREEMPTED"
            | "NODE_FAIL"
            | "FAILED"
            | "DEADLINE"
            | "OUT_OF_MEMORY"
            | "BOOT_FAIL"
    ) || word.starts_with("REQUEUE");
    if ending {
        // (stderr: a `--check`'s stdout is its verdict)
        ui::note(&format!(
            "kiln: Slurm says job {id} is {word}: submitting no more segments from it"
        ));
    }
    ending
}

/// Set by a stop signal to `kiln sweep advance`, or by Slurm's word that its job was cancelled.
static STOPPED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_stop(_: libc::c_int) {
    STOPPED.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Whether a stop signal reached `kiln sweep advance` (it submits nothing more).
pub(super) fn stopped() -> bool {
    STOPPED.load(std::sync::atomic::Ordering::SeqCst)
}

/// A variable Slurm, torchrun or a kiln job script sets for a job's launch.
fn is_launcher_var(name: &str) -> bool {
    name.starts_with("SLURM_")
        || name.starts_with("TORCHELASTIC_")
        || matches!(
            name,
            "WORLD_SIZE"
                | "RANK"
                | "LOCAL_RANK"
                | "LOCAL_WORLD_SIZE"
                | "MASTER_ADDR"
                | "MASTER_PORT"
        )
}
