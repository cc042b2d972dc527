//! The results table: one row per trial, best first, as `results.csv`, `results.md` and text.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use super::ledger::{Record, TrialState};
use super::{read_spec, ExecutorKind, Ledger};
use crate::config::{self, Config, MetricMode, SweepConfig};
use crate::error::{Error, Result};

#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub trial: String,
    pub overrides: String,
    pub status: TrialState,
    pub metric: Option<f64>,
    pub best: Option<f64>,
    pub steps: Option<u64>,
    pub wall_seconds: Option<f64>,
    pub samples_per_sec: Option<f64>,
    pub error: Option<String>,
    /// The Slurm array task running it (`<job>_<index>`), for `--executor slurm`.
    pub job: Option<String>,
    /// asha: the rung step a trial on its way is sent to (running, queued or preempted).
    pub to_step: Option<usize>,
}

/// Builds a trial's row from its ledger record and its run directory.
pub fn row(rec: &Record, run_dir: &Path, metric: &str, mode: MetricMode) -> Row {
    let summary = crate::rundir::SummaryFile::read(run_dir);
    let get = |k: &str| summary.as_ref().and_then(|s| s.number(k));
    let metrics = crate::rundir::MetricsFile::read(run_dir);
    // the metric over the run: its own key in metrics.jsonl, or `loss` for final_loss
    let key = if metric == "final_loss" {
        "loss"
    } else {
        metric
    };
    let values = metrics.values(key);
    let best = match mode {
        MetricMode::Min => values.fold(None, |a: Option<f64>, v| Some(a.map_or(v, |a| a.min(v)))),
        MetricMode::Max => values.fold(None, |a: Option<f64>, v| Some(a.map_or(v, |a| a.max(v)))),
    };
    Row {
        trial: rec.trial.clone(),
        overrides: rec
            .overrides
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" "),
        status: rec.state,
        metric: rec.metric.or_else(|| get(metric)),
        best,
        steps: summary.as_ref().and_then(|s| s.steps),
        wall_seconds: get("wall_seconds"),
        samples_per_sec: get("samples_per_sec"),
        error: rec.error.clone(),
        job: rec
            .job
            .as_ref()
            .zip(rec.array_index)
            .map(|(j, i)| format!("{j}_{i}")),
        to_step: rec.rung.filter(|_| {
            matches!(
                rec.state,
                TrialState::Running | TrialState::Queued | TrialState::Preempted
            )
        }),
    }
}

/// Done trials by metric (best first), then the rest in trial order.
pub fn sort(rows: &mut [Row], mode: MetricMode) {
    rows.sort_by(|a, b| {
        let rank = |r: &Row| match (r.status, r.metric) {
            (TrialState::Done, Some(m)) if m.is_finite() => 0,
            (TrialState::Done, _) => 1,
            // asha: the trials that went furthest first
            (TrialState::Paused, _) => 2,
            (TrialState::Running, _) => 3,
            (TrialState::Preempted, _) => 4,
            (TrialState::Queued, _) => 5,
            (TrialState::Pending, _) => 6,
            (TrialState::Failed, _) => 7,
        };
        rank(a)
            .cmp(&rank(b))
            .then_with(|| match a.status {
                TrialState::Paused => b.steps.cmp(&a.steps),
                _ => std::cmp::Ordering::Equal,
            })
            .then_with(|| {
                let (x, y) = (a.metric.unwrap_or(f64::NAN), b.metric.unwrap_or(f64::NAN));
                match mode {
                    MetricMode::Min => x.total_cmp(&y),
                    MetricMode::Max => y.total_cmp(&x),
                }
            })
    });
}

fn num(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.6}")).unwrap_or_default()
}

fn cells(r: &Row) -> Vec<String> {
    let mut status = r.status.word().to_string();
    if let Some(t) = r.to_step {
        status.push_str(&format!(" to {t}"));
    }
    if let Some(j) = r.job.as_ref().filter(|_| r.status != TrialState::Done) {
        status.push_str(&format!(" ({j})"));
    }
    vec![
        r.trial.clone(),
        r.overrides.clone(),
        status,
        num(r.metric),
        num(r.best),
        r.steps.map(|s| s.to_string()).unwrap_or_default(),
        r.wall_seconds
            .map(|v| format!("{v:.2}"))
            .unwrap_or_default(),
        r.samples_per_sec
            .map(|v| format!("{v:.0}"))
            .unwrap_or_default(),
        r.error
            .clone()
            .unwrap_or_default()
            .lines()
            .next()
            .unwrap_or("")
            .to_string(),
    ]
}

