//! `kiln sweep FILE --executor slurm`: the trials as one Slurm job array, at most `parallel` at
//! once (`%N`). Each array task runs `kiln resume <trial dir>` (a fresh start when the trial has
//! no checkpoint), so a requeued, cancelled or failed trial continues where it stopped when the
//! sweep is submitted again. The ledger records each trial's job and array index; `refresh`
//! folds Slurm's states and the trials' summaries back into it, and a new submission skips the
//! trials that are done, queued or running.

use std::fs;
use std::path::{Path, PathBuf};

use super::scheduler::{ledger_io, plan, record, rows, sweep_dir, write_results, Lock};
use super::{to_text, Executor, Ledger, Record, SweepSpec, TrialState};
use crate::config;
use crate::error::{Error, Result};
use crate::launch::slurm::{self as sl, have_sbatch};
use crate::ui;

/// Brings the ledger up to date for trials submitted to Slurm: done (their summary says
/// finished), queued or running (Slurm still has them), preempted (stopped with a checkpoint
/// and no longer queued), or failed (why, from the summary or Slurm).
pub fn refresh(dir: &Path, ledger: &Ledger, metric: &str) -> Result<()> {
    for (id, rec) in ledger.latest() {
        let (Some(job), Some(idx)) = (rec.job.clone(), rec.array_index) else {
            continue;
        };
        if !matches!(
            rec.state,
            TrialState::Queued | TrialState::Running | TrialState::Preempted
        ) {
            continue;
        }
        let summary: Option<serde_json::Value> =
            fs::read_to_string(dir.join(&id).join("summary.json"))
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok());
        let status = summary
            .as_ref()
            .and_then(|s| s["status"].as_str().map(str::to_string));
        let task = format!("{job}_{idx}");
        let slurm = sl::query(&task);
        let mut next = Record {
            time: rec.time,
            exit: None,
            metric: None,
            error: None,
            ..rec.clone()
        };
        next.state = match (status.as_deref(), &slurm) {
            (Some("finished"), _) => {
                next.metric = summary.as_ref().and_then(|s| s[metric].as_f64());
                next.exit = Some(0);
                TrialState::Done
            }
            (_, Some(st)) if st.live() => match st.word() {
                "running" => TrialState::Running,
                _ => TrialState::Queued,
            },
            (Some("preempted"), _) => {
                next.error = Some(format!(
                    "preempted at step {}; not queued any more (Slurm task {task}): submit the sweep again to continue it",
                    summary.as_ref().map(|s| s["steps"].to_string()).unwrap_or_default()
                ));
                TrialState::Preempted
            }
            (_, st) => {
                next.error = Some(
                    summary
                        .as_ref()
                        .and_then(|s| s["error"].as_str())
                        .map(|e| e.lines().next().unwrap_or("").to_string())
                        .unwrap_or_else(|| match st {
                            Some(st) => format!("Slurm task {task} ended {}", st.state),
                            None => {
                                format!("Slurm task {task} is gone and the trial did not finish")
                            }
                        }),
                );
                TrialState::Failed
            }
        };
        if next.state != rec.state || next.error != rec.error {
            next.time = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0);
            ledger.append(&next).map_err(ledger_io)?;
        }
    }
    Ok(())
}

