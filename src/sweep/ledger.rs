//! `sweep.jsonl`: the append-only record of every trial's state changes. A trial's state is its
//! last line. A line that cannot be read (cut short by a crash, or damaged) is skipped, and
//! named once (file:line) on stderr: the other lines still count, so one bad line never makes
//! the ledger read as empty (issue 58, defect 5: a sweep whose ledger read as empty started its
//! trials again and again). Every append starts on a line of its own, so a line cut by a crash
//! never swallows the record after it (defect 6).

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
    /// Every record that reads, in order; each line that does not is named once on stderr.
    pub fn read(&self) -> Vec<Record> {
        let (records, bad) = self.read_lines();
        for (line, why) in bad {
            // (a last line without its newline may be one another process is writing now)
            if line != usize::MAX {
                warn_once(&self.path, line, &why);
            }
        }
        records
    }

    /// Every record that reads, and the lines that do not (1-based, with why; `usize::MAX` for
    /// a last line without its newline, which a writer may not have finished).
    pub fn read_lines(&self) -> (Vec<Record>, Vec<(usize, String)>) {
        let bytes = std::fs::read(&self.path).unwrap_or_default();
        let mut records = Vec::new();
        let mut bad = Vec::new();
        let lines: Vec<&[u8]> = bytes.split(|b| *b == b'\n').collect();
        for (i, raw) in lines.iter().enumerate() {
            if raw.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let parsed = std::str::from_utf8(raw)
                .map_err(|e| format!("not UTF-8 (byte {})", e.valid_up_to() + 1))
                .and_then(|l| {
                    serde_json::from_str::<Record>(l)
                        .map_err(|e| format!("not a ledger record ({e})"))
                });
            match parsed {
                Ok(r) => records.push(r),
                Err(why) if i + 1 == lines.len() => bad.push((usize::MAX, why)),
                Err(why) => bad.push((i + 1, why)),
            }
        }
        (records, bad)
    }

    /// Appends `r` on a line of its own (after a newline when the file ends without one, as
    /// a line cut by a crash does) and syncs it.
    pub fn append(&self, r: &Record) -> std::io::Result<()> {
        use std::io::{Read, Seek, SeekFrom};
        let line = serde_json::to_string(r).map_err(std::io::Error::other)?;
        let mut f = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(&self.path)?;
        let len = f.metadata()?.len();
        let mut text = String::with_capacity(line.len() + 2);
        if len > 0 {
            let mut last = [0u8];
            f.seek(SeekFrom::Start(len - 1))?;
            f.read_exact(&mut last)?;
            if last[0] != b'\n' {
                text.push('\n');
            }
        }
        text.push_str(&line);
        text.push('\n');
        f.write_all(text.as_bytes())?;
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

/// Says once per process that line `line` of `path` was skipped, and why.
fn warn_once(path: &std::path::Path, line: usize, why: &str) {
    use std::sync::Mutex;
    static SAID: Mutex<Vec<(PathBuf, usize)>> = Mutex::new(Vec::new());
    let mut said = SAID.lock().unwrap_or_else(|p| p.into_inner());
    let key = (path.to_path_buf(), line);
    if said.contains(&key) {
        return;
    }
    said.push(key);
    crate::ui::note(&format!(
        "warning: {}:{line}: skipped a line that cannot be read: {why} (a line cut by a crash, or damaged; the trials' other records still count)",
        path.display()
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(trial: &str, state: TrialState) -> Record {
        Record {
            trial: trial.into(),
            index: 0,
            overrides: Default::default(),
            state,
            exit: None,
            metric: None,
            error: None,
            job: None,
            array_index: None,
            rung: None,
            time: 0.0,
        }
    }

    #[test]
    fn a_bad_line_is_named_and_skipped_and_the_others_still_count() {
        let dir = crate::testdir::tempdir().unwrap();
        let ledger = Ledger {
            path: dir.path().join("sweep.jsonl"),
        };
        ledger.append(&rec("a", TrialState::Done)).unwrap();
        // a non-UTF-8 byte in a line of its own, then a good record
        let mut bytes = std::fs::read(&ledger.path).unwrap();
        bytes.extend_from_slice(b"{\"trial\": \"\xff\"}\n");
        std::fs::write(&ledger.path, &bytes).unwrap();
        ledger.append(&rec("b", TrialState::Done)).unwrap();
        let (records, bad) = ledger.read_lines();
        assert_eq!(records.len(), 2, "{records:?}");
        assert_eq!(bad.len(), 1);
        assert_eq!(bad[0].0, 2);
        assert!(bad[0].1.contains("not UTF-8"), "{bad:?}");
        assert_eq!(ledger.latest().len(), 2);
    }

    #[test]
    fn a_line_cut_by_a_crash_does_not_swallow_the_next_record() {
        let dir = crate::testdir::tempdir().unwrap();
        let ledger = Ledger {
            path: dir.path().join("sweep.jsonl"),
        };
        ledger.append(&rec("a", TrialState::Done)).unwrap();
        let mut bytes = std::fs::read(&ledger.path).unwrap();
        bytes.extend_from_slice(b"{\"trial\":\"b\",\"ind");
        std::fs::write(&ledger.path, &bytes).unwrap();
        ledger.append(&rec("c", TrialState::Done)).unwrap();
        let (records, bad) = ledger.read_lines();
        let trials: Vec<&str> = records.iter().map(|r| r.trial.as_str()).collect();
        assert_eq!(trials, ["a", "c"]);
        assert_eq!(bad.len(), 1);
        assert_eq!(bad[0].0, 2);
    }
}
