//! The decoders kiln's llama family computes besides Llama: Qwen3, Gemma 3 (text, and the
//! language model of a vision-language Gemma 3), Phi-3 and
//! Mixtral. `tests/fixtures/hf-<arch>` are small transformers-initialised directories
//! (`scripts/make-hf-arch-fixtures.py`) with their logits and loss on fixed ids and the greedy
//! continuation of a prompt. With only `model.init_from` set, kiln reads the architecture from
//! config.json, computes transformers' loss (fused kernels and Burn's ops) and greedy ids (with
//! and without the KV cache); `kiln export --format hf` is what `AutoModelForCausalLM` loads, to
//! the same loss and ids; Mixtral trains alike under fsdp(2) and single, its load-balancing
//! loss as transformers computes it; an architecture kiln does not compute is refused in a few
//! lines naming it.

use std::path::{Path, PathBuf};

use burn::backend::{Autodiff, Flex};
use kiln::data::Values;
use kiln::model::ComputeOn;

use crate::common::{kiln, renamed_safetensors, root, stderr, write};
use crate::hf::next_token_loss;

const ARCHS: [&str; 5] = ["qwen3", "gemma3", "gemma3vl", "phi3", "mixtral"];
const VOCAB: usize = 300;
const T: usize = 16;

/// The kind an architecture's directory loads as (`gemma3vl`: a Gemma 3 vision-language
/// model, whose language model is kind `gemma3`).
fn kind_of(arch: &str) -> &str {
    arch.strip_suffix("vl").unwrap_or(arch)
}

fn fixture(arch: &str) -> PathBuf {
    root().join(format!("tests/fixtures/hf-{arch}"))
}

/// A fixture's expected values.
struct Expected {
    ids: Vec<u32>,
    logits: Vec<f32>,
    prompt: Vec<u32>,
    greedy: Vec<u32>,
    meta: serde_json::Value,
}

impl Expected {
    fn of(arch: &str) -> Self {
        let bytes = std::fs::read(fixture(arch).join("expected.safetensors")).unwrap();
        let f = kiln::checkpoint::tensors::decode(&bytes).unwrap();
        let ids =
            |n: &str| -> Vec<u32> { f.get(n).unwrap().data.iter().map(|&v| v as u32).collect() };
        Expected {
            ids: ids("ids"),
            logits: f.get("logits").unwrap().data.clone(),
            prompt: ids("prompt"),
            greedy: ids("greedy"),
            meta: serde_json::from_str(&f.metadata["expected"]).unwrap(),
        }
    }
    fn number(&self, key: &str) -> f64 {
        self.meta[key].as_str().unwrap().parse().unwrap()
    }
}

fn csv(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// `m.toml` in `dir`: only `init_from` in `[model]`, the fixture's ids as a token file, SGD
/// with lr 0 (the weights stay as loaded).
fn experiment(dir: &Path, init_from: &Path, ids: &[u32]) {
    let bytes: Vec<u8> = ids.iter().flat_map(|&i| (i as u16).to_le_bytes()).collect();
    std::fs::write(dir.join("ids.bin"), bytes).unwrap();
    write(
        dir,
        "m.toml",
        &format!(
            "[model]\ninit_from = \"{}\"\n\n[data]\nkind = \"tokens\"\npath = \"ids.bin\"\neval_fraction = 0.0\n\n[train]\nbatch_size = 1\nmax_steps = 1\nlog_every = 1\n\n[optim]\nkind = \"sgd\"\nlr = 0.0\n\n[backend]\nthreads = 1\n",
            init_from.display()
        ),
    );
}

fn loaded(dir: &Path) -> (kiln::model::SharedModel, Vec<f32>) {
    let r = kiln::config::load(&dir.join("m.toml"), &[], &[]).unwrap();
    let model = kiln::model::build(&r, &[T + 1]).unwrap();
    let params = kiln::launch::init_weights(&r, model.as_ref())
        .unwrap()
        .unwrap();
    (model, params)
}

#[test]
fn each_architecture_gives_transformers_loss_from_its_directory_alone() {
    for arch in ARCHS {
        let e = Expected::of(arch);
        let d = kiln::testdir::tempdir().unwrap();
        experiment(d.path(), &fixture(arch), &e.ids);
        let (model, params) = loaded(d.path());
        assert_eq!(model.kind(), kind_of(arch));
        let loss = e.number("loss");
        for fused in [true, false] {
            let compute =
                <Autodiff<Flex> as ComputeOn>::compute(model.as_ref(), &Default::default(), fused);
            let logits = compute
                .logits(&params, &Values::Tokens(e.ids.clone()), &[2, T])
                .unwrap();
            let ours = next_token_loss(&logits, &e.ids, 2, VOCAB);
            let diff = logits
                .iter()
                .zip(&e.logits)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(
                (ours - loss).abs() < 1e-4 && diff < 1e-3,
                "{arch}, fused {fused}: loss {ours} vs transformers {loss}, logits differ by {diff}"
            );
        }
        // kiln check names config.json as the kind's source
        let o = kiln(d.path(), &["check", "m.toml"]);
        let out = String::from_utf8_lossy(&o.stdout).to_string();
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("kind = \"{}\"", kind_of(arch))))
            .unwrap_or_default();
        assert!(line.ends_with(&format!("hf-{arch}/config.json")), "{out}");
    }
}

