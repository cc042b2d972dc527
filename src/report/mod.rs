//! Layer: report (above sweep; below cli).
//!
//! `kiln report`: one self-contained HTML file (inline SVG drawn with `plotters`, CSS only, no
//! scripts or fonts from the network) for runs or a sweep: loss and eval curves of several runs
//! overlaid (x axis: step, epoch or wall time), learning rate, throughput, the time breakdown per
//! rank and memory per rank; for a sweep also the ranked results, the metric against each swept
//! key and the best trial. A run still going shows what it has logged so far.

mod charts;
mod page;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{Error, Result};
use crate::sweep::{Record, Row};

/// What a run directory holds for a report.
#[derive(Debug, Clone)]
pub struct RunData {
    pub name: String,
    pub dir: PathBuf,
    /// The parsed lines of `metrics.jsonl`, in order.
    pub lines: Vec<Value>,
    /// Lines that did not parse (a line cut short by a crash, or being written).
    pub skipped: usize,
    /// `summary.json`, once the run has ended.
    pub summary: Option<Value>,
}

/// A sweep directory's trials.
#[derive(Debug, Clone)]
pub struct SweepData {
    pub dir: PathBuf,
    pub rows: Vec<Row>,
    pub records: BTreeMap<String, Record>,
    pub metric: String,
    pub maximize: bool,
    pub runs: Vec<RunData>,
}

/// What a report shows.
#[derive(Debug, Clone)]
pub enum Input {
    Runs(Vec<RunData>),
    Sweep(SweepData),
}

fn is_run(dir: &Path) -> bool {
    dir.join("config.toml").is_file()
}

fn is_sweep(dir: &Path) -> bool {
    dir.join("sweep.json").is_file()
}

/// Reads a run directory: every `metrics.jsonl` line that parses (the others are counted) and
/// `summary.json` if it is there and parses.
pub fn load_run(dir: &Path, name: &str) -> RunData {
    let crate::rundir::MetricsFile { lines, skipped } = crate::rundir::MetricsFile::read(dir);
    let summary = crate::rundir::SummaryFile::read(dir).map(|s| s.json);
    RunData {
        name: name.to_string(),
        dir: dir.to_path_buf(),
        lines,
        skipped,
        summary,
    }
}

fn dir_name(dir: &Path) -> String {
    dir.canonicalize()
        .unwrap_or_else(|_| dir.to_path_buf())
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_else(|| dir.display().to_string())
}

/// What `dirs` are: run directories, or one sweep directory.
pub fn load(dirs: &[PathBuf]) -> Result<Input> {
    if dirs.is_empty() {
        return Err(Error::Usage(
            "give at least one run directory, or a sweep directory".into(),
        ));
    }
    for d in dirs {
        if !is_run(d) && !is_sweep(d) {
            return Err(Error::Usage(format!(
                "`{}` is neither a run directory (no config.toml) nor a sweep directory (no sweep.json)\n  = help: pass the directory `kiln run` or `kiln sweep` printed",
                d.display()
            )));
        }
    }
    if let Some(sweep) = dirs.iter().find(|d| is_sweep(d)) {
        if dirs.len() > 1 {
            return Err(Error::Usage(format!(
                "`{}` is a sweep directory: report it alone (its trials are in it)",
                sweep.display()
            )));
        }
        let (rows, records, cfg) = crate::sweep::results(sweep)?;
        let runs = rows
            .iter()
            .filter(|r| is_run(&sweep.join(&r.trial)))
            .map(|r| load_run(&sweep.join(&r.trial), &r.trial))
            .collect();
        return Ok(Input::Sweep(SweepData {
            dir: sweep.clone(),
            rows,
            records,
            metric: cfg.metric.clone(),
            maximize: cfg.mode == crate::config::MetricMode::Max,
            runs,
        }));
    }
    // the same directory name twice (runs/a and other/a) keeps the path
    let mut names: Vec<String> = dirs.iter().map(|d| dir_name(d)).collect();
    for i in 0..names.len() {
        if names.iter().filter(|n| **n == names[i]).count() > 1 {
            names[i] = dirs[i].display().to_string();
        }
    }
    Ok(Input::Runs(
        dirs.iter()
            .zip(names)
            .map(|(d, n)| load_run(d, &n))
            .collect(),
    ))
}

/// The report's HTML.
pub fn render(input: &Input) -> Result<String> {
    page::render(input).map_err(Error::Invalid)
}

/// Where the report goes by default: in the run or sweep directory when there is one, else
/// `report.html` here.
pub fn default_output(dirs: &[PathBuf]) -> PathBuf {
    match dirs {
        [one] => one.join("report.html"),
        _ => PathBuf::from("report.html"),
    }
}
