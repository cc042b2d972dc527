//! The files one session of a run writes in its directory: on node 0 (or a single-node run)
//! `config.toml`, `env.json`, `metrics.jsonl`, TensorBoard's `tb/` and `summary.json`; on the
//! other nodes only their `logs/`. Opening them is the session's first change to the run
//! directory, so it takes the proof that every check passed ([`Passed`]).

use std::fs::{self, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::rendezvous::Job;
use super::run_dir::{open_error, open_no_follow, replace_file, stored_config, write_json};
use super::summary::Summary;
use crate::checkpoint::Store;
use crate::config::{self, Resolved};
use crate::error::{Error, Result};
use crate::train::MetricLine;
use crate::ui;

/// Proof that this node's checks passed (and, on node 0 of a resumed multi-node run, every
/// node's): only [`PendingChecks::pass`] makes one (its field is private to this file), and a
/// session changes no file without it.
pub(super) struct Passed(());

/// A session's checks under way (in a multi-node job, after the rendezvous: the watched
/// metrics, the memory, the checkpoint and node 0's run directory; the data, model and
/// `init_from` were checked before it). Dropped before `pass`, it stops the job, so the other
/// nodes fail at once instead of waiting in their first collective, and node 0 never sets
/// checkpoints aside or trims metrics for a resume that another node refused.
pub(super) struct PendingChecks<'a> {
    job: &'a mut Option<Job>,
    passed: bool,
}

