//! Documents as data (`data.kind = "jsonl"` / `"parquet"`): packed rows give each token the
//! loss of its document alone (eval packed == unpacked), the loss is a mean over the global
//! batch's tokens (batch 8 == 4 x accumulation 2 == ddp(2) x 4), parquet gives the bits of
//! jsonl, a resumed run the bits of a straight one, and bad records exit 2 naming file and line.

use std::path::Path;

use crate::common::{kiln, resume_copy, stderr, stdout, summary, train_task, write};

/// Documents of 1 to 90 characters (the longest are cut into pieces of a row), deterministic.
fn docs(n: usize, seed: usize) -> Vec<String> {
    let words = [
        "the", "cat", "sat", "on", "a", "mat", "while", "dogs", "ran", "far", "away", "x",
    ];
    (0..n)
        .map(|i| {
            let len = 1 + (i * 37 + seed * 11) % 17;
            (0..len)
                .map(|k| words[(i * 7 + k * 5 + seed) % words.len()])
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

fn jsonl(path: &Path, docs: &[String]) {
    let text: String = docs
        .iter()
        .enumerate()
        .map(|(i, d)| format!("{}\n", serde_json::json!({ "id": i, "text": d })))
        .collect();
    std::fs::write(path, text).unwrap();
}

/// A parquet file of `docs` (a `text` column beside an `id`), in row groups of 7.
fn parquet(path: &Path, docs: &[String]) {
    use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
    use parquet::file::properties::WriterProperties;
    use parquet::file::writer::SerializedFileWriter;
    use parquet::schema::parser::parse_message_type;
    let schema = "message schema { REQUIRED INT64 id; REQUIRED BYTE_ARRAY text (UTF8); }";
    let schema = std::sync::Arc::new(parse_message_type(schema).unwrap());
    let props = std::sync::Arc::new(WriterProperties::builder().build());
    let file = std::fs::File::create(path).unwrap();
    let mut w = SerializedFileWriter::new(file, schema, props).unwrap();
    for (g, chunk) in docs.chunks(7).enumerate() {
        let mut rg = w.next_row_group().unwrap();
        let mut col = rg.next_column().unwrap().unwrap();
        let ids: Vec<i64> = (0..chunk.len()).map(|i| (g * 7 + i) as i64).collect();
        col.typed::<Int64Type>()
            .write_batch(&ids, None, None)
            .unwrap();
        col.close().unwrap();
        let mut col = rg.next_column().unwrap().unwrap();
        let values: Vec<ByteArray> = chunk.iter().map(|s| ByteArray::from(s.as_str())).collect();
        col.typed::<ByteArrayType>()
            .write_batch(&values, None, None)
            .unwrap();
        col.close().unwrap();
        rg.close().unwrap();
    }
    w.close().unwrap();
}

/// Two training shards and an evaluation file of jsonl (or parquet) in `dir`.
fn corpus(dir: &Path, ext: &str) {
    std::fs::create_dir_all(dir.join("train")).unwrap();
    let write = |p: &Path, d: &[String]| match ext {
        "parquet" => parquet(p, d),
        _ => jsonl(p, d),
    };
    write(&dir.join(format!("train/a.{ext}")), &docs(60, 1));
    write(&dir.join(format!("train/b.{ext}")), &docs(45, 2));
    write(&dir.join(format!("eval.{ext}")), &docs(23, 3));
}

const GPT: &str = r#"
[experiment]
seed = 7

[model]
kind = "gpt"
vocab_size = 256
block_size = 32
layers = 2
heads = 2
dim = 32

[data]
kind = "jsonl"
path = "DIR/train"
eval_path = "DIR/eval.jsonl"

[train]
max_steps = 3
batch_size = 8

[optim]
kind = "adamw"
lr = 0.003

[backend]
threads = 1
"#;

fn task(dir: &Path, model: &str) -> String {
    let t = GPT.replace("DIR", dir.to_str().unwrap());
    match model {
        "llama" => t.replace(
            "kind = \"gpt\"",
            "kind = \"llama\"\nkv_heads = 1\nffn_dim = 48",
        ),
        _ => t,
    }
}

fn rel_diff(a: &[f32], b: &[f32]) -> f32 {
    let scale = a.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12);
    crate::common::max_diff(a, b) / scale
}

#[test]
fn packed_rows_give_each_token_the_loss_of_its_document_alone() {
    let d = kiln::testdir::tempdir().unwrap();
    corpus(d.path(), "jsonl");
    for model in ["gpt", "llama"] {
        for fused in ["true", "false"] {
            // no step moves the parameters: both evaluate the initialisation
            let eval = |packing: &str| {
                train_task(
                    &task(d.path(), model),
                    &[
                        "optim.lr=0",
                        "train.max_steps=1",
                        &format!("data.packing={packing}"),
                        &format!("backend.fused={fused}"),
                    ],
                )
                .eval
            };
            let (packed, unpacked) = (eval("true"), eval("false"));
            // the same tokens are targets either way
            assert_eq!(packed.2, unpacked.2, "{model} fused={fused}");
            assert!(
                (packed.0 - unpacked.0).abs() <= 1e-5 * unpacked.0,
                "{model} fused={fused}: eval loss packed {} vs unpacked {}",
                packed.0,
                unpacked.0
            );
        }
    }
}

#[test]
fn the_loss_is_a_mean_over_the_global_batchs_tokens() {
    let d = kiln::testdir::tempdir().unwrap();
    corpus(d.path(), "jsonl");
    let t = task(d.path(), "gpt");
    let single = train_task(&t, &["train.batch_size=8"]);
    for sets in [
        vec!["train.batch_size=4", "train.grad_accum_steps=2"],
        vec![
            "train.batch_size=4",
            "strategy.kind=ddp",
            "strategy.devices=2",
        ],
        vec![
            "train.batch_size=2",
            "train.grad_accum_steps=2",
            "strategy.kind=fsdp",
            "strategy.devices=2",
            "data.workers=2",
        ],
        vec![
            "train.batch_size=4",
            "strategy.kind=dp",
            "strategy.devices=2",
        ],
    ] {
        let other = train_task(&t, &sets);
        let diff = rel_diff(&single.params, &other.params);
        assert!(diff < 1e-5, "{sets:?}: relative difference {diff}");
        assert_eq!(single.eval.2, other.eval.2);
    }
    // one evaluation row for two ranks: the rank without one takes part in the reduction
    jsonl(&d.path().join("one.jsonl"), &docs(1, 5));
    let one = t.replace("eval.jsonl", "one.jsonl");
    let a = train_task(&one, &["train.batch_size=8"]);
    let b = train_task(
        &one,
        &[
            "train.batch_size=4",
            "strategy.kind=ddp",
            "strategy.devices=2",
        ],
    );
    assert_eq!(a.eval.2, b.eval.2);
    assert!((a.eval.0 - b.eval.0).abs() <= 1e-5 * a.eval.0);
}

#[test]
fn parquet_records_train_to_the_bits_of_the_same_jsonl_records() {
    let d = kiln::testdir::tempdir().unwrap();
    corpus(d.path(), "jsonl");
    corpus(d.path(), "parquet");
    let t = task(d.path(), "llama");
    let a = train_task(&t, &[]);
    let p = t
        .replace("kind = \"jsonl\"", "kind = \"parquet\"")
        .replace("eval.jsonl", "eval.parquet");
    let b = train_task(&p, &[]);
    assert_eq!(a.params, b.params);
    assert_eq!(a.eval, b.eval);
}

/// A mixture of the two training shards, 3:1, instead of `data.path`.
fn mixed(t: &str, dir: &Path) -> String {
    let d = dir.to_str().unwrap();
    t.replace(
        &format!("path = \"{d}/train\""),
        &format!(
            "mix = [{{ path = \"{d}/train/a.jsonl\", weight = 3.0 }}, {{ path = \"{d}/train/b.jsonl\" }}]"
        ),
    )
}

#[test]
fn a_run_resumed_mid_stream_has_the_bits_of_a_straight_one() {
    let d = kiln::testdir::tempdir().unwrap();
    corpus(d.path(), "jsonl");
    // small rows: the 6 steps read past the end of the documents into a second pass
    let t = task(d.path(), "gpt")
        .replace("max_steps = 3", "max_steps = 6")
        .replace("block_size = 32", "block_size = 24");
    // a mixture too: its sources run out and start again on their own
    write(d.path(), "m.toml", &mixed(&t, d.path()));
    let o = kiln(
        d.path(),
        &[
            "run",
            "m.toml",
            "--quiet",
            "--set",
            "checkpoint.every_steps=2",
            "--set",
            "experiment.name=mixed",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let full = d.path().join("runs/mixed");
    let resumed = resume_copy(d.path(), &full, "step-00000004", &[]);
    assert_eq!(
        summary(&full)["params_sha256"],
        summary(&resumed)["params_sha256"]
    );
    write(d.path(), "t.toml", &t);
    let o = kiln(
        d.path(),
        &[
            "run",
            "t.toml",
            "--quiet",
            "--set",
            "checkpoint.every_steps=2",
            "--set",
            "experiment.name=full",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let full = d.path().join("runs/full");
    // on loader threads, from a checkpoint mid-stream
    let resumed = resume_copy(d.path(), &full, "step-00000002", &["data.workers=2"]);
    let (a, b) = (summary(&full), summary(&resumed));
    assert_eq!(a["params_sha256"], b["params_sha256"]);
    assert_eq!(a["eval_loss"], b["eval_loss"]);
    // under another world size (ddp over 2 ranks of 4 rows): the same global rows, so the
    // same losses within 1e-5
    let other = resume_copy(
        d.path(),
        &full,
        "step-00000002",
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
    // a resume over other files is refused: a shard added to the directory
    let copy = d.path().join("changed");
    crate::common::copy_dir(&full, &copy);
    jsonl(&d.path().join("train/c.jsonl"), &docs(5, 4));
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
        stderr(&o).contains("the shards are not those of the checkpoint"),
        "{}",
        stderr(&o)
    );
    std::fs::remove_file(d.path().join("train/c.jsonl")).unwrap();
    // the checkpoint says where the documents stand
    let state: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(full.join("checkpoints/step-00000004/state.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(state["documents"]["rows"], 32, "{}", state["documents"]);
}

#[test]
fn bad_records_exit_2_naming_the_file_and_line() {
    let d = kiln::testdir::tempdir().unwrap();
    corpus(d.path(), "jsonl");
    let t = task(d.path(), "gpt");
    write(d.path(), "t.toml", &t);
    let a = d.path().join("train/a.jsonl");
    let good = std::fs::read_to_string(&a).unwrap();
    // a shard's first record is read before anything is written
    for (line, why) in [
        ("{not json\n", "not JSON"),
        ("{\"body\": \"x\"}\n", "no `text` (data.text_field)"),
        ("{\"text\": 3}\n", "not a string"),
        ("", "has no records"),
    ] {
        std::fs::write(&a, line).unwrap();
        let o = kiln(d.path(), &["run", "t.toml", "--quiet"]);
        assert_eq!(o.status.code(), Some(2), "{line:?}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(e.contains("a.jsonl") && e.contains(why), "{line:?}: {e}");
        assert!(!d.path().join("runs").exists(), "{line:?}: a run directory");
    }
    // a bad record further in stops the run where the stream reaches it, naming it
    let bad = format!("{}{{\"text\": \"fine\"}}\n{{not json\n", good);
    std::fs::write(&a, bad).unwrap();
    let o = kiln(
        d.path(),
        &["run", "t.toml", "--quiet", "--set", "train.max_steps=40"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("a.jsonl: line 62: not JSON"),
        "{}",
        stderr(&o)
    );
    assert!(
        stderr(&o).contains("rank 0: reading rows "),
        "{}",
        stderr(&o)
    );
    std::fs::write(&a, good).unwrap();
    // a stream has no length: the run needs train.max_steps
    let no_steps = t.replace("max_steps = 3", "epochs = 1");
    write(d.path(), "e.toml", &no_steps);
    let o = kiln(d.path(), &["run", "e.toml", "--quiet"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("train.max_steps"), "{}", stderr(&o));
}

#[test]
fn a_mixture_previews_its_sources_by_weight_and_rows_as_transformers_would_train_on_them() {
    let d = kiln::testdir::tempdir().unwrap();
    corpus(d.path(), "jsonl");
    let t = mixed(&task(d.path(), "gpt"), d.path());
    write(d.path(), "m.toml", &t);
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
    let (mut docs, mut second) = (0, 0);
    for r in &rows {
        let ids = r["input_ids"].as_array().unwrap();
        let labels = r["labels"].as_array().unwrap();
        let pos = r["position_ids"].as_array().unwrap();
        let source = r["source"].as_array().unwrap();
        assert_eq!(ids.len(), 33);
        for i in 0..ids.len() {
            let s = source[i].as_i64().unwrap();
            if s >= 0 && pos[i] == 0 {
                // a document (or piece) starts: no token before it predicts it
                assert_eq!(labels[i], -100);
                docs += 1;
                second += usize::from(s == 1);
            } else if s >= 0 {
                assert_eq!(labels[i], ids[i]);
            } else {
                assert_eq!(labels[i], -100);
            }
        }
    }
    let share = second as f64 / docs as f64;
    assert!((share - 0.25).abs() <= 0.05, "{second} of {docs} documents");
    // the text preview marks each document's first token and counts the padding
    let o = kiln(d.path(), &["data", "preview", "m.toml", "--rows", "2"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.starts_with("row 0: ") && text.contains("padding"),
        "{text}"
    );
    assert!(
        text.contains("  | [source ") && text.contains('⟦'),
        "{text}"
    );
    let o = kiln(d.path(), &["data", "stats", "m.toml"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.contains("105 documents") && text.contains("data.mix[1]: 45 documents"),
        "{text}"
    );
}

/// transformers' Llama (`tests/fixtures/hf-llama`) with a tokenizer whose post-processor adds a
/// BOS and whose `eos_token` ends each document (`scripts/check-documents-loss.py` makes both
/// and computes transformers' loss document by document): kiln's evaluation of the same jsonl,
/// packed or not, is that mean over target tokens within 1e-4, over the same tokens.
#[test]
fn a_transformers_llama_evaluates_documents_to_transformers_loss() {
    let d = kiln::testdir::tempdir().unwrap();
    let model = d.path().join("model");
    crate::common::copy_dir(
        &crate::common::root().join("tests/fixtures/hf-llama"),
        &model,
    );
    let python = crate::common::torch_python();
    let o = std::process::Command::new(python)
        .arg(crate::common::root().join("scripts/check-documents-loss.py"))
        .arg(&model)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let want: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    let (loss, tokens) = (
        want["loss"].as_f64().unwrap(),
        want["tokens"].as_u64().unwrap(),
    );
    let docs = model.join("docs.jsonl");
    let t = format!(
        "[model]\nkind = \"llama\"\nblock_size = 32\ninit_from = \"{}\"\n\n[data]\nkind = \"jsonl\"\npath = \"{}\"\neval_path = \"{}\"\n\n[train]\nbatch_size = 3\nmax_steps = 1\n\n[optim]\nkind = \"sgd\"\nlr = 0.0\n\n[backend]\nthreads = 1\n",
        model.display(),
        docs.display(),
        docs.display()
    );
    // kiln check names the EOS id and where it came from
    write(d.path(), "t.toml", &t);
    let o = kiln(d.path(), &["check", "t.toml"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("EOS id 2 (`eos_token` \"</s>\" of"),
        "{}",
        stdout(&o)
    );
    for packing in ["true", "false"] {
        let name = format!("packing-{packing}");
        let o = kiln(
            d.path(),
            &[
                "run",
                "t.toml",
                "--quiet",
                "--set",
                &format!("data.packing={packing}"),
                "--set",
                &format!("experiment.name=\"{name}\""),
            ],
        );
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let s = summary(&d.path().join("runs").join(&name));
        // (a run of documents counts its evaluation in tokens)
        assert_eq!(s["eval_samples"], tokens, "packing = {packing}");
        let got = s["eval_loss"].as_f64().unwrap();
        assert!(
            (got - loss).abs() <= 1e-4,
            "packing = {packing}: kiln {got} vs transformers {loss}"
        );
    }
}
