//! Llama-family models and Hugging Face directories. `tests/fixtures/hf-llama` is a small
//! `LlamaForCausalLM` that transformers initialised and saved as sharded safetensors
//! (`scripts/make-hf-llama-fixture.py`: 4 heads over 2 key/value heads, Llama 3's rope scaling,
//! an untied head), with its logits and loss on fixed ids and its greedy continuation of a
//! prompt: kiln loads the directory (with its keys written out, or with only `kind` and
//! `init_from`) and computes the same loss and the same greedy ids; its export is what
//! transformers loads (`scripts/check-hf-llama.py`); a llama trains to the same result under
//! every strategy and resumes to the bit.

use std::path::Path;

use burn::backend::{Autodiff, Flex};
use kiln::data::Values;
use kiln::model::ComputeOn;

use crate::common::{kiln, loss_lines, resume_copy, root, stderr, stdout, summary, write};
use crate::hf::next_token_loss;

fn fixture() -> std::path::PathBuf {
    root().join("tests/fixtures/hf-llama")
}

/// The fixture's (ids 2 x 32, logits 2 x 32 x 300, loss, prompt ids, greedy ids).
fn expected() -> (Vec<u32>, Vec<f32>, f64, Vec<u32>, Vec<u32>) {
    let bytes = std::fs::read(fixture().join("expected.safetensors")).unwrap();
    let f = kiln::checkpoint::tensors::decode(&bytes).unwrap();
    let ids = |n: &str| -> Vec<u32> { f.get(n).unwrap().data.iter().map(|&v| v as u32).collect() };
    let meta: serde_json::Value = serde_json::from_str(&f.metadata["expected"]).unwrap();
    let loss = meta["loss"].as_str().unwrap().parse().unwrap();
    (
        ids("ids"),
        f.get("logits").unwrap().data.clone(),
        loss,
        ids("prompt"),
        ids("greedy"),
    )
}

/// An experiment `llama.toml` in `dir` starting from `init_from` (its keys written out, or only
/// `kind`), on the fixture's ids as a token file; SGD with lr 0 keeps the weights as loaded.
fn experiment(dir: &Path, init_from: &Path, written_out: bool) {
    let (ids, ..) = expected();
    let bytes: Vec<u8> = ids.iter().flat_map(|&i| (i as u16).to_le_bytes()).collect();
    std::fs::write(dir.join("ids.bin"), bytes).unwrap();
    let keys = if written_out {
        "vocab_size = 300\nblock_size = 32\nlayers = 2\nheads = 4\nkv_heads = 2\ndim = 32\nffn_dim = 64\nrope_theta = 10000.0\nnorm_eps = 1e-5\ntie_embeddings = false\nrope_scaling = { rope_type = \"llama3\", factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0, original_max_position_embeddings = 16 }\n"
    } else {
        ""
    };
    write(
        dir,
        "llama.toml",
        &format!(
            "[model]\nkind = \"llama\"\n{keys}init_from = \"{}\"\n\n[data]\nkind = \"tokens\"\npath = \"ids.bin\"\neval_fraction = 0.0\n\n[train]\nbatch_size = 1\nmax_steps = 1\n\n[optim]\nkind = \"sgd\"\nlr = 0.0\n\n[backend]\nthreads = 1\n",
            init_from.display()
        ),
    );
}

/// The model of `llama.toml` in `dir` and the parameters its `init_from` gives.
fn loaded(dir: &Path) -> (kiln::model::SharedModel, Vec<f32>) {
    let r = kiln::config::load(&dir.join("llama.toml"), &[], &[]).unwrap();
    let model = kiln::model::build(&r, &[33]).unwrap();
    let params = kiln::launch::init_weights(&r, model.as_ref())
        .unwrap()
        .unwrap();
    (model, params)
}

