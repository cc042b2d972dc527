//! Where the time goes: every run's summary splits each rank's time by phase (fractions summing
//! to 1, also on each logged metrics line); `[profile]` writes Chrome trace-event files, one
//! track per rank, whose collective spans carry op numbers that match across ranks.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::common::{kiln, metric_lines, stderr, stdout, summary, write, TINY};

#[test]
fn a_ddp_trace_is_valid_trace_event_json_with_matching_ops_on_both_ranks() {
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    let o = kiln(
        d.path(),
        &[
            "run",
            "t.toml",
            "--quiet",
            "--run-dir",
            "r",
            "--set",
            "strategy.kind=\"ddp\"",
            "--set",
            "strategy.devices=2",
            "--set",
            "profile.enabled=true",
            "--set",
            "profile.wait=1",
            "--set",
            "profile.warmup=1",
            "--set",
            "profile.active=2",
            "--set",
            "train.eval_every=3",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("trace/all.json"), "{}", stdout(&o));
    let line = stdout(&o);
    assert!(
        line.contains("ms: ") && line.contains("forward") && line.contains("all_reduce"),
        "{line}"
    );

    let run = d.path().join("r");
    for f in ["rank-0.json", "rank-1.json"] {
        assert!(run.join("trace").join(f).is_file(), "{f}");
    }
    let all: Value =
        serde_json::from_slice(&std::fs::read(run.join("trace/all.json")).unwrap()).unwrap();
    let events = all["traceEvents"].as_array().unwrap();
    // per track (a rank's compute thread, tid 0, and its communication thread, tid 1):
    // complete events only, with a duration, in time order, nested (a span that starts inside
    // another ends inside it)
    let mut last: BTreeMap<(u64, u64), f64> = BTreeMap::new();
    let mut open: BTreeMap<(u64, u64), Vec<(f64, String)>> = BTreeMap::new();
    // op number -> the track it ran on
    let mut op_track: BTreeMap<u64, u64> = BTreeMap::new();
    // op number -> (name, bytes) per rank
    let mut ops: BTreeMap<u64, BTreeMap<u64, (String, u64)>> = BTreeMap::new();
    let mut steps: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for e in events {
        match e["ph"].as_str().unwrap() {
            "M" => continue,
            "X" => {}
            other => panic!("unexpected phase {other}: {e}"),
        }
        let pid = e["pid"].as_u64().unwrap();
        let tid = e["tid"].as_u64().unwrap();
        let ts = e["ts"].as_f64().unwrap();
        assert!(e["dur"].as_f64().unwrap() >= 0.0, "{e}");
        let prev = last.insert((pid, tid), ts).unwrap_or(f64::MIN);
        assert!(
            ts >= prev,
            "timestamps go back on rank {pid} track {tid}: {prev} then {ts}"
        );
        let end = ts + e["dur"].as_f64().unwrap();
        let stack = open.entry((pid, tid)).or_default();
        while stack.last().is_some_and(|(e, _)| *e <= ts) {
            stack.pop();
        }
        if let Some((outer_end, outer)) = stack.last() {
            assert!(
                end <= *outer_end,
                "{e} overlaps the end of `{outer}` on rank {pid}"
            );
        }
        stack.push((end, e["name"].as_str().unwrap().to_string()));
        if let Some(op) = e["args"]["op"].as_u64() {
            let entry = (
                e["name"].as_str().unwrap().to_string(),
                e["args"]["bytes"].as_u64().unwrap(),
            );
            ops.entry(op).or_default().insert(pid, entry);
            op_track.insert(op, tid);
        }
        if e["name"] == "step" {
            steps
                .entry(pid)
                .or_default()
                .push(e["args"]["step"].as_u64().unwrap());
        }
    }
    assert_eq!(
        last.keys().copied().collect::<Vec<_>>(),
        [(0, 0), (0, 1), (1, 0), (1, 1)],
        "compute and communication spans from both ranks"
    );
    // wait 1, warmup 1, active 2: steps 3 and 4 are recorded
    assert_eq!(steps[&0], [3, 4]);
    assert_eq!(steps[&1], [3, 4]);
    assert!(ops.len() >= 4, "{ops:?}");
    for (op, by_rank) in &ops {
        assert_eq!(by_rank.len(), 2, "op #{op} on both ranks: {by_rank:?}");
        assert_eq!(
            by_rank[&0], by_rank[&1],
            "op #{op} is the same op on both ranks"
        );
    }
    // TINY's 195 parameters, all-reduced a unit at a time in the backward's order: the last
    // layer's 51 as soon as its backward is done, then the first layer's 144
    let sizes: Vec<u64> = ops.values().map(|r| r[&0].1).collect();
    assert!(
        sizes.windows(2).any(|w| w == [51 * 4, 144 * 4]),
        "per-unit gradient all-reduces, last unit first: {ops:?}"
    );
    // (strategy.overlap) the gradient all-reduces ran on the communication thread; the loss
    // and stop flags (f64, 32 bytes) where the step reached them
    for (op, (name, bytes)) in ops.iter().map(|(op, r)| (op, &r[&0])) {
        let expected = match bytes {
            32 => 0,
            b if [51 * 4, 144 * 4].contains(b) => 1,
            _ => continue,
        };
        assert_eq!(op_track[op], expected, "op #{op} {name} {bytes} bytes");
    }
    let threads: Vec<&str> = events
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .filter_map(|e| e["args"]["name"].as_str())
        .collect();
    assert!(threads.contains(&"communication"), "{threads:?}");
    let names: Vec<&str> = events.iter().filter_map(|e| e["name"].as_str()).collect();
    for n in ["data", "forward", "backward", "optimizer", "eval"] {
        assert!(names.contains(&n), "a `{n}` span: {names:?}");
    }

    // the always-on breakdown
    let s = summary(&run);
    let time = &s["time"];
    assert_eq!(time["clock"], "host");
    assert!(time["step_ms"].as_f64().unwrap() > 0.0);
    // (issue 45: the training step alone, evaluation and checkpoints left out: below the wall
    // time per step, and each metrics line has its window's)
    let steps = s["steps"].as_f64().unwrap();
    let mean = &time["mean"]["seconds"];
    let train_s: f64 = mean
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "eval" && *k != "checkpoint")
        .map(|(_, v)| v.as_f64().unwrap())
        .sum();
    assert!(
        (time["step_ms"].as_f64().unwrap() - train_s * 1e3 / steps).abs() < 1.0,
        "{time}"
    );
    assert!(mean["eval"].as_f64().unwrap() > 0.0, "{time}");
    assert!(time["step_ms"].as_f64().unwrap() * steps < time["wall_s"].as_f64().unwrap() * 1e3);
    for line in crate::common::metric_lines(&run) {
        assert!(line["step_ms"].as_f64().unwrap() > 0.0, "{line}");
    }
    for part in [&time["mean"], &time["ranks"][0], &time["ranks"][1]] {
        let f = part["fractions"].as_object().unwrap();
        let total: f64 = f.values().map(|v| v.as_f64().unwrap()).sum();
        assert!((total - 1.0).abs() < 0.01, "{f:?}");
        for k in ["forward", "backward", "all_reduce", "optimizer"] {
            assert!(f.contains_key(k), "{k} in {f:?}");
        }
        // all the communication, and the time the compute spent in it or waiting for it (which
        // includes handing results between threads, so on a busy machine it can be the larger)
        let (total, exposed) = (
            part["comm"]["total_s"].as_f64().unwrap(),
            part["comm"]["exposed_s"].as_f64().unwrap(),
        );
        assert!(total > 0.0 && exposed > 0.0, "{part}");
    }
    for m in metric_lines(&run) {
        let f = m["time"].as_object().unwrap();
        assert!(f.contains_key("forward"), "{m}");
    }
}

