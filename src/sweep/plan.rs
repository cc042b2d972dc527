//! A sweep's trials, planned: the base config and every trial resolved and checked before
//! any runs, each with its id (a hash of its resolved config).

use super::{dir_of, expand, Ledger, SweepSpec, Trial};
use crate::config::{self, Config, SweepConfig};
use crate::error::{Error, Result};
/// A checked trial, ready to run.
#[derive(Debug, Clone)]
pub struct Planned {
    pub trial: Trial,
    pub id: String,
    pub config: Config,
    /// The config as its run directory stores it (data paths absolute).
    pub stored: Config,
    /// Its resolved config (with the source of every value).
    pub resolved: config::Resolved,
}

/// A trial's id: a short hash of its resolved config (the `[sweep]` and `[slurm]` sections
/// aside), input files by their absolute paths (`Resolved::canonical`): one id however the
/// experiment file was spelled and wherever the sweep runs from.
pub fn trial_id(r: &config::Resolved) -> String {
    id_of(r.canonical())
}

/// A trial's id as sweeps made it before input paths were canonical (issue 58, defect 1): paths as
/// the experiment file spells them. A sweep directory whose ledger knows a trial by this id
/// keeps it (its directory has that name).
fn legacy_trial_id(r: &config::Resolved) -> String {
    let mut c = r.config.clone();
    c.sweep = SweepConfig::default();
    c.slurm = crate::config::SlurmConfig::default();
    config::config_hash(&c)[..8].to_string()
}

fn id_of(mut c: Config) -> String {
    c.sweep = SweepConfig::default();
    c.slurm = crate::config::SlurmConfig::default();
    // (a trial given a tracking server's password is the trial resumed without it; its threads
    // are the session's: the sweep sets them, and `OMP_NUM_THREADS` may)
    c.log.mlflow = c.log.mlflow.as_ref().map(|m| m.stored());
    c.backend.threads = 0;
    config::config_hash(&c)[..8].to_string()
}

/// Resolves the base config and every trial; nothing is written. Errors name the trial.
pub fn plan(spec: &SweepSpec, env: &[(String, String)]) -> Result<(Config, Vec<Planned>)> {
    let base = config::load(&spec.file, env, &spec.sets)?;
    let trials = expand(&base.config.sweep).map_err(|e| Error::Usage(e.to_string()))?;
    // the trials an existing sweep directory knows: one that knows a trial by its id of old
    // keeps that id
    let known = Ledger {
        path: dir_of(spec, &base.config).join("sweep.jsonl"),
    }
    .latest();
    let mut planned: Vec<Planned> = Vec::with_capacity(trials.len());
    for trial in trials {
        let mut sets = spec.sets.clone();
        sets.extend(trial.set_args());
        let r = config::load(&spec.file, env, &sets).map_err(|e| {
            Error::Usage(format!(
                "sweep trial {} ({}): {e}",
                trial.index,
                trial.describe()
            ))
        })?;
        crate::backend::resolve(&r.config).map_err(|e| {
            Error::Usage(format!(
                "sweep trial {} ({}): {e}",
                trial.index,
                trial.describe()
            ))
        })?;
        crate::model::registry().check(&r).map_err(|e| {
            Error::Usage(format!(
                "sweep trial {} ({}): {e}",
                trial.index,
                trial.describe()
            ))
        })?;
        let mut id = trial_id(&r);
        let legacy = legacy_trial_id(&r);
        if !known.contains_key(&id) && known.contains_key(&legacy) {
            id = legacy;
        }
        if let Some(p) = planned.iter().find(|p| p.id == id) {
            return Err(Error::Usage(format!(
                "sweep trials {} ({}) and {} ({}) resolve to the same config; remove the duplicate values",
                p.trial.index,
                p.trial.describe(),
                trial.index,
                trial.describe()
            )));
        }
        planned.push(Planned {
            trial,
            id,
            stored: crate::rundir::stored_config(&r),
            config: r.config.clone(),
            resolved: r,
        });
    }
    Ok((base.config, planned))
}

/// An asha sweep's metric is one its trials report (checked on the first trial's data and
/// model when a sweep is started or resumed, not at each Slurm segment's end).
pub(super) fn check_metric(base: &Config, planned: &[Planned]) -> Result<()> {
    match planned.first() {
        Some(p) if base.sweep.scheduler == crate::config::SweepScheduler::Asha => {
            crate::launch::check_sweep_metric(&p.resolved)
        }
        _ => Ok(()),
    }
}
