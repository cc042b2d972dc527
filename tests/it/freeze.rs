//! `model.freeze` (issue 62): frozen parameters keep their bits under every strategy, get no
//! gradient and no optimizer state (the memory figures say so), the others train to the same
//! parameters whichever strategy runs them, a resumed run has the straight run's bits, and
//! every bad list is exit 2 naming the key.

use crate::common::{code, kiln, max_diff, prepare, stderr, summary, train_task, write};

/// A small llama with untied embeddings, dropout, clipping and accumulation.
pub(crate) const LLAMA: &str = r#"
[experiment]
name = "frozen"
seed = 3

[model]
kind = "llama"
vocab_size = 256
block_size = 8
layers = 3
heads = 2
kv_heads = 1
dim = 16
ffn_dim = 32
tie_embeddings = false
dropout = 0.1
freeze = ["model.embed_tokens.weight", "model.layers.1.*"]

[data]
kind = "synthetic"
samples = 64
eval_samples = 16
vocab = 256

[train]
max_steps = 4
batch_size = 8
grad_accum_steps = 2
eval_every = 4

[optim]
kind = "adamw"
lr = 0.01
weight_decay = 0.1
grad_clip_norm = 0.5

[backend]
threads = 1
"#;

/// The frozen head of the flat buffer keeps the initial bits and the rest moves, under every
/// strategy (single, dp, ddp, fsdp by layer in full and grad_op sharding, HSDP), with
/// activation checkpointing too; every strategy gives single's parameters within 1e-5; the
/// optimizer state is 8 bytes per trainable parameter (AdamW's two moments), none for the
/// frozen ones, and the gradients are of the trainable ones only.
#[test]
fn frozen_parameters_keep_their_bits_under_every_strategy() {
    let p = prepare(LLAMA, &[]);
    let layout = p.model.layout().clone();
    let init = p.model.init(3);
    let frozen = layout.frozen;
    let trainable = layout.num_trainable();
    // the embedding (256 x 16) and layer 1 (two norms of 16 and 4 + 5 matrices)
    let layer = 2 * 16 + 16 * 16 + 2 * 16 * 8 + 16 * 16 + 3 * 16 * 32;
    assert_eq!(frozen, 256 * 16 + layer, "{:?}", layout.params[0]);
    assert_eq!(trainable, layout.num_params() - frozen);
    // frozen at the head, in the module's order
    let names: Vec<&str> = layout.params.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names[0], "embed_tokens.weight");
    assert!(names[1].starts_with("layers.1."), "{names:?}");
    let single = train_task(LLAMA, &[]);
    assert_eq!(
        single.params[..frozen],
        init[..frozen],
        "frozen parameters moved"
    );
    let moved = max_diff(&single.params[frozen..], &init[frozen..]);
    assert!(
        moved > 1e-4,
        "the trainable parameters did not move ({moved})"
    );
    // each trainable tensor moves
    for p in layout.params.iter().filter(|p| p.offset >= frozen) {
        let d = max_diff(&single.params[p.range()], &init[p.range()]);
        assert!(d > 0.0, "{} did not train", p.name);
    }
    let m = &single.memory[0];
    assert_eq!(m.optim_bytes, 8 * trainable, "{m:?}");
    assert_eq!(m.grads_bytes, 4 * trainable, "{m:?}");
    assert_eq!(m.params_bytes, 4 * layout.num_params(), "{m:?}");
    for sets in [
        &[
            "strategy.kind=ddp",
            "strategy.devices=2",
            "train.batch_size=4",
        ][..],
        &[
            "strategy.kind=dp",
            "strategy.devices=2",
            "train.batch_size=4",
        ],
        &[
            "strategy.kind=fsdp",
            "strategy.devices=2",
            "strategy.unit=layer",
            "train.batch_size=4",
        ],
        &[
            "strategy.kind=fsdp",
            "strategy.devices=2",
            "strategy.unit=layer",
            "strategy.sharding=grad_op",
            "train.batch_size=4",
            "train.activation_checkpointing=units",
        ],
        &[
            "strategy.kind=fsdp",
            "strategy.devices=4",
            "strategy.unit=layer",
            "strategy.shard_size=2",
            "train.batch_size=2",
        ],
        &["train.activation_checkpointing=units"],
    ] {
        let t = train_task(LLAMA, sets);
        assert_eq!(t.params[..frozen], init[..frozen], "{sets:?}: frozen moved");
        let d = max_diff(&t.params, &single.params);
        assert!(d <= 1e-5, "{sets:?}: max |diff| vs single = {d}");
        for m in &t.memory {
            assert!(
                m.optim_bytes as f64 <= 8.5 * trainable as f64,
                "{sets:?}: {m:?}"
            );
        }
    }
}

/// Freezing changes what trains, not where anything starts: the frozen model's initial values
/// are the unfrozen model's, parameter by parameter (its layout only reorders them).
#[test]
fn a_frozen_model_starts_from_the_unfrozen_values() {
    let frozen = prepare(LLAMA, &[]);
    let whole = prepare(LLAMA, &["model.freeze=[]"]);
    assert_eq!(whole.model.layout().frozen, 0);
    let (fi, wi) = (frozen.model.init(3), whole.model.init(3));
    for p in &frozen.model.layout().params {
        let q = whole
            .model
            .layout()
            .params
            .iter()
            .find(|q| q.name == p.name)
            .unwrap();
        assert_eq!(fi[p.range()], wi[q.range()], "{}", p.name);
    }
}

