//! Layer: launch (above train, strategy, backend and error; below sweep and cli).
//!
//! Processes and threads of a run: `execute` runs an experiment on this node (fresh, resumed, or
//! as one node of a multi-node job with its restart agent, node worker and NCCL id exchange);
//! `workers` runs one thread per rank (device), each with its own sized thread pool, its
//! strategy over its collective, and its log file. Rank 0's events reach the caller on the
//! calling thread; when one rank fails the others are stopped and the root cause is returned.
//! `run_dir` and `summary` are where a run lives and what it reports; `weights` is
//! `kiln export` and `model.init_from`.

mod agent;
mod bench;
mod check;
mod eval;
mod execute;
pub mod nccl_env;
mod node;
mod prepare;
mod profile;
pub mod record;
pub mod rendezvous;
mod resume;
mod run_dir;
mod run_files;
mod sample;
pub mod slurm;
pub mod store;
mod summary;
pub mod tensorboard;
mod tokenize;
mod weights;
mod workers;

pub use bench::{bench, BenchEvent};
pub use check::{check, CheckReport};
pub use eval::{eval, EvalOptions, EvalReport};
pub use execute::{resume, start, train, RunOptions};
pub use resume::{best_mark, choose_checkpoint, config_changes, prepare_resume, Resumption};
pub use run_dir::{
    checkpoint_store, choose_run_dir, enclosing_run, first_missing, holder, is_unfinished,
    newest_unfinished, refuse_inside_run, replace_file, run_config, run_config_file, stored_config,
    stored_config_for_elsewhere, write_json,
};
pub use run_files::{MetricsFile, SummaryFile};
pub use sample::{sample, SampleOptions};
pub use summary::Summary;
pub use tokenize::{tokenize, TokenizeOptions, TokenizeReport};
pub use weights::{export, init_weights, write_atomic, ExportOptions, ExportReport};
pub use workers::*;
