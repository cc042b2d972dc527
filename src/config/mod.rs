//! Layer: config (a leaf: imports nothing from kiln).
//!
//! Experiment configuration: schema, the layering stack, validation and rendering.

mod cross;
mod diagnose;
mod error;
mod family_keys;
pub mod hf_json;
mod launcher_env;
mod load;
mod nccl;
mod nccl_vars;
mod provenance;
#[cfg(test)]
pub(crate) mod reference;
mod schema;
mod show;
mod validate;

// one file per section: its struct, defaults, docs and its own checks
mod backend;
mod checkpoint;
mod data;
mod elsewhere;
mod experiment;
mod launch;
mod log;
mod model;
mod optim;
mod profile;
mod sampler;
mod schedule;
mod slurm;
mod slurm_syntax;
mod strategy;
mod sweep;
mod train;

pub use backend::*;
pub use checkpoint::*;
pub use data::*;
pub use error::{brief, closest, edit_distance, ConfigError, KeyError, KeyErrorKind};
pub use experiment::*;
pub use family_keys::struct_keys;
pub use launch::*;
pub use load::{
    bare_srun, build_figment, build_run_figment, describe_source, extract, find_line, load,
    load_run, load_with_flags, under_torchrun, Flag, FlagValue, Resolved, ENV_PREFIX,
};
pub use log::*;
pub use model::*;
pub use nccl::{EnvValue, NcclDebug};
pub use nccl_vars::KNOWN as KNOWN_NCCL_VARS;
pub use optim::*;
pub use profile::*;
pub use sampler::*;
pub use schedule::*;
pub use schema::*;
pub use show::{annotated, config_hash, flat, to_toml};
pub use slurm::*;
pub use slurm_syntax::*;
pub use strategy::*;
pub use sweep::*;
pub use train::*;
pub use validate::{validate, MAX_TRIALS, SWEEP_METRICS};
