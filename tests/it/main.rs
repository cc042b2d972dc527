//! kiln's integration tests: one binary, one module per area. Where to look, by feature:
//!
//! | feature | tests |
//! | --- | --- |
//! | the command line, exit codes, `kiln init` | `cli.rs` |
//! | config layering, `extends`, error texts | `config.rs`, `input_errors.rs`, `fuzz.rs` |
//! | one run end to end, the run directory | `run.rs`, `run_dirs.rs` |
//! | dp and ddp (same bits as single) | `parallel.rs` |
//! | fsdp (sharding, units, memory) | `fsdp.rs`, `units.rs` |
//! | HSDP (`strategy.shard_size`) | `hsdp.rs` |
//! | the collectives | `collective.rs`, `store.rs` |
//! | checkpoints and resume | `resume.rs`, `resume_safety.rs`, `hostile.rs` |
//! | asynchronous checkpoints (`checkpoint.async`) | `async_checkpoint.rs` |
//! | preemption (SIGTERM, SIGUSR1, Ctrl-C) | `preempt.rs` |
//! | early stopping, the best checkpoint, `kiln eval` | `early.rs` |
//! | several nodes, torchrun, restarts | `nodes.rs`, `tools.rs` |
//! | Slurm (`kiln submit`, job-array sweeps) | `slurm.rs` |
//! | sweeps (grid, random, ASHA) | `sweep.rs` |
//! | model families, a user's own family | `models.rs`, `custom.rs` |
//! | language models, tokenizers, token files | `lm.rs`, `tokens.rs` |
//! | Hugging Face GPT-2 and Llama directories, `kiln export` | `hf.rs`, `hf_llama.rs`, `export.rs` |
//! | data loading and augmentation | `loader.rs` |
//! | documents (jsonl, parquet), packing, mixtures | `documents.rs`, `mixture.rs` |
//! | mixed precision | `precision.rs` |
//! | the fused CPU kernels | `kernels.rs` |
//! | CUDA, NCCL settings, wgpu | `cuda.rs`, `nccl.rs`, `wgpu.rs` |
//! | injected failures (full disk, NaN) | `failures.rs` |
//! | tracking (MLflow), reports, profiles | `tracking.rs`, `report.rs`, `profile.rs` |
//! | every shipped experiment | `experiments.rs` |
//! | the book and README's links | `docs.rs` |
//! | the crate's layers, file and function sizes | `layers.rs` |
//!
//! The configuration reference (docs/src/configuration.md) is checked against the schema by a
//! unit test, `config::reference`.

mod architectures;
mod async_checkpoint;
mod cli;
mod collective;
mod common;
mod config;
mod cuda;
mod custom;
mod docs;
mod documents;
mod early;
mod experiments;
mod export;
mod failures;
mod freeze;
mod fsdp;
mod fuzz;
mod hf;
mod hf_llama;
mod hostile;
mod hsdp;
mod input_errors;
mod kernels;
mod layers;
mod lm;
mod loader;
mod lora;
mod mixture;
mod models;
mod nccl;
mod nodes;
mod parallel;
mod precision;
mod preempt;
mod profile;
mod report;
mod resume;
mod resume_safety;
mod run;
mod run_dirs;
mod sft;
mod slurm;
mod store;
mod sweep;
mod tokens;
mod tools;
mod tracking;
mod units;
mod wgpu;
