//! The unit-by-unit engine: for mlp, cnn and gpt (tied and untied embeddings), single == ddp(2)
//! == fsdp(2) == fsdp(4) by layer within 1e-5, with and without activation checkpointing, and
//! neither activation checkpointing, overlap (`strategy.overlap`) nor fsdp's reshard after forward
//! (`strategy.reshard_after_forward`) changes a bit; a user's family trains under fsdp(2) with its
//! declared stages and as one stage, to the same bits; each rank's peak is measured.

use crate::common::{kiln, stderr, summary, write, TINY};
use crate::common::{max_diff, train_task, TASK};
use crate::models::{corpus, CNN, GPT};

/// max |a - b| relative to the largest |a|.
fn rel_diff(a: &[f32], b: &[f32]) -> f32 {
    let scale = a.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12);
    max_diff(a, b) / scale
}

/// Every strategy with and without checkpointing against single on one global batch of
/// `4 * quarter` samples.
pub(crate) fn strategies_agree(task: &str, quarter: usize, extra: &[&str]) {
    let batch = |n: usize| format!("train.batch_size={}", quarter * n);
    let with = |mut sets: Vec<String>| {
        sets.extend(extra.iter().map(|s| s.to_string()));
        sets
    };
    let run = |sets: &[String]| {
        let refs: Vec<&str> = sets.iter().map(String::as_str).collect();
        train_task(task, &refs).params
    };
    let single = run(&with(vec![batch(4)]));
    let single_ac = run(&with(vec![
        batch(4),
        "train.activation_checkpointing=units".into(),
    ]));
    assert!(single == single_ac, "{extra:?}: checkpointing changed bits");
    for (kind, world) in [("ddp", 2), ("fsdp", 2), ("fsdp", 4)] {
        for ac in ["none", "units"] {
            let sets = with(vec![
                batch(4 / world),
                format!("strategy.kind={kind}"),
                format!("strategy.devices={world}"),
                "strategy.unit=layer".into(),
                format!("train.activation_checkpointing={ac}"),
            ]);
            let overlapped = run(&sets);
            let d = rel_diff(&single, &overlapped);
            assert!(d < 1e-5, "{sets:?}: relative difference {d}");
            let mut inline = sets.clone();
            inline.push("strategy.overlap=false".into());
            assert!(overlapped == run(&inline), "{sets:?}: overlap changed bits");
            // fsdp by layer reshards after each stage's forward (the default) or keeps the
            // gathered parameters until its backward: the same bits
            if kind == "fsdp" && world == 2 && ac == "none" {
                let mut kept = sets.clone();
                kept.push("strategy.reshard_after_forward=false".into());
                assert!(
                    overlapped == run(&kept),
                    "{sets:?}: resharding changed bits"
                );
            }
        }
    }
}

#[test]
fn mlp_and_cnn_agree_across_strategies_and_checkpointing() {
    strategies_agree(TASK, 4, &["model.dropout=0.0"]);
    strategies_agree(CNN, 4, &[]);
}

#[test]
fn gpt_tied_and_untied_agree_across_strategies_and_checkpointing() {
    let d = kiln::testdir::tempdir().unwrap();
    corpus(d.path());
    let task = GPT.replace("corpus.txt", d.path().join("corpus.txt").to_str().unwrap());
    strategies_agree(&task, 2, &[]);
    strategies_agree(&task, 2, &["model.tie_embeddings=false"]);
}

#[test]
fn every_rank_reports_a_measured_peak_that_holds_its_model_state() {
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    for kind in ["ddp", "fsdp"] {
        let run = format!("run-{kind}");
        let o = kiln(
            d.path(),
            &[
                "run",
                "t.toml",
                "--quiet",
                "--run-dir",
                &run,
                "--set",
                &format!("strategy.kind=\"{kind}\""),
                "--set",
                "strategy.devices=2",
                "--set",
                "optim.kind=\"adamw\"",
            ],
        );
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let s = summary(&d.path().join(&run));
        assert!(s["peak_rss_bytes"].as_u64().unwrap() > 0, "{s}");
        let memory = s["memory"].as_array().unwrap();
        assert_eq!(memory.len(), 2);
        for m in memory {
            let state = m["params_bytes"].as_u64().unwrap() + m["optim_bytes"].as_u64().unwrap();
            let peak = m["peak_bytes"].as_u64().unwrap();
            assert!(
                peak >= state,
                "{kind}: peak {peak} below the model state {state}"
            );
        }
    }
}

