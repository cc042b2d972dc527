//! `kiln run`: resolves and checks everything first (bad input exits 2 with nothing written),
//! then creates the run directory, trains, and writes `config.toml`, `metrics.jsonl` and
//! `summary.json`.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use clap::Args;
use serde::Serialize;

use super::ConfigArgs;
use crate::backend;
use crate::config::{self, StrategyKind};
use crate::data;
use crate::error::{Error, Result};
use crate::model::Mlp;
use crate::plan::Plan;
use crate::launch::RunResult;
use crate::strategy::Memory;
use crate::train::{TrainEvent, TrainInput};
use crate::ui::Progress;

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Write the run here instead of `<output_dir>/<experiment.name>` (must not hold a run).
    #[arg(long, value_name = "DIR")]
    pub run_dir: Option<PathBuf>,
    /// No progress bar and no status lines (the run directory is still printed).
    #[arg(long)]
    pub quiet: bool,
}

/// `summary.json`.
#[derive(Debug, Serialize)]
pub struct Summary {
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub steps: usize,
    pub epochs: f64,
    pub final_loss: Option<f64>,
    pub eval_loss: Option<f64>,
    pub eval_accuracy: Option<f64>,
    /// Evaluation samples counted (each exactly once, whatever the world size).
    pub eval_samples: Option<u64>,
    pub wall_seconds: f64,
    pub samples_per_sec: f64,
    pub world_size: usize,
    pub strategy: StrategyKind,
    pub global_batch: usize,
    pub backend: &'static str,
    pub num_params: usize,
    pub config_hash: String,
    /// Per rank: bytes held for parameters, gradients and optimizer state.
    pub memory: Vec<Memory>,
}

fn is_empty_dir(p: &Path) -> bool {
    fs::read_dir(p).map(|mut d| d.next().is_none()).unwrap_or(false)
}

/// `<output_dir>/<name>`, or the next free `<name>-2`, `<name>-3`, ... when it holds a run.
pub fn choose_run_dir(output_dir: &Path, name: &str) -> PathBuf {
    let free = |p: &Path| !p.exists() || is_empty_dir(p);
    let base = output_dir.join(name);
    if free(&base) {
        return base;
    }
    (2..)
        .map(|i| output_dir.join(format!("{name}-{i}")))
        .find(|p| free(p))
        .unwrap_or(base)
}

fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| Error::io(format!("serialising {}", path.display()), std::io::Error::other(e)))?;
    let tmp = path.with_extension("json.tmp");
    fs::write(&tmp, text + "\n").map_err(|e| Error::io(format!("writing {}", tmp.display()), e))?;
    fs::rename(&tmp, path).map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

pub fn run(a: &RunArgs) -> Result<()> {
    // Everything that can be bad input is checked before the run directory exists.
    let r = a.config.resolve()?;
    let c = &r.config;
    let be = backend::resolve(&c.backend)?;
    let data = data::load(&r)?;
    let mlp = Mlp::new(&c.model);
    let plan = Plan::new(c, data.train.len(), mlp.num_params());
    let run_dir = match &a.run_dir {
        Some(d) if d.exists() && !is_empty_dir(d) => {
            return Err(Error::Usage(format!(
                "--run-dir `{}` already holds a run; choose a new directory (kiln never overwrites a run)",
                d.display()
            )))
        }
        Some(d) => d.clone(),
        None => choose_run_dir(Path::new(&c.experiment.output_dir), &c.experiment.name),
    };
    fs::create_dir_all(&run_dir)
        .map_err(|e| Error::io(format!("creating run directory {}", run_dir.display()), e))?;
    let config_hash = config::config_hash(c);
    fs::write(run_dir.join("config.toml"), config::to_toml(c))
        .map_err(|e| Error::io(format!("writing {}/config.toml", run_dir.display()), e))?;
    println!("run dir: {}", run_dir.display());

    let mut ui = Progress::new(a.quiet);
    ui.info(&plan.describe());
    ui.info(&format!(
        "backend: {} ({} threads per rank), strategy {:?} on {} device(s)",
        be.name(),
        backend::threads(&c.backend, plan.world_size),
        c.strategy.kind,
        plan.world_size
    ));
    let logs = run_dir.join("logs");
    fs::create_dir_all(&logs).map_err(|e| Error::io(format!("creating {}", logs.display()), e))?;
    let metrics_path = run_dir.join("metrics.jsonl");
    let mut metrics = BufWriter::new(
        File::create(&metrics_path).map_err(|e| Error::io(format!("creating {}", metrics_path.display()), e))?,
    );
    let mut write_err: Option<std::io::Error> = None;
    let input = TrainInput {
        config: c,
        plan: &plan,
        data: &data,
        mlp: &mlp,
    };
    let result = backend::train(be, &c.backend, &input, Some(&logs), &mut |ev| match ev {
        TrainEvent::Started { total_steps } => ui.start(total_steps),
        TrainEvent::Step {
            step,
            loss,
            samples_per_sec,
            line,
        } => {
            ui.step(step, loss, samples_per_sec);
            if let Some(line) = line {
                let res = serde_json::to_string(&line)
                    .map_err(std::io::Error::other)
                    .and_then(|s| writeln!(metrics, "{s}"))
                    .and_then(|_| metrics.flush());
                if let Err(e) = res {
                    write_err.get_or_insert(e);
                }
            }
        }
    });
    ui.finish();
    if let Some(e) = write_err {
        return Err(Error::io(format!("writing {}", metrics_path.display()), e));
    }
    let summary = |status, error: Option<String>, res: Option<&RunResult>| {
        let o = res.map(|r| &r.outcome);
        Summary {
        status,
        error,
        steps: o.map(|o| o.steps).unwrap_or(0),
        epochs: o.map(|o| o.epochs).unwrap_or(0.0),
        final_loss: o.map(|o| o.final_loss),
        eval_loss: o.and_then(|o| o.eval.map(|e| e.loss())),
        eval_accuracy: o.and_then(|o| o.eval.map(|e| e.accuracy())),
        eval_samples: o.and_then(|o| o.eval.map(|e| e.count)),
        wall_seconds: o.map(|o| o.wall_seconds).unwrap_or(0.0),
        samples_per_sec: o.map(|o| o.samples_per_sec).unwrap_or(0.0),
        world_size: plan.world_size,
        strategy: c.strategy.kind,
        global_batch: plan.global_batch,
        backend: be.name(),
        num_params: plan.num_params,
        config_hash: config_hash.clone(),
        memory: res.map(|r| r.memory.clone()).unwrap_or_default(),
    }};
    match result {
        Ok(res) => {
            write_json(&run_dir.join("summary.json"), &summary("finished", None, Some(&res)))?;
            let out = &res.outcome;
            let eval = match out.eval {
                Some(e) => format!(", eval loss {:.4}, eval accuracy {:.3}", e.loss(), e.accuracy()),
                None => String::new(),
            };
            println!(
                "finished {} steps in {:.1}s: final loss {:.4}{eval}; run dir: {}",
                out.steps,
                out.wall_seconds,
                out.final_loss,
                run_dir.display()
            );
            Ok(())
        }
        Err(e) => {
            let e = Error::from(e);
            write_json(&run_dir.join("summary.json"), &summary("failed", Some(e.to_string()), None))?;
            println!("failed; run dir: {}", run_dir.display());
            Err(e)
        }
    }
}
