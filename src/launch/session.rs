//! The files one session of a run writes in its directory: on node 0 (or a single-node run)
//! `config.toml`, `env.json`, `metrics.jsonl`, TensorBoard's `tb/` and `summary.json`; on the
//! other nodes only their `logs/`. Opening them is the session's first change to the run
//! directory, so it takes the proof that every check passed ([`Passed`]).

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::checkpoint::CheckpointDir;
use crate::config::{self, Resolved};
use crate::error::{Error, Result};
use crate::rendezvous::Job;
use crate::rundir::summary::{BestSummary, CheckpointSummary, EarlyStopSummary, Summary};
use crate::rundir::{replace_file, stored_config, write_json};
use crate::track::{tensorboard, MetricSink, MetricsJsonl, Tracks};
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
    /// `metrics.jsonl` and the trackers `[log]` turns on.
    tracks: Tracks,
}

/// Whether this process prints a run's header, progress and closing line: every node of
/// kiln's own, but of the processes torchrun starts only the job's rank 0, as torchrun's own
/// scripts do (issue 58, defect 22: each printed its own); the others log to their rank logs.
pub fn speaks(primary: bool) -> bool {
    primary || !config::under_torchrun(&|k| std::env::var(k).ok())
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
        let store = CheckpointDir::new(dir.join(&c.checkpoint.dir));
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
            // what produced this session of the run (a resume appends its own), and the files
            // a new run reads (a resume checked them against these: `prepare_resume`)
            crate::rundir::record::append_session(dir, r, backend)?;
            if !resumed {
                crate::rundir::inputs::record(dir, r)?;
            }
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
        if speaks(primary) {
            ui::out(&format!("run dir: {}", dir.display()));
        }
        let logs = dir.join("logs");
        fs::create_dir_all(&logs)
            .map_err(|e| Error::io(format!("creating {}", logs.display()), e))?;
        let mut sinks: Vec<Box<dyn MetricSink>> =
            vec![Box::new(MetricsJsonl::open(dir, primary, resumed)?)];
        if primary && c.log.tensorboard {
            if let Some(w) = tensorboard::open(dir, from_step) {
                sinks.push(Box::new(w));
            }
        }
        if let Some(m) = c.log.mlflow.as_ref().filter(|_| primary) {
            let experiment = m.experiment.as_ref().unwrap_or(&c.experiment.name);
            let config = config::to_toml(&stored_config(r));
            sinks.push(Box::new(crate::track::mlflow::open(
                dir, &m.uri, experiment, config,
            )));
        }
        Ok(RunFiles {
            dir: dir.to_path_buf(),
            primary,
            tracks: Tracks::new(sinks),
        })
    }

    pub fn logs(&self) -> PathBuf {
        self.dir.join("logs")
    }

    /// Appends a metrics line to `metrics.jsonl` and the trackers. A failed write of
    /// `metrics.jsonl` is kept for the end of the run; a tracker that fails is said once and left.
    pub fn line(&mut self, line: &MetricLine) {
        self.tracks.line(line);
    }

    /// The error of a `metrics.jsonl` that could not be written (a full disk): it fails the run
    /// like any error.
    pub fn take_error(&mut self) -> Option<Error> {
        self.tracks.take_error()
    }

    /// Writes `summary.json` (node 0 only).
    pub fn summary(&self, s: &Summary) -> Result<()> {
        if !self.primary {
            return Ok(());
        }
        write_json(&self.dir.join("summary.json"), s)
    }
}

/// What a session knows besides its outcome, for its `summary.json`.
pub(super) struct SummaryInputs<'a> {
    pub config: &'a crate::config::Config,
    pub plan: &'a crate::plan::Plan,
    pub placement: &'a crate::backend::Placement,
    /// `model.kind`, and its training FLOPs per sample where kiln knows them.
    pub model_kind: String,
    pub flops_per_sample: Option<f64>,
    pub config_hash: String,
    /// The step the session started from, and the checkpoint's epoch.
    pub first_step: usize,
    pub first_epoch: f64,
}

/// The summary of a session that ended with `status` ("finished", "preempted" or "failed"):
/// from its result when it has one, else from the step and epoch it `reached`.
pub(super) fn summary_of(
    s: &SummaryInputs<'_>,
    status: &'static str,
    error: Option<String>,
    res: Option<&super::RunResult>,
    reached: (Option<usize>, Option<f64>),
) -> Summary {
    let c = s.config;
    let be = s.placement.backend;
    let o = res.map(|r| &r.outcome);
    let eval = o.and_then(|o| o.eval_metrics());
    let flops_per_sec = s
        .flops_per_sample
        .zip(o.map(|o| o.samples_per_sec))
        .map(|(f, sps)| (f * sps).round());
    let (mfu, mfu_note) = match (flops_per_sec, o) {
        (Some(f), _) => super::profile::mfu(
            be.name(),
            c.backend.precision,
            f,
            s.plan.world_size,
            s.placement.ordinals.first().copied().unwrap_or(0),
        ),
        (None, None) => (None, None),
        (None, Some(_)) => (
            None,
            Some(format!(
                "kiln knows no FLOP count for model.kind = \"{}\"",
                s.model_kind
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
        flops_per_sample: s.flops_per_sample,
        flops_per_sec,
        mfu,
        mfu_note,
        status,
        error,
        steps: o
            .map(|o| o.steps)
            .unwrap_or(reached.0.unwrap_or(s.first_step)),
        epochs: o
            .map(|o| o.epochs)
            .unwrap_or(reached.1.unwrap_or(s.first_epoch)),
        final_loss: o.map(|o| o.final_loss),
        eval_loss: eval.map(|m| m.loss),
        eval_accuracy: eval.and_then(|m| m.accuracy),
        eval_perplexity: eval.and_then(|m| m.perplexity),
        eval_samples: eval.map(|m| m.samples),
        wall_seconds: o.map(|o| o.wall_seconds).unwrap_or(0.0),
        samples_per_sec: o.map(|o| o.samples_per_sec).unwrap_or(0.0),
        tokens_per_sec: o.and_then(|o| o.tokens_per_sec()),
        world_size: s.plan.world_size,
        strategy: c.strategy.kind,
        global_batch: s.plan.global_batch,
        backend: be.name(),
        precision: c.backend.precision,
        loss_scale: o.and_then(|o| o.loss_scale.clone()),
        num_params: s.plan.num_params,
        trainable_params: s.plan.trainable_params,
        config_hash: s.config_hash.clone(),
        resumed_from_step: s.first_step,
        params_sha256: o.map(|o| o.params_sha256.clone()),
        memory: res.map(|r| r.memory.clone()).unwrap_or_default(),
        peak_rss_bytes: crate::memory::peak_rss_bytes(),
        checkpoint: o.filter(|o| o.saves > 0).map(|o| CheckpointSummary {
            async_save: c.checkpoint.async_save,
            saves: o.saves,
            blocked_seconds: o.blocked_seconds,
            background_seconds: o.background_seconds,
        }),
        time: res.map(|r| {
            super::profile::time_section(
                r,
                r.outcome.steps.saturating_sub(s.first_step),
                be.name().starts_with("cuda"),
            )
        }),
    }
}
