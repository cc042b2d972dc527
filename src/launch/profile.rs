//! What a run says about where its time went: the `time` section of `summary.json`, the
//! breakdown line at the end, and the Chrome traces of `[profile]` (`trace/rank-<r>.json` per
//! rank, `trace/all.json` merging every rank of every node).

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::workers::RunResult;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::rundir::write_json;
use crate::train::timing::{comm_seconds, trace_json};
use crate::train::Totals;

/// The mean of this node's ranks' phase totals.
pub fn mean_time(res: &RunResult) -> Totals {
    let all: Vec<Totals> = res.time.iter().map(|t| t.main).collect();
    Totals::mean(&all)
}

/// `{"total_s", "exposed_s"}`: communication seconds wherever they ran, and the part the
/// compute spent in them or waiting for them.
fn comm_json(main: &Totals, comm: &Totals) -> Value {
    let (total, exposed) = comm_seconds(main, comm);
    json!({"total_s": (total * 1e4).round() / 1e4, "exposed_s": (exposed * 1e4).round() / 1e4})
}

/// `summary.json`'s `time`: seconds and fractions per rank and as a mean, and the step time.
pub fn time_section(res: &RunResult, steps: usize, asynchronous: bool) -> Value {
    let mean = mean_time(res);
    let ranks: Vec<Value> = res
        .time
        .iter()
        .map(|t| {
            json!({"rank": t.rank, "seconds": t.main.seconds_json(),
                   "fractions": t.main.fractions_json(), "comm": comm_json(&t.main, &t.comm)})
        })
        .collect();
    let comm_mean = Totals::mean(&res.time.iter().map(|t| t.comm).collect::<Vec<_>>());
    let step_ms = mean.step_ms(steps);
    json!({
        "wall_s": (res.outcome.wall_seconds * 1e3).round() / 1e3,
        "step_ms": (step_ms * 100.0).round() / 100.0,
        "clock": if asynchronous { "device synchronised at phase boundaries" } else { "host" },
        "mean": {"seconds": mean.seconds_json(), "fractions": mean.fractions_json(),
                 "comm": comm_json(&mean, &comm_mean)},
        "ranks": ranks,
    })
}

/// `step 41 ms: data 2%, forward 30%, backward 45%, all_reduce 18%, optimizer 5%`, and when
/// communication ran beside the compute, how much of it the compute waited for:
/// `; communication 12.0 ms per step, 1.5 ms exposed`.
pub fn breakdown_line(res: &RunResult, steps: usize) -> String {
    let mean = mean_time(res);
    // the training step alone: evaluation and checkpoints are phases of their own
    let step_ms = mean.step_ms(steps);
    let comm_mean = Totals::mean(&res.time.iter().map(|t| t.comm).collect::<Vec<_>>());
    let mut line = format!("step {step_ms:.1} ms: {}", mean.describe());
    // only when communication ran beside the compute
    if comm_mean.fractions().iter().any(|(p, _)| p.is_comm()) {
        let (total, exposed) = comm_seconds(&mean, &comm_mean);
        let per = |s: f64| s * 1e3 / steps.max(1) as f64;
        line.push_str(&format!(
            "; communication {:.1} ms per step, {:.1} ms exposed",
            per(total),
            per(exposed)
        ));
    }
    line
}

fn label(rank: usize, node: usize) -> String {
    format!("rank {rank} (node {node})")
}

