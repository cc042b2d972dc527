//! The fused CPU kernels (`backend.fused`, on by default) against Burn's own ops on a whole
//! training run: nanoGPT's baby GPT (`experiments/bench-baby-gpt.toml`) gives the same losses
//! step by step either way.

use crate::common::{kiln, losses, root, stderr};

/// The loss of every step of 30 of the baby GPT, with `fused` on or off.
fn baby_gpt_losses(fused: bool) -> Vec<f64> {
    let d = kiln::testdir::tempdir().unwrap();
    let file = root().join("experiments/bench-baby-gpt.toml");
    let o = kiln(
        d.path(),
        &[
            "run",
            file.to_str().unwrap(),
            "--quiet",
            "--set",
            "train.max_steps=30",
            "--set",
            "train.log_every=1",
            "--set",
            &format!("backend.fused={fused}"),
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    losses(&d.path().join("runs/bench-baby-gpt"))
}

#[test]
fn fused_kernels_and_burns_ops_give_the_baby_gpt_the_same_30_step_losses() {
    let (fused, burn) = (baby_gpt_losses(true), baby_gpt_losses(false));
    assert_eq!(fused.len(), 30);
    assert_eq!(burn.len(), 30);
    for (i, (a, b)) in fused.iter().zip(&burn).enumerate() {
        assert!(
            (a - b).abs() <= 1e-4 * b.abs(),
            "step {}: fused {a} vs Burn's ops {b}",
            i + 1
        );
    }
    // (random tokens: the loss stays near ln 65, but it moves from step to step)
    assert!(fused.windows(2).all(|w| w[0] != w[1]), "{fused:?}");
}
