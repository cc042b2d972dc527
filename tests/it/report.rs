//! `kiln report` as a person sees it: the HTML parses, each chart has its series, axis labels and
//! legend, no coordinate is NaN; a sweep gets its ranked table with the best trial marked and the
//! metric against each swept key; bad or partial input is named or reported as it is.

use std::path::{Path, PathBuf};

use crate::common::{kiln, stderr, stdout, write, TINY};

/// The report of `dirs` (written to `out` in `cwd`), its text.
fn report(cwd: &Path, dirs: &[&Path], out: &str) -> String {
    let mut args = vec!["report".to_string()];
    args.extend(dirs.iter().map(|d| d.display().to_string()));
    args.extend(["-o".into(), out.into()]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = kiln(cwd, &refs);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("wrote"), "{}", stdout(&o));
    std::fs::read_to_string(cwd.join(out)).unwrap()
}

/// A chart as a reader sees it.
#[derive(Debug)]
struct Chart {
    /// Lines of 3 or more points (legend samples are 2-point lines).
    lines: usize,
    /// Every text drawn in it.
    texts: Vec<String>,
    /// Circles (points of a scatter).
    circles: usize,
}

/// Parses the page as XML (the report is well-formed) and returns its charts by figure id.
fn charts(html: &str) -> std::collections::BTreeMap<String, Chart> {
    let body = html.trim_start_matches("<!DOCTYPE html>");
    let doc = roxmltree::Document::parse(body).expect("the report parses");
    let mut out = std::collections::BTreeMap::new();
    for fig in doc.descendants().filter(|n| n.has_tag_name("figure")) {
        let lines = fig
            .descendants()
            .filter(|n| n.has_tag_name("polyline"))
            .filter(|n| {
                n.attribute("points")
                    .unwrap_or("")
                    .split_whitespace()
                    .count()
                    >= 3
            })
            .count();
        let texts = fig
            .descendants()
            .filter(|n| n.has_tag_name("text"))
            .filter_map(|n| n.text())
            .map(|t| t.trim().to_string())
            .collect();
        let circles = fig
            .descendants()
            .filter(|n| n.has_tag_name("circle"))
            .count();
        for n in fig.descendants() {
            for a in n.attributes() {
                assert!(
                    !a.value().contains("NaN") && !a.value().contains("inf"),
                    "{} = {}",
                    a.name(),
                    a.value()
                );
            }
        }
        out.insert(
            fig.attribute("id").unwrap().to_string(),
            Chart {
                lines,
                texts,
                circles,
            },
        );
    }
    out
}

fn run(dir: &Path, name: &str, sets: &[&str]) -> PathBuf {
    write(dir, "t.toml", TINY);
    let mut args = vec!["run", "t.toml", "--quiet", "--run-dir", name];
    for s in sets {
        args.extend(["--set", s]);
    }
    let o = kiln(dir, &args);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    dir.join(name)
}

