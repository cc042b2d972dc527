//! Layer: data (above the leaves `config` and `rng`).
//!
//! Datasets and the distributed sampler. Nothing downloads at run time: datasets are generated
//! (synthetic) or read from local files (csv, idx, text, token files, mapped). `records.rs`
//! reads documents from jsonl and parquet shards, `packing.rs` packs documents into rows.

mod augment;
mod csv;
mod dataset;
pub mod documents;
mod idx;
pub mod packing;
pub mod records;
pub mod sampler;
pub mod stream;
mod synthetic;
mod text;
pub mod tokenizer;
pub mod tokens;

pub use augment::Augment;
pub use dataset::*;
