//! Layer: data (above the leaves `config` and `rng`).
//!
//! Datasets and the distributed sampler. Nothing downloads at run time: datasets are generated
//! (synthetic) or read from local files (csv).

mod csv;
mod dataset;
pub mod sampler;
mod synthetic;

pub use dataset::*;