impl<'a> PendingChecks<'a> {
    pub fn new(job: &'a mut Option<Job>) -> PendingChecks<'a> {
        PendingChecks { job, passed: false }
    }

    /// This node's checks passed. Every node says so; node 0 of a resumed run waits until the
    /// others have said it too.
    pub fn pass(mut self, resuming: bool, timeout: Duration) -> Result<Passed> {
        self.passed = true;
        let Some(j) = self.job.as_mut() else {
            return Ok(Passed(()));
        };
        if j.node != 0 {
            j.client.set(&format!("checked/{}", j.node), "ok")?;
            return Ok(Passed(()));
        }
        if !resuming {
            return Ok(Passed(()));
        }
        let keys: Vec<String> = (1..j.nnodes).map(|n| format!("checked/{n}")).collect();
        match j.client.wait(&keys, timeout) {
            Ok(Ok(_)) => Ok(Passed(())),
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

impl Drop for PendingChecks<'_> {
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

/// A session's files, open.
pub(super) struct RunFiles {
    pub dir: PathBuf,
    /// Whether this node writes the run's shared files (node 0, or a single-node run).
    pub primary: bool,
    metrics_path: PathBuf,
    metrics: BufWriter<fs::File>,
    /// The first failed write of `metrics.jsonl` (it fails the run at its end).
    metrics_error: Option<std::io::Error>,
    /// TensorBoard's event file of this session (`[log] tensorboard`).
    tb: Option<super::tensorboard::EventWriter>,
}

impl RunFiles {
    /// Starts a session in `dir`: the unfinished checkpoints of an interrupted save removed,
    /// a resumed run's checkpoints after `from_step` set aside and its metrics cut back to it,
    /// the config and this session's environment recorded, old traces and summary removed,
    /// `metrics.jsonl` opened (appended to when resumed) and TensorBoard's file made.
    pub fn begin(
        r: &Resolved,
        dir: &Path,
        primary: bool,
        resumed: bool,
        from_step: Option<usize>,
        backend: &str,
        _: &Passed,
    ) -> Result<RunFiles> {
        let c = &r.config;
        let store = Store::new(dir.join(&c.checkpoint.dir));
        if primary {
            // one that cannot be removed stops the run here, before any file of it changes
            store.clean_tmp().map_err(Error::Checkpoint)?;
            if resumed {
                let step = from_step.unwrap_or(0);
                super::resume::set_aside_newer(&store, step as u64)?;
                super::resume::trim_metrics(&dir.join("metrics.jsonl"), step)?;
            }
        }
        fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("creating run directory {}", dir.display()), e))?;
        if primary {
            replace_file(
                &dir.join("config.toml"),
                config::to_toml(&stored_config(r)).as_bytes(),
            )
            .map_err(|e| Error::io(format!("writing {}/config.toml", dir.display()), e))?;
            // what produced this session of the run (a resume appends its own)
            super::record::append_session(dir, r, backend)?;
            if c.profile.enabled {
                // a resumed run's traces are this session's only (node 0 merges what it finds)
                let _ = fs::remove_dir_all(dir.join("trace"));
            }
            let summary = dir.join("summary.json");
            if summary.exists() {
                fs::remove_file(&summary)
                    .map_err(|e| Error::io(format!("removing {}", summary.display()), e))?;
            }
        }
        ui::out(&format!("run dir: {}", dir.display()));
        let logs = dir.join("logs");
        fs::create_dir_all(&logs)
            .map_err(|e| Error::io(format!("creating {}", logs.display()), e))?;
        let metrics_path = if primary {
            dir.join("metrics.jsonl")
        } else {
            PathBuf::from("/dev/null")
        };
        let mut options = OpenOptions::new();
        if resumed || !primary {
            options.append(true).create(true);
        } else {
            options.write(true).create(true).truncate(true);
        }
        let metrics = open_no_follow(&mut options, &metrics_path)
            .map_err(|e| open_error("opening", &metrics_path, e))?;
        Ok(RunFiles {
            dir: dir.to_path_buf(),
            primary,
            metrics_path,
            metrics: BufWriter::new(metrics),
            metrics_error: None,
            tb: (primary && c.log.tensorboard)
                .then(|| tensorboard(dir, from_step))
                .flatten(),
        })
    }

    pub fn logs(&self) -> PathBuf {
        self.dir.join("logs")
    }

    /// Appends a metrics line (to TensorBoard's file too). A failed write is kept for the end
    /// of the run; a TensorBoard file that fails is said once and left.
    pub fn line(&mut self, line: &MetricLine) {
        let failed = self.tb.as_mut().and_then(|w| {
            let json = serde_json::to_value(line).unwrap_or_default();
            w.line(&json)
                .err()
                .map(|e| (w.path().display().to_string(), e))
        });
        if let Some((path, e)) = failed {
            ui::note(&format!(
                "warning: writing {path} failed ({e}); no more TensorBoard events this session"
            ));
            self.tb = None;
        }
        let res = serde_json::to_string(line)
            .map_err(std::io::Error::other)
            .and_then(|s| writeln!(self.metrics, "{s}"))
            .and_then(|_| self.metrics.flush());
        if let Err(e) = res {
            self.metrics_error.get_or_insert(e);
        }
    }

    /// The error of a `metrics.jsonl` that could not be written (a full disk): it fails the run
    /// like any error.
    pub fn take_error(&mut self) -> Option<Error> {
        let path = &self.metrics_path;
        self.metrics_error
            .take()
            .map(|e| Error::io(format!("writing {}", path.display()), e))
    }

    /// Writes `summary.json` (node 0 only).
    pub fn summary(&self, s: &Summary) -> Result<()> {
        if !self.primary {
            return Ok(());
        }
        write_json(&self.dir.join("summary.json"), s)
    }
}

/// This session's TensorBoard event file; one that cannot be made is said, and the run goes on
/// (`metrics.jsonl` has every line).
fn tensorboard(dir: &Path, from_step: Option<usize>) -> Option<super::tensorboard::EventWriter> {
    match super::tensorboard::EventWriter::create(
        dir,
        &super::record::hostname(),
        from_step.map(|s| s + 1),
    ) {
        Ok(w) => Some(w),
        Err(e) => {
            ui::note(&format!(
                "warning: cannot write TensorBoard events in {}/tb: {e}; metrics.jsonl has every line",
                dir.display()
            ));
            None
        }
    }
}

/// `summary.json` read back (by a resume, `kiln report`, sweeps and `kiln submit`): the fields
/// readers decide on, typed, and any number by its key (a sweep's metric). `None` when the
/// run has none yet, or one that is not a JSON object (cut short).
#[derive(Debug, Clone)]
pub struct SummaryFile {
    /// "finished", "failed" or "preempted".
    pub status: String,
    pub steps: Option<u64>,
    pub error: Option<String>,
    /// What stopped a preempted run, e.g. "SIGTERM".
    pub stopped_by: Option<String>,
    /// The whole object, for what shows every field (`kiln report`).
    pub json: serde_json::Value,
}

impl SummaryFile {
    pub fn read(run_dir: &Path) -> Option<SummaryFile> {
        let bytes = fs::read(run_dir.join("summary.json")).ok()?;
        let json: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
        json.is_object().then(|| SummaryFile {
            status: json["status"].as_str().unwrap_or_default().to_string(),
            steps: json["steps"].as_u64(),
            error: json["error"].as_str().map(str::to_string),
            stopped_by: json["stopped_by"].as_str().map(str::to_string),
            json,
        })
    }

    /// The number `key` holds (`eval_loss`, `samples_per_sec`, ...), when it holds one.
    pub fn number(&self, key: &str) -> Option<f64> {
        self.json[key].as_f64()
    }
}

/// `metrics.jsonl` read back: every line that parses as an object, in order, and a count of
/// those that do not (a line cut short by a crash, or being written). Bytes, not a string: one
/// bad byte must not hide every other line.
#[derive(Debug, Clone, Default)]
pub struct MetricsFile {
    pub lines: Vec<serde_json::Value>,
    pub skipped: usize,
}

impl MetricsFile {
    pub fn read(run_dir: &Path) -> MetricsFile {
        let bytes = fs::read(run_dir.join("metrics.jsonl")).unwrap_or_default();
        let mut out = MetricsFile::default();
        for l in String::from_utf8_lossy(&bytes)
            .lines()
            .filter(|l| !l.trim().is_empty())
        {
            match serde_json::from_str::<serde_json::Value>(l) {
                Ok(v) if v.is_object() => out.lines.push(v),
                _ => out.skipped += 1,
            }
        }
        out
    }

    /// The last line of a run's `metrics.jsonl` (a running run's progress), read without
    /// parsing the others.
    pub fn last_line(run_dir: &Path) -> Option<serde_json::Value> {
        let bytes = fs::read(run_dir.join("metrics.jsonl")).ok()?;
        let text = String::from_utf8_lossy(&bytes);
        serde_json::from_str(text.lines().last()?).ok()
    }

    /// The values of `key` over the run, in order.
    pub fn values<'a>(&'a self, key: &'a str) -> impl Iterator<Item = f64> + 'a {
        self.lines.iter().filter_map(move |l| l[key].as_f64())
    }
}
