//! What Slurm says of a job: `scontrol` while the controller remembers it, else `sacct`, in
//! kiln's words (`JobState::word`).

use std::process::Command;

/// A job's state as Slurm reports it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobState {
    /// Slurm's word: PENDING, RUNNING, COMPLETED, FAILED, ...
    pub state: String,
    pub reason: Option<String>,
    pub restarts: u32,
    pub exit_code: Option<String>,
    pub nodes: Option<String>,
    pub elapsed: Option<String>,
}

impl JobState {
    /// kiln's word for it: pending, running, requeued, done, preempted or failed.
    pub fn word(&self) -> &'static str {
        let s = self.state.split_whitespace().next().unwrap_or("");
        match s {
            "PENDING" | "CONFIGURING" if self.restarts > 0 => "requeued",
            // final where Slurm preempts by cancelling (a requeued job is PENDING again)
            "PREEMPTED" => "preempted",
            "PENDING" | "CONFIGURING" => "pending",
            "RUNNING" | "COMPLETING" | "SUSPENDED" | "STAGE_OUT" | "SIGNALING" => "running",
            "COMPLETED" => "done",
            "REQUEUED" | "REQUEUE_HOLD" | "REQUEUE_FED" | "RESIZING" => "requeued",
            _ => "failed",
        }
    }
    /// Queued or running: a sweep must not submit the trial again.
    pub fn live(&self) -> bool {
        matches!(self.word(), "pending" | "running" | "requeued")
    }
}

/// Runs a Slurm command: its stdout, or its stderr (or why it could not start) on failure.
fn command_output(cmd: &str, args: &[&str]) -> std::result::Result<String, String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run `{cmd}`: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        // (scontrol says "Job 1_2 not found" on stdout)
        let said = match String::from_utf8_lossy(&out.stderr).trim() {
            "" => String::from_utf8_lossy(&out.stdout).trim().to_string(),
            e => e.to_string(),
        };
        Err(format!("`{cmd} {}` failed: {said}", args.join(" ")))
    }
}

/// `key=value` pairs of `scontrol show job -o` output.
fn scontrol_fields(line: &str) -> std::collections::BTreeMap<String, String> {
    line.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The state of task `task` of array `job` from the array's records: the task's own, or the
/// array's record of the tasks that never started on their own (their ids, e.g. `2-5%1`, or
/// none left: 4294967294, Slurm's NO_VAL).
fn array_record(job: &str, task: &str) -> Option<JobState> {
    let out = command_output("scontrol", &["show", "job", "-o", job]).ok()?;
    out.lines()
        .filter(|l| {
            let f = scontrol_fields(l);
            f.get("ArrayJobId").map(String::as_str) == Some(job)
                && f.get("ArrayTaskId").is_some_and(|t| task_in(t, task))
        })
        .find_map(from_scontrol)
}

/// Whether Slurm's `ArrayTaskId` value `ids` (`3`, `2-5%1`, `1,4-6`, `0-9:2`, NO_VAL) covers
/// task `task`.
pub(super) fn task_in(ids: &str, task: &str) -> bool {
    let Ok(t) = task.parse::<u64>() else {
        return false;
    };
    let ids = ids.split('%').next().unwrap_or("");
    ids == "4294967294"
        || ids.split(',').any(|part| {
            let (range, step) = part.split_once(':').unwrap_or((part, "1"));
            let (a, b) = range.split_once('-').unwrap_or((range, range));
            match (a.parse::<u64>(), b.parse::<u64>(), step.parse::<u64>()) {
                (Ok(a), Ok(b), Ok(st)) if st > 0 => (a..=b).contains(&t) && (t - a) % st == 0,
                _ => false,
            }
        })
}

pub(super) fn from_scontrol(line: &str) -> Option<JobState> {
    let f = scontrol_fields(line);
    let state = f.get("JobState")?.clone();
    Some(JobState {
        state,
        reason: f.get("Reason").filter(|r| *r != "None").cloned(),
        restarts: f.get("Restarts").and_then(|r| r.parse().ok()).unwrap_or(0),
        exit_code: f.get("ExitCode").cloned(),
        nodes: f
            .get("NodeList")
            .filter(|n| !n.is_empty() && *n != "(null)")
            .cloned(),
        elapsed: f.get("RunTime").cloned(),
    })
}

/// The state of job `id` (`123`, or an array task `123_4`): `scontrol` while the controller
/// remembers it, else `sacct` (where accounting is on). `Ok(None)` only when the controller
/// answers that it has no such job and accounting knows none either; `Err` when Slurm could not
/// be asked (then nothing may be concluded, e.g. that a trial is gone).
pub fn query(id: &str) -> std::result::Result<Option<JobState>, String> {
    match command_output("scontrol", &["show", "job", "-o", id]) {
        Ok(out) => {
            if let Some(s) = out.lines().find_map(from_scontrol) {
                return Ok(Some(s));
            }
        }
        // the controller answered: it has no such job (any more), or an array task that never
        // left its array's record (a one-task array cancelled while pending): that record's
        Err(e) if e.contains("Invalid job id") || e.contains(&format!("Job {id} not found")) => {
            if let Some(s) = id
                .split_once('_')
                .and_then(|(job, task)| array_record(job, task))
            {
                return Ok(Some(s));
            }
        }
        Err(e) => return Err(e),
    }
    let acct = [
        "-n",
        "-P",
        "-X",
        "-j",
        id,
        "-o",
        "State,ExitCode,Elapsed,NodeList",
    ];
    if let Ok(out) = command_output("sacct", &acct) {
        if let Some(l) = out.lines().find(|l| !l.trim().is_empty()) {
            let p: Vec<&str> = l.split('|').collect();
            return Ok(Some(JobState {
                state: p.first().unwrap_or(&"").to_string(),
                exit_code: p.get(1).map(|s| s.to_string()),
                elapsed: p.get(2).map(|s| s.to_string()),
                nodes: p.get(3).filter(|n| !n.is_empty()).map(|s| s.to_string()),
                ..JobState::default()
            }));
        }
    }
    Ok(None)
}
