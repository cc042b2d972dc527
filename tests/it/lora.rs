//! LoRA (issue 62): PEFT's semantics and format. With PEFT in the project's torch venv
//! (`scripts/torch-up.sh`), `scripts/check-peft.py` loads kiln's adapter export and gets
//! kiln's logits and loss, finds kiln's merged `hf-llama` export equal to `merge_and_unload`,
//! counts the trainable parameters as kiln does, and makes an adapter kiln starts from. The
//! adapters train under every strategy to the same parameters, resume to the bit, and only they
//! move.

use std::path::Path;
use std::process::Command;

use crate::common::{
    code, kiln, max_diff, renamed_safetensors, root, stderr, stdout, summary, torch_python,
    train_task, write,
};

fn fixture() -> std::path::PathBuf {
    root().join("tests/fixtures/hf-llama")
}

fn gpt2_fixture() -> std::path::PathBuf {
    root().join("tests/fixtures/hf-gpt2")
}

const ALL: &str =
    r#"["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]"#;

/// `llama.toml` in `dir`: the Hugging Face fixture with `lora` (a `[model.lora]` body) fine-tuned
/// on token ids below its vocabulary of 300.
fn experiment(dir: &Path, lora: &str, optim: &str) {
    experiment_of(dir, "llama", &fixture(), lora, optim)
}

/// `experiment` of the Hugging Face directory `base`, a model of kiln's `kind`.
fn experiment_of(dir: &Path, kind: &str, base: &Path, lora: &str, optim: &str) {
    let ids: Vec<u8> = (0..600u32)
        .flat_map(|i| (((i * 37 + i / 7) % 300) as u16).to_le_bytes())
        .collect();
    std::fs::write(dir.join("ids.bin"), ids).unwrap();
    write(
        dir,
        "llama.toml",
        &format!(
            "[model]\nkind = \"{kind}\"\ninit_from = \"{}\"\n\n[model.lora]\n{lora}\n\n[data]\nkind = \"tokens\"\npath = \"ids.bin\"\neval_path = \"ids.bin\"\n\n[train]\nbatch_size = 2\nmax_steps = 4\n\n[optim]\n{optim}\n\n[backend]\nthreads = 1\n",
            base.display()
        ),
    );
}

fn run_ok(dir: &Path, args: &[&str]) -> String {
    let o = kiln(dir, args);
    assert_eq!(code(&o), Some(0), "{args:?}: {}", stderr(&o));
    stdout(&o)
}

fn check_peft(args: &[&str]) {
    let py = torch_python();
    let o = Command::new(py)
        .arg(root().join("scripts/check-peft.py"))
        .args(args)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "check-peft.py {args:?}: {out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    eprintln!("check-peft.py: {out}");
}

