//! Mixtures of text and token files (`data.mix` with `data.kind = "text"` / `"tokens"`): each
//! row is a window of one source's file, drawn by weight; a run resumed mid-stream has the bits
//! of a straight one (under another world size, its losses); bad mixtures exit 2 naming the key.

use std::path::Path;

use crate::common::{kiln, resume_copy, stderr, stdout, summary, write};

/// A u16 token file of `n` ids counting up from `from` modulo `m` (each window tells its
/// source and place by its ids).
fn token_file(path: &Path, n: usize, from: u16, m: u16) {
    let bytes: Vec<u8> = (0..n)
        .flat_map(|i| (from + (i % m as usize) as u16).to_le_bytes())
        .collect();
    std::fs::write(path, bytes).unwrap();
}

const TOKENS: &str = r#"
[experiment]
seed = 3

[model]
kind = "gpt"
vocab_size = 256
block_size = 16
layers = 1
heads = 2
dim = 16

[data]
kind = "tokens"
mix = [{ path = "a.bin", weight = 3.0 }, { path = "b.bin" }]
eval_path = "ev.bin"

[train]
max_steps = 6
batch_size = 8

[optim]
kind = "adamw"
lr = 0.003

[backend]
threads = 1
"#;

fn files(d: &Path) {
    // a: 1,600 tokens (100 windows); b: 120 tokens (7 windows, fewer than the 12 a run of 48 rows
    // draws: it runs out and starts again)
    token_file(&d.join("a.bin"), 1600, 0, 97);
    token_file(&d.join("b.bin"), 120, 100, 50);
    token_file(&d.join("ev.bin"), 100, 0, 97);
}

