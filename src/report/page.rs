//! The report page: sections of charts and tables in one HTML file. The x axis of the curves is
//! switched with radio buttons and CSS alone (each curve is drawn once per axis).

use std::collections::BTreeSet;
use std::fmt::Write as _;

use serde_json::Value;

use super::charts;
use super::{Input, RunData, SweepData};
use crate::sweep::TrialState;

/// A parameter plot: its points (value, metric, whether the trial finished), the category
/// names of a non-numeric axis, and the axis description.
type Plotted = (Vec<(f64, f64, bool)>, Option<Vec<String>>, String);

/// `&`, `<`, `>`, `"` and `'` escaped.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

/// The x axes a curve can be drawn against.
const AXES: [(&str, &str); 3] = [
    ("step", "step"),
    ("epoch", "epoch"),
    ("wall", "wall time (s)"),
];

/// The x value of a metrics line on `axis` (`wall`: seconds since the run's first line).
fn x_of(line: &Value, axis: &str, t0: f64) -> Option<f64> {
    match axis {
        "wall" => line["ts"].as_f64().map(|t| t - t0),
        other => line[other].as_f64(),
    }
}

/// One series per run of `key` against `axis`.
fn series(runs: &[RunData], key: &str, axis: &str) -> Vec<(String, Vec<(f64, f64)>)> {
    runs.iter()
        .filter_map(|r| {
            let t0 = r.lines.iter().find_map(|l| l["ts"].as_f64()).unwrap_or(0.0);
            let pts: Vec<(f64, f64)> = r
                .lines
                .iter()
                .filter_map(|l| Some((x_of(l, axis, t0)?, l[key].as_f64()?)))
                .collect();
            (!pts.is_empty()).then(|| (r.name.clone(), pts))
        })
        .collect()
}

/// A stacked bar chart of run `name`, as the page's figure `<kind>-<name>`.
fn stacked_figure(
    out: &mut String,
    kind: &str,
    name: &str,
    title: &str,
    unit: &str,
    parts: &[(String, usize)],
    bars: &[(String, Vec<f64>)],
) -> Result<(), String> {
    let svg = charts::stacked(title, unit, parts, bars)?;
    figure(
        out,
        &format!("{kind}-{}", esc(name)),
        kind,
        parts.len(),
        &svg,
    );
    Ok(())
}

/// A figure: the chart's SVG with what a reader (and a test) needs to know about it.
fn figure(out: &mut String, id: &str, class: &str, series: usize, svg: &str) {
    let _ = writeln!(
        out,
        "<figure id=\"{id}\" class=\"chart {class}\" data-series=\"{series}\">{svg}</figure>"
    );
}

/// Curves of `key` (titled `title`) for every x axis; a note when no run logged it.
fn curves(out: &mut String, runs: &[RunData], key: &str, title: &str) -> Result<(), String> {
    let _ = writeln!(out, "<h3>{}</h3>", esc(title));
    if series(runs, key, "step").is_empty() {
        let _ = writeln!(
            out,
            "<p class=\"note\">No run has logged <code>{}</code> yet.</p>",
            esc(key)
        );
        return Ok(());
    }
    for (axis, desc) in AXES {
        let s = series(runs, key, axis);
        if s.is_empty() {
            let _ = writeln!(
                out,
                "<p class=\"note x-{axis}\">No <code>{}</code> to plot against {desc} (older runs log no <code>ts</code>).</p>",
                esc(key),
            );
            continue;
        }
        let svg = charts::lines(title, desc, key, &s)?;
        figure(
            out,
            &format!("{key}-{axis}"),
            &format!("x-{axis}"),
            s.len(),
            &svg,
        );
    }
    Ok(())
}

fn status_of(r: &RunData) -> String {
    match &r.summary {
        Some(s) => s["status"].as_str().unwrap_or("?").to_string(),
        None => "running (or stopped before it finished)".into(),
    }
}

