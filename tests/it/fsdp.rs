//! FSDP: for the same global batch, every sharding and unit gives the parameters ddp gives (also
//! with clipping, accumulation and AdamW, and a parameter count that does not divide by the world
//! size); per-rank memory at rest is about 1/world of ddp's.

use crate::common::{max_diff, train};

pub(crate) const SGD: &[&str] = &["optim.kind=sgd", "optim.momentum=0.9"];
pub(crate) const ADAMW: &[&str] = &[
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