#[test]
fn a_mixture_of_token_files_draws_windows_by_weight() {
    let d = kiln::testdir::tempdir().unwrap();
    files(d.path());
    write(d.path(), "m.toml", TOKENS);
    let o = kiln(
        d.path(),
        &["data", "preview", "m.toml", "--rows", "800", "--json"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let rows: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 800);
    let mut second = 0;
    let mut seen = std::collections::HashSet::new();
    for r in &rows {
        let ids: Vec<u64> = r["input_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        let labels = r["labels"].as_array().unwrap();
        let source = r["source"].as_array().unwrap();
        assert_eq!(ids.len(), 17);
        // one window of one file: every token a target but the first, positions 0..17
        let s = source[0].as_i64().unwrap();
        assert!(source.iter().all(|v| v.as_i64() == Some(s)), "{r}");
        assert_eq!(labels[0], -100);
        for i in 1..17 {
            assert_eq!(labels[i].as_u64(), Some(ids[i]));
        }
        let (from, m) = if s == 1 { (100, 50) } else { (0, 97) };
        for w in ids.windows(2) {
            assert_eq!(w[1], from + (w[0] - from + 1) % m, "{r}");
        }
        second += usize::from(s == 1);
        seen.insert((s, ids[0]));
    }
    let share = second as f64 / 800.0;
    assert!((share - 0.25).abs() <= 0.05, "{second} of 800 rows");
    // each pass of b draws each of its 7 windows once, in another order each pass
    let b: Vec<u64> = rows
        .iter()
        .filter(|r| r["source"][0] == 1)
        .map(|r| r["input_ids"][0].as_u64().unwrap())
        .collect();
    let passes: Vec<Vec<u64>> = b.chunks_exact(7).map(<[u64]>::to_vec).collect();
    for p in &passes {
        let mut sorted = p.clone();
        sorted.sort();
        assert_eq!(sorted, [100, 114, 116, 130, 132, 146, 148], "{passes:?}");
    }
    assert!(passes.windows(2).any(|w| w[0] != w[1]), "{passes:?}");
    // a's 100 windows all come round too (800 rows are several passes of it): their first
    // ids, 16 j mod 97, take 97 values
    assert_eq!(seen.iter().filter(|(s, _)| *s == 0).count(), 97);
    // the plan names the files, their windows and shares
    let o = kiln(d.path(), &["check", "m.toml"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("windows of 17 tokens mixed: data.mix[0] (")
            && stdout(&o).contains("7 windows every 16 tokens, 25.0% of rows"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn a_token_mixture_resumed_mid_stream_has_the_bits_of_a_straight_run() {
    let d = kiln::testdir::tempdir().unwrap();
    files(d.path());
    write(d.path(), "m.toml", TOKENS);
    let o = kiln(
        d.path(),
        &[
            "run",
            "m.toml",
            "--quiet",
            "--set",
            "checkpoint.every_steps=2",
            "--set",
            "experiment.name=full",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let full = d.path().join("runs/full");
    let log = std::fs::read_to_string(full.join("logs/rank-0.log")).unwrap();
    assert!(
        log.contains("windows: data.mix[1] ran out and starts its pass 2"),
        "{log}"
    );
    let resumed = resume_copy(d.path(), &full, "step-00000002", &["data.workers=2"]);
    let (a, b) = (summary(&full), summary(&resumed));
    assert_eq!(a["params_sha256"], b["params_sha256"]);
    assert_eq!(a["eval_loss"], b["eval_loss"]);
    // under another world size: the same global rows, the same losses within 1e-5
    let other = resume_copy(
        d.path(),
        &full,
        "step-00000004",
        &[
            "strategy.kind=\"ddp\"",
            "strategy.devices=2",
            "train.batch_size=4",
        ],
    );
    let (x, y) = (
        crate::common::loss_lines(&full),
        crate::common::loss_lines(&other),
    );
    assert_eq!(x.len(), y.len());
    for ((s1, l1), (s2, l2)) in x.iter().zip(&y) {
        assert_eq!(s1, s2);
        assert!(
            (l1 - l2).abs() <= 1e-5 * l1.abs(),
            "step {s1}: {l1} vs {l2}"
        );
    }
    // a resume over another file is refused, naming the source: another size, or the same
    // size with other tokens
    for (n, from) in [(140, 100), (120, 150)] {
        let copy = d.path().join(format!("changed-{n}-{from}"));
        crate::common::copy_dir(&full, &copy);
        token_file(&d.path().join("b.bin"), n, from, 50);
        let o = kiln(
            d.path(),
            &[
                "resume",
                copy.to_str().unwrap(),
                "--quiet",
                "--from",
                "step-00000002",
            ],
        );
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(
            stderr(&o).contains("`data.mix[1]` =")
                && stderr(&o).contains("changed since the run was made"),
            "{}",
            stderr(&o)
        );
    }
}

#[test]
fn a_text_mixture_trains_and_bad_mixtures_exit_2_naming_the_key() {
    let d = kiln::testdir::tempdir().unwrap();
    let text =
        std::fs::read_to_string(crate::common::root().join("experiments/data/text/rust-book.txt"))
            .unwrap();
    write(d.path(), "a.txt", &text[..6000]);
    write(d.path(), "b.txt", &text[6000..6100]);
    write(d.path(), "ev.txt", &text[7000..8000]);
    let t = TOKENS
        .replace("kind = \"tokens\"", "kind = \"text\"")
        .replace("a.bin", "a.txt")
        .replace("b.bin", "b.txt")
        .replace("ev.bin", "ev.txt")
        + "\n[checkpoint]\nat_end = false\n";
    let t = t.replace(
        "eval_path = \"ev.txt\"",
        "eval_path = \"ev.txt\"\nmix_stop = \"first_exhausted\"",
    );
    write(d.path(), "t.toml", &t);
    let o = kiln(
        d.path(),
        &["run", "t.toml", "--quiet", "--set", "experiment.name=text"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let s = summary(&d.path().join("runs/text"));
    assert!(s["eval_loss"].as_f64().unwrap() > 0.0, "{s}");
    // b.txt (100 bytes, 6 windows) runs out first and ends the pass for both
    let log = std::fs::read_to_string(d.path().join("runs/text/logs/rank-0.log")).unwrap();
    assert!(
        log.contains("windows: data.mix[1] ran out (data.mix_stop = \"first_exhausted\"): every source starts pass 2"),
        "{log}"
    );
    // the evaluation is data.eval_path's windows every block_size bytes: (1000 - 17) / 16 + 1
    let o = kiln(
        d.path(),
        &["data", "preview", "t.toml", "--eval", "--rows", "100"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o).matches("row ").count(), 62, "{}", stdout(&o));
    for (set, key, says) in [
        (
            "data.mix=[{ path = \"*.txt\" }]",
            "data.mix",
            "is not a file",
        ),
        (
            "data.eval_fraction=0.1",
            "data.eval_fraction",
            "trains on the whole of each of its files",
        ),
        (
            "data.mix=[{ path = \"a.txt\", text_field = \"body\" }]",
            "data.mix",
            "has none",
        ),
        (
            "checkpoint.every_epochs=1",
            "checkpoint.every_epochs",
            "no epochs",
        ),
        ("data.kind=\"csv\"", "data.mix", "mixes sources"),
    ] {
        let o = kiln(d.path(), &["check", "t.toml", "--set", set]);
        assert_eq!(o.status.code(), Some(2), "{set}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(e.contains(key) && e.contains(says), "{set}: {e}");
    }
    // no train.max_steps: a stream has no epochs to count
    write(d.path(), "n.toml", &t.replace("max_steps = 6", ""));
    let o = kiln(d.path(), &["check", "n.toml"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("train.max_steps"), "{}", stderr(&o));
}
