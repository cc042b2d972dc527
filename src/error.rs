//! Layer: error (above `train` and `backend`; below `launch`, which converts its own errors
//! into it).
//!
//! The top-level error: every failure maps to an exit code here (0 ok, 1 the run failed,
//! 2 bad input, 75 preempted: stopped by a signal with a checkpoint), and `main` prints it.

use crate::backend::BackendError;
use crate::config::ConfigError;
use crate::data::DataError;
use crate::train::TrainError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Data(#[from] DataError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The model could not be built from `[model]` (exit 2).
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    #[error(transparent)]
    Train(#[from] TrainError),
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    /// Joining a multi-node job failed (exit 1). Boxed so that this module imports nothing from
    /// `rendezvous` (which imports it): the conversion lives with `StoreError`
    /// (`rendezvous/store.rs`).
    #[error("{0}")]
    Launch(Box<dyn std::error::Error + Send + Sync>),
    /// A check that found something wrong (exit 1), e.g. `kiln ckpt verify`.
    #[error("{0}")]
    Invalid(String),
    /// The run stopped at a step boundary because a signal asked it to, with a checkpoint there
    /// (exit 75, `train::preempt::EXIT_PREEMPTED`).
    #[error("{0}")]
    Preempted(String),
    /// A bad command-line argument (exit 2).
    #[error("{0}")]
    Usage(String),
    /// A file the run needed to write or read failed (exit 1).
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// 2 for bad input (found before anything ran, or a bad record a stream of documents
    /// reached mid-run: the checkpoints before it are kept), 1 for a run that failed, 75 for a
    /// run a signal stopped with a checkpoint.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Train(crate::train::TrainError::BadData(_)) => 2,
            Error::Config(_)
            | Error::Data(_)
            | Error::Backend(_)
            | Error::Model(_)
            | Error::Usage(_)
            | Error::Checkpoint(_) => 2,
            Error::Train(_) | Error::Io { .. } | Error::Invalid(_) | Error::Launch(_) => 1,
            Error::Preempted(_) => crate::train::preempt::EXIT_PREEMPTED,
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;
