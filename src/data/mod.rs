//! Layer: data (above the leaves `config` and `rng`).
//!
//! Datasets and the distributed sampler. Nothing downloads at run time: datasets are generated
//! (synthetic) or read from local files (csv, idx, text, token files, mapped). `records.rs`
//! reads documents from jsonl and parquet shards, `packing.rs` packs documents into rows,
//! `stream.rs` reads them (and `mixture.rs`' windows of text and token files) as a stream.

mod augment;
pub mod chat;
mod csv;
mod dataset;
pub mod documents;
mod idx;
mod mixture;
pub mod packing;
pub mod records;
pub mod sampler;
mod shape;
pub mod stream;
mod synthetic;
mod text;
pub mod tokenizer;
pub mod tokens;

pub use augment::Augment;
pub use dataset::*;
