//! Layer: track (above rundir; below launch).
//!
//! Where a session's metric lines go, each a [`MetricSink`] (only node 0 writes anywhere: the
//! other nodes' `metrics.jsonl` is `/dev/null`, and they open no tracker):
//! - `metrics.jsonl` ([`jsonl`], [`MetricsJsonl`]): always, and first; the run's own record, so
//!   a failed write fails the run (at its end).
//! - TensorBoard event files ([`tensorboard`]): with `[log] tensorboard = true`, in `tb/` of the
//!   run directory.
//! - An MLflow run ([`mlflow`]): with `[log.mlflow]`; a background thread sends what
//!   `metrics.jsonl` holds (so the training never waits on the server), and `kiln track push`
//!   sends later what did not get through.
//!
//! [`Tracks`] writes every line to every sink; a tracker whose write fails is said once and
//! dropped, the run goes on (MLflow's sender handles its own failures and never fails a write).
//!
//! A new tracker takes: a file here with a `MetricSink` impl, and its `pub mod` below; its key
//! in `[log]` (`LogConfig` in `config/log.rs`, with its values checked in `LogConfig::check`;
//! its doc comments become its rows of the book's configuration reference); and its line in
//! `RunFiles::begin` (`launch/session.rs`), where the session opens its sinks. A secret in its config (as
//! `log.mlflow.uri` may hold) is also taken out where a config is stored or hashed
//! (`MlflowConfig::stored`, called by `rundir`'s `stored_config_with` and the sweep's `id_of`).

pub mod jsonl;
pub mod mlflow;
pub mod tensorboard;

pub use jsonl::MetricsJsonl;

use crate::error::Error;
use crate::train::MetricLine;
use crate::ui;

/// Somewhere metric lines go.
pub trait MetricSink: Send {
    /// Where it writes (a file, an address), for messages.
    fn path(&self) -> String;
    /// What the user stops getting when it fails, e.g. "TensorBoard events".
    fn what(&self) -> &'static str;
    /// Writes one line of the run's metrics.
    fn line(&mut self, line: &MetricLine) -> std::io::Result<()>;
    /// Whether a failed write fails the run (at its end, like any error; `metrics.jsonl`), or
    /// only stops this sink (a tracker: the run goes on, `metrics.jsonl` has every line).
    fn required(&self) -> bool {
        false
    }
}

/// A session's sinks.
#[derive(Default)]
pub struct Tracks {
    sinks: Vec<Box<dyn MetricSink>>,
    /// The first failed write of a required sink, with its path.
    error: Option<(String, std::io::Error)>,
}

impl Tracks {
    pub fn new(sinks: Vec<Box<dyn MetricSink>>) -> Tracks {
        Tracks { sinks, error: None }
    }

    /// Writes `line` to every sink. A required sink's failure is kept for the end of the run; an
    /// optional one that fails is said once and dropped.
    pub fn line(&mut self, line: &MetricLine) {
        let mut i = 0;
        while i < self.sinks.len() {
            let s = &mut self.sinks[i];
            match s.line(line) {
                Ok(()) => i += 1,
                Err(e) if s.required() => {
                    if self.error.is_none() {
                        self.error = Some((s.path(), e));
                    }
                    i += 1;
                }
                Err(e) => {
                    ui::note(&format!(
                        "warning: writing {} failed ({e}); no more {} this session",
                        s.path(),
                        s.what()
                    ));
                    self.sinks.remove(i);
                }
            }
        }
    }

    /// The error of a required sink that could not be written (a full disk).
    pub fn take_error(&mut self) -> Option<Error> {
        self.error
            .take()
            .map(|(path, e)| Error::io(format!("writing {path}"), e))
    }

    /// How many sinks still take lines.
    pub fn len(&self) -> usize {
        self.sinks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sinks.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sink that fails from its `fails_at`-th line on, and counts what it got.
    struct Flaky {
        got: std::sync::Arc<std::sync::atomic::AtomicUsize>,
        fails_at: usize,
        required: bool,
    }

    impl MetricSink for Flaky {
        fn path(&self) -> String {
            "flaky".into()
        }
        fn what(&self) -> &'static str {
            "flaky lines"
        }
        fn line(&mut self, _: &MetricLine) -> std::io::Result<()> {
            use std::sync::atomic::Ordering;
            let n = self.got.fetch_add(1, Ordering::SeqCst);
            if n >= self.fails_at {
                Err(std::io::Error::other(format!("line {n}")))
            } else {
                Ok(())
            }
        }
        fn required(&self) -> bool {
            self.required
        }
    }

    #[test]
    fn a_failed_tracker_is_dropped_and_a_failed_required_sink_fails_the_run() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        let (req, opt) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let mut t = Tracks::new(vec![
            Box::new(Flaky {
                got: opt.clone(),
                fails_at: 1,
                required: false,
            }),
            Box::new(Flaky {
                got: req.clone(),
                fails_at: 2,
                required: true,
            }),
        ]);
        let line = MetricLine {
            step: 1,
            epoch: 0.0,
            loss: 1.0,
            lr: 0.1,
            samples_per_sec: 1.0,
            tokens_per_sec: None,
            eval_loss: None,
            eval_accuracy: None,
            eval_perplexity: None,
            aux_loss: None,
            loss_scale: None,
            skipped: false,
            ts: 0.0,
            time: None,
            step_ms: None,
        };
        for _ in 0..4 {
            t.line(&line);
        }
        // the tracker got its good line and the failing one, then no more
        assert_eq!(opt.load(Ordering::SeqCst), 2);
        assert_eq!(t.len(), 1);
        // the required sink got every line; its first failure (line 2) is the run's error
        assert_eq!(req.load(Ordering::SeqCst), 4);
        let e = t
            .take_error()
            .expect("the required sink's error")
            .to_string();
        assert!(e.contains("writing flaky") && e.contains("line 2"), "{e}");
        assert!(t.take_error().is_none());
    }
}
