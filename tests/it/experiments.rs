//! Every file in `experiments/` passes `kiln check` and runs 2 steps, but those whose weights
//! the user downloads first (`# requires-download:`): without them, `kiln check` says which
//! file is missing (exit 2).

use crate::common::{kiln, root, stderr};

#[test]
fn every_experiment_checks_and_runs_two_steps() {
    let d = kiln::testdir::tempdir().unwrap();
    let mut files: Vec<_> = std::fs::read_dir(root().join("experiments"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    assert!(files.len() >= 3, "{files:?}");
    for f in files {
        let f = f.to_str().unwrap();
        let text = std::fs::read_to_string(f).unwrap();
        if text.contains("# requires-download:") {
            let o = kiln(d.path(), &["check", f]);
            assert_eq!(o.status.code(), Some(2), "check {f}: {}", stderr(&o));
            assert!(
                stderr(&o).contains("model.init_from: cannot read"),
                "{f}: {}",
                stderr(&o)
            );
            continue;
        }
        let o = kiln(d.path(), &["check", f]);
        assert_eq!(o.status.code(), Some(0), "check {f}: {}", stderr(&o));
        let o = kiln(
            d.path(),
            &[
                "run",
                f,
                "--quiet",
                "--set",
                "train.max_steps=2",
                "--set",
                "backend.threads=1",
            ],
        );
        assert_eq!(o.status.code(), Some(0), "run {f}: {}", stderr(&o));
    }
}
