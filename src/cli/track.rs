//! `kiln track push RUN_DIR`: sends a run's metrics to its MLflow server (`[log.mlflow]`), what a
//! session could not send while the server was down, and sets the MLflow run's status.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use crate::config::Config;
use crate::error::{Error, Result};

#[derive(Debug, Subcommand)]
pub enum TrackCommand {
    /// Send what MLflow lacks of a run (its metrics, its status): the server named by the run's
    /// `[log.mlflow]`, or `--uri`.
    Push(PushArgs),
}

#[derive(Debug, Args)]
pub struct PushArgs {
    /// The run directory.
    pub run_dir: PathBuf,
    /// The tracking server (else the run's `log.mlflow.uri`).
    #[arg(long)]
    pub uri: Option<String>,
    /// The MLflow experiment (else the run's `log.mlflow.experiment`, else `experiment.name`).
    #[arg(long)]
    pub experiment: Option<String>,
}

pub fn track(c: &TrackCommand) -> Result<()> {
    let TrackCommand::Push(a) = c;
    let path = a.run_dir.join("config.toml");
    let text = std::fs::read_to_string(&path).map_err(|_| {
        Error::Usage(format!(
            "`{}` is not a run directory (no config.toml)",
            a.run_dir.display()
        ))
    })?;
    // a run that is training sends its own lines; a push beside it would make the same MLflow
    // run twice over (issue 58, defect 10: sqlite's UNIQUE constraint failed)
    if let Some(pid) = crate::rundir::holder(&a.run_dir) {
        return Err(Error::Usage(format!(
            "`{}` is running (pid {pid}): its own sender sends its metrics to MLflow\n  = help: push it when the run has ended (or was stopped)",
            a.run_dir.display()
        )));
    }
    let cfg: Config = toml::from_str(&text).map_err(|e| {
        Error::Usage(format!(
            "`{}` does not parse ({})",
            path.display(),
            e.message()
        ))
    })?;
    let m = cfg.log.mlflow.as_ref();
    let Some(uri) = a.uri.clone().or_else(|| m.map(|m| m.uri.clone())) else {
        return Err(Error::Usage(format!(
            "`{}` has no [log.mlflow] and no --uri was given\n  = help: `kiln track push {} --uri http://HOST:PORT`",
            a.run_dir.display(),
            a.run_dir.display()
        )));
    };
    crate::config::http_address(&uri).map_err(|e| Error::Usage(format!("--uri: {e}")))?;
    let shown = crate::config::redact(&uri);
    let experiment = a
        .experiment
        .clone()
        .or_else(|| m.and_then(|m| m.experiment.clone()))
        .unwrap_or_else(|| cfg.experiment.name.clone());
    let (state, sent) = crate::track::mlflow::push(&a.run_dir, &uri, &experiment)
        .map_err(|e| Error::Invalid(format!("MLflow at {shown}: {e}")))?;
    crate::ui::out(&format!(
        "sent {sent} metric line(s) of {} to MLflow run {} (experiment {}) at {shown}",
        a.run_dir.display(),
        state.run_id,
        state.experiment_id
    ));
    Ok(())
}
