//! Layer: config (a leaf: imports nothing from kiln).
//!
//! Experiment configuration: schema, the layering stack, validation and rendering.

mod error;
mod load;
mod nccl;
mod schema;
mod show;
mod validate;

pub use error::{closest, edit_distance, ConfigError, KeyError};
pub use load::{
    bare_srun, build_figment, describe_source, extract, find_line, load, Resolved, ENV_PREFIX,
};
pub use nccl::{EnvValue, NcclDebug, KNOWN as KNOWN_NCCL_VARS};
pub use schema::*;
pub use show::{annotated, config_hash, to_toml};
pub use validate::{checkpoint_dir_inside, validate, MAX_TRIALS, SWEEP_METRICS};
