//! Layer: launch (above track, rundir, rendezvous, train, strategy, backend and error; below
//! tools, slurm, sweep and cli).
//!
//! One session of a run on this node: `execute` runs an experiment here (fresh, resumed, or as
//! one node of a multi-node job, `node`, with its restart agent); `prepare` checks and builds
//! what a session needs up front (`check` is `kiln check`; `init_from` reads
//! `model.init_from`); `session` holds the session's proof of its checks, its open files and
//! its summary; `resume` picks the checkpoint to continue from; `workers` runs one thread per
//! rank (device), each with its own sized thread pool, its strategy over its collective, and
//! its log file. Rank 0's events reach the caller on the calling thread; when one rank fails
//! the others are stopped and the root cause is returned. `profile` writes traces and the time
//! breakdown. Where a run lives is `rundir`, where its metrics go `track`, how nodes meet
//! `rendezvous`.

mod check;
mod execute;
mod init_from;
mod lora_from;
mod node;
mod prepare;
mod profile;
mod resume;
mod session;
mod workers;

pub use check::{check, check_sweep_metric, CheckReport};
pub use execute::{resume, start, train, RunOptions};
pub use init_from::init_weights;
pub use resume::{
    best_mark, choose_checkpoint, config_changes, prepare_resume, read_checkpoint,
    read_model_checkpoint, Resumption,
};
pub use workers::*;
