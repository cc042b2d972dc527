//! HSDP (`strategy.kind = "fsdp"` with `strategy.shard_size`): its shard sizes checked against
//! the world, the parameters single gives with each rank holding its shard group's state, a
//! resume under another strategy, and two node processes that each shard within the node.

use kiln::config;

use crate::common::{max_diff, train, write};
use crate::config::{err_text, sets};
use crate::fsdp::{ADAMW, SGD};
use crate::nodes::equal_to_one_process;

#[test]
fn hsdp_shard_sizes_are_checked_against_the_strategy_and_the_world() {
    let d = kiln::testdir::tempdir().unwrap();
    let f = write(
        d.path(),
        "e.toml",
        "[strategy]\nkind = \"fsdp\"\ndevices = 4\nshard_size = 3\n",
    );
    assert_eq!(
        err_text(&f, &[], &[]),
        format!(
            "`strategy.shard_size` = 3 does not divide the 4 ranks (strategy.devices 4 x launch.nnodes 1): the shard groups must be equal\n  --> {}:4\n  = help: use a divisor of 4 (e.g. 2), or \"node\"",
            f.display()
        )
    );
    // "node" is the devices of a node: 3 of 6 ranks
    let r = config::load(
        &f,
        &[],
        &sets(&[
            "strategy.shard_size=\"node\"",
            "strategy.devices=3",
            "launch.nnodes=2",
        ]),
    )
    .unwrap();
    let mesh = config::Mesh::of(&r.config);
    assert_eq!((mesh.world, mesh.group, mesh.hybrid()), (6, 3, Some(3)));
    assert_eq!(
        err_text(&f, &[], &["strategy.kind=ddp", "strategy.shard_size=2"]),
        "`strategy.shard_size` groups fsdp's shards, but the run has no shards (`strategy.kind` = \"ddp\")\n  --> --set strategy.shard_size=2\n  = help: remove it, or use `strategy.kind = \"fsdp\"` with sharding"
    );
    for (v, why) in [
        (
            "0",
            "0 is not a number of ranks: a shard group has at least 1",
        ),
        (
            "nodes",
            "\"nodes\" is neither a number of ranks nor \"node\"",
        ),
        ("2.5", "2.5 is not a whole number of ranks (or \"node\")"),
        (
            "[2]",
            "takes one value: a number of ranks (e.g. 2) or \"node\", not a list or a table",
        ),
    ] {
        let set = format!("strategy.shard_size={v}");
        assert_eq!(
            err_text(&f, &[], &[&set]),
            format!("`strategy.shard_size`: {why}\n  --> --set {set}")
        );
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

#[test]
fn hsdp_sharded_within_each_of_two_nodes_equals_one_process() {
    let state = equal_to_one_process(
        2,
        2,
        &[
            "strategy.kind=fsdp",
            "strategy.shard_size=node",
            "strategy.unit=layer",
        ],
    );
    // hybrid: the state is sharded over a node's 2 ranks (node 0's wrote it) in a world of 4
    assert_eq!(state.world_size, 4);
    match state.params {
        kiln::checkpoint::Layout::Sharded { world, .. } => assert_eq!(world, 2),
        other => panic!("{other:?}"),
    }
}
