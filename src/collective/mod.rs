//! Layer: collective (above `params`; imports nothing from model, strategy, train or
//! checkpoint).
//!
//! Collective communication between ranks: the `Collective` trait and its implementations
//! (`local`: threads in one process, shared memory; `tcp`: across processes; `nccl`: CUDA). It
//! moves bytes of the params layer's buffers and knows no optimizer. Every op is numbered per
//! rank and carries its name, so a hang becomes an error that says which rank never arrived and
//! where it was last seen.

mod api;
mod decorate;
mod device;
mod local;
#[cfg(feature = "cuda")]
pub mod nccl;
pub mod node;
mod overlap;
pub mod tcp;

pub use api::*;
pub use decorate::Decorator;
#[cfg(test)]
pub(crate) use device::emulated;
pub use device::{device_error, DeviceOps, GradsOps, RawOp, Started};
pub use local::{GroupStopper, LocalGroup, LocalRank};
pub use overlap::{on_comm_thread, Overlapped, Pending, WaitHook};