#[test]
fn a_report_of_two_runs_overlays_their_curves_with_labelled_axes_and_a_legend() {
    let d = kiln::testdir::tempdir().unwrap();
    let a = run(
        d.path(),
        "lr-small",
        &["train.eval_every=2", "train.epochs=2"],
    );
    let b = run(
        d.path(),
        "lr-big",
        &[
            "optim.lr=0.5",
            "strategy.kind=\"ddp\"",
            "strategy.devices=2",
            "train.eval_every=2",
            "train.epochs=2",
        ],
    );
    let html = report(d.path(), &[&a, &b], "r.html");
    assert!(!html.contains("<script"), "no scripts");
    assert!(
        !html.contains("http://")
            || html.matches("http://").count()
                == html.matches("xmlns=\"http://www.w3.org/2000/svg\"").count(),
        "nothing from the network"
    );
    let c = charts(&html);
    for axis in ["step", "epoch", "wall"] {
        for key in ["loss", "eval_loss", "lr", "samples_per_sec"] {
            let chart = &c[&format!("{key}-{axis}")];
            assert_eq!(chart.lines, 2, "{key} against {axis}: {chart:?}");
            for t in ["lr-small", "lr-big", key] {
                assert!(
                    chart.texts.iter().any(|x| x == t),
                    "{key}-{axis} lacks `{t}`: {:?}",
                    chart.texts
                );
            }
        }
    }
    assert!(c["loss-step"].texts.iter().any(|t| t == "step"));
    assert!(c["loss-wall"].texts.iter().any(|t| t == "wall time (s)"));
    assert!(c["loss-epoch"].texts.iter().any(|t| t == "epoch"));
    // time breakdown: one bar per rank, a legend of phases; memory per rank
    let t = &c["time-lr-big"];
    for l in ["rank 0", "rank 1", "forward", "backward", "all_reduce"] {
        assert!(
            t.texts.iter().any(|x| x == l),
            "time chart lacks `{l}`: {:?}",
            t.texts
        );
    }
    let m = &c["memory-lr-small"];
    for l in ["rank 0", "params", "grads", "optimizer state", "MB"] {
        assert!(
            m.texts.iter().any(|x| x == l),
            "memory chart lacks `{l}`: {:?}",
            m.texts
        );
    }
    // the measured peaks beside the model state
    assert!(
        html.contains("measured peak per rank (counting allocator): rank 0 ")
            && html.contains("the process's peak RSS"),
        "measured peaks"
    );
    // the default output is in the run directory
    let o = kiln(d.path(), &["report", a.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(a.join("report.html").is_file());
}

#[test]
fn a_sweep_report_ranks_the_trials_marks_the_best_and_plots_each_key() {
    let d = kiln::testdir::tempdir().unwrap();
    write(
        d.path(),
        "s.toml",
        &format!("{TINY}\n[sweep]\ngrid = {{ \"optim.lr\" = [0.05, 1e38, 0.2], \"optim.momentum\" = [0.0] }}\n"),
    );
    let o = kiln(d.path(), &["sweep", "s.toml", "--parallel", "2", "--quiet"]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "one trial diverges: {}",
        stderr(&o)
    );
    let dir = d.path().join("runs/tiny");
    // the report reads the sweep from its directory, even once the experiment file is gone
    std::fs::remove_file(d.path().join("s.toml")).unwrap();
    let html = report(d.path(), &[&dir], "s.html");
    let body = html.trim_start_matches("<!DOCTYPE html>");
    let doc = roxmltree::Document::parse(body).unwrap();
    let rows: Vec<roxmltree::Node> = doc
        .descendants()
        .filter(|n| n.has_tag_name("table") && n.attribute("class") == Some("trials"))
        .flat_map(|t| t.children().filter(|r| r.has_tag_name("tr")).skip(1))
        .collect();
    assert_eq!(rows.len(), 3);
    assert_eq!(
        rows[0].attribute("class"),
        Some("best"),
        "the best trial first and marked"
    );
    let text = |r: &roxmltree::Node| {
        r.descendants()
            .filter_map(|n| n.text())
            .collect::<Vec<_>>()
            .join("|")
    };
    assert!(
        text(&rows[2]).contains("failed") && text(&rows[2]).contains("training diverged"),
        "{}",
        text(&rows[2])
    );
    let c = charts(&html);
    let lr = &c["sweep-optim.lr"];
    assert!(lr.texts.iter().any(|t| t == "optim.lr"), "{:?}", lr.texts);
    assert!(lr.texts.iter().any(|t| t == "best"), "{:?}", lr.texts);
    // two finished trials and the two legend markers
    assert_eq!(lr.circles, 4, "{lr:?}");
    assert!(c.contains_key("sweep-optim.momentum"));
    // the diverged trial logged nothing before it failed: two curves
    assert_eq!(c["loss-step"].lines, 2);
    assert!(
        html.contains("training diverged"),
        "the failure is in the runs table too"
    );
}

#[test]
fn partial_and_bad_input_is_reported_as_it_is_or_refused() {
    let d = kiln::testdir::tempdir().unwrap();
    // not a run, not a sweep
    std::fs::create_dir_all(d.path().join("empty")).unwrap();
    let o = kiln(d.path(), &["report", "empty"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("neither a run directory"),
        "{}",
        stderr(&o)
    );
    assert!(!d.path().join("empty/report.html").exists());
    // a run without eval, whose last metrics line is half-written and whose summary is gone
    let a = run(d.path(), "a", &["data.eval_samples=0"]);
    let metrics = a.join("metrics.jsonl");
    let mut text = std::fs::read(&metrics).unwrap();
    // values a chart cannot place, a byte that is not UTF-8, a half-written last line
    text.extend_from_slice(b"{\"step\": 9, \"epoch\": 1.0, \"loss\": 1e308}\n");
    text.extend_from_slice(b"{\"step\": 10, \"epoch\": 1.0, \"loss\": -1.7e308}\n");
    text.extend_from_slice(b"\xff\xfe\n");
    text.extend_from_slice(b"{\"step\": 11, \"loss\": 0.5, \"ep");
    std::fs::write(&metrics, text).unwrap();
    std::fs::remove_file(a.join("summary.json")).unwrap();
    let html = report(d.path(), &[&a], "a.html");
    assert!(
        html.contains("2 line(s) of metrics.jsonl could not be read"),
        "skipped line noted"
    );
    assert!(
        html.contains("No run has logged <code>eval_loss</code> yet"),
        "no eval noted"
    );
    assert!(html.contains("running (or stopped before it finished)"));
    let c = charts(&html);
    assert_eq!(c["loss-step"].lines, 1);
    // an empty metrics.jsonl: a report of what exists
    std::fs::write(&metrics, "").unwrap();
    let html = report(d.path(), &[&a], "b.html");
    assert!(html.contains("No run has logged <code>loss</code> yet"));
}