/// Submits the trials that are not done, queued or running as one job array.
pub fn submit(spec: &SweepSpec, parallel: Option<usize>) -> Result<String> {
    let env: Vec<(String, String)> = std::env::vars().collect();
    let (base, planned) = plan(spec, &env)?;
    let s = &base.sweep;
    let parallel = parallel.unwrap_or(s.parallel).max(1);
    let shape = &base.slurm;
    if shape.tasks_per_node > 1 && base.backend.device == config::Device::Cuda {
        return Err(Error::Usage(
            "`slurm.tasks_per_node` > 1 with backend.device = \"cuda\": one kiln process drives all of a node's GPUs".into(),
        ));
    }
    if !have_sbatch() {
        return Err(Error::Usage(
            "`sbatch` is not on PATH: `kiln sweep --executor slurm` submits through Slurm's sbatch\n  = help: run it on a machine of the cluster (a login node), or use the local executor".into(),
        ));
    }
    let dir = sweep_dir(&base);
    let dir = if dir.is_absolute() {
        dir
    } else {
        std::env::current_dir()
            .map_err(|e| Error::io("finding the working directory", e))?
            .join(dir)
    };
    fs::create_dir_all(dir.join("logs"))
        .and_then(|_| fs::create_dir_all(dir.join("slurm")))
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let _lock = Lock::take(&dir)?;
    let spec_abs = SweepSpec {
        file: spec
            .file
            .canonicalize()
            .unwrap_or_else(|_| spec.file.clone()),
        sets: spec.sets.clone(),
        executor: Executor::Slurm,
    };
    crate::launch::write_json(&dir.join("sweep.json"), &spec_abs)?;
    let ledger = Ledger {
        path: dir.join("sweep.jsonl"),
    };
    let known = ledger.latest();
    for p in &planned {
        if !known.contains_key(&p.id) {
            ledger
                .append(&record(p, TrialState::Pending))
                .map_err(ledger_io)?;
        }
    }
    refresh(&dir, &ledger, &s.metric)?;
    let latest = ledger.latest();
    let todo: Vec<_> = planned
        .iter()
        .filter(|p| {
            !matches!(
                latest.get(&p.id).map(|r| r.state),
                Some(TrialState::Done | TrialState::Queued | TrialState::Running)
            )
        })
        .collect();
    if todo.is_empty() {
        let rows = rows(&dir, &ledger, s);
        write_results(&dir, &rows, &s.metric)?;
        ui::out(&to_text(&rows, &s.metric));
        ui::out(&format!(
            "nothing to submit: every trial of {} is done, queued or running",
            dir.display()
        ));
        return Ok(String::new());
    }
    // each trial's run directory holds its config (and token) before the array starts
    let nnodes = shape.nodes * shape.tasks_per_node;
    let mut created = Vec::new();
    let mut trials: Vec<(usize, PathBuf)> = Vec::new();
    for p in &todo {
        let run = dir.join(&p.id);
        if !run.join("config.toml").is_file() {
            if !run.exists() {
                created.push(run.clone());
            }
            let mut c = p.stored.clone();
            c.launch.nnodes = nnodes;
            c.launch.node_rank = 0;
            fs::create_dir_all(run.join("slurm"))
                .map_err(|e| Error::io(format!("creating {}", run.display()), e))?;
            if nnodes > 1 {
                let token = run.join("slurm/token");
                c.launch.token_file = Some(token.display().to_string());
                if !token.exists() {
                    sl::write_token(&token)?;
                }
            }
            fs::write(run.join("config.toml"), config::to_toml(&c))
                .map_err(|e| Error::io(format!("writing {}/config.toml", run.display()), e))?;
        }
        trials.push((p.trial.index, run));
    }
    let kiln = sl::kiln_exe()?;
    let script = sl::array_script(&base, &kiln, &dir, &trials, parallel);
    let n = fs::read_dir(dir.join("slurm"))
        .map(|d| d.count())
        .unwrap_or(0);
    let script_path = dir.join(format!("slurm/array-{}.sbatch", n + 1));
    fs::write(&script_path, &script)
        .map_err(|e| Error::io(format!("writing {}", script_path.display()), e))?;
    let id = match sl::sbatch(&script_path, &[]) {
        Ok(id) => id,
        Err(e) => {
            let _ = fs::remove_file(&script_path);
            for d in created {
                let _ = fs::remove_dir_all(d);
            }
            return Err(e);
        }
    };
    for p in &todo {
        let mut r = record(p, TrialState::Queued);
        r.job = Some(id.clone());
        r.array_index = Some(p.trial.index);
        ledger.append(&r).map_err(ledger_io)?;
    }
    let indices: Vec<String> = trials.iter().map(|(i, _)| i.to_string()).collect();
    ui::out(&format!(
        "submitted Slurm job array {id}: trial(s) {} of {}, at most {parallel} at once; sweep dir: {}",
        indices.join(","),
        planned.len(),
        dir.display()
    ));
    ui::note(&format!(
        "  = `kiln sweep status {}` shows them; their output is in logs/slurm-{id}_<index>.out",
        dir.display()
    ));
    Ok(id)
}
