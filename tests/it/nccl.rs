//! `[backend.nccl]`: NCCL's variables from the experiment file, checked up front and shown by
//! `kiln env` with where each comes from.

use crate::common::{kiln, kiln_env, stderr, stdout, write};

const CUDA: &str = r#"
[experiment]
name = "nccl"

[backend]
device = "cuda"

[backend.nccl]
algo = "Ring"
debug = "warn"
ib_disable = true
extra = { NCCL_BUFFSIZE = 4194304 }
"#;

#[test]
fn a_bad_nccl_key_or_value_is_exit_2_naming_the_key() {
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "x.toml", CUDA);
    for (set, want) in [
        (
            "backend.nccl.extra.NCCL_SOCKET_NTHREAD=4",
            "`backend.nccl.extra.NCCL_SOCKET_NTHREAD`: `NCCL_SOCKET_NTHREAD` is not a variable NCCL reads",
        ),
        (
            "backend.nccl.nsocks_perthread=\"four\"",
            "`backend.nccl.nsocks_perthread` has the wrong type: found string \"four\", expected a non-negative integer",
        ),
        (
            "backend.nccl.extra.NCCL_BUFFSIZE=1.5",
            "`backend.nccl.extra.NCCL_BUFFSIZE` has the wrong type: found float `1.5`, expected a string, an integer or a boolean",
        ),
        (
            "backend.nccl.proto=\"LL129\"",
            "`backend.nccl.proto` = \"LL129\": `LL129` is not an NCCL protocol",
        ),
        ("backend.nccl.algoo=\"Ring\"", "backend.nccl.algoo"),
    ] {
        let o = kiln(d.path(), &["check", "x.toml", "--set", set]);
        assert_eq!(o.status.code(), Some(2), "{set}: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "{set}: {}", stderr(&o));
    }
    let o = kiln(
        d.path(),
        &[
            "check",
            "x.toml",
            "--set",
            "backend.nccl.extra.NCCL_SOCKET_NTHREAD=4",
        ],
    );
    assert!(
        stderr(&o).contains("did you mean `NCCL_SOCKET_NTHREADS`?"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn kiln_env_shows_each_nccl_variable_and_its_source() {
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "x.toml", CUDA);
    let o = kiln_env(
        d.path(),
        &["env", "x.toml"],
        &[
            ("NCCL_ALGO", "Tree"),
            ("NCCL_IB_HCA", "mlx5"),
            ("NCCL_ALOG", "Ring"),
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    for line in [
        "nccl variables of a run of x.toml:",
        "  NCCL_ALGO=Ring  (backend.nccl.algo; replaces NCCL_ALGO=Tree of this environment)",
        "  NCCL_DEBUG=WARN  (backend.nccl.debug)",
        "  NCCL_IB_DISABLE=1  (backend.nccl.ib_disable)",
        "  NCCL_BUFFSIZE=4194304  (backend.nccl.extra.NCCL_BUFFSIZE)",
        "  NCCL_IB_HCA=mlx5  (environment NCCL_IB_HCA)",
        "  warning: NCCL_ALOG in this environment is not a variable NCCL reads; did you mean NCCL_ALGO?",
    ] {
        assert!(out.lines().any(|l| l == line), "missing {line:?} in\n{out}");
    }
    // issue 31: NCCL's values in any case, as NCCL reads them; exported as NCCL spells them
    for value in ["INFO", "Info", "info"] {
        let o = kiln(
            d.path(),
            &[
                "env",
                "x.toml",
                "--set",
                &format!("backend.nccl.debug=\"{value}\""),
            ],
        );
        assert_eq!(o.status.code(), Some(0), "{value}: {}", stderr(&o));
        assert!(
            stdout(&o)
                .lines()
                .any(|l| l == "  NCCL_DEBUG=INFO  (backend.nccl.debug)"),
            "{value}: {}",
            stdout(&o)
        );
    }
    let o = kiln(
        d.path(),
        &["check", "x.toml", "--set", "backend.nccl.debug=\"LOUD\""],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("VERSION, WARN, INFO, ABORT"),
        "{}",
        stderr(&o)
    );
    // a bad file is exit 2 before anything is printed
    write(d.path(), "bad.toml", "[backend.nccl]\nalgo = 3\n");
    let o = kiln(d.path(), &["env", "bad.toml"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stdout(&o).is_empty());
}
