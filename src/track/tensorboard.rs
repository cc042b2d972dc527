//! `[log] tensorboard = true`: TensorBoard event files beside `metrics.jsonl`, in the format
//! TensorBoard (and torch's `SummaryWriter`) reads: TFRecord framing (length, masked CRC-32C of
//! the length, the record, masked CRC-32C of the record) around `Event` protobufs (prost).
//!
//! Every number of a `metrics.jsonl` line is a scalar under a stable tag: its key (`loss`,
//! `lr`, `eval_loss`, `samples_per_sec`, ...), and `time/<phase>` for the per-phase times, at
//! the line's step and wall time. Each session of a run writes its own file
//! (`tb/events.out.tfevents.<unix seconds>.<host>`, as TensorBoard names them); a resumed
//! session starts with a `SessionLog` START at its first step, on which TensorBoard drops the
//! earlier session's points from that step on, so a step is never shown twice.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use prost::Message;

use super::MetricSink;
use crate::train::MetricLine;
use crate::ui;

/// `tensorflow.Event` (the fields kiln writes).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Event {
    #[prost(double, tag = "1")]
    pub wall_time: f64,
    #[prost(int64, tag = "2")]
    pub step: i64,
    #[prost(string, optional, tag = "3")]
    pub file_version: Option<String>,
    #[prost(message, optional, tag = "5")]
    pub summary: Option<Summary>,
    /// (6 is the deprecated `log_message`)
    #[prost(message, optional, tag = "7")]
    pub session_log: Option<SessionLog>,
}

/// `tensorflow.Summary`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Summary {
    #[prost(message, repeated, tag = "1")]
    pub value: Vec<SummaryValue>,
}

/// `tensorflow.Summary.Value` with a `simple_value`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SummaryValue {
    #[prost(string, tag = "1")]
    pub tag: String,
    #[prost(float, optional, tag = "2")]
    pub simple_value: Option<f32>,
}

/// `tensorflow.SessionLog`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SessionLog {
    /// 1: START.
    #[prost(int32, tag = "1")]
    pub status: i32,
}

/// TFRecord's masked CRC-32C.
fn masked_crc(bytes: &[u8]) -> u32 {
    let crc = crc32c::crc32c(bytes);
    (crc.rotate_right(15)).wrapping_add(0xa282_ead8)
}

/// One TFRecord: length, its masked CRC, the record, its masked CRC.
pub fn frame(record: &[u8]) -> Vec<u8> {
    let len = (record.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(record.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(record);
    out.extend_from_slice(&masked_crc(record).to_le_bytes());
    out
}

/// The scalars of a `metrics.jsonl` line: (tag, value), numbers and `true` flags, nested
/// objects as `parent/child`; the step and the time stamp are the event's own.
pub fn scalars(line: &serde_json::Value) -> Vec<(String, f64)> {
    fn walk(prefix: &str, v: &serde_json::Value, out: &mut Vec<(String, f64)>) {
        match v {
            serde_json::Value::Number(n) => {
                if let Some(x) = n.as_f64() {
                    out.push((prefix.to_string(), x));
                }
            }
            serde_json::Value::Bool(b) => out.push((prefix.to_string(), f64::from(u8::from(*b)))),
            serde_json::Value::Object(m) => {
                for (k, x) in m {
                    let tag = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}/{k}")
                    };
                    walk(&tag, x, out);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    if let serde_json::Value::Object(m) = line {
        for (k, v) in m {
            if k != "step" && k != "ts" {
                walk(k, v, &mut out);
            }
        }
    }
    out
}

/// An event file being written for one session of a run.
pub struct EventWriter {
    path: PathBuf,
    out: BufWriter<File>,
}

impl EventWriter {
    /// A new event file in `run_dir/tb/` (never through a link: the file is made new), opened
    /// with TensorBoard's version record; `resumed_at` is the first step of a resumed session.
    pub fn create(run_dir: &Path, host: &str, resumed_at: Option<usize>) -> std::io::Result<Self> {
        let dir = run_dir.join("tb");
        std::fs::create_dir_all(&dir)?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        // a host name that is not a plain file name part is left out
        let host: String = host
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '.')
            .collect();
        let mut n = 0;
        let (path, file) = loop {
            let name = if n == 0 {
                format!("events.out.tfevents.{}.{host}", now.as_secs())
            } else {
                format!("events.out.tfevents.{}.{host}.{n}", now.as_secs())
            };
            let path = dir.join(name);
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(f) => break (path, f),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 100 => n += 1,
                Err(e) => return Err(e),
            }
        };
        let mut w = EventWriter {
            path,
            out: BufWriter::new(file),
        };
        let wall = now.as_secs_f64();
        w.write(&Event {
            wall_time: wall,
            step: 0,
            file_version: Some("brain.Event:2".into()),
            ..Default::default()
        })?;
        if let Some(step) = resumed_at {
            w.write(&Event {
                wall_time: wall,
                step: step as i64,
                session_log: Some(SessionLog { status: 1 }),
                ..Default::default()
            })?;
        }
        w.out.flush()?;
        Ok(w)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write(&mut self, e: &Event) -> std::io::Result<()> {
        self.out.write_all(&frame(&e.encode_to_vec()))
    }

    /// The scalars of one `metrics.jsonl` line, as one event at its step and time.
    pub fn json_line(&mut self, line: &serde_json::Value) -> std::io::Result<()> {
        let step = line["step"].as_i64().unwrap_or(0);
        let wall_time = line["ts"].as_f64().unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0)
        });
        let value = scalars(line)
            .into_iter()
            .map(|(tag, v)| SummaryValue {
                tag,
                simple_value: Some(v as f32),
            })
            .collect();
        self.write(&Event {
            wall_time,
            step,
            summary: Some(Summary { value }),
            ..Default::default()
        })?;
        // a line at a time: a killed run loses at most the line being written
        self.out.flush()
    }
}

