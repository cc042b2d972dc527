//! kiln's integration tests: one binary, one module per area.

mod cli;
mod collective;
mod common;
mod config;
mod cuda;
mod custom;
mod early;
mod experiments;
mod export;
mod fsdp;
mod fuzz;
mod layers;
mod loader;
mod models;
mod nccl;
mod nodes;
mod parallel;
mod preempt;
mod profile;
mod report;
mod resume;
mod run;
mod safety;
mod slurm;
mod sweep;
mod units;