/// kiln's adapters after AdamW steps (B non-zero): PEFT loads `--format peft` and computes
/// kiln's logits and loss within 1e-4 and generates `kiln sample`'s greedy ids (sampling and
/// `kiln eval` run through the adapters); `--format hf-llama` is `merge_and_unload`'s weights;
/// PEFT counts kiln's trainable parameters; the base weights did not move.
#[test]
fn peft_loads_kilns_adapters_and_merges_as_kiln_exports() {
    let d = kiln::testdir::tempdir().unwrap();
    let dir = d.path();
    experiment(
        dir,
        &format!("rank = 4\nalpha = 8.0\ntargets = {ALL}"),
        "kind = \"adamw\"\nlr = 0.01",
    );
    run_ok(dir, &["run", "llama.toml", "--quiet", "--run-dir", "run"]);
    let s = summary(&dir.join("run"));
    let trainable = s["trainable_params"].as_u64().unwrap();
    // rank 4 over q, k, v, o (32 -> 32, 16, 16, 32) and gate, up, down (32 <-> 64), 2 layers
    assert_eq!(trainable, 2 * 4 * (64 + 48 + 48 + 64 + 96 + 96 + 96));
    let optim = s["memory"][0]["optim_bytes"].as_u64().unwrap();
    assert!(
        optim as f64 <= 8.5 * trainable as f64,
        "{optim} bytes of optimizer state"
    );
    run_ok(
        dir,
        &[
            "export",
            "run",
            "--format",
            "peft",
            "-o",
            "adapter",
            "--probe",
            "probe.safetensors",
        ],
    );
    assert!(dir.join("adapter/adapter_config.json").is_file());
    run_ok(
        dir,
        &["export", "run", "--format", "hf-llama", "-o", "merged"],
    );
    // evaluation and sampling run through the adapters (the cache's path and the whole
    // forward's give the same ids)
    let evaluated = run_ok(dir, &["eval", "run"]);
    assert!(evaluated.contains("loss"), "{evaluated}");
    let greedy: Vec<String> = [true, false]
        .iter()
        .map(|&cache| {
            let mut args = vec![
                "sample",
                "run",
                "--prompt-ids",
                "5,17,42",
                "--ids",
                "--temperature",
                "0",
                "--tokens",
                "8",
            ];
            if !cache {
                args.push("--no-cache");
            }
            let ids: Vec<u32> = serde_json::from_str(&run_ok(dir, &args)).unwrap();
            ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
        })
        .collect();
    assert_eq!(greedy[0], greedy[1]);
    // kiln's own export in PyTorch's names holds the adapters: a run from it starts from them
    // (not from new ones), bit for bit
    run_ok(dir, &["export", "run", "-o", "all.safetensors"]);
    std::fs::copy(fixture().join("config.json"), dir.join("config.json")).unwrap();
    run_ok(
        dir,
        &[
            "run",
            "llama.toml",
            "--quiet",
            "--run-dir",
            "again",
            "--set",
            "model.init_from=\"all.safetensors\"",
            "--set",
            "optim.lr=0",
            "--set",
            "train.max_steps=1",
        ],
    );
    let ckpt = |run: &str| {
        let steps = dir.join(run).join("checkpoints");
        let mut names: Vec<_> = std::fs::read_dir(&steps)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .filter(|n| n.starts_with("step-"))
            .collect();
        names.sort();
        crate::common::checkpoint_params(&dir.join(run), &steps.join(names.last().unwrap()))
    };
    assert_eq!(ckpt("run"), ckpt("again"));
    let base = fixture();
    let trainable = trainable.to_string();
    check_peft(&[
        "check",
        base.to_str().unwrap(),
        "--probe",
        dir.join("probe.safetensors").to_str().unwrap(),
        "--adapter",
        dir.join("adapter").to_str().unwrap(),
        "--merged",
        dir.join("merged").to_str().unwrap(),
        "--trainable",
        &trainable,
        "--rank",
        "4",
        "--alpha",
        "8",
        "--targets",
        "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
        "--prompt",
        "5,17,42",
        "--greedy",
        &greedy[0],
    ]);
}

/// GPT-2 (Conv1D layers, PEFT's `fan_in_fan_out`): PEFT loads kiln's adapters on `c_attn`,
/// both `c_proj` and `c_fc` with kiln's logits, and kiln's merged `hf-gpt2` export is
/// `merge_and_unload`'s.
#[test]
fn peft_loads_a_gpt2_adapter_and_merges_as_kiln_exports() {
    let d = kiln::testdir::tempdir().unwrap();
    let dir = d.path();
    let base = gpt2_fixture();
    experiment_of(
        dir,
        "gpt",
        &base,
        "rank = 4\nalpha = 8.0\ntargets = [\"c_attn\", \"c_proj\", \"c_fc\"]",
        "kind = \"adamw\"\nlr = 0.01",
    );
    std::fs::rename(dir.join("llama.toml"), dir.join("gpt2.toml")).unwrap();
    run_ok(dir, &["run", "gpt2.toml", "--quiet", "--run-dir", "run"]);
    let trainable = summary(&dir.join("run"))["trainable_params"].to_string();
    run_ok(
        dir,
        &[
            "export",
            "run",
            "--format",
            "peft",
            "-o",
            "adapter",
            "--probe",
            "probe.safetensors",
        ],
    );
    run_ok(
        dir,
        &["export", "run", "--format", "hf-gpt2", "-o", "merged"],
    );
    let config = std::fs::read_to_string(dir.join("adapter/adapter_config.json")).unwrap();
    assert!(config.contains("\"fan_in_fan_out\": true"), "{config}");
    check_peft(&[
        "check",
        base.to_str().unwrap(),
        "--probe",
        dir.join("probe.safetensors").to_str().unwrap(),
        "--adapter",
        dir.join("adapter").to_str().unwrap(),
        "--merged",
        dir.join("merged").to_str().unwrap(),
        "--trainable",
        &trainable,
        "--rank",
        "4",
        "--alpha",
        "8",
        "--targets",
        "c_attn,c_proj,c_fc",
    ]);
}