impl MetricSink for EventWriter {
    fn path(&self) -> String {
        self.path.display().to_string()
    }

    fn what(&self) -> &'static str {
        "TensorBoard events"
    }

    fn line(&mut self, line: &MetricLine) -> std::io::Result<()> {
        let json = serde_json::to_value(line).map_err(std::io::Error::other)?;
        self.json_line(&json)
    }
}

/// This session's TensorBoard event file (`[log] tensorboard`); one that cannot be made is
/// said, and the run goes on (`metrics.jsonl` has every line).
pub fn open(run_dir: &Path, from_step: Option<usize>) -> Option<EventWriter> {
    match EventWriter::create(
        run_dir,
        &crate::rundir::record::hostname(),
        from_step.map(|s| s + 1),
    ) {
        Ok(w) => Some(w),
        Err(e) => {
            ui::note(&format!(
                "warning: cannot write TensorBoard events in {}/tb: {e}; metrics.jsonl has every line",
                run_dir.display()
            ));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frame's layout (TensorBoard's own reader checks the CRCs: `tests/it/tools.rs`), and
    /// CRC-32C's check value (`123456789` -> 0xe3069283, RFC 3720).
    #[test]
    fn frames_are_length_crc_record_crc() {
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        let f = frame(b"abc");
        assert_eq!(&f[..8], &3u64.to_le_bytes());
        assert_eq!(&f[12..15], b"abc");
        assert_eq!(f.len(), 8 + 4 + 3 + 4);
        assert_eq!(
            u32::from_le_bytes(f[15..].try_into().unwrap()),
            masked_crc(b"abc")
        );
    }

    #[test]
    fn every_number_of_a_line_is_a_scalar_under_its_key() {
        let line = serde_json::json!({
            "step": 3, "epoch": 0.5, "loss": 1.25, "lr": 0.01, "samples_per_sec": 10.0,
            "skipped": true, "ts": 1.0e9, "time": {"forward": 0.1, "backward": 0.2}
        });
        let mut got = scalars(&line);
        got.sort_by(|a, b| a.0.cmp(&b.0));
        let tags: Vec<&str> = got.iter().map(|(t, _)| t.as_str()).collect();
        assert_eq!(
            tags,
            [
                "epoch",
                "loss",
                "lr",
                "samples_per_sec",
                "skipped",
                "time/backward",
                "time/forward"
            ]
        );
    }
}
