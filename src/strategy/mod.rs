//! Layer: strategy (above `collective`, `params`, `config` and `checkpoint`; never `train`).
//!
//! Parallel strategies: where parameters, gradients and optimizer state live, and when ranks
//! synchronise. The step (`train::step`) asks a strategy for each unit's parameters just before a
//! stage computes and hands it each unit's gradient as soon as the unit's backward is done; what
//! the strategy does there (copy, gather, all-reduce, reduce-scatter) is its own.

mod base;
mod ddp;
mod dp;
mod fsdp;
mod hybrid;
mod single;

pub use base::*;
pub use ddp::Ddp;
pub use dp::Dp;
pub use fsdp::Fsdp;
pub use hybrid::{hybrid_groups, hybrid_size, Hybrid};
pub use single::Single;