#[test]
fn greedy_ids_and_the_export_are_transformers_own() {
    let python = crate::common::torch_python();
    for arch in ARCHS {
        let e = Expected::of(arch);
        let d = kiln::testdir::tempdir().unwrap();
        experiment(d.path(), &fixture(arch), &e.ids);
        let o = kiln(d.path(), &["run", "m.toml", "--quiet", "--run-dir", "run"]);
        assert_eq!(o.status.code(), Some(0), "{arch}: {}", stderr(&o));
        let prompt = csv(&e.prompt);
        for cache in [true, false] {
            let mut args = vec![
                "sample",
                "run",
                "--prompt-ids",
                &prompt,
                "--ids",
                "--temperature",
                "0",
                "--tokens",
                "12",
            ];
            if !cache {
                args.push("--no-cache");
            }
            let o = kiln(d.path(), &args);
            assert_eq!(o.status.code(), Some(0), "{arch}: {}", stderr(&o));
            let ids: Vec<u32> = serde_json::from_slice(&o.stdout).unwrap();
            assert_eq!(ids, e.greedy, "{arch}, KV cache {cache}");
        }
        let probe = d.path().join("probe.safetensors");
        let o = kiln(
            d.path(),
            &[
                "export",
                "run",
                "--format",
                "hf",
                "-o",
                "out",
                "--probe",
                probe.to_str().unwrap(),
            ],
        );
        assert_eq!(o.status.code(), Some(0), "{arch}: {}", stderr(&o));
        let out = d.path().join("out");
        // it loads back into kiln to the same bits
        let (_, before) = loaded(d.path());
        let back = kiln::testdir::tempdir().unwrap();
        experiment(back.path(), &out, &e.ids);
        let (_, after) = loaded(back.path());
        assert!(
            before == after,
            "{arch}: the export loads back to the same bits"
        );
        let o = std::process::Command::new(&python)
            .arg(root().join("scripts/check-hf-llama.py"))
            .args([
                out.to_str().unwrap(),
                probe.to_str().unwrap(),
                "--prompt",
                &prompt,
                "--greedy",
                &csv(&e.greedy),
            ])
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{arch}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            stderr(&o)
        );
    }
}

