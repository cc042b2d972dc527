//! This node's workers (and, with `rendezvous` and `store`, its place in a multi-node job): one thread per rank (device), each with its own sized thread pool, its
//! strategy over an in-process collective, and its log file. Rank 0's events reach the caller on
//! the calling thread; when one rank fails the others are stopped and the root cause is returned.

pub mod rendezvous;
pub mod store;
mod workers;

pub use workers::*;