/// The run list: status, steps, last loss, and what could not be read.
fn run_table(out: &mut String, runs: &[RunData]) {
    out.push_str("<table class=\"runs\"><tr><th>run</th><th>status</th><th>logged steps</th><th>last loss</th><th>eval loss</th><th>samples/s</th><th>directory</th></tr>\n");
    for r in runs {
        let last = r.lines.last();
        let cell = |v: Option<f64>| v.map(|v| format!("{v:.4}")).unwrap_or_else(|| "-".into());
        let eval = r.lines.iter().rev().find_map(|l| l["eval_loss"].as_f64());
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td></tr>",
            esc(&r.name),
            esc(&status_of(r)),
            last.and_then(|l| l["step"].as_u64()).map(|s| s.to_string()).unwrap_or_else(|| "-".into()),
            cell(last.and_then(|l| l["loss"].as_f64())),
            cell(eval),
            cell(r.summary.as_ref().and_then(|s| s["samples_per_sec"].as_f64())),
            esc(&r.dir.display().to_string()),
        );
    }
    out.push_str("</table>\n");
    for r in runs.iter().filter(|r| r.skipped > 0) {
        let _ = writeln!(
            out,
            "<p class=\"note\">{}: {} line(s) of metrics.jsonl could not be read (cut short, or being written) and are left out.</p>",
            esc(&r.name),
            r.skipped
        );
    }
    if let Some(r) = runs.iter().find(|r| {
        r.summary
            .as_ref()
            .and_then(|s| s["error"].as_str())
            .is_some()
    }) {
        let _ = writeln!(
            out,
            "<p class=\"note\">{} failed: {}</p>",
            esc(&r.name),
            esc(r
                .summary
                .as_ref()
                .and_then(|s| s["error"].as_str())
                .unwrap_or(""))
        );
    }
}

/// Time breakdown and memory per rank, for each run that has a summary.
fn per_rank(out: &mut String, runs: &[RunData]) -> Result<(), String> {
    out.push_str("<h2>Where the time goes</h2>\n");
    let mut any = false;
    for r in runs {
        let Some(ranks) = r
            .summary
            .as_ref()
            .and_then(|s| s["time"]["ranks"].as_array())
        else {
            continue;
        };
        let present: BTreeSet<String> = ranks
            .iter()
            .filter_map(|t| t["fractions"].as_object())
            .flat_map(|m| m.keys().cloned())
            .collect();
        // kiln's phase order and one colour per phase, in every chart
        let order: Vec<&str> = crate::train::timing::PHASES
            .iter()
            .map(|p| p.name())
            .collect();
        let mut parts: Vec<(String, usize)> = present
            .iter()
            .map(|p| {
                let i = order.iter().position(|o| o == p).unwrap_or(order.len());
                (p.clone(), i)
            })
            .collect();
        parts.sort_by_key(|p| p.1);
        let bars: Vec<(String, Vec<f64>)> = ranks
            .iter()
            .map(|t| {
                let label = format!("rank {}", t["rank"].as_u64().unwrap_or(0));
                let vals = parts
                    .iter()
                    .map(|p| t["fractions"][&p.0].as_f64().unwrap_or(0.0))
                    .collect();
                (label, vals)
            })
            .collect();
        let title = format!("time by phase per rank: {}", r.name);
        stacked_figure(
            out,
            "time",
            &r.name,
            &title,
            "fraction of the time",
            &parts,
            &bars,
        )?;
        any = true;
    }
    if !any {
        out.push_str("<p class=\"note\">No finished run with a time breakdown yet.</p>\n");
    }
    out.push_str("<h2>Memory per rank</h2>\n");
    let mut any = false;
    for r in runs {
        let Some(mem) = r.summary.as_ref().and_then(|s| s["memory"].as_array()) else {
            continue;
        };
        if mem.is_empty() {
            continue;
        }
        let parts: Vec<(String, usize)> = ["params", "grads", "optimizer state"]
            .iter()
            .enumerate()
            .map(|(i, s)| (s.to_string(), i))
            .collect();
        let bars: Vec<(String, Vec<f64>)> = mem
            .iter()
            .map(|m| {
                let mb = |k: &str| m[k].as_f64().unwrap_or(0.0) / 1e6;
                (
                    format!("rank {}", m["rank"].as_u64().unwrap_or(0)),
                    vec![mb("params_bytes"), mb("grads_bytes"), mb("optim_bytes")],
                )
            })
            .collect();
        let title = format!("memory at rest per rank: {}", r.name);
        stacked_figure(out, "memory", &r.name, &title, "MB", &parts, &bars)?;
        // what was measured, beside the model state the chart shows
        let peaks: Vec<String> = mem
            .iter()
            .filter_map(|m| {
                let peak = m["peak_bytes"].as_f64()?;
                Some(format!(
                    "rank {} {:.1} MB",
                    m["rank"].as_u64().unwrap_or(0),
                    peak / 1e6
                ))
            })
            .collect();
        let rss = r
            .summary
            .as_ref()
            .and_then(|s| s["peak_rss_bytes"].as_f64())
            .map(|b| format!("; the process's peak RSS {:.1} MB", b / 1e6))
            .unwrap_or_default();
        if !peaks.is_empty() {
            out.push_str(&format!(
                "<p class=\"note\">measured peak per rank (counting allocator): {}{rss}</p>\n",
                peaks.join(", ")
            ));
        }
        any = true;
    }
    if !any {
        out.push_str("<p class=\"note\">No finished run with memory figures yet.</p>\n");
    }
    Ok(())
}