/// A tied embedding (gpt) frozen: used by the first and the last stage, it moves in neither;
/// a gpt's names are GPT-2's (`transformer.h.0.attn.c_attn.weight`).
#[test]
fn a_tied_embedding_and_gpt2_names_freeze() {
    let gpt = r#"
[experiment]
seed = 1
[model]
kind = "gpt"
vocab_size = 256
block_size = 8
layers = 2
heads = 2
dim = 16
freeze = ["transformer.wte.weight", "transformer.h.0.attn.*"]
[data]
kind = "synthetic"
samples = 32
vocab = 256
[train]
max_steps = 3
batch_size = 8
[optim]
kind = "adamw"
lr = 0.01
[backend]
threads = 1
"#;
    // the tied output layer's name is the embedding's copy: the error says which to freeze
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "g.toml", gpt);
    let o = kiln(
        d.path(),
        &[
            "check",
            "g.toml",
            "--set",
            "model.freeze=[\"lm_head.weight\"]",
        ],
    );
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("a tied copy of `transformer.wte.weight`"),
        "{}",
        stderr(&o)
    );
    let p = prepare(gpt, &[]);
    let layout = p.model.layout();
    let names: Vec<&str> = layout
        .params
        .iter()
        .filter(|q| q.offset < layout.frozen)
        .map(|q| q.name.as_str())
        .collect();
    // the embedding, c_attn's and c_proj's weight and bias
    assert_eq!(names.len(), 5, "{names:?}");
    assert_eq!(names[0], "wte.weight");
    let init = p.model.init(1);
    for sets in [
        &[][..],
        &[
            "strategy.kind=fsdp",
            "strategy.devices=2",
            "strategy.unit=layer",
            "train.batch_size=4",
        ],
    ] {
        let t = train_task(gpt, sets);
        assert_eq!(t.params[..layout.frozen], init[..layout.frozen], "{sets:?}");
        assert!(max_diff(&t.params, &init) > 1e-4, "{sets:?}");
    }
}

/// A paused and resumed run with frozen parameters (ddp, and fsdp whose checkpoint holds the
/// optimizer state of the trainable units only) ends with the straight run's bits.
#[test]
fn a_resumed_frozen_run_has_the_straight_runs_bits() {
    let dir = kiln::testdir::tempdir().unwrap();
    write(dir.path(), "f.toml", LLAMA);
    for strategy in [
        &[
            "strategy.kind=ddp",
            "strategy.devices=2",
            "train.batch_size=4",
        ][..],
        &[
            "strategy.kind=fsdp",
            "strategy.devices=2",
            "strategy.unit=layer",
            "train.batch_size=4",
        ],
    ] {
        let run = |name: &str, extra: &[&str]| {
            let mut args = vec!["run", "f.toml", "--quiet", "--run-dir", name];
            for s in strategy.iter().chain(extra) {
                args.extend(["--set", s]);
            }
            let o = kiln(dir.path(), &args);
            assert_eq!(code(&o), Some(0), "{strategy:?}: {}", stderr(&o));
        };
        run("straight", &[]);
        run("paused", &["checkpoint.every_steps=2", "train.max_steps=2"]);
        let paused = dir.path().join("paused");
        let o = kiln(
            dir.path(),
            &[
                "resume",
                paused.to_str().unwrap(),
                "--quiet",
                "--set",
                "train.max_steps=4",
            ],
        );
        assert_eq!(code(&o), Some(0), "{strategy:?}: {}", stderr(&o));
        let (a, b) = (summary(&dir.path().join("straight")), summary(&paused));
        assert_eq!(a["params_sha256"], b["params_sha256"], "{strategy:?}");
        assert_eq!(a["trainable_params"], b["trainable_params"]);
        assert!(a["trainable_params"].as_u64() < a["num_params"].as_u64());
        std::fs::remove_dir_all(dir.path().join("straight")).unwrap();
        std::fs::remove_dir_all(&paused).unwrap();
    }
}

/// A glob that matches nothing, one that is not a glob, a list that freezes everything and
/// fsdp's whole-model unit are exit 2 naming the key, before anything is written.
#[test]
fn bad_freeze_lists_are_exit_2_naming_the_key() {
    let dir = kiln::testdir::tempdir().unwrap();
    write(dir.path(), "f.toml", LLAMA);
    for (set, want) in [
        (
            "model.freeze=[\"model.layers.9.*\"]",
            "`model.freeze[0]` = \"model.layers.9.*\" matches no parameter",
        ),
        ("model.freeze=[\"[\"]", "is not a glob"),
        ("model.freeze=[\"*\"]", "freezes every parameter"),
        ("strategy.kind=fsdp", "strategy.unit"),
    ] {
        let o = kiln(dir.path(), &["check", "f.toml", "--set", set]);
        let err = stderr(&o);
        assert_eq!(code(&o), Some(2), "{set}: {err}");
        assert!(err.contains(want), "{set}: {err}");
        assert!(
            err.contains("model.freeze") || err.contains("strategy.unit"),
            "{err}"
        );
        let o = kiln(dir.path(), &["run", "f.toml", "--set", set]);
        assert_eq!(code(&o), Some(2), "{set}: {}", stderr(&o));
        assert!(
            !dir.path().join("runs").exists(),
            "{set}: a run directory was made"
        );
    }
    // kiln check lists the frozen tensors and the counts
    let o = kiln(dir.path(), &["check", "f.toml"]);
    let out = crate::common::stdout(&o);
    assert!(out.contains("trainable"), "{out}");
    assert!(out.contains("#   model.embed_tokens.weight"), "{out}");
    assert!(
        out.contains("#   model.layers.1.mlp.down_proj.weight"),
        "{out}"
    );
}