fn header(metric: &str) -> Vec<String> {
    [
        "trial",
        "overrides",
        "status",
        metric,
        &format!("best_{metric}"),
        "steps",
        "wall_seconds",
        "samples_per_sec",
        "error",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn csv_cell(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

pub fn to_csv(rows: &[Row], metric: &str) -> String {
    let mut out = header(metric).join(",") + "\n";
    for r in rows {
        out += &(cells(r)
            .iter()
            .map(|c| csv_cell(c))
            .collect::<Vec<_>>()
            .join(",")
            + "\n");
    }
    out
}

pub fn to_markdown(rows: &[Row], metric: &str) -> String {
    let h = header(metric);
    let mut out = format!("| {} |\n|{}\n", h.join(" | "), " --- |".repeat(h.len()));
    for r in rows {
        out += &format!(
            "| {} |\n",
            cells(r)
                .iter()
                .map(|c| c.replace('|', "\\|"))
                .collect::<Vec<_>>()
                .join(" | ")
        );
    }
    out
}

/// An aligned text table for the terminal.
pub fn to_text(rows: &[Row], metric: &str) -> String {
    let mut table = vec![header(metric)];
    table.extend(rows.iter().map(cells));
    let widths: Vec<usize> = (0..table[0].len())
        .map(|i| {
            table
                .iter()
                .map(|r| r[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    table
        .iter()
        .map(|r| {
            r.iter()
                .zip(&widths)
                .map(|(c, w)| format!("{c:<w$}"))
                .collect::<Vec<_>>()
                .join("  ")
                .trim_end()
                .to_string()
                + "\n"
        })
        .collect()
}

/// The rows of every trial the ledger knows, sorted.
pub(super) fn rows(dir: &Path, ledger: &Ledger, s: &SweepConfig) -> Vec<Row> {
    let mut rows: Vec<Row> = ledger
        .latest()
        .values()
        .map(|r| row(r, &dir.join(&r.trial), &s.metric, s.mode))
        .collect();
    sort(&mut rows, s.mode);
    rows
}

pub(super) fn write_results(dir: &Path, rows: &[Row], metric: &str) -> Result<()> {
    for (name, text) in [
        ("results.csv", to_csv(rows, metric)),
        ("results.md", to_markdown(rows, metric)),
    ] {
        let p = dir.join(name);
        crate::rundir::replace_file(&p, text.as_bytes())
            .map_err(|e| Error::io(format!("writing {}", p.display()), e))?;
    }
    Ok(())
}

/// A sweep directory's trials (ranked rows, best first, and each trial's overrides) and its
/// `[sweep]` section, while it runs or afterwards.
pub fn results(dir: &Path) -> Result<(Vec<Row>, BTreeMap<String, Record>, SweepConfig)> {
    let spec = read_spec(dir)?;
    let ledger = Ledger {
        path: dir.join("sweep.jsonl"),
    };
    let latest = ledger.latest();
    // the `[sweep]` section as a trial stored it: the directory reads anywhere, even when the
    // experiment file or its data have moved
    let stored = latest.keys().find_map(|t| {
        let text = fs::read_to_string(dir.join(t).join("config.toml")).ok()?;
        toml::from_str::<Config>(&text).ok().map(|c| c.sweep)
    });
    let sweep = match stored {
        Some(s) => s,
        None => {
            let env: Vec<(String, String)> = std::env::vars().collect();
            config::load(&spec.file, &env, &spec.sets)?.config.sweep
        }
    };
    let rows = rows(dir, &ledger, &sweep);
    Ok((rows, latest, sweep))
}

/// The results table of a sweep directory, while it runs or afterwards.
pub fn status(dir: &Path) -> Result<String> {
    let spec = read_spec(dir)?;
    let env: Vec<(String, String)> = std::env::vars().collect();
    let base = config::load(&spec.file, &env, &spec.sets)?;
    let ledger = Ledger {
        path: dir.join("sweep.jsonl"),
    };
    let s = &base.config.sweep;
    let rows = if spec.executor == ExecutorKind::Slurm {
        // (not while an asha job decides on the ledger)
        let _decide = super::asha_slurm::Decide::take(dir)?;
        for line in super::refresh(dir, &ledger, &s.metric)? {
            crate::ui::note(&format!("warning: state unknown: {line}"));
        }
        // what Slurm said, in results.md/csv too (no local sweep process writes them)
        let rows = rows(dir, &ledger, s);
        write_results(dir, &rows, &s.metric)?;
        rows
    } else {
        rows(dir, &ledger, s)
    };
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for r in &rows {
        *counts.entry(r.status.word()).or_insert(0) += 1;
    }
    let summary: Vec<String> = counts.iter().map(|(k, v)| format!("{v} {k}")).collect();
    Ok(format!(
        "{}\n{} trials: {}\n",
        to_text(&rows, &base.config.sweep.metric),
        rows.len(),
        summary.join(", ")
    ))
}