#[test]
fn profile_keys_are_checked() {
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    for (set, want) in [
        ("profile.active=0", "`profile.active`"),
        ("profile.ranks=[3]", "names rank 3, but the job has 1 ranks"),
        ("profile.every=2", "unknown"),
    ] {
        let o = kiln(d.path(), &["check", "t.toml", "--set", set]);
        assert_eq!(o.status.code(), Some(2), "{set}: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "{set}: {}", stderr(&o));
    }
}

#[test]
fn the_summary_reports_training_flops_of_each_built_in_model() {
    let d = kiln::testdir::tempdir().unwrap();
    crate::models::corpus(d.path());
    let gpt =
        crate::models::GPT.replace("corpus.txt", d.path().join("corpus.txt").to_str().unwrap());
    // 6 x multiply-adds per sample, by hand:
    // mlp 8 -> 16 -> 3: 8*16 + 16*3 = 176
    // cnn [2, 8, 8], 3x3 convs to 3 then 4 channels, pooled to 4x4 then 2x2, 16 -> 8 -> 3:
    //   2*3*9*64 + 3*4*9*16 + 16*8 + 8*3 = 5336
    // gpt dim 32, 2 layers, vocab 256, block 32: per token 6 * (2*12*32^2 + 32*256) + 12*2*32*32,
    //   times 32 tokens
    for (name, toml, flops) in [
        ("mlp", TINY.to_string(), 6.0 * 176.0),
        ("cnn", crate::models::CNN.to_string(), 6.0 * 5336.0),
        ("gpt", gpt, 32.0 * (6.0 * 32768.0 + 24576.0)),
    ] {
        write(d.path(), &format!("{name}.toml"), &toml);
        let o = kiln(
            d.path(),
            &[
                "run",
                &format!("{name}.toml"),
                "--quiet",
                "--run-dir",
                name,
                "--set",
                "train.max_steps=2",
            ],
        );
        assert_eq!(o.status.code(), Some(0), "{name}: {}", stderr(&o));
        let s = summary(&d.path().join(name));
        assert_eq!(s["flops_per_sample"].as_f64(), Some(flops), "{name}");
        let per_sec = s["flops_per_sec"].as_f64().unwrap();
        let want = flops * s["samples_per_sec"].as_f64().unwrap();
        assert!(
            (per_sec - want).abs() <= 1.0 + want * 1e-6,
            "{name}: {per_sec} vs {want}"
        );
        assert!(s["mfu"].is_null(), "{name}: no MFU on the CPU");
        assert!(
            s["mfu_note"].as_str().unwrap().contains("GPUs only"),
            "{name}"
        );
    }
}

#[test]
fn without_a_terminal_progress_is_a_line_per_logged_step_and_quiet_is_silent() {
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    let o = kiln(
        d.path(),
        &[
            "run",
            "t.toml",
            "--run-dir",
            "a",
            "--set",
            "train.log_every=4",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let e = stderr(&o);
    let lines: Vec<&str> = e.lines().filter(|l| l.starts_with("step ")).collect();
    assert_eq!(lines.len(), 2, "steps 4 and 8 of 8: {e}");
    assert!(
        lines[1].starts_with("step 8/8  loss ") && lines[1].contains(" samples/s  eta "),
        "{e}"
    );
    let o = kiln(d.path(), &["run", "t.toml", "--run-dir", "b", "--quiet"]);
    assert!(!stderr(&o).contains("step 8/8"), "{}", stderr(&o));
}