fn cell(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.4}")).unwrap_or_else(|| "-".into())
}

/// The ranked results and the metric against each swept key.
fn sweep_section(out: &mut String, s: &SweepData) -> Result<(), String> {
    let best = s
        .rows
        .iter()
        .find(|r| r.status == TrialState::Done && r.metric.is_some_and(f64::is_finite))
        .map(|r| r.trial.clone());
    let _ = write!(
        out,
        "<h2>Trials, best first by <code>{}</code> ({})</h2>\n<table class=\"trials\"><tr><th>#</th><th>trial</th><th>overrides</th><th>status</th><th>{}</th><th>best</th><th>steps</th><th>wall s</th><th>samples/s</th><th>error</th></tr>\n",
        esc(&s.metric),
        if s.maximize { "max" } else { "min" },
        esc(&s.metric),
    );
    for (i, r) in s.rows.iter().enumerate() {
        let class = if Some(&r.trial) == best.as_ref() {
            " class=\"best\""
        } else {
            ""
        };
        let status = crate::config::choice_name(&r.status);
        let _ = writeln!(
            out,
            "<tr{class}><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            i + 1,
            esc(&r.trial),
            esc(&r.overrides),
            esc(&status),
            cell(r.metric),
            cell(r.best),
            r.steps.map(|v| v.to_string()).unwrap_or_else(|| "-".into()),
            cell(r.wall_seconds),
            cell(r.samples_per_sec),
            esc(r.error.as_deref().unwrap_or("")),
        );
    }
    out.push_str("</table>\n");
    // metric against each swept key
    let keys: BTreeSet<String> = s
        .records
        .values()
        .flat_map(|r| r.overrides.keys().cloned())
        .collect();
    for key in keys {
        let mut values: Vec<(String, f64, bool)> = Vec::new();
        for r in &s.rows {
            let (Some(rec), Some(m)) = (s.records.get(&r.trial), r.metric) else {
                continue;
            };
            if let Some(v) = rec.overrides.get(&key) {
                values.push((v.clone(), m, Some(&r.trial) == best.as_ref()));
            }
        }
        if values.is_empty() {
            continue;
        }
        let numeric: Option<Vec<f64>> = values
            .iter()
            .map(|v| v.0.trim_matches('"').parse::<f64>().ok())
            .collect();
        let (points, cats, desc): Plotted = match numeric {
            Some(xs) => {
                // a key spanning decades (a learning rate) is plotted on log10
                let positive = xs.iter().all(|x| *x > 0.0);
                let (lo, hi) = xs
                    .iter()
                    .fold((f64::INFINITY, 0.0f64), |(a, b), x| (a.min(*x), b.max(*x)));
                let log = positive && hi / lo >= 100.0;
                let pts = xs
                    .iter()
                    .zip(&values)
                    .map(|(x, v)| (if log { x.log10() } else { *x }, v.1, v.2))
                    .collect();
                let desc = if log {
                    format!("log10({key})")
                } else {
                    key.clone()
                };
                (pts, None, desc)
            }
            None => {
                let cats: Vec<String> = values
                    .iter()
                    .map(|v| v.0.clone())
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect();
                let pts = values
                    .iter()
                    .map(|v| {
                        let i = cats.iter().position(|c| *c == v.0).unwrap_or(0);
                        (i as f64, v.1, v.2)
                    })
                    .collect();
                (pts, Some(cats), key.clone())
            }
        };
        let title = format!("{} against {key}", s.metric);
        let svg = charts::scatter(&title, &desc, &s.metric, &points, cats.as_deref())?;
        figure(out, &format!("sweep-{}", esc(&key)), "sweep", 2, &svg);
    }
    Ok(())
}

