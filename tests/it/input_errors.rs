//! The smaller input errors: non-finite CSV values at file, line and column, the key each
//! error names, and job tokens refused up front.

#![allow(unused_imports)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use crate::common::{
    code, kiln, kiln_env, metric_lines, stderr, stdout, summary, write, KILN, TINY,
};

#[test]
fn non_finite_csv_values_are_bad_input_at_file_line_column() {
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "d.csv", "a,b,label\n1.0,2.0,0\n3.0, NaN,1\n");
    write(
        d.path(),
        "e.toml",
        "[model]\ninput_size = 2\nclasses = 2\n[data]\nkind = \"csv\"\npath = \"d.csv\"\nclasses = 2\n",
    );
    let o = kiln(d.path(), &["run", "e.toml"]);
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("d.csv:3:6: value `NaN` (field 2) is not finite"),
        "{e}"
    );
    std::fs::write(d.path().join("d.csv"), "a,b,label\n1.0,inf,0\n").unwrap();
    let o = kiln(d.path(), &["run", "e.toml"]);
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("d.csv:2:5: value `inf`"),
        "{}",
        stderr(&o)
    );
    assert!(!d.path().join("runs").exists());
}

#[test]
fn small_input_errors_name_the_right_key_and_the_integer_label_column_works() {
    let d = kiln::testdir::tempdir().unwrap();
    write(
        d.path(),
        "d.csv",
        "0,1.0,2.0\n1,3.0,4.0\n0,1.5,2.5\n1,3.5,4.5\n",
    );
    write(
        d.path(),
        "e.toml",
        "[model]\ninput_size = 2\nclasses = 2\n[data]\nkind = \"csv\"\npath = \"d.csv\"\nheader = false\nlabel_column = 0\nclasses = 2\n[train]\nbatch_size = 2\nmax_steps = 2\n",
    );
    let o = kiln(d.path(), &["run", "e.toml", "--quiet"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    // an eval file that cannot be read is reported as data.eval_path
    std::fs::write(d.path().join("bad.csv"), [0xffu8, 0xfe, b'\n']).unwrap();
    let o = kiln(
        d.path(),
        &["run", "e.toml", "--set", "data.eval_path=\"bad.csv\""],
    );
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("(data.eval_path)"), "{}", stderr(&o));
    // the value that was set is blamed, not the default beside it
    write(d.path(), "t.toml", TINY);
    let o = kiln(d.path(), &["check", "t.toml", "--set", "launch.nnodes=2"]);
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--> --set launch.nnodes=2"),
        "{}",
        stderr(&o)
    );
    // sizes that would overflow or exhaust memory, before anything is allocated
    std::fs::remove_dir_all(d.path().join("runs")).unwrap();
    for (set, want) in [
        ("train.grad_accum_steps=1073741824", "the global batch"),
        (
            "model.hidden_sizes=[16000000, 16000000]",
            "the model does not fit",
        ),
        ("strategy.timeout_secs=99999999999", "at most 604800"),
    ] {
        let o = kiln(
            d.path(),
            &[
                "run",
                "t.toml",
                "--set",
                set,
                "--set",
                "train.batch_size=64",
            ],
        );
        assert_eq!(code(&o), Some(2), "{set}: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "{set}: {}", stderr(&o));
    }
    let o = kiln(d.path(), &["check", "/dev/zero"]);
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("not a regular file"), "{}", stderr(&o));
    assert!(!d.path().join("runs").exists());
}

/// Item 8: a job token that could not fit in a hello (or is not plain text) is exit 2 before
/// anything connects, naming where it came from.
#[test]
fn a_job_token_too_long_or_not_plain_text_is_refused_up_front() {
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    let long = "a".repeat(5000);
    let from_file = "launch.token_file=\"/dev/zero\"";
    // (token in KILN_JOB_TOKEN, or a --set, and what the error says)
    for (token, set, says) in [
        (
            Some(long.as_str()),
            None,
            "the job token from KILN_JOB_TOKEN is longer than 1024 bytes",
        ),
        (
            Some("to ken"),
            None,
            "the job token from KILN_JOB_TOKEN contains ' '",
        ),
        // a token file is read only as far as a token may go
        (
            None,
            Some(from_file),
            "the job token from `/dev/zero` (launch.token_file) is longer",
        ),
    ] {
        let mut args = vec!["run", "t.toml", "--quiet", "--set", "strategy.kind=ddp"];
        args.extend(["--nnodes", "2", "--node-rank", "1"]);
        if let Some(set) = set {
            args.extend(["--set", set]);
        }
        let env: Vec<(&str, &str)> = token.map(|t| ("KILN_JOB_TOKEN", t)).into_iter().collect();
        let o = kiln_env(d.path(), &args, &env);
        assert_eq!(code(&o), Some(2), "{}", stderr(&o));
        assert!(stderr(&o).contains(says), "{}", stderr(&o));
        assert!(
            stderr(&o).contains("openssl rand -hex 16"),
            "{}",
            stderr(&o)
        );
    }
}