/// The training loss of one window with lr 0: the language-model loss plus
/// `router_aux_loss_coef` x the load-balancing loss, as transformers' `output_router_logits`.
#[test]
fn mixtrals_training_loss_carries_transformers_load_balancing_loss() {
    let e = Expected::of("mixtral");
    let d = kiln::testdir::tempdir().unwrap();
    // one window of the fixture's first row: 15 tokens in, the next 15 as targets
    experiment(d.path(), &fixture("mixtral"), &e.ids[..T]);
    let o = kiln(
        d.path(),
        &[
            "run",
            "m.toml",
            "--quiet",
            "--run-dir",
            "run",
            "--set",
            "model.block_size=15",
            // (config.json's output_router_logits is false, as transformers' default: the
            // router's loss is asked for here, as the fixture's transformers run asked for it)
            "--set",
            "model.router_aux_loss_coef=0.02",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let want = e.number("loss_with_aux");
    let got = crate::common::loss_lines(&d.path().join("run"))[0].1;
    assert!(
        (got - want).abs() < 1e-4,
        "kiln's training loss {got} vs transformers' loss with the router's {want}"
    );
    // metrics.jsonl reports the router's part apart: router_aux_loss_coef (0.02) x aux_loss
    let line = &crate::common::metric_lines(&d.path().join("run"))[0];
    let aux = line["aux_loss"].as_f64().unwrap();
    let want = 0.02 * e.number("aux_loss");
    assert!((aux - want).abs() < 1e-6, "aux_loss {aux} vs {want}");
    // without the set, config.json's output_router_logits = false leaves the loss out
    let o = kiln(
        d.path(),
        &[
            "run",
            "m.toml",
            "--quiet",
            "--run-dir",
            "off",
            "--set",
            "model.block_size=15",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let line = &crate::common::metric_lines(&d.path().join("off"))[0];
    assert_eq!(line["aux_loss"].as_f64(), Some(0.0), "{line}");
    // in bf16 (the router's statistics and loss stay f32)
    let o = kiln(
        d.path(),
        &[
            "run",
            "m.toml",
            "--quiet",
            "--run-dir",
            "bf16",
            "--set",
            "model.block_size=15",
            "--set",
            "model.router_aux_loss_coef=0.02",
            "--set",
            "backend.precision=\"bf16\"",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let bf16 = crate::common::loss_lines(&d.path().join("bf16"))[0].1;
    assert!((bf16 - got).abs() < 0.05, "bf16 loss {bf16} vs f32 {got}");
}

#[test]
fn an_architecture_kiln_does_not_compute_is_one_short_error() {
    let d = kiln::testdir::tempdir().unwrap();
    let dir = d.path().join("neox");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(
        dir.join("config.json"),
        r#"{"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"], "hidden_size": 32}"#,
    )
    .unwrap();
    experiment(d.path(), &dir, &[1, 2, 3]);
    let o = kiln(d.path(), &["run", "m.toml"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.lines().count() <= 6, "{err}");
    assert!(
        err.contains("\"gpt_neox\"")
            && err
                .contains("llama, mistral, qwen2, qwen3, gemma3_text, gemma3, phi3, mixtral, gpt2"),
        "{err}"
    );
}

/// A small Mixtral on text: 4 experts, 2 per token, a load-balancing loss weighed high enough
/// to move the routers.
const MIXTRAL: &str = r#"
[experiment]
seed = 7

[model]
kind = "mixtral"
vocab_size = 256
block_size = 16
layers = 2
heads = 4
kv_heads = 2
dim = 32
ffn_dim = 32
experts = 4
experts_per_token = 2
router_aux_loss_coef = 0.1

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

/// The load-balancing loss is each sample's, so a batch split across ranks (ddp, fsdp by
/// layer, with and without activation checkpointing, hsdp) trains to single's parameters.
#[test]
fn mixtral_agrees_across_strategies_with_its_load_balancing_loss() {
    let d = kiln::testdir::tempdir().unwrap();
    crate::models::corpus(d.path());
    let task = MIXTRAL.replace("corpus.txt", d.path().join("corpus.txt").to_str().unwrap());
    crate::units::strategies_agree(&task, 2, &[]);
    // hsdp: 4 ranks, fsdp within pairs, the pairs replicated
    let single = crate::common::train_task(&task, &["train.batch_size=4"]).params;
    let hsdp = crate::common::train_task(
        &task,
        &[
            "train.batch_size=1",
            "strategy.kind=fsdp",
            "strategy.devices=4",
            "strategy.shard_size=2",
            "strategy.unit=layer",
        ],
    )
    .params;
    let d = crate::common::max_diff(&single, &hsdp);
    assert!(d < 1e-5, "hsdp vs single: {d}");
    // (the loss moves the parameters: without it they differ)
    let with = crate::common::train_task(&task, &["train.batch_size=4"]).params;
    let without = crate::common::train_task(
        &task,
        &["train.batch_size=4", "model.router_aux_loss_coef=0.0"],
    )
    .params;
    assert!(with != without);
}

/// `MIXTRAL` on the jsonl `docs` (written in `dir`), one document a row (`data.packing =
/// false`), in order.
fn mixtral_on_rows(dir: &Path, docs: &str) -> String {
    write(dir, "train.jsonl", docs);
    let task = MIXTRAL.replace(
        "kind = \"text\"\npath = \"corpus.txt\"\neval_fraction = 0.2",
        &format!(
            "kind = \"jsonl\"\npath = \"{0}\"\neval_path = \"{0}\"\npacking = false\n\n[sampler]\nshuffle = false",
            dir.join("train.jsonl").display()
        ),
    );
    assert!(task.contains("jsonl"));
    task
}

/// Rows of documents hold different numbers of targets: the router's loss weighs each row as
/// the cross-entropy weighs its tokens, so single, ddp(2) and accumulation over 4 micro-steps
/// train alike there too.
#[test]
fn mixtrals_load_balancing_loss_is_split_invariant_over_documents() {
    let d = kiln::testdir::tempdir().unwrap();
    let docs: String = (0..12)
        .map(|i| format!("{{\"text\": \"{}\"}}\n", "abcdefgh ".repeat(1 + i % 4)))
        .collect();
    let task = mixtral_on_rows(d.path(), &docs);
    let run = |sets: &[&str]| crate::common::train_task(&task, sets).params;
    let single = run(&["train.batch_size=4"]);
    assert!(single != run(&["train.batch_size=4", "model.router_aux_loss_coef=0.0"]));
    for sets in [
        &[
            "train.batch_size=2",
            "strategy.kind=ddp",
            "strategy.devices=2",
        ][..],
        &["train.batch_size=1", "train.grad_accum_steps=4"][..],
    ] {
        let d = crate::common::max_diff(&single, &run(sets));
        assert!(d < 1e-5, "{sets:?}: {d}");
    }
}

/// Padding is no token of its row's: rows of one document each (`data.packing = false`) train
/// to the same parameters whatever padding follows the document (block 16 or 40: a llama's
/// parameters do not depend on its block), as transformers' `attention_mask` leaves padding out
/// of the router's loss (it was counted: the shorter the document, the smaller its loss).
#[test]
fn mixtrals_load_balancing_loss_leaves_padding_out() {
    let d = kiln::testdir::tempdir().unwrap();
    let docs: String = (0..8)
        .map(|i| format!("{{\"text\": \"{}\"}}\n", "abc ".repeat(1 + i % 3)))
        .collect();
    let task = mixtral_on_rows(d.path(), &docs);
    let run = |sets: &[&str]| crate::common::train_task(&task, sets).params;
    let short = run(&["train.batch_size=4", "model.block_size=16"]);
    let long = run(&["train.batch_size=4", "model.block_size=40"]);
    let d = crate::common::max_diff(&short, &long);
    assert!(d < 1e-6, "block 16 vs 40: {d}");
    // (the router's loss moves the parameters: without it they differ)
    assert!(
        short
            != run(&[
                "train.batch_size=4",
                "model.block_size=16",
                "model.router_aux_loss_coef=0.0"
            ])
    );
}

/// transformers' Phi-3 computes no llama3 or linear rope scaling (its export would not load):
/// `model.rope_scaling` on a phi3 is exit 2 naming the key; the other kinds take it.
#[test]
fn a_rope_scaling_on_phi3_is_refused_naming_the_key() {
    let d = kiln::testdir::tempdir().unwrap();
    let e = Expected::of("phi3");
    experiment(d.path(), &fixture("phi3"), &e.ids);
    let scaling = "model.rope_scaling={ rope_type = \"linear\", factor = 4.0 }";
    let o = kiln(d.path(), &["check", "m.toml", "--set", scaling]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("`model.rope_scaling`") && stderr(&o).contains("Phi-3"),
        "{}",
        stderr(&o)
    );
    let e = Expected::of("qwen3");
    experiment(d.path(), &fixture("qwen3"), &e.ids);
    let o = kiln(d.path(), &["check", "m.toml", "--set", scaling]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

/// transformers 5's `save_pretrained(save_original_format=False)` names a Gemma 3
/// vision-language checkpoint by its modules:
/// `model.language_model.layers...`, `model.vision_tower...`, where the Hub's have
/// `language_model.model.layers...`, `vision_tower...`. Both load to the same weights; a file
/// with one weight under both names is refused.
#[test]
fn a_gemma3_vision_language_checkpoint_under_its_module_names_loads_alike() {
    let e = Expected::of("gemma3vl");
    let d = kiln::testdir::tempdir().unwrap();
    experiment(d.path(), &fixture("gemma3vl"), &e.ids);
    let (_, hub) = loaded(d.path());
    let dir = d.path().join("saved");
    std::fs::create_dir(&dir).unwrap();
    std::fs::copy(
        fixture("gemma3vl").join("config.json"),
        dir.join("config.json"),
    )
    .unwrap();
    let names = renamed_safetensors(
        &fixture("gemma3vl").join("model.safetensors"),
        &dir.join("model.safetensors"),
        |n| match n.strip_prefix("language_model.") {
            Some(rest) if rest.starts_with("model.") => {
                format!("model.language_model.{}", &rest[6..])
            }
            Some(rest) => rest.to_string(),
            None => format!("model.{n}"),
        },
    );
    assert!(names.iter().any(|n| n.starts_with("model.vision_tower.")));
    experiment(d.path(), &dir, &e.ids);
    let (model, theirs) = loaded(d.path());
    assert_eq!(model.kind(), "gemma3");
    assert!(hub == theirs, "the two name forms loaded different weights");
    // one weight under both names is refused, naming both (not one of them kept silently)
    let f = kiln::checkpoint::tensors::decode(
        &std::fs::read(fixture("gemma3vl").join("model.safetensors")).unwrap(),
    )
    .unwrap();
    let norm = f.get("language_model.model.norm.weight").unwrap();
    let mut both: Vec<(&str, &[usize], &[f32])> = f
        .tensors
        .iter()
        .map(|t| (t.name.as_str(), t.shape.as_slice(), t.data.as_slice()))
        .collect();
    both.push(("model.language_model.norm.weight", &norm.shape, &norm.data));
    let bytes = kiln::checkpoint::tensors::encode(&both, f.metadata.clone()).unwrap();
    std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
    let o = kiln(d.path(), &["check", "m.toml"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(
            "holds both `language_model.model.norm.weight` and `model.language_model.norm.weight`"
        ),
        "{}",
        stderr(&o)
    );
}
