//! Layer: data (above the leaves `config` and `rng`).
//!
//! Datasets and the distributed sampler. Nothing downloads at run time: datasets are generated
//! (synthetic) or read from local files (csv, idx, text, token files, mapped).

mod augment;
mod csv;
mod dataset;
mod idx;
pub mod sampler;
mod synthetic;
mod text;
pub mod tokenizer;
pub mod tokens;

pub use augment::Augment;
pub use dataset::*;
