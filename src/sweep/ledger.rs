//! `sweep.jsonl`: the append-only record of every trial's state changes. A trial's state is its
//! last line; a line cut short by a crash is ignored.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TrialState {
    Pending,
    /// Submitted to Slurm (in a job array), not started.
    Queued,
    Running,
    /// Stopped by a signal with a checkpoint; the next run of the sweep continues it.
    Preempted,
    Done,
    Failed,
    /// asha: stopped at a rung with a checkpoint; promoted later when the ranking allows.
    Paused,
}

impl TrialState {
    pub fn word(self) -> &'static str {
        match self {
            TrialState::Pending => "pending",
            TrialState::Queued => "queued",
            TrialState::Running => "running",
            TrialState::Preempted => "preempted",
            TrialState::Done => "done",
            TrialState::Failed => "failed",
            TrialState::Paused => "paused",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub trial: String,
    pub index: usize,
    pub overrides: BTreeMap<String, String>,
    pub state: TrialState,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub exit: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub metric: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub error: Option<String>,
    /// The Slurm job array and this trial's index in it (`--executor slurm`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub job: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub array_index: Option<usize>,
    /// asha: the rung step this trial was sent to (running) or reached (paused, done).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub rung: Option<usize>,
    /// Seconds since the Unix epoch.
    pub time: f64,
}

impl Record {
    /// Queued or running in Slurm (a job array's task, an asha segment's job): nothing may run
    /// or submit this trial again.
    pub fn with_slurm(&self) -> bool {
        self.job.is_some() && matches!(self.state, TrialState::Queued | TrialState::Running)
    }
}

pub struct Ledger {
    pub path: PathBuf,
}

impl Ledger {
    pub fn read(&self) -> Vec<Record> {
        std::fs::read_to_string(&self.path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    pub fn append(&self, r: &Record) -> std::io::Result<()> {
        let line = serde_json::to_string(r).map_err(std::io::Error::other)?;
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        f.write_all(format!("{line}\n").as_bytes())?;
        f.sync_data()
    }

    /// The last record of every trial.
    pub fn latest(&self) -> BTreeMap<String, Record> {
        let mut out = BTreeMap::new();
        for r in self.read() {
            out.insert(r.trial.clone(), r);
        }
        out
    }

    /// How often each trial has failed.
    pub fn failures(&self) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for r in self
            .read()
            .into_iter()
            .filter(|r| r.state == TrialState::Failed)
        {
            *out.entry(r.trial).or_insert(0) += 1;
        }
        out
    }
}