/// fsdp with full sharding by layer evaluates stage by stage (no rank gathers the whole
/// model): its evaluation is the same bits as the whole-model evaluation of its final
/// parameters, for a gpt (tied embeddings) and an mlp whose eval set splits unevenly over the
/// ranks (one rank runs a gather-only batch at the end).
#[test]
fn fsdp_evaluates_stage_by_stage_to_the_whole_models_bits() {
    use burn::backend::{Autodiff, Flex};
    use kiln::model::ComputeOn;
    let d = kiln::testdir::tempdir().unwrap();
    corpus(d.path());
    let gpt = GPT.replace("corpus.txt", d.path().join("corpus.txt").to_str().unwrap());
    // TASK: 203 eval samples, 102 on rank 0 in batches of 101: two batches there, one on rank 1
    for (task, batch) in [(gpt.as_str(), 2), (TASK, 101)] {
        let sets = [
            "strategy.kind=fsdp",
            "strategy.devices=2",
            "strategy.unit=layer",
            "train.activation_checkpointing=units",
        ];
        let mut sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        sets.push(format!("train.batch_size={batch}"));
        let refs: Vec<&str> = sets.iter().map(String::as_str).collect();
        let trained = train_task(task, &refs);
        let p = crate::common::prepare(task, &refs);
        let compute =
            <Autodiff<Flex> as ComputeOn>::compute(p.model.as_ref(), &Default::default(), true);
        let ds = p.data.eval.as_ref().unwrap();
        let whole = kiln::train::evaluate_like_run(compute.as_ref(), &trained.params, ds, 2, batch)
            .unwrap();
        assert_eq!(
            (whole.loss(), whole.accuracy(), whole.count),
            trained.eval,
            "{task}"
        );
    }
}

/// The collectives of one traced step of rank 0 by name (both tracks), in a run of `task`.
fn step_ops(task: &str, sets: &[&str]) -> std::collections::BTreeMap<&'static str, usize> {
    let mut all = vec![
        "profile.enabled=true",
        "profile.wait=1",
        "profile.warmup=0",
        "profile.active=1",
        "profile.repeat=1",
        "data.eval_fraction=0.0",
    ];
    all.extend_from_slice(sets);
    let p = crate::common::prepare(task, &all);
    let placement = kiln::backend::resolve(&p.r.config).unwrap();
    let res =
        kiln::launch::train(&placement, &p.input(), None, None, &p.nccl(), &mut |_| {}).unwrap();
    let mut ops = std::collections::BTreeMap::new();
    for s in &res.time[0].spans {
        if s.op.is_some() && s.step == 2 {
            *ops.entry(s.name).or_default() += 1;
        }
    }
    ops
}

#[test]
fn a_stages_units_travel_in_one_collective_and_the_last_stages_are_not_gathered_twice() {
    let d = kiln::testdir::tempdir().unwrap();
    corpus(d.path());
    let task = GPT.replace("corpus.txt", d.path().join("corpus.txt").to_str().unwrap());
    // stages: [wte, wpe], blocks.0, blocks.1, [ln_f, wte]
    let n = 4;
    for overlap in ["true", "false"] {
        let o = format!("strategy.overlap={overlap}");
        let base = ["strategy.devices=2", "strategy.unit=layer", o.as_str()];
        let fsdp = |ac: &str| {
            let ac = format!("train.activation_checkpointing={ac}");
            let mut sets = vec!["strategy.kind=fsdp", ac.as_str()];
            sets.extend_from_slice(&base);
            step_ops(&task, &sets)
        };
        // one gather per stage in the forward; resharded after the forward (the default) or
        // with checkpointing again for each stage but the last two (the last recomputed
        // stage's forward gather is kept); one reduce-scatter per stage whose units are done
        // (the tied `wte` with `wpe`, in stage 0)
        let ops = fsdp("none");
        assert_eq!(
            ops.get("all_gather"),
            Some(&(n + n - 2)),
            "{overlap}: {ops:?}"
        );
        assert_eq!(ops.get("reduce_scatter"), Some(&n), "{overlap}: {ops:?}");
        let mut kept = vec!["strategy.kind=fsdp", "strategy.reshard_after_forward=false"];
        kept.extend_from_slice(&base);
        let ops = step_ops(&task, &kept);
        assert_eq!(ops.get("all_gather"), Some(&n), "{overlap}: {ops:?}");
        assert_eq!(ops.get("reduce_scatter"), Some(&n), "{overlap}: {ops:?}");
        let ops = fsdp("units");
        assert_eq!(
            ops.get("all_gather"),
            Some(&(n + n - 2)),
            "{overlap}: {ops:?}"
        );
        assert_eq!(ops.get("reduce_scatter"), Some(&n), "{overlap}: {ops:?}");
        // ddp: one all-reduce per stage whose units are done, and the step's totals
        let mut sets = vec!["strategy.kind=ddp"];
        sets.extend_from_slice(&base);
        let ops = step_ops(&task, &sets);
        assert_eq!(ops.get("all_reduce"), Some(&(n + 1)), "{overlap}: {ops:?}");
    }
}
