//! `kiln eval`'s work: a checkpoint of a run evaluated on the run's evaluation data (or other
//! data of the same shape, through `--set data.*`), exactly as the run evaluates: the same
//! backend, the same per-rank split and batches, the same summation order. On the run's own data
//! it gives the bits the run logged.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::backend::{self, BackendKind, RankBackend};
use crate::config;
use crate::error::{Error, Result};
use crate::model::Model;
use crate::rundir::{checkpoint_store, write_json};
use crate::train::{evaluate_like_run, EvalSums};

/// What to evaluate.
#[derive(Debug, Clone, Default)]
pub struct EvalOptions {
    /// A checkpoint name (`step-00000040`) or `best`, instead of the newest verified one.
    pub from: Option<String>,
    /// `--set` flags: `data.*` keys only (the model is the checkpoint's).
    pub sets: Vec<String>,
}

/// `evals/<checkpoint>-<time>.json`, and what `kiln eval` prints.
#[derive(Debug, Clone, Serialize)]
pub struct EvalReport {
    pub checkpoint: String,
    pub step: usize,
    pub eval_loss: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_accuracy: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_perplexity: Option<f64>,
    pub eval_samples: u64,
    /// The evaluation data: the run's own, or what `--set` named.
    pub data: serde_json::Value,
    /// `--set` flags given.
    pub sets: Vec<String>,
    /// When (RFC 3339, UTC).
    pub time: String,
    /// Where this report was written.
    #[serde(skip)]
    pub written: PathBuf,
}

/// Evaluates a checkpoint of the run in `run_dir` and writes the report to its `evals/`.
pub fn eval(run_dir: &Path, o: &EvalOptions) -> Result<EvalReport> {
    for s in &o.sets {
        let key = s.split('=').next().unwrap_or("").trim();
        if !key.starts_with("data.") {
            return Err(Error::Usage(format!(
                "kiln eval takes only `data.*` settings (the model and its training are the checkpoint's): `--set {s}`\n  = help: evaluate other data with e.g. `--set data.eval_path=\"other.csv\"`"
            )));
        }
    }
    let file = crate::rundir::run_config_file(run_dir)?;
    let env: Vec<(String, String)> = std::env::vars().collect();
    let r = config::load_run(&file, &env, &o.sets, &[])?;
    // the run's own tokenizer, unchanged (one given anew is not compared: issue 45, defect 14)
    crate::rundir::inputs::refuse_changed(
        run_dir,
        &r,
        Some(&crate::rundir::inputs::TOKENIZER_KEYS),
        "kiln eval",
    )?;
    let c = &r.config;
    let store = checkpoint_store(run_dir)?;
    // the one place it writes: evals/ and its files are never written through a link
    if std::fs::symlink_metadata(run_dir.join("evals")).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(crate::rundir::link_refused(&run_dir.join("evals")));
    }
    let (path, (state, model, loaded)) =
        crate::launch::read_model_checkpoint(&store, o.from.as_deref(), &r)?;
    let data = crate::data::load(&r)?;
    let ds = data.eval.as_ref().ok_or_else(|| {
        Error::Usage(format!(
            "`{}` has no evaluation data\n  = help: name some with --set data.eval_path=\"FILE\" (csv, idx, text, tokens, jsonl, parquet) or --set data.eval_samples=N (synthetic)",
            run_dir.display()
        ))
    })?;
    if data.input_shape() != state.input_shape {
        return Err(Error::Usage(format!(
            "the data's samples have shape {:?} but the checkpoint's model takes {:?}; evaluate data of the shape it was trained on",
            data.input_shape(),
            state.input_shape
        )));
    }
    // the split and batches of the run's own evaluation, as the checkpoint records them
    let placement = backend::resolve(c)?;
    let ordinal = placement.ordinals.first().copied().unwrap_or(0);
    let (world, batch) = (state.world_size.max(1), state.micro_batch.max(1));
    let params = &loaded.params;
    let m = model.as_ref();
    let be = &c.backend;
    macro_rules! dispatch {
        ($($(#[$a:meta])* $v:ident = $name:literal => $ty:ty),* $(,)?) => {
            match placement.backend {
                $($(#[$a])* BackendKind::$v => on::<$ty>(m, params, ds, world, batch, be, ordinal),)*
            }
        };
    }
    let sums = crate::model::for_each_backend!(dispatch)?;
    let name = path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let m = crate::train::EvalMetrics::of(model.task(), &sums);
    let now = std::time::SystemTime::now();
    let d = &c.data;
    let mut report = EvalReport {
        checkpoint: name.clone(),
        step: state.step,
        eval_loss: m.loss,
        eval_accuracy: m.accuracy,
        eval_perplexity: m.perplexity,
        eval_samples: m.samples,
        data: serde_json::json!({
            "kind": crate::config::choice_name(&d.kind),
            "eval_path": d.eval_path,
            "eval_labels_path": d.eval_labels_path,
            "eval_samples": ds.len(),
        }),
        sets: o.sets.clone(),
        time: crate::ui::rfc3339(now),
        written: PathBuf::new(),
    };
    let dir = run_dir.join("evals");
    std::fs::create_dir_all(&dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    // a second evaluation in the same second gets its own file
    let stem = format!("{name}-{}", crate::ui::compact_utc(now));
    let mut out = dir.join(format!("{stem}.json"));
    let mut n = 2;
    while out.exists() {
        out = dir.join(format!("{stem}-{n}.json"));
        n += 1;
    }
    write_json(&out, &report)?;
    report.written = out;
    Ok(report)
}

fn on<B: RankBackend>(
    model: &dyn Model,
    params: &[f32],
    ds: &crate::data::Dataset,
    world: usize,
    batch: usize,
    be: &crate::config::BackendConfig,
    ordinal: usize,
) -> Result<EvalSums> {
    let device = B::rank_device(be, ordinal);
    B::prepare(&device, be.precision).map_err(crate::error::Error::Usage)?;
    let compute = B::compute(model, &device, be.fused);
    Ok(evaluate_like_run(
        compute.as_ref(),
        params,
        ds,
        world,
        batch,
    )?)
}
