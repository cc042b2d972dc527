//! Layer: strategy (above `collective`, `params`, `config` and `checkpoint`; never `train`).
//!
//! Parallel strategies: where parameters, gradients and optimizer state live, and when ranks
//! synchronise. The training loop calls the same five methods for every strategy.

mod base;
mod ddp;
mod dp;
mod fsdp;
mod single;

pub use base::*;
pub use ddp::Ddp;
pub use dp::Dp;
pub use fsdp::Fsdp;
pub use single::Single;
