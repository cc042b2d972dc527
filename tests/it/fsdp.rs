//! FSDP: for the same global batch, every sharding and unit gives the parameters ddp gives (also
//! with clipping, accumulation and AdamW, and a parameter count that does not divide by the world
//! size); per-rank memory at rest is about 1/world of ddp's.

use crate::common::{max_diff, train};

const SGD: &[&str] = &["optim.kind=sgd", "optim.momentum=0.9"];
const ADAMW: &[&str] = &[
    "optim.kind=adamw",
    "optim.lr=0.01",
    "optim.weight_decay=0.1",
];

#[test]
fn fsdp_matches_ddp_for_every_sharding_unit_and_optimizer() {
    for world in [2usize, 3] {
        let batch = format!("train.batch_size={}", 48 / world);
        let devices = format!("strategy.devices={world}");
        for optim in [SGD, ADAMW] {
            for extra in [
                &[][..],
                &["optim.grad_clip_norm=0.5", "train.grad_accum_steps=2"],
            ] {
                let mut base: Vec<&str> = vec![&batch, &devices];
                base.extend_from_slice(optim);
                base.extend_from_slice(extra);
                let mut ddp = base.clone();
                ddp.push("strategy.kind=ddp");
                let reference = train(&ddp).params;
                for sharding in ["full", "grad_op", "none"] {
                    for unit in ["model", "layer"] {
                        let s = format!("strategy.sharding={sharding}");
                        let u = format!("strategy.unit={unit}");
                        let mut f = base.clone();
                        f.extend(["strategy.kind=fsdp", &s, &u]);
                        let d = max_diff(&reference, &train(&f).params);
                        assert!(d <= 1e-5, "{f:?}: max |param diff| vs ddp = {d}");
                        // without sharding fsdp is ddp (`strategy::build` makes one): the same bits
                        if sharding == "none" {
                            assert_eq!(d, 0.0, "{f:?}: sharding = none is not ddp");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn hsdp_matches_single_and_holds_the_state_of_its_shard_group() {
    for optim in [SGD, ADAMW] {
        for extra in [
            &["strategy.unit=model"][..],
            // each unit steps as its gradient shard is averaged, in the backward
            &["strategy.unit=layer"],
            &[
                "strategy.unit=layer",
                "optim.grad_clip_norm=0.5",
                "train.grad_accum_steps=2",
            ],
        ] {
            let mut single = vec!["strategy.kind=single", "train.batch_size=48"];
            single.extend_from_slice(optim);
            single.extend_from_slice(extra);
            let reference = train(&single).params;
            let mut h = vec![
                "strategy.kind=fsdp",
                "strategy.devices=4",
                "strategy.shard_size=2",
                "train.batch_size=12",
            ];
            h.extend_from_slice(optim);
            h.extend_from_slice(extra);
            let hsdp = train(&h);
            let d = max_diff(&reference, &hsdp.params);
            assert!(d <= 1e-5, "{h:?}: max |param diff| vs single = {d}");
            // each rank holds what a rank of fsdp over 2 ranks holds
            let mut f = h.clone();
            f.retain(|s| !s.starts_with("strategy.devices") && !s.starts_with("strategy.shard"));
            f.extend(["strategy.devices=2", "train.batch_size=24"]);
            let fsdp2 = train(&f);
            assert_eq!(hsdp.memory.len(), 4);
            for m in &hsdp.memory {
                let want = &fsdp2.memory[m.rank % 2];
                assert_eq!(
                    (m.params_bytes, m.grads_bytes, m.optim_bytes),
                    (want.params_bytes, want.grads_bytes, want.optim_bytes),
                    "{h:?} rank {}",
                    m.rank
                );
            }
        }
    }
}

#[test]
fn fsdp_memory_at_rest_is_a_world_fraction_of_ddp() {
    let common = [
        "strategy.devices=4",
        "train.batch_size=8",
        "optim.kind=adamw",
        "optim.lr=0.01",
    ];
    let mut d = common.to_vec();
    d.push("strategy.kind=ddp");
    let mut f = common.to_vec();
    f.extend(["strategy.kind=fsdp", "strategy.sharding=full"]);
    let (ddp, fsdp) = (train(&d).memory, train(&f).memory);
    assert_eq!((ddp.len(), fsdp.len()), (4, 4));
    let n = ddp[0].params_bytes as f64 / 4.0;
    let padding = 4.0 * 4.0; // at most world-1 padded elements, 4 bytes each
    for m in &fsdp {
        let want = ddp[0].optim_bytes as f64 / 4.0;
        assert!(
            (m.optim_bytes as f64 - want).abs() <= want * 0.01 + 2.0 * padding,
            "{m:?}"
        );
        let want = ddp[0].params_bytes as f64 / 4.0;
        assert!(
            (m.params_bytes as f64 - want).abs() <= want * 0.01 + padding,
            "{m:?}"
        );
        assert!(
            (m.grads_bytes as f64 - want).abs() <= want * 0.01 + padding,
            "{m:?}"
        );
    }
    assert!(
        !(n as usize).is_multiple_of(4),
        "the task must exercise padding ({n} params)"
    );
    let mut g = common.to_vec();
    g.extend(["strategy.kind=fsdp", "strategy.sharding=grad_op"]);
    let grad_op = train(&g).memory;
    assert_eq!(grad_op[0].params_bytes, ddp[0].params_bytes);
    assert!(grad_op[0].optim_bytes < ddp[0].optim_bytes / 3);
}

#[test]
fn the_plan_estimate_equals_what_every_strategy_reports() {
    let d = kiln::testdir::tempdir().unwrap();
    let f = crate::common::write(d.path(), "task.toml", crate::common::TASK);
    for sets in [
        &["strategy.kind=single", "optim.kind=adam"][..],
        &[
            "strategy.kind=dp",
            "strategy.devices=3",
            "optim.momentum=0.9",
        ],
        &["strategy.kind=ddp", "strategy.devices=2"],
        &[
            "strategy.kind=fsdp",
            "strategy.devices=3",
            "strategy.unit=layer",
            "optim.kind=adamw",
        ],
        &[
            "strategy.kind=fsdp",
            "strategy.devices=2",
            "strategy.sharding=grad_op",
            "optim.momentum=0.9",
        ],
        &[
            "strategy.kind=fsdp",
            "strategy.devices=2",
            "strategy.sharding=none",
            "optim.kind=adam",
        ],
        &[
            "strategy.kind=fsdp",
            "strategy.devices=4",
            "strategy.shard_size=2",
            "optim.kind=adamw",
        ],
    ] {
        let owned: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        let r = kiln::config::load(&f, &[], &owned).unwrap();
        let model = kiln::model::build(&r, &[r.config.model.input_size]).unwrap();
        let est =
            kiln::strategy::estimate(&r.config, model.layout(), r.config.strategy.devices.count());
        assert_eq!(est, train(sets).memory, "{sets:?}");
    }
}

/// Issue 58, defect 16: an HSDP run resumes under ddp (its `strategy.shard_size` was refused
/// and nothing could remove it) and then under single (its device count left out), each
/// change said in a note.
#[test]
fn an_hsdp_run_resumes_under_another_strategy() {
    let d = kiln::testdir::tempdir().unwrap();
    crate::common::write(d.path(), "t.toml", crate::common::TINY);
    let run = |args: &[&str]| crate::common::kiln(d.path(), args);
    let o = run(&[
        "run",
        "t.toml",
        "--quiet",
        "--run-dir",
        "r",
        "--set",
        "strategy.kind=fsdp",
        "--set",
        "strategy.devices=4",
        "--set",
        "strategy.shard_size=2",
        "--set",
        "train.max_steps=4",
        "--set",
        "checkpoint.every_steps=2",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", crate::common::stderr(&o));
    let o = run(&[
        "resume",
        "r",
        "--set",
        "strategy.kind=ddp",
        "--set",
        "train.max_steps=6",
    ]);
    let err = crate::common::stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains("`strategy.shard_size` of the run's config.toml is left out"),
        "{err}"
    );
    assert_eq!(crate::common::summary(&d.path().join("r"))["steps"], 6);
    let o = run(&[
        "resume",
        "r",
        "--set",
        "strategy.kind=single",
        "--set",
        "train.max_steps=8",
    ]);
    let err = crate::common::stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains("`strategy.devices` of the run's config.toml is left out"),
        "{err}"
    );
    // (issue 58, defect 27: the resume's warning names a device count that changes)
    assert!(
        err.contains("resuming with `strategy.devices` changed: 4 -> 1"),
        "{err}"
    );
    let s = crate::common::summary(&d.path().join("r"));
    assert_eq!(
        (s["steps"].as_u64(), s["world_size"].as_u64()),
        (Some(8), Some(1)),
        "{s}"
    );
}
