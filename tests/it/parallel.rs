//! Data parallelism: for one seed and one global batch, single == dp == ddp (any world size),
//! accumulation == a larger batch, evaluation is exact for any world size, and a stalled rank
//! fails the run with the rank and op named.

use kiln::backend;
use kiln::config;
use kiln::data;
use kiln::plan::Plan;
use kiln::train::TrainInput;

use crate::common::{kiln_env, stderr, write, TINY};

pub const TASK: &str = r#"
[experiment]
seed = 3

[model]
input_size = 32
hidden_sizes = [64, 32]
classes = 5

[data]
samples = 640
eval_samples = 203
features = 32
classes = 5

[train]
max_steps = 5

[optim]
kind = "sgd"
lr = 0.05
momentum = 0.9

[backend]
threads = 1
"#;

pub struct Trained {
    pub params: Vec<f32>,
    pub eval: (f64, f64, u64),
    pub memory: Vec<kiln::strategy::Memory>,
}

pub fn train(sets: &[&str]) -> Trained {
    let d = tempfile::tempdir().unwrap();
    let f = write(d.path(), "task.toml", TASK);
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    let r = config::load(&f, &[], &sets).unwrap();
    let c = &r.config;
    let data = data::load(&r).unwrap();
    let model = kiln::model::build(&c.model, &data.input_shape()).unwrap();
    let plan = Plan::new(c, data.train.len(), model.num_params());
    let input = TrainInput {
        config: c,
        plan: &plan,
        data: &data,
        model: model.as_ref(),
        store: None,
        resume: None,
    };
    let placement = backend::resolve(c).unwrap();
    let res = kiln::launch::train(&placement, &input, None, None, &mut |_| {}).unwrap();
    let e = res.outcome.eval.unwrap();
    Trained {
        params: res.outcome.params,
        eval: (e.loss(), e.accuracy(), e.count),
        memory: res.memory,
    }
}

pub fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn single_dp_ddp_agree_for_one_global_batch() {
    let single = train(&["train.batch_size=64"]);
    let moved = max_diff(
        &single.params,
        &train(&["train.batch_size=64", "train.max_steps=1"]).params,
    );
    assert!(moved > 1e-3, "training must move the parameters ({moved})");
    for sets in [
        &[
            "strategy.kind=dp",
            "strategy.devices=2",
            "train.batch_size=32",
        ][..],
        &[
            "strategy.kind=ddp",
            "strategy.devices=2",
            "train.batch_size=32",
        ],
        &[
            "strategy.kind=ddp",
            "strategy.devices=4",
            "train.batch_size=16",
        ],
        &[
            "strategy.kind=dp",
            "strategy.devices=4",
            "train.batch_size=16",
        ],
        &[
            "strategy.kind=ddp",
            "strategy.devices=2",
            "train.batch_size=16",
            "train.grad_accum_steps=2",
        ],
    ] {
        let d = max_diff(&single.params, &train(sets).params);
        assert!(d <= 1e-5, "{sets:?}: max |param diff| = {d}");
    }
}

#[test]
fn ddp_accumulation_equals_ddp_larger_batch() {
    let acc = train(&[
        "strategy.kind=ddp",
        "strategy.devices=2",
        "train.batch_size=16",
        "train.grad_accum_steps=2",
    ]);
    let big = train(&[
        "strategy.kind=ddp",
        "strategy.devices=2",
        "train.batch_size=32",
    ]);
    let d = max_diff(&acc.params, &big.params);
    assert!(d <= 1e-5, "max |param diff| = {d}");
    let synced = train(&[
        "strategy.kind=ddp",
        "strategy.devices=2",
        "train.batch_size=16",
        "train.grad_accum_steps=2",
        "strategy.no_sync=false",
    ]);
    let d = max_diff(&synced.params, &big.params);
    assert!(d <= 1e-5, "without no_sync: max |param diff| = {d}");
}

#[test]
fn adamw_with_clipping_and_a_schedule_agrees_too() {
    let common = [
        "optim.kind=adamw",
        "optim.lr=0.01",
        "optim.momentum=0",
        "optim.weight_decay=0.1",
        "optim.grad_clip_norm=0.5",
        "schedule.kind=cosine",
        "schedule.warmup_steps=2",
    ];
    let mut s = common.to_vec();
    s.push("train.batch_size=48");
    let single = train(&s);
    let mut d3 = common.to_vec();
    d3.extend([
        "strategy.kind=ddp",
        "strategy.devices=3",
        "train.batch_size=16",
    ]);
    let d = max_diff(&single.params, &train(&d3).params);
    assert!(d <= 1e-5, "max |param diff| = {d}");
}

#[test]
fn evaluation_is_exact_for_any_world_size() {
    // lr 0 keeps the parameters at their (broadcast) initialisation on every world size
    let base = train(&["optim.lr=0", "train.max_steps=1"]);
    assert_eq!(base.eval.2, 203);
    for sets in [
        &[
            "optim.lr=0",
            "train.max_steps=1",
            "strategy.kind=ddp",
            "strategy.devices=2",
        ][..],
        &[
            "optim.lr=0",
            "train.max_steps=1",
            "strategy.kind=ddp",
            "strategy.devices=3",
        ],
        &[
            "optim.lr=0",
            "train.max_steps=1",
            "strategy.kind=dp",
            "strategy.devices=3",
        ],
    ] {
        assert_eq!(train(sets).eval, base.eval, "{sets:?}");
    }
}

#[test]
fn a_stalled_rank_fails_the_run_naming_rank_and_op() {
    let d = tempfile::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    let o = kiln_env(
        d.path(),
        &[
            "run",
            "t.toml",
            "--quiet",
            "--set",
            "strategy.kind=ddp",
            "--set",
            "strategy.devices=2",
            "--set",
            "strategy.timeout_secs=1",
        ],
        &[("KILN_TEST_STALL", "1:3")],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("rank 1 never reached all_reduce #3 (last seen: all_reduce #2)"),
        "{e}"
    );
    let log = std::fs::read_to_string(d.path().join("runs/tiny/logs/rank-0.log")).unwrap();
    assert!(log.contains("error: collective timed out"), "{log}");
}

#[test]
fn ddp_run_writes_rank_logs_and_world_fields() {
    let d = tempfile::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    let o = kiln_env(
        d.path(),
        &[
            "run",
            "t.toml",
            "--quiet",
            "--set",
            "strategy.kind=ddp",
            "--set",
            "strategy.devices=3",
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let run = d.path().join("runs/tiny");
    for r in 0..3 {
        assert!(run.join(format!("logs/rank-{r}.log")).exists());
    }
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(s["world_size"], 3);
    assert_eq!(s["strategy"], "ddp");
    assert_eq!(s["global_batch"], 24);
    assert_eq!(s["memory"].as_array().unwrap().len(), 3);
}

#[test]
fn dp_keeps_optimizer_state_on_the_main_device_only() {
    let d = tempfile::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    let o = kiln_env(
        d.path(),
        &[
            "run",
            "t.toml",
            "--quiet",
            "--set",
            "strategy.kind=dp",
            "--set",
            "strategy.devices=2",
            "--set",
            "optim.kind=adam",
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let s: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(d.path().join("runs/tiny/summary.json")).unwrap(),
    )
    .unwrap();
    let m = s["memory"].as_array().unwrap();
    let params = m[0]["params_bytes"].as_u64().unwrap();
    assert_eq!(m[0]["optim_bytes"].as_u64().unwrap(), 2 * params);
    assert_eq!(m[1]["optim_bytes"].as_u64().unwrap(), 0);
}