/// Writes this node's traced ranks to `trace/rank-<r>.json`; node 0 then waits (up to
/// `launch.rendezvous_timeout_secs`) for every traced rank's file and merges them into
/// `trace/all.json`. Returns the merged file's path on node 0.
pub fn write_traces(
    c: &Config,
    run_dir: &Path,
    res: &RunResult,
    node: usize,
) -> Result<Option<std::path::PathBuf>> {
    if !c.profile.enabled {
        return Ok(None);
    }
    let dir = run_dir.join("trace");
    std::fs::create_dir_all(&dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    for t in &res.time {
        let rank = &t.rank;
        if c.profile.traces(*rank) {
            let trace = trace_json(&[(*rank, label(*rank, node), t.spans.clone())]);
            write_json(&dir.join(format!("rank-{rank}.json")), &trace)?;
        }
    }
    if node != 0 {
        return Ok(None);
    }
    let world = crate::config::Mesh::of(c).world;
    let wanted: Vec<usize> = (0..world).filter(|r| c.profile.traces(*r)).collect();
    let deadline = Instant::now() + Duration::from_secs(c.launch.rendezvous_timeout_secs);
    let mut merged = Vec::new();
    for rank in wanted {
        let path = dir.join(format!("rank-{rank}.json"));
        let trace = loop {
            match std::fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            {
                Some(v) => break Some(v),
                None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
                None => break None,
            }
        };
        match trace {
            Some(v) => merged.extend(v["traceEvents"].as_array().cloned().unwrap_or_default()),
            None => crate::ui::note(&format!(
                "warning: {} never appeared; trace/all.json leaves rank {rank} out",
                path.display()
            )),
        }
    }
    let all = dir.join("all.json");
    write_json(
        &all,
        &json!({"traceEvents": merged, "displayTimeUnit": "ms"}),
    )?;
    Ok(Some(all))
}

/// Peak dense FLOP/s per GPU: (name fragment, bf16/f16 tensor cores, f32 without TF32), from
/// NVIDIA's data sheets; the longest fragment the device name contains wins (`peak_for`), so a
/// PCIe part takes its own entry whatever the order here.
const PEAKS: [(&str, f64, f64); 5] = [
    ("H200", 989e12, 67e12),
    ("H100 PCIe", 756e12, 51e12),
    ("H100", 989e12, 67e12),
    ("A100", 312e12, 19.5e12),
    ("A100 PCIe", 312e12, 19.5e12),
];

/// The entry of `PEAKS` for a device named `name`: the longest fragment it contains (the
/// exact part, `A100 PCIe`, before its chip, `A100`).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn peak_for(name: &str) -> Option<(&'static str, f64, f64)> {
    PEAKS
        .iter()
        .filter(|p| name.contains(p.0))
        .max_by_key(|p| p.0.len())
        .copied()
}

/// Model FLOP utilisation: achieved FLOP/s over the peak of the `world` GPUs that ran (named by
/// GPU `ordinal`, rank 0's), or why there is none. `backend` is the resolved backend's name
/// (`cuda`, `flex`, ...); the peak is the one of its compute dtype `precision`.
pub fn mfu(
    backend: &str,
    precision: crate::config::Precision,
    flops_per_sec: f64,
    world: usize,
    ordinal: usize,
) -> (Option<f64>, Option<String>) {
    if !backend.starts_with("cuda") {
        return (
            None,
            Some("MFU is reported for GPUs only (there is no peak table for CPUs)".into()),
        );
    }
    #[cfg(feature = "cuda")]
    {
        let Some(name) = crate::cuda::gpu_name(ordinal) else {
            return (
                None,
                Some(format!("the name of GPU {ordinal} could not be read")),
            );
        };
        let Some((_, half, single)) = peak_for(&name) else {
            return (
                None,
                Some(format!(
                    "no peak FLOP/s is known for `{name}` (known: A100, H100, H200)"
                )),
            );
        };
        let peak = match precision {
            crate::config::Precision::F32 => single,
            _ => half,
        };
        let m = flops_per_sec / (peak * world.max(1) as f64);
        (Some((m * 1e4).round() / 1e4), None)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (flops_per_sec, world, ordinal, PEAKS, precision);
        (None, Some("this kiln was built without CUDA".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 31: every entry of the peak table can be chosen, the exact part before its chip.
    #[test]
    fn each_gpu_takes_its_own_peak_entry() {
        for (name, want) in [
            ("NVIDIA A100-SXM4-80GB", "A100"),
            ("NVIDIA A100 PCIe 40GB", "A100 PCIe"),
            ("NVIDIA H100 PCIe", "H100 PCIe"),
            ("NVIDIA H100 80GB HBM3", "H100"),
            ("NVIDIA H200", "H200"),
        ] {
            assert_eq!(peak_for(name).map(|p| p.0), Some(want), "{name}");
        }
        assert_eq!(peak_for("NVIDIA GeForce RTX 4090"), None);
        // every entry is reachable
        for p in PEAKS {
            assert_eq!(peak_for(&format!("NVIDIA {}", p.0)).map(|q| q.0), Some(p.0));
        }
    }
}