/// Runs `llama.toml` in `dir` (an adapter `theirs` in `model.lora.init_from`), exports its
/// adapter as `ours` with a probe, and checks that PEFT gives both on `base` kiln's logits.
fn theirs_and_ours_give_kilns_logits(dir: &Path, base: &Path) {
    run_ok(dir, &["run", "llama.toml", "--quiet", "--run-dir", "run"]);
    run_ok(
        dir,
        &[
            "export",
            "run",
            "--format",
            "peft",
            "-o",
            "ours",
            "--probe",
            "probe.safetensors",
        ],
    );
    for adapter in ["theirs", "ours"] {
        check_peft(&[
            "check",
            base.to_str().unwrap(),
            "--probe",
            dir.join("probe.safetensors").to_str().unwrap(),
            "--adapter",
            dir.join(adapter).to_str().unwrap(),
        ]);
    }
}

/// An adapter PEFT made (A and B non-zero) starts a run through `model.lora.init_from`: with
/// SGD at lr 0 kiln's logits are PEFT's within 1e-4; a mismatching `[model.lora]` is exit 2
/// naming the disagreement.
#[test]
fn a_peft_adapter_starts_a_run_with_pefts_logits() {
    let d = kiln::testdir::tempdir().unwrap();
    let dir = d.path();
    let base = fixture();
    check_peft(&[
        "make",
        base.to_str().unwrap(),
        dir.join("theirs").to_str().unwrap(),
        "--rank",
        "4",
        "--alpha",
        "16",
        "--targets",
        "q_proj,v_proj,down_proj",
    ]);
    let lora = "rank = 4\nalpha = 16.0\ntargets = [\"q_proj\", \"v_proj\", \"down_proj\"]\ninit_from = \"theirs\"";
    experiment(dir, lora, "kind = \"sgd\"\nlr = 0.0");
    theirs_and_ours_give_kilns_logits(dir, &base);
    // `target_modules` as a pattern PEFT matched in full reads too; one that adapts some
    // layers only is exit 2 naming a module it leaves out
    for (targets, code_is) in [
        (
            r"model\.layers\.\d+\.(self_attn\.[qv]_proj|mlp\.down_proj)",
            0,
        ),
        (
            r"model\.layers\.0\.(self_attn\.[qv]_proj|mlp\.down_proj)",
            2,
        ),
    ] {
        let _ = std::fs::remove_dir_all(dir.join("pattern"));
        let out = dir.join("pattern");
        let made = [base.to_str().unwrap(), out.to_str().unwrap()];
        check_peft(&[
            "make",
            made[0],
            made[1],
            "--rank",
            "4",
            "--alpha",
            "16",
            "--targets",
            targets,
        ]);
        let o = kiln(
            dir,
            &[
                "check",
                "llama.toml",
                "--set",
                "model.lora.init_from=\"pattern\"",
            ],
        );
        assert_eq!(code(&o), Some(code_is), "{targets}: {}", stderr(&o));
        if code_is == 2 {
            assert!(
                stderr(&o).contains("leaves out `model.layers.1.self_attn.q_proj`"),
                "{}",
                stderr(&o)
            );
        }
    }
    // another rank or alpha than the adapter's
    for (set, want) in [
        ("model.lora.rank=8", "`r` is 4, `model.lora.rank` = 8"),
        ("model.lora.alpha=8", "`lora_alpha` is 16"),
        ("model.lora.targets=[\"q_proj\"]", "`target_modules`"),
    ] {
        let o = kiln(dir, &["check", "llama.toml", "--set", set]);
        assert_eq!(code(&o), Some(2), "{set}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("model.lora.init_from"),
            "{}",
            stderr(&o)
        );
        assert!(stderr(&o).contains(want), "{set}: {}", stderr(&o));
    }
    // an adapter of what kiln does not compute: trained biases, some layers only
    let path = dir.join("theirs/adapter_config.json");
    let original = std::fs::read_to_string(&path).unwrap();
    let mut config: serde_json::Value = serde_json::from_str(&original).unwrap();
    config["bias"] = "all".into();
    config["layers_to_transform"] = serde_json::json!([0]);
    std::fs::write(&path, config.to_string()).unwrap();
    let o = kiln(dir, &["check", "llama.toml"]);
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    for want in ["`bias` is \"all\"", "`layers_to_transform` is [0]"] {
        assert!(stderr(&o).contains(want), "{}", stderr(&o));
    }
    // rank 0 turns LoRA off: an adapter to start from is then an error
    std::fs::write(&path, original).unwrap();
    let o = kiln(dir, &["check", "llama.toml", "--set", "model.lora.rank=0"]);
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("turns LoRA off"), "{}", stderr(&o));
}