#[test]
fn a_transformers_llama_gives_its_logits_and_loss_with_or_without_its_keys_written_out() {
    let (ids, want, loss, ..) = expected();
    for written in [true, false] {
        let d = kiln::testdir::tempdir().unwrap();
        experiment(d.path(), &fixture(), written);
        let (model, params) = loaded(d.path());
        for fused in [true, false] {
            let compute =
                <Autodiff<Flex> as ComputeOn>::compute(model.as_ref(), &Default::default(), fused);
            let logits = compute
                .logits(&params, &Values::Tokens(ids.clone()), &[2, 32])
                .unwrap();
            let ours = next_token_loss(&logits, &ids, 2, 300);
            assert!(
                (ours - loss).abs() < 1e-4,
                "written {written}, fused {fused}: loss {ours} vs transformers {loss}"
            );
            let diff = logits
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(
                diff < 1e-4,
                "written {written}, fused {fused}: logits differ by {diff}"
            );
        }
        // with only `kind` and `init_from`, kiln check names config.json as the keys' source
        if !written {
            let o = kiln(d.path(), &["check", "llama.toml"]);
            let out = String::from_utf8_lossy(&o.stdout).to_string();
            let line = out
                .lines()
                .find(|l| l.starts_with("kv_heads = 2"))
                .unwrap_or_default();
            assert!(line.ends_with("hf-llama/config.json"), "{out}");
        }
    }
}

