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
    // a new commit (or a checkout) is another build; so is another lock file
    for p in [".git/HEAD", ".git/packed-refs", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={p}");
    }
    if let Ok(head) = std::fs::read_to_string(".git/HEAD") {
        if let Some(r) = head.trim().strip_prefix("ref: ") {
            println!("cargo:rerun-if-changed=.git/{r}");
        }
    }
}
