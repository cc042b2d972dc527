//! `kiln eval RUN_DIR [--from step-N|best] [--set data.eval_path=...]`: prints a checkpoint's
//! evaluation metrics and keeps them in the run's `evals/`.

use std::path::PathBuf;

use clap::Args;

use crate::error::Result;
use crate::tools::{self, EvalOptions};
use crate::ui;

#[derive(Debug, Args)]
pub struct EvalArgs {
    /// The run directory (it holds config.toml and checkpoints/).
    pub run_dir: PathBuf,
    /// Evaluate this checkpoint (e.g. `step-00000040`, or `best` with `checkpoint.keep_best`)
    /// instead of the newest verified one.
    #[arg(long, value_name = "step-N|best")]
    pub from: Option<String>,
    /// Evaluate other data of the same shape, e.g. `--set data.eval_path="test.csv"` (only
    /// `data.*` keys; the value is parsed as TOML).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
}

pub fn eval(a: &EvalArgs) -> Result<()> {
    let o = EvalOptions {
        from: a.from.clone(),
        sets: a.sets.clone(),
    };
    let rep = tools::eval(&a.run_dir, &o)?;
    let metric = match (rep.eval_accuracy, rep.eval_perplexity) {
        (Some(acc), _) => format!(", eval accuracy {acc}"),
        (None, Some(ppl)) => format!(", eval perplexity {ppl}"),
        _ => String::new(),
    };
    ui::out(&format!(
        "{} (step {}) on {} samples: eval loss {}{metric}\nwrote {}",
        rep.checkpoint,
        rep.step,
        rep.eval_samples,
        rep.eval_loss,
        rep.written.display()
    ));
    Ok(())
}
