//! `data.kind = "tokens"` (nanoGPT's token files, mapped): the same bytes as u16 or u32 ids
//! train to the bits of `data.kind = "text"`; single == ddp == fsdp, exact and elastic resume
//! hold on token data (its shuffle is computed per index, never held); a 1 GB file trains with
//! a small resident set; bad files are exit 2 naming the file and offset.

use std::path::{Path, PathBuf};

use crate::common::{kiln, loss_lines, resume_copy, root, stderr, summary, write};
use crate::models::GPT;

/// The book's first 6,000 bytes as text, as u16 ids and as u32 ids, and the gpt experiment.
fn files(dir: &Path) -> Vec<u8> {
    let text = std::fs::read(root().join("experiments/data/text/rust-book.txt")).unwrap();
    let bytes = text[..6000].to_vec();
    std::fs::write(dir.join("corpus.txt"), &bytes).unwrap();
    let u16s: Vec<u8> = bytes
        .iter()
        .flat_map(|&b| u16::from(b).to_le_bytes())
        .collect();
    std::fs::write(dir.join("c16.bin"), u16s).unwrap();
    let u32s: Vec<u8> = bytes
        .iter()
        .flat_map(|&b| u32::from(b).to_le_bytes())
        .collect();
    std::fs::write(dir.join("c32.bin"), u32s).unwrap();
    write(dir, "gpt.toml", GPT);
    bytes
}

fn run(dir: &Path, name: &str, sets: &[&str]) -> PathBuf {
    let out = dir.join(name);
    let mut args = vec![
        "run",
        "gpt.toml",
        "--quiet",
        "--run-dir",
        out.to_str().unwrap(),
        "--set",
        "train.log_every=1",
    ];
    for s in sets {
        args.extend(["--set", s]);
    }
    let o = kiln(dir, &args);
    assert_eq!(o.status.code(), Some(0), "{name}: {}", stderr(&o));
    out
}

const U16: [&str; 2] = ["data.kind=\"tokens\"", "data.path=\"c16.bin\""];

#[test]
fn token_files_train_to_the_bits_of_the_same_text() {
    let d = kiln::testdir::tempdir().unwrap();
    files(d.path());
    // (no shuffle: token files shuffle with another permutation than in-memory data)
    let text = run(d.path(), "text", &["sampler.shuffle=false"]);
    let u16 = run(d.path(), "u16", &[U16[0], U16[1], "sampler.shuffle=false"]);
    let u32 = run(
        d.path(),
        "u32",
        &[
            "data.kind=\"tokens\"",
            "data.path=\"c32.bin\"",
            "data.dtype=\"u32\"",
            "sampler.shuffle=false",
        ],
    );
    for r in [&u16, &u32] {
        assert_eq!(summary(r)["params_sha256"], summary(&text)["params_sha256"]);
        assert_eq!(summary(r)["eval_loss"], summary(&text)["eval_loss"]);
    }
    // a held-out file instead of the tail: the same windows as eval_fraction's
    let tail = 1200 * 2; // the last 20% of 6000 tokens, in bytes
    let all = std::fs::read(d.path().join("c16.bin")).unwrap();
    std::fs::write(d.path().join("train.bin"), &all[..all.len() - tail]).unwrap();
    std::fs::write(d.path().join("val.bin"), &all[all.len() - tail..]).unwrap();
    write(
        d.path(),
        "gpt.toml",
        &GPT.replace("eval_fraction = 0.2", "eval_path = \"val.bin\""),
    );
    let split = run(
        d.path(),
        "split",
        &[
            "data.kind=\"tokens\"",
            "data.path=\"train.bin\"",
            "sampler.shuffle=false",
        ],
    );
    assert_eq!(
        summary(&split)["params_sha256"],
        summary(&text)["params_sha256"]
    );
    assert_eq!(summary(&split)["eval_loss"], summary(&text)["eval_loss"]);
}