const STYLE: &str = "body{font-family:sans-serif;margin:24px;color:#222;max-width:1600px}\
figure{display:inline-block;margin:6px;border:1px solid #ddd}\
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left}\
tr.best{background:#fde2e2;font-weight:bold}.note{color:#8a5a00}\
.axis label{margin-right:14px}\
.x-epoch,.x-wall{display:none}\
#x-epoch:checked~.curves .x-epoch,#x-wall:checked~.curves .x-wall{display:inline-block}\
#x-epoch:checked~.curves .x-step,#x-wall:checked~.curves .x-step{display:none}";

/// The whole page.
pub fn render(input: &Input) -> Result<String, String> {
    let (title, runs, sweep): (String, &[RunData], Option<&SweepData>) = match input {
        Input::Runs(r) => (
            format!(
                "kiln report: {}",
                r.iter()
                    .map(|r| r.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            r,
            None,
        ),
        Input::Sweep(s) => (
            format!("kiln report: sweep {}", s.dir.display()),
            &s.runs,
            Some(s),
        ),
    };
    let mut out = String::new();
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"/><title>{}</title><style>{STYLE}</style></head><body>\n<h1>{}</h1>\n",
        esc(&title),
        esc(&title)
    );
    if let Some(s) = sweep {
        sweep_section(&mut out, s)?;
    }
    out.push_str("<h2>Runs</h2>\n");
    run_table(&mut out, runs);
    out.push_str("<h2>Curves</h2>\n<input type=\"radio\" name=\"x\" id=\"x-step\" checked=\"checked\"/><label for=\"x-step\">x: step</label> <input type=\"radio\" name=\"x\" id=\"x-epoch\"/><label for=\"x-epoch\">epoch</label> <input type=\"radio\" name=\"x\" id=\"x-wall\"/><label for=\"x-wall\">wall time</label>\n<div class=\"curves\">\n");
    let eval_metric = if runs
        .iter()
        .any(|r| r.lines.iter().any(|l| l["eval_perplexity"].is_number()))
    {
        ("eval_perplexity", "eval perplexity")
    } else {
        ("eval_accuracy", "eval accuracy")
    };
    let throughput = if runs
        .iter()
        .any(|r| r.lines.iter().any(|l| l["tokens_per_sec"].is_number()))
    {
        ("tokens_per_sec", "throughput (tokens/s)")
    } else {
        ("samples_per_sec", "throughput (samples/s)")
    };
    for (key, t) in [
        ("loss", "training loss"),
        ("eval_loss", "eval loss"),
        eval_metric,
        ("lr", "learning rate"),
        throughput,
    ] {
        curves(&mut out, runs, key, t)?;
    }
    out.push_str("</div>\n");
    per_rank(&mut out, runs)?;
    let _ = write!(
        out,
        "<p class=\"note\">Written by kiln {}. Self-contained: no scripts, no fonts or files from the network.</p>\n</body></html>\n",
        env!("CARGO_PKG_VERSION")
    );
    Ok(out)
}
