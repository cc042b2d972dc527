//! `metrics.jsonl`: one JSON object per logged step, the run's own record of its metrics (what
//! `kiln report`, sweeps and a resume read back). Written by node 0 (other nodes write
//! nowhere), appended to by a resumed session; a failed write fails the run at its end.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::MetricSink;
use crate::error::Result;
use crate::rundir::{open_error, open_no_follow};
use crate::train::MetricLine;

/// `metrics.jsonl` of a run directory, open.
pub struct MetricsJsonl {
    path: PathBuf,
    out: BufWriter<File>,
}

impl MetricsJsonl {
    /// Opens `dir/metrics.jsonl` (never through a symlink): appended to when `resumed`, else
    /// made anew. Not `primary` (a node other than 0): `/dev/null`.
    pub fn open(dir: &Path, primary: bool, resumed: bool) -> Result<MetricsJsonl> {
        let path = if primary {
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
        let file =
            open_no_follow(&mut options, &path).map_err(|e| open_error("opening", &path, e))?;
        Ok(MetricsJsonl {
            path,
            out: BufWriter::new(file),
        })
    }
}

impl MetricSink for MetricsJsonl {
    fn path(&self) -> String {
        self.path.display().to_string()
    }

    fn what(&self) -> &'static str {
        "metrics lines"
    }

    /// One line, flushed (a crash loses at most the line being written).
    fn line(&mut self, line: &MetricLine) -> std::io::Result<()> {
        let s = serde_json::to_string(line).map_err(std::io::Error::other)?;
        writeln!(self.out, "{s}")?;
        self.out.flush()
    }

    fn required(&self) -> bool {
        true
    }
}
