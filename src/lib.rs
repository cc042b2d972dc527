//! kiln: run distributed deep-learning experiments described in TOML.
//!
//! The flow goes one way: config (layered, validated) -> plan (pure arithmetic) -> launch (this
//! node's process, one worker thread per rank) -> train (the step loop of one rank) -> strategy
//! (where parameters, gradients and optimizer state live) -> collective (moving bytes between
//! ranks); the model computes each micro-step, checkpoints and metrics record it.
//!
//! # Layers
//!
//! Each module imports only modules of a lower layer (`tests/it/layers.rs` fails on anything
//! else), so there are no import cycles and a reader can learn the crate bottom-up:
//!
//! | layer | modules | owns |
//! | --- | --- | --- |
//! | 13 | `cli` (and `main`) | parse arguments, call one library function, render the result; `main` owns exit codes, error printing, the process environment and the NCCL re-exec |
//! | 12 | `report` | `kiln report`: charts and tables of runs and sweeps from their files, as one HTML page |
//! | 11 | `sweep` | trials of a sweep as child processes or a Slurm array, ledger, results table |
//! | 10 | `slurm`, `tools` | `kiln submit`/`kiln status` and the sbatch scripts; `kiln bench`, `eval`, `sample`, `tokenize`, `export` |
//! | 9 | `launch` | one session of a run on this node: checks, the session's files and summary, resume, the multi-node node and its restart agent, rank threads |
//! | 8 | `track` | where metric lines go: `metrics.jsonl`, TensorBoard and MLflow, each a `MetricSink` |
//! | 7 | `rundir`, `rendezvous` | the run directory (choosing, locking, stored config, atomic files, summary, typed readers, session records); a multi-node job's store, rendezvous, job token and NCCL id exchange |
//! | 6 | `error` | the top-level error and its exit codes |
//! | 5 | `train`, `backend` | the step loop of one rank; backend/device/collective placement |
//! | 4 | `strategy` | single, dp, ddp, fsdp: where state lives and when ranks synchronise |
//! | 3 | `collective` | all-reduce, broadcast, all-gather, reduce-scatter over local, TCP or NCCL |
//! | 2 | `model`, `plan`, `cuda` | the `Model` trait and families (Burn modules); batch arithmetic; CUDA/NCCL discovery |
//! | 1 | `params`, `data` | flat layout, host/device buffers, optimizers, clipping; datasets and the sampler |
//! | 0 | `config`, `checkpoint`, `ui`, `rng`, `memory`, `panic`, `testdir`, `kernels` | leaves: import nothing from kiln; `memory` counts each rank's allocated bytes; `kernels` are the fused CPU ops of the transformer's hot path; `panic` words a caught panic; `testdir` makes temporary directories for tests |
//!
//! `docs/src/architecture.md` follows one step through these layers and says where each concern
//! lives.
//!
//! A new model family is one `model::Family` impl registered in a `model::Registry`; a new
//! transport one `collective::Collective` impl; a new strategy is its file in `strategy/` and
//! the places `strategy`'s module doc lists.

pub mod backend;
pub mod checkpoint;
pub mod cli;
pub mod collective;
pub mod config;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod data;
pub mod error;
pub mod kernels;
pub mod launch;
pub mod memory;
pub mod model;
pub mod panic;
pub mod params;
pub mod plan;
pub mod rendezvous;
pub mod report;
pub mod rng;
pub mod rundir;
pub mod slurm;
pub mod strategy;
pub mod sweep;
#[doc(hidden)]
pub mod testdir;
pub mod tools;
pub mod track;
pub mod train;
pub mod ui;

pub use error::{Error, Result};