#[test]
fn greedy_ids_export_and_reload_are_transformers_own() {
    let (_, _, _, prompt, greedy) = expected();
    let d = kiln::testdir::tempdir().unwrap();
    experiment(d.path(), &fixture(), false);
    let o = kiln(
        d.path(),
        &["run", "llama.toml", "--quiet", "--run-dir", "run"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let prompt: Vec<String> = prompt.iter().map(u32::to_string).collect();
    let prompt_list = prompt.join(",");
    for cache in [true, false] {
        let mut args = vec![
            "sample",
            "run",
            "--prompt-ids",
            &prompt_list,
            "--ids",
            "--temperature",
            "0",
            "--tokens",
            "20",
        ];
        if !cache {
            args.push("--no-cache");
        }
        let o = kiln(d.path(), &args);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let ids: Vec<u32> = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(ids, greedy, "KV cache {cache}");
    }
    // exported as sharded safetensors (60 KB shards: three of them) with transformers' index
    let probe = d.path().join("probe.safetensors");
    let o = kiln(
        d.path(),
        &[
            "export",
            "run",
            "--format",
            "hf-llama",
            "-o",
            "out",
            "--max-shard-size",
            "60KB",
            "--probe",
            probe.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = d.path().join("out");
    for f in [
        "config.json",
        "generation_config.json",
        "model.safetensors.index.json",
        "model-00003-of-00003.safetensors",
    ] {
        assert!(out.join(f).is_file(), "{f}");
    }
    let (_, before) = loaded(d.path());
    let back = kiln::testdir::tempdir().unwrap();
    experiment(back.path(), &out, false);
    let (_, after) = loaded(back.path());
    assert!(before == after, "the export loads back to the same bits");
    // transformers loads it with no missing or unexpected keys, to kiln's loss and greedy ids
    let python = crate::common::torch_python();
    let o = std::process::Command::new(python)
        .arg(root().join("scripts/check-hf-llama.py"))
        .args([
            out.to_str().unwrap(),
            probe.to_str().unwrap(),
            "--prompt",
            &prompt.join(","),
            "--greedy",
            &greedy
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(","),
        ])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        stderr(&o)
    );
}

#[test]
fn config_json_disagreements_and_broken_directories_are_exit_2_naming_them() {
    let d = kiln::testdir::tempdir().unwrap();
    experiment(d.path(), &fixture(), false);
    // a key set in [model] that config.json says otherwise: both values and both sources
    let o = kiln(d.path(), &["check", "llama.toml", "--set", "model.heads=8"]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    for want in [
        "`model.heads` = 8",
        "--set",
        "config.json says 4",
        "hf-llama/config.json",
    ] {
        assert!(e.contains(want), "wants `{want}` in: {e}");
    }
    // another kind: the same
    let o = kiln(
        d.path(),
        &["check", "llama.toml", "--set", "model.kind=\"gpt\""],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("`model.kind` = \"gpt\""),
        "{}",
        stderr(&o)
    );
    // a copy whose index names a shard outside it, or a tensor its shard lacks
    let copy = d.path().join("copy");
    crate::common::copy_dir(&fixture(), &copy);
    let index = copy.join("model.safetensors.index.json");
    let text = std::fs::read_to_string(&index).unwrap();
    for (from, to, want) in [
        (
            "\"model-00001-of-00003.safetensors\"",
            "\"../model-00001-of-00003.safetensors\"",
            "not a regular file in",
        ),
        (
            "\"lm_head.weight\": \"model-00003",
            "\"lm_head.weight\": \"model-00002",
            "not in the shard it names",
        ),
    ] {
        std::fs::write(&index, text.replacen(from, to, 1)).unwrap();
        let o = kiln(
            d.path(),
            &[
                "run",
                "llama.toml",
                "--quiet",
                "--set",
                &format!("model.init_from=\"{}\"", copy.display()),
            ],
        );
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{e}");
        assert!(
            e.contains(want) && e.contains("model.safetensors.index.json"),
            "wants `{want}` in: {e}"
        );
    }
    std::fs::write(&index, &text).unwrap();
    // shards that are links to regular files (the hub cache's snapshots) load
    let blob = d.path().join("blob");
    std::fs::rename(copy.join("model-00001-of-00003.safetensors"), &blob).unwrap();
    std::os::unix::fs::symlink(&blob, copy.join("model-00001-of-00003.safetensors")).unwrap();
    let o = kiln(
        d.path(),
        &[
            "check",
            "llama.toml",
            "--set",
            &format!("model.init_from=\"{}\"", copy.display()),
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = kiln(
        d.path(),
        &[
            "run",
            "llama.toml",
            "--quiet",
            "--run-dir",
            "linked",
            "--set",
            &format!("model.init_from=\"{}\"", copy.display()),
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    std::fs::remove_file(copy.join("model-00002-of-00003.safetensors")).unwrap();
    let o = kiln(
        d.path(),
        &[
            "run",
            "llama.toml",
            "--quiet",
            "--set",
            &format!("model.init_from=\"{}\"", copy.display()),
        ],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("model-00002-of-00003.safetensors"),
        "{}",
        stderr(&o)
    );
}

/// A small llama on text, with grouped-query attention.
const LLAMA: &str = r#"
[experiment]
seed = 7

[model]
kind = "llama"
vocab_size = 256
block_size = 32
layers = 2
heads = 4
kv_heads = 2
dim = 32
ffn_dim = 48

[data]
kind = "text"
path = "corpus.txt"
eval_fraction = 0.2

[train]
max_steps = 3

[optim]
kind = "adamw"
lr = 0.003

[backend]
threads = 1
"#;

#[test]
fn a_llama_agrees_across_strategies_and_checkpointing_and_resumes_to_the_bit() {
    let d = kiln::testdir::tempdir().unwrap();
    crate::models::corpus(d.path());
    let task = LLAMA.replace("corpus.txt", d.path().join("corpus.txt").to_str().unwrap());
    crate::units::strategies_agree(&task, 2, &[]);
    crate::units::strategies_agree(&task, 2, &["model.tie_embeddings=true"]);
    // resume from step 2 of 4 under fsdp(2) by layer with checkpointing: the same bits
    write(d.path(), "llama.toml", &task);
    let sets = [
        "train.max_steps=4",
        "checkpoint.every_steps=2",
        "strategy.kind=\"fsdp\"",
        "strategy.devices=2",
        "strategy.unit=\"layer\"",
        "train.activation_checkpointing=\"units\"",
        "train.log_every=1",
    ];
    let mut args = vec!["run", "llama.toml", "--quiet", "--run-dir", "full"];
    for s in &sets {
        args.extend(["--set", s]);
    }
    let o = kiln(d.path(), &args);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let full = d.path().join("full");
    let resumed = resume_copy(d.path(), &full, "step-00000002", &[]);
    assert_eq!(loss_lines(&resumed), loss_lines(&full));
    assert_eq!(
        summary(&full)["params_sha256"],
        summary(&resumed)["params_sha256"]
    );
    // fsdp(2) holds half of ddp(2)'s parameters and optimizer state on each rank
    let state = |kind: &str| {
        let t = crate::common::train_task(
            &task,
            &[
                &format!("strategy.kind={kind}"),
                "strategy.devices=2",
                "train.max_steps=1",
            ],
        );
        t.memory
            .iter()
            .map(|m| m.params_bytes + m.optim_bytes)
            .max()
            .unwrap() as f64
    };
    let ratio = state("fsdp") / state("ddp");
    assert!(
        (0.49..0.52).contains(&ratio),
        "fsdp / ddp model state per rank: {ratio}"
    );
}

/// A tokenizer.json beside the weights is the run's tokenizer when `data.tokenizer` is not set
/// (`kiln check` names where it came from), and `kiln tokenize --tokenizer DIR` reads it.
#[test]
fn the_tokenizer_json_beside_the_weights_is_used_unless_one_is_set() {
    let d = kiln::testdir::tempdir().unwrap();
    let dir = d.path().join("model");
    crate::common::copy_dir(&fixture(), &dir);
    let vocab: Vec<String> = (0..200).map(|i| format!("\"w{i}\":{i}")).collect();
    let json = format!(
        r#"{{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,"pre_tokenizer":{{"type":"Whitespace"}},"post_processor":null,"decoder":null,"model":{{"type":"WordLevel","vocab":{{{},"[UNK]":200}},"unk_token":"[UNK]"}}}}"#,
        vocab.join(",")
    );
    std::fs::write(dir.join("tokenizer.json"), &json).unwrap();
    // the model's special tokens, which the export carries over
    let config = std::fs::read_to_string(dir.join("config.json")).unwrap();
    std::fs::write(
        dir.join("config.json"),
        config.replace("\"eos_token_id\": null", "\"eos_token_id\": 7"),
    )
    .unwrap();
    let text: Vec<String> = (0..2000).map(|i| format!("w{}", (i * 7) % 200)).collect();
    std::fs::write(d.path().join("words.txt"), text.join(" ")).unwrap();
    write(
        d.path(),
        "t.toml",
        &format!(
            "[model]\nkind = \"llama\"\ninit_from = \"{}\"\n\n[data]\nkind = \"text\"\npath = \"words.txt\"\n\n[train]\nmax_steps = 1\nbatch_size = 2\n\n[backend]\nthreads = 1\n",
            dir.display()
        ),
    );
    let o = kiln(d.path(), &["check", "t.toml"]);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let line = out
        .lines()
        .find(|l| l.starts_with("tokenizer = "))
        .unwrap_or_default();
    assert!(
        line.contains("tokenizer.json (beside model.init_from)"),
        "{out}"
    );
    let o = kiln(d.path(), &["run", "t.toml", "--quiet", "--run-dir", "run"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // one word, one token: 2 x 33 tokens of words
    let o = kiln(
        d.path(),
        &[
            "sample",
            "run",
            "--prompt",
            "w1 w2",
            "--tokens",
            "3",
            "--temperature",
            "0",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // the export carries the tokenizer and the special tokens
    let o = kiln(
        d.path(),
        &["export", "run", "--format", "hf-llama", "-o", "out"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        std::fs::read_to_string(d.path().join("out/tokenizer.json")).unwrap(),
        json
    );
    assert_eq!(
        std::fs::read(d.path().join("out/generation_config.json")).unwrap(),
        std::fs::read(dir.join("generation_config.json")).unwrap()
    );
    let exported: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.path().join("out/config.json")).unwrap()).unwrap();
    assert_eq!(exported["eos_token_id"], 7);
    // a tokenizer set in [data] wins
    let o = kiln(
        d.path(),
        &["check", "t.toml", "--set", "data.tokenizer=\"bytes\""],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(!String::from_utf8_lossy(&o.stdout).contains("beside model.init_from"));
    let o = kiln(
        d.path(),
        &[
            "tokenize",
            "words.txt",
            "-o",
            "w.bin",
            "--tokenizer",
            dir.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        std::fs::metadata(d.path().join("w.bin")).unwrap().len(),
        2000 * 2
    );
}

/// A tokenizer.json of 200 words (`w0` .. `w199`), one token each.
fn word_tokenizer() -> String {
    let vocab: Vec<String> = (0..200).map(|i| format!("\"w{i}\":{i}")).collect();
    format!(
        r#"{{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,"pre_tokenizer":{{"type":"Whitespace"}},"post_processor":null,"decoder":null,"model":{{"type":"WordLevel","vocab":{{{},"[UNK]":200}},"unk_token":"[UNK]"}}}}"#,
        vocab.join(",")
    )
}

/// `exp/base` (the fixture with a tokenizer.json), `exp/words.txt` and `exp/sw.toml` starting
/// from `base` by a relative path, under `d`.
fn relative_experiment(d: &Path) -> std::path::PathBuf {
    let exp = d.join("exp");
    crate::common::copy_dir(&fixture(), &exp.join("base"));
    std::fs::write(exp.join("base/tokenizer.json"), word_tokenizer()).unwrap();
    let text: Vec<String> = (0..2000).map(|i| format!("w{}", (i * 7) % 200)).collect();
    std::fs::write(exp.join("words.txt"), text.join(" ")).unwrap();
    write(
        &exp,
        "sw.toml",
        "[model]\nkind = \"llama\"\ninit_from = \"base\"\n\n[data]\nkind = \"text\"\npath = \"words.txt\"\n\n[train]\nmax_steps = 2\nbatch_size = 2\n\n[checkpoint]\nevery_steps = 1\n\n[backend]\nthreads = 1\n",
    );
    exp
}

/// Issue 58, defect 1: one experiment reached by three spellings of its file (`sw.toml`, its
/// absolute path, `../exp/sw.toml` from another directory) has one config hash, with a
/// relative init_from, the tokenizer.json found beside it and a relative data path (the
/// tokenizer's path entered the hash as the file was spelled).
#[test]
fn one_experiment_has_one_config_hash_however_its_file_is_spelled() {
    let d = kiln::testdir::tempdir().unwrap();
    let exp = relative_experiment(d.path());
    let other = d.path().join("other");
    std::fs::create_dir(&other).unwrap();
    let abs = exp.join("sw.toml").display().to_string();
    let hash = |cwd: &Path, file: &str| {
        let o = kiln(cwd, &["check", file]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let out = String::from_utf8_lossy(&o.stdout).to_string();
        out.split("config hash ")
            .nth(1)
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|| panic!("no config hash in {out}"))
    };
    let a = hash(&exp, "sw.toml");
    let b = hash(d.path(), &abs);
    let c = hash(&other, "../exp/sw.toml");
    assert_eq!((&a, &b), (&c, &c));
}

/// Issue 58, defects 11 and 13: an export into the directory the run started from is refused
/// (it replaced the pretrained weights, exit 0), and that directory's config.json changing
/// after the run started no longer stops resume, sample or export (the run's config.toml is
/// its truth).
#[test]
fn the_init_directory_is_never_exported_over_and_its_later_changes_do_not_stop_the_run() {
    let d = kiln::testdir::tempdir().unwrap();
    let exp = relative_experiment(d.path());
    let base = exp.join("base");
    let o = kiln(&exp, &["run", "sw.toml", "--quiet", "--run-dir", "run"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let before = std::fs::read_dir(&base).unwrap().count();
    let shards: Vec<Vec<u8>> = [
        "model-00001-of-00003.safetensors",
        "model.safetensors.index.json",
    ]
    .iter()
    .filter_map(|n| std::fs::read(base.join(n)).ok())
    .collect();
    for out in ["base", "./base/", &base.display().to_string()] {
        let o = kiln(&exp, &["export", "run", "--format", "hf-llama", "-o", out]);
        assert_eq!(o.status.code(), Some(2), "{out}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("is the directory this run was initialised from"),
            "{}",
            stderr(&o)
        );
    }
    assert_eq!(std::fs::read_dir(&base).unwrap().count(), before);
    let after: Vec<Vec<u8>> = [
        "model-00001-of-00003.safetensors",
        "model.safetensors.index.json",
    ]
    .iter()
    .filter_map(|n| std::fs::read(base.join(n)).ok())
    .collect();
    assert_eq!(shards, after);
    // the base's config.json changes (another layer count): the run goes on as it started
    let config = std::fs::read_to_string(base.join("config.json")).unwrap();
    let changed = config.replace("\"num_hidden_layers\": 2", "\"num_hidden_layers\": 3");
    assert_ne!(
        config, changed,
        "the fixture's config.json has no num_hidden_layers of 2"
    );
    std::fs::write(base.join("config.json"), changed).unwrap();
    let o = kiln(
        &exp,
        &["resume", "run", "--quiet", "--set", "train.max_steps=3"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = kiln(
        &exp,
        &[
            "sample",
            "run",
            "--prompt",
            "w1 w2",
            "--tokens",
            "2",
            "--temperature",
            "0",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = kiln(
        &exp,
        &["export", "run", "--format", "hf-llama", "-o", "out"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

/// The float dtype of every tensor of a Hugging Face directory's weights.
fn weight_dtypes(dir: &Path) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "safetensors") {
            let bytes = std::fs::read(&p).unwrap();
            let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
            let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
            for (k, v) in header.as_object().unwrap() {
                if k != "__metadata__" {
                    out.insert(v["dtype"].as_str().unwrap().to_string());
                }
            }
        }
    }
    out
}

/// Issue 58, defect 23: `kiln export --dtype bf16|f16|f32`, and by default the dtype of the
/// weights the run started from (a bf16 model came back as f32, twice its size); config.json's
/// `torch_dtype` says it.
#[test]
fn an_export_keeps_the_dtype_it_started_from_or_the_one_asked() {
    let d = kiln::testdir::tempdir().unwrap();
    let exp = relative_experiment(d.path());
    let o = kiln(&exp, &["run", "sw.toml", "--quiet", "--run-dir", "run"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let size = |dir: &Path| -> u64 {
        std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
            .map(|e| e.metadata().unwrap().len())
            .sum()
    };
    let o = kiln(
        &exp,
        &["export", "run", "--format", "hf-llama", "-o", "f32"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(weight_dtypes(&exp.join("f32")), ["F32".to_string()].into());
    let o = kiln(
        &exp,
        &[
            "export", "run", "--format", "hf-llama", "-o", "bf16", "--dtype", "bf16",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("bytes of bf16"), "{}", stdout(&o));
    assert_eq!(
        weight_dtypes(&exp.join("bf16")),
        ["BF16".to_string()].into()
    );
    let (a, b) = (size(&exp.join("f32")), size(&exp.join("bf16")));
    assert!(b * 2 <= a + 4096 && b * 2 >= a - 4096, "{a} vs {b}");
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(exp.join("bf16/config.json")).unwrap()).unwrap();
    assert_eq!(config["torch_dtype"], "bfloat16");
    // a run from the bf16 model exports bf16 unless told otherwise
    std::fs::copy(
        exp.join("base/tokenizer.json"),
        exp.join("bf16/tokenizer.json"),
    )
    .unwrap();
    let text = std::fs::read_to_string(exp.join("sw.toml"))
        .unwrap()
        .replace("init_from = \"base\"", "init_from = \"bf16\"");
    write(&exp, "from-bf16.toml", &text);
    let o = kiln(
        &exp,
        &["run", "from-bf16.toml", "--quiet", "--run-dir", "run2"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = kiln(
        &exp,
        &["export", "run2", "--format", "hf-llama", "-o", "again"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        weight_dtypes(&exp.join("again")),
        ["BF16".to_string()].into()
    );
    let o = kiln(
        &exp,
        &[
            "export", "run2", "--format", "hf-llama", "-o", "wide", "--dtype", "f32",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(weight_dtypes(&exp.join("wide")), ["F32".to_string()].into());
}

/// Issue 58, defect 14: what a hostile or broken Hugging Face directory gets, each one message
/// naming the file, the key and the fix that works: no `model_type` (ignored before, defaults
/// applied), a llama3 rope without `factor` ("`model` has the wrong type: found unit"),
/// `max_position_embeddings` that is no count (ignored), a Mistral window of 0 (a shorter
/// window than the block is computed since issue 63), a tokenizer larger than the
/// weights' vocabulary (it advised a `model.vocab_size` config.json then refused), and a shard
/// name with terminal control characters (printed raw).
#[test]
fn hostile_hugging_face_directories_get_one_message_each_and_no_raw_control_characters() {
    let d = kiln::testdir::tempdir().unwrap();
    experiment(d.path(), &fixture(), false);
    let copy = d.path().join("copy");
    crate::common::copy_dir(&fixture(), &copy);
    let config = std::fs::read_to_string(copy.join("config.json")).unwrap();
    let set = format!("model.init_from=\"{}\"", copy.display());
    let check = |edit: &dyn Fn(&str) -> String, want: &[&str]| {
        std::fs::write(copy.join("config.json"), edit(&config)).unwrap();
        let o = kiln(d.path(), &["check", "llama.toml", "--set", &set]);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{e}");
        for w in want {
            assert!(e.contains(w), "wants `{w}` in: {e}");
        }
        assert!(!e.contains("(default)") && !e.contains("found unit"), "{e}");
    };
    check(
        &|c| c.replace("\"model_type\": \"llama\",", ""),
        &["config.json` has no `model_type`"],
    );
    check(
        &|c| c.replace("\"factor\": 8.0,", ""),
        &["`rope_parameters` has rope_type \"llama3\" but no number `factor`"],
    );
    for bad in ["\"32\"", "32.5", "-32"] {
        check(
            &|c| {
                c.replace(
                    "\"max_position_embeddings\": 32",
                    &format!("\"max_position_embeddings\": {bad}"),
                )
            },
            &[
                "`max_position_embeddings` =",
                "is not a positive whole number",
            ],
        );
    }
    check(
        &|c| {
            c.replace(
                "\"model_type\": \"llama\"",
                "\"model_type\": \"mistral\", \"sliding_window\": 0",
            )
        },
        &[
            "`sliding_window` = 0 is not a positive whole number",
            "config.json",
        ],
    );
    // (a Mistral window shorter than the block is computed since issue 63, from config.json)
    std::fs::write(
        copy.join("config.json"),
        config.replace(
            "\"model_type\": \"llama\"",
            "\"model_type\": \"mistral\", \"sliding_window\": 16",
        ),
    )
    .unwrap();
    let o = kiln(d.path(), &["check", "llama.toml", "--set", &set]);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        out.lines()
            .any(|l| l.starts_with("sliding_window = 16") && l.ends_with("config.json")),
        "{out}"
    );
    // a tokenizer of more tokens than the weights have embeddings
    std::fs::write(copy.join("config.json"), &config).unwrap();
    let vocab: Vec<String> = (0..400).map(|i| format!("\"w{i}\":{i}")).collect();
    std::fs::write(
        copy.join("tokenizer.json"),
        format!(
            r#"{{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,"pre_tokenizer":{{"type":"Whitespace"}},"post_processor":null,"decoder":null,"model":{{"type":"WordLevel","vocab":{{{},"[UNK]":400}},"unk_token":"[UNK]"}}}}"#,
            vocab.join(",")
        ),
    )
    .unwrap();
    std::fs::write(d.path().join("words.txt"), "w1 w2 w3 ".repeat(100)).unwrap();
    let o = kiln(
        d.path(),
        &[
            "check",
            "llama.toml",
            "--set",
            &set,
            "--set",
            "data.kind=\"text\"",
            "--set",
            "data.path=\"words.txt\"",
        ],
    );
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(
        e.contains("use the tokenizer that came with the model"),
        "{e}"
    );
    assert!(!e.contains("set `model.vocab_size = 401`"), "{e}");
    std::fs::remove_file(copy.join("tokenizer.json")).unwrap();
    // a shard whose name drives the terminal: escaped wherever it is quoted
    let index = copy.join("model.safetensors.index.json");
    let text = std::fs::read_to_string(&index).unwrap();
    std::fs::write(
        &index,
        text.replacen(
            "\"model-00001-of-00003.safetensors\"",
            "\"model-\\u001b]0;pwned\\u0007.safetensors\"",
            1,
        ),
    )
    .unwrap();
    let o = kiln(d.path(), &["run", "llama.toml", "--quiet", "--set", &set]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let raw = [o.stdout.clone(), o.stderr.clone()].concat();
    assert!(
        !raw.contains(&0x1b) && !raw.contains(&0x07),
        "{}",
        stderr(&o)
    );
    assert!(
        stderr(&o).contains("\\u{1b}]0;pwned\\u{7}"),
        "{}",
        stderr(&o)
    );
}
