//! Supervised fine-tuning data (`data.format = "prompt_completion"` / `"messages"`): rows are
//! transformers' `apply_chat_template` ids with the loss on its `assistant_masks` (and on a
//! completion and its EOS), the evaluation loss of a transformers Llama is transformers'
//! masked loss, and the loss is a mean over the global batch's trained tokens.

use std::path::Path;

use crate::common::{kiln, root, stderr, stdout, summary, train_task, write};

/// The chat tokenizer, its template and records (`tests/fixtures/chat-tokenizer`).
fn fixture() -> std::path::PathBuf {
    root().join("tests/fixtures/chat-tokenizer")
}

fn preview(dir: &Path, toml: &str, rows: usize) -> Vec<serde_json::Value> {
    let n = rows.to_string();
    let o = kiln(dir, &["data", "preview", toml, "--rows", &n, "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Row `r` (one record, unpacked) against transformers' `ids` and `mask`: the same ids, then
/// padding; a label where the mask is 1 (but the first token), else -100.
fn assert_row(r: &serde_json::Value, ids: &[u64], mask: &[u64], what: &str) {
    let got: Vec<u64> = r["input_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(&got[..ids.len()], ids, "{what}");
    let labels = r["labels"].as_array().unwrap();
    for (i, l) in labels.iter().enumerate() {
        let want = if i > 0 && i < ids.len() && mask[i] == 1 {
            ids[i] as i64
        } else {
            -100
        };
        assert_eq!(l.as_i64(), Some(want), "{what}: label {i}");
    }
}

fn numbers(v: &serde_json::Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

/// transformers' Llama (`tests/fixtures/hf-llama`) made a chat model by
/// `scripts/check-chat-template.py` (its tokenizer, a template with `{% generation %}`, 40
/// conversations and 10 prompt-completion records): kiln's rows are `apply_chat_template`'s
/// ids with the loss on `assistant_masks`, prompt + completion + EOS with the loss on the
/// completion, and kiln's evaluation loss (packed or not) is transformers' masked loss within
/// 1e-4, over the same tokens.
#[test]
fn chat_rows_and_loss_are_transformers() {
    let d = kiln::testdir::tempdir().unwrap();
    let model = d.path().join("model");
    crate::common::copy_dir(&root().join("tests/fixtures/hf-llama"), &model);
    let python = crate::common::torch_python();
    let o = std::process::Command::new(python)
        .arg(root().join("scripts/check-chat-template.py"))
        .arg(&model)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let want: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    // templates in the style of Llama 3.1's, Qwen2.5's and Mistral's render to transformers'
    // text (today's date included), or fail where transformers' do
    let specials: std::collections::BTreeMap<String, String> =
        serde_json::from_value(want["specials"].clone()).unwrap();
    let cases = want["templates"].as_array().unwrap();
    assert_eq!(cases.len(), 18);
    for c in cases {
        let name = c["template"].as_str().unwrap();
        let source =
            std::fs::read_to_string(root().join("tests/fixtures/chat-templates").join(name))
                .unwrap();
        let t =
            kiln::data::chat::ChatTemplate::new(&source, name.into(), specials.clone()).unwrap();
        let conv = c["conversation"].as_array().unwrap();
        let got = t.render(conv, c["prompt"].as_bool().unwrap());
        match c["text"].as_str() {
            Some(text) => assert_eq!(got.unwrap().0, text, "{c}"),
            None => assert!(got.is_err(), "{c}: kiln rendered {got:?}"),
        }
    }
    // (the fixture's files are the script's)
    for f in [
        "tokenizer.json",
        "chat_template.jinja",
        "chats.jsonl",
        "pc.jsonl",
    ] {
        assert_eq!(
            std::fs::read(model.join(f)).unwrap(),
            std::fs::read(fixture().join(f)).unwrap(),
            "{f}: run scripts/check-chat-template.py into tests/fixtures/chat-tokenizer"
        );
    }
    let chats = model.join("chats.jsonl");
    let t = format!(
        "[model]\nkind = \"llama\"\ninit_from = \"{}\"\n\n[data]\nkind = \"jsonl\"\npath = \"{}\"\neval_path = \"{}\"\npacking = false\n\n[sampler]\nshuffle = false\n\n[train]\nbatch_size = 3\nmax_steps = 1\n\n[optim]\nkind = \"sgd\"\nlr = 0.0\n\n[backend]\nthreads = 1\n",
        model.display(),
        chats.display(),
        chats.display()
    );
    write(d.path(), "t.toml", &t);
    let rows = preview(d.path(), "t.toml", 40);
    assert_eq!(rows.len(), 40);
    for (k, (r, c)) in rows
        .iter()
        .zip(want["chats"].as_array().unwrap())
        .enumerate()
    {
        assert_row(
            r,
            &numbers(&c["ids"]),
            &numbers(&c["mask"]),
            &format!("chat {k}"),
        );
    }
    // kiln check says what the records are and which template renders them
    let o = kiln(d.path(), &["check", "t.toml"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("conversations in `messages`")
            && stdout(&o).contains("chat_template.jinja"),
        "{}",
        stdout(&o)
    );
    write(d.path(), "pc.toml", &t.replace("chats.jsonl", "pc.jsonl"));
    let rows = preview(d.path(), "pc.toml", 10);
    assert_eq!(rows.len(), 10);
    for (k, (r, c)) in rows.iter().zip(want["pc"].as_array().unwrap()).enumerate() {
        assert_row(
            r,
            &numbers(&c["ids"]),
            &numbers(&c["mask"]),
            &format!("record {k}"),
        );
    }
    // the same records as parquet (a list of structs for the messages) give the same rows
    for (toml, n) in [("t.toml", 40), ("pc.toml", 10)] {
        let text = std::fs::read_to_string(d.path().join(toml)).unwrap();
        let pq = text
            .replace(".jsonl", ".parquet")
            .replace("kind = \"jsonl\"", "kind = \"parquet\"");
        write(d.path(), "pq.toml", &pq);
        let a = preview(d.path(), toml, n);
        let b = preview(d.path(), "pq.toml", n);
        assert_eq!(a, b, "{toml} as parquet");
    }
    let (loss, tokens) = (
        want["loss"].as_f64().unwrap(),
        want["tokens"].as_u64().unwrap(),
    );
    // a run that changes nothing (lr 0): kiln sample --chat greedy is transformers' generate
    let o = kiln(
        d.path(),
        &[
            "run",
            "t.toml",
            "--quiet",
            "--set",
            "experiment.name=\"chat\"",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let run = d.path().join("runs/chat");
    let o = kiln(
        d.path(),
        &[
            "sample",
            run.to_str().unwrap(),
            "--chat",
            "w9 w10 w11",
            "--system",
            "w40 w41",
            "--temperature",
            "0",
            "--tokens",
            "12",
            "--ids",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let got: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(
        got, want["generated"],
        "kiln sample --chat vs transformers' generate"
    );
    // `--chat -`: a turn per line of stdin, each reply on a line of its own
    let run_dir = run.to_str().unwrap();
    let o = crate::common::kiln_stdin(
        d.path(),
        &[
            "sample",
            run_dir,
            "--chat",
            "-",
            "--temperature",
            "0",
            "--tokens",
            "4",
        ],
        b"w9 w10\n\nw11\n",
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim_end().lines().count(), 2, "{}", stdout(&o));
    // with --ids, each turn's ids on a line; an empty message is exit 2
    let o = crate::common::kiln_stdin(
        d.path(),
        &[
            "sample",
            run_dir,
            "--chat",
            "-",
            "--temperature",
            "0",
            "--tokens",
            "3",
            "--ids",
        ],
        b"w9 w10\nw11\n",
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let lines: Vec<String> = stdout(&o).lines().map(str::to_string).collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    for l in &lines {
        let ids: Vec<u32> = serde_json::from_str(l).unwrap();
        assert!(!ids.is_empty() && ids.len() <= 3, "{l}");
    }
    let o = kiln(d.path(), &["sample", run.to_str().unwrap(), "--chat", " "]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--chat: give a message"),
        "{}",
        stderr(&o)
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
        assert_eq!(s["eval_samples"], tokens, "packing = {packing}");
        let got = s["eval_loss"].as_f64().unwrap();
        assert!(
            (got - loss).abs() <= 1e-4,
            "packing = {packing}: kiln {got} vs transformers {loss}"
        );
    }
}

const GPT: &str = r#"
[experiment]
seed = 5

[model]
kind = "gpt"
vocab_size = 300
block_size = 48
layers = 2
heads = 2
dim = 32

[data]
kind = "jsonl"
path = "FIX/chats.jsonl"
eval_path = "FIX/chats.jsonl"
tokenizer = "FIX/tokenizer.json"

[train]
max_steps = 3
batch_size = 8

[optim]
kind = "adamw"
lr = 0.003

[backend]
threads = 1
"#;

/// Rows of conversations hold different numbers of trained tokens: the loss is a mean over the
/// global batch's trained tokens, so batch 8 == 4 x accumulation 2 == ddp(2) x 4 within 1e-5;
/// `data.train_on_prompt` trains on more of them; a conversation longer than a row is
/// truncated or left out.
#[test]
fn chat_data_trains_to_a_mean_over_the_global_batchs_trained_tokens() {
    let t = GPT.replace("FIX", fixture().to_str().unwrap());
    let single = train_task(&t, &["train.batch_size=8"]);
    for sets in [
        vec!["train.batch_size=4", "train.grad_accum_steps=2"],
        vec![
            "train.batch_size=4",
            "strategy.kind=ddp",
            "strategy.devices=2",
        ],
    ] {
        let other = train_task(&t, &sets);
        let scale = single
            .params
            .iter()
            .fold(0f32, |m, v| m.max(v.abs()))
            .max(1e-12);
        let diff = crate::common::max_diff(&single.params, &other.params) / scale;
        assert!(diff < 1e-5, "{sets:?}: relative difference {diff}");
        assert_eq!(single.eval.2, other.eval.2);
    }
    // on the prompt too: more tokens are evaluated
    let all = train_task(&t, &["data.train_on_prompt=true"]);
    assert!(
        all.eval.2 > 2 * single.eval.2,
        "{} vs {}",
        all.eval.2,
        single.eval.2
    );
    // rows of 48: some conversations are longer; dropped, fewer tokens are evaluated
    let dropped = train_task(&t, &["data.truncation=\"drop\""]);
    assert!(
        dropped.eval.2 < single.eval.2,
        "{} vs {}",
        dropped.eval.2,
        single.eval.2
    );
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", &t);
    let o = kiln(d.path(), &["data", "stats", "t.toml"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.contains("target tokens have a loss")
            && text.contains("records longer than a row of 49 tokens:"),
        "{text}"
    );
    // the run log names the first one truncated
    let o = kiln(
        d.path(),
        &[
            "run",
            "t.toml",
            "--quiet",
            "--set",
            "experiment.name=\"cut\"",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let log = std::fs::read_to_string(d.path().join("runs/cut/logs/rank-0.log")).unwrap();
    assert!(
        log.contains("chats.jsonl: line ")
            && log.contains("is longer than a row of 49 tokens: truncated to a row"),
        "{log}"
    );
}

/// Bad conversations and templates: exit 2 naming the file, the line and what to fix.
#[test]
fn bad_conversations_and_templates_exit_2_naming_file_and_line() {
    let d = kiln::testdir::tempdir().unwrap();
    let fix = fixture();
    let t = GPT
        .replace("FIX/chats.jsonl", "chats.jsonl")
        .replace("FIX", fix.to_str().unwrap());
    let good = std::fs::read_to_string(fix.join("chats.jsonl")).unwrap();
    let first = good.lines().next().unwrap();
    for (line2, want) in [
        (
            r#"{"conversation": []}"#,
            "line 2: the record has no `messages` (data.messages_field)",
        ),
        (
            r#"{"messages": "hi"}"#,
            "line 2: `messages` (data.messages_field) is a string, not a list of messages",
        ),
        (
            r#"{"messages": [{"content": "hi"}]}"#,
            "line 2: message 0 of `messages` has no `role`",
        ),
        (
            r#"{"messages": [{"role": "tool", "content": "w9"}]}"#,
            "roles are user and assistant, not tool",
        ),
    ] {
        write(d.path(), "chats.jsonl", &format!("{first}\n{line2}\n"));
        write(d.path(), "t.toml", &t);
        let o = kiln(d.path(), &["check", "t.toml"]);
        // (line 2 is read when the run reaches it: check reads the first record of each
        // shard and the first row, so a run is what finds it)
        let o = if o.status.code() == Some(0) {
            kiln(d.path(), &["run", "t.toml", "--quiet"])
        } else {
            o
        };
        assert_eq!(o.status.code(), Some(2), "{line2}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(
            e.contains("chats.jsonl") && e.contains(want),
            "{line2}: {e}"
        );
    }
    // a template that does not parse, and conversations without any template
    write(d.path(), "chats.jsonl", &good);
    write(
        d.path(),
        "bad.jinja",
        "{% for m in messages %}{{ m.content }",
    );
    let o = kiln(
        d.path(),
        &[
            "check",
            "t.toml",
            "--set",
            "data.chat_template=\"bad.jinja\"",
        ],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("bad.jinja (data.chat_template): not a template kiln can read"),
        "{}",
        stderr(&o)
    );
    let o = kiln(
        d.path(),
        &[
            "check",
            "t.toml",
            "--set",
            "data.tokenizer=\"bytes\"",
            "--set",
            "model.vocab_size=300",
        ],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("has no chat template") && stderr(&o).contains("data.chat_template"),
        "{}",
        stderr(&o)
    );
}
