//! Collective communication between ranks: the `Collective` trait and its implementations
//! (`local`: threads in one process, shared memory). Every op is numbered per rank and carries its
//! name, so a hang becomes an error that says which rank never arrived and where it was last seen.

mod api;
mod local;
#[cfg(feature = "cuda")]
pub mod nccl;
pub mod node;
pub mod tcp;

pub use api::*;
pub use local::{LocalGroup, LocalRank};
