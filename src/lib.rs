//! kiln: run distributed deep-learning experiments described in TOML.
//!
//! The flow goes one way: config (layered, validated) -> plan (pure arithmetic) -> backend and
//! workers -> the training loop -> metrics, summary and checkpoints. See
//! `ARCHITECTURE.md` in the shared design folder.

pub mod backend;
pub mod checkpoint;
pub mod cli;
pub mod collective;
pub mod config;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod data;
pub mod error;
pub mod launch;
pub mod model;
pub mod params;
pub mod plan;
pub mod rng;
pub mod strategy;
pub mod sweep;
pub mod train;
pub mod ui;

pub use error::{Error, Result};