#[test]
fn token_data_keeps_the_equalities_and_exact_resume() {
    let d = kiln::testdir::tempdir().unwrap();
    files(d.path());
    let base = [
        U16[0],
        U16[1],
        "train.max_steps=6",
        "checkpoint.every_steps=3",
    ];
    let with = |extra: &[&'static str]| -> Vec<&str> {
        let mut v = base.to_vec();
        v.extend_from_slice(extra);
        v
    };
    let single = run(d.path(), "single", &with(&["train.batch_size=8"]));
    for (name, extra) in [
        (
            "ddp",
            &[
                "train.batch_size=4",
                "strategy.kind=ddp",
                "strategy.devices=2",
            ][..],
        ),
        (
            "fsdp",
            &[
                "train.batch_size=4",
                "strategy.kind=fsdp",
                "strategy.devices=2",
                "strategy.unit=layer",
            ][..],
        ),
    ] {
        let r = run(d.path(), name, &with(extra));
        for ((s1, a), (s2, b)) in loss_lines(&single).iter().zip(&loss_lines(&r)) {
            assert_eq!(s1, s2);
            assert!(
                (a - b).abs() <= 1e-5 * a.abs(),
                "{name} step {s1}: {a} vs {b}"
            );
        }
    }
    // exact resume, and elastic: a ddp(2) checkpoint resumed by single on the same global
    // batch continues the same sample order (the shuffle is computed per index)
    let copy = resume_copy(d.path(), &single, "step-00000003", &[]);
    assert_eq!(loss_lines(&copy), loss_lines(&single));
    assert_eq!(
        summary(&copy)["params_sha256"],
        summary(&single)["params_sha256"]
    );
    let ddp = d.path().join("ddp");
    let elastic = resume_copy(
        &d.path().join("elastic"),
        &ddp,
        "step-00000003",
        &[
            "strategy.kind=single",
            "strategy.devices=1",
            "train.batch_size=8",
        ],
    );
    for ((s1, a), (s2, b)) in loss_lines(&single).iter().zip(&loss_lines(&elastic)) {
        assert_eq!(s1, s2);
        assert!(
            (a - b).abs() <= 1e-5 * a.abs(),
            "elastic step {s1}: {a} vs {b}"
        );
    }
}

#[test]
fn a_1_gb_token_file_trains_in_a_small_resident_set() {
    let d = kiln::testdir::tempdir().unwrap();
    files(d.path());
    // sparse: the book's ids, then zeros up to 1 GiB (512 Mi tokens, 16 Mi windows)
    let f = std::fs::OpenOptions::new()
        .append(true)
        .open(d.path().join("c16.bin"))
        .unwrap();
    f.set_len(1 << 30).unwrap();
    drop(f);
    let r = run(
        d.path(),
        "big",
        &[
            U16[0],
            U16[1],
            "data.eval_fraction=0.0001",
            "train.max_steps=3",
        ],
    );
    let s = summary(&r);
    let rss = s["peak_rss_bytes"].as_u64().unwrap();
    eprintln!("a 1 GiB token file: peak RSS {} MiB", rss >> 20);
    assert!(rss < 300 << 20, "peak RSS {} MiB", rss >> 20);
    assert_eq!(s["steps"], 3);
}

#[test]
fn bad_token_files_name_the_file_and_offset() {
    let d = kiln::testdir::tempdir().unwrap();
    files(d.path());
    let refused = |sets: &[&str]| -> String {
        let mut args = vec!["run", "gpt.toml"];
        for s in sets {
            args.extend(["--set", s]);
        }
        let o = kiln(d.path(), &args);
        assert_eq!(o.status.code(), Some(2), "{sets:?}: {}", stderr(&o));
        stderr(&o)
    };
    // an id over the vocabulary
    let mut bad = std::fs::read(d.path().join("c16.bin")).unwrap();
    bad[2 * 100..2 * 101].copy_from_slice(&300u16.to_le_bytes());
    std::fs::write(d.path().join("bad.bin"), &bad).unwrap();
    let e = refused(&[U16[0], "data.path=\"bad.bin\""]);
    assert!(
        e.contains(
            "bad.bin: token 100 (byte offset 200) is id 300, not below `model.vocab_size` = 256"
        ),
        "{e}"
    );
    // a length that is not whole u16s
    std::fs::write(d.path().join("odd.bin"), &bad[..2001]).unwrap();
    let e = refused(&[U16[0], "data.path=\"odd.bin\""]);
    assert!(
        e.contains("odd.bin (data.path): 2001 bytes is not a whole number of u16 tokens"),
        "{e}"
    );
    // u32 ids read as u16: every other id is 0, the length fits; ids stay in range here, so
    // the vocabulary check is what catches a u16 file read as u32
    let e = refused(&[U16[0], U16[1], "data.dtype=\"u32\"", "model.vocab_size=300"]);
    assert!(e.contains("c16.bin: token 0 (byte offset 0) is id"), "{e}");
    // keys that do not fit the kind
    let e = refused(&["data.dtype=\"u16\""]);
    assert!(
        e.contains("`data.dtype` is the element type of a token file"),
        "{e}"
    );
    let e = refused(&[
        U16[0],
        U16[1],
        "data.eval_path=\"c16.bin\"",
        "data.eval_fraction=0.1",
    ]);
    assert!(
        e.contains("`data.eval_fraction` holds out the end of `data.path`"),
        "{e}"
    );
    assert!(!d.path().join("runs").exists());
}
