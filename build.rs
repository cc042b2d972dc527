//! What `env.json` and `kiln env --json` say about the build: the git commit of the source
//! (when built from a git checkout), the rustc that compiled it and the Burn version locked.
//! Nothing here can fail the build: a fact that cannot be found is "unknown".

use std::process::Command;

fn main() {
    let out = |cmd: &mut Command| {
        cmd.output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .filter(|s| !s.is_empty())
    };
    // the commit checked out (changes not committed are not told apart: the script reruns
    // when HEAD moves, not on every edit)
    let commit = out(Command::new("git").args(["rev-parse", "HEAD"]));
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let rustc_version = out(Command::new(rustc).arg("-V"));
    let burn = std::fs::read_to_string("Cargo.lock").ok().and_then(|lock| {
        let at = lock.find("name = \"burn\"\nversion = \"")?;
        let rest = &lock[at + "name = \"burn\"\nversion = \"".len()..];
        Some(rest[..rest.find('"')?].to_string())
    });
    println!(
        "cargo:rustc-env=KILN_GIT_COMMIT={}",
        commit.unwrap_or_else(|| "unknown".into())
    );
    println!(
        "cargo:rustc-env=KILN_RUSTC={}",
        rustc_version.unwrap_or_else(|| "unknown".into())
    );
    println!(
        "cargo:rustc-env=KILN_BURN_VERSION={}",
        burn.unwrap_or_else(|| "unknown".into())
    );
    // a new commit (or a checkout) is another build; so is another lock file. Only files that
    // exist are named (cargo takes a missing one as changed, and would run this every build);
    // `git rev-parse --git-path` finds them in a worktree or submodule too.
    println!("cargo:rerun-if-changed=Cargo.lock");
    let git_path = |p: &str| out(Command::new("git").args(["rev-parse", "--git-path", p]));
    let mut watch = vec![git_path("HEAD")];
    if let Some(head) = watch[0]
        .as_ref()
        .and_then(|h| std::fs::read_to_string(h).ok())
    {
        if let Some(r) = head.trim().strip_prefix("ref: ") {
            watch.push(git_path(r));
        }
    }
    watch.push(git_path("packed-refs"));
    for p in watch.into_iter().flatten() {
        if std::path::Path::new(&p).exists() {
            println!("cargo:rerun-if-changed={p}");
        }
    }
}
