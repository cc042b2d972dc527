//! `[log]`: where a run's metrics go besides `metrics.jsonl`.

use serde::{Deserialize, Serialize};

#[allow(unused_imports)]
use super::*;

/// `[log]`: where a run's metrics go besides `metrics.jsonl`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// Also write TensorBoard event files (`tb/events.out.tfevents.<time>.<host>` in the run
    /// directory: every number of `metrics.jsonl` by step; `tensorboard --logdir runs`).
    /// Default: `false`.
    pub tensorboard: bool,
    /// `[log.mlflow]`: the run (or each trial of a sweep, tagged with it) becomes an MLflow run,
    /// sent by a background thread. Default: unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mlflow: Option<MlflowConfig>,
}

/// `[log.mlflow]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MlflowConfig {
    /// The tracking server, `http://host:port` (MLflow's REST API over plain HTTP).
    pub uri: String,
    /// The MLflow experiment, made when missing. Default: `experiment.name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experiment: Option<String>,
}

impl LogConfig {
    pub fn is_default(&self) -> bool {
        *self == LogConfig::default()
    }

    /// `log.mlflow.uri` an http:// address with a host; an experiment name that is not empty.
    pub(super) fn check(&self, r: &super::load::Resolved) -> Result<(), super::error::ConfigError> {
        let Some(m) = &self.mlflow else {
            return Ok(());
        };
        if let Err(why) = http_address(&m.uri) {
            return Err(r.key_error(
                "log.mlflow.uri",
                format!("`log.mlflow.uri` = {why}"),
                Some("e.g. \"http://127.0.0.1:5000\" (`mlflow server --port 5000`)".into()),
            ));
        }
        if m.experiment.as_deref().is_some_and(|e| e.trim().is_empty()) {
            return Err(r.key_error(
                "log.mlflow.experiment",
                "`log.mlflow.experiment` is empty".into(),
                Some("name the MLflow experiment, or leave it out for `experiment.name`".into()),
            ));
        }
        Ok(())
    }
}

/// Whether `uri` is `http://host[:port][/path]` (config sits below track, which talks to it).
pub fn http_address(uri: &str) -> Result<(), String> {
    let rest = uri.strip_prefix("http://").ok_or_else(|| {
        format!("{uri:?} is not an http:// address (kiln speaks plain HTTP to MLflow's REST API; put a local proxy in front of an https server)")
    })?;
    let hostport = rest.split('/').next().unwrap_or_default();
    let (host, port) = match hostport.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (hostport, None),
    };
    if host.is_empty() || host.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("{uri:?} names no host"));
    }
    if let Some(p) = port.filter(|p| p.parse::<u16>().is_err()) {
        return Err(format!("{uri:?}: {p:?} is not a port"));
    }
    Ok(())
}
