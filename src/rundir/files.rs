//! A run directory's files read back, typed: `summary.json` and `metrics.jsonl` (by a resume,
//! `kiln report`, sweeps and `kiln submit`).

use std::fs;
use std::path::Path;

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
        Self::parse(&bytes)
    }

    fn parse(bytes: &[u8]) -> MetricsFile {
        let mut out = MetricsFile::default();
        for l in String::from_utf8_lossy(bytes)
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

    /// The complete lines after byte `offset` (a line still being written waits), and the
    /// offset after them: a file that grows, read once.
    pub fn read_from(run_dir: &Path, offset: u64) -> std::io::Result<(MetricsFile, u64)> {
        use std::io::{Read, Seek, SeekFrom};
        let mut f = match fs::File::open(run_dir.join("metrics.jsonl")) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok((MetricsFile::default(), offset))
            }
            Err(e) => return Err(e),
        };
        f.seek(SeekFrom::Start(offset))?;
        let mut bytes = Vec::new();
        f.read_to_end(&mut bytes)?;
        let complete = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        Ok((Self::parse(&bytes[..complete]), offset + complete as u64))
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
