//! Early stopping, the best checkpoint and `kiln eval` (Lightning's EarlyStopping and
//! ModelCheckpoint(monitor=...), and `trainer.validate(ckpt_path=...)`).

use std::path::Path;

use crate::common::{kiln, metric_lines, stderr, stdout, summary, write, TINY};

/// The logged (step, eval_loss) pairs of a run.
fn eval_losses(run: &Path) -> Vec<(u64, f64)> {
    metric_lines(run)
        .iter()
        .filter_map(|v| Some((v["step"].as_u64()?, v["eval_loss"].as_f64()?)))
        .collect()
}

fn run(d: &Path, dir: &str, sets: &[&str]) -> std::process::Output {
    let mut args = vec!["run", "t.toml", "--quiet", "--run-dir", dir];
    for s in sets {
        args.extend(["--set", s]);
    }
    kiln(d, &args)
}

#[test]
fn early_stopping_stops_after_patience_evaluations_without_improvement_and_not_before() {
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    let sets = [
        "train.max_steps=400",
        "train.eval_every=2",
        "optim.lr=0.05",
        "train.early_stopping={ metric = \"eval_loss\", patience = 3, min_delta = 0.002 }",
    ];
    let o = run(d.path(), "r", &sets);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let r = d.path().join("r");
    // the rule, applied to what the run logged: where must it stop?
    let (mut best, mut bad, mut expected) = (f64::INFINITY, 0, None);
    for (step, loss) in eval_losses(&r) {
        if loss < best - 0.002 {
            (best, bad) = (loss, 0);
        } else {
            bad += 1;
        }
        if bad >= 3 {
            expected = Some(step);
            break;
        }
    }
    let stop = expected.expect("the metric kept improving: the test needs a plateau");
    assert!(stop < 400, "{stop}");
    let s = summary(&r);
    assert_eq!(s["status"], "finished", "{s}");
    assert_eq!(s["stopped_early"], true, "{s}");
    assert_eq!(s["steps"], stop, "{s}");
    assert_eq!(s["early_stopping"]["stopped_at_step"], stop, "{s}");
    assert_eq!(s["early_stopping"]["best"], best, "{s}");
    assert_eq!(s["early_stopping"]["bad_evals"], 3, "{s}");
    // the last logged line is the stop (nothing trained after it), with a checkpoint there
    assert_eq!(eval_losses(&r).last().unwrap().0, stop);
    assert!(r.join(format!("checkpoints/step-{stop:08}")).is_dir());
    // the closing line says so (issue 58, defect 19)
    let out = crate::common::stdout(&o);
    assert!(
        out.contains(&format!(
            "stopped early at step {stop} of 400: eval_loss did not improve for 3 evaluations"
        )),
        "{out}"
    );
    // a larger patience goes on past that step
    let o = run(
        d.path(),
        "patient",
        &[
            sets[0],
            sets[1],
            sets[2],
            "train.early_stopping={ metric = \"eval_loss\", patience = 4, min_delta = 0.002 }",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        summary(&d.path().join("patient"))["steps"]
            .as_u64()
            .unwrap()
            > stop
    );
    // resuming the stopped run: it is complete (the same patience would stop it again)
    let o = kiln(d.path(), &["resume", "r"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("is already complete"), "{}", stdout(&o));
    assert!(
        stdout(&o).contains("raise train.early_stopping.patience"),
        "{}",
        stdout(&o)
    );
    assert_eq!(summary(&r)["steps"], stop);
    // the stop step is saved even without `at_end`, so the same holds
    let o = run(
        d.path(),
        "no-end",
        &[
            sets[0],
            sets[1],
            sets[2],
            sets[3],
            "checkpoint.at_end=false",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let no_end = d.path().join("no-end");
    assert!(no_end.join(format!("checkpoints/step-{stop:08}")).is_dir());
    let o = kiln(d.path(), &["resume", "no-end"]);
    assert!(stdout(&o).contains("is already complete"), "{}", stdout(&o));
}

#[test]
fn the_best_checkpoint_survives_keep_last_1_and_kiln_eval_reproduces_its_metrics() {
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    // a large learning rate: the eval loss is best early, then wanders
    let sets = [
        "train.max_steps=40",
        "train.eval_every=2",
        "optim.lr=0.5",
        "checkpoint.keep_last=1",
        "checkpoint.every_steps=4",
        "checkpoint.keep_best={ metric = \"eval_loss\" }",
        "strategy.kind=ddp",
        "strategy.devices=2",
        "train.batch_size=4",
    ];
    let o = run(d.path(), "r", &sets);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let r = d.path().join("r");
    let logged = eval_losses(&r);
    let (best_step, best_loss) =
        logged.iter().fold(
            (0, f64::INFINITY),
            |b, &(s, l)| if l < b.1 { (s, l) } else { b },
        );
    assert!(best_step < 40, "the best is the last step: {logged:?}");
    let name = format!("step-{best_step:08}");
    let mut kept: Vec<String> = std::fs::read_dir(r.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    kept.sort();
    assert_eq!(kept, vec![name.clone(), "step-00000040".to_string()]);
    let s = summary(&r);
    assert_eq!(s["best_checkpoint"]["checkpoint"], name.as_str(), "{s}");
    assert_eq!(s["best_checkpoint"]["best"], best_loss, "{s}");
    let list = stdout(&kiln(d.path(), &["ckpt", "list", "r"]));
    assert!(
        list.lines()
            .any(|l| l.starts_with(&name) && l.contains("best (eval_loss")),
        "{list}"
    );

    // kiln eval --from best: the logged metrics, bit for bit, kept in evals/
    let o = kiln(d.path(), &["eval", "r", "--from", "best"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains(&format!("{name} (step {best_step})")),
        "{}",
        stdout(&o)
    );
    let evals: Vec<_> = std::fs::read_dir(r.join("evals"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(evals.len(), 1, "{evals:?}");
    assert!(evals[0]
        .file_name()
        .unwrap()
        .to_string_lossy()
        .starts_with(&format!("{name}-")));
    let rep: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&evals[0]).unwrap()).unwrap();
    assert_eq!(rep["eval_loss"], best_loss);
    let line = metric_lines(&r)
        .into_iter()
        .find(|v| v["step"] == best_step)
        .unwrap();
    assert_eq!(rep["eval_accuracy"], line["eval_accuracy"]);
    // the newest checkpoint: the run's final metrics
    let o = kiln(d.path(), &["eval", "r"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains(&format!("eval loss {}", s["eval_loss"])),
        "{}\n{s}",
        stdout(&o)
    );
    // other data of the same shape: another synthetic draw
    let o = kiln(d.path(), &["eval", "r", "--set", "data.seed=7"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(!stdout(&o).contains(&format!("eval loss {}", s["eval_loss"])));
    // only data.* may change, and `best` needs keep_best
    let o = kiln(d.path(), &["eval", "r", "--set", "model.hidden_sizes=[4]"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("kiln eval takes only `data.*` settings"));
    // resume from the best checkpoint branches the run there
    let o = kiln(d.path(), &["resume", "r", "--from", "best", "--quiet"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(summary(&r)["resumed_from_step"], best_step);
}

#[test]
fn watched_metrics_are_checked_up_front() {
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    for (set, says) in [
        (
            "train.early_stopping={ metric = \"eval_loss\" }",
            "`train.early_stopping` acts at each evaluation, but `train.eval_every` = 0",
        ),
        (
            "checkpoint.keep_best={ metric = \"eval_loss\" }",
            "`checkpoint.keep_best` acts at each evaluation, but `train.eval_every` = 0",
        ),
    ] {
        let o = kiln(d.path(), &["check", "t.toml", "--set", set]);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(stderr(&o).contains(says), "{}", stderr(&o));
    }
    for (metric, says) in [
        (
            "eval_perplexity",
            "\"eval_perplexity\" is not measured for a classifier",
        ),
        ("eval_los", "did you mean \"eval_loss\""),
    ] {
        let set = format!("train.early_stopping={{ metric = \"{metric}\" }}");
        let o = kiln(
            d.path(),
            &[
                "check",
                "t.toml",
                "--set",
                "train.eval_every=2",
                "--set",
                &set,
            ],
        );
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(stderr(&o).contains(says), "{}", stderr(&o));
    }
    // no keep_best: `--from best` says how to get one
    let o = kiln(d.path(), &["run", "t.toml", "--quiet", "--run-dir", "r"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = kiln(d.path(), &["eval", "r", "--from", "best"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("keep_best"), "{}", stderr(&o));
}

/// Issue 58, defect 19: each evaluation is on the console when it happens (step, eval loss and
/// the task's metric), not only in metrics.jsonl.
#[test]
fn evaluations_are_said_when_they_happen() {
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    let o = kiln(
        d.path(),
        &[
            "run",
            "t.toml",
            "--run-dir",
            "r",
            "--set",
            "train.max_steps=4",
            "--set",
            "train.eval_every=2",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let err = stderr(&o);
    for step in [2, 4] {
        assert!(
            err.contains(&format!("eval at step {step}: eval loss ")),
            "{err}"
        );
    }
    assert!(err.contains("eval accuracy"), "{err}");
}