/// A PEFT adapter of a Gemma 3 vision-language base's language model (PEFT's names
/// `model.language_model.layers...`, or `language_model.model.layers...` as before
/// transformers 4.52; `target_modules` a pattern under them) starts a run with PEFT's logits,
/// and kiln's export of it loads in PEFT alike; one that adapts the vision tower
/// too (a list of names, which PEFT also matches there) is exit 2 saying so.
#[test]
fn a_peft_adapter_of_a_vision_language_gemma3_starts_a_run() {
    let d = kiln::testdir::tempdir().unwrap();
    let dir = d.path();
    let base = root().join("tests/fixtures/hf-gemma3vl");
    let pattern = r"model\.language_model\..*\.(q_proj|v_proj)";
    for (out, targets) in [("theirs", pattern), ("both", "q_proj,v_proj")] {
        check_peft(&[
            "make",
            base.to_str().unwrap(),
            dir.join(out).to_str().unwrap(),
            "--rank",
            "4",
            "--alpha",
            "8",
            "--targets",
            targets,
        ]);
    }
    let lora = "rank = 4\nalpha = 8.0\ntargets = [\"q_proj\", \"v_proj\"]\ninit_from = \"theirs\"";
    experiment_of(dir, "gemma3", &base, lora, "kind = \"sgd\"\nlr = 0.0");
    theirs_and_ours_give_kilns_logits(dir, &base);
    // PEFT's names before transformers 4.52 (`language_model.model.layers...`, the pattern
    // under them) read too
    let old = dir.join("old");
    std::fs::create_dir(&old).unwrap();
    let config = std::fs::read_to_string(dir.join("theirs/adapter_config.json")).unwrap();
    let ours = r#""model\\.language_model\\.."#;
    assert!(config.contains(ours), "{config}");
    let config = config.replace(ours, r#""language_model\\.model\\.."#);
    std::fs::write(old.join("adapter_config.json"), config).unwrap();
    let names = renamed_safetensors(
        &dir.join("theirs/adapter_model.safetensors"),
        &old.join("adapter_model.safetensors"),
        |n| {
            n.replace(
                "base_model.model.model.language_model.",
                "base_model.model.language_model.model.",
            )
        },
    );
    assert!(names.iter().all(|n| n.contains(".language_model.model.")));
    let set = |adapter: &str| format!("model.lora.init_from=\"{adapter}\"");
    let o = kiln(dir, &["check", "llama.toml", "--set", &set("old")]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let o = kiln(dir, &["check", "llama.toml", "--set", &set("both")]);
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("adapts the vision tower, which kiln does not compute"),
        "{}",
        stderr(&o)
    );
}

/// A small llama with LoRA adapters and their dropout, no init_from.
const TASK: &str = r#"
[experiment]
seed = 2
[model]
kind = "llama"
vocab_size = 256
block_size = 8
layers = 2
heads = 2
kv_heads = 1
dim = 16
ffn_dim = 32
[model.lora]
rank = 2
alpha = 4.0
dropout = 0.1
targets = ["all-linear"]
[data]
kind = "synthetic"
samples = 64
vocab = 256
[train]
max_steps = 4
batch_size = 8
grad_accum_steps = 2
[optim]
kind = "adamw"
lr = 0.02
weight_decay = 0.1
[backend]
threads = 1
"#;

/// Only the adapters move, and fsdp(2) by layer, ddp(2) and dp(2) train them to single's
/// parameters within 1e-5 (their dropout included).
#[test]
fn adapters_train_alike_under_every_strategy_and_alone() {
    let p = crate::common::prepare(TASK, &[]);
    let layout = p.model.layout().clone();
    let init = p.model.init(2);
    let single = train_task(TASK, &[]);
    assert_eq!(single.params[..layout.frozen], init[..layout.frozen]);
    assert!(max_diff(&single.params[layout.frozen..], &init[layout.frozen..]) > 1e-4);
    for q in layout.params.iter().filter(|q| q.offset >= layout.frozen) {
        assert!(q.name.contains(".lora."), "{} trains", q.name);
    }
    for sets in [
        &[
            "strategy.kind=fsdp",
            "strategy.unit=layer",
            "strategy.devices=2",
            "train.batch_size=4",
        ][..],
        &[
            "strategy.kind=ddp",
            "strategy.devices=2",
            "train.batch_size=4",
        ],
        &[
            "strategy.kind=dp",
            "strategy.devices=2",
            "train.batch_size=4",
        ],
    ] {
        let t = train_task(TASK, sets);
        let d = max_diff(&t.params, &single.params);
        assert!(d <= 1e-5, "{sets:?}: max |diff| vs single = {d}");
    }
    // dropout on the adapters' input moves the result
    let without = train_task(TASK, &["model.lora.dropout=0.0"]);
    assert!(max_diff(&without.params, &single.params) > 1e-6);
}

/// A LoRA run paused and resumed under fsdp(2) ends with the straight run's bits.
#[test]
fn a_resumed_lora_run_has_the_straight_runs_bits() {
    let d = kiln::testdir::tempdir().unwrap();
    let dir = d.path();
    write(dir, "t.toml", TASK);
    let fsdp = [
        "--set",
        "strategy.kind=fsdp",
        "--set",
        "strategy.unit=layer",
        "--set",
        "strategy.devices=2",
        "--set",
        "train.batch_size=4",
    ];
    let mut a = vec!["run", "t.toml", "--quiet", "--run-dir", "straight"];
    a.extend(fsdp);
    run_ok(dir, &a);
    let mut b = vec![
        "run",
        "t.toml",
        "--quiet",
        "--run-dir",
        "paused",
        "--set",
        "train.max_steps=2",
        "--set",
        "checkpoint.every_steps=2",
    ];
    b.extend(fsdp);
    run_ok(dir, &b);
    run_ok(
        dir,
        &[
            "resume",
            dir.join("paused").to_str().unwrap(),
            "--quiet",
            "--set",
            "train.max_steps=4",
        ],
    );
    let (x, y) = (summary(&dir.join("straight")), summary(&dir.join("paused")));
    assert_eq!(x["params_sha256"], y["params_sha256"]);
}

/// A target no layer has, a rank larger than a layer, LoRA on a family without adapters, and an
/// adapter directory that is not one: exit 2 naming the key.
#[test]
fn bad_lora_settings_are_exit_2_naming_the_key() {
    let d = kiln::testdir::tempdir().unwrap();
    let dir = d.path();
    write(dir, "t.toml", TASK);
    for (set, want) in [
        ("model.lora.targets=[\"q_prj\"]", "did you mean \"q_proj\""),
        (
            "model.lora.rank=17",
            "`model.lora.rank` = 17 is larger than q_proj's dimensions",
        ),
        ("model.lora.init_from=\"nowhere\"", "model.lora.init_from"),
        ("model.lora.dropout=1.0", "model.lora.dropout"),
    ] {
        let o = kiln(dir, &["check", "t.toml", "--set", set]);
        assert_eq!(code(&o), Some(2), "{set}: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "{set}: {}", stderr(&o));
    }
    write(
        dir,
        "mlp.toml",
        "[model]\nkind = \"mlp\"\n[model.lora]\nrank = 2\n[data]\nsamples = 32\n",
    );
    let o = kiln(dir, &["check", "mlp.toml"]);
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("mlp family has no LoRA adapters"),
        "{}",
        stderr(&o)
    );
}

/// LoRA on the architectures of issue 63: `all-linear` adapters of a Gemma 3 (every projection,
/// the norms around them frozen) and of a Mixtral (its attention's: the experts are no Linear
/// layers in transformers either) train, and PEFT loads kiln's `--format peft` export on the
/// transformers directory and computes kiln's logits and loss. On a Gemma 3 vision-language
/// base (`gemma3vl`, as Gemma 3 4B-27B) the adapters are its language model's, under the names
/// PEFT gives those modules (`model.language_model.layers...`) and a `target_modules` pattern
/// the vision tower's modules do not match (named as the text model's, PEFT applied nothing:
/// silently, B at zero).
#[test]
fn peft_loads_kilns_adapters_of_a_gemma3_and_a_mixtral() {
    for arch in ["gemma3", "gemma3vl", "mixtral"] {
        let d = kiln::testdir::tempdir().unwrap();
        let dir = d.path();
        let base = root().join(format!("tests/fixtures/hf-{arch}"));
        experiment_of(
            dir,
            arch.strip_suffix("vl").unwrap_or(arch),
            &base,
            "rank = 4\nalpha = 8.0\ntargets = [\"all-linear\"]",
            "kind = \"adamw\"\nlr = 0.01",
        );
        run_ok(dir, &["run", "llama.toml", "--quiet", "--run-dir", "run"]);
        run_ok(
            dir,
            &[
                "export",
                "run",
                "--format",
                "peft",
                "-o",
                "adapter",
                "--probe",
                "probe.safetensors",
            ],
        );
        let config = std::fs::read_to_string(dir.join("adapter/adapter_config.json")).unwrap();
        let pattern = r#""target_modules": "model\\.language_model\\..*\\.(q_proj|k_proj|"#;
        assert_eq!(config.contains(pattern), arch == "gemma3vl", "{config}");
        check_peft(&[
            "check",
            base.to_str().unwrap(),
            "--probe",
            dir.join("probe.safetensors").to_str().unwrap(),
            "--adapter",
            dir.join("adapter").to_str().unwrap(),
        ]);
    }
}
